"""Jaxpr rewrites of the lax pack (the `juju_jaxpr_rewrites` hook).

`transpose(dot_general(a, b))` of matrices becomes `dot_general(b, a)`. JAX's
transpose rule writes every weight gradient of a dense layer that way; XLA
folds the transpose into the dot's output layout, MAX copies the whole
matrix (a 512x512 transpose per layer in the benchmark's MLP step), while a
transpose feeding a matmul costs it nothing.
"""

from __future__ import annotations

from collections import Counter

from juju import primitives as P
from juju._compat import ClosedJaxpr, Var


def _swappable(dot) -> bool:
    """A dot of two operands with one free dimension each, no batch dims."""
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in dot.invars)
    return not lb and not rb and len(lhs.shape) == len(lc) + 1 and len(rhs.shape) == len(rc) + 1


def fold_transposed_dots(closed: ClosedJaxpr) -> ClosedJaxpr:
    jaxpr = closed.jaxpr
    uses = Counter(v for e in jaxpr.eqns for v in e.invars if isinstance(v, Var))
    uses.update(v for v in jaxpr.outvars if isinstance(v, Var))
    dots = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive is P.dot_general_p}
    folded = {}  # id(transpose eqn) -> the swapped dot computing its result
    for e in jaxpr.eqns:
        source = e.invars[0] if e.primitive is P.transpose_p else None
        dot = dots.get(source)
        if (dot is None or tuple(e.params["permutation"]) != (1, 0) or uses[source] != 1
                or not _swappable(dot)):
            continue
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        folded[id(e)] = dot.replace(
            invars=[dot.invars[1], dot.invars[0]], outvars=e.outvars,
            params={**dot.params, "dimension_numbers": ((rc, lc), (rb, lb))})
    if not folded:
        return closed
    gone = {id(dots[e.invars[0]]) for e in jaxpr.eqns if id(e) in folded}
    eqns = [folded.get(id(e), e) for e in jaxpr.eqns if id(e) not in gone]
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)
