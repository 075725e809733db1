// DepthwiseConv2dNativeBackpropInput as a gather: every input-gradient element sums every
// (filter tap, multiplier) whose forward read touched that element.  No atomics, and each sum
// runs in one fixed order, so results are bitwise reproducible.  Four kernels:
//
// * depthwise_conv2d_native_backprop_input (the "direct" kernel): one thread per element,
//   grid-stride, 64-bit offsets.  Any layout, filter, stride, dilation and size (tensors past
//   2^31 elements included); the reference on the GPU for unusual shapes.
// * depthwise_conv2d_native_backprop_input_tiled: a CTA owns a spatial tile x a block of
//   channels, stages the out_backprop rows and columns the tile reads (its halo included) and
//   the filter slice in shared memory, and each thread produces 7 x 4 (stride 1) or 4 x 4
//   positions x 2 channels from registers; 32-bit offsets from blockIdx, no division per
//   element, and tiles aligned to the stride so that only taps that land are computed.  Compile-time filter size and stride
//   (3x3 and 5x5 at strides 1 and 2), dilation 1, every tensor below 2^31 elements: the
//   launcher checks.
// * depthwise_conv2d_native_backprop_input_mma (tensor cores, sm_80+; NCHW float16 / bfloat16,
//   3x3 and 5x5 at stride 1, multipliers 1 and 2): each 16 x 16 unit of a plane as products
//   of staged out_backprop rows with the filter's banded (Toeplitz) matrices, mma.sync
//   m16n8k16 / m16n8k8 with float sums (see "the tensor-core kernel" at the end); its
//   whole-plane form (FORM 1) stages a plane of one unit (14 x 14, 16 x 16) as the contiguous
//   run it is, 16 or 8 bytes a load, and its packed form (FORM 2) takes four small images
//   (7 x 7) a unit, 2 x 2.  The launcher runs it where the static model predicts it faster than
//   the planes kernel (MMA_CHOICE, MMA_PLANE_CHOICE, MMA_PACKED_CHOICE), or when asked (path="mma").
// * depthwise_conv2d_native_backprop_input_planes (NCHW, 3x3 and 5x5 at strides 1 and 2, any
//   multiplier): a CTA stages several whole channel planes, or a band of one's rows, as they
//   lie in memory, and each thread computes 2 x 4 positions of a plane (2 x 8 at stride 2; see
//   "the planes kernel"); its STAGED form (stride 2, narrow maps) writes the results through
//   shared memory in whole sectors.  The launcher's NCHW kernel where the tensor cores are not
//   chosen (PLANES_BY_DEFAULT, measured on the H200 and the H100).
// * transpose_batched (layout_transpose.cuh), for the opt-in "transpose" path: NCHW out_backprop
//   to NHWC, the tiled kernel in NHWC, the result back to NCHW (path="transpose").
//
// Shapes (L = layout of in_backprop / out_backprop, NHWC or NCHW):
//   filter        [filter_rows, filter_cols, in_depth, depth_multiplier]  (always this order)
//   out_backprop  [batch, out_rows, out_cols, in_depth * depth_multiplier] in L
//   in_backprop   [batch, in_rows, in_cols, in_depth]                     in L
// Output channel c * depth_multiplier + m reads input channel c through filter[:, :, c, m].
#include "depthwise_tiles.cuh"
#include "tensor_core_ptx.cuh"  // GRADOPS_HAS_MMA_SM80, ldmatrix and mma.sync (the _mma kernel)
#include "layout_transpose.cuh"  // transpose_batched (the "transpose" path)

namespace gradops {

// Half-open range [begin, end) of the filter taps of one spatial dimension that can reach
// padded input index i_padded = i + pad_before from a valid output index.
//
// Forward: output o, tap t reads i = o * stride + t * dilation - pad_before, so tap t reaches
// i from o = (i_padded - t * dilation) / stride when that division is exact.  The two bounds
// on o give the tap range in closed form (i_padded >= 0 since pads are non-negative):
//   o >= 0             <=>  t * dilation <= i_padded  <=>  t <= floor(i_padded / dilation)
//   o <= out_size - 1  <=>  t * dilation >= i_padded - (out_size - 1) * stride
//                      <=>  t >= ceil((i_padded - (out_size - 1) * stride) / dilation),
// whose numerator may be negative: ceil(a / d) = -floor(-a / d).  Exactness (the stride
// divides i_padded - t * dilation) is checked per tap by the caller.  Needs out_size >= 1.
struct TapRange {
    index_t begin, end;
};

__device__ __forceinline__ TapRange tap_range(index_t i_padded, index_t filter_size, index_t dilation,
                                              index_t stride, index_t out_size) {
    const index_t lowest = -floor_div((out_size - 1) * stride - i_padded, dilation);
    const index_t highest = i_padded / dilation;
    TapRange range;
    range.begin = lowest > 0 ? lowest : 0;
    range.end = highest + 1 < filter_size ? highest + 1 : filter_size;
    return range;
}

// KH, KW (filter rows / cols) and SH, SW (strides) are compile-time when non-zero: the tap
// loops then run over the whole (small) filter, fully unrolled, with out-of-range taps skipped
// by a predicate, and the stride divisions fold to shifts.  0 means "use the runtime value";
// the generic instantiation (all 0) loops over the closed-form tap ranges only.
template <typename T, typename Acc, int L, int KH, int KW, int SH, int SW>
__global__ void depthwise_conv2d_native_backprop_input(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    index_t batch, index_t in_rows, index_t in_cols, index_t in_depth, index_t depth_multiplier,
    index_t out_rows, index_t out_cols, index_t filter_rows_rt, index_t filter_cols_rt,
    index_t stride_rows_rt, index_t stride_cols_rt, index_t dilation_rows, index_t dilation_cols,
    index_t pad_top, index_t pad_left) {
    const index_t filter_rows = KH ? KH : filter_rows_rt;
    const index_t filter_cols = KW ? KW : filter_cols_rt;
    const index_t stride_rows = SH ? SH : stride_rows_rt;
    const index_t stride_cols = SW ? SW : stride_cols_rt;

    const Tensor4<L> in{in_rows, in_cols, in_depth};
    const Tensor4<L> out{out_rows, out_cols, in_depth * depth_multiplier};
    // Distance between consecutive output channels c*M + m and c*M + m + 1 in out_backprop.
    const index_t out_channel_step = L == NHWC ? 1 : out_rows * out_cols;
    const index_t total = batch * in_rows * in_cols * in_depth;

    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        index_t n, y, x, c;
        in.coords(i, n, y, x, c);  // i is also (n, y, x, c)'s offset in in_backprop
        const index_t y_padded = y + pad_top;
        const index_t x_padded = x + pad_left;
        const TapRange rows = tap_range(y_padded, filter_rows, dilation_rows, stride_rows, out_rows);
        const TapRange cols = tap_range(x_padded, filter_cols, dilation_cols, stride_cols, out_cols);

        Acc sum = Acc(0);
#pragma unroll
        for (index_t r = KH ? 0 : rows.begin; r < (KH ? KH : rows.end); ++r) {
            const index_t dy_rows = y_padded - r * dilation_rows;  // = out row * stride_rows
            if (r < rows.begin || r >= rows.end || dy_rows % stride_rows != 0) continue;
            const index_t out_row = dy_rows / stride_rows;
#pragma unroll
            for (index_t s = KW ? 0 : cols.begin; s < (KW ? KW : cols.end); ++s) {
                const index_t dx_cols = x_padded - s * dilation_cols;  // = out col * stride_cols
                if (s < cols.begin || s >= cols.end || dx_cols % stride_cols != 0) continue;
                const index_t out_col = dx_cols / stride_cols;
                const T* taps = filter + ((r * filter_cols + s) * in_depth + c) * depth_multiplier;
                const T* grads = out_backprop + out.offset(n, out_row, out_col, c * depth_multiplier);
                // Not unrolled: the multiplier is usually 1, and unrolling it inside every
                // unrolled tap multiplies code size (and NVRTC time) for little gain.
#pragma unroll 1
                for (index_t m = 0; m < depth_multiplier; ++m) {
                    sum += to_acc<Acc>(grads[m * out_channel_step]) * to_acc<Acc>(taps[m]);
                }
            }
        }
        in_backprop[i] = from_acc<T>(sum);
    }
}


// ==================================================================== the tiled kernel
//
// Indices.  Rows and columns are handled alike; for rows (K = KH, S = SH, pad = pad_top): input
// row y is padded row Y = y + pad, and tap r of out_backprop row o lands on it when
// Y = o * S + r.  Tiles are laid out in padded coordinates from a multiple of S, so within a
// tile the stride phase of every row (Y mod S), hence which taps land on it, is a compile-time
// constant: no tap that misses is computed, no remainder or quotient is taken per element.
//   tile t covers padded rows Y0 .. Y0 + TILE - 1, Y0 = S * (pad / S) + t * TILE
//              = input rows y0 .. y0 + TILE - 1,   y0 = t * TILE - pad % S
//   it reads out_backprop rows o0 .. o0 + STAGED - 1, o0 = Y0 / S - HALO, HALO = (K - 1) / S:
//   local row i (Y0 + i) gets tap r from staged row (i - r) / S + HALO when S divides i - r.
// Rows outside [0, in_rows) are computed but not stored; out_backprop rows outside
// [0, out_rows) are staged as zeros (see "Padding" below).
//
// Work split.  A CTA: one tile of TILE_ROWS x TILE_COLS positions of one image x CHANNELS
// channels (128 bytes of accumulators per staged position: 32 float or 16 double channels);
// see Shape for the tile of each specialisation.  Its threads: LANES = 16 lanes x the tile's
// work items; a work item is ITEM_ROWS x ITEM_COLS positions, and a lane V adjacent channels
// (8 bytes of accumulators: 2 float or 1 double).  Thread t takes lane t % LANES (so the 16
// threads of a half-warp read one staged position's 128 contiguous bytes: no bank conflicts)
// and work item t / LANES.  Its ITEM_ROWS x ITEM_COLS x V accumulators and its K x K x V
// filter values live in registers; each staged value of its window is read from shared memory
// once and feeds every tap that carries it to one of the work item's positions.
//
// Multipliers.  out_backprop channels c * M + q for q = 0 .. M-1 are staged one q at a time
// (with the filter slice [:, :, c, q]), accumulating into the same registers: each sum runs
// over q, then staged row, then staged column, all ascending: a fixed order.  Paired
// multipliers (M = 2 with V = 2, the launcher's `pair_multipliers`): out_backprop channels
// 2c and 2c + 1 sit side by side like the filter's [:, :, c, 0:2], so a CTA owns CHANNELS / 2
// input channels and stages their 2 x CHANNELS / 2 out_backprop channels at once, exactly as
// for M = 1 (16-byte loads included); a thread's two accumulators are then slices 0 and 1 of
// one input channel, summed over staged row and column each, and added once at the end.
//
// Padding.  TF skips taps that fall outside out_backprop; staging zeros there instead adds
// products w * 0 = +-0, which leave every sum unchanged unless w is Inf or NaN (x + +-0 == x
// for every x but -0, and a sum that starts at +0 never becomes -0 under round-to-nearest).
// So while staging the filter each CTA checks its slice (v * 0 is NaN exactly when v is not
// finite), and if any value is not finite it runs the checked variant of the inner loop,
// which skips the staged positions outside out_backprop.
//
// Loads.  With M = 1 or paired multipliers, NHWC, an out_backprop channel count that is a
// multiple of 16 / sizeof(T) and 16-byte aligned arrays (bit 0 of the launcher's
// `vector_loads`), staging moves 16 bytes per load and keeps up to kBatch loads per thread in
// flight; otherwise one element per load.  NHWC stores two channels at a time when in_depth
// is even.
//
// Swizzle (NHWC, float16 and bfloat16, stride 1).  A 16-byte load of 8 halves widens to 32
// bytes of floats, two 16-byte shared stores, and the 4 threads of a staged position write its
// 128 bytes: a quarter-warp's 8 lanes are two positions, whose stores at the same channels fell
// on the same banks (2 wavefronts a store where 1 suffices: the H200 measured 51% of this
// kernel's shared-store wavefronts as conflicts, 2026-12-04, full_sections.md).  So a staged
// position (and a filter tap) of odd index keeps its 4-float groups swapped in pairs: channel
// offset k of the position lies at k ^ 4 (swizzled()), and a quarter-warp's two positions fill
// all 32 banks.  Readers take a thread's V = 2 channels from k ^ 4 likewise: a lane's two
// offsets are fixed, and which one a staged position uses follows at compile time from the
// window's first position's parity (two window pointers), so no read costs an instruction more;
// the set-up costs a thread about 10 (sm_90: +0.1 to +0.5 SASS an element).  Per warp of a
// full 3x3 tile (multiplier 1, 16-byte staging), the stores then take 85 of its 211 shared-memory
// wavefronts where they took 169 of 295 (5x5: 121 of 347, was 241 of 467; the reads, 63 and 113
// LDS.64, 2 each).  Stride 2 keeps the plain layout: a thread stages about 3 vectors there, and
// the set-up cost more than the conflicts (+0.3 to +0.9 SASS an element).
//
// NCHW (issue 15).  The CTA and its work items are NHWC's; the staged tile is position-inner
// (Planes: a plane of staged rows per staged slot), since out_backprop and in_backprop are
// channel planes:
// * slots: a thread's V accumulators are slots lane and lane + LANES (NHWC: V * lane + u), so
//   that the lanes of a quarter-warp read consecutive planes; paired multipliers stage input
//   channel c0 + j's two slices as slots j and j + LANES.  The filter slice keeps a lane's two
//   slots side by side (tap row: V * lane + u, as NHWC's), so a lane reads a tap's pair in one
//   8-byte load (25 loads at 5x5 instead of 50).
// * staging (stage_planes): plane rows.  A thread loads chunks of 16, 8 or 4 bytes (bits 0, 2,
//   3 of `vector_loads`: the widest that divides an out_backprop row, with an aligned array;
//   any multiplier), or single elements, of one slot's staged rows (the chunks are aligned, so
//   the first starts up to VEC - 1 columns before the staged tile: o_col0 & (VEC - 1)), widens
//   them and stores them along the staged row: runs of up to 4 columns per store where o_col0
//   is a multiple of the run, else one store per element; consecutive lanes take consecutive
//   chunks of a row (coalesced), a thread's loads are issued in batches before any is stored,
//   offsets are 32-bit.
// * taps (accumulate_planes): per slot and window row, 4 columns per 16-byte load at stride 1
//   (2 per 8-byte load at stride 2): planes an odd number of 16 bytes apart keep the 8 lanes of
//   each quarter-warp on distinct bank groups.
// * results: straight from the registers, a work item row of 4 columns per store where in_cols
//   % 4 == 0 and tiles start at a multiple of 4 (bit 1 of `vector_loads`), 2 per store where
//   that holds for 2 (bit 4: 14-column maps; only the second pair of a row can lie past the
//   image), else element by element.
// Why (static SASS, sm_90, float16, one thread of an interior tile, per element): the first
// NCHW path had each warp load 32 consecutive staged positions of one channel (2-byte loads,
// 64-bit address math, 8 dependent round trips) and stored results one 2-byte store at a time
// with 64-bit offsets: 50 instructions per element at 3x3/1 against NHWC's 23.  Plane-row
// chunks into NHWC's channel-inner tile made that 33 (3x3/2 21, 5x5/2 27, 5x5/1 54), paying a
// 4-byte shared-memory store per staged element and a result pass through shared memory; the
// position-inner tile makes it 29 (3x3/2 18, 5x5/2 25, 5x5/1 48; float32 3x3/1 31 -> 29, 5x5/1
// 50 -> 42).  Transposing to NHWC and back instead moves out_backprop and in_backprop three
// times each (3x the bytes of a memory-bound kernel); see benchmarks/README.md.

