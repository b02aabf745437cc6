"""The kopf shell: handlers, Kubernetes and cloud adapters around the pure reconcile."""
