// Implicit-GEMM machinery shared by the convolution kernels (conv2d, conv2d_backprop_filter,
// conv2d_backprop_input): the convolution sizes every kernel receives, fast integer division
// for index decomposition, and one CTA-tiled GEMM core that an op drives through a "problem"
// object (which gathers A and B elements and stores C elements).
//
// GEMM orientation: C[m][n] = sum_k A[m][k] * B[k][n] over k in [k_begin, k_end).  Tiles live in
// shared memory reduction-major (As[k][m], Bs[k][n]) whatever the global layout; the problem
// says along which index its operands are contiguous in global memory so that consecutive
// threads load consecutive addresses.
#pragma once

#include "gradops_common.cuh"
#include "tensor_core_ptx.cuh"  // GRADOPS_ARCH, and the sm_80 ldmatrix / mma.sync primitives
#include <mma.h>

// WMMA exists from sm_70 (float16 in, float accumulate); bfloat16 and TF32 fragments from sm_80.
// mma.h declares nothing else, so the code using them is compiled only where they exist.
#define GRADOPS_HAS_WMMA (GRADOPS_ARCH >= 700)
#define GRADOPS_HAS_WMMA_BF16_TF32 (GRADOPS_ARCH >= 800)

namespace gradops {

// ---------------------------------------------------------------- convolution sizes
// Names as in TF's docs; input/out_backprop in NHWC or NCHW, filter HWIO
// [filter_rows, filter_cols, filter_in_depth, out_depth] with filter_in_depth = in_depth / groups.
struct ConvDims {
    index_t batch, in_rows, in_cols, in_depth;
    index_t filter_rows, filter_cols, filter_in_depth, out_depth;
    index_t out_rows, out_cols, groups;
    index_t stride_rows, stride_cols, dilation_rows, dilation_cols, pad_top, pad_left;
    __device__ __forceinline__ index_t out_per_group() const { return out_depth / groups; }
};

// Every convolution kernel takes the sizes as these scalar arguments (CuPy passes np.int64 as
// long long), in this order, right after its pointer arguments.
#define GRADOPS_CONV_DIMS_PARAMS                                                                  \
    long long batch, long long in_rows, long long in_cols, long long in_depth,                    \
    long long filter_rows, long long filter_cols, long long filter_in_depth, long long out_depth, \
    long long out_rows, long long out_cols, long long groups,                                     \
    long long stride_rows, long long stride_cols, long long dilation_rows, long long dilation_cols, \
    long long pad_top, long long pad_left
#define GRADOPS_CONV_DIMS                                                                         \
    ::gradops::ConvDims{batch, in_rows, in_cols, in_depth, filter_rows, filter_cols,              \
                        filter_in_depth, out_depth, out_rows, out_cols, groups, stride_rows,      \
                        stride_cols, dilation_rows, dilation_cols, pad_top, pad_left}

// ---------------------------------------------------------------- fast division
// Division of a non-negative int numerator below 2^31 by a fixed positive divisor as a 64-bit
// multiply and shift.  With shift = 31 + ceil(log2(d)) and mul = ceil(2^shift / d) the error
// term n * (mul * d - 2^shift) stays below 2^shift for n < 2^31, so the quotient is exact.
// The tiled kernels only run when every GEMM index is below 2^31 (the launchers check).
struct FastDiv {
    unsigned long long mul;
    int shift;
    int divisor;
    // Trivial, so that a struct holding FastDivs can be a __shared__ variable: the device never
    // runs a __shared__ variable's constructor (NVRTC warning 20054), the host model would.
    FastDiv() = default;
    // The constants from the host (gradops/backends/cuda/_runtime.py: division_magic), as the
    // launch tables carry them: no construction cost in the kernel.
    __device__ __forceinline__ FastDiv(unsigned magic, int shift_, int d) : mul(magic), shift(shift_), divisor(d) {}
    // The same with its constants opaque to the optimiser: from the constant bank, the
    // compiler would otherwise redo a row cursor's divisions in every k-tile rather than keep
    // the cursor in registers (sm_90 float16 filter gradient: 175 SASS instructions per k-tile
    // instead of 150).
    __device__ __forceinline__ static FastDiv pinned(unsigned magic, int shift_, int d) {
        asm volatile("" : "+r"(magic), "+r"(shift_));
        return FastDiv(magic, shift_, d);
    }
    // Built in the kernel (the forward convolution's threads build theirs in the prologue;
    // the gradients' come from the host, above), so the constructor avoids a 64-bit
    // integer division (a called slow path of about a hundred instructions) and a loop: the
    // quotient 2^shift / d (in [2^31, 2^32]) as 2^shift times the correctly rounded double
    // reciprocal of d is within 2^-21 of the exact one, so its floor is at most two below
    // ceil(2^shift / d) and never above it; exact 64-bit products (below 2^63) settle it.
    __device__ __forceinline__ explicit FastDiv(int d) : divisor(d) {
        const int log2_ceil = d > 1 ? 32 - clz32(static_cast<unsigned>(d - 1)) : 0;
        shift = 31 + log2_ceil;
        const unsigned long long power = 1ULL << shift, dd = static_cast<unsigned long long>(d);
        mul = static_cast<unsigned long long>(static_cast<double>(power) * reciprocal(static_cast<double>(d)));
        if (mul * dd < power) ++mul;
        if (mul * dd < power) ++mul;
    }
    // 1 / x correctly rounded (times a power of two, still the correctly rounded quotient).
    __device__ __forceinline__ static double reciprocal(double x) {
#if defined(__CUDA_ARCH__)
        return __drcp_rn(x);
#else
        return 1.0 / x;
#endif
    }
    // Count of leading zero bits (x > 0).
    __device__ __forceinline__ static int clz32(unsigned x) {
#if defined(__CUDA_ARCH__)
        return __clz(static_cast<int>(x));
#else
        int n = 0;
        while (!(x & 0x80000000u)) { x <<= 1; ++n; }
        return n;
#endif
    }
    __device__ __forceinline__ int div(int n) const {
        return static_cast<int>((static_cast<unsigned long long>(n) * mul) >> shift);
    }
    // Quotient, and the remainder through ``rem``.
    __device__ __forceinline__ int divmod(int n, int& rem) const {
        int q = div(n);
        rem = n - q * divisor;
        return q;
    }
};

// The FastDiv constants of InputOperand's divisors (by filter_in_depth, filter_cols, out_cols,
// out_rows), from the launcher (_conv_igemm.input_div_args): kernel arguments, pinned in
// registers (FastDiv::pinned), instead of four constructions in every thread's prologue.
#define GRADOPS_INPUT_DIVS_PARAMS                                                                 \
    unsigned cg_magic, int cg_shift, unsigned s_magic, int s_shift, unsigned q_magic, int q_shift, \
    unsigned p_magic, int p_shift
#define GRADOPS_INPUT_DIVS(dims)                                                                  \
    ::gradops::FastDiv::pinned(cg_magic, cg_shift, static_cast<int>((dims).filter_in_depth)),     \
        ::gradops::FastDiv::pinned(s_magic, s_shift, static_cast<int>((dims).filter_cols)),       \
        ::gradops::FastDiv::pinned(q_magic, q_shift, static_cast<int>((dims).out_cols)),          \
        ::gradops::FastDiv::pinned(p_magic, p_shift, static_cast<int>((dims).out_rows))

namespace igemm {

// How the CTA multiplies its tiles.
enum MathKind {
    SIMT = 0,       // FMA on CUDA cores: float (exact float32 products) and double
    WMMA_HALF = 1,  // tensor cores, __half / __nv_bfloat16 in, float accumulate: ldmatrix +
                    // mma.sync.m16n8k16 from sm_80 (mma_cta), WMMA m16n16k16 on sm_70/75
    WMMA_TF32 = 2   // tensor cores, float rounded to TF32 in, float accumulate: ldmatrix or one-
                    // element reads + mma.sync.m16n8k8 (mma_cta, sm_80+); opt-in
};

// Tile shapes.  Tensor-core CTAs are 128x128 with 8 warps (2 x 4, each a 64x32 patch of 4 x 2
// 16x16 WMMA fragments, or 4 x 4 16x8 mma.sync tiles): large enough to reuse each loaded element 128 times, small enough for two
// tiles plus staging to fit the 48 KiB of static shared memory.  The mma.sync path also has
// 128x64, 64x128 and 64x64 (MmaConfig) for 64-channel GEMMs.
template <typename T, int Kind> struct Config;

// Whether this architecture has tensor cores for element type T in math kind Kind (the launchers
// ask _conv_igemm.math_kinds for the same answer and never request an instantiation without).
template <typename T, int Kind> struct HasTensorCores {
    static constexpr bool value = Kind == SIMT || GRADOPS_HAS_WMMA_BF16_TF32;
};
template <> struct HasTensorCores<__half, WMMA_HALF> { static constexpr bool value = GRADOPS_HAS_WMMA; };

template <typename T> struct Config<T, WMMA_HALF> {
    static constexpr int BM = 128, BN = 128, BK = 32;
    static constexpr int WARPS_M = 2, WARPS_N = 4;
    static constexpr int FRAG_K = 16;
    static constexpr int PAD = 8;  // 16 bytes: keeps WMMA's ldm a multiple of 16 bytes, skews banks
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
};

// The mma.sync path's tile shapes (sm_80+, 16-byte chunks): TILE_M x TILE_N CTAs built of the
// same 64 x 32 warp patches, so every shape runs the same warp code.  128 x 128 (8 warps) is
// the default and equals Config<T, WMMA_HALF>; 128 x 64 and 64 x 128 (4 warps) are for GEMMs
// with 64 columns or rows (64-channel layers), where a 128-wide tile would be half padding, and
// 64 x 64 (2 warps) for GEMMs with both (_conv_igemm.pick_tile chooses).
template <typename T, int TILE_M, int TILE_N> struct MmaConfig {
    // k-rows of 64 bytes: 32 halves (Config<T, WMMA_HALF>'s BK) or 16 floats (TF32's), so that
    // a k-tile is two mma k-steps and every swizzled layout sees the same bytes per row.
    static constexpr int BM = TILE_M, BN = TILE_N, BK = 64 / static_cast<int>(sizeof(T));
    static constexpr int WARP_M = 64, WARP_N = 32;  // a warp's patch: 4 x 4 m16n8 accumulator tiles
    static constexpr int WARPS_M = BM / WARP_M, WARPS_N = BN / WARP_N;
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    static_assert(BM % WARP_M == 0 && BN % WARP_N == 0, "a tile is whole warp patches");
};

template <> struct Config<float, WMMA_TF32> {
    static constexpr int BM = 128, BN = 128, BK = 16;
    static constexpr int WARPS_M = 2, WARPS_N = 4;
    static constexpr int FRAG_K = 8;
    static constexpr int PAD = 4;  // 16 bytes
    static constexpr int THREADS = 32 * WARPS_M * WARPS_N;
};

// SIMT: 256 threads in a 16 x 16 grid, each owning a TM x TN block of C (register blocking).
template <> struct Config<float, SIMT> {
    static constexpr int BM = 128, BN = 128, BK = 8, TM = 8, TN = 8;
    static constexpr int PAD = 4;
    static constexpr int THREADS = (BM / TM) * (BN / TN);
};
template <> struct Config<double, SIMT> {
    static constexpr int BM = 64, BN = 64, BK = 8, TM = 4, TN = 4;
    static constexpr int PAD = 2;
    static constexpr int THREADS = (BM / TM) * (BN / TN);
};
// Half types on CUDA cores (float accumulate), for GPUs without tensor cores for the type
// (bfloat16 before sm_80, every half type before sm_70).  BK = 16: a thread's one 16-byte chunk
// of 8 elements then tiles 128 x 16 evenly; PAD = 8 keeps rows 16-byte aligned.
template <typename T> struct Config<T, SIMT> {
    static constexpr int BM = 128, BN = 128, BK = 16, TM = 8, TN = 8;
    static constexpr int PAD = 8;
    static constexpr int THREADS = (BM / TM) * (BN / TN);
};

// ---------------------------------------------------------------- tile loading
// Each thread loads chunks of C = 16 / sizeof(T) elements that are consecutive in global memory
// (along the operand's contiguous dimension), so the index math of the other dimension is done
// once per chunk.  VECTOR: one 16-byte load per chunk, when the launcher has checked that every
// channel count is a multiple of C and every pointer 16-byte aligned (a chunk then never
// straddles a filter tap, a group or an edge of the GEMM).  Otherwise C scalar loads, each
// with its own bounds check.
template <typename T> struct ChunkSize {
    static constexpr int value = static_cast<int>(sizeof(uint4) / sizeof(T));
};

// Through opaque_value() (gradops_common.cuh): the loaders' row index, so that the compiler
// recomputes each chunk's index math per tile instead of hoisting all of it out of the reduction
// loop, which held dozens of registers and made the scalar-load kernels spill (ptxas: 255
// registers plus spills before, 166-205 after; see python -m gradops kernels); and the pointers
// of the gathers from a table (the scalar row table, the few-channel kernel), which then add
// each element's 32-bit offset with one wide multiply-add instead of folding the pointer's own
// sum into every element's 64-bit address (loads through them: load_readonly).
template <typename T> __device__ __forceinline__ T load_readonly(const T* p) {
#ifdef __CUDA_ARCH__
    return __ldg(p);
#else
    return *p;
#endif
}

// A tile of ROWS (the m or n extent) x BK elements, loaded by THREADS threads in chunks of C
// and stored into shared memory.  K_CONTIG: the operand is contiguous along k in global memory,
// so a chunk spans C consecutive k and consecutive threads take consecutive chunks along k
// (else along rows).  Either way all of a thread's chunks share one k offset, so a thread keeps
// one reduction cursor per operand: along k, chunk e is THREADS chunks further (THREADS is a
// multiple of a row's BK / C chunks); along rows, PER_K consecutive threads cover one k's
// ROWS / C chunks, chunk e of a thread PER_K chunks after chunk e - 1.  8 consecutive lanes
// still take 8 consecutive chunks of one k (a 128-byte store or cp.async phase, one global
// segment).
template <int ROWS, int BK, int THREADS, bool K_CONTIG, int C> struct TileMap {
    static constexpr int CHUNKS = ROWS * BK / (THREADS * C);  // per thread
    static_assert(ROWS * BK % (THREADS * C) == 0, "tile must divide evenly among threads");
    static_assert((K_CONTIG ? BK : ROWS) % C == 0, "chunks must tile the contiguous dimension");
    static_assert(K_CONTIG ? THREADS % (BK / C) == 0 : (ROWS / C) % CHUNKS == 0,
                  "a thread's chunks share one k offset");
    static constexpr int PER_K = K_CONTIG ? 0 : ROWS / C / CHUNKS;  // threads per k (rows map)
    // The k an 8-lane store phase covers (rows map): 1 where 8 or more lanes share a k.
    static constexpr int PHASE_KS = K_CONTIG || PER_K >= 8 ? 1 : 8 / PER_K;
    static_assert(K_CONTIG || PER_K >= 8 || 8 % PER_K == 0, "a store phase covers whole runs of one k");
    // First (row, k) of this thread's chunk e.
    __device__ __forceinline__ static void at(int e, int& row, int& k) {
        const int t = static_cast<int>(threadIdx.x);
        if constexpr (K_CONTIG) {
            const int u = t + e * THREADS;
            k = u % (BK / C) * C;
            row = u / (BK / C);
        } else {
            row = (t % PER_K + e * PER_K) * C;
            k = t / PER_K;
        }
    }
};

// ---------------------------------------------------------------- the input operand
// Where a chunk comes from: its address, and whether it exists (false: padding, a tap off the
// image, a reduction index past the end; the chunk is then zeros and ``ptr`` is not read).  A
// flag rather than a null pointer, so that the loaders test the bounds predicate itself, not a
// 64-bit pointer.
template <typename T> struct Src {
    const T* ptr;
    bool ok;
};

// The gathered input of the forward and filter-gradient GEMMs (NHWC): element (tap, position)
// with tap = (r * filter_cols + s) * Cg + c and position = (n * out_rows + p) * out_cols + q is
// input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols -
// pad_left][group's first channel + c], zero in the padding.  Chunks run along c.
//
// 32-bit: the launchers check that padded coordinates plus the dilated filter's extent, the
// channel counts and one image's elements fit (_conv_igemm.cursor_extents), so every coordinate
// and every offset inside an image below does; only the image's start is 64-bit.
template <typename T> struct InputOperand {
    const T* __restrict__ input;
    FastDiv div_cg, div_s, div_q, div_p;
    int channel0;
    int in_rows, in_cols, in_depth, out_rows, out_cols, filter_cols, filter_in_depth;
    int stride_rows, stride_cols, dilation_rows, dilation_cols, pad_top, pad_left;
    index_t image;  // elements per image, in_rows * in_cols * in_depth

    __device__ __forceinline__ InputOperand() : input(nullptr), channel0(0) {}
    __device__ __forceinline__ InputOperand(const T* input_, const ConvDims& dims, index_t group)
        : InputOperand(input_, dims, group, FastDiv(static_cast<int>(dims.filter_in_depth)),
                       FastDiv(static_cast<int>(dims.filter_cols)), FastDiv(static_cast<int>(dims.out_cols)),
                       FastDiv(static_cast<int>(dims.out_rows))) {}
    // With the divisors' constants from the host (a kernel's GRADOPS_INPUT_DIVS_PARAMS): no
    // FastDiv construction in the prologue.
    __device__ __forceinline__ InputOperand(const T* input_, const ConvDims& dims, index_t group, FastDiv by_cg,
                                            FastDiv by_s, FastDiv by_q, FastDiv by_p)
        : input(input_), div_cg(by_cg), div_s(by_s), div_q(by_q), div_p(by_p),
          channel0(static_cast<int>(group * dims.filter_in_depth)),
          in_rows(static_cast<int>(dims.in_rows)), in_cols(static_cast<int>(dims.in_cols)),
          in_depth(static_cast<int>(dims.in_depth)), out_rows(static_cast<int>(dims.out_rows)),
          out_cols(static_cast<int>(dims.out_cols)), filter_cols(static_cast<int>(dims.filter_cols)),
          filter_in_depth(static_cast<int>(dims.filter_in_depth)),
          stride_rows(static_cast<int>(dims.stride_rows)), stride_cols(static_cast<int>(dims.stride_cols)),
          dilation_rows(static_cast<int>(dims.dilation_rows)), dilation_cols(static_cast<int>(dims.dilation_cols)),
          pad_top(static_cast<int>(dims.pad_top)), pad_left(static_cast<int>(dims.pad_left)),
          image(dims.in_rows * dims.in_cols * dims.in_depth) {}

    // Row cursors (see "Row cursors" below): what a fixed tap, or a fixed position, contributes.
    struct TapRow {
        int h_offset, w_offset, channel;  // r * dilation_rows - pad_top, ...; input channel
    };
    struct PositionRow {
        const T* image;      // the position's image in the input
        int h_base, w_base;  // p * stride_rows - pad_top, q * stride_cols - pad_left
    };
    __device__ __forceinline__ TapRow tap_row(int tap) const {
        int c, s;
        const int r = div_s.divmod(div_cg.divmod(tap, c), s);
        return {r * dilation_rows - pad_top, s * dilation_cols - pad_left, channel0 + c};
    }
    __device__ __forceinline__ PositionRow position_row(int position) const {
        int q, p;
        const int n = div_p.divmod(div_q.divmod(position, q), p);
        return {input + n * image, p * stride_rows - pad_top, q * stride_cols - pad_left};
    }

    // Reduction cursors (see "Reduction cursors" below).  The filter gradient reduces over
    // positions, the forward convolution over taps; each cursor is its index decomposed.
    struct Position {
        const T* image;  // input image n of position (n * out_rows + p) * out_cols + q
        int p, q;
    };
    struct Tap {
        int r, s, c;  // of tap (r * filter_cols + s) * Cg + c
    };
    __device__ __forceinline__ Position position(int j) const {
        int q, p;
        const int n = div_p.divmod(div_q.divmod(j, q), p);
        return {input + n * image, p, q};
    }
    __device__ __forceinline__ Tap tap(int kk) const {
        int c, s;
        const int r = div_s.divmod(div_cg.divmod(kk, c), s);
        return {r, s, c};
    }
    // pos -> pos + step (step: a decomposed index, each digit below its radix, so one carry
    // per digit suffices).
    // A position's image is a pointer, so that moving to the next image is one 64-bit add and
    // a gather adds only its 32-bit offset inside the image (step.image - input: step's images).
    __device__ __forceinline__ void advance(Position& pos, const Position& step) const {
        pos.q += step.q;
        pos.p += step.p;
        pos.image += step.image - input;
        if (pos.q >= out_cols) { pos.q -= out_cols; ++pos.p; }
        if (pos.p >= out_rows) { pos.p -= out_rows; pos.image += image; }
    }
    __device__ __forceinline__ void advance(Tap& t, const Tap& step) const {
        t.c += step.c;
        t.s += step.s;
        t.r += step.r;
        if (t.c >= filter_in_depth) { t.c -= filter_in_depth; ++t.s; }
        if (t.s >= filter_cols) { t.s -= filter_cols; ++t.r; }
    }

    // Element (tap, position) of the gather (not ok in the padding), with the tap's part from a
    // row cursor (filter gradient) ...
    __device__ __forceinline__ Src<T> gather(const TapRow& tap, const Position& pos) const {
        return at(pos.image, pos.p * stride_rows + tap.h_offset, pos.q * stride_cols + tap.w_offset,
                  tap.channel);
    }
    // ... or the position's (forward convolution).
    __device__ __forceinline__ Src<T> gather(const PositionRow& position, const Tap& t) const {
        return at(position.image, position.h_base + t.r * dilation_rows, position.w_base + t.s * dilation_cols,
                  channel0 + t.c);
    }
    __device__ __forceinline__ Src<T> at(const T* image_start, int h, int w, int channel) const {
        return {image_start + ((h * in_cols + w) * in_depth + channel),
                h >= 0 && h < in_rows && w >= 0 && w < in_cols};
    }

    // The scalar path's row table (Loader, Problem::A_ROW_TABLE): a tap's row and column offset
    // and its part of the offset inside an image, computed once per CTA, so that an element
    // costs two adds, two unsigned compares and an add instead of the tap's decomposition.
    // Everything is unsigned and wraps mod 2^32: where the element is inside the image, the
    // position's part + the tap's part is its offset, below 2^31.
    struct TapEntry {
        unsigned h, w;  // r * dilation_rows - pad_top, s * dilation_cols - pad_left
        unsigned offset;
    };
    // Absent elements by a row or column of 2^31 (mod 2^32), which no sum with it can bring
    // below in_rows or in_cols (both below 2^31 - |any tap or position part|, the launcher's
    // cursor_extents): a tap past the GEMM's rows has h = 2^31, a position past the reduction's
    // end w = 2^31, so that one of the two tests fails even when both are absent.
    static constexpr unsigned kAbsent = 0x80000000u;
    __device__ __forceinline__ static TapEntry absent_tap() { return {kAbsent, 0u, 0u}; }
    __device__ __forceinline__ TapEntry tap_entry(int tap) const {
        const TapRow t = tap_row(tap);
        const unsigned h = static_cast<unsigned>(t.h_offset), w = static_cast<unsigned>(t.w_offset);
        return {h, w, (h * in_cols + w) * in_depth + static_cast<unsigned>(t.channel)};
    }
    struct PositionEntry {
        const T* image;
        unsigned h, w;  // p * stride_rows, q * stride_cols
        unsigned offset;
    };
    __device__ __forceinline__ PositionEntry position_entry(const Position& pos, bool in_reduction) const {
        const unsigned h = static_cast<unsigned>(pos.p * stride_rows), w = static_cast<unsigned>(pos.q * stride_cols);
        // Both opaque: each element's address is then one add and one wide multiply-add.
        return {opaque_value(pos.image), h, in_reduction ? w : kAbsent,
                static_cast<unsigned>(opaque_value(static_cast<int>((h * in_cols + w) * in_depth)))};
    }
    __device__ __forceinline__ Src<T> gather(const PositionEntry& pos, const TapEntry& tap) const {
        // Unsigned: one wide multiply-add forms the address.
        return {pos.image + (pos.offset + tap.offset),
                pos.h + tap.h < static_cast<unsigned>(in_rows) && pos.w + tap.w < static_cast<unsigned>(in_cols)};
    }
};

// The row cursor of an operand whose row is a channel with a fixed offset (out_backprop and the
// filter along out channels, the filter along input channels).
struct ChannelRow {
    int offset;
};

// ---------------------------------------------------------------- the CTA core
// Problem interface (all indices int, offsets inside it 64-bit):
//   int m_size, n_size, k_begin, k_end;
//   static constexpr bool A_K_CONTIG, B_K_CONTIG;
//   struct ARow;                             what A's addresses take from m, computed once
//   ARow a_row(int m) const;                 (m < m_size)
//   struct KPos;                             the decomposition of a reduction index k
//   KPos k_pos(int k) const;                 (divisions: see "Reduction cursors")
//   void k_advance(KPos& pos, const KPos& step) const;
//                                            k's -> (k + BK)'s, step = k_pos(BK)
//   Src<T> a_src(const ARow& row, const KPos& pos, int k) const;
//                                            the address of A[m][k] (with 16-byte chunks: and
//                                            of the C - 1 elements after it along A's
//                                            contiguous dimension), not ok where A is zero
//                                            (padding, taps off the image)
//   const T* a_base() const;                 a valid address in A's tensor: cp.async takes a
//                                            source address even for a zero chunk, of which it
//                                            reads no byte
//   struct BRow, BRow b_row(int n) const, b_src, b_base
//                                            likewise for B[k][n]
//   void store(int m, int n, Acc v) const;
//   index_t out_row(int m) const;            where C's row m starts in the output: store(m, n, v)
//   void store_at(index_t row, int n, Acc v) const;   is store_at(out_row(m), n, v)
//   void store_chunk(index_t row, int n, const float (&v)[8]) const;
//                                            store_at of n .. n + 7 as 16-byte stores (the
//                                            half-type tensor-core epilogue with 16-byte
//                                            chunks: n and the row start are multiples of 8)
// The core zero-fills elements past k_end, gives the rows of a tile past m_size (n_size) row 0's
// sources (valid addresses; those rows' results are never stored, and each row of C depends
// only on its own row of A, each column on its column of B), and only stores in-range elements,
// so problems need no bounds logic beyond the convolution's own padding.  Row cursors: a thread's chunks keep their
// GEMM row (m of A, n of B) for the whole reduction, so with 16-byte chunks the loader computes
// each chunk's ARow / BRow once, before the main loop, and each k-tile only decomposes k (the
// per-row index math, divisions included, leaves the loop).  The scalar path (channel counts
// not a multiple of C) cannot keep C rows per chunk in registers; instead a problem may keep a
// table in shared memory, filled outside the inner work: the filter gradient a row table (what
// each of the CTA's BM taps contributes, once per CTA), the input gradient a k table (what each
// of a tile's BK reduction indices contributes, one tile ahead; its chunks run along k, so
// they do keep row cursors).  Without a table, one decomposition per element per tile.
//
// Reduction cursors: likewise a chunk's k advances by BK per tile, so the vector path
// decomposes its k once (Problem::k_pos, divisions) and then adds the decomposition of BK digit
// by digit, one carry per digit (Problem::k_advance): no division in the main loop.  A cursor
// may hold pointers (the filter gradient's input image and out_backprop row), which a tile
// advances by the pointer difference of BK's decomposition.

// ---------------------------------------------------------------- shared-memory tile layouts
// Where element (row, k) of a ROWS x BK tile lives in shared memory.  Three layouts:
// * Padded: T[BK][ROWS + PAD], reduction-major, rows skewed by the padding (the SIMT and WMMA
//   tiles); a chunk is stored element by element.
// * SwizzledRows: [row][k] for an operand contiguous along k (K_CONTIG), no padding, 16-byte
//   chunks XOR-swizzled (below); a chunk is one 16-byte store or cp.async.
// * SwizzledCols: [k][row] for an operand contiguous along its rows, likewise swizzled.
// The swizzled layouts are mma_cta's, whose ldmatrix reads [row][k] without and [k][row] with
// .trans; both take one wavefront per 8-lane phase for its 16-byte stores and for ldmatrix.
struct Padded {
    static constexpr bool SWIZZLED = false;
};

// [row][k], BK elements per row: the tile is cut into 128-byte lines (one pass over the 32
// four-byte banks: 8 chunks, i.e. LINE_ROWS = 8 / (BK / C) rows), and chunk c of line L is
// stored at position c ^ (L % 8) of the line.  Then
//   * a 16-byte store phase (8 lanes: LINE_ROWS whole rows of one line, the loaders' k-major
//     chunk order) hits 8 distinct positions, and
//   * an ldmatrix phase (8 consecutive rows from a multiple of 8, one chunk column c: lines
//     L0 .. L0 + 8 / LINE_ROWS - 1, L0 a multiple of 8 / LINE_ROWS) hits positions
//     (c + j BK / C) ^ (L % 8), all distinct,
// so both take one wavefront (the host model counts them).  Padding cannot do both for 64-byte
// rows.
template <typename T, int ROWS, int BK> struct SwizzledRows {
    static constexpr bool SWIZZLED = true, K_CONTIG = true;
    static constexpr int ELEMENTS = ROWS * BK, ROW_ELEMENTS = BK;
    static constexpr int C = ChunkSize<T>::value;     // elements per 16-byte chunk
    static constexpr int ROW_CHUNKS = BK / C;         // 4 for 32 halves
    static constexpr int LINE_CHUNKS = 8;             // 128 bytes
    static constexpr int LINE_ROWS = LINE_CHUNKS / ROW_CHUNKS;
    static_assert(BK % C == 0 && LINE_CHUNKS % ROW_CHUNKS == 0, "rows of whole chunks, whole rows per line");
    __device__ __forceinline__ static int offset(int row, int k) {
        const int line = row / LINE_ROWS;
        const int chunk = row % LINE_ROWS * ROW_CHUNKS + k / C;
        return (line * LINE_CHUNKS + (chunk ^ line % LINE_CHUNKS)) * C + k % C;
    }
};

// [k][row], ROWS elements per k (256 bytes for 128 halves: whole 128-byte lines), chunk c of
// row k stored at chunk position c ^ swizzle(k).  A store phase (8 lanes: PHASE_KS consecutive
// k, 8 / PHASE_KS consecutive chunks from a multiple of that in each, the loaders' row-major
// chunk order for an operand contiguous along rows) and an ldmatrix.trans phase (rows
// k0 .. k0 + 7, k0 a multiple of 8, one chunk column) each hit 8 distinct positions modulo 8,
// i.e. 8 distinct groups of 4 banks.  swizzle(k) is k % 8 where a phase is one k (PHASE_KS = 1:
// the 128 x 128 tiles); with PHASE_KS k per phase (4-warp tiles: 4 lanes per k, 2 k; 64 x 64:
// 2 lanes per k, 4 k), the k of a
// phase differ in the swizzle's high bits (k % PHASE_KS selects which 8 / PHASE_KS positions)
// and k / PHASE_KS runs through the rest, still a permutation of 0..7 over 8 consecutive k.
// Unpadded and unswizzled, the 8 rows of an ldmatrix phase are 256 bytes apart: one bank group,
// 8 wavefronts.
template <typename T, int ROWS, int BK, int PHASE_KS = 1> struct SwizzledCols {
    static constexpr bool SWIZZLED = true, K_CONTIG = false;
    static constexpr int ELEMENTS = ROWS * BK;
    static constexpr int C = ChunkSize<T>::value;
    static constexpr int LINE_CHUNKS = 8;
    static constexpr int RUN = LINE_CHUNKS / PHASE_KS;  // chunks of one k in a store phase
    static_assert(ROWS % (C * LINE_CHUNKS) == 0, "rows of whole 128-byte lines");
    static_assert(LINE_CHUNKS % PHASE_KS == 0, "whole runs of chunks per k in a store phase");
    __device__ __forceinline__ static constexpr int swizzle(int k) {
        return (k % PHASE_KS) * RUN ^ (k / PHASE_KS) % RUN;
    }
    __device__ __forceinline__ static int offset(int row, int k) {
        return k * ROWS + ((row / C) ^ swizzle(k % LINE_CHUNKS)) * C + row % C;
    }
};

// mma_cta's ldmatrix addresses in a [row][k] tile: one per operand and k-step, plus a constant
// per 16-row block b of the warp's patch.  16 rows are 16 / LINE_ROWS = 8 whole lines, so the
// swizzle's line index mod 8 is unchanged and block b is b * 16 rows' elements further (mma_cta
// static_asserts it).  ([k][row] tiles keep one address per block: the block moves the chunk
// index, which the swizzle XORs.)
template <class Layout> struct RowBlocks {
    __device__ __forceinline__ static constexpr int rows(int b) { return b * 16 * Layout::ROW_ELEMENTS; }
};

// mma_cta's layout of an operand: chunks run along k (K_CONTIG) or along the rows; PHASE_KS:
// the k of one 8-lane store phase (TileMap::PHASE_KS).
template <typename T, int ROWS, int BK, bool K_CONTIG, int PHASE_KS = 1>
using Swizzled = typename Select<K_CONTIG, SwizzledRows<T, ROWS, BK>, SwizzledCols<T, ROWS, BK, PHASE_KS>>::type;

// ---------------------------------------------------------------- loaders
// Whether Problem keeps a row table for A's scalar path (Problem::A_ROW_TABLE; false where the
// problem does not say).  Such a problem gathers A along rows (not K_CONTIG) and provides
//   ARowEntry a_row_entry(int m) const;     what row m contributes (once per CTA), with
//                                           ARowEntry {unsigned h, w, offset;}
//   static ARowEntry a_row_absent();        an entry whose elements are all absent (zero)
//   APosEntry a_pos_entry(const KPos&, bool in_reduction) const;
//                                           what the reduction index contributes (per tile);
//                                           not in_reduction: every element absent
//   Src<T> a_entry_src(const APosEntry&, const ARowEntry&) const;
template <class P, class = void> struct HasRowTable { static constexpr bool value = false; };
template <class P> struct HasRowTable<P, decltype(void(P::A_ROW_TABLE))> {
    static constexpr bool value = P::A_ROW_TABLE;
};

// Whether Problem keeps a reduction table for its scalar path (Problem::K_TABLE; false where the
// problem does not say).  Such a problem gathers both operands along k (A_K_CONTIG and
// B_K_CONTIG), so a chunk is one row and C consecutive k, and provides
//   KEntry k_entry(const KPos&, bool in_reduction) const;
//                                           what a reduction index contributes to both
//                                           operands' elements (16 bytes); past k_end
//                                           (not in_reduction) A's elements are absent
//   TableARow table_a_row(int m) const;     the row cursors the loader keeps (likewise B)
//   Src<T> a_entry_src(const TableARow&, const KEntry&) const;   likewise b_entry_src
// (B's elements past k_end are the loader's to zero).
template <class P, class = void> struct HasKTable { static constexpr bool value = false; };
template <class P> struct HasKTable<P, decltype(void(P::K_TABLE))> {
    static constexpr bool value = P::K_TABLE;
};

template <class P, bool HAS> struct KEntryOf { using type = int; };
template <class P> struct KEntryOf<P, true> { using type = typename P::KEntry; };
// The row cursors a loader keeps: ARow / BRow, or with a k table the problem's TableARow /
// TableBRow (from table_a_row / table_b_row), which may hold pointers made opaque once.
template <class P, bool K_TABLE> struct RowsOf {
    using A = typename P::ARow;
    using B = typename P::BRow;
    __device__ __forceinline__ static A a(const P& p, int m) { return p.a_row(m); }
    __device__ __forceinline__ static B b(const P& p, int n) { return p.b_row(n); }
};
template <class P> struct RowsOf<P, true> {
    using A = typename P::TableARow;
    using B = typename P::TableBRow;
    __device__ __forceinline__ static A a(const P& p, int m) { return p.table_a_row(m); }
    __device__ __forceinline__ static B b(const P& p, int n) { return p.table_b_row(n); }
};

// N ints from 16-byte aligned shared memory (N a multiple of 4, or 2).
template <int N> __device__ __forceinline__ void load_ints(const int* src, int* dst) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const int4 v = *reinterpret_cast<const int4*>(src + i);
            dst[i] = v.x, dst[i + 1] = v.y, dst[i + 2] = v.z, dst[i + 3] = v.w;
        }
    } else {
        static_assert(N == 2, "whole int2 or int4 reads");
        const int2 v = *reinterpret_cast<const int2*>(src);
        dst[0] = v.x, dst[1] = v.y;
    }
}