namespace dwconv {

// The work split of one specialisation.  A work item (one thread): ITEM_ROWS x ITEM_COLS
// positions x V channels; a CTA: R x C work items per lane, i.e. a tile of TILE_ROWS x
// TILE_COLS positions.  At stride 1 (TALL), 7 x 4 positions and 2 x 2 work items (14 x 8
// positions); at stride 2, 4 x 4 positions (work items start at an even row) and 2 x 4 work
// items (8 x 16 positions).  Tall items read fewer staged values per position and carry the
// per-thread fixed costs over more elements (28 x 2 per thread against 16 x 2); a 5x5 tile
// stages 18 x 12 positions (a 16-row tile of 4 x 4 items would need 20 x 20, past the 48 KiB
// of static shared memory for float), and 14 rows divide the 7 x 2^k feature maps of 224 x
// 224 networks exactly, where 8 rows leave a quarter of the last tile of a 28- or 14-row map
// empty (static SASS, sm_90, float16 3x3/1 per element of a full tile: NHWC 23.0 -> 19.4,
// paired multiplier 2 46.6 -> 39.6; NCHW with 4-byte chunks 36.4 -> 31.6).  Small images take
// smaller tiles, which a full one would mostly leave empty: R = 1 (one work item down a tile,
// 7 x 8 positions) for stride-1 images of at most 7 rows, and C = 2 (8 x 8 positions) at stride
// 2 where the last 8 x 16 tile would be at most half inside the image (a 7 x 7 map with the
// first tile one column early fills 77% of an 8 x 8 tile against 38% of an 8 x 16 one; 56
// columns 100% against 87.5%).
template <int KH, int KW, int SH, int SW, int R, int C> struct Shape {
    static constexpr bool TALL = SH == 1 && SW == 1;
    static constexpr int ITEM_ROWS = TALL ? 7 : 4;
    static constexpr int ITEM_COLS = 4;
    static_assert(R == 1 || R == 2, "one or two work items down a tile");
    static_assert(C == 2 || (C == 4 && !TALL), "two or four work items across a tile (two at stride 1)");
    static constexpr int TILE_ITEM_ROWS = R;
    static constexpr int TILE_ITEM_COLS = C;
    static constexpr int TILE_ITEMS = TILE_ITEM_ROWS * TILE_ITEM_COLS;
    static constexpr int TILE_ROWS = ITEM_ROWS * TILE_ITEM_ROWS;  // 8, or 14 (7)
    static constexpr int TILE_COLS = ITEM_COLS * TILE_ITEM_COLS;  // 16, or 8
    static constexpr int TILE_POSITIONS = TILE_ROWS * TILE_COLS;  // 128, 112, 64 or 56
};
// How many 16-byte loads a thread keeps in flight (4 registers each) before widening them
// into shared memory, when it has more than 16 to make.
inline constexpr int kBatch = 12;

// One spatial dimension of the tile (see "Indices" above).
template <int K, int S, int TILE, int ITEM> struct Axis {
    static_assert(TILE % S == 0 && ITEM % S == 0, "tiles and work items start at a stride phase of 0");
    static constexpr int HALO = (K - 1) / S;               // staged rows before the tile's first
    static constexpr int STAGED = TILE / S + HALO;         // staged rows per tile
    static constexpr int WINDOW = (ITEM - 1) / S + HALO + 1;  // staged rows one work item reads
};

// A thread's widened channels c .. c + N - 1 (N = 4 or 8, c a multiple of N) of one staged
// position or tap (`position`: its channel 0) in 16-byte stores.  Where SWIZZLE (see "Swizzle"):
// offsets[0] is where channels c .. c + 3 lie in a position of the thread's first one's parity
// (c or c ^ 4), offsets[1] in one of the other, so c + 4 .. c + 7 lie at the other offset, and
// `flip` (a constant once the caller's loop is unrolled) says whether this position's parity
// differs from the first one's: no instruction per store beyond the store (a thread computes
// both offsets once).  COUNTED: the host model counts the stores' bank wavefronts (the staged
// tile's; tests/test_depthwise_conv2d_native_backprop_input.py).
template <bool SWIZZLE, bool COUNTED = false, typename Acc, int N>
__device__ __forceinline__ void store_staged(Acc* position, const int (&offsets)[2], bool flip, const Acc (&v)[N]) {
    constexpr int PER_STORE = 16 / static_cast<int>(sizeof(Acc));
    static_assert(N % PER_STORE == 0, "whole 16-byte stores");
#pragma unroll
    for (int u = 0; u < N; u += PER_STORE) {
        // Under the swizzle, channels c + 4 .. c + 7 lie at the other offset (c is a multiple of N).
        Acc* const at = position + (SWIZZLE ? offsets[(u / 4) ^ static_cast<int>(flip)] : offsets[0] + u);
#ifdef GRADOPS_HOST_MODEL
        if (COUNTED) gradops_host::count_access(at, gradops_host::STORE, 16);
#endif
        if constexpr (sizeof(Acc) == 4) {
            *reinterpret_cast<float4*>(at) = make_float4(v[u], v[u + 1], v[u + 2], v[u + 3]);
        } else {
            static_assert(!SWIZZLE, "the swizzle moves groups of 4 floats");
            *reinterpret_cast<double2*>(at) = make_double2(v[u], v[u + 1]);
        }
    }
}

// The staging loops take their thread index through opaque_value() (gradops_common.cuh) once
// per multiplier slice, so that their index math is redone per slice rather than hoisted out of
// the (usually one-iteration) slice loop, where it held dozens of registers and spilled.

// Two adjacent channels of one position, rounded to T, in one store (offset even).
template <typename T> __device__ __forceinline__ void store_pair(T* dst, float a, float b);
template <> __device__ __forceinline__ void store_pair<__half>(__half* dst, float a, float b) {
    *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}
template <> __device__ __forceinline__ void store_pair<__nv_bfloat16>(__nv_bfloat16* dst, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
template <> __device__ __forceinline__ void store_pair<float>(float* dst, float a, float b) {
    *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

// A thread's V channels of one position, rounded to T, in one store (for V = 2: offset even).
template <typename T, typename Acc, int V> __device__ __forceinline__ void store_lane(T* dst, const Acc (&v)[V]) {
    if constexpr (V == 2) {
        store_pair<T>(dst, v[0], v[1]);
    } else {
        dst[0] = from_acc<T>(v[0]);
    }
}

// The taps of one work item: every staged value of its window times every filter tap that
// carries it to one of the work item's positions.  CHECKED skips staged positions outside
// out_backprop (window rows [row_begin, row_end) x columns [col_begin, col_end) are inside).
// window: the thread's channels at the window's first staged position, as the positions an even
// number on are swizzled; window_odd: the same position as those an odd number on are (they
// differ only under the swizzle, see "Swizzle").
template <bool CHECKED, typename Acc, int KH, int KW, int SH, int SW, int R, int C>
__device__ __forceinline__ void accumulate(
    const Acc* __restrict__ window, const Acc* __restrict__ window_odd, const Lane<Acc> (&w)[KH * KW],
    Acc (&acc)[Shape<KH, KW, SH, SW, R, C>::ITEM_ROWS][Shape<KH, KW, SH, SW, R, C>::ITEM_COLS][Block<Acc>::V], int row_begin,
    int row_end, int col_begin, int col_end) {
    using S = Shape<KH, KW, SH, SW, R, C>;
    using Rows = Axis<KH, SH, S::TILE_ROWS, S::ITEM_ROWS>;
    using Cols = Axis<KW, SW, S::TILE_COLS, S::ITEM_COLS>;
#pragma unroll
    for (int wr = 0; wr < Rows::WINDOW; ++wr) {
#pragma unroll
        for (int wc = 0; wc < Cols::WINDOW; ++wc) {
            if (CHECKED && (wr < row_begin || wr >= row_end || wc < col_begin || wc >= col_end)) continue;
            const int at = wr * Cols::STAGED + wc;  // the staged position, from the window's first
            const Acc* const from = (at % 2 ? window_odd : window) + at * Block<Acc>::CHANNELS;
            const Lane<Acc> v = *reinterpret_cast<const Lane<Acc>*>(from);
#pragma unroll
            for (int i = 0; i < S::ITEM_ROWS; ++i) {
                const int r = i - (wr - Rows::HALO) * SH;  // the tap row that carries staged row wr to row i
                if (r < 0 || r >= KH) continue;
#pragma unroll
                for (int j = 0; j < S::ITEM_COLS; ++j) {
                    const int s = j - (wc - Cols::HALO) * SW;
                    if (s < 0 || s >= KW) continue;
#pragma unroll
                    for (int u = 0; u < Block<Acc>::V; ++u) acc[i][j][u] += w[r * KW + s].v[u] * v.v[u];
                }
            }
        }
    }
}


// With paired multipliers (see "Multipliers") a thread's two accumulators of a position are
// slices 0 and 1 of one input channel: its gradient is their sum, always in this order.
template <typename Acc, int V> __device__ __forceinline__ Acc pair_sum(const Acc (&a)[V]) { return a[0] + a[V - 1]; }

// Stores a work item's IR x IC positions (NHWC) from ``first``, the input gradient of its
// first position (y_first, x_first) and the thread's first channel; positions outside the
// image are skipped.  PAIRS: one element per position, the pair sum.  Otherwise the thread's
// V channels: in one store when in_depth is even (offsets even; every thread's channel + 1
// exists), else one element at a time, the second only where ``second_exists``.
template <bool PAIRS, typename T, typename Acc, int V, int IR, int IC>
__device__ __forceinline__ void store_item_nhwc(T* first, const Acc (&acc)[IR][IC][V], int y_first, int x_first,
                                                int in_rows, int in_cols, int in_depth, bool second_exists) {
    const bool whole = PAIRS || V == 1 || in_depth % 2 == 0;
    const int row_step = in_cols * in_depth;
    auto store = [&](T* dst, const Acc (&a)[V]) {
        if constexpr (PAIRS) {
            dst[0] = from_acc<T>(pair_sum(a));
        } else if (whole) {
            store_lane<T, Acc, V>(dst, a);
        } else {
            dst[0] = from_acc<T>(a[0]);
            if (second_exists) dst[1] = from_acc<T>(a[V - 1]);
        }
    };
    if (whole && y_first >= 0 && y_first + IR <= in_rows && x_first >= 0 && x_first + IC <= in_cols) {
        // the common case: every position inside
#pragma unroll
        for (int i = 0; i < IR; ++i)
#pragma unroll
            for (int j = 0; j < IC; ++j) store(first + i * row_step + j * in_depth, acc[i][j]);
        return;
    }
#pragma unroll
    for (int i = 0; i < IR; ++i) {
        if (static_cast<unsigned>(y_first + i) >= static_cast<unsigned>(in_rows)) continue;
#pragma unroll
        for (int j = 0; j < IC; ++j) {
            if (static_cast<unsigned>(x_first + j) >= static_cast<unsigned>(in_cols)) continue;
            store(first + i * row_step + j * in_depth, acc[i][j]);
        }
    }
}

// Positions p = first + k * STEP (k = 0, 1, ...) of a row-major grid COLS wide, as (row, col)
// and as the offset origin + row * row_step + col * col_step, advanced without a division or
// a multiplication per step.
template <int COLS, int STEP> struct GridWalk {
    unsigned row, col;
    int offset;
    const int step, wrap;  // offset change per step, and on carrying into the next row
    __device__ __forceinline__ GridWalk(unsigned first, int origin, int row_step, int col_step)
        : row(first / COLS), col(first % COLS),
          offset(origin + static_cast<int>(first / COLS) * row_step + static_cast<int>(first % COLS) * col_step),
          step(STEP / COLS * row_step + STEP % COLS * col_step), wrap(row_step - COLS * col_step) {}
    __device__ __forceinline__ void next() {
        row += STEP / COLS;
        col += STEP % COLS;
        offset += step;
        if (col >= COLS) {
            col -= COLS;
            ++row;
            offset += wrap;
        }
    }
};


// The constant N as a type (std::integral_constant without the standard library): a generic
// lambda's template argument.
template <int N> struct Int {
    static constexpr int value = N;
};

// Four accumulators to 16-byte aligned shared memory (one 16-byte store, two for double).
__device__ __forceinline__ void put_four(float* dst, float a, float b, float c, float d) {
    *reinterpret_cast<float4*>(dst) = make_float4(a, b, c, d);
}
__device__ __forceinline__ void put_four(double* dst, double a, double b, double c, double d) {
    reinterpret_cast<double2*>(dst)[0] = make_double2(a, b);
    reinterpret_cast<double2*>(dst)[1] = make_double2(c, d);
}

// RUN (1, 2 or 4) accumulators to shared memory aligned to RUN of them, in one store (two for 4
// double).
template <int RUN, typename Acc> __device__ __forceinline__ void put_run(Acc* dst, const Acc* v) {
    if constexpr (RUN == 4) {
        put_four(dst, v[0], v[1], v[2], v[3]);
    } else if constexpr (RUN == 2) {
        using Two = typename Select<sizeof(Acc) == 4, float2, double2>::type;
        Two two;
        two.x = v[0], two.y = v[1];
        *reinterpret_cast<Two*>(dst) = two;
    } else {
        dst[0] = v[0];
    }
}

// ---- NCHW staging and stores (see "NCHW" above)

// Loads of the busiest thread when UNITS units x ROWS rows are split into (unit, row group)
// pairs, GROUPS row groups (rows g, g + GROUPS, ...), dealt to THREADS threads in turn.
__host__ __device__ constexpr int busiest_loads(int units, int rows, int threads, int groups) {
    return (units * groups + threads - 1) / threads * ((rows + groups - 1) / groups);
}
// Its loads plus its (unit, row group) pairs, each of which costs about a load's instructions
// in index math (a division and a remainder by UNITS, offsets and predicates).
__host__ __device__ constexpr int staging_cost(int units, int rows, int threads, int groups) {
    return busiest_loads(units, rows, threads, groups) + (units * groups + threads - 1) / threads;
}
// The number of row groups (1 .. ROWS) that makes the busiest thread's staging cheapest (the
// fewest groups among equals).
__host__ __device__ constexpr int row_groups(int units, int rows, int threads) {
    int best = 1;
    for (int g = 2; g <= rows; ++g)
        if (staging_cost(units, rows, threads, g) < staging_cost(units, rows, threads, best)) best = g;
    return best;
}

// A chunk's VEC elements (raw type: ChunkOf, depthwise_tiles.cuh) widened to accumulators.
template <typename T, typename Acc, int VEC, typename Raw>
__device__ __forceinline__ void widen_chunk(const Raw& raw, Acc (&out)[VEC]) {
    if constexpr (sizeof(Raw) == kVectorBytes) {
        widen<T, Acc>(raw, out);
    } else {
        const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = to_acc<Acc>(v[e]);
    }
}
// Registers of loaded chunks a thread keeps in flight before widening them (the 16-byte
// staging's kBatch x 4, rounded to whole rows of the common tiles), one load per register for
// chunks of at most 4 bytes: a 32-thread CTA staging 2-byte elements of a 7 x 7 map (90 loads a
// thread) waits for 3 batches, not the 6 that a cap of 16 loads made.
inline constexpr int kBatchWords = 40;

// Rows ROWS x columns COLS of CHANNELS channel planes of out_backprop into the position-inner
// staged tile (stage[slot * CP + row * RP + col], see Planes), zeros outside out_backprop or
// past the CTA's channels.  ``plane0``: offset of staged slot 0's plane; slot s's plane is
// (s % 16) * step_lo + (s / 16) * step_hi further (16 = LANES; unpaired: consecutive
// out_backprop channels M apart, so step_hi = 16 * step_lo; paired, NCHW's slot order (see
// "NCHW"): step_lo = 2 planes, step_hi = 1); ``channels``: slots that exist (s < channels;
// when ``paired``, input channels: s % 16 < channels).  Loads of VEC elements (16, 8 or 4 bytes; VEC = 1: one element): every plane row
// starts aligned to a chunk (VEC divides out_cols, the array is aligned), the chunks are aligned,
// so the first starts shift = o_col0 mod VEC columns before the staged tile and each lies wholly
// inside or wholly outside out_backprop's columns.  A unit is (chunk, slot), chunk fastest
// (consecutive lanes: consecutive chunks of one plane row, coalesced); (unit, row group) pairs go
// to threads t, t + THREADS, ... (row_groups: the cheapest staging for the busiest thread), and a
// thread's loads, all its pairs' rows in turn, are issued kBatchWords registers at a time before
// any is widened and stored.  Where o_col0 is a multiple of RUN = min(VEC, 4), a chunk's runs
// of RUN columns are aligned runs of the staged row: one store each (16 bytes for 4 float, 8
// for 2; columns up to RP - 1 past COLS get the neighbouring out_backprop values, which no tap
// reads); else one store per staged element.  Offsets are 32-bit (every tensor < 2^31 elements).
template <int VEC, int CHANNELS, int ROWS, int COLS, int RP, int CP, int THREADS, typename T, typename Acc>
__device__ __forceinline__ void stage_planes(const T* __restrict__ out_backprop, Acc* __restrict__ stage, unsigned t,
                                             int plane0, int step_lo, int step_hi, int channels, bool paired,
                                             int o_row0, int o_col0, int out_rows, int out_cols) {
    constexpr int CHUNKS = (COLS + 2 * (VEC - 1)) / VEC;
    constexpr int UNITS = CHUNKS * CHANNELS;
    constexpr int GROUPS = row_groups(UNITS, ROWS, THREADS);
    constexpr int PAIRS = UNITS * GROUPS;
    constexpr int PAIR_STEPS = (PAIRS + THREADS - 1) / THREADS;
    constexpr int STEPS = (ROWS + GROUPS - 1) / GROUPS;  // rows per pair
    constexpr int LOADS = PAIR_STEPS * STEPS;
    using Raw = typename ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;
    constexpr int WORDS = sizeof(Raw) < 4 ? 1 : static_cast<int>(sizeof(Raw)) / 4;
    constexpr int CAP = kBatchWords / WORDS;
    constexpr int BATCH = LOADS > CAP ? CAP : LOADS;
    static_assert(RP % 4 == 0 && RP >= COLS, "staged rows of whole quads");
    static_assert(Block<Acc>::LANES == 16, "slot s: plane index s & 15 within s >> 4");
    const int shift = o_col0 & (VEC - 1);
    constexpr int RUN = VEC < 4 ? VEC : 4;  // accumulators per shared-memory store
    const bool runs = (o_col0 & (RUN - 1)) == 0;  // the chunk's runs are runs of the staged row
    const int row_step = GROUPS * out_cols;
    // The pair of step ps: whether it exists and its chunk holds staged data, the offset of its
    // first row's chunk and where that chunk's element 0 is staged (column ``first``).
    struct Pair {
        bool used;
        int group, first, offset;
        Acc* to;
    };
    auto pair_of = [&](int ps) {
        Pair p;
        const unsigned pair = t + ps * THREADS;
        const unsigned unit = GROUPS == 1 ? pair : pair % UNITS;
        p.group = GROUPS == 1 ? 0 : static_cast<int>(pair / UNITS);
        const int chunk = static_cast<int>(unit % CHUNKS), slot = static_cast<int>(unit / CHUNKS);
        p.first = chunk * VEC - shift;
        const int col = o_col0 + p.first;
        const bool slot_in = paired ? (slot & 15) < channels : slot < channels;
        p.used = (PAIRS % THREADS == 0 || pair < PAIRS) && slot_in &&
                 static_cast<unsigned>(col) < static_cast<unsigned>(out_cols) && p.first + VEC > 0 && p.first < COLS;
        // (an unused chunk's slot may lie past the tensor: its offset is formed from slot 0)
        p.offset = plane0 + (slot_in ? (slot & 15) * step_lo + (slot >> 4) * step_hi : 0) +
                   (o_row0 + p.group) * out_cols + col;
        p.to = stage + slot * CP + p.group * RP + p.first;
        return p;
    };
#pragma unroll
    for (int i0 = 0; i0 < LOADS; i0 += BATCH) {
        Raw raw[BATCH];
#pragma unroll
        for (int i = i0; i < i0 + BATCH && i < LOADS; ++i) {
            const int ps = i / STEPS, k = i % STEPS;
            if (PAIRS % THREADS != 0 && ps + 1 == PAIR_STEPS && t + ps * THREADS >= PAIRS) break;
            const Pair p = pair_of(ps);
            const int row = p.group + k * GROUPS;
            raw[i - i0] = Raw{};
            if (p.used && (ROWS % GROUPS == 0 || row < ROWS) &&
                static_cast<unsigned>(o_row0 + row) < static_cast<unsigned>(out_rows))
                raw[i - i0] = *reinterpret_cast<const Raw*>(out_backprop + (p.offset + k * row_step));
        }
#pragma unroll
        for (int i = i0; i < i0 + BATCH && i < LOADS; ++i) {
            const int ps = i / STEPS, k = i % STEPS;
            if (PAIRS % THREADS != 0 && ps + 1 == PAIR_STEPS && t + ps * THREADS >= PAIRS) break;
            const Pair p = pair_of(ps);
            if (ROWS % GROUPS != 0 && p.group + k * GROUPS >= ROWS) continue;
            Acc* const at = p.to + k * GROUPS * RP;
            Acc values[VEC];
            widen_chunk<T, Acc, VEC>(raw[i - i0], values);
            if (RUN > 1 && runs) {  // the chunk's runs that are staged columns, one store each
#pragma unroll
                for (int e = 0; e < VEC; e += RUN)
                    if (static_cast<unsigned>(p.first + e) < static_cast<unsigned>(COLS)) put_run<RUN>(at + e, values + e);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; ++e)  // the chunk's elements that are staged columns
                    if (VEC == 1 || static_cast<unsigned>(p.first + e) < static_cast<unsigned>(COLS)) at[e] = values[e];
            }
        }
    }
}

// Four accumulators, rounded to T, to four consecutive elements in one store (8 bytes for the
// 16-bit types, 16 for float, two of 16 for double; ``dst`` aligned to 4 elements).
// Two floats rounded to a 2-byte T, as the bits of one 32-bit word (element a first).
template <typename T> __device__ __forceinline__ unsigned pack_pair(float a, float b);
template <> __device__ __forceinline__ unsigned pack_pair<__half>(float a, float b) {
    const __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack_pair<__nv_bfloat16>(float a, float b) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const unsigned*>(&h);
}

template <typename T> __device__ __forceinline__ void store_four(T* dst, float4 v) {
    static_assert(sizeof(T) == 2, "half types here; float below");
    *reinterpret_cast<uint2*>(dst) = make_uint2(pack_pair<T>(v.x, v.y), pack_pair<T>(v.z, v.w));
}
template <> __device__ __forceinline__ void store_four<float>(float* dst, float4 v) {
    *reinterpret_cast<float4*>(dst) = v;
}

// Eight floats rounded to a 2-byte T, in one 16-byte store (``dst`` 16-byte aligned).
template <typename T> __device__ __forceinline__ void store_eight(T* dst, const float (&v)[8]) {
    static_assert(sizeof(T) == 2, "eight 2-byte elements: 16 bytes");
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack_pair<T>(v[0], v[1]), pack_pair<T>(v[2], v[3]),
                                                pack_pair<T>(v[4], v[5]), pack_pair<T>(v[6], v[7]));
}

// Two accumulators, rounded to T, to two consecutive elements in one store (``dst`` aligned to 2).
template <typename T, typename Acc> __device__ __forceinline__ void store_two(T* dst, Acc a, Acc b) {
    if constexpr (sizeof(Acc) == 8)  // double: T is double
        *reinterpret_cast<double2*>(dst) = make_double2(a, b);
    else
        store_pair<T>(dst, a, b);
}

// Four accumulators of one channel row (columns x .. x + 3, x < in_cols), rounded to T, COLS
// columns per store: 4 where in_cols % 4 == 0 and the tile's columns start at a multiple of 4
// (the quad is aligned and inside the image); 2 where that holds for 2 (each pair aligned,
// wholly inside or outside); else 1.
template <typename T, typename Acc>
__device__ __forceinline__ void store_quad(T* dst, const Acc (&v)[4], int x, int in_cols, int cols) {
    if (cols == 4) {
        if constexpr (sizeof(Acc) == 4)
            store_four<T>(dst, make_float4(v[0], v[1], v[2], v[3]));
        else  // double: T is double
            put_four(dst, v[0], v[1], v[2], v[3]);
    } else if (cols == 2) {  // x is even and inside the image, and so is x + 1: only the second pair may be out
        store_two<T>(dst, v[0], v[1]);
        if (x + 2 < in_cols) store_two<T>(dst + 2, v[2], v[3]);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (static_cast<unsigned>(x + k) < static_cast<unsigned>(in_cols)) dst[k] = from_acc<T>(v[k]);
    }
}

// READ consecutive accumulators of 16-byte (READ x sizeof(Acc) bytes) aligned shared memory in
// one load.  AS_WRITTEN: float's 16 bytes through ptx::ld_shared_16, which NVVM emits as it
// stands.  From a float4 dereference it sometimes kept half of the load and read the other half
// again, differently from one compile to the next (benchmarks/README.md).  The tiled kernel's
// NCHW taps take it (the same shared loads as NVVM's better variant); the planes kernel's do not:
// there it cost registers (sm_90, float16 5x5 at stride 1: 61 -> 66, one CTA less per SM).
template <int READ, bool AS_WRITTEN = false, typename Acc>
__device__ __forceinline__ void load_run(const Acc* src, Acc* out) {
    if constexpr (READ * sizeof(Acc) == 16 && sizeof(Acc) == 4) {
        float4 v;
        if constexpr (AS_WRITTEN)
            v = ptx::ld_shared_16(src);
        else
            v = *reinterpret_cast<const float4*>(src);
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
    } else if constexpr (READ * sizeof(Acc) == 16) {
        const double2 v = *reinterpret_cast<const double2*>(src);
        out[0] = v.x, out[1] = v.y;
    } else {
        static_assert(READ == 2 && sizeof(Acc) == 4, "8-byte runs of float");
        const float2 v = *reinterpret_cast<const float2*>(src);
        out[0] = v.x, out[1] = v.y;
    }
}

// NCHW's taps of one work item (accumulate's, from the position-inner tile): per channel u,
// per window row, the row's staged values READ at a time (the item's first column is a
// multiple of READ), then every tap that carries each to one of the item's positions; each
// accumulator's terms in accumulate's order (window row, then column).  ``window``: the staged
// value of window (0, 0) of the thread's slot 0 (slot u is u * LANES * CP further).
template <bool CHECKED, typename Acc, int KH, int KW, int SH, int SW, int R, int C, int READ, int RP, int CP>
__device__ __forceinline__ void accumulate_planes(
    const Acc* __restrict__ window, const Lane<Acc> (&w)[KH * KW],
    Acc (&acc)[Shape<KH, KW, SH, SW, R, C>::ITEM_ROWS][Shape<KH, KW, SH, SW, R, C>::ITEM_COLS][Block<Acc>::V], int row_begin,
    int row_end, int col_begin, int col_end) {
    using S = Shape<KH, KW, SH, SW, R, C>;
    using Rows = Axis<KH, SH, S::TILE_ROWS, S::ITEM_ROWS>;
    using Cols = Axis<KW, SW, S::TILE_COLS, S::ITEM_COLS>;
    constexpr int RUNS = (Cols::WINDOW + READ - 1) / READ;
#pragma unroll
    for (int u = 0; u < Block<Acc>::V; ++u) {
#pragma unroll
        for (int wr = 0; wr < Rows::WINDOW; ++wr) {
            Acc row[RUNS * READ];
#pragma unroll
            for (int k = 0; k < RUNS; ++k)
                load_run<READ, true>(window + u * Block<Acc>::LANES * CP + wr * RP + k * READ, row + k * READ);
#pragma unroll
            for (int wc = 0; wc < Cols::WINDOW; ++wc) {
                if (CHECKED && (wr < row_begin || wr >= row_end || wc < col_begin || wc >= col_end)) continue;
                const Acc v = row[wc];
#pragma unroll
                for (int i = 0; i < S::ITEM_ROWS; ++i) {
                    const int r = i - (wr - Rows::HALO) * SH;
                    if (r < 0 || r >= KH) continue;
#pragma unroll
                    for (int j = 0; j < S::ITEM_COLS; ++j) {
                        const int s = j - (wc - Cols::HALO) * SW;
                        if (s < 0 || s >= KW) continue;
                        acc[i][j][u] += w[r * KW + s].v[u] * v;
                    }
                }
            }
        }
    }
}

// The position-inner staged tile of NCHW (see "NCHW"): slot s's plane at s * CP, staged row r at
// r * RP, column c at c.  A thread's work item reads READ columns per load from its first
// column (a multiple of ITEM_COLS / SW: 16 bytes at stride 1, 8 at stride 2 for float); rows
// hold whole quads and every column those loads reach; CP / UNIT is odd, so the 8 lanes of a
// quarter-warp (consecutive slots, one column) hit 8 different 16-byte bank groups.
template <typename Acc, int KH, int KW, int SH, int SW, int R, int C> struct Planes {
    using S = Shape<KH, KW, SH, SW, R, C>;
    using Rows = Axis<KH, SH, S::TILE_ROWS, S::ITEM_ROWS>;
    using Cols = Axis<KW, SW, S::TILE_COLS, S::ITEM_COLS>;
    static constexpr int UNIT = 16 / static_cast<int>(sizeof(Acc));  // accumulators per 16 bytes
    static constexpr int ITEM_STEP = S::ITEM_COLS / SW;               // first columns of work items
    static constexpr int READ = ITEM_STEP % UNIT == 0 ? UNIT : 2;
    static_assert(ITEM_STEP % READ == 0, "work items start at a whole read");
    static constexpr int RUNS = (Cols::WINDOW + READ - 1) / READ;
    static constexpr int REACH = (S::TILE_COLS - S::ITEM_COLS) / SW + RUNS * READ;  // columns the reads reach
    static constexpr int WIDE = REACH > Cols::STAGED ? REACH : Cols::STAGED;
    static constexpr int RP = (WIDE + 3) / 4 * 4;
    static constexpr int PLANE = Rows::STAGED * RP;
    static constexpr int CP = (PLANE / UNIT) % 2 == 1 ? PLANE : PLANE + UNIT;
    static constexpr int SIZE = Block<Acc>::CHANNELS * CP;
    static_assert(RP % UNIT == 0 && CP % UNIT == 0 && (CP / UNIT) % 2 == 1, "16-byte rows, odd 16-byte planes");
};

}  // namespace dwconv

