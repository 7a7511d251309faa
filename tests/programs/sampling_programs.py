"""blackjax and numpyro: one NUTS step, one HMC step, one SVI step; as their
docs write them. Large: blackjax's normal model on 16384 observations,
numpyro's regression with 256 features and 1024 observations."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


def _logdensity(size):
    import jax.numpy as jnp
    from jax.scipy import stats

    # blackjax's quickstart: a normal model's log density over (loc, log_scale)
    observations = sized(size, small=32, large=16384)
    data = jnp.asarray(np.random.default_rng(0).normal(1.0, 2.0, size=observations),
                       jnp.float32)

    def logdensity(x):
        scale = jnp.exp(x["log_scale"])
        return (stats.norm.logpdf(data, x["loc"], scale).sum()
                + stats.norm.logpdf(x["loc"], 0.0, 10.0) + stats.norm.logpdf(x["log_scale"]))

    return logdensity


@program("blackjax_nuts_step", "blackjax", rtol=1e-4, atol=1e-5)
def blackjax_nuts_step(size):
    import blackjax
    import jax
    import jax.numpy as jnp

    nuts = blackjax.nuts(_logdensity(size), step_size=1e-1, inverse_mass_matrix=jnp.ones(2))
    state = nuts.init({"loc": jnp.float32(0.5), "log_scale": jnp.float32(0.0)})

    def step(state, key):
        state, info = nuts.step(key, state)
        return state, info.num_integration_steps, info.acceptance_rate

    return step, (state, jax.random.key(1))


@program("blackjax_hmc_steps", "blackjax", rtol=1e-4, atol=1e-5)
def blackjax_hmc_steps(size):
    import blackjax
    import jax
    import jax.numpy as jnp

    hmc = blackjax.hmc(_logdensity(size), step_size=5e-2, inverse_mass_matrix=jnp.ones(2),
                       num_integration_steps=5)
    state = hmc.init({"loc": jnp.float32(0.5), "log_scale": jnp.float32(0.0)})

    def inference_loop(state, key):
        def one_step(state, key):
            state, _ = hmc.step(key, state)
            return state, state.position

        return jax.lax.scan(one_step, state, jax.random.split(key, 3))

    return inference_loop, (state, jax.random.key(2))


def _numpyro_model(x, y=None):
    import numpyro
    import numpyro.distributions as dist

    w = numpyro.sample("w", dist.Normal(0.0, 1.0).expand([x.shape[1]]).to_event(1))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)


def _regression_data(size):
    rng = np.random.default_rng(3)
    n, features = sized(size, small=(20, 3), large=(1024, 256))
    x = rng.normal(size=(n, features)).astype(np.float32)
    w = np.array([1.0, -2.0, 0.5]) if size == "small" else rng.normal(size=features)
    y = (x @ w + 0.3 + 0.1 * rng.normal(size=n)).astype(np.float32)
    return x, y


@program("numpyro_svi_step", "numpyro", rtol=1e-4, atol=1e-5)
def numpyro_svi_step(size):
    import jax
    from numpyro.infer import SVI, Trace_ELBO
    from numpyro.infer.autoguide import AutoNormal
    from numpyro.optim import Adam

    x, y = _regression_data(size)
    guide = AutoNormal(_numpyro_model)
    svi = SVI(_numpyro_model, guide, Adam(1e-2), loss=Trace_ELBO())
    state = svi.init(jax.random.key(4), x, y)

    def two_steps(state, x, y):
        state, loss1 = svi.update(state, x, y)
        state, loss2 = svi.update(state, x, y)
        return svi.get_params(state), loss1, loss2

    return two_steps, (state, x, y)


@program("numpyro_nuts_step", "numpyro", rtol=1e-4, atol=1e-5)
def numpyro_nuts_step(size):
    import jax
    from numpyro.infer import NUTS

    x, y = _regression_data(size)
    kernel = NUTS(_numpyro_model)
    state = kernel.init(jax.random.key(5), num_warmup=0,
                        init_params=None, model_args=(x, y), model_kwargs={})

    def step(state):
        state = kernel.sample(state, (x, y), {})
        return state.z, state.potential_energy, state.num_steps

    return step, (state,)
