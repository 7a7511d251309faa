"""Programs at the sizes people run (issue 52), as each library's docs write
them: mid-size programs whose "small" size is already past toy sizes (a
board game rolled out for 32 games, an L-BFGS solve, a ViT, normalizing
flows, grouped-query attention, LSTM and GRU scans, a neural ODE, molecular
dynamics, Sinkhorn, an nnx MLP, a Gaussian process, a ResNet), then plain
large work (a sort of 1M, an elementwise chain of 16M, a softmax of 4096^2,
a CIFAR convnet, a transformer block, a wide MLP, a matmul), and patterns
the tier had not tried (FFT filtering, 1-D convolutions over audio,
per-example gradients, nearest neighbours by top-k).
"""

from __future__ import annotations

import numpy as np

from tests.programs.flax_programs import classifier_train_step
from tests.programs.registry import program, sized

F32 = np.float32


def _normal(rng, *shape, scale=1.0):
    return (scale * rng.normal(size=shape)).astype(F32)


# --- mid-size programs ---------------------------------------------------------------


@program("pgx_connect_four_rollout", "pgx", rtol=1e-5, atol=1e-6)
def pgx_connect_four_rollout(size):
    import jax
    import jax.numpy as jnp
    import pgx

    # pgx's README: environments batched by `jax.vmap(env.init)` and
    # `jax.vmap(env.step)`, random legal moves, a whole game (42 plies) in a
    # `lax.scan`; the rewards and the final boards.
    env = pgx.make("connect_four")
    games = sized(size, small=32, large=1024)

    def rollout(key):
        init_key, play_key = jax.random.split(key)
        state = jax.vmap(env.init)(jax.random.split(init_key, games))

        def ply(state, key):
            logits = jnp.where(state.legal_action_mask, 0.0, -jnp.inf)
            action = jax.random.categorical(key, logits, axis=-1)
            state = jax.vmap(env.step)(state, action)
            return state, state.rewards

        state, rewards = jax.lax.scan(ply, state, jax.random.split(play_key, 42))
        return rewards.sum(0), state.terminated, state.observation

    return rollout, (jax.random.key(0),)


@program("optax_lbfgs_solve", "optax", rtol=1e-3, atol=1e-4)
def optax_lbfgs_solve(size):
    import jax
    import jax.numpy as jnp
    import optax
    import optax.tree_utils as otu

    # optax's "L-BFGS" guide: `optax.lbfgs` with its zoom line search,
    # `value_and_grad_from_state`, iterated in a `while_loop` until the
    # gradient's norm is small; here an l2-regularised logistic regression.
    n, d = sized(size, small=(512, 64), large=(4096, 512))
    rng = np.random.default_rng(0)
    x = _normal(rng, n, d)
    y = (x @ rng.normal(size=d) + rng.normal(size=n) > 0).astype(F32)

    def loss(w, x, y):
        logits = x @ w
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, y)) + 1e-3 * jnp.sum(w * w)

    def solve(w0, x, y):
        fn = lambda w: loss(w, x, y)  # noqa: E731
        opt = optax.lbfgs()
        value_and_grad = optax.value_and_grad_from_state(fn)

        def step(carry):
            w, state = carry
            value, grad = value_and_grad(w, state=state)
            updates, state = opt.update(grad, state, w, value=value, grad=grad, value_fn=fn)
            return optax.apply_updates(w, updates), state

        def continuing(carry):
            _, state = carry
            count = otu.tree_get(state, "count")
            err = otu.tree_norm(otu.tree_get(state, "grad"))
            return (count == 0) | ((count < 50) & (err >= 1e-4))

        w, state = jax.lax.while_loop(continuing, step, (w0, opt.init(w0)))
        return w, fn(w), otu.tree_get(state, "count")

    return solve, (np.zeros(d, F32), x, y)


