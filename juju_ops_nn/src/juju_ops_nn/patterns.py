"""The rewrite pass that replaces each match of a fused NN pattern by one
`nn_fused` equation. The matcher itself (`X`, `Lit`, `Op`, `Any`, `Opt`,
`Matcher`) is juju core's `juju.patterns`; a match whose intermediate values
are used outside it is rejected: the fused equation only replaces
computations nobody else reads.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from juju._compat import ClosedJaxpr, Jaxpr, JaxPrimitive, Var, jex_core, open_jaxpr
from juju.patterns import Match, Matcher
from juju.primitives import call_primitives

# One primitive for every recognised pattern: params `name` (the pattern),
# `attrs` (what the fused lowering needs, a sorted tuple of pairs) and
# `call_jaxpr` (the original equations, the fallback's lowering).
nn_fused_p = JaxPrimitive("nn_fused")
nn_fused_p.multiple_results = True


@dataclass(frozen=True)
class Pattern:
    """A named pattern: `tree` anchored at the equation computing the result;
    `attrs(match, matcher) -> dict | None` validates it and says what the
    fused lowering needs; `inputs` are the bound names that become operands."""

    name: str
    tree: object
    inputs: tuple[str, ...]
    attrs: Callable


def rewrite_closed_jaxpr(patterns: list[Pattern]):
    """A `juju_jaxpr_rewrites` pass replacing every match by `nn_fused`."""

    def rewrite(closed: ClosedJaxpr) -> ClosedJaxpr:
        try:
            new = _rewrite_jaxpr(closed.jaxpr, patterns)
        except Exception as exc:  # an optimisation must never break a program
            warnings.warn(f"juju-ops-nn: fused-pattern rewrite skipped: {exc!r}",
                          RuntimeWarning, stacklevel=2)
            return closed
        return closed if new is closed.jaxpr else ClosedJaxpr(new, closed.consts)

    rewrite.__qualname__ = "juju_ops_nn.fused_patterns"
    return rewrite


# Calls whose sub-program is rewritten too, and the param that holds it.
_RECURSE = {"jit": "jaxpr", "custom_jvp_call": "call_jaxpr",
            **{prim.name: "call_jaxpr" for prim in call_primitives}}


def _rewrite_jaxpr(jaxpr: Jaxpr, patterns) -> Jaxpr:
    eqns = list(jaxpr.eqns)
    changed = False
    # Sub-programs of calls first (jax.nn functions wrapped in jit).
    for i, eqn in enumerate(eqns):
        param = _RECURSE.get(eqn.primitive.name)
        inner = eqn.params.get(param) if param else None
        if not isinstance(inner, (ClosedJaxpr, Jaxpr)):
            continue
        # Closed sub-jaxprs up to jax 0.10, open ones from 0.11.
        new_inner = _rewrite_jaxpr(open_jaxpr(inner), patterns)
        if new_inner is not open_jaxpr(inner):
            if isinstance(inner, ClosedJaxpr):
                new_inner = ClosedJaxpr(new_inner, inner.consts)
            eqns[i] = eqn.replace(params={**eqn.params, param: new_inner})
            changed = True
    if changed:
        jaxpr = jaxpr.replace(eqns=eqns)
    matcher = Matcher(jaxpr)
    consumed: set = set()
    replacements = {}
    # Outermost results come last: scan backwards so the largest match wins.
    for eqn in reversed(jaxpr.eqns):
        if id(eqn) in consumed or len(eqn.outvars) != 1:
            continue
        for pattern in patterns:
            m = matcher.match(pattern.tree, eqn.outvars[0], Match())
            if m is None or not matcher.closed(m, eqn):
                continue
            if any(id(e) in consumed for e in m.eqns.values()):
                continue
            attrs = pattern.attrs(m, matcher)
            if attrs is None:
                continue
            inputs = [m.binds[n] for n in pattern.inputs if n in m.binds]
            if not all(isinstance(v, Var) for v in inputs):
                continue
            body = sorted(m.eqns.values(), key=lambda e: matcher.order[id(e)])
            call = ClosedJaxpr(
                Jaxpr(constvars=[], invars=inputs, outvars=[eqn.outvars[0]], eqns=body), []
            )
            params = dict(name=pattern.name, attrs=tuple(sorted(attrs.items())), call_jaxpr=call)
            fused = jex_core.new_jaxpr_eqn(
                inputs, [eqn.outvars[0]], nn_fused_p, params, jex_core.no_effects,
                eqn.source_info,
            )
            consumed.update(id(e) for e in body)
            replacements[id(eqn)] = fused
            break
    if not replacements:
        return jaxpr
    out = []
    for eqn in jaxpr.eqns:
        if id(eqn) in replacements:
            out.append(replacements[id(eqn)])
        elif id(eqn) not in consumed:
            out.append(eqn)
    return jaxpr.replace(eqns=out)
