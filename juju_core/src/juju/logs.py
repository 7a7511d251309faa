"""What juju says, and where: the `juju` logger.

Library convention: the `juju` logger has a `NullHandler` and no level of its
own, so an application that configures logging decides what it sees (juju's
records propagate to its handlers, once). Compile progress (a compile starts,
ends, a function switches from XLA to MAX) is INFO; cache hits and misses
with their reason are DEBUG.

While the application has configured no logging at all (the root logger has
no handler, as in a script or a notebook), progress lines still reach stderr,
like Python's own last-resort handler does for warnings. `JUJU_LOG_LEVEL`
sets the `juju` logger's level: `WARNING` silences progress, `DEBUG` adds the
cache lines.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import reprlib
import sys
import threading
import time

log = logging.getLogger("juju")
log.addHandler(logging.NullHandler())


class _UnconfiguredStderr(logging.Handler):
    """stderr, only while the application has configured no logging."""

    def emit(self, record):
        if logging.getLogger().handlers:  # the application's handlers print it
            return
        try:
            sys.stderr.write(record.getMessage() + "\n")
        except Exception:  # noqa: BLE001  (logging must never fail a call)
            self.handleError(record)


_stderr = _UnconfiguredStderr()
log.addHandler(_stderr)
if os.environ.get("JUJU_LOG_LEVEL"):
    log.setLevel(os.environ["JUJU_LOG_LEVEL"].upper())


def progress(msg: str, *args) -> None:
    """An INFO line that an unconfigured program shows on stderr by default."""
    if log.isEnabledFor(logging.INFO):
        log.info(msg, *args)
    elif log.level == logging.NOTSET and not logging.getLogger().handlers:
        # Nobody chose a level: show progress, as a script's user expects.
        _stderr.handle(log.makeRecord(log.name, logging.INFO, "(juju)", 0, msg, args, None))


#: Seconds between the lines `heartbeat` writes while a long step runs.
HEARTBEAT_SECONDS = 10.0


@contextlib.contextmanager
def heartbeat(what: str, every: float | None = None):
    """While the block runs, a `progress` line every `every` seconds
    (`HEARTBEAT_SECONDS`): "juju: still <what> (20 s)", so that a compile of
    minutes shows it is alive."""
    every = HEARTBEAT_SECONDS if every is None else every
    done = threading.Event()
    start = time.perf_counter()

    def beat():
        while not done.wait(every):
            progress("juju: still %s (%.0f s)", what, time.perf_counter() - start)

    thread = threading.Thread(target=beat, name="juju-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def describe(fun) -> str:
    """`name (file.py:line)` of the user's function, for messages."""
    target = inspect.unwrap(getattr(fun, "func", fun))  # functools.partial too
    name = (getattr(fun, "__qualname__", None) or getattr(fun, "__name__", None)
            or getattr(target, "__qualname__", None) or reprlib.repr(fun))
    code = getattr(target, "__code__", None)
    if code is None:
        return name
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"


def explain_miss(previous: tuple | None, key: tuple) -> str:
    """Which part of a jit cache key changed since the previous signature,
    like `jax_explain_cache_misses`. Keys are (treedef, statics, signature,
    registry generation)."""
    if previous is None:
        return "first call"
    old_tree, old_statics, old_sig, old_gen = previous
    tree, statics, sig, gen = key
    if gen != old_gen:
        return "the rule registry changed (packs loaded or reloaded)"
    if tree != old_tree:
        return f"argument structure changed: {old_tree} -> {tree}"
    if statics != old_statics:
        old, new = dict(old_statics), dict(statics)
        changed = [k for k in {**old, **new} if old.get(k, _MISSING) != new.get(k, _MISSING)]
        return "static argument(s) " + ", ".join(
            f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}" for k in changed
        )
    for i, (a, b) in enumerate(zip(old_sig, sig)):
        if a != b:
            parts = ("shape", "dtype", "weak_type")
            what = [f"{p} {x} -> {y}" for p, x, y in zip(parts, a, b) if x != y]
            return f"argument leaf {i}: " + ", ".join(what)
    return "unknown"  # e.g. the same signature after clear_cache()


_MISSING = object()
