# Fast Fourier transforms on the CPU: complex (juju_fft), real to complex
# (juju_rfft) and complex to real (juju_irfft), along one axis, every
# length. fft_rules.py plans each length on the host: radix-4, 2, 3 and
# odd-prime (up to fft_rules.MAX_PRIME) stages of a Stockham autosort FFT
# (no bit reversal: each stage reads one buffer and writes the other in
# order), or Bluestein's chirp-z algorithm (a convolution by a power-of-two
# FFT) for a larger prime factor; the plan is an int64 tensor, its twiddles
# a [T, 2] table computed in float64 and rounded once.
#
# W lines (signals) are transformed together, one per SIMD lane: a complex
# element of the W lines is two vectors (real parts, imaginary parts), so
# every butterfly is SIMD whatever its stride, and twiddles are scalars
# broadcast across the lanes. A group of W lines is gathered into a private
# buffer (lanes past the last line are zeros), transformed, and scattered
# into the output; groups run on MAX's worker threads. Only the forward
# transform is written: the inverse is conj(FFT(conj(x))).
from extensibility import register, InputTensor, OutputTensor
from max.gpu.host import DeviceContext
from max.algorithm import sync_parallelize
from std.sys import num_physical_cores

comptime STAGES = 0
comptime BLUESTEIN = 1
# Below this many complex elements (lines x length) one thread does it all:
# waking MAX's workers costs more.
comptime SERIAL_ELEMENTS = 1 << 15


comptime Buf[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]
comptime Plan = Pointer[Int64, MutAnyOrigin]
comptime Table[dtype: DType] = Pointer[Scalar[dtype], MutAnyOrigin]


# --- lanes: element i of a buffer is re at [2 i W, +W), im at [(2 i + 1) W, +W)


@always_inline
def _re[dtype: DType, W: Int](b: Buf[dtype], i: Int) -> SIMD[dtype, W]:
    return b.unsafe_offset(2 * i * W).unsafe_load[width=W]()


@always_inline
def _im[dtype: DType, W: Int](b: Buf[dtype], i: Int) -> SIMD[dtype, W]:
    return b.unsafe_offset((2 * i + 1) * W).unsafe_load[width=W]()


@always_inline
def _put[dtype: DType, W: Int](b: Buf[dtype], i: Int, re: SIMD[dtype, W], im: SIMD[dtype, W]):
    b.unsafe_offset(2 * i * W).unsafe_store(re)
    b.unsafe_offset((2 * i + 1) * W).unsafe_store(im)


@always_inline
def _put_twiddled[
    dtype: DType, W: Int
](b: Buf[dtype], i: Int, re: SIMD[dtype, W], im: SIMD[dtype, W], wr: Scalar[dtype], wi: Scalar[dtype]):
    _put[dtype, W](b, i, re * wr - im * wi, re * wi + im * wr)


# --- Stockham stages: src holds n / (p m) interleaved transforms of length
# p m (element r + s (q + m j) is element q + m j of transform r, s = n / (p m));
# dst gets element r + s (p q + k) = (DFT_p of a_j = src[r + s (q + m j)])_k
# times w^(q k), w = exp(-2 pi i / (p m)), whose table holds w^(q k) at
# (k - 1) m + q. q = 0 skips the multiply by 1 (and so keeps inf + 0i finite
# where a product by 1 + 0i would make inf * 0).


def _radix2[dtype: DType, W: Int](src: Buf[dtype], dst: Buf[dtype], m: Int, s: Int, tw: Table[dtype]):
    for q in range(m):
        var wr = tw[unsafe_offset=2 * q]
        var wi = tw[unsafe_offset=2 * q + 1]
        for r in range(s):
            var i = r + s * q
            var ar = _re[dtype, W](src, i)
            var ai = _im[dtype, W](src, i)
            var br = _re[dtype, W](src, i + s * m)
            var bi = _im[dtype, W](src, i + s * m)
            var o = r + 2 * s * q
            _put[dtype, W](dst, o, ar + br, ai + bi)
            if q == 0:
                _put[dtype, W](dst, o + s, ar - br, ai - bi)
            else:
                _put_twiddled[dtype, W](dst, o + s, ar - br, ai - bi, wr, wi)


