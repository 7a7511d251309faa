"""fft on the CPU as Mojo kernels (fft_kernels/fft.mojo): complex, real to
complex and complex to real transforms of any length, O(n log n).

juju_ops_lax's rule writes the FFT with MAX graph ops (matrix-product
radices; fft.py there): on the CPU each distinct matmul shape is a MAX
kernel compile, and 16 x 16384 rfft + irfft compiled in 800 s and ran 8.8x
slower than jax.jit. These kernels are one `ops.custom` per transformed axis:
a Stockham FFT with radix 4, 2 and odd-prime stages, Bluestein's algorithm
for prime factors above MAX_PRIME, W signals per SIMD vector, groups of
signals on MAX's worker threads. Plans and twiddles are computed here in
float64 (juju_ops_lax.fft_plans) and enter the graph as constants.
Registered at `Priority.KERNEL` for CPU graphs of static shapes; the GPU
keeps lax's rule. Their own library, `juju_fft`.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from jax import ShapeDtypeStruct, lax
from max.graph import ops

import juju
from juju import primitives as P
from juju_kernels_mojo import FFT_LIBRARY
from juju_kernels_mojo.lowering import call_kernel
from juju_ops_lax.fft_plans import bluestein_length, bluestein_tables, prime_factors, roots

_REAL = {np.dtype(np.float32), np.dtype(np.float64)}
_COMPLEX = {np.dtype(np.complex64), np.dtype(np.complex128)}

rules = juju.RuleSet(dtypes=(*_REAL, *_COMPLEX))

#: Largest prime factor done as a radix stage (an O(p) butterfly per
#: element); a length with a larger one runs as Bluestein's convolution.
MAX_PRIME = 61



def cpu_static(ctx) -> bool:
    """A CPU graph; a float32/64 or complex64/128 operand of static shape."""
    (aval,) = ctx.avals_in
    return (ctx.device.is_cpu() and np.dtype(aval.dtype) in _REAL | _COMPLEX
            and all(isinstance(d, (int, np.integer)) for d in aval.shape)
            and math.prod(aval.shape) > 0)


class _Plan:
    """An int64 plan and its complex128 twiddle table, built up in order."""

    def __init__(self):
        self.ints: list[int] = []
        self.tables: list[np.ndarray] = []
        self.size = 0

    def table(self, values: np.ndarray) -> int:
        """Append `values`; their offset (in complex elements)."""
        at = self.size
        self.tables.append(np.asarray(values, np.complex128).ravel())
        self.size += self.tables[-1].size
        return at

    def header(self, n: int, aux: int) -> None:
        """[scratch, aux]: the scratch a transform of length n needs (in
        elements of one lane: the odd radices' pairs, Bluestein's two
        buffers) and the kernel's own field."""
        scratch = 2 * max([4, *_radices(n)])
        if _bluestein(n):
            m = bluestein_length(n)
            scratch = 4 * m + 2 * max([4, *_radices(m)])
        self.ints += [scratch, aux]

    def transform(self, n: int) -> None:
        """[n, STAGES, count, (radix, offset)...] or [n, BLUESTEIN, m,
        chirp offset, filter offset, <stages of m>]."""
        if _bluestein(n):
            m = bluestein_length(n)
            chirp, kernel = bluestein_tables(n, -1)
            self.ints += [n, 1, m]
            self.ints += [self.table(chirp), self.table(kernel)]
            self.stages(m)
        else:
            self.stages(n)

    def stages(self, n: int) -> None:
        radices = _radices(n)
        self.ints += [n, 0, len(radices)]
        length = n
        for p in radices:
            m = length // p
            # w^(q k) at (k - 1) m + q, w = exp(-2 pi i / length); odd p: its roots after
            twiddles = roots(length, np.outer(np.arange(1, p), np.arange(m)), -1)
            parts = [twiddles] + ([roots(p, np.arange(p), -1)] if p % 2 else [])
            self.ints += [p, self.table(np.concatenate([t.ravel() for t in parts]))]
            length = m

    def constants(self, ctx, dtype):
        table = np.concatenate(self.tables) if self.tables else np.zeros(1, np.complex128)
        pairs = np.stack([table.real, table.imag], axis=-1).astype(dtype)
        return (ctx.constant(np.asarray(self.ints, np.int64), np.int64),
                ctx.constant(pairs, dtype))


