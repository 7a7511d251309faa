"""`python3 dev.py gpu` (benchmarks/gpu_session.py) without a GPU: the docs
table it writes from a run's files, and what it says on a machine where
MAX's bundle was not unpacked. `python3 dev.py gpu --dry-run` runs the real
phases on the CPU (minutes of compiles: not part of CI)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import gpu_session

ROOT = Path(__file__).resolve().parent.parent


def _row(name, jax_s, juju_s, form=None, **rates):
    return {"name": name, "form": form, "jax_s": jax_s, "juju_s": juju_s,
            "ratio": juju_s / jax_s, "matches": True, **rates}


@pytest.fixture
def run_files(tmp_path):
    rows = [_row("matmul bf16 4096x4096 @ 4096x4096", 1.8e-4, 3.6e-4,
                 jax_tflops=763.0, juju_tflops=381.5),
            _row("softmax 16384x4096 f32 (256 MiB)", 1.2e-4, 1.0e-4, jax_gbs=4473.0,
                 juju_gbs=5368.0, jax_of_peak=0.93, juju_of_peak=1.12),
            _row("matmul bf16 16x4096 @ (4096x4096).T [tensor_cores]", 2e-5, 4e-5,
                 form="tensor_cores"),
            {"name": "flax CNN train step (adam, 64x28x28)", "form": None,
             "skipped": "No module named 'flax'"}]
    (tmp_path / "gpu-results.json").write_text(json.dumps({
        "chip": "NVIDIA H200", "device": "gpu", "date": "2026-12-01",
        "versions": {"max": "26.7.0", "jax": "0.11.2"}, "geomean": 1.41, "rows": rows}))
    (tmp_path / "gpu-results-vendor.json").write_text(json.dumps({
        "rows": [dict(rows[0], juju_s=1.9e-4, ratio=1.9e-4 / 1.8e-4)]}))
    (tmp_path / "gpu-results.compile.json").write_text(json.dumps(
        {"total_s": 210.0, "per_graph_s": {"a": 40.0, "b": 130.0}, "workers": 16}))
    (tmp_path / "test_gpu.xml").write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="1" time="33.2">'
        '<testcase name="test_gpu_matches_jax[sort]"/>'
        '<testcase name="test_gpu_matches_jax[bf16_x_2wT[tensor_cores]]"><failure/></testcase>'
        '</testsuite></testsuites>')
    (tmp_path / "gpu-session.json").write_text(json.dumps(
        {"phases": {"compile": {"seconds": 212.0, "status": "ok"}}}))
    return tmp_path


def test_the_table_holds_the_run(run_files, tmp_path):
    page = tmp_path / "gpu.md"
    page.write_text((ROOT / "docs" / "gpu.md").read_text())
    text = gpu_session.write_docs(run_files, page)
    head, rest = text.split(gpu_session.START)
    table, tail = rest.split(gpu_session.END)
    assert head == page.read_text().split(gpu_session.START)[0]
    assert tail == page.read_text().split(gpu_session.END)[1]
    assert "NVIDIA H200 (gpu), 2026-12-01" in table and "**1.41**" in table
    assert "2 passed, 1 failed, 1 skipped in 33 s" in table
    assert "failed: test_gpu_matches_jax[bf16_x_2wT[tensor_cores]]" in table
    assert "2 graphs in 210 s with 16 worker processes (per graph 40-130 s)" in table
    assert "| matmul bf16 4096x4096 @ 4096x4096 | 0.180 ms | 0.360 ms | **2.00** " in table
    assert "381.5 / 763.0 TFLOP/s" in table
    assert "5368 / 4473 GB/s (112% / 93% of peak)" in table
    assert "| 2.00 |" in table  # a row with a form is not bold: outside the geomean
    assert "[vendor_blas] | 0.180 ms | 0.190 ms | 1.06 |" in table
    assert "skipped: No module named 'flax'" in table
    assert "compile 212 s (ok)" in table


def test_a_fresh_machine_is_told_to_unpack_the_first_bundle(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_session, "SITE", tmp_path / "site")
    monkeypatch.setattr(gpu_session, "STATE", tmp_path / "state")
    monkeypatch.setattr(gpu_session, "UNPACKED", tmp_path / "x" / "max")
    code = gpu_session.main(["--out", str(tmp_path / "out"), "--budget", "30"])
    assert code == 3
    assert "run the first device call (carry .gpu/a" in capsys.readouterr().out


def test_a_detached_phase_outlives_its_call_and_the_next_call_follows_it(tmp_path, monkeypatch):
    """A compile cut short by the budget keeps running (its own process
    session); the next call follows it to its end instead of starting it
    again, and reports its exit code."""
    import argparse

    monkeypatch.setattr(gpu_session, "STATE", tmp_path / "state")
    marker = tmp_path / "started"
    command = ["bash", "-c", f"echo x >> {marker}; sleep 3; echo done-compiling"]

    def session(out):
        args = argparse.Namespace(out=str(tmp_path / out), dry_run=True, budget=60.0,
                                  python=None)
        return gpu_session.Session(args)

    first = session("one")
    assert first.run_detached("compile", command, limit=0.5) == -1
    assert first.record["phases"]["compile"]["status"] == "still running (detached)"
    second = session("two")
    assert second.run_detached("compile", command, limit=30) == 0
    assert marker.read_text() == "x\n"  # started once
    assert "done-compiling" in (tmp_path / "two" / "gpu-log.txt").read_text()
    third = session("three")  # finished: a new call starts it again
    assert third.run_detached("compile", ["bash", "-c", "exit 3"], limit=30) == 3
