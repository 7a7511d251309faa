"""The interpreter: one loop that lowers a Jaxpr to MAX values, rule by rule.

Higher-order rules (calls, control flow) re-enter this loop through
`ctx.lower`. The only other walk over equations is `find_missing_rules`, a
pre-pass that reports every gap at once before any graph is built.
`juju.explain` records what the loop selects (juju/explain.py).
"""

from __future__ import annotations

from functools import partial

import jax
import numpy as np
from max.graph import BufferType, DeviceRef, Graph, TensorType, ops

from juju import dtypes
from juju._compat import (
    ClosedJaxpr,
    Literal,
    equation_text,
    is_key_dtype,
    source_line,
    sub_jaxprs_of_params,
)
from juju.context import LoweringContext, constant, graph_inputs
from juju.errors import (InvalidProgramError, LoweringError, MissingRule, MissingRuleError,
                          RuleConflictError)
from juju.recording import active_recorder
from juju.registry import Registry


def lower_jaxpr(
    jaxpr, *args, consts=None, registry: Registry, device: DeviceRef, libraries=None
) -> list:
    """Lower `jaxpr` (open or closed) applied to MAX values `args`.

    `libraries`: the kernel libraries loaded in the graph (None: all).
    """
    if isinstance(jaxpr, ClosedJaxpr):
        jaxpr, consts = jaxpr.jaxpr, jaxpr.consts
    consts = consts or ()
    if len(args) != len(jaxpr.invars) or len(consts) != len(jaxpr.constvars):
        raise ValueError(
            f"jaxpr takes {len(jaxpr.invars)} args and {len(jaxpr.constvars)} consts, "
            f"got {len(args)} and {len(consts)}"
        )
    env: dict = {}

    def read(atom):
        if isinstance(atom, Literal):
            if is_key_dtype(atom.aval.dtype):
                return constant(np.asarray(jax.random.key_data(atom.val)), device)
            return constant(np.asarray(atom.val, dtype=atom.aval.dtype), device)
        return env[atom]

    for var, value in zip(jaxpr.constvars, consts):
        if not _is_max_value(value):
            if is_key_dtype(var.aval.dtype):  # a key array closed over
                value = jax.random.key_data(value)
            value = constant(np.asarray(value), device)
        env[var] = value
    env.update(zip(jaxpr.invars, args))
    lower = partial(lower_jaxpr, registry=registry, device=device, libraries=libraries)
    recorder = active_recorder()  # None unless juju.explain is running

    for index, eqn in enumerate(jaxpr.eqns):
        if _only_empty_results(eqn):
            env.update((v, _empty(v.aval, device)) for v in eqn.outvars)
            continue
        ctx = LoweringContext(
            eqn=eqn,
            avals_in=tuple(v.aval for v in eqn.invars),
            avals_out=tuple(v.aval for v in eqn.outvars),
            device=device,
            lower=lower,
        )
        rule = _select(registry, ctx, libraries)
        if rule is None:
            raise _missing_error([eqn], registry)
        if recorder is not None:
            ctx = recorder.record(ctx, index, rule)
        try:
            result = rule.fn(ctx, *map(read, eqn.invars), **eqn.params)
        except LoweringError as inner:
            # Already names the innermost failing equation; add where it sits.
            inner.add_note(f"  inside '{eqn.primitive.name}' at {source_line(eqn)}")
            raise
        except (MissingRuleError, InvalidProgramError):
            raise
        except Exception as exc:
            raise LoweringError.at(eqn, rule, f"{type(exc).__name__}: {exc}") from exc
        outs = _as_outputs(ctx, rule, result)
        _check_outputs(ctx, rule, outs)
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


