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


def load_models(engine: Engine, graphs: list, names: list[str], options=None) -> list:
    """A loaded model per graph of `graphs` (built for `engine`), in order.

    `names` describe each graph's user function (`juju.logs.describe`), for
    messages; `options` are each graph's MAX compile options (sorted (name,
    value) pairs; none by default). Raises `CompileError` (or
    `CompilerCrashError`) when MAX fails.
    """
    models: list = [None] * len(graphs)
    options = options or [()] * len(graphs)
    with compile_pool.max_building():
        keys = [cache.graph_key(g, engine.description, g.kernel_libraries_paths, o)
                for g, o in zip(graphs, options)]
        batches = _load_cached(engine, keys, names, options, models)
    if not batches:
        return models
    # Processes that compile the same batch at once (pytest-xdist workers,
    # scripts started together): one compiles, the others wait and load it.
    with cache.compile_locks([[keys[i] for i in batch] for batch in batches]):
        with compile_pool.max_building():
            batches = _load_cached(engine, keys, names, options, models)
            jobs = [_job(engine, [graphs[i] for i in batch], [names[i] for i in batch],
                         options[batch[0]]) for batch in batches]
        if jobs:
            _compile(engine, jobs, batches, keys, models)
    first = {}  # graphs of the same content compiled once: the others share its model
    for i, key in enumerate(keys):
        models[i] = models[first.setdefault(key, i)]
    return models


def _load_cached(engine: Engine, keys, names, options, models: list) -> list[list[int]]:
    """Load what the persistent cache holds into `models` (None: a miss);
    the misses, split into compilations."""
    for i, key in enumerate(keys):
        if models[i] is not None:
            continue
        hit = cache.lookup(key)
        log.debug("juju: persistent cache %s for %s (key %s)",
                  "miss" if hit is None else "hit", names[i], key[:16])
        if hit is not None:
            try:
                models[i] = engine.load_mef(hit[0])[hit[1]]
            except Exception as exc:  # unreadable entry: compile instead
                log.warning("juju: cached model %s unusable (%s); recompiling", hit[0], exc)
    # Graphs of the same content (the same segment in two staged programs,
    # one function traced twice) compile once.
    first = {}
    misses = [i for i, m in enumerate(models) if m is None and first.setdefault(keys[i], i) == i]
    return [batch for o in dict.fromkeys(options)  # one compilation per option set
            for batch in _batches([i for i in misses if options[i] == o])]


def _compile(engine: Engine, jobs, batches, keys, models: list) -> None:
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


def _batches(misses: list[int]) -> list[list[int]]:
    """The misses split into one compilation per worker (round robin)."""
    count = 1 if compile_pool.in_process() else min(len(misses), compile_pool.workers())
    return [misses[k::count] for k in range(count)] if misses else []


def _job(engine: Engine, graphs: list, names: list[str], options=()) -> compile_pool.Job:
    module = graphs[0].module if len(graphs) == 1 else module_of(graphs)
    # The graphs' libraries: their rules' and any a rule generated while
    # lowering (`juju.lowering_helpers.load_kernel_library`).
    extensions = sorted({str(p) for g in graphs for p in g.kernel_libraries_paths})
    unique = list(dict.fromkeys(names))
    what = ", ".join(unique[:4]) + (f" and {len(unique) - 4} more" if len(unique) > 4 else "")
    return compile_pool.Job(module_text(module), tuple(extensions), engine.key, what, options)
