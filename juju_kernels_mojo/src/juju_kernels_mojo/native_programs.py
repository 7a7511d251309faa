"""Programs that are one generated kernel, called without MAX's runtime.

Where `program_kernels` makes a whole program one `mojo_program` equation,
or a program is one `scan` or `while_loop` that `loop_rules` writes as a
kernel, its MAX graph would be that one custom op, and MAX's
`Model.execute` would cost ~25 us a call on the CPU around a kernel that
often takes less (a lineax LU solve: 3 us). Here the same generated source,
with a C entry point in the place of the custom op's (`loop_source(...,
native=True)`), is built as a shared library (`mojo build --emit
shared-lib`, cached as kernel libraries are) and called through ctypes with
the buffers' addresses: the call costs ~3 us plus ~1.5 us per output buffer.

`runner` is the pack's `juju_program_runners` hook: it answers None (the MAX
graph, as before) on a GPU, for any other program, where the build fails,
and when the environment sets `JUJU_NATIVE_PROGRAMS=0`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path

import numpy as np

from juju import CompileError, JujuError, engine
from juju import primitives as P
from juju._compat import Literal, is_complex_dtype, is_key_dtype, scan_layout
from juju.buffers import host_buffer, to_numpy
from juju.compile_pool import abandon_if_exiting
from juju.dtypes import max_dtype, physical_aval
from juju_kernels_mojo import loop_rules, program_kernels
from juju_kernels_mojo.build import (build_shared_library, built_shared_library,
                                     generated_sources)
from juju_kernels_mojo.codegen import shared_source

#: The equations whose generated kernel may be a whole program.
KERNEL_PRIMITIVES = (program_kernels.program_p, P.scan_p, P.while_p)


class NativeProgramError(JujuError, RuntimeError):
    """A native program's kernel reported a failure."""


def enabled() -> bool:
    return os.environ.get("JUJU_NATIVE_PROGRAMS", "1") != "0"


def runner(closed_jaxpr, engine):
    """A `NativeProgram` running `closed_jaxpr` on `engine`, or None."""
    plan = _plan(closed_jaxpr, engine)
    if plan is None:
        return None
    eqn, operands, results, kernel = plan
    avals_out = [v.aval for v in eqn.outvars]
    try:
        library = _built.get(kernel.name) or _library(kernel.name, kernel.source)
        function = getattr(ctypes.CDLL(str(library)), kernel.name)
    except (CompileError, OSError, AttributeError) as exc:  # a generator bug: MAX runs it
        abandon_if_exiting()  # not a bug: the process exits under a daemon thread's build
        loop_rules.log.warning("juju: the native kernel of a program failed to build or load; "
                               "it runs as a MAX graph. Please report it with this "
                               "message:\n%s", exc)
        return None
    function.restype = ctypes.c_int32
    function.argtypes = [ctypes.c_void_p]
    consts = [np.ascontiguousarray(c) for c in kernel.consts]
    outs = [physical_aval(a) for a in avals_out]
    return NativeProgram(function, operands, consts, results,
                         [(np.dtype(a.dtype), tuple(a.shape)) for a in outs],
                         _in_place(eqn))


def _plan(closed_jaxpr, engine):
    """(equation, operand sources, result sources, kernel) of a program
    that a native kernel can run on `engine`, or None."""
    jaxpr = closed_jaxpr.jaxpr
    if (engine.kind != "cpu" or not enabled() or len(jaxpr.eqns) != 1
            or jaxpr.eqns[0].primitive not in KERNEL_PRIMITIVES):
        return None
    (eqn,) = jaxpr.eqns
    if eqn.primitive is not program_kernels.program_p and not program_kernels.enabled():
        return None  # JUJU_PROGRAM_KERNELS=0 keeps lone loops MAX graphs too
    operands = _operand_sources(closed_jaxpr, eqn)
    results = _result_sources(jaxpr, eqn)
    if operands is None or results is None:
        return None
    kernel = loop_rules.write_kernel(eqn.primitive, eqn.params, [v.aval for v in eqn.invars],
                                     [v.aval for v in eqn.outvars], "juju_native", native=True)
    return None if kernel is None else (eqn, operands, results, kernel)


