"""Donated arguments (`donate_argnums`, `donate_argnames`), as in `jax.jit`.

A donated argument's memory may hold a result: each donated leaf is matched
to the first result not yet matched with its shape and dtype (as XLA
matches them), a result the program computes (not an argument or a constant
it returns). Per matched pair, the MAX graph takes that argument as a
mutable buffer and stores the result into it (`juju.interpreter`), and a
pack's program runner that can write it in place does (`juju.runners`):
the result is then the argument's memory, and no new buffer is allocated.

A MAX graph stores only into the arguments that elementwise equations
alone read (`stored_in_graph`): MAX's `buffer_load` is a copy unless it
fuses into the store's kernel, so a parameter a product also reads would be
copied whole each call and save nothing; its result gets memory of its own
and the argument is deleted after the call all the same.

After the call, each donated jax array that was matched is deleted
(`x.is_deleted()`; using it raises jax's error), as `jax.jit` deletes them;
one that matches no result is kept, with jax's warning "Some donated buffers
were not usable". A donated MAX buffer may be overwritten: do not read it
after the call. numpy arrays and Python scalars are never written: jax
copies them to its device first, and juju copies such an argument before
a result takes its memory.
"""

from __future__ import annotations

import warnings

from juju._compat import is_complex_dtype
from juju.buffers import max_driver
from juju.dtypes import is_symbolic_dim, physical_aval


def donated_leaves(treedef, statics, positions, names) -> tuple[bool, ...]:
    """Whether each leaf of the non-static `(args, kwargs)` is donated
    (jax's `donation_vector`): the leaves of the positional arguments at
    `positions` (counted with the static ones, `statics`' positions) and
    of the keyword arguments in `names`."""
    args_tree, kwargs_tree = treedef.children()
    static_positions = {i for i, _ in statics if isinstance(i, int)}
    flags: list[bool] = []
    position = 0
    for arg in args_tree.children():
        while position in static_positions:
            position += 1
        flags += [position in positions] * arg.num_leaves
        position += 1
    for key, value in zip(kwargs_tree.node_data()[1], kwargs_tree.children()):
        flags += [key in names] * value.num_leaves
    return tuple(flags)


def alias_plan(closed_jaxpr, donated) -> tuple[tuple[int, int], ...]:
    """(argument leaf, result) pairs: each donated leaf with the first
    unmatched result of its shape and dtype that the program computes."""
    if not any(donated):
        return ()
    jaxpr = closed_jaxpr.jaxpr
    computed = {id(v) for eqn in jaxpr.eqns for v in eqn.outvars}
    results = [(k, _layout(v.aval)) for k, v in enumerate(jaxpr.outvars)
               if id(v) in computed and _layout(v.aval) is not None]
    taken: set[int] = set()
    plan = []
    for j, (var, flag) in enumerate(zip(jaxpr.invars, donated)):
        layout = _layout(var.aval) if flag else None
        if layout is None:
            continue
        for k, result in results:
            if k not in taken and result == layout:
                taken.add(k)
                plan.append((j, k))
                break
    return tuple(plan)


#: Equations MAX fuses with a `buffer_store` of their result: the argument is
#: read element by element where it is written.
_ELEMENTWISE = frozenset("""
    abs add and atan2 cbrt ceil clamp convert_element_type copy copy_p cos cosh div eq
    erf erf_inv erfc exp exp2 expm1 floor ge gt imag integer_pow is_finite le lgamma
    log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision
    rem round rsqrt select_n sign sin sinh sqrt square sub tan tanh xor
""".split())


def stored_in_graph(closed_jaxpr, aliases) -> tuple[tuple[int, int], ...]:
    """The `aliases` pairs a MAX graph stores in place: those whose argument
    only elementwise equations of its shape read (an optimizer's moments,
    not weights a product reads too)."""
    if not aliases:
        return ()
    jaxpr = closed_jaxpr.jaxpr
    readers: dict = {}
    for e in jaxpr.eqns:
        for v in e.invars:
            readers.setdefault(id(v), []).append(e)
    returned = {id(v) for v in jaxpr.outvars}

    def fused(var) -> bool:
        return id(var) not in returned and all(
            e.primitive.name in _ELEMENTWISE
            and all(o.aval.shape == var.aval.shape for o in e.outvars)
            for e in readers.get(id(var), ()))

    return tuple((j, k) for j, k in aliases if fused(jaxpr.invars[j]))


def _layout(aval):
    """(shape, dtype) of an aval's buffer; None where it cannot be shared
    (complex results come back converted; symbolic shapes vary)."""
    if is_complex_dtype(aval.dtype) or any(is_symbolic_dim(d) for d in aval.shape):
        return None
    physical = physical_aval(aval)
    return tuple(physical.shape), physical.dtype


def warn_unusable(closed_jaxpr, donated, plan, stacklevel: int = 3) -> None:
    """jax's warning for donated leaves that no result can use."""
    used = {j for j, _ in plan}
    unused = [str(v.aval) for j, (v, flag) in enumerate(zip(closed_jaxpr.jaxpr.invars, donated))
              if flag and j not in used]
    if unused:
        warnings.warn(f"Some donated buffers were not usable: {', '.join(unused)}.\n"
                      "See an explanation at "
                      "https://docs.jax.dev/en/latest/faq.html#buffer-donation.",
                      stacklevel=stacklevel)


def check_not_repeated(leaves, donated, name: str) -> None:
    """Raise ValueError where a donated argument is passed twice."""
    for j, _ in donated:
        if any(other is leaves[j] for i, other in enumerate(leaves) if i != j):
            raise ValueError(
                f"juju.jit({name}): argument {j} (flat) is donated and passed again as "
                "another argument of the same call; pass a copy, or do not donate it")


def take_buffers(leaves, buffers, aliases) -> None:
    """Make each aliased argument's buffer one a result may overwrite: a
    donated MAX buffer or jax array's own (the array is deleted after the
    call), a copy of anything else's (a numpy array, a scalar)."""
    Buffer = max_driver().Buffer
    import jax

    copied = None
    for j, _ in aliases:
        leaf = leaves[j]
        if not isinstance(leaf, (Buffer, jax.Array)):  # numpy memory stays the caller's
            buffers[j] = copied = buffers[j].copy()
    if copied is not None:  # MAX copies asynchronously; a pack's kernel reads it now
        copied.device.synchronize()


def place(outs: list, buffers, aliases) -> list:
    """The results with each aliased one, which the model wrote into its
    argument's buffer and did not return, put back in its place."""
    full = list(outs)
    for j, k in sorted(aliases, key=lambda pair: pair[1]):
        full.insert(k, buffers[j])
    return full


def delete_donated(leaves, plan) -> None:
    """Delete the donated jax arrays that a result used, as jax does."""
    import jax

    for j, _ in plan:
        leaf = leaves[j]
        if isinstance(leaf, jax.Array) and not leaf.is_deleted():
            leaf.delete()
