"""Control flow on MAX against jax.jit: cond/switch, while_loop, scan, fori_loop,
lax.map, associative_scan, on realistic programs. Every case is lowered first
and all are compiled in ONE MAX compilation (module fixture).

These test juju_ops_lax's rules (MAX's `while_loop` and `cond`: what GPU
graphs and loops the Mojo generator does not take use), so the mojo pack is
blocked here; tests/test_loop_kernels.py runs the same cases through the
generated loop kernels."""

from __future__ import annotations

from collections import namedtuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same, packs_blocked

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


State = namedtuple("State", "x step")


# --- cond / switch -----------------------------------------------------------


def cond_pytree(x, y):
    def yes(ops):
        a, b = ops
        return {"sum": a + b, "pair": (a * 2.0, b.sum())}

    def no(ops):
        a, b = ops
        return {"sum": a - b, "pair": (jnp.sin(a), -b.sum())}

    return lax.cond(x.sum() > 0, yes, no, (x, y))


def switch_layers(i, x):
    branches = [
        lambda x: jnp.tanh(x),
        lambda x: jax.nn.relu(x) * 2.0,
        lambda x: x @ x.T,  # different op, same output shape for square x
        lambda x: jnp.zeros_like(x),
    ]
    return lax.switch(i, branches, x)


def cond_operand_none(p, x):
    return lax.cond(p > 0, lambda x: (x, None), lambda x: (-x, None), x)


