"""The generator's core: an `Emitter` writes Mojo statements for jaxpr
equations over flat arrays, and dispatches each equation to its family's
writer through `EQUATIONS` (filled by the package's `__init__`).

Every array is flat and row-major; an `Array` is a pointer, a static shape
and an offset expression (a row of `xs` is the input at `step * row`).
Scratch buffers are slices of one pool per dtype, allocated once before the
outermost loop.
"""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace

import numpy as np
from jax.extend import core as jex_core

from juju import fallback
from juju import primitives as P
from juju._compat import ShapedArray, is_key_dtype, scan_layout
from juju_ops_lax import rewrites as lax_rewrites
from juju_kernels_mojo.codegen import complex_parts, control_flow, fusion, parts, prng, tasks
from juju_kernels_mojo.codegen.mojo import (VECTOR_BYTES, Array, Const, Unsupported,
                                            add_offsets, index_expr, mojo_dtype, scalar_type)
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.parts import Parts

#: Loops of less work (element operations) run on one thread. Waking the
#: other cores (`Emitter.split`) costs ~3 us in a tight loop, but a call
#: comes after other work: jax.jit's or the caller's, while MAX's workers
#: slept or spun. A flax nnx step (256x256 values, 8 regions from 2^16)
#: ran 2.3 ms against 0.34 ms on one thread, interleaved with jax.jit's
#: calls; from 2^20 (and products from 2^23) it ran 0.34 ms, and larger
#: programs kept their times (docs/performance.md, stop 63).
PARALLEL_MIN = 1 << 20
#: The same inside a scan or while body. After a parallel region MAX's
#: workers spin for a while (docs/performance.md, "MAX's spinning
#: workers"), taking the cores from the serial code of the rest of the step:
#: a GRU scan whose steps split 1.5M-multiply-add products ran 6x jax.jit.
PARALLEL_MIN_IN_LOOP = 1 << 21
#: primitive -> writer(emitter, prim, ins, outs, **params), every family's.
EQUATIONS: dict = {}
#: Writers that pass values through as they are (into sub-jaxprs, or copied
#: whole): they take `Parts` (keys, complex numbers) like any value.
PARTS_CARRIERS: set = set()
#: primitive -> f(emitter, ins, params, out_avals) -> its results, bound to
#: its outputs without copies, or None (written as usual): calls and
#: identities (control_flow.FORWARDING), reshapes (structural.FORWARDING).
FORWARDING: dict = {}


