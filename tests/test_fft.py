"""fft against jax.jit (XLA's ducc FFT on the CPU): the four kinds, lengths
with every kind of plan (radix 4 and 2, odd primes, Bluestein), batches, 2-D
and 3-D transforms, jnp's norm modes, NaN and inf, gradients, float64.

juju-kernels-mojo's CPU kernels (fft_rules.py) run every case; juju_ops_lax's
rule in MAX graph ops (what GPU graphs use) runs a smaller set with the mojo
pack blocked. Each group is one graph, all compiled in one MAX compilation.
Values are compared at an FFT's float32 (float64) rounding: an error of
about eps log2(n) relative to the largest output, not to each element.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from juju import to_numpy
from tests.util import packs_blocked, param, selected

rng = np.random.default_rng(52)

LENGTHS = [1, 2, 3, 5, 7, 8, 12, 16, 17, 64, 97, 100, 128, 1000, 1024, 4096, 16384]
# lengths of the float64 (x64) and juju_ops_lax groups: radix 2/4, odd
# primes, a mixed radix, Bluestein
SOME = [1, 2, 8, 12, 17, 100, 257]


def real(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def cplx(*shape, dtype=np.complex64):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _batch(n):
    """A batch shape: two axes for short signals, one for long ones."""
    return (2, 3) if n <= 128 else (3,)


def one_d(lengths, dtype):
    """fft, ifft, rfft and irfft of batches of each length."""
    c, r = np.complex64 if dtype == np.float32 else np.complex128, dtype
    args = {n: (cplx(*_batch(n), n, dtype=c), real(*_batch(n), n, dtype=r),
                cplx(*_batch(n), n // 2 + 1, dtype=c)) for n in lengths}

    def fn(args):
        return {n: {"fft": jnp.fft.fft(z), "ifft": jnp.fft.ifft(z), "rfft": jnp.fft.rfft(x),
                    "irfft": jnp.fft.irfft(h, n)} for n, (z, x, h) in args.items()}

    return fn, (args,)


def multi_d():
    """2-D and 3-D transforms, norm modes, other axes."""
    z2, z3, x2, x3 = cplx(2, 6, 10), cplx(3, 4, 5), real(4, 6, 8), real(3, 4, 7)

    def fn(z2, z3, x2, x3):
        return {
            "fft2": jnp.fft.fft2(z2), "ifft2": jnp.fft.ifft2(z2), "fftn": jnp.fft.fftn(z3),
            "ifftn": jnp.fft.ifftn(z3), "rfft2": jnp.fft.rfft2(x2), "rfftn": jnp.fft.rfftn(x3),
            "irfft2": jnp.fft.irfft2(jnp.fft.rfft2(x2), s=(6, 8)),
            "irfftn": jnp.fft.irfftn(z3, s=(3, 4, 7)),
            "axis0": jnp.fft.fft(z2, axis=1), "axes": jnp.fft.fftn(z3, axes=(0, 2)),
            "padded": jnp.fft.fft(z2, n=13), "cropped": jnp.fft.rfft(x2, n=5),
            "ortho": [jnp.fft.fft(z2, norm="ortho"), jnp.fft.rfft(x2, norm="ortho"),
                      jnp.fft.irfft(z2, norm="ortho"), jnp.fft.ifftn(z3, norm="ortho")],
            "forward": [jnp.fft.fft(z2, norm="forward"), jnp.fft.ifft(z2, norm="forward"),
                        jnp.fft.rfft2(x2, norm="forward"), jnp.fft.irfft(z2, 9, norm="forward")],
        }

    return fn, (z2, z3, x2, x3)


def special():
    """NaN and inf in one signal of a batch; NaN and inf in imaginary parts irfft
    ignores (X_0's; X_n/2's for even n) as XLA does."""
    z = cplx(4, 16)
    z[1, 3], z[2, 0], z[3, 5] = np.nan, np.inf, complex(0, -np.inf)
    x = real(3, 12)
    x[1, 7], x[2, 2] = np.nan, -np.inf
    h = cplx(4, 9)
    h[1, 0] = complex(1, np.nan)
    h[2, 8] = complex(2, np.inf)

    def fn(z, x, h):
        return {"fft": jnp.fft.fft(z), "ifft": jnp.fft.ifft(z), "fft2": jnp.fft.fft2(z[:2]),
                "rfft": jnp.fft.rfft(x), "irfft": jnp.fft.irfft(h), "irfft_odd": jnp.fft.irfft(h, 17)}

    return fn, (z, x, h)


def grads():
    """jax's transpose rules of fft: the cotangent's fft, through the same rule."""
    x, z = real(3, 64), cplx(4, 6)
    w = real(3, 33)

    def fn(x, z, w):
        return {
            "rfft": jax.grad(lambda x: jnp.sum(jnp.abs(jnp.fft.rfft(x)) ** 2 * w))(x),
            "irfft": jax.grad(lambda x: jnp.sum(jnp.fft.irfft(jnp.fft.rfft(x) * w) ** 3))(x),
            "fft2": jax.grad(lambda z: jnp.sum(jnp.abs(jnp.fft.fft2(z) * jnp.arange(6))))(z),
            "ifft": jax.grad(lambda x: jnp.real(jnp.fft.ifft(x * (1 + 2j))).sum() ** 2)(x[:, :6]),
        }

    return fn, (x, z, w)


CASES = {
    ("mojo", "one_d", "float32"): lambda: one_d(LENGTHS, np.float32),
    ("mojo", "one_d", "float64"): lambda: one_d(SOME, np.float64),
    ("mojo", "multi_d", "float32"): multi_d,
    ("mojo", "special", "float32"): special,
    ("mojo", "grads", "float32"): grads,
    ("lax", "one_d", "float32"): lambda: one_d(SOME, np.float32),
    ("lax", "multi_d", "float32"): multi_d,
}
FULL = {("lax", "multi_d", "float32")}


@pytest.fixture(scope="module")
def compiled(request):
    runs = selected(request, "rules", "name", "dtype")
    lowered = {}
    for key in runs:
        rules, _, dtype = key
        fn, args = built(key)
        with jax.enable_x64(dtype == "float64"):
            if rules == "lax":
                with packs_blocked("mojo"):
                    lowered[key] = juju.jit(fn).lower(*args)
            else:
                lowered[key] = juju.jit(fn).lower(*args)
    return dict(zip(lowered, juju.compile_all(list(lowered.values()))))


_built = {}


def built(key):
    """(fn, args) of a case, made once (its arguments are random)."""
    if key not in _built:
        _built[key] = CASES[key]()
    return _built[key]


def assert_fft_close(got, expected, dtype):
    """Same tree, shapes and dtypes; non-finite where XLA's is; values within
    an FFT's rounding of the largest output of each leaf."""
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected)
    assert got_tree == expected_tree
    eps = np.finfo(dtype).eps
    for path, a, e in zip(jax.tree_util.tree_flatten_with_path(expected)[0], got_leaves,
                          expected_leaves):
        a, e = to_numpy(a), np.asarray(e)
        where = jax.tree_util.keystr(path[0])
        assert (a.shape, a.dtype) == (e.shape, e.dtype), where
        np.testing.assert_array_equal(np.isfinite(a), np.isfinite(e), err_msg=where)
        finite = np.isfinite(e)
        if not finite.any():
            continue
        scale = np.abs(e[finite]).max()
        n = max(a.size, 2)
        error = np.abs(a[finite] - e[finite]).max(initial=0)
        assert error <= 8 * eps * math.log2(n) * scale + np.finfo(dtype).tiny, (
            f"{where}: max error {error:.3g}, {error / scale / eps:.1f} eps of the largest "
            f"output {scale:.3g}")


@pytest.mark.parametrize("rules,name,dtype", [param(*key, full=key in FULL) for key in CASES])
def test_matches_jax(compiled, rules, name, dtype):
    fn, args = built((rules, name, dtype))
    with jax.enable_x64(dtype == "float64"):
        got, expected = compiled[rules, name, dtype](*args), jax.jit(fn)(*args)
    assert_fft_close(got, expected, np.float64 if dtype == "float64" else np.float32)


def _fft_packs():
    x = real(2, 8)
    return {(c.primitive, c.pack) for c in juju.explain(
        lambda x: (jnp.fft.irfft(jnp.fft.rfft(x)), jnp.fft.ifft2(jnp.fft.fft2(x))), x)
        if c.primitive == "fft"}


def test_cpu_fft_is_the_mojo_kernel():
    """On the CPU every kind of fft lowers to the mojo pack's kernels; with that
    pack blocked (the "lax" cases above), to juju_ops_lax's rule."""
    assert _fft_packs() == {("fft", "mojo")}
    with packs_blocked("mojo"):
        assert _fft_packs() == {("fft", "lax")}
