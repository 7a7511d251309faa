"""juju-kernels-mojo's BLAS-backed products (`JUJU_BLAS=1`, blas_rules.py)
against jax.jit: transposed, batched and permuted operands, float64, the
products split across threads, NaN and infinities, and the float32 sums over
leading axes it takes over. One graph for all of them."""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import juju
from tests.util import assert_same

blas_rules = pytest.importorskip("juju_kernels_mojo.blas_rules")


@pytest.fixture
def blas(monkeypatch):
    monkeypatch.setenv("JUJU_BLAS", "1")
    blas_rules.cblas.cache_clear()
    if blas_rules.cblas() is None:
        pytest.skip("no OpenBLAS from numpy's or scipy's wheel on this machine")
    yield
    monkeypatch.undo()
    blas_rules.cblas.cache_clear()


def products(a, b, c, d, e, g, big, wide, stack, x64, y64, rows):
    return {
        "plain": a @ b,
        "transposed lhs": a.T @ c,
        "transposed rhs": jnp.einsum("ik,jk->ij", a, b.T),
        "both transposed": jnp.einsum("ki,jk->ij", c, a.T),
        "batched": jnp.einsum("bij,bjk->bik", stack, jnp.swapaxes(stack, 1, 2)),
        "permuted batch": jnp.einsum("ibj,jbk->bik", e, g),
        "rows split": big @ wide.T[:, :40],  # 300x200x40: row blocks in tasks
        "columns split": big[:50] @ wide.T,  # 50x200x150: column blocks
        "matrix-vector": a @ b[:, 0],
        "vector-vector": jnp.dot(a[0], a[1]),
        "float64": x64 @ y64,
        "leading sum": rows.sum(0),
        "two leading axes": e.sum((0, 1)),
    }


def _arguments():
    rng = np.random.default_rng(0)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    a, b = r(8, 5), r(5, 7)
    a[2, 3] = np.nan  # one NaN row in the product
    b[1, 4] = np.inf  # inf * 0 below: NaN, as XLA
    a[5, 1] = 0.0
    rows = r(130, 300)
    rows[3, 7], rows[5, 9], rows[6, 9] = np.nan, np.inf, -np.inf
    rows[:, 11] = -0.0
    return (a, b, r(8, 3), r(9, 7), r(3, 4, 6), r(6, 4, 2), r(300, 200), r(150, 200),
            r(4, 64, 64), rng.standard_normal((40, 30)), rng.standard_normal((30, 20)), rows)


def test_blas_products_match_jax(blas):
    args = _arguments()
    f = juju.jit(lambda *xs: products(*xs), tiered=False)
    text = f.lower(*args).as_text()
    assert text.count('symbol = "juju_gemm"') == 13, "every product and sum goes through BLAS"
    assert "mo.matmul" not in text and "mo.batch_matmul" not in text
    assert "transpose_a = true" in text and "transpose_b = true" in text  # no copies
    assert_same(f(*args), jax.jit(products)(*args), rtol=2e-5, atol=2e-5)


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("JUJU_BLAS", raising=False)
    blas_rules.cblas.cache_clear()
    try:
        text = juju.jit(lambda a, b: a @ b).lower(np.ones((4, 3), np.float32),
                                                  np.ones((3, 2), np.float32)).as_text()
    finally:
        blas_rules.cblas.cache_clear()
    assert "juju_gemm" not in text


def test_the_blas_stays_private(blas):
    """juju's OpenBLAS copy (ILP64, numpy's) shares thousands of internal
    symbol names with scipy's LP64 one that jaxlib's LAPACK calls: opened
    into the global scope it bound them, and jax.jit's QR read 64-bit
    integers as 32-bit ones (`Value (=12884904960) exceeds the maximum
    representable value`). Both of juju's callers open it privately."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 48)).astype(np.float32)
    program = juju.jit(lambda a: jnp.tanh(a @ a.T) + 1.0, tiered=False)  # a generated kernel
    op = juju.jit(lambda a: a @ a.T, tiered=False)  # the juju_gemm op
    assert_same(program(x), jax.jit(lambda a: jnp.tanh(a @ a.T) + 1.0)(x), rtol=2e-5, atol=2e-5)
    assert_same(op(x), jax.jit(lambda a: a @ a.T)(x), rtol=2e-5, atol=2e-5)
    library = blas_rules.cblas()
    assert not hasattr(ctypes.CDLL(None), library.sgemm), "the BLAS is in the global scope"
    square = rng.standard_normal((200, 200)).astype(np.float32)
    q, r = jax.jit(jnp.linalg.qr)(square)
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), square, rtol=1e-3, atol=1e-3)
