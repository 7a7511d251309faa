"""The lax pack's Jaxpr rewrites: transpose(dot_general(a, b)) of matrices
becomes dot_general(b, a) (JAX writes dense-layer weight gradients that way),
and a transpose feeding a dot_general folds into its dimension numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from juju_ops_lax.rewrites import fold_transposed_dots, fold_transposed_operands
from tests.util import assert_same

rng = np.random.default_rng(11)


def dense_grads(w, x, b):
    # weight gradient: dot_general(g, x) then transpose; also a dot used twice
    loss = lambda w: jnp.sum(jnp.tanh(x @ w) ** 2)  # noqa: E731
    d = x.T @ b
    return jax.grad(loss)(w), d.T, d.sum(), (x @ w).T


ARGS = (rng.normal(size=(6, 4)).astype(np.float32), rng.normal(size=(5, 6)).astype(np.float32),
        rng.normal(size=(5, 3)).astype(np.float32))


def test_transposed_dots_are_folded():
    closed = jax.make_jaxpr(dense_grads)(*ARGS)
    before = [e.primitive.name for e in closed.jaxpr.eqns]
    after = [e.primitive.name for e in fold_transposed_dots(closed).jaxpr.eqns]
    # the gradient's and the last output's transposes go; `d.T` stays (d has two uses)
    assert before.count("transpose") - after.count("transpose") == 2
    # `x.T @ b`'s transpose folds into its dot too
    operands = [e.primitive.name for e in
                fold_transposed_operands(fold_transposed_dots(closed)).jaxpr.eqns]
    assert after.count("transpose") - operands.count("transpose") == 1
    assert before.count("dot_general") == after.count("dot_general")


def test_folded_program_matches_jax():
    assert_same(juju.jit(dense_grads)(*ARGS), jax.jit(dense_grads)(*ARGS), rtol=1e-5, atol=1e-5)


def transposed_operands(x, w, q, k, a, b):
    wt = w.T
    return (x @ w.T,                                        # rhs folds
            jnp.transpose(q, (0, 2, 1)) @ k,                # batched, lhs folds
            a.T @ b.T,                                      # both operands fold
            jnp.transpose(q, (1, 0, 2)) @ jnp.ones((7, 3)),  # free dims would reorder: stays
            jnp.transpose(q, (2, 0, 1)).sum(),              # not a dot's operand: stays
            x @ wt, wt.sum())                               # wt has two uses: stays


OPERAND_ARGS = tuple(rng.normal(size=s).astype(np.float32)
                     for s in ((5, 4), (3, 4), (2, 6, 7), (2, 6, 7), (4, 5), (3, 4)))


def test_transposed_operands_fold_and_match_jax():
    closed = jax.make_jaxpr(transposed_operands)(*OPERAND_ARGS)
    before = [e.primitive.name for e in closed.jaxpr.eqns]
    after = [e.primitive.name for e in fold_transposed_operands(closed).jaxpr.eqns]
    assert before.count("transpose") - after.count("transpose") == 4
    assert before.count("dot_general") == after.count("dot_general")
    assert_same(juju.jit(transposed_operands)(*OPERAND_ARGS),
                jax.jit(transposed_operands)(*OPERAND_ARGS), rtol=1e-5, atol=1e-5)


def test_literal_operands_are_left_alone():
    """A dot_general with a Literal operand (a scalar constant, which jax
    inlines) is not a transpose's: the rewrite skips it (it raised
    `unhashable type: 'Literal'`, failing every program with one, such as
    the factorizations of tests/test_linalg_kernels.py)."""
    from jax import lax

    def scaled(x):
        return lax.dot_general(x, np.float32(2.0), (((), ()), ((), ()))), x.T @ x

    closed = jax.make_jaxpr(scaled)(ARGS[0])
    assert any(isinstance(v, jax.extend.core.Literal) for e in closed.jaxpr.eqns
               if e.primitive.name == "dot_general" for v in e.invars)
    folded = fold_transposed_operands(closed)
    # the other dot's transposed operand still folds
    assert [e.primitive.name for e in folded.jaxpr.eqns].count("transpose") == 0
    assert_same(juju.jit(scaled)(ARGS[0]), jax.jit(scaled)(ARGS[0]))


def reduced_broadcasts(x, w, flags):
    """Reductions of broadcasts (distrax's mixtures): over axes the
    broadcast kept (moved before it), over axes it made (max, min, all; a
    sum of +0.0s), and three left alone (sums of copies of values that may
    be nonzero or -0.0)."""
    big = jnp.broadcast_to(x[:, None, :], (x.shape[0], 5, x.shape[1]))
    spread = jnp.broadcast_to(w, (7, *w.shape))
    zeros = jnp.broadcast_to(-0.0 * jnp.ones(()), (7, 4))
    return (big.sum(2), big.max(1), spread.sum((0, 2)), spread.min((0, 1)),
            jnp.broadcast_to(flags, (3, *flags.shape)).all(0), zeros.sum(1),
            jnp.zeros((6, 3), jnp.float32).sum(0),
            jnp.broadcast_to(x[:, :1], x.shape).sum(1))


RB_ARGS = (np.array([[1.0, np.nan, -0.0], [np.inf, 2.0, -1.0], [0.5, -0.0, 3.0],
                     [-np.inf, 4.0, 1e30]], np.float32),
           rng.normal(size=(4, 3)).astype(np.float32), np.array([True, False, True]))


def test_reduced_broadcasts_are_folded_and_match_jax():
    from juju_ops_lax.rewrites import fold_reduced_broadcasts

    closed = jax.make_jaxpr(reduced_broadcasts)(*RB_ARGS)
    folded = fold_reduced_broadcasts(closed)

    def of_broadcasts(c):
        made = {e.outvars[0] for e in c.jaxpr.eqns if e.primitive.name == "broadcast_in_dim"}
        return sum(e.primitive.name.startswith("reduce_") and e.invars[0] in made
                   for e in c.jaxpr.eqns)

    assert (of_broadcasts(closed), of_broadcasts(folded)) == (8, 3)
    assert_same(juju.jit(reduced_broadcasts, tiered=False)(*RB_ARGS),
                jax.jit(reduced_broadcasts)(*RB_ARGS))
    assert_same(jax.core.eval_jaxpr(folded.jaxpr, folded.consts, *RB_ARGS),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *RB_ARGS))


def rnn_grads(w, xs):
    """An RNN's weight gradient: JAX writes it in the backward scan's body
    as at the top, a transposed product accumulated each step, and inside
    a cond's branches and a jitted call; a solve (custom_linear_solve: its
    jaxprs in a namedtuple)."""
    def loss(w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h
        return jnp.sum(jax.lax.scan(step, xs[0], xs)[1] ** 2)

    grad = jax.jit(jax.grad(loss))(w)
    branch = jax.lax.cond(grad[0, 0] > 0, lambda: (xs[0:2].T @ xs[2:4]).T, lambda: grad[:4, :4])
    return grad, branch, jnp.linalg.solve(grad + 4 * jnp.eye(4), xs[0])


RNN_ARGS = (rng.normal(size=(4, 4)).astype(np.float32) / 2,
            rng.normal(size=(6, 2, 4)).astype(np.float32)[:, 0])


def _transposes(jaxpr) -> int:
    """The transposes in `jaxpr` and every jaxpr inside it."""
    count = 0
    for e in jaxpr.eqns:
        count += e.primitive is jax.lax.transpose_p
        for value in e.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if isinstance(inner, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    count += _transposes(getattr(inner, "jaxpr", inner))
    return count


def test_rewrites_reach_inside_loops_branches_and_calls():
    from juju_ops_lax.plugin import juju_jaxpr_rewrites

    closed = jax.make_jaxpr(rnn_grads)(*RNN_ARGS)
    rewritten = closed
    for rewrite in juju_jaxpr_rewrites():
        rewritten = rewrite(rewritten)
    assert _transposes(closed.jaxpr) >= 2 and _transposes(rewritten.jaxpr) == 0, \
        (_transposes(closed.jaxpr), _transposes(rewritten.jaxpr))
    assert_same(juju.jit(rnn_grads, tiered=False)(*RNN_ARGS), jax.jit(rnn_grads)(*RNN_ARGS),
                rtol=1e-5, atol=1e-5)


EXPONENT = jnp.float32(2.0)  # a constant of the jaxpr, as jax-md's potentials hold theirs


def constant_powers(x, y):
    """`x ** 2.0` (jnp writes pow, not integer_pow), its derivative's
    `x ** (2.0 - 1.0)`, an exponent held as a constant, -1, and powers left
    as they are: 3.0, an exponent that is an argument."""
    def potential(r):
        return jnp.sum((1.0 - r) ** EXPONENT / EXPONENT)

    return (x ** 2.0, x ** -1.0, x ** 1.0, x ** 3.0, x ** (EXPONENT * 0.5),
            jax.grad(potential)(x), y ** 2.0, (x + 1.0) ** y)


POW_ARGS = (np.array([0.0, -0.0, 1.0, -1.0, 2.5, -3.5, np.inf, -np.inf, np.nan, 1e-30, 1e30,
                      -1e20, 1e-45, 0.75], np.float32), np.float32(2.0))
# (no 3e38: XLA folds the gradient's 2 * x / 2 where jax's own op-by-op run overflows)


def test_constant_powers_are_products_and_match_jax():
    from juju_ops_lax.rewrites import everywhere, fold_constant_powers

    closed = jax.make_jaxpr(constant_powers)(*POW_ARGS)

    def powers(c):
        return sum(e.primitive.name == "pow" for e in c.jaxpr.eqns) + sum(
            powers(v) for e in c.jaxpr.eqns for v in e.params.values()
            if isinstance(v, jax.extend.core.ClosedJaxpr))

    assert powers(closed) == 9 and powers(everywhere(fold_constant_powers)(closed)) == 2
    # values, signed zeros, infinities and NaN exactly as jax.jit's (MAX ops here)
    got = juju.jit(constant_powers, tiered=False)(*POW_ARGS)
    want = jax.jit(constant_powers)(*POW_ARGS)
    for g, w in zip(got, want, strict=True):
        g, w = juju.to_numpy(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
        numbers = ~np.isnan(w)  # signed zeros and infinities (a NaN's sign is not kept)
        np.testing.assert_array_equal(np.signbit(g[numbers]), np.signbit(w[numbers]))


def loop_invariants(x, n):
    """Loop bodies computing from the loops' constants only: an identity
    mask inside a jitted helper (as jax-md's energy builds one each step),
    a nested loop's invariant, a while's; a broadcast (left: read in place)
    and a pure_callback (left: jax.jit calls it each trip)."""
    @jax.jit
    def masked(c):
        eye = jnp.eye(c.shape[0], dtype=c.dtype)
        return c * (1.0 - eye) + jnp.sin(x) * eye

    def host(v):
        return np.asarray(v) * 2.0

    a = jax.lax.fori_loop(0, 3, lambda i, c: jnp.tanh(masked(c) + i), x)

    def outer(i, c):
        return jax.lax.fori_loop(0, 2, lambda j, d: d + jnp.cos(x) * jnp.ones_like(x), c)

    b = jax.lax.fori_loop(0, 2, outer, x)

    def step(s):
        i, c = s
        twice = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return i + 1, c * 0.5 + jnp.exp(x) + twice

    return a, b, jax.lax.while_loop(lambda s: s[0] < n, step, (0, x))[1]


def _loop_bodies_primitives(jaxpr, inside=False) -> list:
    """The primitives of equations inside loop bodies, at any depth."""
    found = []
    for e in jaxpr.eqns:
        if inside:
            found.append(e.primitive.name)
        loop = e.primitive.name in ("scan", "while")
        for value in e.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                if isinstance(inner, (jax.extend.core.ClosedJaxpr, jax.extend.core.Jaxpr)):
                    found += _loop_bodies_primitives(getattr(inner, "jaxpr", inner),
                                                     inside or loop)
    return found


def test_loop_invariants_are_hoisted_and_match_jax():
    from juju_ops_lax.rewrites import everywhere, hoist_loop_invariants

    x = rng.normal(size=(5, 5)).astype(np.float32)
    closed = jax.make_jaxpr(loop_invariants)(x, 3)
    hoisted = everywhere(hoist_loop_invariants)(closed)
    before, after = _loop_bodies_primitives(closed.jaxpr), _loop_bodies_primitives(hoisted.jaxpr)
    # jax >= 0.11 describes a scan's operands by flat trees: its scans stay as they are
    scans_hoist = "num_consts" in next(e for e in closed.jaxpr.eqns if e.primitive.name == "scan").params
    moved = ("iota", "sin", "cos", "exp") if scans_hoist else ("exp",)
    for name in moved:
        assert before.count(name) >= 1 and name not in after, name
    assert after.count("pure_callback") == 1 and "broadcast_in_dim" in after
    assert_same(jax.core.eval_jaxpr(hoisted.jaxpr, hoisted.consts, x, 3),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x, 3))
    assert_same(juju.jit(loop_invariants, tiered=False)(x, 3), jax.jit(loop_invariants)(x, 3),
                rtol=1e-6, atol=1e-6)


def batched_branches(flags, board, score):
    """A `lax.cond` under `vmap` (pgx's batched step): select_n of both
    branches' results, where a branch passes a value through; once at the
    top, once inside a scan's body."""
    def step(flag, b, s):
        return jax.lax.cond(flag, lambda b, s: (b, s + 1.0), lambda b, s: (b, s * 2.0), b, s)

    top = jax.vmap(step)(flags, board, score)

    def body(carry, _):
        b, s = jax.vmap(step)(flags, *carry)
        return (b + 1, s), s.sum()

    return top, jax.lax.scan(body, (board, score), None, length=3)


def test_selects_of_one_value_are_folded_and_match_jax():
    from juju_ops_lax.rewrites import everywhere, fold_trivial_selects

    flags = np.array([True, False, True, False])
    board = rng.integers(-5, 5, size=(4, 6)).astype(np.int32)
    score = np.array([1.0, np.nan, -0.0, np.inf], np.float32)
    closed = jax.make_jaxpr(batched_branches)(flags, board, score)

    def selects(jaxpr) -> int:
        inner = [v.jaxpr for e in jaxpr.eqns for v in e.params.values()
                 if isinstance(v, jax.extend.core.ClosedJaxpr)]
        return sum(e.primitive.name == "select_n" for e in jaxpr.eqns) + sum(map(selects, inner))

    folded = everywhere(fold_trivial_selects)(closed)
    assert selects(closed.jaxpr) == 10 and selects(folded.jaxpr) == 2  # the scores' stay
    args = (flags, board, score)
    assert_same(jax.core.eval_jaxpr(folded.jaxpr, folded.consts, *args),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *args))
    got = juju.jit(batched_branches, tiered=False)(*args)
    want = jax.jit(batched_branches)(*args)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = juju.to_numpy(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)


def repeated_work(a, b):
    """What XLA's CSE merges: one matrix factored by slogdet, det and two
    lu_factors (each in its own call), repeated elementwise work and
    softmaxes; and what it must not: two host callbacks (jax.jit calls
    each)."""
    sign, logdet = jnp.linalg.slogdet(a)
    lu, _ = jax.scipy.linalg.lu_factor(a)
    twice = jax.pure_callback(lambda x: np.asarray(x) * 2, jax.ShapeDtypeStruct(b.shape, b.dtype), b)
    again = jax.pure_callback(lambda x: np.asarray(x) * 2, jax.ShapeDtypeStruct(b.shape, b.dtype), b)
    return (sign, logdet, jnp.linalg.det(a), lu, jax.scipy.linalg.lu_factor(a)[1],
            jnp.sin(b) * jnp.sin(b), jax.nn.softmax(b) + jax.nn.softmax(b), twice + again)


def _primitive_names(jaxpr, out):
    for e in jaxpr.eqns:
        out.append(e.primitive.name)
        for v in e.params.values():
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                _primitive_names(v.jaxpr, out)
    return out


def _as_generated(closed, simplify):
    """`closed` with `simplify(eqns, outvars) -> (eqns, outvars)` applied to
    each of its jaxprs, loop bodies too, after their calls are inlined: as
    the generator applies it (codegen/emitter.py)."""
    from juju import inlining
    from juju._compat import ClosedJaxpr
    from juju_ops_lax.rewrites import everywhere

    def one(c):
        eqns, outvars, consts, _ = inlining.inlined(c.jaxpr)
        eqns, outvars = simplify(eqns, outvars)
        jaxpr = c.jaxpr.replace(constvars=[*c.jaxpr.constvars, *(v for v, _ in consts)],
                                eqns=eqns, outvars=outvars)
        return ClosedJaxpr(jaxpr, [*c.consts, *(value for _, value in consts)])

    return everywhere(one)(closed)


def test_repeated_equations_are_computed_once_and_match_jax():
    from juju_ops_lax.rewrites import repeats_merged

    a = rng.normal(size=(6, 6)).astype(np.float32)
    b = rng.normal(size=6).astype(np.float32)
    closed = jax.make_jaxpr(repeated_work)(a, b)
    merged = _as_generated(closed, lambda eqns, outvars: repeats_merged(eqns, outvars)[:2])
    before, after = _primitive_names(closed.jaxpr, []), _primitive_names(merged.jaxpr, [])
    assert before.count("lu") == 4 and after.count("lu") == 1
    assert before.count("sin") == 2 and after.count("sin") == 1
    assert after.count("pure_callback") == before.count("pure_callback") == 2
    assert_same(jax.core.eval_jaxpr(merged.jaxpr, merged.consts, a, b),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, a, b))
    assert_same(juju.jit(repeated_work, tiered=False)(a, b), jax.jit(repeated_work)(a, b),
                rtol=1e-5, atol=1e-5)


