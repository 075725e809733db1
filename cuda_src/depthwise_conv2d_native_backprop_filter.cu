// DepthwiseConv2dNativeBackpropFilter: filter_grad[r][s][c][m] = sum over n, p, q of
//   input[n][p * stride_rows + r * dilation_rows - pad_top][q * stride_cols + s * dilation_cols - pad_left][c]
//   * out_backprop[n][p][q][c * M + m],
// input positions outside the image contributing nothing (their taps are skipped, so an Inf or
// NaN never meets a padded zero).  The filter gradient [R, S, C, M] in memory is
// [tap = r * S + s][k = c * M + m], the out_backprop channel order.
//
// Two launches, no floating-point atomics, so every bit of the result is reproducible: partial
// sums of fixed slices of the output positions, then their fixed-order sum.  Where the launcher
// cuts the work into one slice, the first kernel writes the result itself (store_sum) and the
// second does not run; where it cuts it into a few (the specialised kernels; see "One launch for
// a few slices"), the first kernel's last CTA or warp of each channel adds them itself.
// * ..._tiled (NHWC 3x3 / 5x5 at stride 1 / 2, no dilation, 32-bit offsets; see "the tiled
//   kernel" below): the partial sums of a slice of output tiles x 32 (float) or 16 (double)
//   channels per CTA, the input tile staged in shared memory, the sums in registers; its ASYNC
//   form (sm_80+, opt-in: "Asynchronous staging") copies the next tile with cp.async meanwhile.
// * ..._planes (NCHW 3x3 / 5x5 at stride 1 / 2, no dilation, 32-bit offsets; see "the planes
//   kernel" below): the partial sums of a slice of work items of one channel per warp, the
//   window values loaded from the channel's planes (L1 serves neighbours' overlap; in aligned
//   pairs where in_cols is even; opt-in for half types, "lane blocks": each lane's own columns
//   in one load, its neighbours' by warp shuffles), the sums in registers.
// * ..._partial (every other geometry, either layout): the batch x output rows (n, p) are cut into ``slices`` fixed runs of
//   ``rows_per_slice``; one thread per (slice, tap, k) sums its run in a fixed order into
//   partial[slice][tap][k] (float, double for float64).  A warp takes 32 consecutive k (a
//   channel group, the last one padded with idle lanes) of one tap, and consecutive warps the
//   taps of one group: NHWC reads of out_backprop are coalesced, and the 8 warps of a 256-thread
//   block, 8 taps of the same channels and rows, read the same out_backprop sectors and
//   overlapping input rows, which L1 can serve once (not measured yet; k fastest over all of
//   out_depth instead put a block on one or two taps wherever out_depth >= 128, and each tap
//   re-read out_backprop from L2).
// * ..._reduce: the slices' partial sums of each filter element added in a fixed order (eight
//   groups of slices, then the groups), rounded once to T.
// The launcher (gradops/backends/cuda/depthwise_conv2d_native_backprop_filter.py) picks the
// slicing from the geometry alone (never from the GPU), and I = int where every index and
// offset fits in 32 bits (cheaper division and address math), else long long.
#include "depthwise_tiles.cuh"
#include "tensor_core_ptx.cuh"  // GRADOPS_HAS_MMA_SM80, ldmatrix and mma.sync (the _mma kernel)

namespace gradops {

// Writes one sum of the first kernels at ``index`` ([slice][tap][k]): into ``partial`` for the
// reduction, or, where the launch has a single slice (``partial`` null; slice 0's layout is the
// filter gradient's, [tap][k]), into the filter gradient ``result`` itself, rounded as the
// reduction rounds one slice's sum (0 + sum, then from_acc: the same bits, -0.0 included).
// Uniform per launch, after the sums: one branch, off every hot loop.
template <typename T, typename Acc, typename I>
__device__ __forceinline__ void store_sum(Acc* __restrict__ partial, T* __restrict__ result, I index, Acc sum) {
    int to_result = partial == nullptr;
#ifdef __CUDA_ARCH__
    // The test made opaque at each store, so that the compiler branches here rather than keeping
    // a copy of the enclosing loops per branch (unswitched, the per-element kernel doubled its
    // code and moved its registers by up to 8 either way, across occupancy steps).  The flag,
    // not the pointer, so that the store stays a global one (STG, not a generic ST).
    asm volatile("" : "+r"(to_result));
#endif
    if (to_result) {
        result[index] = from_acc<T, Acc>(Acc(0) + sum);
    } else {
        partial[index] = sum;
    }
}

// ==================================================================== one launch for a few slices
//
// Where a launch of a specialised kernel has at most kReduceBatch slices, the launcher passes a
// zeroed array ``tickets`` (one counter per channel block, or per channel for the kernels whose
// warps take one channel each) and the filter gradient ``result`` beside ``partial``.  Each CTA
// (warp) stores its partial sums, then takes a ticket of its channel block; the one that takes
// the last adds the block's partial sums over the slices, in slice order from 0, as the _reduce
// kernel's single group does (slices <= kReduceBatch: groups = 1), so the result has the same
// bits and the second launch (about 3.5 us a call on the H100 of 2026-12-05, a fixed cost that
// was 15-25% of the 14 x 14 and 7 x 7 layers' kernel time) is saved.  Which CTA is last varies
// from run to run; the order of the sum does not.  The last one sets the counter back to 0, so
// that the next launch on the stream (which starts after this one ends) finds it zeroed: the
// launcher keeps one array per device and stream.
// Memory order (the PTX memory model's fence-atomic pattern): a CTA's stores, a barrier, then
// thread 0's fence (release, cumulative over what the barrier ordered before it) and atomic; the
// last CTA's thread 0 fences again after its atomic (acquire) before a barrier and the loads.
// The loads go to L2 (ld.global.cg): the partial sums were written by other SMs in this launch.

// Slices a thread's batch of loads covers, here and in the _reduce kernel.
inline constexpr int kReduceBatch = 16;  // loads a thread has in flight at once (REDUCE_LOADS)

// One thread's ticket of add_few_slices (below): after a fence (release), the ticket; where it
// is the last, the counter back to 0 and a fence (acquire).  True where it was the last.
__device__ __forceinline__ bool took_last_ticket(unsigned* ticket, unsigned count) {
    __threadfence();
    const bool last = atomicAdd(ticket, 1u) == count - 1u;
    if (last) {
        *ticket = 0u;
        __threadfence();
    }
    return last;
}

// Takes the ticket ``*ticket`` of a launch whose ``count`` CTAs (``CTA``) or warps share it, after
// every thread of the CTA (every lane of the warp) has stored its partial sums, and where this
// one took the last: filter_grad[e] = 0 + partial[e] + partial[elements + e] + ... over
// ``slices`` (<= kReduceBatch) slices, for e = tap * out_depth + k of taps x [k0, k0 + width),
// k < out_depth, thread ``thread`` of ``threads`` taking every threads-th of them.  Every
// thread (lane) must call it.  Out of line: inlined, it moved the kernels' register allocation
// (on sm_90 the planes kernel's float 3x3 and 5x5 at stride 1 spilled 8 bytes at their bounds
// of 80 and 128 registers, and the asynchronous tiled kernels lost a CTA an SM); called, it
// leaves nearly every kernel's registers as they were, for a call at the end of a launch.
template <bool CTA, typename T, typename Acc>
__device__ GRADOPS_NOINLINE void add_few_slices(const Acc* partial, T* filter_grad, unsigned* ticket, unsigned count,
                                                int elements, int slices, int taps, int out_depth, int k0, int width,
                                                int thread, int threads) {
    if constexpr (CTA) {
        __syncthreads();
        if (!__syncthreads_or(threadIdx.x == 0 && took_last_ticket(ticket, count))) return;
    } else {
        __syncwarp();
        if (!__any_sync(0xffffffffu, threadIdx.x % 32 == 0 && took_last_ticket(ticket, count))) return;
    }
    for (int i = thread; i < taps * width; i += threads) {
        const int k = k0 + i % width;
        if (k < out_depth) {  // the last block's channels past out_depth: none
            const int e = i / width * out_depth + k;
            Acc batch[kReduceBatch];
#pragma unroll
            for (int z = 0; z < kReduceBatch; ++z) batch[z] = z < slices ? __ldcg(partial + z * elements + e) : Acc(0);
            __threadfence_block();  // the batch's loads ahead of its adds: one round trip (see _reduce)
            Acc sum = Acc(0);
#pragma unroll
            for (int z = 0; z < kReduceBatch; ++z)
                if (z < slices) sum += batch[z];  // added only where loaded, as the _reduce kernel does
            filter_grad[e] = from_acc<T, Acc>(sum);
        }
    }
}

template <int L, typename I> struct DwTensor {
    I rows, cols, depth;
    __device__ __forceinline__ I offset(I n, I y, I x, I c) const {
        return L == NHWC ? ((n * rows + y) * cols + x) * depth + c : ((n * depth + c) * rows + y) * cols + x;
    }
};

template <typename T, typename Acc, int L, typename I>
__global__ void depthwise_conv2d_native_backprop_filter_partial(
        const T* __restrict__ input, const T* __restrict__ out_backprop, Acc* __restrict__ partial,
        T* __restrict__ result, long long batch_, long long in_rows_, long long in_cols_, long long in_depth_,
        long long multiplier_, long long out_rows_, long long out_cols_, long long filter_rows_, long long filter_cols_,
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
        store_sum(partial, result, (slice * taps + tap) * out_depth + k, acc);
    }
}

