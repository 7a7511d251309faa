"""Helpers for writing rules."""

from __future__ import annotations

import functools

import jax

from juju._compat import key_data_aval


def lower_fun(fun, multiple_results: bool = False, *, extra_params=None):
    """Turn a JAX function into a rule: decomposition for free.

    `lower_fun(f)` returns `rule(ctx, *operands, **params)` that traces
    `f(*operands, **params)` on the equation's input avals and lowers the
    resulting Jaxpr through the interpreter. `f` must not emit the primitive
    being lowered (that would recurse forever). `extra_params(ctx)` may add
    keyword arguments computed from the avals (e.g. a key array's PRNG impl).
    Key arrays reach `f` as their raw key data.

    The rule's `decomposition(ctx)` gives the traced Jaxpr without lowering
    it: the interpreter's pre-pass looks inside, so missing rules and kernel
    libraries needed by the decomposition are found before any graph is built.
    """

    def params_for(ctx, params):
        return {**params, **extra_params(ctx)} if extra_params is not None else params

    def decomposition(ctx):
        return _trace(fun, tuple(ctx.avals_in), _freeze(params_for(ctx, ctx.params)))

    def lower_via_jax(ctx, *operands, **params):
        closed = _trace(fun, tuple(ctx.avals_in), _freeze(params_for(ctx, params)))
        outs = ctx.lower(closed, *operands)
        return outs if multiple_results else outs[0]

    lower_via_jax.__qualname__ = f"lower_fun({getattr(fun, '__qualname__', fun)})"
    lower_via_jax.decomposition = decomposition
    return lower_via_jax


def _freeze(params: dict):
    try:
        items = tuple(sorted(params.items()))
        hash(items)
        return items
    except TypeError:
        return _Unhashable(params)


class _Unhashable:
    def __init__(self, params):
        self.params = params

    def items(self):
        return self.params.items()


@functools.lru_cache(maxsize=4096)
def _trace_cached(fun, avals, params):
    return _trace_uncached(fun, avals, params)


def _trace(fun, avals, params):
    if isinstance(params, _Unhashable):
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
