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
#include "igemm_tiles.cuh"

namespace gradops {

// Threads of the direct kernel; a power of two for the tree reduction (the launcher uses the
// same number, FILTER_DIRECT_THREADS in the launcher).
constexpr int kFilterDirectThreads = 128;

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
        if (threadIdx.x == 0) filter_grad[e] = from_acc<T, Acc>(partial[0]);
        __syncthreads();  // partial[0] is read before the next element overwrites it
    }
}

// The implicit GEMM seen by igemm::run_cta (NHWC).  m = (r * filter_cols + s) * Cg + c is the
// HWIO row, so C[m][n] lands at m * out_depth + group's first channel + n.
template <typename T, typename Acc> struct FilterGradProblem {
    // input is contiguous along channels (m), out_backprop along out channels (n).
    static constexpr bool A_K_CONTIG = false;
    static constexpr bool B_K_CONTIG = false;

    int m_size, n_size, k_begin, k_end;
    igemm::InputOperand<T> x;  // A[m][j] = x's element (tap m, position j)
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc> dst;  // the filter gradient, or this split's slice of the scratch
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
    __device__ __forceinline__ index_t out_row(int m) const { return static_cast<index_t>(m) * out_depth + out_channel0; }
    __device__ __forceinline__ void store_at(index_t row, int n, Acc v) const { dst.at(row + n, v); }
    __device__ __forceinline__ void store_chunk(index_t row, int n, const float (&v)[8]) const { dst.chunk(row + n, v); }
    __device__ __forceinline__ void store(int m, int n, Acc v) const { store_at(out_row(m), n, v); }
};

// grid: (ceil(M / BM), ceil(out_per_group / BN), groups * splits).  Split z covers reduction
// indices [z * split_size, (z + 1) * split_size); with splits > 1 it writes partial sums to
// partial[z][filter element] instead of filter_grad.
// VECTOR: 16-byte loads (filter_in_depth and out_per_group multiples of 16 / sizeof(T), pointers
// 16-byte aligned).
template <typename T, typename Acc, int Kind, bool VECTOR>
__global__ void __launch_bounds__(igemm::Threads<T, Kind>::value, igemm::MinBlocks<T, Kind, igemm::WGRAD, VECTOR>::value)
conv2d_backprop_filter_igemm(const T* __restrict__ input, const T* __restrict__ out_backprop,
                             T* __restrict__ filter_grad, Acc* __restrict__ partial,
                             GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const index_t group = blockIdx.z / splits, split = blockIdx.z % splits;
    const index_t reduction = d.batch * d.out_rows * d.out_cols;
    FilterGradProblem<T, Acc> prob;
    prob.m_size = static_cast<int>(d.filter_rows * d.filter_cols * d.filter_in_depth);
    prob.n_size = static_cast<int>(d.out_per_group());
    prob.k_begin = static_cast<int>(split * split_size);
    prob.k_end = static_cast<int>(min(reduction, (split + 1) * split_size));
    prob.x = igemm::InputOperand<T>(input, d, group);
    prob.out_backprop = out_backprop;
    prob.dst = {filter_grad, splits > 1 ? partial + split * d.filter_rows * d.filter_cols * d.filter_in_depth *
                                                    d.out_depth
                                        : nullptr};
    prob.out_depth = d.out_depth;
    prob.out_channel0 = group * d.out_per_group();
    igemm::run_cta<T, Acc, Kind, VECTOR>(prob);
}

// The GEMM of conv2d_backprop_filter_1x1_igemm (NHWC): with a 1x1 filter at stride 1 and no
// padding, position j reads input row j, so A[c][j] = input[j][group's channel c] and
// B[j][k] = out_backprop[j][k]: both operands are plain row-major matrices contiguous along
// their rows.  The reduction cursor is two row pointers, advanced by one 64-bit add each.
template <typename T, typename Acc> struct PointwiseFilterGradProblem {
    static constexpr bool A_K_CONTIG = false;
    static constexpr bool B_K_CONTIG = false;

    int m_size, n_size, k_begin, k_end;
    const T* __restrict__ input;
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc> dst;  // the filter gradient, or this split's slice of the scratch
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

// grid and splits as for conv2d_backprop_filter_igemm; the launcher takes it for
// filter_rows == filter_cols == 1, strides 1 and no padding, with 16-byte loads.
template <typename T, typename Acc, int Kind, bool VECTOR>
__global__ void __launch_bounds__(igemm::Threads<T, Kind>::value, igemm::MinBlocks<T, Kind, igemm::WGRAD, VECTOR>::value)
conv2d_backprop_filter_1x1_igemm(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                 T* __restrict__ filter_grad, Acc* __restrict__ partial,
                                 GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const index_t group = blockIdx.z / splits, split = blockIdx.z % splits;
    const index_t reduction = d.batch * d.out_rows * d.out_cols;
    PointwiseFilterGradProblem<T, Acc> prob;
    prob.m_size = static_cast<int>(d.filter_in_depth);
    prob.n_size = static_cast<int>(d.out_per_group());
    prob.k_begin = static_cast<int>(split * split_size);
    prob.k_end = static_cast<int>(min(reduction, (split + 1) * split_size));
    prob.input = input;
    prob.out_backprop = out_backprop;
    prob.dst = {filter_grad, splits > 1 ? partial + split * d.filter_in_depth * d.out_depth : nullptr};
    prob.in_depth = d.in_depth;
    prob.out_depth = d.out_depth;
    prob.in_channel0 = group * d.filter_in_depth;
    prob.out_channel0 = group * d.out_per_group();
    igemm::run_cta<T, Acc, Kind, VECTOR>(prob);
}

}  // namespace gradops