// ==================================================================== the tiled kernel
//
// depthwise_conv2d_native_backprop_filter_tiled: the same partial sums, from a CTA that owns
// CHANNELS out_backprop channels (one 128-byte accumulator row per position: 32 float or 16
// double, dwconv::Block) and a slice of units.  A unit is TILE_ROWS x TILE_COLS output positions
// of one image; units are numbered (image, tile row, tile column), column fastest, and slice z
// takes units [z * units_per_slice, (z + 1) * units_per_slice).  Per unit the CTA stages, in
// shared memory, the input rows and columns its positions read (channel-inner, widened to
// accumulators, zeros outside the image), 16-byte loads where the layout allows.  A thread
// (lane: V adjacent channels; work item: ITEM_ROWS x ITEM_COLS output positions) loads its own
// out_backprop values and multiplies each staged value of its window into every tap that value
// reaches: the K x K x V filter-gradient sums live in registers for the whole slice, and nothing
// is divided per element.  A warp's two work items sit side by side or one above the other,
// as the launcher picks per geometry, so that where the output ends inside the last tile row
// or column whole warps hold only items past it; those skip the sums (they still stage and
// meet every barrier).  At the end the CTA's work items add their sums in item order through
// shared memory and write partial[slice][tap][k]; the _reduce kernel sums the slices.
//
// Compile-time filter size K x K and stride S (K in {3, 5}, S in {1, 2}), dilation 1, NHWC,
// and 32-bit offsets for whole tiles (positions past the output and staged rows and columns
// outside the image included); the launcher checks and runs the _partial kernel otherwise.
// Output channel k = c * M + m reads input channel c: the staged tile holds, for each output
// channel of the CTA, its input channel's value (multiplier 2 stores each loaded value twice).
//
// Padding.  TF skips taps outside the input and never reads output positions past out_rows x
// out_cols.  The staged tile holds zeros outside the image and a thread takes zeros for
// out_backprop positions past the output, so every such product is w * 0 = +-0, which leaves a
// sum unchanged (a sum starting at +0 never becomes -0) unless the other factor is Inf or NaN.
// So the CTA sums its slice unchecked and then tests its sums (a NaN-propagating probe, one FMA
// per sum): where any is not finite (__syncthreads_or), it sums the slice again with the checked
// loop, which skips exactly the taps and positions TF skips (a slice whose true sums overflow,
// or hold Inf or NaN values TF multiplies, pays the second pass too and gets TF's result).
// Before 2026-11-28 each unit probed every value it loaded (about 10% of a unit's instructions).
namespace dwfilter {

using dwconv::Block;
using dwconv::Lane;
using dwconv::kVectorBytes;

// Work items per CTA: with 16 lanes (float or double accumulators alike), 128 threads.
inline constexpr int kItems = 8;
inline constexpr int kThreads = Block<float>::LANES * kItems;
static_assert(Block<double>::LANES == Block<float>::LANES, "one thread count for every accumulator");
// CTAs per SM the register allocation must allow: 3 (at most 168 registers a thread; without
// it nvcc held 5x5 stride-1 float16 at 128 and spilled), 2 where 168 spilled (sm_80 and sm_90
// SASS of NVRTC 13.5, and NVRTC 12.9's, which the cuda12 extra uses, for sm_70 - sm_90): 5x5 at
// stride 2 with 4- and 8-byte elements, double at any size and stride (5x5 stride 1 and 3x3
// stride 2 since the slice's second, checked pass shares the unit loop), and float 5x5 at
// stride 1 on sm_70 (GRADOPS_ARCH < 750: only the cuda12 extra targets it).
// Asynchronous staging (ASYNC, below) at stride 2 spilled at 168 with 5x5 filters and with
// 4-byte elements (sm_90: 4-28 B).
// 4 (at most 128 registers) for float 3x3 at stride 1, synchronous, from sm_75: 120-128
// registers without a spill on sm_75 - sm_121 (NVRTC 13 and 12.9), where 3 let ptxas take 140,
// so 12 resident warps become 16 for more instructions (sm_90: 2080 -> 2120 in the kernel,
// 454 -> 492 on a unit's path; sm_80's unit path 448 -> 433).  Spilled at 128:
// the same on sm_50 - sm_70 (16-20 B, NVRTC 12.9), float 3x3 at stride 2 on sm_75 and sm_80
// (56-88 B, NVRTC 13) and half 5x5 at stride 1 (40 B); half 3x3 takes 119-128 under 3 already.
// Asynchronous 3x3 at stride 1 of the half types and double: 4 and 3, the CTAs an SM they had
// unbounded until the one-launch reduction's call (sm_90: 126-128 and 168 registers, then
// 130-134 and 174), which the bounds keep without a spill (123-126 and 162-166).
template <typename T, int K, int S, bool ASYNC = false> struct MinBlocks {
    static constexpr bool SPILLS_AT_168 = sizeof(T) == 8 || (K == 5 && S == 2 && sizeof(T) == 4) ||
                                          (K == 5 && S == 1 && sizeof(T) == 4 && GRADOPS_ARCH < 750) ||
                                          (ASYNC && S == 2 && (K == 5 || sizeof(T) == 4));
    static constexpr bool FITS_128 = sizeof(T) == 4 && K == 3 && S == 1 && !ASYNC && GRADOPS_ARCH >= 750;
    static constexpr bool ASYNC_3X3_1 = ASYNC && K == 3 && S == 1 && sizeof(T) != 4;
    static constexpr int value = ASYNC_3X3_1 ? (sizeof(T) == 2 ? 4 : 3) : SPILLS_AT_168 ? 2 : FITS_128 ? 4 : 3;
};
// Staging loads a thread issues before it widens and stores any of them.
inline constexpr int kStageBatch = 8;

// The tile of one specialisation.  Work items of 2 x 4 positions at stride 1 (a 4 x 6 window
// of 24 staged values feeds 2 x 4 x 9 taps), 1 x 4 at stride 2 (3 x 9 values for 4 x 9 taps);
// C work items across a tile and kItems / C down it: 4 x 16 / 2 x 16 positions (C = 4), or
// 8 x 8 / 4 x 8 (C = 2) for narrow maps, which a 16-wide tile would leave half empty.
template <int K, int S, int C> struct Shape {
    static_assert((K == 3 || K == 5) && (S == 1 || S == 2) && (C == 2 || C == 4), "3x3 or 5x5, stride 1 or 2");
    static constexpr int ITEM_ROWS = S == 1 ? 2 : 1;
    static constexpr int ITEM_COLS = 4;
    static constexpr int TILE_ROWS = kItems / C * ITEM_ROWS;
    static constexpr int TILE_COLS = C * ITEM_COLS;
    // Input rows / columns staged per unit, and read by one work item.
    static constexpr int STAGED_ROWS = (TILE_ROWS - 1) * S + K;
    static constexpr int STAGED_COLS = (TILE_COLS - 1) * S + K;
    static constexpr int WINDOW_ROWS = (ITEM_ROWS - 1) * S + K;
    static constexpr int WINDOW_COLS = (ITEM_COLS - 1) * S + K;
};

// Multiplies 0 into p: p becomes NaN once any x is Inf or NaN, and stays +0 otherwise.
template <typename Acc> __device__ __forceinline__ void probe(Acc& p, Acc x) { p += x * Acc(0); }

// The work item's sums: every staged value of its window times its out_backprop values, into
// every tap that carries the one to the other.  CHECKED skips staged rows outside [row_begin,
// row_end), columns outside [col_begin, col_end) and positions outside rows x cols.
template <bool CHECKED, typename Acc, int K, int S, int C>
__device__ __forceinline__ void accumulate(const Acc* __restrict__ window, const Acc* __restrict__ window_odd,
                                           const Lane<Acc> (&dy)[Shape<K, S, C>::ITEM_ROWS][Shape<K, S, C>::ITEM_COLS],
                                           Acc (&acc)[K * K][Block<Acc>::V], int row_begin, int row_end,
                                           int col_begin, int col_end, int rows, int cols) {
    using Sh = Shape<K, S, C>;
#pragma unroll
    for (int wr = 0; wr < Sh::WINDOW_ROWS; ++wr) {
#pragma unroll
        for (int wc = 0; wc < Sh::WINDOW_COLS; ++wc) {
            if (CHECKED && (wr < row_begin || wr >= row_end || wc < col_begin || wc >= col_end)) continue;
            const int at = wr * Sh::STAGED_COLS + wc;
            const Lane<Acc> x =
                *reinterpret_cast<const Lane<Acc>*>((at % 2 ? window_odd : window) + at * Block<Acc>::CHANNELS);
#pragma unroll
            for (int i = 0; i < Sh::ITEM_ROWS; ++i) {
                const int r = wr - i * S;  // the tap that carries window row wr to position row i
                if (r < 0 || r >= K || (CHECKED && i >= rows)) continue;
#pragma unroll
                for (int j = 0; j < Sh::ITEM_COLS; ++j) {
                    const int s = wc - j * S;
                    if (s < 0 || s >= K || (CHECKED && j >= cols)) continue;
#pragma unroll
                    for (int u = 0; u < Block<Acc>::V; ++u) acc[r * K + s][u] += x.v[u] * dy[i][j].v[u];
                }
            }
        }
    }
}

// A lane's V out_backprop values (channels k .. k + V - 1 of one position) as they lie in
// memory, widened to accumulators only after the unit's staging barrier: a widening next to
// its load makes the warp wait for the load there, before the barrier and the staging loads,
// where the values are not needed yet (sm_90 SASS of float16 at 3x3 stride 1, until
// 2026-11-28: up to 4 dependent round trips per unit, float32's 1).  The bits are one register
// (or pair) per vector load: a struct of two halves was split into two 16-bit registers next
// to the load, which waited for it as well.
template <typename T, int V> struct RawLane {
    typename dwconv::ChunkOf<static_cast<int>(sizeof(T)) * V>::type bits;
};

// The lane's values at offset ``at``: one load where ``vector`` (V * sizeof(T) aligned, whole
// lanes), else one per channel below ``channels_left`` (= out_depth - k), zeros past it.
template <typename T, typename Acc>
__device__ __forceinline__ RawLane<T, Block<Acc>::V> load_lane(const T* __restrict__ out_backprop, int at,
                                                               bool vector, int channels_left) {
    constexpr int V = Block<Acc>::V;
    using Bits = decltype(RawLane<T, V>::bits);
    RawLane<T, V> raw;
    if (vector) {
        raw.bits = dwconv::load_vector(reinterpret_cast<const Bits*>(out_backprop + at));
    } else {
        T e[V];
#pragma unroll
        for (int u = 0; u < V; ++u) e[u] = u < channels_left ? out_backprop[at + u] : from_acc<T, Acc>(Acc(0));
        memcpy(&raw.bits, e, sizeof e);
    }
    return raw;
}

template <typename T, typename Acc> __device__ __forceinline__ RawLane<T, Block<Acc>::V> zero_lane() {
    RawLane<T, Block<Acc>::V> raw;
    memset(&raw.bits, 0, sizeof raw.bits);  // +0.0 in every type
    return raw;
}

template <typename T, typename Acc> __device__ __forceinline__ Lane<Acc> widen_lane(const RawLane<T, Block<Acc>::V>& raw) {
    T e[Block<Acc>::V];
    memcpy(e, &raw.bits, sizeof e);
    Lane<Acc> v;
#pragma unroll
    for (int u = 0; u < Block<Acc>::V; ++u) v.v[u] = to_acc<Acc>(e[u]);
    return v;
}

// The staged rows [row_begin, row_end) and columns [col_begin, col_end) inside the image.
struct Box {
    int row_begin, row_end, col_begin, col_end;
    __device__ __forceinline__ bool holds(int row, int col) const {
        return row >= row_begin && row < row_end && col >= col_begin && col < col_end;
    }
};

// The swizzle: channel offset k of a staged position lies at k ^ 4 in an odd one where the tile is
// swizzled (SWIZZLE: half types with synchronous staging).  A 16-byte load of 8 halves widens to
// two 16-byte stores of floats (multiplier 2, each value twice: four), and a quarter-warp's 8
// lanes write two positions (four), whose stores at the same channels fell on the same banks: 2
// wavefronts a store (4) where 1 (2) do once an odd position's 4-float groups are swapped in
// pairs.  Readers take a lane's 2 channels from k ^ 4 likewise; which place a staged position
// uses follows at compile time from the window's first position's parity (two window pointers),
// so no read costs an instruction more.  As the input gradient's tiled kernel ("Swizzle" there).
// Float32 at multiplier 1 stores one 16-byte vector a lane, 8 lanes a position, without a
// conflict.  Not swizzled: the asynchronous form (opt-in; 5x5 at stride 1 spilled 8 bytes with
// the swizzle on sm_90) and 5x5 at stride 2 (12-20 bytes on sm_75 and sm_80, NVRTC 13: its
// registers are at the 168 that 3 CTAs an SM allow).
using dwconv::swizzled;

// The staged tile of one unit: STAGED positions (COLS per row) from input offset ``tile_at``
// (staged position 0, channel 0; negative where the tile starts outside the image), channel-
// inner, widened to accumulators, zeros outside ``inside`` and past the channels.  Both loops
// are unrolled over a thread's share (compile-time), kStageBatch loads issued before any store.
//
// stage_vectors: 16-byte loads of VEC input channels, staged as VEC * M output channels (M = 1
// or 2: each value twice); in_depth a multiple of VEC and a 16-byte aligned input.
//
// FROM_RAW: the chunks come from ``raw`` (shared memory, chunk e at raw[e]), where copy_unit's
// cp.async copies put them (zeros already where the tile has none); input, tile_at and inside
// are unused.
template <typename T, typename Acc, int STAGED, int COLS, int M, bool SWIZZLE, bool FROM_RAW = false>
__device__ __forceinline__ void stage_vectors(const T* __restrict__ input, Acc* __restrict__ staged, int tid,
                                              int tile_at, Box inside, int k0, int in_cols, int in_depth,
                                              const uint4* raw_chunks = nullptr) {
    constexpr int CHANNELS = Block<Acc>::CHANNELS;
    constexpr int VEC = kVectorBytes / static_cast<int>(sizeof(T));
    constexpr int PER_POSITION = CHANNELS / (VEC * M);  // loads per staged position
    constexpr int CHUNKS = STAGED * PER_POSITION;
    constexpr int PER_THREAD = (CHUNKS + kThreads - 1) / kThreads;
    const int c0 = k0 / M;  // the CTA's first input channel
    // The swizzle: every staged position of a thread has its parity (kThreads / PER_POSITION
    // positions a step is even); the thread's 4-float groups 2 m and 2 m + 1 lie at 8 m + lo and
    // 8 m + hi from its first channel.
    static_assert(kThreads / PER_POSITION % 2 == 0, "a thread's positions of one parity");
    const bool odd = SWIZZLE && tid / PER_POSITION % 2 != 0;
    const int lo = odd ? 4 : 0, hi = odd ? 0 : 4;
#pragma unroll
    for (int b0 = 0; b0 < PER_THREAD; b0 += kStageBatch) {
        uint4 raw[kStageBatch];
#pragma unroll
        for (int b = 0; b < kStageBatch && b0 + b < PER_THREAD; ++b) {
            // Everything but the unit's tile_at and box is the same for every unit (hoisted).
            const int e = tid + (b0 + b) * kThreads;
            if constexpr (FROM_RAW) {
                if (CHUNKS % kThreads == 0 || e < CHUNKS) raw[b] = raw_chunks[e];
                continue;
            }
            const int position = e / PER_POSITION, c = c0 + e % PER_POSITION * VEC;
            const int row = position / COLS, col = position % COLS;
            raw[b] = make_uint4(0, 0, 0, 0);
            if ((CHUNKS % kThreads == 0 || e < CHUNKS) && inside.holds(row, col) && c < in_depth)
                raw[b] = *reinterpret_cast<const uint4*>(input + (tile_at + (row * in_cols + col) * in_depth + c));
        }
#pragma unroll
        for (int b = 0; b < kStageBatch && b0 + b < PER_THREAD; ++b) {
            const int e = tid + (b0 + b) * kThreads;
            if (CHUNKS % kThreads != 0 && e >= CHUNKS) break;
            Acc v[VEC];
            dwconv::widen<T, Acc>(raw[b], v);
            Acc* dst = staged + e / PER_POSITION * CHANNELS + e % PER_POSITION * VEC * M;
#ifdef GRADOPS_HOST_MODEL
            // The host model counts the 16-byte stores' bank wavefronts (tests/test_depthwise_conv2d_
            // native_backprop_filter.py), in the order of the stores below.
            if constexpr (sizeof(Acc) == 4 && !FROM_RAW)
                for (int g = 0; g < VEC * M / 4; ++g)
                    gradops_host::count_access(SWIZZLE ? dst + 8 * (g / 2) + (g % 2 ? hi : lo) : dst + 4 * g,
                                               gradops_host::STORE, 16);
#endif
            if constexpr (SWIZZLE) {
                static_assert(VEC == 8, "8 halves a load: 2 M groups of 4 floats");
#pragma unroll
                for (int g = 0; g < 2 * M; ++g) {
                    const int u = 4 * g / M;  // the first of the group's input values (each M times)
                    *reinterpret_cast<float4*>(dst + 8 * (g / 2) + (g % 2 ? hi : lo)) =
                        M == 1 ? make_float4(v[u], v[u + 1], v[u + 2], v[u + 3])
                               : make_float4(v[u], v[u], v[u + 1], v[u + 1]);
                }
            } else if constexpr (M == 1) {
                dwconv::store16<Acc, VEC>(dst, v);
            } else {
                Acc twice[2 * VEC];
#pragma unroll
                for (int u = 0; u < VEC; ++u) twice[2 * u] = twice[2 * u + 1] = v[u];
                dwconv::store16<Acc, 2 * VEC>(dst, twice);
            }
        }
    }
}

// What asynchronous staging (below) needs of one specialisation: the staged tile's bytes, the
// raw input tile (multiplier 1's chunks; multiplier 2 uses half) and the raw out_backprop tile;
// POSSIBLE where sm_80's cp.async exists and all of it fits in the 48 KiB of static shared
// memory (not float / double 5x5, whose sums alone take 25 KiB: 51 to 65 KiB in all).
template <typename T, typename Acc, int K, int S, int C> struct AsyncStaging {
    using Sh = Shape<K, S, C>;
    static constexpr int CHANNELS = Block<Acc>::CHANNELS;
    static constexpr int STAGE_BYTES = Sh::STAGED_ROWS * Sh::STAGED_COLS * CHANNELS * static_cast<int>(sizeof(Acc));
    static constexpr int RAW_IN_BYTES = Sh::STAGED_ROWS * Sh::STAGED_COLS * CHANNELS * static_cast<int>(sizeof(T));
    static constexpr int RAW_DY_BYTES = Sh::TILE_ROWS * Sh::TILE_COLS * CHANNELS * static_cast<int>(sizeof(T));
    static constexpr int SUM_BYTES = kItems * K * K * CHANNELS * static_cast<int>(sizeof(Acc));
    static constexpr bool POSSIBLE = GRADOPS_HAS_MMA_SM80 &&
        (STAGE_BYTES > SUM_BYTES ? STAGE_BYTES : SUM_BYTES) + RAW_IN_BYTES + RAW_DY_BYTES <= 48 * 1024;
    static constexpr int RAW_BYTES = POSSIBLE ? RAW_IN_BYTES + RAW_DY_BYTES : 0;
};

#if GRADOPS_HAS_MMA_SM80
// Asynchronous staging (sm_80+, the 16-byte forms; the launcher's ``async_copies``).  Without it
// a unit's staging loads are issued after the barrier that ends the previous unit's sums, so
// every unit waits for one DRAM round trip with nothing else to do: the H200 measured the float32
// kernel at 3 to 6 times the time its model gives when that wait overlaps other CTAs' work.  Here
// the next unit's input chunks and out_backprop values are copied by cp.async into raw buffers
// (as in memory, 16 bytes a copy, zero-filled where the tile has none) right after the unit is
// staged, so the copies land while the CTA sums the unit; the next unit then widens them from
// shared memory into the staged tile (stage_vectors<FROM_RAW>) and reads its out_backprop
// values from the raw buffer.  No register holds a copy in flight.
//
// copy_unit: chunk e of the input tile (as stage_vectors numbers them, M = 1 or 2) to raw_in[e];
// chunk e of the out_backprop tile (TILE positions, row-major, x CHANNELS output channels from
// k0, 16 bytes each) to raw_dy[e]; out_rows_left / out_cols_left: output rows / columns from the
// tile's first position; dy_at: the offset of its first position's channel k0 (the channels of
// a position are out_depth apart; out_depth a multiple of VEC and an aligned out_backprop).
template <typename T, typename Acc, int STAGED, int COLS, int TILE_ROWS, int TILE_COLS, int M>
__device__ __forceinline__ void copy_unit(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                          uint4* raw_in, uint4* raw_dy, int tid, int tile_at, Box inside, int k0,
                                          int in_cols, int in_depth, int dy_at, int out_rows_left,
                                          int out_cols_left, int out_cols, int out_depth) {
    constexpr int CHANNELS = Block<Acc>::CHANNELS;
    constexpr int VEC = kVectorBytes / static_cast<int>(sizeof(T));
    constexpr int PER_POSITION = CHANNELS / (VEC * M);
    constexpr int CHUNKS = STAGED * PER_POSITION;
    const int c0 = k0 / M;
#pragma unroll
    for (int b = 0; b < (CHUNKS + kThreads - 1) / kThreads; ++b) {
        const int e = tid + b * kThreads;
        if (CHUNKS % kThreads != 0 && e >= CHUNKS) break;
        const int position = e / PER_POSITION, c = c0 + e % PER_POSITION * VEC;
        const int row = position / COLS, col = position % COLS;
        const bool fill = inside.holds(row, col) && c < in_depth;
        // With fill false cp.async reads nothing; it still takes a valid address.
        ptx::cp_async_16(raw_in + e, fill ? input + (tile_at + (row * in_cols + col) * in_depth + c) : input, fill);
    }
    constexpr int DY_PER_POSITION = CHANNELS / VEC;
    constexpr int DY_CHUNKS = TILE_ROWS * TILE_COLS * DY_PER_POSITION;
#pragma unroll
    for (int b = 0; b < (DY_CHUNKS + kThreads - 1) / kThreads; ++b) {
        const int e = tid + b * kThreads;
        if (DY_CHUNKS % kThreads != 0 && e >= DY_CHUNKS) break;
        const int position = e / DY_PER_POSITION, k = k0 + e % DY_PER_POSITION * VEC;
        const int row = position / TILE_COLS, col = position % TILE_COLS;
        const bool fill = row < out_rows_left && col < out_cols_left && k < out_depth;
        ptx::cp_async_16(raw_dy + e, fill ? out_backprop + (dy_at + (row * out_cols + col) * out_depth + (k - k0))
                                          : out_backprop, fill);
    }
}
#endif  // GRADOPS_HAS_MMA_SM80

// stage_elements: one element per load, any multiplier: output channel k0 + e reads input
// channel (k0 + e) / multiplier.
template <typename T, typename Acc, int STAGED, int COLS, bool SWIZZLE>
__device__ __forceinline__ void stage_elements(const T* __restrict__ input, Acc* __restrict__ staged, int tid,
                                               int tile_at, Box inside, int k0, int in_cols, int in_depth,
                                               int multiplier) {
    constexpr int CHANNELS = Block<Acc>::CHANNELS;
    constexpr int ELEMENTS = STAGED * CHANNELS;
    constexpr int PER_THREAD = (ELEMENTS + kThreads - 1) / kThreads;
    const int out_depth = in_depth * multiplier;
    // The swizzle: element e = tid + j kThreads of a thread lies at e ^ 4 where its position is
    // odd, as every one of the thread's is where tid / CHANNELS is (CHANNELS divides kThreads / 2).
    static_assert(kThreads / CHANNELS % 2 == 0, "a thread's positions of one parity");
    const int slot = SWIZZLE && tid / CHANNELS % 2 != 0 ? tid ^ 4 : tid;
#pragma unroll 1
    for (int b0 = 0; b0 < PER_THREAD; b0 += kStageBatch) {
        T raw[kStageBatch];
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            const int e = tid + (b0 + b) * kThreads;
            const int position = e / CHANNELS, channel = k0 + e % CHANNELS;
            const int row = position / COLS, col = position % COLS;
            raw[b] = from_acc<T, Acc>(Acc(0));
            if (e < ELEMENTS && inside.holds(row, col) && channel < out_depth)
                raw[b] = input[tile_at + (row * in_cols + col) * in_depth + channel / multiplier];
        }
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            const int e = tid + (b0 + b) * kThreads;
            if (e >= ELEMENTS) break;
            staged[slot + (b0 + b) * kThreads] = to_acc<Acc>(raw[b]);
        }
    }
}

}  // namespace dwfilter

