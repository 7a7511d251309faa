"""Kernels for lax's dense factorizations on the CPU: cholesky, lu,
triangular_solve, geqrf and householder_product (QR) of float32/float64
matrices (linalg_kernels/linalg.mojo).

juju_ops_lax lowers them as loops of MAX ops, one MAX loop iteration per
column; at n = 64 that loop's per-iteration cost made a Cholesky ~90x
slower than jax.jit's LAPACK call (issue 17). These kernels run the whole
factorization, every matrix of a batch in parallel, with LAPACK's
conventions (potrf's NaNs on failure, getrf's pivots, dlarfg's reflectors). Registered at
`Priority.KERNEL` for CPU graphs; complex matrices and the GPU keep lax's
rules. The kernels live in their own library, `juju_linalg`, so graphs
that do not factorize anything keep their cache keys when it changes.
"""

from __future__ import annotations

import math

import numpy as np
from jax import ShapeDtypeStruct
from max.graph import ops

import juju
from juju import primitives as P
from juju._compat import open_jaxpr
from juju.patterns import Any, Lit, Match, Matcher, Op, X, is_number
from juju.primitives import geqrf_p
from juju_kernels_mojo import LINALG_LIBRARY
from juju_kernels_mojo.lowering import call_kernel

REAL = (np.dtype(np.float32), np.dtype(np.float64))

rules = juju.RuleSet(dtypes=(*REAL, np.dtype(np.int32)))


def cpu_real(ctx) -> bool:
    """A CPU graph and a float32/float64 first operand."""
    return (ctx.device.is_cpu() and bool(ctx.avals_in)
            and np.dtype(ctx.avals_in[0].dtype) in REAL)


def _batched(shape) -> tuple[int, int, int]:
    """[..., r, c] -> [batch, r, c]: the kernels take one leading batch axis."""
    return (math.prod(shape[:-2]), *shape[-2:])


def _register(primitive, guard=cpu_real):
    return rules.register(primitive, priority=juju.Priority.KERNEL, guard=guard,
                          requires=(LINALG_LIBRARY,))


@_register(P.cholesky_p)
def lower_cholesky(ctx, x, *, symmetrize_input=False):
    return _cholesky(ctx, x, symmetrize=symmetrize_input, zero_upper=False)


def _cholesky(ctx, x, *, symmetrize: bool, zero_upper: bool):
    (aval,) = ctx.avals_in
    shape = _batched(aval.shape)
    (out,) = call_kernel(ctx, "juju_cholesky", ops.reshape(x, shape),
                         parameters={"symmetrize": symmetrize, "zero_upper": zero_upper},
                         out_avals=[ShapeDtypeStruct(shape, aval.dtype)])
    return ops.reshape(out, aval.shape)


# --- jnp.linalg.cholesky as one kernel -----------------------------------------
# jnp.linalg.cholesky is `jit[name=cholesky]` of (x + x^T) / 2, the primitive,
# and a mask zeroing the upper triangle (cho_factor(lower=True) and
# jax.scipy.linalg.cholesky(lower=True): `_cholesky`, without the first).
# Lowered as written, that is three MAX kernels; at n = 64 the two around
# the factorization cost ~22 us of ~75 (docs/performance.md). A body of
# exactly that shape becomes one juju_cholesky call; any other body is
# lowered as written.


def _scalar(value):
    return Lit(lambda v: is_number(v) and float(v) == value)


def _iota(dimension: int, n: int):
    """`iota(dimension)` of shape (n, n), + 0 allowed."""
    iota = Op("iota", where=lambda e: (e.params["dimension"] == dimension
                                       and tuple(e.params["shape"]) == (n, n)))
    return Any(Op("add", iota, _scalar(0)), iota)


def _tril_cholesky_pattern(rank: int, n: int):
    """select_n(tril's mask, zeros, cholesky(x or (x + x^T) / 2))."""
    mask = Op("ge", _iota(0, n), _iota(1, n))
    mask = Any(Op("broadcast_in_dim", mask, where=lambda e: (
        tuple(e.params["broadcast_dimensions"]) == (rank - 2, rank - 1))), mask)
    swap = (*range(rank - 2), rank - 1, rank - 2)
    transposed = Op("transpose", X("x"), where=lambda e: tuple(e.params["permutation"]) == swap)
    symmetrized = Op("div", Op("add", X("x"), transposed), _scalar(2), name="symmetrized")
    factor = Op("cholesky", Any(symmetrized, X("x")), name="cholesky")
    return Op("select_n", mask, Op("broadcast_in_dim", _scalar(0)), factor)


