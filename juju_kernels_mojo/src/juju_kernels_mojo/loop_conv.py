"""lax.conv_general_dilated in generated kernels: a direct convolution
(any dimension numbers, strides, padding, lhs and rhs dilation, feature
groups), as small CNN training steps need it, forward and both gradients.
Larger convolutions exceed `loop_rules.MAX_WORK` and stay MAX's.
"""

from __future__ import annotations

import math

from juju import primitives as P
from juju_kernels_mojo.loop_mojo import Unsupported, index_expr, literal
from juju_kernels_mojo.loop_mojo import strides as row_major
from juju_kernels_mojo.loop_windows import window_coordinate


def conv_general_dilated(emitter, prim, ins, outs, *, window_strides, padding, lhs_dilation,
                         rhs_dilation, dimension_numbers, feature_group_count,
                         batch_group_count, precision=None, preferred_element_type=None,
                         out_sharding=None) -> None:
    """out[n, o, s...] = sum over the group's input features i and the
    kernel's positions k of lhs[n, g(o) * I + i, s * stride + k * rhs_dilation
    - low (in lhs-dilated coordinates)] * rhs[o, i, k]."""
    lhs, rhs = ins
    (out,) = outs
    if batch_group_count != 1:
        raise Unsupported("conv_general_dilated with batch_group_count")
    if not (lhs.dtype == rhs.dtype == out.dtype and out.dtype.kind == "f"):
        raise Unsupported(f"conv_general_dilated of {lhs.dtype}, {rhs.dtype} to {out.dtype}")
    if not out.size:
        return
    rank = len(lhs.shape)
    if dimension_numbers is None:  # lax's default: NC..., OI..., NC...
        specs = (tuple(range(rank)),) * 3
    else:
        specs = dimension_numbers.lhs_spec, dimension_numbers.rhs_spec, dimension_numbers.out_spec
    (lb, lf, *ls), (ro, ri, *rs), (ob, of, *os_) = specs
    lst, rst, ost = row_major(lhs.shape), row_major(rhs.shape), row_major(out.shape)
    per_group_in = rhs.shape[ri]
    per_group_out = out.shape[of] // feature_group_count
    kernel = [rhs.shape[d] for d in rs]

    def body(idx):
        n, o = idx[ob], idx[of]
        acc = emitter.fresh("acc")
        emitter.emit(f"var {acc} = {literal(0, out.dtype)}")
        first = "0"
        if feature_group_count != 1:
            first = emitter.fresh("f")
            emitter.emit(f"var {first} = ({o} // {per_group_out}) * {per_group_in}")

        def inner(kidx):
            i, window = kidx[0], kidx[1:]
            conditions = []
            lhs_at = [_term(n, lst[lb]), _term(f"({first} + {i})" if first != "0" else i, lst[lf])]
            for d in range(len(ls)):
                coordinate, checks = window_coordinate(
                    idx[os_[d]], window[d], window_strides[d], rhs_dilation[d], lhs_dilation[d],
                    padding[d][0], out.shape[os_[d]], kernel[d], lhs.shape[ls[d]])
                conditions += checks
                lhs_at.append(_term(coordinate, lst[ls[d]]))
            rhs_at = index_expr([o, i, *window], [rst[ro], rst[ri], *(rst[d] for d in rs)])
            with emitter.when(conditions):
                emitter.emit(f"{acc} += {lhs.at(_sum(lhs_at))} * {rhs.at(rhs_at)}")

        emitter.nest([per_group_in, *kernel], inner)
        emitter.emit(f"{out.at(index_expr(idx, ost))} = {acc}")

    emitter.nest(out.shape, body)
    # Scalar multiply-adds: counted twice against vectorized element operations.
    emitter.work += 2 * out.size * per_group_in * math.prod(kernel)


def _term(index: str, stride: int) -> str:
    if index == "0" or stride == 0:
        return "0"
    return index if stride == 1 else f"{index} * {stride}"


def _sum(terms) -> str:
    kept = [t for t in terms if t != "0"]
    return "(" + " + ".join(kept) + ")" if kept else "0"


EQUATIONS = {P.conv_general_dilated_p: conv_general_dilated}