// staging: 0 one element per load (any multiplier), 1 16-byte loads (multiplier 1), 2 16-byte
// loads of multiplier 2 (each value staged twice); the launcher picks it (in_depth a multiple
// of 16 / sizeof(T) and an aligned input for 1 and 2).  lane_loads: out_backprop read V
// channels per load (out_depth a multiple of V, aligned).  columns_per_warp: how a warp's two
// work items sit in the tile (see below).  partial: [slices][K * K][out_depth] (result:
// store_sum; tickets: one launch for a few slices, a counter per channel block).
template <typename T, typename Acc, int K, int S, int C, bool ASYNC = false>
__global__ void __launch_bounds__(dwfilter::kThreads, (dwfilter::MinBlocks<T, K, S, ASYNC>::value)) depthwise_conv2d_native_backprop_filter_tiled(
        const T* __restrict__ input, const T* __restrict__ out_backprop, Acc* __restrict__ partial,
        T* __restrict__ result, unsigned* __restrict__ tickets, int in_rows, int in_cols, int in_depth,
        int multiplier, int out_rows, int out_cols, int pad_top, int pad_left, int tiles_down, int tiles_across,
        int units, int units_per_slice, int staging, int lane_loads, int columns_per_warp) {
    using namespace dwfilter;
    using Sh = Shape<K, S, C>;
    using Async = AsyncStaging<T, Acc, K, S, C>;
    constexpr int CHANNELS = Block<Acc>::CHANNELS, V = Block<Acc>::V, LANES = Block<Acc>::LANES;
    constexpr int STAGED = Sh::STAGED_ROWS * Sh::STAGED_COLS;
    constexpr int STAGE_BYTES = Async::STAGE_BYTES;
    constexpr int SUM_BYTES = kItems * K * K * CHANNELS * static_cast<int>(sizeof(Acc));
    constexpr int TILE_BYTES = STAGE_BYTES > SUM_BYTES ? STAGE_BYTES : SUM_BYTES;
    // The staged tile, then (after the last unit) the work items' sums; with asynchronous
    // staging, the raw buffers after them.
    static_assert(!ASYNC || Async::POSSIBLE, "asynchronous staging needs sm_80 and its buffers in 48 KiB");
    __shared__ __align__(16) unsigned char shared[TILE_BYTES + (ASYNC ? Async::RAW_BYTES : 0)];
    Acc* const staged = reinterpret_cast<Acc*>(shared);
    uint4* const raw_in = reinterpret_cast<uint4*>(shared + TILE_BYTES);
    uint4* const raw_dy = raw_in + Async::RAW_IN_BYTES / 16;

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % LANES, item = tid / LANES;
    // A warp holds two work items (32 threads = 2 x LANES): side by side in one item row, or
    // with columns_per_warp one above the other in one item column (rows 2w and 2w + 1 of
    // ITEMS_DOWN), whichever the launcher finds idles more whole warps where the output ends
    // inside a tile: a warp whose two work items lie wholly past the output skips the sums.
    static_assert(32 == 2 * LANES && C % 2 == 0 && (kItems / C) % 2 == 0, "two work items per warp");
    constexpr int ITEMS_DOWN = kItems / C;
    const bool columns = columns_per_warp != 0;
    const int item_row = columns ? item % ITEMS_DOWN : item / C;
    const int item_col = columns ? item / ITEMS_DOWN : item % C;
    const int out_depth = in_depth * multiplier;
    const int k0 = static_cast<int>(blockIdx.x) * CHANNELS;
    const int k = k0 + lane * V;
    const int slice = static_cast<int>(blockIdx.y);
    // The work item's first window row / column within the staged tile, and its positions'.
    const int window_row0 = item_row * Sh::ITEM_ROWS * S, window_col0 = item_col * Sh::ITEM_COLS * S;
    const int window_first = window_row0 * Sh::STAGED_COLS + window_col0;
    // The swizzle (half types, synchronous staging, but 5x5 at stride 2; see dwfilter::swizzled):
    // the lane's channels at the window's first position, and where they lie in a position of the
    // other parity.
    constexpr bool SWIZZLE = sizeof(T) == 2 && !ASYNC && !(K == 5 && S == 2);
    const bool first_odd = SWIZZLE && window_first % 2 != 0;
    const Acc* const window = staged + window_first * CHANNELS + swizzled(lane * V, first_odd);
    const Acc* const window_odd =
        staged + window_first * CHANNELS + swizzled(lane * V, SWIZZLE && !first_odd);

    Acc acc[K * K][V];
#pragma unroll
    for (int t = 0; t < K * K; ++t)
#pragma unroll
        for (int u = 0; u < V; ++u) acc[t][u] = Acc(0);

    const int first = slice * units_per_slice;
    const int stop = min(units, first + units_per_slice);
    const int row_step = out_cols * out_depth;  // between out_backprop rows
    // Pass 0 sums the slice's units unchecked (every product, padding zeros included).  Every
    // sum finite: each equals TF's (a product that TF skips is w * 0 = +-0, which leaves a sum
    // that starts at +0 unchanged).  Else some value was Inf or NaN (it may have met a padding
    // zero, which TF never multiplies) or a sum overflowed: pass 1 sums the slice again,
    // checked (exactly TF's taps and positions).  One loop for both passes, as one unit loop
    // body with both sums kept the registers within MinBlocks' budget (two copies spilled on
    // sm_80).
    // The unit at (image n, tile row, tile column): its first output position (p0, q0), its
    // staged tile's first input position (y0, x0), the tile's offset (position 0, channel 0;
    // negative where the tile starts above or left of the image) and its positions inside the
    // image.
    struct Unit {
        int p0, q0, y0, x0, tile_at;
        Box inside;
    };
    const auto unit_at = [&](int n, int tile_row, int tile_col) {
        const int p0 = tile_row * Sh::TILE_ROWS, q0 = tile_col * Sh::TILE_COLS;
        const int y0 = p0 * S - pad_top, x0 = q0 * S - pad_left;
        return Unit{p0, q0, y0, x0, ((n * in_rows + y0) * in_cols + x0) * in_depth,
                    Box{-y0, in_rows - y0, -x0, in_cols - x0}};
    };
    // Asynchronous staging: the copies of a unit (staging 1 or 2: the launcher takes
    // async_copies only with 16-byte staging).
    const auto copy = [&](int n, int tile_row, int tile_col) {
#if GRADOPS_HAS_MMA_SM80
        if constexpr (ASYNC) {
            const auto [p0, q0, y0, x0, tile_at, inside] = unit_at(n, tile_row, tile_col);
            const int dy_at = ((n * out_rows + p0) * out_cols + q0) * out_depth + k0;
            if (staging == 1) {
                copy_unit<T, Acc, STAGED, Sh::STAGED_COLS, Sh::TILE_ROWS, Sh::TILE_COLS, 1>(
                    input, out_backprop, raw_in, raw_dy, tid, tile_at, inside, k0, in_cols, in_depth, dy_at,
                    out_rows - p0, out_cols - q0, out_cols, out_depth);
            } else {
                copy_unit<T, Acc, STAGED, Sh::STAGED_COLS, Sh::TILE_ROWS, Sh::TILE_COLS, 2>(
                    input, out_backprop, raw_in, raw_dy, tid, tile_at, inside, k0, in_cols, in_depth, dy_at,
                    out_rows - p0, out_cols - q0, out_cols, out_depth);
            }
            ptx::cp_async_commit_group();
        }
#endif
    };
    for (bool checked = false;; checked = true) {
        // The unit's (image, tile row, tile column), advanced by one per unit without a division.
        int tile_col = first % tiles_across, tile_row = first / tiles_across % tiles_down;
        int n = first / tiles_across / tiles_down;
        if (ASYNC && first < stop) copy(n, tile_row, tile_col);
        for (int unit = first; unit < stop; ++unit) {
            const auto [p0, q0, y0, x0, tile_at, inside] = unit_at(n, tile_row, tile_col);

            // The work item's out_backprop values (zeros past the output or the channels), loaded
            // before the barrier and the staging so that their round trip overlaps both.
            const int p = p0 + item_row * Sh::ITEM_ROWS, q = q0 + item_col * Sh::ITEM_COLS;
            const int rows = min(Sh::ITEM_ROWS, out_rows - p), cols = min(Sh::ITEM_COLS, out_cols - q);
            const int item_at = ((n * out_rows + p) * out_cols + q) * out_depth + k;
            RawLane<T, V> dy_raw[Sh::ITEM_ROWS][Sh::ITEM_COLS];
            if (!ASYNC) {
#pragma unroll
                for (int i = 0; i < Sh::ITEM_ROWS; ++i) {
#pragma unroll
                    for (int j = 0; j < Sh::ITEM_COLS; ++j) {
                        dy_raw[i][j] = i < rows && j < cols && k < out_depth
                                           ? load_lane<T, Acc>(out_backprop, item_at + i * row_step + j * out_depth,
                                                               lane_loads != 0, out_depth - k)
                                           : zero_lane<T, Acc>();
                    }
                }
            }
#if GRADOPS_HAS_MMA_SM80
            if (ASYNC) ptx::cp_async_wait_group<0>();  // this thread's copies of the unit have landed
#endif
            // (With asynchronous staging the barrier also makes every thread's landed copies visible.)
            __syncthreads();  // the previous unit's staged tile has been read

            if (ASYNC) {
                // The unit's chunks from the raw buffer, and this item's out_backprop values
                // (zeros past the output and the channels were copied as zeros).
                if (staging == 1) {
                    stage_vectors<T, Acc, STAGED, Sh::STAGED_COLS, 1, SWIZZLE, true>(
                        input, staged, tid, tile_at, inside, k0, in_cols, in_depth, raw_in);
                } else {
                    stage_vectors<T, Acc, STAGED, Sh::STAGED_COLS, 2, SWIZZLE, true>(
                        input, staged, tid, tile_at, inside, k0, in_cols, in_depth, raw_in);
                }
                const unsigned char* const item_dy = reinterpret_cast<const unsigned char*>(raw_dy) +
                    ((item_row * Sh::ITEM_ROWS * Sh::TILE_COLS + item_col * Sh::ITEM_COLS) * CHANNELS + lane * V) *
                        static_cast<int>(sizeof(T));
#pragma unroll
                for (int i = 0; i < Sh::ITEM_ROWS; ++i)
#pragma unroll
                    for (int j = 0; j < Sh::ITEM_COLS; ++j)
                        dy_raw[i][j].bits = *reinterpret_cast<const decltype(dy_raw[i][j].bits)*>(
                            item_dy + (i * Sh::TILE_COLS + j) * CHANNELS * static_cast<int>(sizeof(T)));
            } else if (staging == 1) {
                stage_vectors<T, Acc, STAGED, Sh::STAGED_COLS, 1, SWIZZLE>(input, staged, tid, tile_at, inside, k0,
                                                                          in_cols, in_depth);
            } else if (staging == 2) {
                stage_vectors<T, Acc, STAGED, Sh::STAGED_COLS, 2, SWIZZLE>(input, staged, tid, tile_at, inside, k0,
                                                                          in_cols, in_depth);
            } else {
                stage_elements<T, Acc, STAGED, Sh::STAGED_COLS, SWIZZLE>(input, staged, tid, tile_at, inside, k0,
                                                                        in_cols, in_depth, multiplier);
            }
            if (++tile_col == tiles_across) {
                tile_col = 0;
                if (++tile_row == tiles_down) {
                    tile_row = 0;
                    ++n;
                }
            }
            __syncthreads();  // the unit is staged (and every thread is done with the raw buffers)
            // The next unit's copies land while this one is summed.
            if (ASYNC && unit + 1 < stop) copy(n, tile_row, tile_col);

            // A work item wholly past the output adds only zeros (its out_backprop values are 0 and
            // the checked loop would skip every position): it skips the sums, and a warp of two such
            // items skips them as a whole.
            if (rows > 0 && cols > 0) {
                Lane<Acc> dy[Sh::ITEM_ROWS][Sh::ITEM_COLS];
#pragma unroll
                for (int i = 0; i < Sh::ITEM_ROWS; ++i)
#pragma unroll
                    for (int j = 0; j < Sh::ITEM_COLS; ++j) dy[i][j] = widen_lane<T, Acc>(dy_raw[i][j]);
                if (!checked) {
                    accumulate<false, Acc, K, S, C>(window, window_odd, dy, acc, 0, 0, 0, 0, 0, 0);
                } else {
                    // Window rows / columns inside the image: y0 + window_row0 + wr in [0, in_rows).
                    const int wy = y0 + window_row0, wx = x0 + window_col0;
                    accumulate<true, Acc, K, S, C>(window, window_odd, dy, acc, max(0, -wy), in_rows - wy,
                                                   max(0, -wx), in_cols - wx, rows, cols);
                }
            }
        }
        if (checked) break;
        Acc sums_probe = Acc(0);  // one probe per sum, once per slice
#pragma unroll
        for (int t = 0; t < K * K; ++t)
#pragma unroll
            for (int u = 0; u < V; ++u) probe(sums_probe, acc[t][u]);
        if (!__syncthreads_or(sums_probe != sums_probe)) break;
#pragma unroll
        for (int t = 0; t < K * K; ++t)
#pragma unroll
            for (int u = 0; u < V; ++u) acc[t][u] = Acc(0);
    }

    // The work items' sums, added in item order.
    __syncthreads();  // the last unit's staged tile has been read
    Acc* const sums = staged;  // [item][tap][channel]
#pragma unroll
    for (int t = 0; t < K * K; ++t) {
        Lane<Acc> v;
#pragma unroll
        for (int u = 0; u < V; ++u) v.v[u] = acc[t][u];
        *reinterpret_cast<Lane<Acc>*>(sums + (item * K * K + t) * CHANNELS + lane * V) = v;
    }
    __syncthreads();
    for (int e = tid; e < K * K * CHANNELS; e += kThreads) {
        const int t = e / CHANNELS, channel = e % CHANNELS;
        if (k0 + channel >= out_depth) continue;
        Acc sum = sums[t * CHANNELS + channel];
#pragma unroll
        for (int w = 1; w < kItems; ++w) sum += sums[(w * K * K + t) * CHANNELS + channel];
        store_sum(partial, result, (slice * K * K + t) * out_depth + k0 + channel, sum);
    }
    if (tickets != nullptr)
        add_few_slices<true, T, Acc>(partial, result, tickets + blockIdx.x, gridDim.y, K * K * out_depth,
                                     static_cast<int>(gridDim.y), K * K, out_depth, k0, CHANNELS, tid, kThreads);
}

