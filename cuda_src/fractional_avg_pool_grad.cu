// FractionalAvgPoolGrad as a gather: one thread per input-gradient element adds the share of
// every pooling cell that contains it.  No atomics; one fixed order per element.
//
// Shapes (NHWC only: the op has no data_format):
//   out_backprop  [batch, out_rows, out_cols, depth]
//   in_backprop   [batch, in_rows, in_cols, depth]
// Cell tables (int64, built on the host from the validated pooling sequences):
//   row_cell_offsets [in_rows + 1]  input row y lies in the row cells
//   row_cells        [entries]        row_cells[row_cell_offsets[y] .. row_cell_offsets[y + 1]),
//                                     listed in increasing cell order (sequences need not be
//                                     ordered: row y may lie in cells 0 and 2 but not 1; a cell
//                                     that TF's clamping leaves empty is in no list)
//   row_cell_sizes   [out_rows]       rows in each row cell
//   col_cell_offsets [in_cols + 1], col_cells, col_cell_sizes [out_cols]: the same for columns.
//
// TF (fractional_avg_pool_op.cc) divides each out_backprop element by its cell's size in
// double and adds the shares to a zeroed double buffer, cell by cell in row-cell-major order,
// then casts once to the output type (static_cast: integers truncate toward zero).  Each
// element here adds the same shares in that same order, so every sum rounds exactly as TF's
// does; this matters for integers: TF's (1 + 1/3) + 2/3 is 2.0 and truncates to 2, while
// (1 + 2/3) + 1/3 is 1.9999999999999998 and would truncate to 1.
#include "gradops_common.cuh"

namespace gradops {

// Element <-> double, correctly rounded on the way back (the half types round once from
// double, not through float).
template <typename T> __device__ __forceinline__ double load_as_double(T x) { return static_cast<double>(x); }
template <> __device__ __forceinline__ double load_as_double<__half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ double load_as_double<__nv_bfloat16>(__nv_bfloat16 x) {
    return __bfloat162float(x);
}

template <typename T> __device__ __forceinline__ T store_from_double(double x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half store_from_double<__half>(double x) { return __double2half(x); }
template <> __device__ __forceinline__ __nv_bfloat16 store_from_double<__nv_bfloat16>(double x) {
    return __double2bfloat16(x);
}

// Acc is double for every T: TF sums in double whatever the dtype, and integer results are
// only TF's when each share and partial sum rounds as a double.
template <typename T, typename Acc>
__global__ void fractional_avg_pool_grad(
    const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    const index_t* __restrict__ row_cell_offsets, const index_t* __restrict__ row_cells,
    const index_t* __restrict__ row_cell_sizes, const index_t* __restrict__ col_cell_offsets,
    const index_t* __restrict__ col_cells, const index_t* __restrict__ col_cell_sizes,
    index_t batch, index_t in_rows, index_t in_cols, index_t depth, index_t out_rows, index_t out_cols) {
    const Tensor4<NHWC> in{in_rows, in_cols, depth};
    const Tensor4<NHWC> out{out_rows, out_cols, depth};
    const index_t total = batch * in_rows * in_cols * depth;

    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        index_t n, y, x, c;
        in.coords(i, n, y, x, c);  // i is also (n, y, x, c)'s offset in in_backprop
        const index_t col_begin = col_cell_offsets[x], col_end = col_cell_offsets[x + 1];
        const index_t row_end = row_cell_offsets[y + 1];

        Acc sum = Acc(0);
        for (index_t r = row_cell_offsets[y]; r < row_end; ++r) {
            const index_t row_cell = row_cells[r];
            for (index_t k = col_begin; k < col_end; ++k) {
                const index_t col_cell = col_cells[k];
                // The cell size is an exact integer in double (below 2^53), as TF's is.
                const Acc cell_size = static_cast<Acc>(row_cell_sizes[row_cell] * col_cell_sizes[col_cell]);
                sum += load_as_double(out_backprop[out.offset(n, row_cell, col_cell, c)]) / cell_size;
            }
        }
        in_backprop[i] = store_from_double<T>(sum);
    }
}

}  // namespace gradops
