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
def form(monkeypatch):
    def set_form(value):
        monkeypatch.setenv("JUJU_GPU_MATMUL", value)
    monkeypatch.delenv("JUJU_GPU_MATMUL", raising=False)
    return set_form


def test_bf16_product_stays_bf16_in_the_transposed_b_form(form):
    ops = graph_ops(x_w, S((256, 512), BF16), S((512, 128), BF16))
    assert matmul_operands(x_w, S((256, 512), BF16), S((512, 128), BF16)) == ["bf16 x bf16"]
    assert transposed_b(ops)
    # b, in (K, N) order, is copied to (N, K) through a select MAX cannot fold
    assert "rmo.select" in ops


def test_x_times_w_transposed_needs_no_copy(form):
    # the jaxpr's transpose folds into the dot (rewrites.fold_transposed_operands)
    ops = graph_ops(x_wt, S((256, 512), BF16), S((128, 512), BF16))
    assert transposed_b(ops) and "rmo.select" not in ops
    assert ops.count("rmo.mo.transpose") == 1
    ops = graph_ops(qk, S((4, 128, 64), BF16), S((4, 128, 64), BF16))
    assert transposed_b(ops) and "rmo.select" not in ops


def test_bf16_falls_back_to_float32_products(form):
    # N = 30: not a shape MAX's sm90 kernel takes
    assert matmul_operands(x_w, S((64, 128), BF16), S((128, 30), BF16)) == ["f32 x f32"]
    form("transposed_b_fp32")
    args = (S((256, 512), BF16), S((512, 128), BF16))
    assert matmul_operands(x_w, *args) == ["f32 x f32"] and transposed_b(graph_ops(x_w, *args))
    form("plain")  # juju's products before the transposed-B form
    ops = graph_ops(x_w, *args)
    assert matmul_operands(x_w, *args) == ["f32 x f32"]
    assert "rmo.mo.transpose" not in ops and "rmo.select" not in ops


def test_float32_takes_the_transposed_b_form_where_the_copy_pays(form):
    ops = graph_ops(x_w, S((512, 256), F32), S((256, 128), F32))
    assert transposed_b(ops) and "rmo.select" in ops
    # 16 rows (a decode step): copying b would cost more than the product
    ops = graph_ops(x_w, S((16, 256), F32), S((256, 128), F32))
    assert "rmo.select" not in ops
    # no extra copy where b already is (N, K)
    ops = graph_ops(x_wt, S((16, 256), F32), S((128, 256), F32))
    assert transposed_b(ops) and "rmo.select" not in ops and "rmo.reshape" not in ops[:3]


def test_cpu_products_are_unchanged(form):
    ops = graph_ops(x_w, S((256, 512), BF16), S((512, 128), BF16), engine=juju.cpu_engine())
    assert "rmo.mo.transpose" not in ops and "rmo.select" not in ops


def test_explain_names_the_gpu_rule(form):
    args = (S((256, 512), BF16), S((512, 128), BF16))
    gpu = {c.primitive: c for c in juju.explain(juju.jit(x_w, engine=GPU), *args)}
    cpu = {c.primitive: c for c in juju.explain(x_w, *args)}
    assert gpu["dot_general"].rule == "lower_dot_general_gpu"
    assert "JUJU_GPU_MATMUL != plain" in gpu["dot_general"].guard
    assert cpu["dot_general"].rule != "lower_dot_general_gpu"
    form("plain")
    gpu = {c.primitive: c for c in juju.explain(juju.jit(x_w, engine=GPU), *args)}
    assert gpu["dot_general"].rule == "lower_dot_general"


def test_transformer_block_uses_fused_kernels_on_the_gpu(form):
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
    cases = {
        "bf16 x @ w": (lambda x, w: x @ w, jnp.bfloat16, (256, 512), (512, 128), None),
        "f32 x @ w": (lambda x, w: x @ w, jnp.float32, (512, 256), (256, 128), None),
        "f32 x @ w, plain": (lambda x, w: x @ w, jnp.float32, (512, 256), (256, 128), "plain"),
    }
    found = {}
    for name in sys.argv[2:]:
        fn, dtype, a, b, form = cases[name]
        os.environ["JUJU_CACHE_DIR"] = folder = os.path.join(sys.argv[1], str(len(found)))
        if form:
            os.environ["JUJU_GPU_MATMUL"] = form
        else:
            os.environ.pop("JUJU_GPU_MATMUL", None)
        juju.jit(fn, engine=juju.gpu_engine()).lower(
            jax.ShapeDtypeStruct(a, dtype), jax.ShapeDtypeStruct(b, dtype)).compile()
        mefs = b"".join(p.read_bytes() for p in pathlib.Path(folder).rglob("*.mef"))
        found[name] = {kernel: kernel.encode() in mefs for kernel in KERNELS}
    print(json.dumps(found))
""")


def compile_for_virtual_gpu(tmp_path, *names) -> dict:
    env = dict(os.environ, JUJU_VIRTUAL_GPU="sm_90a", JUJU_TIERED="0")
    script = f"KERNELS = {(SM90, GENERIC)!r}\n{_COMPILE}"
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path), *names],
                         capture_output=True, text=True, env=env, timeout=3600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.gpu_compile
def test_transposed_b_form_compiles_to_the_sm90_tensor_core_kernel(tmp_path):
    found = compile_for_virtual_gpu(tmp_path, "bf16 x @ w", "f32 x @ w", "f32 x @ w, plain")
    assert found["bf16 x @ w"][SM90], "bf16 x @ w did not reach MAX's sm90 kernel"
    assert found["f32 x @ w"][SM90], "f32 x @ w did not reach MAX's sm90 kernel"
    plain = found["f32 x @ w, plain"]
    assert plain[GENERIC] and not plain[SM90]