// ==================================================================== the planes kernel
//
// depthwise_conv2d_native_backprop_filter_planes: the same partial sums for NCHW, where a
// channel's positions are one contiguous plane per image.  A warp owns one out_backprop channel
// k (kWarps channels per CTA) and a slice of work items; a work item is ITEM_ROWS x 4 output
// positions of one image's plane.  The interior items (positions inside the output, window
// inside the image: a box of item rows x columns per plane) are numbered (image, box row, box
// column), column fastest, the border items by image and band; slice z takes a run of each.
// Lane l takes items first + l, first + l + 32, ... of each run: a warp's out_backprop loads are consecutive columns of a plane row (4 per
// lane, one load where out_cols is a multiple of 4), and its window loads of input plane
// c = k / M overlap the neighbouring lanes' (L1 serves the overlap); they load aligned pairs
// of values where in_cols is even (WindowLoads).  An item issues every load (window first,
// then out_backprop) before it widens any value, so it waits for memory once.  A thread multiplies each
// value of its window (WINDOW_ROWS x WINDOW_COLS) into every tap that carries it to one of its
// positions: K x K sums in registers, no shared memory and no barrier.  Interior items load
// without a test and advance by a step of 32 items (no division); the interior items' loop and
// the border items' loop are separate, so a warp's lanes take each together.  Border items test
// each load and find their coordinates by division.
//
// Padding.  Border items load zeros outside the image and past the output.  A zero times a finite
// value is +-0, which leaves a sum unchanged (a sum starting at +0 never becomes -0), so the sums
// equal TF's, which skips those taps and positions, unless a zero met an Inf or NaN: then the sum
// is NaN.  A thread whose K x K sums are not all finite at the end of its slice sums the slice
// again, skipping exactly what TF skips (the checked loop; a slice with genuine non-finite sums
// pays it too).  Then the warp adds its lanes' sums in lane order through shared memory and
// writes partial[slice][tap][k].
//
// Compile-time K x K and stride S (K in {3, 5}, S in {1, 2}), dilation 1, NCHW, 32-bit offsets
// of whole items (positions past the output and window rows and columns outside the image
// included); the launcher checks and runs the _partial kernel otherwise.
namespace dwplanes {

inline constexpr int kWarpSize = 32;
// Warps (out_backprop channels) per CTA: 128 threads.
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * kWarpSize;

// How a work item's window is loaded: one value a load (kSingles), or aligned pairs of values
// (in_cols even, the tensor aligned to a pair: half, bfloat16 and float; a window row's pairs
// lie in its image row).  A window's first column x0 = q0 * S - pad_left (q0 a multiple of 4)
// has pad_left's parity: even, its pairs start at the window (kPairs); odd, at the column
// before it (kPairsFromColumnBefore).  Pairs halve a half window's loads (36 -> 18 or 24 for
// 3x3 at stride 1) and the registers they fill.  kLaneBlocks + pad_left (pad_left 0, 1 or 2;
// see "Lane blocks" below): interior items load their own 4 x S columns in one or two 8- or
// 16-byte loads and take the columns either side from the neighbouring lanes; border items load
// pairs.
enum WindowForm { kSingles, kPairs, kPairsFromColumnBefore, kLaneBlocks };
// The pair form a form's window rows are laid out in (and its border items load): a lane-block
// form's is that of its pad_left's parity.
template <int FORM> struct RowForm {
    static constexpr int value = FORM < kLaneBlocks ? FORM : (FORM - kLaneBlocks) % 2 ? kPairsFromColumnBefore : kPairs;
};

// CTAs per SM the register allocation must allow: 5 for 3x3 (102 registers a thread), 4 for
// 5x5 at stride 1 (128) and 3 at stride 2 (170), 2 with double sums (255).  At 6 CTAs (85
// registers) 3x3 at stride 1 spilled on sm_80 or sm_90 for some element type and window form;
// at 6 / 4 CTAs 3x3 / 5x5 at stride 2 spilled.  (Each item's loads are issued before any value
// is widened: with 64 registers the compiler had widened each half value next to its load.)
// But float 3x3 at stride 1 on sm_90 takes 6 (80 registers, no spill in any window form,
// NVRTC 13 and 12.9), where 5 let ptxas take 88-90: 24 resident warps where 20.  On sm_75,
// sm_80, sm_100 and sm_120 the singles and pairs-from-the-column-before forms spilled 4-12 B
// at 6; half types take 71-80 at 5 already.  Their 3x3 pair forms (FORM != kSingles) on
// sm_75 to sm_89 take 7 (72 registers, 28 resident warps where the SM holds 7 CTAs): all but
// one already took 71-72 at 5, and bfloat16 at stride 1 from the column before took 80 (24
// warps) once the one-launch epilogue (add_few_slices) was in; at 7 it takes 72, no spill
// (NVRTC 13.5 and 12.9).  Lane blocks take 6 at 3x3 and 4 at 5x5 (72-80 and up to 128
// registers, no spill, nvcc 13.0 sm_75 to sm_90, NVRTC 12.9 and 13.5), 5 and 3 from sm_100,
// where ptxas spilled at 6 and 4.
template <typename T, typename Acc, int K, int S, int FORM> struct MinBlocks {
    static constexpr bool FLOAT_SM90 = sizeof(T) == 4 && K == 3 && S == 1 && GRADOPS_ARCH == 900;
    static constexpr bool HALF_PAIRS = sizeof(T) == 2 && K == 3 && FORM != 0 && GRADOPS_ARCH >= 750 &&
                                       GRADOPS_ARCH < 900;
    static constexpr bool LANES = FORM >= kLaneBlocks;
    static constexpr bool LANES_SM100 = LANES && GRADOPS_ARCH >= 1000;
    static constexpr int value = sizeof(Acc) == 8 ? 2
                                 : K == 3 ? (LANES_SM100 ? 5 : FLOAT_SM90 || LANES ? 6 : HALF_PAIRS ? 7 : 5)
                                          : (LANES_SM100 ? 3 : S == 1 || LANES ? 4 : 3);
};
// Output columns per work item: one 8-byte (half) or 16-byte (float) out_backprop load per row.
inline constexpr int kItemCols = 4;

// Work items of 4 x 4 positions at stride 1 (a 6 x 6 window of 36 loads feeds 16 x 9 taps at
// 3x3) and 2 x 4 at stride 2 (5 x 9 loads for 8 x 9 taps), where 2 x 4 at stride 1 would load
// 4 x 6 values for 8 positions: a third more loads per position.
template <int K, int S> struct Shape {
    static_assert((K == 3 || K == 5) && (S == 1 || S == 2), "3x3 or 5x5, stride 1 or 2");
    static constexpr int ITEM_ROWS = S == 1 ? 4 : 2;
    static constexpr int ITEM_COLS = kItemCols;
    static constexpr int WINDOW_ROWS = (ITEM_ROWS - 1) * S + K;
    static constexpr int WINDOW_COLS = (ITEM_COLS - 1) * S + K;
};

// Two values of T as one load, +0 for both, and either value as a float.  Half types load the
// pair's bits: selecting a __half2 struct against a zero one made the compiler move its halves
// one by one, each waiting for the load.
template <typename T> struct PairOf {  // half, bfloat16
    using type = unsigned;
    __device__ __forceinline__ static type zero() { return 0u; }
    __device__ __forceinline__ static float value(type bits, int i) {
        const float2 f = dwconv::to_float2(*reinterpret_cast<const typename dwconv::TwoOf<T>::type*>(&bits));
        return i ? f.y : f.x;
    }
};
// bfloat16 widens by moving its bits into a float's top half: done as integer operations on the
// pair's word, at the use.  Through __nv_bfloat162 the compiler split every pair into its halves
// (PRMT) right after the window loads, so the warp waited for them before issuing its
// out_backprop loads: 2 round trips an item where float16 takes 1 (sm_90 SASS).
template <> struct PairOf<__nv_bfloat16> {
    using type = unsigned;
    __device__ __forceinline__ static type zero() { return 0u; }
    __device__ __forceinline__ static float value(type bits, int i) {
        return __uint_as_float(i ? bits & 0xffff0000u : bits << 16);
    }
};
template <> struct PairOf<float> {
    using type = float2;
    __device__ __forceinline__ static type zero() { return make_float2(0.0f, 0.0f); }
    __device__ __forceinline__ static float value(type pair, int i) { return i ? pair.y : pair.x; }
};

template <typename T, int K, int S, int FORM> struct WindowLoads {  // pairs
    static_assert(sizeof(T) <= 4, "pairs of half, bfloat16 or float");
    static constexpr int VALUES = 2;  // per load
    static constexpr int SHIFT = FORM == kPairsFromColumnBefore ? 1 : 0;  // columns loaded left of the window
    static constexpr int LOADS_PER_ROW = (Shape<K, S>::WINDOW_COLS + SHIFT + 1) / 2;
    using Load = typename PairOf<T>::type;
    __device__ __forceinline__ static Load zero() { return PairOf<T>::zero(); }
    // Window column wc of a row of loads (wc a constant once unrolled).
    template <typename Acc> __device__ __forceinline__ static Acc value(const Load (&row)[LOADS_PER_ROW], int wc) {
        const int at = wc + SHIFT;
        return static_cast<Acc>(PairOf<T>::value(row[at / 2], at % 2));
    }
};
template <typename T, int K, int S> struct WindowLoads<T, K, S, kSingles> {
    static constexpr int VALUES = 1;
    static constexpr int SHIFT = 0;
    static constexpr int LOADS_PER_ROW = Shape<K, S>::WINDOW_COLS;
    using Load = T;
    __device__ __forceinline__ static Load zero() { return from_acc<T, float>(0.0f); }
    template <typename Acc> __device__ __forceinline__ static Acc value(const Load (&row)[LOADS_PER_ROW], int wc) {
        return to_acc<Acc>(row[wc]);
    }
};

// An item row's four out_backprop values as one load (two for double), their zero and their
// widening; ``p`` 4-aligned (out_cols a multiple of 4, an aligned tensor).  Half types keep the
// bits until they are widened (see PairOf).
template <typename T> struct FourOf {  // half, bfloat16
    using type = uint2;
    __device__ __forceinline__ static type load(const T* p) { return dwconv::load_vector(reinterpret_cast<const uint2*>(p)); }
    __device__ __forceinline__ static type zero() { return make_uint2(0u, 0u); }
    template <typename Acc> __device__ __forceinline__ static void widen(const type& raw, Acc (&v)[4]) {
        const typename dwconv::TwoOf<T>::type* h = reinterpret_cast<const typename dwconv::TwoOf<T>::type*>(&raw);
        const float2 a = dwconv::to_float2(h[0]), b = dwconv::to_float2(h[1]);
        v[0] = a.x;
        v[1] = a.y;
        v[2] = b.x;
        v[3] = b.y;
    }
};
template <> struct FourOf<float> {
    using type = float4;
    __device__ __forceinline__ static type load(const float* p) { return dwconv::load_vector(reinterpret_cast<const float4*>(p)); }
    __device__ __forceinline__ static type zero() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }
    __device__ __forceinline__ static void widen(const type& f, float (&v)[4]) {
        v[0] = f.x;
        v[1] = f.y;
        v[2] = f.z;
        v[3] = f.w;
    }
};
template <> struct FourOf<double> {
    struct type {
        double2 lo, hi;
    };
    __device__ __forceinline__ static type load(const double* p) {
        const double2* q = reinterpret_cast<const double2*>(p);
        return {dwconv::load_vector(q), dwconv::load_vector(q + 1)};
    }
    __device__ __forceinline__ static type zero() { return {make_double2(0.0, 0.0), make_double2(0.0, 0.0)}; }
    __device__ __forceinline__ static void widen(const type& d, double (&v)[4]) {
        v[0] = d.lo.x;
        v[1] = d.lo.y;
        v[2] = d.hi.x;
        v[3] = d.hi.y;
    }
};

// The geometry a thread's item loops need (all 32-bit: the launcher checks whole items' offsets).
struct Planes {
    int in_rows, in_cols, in_depth, out_rows, out_cols, out_depth, pad_top, pad_left;
    int item_rows, item_cols;  // work items down / across a plane
    // The interior box: item rows [box_row0, box_row1) x columns [box_col0, box_col1), whose
    // positions are inside the output and whose windows inside the image (an empty box is
    // [item_rows, item_rows) x [item_cols, item_cols)); the others per image.
    int box_row0, box_row1, box_col0, box_col1, border_per_image;
    bool four;  // out_backprop rows read 4 values per load
};

// How an item's loads treat the image and output edges: an interior item loads everything
// unconditionally; a border item loads zeros outside the image and past the output; the checked
// form skips those values and the products they would make (see "Padding").
enum ItemLoads { kInterior, kZeroFilled, kChecked };

// An item's out_backprop values, widened: one uniform branch (g.four), each form's loads issued
// before any is widened (a branch per row, with its widening, made a border item wait once a
// row).  Border items load zeros past the output (rows, cols: the item's positions inside it).
template <int LOADS, typename T, typename Acc, int K, int S>
__device__ __forceinline__ void load_out_backprop(const T* __restrict__ out_backprop, const Planes& g, int dy_at,
                                                  int rows, int cols,
                                                  Acc (&dy)[Shape<K, S>::ITEM_ROWS][Shape<K, S>::ITEM_COLS]) {
    using Sh = Shape<K, S>;
    if (g.four) {
        typename FourOf<T>::type rows_of_four[Sh::ITEM_ROWS];
#pragma unroll
        for (int a = 0; a < Sh::ITEM_ROWS; ++a)
            rows_of_four[a] = LOADS == kInterior || a < rows ? FourOf<T>::load(out_backprop + dy_at + a * g.out_cols)
                                                              : FourOf<T>::zero();
#pragma unroll
        for (int a = 0; a < Sh::ITEM_ROWS; ++a) FourOf<T>::widen(rows_of_four[a], dy[a]);
    } else {
        T values[Sh::ITEM_ROWS][Sh::ITEM_COLS];
#pragma unroll
        for (int a = 0; a < Sh::ITEM_ROWS; ++a)
#pragma unroll
            for (int b = 0; b < Sh::ITEM_COLS; ++b)
                values[a][b] = LOADS == kInterior || (a < rows && b < cols) ? out_backprop[dy_at + a * g.out_cols + b]
                                                                            : from_acc<T, Acc>(Acc(0));
#pragma unroll
        for (int a = 0; a < Sh::ITEM_ROWS; ++a)
#pragma unroll
            for (int b = 0; b < Sh::ITEM_COLS; ++b) dy[a][b] = to_acc<Acc>(values[a][b]);
    }
}

// Every value of an item's window times every out_backprop value it meets, into the tap that
// carries it there.  CHECKED skips the window values outside the image (window rows [row_begin,
// row_end) x columns [col_begin, col_end) are inside) and the positions past the output (rows,
// cols: the item's positions inside it).
template <bool CHECKED, typename T, typename Acc, int K, int S, int ROW_FORM>
__device__ __forceinline__ void accumulate_item(
        const typename WindowLoads<T, K, S, ROW_FORM>::Load (&window)[Shape<K, S>::WINDOW_ROWS][WindowLoads<T, K, S, ROW_FORM>::LOADS_PER_ROW],
        const Acc (&dy)[Shape<K, S>::ITEM_ROWS][Shape<K, S>::ITEM_COLS], int row_begin, int row_end, int col_begin,
        int col_end, int rows, int cols, Acc (&acc)[K * K]) {
    using Sh = Shape<K, S>;
    using Wl = WindowLoads<T, K, S, ROW_FORM>;
#pragma unroll
    for (int wr = 0; wr < Sh::WINDOW_ROWS; ++wr) {
#pragma unroll
        for (int wc = 0; wc < Sh::WINDOW_COLS; ++wc) {
            // The checked form skips exactly the values the loads left zero.
            if (CHECKED && !(wr >= row_begin && wr < row_end && wc >= col_begin && wc < col_end)) continue;
            const Acc x = Wl::template value<Acc>(window[wr], wc);
#pragma unroll
            for (int a = 0; a < Sh::ITEM_ROWS; ++a) {
                const int r = wr - a * S;  // the tap that carries window row wr to position row a
                if (r < 0 || r >= K || (CHECKED && a >= rows)) continue;
#pragma unroll
                for (int b = 0; b < Sh::ITEM_COLS; ++b) {
                    const int s = wc - b * S;
                    if (s < 0 || s >= K || (CHECKED && b >= cols)) continue;
                    acc[r * K + s] += x * dy[a][b];
                }
            }
        }
    }
}

// The K x K sums of work item (image n, item row, item column) of out_backprop channel k and
// input channel c.
template <int LOADS, typename T, typename Acc, int K, int S, int WINDOW_FORM>
__device__ __forceinline__ void sum_item(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                         const Planes& g, int k, int c, int n, int row, int col,
                                         Acc (&acc)[K * K]) {
    using Sh = Shape<K, S>;
    const int p0 = row * Sh::ITEM_ROWS, q0 = col * Sh::ITEM_COLS;  // the item's first position
    const int y0 = p0 * S - g.pad_top, x0 = q0 * S - g.pad_left;  // its window's first input position
    const int rows = min(Sh::ITEM_ROWS, g.out_rows - p0), cols = min(Sh::ITEM_COLS, g.out_cols - q0);
    const int dy_at = ((n * g.out_depth + k) * g.out_rows + p0) * g.out_cols + q0;
    const int in_at = ((n * g.in_depth + c) * g.in_rows + y0) * g.in_cols + x0;  // negative above the image
    // Window rows [row_begin, row_end) and columns [col_begin, col_end) are inside the image.
    const int row_begin = max(0, -y0), row_end = g.in_rows - y0;
    const int col_begin = max(0, -x0), col_end = g.in_cols - x0;

    // The window's elements first, every load issued before any is widened or multiplied
    // (widening each value next to its load made the warp wait for it, for half types), and
    // before the out_backprop loads: their branch ends in widening them, and the compiler issued
    // no load past it, so window loads placed after it waited for the out_backprop loads' round
    // trip before starting their own.
    using Wl = WindowLoads<T, K, S, RowForm<WINDOW_FORM>::value>;
    typename Wl::Load window[Sh::WINDOW_ROWS][Wl::LOADS_PER_ROW];
    // A row's loads start SHIFT columns left of the window (at the pair holding its first column).
#pragma unroll
    for (int wr = 0; wr < Sh::WINDOW_ROWS; ++wr) {
        const bool row_inside = wr >= row_begin && wr < row_end;
#pragma unroll
        for (int j = 0; j < Wl::LOADS_PER_ROW; ++j) {
            // The load's first window column; a pair lies inside the image or outside it whole
            // (in_cols even, the pair at an even column).
            const int wc = j * Wl::VALUES - Wl::SHIFT;
            const bool inside = LOADS == kInterior || (row_inside && wc >= -x0 && wc < col_end);
            const T* at = input + (in_at - Wl::SHIFT + wr * g.in_cols + j * Wl::VALUES);
            window[wr][j] = inside ? dwconv::load_vector(reinterpret_cast<const typename Wl::Load*>(at)) : Wl::zero();
        }
    }
    Acc dy[Sh::ITEM_ROWS][Sh::ITEM_COLS];
    load_out_backprop<LOADS, T, Acc, K, S>(out_backprop, g, dy_at, rows, cols, dy);
    accumulate_item<LOADS == kChecked, T, Acc, K, S, RowForm<WINDOW_FORM>::value>(window, dy, row_begin, row_end,
                                                                                 col_begin, col_end, rows, cols, acc);
}

