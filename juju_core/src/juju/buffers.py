"""MAX buffers and numpy arrays, both ways, without jax.

The part of argument handling that `juju.serving` shares with `juju.jit`:
it imports only numpy and `max`, so an exported function can be served
where jax is not installed. `host_buffer` hands a numpy array to MAX
without a copy, `to_numpy` reads any dtype back, and `unshare` copies the
outputs MAX returns in an input's memory.
"""

from __future__ import annotations

import bisect
import functools

import numpy as np

from juju.errors import UnsupportedDtypeError

_UINT_OF_SIZE = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}

# numpy dtypes from ml_dtypes share their names with MAX's DTypes.
_ML_DTYPES = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")


@functools.cache
def max_driver():
    from max import driver

    return driver


try:  # the address of a buffer's memory (private in MAX 26.7, hence the guard)
    from max.driver import Buffer as _Buffer

    _data_ptr = _Buffer._data_ptr
except (ImportError, AttributeError):
    _data_ptr = None


@functools.cache
def max_dtype_of(dtype: np.dtype):
    """The MAX DType of a numpy dtype of the same name (bfloat16 and float8 included)."""
    from max.dtype import DType

    try:
        return DType[np.dtype(dtype).name]
    except KeyError:
        raise UnsupportedDtypeError(f"dtype {np.dtype(dtype).name} has no MAX equivalent") from None


@functools.cache
def numpy_dtype_of(name: str) -> np.dtype:
    """The numpy dtype of a MAX DType's name; bfloat16 and float8 need the
    `ml_dtypes` package (jax's dependency: a serving machine may lack it)."""
    if name in _ML_DTYPES:
        try:
            import ml_dtypes
        except ImportError:
            raise UnsupportedDtypeError(
                f"numpy has no {name} dtype without the ml_dtypes package: "
                "`pip install ml_dtypes` to pass or read such arrays"
            ) from None
        return np.dtype(getattr(ml_dtypes, name))
    try:
        return np.dtype(name)
    except TypeError:
        raise UnsupportedDtypeError(f"MAX dtype {name} has no numpy equivalent") from None


def complex_parts(array: np.ndarray) -> np.ndarray:
    """A complex numpy array's physical form: float[..., 2], a view where the
    array is contiguous."""
    array = np.asarray(array, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    part = np.finfo(array.dtype).dtype
    return array.reshape(-1).view(part).reshape(*array.shape, 2)


def complex_from_parts(parts: np.ndarray, dtype) -> np.ndarray:
    """The inverse of `complex_parts`: float[..., 2] -> complex[...]."""
    parts = np.asarray(parts, order="C")
    return parts.reshape(-1).view(np.dtype(dtype)).reshape(parts.shape[:-1])


def host_buffer(array: np.ndarray):
    """A MAX buffer viewing a contiguous, writable numpy array."""
    Buffer = max_driver().Buffer
    try:
        # Buffer.from_numpy re-checks what we know and costs ~3 us more. It
        # also fails on 0-d bools (its view needs a last axis); numpy cannot
        # export bools through DLPack, so they travel as uint8 views.
        if array.dtype.kind == "c":  # as float[..., 2] (dtypes.physical_aval)
            return Buffer._from_dlpack(complex_parts(array))
        if array.dtype == np.bool_ or array.dtype.kind == "V":  # bool, bfloat16, float8
            carrier = array.view(_UINT_OF_SIZE[array.dtype.itemsize])
            return Buffer._from_dlpack(carrier).view(max_dtype_of(array.dtype), array.shape)
        return Buffer._from_dlpack(array)
    except AttributeError:  # a MAX without the native constructor
        return Buffer.from_numpy(array)


def to_numpy(value) -> np.ndarray:
    """A numpy array of a MAX buffer (or anything array-like), any dtype.

    Unlike `Buffer.to_numpy()`, this also handles bfloat16 and float8, which
    MAX cannot export through DLPack.
    """
    Buffer = max_driver().Buffer
    if not isinstance(value, Buffer):
        return np.asarray(value)
    dtype = numpy_dtype_of(value.dtype.name)
    if dtype.kind != "V":
        try:  # Buffer.to_numpy's checks cost ~0.4 us more (results are read per call)
            array = np.from_dlpack(value)
        except (RuntimeError, BufferError):  # device memory: MAX copies it to the host
            return value.to_numpy()
        return array if array.flags.writeable else array.copy()
    carrier = _UINT_OF_SIZE[dtype.itemsize]
    return value.view(max_dtype_of(np.dtype(carrier)), value.shape).to_numpy().view(dtype)


def unshare(outs: list, inputs: list, in_nbytes) -> None:
    """Copy each output that MAX handed back in an input's memory.

    MAX returns an input's own buffer, or a view into it, for outputs it can
    alias: identities, reshapes, slices, same-dtype casts and broadcasts, and
    ops it folds away (`x * 1.0`, `x + 0`). Inputs are zero-copy views of the
    caller's numpy and jax arrays, and results must not change when the
    caller writes into those (JAX arrays are immutable), so such outputs are
    copied; the others never are.
    """
    if _data_ptr is None:  # a MAX without the address accessor: copy all
        outs[:] = [o.copy() for o in outs]
        return
    if in_nbytes is None:
        in_nbytes = [b.num_elements * b.element_size for b in inputs]
    spans = sorted((_data_ptr(b), n) for b, n in zip(inputs, in_nbytes) if n)
    if not spans:
        return
    # Binary search over the inputs' spans by start, with the furthest end
    # reached so far (spans may overlap): a pairwise check cost ~30 us for a
    # training step's 20 inputs and outputs.
    starts, reach, furthest = [], [], 0
    for start, size in spans:
        starts.append(start)
        furthest = max(furthest, start + size)
        reach.append(furthest)
    copied = None
    for i, out in enumerate(outs):
        address = _data_ptr(out)
        j = bisect.bisect_right(starts, address) - 1
        if j >= 0 and address < reach[j]:
            outs[i] = copied = out.copy()
    if copied is not None:  # MAX copies asynchronously: done before the caller writes
        copied.device.synchronize()
