"""The BLAS that numpy's (or scipy's) wheel ships, found once per process:
juju's private single-threaded copy of it and its `?gemm` symbols. Used by
`blas_rules` (the opt-in `juju_gemm` op) and by generated kernels' large
products (`codegen.dot`)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from juju_kernels_mojo.build import cache_dir

log = logging.getLogger("juju")
_lock = threading.Lock()


@dataclass(frozen=True)
class BlasLibrary:
    """A CBLAS found on this machine: juju's copy of it and its symbol names."""

    path: str
    sgemm: str
    dgemm: str
    ilp64: bool  # 64-bit integer arguments
    #: dtype name -> the library's ?trsm (cblas) and ?potrf (LAPACKE), where
    #: it has them (generated kernels' triangular solves and Cholesky)
    trsm: dict = field(default_factory=dict)
    potrf: dict = field(default_factory=dict)
    getrf: dict = field(default_factory=dict)
    geqrf: dict = field(default_factory=dict)
    orgqr: dict = field(default_factory=dict)
    gemv: dict = field(default_factory=dict)  # matrix-vector products
    syevd: dict = field(default_factory=dict)  # eigh
    gesdd: dict = field(default_factory=dict)  # svd


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
def find() -> BlasLibrary | None:
    """The BLAS on this machine, or None (then nothing calls one)."""
    with _lock:
        return _find()


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
                with _core_type(path, package):
                    handle = ctypes.CDLL(copy)
                found = BlasLibrary(copy, f"{prefix}sgemm{suffix}", f"{prefix}dgemm{suffix}", ilp64,
                                    _present(handle, f"{prefix}{{}}trsm{suffix}"),
                                    _present(handle, f"scipy_LAPACKE_{{}}potrf{suffix}"),
                                    *(_present(handle, f"scipy_LAPACKE_{{}}{name}{suffix}")
                                      for name in ("getrf", "geqrf", "orgqr")),
                                    _present(handle, f"{prefix}{{}}gemv{suffix}"),
                                    *(_present(handle, f"scipy_LAPACKE_{{}}{name}{suffix}")
                                      for name in ("syevd", "gesdd")))
                for symbol in (found.sgemm, found.dgemm):
                    getattr(handle, symbol)
                getattr(handle, set_threads)(1)
            except (OSError, AttributeError) as error:
                log.debug("juju: BLAS %s not usable: %s", path, error)
                continue
            _loaded.append(handle)
            return found
    return None


#: OpenBLAS's AVX-512 kernels, which its own choice passes over on CPUs it
#: does not know (an AMD EPYC with AVX-512 gets "Haswell"): float32 products
#: ran 1.9x faster with them there (1024^2: 17.4 -> 9.4 ms on one core).
_AVX512_CORE = "SkylakeX"
_AVX512_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
_AVX2_CORES = {b"Haswell", b"Zen"}


@contextlib.contextmanager
def _core_type(path: str, package: str):
    """While juju's copy loads: OpenBLAS's AVX-512 kernels where the CPU has
    AVX-512 but OpenBLAS (as numpy loaded it) chose AVX2 ones, whether by its
    own detection or an OPENBLAS_CORETYPE meant for numpy's copy (restored
    after: OpenBLAS reads it once, when it loads). JUJU_OPENBLAS_CORETYPE
    names the core type of juju's copy instead ("" keeps OpenBLAS's)."""
    asked = os.environ.get("JUJU_OPENBLAS_CORETYPE")
    if asked is not None:
        with _environment("OPENBLAS_CORETYPE", asked or None):
            yield
        return
    if not _cpu_flags() >= _AVX512_FLAGS:
        yield
        return
    try:
        name = getattr(ctypes.CDLL(path), _CORENAME[package])
        name.restype = ctypes.c_char_p
        chosen = name()
    except (OSError, AttributeError, KeyError):
        chosen = None
    if chosen not in _AVX2_CORES:
        yield
        return
    with _environment("OPENBLAS_CORETYPE", _AVX512_CORE):
        yield


@contextlib.contextmanager
def _environment(name: str, value: str | None):
    """`name` set to `value` (None: unset) for the block, then as it was."""
    before = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


_CORENAME = {"numpy": "scipy_openblas_get_corename64_", "scipy": "scipy_openblas_get_corename"}


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _present(handle, pattern: str) -> dict:
    """dtype name -> `pattern` for "s" (float32) and "d" (float64), those the
    library exports."""
    found = {}
    for letter, dtype in (("s", "float32"), ("d", "float64")):
        if hasattr(handle, pattern.format(letter)):
            found[dtype] = pattern.format(letter)
    return found
