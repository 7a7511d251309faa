"""Tiered execution: XLA serves a new signature while MAX compiles it.

A MAX compile takes seconds to minutes; `jax.jit` compiles the same program
in well under a second. So on a jit cache miss (`JitFunction.__call__`), a
tiered function runs the traced program through `jax.jit` (XLA on the CPU),
starts the MAX compile on a background thread (MAX's compile releases the
GIL: docs/performance.md), and serves every call of that signature from XLA
until the MAX executable is loaded; from then on calls hit the jit cache and
run on MAX. The switch is logged once (`juju.logs.progress`).

- Same results: the XLA tier runs the Jaxpr juju traced (before juju's own
  rewrites), so random keys give the same bits and values agree within the
  usual tolerance; outputs come back in juju's form (MAX buffers, or jax
  arrays with `coerces_to_jnp`), never sharing memory with an input.
- Errors: where the background compile fails (MAX's error, or its compiler
  crashed in the worker process: `juju.compile_pool`), the signature goes on
  on XLA, and juju says so once in a `MaxUnavailableWarning` naming the
  function and the cause. `JitFunction.wait_compiled()` and
  `.lower(...).compile()` raise the compile's error. A program XLA cannot
  run waits for MAX instead, and a compile error is raised by that call.
- Who is tiered: `juju.jit(f, tiered=...)` decides; else `JUJU_TIERED`
  (`0`/`1`); else CPU engines are, GPU engines only when jax itself has a GPU
  backend (otherwise XLA would run on the host and every result would cross
  to the device; docs/performance.md).
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from concurrent.futures import Future

import jax
from jax import tree_util

from juju import call as _call
from juju import compile_pool
from juju._compat import is_key_dtype, jaxpr_as_fun
from juju.arguments import buffer_from_jax, to_jax
from juju.errors import MaxUnavailableWarning
from juju.logs import describe, log, progress

_ENV = "JUJU_TIERED"


def enabled(fn) -> bool:
    """Whether `fn` (a JitFunction) serves new signatures from XLA first."""
    if fn.tiered is not None:
        return fn.tiered
    env = os.environ.get(_ENV, "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    return fn.engine.kind == "cpu" or jax.default_backend() != "cpu"


class Background:
    """One signature of one function: its MAX compile in flight, and the
    `jax.jit` of its traced Jaxpr serving calls meanwhile."""

    def __init__(self, lowered, load):
        self.lowered = lowered
        self._load = load  # juju.stages.load_executables (the layer above)
        self.xla_calls = 0  # calls this signature served from XLA
        self.xla_failed: BaseException | None = None
        self.future: Future | None = None
        self.max_off = False  # the compile failed: XLA serves this signature for good
        # Donated arguments as jax.jit donates them (the MAX buffer a donated
        # Buffer's to_jax view shares is the caller's to give, as in MAX).
        self._xla = jax.jit(_strong_outputs(lowered.traced_jaxpr),
                            donate_argnums=tuple(j for j, _ in lowered.aliases))
        outvars = lowered.traced_jaxpr.jaxpr.outvars
        # By identity: a literal output (a constant) is a Literal, not hashable.
        produced = {id(v) for eqn in lowered.traced_jaxpr.jaxpr.eqns for v in eqn.outvars}
        # Outputs that are inputs, consts or literals: jax hands them back as
        # they are (an input's memory, or juju's const), so they are copied.
        self._copy = frozenset(
            i for i, v in enumerate(outvars)
            if id(v) not in produced and not is_key_dtype(v.aval.dtype)
        )
        self._as_jax = frozenset(i for i, _ in lowered.out_key_impls) | frozenset(
            i for i, _ in lowered.out_complex)  # juju returns these as jax arrays too

    def start(self) -> None:
        self.started = time.perf_counter()
        self.future = _submit(self._compile)

    def _compile(self) -> None:
        fn = self.lowered.jit_function
        self._load([self.lowered])  # puts the executable in the jit cache
        fn.background.pop(self.lowered.key, None)
        progress("juju: %s now runs on MAX (compiled in %.1f s; %d call(s) ran on XLA "
                 "meanwhile)", describe(fn.fun), time.perf_counter() - self.started,
                 self.xla_calls)

    def run_xla(self, leaves):
        from max.driver import Buffer

        args = [to_jax(x) if isinstance(x, Buffer) else x for x in leaves]
        with _call.inline_on_xla():  # nested juju.jit functions: XLA too, not callbacks
            outs = self._xla(*args)
        self.xla_calls += 1
        fn = self.lowered.jit_function
        fn.xla_call_count += 1
        for i in self._copy:
            outs[i] = jax.numpy.array(outs[i], copy=True)
        if not fn.coerces_to_jnp:
            device = fn.engine.device
            outs = [o if i in self._as_jax else buffer_from_jax(o, None, device)
                    for i, o in enumerate(outs)]
        return tree_util.tree_unflatten(self.lowered.out_tree, outs)


def _strong_outputs(closed):
    """The traced program as a function; weakly typed outputs made strong, as
    MAX's (which carry no weak type) come back."""
    fun = jaxpr_as_fun(closed)
    weak = [a.weak_type for a in closed.out_avals]
    if not any(weak):
        return fun

    def strong(*args):
        outs = fun(*args)
        return [jax.lax.convert_element_type(o, o.dtype) if w else o
                for o, w in zip(outs, weak)]

    return strong


