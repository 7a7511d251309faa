"""Bit-level float primitives without a bitcast op: bitcast_convert_type
(same and changing widths), nextafter, reduce_precision.

MAX's graph API has no bitcast, so a float's bits are computed exactly with
float64 and uint64 arithmetic: the exponent is floor(log2|x|), corrected
against a table of exact powers of two, and the mantissa is |x| / 2^e scaled
to an integer. The reverse builds (1 + mantissa * 2^-m) * 2^e in float64,
which is exact for every format up to float64. NaNs come out as the
canonical quiet NaN (payloads are not preserved).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import ml_dtypes
import numpy as np
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju_ops_lax._util import is_bool, is_float, is_signed_int, scalar, sign_bit
from juju_ops_lax import mixed

rules = RuleSet()

_F64, _U64, _I64 = np.float64, np.uint64, np.int64
_POW_LO, _POW_HI = -1200, 1100


@dataclass(frozen=True)
class _Format:
    width: int
    mantissa: int
    exponent: int

    @property
    def bias(self):
        return 2 ** (self.exponent - 1) - 1


_FORMATS = {
    np.dtype(np.float16): _Format(16, 10, 5),
    np.dtype(ml_dtypes.bfloat16): _Format(16, 7, 8),
    np.dtype(np.float32): _Format(32, 23, 8),
    np.dtype(np.float64): _Format(64, 52, 11),
}


def _pow2(ctx, k):
    """2.0**k (float64, exact) for an int64 tensor k, by table lookup."""
    with np.errstate(over="ignore"):  # the top powers are inf by design
        table = np.ldexp(1.0, np.arange(_POW_LO, _POW_HI + 1)).astype(_F64)
    idx = ops.sub(k, scalar(ctx, _POW_LO, _I64))
    idx = ops.min(ops.max(idx, scalar(ctx, 0, _I64)), scalar(ctx, len(table) - 1, _I64))
    shape = list(k.shape)
    out = ops.gather(ctx.constant(table, _F64), ops.reshape(idx, [-1]), axis=0)
    return ops.reshape(out, shape)


def _exponent(ctx, a):
    """floor(log2(a)) as int64, for finite float64 a > 0."""
    guess = ops.floor(ops.div(ops.log(a), scalar(ctx, math.log(2.0), _F64)))
    e = ops.cast(ops.min(ops.max(guess, scalar(ctx, -1074.0, _F64)), scalar(ctx, 1023.0, _F64)),
                 ctx.max_dtype(_I64))
    one = scalar(ctx, 1, _I64)
    e = mixed.where(mixed.greater(_pow2(ctx, e), a), ops.sub(e, one), e)
    e = mixed.where(mixed.greater_equal(a, _pow2(ctx, ops.add(e, one))), ops.add(e, one), e)
    return e


def _float_to_bits(ctx, x, dtype):
    """(sign as bool, magnitude bits as uint64) of float tensor x."""
    fmt = _FORMATS[np.dtype(dtype)]
    w = ops.cast(x, ctx.max_dtype(_F64))
    a = ops.abs(w)
    nan, inf = ops.is_nan(w), ops.is_inf(w)
    zero = mixed.equal(a, scalar(ctx, 0.0, _F64))
    regular = ops.logical_not(ops.logical_or(ops.logical_or(nan, inf), zero))
    safe = mixed.where(regular, a, scalar(ctx, 1.0, _F64))
    e = _exponent(ctx, safe)
    emin = 1 - fmt.bias
    normal = mixed.greater_equal(e, scalar(ctx, emin, _I64))
    frac = ops.sub(ops.div(safe, _pow2(ctx, e)), scalar(ctx, 1.0, _F64))
    mant_normal = ops.mul(frac, scalar(ctx, 2.0 ** fmt.mantissa, _F64))
    mant_sub = ops.div(safe, _pow2(ctx, ops.broadcast_to(scalar(ctx, emin - fmt.mantissa, _I64),
                                                         list(safe.shape))))
    mant = ops.cast(mixed.where(normal, mant_normal, mant_sub), ctx.max_dtype(_U64))
    biased = ops.cast(mixed.where(normal, ops.add(e, scalar(ctx, fmt.bias, _I64)),
                                  scalar(ctx, 0, _I64)), ctx.max_dtype(_U64))
    top = 2 ** fmt.exponent - 1
    biased = mixed.where(ops.logical_or(nan, inf), scalar(ctx, top, _U64), biased)
    mant = mixed.where(inf, scalar(ctx, 0, _U64), mant)
    mant = mixed.where(nan, scalar(ctx, 2 ** (fmt.mantissa - 1), _U64), mant)
    mant = mixed.where(zero, scalar(ctx, 0, _U64), mant)
    biased = mixed.where(zero, scalar(ctx, 0, _U64), biased)
    mag = ops.add(ops.mul(biased, scalar(ctx, 2 ** fmt.mantissa, _U64)), mant)
    sign = ops.logical_and(sign_bit(ctx, w, _F64), ops.logical_not(nan))
    return sign, mag


def _bits_to_float(ctx, sign, mag, dtype):
    """Float tensor of `dtype` from (sign bool, magnitude bits uint64)."""
    fmt = _FORMATS[np.dtype(dtype)]
    scale = scalar(ctx, 2 ** fmt.mantissa, _U64)
    biased = ops.floor_div(mag, scale)
    mant = ops.sub(mag, ops.mul(biased, scale))
    mant_f = ops.cast(mant, ctx.max_dtype(_F64))
    biased_i = ops.cast(biased, ctx.max_dtype(_I64))
    normal = ops.mul(ops.add(scalar(ctx, 1.0, _F64),
                             ops.mul(mant_f, scalar(ctx, 2.0 ** -fmt.mantissa, _F64))),
                     _pow2(ctx, ops.sub(biased_i, scalar(ctx, fmt.bias, _I64))))
    sub = ops.mul(mant_f, scalar(ctx, 2.0 ** (1 - fmt.bias - fmt.mantissa), _F64))
    value = mixed.where(mixed.equal(biased, scalar(ctx, 0, _U64)), sub, normal)
    top = mixed.equal(biased, scalar(ctx, 2 ** fmt.exponent - 1, _U64))
    special = mixed.where(mixed.equal(mant, scalar(ctx, 0, _U64)), scalar(ctx, np.inf, _F64),
                          scalar(ctx, np.nan, _F64))
    value = mixed.where(top, special, value)
    value = mixed.where(sign, ops.negate(value), value)
    return ops.cast(value, ctx.max_dtype(dtype))


def _width(dtype):
    dtype = np.dtype(dtype)
    return 8 if is_bool(dtype) else dtype.itemsize * 8


def _to_unsigned_bits(ctx, x, dtype):
    """The bits of x (any dtype) as uint64 (only the low `width` bits set)."""
    width = _width(dtype)
    if is_float(dtype):
        sign, mag = _float_to_bits(ctx, x, dtype)
        top = scalar(ctx, 2 ** (width - 1), _U64)
        return mixed.where(sign, ops.add(mag, top), mag)
    if is_bool(dtype):
        return ops.cast(x, ctx.max_dtype(_U64))
    if is_signed_int(dtype):
        wide = ops.cast(x, ctx.max_dtype(_I64))
        if width < 64:
            wide = mixed.where(mixed.greater(scalar(ctx, 0, _I64), wide),
                               ops.add(wide, scalar(ctx, 2 ** width, _I64)), wide)
        return ops.cast(wide, ctx.max_dtype(_U64))
    return ops.cast(x, ctx.max_dtype(_U64))


def _from_unsigned_bits(ctx, bits, dtype):
    width = _width(dtype)
    if is_float(dtype):
        top = scalar(ctx, 2 ** (width - 1), _U64)
        sign = mixed.greater_equal(bits, top)
        mag = mixed.where(sign, ops.sub(bits, top), bits)
        return _bits_to_float(ctx, sign, mag, dtype)
    if is_bool(dtype):
        return mixed.not_equal(bits, scalar(ctx, 0, _U64))
    if is_signed_int(dtype) and width < 64:
        wide = ops.cast(bits, ctx.max_dtype(_I64))
        wide = mixed.where(mixed.greater_equal(wide, scalar(ctx, 2 ** (width - 1), _I64)),
                           ops.sub(wide, scalar(ctx, 2 ** width, _I64)), wide)
        return ops.cast(wide, ctx.max_dtype(dtype))
    return ops.cast(bits, ctx.max_dtype(dtype))


@rules.register(P.bitcast_convert_type_p)
def lower_bitcast_convert_type(ctx, x, *, new_dtype):
    src, dst = np.dtype(ctx.avals_in[0].dtype), np.dtype(new_dtype)
    if src == dst:
        return x
    ws, wd = _width(src), _width(dst)
    bits = _to_unsigned_bits(ctx, x, src)
    if ws > wd:  # one element becomes ws/wd elements, little-endian
        k = ws // wd
        shape = list(ctx.avals_in[0].shape)
        chunks = []
        base = scalar(ctx, 2 ** wd, _U64) if wd < 64 else None
        rest = bits
        for _ in range(k):
            q = ops.floor_div(rest, base)
            chunks.append(ops.reshape(ops.sub(rest, ops.mul(q, base)), shape + [1]))
            rest = q
        bits = ops.concat(chunks, axis=len(shape))
    elif ws < wd:  # the last dimension (ws/wd elements) becomes one
        k = wd // ws
        shape = list(ctx.avals_in[0].shape)
        total = None
        for j in range(k):
            chunk = ops.slice_tensor(bits, [slice(None)] * (len(shape) - 1) + [slice(j, j + 1)])
            term = ops.mul(chunk, scalar(ctx, 2 ** (j * ws), _U64))
            total = term if total is None else ops.add(total, term)
        bits = ops.reshape(total, shape[:-1])
    return _from_unsigned_bits(ctx, bits, dst)


@rules.register(P.nextafter_p)
def lower_nextafter(ctx, x1, x2):
    dtype = ctx.avals_in[0].dtype
    shape = list(ctx.aval_out.shape)
    x1, x2 = ops.broadcast_to(x1, shape), ops.broadcast_to(x2, shape)
    sign, mag = _float_to_bits(ctx, x1, dtype)
    one = scalar(ctx, 1, _U64)
    # Moving away from zero adds one to the magnitude; toward zero subtracts.
    away = mixed.where(sign, mixed.greater(x1, x2), mixed.greater(x2, x1))
    zero_mag = mixed.equal(mag, scalar(ctx, 0, _U64))
    stepped = mixed.where(away, ops.add(mag, one), ops.sub(mixed.where(zero_mag, one, mag), one))
    result = _bits_to_float(ctx, sign, stepped, dtype)
    # From zero: the smallest subnormal with x2's sign.
    tiny_sign = mixed.greater(scalar(ctx, 0, dtype), x2)
    tiny = _bits_to_float(ctx, tiny_sign, ops.broadcast_to(one, shape), dtype)
    result = mixed.where(mixed.equal(x1, scalar(ctx, 0, dtype)), tiny, result)
    result = mixed.where(mixed.equal(x1, x2), x2, result)
    either_nan = ops.logical_or(ops.is_nan(x1), ops.is_nan(x2))
    return mixed.where(either_nan, scalar(ctx, np.nan, dtype), result)


@rules.register(P.reduce_precision_p)
def lower_reduce_precision(ctx, x, *, exponent_bits, mantissa_bits):
    dtype = ctx.avals_in[0].dtype
    w = ops.cast(x, ctx.max_dtype(_F64))
    a = ops.abs(w)
    regular = ops.logical_and(mixed.greater(a, scalar(ctx, 0.0, _F64)),
                              mixed.greater(scalar(ctx, np.inf, _F64), a))
    safe = mixed.where(regular, a, scalar(ctx, 1.0, _F64))
    bias = 2 ** (exponent_bits - 1) - 1
    emin, emax = 1 - bias, bias
    e = ops.max(_exponent(ctx, safe), scalar(ctx, emin, _I64))
    q = _pow2(ctx, ops.sub(e, scalar(ctx, mantissa_bits, _I64)))
    r = ops.mul(ops.round(ops.div(safe, q)), q)
    try:
        max_finite = (2.0 - 2.0 ** -mantissa_bits) * 2.0 ** emax
    except OverflowError:
        max_finite = np.inf
    r = mixed.where(mixed.greater(r, scalar(ctx, max_finite, _F64)), scalar(ctx, np.inf, _F64), r)
    r = mixed.where(mixed.greater(scalar(ctx, 0.0, _F64), w), ops.negate(r), r)
    result = mixed.where(regular, r, w)
    return ops.cast(result, ctx.max_dtype(dtype))
