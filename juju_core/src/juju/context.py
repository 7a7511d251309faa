"""The small, frozen context every lowering rule receives."""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops

from juju import dtypes


@dataclass(frozen=True)
class LoweringContext:
    """What a rule may know about the equation it lowers.

    Attributes:
        eqn: the Jaxpr equation (primitive, params, source info).
        avals_in: abstract values (shape, dtype) of the operands.
        avals_out: abstract values the rule must produce, checked after it runs.
        device: the MAX device the graph is built for.
        lower: re-enters the interpreter: `lower(jaxpr, *args, consts=())`
            lowers a (closed) sub-jaxpr on MAX values and returns its outputs.
            `None` while only selecting rules (the pre-pass).
    """

    eqn: Any
    avals_in: tuple
    avals_out: tuple
    device: DeviceRef
    lower: Callable[..., list[TensorValue]] | None

    @property
    def primitive(self):
        """The equation's JAX primitive."""
        return self.eqn.primitive

    @property
    def params(self) -> dict:
        """The equation's parameters (the rule also receives them as keyword
        arguments)."""
        return self.eqn.params

    @property
    def aval_out(self):
        """The single output aval (for single-result primitives)."""
        (aval,) = self.avals_out
        return aval

    def max_dtype(self, dtype):
        """The MAX `DType` of a JAX or numpy dtype; raises
        `UnsupportedDtypeError` for one MAX lacks."""
        return dtypes.max_dtype(dtype)

    def constant(self, value, dtype) -> TensorValue:
        """A constant on this context's device, with JAX dtype `dtype`."""
        array = np.asarray(value, dtype=dtype)
        return constant(array, self.device)

    def opaque(self, value: TensorValue) -> TensorValue:
        """`value`, in a form MAX's graph simplifier cannot see through.

        MAX 26.7 simplifies as if no value were NaN, infinite or -0.0: it
        folds x * 0 to 0 and x - x to 0 (IEEE: NaN for an infinite or NaN
        x). A rule hides the operand such a fold keys on; the value is the
        same at runtime."""
        return opaque(value)


def constant(array: np.ndarray, device: DeviceRef) -> TensorValue:
    """A MAX constant for a numpy array of any supported dtype."""
    array = np.asarray(array)
    if array.dtype.kind == "c":  # carried as float[..., 2] (dtypes.physical_aval)
        return constant(dtypes.complex_parts(array), device)
    target = dtypes.max_dtype(array.dtype)
    if array.dtype.kind == "V":
        # ml_dtypes (bfloat16, float8_*) are not understood by ops.constant;
        # they widen to float32 exactly, so build there and cast back.
        return ops.cast(constant(array.astype(np.float32), device), target)
    if array.ndim == 0:  # a 0-d numpy array would come back with shape (1,)
        value = ops.constant(array.item(), target, device=device)
    else:
        value = ops.constant(array, target, device=device)
    return opaque(value) if _read_as_zero_or_one(array) else value


def opaque(value: TensorValue) -> TensorValue:
    """`value` behind a select MAX cannot resolve (`LoweringContext.opaque`);
    `value` itself in a graph without a runtime input to make the select's
    condition from."""
    never = _runtime_false(value.device)
    if never is None:
        return value
    other = ops.constant(1 if value.dtype == DType.bool else 2, value.dtype, device=value.device)
    return ops.where(never, other, value)


# The graph's inputs while a graph is built (build_graph): runtime values.
_graph_inputs: contextvars.ContextVar[tuple] = contextvars.ContextVar(
    "juju_graph_inputs", default=())


@contextlib.contextmanager
def graph_inputs(values):
    """Make the inputs of the graph being built known to `constant`."""
    token = _graph_inputs.set(tuple(values))
    try:
        yield
    finally:
        _graph_inputs.reset(token)


def _read_as_zero_or_one(array: np.ndarray) -> bool:
    """Whether MAX 26.7 would take float64 `array` for a constant 0 or 1.

    Its graph simplifier tests a float64 constant for the identities of
    x * 0, x * 1, x / 1 and x + 0 after rounding it to float32, so x * 1e-300
    gave 0, x + 1e-50 gave x and x * (1 + 1e-10) gave x (tests/test_nan.py).
    It folds any op of constants (a cumsum, a slice) into a new constant
    first, so only a runtime value hides such a constant (`_runtime_false`)."""
    if array.dtype != np.float64 or array.size == 0:
        return False
    with np.errstate(over="ignore", under="ignore"):
        rounded = array.astype(np.float32)
    first = rounded.flat[0]
    return bool(first in (0.0, 1.0) and (rounded == first).all() and (rounded != array).any())


def _runtime_false(device: DeviceRef) -> TensorValue | None:
    """A bool that is always false but that MAX cannot prove false: whether
    0 or 1 (read from the first element of a graph input) is infinite. None
    without a non-empty graph input of static shape (the constant then
    stays as MAX reads it)."""
    for x in _graph_inputs.get():
        dims = dtypes.static_shape(x.shape)
        if dims is None or math.prod(dims) == 0 or x.device != device:
            continue
        first = ops.reshape(ops.slice_tensor(ops.reshape(x, [math.prod(dims)]),
                                             [slice(0, 1)]), [])
        if DType.is_float(first.dtype):
            flag = ops.is_nan(first)
        elif first.dtype == DType.bool:
            flag = first
        else:
            flag = ops.not_equal(first, ops.constant(0, first.dtype, device=device))
        return ops.is_inf(ops.cast(flag, DType.float64))
    return None
