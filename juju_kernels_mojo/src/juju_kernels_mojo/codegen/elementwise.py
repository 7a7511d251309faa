"""Elementwise equations: arithmetic, math functions, comparisons, select,
clamp, casts and rounding, in SIMD vectors where the operands are
contiguous floats, else scalar loops (with lax's size-1 broadcasting)."""

from __future__ import annotations

import numpy as np
from jax import lax

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import (ELEMENTWISE, FLOAT_ONLY, INTEGER_ONLY,
                                            LIBM_EXP_F64, NOT_BOOL, VECTOR_BYTES,
                                            VECTOR_ELEMENTWISE, Unsupported, binary_expression,
                                            broadcast_strides, index_expr, literal, mojo_dtype,
                                            unary_expression)
from juju_kernels_mojo.codegen.mojo import strides as row_major


def check(prim, dt) -> None:
    """Raise `Unsupported` where `prim` has no form for operands of `dt`."""
    floating = dt.kind == "f"
    if (prim in FLOAT_ONLY and not floating) or (prim in NOT_BOOL and dt == np.bool_):
        raise Unsupported(f"{prim.name} of {dt}")
    if prim in INTEGER_ONLY and floating:
        raise Unsupported(f"{prim.name} of {dt}")


def elementwise(emitter, prim, ins, outs, **params):
    (out,) = outs
    dt = ins[0].dtype
    floating = dt.kind == "f"
    check(prim, dt)
    if not out.size:
        return
    if all(x.shape == out.shape or x.size == 1 for x in ins):
        start = vector_elementwise(emitter, prim, ins, out, dt) if floating else 0
        if start == out.size:
            return
        with emitter.each(start, out.size) as k:
            element(emitter, prim, ins, out, [x.at("0") if x.size == 1 else x.at(k) for x in ins],
                         k, dt, params)
        return
    # lax broadcasts size-1 axes of equal-rank operands: stride 0 there.
    out_st = row_major(out.shape)

    def body(idx):
        args = []
        for x in ins:
            args.append(x.at(index_expr(idx, broadcast_strides(x.shape)) if x.shape else "0"))
        element(emitter, prim, ins, out, args, index_expr(idx, out_st), dt, params)

    emitter.nest(out.shape, body, parallel=True)


def vector_elementwise(emitter, prim, ins, out, dt) -> int:
    """out[:n] = prim(ins[:n]) in SIMD vectors, for the largest n that is a
    multiple of the width; returns n (0: not written, e.g. a comparison).
    LLVM left the scalar loops unvectorized (a while_loop trip of three
    16-float ops cost ~50 ns)."""
    width = VECTOR_BYTES // dt.itemsize
    n = out.size - out.size % width
    if prim not in VECTOR_ELEMENTWISE or n == 0 or out.dtype != dt:
        return 0
    if dt == np.float64 and prim in LIBM_EXP_F64:  # libm's exp is scalar
        return 0
    vector = f"SIMD[{mojo_dtype(dt)}, {width}]"
    k = emitter.fresh("k")
    with emitter.split(n, width) as (start, stop), \
            emitter.block(f"for {k} in range({start}, {stop}, {width}):"):
        names = []
        for x in ins:
            name = emitter.fresh("v")
            if x.size == 1:  # a literal or a one-element array: splat
                emitter.emit(f"var {name} = {vector}({x.at('0')})")
            else:
                emitter.emit(f"var {name} = {x.load(k, width)}")
            names.append(name)
        fn = unary_expression(prim) or binary_expression(prim)
        expr = fn(dt, *names).replace("keep_nan(", f"keep_nan_v[{mojo_dtype(dt)}, {width}](")
        emitter.emit(out.store(k, expr))
    return n


def element(emitter, prim, ins, out, args, at, dt, params):
    """out[at] = prim(args), the operands' elements as expressions."""
    expr = expression(emitter, prim, [x.dtype for x in ins], out.dtype, args, params)
    emitter.emit(f"{out.at(at)} = {expr}")


def expression(emitter, prim, dtypes, out_dtype, args, params) -> str:
    """prim(args) of one element, the operands' dtypes `dtypes`, as an
    expression (integer powers may emit statements first)."""
    dt = dtypes[0]
    check(prim, dt)
    if prim is P.integer_pow_p:
        return integer_pow(emitter, args[0], dt, params["y"])
    if prim is P.select_n_p:
        expr = args[-1]
        for i in reversed(range(1, len(args) - 1)):
            test = args[0] if dtypes[0] == np.bool_ else f"{args[0]} == {i - 1}"
            expr = f"({args[i]} if not {test} else {expr})" if dtypes[0] == np.bool_ \
                else f"({args[i]} if {test} else {expr})"
        return expr
    if prim is P.clamp_p:
        return f"min_nan(max_nan({args[1]}, {args[0]}), {args[2]})"
    if prim is P.convert_element_type_p:
        return emitter.convert(args[0], dt, out_dtype)
    if prim is P.round_p:
        even = int(params["rounding_method"]) == int(lax.RoundingMethod.TO_NEAREST_EVEN)
        return f"round_{'even' if even else 'away'}({args[0]})"
    if prim is P.bitcast_convert_type_p:
        if dt.itemsize != out_dtype.itemsize or dt == np.bool_ or out_dtype == np.bool_:
            raise Unsupported(f"bitcast_convert_type from {dt} to {out_dtype}")
        return f"bitcast[{mojo_dtype(out_dtype)}, 1]({args[0]})"
    if prim is P.pow_p:  # an integer exponent is converted, as jax's lowering does
        y = args[1] if dtypes[1] == dt else emitter.convert(args[1], dtypes[1], dt)
        return f"float_pow({args[0]}, {y})"
    fn = unary_expression(prim) or binary_expression(prim)
    return fn(dt, *args)


def integer_pow(emitter, x: str, dtype, y: int) -> str:
    """x ** y by squaring, the multiplications jax's lowering does."""
    base = emitter.fresh("b")
    emitter.emit(f"var {base} = {x}")
    acc = None
    n = abs(y)
    while n > 0:
        if n & 1:
            acc = base if acc is None else f"({acc} * {base})"
        n >>= 1
        if n:
            nxt = emitter.fresh("b")
            emitter.emit(f"var {nxt} = {base} * {base}")
            base = nxt
    acc = acc or literal(1, dtype)
    return f"(1 / {acc})" if y < 0 else acc


EQUATIONS = {p: elementwise for p in ELEMENTWISE}
