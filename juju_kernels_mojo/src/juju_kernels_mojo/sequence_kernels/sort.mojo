# Sorting along the last axis of [rows, n] tensors, CPU only, rows in
# parallel. Every key becomes an unsigned 64-bit integer whose order is the
# order jax sorts in (see _order_key); an LSD radix sort of (key, index)
# pairs on 8-bit digits is then stable and O(n), skipping the digits that
# are equal in every key (a float32 key varies in 5 of its 8 bytes).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import parallelize
from std.math import isnan
from std.memory import bitcast

comptime SIGN = UInt64(1) << 63
comptime SMALL = 32  # rows up to this length: insertion sort


@always_inline
def _order_key[dtype: DType, signed_zeros: Bool, descending: Bool](v: Scalar[dtype]) -> UInt64:
    """An unsigned key in sort's order. Floats: -0.0 == +0.0 and every NaN
    equal and after +inf, as jax's sort comparator; with `signed_zeros`,
    XLA's total order (top_k): -NaN < -inf < ... < -0.0 < +0.0 < ... < +NaN.
    Integers by value."""
    var key: UInt64
    comptime if dtype.is_floating_point():
        var d = v.cast[DType.float64]()  # keeps the sign of zeros and NaNs
        comptime if not signed_zeros:
            if d == 0:
                d = 0
        var u = bitcast[DType.uint64](d)
        key = ~u if u & SIGN else u | SIGN
        comptime if not signed_zeros:
            if isnan(v):
                key = ~UInt64(0)
    elif dtype == DType.bool:
        key = UInt64(1) if v else UInt64(0)
    elif dtype.is_signed():
        key = bitcast[DType.uint64](v.cast[DType.int64]()) ^ SIGN
    else:
        key = v.cast[DType.uint64]()
    comptime if descending:
        return ~key
    else:
        return key


@always_inline
def _order_keys[
    dtype: DType, signed_zeros: Bool, descending: Bool, w: Int
](v: SIMD[dtype, w]) -> SIMD[DType.uint64, w]:
    """_order_key of w values at once."""
    var key: SIMD[DType.uint64, w]
    comptime if dtype.is_floating_point():
        var d = v.cast[DType.float64]()
        comptime if not signed_zeros:
            d = d.eq(0).select(SIMD[DType.float64, w](0), d)
        var u = bitcast[DType.uint64, w](d)
        key = (u & SIGN).ne(0).select(~u, u | SIGN)
        comptime if not signed_zeros:
            key = isnan(v).select(SIMD[DType.uint64, w](~UInt64(0)), key)
    else:
        key = SIMD[DType.uint64, w]()
        comptime for i in range(w):
            key[i] = _order_key[dtype, signed_zeros, False](v[i])
    comptime if descending:
        return ~key
    else:
        return key


def _sort_pairs(mut keys: List[UInt64], mut index: List[Int64], n: Int):
    """Stable sort of (keys[i], index[i]), i < n, by key."""
    var k = keys.unsafe_ptr()
    var p = index.unsafe_ptr()
    if n <= SMALL:
        for i in range(1, n):
            var key = k[unsafe_offset=i]
            var at = p[unsafe_offset=i]
            var j = i
            while j > 0 and k[unsafe_offset=j - 1] > key:
                k[unsafe_offset=j] = k[unsafe_offset=j - 1]
                p[unsafe_offset=j] = p[unsafe_offset=j - 1]
                j -= 1
            k[unsafe_offset=j] = key
            p[unsafe_offset=j] = at
        return
    var count_list = List[Int](length=8 * 256, fill=0)
    var counts = count_list.unsafe_ptr()
    for i in range(n):
        var key = k[unsafe_offset=i]
        comptime for b in range(8):
            counts[unsafe_offset=b * 256 + Int((key >> UInt64(8 * b)) & 255)] += 1
    var keys2 = List[UInt64](length=n, fill=0)
    var index2 = List[Int64](length=n, fill=0)
    var offset_list = List[Int](length=256, fill=0)
    var offsets = offset_list.unsafe_ptr()
    for b in range(8):
        var base = b * 256
        # a digit every key shares leaves the order as it is
        if counts[unsafe_offset=base + Int((k[unsafe_offset=0] >> UInt64(8 * b)) & 255)] == n:
            continue
        var total = 0
        for d in range(256):
            offsets[unsafe_offset=d] = total
            total += counts[unsafe_offset=base + d]
        var shift = UInt64(8 * b)
        var k2 = keys2.unsafe_ptr()
        var p2 = index2.unsafe_ptr()
        for i in range(n):
            var key = k[unsafe_offset=i]
            var d = Int((key >> shift) & 255)
            var pos = offsets[unsafe_offset=d]
            offsets[unsafe_offset=d] = pos + 1
            k2[unsafe_offset=pos] = key
            p2[unsafe_offset=pos] = p[unsafe_offset=i]
        swap(keys, keys2)
        swap(index, index2)
        k = keys.unsafe_ptr()
        p = index.unsafe_ptr()