def _radix4[dtype: DType, W: Int](src: Buf[dtype], dst: Buf[dtype], m: Int, s: Int, tw: Table[dtype]):
    var sm = s * m
    for q in range(m):
        var w1r = tw[unsafe_offset=2 * q]
        var w1i = tw[unsafe_offset=2 * q + 1]
        var w2r = tw[unsafe_offset=2 * (m + q)]
        var w2i = tw[unsafe_offset=2 * (m + q) + 1]
        var w3r = tw[unsafe_offset=2 * (2 * m + q)]
        var w3i = tw[unsafe_offset=2 * (2 * m + q) + 1]
        for r in range(s):
            var i = r + s * q
            var a0r = _re[dtype, W](src, i)
            var a0i = _im[dtype, W](src, i)
            var a1r = _re[dtype, W](src, i + sm)
            var a1i = _im[dtype, W](src, i + sm)
            var a2r = _re[dtype, W](src, i + 2 * sm)
            var a2i = _im[dtype, W](src, i + 2 * sm)
            var a3r = _re[dtype, W](src, i + 3 * sm)
            var a3i = _im[dtype, W](src, i + 3 * sm)
            var t0r = a0r + a2r
            var t0i = a0i + a2i
            var t1r = a0r - a2r
            var t1i = a0i - a2i
            var t2r = a1r + a3r
            var t2i = a1i + a3i
            # (a1 - a3) times -i
            var t3r = a1i - a3i
            var t3i = a3r - a1r
            var o = r + 4 * s * q
            _put[dtype, W](dst, o, t0r + t2r, t0i + t2i)
            if q == 0:
                _put[dtype, W](dst, o + s, t1r + t3r, t1i + t3i)
                _put[dtype, W](dst, o + 2 * s, t0r - t2r, t0i - t2i)
                _put[dtype, W](dst, o + 3 * s, t1r - t3r, t1i - t3i)
            else:
                _put_twiddled[dtype, W](dst, o + s, t1r + t3r, t1i + t3i, w1r, w1i)
                _put_twiddled[dtype, W](dst, o + 2 * s, t0r - t2r, t0i - t2i, w2r, w2i)
                _put_twiddled[dtype, W](dst, o + 3 * s, t1r - t3r, t1i - t3i, w3r, w3i)


def _radix_odd[
    dtype: DType, W: Int
](src: Buf[dtype], dst: Buf[dtype], p: Int, m: Int, s: Int, tw: Table[dtype], pairs: Buf[dtype]):
    """An odd radix p: out_k = a_0 + sum over pairs j, p - j of
    cos (a_j + a_p-j) + i sin (a_j - a_p-j) (the table holds the p-th roots
    of unity after the twiddles, at (p - 1) m); `pairs` holds p lanes."""
    var sm = s * m
    var half = (p - 1) // 2
    var root = tw.unsafe_offset(2 * (p - 1) * m)
    for q in range(m):
        for r in range(s):
            var i = r + s * q
            var a0r = _re[dtype, W](src, i)
            var a0i = _im[dtype, W](src, i)
            var sum_r = a0r
            var sum_i = a0i
            for j in range(1, half + 1):
                var ar = _re[dtype, W](src, i + j * sm)
                var ai = _im[dtype, W](src, i + j * sm)
                var br = _re[dtype, W](src, i + (p - j) * sm)
                var bi = _im[dtype, W](src, i + (p - j) * sm)
                _put[dtype, W](pairs, 2 * j - 2, ar + br, ai + bi)
                _put[dtype, W](pairs, 2 * j - 1, ar - br, ai - bi)
                sum_r += ar + br
                sum_i += ai + bi
            var o = r + p * s * q
            _put[dtype, W](dst, o, sum_r, sum_i)
            for k in range(1, p):
                var out_r = a0r
                var out_i = a0i
                var e = 0
                for j in range(1, half + 1):
                    e += k
                    if e >= p:
                        e -= p
                    var c = root[unsafe_offset=2 * e]
                    var sn = root[unsafe_offset=2 * e + 1]
                    out_r += c * _re[dtype, W](pairs, 2 * j - 2) - sn * _im[dtype, W](pairs, 2 * j - 1)
                    out_i += c * _im[dtype, W](pairs, 2 * j - 2) + sn * _re[dtype, W](pairs, 2 * j - 1)
                if q == 0:
                    _put[dtype, W](dst, o + k * s, out_r, out_i)
                else:
                    var t = (k - 1) * m + q
                    _put_twiddled[dtype, W](
                        dst, o + k * s, out_r, out_i, tw[unsafe_offset=2 * t], tw[unsafe_offset=2 * t + 1]
                    )


