"""Donated arguments (issue 55), as `jax.jit` donates them, on both back
ends: MAX graphs (the donated argument a mutable buffer the graph stores
its result into) and native program kernels (the kernel writes the result
into the argument's memory). A donated jax array that a result uses is
deleted after the call and its memory holds that result; numpy arguments
are never written; values, shapes and dtypes equal jax.jit's.

Every graph here is compiled in ONE MAX compilation (module fixture).
"""

from __future__ import annotations

import os
import warnings

import jax
import jax.numpy as jnp
import juju
import numpy as np
import pytest
from jax import lax
from max.driver import Buffer

from juju_kernels_mojo.native_programs import NativeProgram
from tests.util import assert_same

N = 1 << 15  # 128 KiB of float32: a jax array travels by DLPack, zero-copy
rng = np.random.default_rng(55)
XN = rng.standard_normal(N).astype(np.float32)
YN = rng.standard_normal(N).astype(np.float32)
PN = {"w": rng.standard_normal((64, 32)).astype(np.float32),
      "b": rng.standard_normal(32).astype(np.float32)}


def step(x, y):
    return x * 2.0 + y, jnp.sum(y)


def reverse(x):
    return x[::-1] * 1.5  # each result element reads another element of x


def momentum(params, velocity, batch):
    """SGD with momentum: the velocity is read elementwise only, the
    weights by products too."""
    def loss(p):
        return jnp.mean((jnp.tanh(batch @ p["w"] + p["b"]) - 1.0) ** 2)

    grads = jax.grad(loss)(params)
    velocity = jax.tree.map(lambda v, g: 0.9 * v + g, velocity, grads)
    return jax.tree.map(lambda p, v: p - 0.1 * v, params, velocity), velocity, loss(params)


def counter(x):
    return lax.fori_loop(0, 5, lambda i, c: jnp.cos(c) * 0.5 + i, x)


def nothing_fits(x):
    return x.sum()


BATCH = rng.standard_normal((8, 64)).astype(np.float32)
BACKENDS = ("graph", "native")
PROGRAMS = {  # name -> (function, donate_argnums, donate_argnames, arguments)
    "step": (step, 0, None, (XN, YN)),
    "reverse": (reverse, 0, None, (XN,)),
    "momentum": (momentum, None, ("params", "velocity"), (PN, PN, BATCH)),
    "counter": (counter, 0, None, (XN[:64],)),
}


@pytest.fixture(scope="module")
def jitted():
    """name -> backend -> the compiled JitFunction: MAX graphs (program
    kernels off; one MAX compilation) and native program kernels (on)."""
    functions = {}
    for backend in BACKENDS:  # lowered and compiled with program kernels off, then on
        os.environ["JUJU_PROGRAM_KERNELS"] = "1" if backend == "native" else "0"
        try:
            lowered = []
            for name, (fn, nums, names, args) in PROGRAMS.items():
                jitted = juju.jit(fn, donate_argnums=nums, donate_argnames=names)
                functions.setdefault(name, {})[backend] = jitted
                lowered.append(jitted.lower(*args))
            juju.compile_all(lowered)
        finally:
            os.environ["JUJU_PROGRAM_KERNELS"] = "0"  # tests/conftest.py's
    for name, by_backend in functions.items():
        (executable,) = by_backend["native"].executables.values()
        assert isinstance(executable.model, NativeProgram), name  # the native back end
    return functions


