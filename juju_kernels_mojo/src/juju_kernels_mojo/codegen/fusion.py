"""Loop fusion: a run of consecutive elementwise equations of one shape is
one loop, as XLA fuses them. Each element's chain is computed in registers
(SIMD vectors where every equation has a vector form, else scalars); only
the values used after the run are stored. Unfused, an optimizer step of 20
elementwise equations over a 1M-element parameter read and wrote 20
buffers; fused, it reads its inputs and writes its results once.
"""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
from jax.extend import core as jex_core

from juju import primitives as P
from juju._compat import Literal, source_line
from juju_kernels_mojo.codegen import elementwise
from juju_kernels_mojo.codegen.mojo import (ELEMENTWISE, LIBM_EXP_F64, VECTOR_BYTES,
                                            VECTOR_ELEMENTWISE, Array, Const, Unsupported,
                                            add_offsets, binary_expression, index_expr,
                                            mojo_dtype, unary_expression)
from juju_kernels_mojo.codegen.mojo import strides as row_major

#: Equations fused in SIMD vectors besides VECTOR_ELEMENTWISE: max/min with
#: XLA's NaN and signed-zero rules (FUSION_PRELUDE), integer powers, and
#: float rem and pow: libm's fmod and pow lane by lane (as XLA calls them),
#: so that the rest of their run stays in vectors (a periodic box's
#: displacement split jax-md's pair loop into scalar and vector runs).
VECTOR_EXTRA = {P.max_p, P.min_p, P.integer_pow_p, P.rem_p, P.pow_p}
#: Their vector forms: FUSION_PRELUDE's helpers.
LANE_BY_LANE = {P.rem_p: "True", P.pow_p: "False"}  # lanes_libm's `rem`
#: Comparisons of floats: bool lanes, as many as the operands' (Mojo's
#: SIMD methods, ordered: NaN compares unequal to all, and `ne` is `eq`'s
#: negation since SIMD.ne is false on NaN, where the scalar != is true).
VECTOR_COMPARISONS = {P.eq_p: "{a}.eq({b})", P.ne_p: "~{a}.eq({b})", P.lt_p: "{a}.lt({b})",
                      P.le_p: "{a}.le({b})", P.gt_p: "{a}.gt({b})", P.ge_p: "{a}.ge({b})"}

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


@always_inline
def float_to_int_v[src: DType, dst: DType, w: Int](x: SIMD[src, w]) -> SIMD[dst, w]:
    # XLA's conversion: NaN -> 0, out-of-range values saturate (what is
    # cast is in range: an out-of-range cast is undefined in LLVM).
    var lo = SIMD[src, w](min_finite[dst]().cast[src]())
    var hi = SIMD[src, w](max_finite[dst]().cast[src]())
    var high = x.ge(hi)
    var low = x.le(lo)
    var safe = (high | low | isnan(x)).select(SIMD[src, w](0), x)
    var r = safe.cast[dst]()
    r = low.select(SIMD[dst, w](min_finite[dst]()), r)
    return high.select(SIMD[dst, w](max_finite[dst]()), r)


@always_inline
def shift_v[dt: DType, w: Int, left: Bool](a: SIMD[dt, w], b: SIMD[dt, w]) -> SIMD[dt, w]:
    # XLA's shifts of unsigned words: an amount of the bit width or more gives 0.
    comptime top = bit_width_of[dt]() - 1
    var out_of_range = b.gt(SIMD[dt, w](top))
    var amount = out_of_range.select(SIMD[dt, w](0), b)
    comptime if left:
        return out_of_range.select(SIMD[dt, w](0), a << amount)
    else:
        return out_of_range.select(SIMD[dt, w](0), a >> amount)


@always_inline
def lanes_libm[dt: DType, w: Int, rem: Bool](a: SIMD[dt, w], b: SIMD[dt, w]) -> SIMD[dt, w]:
    # libm's fmod (rem) or pow, lane by lane
    var r = SIMD[dt, w](0)
    for i in range(w):
        comptime if rem:
            r[i] = float_rem(a[i], b[i])
        else:
            r[i] = float_pow(a[i], b[i])
    return r