def _stages[
    dtype: DType, W: Int
](plan: Plan, at: Int, tables: Table[dtype], a: Buf[dtype], b: Buf[dtype], pairs: Buf[dtype]) -> Bool:
    """The stages of plan[at:] ([n, STAGES, count, (radix, table offset)...])
    on a; returns whether the result ended in b."""
    var n = Int(plan[unsafe_offset=at])
    var count = Int(plan[unsafe_offset=at + 2])
    var length = n  # of the transforms a stage works on
    var src = a
    var dst = b
    for stage in range(count):
        var p = Int(plan[unsafe_offset=at + 3 + 2 * stage])
        var tw = tables.unsafe_offset(2 * Int(plan[unsafe_offset=at + 4 + 2 * stage]))
        var m = length // p
        var s = n // length
        if p == 4:
            _radix4[dtype, W](src, dst, m, s, tw)
        elif p == 2:
            _radix2[dtype, W](src, dst, m, s, tw)
        else:
            _radix_odd[dtype, W](src, dst, p, m, s, tw, pairs)
        length = m
        var t = src
        src = dst
        dst = t
    return count % 2 == 1


def _conj_in_place[dtype: DType, W: Int](b: Buf[dtype], n: Int):
    for i in range(n):
        b.unsafe_offset((2 * i + 1) * W).unsafe_store(-_im[dtype, W](b, i))


def _transform[
    dtype: DType, W: Int
](plan: Plan, at: Int, tables: Table[dtype], work: Buf[dtype], scratch: Buf[dtype]) -> Buf[dtype]:
    """The forward DFT of the lanes in work[0] by the plan at plan[at:];
    returns the buffer that holds it (work's two halves or scratch). Work is
    two buffers of n elements; scratch four of the Bluestein length m plus
    the odd radices' pairs."""
    var n = Int(plan[unsafe_offset=at])
    var a = work
    var b = work.unsafe_offset(2 * n * W)
    if Int(plan[unsafe_offset=at + 1]) == STAGES:
        var pairs = scratch
        return b if _stages[dtype, W](plan, at, tables, a, b, pairs) else a
    # Bluestein: X_k = c_k sum_t x_t c_t conj(c_k-t), a convolution of
    # length m by FFT_m, a product with the filter's FFT, FFT_m^-1.
    var m = Int(plan[unsafe_offset=at + 2])
    var chirp = tables.unsafe_offset(2 * Int(plan[unsafe_offset=at + 3]))
    var filter = tables.unsafe_offset(2 * Int(plan[unsafe_offset=at + 4]))
    var c = scratch
    var d = scratch.unsafe_offset(2 * m * W)
    var pairs = scratch.unsafe_offset(4 * m * W)
    for i in range(n):
        var cr = chirp[unsafe_offset=2 * i]
        var ci = chirp[unsafe_offset=2 * i + 1]
        _put_twiddled[dtype, W](c, i, _re[dtype, W](a, i), _im[dtype, W](a, i), cr, ci)
    var zero = SIMD[dtype, W](0)
    for i in range(n, m):
        _put[dtype, W](c, i, zero, zero)
    var in_d = _stages[dtype, W](plan, at + 5, tables, c, d, pairs)
    var y = d if in_d else c
    # times the filter, conjugated: the inverse FFT as conj(FFT(conj))
    for i in range(m):
        var fr = filter[unsafe_offset=2 * i]
        var fi = filter[unsafe_offset=2 * i + 1]
        var yr = _re[dtype, W](y, i)
        var yi = _im[dtype, W](y, i)
        _put[dtype, W](y, i, yr * fr - yi * fi, -(yr * fi + yi * fr))
    var other = c if in_d else d
    var z = other if _stages[dtype, W](plan, at + 5, tables, y, other, pairs) else y
    for i in range(n):
        var cr = chirp[unsafe_offset=2 * i]
        var ci = chirp[unsafe_offset=2 * i + 1]
        var zr = _re[dtype, W](z, i)
        var zi = -_im[dtype, W](z, i)
        _put_twiddled[dtype, W](a, i, zr, zi, cr, ci)
    return a


