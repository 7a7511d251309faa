"""Which back end runs which part of a program on the CPU. Read this first.

juju has two back ends on the CPU:

- **MAX ops**: the graph juju_ops_lax and juju_ops_nn write, compiled by
  MAX: vectorized, multi-threaded, fused where MAX fuses, but every op (and
  every trip of a loop) goes through MAX's runtime, ~1-3 us an op and
  ~15-35 us a trip, and a large graph compiles for minutes.
- **Generated kernels**: the `codegen` package writes many equations as one
  Mojo function. A program that is one kernel runs natively, without MAX
  (`native_programs`), and builds in seconds.

`rewrite` (the pack's jaxpr rewrite) decides, in this order:

1. The whole program is one `mojo_program` equation where the generator
   writes every equation of it and its work is within
   `program_kernels.work_limit`.
2. Else, with islands on (`JUJU_PROGRAM_KERNELS=islands`), each maximal run
   of equations the generator takes becomes a `mojo_program` (a custom op
   in the MAX graph), and the rest stays MAX ops.
3. Else every equation stays a MAX op.

Every refusal is named: the primitive the generator does not write (or the
parameter it does not take), or the limit and its numbers. `rewrite`
attaches a summary to the program (`juju.rewrites.annotate`): `juju.explain`
returns it in its notes, and the first lowering logs it at INFO.
`JUJU_PROGRAM_KERNELS=0` turns the rewrite off.
"""

from __future__ import annotations

import math
import os
import threading
import weakref
from dataclasses import dataclass

from juju._compat import ClosedJaxpr, Jaxpr, Var, jex_core, source_line
from juju.rewrites import annotate
from juju_kernels_mojo import loop_rules
from juju_kernels_mojo.codegen import Unsupported, loop_source
from juju_kernels_mojo.program_kernels import (ISLAND_MAX_ELEMENTS, ISLAND_MIN_EQUATIONS,
                                               op_count, program_p, work_limit)

PACK = "juju-kernels-mojo"


@dataclass(frozen=True)
class Refusal:
    """Why the generator did not take (part of) a program.

    Attributes:
        primitive: the refused equation's primitive (the innermost one, in a
            loop or a call), or `"program"` for a limit on the whole.
        reason: what it does not write, or the limit and its numbers.
        source: the equation's user source line, where known.
    """

    primitive: str
    reason: str
    source: str = ""

    def __str__(self) -> str:
        where = f" at {self.source}" if self.source else ""
        return f"{self.primitive}: {self.reason}{where}"


@dataclass(frozen=True)
class Plan:
    """How a program is placed: `kernels` generated kernels, `max_ops`
    top-level equations left to MAX, and why (`refusals`)."""

    kernels: int
    max_ops: int
    refusals: tuple[Refusal, ...] = ()

    def describe(self) -> str:
        if self.kernels == 1 and not self.max_ops:
            return "one generated kernel"
        if not self.kernels:
            path = "MAX ops only"
        else:
            path = f"{self.kernels} generated kernel(s) + {self.max_ops} MAX op(s)"
        if self.refusals:
            path += "; refused: " + "; ".join(map(str, self.refusals))
        return path


_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def plan_of(closed_jaxpr) -> Plan | None:
    """The plan `rewrite` made for the program it returned, or None."""
    with _plans_lock:
        return _plans.get(closed_jaxpr)


def enabled() -> bool:
    return os.environ.get("JUJU_PROGRAM_KERNELS", "1") != "0"


def islands_enabled() -> bool:
    """Islands are opt-in (`JUJU_PROGRAM_KERNELS=islands`): see ISLAND_MAX_ELEMENTS."""
    return os.environ.get("JUJU_PROGRAM_KERNELS", "1") == "islands"


