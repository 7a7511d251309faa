"""cholesky, lu, triangular_solve and QR against jax.jit (LAPACK).

juju-kernels-mojo's CPU kernels for float32/float64: batches, tails of the
SIMD width, more than one block of right-hand sides, every trsm variant,
rectangular and singular LU, potrf's NaNs on failure, QR of tall, wide and
batched matrices (dlarfg's special columns), and the programs built
on them (solve, slogdet, inv, cho_solve, a GP likelihood's gradient). Also
one of each of juju_ops_lax's loops (what GPU graphs and complex matrices
use), with the mojo pack blocked. All graphs compile in ONE MAX compilation.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
from jax import lax

import juju
from juju.primitives import geqrf_p
from tests.util import assert_same, packs_blocked, param, selected

rng = np.random.default_rng(7)
N = 37  # not a multiple of the kernels' SIMD widths


def spd(*batch, n=N, dtype=np.float32):
    m = rng.standard_normal((*batch, n, n))
    return (m @ np.swapaxes(m, -1, -2) / n + np.eye(n)).astype(dtype)


def triangle(*batch, n=N, dtype=np.float32):
    """Well conditioned either way up: a dominant diagonal, small elsewhere
    (so unit_diagonal solves stay well conditioned too)."""
    m = rng.standard_normal((*batch, n, n)) / n
    return (m + 3 * np.eye(n)).astype(dtype)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def factorizations(a, not_pd, nan_lower, nan_upper, large):
    bad = jnp.stack([a[0], not_pd])  # one batch element fails: NaN there only
    return {
        # one large matrix: several panels, a partial last one
        "large": lax.linalg.cholesky(large, symmetrize_input=False),
        "cholesky": lax.linalg.cholesky(a, symmetrize_input=False),
        # jnp.linalg.cholesky and cho_factor fold their wrappers into the kernel
        "symmetrized": jnp.linalg.cholesky(a),
        "symmetrized_by_hand": jnp.tril(lax.linalg.cholesky(
            (a + jnp.swapaxes(a, -1, -2)) / 2, symmetrize_input=False)),
        "symmetrized_fails": jnp.linalg.cholesky(bad),
        "symmetrized_nan_upper": jnp.linalg.cholesky(nan_upper),
        "cho_factor": jsp.linalg.cho_factor(nan_upper, lower=True)[0],
        "one_fails": lax.linalg.cholesky(bad, symmetrize_input=False),
        "nan_lower": lax.linalg.cholesky(nan_lower, symmetrize_input=False),
        # potrf reads the lower triangle only
        "nan_upper": lax.linalg.cholesky(nan_upper, symmetrize_input=False),
    }


def triangular_solves(t, b):
    out = {}
    for left, lower, transpose, unit in itertools.product((True, False), repeat=4):
        rhs = b if left else jnp.swapaxes(b, -1, -2)
        name = f"left={left} lower={lower} transpose={transpose} unit={unit}"
        out[name] = lax.linalg.triangular_solve(t, rhs, left_side=left, lower=lower,
                                                transpose_a=transpose, unit_diagonal=unit)
    out["vector"] = jsp.linalg.solve_triangular(t[0], b[0, :, 0], lower=True)
    return out


def lu_cases(square, singular, wide, ties, large):
    return {
        "large": lax.linalg.lu(large),  # one matrix: many panels and trailing updates
        "large_wide": lax.linalg.lu(large[:70]),  # blocks that end mid-row / mid-column
        "large_tall": lax.linalg.lu(large[:, :70]),
        "square": lax.linalg.lu(square),
        "singular": lax.linalg.lu(singular),
        "wide": lax.linalg.lu(wide),
        "tall": lax.linalg.lu(jnp.swapaxes(wide, -1, -2)),
        "ties": lax.linalg.lu(ties),  # equal magnitudes: the first row wins
    }


def qr_cases(tall, wide, special, large):
    r, taus = geqrf_p.bind(tall)  # jax has no public geqrf
    return {
        "large": jnp.linalg.qr(large),  # one matrix: blocks of reflectors, split in tasks
        "reduced": jnp.linalg.qr(tall),
        "complete": jnp.linalg.qr(tall, mode="complete"),
        "wide": jnp.linalg.qr(wide),
        "r_only": jnp.linalg.qr(wide, mode="r"),
        "geqrf": (r, taus),
        "householder_product": lax.linalg.householder_product(r, taus),
        # column 0 already triangular (tau = 0), alpha = -0.0 in column 1
        # (beta takes alpha's sign bit), a NaN in column 2
        "special": geqrf_p.bind(special),
        "least_squares": _least_squares(tall[0], wide[0, :5].sum() + jnp.arange(40.0, dtype=tall.dtype)),
    }


def _least_squares(a, y):
    q, r = jnp.linalg.qr(a)
    return jsp.linalg.solve_triangular(r, q.T @ y, lower=False)


def _special(dtype):
    m = normal(7, 5, dtype=dtype)
    m[1:, 0] = 0
    m[1, 1] = -0.0
    m[4, 2] = np.nan
    return m


def programs(a, spd_a, b, y):
    def nll(scale, y):
        k = spd_a * scale
        low = jnp.linalg.cholesky(k)
        alpha = jsp.linalg.cho_solve((low, True), y)
        return 0.5 * y @ alpha + jnp.sum(jnp.log(jnp.diagonal(low)))

    sign, logdet = jnp.linalg.slogdet(a)
    return {
        "solve": jnp.linalg.solve(a, b),
        "slogdet": (sign, logdet),
        "det": jnp.linalg.det(a),
        "inv": jnp.linalg.inv(a),
        "cho_solve": jsp.linalg.cho_solve(jsp.linalg.cho_factor(spd_a), b),
        "gp_nll_and_grad": jax.value_and_grad(nll, argnums=(0, 1))(1.3, y),
    }


def _singular(dtype):
    m = normal(2, N, N, dtype=dtype)
    m[1, :, 3] = 0  # a zero column: getrf skips the scaling
    return m


def _ties(dtype):
    return np.array([[1, 2, 3], [-1, 5, 1], [1, -2, 4]], dtype)


def _nan_at(a, i, j):
    a = a.copy()
    a[..., i, j] = np.nan
    return a


def cases(dtype):
    a = spd(2, dtype=dtype)
    return {
        "factorizations": (factorizations, (a, -spd(dtype=dtype), _nan_at(a, 20, 4),
                                            _nan_at(a, 4, 20), spd(n=200, dtype=dtype))),
        "triangular_solves": (triangular_solves, (triangle(2, dtype=dtype),
                                                  normal(2, N, 90, dtype=dtype))),
        "lu": (lu_cases, (normal(2, 3, N, N, dtype=dtype), _singular(dtype),
                          normal(2, 5, 9, dtype=dtype), _ties(dtype),
                          normal(200, 200, dtype=dtype))),
        "qr": (qr_cases, (normal(2, 40, N, dtype=dtype), normal(5, 9, dtype=dtype),
                          _special(dtype), normal(320, 300, dtype=dtype))),
        "programs": (programs, (normal(N, N, dtype=dtype) + 4 * np.eye(N, dtype=dtype),
                                spd(dtype=dtype), normal(N, 3, dtype=dtype),
                                normal(N, dtype=dtype))),
    }


CASES = {(name, np.dtype(dtype).name): case
         for dtype in (np.float32, np.float64) for name, case in cases(dtype).items()}


def lax_loops(a, t, b, square):
    """One of each loop of juju_ops_lax (its while loops compile slowly)."""
    return {
        "cholesky": jnp.linalg.cholesky(a),
        "left_lower": lax.linalg.triangular_solve(t, b, left_side=True, lower=True),
        "left_upper_transposed": lax.linalg.triangular_solve(
            t, b, left_side=True, lower=False, transpose_a=True, unit_diagonal=True),
        "right_upper": lax.linalg.triangular_solve(
            t, jnp.swapaxes(b, -1, -2), left_side=False, lower=False),
        "lu": lax.linalg.lu(square),
    }


LAX_CASES = {("lax_loops", "float32"): (lax_loops, (spd(2), triangle(2), normal(2, N, 5),
                                                      normal(2, N, N)))}


def _lower(fn, args):
    with jax.enable_x64(args[0].dtype == np.float64):
        return juju.jit(fn).lower(*args)


# float64 runs in CI through the programs (solve, slogdet, inv, cho_solve, the
# GP's gradient: the same kernels); the factorizations' own float64 cases are
# in the full tier.
FULL = {(name, "float64") for name in ("factorizations", "triangular_solves", "lu", "qr")}


def _params():
    return [param("mojo", *key, full=key in FULL) for key in CASES] + [
        ("lax", *key) for key in LAX_CASES]


@pytest.fixture(scope="module")
def compiled(request):
    runs = selected(request, "name", "dtype")
    lowered = {("mojo", *key): _lower(*CASES[key]) for key in CASES if key in runs}
    with packs_blocked("mojo"):
        lowered.update({("lax", *key): _lower(*case) for key, case in LAX_CASES.items()})
    return dict(zip(lowered, juju.compile_all(list(lowered.values()))))


def _tolerance(dtype):
    if dtype == "float64":
        return dict(rtol=1e-10, atol=1e-10)
    # LAPACK sums in another order (blocked); inv's entries reach 25 here.
    return dict(rtol=2e-4, atol=1e-4)


def _large_tolerance(dtype):
    """n = 200: the summation orders' rounding grows with n (and U's entries)."""
    return dict(rtol=1e-9, atol=1e-9) if dtype == "float64" else dict(rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("rules,name,dtype", _params())
def test_matches_jax(compiled, rules, name, dtype):
    fn, args = (CASES if rules == "mojo" else LAX_CASES)[name, dtype]
    with jax.enable_x64(dtype == "float64"):
        got, expected = compiled[rules, name, dtype](*args), jax.jit(fn)(*args)
    if "large" in expected:
        assert_same(got.pop("large"), expected.pop("large"), **_large_tolerance(dtype))
    for key in ("nan_lower", "symmetrized_nan_upper"):  # a NaN below the diagonal
        if key in expected:
            _assert_nans_within(got.pop(key), expected.pop(key), **_tolerance(dtype))
    assert_same(got, expected, **_tolerance(dtype))


def _assert_nans_within(got, expected, **tolerance):
    """A NaN below the diagonal (given, or put there by symmetrization)
    reaches the entries that depend on it, in any Cholesky. XLA's blocked potrf also spreads it
    across the rest of a block (a 37x37 matrix with a NaN at (20, 4): 8 more
    NaNs, rows 35-36 x columns 18-19, whose exact values are finite); juju's
    unblocked kernel does not. So: every NaN of juju's is one of XLA's, and
    the values agree wherever both are finite (docs/testing.md)."""
    got, expected = np.asarray(juju.to_numpy(got)), np.asarray(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert np.isnan(got).any(), "the NaN was lost"
    assert not (np.isnan(got) & ~np.isnan(expected)).any(), "a NaN XLA does not have"
    finite = ~np.isnan(got) & ~np.isnan(expected)
    np.testing.assert_allclose(got[finite], expected[finite], **tolerance)


def test_jnp_cholesky_is_one_kernel():
    """jnp.linalg.cholesky's symmetrization and upper-triangle mask, and
    cho_factor's mask, run inside juju_cholesky: one MAX op."""
    a = spd(2)
    for fn in (jnp.linalg.cholesky, lambda m: jsp.linalg.cho_factor(m, lower=True)[0]):
        text = juju.jit(fn).lower(a).as_text()
        assert text.count("mo.custom") == 1 and "select" not in text, text


