"""PRNG: key arrays, threefry2x32 and jax.random's primitives.

Inside a graph a key array is its raw key data (uint32[..., 2] for threefry),
as in XLA. The random_* rules lower JAX's own implementations on that data
(`juju._compat.jax_impls`), so `jax.random` gives the same bits as under
`jax.jit`. Structural primitives applied to key arrays (slice, reshape,
concatenate, select_n, gather, ...) are lowered once per key word: each word
of a key array is an ordinary uint32 array of the key array's shape.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import ALL_DTYPES, RuleSet, lower_fun
from juju import primitives as P
from juju._compat import is_key_dtype, jax_impls, key_impl
from juju.primitives import (
    iota_2x32_shape_p,
    random_clone_p,
    random_unwrap_p,
    random_wrap_p,
    stack_p,
    tile_p,
    unstack_p,
)
from juju_ops_lax._util import lower_per_word

# Key arrays arrive as their raw words (uint32[..., 2] for threefry).
rules = RuleSet(dtypes=ALL_DTYPES)


# --- key-array primitives -----------------------------------------------------


rules.register(P.random_seed_p)(lower_fun(jax_impls.random_seed))


def _key_impl(ctx):
    return {"impl": key_impl(ctx.avals_in[0])}


def _key_impl_and_rank(ctx):
    return {"impl": key_impl(ctx.avals_in[0]), "keys_ndim": ctx.avals_in[0].ndim}


def _bits(base, *, impl, keys_ndim, bit_width, shape):
    return jax_impls.random_bits(impl, base, keys_ndim, bit_width=bit_width, shape=shape)


def _split(base, *, impl, keys_ndim, shape):
    return jax_impls.random_split(impl, base, keys_ndim, shape=shape)


def _fold_in(base, msgs, *, impl, keys_ndim):
    return jax_impls.random_fold_in(impl, base, msgs, base.shape[:keys_ndim])


rules.register(P.random_bits_p)(lower_fun(_bits, extra_params=_key_impl_and_rank))
rules.register(P.random_split_p)(lower_fun(_split, extra_params=_key_impl_and_rank))
rules.register(P.random_fold_in_p)(lower_fun(_fold_in, extra_params=_key_impl_and_rank))


@rules.register(random_wrap_p)
def lower_random_wrap(ctx, base, *, impl):
    return base  # the key array is its data


@rules.register(random_unwrap_p)
def lower_random_unwrap(ctx, keys):
    return keys


@rules.register(random_clone_p)
def lower_random_clone(ctx, keys):
    return keys


def _gamma(base, a, *, impl, log_space):
    keys = jax_impls.random_wrap(base, impl=impl)
    return jax_impls.random_gamma(keys, a, log_space=log_space, use_vmap=True)


rules.register(P.random_gamma_p)(lower_fun(_gamma, extra_params=_key_impl))


# --- counters and the hash ---------------------------------------------------

# Unrolled, as XLA's generic lowering: 20 rounds of adds, rotates and xors.
rules.register(P.threefry2x32_p)(
    lower_fun(partial(jax_impls.threefry2x32, use_rolled_loops=False), multiple_results=True)
)


@rules.register(iota_2x32_shape_p)
def lower_iota_2x32_shape(ctx, *, shape):
    """(hi, lo) 32-bit words of the row-major linear index, a uint64 iota."""
    strides = np.cumprod((1,) + tuple(shape[:0:-1]))[::-1]
    counts = None
    for axis, (size, stride) in enumerate(zip(shape, strides)):
        iota = ops.range(0, int(size), 1, dtype=DType.int64, device=ctx.device)
        iota = ops.reshape(iota, [int(size) if d == axis else 1 for d in range(len(shape))])
        term = ops.mul(iota, ops.constant(int(stride), DType.int64, device=ctx.device))
        term = ops.broadcast_to(term, list(shape))
        counts = term if counts is None else ops.add(counts, term)
    word = ops.constant(1 << 32, DType.int64, device=ctx.device)
    hi = ops.cast(ops.div(counts, word), DType.uint32)  # counts >= 0: div is floor
    lo = ops.cast(ops.mod(counts, word), DType.uint32)
    return hi, lo


# --- structural primitives on key arrays -------------------------------------

_PER_WORD = [
    P.broadcast_in_dim_p,
    P.concatenate_p,
    P.copy_p,
    P.dynamic_slice_p,
    P.dynamic_update_slice_p,
    P.gather_p,
    P.reshape_p,
    P.rev_p,
    P.scatter_p,
    P.select_n_p,
    P.slice_p,
    P.squeeze_p,
    stack_p,
    tile_p,
    unstack_p,
    P.transpose_p,
]


def _has_keys(ctx) -> bool:
    return any(is_key_dtype(a.dtype) for a in (*ctx.avals_in, *ctx.avals_out))


@rules.register(*dict.fromkeys(_PER_WORD), priority=1, guard=_has_keys)
def lower_per_key_word(ctx, *operands, **params):
    return lower_per_word(ctx, *operands, wide=is_key_dtype, **params)
