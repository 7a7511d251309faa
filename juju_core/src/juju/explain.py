"""`juju.explain`: which rule of which pack lowered each equation of a program.

    >>> for choice in juju.explain(f, jax.ShapeDtypeStruct((3, 4), jnp.float32)):
    ...     print(choice.path, choice.primitive, choice.rule, choice.pack)
    0 sin direct(sin) lax
    1 while lower_while lax
    1/cond/0 lt direct(less) lax
    ...
    >>> juju.explain(f, ...).notes
    ('juju-kernels-mojo: one generated kernel (runs natively, without MAX)',)

It builds the MAX graph (cheap) and never compiles it; the interpreter
records its choices (`juju.recording`) meanwhile. `python -m juju explain`
prints the same as a table (`juju.recording.table`).
"""

from __future__ import annotations

from juju._compat import api_boundary
from juju.jit import JitFunction, jit
from juju.recording import Explanation

__all__ = ["explain"]


@api_boundary
def explain(fun, *args, **kwargs) -> Explanation:
    """Which rule of which pack lowers each equation of `fun(*args, **kwargs)`.

    `fun` is a function or a `juju.jit` function (whose static arguments and
    engine are used); `args` and `kwargs` are arrays or `jax.ShapeDtypeStruct`s,
    as for `juju.jit(fun).lower`. Returns an `Explanation`: a list of one
    `RuleChoice` per equation, sub-jaxprs included, in program order (an
    equation before those inside it), whose `notes` say how the packs placed
    the program: on the CPU, juju-kernels-mojo says whether it is one
    generated kernel or how many kernels and MAX ops, and names every
    equation its generator refused, with the reason (a primitive it does not
    write, or a limit and its numbers). It traces,
    checks the rules and builds the MAX graph, but compiles nothing; an
    equation without a rule raises `MissingRuleError`, as lowering does.
    `juju.jit(fun).lower(*args).explain()` gives the same.
    """
    fn = fun if isinstance(fun, JitFunction) else jit(fun)
    return fn.lowered_for(args, kwargs).explain()
