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
from juju.errors import JujuError, PackError, PackLoadError
from juju.registry import Registry, Rule, stamp

ENTRY_POINT_GROUP = "juju"
"""The entry-point group packs advertise themselves in."""


@dataclass(frozen=True)
class KernelLibrary:
    """A compiled Mojo kernel library that graphs can use.

    A pack returns it from its `juju_kernel_libraries` hook; rules name it in
    `Rule.requires`.

    Attributes:
        name: the name rules use for it.
        path: `path()` returns the `.mojoc` file, building it on first call
            if needed; juju calls it only when a graph needs the library.
    """

    name: str
    path: Callable[[], os.PathLike]


@dataclass
class PackInfo:
    """A pack juju found: where it came from and what it provided.

    Attributes:
        name: the entry point's name (`lax`, `nn`), `core` or an in-process
            pack's name.
        version: its version (its distribution's, for an entry point).
        origin: `"entry point <value> (<distribution>)"`, `"core"` or
            `"in-process"`.
        rule_count: the rules it provided.
        error: why it failed to load or to answer a hook, else None.
        libraries: the names of the kernel libraries it provided.
        hooks: the `juju_*` hooks it implements.
    """

    name: str
    version: str
    origin: str  # "entry point <value>", "core", "in-process"
    rule_count: int = 0
    error: BaseException | None = None
    libraries: list[str] = field(default_factory=list)
    hooks: list[str] = field(default_factory=list)  # the juju_* hooks it implements

    @property
    def loaded(self) -> bool:
        """Whether it loaded without error."""
        return self.error is None


@dataclass
class _State:
    registry: Registry | None = None
    packs: list[PackInfo] = field(default_factory=list)
    libraries: dict[str, KernelLibrary] = field(default_factory=dict)
    rewrites: list[tuple[str, Callable]] = field(default_factory=list)
    runners: list[tuple[str, Callable]] = field(default_factory=list)
    generation: int = 0
    extra: list[tuple[str, str, object]] = field(default_factory=list)


_state = _State()
_lock = threading.RLock()


def _names_of(ep) -> set[str]:
    """What JUJU_PLUGINS/JUJU_BLOCK_PLUGINS may call an entry point: its own
    name (`nn`) or its distribution's (`juju-ops-nn`, also `juju_ops_nn`)."""
    names = {ep.name}
    if ep.dist is not None:
        dist = ep.dist.name.lower()
        names |= {dist, dist.replace("_", "-"), dist.replace("-", "_")}
    return names


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

    Args:
        plugin: the pack: anything with `@juju.hookimpl` functions.
        name: its name in `python -m juju` and in rules' provenance; a pack
            registered earlier under the same name is replaced.
        version: its version, recorded on its rules.
    """
    with _lock:
        _state.extra = [e for e in _state.extra if e[0] != name]
        _state.extra.append((name, version, plugin))
        _state.registry = None


def unregister_pack(name: str) -> None:
    """Remove an in-process pack registered with `register_pack`; takes
    effect at the next registry build."""
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
    """Every pack found (loaded or not), loading packs on first use."""
    registry()
    return list(_state.packs)


def jaxpr_rewrites() -> list[Callable]:
    """The loaded packs' `juju_jaxpr_rewrites` passes, in pack-name order."""
    return [fn for _, fn in jaxpr_rewrites_by_pack()]


def jaxpr_rewrites_by_pack() -> list[tuple[str, Callable]]:
    """(pack name, rewrite) for every loaded rewrite pass, in pack-name order."""
    registry()
    return list(_state.rewrites)


def program_runners_by_pack() -> list[tuple[str, Callable]]:
    """(pack name, runner) for every loaded `juju_program_runners` runner,
    in pack-name order."""
    registry()
    return list(_state.runners)


def kernel_library(name: str) -> KernelLibrary:
    """The loaded kernel library called `name`; raises `PackLoadError` when
    no loaded pack provides it."""
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
            names = _names_of(ep)  # the entry point's name, or its distribution's
            if (only is not None and not names & only) or names & blocked:
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
    rewrites: list[tuple[str, Callable]] = []
    runners: list[tuple[str, Callable]] = []
    for info in sorted(infos.values(), key=lambda i: i.name):
        if not info.loaded:
            continue
        try:  # a pack whose hook fails contributes nothing; the others still load
            provided = _collect(pm, info)
        except PackError as exc:
            info.error = exc
            warnings.warn(str(exc), RuntimeWarning, stacklevel=3)
            continue
        pack_rules, pack_libraries, pack_rewrites, pack_runners = provided
        info.rule_count = len(pack_rules)
        rules += stamp(pack_rules, info.name, info.version)
        for lib in pack_libraries:
            libraries[lib.name] = lib
            info.libraries.append(lib.name)
        rewrites += [(info.name, fn) for fn in pack_rewrites]
        runners += [(info.name, fn) for fn in pack_runners]

    registry = Registry(rules, packs=list(infos.values()))
    for message in registry.conflicts.values():
        warnings.warn(f"juju: {message}", RuntimeWarning, stacklevel=3)
    _state.registry = registry
    _state.rewrites = rewrites
    _state.runners = runners
    _state.packs = list(infos.values())
    _state.libraries = libraries
    _state.generation += 1


