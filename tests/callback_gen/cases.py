"""Host callbacks placed at every nesting juju knows, under every transformation.

A `Case` is data: a callback *kind* (what calls back), a *nesting* (the
higher-order functions around it, outermost first, up to depth 3) and a
*transform* (what is applied to the whole). `Case.function()` builds

    transform(nest_1(nest_2(nest_3(site))))   # a function of (x, t)

where `site(v, t)` is the callback of the kind applied to `v`, every
`nest_i(f)(v, t)` calls `f` inside its construct (a jit, a cond's branch, a
while/scan body, a custom_jvp/custom_vjp function, a custom_linear_solve's
solve, a linear_call's callee, a checkpoint), and `t` is a threshold read by
the guards: `T_QUIET` never fires them, `T_FIRE` does.

Every host function records `(tag, *operands)` in `CALLS`, so a run's calls
can be compared with jax.jit's; `debug.print` writes to stdout instead.
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import io_callback

X = np.array([0.25, -0.5, 0.75], np.float32)
T_QUIET = np.float32(1e6)  # the guards' threshold: never reached
T_FIRE = np.float32(-1e6)  # always exceeded: every guard fires
CALLS: list = []  # (case tag, host function, *operands) of every host call, in order


class GuardFired(Exception):
    """Raised on the host by a guard whose check fails."""


class Host:
    """The host functions of one case: each call is recorded under the
    case's tag (cases run side by side in one program)."""

    def __init__(self, tag: str):
        self.tag = tag

    def _record(self, name, *values):
        CALLS.append((self.tag, name, *[np.array(v) for v in values]))

    def sin(self, v):
        self._record("pure", v)
        return np.sin(v).astype(v.dtype)

    def cos(self, v):
        self._record("io", v)
        return np.cos(v).astype(v.dtype)

    def halve(self, v):
        self._record("io_ordered", v)
        return (v * 0.5).astype(v.dtype)

    def debug(self, v):
        self._record("debug", v)

    def check(self, u, t):
        self._record("guard", u, t)
        if np.any(np.asarray(u) > np.min(t)):  # t is one value (vmap may broadcast it)
            raise GuardFired(f"a value is above {np.min(t)}")
        return u


def _like(v):
    return jax.ShapeDtypeStruct(v.shape, v.dtype)


# --- the callback sites: site(v, t, vmap_method, host) -> a value shaped as v ---------
# Operands of pure and io callbacks are stop_gradient'ed: they have no JVP
# rule, and jax.jit rejects them on a differentiated path.


def _pure(v, t, method, host):
    return v * 1.5 + jax.pure_callback(host.sin, _like(v), lax.stop_gradient(v),
                                       vmap_method=method)


def _io(v, t, method, host):
    return v * 1.5 + io_callback(host.cos, _like(v), lax.stop_gradient(v), ordered=False)


def _io_ordered(v, t, method, host):
    return v * 1.5 + io_callback(host.halve, _like(v), lax.stop_gradient(v), ordered=True)


def _debug_callback(v, t, method, host):
    jax.debug.callback(host.debug, v)
    return v * 1.5


def _debug_print(v, t, method, host):
    jax.debug.print(f"site {host.tag} {{v}}", v=v)
    return v * 1.5


def _guard(v, t, method, host):
    """eqx.error_if's shape: a callback in the branch of a cond taken only
    when the check fails; under vmap (a select) it runs but raises only on
    a failing element."""
    u = lax.stop_gradient(v)
    checked = lax.cond(jnp.max(u) > t,
                       lambda a: jax.pure_callback(host.check, _like(a), a, t,
                                                   vmap_method=method),
                       lambda a: a, u)
    return v * 1.5 + (checked - u)


def _eqx(v, t, method, host):
    import equinox as eqx

    return eqx.error_if(v, jnp.max(v) > t, "guard fired") * 1.5


KINDS = {"pure": _pure, "io": _io, "io_ordered": _io_ordered, "debug_callback": _debug_callback,
         "debug_print": _debug_print, "guard": _guard, "eqx": _eqx}
FIRING = ("guard", "eqx")  # kinds whose callback raises when t = T_FIRE


# --- the nestings: nest(f) -> g, both (v, t) -> a value shaped as v ------------------


