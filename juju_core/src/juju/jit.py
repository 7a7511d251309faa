"""`juju.jit`: trace once per signature, lower to MAX, compile once, run fast.

The cache key holds everything that changes the compiled graph: the pytree
structure, each leaf's shape, dtype and weak type, static argument values, the
engine and the registry generation. A hit neither re-traces nor re-lowers.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import math
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax import tree_util

from juju import plugins, tiers
from juju.compile_pool import max_building
from juju import call as _call  # registers juju_call_p and its rules
from juju._compat import (
    PRNGKeyArray,
    api_boundary,
    hide_frames_under,
    Tracer,
    canonical_dtype,
    dce,
    is_complex_dtype,
    is_key_dtype,
    is_tracer,
    key_impl,
    python_scalar_dtype,
)
from juju.dtypes import (
    complex_from_parts,
    complex_parts,
    is_symbolic_dim,
    max_dtype,
    numpy_dtype,
    physical_aval,
)
from juju.engine import Engine, cpu_engine
from juju.errors import JujuError
from juju.explain import recording
from juju.interpreter import build_graph, check_rules
from juju.loading import load_models
from juju.logs import describe, explain_miss, log
from juju.rewrites import apply_rewrites

_graph_ids = itertools.count()


# User errors raised through juju.jit show the user's frames, not juju's (as
# jax.jit's hide jax's; JAX_TRACEBACK_FILTERING=off shows every frame).
hide_frames_under(os.path.dirname(__file__))


# --- leaves: signature and conversion to MAX buffers -------------------------


def _signature(leaf) -> tuple:
    """(shape, dtype, weak_type) as jax.jit would see this argument."""
    handler = _SIGNATURES.get(type(leaf))
    if handler is None:
        handler = _signature_handler(type(leaf))
    return handler(leaf)


def _numpy_signature(leaf):
    return (leaf.shape, canonical_dtype(leaf.dtype), False)


def _scalar_signature(leaf):
    return ((), python_scalar_dtype(leaf), True)


def _bool_signature(leaf):  # JAX never weakly types bools
    return ((), _BOOL, False)


_BOOL = np.dtype(np.bool_)


def _jax_signature(leaf):
    return (leaf.shape, leaf.dtype, leaf.weak_type)


def _keys_signature(leaf):
    return (leaf.shape, leaf.dtype, False)


def _generic_signature(leaf):
    return ((), canonical_dtype(leaf.dtype), False)


def _buffer_signature(leaf):
    return (tuple(leaf.shape), numpy_dtype(leaf.dtype), False)


def _spec_signature(leaf):
    if is_key_dtype(leaf.dtype):  # a jax.ShapeDtypeStruct of PRNG keys
        return (tuple(leaf.shape), leaf.dtype, False)
    return (tuple(leaf.shape), canonical_dtype(leaf.dtype), bool(leaf.weak_type))


_SIGNATURES: dict = {np.ndarray: _numpy_signature}
for _t in (int, float, complex):
    _SIGNATURES[_t] = _scalar_signature
_SIGNATURES[bool] = _bool_signature


def _signature_handler(kind):
    """Find (and remember) how to read the signature of a leaf type."""
    from max.driver import Buffer

    if issubclass(kind, Tracer):
        raise _TracerSeen
    if issubclass(kind, np.ndarray):
        handler = _numpy_signature
    elif issubclass(kind, PRNGKeyArray):
        handler = _keys_signature
    elif issubclass(kind, jax.Array):
        handler = _jax_signature
    elif issubclass(kind, np.generic):
        handler = _generic_signature
    elif issubclass(kind, Buffer):
        handler = _buffer_signature
    elif issubclass(kind, jax.ShapeDtypeStruct):  # ahead-of-time lowering
        handler = _spec_signature
    else:
        raise TypeError(
            f"juju.jit: argument of type {kind.__name__} is not an array; pass arrays, "
            "Python scalars or MAX buffers, or mark the argument static with "
            "static_argnums/static_argnames."
        )
    _SIGNATURES[kind] = handler
    return handler


class _TracerSeen(Exception):
    """A leaf is a JAX tracer: the call happens under a JAX transformation."""


def _buffer_from_buffer(leaf, dtype, device):
    return leaf if leaf.device == device else leaf.to(device)


# jax arrays up to this size go through a numpy copy: faster than DLPack for
# small arrays (jax's __dlpack__ costs ~17 us, a small copy ~1 us).
_SMALL_BYTES = 1 << 16


def _buffer_from_jax(leaf, dtype, device):
    if leaf.dtype.kind == "c":  # DLPack would carry a dtype MAX lacks
        return _buffer_from_array(leaf, leaf.dtype, device)
    if math.prod(leaf.shape) * leaf.dtype.itemsize <= _SMALL_BYTES:  # jax's nbytes is slow
        buffer = _host_buffer(np.array(leaf, order="C"))
    else:
        try:
            buffer = _max_driver().Buffer.from_dlpack(leaf)  # zero-copy
        except Exception:  # dtypes DLPack cannot carry: go through numpy
            buffer = _host_buffer(np.array(leaf, order="C"))
    return buffer if buffer.device == device else buffer.to(device)


def _buffer_from_array(leaf, dtype, device):
    array = np.asarray(leaf)
    if array.dtype != dtype:
        array = array.astype(dtype)  # as jax.jit does, e.g. float64 without x64
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C")  # keeps 0-d arrays 0-d
    buffer = _host_buffer(array)  # zero-copy
    return buffer if buffer.device == device else buffer.to(device)


def _host_buffer(array: np.ndarray):
    """A MAX buffer viewing a contiguous, writable numpy array."""
    Buffer = _max_driver().Buffer
    try:
        # Buffer.from_numpy re-checks what we know and costs ~3 us more. It
        # also fails on 0-d bools (its view needs a last axis); numpy cannot
        # export bools through DLPack, so they travel as uint8 views.
        if array.dtype.kind == "c":  # as float[..., 2] (dtypes.physical_aval)
            return Buffer._from_dlpack(complex_parts(array))
        if array.dtype == np.bool_ or array.dtype.kind == "V":  # bool, bfloat16, float8
            carrier = array.view(_UINT_OF_SIZE[array.dtype.itemsize])
            return Buffer._from_dlpack(carrier).view(max_dtype(array.dtype), array.shape)
        return Buffer._from_dlpack(array)
    except AttributeError:  # a MAX without the native constructor
        return Buffer.from_numpy(array)


_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@functools.cache
def _max_driver():
    from max import driver

    return driver


try:  # the address of a buffer's memory (private in MAX 26.7, hence the guard)
    from max.driver import Buffer as _Buffer

    _data_ptr = _Buffer._data_ptr
except (ImportError, AttributeError):
    _data_ptr = None


def _buffer_from_scalar(leaf, dtype, device):
    buffer = _host_buffer(np.array(leaf, dtype))
    return buffer if buffer.device == device else buffer.to(device)


def _buffer_from_keys(leaf, dtype, device):
    """A PRNG key array travels as its raw key data (see dtypes.physical_aval)."""
    return _buffer_from_jax(jax.random.key_data(leaf), None, device)


def _converter(kind):
    from max.driver import Buffer

    if issubclass(kind, Buffer):
        return _buffer_from_buffer
    if issubclass(kind, PRNGKeyArray):
        return _buffer_from_keys
    if issubclass(kind, jax.Array):
        return _buffer_from_jax
    if kind in (int, float, bool, complex):
        return _buffer_from_scalar
    return _buffer_from_array


_CONVERTERS: dict = {}


def _to_buffer(leaf, dtype, device):
    convert = _CONVERTERS.get(type(leaf))
    if convert is None:
        convert = _CONVERTERS[type(leaf)] = _converter(type(leaf))
    return convert(leaf, dtype, device)


# --- the compiled executable -------------------------------------------------


class Executable:
    """A loaded MAX model plus how to feed it and rebuild the output pytree."""

    def __init__(self, model, in_dtypes, out_tree, coerces_to_jnp, device, out_key_impls=(),
                 out_complex=(), in_nbytes=None):
        self.model = model
        self.in_nbytes = in_nbytes  # bytes of each input buffer; None: shapes vary
        self.out_key_impls = out_key_impls  # (output index, PRNG impl) of key outputs
        self.out_complex = out_complex  # (output index, complex dtype): float pairs in MAX
        self.in_dtypes = in_dtypes
        self.out_tree = out_tree
        self.coerces_to_jnp = coerces_to_jnp
        self.device = device
        # Model.execute's Python wrapper re-checks each input (type,
        # contiguity) at ~1 us per input; juju's buffers are contiguous MAX
        # buffers by construction, so call the native entry point directly.
        native = getattr(model, "_execute_device_tensors", None)
        self._execute = native if native is not None else lambda b: model.execute(*b)

    def run(self, leaves):
        device = self.device
        buffers = [_to_buffer(x, d, device) for x, d in zip(leaves, self.in_dtypes)]
        outs = self._execute(buffers)
        _unshare(outs, buffers, self.in_nbytes)
        if self.coerces_to_jnp:
            outs = _to_jax_all(outs)
        for i, impl in self.out_key_impls:
            data = outs[i] if self.coerces_to_jnp else to_jax(outs[i])  # already jax
            outs[i] = jax.random.wrap_key_data(data, impl=impl)
        for i, dtype in self.out_complex:
            outs[i] = jax.numpy.asarray(complex_from_parts(to_numpy(outs[i]), dtype))
        return tree_util.tree_unflatten(self.out_tree, outs)


def _unshare(outs: list, inputs: list, in_nbytes) -> None:
    """Copy each output that MAX handed back in an input's memory.

    MAX returns an input's own buffer, or a view into it, for outputs it can
    alias: identities, reshapes, slices, same-dtype casts and broadcasts, and
    ops it folds away (`x * 1.0`, `x + 0`). Inputs are zero-copy views of the
    caller's numpy and jax arrays, and results must not change when the
    caller writes into those (JAX arrays are immutable), so such outputs are
    copied; the others never are.
    """
    if _data_ptr is None:  # a MAX without the address accessor: copy all
        outs[:] = [o.copy() for o in outs]
        return
    if in_nbytes is None:
        in_nbytes = [b.num_elements * b.element_size for b in inputs]
    spans = [(_data_ptr(b), n) for b, n in zip(inputs, in_nbytes) if n]
    copied = None
    for i, out in enumerate(outs):
        address = _data_ptr(out)
        for start, size in spans:
            if start <= address < start + size:
                outs[i] = copied = out.copy()
                break
    if copied is not None:  # MAX copies asynchronously: done before the caller writes
        copied.device.synchronize()


def _input_nbytes(closed_jaxpr) -> tuple | None:
    """Bytes of each MAX input buffer of a graph; None if a shape is symbolic."""
    sizes = []
    for aval in closed_jaxpr.in_avals:
        physical = physical_aval(aval)
        if any(is_symbolic_dim(d) for d in physical.shape):
            return None
        sizes.append(math.prod(physical.shape) * np.dtype(physical.dtype).itemsize)
    return tuple(sizes)


def to_numpy(value) -> np.ndarray:
    """A numpy array of a MAX buffer (or anything array-like), any dtype.

    Unlike `Buffer.to_numpy()`, this also handles bfloat16 and float8, which
    MAX cannot export through DLPack.
    """
    Buffer = _max_driver().Buffer
    if not isinstance(value, Buffer):
        return np.asarray(value)
    dtype = numpy_dtype(value.dtype)
    if dtype.kind != "V":
        return value.to_numpy()
    carrier = _UINT_OF_SIZE[dtype.itemsize]
    return value.view(max_dtype(carrier), value.shape).to_numpy().view(dtype)


def to_jax(buffer):
    """A jax array of a MAX buffer: zero-copy where DLPack can carry the dtype
    and the buffer is in host memory (juju's jax runs on the CPU)."""
    if numpy_dtype(buffer.dtype).kind == "V" or not buffer.device.is_host:
        return jax.numpy.asarray(to_numpy(buffer))
    return jax.numpy.from_dlpack(buffer)


@functools.cache
def _identity():
    return jax.jit(lambda *arrays: arrays)


def _to_jax_all(buffers: list) -> list:
    """`to_jax` of each buffer. The small host ones go to jax together as
    numpy views through one call of a jitted identity: jax makes arrays from
    numpy in C++, ~5 us a call plus ~3 per array, where `jnp.from_dlpack`
    costs ~22 us an array."""
    small = {}
    for i, buffer in enumerate(buffers):
        if buffer.device.is_host and buffer.num_elements * buffer.element_size <= _SMALL_BYTES:
            view = to_numpy(buffer)
            # jax would narrow a 64-bit dtype without x64 (from_dlpack keeps it)
            if view.dtype.itemsize < 8 or jax.dtypes.canonicalize_dtype(view.dtype) == view.dtype:
                small[i] = view
    arrays = dict(zip(small, _identity()(*small.values()))) if small else {}
    return [arrays[i] if i in arrays else to_jax(b) for i, b in enumerate(buffers)]


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
        tierable: whether XLA may serve calls while MAX compiles it.
    """

    jit_function: "JitFunction"
    key: tuple
    closed_jaxpr: Any
    out_tree: Any
    in_dtypes: list
    kernel_names: frozenset
    name: str
    traced_jaxpr: Any = None  # before juju's rewrites: what the XLA tier runs (tiers.py)
    tierable = True  # XLA may serve while MAX compiles (host.StagedLowered may not)

    @property
    def parts(self) -> list:
        """The graphs MAX compiles for this function: itself."""
        return [self]

    def assemble(self):
        """The executable, once `parts` are compiled (in the jit caches)."""
        return self.jit_function._cache[self.key]

    @property
    def in_tree(self):
        """The pytree structure of the non-static `(args, kwargs)`, as jax's."""
        return self.key[0]

    @property
    def args_info(self):
        """`jax.stages.ArgInfo` (shape, dtype; never donated) of each non-static
        argument, in the pytree of `(args, kwargs)`, as jax's."""
        infos = [jax.stages.ArgInfo(aval, False) for aval in self.closed_jaxpr.in_avals]
        return tree_util.tree_unflatten(self.in_tree, infos)

    @property
    def out_info(self):
        """`jax.ShapeDtypeStruct` of each output, in the output pytree, as jax's."""
        return tree_util.tree_unflatten(self.out_tree, _structs(self.closed_jaxpr.out_avals))

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
        )

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

    def explain(self) -> list:
        """Which rule of which pack lowered each equation: a list of
        `juju.RuleChoice` (see `juju.explain`). Builds the graph with
        the interpreter recording its choices; compiles nothing."""
        with max_building(), recording() as recorder:
            graph = self.build_graph()
        self.__dict__.setdefault("_graph", graph)
        return recorder.choices()

    def compile(self) -> "Compiled":
        """Compile (or load from the caches) and return the `Compiled`; to
        compile several in one MAX compilation, use `juju.compile_all`."""
        return compile_all([self])[0]


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
            called = [_signature(x) for x in leaves]
        except _TracerSeen:
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


