"""Rules, rule sets (what a pack builds) and the registry (what the loop asks).

Selection is deterministic: rules for a primitive are tried in descending
priority; the first whose guard accepts the equation wins. Two packs that
register the same primitive at the same priority are an error, never a matter
of install order: the registry records the conflict when it is built and
raises it for any equation of that primitive, so programs that never use the
primitive still run.
"""

from __future__ import annotations

import functools
import hashlib
from collections import defaultdict
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Callable, Iterable, Mapping

import numpy as np

from juju import _compat
from juju.errors import RuleConflictError


class Priority(IntEnum):
    """Where a rule stands when several can lower the same primitive.

    The registry tries a primitive's rules from the highest priority down;
    the first whose guard accepts the equation wins. Any int works as a
    priority; these are the levels juju's own packs use.

    Attributes:
        FALLBACK: the core's rule for any primitive with a traceable JAX
            implementation (-100).
        GENERIC: structural rules and `juju-ops-lax` (0).
        FUSED: pattern-level rules onto MAX's fused ops, `juju-ops-nn` (100).
        KERNEL: hand-written kernels, `juju-kernels-mojo` (200).
        USER: rules of `juju.Primitive`s the user defines (300).
    """

    FALLBACK = -100  # the core's rule for any primitive with a traceable JAX implementation
    GENERIC = 0  # structural rules and juju-ops-lax
    FUSED = 100  # pattern-level rules onto MAX's fused ops (juju-ops-nn)
    KERNEL = 200  # hand-written kernels (juju-kernels-mojo)
    USER = 300  # juju.Primitive rules defined by the user


def priority_name(priority: int) -> str:
    """`KERNEL (200)`, or `250` between the named levels."""
    try:
        return f"{Priority(priority).name} ({int(priority)})"
    except ValueError:
        return str(int(priority))


class _AnyPrimitive:
    """The key of catch-all rules: tried for every primitive, after (or
    before, by priority) the primitive's own rules; their guard decides."""

    name = "*"

    def __repr__(self):
        return "ANY_PRIMITIVE"


ANY_PRIMITIVE = _AnyPrimitive()


class _AllDtypes:
    """`dtypes=ALL_DTYPES`: the rule takes every dtype, complex numbers and
    key arrays included, in their in-graph form (`juju.dtypes.physical_aval`:
    float[..., 2] for complex, uint32[..., words] for keys)."""

    def __repr__(self):
        return "ALL_DTYPES"


ALL_DTYPES = _AllDtypes()
"""`dtypes=ALL_DTYPES`: a rule that takes every dtype, complex numbers and PRNG
key arrays included, in their in-graph form (see `Rule`)."""


@functools.cache
def _is_native(dtype) -> bool:
    """A dtype MAX has: what a rule receives as itself."""
    return not (_compat.is_complex_dtype(dtype) or _compat.is_key_dtype(dtype))


def _dtypes_name(dtypes) -> str:
    return "all" if dtypes is ALL_DTYPES else "/".join(sorted(d.name for d in dtypes))


def _dtype_set(dtypes) -> frozenset | _AllDtypes | None:
    if dtypes is None or dtypes is ALL_DTYPES:
        return dtypes
    if isinstance(dtypes, (str, np.dtype, type)):
        dtypes = (dtypes,)
    return frozenset(np.dtype(d) for d in dtypes)


@dataclass(frozen=True)
class Rule:
    """A lowering rule: `fn(ctx, *operands, **params)` returns MAX value(s).

    Packs make rules with `RuleSet.register` or `RuleSet.elementwise` rather
    than directly. juju never selects a rule for an equation with a dtype the
    rule did not declare (see `dtypes`).

    Attributes:
        primitive: the JAX primitive the rule lowers.
        fn: `fn(ctx, *operands, **params)`: `ctx` is the
            `juju.LoweringContext`, operands are MAX `TensorValue`s, params
            the equation's parameters by name; returns a value, or a list of
            them for a primitive with multiple results.
        priority: decides between rules for one primitive (see `Priority`).
        guard: `guard(ctx) -> bool` (pure, on avals and params) narrows when
            the rule applies; None: always.
        requires: names of kernel libraries the lowering needs in the graph.
        pack: the pack that supplied it; the registry fills it in.
        pack_version: that pack's version; filled in likewise.
        dtypes: what the rule may receive, on every operand and result: None
            (the default) means every dtype MAX has (bool, integers, floats);
            a collection of dtypes means exactly those (list a complex dtype
            to opt in to it); `ALL_DTYPES` means everything, complex numbers
            and PRNG keys in their in-graph form (`juju.dtypes.physical_aval`).
    """

    primitive: object
    fn: Callable
    priority: int = Priority.GENERIC
    guard: Callable | None = None
    requires: tuple[str, ...] = ()
    pack: str = "unregistered"
    pack_version: str = "0"
    dtypes: frozenset | _AllDtypes | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtypes", _dtype_set(self.dtypes))

    @property
    def name(self) -> str:
        """The rule function's qualified name."""
        return getattr(self.fn, "__qualname__", repr(self.fn))

    def accepts(self, avals) -> bool:
        """Whether every aval's dtype is one this rule declared."""
        if self.dtypes is ALL_DTYPES:
            return True
        for aval in avals:
            dtype = getattr(aval, "dtype", None)
            if dtype is None:  # tokens
                continue
            if self.dtypes is None:
                if not _is_native(dtype):
                    return False
            elif _compat.is_key_dtype(dtype) or np.dtype(dtype) not in self.dtypes:
                return False  # (key arrays only with ALL_DTYPES)
        return True

    def describe(self) -> str:
        """One line for messages: name, pack, version, priority, dtypes, guard."""
        guard = f" if {getattr(self.guard, '__qualname__', 'guard')}" if self.guard else ""
        dtypes = "" if self.dtypes is None else f", dtypes {_dtypes_name(self.dtypes)}"
        return (
            f"{self.name} [{self.pack} {self.pack_version}, "
            f"priority {priority_name(self.priority)}{dtypes}{guard}]"
        )


