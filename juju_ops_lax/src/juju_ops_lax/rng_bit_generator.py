"""rng_bit_generator, bit for bit as XLA's CPU backend computes it.

XLA expands RngBitGenerator (xla/hlo/transforms/expanders/
rng_bit_generator_expander.cc) with the bit generators of
xla/hlo/builder/lib/prng.cc; RNG_DEFAULT is Philox on CPU (and GPU). The HLO
state is u64[2] = [key, counter]; JAX bitcasts a u32[4] key to it, word 0
being the low half. Only the counter advances:

- THREE_FRY: Threefry-2x32 (20 rounds) keyed by state[0] on the 64-bit counters
  state[1] + i. 32-bit outputs use both words of a block, so the shape is split
  in half along one dimension (XLA's SplitShapeIntoHalves) and the two words are
  interleaved along it; 64-bit outputs use one block per element.
- PHILOX: Philox-4x32 (10 rounds) keyed by state[0] on the 128-bit counters
  (low = state[1], high = state[0]) + i; the four words of each block are
  consecutive outputs (pairs of words for 64-bit outputs).
- uint8/uint16 keep the low bits of the 32-bit result.

Everything is computed in uint32 words, so that the common u32[4] key works
without x64 (uint64 only appears for uint64 keys and outputs, which need x64).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from juju import RuleSet, lower_fun
from juju import primitives as P

rules = RuleSet()

U32 = np.uint32


def _u32(v):
    return np.uint32(v)


def _add64(lo, hi, lo2, hi2=_u32(0)):
    """(lo, hi) + (lo2, hi2) on 64-bit values held as uint32 halves."""
    new_lo = lo + lo2
    carry = (new_lo < lo).astype(U32)
    return new_lo, hi + hi2 + carry


def _counters(lo, hi, n):
    """The 64-bit counters (lo, hi) + [0, n) as uint32 halves of shape (n,)."""
    return _add64(lo, hi, lax.iota(U32, n))


def _threefry2x32(k0, k1, x0, x1):
    rotations = (13, 15, 26, 6, 17, 29, 16, 24)
    ks = (k0, k1, k0 ^ k1 ^ _u32(0x1BD11BDA))
    x0, x1 = x0 + ks[0], x1 + ks[1]
    for i in range(5):
        for r in rotations[4 * (i % 2):4 * (i % 2) + 4]:
            x0 = x0 + x1
            x1 = x0 ^ ((x1 << _u32(r)) | lax.shift_right_logical(x1, _u32(32 - r)))
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + _u32(i + 1)
    return x0, x1


def _mulhilo(x, k):
    """(high, low) words of the 64-bit product x * k, using 16-bit limbs."""
    xl, xh = x & _u32(0xFFFF), lax.shift_right_logical(x, _u32(16))
    kl, kh = _u32(k & 0xFFFF), _u32(k >> 16)
    ll, lh, hl, hh = xl * kl, xl * kh, xh * kl, xh * kh
    mid = (lax.shift_right_logical(ll, _u32(16)) + (lh & _u32(0xFFFF))
           + (hl & _u32(0xFFFF)))
    high = (hh + lax.shift_right_logical(lh, _u32(16)) + lax.shift_right_logical(hl, _u32(16))
            + lax.shift_right_logical(mid, _u32(16)))
    return high, x * _u32(k)


def _philox4x32(k0, k1, x):
    for _ in range(10):
        hi0, lo0 = _mulhilo(x[0], 0xD2511F53)
        hi1, lo1 = _mulhilo(x[2], 0xCD9E8D57)
        x = (hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0)
        k0, k1 = k0 + _u32(0x9E3779B9), k1 + _u32(0xBB67AE85)
    return x


def _to_u64(lo, hi):
    return lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))


def _interleave(words, n, shape):
    """words[j][i] becomes element len(words) * i + j, cut to n elements."""
    return jnp.stack(words, axis=1).reshape(-1)[:n].reshape(shape)


def _threefry_32(key, ctr, shape):
    """32-bit outputs: the shape halved along one dimension (SplitShapeIntoHalves)."""
    if not shape:
        x0, _ = _threefry2x32(*key, *_counters(*ctr, 1))
        return x0.reshape(()), 1
    even = [d for d, s in enumerate(shape) if s % 2 == 0]
    d = even[0] if even else int(np.argmax(shape))
    pre, half, post = math.prod(shape[:d]), -(-shape[d] // 2), math.prod(shape[d + 1:])
    n = pre * half * post
    x0, x1 = _threefry2x32(*key, *_counters(*ctr, n))
    bits = jnp.stack([x0.reshape(pre, half, post), x1.reshape(pre, half, post)], axis=2)
    return bits.reshape(pre, 2 * half, post)[:, :shape[d]].reshape(shape), n


def _philox_ctr(ctr, key_word, n):
    """The 128-bit counters (low = ctr, high = key_word) + [0, n) as 4 uint32 words."""
    lo, hi = _counters(*ctr, n)
    carry = ((hi < ctr[1]) | ((hi == ctr[1]) & (lo < ctr[0]))).astype(U32)  # low half wrapped
    x2, x3 = _add64(key_word[0], key_word[1], carry)
    return lo, hi, x2, x3


def _generate(key, ctr, shape, bits, algorithm):
    """(bits uint32 words or uint64 array, counter increment)."""
    n = math.prod(shape)
    if algorithm == "THREE_FRY":
        if bits == 64:
            x0, x1 = _threefry2x32(*key, *_counters(*ctr, n))
            return _to_u64(x0, x1).reshape(shape), n
        return _threefry_32(key, ctr, shape)
    blocks = -(-n * bits // 128)
    x = _philox4x32(*key, _philox_ctr(ctr, key, blocks))
    if bits == 64:
        return _interleave([_to_u64(x[0], x[1]), _to_u64(x[2], x[3])], n, shape), blocks
    return _interleave(list(x), n, shape), blocks


def rng_bit_generator(key, *, shape, dtype, algorithm, out_sharding=None):
    del out_sharding  # placement only; the values do not depend on it
    shape, dtype = tuple(shape), np.dtype(dtype)
    name = {0: "PHILOX", 1: "THREE_FRY", 2: "PHILOX"}.get(int(algorithm))  # DEFAULT: Philox
    if name is None:
        raise NotImplementedError(f"rng_bit_generator: unknown algorithm {algorithm!r}")
    if dtype not in (np.uint8, np.uint16, np.uint32, np.uint64):
        raise NotImplementedError(f"rng_bit_generator: unsupported dtype {dtype}")
    if math.prod(shape) >= 2**31:
        raise NotImplementedError("rng_bit_generator: more than 2**31 elements")
    if key.shape == (4,) and key.dtype == np.uint32:
        words = [key[i] for i in range(4)]
    elif key.shape == (2,) and key.dtype == np.uint64:
        words = [(key[i // 2] >> np.uint64(32 * (i % 2))).astype(U32) for i in range(4)]
    else:
        raise NotImplementedError(f"rng_bit_generator: key must be u32[4] or u64[2], got "
                                  f"{key.dtype}{list(key.shape)}")
    bits = 64 if dtype == np.uint64 else 32
    out, inc = _generate((words[0], words[1]), (words[2], words[3]), shape, bits, name)
    if dtype.itemsize < 4:  # XLA converts (truncates) the 32-bit result
        out = (out & _u32((1 << 8 * dtype.itemsize) - 1)).astype(dtype)
    lo, hi = _add64(words[2], words[3], _u32(inc))
    if key.dtype == np.uint32:
        new_key = jnp.stack([words[0], words[1], lo, hi])
    else:
        new_key = jnp.stack([key[0], _to_u64(lo, hi)])
    return new_key, out


rules.register(P.rng_bit_generator_p)(lower_fun(rng_bit_generator, multiple_results=True))
