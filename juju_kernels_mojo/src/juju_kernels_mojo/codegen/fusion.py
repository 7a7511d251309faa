"""Loop fusion: a run of consecutive elementwise equations of one shape is
one loop, as XLA fuses them. Each element's chain is computed in registers
(SIMD vectors where every equation has a vector form, else scalars); only
the values used after the run are stored. Unfused, an optimizer step of 20
elementwise equations over a 1M-element parameter read and wrote 20
buffers; fused, it reads its inputs and writes its results once.
"""

from __future__ import annotations

import contextlib

import numpy as np

from juju import primitives as P
from juju._compat import Literal, source_line
from juju_kernels_mojo.codegen import elementwise
from juju_kernels_mojo.codegen.mojo import (ELEMENTWISE, LIBM_EXP_F64, VECTOR_BYTES,
                                            VECTOR_ELEMENTWISE, Array, Const, Unsupported,
                                            binary_expression, mojo_dtype, unary_expression)

#: Equations fused in SIMD vectors besides VECTOR_ELEMENTWISE: max/min with
#: XLA's NaN and signed-zero rules (FUSION_PRELUDE), integer powers.
VECTOR_EXTRA = {P.max_p, P.min_p, P.integer_pow_p}
#: Comparisons of floats: bool lanes, as many as the operands' (Mojo's
#: SIMD methods; NaN compares as in the scalar form, unequal to all).
VECTOR_COMPARISONS = {P.eq_p: "eq", P.ne_p: "ne", P.lt_p: "lt", P.le_p: "le", P.gt_p: "gt",
                      P.ge_p: "ge"}

#: Vector forms of max_nan/min_nan, written into kernels that fuse them.
FUSION_PRELUDE = '''
@always_inline
def max_nan_v[dt: DType, w: Int](a: SIMD[dt, w], b: SIMD[dt, w]) -> SIMD[dt, w]:
    var both_zero = a.eq(0) & b.eq(0)
    return isnan(a).select(a, both_zero.select(a + b, a.gt(b).select(a, b)))


@always_inline
def min_nan_v[dt: DType, w: Int](a: SIMD[dt, w], b: SIMD[dt, w]) -> SIMD[dt, w]:
    var both_zero = a.eq(0) & b.eq(0)
    return isnan(a).select(a, both_zero.select(-((-a) + (-b)), a.lt(b).select(a, b)))
'''


def fusible(eqn, read) -> tuple | None:
    """What a fused run of this elementwise equation is keyed by: its shape
    and the dtype its SIMD form computes in (None: it has none, it joins a
    scalar run); None where it cannot join a run (operands neither of that
    shape nor of one element, or made of parts)."""
    if eqn.primitive not in ELEMENTWISE or len(eqn.outvars) != 1:
        return None
    try:  # complex values (parts) and keys are written apart
        for v in (*eqn.invars, *eqn.outvars):
            mojo_dtype(v.aval.dtype)
    except Unsupported:
        return None
    shape = tuple(eqn.outvars[0].aval.shape)
    for atom in eqn.invars:
        x = read(atom)
        if not isinstance(x, (Array, Const)) or (x.shape != shape and x.size != 1):
            return None
    dt = _vector_dtype(eqn)  # by name: numpy's dtype('float64') == None is True
    return shape, None if dt is None else dt.name


def _vector_dtype(eqn):
    """The float dtype of an equation with a SIMD form (its lanes: a
    comparison's operands', a select's cases'), else None."""
    prim, ins = eqn.primitive, eqn.invars
    if prim in VECTOR_COMPARISONS or prim is P.is_finite_p:
        lanes = ins
    elif prim is P.select_n_p and len(ins) == 3 and np.dtype(ins[0].aval.dtype) == np.bool_:
        lanes = (*ins[1:], *eqn.outvars)  # a bool predicate, two cases
    elif prim in VECTOR_ELEMENTWISE or prim in VECTOR_EXTRA:
        lanes = (*ins, *eqn.outvars)
    else:
        return None
    dtypes = {np.dtype(v.aval.dtype) for v in lanes}
    if len(dtypes) != 1:
        return None
    (dt,) = dtypes
    if dt.kind != "f" or (dt == np.float64 and eqn.primitive in LIBM_EXP_F64):
        return None
    return dt


def run_end(eqns, start: int, read) -> int:
    """The end of the run of fusible equations of one shape from `start`."""
    key = fusible(eqns[start], read)
    if key is None or not np.prod(key[0], dtype=np.int64):
        return start
    stop = start + 1
    while stop < len(eqns) and fusible(eqns[stop], _known(read, eqns[start:stop])) == key:
        stop += 1
    return stop


def _known(read, run):
    """`read` that also takes the run's own results (their shape is known)."""
    made = {v: Array("fused", tuple(v.aval.shape), np.dtype(v.aval.dtype))
            for e in run for v in e.outvars}

    def lookup(atom):
        if not isinstance(atom, Literal) and atom in made:
            return made[atom]
        return read(atom)

    return lookup