// Which chunks a thread loads and their row cursors (see "Row cursors" above), shared by the
// two loaders below.  The scalar path (VECTOR false) keeps no cursors.  CURSORS: reduction
// cursors too (the multistage loader); without them each tile decomposes its chunks' k afresh,
// which holds fewer registers across the loop (the register-staged loader, whose SIMT
// instantiations are FMA-bound and at the 128-register bound of 2 CTAs per SM).
template <typename T, int BM, int BN, int BK, int THREADS, bool VECTOR, class Problem, bool CURSORS = false>
struct ChunkRows {
    static constexpr int C = ChunkSize<T>::value;
    using MapA = TileMap<BM, BK, THREADS, Problem::A_K_CONTIG, C>;
    using MapB = TileMap<BN, BK, THREADS, Problem::B_K_CONTIG, C>;
    using KPos = typename Problem::KPos;
    // Reduction cursors: one per operand, since a thread's chunks of one map share their k
    // offset (TileMap); B uses A's when the two maps give the same offset.
    static constexpr bool B_USES_A = Problem::A_K_CONTIG == Problem::B_K_CONTIG &&
                                     (Problem::A_K_CONTIG || MapA::PER_K == MapB::PER_K);
    // Row cursors: with 16-byte chunks, or with scalar loads from a k table (whose chunks are
    // one row each, as 16-byte ones are).
    static constexpr bool K_TABLE = !VECTOR && HasKTable<Problem>::value;
    static constexpr bool ROWS = VECTOR || K_TABLE;
    using Rows = RowsOf<Problem, K_TABLE>;
    typename Rows::A arow[ROWS ? MapA::CHUNKS : 1];
    typename Rows::B brow[ROWS ? MapB::CHUNKS : 1];
    KPos ka, kb;  // kb unused when B_USES_A
    KPos step;    // the decomposition of BK

