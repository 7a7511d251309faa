"""A persistent cache of compiled MAX models, shared by processes.

Key: the lowered graph's text (exact: MLIR prints floats round-trip, with the
graph's name normalised), the MAX version, the device and the content of
every kernel library the graph loads. So a change to a rule, to a constant or
to a kernel gives a new key, and nothing can go stale by construction.

Layout under `$JUJU_CACHE_DIR` (default: the platform's user cache folder,
`platformdirs.user_cache_dir("juju")`: `$XDG_CACHE_HOME/juju` or
`~/.cache/juju` on Linux, `~/Library/Caches/juju` on macOS)::

    compiled/max-<version>/<batch>.mef      one MAX compilation (1..N graphs)
    compiled/max-<version>/<key>.json       {"mef": ..., "index": i, "sha256": ...}
    compiled/max-<version>/locks/           a file lock per compilation in flight

Safe under any number of processes and threads, and under a process killed
at any point: a MEF file is named by the digest of its content (`<batch>` is
that digest), so a name never holds two contents and two writers of one
compilation write the same file; files are written under temporary names and
renamed into place (atomic: readers see no file or a whole one), and every
index file names its MEF and that MEF's digest, so an index never points at
another compilation's file. Every entry is checked against its digest before
MAX reads it; a corrupt or missing file is deleted and the graph recompiled.
A killed process leaves at most a scratch file in `work/` (pruned after a
week). Processes compiling the same graphs at once compile them once
(`compile_locks`): the others wait, then load them from the cache. The total size is bounded (`JUJU_CACHE_MAX_MB`, default 2048): the
least recently used batches go first, never one written in the last minute
(another process may be loading it). `JUJU_DISABLE_CACHE=1` turns the cache
off.

The cache is an optimisation and never fails a call: a folder that cannot be
created or written (a read-only or missing mount, a path through a file) is
reported once (a warning on the `juju` logger) and graphs are compiled in
memory; a read-only cache that holds entries is still read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import platformdirs
from filelock import FileLock, Timeout

log = logging.getLogger("juju")

_file_digests: dict[tuple[str, int, int, int], str] = {}
# Folders found unusable in this process (reported once, not written again).
_unwritable: set[Path] = set()
_unreadable: set[Path] = set()
_report_lock = threading.Lock()
#: A MEF used in the last minute is never evicted: a process may be loading it.
_EVICT_GRACE_SECONDS = 60.0


@functools.lru_cache(maxsize=None)
def _max_version() -> str:
    from importlib import metadata

    return metadata.version("max")


def enabled() -> bool:
    return os.environ.get("JUJU_DISABLE_CACHE", "") in ("", "0")


def root() -> Path:
    """juju's cache folder: `$JUJU_CACHE_DIR`, else the platform's user cache
    folder for "juju" (which honours `$XDG_CACHE_HOME` on Linux)."""
    base = os.environ.get("JUJU_CACHE_DIR")
    if base:
        return Path(base).expanduser()
    return Path(platformdirs.user_cache_dir("juju", appauthor=False))


def max_version() -> str:
    return _max_version()


def folder() -> Path:
    """Where compiled models of this MAX version live (not created)."""
    return root() / "compiled" / f"max-{max_version()}"


def directory() -> Path:
    """`folder()`, created if missing (raises OSError when it cannot be)."""
    path = folder()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _report_once(seen: set[Path], path: Path, what: str, exc: BaseException) -> None:
    with _report_lock:
        if path in seen:
            return
        seen.add(path)
    log.warning(
        "juju: cannot %s the compile cache in %s (%s: %s); compiling in memory. "
        "Set JUJU_CACHE_DIR to a writable folder, or JUJU_DISABLE_CACHE=1 to silence this.",
        what, path, type(exc).__name__, exc,
    )


def _file_digest(path: str) -> str:
    stat = os.stat(path)
    key = (path, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    digest = _file_digests.get(key)
    if digest is None:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        _file_digests[key] = digest
    return digest


def graph_key(graph, device_description: str, kernel_paths=(), options=()) -> str:
    """The cache key of a graph built for a device (and compiled with MAX's
    `options`, (name, value) pairs)."""
    text = str(graph).replace(f"@{graph.name}(", "@juju_graph(", 1)
    digest = hashlib.sha256()
    digest.update(f"max {max_version()}\ndevice {device_description}\n".encode())
    if options:
        digest.update(f"options {sorted(options)!r}\n".encode())
    for path in kernel_paths:
        digest.update(f"kernels {_file_digest(os.fspath(path))}\n".encode())
    digest.update(text.encode())
    return digest.hexdigest()


def lookup(key: str) -> tuple[Path, int] | None:
    """(MEF path, model index) for a cached, intact entry; None otherwise."""
    if not enabled():
        return None
    path = folder()
    ref_path = path / f"{key}.json"
    try:
        text = ref_path.read_text()
    except (FileNotFoundError, NotADirectoryError):  # a miss, or no cache folder at all
        return None
    except OSError as exc:  # unreadable: the cache is an optimisation
        _report_once(_unreadable, path, "read", exc)
        return None
    try:
        ref = json.loads(text)
        mef = path / ref["mef"]
        index = int(ref["index"])
        if _file_digest(os.fspath(mef)) != ref["sha256"]:
            raise ValueError("digest mismatch")
    except FileNotFoundError:  # its MEF was evicted (by any process): a miss
        _unlink(ref_path, unless_changed_from=text)
        return None
    except Exception as exc:  # corrupt entry: drop it (if we may) and recompile
        log.warning("juju: dropping corrupt cache entry %s (%s)", ref_path.name, exc)
        _unlink(ref_path, unless_changed_from=text)
        return None
    now = time.time()
    try:
        os.utime(mef, (now, now))  # least-recently-used eviction reads mtime
    except OSError:
        pass  # a read-only cache: still a hit, only its eviction order is stale
    return mef, index


def store(keys: list[str], mef: Path) -> Path | None:
    """Move one compilation's MEF file (graphs in `keys` order) into the
    cache and index each key; the cached path, or None if not cached (the
    file is then left where it was)."""
    if not enabled() or folder() in _unwritable:
        return None
    path = folder()
    try:
        directory()
    except OSError as exc:  # read-only, missing mount, a file in the path...
        _report_once(_unwritable, path, "write", exc)
        return None
    target = None
    try:
        target, digest = _place(mef, path)
        for index, key in enumerate(keys):
            _write_atomic(path / f"{key}.json", json.dumps(
                {"mef": target.name, "index": index, "sha256": digest}
            ))
    except Exception as exc:  # the cache is an optimisation: never fail a call
        log.warning("juju: could not write the compile cache in %s: %s", path, exc)
        return target  # the MEF, where it is now (None: still at `mef`)
    _evict(path)
    return target


def _place(mef: Path, where: Path) -> tuple[Path, str]:
    """`mef` moved into `where` under the name of its content's digest (a
    copy, then the scratch file deleted, across file systems); the path
    and the digest."""
    digest = hashlib.sha256(Path(mef).read_bytes()).hexdigest()
    target = where / f"batch-{digest[:32]}.mef"
    try:
        os.replace(mef, target)  # same name, same bytes: a concurrent writer's is as good
    except OSError:  # another file system: copy, then rename into place
        fd, tmp = tempfile.mkstemp(dir=where, suffix=".mef.tmp")
        try:
            with os.fdopen(fd, "wb") as out, open(mef, "rb") as src:
                shutil.copyfileobj(src, out)
            os.replace(tmp, target)
        finally:
            _unlink(Path(tmp))
        _unlink(Path(mef))
    return target, digest


#: Seconds a process waits for another's compile of the same graphs before
#: it compiles them too (a compile that hangs must not stop the others).
_LOCK_WAIT_SECONDS = 1800.0


@contextlib.contextmanager
def compile_locks(batches: list[list[str]]):
    """Hold a file lock per compilation (its graphs' keys) while it runs, so
    that processes compiling the same graphs at once compile them once: the
    others wait, then find them in the cache. Taken in one order (no
    deadlock); released by the system when a holder dies; a no-op where the
    cache is off or cannot be written."""
    if not enabled() or folder() in _unwritable:
        yield
        return
    names = sorted({hashlib.sha256("".join(keys).encode()).hexdigest()[:32]
                    for keys in batches})
    with contextlib.ExitStack() as held:
        for name in names:
            try:
                where = directory() / "locks"
                where.mkdir(exist_ok=True)
                held.enter_context(FileLock(where / f"{name}.lock", timeout=_LOCK_WAIT_SECONDS))
                os.utime(where / f"{name}.lock")  # in use: not pruned
            except (OSError, Timeout) as exc:  # an optimisation: compile without it
                log.debug("juju: compiling without the cache's lock %s (%s)", name, exc)
        yield


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        _unlink(Path(tmp))


def _unlink(path: Path, unless_changed_from: str | None = None) -> None:
    """Delete `path`; with `unless_changed_from`, only while it still holds
    that text (another process may have just written a good entry there)."""
    try:
        if unless_changed_from is not None and path.read_text() != unless_changed_from:
            return
        path.unlink()
    except OSError:
        pass


def _evict(where: Path) -> None:
    limit = float(os.environ.get("JUJU_CACHE_MAX_MB", "2048")) * 1024 * 1024
    young = time.time() - _EVICT_GRACE_SECONDS
    mefs = []
    for path in where.glob("batch-*.mef"):
        try:
            stat = path.stat()
        except OSError:
            continue
        mefs.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in mefs)
    for mtime, size, path in sorted(mefs):
        if total <= limit or mtime > young:
            break
        _unlink(path)  # its .json refs now fail their digest check: recompiled
        total -= size
    stale = time.time() - 7 * 24 * 3600  # compile locks unused for a week
    for path in (where / "locks").glob("*.lock"):
        with contextlib.suppress(OSError):
            if path.stat().st_mtime < stale:
                path.unlink()


def clear() -> None:
    """Delete every cached compiled model (all MAX versions)."""
    shutil.rmtree(root() / "compiled", ignore_errors=True)
