"""`python -m juju`: the installed packs, their rules, and who lowers what.

    python -m juju                 # packs, versions, rule counts, load errors
    python -m juju which sin       # the rules for a primitive, winner first (or the fallback)
    python -m juju rules [PACK]    # every primitive a pack lowers
"""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m juju", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    which = sub.add_parser("which", help="which pack lowers a primitive")
    which.add_argument("primitive")
    rules_cmd = sub.add_parser("rules", help="list the primitives each pack lowers")
    rules_cmd.add_argument("pack", nargs="?")
    args = parser.parse_args(argv)

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
            return 1
        for prim in found:
            print(f"{prim.name}:")
            for i, rule in enumerate(registry.rules_for(prim)):
                tag = "wins unless guarded out" if i == 0 and rule.guard else ("wins" if i == 0 else "fallback")
                print(f"  {rule.describe()}  <- {tag}")
        return 0

    if args.command == "rules":
        for pack, rules in sorted(registry.with_provenance().items()):
            if args.pack and pack != args.pack:
                continue
            names = sorted({r.primitive.name for r in rules})
            print(f"{pack} ({len(names)} primitives): {', '.join(names)}")
        return 0

    print(f"{'pack':<8} {'version':<10} {'rules':>5}  origin")
    for info in registry.packs:
        status = "" if info.loaded else f"  FAILED: {info.error}"
        libs = f"  kernels: {', '.join(info.libraries)}" if info.libraries else ""
        print(f"{info.name:<8} {info.version:<10} {info.rule_count:>5}  {info.origin}{libs}{status}")
    print(f"{len(registry.primitives())} primitives lowered; registry {registry.fingerprint}")
    return 0


def _print_fallback(name, registry) -> bool:
    """For a primitive only the core's fallback lowers, say so."""
    from juju import coverage

    primitive = coverage.find(name)
    if primitive is None:
        return False
    status, detail = coverage.classify(primitive, registry)
    if status != "fallback":
        return False
    (rule,) = registry.catch_all()
    print(f"{name}: no pack has a rule; lowered via its JAX implementation ({detail}),")
    print(f"  traced into the graph by {rule.describe()}")
    return True


if __name__ == "__main__":
    sys.exit(main())
