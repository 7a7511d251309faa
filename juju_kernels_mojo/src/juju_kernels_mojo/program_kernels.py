"""A small program as one generated Mojo kernel, on the CPU.

MAX runs every op of a graph through its runtime, ~1-3 us each on the CPU
whatever its size: an optax Adam step on a 8x4 regression (162 equations)
took 160 us to execute, against jax.jit's whole call of 81 us. When every
equation of a traced program is one `loop_codegen` can write and the
program's work is small (`loop_rules.MAX_WORK` element operations), the
rewrite below replaces the program by one `mojo_program` equation, and
`loop_rules` writes the whole program as one kernel, as it does a loop body:
the graph is then one custom op.

Anything else keeps the program as it was. On a GPU, or where the kernel
fails to build, `mojo_program`'s own rule lowers its equations one by one
through the interpreter, as before the rewrite. `JUJU_PROGRAM_KERNELS=0`
turns the rewrite off.
"""

from __future__ import annotations

import os

import juju
from juju._compat import ClosedJaxpr, Jaxpr, JaxPrimitive, Var, jex_core
from juju_kernels_mojo import loop_codegen, loop_rules
from juju_kernels_mojo.loop_codegen import Emitter, Unsupported, loop_source

#: Programs with fewer equations stay MAX graphs: MAX's per-op cost is small
#: next to a call's, and a kernel costs a Mojo build at the first call.
MIN_EQUATIONS = 8

program_p = JaxPrimitive("mojo_program")
program_p.multiple_results = True

# The generator writes a program as it writes the body of a call.
loop_codegen.EQUATIONS[program_p] = Emitter.call

rules = juju.RuleSet()


@rules.register(program_p)
def lower_mojo_program(ctx, *args, call_jaxpr):
    # Where no kernel is generated: the program's equations, one rule each.
    return ctx.lower(call_jaxpr, *args)


@loop_rules.register_kernel_rule(program_p)
def lower_mojo_program_kernel(ctx, *args, call_jaxpr):
    return loop_rules.lower_generated(ctx, args)


def enabled() -> bool:
    return os.environ.get("JUJU_PROGRAM_KERNELS", "1") != "0"


def rewrite(closed: ClosedJaxpr) -> ClosedJaxpr:
    """`closed` as one `mojo_program` equation, where the generator takes it
    whole; otherwise `closed` itself."""
    jaxpr = closed.jaxpr
    if not enabled() or jaxpr.effects or len(jaxpr.eqns) < MIN_EQUATIONS:
        return closed
    inputs = [*jaxpr.constvars, *jaxpr.invars]
    known = set(inputs)
    computed = list(dict.fromkeys(
        v for v in jaxpr.outvars if isinstance(v, Var) and v not in known))
    if not computed:
        return closed
    body = ClosedJaxpr(Jaxpr(constvars=[], invars=inputs, outvars=computed, eqns=jaxpr.eqns), [])
    params = {"call_jaxpr": body}
    try:
        draft = loop_source(program_p, params, [v.aval for v in inputs],
                            [v.aval for v in computed], "probe")
    except Unsupported as why:
        loop_rules.log.debug("juju: the program stays a MAX graph: %s", why)
        return closed
    except Exception as exc:  # a generator bug must never break a program
        loop_rules.log.warning("juju: the Mojo program generator failed (%s: %s); the program "
                               "stays a MAX graph. Please report it.", type(exc).__name__, exc)
        return closed
    if not loop_rules.within_limits(draft):
        return closed
    eqn = jex_core.new_jaxpr_eqn(inputs, computed, program_p, params, jex_core.no_effects,
                                 jaxpr.eqns[0].source_info)
    return ClosedJaxpr(jaxpr.replace(eqns=[eqn]), closed.consts)


rewrite.__qualname__ = "juju_kernels_mojo.program_kernels"
