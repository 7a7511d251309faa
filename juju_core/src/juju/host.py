"""Programs with host callbacks: `jax.pure_callback`, `io_callback`,
`jax.debug.print` and `jax.debug.callback`, at any depth (`juju.callback_lifting`
first lifts them out of calls, into the top level and cond/while/scan bodies).

A MAX graph cannot call into Python, so a program with callbacks is staged:
the runs of equations between callbacks become MAX graphs (compiled together,
in one MAX compilation), each callback runs on the host with JAX's own
implementation, in program order, and the control flow whose body holds a
callback (`while`, `scan`, `cond`) is driven by the host, its bodies staged
the same way. Control flow whose callbacks all sit behind a branch (equinox's
checks) runs whole in MAX instead, replayed only when a branch fires
(`juju.speculation`). Graphs without callbacks are unaffected.
docs/callbacks.md gives the cost.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import tree_util

from juju import _compat, speculation
from juju._compat import is_complex_dtype, is_key_dtype
from juju.arguments import host_buffer, max_driver, to_jax, to_numpy
from juju.callback_lifting import (HostCallbackError, eqn_has_callbacks, has_callbacks,
                                   is_callback, lift)
from juju.errors import JujuError
from juju.recording import Explanation, RuleChoice
from juju.stages import Lowered

__all__ = ["has_callbacks", "lift", "StagedLowered", "HostCallbackError"]


class HostCallbackResultError(JujuError, RuntimeError):
    """A callback returned other shapes or dtypes than it declared (as jax's
    RuntimeError)."""


# --- the plan: steps over an environment of values --------------------------


def _read(env: dict, var):
    return var.val if isinstance(var, _compat.Literal) else env[var]


@dataclasses.dataclass
class Plan:
    """How to run one jaxpr: its steps in order, over {var: value}."""

    jaxpr: Any  # open
    consts: list
    steps: list

    def run(self, args) -> list:
        whole = self._whole_segment
        if whole is not None:  # the common case, without an environment
            segment, reads, writes = whole
            outs = segment.call([args[i] for i in reads])
            return [outs[i] for i in writes]
        env = dict(zip(self.jaxpr.constvars, self.consts))
        env.update(zip(self.jaxpr.invars, args))
        for step in self.steps:
            step.run(env)
        return [_read(env, v) for v in self.jaxpr.outvars]

    def segments(self):
        for step in self.steps:
            yield from step.segments()

    @functools.cached_property
    def _whole_segment(self):
        """Where this plan is one Segment computing every result: (it, the
        argument index of each of its inputs, the index among its outputs
        of each result); else None."""
        if len(self.steps) != 1 or not isinstance(self.steps[0], Segment):
            return None
        (segment,) = self.steps
        invars, outvars = list(self.jaxpr.invars), segment.out_vars
        if (not all(v in invars for v in segment.in_vars)
                or not all(v in outvars for v in self.jaxpr.outvars)):
            return None  # a constant read, or a result that is an argument or literal
        return (segment, [invars.index(v) for v in segment.in_vars],
                [outvars.index(v) for v in self.jaxpr.outvars])


@dataclasses.dataclass
class Segment:
    """A run of equations without callbacks: one MAX graph. A speculative
    one holds guarded callbacks (`juju.speculation`): its graph also returns
    whether a guarded branch fired, and then its equations are replayed."""

    in_vars: list
    out_vars: list
    lowered: Any
    members: list = dataclasses.field(default_factory=list)  # its equations
    consts: dict = dataclasses.field(default_factory=dict)  # closed over: {var: value}
    executable: Any = None

    @functools.cached_property
    def speculative(self) -> bool:  # read on every call: computed once
        return any(isinstance(e, Speculated) for e in self.members)

    def run(self, env):
        env.update(zip(self.out_vars, self.call([_read(env, v) for v in self.in_vars])))

    def call(self, ins) -> list:
        """The values of `out_vars` from those of `in_vars`."""
        outs = self.executable.run(ins)
        if self.speculative:
            *outs, fired = outs
            if _scalar(fired):
                outs = self._replay(ins)
        return outs

    def _replay(self, ins) -> list:
        """The segment's equations run by jax.jit, callbacks and all."""
        replay = self.__dict__.get("_replay_fn")
        if replay is None:
            original = [e.eqn if isinstance(e, Speculated) else e for e in self.members]
            replay = self.__dict__["_replay_fn"] = speculation.replay(
                _segment_function(original, self.in_vars, self.out_vars, self.consts))
        try:
            outs = replay(*[_host_value(v) for v in ins])
        except ValueError as exc:  # one error type for a failed callback, as the host path
            error = _compat.as_callback_runtime_error(exc)
            if error is None:
                raise
            raise error from exc
        return [_host_value(o) for o in outs]

    def segments(self):
        yield self


