"""The tier's comparison of juju's results with jax.jit's: elementwise
first, then normwise or against a float64 run where float32 rounding
alone can explain the difference (`runner._arbitrate`); never a wrong
result. No MAX here: `got` is written by hand."""

import jax.numpy as jnp
import numpy as np
import pytest

from tests.programs import runner
from tests.programs.registry import Program


def _outcome(fn, args, got, expected, rtol=1e-4, atol=1e-5):
    program = Program("case", "jax", lambda size: (fn, args), rtol, atol, None, False, None)
    return runner.Outcome(program, got=got, expected=expected, fn=fn, args=args)


def _bias_gradient(x):
    return jnp.sum(x, axis=0)


def test_a_cancelling_sum_passes_normwise():
    x = np.array([[10.0, 1.0], [-10.0026, 1.0]], np.float32)
    want = np.asarray(_bias_gradient(x))
    got = want + np.float32(2e-5)  # 1% of the cancelled -0.0026, 1e-6 of the terms' scale
    outcome = _outcome(_bias_gradient, (x,), [got], [want])
    runner.compare(outcome)
    assert outcome.arbitrated and "normwise" in outcome.arbitrated[0]


def _normalized(g):  # adam's first step: each element divided by its own size
    return g / (jnp.abs(g) + 1e-8)


def test_float64_judges_an_ill_conditioned_output():
    g = np.array([1e-9, 1.0, -1.0], np.float32)
    exact = np.asarray(_normalized(g), np.float64)
    exact[0] = 1e-9 / (1e-9 + 1e-8)
    want = (exact + [3e-6, 0, 0]).astype(np.float32)  # jax.jit's rounding, say
    got = (exact + [1e-6, 0, 0]).astype(np.float32)  # nearer the float64 result
    outcome = _outcome(_normalized, (g,), [got], [want], rtol=1e-6, atol=1e-9)
    runner.compare(outcome)
    assert "float64" in outcome.arbitrated[-1], outcome.arbitrated
    outcome = _outcome(_normalized, (g,), [want], [got], rtol=1e-6, atol=1e-9)
    with pytest.raises(AssertionError):  # the other way round: juju the less accurate
        runner.compare(outcome)


@pytest.mark.parametrize("wrong", ["value", "nan"])
def test_a_wrong_result_fails(wrong):
    x = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    want = np.asarray(_bias_gradient(x))
    got = want.copy()
    got[1] = np.nan if wrong == "nan" else got[1] * 1.01
    outcome = _outcome(_bias_gradient, (x,), [got], [want])
    with pytest.raises(AssertionError):
        runner.compare(outcome)
