"""A kernel for juju-ops-nn's fused softmax, when that pack is installed.

`juju_row_softmax` (kernels/softmax.mojo) computes each exponential once;
MAX's `ops.softmax` on CPU measured 1.2 ms against this kernel's 0.84 ms on
512x4096 float32 (benchmarks/run.py, "softmax 512x4096"); 0.81 ms against
jax.jit's 1.84 ms on 2026-11-26. It outranks the nn
pack's rule for `nn_fused[name=softmax]` by priority (`Priority.KERNEL`), on
CPU only; log_softmax stays on `ops.logsoftmax`, which was as fast.
"""

from __future__ import annotations

from max.graph import TensorType, ops

import juju
from juju.dtypes import is_float
from juju_kernels_mojo import LIBRARY

rules = juju.RuleSet()

try:
    from juju_ops_nn.fused import along_axis
    from juju_ops_nn.patterns import nn_fused_p
except ImportError:  # juju-ops-nn not installed: nothing to accelerate
    nn_fused_p = None


def _cpu_float_softmax(ctx) -> bool:
    aval = ctx.avals_in[0]
    return (ctx.params["name"] == "softmax" and ctx.device.is_cpu()
            and is_float(aval.dtype) and 0 not in aval.shape)


def lower_nn_fused_softmax_kernel(ctx, x, *, name, attrs, call_jaxpr):
    attrs = dict(attrs)
    aval = ctx.avals_in[0]
    if "perm" in attrs:
        x = ops.permute(x, list(attrs["perm"]))

    def row_softmax(v):
        flat = ops.reshape(v, [-1, v.shape[-1]]) if v.rank != 2 else v
        (out,) = ops.custom("juju_row_softmax", ctx.device, [flat],
                            [TensorType(flat.dtype, flat.shape, device=ctx.device)])
        return ops.reshape(out, v.shape) if v.rank != 2 else out

    # No nan_rows wrapper: the kernel makes a row with a NaN, a +inf or only
    # -inf all NaN itself (the wrapper's two reductions and select took half
    # of a 512x4096 softmax's time).
    return [along_axis(row_softmax, x, attrs["axis"], len(aval.shape))]


if nn_fused_p is not None:
    rules.register(nn_fused_p, priority=juju.Priority.KERNEL, guard=_cpu_float_softmax,
                   requires=(LIBRARY,))(lower_nn_fused_softmax_kernel)
