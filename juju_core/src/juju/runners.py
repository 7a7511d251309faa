"""Programs that packs run without a MAX graph (`juju_program_runners`).

MAX's `Model.execute` costs ~25 us a call on the CPU however little the
graph does, against ~5 us for a whole jax.jit call. Where a program's graph
would be one kernel call anyway (a generated Mojo kernel), a pack can call
that kernel itself: before compiling a program's graph, `direct_model` asks
each loaded runner for a model, in pack-name order. A runner that fails is
reported with its pack's name and the MAX graph is compiled as usual.
"""

from __future__ import annotations

import logging

from juju import plugins

log = logging.getLogger("juju")


def direct_model(closed_jaxpr, engine):
    """The model of the first runner that runs `closed_jaxpr` on `engine`,
    or None: compile its MAX graph."""
    for pack, runner in plugins.program_runners_by_pack():
        try:
            model = runner(closed_jaxpr, engine)
        except Exception as exc:  # a pack's bug must not cost the program: MAX runs it
            log.warning("juju: pack '%s': its program runner %s failed (%s: %s); the program "
                        "runs as a MAX graph. Block the pack with JUJU_BLOCK_PLUGINS=%s or "
                        "report it to its authors.", pack, _name(runner), type(exc).__name__,
                        exc, pack)
            continue
        if model is not None:
            if not callable(getattr(model, "execute", None)):
                log.warning("juju: pack '%s': its program runner %s returned %s, which has "
                            "no execute(*buffers); the program runs as a MAX graph.", pack,
                            _name(runner), type(model).__name__)
                continue
            return model
    return None


def prepare_programs(closed_jaxprs: list, engine) -> None:
    """Let each runner that can (`runner.prepare`) build the code of many
    programs at once, before `direct_model` asks for each one's model."""
    for pack, runner in plugins.program_runners_by_pack():
        prepare = getattr(runner, "prepare", None)
        if prepare is None:
            continue
        try:
            prepare(closed_jaxprs, engine)
        except Exception as exc:  # an optimisation: each program is still asked for alone
            log.warning("juju: pack '%s': preparing %d programs failed (%s: %s); each is "
                        "built alone", pack, len(closed_jaxprs), type(exc).__name__, exc)


def is_max_model(model) -> bool:
    """Whether `model` is MAX's (not a pack's): `juju.profile` takes MAX's
    dispatch cost off its times."""
    from max.engine import Model

    return isinstance(model, Model)


def _name(fn) -> str:
    return getattr(fn, "__qualname__", repr(fn))
