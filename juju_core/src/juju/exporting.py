"""`juju.export`: a function as a MAX artifact that `max` alone can serve.

    exported = juju.export(predict, jax.ShapeDtypeStruct((32, 784), jnp.float32))
    exported.save("mlp.juju")
    # elsewhere, without jax:  juju.serving.load("mlp.juju")(batch)

The function is traced and lowered as `juju.jit` does (the same rules and
rewrites), for its engine. Large arrays it closes over (`WEIGHT_MIN_BYTES`
and up: a model's parameters) become graph inputs stored beside the graph as
weights, not constants compiled into it. The graph is compiled here, into
the artifact, for the engine's device; a machine with another device
compiles the saved graph text on load (`juju.serving`). The layout is
`juju.artifact`'s.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
from jax import tree_util

from juju import artifact, cache, compile_pool, plugins
from juju._compat import is_complex_dtype, is_key_dtype
from juju.buffers import complex_parts
from juju.compile_worker import module_text
from juju.dtypes import physical_aval
from juju.errors import ExportError
from juju.interpreter import build_graph
from juju.logs import describe, log

#: Closed-over arrays of at least this many bytes are stored as weights;
#: smaller ones stay constants in the graph, where MAX can fold them.
WEIGHT_MIN_BYTES = 1024


@dataclass
class Exported:
    """A function lowered and compiled for one signature, ready to `save`.

    Attributes:
        fun_name: the exported function's name.
        in_tree: the pytree structure of its non-static `(args, kwargs)`.
        out_tree: the pytree structure of its outputs.
        in_avals: shape and dtype of each flat input (symbolic dimensions
            where the export had them).
        out_avals: shape and dtype of each flat output.
        engine: the `juju.Engine` it was compiled for.
        weights: the closed-over arrays stored as weights (physical form).
        graph_text: the MAX graph's MLIR text.
        mef: the compiled model's bytes, or None where this machine could
            not compile for the engine (compiled on load instead).
        model_index: the model's position in `mef` (a MEF may hold several).
        kernels: the `.mojoc` kernel libraries the graph needs.
        input_paths: each flat input's name, as `x` or `params['w']`.
    """

    fun_name: str
    in_tree: object
    out_tree: object
    in_avals: list
    out_avals: list
    engine: object
    weights: list
    graph_text: str
    mef: bytes | None
    model_index: int
    kernels: list[Path]
    input_paths: list[str]
    _description: str = field(repr=False, default="")

    def save(self, path) -> Path:
        """Write the artifact folder (replacing an artifact already there);
        returns its path. `juju.serving.load(path)` loads it."""
        target = Path(path)
        if target.exists() and not (target / artifact.MANIFEST).is_file():
            if not target.is_dir() or any(target.iterdir()):
                raise FileExistsError(f"{target} exists and is not a juju artifact: "
                                      "choose a new path")
        target.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        try:
            self._write(scratch)
            if target.exists():
                shutil.rmtree(target)
            os.replace(scratch, target)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
        return target

    def _write(self, folder: Path) -> None:
        files = {}
        (folder / artifact.GRAPH).write_text(self.graph_text)
        files[artifact.GRAPH] = artifact.file_entry(folder / artifact.GRAPH)
        if self.mef is not None:
            (folder / artifact.MODEL).write_bytes(self.mef)
            files[artifact.MODEL] = artifact.file_entry(folder / artifact.MODEL)
        kernels = []
        for path in self.kernels:
            name = f"{artifact.KERNELS}/{Path(path).name}"
            (folder / artifact.KERNELS).mkdir(exist_ok=True)
            shutil.copyfile(path, folder / name)
            files[name] = artifact.file_entry(folder / name)
            kernels.append(name)
        weights = artifact.write_weights(folder / artifact.WEIGHTS, self.weights)
        if weights:
            files[artifact.WEIGHTS] = artifact.file_entry(folder / artifact.WEIGHTS)
        else:
            (folder / artifact.WEIGHTS).unlink()
        from juju import __version__

        artifact.write_manifest(folder, {
            "format": artifact.FORMAT, "format_version": artifact.FORMAT_VERSION,
            "juju_version": __version__, "max_version": artifact.max_version(),
            "function": self.fun_name,
            "engine": {"kind": self.engine.kind, "index": self.engine.index,
                       "description": self._description},
            "graph": artifact.GRAPH,
            "model": artifact.MODEL if self.mef is not None else None,
            "model_index": self.model_index,
            "kernels": kernels,
            "inputs": [dict(_aval_entry(a), path=p)
                       for a, p in zip(self.in_avals, self.input_paths)],
            "outputs": [_aval_entry(a) for a in self.out_avals],
            "in_tree": tree_spec(self.in_tree), "out_tree": tree_spec(self.out_tree),
            "weights": weights, "files": files,
        })


def export(fun, *args, **kwargs) -> Exported:
    """Lower and compile `fun` for these arguments into an `Exported`.

    Args:
        fun: a function, or a `juju.jit` function (its `engine`,
            `static_argnums`/`static_argnames` and `polymorphic_shapes`
            apply; a plain function is exported for the CPU).
        *args: example positional arguments: arrays, or
            `jax.ShapeDtypeStruct`s, symbolic shapes included
            (`jax.export.symbolic_shape`); static ones by value.
        **kwargs: example keyword arguments, as `args`.

    Raises:
        ExportError: `fun` calls back into Python (a host callback or
            `jax.debug.print`), which a served artifact cannot run.
        MissingRuleError, LoweringError, CompileError: as `juju.jit`.
    """
    from juju.host import StagedLowered
    from juju.jit import JitFunction, jit
    from juju.stages import _argument_names

    jitted = fun if isinstance(fun, JitFunction) else jit(fun, tiered=False)
    lowered = jitted.lowered_for(args, kwargs)
    name = describe(jitted.fun)
    if isinstance(lowered, StagedLowered):
        raise ExportError(
            f"juju.export({name}): the function calls back into Python (pure_callback, "
            "io_callback or jax.debug.print, maybe inside a library such as equinox's "
            "runtime checks); a served artifact runs without Python's jax. Remove the "
            "callbacks (for equinox: EQX_ON_ERROR=nan) and export again.")
    closed = lowered.closed_jaxpr
    weight_indices = [i for i, c in enumerate(closed.consts) if _nbytes(c) >= WEIGHT_MIN_BYTES]
    engine = jitted.engine
    with compile_pool.max_building():
        graph = build_graph(
            closed, name=lowered.name, registry=plugins.registry(), device=engine.device_ref,
            kernel_paths=lowered.kernel_paths, libraries=lowered.kernel_names,
            const_inputs=weight_indices)
        text = module_text(graph.module)
        kernels = sorted({Path(p) for p in graph.kernel_libraries_paths})
    mef, index = _compile(engine, graph, text, kernels, name)
    dyn_args, dyn_kwargs, _ = jitted.split_arguments(args, kwargs)
    return Exported(
        fun_name=name, in_tree=lowered.in_tree, out_tree=lowered.out_tree,
        in_avals=list(closed.in_avals), out_avals=list(closed.out_avals), engine=engine,
        weights=[_physical(closed.consts[i]) for i in weight_indices],
        graph_text=text, mef=mef, model_index=index, kernels=kernels,
        input_paths=_argument_names(jitted, dyn_args, dyn_kwargs),
        _description=_description(engine),
    )


def _description(engine) -> str:
    try:
        return engine.description
    except Exception:  # no such device here: the artifact is compiled on load
        return f"{engine.kind}:{engine.index}:unknown"


def _compile(engine, graph, text: str, kernels: list, name: str) -> tuple[bytes | None, int]:
    """The compiled model's bytes and index in its MEF file (from juju's
    cache, else compiled now), or (None, 0) where this machine has no such
    device: the artifact is then compiled where it is loaded."""
    try:
        key = cache.graph_key(graph, engine.description, kernels)
    except Exception as exc:  # EngineUnavailableError: e.g. a GPU export on a CPU host
        log.warning("juju.export(%s): no %s here (%s); the artifact will be "
                                 "compiled where it is loaded", name, engine.kind, exc)
        return None, 0
    hit = cache.lookup(key)
    if hit is not None:
        return hit[0].read_bytes(), hit[1]
    job = compile_pool.Job(text, tuple(str(k) for k in kernels), engine.key, name)
    mef = compile_pool.compile_jobs([job], lambda _device: engine.session)[0]
    try:
        data = mef.read_bytes()
        cache.store([key], mef)
    finally:
        mef.unlink(missing_ok=True)
    return data, 0


def _nbytes(value) -> int:
    shape = getattr(value, "shape", ())
    dtype = getattr(value, "dtype", None)
    if dtype is None or is_key_dtype(dtype):
        return int(np.prod(shape, dtype=np.int64)) * 8
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _physical(value) -> np.ndarray:
    """A closed-over array as the graph takes it (see `dtypes.physical_aval`)."""
    if is_key_dtype(value.dtype):
        return np.asarray(jax.random.key_data(value))
    array = np.asarray(value)
    return complex_parts(array) if array.dtype.kind == "c" else array


def _aval_entry(aval) -> dict:
    physical = physical_aval(aval)
    kind = ("key" if is_key_dtype(aval.dtype)
            else "complex" if is_complex_dtype(aval.dtype) else "array")
    return {"shape": _dims(aval.shape), "dtype": str(aval.dtype), "kind": kind,
            "weak_type": bool(getattr(aval, "weak_type", False)),
            "physical": {"shape": _dims(physical.shape), "dtype": np.dtype(physical.dtype).name}}


def _dims(shape) -> list:
    return [d if isinstance(d, int) else str(d) for d in shape]


# --- pytree structures as JSON (read by `juju.serving.flatten`/`unflatten`) ------


class _Leaf:
    """A placeholder leaf: rebuilds a treedef into an object to walk."""


_LEAF = _Leaf()


def tree_spec(treedef) -> dict:
    """A JSON description of a pytree structure, children in jax's order."""
    return _encode(tree_util.tree_unflatten(treedef, [_LEAF] * treedef.num_leaves))


