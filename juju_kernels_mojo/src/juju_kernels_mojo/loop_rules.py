"""scan and while_loop on the CPU as one generated Mojo kernel each.

juju_ops_lax lowers a loop onto MAX's `while_loop`, whose every trip goes
through MAX's runtime (~15-35 us on the CPU whatever the body holds): a
`lax.scan` RNN step that XLA runs in 0.4 us cost ~50 us (issue 17). Here a
loop whose body `codegen` can write (static shapes; float32/64,
signed and unsigned integers, bool and PRNG keys; the equations listed there) and whose work per
iteration is small (at most MAX_WORK element operations: beyond that MAX's
vectorized, multi-threaded ops win over scalar loops) becomes a kernel
`juju_loop_<hash of its source>`, built with `mojo precompile` into juju's
kernel cache (seconds, once per distinct loop) and added to the graph.
Anything else, and every loop on a GPU, keeps lax's rule, and so does
every loop when the environment sets `JUJU_LOOP_KERNELS=0`.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path

from max.graph import TensorType, ops

import juju
from juju import CompileError
from juju import primitives as P
from juju.dtypes import physical_aval
from juju.lowering_helpers import load_kernel_library
from juju_kernels_mojo.build import build_kernel_library, generated_sources
from juju_kernels_mojo.codegen import LoopKernel, Unsupported, loop_source

log = logging.getLogger("juju")
# Every dtype reaches the guard, which refuses what the generator does not
# write (SUPPORTED_DTYPES, and PRNG keys as their words).
rules = juju.RuleSet(dtypes=juju.ALL_DTYPES)

#: Most element operations per outermost iteration a generated loop takes.
MAX_WORK = 1 << 16
#: Longest generated source (lines): Mojo's compile time grows with it
#: (distrax's coupling flow, 5,081 lines, builds in seconds and runs 2.9x
#: faster as one kernel than as 1,379 MAX ops). At 6,000 an equinox ViT
#: step (6,873 lines) and a diffrax neural ODE's gradient (9,934) went whole
#: to MAX ops, whose compiles ran past 300 s on two cores; with the parallel
#: regions in one task (codegen/tasks.py) a 4,786-line kernel builds in 47 s.
MAX_LINES = 12000
#: Other limits on the work of some primitives' kernels: primitive ->
#: f(params) -> most element operations (program_kernels' whole programs run
#: once a call, not once an iteration).
WORK_LIMITS: dict = {}

_lock = threading.Lock()
_kernels: OrderedDict = OrderedDict()  # id(eqn) -> [eqn, kernel or None, built library]


def _kernel_for(ctx, build: bool = True) -> tuple[LoopKernel, Path | None] | None:
    """The generated kernel for ctx's loop and, with `build`, its built
    library; None where lax's rule stays (no kernel, or it failed to build)."""
    key = id(ctx.eqn)
    with _lock:
        hit = _kernels.get(key)
    if hit is None or hit[0] is not ctx.eqn:
        enabled = os.environ.get("JUJU_LOOP_KERNELS", "1") != "0"
        hit = [ctx.eqn, _generate(ctx) if enabled and ctx.device.is_cpu() else None, None]
        with _lock:
            _kernels[key] = hit
            while len(_kernels) > 256:
                _kernels.popitem(last=False)
    kernel = hit[1]
    if kernel is None or not build or hit[2] is not None:
        return None if kernel is None else (kernel, hit[2])
    try:
        hit[2] = _library(kernel)
    except CompileError as exc:  # a generator bug: the loop still runs, as a MAX loop
        log.warning("juju: the generated kernel for a %s failed to build; using MAX's loop "
                    "instead. Please report it with this message:\n%s", ctx.eqn.primitive, exc)
        hit[1] = None
        return None
    return kernel, hit[2]


def _generate(ctx) -> LoopKernel | None:
    return write_kernel(ctx.eqn.primitive, ctx.eqn.params, ctx.avals_in, ctx.avals_out,
                        "juju_loop")


