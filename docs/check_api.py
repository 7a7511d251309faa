"""mkdocs hook (`hooks:` in mkdocs.yml): the API reference is complete.

Under `mkdocs build --strict` each finding fails the build:

- a public name (of `juju.__all__`, or of a module listed in `MODULES`) or
  any of its public members has no docstring; a class's data attributes may
  instead be described in its docstring's `Attributes:` section;
- a docstring's `Args:` section leaves out a parameter (griffe already
  reports a documented parameter that does not exist);
- a name of `juju.__all__` (or of `MODULES`, `RETURNED`) appears on no page
  of docs/api (`::: juju.NAME`).

It reads the sources with griffe, as mkdocstrings does: nothing is imported.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import griffe

log = logging.getLogger("mkdocs.plugins.juju_api")

# Modules documented in full besides juju's top-level names (docs/api/hooks.md
# and errors.md render them); and classes reached only as return values.
MODULES = ("juju.hookspecs", "juju.plugins", "juju.errors", "juju.serving")
RETURNED = ("juju.jit.JitFunction",)


def on_pre_build(config) -> None:
    root = Path(config.config_file_path).parent
    handler = config.plugins["mkdocstrings"].config["handlers"]["python"]
    paths = [str(root / p) for p in handler["paths"]]
    options = handler["options"]
    juju = griffe.load("juju", search_paths=paths, docstring_parser=options["docstring_style"],
                       docstring_options=options["docstring_options"])
    problems: list[str] = []
    seen: set[str] = set()
    for name in juju.exports or ():
        _check(_public_object(juju, name), problems, seen)
    for path in MODULES + RETURNED:
        _check(juju[path.removeprefix("juju.")], problems, seen)
    problems += _unlisted(juju, root / config.docs_dir / "api")
    for problem in problems:
        log.warning("API reference: %s", problem)


def _public_object(module, name: str):
    """The object `juju.NAME` names (its alias resolved). `juju.jit` is both a
    submodule and the function it re-exports: the function is meant."""
    obj = module[name]
    obj = obj.final_target if obj.is_alias else obj
    if obj.is_module and name in obj.members:
        obj = obj[name]
        obj = obj.final_target if obj.is_alias else obj
    return obj


def _check(obj, problems: list[str], seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if not obj.docstring and not obj.is_module:
        problems.append(f"{obj.path} has no docstring")
    if obj.is_function or obj.is_class:
        _check_args(obj, problems)
    if not (obj.is_module or obj.is_class):
        return
    described = _attributes_section(obj) if obj.is_class else set()
    for name, member in obj.members.items():
        if name.startswith("_") or member.is_alias:
            continue
        if member.is_attribute and "property" not in member.labels:
            if member.path in seen:
                continue
            seen.add(member.path)
            if not member.docstring and name not in described:
                problems.append(f"{member.path} (an attribute) is not documented: give it "
                                f"a docstring or describe it under its class's Attributes:")
            continue
        _check(member, problems, seen)


def _sections(obj, kind):
    docstring = obj.docstring
    if obj.is_class and "__init__" in obj.members:  # merge_init_into_class
        init = obj.members["__init__"].docstring
        found = [s for s in init.parsed if s.kind is kind] if init else []
    else:
        found = []
    return found + ([s for s in docstring.parsed if s.kind is kind] if docstring else [])


def _attributes_section(cls) -> set[str]:
    return {a.name for s in _sections(cls, griffe.DocstringSectionKind.attributes)
            for a in s.value}


def _check_args(obj, problems: list[str]) -> None:
    """An Args: section, where there is one, names every parameter."""
    sections = _sections(obj, griffe.DocstringSectionKind.parameters)
    if not sections:
        return
    documented = {p.name.lstrip("*") for s in sections for p in s.value}
    function = obj.members.get("__init__") if obj.is_class else obj
    if function is None or not function.is_function:
        return
    for parameter in function.parameters:
        if parameter.name in ("self", "cls") or parameter.name in documented:
            continue
        if parameter.kind in (griffe.ParameterKind.var_positional,
                              griffe.ParameterKind.var_keyword):
            continue
        problems.append(f"{obj.path}: the Args section leaves out '{parameter.name}'")


def _unlisted(juju, api_dir: Path) -> list[str]:
    """Names of `juju.__all__` that no `::: path` directive of docs/api renders."""
    rendered = set()
    for page in api_dir.glob("*.md"):
        rendered |= set(re.findall(r"^:::\s*(\S+)", page.read_text(), re.MULTILINE))
    missing = []
    for name in juju.exports or ():
        target = _public_object(juju, name)
        module = target.path.rsplit(".", 1)[0]
        if not {f"juju.{name}", target.path, module} & rendered:
            missing.append(f"juju.{name} is on no page of docs/api (add `::: juju.{name}`)")
    missing += [f"{path} is on no page of docs/api" for path in MODULES + RETURNED
                if path not in rendered]
    return missing
