"""Random jax.numpy/lax programs for the fuzzing tier, drawn with hypothesis.

A `Program` is data: its inputs (arrays holding special values: NaN, +-inf,
-0.0, denormals, integer extremes) and 3-8 steps, each one op applied to
earlier values (inputs or step results). Its function returns every step's
result, so one program checks each op it composes. A step is kept only if
`jax.eval_shape` accepts it, so the generator may propose freely (any
operand, any axis) and invalid combinations are simply redrawn.

`Program.source()` prints the program as Python, to reproduce a mismatch.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from jax import lax

DTYPES = ["float32", "float16", "bfloat16", "int32", "bool"]
DTYPES_X64 = ["float64", "int64", "float32", "int32", "bool"]


def np_dtype(name: str) -> np.dtype:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def kind(dtype) -> str:
    """'f' for floats (bfloat16 included), 'i' for integers, 'b' for bool."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return "b"
    return "i" if np.issubdtype(dtype, np.integer) else "f"


# --- special values ------------------------------------------------------------


def _specials(dtype: np.dtype) -> list:
    if kind(dtype) == "b":
        return [True, False]
    if kind(dtype) == "i":
        info = np.iinfo(dtype)
        return [int(info.min), int(info.max), 0, -1, 1, int(info.min) + 1]
    info = ml_dtypes.finfo(dtype)
    return [math.nan, math.inf, -math.inf, -0.0, 0.0, float(info.smallest_subnormal),
            -float(info.smallest_subnormal), float(info.max), -float(info.max),
            float(info.smallest_normal), 1.0, -1.0]


def _elements(dtype: np.dtype):
    specials = st.sampled_from(_specials(dtype))
    if kind(dtype) == "b":
        return st.booleans()
    if kind(dtype) == "i":
        plain = st.integers(-20, 20)
    else:
        plain = st.floats(-8, 8, width=32).map(lambda v: float(np.asarray(v, dtype)))
    return st.one_of(plain, plain, specials)


@st.composite
def shapes(draw, max_size: int = 48):
    rank = draw(st.integers(0, 4))
    dims = [draw(st.sampled_from([1, 2, 3, 4, 5, 0, 1, 2, 3])) for _ in range(rank)]
    while math.prod(dims) > max_size:
        dims[dims.index(max(dims))] -= 1
    return tuple(dims)


@st.composite
def arrays(draw, dtype_names: list[str]):
    dtype = np_dtype(draw(st.sampled_from(dtype_names)))
    shape = draw(shapes())
    size = math.prod(shape)
    values = draw(st.lists(_elements(dtype), min_size=size, max_size=size))
    return np.asarray(values, dtype=dtype).reshape(shape)


# --- steps -----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]  # indices into the program's values (inputs, then steps)
    params: tuple[tuple[str, object], ...] = ()

    def apply(self, values):
        return OPS[self.op](*(values[i] for i in self.args), **dict(self.params))

    def source(self, index: int) -> str:
        args = [f"v{i}" for i in self.args] + [f"{k}={_repr(v)}" for k, v in self.params]
        return f"v{index} = {self.op}({', '.join(args)})"


def _repr(value):
    if isinstance(value, np.ndarray):
        return f"np.array({value.tolist()!r}, np.{value.dtype})"
    return repr(value)


def _unary(fn):
    return lambda x: fn(x)


def _take(x, *, idx, axis, mode):
    return jnp.take(x, idx, axis=axis, mode=mode)


def _at(x, u, *, idx, how):
    ref = x.at[idx]
    return getattr(ref, how)(u.astype(x.dtype))


def _dot(x, y):
    return jnp.matmul(x, y) if x.ndim and y.ndim else x * y