// Template: element and accumulator type, layout, filter rows/cols, stride rows/cols, work
// items down and across a tile (Shape).  Sizes are int: the launcher runs this kernel only when every
// tensor has fewer than 2^31 elements and every padded coordinate fits.  vector_loads: 16-byte
// staging loads (see "Loads"); columns_per_warp: how a warp's two work items sit in the tile
// (below); pair_multipliers: 1 for paired multipliers (see "Multipliers"; M = 2 and V = 2
// only), 0 otherwise.  Grid: (tiles across x channel blocks of CHANNELS input channels, or
// CHANNELS / 2 when paired, tiles down, batch); block: LANES x the tile's work items (128, or
// 64 for C = 2; 64, or 32 for R = 1, at stride 1).  The body is a device function so that the
// kernel template (below) can have register-bounded explicit specialisations ("Register
// budgets"); the template itself has no __launch_bounds__: with one ptxas spilled registers in
// some instantiations and took more in others (on sm_90 with NVRTC 13, the unbounded stride-1
// kernels use 98-152 registers in NHWC and 128-213 in NCHW, so registers limit their occupancy:
// the static report lists it per kernel).
namespace dwconv {
template <typename T, typename Acc, int L, int KH, int KW, int SH, int SW, int R, int C>
__device__ __forceinline__ void tiled_input_gradient(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    int in_rows, int in_cols, int in_depth, int depth_multiplier, int out_rows, int out_cols, int pad_top,
    int pad_left, int tiles_across, int vector_loads, int columns_per_warp, int pair_multipliers) {
    using B = Block<Acc>;
    using S = Shape<KH, KW, SH, SW, R, C>;
    using Rows = Axis<KH, SH, S::TILE_ROWS, S::ITEM_ROWS>;
    using Cols = Axis<KW, SW, S::TILE_COLS, S::ITEM_COLS>;
    constexpr int CHANNELS = B::CHANNELS, V = B::V, LANES = B::LANES;
    constexpr int THREADS = LANES * S::TILE_ITEMS;  // 128, 64 or 32
    // The staged tile: NHWC, CHANNELS accumulators per staged position; NCHW, channel planes (Planes).
    constexpr int POSITIONS = Rows::STAGED * Cols::STAGED;
    using P = Planes<Acc, KH, KW, SH, SW, R, C>;
    constexpr int BUFFER = L == NCHW ? P::SIZE : POSITIONS * CHANNELS;
    constexpr int TAPS = KH * KW;

    __shared__ __align__(16) Acc stage[BUFFER];
    __shared__ __align__(16) Acc taps[TAPS * CHANNELS];
    __shared__ int nonfinite_slice;  // the last q whose filter slice held an Inf or NaN

    // Channels (see "Multipliers"): staged channel k of slice q is out_backprop channel
    // oc0 + k * channel_step + q; it belongs to input channel c0 + (k >> pairs).
    const int pairs = V == 2 ? pair_multipliers : 0;
    const int in_per_cta = CHANNELS >> pairs;
    const int slices = pairs ? 1 : depth_multiplier;
    const int channel_step = pairs ? 1 : depth_multiplier;

    const unsigned tid = threadIdx.x;
    const unsigned across = static_cast<unsigned>(tiles_across);
    const int tile_col = static_cast<int>(blockIdx.x % across);
    const int c0 = static_cast<int>(blockIdx.x / across) * in_per_cta;
    const int tile_row = static_cast<int>(blockIdx.y);
    const int n = static_cast<int>(blockIdx.z);
    // Tile origin (input coordinates) and first staged out_backprop row / column.
    const int y0 = tile_row * S::TILE_ROWS - pad_top % SH;
    const int x0 = tile_col * S::TILE_COLS - pad_left % SW;
    const int o_row0 = pad_top / SH + tile_row * (S::TILE_ROWS / SH) - Rows::HALO;
    const int o_col0 = pad_left / SW + tile_col * (S::TILE_COLS / SW) - Cols::HALO;
    const int out_depth = in_depth * depth_multiplier;
    const int oc0 = c0 * depth_multiplier;

    // This thread's work item and channels.
    const int lane = static_cast<int>(tid % LANES);
    // A warp holds two work items (32 threads = 2 x LANES): side by side, or with
    // columns_per_warp one above the other (item rows 0 and 1 of one item column), whichever
    // leaves whole warps idle (and skipping the inner loop) where the image ends inside a tile.
    static_assert(32 == 2 * LANES, "two work items per warp");
    const int item = static_cast<int>(tid / LANES);
    const bool columns = R == 2 && columns_per_warp;
    const int item_row = columns ? item % 2 : item / S::TILE_ITEM_COLS;
    const int item_col = columns ? item / 2 : item % S::TILE_ITEM_COLS;
    const int i0 = item_row * S::ITEM_ROWS;  // first row / column within the tile
    const int j0 = item_col * S::ITEM_COLS;
    // This thread's (first) input channel.  NHWC: staged slots V * lane .. V * lane + V - 1 (one
    // input channel when paired); NCHW: slots lane and lane + LANES, which belong to input
    // channels c0 + lane and c0 + lane + LANES, or (paired) both to c0 + lane.
    const int channel = L == NCHW ? c0 + lane : c0 + ((V * lane) >> pairs);
    const int y_first = y0 + i0, x_first = x0 + j0;
    const bool active = channel < in_depth && y_first < in_rows && y_first + S::ITEM_ROWS > 0 && x_first < in_cols &&
                        x_first + S::ITEM_COLS > 0;
    // NHWC: the swizzle's two places of the thread's channels (see "Swizzle"): window at the
    // window's first staged position's parity, window_odd at the other.
    constexpr bool SWIZZLE = L == NHWC && sizeof(T) == 2 && S::TALL;
    const int first_position = (i0 / SH) * Cols::STAGED + j0 / SW;
    const bool first_odd = SWIZZLE && first_position % 2 != 0;
    const Acc* window = L == NCHW ? stage + lane * P::CP + (i0 / SH) * P::RP + j0 / SW
                                  : stage + first_position * CHANNELS + swizzled(V * lane, first_odd);
    const Acc* window_odd = L == NCHW ? window
                                      : stage + first_position * CHANNELS + swizzled(V * lane, SWIZZLE && !first_odd);

    if (tid == 0) nonfinite_slice = -1;
    // Each slice q stages the filter slice taps[tap][c] = filter[tap][c0 + c][q] and the
    // out_backprop tile (channels c0 * M + q, (c0 + 1) * M + q, ...; zeros outside out_backprop),
    // and notes whether the filter slice is finite: `finite` stays 0 while every value is
    // (v * 0 == 0).  Multiplier 1 in NHWC with 16-byte rows (see "Loads") has one slice, staged
    // in 16-byte vectors here, before the accumulators exist: staged inside the slice loop, its
    // batch of loads in flight sat beside the accumulators (zero, but live across the loop's
    // back edge), 161 registers on sm_90 for float16 3x3 at stride 1 (56 accumulators) where
    // this order takes 98: four CTAs an SM where three fitted.  (No thread reads the staged
    // slice or the flag before the loop's second barrier.)
    const bool vector = L == NHWC && vector_loads != 0 && slices == 1;
    Acc finite = Acc(0);
    if (vector) {
        const unsigned t = static_cast<unsigned>(opaque_value(static_cast<int>(tid)));
        // Loads first (16 bytes per thread and step, all in flight at once), then widening
        // to accumulators and 16-byte shared-memory stores.  Thread t moves vector
        // t % PER_POSITION (channels c .. c + ELEMENTS - 1) of its slot t / PER_POSITION.
        constexpr int ELEMENTS = VectorSize<T>::value;
        constexpr int PER_POSITION = CHANNELS / ELEMENTS;  // vectors per tap / staged position
        constexpr int SLOTS = THREADS / PER_POSITION;      // positions per step
        const unsigned slot = t / PER_POSITION;
        const int c = static_cast<int>(t % PER_POSITION) * ELEMENTS;
        // Where the thread's first 4 channels lie in a staged position or tap of its slot's parity
        // (offsets[0]) and of the other (offsets[1]; see "Swizzle" and store_staged).
        const bool slot_odd = SWIZZLE && slot % 2 != 0;
        const int offsets[2] = {swizzled(c, slot_odd), swizzled(c, SWIZZLE && !slot_odd)};
        const bool channels_in = oc0 + c < out_depth;  // out_depth is a multiple of ELEMENTS

        // The filter slice: taps slot, slot + SLOTS, ...
        constexpr int FILTER_STEPS = (TAPS + SLOTS - 1) / SLOTS;
        uint4 filter_raw[FILTER_STEPS];
#pragma unroll
        for (int k = 0; k < FILTER_STEPS; ++k) {
            const unsigned tap = slot + k * SLOTS;
            filter_raw[k] = make_uint4(0, 0, 0, 0);
            if ((TAPS % SLOTS == 0 || tap < TAPS) && channels_in)
                filter_raw[k] = *reinterpret_cast<const uint4*>(filter + static_cast<int>(tap) * out_depth + oc0 + c);
        }

        // The tile.  Offset of staged position (row, col): origin + row * row_step + col * out_depth.
        const int origin = ((n * out_rows + o_row0) * out_cols + o_col0) * out_depth + oc0 + c;
        const int row_step = out_cols * out_depth;
        if constexpr (SLOTS >= Cols::STAGED) {
            // Slots cover whole staged rows: slot = group * Cols::STAGED + col, and the slot
            // takes column col of rows group, group + GROUPS, ...; the index math is one
            // division per thread, then an add per step (slots past GROUPS rows idle).
            constexpr int GROUPS = SLOTS / Cols::STAGED;
            constexpr int STEPS = (Rows::STAGED + GROUPS - 1) / GROUPS;
            const int group = static_cast<int>(slot / Cols::STAGED), col = static_cast<int>(slot % Cols::STAGED);
            if (group < GROUPS) {
                const bool col_in = static_cast<unsigned>(o_col0 + col) < static_cast<unsigned>(out_cols);
                // A pointer advanced by GROUPS rows per step: two adds, no multiply.
                const T* from = out_backprop + (origin + group * row_step + col * out_depth);
                const long long advance = static_cast<long long>(GROUPS) * row_step;
                // Staged position slot + k GROUPS Cols::STAGED at step k (slot = group Cols::STAGED + col).
                Acc* const to = stage + static_cast<int>(slot) * CHANNELS;
                const bool inside = col_in && channels_in && o_row0 >= 0 && o_row0 + Rows::STAGED <= out_rows;
                constexpr int BATCH = STEPS > 16 ? kBatch : STEPS;
#pragma unroll
                for (int k0 = 0; k0 < STEPS; k0 += BATCH) {
                    uint4 raw[BATCH];
                    if (inside) {  // every row of the column inside out_backprop (most tiles): no checks
#pragma unroll
                        for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                            if (Rows::STAGED % GROUPS == 0 || k + 1 < STEPS || group + k * GROUPS < Rows::STAGED)
                                raw[k - k0] = *reinterpret_cast<const uint4*>(from);
                            from += advance;
                        }
                    } else {
#pragma unroll
                        for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                            const int row = group + k * GROUPS;
                            raw[k - k0] = make_uint4(0, 0, 0, 0);
                            if ((Rows::STAGED % GROUPS == 0 || k + 1 < STEPS || row < Rows::STAGED) && col_in &&
                                channels_in && static_cast<unsigned>(o_row0 + row) < static_cast<unsigned>(out_rows))
                                raw[k - k0] = *reinterpret_cast<const uint4*>(from);
                            from += advance;
                        }
                    }
#pragma unroll
                    for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                        if (Rows::STAGED % GROUPS != 0 && k + 1 == STEPS && group + k * GROUPS >= Rows::STAGED)
                            break;
                        Acc values[ELEMENTS];
                        widen<T, Acc>(raw[k - k0], values);
                        store_staged<SWIZZLE, true>(to + k * GROUPS * Cols::STAGED * CHANNELS, offsets,
                                                    k * GROUPS * Cols::STAGED % 2 != 0, values);
                    }
                }
            }
        } else {
            // Staged rows wider than a step: positions slot, slot + SLOTS, ... in row-major
            // order, walked with a carry instead of a division per step.
            constexpr int STEPS = (POSITIONS + SLOTS - 1) / SLOTS;
            GridWalk<Cols::STAGED, SLOTS> walk(slot, origin, row_step, out_depth);
            const bool inside = channels_in && o_row0 >= 0 && o_row0 + Rows::STAGED <= out_rows && o_col0 >= 0 &&
                                o_col0 + Cols::STAGED <= out_cols;
            constexpr int BATCH = STEPS > 16 ? kBatch : STEPS;
#pragma unroll
            for (int k0 = 0; k0 < STEPS; k0 += BATCH) {
                uint4 raw[BATCH];
                if (inside) {  // the whole staged tile inside out_backprop (most tiles): no checks
#pragma unroll
                    for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                        if (POSITIONS % SLOTS == 0 || slot + k * SLOTS < POSITIONS)
                            raw[k - k0] = *reinterpret_cast<const uint4*>(out_backprop + walk.offset);
                        walk.next();
                    }
                } else {
#pragma unroll
                    for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                        raw[k - k0] = make_uint4(0, 0, 0, 0);
                        if ((POSITIONS % SLOTS == 0 || slot + k * SLOTS < POSITIONS) && channels_in &&
                            static_cast<unsigned>(o_row0 + static_cast<int>(walk.row)) <
                                static_cast<unsigned>(out_rows) &&
                            static_cast<unsigned>(o_col0 + static_cast<int>(walk.col)) <
                                static_cast<unsigned>(out_cols))
                            raw[k - k0] = *reinterpret_cast<const uint4*>(out_backprop + walk.offset);
                        walk.next();
                    }
                }