def counters(x):
    """Elementwise work on broadcasts (a loop counter made an array, jnp's
    remainder and floor division of it in their own calls), and betainc,
    whose continued fraction does the same each iteration."""
    def body(i, acc):
        k = jnp.full(x.shape, i)
        odd = (k % 2) == 1
        return acc + jnp.where(odd, x, -x) * (k // 2).astype(x.dtype) + jnp.float32(0.5) * k

    unit = jnp.clip(jnp.abs(x), 0.05, 0.95)
    return jax.lax.fori_loop(0, 5, body, x), jax.scipy.special.betainc(2.0, 3.0, unit)


def test_elementwise_work_moves_below_broadcasts_and_matches_jax():
    from juju_ops_lax.rewrites import below_broadcasts

    x = rng.normal(size=(4, 6)).astype(np.float32)
    closed = jax.make_jaxpr(counters)(x)
    moved = _as_generated(closed, lambda eqns, outvars: (below_broadcasts(eqns, outvars),
                                                          outvars))

    def array_muls(jaxpr):  # 0.5 * k: on the full shape before, on the counter after
        inner = [v.jaxpr for e in jaxpr.eqns for v in e.params.values()
                 if isinstance(v, jax.extend.core.ClosedJaxpr)]
        return sum(e.primitive.name == "mul" and e.outvars[0].aval.shape == x.shape
                   and any(getattr(a, "aval", None) is not None and a.aval.shape == ()
                           for a in e.invars) for e in jaxpr.eqns) + sum(map(array_muls, inner))

    assert array_muls(closed.jaxpr) >= 1 and array_muls(moved.jaxpr) < array_muls(closed.jaxpr)
    assert_same(jax.core.eval_jaxpr(moved.jaxpr, moved.consts, x),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, x))
    assert_same(juju.jit(counters, tiered=False)(x), jax.jit(counters)(x), rtol=1e-5, atol=1e-6)


