// Conv2DBackpropFilter: filter_grad[r][s][c][k] (HWIO) = sum over n, p, q of
//   input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols - pad_left][g * Cg + c]
//   * out_backprop[n][p][q][k],   g = k / (out_depth / groups), Cg = filter_in_depth,
// input positions outside the image contributing zero.
//
// Two paths (the launcher, gradops/backends/cuda/conv2d_backprop_filter.py, picks one):
// * conv2d_backprop_filter_direct: any layout and size; one CTA per filter element, a strided
//   partial sum per thread and a fixed-shape tree reduction (deterministic).
// * conv2d_backprop_filter_igemm: NHWC implicit GEMM, M = filter taps x in channels (r, s, c),
//   N = out channels of the group, reduction over batch x output positions (n, p, q), optionally
//   split across CTAs (blockIdx.z) into a float/double scratch that split_reduce sums in order.
// * conv2d_backprop_filter_1x1_igemm: the same GEMM for a 1x1 filter at stride 1 without
//   padding (most ResNet layers), where position j reads input row j: no decomposition of
//   positions and no bounds tests in the main loop.
// * conv2d_backprop_filter_few_channels: NHWC, one group, at most 4 input channels (the stem),
//   float16 / bfloat16 on sm_80 and newer: a GEMM tile sized for 64 out channels x 64 taps,
//   with a per-CTA tap table instead of a per-element decomposition (see the kernel).
#include "igemm_tiles.cuh"

namespace gradops {

// Threads of the direct kernel; a power of two for the tree reduction (the launcher uses the
// same number, FILTER_DIRECT_THREADS in the launcher).
inline constexpr int kFilterDirectThreads = 128;

template <typename T, typename Acc, int L>
__global__ void __launch_bounds__(kFilterDirectThreads)
conv2d_backprop_filter_direct(const T* __restrict__ input, const T* __restrict__ out_backprop,
                              T* __restrict__ filter_grad, GRADOPS_CONV_DIMS_PARAMS) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const Tensor4<L> in{d.in_rows, d.in_cols, d.in_depth};
    const Tensor4<L> out{d.out_rows, d.out_cols, d.out_depth};
    const index_t out_per_group = d.out_per_group();
    const index_t total = d.filter_rows * d.filter_cols * d.filter_in_depth * d.out_depth;
    const index_t reduction = d.batch * d.out_rows * d.out_cols;
    __shared__ Acc partial[kFilterDirectThreads];

    for (index_t e = blockIdx.x; e < total; e += gridDim.x) {
        // HWIO linear index -> (r, s, c, k)
        const index_t k = e % d.out_depth;
        index_t rest = e / d.out_depth;
        const index_t c = rest % d.filter_in_depth;
        rest /= d.filter_in_depth;
        const index_t s = rest % d.filter_cols, r = rest / d.filter_cols;
        const index_t channel = (k / out_per_group) * d.filter_in_depth + c;
        const index_t row_offset = r * d.dilation_rows - d.pad_top;
        const index_t col_offset = s * d.dilation_cols - d.pad_left;

        Acc acc = Acc(0);
        for (index_t j = threadIdx.x; j < reduction; j += kFilterDirectThreads) {
            const index_t q = j % d.out_cols;
            const index_t np = j / d.out_cols;
            const index_t p = np % d.out_rows, n = np / d.out_rows;
            const index_t h = p * d.stride_rows + row_offset;
            const index_t w = q * d.stride_cols + col_offset;
            if (h < 0 || h >= d.in_rows || w < 0 || w >= d.in_cols) continue;
            acc += to_acc<Acc>(input[in.offset(n, h, w, channel)]) *
                   to_acc<Acc>(out_backprop[out.offset(n, p, q, k)]);
        }
        partial[threadIdx.x] = acc;
        __syncthreads();
        for (int half = kFilterDirectThreads / 2; half > 0; half /= 2) {
            if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
            __syncthreads();
        }
        // No barrier before the next element: after the last one above, only thread 0 reads
        // partial (its slot 0), and thread 0 is the next to write that slot.
        if (threadIdx.x == 0) filter_grad[e] = from_acc<T, Acc>(partial[0]);
    }
}

