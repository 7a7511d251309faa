"""Which pack could lower a primitive that no loaded pack handles."""

from __future__ import annotations

from importlib import metadata

_NN = {
    "conv_general_dilated", "reduce_window", "reduce_window_sum", "reduce_window_max",
    "reduce_window_min", "select_and_scatter_add", "select_and_gather_add",
    "select_and_scatter",
}
# Entry-point name and distribution of each first-party pack.
_PACKS = {"lax": "juju-ops-lax", "nn": "juju-ops-nn", "mojo": "juju-kernels-mojo"}


def _pack_for(primitive: str) -> str:
    return "nn" if primitive in _NN else "lax"


def provider_hint(primitive: str, registry) -> str:
    pack = _pack_for(primitive)
    dist = _PACKS[pack]
    by_name = {p.name: p for p in registry.packs}
    info = by_name.get(pack)
    if info is None:
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            return f"provided by {dist}: python -m pip install {dist}"
        return (
            f"{dist} is installed but not loaded (JUJU_PLUGINS / JUJU_BLOCK_PLUGINS / "
            "JUJU_DISABLE_PLUGIN_AUTOLOAD exclude it)"
        )
    if not info.loaded:
        return f"{dist} failed to load: {info.error}"
    return (
        f"{dist} {info.version} is loaded but has no rule for it (see docs/coverage.md); "
        "a pack of your own can add one (docs/writing-a-pack.md)"
    )
