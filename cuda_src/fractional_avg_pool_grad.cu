// FractionalAvgPoolGrad, two kernels:
// * fractional_avg_pool_grad, a tiled gather for any valid sequences: a block stages in shared
//   memory the shares dy / cell_size of the pooling cells its tile of the input gradient
//   touches, once per (cell, channel); each thread then sums, for its input positions and its
//   vector of channels, the shares of the cells containing each position, in TF's order.
// * fractional_avg_pool_grad_cells (at the end of this file) for sequences whose cells partition
//   the input (TF's generator makes such sequences), overlapping or not: a thread per cell and
//   vector of channels writes the cell's values over the cell's own region.
// No atomics in either; one fixed order per element, the same bits from both.
//
// Shapes (NHWC only: the op has no data_format):
//   out_backprop  [batch, out_rows, out_cols, depth]
//   in_backprop   [batch, in_rows, in_cols, depth]
// Cell tables (built once per geometry on the host, gradops/backends/cuda/fractional_avg_pool_grad.py;
// element type I, as the indices):
//   row_offsets [in_rows + 1]  input row y lies in the row cells
//   row_cells   [entries]        row_cells[row_offsets[y] .. row_offsets[y + 1]), listed in
//                                increasing cell order (sequences need not be ordered: row y may
//                                lie in cells 0 and 2 but not 1; a cell that TF's clamping leaves
//                                empty is in no list)
//   row_sizes   [out_rows]       rows in each row cell (0: empty)
//   row_tiles   [2 * row tiles]  per tile of rows: the smallest and largest row cell any of its
//                                rows lies in (lo > hi: none)
//   col_offsets, col_cells, col_sizes, col_tiles: the same for columns.
//
// What is computed.  TF (fractional_avg_pool_op.cc) divides each out_backprop element by its
// cell's element count in double and adds the shares to a zeroed double buffer, cell by cell in
// row-cell-major order, then casts once to the output type (static_cast: integers truncate
// toward zero).  Each element here gets the same shares, rounded as TF rounds them, added in that
// same order, so every sum rounds exactly as TF's does; this matters for integers: TF's
// (1 + 1/3) + 2/3 is 2.0 and truncates to 2, while (1 + 2/3) + 1/3 is 1.9999999999999998 and
// would truncate to 1.  (float16 and bfloat16, which TF does not take, are summed the same way
// and rounded once from double.)
//
// Design.  The op is memory-bound: a good kernel moves each byte once and spends few instructions
// per element (about 28 SASS instructions per float16 element, 55 per float32 one, keep an H100
// at 80% of its HBM bandwidth).  The old kernel (one element per thread, 64-bit divisions to
// find (n, y, x, c), a double division per share) spent about 200.
//
// * Work.  A block of at most 256 threads owns a tile: tile_batch batch items x
//   tile_rows * rows_per_thread input rows x tile_cols input columns x one block of blockDim.x
//   (<= 4) vectors of V channels.  A vector is 16 bytes (8 halves, 4 floats or int32s, 2 doubles
//   or int64s), loaded and stored as one access; V = 1 where the depth or an unaligned tensor
//   allows no vectors.  threadIdx.x is the vector (fastest: a warp covers runs of 64 bytes of
//   channels), threadIdx.y packs (column, row, batch item) of the tile (tile_cols and tile_rows
//   are powers of two: shifts, not divisions); a thread owns one column and vector and sums
//   rows y0, y0 + tile_rows, ... (rows_per_thread of them), so its column's cells, the tile's
//   set-up and the block's staging serve up to 8 positions.  The grid is (channel blocks x
//   column tiles, row tiles, batch tiles), each dimension grid-strided so that any size is
//   covered; blockIdx.x is split by a host-computed multiply-shift (32-bit kernels).
// * Shares once per (cell, channel).  The division is the costly part, and a cell of ratio 1.44
//   holds about 2 input positions (6 when overlapping): dividing per element would repeat it
//   2-6 times.  The block stages the shares of every cell in its tile's cell range (row lo..hi x
//   column lo..hi, host-computed per tile) as doubles, __syncthreads, and every thread sums from
//   there.  One staging thread per cell: up to 4 vectors of out_backprop (16-byte loads, all
//   issued before the cell size is read or any vector is tested for Inf/NaN, so a cell costs one
//   memory round trip, not one per vector), one reciprocal of the cell size, 2 shares per
//   16-byte shared-memory store.  Cells straddling
//   two tiles are staged by both (about 1.2 staged cells per cell for 32 x 8 tiles at 1.44).
// * Exact shares without a division per element (the part of the kernel that must be right; it
//   is checked bit for bit against NumPy's division by tests/test_fractional_avg_pool_grad.py, on
//   every float16 and bfloat16 value, float32, float64, int32 and int64 extremes, subnormals,
//   Inf, NaN and the hardest-to-round cell sizes).  Notation: RN rounds to the nearest double,
//   ties to even; b is a cell size, an integer 1 <= b < 2^50 (the launcher refuses larger cells,
//   which no GPU could hold: the input gradient has at least b elements); u = 2^-53; for z in
//   [2^e, 2^(e+1)), ulp(z) = 2^(e-52) and the rounding midpoints near z are m = (2M + 1) 2^(e-53).
//   A. y = RN(1 / b): two Newton steps y <- y + y (1 - b y) from a float reciprocal (relative
//      error < 2^-21) give |y - 1/b| < ulp(1/b); then 1 - b y is exact (a multiple of
//      ulp(1/b) / 2 below 2b of them: fewer than 53 bits) and one more step gives
//      1/b - b (1/b - y)^2, within b ulp(1/b)^2 <= 2^-52 ulp(1/b) of 1/b, while 1/b is at
//      least ulp(1/b) / (2b) from every midpoint (1/b - m = K 2^(e-53) / b with K =
//      2^(53-e) - b (2M + 1) a nonzero integer: K = 0 would make the odd number 2M + 1 >= 2^53
//      divide a power of two).  So the step rounds to RN(1 / b).
//   B. For finite a with |a| >= 2^-970 (z = a / b is then a normal double):
//      q0 = RN(a y), r = a - b q0 (an FMA), q = RN(q0 + r y) (an FMA) is RN(a / b).
//      1. y = (1/b)(1 + e1), |e1| <= u, so q0 = z (1 + e1)(1 + e2) with |e2| <= u, and
//         |q0 - z| < 2.0001 u z < 2.0001 ulp(z).
//      2. q0 is a multiple of ulp(z) / 2 (it lies in z's binade or a neighbour), b an integer,
//         and a, a double of at most 53 significant bits with |a| >= z, a multiple of ulp(z):
//         r = b (z - q0) is a multiple of ulp(z) / 2 of magnitude < 4.0002 b, in those units,
//         i.e. fewer than 53 bits: the FMA computes it exactly.
//      3. q0 + r y = z + (z - q0)(b y - 1) = z + d, |b y - 1| = |e1| <= u: |d| < 2.0001 u ulp(z).
//      4. z is at least ulp(z) / (2b) from every midpoint (z - m = K 2^(e-53) / b, K an integer,
//         nonzero since the odd part of b (2M + 1) is at least 2^53 and that of a 2^k is not),
//         and |d| < ulp(z) / (2b) for b < 2^51: RN(z + d) = RN(z).
//      A zero a gives +0.0 (never -0.0).  An Inf or NaN a would make r NaN: a vector holding one
//      (tested once per vector, on the integer bits) takes a * y instead, Inf or NaN as a / b.
//   C. float64 values below 2^-970 in magnitude (float16, bfloat16, float32, int32 and int64
//      have none but 0): a is divided scaled up by 2^600 (case B) and scaled back, which rounds a
//      second time where the quotient is subnormal; there the result q is within one step
//      (2^-1074) of a / b, r = a - b q is exact (a multiple of 2^-1074 below b of them), and q
//      moves one step toward a / b when 2 |r| > b 2^-1074.  (A tie a / b = q + 2^-1075 would be
//      exact after scaling, so the scaling's own rounding resolves it to even.)  -0.0 becomes +0.0.
//   So no share is -0.0, and a sum may start from its first share (TF's +0.0 + s is s).
// * Shared memory: kShareCapacity doubles (48 KiB, static).  A staged cell holds tile_batch x
//   (channels + kCellPad) doubles; the pad skews consecutive cells by 16 bytes across the banks
//   (cells of 2^k doubles would all start in the same bank).  The launcher picks the tallest
//   tile (rows_per_thread <= 8) whose cells fit; a tile whose cells do not (sequences whose
//   cells overlap heavily) computes the same shares, in the same order, where it sums them
//   (the direct path: block-uniform, no barriers).  The launcher can force either path and a
//   smaller capacity, so the tests run both on small problems.
// * Tables are read once per thread and tile: a column's cell list (the first two cells kept
//   in registers: a column lies in one or two cells at ratio >= 1), then two offsets and the
//   cell ids per row; they are shared by the warp's threads and hit L1.  The host builds them
//   once per geometry and keeps the device copy.
// * Index width: I = int when every tensor and table has fewer than 2^31 elements (32-bit
//   address arithmetic), long long otherwise.
// * Static count (sm_90 SASS, warp instructions issued x 32 per input-gradient element, 112x112
//   feature maps, ratio 1.44): float16 about 20 (disjoint cells) and 28 (overlapping), float32
//   about 33 and 40.
#include "fractional_cells.cuh"  // includes gradops_common.cuh
#include "tensor_core_ptx.cuh"    // GRADOPS_ARCH

