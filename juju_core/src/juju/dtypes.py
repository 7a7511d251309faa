"""Mapping between JAX/numpy dtypes and MAX `DType`s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import ml_dtypes
from max.dtype import DType

from juju._compat import physical_aval as _physical_aval
from juju.buffers import complex_from_parts, complex_parts  # noqa: F401  (re-exported)
from juju.buffers import numpy_dtype_of
from juju.errors import UnsupportedDtypeError

_NUMPY_TO_MAX = {
    np.dtype(np.bool_): DType.bool,
    np.dtype(np.int8): DType.int8,
    np.dtype(np.int16): DType.int16,
    np.dtype(np.int32): DType.int32,
    np.dtype(np.int64): DType.int64,
    np.dtype(np.uint8): DType.uint8,
    np.dtype(np.uint16): DType.uint16,
    np.dtype(np.uint32): DType.uint32,
    np.dtype(np.uint64): DType.uint64,
    np.dtype(np.float16): DType.float16,
    np.dtype(np.float32): DType.float32,
    np.dtype(np.float64): DType.float64,
    np.dtype(ml_dtypes.bfloat16): DType.bfloat16,
    np.dtype(ml_dtypes.float8_e4m3fn): DType.float8_e4m3fn,
    np.dtype(ml_dtypes.float8_e5m2): DType.float8_e5m2,
    np.dtype(ml_dtypes.float8_e4m3fnuz): DType.float8_e4m3fnuz,
    np.dtype(ml_dtypes.float8_e5m2fnuz): DType.float8_e5m2fnuz,
}
_MAX_TO_NUMPY = {v: k for k, v in _NUMPY_TO_MAX.items()}


def is_float(dtype) -> bool:
    """Floating point, bfloat16 and float8 included (numpy does not count
    ml_dtypes' types as `np.floating`)."""
    return bool(jnp.issubdtype(dtype, jnp.floating))


def max_dtype(dtype) -> DType:
    """The MAX DType for a numpy/JAX dtype; a clear error when there is none."""
    try:
        return _NUMPY_TO_MAX[np.dtype(dtype)]
    except (KeyError, TypeError):
        pass
    name = getattr(dtype, "name", str(dtype))
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        raise UnsupportedDtypeError(
            f"dtype {name} is not supported here: MAX graphs have no complex dtype; "
            "juju carries complex arrays as (real, imaginary) float pairs, and this "
            "rule does not handle them. Run this part with jax.jit, or split it into "
            "real and imaginary parts (jnp.real / jnp.imag)."
        )
    raise UnsupportedDtypeError(
        f"dtype {name} has no MAX equivalent; supported dtypes: "
        + ", ".join(sorted(str(d) for d in _NUMPY_TO_MAX))
    )


def numpy_dtype(dtype: DType) -> np.dtype:
    """The numpy dtype for a MAX DType."""
    return numpy_dtype_of(dtype.name)


def physical_aval(aval):
    """The aval a graph carries for `aval`: itself; for a PRNG key array its
    raw key data (uint32[..., 2] for threefry), as XLA carries keys; for a
    complex array its parts, float[..., 2] (real, imaginary)."""
    return _physical_aval(aval)


# --- symbolic dimensions (jax.export shape polymorphism) ------------------------

def max_dim(d):
    """A JAX dimension as MAX takes it: an int, or for a symbolic dimension
    (`jax.export.symbolic_shape`) the same expression over MAX `Dim`s."""
    from max.graph import Dim, StaticDim

    if isinstance(d, Dim) and not isinstance(d, StaticDim):
        return d  # already a MAX symbolic or algebraic dimension
    if not is_symbolic_dim(d):
        return int(d)

    def floordiv(a, b):
        return a // b

    def unsupported(*_):
        raise NotImplementedError(f"symbolic dimension {d} has no MAX equivalent")

    names = {n: Dim(n) for n in d.get_vars()}
    scope = {"floordiv": floordiv, "mod": unsupported, "max": unsupported,
             "min": unsupported, "non_negative": unsupported, **names}
    return eval(str(d), {"__builtins__": {}}, scope)  # JAX prints Python syntax


def max_shape(shape) -> list:
    """`max_dim` of every dimension."""
    return [max_dim(d) for d in shape]


def is_symbolic_dim(d) -> bool:
    return jax.export.is_symbolic_dim(d)


def static_shape(shape) -> list[int] | None:
    """The shape as ints (JAX or MAX dimensions), or None if any is symbolic."""
    try:
        return [int(d) for d in shape]
    except (TypeError, ValueError, jax.errors.InconclusiveDimensionOperation):
        return None
