"""Kernels for lax primitives MAX has no graph op for: integer bit operations,
bitcasts between dtypes of one width and the Threefry hash of `jax.random`.

Registered at `Priority.KERNEL`; the bit operations' guard accepts integer
dtypes only, so booleans (logical and/or/not) fall through to the generic lax
rules.
"""

from __future__ import annotations

import numpy as np

import juju
from juju import primitives as P
from juju_kernels_mojo import LIBRARY
from juju_kernels_mojo.lowering import broadcast_operands, call_kernel

rules = juju.RuleSet()

# Op codes of the kernels in kernels/bits.mojo.
BINARY_OPS = {
    P.and_p: 0,
    P.or_p: 1,
    P.xor_p: 2,
    P.shift_left_p: 3,
    P.shift_right_logical_p: 4,
    P.shift_right_arithmetic_p: 5,
}
UNARY_OPS = {P.not_p: 0, P.population_count_p: 1, P.clz_p: 2}

INTEGER_DTYPES = tuple(
    np.dtype(d) for d in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
)


def integer_operands(ctx) -> bool:
    return all(np.dtype(a.dtype) in INTEGER_DTYPES for a in ctx.avals_in)


def lower_bitwise_binary(ctx, x, y):
    x, y = broadcast_operands(ctx, x, y)
    (out,) = call_kernel(
        ctx, "juju_bitwise_binary", x, y, parameters={"op": BINARY_OPS[ctx.primitive]}
    )
    return out


def lower_bitwise_unary(ctx, x):
    (out,) = call_kernel(
        ctx, "juju_bitwise_unary", x, parameters={"op": UNARY_OPS[ctx.primitive]}
    )
    return out


rules.register(
    *BINARY_OPS, priority=juju.Priority.KERNEL, guard=integer_operands, requires=(LIBRARY,)
)(lower_bitwise_binary)
rules.register(
    *UNARY_OPS, priority=juju.Priority.KERNEL, guard=integer_operands, requires=(LIBRARY,)
)(lower_bitwise_unary)


@rules.register(P.threefry2x32_p, priority=juju.Priority.KERNEL, requires=(LIBRARY,))
def lower_threefry2x32(ctx, key1, key2, x1, x2):
    return call_kernel(ctx, "juju_threefry2x32", *broadcast_operands(ctx, key1, key2, x1, x2))


# Dtypes the bitcast kernel reads and writes (MAX and Mojo share these; the
# float8 formats stay with lax's arithmetic rule).
BITCAST_DTYPES = (*INTEGER_DTYPES,
                  *(np.dtype(d) for d in ("float16", "bfloat16", "float32", "float64")))


def same_width_bitcast(ctx) -> bool:
    src, dst = np.dtype(ctx.avals_in[0].dtype), np.dtype(ctx.params["new_dtype"])
    return src.itemsize == dst.itemsize and src in BITCAST_DTYPES and dst in BITCAST_DTYPES


@rules.register(P.bitcast_convert_type_p, priority=juju.Priority.KERNEL, guard=same_width_bitcast,
                requires=(LIBRARY,))
def lower_bitcast_convert_type(ctx, x, *, new_dtype):
    # lax's rule computes the bits with float64 arithmetic (log2, scaling):
    # ~10x slower than this kernel on jax.random.uniform's uint32 -> float32.
    (out,) = call_kernel(ctx, "juju_bitcast", x)
    return out