_built: dict[str, Path] = {}  # kernel name -> the library `prepare` built it into


def prepare(closed_jaxprs, engine) -> None:
    """Build the kernels of the programs a native kernel can run, and that
    are not built yet, as one shared library (one `mojo build`: ~3 s, plus
    the code's own compile time, instead of ~3 s each); `runner` then finds
    them there. Where that build fails, it is split in halves, down to the
    kernel that fails, which `runner` builds alone (and runs as a MAX graph
    when that fails too)."""
    kernels = {}
    for closed_jaxpr in closed_jaxprs:
        plan = _plan(closed_jaxpr, engine)
        if plan is not None:
            kernels.setdefault(plan[3].name, plan[3])
    _build_together([k for k in kernels.values() if k.name not in _built and built_shared_library(
        generated_sources(k.name, {"program.mojo": k.source}), k.name) is None])


def _build_together(kernels: list) -> None:
    if len(kernels) < 2:
        return
    source = shared_source(kernels)
    name = f"juju_natives_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
    try:
        library = _library(name, source)
    except CompileError as exc:
        loop_rules.log.info("juju: %d native kernels did not build together (%s); halves "
                            "next", len(kernels), str(exc).splitlines()[0])
        half = len(kernels) // 2
        _build_together(kernels[:half])
        _build_together(kernels[half:])
        return
    for kernel in kernels:
        _built[kernel.name] = library


runner.prepare = prepare


def _in_place(eqn):
    """Whether the kernel of `eqn` may write result r into operand s's
    memory (a donated argument's): the generated code reads every operand
    before it writes a result, except where noted. A program (`codegen`'s
    `control_flow.call`) computes into scratch and copies its results last, so
    any operand its body does not return as it is; a scan or while_loop
    copies its initial carry into the carry results first and then reads
    only those, so carry r into its own operand."""
    if eqn.primitive is program_kernels.program_p:
        body = eqn.params["call_jaxpr"].jaxpr
        returned = {id(v) for v in body.outvars}
        return lambda s, r: id(body.invars[s]) not in returned
    if eqn.primitive is P.scan_p:
        num_consts, num_carry = scan_layout(**{k: v for k, v in eqn.params.items()
                                               if k in ("num_consts", "num_carry", "ft_in",
                                                        "ft_out")})
        return lambda s, r: r < num_carry and s == num_consts + r
    first = eqn.params["cond_nconsts"] + eqn.params["body_nconsts"]  # while
    return lambda s, r: s == first + r


def _operand_sources(closed_jaxpr, eqn) -> list | None:
    """For each operand of `eqn`: the program's argument index, or a numpy
    array (a literal or a closed-over constant); None where one is a PRNG
    key or complex constant (left to the MAX graph)."""
    jaxpr = closed_jaxpr.jaxpr
    arguments = {v: i for i, v in enumerate(jaxpr.invars)}
    consts = dict(zip(jaxpr.constvars, closed_jaxpr.consts))
    sources = []
    for v in eqn.invars:
        if not isinstance(v, Literal) and v in arguments:
            sources.append(arguments[v])
            continue
        if is_key_dtype(v.aval.dtype) or is_complex_dtype(v.aval.dtype):
            return None
        value = v.val if isinstance(v, Literal) else consts[v]
        sources.append(np.ascontiguousarray(np.asarray(value, v.aval.dtype)))
    return sources


def _result_sources(jaxpr, eqn) -> list | None:
    """For each program output: ("out", index of `eqn`'s result) or ("arg",
    the argument it returns); None where one is a literal or a constant."""
    defined = {v: i for i, v in enumerate(eqn.outvars)}
    arguments = {v: i for i, v in enumerate(jaxpr.invars)}
    sources = []
    for v in jaxpr.outvars:
        if isinstance(v, Literal):
            return None
        if v in defined:
            sources.append(("out", defined[v]))
        elif v in arguments:
            sources.append(("arg", arguments[v]))
        else:
            return None
    return sources


def _library(name: str, source: str) -> Path:
    """The built shared library of a native program's source."""
    folder = generated_sources(name, {"program.mojo": source})
    return build_shared_library(folder, name, "program.mojo")


