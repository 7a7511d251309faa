#!/usr/bin/env python3
"""juju's one entry point for development. Needs only Python 3.11 or later.

    python3 dev.py demo          # set up (if needed) and run examples/basic.py
    python3 dev.py test          # set up (if needed) and run the fast test tier
    python3 dev.py compat        # the compatibility tier: newest Python, newest jax
    python3 dev.py wheels        # build, check and install the four wheels; run the demo
                                 # (--no-install: build and check only)
    python3 dev.py conformance   # JAX's primitive harnesses -> docs/coverage.md
    python3 dev.py programs      # the real-programs tier (flax, optax, ...) vs jax.jit, two
                                 # sizes (--cold: juju's caches empty, in a temporary folder)
    python3 dev.py bench         # benchmarks, juju vs jax.jit (--cold-start: empty caches;
                                 # --set gpu: on one GPU, --device cpu --small: dry run)
    python3 dev.py gpu           # ON a lent GPU machine: install, compile, test_gpu, bench,
                                 # docs/gpu.md's table (--dry-run: here; docs/gpu.md says how)
    python3 dev.py fuzz --count 2000   # random programs vs jax.jit (tests/fuzz)
    python3 dev.py census        # what the Mojo generator refuses, counted by class
    python3 dev.py shared-cache --rounds 20   # processes at once on one cache, some killed
    python3 dev.py callbacks     # every host callback placement vs jax.jit (tests/callback_gen)
    python3 dev.py docs          # the docs site into site/ (mkdocs build --strict)
    python3 dev.py python ...    # run the venv's python

Environments (`--env NAME` before the command; [tool.juju-workspace.envs] in
pyproject.toml):
    main     .venv         the Python running dev.py, jax 0.10 (the oldest
                           supported; CI's fast tier); the default
    compat   .venv-compat  the newest Python 3.11-3.14 on PATH or under pyenv,
                           the newest jax; `python3 dev.py --env compat test`
                           runs the fast tier there

Set-up creates the environment's venv beside this file (or at $JUJU_VENV) and
installs the four juju packs in editable mode plus the test tools; it is
skipped when nothing changed. Both environments share MAX's and juju's
compile caches, so graphs that are the same under both jax versions compile once.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
SUPPORTED = ((3, 11), (3, 14))  # the Python versions juju supports (MAX 26.7 has wheels for them)


def _workspace() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["juju-workspace"]


class Env:
    """One development environment: a venv, the Python it is made from, pins."""

    def __init__(self, name: str, config: dict):
        self.name = name
        self.config = config
        self.venv = Path(os.environ.get("JUJU_VENV", ROOT / config["venv"]))
        self.python = self.venv / "bin" / "python"
        self.stamp = self.venv / ".juju-setup-stamp"

    def base_python(self) -> tuple[str, str]:
        """The interpreter the venv is made from, and its version."""
        if self.config["python"] == "current":
            if not SUPPORTED[0] <= sys.version_info[:2] <= SUPPORTED[1]:
                sys.exit(f"juju supports Python {_range()}; this is {sys.version.split()[0]}")
            return sys.executable, sys.version.split()[0]
        found = _newest_python()
        if found is None:
            sys.exit(f"[dev] no Python {_range()} found on PATH or under pyenv")
        return found

    def fingerprint(self, base_version: str, workspace: dict) -> str:
        digest = hashlib.sha256(f"{self.name} {base_version} {self.config}".encode())
        for folder in workspace["packages"] + workspace["test-packs"]:
            digest.update((ROOT / folder / "pyproject.toml").read_bytes())
        digest.update((ROOT / "pyproject.toml").read_bytes())
        return digest.hexdigest()

    def setup(self) -> None:
        workspace = _workspace()
        base, version = self.base_python()
        wanted = self.fingerprint(version, workspace)
        if self.stamp.exists() and self.stamp.read_text() == wanted and self.python.exists():
            return
        if not self.python.exists() or _venv_version(self.venv) != version:
            print(f"[dev] creating {self.venv} with Python {version} ({base})", flush=True)
            subprocess.run([base, "-m", "venv", "--clear", str(self.venv)], check=True)
        print(f"[dev] installing juju packs and test tools into {self.venv} "
              "(first run takes minutes)", flush=True)
        pip = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        if self.config.get("upgrade"):
            pip.append("--upgrade")  # the newest releases the packs allow
        editable = []
        for folder in workspace["packages"] + workspace["test-packs"]:
            editable += ["-e", str(ROOT / folder)]
        subprocess.run(pip + editable + workspace["dev-requirements"]
                       + self.config.get("pins", []), check=True)
        self.stamp.write_text(wanted)

    def ensure(self, requirements: list[str]) -> None:
        """Install optional task requirements (e.g. matplotlib for charts) once."""
        tag = hashlib.sha256(" ".join(requirements).encode()).hexdigest()[:12]
        marker = self.venv / f".juju-extra-{tag}"
        if not marker.exists():
            pip = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
            subprocess.run(pip + requirements, check=True)
            marker.write_text("ok")

    def run(self, args: list[str], python: Path | None = None, cwd: Path = ROOT) -> int:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.run([str(python or self.python), *args], cwd=cwd, env=env).returncode


def _range() -> str:
    (a, b), (c, d) = SUPPORTED
    return f"{a}.{b}-{c}.{d}"


def _venv_version(venv: Path) -> str | None:
    try:
        text = (venv / "pyvenv.cfg").read_text()
    except OSError:
        return None
    found = re.search(r"^version(?:_info)?\s*=\s*(\S+)", text, re.M)
    return found.group(1) if found else None


def _version_of(executable: str) -> str | None:
    try:
        out = subprocess.run(
            [executable, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
            capture_output=True, text=True, timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _newest_python() -> tuple[str, str] | None:
    """The newest supported CPython on PATH (python3.N) or under pyenv."""
    candidates = []
    for minor in range(SUPPORTED[0][1], SUPPORTED[1][1] + 1):
        if found := shutil.which(f"python3.{minor}"):
            candidates.append(found)
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for folder in sorted((pyenv_root / "versions").glob("3.*")):
        if re.fullmatch(r"3\.\d+\.\d+", folder.name):  # not 3.14t (free-threaded) or -dev
            candidates.append(str(folder / "bin" / "python3"))
    best = None
    for executable in candidates:
        version = _version_of(executable)  # pyenv shims of inactive versions fail here
        if version is None:
            continue
        key = tuple(int(part) for part in version.split("."))
        if SUPPORTED[0] <= key[:2] <= SUPPORTED[1] and (best is None or key > best[0]):
            best = (key, executable, version)
    return None if best is None else (best[1], best[2])


# --- wheels ------------------------------------------------------------------------

# What every wheel must carry, and what none may (test-only code).
_WHEEL_MUST_HOLD = ("py.typed", "licenses/LICENSE", "METADATA")
_WHEEL_MUST_NOT_HOLD = ("juju_ops_nn/testing.py", "juju_ops_nn/models.py")


def wheels(env: Env, args: list[str]) -> int:
    """Build each pack's sdist and wheel, check them, install the wheels (not
    editable) into a fresh venv made from the environment's Python and run the
    demo there; with pytest arguments, also run those tests against them.
    `--no-install` stops after the checks (CI: installing MAX and jax into a
    fresh venv takes minutes)."""
    install = "--no-install" not in args
    pytest_args = [arg for arg in args if arg != "--no-install"]
    workspace = _workspace()
    env.ensure(["build>=1.2", "twine>=5", "setuptools>=68"])
    dist = ROOT / ".whl" / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for folder in workspace["packages"]:
        print(f"[dev] building {folder}", flush=True)
        code = env.run(["-m", "build", "--no-isolation", "--outdir", str(dist), "-q",
                        str(ROOT / folder)])
        if code:
            return code
    built = sorted(dist.iterdir())
    if code := env.run(["-m", "twine", "check", "--strict", *map(str, built)]):
        return code
    wheel_files = [path for path in built if path.suffix == ".whl"]
    if problems := _wheel_problems(wheel_files):
        print("\n".join(f"[dev] {problem}" for problem in problems), file=sys.stderr)
        return 1
    if not install:
        return 0
    base, version = env.base_python()
    with tempfile.TemporaryDirectory(prefix="juju-wheels-") as scratch:
        venv = Path(scratch) / "venv"
        print(f"[dev] installing the wheels into a fresh venv (Python {version})", flush=True)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        python = venv / "bin" / "python"
        pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        extra = []
        if pytest_args:
            extra = [str(ROOT / folder) for folder in workspace["test-packs"]]
            extra += workspace["dev-requirements"]
        subprocess.run(pip + list(map(str, wheel_files)) + extra, check=True)
        if pytest_args:  # the fast tier's programs, with the jax the wheels brought
            subprocess.run(pip + _program_requirements(python), check=True)
        # Run from the scratch folder: nothing of the checkout shadows the wheels.
        check = ("import juju, juju_ops_lax, juju_ops_nn, juju_kernels_mojo, sys\n"
                 "assert all(m.__file__.startswith(sys.prefix) for m in "
                 "(juju, juju_ops_lax, juju_ops_nn, juju_kernels_mojo)), 'not the wheels'")
        if code := env.run(["-c", check], python=python, cwd=Path(scratch)):
            return code
        if code := env.run([str(ROOT / "examples" / "basic.py")], python=python,
                           cwd=Path(scratch)):
            return code
        if pytest_args:
            return env.run(["-m", "pytest", "-m", "not full", *pytest_args], python=python)
    return 0


def _parallel(pytest_args: list[str]) -> list[str]:
    """pytest-xdist options for the fast tier: a worker per core (at most 4:
    each holds MAX and jax), whole modules per worker (their fixtures compile
    one batch of graphs each). A cold MAX compile leaves part of the second
    core idle (the Python side of a test module is one thread), so two
    modules at once fill it. `-n 0` (or `-p no:xdist`) runs serially."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses")) or a == "no:xdist"
           for a in pytest_args):
        return []
    return ["-n", str(min(os.cpu_count() or 1, 4)), "--dist", "loadfile"]


