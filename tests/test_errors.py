"""Errors name what is wrong and what to do; none is a bare KeyError."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from max.graph import ops

import juju
from juju import plugins
from juju._compat import primitives as P

X = np.ones(3, np.float32)

unknown_a = Primitive("unknown_a")
unknown_a.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
unknown_b = Primitive("unknown_b")
unknown_b.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))


@pytest.fixture
def pack():
    """Register an in-process pack for one test."""
    names = []

    def register(rules, name):
        class Pack:
            @staticmethod
            @juju.hookimpl
            def juju_rules():
                return [rules]

        plugins.register_pack(Pack, name)
        names.append(name)

    yield register
    for name in names:
        plugins.unregister_pack(name)
    plugins.reload()


def test_missing_rules_are_all_reported_at_once_with_source_lines():
    def f(x):
        y = unknown_a.bind(x)  # line A
        z = jnp.sin(y)
        return jax.lax.cond(True, lambda v: unknown_b.bind(v), lambda v: v, z)

    with pytest.raises(juju.MissingRuleError) as info:
        juju.jit(f).lower(X)
    err = info.value
    assert {m.primitive for m in err.missing} == {"unknown_a", "unknown_b"}
    message = str(err)
    assert "test_errors.py" in message  # the user's source line
    assert "unknown_a" in message and "unknown_b" in message
    assert "equation:" in message and "python -m juju" in message
    assert not isinstance(err, KeyError)
    assert any("unknown_a" in m.equation for m in err.missing)


def test_a_failing_rule_reports_its_equation_and_chains_the_cause(pack):
    rules = juju.RuleSet()

    @rules.register(unknown_a)
    def lower_unknown_a(ctx, x):
        raise ValueError("the real reason")

    pack(rules, "failing")

    def f(x):
        return unknown_a.bind(x * 2)

    with pytest.raises(juju.LoweringError) as info:
        juju.jit(f).lower(X).as_text()
    message = str(info.value)
    assert "unknown_a" in message and "test_errors.py" in message
    assert "lower_unknown_a" in message and "pack failing" in message
    assert "the real reason" in message
    assert isinstance(info.value.__cause__, ValueError)


def test_a_rule_with_wrong_output_shape_fails_at_its_equation(pack):
    rules = juju.RuleSet()

    @rules.register(unknown_a)
    def lower_unknown_a(ctx, x):
        return ops.reshape(x, [3, 1])

    pack(rules, "wrong_shape")
    with pytest.raises(juju.LoweringError, match=r"output 0 is .*\[3, 1\].*expects.*\[3\]"):
        juju.jit(lambda x: unknown_a.bind(x)).lower(X).as_text()


def test_gpu_engine_without_gpu_is_a_clear_error():
    from max import driver

    if driver.accelerator_count() > 0:
        pytest.skip("this machine has a GPU")
    with pytest.raises(juju.EngineUnavailableError, match="cpu_engine"):
        juju.gpu_engine()


def test_errors_never_escape_as_bare_key_errors():
    for cls in (juju.MissingRuleError, juju.LoweringError, juju.RuleConflictError,
                juju.UnsupportedDtypeError, juju.CompileError):
        assert issubclass(cls, juju.JujuError) and not issubclass(cls, KeyError)


def test_neutral_param_only_in_direct_rules():
    rule = juju.direct(ops.sin)

    class Ctx:
        primitive = P.sin_p

    with pytest.raises(NotImplementedError, match="accuracy"):
        rule(Ctx(), None, accuracy="high")


def test_user_errors_show_the_users_frames_not_jujus():
    import traceback
    from pathlib import Path

    def model(x):
        return x.reshape(7, 3)  # wrong shape: a user error at trace time

    with pytest.raises(TypeError) as info:
        juju.jit(model)(np.ones(4, np.float32))
    files = [Path(f.filename) for f in traceback.extract_tb(info.value.__traceback__)]
    juju_dir = Path(juju.__file__).parent
    assert not [f for f in files if juju_dir in f.parents], files
    assert any(f.name == "test_errors.py" for f in files)


def test_programs_jax_rejects_at_lowering_get_jaxs_error():
    """jax.linearize of a custom_vjp function traces, leaving a `custom_lin`
    that jax.jit's lowering rejects with a TypeError: juju raises the same."""

    @jax.custom_vjp
    def f(x):
        return jnp.sin(x)

    f.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (g * jnp.cos(x),))

    def tangent(x):
        return jax.linearize(f, x)[1](jnp.ones_like(x))

    with pytest.raises(TypeError) as expected:
        jax.jit(tangent).lower(X)
    with pytest.raises(juju.InvalidProgramError) as info:
        juju.jit(tangent).lower(X)
    assert isinstance(info.value, TypeError) and str(info.value) == str(expected.value)