def factored(a):
    """One matrix factored by slogdet, det and lu_factor twice, each in
    its own call: XLA factors it once."""
    sign, logdet = jnp.linalg.slogdet(a)
    return sign, logdet, jnp.linalg.det(a), jax.scipy.linalg.lu_factor(a)[0], \
        jax.scipy.linalg.lu_factor(a)[1]


def test_generated_kernels_merge_repeats_and_move_work_below_broadcasts(monkeypatch):
    """In a generated kernel (calls inlined first): one LAPACK LU for four,
    and the rewrites' programs match jax.jit."""
    from tests.test_program_kernels import _program_source

    monkeypatch.setenv("JUJU_PROGRAM_KERNELS", "1")
    a = (rng.normal(size=(32, 32)) + 8 * np.eye(32)).astype(np.float32)
    source = _program_source(factored, a)
    assert source.count("lapack_getrf[") - 1 == 1  # less its definition
    assert_same(juju.jit(factored, tiered=False)(a), jax.jit(factored)(a), rtol=1e-4, atol=1e-4)
    x = rng.normal(size=(4, 6)).astype(np.float32)
    assert_same(juju.jit(counters, tiered=False)(x), jax.jit(counters)(x), rtol=1e-5, atol=1e-6)


def squared_kernel_products(k, f, u, v):
    """Sinkhorn's shape: elementwise work on transposes of a kernel matrix
    (squared, scaled, exp of a sum of two transposes), then products."""
    first = (jnp.transpose(k + f[:, None]) ** 2) @ u
    second = jnp.exp(0.1 * (jnp.transpose(3.0 * k) + jnp.transpose(k))) @ v
    return first, second, jnp.transpose(k - 1.0) * 2.0  # no product: a transpose stays