    __device__ __forceinline__ const KPos& b_pos() const { return B_USES_A ? ka : kb; }

    // Row cursors and reduction cursors at the reduction's first tile.
    __device__ __forceinline__ void init_rows(const Problem& p, int m0, int n0) {
        if constexpr (ROWS) {
            if constexpr (CURSORS) step = p.k_pos(BK);
#pragma unroll
            for (int e = 0; e < MapA::CHUNKS; ++e) {
                int row, k;
                MapA::at(e, row, k);
                arow[e] = Rows::a(p, m0 + row < p.m_size ? m0 + row : 0);
                if (CURSORS && e == 0) ka = p.k_pos(p.k_begin + k);
            }
#pragma unroll
            for (int e = 0; e < MapB::CHUNKS; ++e) {
                int row, k;
                MapB::at(e, row, k);
                brow[e] = Rows::b(p, n0 + row < p.n_size ? n0 + row : 0);
                if (CURSORS && !B_USES_A && e == 0) kb = p.k_pos(p.k_begin + k);
            }
        }
    }
    // The reduction cursors of the next tile.
    __device__ __forceinline__ void advance(const Problem& p) {
        p.k_advance(ka, step);
        if constexpr (!B_USES_A) p.k_advance(kb, step);
    }
    // The source of vector chunk e of the tile at k0 (null: a zero chunk); with CURSORS, the
    // cursors are at that tile.  A chunk is in range or out of range as a whole (along the
    // contiguous dimension the extents are multiples of C).
    __device__ __forceinline__ Src<T> a_chunk(const Problem& p, int e, int k0) const {
        int row, k;
        MapA::at(e, row, k);
        Src<T> s = p.a_src(arow[e], CURSORS ? ka : p.k_pos(k0 + k), k0 + k);
        s.ok = s.ok && k0 + k < p.k_end;
        return s;
    }
    __device__ __forceinline__ Src<T> b_chunk(const Problem& p, int e, int k0) const {
        int row, k;
        MapB::at(e, row, k);
        Src<T> s = p.b_src(brow[e], CURSORS ? b_pos() : p.k_pos(k0 + k), k0 + k);
        s.ok = s.ok && k0 + k < p.k_end;
        return s;
    }
};

