"""MAX compiles in worker processes, several at once.

MAX 26.7's graph compiler can crash (SIGSEGV) the process that runs it, and
it serialises compiles inside a process. So juju compiles every graph in a
worker process (`juju.compile_worker`, a script that imports only `max`):
the caller writes the graph's MLIR text to a file, a worker compiles it into
a MEF file, and the caller loads that (milliseconds; the compiler never runs
in the caller). A worker that dies (a signal, the OOM killer, a timeout)
becomes a `CompilerCrashError` in the caller, naming the signal, the user's
function and how to reproduce it; the next compile starts a new worker.

- Workers: at most `JUJU_COMPILE_WORKERS` at once (default: the cores this
  process may use). They stay for the next compile and exit after
  `JUJU_COMPILE_WORKER_IDLE` seconds without one (default 300), or when the
  caller exits (killed at exit: a compile nobody will use is abandoned, and
  the persistent cache only ever sees whole files).
- `JUJU_COMPILE_TIMEOUT` (seconds, default none) bounds one compile.
- `JUJU_COMPILE_IN_PROCESS=1` compiles in the caller instead (debugging: a
  crash then ends the caller, as it did before workers).

`max_building()` is the lock every in-process use of MAX's graph API and
model loading takes (MAX keeps its MLIR context per thread and shares state
between building and loading); the exit handler takes it too, so the
interpreter never finalises while a daemon thread is inside MAX.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from juju import cache, compile_worker
from juju.errors import CompileError, CompilerCrashError
from juju.logs import heartbeat, log, progress

_WORKER_SCRIPT = compile_worker.__file__


@dataclass(frozen=True)
class Job:
    """One MAX compilation: a module of one or more graphs.

    Attributes:
        text: the module's MLIR text (`compile_worker.module_text`).
        extensions: the `.mojoc` kernel libraries its custom ops need.
        device: `(kind, index)` of the engine it is compiled for.
        what: the user's functions it holds, for messages.
        options: MAX's compile options, (name, value) pairs.
    """

    text: str
    extensions: tuple[str, ...]
    device: tuple[str, int]
    what: str
    options: tuple = ()


def workers() -> int:
    """How many compiles may run at once (`JUJU_COMPILE_WORKERS`, else the
    cores this process may use)."""
    value = os.environ.get("JUJU_COMPILE_WORKERS", "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            log.warning("juju: JUJU_COMPILE_WORKERS=%r is not a number; using the cores", value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def in_process() -> bool:
    """Whether compiles run in the caller (`JUJU_COMPILE_IN_PROCESS=1`)."""
    return os.environ.get("JUJU_COMPILE_IN_PROCESS", "") not in ("", "0")


def compile_jobs(jobs: list[Job], session_of) -> list[Path]:
    """Compile `jobs` (in parallel, up to `workers()`) into MEF files.

    Returns one MEF path per job, in order: scratch files the caller moves
    into the persistent cache or deletes. `session_of(device)` gives the
    caller's session, used only for in-process compiles. Raises the first
    job's `CompileError` after every job has ended.
    """
    results: list = [None] * len(jobs)

    def run(i):
        try:
            results[i] = _compile(jobs[i], session_of)
        except BaseException as exc:  # noqa: BLE001  (raised in the caller's thread)
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,), name="juju-compile-job", daemon=True)
               for i in range(1, len(jobs))]
    for thread in threads:
        thread.start()
    run(0)
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            for other in results:
                if isinstance(other, Path):
                    _unlink(other)
            raise result
    return results


def _compile(job: Job, session_of) -> Path:
    graph_path = _save_graph(job.text)
    mef = _scratch_file(".mef")
    _in_flight.update((graph_path, mef))
    progress("juju: compiling %s for %s with MAX", job.what, job.device[0])
    start = time.perf_counter()
    with heartbeat(f"compiling {job.what} for {job.device[0]} with MAX"):
        try:
            if in_process():
                with max_building():
                    try:
                        compile_worker.compile_to_mef(session_of(job.device), job.text,
                                                      job.extensions, str(mef),
                                                      dict(job.options))
                    except Exception as exc:
                        reason = compile_worker.compile_reason(exc)
                        raise CompileError(_failed(job, reason)) from exc
            else:
                _compile_in_worker(job, graph_path, mef)
        except BaseException as exc:
            _unlink(mef)
            if not isinstance(exc, CompilerCrashError):  # its message has the reason
                _unlink(graph_path)
            raise
        finally:
            _in_flight.difference_update((graph_path, mef))
    _unlink(graph_path)  # kept only where the compiler crashed, to reproduce it
    progress("juju: compiled %s for %s in %.1f s", job.what, job.device[0],
             time.perf_counter() - start)
    return mef


def _failed(job: Job, reason: str) -> str:
    kind, index = job.device
    return f"MAX failed to compile {job.what} for {kind}:{index}: {reason}"


def _compile_in_worker(job: Job, graph_path: Path, mef: Path) -> None:
    request = {"graph": str(graph_path), "extensions": list(job.extensions),
               "device": list(job.device), "mef": str(mef), "options": dict(job.options)}
    worker = _checkout()
    try:
        reply = worker.ask(request, _timeout())
    finally:
        _checkin(worker)
    if reply is None:  # the worker died
        abandon_if_exiting()  # killed by our own exit handler: nobody waits for this
        raise _crash(job, worker, graph_path)
    if not reply["ok"]:
        raise CompileError(_failed(job, reply["error"]))


def _crash(job: Job, worker: "_Worker", graph_path: Path) -> CompilerCrashError:
    code = worker.returncode
    if worker.timed_out:
        how = f"was stopped after the {_timeout():.0f} s compile timeout (JUJU_COMPILE_TIMEOUT)"
        sig = "SIGKILL"
    elif code is not None and code < 0:
        sig = _signal_name(-code)
        how = f"died of {sig}" + (" (killed: out of memory?)" if sig == "SIGKILL" else "")
    else:
        sig = None
        how = f"exited with status {code}"
    kind, index = job.device
    repro = " ".join([sys.executable, _WORKER_SCRIPT, "--graph", str(graph_path), "--device",
                      f"{kind}:{index}", *(f"--extension {e}" for e in job.extensions)])
    tail = worker.log_tail()
    error = CompilerCrashError(
        f"MAX's compiler {how} in a worker process while compiling {job.what} for "
        f"{kind}:{index}; this process is unaffected. The graph is saved in {graph_path}; "
        f"reproduce with:\n  {repro}" + (f"\nWorker's last output:\n{tail}" if tail else "")
    )
    error.signal = sig
    error.graph_path = graph_path
    return error


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _timeout() -> float | None:
    value = os.environ.get("JUJU_COMPILE_TIMEOUT", "").strip()
    try:
        return float(value) if value and float(value) > 0 else None
    except ValueError:
        return None


def _idle_seconds() -> float:
    try:
        return float(os.environ.get("JUJU_COMPILE_WORKER_IDLE", "300"))
    except ValueError:
        return 300.0


# --- files ---------------------------------------------------------------------


_KEEP_SECONDS = 7 * 24 * 3600  # a crashed compile's graph, or a killed process's files
_pruned: set[Path] = set()


def _work_dir() -> Path:
    """Where graph texts and fresh MEFs go: the cache folder (so a MEF is
    renamed into the cache, not copied), else a temporary folder. Files left
    there for a week (crashes' graphs, a killed process's) are deleted."""
    for where in ([cache.root() / "work"] if cache.enabled() else []) + [
            Path(tempfile.gettempdir()) / f"juju-work-{os.getuid()}"]:
        try:
            where.mkdir(parents=True, exist_ok=True)
            if os.access(where, os.W_OK):
                if where not in _pruned:
                    _pruned.add(where)
                    _prune(where)
                return where
        except OSError:
            continue
    raise CompileError("juju found no writable folder for its compile worker's files: set "
                       "JUJU_CACHE_DIR to a writable folder")


def _prune(where: Path) -> None:
    cutoff = time.time() - _KEEP_SECONDS
    for path in where.iterdir():
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except OSError:
            pass


def _save_graph(text: str) -> Path:
    digest = hashlib.sha256(text.encode()).hexdigest()[:24]
    path = _work_dir() / f"graph-{digest}-{os.getpid()}-{threading.get_ident()}.mlir"
    path.write_text(text)
    return path


def _scratch_file(suffix: str) -> Path:
    fd, name = tempfile.mkstemp(dir=_work_dir(), suffix=suffix)
    os.close(fd)
    return Path(name)


_in_flight: set[Path] = set()  # files of compiles in flight: deleted if the process exits


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


# --- workers -------------------------------------------------------------------


class _Worker:
    """One worker process, its pipes and its stderr (a file juju reads back)."""

    def __init__(self):
        self.log = tempfile.TemporaryFile()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            # -P: the worker's folder (juju's package) is not put on sys.path
            [sys.executable, "-P", _WORKER_SCRIPT, "--serve", "--idle", str(_idle_seconds())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, env=env,
            text=True, bufsize=1,
        )
        self.last_used = time.monotonic()
        self.busy = False
        self.timed_out = False
        self._log_start = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def usable(self) -> bool:
        """Alive, and not about to exit of idleness."""
        return (self.proc.poll() is None
                and time.monotonic() - self.last_used < _idle_seconds() - 10)

    def ask(self, request: dict, timeout: float | None) -> dict | None:
        """Send a request and wait for its answer; None if the worker died."""
        self._log_start = os.fstat(self.log.fileno()).st_size
        timer = None
        if timeout is not None:
            timer = threading.Timer(timeout, self._time_out)
            timer.daemon = True
            timer.start()
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        finally:
            if timer is not None:
                timer.cancel()
        self.last_used = time.monotonic()
        if not line:
            self.kill()
            self.proc.wait()
            return None
        return json.loads(line)

    def _time_out(self) -> None:
        self.timed_out = True
        self.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()

    def log_tail(self, limit: int = 3000) -> str:
        """What the worker printed on stderr for the last request."""
        size = os.fstat(self.log.fileno()).st_size
        start = max(self._log_start, size - limit)
        data = os.pread(self.log.fileno(), size - start, start)
        return data.decode(errors="replace").strip()


_idle: list[_Worker] = []
_all: set[_Worker] = set()
_pool = threading.Condition()
_active = 0
_exiting = threading.Event()


def _checkout() -> _Worker:
    global _active
    register_exit_handler()
    with _pool:
        while _active >= workers():
            _pool.wait()
        _active += 1
        while _idle:
            worker = _idle.pop()
            if worker.usable():
                break
            _retire(worker)
        else:
            worker = None
    if worker is None:
        try:
            worker = _Worker()
        except BaseException as exc:
            with _pool:
                _active -= 1
                _pool.notify()
            if isinstance(exc, OSError):  # no interpreter to start, out of processes...
                raise CompileError(
                    f"juju cannot start a MAX compile worker ({sys.executable!r}: {exc}); "
                    "set JUJU_COMPILE_IN_PROCESS=1 to compile in this process"
                ) from exc
            raise
        with _pool:
            _all.add(worker)
    worker.busy = True
    return worker


def _checkin(worker: _Worker) -> None:
    global _active
    worker.busy = False
    with _pool:
        _active -= 1
        if worker.proc.poll() is None:
            _idle.append(worker)
        else:
            _all.discard(worker)
        _pool.notify()


def _retire(worker: _Worker) -> None:
    worker.kill()
    _all.discard(worker)


def worker_pids(busy: bool | None = None) -> list[int]:
    """The process ids of the live compile workers (only those compiling
    now, with `busy=True`; only idle ones with `busy=False`)."""
    with _pool:
        return [w.pid for w in _all if w.proc.poll() is None
                and (busy is None or w.busy == busy)]


def shutdown() -> None:
    """Kill every worker (a compile in flight is abandoned). Called at exit."""
    with _pool:
        workers_now = list(_all)
        _all.clear()
        _idle.clear()
    for worker in workers_now:
        worker.kill()


# --- the in-process MAX lock and the exit handler ---------------------------------

# MAX keeps its MLIR context per thread and enters it for the main thread only:
# building a Module in another thread fails ("No MLIR context active"). Graph
# building and loading also share state in MAX, so they run one thread at a
# time, in that context; calls that hit the jit cache never take this lock.
_max_lock = threading.RLock()


@contextlib.contextmanager
def max_building():
    """Hold MAX for graph building or model loading, in its MLIR context."""
    try:  # private in MAX 26.7: where it is missing, the main thread still works
        from max._mlir_context import ensure_default_mlir_context
    except ImportError:
        ensure_default_mlir_context = contextlib.nullcontext
    register_exit_handler()
    with _max_lock, ensure_default_mlir_context():
        yield


_exit_handler_registered = False


def register_exit_handler() -> None:
    """Make sure `_at_exit` runs at exit; called before any work that may go
    on in a daemon thread (a background compile, a kernel build)."""
    global _exit_handler_registered
    if not _exit_handler_registered:
        _exit_handler_registered = True
        # Registered after `max` is imported: runs before MAX's own exit handlers.
        atexit.register(_at_exit)


def abandon_if_exiting() -> None:
    """In a thread other than the main one while the process exits, block
    for good: the work (a kernel build, a fallback to MAX) is for a call
    nobody waits for, and MAX entered while the interpreter finalises aborts
    the process (SIGABRT)."""
    if _exiting.is_set() and threading.current_thread() is not threading.main_thread():
        threading.Event().wait()


def _at_exit() -> None:
    """Abandon compiles in flight and keep daemon threads out of MAX.

    A daemon thread still inside MAX's C++ code when the interpreter
    finalises is unwound by force, and MAX aborts the process ("FATAL:
    exception not rethrown", exit 134). Compiles run in workers, which are
    killed here; graph building and loading run under `_max_lock`, which is
    taken here (waiting for the one in progress) and never released.
    """
    _exiting.set()
    shutdown()
    for path in list(_in_flight):
        _unlink(path)
    _max_lock.acquire(timeout=120)


def _forget_workers_in_child() -> None:  # a forked child does not own its parent's workers
    global _active
    _all.clear()
    _idle.clear()
    _active = 0


os.register_at_fork(after_in_child=_forget_workers_in_child)
