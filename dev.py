#!/usr/bin/env python3
"""juju's one entry point for development. Needs only Python 3.11.

    python3 dev.py demo          # set up (if needed) and run examples/basic.py
    python3 dev.py test          # set up (if needed) and run the fast test tier
    python3 dev.py conformance   # JAX's primitive harnesses -> docs/coverage.md
    python3 dev.py bench         # benchmarks, juju vs jax.jit
    python3 dev.py fuzz --count 2000   # random programs vs jax.jit (tests/fuzz)
    python3 dev.py python ...    # run the venv's python

Set-up creates .venv beside this file and installs the four juju packs in
editable mode plus the test tools; it is skipped when nothing changed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("JUJU_VENV", ROOT / ".venv"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".juju-setup-stamp"


def _config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["juju-workspace"]


def _fingerprint(config: dict) -> str:
    digest = hashlib.sha256(sys.version.encode())
    for folder in config["packages"] + config["test-packs"]:
        digest.update((ROOT / folder / "pyproject.toml").read_bytes())
    digest.update((ROOT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def setup() -> None:
    if sys.version_info[:2] != (3, 11):
        sys.exit(f"juju needs Python 3.11; this is {sys.version.split()[0]}")
    config = _config()
    wanted = _fingerprint(config)
    if STAMP.exists() and STAMP.read_text() == wanted and PYTHON.exists():
        return
    if not PYTHON.exists():
        print(f"[dev] creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    print("[dev] installing juju packs and test tools (first run takes a minute)", flush=True)
    pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    editable = []
    for folder in config["packages"] + config["test-packs"]:
        editable += ["-e", str(ROOT / folder)]
    subprocess.run(pip + editable + config["dev-requirements"], check=True)
    STAMP.write_text(wanted)


def _ensure(requirements: list[str]) -> None:
    """Install optional task requirements (e.g. matplotlib for charts) once."""
    marker = VENV / (".juju-extra-" + hashlib.sha256(" ".join(requirements).encode()).hexdigest()[:12])
    if not marker.exists():
        pip = [str(PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        subprocess.run(pip + requirements, check=True)
        marker.write_text("ok")


def run(args: list[str]) -> int:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([str(PYTHON), *args], cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    setup()
    if command == "setup":
        return 0
    if command == "demo":
        return run(["examples/basic.py", *rest])
    if command == "test":
        return run(["-m", "pytest", "-m", "not full and not fuzz", *rest])
    if command == "conformance":
        return run(["-m", "tests.conformance.run", *rest])
    if command == "fuzz":
        return run(["-m", "tests.fuzz.run", *rest])
    if command == "bench":
        _ensure(_config()["bench-requirements"])
        return run(["-m", "benchmarks.run", *rest])
    if command == "python":
        return run(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
