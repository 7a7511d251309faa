"""lax.sort and lax.top_k in generated kernels. sort: a stable sort of each row along the
sorted dimension. Short rows (eigenvalues, a handful of candidates) are
insertion-sorted in place; longer ones, up to MAX_ROW, are merge-sorted as a
permutation that then moves every operand. Keys compare as jax's comparator
does: -0.0 equals 0.0, every NaN equals every other and sorts last; several
keys compare lexicographically; the other operands move with them.
"""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import Unsupported, index_expr, scalar_type
from juju_kernels_mojo.codegen.mojo import strides as row_major

#: Rows up to this length are insertion-sorted (n^2 / 2 comparisons, no
#: scratch); longer ones are merge-sorted.
INSERTION_ROW = 64
#: Rows longer than this stay with the sort kernel of the MAX graph.
MAX_ROW = 4096


def sort(emitter, prim, ins, outs, *, dimension, is_stable, num_keys) -> None:
    shape = ins[0].shape
    n = shape[dimension]
    if n > MAX_ROW:
        raise Unsupported(f"sort of rows of {n} elements")
    if any(x.dtype == np.uint64 for x in ins[:num_keys]):
        raise Unsupported("sort by uint64 keys")
    if n > INSERTION_ROW and outs[0].size:
        _merge_sort(emitter, ins, outs, dimension, num_keys)
        return
    for src, dst in zip(ins, outs, strict=True):
        emitter.copy(src, dst)
    if n <= 1 or not outs[0].size:
        return
    st = row_major(shape)
    step = st[dimension]
    outer = [1 if d == dimension else size for d, size in enumerate(shape)]

    def at(base: str, position: str) -> str:
        return f"{base} + {position} * {step}" if step != 1 else f"{base} + {position}"

    def body(idx):
        base = emitter.fresh("row")
        emitter.emit(f"var {base} = {index_expr(idx, st)}")
        i, j = emitter.fresh("i"), emitter.fresh("j")
        with emitter.block(f"for {i} in range(1, {n}):"):
            emitter.emit(f"var {j} = {i}")
            with emitter.block(f"while {j} > 0:"):
                here, before = at(base, j), at(base, f"({j} - 1)")
                keys = []
                for k in range(num_keys):
                    a, b = emitter.fresh("ka"), emitter.fresh("kb")
                    emitter.emit(f"var {a} = sort_key({outs[k].at(here)})")
                    emitter.emit(f"var {b} = sort_key({outs[k].at(before)})")
                    keys.append((a, b))
                emitter.emit(f"if not ({_less(keys)}):")
                emitter.emit("    break")
                for out in outs:
                    t = emitter.fresh("t")
                    emitter.emit(f"var {t} = {out.at(here)}")
                    emitter.emit(f"{out.at(here)} = {out.at(before)}")
                    emitter.emit(f"{out.at(before)} = {t}")
                emitter.emit(f"{j} -= 1")

    emitter.nest(outer, body)
    emitter.work += outs[0].size * n


