"""juju-kernels-mojo: kernels against jax.jit, the kernel build cache, and a
GPU compile (without a GPU). All CPU graphs compile in ONE MAX compilation."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.extend import random as jex_random
from max.graph import DeviceRef

import juju
import juju_kernels_mojo as jk
from juju._compat import sub_jaxprs_of_params
from juju_kernels_mojo import build, lax_rules
from tests.util import assert_same

INT_DTYPES = [np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32]
FLOAT_DTYPES = [np.float32, np.float16]
rng = np.random.default_rng(0)


def bit_ops(a, b, s):
    three = np.array(3, a.dtype)
    return {
        "and": a & b,
        "or": a | b,
        "xor": a ^ b,
        "not": ~a,
        "shift_left": lax.shift_left(a, b),
        "shift_right_logical": lax.shift_right_logical(a, b),
        "shift_right_arithmetic": lax.shift_right_arithmetic(a, b),
        "population_count": lax.population_count(a),
        "clz": lax.clz(a),
        # a rank-0 literal beside an array, as jax.random emits
        "literal_shift": lax.shift_right_logical(a, three),
        "literal_or": lax.bitwise_or(a, three),
        # rank 2 and rank 0
        "rank2": lax.shift_right_arithmetic(a.reshape(8, 8), b.reshape(8, 8)),
        "scalar": (lax.population_count(s), lax.clz(s), ~s, s ^ s),
    }


def bit_inputs(dtype):
    info = np.iinfo(dtype)
    bits = info.bits
    a = rng.integers(info.min, info.max, size=64, endpoint=True, dtype=dtype)
    a[:6] = [info.min, info.max, 0, 1, info.max // 2, info.min + 1]
    low = -3 if info.min < 0 else 0
    b = rng.integers(low, bits + 4, size=64, dtype=np.int64)
    b[:6] = [0, bits - 1, bits, bits + 3, 1, low]
    return a, b.astype(dtype), dtype(info.min + 5)


def new_primitives(x, y, z):
    return {
        "add_one": jk.add_one(x),
        "fma": jk.fma(x, y, z),
        "fma_rank3": jk.fma(x.reshape(2, 3, 4), y.reshape(2, 3, 4), z.reshape(2, 3, 4)),
        "add_one_scalar": jk.add_one(x[0, 0]),
    }


def logsumexp_ops(x):
    return jk.row_logsumexp(x), jk.row_logsumexp(x[0]), jk.row_logsumexp(x.reshape(2, 3, 4))


def softmax_ops(x):
    """jax.nn.softmax, fused by juju-ops-nn and lowered to `juju_row_softmax`:
    last axis, a middle axis of rank 3, and the softmax inside attention."""
    x3 = x.reshape(2, 6, 20)
    q = x3[..., :8]
    scores = jnp.einsum("bqd,bkd->bqk", q, q)
    return (jax.nn.softmax(x, axis=-1), jax.nn.softmax(x3, axis=1),
            jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((6, 6), bool)), scores, -jnp.inf)))


def grad_and_vmap(x, y):
    def loss(x, y):
        return jnp.sum(jk.row_logsumexp(jk.fma(x, y, jk.add_one(x))))

    return {
        "grad": jax.grad(loss, argnums=(0, 1))(x, y),
        "vmap_fma": jax.vmap(jk.fma, in_axes=(1, None, 1))(x, y[:, 0], x),
        "vmap_lse": jax.vmap(jk.row_logsumexp, in_axes=1)(x),
        "jvp": jax.jvp(jk.row_logsumexp, (x,), (y,)),
    }


def threefry(key, counts, k0, c0):
    return (
        # as jax.random's threefry_2x32 calls it (without its `split`)
        jex_random.threefry2x32_p.bind(key[0], key[1], counts[:6], counts[6:]),
        jex_random.threefry2x32_p.bind(
            key[0], key[1], counts.reshape(3, 4), counts[::-1].reshape(3, 4)
        ),
        jex_random.threefry2x32_p.bind(k0, k0, c0, c0),  # rank-0 keys
    )


THREEFRY_ARGS = (
    np.array([0x12345678, 0x9ABCDEF0], np.uint32),
    rng.integers(0, 2**32, size=12, dtype=np.uint32),
    np.uint32(42),
    rng.integers(0, 2**32, size=(2, 5), dtype=np.uint32),
)


def bitcasts(f32, u32, f16, u8):
    bits = lax.bitcast_convert_type
    return {
        "f32": (bits(f32, jnp.uint32), bits(f32, jnp.int32)),  # NaN payloads, -0.0, denormals
        "u32": bits(u32, jnp.float32),
        "f16": (bits(f16, jnp.uint16), bits(bits(f16, jnp.int16), jnp.float16)),
        "bf16": bits(f32.astype(jnp.bfloat16), jnp.uint16),
        "u8": bits(u8, jnp.int8),
        # jax.random turns uint32 bits into floats with a bitcast: the same values
        "uniform": jax.random.uniform(jax.random.key(7), (64,)),
        "normal": jax.random.normal(jax.random.key(8), (64,)),
    }


_F32_BITS = np.array([0x7FC00001, 0xFFC00000, 0x7F800000, 0x80000000, 0x00000001, 0x3F800000],
                     np.uint32)
BITCAST_ARGS = (
    np.concatenate([_F32_BITS.view(np.float32), rng.normal(size=10).astype(np.float32)]),
    np.concatenate([_F32_BITS, rng.integers(0, 2**32, size=10, dtype=np.uint32)]),
    np.array([np.nan, -0.0, np.inf, 6e-8, 1.5, -2.0], np.float16),
    np.array([0, 1, 127, 128, 255], np.uint8),
)


def float_inputs(dtype, shape=(6, 4)):
    return [rng.normal(size=shape).astype(dtype) for _ in range(3)]


def in_bfloat16(fn):
    """`fn` on bfloat16 values made inside the graph (juju.jit does not take
    bfloat16 numpy inputs yet: DLPack cannot carry them)."""

    def wrapped(*args):
        out = fn(*(a.astype(jnp.bfloat16) for a in args))
        return jax.tree.map(lambda o: o.astype(jnp.float32), out)

    wrapped.__name__ = f"{fn.__name__}_bf16"
    return wrapped


BIT_ARGS = {np.dtype(d).name: bit_inputs(d) for d in INT_DTYPES}
FLOAT_ARGS = {np.dtype(d).name: float_inputs(d) for d in FLOAT_DTYPES + [np.int32]}
LSE_ARGS = {np.dtype(d).name: float_inputs(d, (6, 4))[0] for d in FLOAT_DTYPES}
LSE_ARGS["float32"][1] = -np.inf  # rows of -inf and with +inf, as jax handles them
LSE_ARGS["float32"][2, 3] = np.inf
SOFTMAX_ARGS = {np.dtype(d).name: float_inputs(d, (12, 20))[0] * 4 for d in FLOAT_DTYPES}
# rows with NaN, +inf, all -inf, and some -inf, in the SIMD part and the tail
SOFTMAX_ARGS["float32"][0, 3] = np.nan
SOFTMAX_ARGS["float32"][1, 18] = np.nan
SOFTMAX_ARGS["float32"][2, 5] = np.inf
SOFTMAX_ARGS["float32"][3] = -np.inf
SOFTMAX_ARGS["float32"][4, ::3] = -np.inf
GV_ARGS = float_inputs(np.float32, (5, 3))[:2]
BF16_ARGS = {"new_primitives": float_inputs(np.float32), "logsumexp": float_inputs(np.float32)[:1],
             "softmax": float_inputs(np.float32, (12, 20))[:1]}
BF16_FUNCTIONS = {
    "new_primitives": in_bfloat16(new_primitives),
    "logsumexp": in_bfloat16(logsumexp_ops),
    "softmax": in_bfloat16(softmax_ops),
}

# Every case in ONE function, so ONE graph: MAX compiles each kernel
# specialisation once, and graphs add per-graph overhead.
INPUTS = {
    "bits": BIT_ARGS,
    "new": FLOAT_ARGS,
    "lse": LSE_ARGS,
    "softmax": SOFTMAX_ARGS,
    "bf16": BF16_ARGS,
    "grad_and_vmap": GV_ARGS,
    "threefry": THREEFRY_ARGS,
    "bitcasts": BITCAST_ARGS,
}


def everything(inputs):
    return {
        "bits": {k: bit_ops(*args) for k, args in inputs["bits"].items()},
        "new": {k: new_primitives(*args) for k, args in inputs["new"].items()},
        "lse": {k: logsumexp_ops(x) for k, x in inputs["lse"].items()},
        "softmax": {k: softmax_ops(x) for k, x in inputs["softmax"].items()},
        "bf16": {k: BF16_FUNCTIONS[k](*args) for k, args in inputs["bf16"].items()},
        "grad_and_vmap": grad_and_vmap(*inputs["grad_and_vmap"]),
        "threefry": threefry(*inputs["threefry"]),
        "bitcasts": bitcasts(*inputs["bitcasts"]),
    }


everything_jit = juju.jit(everything)


@pytest.fixture(scope="module")
def lowered():
    return everything_jit.lower(INPUTS)


@pytest.fixture(scope="module")
def results(lowered):
    juju.compile_all([lowered])
    return everything_jit(INPUTS), jax.jit(everything)(INPUTS)


def winning_packs(closed_jaxpr) -> dict[str, set[str]]:
    """For every primitive in the jaxpr (sub-jaxprs too): the packs whose rule won."""
    registry = juju.plugins.registry()
    found: dict[str, set[str]] = {}

    def visit(jaxpr):
        for eqn in jaxpr.eqns:
            ctx = juju.LoweringContext(
                eqn,
                tuple(v.aval for v in eqn.invars),
                tuple(v.aval for v in eqn.outvars),
                DeviceRef.CPU(),
                None,
            )
            found.setdefault(eqn.primitive.name, set()).add(registry.select(ctx).pack)
            for sub in sub_jaxprs_of_params(eqn.params):
                visit(sub)

    visit(closed_jaxpr.jaxpr)
    return found


@pytest.mark.parametrize("dtype", list(BIT_ARGS))
def test_bit_kernels_match_jax(results, dtype):
    got, want = results
    assert_same(got["bits"][dtype], want["bits"][dtype])


def test_kernel_rules_are_the_ones_that_ran(lowered):
    packs = winning_packs(lowered.closed_jaxpr)
    for prim in list(lax_rules.BINARY_OPS) + list(lax_rules.UNARY_OPS):
        assert packs[prim.name] == {"mojo"}, prim.name
    for name in ("threefry2x32", "add_one", "fma", "row_logsumexp", "nn_fused",
                 "bitcast_convert_type"):
        assert packs[name] == {"mojo"}, name
    assert lowered.as_text().count("juju_row_softmax") == 2 * 3 + 3  # f32, f16, bf16
    assert lowered.kernel_names == {jk.LIBRARY}


def test_bool_bitwise_ops_are_left_to_the_lax_pack():
    closed = jax.make_jaxpr(lambda a, b: (a & b, ~a))(np.array([True]), np.array([False]))
    packs = winning_packs(closed)
    assert "mojo" not in packs["and"] | packs["not"]


@pytest.mark.parametrize("dtype", list(FLOAT_ARGS))
def test_add_one_and_fma_match_jax(results, dtype):
    got, want = results
    assert_same(got["new"][dtype], want["new"][dtype])


@pytest.mark.parametrize("dtype", list(LSE_ARGS))
def test_row_logsumexp_matches_jax(results, dtype):
    got, want = results
    assert_same(got["lse"][dtype], want["lse"][dtype])


@pytest.mark.parametrize("dtype", list(SOFTMAX_ARGS))
def test_softmax_kernel_matches_jax(results, dtype):
    got, want = results
    tol = 1e-6 if dtype == "float32" else 2e-3
    assert_same(got["softmax"][dtype], want["softmax"][dtype], rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(BF16_ARGS))
def test_bfloat16_kernels_match_jax(results, name):
    got, want = results
    assert_same(got["bf16"][name], want["bf16"][name], rtol=2e-2, atol=2e-2)


def test_threefry_matches_jax(results):
    got, want = results
    assert_same(got["threefry"], want["threefry"])


def test_bitcasts_match_jax(results):
    """Bit patterns kept exactly (NaN payloads and signs too: compared as
    integers), and jax.random's floats made from them."""
    got, want = results
    assert_same(got["bitcasts"], want["bitcasts"])


