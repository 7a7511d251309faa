"""flax linen and nnx: a CNN train step with optax, a transformer encoder
with an attention mask and dropout, BatchNorm state; written as flax's
guides write them (linen: `init`/`apply` with `mutable` and `rngs`; nnx:
`nnx.split`/`nnx.merge` around a pure step, its functional API). Large:
MNIST-size images (batch 128, 28x28, 32 channels, 256 hidden units) and
encoders of 256 tokens of width 256."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


def _images(seed, size="small", channels=1):
    import jax.numpy as jnp

    n, side = sized(size, small=(4, 8), large=(128, 28))
    rng = np.random.default_rng(seed)
    images = jnp.asarray(rng.normal(size=(n, side, side, channels)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 10, size=(n,)), jnp.int32)
    return images, labels


def _tokens(seed, size="small"):
    import jax.numpy as jnp

    n, length, vocab = _encoder_shape(size)[:3]
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(1, vocab, size=(n, length)), jnp.int32)
    return tokens.at[1, 2 * length // 3:].set(0)  # padding in the second sequence


def _encoder_shape(size):
    """(batch, tokens, vocabulary, width, heads) of the encoders."""
    return sized(size, small=(2, 6, 16, 16, 2), large=(4, 256, 1000, 256, 8))


# --- linen -------------------------------------------------------------------


def classifier_train_step(model, images, labels):
    """A linen classifier's adam step on softmax cross-entropy, as flax's
    tutorials write it, and its arguments (params, opt_state, images, labels)."""
    import jax
    import optax

    params = model.init(jax.random.key(0), images)["params"]
    tx = optax.adam(1e-3)

    def train_step(params, opt_state, images, labels):
        def loss_fn(params):
            logits = model.apply({"params": params}, images)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step, (params, tx.init(params), images, labels)


@program("linen_cnn_train_step", "flax.linen", rtol=1e-4, atol=1e-5)
def linen_cnn_train_step(size):
    from flax import linen as nn

    features, hidden = sized(size, small=(4, 16), large=(32, 256))

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.Conv(features=features, kernel_size=(3, 3))(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
            x = x.reshape((x.shape[0], -1))
            x = nn.Dense(features=hidden)(x)
            x = nn.relu(x)
            return nn.Dense(features=10)(x)

    model = CNN()
    images, labels = _images(0, size)
    return classifier_train_step(model, images, labels)



@program("linen_transformer_encoder", "flax.linen", rtol=1e-4, atol=1e-5)
def linen_transformer_encoder(size):
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    _, _, n_vocab, width, n_heads = _encoder_shape(size)

    class EncoderLayer(nn.Module):
        dim: int = 16
        heads: int = n_heads
        rate: float = 0.1

        @nn.compact
        def __call__(self, x, mask, deterministic):
            y = nn.LayerNorm()(x)
            y = nn.MultiHeadDotProductAttention(
                num_heads=self.heads, dropout_rate=self.rate, deterministic=deterministic)(
                y, y, mask=mask)
            x = x + nn.Dropout(self.rate, deterministic=deterministic)(y)
            y = nn.LayerNorm()(x)
            y = nn.Dense(2 * self.dim)(y)
            y = nn.gelu(y)
            y = nn.Dense(self.dim)(y)
            return x + nn.Dropout(self.rate, deterministic=deterministic)(y)

    class Encoder(nn.Module):
        vocab: int = n_vocab
        dim: int = width

        @nn.compact
        def __call__(self, tokens, deterministic=True):
            mask = nn.make_attention_mask(tokens > 0, tokens > 0)
            x = nn.Embed(self.vocab, self.dim)(tokens)
            x = x + self.param("pos", nn.initializers.normal(0.02), (1, tokens.shape[1], self.dim))
            for _ in range(2):
                x = EncoderLayer(self.dim)(x, mask, deterministic)
            return nn.LayerNorm()(x).mean(axis=1)

    model = Encoder()
    tokens = _tokens(1, size)
    params = model.init(jax.random.key(1), tokens)["params"]

    def train_loss_and_grad(params, tokens, dropout_key):
        def loss_fn(params):
            out = model.apply({"params": params}, tokens, deterministic=False,
                              rngs={"dropout": dropout_key})
            return jnp.sum(out ** 2)

        return jax.value_and_grad(loss_fn)(params)

    return train_loss_and_grad, (params, tokens, jax.random.key(2))


@program("linen_batchnorm_state", "flax.linen", rtol=1e-4, atol=1e-5)
def linen_batchnorm_state(size):
    import jax
    import optax
    from flax import linen as nn

    features = sized(size, small=4, large=32)

    class Net(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(features, (3, 3))(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.relu(x)
            x = x.mean(axis=(1, 2))
            return nn.Dense(10)(x)

    model = Net()
    images, labels = _images(2, size, channels=sized(size, small=1, large=3))
    variables = model.init(jax.random.key(3), images, train=False)
    tx = optax.sgd(0.1)

    def train_step(params, batch_stats, opt_state, images, labels):
        def loss_fn(params):
            logits, updates = model.apply({"params": params, "batch_stats": batch_stats},
                                          images, train=True, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
            return loss, updates["batch_stats"]

        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state)
        params = optax.apply_updates(params, updates)
        eval_logits = model.apply({"params": params, "batch_stats": batch_stats}, images,
                                  train=False)
        return params, batch_stats, opt_state, loss, eval_logits

    params = variables["params"]
    return train_step, (params, variables["batch_stats"], tx.init(params), images, labels)


# --- nnx ---------------------------------------------------------------------


def _nnx_step(model, optimizer, loss_fn):
    """The pure step of nnx's functional API: merge, step, split."""
    from flax import nnx

    graphdef, state = nnx.split((model, optimizer))

    def step(state, *batch):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(loss_fn)(model, *batch)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, state


