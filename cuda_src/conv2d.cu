// Forward Conv2D: output[n][p][q][k] = sum over taps (r, s) and c < Cg of
//   input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols - pad_left][g * Cg + c]
//   * filter[r][s][c][k],   g = k / (out_depth / groups), Cg = filter_in_depth,
// input positions outside the image contributing zero.  The gradient kernels' adjoint: the GPU
// adjoint tests and ``python -m gradops check`` use it.
//
// * conv2d_direct: any layout and size, one thread per output element.
// * conv2d_igemm: NHWC implicit GEMM, M = batch x output positions, N = the group's out
//   channels, reduction over (r, s, c) with c fastest (the HWIO filter row index).
#include "igemm_tiles.cuh"

namespace gradops {

template <typename T, typename Acc, int L>
__global__ void conv2d_direct(const T* __restrict__ input, const T* __restrict__ filter,
                              T* __restrict__ output, GRADOPS_CONV_DIMS_PARAMS) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const Tensor4<L> in{d.in_rows, d.in_cols, d.in_depth};
    const Tensor4<L> out{d.out_rows, d.out_cols, d.out_depth};
    const index_t out_per_group = d.out_per_group();
    const index_t total = d.batch * d.out_rows * d.out_cols * d.out_depth;
    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        index_t n, p, q, k;
        out.coords(i, n, p, q, k);
        const index_t c0 = (k / out_per_group) * d.filter_in_depth;
        Acc acc = Acc(0);
        for (index_t r = 0; r < d.filter_rows; ++r) {
            const index_t h = p * d.stride_rows + r * d.dilation_rows - d.pad_top;
            if (h < 0 || h >= d.in_rows) continue;
            for (index_t s = 0; s < d.filter_cols; ++s) {
                const index_t w = q * d.stride_cols + s * d.dilation_cols - d.pad_left;
                if (w < 0 || w >= d.in_cols) continue;
                const T* f = filter + (r * d.filter_cols + s) * d.filter_in_depth * d.out_depth + k;
                for (index_t c = 0; c < d.filter_in_depth; ++c)
                    acc += to_acc<Acc>(input[in.offset(n, h, w, c0 + c)]) * to_acc<Acc>(f[c * d.out_depth]);
            }
        }
        output[i] = from_acc<T, Acc>(acc);
    }
}

// The implicit GEMM of one group, NHWC: m = (n, p, q) is the output row, kk = (r, s, c) the HWIO
// filter row, so A is the gathered input and B the filter as a [R*S*Cg, out_depth] matrix.
template <typename T, typename Acc> struct ForwardProblem {
    // input is contiguous along channels (the fastest part of kk); the filter along out channels (n).
    static constexpr bool A_K_CONTIG = true;
    static constexpr bool B_K_CONTIG = false;

    int m_size, n_size, k_begin, k_end;
    igemm::InputOperand<T> x;  // A[m][kk] = x's element (tap kk, position m)
    const T* __restrict__ filter;
    T* __restrict__ output;
    index_t out_depth, out_channel0;

    using ARow = typename igemm::InputOperand<T>::PositionRow;
    using BRow = igemm::ChannelRow;
    __device__ __forceinline__ ARow a_row(int m) const { return x.position_row(m); }
    __device__ __forceinline__ BRow b_row(int n) const { return {static_cast<int>(out_channel0) + n}; }
    using KPos = typename igemm::InputOperand<T>::Tap;
    __device__ __forceinline__ KPos k_pos(int kk) const { return x.tap(kk); }
    __device__ __forceinline__ void k_advance(KPos& pos, const KPos& step) const { x.advance(pos, step); }
    __device__ __forceinline__ igemm::Src<T> a_src(const ARow& row, const KPos& tap, int) const {
        return x.gather(row, tap);
    }
    __device__ __forceinline__ igemm::Src<T> b_src(const BRow& row, const KPos&, int kk) const {
        return {filter + static_cast<index_t>(kk) * out_depth + row.offset, true};
    }
    __device__ __forceinline__ const T* a_base() const { return x.input; }
    __device__ __forceinline__ const T* b_base() const { return filter; }
    __device__ __forceinline__ index_t out_row(int m) const { return static_cast<index_t>(m) * out_depth + out_channel0; }
    __device__ __forceinline__ void store_at(index_t row, int n, Acc v) const { output[row + n] = from_acc<T, Acc>(v); }
    __device__ __forceinline__ void store_chunk(index_t row, int n, const float (&v)[8]) const {
        igemm::store_chunk8(output + row + n, v);
    }
    __device__ __forceinline__ void store(int m, int n, Acc v) const { store_at(out_row(m), n, v); }
};

// grid: (ceil(batch * out_rows * out_cols / BM), ceil(out_depth / groups / BN), groups).
// VECTOR: 16-byte loads (filter_in_depth and out_per_group multiples of 16 / sizeof(T), pointers
// 16-byte aligned).
template <typename T, typename Acc, int Kind, bool VECTOR>
__global__ void __launch_bounds__(igemm::Threads<T, Kind>::value, igemm::MinBlocks<T, Kind, igemm::FORWARD, VECTOR>::value)
conv2d_igemm(const T* __restrict__ input, const T* __restrict__ filter, T* __restrict__ output,
             GRADOPS_CONV_DIMS_PARAMS) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const index_t group = blockIdx.z;
    ForwardProblem<T, Acc> prob;
    prob.m_size = static_cast<int>(d.batch * d.out_rows * d.out_cols);
    prob.n_size = static_cast<int>(d.out_per_group());
    prob.k_begin = 0;
    prob.k_end = static_cast<int>(d.filter_rows * d.filter_cols * d.filter_in_depth);
    prob.x = igemm::InputOperand<T>(input, d, group);
    prob.filter = filter;
    prob.output = output;
    prob.out_depth = d.out_depth;
    prob.out_channel0 = group * d.out_per_group();
    igemm::run_cta<T, Acc, Kind, VECTOR>(prob);
}

}  // namespace gradops