OPS: dict[str, Callable] = {
    # elementwise, unary
    "exp": jnp.exp, "log": jnp.log, "sqrt": jnp.sqrt, "tanh": jnp.tanh, "sin": jnp.sin,
    "abs": jnp.abs, "negative": jnp.negative, "floor": jnp.floor, "sign": jnp.sign,
    "isnan": jnp.isnan, "isfinite": jnp.isfinite, "isinf": jnp.isinf, "sigmoid": jax.nn.sigmoid,
    "square": jnp.square, "log1p": jnp.log1p, "expm1": jnp.expm1, "round": jnp.round,
    "reciprocal": jnp.reciprocal, "nan_to_num": jnp.nan_to_num, "invert": jnp.invert,
    "logical_not": jnp.logical_not, "relu": jax.nn.relu,
    # elementwise, binary (broadcasting)
    "add": jnp.add, "subtract": jnp.subtract, "multiply": jnp.multiply, "maximum": jnp.maximum,
    "minimum": jnp.minimum, "true_divide": jnp.true_divide, "lax_div": lax.div,
    "lax_rem": lax.rem, "power": jnp.power, "equal": jnp.equal, "not_equal": jnp.not_equal,
    "less": jnp.less, "less_equal": jnp.less_equal, "greater": jnp.greater,
    "greater_equal": jnp.greater_equal, "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or, "bitwise_xor": jnp.bitwise_xor,
    "where": jnp.where, "clip": lambda x, *, lo, hi: jnp.clip(x, lo, hi),
    "astype": lambda x, *, dtype: x.astype(np_dtype(dtype)),
    # reductions
    "sum": jnp.sum, "prod": jnp.prod, "max": jnp.max, "min": jnp.min, "mean": jnp.mean,
    "any": jnp.any, "all": jnp.all, "argmax": jnp.argmax, "argmin": jnp.argmin,
    # shapes
    "reshape": jnp.reshape, "transpose": jnp.transpose, "slice": lambda x, *, index: x[index],
    "concatenate": lambda x, y, *, axis: jnp.concatenate([x, y], axis=axis),
    "expand_dims": jnp.expand_dims, "squeeze": jnp.squeeze, "flip": jnp.flip,
    "broadcast_to": jnp.broadcast_to,
    # the rest
    "dot": _dot, "cumsum": jnp.cumsum, "cumprod": jnp.cumprod,
    "cummax": lambda x, *, axis: lax.cummax(x, axis=axis), "sort": jnp.sort,
    "argsort": jnp.argsort, "take": _take, "at": _at,
}

UNARY = {
    "f": ["exp", "log", "sqrt", "tanh", "sin", "abs", "negative", "floor", "sign", "isnan",
          "isfinite", "isinf", "sigmoid", "square", "log1p", "expm1", "round", "reciprocal",
          "nan_to_num", "relu"],
    "i": ["abs", "negative", "sign", "square", "invert"],
    "b": ["logical_not", "invert"],
}
BINARY = {
    "f": ["add", "subtract", "multiply", "maximum", "minimum", "true_divide", "power", "lax_rem"],
    "i": ["add", "subtract", "multiply", "maximum", "minimum", "lax_div", "lax_rem",
          "bitwise_xor"],
    "b": ["logical_and", "logical_or", "bitwise_xor", "maximum", "minimum"],
}
COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]
REDUCE = ["sum", "prod", "max", "min", "mean", "any", "all", "argmax", "argmin"]


def _axis(draw, ndim: int, *, allow_none=True, allow_tuple=True):
    if ndim == 0:
        return None
    options = ["int"] + (["none"] if allow_none else []) + (["tuple"] if allow_tuple else [])
    pick = draw(st.sampled_from(options))
    if pick == "none":
        return None
    if pick == "int":
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(axes)


def _factorize(draw, size: int) -> tuple[int, ...]:
    if size == 0:
        return draw(st.sampled_from([(0,), (0, 3), (2, 0), (-1,)]))
    dims, rest = [], size
    for p in (2, 3, 5, 7):
        while rest % p == 0 and draw(st.booleans()):
            dims.append(p)
            rest //= p
    dims.append(rest)
    dims = [d for d in draw(st.permutations(dims))]
    if draw(st.booleans()):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    if len(dims) > 1 and draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return tuple(dims)


