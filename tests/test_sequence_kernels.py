"""sort, top_k, the cumulative reductions, scatter and concatenate against jax.jit.

juju-kernels-mojo's CPU kernels (sequence_rules.py): the radix sort's and
the insertion sort's lengths, NaN/-0.0/+0.0/inf and ties (stability),
several operands and sort keys, every dtype family, sorting along a middle
axis; top_k's one-pass and sort paths, batches, XLA's total order; every
cumulative reduction forwards and reversed along each axis, integer
wrap-around, float16, a long float32 sum; scatters with duplicate
indices, windows, NaNs and dropped or clipped updates; concatenation along
each axis, of every dtype family, of many parts and of rows copied in
parallel. Also juju_ops_lax's graph rules (what GPU graphs use) with the
mojo pack blocked. All graphs compile in ONE MAX compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju import primitives as P
from juju import to_numpy
from tests.util import assert_same, packs_blocked, selected

rng = np.random.default_rng(11)


def special_floats(n, dtype=np.float32):
    """Normal values with duplicates, NaNs, signed zeros and infinities."""
    x = rng.standard_normal(n).astype(dtype)
    x[1::7] = x[::7][: len(x[1::7])]  # ties
    x[3::50] = np.nan
    x[5::40] = -0.0
    x[6::40] = 0.0
    x[8::90] = np.inf
    x[9::90] = -np.inf
    return x


def sorts(x, short, matrix, ints, uints, flags, halves, k1, k2):
    return {
        "radix": jnp.sort(x),
        "argsort": jnp.argsort(x),  # stable: ties, -0.0/+0.0 and NaNs keep their order
        "descending": jnp.argsort(x, descending=True),
        "insertion": (jnp.sort(short), jnp.argsort(short)),
        "axis0": jnp.sort(matrix, axis=0),
        "axis1": jnp.argsort(matrix, axis=1),
        "ints": (jnp.sort(ints), jnp.argsort(ints)),
        "uints": jnp.sort(uints),
        "bools": jnp.argsort(flags),
        "halves": jnp.sort(halves),
        "bfloat16": jnp.sort(halves.astype(jnp.bfloat16)),
        "two_keys": lax.sort((k1, k2, x[: k1.shape[0]]), num_keys=2),
        "lexsort": jnp.lexsort((k2, k1)),
    }


def top_ks(x, rows, ints):
    return {
        "one_pass": lax.top_k(x, 7),  # k * 16 < n: the k best in one pass
        "sorted_path": lax.top_k(x[:40], 5),  # k * 16 >= n: a full sort
        "all": lax.top_k(x[:9], 9),
        "rows": lax.top_k(rows, 3),
        "ints": lax.top_k(ints, 10),
        "signed_zeros": lax.top_k(jnp.array([0.0, -0.0, 0.0, -0.0, 1.0]), 3),
        # XLA's total order: -NaN below -inf, +NaN above +inf
        "signed_nans": lax.top_k(jnp.concatenate(
            [x[:30], lax.bitcast_convert_type(jnp.full(2, 0xFFC00000, jnp.uint32), jnp.float32)]),
            32),
    }


def cumulatives(x, cube, ints, halves, long, tiny):
    out = {}
    for name, op in (("cumsum", lax.cumsum), ("cumprod", lax.cumprod), ("cummax", lax.cummax),
                     ("cummin", lax.cummin), ("cumlogsumexp", lax.cumlogsumexp)):
        for reverse in (False, True):
            out[f"{name} reverse={reverse}"] = op(x, reverse=reverse)
            out[f"{name} cube reverse={reverse}"] = [op(cube, axis=a, reverse=reverse)
                                                     for a in range(3)]
    out["int_wraps"] = lax.cumsum(ints)
    out["int_cummax"] = lax.cummax(ints, reverse=True)
    out["int_cumprod"] = lax.cumprod(ints[:12])
    out["halves"] = lax.cumsum(halves)
    out["long"] = jnp.cumsum(long)
    # bfloat16 and float32 partial sums and inputs below float32's smallest
    # normal: XLA computes in float32 with denormals flushed, so they read
    # and land as 0
    out["denormals"] = [lax.cumsum(tiny, axis=1), lax.cumsum(tiny.astype(jnp.float32), axis=1)]
    return out


def scatters(x, index, values, rows, ints):
    unique = jnp.arange(0, 40, 3)
    return {
        "add": jnp.zeros(50, x.dtype).at[index].add(values),  # duplicates: in update order
        "add_rows": jnp.zeros((50, 4), x.dtype).at[index[:30]].add(rows),  # windows
        "set": x.at[unique].set(values[: unique.shape[0]]),
        "mul": x.at[index].multiply(1 + 0.01 * values),
        "min": x.at[index].min(values),  # NaNs in x and values propagate
        "max": x.at[index].max(values),
        "dropped": x.at[index + 40].add(values, mode="drop"),  # past the end: dropped
        "clipped": x.at[index + 40].add(values, mode="clip"),
        "ints": jnp.zeros(50, jnp.int32).at[index].add(ints),
    }


def concatenations(x, cube, ints, flags, halves, wide):
    return {
        # parts of unequal sizes along each axis of a cube (NaN, -0.0, inf)
        "axis0": jnp.concatenate([cube, cube[:1] * 2, cube], axis=0),
        "axis1": jnp.concatenate([cube, cube[:, :1]], axis=1),
        "axis2": jnp.concatenate([cube[..., :2], cube, cube[..., 37:] * 2], axis=2),
        "ints": jnp.concatenate([ints[:7], ints, ints[:1]]),
        "bools": jnp.concatenate([flags.reshape(700, 100), ~flags.reshape(700, 100)[:, :3]],
                                 axis=1),
        "halves": jnp.concatenate([halves, halves.astype(jnp.bfloat16).astype(halves.dtype)]),
        "bfloat16": jnp.concatenate([halves.astype(jnp.bfloat16)] * 3),
        "int8": jnp.concatenate([ints.astype(jnp.int8)] * 4),
        "stack": jnp.stack([x[i:i + 2000] for i in range(9)], axis=1),  # nine parts
        # lax's rule: a part without elements, a small result
        "empty_part": jnp.concatenate([x[:0], x]),
        "small": jnp.concatenate([x[:5], ints[:3].astype(x.dtype)]),
        # rows in several tasks (65536 elements each, at least)
        "wide": jnp.concatenate([wide, -wide[:, :100], wide], axis=1),
    }


def _ints(n, low=-2**31, high=2**31 - 1):
    return rng.integers(low, high, n, dtype=np.int64).astype(np.int32)


F = special_floats
CASES = {
    "scatter": (scatters, (F(50), rng.integers(0, 50, 300).astype(np.int32), F(300),
                           rng.standard_normal((30, 4)).astype(np.float32), _ints(300, -9, 9))),
    "sorts": (sorts, (F(1000), F(21), F(60).reshape(5, 12), _ints(300, -5, 5),
                      rng.integers(0, 2**32 - 1, 300, dtype=np.uint64).astype(np.uint32),
                      rng.random(100) < 0.5, F(200, np.float16),
                      _ints(500, 0, 3), _ints(500, 0, 4))),
    "top_k": (top_ks, (F(1000), F(4 * 50).reshape(4, 50), _ints(700, -20, 20))),
    # results of 64 KiB or more (smaller ones stay with MAX's concat)
    "concatenate": (concatenations, (F(8000), F(20 * 30 * 40).reshape(20, 30, 40),
                                     _ints(20000), rng.random(70000) < 0.5,
                                     F(40000, np.float16),
                                     rng.standard_normal((300, 250)).astype(np.float32))),
    "cumulative": (cumulatives, (
        # cumprod of many values over/underflows: keep them near 1
        np.where(np.isfinite(F(301)), 1 + 0.01 * F(301), F(301)).astype(np.float32),
        rng.standard_normal((3, 17, 5)).astype(np.float32), _ints(300),
        rng.standard_normal(300).astype(np.float16),
        rng.standard_normal(65536).astype(np.float32),
        # multiples of 2**-128 (float32's smallest normal is 2**-126), exact
        # in bfloat16; below 4 they are denormals, which read as zeros of
        # their sign (0 + -1 is +0.0: fuzzing seed 38's bfloat16 program).
        # Rows of three, summed forward, where XLA's order of summation is
        # the kernel's (which partial sums are flushed depends on it: in
        # reverse, XLA still adds left to right)
        (np.array([[6, -5, 4], [1, 6, -3], [-5, 4, 7], [8, -7, -1], [3, 2, 5], [0, -1, 1],
                   [-1, -1, 2], [0, -1, 300]], np.float32)
         * np.float32(2.0**-128)).astype(jnp.bfloat16))),
}


def lax_rules(x, cube):
    """juju_ops_lax's graph rules of the same primitives (the GPU's)."""
    return {"sort": jnp.sort(x), "argsort": jnp.argsort(x), "top_k": lax.top_k(x, 5),
            "cumsum": [lax.cumsum(cube, axis=a, reverse=True) for a in range(3)],
            "cummax": lax.cummax(x), "scatter_add": jnp.zeros(10).at[(x * 3).astype(int)].add(x),
            "concatenate": jnp.concatenate([cube, cube[:, :2]], axis=1)}


LAX_CASES = {"lax_rules": (lax_rules, (F(100), rng.standard_normal((3, 7, 5)).astype(np.float32)))}


@pytest.fixture(scope="module")
def compiled(request):
    runs = selected(request, "rules", "name")
    lowered = {("mojo", name): juju.jit(fn).lower(*args) for name, (fn, args) in CASES.items()
               if ("mojo", name) in runs}
    with packs_blocked("mojo"):
        lowered.update({("lax", name): juju.jit(fn).lower(*args)
                        for name, (fn, args) in LAX_CASES.items() if ("lax", name) in runs})
    return dict(zip(lowered, juju.compile_all(list(lowered.values()))))


@pytest.mark.parametrize("rules,name", [("mojo", name) for name in CASES]
                         + [("lax", name) for name in LAX_CASES])
def test_matches_jax(compiled, rules, name):
    fn, args = (CASES if rules == "mojo" else LAX_CASES)[name]
    got, expected = compiled[rules, name](*args), jax.jit(fn)(*args)
    if name == "cumulative":
        # float32 sums of 65536 values: XLA's log-depth scan and the kernel's
        # float64 running sum round differently
        assert_same(got.pop("long"), expected.pop("long"), rtol=1e-4, atol=2e-3)
        assert_same(got.pop("halves"), expected.pop("halves"), rtol=2e-2, atol=5e-2)
        for a, e in zip(got.pop("denormals"), expected.pop("denormals")):
            a, e = to_numpy(a).astype(np.float32), np.asarray(e).astype(np.float32)
            # exactly, signs of zeros included (a denormal is within any atol)
            np.testing.assert_array_equal(a, e)
            np.testing.assert_array_equal(np.signbit(a), np.signbit(e))
    assert_same(got, expected)


def test_kernels_lower_sorting_and_scans():
    """The mojo pack's rules take real dtypes on the CPU; complex numbers go
    to lax's rules."""
    x = special_floats(50)
    chosen = {(c.primitive, c.pack) for c in juju.explain(
        lambda x, big: (jnp.sort(x), lax.top_k(x, 3), jnp.cumsum(x), lax.cummax(x),
                        x.at[jnp.arange(3)].add(1.0), jnp.concatenate([big, big])),
        x, special_floats(1 << 14))
        if c.primitive in ("sort", "top_k", "cumsum", "cummax", "scatter-add", "scatter_add",
                           "concatenate")}
    assert chosen == {("sort", "mojo"), ("top_k", "mojo"), ("cumsum", "mojo"), ("cummax", "mojo"),
                      (P.scatter_add_p.name, "mojo"), ("concatenate", "mojo")}
    complex_packs = {c.pack for c in juju.explain(jnp.cumsum, x.astype(np.complex64))
                     if c.primitive == "cumsum"}
    assert complex_packs == {"lax"}