def test_elementwise_work_moves_above_transposes_into_the_products():
    """In generated kernels (as the generator applies it): elementwise work
    on transposes is done on their operands and the one transpose of the
    result folds into the product, so no transpose is left before them;
    the program matches jax.jit."""
    from juju_ops_lax.rewrites import above_transposes, transposes_folded

    k = rng.normal(size=(48, 40)).astype(np.float32)
    f, u, v = (rng.normal(size=n).astype(np.float32) for n in (48, 48, 48))
    closed = jax.make_jaxpr(squared_kernel_products)(k, f, u, v)
    moved = _as_generated(closed, lambda eqns, outvars: (
        transposes_folded(above_transposes(eqns, outvars), outvars), outvars))
    before, after = _primitive_names(closed.jaxpr, []), _primitive_names(moved.jaxpr, [])
    assert before.count("transpose") == 4 and after.count("transpose") == 1, after
    assert_same(jax.core.eval_jaxpr(moved.jaxpr, moved.consts, k, f, u, v),
                jax.core.eval_jaxpr(closed.jaxpr, closed.consts, k, f, u, v),
                rtol=1e-5, atol=1e-5)  # the folded products sum in another order
    assert_same(juju.jit(squared_kernel_products, tiered=False)(k, f, u, v),
                jax.jit(squared_kernel_products)(k, f, u, v), rtol=1e-5, atol=1e-5)


