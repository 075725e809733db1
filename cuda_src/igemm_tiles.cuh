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
    __device__ __forceinline__ FastDiv() : mul(1), shift(0), divisor(1) {}
    __device__ __forceinline__ explicit FastDiv(int d) : divisor(d) {
        int log2_ceil = 0;
        while ((1LL << log2_ceil) < d) ++log2_ceil;
        shift = 31 + log2_ceil;
        mul = ((1ULL << shift) + static_cast<unsigned long long>(d) - 1) / static_cast<unsigned long long>(d);
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

namespace igemm {

// How the CTA multiplies its tiles.
enum MathKind {
    SIMT = 0,       // FMA on CUDA cores: float (exact float32 products) and double
    WMMA_HALF = 1,  // tensor cores, __half / __nv_bfloat16 in, float accumulate: ldmatrix +
                    // mma.sync.m16n8k16 from sm_80 (mma_cta), WMMA m16n16k16 on sm_70/75
    WMMA_TF32 = 2   // tensor cores, float rounded to TF32 in, float accumulate (m16n16k8); opt-in
};

// Tile shapes.  Tensor-core CTAs are 128x128 with 8 warps (2 x 4, each a 64x32 patch of 4 x 2
// 16x16 WMMA fragments, or 4 x 4 16x8 mma.sync tiles): large enough to reuse each loaded element 128 times, small enough for two
// tiles plus staging to fit the 48 KiB of static shared memory.
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

template <int V, typename T> __device__ __forceinline__ void copy_chunk(T* dst, const T* __restrict__ src) {
    if constexpr (V == 1) {
        dst[0] = src[0];
    } else {
        static_assert(V * sizeof(T) == sizeof(uint4), "a chunk is one 16-byte load");
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    }
}

// The value of x, opaque to the optimiser: the loaders pass their row index through it so that
// the compiler recomputes each chunk's index math per tile instead of hoisting all of it out of
// the reduction loop, which held dozens of registers and made the scalar-load kernels spill
// (ptxas: 255 registers plus spills before, 166-205 after; see python -m gradops kernels).
__device__ __forceinline__ int opaque(int x) {
    asm volatile("" : "+r"(x));
    return x;
}

template <int V, typename T> __device__ __forceinline__ void zero_chunk(T* dst) {
#pragma unroll
    for (int v = 0; v < V; ++v) dst[v] = from_acc<T, float>(0.0f);
}

// A tile of ROWS (the m or n extent) x BK elements, loaded by THREADS threads in chunks of C
// into registers and then stored reduction-major into shared memory.  K_CONTIG: the operand is
// contiguous along k in global memory, so a chunk spans C consecutive k and consecutive threads
// take consecutive chunks along k (else along rows).
template <int ROWS, int BK, int THREADS, bool K_CONTIG, int C> struct TileMap {
    static constexpr int CHUNKS = ROWS * BK / (THREADS * C);  // per thread
    static_assert(ROWS * BK % (THREADS * C) == 0, "tile must divide evenly among threads");
    static_assert((K_CONTIG ? BK : ROWS) % C == 0, "chunks must tile the contiguous dimension");
    // First (row, k) of this thread's chunk e.
    __device__ __forceinline__ static void at(int e, int& row, int& k) {
        int t = static_cast<int>(threadIdx.x) + e * THREADS;
        if (K_CONTIG) { k = t % (BK / C) * C; row = t / (BK / C); }
        else          { row = t % (ROWS / C) * C; k = t / (ROWS / C); }
    }
};

// ---------------------------------------------------------------- the input operand
// The gathered input of the forward and filter-gradient GEMMs (NHWC): element (tap, position)
// with tap = (r * filter_cols + s) * Cg + c and position = (n * out_rows + p) * out_cols + q is
// input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols -
// pad_left][group's first channel + c], zero in the padding.  Chunks run along c.
template <typename T> struct InputOperand {
    const T* __restrict__ input;
    ConvDims d;
    FastDiv div_cg, div_s, div_q, div_p;
    int channel0;
    // The sizes the cursors combine, as 32-bit ints (see below).
    int in_rows, in_cols, stride_rows, stride_cols, dilation_rows, dilation_cols, pad_top, pad_left;

    __device__ __forceinline__ InputOperand() : input(nullptr), d{}, channel0(0) {}
    __device__ __forceinline__ InputOperand(const T* input_, const ConvDims& dims, index_t group)
        : input(input_), d(dims), div_cg(static_cast<int>(dims.filter_in_depth)),
          div_s(static_cast<int>(dims.filter_cols)), div_q(static_cast<int>(dims.out_cols)),
          div_p(static_cast<int>(dims.out_rows)), channel0(static_cast<int>(group * dims.filter_in_depth)),
          in_rows(static_cast<int>(dims.in_rows)), in_cols(static_cast<int>(dims.in_cols)),
          stride_rows(static_cast<int>(dims.stride_rows)), stride_cols(static_cast<int>(dims.stride_cols)),
          dilation_rows(static_cast<int>(dims.dilation_rows)), dilation_cols(static_cast<int>(dims.dilation_cols)),
          pad_top(static_cast<int>(dims.pad_top)), pad_left(static_cast<int>(dims.pad_left)) {}

    // Row cursors (see "Row cursors" below): what a fixed tap, or a fixed position, contributes.
    // 32-bit: the launchers check that padded coordinates plus the dilated filter's extent and
    // the channel counts fit (_conv_igemm.cursor_extents), so every coordinate below does.
    struct TapRow {
        bool in_range;
        int h_offset, w_offset, channel;  // r * dilation_rows - pad_top, ...; input channel
    };
    struct PositionRow {
        bool in_range;
        int n, h_base, w_base;  // p * stride_rows - pad_top, q * stride_cols - pad_left
    };
    __device__ __forceinline__ TapRow tap_row(int tap, bool in_range) const {
        int c, s;
        const int r = div_s.divmod(div_cg.divmod(tap, c), s);
        return {in_range, r * dilation_rows - pad_top, s * dilation_cols - pad_left, channel0 + c};
    }
    __device__ __forceinline__ PositionRow position_row(int position, bool in_range) const {
        int q, p;
        const int n = div_p.divmod(div_q.divmod(position, q), p);
        return {in_range, n, p * stride_rows - pad_top, q * stride_cols - pad_left};
    }

    // Element (tap, position) of the gather and the V - 1 after it along channels, with the
    // tap's part from a cursor (filter gradient) ...
    template <int V> __device__ __forceinline__ void gather(const TapRow& tap, int position, T* dst) const {
        int q, p;
        const int n = div_p.divmod(div_q.divmod(position, q), p);
        load<V>(n, p * stride_rows + tap.h_offset, q * stride_cols + tap.w_offset, tap.channel, dst);
    }
    // ... or the position's (forward convolution).
    template <int V> __device__ __forceinline__ void gather(const PositionRow& position, int tap, T* dst) const {
        int c, s;
        const int r = div_s.divmod(div_cg.divmod(tap, c), s);
        load<V>(position.n, position.h_base + r * dilation_rows, position.w_base + s * dilation_cols, channel0 + c,
                dst);
    }
    template <int V> __device__ __forceinline__ void load(int n, int h, int w, int channel, T* dst) const {
        if (h < 0 || h >= in_rows || w < 0 || w >= in_cols) return zero_chunk<V>(dst);
        copy_chunk<V>(dst, input + ((static_cast<index_t>(n) * in_rows + h) * in_cols + w) * d.in_depth + channel);
    }
};

// The row cursor of an operand whose row is a channel with a fixed offset (out_backprop and the
// filter along out channels, the filter along input channels).
struct ChannelRow {
    bool in_range;
    int offset;
};

// ---------------------------------------------------------------- the CTA core
// Problem interface (all indices int, offsets inside it 64-bit):
//   int m_size, n_size, k_begin, k_end;
//   static constexpr bool A_K_CONTIG, B_K_CONTIG;
//   struct ARow { bool in_range; ... };      what A's addresses take from m, computed once
//   ARow a_row(int m) const;                 (in_range: m < m_size)
//   template <int V> void a(const ARow& row, int k, T* dst) const;
//                                            A[m][k] and, for V > 1, the V-1 elements after it
//                                            along A's contiguous dimension (V is 1 or C)
//   struct BRow, BRow b_row(int n) const, template <int V> void b(const BRow& row, int k, T* dst)
//                                            likewise for B[k][n]
//   void store(int m, int n, Acc v) const;
//   index_t out_row(int m) const;            where C's row m starts in the output: store(m, n, v)
//   void store_at(index_t row, int n, Acc v) const;   is store_at(out_row(m), n, v)
// The core zero-fills out-of-range elements and only stores in-range ones, so problems need no
// bounds logic beyond the convolution's own padding.  Row cursors: a thread's chunks keep their
// GEMM row (m of A, n of B) for the whole reduction, so with 16-byte chunks the loader computes
// each chunk's ARow / BRow once, before the main loop, and each k-tile only decomposes k (the
// per-row index math, divisions included, leaves the loop).  The scalar path makes one per
// element per tile instead: C rows per chunk would hold too many registers.

template <typename T, typename Acc, int Kind, class Problem> struct Core;

// X if B, else Y (std::conditional, which NVRTC's headers need not provide).
template <bool B, class X, class Y> struct Select { using type = X; };
template <class X, class Y> struct Select<false, X, Y> { using type = Y; };

// A [row][k] tile of ROWS x BK elements without padding, its 16-byte chunks XOR-swizzled: the
// tile is cut into 128-byte lines (one pass over the 32 four-byte banks: 8 chunks, i.e.
// LINE_ROWS = 8 / (BK / C) rows), and chunk c of line L is stored at position c ^ (L % 8) of
// the line.  Then
//   * a 16-byte store phase (8 lanes: LINE_ROWS whole rows of one line, the Loader's k-major
//     chunk order) hits 8 distinct positions, and
//   * an ldmatrix phase (8 consecutive rows from a multiple of 8, one chunk column c: lines
//     L0 .. L0 + 8 / LINE_ROWS - 1, L0 a multiple of 8 / LINE_ROWS) hits positions
//     (c + j BK / C) ^ (L % 8), all distinct,
// so both take one wavefront (the host model counts ldmatrix wavefronts).  Padding (the
// [k][row] tiles' remedy) cannot do both for 64-byte rows.
template <typename T, int BK> struct SwizzledRows {
    static constexpr int C = ChunkSize<T>::value;     // elements per 16-byte chunk
    static constexpr int ROW_CHUNKS = BK / C;         // 4 for 32 halves
    static constexpr int LINE_CHUNKS = 8;             // 128 bytes
    static constexpr int LINE_ROWS = LINE_CHUNKS / ROW_CHUNKS;
    static_assert(BK % C == 0 && LINE_CHUNKS % ROW_CHUNKS == 0, "rows of whole chunks, whole rows per line");
    // The element offset of (row, k) in the tile.
    __device__ __forceinline__ static int offset(int row, int k) {
        const int line = row / LINE_ROWS;
        const int chunk = row % LINE_ROWS * ROW_CHUNKS + k / C;
        return (line * LINE_CHUNKS + (chunk ^ line % LINE_CHUNKS)) * C + k % C;
    }
};

// Shared: register-staged loads (the next tile's global loads are in flight while the current
// tile is multiplied), then stored to the other of two shared-memory buffers.
//
// Tile layouts in shared memory: reduction-major, S[k][row] (row = m for A, n for B), unless
// A_ROWS / B_ROWS: then [row][k] (SwizzledRows, a flat array), for an operand that is
// contiguous along k in global memory (K_CONTIG), so that its chunk of C consecutive k lands
// with one 16-byte store instead of C 2-byte stores into C different rows (mma_cta, whose
// ldmatrix reads either layout).  PTX_STORES: such stores, and those of chunks contiguous along
// the rows of a [k][row] tile, go through ptx::st_shared_16 (sm_80+ callers), whose bank
// wavefronts the host model counts; the compiled store is the same STS.128.
template <typename T, int BM, int BN, int BK, int THREADS, bool VECTOR, class Problem, bool A_ROWS = false,
          bool B_ROWS = false, bool PTX_STORES = false>
struct Loader {
    static constexpr int C = ChunkSize<T>::value;
    using MapA = TileMap<BM, BK, THREADS, Problem::A_K_CONTIG, C>;
    using MapB = TileMap<BN, BK, THREADS, Problem::B_K_CONTIG, C>;
    static_assert((!A_ROWS || Problem::A_K_CONTIG) && (!B_ROWS || Problem::B_K_CONTIG),
                  "a [row][k] tile takes whole chunks along k");
    alignas(16) T ra[MapA::CHUNKS * C];
    alignas(16) T rb[MapB::CHUNKS * C];
    // Row cursors of the vector path (see "Row cursors" above); unused by the scalar path.
    typename Problem::ARow arow[VECTOR ? MapA::CHUNKS : 1];
    typename Problem::BRow brow[VECTOR ? MapB::CHUNKS : 1];

    __device__ __forceinline__ void init_rows(const Problem& p, int m0, int n0) {
        if constexpr (VECTOR) {
#pragma unroll
            for (int e = 0; e < MapA::CHUNKS; ++e) {
                int row, k;
                MapA::at(e, row, k);
                arow[e] = p.a_row(m0 + row);
            }
#pragma unroll
            for (int e = 0; e < MapB::CHUNKS; ++e) {
                int row, k;
                MapB::at(e, row, k);
                brow[e] = p.b_row(n0 + row);
            }
        }
    }

    // One chunk of A (IS_A) or B starting at GEMM row ``row`` (m or n, below ``rows``) and
    // reduction index k (below k_end), element by element (the scalar path).
    template <bool IS_A, bool K_CONTIG>
    __device__ __forceinline__ static void fetch_scalar(const Problem& p, int row, int k, int rows, T* dst) {
        row = opaque(row);
#pragma unroll
        for (int v = 0; v < C; ++v) {
            const int r = K_CONTIG ? row : row + v, kk = K_CONTIG ? k + v : k;
            if (r < rows && kk < p.k_end) {
                if constexpr (IS_A) p.template a<1>(p.a_row(r), kk, dst + v);
                else p.template b<1>(p.b_row(r), kk, dst + v);
            } else {
                dst[v] = from_acc<T, float>(0.0f);
            }
        }
    }

    // The chunks of the tile at k0.  The vector path: a chunk is in range or out of range as a
    // whole (along the contiguous dimension the extents are multiples of C), and its row part
    // comes from its cursor.
    __device__ __forceinline__ void load(const Problem& p, int m0, int n0, int k0) {
#pragma unroll
        for (int e = 0; e < MapA::CHUNKS; ++e) {
            int row, k;
            MapA::at(e, row, k);
            if constexpr (VECTOR) {
                if (arow[e].in_range && k0 + k < p.k_end) p.template a<C>(arow[e], k0 + k, &ra[e * C]);
                else zero_chunk<C>(&ra[e * C]);
            } else {
                fetch_scalar<true, Problem::A_K_CONTIG>(p, m0 + row, k0 + k, p.m_size, &ra[e * C]);
            }
        }
#pragma unroll
        for (int e = 0; e < MapB::CHUNKS; ++e) {
            int row, k;
            MapB::at(e, row, k);
            if constexpr (VECTOR) {
                if (brow[e].in_range && k0 + k < p.k_end) p.template b<C>(brow[e], k0 + k, &rb[e * C]);
                else zero_chunk<C>(&rb[e * C]);
            } else {
                fetch_scalar<false, Problem::B_K_CONTIG>(p, n0 + row, k0 + k, p.n_size, &rb[e * C]);
            }
        }
    }

    template <bool K_CONTIG, bool ROWS, class Tile>
    __device__ __forceinline__ static void put(Tile& S, int row, int k, const T* chunk) {
        if constexpr (ROWS) {
            static_assert(PTX_STORES, "[row][k] tiles are mma_cta's");
            ptx::st_shared_16(&S[SwizzledRows<T, BK>::offset(row, k)], chunk);
        } else if constexpr (PTX_STORES && !K_CONTIG) {
            ptx::st_shared_16(&S[k][row], chunk);  // C consecutive rows of one k: 16 bytes
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
    // per tile.
    // As, Bs: two tiles each (TileA / TileB: 2-D arrays in the layouts above).
    template <class TileA, class TileB, class Multiply>
    __device__ __forceinline__ void run(const Problem& p, int m0, int n0, TileA* As, TileB* Bs,
                                        Multiply&& multiply) {
        init_rows(p, m0, n0);
        if (p.k_begin < p.k_end) {
            load(p, m0, n0, p.k_begin);
            store(As[0], Bs[0]);
        }
        __syncthreads();
        int buf = 0;
        for (int k0 = p.k_begin; k0 < p.k_end; k0 += BK, buf ^= 1) {
            const bool more = k0 + BK < p.k_end;
            if (more) load(p, m0, n0, k0 + BK);
            multiply(buf);
            if (more) store(As[buf ^ 1], Bs[buf ^ 1]);
            __syncthreads();  // tile i + 1 is stored, and every thread is done reading tile i
        }
    }

    template <class TileA, class TileB>
    __device__ __forceinline__ void store(TileA& As, TileB& Bs) const {
#pragma unroll
        for (int e = 0; e < MapA::CHUNKS; ++e) {
            int row, k;
            MapA::at(e, row, k);
            put<Problem::A_K_CONTIG, A_ROWS>(As, row, k, &ra[e * C]);
        }
#pragma unroll
        for (int e = 0; e < MapB::CHUNKS; ++e) {
            int row, k;
            MapB::at(e, row, k);
            put<Problem::B_K_CONTIG, B_ROWS>(Bs, row, k, &rb[e * C]);
        }
    }
};

// The tensor-core epilogue.  Where each of the CTA's BM rows of C starts in the output
// (Problem::out_row, -1 past m_size), located once per CTA: a lane stores elements of 32 rows,
// and locating a row can cost divisions (dgrad: the input position of m).
template <int BM, int THREADS, class Problem>
__device__ __forceinline__ void locate_rows(const Problem& p, int m0, index_t (&rows)[BM]) {
    for (int r = static_cast<int>(threadIdx.x); r < BM; r += THREADS)
        rows[r] = m0 + r < p.m_size ? p.out_row(m0 + r) : index_t(-1);
    __syncthreads();
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
// Half types on sm_80+: ldmatrix + mma.sync.m16n8k16 (tensor_core_ptx.cuh), with the tiles and
// loader of the WMMA path.  Against WMMA this fixes the fragment layouts (the ISA's, so that
// the epilogue writes each lane's own accumulators without a store_matrix_sync round trip
// through a fragment of unspecified layout) and loads each 8x8 sub-matrix once per warp.
//
// The fragments pair elements along k (A row-major: a lane holds A[m][k], A[m][k + 1]; B
// col-major: B[k][n], B[k + 1][n]).  An operand that is contiguous along k in global memory
// (K_CONTIG: dgrad's both, the forward's A) keeps that orientation in shared memory, S[row][k]
// (Loader's A_ROWS / B_ROWS): each chunk is one 16-byte store, and ldmatrix reads it without
// .trans.  The others are reduction-major, S[k][row] (rows run along m or n), and ldmatrix
// transposes (.trans).  Every ldmatrix phase (8 rows of 16 bytes) falls in 32 distinct banks:
// [k][row] rows are padded to BM + PAD = 136 halves (272 bytes, 68 words: 4 banks apart);
// [row][k] tiles are swizzled (SwizzledRows, which also keeps their 16-byte stores free of
// conflicts).  The host model counts ldmatrix wavefronts (tests/test_tensor_core_ptx.py).
template <typename T, bool VECTOR, class Problem>
__device__ __forceinline__ void mma_cta(const Problem& p) {
    using C = Config<T, WMMA_HALF>;
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK;
    constexpr int MMA_M = 16, MMA_N = 8, MMA_K = 16;             // mma.sync.m16n8k16
    constexpr int WM = BM / C::WARPS_M, WN = BN / C::WARPS_N;    // warp patch (64 x 32)
    constexpr int FM = WM / MMA_M, FN = WN / MMA_N;              // 4 x 4 accumulator tiles per warp
    static_assert(BK % MMA_K == 0 && FN % 2 == 0, "k-steps of 16; B loaded two n8 tiles per ldmatrix.x4");
    constexpr bool A_ROWS = Problem::A_K_CONTIG, B_ROWS = Problem::B_K_CONTIG;  // [row][k] tiles
    constexpr int LDA = BM + C::PAD, LDB = BN + C::PAD;  // [k][row] tiles' row length
    using Swizzle = SwizzledRows<T, BK>;                 // [row][k] tiles
    using TileA = typename Select<A_ROWS, T[BM * BK], T[BK][LDA]>::type;
    using TileB = typename Select<B_ROWS, T[BN * BK], T[BK][LDB]>::type;

    // Two tile buffers (Loader::run) and the epilogue's staging: 43 KB with two [k][row] tiles
    // (wgrad), 41 KB with one [row][k] tile (forward), 40 KB with two (dgrad).
    __shared__ __align__(128) TileA As[2];
    __shared__ __align__(128) TileB Bs[2];
    __shared__ __align__(128) float stage[C::WARPS_M * C::WARPS_N][16 * 16];
    static_assert(sizeof(As) + sizeof(Bs) + sizeof(stage) <= 48 * 1024, "static shared memory is 48 KiB");

    const int m0 = static_cast<int>(blockIdx.x) * BM;
    const int n0 = static_cast<int>(blockIdx.y) * BN;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int wm = (warp / C::WARPS_N) * WM, wn = (warp % C::WARPS_N) * WN;
    // ldmatrix.x4: lane l supplies the address of row l % 8 of 8x8 matrix l / 8.
    const int matrix = lane / 8, row = lane % 8;

    float acc[FM][FN][4];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

    Loader<T, BM, BN, BK, C::THREADS, VECTOR, Problem, A_ROWS, B_ROWS, true> loader;
    loader.run(p, m0, n0, As, Bs, [&](int buf) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += MMA_K) {
            // A fragment registers a[0..3] are the 8x8 blocks (m + 0, k + 0), (m + 8, k + 0),
            // (m + 0, k + 8), (m + 8, k + 8) of the 16x16 A tile: matrix q starts at m + 8 (q % 2),
            // k + 8 (q / 2), its rows running along m ([row][k] tile) or k ([k][row]).
            unsigned a[FM][4];
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                const int m = wm + MMA_M * i + 8 * (matrix % 2), k = kk + 8 * (matrix / 2);
                if constexpr (A_ROWS) ptx::ldmatrix<4, false>(a[i], &As[buf][Swizzle::offset(m + row, k)]);
                else ptx::ldmatrix<4, true>(a[i], &As[buf][k + row][m]);
            }
            // B fragment registers b[0], b[1] are k + 0..7 and k + 8..15 of one n8 tile; an x4
            // loads two n8 tiles: matrix q starts at n + 8 (q / 2), k + 8 (q % 2).
            unsigned b[FN][2];
#pragma unroll
            for (int j = 0; j < FN; j += 2) {
                unsigned t[4];
                const int n = wn + MMA_N * j + 8 * (matrix / 2), k = kk + 8 * (matrix % 2);
                if constexpr (B_ROWS) ptx::ldmatrix<4, false>(t, &Bs[buf][Swizzle::offset(n + row, k)]);
                else ptx::ldmatrix<4, true>(t, &Bs[buf][k + row][n]);
                b[j][0] = t[0];
                b[j][1] = t[1];
                b[j + 1][0] = t[2];
                b[j + 1][1] = t[3];
            }
#pragma unroll
            for (int i = 0; i < FM; ++i)
#pragma unroll
                for (int j = 0; j < FN; ++j) ptx::mma_m16n8k16<T>(acc[i][j], a[i], b[j], acc[i][j]);
        }
    });

    // Epilogue: per 16x16 block (one m16 tile, two n8 tiles), each lane stages its own
    // accumulators where the C fragment layout puts them (row g + 8 (r / 2), column
    // 2 t + r % 2 of its n8 tile, g = lane / 4, t = lane % 4), then the warp stores the block.
    __shared__ index_t rows[BM];
    locate_rows<BM, C::THREADS>(p, m0, rows);
    float* st = stage[warp];
    const int g = lane / 4, t = lane % 4;
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
            store_staged_tile(p, st, rows + wm + MMA_M * i, n0 + wn + MMA_N * j, lane);
            __syncwarp();  // every lane has read the block before it is overwritten
        }
    }
}
#endif  // GRADOPS_HAS_MMA_SM80