#pragma unroll
                for (int k = k0; k < k0 + BATCH && k < STEPS; ++k) {
                    if (POSITIONS % SLOTS != 0 && slot + k * SLOTS >= POSITIONS) break;
                    Acc values[ELEMENTS];
                    widen<T, Acc>(raw[k - k0], values);
                    store_staged<SWIZZLE, true>(stage + (slot + k * SLOTS) * CHANNELS, offsets, k * SLOTS % 2 != 0,
                                                values);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < FILTER_STEPS; ++k) {
            if (TAPS % SLOTS != 0 && slot + k * SLOTS >= TAPS) break;
            Acc values[ELEMENTS];
            widen<T, Acc>(filter_raw[k], values);
            store_staged<SWIZZLE>(taps + (slot + k * SLOTS) * CHANNELS, offsets, k * SLOTS % 2 != 0, values);
#pragma unroll
            for (int u = 0; u < ELEMENTS; ++u) finite += values[u] * Acc(0);
        }
    }

    Acc acc[S::ITEM_ROWS][S::ITEM_COLS][V];
#pragma unroll
    for (int i = 0; i < S::ITEM_ROWS; ++i)
#pragma unroll
        for (int j = 0; j < S::ITEM_COLS; ++j)
#pragma unroll
            for (int u = 0; u < V; ++u) acc[i][j][u] = Acc(0);

    // At least one slice (depth_multiplier >= 1; the launcher runs no empty tensor), so a do-while:
    // a for loop's zero-trip exit had ptxas zero the accumulators on both sides of its test, 16-28
    // instructions a thread on every path (sm_90: the stride-2 path's 396 -> 416 at b6601c2).
    int q = 0;
    do {
        __syncthreads();  // the flag is initialised; the previous slice has been read
        if (!vector) {  // the slice, one element per load
            const unsigned t = static_cast<unsigned>(opaque_value(static_cast<int>(tid)));
            finite = Acc(0);
            // The filter slice one element per load: thread t takes slot t % CHANNELS of taps
            // t / CHANNELS, + THREADS / CHANNELS, ...  Slot c is out_backprop channel oc0 + c *
            // channel_step + q, except NCHW's paired order: slot c = j + LANES * m is channel
            // 2 (c0 + j) + m.  NCHW keeps a lane's slots lane and lane + LANES side by side in a
            // tap's row (V (c % LANES) + c / LANES), so that a lane reads each tap's pair in one
            // load, as NHWC does.
            constexpr int COUNT = TAPS * CHANNELS;
            const int c = static_cast<int>(t % CHANNELS);
            const bool nchw_pairs = L == NCHW && pairs;
            const int in_slot = nchw_pairs ? c % LANES : c >> pairs;  // its input channel - c0
            const int slot_channel = nchw_pairs ? 2 * (c % LANES) + c / LANES : c * channel_step + q;
            const bool channel_in = c0 + in_slot < in_depth;
            // Only the last step can pass the last tap, so only it carries the guard: a guard
            // that may end the loop in every step kept each step's load from being issued
            // before the previous step's store (one load round trip per step).
            constexpr int FILTER_LOADS = (COUNT + THREADS - 1) / THREADS;
            static_assert(THREADS % CHANNELS == 0, "whole taps per step");
#pragma unroll
            for (int k = 0; k < FILTER_LOADS; ++k) {
                const int tap = static_cast<int>(t / CHANNELS) + k * (THREADS / CHANNELS);
                if (COUNT % THREADS != 0 && k + 1 == FILTER_LOADS && tap >= TAPS) break;
                Acc value = Acc(0);
                if (channel_in) value = to_acc<Acc>(filter[tap * out_depth + oc0 + slot_channel]);
                const int slot_at = L == NCHW ? V * (c % LANES) + c / LANES : swizzled(c, SWIZZLE && tap % 2 != 0);
                taps[tap * CHANNELS + slot_at] = value;
                finite += value * Acc(0);
            }
            if (L == NHWC) {  // consecutive threads on consecutive channels of one position
                constexpr int COUNT = POSITIONS * CHANNELS;
#pragma unroll 4
                for (unsigned e = t; e < COUNT; e += THREADS) {
                    const unsigned position = e / CHANNELS;
                    const int c = static_cast<int>(e % CHANNELS);
                    const int o_row = o_row0 + static_cast<int>(position / Cols::STAGED);
                    const int o_col = o_col0 + static_cast<int>(position % Cols::STAGED);
                    Acc value = Acc(0);
                    if (static_cast<unsigned>(o_row) < static_cast<unsigned>(out_rows) &&
                        static_cast<unsigned>(o_col) < static_cast<unsigned>(out_cols) && c0 + (c >> pairs) < in_depth)
                        value = to_acc<Acc>(out_backprop[((n * out_rows + o_row) * out_cols + o_col) * out_depth +
                                                         oc0 + c * channel_step + q]);
                    stage[position * CHANNELS + swizzled(c, SWIZZLE && position % 2 != 0)] = value;
                }
            } else {
                // NCHW: rows of the channel planes, 16-byte chunks where rows are aligned (bit 0
                // of vector_loads), else one element per load (see "NCHW" and stage_planes).
                const int plane = out_rows * out_cols;
                const int plane0 = (n * out_depth + oc0 + q) * plane;
                // Slots that exist (paired: input channels, each with both slots); the planes of
                // slots s and s + LANES (unpaired: channels LANES * M apart; paired: the two
                // multiplier slices of one input channel, 1 apart).
                const int staged_channels = pairs ? min(LANES, in_depth - c0) : min(CHANNELS, in_depth - c0);
                const int step_lo = (pairs ? 2 : channel_step) * plane;
                const int step_hi = pairs ? plane : LANES * channel_step * plane;
                // Chunk bytes: 16, 8 or 4 (bits 0, 2, 3 of vector_loads), else one element.
                const int chunk_bytes = (vector_loads & 1) ? 16 : (vector_loads & 4) ? 8 : (vector_loads & 8) ? 4 : 0;
                constexpr int W = static_cast<int>(sizeof(T));
                if (chunk_bytes == 16)
                    stage_planes<16 / W, CHANNELS, Rows::STAGED, Cols::STAGED, P::RP, P::CP, THREADS>(
                        out_backprop, stage, t, plane0, step_lo, step_hi, staged_channels, pairs != 0, o_row0,
                        o_col0, out_rows, out_cols);
                else if (W < 8 && chunk_bytes == 8)
                    stage_planes<(W < 8 ? 8 / W : 1), CHANNELS, Rows::STAGED, Cols::STAGED, P::RP, P::CP, THREADS>(
                        out_backprop, stage, t, plane0, step_lo, step_hi, staged_channels, pairs != 0, o_row0,
                        o_col0, out_rows, out_cols);
                else if (W < 4 && chunk_bytes == 4)
                    stage_planes<(W < 4 ? 4 / W : 1), CHANNELS, Rows::STAGED, Cols::STAGED, P::RP, P::CP, THREADS>(
                        out_backprop, stage, t, plane0, step_lo, step_hi, staged_channels, pairs != 0, o_row0,
                        o_col0, out_rows, out_cols);
                else
                    stage_planes<1, CHANNELS, Rows::STAGED, Cols::STAGED, P::RP, P::CP, THREADS>(
                        out_backprop, stage, t, plane0, step_lo, step_hi, staged_channels, pairs != 0, o_row0,
                        o_col0, out_rows, out_cols);
            }
        }
        if (finite != Acc(0)) nonfinite_slice = q;  // NaN: some value was Inf or NaN
        __syncthreads();  // the slice is staged

        if (active) {
            Lane<Acc> w[TAPS];
#pragma unroll
            for (int tap = 0; tap < TAPS; ++tap)  // NCHW: slots lane and lane + LANES, side by side
                w[tap] = *reinterpret_cast<const Lane<Acc>*>(taps + tap * CHANNELS +
                                                             swizzled(V * lane, SWIZZLE && tap % 2 != 0));
            if (nonfinite_slice != q) {
                if (L == NCHW)
                    accumulate_planes<false, Acc, KH, KW, SH, SW, R, C, P::READ, P::RP, P::CP>(window, w, acc, 0, 0, 0,
                                                                                            0);
                else
                    accumulate<false, Acc, KH, KW, SH, SW, R, C>(window, window_odd, w, acc, 0, 0, 0, 0);
            } else {
                // The part of this thread's window inside out_backprop (computed here, from
                // opaque values, so that it is not hoisted into the common path).
                const int window_row = opaque_value(o_row0 + i0 / SH), window_col = opaque_value(o_col0 + j0 / SW);
                const int row_begin = max(0, -window_row), row_end = min(Rows::WINDOW, out_rows - window_row);
                const int col_begin = max(0, -window_col), col_end = min(Cols::WINDOW, out_cols - window_col);
                if (L == NCHW)
                    accumulate_planes<true, Acc, KH, KW, SH, SW, R, C, P::READ, P::RP, P::CP>(
                        window, w, acc, row_begin, row_end, col_begin, col_end);
                else
                    accumulate<true, Acc, KH, KW, SH, SW, R, C>(window, window_odd, w, acc, row_begin, row_end,
                                                               col_begin, col_end);
            }
        }
    } while (++q < slices);

    if (L == NHWC) {
        if (!active) return;
        T* const first = in_backprop + ((n * in_rows + y_first) * in_cols + x_first) * in_depth + channel;
        if (V == 2 && pairs)
            store_item_nhwc<true, T>(first, acc, y_first, x_first, in_rows, in_cols, in_depth, false);
        else
            store_item_nhwc<false, T>(first, acc, y_first, x_first, in_rows, in_cols, in_depth, channel + 1 < in_depth);
    } else if (active) {
        // NCHW: each work item row of each channel, 4 or 2 columns per store where in_cols and
        // the tile's columns allow (bits 1 and 4 of vector_loads), straight from the registers.
        const int store_cols = (vector_loads & 2) ? 4 : (vector_loads & 16) ? 2 : 1;
#pragma unroll
        for (int u = 0; u < V; ++u) {
            const int c = channel + u * LANES;
            // A compile-time trip count and no second exit: with (pairs ? 1 : V) trips and a break,
            // NVRTC 12.9 left this loop rolled for sm_100 and sm_120, indexing acc by u from a
            // 224-byte stack frame.
            if (u > 0 && (pairs || c >= in_depth)) continue;
            T* const first = in_backprop + ((n * in_depth + c) * in_rows + y_first) * in_cols + x_first;
#pragma unroll
            for (int i = 0; i < S::ITEM_ROWS; ++i) {
                if (static_cast<unsigned>(y_first + i) >= static_cast<unsigned>(in_rows)) continue;
                Acc quad[4];
#pragma unroll
                for (int j = 0; j < 4; ++j) quad[j] = pairs ? pair_sum(acc[i][j]) : acc[i][j][u];
                static_assert(S::ITEM_COLS == 4, "a work item row is one quad");
                store_quad<T>(first + i * in_cols, quad, x_first, in_cols, store_cols);
            }
        }
    }
}
}  // namespace dwconv

#define GRADOPS_DW_TILED_ARGS                                                                                 \
    filter, out_backprop, in_backprop, in_rows, in_cols, in_depth, depth_multiplier, out_rows, out_cols, pad_top, \
        pad_left, tiles_across, vector_loads, columns_per_warp, pair_multipliers

template <typename T, typename Acc, int L, int KH, int KW, int SH, int SW, int R, int C>
__global__ void depthwise_conv2d_native_backprop_input_tiled(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    int in_rows, int in_cols, int in_depth, int depth_multiplier, int out_rows, int out_cols, int pad_top,
    int pad_left, int tiles_across, int vector_loads, int columns_per_warp, int pair_multipliers) {
    dwconv::tiled_input_gradient<T, Acc, L, KH, KW, SH, SW, R, C>(GRADOPS_DW_TILED_ARGS);
}

// Register budgets.  The half types' stride-1 NHWC tiles of 2 x 2 work items (64 threads) are
// limited by registers where an SM has 228 KiB of shared memory (sm_90, sm_100): 98 registers
// (3x3) fit 16 warps an SM (4 a scheduler of 16,384 registers) where shared memory holds 20
// (10 CTAs of 22.2 KiB with the 1 KiB each reserves), 144 (5x5) 12 where it holds 14.  These
// specialisations ask ptxas for 10 and 8 CTAs an SM, i.e. 96 and 128 registers, which it meets
// without a spill on those archs with NVRTC 13 (and on sm_90 with 12.9; on sm_100 12.9 spills
// 244-372 bytes, so there it keeps the unbounded kernel).  Elsewhere shared memory caps the
// CTAs first (sm_80 164 KiB: 7 and 5; sm_86 / sm_120 100 KiB: 4 and 3), so the bound would buy
// nothing; and a bound on any other instantiation moves ptxas's allocation (NCHW 3x3: 168 ->
// 216 registers), hence explicit specialisations, not a bound on the template.  Half types
// only: float32 spills at 96 (8-12 bytes on sm_90).  Registers and spills per arch and NVRTC:
// the install check; the static report's occupancy: tests/test_static_report.py.
#if GRADOPS_ARCH == 900 || (GRADOPS_ARCH >= 1000 && GRADOPS_ARCH < 1100 && GRADOPS_CUDACC_MAJOR >= 13)
#define GRADOPS_DW_TILED_BOUNDED(ELEMENT, K, CTAS)                                                      \
    template <>                                                                                       \
    __global__ void __launch_bounds__(64, CTAS)                                                       \
        depthwise_conv2d_native_backprop_input_tiled<ELEMENT, float, NHWC, K, K, 1, 1, 2, 2>(         \
            const ELEMENT* __restrict__ filter, const ELEMENT* __restrict__ out_backprop,              \
            ELEMENT* __restrict__ in_backprop, int in_rows, int in_cols, int in_depth, int depth_multiplier, \
            int out_rows, int out_cols, int pad_top, int pad_left, int tiles_across, int vector_loads,   \
            int columns_per_warp, int pair_multipliers) {                                             \
        dwconv::tiled_input_gradient<ELEMENT, float, NHWC, K, K, 1, 1, 2, 2>(GRADOPS_DW_TILED_ARGS);  \
    }
GRADOPS_DW_TILED_BOUNDED(__half, 3, 10)
GRADOPS_DW_TILED_BOUNDED(__nv_bfloat16, 3, 10)
GRADOPS_DW_TILED_BOUNDED(__half, 5, 8)
GRADOPS_DW_TILED_BOUNDED(__nv_bfloat16, 5, 8)
#undef GRADOPS_DW_TILED_BOUNDED
#endif
#undef GRADOPS_DW_TILED_ARGS

