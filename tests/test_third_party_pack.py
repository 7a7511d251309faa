"""A third-party pack (examples/third_party_pack) with its own Mojo kernel:
installed into the venv, found through its entry point, its kernel library
built and cached by juju_kernels_mojo, and used from juju.jit.

The pack is installed (editable, no dependencies) if it is not already; the
checks run in a fresh interpreter, which sees the new entry point."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "examples" / "third_party_pack"

CHECK = textwrap.dedent(
    """
    import json
    import jax, jax.numpy as jnp, numpy as np
    import juju
    from juju_example_pack import minmax

    def f(x, y):
        low, high = minmax(x, y)
        grad = jax.grad(lambda x: jnp.sum(minmax(x, y)[1] ** 2))(x)
        return low, high, high - low, grad, jax.vmap(minmax)(x, y)

    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    y = np.cos(x).astype(np.float32)
    i = np.arange(12, dtype=np.int32).reshape(3, 4)
    j = (11 - i).astype(np.int32)
    fn = juju.jit(f)
    ints = juju.jit(lambda a, b: minmax(a, b))
    juju.compile_all([fn.lower(x, y), ints.lower(i, j)])
    got, want = fn(x, y), jax.jit(f)(x, y)
    ok = all(
        np.allclose(np.asarray(g.to_numpy()), np.asarray(w), rtol=1e-5, atol=1e-6)
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    )
    ok_int = all(
        np.array_equal(g.to_numpy(), np.asarray(w))
        for g, w in zip(ints(i, j), [np.minimum(i, j), np.maximum(i, j)])
    )
    registry = juju.plugins.registry()
    rule = registry.rules_for(minmax.primitive)[0]
    path = juju.plugins.kernel_library("juju_example_pack").path()
    print("RESULT", json.dumps({
        "ok": bool(ok), "ok_int": bool(ok_int), "pack": rule.pack,
        "requires": list(rule.requires), "library": str(path),
        "kernels": sorted(fn.lower(x, y).kernel_names),
    }))
    """
)


@pytest.fixture(scope="module")
def installed():
    if importlib.util.find_spec("juju_example_pack") is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", "-e", str(PACK)],
            check=True,
        )
    return True


@pytest.fixture(scope="module")
def result(installed, tmp_path_factory):
    proc = subprocess.run(
        [sys.executable, "-c", CHECK],
        capture_output=True, text=True, timeout=900, cwd=tmp_path_factory.mktemp("cwd"),
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stdout + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_pack_is_listed_with_its_kernel_library(installed):
    out = subprocess.run(
        [sys.executable, "-m", "juju"], capture_output=True, text=True, check=True
    ).stdout
    line = next(line for line in out.splitlines() if line.startswith("example "))
    assert "juju_example_pack" in line and "kernels: juju_example_pack" in line


def test_jit_uses_the_packs_kernel(result):
    assert result["pack"] == "example"
    assert result["requires"] == ["juju_example_pack"]
    assert result["kernels"] == ["juju_example_pack"]


def test_values_grad_and_vmap_match_jax(result):
    assert result["ok"] and result["ok_int"]


def test_library_is_cached_like_junjus_own(result):
    from juju_kernels_mojo import build

    path = Path(result["library"])
    assert path.is_file() and path.name == "juju_example_pack.mojoc"
    assert build.toolchain_versions() in str(path)
