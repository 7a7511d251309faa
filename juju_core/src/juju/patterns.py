"""Matching multi-equation patterns in a Jaxpr, for packs whose rules or
rewrites recognise what a library function traces to (juju-ops-nn's fused
patterns, juju-kernels-mojo's `jnp.linalg.cholesky` body).

Patterns are expression trees written with five node kinds:

    X("x")                  any atom; a name bound twice must be the same
                            value (or a structurally identical recomputation)
    Lit(pred, "eps")        a scalar literal whose value satisfies pred
                            (bound by name)
    Op("mul", a, b, ...)    an equation of that primitive over a, b (commutative
                            ops also try b, a); `name=` binds the equation,
                            `where=` tests it (its params)
    Any(p1, p2, ...)        the first alternative that matches
    Opt("stop_gradient", p) p, optionally wrapped in that unary equation

`Matcher(jaxpr).match(pattern, atom, Match())` returns a `Match` (the bound
names and the equations matched) or None; `Matcher.closed` says whether the
match's intermediate values are read only inside it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from juju._compat import Jaxpr, Literal, Var, jex_core

__all__ = ["Any", "Lit", "Match", "Matcher", "Op", "Opt", "X", "is_number", "near", "positive"]

COMMUTATIVE = {"add", "mul", "max", "min"}


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
