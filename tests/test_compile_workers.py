"""MAX compiles run in worker processes (juju/compile_pool.py): a compiler
crash ends the worker, not the caller; the caller gets a typed error and its
next compile works; several graphs compile at once.

Workers are killed on purpose here (SIGSEGV, as MAX's compiler crashes, and
SIGKILL, as the OOM killer); each test uses its own empty juju cache so that
a compile really starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from juju import compile_pool
from tests.util import assert_same

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _kill_the_busy_worker(sig, timeout=120.0) -> int:
    """Wait for a worker to take a compile, then send it `sig`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy = compile_pool.worker_pids(busy=True)
        if busy:
            os.kill(busy[0], sig)
            return busy[0]
        time.sleep(0.005)
    raise AssertionError("no compile worker became busy")


def _call_in_thread(f, *args):
    result = {}

    def run():
        try:
            result["value"] = f(*args)
        except BaseException as exc:  # noqa: BLE001
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def crashed_program(x):
    return jnp.tanh(x) * 3.25 + jnp.cos(x)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_a_worker_killed_mid_compile_is_a_compile_error_and_the_next_call_works(
        empty_cache, sig):
    f = juju.jit(crashed_program, tiered=False)
    thread, result = _call_in_thread(f, X)
    pid = _kill_the_busy_worker(sig)
    thread.join()
    error = result.get("error")
    assert isinstance(error, juju.CompilerCrashError), result
    assert isinstance(error, juju.CompileError)
    assert error.signal == sig.name
    message = str(error)
    assert f"died of {sig.name}" in message and "crashed_program" in message
    assert "this process is unaffected" in message
    assert error.graph_path.exists() and "mo.graph" in error.graph_path.read_text()
    assert "compile_worker.py --graph" in message  # how to reproduce it
    assert pid not in compile_pool.worker_pids()
    assert f.compile_count == 0
    assert_same(f(X), jax.jit(crashed_program)(X))  # a new worker compiles it
    assert f.compile_count == 1


def test_a_tiered_function_goes_on_on_xla_when_its_compile_crashes(empty_cache):
    f = juju.jit(lambda x: jnp.sin(x) * 1.75 - x, tiered=True)
    expected = jax.jit(lambda x: jnp.sin(x) * 1.75 - x)(X)
    assert_same(f(X), expected)  # XLA; the compile starts
    _kill_the_busy_worker(signal.SIGSEGV)
    with pytest.raises(juju.CompilerCrashError, match="SIGSEGV"):
        f.wait_compiled()  # a program that must run on MAX learns it cannot
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert_same(f(X), expected)
    said = [w for w in caught if issubclass(w.category, juju.MaxUnavailableWarning)]
    assert len(said) == 1, [str(w.message) for w in caught]
    assert "MAX is off for test_a_tiered" in str(said[0].message)
    assert "<lambda> (test_compile_workers.py:" in str(said[0].message)
    assert "SIGSEGV" in str(said[0].message)
    assert f.xla_call_count == 4 and f.compile_count == 0


def parallel_programs():
    return [juju.jit(fn) for fn in (
        lambda x: jnp.exp(x) * 0.5,
        lambda x: jnp.log1p(jnp.abs(x)),
        lambda x: jnp.sort(x, axis=1),
        lambda x: jnp.cumsum(x * 2.0, axis=0),
    )]


def test_compile_all_splits_graphs_over_workers_and_compiles_them_at_once(
        empty_cache, monkeypatch):
    monkeypatch.setenv("JUJU_COMPILE_WORKERS", "2")
    functions = parallel_programs()
    most_busy = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            most_busy.append(len(compile_pool.worker_pids(busy=True)))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        compiled = juju.compile_all([f.lower(X) for f in functions])
    finally:
        done.set()
        watcher.join()
    assert max(most_busy) == 2  # two compilations, two workers, at the same time
    for f, c in zip(functions, compiled):
        assert f.compile_count == 1
        assert_same(c(X), jax.jit(f.fun)(X))
    assert len(list(empty_cache.rglob("batch-*.mef"))) == 2


def test_in_process_compiles_start_no_worker(empty_cache, monkeypatch):
    monkeypatch.setenv("JUJU_COMPILE_IN_PROCESS", "1")
    before = set(compile_pool.worker_pids())
    f = juju.jit(lambda x: jnp.arctan(x) * 0.75)
    assert_same(f(X), jax.jit(lambda x: jnp.arctan(x) * 0.75)(X))
    assert set(compile_pool.worker_pids()) <= before


EXIT_AT_ONCE = textwrap.dedent("""
    import json, numpy as np, jax.numpy as jnp, juju, time
    from juju import compile_pool
    out = juju.to_numpy(juju.jit(lambda x: jnp.sin(x) * 2)(np.arange(3, dtype=np.float32)))
    while not compile_pool.worker_pids(busy=True):
        time.sleep(0.005)
    print(json.dumps({"out": out.tolist(), "workers": compile_pool.worker_pids()}), flush=True)
""")


def test_a_script_exiting_while_its_first_call_compiles_exits_cleanly(empty_cache):
    """The default (tiered) mode: XLA answers, MAX compiles in a worker, the
    script ends. Exit status 0 (an in-process compile aborted the process at
    exit with status 134), the worker gone, no file left behind."""
    env = {k: v for k, v in os.environ.items() if k != "JUJU_TIERED"}  # the default mode
    env["JUJU_CACHE_DIR"] = str(empty_cache)
    result = subprocess.run([sys.executable, "-c", EXIT_AT_ONCE], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(report["out"], np.sin(np.arange(3)) * 2, rtol=1e-6)
    for pid in report["workers"]:
        _assert_gone(pid)
    # Nothing but the empty lock file of the compile it abandoned: the cache's
    # locks stay for the next process to take (juju.cache.compile_locks).
    left = [p for p in empty_cache.rglob("*") if p.is_file()]
    assert [p for p in left if not (p.parent.name == "locks" and p.suffix == ".lock")] == []
    assert all(p.stat().st_size == 0 for p in left)


def _assert_gone(pid: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a zombie (our own child) counts as gone
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return
        except OSError:
            return
        time.sleep(0.05)
    raise AssertionError(f"compile worker {pid} outlived its process")


def test_the_worker_compiles_a_saved_graph_without_jax(tmp_path):
    """The worker imports max alone (a start of ~0.3 s), and run by hand on a
    saved graph it reproduces a compile, as a CompilerCrashError says."""
    from juju.compile_worker import module_text

    graph = tmp_path / "graph.mlir"
    graph.write_text(module_text(juju.jit(crashed_program).lower(X).graph.module))
    code = textwrap.dedent(f"""
        import runpy, sys
        sys.argv = ["worker", "--graph", {str(graph)!r}, "--device", "cpu:0"]
        try:
            runpy.run_path({compile_pool._WORKER_SCRIPT!r}, run_name="__main__")
        except SystemExit as exit:
            print("status", exit.code, "jax" in sys.modules)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True,
                         timeout=600, env=env)
    lines = out.stdout.strip().splitlines()
    assert json.loads(lines[-2])["ok"], out.stdout + out.stderr[-2000:]
    assert lines[-1] == "status 0 False"
