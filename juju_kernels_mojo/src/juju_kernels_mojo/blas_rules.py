"""dot_general on the CPU through the BLAS library numpy ships (opt-in:
`JUJU_BLAS=1`, read once per process).

MAX compiles its matmul kernel anew for every shape in every graph: about
25 s for a graph's first matmul on 2 cores and ~5 s per further shape, most
of a training step's cold compile (issue 16). `juju_gemm`
(blas_kernels/gemm.mojo) is one small kernel for every shape; it calls the
`cblas_?gemm` of the OpenBLAS that numpy's (or scipy's) wheel ships, the
library `numpy.matmul` uses. With it, float32/float64 products on the CPU
(and float32 sums over leading axes, which juju_ops_lax writes as MAX
matmuls) compile in a fraction of the time. It is not the default: inside a
MAX graph its products of an MLP step (M = 128) run ~20% slower than MAX's
matmul fused with its epilogue (docs/performance.md). The GPU, other
dtypes and machines without such a library keep juju_ops_lax's MAX matmul.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import math
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from jax import ShapeDtypeStruct
from max.graph import ops

import juju
from juju import primitives as P
from juju_kernels_mojo import BLAS_LIBRARY
from juju_kernels_mojo.build import cache_dir
from juju_kernels_mojo.linalg_rules import REAL
from juju_kernels_mojo.lowering import call_kernel

log = logging.getLogger(__name__)

rules = juju.RuleSet(dtypes=REAL)


@dataclass(frozen=True)
class BlasLibrary:
    """A CBLAS found on this machine: juju's copy of it and its symbol names."""

    path: str
    sgemm: str
    dgemm: str
    ilp64: bool  # 64-bit integer arguments


# (package whose wheel ships the library, file pattern, symbol prefix and
# suffix, ilp64, the symbol setting its thread count)
_CANDIDATES = (
    ("numpy", "libscipy_openblas64_*.so", "scipy_cblas_", "64_", True,
     "scipy_openblas_set_num_threads64_"),
    ("scipy", "libscipy_openblas-*.so", "scipy_cblas_", "", False,
     "scipy_openblas_set_num_threads"),
)
_loaded = []  # juju's copy stays loaded for the process
_lock = threading.Lock()


def _private_copy(path: str) -> str:
    """A copy of the library in juju's cache: loaded beside numpy's, it keeps
    its own thread count (1, set below) and leaves numpy's alone. BLAS's own
    threads compete with MAX's for the cores: a multi-threaded OpenBLAS made
    the products of an MLP step up to 2x slower inside a MAX graph."""
    target = cache_dir() / "blas" / Path(path).name
    if not target.exists():  # copied under a private name, renamed whole into place
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, suffix=".part")
        os.close(fd)
        try:
            shutil.copyfile(path, partial)
            os.replace(partial, target)
        finally:
            Path(partial).unlink(missing_ok=True)
    return str(target)


@functools.cache
def cblas() -> BlasLibrary | None:
    """The BLAS `juju_gemm` calls, or None (not asked for with `JUJU_BLAS=1`,
    or no such library)."""
    if os.environ.get("JUJU_BLAS", "0").lower() not in ("1", "on", "true", "yes"):
        return None
    with _lock:
        found = _find()
    if found is None:
        log.warning("juju: JUJU_BLAS=1 but no usable OpenBLAS from numpy or scipy wheels "
                    "(JUJU_LOG_LEVEL=DEBUG says why); products use MAX's matmul")
    return found


def _find() -> BlasLibrary | None:
    for package, pattern, prefix, suffix, ilp64, set_threads in _CANDIDATES:
        try:
            module = __import__(package)
        except ImportError:
            continue
        libs = Path(module.__file__).parent.parent / f"{package}.libs"
        for path in sorted(glob.glob(str(libs / pattern))):
            try:
                copy = _private_copy(path)
                handle = ctypes.CDLL(copy)
                found = BlasLibrary(copy, f"{prefix}sgemm{suffix}", f"{prefix}dgemm{suffix}", ilp64)
                for symbol in (found.sgemm, found.dgemm):
                    getattr(handle, symbol)
                getattr(handle, set_threads)(1)
            except (OSError, AttributeError) as error:
                log.debug("juju: BLAS %s not usable: %s", path, error)
                continue
            _loaded.append(handle)
            return found
    return None


