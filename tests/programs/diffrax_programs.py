"""diffrax: an adaptive ODE solve, its gradient, an SDE; as diffrax's docs
write them."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program


@program("diffrax_ode_adaptive", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_ode_adaptive():
    import diffrax
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

    return solve, (np.array([10.0, 10.0], np.float32),
                   np.array([0.1, 0.02, 0.4, 0.02], np.float32))


@program("diffrax_ode_gradient", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_ode_gradient():
    import diffrax
    import jax

    def loss(k, y0):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(lambda t, y, k: -k * y), diffrax.Dopri5(), t0=0.0, t1=1.0,
            dt0=0.1, y0=y0, args=k,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
            adjoint=diffrax.RecursiveCheckpointAdjoint())
        return (sol.ys[-1] ** 2).sum()

    return jax.value_and_grad(loss), (np.float32(0.7), np.array([1.0, 2.0], np.float32))


@program("diffrax_sde", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_sde():
    import diffrax
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

    import jax

    return solve, (np.float32(1.0), jax.random.key(0))