namespace gradops {
namespace fractional {

// Shared memory for staged shares, in doubles (48 KiB: all the static shared memory a block may have).
inline constexpr int kShareCapacity = 6144;
// Vectors of channels per block at most (blockDim.x).
inline constexpr int kBlockVectors = 4;
// Doubles of padding after each staged cell's channels (see the header comment).
inline constexpr int kCellPad = 2;

// Element <-> double, correctly rounded on the way back (the half types round once from
// double, not through float).
template <typename T> __device__ __forceinline__ double to_double(T x) { return static_cast<double>(x); }
template <> __device__ __forceinline__ double to_double<__half>(__half x) {
#ifdef __CUDA_ARCH__
    double d;  // one conversion instruction instead of two through float
    asm("cvt.f64.f16 %0, %1;" : "=d"(d) : "h"(__half_as_ushort(x)));
    return d;
#else
    return __half2float(x);
#endif
}
template <> __device__ __forceinline__ double to_double<__nv_bfloat16>(__nv_bfloat16 x) {
    return static_cast<double>(bfloat16_bits_to_float(x));  // see gradops_common.cuh
}

template <typename T> __device__ __forceinline__ T from_double(double x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_double<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_double<__nv_bfloat16>(double x) {
    return __double2bfloat16(x);
}

// a * b rounded once (never contracted into an FMA by the compiler), F float or double.
template <typename F> __device__ __forceinline__ F mul_rn(F a, F b) {
#ifdef __CUDA_ARCH__
    if constexpr (sizeof(F) == sizeof(double)) {
        return __dmul_rn(a, b);
    } else {
        return __fmul_rn(a, b);
    }
#else
    return a * b;  // the host build compiles with -ffp-contract=off
#endif
}

// RN(1 / b) for an integer 1 <= b < 2^50, without a division: two Newton steps from a float
// reciprocal give a faithful y, and a third step rounds it correctly (header comment, part A).
__device__ __forceinline__ double reciprocal(double b) {
#ifdef __CUDA_ARCH__
    double y = static_cast<double>(__fdividef(1.0f, static_cast<float>(b)));  // relative error < 2^-21
#else
    // The host build starts further off than any GPU can (__fdividef is within 2 ulp), so the
    // tests of the host build cover the GPU's starting points.
    double y = static_cast<double>(1.0f / static_cast<float>(b)) * (1.0 + 0x1p-20);
#endif
    y = fma(y, fma(-b, y, 1.0), y);
    y = fma(y, fma(-b, y, 1.0), y);
    return fma(y, fma(-b, y, 1.0), y);
}

// RN(a / b) for an integer 1 <= b < 2^50, y = RN(1 / b), and a finite with |a| >= 2^-970 or
// zero (header comment, part B; a zero a gives a zero of either sign).
__device__ __forceinline__ double divide(double a, double b, double y) {
    const double q0 = mul_rn(a, y);
    return fma(fma(-b, q0, a), y, q0);
}

// RN(a / b) for any finite double a (part C): below 2^-970 in magnitude, a is divided scaled up
// by 2^600 and the quotient scaled back (a second rounding where it is subnormal), then
// corrected to the nearest multiple of 2^-1074 by the exact remainder.
__device__ __forceinline__ double divide_any(double a, double b, double y) {
    if (fabs(a) >= 0x1p-970) return divide(a, b, y);
    double q = divide(a * 0x1p600, b, y) * 0x1p-600;
    if (fabs(q) < 0x1p-1021) {                         // spacing 2^-1074: q is within one step
        const double r = fma(-b, q, a);                // b (a / b - q), exact
        if (2.0 * fabs(r) > b * 0x1p-1074) q += r > 0.0 ? 0x1p-1074 : -0x1p-1074;  // both sides exact
    }
    return q + 0.0;  // a quotient that underflowed to -0.0 becomes +0.0, as divide's zeros are
}

template <typename T> struct IsDouble { static constexpr bool value = false; };
template <> struct IsDouble<double> { static constexpr bool value = true; };
// Types with Inf and NaN (the integer types have neither).
template <typename T> struct IsFloat { static constexpr bool value = true; };
template <> struct IsFloat<int> { static constexpr bool value = false; };
template <> struct IsFloat<long long> { static constexpr bool value = false; };
template <typename T> struct IsHalf { static constexpr bool value = false; };
template <> struct IsHalf<__half> { static constexpr bool value = true; };

// The share a / b of one finite element as TF rounds it: every nonzero value of the other types
// is at least 2^-149 in magnitude.
template <typename T> __device__ __forceinline__ double share(double a, double b, double y) {
    if constexpr (IsDouble<T>::value) {
        return divide_any(a, b, y);
    } else {
        return divide(a, b, y);
    }
}

template <typename T, int V> struct alignas(sizeof(T) * V) Vector {
    T e[V];
};

// The vector at p, loaded where the call stands.  A load whose value is used only under a branch
// (a left neighbour's, used where c > 0) is otherwise sunk by the compiler into that branch,
// after the work before it, and waits for a round trip of its own; the empty asm on each loaded
// word (no instruction) keeps the load here, beside the others.
template <typename T, int V> __device__ __forceinline__ Vector<T, V> load_here(const T* p) {
    Vector<T, V> v = *reinterpret_cast<const Vector<T, V>*>(p);
    if constexpr (sizeof v % 4 == 0) {
        int w[sizeof v / 4];
        memcpy(w, &v, sizeof w);
#pragma unroll
        for (int i = 0; i < static_cast<int>(sizeof v / 4); ++i) w[i] = opaque_value(w[i]);
        memcpy(&v, w, sizeof w);
    }
    return v;
}

// Whether no element of v is Inf or NaN, from the bits of 32-bit words: a 16-bit float's
// magnitude bits f (15 bits) are Inf or NaN when f >= its exponent mask, i.e. when f plus
// (0x8000 - mask) reaches bit 15 (the sum stays within the 16-bit field); likewise for float32.
template <int W> __device__ __forceinline__ bool words_finite(const unsigned (&w)[W], unsigned magnitude,
                                                            unsigned offset, unsigned top) {
    unsigned any = 0;
#pragma unroll
    for (int i = 0; i < W; ++i) any |= (w[i] & magnitude) + offset;
    return (any & top) == 0;
}

template <typename T, int V> __device__ __forceinline__ bool all_finite(const Vector<T, V>& v) {
    if constexpr (sizeof(T) * V % 4 != 0) {  // one 16-bit element
        return fabs(to_double(v.e[0])) <= 1.7976931348623157e308;
    } else {
        unsigned w[sizeof(T) * V / 4];
        memcpy(w, &v, sizeof w);
        if constexpr (IsDouble<T>::value) {
            bool finite = true;
#pragma unroll
            for (int i = 1; i < sizeof(T) * V / 4; i += 2) finite &= (w[i] & 0x7ff00000u) != 0x7ff00000u;
            return finite;
        } else if (sizeof(T) == 4) {
            return words_finite(w, 0x7fffffffu, 0x00800000u, 0x80000000u);
        } else {
            const unsigned exponent = IsHalf<T>::value ? 0x7c00u : 0x7f80u;  // float16 : bfloat16
            return words_finite(w, 0x7fff7fffu, (0x8000u - exponent) * 0x10001u, 0x80008000u);
        }
    }
}

// Whether v holds no Inf or NaN (always, for the integer types).
template <typename T, int V> __device__ __forceinline__ bool finite_vector(const Vector<T, V>& v) {
    if constexpr (IsFloat<T>::value) {
        return all_finite(v);
    } else {
        return true;
    }
}

// The share d / b of one element, as TF rounds it (y = reciprocal(b)); `finite`: d is not Inf or
// NaN (then the share is d y).
template <typename T> __device__ __forceinline__ double element_share(T d, double b, double y, bool finite) {
    const double a = to_double(d);
    if (finite || fabs(a) <= 1.7976931348623157e308) return share<T>(a, b, y);
    return a * y;
}

// shares[v] = d[v] / b for one cell's vector, as TF rounds them (y = reciprocal(b)); the vector's
// finiteness is tested once, so the common path has no per-element test.
template <typename T, int V>
__device__ __forceinline__ void cell_shares(const Vector<T, V>& d, double b, double y, double (&shares)[V]) {
    if (finite_vector(d)) {
#pragma unroll
        for (int v = 0; v < V; ++v) shares[v] = element_share(d.e[v], b, y, true);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) shares[v] = element_share(d.e[v], b, y, false);
    }
}

// Stores the shares d[v] / b of one cell at s[0 .. V), two at a time (16-byte stores) when V is
// even; the vector's finiteness is tested once, so the common path has no per-element test.
template <typename T, int V>
__device__ __forceinline__ void stage_shares(const Vector<T, V>& d, double b, double y, double* s) {
    constexpr int P = V % 2 == 0 ? 2 : 1;
    if (finite_vector(d)) {
#pragma unroll
        for (int v = 0; v < V; v += P) {
            if constexpr (P == 2) {
                *reinterpret_cast<double2*>(s + v) =
                    make_double2(element_share(d.e[v], b, y, true), element_share(d.e[v + 1], b, y, true));
            } else {
                s[v] = element_share(d.e[v], b, y, true);
            }
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) s[v] = element_share(d.e[v], b, y, false);
    }
}

// sum[v] += d[v] / b for one cell (the direct path: shares computed where they are summed).
template <typename T, int V>
__device__ __forceinline__ void add_direct_shares(double (&sum)[V], const Vector<T, V>& d, double b, double y) {
    if (finite_vector(d)) {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] += element_share(d.e[v], b, y, true);
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] += element_share(d.e[v], b, y, false);
    }
}

