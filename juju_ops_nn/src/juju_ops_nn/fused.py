"""Fused lowerings onto MAX's NN ops: softmax, log_softmax, gelu (exact and
tanh), silu, relu, layer norm and RMS norm.

Two mechanisms, both at `Priority.FUSED` and both falling back to the
primitive rules when the guard declines:

- functions JAX keeps as named calls (`jit[name=silu]`, `custom_jvp_call`
  around `jit[name=relu]`): a guarded rule on the call primitive;
- patterns JAX inlines (softmax, gelu, norms, the softmax inside
  `jax.nn.dot_product_attention`): the `juju_jaxpr_rewrites` pass of
  `patterns.py` turns each match into one `nn_fused[name=...]` equation, lowered
  by the rule for its name, or else by lowering the original equations.
"""

from __future__ import annotations

import numpy as np
from max.dtype import DType
from max.graph import ops

from juju import Priority, RuleSet
from juju import primitives as P
from juju._compat import open_jaxpr
from juju.dtypes import is_float
from juju.patterns import Any, Lit, Op, Opt, X, is_number, near, positive
from juju_ops_lax.elementwise import maximum
from juju_ops_lax import mixed
from juju_ops_nn.patterns import Pattern, nn_fused_p, rewrite_closed_jaxpr

rules = RuleSet()


# --- patterns ------------------------------------------------------------------

def _bcast(p):
    return Op("broadcast_in_dim", p)


def _pow(n):
    return lambda eqn: eqn.params.get("y") == n


def _is_neg_inf(v):
    try:
        return float(v) == float("-inf")
    except (TypeError, ValueError):
        return False


def _number(v):
    try:
        return float(v) > 0
    except (TypeError, ValueError):
        return False


_MAX = Op("reduce_max", X("x"), name="rmax")
_SHIFT = Op("sub", X("x"), Opt("stop_gradient", _bcast(Opt("stop_gradient", Any(
    Op("max", Lit(_is_neg_inf), _MAX), _MAX)))), name="shift")
_EXP = Op("exp", _SHIFT)

# float16/bfloat16: jax.nn.softmax sums the exponentials in float32.
def _to_float(eqn):
    return is_float(eqn.params["new_dtype"])


def _float_convert(p):
    return Any(Op("convert_element_type", p, where=_to_float), p)


def _sum_of(p):
    return _float_convert(_bcast(Op("reduce_sum", _float_convert(p), name="rsum")))


SOFTMAX = Op("div", _EXP, _sum_of(_EXP))

# jax.nn.dot_product_attention transposes the scores between the max and the
# subtraction: softmax(transpose(x)).
_SHIFT_T = Op("sub", Op("transpose", X("x"), name="tx"), Opt("stop_gradient", _bcast(Opt(
    "stop_gradient", Op("transpose", Any(Op("max", Lit(_is_neg_inf), _MAX), _MAX))))))
_EXP_T = Op("exp", _SHIFT_T)
SOFTMAX_T = Op("div", _EXP_T, _sum_of(_EXP_T))
LOG_SOFTMAX = Op("sub", _SHIFT, Op("log", _bcast(Op("reduce_sum", _EXP, name="rsum"))))

GELU_TANH = Op("mul", X("x"), Op("mul", Lit(near(0.5)), Op("add", Lit(near(1.0)), Op("tanh", Op(
    "mul", Lit(near(0.7978845608)),
    Op("add", X("x"), Op("mul", Lit(near(0.044715)), Op("integer_pow", X("x"), where=_pow(3)))))))))
GELU_EXACT = Op("mul", Op("mul", Lit(near(0.5)), X("x")),
                Op("erfc", Op("mul", Op("neg", X("x")), Lit(near(0.7071067811865476)))))

_MEAN = Op("div", _bcast(Op("reduce_sum", X("x"), name="rmean")), Lit(_number, "n1"))
_CENT = Op("sub", X("x"), _MEAN)
_VAR = Op("div", _bcast(Op("reduce_sum", Any(
    Op("integer_pow", _CENT, where=_pow(2)), Op("square", _CENT), Op("mul", _CENT, _CENT)),
    name="rvar")), Lit(_number, "n2"))
