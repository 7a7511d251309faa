"""`juju.Primitive`: a new JAX primitive together with its MAX lowering."""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from juju import plugins
from juju._compat import JaxPrimitive, register_transformation_rules
from juju.hookspecs import hookimpl
from juju.registry import Priority, Rule, RuleSet

user_rules = RuleSet()


class _UserPack:
    """Rules of primitives defined in-process with `juju.Primitive`."""

    @staticmethod
    @hookimpl
    def juju_rules():
        return [user_rules]


def _takes_ctx(fn: Callable) -> bool:
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return False
    return first is not None and first.name == "ctx"


class Primitive:
    """A JAX primitive whose lowering to MAX is `max_lowering_rule`.

    Args:
        name: the primitive's name in Jaxprs.
        max_lowering_rule: builds the MAX value(s). Either
            `rule(ctx, *operands, **params)` (first parameter named `ctx`: a
            `juju.LoweringContext`) or, as in the original juju,
            `rule(*operands, **params)`.
        jax_abstract_evaluation_rule: `(*avals, **params) -> ShapedArray` (or a
            list of them with `multiple_results=True`).
        multiple_results: whether the primitive returns a list.
        jvp_rule, transpose_rule, batching_rule: optional JAX rules (see
            `jax.interpreters.ad` / `batching`) so grad and vmap work.
        jax_implementation: optional pure-JAX function with the primitive's
            semantics; when given, the primitive also runs under `jax.jit`.
        kernel_library: name of the `juju.KernelLibrary` the lowering needs.
        priority: the rule's priority (default `Priority.USER`).

    Calling the instance binds the primitive: `out = prim(x, y, param=1)`.
    Called outside any trace, it runs on MAX (via `juju.jit`) unless a
    `jax_implementation` is given.
    """

    def __init__(
        self,
        name: str,
        max_lowering_rule: Callable,
        jax_abstract_evaluation_rule: Callable,
        multiple_results: bool = False,
        *,
        jvp_rule: Callable | None = None,
        transpose_rule: Callable | None = None,
        batching_rule: Callable | None = None,
        jax_implementation: Callable | None = None,
        kernel_library: str | None = None,
        priority: int = Priority.USER,
    ):
        self.name = name
        self.multiple_results = multiple_results
        self.primitive = prim = JaxPrimitive(name)
        prim.multiple_results = multiple_results
        prim.def_abstract_eval(jax_abstract_evaluation_rule)
        if jax_implementation is not None:
            prim.def_impl(jax_implementation)
        else:
            prim.def_impl(self._run_on_max)
        register_transformation_rules(
            prim,
            jvp=jvp_rule,
            transpose=transpose_rule,
            batching=batching_rule,
            xla_implementation=jax_implementation,
            multiple_results=multiple_results,
        )
        if _takes_ctx(max_lowering_rule):
            fn = max_lowering_rule
        else:
            def fn(ctx, *operands, **params):
                return max_lowering_rule(*operands, **params)

            fn.__qualname__ = getattr(max_lowering_rule, "__qualname__", name)
        self.rule = user_rules.add(
            Rule(prim, fn, priority, requires=(kernel_library,) if kernel_library else ())
        )
        plugins.register_pack(_UserPack, "user")
        functools.update_wrapper(self, max_lowering_rule, assigned=("__doc__",))

    def __call__(self, *args, **params):
        return self.primitive.bind(*args, **params)

    def __repr__(self):
        return f"juju.Primitive({self.name!r})"

    def _run_on_max(self, *args, **params):
        return _eager_jit(self, tuple(sorted(params.items())))(*args)


@functools.lru_cache(maxsize=None)
def _eager_jit(prim: Primitive, params: tuple):
    from juju.jit import jit

    def apply(*args):
        return prim.primitive.bind(*args, **dict(params))

    apply.__name__ = prim.name
    return jit(apply, coerces_to_jnp=True)
