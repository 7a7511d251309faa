"""Structural equations: broadcasts, reshapes, transposes, reversals,
slices, concatenation, stack/unstack/split, pad and iota, as strided
copies."""

from __future__ import annotations

import math

from juju import primitives as P
from juju.lowering_helpers import platform_branch
from juju_kernels_mojo.codegen.mojo import Array, Unsupported, index_expr, literal, mojo_dtype
# Imported under another name: `slice`'s equation has a parameter named strides.
from juju_kernels_mojo.codegen.mojo import strides as row_major


def broadcast_in_dim(emitter, prim, ins, outs, *, shape, broadcast_dimensions, sharding=None):
    operand, (out,) = ins[0], outs
    if len(ins) > 1:
        raise Unsupported("broadcast_in_dim with dynamic shapes")
    src = row_major(operand.shape)
    st = [0] * len(out.shape)
    for axis, d in enumerate(broadcast_dimensions):
        if operand.shape[axis] != 1:
            st[d] = src[axis]
    emitter.strided(out, operand, st)


def reshape(emitter, prim, ins, outs, *, new_sizes, dimensions, sharding=None):
    (operand,), (out,) = ins, outs
    if len(ins) > 1:
        raise Unsupported("reshape with dynamic shapes")
    if not dimensions or list(dimensions) == list(range(len(operand.shape))):
        emitter.copy(operand, out)
        return
    # The operand transposed by `dimensions`, then read in row-major order.
    src = row_major(operand.shape)
    permuted = [operand.shape[d] for d in dimensions]
    emitter.copy_strided(permuted, out, row_major(permuted), operand, [src[d] for d in dimensions])


def tile(emitter, prim, ins, outs, *, reps):
    """out[i] = operand[i % operand.shape], axis by axis."""
    (operand,), (out,) = ins, outs
    if not out.size:
        return
    src, dst = row_major(operand.shape), row_major(out.shape)

    def body(idx):
        terms = [i if n == m else f"({i} % {n})"
                 for i, n, m in zip(idx, operand.shape, out.shape)]
        emitter.emit(f"{out.at(index_expr(idx, dst))} = {operand.at(index_expr(terms, src))}")

    emitter.nest(out.shape, body, parallel=True)


def squeeze(emitter, prim, ins, outs, *, dimensions):
    emitter.copy(ins[0], outs[0])  # same elements, same order


def transpose(emitter, prim, ins, outs, *, permutation):
    (operand,), (out,) = ins, outs
    src = row_major(operand.shape)
    emitter.strided(out, operand, [src[p] for p in permutation])


def rev(emitter, prim, ins, outs, *, dimensions):
    (operand,), (out,) = ins, outs
    src = row_major(operand.shape)
    st = [-s if d in dimensions else s for d, s in enumerate(src)]
    offset = sum((operand.shape[d] - 1) * src[d] for d in dimensions)
    emitter.strided(out, operand, st, str(offset) if offset else "")


def slice(emitter, prim, ins, outs, *, start_indices, limit_indices, strides: tuple | None):
    (operand,), (out,) = ins, outs
    src = row_major(operand.shape)
    step = strides or (1,) * len(src)
    offset = sum(s * b for s, b in zip(src, start_indices))
    emitter.strided(out, operand, [s * k for s, k in zip(src, step)], str(offset))


def concatenate(emitter, prim, ins, outs, *, dimension):
    (out,) = outs
    st = row_major(out.shape)
    at = 0
    for x in ins:
        emitter.copy_strided(x.shape, out, st, x, row_major(x.shape),
                          dst_offset=str(at * st[dimension]) if at else "")
        at += x.shape[dimension]


def stack(emitter, prim, ins, outs, *, axis):
    (out,) = outs
    st = row_major(out.shape)
    inner = [s for d, s in enumerate(st) if d != axis]
    for j, x in enumerate(ins):
        emitter.copy_strided(x.shape, out, inner, x, row_major(x.shape),
                          dst_offset=str(j * st[axis]) if j else "")


