"""The one place where juju touches JAX beyond its stable public API.

Everything here uses `jax.extend`/`jax.core` where possible; the few private
imports are isolated so that a JAX upgrade breaks exactly one module.
"""

from __future__ import annotations

import numpy as np
import jax
from jax.core import ShapedArray, Tracer  # noqa: F401  (re-exported)
from jax.extend import core as jex_core
from jax.extend import source_info_util

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Var = jex_core.Var
JaxPrimitive = jex_core.Primitive
primitives = jex_core.primitives

# Not exported by jax.extend (JAX 0.10); only needed as a registry key.
from jax._src.lax.lax import optimization_barrier_p, split_p  # noqa: E402


def source_line(eqn) -> str:
    """The user's source line for an equation, e.g. 'model.py:12:4 (loss)'."""
    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # source info is best effort; never mask the real error
        return "<unknown source>"


def equation_text(eqn, limit: int = 300) -> str:
    """A one-line rendering of an equation, shortened for error messages."""
    text = " ".join(str(eqn).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sub_jaxprs_of_params(params) -> list:
    """Jaxprs (open) held in an equation's params: call bodies, branches, loops."""
    return list(jex_core.jaxprs_in_params(params))


def python_scalar_dtype(value) -> np.dtype:
    """The dtype `jax.jit` gives a Python scalar (weakly typed), honouring x64."""
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    if isinstance(value, int):
        return jax.dtypes.canonicalize_dtype(np.int64)
    if isinstance(value, float):
        return jax.dtypes.canonicalize_dtype(np.float64)
    if isinstance(value, complex):
        return jax.dtypes.canonicalize_dtype(np.complex128)
    raise TypeError(f"not a Python scalar: {type(value).__name__}")


def canonical_dtype(dtype) -> np.dtype:
    """The dtype jax.jit computes in for an input of `dtype` (x64 aware)."""
    return jax.dtypes.canonicalize_dtype(dtype)


def is_tracer(value) -> bool:
    return isinstance(value, Tracer)


def register_transformation_rules(primitive, *, jvp=None, transpose=None, batching=None,
                                  xla_implementation=None, multiple_results=False):
    """Attach JAX transformation rules (and an XLA lowering) to a primitive."""
    from jax.interpreters import ad, batching as batching_mod, mlir

    if jvp is not None:
        ad.primitive_jvps[primitive] = jvp
    if transpose is not None:
        ad.primitive_transposes[primitive] = transpose
    if batching is not None:
        batching_mod.primitive_batchers[primitive] = batching
    if xla_implementation is not None:
        mlir.register_lowering(
            primitive, mlir.lower_fun(xla_implementation, multiple_results=multiple_results)
        )


# --- control flow and juju_call (issue 4) --------------------------------------

# Emitted by the differentiation of `cond` (a placeholder residual).
from jax._src.lax.lax import empty2_p  # noqa: E402

# juju_call (juju/call.py): the pieces of JAX's AD and partial evaluation it
# reuses, as JAX's own `jit` does for its primitive.
from jax._src.core import jaxpr_as_fun  # noqa: E402
from jax._src.interpreters.ad import (  # noqa: E402
    Zero as ad_Zero,
    is_undefined_primal,
    jvp_jaxpr as ad_jvp_jaxpr,
)
from jax._src.interpreters.partial_eval import (  # noqa: E402
    convert_constvars_jaxpr,
    partial_eval_jaxpr_nounits,
)