@program("eqx_vit_einops_step", "equinox", rtol=1e-4, atol=1e-5)
def eqx_vit_einops_step(size):
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
    from einops import rearrange

    # equinox's Vision Transformer example: patches by `einops.rearrange`
    # and a linear embedding, a class token, pre-norm blocks of
    # `eqx.nn.MultiheadAttention` and an MLP, vmapped over the batch; one
    # adam step of `eqx.filter_value_and_grad`.
    batch, side, patch, dim, heads, blocks = sized(size, small=(8, 32, 4, 64, 4, 2),
                                                   large=(16, 32, 4, 256, 8, 2))
    keys = iter(jax.random.split(jax.random.key(0), 4 + 4 * blocks))
    tokens = (side // patch) ** 2

    class Block(eqx.Module):
        norm1: eqx.nn.LayerNorm
        attention: eqx.nn.MultiheadAttention
        norm2: eqx.nn.LayerNorm
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __init__(self):
            self.norm1, self.norm2 = eqx.nn.LayerNorm(dim), eqx.nn.LayerNorm(dim)
            self.attention = eqx.nn.MultiheadAttention(heads, dim, key=next(keys))
            self.up = eqx.nn.Linear(dim, 2 * dim, key=next(keys))
            self.down = eqx.nn.Linear(2 * dim, dim, key=next(keys))

        def __call__(self, x):
            y = jax.vmap(self.norm1)(x)
            x = x + self.attention(y, y, y)
            y = jax.vmap(self.norm2)(x)
            return x + jax.vmap(self.down)(jax.nn.gelu(jax.vmap(self.up)(y)))

    class ViT(eqx.Module):
        embed: eqx.nn.Linear
        cls: jax.Array
        pos: jax.Array
        blocks: list
        norm: eqx.nn.LayerNorm
        head: eqx.nn.Linear

        def __init__(self):
            self.embed = eqx.nn.Linear(patch * patch * 3, dim, key=next(keys))
            self.cls = jax.random.normal(next(keys), (1, dim))
            self.pos = 0.02 * jax.random.normal(next(keys), (tokens + 1, dim))
            self.blocks = [Block() for _ in range(blocks)]
            self.norm = eqx.nn.LayerNorm(dim)
            self.head = eqx.nn.Linear(dim, 10, key=next(keys))

        def __call__(self, image):
            x = rearrange(image, "c (h ph) (w pw) -> (h w) (ph pw c)", ph=patch, pw=patch)
            x = jnp.concatenate([self.cls, jax.vmap(self.embed)(x)]) + self.pos
            for block in self.blocks:
                x = block(x)
            return self.head(self.norm(x[0]))

    model = ViT()
    optim = optax.adamw(1e-3)
    params, static = eqx.partition(model, eqx.is_array)

    @eqx.filter_value_and_grad
    def loss(model, images, labels):
        logits = jax.vmap(model)(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(params, opt_state, images, labels):
        value, grads = loss(eqx.combine(params, static), images, labels)
        updates, opt_state = optim.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    rng = np.random.default_rng(1)
    images = _normal(rng, batch, 3, side, side)  # equinox is channels-first
    labels = rng.integers(0, 10, size=batch).astype(np.int32)
    return step, (params, optim.init(params), images, labels)


def _flowjax_fit_step(flow, data):
    """flowjax's `fit_to_data` loop body: one adam step on the negative
    log-likelihood of the trainable part of `flow` (paramax's `unwrap`)."""
    import equinox as eqx
    import jax.numpy as jnp
    import optax
    import paramax

    params, static = eqx.partition(flow, eqx.is_inexact_array,
                                   is_leaf=lambda leaf: isinstance(leaf, paramax.NonTrainable))
    optimizer = optax.adam(1e-3)

    def loss(params, x):
        dist = paramax.unwrap(eqx.combine(params, static))
        return -jnp.mean(dist.log_prob(x))

    def step(params, opt_state, x):
        value, grads = eqx.filter_value_and_grad(loss)(params, x)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, value

    return step, (params, optimizer.init(params), data)


@program("flowjax_masked_autoregressive_flow", "flowjax", rtol=1e-4, atol=1e-5)
def flowjax_masked_autoregressive_flow(size):
    import jax
    from flowjax.bijections import RationalQuadraticSpline
    from flowjax.distributions import Normal
    from flowjax.flows import masked_autoregressive_flow

    # flowjax's docs: a masked autoregressive flow of rational-quadratic
    # splines over a standard normal, fitted by maximum likelihood.
    dim, width, batch = sized(size, small=(8, 64, 256), large=(32, 256, 512))
    flow = masked_autoregressive_flow(
        jax.random.key(0), base_dist=Normal(np.zeros(dim, F32)),
        transformer=RationalQuadraticSpline(knots=8, interval=4), flow_layers=4, nn_width=width)
    data = np.random.default_rng(2).standard_t(5.0, size=(batch, dim)).astype(F32)
    return _flowjax_fit_step(flow, data)


@program("flowjax_coupling_flow", "flowjax", rtol=1e-4, atol=1e-5)
def flowjax_coupling_flow(size):
    import jax
    from flowjax.bijections import Affine
    from flowjax.distributions import Normal
    from flowjax.flows import coupling_flow

    # flowjax's docs: a RealNVP-style coupling flow (affine transformers,
    # MLP conditioners), fitted by maximum likelihood.
    dim, width, batch = sized(size, small=(16, 64, 256), large=(64, 256, 1024))
    flow = coupling_flow(jax.random.key(1), base_dist=Normal(np.zeros(dim, F32)),
                         transformer=Affine(), flow_layers=4, nn_width=width, nn_depth=2)
    data = np.random.default_rng(3).gamma(2.0, size=(batch, dim)).astype(F32)
    return _flowjax_fit_step(flow, data)


@program("llama_attention_rope_gqa_grad", "jax", rtol=1e-4, atol=1e-5)
def llama_attention_rope_gqa_grad(size):
    import jax
    import jax.numpy as jnp

    # A llama-style attention layer: RMSNorm, rotary position embeddings,
    # grouped-query attention by `jax.nn.dot_product_attention(is_causal=True)`
    # and the gradient of a loss with respect to its weights.
    batch, length, dim, q_heads, kv_heads = sized(size, small=(4, 48, 128, 8, 2),
                                                  large=(4, 256, 256, 8, 2))
    head_dim = dim // q_heads
    rng = np.random.default_rng(4)
    params = {"norm": np.ones(dim, F32),
              "wq": _normal(rng, dim, q_heads * head_dim, scale=dim ** -0.5),
              "wk": _normal(rng, dim, kv_heads * head_dim, scale=dim ** -0.5),
              "wv": _normal(rng, dim, kv_heads * head_dim, scale=dim ** -0.5),
              "wo": _normal(rng, q_heads * head_dim, dim, scale=dim ** -0.5)}
    x = _normal(rng, batch, length, dim)

    def rope(t):
        half = head_dim // 2
        freqs = 1.0 / (10000.0 ** (jnp.arange(half) / half))
        angles = jnp.arange(length)[:, None] * freqs[None, :]
        cos, sin = jnp.cos(angles)[None, :, None, :], jnp.sin(angles)[None, :, None, :]
        t1, t2 = t[..., :half], t[..., half:]
        return jnp.concatenate([t1 * cos - t2 * sin, t1 * sin + t2 * cos], axis=-1)

    def layer(params, x):
        h = x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * params["norm"]
        q = rope((h @ params["wq"]).reshape(batch, length, q_heads, head_dim))
        k = rope((h @ params["wk"]).reshape(batch, length, kv_heads, head_dim))
        v = (h @ params["wv"]).reshape(batch, length, kv_heads, head_dim)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return x + out.reshape(batch, length, dim) @ params["wo"]

    def loss(params, x):
        return jnp.mean(layer(params, x) ** 2)

    return jax.value_and_grad(loss), (params, x)


@program("flax_lstm_scan_grad", "flax.linen", rtol=1e-4, atol=1e-5)
def flax_lstm_scan_grad(size):
    import jax
    import jax.numpy as jnp
    from flax import linen as nn

    # flax's `nn.RNN` over an `nn.OptimizedLSTMCell` (a `scan` over time),
    # a dense head on every step, the gradient of a regression loss.
    batch, steps, features, hidden = sized(size, small=(16, 64, 32, 256),
                                           large=(8, 256, 32, 256))

    class Model(nn.Module):
        @nn.compact
        def __call__(self, x):
            y = nn.RNN(nn.OptimizedLSTMCell(hidden))(x)
            return nn.Dense(1)(y)[..., 0]

    model = Model()
    rng = np.random.default_rng(5)
    x = _normal(rng, batch, steps, features)
    target = _normal(rng, batch, steps)
    params = model.init(jax.random.key(0), x)

    def loss(params, x, target):
        return jnp.mean((model.apply(params, x) - target) ** 2)

    return jax.value_and_grad(loss), (params, x, target)


@program("haiku_gru_dynamic_unroll", "dm-haiku", rtol=1e-4, atol=1e-5)
def haiku_gru_dynamic_unroll(size):
    import haiku as hk
    import jax
    import jax.numpy as jnp
    import optax

    # haiku's recurrent docs: `hk.GRU` unrolled by `hk.dynamic_unroll` (time
    # major), a linear read-out of the last state; one adam step.
    batch, steps, features, hidden = sized(size, small=(32, 32, 16, 128),
                                           large=(8, 256, 16, 256))

    def forward(x):
        core = hk.GRU(hidden)
        outputs, _ = hk.dynamic_unroll(core, x, core.initial_state(x.shape[1]))
        return hk.Linear(1)(outputs[-1])[:, 0]

    model = hk.without_apply_rng(hk.transform(forward))
    rng = np.random.default_rng(6)
    x = _normal(rng, steps, batch, features)
    y = _normal(rng, batch)
    params = model.init(jax.random.key(0), x)
    tx = optax.adam(1e-3)

    def step(params, opt_state, x, y):
        value, grads = jax.value_and_grad(
            lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, value

    return step, (params, tx.init(params), x, y)


@program("diffrax_neural_ode_grad", "diffrax", rtol=1e-3, atol=1e-4)
def diffrax_neural_ode_grad(size):
    import diffrax
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    # diffrax's "Neural ODE" example: an MLP vector field, Tsit5 with a PID
    # step-size controller, solved for a batch of initial states (vmap) and
    # saved at the data's times; the loss's value and gradient.
    batch, times, width = sized(size, small=(32, 32, 64), large=(128, 32, 256))

    class Func(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, t, y, args):
            return self.mlp(y)

    func = Func(eqx.nn.MLP(2, 2, width, depth=2, activation=jax.nn.softplus,
                           final_activation=jax.nn.tanh, key=jax.random.key(0)))
    params, static = eqx.partition(func, eqx.is_array)
    ts = np.linspace(0.0, 5.0, times, dtype=F32)
    rng = np.random.default_rng(7)
    y0 = rng.uniform(-0.6, 1.0, size=(batch, 2)).astype(F32)
    data = (y0[:, None, :] * np.cos(ts)[None, :, None]).astype(F32)

    def solve(params, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(eqx.combine(params, static)), diffrax.Tsit5(), t0=ts[0], t1=ts[-1],
            dt0=ts[1] - ts[0], y0=y0, saveat=diffrax.SaveAt(ts=ts),
            stepsize_controller=diffrax.PIDController(rtol=1e-3, atol=1e-6))
        return sol.ys

    def loss(params, y0, data):
        return jnp.mean((jax.vmap(solve, in_axes=(None, 0))(params, y0) - data) ** 2)

    return jax.value_and_grad(loss), (params, y0, data)


@program("jax_md_soft_sphere_nve", "jax-md", rtol=1e-3, atol=1e-4)
def jax_md_soft_sphere_nve(size):
    import jax
    from jax_md import energy, quantity, simulate, space

    # jax-md's README: particles in a periodic box with a soft-sphere pair
    # potential, integrated at constant energy (`simulate.nve`, velocity
    # Verlet) for 100 steps of `lax.fori_loop`; the energies and positions.
    particles = sized(size, small=128, large=1024)
    box = float(np.sqrt(particles / 1.2))  # 2-D, density 1.2
    displacement, shift = space.periodic(box)
    energy_fn = energy.soft_sphere_pair(displacement)
    init, apply = simulate.nve(energy_fn, shift, dt=1e-3)

    def run(positions, key):
        state = init(key, positions, kT=0.1)
        state = jax.lax.fori_loop(0, 100, lambda i, s: apply(s), state)
        return (state.position, energy_fn(state.position),
                quantity.kinetic_energy(momentum=state.momentum, mass=state.mass))

    # a lattice with a little noise: no overlapping pairs to start with
    per_side = int(np.ceil(np.sqrt(particles)))
    grid = np.stack(np.meshgrid(np.arange(per_side), np.arange(per_side)), -1).reshape(-1, 2)
    rng = np.random.default_rng(8)
    positions = ((grid[:particles] + 0.1 * rng.normal(size=(particles, 2)))
                 * box / per_side % box).astype(F32)
    return run, (positions, jax.random.key(0))


@program("sinkhorn_log_domain", "jax", rtol=1e-4, atol=1e-5)
def sinkhorn_log_domain(size):
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import logsumexp

    # Entropic optimal transport as POT's and the OT tutorials write it in
    # jax: log-domain Sinkhorn updates of the dual potentials for a fixed
    # number of iterations (`lax.fori_loop`), then the plan and its cost.
    n, m = sized(size, small=(256, 256), large=(1024, 1024))
    rng = np.random.default_rng(9)
    x, y = _normal(rng, n, 3), _normal(rng, m, 3) + F32(1.0)

    def sinkhorn(x, y, epsilon=0.1):
        cost = jnp.sum((x[:, None, :] - y[None, :, :]) ** 2, -1)
        log_a, log_b = -jnp.log(n) * jnp.ones(n), -jnp.log(m) * jnp.ones(m)

        def update(i, fg):
            f, g = fg
            f = -epsilon * logsumexp((g[None, :] - cost) / epsilon + log_b[None, :], axis=1)
            g = -epsilon * logsumexp((f[:, None] - cost) / epsilon + log_a[:, None], axis=0)
            return f, g

        f, g = jax.lax.fori_loop(0, 100, update, (jnp.zeros(n), jnp.zeros(m)))
        plan = jnp.exp((f[:, None] + g[None, :] - cost) / epsilon + log_a[:, None]
                       + log_b[None, :])
        return jnp.sum(plan * cost), plan.sum(0), f

    return sinkhorn, (x, y)


# atol 5e-4 (half adamw's lr): its first step moves each weight by
# lr * g / (|g| + eps), which summation order moves by up to lr where |g|
# is near eps (large: 3 of 802,816 first-layer and 3 of 1,048,576
# second-layer weights beyond 1e-4, at most 1.6e-4; a wrong update is 2 lr
# off). jax.jit's float64 run draws other dropout bits: it cannot judge.
@program("nnx_mlp_dropout_train_step", "flax.nnx", rtol=1e-4, atol=5e-4)
def nnx_mlp_dropout_train_step(size):
    import optax
    from flax import nnx

    from tests.programs.flax_programs import _nnx_step

    # flax nnx's MNIST-style MLP: Linear, BatchNorm, Dropout, with
    # `nnx.Optimizer(adamw)`; one train step through nnx's functional API.
    batch, width = sized(size, small=(64, 256), large=(256, 1024))

    class MLP(nnx.Module):
        def __init__(self, *, rngs: nnx.Rngs):
            # no bias before BatchNorm (which removes it): its gradient is 0
            # up to rounding, which adamw divides by its own size, so its
            # update is the rounding's sign (jax.jit's float32 and float64
            # runs disagree as much as juju's does): nothing to compare
            self.linear1 = nnx.Linear(784, width, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(width, rngs=rngs)
            self.dropout = nnx.Dropout(0.2, rngs=rngs)
            self.linear2 = nnx.Linear(width, width, rngs=rngs)
            self.linear3 = nnx.Linear(width, 10, rngs=rngs)

        def __call__(self, x):
            x = self.dropout(nnx.relu(self.bn(self.linear1(x))))
            return self.linear3(nnx.relu(self.linear2(x)))

    model = MLP(rngs=nnx.Rngs(params=0, dropout=1))
    model.train()
    optimizer = nnx.Optimizer(model, optax.adamw(1e-3), wrt=nnx.Param)

    def loss_fn(model, images, labels):
        logits = model(images)
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    step, state = _nnx_step(model, optimizer, loss_fn)
    rng = np.random.default_rng(10)
    images = rng.uniform(size=(batch, 784)).astype(F32)
    labels = rng.integers(0, 10, size=batch).astype(np.int32)
    return step, (state, images, labels)


@program("gp_regression_cholesky", "jax.scipy", rtol=1e-3, atol=1e-4)
def gp_regression_cholesky(size):
    import jax.numpy as jnp
    import jax.scipy.linalg as jsl

    # Gaussian-process regression as the GP tutorials write it in jax: an
    # RBF kernel matrix, `cho_factor`, `cho_solve` for the weights and
    # `solve_triangular` for the predictive variance, the log marginal
    # likelihood from the factor's diagonal.
    n, tests = sized(size, small=(512, 128), large=(2048, 512))
    rng = np.random.default_rng(11)
    x = np.sort(rng.uniform(-3, 3, size=n)).astype(F32)
    y = (np.sin(2 * x) + 0.1 * rng.normal(size=n)).astype(F32)
    xs = np.linspace(-3, 3, tests, dtype=F32)

    def rbf(a, b, length=0.5):
        return jnp.exp(-0.5 * (a[:, None] - b[None, :]) ** 2 / length ** 2)

    def predict(x, y, xs):
        k = rbf(x, x) + 0.01 * jnp.eye(n)
        factor = jsl.cho_factor(k, lower=True)
        alpha = jsl.cho_solve(factor, y)
        k_star = rbf(x, xs)
        mean = k_star.T @ alpha
        v = jsl.solve_triangular(factor[0], k_star, lower=True)
        variance = 1.0 - jnp.sum(v * v, axis=0)
        log_likelihood = (-0.5 * y @ alpha - jnp.sum(jnp.log(jnp.diag(factor[0])))
                          - 0.5 * n * jnp.log(2 * jnp.pi))
        return mean, variance, log_likelihood

    return predict, (x, y, xs)


@program("haiku_resnet_train_step", "dm-haiku", rtol=1e-4, atol=1e-5)
def haiku_resnet_train_step(size):
    import haiku as hk
    import jax
    import optax

    # haiku's `hk.nets.ResNet` (basic blocks, one per group, a CIFAR-width
    # stack) with BatchNorm state, `hk.transform_with_state`, one SGD step
    # with momentum, as haiku's ImageNet example trains it.
    batch = sized(size, small=16, large=128)

    def forward(x, is_training):
        net = hk.nets.ResNet(blocks_per_group=(1, 1, 1, 1), num_classes=10, bottleneck=False,
                             channels_per_group=(32, 64, 128, 256),
                             # the stem's 64 channels meet the first group's 32
                             use_projection=(True, True, True, True))
        return net(x, is_training=is_training)

    model = hk.transform_with_state(forward)
    rng = np.random.default_rng(12)
    x = _normal(rng, batch, 32, 32, 3)
    labels = rng.integers(0, 10, size=batch).astype(np.int32)
    params, state = model.init(jax.random.key(0), x, is_training=True)
    tx = optax.sgd(0.1, momentum=0.9)

    def train_step(params, state, opt_state, x, labels):
        def loss_fn(params, state):
            logits, state = model.apply(params, state, None, x, is_training=True)
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, state)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return train_step, (params, state, tx.init(params), x, labels)


# --- large work ----------------------------------------------------------------------


@program("sort_1m", "jax", rtol=0, atol=0)
def sort_1m(size):
    import jax.numpy as jnp

    # A sort and an argsort of a long vector, and its quantiles.
    n = sized(size, small=4096, large=1 << 20)

    def sort(x):
        order = jnp.argsort(x)
        return jnp.sort(x), order, x[order[jnp.asarray([n // 4, n // 2, 3 * n // 4])]]

    return sort, (_normal(np.random.default_rng(13), n),)


@program("elementwise_chain_16m", "jax", rtol=1e-5, atol=1e-6)
def elementwise_chain_16m(size):
    import jax
    import jax.numpy as jnp

    # A long elementwise expression over a big array (an activation's
    # forward and a schedule's arithmetic), as in a custom activation.
    n = sized(size, small=1 << 16, large=1 << 24)

    def chain(x, y):
        z = jnp.tanh(x) * jax.nn.sigmoid(y) + 0.5 * x * x
        z = jnp.where(z > 1.0, jnp.log1p(z), z - jnp.exp(-y * y))
        return z * 0.9 + jnp.abs(y) ** 1.5

    rng = np.random.default_rng(14)
    return chain, (_normal(rng, n), _normal(rng, n))


@program("softmax_4096", "jax", rtol=1e-5, atol=1e-7)
def softmax_4096(size):
    import jax

    # `jax.nn.softmax` over the rows of a square matrix of logits.
    n = sized(size, small=256, large=4096)
    return (lambda x: jax.nn.softmax(x, axis=-1)), (_normal(np.random.default_rng(15), n, n),)


@program("cifar_convnet_train_step", "flax.linen", rtol=1e-4, atol=1e-5)
def cifar_convnet_train_step(size):
    from flax import linen as nn

    # flax's CNN tutorial model on CIFAR-size images (32x32x3): two
    # convolutions with pooling, two dense layers, one adam step.
    batch = sized(size, small=8, large=128)

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), strides=(2, 2))
            x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), strides=(2, 2))
            x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
            return nn.Dense(10)(x)

    rng = np.random.default_rng(16)
    images = _normal(rng, batch, 32, 32, 3)
    labels = rng.integers(0, 10, size=batch).astype(np.int32)
    return classifier_train_step(CNN(), images, labels)


@program("transformer_block_grad", "jax", rtol=1e-4, atol=1e-5)
def transformer_block_grad(size):
    import jax
    import jax.numpy as jnp

    # A pre-norm transformer block in plain jax (causal attention with 8
    # heads, layer norms, a gelu MLP) and the gradient of a loss with
    # respect to its weights.
    batch, length, dim = sized(size, small=(2, 32, 64), large=(4, 256, 256))
    heads = 8
    rng = np.random.default_rng(17)
    params = {name: _normal(rng, *shape, scale=shape[0] ** -0.5) for name, shape in
              [("wq", (dim, dim)), ("wk", (dim, dim)), ("wv", (dim, dim)), ("wo", (dim, dim)),
               ("w1", (dim, 4 * dim)), ("w2", (4 * dim, dim))]}
    x = _normal(rng, batch, length, dim)

    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def block(p, x):
        def split(t):
            return t.reshape(batch, length, heads, dim // heads).transpose(0, 2, 1, 3)

        h = layer_norm(x)
        q, k, v = split(h @ p["wq"]), split(h @ p["wk"]), split(h @ p["wv"])
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dim // heads)
        mask = jnp.tril(jnp.ones((length, length), bool))
        attended = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1) @ v
        x = x + attended.transpose(0, 2, 1, 3).reshape(batch, length, dim) @ p["wo"]
        return x + jax.nn.gelu(layer_norm(x) @ p["w1"]) @ p["w2"]

    return jax.value_and_grad(lambda p, x: jnp.mean(block(p, x) ** 2)), (params, x)


@program("wide_mlp_adam_step", "optax", rtol=1e-4, atol=1e-5)
def wide_mlp_adam_step(size):
    import jax
    import jax.numpy as jnp
    import optax

    # An MLP classifier of three wide hidden layers in plain jax, one
    # `optax.adam` step on a batch of flattened images.
    batch, width = sized(size, small=(32, 256), large=(256, 1024))
    rng = np.random.default_rng(18)
    sizes = [784, width, width, width, 10]
    params = [(_normal(rng, a, b, scale=a ** -0.5), np.zeros(b, F32))
              for a, b in zip(sizes[:-1], sizes[1:])]
    images = rng.uniform(size=(batch, 784)).astype(F32)
    labels = rng.integers(0, 10, size=batch).astype(np.int32)
    tx = optax.adam(1e-3)

    def loss(params, images, labels):
        x = images
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        logits = x @ params[-1][0] + params[-1][1]
        return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

    def step(params, opt_state, images, labels):
        value, grads = jax.value_and_grad(loss)(params, images, labels)
        updates, opt_state = tx.update(grads, opt_state)
        return optax.apply_updates(params, updates), opt_state, jnp.asarray(value)

    return step, (params, tx.init(params), images, labels)


@program("matmul_1024", "jax", rtol=1e-4, atol=1e-4)
def matmul_1024(size):
    import jax.numpy as jnp

    # A plain square matrix product.
    n = sized(size, small=128, large=1024)
    rng = np.random.default_rng(19)
    return jnp.matmul, (_normal(rng, n, n), _normal(rng, n, n))


# --- patterns the tier had not tried ----------------------------------------------------


@program("fft_lowpass_filter", "jax.numpy.fft", rtol=1e-4, atol=1e-4)
def fft_lowpass_filter(size):
    import jax.numpy as jnp

    # Signal processing with `jnp.fft`: the real FFT of a batch of signals,
    # a low-pass filter in the frequency domain, the inverse real FFT, and
    # the power spectrum.
    signals, samples = sized(size, small=(4, 64), large=(16, 16384))
    rng = np.random.default_rng(20)
    t = np.arange(samples) / samples
    x = (np.sin(2 * np.pi * 5 * t) + 0.5 * rng.normal(size=(signals, samples))).astype(F32)

    def lowpass(x):
        spectrum = jnp.fft.rfft(x, axis=-1)
        keep = jnp.arange(spectrum.shape[-1]) < samples // 8
        smooth = jnp.fft.irfft(jnp.where(keep, spectrum, 0), n=samples, axis=-1)
        return smooth, jnp.abs(spectrum) ** 2 / samples

    return lowpass, (x,)


@program("flax_conv1d_audio_encoder", "flax.linen", rtol=1e-4, atol=1e-5)
def flax_conv1d_audio_encoder(size):
    import jax
    from flax import linen as nn

    # A wav2vec-style feature encoder: strided 1-D convolutions with gelu
    # and a layer norm over raw audio, mean-pooled; its forward pass.
    batch, samples = sized(size, small=(2, 1024), large=(16, 16384))

    class Encoder(nn.Module):
        @nn.compact
        def __call__(self, audio):
            x = audio[..., None]
            for features, kernel, stride in ((64, 10, 5), (64, 3, 2), (64, 3, 2), (128, 2, 2)):
                x = nn.gelu(nn.Conv(features, (kernel,), strides=(stride,), padding="VALID")(x))
            return nn.LayerNorm()(x).mean(axis=1)

    model = Encoder()
    audio = _normal(np.random.default_rng(21), batch, samples)
    params = model.init(jax.random.key(0), audio)
    return model.apply, (params, audio)


@program("dp_sgd_per_example_grads", "jax", rtol=1e-4, atol=1e-5)
def dp_sgd_per_example_grads(size):
    import jax
    import jax.numpy as jnp

    # DP-SGD as the jax docs' per-example gradients write it: `jax.vmap`
    # of `jax.grad` over the batch, each example's gradient clipped to a
    # norm, summed, noised with Gaussian noise and applied.
    batch, features, width = sized(size, small=(16, 16, 32), large=(256, 64, 256))
    rng = np.random.default_rng(22)
    params = {"w1": _normal(rng, features, width, scale=features ** -0.5),
              "w2": _normal(rng, width, 1, scale=width ** -0.5)}
    x, y = _normal(rng, batch, features), _normal(rng, batch)

    def loss(params, x, y):
        return (jnp.tanh(x @ params["w1"]) @ params["w2"])[0] - y

    def dp_step(params, x, y, key, clip=1.0, sigma=0.5, lr=0.1):
        grads = jax.vmap(jax.grad(lambda p, x, y: loss(p, x, y) ** 2), (None, 0, 0))(params, x, y)
        norms = jnp.sqrt(sum(jnp.sum(g.reshape(batch, -1) ** 2, 1)
                             for g in jax.tree.leaves(grads)))
        factor = jnp.minimum(1.0, clip / (norms + 1e-6))
        keys = dict(zip(params, jax.random.split(key, len(params))))
        noisy = {name: (jnp.tensordot(factor, g, 1)
                        + sigma * clip * jax.random.normal(keys[name], g.shape[1:])) / batch
                 for name, g in grads.items()}
        return jax.tree.map(lambda p, g: p - lr * g, params, noisy), norms

    return dp_step, (params, x, y, jax.random.key(1))


@program("nearest_neighbours_top_k", "jax", rtol=1e-4, atol=1e-4)
def nearest_neighbours_top_k(size):
    import jax
    import jax.numpy as jnp

    # Retrieval: cosine similarity of queries against a database of
    # embeddings and the 10 nearest by `lax.top_k`.
    queries, database, dim = sized(size, small=(64, 1024, 32), large=(1024, 16384, 128))
    rng = np.random.default_rng(23)

    def search(q, db):
        q = q / jnp.linalg.norm(q, axis=-1, keepdims=True)
        db = db / jnp.linalg.norm(db, axis=-1, keepdims=True)
        scores, index = jax.lax.top_k(q @ db.T, 10)
        return scores, index

    return search, (_normal(rng, queries, dim), _normal(rng, database, dim))
