"""Serve an exported function with MAX alone: `serving.load(path)`.

Imports no jax (only numpy, `max` and juju's jax-free modules), so it runs
where juju-core is installed with `pip install --no-deps` next to `max`:

    from juju import serving
    predict = serving.load("mlp.juju")
    logits = predict(batch)              # numpy in, numpy out

The artifact (`juju.artifact`, written by `juju.export(f, ...).save(path)`)
is checked first; its compiled model is loaded when it was built for this
device and this MAX release, and otherwise its graph is compiled here, in a
worker process (`juju.compile_worker`: a compiler crash cannot end the
caller), and the result is kept in the artifact's `compiled/` folder.
"""

from __future__ import annotations

import collections
import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from juju import artifact, compile_worker
from juju.buffers import (
    complex_from_parts,
    complex_parts,
    host_buffer,
    max_driver,
    numpy_dtype_of,
    to_numpy,
    unshare,
)
from juju.engine import Engine
from juju.errors import (
    ArtifactError,
    CompileError,
    CompilerCrashError,
    InputMismatchError,
    UnsupportedDtypeError,
)
from juju.logs import log, progress


def load(path, *, device: str | None = None) -> "Served":
    """Load an exported function, ready to call.

    Args:
        path: the folder `Exported.save` wrote.
        device: `"cpu"`, `"gpu"` or `"gpu:N"`; default: the device kind it
            was exported for. A graph runs on the kind of device it was
            built for (export with `juju.jit(f, engine=juju.gpu_engine())`
            for a GPU).

    Raises:
        ArtifactError: a missing, truncated, corrupt or edited artifact.
        ArtifactVersionError: built for another MAX minor version, or a
            newer artifact format.
        EngineUnavailableError: the device is not on this machine.
        CompileError: compiling for this device failed.
    """
    manifest = artifact.read(path)
    engine = _engine(manifest, device)
    return Served(manifest, engine, _model(manifest, engine))


class Served:
    """An exported function loaded on a device: call it with numpy arrays
    (or MAX buffers, or Python scalars for scalar inputs) in the pytree it
    was exported with; it returns numpy arrays in the output pytree.

    Complex arrays go in and come out as complex numpy arrays; PRNG keys as
    their raw key data (`jax.random.key_data`), as numpy has no key dtype.

    Attributes:
        manifest: the artifact's checked manifest.
        engine: the device it runs on.
        name: the exported function's name.
    """

    def __init__(self, manifest: artifact.Manifest, engine: Engine, model):
        data = manifest.data
        self.manifest = manifest
        self.engine = engine
        self.name = data.get("function", "f")
        self._model = model
        self._inputs = data["inputs"]
        self._outputs = data["outputs"]
        self._in_tree = data["in_tree"]
        self._out_tree = data["out_tree"]
        device = engine.device
        self._weight_arrays = artifact.read_weights(manifest)  # kept alive: buffers view them
        self._weights = [_on(host_buffer(w), device) for w in self._weight_arrays]
        native = getattr(model, "_execute_device_tensors", None)
        self._execute = native if native is not None else lambda b: model.execute(*b)

    def __call__(self, *args, **kwargs):
        leaves = flatten((args, kwargs), self._in_tree, "arguments")
        if len(leaves) != len(self._inputs):  # a manifest and tree that disagree
            raise ArtifactError(f"{self.manifest.folder}: its input tree has {len(leaves)} "
                                f"leaves and its manifest {len(self._inputs)} inputs")
        sizes: dict = {}
        device = self.engine.device
        buffers = [_on(_to_buffer(x, spec, sizes, self._where(i)), device)
                   for i, (x, spec) in enumerate(zip(leaves, self._inputs))]
        outs = self._execute(buffers + self._weights)
        unshare(outs, buffers, None)
        results = [_from_buffer(b, spec) for b, spec in zip(outs, self._outputs)]
        return unflatten(self._out_tree, iter(results))

    def _where(self, index: int) -> str:
        return f"{self.name}: input {index} ({self._inputs[index].get('path', '?')})"

    def __repr__(self) -> str:
        return (f"<juju.serving.Served {self.name} from {self.manifest.folder} on "
                f"{self.engine.kind}:{self.engine.index}>")


# --- devices and models ---------------------------------------------------------


