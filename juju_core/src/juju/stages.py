"""The ahead-of-time objects, as jax's: `Lowered`, `Compiled`, `compile_all`.

A `Lowered` is a function traced and checked for one signature (its graph
built on demand); `compile_all` compiles many of them, one MAX compilation
per compile worker (`juju.loading`), and puts each executable in its
function's jit cache; a `Compiled` calls one. `load_executables` is what
every compile path (the first call, the tiered background, AOT) goes
through.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, replace
from typing import Any, Sequence

import jax
import numpy as np
from jax import tree_util

from juju import donation, plugins, tiers
from juju._compat import api_boundary, is_complex_dtype, is_key_dtype, key_impl
from juju.arguments import TracerSeen, input_nbytes, leaf_signature
from juju.compile_pool import max_building, register_exit_handler
from juju.donation import donated_leaves
from juju.dtypes import is_symbolic_dim
from juju.engine import Engine
from juju.executable import Executable
from juju.interpreter import build_graph
from juju.jit_options import merged_options
from juju.loading import load_models
from juju.logs import describe
from juju.recording import Explanation, recording
from juju.rewrites import notes_of
from juju.runners import direct_model, prepare_programs

@dataclass
class Lowered:
    """A function traced and checked for one signature; the graph is built on
    demand. `as_text()` shows the MAX graph, `compile()` loads it.

    Made by `JitFunction.lower`; the fields below are juju's bookkeeping.

    Attributes:
        jit_function: the `JitFunction` this lowering belongs to.
        key: its jit cache key (pytree structure, statics, signature,
            registry generation).
        closed_jaxpr: the program juju lowers: traced, dead code removed and
            the packs' rewrites applied.
        out_tree: the pytree structure of the outputs.
        in_dtypes: the dtype of each flat non-static argument.
        kernel_names: the kernel libraries the selected rules need.
        name: the MAX graph's name.
        traced_jaxpr: the program before juju's rewrites (what the XLA tier
            runs).
        donated: whether each flat argument is donated (empty: none is).
        aliases: (argument, result) pairs whose result takes the donated
            argument's memory (`juju.donation.alias_plan`).
        compiler_options: MAX compile options, sorted (name, value) pairs.
        tierable: whether XLA may serve calls while MAX compiles it.
    """

    jit_function: Any  # a juju.jit.JitFunction (the layer above)
    key: tuple
    closed_jaxpr: Any
    out_tree: Any
    in_dtypes: list
    kernel_names: frozenset
    name: str
    traced_jaxpr: Any = None  # before juju's rewrites: what the XLA tier runs (tiers.py)
    donated: tuple = ()
    aliases: tuple = ()
    compiler_options: tuple = ()
    tierable = True  # XLA may serve while MAX compiles (host.StagedLowered may not)

    @property
    def parts(self) -> list:
        """The graphs MAX compiles for this function: itself."""
        return [self]

    def assemble(self):
        """The executable, once `parts` are compiled (in the jit caches)."""
        return self.jit_function.executables[self.key]

    @property
    def in_tree(self):
        """The pytree structure of the non-static `(args, kwargs)`, as jax's."""
        return self.key[0]

    @property
    def args_info(self):
        """`jax.stages.ArgInfo` (shape, dtype, donated) of each non-static
        argument, in the pytree of `(args, kwargs)`, as jax's."""
        return args_info(self.in_tree, self.closed_jaxpr.in_avals, self.donated)

    @property
    def out_info(self):
        """`jax.ShapeDtypeStruct` of each output, in the output pytree, as jax's."""
        return tree_util.tree_unflatten(self.out_tree, structs(self.closed_jaxpr.out_avals))

    def cost_analysis(self) -> None:
        """None: MAX reports no cost estimate for a graph (jax's XLA reports
        flops and bytes; MAX 26.7 exposes nothing comparable)."""

    @functools.cached_property
    def out_key_impls(self) -> tuple:
        """(output index, PRNG implementation) of each PRNG key output."""
        return tuple(
            (i, key_impl(aval))
            for i, aval in enumerate(self.closed_jaxpr.out_avals)
            if is_key_dtype(aval.dtype)
        )

    @functools.cached_property
    def out_complex(self) -> tuple:
        """(output index, dtype) of each complex output (float pairs in MAX)."""
        return tuple(
            (i, aval.dtype)
            for i, aval in enumerate(self.closed_jaxpr.out_avals)
            if is_complex_dtype(aval.dtype)
        )

    @functools.cached_property
    def kernel_paths(self) -> list:
        """The `.mojoc` files of `kernel_names`, built if needed."""
        return [plugins.kernel_library_path(n) for n in sorted(self.kernel_names)]

    def build_graph(self, module=None):
        """Lower `closed_jaxpr` to a new MAX graph (in `module`, a
        `max.graph.Module`, when given); `graph` keeps the one built first."""
        return build_graph(
            self.closed_jaxpr,
            name=self.name,
            registry=plugins.registry(),
            device=self.jit_function.engine.device_ref,
            kernel_paths=self.kernel_paths,
            libraries=self.kernel_names,
            module=module,
            aliases=self.stored,
        )

    @functools.cached_property
    def stored(self) -> tuple:
        """The `aliases` pairs the MAX graph stores in place
        (`juju.donation.stored_in_graph`)."""
        return donation.stored_in_graph(self.closed_jaxpr, self.aliases)

    @property
    def graph(self):
        """The MAX graph, built once (by one thread: see `juju.compile_pool.max_building`)."""
        graph = self.__dict__.get("_graph")
        if graph is None:
            with max_building():
                graph = self.__dict__.get("_graph")
                if graph is None:
                    graph = self.__dict__["_graph"] = self.build_graph()
        return graph

    def as_text(self) -> str:
        """The MAX graph's text (its MLIR)."""
        return str(self.graph)

    def explain(self) -> Explanation:
        """Which rule of which pack lowered each equation, and the packs'
        notes on the program: a `juju.Explanation` (see `juju.explain`).
        Builds the graph with the interpreter recording its choices;
        compiles nothing."""
        with max_building(), recording() as recorder:
            graph = self.build_graph()
        self.__dict__.setdefault("_graph", graph)
        return Explanation(recorder.choices(), self.notes)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the packs' rewrite passes said of the program (how they
        placed it: see `juju.Explanation`)."""
        return notes_of(self.closed_jaxpr)

    def compile(self, compiler_options: dict[str, Any] | None = None) -> "Compiled":
        """Compile (or load from the caches) and return the `Compiled`; to
        compile several in one MAX compilation, use `juju.compile_all`.
        `compiler_options` (as `juju.jit`'s) add to the function's own."""
        options = merged_options(self.compiler_options, compiler_options)
        if options != self.compiler_options:  # its own executable, beside the jit cache's
            return replace(self, key=(*self.key, options), compiler_options=options).compile()
        return compile_all([self])[0]


class Traced:
    """A function traced for one signature, as jax's `jax.stages.Traced`:
    the jaxpr, its argument and output types; `lower()` builds the MAX graph.

    Made by `JitFunction.trace`.

    Attributes:
        jit_function: the `JitFunction` it belongs to.
        jaxpr: the traced program (a `ClosedJaxpr`), before juju's rewrites.
        out_tree: the pytree structure of the outputs.
    """

    def __init__(self, jit_function, key, treedef, statics, avals, jaxpr, out_tree):
        self.jit_function = jit_function
        self.jaxpr = jaxpr
        self.out_tree = out_tree
        self._signature = (key, treedef, statics, avals)

    @property
    def fun_name(self) -> str:
        """The function's name."""
        return getattr(self.jit_function.fun, "__name__", "fn")

    @property
    def args_info(self):
        """`jax.stages.ArgInfo` of each non-static argument, as `Lowered.args_info`."""
        key, treedef, statics, _ = self._signature
        fn = self.jit_function
        donated = ()
        if fn.donate_argnums or fn.donate_argnames:
            donated = donated_leaves(treedef, statics, fn.donate_argnums, fn.donate_argnames)
        return args_info(treedef, self.jaxpr.in_avals, donated)

    @property
    def out_info(self):
        """`jax.ShapeDtypeStruct` of each output, in the output pytree."""
        return tree_util.tree_unflatten(self.out_tree, structs(self.jaxpr.out_avals))

    def lower(self) -> Lowered:
        """The `Lowered` of this trace (its rules checked, its graph built),
        as `JitFunction.lower` makes it; the jaxpr is not traced again."""
        lowered = self.jit_function.lower_traced(*self._signature, (self.jaxpr, self.out_tree))
        lowered.graph  # build now, so that rule failures surface here
        return lowered


def args_info(in_tree, avals, donated) -> Any:
    """`jax.stages.ArgInfo` per flat argument, in the pytree `in_tree`."""
    flags = donated or (False,) * len(avals)
    infos = [jax.stages.ArgInfo(aval, bool(d)) for aval, d in zip(avals, flags)]
    return tree_util.tree_unflatten(in_tree, infos)


class Compiled:
    """A loaded model for one signature. As jax's `Compiled`, it is called
    with the non-static arguments only, of the types it was compiled for
    (weak types aside); other types raise TypeError, never recompile.

    Made by `Lowered.compile` or `juju.compile_all`.

    Attributes:
        lowered: the `Lowered` it was compiled from.
        executable: the loaded MAX model and how to call it.
    """

    def __init__(self, lowered: Lowered, executable: Executable):
        self.lowered = lowered
        self.executable = executable

    @api_boundary
    def __call__(self, *args, **kwargs):
        lowered = self.lowered
        fn = lowered.jit_function
        leaves, treedef = tree_util.tree_flatten((args, kwargs))
        if treedef != lowered.in_tree:
            raise TypeError(
                f"juju.jit({fn.__name__}): Compiled function was compiled for arguments "
                f"with pytree structure {lowered.in_tree} but called with {treedef}. A "
                "Compiled object takes the non-static arguments only, as jax's does."
            )
        try:
            called = [leaf_signature(x) for x in leaves]
        except TracerSeen:
            raise TypeError(
                f"juju.jit({fn.__name__}): a Compiled object runs on concrete arrays; under "
                "a JAX transformation, call the juju.jit function itself."
            ) from None
        compiled = lowered.closed_jaxpr.in_avals
        if any(not _same_type(a, c) for a, c in zip(compiled, called)):
            names = _argument_names(fn, args, kwargs)
            mismatches = "\n".join(
                f"  Argument '{name}' compiled with {_type_str(a.shape, a.dtype)} and called "
                f"with {_type_str(c[0], c[1])}"
                for name, a, c in zip(names, compiled, called) if not _same_type(a, c)
            )
            raise TypeError(
                f"juju.jit({fn.__name__}): argument types differ from the types for which "
                "this computation was compiled (a Compiled object never recompiles: call "
                f"the juju.jit function for other types). The mismatches are:\n{mismatches}"
            )
        return self.executable.run(leaves)

    def as_text(self) -> str:
        """The MAX graph's text, as `Lowered.as_text`."""
        return self.lowered.as_text()

    @property
    def in_tree(self):
        """The pytree structure of the non-static `(args, kwargs)`."""
        return self.lowered.in_tree

    @property
    def out_tree(self):
        """The pytree structure of the outputs."""
        return self.lowered.out_tree

    @property
    def args_info(self):
        """As `Lowered.args_info`."""
        return self.lowered.args_info

    @property
    def out_info(self):
        """As `Lowered.out_info`."""
        return self.lowered.out_info

    def cost_analysis(self) -> None:
        """None, as `Lowered.cost_analysis`."""
        return self.lowered.cost_analysis()


def _same_type(aval, called) -> bool:
    shape, dtype, _ = called  # weak types may differ, as in jax
    return aval.dtype == dtype and len(aval.shape) == len(shape) and all(
        is_symbolic_dim(d) or d == n for d, n in zip(aval.shape, shape)
    )


def _type_str(shape, dtype) -> str:
    name = str(dtype) if is_key_dtype(dtype) else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


def _argument_names(fn, args, kwargs) -> list[str]:
    """A name per leaf of the non-static `(args, kwargs)`, as `x` or `params['w']`."""
    try:
        params = [p.name for p in inspect.signature(fn.fun).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    dynamic = [name for i, name in enumerate(params) if i not in fn.static_argnums]
    names = []
    for path, _ in tree_util.tree_flatten_with_path((args, kwargs))[0]:
        where, key, rest = path[0].idx, path[1], tree_util.keystr(path[2:])
        if where == 1:
            names.append(f"{key.key}{rest}")
        else:
            name = dynamic[key.idx] if key.idx < len(dynamic) else f"args[{key.idx}]"
            names.append(f"{name}{rest}")
    return names


def compile_all(lowered: Sequence[Lowered]) -> list[Compiled]:
    """Compile many lowered functions in one MAX compilation.

    MAX's cost is mostly per compilation, not per graph: compiling N graphs
    together costs little more than one. Graphs found in juju's persistent
    cache (`juju.cache`) are loaded from it instead. Each result is placed in
    its function's jit cache, so later calls with the same signature hit. A
    signature whose MAX compile already runs in the background (`tiered`)
    is waited for, not compiled twice.

    Args:
        lowered: `Lowered` objects from `juju.jit(f).lower(...)`, of any
            functions and engines (one compilation per engine).

    Returns:
        A `Compiled` for each, in order.

    Raises:
        CompileError: MAX failed to compile; the reason is in the message.
    """
    for low in lowered:
        tiers.wait(low.jit_function, {low.key})
    load_executables([part for low in lowered for part in low.parts])
    compiled = []
    for low in lowered:
        executable = low.jit_function.executables.get(low.key) or low.assemble()
        low.jit_function.executables[low.key] = executable
        compiled.append(Compiled(low, executable))
    return compiled


def load_executables(lowered: Sequence[Lowered]) -> list[Compiled]:
    """Compile (or load from the caches) each `Lowered` not yet in its jit
    cache, one MAX compilation per worker and engine, and put it there."""
    register_exit_handler()  # a pack's runner may build kernels (juju.runners)
    pending = [low for low in lowered if low.key not in low.jit_function.executables]
    models = {}  # index in pending -> its model; first those packs run (juju.runners)
    for engine in {low.jit_function.engine for low in pending} if len(pending) > 1 else ():
        prepare_programs([low.closed_jaxpr for low in pending
                          if low.jit_function.engine == engine], engine)
    for i, low in enumerate(pending):
        model = direct_model(low.closed_jaxpr, low.jit_function.engine)
        if model is not None:
            models[i] = model
    direct = set(models)  # their outputs are new buffers, never an input's
    with max_building():
        graphs = [None if i in models else low.graph  # built once (`Lowered.graph`)
                  for i, low in enumerate(pending)]
    by_engine: dict[Engine, list[int]] = {}
    for i, low in enumerate(pending):
        if i not in models:
            by_engine.setdefault(low.jit_function.engine, []).append(i)
    for engine, group in by_engine.items():
        loaded = load_models(engine, [graphs[i] for i in group],
                             [describe(pending[i].jit_function.fun) for i in group],
                             [pending[i].compiler_options for i in group])
        models.update(zip(group, loaded, strict=True))
    for i, model in sorted(models.items()):
        low = pending[i]
        fn = low.jit_function
        if low.key in fn.executables:  # compiled meanwhile by another thread
            continue
        fn.compile_count += 1
        fn.executables[low.key] = Executable(
            model, low.in_dtypes, low.out_tree, fn.coerces_to_jnp, fn.engine.device,
            low.out_key_impls, low.out_complex, input_nbytes(low.closed_jaxpr),
            fresh_outputs=i in direct, donated=low.aliases, name=describe(fn.fun),
            aliases=_taken(model, low.aliases) if i in direct else low.stored,
        )
        low.__dict__.pop("_graph", None)  # compiled: free the MLIR (built again on demand)
    return [Compiled(low, low.jit_function.executables[low.key]) for low in lowered]



def _taken(model, aliases) -> tuple:
    """The (argument, result) pairs a pack's model writes in place (`juju.runners`)."""
    if not aliases or not callable(getattr(model, "alias", None)):
        return ()
    return tuple(model.alias(aliases))


def structs(avals) -> list:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
