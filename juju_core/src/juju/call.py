"""`juju_call`: a `juju.jit` function seen by JAX as one primitive.

When a `juju.jit` function is called on JAX tracers (under `jax.grad`,
`jax.vmap`, `jax.jit`, or inside another `juju.jit`), it traces its function
to a closed Jaxpr and binds `juju_call_p` on it. Then:

- juju's interpreter inlines it (`lower_juju_call`): `juju.jit` inside
  `juju.jit` is one graph.
- Evaluated eagerly (`impl`), it compiles the Jaxpr with MAX once and runs it.
- JAX differentiates it: the JVP rule binds `juju_call` on the forward
  (primal outputs plus residuals) and on the linear tangent part, split with
  partial evaluation; the transpose rule binds `juju_call` on the
  `jax.linear_transpose` of the linear part. Derivatives therefore run on MAX
  too, and the forward pass is not recomputed in the backward one.
- `jax.vmap` batches the Jaxpr (`jax.vmap` of it, re-bound as `juju_call`).
- Inside `jax.jit` (XLA), it lowers to a host callback (`jax.pure_callback`)
  that runs the MAX executable; see docs/control-flow-and-transforms.md for
  the cost.

Invariant: the `jaxpr` param holds no consts; they are hoisted to leading
operands so that transformations see closed-over tracers and the compiled
executable can be shared between Jaxprs that print the same.
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref

import jax
import numpy as np
from jax import tree_util

from juju import _structural
from juju.arguments import to_numpy
from juju._compat import (
    ClosedJaxpr,
    JaxPrimitive,
    ad_jvp_jaxpr,
    ad_Zero,
    convert_constvars_jaxpr,
    is_tracer,
    is_undefined_primal,
    jaxpr_as_fun,
    partial_eval_jaxpr_nounits,
    register_transformation_rules,
    sub_jaxprs_of_params,
)

juju_call_p = JaxPrimitive("juju_call")
juju_call_p.multiple_results = True


# --- binding -------------------------------------------------------------------

# Weak caches keyed by Jaxpr identity, so that the Jaxprs derived from one
# traced function (hoisted, jvp, transpose, vmap) stay the same objects across
# calls and their MAX executables are reused.
_derived: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_traces: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()


def _memo(jaxpr, key, make):
    table = _derived.setdefault(jaxpr, {})
    if key not in table:
        table[key] = make()
    return table[key]


def _hoist(closed: ClosedJaxpr) -> tuple[ClosedJaxpr, list]:
    """(the Jaxpr with consts turned into leading inputs, the consts)."""
    if not closed.consts:
        return closed, []

    def make():
        return ClosedJaxpr(convert_constvars_jaxpr(closed.jaxpr), ())

    return _memo(closed, "hoisted", make), list(closed.consts)


def bind(closed: ClosedJaxpr, args, *, engine, name) -> list:
    """Bind `juju_call_p` on `closed` (consts hoisted) applied to `args`."""
    jaxpr, consts = _hoist(closed)
    return juju_call_p.bind(*consts, *args, jaxpr=jaxpr, engine=engine, name=name)


def _aval(leaf):
    aval = jax.typeof(leaf)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def call_traced(fn, args, kwargs):
    """`fn(*args, **kwargs)` for a `juju.jit` function `fn` called on tracers."""
    dyn_args, dyn_kwargs, statics = fn.split_arguments(args, kwargs)
    leaves, treedef = tree_util.tree_flatten((dyn_args, dyn_kwargs))
    leaves = [x if is_tracer(x) or isinstance(x, jax.Array) else jax.numpy.asarray(x)
              for x in leaves]
    avals = tuple(map(_aval, leaves))
    key = (treedef, statics, avals)
    cache = _traces.setdefault(fn, {})
    entry = cache.get(key)
    if entry is None:
        entry = fn.trace_to_jaxpr(treedef, statics, avals)
        if not any(is_tracer(c) for c in entry[0].consts):  # closed-over tracers: retrace
            cache[key] = entry
    closed, out_tree = entry
    outs = bind(closed, leaves, engine=fn.engine, name=getattr(fn, "__name__", "fn"))
    return tree_util.tree_unflatten(out_tree, outs)


# --- evaluation on MAX ---------------------------------------------------------

_runners_by_jaxpr: "weakref.WeakKeyDictionary[object, object]" = weakref.WeakKeyDictionary()
_runners_by_text: dict = {}
# `juju.jit.jit`, which runs the Jaxprs: installed by juju.jit (the layer above,
# which imports this module) when it is imported.
_jit = None


def install_jit(jit) -> None:
    """Make `jit` (juju.jit.jit) what evaluates juju_call's Jaxprs on MAX."""
    global _jit
    _jit = jit


