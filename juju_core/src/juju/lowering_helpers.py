"""Helpers for writing rules."""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import numpy as np
from max.graph import ops

from juju._compat import is_complex_dtype, key_data_aval
from juju.dtypes import physical_aval


def _name_of(fun) -> str:
    """A stable name: a partial's repr holds a memory address, which would
    make the registry's fingerprint differ from run to run."""
    while isinstance(fun, functools.partial):
        fun = fun.func
    return getattr(fun, "__qualname__", repr(fun))


def lower_fun(fun, multiple_results: bool = False, *, extra_params=None):
    """Turn a JAX function into a rule: decomposition for free.

    `lower_fun(f)` returns `rule(ctx, *operands, **params)` that traces
    `f(*operands, **params)` on the equation's input avals and lowers the
    resulting Jaxpr through the interpreter. `f` must not emit the primitive
    being lowered (that would recurse forever). Key arrays reach `f` as their
    raw key data.

    The rule's `decomposition(ctx)` gives the traced Jaxpr without lowering
    it: the interpreter's pre-pass looks inside, so missing rules and kernel
    libraries needed by the decomposition are found before any graph is built.

        rules.register(lax.logistic_p)(lower_fun(lambda x, **_: 1 / (1 + jnp.exp(-x))))

    Args:
        fun: `fun(*operands, **params)`, in JAX, with the primitive's semantics.
        multiple_results: whether the primitive returns a list of arrays.
        extra_params: `extra_params(ctx) -> dict` of keyword arguments for
            `fun` computed from the avals (e.g. a key array's PRNG impl).

    Returns:
        The rule function, for `RuleSet.register` or `juju.Rule`.
    """

    def params_for(ctx, params):
        return {**params, **extra_params(ctx)} if extra_params is not None else params

    def decomposition(ctx):
        return _trace(fun, tuple(ctx.avals_in), freeze_params(params_for(ctx, ctx.params)))

    def lower_via_jax(ctx, *operands, **params):
        closed = _trace(fun, tuple(ctx.avals_in), freeze_params(params_for(ctx, params)))
        outs = ctx.lower(closed, *operands)
        return outs if multiple_results else outs[0]

    lower_via_jax.__qualname__ = f"lower_fun({_name_of(fun)})"
    lower_via_jax.decomposition = decomposition
    return lower_via_jax


def freeze_params(params: dict):
    """Params as a hashable key of a traced-function cache (sorted items), or
    `UnhashableParams` where a value cannot be hashed (never cached)."""
    try:
        items = tuple(sorted(params.items()))
        hash(items)
        return items
    except TypeError:
        return UnhashableParams(params)


class UnhashableParams:
    """Params with an unhashable value: traced anew at every use."""

    def __init__(self, params):
        self.params = params

    def items(self):
        return self.params.items()


@functools.lru_cache(maxsize=4096)
def _trace_cached(fun, avals, params):
    return _trace_uncached(fun, avals, params)


def _trace(fun, avals, params):
    if isinstance(params, UnhashableParams):
        return _trace_uncached(fun, avals, params)
    return _trace_cached(fun, avals, params)


def _trace_uncached(fun, avals, params):
    kwargs = dict(params.items() if hasattr(params, "items") else params)
    # Key arrays arrive as their raw key data (see dtypes.physical_aval);
    # complex arrays stay complex: `fun` emits complex equations, lowered by
    # their own rules.
    avals = [key_data_aval(a) for a in avals]
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    return jax.make_jaxpr(lambda *xs: fun(*xs, **kwargs))(*structs)


def with_dtype(ctx, dtype):
    """`ctx` as if every operand and result had `dtype`: for a rule that
    computes in a wider or other type (casting its operands to it) and
    re-enters itself or another rule there."""
    def retyped(aval):
        return aval.update(dtype=np.dtype(dtype), weak_type=False)

    return dataclasses.replace(
        ctx, avals_in=tuple(map(retyped, ctx.avals_in)),
        avals_out=tuple(map(retyped, ctx.avals_out)),
    )


# --- complex numbers: rules written on the parts --------------------------------