def _same_type(aval, signature) -> bool:
    shape, dtype, _ = signature  # weak types may differ, as in jax
    return aval.dtype == dtype and len(aval.shape) == len(shape) and all(
        is_symbolic_dim(d) or d == n for d, n in zip(aval.shape, shape)
    )


def _type_str(shape, dtype) -> str:
    name = str(dtype) if is_key_dtype(dtype) else np.dtype(dtype).name
    return f"{name}[{','.join(map(str, shape))}]"


def _argument_names(fn: JitFunction, args, kwargs) -> list[str]:
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
    _load_executables([part for low in lowered for part in low.parts])
    compiled = []
    for low in lowered:
        executable = low.jit_function._cache.get(low.key) or low.assemble()
        low.jit_function._cache[low.key] = executable
        compiled.append(Compiled(low, executable))
    return compiled


def _load_executables(lowered: Sequence[Lowered]) -> list[Compiled]:
    """Compile (or load from the caches) each `Lowered` not yet in its jit
    cache, one MAX compilation per worker and engine, and put it there."""
    with max_building():
        pending = [low for low in lowered if low.key not in low.jit_function._cache]
        graphs = [low.graph for low in pending]  # built once (`Lowered.graph`)
    by_engine: dict[Engine, list[int]] = {}
    for i, low in enumerate(pending):
        by_engine.setdefault(low.jit_function.engine, []).append(i)
    for engine, group in by_engine.items():
        models = load_models(engine, [graphs[i] for i in group],
                             [describe(pending[i].jit_function.fun) for i in group])
        for i, model in zip(group, models, strict=True):
            low = pending[i]
            fn = low.jit_function
            if low.key in fn._cache:  # compiled meanwhile by another thread
                continue
            fn.compile_count += 1
            fn._cache[low.key] = Executable(
                model, low.in_dtypes, low.out_tree, fn.coerces_to_jnp, engine.device,
                low.out_key_impls, low.out_complex, _input_nbytes(low.closed_jaxpr),
            )
            low.__dict__.pop("_graph", None)  # compiled: free the MLIR (built again on demand)
    return [Compiled(low, low.jit_function._cache[low.key]) for low in lowered]