// ==================================================================== the planes kernel
//
// depthwise_conv2d_native_backprop_input_planes (NCHW, 3x3 and 5x5 filters at stride S = 1 or
// 2 on both axes, dilation 1, any multiplier): a CTA owns PLANES consecutive input channels of
// one image and a band of BAND input rows across the whole width.  In NCHW those channels' out_backprop rows
// are one contiguous run of memory per slice (one run for all the CTA's planes where a band
// covers the image), so staging is one loop of coalesced chunks of consecutive elements, and
// the result rows are contiguous too.
//
// Why (measured, H200, 2026-11-28, benchmarks/results/gpu_h200_2026-11-28): the tiled kernel
// runs NCHW 2.2-3.8 times slower than NHWC on the same shapes (MobileNetV2 dw10 7x7x960 3x3/1
// multiplier 1, float16: 25.3 us against 6.7 us); its NCHW staging loads plane rows a few
// bytes at a time into a channel block of 32 planes, and its result stores scatter over them.
// This kernel reads and writes each plane's rows as they lie.
//
// Staging.  The staged plane of slice (p, q) holds out_backprop rows row_origin .. row_origin +
// staged_rows - 1 and columns col_origin .. col_origin + pitch - 1 of channel (c0 + p) * M + q;
// positions outside out_backprop are zeros.  The buffer is zeroed first and the loads overwrite
// what lies inside out_backprop (a barrier between).
// * S = 1: row_origin = y0 + pad_top - (KH - 1), col_origin = pad_left - (KW - 1).
//   Input-gradient position (y0 + i, x) takes tap (r, s) from staged position (i + KH - 1 - r,
//   x + KW - 1 - s): every tap of every position at a fixed offset, no bounds test and no
//   division in the inner loop.
// * S = 2 (stride-phase decomposition, as the tiled kernel's "Indices"): every position's
//   stride phase, hence which taps land on it, is a compile-time constant.  Padded position (Y, X)
//   (padded = input + pad) takes tap (r, s) from out_backprop ((Y - r) / 2, (X - s) / 2) exactly
//   when both divisions are exact.  Bands start at even padded rows: y0 = band index x BAND -
//   pad_top % 2 (row -1 is computed where pad_top is odd, and not stored), so an item's rows i, i
//   + 1 have phases 0 and 1 and read staged rows i / 2 .. i / 2 + HALO (HALO = (K - 1) / 2,
//   row_origin = (y0 + pad_top) / 2 - HALO).  Items take columns x = 8 b .. 8 b + 7 (aligned
//   result stores), whose phases are PC, 1 - PC, ... with PC = pad_left % 2, a compile-time
//   parameter of the sums (the CTA branches once): they read staged columns 4 b .. 4 b + 3 +
//   HALO + PC (col_origin = pad_left / 2 - HALO).  Only the taps that land are computed (9 of
//   36 per 2 x 2 positions at 3x3), and the staged plane is a quarter of the input plane: bands
//   go 4 times as far.
//
// Work items.  A thread computes 2 x 4 positions (stride 2: 2 x 8; rows i, i + 1, consecutive
// columns) of one plane (a work item), each summing over slice q, then tap row (bottom to top),
// then tap column (right to left): a fixed order, so results are bitwise reproducible.  It reads
// each of its window rows' 8 staged values in 16-byte loads (S = 1: KH + 1 rows; S = 2: HALO + 1;
// pitch is a multiple of 4, so they are aligned) and keeps the slice's filter taps in registers
// (16-byte loads from a padded copy in shared memory).
// Consecutive threads take consecutive items of a row, so a quarter-warp's 16-byte reads are
// consecutive 16-byte words, without bank conflicts, unless its items run on into the next row
// pair onto a bank of its first ones (execution model, float32 3x3 stride 1: 56 columns none,
// 112 1.1x the ideal wavefronts, 28 and 14 columns 1.6-1.75x).  The staging stores, one element
// each with consecutive lanes' chunks 32 bytes apart, take about 5 wavefronts for 1 (measured
// 4.7-way on the H200, 2026-12-04); tests/test_depthwise_conv2d_native_backprop_input.py,
// test_planes_shared_memory_wavefronts, holds both where they are.
//
// Result stores.  An item stores its two rows, planes_store_cols elements a store.  Where a row
// holds many items, a warp's lanes store consecutive runs of one row: whole 32-byte sectors.  On
// maps of 14 or 7 columns (two or one item a row) consecutive lanes jump rows and each store
// writes 2-8 bytes into each of up to 32 sectors: 4-13 bytes a sector in all
// (benchmarks/results/planes_store_sectors.md), and the H100 (2026-12-05, the planes kernel
// forced) measured those layers at 12-48% of HBM where the whole-sector ones reached 44-79%.
// The STAGED form (stride 2, where the launcher counts fewer than PLANES_STAGED_BELOW bytes a
// sector: planes_staged_result) writes the items' rows into an image of the CTA's results in
// shared memory instead, the same stores, and after a barrier the CTA copies the image to
// in_backprop, 16 bytes a store, consecutive threads on consecutive 16 bytes.  The bits are the
// direct stores'.  Not at stride 1: there the image offset does not fit the register bounds.
//
// Padding.  As in the tiled kernel: a zero staged in place of a position outside out_backprop
// adds w * 0 = +-0, which changes no sum unless w is Inf or NaN; a CTA whose filter slices
// hold one runs the CHECKED item loop, which skips those positions, so the result is TF's.
//
// Index math: 32-bit (the launcher checks every tensor is below 2^31 elements); the staging
// chunk and work-item indices are split with the host's multiply-shift constants
// (division_magic), not divisions.
namespace dwplanes {

inline constexpr int kThreads = 256;
// Positions of a work item: 4 consecutive columns of 2 consecutive rows (the rows share all
// but one of their KH + 1 window rows, and the item's fixed costs are spread over 8 positions).
inline constexpr int kSegment = 4;
inline constexpr int kItemRows = 2;
// Columns of a work item at stride S: 4, and 8 at stride 2, where a position's sums are a
// quarter of stride 1's and the item's fixed costs (index split, pointers, stores) would
// otherwise be most of its instructions (sm_90, float16 3x3: 129 a 2 x 4 item, 16 a position).
template <int S> constexpr int kItemCols = kSegment * S;
// Staged values a work item reads per window row (K <= 5): its 4 columns and up to 4 halo
// columns at stride 1; at stride 2 its 4 staged columns and up to 3 (HALO + PC).
inline constexpr int kWindow = 8;
// out_backprop elements a thread stages per step (one row's, consecutive).
inline constexpr int kChunk = 8;
// Static shared memory per CTA: 8 CTAs of 256 threads (an SM's 2048 threads) fit in 192 KiB.
inline constexpr int kSharedBytes = 24576;

// CTAs an SM the register bound keeps (__launch_bounds__, NVRTC 13 and sm_75 on: see
// GRADOPS_PLANES_BOUNDS): as many as each instantiation had before the 16-byte staging stores,
// where that compiles without spilling (NVRTC 13.5, sm_75 to sm_121).  Without bounds ptxas
// took more registers for the same loops (sm_90: 47-48 at 3x3 stride 1, 5 CTAs where 6 fitted
// before; 72 at float 5x5 stride 1, 3 where 4).  One CTA fewer than before where the bound
// spilled: the half types' 3x3 stride 1 (a register on sm_90), double 3x3 stride 1, and on
// Blackwell (sm_100 to sm_121) float 3x3 stride 1 (4-8 bytes) and the half types' 5x5 stride 1 (4).
template <typename T, int KH, int S, bool STAGED> struct MinBlocks {
    static constexpr bool HALF = sizeof(T) == 2, DOUBLE = sizeof(T) == 8, BLACKWELL = GRADOPS_ARCH >= 1000;
    // The staged form of float 5x5 spilled 4 bytes at 3 CTAs under NVRTC 12.9 on sm_90 (80
    // registers; 13.5 fits them): 2 there.
    static constexpr bool STAGED_12 = STAGED && sizeof(T) == 4 && KH == 5 && GRADOPS_CUDACC_MAJOR < 13 &&
                                      GRADOPS_ARCH == 900;
    static constexpr int value = KH == 3 ? (S == 1 ? (HALF ? 5 : DOUBLE ? 3 : BLACKWELL ? 5 : 6) : (DOUBLE ? 2 : 4))
                                         : (DOUBLE || STAGED_12 ? 2 : S == 1 ? (HALF && BLACKWELL ? 3 : 4) : 3);
};

// A K x K filter slice padded to a multiple of 4 accumulators (whole 16-byte loads).
template <int KH, int KW> struct Taps {
    static constexpr int COUNT = KH * KW;
    static constexpr int PADDED = (COUNT + 3) / 4 * 4;
};

// N consecutive accumulators of 16-byte aligned shared memory, 16 bytes per load.
template <int N, typename Acc> __device__ __forceinline__ void load_aligned(const Acc* src, Acc (&out)[N]) {
    constexpr int PER_LOAD = 16 / static_cast<int>(sizeof(Acc));
    static_assert(N % PER_LOAD == 0, "whole 16-byte loads");
#pragma unroll
    for (int k = 0; k < N; k += PER_LOAD) {
#ifdef GRADOPS_HOST_MODEL
        gradops_host::count_access(src + k, gradops_host::LOAD, 16);  // its bank wavefronts (tests)
#endif
        dwconv::load_run<PER_LOAD>(src + k, out + k);
    }
}

// One 16-byte group of staged values (a run of 16 / sizeof(Acc) staged columns starting at a
// multiple of it) to shared memory where ``store`` holds: a predicated st.shared.v4
// (ptx::st_shared_16_if; a float4 assignment compiled to four STS.32 here, the compiler unable
// to derive the alignment from the run-time offsets, and an if around it to a branch that
// recomputed the address).  The host model refuses an address that is not 16-byte aligned and
// counts the warp-level store's bank wavefronts, a lane that does not store as an idle lane (tests).
template <typename Acc, int N> __device__ __forceinline__ void put_group(Acc* at, const Acc (&v)[N], bool store) {
    static_assert(N * sizeof(Acc) == 16, "one 16-byte store");
    ptx::st_shared_16_if(at, v, store);
}

// One work item's sums from one staged slice: ``plane`` is the staged value at (staged row i,
// staged column x), the window's first; ``w`` the slice's taps.  Staged row i + a feeds item row
// j through tap row r = j + KH - 1 - a, so KH + 1 window rows serve both item rows.  Each sum
// runs over tap row from the bottom (a ascending), then tap column from the right.  CHECKED
// skips staged positions outside out_backprop: staged rows [row_begin, row_end) and columns
// [col_begin, col_end) are inside.
template <bool CHECKED, int KH, int KW, typename Acc>
__device__ __forceinline__ void accumulate_item(const Acc* __restrict__ plane, int pitch, const Acc (&w)[Taps<KH, KW>::PADDED],
                                                Acc (&acc)[kItemRows][kSegment], int i, int x, int row_begin,
                                                int row_end, int col_begin, int col_end) {
#pragma unroll
    for (int a = 0; a < KH + kItemRows - 1; ++a) {
        Acc v[kWindow];
        load_aligned<kWindow>(plane + a * pitch, v);
        if (CHECKED && (i + a < row_begin || i + a >= row_end)) continue;
#pragma unroll
        for (int j = 0; j < kItemRows; ++j) {
            const int r = j + KH - 1 - a;  // the tap row that carries staged row i + a to item row j
            if (r < 0 || r >= KH) continue;
#pragma unroll
            for (int s = KW - 1; s >= 0; --s) {
#pragma unroll
                for (int u = 0; u < kSegment; ++u) {
                    const int k = u + KW - 1 - s;  // staged column x + k
                    if (CHECKED && (x + k < col_begin || x + k >= col_end)) continue;
                    acc[j][u] += w[r * KW + s] * v[k];
                }
            }
        }
    }
}

// accumulate_item at stride 2 (see "Staging"): ``plane`` is the staged value at (staged row i,
// staged column x), the window's first (i = the item's first row / 2, x = 4 b).  Window row a
// (tap rows 2 (HALO - a) and 2 (HALO - a) + 1) feeds item rows 0 and 1; window column k feeds
// position u (padded phase PC + u) through tap column s = PC + u + 2 (HALO - k): only the taps
// that land, each once.  Each sum runs over window row ascending (tap row from the bottom), then
// window column (tap column from the right), as at stride 1.
template <bool CHECKED, int KH, int KW, int PC, typename Acc>
__device__ __forceinline__ void accumulate_item_s2(const Acc* __restrict__ plane, int pitch,
                                                   const Acc (&w)[Taps<KH, KW>::PADDED],
                                                   Acc (&acc)[kItemRows][kItemCols<2>], int i, int x,
                                                   int row_begin, int row_end, int col_begin, int col_end) {
    constexpr int HALO_COLS = (KW - 1) / 2, HALO_ROWS = (KH - 1) / 2;
    constexpr int COLS = kItemCols<2> / 2 + HALO_COLS + PC;  // window columns that feed the item
    static_assert(kItemRows == 2 && COLS <= kWindow, "a 2-row item, filters up to 5 wide");
#pragma unroll
    for (int a = 0; a <= HALO_ROWS; ++a) {
        Acc v[kWindow];
        load_aligned<kWindow>(plane + a * pitch, v);  // x is a multiple of 4
        if (CHECKED && (i + a < row_begin || i + a >= row_end)) continue;
#pragma unroll
        for (int j = 0; j < kItemRows; ++j) {
            const int r = j + 2 * (HALO_ROWS - a);  // the tap row that carries window row a to item row j
            if (r >= KH) continue;
#pragma unroll
            for (int k = 0; k < COLS; ++k) {
                if (CHECKED && (x + k < col_begin || col_end <= x + k)) continue;  // outside out_backprop
#pragma unroll
                for (int u = 0; u < kItemCols<2>; ++u) {
                    const int s = PC + u + 2 * (HALO_COLS - k);  // the tap column that carries window column k to u
                    if (s < 0 || s >= KW) continue;
                    acc[j][u] += w[r * KW + s] * v[k];
                }
            }
        }
    }
}

// A work item row's N results from column x on (x < in_cols).  ``cols`` 8 (N = 8, in_cols % 8
// == 0: the row lies inside the image, 16-byte aligned in the half types): one 16-byte store
// for the half types, whose quads would write half of each 32-byte sector twice; else a quad at
// a time (dwconv::store_quad: ``cols`` per store, 4 for 8); quads that start past the image are
// not stored.
template <typename T, int N, typename Acc>
__device__ __forceinline__ void store_item_row(T* dst, const Acc (&v)[N], int x, int in_cols, int cols) {
    if constexpr (N == 8 && sizeof(T) == 2) {
        if (cols == 8) {
            dwconv::store_eight<T>(dst, v);
            return;
        }
    }
    const int quad_cols = cols == 8 ? 4 : cols;
#pragma unroll
    for (int h = 0; h < N; h += kSegment) {
        const Acc quad[kSegment] = {v[h], v[h + 1], v[h + 2], v[h + 3]};
        if (h == 0 || x + h < in_cols) dwconv::store_quad<T>(dst + h, quad, x + h, in_cols, quad_cols);
    }
}

}  // namespace dwplanes

// filter [KH, KW, in_depth, depth_multiplier], out_backprop [batch, in_depth * M, out_rows,
// out_cols], in_backprop [batch, in_depth, in_rows, in_cols] (NCHW).  Grid: (channel groups of
// ``planes``, bands of ``band`` rows, batch); block: dwplanes::kThreads.  With staged_rows =
// band rounded up to kItemRows, / S, + (KH - 1) / S, the launcher chooses planes and band (even
// at S = 2) so that planes x M x (staged_rows x pitch + Taps::PADDED) values fit kSharedBytes;
// pitch = 4 x segments + 4, with segments = ceil(in_cols / kItemCols<S>) (an item's staged
// columns: 4 a segment at either stride); rows_cap = min(out_rows, staged_rows), the most
// out_backprop rows a band stages.  Each (magic, shift) pair divides by: chunk, ceil(out_cols / kChunk);
// rows, rows_cap; items, ceil(band / kItemRows) x segments; segments, segments.  store_cols: 8
// (stride 2, in_cols % 8 == 0: a work item row in one store for the half types), 4, 2 or 1 result
// columns per store (store_quad: 4 where in_cols % 4 == 0, 2 where it is even).  load_elements: 8, 4
// or 2 elements (16, 8 or 4 bytes) a staging load where that divides an out_backprop row and
// out_backprop is aligned to it, else 1 (the staging loop's stage_rows).
// __launch_bounds__ (GRADOPS_PLANES_BOUNDS): dwplanes::MinBlocks from sm_75, but for NVRTC 12
// (the cuda12 extra) on sm_120, whose ptxas spilled 12 bytes of float 5x5 stride 1 at them, as
// it spilled 12-36 bytes of six instantiations on sm_50 to sm_70 (unbounded there: 60-130
// registers, none spilled; NVRTC 12.9 unbounded on sm_90 took 55 registers at float 3x3 stride
// 1, 4 CTAs).  With (kThreads) alone ptxas kept 48 or 64 registers and spilled 4-12 bytes in
// half of the instantiations (NVRTC 13.5, sm_80 / sm_90).
#if GRADOPS_ARCH >= 750 && (GRADOPS_CUDACC_MAJOR >= 13 || GRADOPS_ARCH < 1200)
#define GRADOPS_PLANES_BOUNDS(T, KH, S, STAGED) \
    __launch_bounds__(dwplanes::kThreads, (dwplanes::MinBlocks<T, KH, S, STAGED>::value))
