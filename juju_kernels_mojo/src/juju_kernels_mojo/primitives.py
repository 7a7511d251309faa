"""New primitives backed by this pack's kernels, defined with `juju.Primitive`.

Each also has a pure-JAX implementation (so it runs under `jax.jit`), a JVP
and vmap support.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from max.graph import ops

import juju
from juju_kernels_mojo import LIBRARY
from juju_kernels_mojo.lowering import call_kernel

rules = juju.RuleSet()


def _elementwise_abstract(kernel: str, kinds: tuple):
    """Abstract evaluation: operands of one shape and dtype, of a kind the
    kernel supports; the result is like the first operand."""

    def abstract_eval(x, *others):
        if not any(jnp.issubdtype(x.dtype, kind) for kind in kinds):
            raise TypeError(f"kernel '{kernel}' does not support dtype {x.dtype}")
        for o in others:
            if o.shape != x.shape or o.dtype != x.dtype:
                raise TypeError(
                    f"kernel '{kernel}': operands must have equal shapes and dtypes, "
                    f"got {x.str_short()} and {o.str_short()}"
                )
        return jax.core.ShapedArray(x.shape, x.dtype)

    return abstract_eval


NUMERIC = (jnp.integer, jnp.floating)
FLOATING = (jnp.floating,)


# --- add_one ------------------------------------------------------------------


def lower_add_one(ctx, x):
    (out,) = call_kernel(ctx, "add_one", x)
    return out


add_one = juju.Primitive(
    "add_one",
    lower_add_one,
    _elementwise_abstract("add_one", NUMERIC),
    jvp_rule=lambda primals, tangents: (add_one(*primals), tangents[0]),
    batching_rule="elementwise",
    jax_implementation=lambda x: x + jnp.ones((), x.dtype),
    kernel_library=LIBRARY,
    priority=juju.Priority.KERNEL,
    rules=rules,
)
add_one.__doc__ = "x + 1 with the `add_one` Mojo kernel."


# --- fma ----------------------------------------------------------------------


def lower_fma(ctx, x, y, z):
    (out,) = call_kernel(ctx, "juju_fma", x, y, z)
    return out


def _fma_jvp(primals, tangents):
    x, y, z = primals
    tx, ty, tz = tangents
    return fma(x, y, z), tx * y + x * ty + tz


fma = juju.Primitive(
    "fma",
    lower_fma,
    _elementwise_abstract("juju_fma", NUMERIC),
    jvp_rule=_fma_jvp,
    batching_rule="elementwise",
    jax_implementation=lambda x, y, z: x * y + z,
    kernel_library=LIBRARY,
    priority=juju.Priority.KERNEL,
    rules=rules,
)
fma.__doc__ = "x * y + z in one fused Mojo kernel (operands of equal shape and dtype)."


# --- row_logsumexp ------------------------------------------------------------


def _row_logsumexp_abstract(x):
    _elementwise_abstract("juju_row_logsumexp", FLOATING)(x)
    if x.ndim == 0:
        raise TypeError("row_logsumexp needs an operand of rank >= 1")
    return jax.core.ShapedArray(x.shape[:-1], x.dtype)


def lower_row_logsumexp(ctx, x):
    (aval,) = ctx.avals_in
    rows = math.prod(aval.shape[:-1])
    x2 = ops.reshape(x, (rows, aval.shape[-1]))
    flat = jax.ShapeDtypeStruct((rows,), aval.dtype)
    (out,) = call_kernel(ctx, "juju_row_logsumexp", x2, out_avals=[flat])
    return ops.reshape(out, tuple(ctx.aval_out.shape))


def _row_logsumexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    out = row_logsumexp(x)
    return out, jnp.sum(jnp.exp(x - out[..., None]) * t, axis=-1)


row_logsumexp = juju.Primitive(
    "row_logsumexp",
    lower_row_logsumexp,
    _row_logsumexp_abstract,
    jvp_rule=_row_logsumexp_jvp,
    batching_rule="elementwise",
    jax_implementation=lambda x: jax.nn.logsumexp(x, axis=-1),
    kernel_library=LIBRARY,
    priority=juju.Priority.KERNEL,
    rules=rules,
)
row_logsumexp.__doc__ = "log(sum(exp(x), axis=-1)), numerically stable, one pass per row."