# --- jit ---------------------------------------------------------------------


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
        coerces_to_jnp: whether results are jax arrays.
        polymorphic_shapes: as given to `juju.jit`.
        tiered: as given to `juju.jit` (None: the default).
        trace_count: times `f` was traced (once per new signature).
        compile_count: MAX executables loaded for it.
        xla_call_count: calls the XLA tier served while MAX compiled.
    """

    def __init__(self, fun, static_argnums, static_argnames, coerces_to_jnp, engine,
                 polymorphic_shapes=None, tiered=None):
        self.fun = fun
        self.tiered = tiered  # None: JUJU_TIERED, else by engine (tiers.enabled)
        self._background: dict[tuple, tiers.Background] = {}  # signatures MAX compiles
        self.coerces_to_jnp = coerces_to_jnp
        self.polymorphic_shapes = polymorphic_shapes
        # symbolic signature -> Executable, or _PER_SHAPE when it cannot be built
        self._symbolic: dict[tuple, Any] = {}
        self.engine = _checked_engine(engine)
        self.static_argnums, self.static_argnames = _resolve_statics(
            fun, static_argnums, static_argnames
        )
        self._has_statics = bool(self.static_argnums or self.static_argnames)
        self._cache: dict[tuple, Executable] = {}
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

    def _split(self, args, kwargs):
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
            dyn_args, dyn_kwargs, statics = self._split(args, kwargs)
        else:
            dyn_args, dyn_kwargs, statics = args, kwargs, ()
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        try:
            signature = tuple([_signature(x) for x in leaves])
        except _TracerSeen:
            # Under a JAX transformation, jax.jit or juju's own tracing: bind
            # juju_call (juju/call.py), which juju inlines and JAX transforms.
            return _call.call_traced(self, args, kwargs)
        key = (treedef, statics, signature, plugins.generation())
        executable = self._cache.get(key)
        if executable is None:
            if key not in self._background:
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
            executable = self._cache.get(key)
            if executable is None and self.polymorphic_shapes is not None:
                executable = self._symbolic_executable(key, dyn_args)
            if executable is None:
                lowered = self._lower(key, treedef, statics, _avals(signature))
                if lowered.tierable and tiers.enabled(self):
                    return tiers.call(self, lowered, leaves)
                lowered.compile()
                executable = self._cache[key]
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
        shapes = _symbolic_shapes(self, dyn_args, signature)
        symbolic = tuple((s, d, w) for s, (_, d, w) in zip(shapes, signature))
        skey = _cache_key(treedef, statics, symbolic)
        with self._key_lock(skey):  # concrete signatures of one symbolic one
            executable = self._symbolic.get(skey) or self._cache.get(skey)
            if executable is None:
                try:
                    lowered = self._lower(skey, treedef, statics, _avals(symbolic))
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
        self._cache[key] = executable
        return executable

    def eval_shape(self, *args, **kwargs):
        """The output pytree of `jax.ShapeDtypeStruct`s for these arguments
        (arrays or `jax.ShapeDtypeStruct`s), as `jax.jit(f).eval_shape`: a
        trace, no lowering, no compile."""
        dyn_args, dyn_kwargs, statics = self._split(args, kwargs)
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        if any(map(is_tracer, leaves)):  # under a JAX transformation
            avals = _structs(map(jax.typeof, leaves))
        else:
            avals = _avals(tuple(map(_signature, leaves)))
        closed, out_tree = self._trace_to_jaxpr(treedef, statics, avals)
        return tree_util.tree_unflatten(out_tree, _structs(closed.out_avals))

    @api_boundary
    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and lower for these arguments (arrays or jax.ShapeDtypeStruct).

        Raises every lowering error now (`MissingRuleError`,
        `LoweringError`); compiling is left to `.compile()` or
        `juju.compile_all`.
        """
        lowered = self._lowered_for(args, kwargs)
        lowered.graph  # build now, so that rule failures surface here
        return lowered

    def _lowered_for(self, args, kwargs) -> Lowered:
        """Traced and checked for these arguments; the graph not built yet."""
        dyn_args, dyn_kwargs, statics = self._split(args, kwargs)
        leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
        signature = tuple(map(_signature, leaves))
        key = _cache_key(treedef, statics, signature)
        return self._lower(key, treedef, statics, _avals(signature))

    def _lower(self, key, treedef, statics, avals) -> Lowered:
        lowered = self._lowered.get(key)
        if lowered is not None:
            return lowered
        with self._key_lock(key):  # one trace per signature, whichever thread lowers
            lowered = self._lowered.get(key)
            if lowered is None:
                lowered = self._lowered[key] = self._new_lowered(key, treedef, statics, avals)
        return lowered

    def _new_lowered(self, key, treedef, statics, avals) -> Lowered:
        traced, out_tree = self._trace_to_jaxpr(treedef, statics, avals)
        traced = dce(traced)
        from juju import host  # imports this module

        if host.has_callbacks(traced):  # staged: MAX graphs between host callbacks
            return host.StagedLowered(
                jit_function=self, key=key, closed_jaxpr=traced, out_tree=out_tree,
                in_dtypes=[a.dtype for a in avals], kernel_names=frozenset(),
                name=_graph_name(self.fun), traced_jaxpr=traced,
                plan=host.build_plan(self, traced),
            )
        closed = apply_rewrites(traced)  # dead code first: rewrites match cleaner
        registry = plugins.registry()
        required = check_rules(closed, registry, self.engine.device_ref)
        return Lowered(
            jit_function=self,
            key=key,
            closed_jaxpr=closed,
            out_tree=out_tree,
            in_dtypes=[a.dtype for a in avals],
            kernel_names=frozenset(required),
            name=_graph_name(self.fun),
            traced_jaxpr=traced,
        )

    def _trace_to_jaxpr(self, treedef, statics, avals):
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
        self._background.clear()  # compiles in flight still finish; their results are kept
        self._cache.clear()
        self._lowered.clear()


