"""`Executable`: a loaded MAX model, fed with a call's leaves, returning its pytree."""

from __future__ import annotations

import jax
from jax import tree_util

from juju._compat import wrap_key_data
from juju.arguments import to_buffer, to_jax, to_jax_all, to_numpy
from juju.buffers import unshare
from juju.donation import check_not_repeated, delete_donated, place, take_buffers
from juju.dtypes import complex_from_parts


class Executable:
    """A loaded MAX model plus how to feed it and rebuild the output pytree.

    `donated`: the (argument, result) pairs of the donated arguments a
    result uses (`juju.donation.alias_plan`): those jax arrays are deleted
    after each call. `aliases`: the pairs the model writes in place, leaving
    them out of its results (the MAX graph's buffer inputs, or what a pack's
    model took); `name` names the function in errors.
    """

    def __init__(self, model, in_dtypes, out_tree, coerces_to_jnp, device, out_key_impls=(),
                 out_complex=(), in_nbytes=None, fresh_outputs=False, donated=(), aliases=(),
                 name="fn"):
        self.model = model
        self.donated = donated
        self.aliases = aliases
        self.name = name
        self.fresh_outputs = fresh_outputs  # never an input's memory (juju.runners' models)
        self.in_nbytes = in_nbytes  # bytes of each input buffer; None: shapes vary
        self.out_key_impls = out_key_impls  # (output index, PRNG impl) of key outputs
        self.out_complex = out_complex  # (output index, complex dtype): float pairs in MAX
        self.in_dtypes = in_dtypes
        self.out_tree = out_tree
        self.coerces_to_jnp = coerces_to_jnp
        self.device = device
        # Model.execute's Python wrapper re-checks each input (type,
        # contiguity) at ~1 us per input; juju's buffers are contiguous MAX
        # buffers by construction, so call the native entry point directly.
        native = getattr(model, "_execute_device_tensors", None)
        self._execute = native if native is not None else lambda b: model.execute(*b)

    def run(self, leaves):
        device = self.device
        buffers = [to_buffer(x, d, device) for x, d in zip(leaves, self.in_dtypes)]
        if self.donated:
            check_not_repeated(leaves, self.donated, self.name)
        if self.aliases:  # results go into these buffers: ours to overwrite
            take_buffers(leaves, buffers, self.aliases)
        outs = self._execute(buffers)
        if not self.fresh_outputs:
            unshare(outs, buffers, self.in_nbytes)
        if self.aliases:
            outs = place(outs, buffers, self.aliases)
        if self.donated:
            delete_donated(leaves, self.donated)
        if self.coerces_to_jnp:
            outs = to_jax_all(outs)
        for i, impl in self.out_key_impls:
            data = outs[i] if self.coerces_to_jnp else to_jax(outs[i])  # already jax
            outs[i] = wrap_key_data(data, impl)
        for i, dtype in self.out_complex:
            outs[i] = jax.numpy.asarray(complex_from_parts(to_numpy(outs[i]), dtype))
        return tree_util.tree_unflatten(self.out_tree, outs)
