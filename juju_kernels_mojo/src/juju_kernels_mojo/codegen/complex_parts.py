"""Complex numbers in generated kernels: a complex array is carried as its
real and imaginary parts (`parts.Parts`, float32 for complex64,
float64 for complex128). Structural equations and sums apply per part;
arithmetic (add, sub, mul, div as XLA's Smith division, neg, conj, exp,
integer_pow, abs), real/imag/complex, conversions and dot_general are
written on the parts. An S5 state-space layer's `associative_scan` is
hundreds of such tiny equations.
"""

from __future__ import annotations

import numpy as np

from juju import primitives as P
from juju_kernels_mojo.codegen.mojo import (Const, Unsupported, broadcast_strides, index_expr, literal,
                                        mojo_dtype)
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.parts import PER_PART, Parts, per_part, scratch_parts

#: Linear in each part: applied per part.
_PER_PART = PER_PART | {P.reduce_sum_p}


def is_complex(dtype) -> bool:
    try:
        return np.dtype(dtype).kind == "c"
    except TypeError:  # key dtypes
        return False


def part_dtype(dtype) -> np.dtype:
    return np.dtype(np.float32 if np.dtype(dtype) == np.complex64 else np.float64)


def scratch_complex(emitter, shape, dtype) -> Parts:
    return scratch_parts(emitter, shape, np.dtype(dtype), part_dtype(dtype), 2)


def const_complex(emitter, value) -> Parts:
    """A closed-over complex array, as two kernel inputs."""
    value = np.asarray(value)
    return Parts((emitter.closed_const(np.ascontiguousarray(value.real)),
                  emitter.closed_const(np.ascontiguousarray(value.imag))), value.dtype)


def _as_parts(x):
    """A complex literal as the Parts of its two real literals."""
    if isinstance(x, Const) and is_complex(x.dtype):
        part = part_dtype(x.dtype)
        value = complex(np.asarray(x.value).item())
        return Parts((Const(value.real, x.shape, part), Const(value.imag, x.shape, part)),
                     x.dtype)
    return x


def complex_equation(emitter, prim, ins, outs, params) -> None:
    ins = [_as_parts(x) for x in ins]
    if prim in _PER_PART:
        per_part(emitter, prim, ins, outs, params)
    elif prim is P.dot_general_p:
        _dot_general(emitter, ins, outs, params)
    elif prim in _ELEMENTWISE:
        _elementwise(emitter, prim, ins, outs, params)
    else:
        raise Unsupported(f"{prim.name} on complex numbers")


# --- elementwise ------------------------------------------------------------------

def _elementwise(emitter, prim, ins, outs, params) -> None:
    (out,) = outs
    if not out.size:
        return
    if any(len(x.shape) != len(out.shape) and _count(x) != 1 for x in ins):
        raise Unsupported(f"{prim.name} with operands of another rank")
    out_strides = row_major(out.shape)

    def body(idx):
        at = index_expr(idx, out_strides)
        args = [_element(x, idx, out.shape, at) for x in ins]
        real = part_dtype(out.dtype) if isinstance(out, Parts) else out.dtype
        re, im = _ELEMENTWISE[prim](emitter, args, real, params)
        if isinstance(out, Parts):
            emitter.emit(f"{out.words[0].at(at)} = {re}")
            emitter.emit(f"{out.words[1].at(at)} = {im}")
        else:
            emitter.emit(f"{out.at(at)} = {re}")

    emitter.nest(out.shape, body)


def _count(x) -> int:
    return int(np.prod(x.shape))


def _element(x, idx, shape, at):
    """(real, imaginary) expressions of x's element at out's index (a real
    operand's imaginary part is None)."""
    if _count(x) == 1:
        where = "0"
    elif tuple(x.shape) == tuple(shape):
        where = at
    else:  # lax broadcasts size-1 axes of equal-rank operands
        where = index_expr(idx, broadcast_strides(x.shape))
    if isinstance(x, Parts):
        return x.words[0].at(where), x.words[1].at(where)
    return x.at(where), None


def _im(part, real) -> str:
    return part if part is not None else literal(0, real)


def _var(emitter, expr: str) -> str:
    name = emitter.fresh("z")
    emitter.emit(f"var {name} = {expr}")
    return name


def _add(emitter, args, real, params):
    (a, b), (c, d) = args
    return f"{a} + {c}", f"{_im(b, real)} + {_im(d, real)}"


def _sub(emitter, args, real, params):
    (a, b), (c, d) = args
    return f"{a} - {c}", f"{_im(b, real)} - {_im(d, real)}"


def _mul(emitter, args, real, params):
    (a, b), (c, d) = args
    if b is None:
        return f"{a} * {c}", f"{a} * {_im(d, real)}"
    if d is None:
        return f"{a} * {c}", f"{b} * {c}"
    return f"{a} * {c} - {b} * {d}", f"{a} * {d} + {b} * {c}"