def _fast_tier(pytest_args: list[str]) -> list[str]:
    """pytest options of the fast tier (CI's): its markers, and the modules in
    parallel with the cores shared out (each test process gets its MAX
    compile workers)."""
    parallel = _parallel(pytest_args)
    if parallel:
        share = max(1, (os.cpu_count() or 1) // int(parallel[1]))
        os.environ.setdefault("JUJU_COMPILE_WORKERS", str(share))
    return ["-m", "not full and not programs and not fuzz and not processes and not gpu_compile",
            *parallel]


def _wheel_problems(wheel_files: list[Path]) -> list[str]:
    problems = []
    for path in wheel_files:
        names = zipfile.ZipFile(path).namelist()
        for needed in _WHEEL_MUST_HOLD:
            if not any(name.endswith(needed) for name in names):
                problems.append(f"{path.name} lacks {needed}")
        for unwanted in _WHEEL_MUST_NOT_HOLD:
            if unwanted in names:
                problems.append(f"{path.name} ships test-only {unwanted}")
    return problems


# --- commands ----------------------------------------------------------------------


def _program_requirements(python: Path, files=("requirements.txt",)) -> list[str]:
    """tests/programs' requirement `files`, holding jax, jaxlib and numpy at
    the versions installed for `python` (newer library releases may ask for
    a newer jax). requirements.txt serves CI's subset too; requirements-more.txt
    holds libraries only `dev.py programs` runs."""
    wanted = [line.split("#")[0].strip() for name in files
              for line in (ROOT / "tests" / "programs" / name).read_text().splitlines()]
    code = ("from importlib.metadata import version\n"
            "for name in ('jax', 'jaxlib', 'numpy'): print(f'{name}=={version(name)}')")
    held = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          check=True).stdout.split()
    return [line for line in wanted if line] + held