def call(fn, lowered, leaves, load):
    """Serve a call of a signature missing from `fn`'s jit cache; `load`
    compiles a list of `Lowered` into their jit caches."""
    key = lowered.key
    background = fn.background.get(key)
    if background is None:
        background = fn.background[key] = Background(lowered, load)
        log.debug("juju: %s: XLA serves calls while MAX compiles in the background",
                  describe(fn.fun))
        return _run_first(background, leaves)
    if background.xla_failed is not None:  # XLA cannot run it: wait for MAX
        while background.future is None:  # another thread is starting it
            time.sleep(0.01)
        background.future.exception()  # waits
    if background.future is not None and background.future.done():
        return _finished(fn, background, leaves)
    return background.run_xla(leaves)


def _run_first(background, leaves):
    """The signature's first call: on XLA, then the MAX compile starts (so
    that building the MAX graph does not slow the first result)."""
    try:
        result = background.run_xla(leaves)
    except Exception as exc:  # noqa: BLE001  (e.g. a primitive with no XLA lowering)
        background.xla_failed = exc
        progress("juju: %s cannot run on XLA (%s); waiting for MAX",
                 describe(background.lowered.jit_function.fun), str(exc).splitlines()[0][:200])
        background.start()
        background.future.exception()  # waits
        return _finished(background.lowered.jit_function, background, leaves)
    background.start()
    return result


def _finished(fn, background, leaves):
    key = background.lowered.key
    error = background.future.exception()
    if error is None:
        fn.background.pop(key, None)
        return fn.executables[key].run(leaves)
    if background.xla_failed is not None:  # nothing else can run it
        fn.background.pop(key, None)
        raise error
    if not background.max_off:
        background.max_off = True
        warnings.warn(MaxUnavailableWarning(
            f"juju: MAX is off for {describe(fn.fun)} with these argument types; it goes on "
            f"on XLA. The MAX compile failed: {str(error).splitlines()[0]} (wait_compiled() "
            "raises the whole error)"), stacklevel=5)
    return background.run_xla(leaves)



def wait(fn, keys=None) -> None:
    """Wait for `fn`'s background compiles (those of `keys`, or all); raise
    the first error one of them raised (its signature stays on XLA)."""
    for key, background in list(fn.background.items()):
        if keys is not None and key not in keys:
            continue
        if background.future is None:  # its first XLA call is still running
            continue
        error = background.future.exception()  # waits
        if error is not None:
            raise error
        fn.background.pop(key, None)


# --- the compile threads ---------------------------------------------------------
# As many as compiles may run at once (`juju.compile_pool.workers()`); each
# waits on a worker process. They are daemons: an exiting process does not
# wait minutes for a compile nobody will use (its workers are killed at exit,
# and the persistent cache only ever sees whole files).

_queue: queue.Queue = queue.Queue()
_threads: list[threading.Thread] = []
_thread_lock = threading.Lock()


def _submit(task) -> Future:
    compile_pool.register_exit_handler()  # before the thread: it stops at exit
    future: Future = Future()
    _queue.put((future, task))
    with _thread_lock:
        if len(_threads) < compile_pool.workers():
            thread = threading.Thread(target=_serve, name="juju-max-compile", daemon=True)
            thread.start()
            _threads.append(thread)
    return future


def _serve() -> None:
    while True:
        future, task = _queue.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(task())
        except BaseException as exc:  # noqa: BLE001  (handed to the caller's thread)
            future.set_exception(exc)