// A chunk of C floats rounded to TF32 in place (ptx::round_tf32), for the TF32 tiles: each
// element is rounded once, when it reaches shared memory, not in every warp that reads it.
template <int C> __device__ __forceinline__ void round_chunk_tf32(float* chunk) {
#pragma unroll
    for (int v = 0; v < C; ++v) chunk[v] = __uint_as_float(ptx::round_tf32(__float_as_uint(chunk[v])));
}

// Register-staged loads (the next tile's global loads are in flight while the current tile is
// multiplied), then stored to the other of two shared-memory buffers: every kind on every
// architecture where the multistage loader below does not run.  LayoutA / LayoutB: Padded (2-D
// tiles S[k][row]) or a swizzled layout (flat tiles).  ROUND_TF32 (float on mma_cta): chunks are
// rounded to TF32 on their way to shared memory.
template <typename T, int BM, int BN, int BK, int THREADS, bool VECTOR, class Problem, class LayoutA = Padded,
          class LayoutB = Padded, bool ROUND_TF32 = false, bool SHARED_FILL = false>
struct Loader : ChunkRows<T, BM, BN, BK, THREADS, VECTOR, Problem> {
    using Base = ChunkRows<T, BM, BN, BK, THREADS, VECTOR, Problem>;
    using typename Base::MapA;
    using typename Base::MapB;
    static constexpr int C = Base::C;
    alignas(16) T ra[MapA::CHUNKS * C];
    alignas(16) T rb[MapB::CHUNKS * C];

    // The scalar path's row table of A (HasRowTable): its CTA's BM rows' entries, filled once
    // before the main loop, as three arrays so that a chunk's C consecutive rows are whole
    // 16-byte reads.  A thread's rows are fixed for the whole reduction, so the table replaces
    // a decomposition of every element's row in every tile (wgrad's A: the tap, two divisions).
    static constexpr bool ROW_TABLE = !VECTOR && HasRowTable<Problem>::value;
    struct RowTable {
        unsigned h[BM], w[BM], offset[BM];
    };
    __device__ __forceinline__ static RowTable& row_table() {
        __shared__ __align__(16) RowTable table;
        return table;
    }
    __device__ __forceinline__ static void fill_row_table(const Problem& p, int m0) {
        static_assert(!Problem::A_K_CONTIG, "the table holds what a row contributes to A's elements");
        RowTable& table = row_table();
        for (int i = static_cast<int>(threadIdx.x); i < BM; i += THREADS) {
            const auto e = m0 + i < p.m_size ? p.a_row_entry(m0 + i) : Problem::a_row_absent();
            table.h[i] = e.h;
            table.w[i] = e.w;
            table.offset[i] = e.offset;
        }
    }
    // The scalar path's k table (HasKTable): the entries of the BK reduction indices of a
    // tile, for two tiles (slot = tile index % 2).  Each tile's entries are written one
    // iteration of the main loop ahead, by the first BK threads (one warp; the others skip),
    // so an element costs its share of one 16-byte shared-memory read instead of k's
    // decomposition (two divisions) in every thread.
    using KTableEntry = typename Select<Base::K_TABLE, typename KEntryOf<Problem, Base::K_TABLE>::type, int>::type;
    __device__ __forceinline__ static KTableEntry (&k_table())[2][BK] {
        __shared__ __align__(16) KTableEntry table[2][BK];
        return table;
    }
    // The entries of the tile whose first reduction index is ``tile_k`` into slot ``slot``:
    // thread t < BK writes index tile_k + t from its cursor (k_begin + t at the start,
    // advanced one tile per fill: no division per tile).  SHARED_FILL (the half types'
    // tensor-core kernels): the cursors, their step and the problem the fill reads live in
    // shared memory, so that no thread holds them in registers across the main loop; the
    // kernel then fits the 128 registers of 2 CTAs per SM (in registers it needs 181 on sm_90,
    // at 128 ptxas spilled).  Otherwise they are registers: the float SIMT kernel is
    // FMA-bound, and the shared reads would cost it 29 of its 1,278 instructions per k-tile.
    using KPos = typename Problem::KPos;
    struct SharedFill {
        KPos pos[BK], step;
        Problem problem;
    };
    __device__ __forceinline__ static SharedFill& shared_fill() {
        static_assert(__is_trivially_constructible(SharedFill), "the device never runs a __shared__ variable's constructor");
        __shared__ SharedFill fill;
        return fill;
    }
    KPos fill_pos, fill_step;  // without SHARED_FILL (unused with it, and dropped)
    int fill_k;                // fill_pos's index (likewise; a counter, not tile_k + t, which costs the
                               // float SIMT kernel 3 instructions per k-tile and its 80% FFMA)
    __device__ __forceinline__ KPos& cursor() {  // thread threadIdx.x < BK's
        if constexpr (SHARED_FILL) return shared_fill().pos[threadIdx.x];
        else return fill_pos;
    }
    __device__ __forceinline__ const KPos& step() const {
        if constexpr (SHARED_FILL) return shared_fill().step;
        else return fill_step;
    }
    __device__ __forceinline__ static const Problem& fill_problem(const Problem& p) {
        if constexpr (SHARED_FILL) return shared_fill().problem;
        else return p;
    }
    // Slots 0 and 1 and the fill state, before the barrier that precedes the main loop.
    __device__ __forceinline__ void init_k_table(const Problem& p) {
        static_assert(BK <= THREADS, "one thread per entry");
        const int t = static_cast<int>(threadIdx.x);
        if (t < BK) {
            const KPos step = p.k_pos(BK);
            KPos pos = p.k_pos(p.k_begin + t);
            k_table()[0][t] = p.k_entry(pos, p.k_begin + t < p.k_end);
            p.k_advance(pos, step);
            k_table()[1][t] = p.k_entry(pos, p.k_begin + BK + t < p.k_end);
            p.k_advance(pos, step);
            if constexpr (SHARED_FILL) {
                shared_fill().pos[t] = pos;
                if (t == 0) shared_fill().step = step, shared_fill().problem = p;
            } else {
                fill_pos = pos, fill_step = step, fill_k = p.k_begin + 2 * BK + t;
            }
        }
    }
    __device__ __forceinline__ void fill_k_table(const Problem& problem, int slot, int tile_k) {
        const int t = static_cast<int>(threadIdx.x);
        if (t < BK) {
            const Problem& p = fill_problem(problem);
            KPos pos = cursor();
            k_table()[slot][t] = p.k_entry(pos, (SHARED_FILL ? tile_k + t : fill_k) < p.k_end);
            p.k_advance(pos, step());
            cursor() = pos;
            if constexpr (!SHARED_FILL) fill_k += BK;
        }
    }
    // Every chunk of the tile at k0, from slot ``slot`` of the k table: all of a thread's
    // chunks of both operands share their k (both maps run along k), so each of the C entries
    // is read once and serves them all.
    __device__ __forceinline__ void fetch_k_table(const Problem& p, int k0, int slot) {
        static_assert(Problem::A_K_CONTIG && Problem::B_K_CONTIG && Base::B_USES_A, "chunks share their k");
        int row, k;
        MapA::at(0, row, k);
#pragma unroll
        for (int v = 0; v < C; ++v) {
            const KTableEntry entry = k_table()[slot][k + v];
            const bool in_reduction = k0 + k + v < p.k_end;
#pragma unroll
            for (int e = 0; e < MapA::CHUNKS; ++e) {
                const Src<T> src = p.a_entry_src(this->arow[e], entry);  // not ok past k_end
                ra[e * C + v] = from_acc<T, float>(0.0f);
                if (src.ok) ra[e * C + v] = load_readonly(src.ptr);
            }
#pragma unroll
            for (int e = 0; e < MapB::CHUNKS; ++e) {
                const Src<T> src = p.b_entry_src(this->brow[e], entry);
                rb[e * C + v] = from_acc<T, float>(0.0f);
                if (in_reduction && src.ok) rb[e * C + v] = load_readonly(src.ptr);
            }
        }
    }

