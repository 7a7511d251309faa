"""juju-ops-nn: convolutions, pooling and fused NN lowerings."""

__version__ = "0.1.0"
