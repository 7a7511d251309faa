"""Jaxpr rewrites: program-level passes that packs contribute through the
`juju_jaxpr_rewrites` hook, run on each traced ClosedJaxpr before the rule
check and lowering (`juju.jit`). They let a pack see patterns that span
several equations (softmax, layer norm) and hand them to one rule.

A pass may say what it did with `annotate` (e.g. juju-kernels-mojo: "one
generated kernel", or which equations its generator refused and why):
`juju.explain` returns the notes, and the first lowering of a signature
logs them at INFO.
"""

from __future__ import annotations

import threading
import weakref

from juju import plugins
from juju._compat import ClosedJaxpr
from juju.errors import JujuError, PackError
from juju.logs import log

_notes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_notes_lock = threading.Lock()


def annotate(closed_jaxpr, *notes: str) -> None:
    """Attach `notes` (one line each) to a program a rewrite pass returns:
    how it placed the program, for `juju.explain` and the INFO log."""
    with _notes_lock:
        _notes[closed_jaxpr] = (*_notes.get(closed_jaxpr, ()), *notes)


def notes_of(closed_jaxpr) -> tuple[str, ...]:
    """The notes the rewrite passes attached to `closed_jaxpr`."""
    with _notes_lock:
        return _notes.get(closed_jaxpr, ())


def apply_rewrites(closed_jaxpr, what: str | None = None):
    """`closed_jaxpr` after every loaded pack's rewrite passes, in order;
    their notes logged at INFO as notes of `what` (a program's name), if given.

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
        if result is not closed_jaxpr:  # earlier passes' notes stay with the program
            with _notes_lock:
                _notes[result] = (*_notes.get(closed_jaxpr, ()), *_notes.get(result, ()))
        closed_jaxpr = result
    for note in notes_of(closed_jaxpr) if what else ():
        log.info("juju: %s: %s", what, note)
    return closed_jaxpr