// Lane blocks (window forms kLaneBlocks + pad_left).  Interior items are numbered column fastest
// and lane l takes item i = first + l of each step, so lane l - 1's item is its left-hand
// neighbour unless item i starts a box row, and lane l + 1's its right-hand one unless it ends
// one.  Of each window row a lane loads only its own 4 x S columns, q0 * S on, in one or two 8-
// or 16-byte loads (aligned: in_cols a multiple of the values a load holds), and takes the
// pad_left columns before them from lane l - 1's last pair and the K - S - pad_left after them
// from lane l + 1's first pairs (__shfl_up_sync / __shfl_down_sync of the pair: half types, a
// pair one 4-byte word); a lane whose neighbour is not adjacent (lanes 0 and 31, a box row's
// ends, a run's end) loads those pairs itself.  The pair forms make each lane load its
// neighbours' columns too: a warp's load of a window row's pairs touches 8 or 16 sectors for
// the 2 to 4 that hold new bytes, and L1 serves the rest (the planes kernel's loads: 63-88%
// excess sectors, long-scoreboard stalls 46-58% of all, H100 2026-12-06, full_sections.md).
// The shuffles need every lane of the warp: a warp's lanes run the run's steps together (first
// - lane is the warp's); in the last step a lane past the run's end loads a stand-in item and
// adds nothing.  Both passes run one copy of the item loops (the kernel's ``pass`` loop): two
// copies left ptxas short of registers and spilling at 80.  The window rows are the pair form
// of pad_left's (RowForm), so the products, and the sums' bits, are the pair form's.
// Opt-in (the launcher's PLANES_LANES_BY_DEFAULT) until a GPU times it: per interior item it
// issues fewer loads but more instructions (sm_90, 3x3 stride 1 pad_left 1: 22 loads and 306
// instructions where pairs take 28 and 263; the shuffles and their selects are 24).
template <typename T, int K, int S, int PAD> struct LaneBlock {
    using Sh = Shape<K, S>;
    using Wl = WindowLoads<T, K, S, RowForm<kLaneBlocks + PAD>::value>;
    using Pair = typename Wl::Load;
    static constexpr int OWN_COLS = Sh::ITEM_COLS * S;  // a lane's own columns
    static constexpr int OWN_PAIRS = OWN_COLS / 2;
    static constexpr int LEFT = (PAD + 1) / 2;  // pairs before the own ones: 1 where pad_left > 0
    static constexpr int RIGHT = Wl::LOADS_PER_ROW - LEFT - OWN_PAIRS;  // pairs after them
    static constexpr int REACH = K - S - PAD;  // window columns right of the own ones (<= 0: none)
    static constexpr int BYTES = OWN_COLS * static_cast<int>(sizeof(T));
    static constexpr int VECTOR_BYTES = BYTES < 16 ? BYTES : 16;  // the widest load, 16 bytes
    static constexpr int VECTORS = BYTES / VECTOR_BYTES;
    static constexpr int PAIRS_PER_VECTOR = VECTOR_BYTES / static_cast<int>(sizeof(Pair));
    using Vector = typename dwconv::ChunkOf<VECTOR_BYTES>::type;
    static_assert(sizeof(T) == 2 && PAD >= 0 && PAD <= 2, "half or bfloat16 (a pair: one word); pad_left 0 to 2");
    static_assert(RIGHT >= 0 && RIGHT <= OWN_PAIRS && RIGHT == (REACH > 0 ? (REACH + 1) / 2 : 0),
                  "the right-hand pairs hold the window's columns past the own ones");
};

inline constexpr unsigned kFullWarp = 0xffffffffu;

// A pair (one word of two half values) from the lane one below (UP) or above.
template <bool UP> __device__ __forceinline__ unsigned shuffle_pair(unsigned pair) {
    if constexpr (UP) return __shfl_up_sync(kFullWarp, pair, 1);
    else return __shfl_down_sync(kFullWarp, pair, 1);
}

// Interior item (image n, item row, item column) of a lane-block run (see "Lane blocks"):
// left_adjacent / right_adjacent: lane l - 1 / l + 1 holds the item beside it; active false: a
// lane past its run's end, whose caller passes an interior item to load (its neighbours do not
// take its pairs) and which adds nothing.  Every lane of the warp calls it together.
template <typename T, typename Acc, int K, int S, int PAD>
__device__ __forceinline__ void sum_lane_item(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                              const Planes& g, int k, int c, int n, int row, int col, bool active,
                                              bool left_adjacent, bool right_adjacent, Acc (&acc)[K * K]) {
    using Sh = Shape<K, S>;
    using Lb = LaneBlock<T, K, S, PAD>;
    using Wl = typename Lb::Wl;
    using Pair = typename Lb::Pair;
    const int p0 = row * Sh::ITEM_ROWS, q0 = col * Sh::ITEM_COLS;  // the item's first position
    const int y0 = p0 * S - g.pad_top;
    const int dy_at = ((n * g.out_depth + k) * g.out_rows + p0) * g.out_cols + q0;
    const int own_at = ((n * g.in_depth + c) * g.in_rows + y0) * g.in_cols + q0 * S;  // the own columns

    // Loads first (a row's own columns, and the pairs beside them where a neighbour is not
    // adjacent: otherwise left unset, the shuffle below sets them; then out_backprop), then the
    // shuffles, which wait for the own columns.  (Setting them to zero instead cost 13
    // instructions an item on sm_90.)
    Pair window[Sh::WINDOW_ROWS][Wl::LOADS_PER_ROW];
#pragma unroll
    for (int wr = 0; wr < Sh::WINDOW_ROWS; ++wr) {
        int row_at = own_at + wr * g.in_cols;
#ifdef __CUDA_ARCH__
        // One address for the row's loads: left to itself, the compiler computed the conditional
        // loads' addresses again inside their branches.
        asm("" : "+r"(row_at));
#endif
        const Pair* pairs = reinterpret_cast<const Pair*>(input + row_at);
        const typename Lb::Vector* own = reinterpret_cast<const typename Lb::Vector*>(pairs);
#pragma unroll
        for (int v = 0; v < Lb::VECTORS; ++v) {
            const typename Lb::Vector raw = dwconv::load_vector(own + v);
#pragma unroll
            for (int j = 0; j < Lb::PAIRS_PER_VECTOR; ++j)
                window[wr][Lb::LEFT + v * Lb::PAIRS_PER_VECTOR + j] = reinterpret_cast<const Pair*>(&raw)[j];
        }
        if (Lb::LEFT && !left_adjacent) window[wr][0] = dwconv::load_vector(pairs - 1);
#pragma unroll
        for (int j = 0; j < Lb::RIGHT; ++j)
            if (!right_adjacent) window[wr][Lb::LEFT + Lb::OWN_PAIRS + j] = dwconv::load_vector(pairs + Lb::OWN_PAIRS + j);
    }
    Acc dy[Sh::ITEM_ROWS][Sh::ITEM_COLS];
    load_out_backprop<kInterior, T, Acc, K, S>(out_backprop, g, dy_at, Sh::ITEM_ROWS, Sh::ITEM_COLS, dy);
#pragma unroll
    for (int wr = 0; wr < Sh::WINDOW_ROWS; ++wr) {
        if (Lb::LEFT) {  // window columns -pad_left .. -1: lane l - 1's last pair
            const Pair from = shuffle_pair<true>(window[wr][Lb::LEFT + Lb::OWN_PAIRS - 1]);
            if (left_adjacent) window[wr][0] = from;
        }
#pragma unroll
        for (int j = 0; j < Lb::RIGHT; ++j) {  // lane l + 1's first pairs
            const Pair from = shuffle_pair<false>(window[wr][Lb::LEFT + j]);
            if (right_adjacent) window[wr][Lb::LEFT + Lb::OWN_PAIRS + j] = from;
        }
    }
    if (active)  // no shuffle past here: a divergent branch is allowed
        accumulate_item<false, T, Acc, K, S, RowForm<kLaneBlocks + PAD>::value>(
            window, dy, 0, Sh::WINDOW_ROWS, 0, Sh::WINDOW_COLS, Sh::ITEM_ROWS, Sh::ITEM_COLS, acc);
}

// A thread's interior items: i = first, first + 32, ... below stop, numbered (image, box row,
// box column), column fastest.  Their coordinates advance by a step of 32 items (no division).
template <typename T, typename Acc, int K, int S, int WINDOW_FORM>
__device__ __forceinline__ void sum_interior(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                             const Planes& g, int k, int c, int first, int stop,
                                             Acc (&acc)[K * K]) {
    constexpr bool LANES = WINDOW_FORM >= kLaneBlocks;
    const int box_rows = g.box_row1 - g.box_row0, box_cols = g.box_col1 - g.box_col0;
    // Lane blocks: the warp's lanes run its steps together (see "Lane blocks"); first - lane is
    // the warp's first item.
    const int lane = LANES ? static_cast<int>(threadIdx.x) % kWarpSize : 0;
    if (first - lane >= stop) return;  // also every empty box: no division by zero
    int col = first % box_cols, row = first / box_cols % box_rows;
    int n = first / box_cols / box_rows;
    const int step_cols = kWarpSize % box_cols, step_rows = kWarpSize / box_cols % box_rows;
    const int step_images = kWarpSize / box_cols / box_rows;
    int i = first;
    for (; LANES ? i - lane + kWarpSize <= stop : i < stop; i += kWarpSize) {  // lane blocks: steps every lane's item is in
        if constexpr (LANES) {
            sum_lane_item<T, Acc, K, S, WINDOW_FORM - kLaneBlocks>(input, out_backprop, g, k, c, n, g.box_row0 + row,
                                                                   g.box_col0 + col, true, lane > 0 && col > 0,
                                                                   lane < kWarpSize - 1 && col + 1 < box_cols, acc);
        } else {
            sum_item<kInterior, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, n, g.box_row0 + row, g.box_col0 + col, acc);
        }
        col += step_cols;
        row += step_rows;
        n += step_images;
        if (col >= box_cols) {
            col -= box_cols;
            ++row;
        }
        if (row >= box_rows) {
            row -= box_rows;
            ++n;
        }
    }
    if constexpr (LANES) {
        if (i - lane < stop) {  // the run's last step, which ends before the warp's last lane
            // A lane past the end loads image 0's first interior item instead (and adds nothing).
            const bool active = i < stop;
            sum_lane_item<T, Acc, K, S, WINDOW_FORM - kLaneBlocks>(
                    input, out_backprop, g, k, c, active ? n : 0, g.box_row0 + (active ? row : 0),
                    g.box_col0 + (active ? col : 0), active, active && lane > 0 && col > 0,
                    lane < kWarpSize - 1 && col + 1 < box_cols && i + 1 < stop, acc);
        }
    }
}

// A thread's border items: i = first, first + 32, ... below stop, border_per_image per image, each
// image's numbered by band: the item rows above the box, those below it (all columns), then
// the box's rows left and right of it, row by row.
template <bool CHECKED, typename T, typename Acc, int K, int S, int WINDOW_FORM>
__device__ __forceinline__ void sum_border(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                           const Planes& g, int k, int c, int first, int stop,
                                           Acc (&acc)[K * K]) {
    const int top = g.box_row0 * g.item_cols, bottom = (g.item_rows - g.box_row1) * g.item_cols;
    const int box_cols = g.box_col1 - g.box_col0, sides = g.item_cols - box_cols;
    for (int i = first; i < stop; i += kWarpSize) {
        const int n = i / g.border_per_image;
        int rest = i - n * g.border_per_image, row, col;
        if (rest < top) {
            row = rest / g.item_cols;
            col = rest - row * g.item_cols;
        } else if (rest < top + bottom) {
            rest -= top;
            row = rest / g.item_cols;
            col = rest - row * g.item_cols;
            row += g.box_row1;
        } else {
            rest -= top + bottom;
            row = rest / sides;
            col = rest - row * sides;
            row += g.box_row0;
            col += col < g.box_col0 ? 0 : box_cols;
        }
        sum_item<CHECKED ? kChecked : kZeroFilled, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, n, row, col, acc);
    }
}

}  // namespace dwplanes

// item_rows / item_cols: work items down / across a plane; interior_items (batch x the box) and
// border_items (the others), of which slice z takes [z * interior_per_slice, ...) and
// [z * border_per_slice, ...) (every slice a share of both, so that no warp runs only border
// items); lane_loads: out_backprop rows read 4 values per load (out_cols a multiple of 4, an
// aligned tensor); WINDOW_FORM: a dwplanes::WindowForm (pairs need in_cols even and the input
// aligned to a pair).  partial: [slices][K * K][out_depth] (result: store_sum; tickets: one
// launch for a few slices, a counter per out_backprop channel, taken by its warps).
template <typename T, typename Acc, int K, int S, int WINDOW_FORM>
__global__ void __launch_bounds__(dwplanes::kThreads, (dwplanes::MinBlocks<T, Acc, K, S, WINDOW_FORM>::value)) depthwise_conv2d_native_backprop_filter_planes(
        const T* __restrict__ input, const T* __restrict__ out_backprop, Acc* __restrict__ partial,
        T* __restrict__ result, unsigned* __restrict__ tickets, int in_rows, int in_cols, int in_depth,
        int multiplier, int out_rows, int out_cols, int pad_top, int pad_left, int item_rows, int item_cols,
        int box_row0, int box_row1, int box_col0, int box_col1, int interior_items, int border_items,
        int interior_per_slice, int border_per_slice, int lane_loads) {
    using namespace dwplanes;
    // A warp's lanes' sums, [tap][lane]; 33 words a tap, so that the lanes adding one tap each
    // read 32 banks.
    __shared__ Acc sums[kWarps][K * K][kWarpSize + 1];
    const int lane = static_cast<int>(threadIdx.x) % kWarpSize, warp = static_cast<int>(threadIdx.x) / kWarpSize;
    const int out_depth = in_depth * multiplier;
    const int k = static_cast<int>(blockIdx.x) * kWarps + warp;
    if (k >= out_depth) return;  // the whole warp: it exchanges its sums with __syncwarp only
    const int c = k / multiplier;
    const int slice = static_cast<int>(blockIdx.y);
    const int first_interior = slice * interior_per_slice + lane;
    const int stop_interior = min(interior_items, slice * interior_per_slice + interior_per_slice);
    const int first_border = slice * border_per_slice + lane;
    const int stop_border = min(border_items, slice * border_per_slice + border_per_slice);
    const Planes g{in_rows, in_cols, in_depth, out_rows, out_cols, out_depth, pad_top, pad_left,
                   item_rows, item_cols, box_row0, box_row1, box_col0, box_col1,
                   item_rows * item_cols - (box_row1 - box_row0) * (box_col1 - box_col0), lane_loads != 0};

    Acc acc[K * K];
    if constexpr (WINDOW_FORM >= kLaneBlocks) {
        // Lane blocks shuffle, so their warp sums again together where any lane's sums are not
        // finite; one copy of the item loops for both passes (two left ptxas short of registers
        // in the second one's: spills at 80 a thread).
        for (int pass = 0;; ++pass) {
#pragma unroll
            for (int t = 0; t < K * K; ++t) acc[t] = Acc(0);
            sum_interior<T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_interior, stop_interior, acc);
            if (pass == 0) {
                sum_border<false, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_border, stop_border, acc);
            } else {
                sum_border<true, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_border, stop_border, acc);
            }
            bool finite = true;
#pragma unroll
            for (int t = 0; t < K * K; ++t) finite = finite && acc[t] - acc[t] == Acc(0);  // false for Inf and NaN
            if (pass == 1 || !__any_sync(kFullWarp, !finite)) break;
        }
    } else {
#pragma unroll
        for (int t = 0; t < K * K; ++t) acc[t] = Acc(0);
        sum_interior<T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_interior, stop_interior, acc);
        sum_border<false, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_border, stop_border, acc);
        bool finite = true;
