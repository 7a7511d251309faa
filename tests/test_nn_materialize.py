"""The nn pack's materialize rewrite: an expensive elementwise value read by
several fused kernels is written once (`nn_materialize`) instead of being
recomputed inside each of them (MAX fuses producers into every consumer)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import juju
from juju_ops_nn.materialize import MIN_SIZE, rewrite
from tests.util import assert_same

rng = np.random.default_rng(5)
SIDE = 128  # 128 x 128 = MIN_SIZE elements
assert SIDE * SIDE == MIN_SIZE


def stats(z):
    return z.mean(), z.std(), jnp.abs(z).max(axis=0)


CASES = {
    # the normals come from a call (jax.random's jit): looked into
    "normal_stats": lambda key, u: stats(jax.random.normal(key, (SIDE, SIDE))),
    "erf_inv_stats": lambda key, u: stats(lax.erf_inv(u * 0.9)),
    "one_reader": lambda key, u: jnp.exp(u).sum(),
    "one_sink": lambda key, u: (jnp.exp(u) * 2 + jnp.exp(u)).sum(),  # two reads, one kernel
    "cheap": lambda key, u: stats(u * 3 + 1),  # nothing costly to recompute
    "small": lambda key, u: stats(jnp.exp(u[:64])),  # below MIN_SIZE
    # the transcendental is of 128 elements, broadcast: cheap per element
    "small_broadcast": lambda key, u: stats(u * jnp.exp(u[:1]) + jnp.log1p(u[0, 0] ** 2)),
}


def programs(key, u):
    return {name: case(key, u) for name, case in CASES.items()}


ARGS = (jax.random.key(3), rng.uniform(-1, 1, (SIDE, SIDE)).astype(np.float32))


def _materialized(fn):
    closed = jax.make_jaxpr(fn)(*ARGS)
    return sum(e.primitive.name == "nn_materialize" for e in rewrite(closed).jaxpr.eqns)


def test_shared_costly_values_are_materialized_once():
    assert _materialized(CASES["normal_stats"]) == 1
    assert _materialized(CASES["erf_inv_stats"]) == 1


def test_other_values_are_left_alone():
    for name in ("one_reader", "one_sink", "cheap", "small", "small_broadcast"):
        assert _materialized(CASES[name]) == 0, name


def test_rewritten_program_matches_jax():
    lowered = juju.jit(programs).lower(*ARGS)
    assert sum(e.primitive.name == "nn_materialize" for e in lowered.closed_jaxpr.jaxpr.eqns) == 2
    assert_same(lowered.compile()(*ARGS), jax.jit(programs)(*ARGS), rtol=2e-5, atol=2e-5)
