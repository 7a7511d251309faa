"""Jaxpr rewrites of the lax pack (the `juju_jaxpr_rewrites` hook), each
applied inside loop bodies, branches and calls too (`everywhere`).

`transpose(dot_general(a, b))` of matrices becomes `dot_general(b, a)`. JAX's
transpose rule writes every weight gradient of a dense layer that way; XLA
folds the transpose into the dot's output layout, MAX copies the whole
matrix (a 512x512 transpose per layer in the benchmark's MLP step), while a
transpose feeding a matmul costs it nothing.

`dot_general(transpose(w), x)` (`x @ w.T` in jnp) becomes a dot_general of
`w` itself, its dimension numbers read through the permutation: the dot's
rule then sees the operand as it is in memory. On a GPU engine that is what
keeps `x @ w.T` free of a copy (`juju_ops_lax.dot`'s transposed-B form).

`reduce(broadcast_in_dim(x))` becomes `broadcast_in_dim(reduce(x))`,
`pow(x, c)` of a known c in (2, 1, -1) becomes `x * x`, `x` and `1 / x`,
`select_n(p, x, x)` becomes `x`, a reduction over axes of size 1 a
reshape, `x * convert(b)` of a boolean b `select_n(b, 0, x)`, and
equations of a loop body that read only the loop's constants move before
the loop (`hoist_loop_invariants`).

Some passes run in generated kernels only, on each jaxpr after its calls
are inlined (codegen/emitter.py), not among the pack's passes: dead
equations dropped (`dead_dropped`), repeats merged (`repeats_merged`, XLA's CSE), elementwise work moved below
broadcasts (`below_broadcasts`) and above transposes (`above_transposes`,
then `transposes_folded` into the products). On the whole program the
first two changed what juju-ops-nn's fused patterns (softmax, layer norm)
match, and the MAX graphs of the kernel pack's tests no longer compiled.
"""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np

from juju import inlining
from juju import primitives as P
from juju._compat import (ClosedJaxpr, Jaxpr, Literal, Var, arithmetic_params, broadcast_params,
                          reshape_params)
from juju.callback_lifting import eqn_has_callbacks


def everywhere(rewrite):
    """`rewrite` applied to every jaxpr inside a program (loop and branch
    bodies, calls, custom derivatives' primal jaxprs) and then to the
    program itself: JAX writes an RNN's weight gradients inside the
    backward scan's body just as a dense layer's at the top."""
    @functools.wraps(rewrite)
    def deep(closed: ClosedJaxpr) -> ClosedJaxpr:
        eqns, changed = [], False
        for e in closed.jaxpr.eqns:
            params = {k: _inside(v, deep) for k, v in e.params.items()}
            if any(params[k] is not v for k, v in e.params.items()):
                e, changed = e.replace(params=params), True
            eqns.append(e)
        if changed:
            closed = ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts)
        return rewrite(closed)

    return deep


def _inside(value, rewrite):
    """An equation's parameter with the jaxprs in it rewritten (the value
    itself where nothing changed)."""
    if isinstance(value, ClosedJaxpr):
        return rewrite(value)
    if isinstance(value, Jaxpr) and not value.constvars:
        result = rewrite(ClosedJaxpr(value, []))
        return value if result.jaxpr is value else result.jaxpr
    if isinstance(value, tuple) and any(isinstance(x, (ClosedJaxpr, Jaxpr)) for x in value):
        new = [_inside(x, rewrite) for x in value]
        if all(a is b for a, b in zip(new, value)):
            return value
        return type(value)(*new) if hasattr(value, "_fields") else tuple(new)  # namedtuples
    return value


def _uses(jaxpr) -> Counter:
    """How many times each variable is read (equations and outputs)."""
    return _reads(jaxpr.eqns, jaxpr.outvars)


def _reads(eqns: list, outvars) -> Counter:
    """How many times each variable is read by `eqns` and as an output."""
    uses = Counter(v for e in eqns for v in e.invars if isinstance(v, Var))
    uses.update(v for v in outvars if isinstance(v, Var))
    return uses