// sum[v] += s[v] from shared memory (16-byte loads when V is even).
template <int V> __device__ __forceinline__ void add_staged_shares(double (&sum)[V], const double* s) {
    if constexpr (V % 2 == 0) {
#pragma unroll
        for (int v = 0; v < V; v += 2) {
            const double2 pair = *reinterpret_cast<const double2*>(s + v);
            sum[v] += pair.x;
            sum[v + 1] += pair.y;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] += s[v];
    }
}

// sum[v] = s[v] from shared memory (the first share of a sum).
template <int V> __device__ __forceinline__ void load_staged_shares(double (&sum)[V], const double* s) {
    if constexpr (V % 2 == 0) {
#pragma unroll
        for (int v = 0; v < V; v += 2) {
            const double2 pair = *reinterpret_cast<const double2*>(s + v);
            sum[v] = pair.x;
            sum[v + 1] = pair.y;
        }
    } else {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] = s[v];
    }
}

template <typename T, int V> __device__ __forceinline__ void store_zeros(T* p) {
    Vector<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.e[v] = from_double<T>(0.0);
    *reinterpret_cast<Vector<T, V>*>(p) = out;
}

template <typename T, int V> __device__ __forceinline__ Vector<T, V> round_vector(const double (&sum)[V]) {
    Vector<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.e[v] = from_double<T>(sum[v]);
    return out;
}

template <typename T, int V> __device__ __forceinline__ void store_vector(T* p, const double (&sum)[V]) {
    *reinterpret_cast<Vector<T, V>*>(p) = round_vector<T, V>(sum);
}

// ---- Float shares: the disjoint cells kernel's values for float16, bfloat16 and float32
// A disjoint cell's value is one share rounded to T, and for these types it can be computed
// exactly in float: no FP64 instruction and no conversion to or from double (FP64 runs at 1/64
// of FP32's rate on sm_61/75/86/89/120 parts, 1/2 on sm_60/70/80/90/100).  Cells hold at most
// kFloatShareCells elements (the launcher takes the gather kernel for larger ones).  Notation as
// in the header comment, now in float: RN rounds to the nearest float, ties to even; b an
// integer 1 <= b <= 2^12; y = RN(1 / b) (__frcp_rn: IEEE round-to-nearest); z = a / b.
//   D. q0 = RN(a y), q = RN(q0 + (a - b q0) y) (two FMAs) is RN(z) for finite a where z is a
//      normal float or rounds to zero: part B's steps with 24 for 53 (u = 2^-24) need only
//      b < 2^22 (r = b (z - q0) below 4.0002 b half-ulps of z fits 24 bits; |d| < 2.0001 u
//      ulp(z) stays below ulp(z) / (2b)), and a float z is never a midpoint (a = m b would
//      need 25 significant bits).  Below 2^-126 the same steps hold on the subnormal grid of
//      2^-149 (r is a multiple of it below b of them, |d| < 2^-173), except where z is exactly
//      a midpoint of that grid: then q is z's even neighbour or its odd one, the odd one being
//      a nonzero subnormal.  So a q that is normal or zero is RN(z), and only a subnormal q
//      may be wrong (float32 only; part F).  Inf or NaN a makes q NaN (r is NaN).
//   E. float16 and bfloat16 values: T(q) = T(RN64(z)), TF's rounding through double.  With p
//      T's precision (11, 8) and z in [2^e, 2^(e+1)) (for a subnormal T result, e is T's least
//      normal exponent), a is a multiple of 2^(e-p+1) and T's midpoints are odd multiples of
//      2^(e-p), so z is a midpoint or at least 2^(e-p) / b from every one; q and RN64(z) are
//      within 2^(e-24) of z, less than 2^(e-p) / b for b < 2^13: both round to T(z).  A
//      midpoint z is a float (at most p + 1 significant bits) and then q = z exactly (even on
//      float's subnormal grid, which bfloat16's midpoints lie on); so is RN64(z).
//   F. float32 results below 2^-126 (|a| < 2^-114 here): a is divided scaled up by 2^64 (case
//      D), then scaled back, which rounds to the subnormal grid within 2^-149 of z (2^-150 from
//      each rounding); r = a - b q is exact (a multiple of 2^-149 below b of them) and q moves a
//      step toward z when 2 |r| > b 2^-149.  A midpoint z = q + 2^-150 is exact after scaling, so
//      the scaling back rounds it to even.  A result that rounds to zero has a's sign, as TF's
//      cast of the tiny double RN64(z) has.
// TF adds the share to +0.0: a zero a gives +0.0 (D's FMAs give +0.0 for -0.0 too).
inline constexpr int kFloatShareCells = 4096;

