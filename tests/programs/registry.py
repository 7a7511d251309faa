"""The real-programs tier: programs as each library's documentation writes
them, run by juju and by `jax.jit` and compared, each at two sizes.

A program is a builder taking a size and returning `(fn, args)`: `fn` takes
only pytrees of arrays (anything static, such as a flax module or an nnx
graphdef, is closed over, as a user would with `jax.jit`). Builders import
their library themselves, so a missing library skips its programs only.

    @program("optax_adam", "optax", rtol=1e-5, atol=1e-6)
    def optax_adam(size):
        n, d = sized(size, small=(16, 8), large=(256, 512))
        ...
        return step, (params, opt_state, batch)

Sizes (`SIZES`): "small" is the tier's first size, where a program's per-op
costs show; "large" is one people run: batch >= 128, width >= 256, sequence
>= 256 or signals of >= 16k samples, whichever the program has (sequence
models keep a batch of a few, so that one step stays under a second on two
cores). A program whose large size would mean nothing says why in
`no_large`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

SIZES = ("small", "large")
PROGRAMS: dict[str, Program] = {}


@dataclass(frozen=True)
class Program:
    name: str
    library: str
    build: Callable[[str], tuple[Callable, tuple]]  # size -> (fn, args)
    rtol: float
    atol: float
    xfail: str | None  # a known gap: why it fails today (also in docs/programs.md)
    ci: bool  # its small size is in CI's fast subset
    no_large: str | None  # why the program has no large size (rare)

    @property
    def sizes(self) -> tuple[str, ...]:
        return ("small",) if self.no_large else SIZES


def program(name: str, library: str, *, rtol: float = 1e-5, atol: float = 1e-6,
            xfail: str | None = None, ci: bool = False, no_large: str | None = None):
    """Register a program builder under `name`."""

    def register(build):
        assert name not in PROGRAMS, f"program {name} registered twice"
        PROGRAMS[name] = Program(name, library, build, rtol, atol, xfail, ci, no_large)
        return build

    return register


def sized(size: str, *, small, large):
    """`small` or `large`, as `size` says (an unknown size is an error)."""
    if size not in SIZES:
        raise ValueError(f"unknown program size {size!r}; sizes are {SIZES}")
    return small if size == "small" else large


def load_all() -> dict[str, Program]:
    """Import every program module (each registers its programs)."""
    # midsize_programs first: issue 52's rows lead the report
    from tests.programs import midsize_programs  # noqa: F401, I001
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