def cpu_blas(ctx) -> bool:
    """A CPU graph, operands and result of one float dtype, no empty axis,
    and a BLAS on this machine."""
    dtypes = {np.dtype(a.dtype) for a in (*ctx.avals_in, ctx.aval_out)}
    return (ctx.device.is_cpu() and len(dtypes) == 1 and dtypes <= set(REAL)
            and all(d > 0 for a in ctx.avals_in for d in a.shape)
            and cblas() is not None)


def _as_matrices(x, shape, batch, contract, free_first):
    """x as [B, free, K] (`free_first`) or [B, K, free]: returns the rank-3
    value and whether it came out the other way round (BLAS transposes it
    for free); permutes only when neither order is x's own."""
    free = [d for d in range(len(shape)) if d not in batch and d not in contract]
    sizes = [math.prod(shape[d] for d in group) for group in (batch, free, contract)]
    natural = list(batch) + free + list(contract)
    swapped = list(batch) + list(contract) + free
    order, other = (natural, swapped) if free_first else (swapped, natural)
    identity = list(range(len(shape)))
    flipped = False
    if order != identity:
        if other == identity:
            flipped = True
        else:
            x = ops.permute(x, order)
    b, f, k = sizes
    first_free = free_first != flipped
    return ops.reshape(x, [b, f, k] if first_free else [b, k, f]), flipped, [shape[d] for d in free]


@rules.register(P.dot_general_p, priority=juju.Priority.KERNEL, guard=cpu_blas,
                requires=(BLAS_LIBRARY,))
def lower_dot_general(ctx, lhs, rhs, *, dimension_numbers, precision=None,
                      preferred_element_type=None, out_sharding=None):
    # precision: CPU products are full float32/float64 ones, as XLA's on the CPU.
    (lc, rc), (lb, rb) = dimension_numbers
    lhs_aval, rhs_aval = ctx.avals_in
    a, transpose_a, lhs_free = _as_matrices(lhs, lhs_aval.shape, lb, lc, free_first=True)
    b, transpose_b, rhs_free = _as_matrices(rhs, rhs_aval.shape, rb, rc, free_first=False)
    batch = [lhs_aval.shape[d] for d in lb]
    m, n = math.prod(lhs_free), math.prod(rhs_free)
    product = _gemm(ctx, a, b, transpose_a, transpose_b, (math.prod(batch), m, n))
    return ops.reshape(product, list(ctx.aval_out.shape))


def _gemm(ctx, a, b, transpose_a, transpose_b, shape):
    """`juju_gemm` of rank-3 a and b into `shape` ([B, M, N])."""
    library = cblas()
    dtype = ctx.aval_out.dtype
    (product,) = call_kernel(
        ctx, "juju_gemm", a, b,
        parameters={
            "library": library.path,
            "gemm_symbol": library.sgemm if np.dtype(dtype) == np.float32 else library.dgemm,
            "ilp64": library.ilp64,
            "transpose_a": transpose_a,
            "transpose_b": transpose_b,
        },
        out_avals=[ShapeDtypeStruct(shape, dtype)])
    return product


def leading_float32_sum(ctx) -> bool:
    """A float32 sum over leading axes (not all) on the CPU: a bias gradient."""
    (aval,) = ctx.avals_in
    axes = tuple(ctx.params["axes"])
    return (ctx.device.is_cpu() and np.dtype(aval.dtype) == np.float32
            and 0 < len(axes) < len(aval.shape) and axes == tuple(range(len(axes)))
            and all(d > 0 for d in aval.shape) and cblas() is not None)


@rules.register(P.reduce_sum_p, priority=juju.Priority.KERNEL, guard=leading_float32_sum,
                requires=(BLAS_LIBRARY,))
def lower_reduce_sum(ctx, x, *, axes, out_sharding=None):
    # juju_ops_lax writes this sum as MAX's matmul with a row of ones (2x
    # faster than MAX's strided reduction): that matmul alone would cost a
    # graph MAX's matmul compile.
    (aval,) = ctx.avals_in
    size = math.prod(aval.shape[:len(axes)])
    post = math.prod(aval.shape[len(axes):])
    ones = ops.broadcast_to(ctx.constant(1.0, np.float32), [1, 1, size])
    total = _gemm(ctx, ones, ops.reshape(x, [1, size, post]), False, False, (1, 1, post))
    return ops.reshape(total, list(ctx.aval_out.shape))