@dataclasses.dataclass(frozen=True, eq=False)
class Speculated:
    """An equation holding guarded callbacks, run in MAX (`juju.speculation`):
    `fun(*invals)` returns its outputs and the fired flag."""

    eqn: Any
    fun: Any

    @property
    def invars(self):
        return self.eqn.invars

    @property
    def outvars(self):
        return self.eqn.outvars


@dataclasses.dataclass
class Callback:
    eqn: Any

    def run(self, env):
        eqn = self.eqn
        impl = _compat.host_callback_impls[eqn.primitive]
        args = [_host_value(_read(env, v), v.aval) for v in eqn.invars]
        try:
            outs = list(impl(*args, **eqn.params))
            if len(outs) != len(eqn.outvars):
                raise TypeError(f"{eqn.primitive}: the callback returned {len(outs)} values, "
                                f"expected {len(eqn.outvars)} ({_compat.source_line(eqn)})")
            results = [_checked_result(eqn, i, var.aval, out)
                       for i, (var, out) in enumerate(zip(eqn.outvars, outs))]
        except Exception as exc:  # as under jax.jit: XLA's runtime error, caused by it
            raise _compat.callback_failed(exc) from exc
        env.update(zip(eqn.outvars, results))

    def segments(self):
        return iter(())


@dataclasses.dataclass
class While:
    eqn: Any
    cond: Plan
    body: Plan

    def run(self, env):
        cond_consts, body_consts, carry = _compat.while_operands(
            self.eqn.params, [_read(env, v) for v in self.eqn.invars])
        while _scalar(self.cond.run(cond_consts + carry)[0]):
            carry = self.body.run(body_consts + carry)
        env.update(zip(self.eqn.outvars, carry))

    def segments(self):
        yield from self.cond.segments()
        yield from self.body.segments()


@dataclasses.dataclass
class Scan:
    eqn: Any
    body: Plan

    def run(self, env):
        p = self.eqn.params
        consts, carry, xs = _compat.scan_operands(p, [_read(env, v) for v in self.eqn.invars])
        num_carry, xs = len(carry), [_host_value(x) for x in xs]
        length = p["length"]
        ys = [np.empty(v.aval.shape, _numpy_dtype(v.aval))  # (length, ...)
              for v in self.eqn.outvars[num_carry:]]
        for i in (reversed(range(length)) if p["reverse"] else range(length)):
            outs = self.body.run(consts + carry + [x[i] for x in xs])
            carry = outs[:num_carry]
            for stacked, y in zip(ys, outs[num_carry:]):
                stacked[i] = _host_value(y)
        env.update(zip(self.eqn.outvars, carry + ys))

    def segments(self):
        yield from self.body.segments()


@dataclasses.dataclass
class Cond:
    eqn: Any
    branches: list

    def run(self, env):
        index, *operands = [_read(env, v) for v in self.eqn.invars]
        chosen = min(max(int(_scalar(index)), 0), len(self.branches) - 1)
        env.update(zip(self.eqn.outvars, self.branches[chosen].run(operands)))

    def segments(self):
        for branch in self.branches:
            yield from branch.segments()


