"""Arguments and results: a leaf's signature, and conversion to and from MAX buffers.

The layer under everything that runs a graph: `signature` reads what
`jax.jit` would see of an argument (shape, dtype, weak type), `to_buffer`
hands it to MAX without a copy where it can, `unshare` copies the outputs
MAX returns in an input's memory, and `to_numpy`/`to_jax` convert results
of any dtype.
"""

from __future__ import annotations

import functools
import math
import weakref

import jax
import numpy as np

from juju._compat import (
    PRNGKeyArray,
    Tracer,
    canonical_dtype,
    is_key_dtype,
    key_data,
    python_scalar_dtype,
)
from juju.buffers import host_buffer, max_driver, numpy_dtype_of, to_numpy
from juju.dtypes import is_symbolic_dim, physical_aval

def leaf_signature(leaf) -> tuple:
    """(shape, dtype, weak_type) as jax.jit would see this argument."""
    handler = _SIGNATURES.get(type(leaf))
    if handler is None:
        handler = _signature_handler(type(leaf))
    return handler(leaf)


def _numpy_signature(leaf):
    return (leaf.shape, canonical_dtype(leaf.dtype), False)


def _scalar_signature(leaf):
    return ((), python_scalar_dtype(leaf), True)


def _bool_signature(leaf):  # JAX never weakly types bools
    return ((), _BOOL, False)


_BOOL = np.dtype(np.bool_)


def _jax_signature(leaf):
    return (leaf.shape, leaf.dtype, leaf.weak_type)


def _keys_signature(leaf):
    return (leaf.shape, leaf.dtype, False)


def _generic_signature(leaf):
    return ((), canonical_dtype(leaf.dtype), False)


def _buffer_signature(leaf):
    return (tuple(leaf.shape), numpy_dtype_of(leaf.dtype.name), False)


def _spec_signature(leaf):
    if is_key_dtype(leaf.dtype):  # a jax.ShapeDtypeStruct of PRNG keys
        return (tuple(leaf.shape), leaf.dtype, False)
    return (tuple(leaf.shape), canonical_dtype(leaf.dtype), bool(leaf.weak_type))


_SIGNATURES: dict = {np.ndarray: _numpy_signature}
for _t in (int, float, complex):
    _SIGNATURES[_t] = _scalar_signature
_SIGNATURES[bool] = _bool_signature


def _signature_handler(kind):
    """Find (and remember) how to read the signature of a leaf type."""
    from max.driver import Buffer

    if issubclass(kind, Tracer):
        raise TracerSeen
    if issubclass(kind, np.ndarray):
        handler = _numpy_signature
    elif issubclass(kind, PRNGKeyArray):
        handler = _keys_signature
    elif issubclass(kind, jax.Array):
        handler = _jax_signature
    elif issubclass(kind, np.generic):
        handler = _generic_signature
    elif issubclass(kind, Buffer):
        handler = _buffer_signature
    elif issubclass(kind, jax.ShapeDtypeStruct):  # ahead-of-time lowering
        handler = _spec_signature
    else:
        raise TypeError(
            f"juju.jit: argument of type {kind.__name__} is not an array; pass arrays, "
            "Python scalars or MAX buffers, or mark the argument static with "
            "static_argnums/static_argnames."
        )
    _SIGNATURES[kind] = handler
    return handler


class TracerSeen(Exception):
    """A leaf is a JAX tracer: the call happens under a JAX transformation."""


def _buffer_from_buffer(leaf, dtype, device):
    return leaf if leaf.device == device else leaf.to(device)


# jax arrays up to this size go through a numpy copy: faster than DLPack for
# small arrays (jax's __dlpack__ costs ~17 us, a small copy ~1 us).
_SMALL_BYTES = 1 << 16


# --- the MAX buffers of live jax arrays ----------------------------------------
# A jax array never changes, so the MAX buffer made of it (or the MAX result
# it was made of) serves every later call it is passed to, while it lives:
# a training loop feeding a step's results back, or weights passed to every
# call, then costs a dictionary lookup per leaf instead of a copy (~2 us).
# MAX never writes into its inputs. Keyed by id(), checked by a weak
# reference (jax arrays are not hashable), forgotten when the array dies.

_buffers: dict[int, tuple] = {}  # id(array) -> (weakref to it, device, MAX buffer)


def _remember(array, device, buffer) -> None:
    key = id(array)

    def forget(ref, key=key):
        entry = _buffers.get(key)
        if entry is not None and entry[0] is ref:
            _buffers.pop(key, None)

    try:
        _buffers[key] = (weakref.ref(array, forget), device, buffer)
    except TypeError:  # an array type without weak references
        pass


