"""eigh and svd (juju_ops_lax/jacobi.py) against jax.jit, in the full tier
(`pytest -m full tests/test_linalg_eig.py`): `core` compiles one graph (a
batched eigh, a full-matrices svd, a PCA gradient), the other cases one more.
Each Jacobi loop costs minutes of MAX compile, so CI covers eigh and svd only
through the conformance sample.

Eigenvalues and singular values are compared with jax.jit's (LAPACK's)
normwise: |got - expected| <= 2e-5 * max|expected| (float32; Weyl's bound for
any backward-stable method). Vectors are unique only up to sign (phase), so
they are checked by what defines them: A v = w v (svd: U S V^H = A) to 2e-5
* ||A||, and V^H V = I to 2e-5. Gradients go through JAX's own jvp rules,
which call eigh/svd forward, and are compared with jax.jit's elementwise
(2e-4 relative: they divide by eigenvalue gaps).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju

rng = np.random.default_rng(7)
RTOL = 2e-5


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def sym(*shape):
    a = f32(*shape)
    return (a + np.swapaxes(a, -1, -2)) / 2


def eigh_cases(a, upper, subset=True):
    """jnp.linalg.eigh (lower triangle, symmetrized) on a batch; lax's eigh on
    the upper triangle only (the lower one holds garbage), odd n; a subset
    (XLA's CPU eigh has none: the reference slices the full result)."""
    w, v = jnp.linalg.eigh(a)
    v_up, w_up = lax.linalg.eigh(upper, lower=False, symmetrize_input=False)
    if subset:
        v_sub, w_sub = lax.linalg.eigh(upper, lower=False, symmetrize_input=False,
                                       subset_by_index=(1, 3))
    else:
        v_sub, w_sub = v_up[:, 1:3], w_up[1:3]
    return w, v, w_up, v_up, w_sub, v_sub


def svd_cases(tall, wide, deficient, subset=True):
    u, s, vt = jnp.linalg.svd(tall, full_matrices=True)
    u2, s2, vt2 = jnp.linalg.svd(wide, full_matrices=False)
    s3 = jnp.linalg.svd(deficient, compute_uv=False)
    if subset:
        u4, s4, vt4 = lax.linalg.svd(deficient, full_matrices=False, subset_by_index=(0, 2))
    else:
        u4, s4, vt4 = lax.linalg.svd(deficient, full_matrices=False)
        u4, s4, vt4 = u4[:, :2], s4[:2], vt4[:2]
    return s, u, vt, s2, u2, vt2, s3, s4, u4, vt4


def pca_loss(x):
    """Variance kept by the top 2 principal axes, and the reconstruction error
    of projecting onto them (sign-invariant in the vectors)."""
    xc = x - x.mean(0)
    w, v = jnp.linalg.eigh(xc.T @ xc / x.shape[0])
    top = v[:, -2:]
    return w[-2:].sum() + jnp.sum((xc - xc @ top @ top.T) ** 2)


def nuclear_and_projection(x):
    u, s, _ = jnp.linalg.svd(x, full_matrices=False)
    return s.sum() + jnp.sum((u[:, :2] @ u[:, :2].T) * jnp.arange(x.shape[0]))


def gradients(x, a):
    return (jax.grad(lambda a: jnp.linalg.eigvalsh(a).sum())(a),
            jax.grad(pca_loss)(x), jax.grad(nuclear_and_projection)(x))


def _deficient():
    return (f32(5, 2) @ f32(2, 4)).astype(np.float32)  # rank 2


def core(a, tall, x):
    """CI's one graph: a batched eigh, a full-matrices svd, a PCA gradient."""
    w, v = jnp.linalg.eigh(a)
    u, s, vt = jnp.linalg.svd(tall, full_matrices=True)
    return w, v, s, u, vt, jax.grad(pca_loss)(x)


CASES = {
    # One graph, three Jacobi loops.
    "core": (core, (sym(2, 6, 6), f32(6, 4), f32(12, 4))),
    # The full tier (`-m full`): every parameter, odd sizes, more gradients.
    "eigh": (eigh_cases, (sym(2, 6, 6), np.triu(sym(5, 5)) + np.tril(f32(5, 5), -1))),
    "svd": (svd_cases, (f32(6, 4), f32(2, 3, 5), _deficient())),
    "grad": (gradients, (f32(12, 4), sym(4, 4))),
}
FULL = ("eigh", "svd", "grad")


def _compile(names):
    lowered = {name: juju.jit(CASES[name][0]).lower(*CASES[name][1]) for name in names}
    compiled = dict(zip(lowered, juju.compile_all(list(lowered.values()))))
    return {name: (compiled[name](*CASES[name][1]),
                   jax.jit(_reference(CASES[name][0]))(*CASES[name][1])) for name in names}


@pytest.fixture(scope="module")
def core_results():
    return _compile(["core"])


@pytest.fixture(scope="module")
def results():
    return _compile(FULL)


def _reference(fn):
    return fn if fn in (gradients, core) else functools.partial(fn, subset=False)


def _np(x):
    return np.asarray(juju.to_numpy(x) if not isinstance(x, jax.Array) else x)


def assert_values(got, expected):
    got, expected = _np(got), np.asarray(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    scale = np.abs(expected).max(-1, keepdims=True)
    assert (np.abs(got - expected) <= RTOL * scale + 1e-6).all(), (got, expected)


def assert_orthonormal(q):
    q = _np(q).astype(np.float64)
    gram = np.swapaxes(q, -1, -2) @ q
    np.testing.assert_allclose(gram, np.broadcast_to(np.eye(q.shape[-1]), gram.shape),
                               atol=RTOL)


def assert_eigenpairs(a, w, v):
    a, w, v = (np.asarray(x, np.float64) for x in (a, _np(w), _np(v)))
    residual = np.linalg.norm(a @ v - v * w[..., None, :], axis=-2)
    norm = np.linalg.norm(a, 2, axis=(-2, -1))[..., None]
    assert residual.max() <= RTOL * norm.min()
    assert_orthonormal(v)


def assert_svd(a, s, u, vt, k=None):
    a, s, u, vt = (np.asarray(x, np.float64) for x in (a, _np(s), _np(u), _np(vt)))
    k = s.shape[-1]
    rebuilt = (u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :]
    norm = np.linalg.norm(a, 2, axis=(-2, -1))[..., None, None]
    assert np.abs(a - rebuilt).max() <= RTOL * norm.min()
    assert_orthonormal(u)
    assert_orthonormal(np.swapaxes(vt, -1, -2))


@pytest.mark.full  # each Jacobi loop costs minutes of MAX compile: not in CI
def test_core(core_results):
    got, expected = core_results["core"]
    a, tall, _ = CASES["core"][1]
    w, v, s, u, vt, grad = got
    for g, e in zip(got, expected):
        assert _np(g).shape == e.shape and _np(g).dtype == e.dtype
    assert_values(w, expected[0])
    assert_eigenpairs(a, w, v)
    assert_values(s, expected[2])
    assert_svd(tall, s, u, vt)
    e = expected[5]
    np.testing.assert_allclose(_np(grad), e, rtol=2e-4, atol=2e-4 * np.abs(e).max())


@pytest.mark.full
def test_eigh(results):
    got, expected = results["eigh"]
    a, upper = CASES["eigh"][1]
    w, v, w_up, v_up, w_sub, v_sub = got
    for g, e in zip(got, expected):
        assert _np(g).shape == e.shape and _np(g).dtype == e.dtype
    assert_values(w, expected[0])
    assert_values(w_up, expected[2])
    assert_eigenpairs(a, w, v)
    full = np.triu(upper) + np.triu(upper, 1).T
    assert_eigenpairs(full, w_up, v_up)
    # jax.jit (LAPACK) has no subset_by_index on CPU: the slice of the full one.
    np.testing.assert_array_equal(_np(w_sub), _np(w_up)[1:3])
    v_sub, v_ref = _np(v_sub), _np(v_up)[:, 1:3]
    np.testing.assert_allclose(np.abs(v_sub), np.abs(v_ref), atol=1e-6)


@pytest.mark.full
def test_svd(results):
    got, expected = results["svd"]
    tall, wide, deficient = CASES["svd"][1]
    s, u, vt, s2, u2, vt2, s3, s4, u4, vt4 = got
    for g, e in zip(got, expected):
        assert _np(g).shape == e.shape and _np(g).dtype == e.dtype
    for i in (0, 3, 6, 7):
        assert_values(got[i], expected[i])
    assert_svd(tall, s, u, vt)  # full_matrices: U is 6 x 6
    assert_svd(wide, s2, u2, vt2)
    assert _np(s3)[2:].max() <= RTOL * _np(s3)[0]  # rank 2: the rest is rounding
    assert_orthonormal(u4)
    rebuilt = (_np(u4) * _np(s4)) @ _np(vt4)
    assert np.abs(rebuilt - deficient).max() <= RTOL * _np(s4)[0]


@pytest.mark.full
def test_gradients(results):
    got, expected = results["grad"]
    for g, e in zip(got, expected):
        g = _np(g)
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-4 * np.abs(e).max())


@pytest.mark.full
def test_eigh_of_sum_of_eigenvalues_is_identity(results):
    """d(trace)/dA = I: a check that needs no reference."""
    (grad_trace, *_), _ = results["grad"]
    np.testing.assert_allclose(_np(grad_trace), np.eye(4), atol=1e-5)
