"""Reductions: sums, products, extremes and logical folds over axes,
argmax/argmin (the first NaN wins, as jax's comparator), and lax.reduce
with its own computation. Window and cumulative reductions are in
windows.py."""

from __future__ import annotations

import math

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.codegen.indexing import element
from juju_kernels_mojo.codegen.mojo import (REDUCTIONS, VECTOR_BYTES, Array, Const, Unsupported,
                                            add_offsets, index_expr, literal, mojo_dtype,
                                            reduction_identity, scalar_type)
from juju_kernels_mojo.codegen.mojo import strides as row_major


def reduce(emitter, prim, ins, outs, *, axes, out_sharding=None):
    (operand,), (out,) = ins, outs
    dt = operand.dtype
    combine, init = REDUCTIONS[prim]
    init = reduction_identity(init, dt)
    if dt == np.bool_ and prim not in (P.reduce_and_p, P.reduce_or_p):
        raise Unsupported(f"{prim.name} of bool")
    if _vector_fold(emitter, prim, operand, out, axes) or _row_fold(emitter, prim, operand,
                                                                   out, axes, init):
        return
    emitter.copy(Const(init, out.shape, dt), out)
    src = row_major(operand.shape)
    kept = [d for d in range(len(operand.shape)) if d not in axes]
    out_st = [0] * len(operand.shape)
    for d, s in zip(kept, row_major(out.shape)):
        out_st[d] = s

    def body(idx):
        o = out.at(index_expr(idx, out_st))
        emitter.emit(f"{o} = {combine.format(a=o, b=operand.at(index_expr(idx, src)))}")

    if operand.size:  # on the cores where the outermost axis is kept
        outer = next((d for d, n in enumerate(operand.shape) if n != 1), 0)
        emitter.nest(operand.shape, body, parallel=outer not in axes)
    emitter.work += operand.size


def _row_fold(emitter, prim, operand, out, axes, init) -> bool:
    """A reduction over the trailing axes (each output a contiguous row) in
    a register, element by element in order (the order of the loop it
    replaces, which read and wrote the output per element: a bool `all`
    over 4 elements per board cell of a batch of games); else False."""
    rank = len(operand.shape)
    axes = sorted(axes)
    n = math.prod(operand.shape[d] for d in axes)
    if axes != list(range(rank - len(axes), rank)) or not operand.size or not isinstance(
            operand, Array):
        return False
    combine = REDUCTIONS[prim][0]
    with emitter.split(out.size, work=operand.size) as (lo, hi):
        o, c, acc = (emitter.fresh(x) for x in ("o", "c", "acc"))
        with emitter.block(f"for {o} in range({lo}, {hi}):"):
            emitter.emit(f"var {acc} = {literal(init, operand.dtype)}")
            with emitter.block(f"for {c} in range({n}):"):
                value = operand.at(f"{o} * {n} + {c}")
                emitter.emit(f"{acc} = {combine.format(a=acc, b=value)}")
            emitter.emit(f"{out.at(o)} = {acc}")
    emitter.work += operand.size
    return True


#: Elements a vector accumulator sums before its lanes join the total: the
#: sum of a long row is blocks of partial sums, as accurate as XLA's (a
#: sequential float32 sum of 500k elements was 2e-4 off, relatively).
SUM_BLOCK = 512


#: Float reductions written in SIMD vectors: how two vectors combine (the
#: extremes with XLA's NaN and signed-zero rules, fusion.FUSION_PRELUDE),
#: and how a vector's lanes join a scalar total.
VECTOR_FOLDS = {
    P.reduce_sum_p: ("{a} + {b}", "{total} += {acc}.reduce_add()"),
    P.reduce_max_p: ("max_nan_v[{dt}, {w}]({a}, {b})",
                     "for lane in range({w}):\n    {total} = max_nan({total}, {acc}[lane])"),
    P.reduce_min_p: ("min_nan_v[{dt}, {w}]({a}, {b})",
                     "for lane in range({w}):\n    {total} = min_nan({total}, {acc}[lane])"),
}


