"""Loops as generated Mojo kernels (juju_kernels_mojo/codegen) against jax.jit.

Each case is a scan or while_loop whose body exercises a group of the
equations the generator writes, on special values (NaN, +-inf, -0.0,
integer extremes) where they matter; every case is checked to have been
generated (not left to lax's loop), and every equation the generator
supports appears in some case. All graphs compile in ONE MAX compilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

import juju
from juju._compat import call_primitives
from juju_kernels_mojo import codegen
from tests import test_control_flow as control_flow
from tests.util import assert_same

rng = np.random.default_rng(11)
SPECIAL = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1.5, -2.25, 3e38, -1e-40, 88.0],
                   np.float32)


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def rnn(w, u, b, xs, h0):
    """The scan RNN of issue 17: W @ h (contiguous inner products) and
    x @ U (vectorized over the output row), tanh, stacked outputs."""
    def cell(h, x):
        h = jnp.tanh(w @ h + x @ u + b)
        return h, (h, jnp.sum(h * h))
    return lax.scan(cell, h0, xs)


def unary_math(x):
    """Every float unary op on special values, in a reverse scan."""
    def step(c, v):
        outs = (jnp.exp(v), jnp.log(v), jnp.tanh(v), jnp.sin(v), jnp.cos(v), jnp.sqrt(v),
                lax.rsqrt(v), jnp.log1p(v), jnp.expm1(v), jnp.exp2(v), lax.erf(v),
                jnp.floor(v), jnp.ceil(v), jax.nn.sigmoid(v), jnp.sign(v), jnp.abs(v), -v,
                jnp.isfinite(v), jnp.square(v), v ** 3, v ** -2, jnp.arctan2(v, c))
        return c + 1.0, outs
    return lax.scan(step, jnp.float32(0.5), x, reverse=True)


def binary_math(x, y):
    def step(c, v):
        a, b = v
        outs = (a + b, a - b, a * b, a / b, jnp.maximum(a, b), jnp.minimum(a, b),
                a == b, a != b, a < b, a <= b, a > b, a >= b, lax.clamp(-1.0, a, 2.0),
                jnp.where(a > b, a, c))
        return jnp.maximum(c, a), outs
    return lax.scan(step, jnp.float32(-1.0), (x, y))


def integers(i, u, flags):
    """int32/uint32/bool arithmetic, bitwise ops, casts (float -> int saturates,
    NaN -> 0), select_n on an int index."""
    def step(c, v):
        a, b, f = v
        outs = (a + c, a * b, a - b, jnp.maximum(a, b), jnp.minimum(a, b), -a, jnp.abs(a),
                jnp.sign(a), a & b, a | b, a ^ b, ~a, f & (a > b), ~f, f | (a == 0),
                lax.select_n(jnp.clip(a, 0, 2), a, b, c), a.astype(jnp.float32),
                f.astype(jnp.int32), (a != 0), b.astype(jnp.uint32) * jnp.uint32(3))
        return c + a, outs
    return lax.scan(step, jnp.int32(1), (i, u, flags))


def float_to_int(x):
    def step(c, v):
        return c, (v.astype(jnp.int32), v.astype(bool), v.astype(jnp.uint32))
    return lax.scan(step, 0, x)


def shapes(m, v):
    """Broadcasts, reshapes, transposes, slices, rev, concatenate, iota,
    reductions over several axes, dynamic_slice and dynamic_update_slice."""
    def body(i, s):
        a, acc = s
        t = jnp.transpose(a.reshape(2, 3, 4), (2, 0, 1))[::-1, :, 1:]
        row = lax.dynamic_slice(v, (i * 2,), (3,))  # clamped at the end
        r = jnp.concatenate([row, jnp.arange(3, dtype=jnp.float32)])
        upd = lax.dynamic_update_slice(a, r.reshape(1, 6) * 0.5, (i & 3, 0))
        red = (t.sum(axis=(0, 2)), t.max(axis=1), t.min(), jnp.prod(t[:2], axis=0),
               a[1:3:2, ::2].sum(), jnp.any(a > 1.0), jnp.all(a > -9.0))
        acc = acc + red[0].sum() + red[1].sum() + red[2] + red[3].sum() + red[4] + red[5] + red[6]
        # lax broadcasts a size-1 axis (jnp leaves a[:1] as [1, 6] here)
        return upd + jnp.broadcast_to(r[:1], (4, 6)) * 0.01 + a[:1] * 0.1, acc
    return lax.fori_loop(0, 6, body, (m, jnp.float32(0)))


def dots(a, b, c, d):
    """dot_general forms: batched, two contracting axes, a vector, mixed
    precision, and an int32 matmul."""
    def step(s, x):
        y1 = jnp.einsum("bij,bjk->bik", a, b) + x
        y2 = jnp.einsum("ijk,ijl->kl", a, a)
        y3 = s @ c
        y4 = lax.dot_general(d, d, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        y5 = (d * 2) @ d
        return jnp.tanh(y3) * 0.5, (y1, y2, y4, y5)
    return lax.scan(step, c[0], jnp.ones((5, 2, 3, 5), jnp.float32))


def nested(xs, w):
    """A while inside a scan inside the loop, with a cond choosing a branch."""
    def inner(v):
        def cond(s):
            return (s[1] < 20) & (jnp.abs(s[0]).max() > 1e-3)
        def body(s):
            return s[0] * 0.5, s[1] + 1
        return lax.while_loop(cond, body, (v, 0))

    def step(h, x):
        h2, n = inner(h + x)
        h3 = lax.cond((n & 1) == 0, lambda z: z @ w, lambda z: jnp.sin(z), h2)
        k = lax.switch(jnp.clip(n, 0, 2), [lambda z: z, lambda z: z * 2, lambda z: z - 1], h3)
        return k, (n, k)
    return lax.scan(step, jnp.zeros(4, jnp.float32), xs)


def newton(x0, a):
    """A while_loop with an all-finite predicate (the bench's Newton row)."""
    def cond(s):
        return (s[1] < 50) & jnp.all(jnp.isfinite(s[0]))
    def body(s):
        x, i = s
        return x - (x * x - a) / (2 * x), i + 1
    return lax.while_loop(cond, body, (x0, 0))


def carries(x):
    """Carries that swap and pass through (each new value reads the old
    ones), literal outputs, a scan without xs."""
    def step(c, _):
        a, b, n = c
        return (b, a + b, n), (a, 1.0)
    return lax.scan(step, (x, x * 2, jnp.int32(3)), None, length=7)


def carries_in_place(x, w):
    """Carries whose new values may be stored over the old ones (an
    accumulator, a scaled state, one whose first element is read first)
    next to ones that may not: the old value read after the new one is
    made, or read through a reshape after it; a while loop's accumulator."""
    def step(c, xs):
        acc, s, t, u = c
        acc = acc + xs * w  # in place
        s2 = s * 0.5 + 1.0  # old s read below, after s2 is made: not in place
        flat = t.reshape(-1)  # a view of the old t, read after t's update
        t2 = jnp.tanh(t) - 0.25
        u2 = u + u[:1]  # u[:1] is copied before the loop that updates u
        return (acc, s2, t2, u2), s + s2 + flat.reshape(t.shape)
    carry, ys = lax.scan(step, (x[0] * 0.0, x[1], x[2], x[3]), x)
    total = lax.fori_loop(0, 5, lambda i, a: a * 1.5 + x[i], x[4])
    return carry, ys, total


def wide_copies(x, k, big):
    """Copies whose rows are contiguous (SIMD vectors with a scalar tail):
    an LSTM's gate columns sliced from one product, a concatenation, a pad,
    an update of a row block, a strided slice (scalar), ints, and one
    contiguous run long enough to be split over the cores."""
    def step(c, xs):
        gates = c @ xs  # [6, 4 * 19]: four 19-wide gates, 19 = 2 vectors + a tail
        i, f, g, o = (gates[:, j * 19:(j + 1) * 19] for j in range(4))
        h = jax.nn.sigmoid(i) * jnp.tanh(g) + f * o
        wide = jnp.concatenate([h, c], axis=1)  # [6, 19 + 19]
        padded = jnp.pad(h, ((1, 0), (3, 2)))
        c2 = lax.dynamic_update_slice(c, h[1:4] * 0.5, (2, 0))
        return c2, (wide[:, 1:37:2], padded, k[3:70] + k[2:69])
    xs = jnp.tile(x, (1, 4))[None] * jnp.arange(1.0, 4.0)[:, None, None]  # [3, 19, 76]
    return lax.scan(step, x, xs), big[5:70_005] * 2.0


@jax.custom_vjp
def clipped(x):
    return jnp.clip(x, -1.0, 1.0)


clipped.defvjp(lambda x: (clipped(x), x), lambda x, g: (g * (jnp.abs(x) <= 1.0),))


def wrappers(xs):
    """What programs wrap their math in: jit, checkpoint, custom_jvp
    (relu), custom_vjp, and a gradient (add_any) inside the body."""
    @jax.jit
    def inner(h):
        return jax.checkpoint(lambda z: jnp.sin(z) * z)(h)

    def step(h, x):
        g = jax.grad(lambda z: jnp.sum(z * z + jnp.sin(z)))(h)
        return inner(jax.nn.relu(h + x)) + clipped(g) * 0.1, g
    return lax.scan(step, jnp.ones(5, jnp.float32), xs)


def _scaled_relu(x, *, scale):
    return scale * jnp.maximum(x, 0.0)


# A primitive as libraries define one (equinox's unvmap_any, nonbatchable):
# no rule, a traceable JAX implementation, which the generator writes inline.
scaled_relu_p = Primitive("loop_test_scaled_relu")
scaled_relu_p.def_impl(_scaled_relu)
scaled_relu_p.def_abstract_eval(lambda x, *, scale: jax.core.ShapedArray(x.shape, x.dtype))
mlir.register_lowering(scaled_relu_p, mlir.lower_fun(_scaled_relu, multiple_results=False))


def library_primitive(x):
    def cond(s):
        return s[1] < 4

    def body(s):
        v, i = s
        v = scaled_relu_p.bind(jnp.squeeze(v[None, :, None], (0, 2)) - 1.0, scale=1.5)
        return v, i + 1
    return lax.while_loop(cond, body, (x, 0))


def float64_rnn(w, xs):
    def cell(h, x):
        return jnp.tanh(w @ h + x), h.sum()
    return lax.scan(cell, jnp.ones(9, jnp.float64), xs)


def vector_math(xs, y):
    """The elementwise ops the generator writes in SIMD vectors, over rows
    that are not a multiple of the vector width (a scalar tail), with special
    values, splatted literals and a carried scalar."""
    def step(c, v):
        outs = (jnp.exp(v), jnp.log(v), jnp.tanh(v), jnp.sin(v), jnp.cos(v), jnp.sqrt(v),
                lax.rsqrt(v), jnp.log1p(v), jnp.expm1(v), jnp.exp2(v), lax.erf(v),
                jnp.floor(v), jnp.ceil(v), jax.nn.sigmoid(v), jnp.abs(v), -v, jnp.square(v),
                v + y, v - y, v * y, v / y, v * 2.5 - c, v / c)
        return c * 1.5, outs
    return lax.scan(step, jnp.ones((), xs.dtype), xs)


def _vector_rows(n, dtype):
    row = np.concatenate([SPECIAL, normal(n - SPECIAL.size) * 3]).astype(dtype)
    return np.stack([row, row[::-1], -row])


CASES = {
    "rnn": (rnn, (normal(32, 32) * 0.2, normal(8, 32), normal(32), normal(50, 8),
                  normal(32))),
    "unary_math": (unary_math, (np.concatenate([SPECIAL, normal(6) * 3]),)),
    "binary_math": (binary_math, (np.tile(SPECIAL, 3), np.repeat(SPECIAL[:3], 10))),
    "integers": (integers, (np.array([0, 1, -1, 7, 2**31 - 1, -2**31, 5, -3], np.int32),
                            np.array([3, 0, 2, 7, 1, -1, 5, 4], np.int32),
                            np.array([True, False, True, True, False, False, True, False]))),
    "float_to_int": (float_to_int, (np.concatenate([SPECIAL, [3e9, -3e9, 2.5, -2.5]]).astype(np.float32),)),
    "shapes": (shapes, (normal(4, 6), normal(9))),
    "dots": (dots, (normal(2, 3, 4), normal(2, 4, 5), normal(5, 5),
                    np.arange(-6, 6, dtype=np.int32).reshape(3, 4)[:, :3])),
    "nested": (nested, (normal(6, 4) * 3, normal(4, 4))),
    "newton": (newton, (np.array([3.0, 1.0, -2.0, 0.0, 5.0, 1e-3], np.float32),
                        np.array([2.0, 9.0, 4.0, 1.0, -1.0, 7.0], np.float32))),
    "carries": (carries, (normal(3),)),
    "carries_in_place": (carries_in_place, (normal(6, 8), normal(8))),
    "wrappers": (wrappers, (normal(4, 5),)),
    "wide_copies": (wide_copies, (normal(19, 19) * 0.3, np.arange(70, dtype=np.int32),
                                  normal(70_010))),
    "library_primitive": (library_primitive, (normal(6) * 4,)),
    "vector_math": (vector_math, (_vector_rows(20, np.float32), _vector_rows(20, np.float32)[1])),
    "float64_vector_math": (vector_math, (_vector_rows(22, np.float64),
                                          _vector_rows(22, np.float64)[2])),
    "float64_rnn": (float64_rnn, (normal(9, 9, dtype=np.float64) * 0.3,
                                  normal(12, 9, dtype=np.float64))),
}


def _x64(name):
    return name.startswith("float64")


def _generated_loops(fn, args, kw=None) -> set:
    return {(c.pack, c.rule) for c in juju.explain(fn, *args, **(kw or {}))
            if c.primitive in ("scan", "while")}


# test_control_flow's cases (lax's loops there) whose loops the generator takes.
CONTROL_FLOW = {name: case for name, case in control_flow.CASES.items()
                if _generated_loops(*case) & {("mojo", "lower_scan"), ("mojo", "lower_while")}}


def lower_cases(cases) -> dict:
    """name -> each case's `juju.jit(fn).lower(*args)` (float64 cases with x64)."""
    lowered = {}
    for name, (fn, args) in cases.items():
        with jax.enable_x64(_x64(name)):
            lowered[name] = juju.jit(fn).lower(*args)
    return lowered


def compile_lowered(lowered: dict) -> dict:
    """name -> compiled, all in ONE MAX compilation."""
    return dict(zip(lowered, juju.compile_all(list(lowered.values()))))


@pytest.fixture(scope="module")
def compiled():
    lowered = lower_cases(CASES)
    for name, (fn, args, kw) in CONTROL_FLOW.items():
        lowered["control_flow", name] = juju.jit(fn).lower(*args, **kw)
    return compile_lowered(lowered)


@pytest.mark.parametrize("name", list(CONTROL_FLOW))
def test_control_flow_cases(compiled, name):
    fn, args, kw = CONTROL_FLOW[name]
    assert_same(compiled["control_flow", name](*args, **kw), jax.jit(fn)(*args, **kw),
                rtol=2e-5, atol=2e-5)


def test_control_flow_cases_are_mostly_generated():
    """Most of test_control_flow's loop cases run as generated kernels (the
    rest hold equations the generator leaves to MAX, listed here)."""
    loops = {name for name, (fn, args, kw) in control_flow.CASES.items()
             if _generated_loops(fn, args, kw)}
    assert len(CONTROL_FLOW) >= 0.7 * len(loops), sorted(loops - set(CONTROL_FLOW))


@pytest.mark.parametrize("name", list(CASES))
def test_matches_jax(compiled, name):
    fn, args = CASES[name]
    with jax.enable_x64(_x64(name)):
        got, expected = compiled[name](*args), jax.jit(fn)(*args)
        loops = [c for c in juju.explain(fn, *args) if c.primitive in ("scan", "while")]
    assert loops and {(c.pack, c.rule) for c in loops} == {("mojo", f"lower_{c.primitive}") for c in loops}, loops
    # Transcendentals differ from XLA's approximations by a few ulps.
    assert_same(got, expected, **({} if _x64(name) else dict(rtol=2e-5, atol=2e-6)))


def _primitives(jaxpr, found):
    """The primitives the generator writes for `jaxpr`: its equations', and
    those of the decompositions it writes in their place (random_bits)."""
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            _primitives(sub, found)
        if eqn.primitive not in codegen.EQUATIONS:
            closed = codegen.Emitter.decomposition(
                eqn.primitive, [v.aval for v in eqn.invars], [v.aval for v in eqn.outvars],
                eqn.params)
            if closed is not None:
                _primitives(closed.jaxpr, found)
    return found


def test_cases_cover_every_supported_equation():
    """Here, in test_loop_kernels_ext (the indexing and integer equations) or
    in test_loop_kernels_random (PRNG keys and bit operations)."""
    from tests import test_loop_kernels_ext as ext
    from tests import test_loop_kernels_random as random

    found = set()
    for name, (fn, args) in [*CASES.items(), *ext.CASES.items(), *random.CASES.items()]:
        with jax.enable_x64(_x64(name)):
            _primitives(jax.make_jaxpr(fn)(*args).jaxpr, found)
    supported = set(codegen.EQUATIONS)
    # Call and copy primitives jax no longer writes into traced programs (the
    # call primitive's name differs between jax releases).
    # mojo_program (program_kernels' whole-program call) is tested in
    # test_program_kernels.
    elsewhere = {p.name for p in call_primitives} | {"copy", "copy_p", "core_call",
                                                     "stop_gradient", "mojo_program"}
    missing = {p.name for p in supported - found} - elsewhere
    assert not missing, f"no case exercises {sorted(missing)}"


def test_unsupported_bodies_keep_lax_loops():
    """A body with an equation the generator does not write (an FFT: complex
    values), and one too large for its loops, stay MAX loops."""
    def spectrum_scan(xs):
        return lax.scan(lambda c, x: (c + jnp.abs(jnp.fft.rfft(x))[0], c), 0.0, xs)

    def big(xs):  # 90,000 elements an iteration: past loop_rules.MAX_WORK
        return lax.scan(lambda h, x: (jnp.tanh(h * x + x), None), xs[0], xs)

    for fn, args in ((spectrum_scan, (normal(4, 100),)), (big, (normal(3, 300, 300),))):
        loops = {(c.pack, c.rule) for c in juju.explain(fn, *args) if c.primitive == "scan"}
        assert loops == {("lax", "lower_scan")}, loops
