"""The one place where juju touches JAX beyond its stable public API.

Everything here uses `jax.extend`/`jax.core` where possible; the few private
imports are isolated so that a JAX upgrade breaks exactly one module.
"""

from __future__ import annotations

import contextlib
import os
import traceback

import numpy as np
import jax
from jax.core import ShapedArray, Tracer  # noqa: F401  (re-exported)
from jax.extend import core as jex_core
from jax.extend import source_info_util

ClosedJaxpr = jex_core.ClosedJaxpr
Jaxpr = jex_core.Jaxpr
JaxprEqn = jex_core.JaxprEqn
Literal = jex_core.Literal
Var = jex_core.Var
JaxPrimitive = jex_core.Primitive
primitives = jex_core.primitives

# The call primitives (a sub-jaxpr applied to arguments): `call` and
# `closed_call` up to jax 0.10; from 0.11 both names alias one primitive,
# `eval_jaxpr`.
call_primitives = tuple(dict.fromkeys([primitives.closed_call_p, primitives.call_p]))

# Not exported by jax.extend (JAX 0.10); only needed as a registry key.
from jax._src.lax.lax import (  # noqa: E402
    optimization_barrier_p, split_p, stack_p, tile_p, unstack_p,
)
from jax._src.export.shape_poly import dim_as_value_p  # noqa: E402,F401  (symbolic shapes)


def source_line(eqn) -> str:
    """The user's source line for an equation, e.g. 'model.py:12:4 (loss)'."""
    try:
        return source_info_util.summarize(eqn.source_info)
    except Exception:  # source info is best effort; never mask the real error
        return "<unknown source>"


