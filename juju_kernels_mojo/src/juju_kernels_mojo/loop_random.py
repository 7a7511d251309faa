"""PRNG key arrays and jax.random inside generated loop kernels.

A key array is carried as its key words, each a uint32 array of the key
array's shape (`KeyArray`, word-major): a structural equation (slice,
gather, select_n, dynamic_update_slice, ...) then applies to each word as to
any array, as juju_ops_lax's per-word rules do in the graph, and a row of a
scanned key array is a row of each word. Outside the kernel, and for JAX's
implementations of random_bits, random_split and random_fold_in (the rules'
decompositions), a key array is its raw key data, uint32[..., 2]
(interleaved): `interleave` and `deinterleave` convert at those edges.
threefry2x32 is one call per element of the PRELUDE's `threefry2x32`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from juju import primitives as P
from juju._compat import is_key_dtype, key_data_aval
from juju_kernels_mojo.loop_mojo import Array, Unsupported, index_expr
from juju_kernels_mojo.loop_mojo import strides as row_major

#: Primitives whose key operands and results are moved, not computed on:
#: applied to each key word alike.
PER_WORD = {
    P.broadcast_in_dim_p, P.concatenate_p, P.copy_p, P.dynamic_slice_p,
    P.dynamic_update_slice_p, P.gather_p, P.reshape_p, P.rev_p, P.scatter_p, P.select_n_p,
    P.slice_p, P.squeeze_p, P.stack_p, P.unstack_p, P.split_p, P.transpose_p,
}


@dataclass(frozen=True)
class KeyArray:
    """A key array of `dtype` (a key dtype) in the kernel: one uint32 array
    per key word, each of the key array's shape."""

    words: tuple
    dtype: object

    @property
    def shape(self) -> tuple:
        return self.words[0].shape

    @property
    def size(self) -> int:
        return sum(w.size for w in self.words)

    # A key array is identified by its first word (loop carries compare these).
    @property
    def ptr(self) -> str:
        return self.words[0].ptr

    @property
    def offset(self) -> str:
        return self.words[0].offset

    def row(self, index: str) -> KeyArray:
        return KeyArray(tuple(w.row(index) for w in self.words), self.dtype)


def key_words(dtype) -> int:
    """How many uint32 words a key of `dtype` holds (2 for threefry)."""
    data = key_data_aval(_aval((), dtype))
    if np.dtype(data.dtype) != np.uint32 or len(data.shape) != 1:
        raise Unsupported(f"PRNG keys of {dtype}")
    return int(data.shape[0])


def _aval(shape, dtype):
    from jax.core import ShapedArray

    return ShapedArray(tuple(shape), dtype)


def scratch_keys(emitter, shape, dtype) -> KeyArray:
    return KeyArray(tuple(emitter.scratch(shape, np.uint32) for _ in range(key_words(dtype))),
                    dtype)


def deinterleave(emitter, data: Array, keys: KeyArray) -> None:
    """keys = the key array whose raw data (uint32[..., words]) is `data`."""
    n = len(keys.words)
    with emitter.each(0, math.prod(keys.shape)) as k:
        for w, word in enumerate(keys.words):
            emitter.emit(f"{word.at(k)} = {data.at(f'{k} * {n} + {w}' if n > 1 else k)}")


def interleave(emitter, keys: KeyArray, data: Array) -> None:
    """data (uint32[..., words]) = the raw data of `keys`."""
    n = len(keys.words)
    with emitter.each(0, math.prod(keys.shape)) as k:
        for w, word in enumerate(keys.words):
            emitter.emit(f"{data.at(f'{k} * {n} + {w}' if n > 1 else k)} = {word.at(k)}")


def key_data(emitter, keys: KeyArray) -> Array:
    data = emitter.scratch((*keys.shape, len(keys.words)), np.uint32)
    interleave(emitter, keys, data)
    return data


def const_keys(emitter, value) -> KeyArray:
    """A closed-over key array, as one kernel input per word."""
    import jax

    data = np.asarray(jax.random.key_data(value))
    return KeyArray(tuple(emitter.closed_const(np.ascontiguousarray(data[..., w]))
                          for w in range(data.shape[-1])), value.dtype)


