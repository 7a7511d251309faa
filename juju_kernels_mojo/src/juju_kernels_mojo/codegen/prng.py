"""PRNG key arrays and jax.random inside generated loop kernels.

A key array is carried as its key words (`parts.Parts`, each word a
uint32 array of the key array's shape): structural equations apply to each
word. For JAX's implementations of random_bits, random_split and
random_fold_in (the rules' decompositions), and outside the kernel, a key
array is its raw key data, uint32[..., 2]. threefry2x32 is one call per
element of the PRELUDE's `threefry2x32`.
"""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju._compat import ShapedArray, key_data_aval
from juju_kernels_mojo.codegen.mojo import Unsupported, broadcast_strides, index_expr
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.parts import (PER_PART, Parts, deinterleave, interleave, per_part,
                                          physical, scratch_parts)


def key_words(dtype) -> int:
    """How many uint32 words a key of `dtype` holds (2 for threefry)."""
    data = key_data_aval(ShapedArray((), dtype))
    if np.dtype(data.dtype) != np.uint32 or len(data.shape) != 1:
        raise Unsupported(f"PRNG keys of {dtype}")
    return int(data.shape[0])


def scratch_keys(emitter, shape, dtype) -> Parts:
    return scratch_parts(emitter, shape, dtype, np.uint32, key_words(dtype))


def const_keys(emitter, value) -> Parts:
    """A closed-over key array, as one kernel input per word."""
    import jax

    data = np.asarray(jax.random.key_data(value))
    return Parts(tuple(emitter.closed_const(np.ascontiguousarray(data[..., w]))
                       for w in range(data.shape[-1])), value.dtype)


def keyed_equation(emitter, prim, ins, outs, params, avals, out_avals) -> None:
    """An equation with key operands or results (other than control flow
    and calls, which carry `Parts` through)."""
    if prim is P.random_wrap_p:
        deinterleave(emitter, ins[0], outs[0])
    elif prim is P.random_unwrap_p:
        interleave(emitter, ins[0], outs[0])
    elif prim is P.random_clone_p:
        emitter.copy(ins[0], outs[0])
    elif prim in PER_PART:
        per_part(emitter, prim, ins, outs, params)
    else:
        # random_bits, random_split, random_fold_in, random_seed, ...: the
        # rule's decomposition, which takes and gives raw key data.
        closed = emitter.decomposition(prim, avals, out_avals, params)
        if closed is None:
            raise Unsupported(f"{prim.name} on PRNG keys")
        data = [physical(emitter, x) if isinstance(x, Parts) else x for x in ins]
        for src, dst in zip(emitter.jaxpr(closed, data), outs, strict=True):
            if isinstance(dst, Parts):
                deinterleave(emitter, src, dst)
            else:
                emitter.copy(src, dst)


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
                args.append(x.at(index_expr(idx, broadcast_strides(x.shape))))
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
