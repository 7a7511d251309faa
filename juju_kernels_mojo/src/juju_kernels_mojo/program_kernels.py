"""`mojo_program`: a program, or a run of its equations, as one generated
Mojo kernel on the CPU (`placement` decides where they go).

MAX runs every op of a graph through its runtime, ~1-3 us each on the CPU
whatever its size: an optax Adam step on a 8x4 regression (162 equations)
took 160 us to execute, against jax.jit's whole call of 81 us. Where
`placement` replaces a program (or a run of its equations) by one
`mojo_program` equation, `loop_rules` writes it as one kernel, as it does a
loop body: the graph is then one custom op, or no graph at all
(`native_programs`). On a GPU, or where the kernel fails to build,
`mojo_program`'s own rule lowers its equations one by one through the
interpreter, as before the rewrite.
"""

from __future__ import annotations

import os

import juju
from juju import primitives as P
from juju._compat import JaxPrimitive, open_jaxpr, sub_jaxprs_of_params
from juju_kernels_mojo import codegen, loop_rules
from juju_kernels_mojo.codegen import control_flow

#: A program kernel runs once a call, where MAX runs each of the program's
#: ops with ~1-3 us of dispatch. Kernels were single-threaded scalar loops,
#: so a program was one kernel only up to 2^21 element operations
#: (WORK_PER_EQUATION beyond that): at users' sizes (batch 128, width 256)
#: every program went whole to MAX ops, whose compile took 218 s (optax's
#: adam, 256x512) and 367 s (an equinox MLP's value_and_grad) on the 2-core
#: machine, against 16-19 s for the Mojo build of the same program as one
#: kernel. Kernels now run large loops on the cores, in SIMD vectors, with
#: broadcasts read in place and products on the BLAS: at those sizes one
#: kernel measured 0.8-1.3x jax.jit (a transformer block's gradient 0.81,
#: softmax 4096^2 1.15, a CNN step 1.29, a 16M-element chain 1.08), some
#: 1.8-3x (adam 1.8, a GRU scan 2.3, a conv1d encoder 3.2), where MAX ops
#: gave 1.25-1.7 after minutes of compile. So a program is one kernel up to
#: 2^28 element operations: beyond it (a CIFAR convnet's step, 2.8e9;
#: attention over 1024 tokens, 1.7e9) MAX's tuned convolutions and fused
#: ops win back their compile time.
PROGRAM_MAX_WORK = 1 << 28
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
    return op_count(jaxpr.eqns)


def op_count(eqns) -> int:
    """`eqns`, with the equations of the jaxprs they call (not loop bodies)."""
    return sum(1 + sum(_equation_count(open_jaxpr(sub)) for sub in sub_jaxprs_of_params(e.params)
                       if e.primitive not in (P.while_p, P.scan_p))
               for e in eqns)


loop_rules.WORK_LIMITS[program_p] = lambda params: work_limit(params["call_jaxpr"])

# The generator writes a program as it writes the body of a call.
codegen.EQUATIONS[program_p] = control_flow.call

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