// The implicit GEMM seen by igemm::run_cta (NHWC).  m = (r * filter_cols + s) * Cg + c is the
// HWIO row, so C[m][n] lands at m * out_depth + group's first channel + n.
template <typename T, typename Acc, bool SPLIT> struct FilterGradProblem {
    // input is contiguous along channels (m), out_backprop along out channels (n).
    static constexpr bool A_K_CONTIG = false;
    static constexpr bool B_K_CONTIG = false;

    int m_size, n_size, k_begin, k_end;
    igemm::InputOperand<T> x;  // A[m][j] = x's element (tap m, position j)
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc, SPLIT> dst;  // the filter gradient, or this split's slice of the scratch
    index_t out_depth, out_channel0;

    using ARow = typename igemm::InputOperand<T>::TapRow;
    using BRow = igemm::ChannelRow;
    __device__ __forceinline__ ARow a_row(int m) const { return x.tap_row(m); }
    __device__ __forceinline__ BRow b_row(int n) const { return {static_cast<int>(out_channel0) + n}; }
    // Reduction cursor: position j in the input, and out_backprop's row j as a pointer (a tile
    // advances it by one 64-bit add: step.dy - out_backprop).
    struct KPos {
        typename igemm::InputOperand<T>::Position x;
        const T* dy;
    };
    __device__ __forceinline__ KPos k_pos(int j) const {
        return {x.position(j), out_backprop + static_cast<index_t>(j) * out_depth};
    }
    __device__ __forceinline__ void k_advance(KPos& pos, const KPos& step) const {
        x.advance(pos.x, step.x);
        pos.dy += step.dy - out_backprop;
    }
    __device__ __forceinline__ igemm::Src<T> a_src(const ARow& row, const KPos& pos, int) const {
        return x.gather(row, pos.x);
    }
    __device__ __forceinline__ igemm::Src<T> b_src(const BRow& row, const KPos& pos, int) const {
        return {pos.dy + row.offset, true};
    }
    __device__ __forceinline__ const T* a_base() const { return x.input; }
    __device__ __forceinline__ const T* b_base() const { return out_backprop; }
    // The scalar path's row table (igemm::HasRowTable): A's rows are taps.
    static constexpr bool A_ROW_TABLE = true;
    using ARowEntry = typename igemm::InputOperand<T>::TapEntry;
    __device__ __forceinline__ ARowEntry a_row_entry(int m) const { return x.tap_entry(m); }
    __device__ __forceinline__ static ARowEntry a_row_absent() { return igemm::InputOperand<T>::absent_tap(); }
    using APosEntry = typename igemm::InputOperand<T>::PositionEntry;
    __device__ __forceinline__ APosEntry a_pos_entry(const KPos& pos, bool in_reduction) const {
        return x.position_entry(pos.x, in_reduction);
    }
    __device__ __forceinline__ igemm::Src<T> a_entry_src(const APosEntry& pos, const ARowEntry& row) const {
        return x.gather(pos, row);
    }
    __device__ __forceinline__ index_t out_row(int m) const { return static_cast<index_t>(m) * out_depth + out_channel0; }
    __device__ __forceinline__ void store_at(index_t row, int n, Acc v) const { dst.at(row + n, v); }
    __device__ __forceinline__ void store_chunk(index_t row, int n, const float (&v)[8]) const { dst.chunk(row + n, v); }
    __device__ __forceinline__ void store(int m, int n, Acc v) const { store_at(out_row(m), n, v); }
};

// The group and split of grid z = group x splits + split (below 65536).  The SIMT kernels divide
// with the host's FastDiv constants (split_magic, split_shift: division_magic(splits)), whose
// arithmetic stays in uniform registers: after a division in vector registers the split's
// scratch slice pointer held two vector registers through the main loop, which NVRTC 12.9's
// ptxas spilled at 128 registers (float on sm_75 to sm_90: on sm_90 44 bytes, 7 local accesses
// per k-tile; the 1x1 kernel 48 bytes, 6 per k-tile, on sm_75 to sm_89).  The tensor-core
// kernels divide: the constants cost their main loops up to 10 more instructions per k-tile
// (NVRTC 13.5, sm_90, 128 x 128 half-type split kernel: 129.7 instead of 121.7).
template <int Kind, bool SPLIT>
__device__ __forceinline__ index_t split_group(long long splits, unsigned split_magic, int split_shift, int& split) {
    const int z = static_cast<int>(blockIdx.z);
    if constexpr (SPLIT && Kind == igemm::SIMT) {
        return FastDiv(split_magic, split_shift, static_cast<int>(splits)).divmod(z, split);
    } else {
        const int split_count = SPLIT ? static_cast<int>(splits) : 1;
        split = z % split_count;
        return z / split_count;
    }
}