    // A's chunk at tile row ``row`` (a multiple of C) and reduction index k, from the table.
    __device__ __forceinline__ static void fetch_table(const Problem& p, int row, int k, T* dst) {
        const RowTable& table = row_table();
        int h[C], w[C], offset[C];
        load_ints<C>(reinterpret_cast<const int*>(&table.h[row]), h);
        load_ints<C>(reinterpret_cast<const int*>(&table.w[row]), w);
        load_ints<C>(reinterpret_cast<const int*>(&table.offset[row]), offset);
        const auto pos = p.a_pos_entry(p.k_pos(k), k < p.k_end);
#pragma unroll
        for (int v = 0; v < C; ++v) {
            const Src<T> src = p.a_entry_src(pos, {static_cast<unsigned>(h[v]), static_cast<unsigned>(w[v]),
                                                   static_cast<unsigned>(offset[v])});
            dst[v] = from_acc<T, float>(0.0f);
            if (src.ok) dst[v] = load_readonly(src.ptr);
        }
    }

    // One chunk of A (IS_A) or B starting at GEMM row ``row`` (m or n, below ``rows``) and
    // reduction index k (below k_end), element by element (the scalar path).
    template <bool IS_A, bool K_CONTIG>
    __device__ __forceinline__ static void fetch_scalar(const Problem& p, int row, int k, int rows, T* dst) {
        row = opaque_value(row);
#pragma unroll
        for (int v = 0; v < C; ++v) {
            const int r = K_CONTIG ? row : row + v, kk = K_CONTIG ? k + v : k;
            dst[v] = from_acc<T, float>(0.0f);
            if (r < rows && kk < p.k_end) {
                const Src<T> src =
                    IS_A ? p.a_src(p.a_row(r), p.k_pos(kk), kk) : p.b_src(p.b_row(r), p.k_pos(kk), kk);
                if (src.ok) dst[v] = *src.ptr;
            }
        }
    }

    // A chunk as one 16-byte value, zero (all-zero bits: +0 in every element type) where there
    // is no source, stored once.  With a store per branch (a 16-byte one, or C element zeros),
    // NVRTC 12.9 kept the staging arrays in local memory for compute_100 and compute_120
    // (128-byte frames in the forward and input-gradient SIMT kernels, 192 in the filter
    // gradient's); one store of one value keeps them in registers there, as 13.x always did.
    __device__ __forceinline__ static void fetch_vector(const Src<T>& src, T* dst) {
        static_assert(C * sizeof(T) == sizeof(uint4), "a chunk is one 16-byte load");
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (src.ok) v = *reinterpret_cast<const uint4*>(src.ptr);
        *reinterpret_cast<uint4*>(dst) = v;
    }

    // The chunks of the tile at k0 (the vector path: at the reduction cursors; the k table's:
    // from slot ``slot``).
    __device__ __forceinline__ void load(const Problem& p, int m0, int n0, int k0, int slot = 0) {
        if constexpr (Base::K_TABLE) {
            fetch_k_table(p, k0, slot);
        } else {
#pragma unroll
            for (int e = 0; e < MapA::CHUNKS; ++e) {
                int row, k;
                MapA::at(e, row, k);
                // Rows past the GEMM load zeros here; the results do not need them, but with the
                // check ptxas keeps the f32 wgrad and f64 dgrad instantiations within the 128
                // registers of 2 CTAs per SM (without it, 4-8 bytes spill on sm_80 / sm_90).
                if constexpr (VECTOR) {
                    Src<T> s = this->a_chunk(p, e, k0);
                    s.ok = s.ok && m0 + row < p.m_size;
                    fetch_vector(s, &ra[e * C]);
                }
                else if constexpr (ROW_TABLE) fetch_table(p, row, k0 + k, &ra[e * C]);
                else fetch_scalar<true, Problem::A_K_CONTIG>(p, m0 + row, k0 + k, p.m_size, &ra[e * C]);
            }
#pragma unroll
            for (int e = 0; e < MapB::CHUNKS; ++e) {
                int row, k;
                MapB::at(e, row, k);
                if constexpr (VECTOR) {
                    Src<T> s = this->b_chunk(p, e, k0);
                    s.ok = s.ok && n0 + row < p.n_size;
                    fetch_vector(s, &rb[e * C]);
                }
                else fetch_scalar<false, Problem::B_K_CONTIG>(p, n0 + row, k0 + k, p.n_size, &rb[e * C]);
            }
        }
    }

    template <bool K_CONTIG, class Layout, class Tile>
    __device__ __forceinline__ static void put(Tile& S, int row, int k, const T* chunk) {
        if constexpr (Layout::SWIZZLED) {
            static_assert(Layout::K_CONTIG == K_CONTIG, "a swizzled tile stores whole chunks");
            ptx::st_shared_16(&S[Layout::offset(row, k)], chunk);
        } else {
#pragma unroll
            for (int v = 0; v < C; ++v) {
                if (K_CONTIG) S[k + v][row] = chunk[v];
                else S[k][row + v] = chunk[v];
            }
        }
    }

    // The double-buffered main loop over the reduction: while the CTA multiplies tile i from
    // buffer i % 2 (``multiply(i % 2)``), the next tile's global loads are in flight and then land
    // in the other buffer, which the barrier at the end of iteration i - 1 freed.  One barrier
    // per tile; the last one also frees the buffers for the epilogue.
    // As, Bs: two tiles each.
    template <class TileA, class TileB, class Multiply>
    __device__ __forceinline__ void run(const Problem& p, int m0, int n0, TileA* As, TileB* Bs,
                                        Multiply&& multiply) {
        this->init_rows(p, m0, n0);
        if constexpr (ROW_TABLE) {
            fill_row_table(p, m0);
            __syncthreads();
        }
        if constexpr (Base::K_TABLE) {
            // Tile i's entries are in slot i % 2: tiles 0 and 1 now, tile i + 2 in iteration i
            // (into the slot that tile i's load, in iteration i - 1, has finished reading).
            init_k_table(p);
            __syncthreads();
        }
        if (p.k_begin < p.k_end) {
            load(p, m0, n0, p.k_begin, 0);
            store(As[0], Bs[0]);
        }
        __syncthreads();
        int buf = 0;
        for (int k0 = p.k_begin; k0 < p.k_end; k0 += BK, buf ^= 1) {
            const bool more = k0 + BK < p.k_end;
            if (more) load(p, m0, n0, k0 + BK, buf ^ 1);
            if constexpr (Base::K_TABLE) fill_k_table(p, buf, k0 + 2 * BK);  // tile i + 2
            multiply(buf);
            if (more) store(As[buf ^ 1], Bs[buf ^ 1]);
            __syncthreads();  // tile i + 1 is stored, and every thread is done reading tile i
        }
    }

    template <class TileA, class TileB>
    __device__ __forceinline__ void store(TileA& As, TileB& Bs) {
        if constexpr (ROUND_TF32) {
            static_assert(sizeof(T) == 4, "TF32 rounds floats");
#pragma unroll
            for (int e = 0; e < MapA::CHUNKS; ++e) round_chunk_tf32<C>(&ra[e * C]);
#pragma unroll
            for (int e = 0; e < MapB::CHUNKS; ++e) round_chunk_tf32<C>(&rb[e * C]);
        }
#pragma unroll
        for (int e = 0; e < MapA::CHUNKS; ++e) {
            int row, k;
            MapA::at(e, row, k);
            put<Problem::A_K_CONTIG, LayoutA>(As, row, k, &ra[e * C]);
        }
#pragma unroll
        for (int e = 0; e < MapB::CHUNKS; ++e) {
            int row, k;
            MapB::at(e, row, k);
            put<Problem::B_K_CONTIG, LayoutB>(Bs, row, k, &rb[e * C]);
        }
    }
};

#if GRADOPS_HAS_MMA_SM80
// The multistage main loop (sm_80+, 16-byte chunks, swizzled tiles): each chunk goes from
// global to shared memory by cp.async (zero-filled where the problem has no source), with no
// register staging, STAGES tiles in flight.  The k-tiles run t = 0, 1, ...; tile t lives in
// stage t % STAGES and its copies form the thread's commit group t (a group, possibly empty,
// is committed for every t, so the group count is the tile count).  Iteration t:
//   wait_group<STAGES - 2>   this thread's copies of tile t have landed (groups <= t), while
//                            the next STAGES - 2 tiles' copies may still be in flight;
//                            (ROUND_TF32: the thread rounds its own chunks of tile t to TF32
//                            in place, as they have landed and nobody reads them yet)
//   __syncthreads            every thread's copies of tile t have, and every thread has
//                            finished reading tile t - 1 (iteration t - 1's multiply);
//   issue tile t + STAGES - 1 into stage (t - 1) % STAGES, which that barrier freed; commit;
//   multiply(t % STAGES).
// One barrier per k-tile.  After the loop every group is waited for and a barrier frees the
// stages for the epilogue.
template <typename T, int BM, int BN, int BK, int THREADS, int STAGES, class Problem, class LayoutA, class LayoutB,
          bool ROUND_TF32 = false>
struct AsyncLoader : ChunkRows<T, BM, BN, BK, THREADS, true, Problem, true> {
    using Base = ChunkRows<T, BM, BN, BK, THREADS, true, Problem, true>;
    using typename Base::MapA;
    using typename Base::MapB;
    static_assert(STAGES >= 2, "at least one tile in flight while one is multiplied");
    static_assert(LayoutA::SWIZZLED && LayoutB::SWIZZLED && LayoutA::K_CONTIG == Problem::A_K_CONTIG &&
                      LayoutB::K_CONTIG == Problem::B_K_CONTIG,
                  "cp.async copies whole 16-byte chunks into swizzled tiles");

    // Every chunk of the tile at the reduction cursors into tiles sa, sb (zero chunks read no
    // byte of the base).
    __device__ __forceinline__ void issue(const Problem& p, int k0, T* sa, T* sb) const {
#pragma unroll
        for (int e = 0; e < MapA::CHUNKS; ++e) {
            int row, k;
            MapA::at(e, row, k);
            const Src<T> src = this->a_chunk(p, e, k0);
            ptx::cp_async_16(sa + LayoutA::offset(row, k), src.ok ? src.ptr : p.a_base(), src.ok);
        }
#pragma unroll
        for (int e = 0; e < MapB::CHUNKS; ++e) {
            int row, k;
            MapB::at(e, row, k);
            const Src<T> src = this->b_chunk(p, e, k0);
            ptx::cp_async_16(sb + LayoutB::offset(row, k), src.ok ? src.ptr : p.b_base(), src.ok);
        }
    }