def fused(emitter, run, read, live) -> dict:
    """Write `run` (equations from `run_end`) as one loop; returns the
    stored results (var -> Array), those in `live` (used after the run)."""
    for eqn in run:  # checked first: a refusal names its own equation
        with named(eqn):
            for v in (*eqn.invars, *eqn.outvars):
                emitter.check_aval(v.aval)
            elementwise.check(eqn.primitive, np.dtype(eqn.invars[0].aval.dtype))
    shape = tuple(run[0].outvars[0].aval.shape)
    n = int(np.prod(shape, dtype=np.int64))
    dt = _vector_dtype(run[0])  # the same for the whole run (`run_end`)
    vector = dt is not None
    results = {v: emitter.value(v.aval.shape, v.aval.dtype)
               for e in run for v in e.outvars if v in live}
    width = VECTOR_BYTES // dt.itemsize if vector else 1
    body = n - n % width if vector else 0
    if body:
        emitter.fusion = True
        k = emitter.fresh("k")
        with emitter.split(body, width) as (lo, hi), \
                emitter.block(f"for {k} in range({lo}, {hi}, {width}):"):
            _chain(emitter, run, read, results, k, width, dt)
    if body < n:
        k = emitter.fresh("k")
        with emitter.split(n - body, work=n - body) as (lo, hi), \
                emitter.block(f"for {k} in range({body} + {lo}, {body} + {hi}):"
                              if body else f"for {k} in range({lo}, {hi}):"):
            _chain(emitter, run, read, results, k, 1, None)
    emitter.work += n  # one pass over the elements, whatever the run's length
    return results


@contextlib.contextmanager
def named(eqn):
    """An `Unsupported` raised in the block names the innermost equation
    refused (`eqn` or one it holds) and the innermost user line: an equation
    inside a library's jit (jnp.fft, jnp.sort) has none, its call does."""
    try:
        yield
    except Unsupported as why:
        why.primitive = why.primitive or eqn.primitive.name
        why.source = why.source or source_line(eqn)
        raise


def _chain(emitter, run, read, results, k: str, width: int, dt) -> None:
    """One element (or vector of `width`) of every equation of the run."""
    local: dict = {}

    def operand(atom) -> str:
        if not isinstance(atom, Literal) and atom in local:
            return local[atom]
        x = read(atom)
        if width == 1:
            return x.at("0") if x.size == 1 else x.at(k)
        name = emitter.fresh("v")
        if x.size == 1:  # a literal or a one-element array: splat
            emitter.emit(f"var {name} = SIMD[{mojo_dtype(x.dtype)}, {width}]({x.at('0')})")
        else:
            emitter.emit(f"var {name} = {x.load(k, width)}")
        return name

    for eqn in run:
        (out,) = eqn.outvars
        args = [operand(a) for a in eqn.invars]
        with named(eqn):
            if width == 1:
                expr = elementwise.expression(
                    emitter, eqn.primitive, [np.dtype(a.aval.dtype) for a in eqn.invars],
                    np.dtype(out.aval.dtype), args, eqn.params)
            else:
                expr = _vector_expression(emitter, eqn, args, dt, width)
        name = emitter.fresh("t")
        if width == 1:  # typed: a comparison is a Bool, not a Scalar[DType.bool]
            expr = f"Scalar[{mojo_dtype(np.dtype(out.aval.dtype))}]({expr})"
        emitter.emit(f"var {name} = {expr}")
        local[out] = name
        if out in results:
            target = results[out]
            emitter.emit(target.store(k, name) if width > 1 else f"{target.at(k)} = {name}")


def _vector_expression(emitter, eqn, args, dt, width: int) -> str:
    prim = eqn.primitive
    if prim is P.integer_pow_p:
        if eqn.params["y"] == 0:
            return f"SIMD[{mojo_dtype(dt)}, {width}](1)"
        return elementwise.integer_pow(emitter, args[0], dt, eqn.params["y"])
    if prim in VECTOR_COMPARISONS:
        return f"{args[0]}.{VECTOR_COMPARISONS[prim]}({args[1]})"
    if prim is P.is_finite_p:
        return f"~(isnan({args[0]}) | isinf({args[0]}))"
    if prim is P.select_n_p:  # select_n(predicate, on_false, on_true)
        return f"{args[0]}.select({args[2]}, {args[1]})"
    if prim in (P.max_p, P.min_p):
        name = "max_nan_v" if prim is P.max_p else "min_nan_v"
        return f"{name}[{mojo_dtype(dt)}, {width}]({args[0]}, {args[1]})"
    fn = unary_expression(prim) or binary_expression(prim)
    return fn(dt, *args).replace("keep_nan(", f"keep_nan_v[{mojo_dtype(dt)}, {width}](")
