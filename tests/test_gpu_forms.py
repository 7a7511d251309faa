"""The forms products and fused NN patterns take on a GPU engine, checked on
the CPU: in the MAX graph text and `juju.explain` (CI: graphs are built, not
compiled), and, marked `gpu_compile`, in what MAX compiles for a virtual
sm_90a GPU (`JUJU_VIRTUAL_GPU`: minutes a graph here; kernel names in the MEF).

tests/test_gpu.py runs the same forms on a real GPU against XLA.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import pytest

import juju
from examples import models

GPU = juju.Engine("gpu", 0)  # builds graphs for GPU 0 without touching a device
S = jax.ShapeDtypeStruct
BF16, F32 = jnp.bfloat16, jnp.float32


def graph_ops(fn, *args, engine=GPU) -> list[str]:
    """The MAX graph's operations, in order."""
    return re.findall(r"= (r?mo\.[\w.]+)", str(juju.make_max_graph(fn, engine=engine)(*args)))


def matmul_operands(fn, *args) -> list[str]:
    """The element types of each matmul's operands, e.g. ['bf16 x bf16']."""
    text = str(juju.make_max_graph(fn, engine=GPU)(*args))
    return [" x ".join(re.findall(r"tensor<\[[^\]]*\], (\w+)", line.split(":", 1)[1])[:2])
            for line in text.splitlines() if "rmo.matmul" in line]


def transposed_b(ops: list[str]) -> bool:
    """Whether the matmul's second operand is a transpose (the form MAX's
    sm90 kernels take), with nothing between them."""
    return any(a == "rmo.mo.transpose" and b == "rmo.matmul" for a, b in zip(ops, ops[1:]))


def x_w(x, w):
    return x @ w


def x_wt(x, w):
    return x @ w.T


def qk(q, k):
    return jnp.einsum("bqd,bkd->bqk", q, k)


@pytest.fixture
def mode(monkeypatch):
    """Sets `JUJU_GPU_MATMUL` (and with `vendor_blas=True`, JUJU_GPU_VENDOR_BLAS)."""
    def set_mode(value, vendor_blas=False):
        monkeypatch.setenv("JUJU_GPU_MATMUL", value)
        monkeypatch.setenv("JUJU_GPU_VENDOR_BLAS", "1" if vendor_blas else "0")
    monkeypatch.delenv("JUJU_GPU_MATMUL", raising=False)
    monkeypatch.delenv("JUJU_GPU_VENDOR_BLAS", raising=False)
    return set_mode


BF16_X_W = (S((256, 512), BF16), S((512, 128), BF16))
BF16_X_WT = (S((256, 512), BF16), S((128, 512), BF16))


def test_bf16_products_default_to_float32_in_the_free_form(mode):
    # x @ w: b is (K, N); the plain form, no copy; products in float32
    ops = graph_ops(x_w, *BF16_X_W)
    assert matmul_operands(x_w, *BF16_X_W) == ["f32 x f32"]
    assert not transposed_b(ops) and "rmo.mo.cumsum" not in ops
    # x @ w.T: the jaxpr's transpose folds into the dot (rewrites.py), and b,
    # (N, K) in memory, takes the transposed-B form with no copy
    ops = graph_ops(x_wt, *BF16_X_WT)
    assert matmul_operands(x_wt, *BF16_X_WT) == ["f32 x f32"]
    assert transposed_b(ops) and "rmo.mo.cumsum" not in ops


def test_tensor_cores_keep_bf16_where_b_is_n_by_k(mode):
    mode("tensor_cores")
    assert matmul_operands(x_wt, *BF16_X_WT) == ["bf16 x bf16"]
    assert transposed_b(graph_ops(x_wt, *BF16_X_WT))
    qk_args = (S((4, 128, 64), BF16), S((4, 128, 64), BF16))
    assert matmul_operands(qk, *qk_args) == ["bf16 x bf16"] and transposed_b(graph_ops(qk, *qk_args))
    # b in (K, N) order would need a copy, which MAX undoes: float32 there
    assert matmul_operands(x_w, *BF16_X_W) == ["f32 x f32"]
    # N = 30 (not a multiple of 8): not a shape MAX's sm90 kernel takes
    assert matmul_operands(x_wt, S((64, 128), BF16), S((30, 128), BF16)) == ["f32 x f32"]


def test_vendor_blas_keeps_every_bf16_product_bf16(mode):
    mode("fp32", vendor_blas=True)
    assert matmul_operands(x_w, *BF16_X_W) == ["bf16 x bf16"]
    assert matmul_operands(x_wt, *BF16_X_WT) == ["bf16 x bf16"]