_DEFAULT = object()


class RuleSet:
    """A collection of rules a pack returns from its `juju_rules` hook.

        rules = juju.RuleSet()

        @rules.register(lax.convert_element_type_p)
        def lower_convert_element_type(ctx, x, *, new_dtype, weak_type, sharding):
            return ops.cast(x, ctx.max_dtype(new_dtype))

        rules.elementwise({lax.add_p: ops.add, lax.sin_p: ops.sin})

    Args:
        rules: rules to start with.
        dtypes: the default `dtypes` of the rules `register` and
            `elementwise` add (see `Rule`).

    Attributes:
        dtypes: that default.
    """

    def __init__(self, rules: Iterable[Rule] = (), *, dtypes=None):
        self._rules: list[Rule] = list(rules)
        self.dtypes = dtypes

    def __iter__(self):
        return iter(self._rules)

    def __len__(self):
        return len(self._rules)

    def add(self, rule: Rule) -> Rule:
        """Add a `Rule` as it is; returns it."""
        self._rules.append(rule)
        return rule

    def register(
        self,
        *primitives,
        priority: int = Priority.GENERIC,
        guard: Callable | None = None,
        requires: tuple[str, ...] = (),
        dtypes=_DEFAULT,
    ):
        """Decorator: `@rules.register(lax.sin_p)` over `lower_sin(ctx, x, **params)`.

        The function is registered as it is (returned unchanged): operands
        positional, the equation's params as keyword arguments with their
        own names. A param that changes the result and that the rule does
        not support should raise `NotImplementedError` naming it.

        Args:
            *primitives: the JAX primitives the function lowers (one rule each).
            priority: see `Priority`.
            guard: `guard(ctx) -> bool`, pure, on `ctx`'s avals and params:
                the rule applies only where it returns True.
            requires: names of kernel libraries the lowering calls into.
            dtypes: what the rule accepts (see `Rule`); the set's default if omitted.
        """
        dtypes = self.dtypes if dtypes is _DEFAULT else dtypes

        def decorate(fn):
            for primitive in primitives:
                self.add(Rule(primitive, fn, priority, guard, tuple(requires), dtypes=dtypes))
            return fn

        return decorate

    def elementwise(self, table: Mapping, *, priority: int = Priority.GENERIC, dtypes=_DEFAULT):
        """Register 1:1 rules from `{primitive: max_op}` (see `direct`).

        Args:
            table: maps each JAX primitive to the MAX op applied to its
                operands.
            priority: see `Priority`.
            dtypes: what the rules accept (see `Rule`); the set's default if omitted.
        """
        dtypes = self.dtypes if dtypes is _DEFAULT else dtypes
        for primitive, op in table.items():
            self.add(Rule(primitive, direct(op), priority, dtypes=dtypes))


# Params that elementwise primitives carry without changing their result on MAX.
_NEUTRAL_PARAMS = {"accuracy": None}


def direct(op: Callable) -> Callable:
    """A rule applying a MAX op to the operands; rejects semantic params.

    `direct(ops.sin)` lowers an equation to `ops.sin(*operands)`. Params
    that do not change the result on MAX (`accuracy=None`) are accepted;
    any other raises `NotImplementedError` naming it and its value.
    """

    def lower_direct(ctx, *operands, **params):
        for name, value in params.items():
            if name not in _NEUTRAL_PARAMS or value != _NEUTRAL_PARAMS[name]:
                raise NotImplementedError(
                    f"{ctx.primitive.name}: parameter {name}={value!r} is not supported"
                )
        return op(*operands)

    lower_direct.__qualname__ = f"direct({getattr(op, '__name__', op)})"
    return lower_direct