def _merge_sort(emitter, ins, outs, dimension: int, num_keys: int) -> None:
    """Each row's stable order by a bottom-up merge sort of positions (a
    later element is taken first only when its keys are strictly less),
    then every operand gathered in that order."""
    shape = ins[0].shape
    n = shape[dimension]
    st = row_major(shape)
    step = st[dimension]
    outer = [1 if d == dimension else size for d, size in enumerate(shape)]
    order, scratch = emitter.fresh("order"), emitter.fresh("scratch")
    for name in (order, scratch):
        emitter.emit(f"var {name}_list = List[Int](length={n}, fill=0)")
        emitter.emit(f"var {name} = {name}_list.unsafe_ptr()")

    def at(base: str, position: str) -> str:
        return f"{base} + {position} * {step}" if step != 1 else f"{base} + {position}"

    def body(idx):
        base = emitter.fresh("row")
        emitter.emit(f"var {base} = {index_expr(idx, st)}")
        i, width, lo = emitter.fresh("i"), emitter.fresh("width"), emitter.fresh("lo")
        with emitter.block(f"for {i} in range({n}):"):
            emitter.emit(f"{order}[unsafe_offset={i}] = {i}")
        emitter.emit(f"var {width} = 1")
        with emitter.block(f"while {width} < {n}:"):
            emitter.emit(f"var {lo} = 0")
            with emitter.block(f"while {lo} < {n}:"):
                mid, hi, a, b, k = (emitter.fresh(x) for x in ("mid", "hi", "a", "b", "k"))
                emitter.emit(f"var {mid} = min({lo} + {width}, {n})")
                emitter.emit(f"var {hi} = min({lo} + 2 * {width}, {n})")
                emitter.emit(f"var {a} = {lo}")
                emitter.emit(f"var {b} = {mid}")
                with emitter.block(f"for {k} in range({lo}, {hi}):"):
                    take = emitter.fresh("take_b")
                    emitter.emit(f"var {take} = {a} >= {mid}")
                    with emitter.block(f"if not {take} and {b} < {hi}:"):
                        keys = []
                        for key in range(num_keys):
                            ka, kb = emitter.fresh("ka"), emitter.fresh("kb")
                            pa = at(base, f"{order}[unsafe_offset={a}]")
                            pb = at(base, f"{order}[unsafe_offset={b}]")
                            emitter.emit(f"var {ka} = sort_key({ins[key].at(pa)})")
                            emitter.emit(f"var {kb} = sort_key({ins[key].at(pb)})")
                            keys.append((kb, ka))
                        emitter.emit(f"{take} = {_less(keys)}")
                    with emitter.block(f"if {take}:"):
                        emitter.emit(f"{scratch}[unsafe_offset={k}] = {order}[unsafe_offset={b}]")
                        emitter.emit(f"{b} += 1")
                    with emitter.block("else:"):
                        emitter.emit(f"{scratch}[unsafe_offset={k}] = {order}[unsafe_offset={a}]")
                        emitter.emit(f"{a} += 1")
                emitter.emit(f"{lo} += 2 * {width}")
            with emitter.block(f"for {i}_copy in range({n}):"):
                emitter.emit(f"{order}[unsafe_offset={i}_copy] = {scratch}[unsafe_offset={i}_copy]")
            emitter.emit(f"{width} *= 2")
        with emitter.block(f"for {i}_out in range({n}):"):
            source = at(base, f"{order}[unsafe_offset={i}_out]")
            for src, dst in zip(ins, outs, strict=True):
                emitter.emit(f"{dst.at(at(base, f'{i}_out'))} = {src.at(source)}")

    emitter.nest(outer, body)
    emitter.work += outs[0].size * max(1, (n - 1).bit_length())


#: Most k x row-length a generated top_k takes (its selection is O(n k)).
TOP_K_WORK = 1 << 22


