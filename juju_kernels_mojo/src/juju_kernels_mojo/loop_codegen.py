"""Mojo source for a whole loop: a scan or while_loop and its body in one kernel.

MAX runs each iteration of its `while_loop` through its runtime (~15-35 us
a trip on the CPU, whatever the body holds), so a small-body loop costs
50-150x `jax.jit`'s. `loop_source` writes the loop, its body and every
equation in it as Mojo loops over static shapes (SIMD vectors for float
arithmetic, math functions and copies; scalar loops for the rest): the loop
then runs without leaving compiled code. It covers the equations small iterative
programs are made of (elementwise math, integer div/rem, rem and pow,
comparisons, select, casts, broadcasts, reshapes, transposes, slices,
concatenation, stack/unstack/split, pad, reductions, argmax/argmin and
lax.reduce, dot_general, iota, dynamic slices, gather and scatter in XLA's
index modes, cond, nested scan/while and the call wrappers; PRNG keys and
jax.random in loop_random.py, window and cumulative reductions in
loop_windows.py, convolutions in loop_conv.py; any equation whose rule is a
decomposition); anything else raises `Unsupported` and the loop keeps lax's
rule.

Every array is flat and row-major; an `Array` is a pointer, a static shape
and an offset expression (a row of `xs` is the input at `step * row`).
Scratch buffers are slices of one pool per dtype, allocated once before the
outermost loop.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np
from jax import lax
from jax.extend import core as jex_core

from juju import fallback
from juju.lowering_helpers import platform_branch
from juju import primitives as P
from juju._compat import call_primitives, is_key_dtype, open_jaxpr, scan_layout
from juju.dtypes import physical_aval
from juju_kernels_mojo import (loop_complex, loop_conv, loop_parts, loop_random, loop_sort,
                               loop_windows)
from juju_kernels_mojo.loop_parts import Parts
from juju_kernels_mojo.loop_mojo import (
    ELEMENTWISE, FLOAT_ONLY, INTEGER_ONLY, NOT_BOOL, PRELUDE, VECTOR_BYTES, VECTOR_ELEMENTWISE,
    LIBM_EXP_F64, REDUCTIONS,
    Array, broadcast_strides, reduction_identity, Const, Unsupported, add_offsets, binary_expression, unary_expression, index_expr, literal, mojo_dtype,
    scalar_type,
)
# Imported under another name: `slice`'s equation has a parameter named strides.
from juju_kernels_mojo.loop_mojo import strides as row_major
__all__ = ["Unsupported", "LoopKernel", "loop_source"]


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

    # -- text ------------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    @contextlib.contextmanager
    def block(self, header: str):
        self.emit(header)
        self.depth += 1
        try:
            yield
        finally:
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
            return loop_random.scratch_keys(self, shape, dtype)
        if loop_complex.is_complex(dtype):
            return loop_complex.scratch_complex(self, shape, dtype)
        return self.scratch(shape, dtype)

    def like(self, x):
        return self.value(x.shape, x.dtype)

    def decls(self) -> list[str]:
        """The pools' allocation, before the loops."""
        lines = []
        for dtype, size in self.pools.items():
            name = f"p_{dtype.name}"
            lines.append(f"var {name}_list = List[{scalar_type(dtype)}](length={size}, fill=0)")
            lines.append(f"var {name} = {name}_list.unsafe_ptr()")
        return lines

    def nest(self, shape, body) -> None:
        """Loops over `shape` (row-major), calling body(index names) inside."""
        names = ["0" if dim == 1 else self.fresh("i") for dim in shape]
        with contextlib.ExitStack() as stack:
            for name, dim in zip(names, shape):
                if dim != 1:
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
        if isinstance(src, Array) and convert is None and dst.dtype.kind in "fiu":
            width = VECTOR_BYTES // dst.dtype.itemsize
            start = dst.size - dst.size % width
            if start:
                k = self.fresh("k")
                with self.block(f"for {k} in range(0, {start}, {width}):"):
                    self.emit(dst.store(k, src.load(k, width)))
            if start == dst.size:
                return
        with self.each(start, dst.size) as k:
            value = src.at(k)
            self.emit(f"{dst.at(k)} = {convert(value) if convert else value}")

    # -- jaxprs ------------------------------------------------------------------

    def jaxpr(self, jaxpr, args: list) -> list:
        """Emit `jaxpr` (open or closed) on `args`; returns its outputs."""
        if isinstance(jaxpr, jex_core.ClosedJaxpr):
            consts = [self.closed_const(c) for c in jaxpr.consts]
            jaxpr = jaxpr.jaxpr
        else:
            consts = []
        env = {}
        for var, value in zip([*jaxpr.constvars, *jaxpr.invars], [*consts, *args], strict=True):
            env[var] = value

        def read(atom):
            if isinstance(atom, jex_core.Literal):
                return Const(atom.val, tuple(np.shape(atom.val)), np.dtype(atom.aval.dtype))
            return env[atom]

        for eqn in jaxpr.eqns:
            for v in (*eqn.invars, *eqn.outvars):
                self.check_aval(v.aval)
            ins = [read(a) for a in eqn.invars]
            outs = [self.value(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
            self.equation(eqn.primitive, ins, outs, eqn.params, [v.aval for v in eqn.invars],
                          [v.aval for v in eqn.outvars])
            self.work += sum(o.size for o in outs)
            env.update(zip(eqn.outvars, outs))
        return [read(a) for a in jaxpr.outvars]

    def closed_const(self, value):
        if is_key_dtype(getattr(value, "dtype", None)):
            return loop_random.const_keys(self, value)
        if loop_complex.is_complex(getattr(value, "dtype", None)):
            return loop_complex.const_complex(self, value)
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
            loop_random.key_words(aval.dtype)
        elif not loop_complex.is_complex(aval.dtype):
            mojo_dtype(aval.dtype)

    # -- equations ---------------------------------------------------------------

    def equation(self, prim, ins, outs, params, avals=None, out_avals=None) -> None:
        method = EQUATIONS.get(prim)
        if method not in PARTS_CARRIERS and loop_parts.has_parts((*ins, *outs)):
            if any(isinstance(x, Parts) and is_key_dtype(x.dtype) for x in (*ins, *outs)):
                loop_random.keyed_equation(self, prim, ins, outs, params, avals, out_avals)
            else:
                loop_complex.complex_equation(self, prim, ins, outs, params)
            return
        if method is None:
            method = Emitter.elementwise if prim in ELEMENTWISE else None
        if method is None and avals is not None:
            # A primitive whose rule is a decomposition (jax.scipy's special
            # functions, equinox's unvmap_any through juju's fallback, ...):
            # the same jaxpr, written here.
            closed = self.decomposition(prim, avals, out_avals, params)
            if closed is not None:
                outs_of = self.jaxpr(closed, ins)
                for src, dst in zip(outs_of, outs, strict=True):
                    self.copy(src, dst)
                return
        if method is None:
            raise Unsupported(f"primitive {prim.name}")
        method(self, prim, ins, outs, **params)

    @staticmethod
    def decomposition(prim, avals, out_avals, params):
        """The closed jaxpr that the highest-priority rule for `prim` with a
        decomposition (`juju.lower_fun`, the core's fallback) would lower, or
        None. Key arrays are their raw data there."""
        from types import SimpleNamespace

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

    def elementwise(self, prim, ins, outs, **params):
        (out,) = outs
        dt = ins[0].dtype
        floating = dt.kind == "f"
        if (prim in FLOAT_ONLY and not floating) or (prim in NOT_BOOL and dt == np.bool_):
            raise Unsupported(f"{prim.name} of {dt}")
        if prim in INTEGER_ONLY and floating:
            raise Unsupported(f"{prim.name} of {dt}")
        if not out.size:
            return
        if all(x.shape == out.shape or x.size == 1 for x in ins):
            start = self.vector_elementwise(prim, ins, out, dt) if floating else 0
            if start == out.size:
                return
            with self.each(start, out.size) as k:
                self.element(prim, ins, out, [x.at("0") if x.size == 1 else x.at(k) for x in ins],
                             k, dt, params)
            return
        # lax broadcasts size-1 axes of equal-rank operands: stride 0 there.
        out_st = row_major(out.shape)

        def body(idx):
            args = []
            for x in ins:
                args.append(x.at(index_expr(idx, broadcast_strides(x.shape)) if x.shape else "0"))
            self.element(prim, ins, out, args, index_expr(idx, out_st), dt, params)

        self.nest(out.shape, body)

    def vector_elementwise(self, prim, ins, out, dt) -> int:
        """out[:n] = prim(ins[:n]) in SIMD vectors, for the largest n that is a
        multiple of the width; returns n (0: not written, e.g. a comparison).
        LLVM left the scalar loops unvectorized (a while_loop trip of three
        16-float ops cost ~50 ns)."""
        width = VECTOR_BYTES // dt.itemsize
        n = out.size - out.size % width
        if prim not in VECTOR_ELEMENTWISE or n == 0 or out.dtype != dt:
            return 0
        if dt == np.float64 and prim in LIBM_EXP_F64:  # libm's exp is scalar
            return 0
        vector = f"SIMD[{mojo_dtype(dt)}, {width}]"
        k = self.fresh("k")
        with self.block(f"for {k} in range(0, {n}, {width}):"):
            names = []
            for x in ins:
                name = self.fresh("v")
                if x.size == 1:  # a literal or a one-element array: splat
                    self.emit(f"var {name} = {vector}({x.at('0')})")
                else:
                    self.emit(f"var {name} = {x.load(k, width)}")
                names.append(name)
            fn = unary_expression(prim) or binary_expression(prim)
            expr = fn(dt, *names).replace("keep_nan(", f"keep_nan_v[{mojo_dtype(dt)}, {width}](")
            self.emit(out.store(k, expr))
        return n

    def element(self, prim, ins, out, args, at, dt, params):
        """out[at] = prim(args), the operands' elements as expressions."""
        if prim is P.integer_pow_p:
            expr = self.integer_pow(args[0], dt, params["y"])
        elif prim is P.select_n_p:
            expr = args[-1]
            for i in reversed(range(1, len(args) - 1)):
                test = args[0] if ins[0].dtype == np.bool_ else f"{args[0]} == {i - 1}"
                expr = f"({args[i]} if not {test} else {expr})" if ins[0].dtype == np.bool_ \
                    else f"({args[i]} if {test} else {expr})"
        elif prim is P.clamp_p:
            expr = f"min_nan(max_nan({args[1]}, {args[0]}), {args[2]})"
        elif prim is P.convert_element_type_p:
            expr = self.convert(args[0], dt, out.dtype)
        elif prim is P.round_p:
            even = int(params["rounding_method"]) == int(lax.RoundingMethod.TO_NEAREST_EVEN)
            expr = f"round_{'even' if even else 'away'}({args[0]})"
        elif prim is P.bitcast_convert_type_p:
            if dt.itemsize != out.dtype.itemsize or dt == np.bool_ or out.dtype == np.bool_:
                raise Unsupported(f"bitcast_convert_type from {dt} to {out.dtype}")
            expr = f"bitcast[{mojo_dtype(out.dtype)}, 1]({args[0]})"
        elif prim is P.pow_p:  # an integer exponent is converted, as jax's lowering does
            y = args[1] if ins[1].dtype == dt else self.convert(args[1], ins[1].dtype, dt)
            expr = f"float_pow({args[0]}, {y})"
        else:
            fn = unary_expression(prim) or binary_expression(prim)
            expr = fn(dt, *args)
        self.emit(f"{out.at(at)} = {expr}")

    def integer_pow(self, x: str, dtype, y: int) -> str:
        """x ** y by squaring, the multiplications jax's lowering does."""
        base = self.fresh("b")
        self.emit(f"var {base} = {x}")
        acc = None
        n = abs(y)
        while n > 0:
            if n & 1:
                acc = base if acc is None else f"({acc} * {base})"
            n >>= 1
            if n:
                nxt = self.fresh("b")
                self.emit(f"var {nxt} = {base} * {base}")
                base = nxt
        acc = acc or literal(1, dtype)
        return f"(1 / {acc})" if y < 0 else acc

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
        for every index i of `shape`."""
        def body(idx):
            to = add_offsets(dst_offset, index_expr(idx, dst_strides))
            at = add_offsets(src_offset, index_expr(idx, src_strides))
            self.emit(f"{dst.at(to)} = {src.at(at)}")

        if math.prod(shape):
            self.nest(shape, body)

    def strided(self, out: Array, src, src_strides, src_offset: str = "") -> None:
        """out[i...] = src[offset + sum(i * stride)] over out's shape."""
        self.copy_strided(out.shape, out, row_major(out.shape), src, src_strides,
                          src_offset=src_offset)

    def broadcast_in_dim(self, prim, ins, outs, *, shape, broadcast_dimensions, sharding=None):
        operand, (out,) = ins[0], outs
        if len(ins) > 1:
            raise Unsupported("broadcast_in_dim with dynamic shapes")
        src = row_major(operand.shape)
        st = [0] * len(out.shape)
        for axis, d in enumerate(broadcast_dimensions):
            if operand.shape[axis] != 1:
                st[d] = src[axis]
        self.strided(out, operand, st)

    def reshape(self, prim, ins, outs, **params):
        if params.get("dimensions"):
            raise Unsupported("reshape with dimensions")
        self.copy(ins[0], outs[0])

    def squeeze(self, prim, ins, outs, *, dimensions):
        self.copy(ins[0], outs[0])  # same elements, same order

    def transpose(self, prim, ins, outs, *, permutation):
        (operand,), (out,) = ins, outs
        src = row_major(operand.shape)
        self.strided(out, operand, [src[p] for p in permutation])

    def rev(self, prim, ins, outs, *, dimensions):
        (operand,), (out,) = ins, outs
        src = row_major(operand.shape)
        st = [-s if d in dimensions else s for d, s in enumerate(src)]
        offset = sum((operand.shape[d] - 1) * src[d] for d in dimensions)
        self.strided(out, operand, st, str(offset) if offset else "")

    def slice(self, prim, ins, outs, *, start_indices, limit_indices, strides: tuple | None):
        (operand,), (out,) = ins, outs
        src = row_major(operand.shape)
        step = strides or (1,) * len(src)
        offset = sum(s * b for s, b in zip(src, start_indices))
        self.strided(out, operand, [s * k for s, k in zip(src, step)], str(offset))

    def dynamic_slice(self, prim, ins, outs, *, slice_sizes):
        operand, starts, (out,) = ins[0], ins[1:], outs
        src = row_major(operand.shape)
        offset = self.clamped_offset(operand.shape, starts, slice_sizes, src)
        self.strided(out, operand, src, offset)

    def dynamic_update_slice(self, prim, ins, outs):
        operand, update, starts = ins[0], ins[1], ins[2:]
        (out,) = outs
        self.copy(operand, out)
        st = row_major(out.shape)
        offset = self.clamped_offset(out.shape, starts, update.shape, st)
        self.copy_strided(update.shape, out, st, update, row_major(update.shape),
                          dst_offset=offset)

    def clamped_offset(self, shape, starts, sizes, st) -> str:
        """The flat offset of a dynamic slice, starts clamped as lax does."""
        terms = []
        for dim, start, size, s in zip(shape, starts, sizes, st):
            name = self.fresh("s")
            self.emit(f"var {name} = Int({start.at('0')})")
            self.emit(f"{name} = min(max({name}, 0), {int(dim) - int(size)})")
            terms.append(f"{name} * {s}")
        return "(" + " + ".join(terms) + ")" if terms else ""

    def concatenate(self, prim, ins, outs, *, dimension):
        (out,) = outs
        st = row_major(out.shape)
        at = 0
        for x in ins:
            self.copy_strided(x.shape, out, st, x, row_major(x.shape),
                              dst_offset=str(at * st[dimension]) if at else "")
            at += x.shape[dimension]

    def stack(self, prim, ins, outs, *, axis):
        (out,) = outs
        st = row_major(out.shape)
        inner = [s for d, s in enumerate(st) if d != axis]
        for j, x in enumerate(ins):
            self.copy_strided(x.shape, out, inner, x, row_major(x.shape),
                              dst_offset=str(j * st[axis]) if j else "")

    def unstack(self, prim, ins, outs, *, axis):
        (operand,) = ins
        src = row_major(operand.shape)
        inner = [s for d, s in enumerate(src) if d != axis]
        for j, out in enumerate(outs):
            self.strided(out, operand, inner, str(j * src[axis]) if j else "")

    def split(self, prim, ins, outs, *, sizes, axis):
        (operand,) = ins
        src = row_major(operand.shape)
        at = 0
        for out, size in zip(outs, sizes, strict=True):
            self.strided(out, operand, src, str(at * src[axis]) if at else "")
            at += int(size)

    def fill(self, dst: Array, value: str) -> None:
        """dst[:] = value (a scalar expression)."""
        with self.each(0, dst.size) as k:
            self.emit(f"{dst.at(k)} = {value}")

    def pad(self, prim, ins, outs, *, padding_config):
        (operand, value), (out,) = ins, outs
        if not out.size:
            return
        self.fill(out, value.at("0"))
        counts, dst_st, src_st = [], [], []
        dst_at = src_at = 0
        for n, dim, (lo, _, interior), d, s in zip(operand.shape, out.shape, padding_config,
                                                   row_major(out.shape),
                                                   row_major(operand.shape)):
            step = int(interior) + 1
            # the operand's indices i whose place lo + i * step is in [0, dim)
            first, stop = max(0, -(lo // step)), min(n, (dim - 1 - lo) // step + 1)
            counts.append(max(stop - first, 0))
            dst_st.append(step * d)
            src_st.append(s)
            dst_at += (lo + first * step) * d
            src_at += first * s
        self.copy_strided(counts, out, dst_st, operand, src_st,
                          dst_offset=str(dst_at) if dst_at else "",
                          src_offset=str(src_at) if src_at else "")

    def index_of(self, indices, batch, j: int) -> str:
        """Index vector element j at batch position `batch` (index_vector_dim
        is the last axis in jax), as a fresh Int variable."""
        st = row_major(indices.shape)
        name = self.fresh("s")
        at = add_offsets(index_expr(batch, st[:-1]), str(j * st[-1]) if j else "")
        self.emit(f"var {name} = Int({indices.at(at)})")
        return name

    def gather(self, prim, ins, outs, *, dimension_numbers, slice_sizes, indices_are_sorted,
               unique_indices, mode, fill_value):
        (operand, indices), (out,) = ins, outs
        dn, mode = dimension_numbers, _mode_name(mode)
        if mode not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
            raise Unsupported(f"gather with mode={mode}")
        if not out.size:  # (an empty operand gives an empty result)
            return
        src, out_st = row_major(operand.shape), row_major(out.shape)
        window = [d for d in range(len(src))
                  if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
        batch_st = [out_st[d] for d in range(len(out_st)) if d not in dn.offset_dims]
        fill = None
        if mode == "FILL_OR_DROP":  # a slice not wholly in bounds reads fill_value
            fill = literal(_fill_value(operand.dtype, fill_value), operand.dtype)

        def body(batch):
            starts = [self.index_of(indices, batch, j) for j in range(len(dn.start_index_map))]
            highs = [operand.shape[d] - slice_sizes[d] for d in dn.start_index_map]
            ok = None
            if fill is not None and starts:
                ok = self.fresh("ok")
                self.emit(f"var {ok} = " + " and ".join(
                    f"{s} >= 0 and {s} <= {hi}" for s, hi in zip(starts, highs)))
            for s, hi in zip(starts, highs):  # XLA clamps in every mode
                self.emit(f"{s} = min(max({s}, 0), {hi})")
            terms = [f"{s} * {src[d]}" for s, d in zip(starts, dn.start_index_map)]
            # a batching dim of the operand follows one of the indices (vmap)
            terms += [f"{batch[k]} * {src[d]}" for d, k in
                      zip(dn.operand_batching_dims, dn.start_indices_batching_dims)]
            base = " + ".join(terms)
            to_base = index_expr(batch, batch_st)

            def inner(w):
                at = add_offsets(base, index_expr(w, [src[d] for d in window]))
                to = add_offsets(to_base, index_expr(w, [out_st[d] for d in dn.offset_dims]))
                value = operand.at(at)
                if ok is not None:
                    value = f"({value} if {ok} else {fill})"
                self.emit(f"{out.at(to)} = {value}")

            self.nest([slice_sizes[d] for d in window], inner)

        self.nest(indices.shape[:-1], body)

    def scatter(self, prim, ins, outs, *, update_jaxpr, update_consts, dimension_numbers,
                indices_are_sorted, unique_indices, mode):
        """Every scatter primitive: update_jaxpr (None: replace) combines an
        operand element with an update, written per element."""
        (operand, indices, updates), (out,) = ins, outs
        dn, mode = dimension_numbers, _mode_name(mode)
        if mode not in ("CLIP", "FILL_OR_DROP", "PROMISE_IN_BOUNDS"):
            raise Unsupported(f"scatter with mode={mode}")
        self.copy(operand, out)
        if not out.size or not updates.size:
            return
        st, ust = row_major(out.shape), row_major(updates.shape)
        window = [d for d in range(len(st))
                  if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
        size = {d: updates.shape[u] for d, u in zip(window, dn.update_window_dims)}
        scattered = [d for d in range(len(ust)) if d not in dn.update_window_dims]
        consts = [self.closed_const(c) for c in update_consts]

        def body(batch):
            starts = [self.index_of(indices, batch, j)
                      for j in range(len(dn.scatter_dims_to_operand_dims))]
            highs = [out.shape[d] - size.get(d, 1) for d in dn.scatter_dims_to_operand_dims]
            if mode == "CLIP":
                for s, hi in zip(starts, highs):
                    self.emit(f"{s} = min(max({s}, 0), {hi})")
            terms = [f"{s} * {st[d]}" for s, d in zip(starts, dn.scatter_dims_to_operand_dims)]
            terms += [f"{batch[k]} * {st[d]}" for d, k in
                      zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims)]
            base = " + ".join(terms)
            from_base = index_expr(batch, [ust[d] for d in scattered])

            def inner(w):
                to = add_offsets(base, index_expr(w, [st[d] for d in window]))
                at = add_offsets(from_base, index_expr(w, [ust[d] for d in dn.update_window_dims]))
                target, update = element(out, to), element(updates, at)
                if update_jaxpr is not None:
                    (update,) = self.jaxpr(update_jaxpr, [*consts, target, update])
                self.copy(update, target)

            # XLA drops an update window not wholly in bounds (CLIP clamped it)
            checks = [f"{s} >= 0 and {s} <= {hi}" for s, hi in zip(starts, highs)]
            with self.when(checks if mode != "CLIP" else []):
                self.nest([size[d] for d in window], inner)

        self.nest(indices.shape[:-1], body)
        self.work += updates.size

    def argminmax(self, prim, ins, outs, *, axes, index_dtype):
        """The first extreme element's index; the first NaN's if any, as
        jax's comparator (argmax/argmin's lowering) picks."""
        (operand,), (out,) = ins, outs
        (axis,) = axes
        n, dt = operand.shape[axis], operand.dtype
        if not n:
            raise Unsupported(f"{prim.name} over an empty axis")
        src, out_st = row_major(operand.shape), row_major(out.shape)
        kept = [s for d, s in enumerate(src) if d != axis]
        beats = ">" if prim is P.argmax_p else "<"

        def body(idx):
            base = index_expr(idx, kept)
            best, where, j, v = (self.fresh(x) for x in ("m", "w", "j", "v"))
            self.emit(f"var {best} = {operand.at(base)}")
            self.emit(f"var {where} = 0")
            with self.block(f"for {j} in range(1, {n}):"):
                self.emit(f"var {v} = {operand.at(add_offsets(base, f'{j} * {src[axis]}'))}")
                test = f"{v} {beats} {best}"
                if dt == np.bool_:
                    test = f"{v}.cast[DType.int32]() {beats} {best}.cast[DType.int32]()"
                if dt.kind == "f":
                    test += f" or (isnan({v}) and not isnan({best}))"
                with self.block(f"if {test}:"):
                    self.emit(f"{best} = {v}")
                    self.emit(f"{where} = {j}")
            self.emit(f"{out.at(index_expr(idx, out_st))} = {scalar_type(out.dtype)}({where})")

        self.nest(out.shape, body)
        self.work += operand.size

    def reduce_variadic(self, prim, ins, outs, *, computation, jaxpr, dimensions):
        """lax.reduce: the computation's jaxpr folds each element into the
        accumulators, in row-major order (XLA leaves the order open)."""
        operands, inits = ins[:len(outs)], ins[len(outs):]
        shape = operands[0].shape
        acc_st = [0] * len(shape)
        for d, s in zip([d for d in range(len(shape)) if d not in dimensions],
                        row_major(outs[0].shape)):
            acc_st[d] = s
        for out, init in zip(outs, inits, strict=True):
            self.fill(out, init.at("0"))
        staged = [self.scratch((), o.dtype) for o in outs]
        src = row_major(shape)

        def body(idx):
            accs = [element(o, index_expr(idx, acc_st)) for o in outs]
            new = self.jaxpr(jaxpr, [*accs, *(element(x, index_expr(idx, src))
                                              for x in operands)])
            self.advance(new, staged, accs)

        if math.prod(shape):
            self.nest(shape, body)
        self.work += math.prod(shape) * len(operands)

    def empty2(self, prim, ins, outs, *, dtype, memory_space):
        """A differentiated cond's placeholder residual (never read): zeros,
        as lax's rule makes it."""
        (out,) = outs
        if out.size:
            self.fill(out, literal(0, out.dtype))

    def iota(self, prim, ins, outs, *, dtype, shape, dimension, sharding=None):
        (out,) = outs
        st = row_major(out.shape)

        def body(idx):
            value = f"Scalar[{mojo_dtype(out.dtype)}]({idx[dimension]})"
            self.emit(f"{out.at(index_expr(idx, st))} = {value}")

        if out.size:
            self.nest(out.shape, body)

    def reduce(self, prim, ins, outs, *, axes, out_sharding=None):
        (operand,), (out,) = ins, outs
        dt = operand.dtype
        combine, init = REDUCTIONS[prim]
        init = reduction_identity(init, dt)
        if dt == np.bool_ and prim not in (P.reduce_and_p, P.reduce_or_p):
            raise Unsupported(f"{prim.name} of bool")
        self.copy(Const(init, out.shape, dt), out)
        src = row_major(operand.shape)
        kept = [d for d in range(len(operand.shape)) if d not in axes]
        out_st = [0] * len(operand.shape)
        for d, s in zip(kept, row_major(out.shape)):
            out_st[d] = s

        def body(idx):
            o = out.at(index_expr(idx, out_st))
            self.emit(f"{o} = {combine.format(a=o, b=operand.at(index_expr(idx, src)))}")

        if operand.size:
            self.nest(operand.shape, body)
        self.work += operand.size

    def dot_general(self, prim, ins, outs, *, dimension_numbers, precision=None,
                    preferred_element_type=None, out_sharding=None, **_):
        (lhs, rhs), (out,) = ins, outs
        (lc, rc), (lb, rb) = dimension_numbers
        if out.dtype == np.bool_:
            raise Unsupported("dot_general of bool")
        ls, rs = row_major(lhs.shape), row_major(rhs.shape)
        lf = [d for d in range(len(lhs.shape)) if d not in lc and d not in lb]
        rf = [d for d in range(len(rhs.shape)) if d not in rc and d not in rb]
        out_st = row_major(out.shape)
        contract = [lhs.shape[d] for d in lc]
        nb = len(lb)
        self.work += out.size * math.prod(contract)
        if not out.size:
            return

        def operand(st, free, batch, cdims, idx, cidx, base=()):
            terms = [*zip(idx[:nb], [st[d] for d in batch]), *zip(base, [st[d] for d in free]),
                     *zip(cidx, [st[d] for d in cdims])]
            at = index_expr(*zip(*terms)) if terms else "0"
            return at

        def load(x, at):
            value = x.at(at)
            return value if x.dtype == out.dtype else self.convert(value, x.dtype, out.dtype)

        width = VECTOR_BYTES // out.dtype.itemsize
        simd = f"SIMD[{mojo_dtype(out.dtype)}, {width}]"
        same = (lhs.dtype == rhs.dtype == out.dtype and isinstance(lhs, Array)
                and isinstance(rhs, Array))
        if same and rf and rs[rf[-1]] == 1 and out.shape[-1] >= width:
            # Vectorized over the output's last axis (rhs's contiguous free
            # axis): out[..., j:j+w] += lhs[..., c] * rhs[c, j:j+w], each
            # output element summed over c in order, as the scalar loop would.
            outer = out.shape[:-1]
            n = out.shape[-1]

            def body(idx):
                j = self.fresh("j")
                idx_l = idx[nb:nb + len(lf)]
                idx_r = idx[nb + len(lf):]
                with self.block(f"for {j} in range(0, {n - n % width}, {width}):"):
                    acc = self.fresh("acc")
                    self.emit(f"var {acc} = {simd}(0)")

                    def inner(cidx):
                        a = lhs.at(operand(ls, lf, lb, lc, idx, cidx, idx_l))
                        b_at = operand(rs, rf, rb, rc, idx, cidx, [*idx_r, j])
                        self.emit(f"{acc} += {a} * {rhs.load(b_at, width)}")

                    self.nest(contract, inner)
                    self.emit(out.store(index_expr([*idx, j], out_st), acc))
                with self.block(f"for {j} in range({n - n % width}, {n}):"):
                    self.scalar_dot(out, lhs, rhs, [*idx, j], contract, operand, load,
                                    (ls, lf, lb, lc, idx_l), (rs, rf, rb, rc, [*idx_r, j]))

            self.nest(outer, body)
            return

        def body(idx):
            self.scalar_dot(out, lhs, rhs, idx, contract, operand, load,
                            (ls, lf, lb, lc, idx[nb:nb + len(lf)]),
                            (rs, rf, rb, rc, idx[nb + len(lf):]))

        self.nest(out.shape, body)

    def scalar_dot(self, out, lhs, rhs, idx, contract, operand, load, left, right):
        acc = self.fresh("acc")
        self.emit(f"var {acc} = {scalar_type(out.dtype)}(0)")
        width = VECTOR_BYTES // out.dtype.itemsize
        if (len(contract) == 1 and contract[0] >= width and lhs.dtype == rhs.dtype == out.dtype
                and isinstance(lhs, Array) and isinstance(rhs, Array)
                and left[0][left[3][0]] == 1 and right[0][right[3][0]] == 1):
            # Both operands contiguous along the contraction: a SIMD inner
            # product (partial sums per lane, then the lanes).
            n = contract[0]
            vec, c = self.fresh("v"), self.fresh("c")
            self.emit(f"var {vec} = SIMD[{mojo_dtype(out.dtype)}, {width}](0)")
            with self.block(f"for {c} in range(0, {n - n % width}, {width}):"):
                a = operand(*left[:4], idx, [c], left[4])
                b = operand(*right[:4], idx, [c], right[4])
                self.emit(f"{vec} += {lhs.load(a, width)} * {rhs.load(b, width)}")
            self.emit(f"{acc} = {vec}.reduce_add()")
            with self.block(f"for {c} in range({n - n % width}, {n}):"):
                a = lhs.at(operand(*left[:4], idx, [c], left[4]))
                b = rhs.at(operand(*right[:4], idx, [c], right[4]))
                self.emit(f"{acc} += {a} * {b}")
            self.emit(f"{out.at(index_expr(idx, row_major(out.shape)))} = {acc}")
            return

        def inner(cidx):
            a = load(lhs, operand(*left[:4], idx, cidx, left[4]))
            b = load(rhs, operand(*right[:4], idx, cidx, right[4]))
            self.emit(f"{acc} += {a} * {b}")

        self.nest(contract, inner)
        self.emit(f"{out.at(index_expr(idx, row_major(out.shape)))} = {acc}")

    def platform_index(self, prim, ins, outs, *, platforms):
        self.fill(outs[0], literal(platform_branch(platforms, on_cpu=True), outs[0].dtype))

    def call(self, prim, ins, outs, **params):
        jaxpr = params.get("jaxpr", params.get("call_jaxpr"))
        for src, dst in zip(self.jaxpr(jaxpr, ins), outs, strict=True):
            self.copy(src, dst)

    def identity(self, prim, ins, outs, **params):
        for src, dst in zip(ins, outs, strict=True):
            self.copy(src, dst)

    # -- control flow ------------------------------------------------------------

    def cond(self, prim, ins, outs, *, branches, **params):
        index, operands = ins[0], ins[1:]
        platforms = params.get("branches_platforms")
        if platforms is not None:  # lax.platform_dependent: the CPU's branch alone
            branch = branches[platform_branch(platforms, on_cpu=True)]
            for src, dst in zip(self.jaxpr(branch, operands), outs, strict=True):
                self.copy(src, dst)
            return
        which = self.fresh("w")
        self.emit(f"var {which} = Int({index.at('0')})")
        for k, branch in enumerate(branches):
            last = k == len(branches) - 1
            header = "else:" if last else f"{'if' if k == 0 else 'elif'} {which} == {k}:"
            if len(branches) == 1:
                header = "if True:"
            with self.block(header):
                for src, dst in zip(self.jaxpr(branch, operands), outs, strict=True):
                    self.copy(src, dst)

    def scan(self, prim, ins, outs, *, reverse, length, jaxpr, unroll=1,
             _split_transpose=False, **layout):
        if _split_transpose:
            raise Unsupported("scan with _split_transpose")
        num_consts, num_carry = scan_layout(**layout)
        consts, init = ins[:num_consts], ins[num_consts:num_consts + num_carry]
        xs = ins[num_consts + num_carry:]
        carry, ys = outs[:num_carry], outs[num_carry:]
        for src, dst in zip(init, carry):
            self.copy(src, dst)
        staged = [self.like(c) for c in carry]
        step = self.fresh("step")
        with self.block(f"for {step} in range({length}):"):
            index = f"{length - 1} - {step}" if reverse else step
            rows = [x.row(index) for x in xs]
            body_outs = self.jaxpr(jaxpr, [*consts, *carry, *rows])
            for src, dst in zip(body_outs[num_carry:], ys):  # a y may be an old carry
                self.copy(src, dst.row(index))
            self.advance(body_outs[:num_carry], staged, carry)

    def while_loop(self, prim, ins, outs, *, cond_jaxpr, body_jaxpr, cond_nconsts,
                   body_nconsts):
        batch = tuple(open_jaxpr(cond_jaxpr).outvars[0].aval.shape)
        cond_consts = ins[:cond_nconsts]
        body_consts = ins[cond_nconsts:cond_nconsts + body_nconsts]
        init = ins[cond_nconsts + body_nconsts:]
        for src, dst in zip(init, outs):
            self.copy(src, dst)
        staged = [self.like(c) for c in outs]
        running = self.scratch(batch, np.dtype(np.bool_)) if batch else None
        with self.block("while True:"):
            (pred,) = self.jaxpr(cond_jaxpr, [*cond_consts, *outs])
            if not batch:
                self.emit(f"if not {pred.at('0')}:")
                self.emit("    break")
                body_outs = self.jaxpr(body_jaxpr, [*body_consts, *outs])
            else:  # vmap's while: on while any element runs, each carry kept where it stopped
                self.copy(pred, running)
                body_outs = self._batched_step(running, body_jaxpr, body_consts, outs)
            self.advance(body_outs, staged, outs)

    def _batched_step(self, running, body_jaxpr, body_consts, carry) -> list:
        """One trip of a while whose predicate `running` is batched (as XLA
        lowers it): stop when no element runs; else the body's result where
        an element runs (its leading axes), the carry where it stopped."""
        batch = running.shape
        any_running = self.fresh("running")
        self.emit(f"var {any_running} = False")
        self.nest(batch, lambda idx: self.emit(
            f"{any_running} = {any_running} or {running.at(index_expr(idx, row_major(batch)))}"))
        self.emit(f"if not {any_running}:")
        self.emit("    break")
        new = self.jaxpr(body_jaxpr, [*body_consts, *carry])
        chosen = []
        for value, old in zip(new, carry):
            mask = self.scratch(old.shape, np.dtype(np.bool_))
            self.equation(P.broadcast_in_dim_p, [running], [mask],
                          {"shape": tuple(old.shape), "sharding": None,
                           "broadcast_dimensions": tuple(range(len(batch)))})
            kept = self.like(old)
            self.equation(P.select_n_p, [mask, old, value], [kept], {})
            chosen.append(kept)
        return chosen

    def advance(self, new, staged, carry) -> None:
        """carry = new. A value computed in the body is copied straight in;
        one that is a carry, an input or a literal goes through `staged`
        (a carry may be overwritten before another reads it)."""
        carried = {(c.ptr, c.offset) for c in carry}
        computed = [isinstance(v, (Array, Parts)) and (v.ptr, v.offset) in self.scratch_ids
                    and (v.ptr, v.offset) not in carried for v in new]
        for src, dst, direct in zip(new, staged, computed):
            if not direct:
                self.copy(src, dst)
        for src, tmp, dst, direct in zip(new, staged, carry, computed):
            self.copy(src if direct else tmp, dst)


def element(x, at: str):
    """Element `at` of x as a rank-0 array (or the literal)."""
    if isinstance(x, Const):
        return Const(x.value, (), x.dtype)
    return Array(x.ptr, (), x.dtype, add_offsets(x.offset, at))


def _mode_name(mode) -> str:
    return getattr(mode, "name", str(mode)).upper()


def _fill_value(dtype, fill_value):
    """What a FILL_OR_DROP gather reads out of bounds (jax's defaults)."""
    if fill_value is not None:
        return fill_value
    if dtype.kind == "f":
        return np.nan
    if dtype == np.bool_:
        return True
    return np.iinfo(dtype).min if dtype.kind == "i" else np.iinfo(dtype).max


EQUATIONS = {
    P.broadcast_in_dim_p: Emitter.broadcast_in_dim,
    P.reshape_p: Emitter.reshape,
    P.squeeze_p: Emitter.squeeze,
    P.transpose_p: Emitter.transpose,
    P.rev_p: Emitter.rev,
    P.slice_p: Emitter.slice,
    P.dynamic_slice_p: Emitter.dynamic_slice,
    P.dynamic_update_slice_p: Emitter.dynamic_update_slice,
    P.concatenate_p: Emitter.concatenate,
    P.stack_p: Emitter.stack,
    P.unstack_p: Emitter.unstack,
    P.split_p: Emitter.split,
    P.pad_p: Emitter.pad,
    P.gather_p: Emitter.gather,
    P.argmax_p: Emitter.argminmax,
    P.argmin_p: Emitter.argminmax,
    P.reduce_p: Emitter.reduce_variadic,
    **{p: Emitter.scatter for p in (P.scatter_p, P.scatter_add_p, P.scatter_mul_p,
                                    P.scatter_min_p, P.scatter_max_p)},
    P.iota_p: Emitter.iota,
    P.empty2_p: Emitter.empty2,
    P.platform_index_p: Emitter.platform_index,
    P.dot_general_p: Emitter.dot_general,
    P.cond_p: Emitter.cond,
    P.scan_p: Emitter.scan,
    P.while_p: Emitter.while_loop,
    P.jit_p: Emitter.call,
    P.custom_jvp_call_p: Emitter.call,
    P.custom_vjp_call_p: Emitter.call,
    P.remat_p: Emitter.call,
    P.stop_gradient_p: Emitter.identity,
    P.copy_p: Emitter.identity,
    **{p: Emitter.reduce for p in (P.reduce_sum_p, P.reduce_prod_p, P.reduce_max_p,
                                   P.reduce_min_p, P.reduce_and_p, P.reduce_or_p)},
    **{p: Emitter.call for p in call_primitives},
    **loop_random.EQUATIONS,
    **loop_windows.EQUATIONS,
    **loop_conv.EQUATIONS,
    **loop_sort.EQUATIONS,
}

#: Equations that pass values through as they are (into sub-jaxprs, or
#: copied whole) take `Parts` (keys, complex numbers) like any value.
PARTS_CARRIERS = (Emitter.call, Emitter.identity, Emitter.cond, Emitter.scan, Emitter.while_loop)


@dataclass(frozen=True)
class LoopKernel:
    """A generated kernel: its registered name, source, and the arrays the
    rule passes after the loop's operands (the jaxprs' closed-over consts)."""

    name: str
    source: str
    consts: tuple
    work: int


def loop_source(prim, params, in_avals, out_avals, name: str,
                native: bool = False) -> LoopKernel:
    """The Mojo source of a kernel `name` computing one loop equation.

    Every operand and result is passed flat (rank 1). By default the kernel
    is a MAX custom op; `native=True` writes it as a C function `name(args)`
    instead, `args` the data pointers of the operands, then of the consts,
    then of the results, returning 0 (`native_programs` calls it). Raises
    `Unsupported`.
    """
    e = Emitter()
    for a in (*in_avals, *out_avals):
        e.check_aval(a)
    # Key arrays and complex numbers come and go in their physical form
    # (parts on a last axis): converted to and from `Parts` here.
    in_data = [physical_aval(a) for a in in_avals]
    out_data = [physical_aval(a) for a in out_avals]
    ins = []
    for i, (a, d) in enumerate(zip(in_avals, in_data)):
        data = Array(f"a{i}", tuple(d.shape), np.dtype(d.dtype))
        if d is not a:
            value = e.value(a.shape, a.dtype)
            loop_parts.deinterleave(e, data, value)
            data = value
        ins.append(data)
    results = [Array(f"r{i}", tuple(d.shape), np.dtype(d.dtype)) for i, d in enumerate(out_data)]
    outs = [e.value(a.shape, a.dtype) if d is not a else r
            for a, d, r in zip(out_avals, out_data, results)]
    e.equation(prim, ins, outs, params)
    for out, result in zip(outs, results):
        if out is not result:
            loop_parts.interleave(e, out, result)
    inputs = [*in_data, *e.consts]
    indent = "        "
    if native:
        entry = _native_entry(name, inputs, out_data, len(in_avals))
    else:
        entry = _custom_op_entry(name, inputs, out_data, len(in_avals))
    source = "\n".join([
        SOURCE_PRELUDE,
        *entry,
        # XLA's and MAX's CPU kernels read and write denormals as zeros.
        indent + "with FlushDenormals():",
        *(indent + "    " + line for line in e.decls()),
        *e.lines,
        *([] if not native else ["    except:", "        return 1", "    return 0"]),
        "",
    ])
    return LoopKernel(name, source, tuple(e.consts), e.work)


#: What every kernel's source starts with (imports and helpers); the rest is
#: the kernel's own entry point and body, so sources can share one file.
SOURCE_PRELUDE = "\n".join([PRELUDE, loop_random.PRELUDE, loop_sort.PRELUDE, ""])


def _custom_op_entry(name: str, inputs, outputs, operands: int) -> list[str]:
    """A MAX custom op's header, its pointers set, up to its body."""
    args = [f"        o{i}: OutputTensor[dtype={mojo_dtype(a.dtype)}, rank=1, ...],"
            for i, a in enumerate(outputs)]
    args += [f"        i{i}: InputTensor[dtype={mojo_dtype(a.dtype)}, rank=1, ...],"
             for i, a in enumerate(inputs)]
    pointers = [f"var r{i} = o{i}.unsafe_ptr()" for i in range(len(outputs))]
    pointers += [f"var {_input_name(i, operands)} = i{i}.unsafe_ptr()" for i in range(len(inputs))]
    return [
        f'@register("{name}")',
        f"struct Loop_{name}:",
        "    @staticmethod",
        "    def execute[target: StaticString](",
        *args,
        "        ctx: DeviceContext,",
        "    ) raises:",
        f'        comptime assert target == "cpu", "{name}: CPU only"',
        *("        " + line for line in pointers),
    ]


def _native_entry(name: str, inputs, outputs, operands: int) -> list[str]:
    """A C function's header, its pointers set from `args`, up to its body
    (which `try` wraps: nothing may raise through a C caller)."""
    slots = [(_input_name(i, operands), a) for i, a in enumerate(inputs)]
    slots += [(f"r{i}", a) for i, a in enumerate(outputs)]
    return [
        "@export",
        f"def {name}(args: UnsafePointer[UnsafePointer[NoneType, MutAnyOrigin], MutAnyOrigin]"
        ") abi(\"C\") -> Int32:",
        *(f"    var {var} = args[unsafe_offset={k}].unsafe_bitcast[Scalar[{mojo_dtype(a.dtype)}]]()"
          for k, (var, a) in enumerate(slots)),
        "    try:",
    ]


def _input_name(index: int, operands: int) -> str:
    """The body's name of input `index`: an operand `a<i>`, then the consts `c<k>`."""
    return f"a{index}" if index < operands else f"c{index - operands}"
