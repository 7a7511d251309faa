"""Comparing juju results with jax.jit: values, shapes and dtypes."""

from __future__ import annotations

import contextlib
import os

import jax
import numpy as np


def to_numpy(value):
    import juju

    return juju.to_numpy(value)  # handles bfloat16/float8 buffers too


def tolerance(dtype) -> dict:
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return dict(rtol=0, atol=0)
    if dtype.itemsize <= 2:
        return dict(rtol=2e-2, atol=2e-2)
    if dtype == np.float64:
        return dict(rtol=1e-12, atol=1e-12)
    return dict(rtol=2e-5, atol=1e-6)


def assert_same(actual, expected, **tol):
    """juju's result equals jax.jit's: same tree, shapes, dtypes and values."""
    actual_leaves, actual_tree = jax.tree_util.tree_flatten(actual)
    expected_leaves, expected_tree = jax.tree_util.tree_flatten(expected)
    assert actual_tree == expected_tree, f"pytree {actual_tree} != {expected_tree}"
    for a, e in zip(actual_leaves, expected_leaves):
        a, e = to_numpy(a), np.asarray(e)
        assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"dtype {a.dtype} != {e.dtype}"
        np.testing.assert_allclose(
            a.astype(np.float64) if a.dtype.kind == "V" else a,
            e.astype(np.float64) if e.dtype.kind == "V" else e,
            equal_nan=True,
            **(tol or tolerance(e.dtype)),
        )


def fused_softmax_op() -> str:
    """What a fused softmax is in the MAX graph text: juju-kernels-mojo's
    kernel outranks MAX's softmax op on CPU when that pack is loaded."""
    import juju

    loaded = {p.name for p in juju.plugins.packs() if p.loaded}
    return "juju_row_softmax" if "mojo" in loaded else "mo.reduce.softmax"


def selected(request, *argnames: str) -> set:
    """The values of `argnames` (one: the value; several: a tuple) among this
    module's tests that the session runs (after -m and -k): a module fixture
    compiles only those, so the cases marked `full` cost CI nothing."""
    return {item.callspec.params[argnames[0]] if len(argnames) == 1
            else tuple(item.callspec.params[name] for name in argnames)
            for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec")
            and all(name in item.callspec.params for name in argnames)}


def param(*values, full: bool = False, marks=(), **kwargs):
    """`pytest.param` of a case, marked `full` (the full tier only) if asked."""
    import pytest

    return pytest.param(*values, marks=[*marks, *([pytest.mark.full] if full else [])], **kwargs)


@contextlib.contextmanager
def packs_blocked(*names: str):
    """Lower with these packs blocked (`JUJU_BLOCK_PLUGINS`), e.g. juju_ops_lax's
    loops with the mojo pack's kernels out of the way."""
    from juju import plugins

    saved = os.environ.get("JUJU_BLOCK_PLUGINS")
    os.environ["JUJU_BLOCK_PLUGINS"] = ",".join(names)
    plugins.reload()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["JUJU_BLOCK_PLUGINS"]
        else:
            os.environ["JUJU_BLOCK_PLUGINS"] = saved
        plugins.reload()
