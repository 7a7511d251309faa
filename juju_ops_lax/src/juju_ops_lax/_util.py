"""Small helpers shared by the lax rules."""

from __future__ import annotations

import functools
import math
import operator

import numpy as np
from max.dtype import DType
from max.graph import TensorValue, ops

from juju.dtypes import is_float  # noqa: F401  (re-exported for the rule modules)
from juju.dtypes import max_shape, numpy_dtype, physical_aval, static_shape
from juju_ops_lax import mixed


def broadcast_to(x, shape):
    """`ops.broadcast_to` unless x already has `shape`: an identity broadcast
    would make reduce_axis take x for a broadcast and its slow form."""
    target = static_shape(shape)
    if target is not None and static_shape(x.shape) == target:
        return x
    return ops.broadcast_to(x, max_shape(shape))


def full_like(ctx, value, like, dtype=None):
    """A constant `value` broadcast to the shape of `like`."""
    dtype = dtype if dtype is not None else ctx.avals_in[0].dtype
    return ops.broadcast_to(ctx.constant(value, dtype), like.shape)


def scalar(ctx, value, dtype):
    return ctx.constant(np.asarray(value, dtype=dtype), dtype)


def is_negative_zero(ctx, x, dtype, is_zero=None):
    """Where float x (of jax dtype `dtype`) is -0.0. MAX has no signbit, but
    1/x is -inf there; x is swapped for 1 elsewhere, so no other element
    (NaN included) reads as one. Pass `is_zero` (x == 0) if already built."""
    zero = scalar(ctx, 0, dtype)
    one = scalar(ctx, 1, dtype)
    if is_zero is None:
        is_zero = mixed.equal(x, zero)
    return mixed.greater(zero, ops.div(one, mixed.where(is_zero, x, one)))


def sign_bit(ctx, x, dtype):
    """Where float x (of jax dtype `dtype`) is negative, -0.0 included; NaN:
    false."""
    zero = scalar(ctx, 0, dtype)
    return ops.logical_or(is_negative_zero(ctx, x, dtype), mixed.greater(zero, x))


def is_signed_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.signedinteger)


def is_unsigned_int(dtype) -> bool:
    return np.issubdtype(np.dtype(dtype), np.unsignedinteger)


def is_bool(dtype) -> bool:
    return np.dtype(dtype) == np.bool_


def reject(ctx, **params):
    """Raise for params whose value this rule does not implement."""
    for name, value in params.items():
        raise NotImplementedError(
            f"{ctx.primitive.name}: parameter {name}={value!r} is not supported"
        )


def reduce_axis(op, x, axis: int, shape=None):
    """`op(x, axis=axis)` (a MAX reduction keeping the axis as size 1), in a
    form MAX 26.7 computes correctly, as fast as it allows.

    MAX's graph compiler rewrites a reduction of a broadcast tensor wrongly
    when the broadcast axis precedes the reduced one: `broadcast_to` from
    [3, 1, 3] to [3, 3, 3] then `sum(axis=2)` gives wrong values, and
    non-square shapes fail to compile; elementwise ops over broadcasts only
    (`exp(broadcast(z))`) do the same. Reducing the middle axis of the
    [pre, K, post] reshape never hits that rewrite, but a middle-axis
    reduction is 2-5x slower than a last-axis one, so that form is kept for
    operands that may be broadcasts (`_maybe_broadcast`). Others reduce along
    the last axis directly; on CPU a float32 sum over another axis is a
    matmul with a row of ones (2x faster than MAX's strided reduction).
    """
    dims = shape if shape is not None else x.shape
    shape = static_shape(dims)
    if shape is None:  # symbolic dimensions: the safe form, in MAX's dim arithmetic
        dims = max_shape(dims)
        axis %= len(dims)
        pre = functools.reduce(operator.mul, dims[:axis], 1)
        post = functools.reduce(operator.mul, dims[axis + 1:], 1)
        reduced = op(ops.reshape(x, [pre, dims[axis], post]), axis=1)
        return ops.reshape(reduced, dims[:axis] + [1] + dims[axis + 1:])
    axis = axis % len(shape) if shape else 0
    pre, size, post = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    kept = shape[:axis] + [1] + shape[axis + 1:]
    if size == 1 and op in _ASSOCIATIVE:  # one element per row: the value itself
        return ops.reshape(x, kept)
    reduced = None if _maybe_broadcast(x) else _fast_reduce(op, x, pre, size, post, shape)
    if reduced is None:
        reduced = op(ops.reshape(x, [pre, size, post]), axis=1)
    return ops.reshape(reduced, kept)


