"""`juju.export` and `juju.serving`: artifacts that `max` alone serves.

Three programs are exported once each (a flax MLP with a symbolic batch, a
scan RNN with a cumsum kernel, and one of odd types: ints, bools, a weakly
typed scalar, complex and namedtuple outputs). Their served outputs are
compared with `juju.jit`'s and `jax.jit`'s, in this process and in a fresh
venv that has `max` and `numpy` and no jax. The bad-artifact cases corrupt
copies of those artifacts; none compiles anything new, except the one that
makes the loader compile for another machine.
"""

from __future__ import annotations

import collections
import json
import shutil
import pickle
import subprocess
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju import serving
from tests import max_only_venv
from tests.util import assert_same

SYMBOLIC_BATCH = jax.export.symbolic_shape("b, 16")


def _mlp_with_flax():
    import flax.linen as nn

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Dense(64)(x))
            return nn.Dense(10)(x)

    model = MLP()
    params = model.init(jax.random.key(0), jnp.zeros((1, 16)))
    return lambda x: model.apply(params, x)


def _mlp_by_hand():  # the compatibility tier has no flax: the same layers
    k1, k2 = jax.random.split(jax.random.key(0))
    w1, w2 = jax.random.normal(k1, (16, 64)) * 0.25, jax.random.normal(k2, (64, 10)) * 0.1
    b1, b2 = jnp.linspace(-0.1, 0.1, 64), jnp.linspace(-0.1, 0.1, 10)
    return lambda x: jax.nn.relu(x @ w1 + b1) @ w2 + b2


try:
    _APPLY = _mlp_with_flax()
except ModuleNotFoundError:
    _APPLY = _mlp_by_hand()


def mlp(x):
    return jax.nn.log_softmax(_APPLY(x))


_RNG = np.random.RandomState(0)
_WH = jnp.asarray(_RNG.randn(32, 32).astype(np.float32) * 0.2)
_WX = jnp.asarray(_RNG.randn(8, 32).astype(np.float32) * 0.2)


def rnn(xs, h0):
    def step(h, x):
        h = jnp.tanh(h @ _WH + x @ _WX)
        return h, h.sum(-1)

    h, ys = lax.scan(step, h0, xs)
    return {"h": h, "ys": ys, "running": jnp.cumsum(ys, axis=0)}


Summary = collections.namedtuple("Summary", ["total", "flags", "phase"])


def odd(counts, mask, scale):
    total = jnp.where(mask, counts, 0).sum()
    phase = jnp.exp(1j * scale * counts.astype(jnp.float32)).astype(jnp.complex64)
    return Summary(total=total, flags=~mask, phase=phase), None


def _inputs():
    rng = np.random.RandomState(1)
    return {
        "mlp": ((rng.randn(8, 16).astype(np.float32),), {}),
        "mlp_small": ((rng.randn(3, 16).astype(np.float32),), {}),
        "rnn": ((rng.randn(6, 4, 8).astype(np.float32), rng.randn(4, 32).astype(np.float32)),
                {}),
        "odd": ((np.arange(-2, 3, dtype=np.int32), np.array([1, 0, 1, 1, 0], bool)),
                {"scale": 0.5}),
    }


INPUTS = _inputs()
FUNCTIONS = {"mlp": mlp, "mlp_small": mlp, "rnn": rnn, "odd": odd}


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The three exported artifacts' folders."""
    root = tmp_path_factory.mktemp("artifacts")
    specs = {
        "mlp": ((jax.ShapeDtypeStruct(SYMBOLIC_BATCH, jnp.float32),), {}),
        "rnn": INPUTS["rnn"],
        "odd": INPUTS["odd"],
    }
    return {name: juju.export(FUNCTIONS[name], *args, **kwargs).save(root / f"{name}.juju")
            for name, (args, kwargs) in specs.items()}


@pytest.fixture(scope="module")
def juju_results():
    """`juju.jit`'s results for every input, compiled in one MAX compilation."""
    lowered = {name: juju.jit(FUNCTIONS[name], tiered=False).lower(*args, **kwargs)
               for name, (args, kwargs) in INPUTS.items()}
    compiled = dict(zip(lowered, juju.compile_all(list(lowered.values()))))
    return {name: jax.tree.map(juju.to_numpy, compiled[name](*args, **kwargs))
            for name, (args, kwargs) in INPUTS.items()}