def _only_empty_results(eqn) -> bool:
    """Whether every result of a pure equation has no elements: nothing to
    compute (and MAX fails to compile some ops with empty results, e.g. a
    sum of a (2, 5, 1, 0) array over axis 0)."""
    if not eqn.outvars or eqn.effects:
        return False
    shapes = [getattr(v.aval, "shape", None) for v in eqn.outvars]
    return all(shape is not None and all(isinstance(d, int) for d in shape) and 0 in shape
               for shape in shapes)


def _empty(aval, device):
    physical = dtypes.physical_aval(aval)
    return constant(np.zeros(physical.shape, physical.dtype), device)


def _is_max_value(value) -> bool:
    return hasattr(value, "type") and hasattr(value, "dtype") and not isinstance(value, np.ndarray)


def _select(registry: Registry, ctx, libraries=None):
    """The rule for `ctx`'s equation; a rule conflict names the equation."""
    try:
        return registry.select(ctx, libraries)
    except RuleConflictError as exc:
        eqn = ctx.eqn
        exc.add_note(
            f"  needed by '{eqn.primitive.name}' at {source_line(eqn)}: {equation_text(eqn)}"
        )
        raise


def _as_outputs(ctx, rule, result) -> list:
    """A rule's result as a list of values, one per equation output."""
    if not ctx.eqn.primitive.multiple_results:
        return [result]
    if result is None or isinstance(result, (str, bytes)) or not hasattr(result, "__iter__"):
        raise LoweringError.at(
            ctx.eqn, rule, f"rule returned {_what(result)}; a rule for a primitive with "
            "multiple results returns a list of MAX values"
        )
    return list(result)


def _what(value) -> str:
    if value is None:
        return "None (does the rule end without `return`?)"
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def _check_outputs(ctx, rule, outs) -> None:
    """A rule that returns the wrong shape or dtype fails at its own equation."""
    for i, value in enumerate(outs):
        if value is None or not (hasattr(value, "shape") and hasattr(value, "dtype")):
            raise LoweringError.at(
                ctx.eqn, rule, f"output {i} is {_what(value)}, not a MAX value"
            )
    if len(outs) != len(ctx.avals_out):
        raise LoweringError.at(
            ctx.eqn, rule, f"rule returned {len(outs)} values, expected {len(ctx.avals_out)}"
        )
    for i, (value, aval) in enumerate(zip(outs, ctx.avals_out)):
        aval = dtypes.physical_aval(aval)
        shape = dtypes.static_shape(value.shape)
        shape = tuple(aval.shape) if shape is None else tuple(shape)  # symbolic: MAX checks
        expected_dtype = dtypes.max_dtype(aval.dtype)
        if shape != tuple(aval.shape) or value.dtype != expected_dtype:
            raise LoweringError.at(
                ctx.eqn,
                rule,
                f"output {i} is {value.dtype}{list(shape)} but the equation expects "
                f"{expected_dtype}{list(aval.shape)}",
            )


# --- the pre-pass -----------------------------------------------------------


def find_missing_rules(jaxpr, registry: Registry, device: DeviceRef) -> tuple[list, set]:
    """All equations (sub-jaxprs and `lower_fun` decompositions included)
    without a rule, and the kernel libraries the selected rules require."""
    missing, required = [], set()

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            ctx = LoweringContext(
                eqn,
                tuple(v.aval for v in eqn.invars),
                tuple(v.aval for v in eqn.outvars),
                device,
                None,
            )
            rule = _select(registry, ctx)
            if rule is None:
                missing.append(eqn)
                continue
            required.update(rule.requires)
            for sub in sub_jaxprs_of_params(eqn.params):
                visit(sub)
            decomposition = getattr(rule.fn, "decomposition", None)
            if decomposition is not None:
                try:
                    inner = decomposition(ctx)
                except Exception:  # lowering will report it, at this equation
                    continue
                visit(inner.jaxpr)

    visit(jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr)
    return missing, required


