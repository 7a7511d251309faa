"""juju on a GPU (`gpu_engine()`) vs jax.jit (on the GPU where jax has one).

Skipped, with the reason in the report, on a machine without a GPU (CI has
none). `python3 dev.py gpu` runs it on a lent GPU machine, its graphs
compiled beforehand in parallel (`lowered_cases`, benchmarks/gpu.py).
"""

from __future__ import annotations

import contextlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same, selected, tolerance

BF16 = jnp.bfloat16


def _gpu_engine():
    if os.environ.get("JUJU_GPU_TESTS_DRY_RUN") == "1":
        # `python3 dev.py gpu --dry-run`: this file's code on the CPU engine.
        # Its numbers prove nothing about a GPU; a bug in a case shows here.
        return juju.cpu_engine()
    if os.environ.get("JUJU_VIRTUAL_GPU"):  # compile-only: nothing here could run
        return juju.EngineUnavailableError("JUJU_VIRTUAL_GPU is set: a virtual GPU")
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


def bf16(*shape):
    return f32(*shape).astype(BF16)


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
    # float32 in the transposed-B form (b given as (N, K): no copy)
    "matmul_f32_transposed_b": (lambda a, b: a @ b.T, (f32(512, 256), f32(128, 256))),
    "mlp_grad_bf16": (jax.grad(lambda p, x: jnp.mean(
        (jax.nn.relu(x @ p[0]) @ p[1]).astype(jnp.float32) ** 2)),
        ((bf16(128, 64), bf16(64, 16)), bf16(256, 128))),
}

# Cases whose fp32 matmuls run at jax's DEFAULT precision: TF32 on the GPU
# (as XLA does there), compared with XLA CPU's fp32 at TF32's tolerance.
BF16_GRADIENTS = {"mlp_grad_bf16"}
TF32_CASES = {"matmul", "scan_rnn", "mlp_grad", "cholesky_solve", "matmul_f32_transposed_b",
              "bf16_f32_out"}


# The forms of bfloat16 products (juju_ops_lax/dot.py), each compared with
# XLA to bfloat16 rounding: name -> (fn, args, the (M, K) and (K, N)
# matrices of the product as numpy, for the bound).
def _plain(a, b):
    return a, b


def _b_transposed(a, b):
    return a, np.swapaxes(b, -1, -2)


BF16_PRODUCTS = {
    # x @ w: b is (K, N); the plain form (float32 products by default)
    "bf16_x_w": (lambda a, b: a @ b, (bf16(256, 512), bf16(512, 128)), _plain),
    # x @ w.T: w is (N, K) in memory: the transposed-B form, no copy
    "bf16_x_wT": (lambda a, b: a @ b.T, (bf16(256, 512), bf16(128, 512)), _b_transposed),
    # the same with w computed in the graph (MAX may fuse the transpose into
    # w's kernel and lose the form: what tensor_cores must survive)
    "bf16_x_2wT": (lambda a, b: a @ (b * 2).T, (bf16(256, 512), bf16(128, 512)),
                   lambda a, b: (a, (b.astype(np.float32) * 2).T)),
    # decode-sized products (M = 16 > 8, where MAX's plain bf16 kernel was wrong)
    "bf16_decode": (lambda a, b: a @ b, (bf16(16, 512), bf16(512, 512)), _plain),
    "bf16_decode_wT": (lambda a, b: a @ b.T, (bf16(16, 512), bf16(512, 512)), _b_transposed),
    # batched, contracting both last dims (attention's q @ k.T)
    "bf16_batched_qk": (lambda q, k: jnp.einsum("bqd,bkd->bqk", q, k),
                        (bf16(4, 128, 64), bf16(4, 128, 64)), _b_transposed),
    # batched, b in (K, N) order (attention's p @ v)
    "bf16_batched_pv": (lambda p, v: jnp.einsum("bqk,bkd->bqd", p, v),
                        (bf16(4, 128, 128), bf16(4, 128, 64)), _plain),
    # N = 30 (not a multiple of 8): float32 products in every mode
    "bf16_odd_n": (lambda a, b: a @ b.T, (bf16(64, 128), bf16(30, 128)), _b_transposed),
    # bf16 operands, float32 result: float32 products
    "bf16_f32_out": (lambda a, b: lax.dot(a, b, preferred_element_type=jnp.float32),
                     (bf16(256, 512), bf16(512, 128)), None),
}

# `JUJU_GPU_MATMUL=tensor_cores` (bf16 products in bf16 where b is (N, K)),
# checked beside the default so the GPU run says whether it may become one.
TENSOR_CORE_CASES = ["bf16_x_wT", "bf16_x_2wT", "bf16_decode_wT", "bf16_batched_qk",
                     "bf16_odd_n", "bf16_x_w"]
FORM_VARIANTS = [(case, "tensor_cores") for case in TENSOR_CORE_CASES]

def _tolerance(name, dtype):
    name = name.split("[")[0]
    tol = tolerance(dtype)
    if np.dtype(dtype) == np.float32:
        # GPU code contracts a*b+c into FMAs and uses its own exp/tanh/erf:
        # last-bit differences that cancellation lifts to ~1e-5 absolute.
        tol = dict(rtol=1e-2, atol=5e-2) if name in TF32_CASES else dict(rtol=2e-5, atol=1e-4)
    return tol


