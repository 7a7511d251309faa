"""Engines: a MAX device plus the one inference session juju keeps for it.

MAX aborts the process if two sessions with different options coexist, and
loading a graph costs seconds, so sessions are shared process-wide, one per
device. Graphs are compiled elsewhere (`juju.compile_pool`, in worker
processes) and loaded with `Engine.load_mef`. Imports no jax: `juju.serving`
runs models through engines too.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass

from juju import compile_worker
from juju.errors import EngineUnavailableError

_sessions: dict[tuple[str, int], object] = {}
_session_lock = threading.Lock()


@dataclass(frozen=True)
class Engine:
    """Where juju runs graphs: a MAX device and the session that loads on it.

    Make one with `cpu_engine()` or `gpu_engine(index)` and pass it to
    `juju.jit(f, engine=...)`. Engines with the same kind and index share
    one MAX inference session per process.

    Attributes:
        kind: `"cpu"` or `"gpu"`.
        index: the device number (0 for the CPU).
    """

    kind: str = "cpu"
    index: int = 0

    @property
    def key(self) -> tuple[str, int]:
        """`(kind, index)`."""
        return (self.kind, self.index)

    @property
    def device(self):
        """The `max.driver.Device`."""
        return _device(self.kind, self.index)

    @property
    def device_ref(self):
        """The `max.graph.DeviceRef` graphs for this engine are built with."""
        from max.graph import DeviceRef

        return DeviceRef.CPU() if self.kind == "cpu" else DeviceRef.GPU(self.index)

    @property
    def session(self):
        """The process-wide `max.engine.InferenceSession` of this device,
        created on first use."""
        with _session_lock:
            session = _sessions.get(self.key)
            if session is None:
                from max import engine

                session = engine.InferenceSession(devices=[self.device])
                compile_worker.configure_session(session, self.kind)
                _sessions[self.key] = session
                # MAX's CPU workers exist from here on, whichever the device.
                lower_worker_priority()
            return session

    @property
    def description(self) -> str:
        """What compiled code depends on: device kind, model and host CPU,
        and for a GPU whether its matmuls are the vendor's
        (`JUJU_GPU_VENDOR_BLAS`)."""
        blas = ":vendor_blas" if self.kind != "cpu" and compile_worker.gpu_vendor_blas() else ""
        return f"{self.kind}:{self.index}:{_device_identity(self.device)}{blas}"

    def load_mef(self, path) -> list:
        """Models of an exported compilation (memoised per process)."""
        key = (self.key, str(path))
        models = _loaded_mefs.get(key)
        if models is None:
            models = list(self.session.load_all(str(path)).values())
            _loaded_mefs[key] = models
        return models


_loaded_mefs: dict[tuple, list] = {}


def module_of(graphs):
    """A `max.graph.Module` holding copies of `graphs` (each built in its own
    module), to compile them in one MAX compilation without lowering again."""
    from max import mlir
    from max.graph import Module

    module = Module()
    body = mlir.Operation._CAPICreate(module.mlir_module._CAPIPtr).regions[0].blocks[0]
    for graph in graphs:
        graph._mlir_op.clone(ip=mlir.InsertionPoint(body))
    return module


def _device_identity(device) -> str:
    parts = [str(device)]
    if getattr(device, "is_host", True):
        import platform

        parts.append(platform.machine())
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("model name", "flags")):
                        parts.append(line.split(":", 1)[1].strip())
                    if len(parts) >= 4:
                        break
        except OSError:
            pass
    else:
        parts.append(getattr(device, "architecture_name", ""))
        if os.environ.get(compile_worker.VIRTUAL_GPU_ENV):  # never mistaken for a real one
            parts.append("virtual")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


_devices: dict[tuple[str, int], object] = {}

#: The nice value juju gives MAX's CPU worker threads (`JUJU_MAX_WORKER_NICE`;
#: 0 leaves them alone). After each execute they spin ~200 us waiting for
#: more work; on a 2-core machine two spinning workers took the calling
#: thread's core, and a tiny graph's execute cost 45-57 us against 25-31 us
#: with the workers at nice 10-19 (a 512x512 matmul unchanged: the caller
#: sleeps while they work). MAX's own knob for the spin
#: (runtime.thread_busy_wait_time_us) aborts the process in 26.7: the graph
#: builder's context and the session's disagree on it.
_WORKER_NICE_DEFAULT = 10


_reniced: set[int] = set()  # worker thread ids already given the nice value
_renice_lock = threading.Lock()


def lower_worker_priority() -> None:
    """Give MAX's CPU worker threads that exist now the nice value
    (`JUJU_MAX_WORKER_NICE`). The session makes them; a native program's
    first parallel region does too, without one."""
    try:
        nice = int(os.environ.get("JUJU_MAX_WORKER_NICE", _WORKER_NICE_DEFAULT))
    except ValueError:
        nice = _WORKER_NICE_DEFAULT
    try:  # MAX's thread names are version-specific; serving without jax skips this
        from juju._compat import max_worker_thread_ids
    except ImportError:
        return
    if nice <= 0:
        return
    with _renice_lock:
        for tid in max_worker_thread_ids():
            if tid in _reniced:
                continue
            try:
                os.setpriority(os.PRIO_PROCESS, tid, nice)  # Linux: per thread
            except OSError:  # not permitted here: leave MAX as it is
                pass
            _reniced.add(tid)


def _device(kind: str, index: int):
    key = (kind, index)
    if key not in _devices:
        from max import driver

        if kind == "cpu":
            _devices[key] = driver.CPU()
        else:
            compile_worker.virtual_gpu(index + 1)
            count = driver.accelerator_count()
            if count <= index:
                raise EngineUnavailableError(
                    f"gpu_engine({index}) needs a GPU, but MAX sees {count} accelerator(s) "
                    "on this machine. Use cpu_engine(), or run on a machine with a "
                    "supported NVIDIA/AMD GPU."
                )
            _devices[key] = driver.Accelerator(index)
    return _devices[key]


def cpu_engine() -> Engine:
    """The host CPU: the engine `juju.jit` uses by default."""
    return Engine("cpu", 0)


def gpu_engine(index: int = 0) -> Engine:
    """GPU number `index` (NVIDIA or AMD, as MAX supports them).

    Args:
        index: the accelerator's number, from 0.

    With `JUJU_VIRTUAL_GPU` set (`sm_90a`, `cuda:sm_90a`), a machine without
    a GPU gets that one for compiling only: graphs lower, compile and load
    (`juju.jit(f, engine=gpu_engine()).lower(x).compile()`), calls fail. It
    checks which form a GPU graph takes without a GPU (docs/gpu.md).

    Raises:
        EngineUnavailableError: MAX sees no accelerator with that number on
            this machine (checked now, not at the first call).
    """
    engine = Engine("gpu", index)
    engine.device  # fail now, not at the first call
    return engine
