"""`juju.Primitive`: a new JAX primitive together with its MAX lowering.

    add_one = juju.Primitive("add_one", add_one_lowering, add_one_abstract,
                             kernel_library="juju_kernels_mojo")

A primitive is traced by JAX like any `lax` primitive (its abstract
evaluation rule gives output shapes and dtypes) and lowered by juju's
interpreter with `max_lowering_rule`, usually an `ops.custom` call into a Mojo
kernel. Optional rules make `jax.grad`, `jax.vmap` and `jax.jit` work over it.
See docs/kernels.md.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Iterable

import jax.numpy as jnp
from jax.extend import source_info_util
from jax.interpreters import ad

from juju import plugins
from juju._compat import JaxPrimitive, ShapedArray, register_transformation_rules
from juju.hookspecs import hookimpl
from juju.plugins import KernelLibrary
from juju.registry import Priority, Rule, RuleSet

# Errors and jaxprs should point at the user's call, not at Primitive.__call__.
source_info_util.register_exclusion(__file__)

user_rules = RuleSet()
_user_libraries: dict[str, KernelLibrary] = {}


class _UserPack:
    """Rules (and kernel libraries) of primitives defined with `juju.Primitive`."""

    @staticmethod
    @hookimpl
    def juju_rules():
        return [user_rules]

    @staticmethod
    @hookimpl
    def juju_kernel_libraries():
        return list(_user_libraries.values())


def _takes_ctx(fn: Callable) -> bool:
    try:
        first = next(iter(inspect.signature(fn).parameters.values()), None)
    except (TypeError, ValueError):
        return False
    return first is not None and first.name == "ctx"


def _as_aval(value):
    """Accept ShapedArray, jax.ShapeDtypeStruct or anything with shape/dtype."""
    if isinstance(value, ShapedArray):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return ShapedArray(tuple(value.shape), value.dtype)
    raise TypeError(
        f"an abstract evaluation rule must return ShapedArray(shape, dtype) values, "
        f"got {type(value).__name__}"
    )


class Primitive:
    """A JAX primitive whose lowering to MAX is `max_lowering_rule`.

    Args:
        name: the primitive's name in Jaxprs.
        max_lowering_rule: builds the MAX value(s). Either
            `rule(ctx, *operands, **params)` (first parameter named `ctx`: a
            `juju.LoweringContext`, whose `device`, `avals_out` help build
            `ops.custom` calls) or, as in the original juju,
            `rule(*operands, **params)` (operands are `TensorValue`s; use
            `x.device` for the device `ops.custom` needs in MAX 26.7).
        jax_abstract_evaluation_rule: `(*avals, **params) -> ShapedArray` (a
            `jax.ShapeDtypeStruct` also works), or a list of them when
            `multiple_results=True`.
        multiple_results: whether the primitive returns a list of arrays
            (then the lowering rule returns a list of values too).
        jvp_rule: `jvp(primals, tangents, **params) -> (primals_out,
            tangents_out)` as for `jax.interpreters.ad.primitive_jvps`;
            symbolic-zero tangents arrive as zero arrays. Makes `jax.jvp` and,
            when the tangent computation uses differentiable JAX ops (or this
            primitive has a `transpose_rule`), `jax.grad` work.
        transpose_rule: `transpose(cotangents, *operands, **params)` as for
            `ad.primitive_transposes`, for primitives linear in some operands.
        batching_rule: `batch(args, dims, **params) -> (out, out_dims)` as for
            `jax.interpreters.batching.primitive_batchers`, or the string
            `"elementwise"` for a primitive whose operands all have the
            output's leading axes and which treats those axes independently
            (elementwise ops, reductions over the last axis): vmap then moves
            the batch axis of every operand to the front.
        jax_implementation: pure-JAX function with the primitive's semantics;
            when given, the primitive also runs under `jax.jit` (and eagerly,
            op by op, in JAX).
        kernel_library: the kernel library (or libraries) the lowering needs
            in its graph: a library name provided by a pack (e.g.
            `"juju_kernels_mojo"`) or a `juju.KernelLibrary`, which this
            primitive then provides itself.
        priority: the rule's priority (default `Priority.USER`).
        dtypes: the dtypes the lowering accepts (`juju.Rule`): by default every
            dtype MAX has; list complex dtypes (or pass `juju.ALL_DTYPES`) to
            receive complex operands, as float[..., 2] (real, imaginary).
        rules: a pack's `RuleSet` to add the rule to (the pack returns it from
            its `juju_rules` hook). By default the rule goes to juju's
            in-process "user" pack and is visible at once.

    Calling the instance binds the primitive: `out = prim(x, y, param=1)`.
    Called outside any trace, it runs through `juju.jit` on MAX unless a
    `jax_implementation` is given.
    
    Attributes:
        name: the primitive's name.
        multiple_results: as given.
        jax_implementation: as given.
        primitive: the underlying JAX primitive (`jax.extend.core.Primitive`).
        kernel_libraries: the names of the kernel libraries its rule needs.
        rule: the `juju.Rule` that lowers it.

    Raises:
        ValueError: `batching_rule` is a string other than `"elementwise"`.
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
        batching_rule: Callable | str | None = None,
        jax_implementation: Callable | None = None,
        kernel_library: str | KernelLibrary | Iterable | None = None,
        priority: int = Priority.USER,
        dtypes=None,
        rules: RuleSet | None = None,
    ):
        self.name = name
        self.multiple_results = multiple_results
        self.jax_implementation = jax_implementation
        self.primitive = prim = JaxPrimitive(name)
        prim.multiple_results = multiple_results
        prim.def_abstract_eval(self._abstract_eval_wrapper(jax_abstract_evaluation_rule))
        prim.def_impl(jax_implementation if jax_implementation is not None else self._run_on_max)
        if batching_rule == "elementwise":
            batching_rule = functools.partial(_batch_elementwise, self)
        elif isinstance(batching_rule, str):
            raise ValueError(f"unknown batching_rule {batching_rule!r}; use 'elementwise'")
        register_transformation_rules(
            prim,
            jvp=_with_zeros_instantiated(jvp_rule) if jvp_rule is not None else None,
            transpose=transpose_rule,
            batching=batching_rule,
            xla_implementation=jax_implementation or _no_jax_implementation(name),
            multiple_results=multiple_results,
        )
        self.kernel_libraries = self._library_names(kernel_library)
        self.rule = Rule(
            prim,
            self._lowering_wrapper(max_lowering_rule),
            priority,
            requires=self.kernel_libraries,
            dtypes=dtypes,
        )
        if rules is not None:
            rules.add(self.rule)
        else:
            user_rules.add(self.rule)
            plugins.register_pack(_UserPack, "user")  # the registry picks it up
        functools.update_wrapper(self, max_lowering_rule, assigned=("__doc__",))

    def __call__(self, *args, **params):
        return self.primitive.bind(*args, **params)

    def __repr__(self):
        return f"juju.Primitive({self.name!r})"

    # --- helpers --------------------------------------------------------------

    def _abstract_eval_wrapper(self, rule):
        multiple = self.multiple_results

        @functools.wraps(rule)
        def abstract_eval(*avals, **params):
            out = rule(*avals, **params)
            if multiple:
                return [_as_aval(o) for o in out]
            return _as_aval(out)

        return abstract_eval

    def _lowering_wrapper(self, rule):
        takes_ctx = _takes_ctx(rule)
        libraries = self.kernel_libraries
        prim_name = self.name

        def lower(ctx, *operands, **params):
            try:
                if takes_ctx:
                    return rule(ctx, *operands, **params)
                return rule(*operands, **params)
            except ValueError as exc:
                if "no kernel registered" not in str(exc):
                    raise
                # MAX checks ops.custom against the graph's kernel libraries.
                raise ValueError(
                    f"{exc}: the graph has the kernel libraries of "
                    f"juju.Primitive({prim_name!r}): {list(libraries) or 'none'}; pass "
                    "kernel_library=<the library that defines the kernel>"
                ) from exc

        lower.__qualname__ = getattr(rule, "__qualname__", prim_name)
        lower.__name__ = getattr(rule, "__name__", prim_name)
        return lower

    @staticmethod
    def _library_names(kernel_library) -> tuple[str, ...]:
        if kernel_library is None:
            return ()
        if isinstance(kernel_library, (str, KernelLibrary)):
            kernel_library = [kernel_library]
        names = []
        for lib in kernel_library:
            if isinstance(lib, KernelLibrary):
                if _user_libraries.get(lib.name) is not lib:
                    _user_libraries[lib.name] = lib
                    plugins.register_pack(_UserPack, "user")
                names.append(lib.name)
            elif isinstance(lib, str):
                names.append(lib)
            else:
                raise TypeError(
                    f"kernel_library must be a library name or a juju.KernelLibrary, "
                    f"got {type(lib).__name__}"
                )
        return tuple(names)

    def _run_on_max(self, *args, **params):
        return _eager_jit(self, tuple(sorted(params.items())))(*args)


