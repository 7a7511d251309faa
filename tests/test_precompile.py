"""`python -m juju precompile`: a function compiled ahead of time into the
persistent cache is loaded, not compiled, by the next process's first call."""

from __future__ import annotations

import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import juju


def scaled_cosine(x, n):
    return jnp.cos(x) * 2.5 + n


def test_precompiled_function_is_loaded_not_compiled(tmp_path, monkeypatch):
    env = dict(os.environ, JUJU_CACHE_DIR=str(tmp_path))
    result = subprocess.run(
        [sys.executable, "-m", "juju", "precompile", f"{__name__}:scaled_cosine",
         "--shapes", "float32[5]", "int32[]"],
        capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is in the persistent cache" in result.stdout
    assert list(tmp_path.rglob("*.json"))

    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))

    def no_compile(jobs, session_of):
        raise AssertionError(f"{jobs[0].what} was compiled, not loaded from the cache")

    monkeypatch.setattr(juju.compile_pool, "compile_jobs", no_compile)
    f = juju.jit(scaled_cosine, tiered=False)
    x = np.linspace(0, 1, 5, dtype=np.float32)
    out = f(x, np.int32(2)).to_numpy()  # int32 scalar: not weak, like the spec
    np.testing.assert_allclose(out, np.cos(x) * 2.5 + 2, rtol=1e-6)
    assert f.compile_count == 1


def test_a_bad_shape_is_a_clear_error(capsys):
    from juju.__main__ import main

    assert main(["precompile", f"{__name__}:scaled_cosine", "--shapes", "float32(5)"]) == 2
    assert "juju precompile: bad shape 'float32(5)'" in capsys.readouterr().err
