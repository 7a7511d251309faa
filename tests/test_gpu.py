"""juju on a GPU (`gpu_engine()`) vs jax.jit on the CPU.

Skipped, with the reason in the report, on a machine without a GPU (CI has
none).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same, tolerance


def _gpu_engine():
    try:
        return juju.gpu_engine()
    except juju.EngineUnavailableError as exc:
        return exc


ENGINE = _gpu_engine()
pytestmark = pytest.mark.skipif(
    isinstance(ENGINE, Exception), reason=f"no GPU on this machine: {ENGINE}"
)

rng = np.random.RandomState(3)


def f32(*shape):
    return rng.randn(*shape).astype(np.float32)


A, B = f32(64, 128), f32(128, 32)
V = f32(4096)
IMG = f32(2, 16, 16, 3)  # NHWC
KERNEL = f32(3, 3, 3, 8)  # HWIO
SEQ = f32(20, 8)
IDX = rng.randint(0, 64, size=(10,)).astype(np.int32)
INTS = rng.randint(-1000, 1000, size=(256,)).astype(np.int32)
KEY = jax.random.key(0)


def mlp_loss(params, x):
    w1, w2 = params
    h = jax.nn.relu(x @ w1)
    return jnp.mean((h @ w2) ** 2)


def rnn(h0, xs, w):
    return lax.scan(lambda h, x: (jnp.tanh(h @ w + x), h.sum()), h0, xs)


CASES = {
    "elementwise_chain": (lambda v: jnp.sin(v * v + 1.0) / (1 + jnp.exp(-v)), (V,)),
    "matmul": (lambda a, b: a @ b, (A, B)),
    "matmul_highest": (lambda a, b: jnp.matmul(a, b, precision=lax.Precision.HIGHEST), (A, B)),
    "batched_matmul_highest": (lambda x, y: jnp.einsum("bij,bjk->bik", x, y, precision="highest"),
                               (f32(4, 32, 64), f32(4, 64, 16))),
    "matmul_bf16": (lambda a, b: (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)), (A, B)),
    "matmul_bf16_f32_out": (lambda a, b: lax.dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                                 preferred_element_type=jnp.float32), (A, B)),
    "matmul_f16": (lambda a, b: (a.astype(jnp.float16) @ b.astype(jnp.float16)), (A, B)),
    "reductions": (lambda a: (a.sum(0), a.sum(1), a.max(), jnp.argmax(a, 1), a.mean()), (A,)),
    "softmax_layernorm": (lambda a: (jax.nn.softmax(a, -1),
                                     (a - a.mean(-1, keepdims=True))
                                     * lax.rsqrt(a.var(-1, keepdims=True) + 1e-5)), (A,)),
    "gelu": (lambda a: jax.nn.gelu(a), (A,)),
    "conv": (lambda x, k: lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC")),
             (IMG, KERNEL)),
    "max_pool": (lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1),
                                             "VALID"), (IMG,)),
    "scan_rnn": (lambda xs, w: rnn(jnp.zeros(8), xs, w), (SEQ, f32(8, 8))),
    "while_loop": (lambda v: lax.while_loop(lambda c: c[0] < 10, lambda c: (c[0] + 1, c[1] * 1.1),
                                            (0, v)), (V,)),
    "cond": (lambda v: lax.cond(v[0] > 0, jnp.sin, jnp.cos, v), (V,)),
    "gather_scatter": (lambda a, i: (a[i], a.at[i].add(1.0), jnp.take(a, i, axis=1)), (A, IDX)),
    "sort": (lambda v: jnp.sort(v), (V,)),
    "cumsum": (lambda v: jnp.cumsum(v), (V,)),
    "top_k": (lambda v: lax.top_k(v, 5), (V,)),
    "integers": (lambda n: (n // 7, n % 7, n >> 3, n << 2, n & 0xFF, jnp.abs(n)), (INTS,)),
    "random": (lambda k: (jax.random.normal(k, (4, 5)), jax.random.randint(k, (8,), 0, 10)),
               (KEY,)),
    "mlp_grad": (jax.grad(mlp_loss), ((f32(128, 64), f32(64, 10)), A)),
    "complex": (lambda a, b: (a[:, :32] + 1j * b[:64]) ** 2, (A, B)),
    "cholesky_solve": (lambda a: jnp.linalg.solve(a @ a.T + 64 * jnp.eye(64), a[:, 0]), (A,)),
}


# Cases whose fp32 matmuls run at jax's DEFAULT precision: TF32 on the GPU
# (as XLA does there), compared with XLA CPU's fp32 at TF32's tolerance.
TF32_CASES = {"matmul", "scan_rnn", "mlp_grad", "cholesky_solve"}


def _tolerance(name, dtype):
    tol = tolerance(dtype)
    if np.dtype(dtype) == np.float32:
        # GPU code contracts a*b+c into FMAs and uses its own exp/tanh/erf:
        # last-bit differences that cancellation lifts to ~1e-5 absolute.
        tol = dict(rtol=1e-2, atol=5e-2) if name in TF32_CASES else dict(rtol=2e-5, atol=1e-4)
    return tol


@pytest.fixture(scope="module")
def gpu_functions():
    """The cases' juju functions, compiled together when that works: a GPU
    compile takes 20-40 s per graph alone. If the joint compile fails, each
    case compiles on its own at its first call, so a failure names its case."""
    functions = {name: juju.jit(fun, engine=ENGINE) for name, (fun, _) in CASES.items()}
    lowered = []
    for name, (_, args) in CASES.items():
        try:
            lowered.append(functions[name].lower(*args))
        except juju.JujuError:
            pass  # the case's own test reports it
    try:
        juju.compile_all(lowered)
    except juju.JujuError:
        pass
    return functions


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_matches_jax(name, gpu_functions):
    fun, args = CASES[name]
    got = gpu_functions[name](*args)
    expected = jax.jit(fun)(*args)
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(expected)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        dtype = np.asarray(w).dtype
        part = np.float32 if dtype == np.complex64 else dtype
        assert_same(g, w, **_tolerance(name, part))


def test_gpu_outputs_stay_on_the_device_and_feed_the_next_call():
    double = juju.jit(lambda x: x * 2, engine=ENGINE)
    out = double(V)
    assert not out.device.is_host
    again = double(out)  # a device buffer in: no copy to the host
    np.testing.assert_allclose(juju.to_numpy(again), V * 4, rtol=1e-6)
    as_jax = juju.jit(lambda x: x + 1, engine=ENGINE, coerces_to_jnp=True)(V)
    assert isinstance(as_jax, jax.Array)
    np.testing.assert_allclose(np.asarray(as_jax), V + 1, rtol=1e-6)


def test_gpu_mojo_kernel():
    kernels = pytest.importorskip("juju_kernels_mojo")
    x, y, z = f32(16), f32(16), f32(16)
    got = juju.jit(lambda a, b, c: kernels.fma(a, b, c), engine=ENGINE)(x, y, z)
    np.testing.assert_allclose(juju.to_numpy(got), x * y + z, rtol=1e-6)
