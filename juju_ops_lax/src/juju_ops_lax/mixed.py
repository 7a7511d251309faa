"""Selects and comparisons (ops whose operands' dtype is not their result's),
built so that MAX 26.7's graph compiler does not crash on them.

MAX drops the size-1 dimensions of an elementwise op whose operands and
result share one dtype: `s / w` on [4, 1] becomes a [4] op between two
reshapes. It keeps them in a select or a comparison. Two such ops on a shape
with a size-1 dimension beside others, each reading the same two of those
reshaped values, one of them fused into a reduction's or a matmul's
epilogue, make the compiler segfault (the whole process dies):

    d = sum(x, axis=1, keepdims) / w     # [4, 1], in the reduction's epilogue
    c = not(p)                           # [4, 1], also computed as [4]
    where(c, z, d) + where(c, u, d)      # segfault

One such select compiles, and so do two whose condition is a graph input
or a comparison (one reshaped operand each), or whose `d` is the reduction
itself, or with no reduction or matmul before them, or on [4] or [1, 1].
Two comparisons in place of the selects crash too, and so does a plain
input as the condition when the other operand is reshaped (`-u`). JAX's
gradient of `logsumexp(..., keepdims=True)` has the pattern (its transpose
of abs: two selects on the NaN-aware `x >= 0`, a `logical_and`), and so has
every cross-entropy written with it (an MLP's training step). Computed with
the result's size-1 dimensions dropped, a select or comparison meets its
producers at their own shape, as MAX's rewritten ops do, and the compiler
gets through (docs/max-bugs.md, tests/test_max_workarounds.py).

The lax and nn packs build every select and comparison here.
"""

from __future__ import annotations

from max.graph import StaticDim, ops


def _is_unit(dim) -> bool:
    return isinstance(dim, StaticDim) and int(dim) == 1


def unit_dims_dropped(op, *operands):
    """`op(*operands)` (numpy broadcasting), computed without the result's
    size-1 dimensions and reshaped back. Unchanged when the result has no
    size-1 dimension, no other one (one element: MAX did not crash there),
    or an operand is not a graph value."""
    shapes = [getattr(x, "shape", None) for x in operands]
    if any(shape is None for shape in shapes):
        return op(*operands)
    rank = max(len(shape) for shape in shapes)
    if rank < 2:
        return op(*operands)
    # A result dim is 1 where every operand that has it is 1 there.
    unit = [all(_is_unit(shape[p - rank + len(shape)])
                for shape in shapes if p >= rank - len(shape))
            for p in range(rank)]
    if not any(unit) or all(unit):
        return op(*operands)
    squeezed = []
    for x, shape in zip(operands, shapes):
        offset = rank - len(shape)
        kept = [dim for p, dim in enumerate(shape, offset) if not unit[p]]
        squeezed.append(x if len(kept) == len(shape) else ops.reshape(x, kept))
    result = op(*squeezed)
    dims = iter(result.shape)
    return ops.reshape(result, [1 if unit[p] else next(dims) for p in range(rank)])


def where(condition, x, y):
    return unit_dims_dropped(ops.where, condition, x, y)


def equal(x, y):
    return unit_dims_dropped(ops.equal, x, y)


def not_equal(x, y):
    return unit_dims_dropped(ops.not_equal, x, y)


def greater(x, y):
    return unit_dims_dropped(ops.greater, x, y)


def greater_equal(x, y):
    return unit_dims_dropped(ops.greater_equal, x, y)
