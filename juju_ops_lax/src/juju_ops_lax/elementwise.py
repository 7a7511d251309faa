"""Elementwise lax primitives, with XLA's semantics where MAX's differ.

Differences handled here: MAX's `max`/`min` drop NaNs (XLA propagates them),
integer `div` in MAX is floor/float division (XLA truncates, and defines
x/0 = -1), MAX's float->int cast wraps (XLA saturates and maps NaN to 0),
and MAX's kernels assume no NaN (see `juju_ops_lax.nan`): comparisons, the
float->bool cast, exp/tanh/sigmoid and pow get NaN explicitly.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np
from jax import lax
from max.dtype import DType
from max.graph import ops

from juju import ALL_DTYPES, RuleSet, lower_fun
from juju import primitives as P
from juju._compat import jax_impls
from juju.primitives import log2_p, one_minus_square_p, polynomial_p
from juju_ops_lax import mixed, nan, trigonometry
from juju_ops_lax._util import (
    broadcast_to, constant_scalar, is_bool, is_constant, is_float, is_signed_int, is_unsigned_int,
    is_zero_constant, same_value, scalar, sign_bit,
)

rules = RuleSet()

def _half_in_f32(op):
    """MAX's float16/bfloat16 transcendentals are less accurate than XLA's
    (which computes them in float32): do the same."""

    def in_f32(x):
        if x.dtype in (DType.float16, DType.bfloat16):
            return ops.cast(op(ops.cast(x, DType.float32)), x.dtype)
        return op(x)

    in_f32.__name__ = op.__name__
    return in_f32


def _constant_like(x, value):
    """A scalar constant of x's dtype, on x's device."""
    return ops.constant(value, x.dtype, device=x.device)


#: Above these, MAX's exp is wrong: float32 input is clamped at 88.376 (exp
#: of 88.5, 89 and inf came back 2.406e38; XLA: 2.72e38, inf, inf), float64
#: overflows early (exp(709.5) = inf; XLA: 1.35e308). There e^x = e^(x-1) e.
_EXP_SHIFT_ABOVE = {DType.float32: 88.0, DType.float64: 708.0}


def _exp(x):
    """MAX's exp, correct up to overflow (_EXP_SHIFT_ABOVE)."""
    threshold = _EXP_SHIFT_ABOVE.get(x.dtype)
    if threshold is None:
        return ops.exp(x)
    const = partial(_constant_like, x)
    big = mixed.greater(x, const(threshold))
    shifted = ops.exp(ops.sub(x, mixed.where(big, const(1.0), const(0.0))))
    return ops.mul(shifted, mixed.where(big, const(math.e), const(1.0)))


def _tanh(x):
    """MAX's tanh, but x itself where |x| is small enough that x is tanh(x)
    rounded (float32: XLA's CPU tanh does the same below 4e-4). MAX's tanh
    of the smallest normal numbers (float32 below ~1e-37, float64 near
    2e-308) was 0: its rational form flushes a denormal intermediate."""
    threshold = _TANH_IS_X_BELOW.get(x.dtype)
    if threshold is None:
        return ops.tanh(x)
    small = mixed.greater(_constant_like(x, threshold), ops.abs(x))
    return mixed.where(small, x, ops.tanh(x))


# tanh(x) = x (1 - x^2/3 + ...): below these, x^2/3 is under half an ulp
_TANH_IS_X_BELOW = {DType.float32: 4e-4, DType.float64: 1e-9}


rules.elementwise(
    {
        P.add_p: ops.add,
        P.add_jaxvals_p: ops.add,
        P.floor_p: ops.floor,
        P.ceil_p: ops.ceil,
    }
)
rules.elementwise(
    {
        prim: _half_in_f32(op)
        for prim, op in {
            P.exp_p: nan.passthrough(_exp),
            P.log_p: ops.log,
            P.log1p_p: ops.log1p,
            P.sqrt_p: ops.sqrt,
            P.rsqrt_p: ops.rsqrt,
            P.sin_p: trigonometry.sin,
            P.cos_p: trigonometry.cos,
            P.tanh_p: nan.passthrough(_tanh),
            P.logistic_p: nan.passthrough(ops.sigmoid),
            P.erf_p: ops.erf,
        }.items()
    }
)


