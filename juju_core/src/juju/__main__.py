"""`python -m juju`: the installed packs, their rules, and who lowers what.

    python -m juju                 # packs, versions, rule counts, hooks, load errors
    python -m juju --json          # the same, as JSON
    python -m juju --version       # juju-core, jax and MAX versions
    python -m juju which sin       # the rules for a primitive, winner first (or the fallback)
    python -m juju rules [PACK]    # every primitive a pack lowers
    python -m juju cache           # where the persistent compile cache is, and its size
    python -m juju cache clear     # delete it
    python -m juju precompile pkg.module:fn --shapes float32[128,784] float32[784]
                                   # compile into the persistent cache ahead of time
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m juju", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=_versions())
    parser.add_argument("--json", action="store_true", help="list the packs as JSON")
    sub = parser.add_subparsers(dest="command")
    cache_cmd = sub.add_parser("cache", help="the persistent compile cache: where, how big")
    cache_cmd.add_argument("action", nargs="?", choices=["show", "clear"], default="show")
    which = sub.add_parser("which", help="which pack lowers a primitive")
    which.add_argument("primitive")
    rules_cmd = sub.add_parser("rules", help="list the primitives each pack lowers")
    rules_cmd.add_argument("pack", nargs="?")
    pre = sub.add_parser("precompile", help="compile a function into juju's persistent cache")
    pre.add_argument("function", help="pkg.module:name, a function or a juju.jit function")
    given = pre.add_mutually_exclusive_group(required=True)
    given.add_argument("--shapes", nargs="+", metavar="DTYPE[DIMS]",
                       help="one array per positional argument, e.g. float32[128,784] int32[]")
    given.add_argument("--args", metavar="pkg.module:name",
                       help="a callable returning the positional arguments (a tuple of arrays "
                            "or jax.ShapeDtypeStruct pytrees)")
    args = parser.parse_args(argv)

    if args.command == "precompile":
        return _precompile(args)
    if args.command == "cache":
        return _cache(args.action)

    from juju import plugins

    try:
        registry = plugins.registry()
    except Exception as exc:  # e.g. a rule conflict: show it, do not crash
        print(f"juju: cannot build the rule registry: {exc}", file=sys.stderr)
        return 2

    if args.command == "which":
        found = [p for p in registry.primitives() if p.name == args.primitive]
        if not found and _print_fallback(args.primitive, registry):
            return 0
        if not found:
            print(f"no loaded pack lowers '{args.primitive}'")
            from juju._hints import provider_hint

            print("  " + provider_hint(args.primitive, registry))
            close = _close_names(args.primitive, registry)
            if close:
                print(f"  did you mean: {', '.join(close)}?")
            return 1
        for prim in found:
            print(f"{prim.name}:")
            if prim in registry.conflicts:
                print(f"  CONFLICT: {registry.conflicts[prim]}")
            for i, rule in enumerate(registry.rules_for(prim)):
                tag = "wins unless guarded out" if i == 0 and rule.guard else ("wins" if i == 0 else "next")
                print(f"  {rule.describe()}  <- {tag}")
        return 0

    if args.command == "rules":
        for pack, rules in sorted(registry.with_provenance().items()):
            if args.pack and pack != args.pack:
                continue
            names = sorted({r.primitive.name for r in rules})
            print(f"{pack} ({len(names)} primitives): {', '.join(names)}")
        return 0

    if args.json:
        import json

        print(json.dumps({
            "packs": [_pack_record(info) for info in registry.packs],
            "primitives": len(registry.primitives()), "fingerprint": registry.fingerprint,
            "conflicts": [str(m) for m in registry.conflicts.values()],
        }, indent=2))
        return 0
    print(f"{'pack':<8} {'version':<10} {'rules':>5}  {'hooks':<24} origin")
    for info in registry.packs:
        status = "" if info.loaded else f"  FAILED: {info.error}"
        libs = f"  kernels: {', '.join(info.libraries)}" if info.libraries else ""
        hooks = ",".join(h.removeprefix("juju_") for h in dict.fromkeys(info.hooks)) or "-"
        print(f"{info.name:<8} {info.version:<10} {info.rule_count:>5}  {hooks:<24} "
              f"{info.origin}{libs}{status}")
    print(f"{len(registry.primitives())} primitives lowered; registry {registry.fingerprint}")
    for message in registry.conflicts.values():
        print(f"CONFLICT: {message}")
    return 0


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def of(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return "not installed"

    return (f"juju-core {of('juju-core')} (jax {of('jax')}, jaxlib {of('jaxlib')}, "
            f"max {of('max')}, Python {sys.version.split()[0]})")


def _pack_record(info) -> dict:
    return {"name": info.name, "version": info.version, "origin": info.origin,
            "hooks": list(dict.fromkeys(info.hooks)), "rules": info.rule_count,
            "kernel_libraries": list(info.libraries),
            "error": None if info.loaded else str(info.error)}


def _close_names(name: str, registry) -> list[str]:
    import difflib

    from juju import coverage

    coverage.import_libraries()
    known = {p.name for p in registry.primitives()} | {
        p.name for p in coverage.defined_primitives()}
    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)


def _cache(action: str) -> int:
    from juju import cache

    where = cache.root()
    if action == "clear":
        cache.clear()
        print(f"juju: cleared the compiled models under {where / 'compiled'}")
        return 0
    files = [p for p in (where / "compiled").rglob("*") if p.is_file()] if where.exists() else []
    size = sum(p.stat().st_size for p in files)
    state = "enabled" if cache.enabled() else "disabled (JUJU_DISABLE_CACHE)"
    print(f"juju cache: {where} ({state}); this MAX version: {cache.folder()}")
    print(f"  {len(files)} files, {size / 2**20:.1f} MiB")
    return 0


def _resolve(target: str):
    import importlib

    module, sep, name = target.partition(":")
    if not sep or not name:
        raise SystemExit(f"juju precompile: expected pkg.module:name, got {target!r}")
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _spec(text: str):
    import re

    import jax
    import jax.numpy as jnp

    match = re.fullmatch(r"\s*(\w+)\s*\[([\d,\s]*)\]\s*", text)
    if match is None:
        raise SystemExit(f"juju precompile: bad shape {text!r}; write e.g. float32[128,784] "
                         "or int32[] for a scalar")
    dims = tuple(int(d) for d in match[2].replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(dims, jnp.dtype(match[1]))


def _precompile(args) -> int:
    import time

    import juju
    from juju import cache
    from juju.jit import JitFunction

    if not cache.enabled():
        print("juju precompile: the persistent cache is disabled (JUJU_DISABLE_CACHE)",
              file=sys.stderr)
        return 2
    fn = _resolve(args.function)
    if not isinstance(fn, JitFunction):
        fn = juju.jit(fn)
    arguments = [_spec(s) for s in args.shapes] if args.shapes else _resolve(args.args)()
    start = time.perf_counter()
    juju.compile_all([fn.lower(*arguments)])
    print(f"juju: {args.function} is in the persistent cache ({cache.directory()}), "
          f"{time.perf_counter() - start:.1f} s")
    return 0


def _print_fallback(name, registry) -> bool:
    """For a primitive only the core's fallback or juju.host runs, say so."""
    from juju import coverage

    primitive = coverage.find(name)
    if primitive is None:
        return False
    status, detail = coverage.classify(primitive, registry)
    if status == "host":
        print(f"{name}: a host callback; juju runs it in Python between MAX graphs "
              "(juju.host, docs/callbacks.md)")
        return True
    if status != "fallback":
        return False
    (rule,) = registry.catch_all()
    print(f"{name}: no pack has a rule; lowered via its JAX implementation ({detail}),")
    print(f"  traced into the graph by {rule.describe()}")
    return True


if __name__ == "__main__":
    sys.exit(main())