_VAR_EPS = Op("add", _VAR, Lit(positive, "eps"))
_NORM = Any(Op("mul", _CENT, Op("rsqrt", _VAR_EPS)), Op("div", _CENT, Op("sqrt", _VAR_EPS)))
LAYER_NORM_AFFINE = Op("add", Op("mul", _NORM, Opt("broadcast_in_dim", X("gamma"))),
                       Opt("broadcast_in_dim", X("beta")))
LAYER_NORM_SCALE = Op("mul", _NORM, Opt("broadcast_in_dim", X("gamma")))

# jnp.var(x, axis, keepdims=True) stays a call: jit[name=_var](x, ddof=0).
def _is_var_call(eqn):
    return eqn.params.get("name") == "_var" and len(eqn.invars) == 2


_VAR_CALL = Op("jit", X("x"), Lit(lambda v: is_number(v) and float(v) == 0),
               name="rvar", where=_is_var_call)
# equinox's LayerNorm clamps the variance: jnp.maximum(0.0, variance), a no-op.
_VAR_CALL_EPS = Op("add", Any(Op("max", _VAR_CALL, Lit(lambda v: is_number(v) and float(v) == 0)),
                              _VAR_CALL), Lit(positive, "eps"))
_NORM_V = Any(Op("mul", _CENT, Op("rsqrt", _VAR_CALL_EPS)),
              Op("div", _CENT, Op("sqrt", _VAR_CALL_EPS)))
LAYER_NORM_V_AFFINE = Op("add", Op("mul", _NORM_V, Opt("broadcast_in_dim", X("gamma"))),
                         Opt("broadcast_in_dim", X("beta")))
LAYER_NORM_V_SCALE = Op("mul", _NORM_V, Opt("broadcast_in_dim", X("gamma")))

_MEAN_SQ = Op("div", _bcast(Op("reduce_sum", Any(
    Op("mul", X("x"), X("x")), Op("integer_pow", X("x"), where=_pow(2)), Op("square", X("x"))),
    name="rms")), Lit(_number, "n"))
_RMS_EPS = Op("add", _MEAN_SQ, Lit(positive, "eps"))
_RMS = Any(Op("mul", X("x"), Op("rsqrt", _RMS_EPS)), Op("div", X("x"), Op("sqrt", _RMS_EPS)))
RMS_NORM_SCALE = Op("mul", _RMS, Opt("broadcast_in_dim", X("w")))


def _axes(eqn):
    """A reduction's axes; for a jnp.var call, those of its sums."""
    if eqn.primitive.name != "jit":
        return tuple(int(a) for a in eqn.params["axes"])
    sums = {tuple(int(a) for a in e.params["axes"])
            for e in open_jaxpr(eqn.params["jaxpr"]).eqns if e.primitive.name == "reduce_sum"}
    return sums.pop() if len(sums) == 1 else None


def _single_axis(*eqns):
    axes = {_axes(e) for e in eqns}
    if len(axes) != 1 or None in axes:
        return None
    (axis,) = axes
    return axis[0] if len(axis) == 1 else None


def _softmax_attrs(m, matcher):
    axis = _single_axis(m.binds["rmax"], m.binds["rsum"])
    return None if axis is None else {"axis": axis}


def _softmax_t_attrs(m, matcher):
    """softmax over axis j of transpose(x, perm): max over x's axis perm[j]."""
    a = _single_axis(m.binds["rmax"])
    j = _single_axis(m.binds["rsum"])
    perm = tuple(int(p) for p in m.binds["tx"].params["permutation"])
    if a is None or j is None or perm[j] != a:
        return None
    return {"axis": j, "perm": perm}


def _gelu_attrs(approximate):
    return lambda m, matcher: {"approximate": approximate}


def _last_axis_size(x, axis_eqn):
    """The normalised axis's size if it is the single last axis, else None."""
    axis = _single_axis(axis_eqn)
    ndim = len(x.aval.shape)
    return x.aval.shape[-1] if axis == ndim - 1 else None


