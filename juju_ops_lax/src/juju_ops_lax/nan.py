"""NaN-correct building blocks: MAX 26.7's CPU kernels are compiled as if no
float were NaN (LLVM's `nnan`), so its ops get NaN wrong (`exp`, `tanh`,
`sigmoid`, `relu` of NaN are inf/1/0/0; `not_equal` is an *ordered*
comparison, false for NaN; `equal(x, x)` folds to true). `ops.is_nan` itself
is exact, so the rules test for NaN with it and select the IEEE answer.
No graph compile option or environment variable turns that assumption off.
"""

from __future__ import annotations

from max.graph import ops

from juju_ops_lax import mixed


def unordered(x, y):
    """True where x or y is NaN."""
    return ops.logical_or(ops.is_nan(x), ops.is_nan(y))


def equal(x, y):
    """IEEE x == y for floats (false where either is NaN, also for x is y)."""
    return ops.logical_and(mixed.equal(x, y), ops.logical_not(unordered(x, y)))


def not_equal(x, y):
    """IEEE x != y for floats (true where either is NaN)."""
    return ops.logical_not(equal(x, y))


def ordered(compare):
    """An ordered comparison that is false where an operand is NaN, even after
    MAX folds `compare(x, x)`."""

    def safe(x, y):
        return ops.logical_and(compare(x, y), ops.logical_not(unordered(x, y)))

    safe.__name__ = compare.__name__
    return safe


def passthrough(op):
    """op(x), but NaN where x is NaN (op's kernel assumes x is not NaN)."""

    def safe(x):
        return mixed.where(ops.is_nan(x), x, op(x))

    safe.__name__ = op.__name__
    return safe
