"""Control flow: cond (lax.cond, lax.switch), while, scan.

Lowered onto MAX's own control flow (`ops.cond`, `ops.while_loop`); loop
bodies and branches re-enter the interpreter with `ctx.lower`. Branches
cheaper than MAX's `cond` all run, and `where` picks the result. A loop's graph does
not grow with its trip count: a scan runs up to AUTO_UNROLL steps of a small
body per MAX loop iteration (or the program's `scan(..., unroll=k)`), short
scans with stacked outputs are straight-line code (UNROLL_BUDGET).

`scan` becomes a `while_loop` over (counter, *carry, *ys buffers): each step
reads its slice of every `xs` with `ops.slice_tensor` at the counter (a tensor
index) and writes its outputs into the preallocated `ys` buffers with
`ops.scatter_nd`. Consts and `xs` are captured by the loop body from the
enclosing graph rather than carried.
"""

from __future__ import annotations

import contextlib
import math
import threading

import numpy as np
from max.dtype import DType
from max.graph import DeviceRef, Graph, TensorType, ops

from juju import ALL_DTYPES, InvalidProgramError, RuleSet
from juju import primitives as P
from juju._compat import open_jaxpr, scan_layout, sub_jaxprs_of_params
from juju.primitives import empty2_p, platform_index_p
from juju.dtypes import physical_aval
from juju.lowering_helpers import platform_branch
from juju_ops_lax._util import reduce_axis
from juju_ops_lax import mixed

# Control flow carries values of any dtype in their in-graph form and
# re-enters the loop for its bodies.
rules = RuleSet(dtypes=ALL_DTYPES)


def _on_host(ctx, pred):
    """MAX's control-flow predicates must live on the CPU."""
    return pred if ctx.device.is_cpu() else ops.transfer_to(pred, DeviceRef.CPU())


_nesting = threading.local()


@contextlib.contextmanager
def _region_op():
    """Build a MAX control-flow op, nested ones with verification deferred.

    MAX verifies an `mo.if`/`mo.while` when it is created; one nested in a
    branch or body that is still being built (detached from the graph) fails
    dominance checks on values it captures from outside that block. The
    outermost op's verification covers all nested regions once attached.
    """
    depth = getattr(_nesting, "depth", 0)
    _nesting.depth = depth + 1
    try:
        if depth:
            with Graph.current._pause_verification():  # MAX-private, see above
                yield
        else:
            yield
    finally:
        _nesting.depth = depth


def _while_loop(init, predicate, body):
    """`ops.while_loop`, with carries of rank >= 2 carried flat.

    MAX 26.7's layout pass gives a carry that feeds a matmul a packed layout
    inside the body only, and the loop then fails to compile ("successor
    operand type ... should match ... layout<KN>"). Carrying it as a vector
    (reshapes are free) keeps the layout inside the body.
    """
    shapes = [[int(d) for d in v.shape] for v in init]

    def flat(values):
        return [ops.reshape(v, [math.prod(s)]) if len(s) >= 2 else v
                for v, s in zip(values, shapes)]

    def unflat(values):
        return [ops.reshape(v, s) if len(s) >= 2 else v for v, s in zip(values, shapes)]

    with _region_op():
        out = ops.while_loop(
            flat(init),
            lambda *carry: predicate(*unflat(carry)),
            lambda *carry: flat(body(*unflat(carry))),
        )
    return unflat(out)


def _tensor_types(ctx, avals):
    avals = map(physical_aval, avals)
    return [TensorType(ctx.max_dtype(a.dtype), list(a.shape), device=ctx.device) for a in avals]


# --- cond ----------------------------------------------------------------------