@rules.register(P.sub_p)
def lower_sub(ctx, x, y):
    if is_float(ctx.avals_in[0].dtype):
        # MAX folds x - x to 0 (IEEE: NaN for an infinite or NaN x) and
        # 0 - y to -y (IEEE: 0 - 0 is +0)
        if is_zero_constant(x):
            x = ctx.opaque(x)
        elif same_value(x, y):
            y = ctx.opaque(y)
    return ops.sub(x, y)


@rules.register(P.neg_p)
def lower_neg(ctx, x):
    dtype = ctx.avals_in[0].dtype
    if is_unsigned_int(dtype):
        # MAX rejects negate on unsigned (and folds 0 - x into it): -x == (max - x) + 1
        return ops.add(ops.sub(scalar(ctx, np.iinfo(dtype).max, dtype), x), scalar(ctx, 1, dtype))
    return ops.negate(x)


def _by_dtype(name, float_op, other_op, swap=False):
    """A binary rule: float_op on float operands, other_op on the others."""

    def lower(ctx, x, y):
        op = float_op if is_float(ctx.avals_in[0].dtype) else other_op
        return op(y, x) if swap else op(x, y)

    lower.__qualname__ = lower.__name__ = f"lower_{name}"
    return lower


# MAX's `greater` is ordered (false for NaN) and folds x > x to false, as IEEE
# does; `greater_equal` folds x >= x to true, so it gets the NaN test.
_ORDERED_GE = nan.ordered(mixed.greater_equal)
rules.register(P.eq_p)(_by_dtype("eq", nan.equal, mixed.equal))
rules.register(P.ne_p)(_by_dtype("ne", nan.not_equal, mixed.not_equal))
rules.register(P.gt_p)(_by_dtype("gt", mixed.greater, mixed.greater))
rules.register(P.ge_p)(_by_dtype("ge", _ORDERED_GE, mixed.greater_equal))
rules.register(P.lt_p)(_by_dtype("lt", mixed.greater, mixed.greater, swap=True))
rules.register(P.le_p)(_by_dtype("le", _ORDERED_GE, mixed.greater_equal, swap=True))


@rules.register(P.abs_p)
def lower_abs(ctx, x):
    if is_unsigned_int(ctx.avals_in[0].dtype):
        return x
    return ops.abs(x)


@rules.register(P.mul_p)
def lower_mul(ctx, x, y, *, out_dtype=None):
    if is_float(ctx.avals_in[0].dtype):
        # MAX folds x * 0 to 0: IEEE gives NaN for an infinite or NaN x, -0.0 for x < 0
        x, y = (ctx.opaque(v) if is_zero_constant(v) else v for v in (x, y))
    result = ops.mul(x, y)
    if out_dtype is not None and np.dtype(out_dtype) != np.dtype(ctx.avals_in[0].dtype):
        result = ops.cast(result, ctx.max_dtype(out_dtype))
    return result


@rules.register(P.square_p)
def lower_square(ctx, x):
    return ops.mul(x, x)


# --- division and remainder ----------------------------------------------------


def _safe_int_divisor(ctx, y):
    """y with 0 and -1 replaced by 1: both trap (SIGFPE) in hardware division."""
    dtype = ctx.avals_in[1].dtype
    one = scalar(ctx, 1, dtype)
    bad = mixed.equal(y, scalar(ctx, 0, dtype))
    if is_signed_int(dtype):
        bad = ops.logical_or(bad, mixed.equal(y, scalar(ctx, -1, dtype)))
    return mixed.where(bad, one, y)


def _trunc_div(ctx, x, y):
    """Integer division rounding toward zero (y has no 0 or -1)."""
    dtype = ctx.avals_in[0].dtype
    q = ops.floor_div(x, y)
    if not is_signed_int(dtype):
        return q
    zero = scalar(ctx, 0, dtype)
    inexact = mixed.not_equal(ops.mul(q, y), x)
    signs_differ = mixed.not_equal(mixed.greater(zero, x), mixed.greater(zero, y))
    return mixed.where(ops.logical_and(inexact, signs_differ), ops.add(q, scalar(ctx, 1, dtype)), q)


