"""Programs that are one generated kernel, called without MAX's runtime
(juju_kernels_mojo/native_programs.py, through core's `juju_program_runners`).

Each case must run on a `NativeProgram` (no MAX model) and match jax.jit on
values, shapes and dtypes; the MAX custom-op form of the same kernels is
what tests/test_program_kernels.py checks. Lone loops, key and bool
results, arguments returned or read twice, closed-over constants, guarded
callbacks, threads and the fallbacks to a MAX graph are covered.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju_kernels_mojo import native_programs
from juju_kernels_mojo.native_programs import NativeProgram
from tests.programs.runner import host_leaves  # numpy arrays, PRNG keys as their data
from tests.test_program_kernels import CASES, TOLERANCES, small_parallel_thresholds
from tests.util import assert_same

rng = np.random.default_rng(11)
WEIGHTS = rng.standard_normal((6, 6)).astype(np.float32)


@pytest.fixture(scope="module", autouse=True)
def program_kernels_on():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JUJU_PROGRAM_KERNELS", "1")
        patch.delenv("JUJU_NATIVE_PROGRAMS", raising=False)
        small_parallel_thresholds(patch)  # the threaded forms of CASES, natively
        yield


def keys_and_flags(key, x):
    """PRNG keys in and out, bool results, an argument returned, and a
    closed-over constant: the edges of a kernel's calling convention."""
    key, sub = jax.random.split(key)
    noise = jax.random.normal(sub, x.shape)
    y = jnp.tanh(x @ WEIGHTS) + noise
    for _ in range(3):
        y = jnp.sin(y) * x + 0.5
    return key, y, y > 0.0, x, jnp.sum(y * x)


def lone_loop(x):
    """One `while` equation: a loop kernel, the program's only equation."""
    return lax.fori_loop(0, 7, lambda i, c: jnp.cos(c) * 1.1 + i, x)


def guarded(x):
    """A guarded callback (equinox's error_if), run whole as one kernel
    until the branch is taken."""
    import equinox as eqx

    x = eqx.error_if(x, x.sum() > 100.0, "sum too large")
    return lax.fori_loop(0, 4, lambda i, c: jnp.tanh(c) * 1.5 + c, x)


X = rng.standard_normal(6).astype(np.float32)
NATIVE_CASES = {
    **{name: case for name, case in CASES.items() if name != "islands"},  # islands: MAX ops too
    "keys_and_flags": (keys_and_flags, (jax.random.key(3), X)),
    "lone_loop": (lone_loop, (X,)),
}


def _native(compiled) -> bool:
    return isinstance(compiled.executable.model, NativeProgram)


@pytest.fixture(scope="module")
def compiled():
    lowered = {name: juju.jit(fn, tiered=False).lower(*args)
               for name, (fn, args) in NATIVE_CASES.items()}
    return dict(zip(lowered, juju.compile_all(list(lowered.values()))))


@pytest.mark.parametrize("name", list(NATIVE_CASES))
def test_a_one_kernel_program_runs_natively_and_matches_jax(compiled, name):
    fn, args = NATIVE_CASES[name]
    assert _native(compiled[name])
    got, expected = compiled[name](*args), jax.jit(fn)(*args)
    assert jax.tree.structure(got) == jax.tree.structure(expected)
    for g, e in zip(host_leaves(got), host_leaves(expected), strict=True):
        assert_same(g, np.asarray(e), **TOLERANCES.get(name, {}))


def test_results_never_share_an_arguments_memory(compiled):
    key, x = NATIVE_CASES["keys_and_flags"][1]
    x = x.copy()
    returned = juju.to_numpy(compiled["keys_and_flags"](key, x)[3])
    returned[0] = 123.0
    assert x[0] != 123.0
    a = juju.to_numpy(compiled["lone_loop"](x))
    b = juju.to_numpy(compiled["lone_loop"](x))
    assert a.ctypes.data != b.ctypes.data  # each call's own results


def test_concurrent_calls_from_threads(compiled):
    fn = compiled["lone_loop"]
    inputs = [rng.standard_normal(6).astype(np.float32) for _ in range(8)]
    expected = [juju.to_numpy(fn(x)).copy() for x in inputs]  # the kernel is deterministic
    for x, e in zip(inputs, expected):
        assert_same(e, np.asarray(jax.jit(lone_loop)(x)))
    failures = []

    def worker(i):
        for _ in range(50):
            got = juju.to_numpy(fn(inputs[i]))
            if not np.array_equal(got, expected[i]):
                failures.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_guarded_callback_runs_natively_until_it_fires():
    pytest.importorskip("equinox")
    fn = juju.jit(guarded, tiered=False)
    lowered = fn.lower(X)
    lowered.compile()
    (segment,) = lowered.plan.segments()
    assert segment.speculative and isinstance(segment.executable.model, NativeProgram)
    assert_same(juju.to_numpy(fn(X)), np.asarray(jax.jit(guarded)(X)))
    with pytest.raises(Exception, match="sum too large"):  # replayed by jax.jit, as jax raises
        fn(X * 100 + 100)