def _engine(manifest: artifact.Manifest, device: str | None) -> Engine:
    exported = manifest.data["engine"]
    kind, _, index = (device or exported["kind"]).partition(":")
    if kind != exported["kind"]:
        raise InputMismatchError(
            f"{manifest.folder} holds a graph built for {exported['kind']}, and cannot run on "
            f"{kind}: export it with an engine of that kind (juju.jit(f, engine=...))")
    return Engine(kind, int(index or 0))


def _model(manifest: artifact.Manifest, engine: Engine):
    exported = manifest.data["engine"]
    model = manifest.model
    if (model is not None and exported["description"] == engine.description
            and artifact.same_max(manifest.data["max_version"], artifact.max_version())):
        try:
            return engine.load_mef(model)[manifest.data.get("model_index", 0)]
        except Exception as exc:  # e.g. another build of the same release: compile instead
            log.warning("juju: %s: its compiled model does not load here (%s); compiling "
                        "its graph", manifest.folder, exc)
    compiled = _compiled_here(manifest, engine)
    return engine.load_mef(compiled)[0]


def _compiled_here(manifest: artifact.Manifest, engine: Engine) -> Path:
    """The graph compiled for `engine` with this MAX, in a worker process;
    kept in the artifact's `compiled/` folder when it may be written."""
    import hashlib

    tag = hashlib.sha256(f"{engine.description} {artifact.max_version()}".encode()).hexdigest()
    folder = manifest.path("compiled")
    target = folder / f"{tag[:24]}.mef"
    if target.is_file():
        return target
    try:
        folder.mkdir(exist_ok=True)
        scratch = Path(tempfile.mkstemp(dir=folder, suffix=".mef.tmp")[1])
    except OSError:  # a read-only artifact: compile into a temporary file every load
        target = scratch = Path(tempfile.mkstemp(suffix=".mef")[1])
    progress("juju: compiling %s for %s:%d with MAX (exported for %s)", manifest.folder,
             engine.kind, engine.index, manifest.data["engine"]["kind"])
    command = [sys.executable, "-P", compile_worker.__file__, "--graph",
               str(manifest.path(manifest.data["graph"])), "--device",
               f"{engine.kind}:{engine.index}", "--mef", str(scratch)]
    for kernel in manifest.kernels:
        command += ["--extension", str(kernel)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode < 0:
        raise CompilerCrashError(f"MAX's compiler died (signal {-done.returncode}) compiling "
                                 f"{manifest.folder}; this process is unaffected. Reproduce "
                                 f"with:\n  {' '.join(command)}\n{done.stderr[-2000:]}")
    if done.returncode != 0:
        raise CompileError(f"MAX failed to compile {manifest.folder} for {engine.kind}:"
                           f"{engine.index}: {done.stdout.strip() or done.stderr[-2000:]}")
    if scratch != target:
        os.replace(scratch, target)
    log.debug("juju: compiled %s into %s", manifest.folder, target)
    return target


def _on(buffer, device):
    return buffer if buffer.device == device else buffer.to(device)


# --- arguments and results --------------------------------------------------------


def _to_buffer(value, spec: dict, sizes: dict, where: str):
    """A MAX buffer of one argument, checked against its exported spec."""
    physical = spec["physical"]
    if isinstance(value, max_driver().Buffer):
        _check(where, spec, tuple(value.shape), value.dtype.name, sizes, physical)
        return value
    if isinstance(value, (bool, int, float, complex)) and not spec["shape"]:
        array = np.asarray(value, dtype=_numpy_dtype(spec["dtype"], where))
    else:
        array = np.asarray(value)
    if spec["kind"] == "key":  # raw key data, as jax.random.key_data gives it
        _check(where, spec, array.shape, array.dtype.name, sizes, physical)
    else:
        _check(where, spec, array.shape, array.dtype.name, sizes)
        if spec["kind"] == "complex":
            array = complex_parts(array)
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C")  # DLPack exports neither strides nor read-only
    return host_buffer(array)


def _check(where, spec, shape, dtype_name, sizes, physical=None) -> None:
    want = physical or spec
    if dtype_name != want["dtype"]:
        raise InputMismatchError(f"{where}: exported for dtype {want['dtype']}, called with "
                                 f"{dtype_name}; convert it (e.g. `x.astype(np.{want['dtype']})`)")
    if not _shape_matches(want["shape"], shape, sizes):
        raise InputMismatchError(f"{where}: exported for shape {_shape_text(want['shape'])}, "
                                 f"called with shape {tuple(shape)}")


def _shape_matches(dims: list, shape: tuple, sizes: dict) -> bool:
    """Whether `shape` fits `dims` (ints, or symbolic dimensions by name or
    expression); binds the names in `sizes`, shared by a call's arguments."""
    if len(dims) != len(shape):
        return False
    for dim, size in zip(dims, shape):
        if isinstance(dim, int):
            if dim != size:
                return False
        elif dim.isidentifier():
            if sizes.setdefault(dim, size) != size:
                return False
    for dim, size in zip(dims, shape):  # expressions, once every name is bound
        if isinstance(dim, str) and not dim.isidentifier():
            value = _evaluate(dim, sizes)
            if value is not None and value != size:
                return False
    return True


def _evaluate(expression: str, sizes: dict):
    scope = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b,
             "max": max, "min": min, **sizes}
    try:  # jax prints dimension expressions in Python syntax
        return int(eval(expression, {"__builtins__": {}}, scope))  # noqa: S307
    except Exception:  # a name bound by no argument: MAX checks it at execute
        return None


