"""Test-suite configuration: the tests measure MAX, so nothing is tiered.

A tiered function answers its first calls from `jax.jit` (juju/tiers.py);
a test comparing juju with `jax.jit` would then compare XLA with XLA and
prove nothing. `JUJU_TIERED=0` (inherited by the subprocesses tests start)
makes every `juju.jit` wait for MAX; tests/test_tiered.py asks for tiers
explicitly with `juju.jit(f, tiered=True)`.
"""

import os

os.environ["JUJU_TIERED"] = "0"
