"""Building Mojo kernel packages into cached `.mojoc` files (and generated
programs into shared libraries).

`build_kernel_library(source_dir, name)` runs `mojo precompile` from the
installed `mojo` package (never a `mojo` found through the working directory)
and caches the result in the user's cache directory, keyed by the Mojo and MAX
versions and a hash of the sources. A build writes into a private temporary
directory and renames the result into place, under a file lock per library
(released by the system when its holder dies), so processes and threads
building at once neither clash nor build twice, and a builder killed at any
point leaves no partial library (its scratch folder is deleted by the next
builder); an unchanged library is never rebuilt. `generated_sources` keeps
generated kernels' sources in the same cache, content-addressed. A build that
a daemon thread would start or finish while the process exits is abandoned
(`juju.compile_pool.abandon_if_exiting`).

Cache directory: `kernels/` in juju's cache folder (`juju.cache.root()`:
`$JUJU_CACHE_DIR`, else the platform's user cache folder). A library found
there is used even when the folder is read-only; when it must be built and
the folder cannot be written, it is built in a private temporary folder for
this process (with a warning): the cache never fails a call.
"""

from __future__ import annotations

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

from filelock import FileLock

from juju import CompileError
from juju import cache as juju_cache
from juju.compile_pool import abandon_if_exiting
from juju.logs import heartbeat

log = logging.getLogger("juju")

_lock = threading.Lock()
_fallback_dir: Path | None = None  # this process's private folder, if the cache is unusable

#: Seconds the last Mojo build in this process took (None: cache hit).
last_build_seconds: float | None = None


def cache_dir() -> Path:
    """Where compiled kernel libraries are kept."""
    return juju_cache.root() / "kernels"


def _private_dir(reason: OSError) -> Path:
    """A temporary folder for this process's builds (the cache is unusable)."""
    global _fallback_dir
    if _fallback_dir is None:
        _fallback_dir = Path(tempfile.mkdtemp(prefix="juju-kernels-"))
        log.warning(
            "juju: cannot write kernel libraries to %s (%s: %s); building them in %s for "
            "this process. Set JUJU_CACHE_DIR to a writable folder to keep them.",
            cache_dir(), type(reason).__name__, reason, _fallback_dir,
        )
    return _fallback_dir


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
    source_dir = _checked_source(source_dir, name)
    if not (source_dir / "__init__.mojo").exists():
        raise FileNotFoundError(
            f"kernel library '{name}': {source_dir} is not a Mojo package "
            "(it needs an __init__.mojo, which may be empty)"
        )
    return _cached_build(source_dir, name, f"{name}.mojoc",
                         lambda out: ["precompile", str(source_dir), "-o", str(out)])


def build_shared_library(source_dir: os.PathLike | str, name: str, main: str) -> Path:
    """The shared library (`mojo build --emit shared-lib`) of the Mojo file
    `main` in `source_dir`, built if needed and cached as `build_kernel_library`
    caches packages; its `@export` functions are called through ctypes."""
    source_dir = _checked_source(source_dir, name)
    return _cached_build(source_dir, name, f"lib{name}.so",
                         lambda out: ["build", "--emit", "shared-lib", str(source_dir / main),
                                      "-o", str(out)])


def generated_sources(name: str, files: dict[str, str]) -> Path:
    """A folder holding `files` (file name -> text), a generated kernel's
    sources, to build: `sources/<name>-<digest of the files>` in the cache.

    Content-addressed and written whole: the files go to a private folder
    that is renamed into place, so processes and threads share the folder,
    never see it partial, and nothing deletes it under a build (a folder
    that no longer holds these files is replaced)."""
    digest = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()[:20]
    relative = Path("sources") / f"{name}-{digest}"
    for base in (cache_dir(), _fallback_dir):
        if base is not None and _holds(base / relative, files):
            return base / relative
    try:
        return _write_sources(cache_dir() / relative, files)
    except OSError as exc:  # read-only or missing: this process's folder
        return _write_sources(_private_dir(exc) / relative, files)


def _holds(folder: Path, files: dict[str, str]) -> bool:
    try:
        return all((folder / name).read_text() == text for name, text in files.items())
    except (OSError, UnicodeDecodeError):
        return False