def keyed_equation(emitter, prim, ins, outs, params, avals, out_avals) -> None:
    """An equation with key operands or results (other than control flow
    and calls, which carry `KeyArray`s through)."""
    if prim is P.random_wrap_p:
        deinterleave(emitter, ins[0], outs[0])
    elif prim is P.random_unwrap_p:
        interleave(emitter, ins[0], outs[0])
    elif prim is P.random_clone_p:
        emitter.copy(ins[0], outs[0])
    elif prim in PER_WORD:
        words = {len(x.words) for x in (*ins, *outs) if isinstance(x, KeyArray)}
        (n,) = words
        for w in range(n):
            emitter.equation(prim, [x.words[w] if isinstance(x, KeyArray) else x for x in ins],
                             [o.words[w] if isinstance(o, KeyArray) else o for o in outs],
                             params)
    else:
        # random_bits, random_split, random_fold_in, random_seed, ...: the
        # rule's decomposition, which takes and gives raw key data.
        closed = emitter.decomposition(prim, avals, out_avals, params)
        if closed is None:
            raise Unsupported(f"{prim.name} on PRNG keys")
        data = [key_data(emitter, x) if isinstance(x, KeyArray) else x for x in ins]
        for src, dst in zip(emitter.jaxpr(closed, data), outs, strict=True):
            if isinstance(dst, KeyArray):
                deinterleave(emitter, src, dst)
            else:
                emitter.copy(src, dst)


def has_keys(values) -> bool:
    return any(isinstance(x, KeyArray) for x in values)


def is_key_aval(aval) -> bool:
    return is_key_dtype(getattr(aval, "dtype", None)) if hasattr(aval, "dtype") else False


# --- counters and the hash ------------------------------------------------------

def threefry2x32(emitter, prim, ins, outs, **params) -> None:
    """Threefry-2x32 of counts (ins[2], ins[3]) under keys (ins[0], ins[1]),
    whose size-1 axes broadcast (vmapped key splits)."""
    x0, x1 = outs
    if any(len(x.shape) != len(x0.shape) for x in ins if x.size != 1):
        raise Unsupported("threefry2x32 with operands of another rank")
    out_strides = row_major(x0.shape)

    def body(idx):
        at = index_expr(idx, out_strides)
        args = []
        for x in ins:
            if x.size == 1:
                args.append(x.at("0"))
            else:
                st = [0 if d == 1 else s for d, s in zip(x.shape, row_major(x.shape))]
                args.append(x.at(index_expr(idx, st)))
        pair = emitter.fresh("t")
        emitter.emit(f"var {pair} = threefry2x32({', '.join(args)})")
        emitter.emit(f"{x0.at(at)} = {pair}[0]")
        emitter.emit(f"{x1.at(at)} = {pair}[1]")

    if x0.size:
        emitter.nest(x0.shape, body)


def iota_2x32_shape(emitter, prim, ins, outs, *, shape) -> None:
    """(hi, lo) words of the row-major linear index."""
    hi, lo = outs
    if hi.size >= 1 << 32:
        raise Unsupported("iota_2x32_shape of 2**32 elements or more")
    with emitter.each(0, hi.size) as k:
        emitter.emit(f"{hi.at(k)} = Scalar[DType.uint32](0)")
        emitter.emit(f"{lo.at(k)} = Scalar[DType.uint32]({k})")


EQUATIONS = {
    P.threefry2x32_p: threefry2x32,
    P.iota_2x32_shape_p: iota_2x32_shape,
}

#: The threefry hash (20 rounds), as jax.random computes it.
PRELUDE = '''
@always_inline
def rotl32(v: Scalar[DType.uint32], r: Scalar[DType.uint32]) -> Scalar[DType.uint32]:
    return (v << r) | (v >> (32 - r))


@always_inline
def threefry_rounds(mut x0: Scalar[DType.uint32], mut x1: Scalar[DType.uint32],
                    r0: Scalar[DType.uint32], r1: Scalar[DType.uint32],
                    r2: Scalar[DType.uint32], r3: Scalar[DType.uint32]):
    x0 += x1
    x1 = rotl32(x1, r0) ^ x0
    x0 += x1
    x1 = rotl32(x1, r1) ^ x0
    x0 += x1
    x1 = rotl32(x1, r2) ^ x0
    x0 += x1
    x1 = rotl32(x1, r3) ^ x0


def threefry2x32(k0: Scalar[DType.uint32], k1: Scalar[DType.uint32],
                 c0: Scalar[DType.uint32], c1: Scalar[DType.uint32]) -> SIMD[DType.uint32, 2]:
    var k2 = k0 ^ k1 ^ Scalar[DType.uint32](0x1BD11BDA)
    var x0 = c0 + k0
    var x1 = c1 + k1
    threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 += k1
    x1 += k2 + 1
    threefry_rounds(x0, x1, 17, 29, 16, 24)
    x0 += k2
    x1 += k0 + 2
    threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 += k0
    x1 += k1 + 3
    threefry_rounds(x0, x1, 17, 29, 16, 24)
    x0 += k1
    x1 += k2 + 4
    threefry_rounds(x0, x1, 13, 15, 26, 6)
    x0 += k2
    x1 += k0 + 5
    return SIMD[DType.uint32, 2](x0, x1)
'''
