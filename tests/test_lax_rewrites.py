"""The lax pack's Jaxpr rewrite: transpose(dot_general(a, b)) of matrices
becomes dot_general(b, a) (JAX writes dense-layer weight gradients that way)."""

import jax
import jax.numpy as jnp
import numpy as np

import juju
from juju_ops_lax.rewrites import fold_transposed_dots
from tests.util import assert_same

rng = np.random.default_rng(11)


def dense_grads(w, x, b):
    # weight gradient: dot_general(g, x) then transpose; also a dot used twice
    loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    d = x.T @ b
    return jax.grad(loss)(w), d.T, d.sum(), (x @ w).T


ARGS = (rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(5, 6)).astype(np.float32),
        rng.normal(size=(5, 3)).astype(np.float32))


def test_transposed_dots_are_folded():
    closed = jax.make_jaxpr(dense_grads)(*ARGS)
    before = [e.primitive.name for e in closed.jaxpr.eqns]
    after = [e.primitive.name for e in fold_transposed_dots(closed).jaxpr.eqns]
    # the gradient's and the last output's transposes go; `d.T` stays (d has two uses)
    assert before.count("transpose") - after.count("transpose") == 2
    assert before.count("dot_general") == after.count("dot_general")


def test_folded_program_matches_jax():
    assert_same(juju.jit(dense_grads)(*ARGS), jax.jit(dense_grads)(*ARGS), rtol=1e-5, atol=1e-5)
