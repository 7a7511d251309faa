"""lax.sort in generated kernels: a stable insertion sort of each row along
the sorted dimension, for the short rows small programs sort (eigenvalues,
a handful of candidates). Keys compare as jax's comparator does: -0.0
equals 0.0, every NaN equals every other and sorts last; several keys
compare lexicographically; the other operands move with them.
"""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.loop_mojo import Unsupported, index_expr
from juju_kernels_mojo.loop_mojo import strides as row_major

#: Rows longer than this stay with the sort kernel of the MAX graph (an
#: insertion sort does n^2 / 2 comparisons).
MAX_ROW = 64


def sort(emitter, prim, ins, outs, *, dimension, is_stable, num_keys) -> None:
    shape = ins[0].shape
    n = shape[dimension]
    if n > MAX_ROW:
        raise Unsupported(f"sort of rows of {n} elements")
    if any(x.dtype == np.uint64 for x in ins[:num_keys]):
        raise Unsupported("sort by uint64 keys")
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


def _less(keys) -> str:
    """Lexicographic a < b over (a_k, b_k) pairs."""
    (a, b), rest = keys[0], keys[1:]
    if not rest:
        return f"{a} < {b}"
    return f"{a} < {b} or ({a} == {b} and ({_less(rest)}))"


EQUATIONS = {P.sort_p: sort}

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
