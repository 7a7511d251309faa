"""Control flow and calls: cond (lax.platform_dependent's CPU branch
alone), scan, while_loop (vmap's batched predicate as XLA lowers it), and
the call wrappers (jit, custom_jvp/vjp, remat, ...), whose jaxprs are
written inline."""

from __future__ import annotations

import numpy as np

from juju import inlining
from juju import primitives as P
from juju._compat import call_primitives, open_jaxpr, scan_layout
from juju.lowering_helpers import platform_branch
from juju_kernels_mojo.codegen.mojo import Unsupported, index_expr
from juju_kernels_mojo.codegen.mojo import strides as row_major


def call(emitter, prim, ins, outs, **params):
    for src, dst in zip(call_results(emitter, ins, params), outs, strict=True):
        emitter.copy(src, dst)


def identity(emitter, prim, ins, outs, **params):
    for src, dst in zip(ins, outs, strict=True):
        emitter.copy(src, dst)


def call_results(emitter, ins, params, out_avals=None) -> list:
    """A call's results where its body computed them."""
    return emitter.jaxpr(params.get("jaxpr", params.get("call_jaxpr")), ins)


def identity_results(emitter, ins, params, out_avals=None) -> list:
    return list(ins)


def cond(emitter, prim, ins, outs, *, branches, **params):
    index, operands = ins[0], ins[1:]
    platforms = params.get("branches_platforms")
    if platforms is not None:  # lax.platform_dependent: the CPU's branch alone
        branch = branches[platform_branch(platforms, on_cpu=True)]
        for src, dst in zip(emitter.jaxpr(branch, operands), outs, strict=True):
            emitter.copy(src, dst)
        return
    which = emitter.fresh("w")
    emitter.emit(f"var {which} = Int({index.at('0')})")
    for k, branch in enumerate(branches):
        last = k == len(branches) - 1
        header = "else:" if last else f"{'if' if k == 0 else 'elif'} {which} == {k}:"
        if len(branches) == 1:
            header = "if True:"
        with emitter.block(header):  # results computed straight into `outs`
            for src, dst in zip(emitter.jaxpr(branch, operands, into=dict(enumerate(outs))),
                                outs, strict=True):
                emitter.copy(src, dst)


def scan(emitter, prim, ins, outs, *, reverse, length, jaxpr, unroll=1,
         _split_transpose=False, **layout):
    if _split_transpose:
        raise Unsupported("scan with _split_transpose")
    num_consts, num_carry = scan_layout(**layout)
    consts, init = ins[:num_consts], ins[num_consts:num_consts + num_carry]
    xs = ins[num_consts + num_carry:]
    carry, ys = outs[:num_carry], outs[num_carry:]
    for src, dst in zip(init, carry):
        emitter.copy(src, dst)
    staged = [emitter.like(c) for c in carry]
    step = emitter.fresh("step")
    with emitter.repeated(f"for {step} in range({length}):"):
        index = f"{length - 1} - {step}" if reverse else step
        rows = [x.row(index) for x in xs]
        body_outs = emitter.jaxpr(jaxpr, [*consts, *carry, *rows], into=dict(enumerate(carry)))
        for src, dst in zip(body_outs[num_carry:], ys):  # a y may be an old carry
            emitter.copy(src, dst.row(index))
        emitter.advance(body_outs[:num_carry], staged, carry)


def while_loop(emitter, prim, ins, outs, *, cond_jaxpr, body_jaxpr, cond_nconsts,
               body_nconsts):
    batch = tuple(open_jaxpr(cond_jaxpr).outvars[0].aval.shape)
    cond_consts = ins[:cond_nconsts]
    body_consts = ins[cond_nconsts:cond_nconsts + body_nconsts]
    init = ins[cond_nconsts + body_nconsts:]
    for src, dst in zip(init, outs):
        emitter.copy(src, dst)
    staged = [emitter.like(c) for c in outs]
    running = emitter.scratch(batch, np.dtype(np.bool_)) if batch else None
    with emitter.repeated("while True:"):
        (pred,) = emitter.jaxpr(cond_jaxpr, [*cond_consts, *outs])
        if not batch:
            emitter.emit(f"if not {pred.at('0')}:")
            emitter.emit("    break")
            body_outs = emitter.jaxpr(body_jaxpr, [*body_consts, *outs],
                                      into=dict(enumerate(outs)))
        else:  # vmap's while: on while any element runs, each carry kept where it stopped
            emitter.copy(pred, running)
            body_outs = batched_step(emitter, running, body_jaxpr, body_consts, outs)
        emitter.advance(body_outs, staged, outs)


def batched_step(emitter, running, body_jaxpr, body_consts, carry) -> list:
    """One trip of a while whose predicate `running` is batched (as XLA
    lowers it): stop when no element runs; else the body's result where
    an element runs (its leading axes), the carry where it stopped."""
    batch = running.shape
    any_running = emitter.fresh("running")
    emitter.emit(f"var {any_running} = False")
    emitter.nest(batch, lambda idx: emitter.emit(
        f"{any_running} = {any_running} or {running.at(index_expr(idx, row_major(batch)))}"))
    emitter.emit(f"if not {any_running}:")
    emitter.emit("    break")
    new = emitter.jaxpr(body_jaxpr, [*body_consts, *carry])
    chosen = []
    for value, old in zip(new, carry):
        mask = emitter.scratch(old.shape, np.dtype(np.bool_))
        emitter.equation(P.broadcast_in_dim_p, [running], [mask],
                      {"shape": tuple(old.shape), "sharding": None,
                       "broadcast_dimensions": tuple(range(len(batch)))})
        kept = emitter.like(old)
        emitter.equation(P.select_n_p, [mask, old, value], [kept], {})
        chosen.append(kept)
    return chosen


EQUATIONS = {
    P.cond_p: cond,
    P.scan_p: scan,
    P.while_p: while_loop,
    P.jit_p: call,
    P.custom_jvp_call_p: call,
    P.custom_vjp_call_p: call,
    P.remat_p: call,
    P.stop_gradient_p: identity,
    P.copy_p: identity,
    P.device_put_p: identity,  # one device: the values as they are
    P.optimization_barrier_p: identity,
    **{p: call for p in call_primitives},
}
#: These pass values through as they are (into sub-jaxprs, or copied whole).
PARTS_CARRIERS = {call, identity, cond, scan, while_loop}
#: Values are immutable, so a call's or an identity's outputs are bound to
#: the values it returns, uncopied (a copy of a 16M-element result was a
#: pass over 64 MB).
FORWARDING = {prim: call_results if method is call else identity_results
              for prim, method in EQUATIONS.items() if method in (call, identity)}


#: Calls whose bodies `inlined` writes in place of them.
INLINED = {prim for prim, method in EQUATIONS.items() if method is call}


def inlined(jaxpr, decomposition=None):
    """`juju.inlining.inlined` of the calls this module writes as their
    bodies (`INLINED`: jit, custom_jvp/vjp, remat, at any depth), as XLA
    inlines them: fused runs and reductions then span a library's calls (a
    loss's `log_sigmoid`, a norm). With `decomposition(eqn)` (the closed
    jaxpr a primitive without an equation writer is lowered as, or None),
    those are inlined too: equinox's `select_if_vmap(p, x, y)` is `x`, and
    `y` is then read by nothing (its copy into a new buffer went each trip)."""
    return inlining.inlined(jaxpr, INLINED, decomposition)
