"""conv_general_dilated against jax.jit: layouts, 1/2/3-D, strides, padding,
dilations, groups, dtypes and gradients. All cases compile in one go."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.nn_cases import Case, run_cases
from tests.util import selected

rng = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return rng.normal(size=shape).astype(dtype)


def conv(dn, strides=None, padding="VALID", lhs_dilation=None, rhs_dilation=None,
         fgc=1, bgc=1, pet=None):
    def f(x, w):
        nd = len(dn[0]) - 2
        return lax.conv_general_dilated(
            x, w, strides or (1,) * nd, padding, lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation, dimension_numbers=dn, feature_group_count=fgc,
            batch_group_count=bgc, preferred_element_type=pet,
        )
    return f


def _ints(*shape, dtype=np.int8):
    info = np.iinfo(dtype)
    return np.random.default_rng(sum(shape)).integers(info.min, info.max, shape, dtype, endpoint=True)


NCHW = ("NCHW", "OIHW", "NCHW")
NHWC = ("NHWC", "HWIO", "NHWC")

CASES = [
    Case("nchw_valid", conv(NCHW), (rand(2, 3, 8, 8), rand(4, 3, 3, 3))),
    Case("nhwc_same_stride2", conv(NHWC, (2, 2), "SAME"), (rand(2, 9, 9, 3), rand(3, 3, 3, 5))),
    Case("nhwc_explicit_pad", conv(NHWC, (1, 2), ((1, 2), (0, 3))), (rand(1, 7, 6, 2), rand(2, 3, 2, 4))),
    Case("mixed_layout", conv(("NHWC", "OIHW", "NCHW"), (2, 1), "SAME"), (rand(2, 6, 7, 3), rand(4, 3, 3, 2))),
    Case("odd_layout", conv(("CNWH", "IOWH", "HCNW")), (rand(3, 2, 7, 6), rand(3, 5, 2, 3))),
    Case("rhs_dilation", conv(NCHW, padding="SAME", rhs_dilation=(2, 3)), (rand(2, 3, 10, 11), rand(4, 3, 3, 3))),
    Case("lhs_dilation", conv(NHWC, padding=((2, 2), (1, 1)), lhs_dilation=(2, 3)), (rand(2, 4, 5, 3), rand(3, 3, 3, 2))),
    Case("negative_padding", conv(NCHW, padding=((-1, 2), (1, -2))), (rand(1, 2, 8, 8), rand(3, 2, 2, 2))),
    Case("depthwise", conv(NHWC, padding="SAME", fgc=4), (rand(2, 6, 6, 4), rand(3, 3, 1, 8))),
    Case("grouped", conv(NCHW, fgc=2), (rand(2, 4, 6, 6), rand(6, 2, 3, 3))),
    Case("batch_group", conv(NCHW, bgc=2), (rand(4, 3, 5, 5), rand(6, 3, 2, 2))),
    Case("conv1d_nwc", conv(("NWC", "WIO", "NWC"), (2,), "SAME"), (rand(2, 11, 3), rand(3, 3, 4))),
    Case("conv1d_ncw_dil", conv(("NCW", "OIW", "NCW"), padding=((1, 1),), lhs_dilation=(2,), rhs_dilation=(2,)), (rand(2, 3, 9), rand(4, 3, 3))),
    Case("conv3d_ndhwc", conv(("NDHWC", "DHWIO", "NDHWC"), (1, 2, 1), "SAME"), (rand(1, 4, 6, 5, 2), rand(2, 3, 3, 2, 3))),
    Case("conv3d_ncdhw", conv(("NCDHW", "OIDHW", "NCDHW"), rhs_dilation=(1, 2, 1)), (rand(2, 2, 5, 6, 4), rand(3, 2, 2, 2, 2))),
    Case("conv_transpose", lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=NHWC),
         (rand(2, 5, 5, 3), rand(3, 3, 3, 4))),
    # bfloat16 operands made inside the function (MAX buffers cannot carry bf16 in)
    Case("bf16_to_f32", lambda x, w: conv(NHWC, pet=jnp.float32)(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)),
         (rand(1, 6, 6, 2), rand(3, 3, 2, 3)), rtol=1e-2, atol=1e-2),
    # bfloat16 results: summed in float32 and rounded once, as XLA (summing 60
    # terms in bfloat16 was 3% off)
    Case("bf16_sums_in_f32", lambda x, w: conv(NCHW)(
        x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).astype(jnp.float32),
         (rand(2, 3, 9, 10), rand(3, 3, 4, 5)), rtol=1e-2, atol=1e-2),
    # a filter taller than the input: an empty result, as XLA (MAX's ConvOp
    # rejected it)
    Case("filter_larger_than_input", conv(NCHW), (rand(2, 3, 9, 10), rand(3, 3, 10, 5))),
    # integer convolutions: exact in float64, wrapped like XLA's integers
    Case("int8_to_int32", conv(NCHW, padding="SAME", pet=jnp.int32),
         (_ints(2, 3, 6, 6), _ints(4, 3, 3, 3)), rtol=0, atol=0),
    Case("int8_wraps", conv(NHWC, (2, 1)), (_ints(2, 6, 6, 3), _ints(3, 3, 3, 4)), rtol=0, atol=0),
    # int32: sums beyond float64's exact range, convolved in 16-bit limbs
    Case("int32_in_limbs", conv(NCHW, padding="SAME"),
         (_ints(2, 3, 9, 10, dtype=np.int32), _ints(3, 3, 4, 5, dtype=np.int32)), rtol=0, atol=0),
    Case("f16", conv(NCHW), (rand(1, 2, 6, 6, dtype=np.float16), rand(2, 2, 3, 3, dtype=np.float16)), rtol=1e-2, atol=1e-2),
]


# Variants of features CI already covers: the full tier runs them.
FULL = {"nhwc_explicit_pad", "mixed_layout", "grouped", "conv1d_ncw_dil", "conv3d_ncdhw",
        "bf16_sums_in_f32", "int8_wraps", "f16", "grad_nhwc_dilated", "grad_grouped_nchw",
        "grad_conv1d", "grad_conv3d"}


def _grads(f):
    return jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))


for name, f, args in [
    ("grad_nchw_stride", conv(NCHW, (2, 2), "SAME"), (rand(2, 3, 9, 9), rand(4, 3, 3, 3))),
    ("grad_nhwc_dilated", conv(NHWC, (1, 1), "SAME", rhs_dilation=(2, 2)), (rand(2, 8, 8, 2), rand(3, 3, 2, 3))),
    # filter gradient with a window dilated by the stride: conv._few_outputs_conv
    ("grad_nhwc_stride2_large", conv(NHWC, (2, 2), "SAME"), (rand(2, 12, 12, 2), rand(3, 3, 2, 3))),
    ("grad_depthwise", conv(NHWC, (2, 2), "SAME", fgc=3), (rand(2, 8, 8, 3), rand(3, 3, 1, 6))),
    ("grad_grouped_nchw", conv(NCHW, (1, 2), ((1, 0), (2, 1)), fgc=2), (rand(2, 4, 7, 7), rand(4, 2, 3, 2))),
    ("grad_conv1d", conv(("NCW", "OIW", "NCW"), (3,), "SAME"), (rand(2, 2, 10), rand(3, 2, 4))),
    ("grad_conv3d", conv(("NDHWC", "DHWIO", "NDHWC"), (2, 1, 1), "SAME"), (rand(1, 4, 4, 4, 2), rand(2, 2, 2, 2, 2))),
    ("grad_conv_transpose", lambda x, w: lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=NHWC),
     (rand(2, 4, 4, 3), rand(3, 3, 3, 2))),
]:
    CASES.append(Case(name, _grads(f), args, rtol=1e-3, atol=1e-3))
for case in CASES:
    case.full = case.name in FULL


@pytest.fixture(scope="module")
def results(request):
    names = selected(request, "name")
    return run_cases([c for c in CASES if c.name in names])


@pytest.mark.parametrize("name", [c.param() for c in CASES])
def test_conv(results, name):
    results[name].check()


def test_conv_primitive_appears():
    jaxpr = jax.make_jaxpr(CASES[0].fn)(*CASES[0].args)
    assert any(e.primitive.name == "conv_general_dilated" for e in jaxpr.jaxpr.eqns)


def test_filter_gradients_with_few_outputs_are_matmuls():
    """The filter gradient of a 3x3 conv over 12x12 images is a convolution
    with a 12x12 window and 3x3 outputs: lowered as one matmul, not MAX's conv."""
    case = next(c for c in CASES if c.name == "grad_nhwc_stride2_large")
    x, w = case.args
    dw = lambda x, w: case.fn(x, w)[1]  # noqa: E731
    text = juju.jit(dw).lower(x, w).as_text()
    assert text.count("conv") == 1  # the forward convolution only
    assert "matmul" in text