def _hook_results(pm, hook: str, info: PackInfo) -> list:
    """What `info`'s implementation of `hook` returned (a list), or PackError."""
    found = []
    for impl in getattr(pm.hook, hook).get_hookimpls():
        if impl.plugin_name != info.name:
            continue
        info.hooks.append(hook)
        try:
            returned = impl.function()
        except Exception as exc:
            raise PackError(
                f"pack '{info.name}' ({info.origin}) failed in its {hook} hook: "
                f"{type(exc).__name__}: {exc}. Block it with JUJU_BLOCK_PLUGINS={info.name} "
                "or report it to the pack's authors."
            ) from exc
        if returned is None:
            continue
        if isinstance(returned, (str, bytes)) or not isinstance(returned, Iterable):
            raise PackError(
                f"pack '{info.name}' ({info.origin}): its {hook} hook returned "
                f"{_short(returned)}, not a list (see juju.hookspecs.{hook})"
            )
        found += list(returned)
    return found


def _collect(pm, info: PackInfo) -> tuple[list, list, list, list]:
    """A pack's rules, kernel libraries, rewrites and program runners, checked
    against the hookspecs."""
    rules = []
    for item in _hook_results(pm, "juju_rules", info):
        items = [item] if isinstance(item, Rule) else item
        if isinstance(item, (str, bytes)) or not isinstance(items, Iterable):
            items = [item]
        for rule in items:
            if not (isinstance(rule, Rule) and callable(rule.fn) and hasattr(rule.primitive, "name")):
                raise PackError(
                    f"pack '{info.name}' ({info.origin}): its juju_rules hook returned "
                    f"{_short(rule)}, which is not a juju.Rule (with a primitive and a "
                    "callable) or a juju.RuleSet of them"
                )
            rules.append(rule)
    libraries = _hook_results(pm, "juju_kernel_libraries", info)
    for lib in libraries:
        if not (isinstance(getattr(lib, "name", None), str) and callable(getattr(lib, "path", None))):
            raise PackError(
                f"pack '{info.name}' ({info.origin}): its juju_kernel_libraries hook returned "
                f"{_short(lib)}, not a juju.KernelLibrary"
            )
    rewrites = _callables(pm, "juju_jaxpr_rewrites", info,
                          "rewrite(closed_jaxpr) -> closed_jaxpr")
    runners = _callables(pm, "juju_program_runners", info,
                         "runner(closed_jaxpr, engine) -> model or None")
    return rules, libraries, rewrites, runners


def _callables(pm, hook: str, info: PackInfo, signature: str) -> list[Callable]:
    """What `hook` returned, each checked to be a callable `signature`."""
    found = _hook_results(pm, hook, info)
    for fn in found:
        if not callable(fn):
            raise PackError(
                f"pack '{info.name}' ({info.origin}): its {hook} hook returned "
                f"{_short(fn)}, not a callable {signature}"
            )
    return found


def kernel_library_path(name: str) -> os.PathLike:
    """The built library `name` (`KernelLibrary.path()`), failures naming its pack."""
    lib = kernel_library(name)
    pack = next((i.name for i in _state.packs if name in i.libraries), "unknown")
    try:
        return lib.path()
    except JujuError as exc:  # e.g. CompileError with the compiler's output
        exc.add_note(f"  (kernel library '{name}' of pack '{pack}')")
        raise
    except Exception as exc:
        raise PackError(
            f"pack '{pack}': building or finding its kernel library '{name}' failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def _short(value) -> str:
    text = repr(value)
    return f"{text[:80]}... ({type(value).__name__})" if len(text) > 80 else (
        f"{text} ({type(value).__name__})"
    )


def _core_version() -> str:
    try:
        return metadata.version("juju-core")
    except metadata.PackageNotFoundError:
        return "0+unknown"