_PRODUCTS = {name: (fn, args) for name, (fn, args, _) in BF16_PRODUCTS.items()}
ALL_CASES = {**CASES, **_PRODUCTS,
             **{f"{case}[{form}]": (_PRODUCTS | CASES)[case] for case, form in FORM_VARIANTS}}
_FORMS = {f"{case}[{form}]": form for case, form in FORM_VARIANTS}


@contextlib.contextmanager
def _matmul_form(form):
    saved = os.environ.get("JUJU_GPU_MATMUL")
    if form:
        os.environ["JUJU_GPU_MATMUL"] = form
    try:
        yield
    finally:
        os.environ.pop("JUJU_GPU_MATMUL", None)
        if saved is not None:
            os.environ["JUJU_GPU_MATMUL"] = saved


_functions: dict = {}


def lowered_cases(names=None) -> list:
    """(name, Lowered) of every case (of `names`) that lowers, each under its
    product form; the juju functions are kept for the tests
    (benchmarks/gpu.py compiles these in parallel before pytest runs, so the
    fixture only loads)."""
    lowered = []
    for name, (fun, args) in ALL_CASES.items():
        if names is not None and name not in names:
            continue
        jf = _functions.setdefault(name, juju.jit(fun, engine=ENGINE))
        try:
            with _matmul_form(_FORMS.get(name)):
                lowered.append((name, jf.lower(*args)))
        except juju.JujuError:
            pass  # the case's own test reports it
    return lowered


@pytest.fixture(scope="module")
def gpu_functions(request):
    """The cases' juju functions, compiled together when that works: a GPU
    compile takes 20-140 s per graph. If the joint compile fails, each case
    compiles on its own at its first call, so a failure names its case."""
    lowered = lowered_cases(selected(request, "name"))
    try:
        juju.compile_all([low for _, low in lowered])
    except juju.JujuError:
        pass
    return _functions


def _call(name, gpu_functions):
    fun, args = ALL_CASES[name]
    gpu_functions.setdefault(name, juju.jit(fun, engine=ENGINE))
    with _matmul_form(_FORMS.get(name)):  # a case that did not lower lowers here
        return gpu_functions[name](*args), jax.jit(fun)(*args), args


def assert_bf16_product(got, want, a, b):
    """`got` equals XLA's bf16 product `want` to bfloat16 rounding: within
    one bf16 ulp of |want| (2^-7 relative: both round an fp32 sum once),
    plus what fp32 sums in another order may differ by (K 2^-23 |a||b|)."""
    got, want = juju.to_numpy(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    a, b = (np.asarray(x, np.float64) for x in (a, b))
    scale = np.abs(a) @ np.abs(b) if a.ndim == 2 else np.einsum(
        "...ij,...jk->...ik", np.abs(a), np.abs(b))
    k = a.shape[-1]
    bound = 2.0 ** -7 * np.abs(want.astype(np.float64)) + k * 2.0 ** -23 * scale
    error = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = np.unravel_index(np.argmax(error - bound), error.shape)
    assert np.all(error <= bound), (f"max excess at {worst}: |{got[worst]} - {want[worst]}| "
                                    f"> {bound[worst]:.3g}")


@pytest.mark.parametrize("name", [n for n in ALL_CASES if n.split("[")[0] in BF16_PRODUCTS
                                  and BF16_PRODUCTS[n.split("[")[0]][2] is not None])
def test_gpu_bf16_product_matches_xla_to_bf16_rounding(name, gpu_functions):
    got, want, args = _call(name, gpu_functions)
    assert_bf16_product(got, want, *BF16_PRODUCTS[name.split("[")[0]][2](*map(np.asarray, args)))


@pytest.mark.parametrize("name", list(ALL_CASES))
def test_gpu_matches_jax(name, gpu_functions):
    got, expected, _ = _call(name, gpu_functions)
    got_leaves, got_tree = jax.tree_util.tree_flatten(got)
    want_leaves, want_tree = jax.tree_util.tree_flatten(expected)
    assert got_tree == want_tree
    for g, w in zip(got_leaves, want_leaves):
        dtype = np.asarray(w).dtype
        part = np.float32 if dtype == np.complex64 else dtype
        tol = _tolerance(name, part)
        if name in BF16_GRADIENTS:  # bf16 roundings of intermediates differ between fusions
            tol = dict(rtol=3e-2, atol=3e-2 * float(np.max(np.abs(np.asarray(w, np.float64)))))
        assert_same(g, w, **tol)


@pytest.mark.skipif(os.environ.get("JUJU_GPU_TESTS_DRY_RUN") == "1",
                    reason="dry run on the CPU engine: no device memory")
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
    if not hasattr(kernels, "fma"):  # the repo's folder as a namespace package: not installed
        pytest.skip("juju-kernels-mojo is not installed (dev.py gpu: --pack-kernels)")
    x, y, z = f32(16), f32(16), f32(16)
    got = juju.jit(lambda a, b, c: kernels.fma(a, b, c), engine=ENGINE)(x, y, z)
    np.testing.assert_allclose(juju.to_numpy(got), x * y + z, rtol=1e-6)
