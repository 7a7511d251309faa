"""Reduction fusion: sums, maxima and minima of a fused run's results over
its shape, right after the run, are folded in the run's loop, as XLA fuses
a reduction with its producers. Each element's chain is computed in
registers and folded into accumulators; a folded value is stored only where
something after the reductions reads it. A logsumexp reads its input once
for the maximum and once for the sum, and writes nothing of its size; a
loss's mean writes no per-example values.

The reduced axes are the run's trailing axes (each output folds its rows,
in SIMD lanes and blocks as `reductions.VECTOR_FOLDS`; the outputs split
over the cores, a whole run into one value in parts) or its leading ones
(rows fold into a vector of outputs; the outputs split over the cores),
after `fusion.coalesced` merges axes.
"""

from __future__ import annotations

import math

import numpy as np

from juju import primitives as P
from juju._compat import Literal
from juju_kernels_mojo.codegen.fusion import chain, chain_work, coalesced, locator
from juju_kernels_mojo.codegen.mojo import (REDUCTIONS, index_expr, literal, mojo_dtype,
                                            reduction_identity)
from juju_kernels_mojo.codegen.mojo import strides as row_major
from juju_kernels_mojo.codegen.reductions import SUM_BLOCK, VECTOR_FOLDS

#: Reductions folded into a run's loop.
FOLDED = {P.reduce_sum_p, P.reduce_max_p, P.reduce_min_p}


def foldable(eqns, stop: int, members, read) -> list:
    """The reductions from eqns[stop] on, consecutive, that fold results of
    the run `members` over the run's shape, all over the same axes, in a
    layout `layout` writes."""
    made = {v for e in members for v in e.outvars}
    shape = tuple(members[0].outvars[0].aval.shape)
    folds: list = []
    while stop + len(folds) < len(eqns):
        eqn = eqns[stop + len(folds)]
        if eqn.primitive not in FOLDED or len(eqn.invars) != 1:
            break
        (operand,) = eqn.invars
        if isinstance(operand, Literal) or operand not in made:
            break
        axes = tuple(sorted(eqn.params["axes"]))
        if folds and axes != tuple(sorted(folds[0].params["axes"])):
            break
        if np.dtype(operand.aval.dtype).kind not in "fiu":
            break
        if not folds and layout(members, read, shape, axes) is None:  # the others' axes match
            break
        folds.append(eqn)
    return folds


def layout(run, read, shape, axes) -> tuple | None:
    """(kind, dims, patterns, kept): the run's iteration space merged by
    `fusion.coalesced`, no group mixing reduced and kept axes, `kept` of
    its groups kept. "rows": the reduced groups follow the kept ones;
    "columns": they lead, and the kept axes merge into one group. None
    where nothing is reduced, or reduced and kept axes interleave."""
    nonunit = [d for d, n in enumerate(shape) if n != 1]
    reduced = [d for d in nonunit if d in axes]
    kept = [d for d in nonunit if d not in axes]
    if not reduced:
        return None
    if not kept or max(kept) < min(reduced):
        dims, patterns = coalesced(run, read, shape, min(reduced) if kept else None)
        groups = next(k for k in range(len(dims) + 1)
                      if math.prod(dims[:k]) == math.prod(shape[d] for d in kept))
        return "rows", dims, patterns, groups
    if max(reduced) < min(kept):
        dims, patterns = coalesced(run, read, shape, min(kept))
        if dims[-1] == math.prod(shape[d] for d in kept):
            return "columns", dims, patterns, 1
    return None


def fold(emitter, run, read, results, folds, width: int, dt) -> dict:
    """Write the run with its `folds` (from `foldable`) in one loop;
    returns the reductions' results (var -> Array). `results`: the run's
    values stored as `fusion.fused` gives them."""
    shape = tuple(run[0].outvars[0].aval.shape)
    kind, dims, patterns, kept = layout(run, read, shape, tuple(sorted(folds[0].params["axes"])))
    outs = {f: emitter.value(f.outvars[0].aval.shape, f.outvars[0].aval.dtype) for f in folds}
    vector = dt is not None and all(  # float folds, of the run's lane width
        f.primitive in VECTOR_FOLDS and np.dtype(f.invars[0].aval.dtype).kind == "f"
        and np.dtype(f.invars[0].aval.dtype).itemsize == dt.itemsize for f in folds)
    accumulators = _Accumulators(emitter, folds, outs, width if vector else 1)
    write = _fold_rows if kind == "rows" else _fold_columns
    write(emitter, run, read, results, accumulators, dims, patterns, kept,
          dt if vector else None)
    return {f.outvars[0]: outs[f] for f in folds}


