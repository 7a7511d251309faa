"""A generated kernel's whole source: the entry point (a MAX custom op, or
a C function for `native_programs`), the pools, and the equation's body."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from juju.dtypes import physical_aval
from juju_kernels_mojo.codegen import fusion, linalg, parts, prng, sort
from juju_kernels_mojo.codegen.emitter import Emitter
from juju_kernels_mojo.codegen.mojo import PRELUDE, THREADS_PRELUDE, Array, mojo_dtype


@dataclass(frozen=True)
class LoopKernel:
    """A generated kernel: its registered name, source, and the arrays the
    rule passes after the loop's operands (the jaxprs' closed-over consts)."""

    name: str
    source: str
    consts: tuple
    work: int
    preludes: tuple[str, ...] = ()  # what `source` starts with: imports and helpers


def shared_source(kernels) -> str:
    """One Mojo source for several kernels: each prelude once, then each
    kernel's own code (its entry point and body)."""
    preludes = list(dict.fromkeys(p for k in kernels for p in k.preludes))
    return "\n".join([*preludes, *(k.source.removeprefix("\n".join(k.preludes))
                                   for k in kernels)])


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
            parts.deinterleave(e, data, value)
            data = value
        ins.append(data)
    results = [Array(f"r{i}", tuple(d.shape), np.dtype(d.dtype)) for i, d in enumerate(out_data)]
    outs = [e.value(a.shape, a.dtype) if d is not a else r
            for a, d, r in zip(out_avals, out_data, results)]
    e.equation(prim, ins, outs, params)
    for out, result in zip(outs, results):
        if out is not result:
            parts.interleave(e, out, result)
    inputs = [*in_data, *e.consts]
    indent = "        "
    if native:
        entry = _native_entry(name, inputs, out_data, len(in_avals))
    else:
        entry = _custom_op_entry(name, inputs, out_data, len(in_avals))
    preludes = (PRELUDE, *([THREADS_PRELUDE] if e.threads else []),
                *([fusion.FUSION_PRELUDE] if e.fusion else []),
                *([linalg.LINALG_PRELUDE] if e.linalg else []), prng.PRELUDE, sort.PRELUDE)
    source = "\n".join([
        *preludes,
        "",
        *entry,
        # XLA's and MAX's CPU kernels read and write denormals as zeros.
        indent + "with FlushDenormals():",
        *(indent + "    " + line for line in e.decls()),
        *e.lines,
        *([] if not native else ["    except:", "        return 1", "    return 0"]),
        "",
    ])
    return LoopKernel(name, source, tuple(e.consts), e.work, preludes)


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
