"""Callbacks lifted out of calls: after `lift`, every host callback of a
program sits at its top level or inside `cond`, `while` and `scan` bodies,
the only places `juju.host` stages (and `juju.speculation` guards).

Libraries nest callbacks in every higher-order primitive JAX has: equinox's
runtime checks (`eqx.error_if`) sit in `custom_jvp`/`custom_vjp` calls, in
`custom_linear_solve`, in `checkpoint`, in nested `jit`s, and inside its own
primitives (lineax's `linear_solve`), which only their JAX implementation
opens. `lift` re-traces the program, evaluating each call that holds a
callback as its body (a forward evaluation: differentiation and batching
are done by then, so a `custom_jvp`'s rule has nothing left to do) and each
opaque primitive that holds one in its implementation as that
implementation. Equations without callbacks are re-bound as they are.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from juju import _compat, plugins
from juju.errors import JujuError

__all__ = ["has_callbacks", "lift", "HostCallbackError"]

# The params that hold a call's body, by how JAX's call-like primitives name it
# (jit, closed_call, core_call, custom_jvp_call, custom_vjp_call, checkpoint).
_CALL_BODY_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_STAGED = ("cond", "while", "scan")  # what juju.host drives with callbacks inside
_MAX_ROUNDS = 8  # an implementation may hold calls of its own: lift again


class HostCallbackError(JujuError, NotImplementedError):
    """A host callback where juju cannot stage it."""


def is_callback(primitive) -> bool:
    return primitive in _compat.host_callback_impls


def has_callbacks(jaxpr) -> bool:
    """Whether `jaxpr` (open or closed) calls back into Python at any depth,
    inside primitives that only their JAX implementation opens included."""
    return _has_callbacks(_compat.open_jaxpr(jaxpr))


@functools.lru_cache(maxsize=4096)
def _has_callbacks(jaxpr) -> bool:
    return any(eqn_has_callbacks(e) for e in jaxpr.eqns)


def eqn_has_callbacks(eqn) -> bool:
    if is_callback(eqn.primitive):
        return True
    if any(map(has_callbacks, _compat.sub_jaxprs_of_params(eqn.params))):
        return True
    # A library primitive may hold jaxprs of its own (lineax's linear_solve
    # holds its operator's) and still call back only in its implementation.
    body = _opaque_implementation(eqn)
    return body is not None and has_callbacks(body)


def _opaque_implementation(eqn):
    """The closed jaxpr of the JAX implementation of a primitive that no pack
    lowers (the core's fallback lowers it as that implementation), or None."""
    if plugins.registry().rules_for(eqn.primitive):
        return None
    from juju import fallback  # the fallback rule's own trace (and its cache)

    return fallback.implementation(eqn.primitive, [v.aval for v in eqn.invars], eqn.params)


def lift(closed):
    """`closed` (a ClosedJaxpr) with its callbacks at the top level or in
    cond/while/scan bodies only; `closed` itself when they already are."""
    for _ in range(_MAX_ROUNDS):
        misplaced = _misplaced(closed.jaxpr)
        if misplaced is None:
            return closed
        closed = _retrace(closed)
    raise HostCallbackError(
        f"a host callback inside `{misplaced.primitive.name}` is not supported by juju "
        f"({_compat.source_line(misplaced)}): its body could not be evaluated as a call. "
        "Move the callback out of it, or use jax.jit for this function.")


def _misplaced(jaxpr):
    """The first equation (at any depth) that holds a callback in a body juju
    does not stage, or None."""
    for eqn in jaxpr.eqns:
        if is_callback(eqn.primitive) or not eqn_has_callbacks(eqn):
            continue
        if eqn.primitive.name not in _STAGED:
            return eqn
        for sub in _compat.sub_jaxprs_of_params(eqn.params):
            found = _misplaced(sub)
            if found is not None:
                return found
    return None


def _retrace(closed):
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type)
             for a in closed.in_avals]
    return jax.make_jaxpr(lambda *args: evaluate(closed, args))(*avals)


