"""Materialize an expensive elementwise value that several fused kernels read.

MAX fuses an elementwise producer into each consumer kernel (a reduction
reads its input through the fused lambda), so a value computed by costly
elementwise ops and read by several reductions is computed once per
reduction. `jax.random.normal` followed by its mean, std and max computed
erf_inv four times: 12.4 ms against 8.0 ms with the normals written once
(jax.jit 7.2 ms; XLA writes them once). This pass (after fused.py's, so
softmax and norms are already single equations) puts an `nn_materialize`
copy after such a value: the branching point of at least two paths that end
in different non-elementwise consumers or outputs, whose elementwise cone
holds a transcendental op of 2^14 elements or more, itself that large, so
that one extra pass over memory costs less than recomputing it. (A
transcendental of a small array broadcast into a large one does not count:
the mixture log-probabilities of the bench, exp and log_softmax of
[256, 8] broadcast into [256, 4096, 8], ran 70 ms with the copy, 47 ms
without.)
"""

from __future__ import annotations

import math

import juju
from juju import RuleSet
from juju import primitives as P
from juju._compat import ClosedJaxpr, Var, call_primitives, sub_jaxprs_of_params
from juju_ops_lax._util import unfused_copy

rules = RuleSet()

MIN_SIZE = 2**14

#: Transcendental elementwise primitives: what makes a recomputation costly.
COSTLY = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "erf", "erfc", "erf_inv",
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh", "acosh",
    "atanh", "pow", "lgamma", "digamma", "cbrt",
})
#: Primitives MAX fuses into their consumers (shape changes MAX fuses through included).
FUSED = COSTLY | frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "max", "min", "sqrt", "rsqrt", "square",
    "integer_pow", "convert_element_type", "select_n", "sign", "floor", "ceil", "round",
    "eq", "ne", "lt", "le", "gt", "ge", "is_finite", "clamp", "rem", "stop_gradient",
    "broadcast_in_dim", "reshape", "squeeze", "expand_dims",
})


def lower_nn_materialize(ctx, x):
    return unfused_copy(x)


materialize = juju.Primitive(
    "nn_materialize", lower_nn_materialize, lambda x: x, batching_rule="elementwise",
    jvp_rule=lambda primals, tangents: (primals[0], tangents[0]),
    jax_implementation=lambda x: x, priority=juju.Priority.GENERIC, rules=rules)


def _size(v) -> int:
    """Elements of a variable (0 for a symbolic shape: never chosen)."""
    size = math.prod(getattr(v.aval, "shape", ()) or (1,))
    return size if isinstance(size, int) else 0


def _call_body(eqn):
    """The Jaxpr a call equation (jit, closed_call) runs, else None."""
    if eqn.primitive not in (P.jit_p, *call_primitives):
        return None
    (body,) = sub_jaxprs_of_params(eqn.params)
    return body


def _costly_cone(eqn, costly: dict) -> list:
    """Whether each output's fused cone holds a costly op (looking into calls:
    MAX sees one flat graph)."""
    if eqn.primitive.name in FUSED and len(eqn.outvars) == 1:
        return [(eqn.primitive.name in COSTLY and _size(eqn.outvars[0]) >= MIN_SIZE)
                or any(costly.get(u, False) for u in eqn.invars if isinstance(u, Var))]
    body = _call_body(eqn)
    if body is None:
        return [False] * len(eqn.outvars)
    inner = {b: costly.get(u, False) for b, u in zip(body.invars, eqn.invars)
             if isinstance(u, Var)}
    for e in body.eqns:
        inner.update(zip(e.outvars, _costly_cone(e, inner)))
    return [isinstance(v, Var) and inner.get(v, False) for v in body.outvars]


def _sinks(jaxpr) -> dict:
    """For each variable: the non-fused consumers (equation indices, -1 for
    an output) its value reaches through fused primitives."""
    consumers: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if isinstance(v, Var):
                consumers.setdefault(v, []).append(i)
    outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    sinks: dict = {}
    for i in reversed(range(len(jaxpr.eqns))):
        eqn = jaxpr.eqns[i]
        for v in eqn.outvars:
            reached = {-1} if v in outputs else set()
            for c in consumers.get(v, ()):
                consumer = jaxpr.eqns[c]
                if consumer.primitive.name in FUSED and len(consumer.outvars) == 1:
                    reached |= sinks.get(consumer.outvars[0], set())
                else:
                    reached.add(c)
            sinks[v] = reached
    return sinks


def rewrite(closed: ClosedJaxpr) -> ClosedJaxpr:
    jaxpr = closed.jaxpr
    uses: dict = {}
    for eqn in jaxpr.eqns:
        for v in eqn.invars:
            if isinstance(v, Var):
                uses[v] = uses.get(v, 0) + 1
    outputs = {v for v in jaxpr.outvars if isinstance(v, Var)}
    costly: dict = {}  # variable -> whether its fused cone holds a costly op
    chosen, sinks = set(), None
    for eqn in jaxpr.eqns:
        for v, flag in zip(eqn.outvars, _costly_cone(eqn, costly)):
            costly[v] = flag
            if not (flag and uses.get(v, 0) >= 2 and v not in outputs
                    and _size(v) >= MIN_SIZE):
                continue
            sinks = _sinks(jaxpr) if sinks is None else sinks
            if len(sinks[v]) >= 2:
                chosen.add(v)
                costly[v] = False  # read from memory downstream
    if not chosen:
        return closed
    eqns, renamed = [], {}
    for eqn in jaxpr.eqns:
        eqn = eqn.replace(invars=[renamed.get(v, v) if isinstance(v, Var) else v
                                  for v in eqn.invars])
        eqns.append(eqn)
        for v in eqn.outvars:
            if v in chosen:
                copy = Var(v.aval)
                eqns.append(eqn.replace(primitive=materialize.primitive, invars=[v],
                                        outvars=[copy], params={}))
                renamed[v] = copy
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)