template <typename T> struct FloatShares { static constexpr bool value = false; };
template <> struct FloatShares<__half> { static constexpr bool value = true; };
template <> struct FloatShares<__nv_bfloat16> { static constexpr bool value = true; };
template <> struct FloatShares<float> { static constexpr bool value = true; };

template <typename T> __device__ __forceinline__ float to_float(T x) { return static_cast<float>(x); }
template <> __device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return bfloat16_bits_to_float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// RN(1 / b) in float.
__device__ __forceinline__ float float_reciprocal(float b) {
#ifdef __CUDA_ARCH__
    return __frcp_rn(b);
#else
    return 1.0f / b;  // IEEE division: the same correctly rounded value
#endif
}

// RN(a / b) in float where that is normal or zero (part D), y = float_reciprocal(b).
__device__ __forceinline__ float float_divide(float a, float b, float y) {
    const float q0 = mul_rn(a, y);
    return fmaf(fmaf(-b, q0, a), y, q0);
}

// RN(a / b) in float for finite a with |a / b| below 2^-126 (part F).
__device__ __forceinline__ float float_divide_subnormal(float a, float b, float y) {
    float q = mul_rn(float_divide(a * 0x1p64f, b, y), 0x1p-64f);  // within 2^-149 of a / b
    const float r = fmaf(-b, q, a);                                 // b (a / b - q), exact
    if (2.0f * fabsf(r) > b * 0x1p-149f) q += r > 0.0f ? 0x1p-149f : -0x1p-149f;  // both sides exact
    return q;  // a zero q is a's zero: |a / b| < 2^-150 scales back to it, and no step reaches zero
}

// RN(a / b) for an Inf, NaN or float32 a whose quotient lies below 2^-126 (out of line: no
// steady-state path takes it).
__device__ GRADOPS_NOINLINE float rare_float_value(float a, float b, float y) {
    return fabsf(a) <= 3.40282347e38f ? float_divide_subnormal(a, b, y) : a * y;  // Inf or NaN: a y
}

// Whether float_divide's q needs part F: a nonzero float32 below 2^-126, or NaN (an Inf or NaN
// a).  The half types need only the NaN test (part E holds for every finite a).
template <typename T> __device__ __forceinline__ bool float_share_inexact(float q) {
    if constexpr (sizeof(T) == 4) {
        return !(fabsf(q) >= 0x1p-126f || q == 0.0f);
    } else {
        return q != q;
    }
}

// The disjoint cells kernel's values T(0.0 + d[v] / b), as TF rounds them through double, for
// the float types and a cell of b <= kFloatShareCells elements (y = float_reciprocal(b)).  One
// test per vector sends the rare lanes (Inf, NaN, float32 results below 2^-126) to a second
// pass: Inf and NaN give d y (Inf or NaN, as TF's division does).
template <typename T, int V>
__device__ __forceinline__ Vector<T, V> float_cell_values(const Vector<T, V>& d, float b, float y) {
    float q[V];
    bool inexact = false;
#pragma unroll
    for (int v = 0; v < V; ++v) {
        q[v] = float_divide(to_float(d.e[v]), b, y);
        inexact |= float_share_inexact<T>(q[v]);
    }
    if (inexact) {
#pragma unroll
        for (int v = 0; v < V; ++v) {
            if (!float_share_inexact<T>(q[v])) continue;
            if constexpr (sizeof(T) == 4) {
                q[v] = rare_float_value(to_float(d.e[v]), b, y);
            } else {
                q[v] = to_float(d.e[v]) * y;  // an Inf or NaN a (part E covers every finite one)
            }
        }
    }
    Vector<T, V> out;
#pragma unroll
    for (int v = 0; v < V; ++v) out.e[v] = from_float<T>(q[v]);
    return out;
}

// ---- Overlapping cells in float-float, where FP64 is slow
// An overlapping position's value is TF's double sum D of up to four shares, rounded to T.
// Where FP64 runs at 1/32 to 1/64 of FP32's rate (every architecture but the data-centre parts
// below), the float types' cells kernel computes it without FP64: each share as q + e (q =
// float_divide's RN(a / b), e = RN((a - b q) y), the remainder exact: |q + e - a / b| <=
// 2^-46.9 |a / b| + 2^-150), their sum as hi + lo (TwoSums of the q, the e and the TwoSums'
// errors added in float), and then a test that decides RN_T(D) or gives up, for the whole
// vector, to the double shares (out of line: ambiguous values are rare).
//   G. With M = sum of |q|, |D - (hi + lo)| <= 2^-42.9 M + 2^-148: the float additions of lo
//      (at most 7, each of a value below 2^-22 M) 2^-43.2 M, the shares' errors 2^-46.9 M +
//      2^-148, TF's own roundings (4 shares and 3 sums in double) 2^-50.2 M.  The test takes
//      bound = M 2^-40 + 2^-140.
//   H. float16, bfloat16: h = RN(hi + lo) is within half a float spacing of hi + lo (more than
//      2^-26 |h|); where 2^-26 |h| > bound, D lies strictly between h's float neighbours, and where those two
//      round to the same T value, so does D (rounding is monotone).  A T midpoint is a float,
//      so h on (or next to) one fails the test.
//   I. float32: with |hi| >= |lo|, h = RN(hi + lo) and low = lo - (h - hi) (Fast2Sum) give
//      hi + lo = h + low exactly; D lies in [h + down, h + up] (down <= low - bound and up >=
//      low + bound, rounded outward), and where h + down and h + up both round to h, D does.
//   A zero M gives +0.0, TF's sum of zero shares: float16 and bfloat16 quotients of nonzero
//   values are at least 2^-145, so q = 0 only where a = 0; the kernel leaves float32 values
//   below 2^-100 (whose shares may round to q = e = 0) to the double shares.  Inf or NaN make M
//   or h NaN or Inf and the test fail.
#if defined(GRADOPS_FRACTIONAL_FAST_FP64)
// A test's choice (0: float-float sums, 1: double shares), so that a GPU of either kind runs both
// paths; the runtime never defines it.
inline constexpr bool kFastFp64 = GRADOPS_FRACTIONAL_FAST_FP64 != 0;
#elif GRADOPS_ARCH == 600 || GRADOPS_ARCH == 700 || GRADOPS_ARCH == 800 || GRADOPS_ARCH == 900 || GRADOPS_ARCH == 1000
inline constexpr bool kFastFp64 = true;  // FP64 at half FP32's rate: P100, V100, A100, H100/H200, B200
#else
inline constexpr bool kFastFp64 = false;
#endif

