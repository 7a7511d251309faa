"""Programs whose jaxprs differ between the jax releases juju supports.

jax 0.11 and 0.12 added primitives that 0.10 spells with others: `log2` (0.10:
log / log 2), `one_minus_square` (in the derivatives of tanh, asin, acos,
atanh), and in 0.12 `polynomial` (jnp.polyval, Horner's rule). From 0.11 the
params of control flow changed too, and in 0.12 top_k's (`axis`,
`is_stable`). The same programs run on
every release; where the installed jax has a primitive, the test also proves
that it reached juju. One MAX compilation for all cases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from juju import _compat
from tests.util import assert_same


def log2s(x, z):
    return jnp.log2(x), jnp.log2(z)


def derivatives(x):
    # d tanh = 1 - tanh^2, d asin = 1 / sqrt(1 - x^2), d atanh = 1 / (1 - x^2)
    return (jax.vmap(jax.grad(jnp.tanh))(x), jax.vmap(jax.grad(jnp.arcsin))(x / 2),
            jax.vmap(jax.grad(jnp.arctanh))(x / 2))


def polyvals(x, p_short, p_long):
    # 3 coefficients: unrolled; 11: beyond jax's unroll threshold (8), a scan
    return jnp.polyval(p_short, x), jnp.polyval(p_long, x)


def control_flow(x, n):
    # The params of cond, while and scan changed in jax 0.11 (open sub-jaxprs;
    # scan's ft_in/ft_out): a const, a carry and stacked ys in a scan that stays
    # a loop, a while with a dynamic trip count, a cond.
    w = x[:3]

    def step(c, xi):
        c = jnp.tanh(c * w + xi)
        return c, c.sum()
    xs = w * jnp.linspace(0, 1, 200, dtype=x.dtype)[:, None]
    carry, ys = jax.lax.scan(step, jnp.zeros(3, x.dtype), xs)
    total = jax.lax.fori_loop(0, n, lambda i, t: t + w * i, jnp.zeros_like(w))
    picked = jax.lax.cond(n > 2, jnp.sin, jnp.cos, carry)
    return carry, ys, total, picked


def top_ks(x):
    # ties (ranked by index) and signed zeros; jax 0.12 binds axis and is_stable
    return jax.lax.top_k(x, 3), jax.lax.top_k(x.T, 2)


_rng = np.random.default_rng(0)
X = np.array([0.0, 1e-3, 0.25, 0.5, 0.99, 1.0, 2.0, 1e30, np.inf, np.nan, -1.0], np.float32)
Z = (_rng.standard_normal(5) + 1j * _rng.standard_normal(5)).astype(np.complex64)
U = np.array([-1.5, -0.999, -0.3, 0.0, 1e-20, 0.7, 1.2], np.float32)
CASES = {
    "log2": (log2s, (X, Z), _compat.log2_p),
    "derivatives": (derivatives, (U,), _compat.one_minus_square_p),
    "polyval": (polyvals, (U, np.float32([2, -1, 0.5]), _rng.standard_normal(11).astype(np.float32)),
                _compat.polynomial_p),
    "control_flow": (control_flow, (U, np.int32(4)), None),
    "top_k": (top_ks, (np.float32([[1, 3, 3, 2, 3], [0, 0, -0.0, 1, -0.0]]),), None),
}
JITTED = {name: juju.jit(fn) for name, (fn, _, _) in CASES.items()}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    juju.compile_all([JITTED[name].lower(*args) for name, (_, args, _) in CASES.items()])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(name):
    fn, args, _ = CASES[name]
    assert_same(JITTED[name](*args), jax.jit(fn)(*args), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_newer_primitive_reaches_juju(name):
    fn, args, primitive = CASES[name]
    if primitive is None:
        pytest.skip(f"no new primitive in jax {jax.__version__}")
    jaxpr = jax.make_jaxpr(fn)(*args)
    assert primitive.name in str(jaxpr)
