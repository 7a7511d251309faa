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
from juju.primitives import geqrf_p
from juju_kernels_mojo import LINALG_LIBRARY
from juju_kernels_mojo.lowering import call_kernel

REAL = (np.dtype(np.float32), np.dtype(np.float64))

rules = juju.RuleSet(dtypes=(*REAL, np.dtype(np.int32)))


def cpu_real(ctx) -> bool:
    """A CPU graph and a float32/float64 operand."""
    return ctx.device.is_cpu() and np.dtype(ctx.avals_in[0].dtype) in REAL


def _batched(shape) -> tuple[int, int, int]:
    """[..., r, c] -> [batch, r, c]: the kernels take one leading batch axis."""
    return (math.prod(shape[:-2]), *shape[-2:])


def _register(primitive):
    return rules.register(primitive, priority=juju.Priority.KERNEL, guard=cpu_real,
                          requires=(LINALG_LIBRARY,))


@_register(P.cholesky_p)
def lower_cholesky(ctx, x, *, symmetrize_input=False):
    (aval,) = ctx.avals_in
    if symmetrize_input:  # jax versions that symmetrize inside the primitive
        x = ops.div(ops.add(x, ops.transpose(x, -1, -2)), ctx.constant(2, aval.dtype))
    shape = _batched(aval.shape)
    (out,) = call_kernel(ctx, "juju_cholesky", ops.reshape(x, shape),
                         out_avals=[ShapeDtypeStruct(shape, aval.dtype)])
    return ops.reshape(out, aval.shape)


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