// grid: (ceil(M / BM), ceil(out_per_group / BN), groups * splits).  Split z covers reduction
// indices [z * split_size, (z + 1) * split_size); with splits > 1 it writes partial sums to
// partial[z][filter element] instead of filter_grad.
// VECTOR: 16-byte loads (filter_in_depth and out_per_group multiples of 16 / sizeof(T), pointers
// 16-byte aligned).  SPLIT: whether the launcher splits the reduction (splits > 1); an unsplit
// instantiation has no scratch path in its epilogue.
template <typename T, typename Acc, int Kind, bool VECTOR, bool SPLIT, int TILE_M = 128, int TILE_N = 128>
__global__ void __launch_bounds__(igemm::Threads<T, Kind, TILE_M, TILE_N>::value, igemm::MinBlocks<T, Kind, igemm::WGRAD, VECTOR, false, TILE_M, TILE_N>::value)
conv2d_backprop_filter_igemm(const T* __restrict__ input, const T* __restrict__ out_backprop,
                             T* __restrict__ filter_grad, Acc* __restrict__ partial,
                             GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size,
                             GRADOPS_INPUT_DIVS_PARAMS, unsigned split_magic, int split_shift) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    int split;
    const index_t group = split_group<Kind, SPLIT>(splits, split_magic, split_shift, split);
    const index_t reduction = d.batch * d.out_rows * d.out_cols;
    FilterGradProblem<T, Acc, SPLIT> prob;
    prob.m_size = static_cast<int>(d.filter_rows * d.filter_cols * d.filter_in_depth);
    prob.n_size = static_cast<int>(d.out_per_group());
    prob.k_begin = static_cast<int>(split * split_size);
    prob.k_end = static_cast<int>(min(reduction, (split + 1) * split_size));
    prob.x = igemm::InputOperand<T>(input, d, group, GRADOPS_INPUT_DIVS(d));
    prob.out_backprop = out_backprop;
    prob.dst = {filter_grad,
                SPLIT ? partial + split * d.filter_rows * d.filter_cols * d.filter_in_depth * d.out_depth : nullptr};
    prob.out_depth = d.out_depth;
    prob.out_channel0 = group * d.out_per_group();
    igemm::run_cta<T, Acc, Kind, VECTOR, TILE_M, TILE_N>(prob);
}

// The GEMM of conv2d_backprop_filter_1x1_igemm (NHWC): with a 1x1 filter at stride 1 and no
// padding, position j reads input row j, so A[c][j] = input[j][group's channel c] and
// B[j][k] = out_backprop[j][k]: both operands are plain row-major matrices contiguous along
// their rows.  The reduction cursor is two row pointers, advanced by one 64-bit add each.
template <typename T, typename Acc, bool SPLIT> struct PointwiseFilterGradProblem {
    static constexpr bool A_K_CONTIG = false;
    static constexpr bool B_K_CONTIG = false;

    int m_size, n_size, k_begin, k_end;
    const T* __restrict__ input;
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc, SPLIT> dst;  // the filter gradient, or this split's slice of the scratch
    index_t in_depth, out_depth, in_channel0, out_channel0;

    using ARow = igemm::ChannelRow;  // the input channel (group's first + c)
    using BRow = igemm::ChannelRow;  // the out channel (group's first + n)
    struct KPos {
        const T* x;   // input row j
        const T* dy;  // out_backprop row j
    };
    __device__ __forceinline__ ARow a_row(int c) const { return {static_cast<int>(in_channel0) + c}; }
    __device__ __forceinline__ BRow b_row(int n) const { return {static_cast<int>(out_channel0) + n}; }
    __device__ __forceinline__ KPos k_pos(int j) const {
        return {input + static_cast<index_t>(j) * in_depth, out_backprop + static_cast<index_t>(j) * out_depth};
    }
    __device__ __forceinline__ void k_advance(KPos& pos, const KPos& step) const {
        pos.x += step.x - input;
        pos.dy += step.dy - out_backprop;
    }
    __device__ __forceinline__ igemm::Src<T> a_src(const ARow& row, const KPos& pos, int) const {
        return {pos.x + row.offset, true};
    }
    __device__ __forceinline__ igemm::Src<T> b_src(const BRow& row, const KPos& pos, int) const {
        return {pos.dy + row.offset, true};
    }
    __device__ __forceinline__ const T* a_base() const { return input; }
    __device__ __forceinline__ const T* b_base() const { return out_backprop; }
    // The HWIO filter of a 1x1 convolution is [in channel c within the group][out channel].
    __device__ __forceinline__ index_t out_row(int m) const { return static_cast<index_t>(m) * out_depth + out_channel0; }
    __device__ __forceinline__ void store_at(index_t row, int n, Acc v) const { dst.at(row + n, v); }
    __device__ __forceinline__ void store_chunk(index_t row, int n, const float (&v)[8]) const { dst.chunk(row + n, v); }
    __device__ __forceinline__ void store(int m, int n, Acc v) const { store_at(out_row(m), n, v); }
};

