"""Operator benchmarks (not tests): `make bench` or `python -m benchmarks.run --help`."""
