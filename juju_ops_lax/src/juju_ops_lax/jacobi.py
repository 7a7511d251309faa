"""eigh and svd by cyclic Jacobi rotations, in the round-robin ("parallel")
ordering.

MAX has no LAPACK, and a loop iteration costs 7-50 us per op it runs, so the
algorithm must do its work in few, large ops. LAPACK's route (reduce to
tridiagonal/bidiagonal form, then implicit QR) chases a bulge one scalar at a
time: O(n^2) iterations of tiny ops. Jacobi instead rotates n/2 disjoint index
pairs at once: one round is a few elementwise ops over the whole matrix, a
sweep is n - 1 rounds (every pair once), and 5-10 sweeps converge
(quadratically) to full precision. Jacobi is as accurate as QR, or more:
one-sided Jacobi gets small singular values to high relative accuracy
(Demmel and Veselic 1992), which the eigenvalues of A^H A cannot.

- eigh: two-sided Jacobi. The diagonal is kept as its own vector, the
  off-diagonal part as a matrix with a zero diagonal; each round rotates the
  rows and columns of every pair, zeroes the pairs' entries exactly, and then
  permutes the positions so that the next round meets new pairs. After a
  sweep the positions are back in order.
- svd: one-sided (Hestenes) Jacobi on A's columns (on A^H's when A is wide):
  each round orthogonalises n/2 column pairs; at the end the column norms are
  the singular values, the normalised columns U, the accumulated rotations V.
  Missing columns of U (full_matrices, or zero singular values) come from a
  Householder QR of U, which completes it to an orthonormal basis.

Sweeps stop when converged (eigh: off-diagonal norm <= eps ||A||_F; svd: every
column pair's cosine <= eps sqrt(m)), at most MAX_SWEEPS. Eigenvalues come out
ascending, singular values descending, as LAPACK's; the vectors' signs (phases)
are Jacobi's, not LAPACK's: both are valid.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from jax import lax

from juju import RuleSet, lower_fun
from juju._compat import primitives as P

rules = RuleSet()

MAX_SWEEPS = 30  # quadratic convergence: 5-10 sweeps for n in the hundreds


@functools.cache
def _round_robin(n: int) -> np.ndarray:
    """Positions hold indices; round r pairs position k with k + n/2. This is
    the permutation (new[i] = old[perm[i]]) from one round's positions to the
    next in the circle method: every pair meets once in n - 1 rounds, after
    which the positions are back in order."""
    h = n // 2
    circle = list(range(h)) + [h + k for k in reversed(range(h))]  # circle slot -> position
    source = [0, n - 1, *range(1, n - 1)]  # slot 0 stays, the others move round
    perm = np.empty(n, np.int32)
    for slot in range(n):
        perm[circle[slot]] = circle[source[slot]]
    return perm


def _rotation(a_pp, a_qq, a_pq, skip):
    """Jacobi rotation for each Hermitian 2x2 block [[a_pp, a_pq], [a_pq*, a_qq]]
    (a_pp, a_qq real): (c, s, phase, t) with J = [[c, s phase], [-s phase*, c]]
    making J^H block J diagonal: diag(a_pp - t |a_pq|, a_qq + t |a_pq|).
    Golub and Van Loan's sym.schur2, with a phase for complex blocks."""
    if jnp.iscomplexobj(a_pq):
        size = jnp.abs(a_pq)
        phase = jnp.where(size == 0, jnp.ones_like(a_pq), a_pq / jnp.where(size == 0, 1, size))
    else:
        size, phase = a_pq, None
    skip = skip | (size == 0)
    tau = (a_qq - a_pp) / (2 * jnp.where(skip, 1, size))
    u = jnp.abs(tau)
    root = jnp.where(u > 1, u * jnp.sqrt(1 + (1 / jnp.where(u > 1, u, 1)) ** 2),
                     jnp.sqrt(1 + u * u))  # sqrt(1 + tau^2) without overflow
    t = jnp.where(tau >= 0, 1, -1).astype(u.dtype) / (u + root)
    t = jnp.where(skip, 0, t)
    c = 1 / jnp.sqrt(1 + t * t)
    return c, t * c, phase, t * size


def _rotate(x, c, s, phase, axis):
    """x's slices along `axis` in pairs (k, k + n/2): J^H applied from the left
    (axis -2, rows) or J from the right (axis -1, columns)."""
    h = x.shape[axis] // 2
    first, second = jnp.split(x, [h], axis=axis)
    expand = (lambda v: v[..., :, None]) if axis == x.ndim - 2 else (lambda v: v[..., None, :])
    c, s = expand(c), expand(s)
    if phase is None:
        sp = sq = s
    else:  # rows: J^H = [[c, -s p], [s p*, c]]; columns: J = [[c, s p], [-s p*, c]]
        p = expand(phase)
        sp, sq = (s * p, s * jnp.conj(p)) if axis == x.ndim - 2 else (s * jnp.conj(p), s * p)
    return jnp.concatenate([c * first - sp * second, sq * first + c * second], axis=axis)