def has_complex(ctx) -> bool:
    """Guard for complex rules: an operand or result of the equation is complex."""
    return any(is_complex_dtype(a.dtype) for a in (*ctx.avals_in, *ctx.avals_out))


class C(NamedTuple):
    """A complex array as JAX arrays of its parts, inside `on_parts` functions."""

    re: jax.Array
    im: jax.Array


def on_parts(fn):
    """A rule for equations on complex numbers, from `fn(*operands, **params)`
    written in JAX on their real parts: complex operands arrive as `C(re, im)`,
    real ones as arrays; `fn` returns, per output, a `C` (complex output) or an
    array (real output), or a list of them. MAX has no complex dtype: juju
    carries complex arrays as float[..., 2] (`juju.dtypes.physical_aval`).
    `fn` is traced once per signature and lowered through the real rules.

    Register it with a guard, above the real rule's priority, so that real
    equations keep their own rules, as `juju_ops_lax.complex_numbers` does:
    `rules.register(lax.mul_p, priority=1, guard=has_complex)(on_parts(mul))`
    (`has_complex` is in `juju.lowering_helpers`).
    """

    def lower_on_parts(ctx, *operands, **params):
        kinds = tuple(is_complex_dtype(a.dtype) for a in ctx.avals_in)
        parts = tuple((tuple(a.shape), physical_aval(a).dtype) for a in ctx.avals_in)
        closed = _trace_parts(fn, kinds, parts, tuple(sorted(params.items())))
        flat = []
        for x, k in zip(operands, kinds):
            flat += [x[..., 0], x[..., 1]] if k else [x]
        outs = iter(ctx.lower(closed, *flat))
        results = [
            ops.stack([next(outs), next(outs)], axis=-1) if is_complex_dtype(a.dtype)
            else next(outs)
            for a in ctx.avals_out
        ]
        return results if ctx.primitive.multiple_results else results[0]

    lower_on_parts.__qualname__ = f"on_parts({fn.__name__})"
    return lower_on_parts


def _trace_parts(fn, kinds, parts, params):
    try:
        return _trace_parts_cached(fn, kinds, parts, params)
    except TypeError:  # unhashable params
        return _trace_parts_uncached(fn, kinds, parts, params)


@functools.lru_cache(maxsize=2048)
def _trace_parts_cached(fn, kinds, parts, params):
    return _trace_parts_uncached(fn, kinds, parts, params)


def _trace_parts_uncached(fn, kinds, parts, params):
    """fn's Jaxpr taking each complex operand as two inputs (its parts)."""

    def flat_fn(*flat):
        it = iter(flat)
        args = [C(next(it), next(it)) if k else next(it) for k in kinds]
        out = fn(*args, **dict(params))
        res = []
        for o in (out if isinstance(out, list) else [out]):
            res += [o.re, o.im] if isinstance(o, C) else [o]
        return res

    structs = []
    for (shape, dtype), k in zip(parts, kinds):
        structs += [jax.ShapeDtypeStruct(shape, dtype)] * (2 if k else 1)
    return jax.make_jaxpr(flat_fn)(*structs)


def load_kernel_library(path) -> None:
    """Add a compiled Mojo library (`.mojoc`) to the graph being built.

    For kernels a rule generates while lowering (a library per equation,
    unknown to the pre-pass that loads `Rule.requires`); the graph carries
    the path, and juju compiles and caches the graph with it.
    """
    from pathlib import Path

    from max.graph import Graph

    graph = Graph.current
    if Path(path) not in graph.kernel_libraries_paths:
        graph._import_kernels([Path(path)])  # MAX-private in 26.7: the constructor's own step


def platform_branch(platforms, on_cpu: bool) -> int:
    """The branch of `lax.platform_dependent` (a `platform_index`'s
    `platforms`: one tuple of platform names per branch, None for the
    default) that XLA would run on the same kind of device ('cpu' on the
    CPU), else the default branch."""
    mine = ("cpu",) if on_cpu else ()
    default = None
    for i, names in enumerate(platforms):
        if names is None:
            default = i
        elif any(name in mine for name in names):
            return i
    if default is None:
        raise NotImplementedError(
            f"platform_dependent: no branch for {mine or 'this device'} among {platforms}"
        )
    return default

