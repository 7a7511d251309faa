"""The README example, its gradient and its vmap, on MAX (compared with XLA)."""

import jax
import jax.numpy as jnp
import numpy as np

import juju


def jax_code(x, y):
    v = x + y
    v = v * v
    return jnp.sin(v)


def main():
    f = juju.jit(jax_code)
    df = juju.jit(jax.grad(jax_code))
    vf = juju.jit(jax.vmap(jax_code))
    xs, ys = jnp.arange(4.0), jnp.full(4, 0.5)

    # One MAX compilation for all three graphs (MAX's cost is per compilation).
    juju.compile_all([f.lower(5, 10), df.lower(5.0, 10.0), vf.lower(xs, ys)])

    print("jax_code(5, 10)          =", f(5, 10).to_numpy())
    print(f"grad(jax_code)(5., 10.)  = {df(5.0, 10.0).to_numpy():.6f}")
    print("vmap(jax_code)(xs, ys)   =", vf(xs, ys).to_numpy())

    np.testing.assert_allclose(f(5, 10).to_numpy(), jax.jit(jax_code)(5, 10), rtol=1e-6)
    np.testing.assert_allclose(df(5.0, 10.0).to_numpy(), jax.jit(jax.grad(jax_code))(5.0, 10.0), rtol=1e-5)
    np.testing.assert_allclose(vf(xs, ys).to_numpy(), jax.jit(jax.vmap(jax_code))(xs, ys), rtol=1e-6)
    print("all three match jax.jit")


if __name__ == "__main__":
    main()
