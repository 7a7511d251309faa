"""Reductions over every subset of axes of shapes with size-1 axes in every
position, vs jax.jit: one compiled graph for all of them.

`jnp.sum(x, axis=0)` of a (128, 1) array summed the size-1 axis instead
(juju_ops_lax._util.reduce_axis took a [N, 1] operand for its [pre, size]
form); every bias gradient of a one-unit layer hit it. The primitives take
turns over the (shape, axes) pairs (one compiled graph must stay cheap); sum,
the one with the most forms, takes two turns.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju import to_numpy
from tests.util import assert_same

SHAPES = [(1,), (4, 1), (1, 4), (128, 1), (1, 3, 4), (3, 1, 4), (3, 4, 1), (4, 1, 1),
          (2, 1, 3, 1)]


def subsets(ndim):
    return [axes for k in range(1, ndim + 1) for axes in itertools.combinations(range(ndim), k)]


# One of these per (shape, axes) pair, in turn; each takes (floats, ints).
ROTATING = {
    "sum_f32": lambda f, i, axes: jnp.sum(f, axes),
    "max_f32": lambda f, i, axes: jnp.max(f, axes),
    "min_i32": lambda f, i, axes: jnp.min(i, axes),
    "prod_f32": lambda f, i, axes: jnp.prod(f, axes),
    "sum_i32": lambda f, i, axes: jnp.sum(i, axes),
    "min_f32": lambda f, i, axes: jnp.min(f, axes),
    "any": lambda f, i, axes: jnp.any(f > 0, axes),
    "all": lambda f, i, axes: jnp.all(f > -1, axes),
    "or_i32": lambda f, i, axes: lax.reduce_or_p.bind(i, axes=axes),
    "xor_bool": lambda f, i, axes: lax.reduce_xor_p.bind(f > 0, axes=axes),
    "and_i32": lambda f, i, axes: lax.reduce_and_p.bind(i, axes=axes),
    "xor_i32": lambda f, i, axes: lax.reduce_xor_p.bind(i, axes=axes),
    "max_i32_keepdims": lambda f, i, axes: jnp.max(i, axes, keepdims=True),
    "mean_keepdims": lambda f, i, axes: jnp.mean(f, axes, keepdims=True),
    "sum_f32_again": lambda f, i, axes: jnp.sum(f, axes),  # the most forms: twice as often
}
# One of these per (shape, axis), in turn.
ALONG = {
    "argmax_f32": lambda f, i, axis: jnp.argmax(f, axis),
    "argmin_i32": lambda f, i, axis: jnp.argmin(i, axis),
    "argmin_f32": lambda f, i, axis: jnp.argmin(f, axis),
    "argmax_i32": lambda f, i, axis: jnp.argmax(i, axis),
    "cumsum_f32": lambda f, i, axis: jnp.cumsum(f, axis),
    "cummax_i32": lambda f, i, axis: lax.cummax(i, axis),
    "cumprod_f32": lambda f, i, axis: jnp.cumprod(f, axis),
    "cummin_f32": lambda f, i, axis: lax.cummin(f, axis),
}


def all_reductions(floats, ints):
    out, turn, along = {}, itertools.count(), itertools.count()
    for shape, f, i in zip(SHAPES, floats, ints):
        for axes in subsets(len(shape)):
            name = list(ROTATING)[next(turn) % len(ROTATING)]
            out[f"{name}{shape}{axes}"] = ROTATING[name](f, i, axes)
        for axis in range(len(shape)):
            name = list(ALONG)[next(along) % len(ALONG)]
            out[f"{name}{shape}[{axis}]"] = ALONG[name](f, i, axis)
    return out


def empty_reductions(f, i):
    """Axes of size 0: the identities."""
    return (f.sum(0), f.max(0, initial=-3.0), jnp.any(f > 0, 0), jnp.all(f > 0, 0),
            lax.reduce_or_p.bind(i, axes=(0,)), lax.reduce_and_p.bind(i, axes=(0,)),
            lax.reduce_xor_p.bind(i, axes=(0,)), f.prod(0),
            # dots over an empty contraction are 0 (MAX's matmul left garbage)
            f.T @ f, jnp.einsum("kb,kc->bc", f, f), (f > 0).T @ (f > 0), i.T @ i)


def empty_results(a, b, c):
    """Reductions over non-empty axes whose results are empty: MAX failed to
    compile them (juju now emits no op for an equation with empty results)."""
    return (jnp.argmax(a, axis=-1), jnp.max(b, axis=1), jnp.sum(c, axis=0),
            jnp.sort(b, axis=0), jnp.cumsum(c, axis=1), jnp.mean(c, axis=(0, 1)))


def clip_by_global_norm(a, b):
    """optax.clip_by_global_norm(1.0) on {"a": (1000, 64), "b": (64,)}, as its
    jaxpr: MAX failed to compile it ("could not parse its Mojo generated code")
    until the sums' rank-0 results went through `_util.sum_to_shape`."""
    sums = [jnp.sum(jnp.square(x) + jnp.square(jnp.zeros_like(x))) for x in (a, b)]
    norm = jnp.sqrt(0.0 + sums[0] + sums[1])
    clip = norm < 1.0
    return tuple(lax.select(clip, x, x / norm * 1.0) for x in (a, b))