'''


#: Integer lanes (int32 beside float32: a uniform draw's bits, a board
#: game's indices): what has a SIMD form there, the scalar one's
#: (wrapping arithmetic, comparisons, selects) or a helper above (shifts of
#: unsigned words). Integer division and remainder stay scalar.
VECTOR_INTEGER = {P.add_p, P.sub_p, P.mul_p, P.neg_p, P.abs_p, P.square_p, P.add_jaxvals_p,
                  P.max_p, P.min_p, P.integer_pow_p, P.select_n_p, *VECTOR_COMPARISONS,
                  P.shift_left_p, P.shift_right_logical_p}
#: Conversions with a SIMD form: between dtypes of one width (lanes of the
#: same count), and from or to bool (a mask of the run's lanes).
VECTOR_CASTS = {P.convert_element_type_p, P.bitcast_convert_type_p}

#: Lanes that take the width of the run they join (bool masks, bitwise
#: logic): they join any run of their shape.
ANY_LANES = "*"
#: Bitwise logic, a SIMD form for bools and integers.
VECTOR_LOGIC = {P.and_p: "&", P.or_p: "|", P.xor_p: "^"}


def fusible(eqn, read) -> tuple | None:
    """What a fused run of this equation is keyed by: its shape and the
    dtype its SIMD form computes in (None: it has none, it joins a scalar
    run; ANY_LANES: it joins any); None where it cannot join a run.
    Elementwise equations and `broadcast_in_dim` join: each operand is of
    the run's shape, of one element, or broadcast to it along axes of
    size 1 (read in place, as XLA's loop fusion reads a broadcast)."""
    prim = eqn.primitive
    if len(eqn.outvars) != 1 or (prim not in ELEMENTWISE and prim is not P.broadcast_in_dim_p):
        return None
    if prim is P.broadcast_in_dim_p and len(eqn.invars) != 1:
        return None  # a dynamic shape
    try:  # complex values (parts) and keys are written apart
        for v in (*eqn.invars, *eqn.outvars):
            mojo_dtype(v.aval.dtype)
    except Unsupported:
        return None
    shape = tuple(eqn.outvars[0].aval.shape)
    for atom in eqn.invars:
        x = read(atom)
        if not isinstance(x, (Array, Const)):
            return None
        expanded = operand_shape(eqn, x, shape)
        if expanded is None or any(b not in (1, s) for b, s in zip(expanded, shape)):
            return None
    return shape, _lanes_key(_vector_dtype(eqn))


def operand_shape(eqn, x, shape) -> tuple | None:
    """`x`'s shape as the equation reads it against its output's `shape`
    (equal rank; None where it is neither that nor one element)."""
    if x.size == 1:
        return (1,) * len(shape)
    if eqn.primitive is P.broadcast_in_dim_p:
        expanded = [1] * len(shape)
        for i, d in enumerate(eqn.params["broadcast_dimensions"]):
            expanded[d] = x.shape[i]
        return tuple(expanded)
    return tuple(x.shape) if len(x.shape) == len(shape) else None


def _vector_dtype(eqn):
    """The dtype an equation with a SIMD form computes in (its lanes: a
    comparison's operands', a select's cases', a conversion's wider side),
    ANY_LANES, or None."""
    prim, ins = eqn.primitive, eqn.invars
    dtypes = {np.dtype(v.aval.dtype) for v in (*ins, *eqn.outvars)}
    if prim is P.broadcast_in_dim_p or (prim in VECTOR_LOGIC or prim is P.not_p):
        (dt,) = dtypes
        if dt.kind in "biu" or prim is not P.broadcast_in_dim_p:
            return ANY_LANES if dt.kind in "biu" else None
        lanes = ins
    elif prim in VECTOR_CASTS:
        return _cast_lanes(eqn)
    elif prim in VECTOR_COMPARISONS or prim is P.is_finite_p:
        lanes = ins
    elif prim is P.select_n_p:
        if len(ins) != 3 or np.dtype(ins[0].aval.dtype) != np.bool_:
            return None  # an integer predicate picking among cases: scalars
        lanes = (*ins[1:], *eqn.outvars)  # a bool predicate, two cases
    elif prim in VECTOR_ELEMENTWISE or prim in VECTOR_EXTRA or prim in VECTOR_INTEGER:
        lanes = (*ins, *eqn.outvars)
    else:
        return None
    dtypes = {np.dtype(v.aval.dtype) for v in lanes}
    if len(dtypes) != 1:
        return None
    (dt,) = dtypes
    if dt.kind in "iu" and dt != np.bool_:
        shifts = (P.shift_left_p, P.shift_right_logical_p)
        return dt if prim in VECTOR_INTEGER and (prim not in shifts or dt.kind == "u") else None
    if dt.kind != "f" or (dt == np.float64 and eqn.primitive in LIBM_EXP_F64):
        return None
    return dt


def _cast_lanes(eqn):
    """A conversion's lanes: its wider side's dtype, where the other has
    the same width or is bool (bitcasts: the same width, no bools)."""
    src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.outvars[0].aval.dtype)
    if eqn.primitive is P.bitcast_convert_type_p:
        ok = src.itemsize == dst.itemsize and np.bool_ not in (src, dst)
        return dst if ok else None
    if src == np.bool_ and dst == np.bool_:
        return ANY_LANES
    if np.bool_ in (src, dst):
        return dst if src == np.bool_ else src
    return dst if src.itemsize == dst.itemsize else None


def _lanes_key(dt):
    """How a run is keyed by its lanes: by their width, so that int32 and
    float32 equations (8 lanes each) share one loop."""
    return dt if dt is None or dt is ANY_LANES else f"{dt.itemsize * 8}-bit"


#: Equations looked past for the next member of a run (`plan`).
HOIST_WINDOW = 8


@dataclasses.dataclass(frozen=True)
class Plan:
    """A fused run from `plan`: its `members` (one loop), the equations
    `hoisted` out of its way (written before it: they read none of its
    results), the reductions it `folds` (reduction_fusion), and the index
    of the first equation after all of them (`stop`)."""

    members: list
    hoisted: list
    folds: list
    stop: int


def plan(eqns, start: int, read) -> Plan | None:
    """The run of fusible equations of one shape from `start`, or None.
    As XLA fuses by data flow, not order, an equation between two members
    that reads none of the run's results (a broadcast of another operand,
    a scalar's arithmetic) is hoisted before the run rather than ending it;
    reductions of the run's results over its shape right after it fold into
    its loop (reduction_fusion.foldable)."""
    from juju_kernels_mojo.codegen import reduction_fusion

    key = fusible(eqns[start], read)
    if key is None or not np.prod(key[0], dtype=np.int64):
        return None
    shape, lanes = key
    members, hoisted, pending = [eqns[start]], [], []
    lookup = _Planned(read, members)
    made = set(eqns[start].outvars)  # the members' results
    stop = start + 1
    while stop < len(eqns) and len(pending) < HOIST_WINDOW:
        eqn = eqns[stop]
        next_key = fusible(eqn, lookup)
        if (next_key is not None and next_key[0] == shape
                and (ANY_LANES in (lanes, next_key[1]) or next_key[1] == lanes)):
            lanes = next_key[1] if lanes == ANY_LANES else lanes
            members.append(eqn)
            made.update(eqn.outvars)
            hoisted += pending
            pending = []
        elif _hoistable(eqn, made):
            pending.append(eqn)
        else:
            break
        lookup.add(eqn)
        stop += 1
    folds = reduction_fusion.foldable(eqns, stop, members, lookup)
    if folds:  # a variance's divisor between its square and its sum
        return Plan(members, hoisted + pending, folds, stop + len(folds))
    return Plan(members, hoisted, [], stop - len(pending))  # hoisted only for a later member


def _hoistable(eqn, made) -> bool:
    """Whether `eqn` may be written before the run: pure, no inner jaxprs,
    reading none of the run's results (`made`), results of plain dtypes."""
    if eqn.effects or any(isinstance(p, (jex_core.Jaxpr, jex_core.ClosedJaxpr))
                          for p in eqn.params.values()):
        return False
    if any(not isinstance(a, Literal) and a in made for a in eqn.invars):
        return False
    try:
        for v in eqn.outvars:
            mojo_dtype(v.aval.dtype)
    except Unsupported:
        return False
    return True


def _run_dtype(run):
    """The dtype of a run's SIMD lanes, or None (scalars)."""
    for eqn in run:
        dt = _vector_dtype(eqn)
        if dt is not ANY_LANES:
            return dt
    return None


class _Planned:
    """`read` that also takes the results of the equations planned so far
    (`add`: not yet written, their shape is known)."""

    def __init__(self, read, eqns=()):
        self.read, self.made = read, {}
        for eqn in eqns:
            self.add(eqn)

    def add(self, eqn) -> None:
        self.made.update((v, Array("fused", tuple(v.aval.shape), np.dtype(v.aval.dtype)))
                         for v in eqn.outvars)

    def __call__(self, atom):
        if not isinstance(atom, Literal) and atom in self.made:
            return self.made[atom]
        return self.read(atom)


def fused(emitter, run, read, live, into=None, folds=()) -> dict:
    """Write `run` (a `Plan`'s members) as one loop; returns the stored
    results (var -> Array): those in `live` (used after the run), stored
    into the buffers `into` gives (var -> Array) where it has one, and the
    results of the reductions it `folds` (reduction_fusion)."""
    for eqn in run:  # checked first: a refusal names its own equation
        with named(eqn):
            for v in (*eqn.invars, *eqn.outvars):
                emitter.check_aval(v.aval)
            if eqn.primitive is not P.broadcast_in_dim_p:
                elementwise.check(eqn.primitive, np.dtype(eqn.invars[0].aval.dtype))
    shape = tuple(run[0].outvars[0].aval.shape)
    n = int(np.prod(shape, dtype=np.int64))
    dt = _run_dtype(run)
    into = into or {}
    results = {v: into[v] if v in into else emitter.value(v.aval.shape, v.aval.dtype)
               for e in run for v in e.outvars if v in live}
    width = VECTOR_BYTES // dt.itemsize if dt is not None else 1
    if folds:
        from juju_kernels_mojo.codegen import reduction_fusion

        results.update(reduction_fusion.fold(emitter, run, read, results, folds, width, dt))
        emitter.work += n
        return results
    dims, patterns = coalesced(run, read, shape)
    if len(dims) < 2:  # every operand whole or one element: one flat loop
        _flat(emitter, run, read, results, n, width, dt)
    else:
        _rows(emitter, run, read, results, dims, patterns, width, dt)
    emitter.work += n  # one pass over the elements, whatever the run's length
    return results


def chain_work(run, n: int) -> int:
    """A run's element operations over `n` elements: what decides whether
    its loop is split over the cores."""
    return n * max(1, len(run))


def _flat(emitter, run, read, results, n: int, width: int, dt) -> None:
    def at(k):
        return lambda eqn, atom, x: ("0", False) if x.size == 1 else (k, True)

    body = n - n % width if dt is not None else 0
    if body:
        emitter.fusion = True
        k = emitter.fresh("k")
        with emitter.split(body, width, work=chain_work(run, n)) as (lo, hi), \
                emitter.block(f"for {k} in range({lo}, {hi}, {width}):"):
            chain(emitter, run, read, results, at(k), k, width, dt)
    if body < n:
        k = emitter.fresh("k")
        with emitter.split(n - body, work=chain_work(run, n - body)) as (lo, hi), \
                emitter.block(f"for {k} in range({body} + {lo}, {body} + {hi}):"
                              if body else f"for {k} in range({lo}, {hi}):"):
            chain(emitter, run, read, results, at(k), k, 1, None)


def coalesced(run, read, shape, boundary: int | None = None) -> tuple[list, dict]:
    """The run's iteration space with adjacent axes merged where every
    operand is whole along both or broadcast along both (axes of size 1
    dropped), and each broadcast operand's pattern over it (True: whole).
    No group spans axis `boundary` and the one before it."""
    made = {v for e in run for v in e.outvars}
    reads = {}
    for eqn in run:
        for atom in eqn.invars:
            if isinstance(atom, Literal) or atom in made:
                continue
            x = read(atom)
            if x.size != 1 and x.size != int(np.prod(shape, dtype=np.int64)):
                reads[(id(eqn), atom)] = operand_shape(eqn, x, shape)
    axes = [d for d, size in enumerate(shape) if size != 1]
    groups: list[list[int]] = []
    for d in axes:
        same = groups and all((e[d] != 1) == (e[groups[-1][-1]] != 1) for e in reads.values())
        if same and not (boundary is not None and groups[-1][-1] < boundary <= d):
            groups[-1].append(d)
        else:
            groups.append([d])
    dims = [int(np.prod([shape[d] for d in g])) for g in groups] or [1]
    patterns = {key: [e[g[0]] != 1 for g in groups] for key, e in reads.items()}
    return dims, patterns


def _rows(emitter, run, read, results, dims, patterns, width: int, dt) -> None:
    """The run over `dims` (coalesced): rows of the last axis, SIMD along
    it, each broadcast operand read at its own row (a splat where the last
    axis is broadcast); the outer axes split over the cores."""
    last = dims[-1]
    body = last - last % width if dt is not None else 0

    def row(idx):
        at = locator(dims, patterns, idx)
        if body:
            emitter.fusion = True
            j = emitter.fresh("j")
            with emitter.block(f"for {j} in range(0, {body}, {width}):"):
                locate, flat = at(j)
                chain(emitter, run, read, results, locate, flat, width, dt)
        if body < last:
            j = emitter.fresh("j")
            with emitter.block(f"for {j} in range({body}, {last}):"):
                locate, flat = at(j)
                chain(emitter, run, read, results, locate, flat, 1, None)

    emitter.nest(dims[:-1], row, parallel=True, work=chain_work(run, int(np.prod(dims))))


def locator(dims, patterns, idx):
    """at(j) -> (locate, flat): where the run over `dims` (coalesced, each
    broadcast operand's pattern) reads its operands at index `idx` of the
    outer axes and `j` of the last (`_chain`'s `locate`), and the flat
    index of the element there."""
    out_st = row_major(dims)
    strides = {key: _pattern_strides(dims, whole) for key, whole in patterns.items()}
    base = index_expr(idx, out_st[:-1])
    bases = {key: index_expr(idx, st[:-1]) for key, st in strides.items()}

    def at(j):
        flat = add_offsets(base, j)

        def locate(eqn, atom, x):
            if x.size == 1:
                return "0", False
            key = None if isinstance(atom, Literal) else (id(eqn), atom)
            if key not in patterns:
                return flat, True
            if patterns[key][-1]:
                return add_offsets(bases[key], j), True
            return bases[key], False

        return locate, flat

    return at


def _pattern_strides(dims, whole) -> list[int]:
    """Row-major strides of an operand that is whole along some of `dims`
    and broadcast (stride 0) along the others."""
    strides, acc = [0] * len(dims), 1
    for d in reversed(range(len(dims))):
        if whole[d]:
            strides[d] = acc
            acc *= dims[d]
    return strides


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


def chain(emitter, run, read, results, locate, k: str, width: int, dt) -> dict:
    """One element (or vector of `width`) of every equation of the run:
    `locate(eqn, atom, x)` is where the equation reads operand `x` (an index,
    and whether it is contiguous there or one value to splat); results are
    stored at `k`. Returns each result's local name (var -> name)."""
    local: dict = {}

    def operand(eqn, atom) -> str:
        if not isinstance(atom, Literal) and atom in local:
            return local[atom]
        x = read(atom)
        at, contiguous = locate(eqn, atom, x)
        if width == 1:
            return x.at(at)
        name = emitter.fresh("v")
        if not contiguous:  # a literal, one element, or a broadcast axis: splat
            emitter.emit(f"var {name} = SIMD[{mojo_dtype(x.dtype)}, {width}]({x.at(at)})")
        else:
            emitter.emit(f"var {name} = {x.load(at, width)}")
        return name

    for eqn in run:
        (out,) = eqn.outvars
        args = [operand(eqn, a) for a in eqn.invars]
        with named(eqn):
            if eqn.primitive is P.broadcast_in_dim_p:
                expr = args[0]
            elif width == 1:
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
    return local


def _vector_expression(emitter, eqn, args, dt, width: int) -> str:
    """The SIMD expression of `eqn` (a member of a run of `width` lanes)."""
    prim = eqn.primitive
    own = _vector_dtype(eqn)
    dt = dt if own is ANY_LANES or own is None else own  # int32 lanes in a float32 run
    if prim in VECTOR_CASTS:
        return _vector_cast(eqn, args[0], width)
    if prim is P.integer_pow_p:
        if eqn.params["y"] == 0:
            return f"SIMD[{mojo_dtype(dt)}, {width}](1)"
        return elementwise.integer_pow(emitter, args[0], dt, eqn.params["y"])
    if prim in VECTOR_COMPARISONS:
        return VECTOR_COMPARISONS[prim].format(a=args[0], b=args[1])
    if prim in VECTOR_LOGIC:
        return f"{args[0]} {VECTOR_LOGIC[prim]} {args[1]}"
    if prim is P.not_p:
        return f"~{args[0]}"
    if prim is P.is_finite_p:
        return f"~(isnan({args[0]}) | isinf({args[0]}))"
    if prim is P.select_n_p:  # select_n(predicate, on_false, on_true)
        return f"{args[0]}.select({args[2]}, {args[1]})"
    if prim in (P.max_p, P.min_p):
        if dt.kind != "f":
            order = "gt" if prim is P.max_p else "lt"
            return f"{args[0]}.{order}({args[1]}).select({args[0]}, {args[1]})"
        name = "max_nan_v" if prim is P.max_p else "min_nan_v"
        return f"{name}[{mojo_dtype(dt)}, {width}]({args[0]}, {args[1]})"
    if prim in (P.shift_left_p, P.shift_right_logical_p):
        left = "True" if prim is P.shift_left_p else "False"
        return f"shift_v[{mojo_dtype(dt)}, {width}, {left}]({args[0]}, {args[1]})"
    if prim in LANE_BY_LANE:
        return f"lanes_libm[{mojo_dtype(dt)}, {width}, {LANE_BY_LANE[prim]}]({args[0]}, {args[1]})"
    fn = unary_expression(prim) or binary_expression(prim)
    return fn(dt, *args).replace("keep_nan(", f"keep_nan_v[{mojo_dtype(dt)}, {width}](")


def _vector_cast(eqn, x: str, width: int) -> str:
    src, dst = np.dtype(eqn.invars[0].aval.dtype), np.dtype(eqn.outvars[0].aval.dtype)
    if eqn.primitive is P.bitcast_convert_type_p:
        return f"bitcast[{mojo_dtype(dst)}, {width}]({x})"
    if dst == np.bool_:
        return x if src == np.bool_ else f"~{x}.eq(0)"  # NaN is not 0: True, as x != 0
    if src.kind == "f" and dst.kind in "iu":
        return f"float_to_int_v[{mojo_dtype(src)}, {mojo_dtype(dst)}, {width}]({x})"
    return f"{x}.cast[{mojo_dtype(dst)}]()"