def guarded_division(n, d, x):
    """The untaken branch divides by zero: it runs (the branches are cheap
    enough to select between) and must neither trap nor leak its NaN."""
    return (lax.cond(d != 0, lambda: n // d, lambda: jnp.int32(0)),
            lax.cond(d != 0, lambda: x / d, lambda: x))


def cond_elementwise(x, y):
    return lax.cond(x[0, 0] > 0, lambda a, b: (a * 2.0, b + 1.0), lambda a, b: (jnp.sin(a), -b),
                    x, y)


def switch_with_loop(i, x):
    """A branch with a loop runs only when taken: MAX's cond."""
    def halve_until_small(v):
        return lax.while_loop(lambda v: jnp.max(jnp.abs(v)) > 1.0, lambda v: v / 2.0, v)

    return lax.switch(i, [halve_until_small, jnp.sin, lambda v: v + 1.0], x)


# --- while -------------------------------------------------------------------


def newton_sqrt(a):
    """Newton's iteration for sqrt(a), elementwise, until converged."""

    def cond(s):
        err = jnp.max(jnp.abs(s.x * s.x - a))  # a reduction in cond_jaxpr
        return (err > 1e-5) & (s.step < 50)

    def body(s):
        return State(0.5 * (s.x + a / s.x), s.step + 1)

    return lax.while_loop(cond, body, State(jnp.ones_like(a), 0))


def while_consts(x, w):
    # body and cond both close over arrays (body/cond consts)
    limit = jnp.sum(w) * 10.0

    def cond(c):
        return jnp.sum(c["v"]) < limit

    def body(c):
        return {"v": c["v"] + jnp.abs(w), "n": c["n"] + 1}

    return lax.while_loop(cond, body, {"v": x, "n": jnp.int32(0)})


def fori_static(x):  # lowered by JAX as a scan
    return lax.fori_loop(0, 7, lambda i, c: c * 0.9 + jnp.float32(i), x)


def fori_dynamic(n, x):  # dynamic trip count: a while
    return lax.fori_loop(0, n, lambda i, c: c * 0.9 + i.astype(jnp.float32), x)


# --- scan --------------------------------------------------------------------


def rnn(params, xs, h0):
    def cell(h, x):
        h = jnp.tanh(h @ params["wh"] + x @ params["wx"] + params["b"])
        return h, h.sum(-1)

    return lax.scan(cell, h0, xs)


def scan_reverse_pytree(xs):
    def body(carry, x):
        a, b = carry
        a = a + x["u"]
        b = b * 0.5 + x["v"].sum()
        return (a, b), {"cum": a, "s": b}

    return lax.scan(body, (jnp.zeros(3), jnp.float32(0)), xs, reverse=True)


def scan_length_no_xs(x):
    return lax.scan(lambda c, _: (c * 1.5 + 1.0, c), x, None, length=6)


def scan_unroll(xs, unroll):
    return lax.scan(lambda c, x: (c + x, c * x), jnp.float32(1), xs, unroll=unroll)


def scan_nested(xs):
    # a cond and a while inside a scan body
    def body(c, x):
        y = lax.cond(x > 0, lambda v: v * 2.0, lambda v: -v, x)
        z = lax.while_loop(lambda t: t < 10.0, lambda t: t * 2.0 + 1.0, jnp.abs(x) + 0.5)
        return c + y, z

    return lax.scan(body, jnp.float32(0), xs)


def lax_map(xs):
    return lax.map(lambda x: jnp.dot(x, x) + jnp.sin(x).sum(), xs)


def assoc_scan(xs):
    return lax.associative_scan(jnp.add, xs)


def scan_length1(xs):
    return lax.scan(lambda c, x: (c + x, c), jnp.float32(0), xs)


def switch_in_loop(xs):
    def body(c, i):
        return c + lax.switch(i % 3, [jnp.sin, jnp.cos, jnp.tanh], c), c

    return lax.scan(body, jnp.float32(0.3), xs)


def _rnn_params():
    return {"wh": f32(8, 8) * 0.3, "wx": f32(4, 8) * 0.3, "b": f32(8)}


CASES = {
    "cond_pytree_true": (cond_pytree, (np.abs(f32(4)), f32(4)), {}),
    "cond_pytree_false": (cond_pytree, (-np.abs(f32(4)), f32(4)), {}),
    "switch_0": (switch_layers, (np.int32(0), f32(3, 3)), {}),
    "switch_2": (switch_layers, (np.int32(2), f32(3, 3)), {}),
    "switch_clamped": (switch_layers, (np.int32(9), f32(3, 3)), {}),
    "switch_negative": (switch_layers, (np.int32(-4), f32(3, 3)), {}),
    "cond_none_leaf": (cond_operand_none, (np.float32(-1), f32(2)), {}),
    "guarded_division_by_zero": (guarded_division, (np.int32(7), np.int32(0), f32(3)), {}),
    "guarded_division": (guarded_division, (np.int32(7), np.int32(-2), f32(3)), {}),
    # past control_flow.SELECT_BUDGET: MAX's cond
    "cond_large_true": (cond_elementwise, (np.abs(f32(200, 400)), f32(200, 400)), {}),
    "cond_large_false": (cond_elementwise, (-np.abs(f32(200, 400)), f32(200, 400)), {}),
    "switch_with_loop_0": (switch_with_loop, (np.int32(0), f32(4) * 10), {}),
    "switch_with_loop_2": (switch_with_loop, (np.int32(2), f32(4) * 10), {}),
    "newton_sqrt": (newton_sqrt, (np.abs(f32(5)) + 0.5,), {}),
    "while_consts": (while_consts, (f32(3), f32(3)), {}),
    "fori_static": (fori_static, (f32(4),), {}),
    "fori_dynamic": (fori_dynamic, (np.int32(5), f32(4)), {}),
    "fori_dynamic_zero": (fori_dynamic, (np.int32(0), f32(4)), {}),
    "rnn": (rnn, (_rnn_params(), f32(12, 2, 4), np.zeros((2, 8), np.float32)), {}),
    "scan_reverse_pytree": (scan_reverse_pytree, ({"u": f32(5, 3), "v": f32(5, 2)},), {}),
    # long enough to stay a loop (length x body > control_flow.UNROLL_BUDGET)
    "rnn_looped": (rnn, (_rnn_params(), f32(150, 2, 4), np.zeros((2, 8), np.float32)), {}),
    "scan_reverse_pytree_looped": (scan_reverse_pytree, ({"u": f32(300, 3), "v": f32(300, 2)},), {}),
    "scan_length_no_xs": (scan_length_no_xs, (f32(2),), {}),
    "scan_unroll_2": (lambda xs: scan_unroll(xs, 2), (f32(8),), {}),
    "scan_unroll_3_remainder": (lambda xs: scan_unroll(xs, 3), (f32(8),), {}),
    "scan_unroll_full": (lambda xs: scan_unroll(xs, True), (f32(5),), {}),
    "scan_nested": (scan_nested, (f32(6),), {}),
    "scan_length1": (scan_length1, (f32(1),), {}),
    "lax_map": (lax_map, (f32(5, 3),), {}),
    "switch_in_loop": (switch_in_loop, (np.arange(7, dtype=np.int32),), {}),
    "assoc_scan": (assoc_scan, (f32(9),), {}),
}

NEEDS = {"assoc_scan": "pad"}  # primitives supplied by other lax modules


@pytest.fixture(scope="module")
def compiled():
    lowered, errors = {}, {}
    with packs_blocked("mojo"):
        for name, (fn, args, kw) in CASES.items():
            try:
                lowered[name] = juju.jit(fn).lower(*args, **kw)
            except juju.MissingRuleError as exc:
                errors[name] = exc
    results = dict(zip(lowered, juju.compile_all(list(lowered.values()))))
    return results, errors


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    results, errors = compiled
    if name in errors:
        if name in NEEDS:
            pytest.xfail(f"needs {NEEDS[name]} rule: {errors[name]}")
        raise errors[name]
    fn, args, kw = CASES[name]
    assert_same(results[name](*args, **kw), jax.jit(fn)(*args, **kw), rtol=2e-5, atol=2e-5)


@packs_blocked("mojo")
def test_cheap_branches_are_selected_others_are_a_max_cond():
    """Branches cheaper than MAX's cond all run and `where` picks; large ones,
    and any with a loop, become `mo.if`."""
    for name, cond in (("cond_pytree_true", False), ("switch_2", False),
                       ("guarded_division", False), ("cond_large_true", True),
                       ("switch_with_loop_0", True)):
        fn, args, _ = CASES[name]
        assert ("mo.if" in juju.jit(fn).lower(*args).as_text()) == cond, name


@packs_blocked("mojo")
def test_loops_do_not_grow_with_the_trip_count():
    """A long scan of a small body keeps AUTO_UNROLL copies of it whatever its
    length (plus the remainder steps when AUTO_UNROLL does not divide it)."""
    from juju_ops_lax.control_flow import AUTO_UNROLL

    def long_scan(x, length):
        return lax.scan(lambda c, _: (jnp.sin(c) + 1.0, None), x, None, length=length)[0]

    for length, copies in ((1000, AUTO_UNROLL), (4000, AUTO_UNROLL), (1001, AUTO_UNROLL + 1)):
        text = juju.jit(long_scan, static_argnums=1).lower(np.float32(0), length).as_text()
        assert "mo.while" in text
        assert text.count("mo.sin") == copies, length


@packs_blocked("mojo")
def test_short_scans_with_outputs_become_straight_line_code():
    """Stacked outputs cost a whole-buffer copy per loop step in MAX: a scan with
    ys is unrolled while length x body stays within UNROLL_BUDGET, looped beyond."""
    from juju_ops_lax.control_flow import UNROLL_BUDGET

    for name, looped in (("rnn", False), ("rnn_looped", True),
                         ("scan_reverse_pytree_looped", True)):
        fn, args, _ = CASES[name]
        text = juju.jit(fn).lower(*args).as_text()
        assert ("mo.while" in text) == looped, name
    text = juju.jit(rnn).lower(*CASES["rnn"][1]).as_text()
    assert text.count("mo.tanh") == 12
    assert 12 * 8 <= UNROLL_BUDGET < 150 * 8


@packs_blocked("mojo")
def test_control_flow_rules_are_selected():
    """The cond/while/scan equations really appear and use this module's rules."""
    from juju import plugins

    registry = plugins.registry()
    for prim, case in (("cond", "cond_pytree_true"), ("while", "newton_sqrt"),
                       ("scan", "scan_length1")):
        fn, args, _ = CASES[case]
        jaxpr = jax.make_jaxpr(fn)(*args)
        eqn = next(e for e in jaxpr.eqns if e.primitive.name == prim)
        from juju.context import LoweringContext
        from max.graph import DeviceRef

        ctx = LoweringContext(
            eqn, tuple(v.aval for v in eqn.invars), tuple(v.aval for v in eqn.outvars),
            DeviceRef.CPU(), None,
        )
        rule = registry.select(ctx)
        assert rule is not None and rule.fn.__module__ == "juju_ops_lax.control_flow"