def _missing_error(eqns, registry: Registry) -> MissingRuleError:
    packs = [f"{p.name} {p.version}" for p in registry.packs if p.loaded]
    return MissingRuleError(
        [
            MissingRule(
                primitive=e.primitive.name,
                equation=equation_text(e),
                source=source_line(e),
                hint=_hint(e, registry),
            )
            for e in eqns
        ],
        packs,
    )


def _hint(eqn, registry: Registry) -> str:
    from juju._hints import provider_hint
    from juju.fallback import why_not

    refused = _refused_by_dtype(eqn, registry)
    hint = refused or provider_hint(eqn.primitive.name, registry)
    why = why_not(eqn) if registry.catch_all() else None
    return f"{hint}; no fallback: {why}" if why else hint


def _refused_by_dtype(eqn, registry: Registry) -> str | None:
    """Why the primitive's own rules were passed over, when it is a dtype."""
    avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
    refused = [r for r in registry.rules_for(eqn.primitive) if not r.accepts(avals)]
    if not refused:
        return None
    dtypes = sorted({str(a.dtype) for a in avals if hasattr(a, "dtype")})
    return (
        f"{', '.join(r.describe() for r in refused)} did not declare "
        f"{'/'.join(dtypes)} (a rule opts in with `dtypes=`: docs/writing-a-pack.md)"
    )


def check_rules(closed_jaxpr, registry: Registry, device: DeviceRef) -> set[str]:
    """Raise one MissingRuleError listing every gap; return required libraries."""
    missing, required = find_missing_rules(closed_jaxpr, registry, device)
    if missing:
        raise _missing_error(missing, registry)
    return required


# --- graphs -----------------------------------------------------------------


def build_graph(
    closed_jaxpr,
    *,
    name: str,
    registry: Registry,
    device: DeviceRef,
    kernel_paths=(),
    libraries=None,
    module=None,
    input_shapes=None,
    const_inputs=(),
    aliases=(),
) -> Graph:
    """A MAX graph computing `closed_jaxpr` (whose rules were checked).

    `input_shapes` may replace the static input shapes by symbolic ones;
    `libraries` names the kernel libraries behind `kernel_paths`;
    `const_inputs` are the indices of consts the graph takes as inputs after
    the arguments (weights, for `juju.export`) instead of embedding them;
    `aliases` are (argument, result) pairs of donated arguments
    (`juju.donation`): such an argument is a mutable buffer that the graph
    reads first and stores the result into, and the result is no output.
    """
    jaxpr = closed_jaxpr.jaxpr
    in_avals = [dtypes.physical_aval(v.aval) for v in jaxpr.invars]
    shapes = input_shapes or [dtypes.max_shape(a.shape) for a in in_avals]
    weight_avals = [dtypes.physical_aval(jaxpr.constvars[i].aval) for i in const_inputs]
    stored = dict(aliases)  # argument -> the result stored into it
    input_types = [
        (BufferType if i in stored else TensorType)(dtypes.max_dtype(a.dtype), shape,
                                                    device=device)
        for i, (a, shape) in enumerate(zip(
            in_avals + weight_avals,
            list(shapes) + [dtypes.max_shape(a.shape) for a in weight_avals]))
    ]
    graph = Graph(
        name,
        input_types=input_types,
        custom_extensions=list(kernel_paths),
        **({"module": module} if module is not None else {}),
    )
    with graph:
        inputs = [ops.buffer_load(value.buffer) if i in stored else value.tensor
                  for i, value in enumerate(graph.inputs)]
        args, weights = inputs[:len(in_avals)], inputs[len(in_avals):]
        consts = list(closed_jaxpr.consts)
        for i, weight in zip(const_inputs, weights):
            consts[i] = weight
        with graph_inputs(inputs):
            outs = lower_jaxpr(
                jaxpr, *args, consts=consts, registry=registry, device=device,
                libraries=libraries,
            )
        for i, k in stored.items():
            ops.buffer_store(graph.inputs[i].buffer, outs[k])
        graph.output(*[o for k, o in enumerate(outs) if k not in stored.values()])
    return graph