class Emitter:
    """Writes Mojo statements for jaxpr equations over `Array`s."""

    def __init__(self):
        self.pools: dict[np.dtype, int] = {}  # elements of scratch per dtype
        self.scratch_ids: set[tuple] = set()  # (ptr, offset) of what `scratch` gave
        self.lines: list[str] = []
        self.depth = 3  # inside execute's `with FlushDenormals():`
        self.count = 0
        self.work = 0  # element operations per outermost iteration, roughly
        self.consts: list[np.ndarray] = []  # closed-over arrays: extra kernel inputs
        self.in_task = False  # writing the body of a task on a worker thread
        self.threads = False  # uses THREADS_PRELUDE (tasks on the cores, the BLAS)
        self.fusion = False  # uses fusion.FUSION_PRELUDE (vector max/min)
        self.linalg = False  # uses linalg.LINALG_PRELUDE (LAPACK, triangular solves)
        self.loops = 0  # depth of scan/while bodies being written
        self.regions: list = []  # (locals, body) of parallel regions (tasks.dispatcher)
        self.defined: dict[str, str] = {}  # local name -> the expression defining it

    def parallel_min(self) -> int:
        """The work (element operations) from which a loop runs on the cores."""
        return PARALLEL_MIN_IN_LOOP if self.loops else PARALLEL_MIN

    @contextlib.contextmanager
    def repeated(self, header: str):
        """A block run many times (a scan or while body)."""
        with self.block(header):
            self.loops += 1
            try:
                yield
            finally:
                self.loops -= 1

    # -- text ------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)
        for name, expr in tasks.definitions(line):
            self.defined.setdefault(name, expr)

    @contextlib.contextmanager
    def block(self, header: str):
        self.emit(header)
        self.depth += 1
        start = len(self.lines)
        try:
            yield
        finally:
            if len(self.lines) == start:  # nothing to do there (a copy onto itself)
                self.emit("pass")
            self.depth -= 1

    def scratch(self, shape, dtype) -> Array:
        """A fresh buffer: a slice of one pool per dtype, allocated once before
        the loops (one allocation per buffer made Mojo's compile time grow
        faster than the source: 133 s for a 7,300-line diffrax loop)."""
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        base = self.pools.get(dtype, 0)
        # Each buffer starts at a multiple of the SIMD width.
        width = VECTOR_BYTES // dtype.itemsize
        self.pools[dtype] = base + -(-max(math.prod(shape), 1) // width) * width
        array = Array(f"p_{dtype.name}", shape, dtype, str(base) if base else "")
        self.scratch_ids.add((array.ptr, array.offset))
        return array

    def value(self, shape, dtype):
        """A fresh buffer for a value: an `Array`, or `Parts` for keys and
        complex numbers."""
        if is_key_dtype(dtype):
            return prng.scratch_keys(self, shape, dtype)
        if complex_parts.is_complex(dtype):
            return complex_parts.scratch_complex(self, shape, dtype)
        return self.scratch(shape, dtype)

    def like(self, x):
        return self.value(x.shape, x.dtype)

    def decls(self) -> list[str]:
        """The pools' allocation and the parallel regions' task
        (`tasks.dispatcher`), before the loops."""
        lines = []
        for dtype, size in self.pools.items():
            name = f"p_{dtype.name}"
            lines.append(f"var {name}_list = List[{scalar_type(dtype)}](length={size}, fill=0)")
            lines.append(f"var {name} = {name}_list.unsafe_ptr()")
        pad = "    " * tasks.DISPATCH_DEPTH
        return lines + [line[len(pad):] for line in tasks.dispatcher(self.regions)]

    def nest(self, shape, body, parallel: bool = False, work: int | None = None) -> None:
        """Loops over `shape` (row-major), calling body(index names) inside.
        `parallel`: iterations of the outermost loop write disjoint outputs,
        so where the work (element operations, the shape's size by default)
        is large, its range is split over the cores (`split`)."""
        names = ["0" if dim == 1 else self.fresh("i") for dim in shape]
        work = math.prod(shape) if work is None else work
        with contextlib.ExitStack() as stack:
            for d, (name, dim) in enumerate(zip(names, shape)):
                if dim == 1:
                    continue
                if parallel and not any(size != 1 for size in shape[:d]):
                    lo, hi = stack.enter_context(self.split(dim, work=work))
                    stack.enter_context(self.block(f"for {name} in range({lo}, {hi}):"))
                else:
                    stack.enter_context(self.block(f"for {name} in range({dim}):"))
            body(names)

    def when(self, conditions: list[str]):
        """A block run only where all `conditions` hold (none: always)."""
        if not conditions:
            return contextlib.nullcontext()
        return self.block(f"if {' and '.join(conditions)}:")

    @contextlib.contextmanager
    def each(self, start: int, stop: int):
        """A loop over range(start, stop), yielding its index (no loop for one)."""
        if stop - start == 1:
            yield str(start)
            return
        k = self.fresh("k")
        with self.block(f"for {k} in range({start}, {stop}):"):
            yield k

    @contextlib.contextmanager
    def split(self, size: int, width: int = 1, work: int | None = None):
        """Yields (start, stop) expressions of the range [0, size): the whole
        of it, or, where its work (element operations, `size` by default)
        is large (`PARALLEL_MIN`), each core's block (whole `width`s) inside
        a task that `sync_parallelize` runs on the cores. Only the outermost
        of nested splits runs tasks."""
        work = size if work is None else work
        if work < self.parallel_min() or size < 2 * width or self.in_task:
            yield "0", str(size)
            return
        self.threads = True
        cores, chunk = self.fresh("cores"), self.fresh("chunk")
        start, stop = self.fresh("lo"), self.fresh("hi")
        self.emit(f"var {cores} = kernel_cores()")
        self.emit(f"var {chunk} = ({size} + {cores} * {width} - 1) // ({cores} * {width})"
                  f" * {width}")
        mark, depth = len(self.lines), self.depth
        self.depth, self.in_task = tasks.BODY_DEPTH, True
        try:
            self.emit(f"var {start} = min({tasks.TASK_INDEX} * {chunk}, {size})")
            self.emit(f"var {stop} = min({start} + {chunk}, {size})")
            yield start, stop
        finally:
            body = self.lines[mark:]
            del self.lines[mark:]
            self.depth, self.in_task = depth, False
        slots = tasks.free_ints(body, self.defined)
        if slots is not None:
            for line in tasks.launch(slots, len(self.regions), cores):
                self.emit(line)
            self.regions.append((slots, body))
            return
        task = self.fresh("task")  # it reads a local that is not an integer
        with self.block(f"def {task}({tasks.TASK_INDEX}: Int) {{var}}:"), \
                self.block("with FlushDenormals():"):
            self.lines += tasks.reindent(body, self.depth)
        self.emit(f"sync_parallelize({task}, {cores})")

    def copy(self, src, dst: Array, convert=None) -> None:
        """dst = src elementwise (src may be a Const or a same-size Array)."""
        if isinstance(dst, Parts):
            for s, d in zip(src.words, dst.words, strict=True):
                self.copy(s, d)
            return
        if isinstance(src, Array) and (src.ptr, src.offset) == (dst.ptr, dst.offset):
            return
        if dst.size == 0:
            return
        start = 0
        if isinstance(src, (Array, Const)) and convert is None and dst.dtype.kind in "fiu":
            width = VECTOR_BYTES // dst.dtype.itemsize
            start = dst.size - dst.size % width
            if start:
                k = self.fresh("k")
                vector = (src.load(k, width) if isinstance(src, Array) else
                          f"SIMD[{mojo_dtype(dst.dtype)}, {width}]({src.at('0')})")
                with self.split(start, width) as (lo, hi), \
                        self.block(f"for {k} in range({lo}, {hi}, {width}):"):
                    self.emit(dst.store(k, vector))
            if start == dst.size:
                return

        def element(k):
            at = add_offsets(str(start), k[0])
            value = src.at(at)
            self.emit(f"{dst.at(at)} = {convert(value) if convert else value}")

        if dst.size - start == 1:
            element(["0"])
        else:
            self.nest([dst.size - start], element, parallel=True)

    # -- jaxprs ------------------------------------------------------------------

    def jaxpr(self, jaxpr, args: list, into: dict | None = None) -> list:
        """Emit `jaxpr` (open or closed) on `args`; returns its outputs.
        `into` (output index -> Array, a loop's carry buffers): where an
        output may be written in place (`_in_place`)."""
        if isinstance(jaxpr, jex_core.ClosedJaxpr):
            consts = [self.closed_const(c) for c in jaxpr.consts]
            jaxpr = jaxpr.jaxpr
        else:
            consts = []
        env = {}
        for var, value in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args], strict=True):
            env[var] = value
        eqns, outvars, inner_consts, origins = control_flow.inlined(jaxpr, self.inlinable)
        # Calls inlined: repeats across them merged (slogdet's, det's and
        # lu_factor's LU of one matrix), and elementwise work on broadcasts
        # (jnp's remainder of a broadcast counter, in a call) moved below them,
        # as XLA's CSE and simplifier do.
        eqns, outvars, _ = lax_rewrites.repeats_merged(
            lax_rewrites.dead_dropped(eqns, outvars), outvars)
        eqns = lax_rewrites.below_broadcasts(eqns, outvars)
        # Transposes moved up to the products that read them, and folded.
        eqns = lax_rewrites.transposes_folded(lax_rewrites.above_transposes(eqns, outvars),
                                              outvars)
        for var, value in inner_consts:
            env[var] = self.closed_const(value)

        def read(atom):
            if isinstance(atom, jex_core.Literal):
                return Const(atom.val, tuple(np.shape(atom.val)), np.dtype(atom.aval.dtype))
            return env[atom]

        def located(eqn):
            """A refusal names `eqn`, and the user's call it was inlined from."""
            stack = contextlib.ExitStack()
            if id(eqn) in origins:
                stack.enter_context(fusion.named(origins[id(eqn)]))
            stack.enter_context(fusion.named(eqn))
            return stack

        start = 0
        inputs = {*jaxpr.constvars, *jaxpr.invars, *(var for var, _ in inner_consts)}
        position = {id(e): i for i, e in enumerate(eqns)}
        last_use = {a: i for i, e in enumerate(eqns) for a in e.invars
                    if not isinstance(a, jex_core.Literal)}
        last_use.update((a, len(eqns)) for a in outvars if not isinstance(a, jex_core.Literal))
        while start < len(eqns):
            eqn = eqns[start]
            with located(eqn):
                results = self.forwarded(eqn, read)
                run = None if results is not None else fusion.plan(eqns, start, read)
            if run is not None:  # one loop for the run, on the cores where it is large
                for hoisted in run.hoisted:  # written ahead of it
                    with located(hoisted):
                        self.written(hoisted, read, env, self.forwarded(hoisted, read))
                live = {v for e in run.members for v in e.outvars
                        if last_use.get(v, -1) >= run.stop}
                targets = _in_place(outvars, position, into, run.members, env, last_use)
                with located(run.members[0]):
                    env.update(fusion.fused(self, run.members, read, live, targets, run.folds))
                start = run.stop
                continue
            with located(eqn):
                self.written(eqn, read, env, results,
                             _updated_in_place(eqn, start, into, env, last_use, read, inputs)
                             or self._destinations(eqn, start, outvars, into, env, last_use,
                                                   inputs, read, results))
            start += 1
        return [read(a) for a in outvars]

    def _destinations(self, eqn, index, outvars, into, env, last_use, inputs, read,
                      results) -> list | None:
        """The buffers `eqn` (not fused, not forwarded) writes its results
        into where that saves a copy, as XLA's buffer assignment does; else
        None (fresh ones):
        - a result that is the jaxpr's output `j` goes straight into `into[j]`
          (a loop's carry buffer, a cond's output) where nothing reads that
          buffer's old value from this equation on;
        - a while's or scan's carry starts in its initial value's buffer, not
          a copy of it, and a cond's result is written over an operand that a
          branch returns as it is (optimistix's solver steps keep or update a
          Hessian), where that value was computed in this jaxpr (never an
          input: a loop's constants are read again next trip) and nothing
          reads it after the equation."""
        if results is not None or len(eqn.outvars) == 0:
            return None
        chosen: dict[int, Array] = {}
        taken: list[Array] = []
        if into:
            for k, var in enumerate(eqn.outvars):
                j = next((j for j, o in enumerate(outvars) if o is var), None)
                buffer = into.get(j) if j is not None else None
                if (isinstance(buffer, Array) and _fits(buffer, var.aval)
                        and not any(_same(buffer, t) for t in taken)
                        and all(last_use.get(v, -1) < index for v in _holders(env, buffer))):
                    chosen[k] = buffer
                    taken.append(buffer)
        if eqn.primitive in (P.while_p, P.scan_p, P.cond_p):
            ins = [read(a) for a in eqn.invars]
            for k, m in _passed_through(eqn):
                buffer = ins[m]
                if (k not in chosen and isinstance(buffer, Array)
                        and _fits(buffer, eqn.outvars[k].aval)
                        and not any(_same(buffer, t) for t in taken)
                        and _reusable(buffer, index, env, last_use, inputs, into, ins)):
                    chosen[k] = buffer
                    taken.append(buffer)
        if not chosen:
            return None
        return [chosen.get(k) or self.value(v.aval.shape, v.aval.dtype)
                for k, v in enumerate(eqn.outvars)]

    def forwarded(self, eqn, read):
        """`eqn`'s results bound without code (`FORWARDING`: calls'
        results, identities, reshapes), or None; its values checked first."""
        for v in (*eqn.invars, *eqn.outvars):
            self.check_aval(v.aval)
        forward = FORWARDING.get(eqn.primitive)
        return None if forward is None else forward(
            self, [read(a) for a in eqn.invars], eqn.params, [v.aval for v in eqn.outvars])

    def written(self, eqn, read, env, results, into=None) -> None:
        """Write `eqn` on its own (`results`: its forwarded results, or None;
        `into`: the buffers its results go to, else new ones) and bind its
        outputs in `env`."""
        if results is not None:
            outs = [self.materialized(r) for r in results]
        else:
            ins = [read(a) for a in eqn.invars]
            outs = into or [self.value(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
            self.equation(eqn.primitive, ins, outs, eqn.params,
                          [v.aval for v in eqn.invars], [v.aval for v in eqn.outvars])
        self.work += sum(o.size for o in outs)
        env.update(zip(eqn.outvars, outs))

    def materialized(self, value):
        """`value` as a buffer: a literal copied into one, else itself."""
        if not isinstance(value, Const):
            return value
        out = self.like(value)
        self.copy(value, out)
        return out

    def closed_const(self, value):
        if is_key_dtype(getattr(value, "dtype", None)):
            return prng.const_keys(self, value)
        if complex_parts.is_complex(getattr(value, "dtype", None)):
            return complex_parts.const_complex(self, value)
        value = np.asarray(value)
        self.check_aval(value)
        self.consts.append(value)
        return Array(f"c{len(self.consts) - 1}", value.shape, value.dtype)

    @staticmethod
    def check_aval(aval) -> None:
        shape = getattr(aval, "shape", None)
        if shape is None or not all(isinstance(d, (int, np.integer)) for d in shape):
            raise Unsupported(f"a value of type {aval}")
        if is_key_dtype(aval.dtype):
            prng.key_words(aval.dtype)
        elif not complex_parts.is_complex(aval.dtype):
            mojo_dtype(aval.dtype)

    # -- equations ---------------------------------------------------------------

    def equation(self, prim, ins, outs, params, avals=None, out_avals=None) -> None:
        method = EQUATIONS.get(prim)
        if method not in PARTS_CARRIERS and parts.has_parts((*ins, *outs)):
            if any(isinstance(x, Parts) and is_key_dtype(x.dtype) for x in (*ins, *outs)):
                prng.keyed_equation(self, prim, ins, outs, params, avals, out_avals)
            else:
                complex_parts.complex_equation(self, prim, ins, outs, params)
            return
        if method is None and avals is not None:
            # A primitive whose rule is a decomposition (jax.scipy's special
            # functions, equinox's unvmap_any through juju's fallback, ...):
            # the same jaxpr, written here.
            self.decomposed(prim, ins, outs, params, avals, out_avals)
            return
        if method is None:
            raise Unsupported(f"primitive {prim.name}")
        method(self, prim, ins, outs, **params)

    def decomposed(self, prim, ins, outs, params, avals=None, out_avals=None) -> None:
        """`prim` written as its rule's decomposition (`decomposition`)."""
        shaped = lambda xs: [ShapedArray(x.shape, x.dtype) for x in xs]
        closed = self.decomposition(prim, avals or shaped(ins), out_avals or shaped(outs), params)
        if closed is None:
            raise Unsupported(f"primitive {prim.name}")
        for src, dst in zip(self.jaxpr(closed, ins), outs, strict=True):
            self.copy(src, dst)

    def inlinable(self, eqn):
        """The decomposition of `eqn` inlined into the jaxpr that holds it
        (`control_flow.inlined`), or None: a primitive without an equation
        writer, whose values have no parts (complex numbers, key arrays)."""
        if eqn.primitive in EQUATIONS:  # FORWARDING's primitives are among them
            return None
        avals = [v.aval for v in (*eqn.invars, *eqn.outvars)]
        if any(complex_parts.is_complex(a.dtype) or is_key_dtype(a.dtype) for a in avals):
            return None
        try:
            return self.decomposition(eqn.primitive, [v.aval for v in eqn.invars],
                                      [v.aval for v in eqn.outvars], eqn.params)
        except Unsupported:  # written (and refused) where it stands
            return None

    @staticmethod
    def decomposition(prim, avals, out_avals, params):
        """The closed jaxpr that the highest-priority rule for `prim` with a
        decomposition (`juju.lower_fun`, the core's fallback) would lower, or
        None. Key arrays are their raw data there."""

        from juju.plugins import registry

        if avals is None or out_avals is None:
            return None
        ctx = SimpleNamespace(primitive=prim, avals_in=tuple(avals), avals_out=tuple(out_avals),
                              params=params, device=None, eqn=None)
        for rule in registry().candidates(prim):
            decompose = getattr(rule.fn, "decomposition", None)
            if decompose is None or rule.guard is not None or rule.requires:
                continue
            if not rule.accepts((*avals, *out_avals)):
                continue
            try:
                return decompose(ctx)
            except Exception as why:  # no decomposition for these avals
                raise Unsupported(f"{prim.name}: {why}") from why
        # The core's fallback (guarded: it applies where JAX's own
        # implementation traces), for equinox's unvmap_any, nonbatchable, ...
        return fallback.implementation(prim, avals, params)

    def convert(self, x: str, src, dst) -> str:
        src, dst = np.dtype(src), np.dtype(dst)
        if dst == np.bool_:
            return f"{x} != 0"
        if src.kind == "f" and dst.kind in "iu":
            return f"float_to_int[{mojo_dtype(src)}, {mojo_dtype(dst)}]({x})"
        return f"{x}.cast[{mojo_dtype(dst)}]()"

    def copy_strided(self, shape, dst: Array, dst_strides, src, src_strides,
                     dst_offset: str = "", src_offset: str = "") -> None:
        """dst[dst_offset + sum(i * dst_stride)] = src[src_offset + sum(i * src_stride)]
        for every index i of `shape`. Rows contiguous in both (a slice of
        whole rows' columns, a concatenation's part) are copied in SIMD
        vectors."""
        shape, dst_strides, src_strides = coalesce(shape, dst_strides, src_strides)
        if not math.prod(shape):
            return
        if isinstance(src, Array) and dst_strides[-1] == 1 and src_strides[-1] == 1:
            # Each contiguous row a `copy` (SIMD vectors, split over the cores
            # where it is one long run).
            def row(idx):
                to = add_offsets(dst_offset, index_expr(idx, dst_strides[:-1]))
                at = add_offsets(src_offset, index_expr(idx, src_strides[:-1]))
                self.copy(src.span(at, shape[-1]), dst.span(to, shape[-1]))

            self.nest(shape[:-1], row, parallel=True, work=math.prod(shape))
            return

        def body(idx):
            to = add_offsets(dst_offset, index_expr(idx, dst_strides))
            at = add_offsets(src_offset, index_expr(idx, src_strides))
            self.emit(f"{dst.at(to)} = {src.at(at)}")

        self.nest(shape, body, parallel=True)

    def strided(self, out: Array, src, src_strides, src_offset: str = "") -> None:
        """out[i...] = src[offset + sum(i * stride)] over out's shape."""
        self.copy_strided(out.shape, out, row_major(out.shape), src, src_strides,
                          src_offset=src_offset)

    def fill(self, dst: Array, value: str) -> None:
        """dst[:] = value (a scalar expression)."""
        if dst.size > 1:
            self.nest([dst.size], lambda k: self.emit(f"{dst.at(k[0])} = {value}"), parallel=True)
        elif dst.size:
            self.emit(f"{dst.at('0')} = {value}")

    def advance(self, new, staged, carry) -> None:
        """carry = new. A value computed in the body is copied straight in;
        one that is a carry, an input or a literal goes through `staged`
        (a carry may be overwritten before another reads it); one written in
        place, or left as it was, is where it belongs."""
        kept = [isinstance(v, Array) and (v.ptr, v.offset, v.shape) == (c.ptr, c.offset, c.shape)
                for v, c in zip(new, carry)]
        new, staged, carry = ([x for x, k in zip(xs, kept) if not k] for xs in (new, staged, carry))
        carried = {(c.ptr, c.offset) for c in carry}
        computed = [isinstance(v, (Array, Parts)) and (v.ptr, v.offset) in self.scratch_ids
                    and (v.ptr, v.offset) not in carried for v in new]
        for src, dst, direct in zip(new, staged, computed):
            if not direct:
                self.copy(src, dst)
        for src, tmp, dst, direct in zip(new, staged, carry, computed):
            self.copy(src if direct else tmp, dst)


def coalesce(shape, *strides_of) -> tuple:
    """`shape` and each array's strides over it with axes of size 1 dropped
    and adjacent axes merged where every array steps over both as one."""
    axes = ([d for d, n in enumerate(shape) if n != 1] or [len(shape) - 1]) if shape else []
    if not axes:
        return [1], *([0] for _ in strides_of)
    dims, merged = [shape[axes[0]]], [[st[axes[0]]] for st in strides_of]
    for d in axes[1:]:
        if all(m[-1] == st[d] * shape[d] for m, st in zip(merged, strides_of)):
            dims[-1] *= shape[d]
            for m, st in zip(merged, strides_of):
                m[-1] = st[d]
        else:
            dims.append(shape[d])
            for m, st in zip(merged, strides_of):
                m.append(st[d])
    return dims, *merged


#: Equations that update their first operand: written into its buffer where
#: nothing else needs it (`_reusable`).
_UPDATES = {P.dynamic_update_slice_p, P.scatter_p, P.scatter_add_p, P.scatter_mul_p,
            P.scatter_min_p, P.scatter_max_p}


def _updated_in_place(eqn, index: int, into, env, last_use, read, inputs) -> list | None:
    """[the buffer] where `eqn`, a dynamic_update_slice or a scatter, can
    update its operand's buffer in place, as XLA does, not a copy of it: a
    loop's carry (diffrax's checkpoints: two 90x16384 copies per step) or a
    value computed in this jaxpr (a segment sum's zeros) that nothing reads
    after it (`_reusable`); else None."""
    if eqn.primitive not in _UPDATES:
        return None
    operand = eqn.invars[0]
    buffer = None if isinstance(operand, jex_core.Literal) else env.get(operand)
    if not isinstance(buffer, Array) or not _fits(buffer, eqn.outvars[0].aval):
        return None
    ins = [read(a) for a in eqn.invars]
    return [buffer] if _reusable(buffer, index, env, last_use, inputs, into, ins) else None


def _reusable(buffer, index, env, last_use, inputs, into, ins) -> bool:
    """Whether the equation at `index` of a jaxpr, reading `ins`, may write
    over `buffer`, one of them: nothing reads it after that equation, the
    equation reads it once, and it is a loop's carry (`into`) or was
    computed in this jaxpr (an input, a loop's constant say, is read again
    next trip)."""
    holders = _holders(env, buffer)
    if any(last_use.get(v, -1) > index for v in holders):
        return False
    if sum(isinstance(x, Array) and not _disjoint(x, buffer) for x in ins) != 1:
        return False
    if into and any(isinstance(c, Array) and _same(c, buffer) for c in into.values()):
        return True
    return not any(v in inputs for v in holders)


def _holders(env, buffer) -> list:
    """The variables bound to `buffer` (itself or a view of it)."""
    return [v for v, x in env.items() if isinstance(x, Array) and not _disjoint(x, buffer)]


def _fits(buffer, aval) -> bool:
    return buffer.shape == tuple(aval.shape) and buffer.dtype == np.dtype(aval.dtype)


def _passed_through(eqn) -> list[tuple[int, int]]:
    """(result, operand) pairs of a loop or cond whose result may take the
    operand's buffer: a while's or scan's carries and their initial values;
    a cond's results that some branch returns as that operand."""
    if eqn.primitive is not P.cond_p:
        first, count = _carry_span(eqn)
        return [(k, first + k) for k in range(count)]
    returned: dict[int, set] = {}  # operand -> the results branches return it as
    for branch in eqn.params["branches"]:
        invars = branch.jaxpr.invars
        for k, out in enumerate(branch.jaxpr.outvars):
            for m, v in enumerate(invars):
                if v is out:
                    returned.setdefault(1 + m, set()).add(k)  # operand 0: the index
    # An operand returned as two results would be read after the first is written.
    return sorted((ks.pop(), m) for m, ks in returned.items() if len(ks) == 1)


def _carry_span(eqn) -> tuple[int, int]:
    """(index of the first initial carry among `eqn`'s operands, how many),
    for a while or a scan; the carries are its first outputs."""
    if eqn.primitive is P.while_p:
        first = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]
        return first, len(eqn.outvars)
    num_consts, num_carry = scan_layout(**{k: v for k, v in eqn.params.items()
                                           if k in ("num_consts", "num_carry", "ft_in",
                                                    "ft_out")})
    return num_consts, num_carry


def _same(a, b) -> bool:
    return (a.ptr, a.offset, a.shape) == (b.ptr, b.offset, b.shape)


def _disjoint(a, b) -> bool:
    """Whether arrays `a` and `b` certainly share no element."""
    if a.ptr != b.ptr:
        return True
    try:
        a0, b0 = int(a.offset or 0), int(b.offset or 0)
    except ValueError:  # an offset known at run time only
        return False
    return a0 + a.size <= b0 or b0 + b.size <= a0


def _in_place(outvars, position, into, members, env, last_use) -> dict:
    """The outputs of the fused run `members` (equations of a jaxpr whose
    outputs are `outvars`, each at `position[id(eqn)]`) that can be stored
    into their carry buffers (`into`) directly: the buffer holds the old
    carry, read by nothing after the run and inside it only elementwise (the
    run's shape) by equations up to the one computing the output, so that
    each element is read before it is overwritten."""
    if not into:
        return {}
    shape = tuple(members[0].outvars[0].aval.shape)
    producer = {v: position[id(e)] for e in members for v in e.outvars}
    targets = {}
    for out_index, buffer in into.items():
        out = outvars[out_index]
        if (isinstance(out, jex_core.Literal) or out not in producer or out in targets
                or not isinstance(buffer, Array)
                or tuple(out.aval.shape) != shape or buffer.shape != shape):
            continue
        holders = [v for v, x in env.items() if isinstance(x, Array)
                   and (x.ptr, x.offset) == (buffer.ptr, buffer.offset)]
        if all(last_use.get(v, -1) <= producer[out] and tuple(v.aval.shape) == shape
               for v in holders) and buffer not in targets.values():
            targets[out] = buffer
    return targets
