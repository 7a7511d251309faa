"""Complex numbers vs jax.jit: MAX has no complex dtype, juju carries them as
float[..., 2] (real, imaginary). All cases share one graph (one compile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same, param, selected

rng = np.random.RandomState(7)


def cplx(*shape, dtype=np.complex64):
    return (rng.randn(*shape) + 1j * rng.randn(*shape)).astype(dtype)


X, Y = cplx(3, 4), cplx(3, 4)
M = cplx(4, 5)
R = rng.randn(3, 4).astype(np.float32)

CASES = {
    "add_sub_neg": (lambda x, y: -(x + y) - y, (X, Y)),
    "mul": (lambda x, y: x * y, (X, Y)),
    "div": (lambda x, y: x / y, (X, Y)),
    "mixed_real": (lambda x, r: x * r + r, (X, R)),
    "python_scalar": (lambda x: x * (2 - 1j) + 1j, (X,)),
    "abs_real_imag": (lambda x: (jnp.abs(x), jnp.real(x), jnp.imag(x)), (X,)),
    "conj_of_real": (lambda r: lax.conj(r), (R,)),
    "lax_complex": (lambda r, x: lax.complex(r, jnp.imag(x)), (R, X)),
    "exp_log": (lambda x: (jnp.exp(x), jnp.log(x), jnp.log1p(x), jnp.expm1(x)), (X,)),
    "sqrt_rsqrt": (lambda x: (jnp.sqrt(x), lax.rsqrt(x)), (X,)),
    "trig": (lambda x: (jnp.sin(x), jnp.cos(x), jnp.tan(x)), (X,)),
    "hyperbolic": (lambda x: (jnp.sinh(x), jnp.cosh(x), jnp.tanh(x)), (X,)),
    "inverse_trig": (lambda x: (jnp.arcsin(x), jnp.arccos(x), jnp.arctan(x)), (X,)),
    "inverse_hyperbolic": (lambda x: (jnp.arcsinh(x), jnp.arccosh(x), jnp.arctanh(x)), (X,)),
    "pow": (lambda x, y: (x ** y, x ** 3, x ** -2, x ** 1.5), (X, Y)),
    "sign_square_logistic": (lambda x: (jnp.sign(x), jnp.square(x), jax.nn.sigmoid(x)), (X,)),
    "compare": (lambda x, y: (x == y, x != x, jnp.maximum(x, y), jnp.minimum(x, y)), (X, Y)),
    "matmul": (lambda x, m: x @ m, (X, M)),
    "matmul_real_rhs": (lambda x, r: x @ r.T, (X, R)),
    "batched_dot": (lambda x, y: jnp.einsum("ij,ij->i", x, y), (X, Y)),
    "reductions": (lambda x: (x.sum(0), x.prod(1), x.mean(), lax.reduce_max(x, (1,))), (X,)),
    "cumulative": (lambda x: (jnp.cumsum(x, 1), jnp.cumprod(x, 0)), (X,)),
    "sort": (lambda x, r: lax.sort((x, r), dimension=1, num_keys=1), (X, R)),
    "convert": (lambda x, r: (x.astype(jnp.float32), x.astype(bool), r.astype(jnp.complex64),
                              jnp.arange(3).astype(jnp.complex64)), (X, R)),
    "structural": (lambda x, y: (x.T[::-1], x[1:, ::2], jnp.concatenate([x, y], 1),
                                 jnp.pad(x, ((1, 0), (0, 2))), x.reshape(4, 3),
                                 jnp.broadcast_to(x[:, :1], (3, 4))), (X, Y)),
    "indexing": (lambda x, y: (x[jnp.array([2, 0])], x.at[jnp.array([0, 0])].add(y[:2]),
                               lax.dynamic_update_slice(x, y[:1], (1, 1)),
                               jnp.where(jnp.real(x) > 0, x, y)), (X, Y)),
    "scan": (lambda x: lax.scan(lambda c, row: (c * row + 1, c), jnp.ones((4,), x.dtype), x),
             (X,)),
    "cond": (lambda x, r: lax.cond(r[0, 0] > 0, lambda v: v * 2, lambda v: v / 2, x), (X, R)),
    "reduce_window": (lambda x: (
        lax.reduce_window(x, np.complex64(2), lax.mul, (2, 3), (2, 1), "SAME"),
        lax.reduce_window(x, -np.inf + 0j, lax.max, (2, 2), (1, 1), "VALID"),
        lax.reduce_window(x, np.complex64(0), lax.add, (2, 2), (1, 1), ((1, 0), (0, 1)))), (X,)),
    "fft": (lambda x: (jnp.fft.fft(x), jnp.fft.ifft2(x), jnp.fft.rfft(jnp.real(x)),
                       jnp.fft.irfft(x, 6)), (X,)),
    "conv": (lambda x, r: lax.conv(x[None, None], (x[:2, :2] + r[:2, :2])[None, None],
                                   (1, 1), "SAME"), (X, R)),
    "grad_through_complex": (jax.grad(lambda r: jnp.abs(jnp.exp(1j * r) * (r + 2j)).sum()), (R,)),
}


# More of what CI's cases already cover (the same rules composed, or groups
# with a real-dtype test elsewhere): the full tier runs them.
FULL = {"hyperbolic", "inverse_trig", "inverse_hyperbolic", "sign_square_logistic",
        "matmul_real_rhs", "batched_dot", "cumulative", "reduce_window", "conv"}


def _all(names):
    def run(*flat):
        outs, i = {}, 0
        for name in names:
            fun, args = CASES[name]
            outs[name] = fun(*flat[i:i + len(args)])
            i += len(args)
        return outs
    return run


@pytest.fixture(scope="module")
def outputs(request):
    names = [name for name in CASES if name in selected(request, "name")]
    flat = [a for name in names for a in CASES[name][1]]
    return jax.jit(_all(names))(*flat), juju.jit(_all(names))(*flat)


@pytest.mark.parametrize("name", [param(name, full=name in FULL) for name in CASES])
def test_complex_matches_jax(outputs, name):
    expected, got = outputs
    assert_same(got[name], expected[name])


def test_complex_in_and_out_types():
    f = juju.jit(lambda x, s: x * s)
    out = f(jnp.asarray(X), 1 + 2j)  # a jax array and a Python complex
    assert isinstance(out, jax.Array) and out.dtype == jnp.complex64
    np.testing.assert_allclose(np.asarray(out), X * (1 + 2j), rtol=1e-6)


def test_complex_without_a_rule_is_a_clear_error():
    with pytest.raises(juju.LoweringError,
                       match="scatter-mul has no rule for complex numbers") as info:
        juju.jit(lambda x, y: x.at[jnp.array([0, 0])].multiply(y[:2])).lower(X, Y)
    assert isinstance(info.value.__cause__, juju.UnsupportedDtypeError)