@functools.lru_cache(maxsize=None)
def _eager_jit(prim: Primitive, params: tuple):
    from juju.jit import jit

    def apply(*args):
        return prim.primitive.bind(*args, **dict(params))

    apply.__name__ = prim.name
    return jit(apply, coerces_to_jnp=True)


def _no_jax_implementation(name: str) -> Callable:
    """Under jax.jit, say what is missing instead of JAX's generic error."""

    def unavailable(*args, **params):
        raise NotImplementedError(
            f"juju.Primitive({name!r}) has no jax_implementation, so it runs only "
            "under juju.jit; pass jax_implementation=... to run it under jax.jit too"
        )

    return unavailable


def _with_zeros_instantiated(jvp: Callable) -> Callable:
    """A JVP rule that sees zero arrays instead of JAX's symbolic zeros."""

    @functools.wraps(jvp)
    def jvp_rule(primals, tangents, **params):
        tangents = [
            ad.instantiate_zeros(t) if type(t) is ad.Zero else t for t in tangents
        ]
        return jvp(primals, tangents, **params)

    return jvp_rule


def _batch_elementwise(prim: Primitive, args, dims, **params):
    """vmap for primitives that act independently on their operands' leading
    axes: move every batch axis to the front, broadcasting unbatched operands."""
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    moved = []
    for a, d in zip(args, dims):
        if d is None:
            moved.append(jnp.broadcast_to(a, (size, *a.shape)))
        else:
            moved.append(jnp.moveaxis(a, d, 0))
    out = prim.primitive.bind(*moved, **params)
    if prim.multiple_results:
        return out, [0] * len(out)
    return out, 0


__all__ = ["Primitive"]
