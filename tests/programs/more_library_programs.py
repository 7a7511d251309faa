"""More libraries, as their own docs and READMEs write them: a gymnax
CartPole rollout, distrax flows and mixtures, grouped-query causal
attention, greedy decoding with a KV cache, a ViT with einops in flax, an
S5-style diagonal SSM (`lax.associative_scan`), jraph graph networks, an
rlax PPO loss with GAE and an ott-jax Sinkhorn solve. Large: 256
CartPoles for 500 steps, flows and mixtures over batches of 256 and 16384,
attention, decoding and SSMs over 256+ positions of width 256, 128 graphs,
PPO over 128 trajectories of 256 steps, transport between 512 and 640
points."""

from __future__ import annotations

import numpy as np

from tests.programs.flax_programs import classifier_train_step
from tests.programs.registry import program, sized

# --- gymnax ------------------------------------------------------------------


@program("gymnax_cartpole_rollout", "gymnax", rtol=1e-4, atol=1e-5)
def gymnax_cartpole_rollout(size):
    import gymnax
    import jax
    import jax.numpy as jnp

    # gymnax's README and getting-started notebook: reset, then `lax.scan`
    # over `env.step` with the key split at every step; a linear policy
    # samples its action.
    env, env_params = gymnax.make("CartPole-v1")

    steps_in_episode = sized(size, small=50, large=500)

    def rollout(rng_input, policy_params):
        rng_reset, rng_episode = jax.random.split(rng_input)
        obs, state = env.reset(rng_reset, env_params)

        def policy_step(state_input, tmp):
            obs, state, policy_params, rng = state_input
            rng, rng_step, rng_net = jax.random.split(rng, 3)
            logits = obs @ policy_params["w"] + policy_params["b"]
            action = jax.random.categorical(rng_net, logits)
            next_obs, next_state, reward, terminated, truncated, _ = env.step(
                rng_step, state, action, env_params)
            carry = [next_obs, next_state, policy_params, rng]
            return carry, [obs, action, reward, next_obs, terminated | truncated]

        _, scan_out = jax.lax.scan(policy_step, [obs, state, policy_params, rng_episode],
                                   (), steps_in_episode)
        obs, action, reward, next_obs, done = scan_out
        return obs, action, reward, next_obs, done, jnp.sum(reward)

    rng = np.random.default_rng(0)
    policy_params = {"w": rng.normal(size=(4, 2)).astype(np.float32),
                     "b": np.zeros((2,), np.float32)}
    if size == "small":
        return rollout, (jax.random.PRNGKey(0), policy_params)
    # gymnax's README: many environments at once by `jax.vmap` over keys
    rollouts = jax.vmap(rollout, in_axes=(0, None))
    return rollouts, (jax.random.split(jax.random.PRNGKey(0), 256), policy_params)


# --- distrax -----------------------------------------------------------------


