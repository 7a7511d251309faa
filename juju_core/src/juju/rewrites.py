"""Jaxpr rewrites: program-level passes that packs contribute through the
`juju_jaxpr_rewrites` hook, run on each traced ClosedJaxpr before the rule
check and lowering (`juju.jit`). They let a pack see patterns that span
several equations (softmax, layer norm) and hand them to one rule.
"""

from __future__ import annotations

from juju import plugins


def apply_rewrites(closed_jaxpr):
    """`closed_jaxpr` after every loaded pack's rewrite passes, in order."""
    for rewrite in plugins.jaxpr_rewrites():
        closed_jaxpr = rewrite(closed_jaxpr)
    return closed_jaxpr
