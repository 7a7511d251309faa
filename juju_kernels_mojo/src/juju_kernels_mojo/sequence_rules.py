"""Kernels for lax's order-dependent primitives on the CPU: sort, top_k,
the cumulative reductions, scatter and concatenate (sequence_kernels/).

juju_ops_lax writes them with MAX graph ops: sort and top_k rank every
element against every other (O(n^2) work and memory: a 65536-element sort
did not finish), cumulative ops as log2(n) shifted copies. These kernels
sort by an LSD radix sort on order-preserving integer keys (stable, so
several sort keys are sorted least significant first), keep top_k's k best
in one pass, and run cumulative ops in one pass; scatters apply their
updates in order into a copy of the operand (juju_ops_lax's rule pads the
operand with a slot for dropped updates and calls MAX's scatter_nd, about 4x
slower than XLA for 65536 updates); concatenate copies rows with memcpy
(MAX's concat loads element by element, 5-15x slower than XLA's on a few
MB). Registered at `Priority.KERNEL` for CPU graphs of real (non-complex)
dtypes; the GPU keeps lax's rules. Their own library, `juju_sequence`, so
graphs that use none of them keep their cache keys when it changes.
"""

from __future__ import annotations

import math

import numpy as np
from jax import ShapeDtypeStruct
from max.graph import ops

import juju
from juju import primitives as P
from juju_kernels_mojo import SEQUENCE_LIBRARY
from juju_kernels_mojo.lowering import call_kernel
from juju_ops_lax.cumulative import one_element_scan_is_identity
from juju_ops_lax.indexing import scatter_targets

rules = juju.RuleSet()

_I64 = np.dtype(np.int64)
_HALF = (np.dtype(np.float16), np.dtype("bfloat16"))
_SCATTER_KINDS = {P.scatter_p: 0, P.scatter_add_p: 1, P.scatter_mul_p: 2, P.scatter_min_p: 3,
                  P.scatter_max_p: 4}
_CUMULATIVE_KINDS = {P.cumsum_p: 0, P.cumprod_p: 1, P.cummax_p: 2, P.cummin_p: 3,
                     P.cumlogsumexp_p: 4}


def cpu_real(ctx) -> bool:
    """A CPU graph; operands of static, non-empty shapes and no complex dtype."""
    return ctx.device.is_cpu() and all(
        not np.issubdtype(a.dtype, np.complexfloating)
        and all(isinstance(d, (int, np.integer)) for d in a.shape) and math.prod(a.shape) > 0
        for a in ctx.avals_in)


def _register(*primitives, guard=cpu_real):
    return rules.register(*primitives, priority=juju.Priority.KERNEL, guard=guard,
                          requires=(SEQUENCE_LIBRARY,))


