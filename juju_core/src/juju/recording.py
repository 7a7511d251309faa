"""What the interpreter loop selected for each equation: `RuleChoice`s, recorded
only while a `Recorder` is active (a context variable; `None` otherwise), so
lowering costs nothing more when nobody explains (`juju.explain`); `table`
prints them as `python -m juju explain` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass

from juju._compat import open_jaxpr, source_line
from juju.registry import ANY_PRIMITIVE, priority_name

__all__ = ["RuleChoice", "Explanation", "Recorder", "recording", "active_recorder", "table",
           "summary"]


@dataclass(frozen=True)
class RuleChoice:
    """How one equation of a program was lowered.

    Attributes:
        path: where the equation sits: its index in the program (`"3"`), or in
            a sub-jaxpr of the equation holding it, named after the param that
            holds it: `"3/cond/0"` and `"3/body/0"` in a while, `"3/branch1/0"`
            in a cond, `"3/body/0"` in a scan or a call (jit, custom_jvp, ...),
            `"3/impl/0"` in what a decomposition (`juju.lower_fun`) or the
            fallback traced. A program with host callbacks runs as several
            graphs: `"segment2/0"` is equation 0 of its second graph. The
            indices are those of the program juju lowers: after dead-code
            elimination and the packs' rewrites (e.g. juju-ops-nn's
            `nn_fused`), so they can differ from `jax.make_jaxpr`'s.
        primitive: the equation's primitive, by name.
        how: `"rule"` (a rule registered for the primitive), `"fallback"` (the
            core's catch-all: the primitive's own JAX implementation, traced
            into the graph) or `"host"` (a host callback, or the control flow
            around one, run in Python between MAX graphs: juju.host).
        rule: the rule's function, e.g. `lower_while` or `direct(sin)`; None
            for `"host"`.
        pack: the pack that registered the rule (`"core"` for juju's own);
            None for `"host"`.
        pack_version: that pack's version; None for `"host"`.
        priority: the rule's priority, e.g. `"GENERIC (0)"`; None for `"host"`.
        guard: the guard that accepted the equation, or None (no guard).
        source: the user's source line of the equation.
    """

    path: str
    primitive: str
    how: str
    rule: str | None
    pack: str | None
    pack_version: str | None
    priority: str | None
    guard: str | None
    source: str

    @property
    def depth(self) -> int:
        """How many sub-jaxprs deep the equation is (0: the program itself)."""
        return sum(not part.isdigit() for part in self.path.split("/"))

    @classmethod
    def of(cls, path: str, eqn, rule) -> "RuleChoice":
        """The choice of `rule` for `eqn`; `rule` None: a host step."""
        if rule is None:
            return cls(path, eqn.primitive.name, "host", None, None, None, None, None,
                       source_line(eqn))
        guard = getattr(rule.guard, "__qualname__", "guard") if rule.guard else None
        return cls(
            path, eqn.primitive.name,
            "fallback" if rule.primitive is ANY_PRIMITIVE else "rule",
            rule.name, rule.pack, rule.pack_version, priority_name(rule.priority), guard,
            source_line(eqn),
        )


class Explanation(list):
    """`juju.explain`'s answer: a list of `RuleChoice`s, one per equation.

    Attributes:
        notes: what the packs' rewrite passes said of the program, one line
            each (juju-kernels-mojo: "one generated kernel", or how many
            kernels and MAX ops, and every equation its generator refused,
            with the reason).
    """

    def __init__(self, choices=(), notes=()):
        super().__init__(choices)
        self.notes: tuple[str, ...] = tuple(notes)


class Recorder:
    """What the interpreter loop selected, by equation path, while active."""

    def __init__(self):
        self._choices: dict[str, RuleChoice] = {}
        self._prefix = ""  # the path of the sub-jaxpr being lowered, with its "/"

    def record(self, ctx, index: int, rule):
        """Note `rule` for `ctx`'s equation (the first time its path is
        lowered: a while's cond is lowered twice, an unrolled scan's body
        once per step); return `ctx` with a `lower` that names the sub-jaxprs
        the rule lowers."""
        path = f"{self._prefix}{index}"
        if path not in self._choices:
            self._choices[path] = RuleChoice.of(path, ctx.eqn, rule)
        lower = ctx.lower

        def lower_inside(jaxpr, *args, **kwargs):
            outer, self._prefix = self._prefix, f"{path}/{_label(ctx.eqn, jaxpr)}/"
            try:
                return lower(jaxpr, *args, **kwargs)
            finally:
                self._prefix = outer

        return dataclasses.replace(ctx, lower=lower_inside)

    def choices(self) -> list[RuleChoice]:
        return list(self._choices.values())


_recorder: ContextVar[Recorder | None] = ContextVar("juju_explain_recorder", default=None)


def active_recorder() -> Recorder | None:
    """The recorder of the `juju.explain` running in this context, or None."""
    return _recorder.get()


@contextlib.contextmanager
def recording():
    """Record the rules the interpreter selects in this block."""
    recorder = Recorder()
    token = _recorder.set(recorder)
    try:
        yield recorder
    finally:
        _recorder.reset(token)


# Sub-jaxprs by the param that holds them; any other param: its name without
# `_jaxpr`; a jaxpr in no param (a decomposition, the fallback): "impl".
_LABELS = {"cond_jaxpr": "cond", "body_jaxpr": "body", "jaxpr": "body",
           "call_jaxpr": "body", "fun_jaxpr": "body"}


def _label(eqn, jaxpr) -> str:
    target = open_jaxpr(jaxpr)
    for name, value in eqn.params.items():
        values = value if isinstance(value, (tuple, list)) else (value,)
        for i, held in enumerate(values):
            if open_jaxpr(held) is target:
                if name == "branches":
                    return f"branch{i}"
                return _LABELS.get(name, name.removesuffix("_jaxpr"))
    return "impl"


def summary(choices: list[RuleChoice]) -> str:
    """One line: how many equations each pack, the fallback and the host took."""
    by_pack: dict[str, int] = {}
    for c in choices:
        if c.how == "rule":
            by_pack[c.pack] = by_pack.get(c.pack, 0) + 1
    parts = [f"{len(choices)} equations; by pack: "
             + (", ".join(f"{p} {n}" for p, n in sorted(by_pack.items())) or "none")]
    fallback = sum(c.how == "fallback" for c in choices)
    host = sum(c.how == "host" for c in choices)
    if fallback:
        parts.append(f"{fallback} via their JAX implementation (the fallback)")
    if host:
        parts.append(f"{host} on the host (callbacks)")
    return "; ".join(parts)


def table(choices: list[RuleChoice]) -> str:
    """The choices as a table, sub-jaxprs indented, and a summary line."""
    rows = [("path", "primitive", "rule", "pack", "priority", "how")]
    for c in choices:
        how = {"rule": "rule", "fallback": "fallback: via its JAX implementation",
               "host": "host: runs in Python"}[c.how]
        if c.guard and c.how == "rule":
            how += f" (guard {c.guard})"
        pack = f"{c.pack} {c.pack_version}" if c.pack else "-"
        rows.append((c.path, "  " * c.depth + c.primitive, c.rule or "-", pack,
                     c.priority or "-", how))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[5]
             for row in rows]
    notes = list(getattr(choices, "notes", ()))
    return "\n".join([*lines, summary(choices), *notes])