# A MAX `cond` costs ~150 us on the CPU whatever its branches hold (a switch
# of three one-op branches on 16 floats: 0.30 ms against jax.jit's 0.01 ms),
# so branches this cheap all run and `where` picks the result. juju's rules
# are total functions (integer division by zero included, as in XLA), so an
# untaken branch cannot trap; loops and effects never run untaken.
SELECT_BUDGET = 1 << 16  # element operations of all branches together
SELECT_EQUATIONS = 64
_INLINE_CALLS = {"pjit", "jit", "closed_call", "core_call", "custom_jvp_call",
                 "custom_vjp_call", "custom_vjp_call_jaxpr", "checkpoint", "remat", "cond"}


def _work(jaxpr) -> tuple[int, int] | None:
    """(equations, element operations) of a jaxpr; None if it holds a loop,
    an effect or a callback (those must run only when taken)."""
    equations = work = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if eqn.effects or "callback" in name:
            return None
        subs = sub_jaxprs_of_params(eqn.params)
        if subs and name not in _INLINE_CALLS:
            return None
        sizes = [math.prod(v.aval.shape) for v in (*eqn.invars, *eqn.outvars)
                 if hasattr(v.aval, "shape")]
        size = max(sizes, default=1)
        if name == "dot_general":
            (contracting, _), _ = eqn.params["dimension_numbers"]
            lhs_shape = eqn.invars[0].aval.shape
            size = math.prod(eqn.outvars[0].aval.shape) * math.prod(
                lhs_shape[d] for d in contracting)
        equations, work = equations + 1, work + size
        for sub in subs:
            inner = _work(sub)
            if inner is None:
                return None
            equations, work = equations + inner[0], work + inner[1]
    return equations, work


def _selectable(branches) -> bool:
    """Whether running every branch costs less than MAX's `cond`."""
    equations = work = 0
    for branch in branches:
        cost = _work(open_jaxpr(branch))
        if cost is None:
            return False
        equations, work = equations + cost[0], work + cost[1]
    return equations <= SELECT_EQUATIONS and work <= SELECT_BUDGET


@rules.register(P.cond_p)
def lower_cond(ctx, index, *operands, branches, branches_platforms=None):
    if branches_platforms is not None:
        # lax.platform_dependent: the branch is chosen by the device, statically
        # (as XLA keeps only this platform's branch); the others may hold
        # primitives of other platforms.
        return ctx.lower(branches[_platform_branch(ctx, branches_platforms)], *operands)
    # XLA runs the last branch for an out-of-range index; so does this chain of
    # `index == k ? branch k : ...` with the last branch as the default.
    index_dtype = ctx.avals_in[0].dtype
    if _selectable(branches):
        outs = [ctx.lower(b, *operands) for b in branches]
        chosen = outs[-1]
        for k in reversed(range(len(branches) - 1)):
            taken = mixed.equal(index, ctx.constant(k, index_dtype))
            chosen = [mixed.where(taken, a, b) for a, b in zip(outs[k], chosen)]
        return chosen
    out_types = _tensor_types(ctx, ctx.avals_out)

    def branch(k):
        return lambda: ctx.lower(branches[k], *operands)

    def chain(k):
        if k == len(branches) - 1:
            return branch(k)()
        pred = _on_host(ctx, mixed.equal(index, ctx.constant(k, index_dtype)))
        with _region_op():
            return ops.cond(pred, out_types, branch(k), lambda: chain(k + 1))

    return chain(0)


# --- while ---------------------------------------------------------------------


