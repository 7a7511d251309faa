"""Many processes on one fresh cache, some killed mid-build (issue 55).

    python3 dev.py shared-cache --rounds 20        # the acceptance run
    python -m tests.shared_cache.run --rounds 3 --processes 4 --kill-every 2

Each round starts `--processes` processes at once on an empty juju cache
(`JUJU_CACHE_DIR` and `XDG_CACHE_HOME` fresh), each running the programs of
tests/shared_cache/programs.py and comparing them with jax.jit: all the same
programs in the same order, or (every other round) in an order rotated per
process, so that they build different kernels at once. Every other round adds
a process that exits right after its first calls while MAX compiles in the
background (a short script's life), and every `--kill-every`-th round a
process that is killed with SIGKILL mid-build: when it has a Mojo compiler
child, when its MAX compile worker is busy, or at a random moment. Every
`--xdist-every`-th round is instead pytest-xdist workers running
tests/test_shared_cache.py on the fresh cache.

A round passes when every process that was not killed exits with status 0,
every result equals jax.jit's, no process logs a warning (the fallback of a
native kernel to a MAX graph, a dropped cache entry) or aborts, and then one
more process finds everything in the cache: no MAX compile, no Mojo build.
MAX's own cache (`MODULAR_CACHE_DIR`) stays the user's (`--max-cache` names
another, `--fresh-max-cache` an empty one for the run): a cold MAX compile
takes minutes on a loaded 2-core machine, and juju's caches are under test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.shared_cache.programs import PROGRAMS

ROOT = Path(__file__).resolve().parents[2]
FAILURE_SIGNS = ("FATAL", "Aborted", "terminate called", "failed to build", "Traceback")


def users_max_cache() -> Path:
    """MAX's cache folder in this environment (before XDG_CACHE_HOME moves)."""
    if os.environ.get("MODULAR_CACHE_DIR"):
        return Path(os.environ["MODULAR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "modular"


def _env(cache: Path, max_cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JUJU_") or k == "JUJU_VENV"}
    env.update(XDG_CACHE_HOME=str(cache / "xdg"), JUJU_CACHE_DIR=str(cache / "juju"),
               MODULAR_CACHE_DIR=str(max_cache), JUJU_COMPILE_WORKERS="1",
               # this tree's packs before any installed ones (a snapshot of a worktree)
               PYTHONPATH=os.pathsep.join(map(str, [ROOT, *ROOT.glob("juju_*/src")])))
    return env


def _start(names: list[str], env: dict, exit_at_once: bool = False) -> subprocess.Popen:
    command = [sys.executable, "-m", "tests.shared_cache.programs", ",".join(names)]
    if exit_at_once:
        command.append("--exit-at-once")
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _children(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    lines = []
    for child in children:
        try:
            lines.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                         .decode(errors="replace"))
        except OSError:
            pass
    return lines


def _kill_mid_build(victim: subprocess.Popen, how: str, rng: random.Random) -> str:
    """SIGKILL `victim` when `how` says (a Mojo child, a compile worker, a
    random moment); what it was doing then."""
    deadline = time.monotonic() + (rng.uniform(2.0, 25.0) if how == "random" else 300.0)
    while victim.poll() is None and time.monotonic() < deadline:
        children = _children(victim.pid)
        if how == "mojo" and any("/bin/mojo" in c for c in children):
            time.sleep(rng.uniform(0.0, 1.5))
            break
        if how == "compile" and any("compile_worker.py" in c for c in children):
            time.sleep(rng.uniform(0.5, 3.0))
            break
        time.sleep(0.02)
    doing = ", ".join(sorted({"mojo" if "/bin/mojo" in c else "compile worker"
                              for c in _children(victim.pid)})) or "no child"
    if victim.poll() is not None:
        return f"{how}: it ended first (status {victim.returncode})"
    victim.send_signal(signal.SIGKILL)
    return f"{how}: killed ({doing})"


def _work(out: str) -> tuple[int, int]:
    """(MAX compiles, Mojo builds) a process reported."""
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return 0, 0
    return report["compiles"], report["builds"]


def _problems(label: str, proc: subprocess.Popen, out: str, err: str) -> list[str]:
    problems = []
    if proc.returncode != 0:
        problems.append(f"{label}: exit status {proc.returncode}")
    signs = [line for line in err.splitlines() if any(s in line for s in FAILURE_SIGNS)]
    if signs:
        problems.append(f"{label}: stderr says {signs[:3]}")
    try:
        report = json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        problems.append(f"{label}: no report; stderr: {err[-1500:]}")
        return problems
    wrong = {k: v for k, v in report["results"].items() if v != "ok"}
    if wrong:
        problems.append(f"{label}: wrong results {wrong}")
    if report["warnings"]:
        problems.append(f"{label}: warnings {report['warnings'][:3]}")
    return problems


def one_round(index: int, args, max_cache: Path, rng: random.Random) -> tuple[list[str], str]:
    names = list(PROGRAMS)
    with tempfile.TemporaryDirectory(prefix="juju-shared-cache-") as scratch:
        cache = Path(scratch)
        env = _env(cache, max_cache)
        if args.xdist_every and index % args.xdist_every == 0:
            kind = f"pytest-xdist -n {args.processes}"
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "xdist", "-n", str(args.processes),
                 "--dist", "load", "tests/test_shared_cache.py", "-k", "test_program"],
                cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
            problems = [] if proc.returncode == 0 else [f"pytest: {proc.stdout[-3000:]}"]
        else:
            rotate = index % 2 == 0
            kind = "rotated" if rotate else "same order"
            procs = [_start(names[i:] + names[:i] if rotate else names, env)
                     for i in range(args.processes)]
            exiting = _start(names, env, exit_at_once=True) if index % 2 else None
            kill = None
            if args.kill_every and index % args.kill_every == 0:
                victim = _start(names[::-1], env)
                kill = _kill_mid_build(victim, rng.choice(["mojo", "compile", "random"]), rng)
                victim.wait()
                kind += f", a process {kill}"
            if exiting is not None:
                kind += ", one exiting at once"
            problems, work = [], [0, 0]
            for i, proc in enumerate(procs + ([exiting] if exiting else [])):
                try:
                    out, err = proc.communicate(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    out, err = proc.communicate()
                    problems.append(f"process {i}: timed out")
                problems += _problems(f"process {i}", proc, out, err)
                work = [a + b for a, b in zip(work, _work(out))]
            kind += f"; {work[0]} MAX compiles, {work[1]} Mojo builds in all"
        check = _start(names, env)
        out, err = check.communicate(timeout=args.timeout)
        problems += _problems("the check after the round", check, out, err)
        if not problems:
            report = json.loads(out.strip().splitlines()[-1])
            if report["compiles"] or report["builds"]:
                problems.append(f"the check after the round compiled {report['compiles']} "
                                f"and built {report['builds']}: the cache lost entries")
    return problems, kind


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--kill-every", type=int, default=2, help="0: never kill")
    parser.add_argument("--xdist-every", type=int, default=5, help="0: no pytest-xdist rounds")
    parser.add_argument("--seed", type=int, default=55)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per process")
    parser.add_argument("--max-cache", help="MAX's cache folder (default: the user's)")
    parser.add_argument("--fresh-max-cache", action="store_true",
                        help="an empty MAX cache for the run")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    if args.fresh_max_cache:
        max_cache = Path(tempfile.mkdtemp(prefix="juju-shared-max-cache-"))
    else:
        max_cache = Path(args.max_cache) if args.max_cache else users_max_cache()
    passed = 0
    for index in range(1, args.rounds + 1):
        start = time.perf_counter()
        problems, kind = one_round(index, args, max_cache, rng)
        status = "FAIL" if problems else "pass"
        print(f"round {index:2d}: {status} in {time.perf_counter() - start:6.1f} s ({kind})",
              flush=True)
        for problem in problems:
            print(f"    {problem}", flush=True)
        passed += not problems
    print(f"{passed} of {args.rounds} rounds passed ({args.processes} processes a round)")
    return 0 if passed == args.rounds else 1


if __name__ == "__main__":
    sys.exit(main())
