"""Tiered execution (juju/tiers.py): XLA serves a new signature while MAX
compiles it in the background, then MAX does.

The rest of the suite runs untiered (tests/conftest.py); here the functions
ask for it (`tiered=True`), and every test checks which tier really ran: the
XLA tier counts its calls (`xla_call_count`), MAX's executable counts its
runs. One MAX compile for the whole module (the program has many outputs).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from max.driver import Buffer

import juju
from juju import call, logs, tiers
from juju.errors import CompileError
from juju.executable import Executable
from tests.util import assert_same, to_numpy


def inner(a, w):
    return jnp.tanh(a @ w)


inner_jit = juju.jit(inner)


def program(x, w, key, n):
    h = inner_jit(x, w)  # a juju.jit function inside: on XLA it must not call back to MAX
    return {
        "h": h,
        "softmax": jax.nn.softmax(h, axis=-1),
        "sum": jnp.sum(h * 2.0),
        "x": x,  # an input as an output: must not share the caller's memory
        "bits": jax.random.bits(key, (8,)),
        "normal": jax.random.normal(key, (4,)),
        "key": jax.random.split(key)[0],
        "weak": n * 2,  # weakly typed in jax; juju's results are never weak
    }


def arguments():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((4, 6), dtype=np.float32),
            rng.standard_normal((6, 5), dtype=np.float32), jax.random.key(7), 3)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def tiers_ran(tmp_path_factory):
    """Both tiers' results, the counts of calls each served, the log lines."""
    cache_dir = os.environ.get("JUJU_CACHE_DIR")
    os.environ["JUJU_CACHE_DIR"] = str(tmp_path_factory.mktemp("juju-cache"))  # a real compile
    records = Records()
    logger = logging.getLogger("juju")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.DEBUG)
    max_runs = []
    run = Executable.run

    def counting_run(self, leaves):
        max_runs.append(self)
        return run(self, leaves)

    Executable.run = counting_run
    callbacks = call.Stats.callbacks
    try:
        f = juju.jit(program, tiered=True)
        args = arguments()
        x_before = args[0].copy()
        first = f(*args)
        second = f(*args)  # MAX needs seconds: still XLA
        xla_calls, max_before = f.xla_call_count, len(max_runs)
        assert f.background, "the MAX compile should be in flight"
        # The AOT path waits for the compile in flight instead of compiling again.
        f.lower(*args).compile()
        compiles = f.compile_count
        f.wait_compiled()
        on_max = f(*args)
        on_max_again = f(*args)
        jnp_f = juju.jit(program, tiered=True, coerces_to_jnp=True)
        jnp_first = jnp_f(*args)
        jnp_f.wait_compiled()  # the same graph: juju's persistent cache or MAX's
        jnp_on_max = jnp_f(*args)
        return dict(first=first, second=second, on_max=on_max, on_max_again=on_max_again,
                    jnp_first=jnp_first, jnp_on_max=jnp_on_max, args=args, x_before=x_before,
                    xla_calls=xla_calls, max_before=max_before, f=f, jnp_f=jnp_f,
                    compiles=compiles, max_runs=max_runs,
                    callbacks=call.Stats.callbacks - callbacks, log=records.messages)
    finally:
        Executable.run = run
        if cache_dir is None:
            os.environ.pop("JUJU_CACHE_DIR")
        else:
            os.environ["JUJU_CACHE_DIR"] = cache_dir
        logger.removeHandler(records)
        logger.setLevel(level)


def test_the_suite_is_not_tiered_but_a_function_can_ask():
    assert not tiers.enabled(juju.jit(program))  # tests/conftest.py
    assert tiers.enabled(juju.jit(program, tiered=True))
    assert not tiers.enabled(juju.jit(program, tiered=False))


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("off", False),
                                             ("", True)])
def test_the_environment_variable_decides_by_default(monkeypatch, value, expected):
    monkeypatch.setenv("JUJU_TIERED", value)
    assert tiers.enabled(juju.jit(program)) is expected  # "": the CPU engine's default


def test_xla_served_the_first_calls_then_max_all_later_ones(tiers_ran):
    r = tiers_ran
    assert r["xla_calls"] == 2 and r["max_before"] == 0
    assert r["f"].xla_call_count == 2  # no XLA call after the switch
    assert r["compiles"] == 1 and r["f"].compile_count == 1  # lower().compile() did not recompile
    assert len([e for e in r["max_runs"] if e is r["max_runs"][0]]) >= 2
    assert not r["f"].background
    assert r["callbacks"] == 0  # the nested juju.jit ran inside XLA, not through MAX


