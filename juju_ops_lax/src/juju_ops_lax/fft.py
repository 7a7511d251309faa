"""fft: discrete Fourier transforms as matrix products.

MAX has no FFT. Each transformed axis is a product with the DFT matrix
(computed in float64 numpy, then rounded to the operand's precision), so the
result matches XLA's FFT to rounding; the cost is O(n^2) per axis instead of
O(n log n), which is fine for the short axes of most models and wrong for long
signals. Complex arithmetic goes through juju_ops_lax.complex_numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from juju import ALL_DTYPES, RuleSet, lower_fun
from juju import primitives as P

# Decompositions traced in JAX on the equation's own (complex) avals.
rules = RuleSet(dtypes=ALL_DTYPES)


def _angles(n: int, m: int) -> np.ndarray:
    """2 pi k t / n for k < n, t < m, reduced mod n first for accuracy."""
    k = np.arange(n)[:, None]
    t = np.arange(m)[None, :]
    return 2 * np.pi * ((k * t) % n) / n


def _dft(x, axis: int, inverse: bool):
    n = x.shape[axis]
    sign = 1 if inverse else -1
    w = np.exp(sign * 1j * _angles(n, n)) / (n if inverse else 1)
    y = jnp.tensordot(x, jnp.asarray(w.astype(x.dtype)), axes=([axis], [0]))
    return jnp.moveaxis(y, -1, axis)


def _rfft_last(x, n: int):
    """The first n // 2 + 1 coefficients of the DFT of real x along its last axis."""
    w = np.exp(-1j * _angles(n, n // 2 + 1))
    dtype = jnp.result_type(x.dtype, jnp.complex64)
    return jnp.tensordot(x.astype(dtype), jnp.asarray(w.astype(dtype)), axes=([-1], [0]))


def _irfft_last(x, n: int):
    """The real inverse DFT of length n from the n // 2 + 1 coefficients of a
    Hermitian spectrum; the imaginary parts of the first (and, n even, the
    middle) coefficient do not count, as in numpy and XLA."""
    m = x.shape[-1]
    k = np.arange(m)[:, None]
    weight = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0) / n
    angles = _angles(n, n)[:m]
    real = jnp.real(x)
    cos = jnp.asarray((weight * np.cos(angles)).astype(real.dtype))
    sin = jnp.asarray((-weight * np.sin(angles)).astype(real.dtype))
    return (jnp.tensordot(real, cos, axes=([-1], [0]))
            + jnp.tensordot(jnp.imag(x), sin, axes=([-1], [0])))


def _fft(x, *, fft_type, fft_lengths):
    out_dtype = x.dtype
    if jax.config.jax_enable_x64 and x.dtype in (jnp.float32, jnp.complex64):
        # A float32 sum of n terms is off by ~sqrt(n) eps of the largest
        # terms, too much for the small outputs of a multi-axis transform
        # (XLA's FFT sums in log n stages); float64 when it exists.
        x = x.astype(jnp.float64 if x.dtype == jnp.float32 else jnp.complex128)
    return _fft_in(x, fft_type, fft_lengths).astype(_result_dtype(out_dtype, fft_type))


def _result_dtype(dtype, fft_type):
    complex_of = {jnp.dtype(jnp.float32): jnp.complex64, jnp.dtype(jnp.float64): jnp.complex128}
    real_of = {jnp.dtype(jnp.complex64): jnp.float32, jnp.dtype(jnp.complex128): jnp.float64}
    kind = lax.FftType(int(fft_type))
    if kind == lax.FftType.RFFT:
        return complex_of[jnp.dtype(dtype)]
    if kind == lax.FftType.IRFFT:
        return real_of[jnp.dtype(dtype)]
    return dtype


def _fft_in(x, fft_type, fft_lengths):
    kind = lax.FftType(int(fft_type))
    axes = list(range(x.ndim - len(fft_lengths), x.ndim))
    if kind == lax.FftType.RFFT:
        x = _rfft_last(x, fft_lengths[-1])
        axes = axes[:-1]
    inverse = kind in (lax.FftType.IFFT, lax.FftType.IRFFT)
    outer = axes[:-1] if kind == lax.FftType.IRFFT else axes
    for axis in outer:
        x = _dft(x, axis, inverse)
    if kind == lax.FftType.IRFFT:
        x = _irfft_last(x, fft_lengths[-1])
    return x


rules.register(P.fft_p)(lower_fun(_fft))
