"""Programs that hit known MAX 26.7 compiler bugs, lowered so they come out
right. Each case failed (wrong values or a failed compile) before its
workaround; all share one compilation."""

from __future__ import annotations

import itertools
import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same


def broadcast_then_reduce(k, c, z):
    # MAX mis-rewrites reduce(broadcast) when the broadcast axis precedes the
    # reduced one (see juju_ops_lax._util.reduce_axis).
    r = lax.broadcast_in_dim(k, (3, 3, 3), (0, 2)) * lax.broadcast_in_dim(c, (1, 1, 3), (2,))
    b2 = jnp.broadcast_to(z, (5, 4))
    b3 = jnp.broadcast_to(z[:, None, :], (2, 3, 4))
    return (r.sum(2), r.max(2), r.min(2), jnp.argmax(r, axis=2), b2.sum(1), b2.min(1),
            jnp.argmin(b3, axis=2), b3.prod(2), jnp.any(b3 > 1.5, axis=2))


def jacobian_of_outer(x):
    return jax.jacrev(lambda v: jnp.outer(v, v).sum(0))(x)


def reduction_forms(x, xi, long_row, z):
    # juju_ops_lax._util.reduce_axis picks a form per reduction: direct on the
    # last axis, a matmul with ones (float32 sums over other axes), two stages
    # (long rows), [pre, K, post] (operands that may be broadcasts).
    b = jnp.broadcast_to(z, (5, 4))
    return (x.sum((1, 2)), x.sum(0), x.sum((0, 2)), x.max((1, 2, 3)), x.min(1), x.mean((0, 3)),
            xi.sum((0, 1)), xi.max(2), jnp.argmax(x, 1), long_row.sum(), long_row.max(),
            jnp.argmax(long_row), jnp.exp(b).sum(1), (b * x[0, 0, :, :4]).sum(1), x.prod(1))


def select_then_reduce(x, g):
    # a relu gradient summed over the batch (a bias gradient), and size-1 axes
    return jnp.where(x > 0, g, 0.0).sum(0), x[:, :1].sum(1), x[:1].max(0), x[:, :1].prod(1)


def matmul_reshaped_with_a_transposed_operand(a, b, x, a3, b3, y):
    # MAX fuses the consumer into the matmul's epilogue through the reshape
    # and reads the transposed operand at wrong positions (garbage; the
    # gradient of an NCHW CNN): juju_ops_lax._util.reshape_result.
    xt = x.transpose(0, 3, 1, 2)
    return ((a @ b).reshape(4, 3, 5, 5) * xt,
            jnp.where(xt > 0, (a @ b).reshape(4, 3, 5, 5), 0.0),
            jnp.einsum("bij,bjk->bik", a3, b3).reshape(4, 6, 4, 5) * y.transpose(0, 3, 2, 1))


def two_norm_with_two_consumers(x):
    # optimistix's two-norm in diffrax's step-size controller: a product
    # reshaped to rank 0, fused with several consumers, did not compile
    # (juju_ops_lax._util.reshape_result).
    r = jnp.sqrt(jnp.dot(x, x, precision=lax.Precision.HIGHEST)) / 1.4142135
    return r < 1.0, 1.0 / r, jnp.vdot(x, x) * x


def reductions_to_scalars_with_two_consumers(x, z, xi):
    # max, min and prod to rank 0 fused with several consumers did not compile
    # either (juju_ops_lax._util.scalar_copy); -0.0 must keep its sign.
    outs = []
    for r in (jnp.max(jnp.abs(x)), -jnp.min(x), jnp.prod(x), jnp.max(xi).astype(jnp.float32),
              jnp.max(z), jnp.min(z), jnp.prod(z)):
        s = jnp.sqrt(r) / 1.4142135
        outs += [s < 1.0, 1.0 / s, r]
    return outs


def _cross_entropy(logits, y):
    return jnp.sum((logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)) * y)


