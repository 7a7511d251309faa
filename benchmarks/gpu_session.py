"""`python3 dev.py gpu`: one run on a lent GPU machine, from the repo root.

Standard library only: it runs under the GPU machine's own python3 (Python
3.12, CUDA jax), which has no juju venv and no network. MAX travels as the
two bundles of `../shared/tools/gpu-bundle.sh` (each under a device call's
64 MiB), so a run takes two device calls back to back, the second within the
machine's ~30 s warm window (docs/gpu.md gives the exact calls):

    call 1, carry [".gpu/a"]:  bash .gpu/a/unpack.sh          (MAX's runtime -> /tmp/x)
    call 2, carry [".gpu/b"]:  python3 dev.py gpu --out "$OUT"

Call 2 installs MAX and juju into /tmp/site (`.gpu/b/install.sh`; juju's
packs then import from this working tree, ahead of the bundle's wheels),
then runs the phases, each bounded by what is left of `--budget` seconds:

1. compile: `benchmarks/gpu.py --compile-only --with-tests --forms`: every
   graph of tests/test_gpu.py and of the bench, one per worker process
   (16 on that machine), into juju's persistent cache under /tmp/juju-gpu
   (outside the working tree: a later call on the same warm machine finds
   it); jax's compilation cache fills meanwhile;
2. tests: `pytest tests/test_gpu.py` (loads from the cache);
3. bench: `benchmarks/gpu.py --forms` (loads from the cache, times);
4. docs: the table between the `gpu-bench` markers of docs/gpu.md;
5. vendor_blas, if budget is left: the products' tests and bench rows again
   with `JUJU_GPU_VENDOR_BLAS=1` (cuBLAS for every product: its own
   compiles), then the table again with those rows.

Everything worth keeping goes to `--out` ($OUT comes back from the device):
gpu-log.txt, gpu-session.json, gpu-results.json, gpu-results.compile.json,
test_gpu.xml, test_gpu_vendor.xml, gpu-results-vendor.json and gpu.md (docs/gpu.md with the new table; the working tree
itself does not come back). Here, `python3 dev.py gpu --report DIR` writes
the table of a fetched run into docs/gpu.md. A run cut short by the budget
says which phases are left: call again on the warm machine with
`--skip compile` (or the phases done), caches intact.

`--dry-run` (here, on the CPU): the same phases with the venv's python, the
bench at `--device cpu --small`, tests/test_gpu.py's code on the CPU engine
(`JUJU_GPU_TESTS_DRY_RUN=1`), no install, and docs/gpu.md left alone (the
would-be page goes to --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("install", "compile", "tests", "bench", "docs", "vendor_blas")
# What the vendor-BLAS phase runs: the products' tests and rows.
VENDOR_TESTS, VENDOR_ROWS = "bf16 or matmul or mlp_grad", "matmul,MLP,transformer"
SITE = Path("/tmp/site")  # where .gpu/b/install.sh installs MAX and juju's wheels
UNPACKED = Path("/tmp/x/max")  # where .gpu/a/unpack.sh puts MAX's runtime
STATE = Path("/tmp/juju-gpu")  # caches that outlive one device call on a warm machine
START, END = "<!-- gpu-bench:start -->", "<!-- gpu-bench:end -->"
SOURCES = ("juju_core/src", "juju_ops_lax/src", "juju_ops_nn/src")
# What the phases after compile need at least (seconds): the tests load and
# run ~40 graphs, the bench ~20 rows of interleaved rounds plus jax's compiles.
RESERVE = {"tests": 90, "bench": 150, "docs": 5}


class Session:
    def __init__(self, args):
        self.args = args
        self.out = Path(args.out or ROOT / ".gpu" / "out")
        self.out.mkdir(parents=True, exist_ok=True)
        # $OUT starts empty in each device call: an earlier call's results on
        # this (warm) machine come back from STATE, so a resumed run reports all.
        self.kept = STATE / ("out-dry" if args.dry_run else "out")
        for old in self.kept.glob("*") if self.kept.is_dir() else ():
            if not (self.out / old.name).exists():
                shutil.copy2(old, self.out / old.name)
        self.deadline = time.monotonic() + args.budget
        self.log = open(self.out / "gpu-log.txt", "a", buffering=1)
        self.record = {"started": datetime.datetime.now().isoformat(timespec="seconds"),
                       "dry_run": args.dry_run, "phases": {}}
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", JUJU_TIERED="0")
        self.python = args.python or sys.executable

    def say(self, text: str) -> None:
        line = f"[gpu {time.strftime('%H:%M:%S')}] {text}"
        print(line, flush=True)
        self.log.write(line + "\n")

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, phase: str, command: list[str], limit: float) -> int:
        """Run `command` with output into the log, killed (its whole process
        group: compile workers too) after `limit` seconds."""
        self.say(f"{phase}: {' '.join(command)} (limit {limit:.0f} s)")
        start = time.monotonic()
        with subprocess.Popen(command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:
            timer = _Killer(p, limit)
            for line in p.stdout:
                sys.stdout.write(line)
                self.log.write(line)
            code = p.wait()
            timer.cancel()
        self._ended(phase, start,
                    "timed out" if timer.fired else ("ok" if code == 0 else f"exit {code}"))
        return -1 if timer.fired else code

    def run_detached(self, phase: str, command: list[str], limit: float) -> int:
        """Like `run`, but the command outlives this device call: it runs in
        its own process session (which a device call's end does not kill),
        so a compile cut short by the budget goes on while the machine is
        warm, and the next call follows it instead of starting it again
        (a killed MAX compile starts from nothing: the H200 run of
        2026-11-30 lost its four largest graphs twice so)."""
        self.kept.mkdir(parents=True, exist_ok=True)
        pid_file, rc_file, log_file = (STATE / f"{phase}.{ext}" for ext in ("pid", "rc", "log"))
        start, offset = time.monotonic(), 0
        if _alive(pid_file) and not rc_file.exists():  # rc written: it has ended
            self.say(f"{phase}: following the run an earlier call started (limit {limit:.0f} s)")
        else:
            rc_file.unlink(missing_ok=True)
            log_file.write_text("")
            self.say(f"{phase}: {' '.join(command)} (detached; followed for {limit:.0f} s)")
            with open(log_file, "a") as sink:
                process = subprocess.Popen(
                    ["bash", "-c", f'"$@"; echo $? > {rc_file}', phase, *command], cwd=ROOT,
                    env=self.env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            pid_file.write_text(str(process.pid))
        while True:
            offset = self._follow(log_file, offset)
            if rc_file.exists() or not _alive(pid_file):
                offset = self._follow(log_file, offset)
                text = rc_file.read_text().strip() if rc_file.exists() else ""
                code = int(text) if text.lstrip("-").isdigit() else 1
                status = "ok" if code == 0 else f"exit {code}"
                break
            if time.monotonic() - start > limit:
                code, status = -1, "still running (detached)"
                break
            time.sleep(2)
        for kept in self.kept.glob("*.compile.json"):  # written there: it outlives $OUT
            shutil.copy2(kept, self.out / kept.name)
        self._ended(phase, start, status)
        return code

    def _ended(self, phase: str, start: float, status: str) -> None:
        """A phase's time and status: recorded, said and saved."""
        took = time.monotonic() - start
        self.record["phases"][phase] = {"seconds": round(took, 1), "status": status}
        self.say(f"{phase}: {status} after {took:.0f} s ({self.left():.0f} s of the budget left)")
        self.save()

    def _follow(self, log_file: Path, offset: int) -> int:
        with open(log_file) as source:
            source.seek(offset)
            text = source.read()
        sys.stdout.write(text)
        self.log.write(text)
        return offset + len(text.encode())

    def save(self) -> None:
        (self.out / "gpu-session.json").write_text(json.dumps(self.record, indent=2))
        self.kept.mkdir(parents=True, exist_ok=True)
        for path in self.out.glob("*"):
            if path.is_file() and path.name != "gpu-log.txt":
                shutil.copy2(path, self.kept / path.name)


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


class _Killer:
    """Kills a process group once `limit` seconds have passed."""

    def __init__(self, process, limit: float):
        import threading

        self.fired = False
        self._timer = threading.Timer(max(limit, 1.0), self._kill, args=(process,))
        self._timer.daemon = True
        self._timer.start()

    def _kill(self, process) -> None:
        self.fired = True
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def cancel(self) -> None:
        self._timer.cancel()


# --- phases ------------------------------------------------------------------------


def install(s: Session) -> int:
    """MAX from the bundles, juju's packs from this tree; the environment."""
    s.env.update(JUJU_CACHE_DIR=str(STATE / "juju"), JAX_COMPILATION_CACHE_DIR=str(STATE / "jax"),
                 JUJU_COMPILE_WORKERS=str(os.cpu_count() or 1), JUJU_LOG_LEVEL="INFO")
    if s.args.dry_run:
        s.env["JUJU_GPU_TESTS_DRY_RUN"] = "1"
        s.env.pop("JUJU_COMPILE_WORKERS")  # this machine's own default
        return 0
    s.env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # jax and MAX share the GPU
    if cublas := find_cublas():
        s.env.setdefault("CUDA_CUBLAS_LIBRARY", cublas)
        s.say(f"vendor BLAS would load {s.env['CUDA_CUBLAS_LIBRARY']}")
    sources = [str(ROOT / folder) for folder in SOURCES]
    s.env["PYTHONPATH"] = os.pathsep.join(sources + [str(SITE), s.env.get("PYTHONPATH", "")])
    if "install" in s.args.skip:
        return 0
    if not (SITE / ".done").exists():
        if not UNPACKED.is_dir():
            s.say("MAX's runtime is not unpacked on this machine: run the first device call "
                  "(carry .gpu/a: bash .gpu/a/unpack.sh) and then this one within ~30 s")
            return 3
        if not (ROOT / ".gpu/b/install.sh").exists():
            s.say("no .gpu/b here: this call must carry .gpu/b "
                  "(made by ../shared/tools/gpu-bundle.sh)")
            return 3
    code = s.run("install", ["bash", "-c", "source .gpu/b/install.sh"], limit=min(180, s.left()))
    if code == 0 and KERNELS.is_dir():
        code = s.run("install kernels", [s.python, "-c", PLACE_KERNELS], limit=min(60, s.left()))
    return code


# juju-kernels-mojo on the GPU machine, which has no `mojo` driver to build its
# library (bitwise ops, threefry and the pack's own primitives need it): the
# wheel and the `.mojoc` built here (`--pack-kernels`), placed where the pack
# looks for it under that machine's toolchain versions.
KERNELS = ROOT / ".gpu" / "k"
PLACE_KERNELS = f"""
import glob, shutil, subprocess, sys
from pathlib import Path
subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-index', '--no-deps',
                '--no-compile', '--target', '{SITE}', *glob.glob('{KERNELS}/*.whl')], check=True)
import juju_kernels_mojo as k
from juju_kernels_mojo.build import cache_dir, source_hash, toolchain_versions
folder = cache_dir() / toolchain_versions() / f'{{k.LIBRARY}}-{{source_hash(k.KERNEL_DIR)}}'
folder.mkdir(parents=True, exist_ok=True)
shutil.copy2('{KERNELS}/' + k.LIBRARY + '.mojoc', folder)
print('juju-kernels-mojo library placed in', folder)
"""


def pack_kernels() -> int:
    """Here: juju-kernels-mojo's wheel and compiled library into .gpu/k."""
    import juju_kernels_mojo

    shutil.rmtree(KERNELS, ignore_errors=True)
    KERNELS.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(KERNELS),
                    str(ROOT / "juju_kernels_mojo")], check=True)
    shutil.copy2(juju_kernels_mojo.library_path(), KERNELS)
    print(f"wrote {KERNELS}: carry it with .gpu/b")
    return 0