@program("nnx_cnn_train_step", "flax.nnx", rtol=1e-4, atol=1e-5)
def nnx_cnn_train_step(size):
    import optax
    from flax import nnx

    features, hidden = sized(size, small=(4, 16), large=(32, 256))
    pooled = sized(size, small=4, large=14) ** 2 * features

    class CNN(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            self.conv = nnx.Conv(1, features, kernel_size=(3, 3), rngs=rngs)
            self.linear1 = nnx.Linear(pooled, hidden, rngs=rngs)
            self.linear2 = nnx.Linear(hidden, 10, rngs=rngs)

        def __call__(self, x):
            x = nnx.avg_pool(nnx.relu(self.conv(x)), window_shape=(2, 2), strides=(2, 2))
            x = x.reshape(x.shape[0], -1)
            return self.linear2(nnx.relu(self.linear1(x)))

    model = CNN(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3, 0.9), wrt=nnx.Param)

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    step, state = _nnx_step(model, optimizer, loss_fn)
    return step, (state, *_images(4, size))


@program("nnx_transformer_encoder", "flax.nnx", rtol=1e-4, atol=1e-5)
def nnx_transformer_encoder(size):
    import jax.numpy as jnp
    import optax
    from flax import nnx

    batch, _, vocab, dim, heads = _encoder_shape(size)

    class EncoderLayer(nnx.Module):
        def __init__(self, dim, heads, rate, *, rngs: nnx.Rngs):
            self.norm1 = nnx.LayerNorm(dim, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=heads, in_features=dim,
                                               dropout_rate=rate, decode=False, rngs=rngs)
            self.norm2 = nnx.LayerNorm(dim, rngs=rngs)
            self.up = nnx.Linear(dim, 2 * dim, rngs=rngs)
            self.down = nnx.Linear(2 * dim, dim, rngs=rngs)
            self.dropout = nnx.Dropout(rate, rngs=rngs)

        def __call__(self, x, mask):
            x = x + self.dropout(self.attn(self.norm1(x), mask=mask))
            return x + self.dropout(self.down(nnx.gelu(self.up(self.norm2(x)))))

    class Encoder(nnx.Module):
        def __init__(self, vocab, dim, *, rngs: nnx.Rngs):
            self.embed = nnx.Embed(vocab, dim, rngs=rngs)
            self.layers = nnx.List([EncoderLayer(dim, heads, 0.1, rngs=rngs) for _ in range(2)])
            self.head = nnx.Linear(dim, 1, rngs=rngs)

        def __call__(self, tokens):
            mask = nnx.make_attention_mask(tokens > 0, tokens > 0)
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x, mask)
            return self.head(x.mean(axis=1))[:, 0]

    model = Encoder(vocab, dim, rngs=nnx.Rngs(params=0, dropout=1))
    model.train()  # dropout on: it draws from the model's dropout Rngs state
    # Not adam: the attention key bias's gradient is zero up to rounding
    # (softmax ignores a per-query constant), and adam's first step turns
    # that noise into +-lr, so any rounding difference flips its sign.
    optimizer = nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)

    def loss_fn(model, tokens, targets):
        return jnp.mean((model(tokens) - targets) ** 2)

    step, state = _nnx_step(model, optimizer, loss_fn)
    targets = jnp.asarray(np.linspace(0.5, -1.0, batch), jnp.float32)
    return step, (state, _tokens(5, size), targets)


@program("nnx_batchnorm_state", "flax.nnx", rtol=1e-4, atol=1e-5)
def nnx_batchnorm_state(size):
    import optax
    from flax import nnx

    n, features, width = sized(size, small=(16, 8, 16), large=(256, 64, 256))

    class Net(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            self.linear = nnx.Linear(features, width, rngs=rngs)
            self.bn = nnx.BatchNorm(width, momentum=0.9, rngs=rngs)
            self.out = nnx.Linear(width, 1, rngs=rngs)  # a one-unit output layer

        def __call__(self, x):
            return self.out(nnx.relu(self.bn(self.linear(x))))

    model = Net(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    def loss_fn(model, x, y):
        return ((model(x) - y) ** 2).mean()

    step, state = _nnx_step(model, optimizer, loss_fn)
    rng = np.random.default_rng(6)
    x = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.normal(size=(n, 1)).astype(np.float32)
    return step, (state, x, y)