def _to_rows(x, shape, axis):
    """[..., n at axis, ...] -> [rows, n] with `axis` last."""
    rank = len(shape)
    if axis != rank - 1:
        x = ops.permute(x, [d for d in range(rank) if d != axis] + [axis])
    return ops.reshape(x, [math.prod(shape) // shape[axis], shape[axis]])


def _from_rows(x, shape, axis):
    """The inverse of `_to_rows` for a result whose `axis` has size shape[axis]."""
    rank = len(shape)
    order = [d for d in range(rank) if d != axis] + [axis]
    x = ops.reshape(x, [shape[d] for d in order])
    if axis != rank - 1:
        x = ops.permute(x, [order.index(d) for d in range(rank)])
    return x


def _take_rows(ctx, x, perm):
    """x[r, perm[r, j]] for x [rows, n] and perm [rows, m] (int64)."""
    rows, n = (int(d) for d in x.shape)
    m = int(perm.shape[1])
    flat = perm
    if rows > 1:
        base = ctx.constant(np.arange(rows, dtype=np.int64).reshape(rows, 1) * n, _I64)
        flat = ops.add(perm, base)
    out = ops.gather(ops.reshape(x, [rows * n]), ops.reshape(flat, [rows * m]), axis=0)
    return ops.reshape(out, [rows, m])


def _sort_permutation(ctx, keys, dtype, descending=False, signed_zeros=False):
    """(perm, sorted keys) of [rows, n] keys, both [rows, n]."""
    aval = ShapeDtypeStruct(tuple(int(d) for d in keys.shape), dtype)
    return call_kernel(ctx, "juju_sort_permutation", keys,
                       parameters={"descending": descending, "signed_zeros": signed_zeros},
                       out_avals=[ShapeDtypeStruct(aval.shape, _I64), aval])


@_register(P.sort_p)
def lower_sort(ctx, *operands, dimension, is_stable, num_keys):
    # Always stable: one of the orders is_stable=False allows.
    shape = list(ctx.avals_in[0].shape)
    rows = [_to_rows(x, shape, dimension) for x in operands]
    dtypes = [a.dtype for a in ctx.avals_in]
    perm, sorted_keys = None, {}
    for key in reversed(range(num_keys)):  # least significant key first; stability does the rest
        keys = rows[key] if perm is None else _take_rows(ctx, rows[key], perm)
        step, sorted_keys[key] = _sort_permutation(ctx, keys, dtypes[key])
        perm = step if perm is None else _take_rows(ctx, perm, step)
    outs = []
    for i, x in enumerate(rows):
        # a key's sorted values came out of the last sort only for key 0
        out = sorted_keys[0] if i == 0 else _take_rows(ctx, x, perm)
        outs.append(_from_rows(out, shape, dimension))
    return outs


def _top_k_supported(ctx) -> bool:
    return cpu_real(ctx) and ctx.params["k"] > 0 and len(ctx.avals_in) == 1


@_register(P.top_k_p, guard=_top_k_supported)
def lower_top_k(ctx, operand, *dyn, k, axis=-1, is_stable=True):
    # Ties by lower index, as XLA's CPU top_k (one of the orders is_stable=False allows).
    shape = list(ctx.avals_in[0].shape)
    axis %= len(shape)
    x = _to_rows(operand, shape, axis)
    rows = int(x.shape[0])
    values, indices = call_kernel(
        ctx, "juju_top_k", x,
        out_avals=[ShapeDtypeStruct((rows, k), ctx.avals_in[0].dtype),
                   ShapeDtypeStruct((rows, k), ctx.avals_out[1].dtype)])
    out_shape = shape[:axis] + [k] + shape[axis + 1:]
    return [_from_rows(values, out_shape, axis), _from_rows(indices, out_shape, axis)]


def _cumulative_supported(ctx) -> bool:
    return cpu_real(ctx) and np.dtype(ctx.avals_in[0].dtype) != np.bool_  # lax takes no bools


@_register(*_CUMULATIVE_KINDS, guard=_cumulative_supported)
def lower_cumulative(ctx, x, *, axis, reverse):
    shape = list(ctx.avals_in[0].shape)
    dtype = np.dtype(ctx.avals_in[0].dtype)
    pre, n, post = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if n == 1 and one_element_scan_is_identity(ctx.primitive, dtype):
        return x
    # XLA accumulates float16/bfloat16 scans in float32
    work = np.dtype(np.float32) if dtype in _HALF else dtype
    if work != dtype:
        x = ops.cast(x, ctx.max_dtype(work))
    (out,) = call_kernel(ctx, "juju_cumulative", ops.reshape(x, [pre, n, post]),
                         parameters={"kind": _CUMULATIVE_KINDS[ctx.primitive],
                                     "reverse": bool(reverse)},
                         out_avals=[ShapeDtypeStruct((pre, n, post), work)])
    out = ops.reshape(out, shape)
    return out if work == dtype else ops.cast(out, ctx.max_dtype(dtype))


def _scatter_supported(ctx) -> bool:
    # bool scatters (or/and) and ONE_HOT mode stay with lax's rule
    return (cpu_real(ctx) and np.dtype(ctx.avals_in[0].dtype) != np.bool_
            and getattr(ctx.params["mode"], "name", "") != "ONE_HOT")


@_register(*_SCATTER_KINDS, guard=_scatter_supported)
def lower_scatter(ctx, operand, indices, updates, *, update_jaxpr, update_consts,
                  dimension_numbers, indices_are_sorted, unique_indices, mode):
    # update_jaxpr is the primitive's own combiner (kind); sortedness and
    # uniqueness are hints an in-order loop does not need.
    shape = list(ctx.avals_in[0].shape)
    n, m = math.prod(shape), math.prod(ctx.avals_in[2].shape)
    flat = scatter_targets(ctx, indices, dimension_numbers, mode)
    (out,) = call_kernel(ctx, "juju_scatter_flat", ops.reshape(operand, [n]), flat,
                         ops.reshape(updates, [m]),
                         parameters={"kind": _SCATTER_KINDS[ctx.primitive]},
                         out_avals=[ShapeDtypeStruct((n,), ctx.avals_in[0].dtype)])
    return ops.reshape(out, shape)


# Smaller results stay with MAX's concat: a few microseconds at most, fusable
# with its neighbours, and no kernel library for the graph to build and load.
_CONCAT_MIN_BYTES = 1 << 16


def _concatenate_supported(ctx) -> bool:
    out = ctx.aval_out
    return (cpu_real(ctx) and len(ctx.avals_in) > 1
            and math.prod(out.shape) * np.dtype(out.dtype).itemsize >= _CONCAT_MIN_BYTES)


@_register(P.concatenate_p, guard=_concatenate_supported)
def lower_concatenate(ctx, *xs, dimension):
    # Each part as [rows, columns]: the axes before `dimension` are the rows.
    rows = math.prod(ctx.aval_out.shape[:dimension])
    parts = [ops.reshape(x, [rows, math.prod(a.shape[dimension:])])
             for x, a in zip(xs, ctx.avals_in)]
    columns = math.prod(ctx.aval_out.shape[dimension:])
    (out,) = call_kernel(ctx, "juju_concat_rows", *parts,
                         out_avals=[ShapeDtypeStruct((rows, columns), ctx.aval_out.dtype)])
    return ops.reshape(out, list(ctx.aval_out.shape))