_PER_SHAPE = object()  # marks a symbolic signature that could not be lowered


def _structs(avals) -> list:
    return [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]


def _avals(signature) -> list:
    return [jax.ShapeDtypeStruct(s, d, weak_type=w) for s, d, w in signature]


def _cache_key(treedef, statics, signature) -> tuple:
    """The jit cache key; symbolic dimensions enter by name (those of
    different `jax.export` scopes do not compare)."""
    if any(is_symbolic_dim(d) for s, _, _ in signature for d in s):
        signature = tuple((tuple(str(d) for d in s), dt, w) for s, dt, w in signature)
    return (treedef, statics, signature, plugins.generation())


def _symbolic_shapes(fn: JitFunction, dyn_args, signature) -> list:
    """Each leaf's shape with the dimensions `polymorphic_shapes` names made
    symbolic (`jax.export.symbolic_args_specs`); checks the call agrees."""
    try:
        specs = tree_util.tree_leaves(
            jax.export.symbolic_args_specs(_arg_specs(dyn_args), fn.polymorphic_shapes))
    except Exception as exc:  # JAX's parse and shape checks
        raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes="
                         f"{fn.polymorphic_shapes!r} does not fit the arguments: {exc}") from exc
    shapes = [s.shape for s in specs] + [s for s, _, _ in signature[len(specs):]]
    bound: dict[str, int] = {}
    for shape, (concrete, _, _) in zip(shapes, signature):
        if len(shape) != len(concrete):
            raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes gives rank "
                             f"{len(shape)} for an argument of shape {concrete}")
        for d, n in zip(shape, concrete):
            if not is_symbolic_dim(d):  # constants: checked by jax.export above
                continue
            name = str(d)
            if d.get_vars() != {name}:
                raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes: use plain "
                                 f"dimension names, not '{d}'")
            if bound.setdefault(name, n) != n:
                raise ValueError(f"juju.jit({fn.__name__}): dimension '{name}' is "
                                 f"{bound[name]} in one argument and {n} in another")
    return shapes