def _permute(x, perm, axis):
    return jnp.take(x, jnp.asarray(perm), axis=axis)


def _repeat(count, body, state):
    if count == 1:  # a length-1 loop crashes MAX's compiler (SIGSEGV)
        return body(0, state)
    return lax.fori_loop(0, count, body, state)


def _sweeps(converged, sweep, state):
    """Run `sweep` until `converged(state)`, at most MAX_SWEEPS times."""
    def cond(carry):
        i, state = carry
        return (i < MAX_SWEEPS) & ~converged(state)

    def body(carry):
        i, state = carry
        return i + 1, sweep(state)

    return lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def _pad_even(n):
    return n + n % 2


# --- eigh ----------------------------------------------------------------------


def _hermitian_from_triangle(a, lower):
    n = a.shape[-1]
    i = lax.broadcasted_iota(jnp.int32, (n, n), 0)
    j = lax.broadcasted_iota(jnp.int32, (n, n), 1)
    strict = (i > j) if lower else (i < j)
    half = jnp.where(strict, a, jnp.zeros_like(a))
    off = half + jnp.conj(jnp.swapaxes(half, -1, -2))
    diag = jnp.real(jnp.diagonal(a, axis1=-2, axis2=-1))
    return diag, off


def _eigh_jacobi(a, lower):
    """(eigenvalues, eigenvectors) of the Hermitian matrix in a's triangle,
    unsorted; a (..., n, n) with n >= 1."""
    n = a.shape[-1]
    diag, off = _hermitian_from_triangle(a, lower)
    m = _pad_even(n)
    if m != n:  # a zero row and column: its pairs never rotate
        diag = jnp.pad(diag, [(0, 0)] * (diag.ndim - 1) + [(0, 1)])
        off = jnp.pad(off, [(0, 0)] * (off.ndim - 2) + [(0, 1), (0, 1)])
    h = m // 2
    perm = _round_robin(m)
    k = np.arange(m)
    untouched = jnp.asarray((k[:, None] == k[None, :]) | (np.abs(k[:, None] - k[None, :]) == h))
    pair_mask = jnp.asarray(np.eye(h, dtype=bool))
    vecs = jnp.broadcast_to(jnp.eye(m, dtype=a.dtype), off.shape)
    norm = jnp.sqrt(jnp.sum(diag * diag, -1) + jnp.sum(_abs2(off), (-2, -1)))
    tol = jnp.finfo(diag.dtype).eps * norm

    def round_(_, state):
        diag, off, vecs = state
        a_pq = jnp.sum(jnp.where(pair_mask, off[..., :h, h:], 0), -1)
        a_pp, a_qq = diag[..., :h], diag[..., h:]
        c, s, phase, shift = _rotation(a_pp, a_qq, a_pq, jnp.zeros(a_pq.shape, bool))
        diag = jnp.concatenate([a_pp - shift, a_qq + shift], -1)
        off = _rotate(_rotate(off, c, s, phase, off.ndim - 2), c, s, phase, off.ndim - 1)
        off = jnp.where(untouched, jnp.zeros_like(off), off)  # the pairs are diagonal now
        vecs = _rotate(vecs, c, s, phase, vecs.ndim - 1)
        off = _permute(_permute(off, perm, -2), perm, -1)
        return _permute(diag, perm, -1), off, _permute(vecs, perm, -1)

    def converged(state):
        return jnp.all(jnp.sqrt(jnp.sum(_abs2(state[1]), (-2, -1))) <= tol)

    diag, _, vecs = _sweeps(converged, lambda state: _repeat(m - 1, round_, state),
                            (diag, off, vecs))
    return diag[..., :n], vecs[..., :n, :n]


def _abs2(x):
    return jnp.real(x) ** 2 + jnp.imag(x) ** 2 if jnp.iscomplexobj(x) else x * x


def _eigh(a, *, lower, sort_eigenvalues, subset_by_index, algorithm):
    # `algorithm` picks LAPACK's/TPU's method; the decomposition is the same,
    # and juju has one method. Eigenvalues always come out sorted (what XLA's
    # CPU and GPU eigh do whatever `sort_eigenvalues` says).
    del sort_eigenvalues, algorithm
    n = a.shape[-1]
    if n == 0:
        w, v = jnp.zeros(a.shape[:-1], jnp.real(a).dtype), a
    else:
        w, v = _eigh_jacobi(a, lower)
        order = jnp.argsort(w, axis=-1)
        w = jnp.take_along_axis(w, order, axis=-1)
        v = jnp.take_along_axis(v, order[..., None, :], axis=-1)
    if subset_by_index is not None:
        lo, hi = subset_by_index
        w, v = w[..., lo:hi], v[..., :, lo:hi]
    return v, w


