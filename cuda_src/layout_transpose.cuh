// Batched transposes between NCHW and NHWC: dst[n][j][i] = src[n][i][j] for i < rows, j < cols.
// NCHW -> NHWC is (rows, cols) = (channels, image positions); NHWC -> NCHW is (image positions,
// channels).  The depthwise input gradient's opt-in "transpose" path runs NCHW as NHWC between
// two of them (gradops/backends/cuda/depthwise_conv2d_native_backprop_input.py).
//
// Only bits move, so there is one instantiation per element width: W is an unsigned integer as
// wide as the element (unsigned short, unsigned, unsigned long long), and -0.0, NaN payloads and
// subnormals come through unchanged.
//
// A CTA moves one kTile x kTile tile at a time through shared memory: its warps read tile rows
// (kTile consecutive elements of a src row each: 64 bytes for 16-bit elements, two whole
// sectors), and after a barrier write tile columns as dst rows (consecutive again).  A thread
// issues all of its kSteps loads before its first shared-memory store, so a warp has kSteps
// loads in flight.  The tile is padded by one column: a warp reading a tile column (tile[lane][j])
// then touches 32 distinct banks for 2- and 4-byte W, and for 8-byte W each half-warp phase
// touches 16 distinct bank pairs.
//
// 16-bit elements in pairs (transpose_batched_pairs): where rows and cols are even and both arrays
// 4-byte aligned (the launcher checks), every access moves a 32-bit word of two elements, so a
// warp reads and writes 128 contiguous bytes and each thread has half the instructions per
// element.  A tile is then 64 x 64 elements: a src row's 32 words as the warp's 32 lanes; a dst
// word packs the same column of two consecutive src rows.  Its shared tile is unpadded and
// swizzled instead (see there).
//
// Index width: I = int when batch * rows * cols < 2^31 (32-bit offsets), else long long.  The
// grid is (column tiles, row tiles, batch items), each dimension grid-strided, so any size is
// covered whatever the launcher caps the grid at.
#pragma once

#include "gradops_common.cuh"

