"""The small, frozen context every lowering rule receives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
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
        return ops.constant(array.item(), target, device=device)
    return ops.constant(array, target, device=device)
