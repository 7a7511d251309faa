"""Linear algebra by decomposition: cholesky, triangular_solve, qr (geqrf,
householder_product), lu, tridiagonal_solve, custom_linear_solve.

cholesky, triangular_solve, geqrf and householder_product are loops over the
matrix dimension written with `lax.fori_loop`, so they lower through the
control-flow rules onto one MAX while loop (the graph does not grow with n).
Each step is a batched matrix-vector product plus a dynamic update, O(n^3) in
all like LAPACK's unblocked algorithms, with LAPACK's conventions (geqrf's
Householder signs), so results match XLA's LAPACK calls to rounding. lu,
qr, tridiagonal_solve and custom_linear_solve lower JAX's own generic
implementations (`jax_impls`), as XLA does on platforms without LAPACK.
eigh and svd are Jacobi methods in juju_ops_lax/jacobi.py; eig (non-symmetric)
has no rule. On the CPU, juju-kernels-mojo outranks cholesky, lu and
triangular_solve for real matrices with kernels (a loop trip of MAX costs
~15 us, a column each); these rules serve complex matrices and the GPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from juju import ALL_DTYPES, RuleSet, lower_fun
from juju import primitives as P
from juju._compat import jax_impls
from juju.primitives import geqrf_p, lu_pivots_to_permutation_p

# Decompositions traced in JAX on the equation's own avals (complex too).
rules = RuleSet(dtypes=ALL_DTYPES)


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
        a = (a + jnp.conj(jnp.swapaxes(a, -1, -2))) / 2  # Hermitian part
    n = a.shape[-1]
    if n == 0:
        return a
    if n == 1:  # a length-1 loop crashes MAX's compiler (SIGSEGV)
        return jnp.sqrt(a)
    rows = lax.broadcasted_iota(jnp.int32, a.shape[:-1], a.ndim - 2)

    def column(j, low):
        row_j = lax.dynamic_index_in_dim(low, j, axis=a.ndim - 2, keepdims=False)
        col = lax.dynamic_index_in_dim(a, j, axis=a.ndim - 1, keepdims=False)
        col = col - _matvec(low, jnp.conj(row_j))  # A = L L^H
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
    if conjugate_a:  # (complex only: jnp.conj of a real array is the array)
        a = jnp.conj(a)
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


# --- QR: geqrf and householder_product, LAPACK's conventions -------------------


def _geqrf_one(a):
    """LAPACK geqr2 on one (m, n) matrix: R above the diagonal, reflectors
    below it, and their scales tau (H_j = I - tau_j v_j v_j^H, v_j[j] = 1).
    Complex matrices follow zlarfg: beta is real, tau complex."""
    m, n = a.shape
    k = min(m, n)
    rows = lax.broadcasted_iota(jnp.int32, (m,), 0)
    cols = lax.broadcasted_iota(jnp.int32, (n,), 0)

    def step(j, state):
        a, taus = state
        col = lax.dynamic_index_in_dim(a, j, axis=1, keepdims=False)
        alpha = lax.dynamic_index_in_dim(col, j, keepdims=False)
        below = jnp.where(rows > j, col, jnp.zeros_like(col))
        xnorm_sq = jnp.sum(_abs_sq(below))
        norm = jnp.sqrt(_abs_sq(alpha) + xnorm_sq)
        beta = jnp.where(jnp.real(alpha) >= 0, -norm, norm).astype(a.dtype)  # -sign(Re a) |.|
        identity = xnorm_sq == 0  # H = I, column left as is
        if jnp.iscomplexobj(a):
            identity = identity & (jnp.imag(alpha) == 0)
        safe_beta = jnp.where(identity, jnp.ones_like(beta), beta)
        tau = jnp.where(identity, jnp.zeros_like(beta), (beta - alpha) / safe_beta)
        scale = jnp.where(identity, jnp.zeros_like(beta), 1 / jnp.where(identity, 1, alpha - beta))
        v = jnp.where(rows > j, col * scale, jnp.where(rows == j, 1, 0).astype(a.dtype))
        w = jnp.conj(v) @ a  # (n,): v^H a
        updated = a - jnp.conj(tau) * v[:, None] * w[None, :]  # H^H a
        a = jnp.where((cols > j)[None, :], updated, a)
        new_col = jnp.where(rows == j, beta, jnp.where(rows > j, v, col))
        new_col = jnp.where(identity, col, new_col)
        a = lax.dynamic_update_index_in_dim(a, new_col[:, None], j, axis=1)
        taus = lax.dynamic_update_index_in_dim(taus, tau[None], j, axis=0)
        return a, taus

    taus = jnp.zeros((k,), a.dtype)
    if k == 0:
        return a, taus
    if k == 1:  # a length-1 loop crashes MAX's compiler (SIGSEGV)
        return step(0, (a, taus))
    return lax.fori_loop(0, k, step, (a, taus))


def _abs_sq(x):
    """|x|^2 in x's real dtype."""
    return jnp.real(x) ** 2 + jnp.imag(x) ** 2 if jnp.iscomplexobj(x) else x * x


def _householder_product_one(a, taus):
    """LAPACK orgqr/ungqr: the first n columns of H_0 H_1 ... H_{k-1}."""
    m, n = a.shape
    (k,) = taus.shape
    rows = lax.broadcasted_iota(jnp.int32, (m,), 0)
    q = jnp.eye(m, n, dtype=a.dtype)

    def step(i, q):
        j = k - 1 - i
        col = lax.dynamic_index_in_dim(a, j, axis=1, keepdims=False)
        tau = lax.dynamic_index_in_dim(taus, j, keepdims=False)
        v = jnp.where(rows > j, col, jnp.where(rows == j, 1, 0).astype(a.dtype))
        return q - tau * v[:, None] * (jnp.conj(v) @ q)[None, :]

    if k == 0:
        return q
    if k == 1:
        return step(0, q)
    return lax.fori_loop(0, k, step, q)


def _batched(fun, ndim_core):
    def run(*xs):
        f = fun
        for _ in range(xs[0].ndim - ndim_core):
            f = jax.vmap(f)
        return f(*xs)

    return run


rules.register(geqrf_p)(lower_fun(_batched(_geqrf_one, 2), multiple_results=True))
rules.register(P.householder_product_p)(lower_fun(_batched(_householder_product_one, 2)))
rules.register(P.qr_p)(lower_fun(jax_impls.qr, multiple_results=True))

# --- LU, tridiagonal and user-defined solves: JAX's generic implementations ----

rules.register(P.lu_p)(lower_fun(jax_impls.lu, multiple_results=True))
rules.register(lu_pivots_to_permutation_p)(lower_fun(jax_impls.lu_pivots_to_permutation))
rules.register(P.tridiagonal_solve_p)(lower_fun(jax_impls.tridiagonal_solve))
rules.register(P.linear_solve_p)(lower_fun(jax_impls.custom_linear_solve, multiple_results=True))
