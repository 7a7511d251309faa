"""The core's fallback: a primitive that no pack lowers, lowered by tracing
the JAX implementation XLA's lowering traces (`mlir.lower_fun`), vs jax.jit.

Equinox's primitives (every diffrax solve binds them) and primitives defined
here the way libraries define them; all cases share one compilation.
"""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import Primitive
from jax.interpreters import mlir

import juju
from juju import Priority, plugins
from juju.errors import MissingRuleError
from tests.util import assert_same

try:  # not a juju dependency: its cases run where it is installed
    import equinox as eqx
    from equinox.internal import nonbatchable, unvmap_all, unvmap_any, unvmap_max
    from equinox.internal._loop.common import _maybe_set, _select_if_vmap
except ImportError:
    eqx = None
needs_equinox = pytest.mark.skipif(eqx is None, reason="equinox is not installed")


def _primitive(name, impl, abstract_eval, multiple_results=False):
    """A primitive as libraries define one: an impl, and XLA lowering by tracing it."""
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=multiple_results))
    return prim


def _scaled_softplus(x, *, scale):
    return scale * jnp.logaddexp(x, 0.0)


scaled_softplus_p = _primitive(
    "test_scaled_softplus", _scaled_softplus, lambda x, *, scale: jax.core.ShapedArray(
        x.shape, x.dtype))


def _halves(x):
    n = x.shape[0] // 2
    return [x[:n], x[n:] * 2]


halves_p = _primitive(
    "test_halves", _halves,
    lambda x: [jax.core.ShapedArray((x.shape[0] // 2,), x.dtype),
               jax.core.ShapedArray((x.shape[0] - x.shape[0] // 2,), x.dtype)],
    multiple_results=True)

# No traceable implementation: XLA lowers it to StableHLO directly.
opaque_p = Primitive("test_opaque")
opaque_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(opaque_p, lambda ctx, x: [x])

# Traceable, but binds a primitive nothing lowers: the pre-pass must report it.
uses_opaque_p = _primitive(
    "test_uses_opaque", lambda x: opaque_p.bind(x) + 1,
    lambda x: jax.core.ShapedArray(x.shape, x.dtype))

# An implementation that binds the primitive itself: lowering it would recurse.
recursive_p = Primitive("test_recursive")
recursive_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(recursive_p, mlir.lower_fun(lambda x: recursive_p.bind(x),
                                                   multiple_results=False))


def equinox_primitives(x, i):
    pred = x[0] > 0
    return (unvmap_any(x > 2), unvmap_all(x > -1), unvmap_max(i), nonbatchable(x * 2),
            _select_if_vmap(pred, x, -x, makes_false_steps=False),
            _maybe_set(pred, x, 7.0, 1, kwargs={}, makes_false_steps=False))


def equinox_in_a_loop(x):
    # eqx.internal.while_loop (diffrax's loop) binds select_if_vmap/maybe_set
    # in a checkpointed loop body.
    def body(carry):
        step, y = carry
        return step + 1, y * 0.5 + 1.0

    return eqx.internal.while_loop(lambda c: c[0] < 5, body, (0, x), max_steps=8,
                                   kind="checkpointed", checkpoints=2)


def library_style(x):
    a, b = halves_p.bind(x)
    return scaled_softplus_p.bind(x, scale=3.0), a, b, jnp.tile(x[:3], 2), jnp.tile(x, (2, 1))


X = np.array([-1.5, 0.5, 2.5, 4.0], np.float32)
CASES = {"library_style": (library_style, (X,))}
if eqx is not None:
    CASES["equinox_primitives"] = (equinox_primitives, (
        np.array([1.0, -2.0, 3.0, 0.5], np.float32), np.array([3, 9, -2], np.int32)))
    CASES["equinox_in_a_loop"] = (equinox_in_a_loop, (X,))
JITTED = {name: juju.jit(fn) for name, (fn, _) in CASES.items()}


@pytest.fixture(scope="module")
def compiled():
    juju.compile_all([JITTED[name].lower(*args) for name, (_, args) in CASES.items()])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    fn, args = CASES[name]
    assert_same(JITTED[name](*args), jax.jit(fn)(*args))


def test_fallback_is_the_lowest_priority_rule():
    (rule,) = plugins.registry().catch_all()
    assert (rule.pack, rule.priority) == ("core", Priority.FALLBACK)
    assert Priority.FALLBACK < Priority.GENERIC
    # A primitive with a rule of its own never reaches the fallback.
    assert plugins.registry().candidates(jax.lax.sin_p)[-1] is rule


def test_fallback_traces_into_the_same_graph():
    text = juju.jit(lambda x: scaled_softplus_p.bind(x, scale=3.0)).lower(X).as_text()
    assert "test_scaled_softplus" not in text and "rmo.mul" in text


def test_untraceable_and_missing_inner_primitives_are_reported_at_once():
    def program(x):
        return opaque_p.bind(x), uses_opaque_p.bind(x), recursive_p.bind(x)

    with pytest.raises(MissingRuleError) as info:
        juju.jit(program).lower(X)
    missing = [m.primitive for m in info.value.missing]
    # uses_opaque is lowered through the fallback; the opaque primitive inside it is not.
    assert sorted(missing) == ["test_opaque", "test_opaque", "test_recursive"]
    text = str(info.value)
    assert "StableHLO directly" in text and "binds the primitive itself" in text


@needs_equinox
def test_which_says_via_its_jax_implementation():
    result = subprocess.run([sys.executable, "-m", "juju", "which", "unvmap_any"],
                            capture_output=True, text=True, check=True)
    assert "via its JAX implementation" in result.stdout
    assert "equinox._unvmap._unvmap_any_impl" in result.stdout


def test_coverage_lists_every_registered_primitive_with_its_status():
    from juju import coverage

    status = {e.name: e.status for e in coverage.entries()}
    assert status["sin"] == "rule" and status["tile"] == "rule"
    assert status["pure_callback"] == status["debug_callback"] == "host"  # juju/host.py
    assert status["rng_bit_generator"] == "rule"
    assert status["test_scaled_softplus"] == "fallback"  # defined in this module
    if eqx is not None:
        assert status["unvmap_any"] == status["maybe_set"] == "fallback"
