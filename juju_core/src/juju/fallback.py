"""The lowest-priority rule: a primitive that no pack lowers, lowered by
tracing its JAX implementation into the same graph.

Most library primitives (Equinox's, jax.scipy's linalg helpers) and many
newer JAX ones are lowered for XLA by `mlir.lower_fun(impl)`: XLA traces
`impl`, a function of other primitives. juju traces the same `impl` with the
equation's params on the equation's avals and lowers the resulting Jaxpr
through the interpreter, so the pieces go through their own rules. It is
structural (no numeric rule of its own), so it lives in the core and
registers through `juju_rules` like any pack, at `Priority.FALLBACK`.
"""

from __future__ import annotations

import functools

import jax

from juju._compat import jax_implementation, sub_jaxprs_of_params
from juju.lowering_helpers import freeze_params, UnhashableParams
from juju.registry import ALL_DTYPES, ANY_PRIMITIVE, Priority, RuleSet

# The traced implementation sees the equation's own avals, whatever the dtype.
rules = RuleSet(dtypes=ALL_DTYPES)


def traced(ctx):
    """(closed Jaxpr of the implementation on ctx's avals and params, None)
    or (None, why it cannot be traced)."""
    return _trace(ctx.primitive, _device_kind(ctx.device), tuple(ctx.avals_in),
                  freeze_params(ctx.params))


def why_not(eqn) -> str | None:
    """Why the fallback cannot lower `eqn`, or None when it can."""
    avals = tuple(v.aval for v in eqn.invars)
    return _trace(eqn.primitive, "cpu", avals, freeze_params(eqn.params))[1]


def _device_kind(device):
    return "cpu" if device is None or device.is_cpu() else "gpu"


def _trace(primitive, device_kind, avals, params):
    if isinstance(params, UnhashableParams):
        return _trace_uncached(primitive, device_kind, avals, params)
    return _trace_cached(primitive, device_kind, avals, params)


@functools.lru_cache(maxsize=1024)
def _trace_cached(primitive, device_kind, avals, params):
    return _trace_uncached(primitive, device_kind, avals, params)


def _trace_uncached(primitive, device_kind, avals, params):
    found = jax_implementation(primitive, "cpu" if device_kind == "cpu" else "cuda")
    if found is None:
        return None, (
            "JAX lowers it to StableHLO directly (no traceable JAX implementation "
            "to fall back on)"
        )
    fun, _ = found
    kwargs = dict(params.items() if isinstance(params, UnhashableParams) else params)
    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in avals]
    try:
        closed = jax.make_jaxpr(lambda *xs: fun(*xs, **kwargs))(*structs)
    except Exception as exc:  # not traceable here: the primitive stays missing
        return None, f"its JAX implementation failed to trace: {type(exc).__name__}: {exc}"
    if _binds(closed.jaxpr, primitive):  # lowering it would recurse forever
        return None, "its JAX implementation binds the primitive itself"
    return closed, None


def _binds(jaxpr, primitive) -> bool:
    return any(
        eqn.primitive is primitive
        or any(_binds(sub, primitive) for sub in sub_jaxprs_of_params(eqn.params))
        for eqn in jaxpr.eqns
    )


def implementation(primitive, avals, params):
    """The closed Jaxpr of `primitive`'s JAX implementation (CPU) on `avals`
    and `params`, or None where it has none that traces. For rules that
    write a whole sub-program themselves (generated loop kernels)."""
    return _trace(primitive, "cpu", tuple(avals), freeze_params(params))[0]


def has_jax_implementation(ctx) -> bool:
    """Guard: the primitive's JAX implementation traces on this equation."""
    return traced(ctx)[0] is not None


@rules.register(ANY_PRIMITIVE, priority=Priority.FALLBACK, guard=has_jax_implementation)
def lower_via_jax_implementation(ctx, *operands, **params):
    closed, why = traced(ctx)
    if closed is None:
        raise NotImplementedError(f"{ctx.primitive.name}: {why}")
    outs = ctx.lower(closed, *operands)
    return outs if ctx.primitive.multiple_results else outs[0]


def _decomposition(ctx):
    closed, why = traced(ctx)
    if closed is None:
        raise NotImplementedError(f"{ctx.primitive.name}: {why}")
    return closed


# The interpreter's pre-pass looks inside: gaps within the implementation are
# reported with the others, before any graph is built.
lower_via_jax_implementation.decomposition = _decomposition