def _jit(f):
    return jax.jit(f)


def _cond(f):  # a callback in both branches: the host runs the one taken
    return lambda v, t: lax.cond(jnp.sum(v) < 1e30, f, lambda u, s: f(-u, s), v, t)


def _switch(f):  # a callback in one branch, taken: run in MAX, replayed by jax.jit
    def g(v, t):
        index = jnp.where(jnp.sum(v) < 1e30, 1, 0)
        return lax.switch(index, [lambda u, s: u * 0.5, f, lambda u, s: -u], v, t)

    return g


def _while(f):
    def g(v, t):
        return lax.while_loop(lambda c: c[0] < 2, lambda c: (c[0] + 1, f(c[1], t)),
                              (jnp.int32(0), v))[1]

    return g


def _scan(f):
    return lambda v, t: lax.scan(lambda c, _: (f(c, t), None), v, length=2)[0]


def _custom_jvp(f):
    g = jax.custom_jvp(f)
    g.defjvp(lambda primals, tangents: (f(*primals), tangents[0] * 1.5))
    return g


def _custom_vjp(f):  # a callback in the forward and the backward function
    g = jax.custom_vjp(f)
    g.defvjp(lambda v, t: (f(v, t), t), lambda t, ct: (f(ct, t), jnp.zeros_like(t)))
    return g


def _custom_linear_solve(f):
    def g(v, t):
        return lax.custom_linear_solve(lambda u: u * 2.0, v, lambda matvec, b: f(b, t),
                                       symmetric=True)

    return g


def _linear_call(f):  # a callback in the callee and its transpose
    def g(v, t):
        return jax.custom_derivatives.linear_call(
            lambda s, u: f(u, s), lambda s, ct: f(ct, s), t, v)

    return g


def _checkpoint(f):
    return jax.checkpoint(f)


NESTS = {"jit": _jit, "cond": _cond, "switch": _switch, "while": _while, "scan": _scan,
         "custom_jvp": _custom_jvp, "custom_vjp": _custom_vjp,
         "custom_linear_solve": _custom_linear_solve, "linear_call": _linear_call,
         "checkpoint": _checkpoint}


# --- the transforms: transform(g) -> a function of (x, t) ----------------------------


def _total(g):
    return lambda x, t: jnp.sum(g(x, t))


def _ones_like(x):
    return jnp.ones_like(x)


def _batch(x):
    return jnp.stack([x, x * 0.5])


TRANSFORMS = {
    "none": lambda g: g,
    "grad": lambda g: jax.grad(_total(g)),
    "value_and_grad": lambda g: jax.value_and_grad(_total(g)),
    "jvp": lambda g: lambda x, t: jax.jvp(lambda u: g(u, t), (x,), (_ones_like(x),)),
    "vjp": lambda g: lambda x, t: (lambda y, pull: (y, pull(_ones_like(y))))(
        *jax.vjp(lambda u: g(u, t), x)),
    "linearize": lambda g: lambda x, t: (lambda y, lin: (y, lin(_ones_like(x))))(
        *jax.linearize(lambda u: g(u, t), x)),
    "jacfwd": lambda g: jax.jacfwd(g),
    "jacrev": lambda g: jax.jacrev(g),
    "hessian": lambda g: jax.hessian(_total(g)),
    # compositions
    "vmap.grad": lambda g: lambda x, t: jax.vmap(jax.grad(_total(g)), (0, None))(_batch(x), t),
    "grad.vmap": lambda g: jax.grad(lambda x, t: jnp.sum(jax.vmap(g, (0, None))(_batch(x), t))),
    "jvp.grad": lambda g: lambda x, t: jax.jvp(lambda u: jax.grad(_total(g))(u, t), (x,),
                                               (_ones_like(x),)),
    "vmap.jacfwd": lambda g: lambda x, t: jax.vmap(jax.jacfwd(g), (0, None))(_batch(x), t),
}
VMAP_METHODS = ("sequential", "sequential_unrolled", "expand_dims", "broadcast_all")
for _method in VMAP_METHODS:
    TRANSFORMS[f"vmap:{_method}"] = (
        lambda g: lambda x, t: jax.vmap(g, (0, None))(_batch(x), t))


