"""fft: discrete Fourier transforms in O(n log n) with MAX graph ops.

MAX has no FFT op (juju-kernels-mojo has an FFT kernel for the CPU that
outranks this rule there). This rule is a mixed-radix Cooley-Tukey FFT whose
butterflies are matrix products: n = n1 * n2 splits into a dense DFT of
length n1 <= RADIX (one matmul over all n2 columns), a twiddle multiply, and
an FFT of length n2 (recursively), then a transpose into output order. A
length of 16384 is two matmuls with 128 x 128 DFT matrices: a few graph ops
per axis (MAX compiles per op, and a graph of log2(n) radix-2 stages would be
dozens), O(n (n1 + n2)) work, and matmuls are what GPUs do best. Lengths
with a prime factor above RADIX use Bluestein's chirp-z algorithm (a
convolution of power-of-two length, by the same FFT). Real transforms of even
length run as a complex transform of half the length.

Inside, a batch of complex rows is one real array [rows, 2, n] (real part,
imaginary part): a complex DFT matrix acts on it as one real [2n, 2n]
matrix. Matrices and twiddles are computed in float64 on the host
(fft_plans.py) and rounded once. Matrix products ask for HIGHEST precision:
on the GPU that is fp32 accuracy (juju_ops_lax.dot), where TF32 would lose
three digits.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from juju import ALL_DTYPES, RuleSet, on_parts
from juju import primitives as P
from juju.lowering_helpers import C
from juju_ops_lax.fft_plans import bluestein_length, bluestein_tables, dft_matrix, prime_factors, roots

rules = RuleSet(dtypes=ALL_DTYPES)

#: Largest DFT done as one matrix product (and largest radix of a split).
RADIX = 128


def _split(n: int) -> int | None:
    """The first radix of n (a product of its prime factors, at most RADIX,
    about n ** (1 / stages)); None when a prime factor exceeds RADIX."""
    factors = prime_factors(n)
    if factors[-1] > RADIX:
        return None
    stages = math.ceil(math.log(n) / math.log(RADIX) - 1e-9)
    target = n ** (1 / stages)
    n1 = 1
    for p in reversed(factors):  # the largest that keeps n1 near the target
        if n1 * p <= RADIX and (n1 * p <= target * 1.0001 or n1 == 1):
            n1 *= p
    return n1


@functools.lru_cache(maxsize=256)
def _block_dft(n: int, sign: int, scale: float, dtype) -> np.ndarray:
    """The real [2n, 2n] matrix of a complex DFT of length n on [re; im]."""
    w = dft_matrix(n, sign) * scale
    return np.block([[w.real, w.imag], [-w.imag, w.real]]).astype(dtype)


def _cmul(z, w: np.ndarray, axis: int):
    """z * w for z [..., 2, ...] (parts along `axis`) and complex128 constants w
    broadcasting against one part."""
    re, im = jnp.split(z, 2, axis=axis)
    wr, wi = w.real.astype(z.dtype), w.imag.astype(z.dtype)
    return jnp.concatenate([re * wr - im * wi, re * wi + im * wr], axis=axis)


def _dense(z, n: int, sign: int, scale: float):
    rows = z.shape[0]
    m = jnp.asarray(_block_dft(n, sign, scale, z.dtype))
    y = jnp.matmul(z.reshape(rows, 2 * n), m, precision=lax.Precision.HIGHEST)
    return y.reshape(rows, 2, n)


def _cfft(z, n: int, sign: int, scale: float = 1.0):
    """The DFT (exponent sign `sign`, times `scale`) of each row of z [rows, 2, n]."""
    if n <= RADIX:
        return _dense(z, n, sign, scale)
    n1 = _split(n)
    if n1 is None:
        return _bluestein(z, n, sign, scale)
    n2, rows = n // n1, z.shape[0]
    # t = n2 t1 + t2, k = k1 + n1 k2: a DFT over t1, twiddles, a DFT over t2
    y = z.reshape(rows, 2, n1, n2).transpose(0, 3, 1, 2).reshape(rows * n2, 2, n1)
    y = _dense(y, n1, sign, 1.0).reshape(rows, n2, 2, n1)
    y = _cmul(y, roots(n, np.outer(np.arange(n2), np.arange(n1)), sign)[:, None, :], axis=2)
    y = y.transpose(0, 3, 2, 1).reshape(rows * n1, 2, n2)
    y = _cfft(y, n2, sign, scale).reshape(rows, n1, 2, n2)
    return y.transpose(0, 2, 3, 1).reshape(rows, 2, n)


def _bluestein(z, n: int, sign: int, scale: float):
    chirp, kernel = bluestein_tables(n, sign)
    m = bluestein_length(n)
    a = jnp.pad(_cmul(z, chirp, axis=1), ((0, 0), (0, 0), (0, m - n)))
    conv = _cfft(_cmul(_cfft(a, m, sign), kernel, axis=1), m, -sign)
    return _cmul(conv[:, :, :n], chirp * scale, axis=1)


# --- real transforms along the last axis ----------------------------------------


def _rfft(x, n: int):
    """The n // 2 + 1 first DFT coefficients of real rows x [rows, n], as [rows, 2, n // 2 + 1]."""
    rows = x.shape[0]
    if n % 2:
        z = jnp.stack([x, jnp.zeros_like(x)], axis=1)
        return _cfft(z, n, -1)[:, :, :n // 2 + 1]
    h = n // 2
    # z_j = x_2j + i x_2j+1; X_k = (Z_k + conj Z_h-k) / 2 - i/2 W^k (Z_k - conj Z_h-k)
    z = _cfft(x.reshape(rows, h, 2).transpose(0, 2, 1), h, -1)
    z = jnp.concatenate([z, z[:, :, :1]], axis=2)
    mirror = z[:, :, ::-1] * np.array([1, -1], x.dtype)[:, None]  # conj Z_h-k
    twiddle = -0.5j * roots(n, np.arange(h + 1), -1)
    return (z + mirror) * x.dtype.type(0.5) + _cmul(z - mirror, twiddle, axis=1)


def _irfft(z, n: int):
    """Real rows [rows, n] of the inverse DFT of n // 2 + 1 coefficients
    z [rows, 2, n // 2 + 1] of a Hermitian spectrum."""
    rows, dtype = z.shape[0], z.dtype
    # XLA ignores the imaginary parts of X_0 (and X_n/2 for even n), NaN and
    # inf included
    keep = np.ones(n // 2 + 1, bool)
    keep[0] = False
    if n % 2 == 0:
        keep[-1] = False
    z = jnp.concatenate([z[:, :1], jnp.where(keep, z[:, 1:], dtype.type(0))], axis=1)
    conj = np.array([1, -1], dtype)[:, None]
    if n % 2:
        full = jnp.concatenate([z, z[:, :, 1:][:, :, ::-1] * conj], axis=2)
        return _cfft(full, n, 1, 1 / n)[:, 0]
    h = n // 2
    # Z_k = (X_k + conj X_h-k) / 2 + i/2 W^-k (X_k - conj X_h-k), z = IFFT_h(Z)
    mirror = (z[:, :, ::-1] * conj)[:, :, :h]
    z = z[:, :, :h]
    twiddle = 0.5j / h * roots(n, -np.arange(h), -1)
    spectrum = (z + mirror) * dtype.type(0.5 / h) + _cmul(z - mirror, twiddle, axis=1)
    return _cfft(spectrum, h, 1).transpose(0, 2, 1).reshape(rows, n)


# --- the rule ------------------------------------------------------------------------


def _along(z: C, axis: int, sign: int, scale: float) -> C:
    """The complex DFT of z along `axis`."""
    re, im = jnp.moveaxis(z.re, axis, -1), jnp.moveaxis(z.im, axis, -1)
    shape, n = re.shape, re.shape[-1]
    y = _cfft(jnp.stack([re.reshape(-1, n), im.reshape(-1, n)], axis=1), n, sign, scale)
    back = lambda part: jnp.moveaxis(part.reshape(shape), -1, axis)  # noqa: E731
    return C(back(y[:, 0]), back(y[:, 1]))


def lower_fft_parts(x, *, fft_type, fft_lengths):
    kind = lax.FftType(int(fft_type))
    axes = list(range(-len(fft_lengths), 0))
    if kind in (lax.FftType.FFT, lax.FftType.IFFT):
        sign = -1 if kind == lax.FftType.FFT else 1
        for axis, n in zip(axes, fft_lengths):
            x = _along(x, axis, sign, 1.0 if sign < 0 else 1 / n)
        return x
    n = fft_lengths[-1]
    if kind == lax.FftType.RFFT:
        batch = x.shape[:-1]
        y = _rfft(x.reshape(-1, n), n)
        x = C(y[:, 0].reshape(*batch, -1), y[:, 1].reshape(*batch, -1))
        for axis, length in zip(axes[:-1], fft_lengths[:-1]):
            x = _along(x, axis, -1, 1.0)
        return x
    for axis, length in zip(axes[:-1], fft_lengths[:-1]):
        x = _along(x, axis, 1, 1 / length)
    batch = x.re.shape[:-1]
    z = jnp.stack([x.re.reshape(-1, x.re.shape[-1]), x.im.reshape(-1, x.re.shape[-1])], axis=1)
    return _irfft(z, n).reshape(*batch, n)


rules.register(P.fft_p)(on_parts(lower_fft_parts))
