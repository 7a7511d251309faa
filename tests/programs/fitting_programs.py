"""Parameters fitted through solvers: one gradient step of a loss whose
value goes through an optimistix solve, a lineax solve or a diffrax solve
with a `BacksolveAdjoint`. The solvers differentiate implicitly (optimistix's
`ImplicitAdjoint` through lineax), so the gradient holds equinox's runtime
checks (`eqx.error_if`: host callbacks) in custom_jvp calls, in lineax's
`linear_solve` primitive and in while loops, where a user meets them at once.
"""

from __future__ import annotations

import numpy as np

from tests.programs.registry import program, sized

LEARNING_RATE = 0.1


def _fit_step(loss):
    """`params -> (loss, params - lr * grad)`: one step of gradient descent."""
    import jax

    def step(params, *data):
        value, grads = jax.value_and_grad(loss)(params, *data)
        return value, jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads)

    return step


@program("optimistix_root_find_grad", "optimistix", rtol=1e-4, atol=1e-5)
def optimistix_root_find_grad(size):
    """The gradient of a root find's solution w.r.t. its parameters (issue 53)."""
    n = sized(size, small=3, large=256)
    import jax
    import jax.numpy as jnp
    import optimistix as optx

    def fn(y, args):
        a, b = y
        return jnp.tanh(a) - 0.3 * a - args[0], jnp.tanh(b) - 0.3 * b - args[1]

    def root_sum(p):
        y0 = (jnp.float32(1.0), jnp.ones(n, jnp.float32))
        a, b = optx.root_find(fn, optx.Newton(rtol=1e-5, atol=1e-5), y0, args=p).value
        return a + jnp.sum(b)

    return jax.grad(root_sum), ((np.float32(0.1), np.linspace(0, 0.2, n, dtype=np.float32)),)


@program("optimistix_root_find_fit", "optimistix", rtol=1e-4, atol=1e-5)
def optimistix_root_find_fit(size):
    """Fit the parameters of an implicit equation so that its root hits a target."""
    n = sized(size, small=4, large=256)
    import jax.numpy as jnp
    import optimistix as optx

    def loss(params, target):
        def fn(y, p):
            return y ** 3 + p["a"] * y - p["b"]

        root = optx.root_find(fn, optx.Newton(rtol=1e-6, atol=1e-6), jnp.ones_like(target),
                              args=params).value
        return jnp.mean((root - target) ** 2)

    params = {"a": np.full(n, 1.0, np.float32), "b": np.linspace(0.5, 3.0, n, dtype=np.float32)}
    return _fit_step(loss), (params, np.linspace(0.6, 1.3, n, dtype=np.float32))


@program("optimistix_minimise_fit", "optimistix", rtol=3e-4, atol=1e-5)
def optimistix_minimise_fit(size):
    """Fit the weights of an inner minimisation (bilevel): the argmin of a
    regularised least-squares problem, differentiated implicitly.

    rtol 3e-4: at the large size BFGS takes 921 float32 steps, and the loss
    (22.77) is as far from float64's as their rounding takes it: jax.jit's
    by 7.5e-5 relative, juju's by 1.7e-4 (2026-11-30; the products' and
    sums' order differs from XLA's)."""
    import jax.numpy as jnp
    import optimistix as optx

    rows, width, steps = sized(size, small=(8, 3, 256), large=(2048, 256, 2048))
    truth = np.resize(np.array([1.0, -2.0, 0.5], np.float32), width)
    a = np.random.default_rng(0).normal(size=(rows, width)).astype(np.float32)
    y = (a @ truth).astype(np.float32)

    def loss(log_reg, target):
        def objective(w, reg):
            return jnp.sum((a @ w - y) ** 2) + jnp.exp(reg) * jnp.sum(w ** 2 + 0.1 * w ** 4)

        w = optx.minimise(objective, optx.BFGS(rtol=1e-6, atol=1e-6), jnp.zeros(width),
                          args=log_reg, max_steps=steps).value
        return jnp.sum((w - target) ** 2)

    return _fit_step(loss), (np.float32(0.0), np.resize(np.array([0.9, -1.5, 0.4], np.float32),
                                                        width))


