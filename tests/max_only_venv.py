"""A fresh virtual environment holding `max` and `numpy` (and what they need)
plus juju-core's sources, and no jax: where `juju.serving` must work.

The packages are linked from this interpreter's environment (no download):
the distributions in the requirement closure of `max` and `numpy`, read from
their metadata, each linked by its top-level names. juju-core goes in as
`pip install --no-deps` would put it: its `juju` package only.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

JUJU_PACKAGE = Path(__file__).resolve().parent.parent / "juju_core" / "src" / "juju"


def _closure(roots: list[str]) -> list[metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        dist = seen[key] = metadata.distribution(name)
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                todo.append(re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0))
    return list(seen.values())


def make(target: Path, roots=("max", "numpy")) -> Path:
    """Create the venv in `target` (no pip in it); returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(target)],
                   check=True)
    python = target / "bin" / "python"
    site = Path(subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    tops = {}
    for dist in _closure(list(roots)):
        for file in dist.files or []:
            top = Path(str(file)).parts[0]
            if top != "..":  # scripts outside site-packages
                tops[top] = dist.locate_file(top)
    for name, source in tops.items():
        if not (site / name).exists():
            os.symlink(source, site / name)
    os.symlink(JUJU_PACKAGE, site / "juju")
    return python
