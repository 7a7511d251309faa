"""Callbacks behind a branch, run in MAX until the branch is taken.

Libraries guard their callbacks: equinox's `error_if` calls back only in the
branch of a `cond` taken when a check fails, and diffrax and optimistix put
such checks in every step of their `while_loop`s. Staging those loops on the
host (`juju.host`) would pay a Python round trip per step for a branch that
is almost never taken.

`speculative(eqn)` evaluates a `cond`, `while` or `scan` equation (holding
callbacks, lifted by `juju.callback_lifting`) without them: each branch of
a `cond` that holds a callback outside a guard of its own is replaced by one
that returns zeros and sets a *fired* flag; loops carry that flag and a
`while` stops as soon as it is set (so that no loop runs on, on the zeros).
`juju.host` runs the result in MAX, reads the flag, and where it is set
replays the same equations from the same inputs with `jax.jit`, which runs
the callbacks as JAX does. Nothing else is skipped: an equation whose
callbacks are not all behind such a branch (or that has ordered effects)
is not speculated.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from juju import _compat
from juju._compat import is_key_dtype
from juju.callback_lifting import (eqn_has_callbacks, has_callbacks, interpret, is_callback,
                                   reemit)

__all__ = ["speculative"]


def speculative(eqn):
    """`f(*invals) -> [*outs, fired]` evaluating `eqn` with its guarded
    callback branches replaced by the fired flag, or None where one of its
    callbacks is not guarded (or the equation has ordered effects)."""
    if _compat.has_ordered_effects(eqn) or not _speculable_eqn(eqn):
        return None

    def run(*invals):
        outs, fired = _equation(eqn, list(invals), None)
        return [*outs, _flag(fired)]

    return run


# --- which equations can be speculated (statically) ------------------------


def _speculable(closed_or_open) -> bool:
    return _speculable_jaxpr(_compat.open_jaxpr(closed_or_open))


@functools.lru_cache(maxsize=4096)
def _speculable_jaxpr(jaxpr) -> bool:
    return all(not eqn_has_callbacks(e) or _speculable_eqn(e) for e in jaxpr.eqns)


def _speculable_eqn(eqn) -> bool:
    name, p = eqn.primitive.name, eqn.params
    if is_callback(eqn.primitive):
        return False
    if name == "cond":
        return any(map(_speculable, p["branches"])) and not any(
            is_key_dtype(v.aval.dtype) for v in eqn.outvars)  # no zeros of a key
    if name == "while":
        return not has_callbacks(p["cond_jaxpr"]) and _speculable(p["body_jaxpr"])
    if name == "scan":
        return _speculable(p["jaxpr"])
    return False  # lifted: no other primitive holds callbacks


# --- evaluation with the fired flag -----------------------------------------


def _evaluate(closed_or_open, args, fired):
    """(outputs, fired) of a jaxpr under the current trace."""
    state = [fired]

    def equation(eqn, invals):
        if eqn_has_callbacks(eqn):
            outs, state[0] = _equation(eqn, invals, state[0])
            return outs
        return guarded(eqn, invals, state[0])

    return interpret(closed_or_open, args, equation), state[0]


def _equation(eqn, invals, fired):
    name, p = eqn.primitive.name, eqn.params
    if name == "cond":
        index, *operands = invals
        branches = [functools.partial(_branch, b, fired) if _speculable(b)
                    else functools.partial(_fires, [v.aval for v in eqn.outvars])
                    for b in p["branches"]]
        outs, fired = lax.switch(index, branches, *operands)
        return list(outs), fired
    if name == "while":
        cond_consts, body_consts, carry = _compat.while_operands(p, invals)

        def cond(state):
            values, stop = state
            go = _evaluate(p["cond_jaxpr"], [*cond_consts, *values], stop)[0][0]
            return jnp.logical_and(go, jnp.logical_not(stop))

        def body(state):
            values, stop = state
            return tuple(_evaluate(p["body_jaxpr"], [*body_consts, *values], stop))

        carry, fired = lax.while_loop(cond, body, (list(carry), _flag(fired)))
        return list(carry), fired
    if name == "scan":
        consts, carry, xs = _compat.scan_operands(p, invals)
        num_carry = len(carry)

        def step(state, x):
            values, stop = state
            outs, stop = _evaluate(p["jaxpr"], [*consts, *values, *x], stop)
            return (outs[:num_carry], stop), outs[num_carry:]

        (carry, fired), ys = lax.scan(step, (list(carry), _flag(fired)), list(xs),
                                      length=p["length"],
                                      reverse=p["reverse"], unroll=p.get("unroll", 1))
        return [*carry, *ys], fired
    raise AssertionError(f"not speculable: {name}")  # _speculable_eqn said so


def guarded(eqn, invals, fired) -> list:
    """A callback-free equation evaluated after a branch may have fired: its
    while loops also stop once `fired` is set, since they may read the zeros
    of a fired branch and never end (`while c < 10: c += zero`)."""
    if fired is None or not _has_loop(eqn):
        return _compat.bind_equation(eqn, invals)
    outs = reemit(eqn, invals, lambda body, args: _evaluate(body, args, fired)[0], stop=fired)
    return _compat.bind_equation(eqn, invals) if outs is None else outs


def _has_loop(eqn) -> bool:
    return eqn.primitive.name == "while" or any(
        _has_loop_jaxpr(_compat.open_jaxpr(sub))
        for sub in _compat.sub_jaxprs_of_params(eqn.params))


@functools.lru_cache(maxsize=4096)
def _has_loop_jaxpr(jaxpr) -> bool:
    return any(map(_has_loop, jaxpr.eqns))


def _branch(closed_or_open, fired, *operands):
    outs, fired = _evaluate(closed_or_open, operands, fired)
    return list(outs), _flag(fired)


def _flag(fired):
    """The fired flag as a value (None: nothing could have fired yet)."""
    return jnp.bool_(False) if fired is None else fired


def _fires(avals, *operands):
    """A branch whose callback would run: zeros, and the flag set."""
    return [jnp.zeros(a.shape, a.dtype) for a in avals], jnp.bool_(True)


def replay(fun):
    """`fun` as jax runs it (callbacks included): the path a fired flag takes."""
    return jax.jit(fun)
