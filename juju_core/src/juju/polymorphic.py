"""`polymorphic_shapes`: the symbolic shapes of a call's arguments.

`juju.jit(f, polymorphic_shapes=...)` compiles one MAX graph with symbolic
dimensions for the calls that differ only in the named dimensions; this
reads a call's arguments into those shapes, with jax.export's parser, and
checks that the call agrees with them.
"""

from __future__ import annotations

import jax
from jax import tree_util

from juju.arguments import leaf_signature
from juju.dtypes import is_symbolic_dim


def symbolic_shapes(fn, dyn_args, signature) -> list:
    """Each leaf's shape with the dimensions `polymorphic_shapes` names made
    symbolic (`jax.export.symbolic_args_specs`); checks the call agrees."""
    try:
        specs = tree_util.tree_leaves(
            jax.export.symbolic_args_specs(_arg_specs(dyn_args), fn.polymorphic_shapes))
    except Exception as exc:  # JAX's parse and shape checks
        raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes="
                         f"{fn.polymorphic_shapes!r} does not fit the arguments: {exc}") from exc
    shapes = [s.shape for s in specs] + [s for s, _, _ in signature[len(specs):]]
    bound: dict[str, int] = {}
    for shape, (concrete, _, _) in zip(shapes, signature):
        if len(shape) != len(concrete):
            raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes gives rank "
                             f"{len(shape)} for an argument of shape {concrete}")
        for d, n in zip(shape, concrete):
            if not is_symbolic_dim(d):  # constants: checked by jax.export above
                continue
            name = str(d)
            if d.get_vars() != {name}:
                raise ValueError(f"juju.jit({fn.__name__}): polymorphic_shapes: use plain "
                                 f"dimension names, not '{d}'")
            if bound.setdefault(name, n) != n:
                raise ValueError(f"juju.jit({fn.__name__}): dimension '{name}' is "
                                 f"{bound[name]} in one argument and {n} in another")
    return shapes


def _arg_specs(dyn_args):
    return tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(*leaf_signature(x)[:2]), dyn_args)