def evaluate(closed_or_open, args) -> list:
    """Evaluate a jaxpr under the current trace, lifting its callbacks."""

    def equation(eqn, invals):
        if is_callback(eqn.primitive) or not eqn_has_callbacks(eqn):
            return _compat.bind_equation(eqn, invals)
        return _lifted(eqn, invals)

    return interpret(closed_or_open, args, equation)


def interpret(closed_or_open, args, equation) -> list:
    """The outputs of a jaxpr (open or closed) on `args`, each equation's
    outputs given by `equation(eqn, invals)`."""
    jaxpr = _compat.open_jaxpr(closed_or_open)
    env = dict(zip(jaxpr.constvars, getattr(closed_or_open, "consts", ())))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, _compat.Literal) else env[v]
    for eqn in jaxpr.eqns:
        env.update(zip(eqn.outvars, equation(eqn, [read(v) for v in eqn.invars])))
    return [read(v) for v in jaxpr.outvars]


def _lifted(eqn, invals) -> list:
    outs = reemit(eqn, invals, evaluate)
    if outs is not None:
        return outs
    implementation = _implementation(eqn)
    if implementation is None:
        body = _call_like_body(eqn)
        if body is not None:
            return evaluate(body, invals)
        raise HostCallbackError(
            f"a host callback inside `{eqn.primitive.name}` is not supported by juju "
            f"({_compat.source_line(eqn)}); juju runs callbacks inside every call, "
            "loop and branch whose JAX implementation it can evaluate. "
            "Move the callback out of it, or use jax.jit for this function.")
    outs = implementation(*invals, **eqn.params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


def reemit(eqn, invals, evaluate_body, stop=None) -> list | None:
    """The outputs of a cond, while, scan or call equation, re-emitted through
    lax with each body given by `evaluate_body(closed_or_open, args) -> outs`
    (a while also ends once `stop` is set); None for any other primitive."""
    name, p = eqn.primitive.name, eqn.params
    if name == "cond":
        index, *operands = invals
        branches = [functools.partial(_apply, evaluate_body, b) for b in p["branches"]]
        return list(lax.switch(index, branches, *operands))
    if name == "while":
        cond_consts, body_consts, carry = _compat.while_operands(p, invals)

        def cond(values):
            go = evaluate_body(p["cond_jaxpr"], [*cond_consts, *values])[0]
            return go if stop is None else jnp.logical_and(go, jnp.logical_not(stop))

        return list(lax.while_loop(
            cond, lambda values: evaluate_body(p["body_jaxpr"], [*body_consts, *values]),
            list(carry)))
    if name == "scan":
        consts, carry, xs = _compat.scan_operands(p, invals)
        num_carry = len(carry)

        def step(values, x):
            outs = evaluate_body(p["jaxpr"], [*consts, *values, *x])
            return outs[:num_carry], outs[num_carry:]

        carry, ys = lax.scan(step, list(carry), list(xs), length=p["length"],
                             reverse=p["reverse"], unroll=p.get("unroll", 1))
        return [*carry, *ys]
    for param in _CALL_BODY_PARAMS:
        body = p.get(param)
        if body is not None and len(_compat.open_jaxpr(body).invars) == len(invals):
            return evaluate_body(body, invals)
    return None


def _call_like_body(eqn):
    """The one sub-jaxpr of `eqn` that takes its operands and gives its
    results (same shapes and dtypes): a call by another name, or None."""
    in_avals = [v.aval for v in eqn.invars]
    out_avals = [v.aval for v in eqn.outvars]
    bodies = [sub for sub in _compat.sub_jaxprs_of_params(eqn.params)
              if not sub.constvars and [v.aval for v in sub.invars] == in_avals
              and [v.aval for v in sub.outvars] == out_avals]
    return bodies[0] if len(bodies) == 1 else None


def _apply(evaluate_body, closed_or_open, *operands):
    return evaluate_body(closed_or_open, operands)


def _implementation(eqn):
    """What XLA's lowering of `eqn` traces (custom_linear_solve, linear_call,
    a library's own primitive), or None."""
    found = _compat.jax_implementation(eqn.primitive, "cpu")
    return None if found is None else found[0]