// Whether the cells kernel's double shares walk two cell rows an iteration (see
// fractional_avg_pool_grad_cells): everywhere but the half types on sm_60, whose rounding from
// double is emulated; ptxas overlaps the two rows' work there and spills past 255 registers
// (NVRTC 12.9, float16: 4 bytes, 52 with 64-bit indices), where one row an iteration takes 202.
template <typename T> inline constexpr bool kPairedCellRows = !(GRADOPS_ARCH == 600 && sizeof(T) == 2);

// s = RN(a + b), s + t = a + b exactly (TwoSum: no condition on a and b).
__device__ __forceinline__ void two_sum(float a, float b, float& s, float& t) {
    s = a + b;
    const float bb = s - a;
    t = (a - (s - bb)) + (b - bb);
}

// a + b rounded up (UP) or down.
template <bool UP> __device__ __forceinline__ float add_directed(float a, float b) {
#ifdef __CUDA_ARCH__
    if constexpr (UP) {
        return __fadd_ru(a, b);
    } else {
        return __fadd_rd(a, b);
    }
#else
    float s, t;
    two_sum(a, b, s, t);  // s is a + b rounded to nearest; t the part it dropped
    const bool dropped_beyond = UP ? t > 0.0f : t < 0.0f;
    return dropped_beyond ? nextafterf(s, UP ? INFINITY : -INFINITY) : s;
#endif
}

template <typename T> __device__ __forceinline__ unsigned short bits16(T x) {
    unsigned short u;
    memcpy(&u, &x, sizeof u);
    return u;
}

// out = RN_T(D) for an overlapping position whose shares' sum is hi + lo and whose shares' |q|
// sum to m (parts G-I); false where the test cannot decide.
template <typename T> __device__ __forceinline__ bool round_sum(float hi, float lo, float m, T& out) {
    if (m == 0.0f) {
        out = from_float<T>(0.0f);
        return true;
    }
    const float bound = fmaf(m, 0x1p-40f, 0x1p-140f);
    if constexpr (sizeof(T) == 4) {
        if (!(fabsf(hi) >= fabsf(lo))) return false;  // NaN too
        const float h = hi + lo;
        const float low = lo - (h - hi);
        out = h;
        return h + add_directed<true>(low, bound) == h && h + add_directed<false>(low, -bound) == h;
    } else {
        const float h = hi + lo;
        if (!(fabsf(h) * 0x1p-26f > bound)) return false;  // NaN too
        const unsigned bits = __float_as_uint(h);
        const T below = from_float<T>(__uint_as_float(bits - 1u)), above = from_float<T>(__uint_as_float(bits + 1u));
        out = below;
        return bits16(below) == bits16(above);
    }
}

// q + e = a / b as the header of this section says (a finite or not: Inf and NaN give NaN q).
__device__ __forceinline__ void float_float_share(float a, float b, float y, float& q, float& e) {
    q = float_divide(a, b, y);
    e = mul_rn(fmaf(-b, q, a), y);
}

// Writes a cell's region, row_count x col_count positions from dx (rows dx_row apart, positions
// depth apart): its first row corner then top, its other rows left then inner.
template <typename T, int V, typename I>
__device__ __forceinline__ void write_region(T* dx, I dx_row, I depth, I row_count, I col_count,
                                             const Vector<T, V>& corner, const Vector<T, V>& top,
                                             const Vector<T, V>& left, const Vector<T, V>& inner) {
#pragma unroll 1
    for (I y = 0; y < row_count; ++y, dx += dx_row) {
        *reinterpret_cast<Vector<T, V>*>(dx) = y == 0 ? corner : left;
        const Vector<T, V> rest = y == 0 ? top : inner;
#pragma unroll 1
        for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vector<T, V>*>(dx + x * depth) = rest;
    }
}

// Writes an overlapping cell's region (as write_region) from its shares in double, as TF sums
// them (see fractional_avg_pool_grad_cells): s(r-1, c-1), s(r-1, c), s(r, c-1), s(r, c) (+0.0
// where a cell does not exist).  Each of the four values is rounded and stored before the next
// is summed, and only where the region has such positions, so one rounded vector at a time is
// live beside the shares.
template <typename T, int V, typename I>
__device__ __forceinline__ void write_overlap_region(T* dx, I dx_row, I depth, I row_count, I col_count,
                                                     const double (&up_left)[V], const double (&up)[V],
                                                     const double (&left_own)[V], const double (&own)[V]) {
    using Vec = Vector<T, V>;
    double sum[V];
#pragma unroll
    for (int v = 0; v < V; ++v) sum[v] = ((up_left[v] + up[v]) + left_own[v]) + own[v];
    *reinterpret_cast<Vec*>(dx) = round_vector<T, V>(sum);  // the corner
    if (col_count > 1) {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] = up[v] + own[v];
        const Vec top = round_vector<T, V>(sum);
#pragma unroll 1
        for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vec*>(dx + x * depth) = top;
    }
    if (row_count > 1) {
#pragma unroll
        for (int v = 0; v < V; ++v) sum[v] = left_own[v] + own[v];
        const Vec left = round_vector<T, V>(sum);
#pragma unroll 1
        for (I y = 1; y < row_count; ++y) *reinterpret_cast<Vec*>(dx + y * dx_row) = left;
        if (col_count > 1) {
            const Vec inner = round_vector<T, V>(own);
#pragma unroll 1
            for (I y = 1; y < row_count; ++y) {
#pragma unroll 1
                for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vec*>(dx + y * dx_row + x * depth) = inner;
            }
        }
    }
}

// An overlapping cell's region from the double shares, for the float-float path's undecided
// vectors (out of line: rare).  dy: the cell's out_backprop vector; the cell above is dy -
// dy_row (if up_size > 0), the one to the left dy - depth (if left_size > 0).
template <typename T, int V, typename I>
__device__ GRADOPS_NOINLINE void overlap_region_in_double(const T* dy, I dy_row, I depth, double size, double up_size,
                                                          double left_size, double up_left_size, T* dx, I dx_row,
                                                          I row_count, I col_count) {
    double up_left[V], up[V], left_own[V], own[V];
    const auto shares_of = [&](const T* p, double b, double (&out)[V]) {
        if (b > 0.0) {
            cell_shares<T, V>(*reinterpret_cast<const Vector<T, V>*>(p), b, reciprocal(b), out);
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) out[v] = 0.0;
        }
    };
    shares_of(dy - dy_row - depth, up_left_size, up_left);
    shares_of(dy - dy_row, up_size, up);
    shares_of(dy - depth, left_size, left_own);
    shares_of(dy, size, own);
    write_overlap_region<T, V, I>(dx, dx_row, depth, row_count, col_count, up_left, up, left_own, own);
}

}  // namespace fractional