def _encode(node) -> dict:
    if node is _LEAF:
        return {"t": "leaf"}
    if node is None:
        return {"t": "none"}
    pairs, _ = tree_util.tree_flatten_with_path(node, is_leaf=lambda x: x is not node)
    keys = [path[0] for path, _ in pairs]
    children = [_encode(child) for _, child in pairs]
    kind = type(node)
    if kind is tuple:
        return {"t": "tuple", "c": children}
    if kind is list:
        return {"t": "list", "c": children}
    if kind in (dict, collections.OrderedDict, collections.defaultdict):
        return {"t": "dict", "k": [_json_key(k.key) for k in keys], "c": children}
    if issubclass(kind, tuple) and hasattr(kind, "_fields"):
        return {"t": "namedtuple", "name": kind.__name__, "fields": list(kind._fields),
                "c": children}
    return {"t": "custom", "name": f"{kind.__module__}.{kind.__qualname__}",
            "k": [_custom_key(k) for k in keys], "c": children}


def _json_key(key):
    if isinstance(key, (str, int, float, bool)) or key is None:
        return key
    raise ExportError(f"juju.export: a dict key {key!r} of type {type(key).__name__} cannot "
                      "be stored; use str or int keys in the arguments and outputs")


def _custom_key(key) -> dict:
    if isinstance(key, tree_util.GetAttrKey):
        return {"attr": key.name}
    if isinstance(key, tree_util.DictKey):
        return {"key": _json_key(key.key)}
    if isinstance(key, tree_util.SequenceKey):
        return {"index": key.idx}
    return {"index": key.key}  # FlattenedIndexKey