def _swappable(dot) -> bool:
    """A dot of two operands with one free dimension each, no batch dims."""
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    lhs, rhs = (v.aval for v in dot.invars)
    return not lb and not rb and len(lhs.shape) == len(lc) + 1 and len(rhs.shape) == len(rc) + 1


def fold_transposed_dots(closed: ClosedJaxpr) -> ClosedJaxpr:
    jaxpr = closed.jaxpr
    uses = _uses(jaxpr)
    dots = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive is P.dot_general_p}
    folded = {}  # id(transpose eqn) -> the swapped dot computing its result
    for e in jaxpr.eqns:
        transposed = e.primitive is P.transpose_p and isinstance(e.invars[0], Var)
        source = e.invars[0] if transposed else None  # a Literal is unhashable: no dot made it
        dot = dots.get(source)
        if (dot is None or tuple(e.params["permutation"]) != (1, 0) or uses[source] != 1
                or not _swappable(dot)):
            continue
        (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
        folded[id(e)] = dot.replace(
            invars=[dot.invars[1], dot.invars[0]], outvars=e.outvars,
            params={**dot.params, "dimension_numbers": ((rc, lc), (rb, lb))})
    if not folded:
        return closed
    gone = {id(dots[e.invars[0]]) for e in jaxpr.eqns if id(e) in folded}
    eqns = [folded.get(id(e), e) for e in jaxpr.eqns if id(e) not in gone]
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)


def _through(perm, dims):
    return tuple(int(perm[d]) for d in dims)


def _fold_operand(dot, index, transpose):
    """`dot` reading the transpose's input in place of operand `index`, or
    None when the result's dimension order would change (the operand's free
    dimensions must keep their order through the permutation)."""
    perm = tuple(transpose.params["permutation"])
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    contract, batch = (lc, lb) if index == 0 else (rc, rb)
    free = [d for d in range(len(perm)) if d not in contract and d not in batch]
    if list(_through(perm, free)) != sorted(_through(perm, free)):
        return None
    contract, batch = _through(perm, contract), _through(perm, batch)
    numbers = (((contract, rc), (batch, rb)) if index == 0 else ((lc, contract), (lb, batch)))
    invars = list(dot.invars)
    invars[index] = transpose.invars[0]
    return dot.replace(invars=invars, params={**dot.params, "dimension_numbers": numbers})


def fold_transposed_operands(closed: ClosedJaxpr) -> ClosedJaxpr:
    jaxpr = closed.jaxpr
    eqns = transposes_folded(jaxpr.eqns, jaxpr.outvars)
    if eqns is jaxpr.eqns:
        return closed
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)


def transposes_folded(eqns: list, outvars) -> list:
    """`eqns` with each transpose that only a dot_general reads folded into
    that dot's dimension numbers (`eqns` itself where none is)."""
    uses = _reads(eqns, outvars)
    transposes = {e.outvars[0]: e for e in eqns if e.primitive is P.transpose_p}
    replaced, gone = {}, set()
    for e in eqns:
        if e.primitive is not P.dot_general_p:
            continue
        dot = e
        for index, operand in enumerate(e.invars):
            if not isinstance(operand, Var):  # a Literal (unhashable): no transpose made it
                continue
            transpose = transposes.get(operand)
            if transpose is None or uses[operand] != 1:
                continue
            folded = _fold_operand(dot, index, transpose)
            if folded is not None:
                dot = folded
                gone.add(id(transpose))
        if dot is not e:
            replaced[id(e)] = dot
    if not replaced:
        return eqns
    return [replaced.get(id(e), e) for e in eqns if id(e) not in gone]


# --- reductions of broadcasts ------------------------------------------------------

_IDEMPOTENT = (P.reduce_max_p, P.reduce_min_p, P.reduce_and_p, P.reduce_or_p)