// T: element type; I: index and table type (int when every tensor and table has fewer than
// 2^31 elements, else long long); V: channels per thread (16 bytes' worth, or 1).
template <typename T, typename I, int V>
__global__ void fractional_avg_pool_grad(
    const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    const I* __restrict__ row_offsets, const I* __restrict__ row_cells, const I* __restrict__ row_sizes,
    const I* __restrict__ row_tiles, const I* __restrict__ col_offsets, const I* __restrict__ col_cells,
    const I* __restrict__ col_sizes, const I* __restrict__ col_tiles,
    I batch, I in_rows, I in_cols, I depth, I out_rows, I out_cols,
    I channel_blocks, I col_tile_count, I row_tile_count, I batch_tile_count,
    unsigned channel_blocks_magic, int channel_blocks_shift, int tile_cols_log2, int tile_rows_log2,
    int rows_per_thread, int stage_cols_log2, int share_cells) {
    using namespace fractional;
    __shared__ __align__(16) double shares[kShareCapacity];

    // This thread's place in the tile: threadIdx.x is the vector, threadIdx.y packs (column,
    // row, batch item); the tile is tile_rows * rows_per_thread rows high, row y0 + p tile_rows
    // being this thread's p-th.
    const int tile_cols = 1 << tile_cols_log2, tile_rows = 1 << tile_rows_log2;
    const int cv = static_cast<int>(threadIdx.x);
    const int tx = static_cast<int>(threadIdx.y) & (tile_cols - 1);
    const int tz = static_cast<int>(threadIdx.y >> tile_cols_log2) & (tile_rows - 1);
    const int tn = static_cast<int>(threadIdx.y >> (tile_cols_log2 + tile_rows_log2));
    const int tile_batch = static_cast<int>(blockDim.y >> (tile_cols_log2 + tile_rows_log2));
    const int block_channels = static_cast<int>(blockDim.x) * V;
    const int cell_stride = block_channels + kCellPad;     // doubles per staged cell and batch item
    const int tile_cell = tile_batch * cell_stride;         // doubles per staged cell
    // Cells a tile may stage (the launcher's count; none if it would not fit, as a safeguard).
    const int cells_fit = share_cells * tile_cell <= kShareCapacity ? share_cells : 0;

    const I x_blocks = channel_blocks * col_tile_count;
    for (I bz = blockIdx.z; bz < batch_tile_count; bz += gridDim.z) {
        for (I by = blockIdx.y; by < row_tile_count; by += gridDim.y) {
            for (I bx = blockIdx.x; bx < x_blocks; bx += gridDim.x) {
                I ct;
                if constexpr (sizeof(I) == 4) {  // bx < 2^31: multiply-shift division by channel_blocks
                    ct = static_cast<I>((static_cast<unsigned long long>(static_cast<unsigned>(bx)) *
                                         channel_blocks_magic) >> channel_blocks_shift);
                } else {
                    ct = bx / channel_blocks;
                }
                const I cb = bx - ct * channel_blocks;
                const I n = bz * tile_batch + tn;
                const I x = ct * tile_cols + tx;
                const I c = cb * block_channels + cv * V;
                const I y0 = by * (tile_rows * rows_per_thread) + tz;
                const bool has_column = n < batch && c < depth && x < in_cols;

                // The cells this tile's rows and columns lie in (host-computed ranges).
                const I row_lo = row_tiles[2 * by], row_hi = row_tiles[2 * by + 1];
                const I col_lo = col_tiles[2 * ct], col_hi = col_tiles[2 * ct + 1];
                const I nr = row_hi - row_lo + 1, nc = col_hi - col_lo + 1;  // <= 0: none
                // Block-uniform: stage the tile's shares when they fit in shared memory.
                const bool staged = nr > 0 && nc > 0 && nr <= cells_fit && nc <= cells_fit && nr * nc <= cells_fit;

                I col_begin = 0, col_end = 0;  // this thread's column cells (shared by its rows)
                if (has_column) {
                    col_begin = col_offsets[x];
                    col_end = col_offsets[x + 1];
                }
                if (staged) {
                    const int rows = static_cast<int>(nr), cols = static_cast<int>(nc);
                    // Staging: one thread per cell (all the block's channels: one reciprocal for
                    // up to 4 vectors), cells in row-major slots of stage_cols (>= the tile's columns).
                    const int thread = static_cast<int>(threadIdx.x + blockDim.x * threadIdx.y);
                    const int threads = static_cast<int>(blockDim.x * blockDim.y);
                    const I c0 = cb * block_channels;
                    for (int t = 0; t < tile_batch; ++t) {
                        const I nt = bz * tile_batch + t;
                        if (nt >= batch) break;
                        const T* const dy_batch = out_backprop + (nt * out_rows * out_cols) * depth + c0;
                        for (int slot = thread; slot < rows << stage_cols_log2; slot += threads) {
                            const int i = slot >> stage_cols_log2;
                            const I row_cell = row_lo + i;
                            const I row_size = row_sizes[row_cell];
                            const T* const dy_row = dy_batch + row_cell * out_cols * depth;
                            double* const s_row = shares + (t * rows + i) * cols * cell_stride;
                            for (int j = slot & ((1 << stage_cols_log2) - 1); j < cols; j += 1 << stage_cols_log2) {
                                const I col_cell = col_lo + j;
                                const T* const dy = dy_row + col_cell * depth;
                                // The block's (at most kBlockVectors) vectors of channels that exist,
                                // all loaded before the cell's size is known and before any is tested
                                // for Inf/NaN (a branch on its data): one memory round trip per cell,
                                // not one per vector.  (An empty cell's vectors exist: its row and
                                // column lie within the tile's cell range.)
                                const int vectors = static_cast<int>(min(static_cast<I>(blockDim.x), (depth - c0) / V));
                                Vector<T, V> d[kBlockVectors];
#pragma unroll
                                for (int q = 0; q < kBlockVectors; ++q) {
                                    if (q < vectors) d[q] = *reinterpret_cast<const Vector<T, V>*>(dy + q * V);
                                }
                                const I size = row_size * col_sizes[col_cell];
                                if (size == 0) continue;  // an empty cell is in no list
                                const double b = static_cast<double>(size);  // exact: below 2^50
                                const double y = reciprocal(b);
                                double* const s = s_row + j * cell_stride;
#pragma unroll
                                for (int q = 0; q < kBlockVectors; ++q) {
                                    if (q < vectors) stage_shares<T, V>(d[q], b, y, s + q * V);
                                }
                            }
                        }
                    }
                    __syncthreads();  // the tile's shares are staged
                    if (has_column) {
                        // This thread's column cells, as pointers into the first row of staged
                        // cells: the first two held in registers (a column lies in one or two cells
                        // at ratio >= 1); a position in no column cell sums nothing.
                        const double* const tile_shares = shares + tn * rows * cols * cell_stride + cv * V;
                        const int col_count = static_cast<int>(col_end - col_begin);
                        const double* const s0 =
                            tile_shares + (col_count > 0 ? static_cast<int>(col_cells[col_begin] - col_lo) * cell_stride : 0);
                        const double* const s1 =
                            tile_shares + (col_count > 1 ? static_cast<int>(col_cells[col_begin + 1] - col_lo) * cell_stride : 0);
                        const int row_stride = cols * cell_stride;
                        // This thread's rows y0 + p tile_rows, p < positions, that exist.
                        const int positions = y0 < in_rows ? static_cast<int>(min(static_cast<I>(rows_per_thread),
                                                  (in_rows - y0 + tile_rows - 1) >> tile_rows_log2)) : 0;
                        I out_index = ((n * in_rows + y0) * in_cols + x) * depth + c;
                        const I out_step = (in_cols * depth) << tile_rows_log2;
                        const I* offsets = row_offsets + y0;
                        for (int p = 0; p < positions; ++p, out_index += out_step, offsets += tile_rows) {
                            T* const out = in_backprop + out_index;
                            // TF's order: row cells in increasing order, and within each the
                            // column cells in increasing order (both lists are sorted).
                            // TF adds the shares to +0.0; no share is -0.0 (see divide), so the sum
                            // may start from the first share, and +0.0 + s == s.
                            I ri = offsets[0];
                            const I row_end = offsets[1];
                            if (col_count == 0 || ri == row_end) {
                                store_zeros<T, V>(out);
                            } else {
                                double sum[V];
                                // The shares of row cell r (an offset into the staged rows) past the
                                // first column cell.
                                const auto add_other_columns = [&](int r) {
                                    if (col_count > 1) {
                                        add_staged_shares<V>(sum, s1 + r);
#pragma unroll 1
                                        for (I ki = col_begin + 2; ki < col_end; ++ki)
                                            add_staged_shares<V>(sum, tile_shares + r + static_cast<int>(col_cells[ki] - col_lo) * cell_stride);
                                    }
                                };
                                const int r = static_cast<int>(row_cells[ri] - row_lo) * row_stride;
                                load_staged_shares<V>(sum, s0 + r);
                                add_other_columns(r);
#pragma unroll 1
                                for (++ri; ri < row_end; ++ri) {
                                    const int r = static_cast<int>(row_cells[ri] - row_lo) * row_stride;
                                    add_staged_shares<V>(sum, s0 + r);
                                    add_other_columns(r);
                                }
                                store_vector<T, V>(out, sum);
                            }
                        }
                    }
                    __syncthreads();  // every thread is done reading the shares
                } else {
                    // Cells too many to stage (sequences whose cells overlap heavily): the same
                    // shares, in the same order, computed where they are summed.
                    if (has_column) {
                        T* const out_column = in_backprop + ((n * in_rows) * in_cols + x) * depth + c;
                        const T* const dy_batch = out_backprop + (n * out_rows * out_cols) * depth + c;
                        for (int p = 0; p < rows_per_thread; ++p) {
                            const I y = y0 + p * tile_rows;
                            if (y >= in_rows) break;
                            double sum[V];
#pragma unroll
                            for (int v = 0; v < V; ++v) sum[v] = 0.0;
                            const I row_end = row_offsets[y + 1];
#pragma unroll 1
                            for (I ri = row_offsets[y]; ri < row_end; ++ri) {
                                const I row_cell = row_cells[ri];
                                const I row_size = row_sizes[row_cell];
                                const T* dy = dy_batch + row_cell * out_cols * depth;
#pragma unroll 1
                                for (I ki = col_begin; ki < col_end; ++ki) {
                                    const I col_cell = col_cells[ki];
                                    const Vector<T, V> d = *reinterpret_cast<const Vector<T, V>*>(dy + col_cell * depth);
                                    const double b = static_cast<double>(row_size * col_sizes[col_cell]);
                                    add_direct_shares<T, V>(sum, d, b, reciprocal(b));
                                }
                            }
                            store_vector<T, V>(out_column + y * in_cols * depth, sum);
                        }
                    }
                }
            }
        }
    }
}