class _Accumulators:
    """Names and statements of the folds' accumulators (one per fold)."""

    def __init__(self, emitter, folds, outs, width: int):
        self.emitter, self.folds, self.outs, self.width = emitter, folds, outs, width
        if width > 1:
            emitter.fusion = True  # max_nan_v, min_nan_v

    def identity(self, f, width: int) -> str:
        dt = np.dtype(f.invars[0].aval.dtype)
        value = literal(reduction_identity(REDUCTIONS[f.primitive][1], dt), dt)
        return value if width == 1 else f"SIMD[{mojo_dtype(dt)}, {width}]({value})"

    def start(self, prefix: str, width: int) -> dict:
        names = {f: self.emitter.fresh(prefix) for f in self.folds}
        for f, name in names.items():
            self.emitter.emit(f"var {name} = {self.identity(f, width)}")
        return names

    def operands(self, local: dict) -> dict:
        """Each fold's value in `local` (var -> name, from `fusion.chain`)."""
        return {f: local[f.invars[0]] for f in self.folds}

    def add(self, names: dict, values: dict, width: int) -> None:
        """Fold each reduction's value (`values`, by fold) into its name."""
        for f, name in names.items():
            value = values[f]
            if width == 1:
                combine = REDUCTIONS[f.primitive][0].format(a=name, b=value)
            else:
                dt = mojo_dtype(np.dtype(f.invars[0].aval.dtype))
                combine = VECTOR_FOLDS[f.primitive][0].format(a=name, b=value, dt=dt, w=width)
            self.emitter.emit(f"{name} = {combine}")

    def join_lanes(self, totals: dict, accs: dict) -> None:
        for f, total in totals.items():
            lanes = VECTOR_FOLDS[f.primitive][1].format(total=total, acc=accs[f], w=self.width)
            for line in lanes.split("\n"):
                self.emitter.emit(line)

    def store(self, names: dict, index: str, width: int) -> None:
        for f, name in names.items():
            out = self.outs[f]
            self.emitter.emit(out.store(index, name) if width > 1 else f"{out.at(index)} = {name}")


#: A whole run folded into one value is split into at most this many
#: parts (each a multiple of SUM_BLOCK), folded on the cores, then joined in
#: order: the same result whatever the number of cores.
PARTS = 64