#else
#define GRADOPS_PLANES_BOUNDS(T, KH, S, STAGED)
#endif
template <typename T, typename Acc, int KH, int KW, int S, bool STAGED = false>
__global__ void GRADOPS_PLANES_BOUNDS(T, KH, S, STAGED) depthwise_conv2d_native_backprop_input_planes(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop,
    int in_rows, int in_cols, int in_depth, int depth_multiplier, int out_rows, int out_cols, int pad_top,
    int pad_left, int planes, int band, int segments, int rows_cap, int store_cols, int load_elements,
    unsigned chunk_magic, int chunk_shift, unsigned rows_magic, int rows_shift,
    unsigned items_magic, int items_shift, unsigned segments_magic, int segments_shift) {
    using namespace dwplanes;
    using Tp = Taps<KH, KW>;
    static_assert(S == 1 || S == 2, "strides 1 and 2");
    // Stride 1's bounds leave no register for the image offset (staged, float 3x3 spilled 4-20
    // bytes at 40 and 48 registers, the half types at 48: sm_90, NVRTC 13.5).
    static_assert(!STAGED || S == 2, "staged result stores at stride 2");
    constexpr int ITEM_COLS = kItemCols<S>;
    constexpr int BUFFER = kSharedBytes / static_cast<int>(sizeof(Acc));
    __shared__ __align__(16) Acc shared[BUFFER];

    const int M = depth_multiplier;
    const int c0 = static_cast<int>(blockIdx.x) * planes;
    const int y0 = static_cast<int>(blockIdx.y) * band - pad_top % S;  // an even padded row at S = 2
    const int n = static_cast<int>(blockIdx.z);
    const int my_planes = min(planes, in_depth - c0);
    const int slices = my_planes * M;  // staged slices: out_backprop channels c0 * M .. c0 * M + slices - 1
    // The last item's rows too; at S = 2 a whole item lies in its band (band is even).
    const int staged_rows = (band + kItemRows - 1) / kItemRows * kItemRows / S + (KH - 1) / S;
    const int pitch = kSegment * segments + kSegment;
    const int tid = static_cast<int>(threadIdx.x);
    Acc* const taps = shared;                                 // [slices][Tp::PADDED]
    Acc* const stage = shared + planes * M * Tp::PADDED;      // [slices][staged_rows][pitch]
    // Result stores (STAGED): the rows of the band inside the image, row_stored .., of the CTA's
    // planes are one contiguous run of in_backprop from run_first (the launcher stages only where
    // a CTA has one plane or whole planes).  The items write them into an image after the staged
    // planes, element (p, y, x) at byte image_first + ((p * in_rows + y) * in_cols + x) *
    // sizeof(T) of ``stage``, where image_first places in_backprop[run_first + k]'s element at a
    // 16-byte alignment equal to its own (in_backprop is 16-byte aligned); then the CTA copies the
    // run out ("The image to in_backprop" below).
    const int row_stored = max(y0, 0);
    const int run_first = ((n * in_depth + c0) * in_rows + row_stored) * in_cols;
    // (One byte offset, which the item loop keeps: with the image's base and first element apart
    // ptxas spilled more at stride 1's bounds, where there is no staged form now: sm_90, NVRTC 13.5.)
    const int image_first = static_cast<int>(sizeof(Acc)) * (planes * M * staged_rows * pitch) +
        static_cast<int>(sizeof(T)) * (run_first % (16 / static_cast<int>(sizeof(T))) - row_stored * in_cols);

    // The filter slices (tap-major in global memory: consecutive threads, consecutive slices),
    // checked for values that are not finite (see "Padding").
    bool nonfinite = false;
    for (int k = tid; k < Tp::COUNT * slices; k += kThreads) {
        const int tap = k / slices, slice = k - tap * slices;
        const Acc w = to_acc<Acc>(filter[tap * in_depth * M + c0 * M + slice]);
        nonfinite |= w * Acc(0) != Acc(0);  // NaN exactly when w is Inf or NaN
        taps[slice * Tp::PADDED + tap] = w;
    }
    // Zero the staged planes (16 bytes per store), then load what lies inside out_backprop.
    {
        constexpr int PER_STORE = 16 / static_cast<int>(sizeof(Acc));
        const Acc zeros[PER_STORE] = {};
        for (int k = tid * PER_STORE; k < slices * staged_rows * pitch; k += kThreads * PER_STORE)
            dwconv::store16(stage + k, zeros);
    }
    const bool checked = __syncthreads_or(nonfinite);

    const int row_origin = (y0 + pad_top) / S - (KH - 1) / S;  // out_backprop row of staged row 0
    const int col_origin = pad_left / S - (KW - 1) / S;        // out_backprop column of staged column 0
    const int row_first = max(0, row_origin);
    const int rows_run = min(out_rows, row_origin + staged_rows) - row_first;
    const int plane_size = out_rows * out_cols;
    const int first_index = ((n * in_depth + c0) * M * out_rows + row_first) * out_cols;
    const T* const first = out_backprop + first_index;
    // out_backprop's elements from ``first`` on: a chunk reads all kChunk elements (past its row's
    // end, into the next row, values it does not keep) where the tensor goes on that far.
    const int readable = static_cast<int>(gridDim.z) * in_depth * M * plane_size - first_index;
    // The band's out_backprop rows into the zeroed staged planes.  A thread takes a chunk of
    // kChunk consecutive elements of one out_backprop row: consecutive threads, consecutive chunks
    // of a row, then of the next rows (contiguous in memory).  Every load of a chunk is issued
    // before any store and none is predicated, so a chunk takes one round trip (predicated, they
    // ran out of predicate registers and waited on stores).  Loads of VEC elements: 16, 8 or 4
    // bytes where that divides an out_backprop row and the array is aligned to it (the launcher's
    // load_elements; then every row and chunk starts aligned), else one element.  Why (measured,
    // H200, 2026-12-04, full_sections.md): with one element a load, each of a warp's 8 loads of
    // its chunks spans the 16 sectors of 32 lanes' chunks for 2 or 4 bytes a lane: 78% excess
    // global sectors on this kernel (dw1 112x112x32 float16), L1/TEX at 86% of its peak, DRAM at 18%.
    // Stores: 16-byte groups of PER staged values, aligned in shared memory (see "Staging
    // stores").  (A lambda, not a function: its uses of the kernel's parameters stay reads of the
    // parameter space, where a function's copies took 6-10 registers more.)
    const int chunks_per_row = (out_cols + kChunk - 1) / kChunk;
    // staged_rows again, in unsigned arithmetic (band > 0), for the loop's destination: with the
    // signed division, ptxas recomputed it from the parameters in every iteration of the 3x3
    // stride-1 loops (NVRTC 13.5, sm_90: a chunk of one-element loads 86 instructions, was 96;
    // a row's last chunk 76, was 89), where a separate value keeps the item loop's registers.
    const int slice_rows = static_cast<int>((static_cast<unsigned>(band) + kItemRows - 1) / kItemRows * kItemRows / S) + (KH - 1) / S;
    // Staging stores.  A chunk's values, one a store, went to shared memory 32 bytes (8
    // accumulators) apart in consecutive lanes: 4 to 8 lanes a bank, about 5 wavefronts a store
    // where 1 would do (the execution model's count; measured on the H100, 2026-12-05: the
    // kernel's shared stores 2.7-5.1 wavefronts for each one they need, more shared-store than
    // shared-load wavefronts).  Now they go 16 bytes (PER accumulators) a store, in groups that
    // start at a multiple of PER in the staged row (each staged row starts 16-byte aligned: pitch
    // and Taps::PADDED are multiples of 4).  A chunk's first staged column is lead (mod PER) past
    // such a start, the same for every chunk of the launch (x is a multiple of kChunk, pitch of
    // PER), so a chunk stores the groups from its first column - LEAD: the LEAD values before
    // it (the row's previous chunk's last ones, loaded again, from L1; zeros at the row's start,
    // where they are the left halo) and its own up to the next chunk's first group.  A row's last
    // chunk also stores its last LEAD values, and a short one stores its last group again with
    // zeros past the row (the right halo, which its loads read from the next row), so that the
    // common path masks nothing (masked there, ptxas predicated the masks into every chunk: 12-17
    // more instructions a chunk, sm_90; loaded element by element, float 3x3 stride 1 spilled at
    // its 40 registers).  Groups outside the staged row [0, pitch) (pads wider than the filter
    // reaches) are not stored.
    constexpr int PER = 16 / static_cast<int>(sizeof(Acc));
    const int lead = ((-col_origin) % PER + PER) % PER;
    const auto stage_rows = [&](auto load, auto shift) {
        constexpr int VEC = decltype(load)::value;
        constexpr int LEAD = decltype(shift)::value;
        static_assert(kChunk % VEC == 0 && kChunk % PER == 0, "whole loads and whole groups a chunk");
        using Raw = typename dwconv::ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;
        constexpr int LOADS = kChunk / VEC;
        // The PER elements before a chunk (its row's previous chunk's last ones; aligned to VEC
        // where the chunk is, or to PER), in loads of up to VEC elements; ptxas narrows them to
        // the LEAD values used.
        constexpr int PREV_VEC = VEC < PER ? VEC : PER;
        using PrevRaw = typename dwconv::ChunkOf<PREV_VEC * static_cast<int>(sizeof(T))>::type;
        constexpr int PREV_LOADS = LEAD > 0 ? PER / PREV_VEC : 1;
        constexpr int GROUPS = (LEAD + kChunk + PER - 1) / PER;  // the most a chunk stores (a row's last)
        for (int chunk = tid; chunk < slices * rows_cap * chunks_per_row; chunk += kThreads) {
            const int row_index = magic_divide(chunk, chunk_magic, chunk_shift);  // slice * rows_cap + r
            const int x = (chunk - row_index * chunks_per_row) * kChunk;
            const int slice = magic_divide(row_index, rows_magic, rows_shift);
            const int r = row_index - slice * rows_cap;
            if (r >= rows_run) continue;
            const int offset = slice * plane_size + r * out_cols + x;
            const T* const src = first + offset;
            const int g0 = x - col_origin - LEAD;  // the staged column of the chunk's first group (a multiple of PER)
            Acc* const dst = stage + (slice * slice_rows + row_first - row_origin + r) * pitch + g0;
            const int last = out_cols - 1 - x;  // the chunk's last element inside the row (>= 0)
            Raw raw[LOADS];
            if (offset + kChunk > readable) {  // the tensor's last chunk: element by element
                T* const elements = reinterpret_cast<T*>(raw);
#pragma unroll
                for (int e = 0; e < kChunk; ++e)
                    if (e <= last) elements[e] = src[e];
            } else {
#pragma unroll
                for (int j = 0; j < LOADS; ++j) raw[j] = dwconv::load_vector(reinterpret_cast<const Raw*>(src) + j);
            }
            PrevRaw prev_raw[PREV_LOADS];
            if constexpr (LEAD > 0) {
                // Not predicated: at a row's start (x = 0) the chunk's own first elements, unused
                // (the launcher pads out_backprop where its last row is shorter than PER:
                // planes_tail_padding).  (A shuffle from the previous lane instead, with lane 0
                // loading, spilled 20 bytes of float 3x3 stride 1 at its 40 registers: NVRTC
                // 13.5, sm_90.)
                const PrevRaw* const from = reinterpret_cast<const PrevRaw*>(src - (x > 0 ? PER : 0));
#pragma unroll
                for (int j = 0; j < PREV_LOADS; ++j) prev_raw[j] = dwconv::load_vector(from + j);
            }
            const T* const values = reinterpret_cast<const T*>(raw);  // widened as stored
            const T* const prev = reinterpret_cast<const T*>(prev_raw);
            Acc v[GROUPS * PER];  // from staged column g0 on
#pragma unroll
            for (int i = 0; i < GROUPS * PER; ++i) {
                if (i < LEAD)
                    v[i] = x > 0 ? to_acc<Acc>(prev[PER - LEAD + i]) : Acc(0);
                else if (i - LEAD < kChunk)
                    v[i] = to_acc<Acc>(values[i - LEAD]);
                else
                    v[i] = Acc(0);
            }
            // The staged columns this chunk writes: from g0 up to its next chunk's first group,
            // or (a row's last) past its last element, inside the staged row.
            const int end = min(pitch, g0 + (last < kChunk ? LEAD + last + 1 : kChunk));
            const unsigned limit = static_cast<unsigned>(max(0, end));
#pragma unroll
            for (int j = 0; j < GROUPS; ++j) {
                alignas(16) Acc group[PER];
#pragma unroll
                for (int u = 0; u < PER; ++u) group[u] = v[j * PER + u];
                put_group(dst + j * PER, group, static_cast<unsigned>(g0 + j * PER) < limit);
            }
            if (last < kChunk - 1) {
                // A row's last chunk, short: its last group again, zeros past the row (the right
                // halo; the loads read the next row's values there).  The same thread, in order.
                const int j_last = (LEAD + last) / PER;
#pragma unroll
                for (int j = 0; j < GROUPS; ++j) {
                    if (j != j_last) continue;
                    alignas(16) Acc group[PER];
#pragma unroll
                    for (int u = 0; u < PER; ++u) group[u] = j * PER + u - LEAD <= last ? v[j * PER + u] : Acc(0);
                    put_group(dst + j * PER, group, static_cast<unsigned>(g0 + j * PER) < limit);
                }
            }
        }
    };
    // (lead, as load_elements, is uniform over the launch: a branch, the staging loop inside each case)
    const auto stage_with = [&](auto load) {
        if (lead == 0) stage_rows(load, dwconv::Int<0>{});
        if (lead == 1) stage_rows(load, dwconv::Int<1>{});
        if constexpr (PER == 4) {
            if (lead == 2) stage_rows(load, dwconv::Int<2>{});
            if (lead == 3) stage_rows(load, dwconv::Int<3>{});
        }
    };
    // (load_elements is uniform over the launch: one branch, the staging loop inside each case)
    if constexpr (kChunk * sizeof(T) <= 16) {
        if (load_elements == kChunk) stage_with(dwconv::Int<kChunk>{});
    }
    if constexpr (4 * sizeof(T) <= 16) {
        if (load_elements == 4) stage_with(dwconv::Int<4>{});
    }
    if (load_elements == 2) stage_with(dwconv::Int<2>{});
    if (load_elements == 1) stage_with(dwconv::Int<1>{});
    __syncthreads();

    // Staged rows and columns inside out_backprop (CHECKED only).
    const int row_begin = row_first - row_origin, row_end = row_begin + rows_run;
    const int col_begin = max(0, -col_origin), col_end = out_cols - col_origin;
    const int items = (band + kItemRows - 1) / kItemRows * segments;  // per plane
    for (int item = tid; item < my_planes * items; item += kThreads) {
        const int p = magic_divide(item, items_magic, items_shift);
        const int rest = item - p * items;
        const int pair = magic_divide(rest, segments_magic, segments_shift);
        const int i = pair * kItemRows;
        const int segment = rest - pair * segments;
        const int x = segment * ITEM_COLS;
        const int y = y0 + i;
        if (y >= in_rows) continue;
        Acc acc[kItemRows][ITEM_COLS] = {};
        // One slice an iteration: multipliers are 1 or 2 in practice, where nvcc's 4-way unrolling
        // of the stride-2 sums (stride 1's it leaves rolled) only ran its remainder copies.
#pragma unroll 1
        for (int q = 0; q < M; ++q) {
            const int slice = p * M + q;
            Acc w[Tp::PADDED];
            load_aligned<Tp::PADDED>(taps + slice * Tp::PADDED, w);
            // The window's first staged row and column (an item's ITEM_COLS columns are kSegment
            // out_backprop columns at either stride).
            const int wi = i / S, wx = segment * kSegment;
            const Acc* const plane = stage + (slice * staged_rows + wi) * pitch + wx;
            if constexpr (S == 1) {
                if (checked)
                    accumulate_item<true, KH, KW>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
                else
                    accumulate_item<false, KH, KW>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
            } else if (pad_left % 2 == 0) {  // the column phase PC of the items' first columns
                if (checked)
                    accumulate_item_s2<true, KH, KW, 0>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
                else
                    accumulate_item_s2<false, KH, KW, 0>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
            } else {
                if (checked)
                    accumulate_item_s2<true, KH, KW, 1>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
                else
                    accumulate_item_s2<false, KH, KW, 1>(plane, pitch, w, acc, wi, wx, row_begin, row_end, col_begin, col_end);
            }
        }
        // The item's rows, to in_backprop or (STAGED) to the same place in the image.
        const auto store_rows = [&](T* const dst) {
            // Row -1 (S = 2, an odd pad_top) is computed for its phase and not stored.
            if (S == 1 || y >= 0) store_item_row<T>(dst, acc[0], x, in_cols, store_cols);
            // An odd band's last item reaches one row into the next band, which stores that row.
            if (i + 1 < band && y + 1 < in_rows) store_item_row<T>(dst + in_cols, acc[1], x, in_cols, store_cols);
        };
        if constexpr (STAGED)
            store_rows(reinterpret_cast<T*>(reinterpret_cast<char*>(stage) +
                                            image_first) + (p * in_rows + y) * in_cols + x);
        else
            store_rows(in_backprop + ((n * in_depth + c0 + p) * in_rows + y) * in_cols + x);
    }
    if constexpr (STAGED) {
        // The image to in_backprop, one contiguous run: its first elements up to a 16-byte
        // boundary of in_backprop one a store, then 16 bytes a store (consecutive threads,
        // consecutive 16 bytes: whole sectors), then the rest one a store.
        __syncthreads();
        constexpr int VEC = 16 / static_cast<int>(sizeof(T));
        T* const out = in_backprop + run_first;
        const T* const image = reinterpret_cast<const T*>(reinterpret_cast<const char*>(stage) + image_first) +
                               row_stored * in_cols;  // in_backprop[run_first]'s
        const int length = my_planes * (min(in_rows, y0 + band) - row_stored) * in_cols;
        const int head = min(length, (VEC - run_first % VEC) % VEC);
        const int vectors = (length - head) / VEC;
        // (ptxas unrolls the vector loop 16-fold, with a remainder loop; rolled, the float 3x3
        // form spilled 4 bytes at 64 registers on sm_80: NVRTC 13.5.)
        for (int k = tid; k < head; k += kThreads) out[k] = image[k];
        for (int v = tid; v < vectors; v += kThreads) {
            const int k = head + v * VEC;
            *reinterpret_cast<uint4*>(out + k) = *reinterpret_cast<const uint4*>(image + k);
        }
        for (int k = head + vectors * VEC + tid; k < length; k += kThreads) out[k] = image[k];
    }
}