def _write_sources(folder: Path, files: dict[str, str]) -> Path:
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".write-", dir=folder.parent))
    try:
        for name, text in files.items():
            (scratch / name).write_text(text)
        try:
            os.rename(scratch, folder)  # atomic; fails when the folder exists
        except OSError:
            if not _holds(folder, files):  # damaged: swap in the whole new one
                os.rename(folder, f"{scratch}.old")
                os.rename(scratch, folder)
                shutil.rmtree(f"{scratch}.old", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def built_shared_library(source_dir: os.PathLike | str, name: str) -> Path | None:
    """The cached library `build_shared_library(source_dir, name, ...)`
    returns, if it is built already (nothing is built here)."""
    relative = (Path(toolchain_versions()) / f"{name}-{source_hash(source_dir)}"
                / f"lib{name}.so")
    for folder in (cache_dir(), _fallback_dir):
        if folder is not None and (folder / relative).exists():
            return folder / relative
    return None


def _checked_source(source_dir, name: str) -> Path:
    if not name.isidentifier():
        raise ValueError(
            f"kernel library name {name!r} must be an identifier: it becomes the "
            "Mojo package name"
        )
    return Path(source_dir).resolve()


def _cached_build(source_dir: Path, name: str, filename: str, command) -> Path:
    """`filename` built by `mojo <command(output path)>` from `source_dir`,
    from the cache when its sources' hash is there."""
    global last_build_seconds
    digest = source_hash(source_dir)
    relative = Path(toolchain_versions()) / f"{name}-{digest}" / filename
    with _lock:
        for folder in (cache_dir(), _fallback_dir):
            if folder is not None and (folder / relative).exists():
                last_build_seconds = None
                return folder / relative
        target = cache_dir() / relative
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(target.parent / ".lock")
            lock.acquire()  # another process may be building
        except OSError as exc:  # read-only or missing: build privately
            target = _private_dir(exc) / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(target.parent / ".lock")
            lock.acquire()
        try:
            if not target.exists():
                _remove_scratch(target.parent)
                last_build_seconds = _build(source_dir, target, name, command)
            else:
                last_build_seconds = None
        finally:
            lock.release()
        return target


def _remove_scratch(folder: Path) -> None:
    """Delete what builders killed mid-build left in `folder` (the caller
    holds its lock, so no live builder uses them)."""
    for path in folder.glob(".build-*"):
        shutil.rmtree(path, ignore_errors=True)


def _run_mojo(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Run the Mojo compiler of the installed `mojo` package (not one on PATH)."""
    try:
        from mojo.run import subprocess_run_mojo
    except ImportError as exc:
        raise CompileError(
            "building Mojo kernels needs the 'mojo' package: python -m pip install 'mojo==1.2.*'"
        ) from exc
    try:
        return subprocess_run_mojo(args, cwd=cwd, capture_output=True, text=True)
    except RuntimeError as exc:  # the package is there but its compiler is not
        raise CompileError(f"cannot run the Mojo compiler: {exc}") from exc


def _build(source_dir: Path, target: Path, name: str, command) -> float:
    # A .mojoc records its Mojo package name from the output file's name, so
    # build `target.name` in a private directory and rename it into place.
    tmp_dir = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
    tmp = tmp_dir / target.name
    start = time.perf_counter()
    try:
        args = command(tmp)
        abandon_if_exiting()  # a daemon thread at exit: nobody will use it
        with heartbeat(f"building Mojo kernel library '{name}'"):
            proc = _run_mojo(args, cwd=tmp_dir)
        if proc.returncode != 0 or not tmp.exists():
            abandon_if_exiting()  # the exit may have broken the build: no report
            raise CompileError(
                f"mojo {args[0]} of kernel library '{name}' ({source_dir}) failed "
                f"with exit code {proc.returncode}:\n{(proc.stderr or proc.stdout).strip()}"
            )
        os.replace(tmp, target)  # atomic: readers see no file or a whole one
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    elapsed = time.perf_counter() - start
    log.info("juju: built kernel library '%s' in %.1f s -> %s", name, elapsed, target)
    return elapsed