def _address(value) -> int:
    return value._data_ptr() if isinstance(value, Buffer) else value.unsafe_buffer_pointer()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_donated_jax_array_is_deleted_and_holds_the_result(jitted, backend):
    x, y = jnp.asarray(XN), jnp.asarray(YN)
    where = _address(x)
    out, total = jitted["step"][backend](x, y)
    assert x.is_deleted() and not y.is_deleted()
    assert _address(out) == where  # the result is in the donated memory
    assert_same((out, total), jax.jit(step)(XN, YN))
    with pytest.raises((RuntimeError, ValueError), match="deleted"):
        jitted["step"][backend](x, y)  # as jax.jit: the array is gone


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_donated_numpy_array_is_never_written(jitted, backend):
    x = XN.copy()
    out, total = jitted["step"][backend](x, YN)
    np.testing.assert_array_equal(x, XN)
    assert _address(out) != x.ctypes.data
    assert_same((out, total), jax.jit(step)(XN, YN))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_donated_max_buffer_is_reused(jitted, backend):
    buffer = Buffer.from_numpy(XN.copy())
    out, _ = jitted["step"][backend](buffer, YN)
    assert _address(out) == _address(buffer)
    assert_same(out, jax.jit(step)(XN, YN)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_results_that_read_other_elements_are_right_in_place(jitted, backend):
    x = jnp.asarray(XN)
    out = jitted["reverse"][backend](x)
    assert x.is_deleted()
    assert_same(out, jax.jit(reverse)(XN))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_loop_reuses_the_memory_it_can(jitted, backend):
    """donate_argnames on pytrees: the jax arrays of the first step are
    deleted; from then on the velocity (and, in a native kernel, the
    weights too) is in the previous step's memory; values as jax's
    donating loop. A MAX graph stores only into what elementwise equations
    alone read: MAX's buffer_load would copy weights a product reads."""
    first = jax.tree.map(jnp.asarray, (PN, PN))
    theirs = jax.tree.map(jnp.asarray, (PN, PN))
    reference = jax.jit(momentum, donate_argnames=("params", "velocity"))
    *ours, loss = jitted["momentum"][backend](*first, BATCH)
    *theirs, their_loss = reference(*theirs, BATCH)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(first))
    kept = slice(0, 2) if backend == "native" else slice(1, 2)
    where = jax.tree.map(_address, ours[kept])
    for _ in range(4):
        *ours, loss = jitted["momentum"][backend](*ours, BATCH)
        *theirs, their_loss = reference(*theirs, BATCH)
        assert jax.tree.map(_address, ours[kept]) == where
    assert_same((ours, loss), (theirs, their_loss))


def test_a_graph_stores_into_what_elementwise_equations_alone_read(jitted):
    (graph,) = jitted["momentum"]["graph"].executables.values()
    low = jitted["momentum"]["graph"].lower(PN, PN, BATCH)
    assert len(low.aliases) == 4  # every donated leaf has a result: all deleted
    assert sorted(j for j, _ in graph.aliases) == [2, 3]  # the velocity's: stored
    (native,) = jitted["momentum"]["native"].executables.values()
    assert sorted(j for j, _ in native.aliases) == [0, 1, 2, 3]
    assert [j for j, _ in jitted["reverse"]["graph"].lower(XN).stored] == []  # a reversal


def test_big_jax_results_stay_in_the_donated_memory():
    """coerces_to_jnp: a result over 64 KiB goes to jax without a copy, so a
    loop of jax arrays keeps its memory too (smaller ones are copied: cheap)."""
    fn = juju.jit(step, donate_argnums=0, coerces_to_jnp=True)  # the graph of `step`
    x = jnp.asarray(XN)
    where = _address(x)
    for _ in range(3):
        old, (x, _) = x, fn(x, YN)
        assert old.is_deleted() and _address(x) == where


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_loop_carry_takes_the_donated_memory(jitted, backend):
    x = jnp.asarray(XN[:64])
    out = jitted["counter"][backend](x)
    assert x.is_deleted()
    assert_same(out, jax.jit(counter)(XN[:64]))


def test_a_donation_no_result_fits_warns_as_jax_and_keeps_the_array():
    x = jnp.asarray(XN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lowered = juju.jit(nothing_fits, donate_argnums=0).lower(x)
    assert lowered.aliases == ()
    assert any("Some donated buffers were not usable: float32[32768]" in str(w.message)
               for w in caught)
    assert not x.is_deleted()


def test_a_donated_argument_passed_twice_is_an_error(jitted):
    x = jnp.asarray(XN)
    with pytest.raises(ValueError, match="donated and passed again"):
        jitted["step"]["graph"](x, x)
    assert not x.is_deleted()


def test_donation_options_are_checked_as_jax():
    with pytest.raises(ValueError, match="static_argnames and donate_argnames cannot"):
        juju.jit(step, static_argnums=0, donate_argnums=0)
    with pytest.raises(ValueError, match="Jitted function has donate_argnums=\\(5,\\)"):
        juju.jit(step, donate_argnums=5)
    with pytest.raises(ValueError, match="invalid argnames {'z'} in donate_argnames"):
        juju.jit(step, donate_argnames="z")
    with pytest.raises(TypeError, match="donate_argnums must be ints"):
        juju.jit(step, donate_argnums="x")


def test_the_xla_tier_donates_as_jax(jitted):
    """A tiered function's first call runs on XLA: jax.jit deletes the array."""
    fn = juju.jit(step, donate_argnums=0, tiered=True)
    x = jnp.asarray(XN)
    out, total = fn(x, YN)
    assert x.is_deleted()
    assert_same((out, total), jax.jit(step)(XN, YN))
    fn.wait_compiled()  # the graph of test 1, from the cache
    x = jnp.asarray(XN)
    assert_same(fn(x, YN)[0], jax.jit(step)(XN, YN)[0])
    assert x.is_deleted()
