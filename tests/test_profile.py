"""`juju.profile`: the time of each source line (or equation) of a program.

One program (a dominant matmul, cheap elementwise ops, a `jnp` helper, a
while loop and a scan) is profiled once with `depth=1`: the program and its
per-line graphs in one MAX compilation, which juju's cache keeps for the
later tests. A program with a host callback gets the coarser report.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import juju
from juju import profiling
from juju.profiling import ProfileError, profile

LINES = {name: number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1)
         for name in re.findall(r"# line: (\w+)", text)}


def program(x, w, n):
    y = x * 2.0  # line: scale
    z = y @ w  # line: matmul
    z = jnp.clip(jnp.tanh(z), -0.5, 0.5)  # line: squash
    halved = lax.while_loop(lambda c: c[0] < n, lambda c: (c[0] + 1, c[1] * 0.5),  # line: while
                            (0, z[0, 0]))[1]
    rows = lax.scan(lambda c, row: (c + row, None), jnp.zeros(4), z[:6, :4])[0]  # line: scan
    return z.sum() + halved + rows.sum()


RNG = np.random.default_rng(0)
X = RNG.normal(size=(1024, 1024)).astype(np.float32)  # the matmul dwarfs the rest on a busy machine
W = RNG.normal(size=(1024, 1024)).astype(np.float32) / 30


@pytest.fixture(scope="module")
def profiled():
    return profile(program, X, W, 5, static_argnums=2, depth=1, compare_jax=True, repeats=5)


def _at(profiled, primitive: str, loop=None) -> list:
    found = [e for e in profiled.entries
             if primitive in e.primitive.split("+") and e.loop == loop]
    assert found, f"no '{primitive}' in {[(e.path, e.primitive) for e in profiled.entries]}"
    return found


def _line(entry) -> int:
    assert "test_profile.py:" in entry.source, entry.source
    return int(entry.source.split("test_profile.py:")[1].split(":")[0])


def test_the_dominant_matmul_ranks_first(profiled):
    first = profiled.entries[0]
    assert "dot_general" in first.primitive and _line(first) == LINES["matmul"]
    assert first.share > 0.5 and first.loop is None
    assert first.rule.endswith("(lax)")  # the rule and its pack, as juju.explain says
    assert f"test_profile.py:{LINES['matmul']} " in profiled.by_source()[0][0]
    assert [e.seconds for e in profiled.entries] == sorted(
        (e.seconds for e in profiled.entries), reverse=True)


def test_entries_map_to_their_source_lines(profiled):
    (mul,) = _at(profiled, "mul")
    assert _line(mul) == LINES["scale"] and "mul" in mul.equations[0]
    (tanh,) = _at(profiled, "tanh")
    assert _line(tanh) == LINES["squash"]
    # jnp.clip's jit body is inlined; its equations carry the call's line.
    (clipped,) = _at(profiled, "max")
    assert "min" in clipped.primitive and clipped.path.split("/")[1] == "body"
    assert _line(clipped) == LINES["squash"] and len(clipped.equations) >= 2
    assert _line(_at(profiled, "while")[0]) == LINES["while"]
    assert _line(_at(profiled, "scan")[0]) == LINES["scan"]


def test_loops_report_trips_and_their_bodies(profiled):
    (loop,) = _at(profiled, "while")
    assert loop.trips == 5
    (scan,) = _at(profiled, "scan")
    assert scan.trips == 6
    for outer in (loop, scan):
        body = [e for e in profiled.entries if e.loop == outer.path]
        assert body and all(e.path.startswith(f"{outer.path}/") for e in body)
        (overhead,) = [e for e in body if e.path == f"{outer.path}/overhead"]
        assert overhead.seconds <= outer.seconds
    (body,) = _at(profiled, "mul", loop=loop.path)  # one line: c[0] + 1, c[1] * 0.5
    assert body.primitive == "add+mul" and body.path == f"{loop.path}/body/0"
    top_level = sum(e.share for e in profiled.entries if e.loop is None)
    assert top_level == pytest.approx(1.0)


def test_the_report_adds_up_and_compares_with_jax(profiled):
    assert profiled.program_seconds > 0 and profiled.floor_seconds > 0
    assert profiled.jax_seconds > 0
    text = str(profiled)
    lines = text.splitlines()
    assert lines[0].startswith("juju.profile(program): ") and "jax.jit: " in lines[0]
    assert "dot_general" in lines[3] and f"test_profile.py:{LINES['matmul']}:" in lines[3]
    assert len([line for line in lines if "(lax)" in line or "(mojo)" in line]) <= profiled.top


def test_a_jit_function_is_profiled_with_its_own_options():
    fn = juju.jit(program, static_argnums=2)
    again = profile(fn, X, W, 5)  # the graphs come from juju's cache
    assert "dot_general" in again.entries[0].primitive
    assert not any(e.loop for e in again.entries)  # depth=0: loops are one entry each
    fn(X, W, 5)
    assert fn.compile_count == 1  # profiling compiled it into fn's own cache


def test_a_graph_that_fails_is_a_profile_error(monkeypatch):
    def broken(*args):
        raise RuntimeError("the graph failed")

    monkeypatch.setattr(profiling, "_trips", broken)
    with pytest.raises(ProfileError, match="failed to run") as caught:
        profile(program, X, W, 5, static_argnums=2)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert isinstance(caught.value, juju.JujuError)


def test_wrong_uses_are_typed_errors():
    spec = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(ProfileError, match="concrete arrays"):
        profile(jnp.sin, spec)
    with pytest.raises(TypeError, match="juju.jit function"):
        profile(juju.jit(program, static_argnums=2), X, W, 5, static_argnums=2)
    with pytest.raises(ValueError, match="depth"):
        profile(jnp.sin, 1.0, depth=-1)
    with pytest.raises(ValueError, match="group"):
        profile(jnp.sin, 1.0, group="op")


def test_group_by_line_or_by_equation():
    def lines(x):
        y = jnp.sin(x) * 2.0 + 1.0  # three equations, one line
        return jnp.cos(y) - 3.0  # two more

    closed = jax.make_jaxpr(lines)(np.ones(3, np.float32))
    steps = profiling._steps(closed.jaxpr, "", 0, {})
    assert len(steps) == 5  # group="equation": one graph each
    grouped = profiling._grouped(steps)
    assert [[e.primitive.name for e in u.eqns] for u in grouped] == [
        ["sin", "mul", "add"], ["cos", "sub"]]
    assert [u.path for u in grouped] == ["0", "3"]


def test_a_program_with_a_callback_gets_one_entry_per_step():
    seen = []

    def with_callback(x):
        y = jnp.sin(x) * 2.0  # line: segment
        jax.debug.callback(seen.append, y)  # line: callback
        return jnp.cos(y).sum()

    report = profile(with_callback, np.ones(8, np.float32), repeats=2)
    assert seen  # the callback ran (once per timed run)
    (callback,) = [e for e in report.entries if e.rule == "host"]
    assert callback.primitive == "debug_callback" and _line(callback) == LINES["callback"]
    graphs = [e for e in report.entries if e.rule == "MAX graph"]
    assert graphs and all(e.path.startswith("segment") for e in graphs)
    assert report.floor_seconds == 0 and report.program_seconds > 0
