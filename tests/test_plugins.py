"""Packs: entry-point discovery, provenance, priorities, guards, conflicts,
JUJU_PLUGINS / JUJU_BLOCK_PLUGINS filtering, broken packs, the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from max.graph import ops

import juju
from juju import plugins
from juju import primitives as P
from tests.util import assert_same

juju_testpack = pytest.importorskip("juju_testpack", reason="dev.py installs tests/packs/juju_testpack")


@pytest.fixture
def clean_registry():
    """Undo in-process packs a test registers."""
    yield
    for name in ("conflicting", "broken", "guarded", "broken_import", "faulty"):
        plugins.unregister_pack(name)
    plugins.reload()


def run_cli(*args, **env):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JUJU_")}
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "juju", *args], capture_output=True, text=True, env=environment,
        timeout=120,
    )


def test_first_party_and_third_party_packs_are_discovered():
    names = {p.name: p for p in plugins.packs()}
    for expected in ("core", "lax", "nn", "mojo", "testpack"):
        assert expected in names, f"pack {expected} not loaded: {sorted(names)}"
        assert names[expected].loaded, names[expected].error
    assert names["testpack"].version == "0.0.1"
    assert "juju-testpack" in names["testpack"].origin


def test_rules_carry_provenance():
    registry = plugins.registry()
    (rule,) = registry.rules_for(juju_testpack.double_plus_one_p)
    assert (rule.pack, rule.pack_version) == ("testpack", "0.0.1")
    sin_rules = registry.rules_for(P.sin_p)  # real, and complex (guarded, priority 1)
    assert [r.pack for r in sin_rules] == ["lax", "lax"]
    assert [int(r.priority) for r in sin_rules] == [1, 0] and sin_rules[0].guard is not None


def test_third_party_rule_is_used_by_jit():
    juju_testpack.calls.clear()
    f = juju.jit(lambda x: juju_testpack.double_plus_one(x) * 3.0)
    x = np.arange(4, dtype=np.float32)
    text = f.lower(x).as_text()
    assert juju_testpack.calls, "the testpack rule did not run"
    assert "rmo.add" in text
    assert_same(f(x), (2 * x + 1) * 3.0)


def test_priority_and_guards_select_deterministically(clean_registry):
    low_calls, high_calls = [], []

    class Guarded:
        @staticmethod
        @juju.hookimpl
        def juju_rules():
            rules = juju.RuleSet()

            @rules.register(P.sin_p, priority=juju.Priority.FUSED,
                            guard=lambda ctx: ctx.avals_in[0].shape == (7,))
            def lower_sin_for_length_7(ctx, x, accuracy=None):
                high_calls.append(1)
                return ops.sin(x)

            return [rules]

    plugins.register_pack(Guarded, "guarded")
    registry = plugins.registry()
    chosen = [r.pack for r in registry.rules_for(P.sin_p)]
    assert chosen == ["guarded", "lax", "lax"]  # highest priority first (lax: complex, real)
    juju.jit(jnp.sin).lower(np.ones(7, np.float32)).as_text()
    assert high_calls == [1]
    juju.jit(jnp.sin).lower(np.ones(3, np.float32)).as_text()
    assert high_calls == [1]  # guard declined: the lax rule lowered it
    del low_calls


def test_conflicting_packs_fail_only_where_the_primitive_is_used(clean_registry, capsys):
    class Conflicting:
        @staticmethod
        @juju.hookimpl
        def juju_rules():
            return [juju.Rule(juju_testpack.double_plus_one_p, lambda ctx, x: x)]

    plugins.register_pack(Conflicting, "conflicting")
    with pytest.warns(RuntimeWarning, match="'conflicting' and 'testpack'"):
        registry = plugins.registry()
    assert juju_testpack.double_plus_one_p in registry.conflicts
    # A function that never uses the primitive runs.
    x = np.linspace(-1, 1, 4, dtype=np.float32)
    assert_same(juju.jit(lambda x: jnp.sin(x) + 1)(x), jax.jit(lambda x: jnp.sin(x) + 1)(x))
    # One that does fails at that equation, naming both packs and what to do.
    with pytest.raises(juju.RuleConflictError) as info:
        juju.jit(lambda x: juju_testpack.double_plus_one(x) * 2).lower(x)
    message = "\n".join([str(info.value), *getattr(info.value, "__notes__", [])])
    assert "'conflicting'" in message and "'testpack'" in message
    assert "testpack_double_plus_one" in message and "JUJU_PLUGINS" in message
    assert "needed by 'testpack_double_plus_one' at" in message
    # The CLI still lists every pack, and shows the conflict.
    from juju.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert {"core", "lax", "testpack", "conflicting"} <= set(listed), out
    assert "CONFLICT" in out and "'conflicting' and 'testpack'" in out
    assert main(["which", "testpack_double_plus_one"]) == 0
    assert "CONFLICT" in capsys.readouterr().out


def _faulty_pack(**hooks):
    """An in-process pack named 'faulty' whose hooks are the given functions."""
    plugin = type("Faulty", (), {
        name: staticmethod(juju.hookimpl(fn)) for name, fn in hooks.items()
    })
    plugins.register_pack(plugin, "faulty")
    return plugin


@pytest.mark.parametrize("returned", [["not a rule"], [42], 7, [lambda ctx, x: x]])
def test_a_hook_returning_a_non_rule_is_a_pack_error(clean_registry, returned):
    _faulty_pack(juju_rules=lambda: returned)
    with pytest.warns(RuntimeWarning, match="faulty"):
        packs = {p.name: p for p in plugins.packs()}
    error = packs["faulty"].error
    assert isinstance(error, juju.PackError) and isinstance(error, juju.JujuError)
    assert "pack 'faulty'" in str(error) and "juju_rules" in str(error)
    assert "not a juju.Rule" in str(error) or "not a list" in str(error)
    assert packs["lax"].loaded and plugins.registry().rules_for(P.sin_p)


def test_a_kernel_library_hook_that_raises_is_a_pack_error(clean_registry):
    def juju_kernel_libraries():
        raise OSError("no such kernel folder")

    _faulty_pack(juju_kernel_libraries=juju_kernel_libraries)
    with pytest.warns(RuntimeWarning, match="faulty"):
        error = {p.name: p for p in plugins.packs()}["faulty"].error
    assert isinstance(error, juju.PackError)
    assert "pack 'faulty'" in str(error) and "juju_kernel_libraries" in str(error)
    assert isinstance(error.__cause__, OSError)
    x = np.ones(3, np.float32)
    juju.jit(lambda x: x * 2).lower(x).as_text()  # every other pack still lowers


def test_a_kernel_library_that_cannot_be_built_names_its_pack(clean_registry):
    needs_kernels_p = Primitive("faulty_needs_kernels")
    needs_kernels_p.def_abstract_eval(lambda x: x)

    def path():
        raise FileNotFoundError("kernels/ is missing")

    def lower_needs_kernels(ctx, x):
        return x

    _faulty_pack(
        juju_rules=lambda: [juju.Rule(needs_kernels_p, lower_needs_kernels, requires=("faulty_lib",))],
        juju_kernel_libraries=lambda: [juju.KernelLibrary("faulty_lib", path)],
    )
    with pytest.raises(juju.PackError, match="pack 'faulty'.*'faulty_lib'") as info:
        juju.jit(needs_kernels_p.bind).lower(np.ones(3, np.float32)).as_text()
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_a_jaxpr_rewrite_that_raises_is_a_pack_error(clean_registry):
    def broken_rewrite(closed_jaxpr):
        raise KeyError("pattern table")

    _faulty_pack(juju_jaxpr_rewrites=lambda: [broken_rewrite])
    with pytest.raises(juju.PackError) as info:
        juju.jit(lambda x: x + 1).lower(np.ones(3, np.float32))
    assert "pack 'faulty'" in str(info.value) and "broken_rewrite" in str(info.value)
    assert "JUJU_BLOCK_PLUGINS=faulty" in str(info.value)
    assert isinstance(info.value.__cause__, KeyError)

    _faulty_pack(juju_jaxpr_rewrites=lambda: [lambda closed_jaxpr: None])
    with pytest.raises(juju.PackError, match="pack 'faulty'.*returned NoneType"):
        juju.jit(lambda x: x + 2).lower(np.ones(3, np.float32))


class _NumpyTanh:
    """A program model computing tanh with numpy (a pack's `juju_program_runners`)."""

    calls = 0

    def execute(self, *buffers):
        type(self).calls += 1
        return [juju.buffers.host_buffer(np.tanh(juju.to_numpy(buffers[0])))]


def _tanh_runner(closed_jaxpr, engine):
    eqns = closed_jaxpr.jaxpr.eqns
    return _NumpyTanh() if [e.primitive for e in eqns] == [P.tanh_p] else None


def test_a_program_runner_runs_the_programs_it_takes(clean_registry):
    _faulty_pack(juju_program_runners=lambda: [_tanh_runner])
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    before = _NumpyTanh.calls
    got = juju.jit(jnp.tanh, tiered=False)(x)
    assert _NumpyTanh.calls == before + 1  # no MAX graph: the pack's model ran
    assert_same(juju.to_numpy(got), np.asarray(jax.jit(jnp.tanh)(x)))
    other = juju.jit(lambda v: v * 2.0, tiered=False)(x)  # not taken: a MAX graph
    assert _NumpyTanh.calls == before + 1
    assert_same(juju.to_numpy(other), x * 2.0)


def test_a_program_runner_that_fails_names_its_pack_and_max_runs_the_program(
        clean_registry, caplog):
    def broken_runner(closed_jaxpr, engine):
        raise ValueError("no such kernel")

    _faulty_pack(juju_program_runners=lambda: [broken_runner, lambda jaxpr, engine: object()])
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    with caplog.at_level("WARNING", logger="juju"):
        got = juju.jit(jnp.cos, tiered=False)(x)
    assert_same(juju.to_numpy(got), np.asarray(jax.jit(jnp.cos)(x)))
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "pack 'faulty'" in messages and "broken_runner" in messages
    assert "no execute(*buffers)" in messages  # the object() model is refused too

    _faulty_pack(juju_program_runners=lambda: ["not callable"])
    with pytest.warns(RuntimeWarning, match="faulty"):
        error = {p.name: p for p in plugins.packs()}["faulty"].error
    assert isinstance(error, juju.PackError) and "juju_program_runners" in str(error)


def test_a_rule_returning_none_is_a_lowering_error_naming_the_pack(clean_registry):
    def lower_forgot_to_return(ctx, x):
        ops.add(x, x)

    _faulty_pack(juju_rules=lambda: [
        juju.Rule(juju_testpack.double_plus_one_p, lower_forgot_to_return,
                  priority=juju.Priority.USER)
    ])
    x = np.ones(3, np.float32)
    with pytest.raises(juju.LoweringError) as info:
        juju.jit(juju_testpack.double_plus_one).lower(x).as_text()
    message = str(info.value)
    assert "lower_forgot_to_return" in message and "from pack faulty" in message
    assert "None" in message and "testpack_double_plus_one" in message


def test_a_pack_that_fails_is_reported_and_others_still_work(clean_registry):
    class Broken:
        @staticmethod
        @juju.hookimpl
        def juju_rules():
            raise RuntimeError("boom in broken pack")

    plugins.register_pack(Broken, "broken")
    packs = {p.name: p for p in plugins.packs()}
    assert not packs["broken"].loaded and "boom in broken pack" in str(packs["broken"].error)
    assert packs["lax"].loaded
    assert plugins.registry().rules_for(P.sin_p)


def test_registry_generation_is_part_of_the_cache_key(clean_registry):
    before = plugins.generation()
    plugins.reload()
    assert plugins.generation() == before + 1


def test_cli_lists_the_four_packs_with_versions_and_counts():
    result = run_cli()
    assert result.returncode == 0, result.stderr
    for pack in ("core", "lax", "nn", "mojo"):
        line = next(line for line in result.stdout.splitlines() if line.startswith(pack + " "))
        assert "0.1.0" in line and int(line.split()[2]) > 0, line


def test_cli_which_names_the_winning_rule():
    result = run_cli("which", "sin")
    assert result.returncode == 0 and "lax 0.1.0" in result.stdout and "wins" in result.stdout
    missing = run_cli("which", "no_such_primitive")
    assert missing.returncode == 1 and "no loaded pack lowers" in missing.stdout


def test_juju_plugins_env_filters_entry_points():
    result = run_cli(JUJU_PLUGINS="lax")
    names = [line.split()[0] for line in result.stdout.splitlines()[1:-1]]
    assert names == ["core", "lax"], result.stdout


def test_juju_block_plugins_and_autoload_switch():
    blocked = run_cli(JUJU_BLOCK_PLUGINS="testpack,nn")
    names = [line.split()[0] for line in blocked.stdout.splitlines()[1:-1]]
    assert "testpack" not in names and "nn" not in names and "lax" in names
    none = run_cli(JUJU_DISABLE_PLUGIN_AUTOLOAD="1")
    names = [line.split()[0] for line in none.stdout.splitlines()[1:-1]]
    assert names == ["core"], none.stdout


def test_missing_pack_is_named_in_the_error_when_filtered_out():
    code = (
        "import jax.numpy as jnp, numpy as np, juju\n"
        "try:\n"
        "    juju.jit(lambda x: jnp.sin(x) + 1).lower(np.ones(3, np.float32))\n"
        "except juju.MissingRuleError as e:\n"
        "    print(e)\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JUJU_")}
    environment["JUJU_PLUGINS"] = "nn"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environment, timeout=120).stdout
    assert "'sin'" in out and "'add'" in out
    assert "juju-ops-lax is installed but not loaded" in out