def _norm_attrs(sum_names, count_names, params=("gamma", "beta")):
    def attrs(m, matcher):
        x = m.binds["x"]
        sizes = {_last_axis_size(x, m.binds[n]) for n in sum_names}
        if len(sizes) != 1 or None in sizes:
            return None
        (d,) = sizes
        if any(round(m.binds[n]) != d for n in count_names):
            return None
        for name in params:
            if name in m.binds:
                aval = m.binds[name].aval
                if tuple(aval.shape) != (d,) or aval.dtype != x.aval.dtype:
                    return None
        return {"epsilon": m.binds["eps"]}

    return attrs


def _var_norm_attrs(params):
    base = _norm_attrs(("rmean", "rvar"), ("n1",), params)

    def attrs(m, matcher):
        var_out = m.binds["rvar"].outvars[0].aval
        if var_out.dtype != m.binds["x"].aval.dtype:  # an upcast variance
            return None
        return base(m, matcher)

    return attrs


PATTERNS = [
    Pattern("layer_norm", LAYER_NORM_V_AFFINE, ("x", "gamma", "beta"),
            _var_norm_attrs(("gamma", "beta"))),
    Pattern("layer_norm", LAYER_NORM_V_SCALE, ("x", "gamma"), _var_norm_attrs(("gamma",))),
    Pattern("layer_norm", _NORM_V, ("x",), _var_norm_attrs(())),
    Pattern("layer_norm", LAYER_NORM_AFFINE, ("x", "gamma", "beta"),
            _norm_attrs(("rmean", "rvar"), ("n1", "n2"))),
    Pattern("layer_norm", LAYER_NORM_SCALE, ("x", "gamma"),
            _norm_attrs(("rmean", "rvar"), ("n1", "n2"))),
    Pattern("layer_norm", _NORM, ("x",), _norm_attrs(("rmean", "rvar"), ("n1", "n2"))),
    Pattern("rms_norm", RMS_NORM_SCALE, ("x", "w"), _norm_attrs(("rms",), ("n",), ("w",))),
    Pattern("rms_norm", _RMS, ("x",), _norm_attrs(("rms",), ("n",), ("w",))),
    Pattern("log_softmax", LOG_SOFTMAX, ("x",), _softmax_attrs),
    Pattern("softmax", SOFTMAX, ("x",), _softmax_attrs),
    Pattern("softmax", SOFTMAX_T, ("x",), _softmax_t_attrs),
    Pattern("gelu", GELU_TANH, ("x",), _gelu_attrs("tanh")),
    Pattern("gelu", GELU_EXACT, ("x",), _gelu_attrs("none")),
]

rewrite = rewrite_closed_jaxpr(PATTERNS)


# --- rules for nn_fused ----------------------------------------------------------

@rules.register(nn_fused_p)
def lower_nn_fused(ctx, *args, name, attrs, call_jaxpr):
    # The fallback: the original equations, through the primitive rules.
    return ctx.lower(call_jaxpr, *args)


def _named(*names):
    def guard(ctx):
        return ctx.params["name"] in names and is_float(ctx.avals_in[0].dtype)

    guard.__qualname__ = f"name in {names}"
    return guard


def along_axis(op, x, axis, rank):
    """op over the last axis, for any axis (by permuting it last and back)."""
    if axis in (-1, rank - 1):
        return op(x)
    perm = [d for d in range(rank) if d != axis] + [axis]
    back = [perm.index(d) for d in range(rank)]
    return ops.permute(op(ops.permute(x, perm)), back)


def nan_rows(op):
    """op over the last axis, but NaN for a whole row that jax.nn's softmax
    and log_softmax make NaN: a row holding a NaN or +inf, or only -inf
    (x - max(x) is NaN there). MAX's kernels assume no NaN and give NaN only
    where the input has one. The row's max cannot tell an all -inf row: MAX's
    float max reduction starts from the lowest finite value. So each element
    gets a flag, 2 for NaN or +inf, 0 for -inf, 1 otherwise, and a row is
    bad unless its largest flag is 1."""

    def safe(v):
        def const(value, dtype=DType.int32):
            return ops.constant(value, dtype, device=v.device)

        infinite = ops.is_inf(v)
        negative = mixed.greater(const(0, v.dtype), v)
        flag = mixed.where(ops.logical_or(ops.is_nan(v), ops.logical_and(
            infinite, ops.logical_not(negative))), const(2),
            mixed.where(infinite, const(0), const(1)))
        bad = mixed.not_equal(ops.max(flag, axis=-1), const(1))
        return mixed.where(bad, const(float("nan"), v.dtype), op(v))

    safe.__name__ = getattr(op, "__name__", "op")
    return safe


