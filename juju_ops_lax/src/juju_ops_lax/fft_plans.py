"""FFT plans: how a length is split into radices, and the constants a
transform multiplies by, computed on the host in float64.

Shared by juju_ops_lax's FFT in MAX ops (fft.py) and juju-kernels-mojo's
FFT kernel. Every twiddle is computed directly as exp(2 pi i j / n) from an
exact integer j mod n, not by repeated multiplication, and rounded once to
the transform's precision.
"""

from __future__ import annotations

import functools

import numpy as np


def prime_factors(n: int) -> list[int]:
    """The prime factors of n >= 1, ascending, with multiplicity."""
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    return factors


def roots(n: int, exponents, sign: int) -> np.ndarray:
    """exp(sign 2 pi i e / n) for integer exponents e, in complex128: e is
    reduced mod n first, so the angle is exact to a rounding."""
    e = np.asarray(exponents, dtype=np.int64) % n
    return np.exp(sign * 2j * np.pi * (e / n))


def dft_matrix(n: int, sign: int) -> np.ndarray:
    """W[t, k] = exp(sign 2 pi i t k / n), complex128 [n, n]."""
    t = np.arange(n)
    return roots(n, np.outer(t, t), sign)


def bluestein_length(n: int) -> int:
    """The power of two the chirp-z convolution of length n runs at (>= 2n - 1)."""
    return 1 << (2 * n - 2).bit_length()


@functools.lru_cache(maxsize=64)
def bluestein_tables(n: int, sign: int) -> tuple[np.ndarray, np.ndarray]:
    """(chirp, filter) of Bluestein's algorithm for a DFT of length n:
    X_k = chirp_k * sum_t x_t chirp_t conj(chirp_{k - t}), a convolution
    done as FFTs of length m = bluestein_length(n). chirp_k =
    exp(sign i pi k^2 / n) (k^2 reduced mod 2n, exactly), [n];
    filter = FFT_m(conj(chirp) wrapped around) / m, [m] (the inverse FFT's
    1/m folded in), both complex128."""
    m = bluestein_length(n)
    k = np.arange(n, dtype=np.int64)
    chirp = roots(2 * n, k * k % (2 * n), sign)
    wrapped = np.zeros(m, np.complex128)
    wrapped[:n] = np.conj(chirp)
    wrapped[m - n + 1:] = np.conj(chirp[1:][::-1])
    return chirp, np.fft.fft(wrapped) / m