#pragma unroll
        for (int t = 0; t < K * K; ++t) finite = finite && acc[t] - acc[t] == Acc(0);  // false for Inf and NaN
        if (!finite) {
#pragma unroll
            for (int t = 0; t < K * K; ++t) acc[t] = Acc(0);
            sum_interior<T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_interior, stop_interior, acc);
            sum_border<true, T, Acc, K, S, WINDOW_FORM>(input, out_backprop, g, k, c, first_border, stop_border, acc);
        }
    }

#pragma unroll
    for (int t = 0; t < K * K; ++t) sums[warp][t][lane] = acc[t];
    __syncwarp();
    if (lane < K * K) {
        Acc sum = sums[warp][lane][0];
#pragma unroll
        for (int l = 1; l < kWarpSize; ++l) sum += sums[warp][lane][l];
        store_sum(partial, result, (slice * K * K + lane) * out_depth + k, sum);
    }
    if (tickets != nullptr)
        add_few_slices<false, T, Acc>(partial, result, tickets + k, gridDim.y, K * K * out_depth,
                                      static_cast<int>(gridDim.y), K * K, out_depth, k, 1, lane, kWarpSize);
}

// ==================================================================== the tensor-core kernel
//
// depthwise_conv2d_native_backprop_filter_mma (issue 17): NCHW, half types, K x K filters (K = 3
// or 5) at stride 1 and dilation 1, multipliers 1 and 2, out_backprop planes of at most kTile x
// kTile positions, sm_80 and newer.  For channel c and out_backprop slice q (k = c M + q), tap
// row r of the filter gradient is the diagonal of a matrix product:
//   C_r[a][b] = sum over p of xs[p + r][a] * ys[p][b],  dW[r][s] = sum over b of C_r[b + d_s][b],
// where ys is the staged out_backprop plane (row p, column b) and xs the staged input plane,
// input row y at staged row y + pad_top and input column x at staged column x + x_shift.  The
// tap s meets the product of out_backprop column b with input column b + s - pad_left, staged
// column b + d_s, d_s = s - pad_left + x_shift.  x_shift is pad_left rounded up to a multiple of
// 4, so d_s lies in [0, 3 + K - 1] (at most 7), and 4-element chunks of input rows (8-byte loads)
// land on aligned staged columns.
// The products are mma.sync m16n8k16 with the contraction over out_backprop rows: per k-step
// (16 rows p0 ..) and block of 8 out_backprop columns b0 .., A = the 16 staged input columns
// b0 .. b0 + 15 of staged rows p0 + r .. (a transposed ldmatrix: input rows are contiguous in
// columns), B = out_backprop rows p0 .. x columns b0 .. b0 + 7 (transposed too).  Every block
// and k-step adds into the same accumulator C_r (rows a - b0, columns b - b0): the diagonal d_s
// of a block is the same diagonal of every block, and the images of a warp add there as well.
// At the end the warp writes its accumulators to shared memory and lane (q, r, s) adds the 8
// entries of diagonal d_s in column order into partial[slice][r K + s][k]; the _reduce kernel
// sums the slices.  Products of half values are exact in float and the sums are float (the
// mma's f32 accumulation); the order of additions inside an mma is the hardware's, fixed for a
// given GPU, so results are reproducible run to run.
//
// Staging.  The warp zeroes its stage once; per image it writes only the input rows and columns
// TF reads for these outputs (rows [0, out_rows + K - 1 - pad_top), columns [0, out_cols + K - 1
// - pad_left), inside the image; the columns up to the next whole chunk too) and the whole
// out_backprop plane, always to the same places, so the rest stays zero.  Chunks of VEC elements
// (4, 2 or 1: the template's VEC, which divides in_cols and out_cols, pointers aligned to a
// chunk); every load of a batch is issued before its stores, and where an image's chunks take
// one batch of 4-byte chunks or smaller (14 x 14 planes) two images' loads are issued before
// either is stored: one round trip for the pair.  Input columns past TF's window meet only
// out_backprop columns past the output on the diagonals that are read.
//
// Non-finite values.  Zeros of the stage (padding, positions past the output) meet every staged
// value in some accumulator entry, where TF skips those products; an Inf or NaN anywhere in the
// stage so makes some accumulator not finite (and so does a bfloat16 product past float's range).
// A warp whose accumulators are not all finite (a probe of one FMA each, then a warp vote)
// recomputes its partial sums on the CUDA cores from global memory, skipping exactly the taps TF
// skips, as the other kernels do.
//
// Work split: the grid is (in_depth, slice groups); warp w of CTA (c, z) is slice z kWarps + w
// and takes images [slice images_per_slice, + images_per_slice) of channel c, all M slices of
// it.  No shared memory is shared between warps (__syncwarp barriers only).  Offsets are 32-bit:
// the launcher runs this kernel only where every tensor and the partial buffer have fewer than
// 2^31 elements.  The element type T is the accumulator-less half of the usual <T, Acc> pair:
// the tensor cores accumulate in float, the only accumulator they offer.
namespace dwfmma {
inline constexpr int kWarps = 4;                // warps per CTA (128 threads)
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kTile = 32;                // out_backprop rows and columns a plane may have at most
inline constexpr int kPitch = kTile + 8;        // staged columns: block b0 reads [b0, b0 + 16) (80 bytes a
                                                // row: an odd number of 16-byte groups, so the 8 rows of an
                                                // ldmatrix fall on distinct bank groups)
inline constexpr int kStageBatch = 4;           // chunk loads a lane issues per region before its stores
// CTAs per SM the registers must allow (at most 80, 102, 128 or 168 registers a thread): as many
// warps as fit without a spill on any arch with NVRTC 13 and 12 (at 128, 5x5 multiplier 2 with
// the pair loop spilled on sm_80 with NVRTC 12.9; at 64, 3x3 multiplier 1 on sm_100), since the
// warps, not a warp's own loads, hide the stage's latency.  NVRTC 12.9 (the cuda12 extra) on
// Blackwell (sm_100 and sm_120 families) needs 96 for 3x3 multiplier 1: at 80 it kept 48-56
// bytes in local memory, 3-4 accesses per step of 15 mma in the products' loop (SASS,
// 2026-11-29); at 96, sm_100 none and sm_120 8 bytes, one load per image pair, outside it.
// Its 5x5 multiplier-1 spills (4-24 bytes) lie outside the products' loop: kept at 5.
template <int K, int M> struct MinBlocks {
    static constexpr bool NVRTC12_BLACKWELL = GRADOPS_CUDACC_MAJOR < 13 && GRADOPS_ARCH >= 1000;
    static constexpr int value = M == 1 ? (K == 3 ? (NVRTC12_BLACKWELL ? 5 : 6) : 5) : (K == 3 ? 4 : 3);
};

// A lane's part of one staged region of a plane: chunks of VEC elements, per_row of them a
// row; lane l takes column chunk l % per_row of rows l / per_row, + rows_per_step, ... (lanes
// past whole rows idle), the same chunks for every image, so its offsets are set once.
template <typename T> struct Region {
    int src, slots, src_step;  // the first chunk's offset from the plane; chunks; offset step
    T* dst;
    int dst_step;
};

// per_row <= 32 (the launcher checks).
template <typename T> __device__ __forceinline__ Region<T> region(int lane, int vec, int rows, int per_row,
                                                                  int src_pitch, T* dst) {
    Region<T> r{0, 0, 0, dst, 0};
    if (rows <= 0 || per_row <= 0) return r;
    const int rows_per_step = 32 / per_row, row = lane / per_row, col = lane % per_row;
    if (row >= rows_per_step || row >= rows) return r;
    r.src = row * src_pitch + col * vec;
    r.dst = dst + row * kPitch + col * vec;
    r.slots = (rows - row + rows_per_step - 1) / rows_per_step;
    r.src_step = rows_per_step * src_pitch;
    r.dst_step = rows_per_step * kPitch;
    return r;
}

// The slots of a region's lane 0, the most any lane of the warp has (row 0 starts every step):
// a count every lane computes alike, for the branches and loops around the products, which the
// whole warp must take together (ldmatrix and mma.sync are .aligned: a warp split between two
// paths to them is undefined, and an H200 hung on it).  Not a Region field: carried there, the
// 3x3 multiplier-1 2-element-chunk kernel spilled 16 bytes at its 80-register budget (sm_90).
__device__ __forceinline__ int warp_slots(int rows, int per_row) {
    if (rows <= 0 || per_row <= 0) return 0;
    const int rows_per_step = 32 / per_row;
    return (rows + rows_per_step - 1) / rows_per_step;
}

// The first kStageBatch slots of the input region (from x_plane) and of the M out_backprop
// planes (y_plane + q * y_plane_step) into registers, and from there into the stage: an image
// whose regions take one batch (slots <= kStageBatch).
template <int VEC, typename T> using Chunk = typename dwconv::ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;

template <int VEC, int M, typename T>
__device__ __forceinline__ void load_batch(const Region<T>& x, const T* x_plane, const Region<T>& y,
                                           const T* y_plane, int y_plane_step, Chunk<VEC, T> (&raw_x)[kStageBatch],
                                           Chunk<VEC, T> (&raw_y)[M][kStageBatch]) {
    using Raw = Chunk<VEC, T>;
    const Raw* x_src = reinterpret_cast<const Raw*>(x_plane + x.src);
    const Raw* y_src = reinterpret_cast<const Raw*>(y_plane + y.src);
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
        if (b < x.slots) raw_x[b] = dwconv::load_vector(x_src);
#pragma unroll
        for (int q = 0; q < M; ++q)
            if (b < y.slots) raw_y[q][b] = dwconv::load_vector(y_src + q * (y_plane_step / VEC));
        x_src += x.src_step / VEC;
        y_src += y.src_step / VEC;
    }
}

template <int VEC, int M, typename T>
__device__ __forceinline__ void store_batch(const Region<T>& x, const Region<T>& y, int y_stage_step,
                                            const Chunk<VEC, T> (&raw_x)[kStageBatch],
                                            const Chunk<VEC, T> (&raw_y)[M][kStageBatch]) {
    using Raw = Chunk<VEC, T>;
    Raw* x_dst = reinterpret_cast<Raw*>(x.dst);
    Raw* y_dst = reinterpret_cast<Raw*>(y.dst);
#pragma unroll
    for (int b = 0; b < kStageBatch; ++b) {
        if (b < x.slots) *x_dst = raw_x[b];
#pragma unroll
        for (int q = 0; q < M; ++q)
            if (b < y.slots) y_dst[q * (y_stage_step / VEC)] = raw_y[q][b];
        x_dst += x.dst_step / VEC;
        y_dst += y.dst_step / VEC;
    }
}

// The input region (from x_plane) and the M out_backprop planes (y_plane + q * y_plane_step)
// of one image into the stage: kStageBatch slots of every region loaded, then stored.  Steps in
// chunks (Raw), so a slot's address is its region's pointer plus a multiple fixed per slot.
template <int VEC, int M, typename T>
__device__ __forceinline__ void stage_image(const Region<T>& x, const T* x_plane, const Region<T>& y,
                                            const T* y_plane, int y_plane_step, int y_stage_step, int slots) {
    using Raw = typename dwconv::ChunkOf<VEC * static_cast<int>(sizeof(T))>::type;
    const Raw* x_src = reinterpret_cast<const Raw*>(x_plane + x.src);
    const Raw* y_src = reinterpret_cast<const Raw*>(y_plane + y.src);
    Raw* x_dst = reinterpret_cast<Raw*>(x.dst);
    Raw* y_dst = reinterpret_cast<Raw*>(y.dst);
    const int x_step = x.src_step / VEC, y_step = y.src_step / VEC, y_plane_chunks = y_plane_step / VEC;
    const int x_dst_step = x.dst_step / VEC, y_dst_step = y.dst_step / VEC, y_stage_chunks = y_stage_step / VEC;
    // The pointers step slot by slot (no per-slot offsets held across images: registers).
    for (int i = 0; i < slots; i += kStageBatch) {
        Raw raw_x[kStageBatch], raw_y[M][kStageBatch];
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            if (i + b < x.slots) raw_x[b] = dwconv::load_vector(x_src);
#pragma unroll
            for (int q = 0; q < M; ++q)
                if (i + b < y.slots) raw_y[q][b] = dwconv::load_vector(y_src + q * y_plane_chunks);
            x_src += x_step;
            y_src += y_step;
        }
#pragma unroll
        for (int b = 0; b < kStageBatch; ++b) {
            if (i + b < x.slots) *x_dst = raw_x[b];
#pragma unroll
            for (int q = 0; q < M; ++q)
                if (i + b < y.slots) y_dst[q * y_stage_chunks] = raw_y[q][b];
            x_dst += x_dst_step;
            y_dst += y_dst_step;
        }
    }
}
}  // namespace dwfmma

namespace dwfmma {
// One staged image's products, added into acc[q][r] (see the kernel's comment).  PITCH: elements
// a staged row; Y_ELEMENTS: from one out_backprop plane to the next (the _mma_nhwc kernel's
// planes are narrower).
// BLOCKS > 0: exactly that many column blocks, unrolled (the _mma_nhwc kernel's one k-step of a
// compile-time tile: its addresses become constant offsets); else ``blocks``, not unrolled.
template <typename T, int K, int M, int PITCH = kPitch, int Y_ELEMENTS = kTile * kPitch, int BLOCKS = 0>
__device__ __forceinline__ void image_products(const T* xs, const T* ys, float (&acc)[M][K][4], int k_steps,
                                               int blocks, int a_row, int a_col, int b_row) {
    if constexpr (BLOCKS > 0) {
        k_steps = 1;
        blocks = BLOCKS;
    }
    // Not unrolled (but for BLOCKS): the products need no more registers than one block's fragments.
#pragma unroll 1
    for (int step = 0; step < k_steps; ++step)
#pragma unroll (BLOCKS > 0 ? BLOCKS : 1)
        for (int block = 0; block < blocks; ++block) {
            unsigned b[M][2];
#pragma unroll
            for (int q = 0; q < M; ++q)
                ptx::ldmatrix<2, true>(b[q], ys + q * Y_ELEMENTS + (16 * step + b_row) * PITCH + 8 * block);
#pragma unroll
            for (int r = 0; r < K; ++r) {
                unsigned a[4];
                ptx::ldmatrix<4, true>(a, xs + (16 * step + r + a_row) * PITCH + 8 * block + a_col);
#pragma unroll
                for (int q = 0; q < M; ++q) ptx::mma_m16n8k16<T>(acc[q][r], a, b[q], acc[q][r]);
            }
        }
}

// The rows of the stage lane ``lane`` supplies to ldmatrix: row l % 8 of matrix l / 8.  A (x4,
// transposed): matrices (k 0-7, a 0-7), (k 0-7, a 8-15), (k 8-15, a 0-7), (k 8-15, a 8-15) of the
// stage's [row][column]; B (x2, transposed; lanes 16 - 31 repeat 0 - 15): rows k 0 - 15 of 8
// columns.
struct FragmentRows {
    int a_row, a_col, b_row;
};
__device__ __forceinline__ FragmentRows fragment_rows(int lane) {
    const int a_row = lane % 8 + 8 * (lane / 16), a_col = 8 * ((lane / 8) % 2);
    const int b_row = lane % 16;
    return FragmentRows{a_row, a_col, b_row};
}

// Whether every accumulator of the warp is finite: a probe of one FMA each (NaN once any is
// Inf or NaN, else +-0), then a warp vote.
template <int M, int K> __device__ __forceinline__ bool warp_sums_finite(const float (&acc)[M][K][4]) {
    float probe = 0.0f;
#pragma unroll
    for (int q = 0; q < M; ++q)
#pragma unroll
        for (int r = 0; r < K; ++r)
#pragma unroll
            for (int v = 0; v < 4; ++v) probe = fmaf(acc[q][r][v], 0.0f, probe);
    return !__any_sync(0xffffffffu, probe != 0.0f);
}
}  // namespace dwfmma