def test_grad_vmap_jvp_over_kernel_primitives(results):
    got, want = results
    assert_same(got["grad_and_vmap"], want["grad_and_vmap"])


def test_unsupported_dtype_names_the_kernel():
    with pytest.raises(TypeError, match=r"row_logsumexp.*int32"):
        juju.jit(jk.row_logsumexp).lower(np.ones((2, 3), np.int32))
    with pytest.raises(TypeError, match=r"add_one.*bool"):
        juju.jit(jk.add_one).lower(np.ones(3, bool))


# --- the kernel build cache --------------------------------------------------

TINY_KERNEL = '''
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord


@register("tiny_negate")
struct TinyNegate:
    @staticmethod
    def execute[target: StaticString](
        output: OutputTensor,
        x: InputTensor[dtype=output.dtype, rank=output.rank, ...],
        ctx: DeviceContext,
    ) raises:
        def func[width: Int](idx: Coord[...]) {var x} -> SIMD[x.dtype, width]:
            return -x.load[width](idx)

        foreach[target=target](func, output, ctx)
'''


def make_kernel_dir(root: Path, body: str = TINY_KERNEL) -> Path:
    src = root / "tiny_kernels"
    src.mkdir(parents=True, exist_ok=True)
    (src / "__init__.mojo").write_text("")
    (src / "negate.mojo").write_text(body)
    return src


