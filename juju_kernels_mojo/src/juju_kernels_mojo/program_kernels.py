"""A small program as one generated Mojo kernel, on the CPU.

MAX runs every op of a graph through its runtime, ~1-3 us each on the CPU
whatever its size: an optax Adam step on a 8x4 regression (162 equations)
took 160 us to execute, against jax.jit's whole call of 81 us. When every
equation of a traced program is one `loop_codegen` can write and the
program's work is small (`work_limit`), the
rewrite below replaces the program by one `mojo_program` equation, and
`loop_rules` writes the whole program as one kernel, as it does a loop body:
the graph is then one custom op.

Anything else keeps the program as it was. On a GPU, or where the kernel
fails to build, `mojo_program`'s own rule lowers its equations one by one
through the interpreter, as before the rewrite. `JUJU_PROGRAM_KERNELS=0`
turns the rewrite off; `JUJU_PROGRAM_KERNELS=islands` also makes a kernel of
each long run of writable equations in a program that has others.
"""

from __future__ import annotations

import math
import os

import juju
from juju import primitives as P
from juju._compat import ClosedJaxpr, Jaxpr, JaxPrimitive, Var, jex_core, open_jaxpr
from juju._compat import sub_jaxprs_of_params
from juju_kernels_mojo import loop_codegen, loop_rules
from juju_kernels_mojo.loop_codegen import Emitter, Unsupported, loop_source

#: A program kernel runs once a call, single-threaded, where MAX runs each
#: of the program's ops with ~1-3 us of dispatch, multi-threaded. Measured on
#: the 2-core machine (kernel / MAX ops / jax.jit, ms): a flax transformer
#: encoder step (633 equations, 260k element operations) 0.50 / 1.23 / 0.58;
#: an einops ViT step (737, 2.7M) 1.06 / 1.55 / 0.78; but optax's global-norm
#: clipping of a 1000x64 parameter (49 equations, 1.4M: each op a big
#: vectorized one) 0.57 / 0.22 / 0.29, and haiku's ResNet block (240, 830k,
#: mostly scalar convolution loops) 0.95 / 0.89 / 0.47. So a program is one
#: kernel up to PROGRAM_MAX_WORK, and beyond that while its work per equation
#: is at most WORK_PER_EQUATION (convolutions count double where they are
#: scalar loops). With SIMD convolutions (NHWC/HWIO) haiku's block is one
#: kernel: 0.41 ms, against 0.70 with scalar ones and jax.jit's 0.30-0.40.
PROGRAM_MAX_WORK = 1 << 18
WORK_PER_EQUATION = 4096
#: Runs of fewer equations (those in branches and calls included) between
#: MAX ops stay MAX ops (islands): each island is a custom op of its own. A
#: whole program of any size is one kernel where the generator takes it: it
#: then runs without MAX's runtime (`native_programs`, ~25 us less a call),
#: and its Mojo build (~3 s) costs less than a MAX graph's compile (~10 s).
ISLAND_MIN_EQUATIONS = 8
#: Largest value (elements) an island between MAX ops may compute. Islands
#: are opt-in: on the flax CNN step they gave 2.42x -> 1.59x jax.jit, but
#: haiku's ResNet block went from 1.88x to 5.7x (2.89x with this cap), not yet
#: understood (custom ops may stop MAX fusing the ops around them).
ISLAND_MAX_ELEMENTS = 1024

program_p = JaxPrimitive("mojo_program")
program_p.multiple_results = True


def work_limit(call_jaxpr) -> int:
    """Most element operations a program kernel of `call_jaxpr` takes."""
    return max(PROGRAM_MAX_WORK, WORK_PER_EQUATION * _equation_count(call_jaxpr.jaxpr))


def _equation_count(jaxpr) -> int:
    """Equations, those of called jaxprs included (each a MAX op or more)."""
    return _op_count(jaxpr.eqns)


def _op_count(eqns) -> int:
    return sum(1 + sum(_equation_count(open_jaxpr(sub)) for sub in sub_jaxprs_of_params(e.params)
                       if e.primitive not in (P.while_p, P.scan_p))
               for e in eqns)


loop_rules.WORK_LIMITS[program_p] = lambda params: work_limit(params["call_jaxpr"])

# The generator writes a program as it writes the body of a call.
loop_codegen.EQUATIONS[program_p] = Emitter.call

rules = juju.RuleSet(dtypes=juju.ALL_DTYPES)  # its equations' rules choose


@rules.register(program_p)
def lower_mojo_program(ctx, *args, call_jaxpr):
    # Where no kernel is generated: the program's equations, one rule each.
    return ctx.lower(call_jaxpr, *args)


@loop_rules.register_kernel_rule(program_p)
def lower_mojo_program_kernel(ctx, *args, call_jaxpr):
    return loop_rules.lower_generated(ctx, args)


def enabled() -> bool:
    return os.environ.get("JUJU_PROGRAM_KERNELS", "1") != "0"