// VEC: elements per staging chunk (4, 2 or 1; see dwfmma::stage_image; a template parameter:
// three run-time variants in one kernel held about 40 more registers).  partial: [slices][K *
// K][out_depth] floats (result: store_sum; tickets: one launch for a few slices, a counter per
// input channel, taken by its warps).
template <typename T, int K, int M, int VEC>
__global__ void __launch_bounds__(dwfmma::kThreads, dwfmma::MinBlocks<K, M>::value) depthwise_conv2d_native_backprop_filter_mma(
        const T* __restrict__ input, const T* __restrict__ out_backprop, float* __restrict__ partial,
        T* __restrict__ result, unsigned* __restrict__ tickets, int in_rows, int in_cols, int in_depth, int out_rows,
        int out_cols, int pad_top, int pad_left, int batch, int images_per_slice) {
#if GRADOPS_HAS_MMA_SM80
    using namespace dwfmma;
    static_assert(K == 3 || K == 5, "3x3 and 5x5 filters");
    static_assert(M == 1 || M == 2, "multipliers 1 and 2");
    static_assert(VEC == 1 || VEC == 2 || VEC == 4, "chunks of 1, 2 or 4 elements: staged columns shift by 4");
    constexpr int X_ROWS = kTile + K - 1;  // staged input rows: p + r for p < kTile, r < K
    constexpr int X_ELEMENTS = X_ROWS * kPitch, Y_ELEMENTS = kTile * kPitch;
    constexpr int WARP_BYTES = (X_ELEMENTS + M * Y_ELEMENTS) * static_cast<int>(sizeof(T));
    static_assert(WARP_BYTES % 16 == 0 && (kPitch * sizeof(T)) % 16 == 0 && ((kPitch * sizeof(T)) / 16) % 2 == 1,
                  "16-byte rows of stage, an odd number of 16-byte groups apart");
    static_assert(M * K * 16 * 8 * 4 <= WARP_BYTES, "the accumulators fit the warp's stage");
    __shared__ __align__(16) unsigned char stage[kWarps][WARP_BYTES];

    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    const int g = lane / 4, t = lane % 4;
    const int c = static_cast<int>(blockIdx.x);
    const int slice = static_cast<int>(blockIdx.y) * kWarps + warp;
    const int n0 = slice * images_per_slice;
    if (n0 >= batch) return;  // a warp past the last slice (no barrier is shared between warps)
    const int n1 = min(batch, n0 + images_per_slice);
    const int out_depth = in_depth * M;
    T* const xs = reinterpret_cast<T*>(stage[warp]);  // [X_ROWS][kPitch]
    T* const ys = xs + X_ELEMENTS;                     // [M][kTile][kPitch]

    {
        uint4* const chunks = reinterpret_cast<uint4*>(stage[warp]);
        for (int i = lane; i < WARP_BYTES / 16; i += 32) chunks[i] = make_uint4(0, 0, 0, 0);
    }
    __syncwarp();

    // The staged regions (offsets from each image's planes) and the products' extent.
    const int x_shift = (pad_left + 3) & ~3;
    const int x_rows = min(in_rows, out_rows + K - 1 - pad_top);
    const int x_cols = min(in_cols, out_cols + K - 1 - pad_left);
    const int k_steps = (out_rows + 15) / 16, blocks = (out_cols + 7) / 8;
    const int in_plane = in_rows * in_cols, out_plane = out_rows * out_cols;
    const int x_per_row = x_cols > 0 ? (x_cols + VEC - 1) / VEC : 0;
    const Region<T> x = region<T>(lane, VEC, x_rows, x_per_row, in_cols, xs + pad_top * kPitch + x_shift);
    const Region<T> y = region<T>(lane, VEC, out_rows, out_cols / VEC, out_cols, ys);
    // Warp-uniform (not max(x.slots, y.slots), which differs between lanes): it picks the path.
    const int slots = max(warp_slots(x_rows, x_per_row), warp_slots(out_rows, out_cols / VEC));

    float acc[M][K][4];
#pragma unroll
    for (int q = 0; q < M; ++q)
#pragma unroll
        for (int r = 0; r < K; ++r)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[q][r][v] = 0.0f;

    const auto [a_row, a_col, b_row] = fragment_rows(lane);

    const int x_step = in_depth * in_plane, y_step = out_depth * out_plane;  // image to image
    const T* x_plane = input + (n0 * in_depth + c) * in_plane;
    const T* y_plane = out_backprop + (n0 * out_depth + c * M) * out_plane;
    if (VEC * sizeof(T) <= 4 && slots <= kStageBatch) {
        // An image's chunks take one batch: two images' loads are issued before either is
        // stored, one round trip for the pair (4-byte chunks or smaller: registers).
        for (int n = n0; n < n1; n += 2, x_plane += 2 * x_step, y_plane += 2 * y_step) {
            Chunk<VEC, T> raw_x[2][kStageBatch], raw_y[2][M][kStageBatch];
            const bool second = n + 1 < n1;
            load_batch<VEC, M>(x, x_plane, y, y_plane, out_plane, raw_x[0], raw_y[0]);
            if (second) load_batch<VEC, M>(x, x_plane + x_step, y, y_plane + y_step, out_plane, raw_x[1], raw_y[1]);
            store_batch<VEC, M>(x, y, Y_ELEMENTS, raw_x[0], raw_y[0]);
            __syncwarp();
            image_products<T, K, M>(xs, ys, acc, k_steps, blocks, a_row, a_col, b_row);
            __syncwarp();  // every lane is done with this image's stage
            if (second) {
                store_batch<VEC, M>(x, y, Y_ELEMENTS, raw_x[1], raw_y[1]);
                __syncwarp();
                image_products<T, K, M>(xs, ys, acc, k_steps, blocks, a_row, a_col, b_row);
                __syncwarp();
            }
        }
    } else {
        for (int n = n0; n < n1; ++n, x_plane += x_step, y_plane += y_step) {
            stage_image<VEC, M>(x, x_plane, y, y_plane, out_plane, Y_ELEMENTS, slots);
            __syncwarp();
            image_products<T, K, M>(xs, ys, acc, k_steps, blocks, a_row, a_col, b_row);
            __syncwarp();  // every lane is done with this image's stage
        }
    }

    if (warp_sums_finite(acc)) {
        // acc[q][r][v]: entry (row g + 8 (v / 2), column 2 t + v % 2) of C_r for slice q.
        float* const sums = reinterpret_cast<float*>(stage[warp]);  // [M][K][16][8]
#pragma unroll
        for (int q = 0; q < M; ++q)
#pragma unroll
            for (int r = 0; r < K; ++r)
#pragma unroll
                for (int v = 0; v < 4; ++v)
                    sums[((q * K + r) * 16 + g + 8 * (v / 2)) * 8 + 2 * t + v % 2] = acc[q][r][v];
        __syncwarp();
        for (int o = lane; o < M * K * K; o += 32) {
            const int q = o / (K * K), tap = o % (K * K), r = tap / K, s = tap % K;
            const float* const diagonal = sums + ((q * K + r) * 16 + s - pad_left + x_shift) * 8;
            float sum = diagonal[0];
#pragma unroll
            for (int j = 1; j < 8; ++j) sum += diagonal[j * 9];  // entry (j + d_s, j)
            store_sum(partial, result, (slice * K * K + tap) * out_depth + c * M + q, sum);
        }
    } else {
        // The checked sums: TF's taps only, from global memory.
        for (int o = lane; o < M * K * K; o += 32) {
            const int q = o / (K * K), tap = o % (K * K), r = tap / K, s = tap % K;
            float sum = 0.0f;
            for (int n = n0; n < n1; ++n) {
                const T* const x_plane = input + (n * in_depth + c) * in_plane;
                const T* const y_plane = out_backprop + (n * out_depth + c * M + q) * out_plane;
                for (int p = 0; p < out_rows; ++p) {
                    const int row = p + r - pad_top;
                    if (row < 0 || row >= in_rows) continue;
                    for (int col = 0; col < out_cols; ++col) {
                        const int x_col = col + s - pad_left;
                        if (x_col < 0 || x_col >= in_cols) continue;
                        sum += to_acc<float>(x_plane[row * in_cols + x_col]) * to_acc<float>(y_plane[p * out_cols + col]);
                    }
                }
            }
            store_sum(partial, result, (slice * K * K + tap) * out_depth + c * M + q, sum);
        }
    }
    // Not on sm_80 - sm_89 at 3x3, multiplier 1, 2-element chunks: the call cost that
    // instantiation a 4-byte spill at its 80 registers there (NVRTC 13.5 and 12.9), with the
    // helper inlined 8 bytes; the launcher runs the _reduce kernel for it (mma_adds_few_slices).
    constexpr bool FEW_SLICES = !(GRADOPS_ARCH >= 800 && GRADOPS_ARCH < 900 && K == 3 && M == 1 && VEC == 2);
    if (FEW_SLICES && tickets != nullptr) {
        const int slices = (batch + images_per_slice - 1) / images_per_slice;  // warps of channel c
        add_few_slices<false, T, float>(partial, result, tickets + c, static_cast<unsigned>(slices),
                                        K * K * out_depth, slices, K * K, out_depth, c * M, M, lane, 32);
    }
#endif  // GRADOPS_HAS_MMA_SM80
}

// ==================================================================== the NHWC tensor-core kernel
//
// depthwise_conv2d_native_backprop_filter_mma_nhwc: the _mma kernel's products (the diagonals of
// C_r above, dwfmma::image_products) for NHWC half types, K x K filters (K = 3 or 5) at stride 1
// and dilation 1, multipliers 1 and 2, sm_80 and newer.  NHWC keeps a position's channels
// together, so the planes the products read are made by a transpose: a CTA owns 8 CW
// consecutive input channels and a slice of units, a unit being one image's tile of kTile x
// kTile output positions.  CW, the channels a warp owns, is 2 at multiplier 1 and 1 at
// multiplier 2, so that a warp holds two out_backprop planes' sums either way and a position's
// out_backprop values (16 CW M bytes) are one whole 32-byte sector (multiplier 1: 16 channels,
// whose input values are 32 bytes too; multiplier 2: 8 channels, 16 bytes of input).  Per unit
// the CTA stages, for each of its channels, the input plane the tile reads (kTile + K - 1 square
// from input position (p0 - pad_top, q0 - pad_left): staged row y, column x = input row p0 -
// pad_top + y, column q0 - pad_left + x, so tap s lies on diagonal d_s = s) and its M
// out_backprop planes (staged row p, column b = output p0 + p, q0 + b), zeros outside the image
// and past the output.  A thread takes 16-byte chunks (8 channels) of two neighbouring
// positions of a row (every staged row has an even length) and stores the pair's two values of
// each channel as one 4-byte word.  Warp w then adds its channels'
// products into its accumulators.  The next unit's loads are issued before this unit's
// products, so their round trip overlaps the products (registers hold them, no shared buffer).
//
// Maps of at most 8 x 8 (PACKED): a unit holds four images 2 x 2, image (i, j) of the unit at
// staged rows and columns from pack_stride i and pack_stride j, so that its taps lie on the same
// diagonals (its input square starts where its out_backprop tile does, less the padding): a
// 7 x 7 map alone would fill 19% of a unit.  pack_stride S keeps every image's taps off the
// others' values: S >= pad + in_size (the second block's staged rows and columns below S are
// its padding, the first block's from S on lie past its image) and S >= out_size + K - 1 - pad
// (the first block's taps reach the second's staged values only where those are zeros), rows
// and columns alike; the launcher takes the smallest such S with S + out_size <= kTile.
//
// Every unit writes the same staged region, so the rest of every plane (the rows and columns
// past it up to the 16 rows and kPitch columns the products read) stays as zeroed at the start.
// Non-finite values, the warps' checked sums and the partial sums follow the _mma kernel: a warp
// whose accumulators are not all finite recomputes its channels' partial sums on the CUDA cores,
// skipping exactly the taps TF skips; else lane s of tap row r adds diagonal d_s in column
// order.  Offsets are 32-bit (the launcher checks every tensor, the padding's negative offsets
// included, and the partial buffer).
namespace dwfnhwc {
inline constexpr int kWarps = 8;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kTile = 16;             // output rows and columns of a unit: one k-step, two column blocks
inline constexpr int kPitch = 24;            // staged columns (48 bytes: an odd number of 16-byte groups,
                                             // so an ldmatrix's 8 rows fall on distinct bank groups);
                                             // block b0 reads columns [b0, b0 + 16), b0 <= 8
// CTAs per SM the registers must allow: 2 (128 registers; at 3, 5x5 and the packed form spilled
// on sm_80 and sm_90 with NVRTC 13), but 1 for the packed 5x5 multiplier-1 form on sm_80 with
// NVRTC 12.9 (the cuda12 extra), which spilled 16 bytes at 2 (install check, 2026-11-29).
template <int K, int M, bool PACKED> struct MinBlocks {
    static constexpr bool NVRTC12_SM80 = GRADOPS_CUDACC_MAJOR < 13 && GRADOPS_ARCH == 800;
    static constexpr int value = NVRTC12_SM80 && K == 5 && M == 1 && PACKED ? 1 : 2;
};

template <int K, int M> struct Stage {
    static_assert(K == 3 || K == 5, "3x3 and 5x5 filters");
    static_assert(M == 1 || M == 2, "multipliers 1 and 2");
    static constexpr int CW = 2 / M;                       // channels a warp owns
    static constexpr int CHANNELS = kWarps * CW;           // input channels a CTA owns
    static constexpr int X_CHUNKS = CW;                    // 16-byte chunks of a position
    static constexpr int Y_CHUNKS = CW * M;
    static constexpr int X_SIDE = kTile + K - 1;           // staged input rows and columns
    static_assert(X_SIDE <= kPitch && kTile + 8 <= kPitch, "the staged columns and the blocks' reads fit a row");
    static_assert(X_SIDE % 2 == 0 && kTile % 2 == 0, "rows of whole pairs");
    static constexpr int X_PAIRS = X_SIDE * X_SIDE / 2;
    static constexpr int Y_PAIRS = kTile * kTile / 2;
    static constexpr int X_ELEMENTS = (kTile + K - 1) * kPitch;
    static constexpr int Y_ELEMENTS = kTile * kPitch;
    static constexpr int CHANNEL_ELEMENTS = X_ELEMENTS + M * Y_ELEMENTS;  // [x][M y] of one channel
    static constexpr int BYTES = CHANNELS * CHANNEL_ELEMENTS * 2;
    // (pair, chunk) slots a thread loads per unit: of input positions, then of out_backprop ones.
    static constexpr int X_SLOTS = (X_CHUNKS * X_PAIRS + kThreads - 1) / kThreads;
    static constexpr int Y_SLOTS = (Y_CHUNKS * Y_PAIRS + kThreads - 1) / kThreads;
    static_assert(BYTES % 16 == 0 && (kPitch * 2) % 32 == 16, "16-byte plane rows, an odd number of 16-byte groups");
    static_assert(CHANNEL_ELEMENTS % 2 == 0, "4-byte aligned planes");
    static_assert((8 / M) * (CHANNEL_ELEMENTS / 2) % 32 == 0, "chunk 1's planes 8 / M channels, 0 banks, on from chunk 0's");
    static_assert(16 * 8 * 4 <= CHANNEL_ELEMENTS * 2, "one tap row's accumulators fit a channel's planes");
};

// One unit: its first image and output position (p0, q0), the offsets of its staged input
// position 0 and out_backprop position 0 (the CTA's first channels; negative where the input
// tile starts outside).
struct Unit {
    int image, p0, q0, x_at, y_at;
};

// PACKED: where staged row or column ``at`` of a unit lies, block 0 or 1 of the 2 x 2 images at
// stride ``pack_stride`` (0 unpacked).
template <bool PACKED> __device__ __forceinline__ int block_of(int at, int pack_stride) {
    return PACKED && at >= pack_stride ? 1 : 0;
}

// Slot e of a region of SIDE (even) positions a row and CHUNKS (1 or 2) chunks a position,
// chunk fastest (slots 2 p and 2 p + 1 are chunks 0 and 1 of pair p): its chunk, row and first
// column.  Neighbouring lanes thus load the two 16-byte halves of a position's 32-byte sector in
// the same instruction.  Chunk-major slots (every pair's chunk 0, then every chunk 1) gave each
// warp load 32 half-used sectors: the H200 measured 50% excess global sectors and L1/TEX at 80-86%
// of its peak on this kernel (benchmarks/results/gpu_h200_2026-12-04/full_sections.md).  The
// shared stores take 2 wavefronts either way: a chunk's planes lie a multiple of 32 words from the
// other chunk's (Stage's static_assert), so the bank of a slot's store depends on its position
// alone, and 16 pairs (2 or 3 staged rows) fall on distinct banks where 32 did not.
template <int SIDE, int CHUNKS> struct Slot {
    static_assert(CHUNKS == 1 || CHUNKS == 2, "one or two 16-byte chunks a position");
    int chunk, row, col;
    __device__ __forceinline__ Slot(int e) {
        chunk = CHUNKS == 1 ? 0 : e % 2;
        const int pair = CHUNKS == 1 ? e : e / 2;
        row = pair / (SIDE / 2);
        col = 2 * (pair % (SIDE / 2));
    }
};

// A thread's slots of the unit: zeros outside the image, past the output and (PACKED) past the
// batch.  PACKED: staged row / column at of the input square and of the out_backprop tile belongs
// to image block block_of(at) and lies pack_stride x that block before its image's own (each
// position of a pair on its own: a pair may straddle two images).
template <typename T, int K, int M, bool PACKED>
__device__ __forceinline__ void load_unit(const T* __restrict__ input, const T* __restrict__ out_backprop,
                                          const Unit& u, int tid, int in_rows, int in_cols, int in_depth,
                                          int out_rows, int out_cols, int out_depth, int pad_top, int pad_left,
                                          int batch, int pack_stride, uint4 (&raw_x)[Stage<K, M>::X_SLOTS][2],
                                          uint4 (&raw_y)[Stage<K, M>::Y_SLOTS][2]) {
    using St = Stage<K, M>;
#pragma unroll
    for (int i = 0; i < St::X_SLOTS; ++i) {
        const int e = tid + i * kThreads;
        const Slot<St::X_SIDE, St::X_CHUNKS> at(e);
        const bool slot = St::X_CHUNKS * St::X_PAIRS % kThreads == 0 || e < St::X_CHUNKS * St::X_PAIRS;
        const int bi = block_of<PACKED>(at.row, pack_stride), row = at.row - bi * pack_stride;
        const int y = u.p0 - pad_top + row;
        const T* const src = input + u.x_at + (row * in_cols + at.col) * in_depth + 8 * at.chunk;
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            const int bj = block_of<PACKED>(at.col + d, pack_stride), col = at.col + d - bj * pack_stride;
            const int x = u.q0 - pad_left + col, image = 2 * bi + bj;
            raw_x[i][d] = make_uint4(0, 0, 0, 0);
            if (slot && y >= 0 && y < in_rows && x >= 0 && x < in_cols && (!PACKED || u.image + image < batch))
                raw_x[i][d] = dwconv::load_vector(reinterpret_cast<const uint4*>(
                    src + (d + (PACKED ? image * in_rows * in_cols - bj * pack_stride : 0)) * in_depth));
        }
    }
#pragma unroll
    for (int i = 0; i < St::Y_SLOTS; ++i) {
        const int e = tid + i * kThreads;
        const Slot<kTile, St::Y_CHUNKS> at(e);
        const bool slot = St::Y_CHUNKS * St::Y_PAIRS % kThreads == 0 || e < St::Y_CHUNKS * St::Y_PAIRS;
        const int bi = block_of<PACKED>(at.row, pack_stride), p = at.row - bi * pack_stride;
        const T* const src = out_backprop + u.y_at + (p * out_cols + at.col) * out_depth + 8 * at.chunk;
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            const int bj = block_of<PACKED>(at.col + d, pack_stride), q = at.col + d - bj * pack_stride;
            const int image = 2 * bi + bj;
            raw_y[i][d] = make_uint4(0, 0, 0, 0);
            if (slot && u.p0 + p < out_rows && u.q0 + q < out_cols && (!PACKED || u.image + image < batch))
                raw_y[i][d] = dwconv::load_vector(reinterpret_cast<const uint4*>(
                    src + (d + (PACKED ? image * out_rows * out_cols - bj * pack_stride : 0)) * out_depth));
        }
    }
}

