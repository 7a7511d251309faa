"""juju-kernels-mojo: JAX primitives backed by Mojo kernels.

The Mojo sources ship in `juju_kernels_mojo/kernels/`; `library_path()` builds
them once per Mojo/MAX version and source hash into the user's cache (see
`build_kernel_library`). Rules that call these kernels name the library
`"juju_kernels_mojo"` in `Rule.requires`, so juju adds it to every graph that
uses one of them.

New primitives: `add_one`, `fma` (fused x * y + z), `row_logsumexp`.
Kernels for lax primitives MAX has no op for (at `Priority.KERNEL`): integer
`and`/`or`/`xor`/`not`, `shift_left`, `shift_right_logical`,
`shift_right_arithmetic`, `population_count`, `clz`, and `threefry2x32`;
on the CPU, `cholesky`, `lu` and `triangular_solve` of real matrices (their
own library, `juju_linalg`: linalg_rules.py); on the CPU, `sort`, `top_k` and
the cumulative reductions (`juju_sequence`: sequence_rules.py); on the CPU,
float32/float64 `dot_general` through numpy's OpenBLAS (`juju_blas`:
blas_rules.py); on the CPU, `fft` of every kind and length (`juju_fft`:
fft_rules.py). On the CPU, `scan` and
`while` loops whose bodies the `codegen` package can write become one generated
kernel each (loop_rules.py; a library per loop, `juju_loop_<hash>`).
"""

from pathlib import Path

import juju
from juju_kernels_mojo.build import build_kernel_library, cache_dir, source_hash
from juju_kernels_mojo.lowering import broadcast_operands, call_kernel

__version__ = "0.1.0"

LIBRARY = "juju_kernels_mojo"
KERNEL_DIR = Path(__file__).resolve().parent / "kernels"


def library_path() -> Path:
    """The compiled kernel library of this pack (built on first use)."""
    return build_kernel_library(KERNEL_DIR, LIBRARY)


kernel_library = juju.KernelLibrary(LIBRARY, path=library_path)

LINALG_LIBRARY = "juju_linalg"
LINALG_KERNEL_DIR = Path(__file__).resolve().parent / "linalg_kernels"


def linalg_library_path() -> Path:
    """The compiled library of the factorization kernels (linalg_rules.py)."""
    return build_kernel_library(LINALG_KERNEL_DIR, LINALG_LIBRARY)


linalg_library = juju.KernelLibrary(LINALG_LIBRARY, path=linalg_library_path)

SEQUENCE_LIBRARY = "juju_sequence"
SEQUENCE_KERNEL_DIR = Path(__file__).resolve().parent / "sequence_kernels"


def sequence_library_path() -> Path:
    """The compiled library of sort, top_k and cumulative kernels (sequence_rules.py)."""
    return build_kernel_library(SEQUENCE_KERNEL_DIR, SEQUENCE_LIBRARY)


sequence_library = juju.KernelLibrary(SEQUENCE_LIBRARY, path=sequence_library_path)

BLAS_LIBRARY = "juju_blas"
BLAS_KERNEL_DIR = Path(__file__).resolve().parent / "blas_kernels"


def blas_library_path() -> Path:
    """The compiled library of the BLAS-backed matrix product (blas_rules.py)."""
    return build_kernel_library(BLAS_KERNEL_DIR, BLAS_LIBRARY)


blas_library = juju.KernelLibrary(BLAS_LIBRARY, path=blas_library_path)

FFT_LIBRARY = "juju_fft"
FFT_KERNEL_DIR = Path(__file__).resolve().parent / "fft_kernels"


def fft_library_path() -> Path:
    """The compiled library of the FFT kernels (fft_rules.py)."""
    return build_kernel_library(FFT_KERNEL_DIR, FFT_LIBRARY)


fft_library = juju.KernelLibrary(FFT_LIBRARY, path=fft_library_path)

from juju_kernels_mojo.primitives import add_one, fma, row_logsumexp  # noqa: E402

__all__ = [
    "build_kernel_library", "cache_dir", "source_hash", "call_kernel", "broadcast_operands",
    "library_path", "kernel_library", "LIBRARY", "KERNEL_DIR", "linalg_library_path",
    "linalg_library", "LINALG_LIBRARY", "LINALG_KERNEL_DIR", "sequence_library_path",
    "sequence_library", "SEQUENCE_LIBRARY", "SEQUENCE_KERNEL_DIR", "blas_library_path",
    "blas_library", "BLAS_LIBRARY", "BLAS_KERNEL_DIR", "fft_library_path", "fft_library",
    "FFT_LIBRARY", "FFT_KERNEL_DIR", "add_one", "fma",
    "row_logsumexp",
]
