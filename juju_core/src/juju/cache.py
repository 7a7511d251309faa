"""A persistent cache of compiled MAX models, shared by processes.

Key: the lowered graph's text (exact: MLIR prints floats round-trip, with the
graph's name normalised), the MAX version, the device and the content of
every kernel library the graph loads. So a change to a rule, to a constant or
to a kernel gives a new key, and nothing can go stale by construction.

Layout under `$JUJU_CACHE_DIR` (default `~/.cache/juju`)::

    compiled/max-<version>/<batch>.mef      one MAX compilation (1..N graphs)
    compiled/max-<version>/<key>.json       {"mef": ..., "index": i, "sha256": ...}

Writes go to a temporary file and are renamed into place, so readers never
see a partial file and concurrent writers of the same key both leave a valid
entry. Every entry is checked against its digest before MAX reads it; a
corrupt or missing file is deleted and the graph recompiled. The total size
is bounded (`JUJU_CACHE_MAX_MB`, default 2048): the least recently used
batches go first. `JUJU_DISABLE_CACHE=1` turns the cache off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger("juju")

_file_digests: dict[tuple[str, float, int], str] = {}


@functools.lru_cache(maxsize=None)
def _max_version() -> str:
    from importlib import metadata

    return metadata.version("max")


def enabled() -> bool:
    return os.environ.get("JUJU_DISABLE_CACHE", "") in ("", "0")


def root() -> Path:
    base = os.environ.get("JUJU_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "juju"


def max_version() -> str:
    return _max_version()


def directory() -> Path:
    path = root() / "compiled" / f"max-{max_version()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    folder = directory()
    ref_path = folder / f"{key}.json"
    try:
        ref = json.loads(ref_path.read_text())
        mef = folder / ref["mef"]
        if _file_digest(os.fspath(mef)) != ref["sha256"]:
            raise ValueError("digest mismatch")
        index = int(ref["index"])
    except FileNotFoundError:
        return None
    except Exception as exc:  # corrupt entry: drop it and recompile
        log.warning("juju: dropping corrupt cache entry %s (%s)", ref_path.name, exc)
        _unlink(ref_path)
        return None
    now = time.time()
    try:
        os.utime(mef, (now, now))  # least-recently-used eviction reads mtime
    except OSError:
        return None
    return mef, index


def store(keys: list[str], compiled_model) -> None:
    """Export one compilation (graphs in `keys` order) and index each key."""
    if not enabled():
        return
    folder = directory()
    batch = hashlib.sha256("".join(keys).encode()).hexdigest()[:32]
    mef = folder / f"batch-{batch}.mef"
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".mef.tmp")
        os.close(fd)
        compiled_model.export_mef(tmp)
        os.replace(tmp, mef)
        digest = _file_digest(os.fspath(mef))
        for index, key in enumerate(keys):
            _write_atomic(folder / f"{key}.json", json.dumps(
                {"mef": mef.name, "index": index, "sha256": digest}
            ))
    except Exception as exc:  # the cache is an optimisation: never fail a call
        log.warning("juju: could not write the compile cache in %s: %s", folder, exc)
        return
    _evict(folder)


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


def _evict(folder: Path) -> None:
    limit = float(os.environ.get("JUJU_CACHE_MAX_MB", "2048")) * 1024 * 1024
    mefs = []
    for path in folder.glob("batch-*.mef"):
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
    import shutil

    shutil.rmtree(root() / "compiled", ignore_errors=True)
