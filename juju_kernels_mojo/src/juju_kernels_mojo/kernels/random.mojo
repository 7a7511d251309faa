# The Threefry-2x32 hash of jax.random (20 rounds), elementwise over uint32.
# Two outputs; each `foreach` pass computes the hash and keeps one word.
from extensibility import register, InputTensor, OutputTensor, foreach
from max.gpu.host import DeviceContext
from std.utils.coord import Coord

comptime U32 = DType.uint32


@always_inline
def _rotl[r: Int, w: Int](v: SIMD[U32, w]) -> SIMD[U32, w]:
    return (v << SIMD[U32, w](r)) | (v >> SIMD[U32, w](32 - r))


@always_inline
def _rounds[
    r0: Int, r1: Int, r2: Int, r3: Int, w: Int
](mut x0: SIMD[U32, w], mut x1: SIMD[U32, w]):
    x0 += x1
    x1 = _rotl[r0](x1) ^ x0
    x0 += x1
    x1 = _rotl[r1](x1) ^ x0
    x0 += x1
    x1 = _rotl[r2](x1) ^ x0
    x0 += x1
    x1 = _rotl[r3](x1) ^ x0


@always_inline
def _threefry[
    which: Int, w: Int
](
    k0: SIMD[U32, w], k1: SIMD[U32, w], c0: SIMD[U32, w], c1: SIMD[U32, w]
) -> SIMD[U32, w]:
    var k2 = k0 ^ k1 ^ SIMD[U32, w](0x1BD11BDA)
    var x0 = c0 + k0
    var x1 = c1 + k1
    _rounds[13, 15, 26, 6](x0, x1)
    x0 += k1
    x1 += k2 + 1
    _rounds[17, 29, 16, 24](x0, x1)
    x0 += k2
    x1 += k0 + 2
    _rounds[13, 15, 26, 6](x0, x1)
    x0 += k0
    x1 += k1 + 3
    _rounds[17, 29, 16, 24](x0, x1)
    x0 += k1
    x1 += k2 + 4
    _rounds[13, 15, 26, 6](x0, x1)
    x0 += k2
    x1 += k0 + 5
    comptime if which == 0:
        return x0
    else:
        return x1


@register("juju_threefry2x32")
struct Threefry2x32:
    """Threefry-2x32 of counts (c0, c1) under key (k0, k1), like lax's primitive."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        out0: OutputTensor[dtype=U32, ...],
        out1: OutputTensor[dtype=U32, rank=out0.rank, ...],
        k0: InputTensor[dtype=U32, rank=out0.rank, ...],
        k1: InputTensor[dtype=U32, rank=out0.rank, ...],
        c0: InputTensor[dtype=U32, rank=out0.rank, ...],
        c1: InputTensor[dtype=U32, rank=out0.rank, ...],
        ctx: DeviceContext,
    ) raises:
        def first[w: Int](idx: Coord[...]) {var k0, var k1, var c0, var c1} -> SIMD[U32, w]:
            return _threefry[0](
                k0.load[w](idx), k1.load[w](idx), c0.load[w](idx), c1.load[w](idx)
            )

        def second[w: Int](idx: Coord[...]) {var k0, var k1, var c0, var c1} -> SIMD[U32, w]:
            return _threefry[1](
                k0.load[w](idx), k1.load[w](idx), c0.load[w](idx), c1.load[w](idx)
            )

        foreach[target=target](first, out0, ctx)
        foreach[target=target](second, out1, ctx)
