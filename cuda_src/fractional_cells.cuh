// The one work split of the fractional pooling gradients' cells kernels
// (fractional_avg_pool_grad_cells, fractional_max_pool_grad_cells), which take pooling cells that
// partition the input, and of the forward poolings (fractional_pool.cu), which take any cells: a
// thread per (batch item, cell column, vector of V channels) walks down a
// chunk of chunk_rows cell rows.  threadIdx.x is the vector within the block's blockDim.x (a
// power of two dividing the vectors, so no lane is idle), threadIdx.y the cell column among the
// flattened (batch item, cell column) pairs, blockIdx.y the chunk of cell rows and blockIdx.z the
// block of channels; each grid dimension is strided, so any size is covered.  The launcher's
// cells_plan and cells_scalars (gradops/backends/cuda/fractional_avg_pool_grad.py) give the sizes.
#pragma once

#include "gradops_common.cuh"

namespace gradops {
namespace fractional_cells {

// Calls work(n, c, ch, r0, r1) for each (batch item n, cell column c, first channel ch) this
// thread owns, with its chunk of cell rows r0 .. r1 - 1.  The flattened column j splits into
// (n, c) by the host's multiply-shift (out_cols_magic, out_cols_shift) for 32-bit indices
// (j < 2^31), by a division for 64-bit ones.
template <typename I, int V, typename Work>
__device__ __forceinline__ void for_each_cell_column(I depth, I out_rows, I out_cols, I columns, I column_blocks,
                                                     I row_chunks, I channel_blocks, unsigned out_cols_magic,
                                                     int out_cols_shift, int chunk_rows, Work&& work) {
    for (I bz = blockIdx.z; bz < channel_blocks; bz += gridDim.z) {
        const I ch = (bz * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x)) * V;
        for (I by = blockIdx.y; by < row_chunks; by += gridDim.y) {
            const I r0 = by * chunk_rows;
            const I r1 = min(r0 + chunk_rows, out_rows);
            for (I bx = blockIdx.x; bx < column_blocks; bx += gridDim.x) {
                const I j = bx * static_cast<I>(blockDim.y) + static_cast<I>(threadIdx.y);
                if (j >= columns || ch >= depth) continue;
                I n;
                if constexpr (sizeof(I) == 4) {
                    n = magic_divide(j, out_cols_magic, out_cols_shift);
                } else {
                    n = j / out_cols;
                }
                work(n, j - n * out_cols, ch, r0, r1);
            }
        }
    }
}

}  // namespace fractional_cells
}  // namespace gradops