def test_the_install_hint_targets_the_running_interpreter(monkeypatch):
    from importlib import metadata

    from juju import _hints

    def not_installed(dist):
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(_hints.metadata, "version", not_installed)
    registry = juju.Registry([], packs=[])
    hint = _hints.provider_hint("conv_general_dilated", registry)
    assert hint == "provided by juju-ops-nn: python -m pip install juju-ops-nn"


def test_juju_plugins_accept_distribution_names():
    only = run_cli(JUJU_PLUGINS="juju-ops-lax")
    assert [line.split()[0] for line in only.stdout.splitlines()[1:-1]] == ["core", "lax"]
    blocked = run_cli(JUJU_BLOCK_PLUGINS="juju_ops_nn,juju-testpack")
    names = [line.split()[0] for line in blocked.stdout.splitlines()[1:-1]]
    assert "nn" not in names and "testpack" not in names and "lax" in names


def test_cli_version_json_hooks_and_did_you_mean():
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("juju-core 0.1.0 (jax ")
    listing = run_cli()
    nn_line = next(line for line in listing.stdout.splitlines() if line.startswith("nn "))
    assert "jaxpr_rewrites" in nn_line  # the nn pack's rewrite is visible
    packs = {p["name"]: p for p in json.loads(run_cli("--json").stdout)["packs"]}
    assert packs["mojo"]["kernel_libraries"] == ["juju_kernels_mojo", "juju_linalg", "juju_sequence",
                                                "juju_blas", "juju_fft"]
    assert "juju_jaxpr_rewrites" in packs["nn"]["hooks"] and packs["lax"]["rules"] > 100
    which = run_cli("which", "sin")
    assert "priority GENERIC (0)" in which.stdout
    typo = run_cli("which", "sinn")
    assert typo.returncode == 1 and "did you mean: sin" in typo.stdout