def _shape_text(dims) -> str:
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def _numpy_dtype(name: str, where: str) -> np.dtype:
    try:
        return numpy_dtype_of(name)
    except UnsupportedDtypeError as exc:
        raise UnsupportedDtypeError(f"{where}: {exc}") from exc


def _from_buffer(buffer, spec: dict) -> np.ndarray:
    if not buffer.device.is_host:
        buffer = buffer.to(max_driver().CPU())
    array = to_numpy(buffer)
    if spec["kind"] == "complex":
        return complex_from_parts(array, np.dtype(spec["dtype"]))
    return array


# --- pytrees, as `juju.exporting.tree_spec` writes them -------------------------------


def flatten(value, spec: dict, where: str, path: str = "") -> list:
    """The leaves of `value`, in jax's order, checked against `spec`."""
    kind = spec["t"]
    if kind == "leaf":
        return [value]
    if kind == "none":
        if value is not None:
            raise InputMismatchError(f"{where}{path}: expected None, got {type(value).__name__}")
        return []
    children = spec["c"]
    if kind == "dict":
        keys = spec["k"]
        if not isinstance(value, dict) or set(value) != set(keys):
            got = sorted(map(str, value)) if isinstance(value, dict) else type(value).__name__
            raise InputMismatchError(f"{where}{path}: expected a dict with keys "
                                     f"{sorted(map(str, keys))}, got {got}")
        items = [(f"[{k!r}]", value[k]) for k in keys]
    elif kind in ("tuple", "list", "namedtuple"):
        if not isinstance(value, (tuple, list)) or len(value) != len(children):
            raise InputMismatchError(
                f"{where}{path}: expected a {kind} of {len(children)}, got "
                + (f"{len(value)} items" if isinstance(value, (tuple, list))
                   else type(value).__name__))
        items = [(f"[{i}]", v) for i, v in enumerate(value)]
    else:  # a custom node: its children by attribute, key or index
        items = [(_key_text(key), _child(value, key, where + path)) for key in spec["k"]]
    leaves = []
    for (step, child), child_spec in zip(items, children):
        leaves += flatten(child, child_spec, where, path + step)
    return leaves


def _child(value, key: dict, where: str):
    try:
        if "attr" in key:
            return value[key["attr"]] if isinstance(value, dict) else getattr(value, key["attr"])
        return value[key.get("key", key.get("index"))]
    except (AttributeError, KeyError, IndexError, TypeError) as exc:
        raise InputMismatchError(f"{where}: has no {_key_text(key)} ({exc})") from None


def _key_text(key: dict) -> str:
    return f".{key['attr']}" if "attr" in key else f"[{key.get('key', key.get('index'))!r}]"


def unflatten(spec: dict, leaves):
    """The output pytree from an iterator of leaves. Custom nodes (a flax or
    equinox type, which this process may not have) come back as dicts."""
    kind = spec["t"]
    if kind == "leaf":
        return next(leaves)
    if kind == "none":
        return None
    children = [unflatten(c, leaves) for c in spec["c"]]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "namedtuple":
        return _namedtuple(spec["name"], tuple(spec["fields"]))(*children)
    if kind == "dict":
        return dict(zip(spec["k"], children))
    return {key.get("attr", key.get("key", key.get("index"))): child
            for key, child in zip(spec["k"], children)}


@functools.cache
def _namedtuple(name: str, fields: tuple):
    return collections.namedtuple(name, fields)
