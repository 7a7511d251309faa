"""diffrax: an adaptive ODE solve, its gradient, an SDE; as diffrax's docs
write them. Large: the ODE solved for 256 initial conditions (`jax.vmap`,
as diffrax's docs batch solves), the gradient of a decay of 16384 states,
the SDE over 256 Brownian paths."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


@program("diffrax_ode_adaptive", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_ode_adaptive(size):
    import diffrax
    import jax
    import jax.numpy as jnp

    def vector_field(t, y, args):
        prey, predator = y
        α, β, γ, δ = args
        return jnp.stack([α * prey - β * prey * predator, -γ * predator + δ * prey * predator])

    def solve(y0, args):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field), diffrax.Tsit5(), t0=0.0, t1=2.0, dt0=0.1, y0=y0,
            args=args, saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 2.0, 5)),
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5))
        return sol.ys, sol.stats["num_accepted_steps"]

    args = np.array([0.1, 0.02, 0.4, 0.02], np.float32)
    if size == "small":
        return solve, (np.array([10.0, 10.0], np.float32), args)
    y0 = np.random.default_rng(0).uniform(5.0, 15.0, size=(256, 2)).astype(np.float32)
    return jax.vmap(solve, in_axes=(0, None)), (y0, args)


@program("diffrax_ode_gradient", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_ode_gradient(size):
    import diffrax
    import jax

    def loss(k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, k: -k * y), diffrax.Dopri5(), t0=0.0, t1=1.0,
            dt0=0.1, y0=y0, args=k,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
            adjoint=diffrax.RecursiveCheckpointAdjoint())
        return (sol.ys[-1] ** 2).sum()

    states = sized(size, small=2, large=16384)
    return jax.value_and_grad(loss), (np.float32(0.7),
                                      np.linspace(1.0, 2.0, states, dtype=np.float32))


@program("diffrax_sde", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_sde(size):
    import diffrax
    import jax
    import jax.numpy as jnp

    def solve(y0, key):
        drift = lambda t, y, args: -y
        diffusion = lambda t, y, args: 0.1 * t
        brownian = diffrax.VirtualBrownianTree(0.0, 1.0, tol=1e-3, shape=(), key=key)
        terms = diffrax.MultiTerm(diffrax.ODETerm(drift),
                                  diffrax.ControlTerm(diffusion, brownian))
        sol = diffrax.diffeqsolve(terms, diffrax.Euler(), 0.0, 1.0, dt0=0.05, y0=y0,
                                  saveat=diffrax.SaveAt(ts=jnp.linspace(0.0, 1.0, 4)))
        return sol.ys

    if size == "small":
        return solve, (np.float32(1.0), jax.random.key(0))
    paths = jax.vmap(solve, in_axes=(None, 0))  # Monte Carlo over Brownian paths
    return paths, (np.float32(1.0), jax.random.split(jax.random.key(0), 256))
