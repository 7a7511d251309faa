"""Values a generated kernel carries as several plain arrays (`Parts`): a
PRNG key array as its key words (prng.py), a complex array as its
real and imaginary parts (complex_parts.py).

Each part is an ordinary array of the value's shape (part-major), so a
structural equation (slice, gather, select_n, dynamic_update_slice, ...)
applies to each part as to any array, as juju_ops_lax's per-word rules do
in the graph, and a row of a scanned value is a row of each part. Outside
the kernel a value is its physical form, the parts interleaved along a last
axis (`juju.dtypes.physical_aval`): `interleave` and `deinterleave` convert
at those edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import Array

#: Primitives whose operands and results are moved, not computed on:
#: applied to each part alike.
PER_PART = {
    P.broadcast_in_dim_p, P.concatenate_p, P.copy_p, P.dynamic_slice_p,
    P.dynamic_update_slice_p, P.gather_p, P.pad_p, P.reshape_p, P.rev_p, P.scatter_p,
    P.select_n_p,
    P.slice_p, P.squeeze_p, P.stack_p, P.unstack_p, P.split_p, P.transpose_p,
}


@dataclass(frozen=True)
class Parts:
    """A value of `dtype` (a key or complex dtype) in the kernel: one array
    per part, each of the value's shape."""

    words: tuple
    dtype: object

    @property
    def shape(self) -> tuple:
        return self.words[0].shape

    @property
    def size(self) -> int:
        return sum(w.size for w in self.words)

    # A value is identified by its first part (loop carries compare these).
    @property
    def ptr(self) -> str:
        return self.words[0].ptr

    @property
    def offset(self) -> str:
        return self.words[0].offset

    def row(self, index: str) -> Parts:
        return Parts(tuple(w.row(index) for w in self.words), self.dtype)


def scratch_parts(emitter, shape, dtype, part_dtype, count: int) -> Parts:
    return Parts(tuple(emitter.scratch(shape, part_dtype) for _ in range(count)), dtype)


def deinterleave(emitter, data: Array, value: Parts) -> None:
    """value = the value whose physical form (parts on a last axis) is `data`."""
    n = len(value.words)
    with emitter.each(0, math.prod(value.shape)) as k:
        for w, word in enumerate(value.words):
            emitter.emit(f"{word.at(k)} = {data.at(f'{k} * {n} + {w}' if n > 1 else k)}")


def interleave(emitter, value: Parts, data: Array) -> None:
    """data (parts on a last axis) = the physical form of `value`."""
    n = len(value.words)
    with emitter.each(0, math.prod(value.shape)) as k:
        for w, word in enumerate(value.words):
            emitter.emit(f"{data.at(f'{k} * {n} + {w}' if n > 1 else k)} = {word.at(k)}")


def physical(emitter, value: Parts) -> Array:
    """A scratch copy of `value` in its physical form."""
    part = value.words[0]
    data = emitter.scratch((*value.shape, len(value.words)), part.dtype)
    interleave(emitter, value, data)
    return data


def per_part(emitter, prim, ins, outs, params) -> None:
    """A structural equation, applied to each part of its `Parts` operands
    and results (its other operands, indices or predicates, shared)."""
    (n,) = {len(x.words) for x in (*ins, *outs) if isinstance(x, Parts)}
    for w in range(n):
        emitter.equation(prim, [part(x, w) for x in ins], [part(o, w) for o in outs], params)


def part(x, w: int):
    return x.words[w] if isinstance(x, Parts) else x


def has_parts(values) -> bool:
    return any(isinstance(x, Parts) for x in values)