class Registry:
    """The rules of all loaded packs, indexed by primitive.

    `juju.plugins.registry()` returns the process-wide one; the interpreter
    asks it for each equation's rule with `select`.

    Attributes:
        packs: the `juju.plugins.PackInfo` of each pack found.
        conflicts: primitive -> the message of its rule conflict (see
            `select`).
        fingerprint: a hash of every rule's primitive, pack, version,
            priority and name.
    """

    def __init__(self, rules: Iterable[Rule], packs: Iterable = ()):
        by_primitive: dict[object, list[Rule]] = defaultdict(list)
        for rule in rules:
            by_primitive[rule.primitive].append(rule)
        self._rules = {
            prim: tuple(sorted(found, key=lambda r: -r.priority))  # stable sort
            for prim, found in by_primitive.items()
        }
        self.packs = list(packs)
        self.conflicts: dict[object, str] = _find_conflicts(self._rules)
        self.fingerprint = _fingerprint(self._rules)
        self._catch_all = self._rules.pop(ANY_PRIMITIVE, ())
        self._candidates: dict[object, tuple[Rule, ...]] = {}

    def rules_for(self, primitive) -> tuple[Rule, ...]:
        """The rules registered for `primitive` itself, highest priority first."""
        return self._rules.get(primitive, ())

    def catch_all(self) -> tuple[Rule, ...]:
        """The rules registered for ANY_PRIMITIVE (the core's fallback)."""
        return self._catch_all

    def candidates(self, primitive) -> tuple[Rule, ...]:
        """What `select` tries for `primitive`: its rules and the catch-all
        ones, highest priority first (its own first at equal priority)."""
        found = self._candidates.get(primitive)
        if found is None:
            merged = self.rules_for(primitive) + self._catch_all
            found = self._candidates[primitive] = tuple(sorted(merged, key=lambda r: -r.priority))
        return found

    def primitives(self) -> list:
        """The primitives with rules of their own (not those only a catch-all lowers)."""
        return list(self._rules)

    def all_rules(self) -> list[Rule]:
        """Every rule, catch-all ones last."""
        return [r for rules in self._rules.values() for r in rules] + list(self._catch_all)

    def select(self, ctx, libraries: frozenset | None = None) -> Rule | None:
        """The winning rule for the equation in `ctx`, or None.

        With `libraries` (the kernel libraries a graph was built with), rules
        that need another library are passed over: equations that only appear
        while lowering (inside a decomposition) fall back to rules the graph
        can run, instead of calling a kernel it did not load. Rules that did
        not declare a dtype of the equation are passed over too. Raises
        RuleConflictError when packs conflict on the equation's primitive.
        """
        conflict = self.conflicts.get(ctx.eqn.primitive)
        if conflict is not None:
            raise RuleConflictError(conflict)
        avals = (*ctx.avals_in, *ctx.avals_out)
        for rule in self.candidates(ctx.eqn.primitive):
            if libraries is not None and not libraries.issuperset(rule.requires):
                continue
            if not rule.accepts(avals):
                continue
            if rule.guard is None or rule.guard(ctx):
                return rule
        return None

    def with_provenance(self) -> dict[str, list[Rule]]:
        """Every rule, by the name of the pack that supplied it."""
        by_pack: dict[str, list[Rule]] = defaultdict(list)
        for rule in self.all_rules():
            by_pack[rule.pack].append(rule)
        return dict(by_pack)


def stamp(rules: Iterable[Rule], pack: str, version: str) -> list[Rule]:
    """Rules with their provenance filled in."""
    return [replace(r, pack=pack, pack_version=version) for r in rules]


def _find_conflicts(rules: Mapping[object, tuple[Rule, ...]]) -> dict[object, str]:
    conflicts = {}
    for prim, found in rules.items():
        by_priority: dict[int, list[Rule]] = defaultdict(list)
        for rule in found:
            by_priority[int(rule.priority)].append(rule)
        for priority, same in by_priority.items():
            packs = sorted({r.pack for r in same})
            unguarded = [r for r in same if r.guard is None]
            if len(packs) > 1:
                conflicts[prim] = (
                    f"packs {' and '.join(repr(p) for p in packs)} both register a rule "
                    f"for primitive '{prim.name}' at priority {priority}: "
                    + "; ".join(r.describe() for r in same)
                    + ". Keep one of them with JUJU_PLUGINS=<packs to load>, block one "
                    "with JUJU_BLOCK_PLUGINS=<pack>, or give one a different priority."
                )
            elif len(unguarded) > 1:
                conflicts[prim] = (
                    f"pack '{packs[0]}' registers {len(unguarded)} unguarded rules for "
                    f"primitive '{prim.name}' at priority {priority}: "
                    + "; ".join(r.describe() for r in unguarded)
                    + f". Give all but one a guard, or block the pack with "
                    f"JUJU_BLOCK_PLUGINS={packs[0]}."
                )
            else:
                continue
            break
    return conflicts


def _fingerprint(rules: Mapping[object, tuple[Rule, ...]]) -> str:
    digest = hashlib.sha256()
    for prim in sorted(rules, key=lambda p: (p.name, id(p))):
        for r in rules[prim]:
            digest.update(f"{prim.name}|{r.pack}|{r.pack_version}|{r.priority}|{r.name};".encode())
    return digest.hexdigest()[:16]
