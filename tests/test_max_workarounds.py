"""Programs that hit known MAX 26.7 compiler bugs, lowered so they come out
right. Each case failed (wrong values or a failed compile) before its
workaround; all share one compilation."""

from __future__ import annotations

import os
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
}
JITTED = {name: juju.jit(fn) for name, (fn, _) in CASES.items()}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    juju.compile_all([JITTED[name].lower(*args) for name, (_, args) in CASES.items()])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(name):
    fn, args = CASES[name]
    # Float sums in another order than XLA's: a looser tolerance there.
    tol = dict(rtol=1e-4, atol=1e-4) if name == "reduction_forms" else {}
    assert_same(JITTED[name](*args), jax.jit(fn)(*args), **tol)


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