def test_both_tiers_agree_and_random_keys_give_the_same_bits(tiers_ran):
    r = tiers_ran
    xla, on_max = dict(r["first"]), dict(r["on_max"])
    for name in ("bits",):
        assert np.array_equal(to_numpy(xla[name]), to_numpy(on_max[name]))
    assert np.array_equal(jax.random.key_data(xla.pop("key")),
                          jax.random.key_data(on_max.pop("key")))
    assert_same(xla, {k: to_numpy(v) for k, v in on_max.items()})  # values, shapes, dtypes
    expected = jax.jit(program)(*r["args"])
    expected.pop("key")
    assert_same(on_max, expected)


def test_both_tiers_return_the_same_form(tiers_ran):
    r = tiers_ran
    for name in ("h", "softmax", "sum", "x", "bits", "normal", "weak"):
        assert isinstance(r["first"][name], Buffer), name
        assert isinstance(r["on_max"][name], Buffer), name
        assert isinstance(r["jnp_first"][name], jax.Array), name
        assert isinstance(r["jnp_on_max"][name], jax.Array), name
    assert not r["jnp_first"]["weak"].weak_type and not r["jnp_on_max"]["weak"].weak_type
    assert r["jnp_f"].xla_call_count == 1
    assert_same(r["jnp_first"]["normal"], np.asarray(r["jnp_on_max"]["normal"]))


def test_no_xla_tier_result_shares_memory_with_an_input(tiers_ran):
    r = tiers_ran
    x = r["args"][0]
    for out in (r["first"]["x"], r["second"]["x"]):
        assert not np.shares_memory(np.from_dlpack(out), x)
    assert not np.shares_memory(np.asarray(r["jnp_first"]["x"]), x)
    np.from_dlpack(r["first"]["x"])[...] = 0  # a result is the caller's to change
    assert np.array_equal(x, r["x_before"])


def test_no_max_tier_result_shares_memory_with_an_input(tiers_ran):
    assert not np.shares_memory(np.from_dlpack(tiers_ran["on_max"]["x"]), tiers_ran["args"][0])


def test_compile_start_end_and_switch_are_logged_with_the_users_line(tiers_ran):
    lines = tiers_ran["log"]
    where = f"program (test_tiered.py:{program.__code__.co_firstlineno})"
    assert any(line.startswith(f"juju: compiling {where}") for line in lines), lines
    assert any(line.startswith(f"juju: compiled {where}") for line in lines), lines
    switches = [line for line in lines if "now runs on MAX" in line]
    assert len(switches) == 2 and switches[0].startswith(f"juju: {where} now runs on MAX")
    assert f"juju: jit cache miss for {where}: first call" in lines


def test_a_compile_error_leaves_the_signature_on_xla(monkeypatch):
    monkeypatch.setenv("JUJU_DISABLE_CACHE", "1")

    def failing(jobs, session_of):
        raise CompileError(f"MAX failed to compile {jobs[0].what}: boom")

    monkeypatch.setattr(juju.compile_pool, "compile_jobs", failing)
    f = juju.jit(lambda x: x * 3.0 + 1.0, tiered=True)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(f(x).to_numpy(), x * 3 + 1)  # XLA
    futures.wait([b.future for b in f.background.values()])  # the compile fails meanwhile
    said = r"MAX is off for .*<lambda> \(test_tiered.py:.*boom"
    with pytest.warns(juju.MaxUnavailableWarning, match=said):
        np.testing.assert_array_equal(f(x).to_numpy(), x * 3 + 1)  # still XLA, said once
    np.testing.assert_array_equal(f(x).to_numpy(), x * 3 + 1)
    with pytest.raises(CompileError, match="boom"):
        f.wait_compiled()
    with pytest.raises(CompileError, match="boom"):
        f.lower(x).compile()
    assert f.xla_call_count == 3 and f.compile_count == 0


