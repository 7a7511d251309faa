"""Calls replaced by their bodies' equations, as XLA inlines them: used by
generated kernels (fused runs and reductions span a library's helpers) and
by rewrites that look through calls (loop-invariant code motion)."""

from __future__ import annotations

from juju._compat import ClosedJaxpr, Literal, Var, call_primitives
from juju._compat import primitives as P

#: Calls whose bodies compute their results as they are (their params
#: describe placement or derivatives, not values).
CALLS = frozenset({P.jit_p, P.custom_jvp_call_p, P.custom_vjp_call_p, P.remat_p,
                   *call_primitives})


def inlined(jaxpr, calls=CALLS, expand=None):
    """(eqns, outvars, consts, origins): `jaxpr` (open) with every call of a
    primitive in `calls` (at any depth), and every equation for which
    `expand(eqn)` gives a closed jaxpr of its operands (a primitive's
    decomposition), replaced by its body's equations,
    their variables renamed afresh per call (one jitted helper called twice
    is two copies). `consts`: (var, value) of the bodies' constants;
    `origins`: id(equation) -> the outermost call it came from (its user's
    line)."""
    eqns, consts, origins, rename = [], [], {}, {}

    def atom(a):
        return a if isinstance(a, Literal) else rename.get(a, a)

    def walk(body, origin, fresh: bool) -> None:
        for e in body:
            callee = e.params.get("jaxpr", e.params.get("call_jaxpr")) \
                if e.primitive in calls else expand(e) if expand is not None else None
            if callee is None:
                outvars = e.outvars
                if fresh:
                    outvars = [Var(v.aval) for v in e.outvars]
                    rename.update(zip(e.outvars, outvars))
                new = e.replace(invars=[atom(a) for a in e.invars], outvars=outvars) \
                    if fresh or any(atom(a) is not a for a in e.invars) else e
                eqns.append(new)
                if origin is not None:
                    origins[id(new)] = origin
                continue
            inner = callee.jaxpr if isinstance(callee, ClosedJaxpr) else callee
            values = callee.consts if isinstance(callee, ClosedJaxpr) else []
            for v, value in zip(inner.constvars, values, strict=True):
                consts.append((Var(v.aval), value))
                rename[v] = consts[-1][0]
            for v, a in zip(inner.invars, e.invars, strict=True):
                rename[v] = atom(a)
            walk(inner.eqns, origin or e, True)
            for out, result in zip(e.outvars, inner.outvars, strict=True):
                rename[out] = atom(result)

    walk(jaxpr.eqns, None, False)
    return eqns, [atom(a) for a in jaxpr.outvars], consts, origins