def find_cublas() -> str | None:
    """A cuBLAS for MAX's vendor-BLAS matmuls when it is not where MAX 26.7
    looks first (/usr/local/cuda*/lib64/libcublas.so.{13,12}, read off its
    compiled code): the CUDA wheels beside jax or torch. MAX reads the path
    from CUDA_CUBLAS_LIBRARY."""
    import glob
    import site

    for version in ("13", "12"):
        if glob.glob(f"/usr/local/cuda*/lib64/libcublas.so.{version}"):
            return None  # MAX finds it
    roots = site.getsitepackages() + [p for p in sys.path if p.endswith("site-packages")]
    for version in ("13", "12"):
        for root in roots:
            found = sorted(glob.glob(f"{root}/nvidia/**/libcublas.so.{version}", recursive=True))
            if found:
                return found[0]
    return None


def compile_phase(s: Session) -> int:
    limit = s.left() - sum(RESERVE[p] for p in ("tests", "bench", "docs") if p not in s.args.skip)
    with_tests = [] if "tests" in s.args.skip else ["--with-tests", "--tests-k", s.args.k]
    return s.run_detached("compile", [s.python, "-m", "benchmarks.gpu", "--compile-only",
                                      *with_tests, *bench_options(s),
                                      "--json", str(s.kept / "gpu-results.json")],
                          limit=max(limit, 30))


