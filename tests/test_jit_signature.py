"""`juju.jit` takes every parameter of `jax.jit` (issue 55), with jax's
meaning on one device or a clear error: the signatures are compared, so the
next jax release's new parameter fails here until juju takes it.

Every graph here is compiled in ONE MAX compilation (module fixture).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import juju
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from tests.util import assert_same

#: juju's own options, after jax's (keyword-only).
JUJU_ONLY = ("coerces_to_jnp", "engine", "polymorphic_shapes", "tiered")

X = np.linspace(-2.0, 2.0, 12, dtype=np.float32).reshape(3, 4)


def test_juju_jit_takes_every_parameter_of_jax_jit():
    theirs = inspect.signature(jax.jit).parameters
    ours = inspect.signature(juju.jit).parameters
    (their_fun, *their_options), (our_fun, *our_options) = theirs.values(), ours.values()
    assert their_fun.kind is our_fun.kind is inspect.Parameter.POSITIONAL_ONLY
    missing = [name for name in theirs if name not in ours and name != their_fun.name]
    assert not missing, f"jax.jit has parameters juju.jit lacks: {missing}"
    for their in their_options:
        our = ours[their.name]
        assert our.kind is their.kind, their.name
        assert repr(our.default) == repr(their.default), (their.name, our.default)
    extra = [p.name for p in our_options if p.name not in theirs]
    assert extra == list(JUJU_ONLY), extra
    assert all(ours[name].kind is inspect.Parameter.KEYWORD_ONLY for name in extra)


# --- device and backend pick the engine ----------------------------------------------


def test_device_and_backend_pick_the_engine():
    cpu = jax.devices("cpu")[0]
    assert juju.jit(jnp.sin, device=cpu).engine == juju.cpu_engine()
    assert juju.jit(jnp.sin, backend="cpu").engine == juju.cpu_engine()
    assert juju.jit(jnp.sin, device=juju.cpu_engine().device).engine == juju.cpu_engine()
    assert juju.jit(jnp.sin, device=cpu, engine=juju.cpu_engine()).engine == juju.cpu_engine()


def test_device_and_backend_mistakes_raise_as_jax():
    cpu = jax.devices("cpu")[0]
    with pytest.raises(ValueError, match="can't specify both a device and a backend"):
        juju.jit(jnp.sin, device=cpu, backend="cpu")
    with pytest.raises(RuntimeError, match="Unknown backend: 'tpu'"):
        juju.jit(jnp.sin, backend="tpu")
    with pytest.raises(TypeError, match="backend must be a string"):
        juju.jit(jnp.sin, backend=0)
    with pytest.raises(ValueError, match="neither"):
        juju.jit(jnp.sin, device="cpu:0")
    if juju.Engine("gpu", 0) != juju.cpu_engine():  # no GPU here: gpu_engine() raises
        with pytest.raises(juju.EngineUnavailableError):
            juju.jit(jnp.sin, backend="gpu")


# --- shardings on one device ------------------------------------------------------------


def test_shardings_that_mean_this_device_are_accepted():
    cpu = jax.devices("cpu")[0]
    one = Mesh(np.array([cpu]), ("x",))
    for sharding in (None, SingleDeviceSharding(cpu), NamedSharding(one, PartitionSpec("x")),
                     PartitionSpec(), (None, SingleDeviceSharding(cpu)),
                     {"w": PartitionSpec(None, None)}):
        juju.jit(jnp.sin, in_shardings=sharding, out_shardings=sharding)


def test_shardings_over_other_devices_are_refused_by_name():
    with pytest.raises(ValueError, match=r"in_shardings: PartitionSpec\('x',\)|"
                                         r"in_shardings: P\('x',\)"):
        juju.jit(jnp.sin, in_shardings=PartitionSpec("x"))
    with pytest.raises(TypeError, match="out_shardings takes jax.sharding.Sharding"):
        juju.jit(jnp.sin, out_shardings="replicated")


# --- compiler_options -------------------------------------------------------------------


def test_compiler_options_refuse_what_max_lacks():
    with pytest.raises(ValueError, match="no compile option 'xla_cpu_enable_fast_math'.*"
                                         "tile_based_fusion"):
        juju.jit(jnp.sin, compiler_options={"xla_cpu_enable_fast_math": True})
    with pytest.raises(TypeError, match="must be a bool"):
        juju.jit(jnp.sin, compiler_options={"tile_based_fusion": "yes"})
    with pytest.raises(TypeError, match="must be a dict"):
        juju.jit(jnp.sin, compiler_options=[("tile_based_fusion", True)])


def test_compiler_options_enter_the_cache_key():
    fused = juju.jit(jnp.sin, compiler_options={"tile_based_fusion": True}).lower(X)
    plain = juju.jit(jnp.sin).lower(X)
    assert fused.compiler_options == (("tile_based_fusion", True),)
    assert plain.compiler_options == ()
    keys = [juju.cache.graph_key(low.graph, "cpu", (), low.compiler_options)
            for low in (fused, plain)]
    assert keys[0] != keys[1]


# --- inline, keep_unused, trace ---------------------------------------------------------


def inner(x):
    return jnp.tanh(x) * 2.0


def test_inline_traces_into_the_callers_program():
    called = juju.jit(inner)
    inlined = juju.jit(inner, inline=True)
    names = {fn: [e.primitive.name for e in jax.make_jaxpr(lambda x, f=fn: f(x) + 1)(X).eqns]
             for fn in (called, inlined)}
    assert names[called][0] == "juju_call"
    assert names[inlined] == ["tanh", "mul", "add"]
    assert_same(jax.jit(lambda x: inlined(x) + 1)(X), jax.jit(lambda x: inner(x) + 1)(X))


def unused_middle(x, unused, y):
    return x * y


def test_trace_holds_jaxs_jaxpr_and_lowers():
    fn = juju.jit(unused_middle, donate_argnums=0)
    traced = fn.trace(X, X, X)
    theirs = jax.jit(unused_middle, donate_argnums=0).trace(X, X, X)
    assert str(traced.jaxpr) == str(theirs.jaxpr)
    assert traced.out_info == theirs.out_info and traced.fun_name == theirs.fun_name
    assert jax.tree.map(lambda i: (i.shape, i.dtype, i.donated), traced.args_info) == \
        jax.tree.map(lambda i: (i.shape, i.dtype, i.donated), theirs.args_info)
    assert fn.trace_count == 1 and fn.compile_count == 0
    lowered = traced.lower()
    assert fn.trace_count == 1  # lowered from the trace, not traced again
    assert lowered is fn.lower(X, X, X) and "mo.graph" in lowered.as_text()


# --- what runs: one compilation for the module ---------------------------------------------


@pytest.fixture(scope="module")
def compiled():
    keep = juju.jit(unused_middle, keep_unused=True)
    fused = juju.jit(inner, compiler_options={"tile_based_fusion": True})
    placed = juju.jit(inner, device=jax.devices("cpu")[0],
                      in_shardings=SingleDeviceSharding(jax.devices("cpu")[0]))
    return juju.compile_all([keep.lower(X, X, X), fused.lower(X), placed.lower(X)])


def test_the_options_run_as_jax_jit(compiled):
    keep, fused, placed = compiled
    assert_same(keep(X, X, X), jax.jit(unused_middle, keep_unused=True)(X, X, X))
    assert keep.lowered.closed_jaxpr.in_avals[1].shape == (3, 4)  # kept as an input
    for fn in (fused, placed):
        assert_same(fn(X), jax.jit(inner)(X))


def test_lowered_compile_takes_compiler_options_as_jax():
    lowered = juju.jit(inner).lower(X)
    with pytest.raises(ValueError, match="no compile option 'xla_embed_ir_in_executable'"):
        lowered.compile(compiler_options={"xla_embed_ir_in_executable": True})