// grid, splits and SPLIT as for conv2d_backprop_filter_igemm; the launcher takes it for
// filter_rows == filter_cols == 1, strides 1 and no padding, with 16-byte loads.
template <typename T, typename Acc, int Kind, bool VECTOR, bool SPLIT, int TILE_M = 128, int TILE_N = 128>
__global__ void __launch_bounds__(igemm::Threads<T, Kind, TILE_M, TILE_N>::value, igemm::MinBlocks<T, Kind, igemm::WGRAD, VECTOR, false, TILE_M, TILE_N>::value)
conv2d_backprop_filter_1x1_igemm(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                 T* __restrict__ filter_grad, Acc* __restrict__ partial,
                                 GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size,
                                 unsigned split_magic, int split_shift) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    int split;
    const index_t group = split_group<Kind, SPLIT>(splits, split_magic, split_shift, split);
    const index_t reduction = d.batch * d.out_rows * d.out_cols;
    PointwiseFilterGradProblem<T, Acc, SPLIT> prob;
    prob.m_size = static_cast<int>(d.filter_in_depth);
    prob.n_size = static_cast<int>(d.out_per_group());
    prob.k_begin = static_cast<int>(split * split_size);
    prob.k_end = static_cast<int>(min(reduction, (split + 1) * split_size));
    prob.input = input;
    prob.out_backprop = out_backprop;
    prob.dst = {filter_grad, SPLIT ? partial + split * d.filter_in_depth * d.out_depth : nullptr};
    prob.in_depth = d.in_depth;
    prob.out_depth = d.out_depth;
    prob.in_channel0 = group * d.filter_in_depth;
    prob.out_channel0 = group * d.out_per_group();
    igemm::run_cta<T, Acc, Kind, VECTOR, TILE_M, TILE_N>(prob);
}

// ---------------------------------------------------------------- the few-channel kernel
// conv2d_backprop_filter_few_channels: NHWC, one group, CIN <= 4 input channels (an image's 3 in
// a network's stem), T = __half or __nv_bfloat16, sm_80 and newer.  The GEMM is transposed from
// the general kernel's: D[k][tap] = sum over positions j of out_backprop[j][k] * x[j][tap], tap =
// (r * filter_cols + s) * CIN + c, so that out_backprop's contiguous channels are mma.sync's A
// rows and the gathered input its B columns, both staged in shared memory as [j][row] tiles
// (ldmatrix.trans).  Why a kernel of its own: the general kernel's 128 x 128 tile holds 147 x 64
// useful elements of the 7x7 stem in two tiles (29%), and its scalar gather (at the time this
// kernel was written, a decomposition of every element's tap and position: 3,558 instructions
// per warp per k-tile, sm_90; now the row table's, 352) still holds a 128 x 128 tile.  Here a CTA owns 64 out channels x 64 taps; each tap's (r, s, c) is decomposed once
// per CTA into a table of its offset and its row and column shifts, each position once per
// k-tile per thread, so a gathered element costs a (broadcast) table read, two bounds tests and
// a 2-byte load.  Thread t gathers position jj = t % 32 of the k-tile for the 16 taps of warp
// t / 32 and stores them as two 16-byte rows; out_backprop's rows are 16-byte loads.  Register-
// staged double buffering: the next k-tile's loads are in flight during the current one's
// mma.sync.  The reduction is split across CTAs (blockIdx.z) into a float scratch that
// split_reduce sums in order, as the general kernel's: bitwise deterministic.  The launcher
// checks out_depth % 8 == 0, 16-byte aligned arrays and 32-bit offsets inside an image.
#if GRADOPS_HAS_MMA_SM80  // this kernel is sm_80's and newer only
inline constexpr int kFewFilterOut = 64;       // out channels per CTA (mma M)
inline constexpr int kFewFilterTaps = 64;      // taps per CTA (mma N)
inline constexpr int kFewFilterBK = 32;        // positions per k-tile: two m16n8k16 k-steps
inline constexpr int kFewFilterThreads = 128;  // 4 warps, each 32 out channels x 32 taps
// 16 bytes of padding per shared-memory row (72 elements, 144 bytes): the 8 rows of an
// ldmatrix matrix, or 8 lanes' 16-byte stores to 8 rows, then start 4 banks apart and cover
// all 32 banks once (no conflicts).
inline constexpr int kFewFilterPad = 8;
// A tap past the filter's end gets this row shift: every position's row plus it is negative
// (the launcher keeps padded coordinates below 2^30), so the bounds test fails and it gathers 0.
inline constexpr int kFewFilterNoTap = -(1 << 30);