def sum_to_shape(x, shape):
    """A float sum `x` reshaped to `shape`, which may be rank 0, without
    tripping MAX 26.7's fusion bug.

    MAX fails to compile ("could not parse its Mojo generated code") a
    reduction whose result is reshaped to rank 0 and fused into an epilogue
    with several consumers, as optax's clip_by_global_norm and diffrax's
    error norms do: sqrt(sum(a^2) + sum(b^2)) compared with 1 and dividing
    every leaf (tests/test_reduction_shapes.py). A cumsum of the one element
    is an op MAX does not fuse through; it computes 0 + the sum, which is
    what XLA's sum computes too (+0.0 for a sum of -0.0s). (A top_k of one
    element, exact for max and min, made MAX fail on max and min of one
    operand side by side.)"""
    if list(shape) or not DType.is_float(x.dtype):
        return ops.reshape(x, max_shape(shape))
    return _cumsum_of_one(x)


def _cumsum_of_one(x):
    """The one element of `x` as rank 0, through a cumsum (0 + x)."""
    return ops.reshape(ops.cumsum(ops.reshape(x, [1]), axis=0), [])


def scalar_copy(x):
    """The one element of `x` as a rank-0 value that MAX does not fuse its
    producer through, every bit kept.

    `sum_to_shape`'s fusion bug also stops max, min and prod reductions to
    rank 0 with several consumers (sqrt(max(|x|)) compared and divided, as
    optimistix's norms do); MAX folds a gather of the element away. So the
    copy is a cumsum too, exact for integers; for floats it adds 0, which
    turns -0.0 into +0.0, so 1/x (+-inf for +-0) travels beside it and
    gives a zero its sign back."""
    if not DType.is_float(x.dtype):
        return _cumsum_of_one(x)
    one = ops.reshape(x, [1])
    reciprocal = ops.div(ops.constant(1.0, x.dtype, device=x.device), one)
    pair = ops.cumsum(ops.reshape(ops.concat([one, reciprocal], axis=0), [2, 1]), axis=1)
    value = ops.reshape(ops.slice_tensor(pair, [slice(0, 1), slice(None)]), [])
    sign = ops.reshape(ops.slice_tensor(pair, [slice(1, 2), slice(None)]), [])
    zero = ops.constant(0.0, x.dtype, device=x.device)
    negative_zero = ops.logical_and(mixed.equal(value, zero), mixed.greater(zero, sign))
    return mixed.where(negative_zero, ops.constant(-0.0, x.dtype, device=x.device), value)


def reshape_result(x, shape):
    """`ops.reshape(x, shape)`, through a barrier when `x` is a matmul's result
    and the shape changes.

    MAX 26.7 fuses an elementwise consumer into a matmul's epilogue through
    a shape-changing reshape and, when that consumer also reads a transposed
    tensor, reads it at the wrong positions: `reshape(a @ b, [4, 3, 5, 5]) *
    transpose(x)` gave garbage (1e28) in a hand-built graph of five ops, and
    the gradients of an NCHW CNN (eqx_conv) were wrong
    (tests/test_max_workarounds.py). A cumsum over a unit axis, a copy that
    MAX does not fuse through (as in `sum_to_shape`), keeps the values right.
    A product reshaped to rank 0 gets the copy too: MAX fails to compile
    ("could not parse its Mojo generated code") such a result fused into an
    epilogue with several consumers, as `sum_to_shape` describes for sums;
    optimistix's two-norm `sqrt(dot(x, x))` in diffrax's step-size control
    hit it.
    """
    target = max_shape(shape)
    if static_shape(x.shape) == static_shape(shape) is not None:
        return x  # nothing to reshape
    if _made_by_matmul(x) and (not target or _regroups(x.shape, target)):
        x = unfused_copy(x)
    return ops.reshape(x, target)


def unfused_copy(x):
    """A copy of `x` that MAX does not fuse its producer through: a cumsum
    over a unit axis (MAX writes `x` to memory once, its consumers read it)."""
    shape = list(x.shape)
    return ops.reshape(ops.cumsum(ops.reshape(x, [*shape, 1]), axis=-1), shape)


