"""float32 sin and cos on the CPU are graph ops (juju_ops_lax.trigonometry),
not libm calls, and give jax.jit's bits: glibc's sinf/cosf, which XLA calls."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from tests.util import assert_same, to_numpy

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 119.99999, 120.0, -120.0, 120.00001,
           np.pi / 4, 0.75, 0.7499999, 1e-40, -1e-40, 1e-45, 3.4e38, -3.4e38, 2.0**-12,
           -(2.0**-12), 2.0**-12 * 0.999, 1.5707964, 3.1415927, -3.1415927, 4.712389, 6.2831855,
           88.0, 1e5, 2.0**24, 2.0**24 + 2]


def inputs():
    rng = np.random.default_rng(7)
    n = 20_000
    return np.concatenate([
        SPECIAL,
        rng.standard_normal(n),
        rng.uniform(-130, 130, n),  # across the fast path's end at |x| = 120
        np.exp(rng.uniform(-30, 88, n)) * rng.choice([-1, 1], n),  # every magnitude
        rng.standard_normal(n) * 1e-4,
        np.arange(-64, 64) * (np.pi / 4),  # quadrant boundaries
    ]).astype(np.float32)


def trig(x):
    return (jnp.sin(x), jnp.cos(x), jnp.tan(x), jnp.sin(x.astype(jnp.bfloat16)),
            jnp.cos(x.astype(jnp.float16)), jnp.sin(x.astype(jnp.float64)),
            jnp.cos(x[:64].astype(jnp.complex64)))


@pytest.fixture(scope="module")
def results():
    x = inputs()
    with jax.enable_x64(True):
        return juju.jit(trig)(x), jax.jit(trig)(x)


def test_float32_sin_and_cos_have_jax_jits_bits(results):
    (sin, cos, *_), (want_sin, want_cos, *_) = results
    for got, want in ((sin, want_sin), (cos, want_cos)):
        got, want = to_numpy(got), np.asarray(want)
        assert got.dtype == want.dtype == np.float32
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (inputs()[~same][:5], got[~same][:5], want[~same][:5])


def test_other_dtypes_and_tan_match(results):
    got, want = results
    assert_same(got[2:], want[2:])


def test_the_cpu_graph_reduces_the_argument_itself():
    text = str(juju.make_max_graph(jnp.sin)(np.ones(8, np.float32)))
    assert "trunc" in text and "floor" in text, text
