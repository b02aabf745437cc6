"""Local Kubernetes for tests and local runs: real control-plane processes and kwok fake nodes."""