def islands_enabled() -> bool:
    """Islands are opt-in (`JUJU_PROGRAM_KERNELS=islands`): see ISLAND_MAX_ELEMENTS."""
    return os.environ.get("JUJU_PROGRAM_KERNELS", "1") == "islands"


def rewrite(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`closed` as one `mojo_program` equation where the generator takes it
    whole; else, with islands on, each run of at least `ISLAND_MIN_EQUATIONS`
    consecutive equations it takes (an island between, say, convolutions) as
    one; else `closed`."""
    jaxpr = closed.jaxpr
    if not enabled() or jaxpr.effects or not jaxpr.eqns:
        return closed
    eqns = _island(jaxpr, 0, len(jaxpr.eqns), 1)
    if eqns is None and islands_enabled():
        eqns, done = [], 0
        for start, stop in _runs(jaxpr):
            eqns += jaxpr.eqns[done:start]  # the equations between runs: MAX ops
            eqns += _island(jaxpr, start, stop, ISLAND_MIN_EQUATIONS) or jaxpr.eqns[start:stop]
            done = stop
        eqns += jaxpr.eqns[done:]
    if eqns is None or len(eqns) == len(jaxpr.eqns):
        return closed
    return ClosedJaxpr(jaxpr.replace(eqns=eqns), closed.consts)


def _island(jaxpr, start: int, stop: int, min_equations: int) -> list | None:
    """Equations `start:stop` of `jaxpr` as `mojo_program` equations (halved
    until each is within `loop_rules`' limits), or None where they are fewer
    than `min_equations` or the generator refuses them."""
    run = jaxpr.eqns[start:stop]
    if _op_count(run) < min_equations:
        return None
    defined = {v for e in run for v in e.outvars}
    inputs = list(dict.fromkeys(v for e in run for v in e.invars
                                if isinstance(v, Var) and v not in defined))
    used_later = {v for e in jaxpr.eqns[stop:] for v in e.invars if isinstance(v, Var)}
    used_later.update(v for v in jaxpr.outvars if isinstance(v, Var))
    outputs = list(dict.fromkeys(v for e in run for v in e.outvars if v in used_later))
    if not outputs:
        return None
    params = _params(inputs, outputs, run)
    draft = _draft(params, inputs, outputs)
    if draft is None:
        return None
    if not loop_rules.within_limits(draft, work_limit(params["call_jaxpr"])):
        if not islands_enabled():  # halves of a program are islands too
            return None
        middle = (start + stop) // 2
        halves = (_island(jaxpr, start, middle, ISLAND_MIN_EQUATIONS),
                  _island(jaxpr, middle, stop, ISLAND_MIN_EQUATIONS))
        if halves == (None, None):
            return None
        return ((halves[0] or jaxpr.eqns[start:middle]) + (halves[1] or jaxpr.eqns[middle:stop]))
    return [jex_core.new_jaxpr_eqn(inputs, outputs, program_p, params, jex_core.no_effects,
                                   run[0].source_info)]


def _params(inputs, outputs, eqns) -> dict:
    """A `mojo_program` equation's params: `eqns` as a program of `inputs`."""
    return {"call_jaxpr": ClosedJaxpr(
        Jaxpr(constvars=[], invars=inputs, outvars=outputs, eqns=eqns), [])}


def _draft(params, inputs, outputs):
    try:
        return loop_source(program_p, params, [v.aval for v in inputs],
                           [v.aval for v in outputs], "probe")
    except Unsupported as why:
        loop_rules.log.debug("juju: no program kernel: %s", why)
    except Exception as exc:  # a generator bug must never break a program
        loop_rules.log.warning("juju: the Mojo program generator failed (%s: %s); those "
                               "equations stay MAX ops. Please report it.",
                               type(exc).__name__, exc)
    return None


def _runs(jaxpr) -> list[tuple[int, int]]:
    """The maximal runs of consecutive equations the generator writes, each
    small enough on its own, as (start, stop); the equations between them
    stay MAX ops."""
    runs, start = [], None
    for i, eqn in enumerate([*jaxpr.eqns, None]):
        if eqn is not None and _writable(eqn):
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    return runs


def _writable(eqn) -> bool:
    if any(math.prod(v.aval.shape) > ISLAND_MAX_ELEMENTS for v in eqn.outvars
           if hasattr(v.aval, "shape")):
        return False
    inputs = [v for v in eqn.invars if isinstance(v, Var)]
    params = _params(inputs, list(eqn.outvars), [eqn])
    try:
        draft = loop_source(program_p, params, [v.aval for v in inputs],
                            [v.aval for v in eqn.outvars], "probe")
    except Exception:  # Unsupported, or a generator bug (reported for the run, if any)
        return False
    return draft.work <= loop_rules.MAX_WORK


rewrite.__qualname__ = "juju_kernels_mojo.program_kernels"
