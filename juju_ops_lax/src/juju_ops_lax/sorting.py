"""sort (several operands, num_keys, stable, XLA's total order), top_k, and the
total-order comparisons eq_to, lt_to, le_to.

MAX's argsort only handles one rank-1 tensor, so sorting is done by ranking:
each element's rank is the number of elements before it in XLA's total
order (ties broken by position, which makes the sort stable), the inverse
permutation follows from the ranks, and every operand is gathered with it.
This is O(n^2) in the sorted dimension, fine for short rows but not for
large arrays: on the CPU, juju-kernels-mojo's radix sort and top_k kernels
take over (at `Priority.KERNEL`); these rules serve GPU graphs.

jax's sort compares floats with -0.0 == +0.0 and every NaN equal and last
(it canonicalizes them in its comparator); top_k uses XLA's total order,
-0.0 < +0.0 (a NaN's sign is not visible without a bitcast: all NaNs are
taken as +NaN, the largest).
"""

from __future__ import annotations

import math

import numpy as np
from max.graph import ops

from juju import RuleSet
from juju import primitives as P
from juju_ops_lax._util import is_bool, is_float, reduce_axis, scalar, sign_bit
from juju_ops_lax import mixed

rules = RuleSet()
_I64 = np.int64


def _lt_eq(ctx, a, b, dtype, signed_zeros=False):
    """(a < b, a == b) in sort's order (with `signed_zeros`: -0.0 < +0.0, XLA's
    total order), elementwise with broadcasting."""
    if is_bool(dtype):
        i32 = ctx.max_dtype(np.int32)
        a, b = ops.cast(a, i32), ops.cast(b, i32)
    if not is_float(dtype):
        return mixed.greater(b, a), mixed.equal(a, b)
    nan_a, nan_b = ops.is_nan(a), ops.is_nan(b)
    num_eq = mixed.equal(a, b)
    lt = mixed.greater(b, a)
    if signed_zeros:
        sa, sb = sign_bit(ctx, a, dtype), sign_bit(ctx, b, dtype)
        lt = ops.logical_or(lt, ops.logical_and(num_eq, ops.logical_and(sa, ops.logical_not(sb))))
        num_eq = ops.logical_and(num_eq, mixed.equal(sa, sb))
    lt = ops.logical_and(ops.logical_not(nan_a), ops.logical_or(lt, nan_b))
    eq = ops.logical_or(ops.logical_and(num_eq, ops.logical_not(ops.logical_or(nan_a, nan_b))),
                        ops.logical_and(nan_a, nan_b))
    return lt, eq


def _to_last(x, dim, rank):
    if dim == rank - 1:
        return x
    order = [d for d in range(rank) if d != dim] + [dim]
    return ops.permute(x, order)


def _from_last(x, dim, rank):
    if dim == rank - 1:
        return x
    order = [d for d in range(rank) if d != dim] + [dim]
    inverse = [order.index(d) for d in range(rank)]
    return ops.permute(x, inverse)


def _ranks(ctx, keys, dtypes, n, descending=False, signed_zeros=False):
    """Stable rank of each element along the last axis (shape [..., n])."""
    lt_all = None
    eq_all = None
    for key, dtype in zip(keys, dtypes):
        shape = list(key.shape)
        a = ops.reshape(key, shape + [1])          # element i on axis -2
        b = ops.reshape(key, shape[:-1] + [1, n])  # element j on axis -1
        lt, eq = _lt_eq(ctx, a, b, dtype, signed_zeros) if descending else _lt_eq(
            ctx, b, a, dtype, signed_zeros)
        # `lt` now says "j sorts before i"
        if lt_all is None:
            lt_all, eq_all = lt, eq
        else:
            lt_all = ops.logical_or(lt_all, ops.logical_and(eq_all, lt))
            eq_all = ops.logical_and(eq_all, eq)
    i = ops.reshape(ctx.constant(np.arange(n, dtype=_I64), _I64), [n, 1])
    j = ops.reshape(ctx.constant(np.arange(n, dtype=_I64), _I64), [1, n])
    before = ops.logical_or(lt_all, ops.logical_and(eq_all, mixed.greater(i, j)))
    count = reduce_axis(ops.sum, ops.cast(before, ctx.max_dtype(_I64)), -1)
    return ops.reshape(count, list(keys[0].shape))


def _permutation(ctx, ranks, n):
    """perm[..., r] = index of the element whose rank is r."""
    shape = list(ranks.shape)
    r = ops.reshape(ranks, shape + [1])
    j = ops.reshape(ctx.constant(np.arange(n, dtype=_I64), _I64), [1, n])
    i = ops.reshape(ctx.constant(np.arange(n, dtype=_I64), _I64), [n, 1])
    hit = ops.cast(mixed.equal(r, j), ctx.max_dtype(_I64))
    perm = reduce_axis(ops.sum, ops.mul(hit, i), -2)
    return ops.reshape(perm, shape)


