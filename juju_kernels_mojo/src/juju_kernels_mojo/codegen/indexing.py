"""Indexing equations: dynamic slices and updates (starts clamped as lax
does), gather and every scatter, in XLA's index modes."""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import (VECTOR_BYTES, Array, Const, Unsupported, add_offsets,
                                            index_expr)
from juju_kernels_mojo.codegen.mojo import strides as row_major


def dynamic_slice(emitter, prim, ins, outs, *, slice_sizes):
    operand, starts, (out,) = ins[0], ins[1:], outs
    src = row_major(operand.shape)
    offset = clamped_offset(emitter, operand.shape, starts, slice_sizes, src)
    emitter.strided(out, operand, src, offset)


def dynamic_update_slice(emitter, prim, ins, outs):
    operand, update, starts = ins[0], ins[1], ins[2:]
    (out,) = outs
    emitter.copy(operand, out)
    st = row_major(out.shape)
    offset = clamped_offset(emitter, out.shape, starts, update.shape, st)
    emitter.copy_strided(update.shape, out, st, update, row_major(update.shape),
                      dst_offset=offset)


def clamped_offset(emitter, shape, starts, sizes, st) -> str:
    """The flat offset of a dynamic slice, starts clamped as lax does."""
    terms = []
    for dim, start, size, s in zip(shape, starts, sizes, st):
        name = emitter.fresh("s")
        emitter.emit(f"var {name} = Int({start.at('0')})")
        emitter.emit(f"{name} = min(max({name}, 0), {int(dim) - int(size)})")
        terms.append(f"{name} * {s}")
    return "(" + " + ".join(terms) + ")" if terms else ""


def index_of(emitter, indices, batch, j: int) -> str:
    """Index vector element j at batch position `batch` (index_vector_dim
    is the last axis in jax), as a fresh Int variable."""
    st = row_major(indices.shape)
    name = emitter.fresh("s")
    at = add_offsets(index_expr(batch, st[:-1]), str(j * st[-1]) if j else "")
    emitter.emit(f"var {name} = Int({indices.at(at)})")
    return name