def _arg_specs(dyn_args):
    return tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(*_signature(x)[:2]), dyn_args)


def _graph_name(fun) -> str:
    base = re.sub(r"\W", "_", getattr(fun, "__name__", "fn")) or "fn"
    return f"{base}_{next(_graph_ids)}"


def _checked_engine(engine) -> Engine:
    if engine is None:
        return cpu_engine()
    if isinstance(engine, Engine):
        return engine
    name = getattr(engine, "__name__", None)
    if callable(engine) and name:  # engine=juju.gpu_engine: the factory, not called
        got = f"the function {name}; call it: engine=juju.{name}()"
    else:
        got = f"{type(engine).__name__} {engine!r}"
    raise TypeError(
        f"juju.jit: engine must be a juju.Engine, such as juju.cpu_engine() or "
        f"juju.gpu_engine(0), got {got}"
    )


def _resolve_statics(fun, static_argnums, static_argnames):
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    static_argnums, static_argnames = tuple(static_argnums or ()), tuple(static_argnames or ())
    for n in static_argnums:
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"juju.jit: static_argnums must be ints, got {n!r}")
    for n in static_argnames:
        if not isinstance(n, str):
            raise TypeError(f"juju.jit: static_argnames must be strings, got {n!r}")
    nums, names = set(static_argnums), set(static_argnames)
    try:
        signature = inspect.signature(fun)
    except (TypeError, ValueError):  # some builtins: no check, as in jax
        signature = None
    params = list(signature.parameters.values()) if signature is not None else []
    if signature is not None:
        _validate_argnums(params, static_argnums)
        _validate_argnames(params, static_argnames)
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    resolved = set()
    for n in nums:
        if n < 0:
            if not positional:
                raise ValueError("negative static_argnums need an inspectable signature")
            n += len(positional)
        resolved.add(n)
        if 0 <= n < len(positional) and positional[n].kind is not positional[n].POSITIONAL_ONLY:
            names.add(positional[n].name)
    for i, p in enumerate(positional):
        if p.name in names:
            resolved.add(i)
    return frozenset(resolved), frozenset(names)


