// DepthwiseConv2dNativeBackpropFilter: filter_grad[r][s][c][m] = sum over n, p, q of
//   input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols - pad_left][c]
//   * out_backprop[n][p][q][c * M + m],
// input positions outside the image contributing nothing (their taps are skipped, so an Inf or
// NaN never meets a padded zero).  The filter gradient [R, S, C, M] in memory is
// [tap = r * S + s][k = c * M + m], the out_backprop channel order.
//
// Two kernels, no floating-point atomics, so every bit of the result is reproducible:
// * ..._partial: the batch x output rows (n, p) are cut into ``slices`` fixed runs of
//   ``rows_per_slice``; one thread per (slice, tap, k) sums its run in a fixed order into
//   partial[slice][tap][k] (float, double for float64).  A warp takes 32 consecutive k (a
//   channel group, the last one padded with idle lanes) of one tap, and consecutive warps the
//   taps of one group: NHWC reads of out_backprop are coalesced, and the 8 warps of a 256-thread
//   block, 8 taps of the same channels and rows, read the same out_backprop sectors and
//   overlapping input rows, which L1 can serve once (not measured yet; k fastest over all of
//   out_depth instead put a block on one or two taps wherever out_depth >= 128, and each tap
//   re-read out_backprop from L2).
// * ..._reduce: one thread per filter element adds the slices' partial sums in slice order
//   and rounds once to T.
// The launcher (gradops/backends/cuda/depthwise_conv2d_native_backprop_filter.py) picks the
// slicing from the geometry alone (never from the GPU), and I = int where every index and
// offset fits in 32 bits (cheaper division and address math), else long long.
#include "gradops_common.cuh"

namespace gradops {

template <int L, typename I> struct DwTensor {
    I rows, cols, depth;
    __device__ __forceinline__ I offset(I n, I y, I x, I c) const {
        return L == NHWC ? ((n * rows + y) * cols + x) * depth + c : ((n * depth + c) * rows + y) * cols + x;
    }
};

template <typename T, typename Acc, int L, typename I>
__global__ void depthwise_conv2d_native_backprop_filter_partial(
        const T* __restrict__ input, const T* __restrict__ out_backprop, Acc* __restrict__ partial,
        long long batch_, long long in_rows_, long long in_cols_, long long in_depth_, long long multiplier_,
        long long out_rows_, long long out_cols_, long long filter_rows_, long long filter_cols_,
        long long stride_rows_, long long stride_cols_, long long dilation_rows_, long long dilation_cols_,
        long long pad_top_, long long pad_left_, long long slices_, long long rows_per_slice_) {
    const I batch = static_cast<I>(batch_), in_rows = static_cast<I>(in_rows_), in_cols = static_cast<I>(in_cols_);
    const I in_depth = static_cast<I>(in_depth_), multiplier = static_cast<I>(multiplier_);
    const I out_rows = static_cast<I>(out_rows_), out_cols = static_cast<I>(out_cols_);
    const I filter_cols = static_cast<I>(filter_cols_);
    const I stride_rows = static_cast<I>(stride_rows_), stride_cols = static_cast<I>(stride_cols_);
    const I dilation_rows = static_cast<I>(dilation_rows_), dilation_cols = static_cast<I>(dilation_cols_);
    const I pad_top = static_cast<I>(pad_top_), pad_left = static_cast<I>(pad_left_);
    const I rows_per_slice = static_cast<I>(rows_per_slice_);
    const I out_depth = in_depth * multiplier;
    const I taps = static_cast<I>(filter_rows_) * filter_cols;
    constexpr int kGroup = 32;  // k per channel group: one warp
    const I groups = (out_depth + kGroup - 1) / kGroup;
    const I total = static_cast<I>(slices_) * groups * taps * kGroup;
    const I all_rows = batch * out_rows;
    const DwTensor<L, I> in{in_rows, in_cols, in_depth};
    const DwTensor<L, I> out{out_rows, out_cols, out_depth};

    for (I e = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); e < total;
         e += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x)) {
        const I lane = e % kGroup, rest = e / kGroup;
        const I tap = rest % taps, group_slice = rest / taps;
        const I group = group_slice % groups, slice = group_slice / groups;
        const I k = group * kGroup + lane;
        if (k >= out_depth) continue;  // the last group's idle lanes
        const I r = tap / filter_cols, s = tap % filter_cols;
        const I c = k / multiplier;
        const I row_offset = r * dilation_rows - pad_top;
        const I col_offset = s * dilation_cols - pad_left;
        // Output columns q whose input column q * stride + col_offset lies in [0, in_cols),
        // in closed form: the inner loop then has no bounds test.
        const I q_begin = col_offset < 0 ? (-col_offset + stride_cols - 1) / stride_cols : I(0);
        const I last_col = in_cols - 1 - col_offset;
        const I q_end = last_col < 0 ? I(0) : min(out_cols, last_col / stride_cols + 1);
        const I first = slice * rows_per_slice;
        const I stop = min(all_rows, first + rows_per_slice);

        Acc acc = Acc(0);
        for (I row = first; row < stop; ++row) {
            const I p = row % out_rows, n = row / out_rows;
            const I h = p * stride_rows + row_offset;
            if (h < 0 || h >= in_rows) continue;
            for (I q = q_begin; q < q_end; ++q) {
                const I w = q * stride_cols + col_offset;
                acc += to_acc<Acc>(input[in.offset(n, h, w, c)]) * to_acc<Acc>(out_backprop[out.offset(n, p, q, k)]);
            }
        }
        partial[(slice * taps + tap) * out_depth + k] = acc;
    }
}

// filter_grad[e] = sum over z in [0, slices) of partial[z * elements + e], in that order.
template <typename T, typename Acc>
__global__ void depthwise_conv2d_native_backprop_filter_reduce(const Acc* __restrict__ partial,
                                                                T* __restrict__ filter_grad, long long elements,
                                                                long long slices) {
    GRADOPS_GRID_STRIDE_LOOP(e, elements) {
        Acc acc = partial[e];
        // Unrolled so that 16 loads are in flight at once (the sums stay in slice order): a
        // filter element sums hundreds of slices, and the grid is only taps x out_depth threads,
        // too few to hide a DRAM round trip per 4 loads.
#pragma unroll 16
        for (index_t z = 1; z < slices; ++z) acc += partial[z * elements + e];
        filter_grad[e] = from_acc<T, Acc>(acc);
    }
}

}  // namespace gradops
