"""Helpers for rules that call Mojo kernels with `ops.custom`."""

from __future__ import annotations

from typing import Mapping

from max.graph import TensorType, TensorValue, ops


def call_kernel(
    ctx,
    kernel: str,
    *operands: TensorValue,
    parameters: Mapping[str, bool | int | float | str] | None = None,
    out_avals=None,
) -> list[TensorValue]:
    """Call the Mojo kernel registered as `kernel` on `ctx.device`.

    Outputs take the shapes and dtypes of `out_avals` (default: the equation's
    `ctx.avals_out`). Returns the list of output values.
    """
    avals = ctx.avals_out if out_avals is None else out_avals
    out_types = [
        TensorType(ctx.max_dtype(a.dtype), tuple(a.shape), device=ctx.device) for a in avals
    ]
    return ops.custom(kernel, ctx.device, list(operands), out_types, parameters=parameters)


def broadcast_operands(ctx, *operands: TensorValue) -> list[TensorValue]:
    """Operands broadcast to the (first) output shape: lax allows rank-0
    operands beside arrays in some ops, kernels want equal shapes."""
    shape = tuple(ctx.avals_out[0].shape)
    return [
        x if tuple(aval.shape) == shape else ops.broadcast_to(x, shape)
        for x, aval in zip(operands, ctx.avals_in)
    ]
