"""Window reductions and cumulative reductions in generated loop kernels:
lax.reduce_window_{sum,max,min} (padding, strides, base and window
dilation, as XLA), the max/min pool's gradient (select_and_scatter_add) and
cumsum/cumprod/cummax/cummin (one pass along the axis). distrax's coupling
flows and rlax's returns are made of them.
"""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import (REDUCTIONS, Unsupported, index_expr, literal,
                                        reduction_identity)
from juju_kernels_mojo.codegen.mojo import strides as row_major


def _combine(prim, dtype):
    combine, init = REDUCTIONS[prim]
    if dtype == np.bool_ and "max_nan" not in combine and "min_nan" not in combine:
        raise Unsupported(f"{prim.name} of bool")
    return combine, literal(reduction_identity(init, dtype), dtype)


def reduce_window(emitter, prim, ins, outs, *, window_dimensions, window_strides, padding,
                  base_dilation, window_dilation) -> None:
    """out[o] = the combination of the window at o (positions in the padded,
    base-dilated operand; padding and holes hold the identity)."""
    (operand,), (out,) = ins, outs
    combine, identity = _combine(prim, operand.dtype)
    src, dst = row_major(operand.shape), row_major(out.shape)
    if not out.size:
        return

    def body(idx):
        acc = emitter.fresh("acc")
        emitter.emit(f"var {acc} = {identity}")

        def inner(widx):
            conditions, terms = [], []
            for d, dim in enumerate(operand.shape):
                coordinate, checks = window_coordinate(
                    idx[d], widx[d], window_strides[d], window_dilation[d], base_dilation[d],
                    padding[d][0], out.shape[d], window_dimensions[d], dim)
                conditions += checks
                terms.append(f"{coordinate} * {src[d]}" if src[d] != 1 else coordinate)
            at = " + ".join(terms) or "0"
            value = operand.at(f"({at})")
            with emitter.when(conditions):
                emitter.emit(f"{acc} = {combine.format(a=acc, b=value)}")

        emitter.nest(window_dimensions, inner)
        emitter.emit(f"{out.at(index_expr(idx, dst))} = {acc}")

    emitter.nest(out.shape, body, parallel=True,
                 work=out.size * int(np.prod(window_dimensions)))
    emitter.work += out.size * int(np.prod(window_dimensions))


def select_and_scatter_add(emitter, prim, ins, outs, *, select_prim, window_dimensions,
                           window_strides, padding) -> None:
    """The gradient of a max (min) pool: out (the operand's shape) = 0, then
    for each window, source's value added where the window's first maximum
    (minimum) is, as XLA selects (a later element wins where
    `select_prim(selected, element)` is false; padding is never selected)."""
    source, operand = ins
    (out,) = outs
    test = {P.ge_p: ">=", P.le_p: "<=", P.gt_p: ">", P.lt_p: "<"}.get(select_prim)
    if test is None:
        raise Unsupported(f"select_and_scatter_add selecting by {select_prim}")
    emitter.fill(out, literal(0, out.dtype))
    if not source.size:
        return
    src, dst = row_major(operand.shape), row_major(source.shape)

    def body(idx):
        chosen, best = emitter.fresh("sel"), emitter.fresh("best")
        emitter.emit(f"var {chosen} = -1")
        emitter.emit(f"var {best} = {literal(0, operand.dtype)}")

        def inner(widx):
            conditions, terms = [], []
            for d, dim in enumerate(operand.shape):
                coordinate, checks = window_coordinate(
                    idx[d], widx[d], window_strides[d], 1, 1, padding[d][0],
                    source.shape[d], window_dimensions[d], dim)
                conditions += checks
                terms.append(f"{coordinate} * {src[d]}" if src[d] != 1 else coordinate)
            at = f"({' + '.join(terms) or '0'})"
            with emitter.when(conditions):
                value = operand.at(at)
                with emitter.block(f"if {chosen} < 0 or not ({best} {test} {value}):"):
                    emitter.emit(f"{chosen} = {at}")
                    emitter.emit(f"{best} = {value}")

        emitter.nest(window_dimensions, inner)
        with emitter.block(f"if {chosen} >= 0:"):
            emitter.emit(f"{out.at(chosen)} += {source.at(index_expr(idx, dst))}")

    emitter.nest(source.shape, body)
    emitter.work += source.size * int(np.prod(window_dimensions))


def window_coordinate(out_index: str, window_index: str, stride: int, dilation: int, base: int,
                      low: int, out_dim: int, window_dim: int, in_dim: int):
    """The operand coordinate a window element reads along one axis, and the
    conditions under which it reads one (not padding, not a hole of base
    dilation), each left out where it always holds."""
    position = _affine([(out_index, stride), (window_index, dilation)], -low)
    last = (out_dim - 1) * stride + (window_dim - 1) * dilation - low
    conditions, coordinate = [], position
    if low > 0:
        conditions.append(f"{position} >= 0")
    if base != 1:
        conditions.append(f"{position} % {base} == 0")
        coordinate = f"({position} // {base})"
    if last > (in_dim - 1) * base:
        conditions.append(f"{coordinate} < {in_dim}")
    return coordinate, conditions


def _affine(terms, constant: int) -> str:
    """sum(name * factor) + constant, as a Mojo expression over loop indices."""
    parts = [n if f == 1 else f"{n} * {f}" for n, f in terms if n != "0" and f != 0]
    if constant or not parts:
        parts.append(str(constant))
    return "(" + " + ".join(parts) + ")"


def cumulative(emitter, prim, ins, outs, *, axis, reverse) -> None:
    """out[..., i, ...] = combine(out[..., i -+ 1, ...], x[..., i, ...])."""
    (operand,), (out,) = ins, outs
    combine, _ = _combine(prim, operand.dtype)
    shape = operand.shape
    if not out.size:
        return
    st = row_major(shape)
    outer = [d if a != axis else 1 for a, d in enumerate(shape)]
    n, step = shape[axis], st[axis]

    def body(idx):
        base = index_expr(idx, st)
        first = f"{base} + {(n - 1) * step}" if reverse else base
        emitter.emit(f"{out.at(first)} = {operand.at(first)}")
        if n == 1:
            return
        k = emitter.fresh("c")
        with emitter.block(f"for {k} in range(1, {n}):"):
            position = f"({n - 1} - {k})" if reverse else k
            here = f"{base} + {position} * {step}" if step != 1 else f"{base} + {position}"
            before = f"{base} + ({position} {'+' if reverse else '-'} 1) * {step}"
            value = combine.format(a=out.at(before), b=operand.at(here))
            emitter.emit(f"{out.at(here)} = {value}")

    emitter.nest(outer, body)


EQUATIONS = {
    **{p: reduce_window for p in (P.reduce_window_sum_p, P.reduce_window_max_p,
                                  P.reduce_window_min_p)},
    **{p: cumulative for p in (P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p)},
    P.select_and_scatter_add_p: select_and_scatter_add,
}