def plan(jaxpr, consts, segment_lowerer) -> Plan:
    """The Plan of an open `jaxpr`; `segment_lowerer(eqns, in_vars, out_vars,
    consts)` returns a segment's Lowered."""
    eqns = [_speculated(e) for e in jaxpr.eqns]
    outputs = {v for v in jaxpr.outvars if not isinstance(v, _compat.Literal)}
    # Device equations run as early as their inputs allow (they are pure), so
    # that the equations between two host steps make one graph, not several;
    # host steps keep their order (ordered effects, prints).
    available = {v for v in (*jaxpr.constvars, *jaxpr.invars)}
    known = dict(zip(jaxpr.constvars, consts))  # segments close over them
    ready = lambda e: all(isinstance(v, _compat.Literal) or v in available for v in e.invars)
    pending = list(range(len(eqns)))
    steps: list = []
    while pending:
        run, waiting = [], []
        for i in pending:
            if not _needs_host(eqns[i]) and ready(eqns[i]):
                run.append(i)
                available.update(eqns[i].outvars)
            else:
                waiting.append(i)
        _close_run(steps, [eqns[i] for i in run], outputs | _read_by(eqns, waiting),
                   segment_lowerer, known)
        # Then the host steps, in order, as long as their inputs are there
        # (the first one's are): independent callbacks share the segments
        # around them instead of each cutting the work once more.
        pending, blocked = [], False
        for i in waiting:
            if not blocked and _needs_host(eqns[i]) and ready(eqns[i]):
                steps.append(_host_step(eqns[i], segment_lowerer))
                available.update(eqns[i].outvars)
            else:
                blocked = blocked or _needs_host(eqns[i])
                pending.append(i)
    return Plan(jaxpr, list(consts), steps)


def _read_by(eqns, indices) -> set:
    return {v for i in indices for v in eqns[i].invars if not isinstance(v, _compat.Literal)}


def _close_run(steps, members, needed_later, segment_lowerer, known) -> None:
    """Append the Segment of device equations `members` (if any is needed);
    it closes over the values in `known` ({var: value}: the jaxpr's consts),
    not passed at each call."""
    if not members:
        return
    defined = {v for e in members for v in e.outvars}
    read = list(dict.fromkeys(
        v for e in members for v in e.invars
        if not isinstance(v, _compat.Literal) and v not in defined))
    in_vars = [v for v in read if v not in known]
    consts = {v: known[v] for v in read if v in known}
    out_vars = [v for e in members for v in e.outvars if v in needed_later]
    if out_vars:
        lowered = segment_lowerer(members, in_vars, out_vars, consts)
        steps.append(Segment(in_vars, out_vars, lowered, members, consts))


def _speculated(eqn):
    """`eqn`, or its Speculated form where its callbacks are all guarded."""
    if not eqn_has_callbacks(eqn) or is_callback(eqn.primitive):
        return eqn
    fun = speculation.speculative(eqn)
    return eqn if fun is None else Speculated(eqn, fun)


def _needs_host(eqn) -> bool:
    return not isinstance(eqn, Speculated) and eqn_has_callbacks(eqn)


def _sub_plan(closed_or_open, segment_lowerer) -> Plan:
    consts = getattr(closed_or_open, "consts", ())
    return plan(_compat.open_jaxpr(closed_or_open), consts, segment_lowerer)


def _host_step(eqn, segment_lowerer):
    name, p = eqn.primitive.name, eqn.params
    if is_callback(eqn.primitive):
        return Callback(eqn)
    if name == "while":
        return While(eqn, _sub_plan(p["cond_jaxpr"], segment_lowerer),
                     _sub_plan(p["body_jaxpr"], segment_lowerer))
    if name == "scan":
        return Scan(eqn, _sub_plan(p["jaxpr"], segment_lowerer))
    if name == "cond":
        return Cond(eqn, [_sub_plan(b, segment_lowerer) for b in p["branches"]])
    raise HostCallbackError(  # juju.callback_lifting leaves no other
        f"a host callback inside `{name}` is not supported by juju "
        f"({_compat.source_line(eqn)}). Move the callback out of it, or use jax.jit "
        "for this function.")