def test_cli_cache_shows_and_clears(tmp_path):
    (tmp_path / "compiled" / "max-x").mkdir(parents=True)
    (tmp_path / "compiled" / "max-x" / "model.mef").write_bytes(b"0" * 2048)
    shown = run_cli("cache", JUJU_CACHE_DIR=str(tmp_path))
    assert str(tmp_path) in shown.stdout and "1 files" in shown.stdout
    cleared = run_cli("cache", "clear", JUJU_CACHE_DIR=str(tmp_path))
    assert cleared.returncode == 0 and not (tmp_path / "compiled").exists()


def test_a_rule_receives_only_the_dtypes_it_declares(clean_registry):
    """Issue 15: a pack's unguarded real rule above lax's is never handed a
    complex operand (which juju carries as float[..., 2]); a rule that opts
    in to complex64 receives exactly that form, and nothing else."""
    real_calls, complex_shapes = [], []

    def lower_tanh_real_only(ctx, x, accuracy=None):
        real_calls.append(str(x.dtype))
        return ops.tanh(x)

    def lower_exp_complex_only(ctx, x, accuracy=None):
        complex_shapes.append([int(d) for d in x.shape])
        return x

    _faulty_pack(juju_rules=lambda: [
        juju.Rule(P.tanh_p, lower_tanh_real_only, priority=juju.Priority.USER),
        juju.Rule(P.exp_p, lower_exp_complex_only, priority=juju.Priority.USER,
                  dtypes=[np.complex64]),
    ])
    z = (np.linspace(-2, 2, 6) + 1j * np.linspace(1, -1, 6)).astype(np.complex64)
    x = np.linspace(-2, 2, 6, dtype=np.float32)
    f = juju.jit(lambda z, x: (jnp.tanh(z), jnp.tanh(x)))
    low = f.lower(z, x)
    low.as_text()
    assert real_calls == ["DType.float32"]  # the complex tanh went to lax's complex rule

    juju.jit(jnp.exp).lower(z).as_text()
    assert complex_shapes == [[6, 2]]  # the opted-in rule: (real, imaginary) parts
    juju.jit(jnp.exp).lower(x).as_text()
    assert complex_shapes == [[6, 2]]  # not declared for float32: lax's rule lowered it

    assert_same(f(z, x), jax.jit(lambda z, x: (jnp.tanh(z), jnp.tanh(x)))(z, x), rtol=2e-6)


