"""lax.conv_general_dilated in generated kernels: a direct convolution
(any dimension numbers, strides, padding, lhs and rhs dilation, feature
groups), as small CNN training steps need it, forward and both gradients.
Where the output features are contiguous in the output and the kernel
(NHWC/HWIO), each multiply-add is a SIMD vector of them. Larger
convolutions exceed `loop_rules.MAX_WORK` and stay MAX's.
"""

from __future__ import annotations

import math

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import VECTOR_BYTES, Unsupported, index_expr, literal, mojo_dtype
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.windows import window_coordinate


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

    def accumulate(idx, acc, add) -> None:
        """`add(lhs element, rhs position)` for every input feature and
        kernel position feeding output `idx` (its padding skipped)."""
        n, o = idx[ob], idx[of]
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
                emitter.emit(add(lhs.at(_sum(lhs_at)), rhs_at))

        emitter.nest([per_group_in, *kernel], inner)

    def scalar(idx):
        acc = emitter.fresh("acc")
        emitter.emit(f"var {acc} = {literal(0, out.dtype)}")
        accumulate(idx, acc, lambda x, at: f"{acc} += {x} * {rhs.at(at)}")
        emitter.emit(f"{out.at(index_expr(idx, ost))} = {acc}")

    width = VECTOR_BYTES // out.dtype.itemsize
    features = out.shape[of]
    vectorized = feature_group_count == 1 and ost[of] == 1 and rst[ro] == 1 and features >= width
    work = out.size * per_group_in * math.prod(kernel)
    if not vectorized:
        emitter.nest(out.shape, scalar, parallel=True, work=work)
    else:
        # Output features contiguous in both the output and the kernel (NHWC
        # and HWIO, as flax and haiku lay them out): a SIMD vector of them
        # per multiply-add, the remainder one by one.
        vector_type = f"SIMD[{mojo_dtype(out.dtype)}, {width}]"
        main = features - features % width

        def vectors(idx):
            chunk = emitter.fresh("o")
            with emitter.block(f"for {chunk} in range(0, {main}, {width}):"):
                at = [chunk if d == of else i for d, i in enumerate(idx)]
                acc = emitter.fresh("acc")
                emitter.emit(f"var {acc} = {vector_type}(0)")
                accumulate(at, acc,
                           lambda x, position: f"{acc} += {vector_type}({x}) * "
                                               f"{rhs.load(position, width)}")
                emitter.emit(out.store(index_expr(at, ost), acc))
            if main < features:
                rest = emitter.fresh("o")
                with emitter.block(f"for {rest} in range({main}, {features}):"):
                    scalar([rest if d == of else i for d, i in enumerate(idx)])

        emitter.nest([1 if d == of else size for d, size in enumerate(out.shape)], vectors,
                     parallel=True, work=work)
    # Scalar multiply-adds count twice against vectorized element operations.
    emitter.work += (1 if vectorized else 2) * out.size * per_group_in * math.prod(kernel)


def _term(index: str, stride: int) -> str:
    if index == "0" or stride == 0:
        return "0"
    return index if stride == 1 else f"{index} * {stride}"


def _sum(terms) -> str:
    kept = [t for t in terms if t != "0"]
    return "(" + " + ".join(kept) + ")" if kept else "0"


EQUATIONS = {P.conv_general_dilated_p: conv_general_dilated}
