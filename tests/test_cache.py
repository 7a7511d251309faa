"""juju's persistent compile cache: a new process reuses compiled models,
corrupt entries are rebuilt, the size bound holds, and it can be disabled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from juju import cache

PROGRAM = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np, jax.numpy as jnp, juju
    f = juju.jit(lambda x, y: jnp.tanh(x) * y + 0.25)
    x = np.linspace(-2, 2, 6, dtype=np.float32)
    start = time.perf_counter()
    out = f(x, x).to_numpy()
    print(json.dumps({"seconds": time.perf_counter() - start,
                      "ok": bool(np.allclose(out, np.tanh(x) * x + 0.25, rtol=1e-6)),
                      "dtype": str(out.dtype), "shape": list(out.shape)}))
    """
)


def run(cache_dir: Path, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("JUJU_")}
    # Not tiered: the program must wait for its MAX compile (tests/conftest.py).
    environment.update(JUJU_CACHE_DIR=str(cache_dir), JUJU_TIERED="0", **env)
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True,
                            env=environment, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


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
