"""JAX workload for multislice-operator."""
