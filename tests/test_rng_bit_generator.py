"""lax.rng_bit_generator vs jax.jit: juju reproduces XLA CPU's bits exactly.
All cases share one graph (one compile), traced with x64 on (scoped to the
fixture) so that uint64 keys and outputs are covered too."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax import lax

import juju
from tests.util import assert_same

A = lax.RandomAlgorithm
K32 = np.array([0x12345678, 0x9ABCDEF0, 7, 42], np.uint32)
K64 = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFF0], np.uint64)  # counter wraps
WRAP = np.array([3, 4, 0xFFFFFFF0, 0xFFFFFFFF], np.uint32)  # Philox's 128-bit carry

# name: (key, shape, dtype, algorithm)
CASES = {
    "threefry_u32": (K32, (5, 7), np.uint32, A.RNG_THREE_FRY),
    "threefry_u64_key64": (K64, (3,), np.uint64, A.RNG_THREE_FRY),
    "threefry_u8_odd": (K32, (3, 5, 7), np.uint8, A.RNG_THREE_FRY),
    "philox_u32_key64": (K64, (5, 7), np.uint32, A.RNG_PHILOX),
    "philox_u64": (K32, (2, 3), np.uint64, A.RNG_PHILOX),
    "philox_carry": (WRAP, (100,), np.uint32, A.RNG_PHILOX),
    "default_u8": (K32, (7,), np.uint8, A.RNG_DEFAULT),
    "default_u16_scalar": (K64, (), np.uint16, A.RNG_DEFAULT),
}


def _all(*keys):
    return [lax.rng_bit_generator(k, shape, dtype, alg)
            for k, (_, shape, dtype, alg) in zip(keys, CASES.values())]


@pytest.fixture(scope="module")
def outputs():
    keys = [key for key, *_ in CASES.values()]
    with jax.enable_x64(True):
        expected = jax.jit(_all)(*keys)
        got = juju.jit(_all)(*keys)
        return (jax.tree_util.tree_map(np.asarray, expected),
                jax.tree_util.tree_map(juju.to_numpy, got))


@pytest.mark.parametrize("index", range(len(CASES)), ids=list(CASES))
def test_rng_bit_generator_matches_jax(outputs, index):
    expected, got = outputs
    assert_same(got[index], expected[index])