def logsumexp_cross_entropy_grad(logits, y):
    # JAX's transpose of abs in logsumexp's gradient: two selects on a [4, 1]
    # condition (the NaN-aware `x >= 0`, a logical_and) that both read the
    # quotient of a reduction; MAX's compiler segfaulted (juju_ops_lax.mixed).
    return jax.grad(_cross_entropy)(logits, y)


def _mlp_loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = jnp.tanh(h @ w + b)
    w, b = params[-1]
    logits = h @ w + b
    logp = logits - jax.nn.logsumexp(logits, axis=1, keepdims=True)
    return -jnp.mean(jnp.sum(logp * y, axis=1))


def mlp_sgd_step(params, x, y):
    # The same selects on [128, 1] in a 784-512-256-10 MLP's training step.
    grads = jax.grad(_mlp_loss)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def _mlp_args(rng, sizes=(784, 512, 256, 10), batch=128):
    params = tuple((rng.standard_normal((m, n)).astype(np.float32) / np.float32(np.sqrt(m)),
                    0.1 * rng.standard_normal(n).astype(np.float32))
                   for m, n in itertools.pairwise(sizes))
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = np.eye(sizes[-1], dtype=np.float32)[rng.integers(0, sizes[-1], batch)]
    return params, x, y


_rng = np.random.default_rng(5)
CASES = {
    "broadcast_then_reduce": (broadcast_then_reduce, (np.eye(3, dtype=np.float32),
                                                      np.array([1.0, 2.0, 3.0], np.float32),
                                                      np.arange(4, dtype=np.float32)[None])),
    "jacrev_outer": (jacobian_of_outer, (np.array([1.0, 2.0, 3.0], np.float32),)),
    "reduction_forms": (reduction_forms, (
        np.random.default_rng(0).standard_normal((3, 4, 5, 6)).astype(np.float32),
        np.random.default_rng(1).integers(-5, 5, (3, 4, 5, 6)).astype(np.int32),
        np.random.default_rng(2).standard_normal(1 << 17).astype(np.float32),
        np.arange(4, dtype=np.float32)[None])),
    "bool_scalar_input": (lambda b, x: jnp.where(b, x, -x), (np.bool_(True), np.float32(2.0))),
    "select_then_reduce": (select_then_reduce, (
        np.random.default_rng(3).standard_normal((6, 5)).astype(np.float32),
        np.random.default_rng(4).standard_normal((6, 5)).astype(np.float32))),
    "matmul_reshaped_with_a_transposed_operand": (
        matmul_reshaped_with_a_transposed_operand,
        tuple(_rng.standard_normal(s).astype(np.float32)
              for s in ((4, 10), (10, 75), (4, 5, 5, 3), (4, 6, 10), (4, 10, 20), (4, 5, 4, 6)))),
    "two_norm_with_two_consumers": (two_norm_with_two_consumers,
                                    (np.array([3.0, 4.0], np.float32),)),
    "reductions_to_scalars_with_two_consumers": (
        reductions_to_scalars_with_two_consumers,
        (np.array([3.0, -4.0], np.float32), np.array([-0.0, -0.0], np.float32),
         np.array([3, 9], np.int32))),
    "logsumexp_cross_entropy_grad": (logsumexp_cross_entropy_grad, (
        np.random.default_rng(0).standard_normal((4, 8), dtype=np.float32),
        np.ones((4, 8), np.float32))),
    "mlp_sgd_step": (mlp_sgd_step, _mlp_args(np.random.default_rng(6))),
}
JITTED = {name: juju.jit(fn) for name, (fn, _) in CASES.items()}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    juju.compile_all([JITTED[name].lower(*args) for name, (_, args) in CASES.items()])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(name):
    fn, args = CASES[name]
    # Float sums in another order than XLA's: a looser tolerance there.
    tol = dict(rtol=1e-4, atol=1e-4) if name in ("reduction_forms", "mlp_sgd_step") else {}
    assert_same(JITTED[name](*args), jax.jit(fn)(*args), **tol)


