"""juju's persistent compile cache: a new process reuses compiled models,
corrupt entries are rebuilt, the size bound holds, it can be disabled, and a
cache folder that cannot be written never fails a call."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from juju import cache

# Root ignores file modes, so under root a read-only folder is simulated: every
# write below it fails as on a read-only mount (EROFS).
SIMULATE_READ_ONLY = textwrap.dedent(
    """
    import builtins, errno, io, os
    _ro = os.path.realpath(os.environ["TEST_READ_ONLY"])
    def _below(path):
        try:
            return os.path.realpath(os.fspath(path)).startswith(_ro)
        except TypeError:
            return False
    def _deny(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), os.fspath(path))
    def _guard(fn, writes=lambda *a, **k: True):
        def guarded(path, *args, **kwargs):
            if _below(path) and writes(*args, **kwargs):
                _deny(path)
            return fn(path, *args, **kwargs)
        return guarded
    _writing_mode = lambda mode="r", *a, **k: any(c in mode for c in "wax+")
    _writing_flags = lambda flags, *a, **k: flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
    os.open = _guard(os.open, _writing_flags)
    builtins.open = io.open = _guard(io.open, _writing_mode)
    for _name in ("mkdir", "utime", "replace", "rename", "unlink", "rmdir", "chmod"):
        setattr(os, _name, _guard(getattr(os, _name)))
    """
)

PROGRAM = textwrap.dedent(
    """
    import json, logging, os, sys, time
    if os.environ.get("TEST_READ_ONLY"):
        exec(os.environ["TEST_SIMULATION"])
    import numpy as np, jax.numpy as jnp, juju
    from juju import compile_pool
    compiles, warnings = [], []
    _compile = compile_pool.compile_jobs
    def counting_compile(jobs, session_of):
        compiles.extend(job.what for job in jobs)
        return _compile(jobs, session_of)
    compile_pool.compile_jobs = counting_compile
    class Warnings(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())
    logging.getLogger("juju").addHandler(Warnings())
    f = juju.jit(lambda x, y: jnp.tanh(x) * y + 0.25)
    ok = True
    start = time.perf_counter()
    for size in (6, 3)[: int(sys.argv[1])]:  # a second shape: a second compile
        x = np.linspace(-2, 2, size, dtype=np.float32)
        out = f(x, x).to_numpy()
        ok = ok and bool(np.allclose(out, np.tanh(x) * x + 0.25, rtol=1e-6))
    print(json.dumps({"seconds": time.perf_counter() - start, "ok": ok,
                      "dtype": str(out.dtype), "shape": list(out.shape),
                      "compiles": len(compiles), "warnings": warnings}))
    """
)


def run(cache_dir: Path, shapes: int = 1, read_only: Path | None = None, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JUJU_")}
    # Not tiered: the program must wait for its MAX compile (tests/conftest.py);
    # a MAX graph, not a native program kernel (which MAX's cache never sees).
    environment.update(JUJU_CACHE_DIR=str(cache_dir), JUJU_TIERED="0", JUJU_PROGRAM_KERNELS="0",
                       **env)
    if read_only is not None and os.geteuid() == 0:
        environment.update(TEST_READ_ONLY=str(read_only), TEST_SIMULATION=SIMULATE_READ_ONLY)
    result = subprocess.run([sys.executable, "-c", PROGRAM, str(shapes)], capture_output=True,
                            text=True, env=environment, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def read_only(folder: Path):
    """`folder` and everything below it read-only (file modes; simulated under root)."""
    paths = [folder, *folder.rglob("*")]
    modes = {path: path.stat().st_mode for path in paths}
    for path in paths:
        path.chmod(modes[path] & ~0o222)
    try:
        yield folder
    finally:
        for path in reversed(paths):
            path.chmod(modes[path])


def entries(cache_dir: Path):
    folder = next((cache_dir / "compiled").iterdir())
    return sorted(folder.glob("*.json")), sorted(folder.glob("batch-*.mef"))


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    cache_dir = tmp_path_factory.mktemp("juju-cache")
    first = run(cache_dir)
    assert first["ok"] and first["dtype"] == "float32" and first["shape"] == [6]
    return cache_dir


def test_a_new_process_loads_the_compiled_model_from_the_cache(warm_cache):
    refs, mefs = entries(warm_cache)
    assert len(refs) == 1 and len(mefs) == 1
    second = run(warm_cache)
    assert second["ok"]
    # Trace + lower + key + MEF load; a compile (even from MAX's own disk
    # cache) is not needed. Generous bound: CI machines are noisy.
    assert second["seconds"] < 5.0, second
    assert second["compiles"] == 0 and not second["warnings"], second
    assert entries(warm_cache) == (refs, mefs)  # nothing new was written


def test_a_corrupt_entry_is_detected_and_rebuilt(warm_cache):
    refs, mefs = entries(warm_cache)
    mefs[0].write_bytes(b"not a MEF file")
    again = run(warm_cache)
    assert again["ok"]
    new_refs, new_mefs = entries(warm_cache)
    digest = json.loads(new_refs[0].read_text())["sha256"]
    assert cache._file_digest(str(new_mefs[0])) == digest  # rewritten, intact


def test_a_garbled_index_file_is_dropped_not_fatal(warm_cache):
    refs, _ = entries(warm_cache)
    refs[0].write_text("{ this is not json")
    assert run(warm_cache)["ok"]


def test_the_cache_can_be_disabled(tmp_path):
    assert run(tmp_path, JUJU_DISABLE_CACHE="1")["ok"]
    assert not (tmp_path / "compiled").exists()


def test_size_bound_evicts_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JUJU_CACHE_MAX_MB", "0.001")  # about 1 KB
    folder = cache.directory()
    old, new = folder / "batch-old.mef", folder / "batch-new.mef"
    old.write_bytes(b"x" * 800)
    os.utime(old, (1, 1))
    new.write_bytes(b"y" * 800)
    cache._evict(folder)
    assert not old.exists() and new.exists()


def test_a_populated_read_only_cache_is_read(warm_cache):
    refs, mefs = entries(warm_cache)
    with read_only(warm_cache):
        result = run(warm_cache, read_only=warm_cache)
    assert result["ok"]
    assert result["compiles"] == 0 and not result["warnings"], result  # a hit, silently
    assert entries(warm_cache) == (refs, mefs)


def test_an_empty_read_only_cache_warns_once_and_compiles_in_memory(tmp_path):
    with read_only(tmp_path):
        result = run(tmp_path, shapes=2, read_only=tmp_path)
    assert result["ok"] and result["compiles"] == 2, result
    (warning,) = result["warnings"]  # once, not once per compile
    assert "cannot write the compile cache" in warning and str(tmp_path) in warning
    assert "JUJU_CACHE_DIR" in warning
    assert not (tmp_path / "compiled").exists()


def test_a_cache_path_through_a_file_warns_once_and_compiles_in_memory(tmp_path):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    result = run(a_file / "juju", shapes=2)  # like JUJU_CACHE_DIR=/dev/null/x
    assert result["ok"] and result["compiles"] == 2, result
    (warning,) = result["warnings"]
    assert "NotADirectoryError" in warning or "FileExistsError" in warning, warning


def test_the_default_folder_is_the_platform_user_cache(monkeypatch, tmp_path):
    import platformdirs

    monkeypatch.delenv("JUJU_CACHE_DIR", raising=False)
    assert cache.root() == Path(platformdirs.user_cache_dir("juju", appauthor=False))
    if sys.platform.startswith("linux"):
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
        assert cache.root() == tmp_path / "juju"
    monkeypatch.setenv("JUJU_CACHE_DIR", "~/somewhere")
    assert cache.root() == Path.home() / "somewhere"


def test_writers_of_one_key_leave_an_entry_that_names_its_own_file(tmp_path, monkeypatch):
    """Two processes compile the same graph (MEF bytes may differ) and store
    it at once: each MEF file is named by its content, so whichever index
    file lands last names a file with the digest it records."""
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))
    work = tmp_path / "work"
    work.mkdir()
    stored = []
    for content in (b"first compile", b"second compile", b"first compile"):
        scratch = work / "scratch.mef"
        scratch.write_bytes(content)
        stored.append(cache.store(["k1", "k2"], scratch))
        assert not scratch.exists()  # moved, not copied
    assert stored[0] == stored[2] != stored[1]  # one name per content
    for index, key in enumerate(["k1", "k2"]):
        mef, found = cache.lookup(key)
        assert (mef, found) == (stored[2], index)
        ref = json.loads((cache.folder() / f"{key}.json").read_text())
        assert cache._file_digest(str(mef)) == ref["sha256"]
    assert sorted(p.name for p in cache.folder().iterdir() if ".tmp" in p.name) == []


def test_an_evicted_file_is_a_miss_and_a_young_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("JUJU_CACHE_MAX_MB", "0")  # everything is over the bound
    scratch = tmp_path / "scratch.mef"
    scratch.write_bytes(b"a compile")
    mef = cache.store(["key"], scratch)
    assert mef.exists()  # written just now: another process may be loading it
    os.utime(mef, (1, 1))
    cache._evict(cache.folder())
    assert not mef.exists()
    assert cache.lookup("key") is None  # a miss, silently
    assert not (cache.folder() / "key.json").exists()