def _draw_step(draw, avals: list, dtype_names: list[str]) -> Step:
    pick = lambda: draw(st.integers(0, len(avals) - 1))
    i = pick()
    x = avals[i]
    k, nd = kind(x.dtype), x.ndim
    family = draw(st.sampled_from(["unary", "binary", "binary", "compare", "where", "astype",
                                   "reduce", "reduce", "shape", "shape", "other", "other",
                                   "clip"]))
    if family == "unary":
        return Step(draw(st.sampled_from(UNARY[k])), (i,))
    if family in ("binary", "compare"):
        j = pick()
        op = draw(st.sampled_from(BINARY[k] if family == "binary" else COMPARE))
        return Step(op, (i, j) if draw(st.booleans()) else (j, i))
    if family == "where":
        return Step("where", (pick(), i, pick()))
    if family == "astype":
        return Step("astype", (i,), (("dtype", draw(st.sampled_from(dtype_names))),))
    if family == "clip":
        lo = draw(st.sampled_from([-1.0, 0.0, -math.inf, math.nan]))
        return Step("clip", (i,), (("lo", lo), ("hi", draw(st.sampled_from([1.0, 2.5, math.nan])))))
    if family == "reduce":
        op = draw(st.sampled_from(REDUCE))
        arg = op in ("argmax", "argmin")
        params = [("axis", _axis(draw, nd, allow_tuple=not arg))]
        if draw(st.booleans()):
            params.append(("keepdims", True))
        return Step(op, (i,), tuple(params))
    if family == "shape":
        op = draw(st.sampled_from(["reshape", "transpose", "slice", "concatenate", "expand_dims",
                                   "squeeze", "flip", "broadcast_to"]))
        if op == "reshape":
            return Step(op, (i,), (("shape", _factorize(draw, math.prod(x.shape))),))
        if op == "transpose":
            return Step(op, (i,), (("axes", tuple(draw(st.permutations(range(nd))))),))
        if op == "slice":
            index = tuple(
                slice(draw(st.integers(-3, 3)), draw(st.sampled_from([None, -1, 1, 2, 4])),
                      draw(st.sampled_from([None, 1, 2, -1])))
                for _ in range(draw(st.integers(0, nd)))
            )
            return Step(op, (i,), (("index", index),))
        if op == "concatenate":
            return Step(op, (i, pick()), (("axis", draw(st.integers(-max(nd, 1), max(nd, 1) - 1))),))
        if op == "expand_dims":
            return Step(op, (i,), (("axis", draw(st.integers(-nd - 1, nd))),))
        if op == "squeeze":
            return Step(op, (i,), (("axis", _axis(draw, nd, allow_tuple=False)),))
        if op == "flip":
            return Step(op, (i,), (("axis", _axis(draw, nd)),))
        return Step(op, (i,), (("shape", (draw(st.integers(0, 3)),) + x.shape),))
    op = draw(st.sampled_from(["dot", "cumsum", "cumprod", "cummax", "sort", "argsort", "take",
                               "take", "at", "at"]))
    if op == "dot":
        return Step(op, (i, pick()))
    if op in ("cumsum", "cumprod", "cummax", "sort", "argsort"):
        axis = draw(st.integers(-nd, nd - 1)) if nd else 0
        return Step(op, (i,), (("axis", axis),))
    n = x.shape[0] if nd else 1
    idx = np.asarray(draw(st.lists(st.integers(-n - 1, n), min_size=0, max_size=5)), np.int32)
    if op == "take":
        mode = draw(st.sampled_from(["clip", "fill", "wrap"]))
        return Step(op, (i,), (("idx", idx), ("axis", 0 if nd else None), ("mode", mode)))
    how = draw(st.sampled_from(["set", "add", "multiply", "min", "max"]))
    return Step(op, (i, pick()), (("idx", idx), ("how", how)))


@dataclasses.dataclass(eq=False)  # hashable by identity, as jax.jit wants
class Program:
    inputs: list[np.ndarray]
    steps: list[Step]
    x64: bool = False

    def __call__(self, *args):
        values = list(args)
        for step in self.steps:
            values.append(step.apply(values))
        return tuple(values[len(args):])

    def source(self) -> str:
        n = len(self.inputs)
        head = [f"# x64={self.x64}"] + [f"v{i} = {_repr(a)}" for i, a in enumerate(self.inputs)]
        body = [step.source(n + j) for j, step in enumerate(self.steps)]
        return "\n".join(head + body)


def _valid(step: Step, avals: list):
    try:
        out = jax.eval_shape(lambda *v: step.apply(v), *avals)
    except Exception:  # noqa: BLE001 - jax rejects the step: the caller draws another
        return None
    return out if math.prod(out.shape) <= 512 else None


@st.composite
def programs(draw, x64: bool = False):
    """A program of 3-8 steps over 1-3 inputs (x64: float64/int64 inputs too)."""
    dtype_names = DTYPES_X64 if x64 else DTYPES
    inputs = [draw(arrays(dtype_names)) for _ in range(draw(st.integers(1, 3)))]
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs]
    steps: list[Step] = []
    wanted = draw(st.integers(3, 8))
    for _ in range(4 * wanted):
        if len(steps) == wanted:
            break
        step = _draw_step(draw, avals, dtype_names)
        out = _valid(step, avals)
        if out is not None:
            steps.append(step)
            avals.append(out)
    return Program(inputs, steps, x64)