@rules.register(nn_fused_p, priority=Priority.FUSED, guard=_named("softmax", "log_softmax"))
def lower_nn_fused_softmax(ctx, x, *, name, attrs, call_jaxpr):
    attrs = dict(attrs)
    if "perm" in attrs:
        x = ops.permute(x, list(attrs["perm"]))
    op = ops.softmax if name == "softmax" else ops.logsoftmax
    return [along_axis(nan_rows(op), x, attrs["axis"], len(ctx.avals_in[0].shape))]


@rules.register(nn_fused_p, priority=Priority.FUSED, guard=_named("gelu"))
def lower_nn_fused_gelu(ctx, x, *, name, attrs, call_jaxpr):
    return [ops.gelu(x, approximate=dict(attrs)["approximate"])]


@rules.register(nn_fused_p, priority=Priority.FUSED, guard=_named("layer_norm"))
def lower_nn_fused_layer_norm(ctx, x, *affine, name, attrs, call_jaxpr):
    aval = ctx.avals_in[0]
    d = aval.shape[-1]
    gamma = affine[0] if len(affine) > 0 else ctx.constant(np.ones(d), aval.dtype)
    beta = affine[1] if len(affine) > 1 else ctx.constant(np.zeros(d), aval.dtype)
    return [ops.layer_norm(x, gamma, beta, epsilon=dict(attrs)["epsilon"])]


@rules.register(nn_fused_p, priority=Priority.FUSED, guard=_named("rms_norm"))
def lower_nn_fused_rms_norm(ctx, x, *weight, name, attrs, call_jaxpr):
    aval = ctx.avals_in[0]
    w = weight[0] if weight else ctx.constant(np.ones(aval.shape[-1]), aval.dtype)
    return [ops.rms_norm(x, w, epsilon=dict(attrs)["epsilon"])]


# --- named calls -------------------------------------------------------------------

def _unary_call(ctx) -> bool:
    return (len(ctx.avals_in) == 1 and len(ctx.avals_out) == 1
            and is_float(ctx.avals_in[0].dtype))


def _relu(x):
    # XLA's max(x, 0): NaN stays NaN and -0.0 becomes +0.0. MAX's relu
    # drops NaN (its kernels assume none) and keeps -0.0 in some lanes.
    return maximum(x, ops.constant(0, x.dtype, device=x.device))


def _silu(x):
    return mixed.where(ops.is_nan(x), x, ops.silu(x))


_NAMED_UNARY = {"silu": _silu, "relu": _relu}


def _jit_named_unary(ctx) -> bool:
    return ctx.params["name"] in _NAMED_UNARY and _unary_call(ctx)


@rules.register(P.jit_p, priority=Priority.FUSED, guard=_jit_named_unary)
def lower_jit_named_unary(ctx, x, *, jaxpr, name, inline, keep_unused, donated_invars,
                          in_shardings, out_shardings, in_layouts, out_layouts, ctx_mesh,
                          compiler_options_kvs):
    # jit[name=silu] / jit[name=relu] with one input and output: the forward
    # function (under jax.grad JAX splits it into calls with more outputs).
    # Shardings, layouts and donation are placement on one device (see core).
    return [_NAMED_UNARY[name](x)]


def _is_relu_call(ctx) -> bool:
    inner = open_jaxpr(ctx.params["call_jaxpr"]).eqns
    return (_unary_call(ctx) and len(inner) == 1 and inner[0].primitive.name == "jit"
            and inner[0].params.get("name") == "relu")


@rules.register(P.custom_jvp_call_p, priority=Priority.FUSED, guard=_is_relu_call)
def lower_custom_jvp_call_relu(ctx, x, *, call_jaxpr, jvp_jaxpr_fun, num_consts,
                               symbolic_zeros):
    # The custom derivative only matters to jax.grad, which ran before us.
    return [_relu(x)]
