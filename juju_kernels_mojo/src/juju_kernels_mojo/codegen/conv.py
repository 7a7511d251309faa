"""lax.conv_general_dilated in generated kernels (any dimension numbers,
strides, padding, lhs and rhs dilation, feature groups), forward and both
gradients, as CNN training steps need it.

A large float convolution is one matrix product on the BLAS, as XLA's CPU
convolutions are Eigen's: its input windows copied into the rows of a
matrix (im2col, O(windows) moves), times the kernel as a matrix. Others
are direct loops: where the output features are contiguous in the output
and the kernel (NHWC/HWIO), each multiply-add is a SIMD vector of them.
"""

from __future__ import annotations

import math

import numpy as np

from juju import primitives as P
from juju_kernels_mojo import blas
from juju_kernels_mojo.codegen.dot import canonical, gemm_call
from juju_kernels_mojo.codegen.mojo import (VECTOR_BYTES, Array, Const, Unsupported, index_expr,
                                            literal, mojo_dtype)
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.windows import window_coordinate

#: Multiply-adds from which a convolution is a matrix product (im2col) on
#: the BLAS, and the largest window matrix (elements) it copies for one.
GEMM_MIN_WORK = 1 << 20
GEMM_MAX_WINDOWS = 1 << 27


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

    if feature_group_count == 1 and _as_gemm(emitter, lhs, rhs, out, specs, window_strides,
                                             padding, lhs_dilation, rhs_dilation):
        return
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


def _as_gemm(emitter, lhs, rhs, out, specs, window_strides, padding, lhs_dilation,
             rhs_dilation) -> bool:
    """out = windows . kernel on the BLAS (else False): `windows` [R, C] holds
    for each output position (n, s...) the inputs its window reads, in the
    kernel's layout (i, k...), zeros for padding; the kernel is the matrix
    [C, O] (or [O, C]) it is where its output feature axis is its first or
    last, else a copy of it in that layout; the product [R, O] is the output
    where its feature axis is its last (first: the product transposed),
    else copied into it."""
    (lb, lf, *ls), (ro, ri, *rs), (ob, of, *os_) = specs
    rank = len(out.shape)
    kernel = [rhs.shape[d] for d in rs]
    o_count, rows_dims = out.shape[of], [d for d in range(rank) if d != of]
    cols_dims = [d for d in range(rank) if d != ro]
    rows, cols = out.size // o_count, rhs.size // o_count
    if not (isinstance(lhs, Array) and isinstance(rhs, Array)
            and out.dtype in (np.float32, np.float64)) or rows * cols > GEMM_MAX_WINDOWS:
        return False
    if out.size * cols < GEMM_MIN_WORK:
        return False
    library = blas.find()
    if library is None:
        return False
    windows = emitter.scratch((rows, cols), out.dtype)
    _im2col(emitter, lhs, rhs, out, windows, specs, rows_dims, cols_dims, kernel, window_strides,
            padding, lhs_dilation, rhs_dilation)
    if ro in (0, rank - 1):
        matrix, kernel_transposed = rhs, ro == 0  # [O, C] as it lies where ro == 0
    else:  # a copy as [C, O]
        matrix, kernel_transposed = canonical(emitter, rhs, [*cols_dims, ro]), False
    if of == 0:  # out [O, R] = kernel^T [O, C] . windows^T [C, R]
        gemm_call(emitter, library, not kernel_transposed, True, 1, o_count, rows, cols,
                  matrix, windows, out)
    else:
        product = out if of == rank - 1 else emitter.scratch((rows, o_count), out.dtype)
        gemm_call(emitter, library, False, kernel_transposed, 1, rows, o_count, cols,
                  windows, matrix, product)
        if product is not out:
            ost = row_major(out.shape)
            shape = [out.shape[d] for d in rows_dims] + [o_count]
            emitter.copy_strided(shape, out, [ost[d] for d in rows_dims] + [ost[of]], product,
                                 row_major(shape))
    emitter.work += out.size + windows.size
    return True


def _im2col(emitter, lhs, rhs, out, windows, specs, rows_dims, cols_dims, kernel,
            window_strides, padding, lhs_dilation, rhs_dilation) -> None:
    """windows[r, c] = the input that output position r (out's axes but its
    feature axis, as they lie) multiplies by kernel entry c (rhs's axes but
    its output feature axis, as they lie), or 0 where that is padding."""
    (lb, lf, *ls), (ro, ri, *rs), (ob, of, *os_) = specs
    lst = row_major(lhs.shape)
    row_shape = [out.shape[d] for d in rows_dims]
    col_shape = [rhs.shape[d] for d in cols_dims]
    cols = math.prod(col_shape)
    zero = literal(0, out.dtype)

    width = VECTOR_BYTES // out.dtype.itemsize
    # NHWC input, HWIO kernel: a window's input features are a contiguous
    # run of both the input and a row of `windows`, copied as vectors.
    runs = cols_dims[-1] == ri and lst[lf] == 1 and col_shape[-1] >= width
    outer_cols = col_shape[:-1] if runs else col_shape

    def row(ridx):
        idx = dict(zip(rows_dims, ridx))
        r = index_expr(ridx, row_major(row_shape))

        def element(cidx):
            kidx = dict(zip(cols_dims, cidx if not runs else [*cidx, "0"]))
            conditions, terms = [], [_term(idx[ob], lst[lb]), _term(kidx[ri], lst[lf])]
            for d in range(len(ls)):
                coordinate, checks = window_coordinate(
                    idx[os_[d]], kidx[rs[d]], window_strides[d], rhs_dilation[d],
                    lhs_dilation[d], padding[d][0], out.shape[os_[d]], kernel[d],
                    lhs.shape[ls[d]])
                conditions += checks
                terms.append(_term(coordinate, lst[ls[d]]))
            within = index_expr([*cidx, "0"] if runs else cidx, row_major(col_shape))
            at = f"({r}) * {cols} + {within}"
            with emitter.block(f"if {' and '.join(conditions) or 'True'}:"):
                if runs:
                    n = col_shape[-1]
                    emitter.copy(lhs.span(_sum(terms), n), windows.span(at, n))
                else:
                    emitter.emit(f"{windows.at(at)} = {lhs.at(_sum(terms))}")
            if conditions:
                with emitter.block("else:"):
                    if runs:
                        emitter.copy(Const(0, (col_shape[-1],), out.dtype),
                                     windows.span(at, col_shape[-1]))
                    else:
                        emitter.emit(f"{windows.at(at)} = {zero}")

        emitter.nest(outer_cols, element)

    emitter.nest(row_shape, row, parallel=True, work=windows.size)


def _term(index: str, stride: int) -> str:
    if index == "0" or stride == 0:
        return "0"
    return index if stride == 1 else f"{index} * {stride}"


def _sum(terms) -> str:
    kept = [t for t in terms if t != "0"]
    return "(" + " + ".join(kept) + ")" if kept else "0"


EQUATIONS = {P.conv_general_dilated_p: conv_general_dilated}