    // This thread's chunks (Map) of tile s (Layout) rounded to TF32 in place: 16-byte loads and
    // stores at the addresses its cp.async wrote.
    template <class Map, class Layout> __device__ __forceinline__ static void round_own_chunks(T* s) {
        static_assert(sizeof(T) == 4, "TF32 rounds floats");
        constexpr int C = Base::C;
#pragma unroll
        for (int e = 0; e < Map::CHUNKS; ++e) {
            int row, k;
            Map::at(e, row, k);
            alignas(16) float v[C];
            *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(s + Layout::offset(row, k));
            round_chunk_tf32<C>(v);
            ptx::st_shared_16(s + Layout::offset(row, k), v);
        }
    }

    // As, Bs: STAGES tiles each (flat arrays of LayoutA::ELEMENTS, LayoutB::ELEMENTS).
    template <class TileA, class TileB, class Multiply>
    __device__ __forceinline__ void run(const Problem& p, int m0, int n0, TileA* As, TileB* Bs,
                                        Multiply&& multiply) {
        this->init_rows(p, m0, n0);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (p.k_begin + s * BK < p.k_end) {
                issue(p, p.k_begin + s * BK, As[s], Bs[s]);
                this->advance(p);
            }
            ptx::cp_async_commit_group();
        }
        // Tile t is read from stage t % STAGES; tile t + STAGES - 1 goes to the stage before it.
        // An iteration runs STAGES tiles, so after unrolling each tile's stages are constants:
        // every ldmatrix and cp.async address is a register plus an immediate, with no per-tile
        // stage arithmetic (sm_90 float16: 12 LEA per k-tile for the filter gradient's
        // ldmatrix.trans addresses, and the stage rotation).
        // k0: tile t's reduction index (below 2^31 - 129 + (STAGES - 1) * BK: the launchers
        // keep the extents below INT32_LIMIT)
        for (int k0 = p.k_begin; k0 < p.k_end;) {
#pragma unroll
            for (int read = 0; read < STAGES; ++read) {
                if (k0 >= p.k_end) break;
                ptx::cp_async_wait_group<STAGES - 2>();
                if constexpr (ROUND_TF32) {
                    round_own_chunks<MapA, LayoutA>(As[read]);
                    round_own_chunks<MapB, LayoutB>(Bs[read]);
                }
                __syncthreads();  // tile t is in shared memory; tile t - 1's stage (write) is free
                const int k_next = k0 + (STAGES - 1) * BK;
                if (k_next < p.k_end) {
                    const int write = read == 0 ? STAGES - 1 : read - 1;
                    issue(p, k_next, As[write], Bs[write]);
                    this->advance(p);
                }
                ptx::cp_async_commit_group();
                multiply(read);
                k0 += BK;
            }
        }
        ptx::cp_async_wait_group<0>();
        __syncthreads();  // every thread is done reading its last tile: the epilogue may reuse it
    }
};
#endif  // GRADOPS_HAS_MMA_SM80

// The tensor-core epilogue.  Where each of the CTA's BM rows of C starts in the output
// (Problem::out_row, -1 past m_size), located once per CTA: a lane stores elements of 32 rows,
// and locating a row can cost divisions (dgrad: the input position of m).
template <int BM, int THREADS, class Problem>
__device__ __forceinline__ void locate_rows(const Problem& p, int m0, index_t* rows) {
    // Unrolled over the compile-time trip count (one pass when BM <= THREADS), not a loop the
    // compiler unrolls 4 deep on an unknown threadIdx.x.
#pragma unroll
    for (int r0 = 0; r0 < BM; r0 += THREADS) {
        const int r = r0 + static_cast<int>(threadIdx.x);
        if (r < BM) rows[r] = m0 + r < p.m_size ? p.out_row(m0 + r) : index_t(-1);
    }
    __syncthreads();
}

// Eight floats as eight T in one 16-byte store (dst 16-byte aligned; T a half type).
template <typename T> __device__ __forceinline__ void store_chunk8(T* dst, const float (&v)[8]) {
    static_assert(sizeof(T) == 2, "eight half-type elements make 16 bytes");
    alignas(16) T h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) h[e] = from_acc<T, float>(v[e]);
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(h);
}

// The same tile with 16-byte chunks along n (VECTOR): lane l stores row l / 2, columns
// 8 (l % 2) .. + 7 with two 16-byte shared-memory reads and one (or, for float partial sums,
// two) 16-byte global stores, where the scalar version makes 8 two-byte stores.
template <class Problem>
__device__ __forceinline__ void store_staged_chunks(const Problem& p, const float* st, const index_t* rows,
                                                    int n_base, int lane) {
    constexpr int TILE = 16, CHUNK = 8;
    const int r = lane / (TILE / CHUNK), c = lane % (TILE / CHUNK) * CHUNK;
    const index_t row = rows[r];
    if (row < 0 || n_base + c >= p.n_size) return;  // n_size is a multiple of 8: whole chunks
    float v[CHUNK];
    *reinterpret_cast<float4*>(v) = *reinterpret_cast<const float4*>(st + r * TILE + c);
    *reinterpret_cast<float4*>(v + 4) = *reinterpret_cast<const float4*>(st + r * TILE + c + 4);
    p.store_chunk(row, n_base + c, v);
}

// A warp's 16x16 tile of C, staged row-major in ``st`` (each lane wrote its own elements, then
// __syncwarp), goes to the problem with lanes taking consecutive n (contiguous channels), 8
// elements per lane; ``rows``: the tile's first row's entry of the table locate_rows made.
template <class Problem>
__device__ __forceinline__ void store_staged_tile(const Problem& p, const float* st, const index_t* rows,
                                                  int n_base, int lane) {
    constexpr int TILE = 16, LANES = 32;
#pragma unroll
    for (int t = 0; t < TILE * TILE / LANES; ++t) {
        const int e = lane + LANES * t;
        const index_t row = rows[e / TILE];
        const int n = n_base + e % TILE;
        if (row >= 0 && n < p.n_size) p.store_at(row, n, st[e]);
    }
}

