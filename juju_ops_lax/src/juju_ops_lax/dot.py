"""dot_general: any batch/contracting dimensions, as one batched matmul."""

from __future__ import annotations

import math

import numpy as np
from max.graph import ops

from juju import RuleSet
from juju._compat import primitives as P
from juju.dtypes import max_shape

rules = RuleSet()


def _to_batched_matrix(x, shape, batch, contract, *, contract_last):
    """Permute to (batch, free, contract) [or (batch, contract, free)] and
    reshape to rank 3, or to rank 2 without batch dims: a plain matmul is much
    faster in MAX than a batch of one."""
    free = [d for d in range(len(shape)) if d not in batch and d not in contract]
    order = list(batch) + (free + list(contract) if contract_last else list(contract) + free)
    if order != list(range(len(shape))):
        x = ops.permute(x, order)
    b = math.prod(shape[d] for d in batch)
    f = math.prod(shape[d] for d in free)
    k = math.prod(shape[d] for d in contract)
    matrix = [f, k] if contract_last else [k, f]
    return ops.reshape(x, max_shape([b, *matrix] if batch else matrix)), [shape[d] for d in free]


@rules.register(P.dot_general_p)
def lower_dot_general(ctx, lhs, rhs, *, dimension_numbers, precision,
                      preferred_element_type, out_sharding):
    # `precision` selects XLA's TPU/GPU matmul passes; on MAX fp32 is computed
    # in fp32 regardless, which is at least as precise.
    (lc, rc), (lb, rb) = dimension_numbers
    lhs_aval, rhs_aval = ctx.avals_in
    out_dtype = ctx.aval_out.dtype
    compute = ctx.max_dtype(out_dtype)
    if np.dtype(lhs_aval.dtype) != np.dtype(out_dtype):
        lhs = ops.cast(lhs, compute)
    if np.dtype(rhs_aval.dtype) != np.dtype(out_dtype):
        rhs = ops.cast(rhs, compute)
    a, lhs_free = _to_batched_matrix(lhs, lhs_aval.shape, lb, lc, contract_last=True)
    b, rhs_free = _to_batched_matrix(rhs, rhs_aval.shape, rb, rc, contract_last=False)
    product = ops.matmul(a, b)
    batch_dims = [lhs_aval.shape[d] for d in lb]
    return ops.reshape(product, max_shape(batch_dims + lhs_free + rhs_free))