def _fold_rows(emitter, run, read, results, accumulators, dims, patterns, kept, dt) -> None:
    """Each output folds the rows of its reduced groups (dims[kept:]) in
    turn: the last group in SIMD blocks of SUM_BLOCK (partial sums as
    accurate as XLA's), then the rest one by one; the outputs split over the
    cores. A whole run folded into one value folds in parts on the cores
    (`PARTS`: one long row in blocks, else each row of the first group),
    joined in order."""
    width, n = accumulators.width, dims[-1]
    body = n - n % width if width > 1 and n >= 2 * width else 0
    work = chain_work(run, math.prod(dims))

    def segment(idx, totals, lo: str, hi: str, rest_lo: str, rest_hi: str) -> None:
        """Fold the row at `idx`: [lo, hi) in SIMD blocks and [rest_lo,
        rest_hi) one by one."""
        at = locator(dims, patterns, idx)
        if body:
            b, j = emitter.fresh("b"), emitter.fresh("j")
            with emitter.block(f"for {b} in range({lo}, {hi}, {SUM_BLOCK}):"):
                accs = accumulators.start("acc", width)
                with emitter.block(f"for {j} in range({b}, min({b} + {SUM_BLOCK}, {hi}), "
                                   f"{width}):"):
                    locate, flat = at(j)
                    local = chain(emitter, run, read, results, locate, flat, width, dt)
                    accumulators.add(accs, accumulators.operands(local), width)
                accumulators.join_lanes(totals, accs)
        if body < n:
            j = emitter.fresh("j")
            with emitter.block(f"for {j} in range({rest_lo}, {rest_hi}):"):
                locate, flat = at(j)
                local = chain(emitter, run, read, results, locate, flat, 1, None)
                accumulators.add(totals, accumulators.operands(local), 1)

    def rows(outer, totals) -> None:
        """Fold every row of the reduced groups under the outer index."""
        emitter.nest(dims[len(outer):-1], lambda idx: segment(
            [*outer, *idx], totals, "0", str(body), str(body), str(n)))

    if kept or work < emitter.parallel_min() or (len(dims) == 1 and n < 2 * SUM_BLOCK):
        out_strides = row_major(dims[:kept])

        def output(idx):
            totals = accumulators.start("total", 1)
            rows(idx, totals)
            accumulators.store(totals, index_expr(idx, out_strides), 1)

        emitter.nest(dims[:kept], output, parallel=True, work=work)
        return
    if len(dims) == 1:  # one long row: parts of whole blocks
        chunk = math.ceil(math.ceil(n / min(PARTS, n // SUM_BLOCK)) / SUM_BLOCK) * SUM_BLOCK
        parts = math.ceil(n / chunk)
    else:
        parts = dims[0]
    partials = {f: emitter.value((parts,), f.outvars[0].aval.dtype) for f in accumulators.folds}

    def part(idx):
        (p,) = idx
        totals = accumulators.start("total", 1)
        if len(dims) == 1:
            lo, hi = f"{p} * {chunk}", f"min({p} * {chunk} + {chunk}, {{}})"
            segment([], totals, lo, hi.format(body), f"max({lo}, {body})", hi.format(n))
        else:
            rows([p], totals)
        for f, total in totals.items():
            emitter.emit(f"{partials[f].at(p)} = {total}")

    emitter.nest([parts], part, parallel=True, work=work)
    totals = accumulators.start("total", 1)
    p = emitter.fresh("p")
    with emitter.block(f"for {p} in range({parts}):"):
        accumulators.add(totals, {f: partials[f].at(p) for f in accumulators.folds}, 1)
    accumulators.store(totals, "0", 1)


#: Outputs a column fold keeps while it walks the rows: a tile of them (in
#: L1), so that each row is read contiguously. A column at a time strode
#: a row's length per element: Sinkhorn's 1024x1024 column folds spent 60%
#: of their time waiting on memory that way.
COLUMN_TILE = 256


def _fold_columns(emitter, run, read, results, accumulators, dims, patterns, kept,
                  dt) -> None:
    """dims = [R..., K]: each of the K outputs folds its column (the
    leading groups, row-major). The outputs go in tiles of COLUMN_TILE: a
    tile starts at the identity, then each row folds into it, a SIMD vector
    of outputs at a time (the rest one by one); the outputs split over the
    cores. Each output adds its rows in order, as a column at a time."""
    width, columns = accumulators.width, dims[-1]
    rows = math.prod(dims[:-1])
    body = columns - columns % width if width > 1 else 0

    def fold_columns(lo: str, hi: str, step: int, lanes) -> None:
        tile, j = emitter.fresh("tile"), emitter.fresh("j")
        with emitter.block(f"for {tile} in range({lo}, {hi}, {COLUMN_TILE}):"):
            end = f"min({tile} + {COLUMN_TILE}, {hi})"
            with emitter.block(f"for {j} in range({tile}, {end}, {step}):"):
                accumulators.store({f: accumulators.identity(f, step) for f in accumulators.folds},
                                   j, step)

            def row(idx):
                at, k = locator(dims, patterns, idx), emitter.fresh("j")
                with emitter.block(f"for {k} in range({tile}, {end}, {step}):"):
                    locate, flat = at(k)
                    local = chain(emitter, run, read, results, locate, flat, step, lanes)
                    accs = {}
                    for f in accumulators.folds:
                        out, accs[f] = accumulators.outs[f], emitter.fresh("acc")
                        emitter.emit(f"var {accs[f]} = "
                                     f"{out.load(k, step) if step > 1 else out.at(k)}")
                    accumulators.add(accs, accumulators.operands(local), step)
                    accumulators.store(accs, k, step)

            emitter.nest(dims[:-1], row)

    if body:
        with emitter.split(body, width, work=chain_work(run, rows * body)) as (lo, hi):
            fold_columns(lo, hi, width, dt)
    if body < columns:
        rest = columns - body
        with emitter.split(rest, work=chain_work(run, rows * rest)) as (lo, hi):
            fold_columns(f"{body} + {lo}", f"{body} + {hi}", 1, None)