def tests(s: Session) -> int:
    limit = s.left() - sum(RESERVE[p] for p in ("bench", "docs") if p not in s.args.skip)
    return s.run("tests", [s.python, "-m", "pytest", "tests/test_gpu.py", "-q", "-p",
                           "no:cacheprovider", "-p", "no:xdist", "-k", s.args.k,
                           f"--junitxml={s.out / 'test_gpu.xml'}"], limit=max(limit, 30))


def bench(s: Session) -> int:
    return s.run("bench", [s.python, "-m", "benchmarks.gpu", *bench_options(s),
                           "--json", str(s.out / "gpu-results.json")],
                 limit=max(s.left() - RESERVE["docs"], 30))


def bench_options(s: Session) -> list[str]:
    device = ["--device", "cpu", "--small"] if s.args.dry_run else ["--device", "gpu"]
    return device + ([] if s.args.no_forms else ["--forms"]) + ["--only", s.args.only]


def vendor_blas(s: Session) -> int:
    """The products under MAX's vendor BLAS: compiled (in parallel), tested, timed."""
    saved = dict(s.env)
    s.env["JUJU_GPU_VENDOR_BLAS"] = "1"
    device = bench_options(s)[:3 if s.args.dry_run else 2]
    try:
        code = s.run("vendor_blas compile", [
            s.python, "-m", "benchmarks.gpu", "--compile-only", "--with-tests", "--tests-k",
            s.args.k or VENDOR_TESTS, *device, "--forms", "--only", s.args.only or VENDOR_ROWS,
            "--json", str(s.out / "gpu-results-vendor.json")], limit=s.left() - 60)
        if code == -1:
            return code
        s.run("vendor_blas tests", [s.python, "-m", "pytest", "tests/test_gpu.py", "-q", "-p",
                                    "no:cacheprovider", "-p", "no:xdist", "-k",
                                    s.args.k or VENDOR_TESTS,
                                    f"--junitxml={s.out / 'test_gpu_vendor.xml'}"],
              limit=max(s.left() - 45, 20))
        return s.run("vendor_blas bench", [
            s.python, "-m", "benchmarks.gpu", *device, "--forms", "--only",
            s.args.only or VENDOR_ROWS,
            "--json", str(s.out / "gpu-results-vendor.json")], limit=max(s.left() - 5, 20))
    finally:
        s.env = saved


