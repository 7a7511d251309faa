"""cumsum, cumprod, cummax, cummin, cumlogsumexp (with `reverse`).

One scan for all of them: log2(n) Hillis-Steele steps, each combining the
array with itself shifted by 1, 2, 4, ... along the axis (the shifted-in
elements are the combiner's identity). Exact for integers; for floats the
summation order differs from XLA's only in rounding.
"""

from __future__ import annotations

import numpy as np
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju_ops_lax import elementwise
from juju_ops_lax._util import is_bool, is_float, scalar
from juju_ops_lax import mixed

rules = RuleSet()


def _nan_either(ctx, x, y, result):
    if not is_float(ctx.avals_in[0].dtype):
        return result
    nan = ops.logical_or(ops.is_nan(x), ops.is_nan(y))
    return mixed.where(nan, scalar(ctx, np.nan, ctx.avals_in[0].dtype), result)


def _logaddexp(ctx, x, y):
    dtype = ctx.avals_in[0].dtype
    hi = ops.max(x, y)
    lo = ops.min(x, y)
    both_inf = ops.logical_and(ops.is_inf(hi), mixed.equal(hi, lo))
    diff = ops.sub(lo, hi)
    diff = mixed.where(both_inf, scalar(ctx, 0, dtype), diff)
    result = ops.add(hi, ops.log1p(ops.exp(diff)))
    result = mixed.where(both_inf, hi, result)
    return _nan_either(ctx, x, y, result)


def _identity(dtype, kind):
    if kind == "add":
        return 0
    if kind == "mul":
        return 1
    if is_bool(dtype):
        return kind == "min"
    if is_float(dtype):
        return -np.inf if kind in ("max", "logaddexp") else np.inf
    info = np.iinfo(dtype)
    return info.min if kind == "max" else info.max


def _combiner(kind):
    return {
        "add": lambda ctx, x, y: ops.add(x, y),
        "mul": lambda ctx, x, y: ops.mul(x, y),
        "max": elementwise.lower_max,
        "min": elementwise.lower_min,
        "logaddexp": _logaddexp,
    }[kind]


def one_element_scan_is_identity(primitive, dtype) -> bool:
    """Whether XLA returns the operand itself for a scan over one element.
    It does (cumsum keeps -0.0, where 0 + -0.0 is +0.0), except for
    cumlogsumexp (logaddexp(-inf, -0.0) is +0.0) and bfloat16 cumsum, which
    XLA's CPU backend computes in float32 as 0 + x."""
    if primitive is P.cumlogsumexp_p:
        return False
    return not (primitive is P.cumsum_p and np.dtype(dtype) == np.dtype("bfloat16"))


def _scan_rule(kind):
    combine = _combiner(kind)

    def lower(ctx, x, *, axis, reverse):
        shape = list(ctx.avals_in[0].shape)
        dtype = ctx.avals_in[0].dtype
        n = shape[axis]
        if n == 0 or (n == 1 and one_element_scan_is_identity(ctx.primitive, dtype)):
            return x
        if n == 1:
            return combine(ctx, x, ops.broadcast_to(scalar(ctx, _identity(dtype, kind), dtype),
                                                    shape))
        as_bool = is_bool(dtype)
        if as_bool:  # or/and on bools, via int32 max/min
            x = ops.cast(x, ctx.max_dtype(np.int32))
            dtype = np.dtype(np.int32)
        half = is_float(dtype) and np.dtype(dtype).itemsize == 2
        if half:  # XLA accumulates float16/bfloat16 scans in float32
            x = ops.cast(x, ctx.max_dtype(np.float32))
            dtype = np.dtype(np.float32)
        ident = scalar(ctx, _identity(dtype, kind), dtype)
        step = 1
        while step < n:
            pad = ops.broadcast_to(ident, shape[:axis] + [step] + shape[axis + 1:])
            keep = [slice(None)] * axis
            if reverse:
                body = ops.slice_tensor(x, keep + [slice(step, n)])
                shifted = ops.concat([body, pad], axis=axis)
            else:
                body = ops.slice_tensor(x, keep + [slice(0, n - step)])
                shifted = ops.concat([pad, body], axis=axis)
            x = combine(ctx, x, shifted)
            step *= 2
        if as_bool:
            x = mixed.not_equal(x, scalar(ctx, 0, np.int32))
        if half:
            x = ops.cast(x, ctx.max_dtype(ctx.avals_in[0].dtype))
        return x

    lower.__qualname__ = f"lower_cum{kind}"
    return lower


rules.register(P.cumsum_p)(_scan_rule("add"))
rules.register(P.cumprod_p)(_scan_rule("mul"))
rules.register(P.cummax_p)(_scan_rule("max"))
rules.register(P.cummin_p)(_scan_rule("min"))
rules.register(P.cumlogsumexp_p)(_scan_rule("logaddexp"))