#if GRADOPS_HAS_WMMA
// Tensor cores (half types, or float as TF32).
template <typename T, int Kind> struct WmmaTypes {
    using In = T;  // fragment element type
};
#if GRADOPS_HAS_WMMA_BF16_TF32
template <> struct WmmaTypes<float, WMMA_TF32> {
    using In = nvcuda::wmma::precision::tf32;
};
// Round a float fragment's elements to TF32 (the tensor cores read only TF32's bits).
template <class Fragment> __device__ __forceinline__ void round_to_tf32(Fragment& f) {
    for (int t = 0; t < f.num_elements; ++t) f.x[t] = nvcuda::wmma::__float_to_tf32(f.x[t]);
}
#endif

template <typename T, int Kind, bool VECTOR, class Problem>
__device__ __forceinline__ void wmma_cta(const Problem& p) {
    using namespace nvcuda;
    using C = Config<T, Kind>;
    using In = typename WmmaTypes<T, Kind>::In;
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK, FK = C::FRAG_K;
    constexpr int WM = BM / C::WARPS_M, WN = BN / C::WARPS_N;  // warp patch
    constexpr int FM = WM / 16, FN = WN / 16;                  // 16x16 fragments per warp
    constexpr int LDA = BM + C::PAD, LDB = BN + C::PAD;

    // Two tile buffers (Loader::run): 2 x (A + B) + the epilogue's staging is 43 KB for
    // half types, 41 KB for TF32, under the 48 KB of static shared memory.
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
            for (int i = 0; i < FM; ++i) {
                wmma::load_matrix_sync(fa[i], &As[buf][kk][wm + 16 * i], LDA);
#if GRADOPS_HAS_WMMA_BF16_TF32
                if constexpr (Kind == WMMA_TF32) round_to_tf32(fa[i]);
#endif
            }
#pragma unroll
            for (int j = 0; j < FN; ++j) {
                wmma::load_matrix_sync(fb[j], &Bs[buf][kk][wn + 16 * j], LDB);
#if GRADOPS_HAS_WMMA_BF16_TF32
                if constexpr (Kind == WMMA_TF32) round_to_tf32(fb[j]);
#endif
            }
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

template <typename T, typename Acc, bool VECTOR, class Problem>
__device__ __forceinline__ void simt_cta(const Problem& p) {
    using C = Config<T, SIMT>;
    constexpr int BM = C::BM, BN = C::BN, BK = C::BK, TM = C::TM, TN = C::TN;
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

// VECTOR: 16-byte global loads (see the tile loading section).
template <typename T, typename Acc, int Kind, bool VECTOR, class Problem>
__device__ __forceinline__ void run_cta(const Problem& p) {
    static_assert(HasTensorCores<T, Kind>::value,
                  "no tensor cores for this element type on this architecture: launch the SIMT kind");
    if constexpr (Kind == SIMT) simt_cta<T, Acc, VECTOR>(p);
#if GRADOPS_HAS_MMA_SM80
    else if constexpr (Kind == WMMA_HALF) mma_cta<T, VECTOR>(p);
#endif
#if GRADOPS_HAS_WMMA
    else wmma_cta<T, Kind, VECTOR>(p);
#endif
}

// Threads per CTA of a tiled kernel (the launchers read the same numbers, see _igemm.py).
template <typename T, int Kind> struct Threads { static constexpr int value = Config<T, Kind>::THREADS; };
// CTAs per SM each kernel is compiled for (__launch_bounds__'s second argument), so that one
// CTA's barrier does not idle the whole SM: two of the 256-thread kernels (at most 128
// registers per thread) wherever they fit without spilling on sm_80 and sm_90 with nvcc 13
// (tests/test_cuda_compile.py checks every instantiation), one elsewhere.  Two fit: double
// (SIMT); half types on CUDA cores but in dgrad (whose epilogue decomposes every stored
// element's index); half types on tensor cores in wgrad; float on CUDA cores in wgrad with
// 16-byte loads.  TF32, and forward and dgrad on tensor cores, spill under 128 registers.
enum KernelOp { FORWARD = 0, WGRAD = 1, DGRAD = 2 };
template <typename T, int Kind, int Op, bool VECTOR> struct MinBlocks {
    static constexpr bool HALF = sizeof(T) == 2;
    static constexpr bool TWO_FIT = sizeof(T) == 8 || (HALF && Kind == SIMT && Op != DGRAD) ||
                                    (HALF && Kind != SIMT && Op == WGRAD) ||
                                    (!HALF && Kind == SIMT && Op == WGRAD && VECTOR);
    static constexpr int value = TWO_FIT ? 2 : 1;
};

}  // namespace igemm

// Second stage of a split reduction: out[i] = sum over splits of partial[s][i], in split order,
// so the result is bitwise reproducible (no atomics).
template <typename T, typename Acc>
__global__ void split_reduce(const Acc* __restrict__ partial, T* __restrict__ out, long long total,
                             long long splits) {
    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        Acc sum = partial[i];
        for (index_t s = 1; s < splits; ++s) sum += partial[s * total + i];
        out[i] = from_acc<T, Acc>(sum);
    }
}

}  // namespace gradops