def scalar_results(z, ones, x, with_nan):
    """Scalars of float reductions and dots: -0.0 and NaN must come through."""
    return (jnp.max(z), jnp.min(z), jnp.sum(z), jnp.dot(z, ones), jnp.sum(with_nan),
            jnp.max(with_nan), jnp.sqrt(jnp.sum(x * x)) * x[0], jnp.sum(x).astype(jnp.float16),
            jnp.sum(x.astype(jnp.float16)))


rng = np.random.default_rng(0)
FLOATS = [rng.permutation(np.prod(s)).reshape(s).astype(np.float32) / 7 - 1 for s in SHAPES]
INTS = [rng.integers(-1000, 1000, s).astype(np.int32) for s in SHAPES]
EMPTY = (np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int32))
CLIP = (rng.standard_normal((1000, 64)).astype(np.float32) / 100,
        rng.standard_normal(64).astype(np.float32))
SCALAR_ARGS = (np.array([-0.0, -0.0], np.float32), np.ones(2, np.float32),
               np.arange(5, dtype=np.float32) / 3, np.array([1.0, np.nan], np.float32))
CASES = {"all_reductions": (all_reductions, (FLOATS, INTS)),
         "empty_reductions": (empty_reductions, EMPTY),
         "empty_results": (empty_results, (np.zeros((0, 0, 4), np.float32),
                                           np.zeros((0, 2, 5, 0), np.float16),
                                           np.zeros((2, 5, 1, 0), np.float32))),
         "clip_by_global_norm": (clip_by_global_norm, CLIP),
         "scalar_results": (scalar_results, SCALAR_ARGS)}
JITTED = {name: juju.jit(fn) for name, (fn, _) in CASES.items()}


@pytest.fixture(scope="module", autouse=True)
def compiled():
    juju.compile_all([JITTED[name].lower(*args) for name, (_, args) in CASES.items()])


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(name):
    fn, args = CASES[name]
    got, want = JITTED[name](*args), jax.jit(fn)(*args)
    if isinstance(want, dict):  # name the failing reduction
        assert sorted(got) == sorted(want)
        for key in want:
            try:
                assert_same(got[key], want[key], rtol=1e-5, atol=1e-5)
            except AssertionError as exc:
                raise AssertionError(f"{key}: {exc}") from exc
    else:
        assert_same(got, want)


def test_scalar_results_keep_signed_zeros_and_nans():
    """Float sums reshaped to rank 0 pass through a cumsum of one element
    (juju_ops_lax/_util.py `sum_to_shape`, the clip_by_global_norm fix):
    signed zeros and NaN as XLA's."""
    got = JITTED["scalar_results"](*SCALAR_ARGS)
    want = jax.jit(scalar_results)(*SCALAR_ARGS)
    assert_same(got, want)
    signs = [(float(to_numpy(g)), float(w)) for g, w in zip(got, want)]
    assert [(np.signbit(g), np.isnan(g)) for g, _ in signs] == [
        (np.signbit(w), np.isnan(w)) for _, w in signs], signs