// One tap of the CTA's table: its offset in an image relative to a position's window origin, and
// its row and column shifts (r * dilation_rows, s * dilation_cols).
struct alignas(16) FewFilterTap {
    int offset, row, col, unused;
};

template <typename T, int CIN>
__global__ void __launch_bounds__(kFewFilterThreads)
conv2d_backprop_filter_few_channels(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                    T* __restrict__ filter_grad, float* __restrict__ partial,
                                    GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size) {
    static_assert(CIN >= 1 && CIN <= 4, "one to four input channels");
    constexpr int BK = kFewFilterBK, ROW = kFewFilterTaps + kFewFilterPad;
    static_assert(kFewFilterOut == kFewFilterTaps, "both tiles share the row length");
    constexpr int WARPS = kFewFilterThreads / 32;
    constexpr int GATHER = kFewFilterTaps / WARPS;  // taps a thread gathers per position: 16
    static_assert(BK == 32 && GATHER % 8 == 0, "a lane per position; whole 16-byte rows");
    constexpr int DY_CHUNKS = BK * kFewFilterOut / 8 / kFewFilterThreads;  // 16-byte loads per thread: 2
    __shared__ __align__(16) T xs[2][BK][ROW];  // gathered input [j][tap]
    __shared__ __align__(16) T dys[2][BK][ROW];  // out_backprop [j][k]
    __shared__ FewFilterTap table[kFewFilterTaps];

    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int taps = static_cast<int>(filter_rows * filter_cols) * CIN;
    const int tap0 = static_cast<int>(blockIdx.x) * kFewFilterTaps;
    const int k0 = static_cast<int>(blockIdx.y) * kFewFilterOut;
    const int depth = static_cast<int>(out_depth);
    const index_t split = blockIdx.z;
    const index_t reduction = batch * out_rows * out_cols;
    const int j_begin = static_cast<int>(split * split_size);
    const int j_end = static_cast<int>(min(reduction, (split + 1) * split_size));
    const int rows_in = static_cast<int>(in_rows), cols_in = static_cast<int>(in_cols);

    if (tid < kFewFilterTaps) {
        const int tap = tap0 + tid;
        FewFilterTap e{0, kFewFilterNoTap, 0, 0};
        if (tap < taps) {
            const int c = tap % CIN, rs = tap / CIN;
            const int s = rs % static_cast<int>(filter_cols), r = rs / static_cast<int>(filter_cols);
            e.row = r * static_cast<int>(dilation_rows);
            e.col = s * static_cast<int>(dilation_cols);
            e.offset = (e.row * cols_in + e.col) * CIN + c;
        }
        table[tid] = e;
    }
    const FastDiv div_q(static_cast<int>(out_cols)), div_p(static_cast<int>(out_rows));
    const index_t image = in_rows * in_cols * CIN;
    const int stride_r = static_cast<int>(stride_rows), stride_c = static_cast<int>(stride_cols);
    const int pad_t = static_cast<int>(pad_top), pad_l = static_cast<int>(pad_left);

    alignas(16) T gathered[GATHER];
    uint4 dy[DY_CHUNKS];
    // The k-tile at j0 into registers: this thread's position's GATHER taps, and its chunks of
    // out_backprop (chunk u = tid + i * THREADS: row u / 8, channels (u % 8) * 8 ..).
    auto load = [&](int j0) {
        const int j = j0 + lane;
        int q, p;
        const int n = div_p.divmod(div_q.divmod(j < j_end ? j : j_begin, q), p);
        const int h0 = p * stride_r - pad_t, w0 = q * stride_c - pad_l;
        // The window's origin (64-bit, possibly outside the image: only in-bounds taps read
        // through it) is opaque to the optimiser: otherwise it sinks the origin's 64-bit math
        // into every tap's predicated load, and each gathered element costs about 12
        // instructions instead of 7.
        const T* const window = opaque_value(input + n * image + (h0 * cols_in + w0) * CIN);
        // Past the end, out_backprop's rows are 0, but a clamped position's input may be inf or
        // NaN (0 * inf is NaN): gather 0 there too.
        const bool position_in = j < j_end;
#pragma unroll
        for (int u = 0; u < GATHER; ++u) {
            const FewFilterTap e = table[warp * GATHER + u];
            gathered[u] = from_acc<T, float>(0.0f);
            if (position_in && static_cast<unsigned>(h0 + e.row) < static_cast<unsigned>(rows_in) &&
                static_cast<unsigned>(w0 + e.col) < static_cast<unsigned>(cols_in))
                gathered[u] = igemm::load_readonly(window + e.offset);
        }
#pragma unroll
        for (int i = 0; i < DY_CHUNKS; ++i) {
            const int u = tid + i * kFewFilterThreads, row = u / 8, channel = k0 + u % 8 * 8;
            dy[i] = make_uint4(0, 0, 0, 0);
            if (j0 + row < j_end && channel < depth)
                dy[i] = *reinterpret_cast<const uint4*>(out_backprop + static_cast<index_t>(j0 + row) * depth + channel);
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int u = 0; u < GATHER; u += 8) ptx::st_shared_16(&xs[buf][lane][warp * GATHER + u], &gathered[u]);
#pragma unroll
        for (int i = 0; i < DY_CHUNKS; ++i) {
            const int u = tid + i * kFewFilterThreads;
            ptx::st_shared_16(&dys[buf][u / 8][u % 8 * 8], &dy[i]);
        }
    };

    // Warp patch: out channels wm .. wm + 31 (two m16 tiles) x taps wn .. wn + 31 (four n8 tiles).
    const int wm = (warp % 2) * 32, wn = (warp / 2) * 32;
    const int matrix = lane / 8, row = lane % 8;  // ldmatrix.x4: lane l addresses row l % 8 of matrix l / 8
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int jn = 0; jn < 4; ++jn)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][jn][r] = 0.0f;

    __syncthreads();  // the tap table
    if (j_begin < j_end) {
        load(j_begin);
        store(0);
    }
    __syncthreads();
    int buf = 0;
    for (int j0 = j_begin; j0 < j_end; j0 += BK, buf ^= 1) {
        const bool more = j0 + BK < j_end;
        if (more) load(j0 + BK);
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            // A (16 out channels x 16 positions) from the [j][k] tile, transposed: matrix q is
            // channels + 8 (q % 2), positions + 8 (q / 2), as in igemm::mma_cta.
            unsigned a[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                ptx::ldmatrix<4, true>(a[i], &dys[buf][kk + 8 * (matrix / 2) + row][wm + 16 * i + 8 * (matrix % 2)]);
            // B (16 positions x 8 taps), two n8 tiles per x4: matrix q is taps + 8 (q / 2),
            // positions + 8 (q % 2).
            unsigned b[4][2];
#pragma unroll
            for (int jn = 0; jn < 4; jn += 2) {
                unsigned t4[4];
                ptx::ldmatrix<4, true>(t4, &xs[buf][kk + 8 * (matrix % 2) + row][wn + 8 * jn + 8 * (matrix / 2)]);
                b[jn][0] = t4[0];
                b[jn][1] = t4[1];
                b[jn + 1][0] = t4[2];
                b[jn + 1][1] = t4[3];
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int jn = 0; jn < 4; ++jn) ptx::mma_m16n8k16<T>(acc[i][jn], a[i], b[jn], acc[i][jn]);
        }
        if (more) store(buf ^ 1);
        __syncthreads();  // the next tile is stored, and every warp is done reading this one
    }

    // C fragment: acc[i][jn][r] is out channel wm + 16 i + g + 8 (r / 2), tap wn + 8 jn + 2 t +
    // r % 2 (g = lane / 4, t = lane % 4); HWIO element tap * out_depth + channel.
    const int g = lane / 4, t = lane % 4;
    const index_t filter_elements = static_cast<index_t>(taps) * depth;
    float* const slice = splits > 1 ? partial + split * filter_elements : nullptr;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int jn = 0; jn < 4; ++jn)
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                const int channel = k0 + wm + 16 * i + g + 8 * (r / 2), tap = tap0 + wn + 8 * jn + 2 * t + r % 2;
                if (channel >= depth || tap >= taps) continue;
                const int e = tap * depth + channel;
                if (slice) slice[e] = acc[i][jn][r];
                else filter_grad[e] = from_acc<T, float>(acc[i][jn][r]);
            }
}
#endif  // GRADOPS_HAS_MMA_SM80

}  // namespace gradops