def test_logsumexp_grad_keeps_xla_semantics():
    """The same compiled gradient on rows with NaN, +-inf, all -inf and
    signed zeros: NaN positions, infinities and zeros' signs as jax.jit's."""
    logits = np.array([[np.nan, 1.0, 2.0, -0.0, 0.0, 3.0, -1.0, 0.5],
                       [np.inf, 1.0, -np.inf, 0.0, -0.0, 2.0, 1.0, 0.0],
                       [-np.inf] * 8,
                       [-0.0, 0.0, -0.0, 0.0, 1e-30, -1e-30, 88.5, -88.5]], np.float32)
    y = np.array([[1.0, -0.0, 2.0, 0.0, -1.0, 0.5, 0.0, -0.0]] * 4, np.float32)
    fn, jitted = CASES["logsumexp_cross_entropy_grad"][0], JITTED["logsumexp_cross_entropy_grad"]
    actual = juju.to_numpy(jitted(logits, y))
    expected = np.asarray(jax.jit(fn)(logits, y))
    assert_same(actual, expected)
    np.testing.assert_array_equal(np.signbit(actual[expected == 0]),
                                  np.signbit(expected[expected == 0]), "signs of zeros")


def test_selects_and_comparisons_keep_no_unit_dims():
    """juju_ops_lax.mixed: no select or comparison in the lowered gradient has
    a size-1 dimension beside other ones (MAX's compiler crashed on those)."""
    text = JITTED["logsumexp_cross_entropy_grad"].lower(
        *CASES["logsumexp_cross_entropy_grad"][1]).as_text()
    ops_seen = 0
    for line in text.splitlines():
        match = re.search(r"rmo\.(select|equal|not_equal|greater|greater_equal)\(.*"
                          r"-> !mo\.tensor<\[([^\]]*)\]", line)
        if match:
            ops_seen += 1
            dims = [d.strip() for d in match.group(2).split(",") if d.strip()]
            assert not ("1" in dims and set(dims) != {"1"}), line
    assert ops_seen


def test_select_result_reduces_in_a_fast_form():
    """select_n's result is not an (identity) broadcast, so a float32 sum of it
    over the batch is the matmul with ones; a size-1 axis is no reduction."""
    x, g = CASES["select_then_reduce"][1]
    text = juju.jit(lambda x, g: jnp.where(x > 0, g, 0.0).sum(0)).lower(x, g).as_text()
    assert "matmul" in text and "mo.reduce" not in text
    text = juju.jit(lambda x: (x[:, :1].sum(1), x[:1].max(0))).lower(x).as_text()
    assert "mo.reduce" not in text


def test_only_regrouping_reshapes_of_a_product_get_the_barrier():
    """reshape_result's cumsum copy goes only where a matmul's result is
    split or merged, not on plain 2-D products or unit axes."""
    a, b = np.ones((4, 10), np.float32), np.ones((10, 75), np.float32)
    text = juju.jit(lambda a, b: ((a @ b).reshape(4, 3, 25), a @ b, (a @ b)[None])).lower(a, b).as_text()
    assert text.count("mo.cumsum") == 1


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_max_workers_yield_to_the_caller():
    # MAX's CPU workers spin after each execute; juju lowers their priority
    # (engine._lower_worker_priority) so they do not take the caller's core.
    from juju import engine
    from juju._compat import max_worker_thread_ids

    engine.cpu_engine().session  # the workers exist from here on
    workers = max_worker_thread_ids()
    assert workers, "MAX's worker threads were not found: their names changed?"
    expected = int(os.environ.get("JUJU_MAX_WORKER_NICE", engine._WORKER_NICE_DEFAULT))
    if expected > 0:
        assert all(os.getpriority(os.PRIO_PROCESS, t) >= expected for t in workers)