@program("optimistix_least_squares_fit", "optimistix", rtol=1e-4, atol=1e-5)
def optimistix_least_squares_fit(size):
    """A decay curve fitted by Levenberg-Marquardt inside, its data's
    scale fitted by gradient descent outside."""
    import jax.numpy as jnp
    import optimistix as optx

    ts = np.linspace(0.0, 2.0, sized(size, small=12, large=16384), dtype=np.float32)
    observed = (2.0 * np.exp(-1.3 * ts)).astype(np.float32)

    def loss(scale, target):
        def residuals(theta, s):
            amplitude, rate = theta
            return amplitude * jnp.exp(-rate * ts) - s * observed

        solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-6)
        theta = optx.least_squares(residuals, solver, jnp.array([1.0, 1.0]), args=scale,
                                   max_steps=256).value
        return jnp.sum((theta - target) ** 2)

    return _fit_step(loss), (np.float32(1.0), np.array([2.5, 1.2], np.float32))


def _operator_program(solver_name, size):
    """The gradient of a lineax solve w.r.t. its operator's matrix."""
    import jax.numpy as jnp
    import lineax as lx

    n = sized(size, small=5, large=256)
    rng = np.random.default_rng(3)
    matrix = (rng.normal(size=(n, n)) + 4 * np.sqrt(n / 5) * np.eye(n)).astype(np.float32)
    vector = rng.normal(size=n).astype(np.float32)

    def loss(m, b):
        if solver_name == "CG":
            operator = lx.MatrixLinearOperator(m @ m.T + jnp.eye(n), lx.positive_semidefinite_tag)
            solver = lx.CG(rtol=1e-6, atol=1e-6)
        else:
            operator, solver = lx.MatrixLinearOperator(m), getattr(lx, solver_name)()
        x = lx.linear_solve(operator, b, solver=solver).value
        return jnp.sum(x ** 2) + 0.1 * jnp.sum(x)

    return _fit_step(loss), (matrix, vector)


@program("lineax_lu_operator_grad", "lineax", rtol=1e-4, atol=1e-5)
def lineax_lu_operator_grad(size):
    return _operator_program("LU", size)


@program("lineax_qr_operator_grad", "lineax", rtol=1e-4, atol=1e-5)
def lineax_qr_operator_grad(size):
    return _operator_program("QR", size)


@program("lineax_cg_operator_grad", "lineax", rtol=1e-3, atol=1e-4)
def lineax_cg_operator_grad(size):
    return _operator_program("CG", size)


@program("diffrax_backsolve_fit", "diffrax", rtol=1e-4, atol=1e-5)
def diffrax_backsolve_fit(size):
    """Damped oscillators' parameters fitted to their final states, the
    gradient by solving the adjoint ODE backwards (`BacksolveAdjoint`)."""
    n = sized(size, small=1, large=256)  # oscillators, solved as one system
    import diffrax
    import jax.numpy as jnp

    def vector_field(t, y, args):
        damping, stiffness = args
        position, velocity = y
        return jnp.stack([velocity, -stiffness * position - damping * velocity])  # (2, n)

    def loss(args, target):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(vector_field), diffrax.Tsit5(), t0=0.0, t1=2.0, dt0=0.1,
            y0=jnp.stack([jnp.linspace(1.0, 2.0, n), jnp.zeros(n)]), args=args,
            stepsize_controller=diffrax.PIDController(rtol=1e-5, atol=1e-5),
            adjoint=diffrax.BacksolveAdjoint())
        return jnp.sum((sol.ys[-1] - target) ** 2)

    target = np.repeat(np.array([[-0.2], [-0.4]], np.float32), n, axis=1)
    return _fit_step(loss), ((np.full(n, 0.3, np.float32), np.linspace(2.0, 3.0, n,
                                                                       dtype=np.float32)),
                             target)