// ==================================================================== the tensor-core kernel
//
// depthwise_conv2d_native_backprop_input_mma (issue 15): NCHW, half types, K x K filters
// (K = 3 or 5) at stride 1 and dilation 1, multipliers 1 and 2, sm_80 and newer.  Per channel
// plane the gradient is a sum of K row-shifted one-dimensional correlations, and each of those
// is a product with a banded (Toeplitz) matrix, which the tensor cores take:
//   in_backprop[y][x] = sum_q sum_r sum_x' out_backprop_q[y + pad_top - r][x'] * B_qr[x'][x],
//   B_qr[x'][x] = filter[r][x + pad_left - x'][c][q]  (0 where that column is outside [0, K)).
// A warp owns a unit of 16 x 16 positions (rows y0 .., columns x0 .., both multiples of 16) of
// one image's plane c.  The staged tile of slice q holds out_backprop rows y0 + pad_top - (K -
// 1) .. + 15 and kStagedCols columns from a0 = x0 + pad_left - (K - 1) - shift, where shift =
// (pad_left - (K - 1)) mod 8 makes a0 a multiple of 8: whole aligned chunks of out_backprop
// rows (16, 8 or 4 bytes, or single elements: the launcher's ``chunk``), one store each, zeros
// outside out_backprop.  Each half j of the unit (columns x0 + 8 j ..) is a product per tap row r:
// A = 16 staged rows (unit row i reads tile row i + K - 1 - r) x the half's window of tile columns
// from 8 j (ldmatrix rows start 16-byte aligned); B = the band shifted by ``shift``, B[kk][n] =
// filter[r][n - kk + shift + K - 1][c][q] for window column kk, the same for every unit and both
// halves: each lane builds its fragments once, in registers.  The band of a half covers window
// columns shift .. shift + 8 + K - 2 <= 18 (SAME 5x5: shift 6; 3x3: shift 7), so it needs the
// half's 8-column window groups 0, 1 and 2 and never group 3 (columns 24 ..).  Per tap row two
// ldmatrix.x4 load the tile's groups 0 - 3 (columns 0 .. 31): half 0 multiplies groups 0 - 1
// (m16n8k16, band rows 0 .. 15) and group 2 (m16n8k8, band rows 16 .. 23); half 1, whose groups are
// the tile's 1, 2 and 3, multiplies group 1 (m16n8k8, band rows 0 .. 7) and groups 2 - 3 (m16n8k16,
// band rows 8 .. 23).  Each operand is a register pair or quad as ldmatrix delivers it (no moves),
// and four mma a tap row instead of two m16n8k16 per half leave out only band rows 24 .. 31, which
// are zeros.  Tile rows are kRowPitch elements (80 bytes) apart, so the 8 rows of an ldmatrix fall
// on distinct 16-byte bank groups (no conflicts).  Products of half values are exact
// in float and the sums are float (mma.sync's f32 accumulation); the order of additions inside
// an mma is the hardware's, fixed for a given GPU, so results are reproducible run to run.
//
// Non-finite values.  An Inf or NaN in a window meets one of the band's zeros (every window
// column meets at least 8 - K of them, and every filter value meets the zeros staged outside
// out_backprop) and makes some accumulator of the unit NaN; TF skips those products.  So a warp
// whose unit holds any accumulator that is not finite (a probe of one FMA each, then a warp
// vote) recomputes the unit on the CUDA cores from the staged tile, skipping exactly the taps
// outside out_backprop, as the other kernels do (a unit whose true result overflows pays it too
// and gets the same Inf).
//
// Result stores.  A lane holds unit rows g and g + 8, columns 8 j + 2 t and + 1: stored straight
// from the accumulators, each store instruction writes 16 bytes of 8 rows, half of each row's
// sector, so every sector of the results takes two transfers.  The runs form (FORM 3, in_cols a
// multiple of 8) first writes the unit's results into the warp's tile as a 16 x 16 image (the
// next unit restages the whole tile), then each lane stores one 16-byte run of a row: 16 whole
// sectors an instruction where rows start on a sector.
//
// Work split: the grid is (tiles_down x tiles_across unit positions, in_depth, image groups);
// a CTA's kWarps warps take the unit at position blockIdx.x of channel blockIdx.y in images
// blockIdx.z * kWarps + warp, then gridDim.z * kWarps further (the launcher picks gridDim.z so
// that a warp builds its B fragments for a few units; no division per unit).  No shared memory is shared between warps: a warp stages,
// reads and restages its own tile between __syncwarp barriers.  Offsets are 32-bit: the
// launcher runs this kernel only when every tensor has fewer than 2^31 elements and every padded
// coordinate of a unit fits.  The element type T is the accumulator-less half of the usual
// <T, Acc> pair: the tensor cores accumulate in float, the only accumulator they offer.
#if GRADOPS_HAS_MMA_SM80  // the _mma kernel's, which has no body before sm_80
namespace dwmma {
inline constexpr int kWarps = 4;        // warps per CTA (128 threads)
inline constexpr int kUnit = 16;        // unit rows and columns (the mma's M, and two of its N)
inline constexpr int kStagedCols = 32;  // staged out_backprop columns (a half's window: 8 + K - 1 + shift <= 19)
inline constexpr int kRowPitch = 40;    // elements from one tile row to the next (80 bytes: an odd number
                                        // of 16-byte bank groups); columns 32 .. 39 are never written or read
// The band's source: two reversed, zero-padded copies of each (q, r) filter row.  Element j of
// copy p holds filter[r][s][c][q] for s = kBandZero + p - j (0 where s is outside [0, K)), so a
// fragment register's pair (s, s - 1) is elements j, j + 1: one aligned 32-bit load from the copy
// in which j is even.  A lane reads s = sg - 8 i - e for band rows 8 i + 2 t + e (i = 0, 1, 2)
// with sg = g - 2 t + shift + K - 1 in [-4, 18], so j runs over [kBandZero - 18, kBandZero + 1 +
// 4 + 16 + 1] = [0, 40].
inline constexpr int kBandZero = 18;
inline constexpr int kBandPitch = 48;   // elements per copy: j <= 40, rounded up to whole 16-byte chunks

// Rows ROWS x kStagedCols columns of one out_backprop plane into ``tile`` (row pitch
// kRowPitch), VEC elements per load and store: chunk k of the rows goes to lane k % 32 (a row's
// chunks to consecutive lanes), every load of a lane issued before its stores.  ``plane``:
// element (row o_row0, column a0) of the plane; a0 a multiple of VEC, VEC divides out_cols and
// the plane is aligned to a chunk, so each chunk lies wholly inside or outside the plane's columns.
template <int VEC, int ROWS, typename T>
__device__ __forceinline__ void stage_rows(T (*tile)[kRowPitch], const T* plane, int lane, int o_row0, int a0,
                                           int out_rows, int out_cols) {
    using Raw = typename dwconv::ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;
    constexpr int PER_ROW = kStagedCols / VEC;
    constexpr int CHUNKS = ROWS * PER_ROW;
    constexpr int STEPS = (CHUNKS + 31) / 32;
    static_assert(32 % PER_ROW == 0, "a lane's chunks sit in one column of chunks");
    const int col = (lane % PER_ROW) * VEC, row0 = lane / PER_ROW;
    const bool col_in = static_cast<unsigned>(a0 + col) < static_cast<unsigned>(out_cols);
    Raw raw[STEPS];
#pragma unroll
    for (int i = 0; i < STEPS; ++i) {
        const int row = row0 + i * (32 / PER_ROW);
        raw[i] = Raw{};
        if ((CHUNKS % 32 == 0 || row < ROWS) && col_in && static_cast<unsigned>(o_row0 + row) < static_cast<unsigned>(out_rows))
            raw[i] = *reinterpret_cast<const Raw*>(plane + row * out_cols + col);
    }
#pragma unroll
    for (int i = 0; i < STEPS; ++i) {
        const int row = row0 + i * (32 / PER_ROW);
        if (CHUNKS % 32 == 0 || row < ROWS) *reinterpret_cast<Raw*>(&tile[row][col]) = raw[i];
    }
}

// Whole-plane staging (the launcher's ``plane_chunk``): where a unit is the whole image (one unit
// a plane) and the staged window holds every out_backprop row and column, the plane is one
// contiguous run of out_rows x out_cols elements, so it is loaded as such: chunk k (VEC elements
// from element VEC k) goes to lane k % 32, kPlaneSteps chunks a lane at most.  Rows need not be
// chunk multiples (a 14-wide half row is 28 bytes: rows staged one by one take 4-byte loads, the
// plane 8-byte ones), so a chunk is stored as pairs of elements, each pair inside one row because
// out_cols and the chunk's first element are even.  The pairs' places in the tile are the same
// for every unit of a warp (plane_pair_offsets, once a warp), and so are the tile's zeros outside
// the plane, which the warp writes once before its first unit and no store overwrites.
inline constexpr int kPlaneSteps = 2;                     // chunks a lane at most: planes of <= 64 chunks
inline constexpr int kPlanePairs = 4;                     // pairs a chunk at most (16 bytes of halves)

// Tile offsets (elements, row pitch kRowPitch) of the pairs of the chunks this lane stages with
// VEC elements a chunk: element e of the plane lies at tile row e / out_cols - o_row0, column
// e % out_cols - a0.  One division a step; a pair's successor is two columns on or the next row.
template <int VEC>
__device__ __forceinline__ void plane_pair_offsets(int (&offset)[kPlaneSteps][kPlanePairs], int lane, int out_cols,
                                                   int o_row0, int a0) {
#pragma unroll
    for (int i = 0; i < kPlaneSteps; ++i) {
        const int e = VEC * (lane + 32 * i);
        int row = e / out_cols, col = e - row * out_cols;
#pragma unroll
        for (int p = 0; p < VEC / 2; ++p) {
            offset[i][p] = (row - o_row0) * kRowPitch + col - a0;
            col += 2;
            if (col == out_cols) col = 0, ++row;
        }
    }
}

// One slice's plane (``plane``: its element 0) into ``tile`` (its element 0): every load of a
// lane before its stores.  ``chunks``: out_rows x out_cols / VEC, at most 32 kPlaneSteps.
template <int VEC, typename T>
__device__ __forceinline__ void stage_plane(T* tile, const T* plane, int lane, int chunks,
                                            const int (&offset)[kPlaneSteps][kPlanePairs]) {
    using Raw = typename dwconv::ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;
    static_assert(VEC % 2 == 0 && VEC / 2 <= kPlanePairs, "chunks of whole pairs");
    Raw raw[kPlaneSteps];
#pragma unroll
    for (int i = 0; i < kPlaneSteps; ++i)
        if (lane + 32 * i < chunks) raw[i] = dwconv::load_vector(reinterpret_cast<const Raw*>(plane) + lane + 32 * i);
#pragma unroll
    for (int i = 0; i < kPlaneSteps; ++i)
        if (lane + 32 * i < chunks) {
            const unsigned* const words = reinterpret_cast<const unsigned*>(&raw[i]);
#pragma unroll
            for (int p = 0; p < VEC / 2; ++p) *reinterpret_cast<unsigned*>(tile + offset[i][p]) = words[p];
        }
}

// Packed staging (the launcher's ``pack_stride`` S): images too small to fill a unit (7 x 7) are
// packed four to a unit, 2 x 2, image p = 2 pr + pc of the unit's four (consecutive images, one
// channel: they share the band) at unit row pr S and column pc S.  S keeps every image's reads
// off the others' out_backprop (the launcher's mma_pack_stride: S >= rows + pad_top and
// S >= K - pad_top + out_rows - 1, the same across), so each image meets zeros or its own values
// only.  The four planes are staged element by element (a 7 x 7 half plane is 98 bytes, 2-byte
// aligned), element e of the 4 x out_rows x out_cols to lane e % 32, kPackSteps a lane at most;
// a lane's elements lie at the same places for every unit (pack_offsets, once a warp).
inline constexpr int kPackSteps = 7;  // elements a lane at most: 4 planes of <= 56 elements
inline constexpr int kPackNone = 0x7fffffff;  // the source of an element past the four planes: past any limit
// Where a lane stores an element past the four planes: tile columns kStagedCols .. kRowPitch - 1
// are never read, and each lane has its own place among them (rows 0 - 3 x those 8 columns), so
// no two lanes store to one address (a write-after-write race, if an unread one; a racecheck
// build of the host model reported it when the lanes shared one column).
__device__ __forceinline__ int trash_offset(int lane) { return lane / 8 * kRowPitch + kStagedCols + lane % 8; }
static_assert(kRowPitch - kStagedCols == 8, "8 unread columns a row: 4 rows of them for 32 lanes");

// floor(e / d) for 0 <= e < 2^12 and d >= 1, from inv = 1 / d in float: (e + 0.5) / d lies at
// least 0.5 / d from an integer, far more than the float product's error.
__device__ __forceinline__ int small_quotient(int e, float inv) {
    return static_cast<int>((static_cast<float>(e) + 0.5f) * inv);
}

// For the lane's elements e = lane + 32 i of the four planes (plane p = e / plane_size): the
// tile offset (elements, row pitch kRowPitch; an unread column of row 0 past the last element)
// and the offset from the unit's first plane (p image_stride + its offset in the plane;
// kPackNone past the last element).
__device__ __forceinline__ void pack_offsets(int (&tile_offset)[kPackSteps], int (&source)[kPackSteps], int lane,
                                             int out_rows, int out_cols, int o_row0, int a0, int pack_stride,
                                             int image_stride) {
    const int plane_size = out_rows * out_cols;
    const float inv_plane = 1.0f / static_cast<float>(plane_size), inv_cols = 1.0f / static_cast<float>(out_cols);
#pragma unroll
    for (int i = 0; i < kPackSteps; ++i) {
        const int e = lane + 32 * i;
        const int p = small_quotient(e, inv_plane), within = e - p * plane_size;
        const int row = small_quotient(within, inv_cols), col = within - row * out_cols;
        const bool inside = p < 4;
        tile_offset[i] = inside ? ((p / 2) * pack_stride + row - o_row0) * kRowPitch + (p % 2) * pack_stride + col - a0
                                : trash_offset(lane);
        source[i] = inside ? p * image_stride + within : kPackNone;
    }
}

// The offset of unit position (row, col) from the unit's first image's in_backprop plane: it lies
// in image 2 (row >= S) + (col >= S) of the unit's; -1 in the gap between images or past them.
__device__ __forceinline__ int packed_result_offset(int row, int col, int pack_stride, int in_rows, int in_cols,
                                                    int in_image_stride) {
    const int pr = row >= pack_stride, pc = col >= pack_stride;
    const int y = row - pr * pack_stride, x = col - pc * pack_stride;
    return y < in_rows && x < in_cols ? (2 * pr + pc) * in_image_stride + y * in_cols + x : -1;
}

// One slice of the unit's four planes into ``tile`` (its element 0): ``planes`` is the first
// image's plane; an element of an image past the batch (its source at or past ``limit``) is
// staged as zero, one past the planes into an unread column.  Every load before the stores.
template <typename T>
__device__ __forceinline__ void stage_packed(T* tile, const T* planes, int limit, const int (&tile_offset)[kPackSteps],
                                             const int (&source)[kPackSteps]) {
    T value[kPackSteps];
#pragma unroll
    for (int i = 0; i < kPackSteps; ++i) {
        value[i] = from_acc<T>(0.0f);
        if (source[i] < limit) value[i] = planes[source[i]];
    }
#pragma unroll
    for (int i = 0; i < kPackSteps; ++i) tile[tile_offset[i]] = value[i];
}
// The warp's B fragments of channel c (see the kernel's comment): ``band`` (the warp's own) first
// gets the two reversed zero-padded copies of each (q, r) filter row, then each fragment register
// is one 32-bit load from it (BLOCK1_TWICE: block 1, in both operands, loaded twice; else one
// register for both).  Row block i (band rows 8 i .. 8 i + 7) of a lane is the register
// B[8 i + 2 t + e][g] = filter[r][s][c][q], s = g - (8 i + 2 t + e) + shift + K - 1, in its half
// e (low: e = 0), 0 where s is outside [0, K).  band_lo[q][r] = blocks (0, 1), the m16n8k16
// operand of half 0; band_hi[q][r] = blocks (1, 2), half 1's (block 2 alone is half 0's m16n8k8
// operand, block 0 half 1's).
template <typename T, int K, int M, bool BLOCK1_TWICE = true>
__device__ __forceinline__ void load_band(T (&band)[M][K][2][kBandPitch], const T* __restrict__ filter, int c,
                                          int in_depth, int lane, int shift, unsigned (&band_lo)[M][K][2],
                                          unsigned (&band_hi)[M][K][2]) {
    {
        constexpr int kZeroChunks = M * K * 2 * kBandPitch * 2 / 16;
        uint4* const chunks = reinterpret_cast<uint4*>(&band[0][0][0][0]);
        for (int i = lane; i < kZeroChunks; i += 32) chunks[i] = make_uint4(0, 0, 0, 0);
        __syncwarp();
        for (int i = lane; i < M * K * K; i += 32) {
            const int q = i % M, rs = i / M;  // rs = r * K + s: the filter's own order
            const T value = filter[(rs * in_depth + c) * M + q];
            band[q][rs / K][0][kBandZero - rs % K] = value;
            band[q][rs / K][1][kBandZero + 1 - rs % K] = value;
        }
        __syncwarp();
    }
    const int g = lane / 4, t = lane % 4;
    const int sg = g - 2 * t + shift + K - 1;  // s of band row 2 t (block 0, e = 0)
    const int copy = (sg + kBandZero) & 1;     // the copy in which that s sits at an even element
    const int j0 = kBandZero + copy - sg;
#pragma unroll
    for (int q = 0; q < M; ++q)
#pragma unroll
        for (int r = 0; r < K; ++r) {
            // Block 1 (8 elements on) sits in both pairs: its second copy is a load of its own
            // (volatile: ptxas would otherwise merge the two and copy the register once per unit).
            const T* const block = &band[q][r][copy][j0];
            band_lo[q][r][0] = ptx::ld_shared_32(block);
            band_lo[q][r][1] = ptx::ld_shared_32(block + 8);
            band_hi[q][r][0] = BLOCK1_TWICE ? ptx::ld_shared_32_volatile(block + 8) : band_lo[q][r][1];
            band_hi[q][r][1] = ptx::ld_shared_32(block + 16);
        }
}

// One unit's products, added into acc (acc[j][v]: unit row g + 8 (v / 2), column 8 j + 2 t + v %
// 2): per (q, r), groups[0] = the tile's 8-column groups 0 and 1, groups[1] = 2 and 3 (registers
// a0 a1: a group's unit rows 0 - 7 and 8 - 15; a2 a3: the next group's), as the A operands take
// them.  a_row, a_col: the ldmatrix row lane ``lane`` supplies (the kernel's).
template <typename T, int K, int M, int ROWS>
__device__ __forceinline__ void unit_products(const T (*tile)[ROWS][kRowPitch], int a_row, int a_col,
                                              const unsigned (&band_lo)[M][K][2], const unsigned (&band_hi)[M][K][2],
                                              float (&acc)[2][4]) {
#pragma unroll
    for (int q = 0; q < M; ++q)
#pragma unroll
        for (int r = 0; r < K; ++r) {
            unsigned groups[2][4];
            ptx::ldmatrix<4, false>(groups[0], &tile[q][a_row + K - 1 - r][a_col]);
            ptx::ldmatrix<4, false>(groups[1], &tile[q][a_row + K - 1 - r][16 + a_col]);
            const unsigned group1[2] = {groups[0][2], groups[0][3]}, group2[2] = {groups[1][0], groups[1][1]};
            ptx::mma_m16n8k16<T>(acc[0], groups[0], band_lo[q][r], acc[0]);
            ptx::mma_m16n8k8<T>(acc[0], group2, band_hi[q][r][1], acc[0]);
            ptx::mma_m16n8k8<T>(acc[1], group1, band_lo[q][r][0], acc[1]);
            ptx::mma_m16n8k16<T>(acc[1], groups[1], band_hi[q][r], acc[1]);
        }
}

// Whether every accumulator of the warp's unit is finite: a probe of one FMA each (NaN once any
// is Inf or NaN, else +-0), then a warp vote.
__device__ __forceinline__ bool unit_sums_finite(const float (&acc)[2][4]) {
    float probe = 0.0f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) probe = fmaf(acc[j][v], 0.0f, probe);
    return !__any_sync(0xffffffffu, probe != 0.0f);
}

// The checked sum of unit row i, column x (the position y_in, x_in of its image) from the staged
// tile: TF's taps only, skipping those outside out_backprop (out_backprop column x_in + pad_left
// - s is tile column x - s + K - 1 + shift).
template <typename T, int K, int M, int ROWS>
__device__ __forceinline__ float checked_sum(const T (*tile)[ROWS][kRowPitch], const T* __restrict__ filter, int c,
                                             int in_depth, int i, int x, int y_in, int x_in, int out_rows,
                                             int out_cols, int pad_top, int pad_left, int shift) {
    float sum = 0.0f;
    for (int q = 0; q < M; ++q)
        for (int r = 0; r < K; ++r) {
            if (static_cast<unsigned>(y_in + pad_top - r) >= static_cast<unsigned>(out_rows)) continue;
            for (int s = 0; s < K; ++s) {
                if (static_cast<unsigned>(x_in + pad_left - s) >= static_cast<unsigned>(out_cols)) continue;
                sum += to_acc<float>(tile[q][i + K - 1 - r][x - s + K - 1 + shift]) *
                       to_acc<float>(filter[((r * K + s) * in_depth + c) * M + q]);
            }
        }
    return sum;
}
}  // namespace dwmma
#endif  // GRADOPS_HAS_MMA_SM80

// chunk: elements per staging load (8, 4, 2 or 1; see dwmma::stage_rows); store_pairs: in_cols
// is even (two columns per result store; FORM 3 does not read it).  FORM: how a unit is staged,
// each form its own instantiation (none carries another's staging code and registers): 0 rows
// (``chunk``); 1 the whole-plane form (dwmma::stage_plane: one unit a plane, the plane inside the
// staged window, out_cols even, at most 32 kPlaneSteps chunks a plane), plane_chunk (8 or 4)
// elements a load; 2 the packed form (dwmma::stage_packed: four images a unit at pack_stride,
// element stores); 3 the rows form whose results go out as each row's 16-byte runs (in_cols a
// multiple of 8).
template <typename T, int K, int M, int FORM = 0>
__global__ void depthwise_conv2d_native_backprop_input_mma(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop, int in_rows,
    int in_cols, int in_depth, int out_rows, int out_cols, int pad_top, int pad_left, int tiles_across,
    int batch, int chunk, int store_pairs, int plane_chunk, int pack_stride) {
#if GRADOPS_HAS_MMA_SM80
    using namespace dwmma;
    static_assert(K == 3 || K == 5, "3x3 and 5x5 filters");
    static_assert(M == 1 || M == 2, "multipliers 1 and 2");
    static_assert(FORM >= 0 && FORM <= 3, "rows, whole planes, packed planes or rows with 16-byte result runs");
    constexpr bool PLANE = FORM == 1, PACKED = FORM == 2, RUNS = FORM == 3;
    constexpr int IMAGES = PACKED ? 4 : 1;  // images a unit
    constexpr int ROWS = kUnit + K - 1;  // staged rows per slice
    static_assert(7 + kUnit / 2 + K - 2 < 24 && 8 + 24 <= kStagedCols,
                  "at any shift a half's band ends in its window groups 0 - 2, and half 1's groups are staged");
    static_assert(kStagedCols <= kRowPitch && (kRowPitch * 2) % 16 == 0 && ((kRowPitch * 2) / 16) % 2 == 1,
                  "rows of 16-byte groups, an odd number apart");
    static_assert((kBandPitch * 2) % 16 == 0 && kBandZero - 18 >= 0 && kBandZero + 22 < kBandPitch,
                  "band copies of whole 16-byte chunks that hold every j a lane reads");
    __shared__ __align__(16) T stage[kWarps][M][ROWS][kRowPitch];
    __shared__ __align__(16) T band[kWarps][M][K][2][kBandPitch];

    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const int c = static_cast<int>(blockIdx.y);
    const int out_depth = in_depth * M;
    T (*const tile)[ROWS][kRowPitch] = stage[warp];
    const int shift = ((pad_left - (K - 1)) % 8 + 8) % 8;

    // The band's fragments (dwmma::load_band), the same for every unit and both halves.
    unsigned band_lo[M][K][2], band_hi[M][K][2];
    load_band<T, K, M>(band[warp], filter, c, in_depth, lane, shift, band_lo, band_hi);

    // Lane l supplies ldmatrix row l % 8 of matrix l / 8: unit row (l % 8) + 8 ((l / 8) % 2),
    // window column 8 (l / 16) (the A fragment's order a0 .. a3).
    const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);

    const unsigned across = static_cast<unsigned>(tiles_across);
    const int y0 = static_cast<int>(blockIdx.x / across) * kUnit, x0 = static_cast<int>(blockIdx.x % across) * kUnit;
    const int o_row0 = y0 + pad_top - (K - 1), a0 = x0 + pad_left - (K - 1) - shift;
    const int plane_size = out_rows * out_cols;
    const int image_stride = out_depth * plane_size, in_image_stride = in_depth * in_rows * in_cols;
    int plane_offset[kPlaneSteps][kPlanePairs] = {};
    int pack_tile[kPackSteps] = {}, pack_source[kPackSteps] = {};
    // The packed form's result places: accumulator (j, v) of a lane is unit row g + 8 (v / 2),
    // column 8 j + 2 t + v % 2.
    int pack_result[2][4] = {};
    if constexpr (PACKED) {
        pack_offsets(pack_tile, pack_source, lane, out_rows, out_cols, o_row0, a0, pack_stride, image_stride);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int v = 0; v < 4; ++v)
                pack_result[j][v] = packed_result_offset(g + 8 * (v / 2), 8 * j + 2 * t + v % 2, pack_stride, in_rows,
                                                         in_cols, in_image_stride);
    }
    if constexpr (PLANE || PACKED) {
        if constexpr (PLANE) {
            if (plane_chunk == 8)
                plane_pair_offsets<8>(plane_offset, lane, out_cols, o_row0, a0);
            else
                plane_pair_offsets<4>(plane_offset, lane, out_cols, o_row0, a0);
        }
        constexpr int kTileChunks = M * ROWS * kRowPitch * static_cast<int>(sizeof(T)) / 16;
        static_assert(M * ROWS * kRowPitch * sizeof(T) % 16 == 0, "the warp's tiles are whole 16-byte chunks");
        uint4* const chunks = reinterpret_cast<uint4*>(&tile[0][0][0]);
        for (int i = lane; i < kTileChunks; i += 32) chunks[i] = make_uint4(0, 0, 0, 0);
    }
    const int plane_chunks = PLANE ? plane_size / plane_chunk : 0;
    const int image_step = static_cast<int>(gridDim.z) * kWarps * IMAGES;
    for (int n = (static_cast<int>(blockIdx.z) * kWarps + warp) * IMAGES; n < batch; n += image_step) {
        // the packed form: the unit's images from n, those past the batch staged as zeros, not stored
        const int images = batch - n < IMAGES ? batch - n : IMAGES;

        __syncwarp();  // every lane is done with the previous unit's tile (and the zeros are written)
#pragma unroll
        for (int q = 0; q < M; ++q) {
            const T* const plane = out_backprop + ((n * out_depth + c * M + q) * out_rows + o_row0) * out_cols + a0;
            const T* const whole = out_backprop + (n * out_depth + c * M + q) * plane_size;
            if constexpr (PACKED) {
                stage_packed<T>(&tile[q][0][0], whole, images * image_stride, pack_tile, pack_source);
            } else if constexpr (PLANE) {
                if (plane_chunk == 8)
                    stage_plane<8>(&tile[q][0][0], whole, lane, plane_chunks, plane_offset);
                else
                    stage_plane<4>(&tile[q][0][0], whole, lane, plane_chunks, plane_offset);
            } else if (chunk == 8)
                stage_rows<8, ROWS>(tile[q], plane, lane, o_row0, a0, out_rows, out_cols);
            else if (chunk == 4)
                stage_rows<4, ROWS>(tile[q], plane, lane, o_row0, a0, out_rows, out_cols);
            else if (chunk == 2)
                stage_rows<2, ROWS>(tile[q], plane, lane, o_row0, a0, out_rows, out_cols);
            else
                stage_rows<1, ROWS>(tile[q], plane, lane, o_row0, a0, out_rows, out_cols);
        }
        __syncwarp();

        float acc[2][4] = {};
        unit_products<T, K, M, ROWS>(tile, a_row, a_col, band_lo, band_hi, acc);

        // acc[j][v]: unit row g + 8 (v / 2), column 8 j + 2 t + v % 2.
        if (!unit_sums_finite(acc)) {  // the checked sums
#pragma unroll 1
            for (int j = 0; j < 2; ++j)
#pragma unroll 1
                for (int v = 0; v < 4; ++v) {
                    const int i = g + 8 * (v / 2), x = 8 * j + 2 * t + v % 2;  // unit row and column
                    // the position in its image (packed: the image's own row and column)
                    const int y_in = PACKED ? i - (i >= pack_stride ? pack_stride : 0) : y0 + i;
                    const int x_in = PACKED ? x - (x >= pack_stride ? pack_stride : 0) : x0 + x;
                    const float sum = checked_sum<T, K, M, ROWS>(tile, filter, c, in_depth, i, x, y_in, x_in, out_rows,
                                                                 out_cols, pad_top, pad_left, shift);
                    if constexpr (PACKED) {
                        // stored from here: acc[j][v] = sum (a variable index) made ptxas keep the
                        // packed form's accumulators in local memory on every path
                        const int at = packed_result_offset(i, x, pack_stride, in_rows, in_cols, in_image_stride);
                        if (static_cast<unsigned>(at) < static_cast<unsigned>(images * in_image_stride))
                            in_backprop[(n * in_depth + c) * in_rows * in_cols + at] = from_acc<T>(sum);
                    } else {
                        acc[j][v] = sum;
                    }
                }
            if constexpr (PACKED) continue;  // the unit's results are stored
        }

        T* const plane = in_backprop + (n * in_depth + c) * in_rows * in_cols;
        if constexpr (PACKED) {  // the images the unit holds (-1 and images past the batch: unsigned, past limit)
            const int limit = images * in_image_stride;
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int v = 0; v < 4; ++v)
                    if (static_cast<unsigned>(pack_result[j][v]) < static_cast<unsigned>(limit))
                        plane[pack_result[j][v]] = from_acc<T>(acc[j][v]);
        } else if constexpr (RUNS) {
            // Through the warp's tile (restaged whole by the next unit): the lanes' pairs into a
            // 16 x 16 image of the unit's results, then one 16-byte run of a row a lane (a row has
            // two), so that the store instruction writes 16 whole 32-byte sectors (pairs from the
            // accumulators write 8 rows' sectors half each: twice the sectors for the same bytes).
            T* const image = &tile[0][0][0];
            __syncwarp();  // every lane's reads of the tile (ldmatrix, the checked sums) are done
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    dwconv::store_pair<T>(image + (g + 8 * h) * kRowPitch + 8 * j + 2 * t, acc[j][2 * h], acc[j][2 * h + 1]);
            __syncwarp();
            // Lane l takes the run of 8 columns from a_col of row a_row, where its ldmatrix rows
            // start (the same address less the tap row): the 8 lanes of a 16-byte shared load's
            // phase read 8 rows, 80 bytes apart, on 8 distinct 16-byte bank groups.
            const int y = y0 + a_row, x = x0 + a_col;
            if (y < in_rows && x < in_cols)  // in_cols a multiple of 8: the run lies inside the row
                *reinterpret_cast<uint4*>(plane + y * in_cols + x) =
                    *reinterpret_cast<const uint4*>(image + a_row * kRowPitch + a_col);
        } else {
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int y = y0 + g + 8 * h, x = x0 + 8 * j + 2 * t;
                    if (y >= in_rows || x >= in_cols) continue;
                    T* const at = plane + y * in_cols + x;
                    if (store_pairs) {  // in_cols even: x even, so x + 1 < in_cols and the pair is aligned
                        dwconv::store_pair<T>(at, acc[j][2 * h], acc[j][2 * h + 1]);
                    } else {
                        at[0] = from_acc<T>(acc[j][2 * h]);
                        if (x + 1 < in_cols) at[1] = from_acc<T>(acc[j][2 * h + 1]);
                    }
                }
        }
    }