def _bluestein(n: int) -> bool:
    return n > 1 and prime_factors(n)[-1] > MAX_PRIME


def _radices(n: int) -> list[int]:
    """Stages for n: the odd primes, then radix 4 while it divides, then 2."""
    factors = prime_factors(n) if n > 1 else []
    twos = factors.count(2)
    return [p for p in factors if p != 2] + [4] * (twos // 2) + [2] * (twos % 2)


@functools.lru_cache(maxsize=128)
def complex_plan(n: int, inverse: bool) -> _Plan:
    """juju_fft's plan of length n."""
    plan = _Plan()
    plan.header(n, int(inverse))
    plan.transform(n)
    return plan


@functools.lru_cache(maxsize=128)
def real_plan(n: int, forward: bool) -> _Plan:
    """juju_rfft's (forward) or juju_irfft's plan of length n: even n runs a
    complex transform of n / 2 with the half-length trick's twiddles."""
    plan = _Plan()
    core = n // 2 if n % 2 == 0 else n
    plan.header(core, 0)
    if n % 2 == 0:
        h = n // 2
        if forward:  # T_k = -i/2 W^k, k <= h
            plan.ints[1] = plan.table(-0.5j * roots(n, np.arange(h + 1), -1))
        else:  # T_k = i/(2h) W^-k, k < h
            plan.ints[1] = plan.table(0.5j / h * roots(n, -np.arange(h), -1))
    plan.transform(core)
    return plan


def _c2c(ctx, x, shape, axis, dtype, inverse):
    """juju_fft of the in-graph complex x (shape + [2]) along `axis`."""
    n = shape[axis]
    if n == 1:
        return x  # a DFT of length 1 is the identity, both ways
    lines = [math.prod(shape[:axis]), n, math.prod(shape[axis + 1:]), 2]
    plan, table = complex_plan(n, inverse).constants(ctx, dtype)
    (y,) = call_kernel(ctx, "juju_fft", ops.reshape(x, lines), plan, table,
                       out_avals=[ShapeDtypeStruct(tuple(lines), dtype)])
    return ops.reshape(y, [*shape, 2])


@rules.register(P.fft_p, priority=juju.Priority.KERNEL, guard=cpu_static,
                requires=(FFT_LIBRARY,))
def lower_fft(ctx, x, *, fft_type, fft_lengths):
    kind = lax.FftType(int(fft_type))
    in_shape = list(ctx.avals_in[0].shape)
    out_shape = list(ctx.aval_out.shape)
    rank = len(in_shape)
    outer = list(range(rank - len(fft_lengths), rank - 1))
    if kind in (lax.FftType.FFT, lax.FftType.IFFT):
        dtype = _real_dtype(ctx.avals_in[0].dtype)
        for axis in [*outer, rank - 1]:
            x = _c2c(ctx, x, in_shape, axis, dtype, kind == lax.FftType.IFFT)
        return x
    n = fft_lengths[-1]
    rows = math.prod(in_shape[:-1])
    if kind == lax.FftType.RFFT:
        dtype = np.dtype(ctx.avals_in[0].dtype)
        plan, table = real_plan(n, True).constants(ctx, dtype)
        (y,) = call_kernel(ctx, "juju_rfft", ops.reshape(x, [rows, n]), plan, table,
                           out_avals=[ShapeDtypeStruct((rows, n // 2 + 1, 2), dtype)])
        y = ops.reshape(y, [*out_shape, 2])
        for axis in outer:
            y = _c2c(ctx, y, out_shape, axis, dtype, False)
        return y
    dtype = np.dtype(ctx.aval_out.dtype)
    for axis in outer:
        x = _c2c(ctx, x, in_shape, axis, dtype, True)
    plan, table = real_plan(n, False).constants(ctx, dtype)
    (y,) = call_kernel(ctx, "juju_irfft", ops.reshape(x, [rows, n // 2 + 1, 2]), plan, table,
                       out_avals=[ShapeDtypeStruct((rows, n), dtype)])
    return ops.reshape(y, out_shape)


def _real_dtype(dtype) -> np.dtype:
    return np.dtype(np.float32) if np.dtype(dtype) == np.complex64 else np.dtype(np.float64)