@rules.register(P.div_p)
def lower_div(ctx, x, y):
    dtype = ctx.avals_in[0].dtype
    if is_float(dtype):
        q = ops.div(x, y)
        if is_constant(x):
            # MAX folds 0 / y to +0, also where y is 0 or NaN (jnp.mean of an
            # empty array, whose sum is the constant 0, was 0): IEEE's answer.
            zero = scalar(ctx, 0, dtype)
            signed = mixed.where(mixed.not_equal(sign_bit(ctx, x, dtype), sign_bit(ctx, y, dtype)),
                                 scalar(ctx, -0.0, dtype), zero)
            undefined = ops.logical_or(ops.is_nan(y), mixed.equal(y, zero))
            q = mixed.where(mixed.equal(x, zero),
                            mixed.where(undefined, scalar(ctx, np.nan, dtype), signed), q)
        return q
    safe = _safe_int_divisor(ctx, y)
    q = _trunc_div(ctx, x, safe)
    if is_signed_int(dtype):  # x / -1 == -x, wrapping INT_MIN like XLA
        q = mixed.where(mixed.equal(y, scalar(ctx, -1, dtype)), ops.negate(x), q)
    all_ones = scalar(ctx, -1 if is_signed_int(dtype) else np.iinfo(dtype).max, dtype)
    return mixed.where(mixed.equal(y, scalar(ctx, 0, dtype)), all_ones, q)


@rules.register(P.rem_p)
def lower_rem(ctx, x, y):
    dtype = ctx.avals_in[0].dtype
    if is_float(dtype):
        return ops.cast(_float_rem(ctx, ops.cast(x, DType.float64), ops.cast(y, DType.float64)),
                        x.dtype)
    safe = _safe_int_divisor(ctx, y)
    r = ops.sub(x, ops.mul(_trunc_div(ctx, x, safe), safe))
    if is_signed_int(dtype):
        r = mixed.where(mixed.equal(y, scalar(ctx, -1, dtype)), scalar(ctx, 0, dtype), r)
    return mixed.where(mixed.equal(y, scalar(ctx, 0, dtype)), x, r)


def _float_rem(ctx, x, y):
    """C's fmod, in float64. Not MAX's mod: it has the divisor's sign, loses
    the remainder of large quotients (fmod(1e10, 3) was 0) and is folded
    wrongly for constant divisors (fmod(x, 1.0) was 0 for every x, and
    fmod(x, 0.1) mostly 0). |x| - trunc(|x| / |y|) * |y| is exact in float64
    for float32 operands (quotients below 2**29), then one correction step
    for a quotient rounded across an integer (MAX may divide by multiplying
    with the reciprocal)."""
    const = partial(_constant_like, x)

    zero = const(0.0)
    ax, ay = ops.abs(x), ops.abs(y)
    ar = ops.sub(ax, ops.mul(ops.trunc(ops.div(ax, ay)), ay))
    ar = mixed.where(mixed.greater_equal(ar, ay), ops.sub(ar, ay), ar)
    ar = mixed.where(mixed.greater(zero, ar), ops.add(ar, ay), ar)
    # The dividend's sign, zeros included (fmod(-2, 2) == -0.0)
    negative = sign_bit(ctx, x, np.float64)
    r = mixed.where(negative, ops.negate(ar), ar)
    r = mixed.where(mixed.equal(ar, zero), mixed.where(negative, const(-0.0), zero), r)
    # fmod(x, +-inf) == x for finite x
    r = mixed.where(ops.logical_and(ops.is_inf(y), ops.logical_not(
        ops.logical_or(ops.is_inf(x), ops.is_nan(x)))), x, r)
    # NaN for a NaN operand, an infinite x or a zero y
    undefined = ops.logical_or(nan.unordered(x, y), ops.logical_or(
        ops.is_inf(x), mixed.equal(y, zero)))
    return mixed.where(undefined, const(float("nan")), r)


# --- max / min: NaN propagates, -0.0 < +0.0 ----------------------------------
#
# XLA's max/min propagate NaN and order -0.0 below +0.0 (max(-0.0, +0.0) is
# +0.0 either way round); MAX's drop NaN and return either zero. Written with
# `greater` (ordered: false for NaN) and `is_nan`, which MAX keeps exact.


def _extremum(x, y, beats, critical_zero_negative, zero_tie):
    """max or min of floats. `beats(a, b)`: a wins over b; the critical zero
    (+0.0 for max, -0.0 for min) wins a tie with the other zero, which
    `zero_tie` computes for two zeros."""
    c, other = constant_scalar(y), constant_scalar(x)
    if other is not None and c is None and not np.isnan(other):
        return _extremum(y, x, beats, critical_zero_negative, zero_tie)  # the constant second
    if c is not None and other is None and not np.isnan(c):
        if c == 0 and np.signbit(c) == critical_zero_negative:  # relu: +0.0 for -0.0 too
            return mixed.where(beats(x, y), x, mixed.where(ops.is_nan(x), x, y))
        return mixed.where(beats(y, x), y, x)  # ties, NaN: x
    tie = mixed.where(mixed.equal(x, _constant_like(x, 0)), zero_tie(x, y), x)
    tie_or_nan = mixed.where(ops.is_nan(y), y, tie)
    return mixed.where(beats(x, y), x, mixed.where(beats(y, x), y, tie_or_nan))