def _served(artifacts, name):
    return serving.load(artifacts["mlp" if name == "mlp_small" else name])


@pytest.mark.parametrize("name", list(INPUTS))
def test_served_equals_juju_and_jax(artifacts, juju_results, name):
    args, kwargs = INPUTS[name]
    served = _served(artifacts, name)(*args, **kwargs)
    expected = jax.jit(FUNCTIONS[name])(*args, **kwargs)
    # (a served namedtuple is a class of the same name and fields, made by the loader)
    assert str(jax.tree.structure(served)) == str(jax.tree.structure(expected))
    if name == "odd":
        assert type(served[0]).__name__ == "Summary" and served[0]._fields == Summary._fields
    for got, ours, ref in zip(jax.tree.leaves(served), jax.tree.leaves(juju_results[name]),
                              jax.tree.leaves(expected)):
        assert isinstance(got, np.ndarray)
        assert got.shape == ref.shape and got.dtype == ref.dtype
        np.testing.assert_allclose(got, ours, rtol=1e-6, atol=1e-6)
        assert_same(got, np.asarray(ref))


def test_weights_are_stored_apart_from_the_graph(artifacts):
    manifest = json.loads((artifacts["mlp"] / "manifest.json").read_text())
    stored = sorted(tuple(w["shape"]) for w in manifest["weights"])
    assert stored == [(16, 64), (64, 10)]  # the biases are small: constants
    assert manifest["inputs"][0]["shape"] == ["b", 16]
    assert manifest["model"] and manifest["max_version"]
    rnn_manifest = json.loads((artifacts["rnn"] / "manifest.json").read_text())
    assert rnn_manifest["kernels"], "the cumsum's kernel library travels with the graph"


_SERVE_SCRIPT = textwrap.dedent("""
    import json, pickle, sys
    import numpy as np
    from juju import serving
    from juju.errors import InputMismatchError
    artifacts, inputs = json.loads(sys.argv[1]), pickle.load(open(sys.argv[2], "rb"))
    results = {}
    for name, (args, kwargs) in inputs.items():
        served = serving.load(artifacts["mlp" if name == "mlp_small" else name])
        leaves = []
        def walk(x):
            if isinstance(x, dict):
                [walk(x[k]) for k in x]
            elif isinstance(x, (tuple, list)):
                [walk(v) for v in x]
            elif x is not None:
                leaves.append(np.asarray(x))
        walk(served(*args, **kwargs))
        results[name] = leaves
    try:
        serving.load(artifacts["mlp"])(np.zeros((2, 16), np.float64))
    except InputMismatchError as exc:
        results["error"] = str(exc)
    try:
        import jax
        results["jax"] = "importable"
    except ModuleNotFoundError:
        results["jax"] = "not installed"
    results["jax_imported"] = "jax" in sys.modules
    pickle.dump(results, open(sys.argv[3], "wb"))
""")


def test_served_without_jax(artifacts, tmp_path):
    python = max_only_venv.make(tmp_path / "venv")
    (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(INPUTS))
    script = tmp_path / "serve.py"
    script.write_text(_SERVE_SCRIPT)
    done = subprocess.run(
        [python, "-P", script, json.dumps({k: str(v) for k, v in artifacts.items()}),
         tmp_path / "inputs.pkl", tmp_path / "out.pkl"],
        capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin",
                                                          "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    results = pickle.loads((tmp_path / "out.pkl").read_bytes())
    assert results["jax"] == "not installed" and not results["jax_imported"]
    assert "exported for dtype float32, called with float64" in results["error"]
    for name, (args, kwargs) in INPUTS.items():
        here = [np.asarray(x) for x in jax.tree.leaves(_served(artifacts, name)(*args, **kwargs))]
        assert len(results[name]) == len(here)
        for got, want in zip(results[name], here):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)


# --- errors -------------------------------------------------------------------------


@pytest.fixture
def copy_of(artifacts, tmp_path):
    def copy(name):
        target = tmp_path / name
        shutil.copytree(artifacts[name], target)
        return target
    return copy