def _recall(array, device):
    entry = _buffers.get(id(array))
    if entry is not None and entry[0]() is array and entry[1] == device:
        # A deleted array (x.delete()) is converted anew, so jax's error says so.
        return None if array.is_deleted() else entry[2]
    return None


def buffer_from_jax(leaf, dtype, device):
    buffer = _recall(leaf, device)
    if buffer is None:
        buffer = _convert_jax(leaf, device)
        _remember(leaf, device, buffer)
    return buffer


def _convert_jax(leaf, device):
    if leaf.dtype.kind == "c":  # DLPack would carry a dtype MAX lacks
        return _buffer_from_array(leaf, leaf.dtype, device)
    if math.prod(leaf.shape) * leaf.dtype.itemsize <= _SMALL_BYTES:  # jax's nbytes is slow
        buffer = host_buffer(np.array(leaf, order="C"))
    else:
        try:
            buffer = max_driver().Buffer.from_dlpack(leaf)  # zero-copy
        except Exception:  # dtypes DLPack cannot carry: go through numpy
            buffer = host_buffer(np.array(leaf, order="C"))
    return buffer if buffer.device == device else buffer.to(device)


def _buffer_from_array(leaf, dtype, device):
    array = np.asarray(leaf)
    if array.dtype != dtype:
        array = array.astype(dtype)  # as jax.jit does, e.g. float64 without x64
    if not (array.flags.c_contiguous and array.flags.writeable):
        array = np.array(array, order="C")  # keeps 0-d arrays 0-d
    buffer = host_buffer(array)  # zero-copy
    return buffer if buffer.device == device else buffer.to(device)


def _buffer_from_scalar(leaf, dtype, device):
    buffer = host_buffer(np.array(leaf, dtype))
    return buffer if buffer.device == device else buffer.to(device)


def _buffer_from_keys(leaf, dtype, device):
    """A PRNG key array travels as its raw key data (see dtypes.physical_aval)."""
    return buffer_from_jax(key_data(leaf), None, device)


def _converter(kind):
    from max.driver import Buffer

    if issubclass(kind, Buffer):
        return _buffer_from_buffer
    if issubclass(kind, PRNGKeyArray):
        return _buffer_from_keys
    if issubclass(kind, jax.Array):
        return buffer_from_jax
    if kind in (int, float, bool, complex):
        return _buffer_from_scalar
    return _buffer_from_array


_CONVERTERS: dict = {}


def to_buffer(leaf, dtype, device):
    convert = _CONVERTERS.get(type(leaf))
    if convert is None:
        convert = _CONVERTERS[type(leaf)] = _converter(type(leaf))
    return convert(leaf, dtype, device)



def input_nbytes(closed_jaxpr) -> tuple | None:
    """Bytes of each MAX input buffer of a graph; None if a shape is symbolic."""
    sizes = []
    for aval in closed_jaxpr.in_avals:
        physical = physical_aval(aval)
        if any(is_symbolic_dim(d) for d in physical.shape):
            return None
        sizes.append(math.prod(physical.shape) * np.dtype(physical.dtype).itemsize)
    return tuple(sizes)


def to_jax(buffer):
    """A jax array of a MAX buffer: zero-copy where DLPack can carry the dtype
    and the buffer is in host memory (juju's jax runs on the CPU)."""
    if numpy_dtype_of(buffer.dtype.name).kind == "V" or not buffer.device.is_host:
        array = jax.numpy.asarray(to_numpy(buffer))
    else:
        array = jax.numpy.from_dlpack(buffer)
    _remember(array, buffer.device, buffer)
    return array


@functools.cache
def _identity():
    return jax.jit(lambda *arrays: arrays)


def to_jax_all(buffers: list) -> list:
    """`to_jax` of each buffer. The small host ones go to jax together as
    numpy views through one call of a jitted identity: jax makes arrays from
    numpy in C++, ~5 us a call plus ~3 per array, where `jnp.from_dlpack`
    costs ~22 us an array."""
    small = {}
    for i, buffer in enumerate(buffers):
        if buffer.device.is_host and buffer.num_elements * buffer.element_size <= _SMALL_BYTES:
            view = to_numpy(buffer)
            # jax would narrow a 64-bit dtype without x64 (from_dlpack keeps it)
            if view.dtype.itemsize < 8 or jax.dtypes.canonicalize_dtype(view.dtype) == view.dtype:
                small[i] = view
    arrays = dict(zip(small, _identity()(*small.values()))) if small else {}
    for i, array in arrays.items():
        _remember(array, buffers[i].device, buffers[i])
    return [arrays[i] if i in arrays else to_jax(b) for i, b in enumerate(buffers)]
