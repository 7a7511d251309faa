"""dot_general's `precision` on GPU: HIGHEST is computed from TF32 matmuls as
hi*hi + hi*lo + lo*hi (juju_ops_lax.dot). The split is checked here on the
CPU, where it must be exact; tests/test_gpu.py runs the product on a GPU."""

from __future__ import annotations

import numpy as np
from jax.core import ShapedArray

import juju
from juju_ops_lax import dot


def _lower_split_and_product(ctx, a, b):
    hi, lo = dot._split_tf32(a)
    return [hi, lo, dot._matmul_3xtf32(a, b)]


split_and_product = juju.Primitive(
    "test_split_tf32",
    _lower_split_and_product,
    lambda a, b: [ShapedArray(a.shape, a.dtype)] * 2
    + [ShapedArray((a.shape[0], b.shape[1]), a.dtype)],
    multiple_results=True,
)


def test_tf32_split_is_exact_and_the_product_is_fp32_accurate():
    rng = np.random.RandomState(0)
    a = (rng.randn(32, 64) * 10.0 ** rng.uniform(-20, 20, (32, 64))).astype(np.float32)
    a[0, :4] = [0.0, -0.0, 3e38, -1e35]  # zeros and magnitudes the split leaves whole
    b = rng.randn(64, 8).astype(np.float32)
    hi, lo, product = map(juju.to_numpy, juju.jit(split_and_product)(a, b))
    assert hi.dtype == lo.dtype == product.dtype == np.float32
    np.testing.assert_array_equal(hi + lo, a)
    split = np.abs(a) < 2.0 ** 100
    assert np.all(hi.view(np.uint32)[split] & 0x1FFF == 0), "hi is not exact in TF32"
    np.testing.assert_array_equal(hi[~split], a[~split])
    exact = a[1:].astype(np.float64) @ b
    scale = np.abs(a[1:]).astype(np.float64) @ np.abs(b)
    assert np.all(np.abs(product[1:] - exact) <= 1e-6 * scale)