def runner(jaxpr: ClosedJaxpr, engine, name):
    """The `juju.jit` function (MAX buffers out) that evaluates `jaxpr`.

    Shared between Jaxprs that print the same: re-traced functions (e.g. under
    eager `jax.grad`, which traces on every call) reuse one MAX executable.
    """
    found = _runners_by_jaxpr.get(jaxpr)
    if found is None:
        key = (engine, str(jaxpr.jaxpr))
        found = _runners_by_text.get(key)
        if found is None:
            fun = jaxpr_as_fun(jaxpr)
            fun.__name__ = f"juju_call_{name}"
            # Not tiered: XLA's host callbacks run these, and must not call jax.
            found = _runners_by_text[key] = _jit(fun, engine=engine, tiered=False)
        _runners_by_jaxpr[jaxpr] = found
    return found


class Stats:
    """How many times juju_call ran on MAX: eagerly, and from XLA callbacks."""

    eager = 0
    callbacks = 0


def lower_calls(fun, *args, **kwargs) -> list:
    """Lower (not compile) the MAX graphs that `fun(*args, **kwargs)` will run
    through juju_call, e.g. for `fun = jax.grad(juju.jit(f))` or a `jax.jit`
    function calling `juju.jit` ones. Pass them to `juju.compile_all` to
    compile them all in one MAX compilation before the first call.
    """
    closed = jax.make_jaxpr(fun)(*args, **kwargs)
    lowered = []

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive is juju_call_p:  # nested juju_calls are inlined in it
                fn = runner(eqn.params["jaxpr"], eqn.params["engine"], eqn.params["name"])
                avals = [v.aval for v in eqn.invars]
                # eager calls see jax arrays (weak types kept), XLA callbacks numpy
                for weak in {tuple(a.weak_type for a in avals), (False,) * len(avals)}:
                    lowered.append(fn.lower(*[
                        jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=w)
                        for a, w in zip(avals, weak)
                    ]))
                continue
            for sub in sub_jaxprs_of_params(eqn.params):
                visit(sub)

    visit(closed.jaxpr)
    return list({id(low): low for low in lowered}.values())  # each graph once


def _impl(*args, jaxpr, engine, name):
    Stats.eager += 1
    outs = runner(jaxpr, engine, name)(*args)
    return [jax.numpy.from_dlpack(o) for o in outs]


def _abstract_eval(*avals, jaxpr, engine, name):
    return jaxpr.out_avals


def _host_callback(*arrays, jaxpr, engine, name):
    """Runs on the host when XLA reaches the callback."""
    Stats.callbacks += 1
    outs = runner(jaxpr, engine, name)(*arrays)
    return [np.asarray(to_numpy(o)).reshape(a.shape) for o, a in zip(outs, jaxpr.out_avals)]


_inline = contextvars.ContextVar("juju_inline_on_xla", default=False)


@contextlib.contextmanager
def inline_on_xla():
    """While set, `jax.jit` lowers juju_call by inlining its Jaxpr, not by a
    callback to MAX: the XLA tier (juju/tiers.py) runs whole programs on XLA."""
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)


def _xla_implementation(*args, jaxpr, engine, name):
    if _inline.get():
        return jaxpr_as_fun(jaxpr)(*args)
    result = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in jaxpr.out_avals]

    def host(*arrays):
        return _host_callback(*arrays, jaxpr=jaxpr, engine=engine, name=name)

    # Batching never reaches the callback: vmap batches juju_call itself.
    return jax.pure_callback(host, result, *args, vmap_method="sequential")


# --- transformations ---------------------------------------------------------


