"""The core's built-in structural rules, registered through `juju_rules` like
any pack: calls that wrap a sub-jaxpr and identities that only matter to JAX's
transformations or to multi-device placement, and the fallback that traces a
primitive's own JAX implementation (juju/fallback.py). No numeric rules live here.
"""

from __future__ import annotations

from juju._compat import call_primitives, optimization_barrier_p, primitives as P
from juju.hookspecs import hookimpl
from juju.registry import ALL_DTYPES, RuleSet

# Calls and identities pass values of any dtype on in their in-graph form.
rules = RuleSet(dtypes=ALL_DTYPES)


@rules.register(P.jit_p)
def lower_jit(ctx, *args, jaxpr, name, inline, keep_unused, donated_invars,
              in_shardings, out_shardings, in_layouts, out_layouts, ctx_mesh,
              compiler_options_kvs):
    # Shardings, layouts and donation describe placement on a single device
    # here; they do not change values.
    return ctx.lower(jaxpr, *args)


def lower_call(ctx, *args, call_jaxpr, **_call_params):
    return ctx.lower(call_jaxpr, *args)


for _prim in call_primitives:
    rules.register(_prim)(lower_call)


@rules.register(P.custom_jvp_call_p)
def lower_custom_jvp_call(ctx, *args, call_jaxpr, jvp_jaxpr_fun, num_consts, symbolic_zeros):
    # The custom derivative only matters to jax.jvp/grad, which ran before us.
    return ctx.lower(call_jaxpr, *args)


@rules.register(P.custom_vjp_call_p)
def lower_custom_vjp_call(ctx, *args, call_jaxpr, fwd_jaxpr_thunk, bwd, num_consts,
                          out_trees, symbolic_zeros):
    return ctx.lower(call_jaxpr, *args)


@rules.register(P.remat_p)
def lower_remat(ctx, *args, jaxpr, prevent_cse, differentiated, policy):
    # Rematerialisation is a memory/recompute trade-off for XLA's scheduler;
    # MAX schedules the graph itself, so the body is lowered as is.
    return ctx.lower(jaxpr, *args)


def lower_identity(ctx, x, **_placement_params):
    return x


def lower_identities(ctx, *xs, **_placement_params):
    return list(xs)


for _prim in (P.stop_gradient_p, P.copy_p, P.sharding_constraint_p):
    rules.register(_prim)(lower_identity)
for _prim in (P.device_put_p, optimization_barrier_p):
    rules.register(_prim)(lower_identities)


@hookimpl
def juju_rules():
    from juju import fallback  # any primitive with a traceable JAX implementation

    return [rules, fallback.rules]