# --- values crossing between MAX and the host -------------------------------


def _numpy_dtype(aval):
    return np.dtype(aval.dtype)


def _scalar(value):
    """The Python scalar of a 0-d value (a MAX buffer read in place: ~0.1 us)."""
    if isinstance(value, max_driver().Buffer):
        return value.item()
    return np.asarray(value).item()


def _host_value(value, aval=None):
    """A host array of `value` (a MAX buffer is copied: a callback may keep it)."""
    if isinstance(value, max_driver().Buffer):
        return np.array(to_numpy(value))
    if aval is not None and isinstance(value, (bool, int, float, complex)):
        return np.asarray(value, _numpy_dtype(aval))
    if aval is not None and is_key_dtype(aval.dtype):
        return value
    return np.asarray(value)


def _checked_result(eqn, index, aval, out):
    """`out` canonicalised as jax's callback lowering does, with its checks."""
    array = np.asarray(out)
    array = array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False)
    if array.shape != tuple(aval.shape):
        raise HostCallbackResultError(
            f"Incorrect output shape for return value #{index}: Expected: {aval.shape}, "
            f"Actual: {array.shape} ({eqn.primitive} at {_compat.source_line(eqn)})")
    if array.dtype != _numpy_dtype(aval):
        raise HostCallbackResultError(
            f"Incorrect output dtype for return value #{index}: Expected: {aval.dtype}, "
            f"Actual: {array.dtype} ({eqn.primitive} at {_compat.source_line(eqn)})")
    return array


# --- the staged program as a Lowered / Executable -----------------------------


def _segment_function(eqns, in_vars, out_vars, consts):
    """A Python function evaluating `eqns` (as `jax.core.eval_jaxpr` does)
    over `consts` ({var: value}) and its arguments; a segment with Speculated
    equations also returns whether any fired."""
    def segment(*args):
        env = dict(consts)
        env.update(zip(in_vars, args))
        fired = None  # whether a speculated equation so far fired
        for eqn in eqns:
            invals = [_read(env, v) for v in eqn.invars]
            if isinstance(eqn, Speculated):
                *outs, flag = eqn.fun(*invals)
                fired = flag if fired is None else jnp.logical_or(fired, flag)
            else:  # after a fired branch, its loops must stop on the zeros
                outs = speculation.guarded(eqn, invals, fired)
            env.update(zip(eqn.outvars, outs))
        outs = [_read(env, v) for v in out_vars]
        return outs if fired is None else [*outs, fired]

    return segment


def build_plan(jit_function, closed_jaxpr) -> Plan:
    """The Plan of a jit function's traced program; its segments are lowered
    (not compiled) as juju.jit functions of the same engine."""

    owner = getattr(jit_function.fun, "__qualname__", "fn")
    count = [0]

    def lower_segment(eqns, in_vars, out_vars, consts):
        count[0] += 1
        fun = _segment_function(eqns, in_vars, out_vars, consts)
        fun.__name__ = fun.__qualname__ = f"{owner}.segment{count[0]}"
        fun.__wrapped__ = jit_function.fun  # logs name the user's source line
        # A JitFunction of the layer above, made through the one we were given.
        fn = type(jit_function)(fun, (), (), False, jit_function.engine, tiered=False,
                                compiler_options=dict(jit_function.compiler_options))
        specs = [jax.ShapeDtypeStruct(v.aval.shape, v.aval.dtype, weak_type=v.aval.weak_type)
                 for v in in_vars]
        return fn.lower(*specs)

    return plan(closed_jaxpr.jaxpr, closed_jaxpr.consts, lower_segment)


