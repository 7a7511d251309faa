"""juju.Primitive: the original docs' example, multiple results, jvp /
transpose / batching rules under juju.jit, a jax implementation under jax.jit,
user kernel libraries and errors. Graphs compile in ONE MAX compilation."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.core import ShapedArray
from max.graph import TensorType, ops

import juju
from juju import primitive as primitive_module
from juju_kernels_mojo import build_kernel_library
from tests.util import assert_same

# --- the original juju docs' example (MAX 26.7: ops.custom and TensorType
# need a device, and the primitive names the kernel library it uses) ----------


def add_one_lowering(x, **params):
    return ops.custom(
        name="add_one",  # needs to match your @register name
        device=x.device,
        values=[x],
        out_types=[TensorType(dtype=x.dtype, shape=x.tensor.shape, device=x.device)],
    )[0]


def add_one_abstract(x, **params):
    return ShapedArray(x.shape, x.dtype)


add_one = juju.Primitive(
    "docs_add_one", add_one_lowering, add_one_abstract, kernel_library="juju_kernels_mojo"
)


@juju.jit
def jaxable_program(x):
    x = x * 2
    return add_one(x)


# --- multiple results, lowered with MAX ops (no kernel) -----------------------


def lower_sincos(ctx, x):
    return [ops.sin(x), ops.cos(x)]


sincos = juju.Primitive(
    "sincos",
    lower_sincos,
    lambda x: [ShapedArray(x.shape, x.dtype)] * 2,
    multiple_results=True,
    jax_implementation=lambda x: [jnp.sin(x), jnp.cos(x)],
    jvp_rule=lambda p, t: (sincos(*p), [jnp.cos(p[0]) * t[0], -jnp.sin(p[0]) * t[0]]),
    batching_rule="elementwise",
)

# A primitive without a jax implementation runs eagerly through juju.jit.
sincos_max_only = juju.Primitive(
    "sincos_max_only", lower_sincos, lambda x: (jax.ShapeDtypeStruct(x.shape, x.dtype),) * 2,
    multiple_results=True,
)

# --- a linear primitive: jvp in terms of itself, so grad needs its transpose --


def lower_scale(ctx, x, *, factor):
    return ops.mul(x, ctx.constant(factor, ctx.avals_in[0].dtype))


scale = juju.Primitive(
    "scale",
    lower_scale,
    lambda x, *, factor: ShapedArray(x.shape, x.dtype),
    jvp_rule=lambda p, t, *, factor: (scale(p[0], factor=factor), scale(t[0], factor=factor)),
    transpose_rule=lambda ct, x, *, factor: [scale(ct, factor=factor)],
    jax_implementation=lambda x, *, factor: x * factor,
)

# --- jvp with symbolic zeros, and a hand-written batching rule ----------------


def lower_mul_add(ctx, x, y, z):
    return ops.add(ops.mul(x, y), z)


mul_add = juju.Primitive(
    "mul_add",
    lower_mul_add,
    lambda x, y, z: ShapedArray(x.shape, x.dtype),
    jvp_rule=lambda p, t: (mul_add(*p), t[0] * p[1] + p[0] * t[1] + t[2]),
    batching_rule="elementwise",
    jax_implementation=lambda x, y, z: x * y + z,
)


def lower_row_sum(ctx, x):
    return ops.reshape(ops.sum(x, axis=-1), tuple(ctx.aval_out.shape))


def batch_row_sum(args, dims):
    (x,), (d,) = args, dims
    if d == x.ndim - 1:  # the batch axis is the reduced one: move it away
        x, d = jnp.moveaxis(x, d, 0), 0
    return row_sum(x), d


row_sum = juju.Primitive(
    "row_sum",
    lower_row_sum,
    lambda x: ShapedArray(x.shape[:-1], x.dtype),
    batching_rule=batch_row_sum,
    jax_implementation=lambda x: jnp.sum(x, axis=-1),
)

# --- a user kernel library given as a juju.KernelLibrary ----------------------

NEGATE_KERNEL = '''
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord


@register("test_negate")
struct TestNegate:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        def func[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            return -x.load[width](idx)

        foreach[target=target](func, output, ctx)
'''
_src = Path(tempfile.mkdtemp(prefix="juju-test-kernels-")) / "test_negate_kernels"
_src.mkdir()
(_src / "__init__.mojo").write_text("")
(_src / "negate.mojo").write_text(NEGATE_KERNEL)
negate_library = juju.KernelLibrary(
    "test_negate_kernels", path=lambda: build_kernel_library(_src, "test_negate_kernels")
)


def lower_negate(ctx, x):
    out = TensorType(x.dtype, x.shape, device=ctx.device)
    return ops.custom("test_negate", ctx.device, [x], [out])[0]


negate = juju.Primitive(
    "test_negate", lower_negate, lambda x: ShapedArray(x.shape, x.dtype),
    kernel_library=negate_library,
)

# --- the functions compiled together -------------------------------------------

X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
Y = np.arange(12, dtype=np.float32).reshape(3, 4) / 7


def multiple_results(x):
    s, c = sincos(x)
    return s * s + c * c, s, c


def grad_through_transpose(x):
    return jax.grad(lambda x: jnp.sum(scale(x, factor=3.0) * jnp.sin(x)))(x)


def grad_with_zero_tangents(x, y):
    return jax.grad(lambda x: jnp.sum(mul_add(x, y, y) ** 2))(x)


def vmaps(x, y):
    return (
        jax.vmap(mul_add, in_axes=(0, None, 1))(x, y[0], y.T),
        jax.vmap(row_sum, in_axes=1)(x),
        jax.vmap(row_sum)(x),
        jax.vmap(sincos, in_axes=1)(x),
        jax.vmap(jax.grad(lambda v: jnp.sum(sincos(v)[0])))(x),
    )


def user_kernel(x):
    return negate(x) + 1


FUNCTIONS = {
    "multiple_results": multiple_results,
    "grad_through_transpose": grad_through_transpose,
    "grad_with_zero_tangents": grad_with_zero_tangents,
    "vmaps": vmaps,
    "user_kernel": user_kernel,
}
ARGS = {
    "multiple_results": (X,),
    "grad_through_transpose": (X,),
    "grad_with_zero_tangents": (X, Y),
    "vmaps": (X, Y),
    "user_kernel": (X,),
}


def all_cases(args):
    """Every case in one function: one graph for MAX to compile."""
    return {name: FUNCTIONS[name](*args[name]) for name in FUNCTIONS}


all_cases_jit = juju.jit(all_cases)
EAGER_MAX = primitive_module._eager_jit(sincos_max_only, ())


@pytest.fixture(scope="module")
def results():
    juju.compile_all(
        [jaxable_program.lower(jnp.ones(10)), all_cases_jit.lower(ARGS), EAGER_MAX.lower(X)]
    )
    return all_cases_jit(ARGS)


def test_original_docs_example(results):
    out = jaxable_program(jnp.ones(10))
    np.testing.assert_array_equal(out.to_numpy(), np.full(10, 3.0, np.float32))
    low = jaxable_program.lower(jnp.ones(10))
    assert low.kernel_names == {"juju_kernels_mojo"}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_matches_jax(results, name):
    args = ARGS[name]
    want = jax.jit(FUNCTIONS[name])(*args) if name != "user_kernel" else -args[0] + 1
    assert_same(results[name], want)


def test_rules_are_user_rules_with_provenance():
    rule = juju.plugins.registry().rules_for(sincos.primitive)[0]
    assert rule.pack == "user" and rule.priority == juju.Priority.USER
    assert rule.name == "lower_sincos"
    assert negate.rule.requires == ("test_negate_kernels",)
    assert juju.plugins.kernel_library("test_negate_kernels") is negate_library


def test_rules_can_go_to_a_pack_rule_set():
    rules = juju.RuleSet()
    prim = juju.Primitive(
        "packed", lower_scale, lambda x, *, factor: ShapedArray(x.shape, x.dtype),
        rules=rules, priority=juju.Priority.KERNEL, kernel_library="juju_kernels_mojo",
    )
    (rule,) = list(rules)
    assert rule is prim.rule and rule.priority == juju.Priority.KERNEL
    assert rule.requires == ("juju_kernels_mojo",)
    assert not juju.plugins.registry().rules_for(prim.primitive)  # only via the pack


def test_eager_calls(results):
    # with a jax implementation: runs in JAX
    s, c = sincos(jnp.asarray(X))
    np.testing.assert_allclose(s, np.sin(X), rtol=1e-6)
    # without: runs on MAX through juju.jit (compiled in the fixture)
    s, c = sincos_max_only(X)
    assert isinstance(s, jax.Array)
    np.testing.assert_allclose(c, np.cos(X), rtol=1e-5, atol=1e-6)
    assert EAGER_MAX.compile_count == 1


def test_jax_jit_uses_the_jax_implementation():
    assert_same(jax.jit(multiple_results)(X), multiple_results(X))


def test_jax_jit_without_jax_implementation_says_what_is_missing():
    with pytest.raises(NotImplementedError, match="sincos_max_only.*jax_implementation"):
        jax.jit(sincos_max_only)(X)


def test_abstract_evaluation_errors_surface_at_trace_time():
    def bad_abstract(x):
        return "not an aval"

    bad = juju.Primitive("bad_abstract", lower_scale, bad_abstract)
    with pytest.raises(TypeError, match="ShapedArray"):
        jax.make_jaxpr(bad)(X)


def test_missing_kernel_library_names_the_fix():
    no_library = juju.Primitive("docs_add_one_no_library", add_one_lowering, add_one_abstract)
    with pytest.raises(juju.LoweringError, match="docs_add_one_no_library") as info:
        juju.jit(lambda x: no_library(x) * 2).lower(X).build_graph()
    assert "kernel_library=" in str(info.value.__cause__)
    assert "test_primitive.py" in str(info.value)  # the user's line, not primitive.py


def test_kernel_compile_error_names_kernel_and_dtype():
    # The docs lowering bypasses the pack's dtype check: MAX's compiler rejects
    # bool in add_one's `comptime assert`, and juju shows that reason.
    with pytest.raises(juju.CompileError, match=r"add_one: unsupported dtype bool"):
        juju.jit(add_one)(np.array([True, False]))