def maximum(x, y):
    """XLA's max of float MAX values (also for other packs' rules)."""
    return _extremum(x, y, mixed.greater, False, ops.add)  # -0 + +0 is +0


def minimum(x, y):
    """XLA's min of float MAX values."""
    # -(-0 + -(+0)) is -0: the sum of the negated zeros, negated
    return _extremum(x, y, lambda a, b: mixed.greater(b, a), True,
                     lambda a, b: ops.negate(ops.add(ops.negate(a), ops.negate(b))))


lower_max = rules.register(P.max_p)(_by_dtype("max", maximum, ops.max))
lower_min = rules.register(P.min_p)(_by_dtype("min", minimum, ops.min))


@rules.register(P.clamp_p)
def lower_clamp(ctx, lo, x, hi):
    clamp = lower_min(ctx, lower_max(ctx, x, lo), hi)
    return broadcast_to(clamp, ctx.aval_out.shape)


# --- powers --------------------------------------------------------------------


@rules.register(P.integer_pow_p)
def lower_integer_pow(ctx, x, *, y):
    dtype = ctx.avals_in[0].dtype
    if y == 0:
        return ops.broadcast_to(scalar(ctx, 1, dtype), x.shape)
    acc, base, n = None, x, abs(y)
    while n:  # exponentiation by squaring, exact for integers
        if n & 1:
            acc = base if acc is None else ops.mul(acc, base)
        n >>= 1
        if n:
            base = ops.mul(base, base)
    if y < 0:
        acc = ops.div(scalar(ctx, 1, dtype), acc)
    return acc


@rules.register(P.pow_p)
def lower_pow(ctx, x, y):
    x_dtype, y_dtype = ctx.avals_in[0].dtype, ctx.avals_in[1].dtype
    if np.dtype(x_dtype) != np.dtype(y_dtype):
        y = ops.cast(y, ctx.max_dtype(x_dtype))
    if not is_float(x_dtype):
        return ops.pow(x, y)
    if x.dtype != DType.float64:
        # MAX's pow raises to an integral y by repeated squaring, which loses
        # about y ulps (float32 pow(1 + 2**-23, 2**24) was off by 5e-4):
        # float64 keeps that below the narrower type's rounding.
        f64 = DType.float64
        return ops.cast(_float_pow(ctx, ops.cast(x, f64), ops.cast(y, f64)), x.dtype)
    return _float_pow(ctx, x, y)


# From here on, |x| ** y as exp(y * log|x|): MAX's pow takes an integral y
# as an int32 (pow(3e38, 3e38) and pow(1 + 1e-10, 3e9) were 1) and its
# repeated squaring loses more than exp and log do.
_BY_LOG = 1024.0