def rewrite(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`closed` placed as `plan` says, the plan's summary attached."""
    jaxpr = closed.jaxpr
    if not enabled() or jaxpr.effects or not jaxpr.eqns:
        return closed
    eqns, plan = place(jaxpr)
    result = closed if eqns is None else ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)
    annotate(result, f"{PACK}: {plan.describe()}")
    with _plans_lock:
        _plans[result] = plan
    return result


def place(jaxpr) -> tuple[list | None, Plan]:
    """The equations of `jaxpr` with the generator's kernels in place (None:
    unchanged), and the plan."""
    whole = _island(jaxpr, 0, len(jaxpr.eqns), 1)
    if isinstance(whole, list):
        return whole, Plan(1, 0)
    refusals = _refusals(jaxpr, whole)
    if not islands_enabled():
        return None, Plan(0, len(jaxpr.eqns), refusals)
    eqns = _islands(jaxpr)
    kernels, max_ops = _counts(eqns)
    changed = any(a is not b for a, b in zip(eqns, jaxpr.eqns)) or len(eqns) != len(jaxpr.eqns)
    return (eqns if changed else None), Plan(kernels, max_ops, refusals)


def _islands(jaxpr) -> list:
    """`jaxpr`'s equations with each long run the generator writes as a
    kernel, and the loops, branches and calls left to MAX placed the same
    way inside."""
    eqns, done = [], 0
    for start, stop in _runs(jaxpr):
        eqns += jaxpr.eqns[done:start]  # the equations between runs: MAX ops
        island = _island(jaxpr, start, stop, ISLAND_MIN_EQUATIONS)
        eqns += island if isinstance(island, list) else jaxpr.eqns[start:stop]
        done = stop
    eqns += jaxpr.eqns[done:]
    return [e if e.primitive is program_p else _inside(e) for e in eqns]


def _inside(eqn):
    """`eqn` with the jaxprs it holds (a loop's body, a cond's branches, a
    call's body) placed as islands; `eqn` itself where nothing changes."""
    params, changed = dict(eqn.params), False
    for name, value in eqn.params.items():
        held = value if isinstance(value, tuple) else (value,)
        if not held or not all(isinstance(v, ClosedJaxpr) for v in held):
            continue
        placed = []
        for closed in held:
            body = closed.jaxpr
            new = None if body.effects or not body.eqns else _islands(body)
            same = new is None or (len(new) == len(body.eqns)
                                   and all(a is b for a, b in zip(new, body.eqns)))
            placed.append(closed if same else ClosedJaxpr(body.replace(eqns=new), closed.consts))
            changed |= not same
        params[name] = tuple(placed) if isinstance(value, tuple) else placed[0]
    return eqn.replace(params=params) if changed else eqn


def _counts(eqns) -> tuple[int, int]:
    """(kernels, MAX ops) among `eqns` and the jaxprs they hold."""
    kernels = max_ops = 0
    for eqn in eqns:
        if eqn.primitive is program_p:
            kernels += 1
            continue
        max_ops += 1
        for value in eqn.params.values():
            for held in value if isinstance(value, tuple) else (value,):
                if isinstance(held, ClosedJaxpr):
                    k, m = _counts(held.jaxpr.eqns)
                    kernels, max_ops = kernels + k, max_ops + m
    return kernels, max_ops


def _refusals(jaxpr, whole: Refusal | None) -> tuple[Refusal, ...]:
    """Every equation of `jaxpr` the generator refuses on its own, and the
    whole program's limit where that was the reason."""
    found = [_probe(eqn)[1] for eqn in jaxpr.eqns]
    found = [r for r in found if r is not None]
    if whole is not None and whole.primitive == "program":
        found.insert(0, whole)
    return tuple(dict.fromkeys(found))  # each once, in program order


def _probe(eqn) -> tuple[int, Refusal | None]:
    """(work, None) where the generator writes `eqn` alone, else (0, why)."""
    inputs = [v for v in eqn.invars if isinstance(v, Var)]
    params = _params(inputs, list(eqn.outvars), [eqn])
    draft = _draft(params, inputs, list(eqn.outvars))
    if isinstance(draft, Refusal):
        return 0, draft
    return draft.work, None