@program("distrax_coupling_flow", "distrax", rtol=1e-4, atol=1e-5)
def distrax_coupling_flow(size):
    import distrax
    import haiku as hk
    import jax
    import jax.numpy as jnp

    # distrax's examples/flow.py: masked couplings of rational-quadratic
    # splines with MLP conditioners, chained and inverted over a uniform base;
    # the loss is the negative mean log_prob of a batch.
    event_shape, num_layers, hidden_sizes, num_bins, batch_size = sized(
        size, small=((8,), 2, [16, 16], 4, 16), large=((32,), 4, [256, 256], 8, 256))

    def make_conditioner(num_bijector_params):
        return hk.Sequential([
            hk.Flatten(preserve_dims=-len(event_shape)),
            hk.nets.MLP(hidden_sizes, activate_final=True),
            # The example initializes this layer to zero (an identity flow);
            # here it keeps haiku's default so that every layer does something.
            hk.Linear(np.prod(event_shape) * num_bijector_params),
            hk.Reshape(tuple(event_shape) + (num_bijector_params,), preserve_dims=-1),
        ])

    def make_flow_model():
        mask = jnp.arange(0, np.prod(event_shape)) % 2
        mask = jnp.reshape(mask, event_shape).astype(bool)

        def bijector_fn(params):
            return distrax.RationalQuadraticSpline(params, range_min=0.0, range_max=1.0)

        layers = []
        for _ in range(num_layers):
            layers.append(distrax.MaskedCoupling(
                mask=mask, bijector=bijector_fn,
                conditioner=make_conditioner(3 * num_bins + 1)))
            mask = jnp.logical_not(mask)
        flow = distrax.Inverse(distrax.Chain(layers))
        base = distrax.Independent(
            distrax.Uniform(low=jnp.zeros(event_shape), high=jnp.ones(event_shape)),
            reinterpreted_batch_ndims=len(event_shape))
        return distrax.Transformed(base, flow)

    @hk.without_apply_rng
    @hk.transform
    def log_prob(data):
        return make_flow_model().log_prob(data)

    rng = np.random.default_rng(0)
    batch = rng.beta(2.0, 5.0, size=(batch_size, *event_shape)).astype(np.float32)
    params = log_prob.init(jax.random.PRNGKey(0), batch)

    def loss_fn(params, batch):
        return -jnp.mean(log_prob.apply(params, batch))

    def step(params, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        return loss, grads, log_prob.apply(params, batch)

    return step, (params, batch)


@program("distrax_mixture_log_prob", "distrax", rtol=1e-4, atol=1e-5)
def distrax_mixture_log_prob(size):
    import distrax
    import jax
    import jax.numpy as jnp

    # distrax's MixtureSameFamily of diagonal Gaussians: the mean negative
    # log-likelihood of a batch and its gradient (a Gaussian-mixture fit).
    rng = np.random.default_rng(1)
    components, dims, samples = sized(size, small=(3, 2, 32), large=(16, 8, 16384))
    params = {"logits": rng.normal(size=(components,)).astype(np.float32),
              "loc": rng.normal(size=(components, dims)).astype(np.float32),
              "log_scale": (0.3 * rng.normal(size=(components, dims))).astype(np.float32)}
    x = rng.normal(size=(samples, dims)).astype(np.float32)

    def nll(params, x):
        mixture = distrax.MixtureSameFamily(
            mixture_distribution=distrax.Categorical(logits=params["logits"]),
            components_distribution=distrax.MultivariateNormalDiag(
                loc=params["loc"], scale_diag=jnp.exp(params["log_scale"])))
        return -jnp.mean(mixture.log_prob(x))

    return jax.value_and_grad(nll), (params, x)


# --- jax.nn.dot_product_attention ---------------------------------------------


@program("dot_product_attention_gqa_causal", "jax", rtol=1e-4, atol=1e-5)
def dot_product_attention_gqa_causal(size):
    import jax
    import jax.numpy as jnp

    # Grouped-query attention: 4 query heads share 2 key/value heads, with a
    # causal mask; the output and the gradients of a loss over it.
    batch, length, q_heads, kv_heads, head_dim = sized(size, small=(2, 8, 4, 2, 16),
                                                       large=(8, 256, 8, 2, 64))
    rng = np.random.default_rng(2)
    q = rng.normal(size=(batch, length, q_heads, head_dim)).astype(np.float32)
    k = rng.normal(size=(batch, length, kv_heads, head_dim)).astype(np.float32)
    v = rng.normal(size=(batch, length, kv_heads, head_dim)).astype(np.float32)
    target = rng.normal(size=(batch, length, q_heads, head_dim)).astype(np.float32)

    def loss(q, k, v):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jnp.mean((out - target) ** 2), out

    def forward_and_grad(q, k, v):
        (value, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
        return value, out, grads

    return forward_and_grad, (q, k, v)


# --- greedy decoding with a KV cache -------------------------------------------


@program("kv_cache_greedy_decode", "jax", rtol=1e-4, atol=1e-5)
def kv_cache_greedy_decode(size):
    import jax
    import jax.numpy as jnp
    from jax import lax

    # A one-layer decoder generating token by token: each position's key and
    # value go into the cache with `dynamic_update_slice`, attention reads the
    # cache up to the position, the next token is the argmax of the logits
    # (the prompt's own tokens while inside the prompt).
    vocab, dim, heads, max_len, prompt_len, batch = sized(
        size, small=(32, 32, 4, 16, 4, 2), large=(1024, 256, 8, 256, 16, 8))
    head_dim = dim // heads
    rng = np.random.default_rng(3)

    def dense(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    params = {"embed": rng.normal(size=(vocab, dim)).astype(np.float32),
              "pos": (0.1 * rng.normal(size=(max_len, dim))).astype(np.float32),
              "wq": dense(dim, dim), "wk": dense(dim, dim), "wv": dense(dim, dim),
              "wo": dense(dim, dim), "w1": dense(dim, 4 * dim), "w2": dense(4 * dim, dim),
              "head": (3 * dense(dim, vocab))}
    prompt = rng.integers(0, vocab, size=(batch, prompt_len)).astype(np.int32)

    def layer_norm(x):
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def decode(params, prompt):
        tokens = lax.dynamic_update_slice(jnp.zeros((batch, max_len), jnp.int32), prompt, (0, 0))
        cache = {"k": jnp.zeros((batch, max_len, heads, head_dim)),
                 "v": jnp.zeros((batch, max_len, heads, head_dim))}

        def step(pos, carry):
            tokens, cache, logits_seen = carry
            token = lax.dynamic_slice_in_dim(tokens, pos, 1, axis=1)[:, 0]
            x = params["embed"][token] + params["pos"][pos]
            h = layer_norm(x)
            q, k, v = (
                (h @ params[w]).reshape(batch, heads, head_dim) for w in ("wq", "wk", "wv"))
            cache = {"k": lax.dynamic_update_slice(cache["k"], k[:, None], (0, pos, 0, 0)),
                     "v": lax.dynamic_update_slice(cache["v"], v[:, None], (0, pos, 0, 0))}
            scores = jnp.einsum("bhd,bthd->bht", q, cache["k"]) / np.sqrt(head_dim)
            scores = jnp.where(jnp.arange(max_len) <= pos, scores, -1e30)
            attended = jnp.einsum("bht,bthd->bhd", jax.nn.softmax(scores), cache["v"])
            x = x + attended.reshape(batch, dim) @ params["wo"]
            x = x + jax.nn.gelu(layer_norm(x) @ params["w1"]) @ params["w2"]
            logits = layer_norm(x) @ params["head"]
            greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            following = lax.dynamic_slice_in_dim(tokens, pos + 1, 1, axis=1)[:, 0]
            next_token = jnp.where(pos + 1 < prompt_len, following, greedy)
            tokens = lax.dynamic_update_slice(tokens, next_token[:, None], (0, pos + 1))
            return tokens, cache, logits_seen + jnp.max(logits, axis=-1)

        return lax.fori_loop(0, max_len - 1, step, (tokens, cache, jnp.zeros((batch,))))

    return decode, (params, prompt)


# --- einops inside flax: a tiny ViT ---------------------------------------------


@program("einops_flax_vit_train_step", "einops", rtol=1e-4, atol=1e-5)
def einops_flax_vit_train_step(size):
    from einops import einsum, rearrange, reduce
    from flax import linen as nn

    # A ViT as einops' docs and lucidrains' vit write it: patches by
    # `rearrange`, heads split and merged by `rearrange`, attention by
    # `einops.einsum`, mean pooling by `reduce`; one adam step.
    n, side, width, n_heads, head_width, mlp_width = sized(
        size, small=(4, 16, 32, 4, 8, 64), large=(32, 32, 256, 8, 32, 512))

    class Attention(nn.Module):
        heads: int = n_heads
        dim_head: int = head_width

        @nn.compact
        def __call__(self, x):
            qkv = nn.Dense(3 * self.heads * self.dim_head, use_bias=False)(x)
            q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.heads)
            dots = einsum(q, k, "b h i d, b h j d -> b h i j") * self.dim_head ** -0.5
            out = einsum(nn.softmax(dots, axis=-1), v, "b h i j, b h j d -> b h i d")
            return nn.Dense(x.shape[-1])(rearrange(out, "b h n d -> b n (h d)"))

    class ViT(nn.Module):
        patch: int = 4
        dim: int = width
        mlp_dim: int = mlp_width
        classes: int = 10

        @nn.compact
        def __call__(self, images):
            x = rearrange(images, "b (h p1) (w p2) c -> b (h w) (p1 p2 c)",
                          p1=self.patch, p2=self.patch)
            x = nn.Dense(self.dim)(nn.LayerNorm()(x))
            pos = self.param("pos_embedding", nn.initializers.normal(0.02), x.shape[1:])
            x = x + pos
            x = x + Attention()(nn.LayerNorm()(x))
            x = x + nn.Dense(self.dim)(nn.gelu(nn.Dense(self.mlp_dim)(nn.LayerNorm()(x))))
            x = reduce(x, "b n d -> b d", "mean")
            return nn.Dense(self.classes)(nn.LayerNorm()(x))

    model = ViT()
    rng = np.random.default_rng(4)
    images = rng.normal(size=(n, side, side, 3)).astype(np.float32)
    labels = rng.integers(0, 10, size=(n,)).astype(np.int32)
    return classifier_train_step(model, images, labels)


# --- an S5-style diagonal SSM by `lax.associative_scan` ---------------------------


@program("s5_ssm_associative_scan", "jax", rtol=1e-4, atol=1e-5)
def s5_ssm_associative_scan(size):
    import jax
    import jax.numpy as jnp

    # S5 (lindermanlab/S5, ssm.py): a complex diagonal state matrix
    # discretized by zero-order hold, the linear recurrence x_k = A x_{k-1} +
    # B u_k run by `associative_scan`, outputs 2 Re(C x_k) + D u_k; vmapped
    # over a batch, a regression loss and its gradient.
    length, features, states, batch = sized(size, small=(64, 8, 8, 2), large=(1024, 64, 64, 8))
    rng = np.random.default_rng(5)
    params = {
        "lambda_re": -0.5 * np.ones(states, np.float32),
        "lambda_im": (np.pi * np.arange(states)).astype(np.float32),
        "B": (rng.normal(size=(states, features, 2)) / np.sqrt(2 * features)).astype(np.float32),
        "C": (rng.normal(size=(features, states, 2)) / np.sqrt(2 * states)).astype(np.float32),
        "D": rng.normal(size=(features,)).astype(np.float32),
        "log_step": np.log(np.linspace(1e-3, 1e-1, states)).astype(np.float32),
    }
    u = rng.normal(size=(batch, length, features)).astype(np.float32)
    target = rng.normal(size=(batch, length, features)).astype(np.float32)

    def discretize_zoh(Lambda, B_tilde, Delta):
        Identity = jnp.ones(Lambda.shape[0])
        Lambda_bar = jnp.exp(Lambda * Delta)
        B_bar = (1 / Lambda * (Lambda_bar - Identity))[..., None] * B_tilde
        return Lambda_bar, B_bar

    @jax.vmap
    def binary_operator(q_i, q_j):
        A_i, b_i = q_i
        A_j, b_j = q_j
        return A_j * A_i, A_j * b_i + b_j

    def apply_ssm(Lambda_bar, B_bar, C_tilde, input_sequence):
        Lambda_elements = Lambda_bar * jnp.ones((input_sequence.shape[0], Lambda_bar.shape[0]))
        Bu_elements = jax.vmap(lambda u: B_bar @ u)(input_sequence)
        _, xs = jax.lax.associative_scan(binary_operator, (Lambda_elements, Bu_elements))
        return jax.vmap(lambda x: 2 * (C_tilde @ x).real)(xs)

    def s5_layer(params, u):
        Lambda = params["lambda_re"] + 1j * params["lambda_im"]
        B_tilde = params["B"][..., 0] + 1j * params["B"][..., 1]
        C_tilde = params["C"][..., 0] + 1j * params["C"][..., 1]
        Lambda_bar, B_bar = discretize_zoh(Lambda, B_tilde, jnp.exp(params["log_step"]))
        ys = apply_ssm(Lambda_bar, B_bar, C_tilde, u)
        return jax.nn.gelu(ys + params["D"] * u)

    def loss(params, u, target):
        y = jax.vmap(s5_layer, in_axes=(None, 0))(params, u)
        return jnp.mean((y - target) ** 2), y

    def forward_and_grad(params, u, target):
        (value, y), grads = jax.value_and_grad(loss, has_aux=True)(params, u, target)
        return value, y, grads

    return forward_and_grad, (params, u, target)


# --- jraph -------------------------------------------------------------------


def _graphs(seed, size, features=4):
    import jraph

    # Graphs batched with `jraph.batch` and padded with `jraph.pad_with_graphs`
    # (jraph's way to a fixed shape under jit): two small ones (small), 128 of
    # 8-24 nodes (large).
    rng = np.random.default_rng(seed)
    if size == "small":
        shapes = ((5, 8), (4, 6))
    else:
        shapes = [(n, 3 * n) for n in rng.integers(8, 25, size=128)]
    graphs = []
    for nodes, edges in shapes:
        graphs.append(jraph.GraphsTuple(
            nodes=rng.normal(size=(nodes, features)).astype(np.float32),
            edges=rng.normal(size=(edges, 2)).astype(np.float32),
            senders=rng.integers(0, nodes, size=edges).astype(np.int32),
            receivers=rng.integers(0, nodes, size=edges).astype(np.int32),
            n_node=np.array([nodes], np.int32), n_edge=np.array([edges], np.int32),
            globals=rng.normal(size=(1, 3)).astype(np.float32)))
    n_node = sum(n for n, _ in shapes) + 3
    n_edge = sum(e for _, e in shapes) + 2
    return jraph.pad_with_graphs(jraph.batch(graphs), n_node=n_node, n_edge=n_edge,
                                 n_graph=len(shapes) + 1)


@program("jraph_graph_network", "jraph", rtol=1e-4, atol=1e-5)
def jraph_graph_network(size):
    import haiku as hk
    import jax
    import jax.numpy as jnp
    import jraph

    # jraph's GraphNetwork with haiku MLPs on concatenated arguments (jraph's
    # examples); a regression loss on the globals of the real graphs.
    width = sized(size, small=8, large=256)

    def network(graph):
        net = jraph.GraphNetwork(
            update_edge_fn=jraph.concatenated_args(hk.nets.MLP([width, width])),
            update_node_fn=jraph.concatenated_args(hk.nets.MLP([width, width])),
            update_global_fn=jraph.concatenated_args(hk.nets.MLP([width, 1])))
        return net(graph)

    net = hk.without_apply_rng(hk.transform(network))
    graph = _graphs(6, size)
    params = net.init(jax.random.PRNGKey(0), graph)
    real = np.linspace(1.0, -1.0, len(graph.n_node) - 1)
    targets = np.append(real, 0.0).astype(np.float32)[:, None]  # 0: the padding graph

    def loss_fn(params, graph, targets):
        pred = net.apply(params, graph).globals
        mask = jraph.get_graph_padding_mask(graph)
        return jnp.sum(jnp.where(mask[:, None], (pred - targets) ** 2, 0.0)) / jnp.sum(mask)

    return jax.value_and_grad(loss_fn), (params, graph, targets)


@program("jraph_gcn", "jraph", rtol=1e-4, atol=1e-5)
def jraph_gcn(size):
    import haiku as hk
    import jax
    import jax.numpy as jnp
    import jraph

    # jraph's GCN example (examples/zacharys_karate_club.py): two
    # GraphConvolution layers with self edges and symmetric normalization,
    # a node classification loss over the real nodes.
    width = sized(size, small=8, large=256)

    def gcn(graph):
        graph = jraph.GraphConvolution(update_node_fn=hk.Linear(width),
                                       add_self_edges=True)(graph)
        graph = graph._replace(nodes=jax.nn.relu(graph.nodes))
        return jraph.GraphConvolution(update_node_fn=hk.Linear(2))(graph).nodes

    net = hk.without_apply_rng(hk.transform(gcn))
    graph = _graphs(7, size)
    params = net.init(jax.random.PRNGKey(0), graph)
    labels = np.random.default_rng(7).integers(0, 2, size=len(graph.nodes)).astype(np.int32)

    def loss_fn(params, graph, labels):
        logits = net.apply(params, graph)
        mask = jraph.get_node_padding_mask(graph)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1)[:, 0]
        return -jnp.sum(jnp.where(mask, log_prob, 0.0)) / jnp.sum(mask)

    return jax.value_and_grad(loss_fn), (params, graph, labels)


# --- rlax --------------------------------------------------------------------


@program("rlax_ppo_gae_loss", "rlax", rtol=1e-4, atol=1e-5)
def rlax_ppo_gae_loss(size):
    import jax
    import jax.numpy as jnp
    import rlax

    # PPO's loss with rlax: advantages by truncated GAE (vmapped over the
    # batch of trajectories, from the behaviour values), the clipped
    # surrogate, an l2 value loss and an entropy bonus; value and gradient.
    steps, batch, obs_dim, actions, hidden = sized(size, small=(16, 4, 6, 3, 32),
                                                   large=(256, 128, 16, 6, 256))
    rng = np.random.default_rng(8)
    params = {"w": (rng.normal(size=(obs_dim, hidden)) / np.sqrt(obs_dim)).astype(np.float32),
              "pi": (0.1 * rng.normal(size=(hidden, actions))).astype(np.float32),
              "v": (0.1 * rng.normal(size=(hidden,))).astype(np.float32)}
    trajectory = {
        "obs": rng.normal(size=(steps + 1, batch, obs_dim)).astype(np.float32),
        "actions": rng.integers(0, actions, size=(steps, batch)).astype(np.int32),
        "rewards": rng.normal(size=(steps, batch)).astype(np.float32),
        "discounts": (0.99 * (rng.random((steps, batch)) > 0.1)).astype(np.float32),
        "behaviour_log_probs": np.log(rng.dirichlet(np.ones(actions), size=(steps, batch))
                                      ).astype(np.float32),
        "behaviour_values": rng.normal(size=(steps + 1, batch)).astype(np.float32),
    }

    def network(params, obs):
        hidden = jnp.tanh(obs @ params["w"])
        return hidden @ params["pi"], hidden @ params["v"]

    def ppo_loss(params, trajectory):
        logits, values = network(params, trajectory["obs"])
        advantages = jax.vmap(rlax.truncated_generalized_advantage_estimation,
                              in_axes=(1, 1, None, 1), out_axes=1)(
            trajectory["rewards"], trajectory["discounts"], 0.95,
            trajectory["behaviour_values"])
        returns = advantages + trajectory["behaviour_values"][:-1]
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        log_pi = jax.nn.log_softmax(logits[:-1])
        actions_taken = trajectory["actions"][..., None]
        log_pi_a = jnp.take_along_axis(log_pi, actions_taken, -1)[..., 0]
        behaviour_a = jnp.take_along_axis(trajectory["behaviour_log_probs"], actions_taken,
                                          -1)[..., 0]
        ratios = jnp.exp(log_pi_a - behaviour_a)
        pg_loss = rlax.clipped_surrogate_pg_loss(ratios.reshape(-1), advantages.reshape(-1),
                                                 epsilon=0.2)
        value_loss = jnp.mean(rlax.l2_loss(values[:-1] - jax.lax.stop_gradient(returns)))
        entropy_loss = rlax.entropy_loss(logits[:-1].reshape(-1, actions),
                                         jnp.ones(steps * batch))
        return pg_loss + 0.5 * value_loss + 0.01 * entropy_loss

    return jax.value_and_grad(ppo_loss), (params, trajectory)


# --- ott-jax -----------------------------------------------------------------


def _point_clouds(size):
    rng = np.random.default_rng(9)
    n, m = sized(size, small=(12, 16), large=(512, 640))
    x = rng.normal(size=(n, 2)).astype(np.float32)
    y = (rng.normal(size=(m, 2)) + 0.5).astype(np.float32)
    return x, y


@program("ott_sinkhorn", "ott-jax", rtol=1e-4, atol=1e-5)
def ott_sinkhorn(size):
    from ott.geometry import pointcloud
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import sinkhorn

    # ott's README: a Sinkhorn solve between two point clouds.
    solver = sinkhorn.Sinkhorn()

    def solve(x, y):
        geom = pointcloud.PointCloud(x, y)
        out = solver(linear_problem.LinearProblem(geom))
        return out.reg_ot_cost, out.matrix, out.converged

    return solve, _point_clouds(size)


@program("ott_sinkhorn_gradient", "ott-jax", rtol=1e-4, atol=1e-5)
def ott_sinkhorn_gradient(size):
    import jax
    from ott.geometry import pointcloud
    from ott.problems.linear import linear_problem
    from ott.solvers.linear import sinkhorn

    # ott's tutorials: the gradient of the regularized OT cost with respect
    # to the source points (ott's default implicit differentiation).
    solver = sinkhorn.Sinkhorn()

    def reg_ot_cost(x, y):
        geom = pointcloud.PointCloud(x, y, epsilon=0.1)
        return solver(linear_problem.LinearProblem(geom)).reg_ot_cost

    return jax.value_and_grad(reg_ot_cost), _point_clouds(size)
