"""Which primitives juju can lower, out of everything JAX and the installed
libraries register: `python -m juju coverage`.

A primitive is found as a `Primitive` object in a loaded module of jax or of
a library, or as a key of JAX's XLA lowering table. For each, juju has a rule
(from a pack), goes through the fallback (its JAX implementation is traced,
see `juju.fallback`), or has nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass

from juju._compat import (
    JaxPrimitive, host_callback_impls, jax_implementation, lowered_primitives,
)

# Libraries whose primitives are listed when installed (imported to register them).
LIBRARIES = ("equinox", "lineax", "optimistix", "diffrax", "optax", "flax", "haiku", "numpyro",
             "blackjax", "chex")
# jax modules that register primitives only when imported.
_JAX_MODULES = ("jax.numpy", "jax.scipy.special", "jax.scipy.linalg", "jax.experimental.sparse",
                "jax.experimental.pallas", "jax.lax.linalg", "jax.nn", "jax.random")


@dataclass(frozen=True)
class Entry:
    name: str
    library: str  # top-level package whose module defines it ("?": only in JAX's table)
    status: str  # "rule", "host", "fallback" or "none"
    detail: str  # the packs with rules, or the JAX implementation traced


def import_libraries() -> list[str]:
    """Import jax's optional modules and the installed LIBRARIES; their names."""
    loaded = []
    for name in _JAX_MODULES + LIBRARIES:
        if importlib.util.find_spec(name.split(".")[0]) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception:  # a broken optional library only drops its rows
            continue
        if name in LIBRARIES:
            loaded.append(name)
    return loaded


def defined_primitives() -> dict:
    """{primitive: library} for every primitive in loaded modules of jax and
    LIBRARIES, and every primitive with an XLA lowering."""
    found: dict = {}
    roots = ("jax", "jaxlib") + LIBRARIES
    for module_name, module in sorted(sys.modules.items()):
        root = module_name.split(".")[0]
        if root not in roots or module is None:
            continue
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        for value in values:
            if isinstance(value, JaxPrimitive) and value not in found:
                found[value] = "jax" if root == "jaxlib" else root
    for primitive in lowered_primitives():
        found.setdefault(primitive, "?")
    return found


def describe_implementation(fun) -> str:
    """`module.qualname` of a traced implementation (a partial: of its function)."""
    inner = getattr(fun, "func", None)  # functools.partial
    target = inner if inner is not None and getattr(fun, "__qualname__", None) is None else fun
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    module = getattr(target, "__module__", None) or type(target).__module__
    return f"{module}.{name}"


def classify(primitive, registry) -> tuple[str, str]:
    rules = registry.rules_for(primitive)
    if rules:
        return "rule", ", ".join(sorted({r.pack for r in rules}))
    if primitive in host_callback_impls:
        return "host", "juju.host"
    found = jax_implementation(primitive)
    if found is not None and registry.catch_all():
        return "fallback", describe_implementation(found[0])
    return "none", ""


def entries(registry=None) -> list[Entry]:
    """One Entry per primitive, sorted by library then name."""
    from juju import plugins

    registry = registry or plugins.registry()
    import_libraries()
    rows = [
        Entry(p.name, library, *classify(p, registry))
        for p, library in defined_primitives().items()
    ]
    return sorted(rows, key=lambda e: (e.library != "jax", e.library, e.name, e.status))


def find(name: str):
    """The primitive called `name` among those `entries` lists, or None."""
    import_libraries()
    return next((p for p in defined_primitives() if p.name == name), None)


def markdown(rows: list[Entry]) -> str:
    """The table docs/coverage.md shows, with a count per status."""
    counts = {s: sum(e.status == s for e in rows) for s in ("rule", "host", "fallback", "none")}
    libraries = sorted({e.library for e in rows} - {"jax", "?"})
    lines = [
        f"{len(rows)} primitives (jax{''.join(', ' + lib for lib in libraries)}): "
        f"{counts['rule']} with a rule, {counts['host']} host callbacks run on the host "
        f"between MAX graphs, {counts['fallback']} via their JAX implementation "
        f"(the fallback), {counts['none']} with nothing.",
        "",
        "| primitive | library | lowered by |",
        "|---|---|---|",
    ]
    for e in rows:
        how = {"rule": f"rule ({e.detail})", "host": "on the host, between MAX graphs "
               "(docs/callbacks.md)", "fallback": f"via its JAX implementation "
               f"(`{e.detail}`)", "none": "**nothing**"}[e.status]
        lines.append(f"| `{e.name}` | {e.library} | {how} |")
    return "\n".join(lines) + "\n"
