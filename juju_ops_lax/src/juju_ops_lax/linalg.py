"""Linear algebra MAX can express by decomposition: cholesky, triangular_solve.

Both are loops over the matrix dimension written with `lax.fori_loop`, so they
lower through the control-flow rules onto one MAX while loop (the graph does
not grow with n). Each step is a batched matrix-vector product plus a
dynamic update, O(n^3) in all like LAPACK's unblocked algorithms, without
pivoting (neither needs it). lu, qr, svd, eig, eigh and tridiagonal_solve
have no rule: they need pivoting or iterative eigen-solvers that are not
written yet (see docs/coverage.md).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from juju import RuleSet, lower_fun
from juju._compat import primitives as P

rules = RuleSet()


def _mask(n, keep):
    i = lax.broadcasted_iota(jnp.int32, (n, n), 0)
    j = lax.broadcasted_iota(jnp.int32, (n, n), 1)
    return keep(i, j)


def _matvec(m, v):
    """(..., n, n) @ (..., n) -> (..., n), batched over the leading dims."""
    batch = tuple(range(m.ndim - 2))
    return lax.dot_general(m, v, (((m.ndim - 1,), (v.ndim - 1,)), (batch, batch)))


def _cholesky(a, **params):
    if params.get("symmetrize_input", False):
        a = (a + jnp.swapaxes(a, -1, -2)) / 2
    n = a.shape[-1]
    if n == 0:
        return a
    if n == 1:  # a length-1 loop crashes MAX's compiler (SIGSEGV)
        return jnp.sqrt(a)
    rows = lax.broadcasted_iota(jnp.int32, a.shape[:-1], a.ndim - 2)

    def column(j, low):
        row_j = lax.dynamic_index_in_dim(low, j, axis=a.ndim - 2, keepdims=False)
        col = lax.dynamic_index_in_dim(a, j, axis=a.ndim - 1, keepdims=False)
        col = col - _matvec(low, row_j)
        diag = jnp.sqrt(lax.dynamic_index_in_dim(col, j, axis=col.ndim - 1, keepdims=True))
        new = jnp.where(rows > j, col / diag, jnp.where(rows == j, diag, jnp.zeros_like(col)))
        return lax.dynamic_update_index_in_dim(low, new, j, axis=a.ndim - 1)

    low = lax.fori_loop(0, n, column, jnp.zeros_like(a))
    # Like LAPACK's potrf, the primitive leaves the upper triangle untouched.
    return jnp.where(_mask(n, lambda i, j: i >= j), low, a)


rules.register(P.cholesky_p)(lower_fun(_cholesky))


def _forward_substitution(m, b, unit_diagonal):
    """Solve m x = b for lower-triangular m (..., n, n), b (..., n, k)."""
    n = m.shape[-1]
    axis = b.ndim - 2

    def row(i, x):
        m_i = lax.dynamic_index_in_dim(m, i, axis=m.ndim - 2, keepdims=True)  # (..., 1, n)
        b_i = lax.dynamic_index_in_dim(b, i, axis=axis, keepdims=True)        # (..., 1, k)
        batch = tuple(range(m.ndim - 2))
        dot = lax.dot_general(m_i, x, (((m.ndim - 1,), (axis,)), (batch, batch)))
        value = b_i - dot
        if not unit_diagonal:
            d = lax.dynamic_index_in_dim(m_i, i, axis=m.ndim - 1, keepdims=True)
            value = value / d
        return lax.dynamic_update_index_in_dim(x, value, i, axis=axis)

    return lax.fori_loop(0, n, row, jnp.zeros_like(b))


def _triangular_solve(a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    n = a.shape[-1]
    if n == 0 or b.size == 0:
        return b
    # Keep only the referenced triangle (the other holds arbitrary values).
    tri = _mask(n, (lambda i, j: i >= j) if lower else (lambda i, j: i <= j))
    if unit_diagonal:
        tri = tri & ~_mask(n, lambda i, j: i == j)
    a = jnp.where(tri, a, jnp.zeros_like(a))
    if unit_diagonal:
        a = a + jnp.eye(n, dtype=a.dtype)
    m, m_lower = (jnp.swapaxes(a, -1, -2), not lower) if transpose_a else (a, lower)
    if not left_side:  # x m = b  <=>  m^T x^T = b^T
        m, m_lower = jnp.swapaxes(m, -1, -2), not m_lower
        b = jnp.swapaxes(b, -1, -2)
    if not m_lower:  # reverse both axes: upper becomes lower
        m = lax.rev(m, (m.ndim - 2, m.ndim - 1))
        b = lax.rev(b, (b.ndim - 2,))
    x = _forward_substitution(m, b, unit_diagonal)
    if not m_lower:
        x = lax.rev(x, (x.ndim - 2,))
    if not left_side:
        x = jnp.swapaxes(x, -1, -2)
    return x


rules.register(P.triangular_solve_p)(lower_fun(_triangular_solve))
