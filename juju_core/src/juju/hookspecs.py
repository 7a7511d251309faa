"""The hooks a juju pack implements.

A pack is a module (or object) with functions marked `@juju.hookimpl`,
advertised through one entry point in the group `juju`::

    [project.entry-points.juju]
    mypack = "mypack.plugin"

Every hook name starts with `juju_`. Packs are loaded on first use of juju
(`JUJU_PLUGINS` and `JUJU_BLOCK_PLUGINS` choose which; see `juju.plugins`).
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("juju")
"""Marks the hook specifications below (pluggy's `HookspecMarker`)."""

hookimpl = pluggy.HookimplMarker("juju")
"""Marks a pack's implementation of a hook: `@juju.hookimpl` over a function
named after the hook (pluggy's `HookimplMarker` for the project `juju`)."""


@hookspec
def juju_rules():
    """Return the lowering rules this pack provides.

    Returns an iterable whose items are `juju.Rule` objects or `juju.RuleSet`s
    (a `RuleSet` is itself an iterable of rules). Called once each time the
    registry is built: on first use of juju, and again after
    `juju.plugins.reload()`. juju records the pack's name and version on every
    rule it returns; a rule's `priority` decides between packs (see
    `juju.Priority`). Must not build MAX graphs or compile anything.
    """


@hookspec
def juju_kernel_libraries():
    """Return the Mojo kernel libraries this pack provides.

    Returns an iterable of `juju.KernelLibrary`. A rule that needs a library
    names it in `Rule.requires`; juju then adds the library's compiled
    `.mojoc` to every graph that uses the rule, calling `KernelLibrary.path()`
    (which may build the library) only then. Called with `juju_rules`.
    """


@hookspec
def juju_jaxpr_rewrites():
    """Return rewrite passes to run on every traced program before lowering.

    Returns an iterable of callables `rewrite(closed_jaxpr) -> closed_jaxpr`.
    A pass must return an equivalent program (same inputs and outputs), e.g.
    one where a multi-equation pattern (softmax, layer norm) is replaced by a
    single equation that a rule at `Priority.FUSED` lowers to a fused MAX op.
    Passes run in pack-name order, after tracing and before the rule check,
    once per traced signature. Collected with `juju_rules`.
    """


@hookspec
def juju_program_runners():
    """Return runners of whole programs that need no MAX graph.

    Returns an iterable of callables `runner(closed_jaxpr, engine)`. Before
    compiling a program's MAX graph, juju asks each runner in pack-name order
    (`juju.runners`); the first that returns a model, not None, runs the
    program instead of a MAX model. A model has `execute(*buffers)` taking
    the MAX buffers of the program's inputs (PRNG keys as their key data,
    complex numbers as float pairs on a last axis) and returning a list of
    new MAX buffers, one per output, on `engine.device` (never an input's
    memory: an output that is an input is a copy); it must compute
    what the program's graph would, and be safe to call from several threads
    at once. A runner returns None for any program it cannot run so, may
    build code (at compile time, in the compiling thread), and must not run
    the program. Collected with `juju_rules`.

    Optional: a runner may have `runner.prepare(closed_jaxprs, engine)`,
    which juju calls once with every program it is about to compile
    together (`juju.compile_all`), before asking for each one's model: a
    runner that builds code may build all of it at once there. A model may
    have `model.alias(pairs)`: given (argument, output) pairs of donated
    arguments, it returns those whose output it writes into that
    argument's buffer from then on, leaving that output out of its results
    (`juju.donation`).
    """
