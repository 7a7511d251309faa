"""`juju.jit(f, polymorphic_shapes=...)`: calls that differ only in a named
dimension share one MAX compile with symbolic dimensions; functions with a rule
that needs static shapes fall back to one compile per shape."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import juju
from tests.util import assert_same

rng = np.random.default_rng(7)
W1 = rng.normal(size=(8, 16)).astype(np.float32)
W2 = rng.normal(size=(16, 4)).astype(np.float32)


def mlp(params, x):
    w1, w2 = params
    h = jnp.tanh(x @ w1 + 1.0)
    return {"probs": jax.nn.softmax(h @ w2), "mean": h.mean(), "col_sums": (h * 2).sum(0),
            "flat": h.reshape(-1), "t": h.T, "row_max": h.max(axis=1),
            "clipped": jnp.where(h > 0, h, 0.1 * h)}


def mlp_step(params, x, y):
    def loss(params):
        logits = mlp(params, x)["probs"]
        return -jnp.mean(jnp.sum(jnp.log(logits) * y, axis=-1))

    grads = jax.grad(loss)(params)
    return [p - 0.1 * g for p, g in zip(params, grads)]


def batch(n):
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = np.eye(4, dtype=np.float32)[rng.integers(0, 4, n)]
    return x, y


@pytest.mark.parametrize("fn, specs", [(mlp, (None, "b, ...")),
                                       (mlp_step, (None, "b, ...", "b, ..."))],
                         ids=["forward", "training_step"])
def test_batch_sizes_share_one_compile(fn, specs):
    jf = juju.jit(fn, polymorphic_shapes=specs)
    for n in (3, 17, 1, 3):
        x, y = batch(n)
        args = ((W1, W2), x, y)[:len(specs)]
        assert_same(jf(*args), jax.jit(fn)(*args), rtol=1e-5, atol=1e-5)
    assert jf.compile_count == 1
    assert jf.trace_count == 1


def test_graph_has_a_symbolic_dimension():
    specs = export.symbolic_args_specs(((W1, W2), batch(3)[0]), (None, "batch, ..."))
    text = juju.jit(mlp).lower(*specs).as_text()
    assert "!mo.tensor<[batch, 8], f32>" in text


def test_rule_needing_static_shapes_falls_back_to_per_shape(caplog):
    def running_total(x):  # cumsum's rule needs the static length
        return jnp.cumsum(x, axis=0) * 2.0

    jf = juju.jit(running_total, polymorphic_shapes=("n, ...",))
    x = rng.normal(size=(5, 3)).astype(np.float32)
    with caplog.at_level("INFO", logger="juju"):
        assert_same(jf(x), jax.jit(running_total)(x))
    assert "not lowered with symbolic shapes" in caplog.text
    assert "cumsum" in caplog.text
    assert jf.compile_count == 1  # the static compile; the symbolic one never ran


def test_inconsistent_dimension_is_a_clear_error():
    jf = juju.jit(lambda x, y: x + y, polymorphic_shapes=("b, 4", "b, 4"))
    with pytest.raises(ValueError, match="dimension 'b' is 3 in one argument and 5 in another"):
        jf(np.ones((3, 4), np.float32), np.ones((5, 4), np.float32))


def test_spec_disagreeing_with_the_argument_is_a_clear_error():
    jf = juju.jit(lambda x: x * 2, polymorphic_shapes=("b, 4",))
    with pytest.raises(ValueError, match=r"polymorphic_shapes=\('b, 4',\) does not fit .*size 4"):
        jf(np.ones((3, 5), np.float32))