@rules.register(P.while_p)
def lower_while(ctx, *args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    cond_consts = args[:cond_nconsts]
    body_consts = args[cond_nconsts : cond_nconsts + body_nconsts]
    init = args[cond_nconsts + body_nconsts :]
    if not init:
        raise NotImplementedError("while: a loop without carried values")
    # vmap of a while with a batched predicate leaves a predicate with batch
    # dims: as in XLA's lowering, loop while any element holds, and let only
    # the elements whose predicate holds advance (batch dims lead each carry).
    pred_shape = tuple(cond_jaxpr.out_avals[0].shape)

    def predicate(*carry):
        (pred,) = ctx.lower(cond_jaxpr, *cond_consts, *carry)
        if pred_shape:
            pred = ops.reshape(pred, [-1])
            as_int = ops.cast(pred, DType.int32)
            pred = ops.reshape(mixed.greater(reduce_axis(ops.max, as_int, 0), 0), [])
        return _on_host(ctx, pred)

    def body(*carry):
        new = ctx.lower(body_jaxpr, *body_consts, *carry)
        if not pred_shape:
            return new
        (pred,) = ctx.lower(cond_jaxpr, *cond_consts, *carry)
        out = []
        for old, value, aval in zip(carry, new, ctx.avals_out):
            shape = list(physical_aval(aval).shape)
            mask = ops.reshape(pred, list(pred_shape) + [1] * (len(shape) - len(pred_shape)))
            out.append(mixed.where(ops.broadcast_to(mask, shape), value, old))
        return out

    return _while_loop(list(init), predicate, body)


# --- scan ----------------------------------------------------------------------


def _counter(value):
    return ops.constant(value, DType.int64, device=DeviceRef.CPU())


def _slice_row(x, i):
    """x[i] for a scalar (int or int64 tensor) index i."""
    return ops.slice_tensor(x, [i] + [slice(None)] * (x.rank - 1))


# A scan with stacked outputs (ys) of length x body size up to this many
# equations becomes straight-line code. In a MAX loop each step's ys row is
# written by a scatter that copies the whole stacked buffer: a 64-step RNN
# (benchmarks/run.py "scan RNN") ran 12.7 ms looped, 4.75 ms unrolled, jax.jit
# 6-12 ms; the price is a longer compile of a larger graph.
UNROLL_BUDGET = 512


# A longer scan of a small body runs several steps per MAX loop iteration:
# an iteration of MAX's while_loop costs ~35 us here whatever its body, and
# the stacked ys are copied once per iteration, not once per step (an RNN
# cell of hidden size 32 over 2048 steps: 90 -> 20 us per step with 8).
AUTO_UNROLL = 8
AUTO_UNROLL_EQUATIONS = 64  # the most body equations one loop iteration holds


def _auto_unroll(length: int, body_equations: int) -> int:
    """Steps per loop iteration for a scan that asked for none: a power of two
    up to AUTO_UNROLL within AUTO_UNROLL_EQUATIONS, a divisor of `length`
    where one exists (no remainder steps after the loop)."""
    most = AUTO_UNROLL
    while most > 1 and most * body_equations > AUTO_UNROLL_EQUATIONS:
        most //= 2
    most = min(most, length)
    for k in (most >> shift for shift in range(most.bit_length())):
        if k > 1 and length % k == 0:
            return k
    return most


def _equation_count(jaxpr) -> int:
    return sum(1 + sum(map(_equation_count, sub_jaxprs_of_params(e.params)))
               for e in jaxpr.eqns)


@rules.register(P.scan_p)
def lower_scan(ctx, *args, reverse, length, jaxpr, unroll, _split_transpose=False, **layout):
    if _split_transpose:
        raise NotImplementedError(f"scan: _split_transpose={_split_transpose}")
    num_consts, num_carry = scan_layout(**layout)  # the params differ between jax releases
    consts = list(args[:num_consts])
    init = list(args[num_consts : num_consts + num_carry])
    xs = list(args[num_consts + num_carry :])
    y_avals = [physical_aval(a) for a in ctx.avals_out[num_carry:]]
    unroll = length if unroll is True else max(int(unroll), 1)
    if unroll == 1:  # JAX's `unroll` is a performance hint; see UNROLL_BUDGET, AUTO_UNROLL
        body_equations = _equation_count(open_jaxpr(jaxpr))
        if y_avals and length * body_equations <= UNROLL_BUDGET:
            unroll = length
        else:
            unroll = _auto_unroll(length, body_equations)

    def step(carry, i):
        """One application of the body at step i (int or counter tensor)."""
        if isinstance(i, int):
            index = length - 1 - i if reverse else i
        else:
            index = _counter(length - 1) - i if reverse else i
        x_slices = [_slice_row(x, index) for x in xs]
        outs = ctx.lower(jaxpr, *consts, *carry, *x_slices)
        return outs[:num_carry], outs[num_carry:], index

    if length <= 1 or unroll >= length:
        # Trivial trip count, or full unrolling asked for: straight-line code.
        carry, ys = init, [[None] * length for _ in y_avals]
        for i in range(length):
            carry, y, index = step(carry, i)
            for buf, value in zip(ys, y):
                buf[index] = value
        stacked = [
            ops.stack(buf, axis=0) if length else ctx.constant(np.zeros(a.shape), a.dtype)
            for buf, a in zip(ys, y_avals)
        ]
        return [*carry, *stacked]

    # ys are loop-carried tensors updated with scatter_nd. Each update copies
    # the whole buffer (quadratic in length for large ys: 1000 steps of
    # 1000-float rows, 1.2 s). In-place stores into an `ops.buffer_create`
    # buffer are ~20x faster but gave wrong results when a second scan reads
    # the ys (grad of scan) in MAX 26.7; see docs/control-flow-and-transforms.md.
    buffers = [ops.broadcast_to(ctx.constant(0, a.dtype), list(a.shape)) for a in y_avals]
    trips = length // unroll * unroll  # steps done in the loop, `unroll` per iteration

    def body(i, *state):
        carry, rows, at = list(state[:num_carry]), [[] for _ in y_avals], []
        for u in range(unroll):
            carry, y, index = step(carry, i + _counter(u) if u else i)
            at.append(ops.reshape(index, [1, 1]))
            for row, value in zip(rows, y):
                row.append(ops.unsqueeze(value, 0))
        # One scatter per iteration for the `unroll` rows: each scatter copies
        # the whole buffer.
        at = ops.concat(at, axis=0) if unroll > 1 else at[0]
        if not ctx.device.is_cpu():
            at = ops.transfer_to(at, ctx.device)
        bufs = [ops.scatter_nd(b, ops.concat(row, axis=0) if unroll > 1 else row[0], at)
                for b, row in zip(state[num_carry:], rows)]
        return [i + _counter(unroll), *carry, *bufs]

    state = _while_loop(
        [_counter(0), *init, *buffers], lambda i, *_: i < _counter(trips), body
    )
    carry, bufs = list(state[1 : 1 + num_carry]), list(state[1 + num_carry :])
    for i in range(trips, length):  # the remainder when unroll does not divide length
        carry, y, index = step(carry, i)
        at = ctx.constant(np.array([[index]]), np.int64)
        bufs = [ops.scatter_nd(b, ops.unsqueeze(v, 0), at) for b, v in zip(bufs, y)]
    return [*carry, *bufs]


# --- what JAX's differentiation of control flow emits --------------------------


@rules.register(empty2_p)
def lower_empty2(ctx, *, dtype, memory_space):
    # A placeholder residual for branches of a differentiated cond that do
    # not produce it; its value is never read.
    return ctx.constant(0, ctx.aval_out.dtype)


@rules.register(P.custom_lin_p)
def lower_custom_lin(ctx, *args, **params):
    # What jvp/linearize of a custom_vjp function leaves when nothing
    # transposes it: jax.jit's lowering raises jax's TypeError, and so does juju.
    try:
        P.custom_lin_p.impl(*args, **params)
    except TypeError as exc:
        raise InvalidProgramError(str(exc)) from exc
    raise InvalidProgramError("can't apply forward-mode autodiff (jvp) to a custom_vjp function.")


# --- platform_dependent ------------------------------------------------------------


def _platform_branch(ctx, platforms) -> int:
    return platform_branch(platforms, ctx.device.is_cpu())


@rules.register(platform_index_p)
def lower_platform_index(ctx, *, platforms):
    return ctx.constant(_platform_branch(ctx, platforms), np.int32)