def _float_pow(ctx, x, y):
    """C's pow in float64: MAX's is only right for a finite positive base and
    a finite y of moderate size. |x| ** y from MAX where that holds (by
    exp and log for large |y|), then the sign and every special case."""
    const = partial(_constant_like, x)

    zero, one = const(0.0), const(1.0)
    ax = ops.abs(x)
    finite_y = ops.logical_not(ops.logical_or(ops.is_inf(y), ops.is_nan(y)))
    integer_y = ops.logical_and(finite_y, mixed.equal(ops.floor(y), y))
    half = ops.mul(y, const(0.5))
    odd_y = ops.logical_and(integer_y, mixed.not_equal(ops.floor(half), half))
    negative = sign_bit(ctx, x, np.float64)
    safe_base = mixed.where(ops.logical_or(mixed.equal(ax, zero), ops.is_inf(ax)), one, ax)
    large_y = ops.logical_and(finite_y, mixed.greater_equal(ops.abs(y), const(_BY_LOG)))
    moderate_y = ops.logical_and(finite_y, ops.logical_not(large_y))
    mag = ops.pow(safe_base, mixed.where(moderate_y, y, one))
    # The exponent is clamped so that exp never sees an infinity (MAX's
    # kernels assume none); exp(+-2000) is already inf / 0 in float64.
    exponent = ops.mul(mixed.where(large_y, y, one), ops.log(safe_base))
    exponent = ops.min(ops.max(exponent, const(-2000.0)), const(2000.0))
    mag = mixed.where(large_y, _exp(exponent), mag)
    y_pos = mixed.greater(y, zero)
    inf = const(float("inf"))
    mag = mixed.where(ops.is_inf(ax), mixed.where(y_pos, inf, zero), mag)
    mag = mixed.where(mixed.equal(ax, zero), mixed.where(y_pos, zero, inf), mag)
    big_or_small = mixed.where(mixed.greater(ax, one), mixed.where(y_pos, inf, zero),
                               mixed.where(y_pos, zero, inf))
    mag = mixed.where(ops.is_inf(y), mixed.where(mixed.equal(ax, one), one, big_or_small), mag)
    result = mixed.where(ops.logical_and(negative, odd_y), ops.negate(mag), mag)
    finite_x = ops.logical_not(ops.logical_or(ops.is_inf(x), ops.is_nan(x)))
    no_real_root = ops.logical_and(ops.logical_and(mixed.greater(zero, x), finite_x),
                                   ops.logical_and(finite_y, ops.logical_not(integer_y)))
    result = mixed.where(ops.logical_or(nan.unordered(x, y), no_real_root), const(float("nan")),
                         result)
    # pow(x, 0) == 1 and pow(1, y) == 1 even for NaN
    return mixed.where(ops.logical_or(mixed.equal(y, zero), mixed.equal(x, one)), one, result)


@rules.register(P.exp2_p)
def lower_exp2(ctx, x, *, accuracy=None):
    log2 = scalar(ctx, math.log(2.0), ctx.avals_in[0].dtype)
    return nan.passthrough(_exp)(ops.mul(x, log2))


# --- sign, rounding ------------------------------------------------------------


@rules.register(P.sign_p)
def lower_sign(ctx, x):
    dtype = ctx.avals_in[0].dtype
    one, zero = scalar(ctx, 1, dtype), scalar(ctx, 0, dtype)
    if is_unsigned_int(dtype):
        return mixed.where(mixed.greater(x, zero), one, ops.broadcast_to(zero, x.shape))
    neg_one = scalar(ctx, -1, dtype)
    # Keeps x where it is neither >0 nor <0: zeros (with their sign) and NaN.
    return mixed.where(mixed.greater(x, zero), one, mixed.where(mixed.greater(zero, x), neg_one, x))


@rules.register(P.round_p)
def lower_round(ctx, x, *, rounding_method):
    if int(rounding_method) == int(lax.RoundingMethod.TO_NEAREST_EVEN):
        return ops.round(x)
    dtype = ctx.avals_in[0].dtype
    truncated = ops.trunc(x)
    away = mixed.greater_equal(ops.abs(ops.sub(x, truncated)), scalar(ctx, 0.5, dtype))
    return mixed.where(away, ops.add(truncated, lower_sign(ctx, x)), truncated)


@rules.register(P.is_finite_p)
def lower_is_finite(ctx, x):
    return ops.logical_not(ops.logical_or(ops.is_nan(x), ops.is_inf(x)))


@rules.register(P.tan_p)
def lower_tan(ctx, x, *, accuracy=None):
    return ops.div(trigonometry.sin(x), trigonometry.cos(x))


@rules.register(P.expm1_p)
def lower_expm1(ctx, x, *, accuracy=None):
    # Kahan: (u - 1) * x / log(u) is accurate where exp(x) - 1 cancels.
    dtype = ctx.avals_in[0].dtype
    u = _exp(x)
    one = scalar(ctx, 1, dtype)
    um1 = ops.sub(u, one)
    accurate = ops.div(ops.mul(um1, x), ops.log(u))
    # ... and needed only there: for |x| > 1 u - 1 does not cancel, and
    # (u - 1) * x overflows from x ~ 86 (float32) on.
    accurate = mixed.where(mixed.greater(ops.abs(x), one), um1, accurate)
    result = mixed.where(mixed.equal(u, one), x, accurate)
    result = mixed.where(mixed.equal(um1, scalar(ctx, -1, dtype)), um1, result)
    return mixed.where(ops.logical_or(ops.is_inf(u), ops.is_nan(x)),
                       mixed.where(ops.is_nan(x), x, u), result)