// Partitions (the sequences TF's fractional pooling generates: cells that start at 0, follow
// one another and end at the last input index; overlapping cells also share their boundary
// row or column): a thread per (cell column, channel vector, chunk of cell rows) computes each
// cell's shares once and writes them over the cell's own region, rows row_bounds[r] ..
// row_bounds[r + 1] - 1 and columns col_bounds[c] .. col_bounds[c + 1] - 1.  No shared memory,
// no barriers, no per-element tables: every input-gradient element is one of at most four
// values per cell, rounded once and stored as 16-byte vectors.
//
// Disjoint cells of float16, bfloat16 and float32 (of at most kFloatShareCells elements: the
// launcher's condition) take their one value from float_cell_values: float arithmetic only, no
// FP64 instruction and no conversion through double, TF's bits (parts D-F above it).
// Overlapping cells of those types sum their shares in float-float where FP64 is slow (every
// architecture but kFastFp64's: parts G-I), a vector whose values round_sum cannot decide
// taking the double shares out of line; elsewhere, and for the other types, the double shares.
//
// Overlapping cells: the region's first row (r > 0) also lies in cell r - 1, its first column
// (c > 0) in cell c - 1, and TF adds the shares cell by cell in row-cell-major order, so the
// first row takes s(r-1, c) + s(r, c), the first column s(r, c-1) + s(r, c) and the corner
// ((s(r-1, c-1) + s(r-1, c)) + s(r, c-1)) + s(r, c).  A thread walks down its column of cells
// keeping the row above (s(r-1, c) and s(r-1, c-1) are the previous row's s(r, c) and
// s(r, c-1)); it recomputes s(r, c-1), its left neighbour's own share, from the same
// out_backprop vector and cell size, so the bits are the neighbour's.  A missing neighbour
// (r = 0 or c = 0) is +0.0: no share is -0.0, so +0.0 + s and s + +0.0 are s, and the four
// values are then the ones TF sums for that position.
//
// Threads: fractional_cells::for_each_cell_column (fractional_cells.cuh).
template <typename T, typename I, int V, bool OVERLAP>
__global__ void fractional_avg_pool_grad_cells(
    const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    const I* __restrict__ row_bounds, const I* __restrict__ row_sizes, const I* __restrict__ col_bounds,
    const I* __restrict__ col_sizes, I in_rows, I in_cols, I depth, I out_rows, I out_cols, I columns,
    I column_blocks, I row_chunks, I channel_blocks, unsigned out_cols_magic, int out_cols_shift, int chunk_rows) {
    using namespace fractional;
    using Vec = Vector<T, V>;
    fractional_cells::for_each_cell_column<I, V>(
        depth, out_rows, out_cols, columns, column_blocks, row_chunks, channel_blocks, out_cols_magic, out_cols_shift,
        chunk_rows, [&](const I n, const I c, const I ch, const I r0, const I r1) {
            const bool has_left = OVERLAP && c > 0;
            const I col_first = col_bounds[c], col_count = col_bounds[c + 1] - col_first;
            const I col_width = col_sizes[c];  // columns in this column of cells, loaded once
            const double col_size = static_cast<double>(col_width);
            const double left_size = has_left ? static_cast<double>(col_sizes[c - 1]) : 0.0;
            // out_backprop at (n, r, c, ch) is dy_column + r * dy_row.
            const I dy_row = out_cols * depth;
            // From a cell's out_backprop vector to its left neighbour's (0 in the first column,
            // whose "neighbour" load reads the cell's own vector and is not used).
            const I left_step = has_left ? depth : I(0);
            const T* const dy_column = out_backprop + (n * out_rows * out_cols + c) * depth + ch;
            const I dx_row = in_cols * depth;
            T* const dx_column = in_backprop + (n * in_rows * in_cols + col_first) * depth + ch;

            // s(r - 1, c) and s(r - 1, c - 1): +0.0 where that cell does not exist.
            double up[V], up_left[V];
#pragma unroll
            for (int v = 0; v < V; ++v) up[v] = up_left[v] = 0.0;
            const auto shares_of = [&](const Vec& d, double size, double (&s)[V]) {
                cell_shares<T, V>(d, size, reciprocal(size), s);
            };
            // Overlapping cells of the float types where FP64 is slow: the shares as q + e (see
            // round_sum), the row above's carried so.
            constexpr bool float_sums = OVERLAP && !kFastFp64 && FloatShares<T>::value;
            const float col_width_f = static_cast<float>(col_width);  // <= kFloatShareCells
            const float left_width_f = has_left ? static_cast<float>(col_sizes[c - 1]) : 0.0f;
            float up_q[V], up_e[V], up_left_q[V], up_left_e[V];
#pragma unroll
            for (int v = 0; v < V; ++v) up_q[v] = up_e[v] = up_left_q[v] = up_left_e[v] = 0.0f;
            // float32 values below 2^-100 but zero have shares that may round to q = 0 and e = 0
            // (below 2^-150) while their sum does not: a thread that has loaded one leaves every
            // later value to the double shares (part G's zero M needs every share exactly zero).
            bool tiny = false;
            const auto float_shares_of = [&](const Vec& d, float size, float (&q)[V], float (&e)[V]) {
                const float y = float_reciprocal(size);
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    const float a = to_float(d.e[v]);
                    float_float_share(a, size, y, q[v], e[v]);
                    if constexpr (sizeof(T) == 4) tiny |= fabsf(a) < 0x1p-100f && a != 0.0f;
                }
            };
            if (OVERLAP && r0 > 0) {
                // Both vectors are loaded before either is divided: one memory round trip.
                const T* const dy_above = dy_column + (r0 - 1) * dy_row;
                const Vec above = *reinterpret_cast<const Vec*>(dy_above);
                const Vec above_left = load_here<T, V>(dy_above - left_step);
                if constexpr (float_sums) {
                    const float row_size = static_cast<float>(row_sizes[r0 - 1]);
                    float_shares_of(above, row_size * col_width_f, up_q, up_e);
                    if (has_left) float_shares_of(above_left, row_size * left_width_f, up_left_q, up_left_e);
                } else {
                    const double row_size = static_cast<double>(row_sizes[r0 - 1]);
                    shares_of(above, row_size * col_size, up);
                    if (has_left) shares_of(above_left, row_size * left_size, up_left);
                }
            }
            if constexpr (OVERLAP && !float_sums) {
                // Overlapping cells in double: cell row r's shares (own: s(r, c), left_own:
                // s(r, c-1)) from its out_backprop, its region written from them and the row
                // above's (up, up_left), which the caller's next row takes as its own above.  The
                // row's two vectors are loaded together, before either is used: one memory round
                // trip a cell row, where loading each where it is used made two (the left one,
                // used only where c > 0, pinned by load_here).  Loading a pair's four vectors at
                // once made one a pair but took float16 from 96 to 118 registers, 20 to 16 warps
                // an SM (benchmarks/README.md, session 91: the static models disagree on which is
                // faster).
                const auto double_row = [&](const I r, const double (&above)[V], const double (&above_left)[V],
                                            double (&own)[V], double (&left_own)[V]) {
                    const T* const dy = dy_column + r * dy_row;
                    const Vec d = *reinterpret_cast<const Vec*>(dy);
                    const Vec d_left = load_here<T, V>(dy - left_step);
                    const I row_first = row_bounds[r], row_count = row_bounds[r + 1] - row_first;
                    const double row_size = static_cast<double>(row_sizes[r]);
                    shares_of(d, row_size * col_size, own);
#pragma unroll
                    for (int v = 0; v < V; ++v) left_own[v] = 0.0;
                    if (has_left) shares_of(d_left, row_size * left_size, left_own);
                    write_overlap_region<T, V, I>(dx_column + row_first * dx_row, dx_row, depth, row_count, col_count,
                                                  above_left, above, left_own, own);
                };
                // Two cell rows an iteration (kPairedCellRows), the shares carried between them
                // in two sets that swap roles, so no row copies its shares for the next (32 moves
                // a row in float16 when one loop iteration was one row); an odd chunk leaves after
                // its first half, so no remainder iteration lies outside the loop.  (Not the
                // float-float sums: unrolled, ptxas keeps their copies and takes 55 more
                // registers on sm_86 in float16.)
                double next[V], next_left[V];
                if constexpr (kPairedCellRows<T>) {
#pragma unroll 1
                    for (I r = r0; r < r1; r += 2) {
                        double_row(r, up, up_left, next, next_left);
                        if (r + 1 == r1) break;
                        double_row(r + 1, next, next_left, up, up_left);
                    }
                } else {
#pragma unroll 1
                    for (I r = r0; r < r1; ++r) {
                        double_row(r, up, up_left, next, next_left);
#pragma unroll
                        for (int v = 0; v < V; ++v) {
                            up[v] = next[v];
                            up_left[v] = next_left[v];
                        }
                    }
                }
            } else {
#pragma unroll 1
                for (I r = r0; r < r1; ++r) {
                    const I row_first = row_bounds[r], row_count = row_bounds[r + 1] - row_first;
                    // The values of the region's first row (its first column: corner; the others:
                    // top) and of its other rows (first column: left; the others: inner), each
                    // rounded only where the region has such positions.
                    Vec corner, top, left, inner;
                    const T* const dy = dy_column + r * dy_row;
                    if constexpr (float_sums) {
                        // Both vectors loaded before either is used: one memory round trip a row.
                        const Vec row_vector = *reinterpret_cast<const Vec*>(dy);
                        const Vec left_vector = load_here<T, V>(dy - left_step);
                        const float row_size = static_cast<float>(row_sizes[r]);
                        float own_q[V], own_e[V], left_q[V], left_e[V];
                        float_shares_of(row_vector, row_size * col_width_f, own_q, own_e);
#pragma unroll
                        for (int v = 0; v < V; ++v) left_q[v] = left_e[v] = 0.0f;
                        if (has_left) float_shares_of(left_vector, row_size * left_width_f, left_q, left_e);
                        bool decided = !tiny;
#pragma unroll
                        for (int v = 0; v < V; ++v) {
                            float s, t1, t2, t3;
                            two_sum(up_left_q[v], up_q[v], s, t1);  // ((s(r-1,c-1) + s(r-1,c)) + s(r,c-1)) + s(r,c)
                            two_sum(s, left_q[v], s, t2);
                            two_sum(s, own_q[v], s, t3);
                            decided &= round_sum(s, ((((up_left_e[v] + up_e[v]) + left_e[v]) + own_e[v]) + t1 + t2) + t3,
                                                 ((fabsf(up_left_q[v]) + fabsf(up_q[v])) + fabsf(left_q[v])) + fabsf(own_q[v]),
                                                 corner.e[v]);
                            two_sum(up_q[v], own_q[v], s, t1);
                            decided &= round_sum(s, (up_e[v] + own_e[v]) + t1, fabsf(up_q[v]) + fabsf(own_q[v]), top.e[v]);
                            two_sum(left_q[v], own_q[v], s, t1);
                            decided &= round_sum(s, (left_e[v] + own_e[v]) + t1, fabsf(left_q[v]) + fabsf(own_q[v]), left.e[v]);
                            decided &= !float_share_inexact<T>(own_q[v]);  // one share: q is T's value (parts D, E)
                            inner.e[v] = from_float<T>(own_q[v]);
                            up_q[v] = own_q[v];
                            up_e[v] = own_e[v];
                            up_left_q[v] = left_q[v];
                            up_left_e[v] = left_e[v];
                        }
                        if (!decided) {
                            const double row_size_d = static_cast<double>(row_sizes[r]);
                            const double up_size = r > 0 ? static_cast<double>(row_sizes[r - 1]) : 0.0;
                            overlap_region_in_double<T, V, I>(dy, dy_row, depth, row_size_d * col_size, up_size * col_size,
                                                              row_size_d * left_size, up_size * left_size,
                                                              dx_column + row_first * dx_row, dx_row, row_count, col_count);
                            continue;
                        }
                    } else if constexpr (FloatShares<T>::value) {  // no FP64 (see float_cell_values)
                        const Vec d = *reinterpret_cast<const Vec*>(dy);  // one 16-byte load
                        const float size = static_cast<float>(row_sizes[r] * col_width);  // <= kFloatShareCells
                        corner = top = left = inner = float_cell_values<T, V>(d, size, float_reciprocal(size));
                    } else {
                        double own[V];
                        const Vec d = *reinterpret_cast<const Vec*>(dy);  // one 16-byte load
                        shares_of(d, static_cast<double>(row_sizes[r]) * col_size, own);
                        corner = top = left = inner = round_vector<T, V>(own);
                    }
                    write_region<T, V>(dx_column + row_first * dx_row, dx_row, depth, row_count, col_count, corner, top,
                                       left, inner);
                }
            }
        });
}

}  // namespace gradops
