"""juju: run JAX programs as Modular MAX graphs.

    import juju, jax.numpy as jnp

    @juju.jit
    def f(x, y):
        return jnp.sin((x + y) ** 2)

    f(5, 10).to_numpy()   # -0.93009484

Lowering rules come from packs (`juju-ops-lax`, `juju-ops-nn`,
`juju-kernels-mojo`, or your own) found through the `juju` entry point group;
`python -m juju` lists them, and `juju.explain(f, *args)` (or `python -m juju
explain`) says which rule of which pack lowers each equation of a program.
"""

from juju.errors import (
    ArtifactError,
    ArtifactVersionError,
    CompileError,
    CompilerCrashError,
    EngineUnavailableError,
    ExportError,
    InputMismatchError,
    InvalidProgramError,
    JujuError,
    LoweringError,
    MaxUnavailableWarning,
    MissingRuleError,
    PackError,
    PackLoadError,
    ProfileError,
    RuleConflictError,
    UnsupportedDtypeError,
)

try:  # a serving machine may have MAX and no jax: `from juju import serving` still works
    import jax as _jax  # noqa: F401
except ModuleNotFoundError as _missing:
    if _missing.name not in ("jax", "jaxlib"):
        raise
    _HAS_JAX = False
else:
    _HAS_JAX = True
    del _jax

if _HAS_JAX:
    from juju.arguments import to_jax, to_numpy
    from juju.context import LoweringContext
    from juju.engine import Engine, cpu_engine, gpu_engine
    from juju.explain import explain
    from juju.hookspecs import hookimpl
    from juju.jit import jit, make_max_graph
    from juju.lowering_helpers import lower_fun, on_parts
    from juju.plugins import KernelLibrary
    from juju import primitives
    from juju.primitive import Primitive
    from juju.recording import Explanation, RuleChoice
    from juju.registry import ALL_DTYPES, Priority, Registry, Rule, RuleSet, direct
    from juju.stages import Compiled, Lowered, Traced, compile_all
    from juju.exporting import Exported, export
    from juju.profiling import Profile, ProfileEntry, profile

__version__ = "0.1.0"

__all__ = [
    "jit", "make_max_graph", "compile_all", "to_numpy", "to_jax", "Traced", "Lowered", "Compiled",
    "Primitive", "explain", "Explanation", "RuleChoice", "primitives",
    "Engine", "cpu_engine", "gpu_engine", "LoweringContext", "Rule", "RuleSet",
    "Registry", "Priority", "ALL_DTYPES", "direct", "lower_fun", "on_parts", "hookimpl", "KernelLibrary",
    "JujuError", "MissingRuleError", "LoweringError", "RuleConflictError",
    "UnsupportedDtypeError", "EngineUnavailableError", "CompileError", "CompilerCrashError",
    "MaxUnavailableWarning", "PackError", "PackLoadError",
    "export", "Exported", "ExportError", "ArtifactError", "ArtifactVersionError",
    "InputMismatchError", "InvalidProgramError", "profile", "Profile", "ProfileEntry", "ProfileError",
]


def __getattr__(name):
    if not _HAS_JAX and name in __all__:
        raise ImportError(
            f"juju.{name} needs jax, which is not installed here. Without jax juju only "
            "serves exported functions: `from juju import serving`")
    raise AttributeError(f"module 'juju' has no attribute {name!r}")