def _take_last(ctx, x, perm, n):
    """x[..., perm[..., k]] for x and perm of shape [..., n] / [..., m]."""
    shape = list(x.shape)
    rows = math.prod(int(d) for d in shape[:-1])
    m = int(perm.shape[-1])
    base = ops.reshape(ctx.constant(np.arange(rows, dtype=_I64) * n, _I64), [rows, 1])
    flat = ops.add(ops.reshape(perm, [rows, m]), base)
    out = ops.gather(ops.reshape(x, [rows * n]), ops.reshape(flat, [rows * m]), axis=0)
    return ops.reshape(out, shape[:-1] + [m])


def _total_order(name):
    """eq_to / lt_to / le_to: comparisons in XLA's total order (-0.0 < +0.0,
    NaN above +inf and equal to NaN), as searchsorted, histogram and interp
    bind them. A NaN's sign is not visible here: every NaN is +NaN."""

    def lower(ctx, x, y):
        dtype = ctx.avals_in[0].dtype
        if np.dtype(dtype).kind == "c":
            raise NotImplementedError(f"{name}: complex operands")
        lt, eq = _lt_eq(ctx, x, y, dtype, signed_zeros=True)
        if name == "le_to":
            return ops.logical_or(lt, eq)
        return eq if name == "eq_to" else lt

    lower.__qualname__ = lower.__name__ = f"lower_{name}"
    return lower


rules.register(P.eq_to_p)(_total_order("eq_to"))
rules.register(P.lt_to_p)(_total_order("lt_to"))
rules.register(P.le_to_p)(_total_order("le_to"))


@rules.register(P.sort_p)
def lower_sort(ctx, *operands, dimension, is_stable, num_keys):
    shape = list(ctx.avals_in[0].shape)
    rank = len(shape)
    n = shape[dimension]
    if n <= 1 or math.prod(shape) == 0:
        return list(operands)
    moved = [_to_last(x, dimension, rank) for x in operands]
    dtypes = [a.dtype for a in ctx.avals_in]
    ranks = _ranks(ctx, moved[:num_keys], dtypes[:num_keys], n)
    perm = _permutation(ctx, ranks, n)
    return [_from_last(_take_last(ctx, x, perm, n), dimension, rank) for x in moved]


@rules.register(P.top_k_p)
def lower_top_k(ctx, operand, *dyn, k, axis=-1, is_stable=True):
    # jax 0.12's is_stable=False allows any order of ties; the ranking below is
    # always stable (ties by lower index, as XLA's CPU top_k), which is one of them.
    shape = list(ctx.avals_in[0].shape)
    rank = len(shape)
    axis = axis % rank
    n = shape[axis]
    index_dtype = ctx.avals_out[1].dtype
    x = _to_last(operand, axis, rank)
    if n == 0 or k == 0 or math.prod(shape) == 0:
        out_shape = list(ctx.avals_out[0].shape)
        return [ops.broadcast_to(scalar(ctx, 0, ctx.avals_in[0].dtype), out_shape),
                ops.broadcast_to(scalar(ctx, 0, index_dtype), out_shape)]
    ranks = _ranks(ctx, [x], [ctx.avals_in[0].dtype], n, descending=True, signed_zeros=True)
    perm = _permutation(ctx, ranks, n)
    perm = ops.slice_tensor(perm, [slice(None)] * (rank - 1) + [slice(0, k)])
    values = _from_last(_take_last(ctx, x, perm, n), axis, rank)
    indices = _from_last(ops.cast(perm, ctx.max_dtype(index_dtype)), axis, rank)
    return [values, indices]


@rules.register(P.approx_top_k_p)
def lower_approx_top_k(ctx, operand, *, k, reduction_dimension, recall_target, is_max_k,
                       reduction_input_size_override, aggregate_to_topk):
    # XLA on CPU computes approx_top_k exactly (sorted, ties by lower index).
    if not aggregate_to_topk:
        raise NotImplementedError("approx_top_k: parameter aggregate_to_topk=False")
    shape = list(ctx.avals_in[0].shape)
    rank = len(shape)
    axis = reduction_dimension % rank
    n = shape[axis]
    x = _to_last(operand, axis, rank)
    ranks = _ranks(ctx, [x], [ctx.avals_in[0].dtype], n, descending=is_max_k,
                   signed_zeros=True)
    perm = _permutation(ctx, ranks, n)
    perm = ops.slice_tensor(perm, [slice(None)] * (rank - 1) + [slice(0, k)])
    values = _from_last(_take_last(ctx, x, perm, n), axis, rank)
    indices = _from_last(ops.cast(perm, ctx.max_dtype(ctx.avals_out[1].dtype)), axis, rank)
    return [values, indices]