def unstack(emitter, prim, ins, outs, *, axis):
    (operand,) = ins
    src = row_major(operand.shape)
    inner = [s for d, s in enumerate(src) if d != axis]
    for j, out in enumerate(outs):
        emitter.strided(out, operand, inner, str(j * src[axis]) if j else "")


def split(emitter, prim, ins, outs, *, sizes, axis):
    (operand,) = ins
    src = row_major(operand.shape)
    at = 0
    for out, size in zip(outs, sizes, strict=True):
        emitter.strided(out, operand, src, str(at * src[axis]) if at else "")
        at += int(size)


def pad(emitter, prim, ins, outs, *, padding_config):
    (operand, value), (out,) = ins, outs
    if not out.size:
        return
    emitter.fill(out, value.at("0"))
    counts, dst_st, src_st = [], [], []
    dst_at = src_at = 0
    for n, dim, (lo, _, interior), d, s in zip(operand.shape, out.shape, padding_config,
                                               row_major(out.shape),
                                               row_major(operand.shape)):
        step = int(interior) + 1
        # the operand's indices i whose place lo + i * step is in [0, dim)
        first, stop = max(0, -(lo // step)), min(n, (dim - 1 - lo) // step + 1)
        counts.append(max(stop - first, 0))
        dst_st.append(step * d)
        src_st.append(s)
        dst_at += (lo + first * step) * d
        src_at += first * s
    emitter.copy_strided(counts, out, dst_st, operand, src_st,
                      dst_offset=str(dst_at) if dst_at else "",
                      src_offset=str(src_at) if src_at else "")


def iota(emitter, prim, ins, outs, *, dtype, shape, dimension, sharding=None):
    (out,) = outs
    st = row_major(out.shape)

    def body(idx):
        value = f"Scalar[{mojo_dtype(out.dtype)}]({idx[dimension]})"
        emitter.emit(f"{out.at(index_expr(idx, st))} = {value}")

    if out.size:
        emitter.nest(out.shape, body, parallel=True)


def empty2(emitter, prim, ins, outs, *, dtype, memory_space):
    """A differentiated cond's placeholder residual (never read): zeros,
    as lax's rule makes it."""
    (out,) = outs
    if out.size:
        emitter.fill(out, literal(0, out.dtype))


def platform_index(emitter, prim, ins, outs, *, platforms):
    emitter.fill(outs[0], literal(platform_branch(platforms, on_cpu=True), outs[0].dtype))


EQUATIONS = {
    P.broadcast_in_dim_p: broadcast_in_dim,
    P.reshape_p: reshape,
    P.squeeze_p: squeeze,
    P.tile_p: tile,
    P.transpose_p: transpose,
    P.rev_p: rev,
    P.slice_p: slice,
    P.concatenate_p: concatenate,
    P.stack_p: stack,
    P.unstack_p: unstack,
    P.split_p: split,
    P.pad_p: pad,
    P.iota_p: iota,
    P.empty2_p: empty2,
    P.platform_index_p: platform_index,
}


def view(emitter, ins, params, out_avals):
    """A reshape that keeps the elements' order (a squeeze, a broadcast
    adding axes of one element) as its operand's buffer under the new
    shape: no copy. None where it moves elements."""
    (out,) = out_avals
    operand = ins[0]
    if (len(ins) != 1 or not isinstance(operand, Array) or params.get("dimensions") is not None
            and list(params["dimensions"]) != list(range(len(operand.shape)))
            or math.prod(out.shape) != operand.size):
        return None
    return [Array(operand.ptr, tuple(out.shape), operand.dtype, operand.offset)]


#: Equations written as views of their operand where `view` allows.
FORWARDING = {P.reshape_p: view, P.squeeze_p: view, P.broadcast_in_dim_p: view}