#if GRADOPS_HAS_MMA_SM80
// Half types on sm_80+: ldmatrix + mma.sync.m16n8k16 (tensor_core_ptx.cuh), and float as TF32:
// mma.sync.m16n8k8 on operands rounded with cvt.rna.tf32.  Against WMMA this fixes the fragment
// layouts (the ISA's, so that the epilogue writes each lane's own
// accumulators without a store_matrix_sync round trip through a fragment of unspecified layout)
// and loads each 8x8 sub-matrix once per warp.
//
// The fragments pair elements along k (A row-major: a lane holds A[m][k], A[m][k + 1]; B
// col-major: B[k][n], B[k + 1][n]).  An operand that is contiguous along k in global memory
// (K_CONTIG: dgrad's both, the forward's A) keeps that orientation in shared memory, [row][k]
// (SwizzledRows), and ldmatrix reads it without .trans; the others are [k][row] (SwizzledCols,
// rows along m or n) and ldmatrix transposes.  Either way a chunk is one 16-byte store or
// cp.async, and every store phase and ldmatrix phase takes one wavefront (the host model counts
// them, tests/test_tensor_core_ptx.py).
//
// TF32 (T = float): m16n8k8's fragments hold the same bytes of a [row][k] tile as m16n8k16's
// (a 4-byte element where a pair of halves was: A[m][k] at byte 4 t of row g, k + 4 where k + 8
// was), so a [row][k] tile is read by the same ldmatrix (without .trans) at the same byte
// offsets.  ldmatrix.trans moves 16-bit elements and cannot transpose floats: a [k][row] tile is
// read one element per lane (ld_shared_32: A's 4 and B's 2 registers per tile and k-step),
// conflict-free because its swizzle spreads the 4 k a warp reads (t = lane % 4) over pairs of
// chunk positions (SwizzledCols with 4 k per phase: k % 4 picks the pair).  The operands are
// rounded to TF32 (cvt.rna.tf32.f32: round to nearest, where the tensor cores would truncate)
// once per element, by the thread that brought its chunk into shared memory (the loaders'
// ROUND_TF32), not once per fragment register in every warp that reads it.  The 128 x 128 tile
// only.
//
// Main loop: with 16-byte chunks (VECTOR), the multistage cp.async pipeline (AsyncLoader,
// STAGES = 3); otherwise the register-staged double buffer (Loader), whose scalar loads
// cp.async cannot take.  The epilogue's staging and row table reuse the tiles' shared memory.
template <typename T, bool VECTOR, int TILE_M, int TILE_N, class Problem>
__device__ __forceinline__ void mma_cta(const Problem& p) {
    using C = MmaConfig<T, TILE_M, TILE_N>;
    constexpr bool TF32 = sizeof(T) == 4;
    static_assert(sizeof(T) == 2 || (TF32 && TILE_M == 128 && TILE_N == 128), "half types, or float as TF32 (128 x 128)");
    static_assert(TILE_M != 128 || TILE_N != 128 || C::THREADS == Config<T, TF32 ? WMMA_TF32 : WMMA_HALF>::THREADS,
                  "the default tile is Config<T, Kind>'s (the launchers' TILES)");
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK;
    static_assert(BK == Config<T, TF32 ? WMMA_TF32 : WMMA_HALF>::BK, "the launchers' BK (TILES)");
    // mma.sync.m16n8k16 (halves) or m16n8k8 (TF32): a k-step is 32 bytes of a row, KH elements
    // per 16-byte half of it (ldmatrix's second matrix column).
    constexpr int KH = 16 / static_cast<int>(sizeof(T)), MMA_K = 2 * KH;
    constexpr int MMA_M = 16, MMA_N = 8;
    constexpr int WM = C::WARP_M, WN = C::WARP_N;                 // warp patch (64 x 32)
    constexpr int FM = WM / MMA_M, FN = WN / MMA_N;              // 4 x 4 accumulator tiles per warp
    constexpr int WARPS = C::WARPS_M * C::WARPS_N;
    static_assert(BK % MMA_K == 0 && FN % 2 == 0, "whole k-steps; B loaded two n8 tiles per ldmatrix.x4");
    constexpr bool A_ROWS = Problem::A_K_CONTIG, B_ROWS = Problem::B_K_CONTIG;  // [row][k] tiles
    // [k][row] tiles' ldmatrix.trans addresses derived per block by an XOR (see a_trans): the
    // half types' scalar-load kernels (the 128 x 128 tile, one k per swizzle phase).
    constexpr bool TRANS_XOR = !VECTOR && !TF32;
    static_assert(!TRANS_XOR || (ChunkSize<T>::value == 8 && WM % 64 == 0 && FM <= 4 && WN % 32 == 0 && FN <= 4 &&
                                 BM % 64 == 0 && BN % 64 == 0),
                  "a block's chunks differ from block 0's in the 3 bits the swizzle XORs, without carry");
    // [k][row] tiles' k per swizzle phase: the store phases' (TileMap), or for TF32's one-element
    // reads 4 (the k of t = lane % 4; its tile's store phases are one k each, which any swizzle
    // serves).
    constexpr int KS_A = TileMap<BM, BK, C::THREADS, A_ROWS, ChunkSize<T>::value>::PHASE_KS;
    constexpr int KS_B = TileMap<BN, BK, C::THREADS, B_ROWS, ChunkSize<T>::value>::PHASE_KS;
    static_assert(!TF32 || (KS_A == 1 && KS_B == 1), "TF32's [k][row] store phases are one k");
    using LayoutA = Swizzled<T, BM, BK, A_ROWS, TF32 ? 4 : KS_A>;
    using LayoutB = Swizzled<T, BN, BK, B_ROWS, TF32 ? 4 : KS_B>;
    using TileA = T[LayoutA::ELEMENTS];
    using TileB = T[LayoutB::ELEMENTS];
    static_assert((16 / SwizzledRows<T, BM, BK>::LINE_ROWS) % SwizzledRows<T, BM, BK>::LINE_CHUNKS == 0,
                  "RowBlocks: a [row][k] tile's 16-row blocks at constant offsets");
    // Three stages of 16 KB fill the 48 KiB of static shared memory; 16 warps per SM need the
    // registers of 2 CTAs anyway (MinBlocks), and 4 CTAs' stages fit an H100 SM's 228 KB.
    constexpr int STAGES = VECTOR ? 3 : 2;
    constexpr int TILES_BYTES = STAGES * static_cast<int>(sizeof(TileA) + sizeof(TileB));
    // The epilogue: a 16x16 float block per warp, then the row table.
    constexpr int STAGE_FLOATS = 16 * 16;
    constexpr int EPILOGUE_BYTES = WARPS * STAGE_FLOATS * static_cast<int>(sizeof(float)) +
                                   BM * static_cast<int>(sizeof(index_t));
    constexpr int SHARED_BYTES = TILES_BYTES > EPILOGUE_BYTES ? TILES_BYTES : EPILOGUE_BYTES;
    static_assert(SHARED_BYTES <= 48 * 1024, "static shared memory is 48 KiB");
    __shared__ __align__(128) unsigned char shared[SHARED_BYTES];
    TileA* As = reinterpret_cast<TileA*>(shared);
    TileB* Bs = reinterpret_cast<TileB*>(shared + STAGES * sizeof(TileA));

    const int m0 = static_cast<int>(blockIdx.x) * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int wm = (warp / C::WARPS_N) * WM, wn = (warp % C::WARPS_N) * WN;
    // ldmatrix.x4: lane l supplies the address of row l % 8 of 8x8 matrix l / 8.
    const int matrix = lane / 8, row = lane % 8;
    // mma fragments: lane l is thread t = l % 4 of group g = l / 4 (the ISA's groupID and
    // threadID_in_group).
    const int g = lane / 4, t = lane % 4;

    float acc[FM][FN][4];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    using MainLoop =
        typename Select<VECTOR, AsyncLoader<T, BM, BN, BK, C::THREADS, STAGES, Problem, LayoutA, LayoutB, TF32>,
                        Loader<T, BM, BN, BK, C::THREADS, false, Problem, LayoutA, LayoutB, TF32, !TF32>>::type;
    MainLoop loader;
    loader.run(p, m0, n0, As, Bs, [&](int buf) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += MMA_K) {
            // A fragment registers a[0..3] are the 8x8 blocks (m + 0, k + 0), (m + 8, k + 0),
            // (m + 0, k + 8), (m + 8, k + 8) of the 16x16 A tile: matrix q starts at m + 8 (q % 2),
            // k + 8 (q / 2), its rows running along m ([row][k] tile) or k ([k][row]).
            unsigned a[FM][4];
            const int a_base = LayoutA::offset(wm + 8 * (matrix % 2) + row, kk + KH * (matrix / 2));  // [row][k]
            // [k][row] tiles with scalar loads (TRANS_XOR): block i's address from block 0's.
            // Its rows wm + 16 i + 8 (matrix % 2) are chunk wm / C + 2 i + matrix % 2 of the k
            // row (C = 8, wm a multiple of 64), whose low 3 bits are the ones the swizzle XORs;
            // 2 i + matrix % 2 has no carry, so the swizzled chunk is block 0's XOR 2 i, i.e. the
            // offset block 0's XOR 16 i.  The base is opaque, so that the XORs stay in the loop
            // instead of 6 more registers across it: these kernels then fit 128 (2 CTAs per SM).
            const int a_trans =
                TRANS_XOR ? opaque_value(LayoutA::offset(wm + 8 * (matrix % 2), kk + 8 * (matrix / 2) + row)) : 0;
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                const int m = wm + MMA_M * i + 8 * (matrix % 2), k = kk + 8 * (matrix / 2);
                if constexpr (A_ROWS) {
                    ptx::ldmatrix<4, false>(a[i], &As[buf][a_base + RowBlocks<LayoutA>::rows(i)]);
                } else if constexpr (TF32) {  // a[r]: row g + 8 (r % 2), column t + 4 (r / 2)
#pragma unroll
                    for (int r = 0; r < 4; ++r)
                        a[i][r] = ptx::ld_shared_32(
                            &As[buf][LayoutA::offset(wm + MMA_M * i + g + 8 * (r % 2), kk + t + 4 * (r / 2))]);
                } else if constexpr (TRANS_XOR) {
                    ptx::ldmatrix<4, true>(a[i], &As[buf][a_trans ^ (MMA_M * i)]);
                } else {
                    ptx::ldmatrix<4, true>(a[i], &As[buf][LayoutA::offset(m, k + row)]);
                }
            }
            // B fragment registers b[0], b[1] are k + 0..7 and k + 8..15 of one n8 tile; an x4
            // loads two n8 tiles: matrix q starts at n + 8 (q / 2), k + 8 (q % 2).
            unsigned b[FN][2];
            const int b_base = LayoutB::offset(wn + 8 * (matrix / 2) + row, kk + KH * (matrix % 2));  // [row][k]
            // Likewise: n8 tile pair j / 2 is chunk wn / C + j + matrix / 2 (j even, wn a multiple of 32).
            const int b_trans =
                TRANS_XOR ? opaque_value(LayoutB::offset(wn + 8 * (matrix / 2), kk + 8 * (matrix % 2) + row)) : 0;
#pragma unroll
            for (int j = 0; j < FN; j += 2) {
                unsigned q[4];
                const int n = wn + MMA_N * j + 8 * (matrix / 2), k = kk + 8 * (matrix % 2);
                if constexpr (B_ROWS) {
                    ptx::ldmatrix<4, false>(q, &Bs[buf][b_base + RowBlocks<LayoutB>::rows(j / 2)]);
                } else if constexpr (TF32) {  // b[r] of n8 tile h: row (k) t + 4 r, column (n) g
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int r = 0; r < 2; ++r)
                            q[2 * h + r] = ptx::ld_shared_32(
                                &Bs[buf][LayoutB::offset(wn + MMA_N * (j + h) + g, kk + t + 4 * r)]);
                } else if constexpr (TRANS_XOR) {
                    ptx::ldmatrix<4, true>(q, &Bs[buf][b_trans ^ (MMA_N * j)]);
                } else {
                    ptx::ldmatrix<4, true>(q, &Bs[buf][LayoutB::offset(n, k + row)]);
                }
                b[j][0] = q[0];
                b[j][1] = q[1];
                b[j + 1][0] = q[2];
                b[j + 1][1] = q[3];
            }
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) {
                    if constexpr (TF32) ptx::mma_m16n8k8_tf32(acc[i][j], a[i], b[j], acc[i][j]);
                    else ptx::mma_m16n8k16<T>(acc[i][j], a[i], b[j], acc[i][j]);
                }
        }
    });

    // Epilogue: per 16x16 block (one m16 tile, two n8 tiles), each lane stages its own
    // accumulators where the C fragment layout puts them (row g + 8 (r / 2), column
    // 2 t + r % 2 of its n8 tile, g = lane / 4, t = lane % 4), then the warp stores the block.
    // The main loop ended with a barrier after the last tile was read: the tiles' memory is free.
    index_t* rows = reinterpret_cast<index_t*>(shared + WARPS * STAGE_FLOATS * sizeof(float));
    locate_rows<BM, C::THREADS>(p, m0, rows);
    float* st = reinterpret_cast<float*>(shared) + warp * STAGE_FLOATS;
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; j += 2) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int r = 0; r < 4; ++r)
                    st[(g + 8 * (r / 2)) * 16 + MMA_N * h + 2 * t + r % 2] = acc[i][j + h][r];
            __syncwarp();  // the staged block is complete
            // (8-element chunks along n: the half types' 16 bytes; float's n_size need not be a
            // multiple of 8)
            if constexpr (VECTOR && !TF32) store_staged_chunks(p, st, rows + wm + MMA_M * i, n0 + wn + MMA_N * j, lane);
            else store_staged_tile(p, st, rows + wm + MMA_M * i, n0 + wn + MMA_N * j, lane);
            __syncwarp();  // every lane has read the block before it is overwritten
        }
    }
}
#endif  // GRADOPS_HAS_MMA_SM80

#if GRADOPS_HAS_WMMA
// Tensor cores through WMMA: float16 on sm_70 / sm_75, which have no mma.sync for mma_cta (its
// TF32 and bfloat16 kinds exist from sm_80, where mma_cta runs them).
template <typename T, int Kind, bool VECTOR, class Problem>
__device__ __forceinline__ void wmma_cta(const Problem& p) {
    using namespace nvcuda;
    static_assert(Kind == WMMA_HALF && sizeof(T) == 2, "WMMA runs the half types");
    using C = Config<T, Kind>;
    using In = T;  // fragment element type
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK, FK = C::FRAG_K;
    constexpr int WM = BM / C::WARPS_M, WN = BN / C::WARPS_N;  // warp patch
    constexpr int FM = WM / 16, FN = WN / 16;                  // 16x16 fragments per warp
    constexpr int LDA = BM + C::PAD, LDB = BN + C::PAD;

    // Two tile buffers (Loader::run): 2 x (A + B) + the epilogue's staging is 43 KB, under the
    // 48 KB of static shared memory.
    __shared__ __align__(128) T As[2][BK][LDA];
    __shared__ __align__(128) T Bs[2][BK][LDB];
    __shared__ __align__(128) float stage[C::WARPS_M * C::WARPS_N][16 * 16];

    const int m0 = static_cast<int>(blockIdx.x) * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int wm = (warp / C::WARPS_N) * WM, wn = (warp % C::WARPS_N) * WN;

    wmma::fragment<wmma::accumulator, 16, 16, FK, float> acc[FM][FN];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

    Loader<T, BM, BN, BK, C::THREADS, VECTOR, Problem> loader;
    loader.run(p, m0, n0, As, Bs, [&](int buf) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += FK) {
            wmma::fragment<wmma::matrix_a, 16, 16, FK, In, wmma::col_major> fa[FM];
            wmma::fragment<wmma::matrix_b, 16, 16, FK, In, wmma::row_major> fb[FN];
#pragma unroll
            for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(fa[i], &As[buf][kk][wm + 16 * i], LDA);
#pragma unroll
            for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(fb[j], &Bs[buf][kk][wn + 16 * j], LDB);
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
    });

    // Epilogue: each fragment goes through the warp's 16x16 staging buffer so that lanes write
    // consecutive n (contiguous channels) and the problem sees plain (m, n) coordinates.
    __shared__ index_t rows[BM];
    locate_rows<BM, C::THREADS>(p, m0, rows);
    float* st = stage[warp];
#pragma unroll
    for (int i = 0; i < FM; ++i) {
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            wmma::store_matrix_sync(st, acc[i][j], 16, wmma::mem_row_major);
            __syncwarp();
            store_staged_tile(p, st, rows + wm + 16 * i, n0 + wn + 16 * j, lane);
            __syncwarp();
        }
    }
}
#endif  // GRADOPS_HAS_WMMA

// SIMT register-blocked GEMM (float exact, double; half types with float accumulation).
//
// Thread fragments.  Thread (ty, tx) owns TM rows of the tile in TM / W groups of W consecutive
// rows, W = 16 / sizeof(T) elements (at most TM): one 16-byte shared-memory read (LDS.128)
// fetches a group, so a k step costs TM / W + TN / W reads for TM x TN FMAs (float: 4 reads
// for 64 FFMA, where one read per element took 16).  Group g of thread ty starts at row
// g * (BM / groups) + ty * W.  Shared-memory banks: a warp is 2 ty x 16 tx; its A reads are 2
// addresses (broadcast), its B reads 16 x 16 contiguous bytes (two wavefronts, the minimum).
template <typename T> struct SimtFragment {
    static constexpr int BYTES = 16;
    static constexpr int W = BYTES / static_cast<int>(sizeof(T));
};

// W elements of T at ``src`` (16-byte aligned shared memory) widened to accumulators.
template <typename Acc, typename T, int W>
__device__ __forceinline__ void load_fragment(const T* src, Acc* dst) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int w = 0; w < W; ++w) dst[w] = to_acc<Acc>(v[w]);
}