class StagedExecutable:
    """Runs a Plan and returns outputs as a one-graph Executable does: MAX
    buffers (jax arrays with `coerces_to_jnp`), never an argument's memory."""

    def __init__(self, program: Plan, out_tree, out_avals, coerces_to_jnp: bool):
        self.plan = program
        self.out_tree = out_tree
        self.out_avals = out_avals
        self.coerces_to_jnp = coerces_to_jnp
        self._keys = [is_key_dtype(a.dtype) for a in out_avals]  # read on every call

    def run(self, leaves):
        leaves = list(leaves)
        outs = self.plan.run(leaves)
        return tree_util.tree_unflatten(self.out_tree, [
            self._output(o, a, leaves, k) for o, a, k in zip(outs, self.out_avals, self._keys)])

    def _output(self, value, aval, leaves, is_key):
        if is_key:
            return value  # a jax key array (immutable)
        if isinstance(value, max_driver().Buffer) and all(value is not x for x in leaves):
            return to_jax(value) if self.coerces_to_jnp else value  # a segment's own result
        array = np.array(_host_value(value, aval), _numpy_dtype(aval))  # a fresh copy
        if self.coerces_to_jnp or is_complex_dtype(aval.dtype):
            return jnp.asarray(array)
        return host_buffer(array)


@dataclasses.dataclass
class StagedLowered(Lowered):
    """A program with host callbacks, traced for one signature: its MAX
    segments are lowered now and compiled together by `compile()` or
    `juju.compile_all`, in one MAX compilation with the other graphs."""

    plan: Plan = None
    tierable = False  # no XLA tier: the segments compile at the first call

    @property
    def parts(self) -> list:
        return [s.lowered for s in self.plan.segments()]

    @property
    def graph(self) -> list:
        """The MAX graph of each segment."""
        return [part.graph for part in self.parts]

    def build_graph(self, module=None) -> list:
        return [part.build_graph(module) for part in self.parts]

    def as_text(self) -> str:
        return "\n\n".join(f"// {part.name}\n{part.as_text()}" for part in self.parts)

    def explain(self) -> Explanation:
        """`Lowered.explain` for each segment's graph (paths `segmentN/...`,
        notes `segmentN: ...`), and a `"host"` choice for each step that
        runs in Python."""
        notes: list[str] = []
        return Explanation(_explain(self.plan, "", notes), notes)

    @property
    def notes(self) -> tuple[str, ...]:
        """Each segment's notes (`Lowered.notes`), as `segmentN: ...`."""
        return tuple(f"{_label(part)}: {note}" for part in self.parts for note in part.notes)

    def assemble(self):
        """The executable, once every part is compiled (in the jit caches)."""
        for segment in self.plan.segments():
            low = segment.lowered
            segment.executable = low.jit_function.executables[low.key]
        return StagedExecutable(self.plan, self.out_tree, self.closed_jaxpr.out_avals,
                                self.jit_function.coerces_to_jnp)


def _label(segment_lowered) -> str:
    return segment_lowered.jit_function.fun.__name__.rpartition(".")[2]  # "segment2"


def _explain(program: Plan, prefix: str, notes: list) -> list:
    index = {id(e): i for i, e in enumerate(program.jaxpr.eqns)}
    choices = []
    for step in program.steps:
        if isinstance(step, Segment):
            label = _label(step.lowered)
            explained = step.lowered.explain()
            choices += [dataclasses.replace(c, path=f"{prefix}{label}/{c.path}")
                        for c in explained]
            notes += [f"{prefix}{label}: {note}" for note in explained.notes]
            continue
        path = f"{prefix}{index[id(step.eqn)]}"
        choices.append(RuleChoice.of(path, step.eqn, None))
        if isinstance(step, While):
            inside = [("cond", step.cond), ("body", step.body)]
        elif isinstance(step, Cond):
            inside = [(f"branch{i}", branch) for i, branch in enumerate(step.branches)]
        else:  # Scan: a body; Callback: nothing
            inside = [("body", step.body)] if hasattr(step, "body") else []
        for label, sub in inside:
            choices += _explain(sub, f"{path}/{label}/", notes)
    return choices
