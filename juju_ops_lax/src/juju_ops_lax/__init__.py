"""juju-ops-lax: lowering rules for `jax.lax` primitives."""

__version__ = "0.1.0"