def _allocator(dtype: np.dtype, shape: tuple):
    """A function making a new MAX buffer of `dtype` and `shape` over numpy
    memory (numpy allocates ~3x faster than MAX's Buffer())."""
    from max.driver import Buffer

    from_dlpack = Buffer._from_dlpack
    if dtype == np.bool_:  # numpy exports no bools through DLPack
        bool_type = max_dtype(dtype)
        return lambda: from_dlpack(np.empty(shape, np.uint8)).view(bool_type, shape)
    if dtype.kind == "V":  # bfloat16, float8: as host_buffer makes them
        return lambda: host_buffer(np.empty(shape, dtype))
    return lambda: from_dlpack(np.empty(shape, dtype))


class NativeProgram:
    """A program's generated kernel in a shared library, standing in for
    its MAX model (`juju.runners`): `execute(*buffers)` allocates the
    results and calls the kernel with every address; `alias` has it write
    results into donated arguments' buffers instead."""

    def __init__(self, function, operands, consts, results, out_types, in_place=None):
        self._function = function
        self._results = results
        self._in_place = in_place or (lambda s, r: False)
        self._aliased: dict[int, int] = {}  # kernel result -> program argument
        self._allocators = [_allocator(dtype, shape) for dtype, shape in out_types]
        # The kernel's arguments: the operands (a program argument's, filled
        # at each call, or a constant's), its consts, then its results.
        arrays = [s for s in operands if type(s) is not int] + list(consts)
        self._arrays = arrays  # kept alive: the kernel reads their memory
        self._template = [0 if type(s) is int else s.ctypes.data for s in operands]
        self._template += [c.ctypes.data for c in consts]
        self._template += [0] * len(out_types)
        self._argument_slots = [(slot, s) for slot, s in enumerate(operands) if type(s) is int]
        self._first_result = len(operands) + len(consts)
        self._pointer_array = ctypes.c_void_p * len(self._template)
        self._per_thread = threading.local()  # each thread's argument array
        self._workers_checked = False

    def alias(self, pairs) -> list:
        """Of the (argument, result) pairs of donated arguments, those this
        kernel writes in place (`_in_place`): from now on `execute` writes
        each such result into the argument's buffer and leaves it out of
        its results."""
        taken = []
        for j, k in pairs:
            kind, r = self._results[k]
            slots = [slot for slot, argument in self._argument_slots if argument == j]
            once = self._results.count((kind, r)) == 1  # a result returned twice stays new
            if kind == "out" and once and len(slots) == 1 and self._in_place(slots[0], r):
                self._aliased[r] = j
                taken.append((j, k))
        self._allocators = [None if r in self._aliased else allocate
                            for r, allocate in enumerate(self._allocators)]
        return taken

    def execute(self, *buffers):
        return self._execute_device_tensors(list(buffers))

    def _execute_device_tensors(self, buffers):
        arguments = getattr(self._per_thread, "arguments", None)
        if arguments is None:
            arguments = self._per_thread.arguments = self._pointer_array(*self._template)
        for slot, argument in self._argument_slots:
            arguments[slot] = buffers[argument]._data_ptr()
        outs = [buffers[self._aliased[r]] if allocate is None else allocate()
                for r, allocate in enumerate(self._allocators)]
        for slot, out in enumerate(outs, self._first_result):
            arguments[slot] = out._data_ptr()
        status = self._function(arguments)
        if not self._workers_checked:
            # Without a session, a kernel's first parallel region starts
            # MAX's workers: they get the nice value a session gives them
            # (juju.engine), or their spin takes the caller's core.
            engine.lower_worker_priority()
            self._workers_checked = True
        if status:
            raise NativeProgramError(
                f"juju: a native program's kernel failed (status {status}); set "
                "JUJU_NATIVE_PROGRAMS=0 to run it as a MAX graph, and please report it")
        # An argument returned: a copy (juju.runners); an aliased result: left out.
        return [outs[i] if kind == "out" else host_buffer(np.array(to_numpy(buffers[i])))
                for kind, i in self._results if kind != "out" or i not in self._aliased]