// The slots into the planes: value j of input chunk h to channel 8 h + j's input plane; value j
// of out_backprop chunk h (the CTA's output channel k = 8 h + j) to channel k / M's plane k % M.
template <int K, int M>
__device__ __forceinline__ void store_unit(unsigned* stage, int tid, const uint4 (&raw_x)[Stage<K, M>::X_SLOTS][2],
                                           const uint4 (&raw_y)[Stage<K, M>::Y_SLOTS][2]) {
    using St = Stage<K, M>;
    constexpr int CHANNEL_WORDS = St::CHANNEL_ELEMENTS / 2, Y_WORDS = St::Y_ELEMENTS / 2;
#pragma unroll
    for (int i = 0; i < St::X_SLOTS; ++i) {
        const int e = tid + i * kThreads;
        if (St::X_CHUNKS * St::X_PAIRS % kThreads != 0 && e >= St::X_CHUNKS * St::X_PAIRS) break;
        const Slot<St::X_SIDE, St::X_CHUNKS> at(e);
        unsigned* const dst = stage + 8 * at.chunk * CHANNEL_WORDS + (at.row * kPitch + at.col) / 2;
#pragma unroll
        for (int j = 0; j < 8; ++j) dst[j * CHANNEL_WORDS] = dwconv::pair_word(raw_x[i], j);
    }
#pragma unroll
    for (int i = 0; i < St::Y_SLOTS; ++i) {
        const int e = tid + i * kThreads;
        if (St::Y_CHUNKS * St::Y_PAIRS % kThreads != 0 && e >= St::Y_CHUNKS * St::Y_PAIRS) break;
        const Slot<kTile, St::Y_CHUNKS> at(e);
        unsigned* const dst = stage + (St::X_ELEMENTS + at.row * kPitch + at.col) / 2;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = 8 * at.chunk + j;  // the CTA's output channel: channel k / M, slice k % M
            dst[k / M * CHANNEL_WORDS + k % M * Y_WORDS] = dwconv::pair_word(raw_y[i], j);
        }
    }
}
}  // namespace dwfnhwc

// partial: [slices][K * K][out_depth] floats (result: store_sum; tickets: one launch for a few
// slices, a counter per channel block).  Grid (in_depth / Stage::CHANNELS, slices); units
// (image, tile row, tile column), column fastest; slice z takes units [z units_per_slice, +
// units_per_slice).  PACKED (maps of at most 8 x 8; tiles_down =
// tiles_across = 1): unit n holds images 4 n .. 4 n + 3, 2 x 2 at pack_stride rows and columns
// (the launcher's mma_nhwc_pack_stride: no image's taps reach another's values), its taps on the
// same diagonals.
template <typename T, int K, int M, bool PACKED>
__global__ void __launch_bounds__(dwfnhwc::kThreads, (dwfnhwc::MinBlocks<K, M, PACKED>::value)) depthwise_conv2d_native_backprop_filter_mma_nhwc(
        const T* __restrict__ input, const T* __restrict__ out_backprop, float* __restrict__ partial,
        T* __restrict__ result, unsigned* __restrict__ tickets, int in_rows, int in_cols, int in_depth, int out_rows,
        int out_cols, int pad_top, int pad_left, int tiles_down, int tiles_across, int units, int units_per_slice,
        int batch, int pack_stride) {
#if GRADOPS_HAS_MMA_SM80
    using namespace dwfnhwc;
    using St = Stage<K, M>;
    constexpr int CW = St::CW;
    __shared__ __align__(16) unsigned stage[St::BYTES / 4];

    const int tid = static_cast<int>(threadIdx.x);
    const int lane = tid % 32, warp = tid / 32;
    const int c0 = static_cast<int>(blockIdx.x) * St::CHANNELS;
    const int slice = static_cast<int>(blockIdx.y);
    const int out_depth = in_depth * M;
    const int first = slice * units_per_slice, stop = min(units, first + units_per_slice);

    for (int i = tid; i < St::BYTES / 16; i += kThreads) reinterpret_cast<uint4*>(stage)[i] = make_uint4(0, 0, 0, 0);

    constexpr int IMAGES = PACKED ? 4 : 1;  // images a unit holds
    const auto unit_of = [&](int n, int tile_row, int tile_col) {
        const int image = IMAGES * n, p0 = tile_row * kTile, q0 = tile_col * kTile;
        return Unit{image, p0, q0, ((image * in_rows + p0 - pad_top) * in_cols + q0 - pad_left) * in_depth + c0,
                    ((image * out_rows + p0) * out_cols + q0) * out_depth + c0 * M};
    };
    // The next unit to load, advanced by one per unit without a division.
    int n = first / tiles_across / tiles_down, tile_row = first / tiles_across % tiles_down;
    int tile_col = first % tiles_across;
    const auto load_next = [&](uint4 (&raw_x)[St::X_SLOTS][2], uint4 (&raw_y)[St::Y_SLOTS][2]) {
        load_unit<T, K, M, PACKED>(input, out_backprop, unit_of(n, tile_row, tile_col), tid, in_rows, in_cols,
                                   in_depth, out_rows, out_cols, out_depth, pad_top, pad_left, batch, pack_stride,
                                   raw_x, raw_y);
        if (++tile_col == tiles_across) {
            tile_col = 0;
            if (++tile_row == tiles_down) {
                tile_row = 0;
                ++n;
            }
        }
    };

    float acc[CW][M][K][4];  // warp w's channels 2 w, 2 w + 1 (multiplier 1) or w (multiplier 2)
#pragma unroll
    for (int h = 0; h < CW; ++h)
#pragma unroll
        for (int q = 0; q < M; ++q)
#pragma unroll
            for (int r = 0; r < K; ++r)
#pragma unroll
                for (int v = 0; v < 4; ++v) acc[h][q][r][v] = 0.0f;
    const auto [a_row, a_col, b_row] = dwfmma::fragment_rows(lane);
    const T* const planes = reinterpret_cast<const T*>(stage) + warp * CW * St::CHANNEL_ELEMENTS;

    uint4 raw_x[St::X_SLOTS][2], raw_y[St::Y_SLOTS][2];
    if (first < stop) load_next(raw_x, raw_y);
    for (int unit = first; unit < stop; ++unit) {
        __syncthreads();  // every warp is done with the previous unit's planes (and the zeroing)
        store_unit<K, M>(stage, tid, raw_x, raw_y);
        __syncthreads();
        if (unit + 1 < stop) load_next(raw_x, raw_y);  // its round trip overlaps this unit's products
#pragma unroll
        for (int h = 0; h < CW; ++h) {
            const T* const xs = planes + h * St::CHANNEL_ELEMENTS;
            dwfmma::image_products<T, K, M, kPitch, St::Y_ELEMENTS, kTile / 8>(xs, xs + St::X_ELEMENTS, acc[h], 1,
                                                                              kTile / 8, a_row, a_col, b_row);
        }
    }

    bool finite = true;
#pragma unroll
    for (int h = 0; h < CW; ++h) finite = dwfmma::warp_sums_finite(acc[h]) && finite;
    if (finite) {
        // One tap row at a time through the warp's own planes: acc[h][q][r][v] is entry (row g +
        // 8 (v / 2), column 2 t + v % 2) of C_r; lane s < K adds diagonal s.
        float* const sums = reinterpret_cast<float*>(stage) + warp * CW * (St::CHANNEL_ELEMENTS / 2);  // [16][8]
        const int g = lane / 4, t = lane % 4;
        // The sums overwrite the planes that the last unit's ldmatrix read: a warp-collective
        // instruction does not order those reads before another lane's later stores (only
        // __syncwarp does; a racecheck build of the host model found this).
        __syncwarp();
#pragma unroll
        for (int h = 0; h < CW; ++h)
#pragma unroll
            for (int q = 0; q < M; ++q)
#pragma unroll
                for (int r = 0; r < K; ++r) {
#pragma unroll
                    for (int v = 0; v < 4; ++v) sums[(g + 8 * (v / 2)) * 8 + 2 * t + v % 2] = acc[h][q][r][v];
                    __syncwarp();
                    if (lane < K) {
                        float sum = sums[lane * 8];
#pragma unroll
                        for (int j = 1; j < 8; ++j) sum += sums[lane * 8 + j * 9];  // entry (j + s, j)
                        store_sum(partial, result,
                                  (slice * K * K + r * K + lane) * out_depth + (c0 + warp * CW + h) * M + q, sum);
                    }
                    __syncwarp();
                }
    } else {
        // The checked sums: TF's taps only, from global memory.
        for (int o = lane; o < CW * M * K * K; o += 32) {
            const int c = c0 + warp * CW + o / (M * K * K), q = o / (K * K) % M, tap = o % (K * K);
            const int r = tap / K, s = tap % K;
            float sum = 0.0f;
            for (int unit = first; unit < stop; ++unit) {
                const int p0 = unit / tiles_across % tiles_down * kTile, q0 = unit % tiles_across * kTile;
                const int image0 = IMAGES * (unit / tiles_across / tiles_down);
                for (int image = image0; image < min(batch, image0 + IMAGES); ++image) {
                    for (int p = p0; p < min(out_rows, p0 + kTile); ++p) {
                        const int row = p + r - pad_top;
                        if (row < 0 || row >= in_rows) continue;
                        for (int col = q0; col < min(out_cols, q0 + kTile); ++col) {
                            const int in_col = col + s - pad_left;
                            if (in_col < 0 || in_col >= in_cols) continue;
                            sum += to_acc<float>(input[((image * in_rows + row) * in_cols + in_col) * in_depth + c]) *
                                   to_acc<float>(out_backprop[((image * out_rows + p) * out_cols + col) * out_depth +
                                                              c * M + q]);
                        }
                    }
                }
            }
            store_sum(partial, result, (slice * K * K + tap) * out_depth + c * M + q, sum);
        }
    }
    if (tickets != nullptr)
        add_few_slices<true, T, float>(partial, result, tickets + blockIdx.x, gridDim.y, K * K * out_depth,
                                       static_cast<int>(gridDim.y), K * K, out_depth, c0 * M, St::CHANNELS * M, tid,
                                       kThreads);
#endif  // GRADOPS_HAS_MMA_SM80
}

// filter_grad[e] = the slices' partial sums partial[z * elements + e], added in a fixed order
// and rounded once to T.  A CTA: kReduceElements consecutive e (a warp reads one slice's run of
// them: coalesced) x ``groups`` groups of slices (blockDim.x / kReduceElements, at most
// kReduceMaxGroups); group g adds slices g, g + groups, ... in ascending order, then group 0
// adds the groups' sums in group order.  The launcher picks ``groups`` from the slice count
// alone (REDUCE_LOADS slices a group at most, where 32 groups allow), so neither order depends
// on the GPU.  Why groups scale with the slices: the grid is only taps x out_depth / 32 CTAs
// (9 for a 3x3 filter on 32 channels), so a thread's chain of dependent load batches is the
// kernel's time; on the H200 (2026-11-28) 8 fixed groups took 9.4 us over 369 slices (46 loads
// a thread, 3 batches of 16) against 2.3-2.6 us where a thread had one batch.
// Why the loads go in explicit batches: a loop over the slices, however unrolled, compiles to a
// load, its add and the loop's exit test per slice (the trip count and the stride are run-time
// values), so each slice was a round trip of its own: 6-9 us a call on the H200 (2026-12-04), a
// fifth of the op's kernel time, where the first kernel took 10-100 us.  A batch issues all its
// (predicated) loads, then adds them in slice order: the same sum, one round trip a batch.
inline constexpr int kReduceElements = 32;
inline constexpr int kReduceMaxGroups = 32;
inline constexpr int kReduceGroupBatch = 8;  // groups' sums group 0 reads from shared memory at once

template <typename T, typename Acc>
__global__ void __launch_bounds__(kReduceElements * kReduceMaxGroups) depthwise_conv2d_native_backprop_filter_reduce(
        const Acc* __restrict__ partial, T* __restrict__ filter_grad, long long elements, long long slices) {
    __shared__ Acc sums[kReduceMaxGroups][kReduceElements];
    const int groups = static_cast<int>(blockDim.x) / kReduceElements;
    const int lane = static_cast<int>(threadIdx.x) % kReduceElements;
    const int group = static_cast<int>(threadIdx.x) / kReduceElements;
    const index_t e = static_cast<index_t>(blockIdx.x) * kReduceElements + lane;
    Acc acc = Acc(0);
    if (e < elements) {
        // This group's slices: group, group + groups, ...  A batch's predicates compare a small
        // count (a 32-bit division: a 64-bit one calls a slow path), and its addresses step by one
        // stride, so that no 64-bit slice index or address outlives its load: 16 of each overran
        // the 64 registers of 1024 threads on sm_120 under NVRTC 12.9 (40 B of spills).
        const index_t stride = static_cast<index_t>(groups) * elements;
        index_t left = slices - group;  // from the batch's first slice to the end
        for (index_t offset = group * elements + e; left > 0;
             left -= kReduceBatch * groups, offset += kReduceBatch * stride) {
            const int reach = left < kReduceBatch * groups ? static_cast<int>(left) : kReduceBatch * groups;
            const int count = (reach + groups - 1) / groups;  // the batch's slices, kReduceBatch at most
            Acc batch[kReduceBatch];
#pragma unroll
            for (index_t i = 0, at = offset; i < kReduceBatch; ++i, at += stride)
                batch[i] = i < count ? partial[at] : Acc(0);
            // The fence keeps the batch's loads ahead of its adds: where ptxas aims at 32
            // registers (2048 threads an SM: sm_80, sm_90, sm_100) it interleaved them, two to
            // seven round trips a batch, where with it the batch is one (the SASS test).
            __threadfence_block();
            // Added only where loaded: a masked zero would turn a -0 sum into +0.
#pragma unroll
            for (int i = 0; i < kReduceBatch; ++i)
                if (i < count) acc += batch[i];
        }
    }
    sums[group][lane] = acc;
    __syncthreads();
    if (group == 0 && e < elements) {
        Acc sum = sums[0][lane];
        for (int g0 = 1; g0 < groups; g0 += kReduceGroupBatch) {
            Acc batch[kReduceGroupBatch];
#pragma unroll
            for (int i = 0; i < kReduceGroupBatch; ++i) batch[i] = g0 + i < groups ? sums[g0 + i][lane] : Acc(0);
#pragma unroll
            for (int i = 0; i < kReduceGroupBatch; ++i)
                if (g0 + i < groups) sum += batch[i];
        }
        filter_grad[e] = from_acc<T, Acc>(sum);
    }
}

}  // namespace gradops