@dataclasses.dataclass(frozen=True)
class Case:
    kind: str
    nesting: tuple[str, ...]  # outermost first
    transform: str

    @property
    def name(self) -> str:
        return f"{self.transform}/{'.'.join(self.nesting) or 'top'}/{self.kind}"

    @property
    def vmap_method(self) -> str:
        return self.transform.partition(":")[2] or "sequential"

    @property
    def fires(self) -> bool:
        return self.kind in FIRING

    @property
    def ordered(self) -> bool:
        """Whether jax guarantees the order of its calls."""
        return self.kind == "io_ordered"

    def function(self, tag: str = ""):
        """The case as a function of (x, t); its host calls are recorded
        under `tag`."""
        site, method, host = KINDS[self.kind], self.vmap_method, Host(tag)
        fn = lambda v, t: site(v, t, method, host)  # noqa: E731
        for nest in reversed(self.nesting):
            fn = NESTS[nest](fn)
        return TRANSFORMS[self.transform](fn)

    def source(self) -> str:
        """A one-line description to reproduce the case by hand."""
        inner = f"{self.kind}(v, t, vmap_method={self.vmap_method!r})"
        for nest in reversed(self.nesting):
            inner = f"{nest}({inner})"
        return f"{self.transform}({inner}) at x={X.tolist()}"


def nestings(depth: int) -> list[tuple[str, ...]]:
    """Every nesting of NESTS up to `depth` (the empty one included)."""
    return [n for d in range(depth + 1) for n in itertools.product(NESTS, repeat=d)]


def _distinct(kind: str, transform: str) -> bool:
    """Whether the case differs from another one: vmap methods only change
    pure_callback's batching (the pure and guard kinds)."""
    return not (transform.startswith("vmap:") and transform != "vmap:sequential"
                and kind not in ("pure", "guard"))


def all_cases(depth: int = 3) -> list[Case]:
    """The full run:
    - every nesting to `depth` (1111 at depth 3), with every kind in turn,
      untransformed; every nesting to depth 1 with every kind;
    - every nesting to depth 2 under every transform, the kinds in turn
      (so that each such nesting meets every kind); every nesting to depth
      1 under every transform with every kind;
    - every deeper nesting under one transform, the transforms in turn.
    """
    kinds, transforms = list(KINDS), list(TRANSFORMS)
    wanted: list[Case] = []
    for i, nesting in enumerate(nestings(depth)):
        if len(nesting) <= 1:
            wanted += [Case(k, nesting, t) for t in transforms for k in kinds]
        elif len(nesting) == 2:
            wanted += [Case(kinds[(i + j) % len(kinds)], nesting, t)
                       for j, t in enumerate(transforms)]
            wanted += [Case(k, nesting, "none") for k in kinds]
        else:
            wanted.append(Case(kinds[i % len(kinds)], nesting, "none"))
            wanted.append(Case(kinds[(i + 3) % len(kinds)], nesting,
                               transforms[1 + i % (len(transforms) - 1)]))
    return [c for c in dict.fromkeys(wanted) if _distinct(c.kind, c.transform)]


def ci_slice() -> list[Case]:
    """CI's slice: each nest, each kind and each transform at least once,
    nests inside nests to depth 3 (the cases share graphs: one compilation)."""
    kinds, nests, transforms = list(KINDS), list(NESTS), list(TRANSFORMS)
    cases = []
    for i, t in enumerate(transforms):
        kind = kinds[i % len(kinds)]
        if not _distinct(kind, t):  # a vmap method: a kind that has one
            kind = ("pure", "guard")[i % 2]
        cases.append(Case(kind, (nests[i % len(nests)], nests[(3 * i + 1) % len(nests)]), t))
    cases += [Case("eqx", ("jit", "while", "custom_jvp"), "none"),
              Case("guard", ("scan", "checkpoint", "cond"), "grad"),
              Case("io_ordered", ("custom_vjp", "linear_call", "custom_linear_solve"), "none")]
    return cases


def kernel_slice() -> list[Case]:
    """A few cases again with the program kernels on (generated Mojo): a
    callback-free segment may run as a native program between host steps."""
    return [Case("pure", ("scan",), "none"), Case("guard", ("while",), "jvp"),
            Case("eqx", ("custom_jvp",), "grad"), Case("debug_print", ("cond",), "vmap:sequential")]