def test_a_compile_error_is_raised_where_xla_cannot_run_the_program(monkeypatch):
    monkeypatch.setenv("JUJU_DISABLE_CACHE", "1")

    def failing(jobs, session_of):
        raise CompileError("MAX failed: boom")

    monkeypatch.setattr(juju.compile_pool, "compile_jobs", failing)
    monkeypatch.setattr(tiers.Background, "run_xla", _no_xla)
    f = juju.jit(lambda x: x * 3.0 + 1.0, tiered=True)
    with pytest.raises(CompileError, match="boom"):
        f(np.arange(3, dtype=np.float32))


def test_constant_outputs_and_no_arguments():
    """Outputs that are literals (constants) and a function of no arguments."""
    f = juju.jit(lambda x: (x, None, 3, jnp.float32(2.5)), tiered=True)
    g = juju.jit(lambda: (jnp.arange(3) * 2, 7.5), tiered=True)
    x = np.ones(2, np.float32)
    on_xla = f(x), g()
    f.wait_compiled()
    g.wait_compiled()
    on_max = f(x), g()
    expected = jax.jit(f.fun)(x), jax.jit(g.fun)()
    assert f.xla_call_count == 1 and g.xla_call_count == 1
    for result in (on_xla, on_max):
        assert_same(result[0], jax.tree.map(np.asarray, expected[0]))
        assert_same(result[1], jax.tree.map(np.asarray, expected[1]))


def test_a_function_xla_cannot_run_waits_for_max(monkeypatch):
    monkeypatch.setattr(tiers.Background, "run_xla", _no_xla)
    f = juju.jit(lambda x: x * 3.0 + 1.0, tiered=True)
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(f(x).to_numpy(), x * 3 + 1)
    assert f.compile_count == 1 and not f.background


def _no_xla(self, leaves):
    raise RuntimeError("no XLA lowering for this primitive")


def test_a_cache_miss_explains_what_changed():
    tree = jax.tree_util.tree_structure(((1, 2), {}))
    sig = (((3,), np.dtype("float32"), False), ((), np.dtype("int32"), True))
    key = (tree, (), sig, 1)
    assert logs.explain_miss(None, key) == "first call"
    shape = (tree, (), (((4,), np.dtype("float32"), False), sig[1]), 1)
    assert logs.explain_miss(key, shape) == "argument leaf 0: shape (3,) -> (4,)"
    assert "static argument(s) n: 2 -> 3" == logs.explain_miss(
        (tree, (("n", 2),), sig, 1), (tree, (("n", 3),), sig, 1))
    assert "registry" in logs.explain_miss(key, (tree, (), sig, 2))


LOGGING = textwrap.dedent("""
    import logging, sys
    from juju import logs
    logs.progress("one %d", 1)               # no logging configured: stderr
    logs.log.debug("hidden")                 # DEBUG needs JUJU_LOG_LEVEL or the app
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="app %(message)s")
    logs.progress("two %d", 2)               # the application's handler, once
    logging.getLogger().setLevel(logging.WARNING)
    logs.progress("three")                   # the application silenced INFO
""")


def test_progress_lines_show_once_whoever_configures_logging():
    env = {k: v for k, v in os.environ.items() if k != "JUJU_LOG_LEVEL"}
    err = subprocess.run([sys.executable, "-c", LOGGING], capture_output=True, text=True,
                         env=env, timeout=300).stderr
    lines = [line for line in err.splitlines() if "one" in line or "two" in line
             or "three" in line or "hidden" in line]
    assert lines == ["one 1", "app two 2"], err[-2000:]


def test_messages_name_a_partial_by_its_function():
    """A functools.partial (of a Jaxpr, say) is named by its function and
    line in juju's log lines, not by its repr."""
    import functools

    from juju.logs import describe

    closed = jax.make_jaxpr(lambda x: x * 2)(1.0)
    text = describe(functools.partial(jax.extend.core.jaxpr_as_fun, closed))
    assert text.startswith("jaxpr_as_fun (") and "lambda" not in text


def test_a_long_step_shows_it_is_alive(caplog):
    """`heartbeat` writes "still <what> (N s)" while a compile or a kernel
    build runs, and stops when it ends."""
    import time

    with caplog.at_level("INFO", logger="juju"):
        with logs.heartbeat("compiling f for cpu with MAX", every=0.05):
            time.sleep(0.3)
        count = len(caplog.records)
        time.sleep(0.15)
    beats = [r.getMessage() for r in caplog.records]
    assert len(beats) >= 3 and len(caplog.records) == count
    assert all(b.startswith("juju: still compiling f for cpu with MAX (") for b in beats)
