"""juju.patterns, the jaxpr matcher packs use to recognise what a library
function traces to (no MAX needed: these tests read jaxprs only)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from juju.patterns import Any, Lit, Match, Matcher, Op, Opt, X, is_number, near


def _open(f, *args):
    return jax.make_jaxpr(f)(*args).jaxpr


def _match(pattern, jaxpr):
    return Matcher(jaxpr).match(pattern, jaxpr.outvars[0], Match())


X32 = np.ones(4, np.float32)


def test_commutative_ops_match_either_operand_order():
    pattern = Op("mul", Lit(near(0.5), "half"), X("x"))
    for f in (lambda x: 0.5 * x, lambda x: x * 0.5):
        jaxpr = _open(f, X32)
        m = _match(pattern, jaxpr)
        assert m is not None and m.binds["half"] == 0.5
        assert m.binds["x"] is jaxpr.invars[0]
    assert _match(Op("sub", Lit(near(0.5)), X("x")), _open(lambda x: x - 0.5, X32)) is None


def test_a_name_bound_twice_must_be_the_same_value():
    square = Op("mul", X("x"), X("x"))
    assert _match(square, _open(lambda x: x * x, X32)) is not None
    assert _match(square, _open(lambda x, y: x * y, X32, X32)) is None
    # a structurally identical recomputation counts as the same value
    assert _match(square, _open(lambda x: jnp.exp(x) * jnp.exp(x), X32)) is not None


def test_any_opt_where_and_named_equations():
    pattern = Any(Op("exp", Opt("stop_gradient", X("x")), name="e"), Op("log", X("x")))
    m = _match(pattern, _open(lambda x: jnp.exp(lax.stop_gradient(x)), X32))
    assert m is not None and m.binds["e"].primitive.name == "exp" and len(m.eqns) == 2
    assert _match(pattern, _open(jnp.log, X32)) is not None
    assert _match(pattern, _open(jnp.sin, X32)) is None
    cube = Op("integer_pow", X("x"), where=lambda e: e.params["y"] == 3)
    assert _match(cube, _open(lambda x: x ** 3, X32)) is not None
    assert _match(cube, _open(lambda x: x ** 2, X32)) is None


def test_closed_rejects_a_match_whose_intermediate_escapes():
    pattern = Op("add", Op("exp", X("x")), Lit(is_number))
    private = _open(lambda x: jnp.exp(x) + 1.0, X32)
    m = _match(pattern, private)
    assert Matcher(private).closed(m, private.eqns[-1])
    reused = _open(lambda x: (lambda e: (e + 1.0, e * 2.0))(jnp.exp(x)), X32)
    add = next(e for e in reused.eqns if e.primitive.name == "add")
    m = Matcher(reused).match(pattern, add.outvars[0], Match())
    assert m is not None and not Matcher(reused).closed(m, add)