def docs(s: Session) -> int:
    page = write_docs(s.out, ROOT / "docs" / "gpu.md", s.record)
    (s.out / "gpu.md").write_text(page)
    if not s.args.dry_run:
        (ROOT / "docs" / "gpu.md").write_text(page)
    s.say(f"docs: the table is in {s.out / 'gpu.md'}"
          + ("" if s.args.dry_run else " and docs/gpu.md"))
    return 0


# --- the docs table ------------------------------------------------------------------


def _ms(seconds) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds is not None else ""


def _rate(row) -> str:
    if "juju_tflops" in row:
        return f"{row['juju_tflops']:.1f} / {row['jax_tflops']:.1f} TFLOP/s"
    if "juju_gbs" in row:
        peak = (f" ({row['juju_of_peak']:.0%} / {row['jax_of_peak']:.0%} of peak)"
                if "juju_of_peak" in row else "")
        return f"{row['juju_gbs']:.0f} / {row['jax_gbs']:.0f} GB/s{peak}"
    return ""


def test_summary(xml_path: Path) -> str | None:
    try:
        suite = ElementTree.parse(xml_path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, fails = int(suite.get("tests", 0)), int(suite.get("failures", 0))
    errors, skipped = int(suite.get("errors", 0)), int(suite.get("skipped", 0))
    passed = total - fails - errors - skipped
    failed = [case.get("name") for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    text = (f"{passed} passed, {fails + errors} failed, {skipped} skipped "
            f"in {float(suite.get('time', 0)):.0f} s")
    return text + (f" (failed: {', '.join(failed)})" if failed else "")


def table(out: Path, record: dict | None = None) -> str:
    """The markdown between the markers, from a run's files in `out`."""
    results = json.loads((out / "gpu-results.json").read_text())
    record = record or _read_json(out / "gpu-session.json") or {}
    compiled = _read_json(out / "gpu-results.compile.json")
    versions = results.get("versions", {})
    lines = [
        f"Measured by `python3 dev.py gpu` on {results['chip']} ({results['device']}), "
        f"{results['date']}: MAX {versions.get('max')}, jax {versions.get('jax')}. "
        f"Geomean juju / jax.jit over the rows without a form: **{results['geomean']:.2f}** "
        "(goal <= 1.0, no row above 1.5).",
        "",
    ]
    if record.get("dry_run"):
        lines[0] = "DRY RUN on the CPU (sizes shrunk; not a GPU measurement). " + lines[0]
    summary = test_summary(out / "test_gpu.xml")
    if summary:
        lines += [f"`tests/test_gpu.py`: {summary}.", ""]
    if compiled:
        per = [v for v in compiled["per_graph_s"].values() if v == v]
        lines += [f"Compile phase: {len(compiled['per_graph_s'])} graphs in "
                  f"{compiled['total_s']:.0f} s with {compiled['workers']} worker processes "
                  f"(per graph {min(per, default=0):.0f}-{max(per, default=0):.0f} s).", ""]
    phases = record.get("phases", {})
    if phases:
        lines += ["Phases: " + ", ".join(f"{name} {p['seconds']:.0f} s ({p['status']})"
                                         for name, p in phases.items()) + ".", ""]
    vendor = _read_json(out / "gpu-results-vendor.json") or {}
    vendor_rows = [dict(row, name=f"{row['name']} [vendor_blas]", form="vendor_blas")
                   for row in vendor.get("rows", [])]
    vendor_tests = test_summary(out / "test_gpu_vendor.xml")
    if vendor_tests:
        lines += [f"With `JUJU_GPU_VENDOR_BLAS=1`, `tests/test_gpu.py -k \"{VENDOR_TESTS}\"`: "
                  f"{vendor_tests}.", ""]
    lines += ["| workload | jax.jit | juju | juju / jax | juju / jax rate | matches |",
              "|---|---:|---:|---:|---|---|"]
    for row in results["rows"] + vendor_rows:
        if "skipped" in row:
            lines.append(f"| {row['name']} | | | | skipped: {row['skipped'][:80]} | |")
            continue
        if "ratio" not in row:
            continue
        ratio = f"{row['ratio']:.2f}" if row.get("form") else f"**{row['ratio']:.2f}**"
        match = "yes" if row["matches"] else f"NO: {row.get('mismatch', '')}"
        lines.append(f"| {row['name']} | {_ms(row['jax_s'])} | {_ms(row['juju_s'])} | {ratio} "
                     f"| {_rate(row)} | {match} |")
    return "\n".join(lines)


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_docs(out: Path, page_path: Path, record: dict | None = None) -> str:
    """docs/gpu.md's text with the table of the run in `out` between the markers."""
    page = page_path.read_text()
    if START not in page or END not in page:
        raise SystemExit(f"{page_path} lacks the {START} ... {END} markers")
    head, rest = page.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(out, record)}\n{END}{tail}"


# --- main ---------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="where the run's files go (default: $OUT, else .gpu/out)")
    parser.add_argument("--budget", type=float, default=540.0,
                        help="seconds for the whole run (a device call may run 600)")
    parser.add_argument("--skip", default="", help=f"phases to skip: {','.join(PHASES)}")
    parser.add_argument("--no-forms", action="store_true",
                        help="bench the default product form only (fewer graphs)")
    parser.add_argument("--dry-run", action="store_true",
                        help="on the CPU, here: a few rows and tests unless --only/-k say more")
    parser.add_argument("--only", help="bench rows whose name holds one of these (a,b)")
    parser.add_argument("-k", help="pytest -k expression for tests/test_gpu.py")
    parser.add_argument("--python", help="the interpreter for the phases (default: this one)")
    parser.add_argument("--pack-kernels", action="store_true",
                        help="here: juju-kernels-mojo's wheel and library into .gpu/k, to "
                             "carry with .gpu/b, and do nothing else")
    parser.add_argument("--report", type=Path,
                        help="write the table of a fetched run's files (a folder) into "
                             "docs/gpu.md, and do nothing else")
    args = parser.parse_args(argv)
    if args.only is None:
        args.only = "matmul f32 256x256" if args.dry_run else ""
    if args.k is None:
        args.k = "matmul_f32_transposed_b or bf16_x_wT" if args.dry_run else ""
    if args.dry_run:
        args.no_forms = True
    if args.pack_kernels:
        return pack_kernels()
    if args.report:
        page_path = ROOT / "docs" / "gpu.md"
        page_path.write_text(write_docs(args.report, page_path))
        print(f"wrote the table of {args.report} into {page_path}")
        return 0
    args.skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    if unknown := args.skip - set(PHASES):
        parser.error(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    s = Session(args)
    s.say(f"dev.py gpu in {ROOT} ({'dry run' if args.dry_run else 'GPU machine'}), "
          f"budget {args.budget:.0f} s, out {s.out}")
    code = install(s)  # sets the environment; installs once per machine
    if code:
        return code
    worst = 0
    steps = [("compile", compile_phase), ("tests", tests), ("bench", bench), ("docs", docs),
             ("vendor_blas", vendor_blas)]
    for phase, step in steps:
        if phase in args.skip:
            continue
        if phase == "docs" and not (s.out / "gpu-results.json").exists():
            s.say("docs: no bench results; table not written")
            worst = worst or 1
            continue
        if s.left() < 20 and phase != "docs":
            s.say(f"{phase}: no budget left; call again on the warm machine with "
                  f"--skip {','.join(sorted(args.skip | _done(s)))}")
            worst = worst or 1
            continue
        code = step(s)
        if code == -1 and phase == "compile":
            s.say("compile: still running, detached; the graphs done are cached. Call again "
                  "on the warm machine (within ~30 s, carry .gpu/b): python3 dev.py gpu "
                  "--out \"$OUT\" follows it")
            return 1
        worst = worst or (1 if code else 0)
    if "docs" not in args.skip and any(p.startswith("vendor_blas") for p in s.record["phases"]):
        docs(s)  # the table again, with the vendor-BLAS rows
    s.record["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    s.save()
    s.say("done" + ("" if worst == 0 else " (with failures: see above)"))
    return worst


def _done(s: Session) -> set:
    return {name for name, p in s.record["phases"].items() if p["status"] == "ok"} & set(PHASES)


if __name__ == "__main__":
    sys.exit(main())
