"""The vocabulary every layer reads: keys (labels, annotations, taints), names,
errors, ownership (whose an object is), pools (pool states in the core's words)."""