def _tril_cholesky(jaxpr) -> bool | None:
    """Whether a `jit` body is tril(cholesky(x)) that symmetrizes x first
    (True) or not (False); None for any other body."""
    jaxpr = open_jaxpr(jaxpr)
    if len(jaxpr.invars) != 1 or len(jaxpr.outvars) != 1 or jaxpr.constvars:
        return None
    (source,), (result,) = jaxpr.invars, jaxpr.outvars
    shape = source.aval.shape
    if len(shape) < 2:
        return None
    m = Matcher(jaxpr).match(_tril_cholesky_pattern(len(shape), shape[-1]), result, Match())
    if m is None or m.binds["x"] is not source or len(m.eqns) != len(jaxpr.eqns):
        return None
    by_param = bool(m.binds["cholesky"].params.get("symmetrize_input", False))
    if "symmetrized" in m.binds:
        return None if by_param else True
    return by_param


def _is_tril_cholesky(ctx) -> bool:
    return (ctx.params.get("name") in ("cholesky", "_cholesky") and cpu_real(ctx)
            and _tril_cholesky(ctx.params["jaxpr"]) is not None)


@_register(P.jit_p, guard=_is_tril_cholesky)
def lower_jit(ctx, x, *, jaxpr, name, inline, keep_unused, donated_invars, in_shardings,
              out_shardings, in_layouts, out_layouts, ctx_mesh, compiler_options_kvs):
    # Shardings, layouts and donation are placement on one device (see core).
    return [_cholesky(ctx, x, symmetrize=_tril_cholesky(jaxpr), zero_upper=True)]


@_register(P.triangular_solve_p)
def lower_triangular_solve(ctx, a, b, *, left_side, lower, transpose_a, conjugate_a,
                           unit_diagonal):
    # conjugate_a changes nothing for the real matrices cpu_real admits.
    a_aval, b_aval = ctx.avals_in
    # X op(A) = B is op(A)^T X^T = B^T: every case becomes a left-side solve
    # with the triangle the kernel reads written out.
    transpose = transpose_a != (not left_side)
    t = ops.reshape(a, _batched(a_aval.shape))
    if transpose:
        t = ops.transpose(t, 1, 2)
    batch, rows, cols = _batched(b_aval.shape)
    rhs = ops.reshape(b, (batch, rows, cols))
    if not left_side:
        rhs, rows, cols = ops.transpose(rhs, 1, 2), cols, rows
    (x,) = call_kernel(ctx, "juju_triangular_solve", t, rhs,
                       parameters={"lower": lower != transpose, "unit_diagonal": unit_diagonal},
                       out_avals=[ShapeDtypeStruct((batch, rows, cols), b_aval.dtype)])
    if not left_side:
        x = ops.transpose(x, 1, 2)
    return ops.reshape(x, b_aval.shape)


@_register(P.lu_p)
def lower_lu(ctx, x):
    (aval,) = ctx.avals_in
    lu_aval, pivots_aval, permutation_aval = ctx.avals_out
    batch, m, n = shape = _batched(aval.shape)
    lu, pivots, permutation = call_kernel(
        ctx, "juju_lu", ops.reshape(x, shape),
        out_avals=[ShapeDtypeStruct(shape, aval.dtype),
                   ShapeDtypeStruct((batch, min(m, n)), np.int32),
                   ShapeDtypeStruct((batch, m), np.int32)],
    )
    return [ops.reshape(lu, lu_aval.shape), ops.reshape(pivots, pivots_aval.shape),
            ops.reshape(permutation, permutation_aval.shape)]


@_register(geqrf_p)
def lower_geqrf(ctx, x):
    (aval,) = ctx.avals_in
    r_aval, taus_aval = ctx.avals_out
    batch, m, n = shape = _batched(aval.shape)
    r, taus = call_kernel(
        ctx, "juju_geqrf", ops.reshape(x, shape),
        out_avals=[ShapeDtypeStruct(shape, aval.dtype),
                   ShapeDtypeStruct((batch, min(m, n)), aval.dtype)],
    )
    return [ops.reshape(r, r_aval.shape), ops.reshape(taus, taus_aval.shape)]


@_register(P.householder_product_p)
def lower_householder_product(ctx, a, taus):
    a_aval, taus_aval = ctx.avals_in
    shape = _batched(a_aval.shape)
    (q,) = call_kernel(
        ctx, "juju_householder_product", ops.reshape(a, shape),
        ops.reshape(taus, (shape[0], taus_aval.shape[-1])),
        out_avals=[ShapeDtypeStruct(shape, a_aval.dtype)],
    )
    return ops.reshape(q, a_aval.shape)
