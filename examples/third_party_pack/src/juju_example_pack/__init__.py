"""An example third-party juju pack.

`minmax(x, y)` returns `(minimum(x, y), maximum(x, y))`, computed by one Mojo
kernel with two outputs (`kernels/minmax.mojo`). The kernel library is built
and cached by `juju_kernels_mojo.build_kernel_library`, like juju's own.
"""

from pathlib import Path

import jax
import jax.numpy as jnp

import juju
from juju_kernels_mojo import build_kernel_library, call_kernel

__version__ = "0.1.0"

LIBRARY = "juju_example_pack"
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"

kernel_library = juju.KernelLibrary(
    LIBRARY, path=lambda: build_kernel_library(KERNEL_DIR, LIBRARY)
)
rules = juju.RuleSet()


def _minmax_abstract(x, y):
    if x.shape != y.shape or x.dtype != y.dtype:
        raise TypeError(f"minmax: operands differ: {x.str_short()} and {y.str_short()}")
    if not jnp.issubdtype(x.dtype, jnp.number):
        raise TypeError(f"kernel 'example_minmax' does not support dtype {x.dtype}")
    out = jax.core.ShapedArray(x.shape, x.dtype)
    return [out, out]


def lower_minmax(ctx, x, y):
    return call_kernel(ctx, "example_minmax", x, y)


def _minmax_jvp(primals, tangents):
    (x, y), (tx, ty) = primals, tangents
    x_is_low = x <= y
    return minmax(x, y), [jnp.where(x_is_low, tx, ty), jnp.where(x_is_low, ty, tx)]


minmax = juju.Primitive(
    "example_minmax",
    lower_minmax,
    _minmax_abstract,
    multiple_results=True,
    jvp_rule=_minmax_jvp,
    batching_rule="elementwise",
    jax_implementation=lambda x, y: [jnp.minimum(x, y), jnp.maximum(x, y)],
    kernel_library=LIBRARY,
    priority=juju.Priority.KERNEL,
    rules=rules,
)
