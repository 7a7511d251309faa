"""JAX's primitive harnesses, run through `juju.jit` and compared with `jax.jit`.

This module is imported by the worker subprocesses (`run.py --worker`) and by
the parent only for the cheap parts (listing, sampling). Everything that
touches MAX happens in a worker, so a crash in MAX cannot take the runner down.
"""

from __future__ import annotations

import functools
import hashlib
import json
import traceback

import numpy as np

STATUSES = ("pass", "wrong", "error", "unsupported", "skip")

# Tolerances (rtol, atol) per float dtype name; ints and bools compare exactly.
TOLERANCES = {
    "float64": (1e-9, 1e-12),
    "float32": (2e-5, 2e-6),
    "float16": (4e-3, 1e-3),
    "bfloat16": (3e-2, 1e-2),
}


def enable_x64():
    import jax

    jax.config.update("jax_enable_x64", True)


@functools.cache
def all_harnesses() -> dict:
    """fullname -> Harness, for every harness JAX runs on CPU (x64 enabled)."""
    enable_x64()
    from jax._src.internal_test_util import test_harnesses

    return {h.fullname: h for h in test_harnesses.all_harnesses if h.filter("cpu")}


def dtype_name(h) -> str:
    try:
        return np.dtype(h.dtype).name
    except TypeError:
        return str(h.dtype)


def listing() -> list[tuple[str, str]]:
    """(group, fullname) for every harness, in definition order."""
    return [(h.group_name, name) for name, h in all_harnesses().items()]


