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
    python -m juju explain pkg.module:fn f32[8,16] i32[]   (or path/to/file.py:fn)
                                   # which rule of which pack lowers each equation
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
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
    explain = sub.add_parser("explain", help="which rule of which pack lowers each equation "
                             "of a function (builds its graph, compiles nothing)")
    explain.add_argument("function", help="pkg.module:name or path/to/file.py:name, a "
                         "function or a juju.jit function")
    explain.add_argument("shapes", nargs="*", metavar="DTYPE[DIMS]",
                         help="one array per positional argument, e.g. f32[8,16] i32[] "
                              "(jax's short dtype names, or numpy's: float32)")
    explain.add_argument("--args", metavar="pkg.module:name",
                         help="instead of shapes: a callable returning the positional "
                              "arguments (arrays or jax.ShapeDtypeStruct pytrees)")
    explain.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                         help="the choices as JSON")
    args = parser.parse_args(argv)

    if args.command in ("precompile", "explain"):
        try:
            return _precompile(args) if args.command == "precompile" else _explain(args)
        except UsageError as exc:
            print(f"juju {args.command}: {exc}", file=sys.stderr)
            return 2
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


class UsageError(ValueError):
    """A command line juju cannot act on: a bad shape, no such function."""


def _resolve(target: str):
    """The object `pkg.module:name` or `path/to/file.py:name` names."""
    module_name, sep, name = target.rpartition(":")
    if not sep or not module_name or not name:
        raise UsageError(f"expected pkg.module:name or path/to/file.py:name, got {target!r}")
    module = _load_module(module_name)
    value = module
    for depth, part in enumerate(name.split(".")):
        if not hasattr(value, part):
            where = ".".join([module_name, *name.split(".")[:depth]])
            known = [n for n in dir(value) if not n.startswith("_")]
            close = difflib.get_close_matches(part, known, n=3, cutoff=0.6)
            functions = [n for n in known if callable(getattr(value, n, None))]
            if close:
                hint = f"; did you mean: {', '.join(close)}?"
            elif functions and len(functions) <= 12:
                hint = f" (it has: {', '.join(functions)})"
            else:
                hint = ""
            raise UsageError(f"{where} has no attribute {part!r}{hint}")
        value = getattr(value, part)
    return value


def _load_module(name: str):
    import importlib
    import importlib.util
    from pathlib import Path

    path = Path(name)
    if name.endswith(".py"):
        if not path.is_file():
            raise UsageError(f"no such file: {name}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))  # its own imports, as `python file.py`
        sys.modules.setdefault(path.stem, module)
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise  # the module itself imports something missing: show where
        raise UsageError(f"no module named {exc.name!r} (give pkg.module:name for an "
                         "importable module, or path/to/file.py:name)") from None


# jax's short dtype names (f32, bf16, i8, u32, c64, f8_e4m3fn), as it prints avals.
_SHORT_DTYPE = re.compile(r"(bf|f|u|i|c)(\d+)(_\w+)?")
_SHORT_PREFIX = {"bf": "bfloat", "f": "float", "u": "uint", "i": "int", "c": "complex"}


def _dtype(name: str):
    import jax.numpy as jnp

    short = _SHORT_DTYPE.fullmatch(name)  # before numpy's codes: f16 is not float128
    full = (_SHORT_PREFIX[short[1]] + short[2] + (short[3] or "")) if short else name
    try:
        return jnp.dtype(full)
    except TypeError:
        known = ["bool", *(f"{p}{n}" for p in ("f", "i", "u") for n in (8, 16, 32, 64)),
                 "bf16", "c64", "c128"]
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        hint = f"; did you mean: {', '.join(close)}?" if close else ""
        raise UsageError(f"unknown dtype {name!r}{hint}") from None


def _spec(text: str):
    import jax

    match = re.fullmatch(r"\s*(\w+)\s*\[([\d,\s]*)\]\s*", text)
    if match is None:
        raise UsageError(f"bad shape {text!r}; write e.g. f32[128,784] (or float32[128,784]), "
                         "or i32[] for a scalar")
    dims = tuple(int(d) for d in match[2].replace(" ", "").split(",") if d)
    return jax.ShapeDtypeStruct(dims, _dtype(match[1]))


def _function(target: str):
    """A juju.jit function of what `target` names."""
    import juju
    from juju.jit import JitFunction

    fn = _resolve(target)
    if isinstance(fn, JitFunction):
        return fn
    if not callable(fn):
        raise UsageError(f"{target} is a {type(fn).__name__}, not a function")
    return juju.jit(fn)


def _arguments(args, fn) -> list:
    """The positional arguments the command line gives `fn`, checked against
    its signature."""
    import inspect

    if args.args:
        if args.shapes:
            raise UsageError("give shapes or --args, not both")
        arguments = list(_resolve(args.args)())
    else:
        arguments = [_spec(s) for s in args.shapes]
    try:
        signature = inspect.signature(fn.fun)
    except (TypeError, ValueError):  # not inspectable: the trace will tell
        return arguments
    try:
        signature.bind(*arguments)
    except TypeError as exc:
        raise UsageError(f"{args.function}{signature} cannot take {len(arguments)} "
                         f"positional argument(s): {exc}") from None
    return arguments


def _explain(args) -> int:
    import json

    from juju.recording import table

    fn = _function(args.function)
    choices = fn.lowered_for(tuple(_arguments(args, fn)), {}).explain()
    if getattr(args, "json", False):
        print(json.dumps({"function": args.function,
                          "choices": [dataclasses.asdict(c) for c in choices],
                          "notes": list(choices.notes)}, indent=2))
    else:
        print(table(choices))
    return 0


def _precompile(args) -> int:
    import time

    import juju
    from juju import cache

    if not cache.enabled():
        print("juju precompile: the persistent cache is disabled (JUJU_DISABLE_CACHE)",
              file=sys.stderr)
        return 2
    fn = _function(args.function)
    arguments = _arguments(args, fn)
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
