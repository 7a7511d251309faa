"""lineax and optimistix: linear solves and nonlinear solvers as their docs
write them. Both check their results with equinox's runtime errors
(`eqx.error_if`): host callbacks nested in custom_jvp calls, in lineax's own
`linear_solve` primitive and inside the solvers' while loops. Large:
matrices of 512, 256 unknowns."""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized


def _matrix(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, n)) + 3 * np.eye(n)).astype(np.float32)


@program("lineax_lu", "lineax", rtol=1e-4, atol=1e-5)
def lineax_lu(size):
    import lineax as lx

    def solve(matrix, vector):
        operator = lx.MatrixLinearOperator(matrix)
        return lx.linear_solve(operator, vector, solver=lx.LU()).value

    n = sized(size, small=6, large=512)
    return solve, (_matrix(n, 0), np.arange(n, dtype=np.float32))


@program("lineax_cg", "lineax", rtol=1e-4, atol=1e-5)
def lineax_cg(size):
    import jax.numpy as jnp
    import lineax as lx

    def solve(matrix, vector):
        n = matrix.shape[0]  # conditioned for float32 CG to reach rtol 1e-6 at n = 512
        spd = matrix @ matrix.T / n + jnp.eye(n)
        operator = lx.MatrixLinearOperator(spd, lx.positive_semidefinite_tag)
        return lx.linear_solve(operator, vector, solver=lx.CG(rtol=1e-6, atol=1e-6)).value

    n = sized(size, small=6, large=512)
    return solve, (_matrix(n, 1), np.linspace(-1, 1, n, dtype=np.float32))


@program("optimistix_newton", "optimistix", rtol=1e-4, atol=1e-5)
def optimistix_newton(size):
    import jax.numpy as jnp
    import optimistix as optx

    def root(y0, shift):
        def fn(y, args):
            return jnp.tanh(y) - 0.3 * y - args

        return optx.root_find(fn, optx.Newton(rtol=1e-6, atol=1e-6), y0, args=shift).value

    return root, (np.ones(sized(size, small=4, large=256), np.float32), np.float32(0.1))


@program("optimistix_bfgs", "optimistix", rtol=1e-4, atol=1e-5)
def optimistix_bfgs(size):
    import jax.numpy as jnp
    import optimistix as optx

    def minimise(y0):
        def rosenbrock(y, args):
            return jnp.sum(100.0 * (y[1:] - y[:-1] ** 2) ** 2 + (1.0 - y[:-1]) ** 2)

        solver = optx.BFGS(rtol=1e-6, atol=1e-6)
        return optx.minimise(rosenbrock, solver, y0, max_steps=steps).value

    # 256 unknowns converge in ~3,300 steps (float32 and float64 alike)
    steps = sized(size, small=512, large=4096)
    y0 = sized(size, small=np.array([-1.2, 1.0, -0.5, 0.8]), large=np.tile([-1.2, 1.0], 128))
    return minimise, (y0.astype(np.float32),)