def _jvp(primals, tangents, *, jaxpr, engine, name):
    nonzeros = tuple(type(t) is not ad_Zero for t in tangents)
    jvp_closed, out_nonzeros = ad_jvp_jaxpr(jaxpr, nonzeros, instantiate=False)
    n_nz = sum(nonzeros)
    # Split the JVP by dependence on the tangents: the known part computes the
    # primal outputs and residuals, the unknown part is linear in tangents.
    known, unknown, out_unknowns, res_avals = partial_eval_jaxpr_nounits(
        jvp_closed, [False] * len(primals) + [True] * n_nz, instantiate=False
    )
    known_outs = bind(known, primals, engine=engine, name=f"{name}_fwd")
    split = len(known_outs) - len(res_avals)
    known_vals, residuals = known_outs[:split], known_outs[split:]
    nz_tangents = [t for t in tangents if type(t) is not ad_Zero]
    unknown_vals = bind(unknown, [*residuals, *nz_tangents], engine=engine, name=f"{name}_lin")
    known_it, unknown_it = iter(known_vals), iter(unknown_vals)
    outs = [next(unknown_it) if unk else next(known_it) for unk in out_unknowns]
    n_out = len(jaxpr.out_avals)
    primals_out, nz_tangents_out = outs[:n_out], iter(outs[n_out:])
    tangents_out = [
        next(nz_tangents_out) if nz else ad_Zero(aval.to_tangent_aval())
        for nz, aval in zip(out_nonzeros, jaxpr.out_avals)
    ]
    return primals_out, tangents_out


def _transpose(cts, *args, jaxpr, engine, name):
    undefined = tuple(is_undefined_primal(x) for x in args)
    ct_nonzero = tuple(type(c) is not ad_Zero for c in cts)
    residuals = [x for x, u in zip(args, undefined) if not u]
    nz_cts = [c for c in cts if type(c) is not ad_Zero]
    res_structs = tuple(map(_aval, residuals))
    lin_structs = tuple(_struct(x.aval) for x in args if is_undefined_primal(x))
    key = ("transpose", undefined, ct_nonzero, res_structs)

    def make():
        return _transpose_jaxpr(jaxpr, undefined, ct_nonzero, res_structs, lin_structs)

    transposed = _memo(jaxpr, key, make)
    outs = iter(bind(transposed, [*residuals, *nz_cts], engine=engine, name=f"{name}_T"))
    return [next(outs) if u else None for u in undefined]


def _struct(aval):
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def _transpose_jaxpr(jaxpr, undefined, ct_nonzero, res_structs, lin_structs):
    out_avals = jaxpr.out_avals
    fun = jaxpr_as_fun(jaxpr)

    def transposed(residuals, nz_cts):
        nz_it = iter(nz_cts)
        cts = [next(nz_it) if nz else jax.numpy.zeros(a.shape, a.dtype)
               for nz, a in zip(ct_nonzero, out_avals)]

        def linear(*lin):
            res_it, lin_it = iter(residuals), iter(lin)
            return fun(*[next(lin_it) if u else next(res_it) for u in undefined])

        return jax.linear_transpose(linear, *lin_structs)(cts)

    ct_structs = [_struct(a) for nz, a in zip(ct_nonzero, out_avals) if nz]
    return jax.make_jaxpr(transposed)(list(res_structs), ct_structs)


def _batch(args, dims, *, jaxpr, engine, name):
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    in_axes = tuple(dims)
    structs = tuple(map(_aval, args))
    key = ("vmap", in_axes, size, structs)

    def make():
        return jax.make_jaxpr(jax.vmap(jaxpr_as_fun(jaxpr), in_axes=in_axes, axis_size=size))(
            *structs
        )

    batched = _memo(jaxpr, key, make)
    outs = bind(batched, args, engine=engine, name=f"{name}_vmap")
    return outs, [0] * len(outs)


juju_call_p.def_impl(_impl)
juju_call_p.def_abstract_eval(_abstract_eval)
register_transformation_rules(
    juju_call_p,
    jvp=_jvp,
    transpose=_transpose,
    batching=_batch,
    xla_implementation=_xla_implementation,
    multiple_results=True,
)


# --- juju's own lowering: inline ------------------------------------------------


@_structural.rules.register(juju_call_p)
def lower_juju_call(ctx, *args, jaxpr, engine, name):
    # A juju.jit function inside a juju.jit function: one graph. The inner
    # function's engine is the outer graph's device here.
    return ctx.lower(jaxpr, *args)
