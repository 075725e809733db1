// FractionalMaxPoolGrad in two gather passes, without atomics: one fixed order per element.
//
// Shapes (NHWC only: the op has no data_format):
//   orig_input, in_backprop     [batch, in_rows, in_cols, depth]
//   orig_output, out_backprop   [batch, out_rows, out_cols, depth]
// Cell tables (built on the host from the validated geometry, element type I as the indices):
//   row_bounds  [2 * out_rows]   first and last input row of each row cell (inclusive; every
//                                cell is non-empty: the geometry refuses empty ones, as TF does)
//   row_offsets [in_rows + 1]    input row y lies in the row cells
//   row_cells   [entries]        row_cells[row_offsets[y] .. row_offsets[y + 1]), increasing
//   col_bounds, col_offsets, col_cells: the same for columns.
//
// What is computed (TF's fractional_max_pool_op.cc).  Per output element (n, r, q, c), TF scans
// its cell row by row, each row left to right, takes the first element and replaces the choice
// by a later element only if `chosen < element` (T's own comparison).  Ties therefore go to the
// first maximum in that order; a NaN is chosen only as the first element, and then kept.  TF
// refuses the call unless every recomputed maximum == orig_output (so a NaN maximum is always
// refused).  Then it adds out_backprop to the chosen elements in output order, in T.
//
// * fractional_max_pool_select: one thread per output element repeats TF's scan, stores the
//   chosen element's flat input offset, and sets *mismatch = 1 (a plain store: every writer
//   writes the same value) where the maximum differs from orig_output.  The launcher reads the
//   flag back and refuses the call, as TF does.
// * fractional_max_pool_gather: one thread per input element sums, over the cells containing it
//   in increasing (row cell, column cell) order, which is increasing output offset, the
//   out_backprop elements whose chosen offset is its own.  Each sum is TF's, term by term in
//   TF's order, starting from zero, in T (float for the half types, rounded once).
//
// Indices are I: int when every tensor and table has fewer than 2^31 elements, else long long.
// Grid-stride loops never step past `total` (no signed overflow near 2^31).
#include "gradops_common.cuh"

namespace gradops {
namespace fractional_max {

template <typename T> struct Acc { typedef T type; };
template <> struct Acc<__half> { typedef float type; };
template <> struct Acc<__nv_bfloat16> { typedef float type; };

// Values compared in a type that orders them exactly as T does (the half types widen exactly).
template <typename T> __device__ __forceinline__ typename Acc<T>::type widen(T x) {
    return to_acc<typename Acc<T>::type, T>(x);
}

template <typename I> __device__ __forceinline__ I next(I i, I stride, I total) {
    return total - i > stride ? i + stride : total;
}

}  // namespace fractional_max

template <typename T, typename I>
__global__ void fractional_max_pool_select(const T* __restrict__ orig_input, const T* __restrict__ orig_output,
                                           I* __restrict__ chosen, int* __restrict__ mismatch,
                                           const I* __restrict__ row_bounds, const I* __restrict__ col_bounds,
                                           I batch, I in_rows, I in_cols, I depth, I out_rows, I out_cols) {
    using namespace fractional_max;
    const I total = batch * out_rows * out_cols * depth;
    const I stride = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
    for (I o = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
         o < total; o = next(o, stride, total)) {
        I rest = o;
        const I c = rest % depth; rest /= depth;
        const I q = rest % out_cols; rest /= out_cols;
        const I r = rest % out_rows;
        const I n = rest / out_rows;
        const I y0 = row_bounds[2 * r], y1 = row_bounds[2 * r + 1];
        const I x0 = col_bounds[2 * q], x1 = col_bounds[2 * q + 1];
        I best = ((n * in_rows + y0) * in_cols + x0) * depth + c;
        auto best_value = widen(orig_input[best]);
        for (I y = y0; y <= y1; ++y) {
            const I row = (n * in_rows + y) * in_cols;
            for (I x = (y == y0 ? x0 + 1 : x0); x <= x1; ++x) {
                const I offset = (row + x) * depth + c;
                const auto value = widen(orig_input[offset]);
                if (best_value < value) {  // TF's test: strictly greater, NaN never
                    best_value = value;
                    best = offset;
                }
            }
        }
        chosen[o] = best;
        if (!(best_value == widen(orig_output[o]))) *mismatch = 1;
    }
}

template <typename T, typename I>
__global__ void fractional_max_pool_gather(const T* __restrict__ out_backprop, const I* __restrict__ chosen,
                                           T* __restrict__ in_backprop,
                                           const I* __restrict__ row_offsets, const I* __restrict__ row_cells,
                                           const I* __restrict__ col_offsets, const I* __restrict__ col_cells,
                                           I batch, I in_rows, I in_cols, I depth, I out_rows, I out_cols) {
    using namespace fractional_max;
    typedef typename Acc<T>::type A;
    const I total = batch * in_rows * in_cols * depth;
    const I stride = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
    for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
         i < total; i = next(i, stride, total)) {
        I rest = i;
        const I c = rest % depth; rest /= depth;
        const I x = rest % in_cols; rest /= in_cols;
        const I y = rest % in_rows;
        const I n = rest / in_rows;
        A sum = A(0);
        for (I rk = row_offsets[y]; rk < row_offsets[y + 1]; ++rk) {
            const I base = (n * out_rows + row_cells[rk]) * out_cols;
            for (I qk = col_offsets[x]; qk < col_offsets[x + 1]; ++qk) {
                const I o = (base + col_cells[qk]) * depth + c;
                if (chosen[o] == i) sum += to_acc<A, T>(out_backprop[o]);
            }
        }
        in_backprop[i] = from_acc<T, A>(sum);
    }
}

}  // namespace gradops