def test_float32_products_have_no_copies_around_them(mode):
    ops = graph_ops(x_w, S((512, 256), F32), S((256, 128), F32))
    assert ops == ["mo.chain.create", "rmo.matmul"], ops
    ops = graph_ops(x_wt, S((16, 256), F32), S((128, 256), F32))
    assert ops == ["mo.chain.create", "mo.constant", "rmo.mo.transpose", "rmo.matmul"], ops


def test_cpu_products_are_unchanged(mode):
    ops = graph_ops(x_w, S((256, 512), BF16), S((512, 128), BF16), engine=juju.cpu_engine())
    assert "rmo.mo.transpose" not in ops and "mo.cast" not in ops


def test_explain_names_the_gpu_rule(mode):
    gpu = {c.primitive: c for c in juju.explain(juju.jit(x_w, engine=GPU), *BF16_X_W)}
    cpu = {c.primitive: c for c in juju.explain(x_w, *BF16_X_W)}
    assert gpu["dot_general"].rule == "lower_dot_general_gpu"
    assert gpu["dot_general"].guard == "GPU engine"
    assert cpu["dot_general"].rule != "lower_dot_general_gpu"


def test_transformer_block_uses_fused_kernels_on_the_gpu(mode):
    """The block's softmax (inside jax.nn.dot_product_attention), its layer
    norms and gelu lower to MAX's fused ops for a GPU engine as on the CPU,
    its products to the transposed-B form."""
    rng = __import__("numpy").random.default_rng(0)
    params = models.block_init(rng, d=64, heads=4, hidden=256)
    x = S((2, 32, 64), F32)
    choices = juju.explain(juju.jit(models.block_apply, engine=GPU), params, x)
    fused = {c.rule for c in choices if c.primitive == "nn_fused"}
    assert {"lower_nn_fused_softmax", "lower_nn_fused_layer_norm"} <= fused
    assert {c.rule for c in choices if c.primitive == "dot_general"} == {"lower_dot_general_gpu"}
    ops = graph_ops(models.block_apply, params, x)
    assert "mo.reduce.softmax" in " ".join(ops) or "softmax" in " ".join(ops)
    assert "mo.layer_norm" in ops or any("layer_norm" in op for op in ops)


# --- compiled for a virtual GPU ---------------------------------------------------

# Kernel names MAX 26.7 leaves in a MEF: its Hopper tensor-core (wgmma) matmul,
# and the generic multistage one it also keeps as the runtime fallback.
SM90 = "warp_specialize_gemm_with_multicasting"
GENERIC = "multistage_gemm_kernel"

_COMPILE = textwrap.dedent("""
    import json, os, sys, pathlib
    import jax, jax.numpy as jnp
    import juju
    bf16 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    cases = {  # name: (function, operands, JUJU_GPU_MATMUL)
        "bf16 x @ w.T, tensor_cores": (lambda x, w: x @ w.T, (bf16(256, 512), bf16(128, 512)),
                                       "tensor_cores"),
        "bf16 x @ w, tensor_cores": (lambda x, w: x @ w, (bf16(256, 512), bf16(512, 128)),
                                     "tensor_cores"),
    }
    found = {}
    for name in sys.argv[2:]:
        fn, args, form = cases[name]
        os.environ["JUJU_CACHE_DIR"] = folder = os.path.join(sys.argv[1], str(len(found)))
        os.environ.pop("JUJU_GPU_MATMUL", None)
        os.environ.update({"JUJU_GPU_MATMUL": form} if form else {})
        juju.jit(fn, engine=juju.gpu_engine()).lower(*args).compile()
        mefs = b"".join(p.read_bytes() for p in pathlib.Path(folder).rglob("*.mef"))
        found[name] = {kernel: kernel.encode() in mefs for kernel in KERNELS}
    print(json.dumps(found))
""")


def compile_for_virtual_gpu(tmp_path, *names) -> dict:
    env = dict(os.environ, JUJU_VIRTUAL_GPU="sm_90a", JUJU_TIERED="0")
    script = f"KERNELS = {(SM90, GENERIC)!r}\n{_COMPILE}"
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path), *names],
                         capture_output=True, text=True, env=env, timeout=7200)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu_compile
def test_bf16_tensor_core_form_compiles_to_the_sm90_kernel(tmp_path):
    """`x @ w.T` in bf16 reaches MAX's wgmma kernel; `x @ w` (computed in
    float32, since a copy of w would be undone) only the generic kernel.
    Each compile took 7-27 minutes on this 2-core machine under load."""
    found = compile_for_virtual_gpu(tmp_path, "bf16 x @ w.T, tensor_cores",
                                    "bf16 x @ w, tensor_cores")
    assert found["bf16 x @ w.T, tensor_cores"][SM90], "x @ w.T missed MAX's sm90 kernel"
    plain = found["bf16 x @ w, tensor_cores"]
    assert plain[GENERIC] and not plain[SM90]
