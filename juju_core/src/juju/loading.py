"""Loaded MAX models for built graphs: from the persistent cache, else compiled.

`load_models` is the one way juju turns graphs into models. Graphs found in
the persistent cache (`juju.cache`) are loaded from it; the others are
compiled in worker processes (`juju.compile_pool`), split into as many MAX
compilations as there are workers (MAX's cost is mostly per compilation, so
one per worker), then moved into the cache and loaded from there. Only the
lookups and the loads hold `compile_pool.max_building()`; the compiles run
without it, so other threads build graphs and start compiles meanwhile.
"""

from __future__ import annotations

from pathlib import Path

from juju import cache, compile_pool
from juju.compile_worker import module_text
from juju.engine import Engine, module_of
from juju.logs import log


def load_models(engine: Engine, graphs: list, names: list[str]) -> list:
    """A loaded model per graph of `graphs` (built for `engine`), in order.

    `names` describe each graph's user function (`juju.logs.describe`), for
    messages. Raises `CompileError` (or `CompilerCrashError`) when MAX fails.
    """
    models: list = [None] * len(graphs)
    with compile_pool.max_building():
        keys = [cache.graph_key(g, engine.description, g.kernel_libraries_paths)
                for g in graphs]
        for i, key in enumerate(keys):
            hit = cache.lookup(key)
            log.debug("juju: persistent cache %s for %s (key %s)",
                      "miss" if hit is None else "hit", names[i], key[:16])
            if hit is not None:
                try:
                    models[i] = engine.load_mef(hit[0])[hit[1]]
                except Exception as exc:  # unreadable entry: compile instead
                    log.warning("juju: cached model %s unusable (%s); recompiling", hit[0], exc)
        misses = [i for i, m in enumerate(models) if m is None]
        # Graphs of the same content (the same segment in two staged
        # programs, one function traced twice) compile once.
        first = {}
        batches = _batches([i for i in misses if first.setdefault(keys[i], i) == i])
        jobs = [_job(engine, [graphs[i] for i in batch], [names[i] for i in batch])
                for batch in batches]
    if not jobs:
        return models
    mefs = compile_pool.compile_jobs(jobs, lambda _device: engine.session)
    with compile_pool.max_building():
        for batch, mef in zip(batches, mefs, strict=True):
            cached = cache.store([keys[i] for i in batch], mef)
            try:
                # By position: MAX's disk cache may return a model under the
                # name of the first graph it compiled with the same content.
                loaded = engine.load_mef(cached or mef)
            finally:
                if cached is None:
                    Path(mef).unlink(missing_ok=True)
            for i, model in zip(batch, loaded, strict=True):
                models[i] = model
    for i in misses:
        models[i] = models[first[keys[i]]]
    return models


def _batches(misses: list[int]) -> list[list[int]]:
    """The misses split into one compilation per worker (round robin)."""
    count = 1 if compile_pool.in_process() else min(len(misses), compile_pool.workers())
    return [misses[k::count] for k in range(count)] if misses else []


def _job(engine: Engine, graphs: list, names: list[str]) -> compile_pool.Job:
    module = graphs[0].module if len(graphs) == 1 else module_of(graphs)
    # The graphs' libraries: their rules' and any a rule generated while
    # lowering (`juju.lowering_helpers.load_kernel_library`).
    extensions = sorted({str(p) for g in graphs for p in g.kernel_libraries_paths})
    unique = list(dict.fromkeys(names))
    what = ", ".join(unique[:4]) + (f" and {len(unique) - 4} more" if len(unique) > 4 else "")
    return compile_pool.Job(module_text(module), tuple(extensions), engine.key, what)
