"""Mojo source for a whole program or loop: every equation written as loops
over static shapes, in one kernel.

MAX runs each op of a graph, and each trip of its `while_loop`, through its
runtime (~1-3 us an op, ~15-35 us a trip on the CPU, whatever they hold),
so a small program or a small-body loop costs many times `jax.jit`'s.
`loop_source` writes the equation (a `mojo_program`, a scan, a while), its
body and every equation in it as Mojo loops over static shapes (SIMD
vectors for float arithmetic, math functions and copies; scalar loops for
the rest): it then runs without leaving compiled code. Anything the
families below do not write raises `Unsupported`, and the equation keeps
its MAX rule (`juju_kernels_mojo.placement` decides what runs where).

The modules, one family of equations each (`EQUATIONS` maps a primitive
to its writer, `writer(emitter, prim, ins, outs, **params)`):

| module | equations |
|---|---|
| `emitter` | the core: buffers, loops, copies, a jaxpr's equations (calls inlined), decompositions |
| `fusion`, `reduction_fusion`, `tasks` | elementwise runs as one loop, the reductions they feed folded in; loops on the cores |
| `elementwise` | arithmetic, math, comparisons, select, clamp, casts, rounding |
| `structural` | broadcast, reshape, transpose, rev, slices, concatenate, stack, split, pad, iota |
| `indexing` | dynamic slices, gather, scatter |
| `reductions`, `windows` | reductions, argmax/argmin, lax.reduce; window and cumulative reductions |
| `dot`, `conv` | dot_general; convolutions |
| `linalg` | cholesky, triangular_solve, lu and QR on LAPACK and the BLAS |
| `sort` | lax.sort of rows |
| `control_flow` | cond, scan, while, calls |
| `prng`, `complex_parts`, `parts` | PRNG keys and complex numbers, as their parts |
| `mojo`, `source` | Mojo text helpers and the prelude; the kernel's entry point |
| | any equation whose rule is a decomposition (`juju.lower_fun`) is written from it |
"""

from juju_kernels_mojo.codegen import (control_flow, conv, dot, elementwise, indexing, linalg,
                                       prng, reductions, sort, structural, windows)
from juju_kernels_mojo.codegen.emitter import EQUATIONS, FORWARDING, PARTS_CARRIERS, Emitter
from juju_kernels_mojo.codegen.mojo import Unsupported
from juju_kernels_mojo.codegen.source import LoopKernel, loop_source, shared_source

for _family in (elementwise, structural, indexing, reductions, dot, control_flow, prng, windows,
                conv, sort, linalg):
    EQUATIONS.update(_family.EQUATIONS)
PARTS_CARRIERS.update(control_flow.PARTS_CARRIERS)
FORWARDING.update(control_flow.FORWARDING)
FORWARDING.update(structural.FORWARDING)

__all__ = ["EQUATIONS", "Emitter", "LoopKernel", "Unsupported", "loop_source", "shared_source"]
