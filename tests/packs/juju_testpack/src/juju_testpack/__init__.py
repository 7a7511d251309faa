"""A minimal third-party pack: one new primitive and its MAX rule.

`double_plus_one(x)` computes 2*x + 1; the test suite checks that jit finds
this rule through the `juju` entry point group and that it really ran.
"""

import jax
from jax.extend.core import Primitive
from max.graph import ops

import juju

double_plus_one_p = Primitive("testpack_double_plus_one")
double_plus_one_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype))
double_plus_one_p.def_impl(lambda x: 2 * x + 1)

calls = []  # rule invocations, so tests can prove this rule was used

rules = juju.RuleSet()


@rules.register(double_plus_one_p)
def lower_testpack_double_plus_one(ctx, x):
    calls.append(ctx.eqn)
    two = ctx.constant(2, ctx.avals_in[0].dtype)
    one = ctx.constant(1, ctx.avals_in[0].dtype)
    return ops.add(ops.mul(x, two), one)


def double_plus_one(x):
    return double_plus_one_p.bind(x)


@juju.hookimpl
def juju_rules():
    return [rules]