def _reduced_axes_of_source(reduce, broadcast):
    """The axes of the broadcast's operand that `reduce` sums (or maxes...)
    once the broadcast is moved after it, or None where that changes the
    arithmetic: a sum over an axis the broadcast made would add copies, where
    a multiplication rounds differently (a +0 literal aside: -0.0s sum to
    +0.0 from the reduction's +0.0 start)."""
    axes = set(reduce.params["axes"])
    x = broadcast.invars[0]
    dims, shape = broadcast.params["broadcast_dimensions"], broadcast.params["shape"]
    source = {int(d): i for i, d in enumerate(dims)}  # result axis -> operand axis
    made = [a for a in axes if a not in source or x.aval.shape[source[a]] != shape[a]]
    value = None if isinstance(x, Var) else np.asarray(x.val)
    zero = value is not None and not np.any(value) and not np.any(np.signbit(value))  # +0
    if made and reduce.primitive not in _IDEMPOTENT and not zero:
        return None
    return tuple(sorted(source[a] for a in axes if a in source))


def fold_reduced_broadcasts(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`reduce(broadcast_in_dim(x))` becomes `broadcast_in_dim(reduce(x))`:
    XLA never builds the broadcast; a kernel or MAX graph would write and
    read it whole (a mixture's log-prob: 16384x16x8 for 16x8 values)."""
    jaxpr = closed.jaxpr
    uses = _uses(jaxpr)
    broadcasts = {e.outvars[0]: e for e in jaxpr.eqns if e.primitive is P.broadcast_in_dim_p
                  and len(e.invars) == 1 and not e.params.get("sharding")}
    reducers = (P.reduce_sum_p, *_IDEMPOTENT)
    replaced, folded = {}, Counter()  # reduction -> its equations; broadcast -> folds
    for e in jaxpr.eqns:
        if e.primitive not in reducers or not isinstance(e.invars[0], Var):
            continue
        broadcast = broadcasts.get(e.invars[0])
        if broadcast is None:
            continue
        x_axes = _reduced_axes_of_source(e, broadcast)
        if x_axes is None:
            continue
        x = broadcast.invars[0]
        reduced, new = x, []
        if x_axes:
            kept = [s for i, s in enumerate(x.aval.shape) if i not in x_axes]
            reduced = Var(x.aval.update(shape=tuple(kept)))
            new.append(e.replace(invars=[x], outvars=[reduced],
                                 params={**e.params, "axes": x_axes}))
        axes = set(e.params["axes"])
        dims = [int(d) for i, d in enumerate(broadcast.params["broadcast_dimensions"])
                if i not in x_axes]
        out_dims = tuple(d - sum(a < d for a in axes) for d in dims)
        params = {**broadcast.params, "shape": tuple(e.outvars[0].aval.shape),
                  "broadcast_dimensions": out_dims}
        new.append(broadcast.replace(invars=[reduced], outvars=e.outvars, params=params))
        replaced[id(e)] = new
        folded[broadcast.outvars[0]] += 1
    if not replaced:
        return closed
    # A broadcast read by other equations too stays for them.
    gone = {id(broadcasts[v]) for v, n in folded.items() if n == uses[v]}
    eqns = [n for e in jaxpr.eqns if id(e) not in gone for n in replaced.get(id(e), [e])]
    # Again: the operand may be a broadcast too (`x[:, None]` is one).
    return fold_reduced_broadcasts(ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts))


#: Scalar arithmetic folded to find a power's exponent (`x ** (a - 1)` in a
#: derivative): numpy's IEEE arithmetic on scalars is XLA's.
_FOLDED = {P.add_p: np.add, P.sub_p: np.subtract, P.mul_p: np.multiply,
           P.div_p: np.divide, P.neg_p: np.negative}


def _scalar(known: dict, v):
    """The value of `v` where it is a known scalar (a literal, a constant of
    the jaxpr, or scalar arithmetic of those), else None."""
    if isinstance(v, Literal):
        value = np.asarray(v.val)
        return value if value.shape == () else None
    return known.get(v)


def _known_scalars(closed: ClosedJaxpr) -> dict:
    known = {v: np.asarray(c) for v, c in zip(closed.jaxpr.constvars, closed.consts)
             if np.shape(c) == ()}
    for e in closed.jaxpr.eqns:
        fold = _FOLDED.get(e.primitive)
        if e.primitive is P.convert_element_type_p:
            fold = lambda x: x.astype(e.params["new_dtype"])  # noqa: E731
        values = [_scalar(known, v) for v in e.invars]
        if fold is None or any(x is None for x in values) or e.outvars[0].aval.shape != ():
            continue
        with np.errstate(all="ignore"):
            known[e.outvars[0]] = np.asarray(fold(*values)).astype(e.outvars[0].aval.dtype)
    return known


def _simplified(closed: ClosedJaxpr, simplify) -> ClosedJaxpr:
    """`closed` with each equation replaced by `simplify(eqn)`: an equation,
    or a variable or literal its result is renamed to, or a tuple of them,
    one per result (the equation dropped); `closed` itself where nothing
    changed."""
    jaxpr = closed.jaxpr
    eqns, outvars = simplified_eqns(jaxpr.eqns, jaxpr.outvars, simplify)
    if eqns is jaxpr.eqns:
        return closed
    return ClosedJaxpr(jaxpr.replace(eqns=eqns, outvars=outvars), closed.consts)


def simplified_eqns(eqns: list, outvars: list, simplify):
    """(eqns, outvars) of `_simplified` for a list of equations and the
    outputs read after them; `eqns` itself where nothing changed."""
    renamed, out = {}, []
    for e in eqns:
        if renamed:
            e = e.replace(invars=[renamed.get(v, v) if isinstance(v, Var) else v
                                  for v in e.invars])
        result = simplify(e)
        if isinstance(result, (Var, Literal)):
            result = (result,)
        if isinstance(result, tuple):  # one atom per result
            renamed.update(zip(e.outvars, result))
            continue
        out.append(result)
    if len(out) == len(eqns) and all(a is b for a, b in zip(out, eqns)):
        return eqns, outvars
    return out, [renamed.get(v, v) if isinstance(v, Var) else v for v in outvars]


def fold_constant_powers(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`pow(x, 2.0)` (jnp's `x ** 2.0`) becomes `x * x`, `pow(x, 1.0)` `x`
    and `pow(x, -1.0)` `1 / x`, as XLA's algebraic simplifier does: the
    same values (C's pow rounds those exactly), where a generated kernel
    called libm's scalar powf per element (a jax-md pair potential and its
    derivative: 14% of a step)."""
    if not any(e.primitive is P.pow_p for e in closed.jaxpr.eqns):
        return closed
    known = _known_scalars(closed)

    def simplify(e):
        if e.primitive is not P.pow_p or np.dtype(e.outvars[0].aval.dtype).kind != "f":
            return e
        y, x = _scalar(known, e.invars[1]), e.invars[0]
        if y is None or x.aval.shape != e.outvars[0].aval.shape or float(y) not in (2.0, 1.0, -1.0):
            return e
        if float(y) == 1.0:
            return x
        if float(y) == 2.0:
            return e.replace(primitive=P.mul_p, invars=[x, x], params=arithmetic_params(P.mul_p))
        one = Literal(np.array(1, x.aval.dtype), x.aval.update(shape=()))
        return e.replace(primitive=P.div_p, invars=[one, x], params=arithmetic_params(P.div_p))

    return _simplified(closed, simplify)


def fold_trivial_selects(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`select_n(p, x, x, ...)`, every case the same value, becomes `x`, as
    XLA's simplifier folds it; `stop_gradient(x)` is `x` here (the program
    is past differentiation). `vmap` of a `lax.cond` guards each branch's
    operands by `select_n(p, stop_gradient(x), x)`: pgx's batched step
    wrote a 1024x276 select, and the broadcast of its predicate, per ply."""
    def simplify(e):
        if e.primitive is P.stop_gradient_p:
            return e.invars[0]
        if e.primitive is not P.select_n_p:
            return e
        first = e.invars[1]
        same = isinstance(first, Var) and all(c is first for c in e.invars[2:])
        return first if same and first.aval.shape == e.outvars[0].aval.shape else e

    return _simplified(closed, simplify)


def _unit_reshape_sources(jaxpr) -> dict:
    """var -> the value it reshapes without moving elements (a reshape, or
    a broadcast_in_dim that only adds axes of size 1: XLA's bitcasts)."""
    sources = {}
    for e in jaxpr.eqns:
        if e.primitive not in (P.reshape_p, P.broadcast_in_dim_p) or not isinstance(e.invars[0], Var):
            continue
        if e.primitive is P.reshape_p and e.params.get("dimensions") is not None:
            continue
        if len(e.invars) == 1 and e.invars[0].aval.size == e.outvars[0].aval.size:
            sources[e.outvars[0]] = e.invars[0]
    return sources


def fold_boolean_products(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`x * convert(b)` of a boolean `b` of x's shape becomes
    `select_n(b, 0, x)`, as XLA's algebraic simplifier rewrites it: where b
    is False the product is +0.0 even for a NaN, an infinity or a negative
    x (`x * mask` in a masked loss). As XLA moves reshapes after elementwise
    ops, the same holds when both factors are reshapes of values of one
    shape (jnp's rank promotion of `x * b[None]`); a real broadcast between
    them keeps IEEE's product, as under XLA."""
    jaxpr = closed.jaxpr
    # XLA moves a convert before a broadcast or reshape of its operand first,
    # and the product no longer matches.
    moved = {e.outvars[0] for e in jaxpr.eqns
             if e.primitive in (P.broadcast_in_dim_p, P.reshape_p)}
    masks = {e.outvars[0]: e.invars[0] for e in jaxpr.eqns
             if e.primitive is P.convert_element_type_p and isinstance(e.invars[0], Var)
             and e.invars[0].aval.dtype == np.bool_ and e.invars[0] not in moved}
    if not masks:
        return closed
    reshaped = _unit_reshape_sources(jaxpr)
    eqns, changed = [], False
    for e in jaxpr.eqns:
        out = e.outvars[0].aval if e.outvars else None
        if e.primitive is not P.mul_p or np.dtype(out.dtype).kind != "f":
            eqns.append(e)
            continue
        factors = list(e.invars)
        if not all(isinstance(v, Var) for v in factors):  # a literal factor: as it is
            eqns.append(e)
            continue
        if not any(v in masks for v in factors) and all(v in reshaped for v in factors):
            factors = [reshaped[v] for v in factors]  # both reshaped alike: look through
        mask = next((k for k, v in enumerate(factors) if v in masks), None)
        if mask is None or factors[0].aval.shape != factors[1].aval.shape:
            eqns.append(e)
            continue
        shape = factors[0].aval.shape
        zero = Var(out.update(shape=shape, weak_type=False))
        literal = Literal(np.array(0, out.dtype), out.update(shape=(), weak_type=False))
        eqns.append(e.replace(primitive=P.broadcast_in_dim_p, invars=[literal], outvars=[zero],
                              params=broadcast_params(shape)))
        chosen = e.outvars[0] if shape == out.shape else Var(out.update(shape=shape))
        eqns.append(e.replace(primitive=P.select_n_p, params={}, outvars=[chosen],
                              invars=[masks[factors[mask]], zero, factors[1 - mask]]))
        if chosen is not e.outvars[0]:
            eqns.append(e.replace(primitive=P.reshape_p, invars=[chosen],
                                  params=reshape_params(out.shape)))
        changed = True
    if not changed:
        return closed
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)


_REDUCTIONS = (P.reduce_sum_p, P.reduce_prod_p, *_IDEMPOTENT)


def fold_one_element_reductions(closed: ClosedJaxpr) -> ClosedJaxpr:
    """A sum, product, max, min, and or or over axes of size 1 becomes a
    reshape of its operand, as XLA's simplifier makes it: the element
    itself, -0.0 and denormals included, where `0 + x` gave +0.0 and a
    flushed denormal (a `keepdims` sum over a broadcast's new axis)."""
    def simplify(e):
        if e.primitive not in _REDUCTIONS:
            return e
        x = e.invars[0]
        if any(x.aval.shape[a] != 1 for a in e.params["axes"]):
            return e
        shape = e.outvars[0].aval.shape
        return e.replace(primitive=P.reshape_p, params=reshape_params(shape))

    if not any(e.primitive in _REDUCTIONS for e in closed.jaxpr.eqns):
        return closed
    return _simplified(closed, simplify)


def _key(atom):
    if isinstance(atom, Literal):
        value = np.asarray(atom.val)
        return ("literal", value.dtype.str, value.shape, value.tobytes())
    return atom


def dead_dropped(eqns: list, outvars: list) -> list:
    """`eqns` without the pure equations whose results nothing reads (after
    inlining: a decomposition that ignores an operand leaves its producer
    unread); `eqns` itself where none is dead."""
    live = {v for v in outvars if isinstance(v, Var)}
    kept = []
    for e in reversed(eqns):
        if e.effects or eqn_has_callbacks(e) or any(v in live for v in e.outvars):
            kept.append(e)
            live.update(v for v in e.invars if isinstance(v, Var))
    return eqns if len(kept) == len(eqns) else kept[::-1]


def repeats_merged(eqns: list, outvars: list):
    """(eqns, outvars, the equations dropped) with each pure equation that
    repeats an earlier one (the same primitive, operands and parameters)
    dropped and its results renamed to the earlier's, as XLA's CSE pass
    does: after calls are inlined, `slogdet`, `det` and `lu_factor` of one
    matrix factor it once. Equations with effects or host callbacks
    (jax.jit calls each) stay."""
    seen, dropped = {}, []

    def simplify(e):
        if e.effects or eqn_has_callbacks(e) or any(type(v).__name__ == "DropVar"
                                                    for v in e.outvars):
            return e
        if e.primitive is P.broadcast_in_dim_p and not e.invars[0].aval.shape:
            # A fill is written where it is used (XLA fuses it into each user):
            # merged, every scatter or update into it would copy it first.
            return e
        try:
            key = (e.primitive, tuple(map(_key, e.invars)),
                   tuple(sorted(e.params.items())))
            hash(key)
        except TypeError:  # a parameter that is not hashable (an array)
            return e
        if key in seen:
            dropped.append(e)
            return seen[key]
        seen[key] = tuple(e.outvars)
        return e

    return (*simplified_eqns(eqns, outvars, simplify), dropped)


#: Elementwise primitives (by name: some are not in every jax release).
_ELEMENTWISE = frozenset(p for p in (getattr(P, f"{name}_p", None) for name in (
    "add sub mul div rem pow max min neg abs sign floor ceil round exp exp2 log log1p expm1 "
    "tanh logistic sin cos tan asin acos atan sinh cosh asinh acosh atanh sqrt rsqrt cbrt "
    "erf erfc erf_inv lgamma digamma is_finite not and or xor eq ne lt le gt ge select_n "
    "convert_element_type integer_pow shift_left shift_right_logical shift_right_arithmetic "
    "nextafter atan2 square clamp population_count clz").split()) if p is not None)


def below_broadcasts(eqns: list, outvars) -> list:
    """`eqns` (of a jaxpr with outputs `outvars`) with elementwise work on
    broadcasts moved below them and the broadcasts no longer read dropped;
    `eqns` itself where nothing moved. `f(broadcast(x), broadcast(y), 2)`
    for an elementwise f, every array operand broadcast alike, becomes
    `broadcast(f(x, y, 2))`, as XLA's simplifier sinks elementwise work
    below broadcasts: jax's betainc broadcast its iteration counter to the
    batch and took integer remainders and quotients of every copy, each
    iteration (16k elements x 200 iterations of scalar division: 8x
    jax.jit)."""
    return _moved_across(eqns, outvars, _before_broadcast, lambda e: (
        e.primitive is P.broadcast_in_dim_p and len(e.invars) == 1))


def _moved_across(eqns: list, outvars, move, is_source) -> list:
    """`eqns` with each equation that `move(e, sources)` rewrites as [e on
    its sources' operands, one source op of its result] so replaced (the
    sources: equations that `is_source`, or such results of a move), and
    the sources no longer read dropped; `eqns` itself where nothing moved."""
    sources, out, changed = {}, [], False
    for e in eqns:
        moved = move(e, sources)
        if moved is None:
            out.append(e)
            if is_source(e):
                sources[e.outvars[0]] = e
            continue
        out += moved
        sources[moved[1].outvars[0]] = moved[1]
        changed = True
    if not changed:
        return eqns
    return dead_dropped(out, outvars)  # the old sources, unread now


def above_transposes(eqns: list, outvars) -> list:
    """`eqns` with elementwise work on transposes done on their operands
    and the result transposed once: `f(x.T, y.T, 2)` becomes `f(x, y, 2).T`,
    each transpose read by nothing else, so a transpose climbs to the
    product that reads it and folds into its dimension numbers
    (`transposes_folded`), as XLA's algebraic simplifier moves transposes
    (ott's Sinkhorn squared a transposed 512x640 kernel each iteration
    before a matrix-vector product: a scalar transpose per step).
    `eqns` itself where nothing moved."""
    uses = _reads(eqns, outvars)
    return _moved_across(eqns, outvars, lambda e, found: _before_transpose(e, found, uses),
                         lambda e: e.primitive is P.transpose_p)


def _before_transpose(e, transposes, uses):
    """(f on the transposes' operands, the transpose of its result), or None."""
    if e.primitive not in _ELEMENTWISE or len(e.outvars) != 1 or e.effects:
        return None
    found = [transposes[a] for a in e.invars if isinstance(a, Var) and a in transposes]
    if not found:
        return None
    permutation = tuple(found[0].params["permutation"])
    for a in e.invars:
        if isinstance(a, Var) and a in transposes:
            if tuple(transposes[a].params["permutation"]) != permutation or uses[a] != 1:
                return None
        elif (np.shape(a.val) if isinstance(a, Literal) else tuple(a.aval.shape)) != ():
            return None  # an operand not transposed: nothing to gain
    (out,) = e.outvars
    inner = Var(out.aval.update(shape=tuple(found[0].invars[0].aval.shape)))
    ins = [transposes[a].invars[0] if isinstance(a, Var) and a in transposes else a
           for a in e.invars]
    return [e.replace(invars=ins, outvars=[inner]), found[0].replace(invars=[inner], outvars=[out])]


def _before_broadcast(e, broadcasts):
    """(f on the broadcasts' operands, the broadcast of its result), or None."""
    if e.primitive not in _ELEMENTWISE or len(e.outvars) != 1 or e.effects:
        return None
    found = [broadcasts[a] for a in e.invars if not isinstance(a, Literal) and a in broadcasts]
    if not found:
        return None

    def how(b):
        return (tuple(b.params["shape"]), tuple(b.params["broadcast_dimensions"]),
                tuple(b.invars[0].aval.shape))

    for a in e.invars:
        if not isinstance(a, Literal) and a in broadcasts:
            if how(broadcasts[a]) != how(found[0]):
                return None
        elif (np.shape(a.val) if isinstance(a, Literal) else tuple(a.aval.shape)) != ():
            return None  # an operand of the full shape: nothing to move
    (out,) = e.outvars
    if tuple(out.aval.shape) != how(found[0])[0]:
        return None
    small = Var(out.aval.update(shape=how(found[0])[2]))
    ins = [broadcasts[a].invars[0] if not isinstance(a, Literal) and a in broadcasts else a
           for a in e.invars]
    return [e.replace(invars=ins, outvars=[small]), found[0].replace(invars=[small], outvars=[out])]


def _with_inputs(jaxpr, invars, eqns):
    """`jaxpr` with other inputs and equations (its debug names padded)."""
    info = jaxpr.debug_info
    names = getattr(info, "arg_names", None)
    if names is not None and len(names) != len(invars):
        old = dict(zip(jaxpr.invars, names))
        info = info._replace(arg_names=tuple(old.get(v, "") for v in invars))
    return jaxpr.replace(invars=invars, eqns=eqns, debug_info=info)


def _invariant_part(body, nconsts: int):
    """The equations of a loop body (ClosedJaxpr) that read only its first
    `nconsts` inputs (the loop's constants), literals and each other, pure;
    the rest; and which of the former's results the rest reads. Callbacks
    stay (a user counts a pure_callback's calls: jax.jit makes one a trip). Broadcasts
    stay: a fused loop reads them in place, where a hoisted one would be
    written whole and read each trip (as XLA leaves size-inflating ops)."""
    invariant = set(body.jaxpr.invars[:nconsts])
    hoisted, kept = [], []
    for e in body.jaxpr.eqns:
        if (not e.effects and not eqn_has_callbacks(e) and e.primitive is not P.broadcast_in_dim_p
                and all(isinstance(a, Literal) or a in invariant for a in e.invars)):
            hoisted.append(e)
            invariant.update(e.outvars)
        else:
            kept.append(e)
    read = {a for e in kept for a in e.invars if isinstance(a, Var)}
    read.update(a for a in body.jaxpr.outvars if isinstance(a, Var))
    made = [v for e in hoisted for v in e.outvars if v in read and v not in
            body.jaxpr.invars[:nconsts]]
    return hoisted, kept, made


def _inlined_body(body):
    """A loop body with its calls inlined (jit, custom_jvp/vjp, remat), or
    None where it has none: what a library's step function computes from
    the loop's constants is inside its calls (jax-md's energy)."""
    if not any(e.primitive in inlining.CALLS for e in body.jaxpr.eqns):
        return None
    eqns, outvars, consts, _ = inlining.inlined(body.jaxpr)
    jaxpr = body.jaxpr.replace(constvars=[*body.jaxpr.constvars, *(v for v, _ in consts)],
                               eqns=eqns, outvars=outvars)
    return ClosedJaxpr(jaxpr, [*body.consts, *(value for _, value in consts)])


def _hoisted(eqn, body, nconsts: int, first_const: int):
    """(equations before the loop, the loop's new body, its new operands,
    how many constants were added) or None: `first_const` is where the
    body's constants start among the loop equation's operands. The body's
    calls are inlined where that lets more move."""
    hoisted, kept, made = _invariant_part(body, nconsts)
    flat = _inlined_body(body)
    if flat is not None:
        found = _invariant_part(flat, nconsts)
        if len(found[0]) > len(hoisted):
            body, (hoisted, kept, made) = flat, found
    if not hoisted:
        return None
    outer = dict(zip(body.jaxpr.invars[:nconsts],
                     eqn.invars[first_const:first_const + nconsts]))
    before = []
    for e in hoisted:
        outs = [Var(v.aval) for v in e.outvars]
        ins = [a if isinstance(a, Literal) else outer[a] for a in e.invars]
        before.append(e.replace(invars=ins, outvars=outs))
        outer.update(zip(e.outvars, outs))
    invars = body.jaxpr.invars
    jaxpr = _with_inputs(body.jaxpr, [*invars[:nconsts], *made, *invars[nconsts:]], kept)
    at = first_const + nconsts
    operands = [*eqn.invars[:at], *(outer[v] for v in made), *eqn.invars[at:]]
    return before, ClosedJaxpr(jaxpr, body.consts), operands, len(made)


def hoist_loop_invariants(closed: ClosedJaxpr) -> ClosedJaxpr:
    """Equations of a while or scan body that read only the loop's
    constants (and literals) run once, before the loop, their results
    passed in as more constants: XLA's while-loop invariant code motion.
    jax-md's pair potential built a 1024x1024 identity mask (two iotas, an
    add, a comparison, a convert) in every one of its 100 steps. (A scan
    of jax >= 0.11 describes its operands by flat trees: left as it is.)"""
    eqns, changed = [], False
    for e in closed.jaxpr.eqns:
        found = None
        if e.primitive is P.while_p:
            p = e.params
            found = _hoisted(e, p["body_jaxpr"], p["body_nconsts"], p["cond_nconsts"])
            if found:
                before, body, operands, added = found
                e = e.replace(invars=operands, params={
                    **p, "body_jaxpr": body, "body_nconsts": p["body_nconsts"] + added})
        elif e.primitive is P.scan_p and "num_consts" in e.params:
            p = e.params
            found = _hoisted(e, p["jaxpr"], p["num_consts"], 0)
            if found:
                before, body, operands, added = found
                params = {**p, "jaxpr": body, "num_consts": p["num_consts"] + added}
                if "linear" in p:
                    params["linear"] = (*p["linear"][:p["num_consts"]], *(False,) * added,
                                        *p["linear"][p["num_consts"]:])
                e = e.replace(invars=operands, params=params)
        if found:
            eqns += found[0]
            changed = True
        eqns.append(e)
    if not changed:
        return closed
    return ClosedJaxpr(closed.jaxpr.replace(eqns=eqns), closed.consts)