def _stable_key(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()


def sample(per_group: int, groups=None) -> list[str]:
    """A fixed, deterministic sample: in each group, the `per_group` harnesses
    whose names hash lowest (stable across runs, machines and JAX's order),
    real dtypes first."""
    harnesses = all_harnesses()
    by_group: dict[str, list[str]] = {}
    for group, name in listing():
        if groups is None or group in groups:
            by_group.setdefault(group, []).append(name)
    chosen = []
    for group in sorted(by_group):
        names = sorted(by_group[group], key=_stable_key)
        # Real dtypes first: a group's most common use (complex numbers have
        # their own test file, tests/test_complex.py).
        real = [n for n in names if not dtype_name(harnesses[n]).startswith("complex")]
        chosen += (real or names)[:per_group]
    return chosen


# --- the worker side ---------------------------------------------------------


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {str(exc).strip()}"
    return " ".join(text.split())[:limit]


def _classify_exception(exc: BaseException) -> tuple[str, str]:
    """(status, reason) for an exception raised while lowering or compiling."""
    import juju

    if isinstance(exc, juju.MissingRuleError):
        prims = sorted({m.primitive for m in exc.missing})
        return "unsupported", "no rule for " + ", ".join(prims)
    chain, seen = [], set()
    cur = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__
    where = ""
    for e in chain:
        if isinstance(e, juju.LoweringError):
            where = f"{getattr(e, 'primitive', '?')}: "
            break
    root = chain[-1]
    if any(isinstance(e, juju.UnsupportedDtypeError) for e in chain):
        err = next(e for e in chain if isinstance(e, juju.UnsupportedDtypeError))
        return "unsupported", where + str(err).split(":")[0].strip()
    if isinstance(root, NotImplementedError):
        return "unsupported", where + _short(root, 200)
    if isinstance(exc, juju.CompileError):
        return "error", "MAX compile: " + _short(exc, 250)
    return "error", where + _short(root)


def to_numpy(value) -> np.ndarray:
    """A juju output (MAX buffer or array) as numpy, bfloat16 included."""
    from max.driver import Buffer
    from max.dtype import DType

    if isinstance(value, Buffer):
        if value.dtype == DType.bfloat16:
            import ml_dtypes

            return value.view(DType.uint16, value.shape).to_numpy().view(ml_dtypes.bfloat16)
        return value.to_numpy()
    return np.asarray(value)


def to_input(value):
    """Harness arguments for juju. bfloat16 arrays and 0-d bools go in as MAX
    buffers built here: MAX's DLPack import rejects bfloat16, and its
    `Buffer.view` (used for bools) fails on rank 0."""
    import ml_dtypes

    array = np.asarray(value) if isinstance(value, np.ndarray | np.generic) else None
    if array is None:
        return value
    special = {np.dtype(ml_dtypes.bfloat16): (np.uint16, "bfloat16"),
               np.dtype(np.bool_): (np.uint8, "bool")}.get(array.dtype)
    if special is None or (array.dtype == np.bool_ and array.ndim):
        return value
    from max.driver import Buffer
    from max.dtype import DType

    raw_dtype, name = special
    raw = np.array(array.view(raw_dtype).reshape(-1), order="C")
    if raw.size == 0:
        return value
    return Buffer.from_numpy(raw).view(getattr(DType, name), array.shape)


def compare(expected: list, got: list, dtype: str) -> str | None:
    """None when `got` matches `expected`; otherwise why not."""
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    for i, (e, g) in enumerate(zip(expected, got)):
        e = np.asarray(e)
        g = to_numpy(g)
        if e.shape != g.shape:
            return f"output {i}: shape {g.shape}, expected {e.shape}"
        if e.dtype != g.dtype:
            return f"output {i}: dtype {g.dtype}, expected {e.dtype}"
        if e.dtype.kind in "biu":
            if not np.array_equal(e, g):
                bad = int(np.sum(e != g))
                return f"output {i} ({e.dtype}): {bad}/{e.size} elements differ"
            continue
        part = np.finfo(e.dtype).dtype if e.dtype.kind == "c" else e.dtype
        rtol, atol = TOLERANCES.get(part.name, TOLERANCES["float16"])
        wide = np.complex128 if e.dtype.kind == "c" else np.float64  # |difference| for complex
        e64, g64 = e.astype(wide), g.astype(wide)
        ok = np.isclose(g64, e64, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            k = int(np.argmin(ok.ravel()))
            return (
                f"output {i} ({e.dtype}): {int((~ok).sum())}/{e.size} elements differ, "
                f"e.g. got {g64.ravel()[k]!r} expected {e64.ravel()[k]!r}"
            )
    return None


def compare_decomposition(group: str, params: dict, args: list, expected: list,
                          got: list) -> str | None:
    """eigh and svd: eigenvectors and singular vectors are unique only up to a
    sign (a phase when complex), and LAPACK's are what its iteration happens to
    give, so they are checked by what defines them: the values match jax.jit
    normwise (Weyl: a backward-stable method fixes each eigenvalue or singular
    value to rtol * the largest one), and the vectors reconstruct the input
    (max column residual / ||A||) and are orthonormal (max |V^H V - I|), each
    within the dtype's rtol. Shapes and dtypes must match as elsewhere."""
    if len(expected) != len(got):
        return f"{len(got)} outputs, expected {len(expected)}"
    got = [to_numpy(g) for g in got]
    for i, (e, g) in enumerate(zip(expected, got)):
        if e.shape != g.shape or e.dtype != g.dtype:
            return f"output {i}: {g.dtype}{g.shape}, expected {e.dtype}{e.shape}"
    part = np.finfo(expected[0].dtype).dtype.name
    rtol, atol = TOLERANCES[part]
    a = np.asarray(args[0]).astype(np.complex128 if np.iscomplexobj(args[0]) else np.float64)
    values_at = 1 if group == "eigh" else 0
    e_val, g_val = (x.astype(np.float64) for x in (expected[values_at], got[values_at]))
    scale = np.max(np.abs(e_val), axis=-1, keepdims=True, initial=0.0)
    bad = np.abs(g_val - e_val) > rtol * scale + atol
    if bad.any():
        k = int(np.argmax(bad.ravel()))
        return (f"values: {int(bad.sum())}/{bad.size} differ (normwise), e.g. got "
                f"{g_val.ravel()[k]!r} expected {e_val.ravel()[k]!r}")
    if a.size == 0 or (group == "svd" and not params["compute_uv"]):
        return None
    norm = np.linalg.norm(a, ord=2, axis=(-2, -1))[..., None] if a.ndim >= 2 else 1.0
    norm = np.maximum(norm, np.finfo(np.float64).tiny)
    if group == "eigh":
        v = got[0].astype(a.dtype)
        residual = np.linalg.norm(a @ v - v * g_val[..., None, :], axis=-2) / norm
        bases = {"eigenvectors": v}
    else:
        u, vt = (x.astype(a.dtype) for x in got[1:])
        k = g_val.shape[-1]
        rebuilt = (u[..., :, :k] * g_val[..., None, :]) @ vt[..., :k, :]
        residual = np.linalg.norm(a - rebuilt, axis=-2) / norm
        bases = {"U": u, "V": np.conj(np.swapaxes(vt, -1, -2))}
    if residual.max() > rtol:
        return f"vectors: reconstruction residual {residual.max():.3g} > {rtol}"
    for name, q in bases.items():
        gram = np.conj(np.swapaxes(q, -1, -2)) @ q
        off = np.abs(gram - np.eye(gram.shape[-1])).max(initial=0.0)
        if off > rtol:
            return f"{name}: max |V^H V - I| = {off:.3g} > {rtol}"
    return None


DECOMPOSITIONS = ("eigh", "svd")


class Worker:
    """Runs a list of harnesses: prepare (jax.jit + juju lowering), compile
    all together, execute and compare. Writes one JSON line per event to
    `out`, flushed, so the parent can tell where a crash happened."""

    def __init__(self, out):
        self.out = out

    def emit(self, **record):
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    def result(self, name, status, reason=""):
        self.emit(id=name, status=status, reason=reason)

    def run(self, names: list[str]):
        enable_x64()
        import jax
        import juju

        harnesses = all_harnesses()
        ready = []
        for name in names:
            h = harnesses[name]
            self.emit(phase="prepare", ids=[name])
            try:
                args = h.dyn_args_maker(np.random.RandomState(0))
                expected = jax.tree_util.tree_leaves(jax.jit(h.dyn_fun)(*args))
                expected = [np.asarray(x) for x in expected]
            except Exception as exc:
                self.result(name, "skip", "jax.jit fails: " + _short(exc, 150))
                continue
            try:
                fn = juju.jit(h.dyn_fun)
                inputs = [to_input(a) for a in args]
                low = fn.lower(*inputs)
                low.graph  # build it alone: lowering errors stay with their harness
            except Exception as exc:
                self.result(name, *_classify_exception(exc))
                continue
            ready.append((name, fn, low, inputs, expected, h, args))
        self._compile(ready)

    def _compile(self, ready):
        if not ready:
            return
        import juju

        self.emit(phase="compile", ids=[r[0] for r in ready])
        try:
            juju.compile_all([r[2] for r in ready])
        except Exception as exc:
            if len(ready) == 1:
                self.result(ready[0][0], *_classify_exception(exc))
                return
            half = len(ready) // 2
            self._compile(ready[:half])
            self._compile(ready[half:])
            return
        for name, fn, low, inputs, expected, h, args in ready:
            self.emit(phase="execute", ids=[name])
            try:
                import jax

                got = jax.tree_util.tree_leaves(fn(*inputs))
                if h.group_name in DECOMPOSITIONS:
                    problem = compare_decomposition(h.group_name, h.params, args,
                                                    expected, got)
                else:
                    problem = compare(expected, got, dtype_name(h))
            except Exception as exc:
                self.result(name, "error", "execute: " + _short(exc))
                continue
            if problem is None:
                self.result(name, "pass")
            else:
                self.result(name, "wrong", problem)


def worker_main(ids_file: str, out_file: str) -> int:
    with open(ids_file) as f:
        names = json.load(f)
    with open(out_file, "a", buffering=1) as out:
        try:
            Worker(out).run(names)
        except Exception:
            out.write(json.dumps({"fatal": traceback.format_exc()[-2000:]}) + "\n")
            return 1
    return 0
