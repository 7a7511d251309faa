"""The cost of a host callback in juju (juju/host.py) and in `jax.jit`.

    python -m benchmarks.callbacks

Per-call medians of: a small function with no callback, the same with one
`jax.debug.callback` (a no-op) in the middle, and a 256-step `fori_loop`
whose body holds that callback (per step). juju runs the program as MAX
graphs between host steps (docs/callbacks.md).

Then a loop whose callback sits behind a rarely taken `cond` in each step
(as equinox's checks do): never taken (the loop runs whole in MAX, with a
fired flag), the same loop with no callback in that branch (what the flag
costs), and the branch taken in every step (the MAX run, then the replay by
jax.jit).

Last, fired guards (`python -m benchmarks.callbacks --fired`): a 256-step
loop whose guard fires on the last step only, a no-op callback there, and
the same with a guard that raises there (as `eqx.error_if` does; the time
until the caller catches the error). Interleaved medians, juju and jax.jit
in turn.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import juju

STEPS = 256


def noop(*_):
    pass


def plain(x):
    return jnp.tanh(x * 2.0 + 1.0).sum()


def one_callback(x):
    y = x * 2.0 + 1.0
    jax.debug.callback(noop, y)
    return jnp.tanh(y).sum()


def loop(x):
    def body(i, c):
        jax.debug.callback(noop, c)
        return jnp.tanh(c) * 0.5 + 0.1

    return jax.lax.fori_loop(0, STEPS, body, x)


def _checked(threshold, with_callback=True):
    def checked(x):
        def body(i, c):
            def fire(v):
                if with_callback:
                    jax.debug.callback(noop, v)
                return v * 0.0

            c = jax.lax.cond(c.sum() > threshold, fire, lambda v: v, c)
            return jnp.tanh(c) * 0.5 + 0.1

        return jax.lax.fori_loop(0, STEPS, body, x)

    checked.__name__ = checked.__qualname__ = (
        f"guarded_{'callback' if with_callback else 'no_callback'}_{threshold:g}")
    return checked


guarded_never = _checked(1e9)  # never taken
guarded_reference = _checked(1e9, with_callback=False)  # the same loop, no callback
guarded_taken = _checked(-1e9)  # taken in every step: the MAX run, then the replay


class Fired(Exception):
    pass


def _raise(v):
    raise Fired("guard fired on the last step")


def _last_step(raises):
    """A loop whose guard (a cond on the step number) is taken at its last
    step: a no-op callback there, or one that raises."""
    def fire(v):
        if raises:
            return jax.pure_callback(_raise, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
        jax.debug.callback(noop, v)
        return v

    def guarded(x):
        def body(i, c):
            c = jax.lax.cond(i == STEPS - 1, fire, lambda v: v, c)
            return jnp.tanh(c) * 0.5 + 0.1

        return jax.lax.fori_loop(0, STEPS, body, x)

    guarded.__name__ = guarded.__qualname__ = f"last_step_{'raises' if raises else 'calls'}"
    return guarded


fires_last_step = _last_step(raises=False)
raises_last_step = _last_step(raises=True)


def _timed_call(fn, x):
    start = time.perf_counter()
    try:
        out = fn(x)
        jax.block_until_ready(out) if not hasattr(out, "to_numpy") else out.to_numpy()
    except Exception as exc:  # a raising guard: the time until the caller has the error
        if "Fired" not in str(exc):
            raise
    jax.effects_barrier()
    return time.perf_counter() - start


def interleaved_medians(fns, x, repeats=41):
    """Median seconds of each of `fns`, called in turn (one round after
    another, so that the machine's load weighs on each alike)."""
    for fn in fns:
        _timed_call(fn, x)
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for times, fn in zip(samples, fns):
            times.append(_timed_call(fn, x))
    return [statistics.median(t) for t in samples]


def fired():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    print("| program (256 steps, the guard fires at the last) | juju | jax.jit | juju / jax.jit |")
    print("|---|---:|---:|---:|")
    for f in (guarded_reference, fires_last_step, raises_last_step):
        mine = juju.jit(f, tiered=False)
        mine.lower(x).compile()
        j, r = interleaved_medians([mine, jax.jit(f)], x)
        print(f"| {f.__name__} | {j * 1e6:.0f} us | {r * 1e6:.0f} us | {j / r:.2f} |")


def median_seconds(fn, x, repeats=30):
    fn(x)
    jax.effects_barrier()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn(x)
        jax.block_until_ready(out) if not hasattr(out, "to_numpy") else out.to_numpy()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    print("| program | juju | jax.jit |")
    print("|---|---:|---:|")
    results = {}
    for f in (plain, one_callback, loop, guarded_never, guarded_reference, guarded_taken):
        mine = juju.jit(f, tiered=False)
        mine.lower(x).compile()
        results[f.__name__] = (median_seconds(mine, x), median_seconds(jax.jit(f), x))
    for name, (j, x_) in results.items():
        print(f"| {name} | {j * 1e6:.0f} us | {x_ * 1e6:.0f} us |")
    (jp, xp), (jc, xc), (jl, xl), (jn, xn), (jr, xr), (jt, xt) = results.values()
    print(f"\none callback adds {(jc - jp) * 1e6:.0f} us in juju, {(xc - xp) * 1e6:.0f} us in jax.jit; "
          f"a loop step with a callback costs {jl / STEPS * 1e6:.1f} us in juju, "
          f"{xl / STEPS * 1e6:.1f} us in jax.jit")
    print(f"a guarded callback never taken costs {(jn - jr) / STEPS * 1e6:.2f} us a step "
          f"over the same loop without it in juju ({(xn - xr) / STEPS * 1e6:.2f} us in "
          f"jax.jit); taken, the call costs {jt * 1e6:.0f} us (MAX run and replay) against "
          f"{xt * 1e6:.0f} us in jax.jit")


if __name__ == "__main__":
    import sys

    fired() if "--fired" in sys.argv else main()
