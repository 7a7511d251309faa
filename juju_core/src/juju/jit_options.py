"""The rest of `jax.jit`'s options, with jax's meaning on juju's one device.

`juju.jit` takes every parameter of `jax.jit` (tests/test_jit_signature.py
compares the two signatures, so a new jax release's new option is noticed):

- `device` and `backend` choose the engine: a jax or MAX device of the host
  or of a GPU, `"cpu"`, `"gpu"` (`"cuda"`, `"rocm"`); both at once is jax's
  ValueError, and one that disagrees with `engine` is refused.
- `in_shardings` and `out_shardings` accept what places every array whole on
  the engine's device (None, a `SingleDeviceSharding` of it, any sharding
  over that device alone, a `PartitionSpec` that splits nothing); anything
  spread over devices is refused, naming it.
- `donate_argnums` and `donate_argnames` are resolved and checked as jax
  does (`juju.statics`); `juju.donation` gives them their effect.
- `compiler_options` are MAX's options of a compile (`MAX_OPTIONS`); any
  other, XLA's included, is refused by name.
- `keep_unused`: juju never prunes an argument (every one is a graph input),
  which is what `keep_unused=True` asks and what `False` allows.
- `inline`: honoured by `JitFunction.__call__`: under a JAX transformation
  the function is traced into the caller's jaxpr instead of a `juju_call`.
"""

from __future__ import annotations

from typing import Any

from jax import tree_util

from juju.engine import Engine, cpu_engine, gpu_engine

#: MAX's options of one compile (`InferenceSession.compile`'s keywords) and
#: the type of their value.
MAX_OPTIONS: dict[str, type] = {"tile_based_fusion": bool}

_GPU_BACKENDS = ("gpu", "cuda", "rocm")


class _Unspecified:
    """`in_shardings`/`out_shardings` not given (jax's `UnspecifiedValue`)."""

    def __repr__(self) -> str:
        return "UnspecifiedValue"


UNSPECIFIED = _Unspecified()


def checked_engine(engine) -> Engine:
    """`engine` as an `Engine` (None: the CPU); TypeError for anything else."""
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


def engine_for(engine, device, backend) -> Engine:
    """The engine `juju.jit`'s `engine`, `device` and `backend` choose."""
    if device is not None and backend is not None:
        raise ValueError("can't specify both a device and a backend for jit, got "
                         f"device={device!r} and backend={backend!r}")
    if device is None and backend is None:
        return checked_engine(engine)
    chosen = engine_of_device(device) if device is not None else _engine_of_backend(backend)
    if engine is not None and checked_engine(engine) != chosen:
        given = f"device={device!r}" if device is not None else f"backend={backend!r}"
        raise ValueError(f"juju.jit: engine={engine!r} and {given} name different devices; "
                         "pass one of them")
    return chosen


def engine_of_device(device) -> Engine:
    """The engine of a jax device, a MAX device or an `Engine`."""
    if isinstance(device, Engine):
        return device
    platform = getattr(device, "platform", None)  # a jax device
    if platform == "cpu":
        return cpu_engine()
    if platform in _GPU_BACKENDS:
        return gpu_engine(getattr(device, "local_hardware_id", None) or 0)
    if platform is None and hasattr(device, "is_host"):  # a max.driver device
        return cpu_engine() if device.is_host else gpu_engine(device.id)
    raise ValueError(f"juju.jit: device={device!r}: juju runs on MAX's CPU and GPU engines, "
                     "and this is neither; pass a CPU or GPU device, or engine=")


def _engine_of_backend(backend) -> Engine:
    if not isinstance(backend, str):
        raise TypeError(f"juju.jit: backend must be a string such as 'cpu' or 'gpu', "
                        f"got {type(backend).__name__} {backend!r}")
    if backend.lower() == "cpu":
        return cpu_engine()
    if backend.lower() in _GPU_BACKENDS:
        return gpu_engine(0)
    raise RuntimeError(f"Unknown backend: '{backend}' requested; juju runs on MAX's "
                       f"'cpu' and 'gpu' ({', '.join(_GPU_BACKENDS)}) engines")


def check_shardings(option: str, shardings, engine: Engine) -> None:
    """Accept `shardings` (a pytree prefix of the arguments or results) where
    every leaf places arrays whole on `engine`'s device; raise otherwise."""
    if shardings is UNSPECIFIED:
        return
    from jax.sharding import PartitionSpec, Sharding

    leaves = tree_util.tree_leaves(
        shardings, is_leaf=lambda x: x is None or isinstance(x, (Sharding, PartitionSpec)))
    for leaf in leaves:
        if leaf is None or leaf is UNSPECIFIED:
            continue
        if isinstance(leaf, PartitionSpec):
            if all(part is None for part in leaf):
                continue
            raise ValueError(f"juju.jit: {option}: {leaf!r} partitions arrays over a mesh's "
                             "axes; juju runs a function on one device. Pass None or "
                             "PartitionSpec() (whole arrays)")
        if isinstance(leaf, Sharding):
            _check_one_device(option, leaf, engine)
            continue
        raise TypeError(f"juju.jit: {option} takes jax.sharding.Sharding or PartitionSpec "
                        f"objects or None (in a pytree), got {type(leaf).__name__} {leaf!r}")


def _check_one_device(option: str, sharding, engine: Engine) -> None:
    devices = sharding.device_set
    if len(devices) != 1:
        raise ValueError(f"juju.jit: {option}: {sharding!r} spreads arrays over "
                         f"{len(devices)} devices; juju runs a function on one device "
                         f"(its engine, {engine}). Pass None or a SingleDeviceSharding")
    (device,) = devices
    try:
        where = engine_of_device(device)
    except ValueError:
        where = None
    if where != engine:
        raise ValueError(f"juju.jit: {option}: {sharding!r} places arrays on {device}, but "
                         f"the function runs on {engine}; pass device= or engine= for that "
                         "device, or a sharding of this one")


def checked_compiler_options(options) -> tuple:
    """`compiler_options` as sorted (name, value) pairs of `MAX_OPTIONS`."""
    if options is None:
        return ()
    if not isinstance(options, dict):
        raise TypeError(f"juju.jit: compiler_options must be a dict, got "
                        f"{type(options).__name__}")
    for name, value in options.items():
        kind = MAX_OPTIONS.get(name)
        if kind is None:
            known = ", ".join(sorted(MAX_OPTIONS))
            raise ValueError(
                f"juju.jit: compiler_options: MAX has no compile option {name!r} (juju passes "
                f"its options to MAX's compiler, not XLA's); MAX's are: {known}")
        if not isinstance(value, kind):
            raise TypeError(f"juju.jit: compiler_options[{name!r}] must be a "
                            f"{kind.__name__}, got {type(value).__name__} {value!r}")
    return tuple(sorted(options.items()))


def merged_options(base: tuple, extra: Any) -> tuple:
    """`base` with `extra` (a `compiler_options` dict) on top."""
    merged = dict(base)
    merged.update(checked_compiler_options(extra))
    return tuple(sorted(merged.items()))