def _div(emitter, args, real, params):
    """XLA's: Smith's algorithm (the larger of |c|, |d| divides)."""
    (a, b), (c, d) = args
    b, d = _im(b, real), _im(d, real)
    names = [_var(emitter, e) for e in (a, b, c, d)]
    a, b, c, d = names
    re, im = emitter.fresh("zr"), emitter.fresh("zi")
    emitter.emit(f"var {re} = {literal(0, real)}")
    emitter.emit(f"var {im} = {literal(0, real)}")
    with emitter.block(f"if abs({c}) >= abs({d}):"):
        ratio, denom = emitter.fresh("q"), emitter.fresh("den")
        emitter.emit(f"var {ratio} = {d} / {c}")
        emitter.emit(f"var {denom} = {c} + {d} * {ratio}")
        emitter.emit(f"{re} = ({a} + {b} * {ratio}) / {denom}")
        emitter.emit(f"{im} = ({b} - {a} * {ratio}) / {denom}")
    with emitter.block("else:"):
        ratio, denom = emitter.fresh("q"), emitter.fresh("den")
        emitter.emit(f"var {ratio} = {c} / {d}")
        emitter.emit(f"var {denom} = {c} * {ratio} + {d}")
        emitter.emit(f"{re} = ({a} * {ratio} + {b}) / {denom}")
        emitter.emit(f"{im} = ({b} * {ratio} - {a}) / {denom}")
    return re, im


def _neg(emitter, args, real, params):
    ((a, b),) = args
    return f"-{a}", f"-{_im(b, real)}"


def _conj(emitter, args, real, params):
    ((a, b),) = args
    return a, f"-{_im(b, real)}"


def _exp(emitter, args, real, params):
    ((a, b),) = args
    e = _var(emitter, f"exp({a})")
    b = _var(emitter, _im(b, real))
    return f"{e} * cos({b})", f"{e} * sin({b})"


def _integer_pow(emitter, args, real, params):
    """x ** y by squaring, as jax's lowering multiplies."""
    ((a, b),) = args
    y = params["y"]
    base = (_var(emitter, a), _var(emitter, _im(b, real)))
    acc = None
    n = abs(y)
    while n > 0:
        if n & 1:
            acc = base if acc is None else tuple(
                _var(emitter, e) for e in _mul(emitter, [acc, base], real, {}))
        n >>= 1
        if n:
            base = tuple(_var(emitter, e) for e in _mul(emitter, [base, base], real, {}))
    if acc is None:
        acc = (literal(1, real), literal(0, real))
    if y < 0:
        return _div(emitter, [(literal(1, real), None), acc], real, {})
    return acc


def _abs(emitter, args, real, params):
    ((a, b),) = args
    fn = "hypot" if real == np.float64 else "hypotf"
    kind = "Float64" if real == np.float64 else "Float32"
    return f'external_call["{fn}", {kind}]({a}, {_im(b, real)})', None


def _real(emitter, args, real, params):
    return args[0][0], None


def _imag(emitter, args, real, params):
    return _im(args[0][1], real), None


def _complex(emitter, args, real, params):
    (a, _), (b, _) = args
    return a, b


def _convert(emitter, args, real, params):
    ((a, b),) = args
    cast = f".cast[{mojo_dtype(real)}]()"
    return f"{a}{cast}", f"{_im(b, real)}{cast}" if b is not None else literal(0, real)


_ELEMENTWISE = {
    P.add_p: _add, P.add_jaxvals_p: _add, P.sub_p: _sub, P.mul_p: _mul, P.div_p: _div,
    P.neg_p: _neg, P.conj_p: _conj, P.exp_p: _exp, P.integer_pow_p: _integer_pow,
    P.abs_p: _abs, P.real_p: _real, P.imag_p: _imag, P.complex_p: _complex,
    P.convert_element_type_p: _convert,
}


# --- dot_general ------------------------------------------------------------------

def _dot_general(emitter, ins, outs, params) -> None:
    """(a + bi)(c + di) summed: four real dot_generals (two where an operand
    is real), combined."""
    lhs, rhs = ins
    (out,) = outs
    if not isinstance(out, Parts):
        raise Unsupported("dot_general of complex operands to a real result")
    real = part_dtype(out.dtype)
    params = {**params, "preferred_element_type": None}
    left = lhs.words if isinstance(lhs, Parts) else (lhs, None)
    right = rhs.words if isinstance(rhs, Parts) else (rhs, None)

    def dot(x, y):
        result = emitter.scratch(out.shape, real)
        emitter.equation(P.dot_general_p, [x, y], [result], params)
        return result

    terms = {(i, j): dot(x, y) for i, x in enumerate(left) if x is not None
             for j, y in enumerate(right) if y is not None}
    re, im = out.words
    with emitter.each(0, _count(out)) as k:
        real_part = terms[0, 0].at(k)
        if (1, 1) in terms:
            real_part += f" - {terms[1, 1].at(k)}"
        imag = [terms[key].at(k) for key in ((0, 1), (1, 0)) if key in terms]
        emitter.emit(f"{re.at(k)} = {real_part}")
        emitter.emit(f"{im.at(k)} = {' + '.join(imag) or literal(0, real)}")
