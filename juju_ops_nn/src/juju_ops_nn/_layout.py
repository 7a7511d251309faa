"""Helpers shared by the conv and pooling rules: padding that may be negative,
zero-insertion (dilation) of an axis, and strided windows."""

from __future__ import annotations

from max.graph import ops


def pad_or_crop(x, shape, pads, value=0):
    """Pad (lo, hi) per axis with `value`; negative amounts crop instead."""
    grow = []
    crop = []
    needs_crop = False
    for n, (lo, hi) in zip(shape, pads):
        lo, hi = int(lo), int(hi)
        grow += [max(lo, 0), max(hi, 0)]
        start, stop = max(-lo, 0), n + max(lo, 0) + max(hi, 0) - max(-hi, 0)
        crop.append(slice(start, stop))
        needs_crop |= lo < 0 or hi < 0
    if any(grow):
        x = ops.pad(x, grow, value=value)
    if needs_crop:
        x = ops.slice_tensor(x, crop)
    return x


def dilate(x, shape, factors, value=0):
    """Insert `factor - 1` copies of `value` between neighbours along each axis
    (XLA's base/lhs dilation): reshape to (..., n, 1, ...), pad the new axis to
    `factor`, merge and drop the trailing fill. Returns (x, new_shape)."""
    shape = list(shape)
    for axis, k in enumerate(factors):
        k = int(k)
        n = shape[axis]
        if k == 1 or n == 0:
            continue
        expanded = shape[: axis + 1] + [1] + shape[axis + 1 :]
        x = ops.reshape(x, expanded)
        grow = [0] * (2 * len(expanded))
        grow[2 * (axis + 1) + 1] = k - 1
        x = ops.pad(x, grow, value=value)
        x = ops.reshape(x, shape[:axis] + [n * k] + shape[axis + 1 :])
        new_n = (n - 1) * k + 1
        x = ops.slice_tensor(x, [slice(0, new_n) if a == axis else slice(None) for a in range(len(shape))])
        shape[axis] = new_n
    return x, shape


def window_slices(x, shape, window, strides, window_dilation, out_shape):
    """Yield (offset, view) for every position in the window: the view picks,
    for every output position, the input element at that window offset."""
    import itertools

    for offset in itertools.product(*(range(int(w)) for w in window)):
        index = []
        for axis, (o, s, d, m) in enumerate(zip(offset, strides, window_dilation, out_shape)):
            start = o * int(d)
            stop = start + (int(m) - 1) * int(s) + 1
            index.append(slice(start, stop, int(s)))
        yield offset, ops.slice_tensor(x, index) if any(
            sl != slice(0, n, 1) for sl, n in zip(index, shape)
        ) else x