def one_element_reductions(x, b, i):
    """Reductions over axes of size 1 (a keepdims sum over a broadcast's new
    axis, as the fuzzer drew it) of -0.0, denormals, infinities and NaN."""
    wide = jnp.broadcast_to(x, (2, *x.shape))
    return (jnp.sum(wide[:, :, None], axis=2, keepdims=True), jnp.sum(x, axis=1),
            jnp.max(x, axis=1), jnp.min(x[:, :, None], axis=(1, 2)), jnp.prod(x, axis=1),
            jnp.any(b, axis=0), jnp.all(b, axis=0), jnp.sum(i, axis=0))


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["generated kernel", "MAX ops"])
def test_one_element_reductions_are_reshapes_and_keep_the_element(kernels, monkeypatch):
    from juju_ops_lax.rewrites import everywhere, fold_one_element_reductions

    x = np.array([[-0.0], [1e-45], [-1e-45], [np.inf], [np.nan], [-3.0]], np.float32)
    b, i = np.array([[True, False]]), np.array([[-2, 7]], np.int32)
    closed = everywhere(fold_one_element_reductions)(jax.make_jaxpr(one_element_reductions)(x, b, i))
    assert not [e for e in closed.jaxpr.eqns if e.primitive.name.startswith("reduce_")]
    monkeypatch.setenv("JUJU_PROGRAM_KERNELS", kernels)
    got = juju.jit(one_element_reductions, tiered=False)(x, b, i)
    for g, w in zip(got, jax.jit(one_element_reductions)(x, b, i), strict=True):
        g, w = juju.to_numpy(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # denormals kept, as XLA keeps the element
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))


