"""The real-programs tier: programs as each library's documentation writes
them, run by juju and by `jax.jit` and compared.

A program is a builder returning `(fn, args)`: `fn` takes only pytrees of
arrays (anything static, such as a flax module or an nnx graphdef, is closed
over, as a user would with `jax.jit`). Builders import their library
themselves, so a missing library skips its programs only.

    @program("optax_adam", "optax", rtol=1e-5, atol=1e-6)
    def optax_adam():
        ...
        return step, (params, opt_state, batch)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PROGRAMS: dict[str, Program] = {}


@dataclass(frozen=True)
class Program:
    name: str
    library: str
    build: Callable[[], tuple[Callable, tuple]]
    rtol: float
    atol: float
    xfail: str | None  # a known gap: why it fails today (also in docs/programs.md)
    ci: bool  # in CI's fast subset


def program(name: str, library: str, *, rtol: float = 1e-5, atol: float = 1e-6,
            xfail: str | None = None, ci: bool = False):
    """Register a program builder under `name`."""

    def register(build):
        assert name not in PROGRAMS, f"program {name} registered twice"
        PROGRAMS[name] = Program(name, library, build, rtol, atol, xfail, ci)
        return build

    return register


def load_all() -> dict[str, Program]:
    """Import every program module (each registers its programs)."""
    from tests.programs import (  # noqa: F401
        diffrax_programs,
        equinox_programs,
        fitting_programs,
        flax_programs,
        haiku_programs,
        loop_programs,
        more_library_programs,
        optax_programs,
        sampling_programs,
        scipy_programs,
        search_and_signal_programs,
        solver_programs,
    )

    return PROGRAMS
