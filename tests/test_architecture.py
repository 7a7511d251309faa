"""The core's structure stays as docs/architecture.md draws it: no import
cycle in juju_core or benchmarks (imports inside functions count too), and
no juju_core module past the size bound without a stated reason."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"juju": ROOT / "juju_core" / "src" / "juju", "benchmarks": ROOT / "benchmarks"}
MAX_LINES = 500
# Modules allowed past MAX_LINES, each one concern that reads better whole
# (docs/architecture.md says why). None today.
LONG_MODULES: dict[str, str] = {
    "juju.host": "staged programs: their plan, steps and staged Lowered (docs/architecture.md)",
}


def modules(package: str, folder: Path) -> dict[str, Path]:
    found = {}
    for path in folder.rglob("*.py"):
        parts = path.relative_to(folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((package, *parts))] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of `known` that `name` imports, anywhere in its source."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + is_package]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known}
    # A package's __init__ re-exports its modules: an import of the package
    # itself (`from juju import x`) is an edge to x, not to __init__.
    return found - {name.split(".")[0]} if name != name.split(".")[0] else found


def import_graph(package: str) -> dict[str, set[str]]:
    known = modules(package, PACKAGES[package])
    return {name: imports(name, path, known) for name, path in known.items()}


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package):
    graph = import_graph(package)
    graph.pop(package, None)  # the package's __init__: the re-exports on top
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        pytest.fail(f"import cycle in {package}: {' -> '.join(error.args[1])}")
    assert set(order) >= set(graph)


def test_the_walker_sees_imports_inside_functions(tmp_path):
    """The check above would miss cycles if the walk missed an import."""
    (tmp_path / "a.py").write_text("def f():\n    from pkg import b\n")
    (tmp_path / "b.py").write_text("from pkg.a import f\n")
    known = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    assert imports("pkg.a", known["pkg.a"], known) == {"pkg.b"}
    assert imports("pkg.b", known["pkg.b"], known) == {"pkg.a"}


def test_core_modules_stay_readable_in_one_sitting():
    long = {name: sum(1 for _ in path.open())
            for name, path in modules("juju", PACKAGES["juju"]).items()}
    too_long = {name: n for name, n in long.items()
                if n > MAX_LINES and name not in LONG_MODULES}
    assert not too_long, (f"past {MAX_LINES} lines: {too_long}; split the module, or name it "
                          "in LONG_MODULES with the reason in docs/architecture.md")