rules.register(P.eigh_p)(lower_fun(_eigh, multiple_results=True))


# --- svd -----------------------------------------------------------------------


def _svd_jacobi(a):
    """One-sided Jacobi on the columns of a (..., m, n), m >= n >= 1:
    (a V with orthogonal columns, V)."""
    m, n = a.shape[-2:]
    k = _pad_even(n)
    if k != n:  # a zero column: its pairs never rotate
        a = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, 1)])
    h = k // 2
    perm = _round_robin(k)
    vecs = jnp.broadcast_to(jnp.eye(k, dtype=a.dtype), a.shape[:-2] + (k, k))
    real = jnp.real(a).dtype
    tol = jnp.finfo(real).eps * np.sqrt(m)

    def round_(_, state):
        a, vecs = state
        left, right = a[..., :h], a[..., h:]
        alpha = jnp.sum(_abs2(left), -2)
        beta = jnp.sum(_abs2(right), -2)
        gamma = jnp.sum(jnp.conj(left) * right, -2)
        small = jnp.abs(gamma) <= tol * jnp.sqrt(alpha) * jnp.sqrt(beta)
        c, s, phase, _ = _rotation(alpha, beta, gamma, small)
        a = _permute(_rotate(a, c, s, phase, a.ndim - 1), perm, -1)
        vecs = _permute(_rotate(vecs, c, s, phase, vecs.ndim - 1), perm, -1)
        return a, vecs

    def converged(state):
        a = state[0]
        gram = jnp.abs(jnp.einsum("...ki,...kj->...ij", jnp.conj(a), a,
                                  precision=lax.Precision.HIGHEST))
        norms = jnp.sqrt(jnp.diagonal(gram, axis1=-2, axis2=-1))
        bound = tol * norms[..., :, None] * norms[..., None, :]
        return jnp.all((gram <= bound) | jnp.asarray(np.eye(k, dtype=bool)))

    a, vecs = _sweeps(converged, lambda state: _repeat(k - 1, round_, state), (a, vecs))
    return a[..., :n], vecs[..., :n, :n]


def _svd_tall(a, compute_uv, full_matrices):
    """svd of a (..., m, n), m >= n >= 1: (s descending, U, V)."""
    m, n = a.shape[-2:]
    av, v = _svd_jacobi(a)
    s = jnp.sqrt(jnp.sum(_abs2(av), -2))
    order = jnp.argsort(-s, axis=-1)  # stable: ties keep Jacobi's order
    s = jnp.take_along_axis(s, order, axis=-1)
    if not compute_uv:
        return s, None, None
    av = jnp.take_along_axis(av, order[..., None, :], axis=-1)
    v = jnp.take_along_axis(v, order[..., None, :], axis=-1)
    nonzero = s > 0
    u = av / jnp.where(nonzero, s, 1)[..., None, :].astype(a.dtype)
    u = jnp.where(nonzero[..., None, :], u, jnp.zeros_like(u))
    # The zero columns (last, after the sort) and, for full matrices, m - n more:
    # the rest of an orthonormal basis, from Householder QR of the ones we have.
    basis, _ = jnp.linalg.qr(u, mode="complete" if full_matrices else "reduced")
    u = jnp.where(nonzero[..., None, :], u, basis[..., :, :n])
    if full_matrices and m > n:
        u = jnp.concatenate([u, basis[..., :, n:]], axis=-1)
    return s, u, v


def _svd(a, *, full_matrices, compute_uv, subset_by_index, algorithm=None):
    # `algorithm` picks LAPACK's/cuSOLVER's method; the decomposition is the
    # same, and juju has one method (one-sided Jacobi).
    del algorithm
    m, n = a.shape[-2:]
    batch = a.shape[:-2]
    real = jnp.real(a).dtype
    if m == 0 or n == 0:  # as jax's _empty_svd
        s = jnp.zeros(batch + (0,), real)
        if not compute_uv:
            return (s,)
        size = max(m, n)
        eye = jnp.broadcast_to(jnp.eye(size, dtype=a.dtype), batch + (size, size))
        u = eye if full_matrices else jnp.zeros(batch + (m, n), a.dtype)
        vt = jnp.zeros(batch + (0, 0), a.dtype)
        return (s, vt, u) if m < n else (s, u, vt)
    wide = m < n
    tall = jnp.conj(jnp.swapaxes(a, -1, -2)) if wide else a
    s, u, v = _svd_tall(tall, compute_uv, full_matrices)
    if wide:  # a = (tall)^H = V S U^H
        u, v = v, u
    if subset_by_index is not None:
        lo, hi = subset_by_index
        s = s[..., lo:hi]
        if compute_uv:
            u, v = u[..., :, lo:hi], v[..., :, lo:hi]
    if not compute_uv:
        return (s,)
    return s, u, jnp.conj(jnp.swapaxes(v, -1, -2))


rules.register(P.svd_p)(lower_fun(_svd, multiple_results=True))
