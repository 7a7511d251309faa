"""Discovering and loading packs; building the process-wide registry.

Packs are found through entry points in the group `juju` and loaded on first
use. Environment variables:

- `JUJU_PLUGINS=lax,nn`: load only these entry-point packs (the core's own
  structural rules and rules registered in-process always load).
- `JUJU_BLOCK_PLUGINS=nn`: never load these packs.
- `JUJU_DISABLE_PLUGIN_AUTOLOAD=1`: load no entry points at all.

A pack that fails to import is reported (`python -m juju`, a warning) and the
others still load.
"""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable, Iterable

import pluggy

from juju import hookspecs
from juju.errors import PackLoadError
from juju.registry import Registry, Rule, stamp

ENTRY_POINT_GROUP = "juju"


@dataclass(frozen=True)
class KernelLibrary:
    """A compiled Mojo kernel library that graphs can use.

    `path()` returns the `.mojoc` file, building it on first call if needed.
    """

    name: str
    path: Callable[[], os.PathLike]


@dataclass
class PackInfo:
    """A pack juju found: where it came from and what it provided."""

    name: str
    version: str
    origin: str  # "entry point <value>", "core", "in-process"
    rule_count: int = 0
    error: BaseException | None = None
    libraries: list[str] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        return self.error is None


@dataclass
class _State:
    registry: Registry | None = None
    packs: list[PackInfo] = field(default_factory=list)
    libraries: dict[str, KernelLibrary] = field(default_factory=dict)
    rewrites: list[Callable] = field(default_factory=list)
    generation: int = 0
    extra: list[tuple[str, str, object]] = field(default_factory=list)


_state = _State()
_lock = threading.RLock()


def _env_list(name: str) -> set[str] | None:
    value = os.environ.get(name)
    if value is None:
        return None
    return {item.strip() for item in value.split(",") if item.strip()}


def _entry_points():
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def register_pack(plugin: object, name: str, version: str = "0") -> None:
    """Register an in-process pack (an object or module with hookimpls).

    Useful for tests and for applications that define rules without
    publishing a distribution. Takes effect at the next registry build.
    """
    with _lock:
        _state.extra = [e for e in _state.extra if e[0] != name]
        _state.extra.append((name, version, plugin))
        _state.registry = None


def unregister_pack(name: str) -> None:
    with _lock:
        _state.extra = [e for e in _state.extra if e[0] != name]
        _state.registry = None


def reload() -> Registry:
    """Forget the loaded packs and build the registry again."""
    with _lock:
        _state.registry = None
        return registry()


def registry() -> Registry:
    """The process-wide registry, loading packs on first use."""
    current = _state.registry
    if current is not None:
        return current
    with _lock:
        if _state.registry is None:
            _build()
        return _state.registry


def generation() -> int:
    """Increments each time the registry is rebuilt (part of jit cache keys)."""
    registry()
    return _state.generation


def packs() -> list[PackInfo]:
    registry()
    return list(_state.packs)


def jaxpr_rewrites() -> list[Callable]:
    """The loaded packs' `juju_jaxpr_rewrites` passes, in pack-name order."""
    registry()
    return list(_state.rewrites)


def kernel_library(name: str) -> KernelLibrary:
    registry()
    try:
        return _state.libraries[name]
    except KeyError:
        known = ", ".join(sorted(_state.libraries)) or "none"
        raise PackLoadError(
            f"kernel library '{name}' is not provided by any loaded pack (known: {known})"
        ) from None


def _build() -> None:
    from juju import _structural

    pm = pluggy.PluginManager("juju")
    pm.add_hookspecs(hookspecs)
    infos: dict[str, PackInfo] = {}

    def add(plugin, name, version, origin):
        try:
            pm.register(plugin, name=name)
        except Exception as exc:  # a broken pack must not break the others
            infos[name] = PackInfo(name, version, origin, error=exc)
            return
        infos[name] = PackInfo(name, version, origin)

    add(_structural, "core", _core_version(), "core")
    only = _env_list("JUJU_PLUGINS")
    blocked = _env_list("JUJU_BLOCK_PLUGINS") or set()
    autoload = os.environ.get("JUJU_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
    if autoload:
        for ep in _entry_points():
            if (only is not None and ep.name not in only) or ep.name in blocked:
                continue
            version = ep.dist.version if ep.dist else "0"
            origin = f"entry point {ep.value} ({ep.dist.name if ep.dist else '?'})"
            try:
                plugin = ep.load()
            except Exception as exc:
                error = PackLoadError(f"pack '{ep.name}' ({origin}) failed to import: {exc!r}")
                error.__cause__ = exc
                infos[ep.name] = PackInfo(ep.name, version, origin, error=error)
                warnings.warn(str(error), RuntimeWarning, stacklevel=3)
                continue
            add(plugin, ep.name, version, origin)
    for name, version, plugin in _state.extra:
        if name not in blocked:
            add(plugin, name, version, "in-process")

    rules: list[Rule] = []
    libraries: dict[str, KernelLibrary] = {}
    for impl in pm.hook.juju_rules.get_hookimpls():
        info = infos[impl.plugin_name]
        try:
            provided = [r for item in impl.function() or () for r in _as_rules(item)]
        except Exception as exc:
            info.error = PackLoadError(f"pack '{info.name}' failed in juju_rules: {exc!r}")
            info.error.__cause__ = exc
            warnings.warn(str(info.error), RuntimeWarning, stacklevel=3)
            continue
        info.rule_count = len(provided)
        rules += stamp(provided, info.name, info.version)
    for impl in pm.hook.juju_kernel_libraries.get_hookimpls():
        info = infos[impl.plugin_name]
        for lib in impl.function() or ():
            libraries[lib.name] = lib
            info.libraries.append(lib.name)

    rewrites = []
    for impl in sorted(pm.hook.juju_jaxpr_rewrites.get_hookimpls(), key=lambda i: i.plugin_name):
        rewrites += list(impl.function() or ())

    _state.registry = Registry(rules, packs=list(infos.values()))
    _state.rewrites = rewrites
    _state.packs = list(infos.values())
    _state.libraries = libraries
    _state.generation += 1


def _as_rules(item) -> Iterable[Rule]:
    if isinstance(item, Rule):
        return [item]
    return list(item)


def _core_version() -> str:
    try:
        return metadata.version("juju-core")
    except metadata.PackageNotFoundError:
        return "0+unknown"
