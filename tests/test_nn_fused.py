"""Fused lowerings: values against jax.jit, and proof that the fused MAX op
(not the primitive fallback) is in the graph. One compilation for all."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from tests.nn_cases import Case, run_cases
from tests.util import fused_softmax_op

SOFTMAX = fused_softmax_op()
rng = np.random.default_rng(2)


def rand(*shape):
    return rng.normal(size=shape).astype(np.float32)


def layer_norm(x, g, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * lax.rsqrt(v + eps) * g + b


def layer_norm_var(x, g, b, eps=1e-5):
    # as equinox and many hand-written models: jnp.var, a jit[_var] call
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(jnp.var(x, -1, keepdims=True) + eps) * g + b


def layer_norm_equinox(x, weight, bias, eps=1e-5):
    # equinox.nn.LayerNorm.__call__ on one example, vmapped over the batch
    mean = jnp.mean(x, keepdims=True)
    variance = jnp.maximum(0.0, jnp.var(x, keepdims=True))
    out = (x - mean) * jax.lax.rsqrt(variance + eps)
    return weight * out + bias


def layer_norm_sqrt(x, g, eps=1e-6):
    m = jnp.mean(x, -1, keepdims=True)
    v = jnp.mean(jnp.square(x - m), -1, keepdims=True)
    return (x - m) / jnp.sqrt(v + eps) * g


def rms_norm(x, w, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def attention(q, k, v):
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((q.shape[1], k.shape[1]), bool))
    s = jnp.where(mask, s, -1e9)
    return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)


x = rand(4, 16)
x3 = rand(2, 5, 32)
q, k, v = rand(2, 6, 2, 8), rand(2, 6, 2, 8), rand(2, 6, 2, 8)
CASES = [
    Case("softmax", jax.nn.softmax, (x,), expect_in_graph=(SOFTMAX,)),
    Case("softmax_axis0", lambda x: jax.nn.softmax(x, axis=0), (x,), expect_in_graph=(SOFTMAX,)),
    Case("softmax_3d_mid", lambda x: jax.nn.softmax(x, axis=1), (x3,), expect_in_graph=(SOFTMAX,)),
    Case("softmax_big", jax.nn.softmax, (rand(3, 7) * 50,), expect_in_graph=(SOFTMAX,)),
    Case("log_softmax", jax.nn.log_softmax, (x,), expect_in_graph=("mo.reduce.logsoftmax",)),
    Case("log_softmax_axis0", lambda x: jax.nn.log_softmax(x, axis=0), (x3,), expect_in_graph=("mo.reduce.logsoftmax",)),
    Case("gelu_tanh", jax.nn.gelu, (x3,), expect_in_graph=("gelu",)),
    Case("gelu_exact", lambda x: jax.nn.gelu(x, approximate=False), (x3,), expect_in_graph=("gelu",)),
    Case("silu", jax.nn.silu, (x3,), expect_in_graph=("silu",)),
    Case("relu", jax.nn.relu, (x3,), expect_in_graph=("relu",)),
    Case("layer_norm", layer_norm, (x3, rand(32), rand(32)), expect_in_graph=("layer_norm",)),
    Case("layer_norm_sqrt", layer_norm_sqrt, (x3, rand(32)), expect_in_graph=("layer_norm",)),
    Case("layer_norm_plain", lambda x: layer_norm(x, 1.0, 0.0), (x3,), expect_in_graph=("layer_norm",)),
    Case("layer_norm_var", layer_norm_var, (x3, rand(32), rand(32)), expect_in_graph=("layer_norm",)),
    Case("layer_norm_var_plain", lambda x: (x - x.mean(-1, keepdims=True))
         / jnp.sqrt(x.var(-1, keepdims=True) + 1e-6), (x3,), expect_in_graph=("layer_norm",)),
    Case("layer_norm_equinox",  # per token, vmapped over tokens and batch
         jax.vmap(jax.vmap(layer_norm_equinox, in_axes=(0, None, None)), in_axes=(0, None, None)),
         (x3, rand(32), rand(32)), expect_in_graph=("layer_norm",)),
    Case("rms_norm", rms_norm, (x3, rand(32)), expect_in_graph=("rms_norm",)),
    Case("rms_norm_plain", lambda x: rms_norm(x, 1.0), (x3,), expect_in_graph=("rms_norm",)),
    Case("attention_causal", attention, (q, k, v), expect_in_graph=(SOFTMAX,)),
    Case("dot_product_attention", lambda q, k, v: jax.nn.dot_product_attention(q, k, v),
         (q, k, v), expect_in_graph=(SOFTMAX,)),
    Case("dot_product_attention_causal",
         lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
         (q, k, v), expect_in_graph=(SOFTMAX,)),
    # Not fusable (intermediates feed the backward pass): primitive fallback.
    Case("grad_softmax", jax.grad(lambda x: (jax.nn.softmax(x) ** 2).sum()), (x,)),
    Case("grad_layer_norm", jax.grad(lambda x, g, b: (layer_norm(x, g, b) ** 2).sum(), argnums=(0, 1, 2)),
         (x3, rand(32), rand(32)), rtol=1e-3, atol=1e-3),
    # A softmax whose exp is also returned must not be fused.
    Case("softmax_shared_exp", lambda x: (jnp.exp(x - x.max(-1, keepdims=True)),
                                          jax.nn.softmax(x)), (x,)),
]


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_fused(results, name):
    results[name].check()


def test_fallback_when_guard_declines():
    """softmax over two axes is not MAX's softmax: the primitive rules run."""
    f = lambda x: jax.nn.softmax(x, axis=(0, 1))  # noqa: E731
    assert "softmax" not in juju.jit(f).lower(x).as_text()


def test_named_call_rule_wins_by_priority():
    from juju import plugins
    from juju._compat import primitives as P

    # (juju-kernels-mojo's rule for jnp.linalg.cholesky's body ranks above it)
    rules = [r for r in plugins.registry().rules_for(P.jit_p)]
    nn = [r.pack for r in rules].index("nn")
    assert int(rules[nn].priority) == int(juju.Priority.FUSED)
    later = rules[nn + 1:]
    assert later and all(int(r.priority) < int(juju.Priority.FUSED) for r in later)


def test_rewrite_hook_registered():
    from juju import plugins
    from juju_ops_nn import fused

    assert fused.rewrite in plugins.jaxpr_rewrites()


def test_escaping_intermediate_is_not_fused():
    def f(x):
        m = lax.stop_gradient(x.max(-1, keepdims=True))
        e = jnp.exp(x - m)
        return e / e.sum(-1, keepdims=True), e  # e is also an output

    names = [e.primitive.name for e in juju.jit(f).lower(x).closed_jaxpr.jaxpr.eqns]
    assert "nn_fused" not in names and "exp" in names

    def g(x):
        m = lax.stop_gradient(x.max(-1, keepdims=True))
        e = jnp.exp(x - m)
        return e / e.sum(-1, keepdims=True)

    names = [e.primitive.name for e in juju.jit(g).lower(x).closed_jaxpr.jaxpr.eqns]
    assert names == ["nn_fused"]