def _island(jaxpr, start: int, stop: int, min_equations: int) -> list | Refusal | None:
    """Equations `start:stop` of `jaxpr` as `mojo_program` equations (halved
    until each is within `loop_rules`' limits, with islands on), or why not
    (None: fewer than `min_equations`, or nothing they compute is used)."""
    run = jaxpr.eqns[start:stop]
    if op_count(run) < min_equations:
        return None
    defined = {v for e in run for v in e.outvars}
    inputs = list(dict.fromkeys(v for e in run for v in e.invars
                                if isinstance(v, Var) and v not in defined))
    used_later = {v for e in jaxpr.eqns[stop:] for v in e.invars if isinstance(v, Var)}
    used_later.update(v for v in jaxpr.outvars if isinstance(v, Var))
    outputs = list(dict.fromkeys(v for e in run for v in e.outvars if v in used_later))
    if not outputs:
        return None
    params = _params(inputs, outputs, run)
    draft = _draft(params, inputs, outputs)
    if isinstance(draft, Refusal):
        return draft
    limit = work_limit(params["call_jaxpr"])
    over = loop_rules.over_limits(draft, limit)
    if over is not None:
        if not islands_enabled():  # halves of a program are islands too
            return Refusal("program", over)
        middle = (start + stop) // 2
        halves = (_island(jaxpr, start, middle, ISLAND_MIN_EQUATIONS),
                  _island(jaxpr, middle, stop, ISLAND_MIN_EQUATIONS))
        if not any(isinstance(h, list) for h in halves):
            return Refusal("program", over)
        first, second = (h if isinstance(h, list) else jaxpr.eqns[a:b] for h, (a, b) in
                         zip(halves, ((start, middle), (middle, stop))))
        return first + second
    return [jex_core.new_jaxpr_eqn(inputs, outputs, program_p, params, jex_core.no_effects,
                                   run[0].source_info)]


def _params(inputs, outputs, eqns) -> dict:
    """A `mojo_program` equation's params: `eqns` as a program of `inputs`."""
    return {"call_jaxpr": ClosedJaxpr(
        Jaxpr(constvars=[], invars=inputs, outvars=outputs, eqns=eqns), [])}


def _draft(params, inputs, outputs):
    """The generated source of a program (a `LoopKernel`), or a `Refusal`."""
    try:
        return loop_source(program_p, params, [v.aval for v in inputs],
                           [v.aval for v in outputs], "probe")
    except Unsupported as why:
        loop_rules.log.debug("juju: no program kernel: %s", why)
        return Refusal(why.primitive or "program", str(why), why.source or "")
    except Exception as exc:  # a generator bug must never break a program
        loop_rules.log.warning("juju: the Mojo program generator failed (%s: %s); those "
                               "equations stay MAX ops. Please report it.",
                               type(exc).__name__, exc)
        eqns = params["call_jaxpr"].jaxpr.eqns
        return Refusal("program", f"generator error {type(exc).__name__}: {exc}",
                       source_line(eqns[0]) if len(eqns) == 1 else "")


def _runs(jaxpr) -> list[tuple[int, int]]:
    """The maximal runs of consecutive equations the generator writes, each
    small enough on its own, as (start, stop); the equations between them
    stay MAX ops."""
    runs, start = [], None
    for i, eqn in enumerate([*jaxpr.eqns, None]):
        if eqn is not None and _island_member(eqn):
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    return runs


def _island_member(eqn) -> bool:
    if any(math.prod(v.aval.shape) > ISLAND_MAX_ELEMENTS for v in eqn.outvars
           if hasattr(v.aval, "shape")):
        return False
    work, refusal = _probe(eqn)
    return refusal is None and work <= loop_rules.MAX_WORK


rewrite.__qualname__ = "juju_kernels_mojo.placement"
