"""Parallel regions of a generated kernel, as one task function.

`Emitter.split` runs a loop's blocks on the cores through `sync_parallelize`,
which is inlined where it is called, task group and coroutine: ~0.3 s of
Mojo build per call, 70 of the 118 s build of a transformer encoder's
training step with 230 parallel regions (48 s with one call). So the
regions' bodies go into one closure, `run_task`, defined before the
kernel's loops, run on the cores by one `launch_tasks` that is not inlined:
a region stores its number and the loop-local integers it reads (loop
indices, block sizes, clamped offsets) in `task_regs`, then calls
`launch_tasks`; `run_task` branches to its body. The closure captures only
what is defined before it (pointers); a region that reads a local that is
not an integer keeps a closure of its own.
"""

from __future__ import annotations

import re

#: The task index (which block of the range) in a region's body.
TASK_INDEX = "task_t"
#: Depth (4-space levels) of a region's body inside `run_task`'s branch.
BODY_DEPTH = 6
#: Depth of `run_task`'s definition: that of the kernel's statements.
DISPATCH_DEPTH = 3

_NAME = re.compile(r"\b[A-Za-z_]\w*\b")
_DEFINED = re.compile(r"\bvar (\w+)\s*=\s*(.*)|\bfor (\w+) in\b")
_INT_CALLS = {"min", "max", "kernel_cores"}


def definitions(line: str):
    """(name, expression) of what a statement defines: a `var`, or a loop
    index (expression "for")."""
    for m in _DEFINED.finditer(line):
        yield (m[1], m[2].strip()) if m[1] else (m[3], "for")


def free_ints(body: list[str], defined: dict) -> list[str] | None:
    """The locals `body` reads that were defined before it (`defined`: name
    -> expression), or None where one of them may not be an integer."""
    text = "\n".join(body)
    inner = {name for line in body for name, _ in definitions(line)}
    free = sorted(n for n in set(_NAME.findall(text)) - inner if n in defined)
    return free if all(_is_int(n, defined, 0) for n in free) else None


def _is_int(name: str, defined: dict, depth: int) -> bool:
    expr = defined.get(name)
    if expr is None or depth > 8:
        return False
    if expr == "for" or re.fullmatch(r"Int\(.*\)", expr):
        return True
    if not re.fullmatch(r"[\w\s+\-*/%(),]*", expr):
        return False
    return all(t.isdigit() or t in _INT_CALLS or _is_int(t, defined, depth + 1)
               for t in re.findall(r"\w+", expr))


def launch(slots: list[str], number: int, cores: str) -> list[str]:
    """The statements running region `number` on `cores` tasks."""
    stores = [f"task_regs[{i}] = {v}" for i, v in enumerate([str(number), *slots])]
    return [*stores, f"launch_tasks({cores})"]


def dispatcher(regions: list[tuple[list[str], list[str]]]) -> list[str]:
    """`run_task` and the registers it reads, before the kernel's loops
    (lines indented for `DISPATCH_DEPTH`); `regions`: (locals, body lines
    indented for `BODY_DEPTH`)."""
    if not regions:
        return []
    pad = "    " * DISPATCH_DEPTH
    size = 1 + max(len(slots) for slots, _ in regions)
    lines = [f"var task_regs_list = List[Int](length={size}, fill=0)",
             "var task_regs = task_regs_list.unsafe_ptr()",
             f"def run_task({TASK_INDEX}: Int) {{var}}:",
             "    with FlushDenormals():",
             "        var task_number = task_regs[0]"]
    for number, (slots, body) in enumerate(regions):
        lines.append(f"        {'if' if number == 0 else 'elif'} task_number == {number}:")
        lines += [f"            var {v} = task_regs[{i + 1}]" for i, v in enumerate(slots)]
        lines += [line[len(pad):] for line in body]
    lines += ["@no_inline",
              "def launch_tasks(cores: Int) raises {var}:",
              "    sync_parallelize(run_task, cores)"]
    return [pad + line for line in lines]


def reindent(body: list[str], depth: int) -> list[str]:
    """`body` (indented for BODY_DEPTH) indented for `depth`."""
    shift = depth - BODY_DEPTH
    if shift >= 0:
        return ["    " * shift + line for line in body]
    return [line[4 * -shift:] for line in body]