def test_jnp_cholesky_has_the_bits_of_its_wrappers_as_written(compiled):
    if ("mojo", "factorizations", "float32") not in compiled:
        pytest.skip("the factorizations case is not selected")
    fn, args = CASES["factorizations", "float32"]
    got = compiled["mojo", "factorizations", "float32"](*args)
    np.testing.assert_array_equal(juju.to_numpy(got["symmetrized"]),
                                  juju.to_numpy(got["symmetrized_by_hand"]))


def test_kernels_lower_the_factorizations():
    """The mojo pack's rules, not lax's loops, take real matrices on the CPU;
    complex matrices go to lax's rules."""
    a = spd(dtype=np.float32)
    chosen = {c.primitive: (c.pack, c.rule) for c in juju.explain(programs, a, a, a[:, :3], a[0])
              if c.primitive in ("cholesky", "lu", "triangular_solve")}
    assert chosen == {"cholesky": ("mojo", "lower_cholesky"), "lu": ("mojo", "lower_lu"),
                      "triangular_solve": ("mojo", "lower_triangular_solve")}
    qr_choice = {c.primitive: (c.pack, c.rule) for c in juju.explain(jnp.linalg.qr, a)
                 if c.primitive in ("geqrf", "householder_product")}
    assert qr_choice == {"geqrf": ("mojo", "lower_geqrf"),
                         "householder_product": ("mojo", "lower_householder_product")}
    complex_choice = {c.pack for c in juju.explain(jnp.linalg.cholesky, a.astype(np.complex64))
                      if c.primitive == "cholesky"}
    assert complex_choice == {"lax"}