namespace gradops {
namespace layout {

// Elements per tile side: a warp's lanes span one tile row.
inline constexpr int kTile = 32;
// Warps per CTA (blockDim = (kTile, kBlockRows)); each thread moves kSteps elements each way.
inline constexpr int kBlockRows = 4;
inline constexpr int kSteps = kTile / kBlockRows;

// Calls work(n, i0, j0, full) for each TILE x TILE tile of the batch of rows x cols matrices that
// this block owns (batch item n, first row i0, first column j0), every grid dimension strided;
// full: the tile lies wholly inside its matrix (block-uniform: such a tile needs no test per
// element).
template <int TILE, typename I, typename Work>
__device__ __forceinline__ void for_each_tile(I batch, I rows, I cols, I row_tiles, I col_tiles, Work&& work) {
    for (I n = blockIdx.z; n < batch; n += gridDim.z) {
        for (I rt = blockIdx.y; rt < row_tiles; rt += gridDim.y) {
            const I i0 = rt * TILE;
            for (I ct = blockIdx.x; ct < col_tiles; ct += gridDim.x) {
                const I j0 = ct * TILE;
                work(n, i0, j0, i0 + TILE <= rows && j0 + TILE <= cols);
            }
        }
    }
}

}  // namespace layout

// W: an unsigned integer of the element's width; I: int or long long (see the header comment).
template <typename W, typename I>
__global__ void __launch_bounds__(layout::kTile * layout::kBlockRows)
transpose_batched(const W* __restrict__ src, W* __restrict__ dst, I batch, I rows, I cols, I row_tiles,
                  I col_tiles) {
    using namespace layout;
    __shared__ W tile[kTile][kTile + 1];
    const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
    const I plane = rows * cols;
    // Element k of a thread's kSteps lies kBlockRows rows below element k - 1, in src and in dst.
    const I src_step = kBlockRows * cols, dst_step = kBlockRows * rows;
    for_each_tile<kTile>(batch, rows, cols, row_tiles, col_tiles, [&](const I n, const I i0, const I j0, const bool full) {
        {  // read: lanes along a src row, this thread's rows i0 + ty + k kBlockRows
            const W* const p = src + n * plane + (i0 + ty) * cols + (j0 + tx);
            W v[kSteps];
            if (full) {
#pragma unroll
                for (int k = 0; k < kSteps; ++k) v[k] = p[k * src_step];
            } else {
                const bool column = j0 + tx < cols;
#pragma unroll
                for (int k = 0; k < kSteps; ++k) {
                    v[k] = column && i0 + ty + k * kBlockRows < rows ? p[k * src_step] : W(0);
                }
            }
#pragma unroll
            for (int k = 0; k < kSteps; ++k) tile[ty + k * kBlockRows][tx] = v[k];
        }
        __syncthreads();  // the tile is staged
        {  // write: lanes along a dst row (src column i0 + tx), dst rows j0 + ty + k kBlockRows
            W* const p = dst + n * plane + (j0 + ty) * rows + (i0 + tx);
            if (full) {
#pragma unroll
                for (int k = 0; k < kSteps; ++k) p[k * dst_step] = tile[tx][ty + k * kBlockRows];
            } else if (i0 + tx < rows) {
#pragma unroll
                for (int k = 0; k < kSteps; ++k) {
                    if (j0 + ty + k * kBlockRows < cols) p[k * dst_step] = tile[tx][ty + k * kBlockRows];
                }
            }
        }
        __syncthreads();  // every thread has read the tile before the next one is staged
    });
}

// The paired form for 16-bit elements (see the header comment): src [batch, rows, cols] and dst
// [batch, cols, rows] as 32-bit words, rows and cols even (element counts), both 4-byte aligned.
template <typename I>
__global__ void __launch_bounds__(layout::kTile * layout::kBlockRows)
transpose_batched_pairs(const unsigned* __restrict__ src, unsigned* __restrict__ dst, I batch, I rows, I cols,
                        I row_tiles, I col_tiles) {
    using namespace layout;
    constexpr int kElements = 2 * kTile;              // elements per tile side (64)
    constexpr int kPairSteps = kElements / kBlockRows;  // src rows a thread reads, dst rows it writes
    // Loads in flight per thread: all of them with 32-bit offsets; half with 64-bit ones, whose
    // addresses take twice the registers (all 16 at once took 254 registers on sm_100).
    constexpr int kLoadBatch = sizeof(I) == 4 ? kPairSteps : kPairSteps / 2;
    // Src row r's word w lies at tile[r][w ^ swizzle(r)], swizzle(r) = (r / 2) % 32: a warp storing
    // one src row touches 32 distinct banks, and lane m reading rows 2m and 2m + 1 (both swizzled
    // by m) at one word touches 32 distinct banks too; a 33-word pitch would leave that read 2-way
    // conflicted (rows 2m and 2m + 32 share a bank).
    __shared__ unsigned tile[kElements][kTile];
    const int tx = static_cast<int>(threadIdx.x), ty = static_cast<int>(threadIdx.y);
    const I src_words = cols / 2, dst_words = rows / 2, plane = src_words * rows;
    const I src_step = kBlockRows * src_words, dst_step = kBlockRows * dst_words;
    // A dst row c (a src column) takes half c % 2 of its words; c = ty + k kBlockRows keeps ty's parity.
    const int shift = 16 * (ty & 1);
    for_each_tile<kElements>(batch, rows, cols, row_tiles, col_tiles,
                             [&](const I n, const I i0, const I j0, const bool full) {
        {  // read: lanes along a src row's words, this thread's rows i0 + ty + k kBlockRows
            const unsigned* const p = src + n * plane + (i0 + ty) * src_words + (j0 / 2 + tx);
            const bool column = j0 + 2 * tx < cols;
#pragma unroll 1
            for (int b = 0; b < kPairSteps; b += kLoadBatch) {
                unsigned v[kLoadBatch];
                if (full) {
#pragma unroll
                    for (int k = 0; k < kLoadBatch; ++k) v[k] = p[(b + k) * src_step];
                } else {
#pragma unroll
                    for (int k = 0; k < kLoadBatch; ++k) {
                        v[k] = column && i0 + ty + (b + k) * kBlockRows < rows ? p[(b + k) * src_step] : 0u;
                    }
                }
#pragma unroll
                for (int k = 0; k < kLoadBatch; ++k) {
                    const int r = ty + (b + k) * kBlockRows;
                    tile[r][tx ^ ((r >> 1) & (kTile - 1))] = v[k];
                }
            }
        }
        __syncthreads();  // the tile is staged
        {  // write: lane m packs src rows i0 + 2m and i0 + 2m + 1 of dst rows j0 + ty + k kBlockRows
            unsigned* const p = dst + n * plane + (j0 + ty) * dst_words + (i0 / 2 + tx);
            // Dst row c's word of src rows 2m and 2m + 1 (swizzle(2m) = swizzle(2m + 1) = m).
            const auto word = [&](int c) {
                const int w = (c >> 1) ^ tx;
                return ((tile[2 * tx][w] >> shift) & 0xffffu) | ((tile[2 * tx + 1][w] >> shift) << 16);
            };
            if (full) {
#pragma unroll
                for (int k = 0; k < kPairSteps; ++k) p[k * dst_step] = word(ty + k * kBlockRows);
            } else if (i0 + 2 * tx < rows) {
#pragma unroll
                for (int k = 0; k < kPairSteps; ++k) {
                    if (j0 + ty + k * kBlockRows < cols) p[k * dst_step] = word(ty + k * kBlockRows);
                }
            }
        }
        __syncthreads();  // every thread has read the tile before the next one is staged
    });
}

}  // namespace gradops