def test_pack_library_is_cached_outside_the_working_directory():
    path = jk.library_path()
    start = time.perf_counter()
    again = jk.library_path()
    elapsed = time.perf_counter() - start
    assert again == path and path.is_file() and path.suffix == ".mojoc"
    assert build.cache_dir() in path.parents
    assert Path.cwd() not in path.parents
    assert build.toolchain_versions() in str(path)
    assert elapsed < 0.5


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))
    assert build.cache_dir() == tmp_path / "kernels"
    monkeypatch.delenv("JUJU_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "juju" / "kernels"


def test_source_change_changes_the_key(tmp_path):
    src = make_kernel_dir(tmp_path)
    before = build.source_hash(src)
    assert build.source_hash(src) == before
    (src / "negate.mojo").write_text(TINY_KERNEL + "\n# changed\n")
    assert build.source_hash(src) != before


BUILD_SCRIPT = textwrap.dedent(
    """
    import sys
    from juju_kernels_mojo import build
    path = build.build_kernel_library(sys.argv[1], "tiny_kernels")
    print(path, build.last_build_seconds)
    """
)


def test_concurrent_builds_build_once_and_atomically(tmp_path):
    src = make_kernel_dir(tmp_path / "src")
    env = dict(os.environ, JUJU_CACHE_DIR=str(tmp_path / "cache"))
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    # What a builder killed mid-build leaves: its scratch folder, no library.
    entry = (tmp_path / "cache" / "kernels" / build.toolchain_versions()
             / f"tiny_kernels-{build.source_hash(src)}")
    (entry / ".build-killed").mkdir(parents=True)
    (entry / ".build-killed" / "tiny_kernels.mojoc").write_bytes(b"half a library")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD_SCRIPT, str(src)],
            env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    lines = [out.split() for out, _ in results]
    assert lines[0][0] == lines[1][0]
    built = [float(t) for _, t in lines if t != "None"]
    assert len(built) == 1, lines  # the second process waited and reused it
    path = Path(lines[0][0])
    assert path.is_file() and (tmp_path / "cache") in path.parents
    assert not list(cwd.iterdir())  # nothing written to the working directory
    leftovers = [p.name for p in path.parent.iterdir() if p.name not in (path.name, ".lock")]
    assert not leftovers
    # unchanged: a new process does not rebuild
    out = subprocess.run(
        [sys.executable, "-c", BUILD_SCRIPT, str(src)],
        env=env, cwd=cwd, capture_output=True, text=True, check=True,
    ).stdout.split()
    assert out == [str(path), "None"]


