"""A small matcher for multi-equation patterns in a Jaxpr, and the rewrite
pass that replaces each match by one `nn_fused` equation.

Patterns are expression trees written with four node kinds:

    X("x")                  any atom; a name bound twice must be the same
                            value (or a structurally identical recomputation)
    Lit(pred, "eps")        a literal whose value satisfies pred (bound by name)
    Op("mul", a, b, ...)    an equation of that primitive over a, b (commutative
                            ops also try b, a); `name=` binds the equation
    Any(p1, p2, ...)        the first alternative that matches
    Opt("stop_gradient", p) p, optionally wrapped in that unary equation

A match whose intermediate values are used outside it is rejected: the fused
equation only replaces computations nobody else reads.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable

from juju._compat import ClosedJaxpr, Jaxpr, JaxPrimitive, Literal, Var, jex_core, open_jaxpr
from juju.primitives import call_primitives

COMMUTATIVE = {"add", "mul", "max", "min"}

# One primitive for every recognised pattern: params `name` (the pattern),
# `attrs` (what the fused lowering needs, a sorted tuple of pairs) and
# `call_jaxpr` (the original equations, the fallback's lowering).
nn_fused_p = JaxPrimitive("nn_fused")
nn_fused_p.multiple_results = True


@dataclass(frozen=True)
class X:
    name: str


@dataclass(frozen=True)
class Lit:
    pred: Callable
    name: str | None = None


class Op:
    def __init__(self, prim, *args, name=None, where=None):
        self.prim, self.args, self.name, self.where = prim, args, name, where


class Any:
    def __init__(self, *alternatives):
        self.alternatives = alternatives


class Opt:
    def __init__(self, prim, arg):
        self.prim, self.arg = prim, arg


def near(value, rel=1e-3):
    return lambda v: is_number(v) and math.isclose(float(v), value, rel_tol=rel, abs_tol=1e-7)


def is_number(v):
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def positive(v):
    return is_number(v) and 0 < float(v) < 1


@dataclass
class Match:
    binds: dict = field(default_factory=dict)
    eqns: dict = field(default_factory=dict)  # id(eqn) -> eqn

    def copy(self):
        return Match(dict(self.binds), dict(self.eqns))


class Matcher:
    """Matches patterns against the equations of one Jaxpr."""

    def __init__(self, jaxpr: Jaxpr):
        self.jaxpr = jaxpr
        self.producer = {}
        self.order = {}
        for i, eqn in enumerate(jaxpr.eqns):
            self.order[id(eqn)] = i
            for v in eqn.outvars:
                self.producer[v] = eqn
        self.uses: dict = {}
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if isinstance(v, Var):
                    self.uses[v] = self.uses.get(v, 0) + 1
        for v in jaxpr.outvars:
            if isinstance(v, Var):
                self.uses[v] = self.uses.get(v, 0) + 100  # outputs are never internal

    def same(self, a, b, depth: int = 8) -> bool:
        """a and b compute the same value: the same variable, equal literals,
        or (up to `depth` equations deep) the same equation on the same inputs."""
        if a is b:
            return True
        if isinstance(a, Literal) or isinstance(b, Literal):
            return (isinstance(a, Literal) and isinstance(b, Literal)
                    and repr(a.val) == repr(b.val) and a.aval == b.aval)
        ea, eb = self.producer.get(a), self.producer.get(b)
        if depth == 0 or ea is None or eb is None or ea.primitive is not eb.primitive:
            return False
        if ea.primitive.multiple_results or _has_jaxpr(ea) or len(ea.invars) != len(eb.invars):
            return False
        if _params_key(ea.params) != _params_key(eb.params):
            return False
        return all(self.same(x, y, depth - 1) for x, y in zip(ea.invars, eb.invars))

    def match(self, pattern, atom, m: Match):
        """A new Match extending m, or None."""
        if isinstance(pattern, X):
            if pattern.name in m.binds:
                return m if self.same(m.binds[pattern.name], atom) else None
            m = m.copy()
            m.binds[pattern.name] = atom
            return m
        if isinstance(pattern, Lit):
            if not isinstance(atom, Literal):
                return None
            value = atom.val
            if getattr(value, "shape", ()) != ():
                return None
            if not pattern.pred(value):
                return None
            if pattern.name:
                m = m.copy()
                m.binds[pattern.name] = float(value)
            return m
        if isinstance(pattern, Any):
            for alt in pattern.alternatives:
                got = self.match(alt, atom, m)
                if got is not None:
                    return got
            return None
        if isinstance(pattern, Opt):
            eqn = self.producer.get(atom) if isinstance(atom, Var) else None
            if eqn is not None and eqn.primitive.name == pattern.prim:
                got = self.match(pattern.arg, eqn.invars[0], _with(m, eqn))
                if got is not None:
                    return got
            return self.match(pattern.arg, atom, m)
        # Op
        if not isinstance(atom, Var):
            return None
        eqn = self.producer.get(atom)
        if eqn is None or eqn.primitive.name != pattern.prim or len(eqn.invars) != len(pattern.args):
            return None
        if pattern.where is not None and not pattern.where(eqn):
            return None
        m = _with(m, eqn)
        if pattern.name:
            m.binds[pattern.name] = eqn
        orders = [eqn.invars]
        if pattern.prim in COMMUTATIVE and len(eqn.invars) == 2:
            orders.append(eqn.invars[::-1])
        for invars in orders:
            got = m
            for sub, v in zip(pattern.args, invars):
                got = self.match(sub, v, got)
                if got is None:
                    break
            if got is not None:
                return got
        return None

    def closed(self, m: Match, anchor) -> bool:
        """No value computed inside the match (but the anchor's) escapes it."""
        inside = {id(e) for e in m.eqns.values()}
        internal_uses: dict = {}
        for e in m.eqns.values():
            for v in e.invars:
                if isinstance(v, Var):
                    internal_uses[v] = internal_uses.get(v, 0) + 1
        for e in m.eqns.values():
            if e is anchor:
                continue
            for v in e.outvars:
                if self.uses.get(v, 0) != internal_uses.get(v, 0):
                    return False
        return id(anchor) in inside


def _with(m: Match, eqn) -> Match:
    m = m.copy()
    m.eqns[id(eqn)] = eqn
    return m


def _params_key(params):
    try:
        items = tuple(sorted((k, repr(v)) for k, v in params.items()))
    except Exception:
        items = ("unhashable", id(params))
    return items


def _has_jaxpr(eqn) -> bool:
    return bool(list(jex_core.jaxprs_in_params(eqn.params)))


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
