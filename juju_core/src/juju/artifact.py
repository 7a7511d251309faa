"""The on-disk form of an exported function (`juju.export`), read without jax.

An artifact is a folder::

    manifest.json     what the files are, their digests, the calling convention
    graph.mlir        the MAX graph's text: compiled on load for another device
    model.mef         the graph compiled for the export's engine (if it could be)
    kernels/*.mojoc   the Mojo kernel libraries the graph's custom ops need
    weights.bin       the large arrays `f` closed over, raw and 64-byte aligned

The manifest holds the format version, the juju and MAX versions, the engine,
the flat inputs and outputs (shape, dtype, how each travels in MAX), their
pytree structures (`pytree` specs, JSON) and every file's size and sha256.
`read` checks all of that before MAX sees a byte: a truncated or edited file
raises `ArtifactError` naming it, never a crash inside MAX.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from juju.errors import ArtifactError, ArtifactVersionError

FORMAT = "juju-export"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
GRAPH = "graph.mlir"
MODEL = "model.mef"
WEIGHTS = "weights.bin"
KERNELS = "kernels"
_ALIGN = 64


@dataclass(frozen=True)
class Manifest:
    """An artifact's manifest, checked (see the module's docstring).

    Attributes:
        folder: where the artifact is.
        data: the manifest's JSON.
    """

    folder: Path
    data: dict

    def path(self, name: str) -> Path:
        return self.folder / name

    @property
    def kernels(self) -> list[Path]:
        return [self.folder / k for k in self.data["kernels"]]

    @property
    def model(self) -> Path | None:
        return self.folder / self.data["model"] if self.data.get("model") else None


def max_version() -> str:
    """The installed MAX's version."""
    from importlib import metadata

    return metadata.version("max")


def file_entry(path: Path) -> dict:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"size": path.stat().st_size, "sha256": digest.hexdigest()}


def write_weights(path: Path, arrays: list[np.ndarray]) -> list[dict]:
    """Write `arrays` (physical: no complex, no keys) to one file, each at a
    64-byte aligned offset; their manifest entries."""
    entries = []
    offset = 0
    with open(path, "wb") as f:
        for array in arrays:
            array = np.ascontiguousarray(array)
            pad = -offset % _ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(array.tobytes())
            entries.append({"shape": list(array.shape), "dtype": array.dtype.name,
                            "offset": offset, "nbytes": array.nbytes})
            offset += array.nbytes
    return entries


def read_weights(manifest: Manifest) -> list[np.ndarray]:
    """The weights as numpy views of the mapped file (no copy)."""
    from juju.buffers import numpy_dtype_of

    entries = manifest.data["weights"]
    if not entries:
        return []
    # copy-on-write: DLPack cannot export a read-only view, and MAX never writes inputs
    mapped = np.memmap(manifest.path(WEIGHTS), dtype=np.uint8, mode="c")
    arrays = []
    for entry in entries:
        dtype = numpy_dtype_of(entry["dtype"])
        raw = mapped[entry["offset"]:entry["offset"] + entry["nbytes"]]
        arrays.append(raw.view(dtype).reshape(entry["shape"]))
    return arrays


def write_manifest(folder: Path, data: dict) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, folder / MANIFEST)


def read(folder) -> Manifest:
    """The checked manifest of the artifact in `folder`.

    Raises:
        ArtifactError: no artifact there, a corrupt manifest, or a file
            missing, truncated or changed since the export.
        ArtifactVersionError: a newer artifact format, or a MAX whose minor
            version differs from the export's.
    """
    folder = Path(folder)
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ArtifactError(f"{folder} {what}: an exported juju artifact is a folder "
                            "written by `juju.export(f, ...).save(path)`")
    try:
        data = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{folder} has no {MANIFEST}: not a juju artifact, or an "
                            "incomplete copy of one") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{folder / MANIFEST} is unreadable or corrupt ({exc}); "
                            "export the function again") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ArtifactError(f"{folder / MANIFEST} is not a juju export manifest")
    version = data.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ArtifactVersionError(
            f"{folder} has artifact format {version!r}; this juju reads format "
            f"{FORMAT_VERSION} and older: upgrade juju-core where you serve it")
    _check_max_version(folder, data)
    _check_files(folder, data)
    return Manifest(folder, data)


def same_max(exported: str, installed: str) -> bool:
    """Whether a compiled model from MAX `exported` loads in `installed`: the
    exact version (MEF files are not portable between releases)."""
    return exported == installed


def _check_max_version(folder: Path, data: dict) -> None:
    exported, installed = data.get("max_version", "?"), max_version()
    if exported.split(".")[:2] != installed.split(".")[:2]:
        raise ArtifactVersionError(
            f"{folder} was exported with MAX {exported}, and this machine has MAX "
            f"{installed}: its graph's dialect is tied to MAX's minor version. Install "
            f"max=={exported} to serve it, or export it again with MAX {installed}")


def _check_files(folder: Path, data: dict) -> None:
    try:
        files = dict(data["files"])
        required = [data["graph"], *data["kernels"]]
        if data.get("weights"):
            required.append(WEIGHTS)
        if data.get("model"):
            required.append(data["model"])
        for key in ("inputs", "outputs", "in_tree", "out_tree", "engine", "weights"):
            data[key]  # noqa: B018  (present, or KeyError)
    except (KeyError, TypeError) as exc:
        raise ArtifactError(f"{folder / MANIFEST} lacks {exc}: a corrupt manifest") from exc
    for name in required:
        entry = files.get(name)
        path = folder / name
        if entry is None:
            raise ArtifactError(f"{folder / MANIFEST} does not describe {name}")
        if not path.is_file():
            what = "kernel library" if name.startswith(KERNELS) else "file"
            raise ArtifactError(f"the artifact's {what} {path} is missing: copy the whole "
                                "folder that `save` wrote")
        if path.stat().st_size != entry["size"]:
            raise ArtifactError(f"{path} has {path.stat().st_size} bytes, and the export "
                                f"wrote {entry['size']}: a truncated or partial copy")
        if file_entry(path)["sha256"] != entry["sha256"]:
            raise ArtifactError(f"{path} differs from what the export wrote (sha256 "
                                "mismatch): a corrupt or edited file")