def main(argv: list[str]) -> int:
    envs = _workspace()["envs"]
    env_name = "main"
    if argv[:1] == ["--env"] and len(argv) > 1:
        env_name, argv = argv[1], argv[2:]
    command, rest = (argv[0], argv[1:]) if argv else ("help", [])
    if command in ("help", "-h", "--help"):
        print(__doc__)
        return 0
    if command == "compat":
        env_name = "compat"
    if env_name not in envs:
        print(f"unknown environment {env_name!r}; known: {', '.join(envs)}", file=sys.stderr)
        return 2
    env = Env(env_name, envs[env_name])
    if command == "gpu" and not {"--dry-run", "--pack-kernels"} & set(rest):
        # The GPU machine: its own python3 (CUDA jax), no venv, no network.
        return subprocess.run([sys.executable, "-m", "benchmarks.gpu_session", *rest],
                              cwd=ROOT).returncode
    env.setup()
    if command == "setup":
        return 0
    if command == "demo":
        return env.run(["examples/basic.py", *rest])
    if command == "test":
        env.ensure(_program_requirements(env.python))  # CI's subset of the real-programs tier
        return env.run(["-m", "pytest", *_fast_tier(rest), *rest])
    if command == "programs":
        env.ensure(_program_requirements(env.python,
                                         ("requirements.txt", "requirements-more.txt")))
        # each case's first call timed (tests/programs/runner.py)
        os.environ.setdefault("JUJU_PROGRAMS_FIRST_CALLS", "1")
        if "--cold" not in rest:
            return env.run(["-m", "pytest", "tests/programs", *rest])
        with tempfile.TemporaryDirectory(prefix="juju-cold-") as cache:
            os.environ["JUJU_CACHE_DIR"] = cache  # every graph and kernel compiled anew
            return env.run(["-m", "pytest", "tests/programs",
                            *[a for a in rest if a != "--cold"]])
    if command == "compat":
        env.run(["-c", "import sys, jax; print(f'[dev] compatibility tier: Python "
                       "{sys.version.split()[0]}, jax {jax.__version__}', flush=True)"])
        code = env.run(["-m", "pytest", *_fast_tier(rest), *_workspace()["compat-tests"], *rest])
        return code or env.run(["examples/basic.py"])
    if command == "wheels":
        return wheels(env, rest)
    if command == "conformance":
        return env.run(["-m", "tests.conformance.run", *rest])
    if command == "fuzz":
        return env.run(["-m", "tests.fuzz.run", *rest])
    if command == "census":
        env.ensure(_program_requirements(env.python,
                                         ("requirements.txt", "requirements-more.txt")))
        return env.run(["-m", "benchmarks.census", *rest])
    if command == "shared-cache":
        return env.run(["-m", "tests.shared_cache.run", *rest])
    if command == "callbacks":  # equinox's checks are among the placements
        env.ensure(_program_requirements(env.python))
        os.environ.setdefault("JUJU_TIERED", "0")
        os.environ.setdefault("JUJU_PROGRAM_KERNELS", "0")
        return env.run(["-m", "tests.callback_gen.run", *rest])
    if command == "bench":
        # benchmarks/programs.py's flax and optax rows: the programs tier's pins.
        env.ensure(_workspace()["bench-requirements"] + _program_requirements(env.python))
        return env.run(["-m", "benchmarks.run", *rest])
    if command == "gpu":  # --dry-run: the same phases here, with the venv
        env.ensure(_workspace()["bench-requirements"] + _program_requirements(env.python))
        return env.run(["-m", "benchmarks.gpu_session", "--python", str(env.python), *rest])
    if command == "docs":
        # mkdocstrings reads juju's sources (mkdocs.yml `paths`): no MAX compile.
        env.ensure(_workspace()["docs-requirements"])
        return env.run(["-m", "mkdocs", "build", "--strict", *rest])
    if command == "python":
        return env.run(rest)
    print(f"unknown command {command!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