def boolean_products(x, b, row, column):
    """Products by booleans converted to floats, where XLA selects (the
    mask converted as it is, or both factors reshaped alike by jnp's rank
    promotion) and where it multiplies (a factor broadcast first, or the
    mask broadcast before its conversion)."""
    f32 = jnp.float32
    return (x * b, b * x, x * b.astype(jnp.float16), x * (x > 0), x * b.astype(f32)[None],
            x * b.astype(jnp.int32).astype(f32), row * b.astype(f32)[None],
            column * jnp.broadcast_to(b[:, None], column.shape).astype(f32))


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["generated kernel", "MAX ops"])
def test_boolean_products_select_where_xla_selects(kernels, monkeypatch):
    x = np.array([-3.0, np.nan, np.inf, -np.inf, 2.0, -0.0, 1e-45, 5.0], np.float32)
    b = np.array([False, False, False, True, True, True, False, True])
    args = (x, b, x[None], np.repeat(x[:, None], 3, axis=1))
    monkeypatch.setenv("JUJU_PROGRAM_KERNELS", kernels)
    got = juju.jit(boolean_products, tiered=False)(*args)
    want = jax.jit(boolean_products)(*args)
    for g, w in zip(got, want, strict=True):
        g, w = juju.to_numpy(g), np.asarray(w)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)  # NaN where XLA multiplies, 0 where it selects
        np.testing.assert_array_equal(np.signbit(g[~np.isnan(w)]), np.signbit(w[~np.isnan(w)]))
