"""`juju.jit`: trace once per signature, lower to MAX, compile once, run fast.

The top layer (docs/architecture.md): `JitFunction`, `jit`, `make_max_graph`.
The cache key holds everything that changes the compiled graph: the pytree
structure, each leaf's shape, dtype and weak type, static argument values, the
engine and the registry generation. A hit neither re-traces nor re-lowers.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import re
import threading
from typing import Any, Callable, Iterable, Sequence

import jax
from jax import tree_util

from juju import call as _call  # registers juju_call_p and its rules
from juju import donation, host, plugins, tiers
from juju._compat import api_boundary, dce, hide_frames_under, is_tracer
from juju.arguments import TracerSeen, leaf_signature
from juju.dtypes import is_symbolic_dim
from juju.engine import Engine
from juju.interpreter import check_rules
from juju.jit_options import (UNSPECIFIED, check_shardings, checked_compiler_options,
                              checked_engine, engine_for)
from juju.logs import describe, explain_miss, log
from juju.polymorphic import symbolic_shapes
from juju.rewrites import apply_rewrites
from juju.executable import Executable
from juju.stages import Lowered, Traced, load_executables, structs
from juju.statics import resolve_donation, resolve_statics

_graph_ids = itertools.count()


# User errors raised through juju.jit show the user's frames, not juju's (as
# jax.jit's hide jax's; JAX_TRACEBACK_FILTERING=off shows every frame).
hide_frames_under(os.path.dirname(__file__))


class JitFunction:
    """The callable `juju.jit(f)` returns.

    Calling it runs `f` on MAX (see `juju.jit`); under a JAX transformation
    (`jax.grad`, `jax.vmap`, `jax.jit`) it binds a call primitive that JAX
    transforms and juju lowers. It carries `f`'s name and docstring, and
    works as a method.

    Attributes:
        fun: the wrapped function.
        engine: the `Engine` it runs on.
        static_argnums: positions of the static arguments (both options
            resolved against `f`'s signature).
        static_argnames: names of the static arguments.
        donate_argnums: positions of the donated arguments (resolved as above).
        donate_argnames: names of the donated arguments.
        inline: trace `f` into the caller's program under a JAX transformation.
        compiler_options: MAX compile options, as sorted (name, value) pairs.
        coerces_to_jnp: whether results are jax arrays.
        polymorphic_shapes: as given to `juju.jit`.
        tiered: as given to `juju.jit` (None: the default).
        trace_count: times `f` was traced (once per new signature).
        compile_count: MAX executables loaded for it.
        xla_call_count: calls the XLA tier served while MAX compiled.
        executables: the jit cache: signature key -> `Executable` (juju's
            own bookkeeping, filled by `juju.stages.load_executables`).
        background: signature key -> `juju.tiers.Background`, the MAX
            compiles the XLA tier serves meanwhile.
    """

    def __init__(self, fun, static_argnums, static_argnames, coerces_to_jnp, engine,
                 polymorphic_shapes=None, tiered=None, *, donate_argnums=None,
                 donate_argnames=None, inline=False, compiler_options=None):
        self.fun = fun
        self.tiered = tiered  # None: JUJU_TIERED, else by engine (tiers.enabled)
        self.background: dict[tuple, tiers.Background] = {}  # signatures MAX compiles
        self.coerces_to_jnp = coerces_to_jnp
        self.polymorphic_shapes = polymorphic_shapes
        # symbolic signature -> Executable, or _PER_SHAPE when it cannot be built
        self._symbolic: dict[tuple, Any] = {}
        self.engine = checked_engine(engine)
        self.static_argnums, self.static_argnames = resolve_statics(
            fun, static_argnums, static_argnames
        )
        self.donate_argnums, self.donate_argnames = resolve_donation(
            fun, donate_argnums, donate_argnames, (self.static_argnums, self.static_argnames))
        self.inline = bool(inline)
        self.compiler_options = checked_compiler_options(compiler_options)
        self._has_statics = bool(self.static_argnums or self.static_argnames)
        self.executables: dict[tuple, Executable] = {}
        self._lowered: dict[tuple, Lowered] = {}
        self._key_locks: dict[tuple, threading.RLock] = {}  # signature -> its first call's lock
        self._key_locks_guard = threading.Lock()
        self._last_key = None  # for the debug line explaining a cache miss
        self.trace_count = 0  # times traced to a Jaxpr (once per new signature)
        self.compile_count = 0  # executables loaded for this function
        self.xla_call_count = 0  # calls the XLA tier served (tiers.py)
        functools.update_wrapper(self, fun, updated=())
        # The user function's attributes, but never those of a wrapped
        # JitFunction: its options and caches are not this jit's (issue 19).
        user_fun = inspect.unwrap(fun, stop=lambda g: not isinstance(g, JitFunction))
        for name, value in getattr(user_fun, "__dict__", {}).items():
            self.__dict__.setdefault(name, value)

    def __repr__(self):
        return f"juju.jit({getattr(self.fun, '__qualname__', self.fun)})"

    def __get__(self, obj, objtype=None):  # support methods
        return self if obj is None else functools.partial(self, obj)

    def split_arguments(self, args, kwargs):
        """(dynamic args, dynamic kwargs, statics) of a call: the static
        arguments taken out, as (position or name, value) pairs."""
        statics = []
        dyn_args = []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                statics.append((i, a))
            else:
                dyn_args.append(a)
        dyn_kwargs = {}
        for k, v in kwargs.items():
            if k in self.static_argnames:
                statics.append((k, v))
            else:
                dyn_kwargs[k] = v
        statics = tuple(statics)
        try:
            hash(statics)
        except TypeError as exc:
            raise TypeError(
                f"juju.jit({self.__name__}): static arguments must be hashable, got "
                f"{[type(v).__name__ for _, v in statics]}"
            ) from exc
        return tuple(dyn_args), dyn_kwargs, statics

    @api_boundary
    def __call__(self, *args, **kwargs):
        if self._has_statics:
            dyn_args, dyn_kwargs, statics = self.split_arguments(args, kwargs)
        else:
            dyn_args, dyn_kwargs, statics = args, kwargs, ()
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        try:
            signature = tuple([leaf_signature(x) for x in leaves])
        except TracerSeen:
            # Under a JAX transformation, jax.jit or juju's own tracing: bind
            # juju_call (juju/call.py), which juju inlines and JAX transforms,
            # or (inline=True) trace the function into the caller's program.
            if self.inline:
                return self.fun(*args, **kwargs)
            return _call.call_traced(self, args, kwargs)
        key = (treedef, statics, signature, plugins.generation())
        executable = self.executables.get(key)
        if executable is None:
            if key not in self.background:
                self._explain_miss(key)
            return self._first_call(key, dyn_args, leaves)
        return executable.run(leaves)

    def _key_lock(self, key) -> threading.RLock:
        with self._key_locks_guard:
            lock = self._key_locks.get(key)
            if lock is None:
                lock = self._key_locks[key] = threading.RLock()
            return lock

    def _first_call(self, key, dyn_args, leaves):
        """Trace, lower and compile for a new signature, once: concurrent
        first calls with that signature wait for the first one's result. A
        tiered function answers from XLA while MAX compiles (tiers.py)."""
        treedef, statics, signature, _ = key
        with self._key_lock(key):
            executable = self.executables.get(key)
            if executable is None and self.polymorphic_shapes is not None:
                executable = self._symbolic_executable(key, dyn_args)
            if executable is None:
                lowered = self.lower_traced(key, treedef, statics, _avals(signature))
                if lowered.tierable and tiers.enabled(self):
                    return tiers.call(self, lowered, leaves, load_executables)
                lowered.compile()
                executable = self.executables[key]
        return executable.run(leaves)

    def _explain_miss(self, key):
        if log.isEnabledFor(logging.DEBUG):
            log.debug("juju: jit cache miss for %s: %s", describe(self.fun),
                      explain_miss(self._last_key, key))
        self._last_key = key

    def wait_compiled(self) -> None:
        """Wait until the MAX compiles started in the background (`tiered`)
        are loaded, so that every call from now on runs on MAX; raises what
        a compile raised. A benchmark or a deployment calls it after the
        first call (or uses `.lower(...).compile()`, which always compiles)."""
        tiers.wait(self)

    def _symbolic_executable(self, key, dyn_args):
        """The executable compiled once for `polymorphic_shapes`, now also
        cached under this call's concrete signature; None where the function
        cannot be lowered with symbolic dimensions (then: one per shape)."""
        treedef, statics, signature, _ = key
        shapes = symbolic_shapes(self, dyn_args, signature)
        symbolic = tuple((s, d, w) for s, (_, d, w) in zip(shapes, signature))
        skey = _cache_key(treedef, statics, symbolic)
        with self._key_lock(skey):  # concrete signatures of one symbolic one
            executable = self._symbolic.get(skey) or self.executables.get(skey)
            if executable is None:
                try:
                    lowered = self.lower_traced(skey, treedef, statics, _avals(symbolic))
                    lowered.graph  # rules that need static shapes fail here
                    executable = lowered.compile().executable
                except Exception as exc:  # noqa: BLE001  (any failure: compile per shape)
                    log.info("juju: %s: not lowered with symbolic shapes (%s); compiling for "
                             "each shape", getattr(self.fun, "__name__", "fn"),
                             str(exc).splitlines()[0][:200])
                    executable = _PER_SHAPE
                self._symbolic[skey] = executable
        if executable is _PER_SHAPE:
            return None
        self.executables[key] = executable
        return executable

    def eval_shape(self, *args, **kwargs):
        """The output pytree of `jax.ShapeDtypeStruct`s for these arguments
        (arrays or `jax.ShapeDtypeStruct`s), as `jax.jit(f).eval_shape`: a
        trace, no lowering, no compile."""
        dyn_args, dyn_kwargs, statics = self.split_arguments(args, kwargs)
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        if any(map(is_tracer, leaves)):  # under a JAX transformation
            avals = structs(map(jax.typeof, leaves))
        else:
            avals = _avals(tuple(map(leaf_signature, leaves)))
        closed, out_tree = self.trace_to_jaxpr(treedef, statics, avals)
        return tree_util.tree_unflatten(out_tree, structs(closed.out_avals))

    @api_boundary
    def trace(self, *args, **kwargs) -> Traced:
        """Trace for these arguments (arrays or jax.ShapeDtypeStruct), as
        `jax.jit(f).trace`: the `Traced` holds the jaxpr; `.lower()` goes on
        to the MAX graph. Checks no rule (lowering does)."""
        key, treedef, statics, avals = self._abstract(args, kwargs)
        traced = self.trace_to_jaxpr(treedef, statics, avals)
        return Traced(self, key, treedef, statics, avals, *traced)

    @api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and lower for these arguments (arrays or jax.ShapeDtypeStruct).

        Raises every lowering error now (`MissingRuleError`,
        `LoweringError`); compiling is left to `.compile()` or
        `juju.compile_all`.
        """
        lowered = self.lowered_for(args, kwargs)
        lowered.graph  # build now, so that rule failures surface here
        return lowered

    def lowered_for(self, args, kwargs) -> Lowered:
        """Traced and checked for these arguments; the graph not built yet."""
        return self.lower_traced(*self._abstract(args, kwargs))

    def _abstract(self, args, kwargs) -> tuple:
        """(jit cache key, treedef, statics, avals) of a call's arguments."""
        dyn_args, dyn_kwargs, statics = self.split_arguments(args, kwargs)
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        signature = tuple(map(leaf_signature, leaves))
        return _cache_key(treedef, statics, signature), treedef, statics, _avals(signature)

    def lower_traced(self, key, treedef, statics, avals, traced=None) -> Lowered:
        """The `Lowered` of a signature (`traced`: its (jaxpr, output tree)
        when already traced, by `trace`), made once whichever thread asks."""
        lowered = self._lowered.get(key)
        if lowered is not None:
            return lowered
        with self._key_lock(key):  # one trace per signature, whichever thread lowers
            lowered = self._lowered.get(key)
            if lowered is None:
                lowered = self._new_lowered(key, treedef, statics, avals, traced)
                self._lowered[key] = lowered
        return lowered

    def _new_lowered(self, key, treedef, statics, avals, traced=None) -> Lowered:
        traced, out_tree = traced or self.trace_to_jaxpr(treedef, statics, avals)
        traced = dce(traced)
        donated = ()
        if self.donate_argnums or self.donate_argnames:
            donated = donation.donated_leaves(treedef, statics, self.donate_argnums,
                                              self.donate_argnames)
        if host.has_callbacks(traced):  # staged: MAX graphs between host callbacks
            lifted = host.lift(traced)  # callbacks only at the top or in cond/while/scan
            donation.warn_unusable(traced, donated, (), stacklevel=5)  # no aliasing there
            return host.StagedLowered(
                jit_function=self, key=key, closed_jaxpr=lifted, out_tree=out_tree,
                in_dtypes=[a.dtype for a in avals], kernel_names=frozenset(),
                name=_graph_name(self.fun), traced_jaxpr=traced,
                plan=host.build_plan(self, lifted),
            )
        closed = apply_rewrites(traced, describe(self.fun))  # logs how packs placed it
        registry = plugins.registry()
        required = check_rules(closed, registry, self.engine.device_ref)
        aliases = donation.alias_plan(closed, donated)
        donation.warn_unusable(closed, donated, aliases, stacklevel=5)
        return Lowered(
            jit_function=self,
            key=key,
            closed_jaxpr=closed,
            out_tree=out_tree,
            in_dtypes=[a.dtype for a in avals],
            kernel_names=frozenset(required),
            name=_graph_name(self.fun),
            traced_jaxpr=traced,
            donated=donated,
            aliases=aliases,
            compiler_options=self.compiler_options,
        )

    def trace_to_jaxpr(self, treedef, statics, avals):
        """(ClosedJaxpr, output treedef) of the function on flat `avals`, with
        the static argument values put back in place."""
        static_positional = {i: v for i, v in statics if isinstance(i, int)}
        static_keywords = {k: v for k, v in statics if isinstance(k, str)}
        out_tree_box = []

        def flat_fun(*flat):
            a, kw = tree_util.tree_unflatten(treedef, flat)
            positional = list(a)
            for i in sorted(static_positional):
                positional.insert(i, static_positional[i])
            out_leaves, out_tree = tree_util.tree_flatten(
                self.fun(*positional, **kw, **static_keywords)
            )
            out_tree_box.append(out_tree)
            return out_leaves

        self.trace_count += 1
        closed = jax.make_jaxpr(flat_fun)(*avals)
        return closed, out_tree_box[-1]

    def clear_cache(self):
        """Forget every signature's trace and executable: the next call of
        each traces and lowers again (MAX's and juju's disk caches still
        spare the compile)."""
        self.background.clear()  # compiles in flight still finish; their results are kept
        self.executables.clear()
        self._lowered.clear()


_PER_SHAPE = object()  # marks a symbolic signature that could not be lowered


def _avals(signature) -> list:
    return [jax.ShapeDtypeStruct(s, d, weak_type=w) for s, d, w in signature]


def _cache_key(treedef, statics, signature) -> tuple:
    """The jit cache key; symbolic dimensions enter by name (those of
    different `jax.export` scopes do not compare)."""
    if any(is_symbolic_dim(d) for s, _, _ in signature for d in s):
        signature = tuple((tuple(str(d) for d in s), dt, w) for s, dt, w in signature)
    return (treedef, statics, signature, plugins.generation())


def _graph_name(fun) -> str:
    base = re.sub(r"\W", "_", getattr(fun, "__name__", "fn")) or "fn"
    return f"{base}_{next(_graph_ids)}"


def jit(
    f: Callable | None = None,
    /,
    *,
    in_shardings: Any = UNSPECIFIED,
    out_shardings: Any = UNSPECIFIED,
    static_argnums: int | Sequence[int] | None = None,
    static_argnames: str | Iterable[str] | None = None,
    donate_argnums: int | Sequence[int] | None = None,
    donate_argnames: str | Iterable[str] | None = None,
    keep_unused: bool = False,
    device: Any = None,
    backend: str | None = None,
    inline: bool = False,
    compiler_options: dict[str, Any] | None = None,
    coerces_to_jnp: bool = False,
    engine: Engine | None = None,
    polymorphic_shapes=None,
    tiered: bool | None = None,
):
    """Compile `f` with MAX. Usable as `@jit` or `@jit(static_argnums=...)`.

    The first call with a new signature (pytree structure, shapes, dtypes,
    weak types, static values) traces `f`, lowers it to a MAX graph and
    compiles it; later calls with that signature run the compiled model.
    Arguments may be numpy or jax arrays, Python scalars or MAX buffers, in
    any pytree, positional or keyword. Every parameter of `jax.jit` is
    taken, with jax's meaning on one device (`juju.jit_options`).

    Args:
        f: the function to compile, written in JAX. Omitted (`@jit(...)`),
            `jit` returns a decorator taking it.
        in_shardings: as `jax.jit`'s, on one device: None, or shardings
            (in a pytree) that place whole arrays on the engine's device;
            any other is refused (ValueError naming it).
        out_shardings: the same for the results.
        static_argnums: positions of arguments that are Python values rather
            than arrays (hashable; each new value compiles anew), as in
            `jax.jit`.
        static_argnames: names of such arguments, as in `jax.jit`; a
            parameter named in either is static under both.
        donate_argnums: positions of arguments whose memory the results
            may take, as in `jax.jit` (`juju.donation`): a donated jax array
            that a result uses is deleted after the call, a donated MAX
            buffer may be overwritten.
        donate_argnames: names of such arguments; a parameter named in
            either is donated under both.
        keep_unused: accepted: juju never prunes an unused argument (it
            stays a graph input), which is what True asks and False allows.
        device: the device to run on, a jax or MAX device of the host or
            of a GPU: picks the engine (`cpu_engine()` or `gpu_engine(i)`).
        backend: `"cpu"`, or `"gpu"` (also `"cuda"`, `"rocm"`): picks the
            engine; not with `device` (jax's ValueError).
        inline: under a JAX transformation (`jax.jit`, `grad`, `vmap`),
            trace `f` into the caller's program instead of a `juju_call`.
        compiler_options: MAX compile options (`juju.jit_options.MAX_OPTIONS`:
            `tile_based_fusion`); other names, XLA's included, are refused.
        coerces_to_jnp: return jax arrays instead of MAX buffers.
        engine: where to run; `cpu_engine()` when None. See `juju.Engine`.
        polymorphic_shapes: shape specs of the positional (non-static)
            arguments in `jax.export`'s syntax, e.g. `("b, ...", None)`:
            calls that differ only in the named dimensions share one MAX
            compile with symbolic dimensions. Where a rule needs static
            shapes, juju compiles per shape as without it (logged once). See
            the performance guide for the trade-off.
        tiered: on a new signature, run the calls through `jax.jit` (XLA)
            while MAX compiles in the background, then switch to MAX. None
            (the default) follows `JUJU_TIERED` (`0` or `1`), else is on for
            the CPU engine. False waits for MAX at the first call;
            `f.wait_compiled()` waits for the compiles in flight.

    Returns:
        A `JitFunction` (or, without `f`, a decorator making one). Its calls
        return MAX `Buffer`s (`.to_numpy()`, or `juju.to_numpy` for any
        dtype), or jax arrays with `coerces_to_jnp`, in the pytree `f`
        returned.

    Raises:
        TypeError: `f` is not callable, `engine` is not an `Engine`, or a
            static or donated argument number or name has the wrong type.
        ValueError: `static_argnums`/`static_argnames` (or the donate
            options) name no parameter of `f`, or an argument is both static
            and donated (checked now, as `jax.jit` does); `device` and
            `backend` both given, or shardings over other devices.
    """
    if f is None:  # every option as given, for the decorator
        return functools.partial(jit, **{k: v for k, v in locals().items() if k != "f"})
    if not callable(f):
        raise TypeError(f"juju.jit expects a callable, got {type(f).__name__}")
    engine = engine_for(engine, device, backend)
    check_shardings("in_shardings", in_shardings, engine)
    check_shardings("out_shardings", out_shardings, engine)
    return JitFunction(f, static_argnums, static_argnames, coerces_to_jnp, engine,
                       polymorphic_shapes, tiered, donate_argnums=donate_argnums,
                       donate_argnames=donate_argnames, inline=inline,
                       compiler_options=compiler_options)


def make_max_graph(f: Callable, *, engine: Engine | None = None, **jit_kwargs):
    """A function returning the MAX graph `f` lowers to for given arguments.

    `make_max_graph(f)(*args)` traces and lowers `f` for `args` (arrays or
    `jax.ShapeDtypeStruct`s) and returns the `max.graph.Graph`, without
    compiling it; `print` shows its text.

    Args:
        f: the function, written in JAX.
        engine: the device the graph is built for; `cpu_engine()` when None.
        **jit_kwargs: the other options of `juju.jit` (e.g. `static_argnums`).

    Raises:
        TypeError: `engine` is not an `Engine`.
        MissingRuleError: (at the call) equations no installed pack lowers.
        LoweringError: (at the call) a rule failed.
    """
    checked_engine(engine)  # fail here, not at the first call

    @functools.wraps(f)
    def build(*args, **kwargs):
        return jit(f, engine=engine, **jit_kwargs).lower(*args, **kwargs).graph

    return build


_call.install_jit(jit)  # juju_call (under jax.grad, vmap, jax.jit) runs through jit

__all__ = ["jit", "make_max_graph", "JitFunction"]
