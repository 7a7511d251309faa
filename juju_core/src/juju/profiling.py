"""`juju.profile`: where a program's time goes, per source line or equation.

MAX 26.7 times no op on the CPU (GPU profiling is NVTX ranges for Nsight;
`MODULAR_DEBUG=op-log-level=TRACE` logs kernel launches without times), so
juju times sub-graphs: one MAX graph per source line (or equation), compiled
with the program in one MAX compilation, each run on its real inputs.
docs/profile.md says what this measures and what it cannot.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
import timeit
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util
from jax.extend.core import DropVar

from juju import host, plugins
from juju._compat import (ClosedJaxpr, Jaxpr, Literal, api_boundary, call_primitives,
                          equation_text, is_tracer, jaxpr_as_fun, scan_operands, source_line,
                          while_operands)
from juju._compat import primitives as P
from juju.arguments import host_buffer, to_buffer, to_numpy
from juju.call import juju_call_p
from juju.errors import ProfileError
from juju.interpreter import check_rules
from juju.jit import JitFunction, jit
from juju.runners import is_max_model
from juju.stages import Lowered, compile_all

__all__ = ["Profile", "ProfileEntry", "ProfileError", "profile"]


@dataclass(frozen=True)
class ProfileEntry:
    """The time of one graph: a source line's consecutive equations, one
    equation (`group="equation"`), or a staged program's step.

    Attributes:
        path: its first equation's, as `juju.explain` gives it (`"3"`,
            `"3/body/0"`), `"segment2"` (a staged program's graph), or
            `"3/overhead"` (loop 3's time beyond its body's entries).
        seconds: its time in one run of the program, less the dispatch
            floor; in a loop body (`depth=1`): per trip, times the trips.
        share: `seconds` over the sum of the entries outside loop bodies.
        primitive: its primitives' names, joined with `+`.
        equations: the text of each of its equations.
        source: the user's source line of its first equation (the call
            site's, inside a `jnp` helper).
        rule: the rules that lowered it and their packs, as `juju.explain`
            says; `"host"` or `"MAX graph"` for a staged program's steps.
        trips: a loop's trip count.
        loop: the path of the loop whose body holds it, or None.
    """

    path: str
    seconds: float
    share: float
    primitive: str
    equations: tuple[str, ...]
    source: str
    rule: str
    trips: int | None = None
    loop: str | None = None


@dataclass
class Profile:
    """What `juju.profile` measured; `print` it for a table of the top entries.

    Attributes:
        name: the profiled function's name.
        entries: every `ProfileEntry`, slowest first.
        program_seconds: a call of the whole program through `juju.jit`,
            arguments and results included.
        floor_seconds: the execute cost of a one-op MAX graph, taken off
            each entry (0 for a staged program's steps, timed as they run).
        jax_seconds: a call of `jax.jit` of the function (`compare_jax`).
        top: how many entries `str()` shows.
        notes: how the packs placed the program (`juju.Explanation.notes`):
            one generated kernel, or how many kernels and MAX ops, and why.
    """

    name: str
    entries: list[ProfileEntry]
    program_seconds: float
    floor_seconds: float
    jax_seconds: float | None = None
    top: int = 15
    notes: tuple[str, ...] = ()

    def by_source(self) -> list[tuple[str, float]]:
        """(source line, seconds) summed per line, slowest first: a loop
        whose body was timed counts as its body's entries and its overhead."""
        expanded = {e.loop for e in self.entries}
        totals: dict[str, float] = {}
        for e in self.entries:
            if e.path not in expanded:
                totals[_line(e.source)] = totals.get(_line(e.source), 0.0) + e.seconds
        return sorted(totals.items(), key=lambda item: -item[1])

    def __str__(self) -> str:
        total = sum(e.seconds for e in self.entries if e.loop is None)
        versus = "" if self.jax_seconds is None else f" (jax.jit: {_t(self.jax_seconds)})"
        rows = [("time", "share", "trips", "path", "primitive", "source", "rule")]
        rows += [(_t(e.seconds) if e.seconds else "~0", f"{100 * e.share:.1f}%",
                  "" if e.trips is None else str(e.trips), e.path, e.primitive[:32],
                  _short(e.source), e.rule) for e in self.entries[:self.top]]
        more = len(self.entries) - self.top
        how = (f"each timed alone as its own MAX graph less a {_t(self.floor_seconds)} "
               "dispatch floor" if self.floor_seconds else "each step timed as juju runs it")
        return "\n".join([
            f"juju.profile({self.name}): {_t(self.program_seconds)} per call on MAX{versus}",
            *self.notes,
            f"{len(self.entries)} entries, {how}; outside loop bodies: {_t(total)}",
            *_columns(rows), *([f"  ... and {more} more in .entries"] if more > 0 else []),
            "by source line:",
            *_columns([(_t(s), _short(src)) for src, s in self.by_source()[:5]])])


def _columns(rows) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
            for row in rows]


def _short(source: str) -> str:
    where, _, rest = source.partition(" ")
    return os.path.basename(where) + (f" {rest}" if rest else "")


def _line(source: str) -> str:
    """`source` without its column: `f.py:12:4 (fn)` -> `f.py:12 (fn)`."""
    return re.sub(r"^(.*:\d+):\d+", r"\1", source)


def _t(seconds: float) -> str:
    return (f"{seconds:.3f} s" if seconds >= 1 else f"{seconds * 1e3:.3f} ms"
            if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us")


@api_boundary
def profile(fun, *args, group: str = "line", depth: int = 0, top: int = 15, repeats: int = 7,
            compare_jax: bool = False, static_argnums=(), static_argnames=(), engine=None,
            **kwargs) -> Profile:
    """Time `fun(*args, **kwargs)` on MAX per source line (or equation).

    Compiles the program and one graph per source line in one MAX
    compilation (or loads them from juju's cache) and times each graph on
    its real inputs. A program with host callbacks gets one entry per MAX
    graph and per host step instead.

    Args:
        fun: a function or a `juju.jit` function (whose options are used).
        *args: concrete arguments, as for a call of `fun`.
        **kwargs: `fun`'s keyword arguments.
        group: `"line"`: consecutive equations of one source line are one
            graph, which MAX fuses as in the program; `"equation"`: one graph
            each, a finer breakdown without that fusion.
        depth: 1 also times `while`/`scan` bodies, on the first trip's
            values (2: the loops in those bodies too); 0: a loop is one entry.
        top: how many entries `str(profile)` shows.
        repeats: timed runs per graph (at least; up to 100 for fast ones);
            the fastest counts, as other processes only add time.
        compare_jax: also time `jax.jit` of the function.
        static_argnums: `juju.jit`'s, for a plain `fun`. This name and the
            others here are `profile`'s: give `fun` arguments so named with
            `functools.partial`.
        static_argnames: `juju.jit`'s, for a plain `fun`.
        engine: `juju.jit`'s, for a plain `fun`.

    Returns:
        A `Profile`; `print` it for the table of the slowest entries.

    Raises:
        ProfileError: abstract arguments (tracers, `jax.ShapeDtypeStruct`s),
            or a graph failed to run.
        TypeError: jit options given with a `juju.jit` function.
        ValueError: an unknown `group`, a negative `depth`, `repeats` < 1.
        MissingRuleError, LoweringError, CompileError: as `juju.jit` raises them.
    """
    if not isinstance(fun, JitFunction):
        fun = jit(fun, static_argnums=static_argnums, static_argnames=static_argnames,
                  engine=engine, tiered=False)
    elif static_argnums or static_argnames or engine is not None:
        raise TypeError("juju.profile: fun is a juju.jit function, whose static arguments "
                        "and engine are used: do not give them again")
    if depth < 0 or repeats < 1 or group not in ("line", "equation"):
        raise ValueError(f"juju.profile: group is 'line' or 'equation', depth >= 0 and "
                         f"repeats >= 1; got {group!r}, {depth}, {repeats}")
    dyn_args, dyn_kwargs, _ = fun.split_arguments(args, kwargs)
    leaves = tree_util.tree_leaves((dyn_args, dyn_kwargs))
    for leaf in leaves:
        if is_tracer(leaf) or isinstance(leaf, jax.ShapeDtypeStruct):
            raise ProfileError(f"juju.profile({fun.__name__}) runs the program: it needs "
                               f"concrete arrays, got a {type(leaf).__name__}")
    lowered = fun.lowered_for(args, kwargs)
    if isinstance(lowered, host.StagedLowered):
        entries, floor = _staged_entries(lowered, leaves, repeats), 0.0
    else:
        entries, floor = _program_entries(fun, lowered, leaves, group, depth, repeats)
    device = fun.engine.device
    program = _fastest(lambda: _synced(fun(*args, **kwargs), device), repeats)
    jax_seconds = None
    if compare_jax:
        xla = jax.jit(fun.fun, static_argnums=fun.static_argnums,
                      static_argnames=fun.static_argnames)
        jax_seconds = _fastest(lambda: jax.block_until_ready(xla(*args, **kwargs)), repeats)
    total = sum(e.seconds for e in entries if e.loop is None) or 1.0
    ranked = sorted((dataclasses.replace(e, share=e.seconds / total) for e in entries),
                    key=lambda e: -e.seconds)
    return Profile(fun.__name__, ranked, program, floor, jax_seconds, top, lowered.notes)


# --- a plain program: its units, one graph each -------------------------------

# Calls whose bodies are inlined (the param holding the body): each body
# equation is timed as if the user had not wrapped it.
_CALL_BODIES = {P.jit_p: "jaxpr", P.custom_jvp_call_p: "call_jaxpr",
                P.custom_vjp_call_p: "call_jaxpr", P.remat_p: "jaxpr", juju_call_p: "jaxpr",
                **{p: "call_jaxpr" for p in call_primitives}}
_LOOP_BODIES = {P.while_p: "body_jaxpr", P.scan_p: "jaxpr"}


@dataclass
class _Unit:
    """Equations timed as one graph; `body`: a loop's invars, then steps."""

    path: str
    eqns: list
    source: str
    body: list | None = None
    in_vars: list = field(default_factory=list)
    model: Any = None
    trip_counter: Any = None
    rule: str = "?"


def _steps(jaxpr, prefix: str, depth: int, consts: dict, outer_source: str = "") -> list:
    """`jaxpr` as `_Unit`s and (targets, sources) bindings into and out of
    the call bodies it inlines; `consts` collects the bodies' consts."""
    steps: list = []
    for i, eqn in enumerate(jaxpr.eqns):
        path, source = f"{prefix}{i}", source_line(eqn) or outer_source
        held = eqn.params.get(_CALL_BODIES.get(eqn.primitive, ""))
        if held is not None:
            body = _opened(held, consts)
            steps += [(body.invars, eqn.invars),
                      *_steps(body, f"{path}/body/", depth, consts, source),
                      (eqn.outvars, body.outvars)]
            continue
        unit = _Unit(path, [eqn], source)
        if depth > 0 and eqn.primitive in _LOOP_BODIES:
            body = _opened(eqn.params[_LOOP_BODIES[eqn.primitive]], consts)
            unit.body = [body.invars, *_steps(body, f"{path}/body/", depth - 1, consts, source)]
        steps.append(unit)
    return steps


def _opened(jaxpr, consts: dict):
    """The open jaxpr of a sub-jaxpr (closed up to jax 0.10), its consts noted."""
    if isinstance(jaxpr, ClosedJaxpr):
        consts.update(zip(jaxpr.jaxpr.constvars, jaxpr.consts))
        return jaxpr.jaxpr
    return jaxpr


def _units(steps: list):
    for step in steps:
        if isinstance(step, _Unit):
            yield step
            yield from _units(step.body[1:] if step.body else [])


def _grouped(steps: list) -> list:
    """Consecutive units of one source line merged into one (loops apart)."""
    merged: list = []
    for step in steps:
        last = merged[-1] if merged else None
        if isinstance(step, _Unit) and step.body:
            step.body[1:] = _grouped(step.body[1:])
        if (isinstance(step, _Unit) and isinstance(last, _Unit)
                and step.eqns[0].primitive not in _LOOP_BODIES
                and last.eqns[0].primitive not in _LOOP_BODIES
                and _line(step.source) == _line(last.source)):
            last.eqns += step.eqns
        else:
            merged.append(step)
    return merged


def _sub_program(eqns) -> tuple[list, ClosedJaxpr]:
    """The free variables of `eqns`, and `eqns` as a program of them, as they
    are (not traced again: primitives without abstract evaluation are fine)."""
    made, free = set(), {}
    for eqn in eqns:
        free.update((v, None) for v in eqn.invars if not isinstance(v, Literal) and v not in made)
        made.update(eqn.outvars)
    outs = [v for e in eqns for v in e.outvars if not isinstance(v, DropVar)]
    effects = frozenset().union(*(e.effects for e in eqns))
    return list(free), ClosedJaxpr(Jaxpr(constvars=[], invars=list(free), outvars=outs,
                                         eqns=eqns, effects=effects), [])


def _trip_counter(eqn, in_vars) -> ClosedJaxpr:
    """A program of `in_vars` returning how many trips `eqn`'s while loop runs."""
    cond, body = (jaxpr_as_fun(j if isinstance(j, ClosedJaxpr) else ClosedJaxpr(j, ()))
                  for j in (eqn.params["cond_jaxpr"], eqn.params["body_jaxpr"]))

    def trips(*values):
        env = dict(zip(in_vars, values))
        operands = [a.val if isinstance(a, Literal) else env[a] for a in eqn.invars]
        cond_consts, body_consts, init = while_operands(eqn.params, operands)
        return lax.while_loop(lambda c: cond(*cond_consts, *c[1:])[0],
                              lambda c: (c[0] + 1, *body(*body_consts, *c[1:])),
                              (jnp.int32(0), *init))[0]

    return jax.make_jaxpr(trips)(*[jax.ShapeDtypeStruct(
        v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type) for v in in_vars])


def _lowered(holder: JitFunction, name: str, closed: ClosedJaxpr) -> Lowered:
    """A graph compiled with the program, as `Lowered.build_graph` builds it."""
    required = check_rules(closed, plugins.registry(), holder.engine.device_ref)
    return Lowered(jit_function=holder, key=("juju.profile", name), closed_jaxpr=closed,
                   out_tree=tree_util.tree_structure(list(closed.out_avals)),
                   in_dtypes=[a.dtype for a in closed.in_avals],
                   kernel_names=frozenset(required), name=name)


def _program_entries(fn: JitFunction, lowered: Lowered, leaves, group, depth, repeats):
    closed = lowered.closed_jaxpr
    consts = dict(zip(closed.jaxpr.constvars, closed.consts))
    steps = _steps(closed.jaxpr, "", depth, consts)
    if group == "line":
        steps = _grouped(steps)
    # The graphs' owner: a jit function never called, only compiled for.
    holder = jit(lambda: None, engine=fn.engine, tiered=False)
    holder.fun.__qualname__ = f"{fn.__name__}.profile"
    holder.fun.__wrapped__ = fn.fun  # compile messages name the user's function
    parts = []
    for unit in _units(steps):
        unit.in_vars, program = _sub_program(unit.eqns)
        part = _lowered(holder, f"part{len(parts)}", program)
        choices = [c for c in part.explain() if c.depth == 0]  # builds its graph too
        unit.rule = ", ".join(dict.fromkeys(f"{c.rule} ({c.pack})" for c in choices))
        parts.append((unit, "model", part))
        if unit.eqns[0].primitive is P.while_p:
            try:
                counter = _trip_counter(unit.eqns[0], unit.in_vars)
            except Exception:  # noqa: BLE001, S112  (a body jax cannot trace again: no count)
                continue
            parts.append((unit, "trip_counter", _lowered(holder, f"part{len(parts)}", counter)))
    floor_part = _lowered(holder, "floor", jax.make_jaxpr(lambda x: x + 1)(np.float32(0)))
    compiled = compile_all([lowered, floor_part, *(part for _, _, part in parts)])
    for (unit, slot, _), done in zip(parts, compiled[2:], strict=True):
        setattr(unit, slot, done.executable.model)
    device = fn.engine.device
    zero = to_buffer(np.float32(0), np.dtype(np.float32), device)
    floor_model = compiled[1].executable.model

    def floor(runs: int) -> float:  # a one-op graph's execute: the dispatch cost
        return _fastest(lambda: _synced(floor_model.execute(zero), device), runs, warm=False)

    env = {v: to_buffer(x, v.aval.dtype, device)
           for v, x in [*consts.items(), *zip(closed.jaxpr.invars, leaves)]}
    entries: list[ProfileEntry] = []
    _run(steps, env, device, floor, repeats, 1, None, entries)
    return entries, floor(max(repeats, 100))


def _run(steps, env, device, floor, repeats, scale, loop, entries) -> None:
    """Run `steps` in order over `env` (var -> buffer), timing each unit
    less `floor(runs)`; `scale`: the trips of the loops around them, `loop`:
    the innermost one."""
    def read(atom):
        if isinstance(atom, Literal):
            return to_buffer(np.asarray(atom.val, atom.aval.dtype), atom.aval.dtype, device)
        return env[atom]

    for step in steps:
        if not isinstance(step, _Unit):
            env.update(zip(step[0], map(read, step[1])))
            continue
        ins, model, eqn = [env[v] for v in step.in_vars], step.model, step.eqns[0]
        try:
            start = time.perf_counter()
            outs = _synced(model.execute(*ins), device)
            first = time.perf_counter() - start
            trips = _trips(step, ins, device)
        except Exception as exc:
            raise ProfileError(f"juju.profile: the graph of equation {step.path} "
                               f"('{eqn.primitive.name}' at {step.source}) failed to run") from exc
        outvars = [v for e in step.eqns for v in e.outvars if not isinstance(v, DropVar)]
        env.update(zip(outvars, outs))
        # Fast graphs get more runs (their fastest is noisy), slow ones fewer.
        runs = (max(repeats, min(100, int(0.05 / max(first, 1e-6)))) if first < 0.1
                else max(1, min(repeats, int(1.0 / first))))
        seconds = _fastest(lambda m=model, i=ins: _synced(m.execute(*i), device), runs, warm=False)
        if is_max_model(model):  # not a pack's own (juju.runners): MAX's dispatch to take off
            seconds -= floor(runs)  # measured next to it: the machine's load drifts
        entry = ProfileEntry(
            step.path, max(seconds, 0.0) * scale, 0.0,
            "+".join(dict.fromkeys(e.primitive.name for e in step.eqns)),
            tuple(equation_text(e) for e in step.eqns), step.source, step.rule, trips, loop)
        entries.append(entry)
        if step.body and trips:
            env.update(zip(step.body[0], _first_trip(eqn, [read(a) for a in eqn.invars], device)))
            before = len(entries)
            _run(step.body[1:], env, device, floor, repeats, scale * trips, step.path, entries)
            # MAX's loop itself: per-op launches each trip, its cond, carries.
            inside = sum(e.seconds for e in entries[before:] if e.loop == step.path)
            entries.append(dataclasses.replace(
                entry, path=f"{step.path}/overhead", seconds=max(entry.seconds - inside, 0.0),
                primitive=f"{eqn.primitive.name} overhead", trips=None, loop=step.path,
                equations=("the loop's time less its body's entries",)))


def _trips(unit: _Unit, ins, device) -> int | None:
    eqn = unit.eqns[0]
    if eqn.primitive is P.scan_p:
        return int(eqn.params["length"])
    if unit.trip_counter is None:
        return None
    return int(to_numpy(_on_host(_synced(unit.trip_counter.execute(*ins), device)[0])))


def _first_trip(eqn, operands, device) -> list:
    """A loop body's operands on its first trip."""
    if eqn.primitive is P.while_p:
        _, body_consts, carry = while_operands(eqn.params, operands)
        return [*body_consts, *carry]
    consts, carry, xs = scan_operands(eqn.params, operands)
    index = -1 if eqn.params["reverse"] else 0
    rows = [host_buffer(np.array(to_numpy(_on_host(x))[index])) for x in xs]
    return [*consts, *carry, *(r if device.is_host else r.to(device) for r in rows)]


def _on_host(buffer):
    from max import driver

    return buffer if buffer.device.is_host else buffer.to(driver.CPU())


def _synced(outs, device):
    if not device.is_host:  # GPU work is asynchronous: wait for it
        device.synchronize()
    return outs


def _fastest(run, repeats: int, warm: bool = True) -> float:
    """The fastest of `repeats` runs (other processes only add time, as
    `timeit` says), after one that warms caches and allocations."""
    if warm:
        run()
    return min(timeit.repeat(run, repeat=repeats, number=1))


# --- programs with host callbacks: one entry per MAX graph or host step -------


def _staged_entries(lowered, leaves, repeats: int) -> list[ProfileEntry]:
    """Each top-level step of a staged program's plan (a MAX graph between
    callbacks, a callback, a loop the host drives) timed as juju runs it, in
    order (a step's inputs are its predecessors' outputs); the callbacks run
    once per timed run."""
    compile_all([lowered])
    plan, entries = lowered.plan, []
    index = {id(e): i for i, e in enumerate(plan.jaxpr.eqns)}
    env = {**dict(zip(plan.jaxpr.constvars, plan.consts)), **dict(zip(plan.jaxpr.invars, leaves))}
    for step in plan.steps:
        seconds = _fastest(lambda s=step: s.run(env), repeats)
        graph = isinstance(step, host.Segment)
        eqns = [getattr(e, "eqn", e) for e in step.members] if graph else [step.eqn]
        entries.append(ProfileEntry(
            step.lowered.jit_function.fun.__name__.rpartition(".")[2] if graph
            else str(index[id(step.eqn)]), seconds, 0.0,
            "segment" if graph else eqns[0].primitive.name,
            tuple(equation_text(e) for e in eqns), source_line(eqns[0]),
            "MAX graph" if graph else "host"))
    return entries
