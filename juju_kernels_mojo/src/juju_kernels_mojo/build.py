"""Building Mojo kernel packages into cached `.mojoc` files.

`build_kernel_library(source_dir, name)` runs `mojo precompile` from the
installed `mojo` package (never a `mojo` found through the working directory)
and caches the result in the user's cache directory, keyed by the Mojo and MAX
versions and a hash of the sources. A build writes into a private temporary
directory and renames the result into place, under a file lock, so two
processes building at once neither clash nor build twice; an unchanged library
is never rebuilt.

Cache directory: `$JUJU_CACHE_DIR/kernels`, else
`$XDG_CACHE_HOME/juju/kernels`, else `~/.cache/juju/kernels`.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path

from juju import CompileError

log = logging.getLogger("juju")

_built: dict[tuple[str, str], Path] = {}
_lock = threading.Lock()

#: Seconds the last `mojo precompile` in this process took (None: cache hit).
last_build_seconds: float | None = None


def cache_dir() -> Path:
    """Where compiled kernel libraries are kept."""
    root = os.environ.get("JUJU_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "kernels"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "juju" / "kernels"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


@functools.lru_cache(maxsize=None)
def toolchain_versions() -> str:
    """The compiler versions a cached library depends on (a folder name)."""
    return f"mojo-{_version('mojo')}-max-{_version('max')}"


@functools.lru_cache(maxsize=None)
def _toolchain_fingerprint() -> bytes:
    dists = ("mojo", "mojo-compiler", "max", "max-core")
    return "|".join(f"{d}={_version(d)}" for d in dists).encode()


def source_hash(source_dir: os.PathLike | str) -> str:
    """Hash of the toolchain versions and of every Mojo source file under
    `source_dir` (relative paths and contents)."""
    source_dir = Path(source_dir)
    digest = hashlib.sha256(_toolchain_fingerprint())
    files = sorted(
        p for p in source_dir.rglob("*") if p.suffix in (".mojo", ".🔥") and p.is_file()
    )
    if not files:
        raise FileNotFoundError(f"no .mojo files in kernel directory {source_dir}")
    for path in files:
        digest.update(b"\0" + path.relative_to(source_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def build_kernel_library(source_dir: os.PathLike | str, name: str) -> Path:
    """The compiled `.mojoc` of the Mojo package in `source_dir`, built if needed.

    `source_dir` holds an `__init__.mojo` (may be empty) and the kernel files
    (every `@register` in them is found). `name` names the library in the cache
    and in error messages. Returns an absolute path in `cache_dir()`; the
    first build takes seconds, later calls (any process) only hash the sources.
    Raises `juju.CompileError` with the compiler's output when the build fails.
    """
    global last_build_seconds
    if not name.isidentifier():
        raise ValueError(
            f"kernel library name {name!r} must be an identifier: it becomes the "
            "Mojo package name"
        )
    source_dir = Path(source_dir).resolve()
    if not (source_dir / "__init__.mojo").exists():
        raise FileNotFoundError(
            f"kernel library '{name}': {source_dir} is not a Mojo package "
            "(it needs an __init__.mojo, which may be empty)"
        )
    key = (str(source_dir), name)
    digest = source_hash(source_dir)
    target = cache_dir() / toolchain_versions() / f"{name}-{digest}" / f"{name}.mojoc"
    with _lock:
        cached = _built.get(key)
        if cached == target and target.exists():
            return target
        if target.exists():
            _built[key] = target
            last_build_seconds = None
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / ".lock", "w") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)  # another process may be building
            try:
                if not target.exists():
                    last_build_seconds = _precompile(source_dir, target, name)
                else:
                    last_build_seconds = None
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
        _built[key] = target
        return target


def _run_mojo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the Mojo compiler of the installed `mojo` package (not one on PATH)."""
    try:
        from mojo.run import subprocess_run_mojo
    except ImportError as exc:
        raise CompileError(
            "building Mojo kernels needs the 'mojo' package: pip install 'mojo==1.2.*'"
        ) from exc
    try:
        return subprocess_run_mojo(args, cwd=cwd, capture_output=True, text=True)
    except RuntimeError as exc:  # the package is there but its compiler is not
        raise CompileError(f"cannot run the Mojo compiler: {exc}") from exc


def _precompile(source_dir: Path, target: Path, name: str) -> float:
    # The .mojoc records its Mojo package name from the output file's name, so
    # build `<name>.mojoc` in a private directory and rename it into place.
    tmp_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    tmp = tmp_dir / target.name
    start = time.perf_counter()
    try:
        proc = _run_mojo(["precompile", str(source_dir), "-o", str(tmp)], cwd=tmp_dir)
        if proc.returncode != 0 or not tmp.exists():
            raise CompileError(
                f"mojo precompile of kernel library '{name}' ({source_dir}) failed "
                f"with exit code {proc.returncode}:\n{(proc.stderr or proc.stdout).strip()}"
            )
        os.replace(tmp, target)  # atomic: readers see no file or a whole one
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    elapsed = time.perf_counter() - start
    log.info("juju: built kernel library '%s' in %.1f s -> %s", name, elapsed, target)
    return elapsed
