"""Loop kernels for loops that carry PRNG keys (gymnax rollouts, blackjax's
and numpyro's samplers, diffrax's Brownian motion; issue 45), against
jax.jit, bit for bit where jax.random's bits are concerned: split,
fold_in, normal/uniform/randint/bernoulli draws, keys as scan inputs and
outputs, key arrays selected, indexed and updated, legacy uint32 keys, a
closed-over key; and the integer bit equations those draws are made of
(shifts by every amount, population_count, clz, bitcast_convert_type).

Each case is a scan or while_loop checked to run as a generated kernel (not
lax's loop). All cases compile in ONE MAX compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import juju
import numpy as np
import pytest
from jax import lax

from tests.test_loop_kernels import _generated_loops, compile_lowered, lower_cases
from tests.util import assert_same

GENERATED = {("mojo", "lower_scan"), ("mojo", "lower_while")}
rng = np.random.default_rng(451)


def draws(key, x):
    """A scan carrying a key: split, fold_in and the usual draws; the
    subkeys come out as stacked ys (key arrays, then their data)."""
    def step(carry, _):
        k, acc = carry
        k, sub = jax.random.split(k)
        n = jax.random.normal(sub, (4,))
        u = jax.random.uniform(jax.random.fold_in(sub, 3), (4,), minval=-1.0, maxval=2.0)
        i = jax.random.randint(sub, (), 0, 10)
        b = jax.random.bernoulli(sub, 0.3, (4,))
        c = jax.random.categorical(sub, acc)
        acc = acc + n * u + i + b + c
        return (k, acc), (sub, acc[0], i)
    (k, acc), (subs, ys, ints) = lax.scan(step, (key, x), None, length=6)
    return jax.random.key_data(k), acc, jax.random.key_data(subs), ys, ints


def key_arrays(keys, xs):
    """Key arrays as scan inputs (rows), selected by a predicate, indexed at
    a dynamic position, updated in place, split in a batch (vmap), and
    reshaped/concatenated; a key closed over as a constant."""
    fixed = jax.random.key(7)

    def step(pool, v):
        row, x = v  # row: a key array of shape (3,)
        pick = jnp.where(x > 0, row, pool)  # select_n per key word
        j = (jnp.abs(x) * 10).astype(jnp.int32) % 3
        one = pick[j]  # a dynamic gather of keys
        pool = pool.at[j].set(jax.random.fold_in(one, j))  # a dynamic scatter of keys
        halves = jax.vmap(jax.random.split)(pool)  # (3, 2) keys
        both = jnp.concatenate([halves[:, 0], halves[:, 1]]).reshape(2, 3)
        draw = jax.random.uniform(both[1, 2], ()) + jax.random.normal(fixed, ())
        return pool, (jax.random.key_data(both), draw)
    pool, (data, draws_) = lax.scan(step, keys, (jax.random.split(keys[0], (4, 3)), xs))
    return jax.random.key_data(pool), data, draws_


def sampler(key, x0):
    """A while_loop drawing until a draw is small, as a sampler's loop does
    (the condition reads the carry the draws made); legacy uint32 keys
    (PRNGKey) inside."""
    def cond(s):
        _, _, u, n = s
        return (u > 0.05) & (n < 40)

    def body(s):
        k, x, _, n = s
        k, a, b = jax.random.split(k, 3)
        x = x + 0.1 * jax.random.normal(a, x.shape)
        old = jax.random.PRNGKey(n)  # uint32[2], threefry2x32 on raw words
        x = x + jax.random.uniform(old, x.shape) * 0.01
        return k, x, jax.random.uniform(b, ()), n + 1
    k, x, u, n = lax.while_loop(cond, body, (key, x0, jnp.float32(1.0), jnp.int32(0)))
    return jax.random.key_data(k), x, u, n


def bit_ops(a, s, u, b):
    """XLA's shifts by amounts in and out of [0, width) (0 or the sign fill),
    arithmetic shifts of unsigned values, population_count and clz, and
    bitcasts between float32, int32 and uint32, and uint8/int8."""
    def step(c, v):
        x, k, y, z = v
        outs = (lax.shift_left(x, k), lax.shift_right_logical(x, k),
                lax.shift_right_arithmetic(x, k),
                lax.shift_left(y, k.astype(jnp.uint32)),
                lax.shift_right_logical(y, k.astype(jnp.uint32)),
                lax.shift_right_arithmetic(y, k.astype(jnp.uint32)),
                lax.shift_right_logical(z, (k % 11).astype(jnp.uint8)),
                lax.population_count(x), lax.population_count(y), lax.population_count(z),
                lax.clz(x), lax.clz(y), lax.clz(z.astype(jnp.int8)),
                lax.bitcast_convert_type(x, jnp.float32),
                lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.float32), jnp.uint32),
                lax.bitcast_convert_type(z, jnp.int8))
        return c ^ x[0], outs
    return lax.scan(step, jnp.int32(5), (a, s, u, b))


def _bit_args():
    a = rng.integers(-2**31, 2**31, size=(3, 8), dtype=np.int64).astype(np.int32)
    a[0, :4] = [-1, 0, -2**31, 2**31 - 1]
    s = np.tile(np.array([-1, 0, 1, 5, 31, 32, 40, 17], np.int32), (3, 1))
    u = rng.integers(0, 2**32, size=(3, 8), dtype=np.uint64).astype(np.uint32)
    u[0, :3] = [0, 2**32 - 1, 2**31]
    b = rng.integers(0, 256, size=(3, 8)).astype(np.uint8)
    return a, s, u, b


CASES = {
    "draws": (draws, (jax.random.key(0), np.zeros(4, np.float32))),
    "key_arrays": (key_arrays, (jax.random.split(jax.random.key(1), 3),
                                rng.standard_normal(4).astype(np.float32))),
    "sampler": (sampler, (jax.random.key(2), np.zeros(3, np.float32))),
    "bit_ops": (bit_ops, _bit_args()),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_lowered(lower_cases(CASES))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    fn, args = CASES[name]
    loops = _generated_loops(fn, args)
    assert loops and loops <= GENERATED, loops
    # Bits, ints and keys exactly; the float draws within the float32
    # tolerance (normal's erf_inv is juju's decomposition, not XLA's).
    assert_same(compiled[name](*args), jax.jit(fn)(*args), rtol=2e-6, atol=1e-6)


def test_key_results_leave_the_kernel_as_keys(compiled):
    """A loop whose results are key arrays (not their data) gives jax.jit's keys."""
    def fn(key):
        return lax.fori_loop(0, 5, lambda i, k: jax.random.fold_in(jax.random.split(k)[1], i),
                             key)
    key = jax.random.key(3)
    assert _generated_loops(fn, (key,)) <= GENERATED
    got, expected = juju.jit(fn, tiered=False)(key), jax.jit(fn)(key)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)),
                                  np.asarray(jax.random.key_data(expected)))
