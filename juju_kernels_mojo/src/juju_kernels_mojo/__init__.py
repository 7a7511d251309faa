"""juju-kernels-mojo: JAX primitives backed by Mojo kernels."""

__version__ = "0.1.0"
