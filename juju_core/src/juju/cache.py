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

Writes go to a temporary file and are renamed into place, so readers never
see a partial file and concurrent writers of the same key both leave a valid
entry. Every entry is checked against its digest before MAX reads it; a
corrupt or missing file is deleted and the graph recompiled. The total size
is bounded (`JUJU_CACHE_MAX_MB`, default 2048): the least recently used
batches go first. `JUJU_DISABLE_CACHE=1` turns the cache off.

The cache is an optimisation and never fails a call: a folder that cannot be
created or written (a read-only or missing mount, a path through a file) is
reported once (a warning on the `juju` logger) and graphs are compiled in
memory; a read-only cache that holds entries is still read.
"""

from __future__ import annotations

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

log = logging.getLogger("juju")

_file_digests: dict[tuple[str, float, int], str] = {}
# Folders found unusable in this process (reported once, not written again).
_unwritable: set[Path] = set()
_unreadable: set[Path] = set()
_report_lock = threading.Lock()


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
    key = (path, stat.st_mtime, stat.st_size)
    digest = _file_digests.get(key)
    if digest is None:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        _file_digests[key] = digest
    return digest


def graph_key(graph, device_description: str, kernel_paths=()) -> str:
    """The cache key of a graph built for a device."""
    text = str(graph).replace(f"@{graph.name}(", "@juju_graph(", 1)
    digest = hashlib.sha256()
    digest.update(f"max {max_version()}\ndevice {device_description}\n".encode())
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
        if _file_digest(os.fspath(mef)) != ref["sha256"]:
            raise ValueError("digest mismatch")
        index = int(ref["index"])
    except Exception as exc:  # corrupt entry: drop it (if we may) and recompile
        log.warning("juju: dropping corrupt cache entry %s (%s)", ref_path.name, exc)
        _unlink(ref_path)
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
    batch = hashlib.sha256("".join(keys).encode()).hexdigest()[:32]
    target = path / f"batch-{batch}.mef"
    try:
        try:
            os.replace(mef, target)
        except OSError:  # another file system: copy, then rename into place
            fd, tmp = tempfile.mkstemp(dir=path, suffix=".mef.tmp")
            os.close(fd)
            shutil.copyfile(mef, tmp)
            os.replace(tmp, target)
            _unlink(Path(mef))
        digest = _file_digest(os.fspath(target))
        for index, key in enumerate(keys):
            _write_atomic(path / f"{key}.json", json.dumps(
                {"mef": target.name, "index": index, "sha256": digest}
            ))
    except Exception as exc:  # the cache is an optimisation: never fail a call
        log.warning("juju: could not write the compile cache in %s: %s", path, exc)
        return target if target.exists() else None
    _evict(path)
    return target


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _evict(where: Path) -> None:
    limit = float(os.environ.get("JUJU_CACHE_MAX_MB", "2048")) * 1024 * 1024
    mefs = []
    for path in where.glob("batch-*.mef"):
        try:
            stat = path.stat()
        except OSError:
            continue
        mefs.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in mefs)
    for _, size, path in sorted(mefs):
        if total <= limit:
            break
        _unlink(path)  # its .json refs now fail their digest check: recompiled
        total -= size


def clear() -> None:
    """Delete every cached compiled model (all MAX versions)."""
    shutil.rmtree(root() / "compiled", ignore_errors=True)