# --- logic -----------------------------------------------------------------------


def _bool_only(ctx):
    return is_bool(ctx.avals_in[0].dtype)


rules.register(P.and_p, guard=_bool_only)(lambda ctx, x, y: ops.logical_and(x, y))
rules.register(P.or_p, guard=_bool_only)(lambda ctx, x, y: ops.logical_or(x, y))
rules.register(P.xor_p, guard=_bool_only)(lambda ctx, x, y: ops.logical_xor(x, y))


@rules.register(P.not_p)
def lower_not(ctx, x):
    dtype = ctx.avals_in[0].dtype
    if is_bool(dtype):
        return ops.logical_not(x)
    if is_signed_int(dtype):  # two's complement: ~x == -x - 1
        return ops.sub(ops.negate(x), scalar(ctx, 1, dtype))
    return ops.sub(scalar(ctx, np.iinfo(dtype).max, dtype), x)


@rules.register(P.select_n_p)
def lower_select_n(ctx, which, *cases):
    shape = ctx.aval_out.shape
    if len(cases) == 1:
        return broadcast_to(cases[0], shape)
    which_dtype = ctx.avals_in[0].dtype
    if is_bool(which_dtype):
        return broadcast_to(mixed.where(which, cases[1], cases[0]), shape)
    result = cases[-1]
    for i in range(len(cases) - 2, -1, -1):
        result = mixed.where(mixed.equal(which, scalar(ctx, i, which_dtype)), cases[i], result)
    return broadcast_to(result, shape)


# --- conversions ---------------------------------------------------------------


@rules.register(P.convert_element_type_p)
def lower_convert_element_type(ctx, x, *, new_dtype, weak_type, sharding):
    src, dst = np.dtype(ctx.avals_in[0].dtype), np.dtype(new_dtype)
    if src == dst:
        return x
    if is_bool(dst):  # NaN converts to True, as x != 0
        ne = nan.not_equal if is_float(src) else mixed.not_equal
        return ne(x, scalar(ctx, 0, src))
    if is_float(src) and not is_float(dst) and not is_bool(dst):
        return _float_to_int(ctx, x, src, dst)
    return ops.cast(x, ctx.max_dtype(dst))


def _float_to_int(ctx, x, src, dst):
    """Saturating, truncating float->int with NaN -> 0 (XLA's convert)."""
    info = np.iinfo(dst)
    # The bounds as floats: powers of two, so exact in every float type.
    upper = float(2 ** (info.bits - 1 if info.min < 0 else info.bits))
    zero_f = scalar(ctx, 0, src)
    x = mixed.where(ops.is_nan(x), zero_f, x)
    too_big = mixed.greater_equal(x, scalar(ctx, upper, src))
    lower_bound = float(info.min) if info.min < 0 else 0.0
    too_small = mixed.greater(scalar(ctx, lower_bound, src), x)
    in_range = mixed.where(ops.logical_or(too_big, too_small), zero_f, x)
    result = ops.cast(in_range, ctx.max_dtype(dst))
    result = mixed.where(too_big, scalar(ctx, info.max, dst), result)
    return mixed.where(too_small, scalar(ctx, info.min, dst), result)


# --- primitives of newer jax releases (not registered where jax lacks them) -----


_INV_LN2 = 1.4426950408889634


def _log2(x, *, accuracy=None):
    # XLA's lowering: log(x) times 1/log(2) rounded to x's (real) dtype.
    log_x = lax.log(x, accuracy=accuracy)
    if np.issubdtype(x.dtype, np.complexfloating):
        return lax.complex(lax.real(log_x) * _INV_LN2, lax.imag(log_x) * _INV_LN2)
    return log_x * _INV_LN2


def _one_minus_square(x):
    return (1 + x) * (1 - x)  # JAX's decomposition: exact near |x| = 1


# Decompositions in JAX, traced on the equation's own avals: complex too.
if log2_p is not None:
    rules.register(log2_p, dtypes=ALL_DTYPES)(lower_fun(_log2))
if one_minus_square_p is not None:
    rules.register(one_minus_square_p, dtypes=ALL_DTYPES)(lower_fun(_one_minus_square))
if polynomial_p is not None:
    # Horner's rule, unrolled up to `unroll` terms, then a scan: JAX's own.
    rules.register(polynomial_p, dtypes=ALL_DTYPES)(lower_fun(jax_impls.polynomial))
