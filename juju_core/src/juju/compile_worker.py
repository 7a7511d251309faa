"""A MAX compile worker: compiles graphs from their MLIR text into MEF files.

MAX 26.7's graph compiler can crash the process that runs it (SIGSEGV on
some graphs), so juju never compiles in the user's process: `juju.compile_pool`
starts this file as a script in worker processes and sends it one request
per line on stdin; a crash ends the worker, not the caller. It imports only
the standard library and `max` (no jax, no juju), which keeps a worker's start
near 0.3 s.

Protocol: each request is one JSON line
`{"graph": PATH, "extensions": [PATH, ...], "device": [KIND, INDEX], "mef": PATH,
"options": {NAME: VALUE}}` (options: `InferenceSession.compile`'s keywords);
the worker compiles the module in PATH (MLIR text of one or more `mo.graph`s)
for the device, exports it to the MEF path and answers one JSON line:
`{"ok": true, "seconds": S}` or `{"ok": false, "error": REASON}`. It exits when
stdin closes, when its parent dies, or after `--idle` seconds without work.

Run by hand, it reproduces one compile (what a `CompileError` names):

    python .../juju/compile_worker.py --graph G.mlir --device cpu:0 [--extension K.mojoc]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import select
import signal
import sys
import tempfile
import threading
import time

_sessions: dict = {}


def module_text(module) -> str:
    """The MLIR text of a `max.graph.Module` (what a worker parses back).

    Printed through `max.mlir`, the MLIR copy that owns MAX's context: its
    float printing round-trips exactly (max/graph/graph.py, GEX-4052).
    """
    from max import mlir

    return str(mlir.Operation._CAPICreate(module.mlir_module._CAPIPtr))


def parse_module(text: str):
    """A `max.graph.Module` from `module_text`'s output, in MAX's default context."""
    from max._mlir_context import default_mlir_context
    from max.graph import Module
    from max.graph.graph import _parse_module_via_cmlir  # private in MAX 26.7

    return Module(_parse_module_via_cmlir(text, default_mlir_context()))


def compile_reason(exc: BaseException) -> str:
    """MAX's compile error with its chained causes (the real reason is often
    in `__cause__`), as one line."""
    parts = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc).strip()
        if text and text not in parts:
            parts.append(text)
        exc = exc.__cause__ or exc.__context__
    return " <- ".join(parts) or "unknown reason (see stderr)"


def compile_to_mef(session, text: str, extensions, mef_path: str, options=None) -> None:
    """Compile the module in `text` with `session` (and MAX's compile
    `options`, a dict) and export it to `mef_path`."""
    from max._mlir_context import ensure_default_mlir_context

    with ensure_default_mlir_context():
        module = parse_module(text)
        compiled = session.compile(module, custom_extensions=list(extensions) or None,
                                   **(options or {}))
    compiled.export_mef(mef_path)


VIRTUAL_GPU_ENV = "JUJU_VIRTUAL_GPU"


def virtual_gpu(count: int = 1) -> str | None:
    """Put MAX in virtual-device mode when `JUJU_VIRTUAL_GPU` names a GPU
    (`sm_90a`, `cuda:sm_90a`, `hip:gfx942`): on a machine without one,
    `driver.Accelerator(i)` is then that GPU for compiling only (a loaded
    model cannot run). Returns the architecture, or None when unset. The
    caller and its compile workers (which inherit the variable) agree."""
    value = os.environ.get(VIRTUAL_GPU_ENV, "").strip()
    if not value:
        return None
    api, _, arch = value.rpartition(":")
    from max import driver

    driver.set_virtual_device_api(api or "cuda")
    driver.set_virtual_device_target_arch(arch)
    driver.set_virtual_device_count(max(count, driver.get_virtual_device_count()))
    return arch


VENDOR_BLAS_ENV = "JUJU_GPU_VENDOR_BLAS"


def gpu_vendor_blas() -> bool:
    """Whether `JUJU_GPU_VENDOR_BLAS=1` asks for MAX's vendor-BLAS matmuls
    (cuBLAS, hipBLASLt) in GPU graphs: the `MODULE_USE_VENDOR_BLAS` define
    MAX's own serving sets with `MAX_SERVE_USE_VENDOR_BLAS`."""
    return os.environ.get(VENDOR_BLAS_ENV, "0").strip().lower() in ("1", "true", "on", "yes")


def configure_session(session, kind: str) -> None:
    """What a session compiling for `kind` is told beyond its device."""
    if kind != "cpu" and gpu_vendor_blas():
        session._use_vendor_blas("true")  # private in MAX 26.7; what max.pipelines calls


def _session(kind: str, index: int):
    session = _sessions.get((kind, index))
    if session is None:
        from max import driver, engine

        if kind != "cpu":
            virtual_gpu(index + 1)
        device = driver.CPU() if kind == "cpu" else driver.Accelerator(index)
        session = _sessions[(kind, index)] = engine.InferenceSession(devices=[device])
        configure_session(session, kind)
    return session


def _serve_one(request: dict) -> dict:
    start = time.perf_counter()
    try:
        with open(request["graph"]) as f:
            text = f.read()
        kind, index = request["device"]
        compile_to_mef(_session(kind, index), text, request["extensions"], request["mef"],
                       request.get("options"))
    except Exception as exc:  # noqa: BLE001  (a compile error goes back to the caller)
        return {"ok": False, "error": compile_reason(exc)}
    return {"ok": True, "seconds": time.perf_counter() - start}


def _exit_with_parent(parent: int) -> None:
    """End this worker when the process that started it is gone (a compile
    nobody waits for), even in the middle of a compile."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os._exit(0)


def serve(idle_seconds: float) -> None:
    """Answer requests from stdin until it closes or stays idle too long."""
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's: it ends us at exit
    out = sys.stdout
    stdin = sys.stdin
    while True:
        ready, _, _ = select.select([stdin], [], [], idle_seconds)
        if not ready:
            return  # idle: the caller starts a new worker when it needs one
        line = stdin.readline()
        if not line:
            return
        print(f"juju compile worker {os.getpid()}: request {line.strip()}", file=sys.stderr,
              flush=True)
        out.write(json.dumps(_serve_one(json.loads(line))) + "\n")
        out.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help="answer requests on stdin")
    parser.add_argument("--idle", type=float, default=300.0, help="seconds idle before exiting")
    parser.add_argument("--graph", help="MLIR text of the module to compile")
    parser.add_argument("--device", default="cpu:0", help="KIND:INDEX, e.g. cpu:0 or gpu:0")
    parser.add_argument("--extension", action="append", default=[], help="a .mojoc library")
    parser.add_argument("--mef", help="where to write the compiled MEF (default: nowhere)")
    args = parser.parse_args(argv)
    faulthandler.enable()  # a crash prints where, into the caller's worker log
    if args.serve:
        serve(args.idle)
        return 0
    if not args.graph:
        parser.error("--graph or --serve is required")
    kind, _, index = args.device.partition(":")
    with tempfile.TemporaryDirectory() as scratch:
        reply = _serve_one({"graph": args.graph, "extensions": args.extension,
                            "device": [kind, int(index or 0)],
                            "mef": args.mef or os.path.join(scratch, "graph.mef")})
    print(json.dumps(reply))
    return 0 if reply["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
