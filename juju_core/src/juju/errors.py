"""Every error juju raises on purpose derives from `JujuError`.

Messages name what is wrong and what to do next; errors raised while lowering
chain the original exception as their `__cause__`.
"""

from __future__ import annotations

from dataclasses import dataclass


class JujuError(Exception):
    """Base class of juju's own errors."""


@dataclass(frozen=True)
class MissingRule:
    """One equation that no installed pack can lower (see `MissingRuleError`).

    Attributes:
        primitive: the primitive's name.
        equation: the equation's text.
        source: the user's source line that emitted it.
        hint: the next step: the pack that provides a rule, or how to add one.
    """

    primitive: str
    equation: str
    source: str
    hint: str

    def describe(self) -> str:
        """The entry's lines in the error message."""
        return (
            f"  - primitive '{self.primitive}' at {self.source}\n"
            f"      equation: {self.equation}\n"
            f"      {self.hint}"
        )


class MissingRuleError(JujuError, NotImplementedError):
    """Raised before any graph is built when equations have no lowering rule.

    Lists every gap at once (sub-jaxprs included), each with its primitive,
    equation, user source line and the pack that could provide it.

    Attributes:
        missing: a `MissingRule` for each equation without a rule.
        installed_packs: the names of the packs that were loaded.
    """

    def __init__(self, missing: list[MissingRule], installed_packs: list[str]):
        self.missing = missing
        self.installed_packs = installed_packs
        primitives = sorted({m.primitive for m in missing})
        lines = [
            f"juju cannot lower {len(missing)} equation(s): no rule for "
            + ", ".join(f"'{p}'" for p in primitives)
            + "."
        ]
        lines += [m.describe() for m in missing]
        lines.append(
            "Installed packs: " + (", ".join(installed_packs) or "none")
            + ". Run `python -m juju` to see them, install the pack named above, "
            "or register a rule for the primitive (see docs/writing-a-pack.md)."
        )
        super().__init__("\n".join(lines))

    def __reduce__(self):
        return (type(self), (self.missing, self.installed_packs))


class LoweringError(JujuError):
    """A rule raised, or returned values of the wrong shape or dtype.

    The message names the primitive, the user's source line, the equation,
    the rule and its pack. The original exception is the `__cause__`.

    Attributes:
        primitive: the name of the primitive whose rule failed.
        source: the user's source line of the equation.
    """

    @classmethod
    def at(cls, eqn, rule, problem: str | None = None) -> LoweringError:
        """The error for equation `eqn` lowered by `rule` (a `juju.Rule` or
        None), with `problem` as the reason; the caller chains the cause
        (`raise LoweringError.at(eqn, rule) from exc`)."""
        from juju._compat import equation_text, source_line

        where = source_line(eqn)
        supplier = f"{rule.pack} {rule.pack_version}" if rule is not None else "?"
        rule_name = getattr(rule.fn, "__qualname__", repr(rule.fn)) if rule else "?"
        text = (
            f"lowering '{eqn.primitive.name}' at {where} failed"
            + (f": {problem}" if problem else "")
            + f"\n  equation: {equation_text(eqn)}"
            + f"\n  rule: {rule_name} (from pack {supplier})"
        )
        err = cls(text)
        err.primitive = eqn.primitive.name
        err.source = where
        return err


class RuleConflictError(JujuError):
    """Two packs registered rules for one primitive at the same priority.

    Raised when an equation needs that primitive (functions that never use it
    still run); `python -m juju` lists every conflict.
    """


class UnsupportedDtypeError(JujuError, TypeError):
    """A value's dtype has no MAX equivalent (e.g. complex numbers)."""


class InvalidProgramError(JujuError, TypeError):
    """A program jax.jit rejects as well, for the same reason (jax's own
    TypeError text), e.g. `jax.jvp` or `jax.linearize` of a `custom_vjp`
    function. Rules raise it; juju passes it to the caller unchanged."""


class EngineUnavailableError(JujuError, RuntimeError):
    """The requested device (e.g. a GPU) is not present on this machine."""


class CompileError(JujuError, RuntimeError):
    """MAX failed to compile a lowered graph; the reason is in the message."""


class CompilerCrashError(CompileError):
    """MAX's compiler crashed (or was killed, or timed out) in a compile
    worker process; the caller's process is unaffected and its next compile
    starts a new worker.

    Attributes:
        signal: the signal's name (`"SIGSEGV"`, `"SIGKILL"`, ...), or None
            if the worker exited with a status instead.
        graph_path: the saved MLIR text of the graph, to reproduce the
            crash with the command in the message.
    """

    signal: str | None = None
    graph_path = None


class MaxUnavailableWarning(RuntimeWarning):
    """A tiered function's MAX compile failed: XLA goes on serving that
    signature. The message names the function and the compile's error."""


class PackError(JujuError):
    """A pack misbehaved: a hook raised or returned something that is not what
    its hookspec promises, or a jaxpr rewrite or kernel library failed. The
    message names the pack and the hook; the cause is chained."""


class PackLoadError(PackError, ImportError):
    """A pack's entry point failed to import; other packs still load."""


class ExportError(JujuError, ValueError):
    """`juju.export` cannot make a self-contained artifact of this function
    (host callbacks, or parts that only jax can run); the message says which."""


class ArtifactError(JujuError, ValueError):
    """An exported artifact is missing, incomplete, corrupt or edited; the
    message names the file."""


class ArtifactVersionError(ArtifactError):
    """An artifact needs another MAX version, or a newer juju, than the one
    serving it."""


class InputMismatchError(JujuError, TypeError):
    """An exported function was called with arguments of another pytree
    structure, shape or dtype than it was exported for."""


class ProfileError(JujuError, RuntimeError):
    """`juju.profile` cannot time this program as asked (abstract arguments,
    a graph that failed to run); the message says which, the cause is chained."""