def equation_text(eqn, limit: int = 300) -> str:
    """A one-line rendering of an equation, shortened for error messages."""
    text = " ".join(str(eqn).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sub_jaxprs_of_params(params) -> list:
    """Jaxprs (open) held in an equation's params: call bodies, branches, loops."""
    return list(jex_core.jaxprs_in_params(params))


def python_scalar_dtype(value) -> np.dtype:
    """The dtype `jax.jit` gives a Python scalar (weakly typed), honouring x64."""
    if isinstance(value, bool):
        return np.dtype(np.bool_)
    if isinstance(value, int):
        return jax.dtypes.canonicalize_dtype(np.int64)
    if isinstance(value, float):
        return jax.dtypes.canonicalize_dtype(np.float64)
    if isinstance(value, complex):
        return jax.dtypes.canonicalize_dtype(np.complex128)
    raise TypeError(f"not a Python scalar: {type(value).__name__}")


_TRACED_PARAMS: dict = {}


def _traced_params(key, make) -> dict:
    """The params of the one equation jax traces `make(np.float32(0))` to,
    once per `key`: what this jax release gives the equations a rewrite
    writes (their names and defaults vary between releases)."""
    if key not in _TRACED_PARAMS:
        _TRACED_PARAMS[key] = dict(jax.make_jaxpr(make)(np.float32(0)).jaxpr.eqns[0].params)
    return dict(_TRACED_PARAMS[key])


def arithmetic_params(primitive) -> dict:
    """The params jax gives an equation of `primitive` (mul, div, ...) that
    a rewrite writes: jax 0.10's mul has `out_dtype`, other releases not."""
    from jax import lax

    fns = {"mul": lax.mul, "div": lax.div, "add": lax.add, "sub": lax.sub}
    return _traced_params(primitive, lambda x: fns[primitive.name](x, x))


def reshape_params(new_sizes) -> dict:
    """The params jax gives a `reshape` to `new_sizes` that a rewrite writes."""
    return {**_traced_params("reshape", lambda x: jax.lax.reshape(x, (1,))),
            "new_sizes": tuple(new_sizes)}


def broadcast_params(shape, broadcast_dimensions=()) -> dict:
    """The params jax gives a `broadcast_in_dim` that a rewrite writes."""
    make = lambda x: jax.lax.broadcast_in_dim(x, (1,), ())  # noqa: E731
    return {**_traced_params("broadcast_in_dim", make), "shape": tuple(shape),
            "broadcast_dimensions": tuple(broadcast_dimensions)}


def canonical_dtype(dtype) -> np.dtype:
    """The dtype jax.jit computes in for an input of `dtype` (x64 aware)."""
    return jax.dtypes.canonicalize_dtype(dtype)


def is_tracer(value) -> bool:
    return isinstance(value, Tracer)


def register_transformation_rules(primitive, *, jvp=None, transpose=None, batching=None,
                                  xla_implementation=None, multiple_results=False):
    """Attach JAX transformation rules (and an XLA lowering) to a primitive."""
    from jax.interpreters import ad, batching as batching_mod, mlir

    if jvp is not None:
        ad.primitive_jvps[primitive] = jvp
    if transpose is not None:
        ad.primitive_transposes[primitive] = transpose
    if batching is not None:
        batching_mod.primitive_batchers[primitive] = batching
    if xla_implementation is not None:
        mlir.register_lowering(
            primitive, mlir.lower_fun(xla_implementation, multiple_results=multiple_results)
        )


# --- control flow and juju_call (issue 4) --------------------------------------

# Emitted by the differentiation of `cond` (a placeholder residual).
from jax._src.lax.lax import empty2_p  # noqa: E402

# juju_call (juju/call.py): the pieces of JAX's AD and partial evaluation it
# reuses, as JAX's own `jit` does for its primitive.
from jax._src.core import jaxpr_as_fun  # noqa: E402
from jax._src.interpreters.ad import (  # noqa: E402
    Zero as ad_Zero,
    is_undefined_primal,
    jvp_jaxpr as ad_jvp_jaxpr,
)
from jax._src.interpreters.partial_eval import (  # noqa: E402
    convert_constvars_jaxpr,
    partial_eval_jaxpr_nounits,
)


# --- PRNG key arrays and JAX's own decompositions (issue 3) --------------------

# A key array (dtype key<impl>) has a physical representation: its raw key
# data, e.g. uint32[..., 2] for threefry. Inside a graph juju carries keys in
# that form, as XLA does.
from jax._src.core import physical_aval as _physical_aval  # noqa: E402


def is_key_dtype(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def key_data_aval(aval):
    """`aval` itself, or for a key array the aval of its raw key data."""
    return _physical_aval(aval) if is_key_dtype(aval.dtype) else aval


def is_complex_dtype(dtype) -> bool:
    return jax.dtypes.issubdtype(dtype, np.complexfloating)


def physical_aval(aval):
    """The aval a MAX graph carries for `aval`: a key array's raw key data; a
    complex array as its (real, imaginary) parts, float[..., 2] (MAX has no
    complex dtype); any other aval itself."""
    if is_complex_dtype(aval.dtype):
        part = np.finfo(aval.dtype).dtype
        return aval.update(shape=(*aval.shape, 2), dtype=part, weak_type=False)
    return key_data_aval(aval)


from jax._src.random.prng import PRNGKeyArray  # noqa: E402,F401  (a jax.Array subclass)


def key_data(keys):
    """The raw key data (a jax array) of a concrete key array. Its private
    attribute where there is one: `jax.random.key_data` dispatches an op
    (~12 us a call, paid on every call of a function taking a key)."""
    base = getattr(keys, "_base_array", None)
    return base if base is not None else jax.random.key_data(keys)


def wrap_key_data(data, impl):
    """A key array of raw key data `data` (a jax array): the constructor
    where it takes (impl, data) (~1 us), else `jax.random.wrap_key_data` (~6 us)."""
    if _KEY_CONSTRUCTOR_WORKS:
        return PRNGKeyArray(impl, data)
    return jax.random.wrap_key_data(data, impl=impl)


def _key_constructor_works() -> bool:
    try:
        key = jax.random.key(0)
        rebuilt = PRNGKeyArray(key._impl, key._base_array)
        return rebuilt.dtype == key.dtype and rebuilt.shape == key.shape
    except Exception:
        return False


_KEY_CONSTRUCTOR_WORKS = _key_constructor_works()


def key_impl(aval):
    """The PRNG implementation of a key-array aval."""
    return aval.dtype._impl


class jax_impls:
    """JAX's own implementations of primitives in terms of other primitives
    (what its `mlir.lower_fun` lowerings trace); juju lowers them the same way,
    so results match XLA's bit for bit where the pieces do."""

    from jax._src.lax.special import (  # noqa: F401
        _up_and_broadcast as up_and_broadcast,
        igamma_impl,
        igammac_impl,
        igamma_grad_a_impl,
        regularized_incomplete_beta_impl,
    )
    from jax._src.lax.linalg import (  # noqa: F401
        _generic_lu_pivots_to_permutation as lu_pivots_to_permutation,
        _lu_python as lu,
        _qr_lowering as qr,
        _tridiagonal_solve_jax as tridiagonal_solve,
    )
    from jax._src.lax.control_flow.solves import (  # noqa: F401
        _custom_linear_solve_impl as custom_linear_solve,
    )
    from jax._src.random.prng import (  # noqa: F401
        random_bits_impl_base as random_bits,
        random_fold_in_impl_base as random_fold_in,
        random_seed_impl_base as random_seed,
        random_split_impl_base as random_split,
        random_wrap,
    )
    from jax._src.lax.lax import (  # noqa: F401
        _cos_complex as cos_complex,
        _integer_pow as integer_pow,
        _sin_complex as sin_complex,
        logistic_impl as logistic,
    )
    from jax._src.random.threefry2x32 import _threefry2x32_lowering as threefry2x32  # noqa: F401
    from jax._src.random.core import _gamma_impl as random_gamma  # noqa: F401


def open_jaxpr(jaxpr):
    """The Jaxpr of a ClosedJaxpr, or `jaxpr` itself. Control-flow params hold
    closed jaxprs in jax 0.10 and some open ones from 0.11 (cond's branches)."""
    return jaxpr.jaxpr if isinstance(jaxpr, ClosedJaxpr) else jaxpr


def scan_layout(*, num_consts=None, num_carry=None, ft_in=None, ft_out=None):
    """How many of a scan's operands are consts and carries. jax 0.10 says so in
    the params `num_consts` and `num_carry`; from 0.11 the flat trees `ft_in`
    ((consts, carry, xs)) and `ft_out` ((carry, ys)) describe the operands."""
    if ft_in is not None:
        consts, carry, _ = ft_in.unpack()
        return len(consts), len(carry)
    return num_consts, num_carry


# Primitives that only newer jax releases have (None on older ones): from 0.11
# jax emits log2 for jnp.log2 (0.10: log / log(2)) and one_minus_square in the
# derivatives of tanh, asin, acos and atanh; from 0.12 polynomial for
# jnp.polyval and inside some of its own decompositions (Horner's rule).
log2_p = getattr(primitives, "log2_p", None)
one_minus_square_p = getattr(primitives, "one_minus_square_p", None)
polynomial_p = getattr(primitives, "polynomial_p", None)

if polynomial_p is not None:
    from jax._src.lax.lax import _polynomial_lower  # noqa: E402

    jax_impls.polynomial = staticmethod(_polynomial_lower)

# Primitives not exported by jax.extend, needed as registry keys.
from jax._src.lax.linalg import geqrf_p, lu_pivots_to_permutation_p  # noqa: E402
from jax._src.random.prng import (  # noqa: E402
    iota_2x32_shape_p,
    random_unwrap_p,
    random_wrap_p,
)
from jax._src.random.core import random_clone_p  # noqa: E402
from jax._src.lax.control_flow import platform_index_p  # noqa: E402
from jax._src.interpreters.ad import custom_lin_p  # noqa: E402


# --- dead code elimination -------------------------------------------------------

from jax._src.interpreters.partial_eval import dce_jaxpr as _dce_jaxpr  # noqa: E402


def dce(closed_jaxpr):
    """`closed_jaxpr` without equations whose results are unused (effects are
    kept), inputs and outputs unchanged. JAX's tracing leaves such equations
    (`_ = ...`), e.g. forward values a gradient does not need."""
    jaxpr = closed_jaxpr.jaxpr
    pruned, _ = _dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
    if len(pruned.eqns) == len(jaxpr.eqns):
        return closed_jaxpr
    return ClosedJaxpr(pruned, closed_jaxpr.consts)


# --- the fallback: JAX's own implementation of a primitive (issue 14) ------------

from jax._src.interpreters import mlir as _mlir  # noqa: E402

# Every rule `mlir.lower_fun(fun, multiple_results)` returns is a closure over
# `fun` with this code object: how a traced lowering is told from one that
# emits StableHLO itself.
_LOWER_FUN_CODE = _mlir.lower_fun(lambda: None).__code__


def jax_implementation(primitive, platform: str = "cpu"):
    """`(fun, multiple_results)`: the JAX function that XLA's lowering of
    `primitive` traces (`mlir.lower_fun(fun, ...)`), the `platform`'s own
    lowering first, else the default one; None when neither traces a JAX
    function (it emits StableHLO directly, or none is registered)."""
    for table in (_mlir._platform_specific_lowerings.get(platform, {}), _mlir._lowerings):
        entry = table.get(primitive)
        found = _lower_fun_target(getattr(entry, "rule", None))
        if found is not None:
            return found
    return None


def _lower_fun_target(rule):
    if getattr(rule, "__code__", None) is not _LOWER_FUN_CODE or rule.__closure__ is None:
        return None
    cells = dict(zip(rule.__code__.co_freevars, (c.cell_contents for c in rule.__closure__)))
    if "fun" not in cells:
        return None
    return cells["fun"], bool(cells.get("multiple_results", True))


def lowered_primitives() -> set:
    """Every primitive with an XLA lowering registered (any platform): what
    `jax.jit` can compile, from jax and from any library imported so far."""
    found = set(_mlir._lowerings)
    for table in _mlir._platform_specific_lowerings.values():
        found.update(table)
    return found


# --- host callbacks (juju/host.py) -------------------------------------------------

from jax._src import callback as _callback  # noqa: E402
from jax._src import debugging as _debugging  # noqa: E402

pure_callback_p = _callback.pure_callback_p
io_callback_p = _callback.io_callback_p
debug_callback_p = _debugging.debug_callback_p
debug_print_p = getattr(_debugging, "debug_print_p", None)  # jax >= 0.8

# primitive -> its host implementation, impl(*args, **params) -> results. jax's
# own impls of pure_callback and io_callback dispatch through XLA; these are the
# functions XLA's lowering calls back into.
host_callback_impls = {
    pure_callback_p: _callback.pure_callback_impl,
    io_callback_p: _callback.io_callback_impl,
    debug_callback_p: debug_callback_p.impl,
}
if debug_print_p is not None:
    host_callback_impls[debug_print_p] = debug_print_p.impl


_CALLBACK_FAILED = "INTERNAL: CpuCallback error calling callback: "


def callback_failed(exc: BaseException) -> Exception:
    """What jax.jit raises when a host callback raises `exc`: XLA's runtime
    error, whose text holds the callback's traceback (equinox's `filter_jit`
    finds its own errors in that text)."""
    text = "".join(traceback.format_exception(exc))
    return jax.errors.JaxRuntimeError(f"{_CALLBACK_FAILED}{text}")


def as_callback_runtime_error(exc: BaseException) -> Exception | None:
    """A failed callback's error from jax.jit as the JaxRuntimeError of its
    Python dispatch (its C++ fast path raises the same text as ValueError);
    None for any other error."""
    if isinstance(exc, jax.errors.JaxRuntimeError):
        return exc
    if isinstance(exc, ValueError) and str(exc).startswith(_CALLBACK_FAILED):
        return jax.errors.JaxRuntimeError(str(exc))
    return None


def bind_equation(eqn, invals) -> list:
    """Bind `eqn`'s primitive to `invals` as `jax.core.eval_jaxpr` does (its
    results as a list), keeping its source info: an equation traced from it
    names the user's line, not this one. jax 0.10 returns a call's params with
    `subfuns` in them; older releases returned `(subfuns, params)`."""
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns = ()
    if isinstance(params, tuple):
        subfuns, params = params
    manager = getattr(getattr(eqn, "ctx", None), "manager", None)
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    with (source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack),
          manager if manager is not None else contextlib.nullcontext()):
        outs = eqn.primitive.bind(*subfuns, *invals, **params)
    return list(outs) if eqn.primitive.multiple_results else [outs]


# --- tracebacks: juju's frames hidden from user errors, as jax hides its own ----------

from jax._src import traceback_util as _traceback_util  # noqa: E402

api_boundary = _traceback_util.api_boundary  # filters per JAX_TRACEBACK_FILTERING
hide_frames_under = _traceback_util.register_exclusion


# --- MAX's runtime ------------------------------------------------------------------

# MAX 26.7 names the CPU worker threads of its runtime "🔥 Thread0",
# "🔥 Thread1", ... (created with the first `max.driver.CPU()`).
_MAX_WORKER_NAME = "\N{FIRE} Thread"


def max_worker_thread_ids() -> list[int]:
    """Native ids of MAX's CPU worker threads in this process (Linux; else [])."""
    ids = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return ids
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(_MAX_WORKER_NAME):
            ids.append(int(tid))
    return ids


def has_ordered_effects(eqn) -> bool:
    """Whether `eqn` has ordered effects (an ordered io_callback or debug print
    at any depth): their order against the other host steps must hold."""
    from jax._src import effects

    return bool(effects.ordered_effects.filter_in(eqn.effects))


def while_operands(params, operands) -> tuple[list, list, list]:
    """A while equation's operands as (cond consts, body consts, carry)."""
    cond_n, body_n = params["cond_nconsts"], params["body_nconsts"]
    operands = list(operands)
    return operands[:cond_n], operands[cond_n:cond_n + body_n], operands[cond_n + body_n:]


def scan_operands(params, operands) -> tuple[list, list, list]:
    """A scan equation's operands as (consts, carry, xs)."""
    num_consts, num_carry = scan_layout(**{
        k: params.get(k) for k in ("num_consts", "num_carry", "ft_in", "ft_out")})
    operands = list(operands)
    return (operands[:num_consts], operands[num_consts:num_consts + num_carry],
            operands[num_consts + num_carry:])