def test_generated_sources_are_content_addressed_and_written_whole(tmp_path, monkeypatch):
    """Processes and threads share a generated kernel's source folder: its
    name is its content's digest, it is renamed into place whole, and one
    that no longer holds the files (damaged) is replaced."""
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path))
    files = {"__init__.mojo": "", "loop.mojo": "# a kernel\n"}
    folder = build.generated_sources("juju_loop_abc", files)
    assert build.cache_dir() / "sources" in folder.parents
    assert {p.name: p.read_text() for p in folder.iterdir()} == files
    assert build.generated_sources("juju_loop_abc", files) == folder
    other = build.generated_sources("juju_loop_abc", {**files, "loop.mojo": "# other\n"})
    assert other != folder and folder.is_dir()  # a new content: a new folder
    (folder / "loop.mojo").unlink()  # damaged (a disk full, a hand edit)
    assert build.generated_sources("juju_loop_abc", files) == folder
    assert (folder / "loop.mojo").read_text() == "# a kernel\n"
    assert [p.name for p in folder.parent.iterdir() if p.name.startswith(".")] == []


def test_a_daemon_thread_at_exit_is_abandoned_not_run(monkeypatch):
    """While the process exits, a build a daemon thread would start blocks
    for good instead (a MAX graph built then aborted processes); the main
    thread, which runs the exit handlers, is never blocked."""
    from juju import compile_pool

    monkeypatch.setattr(compile_pool, "_exiting", threading.Event())
    compile_pool._exiting.set()
    compile_pool.abandon_if_exiting()  # the main thread goes on
    reached = []

    def build_at_exit():
        compile_pool.abandon_if_exiting()
        reached.append(True)

    thread = threading.Thread(target=build_at_exit, daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and not reached


def test_an_unwritable_cache_builds_in_a_private_folder(tmp_path, monkeypatch, caplog):
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("")
    monkeypatch.setenv("JUJU_CACHE_DIR", str(a_file / "cache"))  # like /dev/null/x
    monkeypatch.setattr(build, "_fallback_dir", None)
    src = make_kernel_dir(tmp_path / "src")
    with caplog.at_level("WARNING", logger="juju"):
        path = build.build_kernel_library(src, "tiny_kernels")
        again = build.build_kernel_library(src, "tiny_kernels")
    assert path == again and path.is_file() and build.last_build_seconds is None
    assert a_file not in path.parents and build._fallback_dir in path.parents
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "cannot write kernel libraries" in warning.getMessage()
    shutil.rmtree(build._fallback_dir)


def test_build_failure_shows_the_compiler_error(tmp_path, monkeypatch):
    monkeypatch.setenv("JUJU_CACHE_DIR", str(tmp_path / "cache"))
    src = make_kernel_dir(tmp_path, TINY_KERNEL.replace("return -x", "return -y"))
    with pytest.raises(juju.CompileError, match=r"tiny_kernels(.|\n)*use of unknown declaration 'y'"):
        build.build_kernel_library(src, "tiny_kernels")


# --- GPU: compile only, on a virtual device -----------------------------------

GPU_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from max import driver
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch("sm_90a")
    driver.set_virtual_device_count(1)
    from jax import lax
    from jax.extend import random as jex_random
    import juju, juju_kernels_mojo as jk

    def f(a, b, x):
        u = a.astype(np.uint32)
        return (a & b, lax.shift_right_logical(a, b), lax.shift_right_arithmetic(a, b),
                lax.population_count(a), lax.clz(a), ~a,
                jk.add_one(x), jk.fma(x, x, x), jk.row_logsumexp(x),
                jex_random.threefry2x32_p.bind(u, u, u, u))

    engine = juju.gpu_engine()
    a = np.arange(8, dtype=np.int32)
    graph = juju.jit(f, engine=engine).lower(a, a, np.ones((4, 8), np.float32)).graph
    model = engine.session.load(graph)  # compiles only, on the virtual device
    print("MODEL", type(model).__name__)
    """
)


@pytest.mark.gpu_compile  # a MAX compile for a virtual GPU: minutes on a cold cache
def test_kernels_compile_for_gpu_without_a_gpu():
    proc = subprocess.run(
        [sys.executable, "-c", GPU_SCRIPT], capture_output=True, text=True, timeout=600
    )
    assert "MODEL CompileOnlyModel" in proc.stdout, proc.stdout + proc.stderr[-4000:]


# --- 64-bit dtypes (needs x64, so a fresh process) ----------------------------

X64_SCRIPT = textwrap.dedent(
    """
    import numpy as np, jax
    from jax import lax
    import juju, juju_kernels_mojo as jk

    def f(a, b, u, v, x):
        return (a & b, a | b, lax.shift_left(a, b), lax.shift_right_logical(a, b),
                lax.shift_right_arithmetic(a, b), lax.population_count(a), lax.clz(a), ~a,
                u ^ v, lax.shift_right_arithmetic(u, v), lax.shift_right_logical(u, v),
                lax.clz(u), jk.add_one(x), jk.fma(x, x, x), jk.row_logsumexp(x))

    rng = np.random.default_rng(0)
    a = rng.integers(-2**63, 2**63 - 1, size=16, dtype=np.int64)
    b = rng.integers(-3, 70, size=16).astype(np.int64)
    u = rng.integers(0, 2**64 - 1, size=16, dtype=np.uint64)
    v = rng.integers(0, 70, size=16).astype(np.uint64)
    x = rng.normal(size=(4, 4))
    got, want = juju.jit(f)(a, b, u, v, x), jax.jit(f)(a, b, u, v, x)
    for g, w in zip(got, want):
        g, w = g.to_numpy(), np.asarray(w)
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-13)
    print("X64 OK")
    """
)


@pytest.mark.full
def test_64_bit_dtypes_match_jax():
    env = dict(os.environ, JAX_ENABLE_X64="1")
    proc = subprocess.run(
        [sys.executable, "-c", X64_SCRIPT], capture_output=True, text=True, env=env, timeout=900
    )
    assert "X64 OK" in proc.stdout, proc.stdout + proc.stderr[-4000:]