def gather(emitter, prim, ins, outs, *, dimension_numbers, slice_sizes, indices_are_sorted,
           unique_indices, mode, fill_value):
    (operand, indices), (out,) = ins, outs
    dn, mode = dimension_numbers, _mode_name(mode)
    if mode not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
        raise Unsupported(f"gather with mode={mode}")
    if not out.size:  # (an empty operand gives an empty result)
        return
    src, out_st = row_major(operand.shape), row_major(out.shape)
    window = [d for d in range(len(src))
              if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    batch_st = [out_st[d] for d in range(len(out_st)) if d not in dn.offset_dims]
    fill = None
    if mode == "FILL_OR_DROP":  # a slice not wholly in bounds reads fill_value
        fill = Const(_fill_value(operand.dtype, fill_value), (), operand.dtype)

    def body(batch):
        starts = [index_of(emitter, indices, batch, j) for j in range(len(dn.start_index_map))]
        highs = [operand.shape[d] - slice_sizes[d] for d in dn.start_index_map]
        ok = None
        if fill is not None and starts:
            ok = emitter.fresh("ok")
            emitter.emit(f"var {ok} = " + " and ".join(
                f"{s} >= 0 and {s} <= {hi}" for s, hi in zip(starts, highs)))
        for s, hi in zip(starts, highs):  # XLA clamps in every mode
            emitter.emit(f"{s} = min(max({s}, 0), {hi})")
        terms = [f"{s} * {src[d]}" for s, d in zip(starts, dn.start_index_map)]
        # a batching dim of the operand follows one of the indices (vmap)
        terms += [f"{batch[k]} * {src[d]}" for d, k in
                  zip(dn.operand_batching_dims, dn.start_indices_batching_dims)]
        base = " + ".join(terms)
        to_base = index_expr(batch, batch_st)

        def inner(w):
            at = add_offsets(base, index_expr(w, [src[d] for d in window]))
            to = add_offsets(to_base, index_expr(w, [out_st[d] for d in dn.offset_dims]))
            value = operand.at(at)
            if ok is not None:
                value = f"({value} if {ok} else {fill.at('0')})"
            emitter.emit(f"{out.at(to)} = {value}")

        run = _contiguous_run(window, len(src), dn.offset_dims, len(out_st), slice_sizes)
        if run and isinstance(operand, Array):  # a row of the operand: SIMD copies
            def row(w):
                at = add_offsets(base, index_expr(w, [src[d] for d in window[:-1]]))
                to = add_offsets(to_base, index_expr(w, [out_st[d] for d in dn.offset_dims[:-1]]))
                with emitter.when([ok] if ok is not None else []):
                    emitter.copy(operand.span(at, run), out.span(to, run))
                if ok is not None:
                    with emitter.block("else:"):
                        emitter.copy(fill, out.span(to, run))

            emitter.nest([slice_sizes[d] for d in window[:-1]], row)
            return
        emitter.nest([slice_sizes[d] for d in window], inner)

    emitter.nest(indices.shape[:-1], body, parallel=True, work=out.size)


def scatter(emitter, prim, ins, outs, *, update_jaxpr, update_consts, dimension_numbers,
            indices_are_sorted, unique_indices, mode):
    """Every scatter primitive: update_jaxpr (None: replace) combines an
    operand element with an update, written per element."""
    (operand, indices, updates), (out,) = ins, outs
    dn, mode = dimension_numbers, _mode_name(mode)
    if mode not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
        raise Unsupported(f"scatter with mode={mode}")
    emitter.copy(operand, out)
    if not out.size or not updates.size:
        return
    st, ust = row_major(out.shape), row_major(updates.shape)
    window = [d for d in range(len(st))
              if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    size = {d: updates.shape[u] for d, u in zip(window, dn.update_window_dims)}
    scattered = [d for d in range(len(ust)) if d not in dn.update_window_dims]
    consts = [emitter.closed_const(c) for c in update_consts]
    run = (_contiguous_run(window, len(st), dn.update_window_dims, len(ust),
                           [size.get(d, 1) for d in range(len(st))])
           if prim in (P.scatter_p, P.scatter_add_p) and out.dtype.kind in "fiu"
           and isinstance(updates, Array) else 0)

    def body(batch):
        starts = [index_of(emitter, indices, batch, j)
                  for j in range(len(dn.scatter_dims_to_operand_dims))]
        highs = [out.shape[d] - size.get(d, 1) for d in dn.scatter_dims_to_operand_dims]
        if mode == "CLIP":
            for s, hi in zip(starts, highs):
                emitter.emit(f"{s} = min(max({s}, 0), {hi})")
        terms = [f"{s} * {st[d]}" for s, d in zip(starts, dn.scatter_dims_to_operand_dims)]
        terms += [f"{batch[k]} * {st[d]}" for d, k in
                  zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims)]
        base = " + ".join(terms)
        from_base = index_expr(batch, [ust[d] for d in scattered])

        def inner(w):
            to = add_offsets(base, index_expr(w, [st[d] for d in window]))
            at = add_offsets(from_base, index_expr(w, [ust[d] for d in dn.update_window_dims]))
            target, update = element(out, to), element(updates, at)
            if update_jaxpr is not None:
                (update,) = emitter.jaxpr(update_jaxpr, [*consts, target, update])
            emitter.copy(update, target)

        def row(w):  # a row of the window at once (SIMD), replaced or added
            to = add_offsets(base, index_expr(w, [st[d] for d in window[:-1]]))
            at = add_offsets(from_base,
                             index_expr(w, [ust[d] for d in dn.update_window_dims[:-1]]))
            if prim is P.scatter_p:
                emitter.copy(updates.span(at, run), out.span(to, run))
            else:
                _add_into(emitter, out.span(to, run), updates.span(at, run))

        # XLA drops an update window not wholly in bounds (CLIP clamped it)
        checks = [f"{s} >= 0 and {s} <= {hi}" for s, hi in zip(starts, highs)]
        with emitter.when(checks if mode != "CLIP" else []):
            if run:
                emitter.nest([size[d] for d in window[:-1]], row)
            else:
                emitter.nest([size[d] for d in window], inner)

    emitter.nest(indices.shape[:-1], body)
    emitter.work += updates.size


def _contiguous_run(window, rank, out_dims, out_rank, sizes) -> int:
    """The length of the window's last axis where it is contiguous on both
    sides (the last axis of the sliced array and of the other), so a window
    row is one SIMD copy; else 0 (elements one at a time)."""
    if not window or window[-1] != rank - 1 or not out_dims or out_dims[-1] != out_rank - 1:
        return 0
    n = sizes[window[-1]]
    return n if n >= 4 else 0


def _add_into(emitter, dst: Array, src: Array) -> None:
    """dst += src elementwise, in SIMD vectors (a segment sum's row)."""
    width = VECTOR_BYTES // dst.dtype.itemsize
    whole = dst.size - dst.size % width
    k = emitter.fresh("k")
    if whole:
        with emitter.block(f"for {k} in range(0, {whole}, {width}):"):
            emitter.emit(dst.store(k, f"{dst.load(k, width)} + {src.load(k, width)}"))
    if whole < dst.size:
        with emitter.block(f"for {k} in range({whole}, {dst.size}):"):
            emitter.emit(f"{dst.at(k)} = {dst.at(k)} + {src.at(k)}")


def element(x, at: str):
    """Element `at` of x as a rank-0 array (or the literal)."""
    if isinstance(x, Const):
        return Const(x.value, (), x.dtype)
    return Array(x.ptr, (), x.dtype, add_offsets(x.offset, at))


def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _fill_value(dtype, fill_value):
    """What a FILL_OR_DROP gather reads out of bounds (jax's defaults)."""
    if fill_value is not None:
        return fill_value
    if dtype.kind == "f":
        return np.nan
    if dtype == np.bool_:
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


EQUATIONS = {
    P.dynamic_slice_p: dynamic_slice,
    P.dynamic_update_slice_p: dynamic_update_slice,
    P.gather_p: gather,
    **{p: scatter for p in (P.scatter_p, P.scatter_add_p, P.scatter_mul_p, P.scatter_min_p,
                            P.scatter_max_p)},
}
