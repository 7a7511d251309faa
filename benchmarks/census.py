"""Why programs leave the generated-kernel path: refusals counted by class.

    python3 dev.py census [--sources programs,harnesses,fuzz] [--fuzz 300]

Lowers every program it can with `juju.jit(...).lower` (the programs tier
at each of its sizes, JAX's primitive harnesses, the fuzz generator's
programs): `juju_kernels_mojo.placement` places each as a call would, each
MAX segment of a program with host callbacks apart, and this counts what
the generator refused: by primitive (with the reason) and by limit. A
program counts once per distinct refusal. Nothing compiles: minutes.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
import traceback

import jax
import numpy as np

import juju
from juju._compat import dce
from juju.callback_lifting import has_callbacks
from juju_kernels_mojo import placement


def _placed(fn, args, x64: bool = False) -> list[placement.Plan] | str:
    """The plans of `fn`'s program as `juju.jit` lowers it: one, or one per
    MAX segment of a program with host callbacks (nothing is compiled)."""
    with jax.enable_x64(x64):
        lowered = juju.jit(fn).lower(*args)
    parts = getattr(lowered, "parts", [lowered])
    plans = [placement.plan_of(part.closed_jaxpr) for part in parts]
    return [p for p in plans if p is not None] or "not placed (effects or empty)"


def _traced(fn, args, x64: bool = False) -> list[placement.Plan] | str:
    """The plan of `fn`'s traced program (quicker than `_placed`, for
    programs without host callbacks)."""
    with jax.enable_x64(x64):
        closed = dce(jax.make_jaxpr(fn)(*args))
    if closed.jaxpr.effects or not closed.jaxpr.eqns or has_callbacks(closed):
        return "not placed (effects, host callbacks or empty)"
    return [placement.place(closed.jaxpr)[1]]


def programs_tier():
    """(name, plan) for each program of tests/programs, at each size."""
    from tests.programs.registry import load_all

    for name, prog in sorted(load_all().items()):
        for size in getattr(prog, "sizes", (None,)):
            label = name if size is None else f"{name}[{size}]"
            try:
                fn, args = prog.build() if size is None else prog.build(size)
                # Placed as traced; a program with host callbacks as lowered
                # (one plan per MAX segment). Lowering a program without them
                # would build its kernel, and a MAX-only program's jaxpr is
                # rewritten again by other packs after placement.
                plans = _traced(fn, args)
                yield label, _placed(fn, args) if isinstance(plans, str) else plans
            except Exception as exc:  # a library missing, a builder failing
                yield label, f"not traced: {type(exc).__name__}: {exc}"[:200]


def harnesses():
    """(name, plan) for each of JAX's primitive harnesses on the CPU."""
    from tests.conformance.harnesses import all_harnesses

    for name, h in sorted(all_harnesses().items()):
        try:
            args = h.dyn_args_maker(np.random.RandomState(0))
            yield name, _traced(h.dyn_fun, args, x64=True)
        except Exception as exc:
            yield name, f"not traced: {type(exc).__name__}"


def fuzz(count: int):
    """(name, plan) for `count` programs of the fuzz generator."""
    from tests.fuzz.run import draw_programs

    for x64, share in ((False, count - count // 4), (True, count // 4)):
        for i, prog in enumerate(draw_programs(share, seed_value=7, x64=x64)):
            try:
                yield f"fuzz{'64' if x64 else ''}_{i}", _traced(prog, prog.inputs, x64=x64)
            except Exception as exc:
                yield f"fuzz_{i}", f"not traced: {type(exc).__name__}"


SOURCES = {"programs": programs_tier, "harnesses": harnesses, "fuzz": fuzz}


def refusal_class(refusal: placement.Refusal) -> str:
    """A refusal without its numbers and shapes: what to count by."""
    if refusal.primitive == "program":
        return "limit: " + re.sub(r"[\d,]+", "N", refusal.reason)
    reason = re.sub(r"\[[^\]]*\]|\([^)]*\)|\d+", "_", refusal.reason)
    return f"{refusal.primitive}: {reason}"


def census(items) -> tuple[collections.Counter, dict, collections.Counter]:
    by_class: collections.Counter = collections.Counter()
    examples: dict[str, str] = {}
    paths: collections.Counter = collections.Counter()
    started = time.perf_counter()
    for count, (name, plans) in enumerate(items, 1):
        now = time.perf_counter()
        took, started = now - started, now
        # One line per program as it is placed: a long run shows where it is.
        print(f"  {count} {name}: {_describe(plans)[:160]} ({took:.1f} s)",
              file=sys.stderr, flush=True)
        if isinstance(plans, str):
            paths[plans.split(":")[0]] += 1
            continue
        kernels = sum(p.kernels for p in plans)
        max_ops = sum(p.max_ops for p in plans)
        paths["one kernel" if kernels == 1 and not max_ops else
              "kernels + MAX ops" if kernels else "MAX ops only"] += 1
        for cls in dict.fromkeys(refusal_class(r) for p in plans for r in p.refusals):
            by_class[cls] += 1
            examples.setdefault(cls, name)
    return by_class, examples, paths


def _describe(plans) -> str:
    if isinstance(plans, str):
        return plans
    return " | ".join(p.describe() for p in plans)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="programs,harnesses,fuzz")
    parser.add_argument("--fuzz", type=int, default=300, help="fuzz programs to draw")
    parser.add_argument("--list", action="store_true", help="also each program's plan")
    args = parser.parse_args(argv)
    for source in args.sources.split(","):
        items = SOURCES[source]() if source != "fuzz" else fuzz(args.fuzz)
        if args.list:
            items = list(items)
            for name, plan in items:
                print(f"  {name}: {_describe(plan)}")
        try:
            by_class, examples, paths = census(items)
        except Exception:
            traceback.print_exc()
            return 1
        total = sum(paths.values())
        print(f"\n## {source}: {total} programs: "
              + ", ".join(f"{k} {v}" for k, v in paths.most_common()))
        print("| programs | refusal | e.g. |\n|---:|---|---|")
        for cls, n in by_class.most_common():
            print(f"| {n} | {cls} | {examples[cls]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
