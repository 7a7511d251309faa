"""JAX's primitives by name, wherever the installed jax release keeps them:
the objects a pack registers its rules on.

    from juju import primitives as P

    rules.register(P.sin_p)(lower_sin)
    rules.register(P.split_p)(lower_split)   # not in jax's public list

Every `*_p` of `jax.extend.core.primitives` (jax's public list, e.g. `add_p`,
`while_p`, `jit_p`, `custom_jvp_call_p`) is here under the same name. So are
the primitives below, which jax binds in programs but keeps in private
modules; juju finds them in `juju._compat`, so that when a jax release moves
one, juju changes and packs do not:

- lax: `split_p`, `stack_p`, `unstack_p`, `tile_p`, `optimization_barrier_p`,
  `empty2_p` (in the derivative of `cond`), `custom_lin_p` (a
  `custom_vjp` under forward-mode differentiation), `platform_index_p`
  (`lax.platform_dependent`);
- linear algebra: `geqrf_p`, `lu_pivots_to_permutation_p`;
- PRNG key arrays: `random_wrap_p`, `random_unwrap_p`, `random_clone_p`,
  `iota_2x32_shape_p`;
- symbolic shapes: `dim_as_value_p`;
- host callbacks: `pure_callback_p`, `io_callback_p`, `debug_callback_p`,
  `debug_print_p` (juju runs them on the host, juju/host.py).

And what differs between the jax releases juju supports (0.10 to 0.12):

- `call_primitives`: a tuple of the call primitives (a sub-jaxpr applied to
  arguments): `closed_call_p` and `call_p` up to jax 0.10; from 0.11 both
  names alias one primitive, `eval_jaxpr`, listed once. Register a call rule
  on each.
- `log2_p`, `one_minus_square_p` (jax 0.11+) and `polynomial_p` (0.12+), and
  `debug_print_p` (jax 0.8+): `None` on a jax without them; register their
  rules only where they are not None.
"""

from __future__ import annotations

from jax.extend.core import primitives as _public

from juju._compat import (  # noqa: F401  (re-exported)
    call_primitives,
    custom_lin_p,
    debug_callback_p,
    debug_print_p,
    dim_as_value_p,
    empty2_p,
    geqrf_p,
    io_callback_p,
    iota_2x32_shape_p,
    log2_p,
    lu_pivots_to_permutation_p,
    one_minus_square_p,
    optimization_barrier_p,
    platform_index_p,
    polynomial_p,
    pure_callback_p,
    random_clone_p,
    random_unwrap_p,
    random_wrap_p,
    split_p,
    stack_p,
    tile_p,
    unstack_p,
)

OPTIONAL = frozenset({"log2_p", "one_minus_square_p", "polynomial_p", "debug_print_p"})
"""The primitives that may be None: a jax version without them (see above)."""

_OWN = [name for name in dir() if name.endswith("_p")]

__all__ = sorted({n for n in dir(_public) if n.endswith("_p")} | set(_OWN)) + [
    "call_primitives"]


def __getattr__(name: str):
    """The rest of jax's public list, `jax.extend.core.primitives`."""
    if name.endswith("_p"):
        try:
            return getattr(_public, name)
        except AttributeError:
            pass
    raise AttributeError(
        f"module 'juju.primitives' has no attribute {name!r}: neither juju nor this "
        "jax's jax.extend.core.primitives has a primitive by that name"
    )


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
