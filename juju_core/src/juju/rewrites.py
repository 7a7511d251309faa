"""Jaxpr rewrites: program-level passes that packs contribute through the
`juju_jaxpr_rewrites` hook, run on each traced ClosedJaxpr before the rule
check and lowering (`juju.jit`). They let a pack see patterns that span
several equations (softmax, layer norm) and hand them to one rule.
"""

from __future__ import annotations

from juju import plugins
from juju._compat import ClosedJaxpr
from juju.errors import JujuError, PackError


def apply_rewrites(closed_jaxpr):
    """`closed_jaxpr` after every loaded pack's rewrite passes, in order.

    A pass that raises, or returns something other than a ClosedJaxpr, fails
    with a PackError naming its pack (its cause chained)."""
    for pack, rewrite in plugins.jaxpr_rewrites_by_pack():
        name = getattr(rewrite, "__qualname__", repr(rewrite))
        try:
            result = rewrite(closed_jaxpr)
        except JujuError:
            raise
        except Exception as exc:
            raise PackError(
                f"pack '{pack}': its jaxpr rewrite {name} failed: {type(exc).__name__}: "
                f"{exc}. Block the pack with JUJU_BLOCK_PLUGINS={pack} or report it to its "
                "authors."
            ) from exc
        if not isinstance(result, ClosedJaxpr):
            raise PackError(
                f"pack '{pack}': its jaxpr rewrite {name} returned {type(result).__name__}, "
                "not a ClosedJaxpr (a rewrite returns the program, rewritten or not)"
            )
        closed_jaxpr = result
    return closed_jaxpr