def top_k(emitter, prim, ins, outs, *, k, axis=-1, is_stable=True, **dynamic):
    """The k largest of each row along `axis` in XLA's total order (NaN
    above inf, -NaN below -inf, -0.0 below 0.0), ties by lower index (a
    stable order, one of those jax 0.12's is_stable=False allows), and
    their indices: each element inserted into the row's sorted best k."""
    (operand,), (values, indices) = ins, outs
    shape = operand.shape
    axis = axis % len(shape)
    n = shape[axis]
    if len(ins) > 1 or dynamic:
        raise Unsupported("top_k with a dynamic k")
    if operand.dtype == np.uint64 or operand.dtype == np.bool_:
        raise Unsupported(f"top_k of {operand.dtype}")
    if n * k > TOP_K_WORK:
        raise Unsupported(f"top_k of {k} in rows of {n} elements")
    if not values.size:
        return
    src, dst = row_major(shape), row_major(values.shape)
    outer = [1 if d == axis else size for d, size in enumerate(shape)]
    keys, places = emitter.fresh("best_key"), emitter.fresh("best_at")
    for name, kind in ((keys, "Int64"), (places, "Int")):
        emitter.emit(f"var {name}_list = List[{kind}](length={k}, fill=0)")
        emitter.emit(f"var {name} = {name}_list.unsafe_ptr()")
    key = _total_order_key(operand.dtype)

    def body(idx):
        base, out_base = index_expr(idx, src), index_expr(idx, dst)
        count, j, pos, v = (emitter.fresh(x) for x in ("count", "j", "pos", "v"))
        emitter.emit(f"var {count} = 0")
        with emitter.block(f"for {j} in range({n}):"):
            at = f"{base} + {j} * {src[axis]}" if base != "0" else f"{j} * {src[axis]}"
            emitter.emit(f"var {v} = {key(operand.at(at))}")
            with emitter.block(f"if {count} < {k} or {v} > {keys}[unsafe_offset={k - 1}]:"):
                emitter.emit(f"var {pos} = min({count}, {k - 1})")
                # earlier elements with an equal key stay ahead (stable)
                with emitter.block(f"while {pos} > 0 and {v} > {keys}[unsafe_offset={pos} - 1]:"):
                    emitter.emit(f"{keys}[unsafe_offset={pos}] = {keys}[unsafe_offset={pos} - 1]")
                    emitter.emit(f"{places}[unsafe_offset={pos}] = "
                                 f"{places}[unsafe_offset={pos} - 1]")
                    emitter.emit(f"{pos} -= 1")
                emitter.emit(f"{keys}[unsafe_offset={pos}] = {v}")
                emitter.emit(f"{places}[unsafe_offset={pos}] = {j}")
                emitter.emit(f"{count} = min({count} + 1, {k})")
        with emitter.block(f"for {j} in range({k}):"):
            place = f"{places}[unsafe_offset={j}]"
            to = f"{out_base} + {j} * {dst[axis]}" if out_base != "0" else f"{j} * {dst[axis]}"
            emitter.emit(f"{values.at(to)} = {operand.at(f'{base} + {place} * {src[axis]}')}")
            emitter.emit(f"{indices.at(to)} = {scalar_type(indices.dtype)}({place})")

    emitter.nest(outer, body)
    emitter.work += operand.size * min(k, 8)


def _total_order_key(dtype):
    """An Int64 expression ordering `dtype`'s values as XLA's total order."""
    if dtype.kind != "f":
        return lambda x: f"{x}.cast[DType.int64]()"
    word, sign, magnitude = {4: ("int32", 31, "0x7FFFFFFF"),
                             8: ("int64", 63, "0x7FFFFFFFFFFFFFFF")}[dtype.itemsize]

    def key(x):
        raw = f"bitcast[DType.{word}, 1]({x})"
        return f"({raw} ^ (({raw} >> {sign}) & {magnitude})).cast[DType.int64]()"

    return key


def _less(keys) -> str:
    """Lexicographic a < b over (a_k, b_k) pairs."""
    (a, b), rest = keys[0], keys[1:]
    if not rest:
        return f"{a} < {b}"
    return f"{a} < {b} or ({a} == {b} and ({_less(rest)}))"


EQUATIONS = {P.sort_p: sort, P.top_k_p: top_k}

#: Sort keys in jax's order, as Int64.
PRELUDE = '''
@always_inline
def sort_key[dt: DType](x: Scalar[dt]) -> Int64:
    comptime if dt == DType.float32:
        if isnan(x):
            return Int64(0x7FC00000)
        if x == 0:
            return 0
        var b = bitcast[DType.int32, 1](x).cast[DType.int64]()
        return b if b >= 0 else -(b & 0x7FFFFFFF) - 1
    elif dt == DType.float64:
        if isnan(x):
            return Int64(0x7FF8000000000000)
        if x == 0:
            return 0
        var b = bitcast[DType.int64, 1](x)
        return b if b >= 0 else -(b & 0x7FFFFFFFFFFFFFFF) - 1
    else:
        return x.cast[DType.int64]()
'''
