"""Loop kernels for the equations of diffrax's and equinox's loops (issue 45),
against jax.jit: integer div and rem, float rem and pow, gather and scatter
in every index mode (out-of-bounds indices clamped, filled or dropped as XLA
does), argmax/argmin and lax.reduce, stack, unstack, split and pad, window
and cumulative reductions, rounding and platform_dependent, convolutions
(SIMD over NHWC features), complex numbers, sorting (insertion and merge),
total-order comparisons (searchsorted), a differentiated cond's empty2,
tile, reshapes with dimensions, products through the BLAS, and small
factorizations (Cholesky, triangular solves, LU, QR).

Each case is a scan or while_loop checked to run as a generated kernel (not
lax's loop), on edge values: negative and zero divisors, INT_MIN / -1, NaN,
+-inf and -0.0, ties. All cases compile in ONE MAX compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import juju
import numpy as np
import pytest
from jax import lax
from juju import primitives as P
from juju_kernels_mojo.codegen import Emitter, Unsupported
from juju_kernels_mojo.codegen.mojo import Array

from tests.test_loop_kernels import _generated_loops, _x64, compile_lowered, lower_cases
from tests.util import assert_same

rng = np.random.default_rng(45)
PROMISE = lax.GatherScatterMode.PROMISE_IN_BOUNDS
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3e38, -1e-40, 88.0, 7.5,
                    -7.5, 2.0, 0.5, -1.0, 1.0], np.float32)
INT_MIN, INT_MAX = -2**31, 2**31 - 1


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def integer_division(a, b, u, v):
    """lax.div/rem round toward zero (the remainder has the dividend's sign);
    x / 0 is -1 (all ones), x % 0 is x, INT_MIN / -1 wraps; jnp's floor
    forms on top; uint32."""
    def step(c, x):
        a, b, u, v = x
        outs = (lax.div(a, b), lax.rem(a, b), jnp.floor_divide(a, b), jnp.remainder(a, b),
                lax.div(u, v), lax.rem(u, v), lax.div(a, jnp.int32(-3)), lax.rem(a, 4))
        return c + lax.rem(c, 7) + 1, outs
    return lax.scan(step, jnp.int32(-40), (a, b, u, v))


def float_rem_pow(x, y, k):
    """C's fmod and pow on every pair of special values, pow with an int32
    exponent (converted, as jax lowers it), jnp's forms."""
    def step(c, v):
        a, b, n = v
        outs = (lax.rem(a, b), lax.pow(a, b), lax.pow(a, n), jnp.power(jnp.abs(a), c),
                jnp.fmod(a, 3.0), jnp.float_power(jnp.abs(b) + 1, 0.5))
        return c + 0.5, outs
    return lax.scan(step, jnp.asarray(-1.0, x.dtype), (x, y, k))


def _special_pairs(dtype):
    a = np.repeat(SPECIAL, SPECIAL.size).astype(dtype).reshape(8, 32)
    b = np.tile(SPECIAL, SPECIAL.size).astype(dtype).reshape(8, 32)
    k = rng.integers(-5, 6, size=(8, 32)).astype(np.int32)
    k[0, :4] = [INT_MAX, INT_MIN, 0, 127]
    return a, b, k


GDN = lax.GatherDimensionNumbers


def gathers(x, m, i, w):
    """lax.gather in each mode with indices in and out of bounds: elements
    (CLIP, FILL_OR_DROP with jax's default and an explicit fill, PROMISE
    clamped as XLA does), rows, columns (offset dims before the batch dim),
    2-D windows by 2-component indices, int and bool fills, uint32 indices,
    jnp's take and a vmapped gather (batching dims)."""
    element = GDN(offset_dims=(), collapsed_slice_dims=(0,), start_index_map=(0,))
    rows = GDN(offset_dims=(1,), collapsed_slice_dims=(0,), start_index_map=(0,))
    cols = GDN(offset_dims=(0,), collapsed_slice_dims=(1,), start_index_map=(1,))
    windows = GDN(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
    mi = (m * 10).astype(jnp.int32)

    def step(c, v):
        idx, win = v
        col = idx[:, None]
        outs = (
            lax.gather(x, col, element, (1,), mode="clip"),
            lax.gather(x, col, element, (1,), mode="fill"),
            lax.gather(x, col, element, (1,), mode="fill", fill_value=-5.0),
            lax.gather(x, col, element, (1,), mode=PROMISE),
            lax.gather(x, col.astype(jnp.uint32), element, (1,), mode="fill"),
            lax.gather(m, col, rows, (1, 4), mode="fill"),
            lax.gather(m, col, cols, (5, 1), mode="clip"),
            lax.gather(m, win, windows, (2, 3), mode="clip"),
            lax.gather(m, win, windows, (2, 3), mode="fill"),
            lax.gather(mi, win, windows, (2, 3), mode="fill"),
            lax.gather(mi.astype(jnp.uint32), win, windows, (2, 3), mode="fill"),
            lax.gather(m > 0, win, windows, (2, 3), mode="fill"),
            jnp.take(x, idx, mode="wrap"),
            x.at[idx].get(mode="fill", fill_value=7.0),
            jax.vmap(lambda r, j: r[j])(m, jnp.clip(idx[:5], -4, 3)),
        )
        return c + outs[0].sum(), outs
    return lax.scan(step, jnp.float32(0), (i, w))


SDN = lax.ScatterDimensionNumbers


def scatters(x, m, i, u, w):
    """Scatters in each mode: equinox's maybe_set (`x.at[j].set(v)` with a
    dynamic j), add/mul/min/max with duplicate, negative and too large
    indices (dropped), NaN updates, clipped windows and dropped partial
    windows (2-component indices), int and bool operands, scatter_apply (a
    custom update_jaxpr) and a vmapped scatter (batching dims)."""
    element = SDN(update_window_dims=(), inserted_window_dims=(0,),
                  scatter_dims_to_operand_dims=(0,))
    windows = SDN(update_window_dims=(1, 2), inserted_window_dims=(),
                  scatter_dims_to_operand_dims=(0, 1))

    def body(k, s):
        x, m, acc, flags = s
        idx, upd, win = i[k], u[k], w[k]
        col = idx[:, None]
        j = idx[0]
        x = x.at[j].set(upd[0])  # FILL_OR_DROP: j >= 10 is dropped
        x = lax.scatter_add(x, col, upd, element, mode="drop")
        x = lax.scatter_mul(x, col, jnp.tanh(upd) + 1, element, mode=PROMISE)
        x = lax.scatter_max(x, col, upd, element, mode="clip")
        x = lax.scatter_min(x, col[::-1], -upd, element, mode="drop")
        x = lax.scatter(x, jnp.array([[3], [12], [-1]]) + k, upd[:3], element, mode="clip")
        x = lax.scatter_apply(x, col[:2], jnp.sin, element, update_shape=(2,), mode="drop")
        m = m.at[j % 6].set(upd[:4])  # a row (window) at a dynamic index
        block = jnp.broadcast_to(upd[:3], (2, 2, 3))
        m = lax.scatter_add(m, win, block, windows, mode="drop")  # partial windows dropped
        m = lax.scatter(m, win[:1], block[:1] * 2, windows, mode="clip")
        acc = lax.scatter_add(acc, col, idx, element, mode="drop")
        acc = lax.scatter_max(acc, col, idx * 3, element, mode="clip")
        flags = flags.at[j].set(upd[1] > 0)
        flags = lax.scatter_max(flags, col, upd > 0, element, mode="drop")
        m = jax.vmap(lambda r, c, v: r.at[c].add(v))(m, jnp.clip(idx[:5], -4, 3), upd[:5])
        return x, m, acc, flags
    init = (x, m, jnp.arange(10, dtype=jnp.int32), jnp.zeros(10, bool))
    return lax.fori_loop(0, i.shape[0], body, init)


def _scatter_args():
    i = rng.integers(-12, 14, size=(6, 6)).astype(np.int32)
    i[0, 0], i[1, 0], i[2, :3] = 12, -3, 4  # dropped, from the end, duplicates
    u = normal(6, 6) * 3
    u[1, 2], u[3, 0], u[4, 4] = np.nan, np.nan, -0.0
    w = rng.integers(-2, 6, size=(6, 2, 2)).astype(np.int32)
    return normal(10), normal(5, 4), i, u, w


def arg_extremes(x, n):
    """argmax/argmin over either axis: the first extreme, the first NaN where
    there is one, ties, -0.0 against 0.0, -inf only; ints; and lax.reduce with
    two operands (argmax by a custom reducer) and with a custom single one."""
    def reducer(a, b):
        value = jnp.maximum(a[0], b[0])
        index = jnp.where(a[0] > b[0], a[1], jnp.where(b[0] > a[0], b[1], jnp.minimum(a[1], b[1])))
        return value, index

    def step(c, v):
        a, k = v
        iota = lax.broadcasted_iota(jnp.int32, a.shape, 1)
        finite = jnp.where(jnp.isnan(a), 0.0, a)
        outs = (jnp.argmax(a, axis=1), jnp.argmin(a, axis=1), jnp.argmax(a, axis=0),
                jnp.argmin(a, axis=0), jnp.argmax(k, axis=1), jnp.argmin(k, axis=0),
                jnp.argmax(a > 0.5, axis=1), jnp.argmin(k > 0, axis=0),
                lax.argmax(a, 1, jnp.int32), lax.argmin(k.astype(jnp.uint32), 1, jnp.int32),
                lax.reduce((finite, iota), (-jnp.inf, 0), reducer, (1,)),
                lax.reduce(k, jnp.int32(INT_MIN), lambda p, q: jnp.maximum(p, q) * 1, (0, 1)),
                lax.reduce((k, k), (0, 1), lambda p, q: (p[0] + q[0], p[1] * q[1]), (0,)))
        return c + jnp.argmax(a.sum(axis=0)), outs
    return lax.scan(step, jnp.int32(0), (x, n))


def _extreme_rows():
    x = normal(3, 6, 7)
    x[0, 0] = [1.0, np.nan, 3.0, np.nan, 3.0, -1.0, 0.0]
    x[0, 1] = [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    x[0, 2] = [-0.0, 0.0, -0.0, 0.0, -0.0, 0.0, -0.0]
    x[0, 3] = [-np.inf] * 7
    x[0, 4] = [np.inf, 1.0, np.inf, -np.inf, np.nan, -np.inf, 5.0]
    x[1, :, 3] = np.nan
    n = rng.integers(-3, 4, size=(3, 6, 7)).astype(np.int32)
    n[0, 0] = [INT_MIN, INT_MAX, 0, INT_MAX, INT_MIN, 1, 1]
    return x, n


def pads_and_stacks(x, p):
    """lax.pad with negative edges and interior padding, a dynamic pad value,
    everything cut away; int pads; stack / unstack / split (jnp.stack,
    jnp.unstack, jnp.split) along inner axes; bool stacks."""
    def step(c, v):
        a, q = v
        rows = jnp.unstack(a, axis=1)
        parts = jnp.split(a, [1, 3], axis=1)
        outs = (lax.pad(a, q, ((1, -1, 1), (-2, 3, 0))),
                lax.pad(a, 0.0, ((0, 0, 2), (1, 1, 1))),
                lax.pad(a, c, ((-3, 1, 0), (0, -4, 0))),
                lax.pad(a, c, ((-2, -1, 2), (-1, -2, 1))),
                lax.pad((a * 4).astype(jnp.int32), -7, ((2, 0, 1), (0, 1, 0))),
                jnp.stack([a, a * 2], axis=1), jnp.stack(rows, axis=-1), *rows, *parts,
                jnp.stack([a > 0, a < 0]))
        return c + q, outs
    return lax.scan(step, jnp.float32(0.5), (x, p))


def top_ks(x, i):
    """lax.top_k in XLA's total order (NaN first, -NaN last, 0.0 before
    -0.0, ties by lower index), k of 1, 3 and the whole row, along either
    axis; int32 rows with ties."""
    def step(c, v):
        a, b = v
        outs = (*lax.top_k(a + c, 3), *lax.top_k(a, a.shape[-1]), *lax.top_k(a, 1),
                *lax.top_k(a, 2, axis=0), *lax.top_k(b, 4))
        return c + 1.0, outs
    return lax.scan(step, jnp.float32(0.0), (x, i))


def _top_k_rows():
    rows = np.tile(SPECIAL, (3, 2, 1)).reshape(3, 4, 8)
    rows[:, :, 1] = np.float32(-np.nan)
    rows[1] = normal(4, 8)
    ints = rng.integers(-3, 4, size=(3, 5, 9)).astype(np.int32)
    return rows, ints


def reshapes_and_products(x, w, wt, xb):
    """jnp.tile, lax.reshape with dimensions (a transpose first),
    device_put and optimization_barrier (values as they are), and products
    large enough for the BLAS (as they lie, either operand transposed,
    batched) beside a small one that stays loops."""
    def step(c, v):
        a, b = v
        outs = (jnp.tile(a[:2, :3], (2, 3)), jnp.tile(a[0], 2),
                lax.reshape(a[:4, :6], (6, 4), dimensions=(1, 0)),
                lax.reshape(a[:2, :3], (3, 2), dimensions=(1, 0)),
                jax.device_put(a[0]) * 2, lax.optimization_barrier(a[1]) + c,
                a @ w, a @ wt.T, (a[:, :64].T @ a[:, :64])[:3], jnp.einsum("bij,bjk->bik", b, b),
                a[:2, :3] @ w[:3, :2])
        return c + jnp.sum(a[0]), outs
    return lax.scan(step, jnp.float32(0.0), (x, xb))


def windows(x, n):
    """lax.reduce_window sum/max/min with padding (as cumsum's lowering
    writes it), strides, window and base dilation, negative padding; NaN,
    -0.0 and ints; cumsum/cumprod/cummax/cummin along either axis, both
    directions; max and min pools' gradients (select_and_scatter_add, ties
    and NaN selected as XLA does)."""
    def step(c, v):
        a, k = v
        outs = (lax.reduce_window(a, 0.0, lax.add, (1, 3), (1, 1), ((0, 0), (2, 0))),
                lax.reduce_window(a, -jnp.inf, lax.max, (2, 2), (1, 2), "SAME"),
                lax.reduce_window(a, jnp.inf, lax.min, (2, 3), (2, 1), ((1, 0), (0, -1)),
                                  window_dilation=(1, 2)),
                lax.reduce_window(a, 0.0, lax.add, (2, 2), (1, 1), ((1, 1), (0, 1)),
                                  base_dilation=(2, 1)),
                lax.reduce_window(k, 0, lax.add, (3, 1), (1, 1), "VALID"),
                lax.reduce_window(k, jnp.iinfo(jnp.int32).min, lax.max, (1, 4), (1, 3), "SAME"),
                jnp.cumsum(a, axis=1), jnp.cumsum(a, axis=0), lax.cumsum(a, axis=1, reverse=True),
                lax.cumprod(a * 0.5, axis=0, reverse=True), lax.cummax(a, axis=1),
                lax.cummin(a, axis=0), jnp.cumsum(k, axis=1), lax.cummax(k, axis=0, reverse=True),
                jax.grad(lambda b: jnp.sum(lax.reduce_window(
                    b, -jnp.inf, lax.max, (2, 2), (2, 2), "SAME") * b[:2, :3]))(a),
                jax.grad(lambda b: jnp.sum(jnp.sin(lax.reduce_window(
                    b, jnp.inf, lax.min, (3, 2), (1, 2), ((1, 1), (0, 0))))))(a))
        return c + outs[0][0, 0], outs
    return lax.scan(step, jnp.float32(0), (x, n))


def rounding(x):
    """lax.round half away from zero and half to even on halves, near-halves,
    -0.0, NaN, +-inf and large values; nextafter (towards +-inf, zero, NaN;
    from zero: the smallest denormal); lax.platform_dependent (the CPU's
    branch), as jax.scipy's solvers write it."""
    def step(c, a):
        outs = (lax.round(a), lax.round(a, lax.RoundingMethod.TO_NEAREST_EVEN), jnp.round(a),
                jnp.round(a * 10, 1),
                lax.platform_dependent(a, cpu=lambda v: v * 2, default=lambda v: v - 1),
                lax.platform_dependent(a, tpu=lambda v: v * 3, default=lambda v: v + c),
                jnp.nextafter(a, jnp.float32(jnp.inf)), jnp.nextafter(a, -a),
                jnp.nextafter(a * 0, a))
        return c + 1, outs
    return lax.scan(step, jnp.float32(0), x)


ROUNDING = np.array([[0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.49999997],
                     [-0.3, 0.3, -0.0, 0.0, np.nan, np.inf, -np.inf, 8388609.0],
                     [3.5e9, -7.5, 7.5, 1e-30, -1e-30, 2.4999998, 101.5, -1e38]], np.float32)


def convolutions(x, w, g, v):
    """lax.conv_general_dilated as flax (NHWC/HWIO) and equinox (NCHW/OIHW)
    write it: SAME and explicit padding, strides, lhs dilation (a transposed
    convolution), rhs dilation, feature groups, a 1-D convolution; and the
    gradients of a convolution with respect to both operands, which
    differentiation writes as convolutions with swapped dimension numbers."""
    nhwc = ("NHWC", "HWIO", "NHWC")

    def loss(image, kernel):
        out = lax.conv_general_dilated(image, kernel, (1, 1), "SAME", dimension_numbers=nhwc)
        return jnp.sum(jnp.tanh(out) * out)

    def step(c, images):
        a, b = images
        outs = (lax.conv_general_dilated(a, w, (1, 1), "SAME", dimension_numbers=nhwc),
                lax.conv_general_dilated(a, w, (2, 1), ((1, 0), (2, 2)), dimension_numbers=nhwc),
                lax.conv_general_dilated(a, w, (1, 1), ((1, 1), (0, 0)), lhs_dilation=(2, 1),
                                         dimension_numbers=nhwc),
                lax.conv_general_dilated(a, w, (1, 1), "VALID", rhs_dilation=(2, 2),
                                         dimension_numbers=nhwc),
                lax.conv_general_dilated(b, g, (1, 1), ((0, 1), (1, 0)), feature_group_count=2),
                lax.conv_general_dilated(b[:, :, 0], g[:, :, 0], (2,), "SAME",
                                         feature_group_count=2),
                *jax.grad(loss, argnums=(0, 1))(a * c, w))
        return c + 0.25, outs
    return lax.scan(step, jnp.float32(1.0), (x, v))


def complex_numbers(z, w, x):
    """complex64 arithmetic (add, sub, mul, Smith's div, neg, conj, exp,
    integer powers, abs), real/imag/lax.complex, real <-> complex
    conversions, complex and mixed dot_general, sums, pads, slices,
    concatenations, and an S5-style linear recurrence by associative_scan."""
    def combine(a, b):
        return a[0] * b[0], a[1] * b[0] + b[1]

    def step(c, v):
        a, b, r = v
        m = jnp.outer(a, jnp.conj(b))
        ramp = lax.associative_scan(combine, (jnp.exp(a * 0.1), b))[1]
        outs = (a + b, a - b, a * b, a / b, -a, jnp.conj(a), jnp.exp(a * 0.5), a ** 3, a ** -2,
                jnp.abs(a), jnp.real(a), jnp.imag(b), lax.complex(r, r * 2),
                r.astype(jnp.complex64) + a, a * r, r * 1j, m @ a, r @ m, jnp.sum(m, axis=0),
                jnp.pad(a, 2), jnp.concatenate([a[1:], b[:2]]), ramp, c * a)
        return c + jnp.sum(a).real, outs
    return lax.scan(step, jnp.float32(0.5), (z, w, x))


def _complex_rows():
    z = (normal(3, 5) + 1j * normal(3, 5)).astype(np.complex64)
    w = (normal(3, 5) + 1j * normal(3, 5)).astype(np.complex64)
    w[0, :2] = [1e-3 + 4j, 3 - 1e-3j]  # each branch of Smith's division
    return z, w, normal(3, 5)


def total_order(pairs, sorted_rows, queries):
    """XLA's total-order comparisons (-NaN < -inf < -0.0 < 0.0 < inf < NaN)
    as bound directly and as searchsorted binds them."""
    def step(c, v):
        a, b = v
        return c, (P.lt_to_p.bind(a, b), P.le_to_p.bind(a, b), P.eq_to_p.bind(a, b),
                   jnp.searchsorted(sorted_rows, queries),
                   jnp.searchsorted(sorted_rows, queries, side="right"))
    return lax.scan(step, jnp.int32(0), pairs)


def _total_order_rows():
    specials = np.array([np.nan, -np.nan, -np.inf, -1.0, -0.0, 0.0, 1e-40, 1.0, np.inf, 3.0],
                        np.float32)
    pairs = np.stack([np.repeat(specials, 10), np.tile(specials, 10)]).reshape(2, 4, 25)
    sorted_rows = np.sort(normal(16))
    queries = np.array([-3, -0.5, 0.0, -0.0, 0.3, 2.9, np.nan, np.inf, -np.inf], np.float32)
    return (pairs[0], pairs[1]), sorted_rows, queries


def cond_gradient(xs):
    """The gradient of a cond in a scan: its untaken branch's residuals are
    `empty2` placeholders."""
    def total(xs):
        def step(c, x):
            return c + lax.cond(x > 0, lambda v: jnp.sin(v) * v, lambda v: v * 2.0, x), None
        return lax.scan(step, jnp.float32(0), xs)[0]
    return jax.grad(total)(xs)


def sorting(x, k):
    """lax.sort of short rows along either axis: NaN last (every NaN equal),
    -0.0 equal to 0.0 (stable: their order kept), ties, -inf; two keys; the
    other operands carried (argsort); int keys; descending (jnp)."""
    def step(c, v):
        a, n = v
        outs = (jnp.sort(a, axis=1), jnp.sort(a, axis=0), jnp.argsort(a, axis=1),
                lax.sort((n, a), num_keys=2), lax.sort((a, n, a * 2), num_keys=1),
                jnp.sort(n, axis=1), jnp.sort(a, axis=1, descending=True),
                jnp.argsort(n, axis=0, stable=True))
        return c + outs[0][0, 0], outs
    return lax.scan(step, jnp.float32(0), (x, k))


def _sort_rows():
    x = normal(2, 4, 6)
    x[0, 0] = [np.nan, 1.0, -np.nan, -0.0, 0.0, -np.inf]
    x[0, 1] = [0.0, -0.0, 0.0, -0.0, 2.0, 2.0]
    x[1, 2] = [3.0, 3.0, 3.0, -1.0, np.inf, np.nan]
    k = rng.integers(-2, 3, size=(2, 4, 6)).astype(np.int32)
    return x, k


def _long_sort_rows():
    """Rows of 70 along axis 1 (merge-sorted: longer than INSERTION_ROW),
    with the specials of _sort_rows spread over them."""
    x = normal(2, 4, 70)
    x[0, 0, :6] = [np.nan, 1.0, -np.nan, -0.0, 0.0, -np.inf]
    x[0, 1, ::7] = [0.0, -0.0, 0.0, -0.0, 2.0, 2.0, 0.0, -0.0, 2.0, np.nan]
    x[1, 2, 60:] = [3.0, 3.0, 3.0, -1.0, np.inf, np.nan, 3.0, -0.0, 0.0, -np.inf]
    k = rng.integers(-2, 3, size=(2, 4, 70)).astype(np.int32)
    return x, k


def _window_rows():
    x = normal(2, 4, 6)
    x[0, 1, 2], x[0, 2, 4], x[1, 0, 0] = np.nan, -0.0, 0.0
    x[1, :2, :2] = 2.0  # a pooling window of ties
    x[1, 3] = [-np.inf, 1.0, np.inf, 2.0, -0.0, 0.0]
    n = rng.integers(-5, 6, size=(2, 4, 6)).astype(np.int32)
    return x, n


def _spectral(spd, m):
    """eigh and svd as what does not depend on the vectors' signs: values
    and reconstructions."""
    w, v = jnp.linalg.eigh(spd)
    u, s, vt = jnp.linalg.svd(m)
    return w, (v * w) @ v.T, jnp.linalg.svd(m[:, :4], compute_uv=False), (u * s) @ vt


def factorizations(a, b):
    """Small Cholesky (positive definite, and not: NaN as XLA), triangular
    solves on both sides, LU (pivots, permutation), QR, eigh and svd in a scan's body:
    below the library sizes, the lax pack's decompositions written in loops
    (large ones call LAPACK: test_program_kernels)."""
    def step(c, v):
        m, r = v
        spd = m @ m.T + 6 * jnp.eye(6)
        factor = lax.linalg.cholesky(spd)
        tri = 0.1 * m + 3 * jnp.eye(6)
        outs = (factor, lax.linalg.cholesky(m, symmetrize_input=True),
                lax.linalg.triangular_solve(tri, r, left_side=True, lower=True),
                lax.linalg.triangular_solve(tri, r.T, left_side=False, lower=False,
                                            transpose_a=True, unit_diagonal=True),
                *lax.linalg.lu(m), *jnp.linalg.qr(m), jnp.linalg.solve(spd, r),
                *_spectral(spd, m))
        return c + factor[0, 0], outs
    return lax.scan(step, jnp.float32(0), (a, b))


CASES = {
    "windows": (windows, _window_rows()),
    "rounding": (rounding, (ROUNDING,)),
    "sorting": (sorting, _sort_rows()),
    "long_sorting": (sorting, _long_sort_rows()),
    "total_order": (total_order, _total_order_rows()),
    "cond_gradient": (cond_gradient, (normal(7),)),
    "complex_numbers": (complex_numbers, _complex_rows()),
    "convolutions": (convolutions, (normal(2, 2, 6, 5, 3), normal(3, 2, 3, 4), normal(4, 2, 3, 2),
                                    normal(2, 2, 4, 5, 4))),
    "integer_division": (integer_division, (
        np.array([7, -7, 7, -7, 0, 5, INT_MIN, INT_MIN, INT_MAX, 3, -3, 9, INT_MIN, -1], np.int32),
        np.array([2, 2, -2, -2, 3, 0, -1, 2, -1, 0, 7, -4, INT_MIN, INT_MIN], np.int32),
        np.array([7, 0, 2**32 - 1, 5, 9, 2**31, 3, 1, 0, 8, 13, 100, 6, 4], np.uint32),
        np.array([2, 3, 2, 0, 4, 7, 2**32 - 1, 1, 0, 3, 5, 9, 6, 4], np.uint32))),
    "float_rem_pow": (float_rem_pow, _special_pairs(np.float32)),
    "float64_rem_pow": (float_rem_pow, _special_pairs(np.float64)),
    "gathers": (gathers, (normal(10), normal(5, 4),
                          rng.integers(-12, 14, size=(4, 6)).astype(np.int32),
                          rng.integers(-3, 6, size=(4, 3, 2)).astype(np.int32))),
    "scatters": (scatters, _scatter_args()),
    "arg_extremes": (arg_extremes, _extreme_rows()),
    "pads_and_stacks": (pads_and_stacks, (normal(3, 4, 5), normal(3))),
    "top_k": (top_ks, _top_k_rows()),
    "factorizations": (factorizations, (normal(2, 6, 6), normal(2, 6, 3))),
    "reshapes_and_products": (reshapes_and_products, (normal(2, 16, 256), normal(256, 128) / 16,
                                                      normal(128, 256) / 16,
                                                      normal(2, 4, 24, 24) / 5)),
}


@pytest.fixture(scope="module")
def compiled():
    return compile_lowered(lower_cases(CASES))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    fn, args = CASES[name]
    with jax.enable_x64(_x64(name)):
        assert _generated_loops(fn, args) <= {("mojo", "lower_scan"), ("mojo", "lower_while")}, \
            _generated_loops(fn, args)
        got, expected = compiled[name](*args), jax.jit(fn)(*args)
    # pow and fmod are libm's in both; the tolerance covers the float32
    # transcendental helpers of the other outputs, and the order in which
    # convolutions sum (juju's and XLA's results are equally far, ~1.5e-5,
    # from float64's on the gradients).
    tolerance = {"rtol": 2e-6, "atol": 1e-6}
    if name == "convolutions":
        tolerance = {"rtol": 1e-5, "atol": 5e-5}
    if name == "factorizations":  # the decompositions' order of summation, not LAPACK's
        tolerance = {"rtol": 1e-5, "atol": 1e-5}
    if name == "reshapes_and_products":  # the BLAS's order of summation, not XLA's
        tolerance = {"rtol": 1e-5, "atol": 2e-5}
    assert_same(got, expected, **({} if _x64(name) else tolerance))
    for g, e in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        g, e = juju.to_numpy(g), np.asarray(e)
        if e.dtype.kind == "f":  # -0.0 where XLA has it (fmod, pow, copies, min/max)
            zero = (g == 0) & (e == 0)
            np.testing.assert_array_equal(np.signbit(g[zero]), np.signbit(e[zero]))


def test_convolutions_as_products(monkeypatch):
    """The same convolutions, forward and both gradients, each one product on
    the BLAS (im2col) however small: every layout (NHWC/HWIO, NCHW/OIHW, the
    gradients' swapped dimension numbers), padding, strides and dilations."""
    from juju_kernels_mojo.codegen import conv

    from juju_kernels_mojo import blas
    if blas.find() is None:
        pytest.skip("no BLAS found (numpy's)")
    taken = []

    def as_gemm(*args, **kw):
        taken.append(original(*args, **kw))
        return taken[-1]

    original = conv._as_gemm
    monkeypatch.setattr(conv, "_as_gemm", as_gemm)
    monkeypatch.setattr(conv, "GEMM_MIN_WORK", 0)
    fn, args = CASES["convolutions"]
    got = juju.jit(fn)(*args)
    assert sum(taken) >= 7, taken  # all but the grouped ones
    assert_same(got, jax.jit(fn)(*args), rtol=1e-5, atol=5e-5)


def test_unwritten_modes_are_refused():
    """An index mode the generator does not write (ONE_HOT) is refused, so
    the loop keeps lax's rule, not a wrong kernel."""
    x, idx = Array("x", (4,), np.dtype(np.float32)), Array("i", (2, 1), np.dtype(np.int32))
    out = Array("r", (2,), np.dtype(np.float32))
    common = {"indices_are_sorted": False, "unique_indices": False,
              "mode": lax.GatherScatterMode.ONE_HOT}
    gather = dict(dimension_numbers=GDN(offset_dims=(), collapsed_slice_dims=(0,),
                                        start_index_map=(0,)),
                  slice_sizes=(1,), fill_value=None, **common)
    scatter = dict(dimension_numbers=SDN(update_window_dims=(), inserted_window_dims=(0,),
                                         scatter_dims_to_operand_dims=(0,)),
                   update_jaxpr=None, update_consts=(), **common)
    with pytest.raises(Unsupported, match="ONE_HOT"):
        Emitter().equation(P.gather_p, [x, idx], [out], gather)
    with pytest.raises(Unsupported, match="ONE_HOT"):
        Emitter().equation(P.scatter_p, [x, idx, out], [x], scatter)


_CORE_PROBE = """
import ctypes, json, os
from juju_kernels_mojo import blas
lib = blas.find()
name = getattr(ctypes.CDLL(lib.path), blas._CORENAME['numpy'])
name.restype = ctypes.c_char_p
print(json.dumps([name().decode(), os.environ.get('OPENBLAS_CORETYPE')]))
"""


@pytest.mark.parametrize("asked, expected", [(None, "SkylakeX"), ("Haswell", "Haswell")])
def test_juju_blas_copy_uses_avx512_kernels_where_the_cpu_has_them(asked, expected):
    """juju's private OpenBLAS takes its AVX-512 kernels on an AVX-512 CPU
    even where OPENBLAS_CORETYPE (meant for numpy's copy) or OpenBLAS's own
    detection says AVX2 (float32 products 1.9x faster on an AMD EPYC); the
    variable is left as it was, and JUJU_OPENBLAS_CORETYPE decides instead."""
    import json
    import os
    import subprocess
    import sys

    from juju_kernels_mojo import blas
    if blas.find() is None or "scipy_openblas64_" not in blas.find().path:
        pytest.skip("no numpy OpenBLAS")
    if not blas._cpu_flags() >= blas._AVX512_FLAGS:
        pytest.skip("no AVX-512 on this CPU")
    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell")
    env.pop("JUJU_OPENBLAS_CORETYPE", None)
    if asked is not None:
        env["JUJU_OPENBLAS_CORETYPE"] = asked
    out = subprocess.run([sys.executable, "-c", _CORE_PROBE], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == [expected, "Haswell"]
