"""`juju.explain` and `python -m juju explain`: which rule of which pack
lowered each equation. They build graphs and never compile one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

import juju
from juju.recording import active_recorder, table
from tests.util import packs_blocked

S = jax.ShapeDtypeStruct


def _scaled_softplus(x, *, scale):
    return scale * jnp.logaddexp(x, 0.0)


# A primitive as libraries define one (no pack lowers it): the fallback does.
scaled_softplus_p = Primitive("explain_scaled_softplus")
scaled_softplus_p.def_impl(_scaled_softplus)
scaled_softplus_p.def_abstract_eval(lambda x, *, scale: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(scaled_softplus_p, mlir.lower_fun(_scaled_softplus,
                                                         multiple_results=False))


def program(x, w):
    y = jnp.sin(x)
    y = lax.cond(y.sum() > 0, lambda a: a * 2, jnp.cos, y)
    y = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + 1.0), (0, y))[1]
    y = scaled_softplus_p.bind(y, scale=2.0)
    _, ys = lax.scan(lambda c, row: (c + row, c * row), jnp.zeros(4), y)  # unrolled
    return lax.conv_general_dilated(ys[None, None], w, (1, 1), "SAME")


ARGS = (S((4, 4), jnp.float32), S((1, 1, 3, 3), jnp.float32))


@pytest.fixture
def no_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("explain compiled a MAX graph")

    monkeypatch.setattr(juju.compile_pool, "compile_jobs", refuse)


def _by_primitive(choices, name):
    found = [c for c in choices if c.primitive == name]
    assert found, f"no '{name}' in {[c.primitive for c in choices]}"
    return found


def test_each_equation_names_its_rule_and_pack(no_compile):
    choices = juju.explain(program, *ARGS)
    paths = [c.path for c in choices]
    assert len(paths) == len(set(paths))  # a while's cond and a scan's body once each

    (sin,) = _by_primitive(choices, "sin")
    assert (sin.how, sin.rule, sin.pack, sin.priority) == ("rule", "direct(sin)", "lax",
                                                            "GENERIC (0)")
    assert sin.depth == 0 and "test_explain.py" in sin.source

    (cond,) = _by_primitive(choices, "cond")
    assert (cond.rule, cond.pack) == ("lower_cond", "lax")
    (cos,) = _by_primitive(choices, "cos")
    assert cos.path == f"{cond.path}/branch0/0" and cos.depth == 1 and cos.pack == "lax"
    assert any(c.path.startswith(f"{cond.path}/branch1/") for c in choices)

    # On the CPU the mojo pack's generated kernels take both loops whole:
    # their bodies are Mojo, not equations juju lowers.
    for name, rule in (("while", "lower_while"), ("scan", "lower_scan")):
        (loop,) = _by_primitive(choices, name)
        assert (loop.rule, loop.pack) == (rule, "mojo")
        assert not any(c.path.startswith(f"{loop.path}/") for c in choices)

    with packs_blocked("mojo"):  # juju_ops_lax's loops lower their bodies
        lax_choices = juju.explain(program, *ARGS)
    (loop,) = _by_primitive(lax_choices, "while")
    assert (loop.rule, loop.pack) == ("lower_while", "lax")
    (lt,) = [c for c in lax_choices if c.path.startswith(f"{loop.path}/cond/")]
    assert lt.primitive == "lt"
    assert any(c.path.startswith(f"{loop.path}/body/") for c in lax_choices)

    (scan,) = _by_primitive(lax_choices, "scan")
    assert (scan.rule, scan.pack) == ("lower_scan", "lax")
    assert any(c.path.startswith(f"{scan.path}/body/") for c in lax_choices)

    (fallback,) = _by_primitive(choices, "explain_scaled_softplus")
    assert (fallback.how, fallback.rule, fallback.pack) == (
        "fallback", "lower_via_jax_implementation", "core")
    assert fallback.priority == "FALLBACK (-100)"
    inside = [c for c in choices if c.path.startswith(f"{fallback.path}/impl/")]
    assert inside and all(c.how == "rule" for c in inside)  # its implementation's pieces

    (conv,) = _by_primitive(choices, "conv_general_dilated")
    assert (conv.how, conv.rule, conv.pack) == ("rule", "lower_conv_general_dilated", "nn")

    assert active_recorder() is None  # recording stops with explain
    text = table(choices)
    assert "fallback: via its JAX implementation" in text
    assert text.splitlines()[-1].startswith(f"{len(choices)} equations; by pack: ")


def test_lowered_explain_is_the_same_and_keeps_the_graph(no_compile):
    fn = juju.jit(program)
    lowered = fn.lower(*ARGS)
    assert lowered.explain() == juju.explain(fn, *ARGS)
    assert fn.compile_count == 0


def test_host_callbacks_are_host_steps(no_compile):
    def with_callback(x):
        y = jnp.cos(x)
        jax.debug.callback(lambda v: None, y)
        return y * 2

    choices = juju.explain(with_callback, S((3,), jnp.float32))
    (callback,) = _by_primitive(choices, "debug_callback")
    assert (callback.how, callback.rule, callback.pack) == ("host", None, None)
    (cos,) = _by_primitive(choices, "cos")
    assert cos.path.startswith("segment") and cos.pack == "lax"
    assert "test_explain.py" in cos.source  # the user's line, through the staging


def test_a_missing_rule_is_raised_as_when_lowering():
    opaque_p = Primitive("explain_opaque")  # no rule, no traceable implementation
    opaque_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
    with pytest.raises(juju.MissingRuleError, match="explain_opaque"):
        juju.explain(opaque_p.bind, S((3,), jnp.float32))


def test_cli_prints_the_table_and_json(no_compile):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUJU_")}
    # Each equation's own rule: with program kernels on, this small program
    # is one `mojo_program` equation (test_program_kernels).
    env["JUJU_PROGRAM_KERNELS"] = "0"
    result = subprocess.run(
        [sys.executable, "-m", "juju", "explain", f"{__file__}:program", "f32[4,4]",
         "float32[1,1,3,3]", "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout)
    packs = {c["primitive"]: c["pack"] for c in found["choices"]}
    assert packs["conv_general_dilated"] == "nn" and packs["while"] == "mojo"
    assert packs["explain_scaled_softplus"] == "core"


@pytest.mark.parametrize("argv, message", [
    (["f32[4,4]", "f3[1,1,3,3]"], "unknown dtype 'f3'; did you mean: f32"),
    (["f32[4,4]", "f32(1,1)"], "bad shape 'f32(1,1)'"),
    (["f32[4,4]"], "cannot take 1 positional argument(s)"),
])
def test_cli_errors_are_clear(capsys, argv, message):
    from juju.__main__ import main

    assert main(["explain", f"{__name__}:program", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_suggests_a_close_name(capsys):
    from juju.__main__ import main

    assert main(["explain", f"{__name__}:progam", "f32[4,4]"]) == 2
    assert "has no attribute 'progam'; did you mean: program?" in capsys.readouterr().err
    assert main(["explain", "no_such_module_anywhere:f"]) == 2
    assert "no module named 'no_such_module_anywhere'" in capsys.readouterr().err
