"""Node-pool provisioning: the interface and its implementations."""