def exact_unfused_copy(ctx, x, dtype):
    """`unfused_copy` that keeps every value of jax dtype `dtype` as it is:
    bools travel as int32, and for floats the -0.0s (which the cumsum makes
    +0.0) travel beside them as an int32 flag, itself copied unfused, so no
    path from `x` to a consumer is fused."""
    if is_bool(dtype):
        return ops.cast(unfused_copy(ops.cast(x, ctx.max_dtype(np.int32))), x.dtype)
    if not is_float(dtype):
        return unfused_copy(x)
    negative_zero = unfused_copy(ops.cast(is_negative_zero(ctx, x, dtype), ctx.max_dtype(np.int32)))
    return mixed.where(ops.cast(negative_zero, ctx.max_dtype(np.bool_)),
                       scalar(ctx, -0.0, dtype), unfused_copy(x))


def _regroups(old, new) -> bool:
    """Whether a reshape from `old` to `new` (MAX dims, maybe symbolic)
    splits or merges dimensions, not only adds or drops unit ones."""
    def kept(dims):
        return [str(d) for d in dims if str(d) != "1"]

    return kept(old) != kept(new)


def _producer_op(x, through=("ReshapeOp",)):
    """The op that makes `x`, looking up through `through` ops (a Block for
    a graph input; None when the chain is long)."""
    value = x._mlir_value
    for _ in range(8):
        op = getattr(value, "owner", None)
        if type(op).__name__ not in through:
            return op
        value = op.operands[0]
        value = getattr(value, "value", value)
    return None


def _producer(x, through=("ReshapeOp",)) -> str:
    """The class name of the op that makes `x`, looking up through `through`
    ops ("NoneType" when the chain is long)."""
    return type(_producer_op(x, through)).__name__


def _made_by_matmul(x) -> bool:
    """Whether `x` is a matmul's result, possibly reshaped."""
    return _producer(x) == "MatmulOp"


def is_constant(x) -> bool:
    """Whether `x` is a constant, possibly reshaped or broadcast: MAX's
    compiler folds arithmetic on it as if no operand were NaN or inf."""
    return _producer(x, ("ReshapeOp", "BroadcastToOp")) == "ConstantOp"


def _constant_array(x, max_bytes: int):
    """The value of `x` as a numpy array of its dtype if it is a constant,
    possibly reshaped, broadcast or cast, of at most `max_bytes`; else None."""
    op = _producer_op(x, ("ReshapeOp", "BroadcastToOp", "CastOp"))
    if type(op).__name__ != "ConstantOp":
        return None
    data = op.value.data.data  # the constant's bytes
    if len(data) > max_bytes:
        return None
    dtype = numpy_dtype(TensorValue(op.results[0]).dtype)
    with np.errstate(all="ignore"):
        return np.asarray(data, np.uint8).view(dtype).astype(numpy_dtype(x.dtype))


def constant_scalar(x):
    """The value of `x` (a numpy scalar) if it is a one-element constant,
    possibly reshaped, broadcast or cast; else None."""
    array = _constant_array(x, 8)
    return array[0] if array is not None and array.size == 1 else None


def is_zero_constant(x) -> bool:
    """Whether float `x` is a constant of zeros (either sign) only, possibly
    reshaped, broadcast or cast. False for constants of over 4 KiB: MAX
    keeps those as data and does not fold them."""
    array = _constant_array(x, 4096)
    return array is not None and array.size > 0 and not array.any()


def same_value(x, y) -> bool:
    """Whether `x` and `y` are one MAX value (MAX folds x - x to 0)."""
    return x._mlir_value == y._mlir_value