def _edit_manifest(folder, **changes):
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(changes)
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_wrong_arguments_raise_typed_errors(artifacts):
    mlp_served = serving.load(artifacts["mlp"])
    with pytest.raises(juju.InputMismatchError, match=r"exported for shape \(b, 16\)"):
        mlp_served(np.zeros((4, 15), np.float32))
    with pytest.raises(juju.InputMismatchError, match="exported for dtype float32, called "
                                                      "with int32"):
        mlp_served(np.zeros((4, 16), np.int32))
    with pytest.raises(juju.InputMismatchError, match="expected a tuple of 1"):
        mlp_served(np.zeros((4, 16), np.float32), np.zeros(3))
    rnn_served = serving.load(artifacts["rnn"])
    xs, h0 = INPUTS["rnn"][0]
    with pytest.raises(juju.InputMismatchError, match=r"input 1 \(h0\)"):
        rnn_served(xs, h0[:2])
    with pytest.raises(juju.InputMismatchError, match="expected a dict with keys"):
        serving.load(artifacts["odd"])(*INPUTS["odd"][0], wrong=1.0)


@pytest.mark.parametrize("damage, error, message", [
    ("truncate_model", juju.ArtifactError, "truncated"),
    ("flip_weight", juju.ArtifactError, "sha256 mismatch"),
    ("corrupt_manifest", juju.ArtifactError, "corrupt"),
    ("drop_manifest", juju.ArtifactError, "no manifest.json"),
    ("drop_kernel", juju.ArtifactError, "kernel library .* is missing"),
    ("other_max", juju.ArtifactVersionError, "exported with MAX 25.1.0"),
    ("newer_format", juju.ArtifactVersionError, "format 99"),
    ("no_folder", juju.ArtifactError, "does not exist"),
])
def test_bad_artifacts_raise_typed_errors(copy_of, damage, error, message):
    folder = copy_of("rnn")
    if damage == "truncate_model":
        data = (folder / "model.mef").read_bytes()
        (folder / "model.mef").write_bytes(data[: len(data) // 2])
    elif damage == "flip_weight":
        data = bytearray((folder / "weights.bin").read_bytes())
        data[100] ^= 0xFF
        (folder / "weights.bin").write_bytes(bytes(data))
    elif damage == "corrupt_manifest":
        (folder / "manifest.json").write_text('{"format": "juju-export", ')
    elif damage == "drop_manifest":
        (folder / "manifest.json").unlink()
    elif damage == "drop_kernel":
        next((folder / "kernels").iterdir()).unlink()
    elif damage == "other_max":
        _edit_manifest(folder, max_version="25.1.0")
    elif damage == "newer_format":
        _edit_manifest(folder, format_version=99)
    elif damage == "no_folder":
        folder = folder / "nothing"
    with pytest.raises(error, match=message):
        serving.load(folder)


def test_another_machine_compiles_the_saved_graph(copy_of):
    """A compiled model for another CPU (or MAX patch release) is not used:
    the loader compiles the graph text, with the saved kernel libraries, in a
    worker process, and keeps the result in the artifact."""
    folder = copy_of("rnn")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["engine"]["description"] = "cpu:0:another-machine"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    args, kwargs = INPUTS["rnn"]
    served = serving.load(folder)
    assert list((folder / "compiled").glob("*.mef"))
    expected = jax.jit(rnn)(*args)
    for got, ref in zip(jax.tree.leaves(served(*args)), jax.tree.leaves(expected)):
        assert_same(got, np.asarray(ref))


def test_callbacks_cannot_be_exported():
    def noisy(x):
        jax.debug.print("x = {}", x)
        return x * 2

    with pytest.raises(juju.ExportError, match="calls back into Python"):
        juju.export(noisy, np.ones(3, np.float32))


def test_save_refuses_to_overwrite_other_folders(artifacts, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    exported = juju.export(rnn, *INPUTS["rnn"][0])  # cached: no new compile
    with pytest.raises(FileExistsError, match="not a juju artifact"):
        exported.save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"
    again = exported.save(artifacts["rnn"].parent / "rnn_again.juju")
    assert serving.load(again)(*INPUTS["rnn"][0])["h"].shape == (4, 32)