def test_an_undeclared_dtype_is_named_in_the_missing_rule_error(clean_registry):
    real_only = juju.Primitive(
        "real_only_square", lambda ctx, x: ops.mul(x, x), lambda x: x, rules=juju.RuleSet()
    )
    _faulty_pack(juju_rules=lambda: [juju.RuleSet([real_only.rule])])
    z = np.ones(3, np.complex64)
    with pytest.raises(juju.MissingRuleError, match="did not declare complex64"):
        juju.jit(real_only).lower(z).as_text()
    assert juju.Rule(P.exp_p, lambda ctx, x: x, dtypes="complex64").dtypes == {np.dtype(np.complex64)}
    assert juju.Rule(P.exp_p, lambda ctx, x: x).accepts([jax.core.ShapedArray((2,), np.int8)])


def test_juju_primitives_are_the_primitives_jax_binds():
    """`juju.primitives`, the public names packs register rules on: each is a
    JAX primitive (or None where this jax lacks it), and the ones jax keeps
    private are the very objects its programs bind."""
    for name in P.__all__:
        value = getattr(P, name)
        if name == "call_primitives":
            assert value and all(isinstance(p, Primitive) for p in value)
        elif value is not None or name not in P.OPTIONAL:
            assert isinstance(value, Primitive), f"juju.primitives.{name} is {value!r}"
    from jax.extend.core import primitives as public

    assert {n for n in dir(public) if n.endswith("_p")} <= set(P.__all__)

    def bound(f, *args):
        return {e.primitive for e in jax.make_jaxpr(f)(*args).jaxpr.eqns}

    x = jnp.ones(4)
    assert P.split_p in bound(lambda x: jnp.split(x, 2), x)
    assert P.optimization_barrier_p in bound(jax.lax.optimization_barrier, x)
    assert P.pure_callback_p in bound(
        lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct((4,), x.dtype), x), x)
    assert P.debug_callback_p in bound(lambda x: jax.debug.callback(print, x), x)
    assert P.random_wrap_p in bound(jax.random.wrap_key_data, jnp.zeros(2, jnp.uint32))
    with pytest.raises(AttributeError, match="no attribute 'no_such_p'"):
        P.no_such_p
