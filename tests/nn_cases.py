"""Test helpers: many cases checked against `jax.jit` with one MAX compilation.

    cases = [Case("conv_nhwc", f, (x, w)), ...]
    results = run_cases(cases)          # one juju.compile_all for all of them
    results["conv_nhwc"].check()        # values, shapes and dtypes vs jax.jit

A case whose tracing or lowering fails records the exception and fails alone
in `check()`; the others still compile together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import numpy as np

import juju
from tests.util import param


@dataclass
class Case:
    name: str
    fn: Callable
    args: tuple
    rtol: float = 1e-4
    atol: float = 1e-4
    expect_in_graph: tuple[str, ...] = ()  # substrings the MAX graph text must hold
    full: bool = False  # in the full tier only (`pytest -m full`): a variant CI can spare

    def param(self):
        return param(self.name, id=self.name, full=self.full)


@dataclass
class Result:
    case: Case
    lowered: Any = None
    error: BaseException | None = None
    got: Any = None
    text: str = ""
    expected: Any = field(default=None)

    def check(self):
        if self.error is not None:
            raise self.error
        want = jax.tree_util.tree_leaves(self.expected)
        got = jax.tree_util.tree_leaves(self.got)
        assert len(got) == len(want), f"{len(got)} outputs, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            g = g.to_numpy() if hasattr(g, "to_numpy") else np.asarray(g)
            w = np.asarray(w)
            assert g.shape == w.shape, f"output {i}: shape {g.shape} != {w.shape}"
            assert g.dtype == w.dtype, f"output {i}: dtype {g.dtype} != {w.dtype}"
            np.testing.assert_allclose(
                g.astype(np.float64) if g.dtype.kind == "V" else g,
                w.astype(np.float64) if w.dtype.kind == "V" else w,
                rtol=self.case.rtol, atol=self.case.atol, err_msg=f"output {i}",
            )
        for needle in self.case.expect_in_graph:
            assert needle in self.text, f"{needle!r} not in the MAX graph of {self.case.name}"


def _lax_rev_works() -> bool:
    import jax.numpy as jnp

    try:
        juju.jit(lambda x: x[::-1]).lower(jnp.zeros(3, jnp.float32)).as_text()
        return True
    except Exception:
        return False


def install_workarounds() -> None:
    """Temporary: juju-ops-lax 0.1's `rev` rule slices with step -1, which MAX
    rejects; until it is fixed there, tests of gradients use a gather-based
    `rev` from an in-process pack. Does nothing once lax's rule works."""
    if _lax_rev_works():
        return
    from juju import Priority, RuleSet, hookimpl, plugins
    from juju._compat import primitives as P
    from max.graph import ops

    rules = RuleSet()

    @rules.register(P.rev_p, priority=Priority.USER)
    def lower_rev(ctx, x, *, dimensions):
        shape = ctx.avals_in[0].shape
        for d in dimensions:
            index = ctx.constant(np.arange(shape[d] - 1, -1, -1), np.int64)
            x = ops.gather(x, index, axis=d)
        return x

    class _Pack:
        @hookimpl
        def juju_rules(self):
            return [rules]

    plugins.register_pack(_Pack(), "nn-test-workarounds")


def run_cases(cases: list[Case]) -> dict[str, Result]:
    """Check every case's lowering alone (cheap: no compilation), then run all
    lowerable cases as ONE function, hence one MAX graph and one compilation:
    MAX's compile time grows with the number of graphs far more than with the
    number of ops in a graph."""
    install_workarounds()
    results = {c.name: Result(c) for c in cases}
    ok = []
    for c in cases:
        r = results[c.name]
        try:
            r.expected = jax.jit(c.fn)(*c.args)
            r.lowered = juju.jit(c.fn).lower(*c.args)
            r.text = r.lowered.as_text()
            ok.append(r)
        except Exception as exc:  # reported by this case's check()
            r.error = exc
    if not ok:
        return results

    def everything(all_args):
        return [r.case.fn(*args) for r, args in zip(ok, all_args)]

    try:
        outs = juju.jit(everything)([r.case.args for r in ok])
    except Exception as exc:
        for r in ok:
            r.error = exc
        return results
    for r, out in zip(ok, outs):
        r.got = out
    return results