def _fast_reduce(op, x, pre, size, post, shape):
    """A faster form of the reduction of (pre, size, post)'s middle axis for an
    operand that is not a broadcast, or None when there is none."""
    chunk = _split(size) if post == 1 and pre < _FEW_ROWS and op in _ASSOCIATIVE else 0
    if chunk:
        # A few long rows: MAX reduces a row on one thread. Reduce chunks of
        # each row first (many rows, in parallel), then the partial results.
        partial = op(ops.reshape(x, [pre * (size // chunk), chunk]), axis=1)
        return op(ops.reshape(partial, [pre, size // chunk]), axis=1)
    # A rank-1 operand goes through the [1, size] reshape below. Reducing it
    # along its own axis instead avoids MAX 26.7's compile error in optax's
    # clip_by_global_norm (tests/test_reduction_shapes.py, xfail) but makes
    # MAX's compiler segfault on QR's loop body (a norm inside a fori_loop);
    # a [size, 1] reshape fails like [1, size]. A compile error is the lesser.
    if post == 1:  # x is [pre, size] already only when the reduced axis is its last one
        return op(x if list(shape) == [pre, size] else ops.reshape(x, [pre, size]), axis=1)
    if op is ops.sum and x.dtype == DType.float32 and x.device.is_cpu():
        # Not on GPU: its fp32 matmul rounds operands to TF32. With pre == 1
        # (a bias gradient) a rank-2 matmul: a graph whose matmuls are all
        # rank 2 does not compile MAX's batched matmul too (~30 s cold).
        one = ops.constant(1.0, DType.float32, device=x.device)
        if pre == 1:
            return ops.matmul(ops.broadcast_to(one, [1, size]), ops.reshape(x, [size, post]))
        return ops.matmul(ops.broadcast_to(one, [1, 1, size]), ops.reshape(x, [pre, size, post]))
    return None


_FEW_ROWS = 16
_ASSOCIATIVE = (ops.sum, ops.max, ops.min, ops.prod)


def _split(size: int) -> int:
    """A chunk length for two-stage reduction of a row of `size`: a power of
    two in [1024, 16384] dividing it, leaving at least 64 chunks to spread over
    threads; 0 when the row is short or has no such divisor."""
    if size < 1 << 16:
        return 0
    chunk = min(1 << ((size // 64).bit_length() - 1), 1 << 14)  # <= size / 64, <= 16384
    while chunk >= 1024:
        if size % chunk == 0:
            return chunk
        chunk //= 2
    return 0


# Producers whose result is computed data, never a broadcast in disguise.
_OPAQUE_OPS = ("MatmulOp", "MoGatherOp", "MoCumsumOp", "Operation")


def _maybe_broadcast(x, budget: int = 64) -> bool:
    """Whether `x` may be a broadcast as MAX's compiler sees it: every path
    up its producers through elementwise and shape ops ends at a broadcast,
    tile or constant (not at a graph input or a computed tensor). True when
    unsure (the slow form is always correct)."""
    pending = [x._mlir_value]
    while pending:
        budget -= 1
        if budget < 0:
            return True
        owner = getattr(pending.pop(), "owner", None)
        if owner is None:
            return True
        kind = type(owner).__name__
        if kind == "Block" or kind in _OPAQUE_OPS or "Reduce" in kind or "Conv" in kind:
            return False  # one operand is real data: the elementwise result is too
        if kind in ("BroadcastToOp", "MoTileOp", "ConstantOp"):
            continue
        try:  # OpOperands for most ops, plain Values for some (custom kernels)
            operands = [getattr(operand, "value", operand) for operand in owner.operands]
        except Exception:
            return True  # an op we cannot inspect: assume the worst
        pending.extend(operands)
    return True


def lower_per_word(ctx, *operands, wide, **params):
    """Apply a structural primitive to each word of the operands whose dtype
    is `wide` (key arrays, complex numbers: carried as [..., words] arrays of
    a plain dtype, see `juju.dtypes.physical_aval`), then restack."""
    import jax

    widened = [wide(a.dtype) for a in ctx.avals_in]
    wide_aval = next(a for a in (*ctx.avals_in, *ctx.avals_out) if wide(a.dtype))
    physical = physical_aval(wide_aval)
    (words,) = physical.shape[wide_aval.ndim:]
    structs = [
        jax.ShapeDtypeStruct(a.shape, physical.dtype if w else a.dtype)
        for a, w in zip(ctx.avals_in, widened)
    ]
    primitive = ctx.primitive
    closed = jax.make_jaxpr(lambda *xs: primitive.bind(*xs, **params))(*structs)
    per_word = []
    for k in range(words):
        args = [x[..., k] if w else x for x, w in zip(operands, widened)]
        per_word.append(ctx.lower(closed, *args))
    outs = [ops.stack([word[i] for word in per_word], axis=-1) for i in range(len(per_word[0]))]
    return outs if primitive.multiple_results else outs[0]