#endif  // GRADOPS_HAS_MMA_SM80
}

// ==================================================================== the NHWC tensor-core kernel
//
// depthwise_conv2d_native_backprop_input_mma_nhwc: the _mma kernel's products (dwmma::
// unit_products: per channel, per unit of 16 x 16 positions, the band's mma) for NHWC half types,
// K x K filters (K = 3 or 5) at stride 1 and dilation 1, multipliers 1 and 2, sm_80 and newer.
// NHWC keeps a position's channels together, so the channel planes the products read are made
// by a transpose in shared memory, and the results are transposed back:
// * A CTA owns kChannels = 8 consecutive input channels c0 .. c0 + 7 (warp w: channel c0 + w, and
//   its band, built once) and one unit position (y0, x0) of the image, and takes images
//   blockIdx.z, + gridDim.z, ...  A position's out_backprop values of the CTA's channels are M
//   16-byte chunks (8 M output channels, c0 M ..).
// * Staging (per image): the tile rows o_row0 .. o_row0 + 15 + K - 1 (o_row0 = y0 + pad_top -
//   (K - 1)) and as many columns from a0 = x0 + pad_left - (K - 1) (shift 0: no chunk alignment
//   to keep), zeros outside out_backprop.  A thread takes a slot: one chunk of two neighbouring
//   positions of a staged row (16 + K - 1, an even count of columns), and stores value j of both
//   as one word to output channel k = 8 chunk + j's plane: warp k / M's tile k % M.  A slot's
//   offsets and whether its positions lie inside out_backprop are the same for every image (the
//   unit position is the CTA's), so they are set once.  The tile's columns past the staged ones
//   (to 32, which the products read) stay as zeroed at the start.  The next image's loads are
//   issued before this image's products, so their round trip overlaps them (registers hold
//   them, no second buffer).
// * Results: each warp rounds its unit to T into its own result plane (16 x kResultPitch), a
//   pair of columns a 4-byte store; then thread p (unit row p / 16, column p % 16) gathers the 8
//   channels of its position from the 8 planes and stores them as one 16-byte chunk.
// Non-finite values follow the _mma kernel: a warp whose unit holds an accumulator that is not
// finite recomputes it on the CUDA cores from its staged tile (dwmma::checked_sum).  Offsets are
// 32-bit (the launcher checks every tensor, and that in_depth is a multiple of 8 with out_backprop
// and the result 16-byte aligned).
namespace dwmnhwc {
// Outside the sm_80 guard: the kernel's declaration (every arch) names it.
// CTAs per SM the registers must allow: 2 (128 registers), but 1 for 5x5 multiplier 2 on sm_80
// with NVRTC 12.9 (the cuda12 extra), which spilled 12 bytes at 2 (2026-12-01).
template <int K, int M> struct MinBlocks {
    static constexpr bool NVRTC12_SM80 = GRADOPS_CUDACC_MAJOR < 13 && GRADOPS_ARCH == 800;
    static constexpr int value = NVRTC12_SM80 && K == 5 && M == 2 ? 1 : 2;
};

}  // namespace dwmnhwc

#if GRADOPS_HAS_MMA_SM80
namespace dwmnhwc {
inline constexpr int kWarps = 8;  // warps per CTA, one input channel each
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kChannels = kWarps;  // input channels a CTA owns (16 bytes of halves a position)
// Result plane row pitch (elements): 16 columns and 8 more, so that a warp's pair stores (lanes
// (g, t) at word 12 g + t + constant) fall on 32 distinct banks.
inline constexpr int kResultPitch = 24;
static_assert(dwmma::kUnit * dwmma::kUnit == kThreads, "a thread per unit position stores its chunk");

template <int K, int M> struct Stage {
    static constexpr int ROWS = dwmma::kUnit + K - 1;  // staged rows, and columns
    static constexpr int PAIRS = ROWS * ROWS / 2;      // pairs of neighbouring positions of a row
    static constexpr int SLOTS = (M * PAIRS + kThreads - 1) / kThreads;  // (chunk, pair) slots a thread
    static_assert(ROWS % 2 == 0 && ROWS <= dwmma::kStagedCols, "rows of whole pairs inside the tile");
};

// A thread's staging slot: its source offset in 16-byte chunks from a unit's first staged
// position (the CTA's first output channel), the word of its pair in the tile of its chunk's first output channel (from the
// CTA's first tile), whether it exists (a thread past the last slot has none) and whether each of
// its two positions lies inside out_backprop.
struct Slot {
    int source, word;
    bool valid, inside[2];
};

template <int K, int M>
__device__ __forceinline__ Slot slot_of(int e, int o_row0, int a0, int out_rows, int out_cols, int out_depth) {
    using St = Stage<K, M>;
    const int chunk = e / St::PAIRS, pair = e % St::PAIRS;
    const int row = pair / (St::ROWS / 2), col = 2 * (pair % (St::ROWS / 2));
    Slot s;
    s.source = (row * out_cols + col) * (out_depth / 8) + chunk;
    // Output channel 8 chunk's tile (channel 8 chunk + j is j tiles on), one tile ROWS x kRowPitch.
    s.word = (8 * chunk * St::ROWS * dwmma::kRowPitch + row * dwmma::kRowPitch + col) / 2;
    s.valid = e < M * St::PAIRS;
    const bool row_in = s.valid && static_cast<unsigned>(o_row0 + row) < static_cast<unsigned>(out_rows);
#pragma unroll
    for (int d = 0; d < 2; ++d) s.inside[d] = row_in && static_cast<unsigned>(a0 + col + d) < static_cast<unsigned>(out_cols);
    return s;
}

// A thread's slots of one image into registers: ``first`` is the image's first staged position (it
// may lie before out_backprop: only the slots inside read), ``position_chunks`` 16-byte chunks a position.
template <int K, int M>
__device__ __forceinline__ void load_slots(const uint4* __restrict__ first, const Slot (&slot)[Stage<K, M>::SLOTS],
                                           int position_chunks, uint4 (&raw)[Stage<K, M>::SLOTS][2]) {
#pragma unroll
    for (int i = 0; i < Stage<K, M>::SLOTS; ++i)
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            raw[i][d] = make_uint4(0, 0, 0, 0);
            if (slot[i].inside[d]) raw[i][d] = dwconv::load_vector(first + slot[i].source + d * position_chunks);
        }
}

// Value j of slot i's chunk (output channel k = 8 chunk + j: warp k / M's tile k % M) to its tile.
template <int K, int M>
__device__ __forceinline__ void store_slots(unsigned* stage, const Slot (&slot)[Stage<K, M>::SLOTS],
                                            const uint4 (&raw)[Stage<K, M>::SLOTS][2]) {
    using St = Stage<K, M>;
    constexpr int TILE_WORDS = St::ROWS * dwmma::kRowPitch / 2;  // one output channel's tile
#pragma unroll
    for (int i = 0; i < St::SLOTS; ++i) {
        if ((M * St::PAIRS) % kThreads != 0 && !slot[i].valid) break;
        unsigned* const dst = stage + slot[i].word;
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j * TILE_WORDS] = dwconv::pair_word(raw[i], j);
    }
}
}  // namespace dwmnhwc
#endif  // GRADOPS_HAS_MMA_SM80

// Grid (tiles_down x tiles_across unit positions, in_depth / 8, image groups); block 256.
template <typename T, int K, int M>
__global__ void __launch_bounds__(256, (dwmnhwc::MinBlocks<K, M>::value)) depthwise_conv2d_native_backprop_input_mma_nhwc(
    const T* __restrict__ filter, const T* __restrict__ out_backprop, T* __restrict__ in_backprop, int in_rows,
    int in_cols, int in_depth, int out_rows, int out_cols, int pad_top, int pad_left, int tiles_across, int batch) {
#if GRADOPS_HAS_MMA_SM80
    using namespace dwmma;
    using namespace dwmnhwc;
    using St = Stage<K, M>;
    static_assert(K == 3 || K == 5, "3x3 and 5x5 filters");
    static_assert(M == 1 || M == 2, "multipliers 1 and 2");
    static_assert(kThreads == 256, "the launch bounds");
    constexpr int ROWS = St::ROWS;
    __shared__ __align__(16) T stage[dwmnhwc::kWarps][M][ROWS][kRowPitch];
    __shared__ __align__(16) T band[dwmnhwc::kWarps][M][K][2][kBandPitch];
    __shared__ __align__(16) T result[dwmnhwc::kWarps][kUnit][kResultPitch];

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int c0 = static_cast<int>(blockIdx.y) * kChannels;
    const int out_depth = in_depth * M;
    T (*const tile)[ROWS][kRowPitch] = stage[warp];
    constexpr int kShift = 0;  // a0 need not be a multiple of 8: the staging is by positions

    {
        // Zeros in tile columns 16 .. 31 of every row (two 16-byte chunks): the products read
        // columns up to 31, staging writes columns up to ROWS - 1 (over some of these zeros, after
        // the barrier at the top of the image loop), and columns 32 on are never read.
        static_assert(kStagedCols == 32 && ROWS > 16 && (kRowPitch * sizeof(T)) % 16 == 0, "two chunks a row");
        constexpr int kRows = dwmnhwc::kWarps * M * ROWS;
        for (int i = tid; i < 2 * kRows; i += kThreads)
            *reinterpret_cast<uint4*>(&stage[0][0][0][0] + (i / 2) * kRowPitch + 16 + 8 * (i % 2)) = make_uint4(0, 0, 0, 0);
    }
    const unsigned across = static_cast<unsigned>(tiles_across);
    const int y0 = static_cast<int>(blockIdx.x / across) * kUnit, x0 = static_cast<int>(blockIdx.x % across) * kUnit;
    const int o_row0 = y0 + pad_top - (K - 1), a0 = x0 + pad_left - (K - 1);
    Slot slot[St::SLOTS];
#pragma unroll
    for (int i = 0; i < St::SLOTS; ++i) {
        // opaque: NVVM keeps the slots as computed here (ptxas, which sees no asm, may still
        // recompute them from the thread index where registers run short)
        slot[i] = slot_of<K, M>(opaque_value(tid + i * kThreads), o_row0, a0, out_rows, out_cols, out_depth);
        slot[i].source = opaque_value(slot[i].source);
        slot[i].word = opaque_value(slot[i].word);
    }
    // Image n's first staged position (row o_row0, column a0, output channel c0 M), in chunks;
    // it may lie before out_backprop, and only the slots inside out_backprop add to it.
    const int first = ((o_row0 * out_cols + a0) * out_depth + c0 * M) / 8;
    const int image_chunks = out_rows * out_cols * out_depth / 8;
    // This thread's result position (unit row tid / 16, column tid % 16) and whether it is inside.
    const int y = y0 + tid / kUnit, x = x0 + tid % kUnit;
    const bool store = y < in_rows && x < in_cols;
    const uint4* const source = reinterpret_cast<const uint4*>(out_backprop);

    // The first image's loads, then the band (whose filter loads' round trip overlaps theirs).
    uint4 raw[St::SLOTS][2];
    const int step = static_cast<int>(gridDim.z);
    int n = static_cast<int>(blockIdx.z);
    if (n < batch) load_slots<K, M>(source + (first + n * image_chunks), slot, out_depth / 8, raw);
    unsigned band_lo[M][K][2], band_hi[M][K][2];
    // 5x5 multiplier 2 from sm_90: block 1's register once for both operands (ptxas copies it where
    // needed), where its 10 more registers made ptxas recompute the slots' offsets every image at
    // the 128-register cap (sm_90 SASS, per thread and image: 327 -> 257 instructions, fixed 199 ->
    // 250; on sm_80 it costs 11 an image, so sm_80 keeps both).
    constexpr bool kBlock1Twice = !(K == 5 && M == 2 && GRADOPS_ARCH >= 900);
    load_band<T, K, M, kBlock1Twice>(band[warp], filter, c0 + warp, in_depth, lane, kShift, band_lo, band_hi);
    const int a_row = (lane % 8) + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);
    for (; n < batch; n += step) {
        __syncthreads();  // every warp is done with the previous image's tiles and result planes
        store_slots<K, M>(reinterpret_cast<unsigned*>(&stage[0][0][0][0]), slot, raw);
        __syncthreads();
        if (n + step < batch) load_slots<K, M>(source + (first + (n + step) * image_chunks), slot, out_depth / 8, raw);

        float acc[2][4] = {};
        unit_products<T, K, M, ROWS>(tile, a_row, a_col, band_lo, band_hi, acc);
        // acc[j][v]: unit row g + 8 (v / 2), column 8 j + 2 t + v % 2.
        if (!unit_sums_finite(acc)) {  // the checked sums
#pragma unroll 1
            for (int j = 0; j < 2; ++j)
#pragma unroll 1
                for (int v = 0; v < 4; ++v) {
                    const int i = g + 8 * (v / 2), col = 8 * j + 2 * t + v % 2;
                    acc[j][v] = checked_sum<T, K, M, ROWS>(tile, filter, c0 + warp, in_depth, i, col, y0 + i, x0 + col,
                                                           out_rows, out_cols, pad_top, pad_left, kShift);
                }
        }
        unsigned* const plane = reinterpret_cast<unsigned*>(&result[warp][0][0]);
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                plane[((g + 8 * h) * kResultPitch + 8 * j + 2 * t) / 2] = dwconv::pack_pair<T>(acc[j][2 * h], acc[j][2 * h + 1]);
        __syncthreads();
        if (store) {
            const unsigned short* const values = reinterpret_cast<const unsigned short*>(&result[0][0][0]);
            const int at = (tid / kUnit) * kResultPitch + tid % kUnit;
            constexpr int PLANE = kUnit * kResultPitch;
            const uint4 chunk = make_uint4(values[at] | static_cast<unsigned>(values[at + PLANE]) << 16,
                                           values[at + 2 * PLANE] | static_cast<unsigned>(values[at + 3 * PLANE]) << 16,
                                           values[at + 4 * PLANE] | static_cast<unsigned>(values[at + 5 * PLANE]) << 16,
                                           values[at + 6 * PLANE] | static_cast<unsigned>(values[at + 7 * PLANE]) << 16);
            *reinterpret_cast<uint4*>(in_backprop + ((n * in_rows + y) * in_cols + x) * in_depth + c0) = chunk;
        }
    }
#endif  // GRADOPS_HAS_MMA_SM80
}

}  // namespace gradops