// The SIMT k-tile depth: Config's, but 16 for float with scalar loads from a row table (the
// launcher's _conv_igemm.pick_tile says the same).  A k-step costs a thread 64 FFMA, 4 LDS.128
// and one element's scalar load; the deeper tile spreads each tile's fixed work (the position's
// decomposition, the buffers' addresses, the barrier) over twice the FFMA, which takes wgrad's
// scalar main loop from 76% FFMA to 80% (sm_90), within the 128 registers of 2 CTAs per SM.
template <typename T, bool VECTOR, class Problem> struct SimtDepth {
    static constexpr int value =
        sizeof(T) == 4 && !VECTOR && (HasRowTable<Problem>::value || HasKTable<Problem>::value) ? 16 : Config<T, SIMT>::BK;
};

template <typename T, typename Acc, bool VECTOR, class Problem>
__device__ __forceinline__ void simt_cta(const Problem& p) {
    using C = Config<T, SIMT>;
    constexpr int BM = C::BM, BN = C::BN, BK = SimtDepth<T, VECTOR, Problem>::value, TM = C::TM, TN = C::TN;
    constexpr int LDA = BM + C::PAD, LDB = BN + C::PAD;
    constexpr int THREADS_N = BN / TN;
    constexpr int W = SimtFragment<T>::W;
    static_assert(TM % W == 0 && TN % W == 0, "a thread's rows and columns are whole fragments");
    static_assert((LDA * sizeof(T)) % SimtFragment<T>::BYTES == 0 && (LDB * sizeof(T)) % SimtFragment<T>::BYTES == 0,
                  "every shared-memory row starts 16-byte aligned");
    constexpr int SPAN_M = BM / (TM / W), SPAN_N = BN / (TN / W);  // rows (columns) between a thread's groups
    static_assert(SPAN_M == (BM / TM) * W && SPAN_N == (BN / TN) * W, "the threads' groups tile the block");

    __shared__ __align__(16) T As[2][BK][LDA];  // double-buffered (Loader::run)
    __shared__ __align__(16) T Bs[2][BK][LDB];

    const int m0 = static_cast<int>(blockIdx.x) * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    const int tx = static_cast<int>(threadIdx.x) % THREADS_N, ty = static_cast<int>(threadIdx.x) / THREADS_N;

    Acc acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = Acc(0);

    Loader<T, BM, BN, BK, C::THREADS, VECTOR, Problem> loader;
    loader.run(p, m0, n0, As, Bs, [&](int buf) {
#pragma unroll
        for (int k = 0; k < BK; ++k) {
            Acc a[TM], b[TN];
#pragma unroll
            for (int g = 0; g < TM / W; ++g) load_fragment<Acc, T, W>(&As[buf][k][g * SPAN_M + ty * W], a + g * W);
#pragma unroll
            for (int g = 0; g < TN / W; ++g) load_fragment<Acc, T, W>(&Bs[buf][k][g * SPAN_N + tx * W], b + g * W);
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fma(a[i], b[j], acc[i][j]);
        }
    });

#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / W) * SPAN_M + ty * W + i % W;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + (j / W) * SPAN_N + tx * W + j % W;
            if (m < p.m_size && n < p.n_size) p.store(m, n, acc[i][j]);
        }
    }
}

// VECTOR: 16-byte global loads (see the tile loading section).  TILE_M x TILE_N: the CTA's
// tile, other than 128 x 128 only for the mma.sync path with 16-byte chunks (MmaConfig).
template <typename T, typename Acc, int Kind, bool VECTOR, int TILE_M = 128, int TILE_N = 128, class Problem>
__device__ __forceinline__ void run_cta(const Problem& p) {
    static_assert(HasTensorCores<T, Kind>::value,
                  "no tensor cores for this element type on this architecture: launch the SIMT kind");
    static_assert((TILE_M == 128 && TILE_N == 128) || (Kind == WMMA_HALF && VECTOR && GRADOPS_HAS_MMA_SM80),
                  "tile shapes other than 128 x 128 are the mma.sync path's, with 16-byte chunks");
    if constexpr (Kind == SIMT) simt_cta<T, Acc, VECTOR>(p);
#if GRADOPS_HAS_MMA_SM80
    else if constexpr (Kind == WMMA_HALF || Kind == WMMA_TF32) mma_cta<T, VECTOR, TILE_M, TILE_N>(p);
#endif
#if GRADOPS_HAS_WMMA
    else wmma_cta<T, Kind, VECTOR>(p);
#endif
}

// A tiled kernel's CTA tile: Config<T, Kind>'s for the default 128 x 128 (64 x 64 for double),
// MmaConfig's for the other mma.sync shapes.  The launchers read the same numbers
// (_conv_igemm.TILES, MMA_TILES).
template <typename T, int Kind, int TILE_M = 128, int TILE_N = 128>
using Tile = typename Select<TILE_M == 128 && TILE_N == 128, Config<T, Kind>, MmaConfig<T, TILE_M, TILE_N>>::type;
// Threads per CTA of a tiled kernel.
template <typename T, int Kind, int TILE_M = 128, int TILE_N = 128> struct Threads {
    static constexpr int value = Tile<T, Kind, TILE_M, TILE_N>::THREADS;
};
// CTAs per SM each kernel is compiled for (__launch_bounds__'s second argument), so that one
// CTA's barrier does not idle the whole SM: two of the 256-thread kernels (at most 128
// registers per thread) wherever they fit without spilling on sm_80 and sm_90 with nvcc 13
// (tests/test_cuda_compile.py checks every instantiation), one elsewhere.  Two fit: double
// (SIMT); half types on CUDA cores but in dgrad (whose epilogue decomposes every stored
// element's index); half types on tensor cores with mma.sync (sm_80+; the scalar-load dgrad
// with its k table's fill state in shared memory, Loader's SHARED_FILL: 181 -> 128 registers
// on sm_90, no spill; the scalar-load wgrad with its ldmatrix.trans addresses derived in the
// loop, mma_cta's TRANS_XOR: 156 -> 128); float on CUDA cores in wgrad with 16-byte loads; TF32
// in the 1x1 dgrad.  The other
// TF32 kernels (24 bytes spill in the general dgrad on sm_80, over 100 in wgrad), the forward
// kernel on tensor cores (8 bytes spill on sm_80) and dgrad on WMMA (before sm_80) spill
// under 128.  NVRTC 12.9 (the cuda12 extra) for the sm_100 family fits the scalar-load
// tensor-core dgrad and wgrad in 128 only with 28-52 bytes of spill, 22 (dgrad) and 4-7 (wgrad)
// local accesses per k-tile of 32 mma (SASS, 2026-11-29): one CTA there (174-214 registers, none
// spilled; ptxas 13 and sm_120 keep two).  DGRAD_1X1: the input gradient's 1x1 kernel, otherwise
// as DGRAD.
enum KernelOp { FORWARD = 0, WGRAD = 1, DGRAD = 2, DGRAD_1X1 = 3 };
// SPLIT: the input gradient's split-reduction instantiation, whose float64 scalar variant
// needs more than 128 registers (ptxas 13 spills 12 bytes there at 128).  The 128- and 64-thread
// tiles (MmaConfig) ask for 2 and 4 times the CTAs: the same 128-register budget per thread.
template <typename T, int Kind, int Op, bool VECTOR, bool SPLIT = false, int TILE_M = 128, int TILE_N = 128>
struct MinBlocks {
    static constexpr bool HALF = sizeof(T) == 2;
    // dgrad's 128-register fit is mma_cta's (sm_80+); WMMA before sm_80 spills at 128.
    static constexpr bool MMA_SYNC = GRADOPS_HAS_MMA_SM80;
    static constexpr bool IS_DGRAD = Op == DGRAD || Op == DGRAD_1X1;
    static constexpr bool NVRTC12_SM100 = GRADOPS_CUDACC_MAJOR < 13 && GRADOPS_ARCH >= 1000 && GRADOPS_ARCH < 1200;
    static constexpr bool TWO_FIT = (sizeof(T) == 8 && !(IS_DGRAD && SPLIT && !VECTOR)) ||
                                    (HALF && Kind == SIMT && !IS_DGRAD) ||
                                    (HALF && Kind != SIMT && VECTOR && (Op == WGRAD || (IS_DGRAD && MMA_SYNC))) ||
                                    (HALF && Kind != SIMT && !VECTOR && MMA_SYNC && (Op == DGRAD || Op == WGRAD) && !NVRTC12_SM100) ||
                                    (!HALF && Kind == SIMT && Op == WGRAD) ||
                                    (Kind == WMMA_TF32 && MMA_SYNC && Op == DGRAD_1X1);
    static constexpr int value = (TWO_FIT ? 2 : 1) * (256 / Threads<T, Kind, TILE_M, TILE_N>::value);
};

// Where a problem's C lands: the output or, with a split reduction (SPLIT), this split's slice
// of the float / double scratch, which split_reduce sums in split order.  A template argument,
// not a null test, so that an instantiation carries one store path.
template <typename T, typename Acc, bool SPLIT> struct SplitStore {
    T* __restrict__ out;
    Acc* __restrict__ partial;  // unused without SPLIT
    __device__ __forceinline__ void at(index_t i, Acc v) const {
        if constexpr (SPLIT) partial[i] = v;
        else out[i] = from_acc<T, Acc>(v);
    }
    // Eight float sums at i (a multiple of 8): one 16-byte store of T, or two of floats.
    __device__ __forceinline__ void chunk(index_t i, const float (&v)[8]) const {
        if constexpr (SPLIT) {
            reinterpret_cast<float4*>(partial + i)[0] = *reinterpret_cast<const float4*>(v);
            reinterpret_cast<float4*>(partial + i)[1] = *reinterpret_cast<const float4*>(v + 4);
        } else {
            store_chunk8(out + i, v);
        }
    }
};

}  // namespace igemm

// split_reduce's batches: a thread loads the partial sums of kSplitReduceBatch splits, then adds
// them (in split order); the last splits go in batches of kSplitReduceTail.  The grids are small
// (one thread per gradient element: 4,096 for a 64 x 64 1x1 filter), so each thread's chain of
// DRAM round trips sets the time.  sm_90 SASS (nvcc 13): ptxas issues 8 of a batch's loads, then
// interleaves the rest with the additions, so a batch of 32 costs about two round trips and a
// tail batch of 8 one; the plain loop before this was unrolled 4 deep (4 splits per round trip).
inline constexpr int kSplitReduceBatch = 32;
inline constexpr int kSplitReduceTail = 8;

// Second stage of a split reduction: out[i] = sum over splits of partial[s][i], in split order,
// so the result is bitwise reproducible (no atomics).
template <typename T, typename Acc>
__global__ void split_reduce(const Acc* __restrict__ partial, T* __restrict__ out, long long total,
                             long long splits) {
    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        const Acc* p = partial + i;
        Acc sum = p[0];
        index_t s = 1;
        for (; s + kSplitReduceBatch <= splits; s += kSplitReduceBatch) {
            Acc v[kSplitReduceBatch];
#pragma unroll
            for (int u = 0; u < kSplitReduceBatch; ++u) v[u] = p[(s + u) * total];
#pragma unroll
            for (int u = 0; u < kSplitReduceBatch; ++u) sum += v[u];
        }
        for (; s < splits; s += kSplitReduceTail) {
            // Past the last split nothing is loaded or added (adding 0 would turn a -0 sum into +0).
            Acc v[kSplitReduceTail];
#pragma unroll
            for (int u = 0; u < kSplitReduceTail; ++u)
                if (s + u < splits) v[u] = p[(s + u) * total];
#pragma unroll
            for (int u = 0; u < kSplitReduceTail; ++u)
                if (s + u < splits) sum += v[u];
        }
        out[i] = from_acc<T, Acc>(sum);
    }
}

}  // namespace gradops