# jax.jit's checks and messages (jax/_src/api_util.py), so that code moving
# between jax.jit and juju.jit fails the same way.


def _validate_argnums(params, argnums) -> None:
    if any(p.kind is p.VAR_POSITIONAL for p in params):  # *args: any index
        return
    n_positional = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    if argnums and (-min(argnums) > n_positional or max(argnums) >= n_positional):
        raise ValueError(f"Jitted function has static_argnums={argnums}, "
                         f"but only accepts {n_positional} positional arguments.")


def _validate_argnames(params, argnames) -> None:
    positional_only = {p.name for p in params
                       if p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL)}
    if invalid := positional_only & set(argnames):
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         "in static_argnames. These are positional-only")
    if any(p.kind is p.VAR_KEYWORD for p in params):  # **kwargs: any name
        return
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if invalid := set(argnames) - keywords:
        raise ValueError(f"Jitted function has invalid argnames {invalid} "
                         "in static_argnames. Function does not take these args.")


def jit(
    f: Callable | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    static_argnames: str | Sequence[str] = (),
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
    any pytree, positional or keyword.

    Args:
        f: the function to compile, written in JAX. Omitted (`@jit(...)`),
            `jit` returns a decorator taking it.
        static_argnums: positions of arguments that are Python values rather
            than arrays (hashable; each new value compiles anew), as in
            `jax.jit`.
        static_argnames: names of such arguments, as in `jax.jit`; a
            parameter named in either is static under both.
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
            static argument number or name has the wrong type.
        ValueError: `static_argnums`/`static_argnames` name no parameter of
            `f` (checked now, as `jax.jit` does).
    """
    if f is None:
        return functools.partial(
            jit,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
            coerces_to_jnp=coerces_to_jnp,
            engine=engine,
            polymorphic_shapes=polymorphic_shapes,
            tiered=tiered,
        )
    if not callable(f):
        raise TypeError(f"juju.jit expects a callable, got {type(f).__name__}")
    return JitFunction(f, static_argnums, static_argnames, coerces_to_jnp, engine,
                       polymorphic_shapes, tiered)


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
    _checked_engine(engine)  # fail here, not at the first call

    @functools.wraps(f)
    def build(*args, **kwargs):
        return jit(f, engine=engine, **jit_kwargs).lower(*args, **kwargs).graph

    return build


__all__ = ["jit", "make_max_graph", "compile_all", "JitFunction", "Lowered", "Compiled", "JujuError"]