def write_kernel(prim, params, avals_in, avals_out, prefix: str,
                 native: bool = False) -> LoopKernel | None:
    """The generated kernel of one equation, named `<prefix>_<hash of its
    source>` (`loop_source`; `native`: a C function), or None where the
    generator refuses the equation or it exceeds the limits (`WORK_LIMITS`
    for its primitive, else `MAX_WORK`; `MAX_LINES`)."""
    placeholder = f"{prefix}_KERNEL_HASH"
    try:
        draft = loop_source(prim, params, avals_in, avals_out, placeholder, native=native)
    except Unsupported as why:
        log.debug("juju: no generated kernel for %s: %s", prim, why)
        return None
    limit = WORK_LIMITS.get(prim)
    if not within_limits(draft, MAX_WORK if limit is None else limit(params)):
        return None
    name = f"{prefix}_{hashlib.sha256(draft.source.encode()).hexdigest()[:16]}"
    return LoopKernel(name, draft.source.replace(placeholder, name), draft.consts, draft.work)


def within_limits(draft: LoopKernel, max_work: int = MAX_WORK) -> bool:
    """Whether a generated kernel is small enough to beat MAX's ops and to
    build in seconds (`max_work`, `MAX_LINES`)."""
    over = over_limits(draft, max_work)
    if over is not None:
        log.debug("juju: no generated kernel: %s", over)
    return over is None


def over_limits(draft: LoopKernel, max_work: int = MAX_WORK) -> str | None:
    """The limit a generated kernel exceeds, with its numbers, or None."""
    if draft.work > max_work:
        return f"{draft.work:,} element operations > the limit {max_work:,}"
    lines = draft.source.count("\n")
    if lines > MAX_LINES:
        return f"{lines:,} lines of Mojo > the limit {MAX_LINES:,}"
    return None


def _library(kernel: LoopKernel) -> Path:
    """The built `.mojoc` of a generated kernel (cached by source hash)."""
    folder = generated_sources(kernel.name, {"__init__.mojo": "", "loop.mojo": kernel.source})
    return build_kernel_library(folder, kernel.name)


def generated(ctx) -> bool:
    # Selecting rules only (ctx.lower is None: `juju.jit`'s check) writes the
    # kernel, not builds it: a program run natively never needs the custom op.
    return _kernel_for(ctx, build=ctx.lower is not None) is not None


def _flat(x, aval):
    return ops.reshape(x, [math.prod(aval.shape)])


def _data(avals):
    """The avals as the graph carries them (a key array as its raw data)."""
    return [physical_aval(a) for a in avals]


def lower_generated(ctx, args):
    """The custom op of ctx's generated kernel (its guard, `generated`, passed)."""
    kernel, library = _kernel_for(ctx)
    load_kernel_library(library)
    operands = [_flat(x, a) for x, a in zip(args, _data(ctx.avals_in))]
    operands += [ctx.constant(c.reshape(-1), c.dtype) for c in kernel.consts]
    results = _data(ctx.avals_out)
    out_types = [TensorType(ctx.max_dtype(a.dtype), [math.prod(a.shape)], device=ctx.device)
                 for a in results]
    outs = ops.custom(kernel.name, ctx.device, operands, out_types)
    return [ops.reshape(o, list(a.shape)) for o, a in zip(outs, results)]


def register_kernel_rule(primitive):
    """Register a rule lowering `primitive` to its generated kernel, where one is."""
    return rules.register(primitive, priority=juju.Priority.KERNEL, guard=generated)


# The params are read by the generator from the equation (ctx.eqn.params).
@register_kernel_rule(P.scan_p)
def lower_scan(ctx, *args, reverse, length, jaxpr, unroll, _split_transpose=False, **layout):
    return lower_generated(ctx, args)


@register_kernel_rule(P.while_p)
def lower_while(ctx, *args, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts):
    return lower_generated(ctx, args)
