"""multislice-operator: Cloud TPU Multislice training on GKE."""

__version__ = "0.1.0"