@register("juju_fft")
struct Fft:
    """Output [pre, n, post, 2]: the DFT along axis 1 of x [pre, n, post, 2]
    (complex as pairs), exponent sign -1, or +1 and times 1 / n where
    plan[1] is 1 (inverse); plan[0] is the scratch the transform needs
    (elements of one lane), the transform's plan starts at plan[2], its
    twiddles in `tables` [T, 2]. Everything a length changes is data, so
    that one compiled kernel serves every length."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=4, ...],
        x: InputTensor[dtype=output.dtype, rank=4, ...],
        plan: InputTensor[dtype=DType.int64, rank=1, ...],
        tables: InputTensor[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_fft: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_fft: unsupported dtype " + String(dtype)
        )
        comptime W = 8 if dtype == DType.float32 else 4
        var pre = Int(x.dim_size(0))
        var n = Int(x.dim_size(1))
        var post = Int(x.dim_size(2))
        var lines = pre * post
        if lines == 0 or n == 0:
            return
        var groups = (lines + W - 1) // W
        var p = plan.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var t = tables.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var src = x.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var dst = output.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var inverse = Int(p[unsafe_offset=1]) == 1
        var scale = Scalar[dtype](1) / Scalar[dtype](n) if inverse else Scalar[dtype](1)
        var extra = Int(p[unsafe_offset=0])
        var tasks = 1 if lines * n < SERIAL_ELEMENTS else min(groups, num_physical_cores())

        def task(index: Int) {var}:
            var work_list = List[Scalar[dtype]](length=4 * n * W, fill=0)
            var scratch_list = List[Scalar[dtype]](length=extra * W, fill=0)
            var work = work_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var scratch = scratch_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var sign = Scalar[dtype](-1) if inverse else Scalar[dtype](1)
            for g in range(index, groups, tasks):
                # gather lines g W + l: element i at ((line / post) n post + line % post + i post) * 2
                for l in range(W):
                    var line = g * W + l
                    if line >= lines:
                        for i in range(n):
                            work[unsafe_offset=2 * i * W + l] = 0
                            work[unsafe_offset=(2 * i + 1) * W + l] = 0
                        continue
                    var base = ((line // post) * n * post + line % post) * 2
                    for i in range(n):
                        var at = base + i * post * 2
                        work[unsafe_offset=2 * i * W + l] = src[unsafe_offset=at]
                        work[unsafe_offset=(2 * i + 1) * W + l] = sign * src[unsafe_offset=at + 1]
                var y = _transform[dtype, W](p, 2, t, work, scratch)
                for l in range(W):
                    var line = g * W + l
                    if line >= lines:
                        break
                    var base = ((line // post) * n * post + line % post) * 2
                    for i in range(n):
                        var at = base + i * post * 2
                        dst[unsafe_offset=at] = scale * y[unsafe_offset=2 * i * W + l]
                        dst[unsafe_offset=at + 1] = sign * scale * y[unsafe_offset=(2 * i + 1) * W + l]
            _ = len(work_list) + len(scratch_list)

        if tasks == 1:
            task(0)
        else:
            sync_parallelize(task, tasks)


@register("juju_rfft")
struct Rfft:
    """Output [rows, n / 2 + 1, 2]: the first n / 2 + 1 DFT coefficients of
    real rows x [rows, n]. Even n: a complex FFT of length n / 2 of
    z_j = x_2j + i x_2j+1, then X_k = (Z_k + conj Z_h-k) / 2 + T_k (Z_k -
    conj Z_h-k), T_k = -i/2 exp(-2 pi i k / n) at table offset plan[1] (the
    scratch size at plan[0], the transform's plan from plan[2]). Odd n: the
    complex FFT of x + 0i."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=3, ...],
        x: InputTensor[dtype=output.dtype, rank=2, ...],
        plan: InputTensor[dtype=DType.int64, rank=1, ...],
        tables: InputTensor[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_rfft: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_rfft: unsupported dtype " + String(dtype)
        )
        comptime W = 8 if dtype == DType.float32 else 4
        var rows = Int(x.dim_size(0))
        var n = Int(x.dim_size(1))
        var out_n = Int(output.dim_size(1))
        if rows == 0:
            return
        var groups = (rows + W - 1) // W
        var p = plan.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var t = tables.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var src = x.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var dst = output.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var even = n % 2 == 0
        var core = Int(p[unsafe_offset=2])
        var post = t.unsafe_offset(2 * Int(p[unsafe_offset=1]))
        var extra = Int(p[unsafe_offset=0])
        var tasks = 1 if rows * n < SERIAL_ELEMENTS else min(groups, num_physical_cores())

        def task(index: Int) {var}:
            var work_list = List[Scalar[dtype]](length=4 * (core + 1) * W, fill=0)
            var scratch_list = List[Scalar[dtype]](length=extra * W, fill=0)
            var out_list = List[Scalar[dtype]](length=2 * out_n * W, fill=0)
            var work = work_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var scratch = scratch_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var spectrum = out_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            for g in range(index, groups, tasks):
                for l in range(W):
                    var row = g * W + l
                    for j in range(core):
                        var re = Scalar[dtype](0)
                        var im = Scalar[dtype](0)
                        if row < rows:
                            if even:
                                re = src[unsafe_offset=row * n + 2 * j]
                                im = src[unsafe_offset=row * n + 2 * j + 1]
                            else:
                                re = src[unsafe_offset=row * n + j]
                        work[unsafe_offset=2 * j * W + l] = re
                        work[unsafe_offset=(2 * j + 1) * W + l] = im
                var y = _transform[dtype, W](p, 2, t, work, scratch)
                if even:
                    var h = core
                    for k in range(h + 1):
                        var zr = _re[dtype, W](y, k % h)
                        var zi = _im[dtype, W](y, k % h)
                        var mr = _re[dtype, W](y, (h - k) % h)
                        var mi = -_im[dtype, W](y, (h - k) % h)
                        var tr = post[unsafe_offset=2 * k]
                        var ti = post[unsafe_offset=2 * k + 1]
                        var dr = zr - mr
                        var di = zi - mi
                        var half = Scalar[dtype](0.5)
                        _put[dtype, W](spectrum, k, half * (zr + mr) + (dr * tr - di * ti),
                                       half * (zi + mi) + (dr * ti + di * tr))
                    y = spectrum
                for l in range(W):
                    var row = g * W + l
                    if row >= rows:
                        break
                    for k in range(out_n):
                        dst[unsafe_offset=(row * out_n + k) * 2] = y[unsafe_offset=2 * k * W + l]
                        dst[unsafe_offset=(row * out_n + k) * 2 + 1] = y[unsafe_offset=(2 * k + 1) * W + l]
            _ = len(work_list) + len(scratch_list) + len(out_list)

        if tasks == 1:
            task(0)
        else:
            sync_parallelize(task, tasks)


@register("juju_irfft")
struct Irfft:
    """Output [rows, n]: the real inverse DFT (times 1 / n) of the n / 2 + 1
    coefficients x [rows, n / 2 + 1, 2] of a Hermitian spectrum. The
    imaginary parts of X_0 (and X_n/2, n even) are ignored, NaN and inf
    included, as in XLA. Even n: Z_k = (X_k + conj X_h-k) / (2 h)
    + T_k (X_k - conj X_h-k), T_k = i/(2h) exp(2 pi i k / n) at table offset
    plan[1] (the scratch size at plan[0], the transform's plan from
    plan[2]), and z = IFFT_h(Z) holds x_2j + i x_2j+1. Odd n: the complex
    inverse FFT of the whole spectrum."""

    @staticmethod
    def execute[
        target: StaticString,
    ](
        output: OutputTensor[rank=2, ...],
        x: InputTensor[dtype=output.dtype, rank=3, ...],
        plan: InputTensor[dtype=DType.int64, rank=1, ...],
        tables: InputTensor[dtype=output.dtype, rank=2, ...],
        ctx: DeviceContext,
    ) raises:
        comptime assert target == "cpu", "juju_irfft: CPU only"
        comptime dtype = output.dtype
        comptime assert dtype == DType.float32 or dtype == DType.float64, (
            "juju_irfft: unsupported dtype " + String(dtype)
        )
        comptime W = 8 if dtype == DType.float32 else 4
        var rows = Int(output.dim_size(0))
        var n = Int(output.dim_size(1))
        var in_n = Int(x.dim_size(1))
        if rows == 0:
            return
        var groups = (rows + W - 1) // W
        var p = plan.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var t = tables.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var src = x.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var dst = output.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
        var even = n % 2 == 0
        var core = Int(p[unsafe_offset=2])
        var pre = t.unsafe_offset(2 * Int(p[unsafe_offset=1]))
        var extra = Int(p[unsafe_offset=0])
        var tasks = 1 if rows * n < SERIAL_ELEMENTS else min(groups, num_physical_cores())
        var scale = Scalar[dtype](1) / Scalar[dtype](n)

        def task(index: Int) {var}:
            var work_list = List[Scalar[dtype]](length=4 * (core + 1) * W, fill=0)
            var scratch_list = List[Scalar[dtype]](length=extra * W, fill=0)
            var in_list = List[Scalar[dtype]](length=2 * in_n * W, fill=0)
            var work = work_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var scratch = scratch_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var spectrum = in_list.unsafe_ptr().unsafe_origin_cast[MutAnyOrigin]()
            var zero = SIMD[dtype, W](0)
            for g in range(index, groups, tasks):
                for l in range(W):
                    var row = g * W + l
                    for k in range(in_n):
                        var re = Scalar[dtype](0)
                        var im = Scalar[dtype](0)
                        if row < rows:
                            re = src[unsafe_offset=(row * in_n + k) * 2]
                            im = src[unsafe_offset=(row * in_n + k) * 2 + 1]
                        spectrum[unsafe_offset=2 * k * W + l] = re
                        spectrum[unsafe_offset=(2 * k + 1) * W + l] = im
                # imaginary parts that do not count: dropped, NaN and inf too (XLA's)
                _put[dtype, W](spectrum, 0, _re[dtype, W](spectrum, 0), zero)
                if even:
                    var h = core
                    _put[dtype, W](spectrum, h, _re[dtype, W](spectrum, h), zero)
                    var half = Scalar[dtype](0.5) / Scalar[dtype](h)
                    for k in range(h):
                        var ar = _re[dtype, W](spectrum, k)
                        var ai = _im[dtype, W](spectrum, k)
                        var mr = _re[dtype, W](spectrum, h - k)
                        var mi = -_im[dtype, W](spectrum, h - k)
                        var tr = pre[unsafe_offset=2 * k]
                        var ti = pre[unsafe_offset=2 * k + 1]
                        var dr = ar - mr
                        var di = ai - mi
                        # conjugated: the inverse transform as conj(FFT(conj))
                        _put[dtype, W](work, k, half * (ar + mr) + (dr * tr - di * ti),
                                       -(half * (ai + mi) + (dr * ti + di * tr)))
                else:
                    for k in range(n):
                        if k < in_n:
                            _put[dtype, W](work, k, _re[dtype, W](spectrum, k), -_im[dtype, W](spectrum, k))
                        else:
                            _put[dtype, W](work, k, _re[dtype, W](spectrum, n - k), _im[dtype, W](spectrum, n - k))
                var y = _transform[dtype, W](p, 2, t, work, scratch)
                for l in range(W):
                    var row = g * W + l
                    if row >= rows:
                        break
                    if even:
                        for j in range(core):
                            dst[unsafe_offset=row * n + 2 * j] = y[unsafe_offset=2 * j * W + l]
                            dst[unsafe_offset=row * n + 2 * j + 1] = -y[unsafe_offset=(2 * j + 1) * W + l]
                    else:
                        for j in range(n):
                            dst[unsafe_offset=row * n + j] = scale * y[unsafe_offset=2 * j * W + l]
            _ = len(work_list) + len(scratch_list) + len(in_list)

        if tasks == 1:
            task(0)
        else:
            sync_parallelize(task, tasks)