@register("juju_sort_permutation")
struct SortPermutation[descending: Bool, signed_zeros: Bool]:
    """The permutation [rows, n] (int64) that stably sorts each row of keys,
    and the sorted keys."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        perm: OutputTensor[dtype=DType.int64, rank=2, ...],
        sorted: OutputTensor[rank=2, ...],
        keys: InputTensor[dtype=sorted.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_sort_permutation: CPU only"
        var rows = Int(keys.dim_size(0))
        var n = Int(keys.dim_size(1))

        def row(r: Int) {imm}:
            var k = List[UInt64](length=n, fill=0)
            var p = List[Int64](length=n, fill=0)
            var src = keys.unsafe_ptr().unsafe_offset(r * n)
            for i in range(n):
                k[i] = _order_key[keys.dtype, Self.signed_zeros, Self.descending](src[unsafe_offset=i])
                p[i] = Int64(i)
            _sort_pairs(k, p, n)
            var out = perm.unsafe_ptr().unsafe_offset(r * n)
            var out_keys = sorted.unsafe_ptr().unsafe_offset(r * n)
            for i in range(n):
                out[unsafe_offset=i] = p[i]
                out_keys[unsafe_offset=i] = src[unsafe_offset=Int(p[i])]

        if rows == 1:
            row(0)
        else:
            parallelize(row, rows)


@register("juju_top_k")
struct TopK:
    """The values and indices [rows, k] of the k largest of each row of x [rows, n]
    in XLA's total order (-0.0 < +0.0, -NaN smallest, +NaN largest), ties by
    lower index."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        values: OutputTensor[rank=2, ...],
        indices: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=values.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_top_k: CPU only"
        var rows = Int(x.dim_size(0))
        var n = Int(x.dim_size(1))
        var k = Int(values.dim_size(1))

        def row(r: Int) {imm}:
            var src = x.unsafe_ptr().unsafe_offset(r * n)
            # Keys in descending order: the smallest key is the largest value.
            var best = List[UInt64](length=k, fill=0)
            var where = List[Int64](length=k, fill=0)
            if k * 16 >= n:  # most of the row: sort all of it
                var keys = List[UInt64](length=n, fill=0)
                var index = List[Int64](length=n, fill=0)
                for i in range(n):
                    keys[i] = _order_key[x.dtype, True, True](src[unsafe_offset=i])
                    index[i] = Int64(i)
                _sort_pairs(keys, index, n)
                for j in range(k):
                    where[j] = index[j]
            else:  # a sorted list of the k best so far; most values fail one compare
                comptime W = 8
                var count = 0
                var checked = 0  # values before this one passed the SIMD test
                for i in range(n):
                    if count == k and i >= checked and i + W <= n:
                        var block = _order_keys[x.dtype, True, True, W](
                            src.unsafe_offset(i).unsafe_load[width=W]()
                        )
                        if not block.lt(SIMD[DType.uint64, W](best[k - 1])).reduce_or():
                            checked = i + W
                    if i < checked:
                        continue
                    var key = _order_key[x.dtype, True, True](src[unsafe_offset=i])
                    if count == k and key >= best[k - 1]:
                        continue
                    var j = count if count < k else k - 1
                    while j > 0 and best[j - 1] > key:  # after equal keys: stable
                        best[j] = best[j - 1]
                        where[j] = where[j - 1]
                        j -= 1
                    best[j] = key
                    where[j] = Int64(i)
                    if count < k:
                        count += 1
            var out_v = values.unsafe_ptr().unsafe_offset(r * k)
            var out_i = indices.unsafe_ptr().unsafe_offset(r * k)
            for j in range(k):
                var i = Int(where[j])
                out_v[unsafe_offset=j] = src[unsafe_offset=i]
                out_i[unsafe_offset=j] = Scalar[indices.dtype](i)

        if rows == 1:
            row(0)
        else:
            parallelize(row, rows)