def _vector_fold(emitter, prim, operand, out, axes) -> bool:
    """A float sum, max or min in SIMD vectors, where the reduced axes are
    the trailing ones (each output a contiguous row: lanes of partial
    results, in blocks) or the leading ones (rows folded into the output, a
    vector at a time); else False."""
    dt, rank = operand.dtype, len(operand.shape)
    width = VECTOR_BYTES // dt.itemsize
    if prim not in VECTOR_FOLDS or dt.kind != "f" or not isinstance(operand, Array):
        return False
    axes = sorted(axes)
    n = math.prod(operand.shape[d] for d in axes)
    if not operand.size or n < 2:
        return False
    vector = f"SIMD[{mojo_dtype(dt)}, {width}]"
    identity = literal(reduction_identity(REDUCTIONS[prim][1], dt), dt)
    combine, lanes = VECTOR_FOLDS[prim]
    scalar_combine = REDUCTIONS[prim][0]
    emitter.fusion |= prim is not P.reduce_sum_p  # max_nan_v, min_nan_v

    def fold(acc, value):
        return f"{acc} = " + combine.format(a=acc, b=value, dt=mojo_dtype(dt), w=width)

    if axes == list(range(rank - len(axes), rank)) and n >= 2 * width:  # each output a row
        body = n - n % width
        with emitter.split(out.size, work=operand.size) as (lo, hi):
            o, b, c, acc, total = (emitter.fresh(x) for x in ("o", "b", "c", "acc", "total"))
            with emitter.block(f"for {o} in range({lo}, {hi}):" if out.size > 1 else "if True:"):
                row = f"{o} * {n}" if out.size > 1 else "0"
                emitter.emit(f"var {total} = {identity}")
                with emitter.block(f"for {b} in range(0, {body}, {SUM_BLOCK}):"):
                    emitter.emit(f"var {acc} = {vector}({identity})")
                    with emitter.block(f"for {c} in range({b}, min({b} + {SUM_BLOCK}, {body}), "
                                       f"{width}):"):
                        emitter.emit(fold(acc, operand.load(f"{row} + {c}", width)))
                    for line in lanes.format(total=total, acc=acc, w=width).split("\n"):
                        emitter.emit(line)
                if body < n:
                    with emitter.block(f"for {c} in range({body}, {n}):"):
                        value = operand.at(f"{row} + {c}")
                        emitter.emit(f"{total} = " + scalar_combine.format(a=total, b=value))
                emitter.emit(f"{out.at(o if out.size > 1 else '0')} = {total}")
        emitter.work += operand.size // width
        return True
    if axes == list(range(len(axes))) and out.size % width == 0:  # rows into the output
        i, j = emitter.fresh("i"), emitter.fresh("j")
        with emitter.split(out.size, width, work=operand.size) as (lo, hi), \
                emitter.block(f"for {j} in range({lo}, {hi}, {width}):"):
            acc = emitter.fresh("acc")
            emitter.emit(f"var {acc} = {vector}({identity})")
            with emitter.block(f"for {i} in range({n}):"):
                emitter.emit(fold(acc, operand.load(f"{i} * {out.size} + {j}", width)))
            emitter.emit(out.store(j, acc))
        emitter.work += operand.size // width
        return True
    return False


def argminmax(emitter, prim, ins, outs, *, axes, index_dtype):
    """The first extreme element's index; the first NaN's if any, as
    jax's comparator (argmax/argmin's lowering) picks."""
    (operand,), (out,) = ins, outs
    (axis,) = axes
    n, dt = operand.shape[axis], operand.dtype
    if not n:
        raise Unsupported(f"{prim.name} over an empty axis")
    src, out_st = row_major(operand.shape), row_major(out.shape)
    kept = [s for d, s in enumerate(src) if d != axis]
    beats = ">" if prim is P.argmax_p else "<"

    def body(idx):
        base = index_expr(idx, kept)
        best, where, j, v = (emitter.fresh(x) for x in ("m", "w", "j", "v"))
        emitter.emit(f"var {best} = {operand.at(base)}")
        emitter.emit(f"var {where} = 0")
        with emitter.block(f"for {j} in range(1, {n}):"):
            emitter.emit(f"var {v} = {operand.at(add_offsets(base, f'{j} * {src[axis]}'))}")
            test = f"{v} {beats} {best}"
            if dt == np.bool_:
                test = f"{v}.cast[DType.int32]() {beats} {best}.cast[DType.int32]()"
            if dt.kind == "f":
                test += f" or (isnan({v}) and not isnan({best}))"
            with emitter.block(f"if {test}:"):
                emitter.emit(f"{best} = {v}")
                emitter.emit(f"{where} = {j}")
        emitter.emit(f"{out.at(index_expr(idx, out_st))} = {scalar_type(out.dtype)}({where})")

    emitter.nest(out.shape, body, parallel=True, work=operand.size)
    emitter.work += operand.size


def reduce_variadic(emitter, prim, ins, outs, *, computation, jaxpr, dimensions):
    """lax.reduce: the computation's jaxpr folds each element into the
    accumulators, in row-major order (XLA leaves the order open)."""
    operands, inits = ins[:len(outs)], ins[len(outs):]
    shape = operands[0].shape
    acc_st = [0] * len(shape)
    for d, s in zip([d for d in range(len(shape)) if d not in dimensions],
                    row_major(outs[0].shape)):
        acc_st[d] = s
    for out, init in zip(outs, inits, strict=True):
        emitter.fill(out, init.at("0"))
    staged = [emitter.scratch((), o.dtype) for o in outs]
    src = row_major(shape)

    def body(idx):
        accs = [element(o, index_expr(idx, acc_st)) for o in outs]
        new = emitter.jaxpr(jaxpr, [*accs, *(element(x, index_expr(idx, src))
                                          for x in operands)])
        emitter.advance(new, staged, accs)

    if math.prod(shape):
        emitter.nest(shape, body)
    emitter.work += math.prod(shape) * len(operands)


EQUATIONS = {
    P.argmax_p: argminmax,
    P.argmin_p: argminmax,
    P.reduce_p: reduce_variadic,
    **{p: reduce for p in (P.reduce_sum_p, P.reduce_prod_p, P.reduce_max_p, P.reduce_min_p,
                           P.reduce_and_p, P.reduce_or_p)},
}