def test_native_programs_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("JUJU_NATIVE_PROGRAMS", "0")
    compiled = juju.jit(lone_loop, tiered=False).lower(X).compile()
    assert not _native(compiled)
    assert_same(juju.to_numpy(compiled(X)), np.asarray(jax.jit(lone_loop)(X)))


def test_a_kernel_that_fails_to_build_runs_as_a_max_graph(monkeypatch, caplog):
    def broken_build(folder, name, main):
        raise juju.CompileError("a native kernel that does not build")

    monkeypatch.setattr(native_programs, "build_shared_library", broken_build)
    monkeypatch.setattr(native_programs, "_built", {})  # not the batch `prepare` built
    with caplog.at_level(logging.WARNING, logger="juju"):
        compiled = juju.jit(lone_loop, tiered=False).lower(X + 1).compile()
    assert not _native(compiled)
    assert "does not build" in caplog.text
    assert_same(juju.to_numpy(compiled(X + 1)), np.asarray(jax.jit(lone_loop)(X + 1)))


def test_no_native_program_for_a_gpu_engine_or_other_programs():
    class Gpu:
        kind = "gpu"

    closed = jax.make_jaxpr(lone_loop)(X)
    assert native_programs.runner(closed, Gpu()) is None
    two = jax.make_jaxpr(lambda x: (lone_loop(x), lone_loop(x * 2)))(X)
    assert native_programs.runner(two, juju.cpu_engine()) is None


def test_a_batch_that_fails_to_build_is_split_down_to_the_failing_kernel(monkeypatch):
    class Kernel:
        def __init__(self, name):
            self.name, self.source = name, f"fn {name}(): pass\n"
            self.preludes = ()  # a generated kernel's imports and helpers: none here

    builds = []

    def build(name, source):  # no Mojo: the batch fails where the bad kernel is in it
        builds.append(source.count("fn "))
        if "fn bad(" in source:
            raise juju.CompileError("bad does not build")
        return f"{name}.so"

    monkeypatch.setattr(native_programs, "_library", build)
    monkeypatch.setattr(native_programs, "_built", {})
    kernels = [Kernel(n) for n in ("a", "b", "c", "bad", "d")]
    native_programs._build_together(kernels)
    built = native_programs._built
    # [a b c bad d] fails -> [a b] builds; [c bad d] fails -> [c] is one (runner
    # builds it alone), [bad d] fails -> [bad] and [d] are left to runner too
    assert builds == [5, 2, 3, 2]
    assert built == {"a": built["a"], "b": built["a"]}


_WORKERS_PROBE = """
import os
import jax, jax.numpy as jnp, numpy as np
import juju
from juju import engine
from juju._compat import max_worker_thread_ids
from juju_kernels_mojo.native_programs import NativeProgram

def chain(x):  # 2^20 elements: its loop runs on the cores (a parallel region)
    for _ in range(4):
        x = jnp.tanh(x * 1.5 + 0.25)
    return x

x = np.linspace(-2, 2, 1 << 20, dtype=np.float32).reshape(1024, 1024)
f = juju.jit(chain, tiered=False)
compiled = f.lower(x).compile()
assert isinstance(compiled.executable.model, NativeProgram), "not a native program"
assert not engine._sessions, "a MAX session exists: the probe needs a process without one"
np.testing.assert_allclose(juju.to_numpy(f(x)), np.asarray(jax.jit(chain)(x)), rtol=1e-6)
workers = max_worker_thread_ids()
assert workers, "no MAX worker thread after a parallel region: their names changed?"
print([os.getpriority(os.PRIO_PROCESS, t) for t in workers])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_workers_a_native_program_starts_yield_to_the_caller():
    """A native program's parallel region starts MAX's workers without a
    session; they spin after each region, and at nice 0 took the caller's
    core (a flax nnx step 0.3 -> 2.8 ms). They get the session's nice value."""
    import subprocess

    env = {**os.environ, "JUJU_MAX_WORKER_NICE": "10", "JUJU_KERNEL_THREADS": "2"}
    run = subprocess.run([sys.executable, "-c", _WORKERS_PROBE], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    nices = eval(run.stdout.strip().splitlines()[-1])
    assert nices and all(n >= 10 for n in nices), nices
