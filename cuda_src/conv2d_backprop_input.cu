// Conv2DBackpropInput: input_grad[n][h][w][c] = sum over taps (r, s) and the group's out
// channels k of filter[r][s][c - g * Cg][k] * out_backprop[n][p][q][k], where the tap reads
// input row h from output row p = (h + pad_top - r * dilation_rows) / stride_rows when that
// division is exact and 0 <= p < out_rows (columns alike); g = c / Cg, Cg = filter_in_depth.
//
// Four kernels; the launcher (gradops/backends/cuda/conv2d_backprop_input.py) picks one: its
// direct path runs _direct or _few_channels, its tiled path _igemm or _1x1_igemm.
// * conv2d_backprop_input_direct: any layout and size, one thread per input element gathering
//   its taps (deterministic: no scatter, no atomics).
// * conv2d_backprop_input_igemm: NHWC implicit GEMM per (group, stride phase).  Input rows with
//   the same h mod stride_rows are reached by the same filter rows (those with
//   r * dilation_rows = h + pad_top mod stride_rows), so each phase is a dense GEMM over exactly
//   the taps that contribute: no work on the zeros a naive transposed convolution multiplies.
//   M = batch x the phase's input positions, N = Cg, reduction over (phase taps, out channels).
// * conv2d_backprop_input_few_channels: NHWC, one group, at most 4 input channels (the
//   stem), where a GEMM tile would be mostly padding: one thread per input position.
// * conv2d_backprop_input_1x1_igemm: a 1x1 filter at stride 1 without padding (most ResNet
//   layers), where input position m reads out_backprop row m only: the plain GEMM
//   input_grad[m][c] = sum over k of out_backprop[m][k] * filter[c][k] per group, with no
//   decomposition of positions or taps in the prologue, the main loop or the epilogue.
#include "igemm_tiles.cuh"

namespace gradops {

template <typename T, typename Acc, int L>
__global__ void conv2d_backprop_input_direct(const T* __restrict__ filter, const T* __restrict__ out_backprop,
                                             T* __restrict__ input_grad, GRADOPS_CONV_DIMS_PARAMS) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    const Tensor4<L> in{d.in_rows, d.in_cols, d.in_depth};
    const Tensor4<L> out{d.out_rows, d.out_cols, d.out_depth};
    const index_t out_per_group = d.out_per_group();
    const index_t total = d.batch * d.in_rows * d.in_cols * d.in_depth;
    GRADOPS_GRID_STRIDE_LOOP(i, total) {
        index_t n, h, w, c;
        in.coords(i, n, h, w, c);
        const index_t group = c / d.filter_in_depth, cg = c % d.filter_in_depth;
        const index_t k0 = group * out_per_group;
        Acc acc = Acc(0);
        for (index_t r = 0; r < d.filter_rows; ++r) {
            const index_t ph = h + d.pad_top - r * d.dilation_rows;  // p * stride_rows when tap r hits h
            if (ph < 0) break;                                       // decreases with r
            if (ph % d.stride_rows) continue;
            const index_t p = ph / d.stride_rows;
            if (p >= d.out_rows) continue;
            for (index_t s = 0; s < d.filter_cols; ++s) {
                const index_t qw = w + d.pad_left - s * d.dilation_cols;
                if (qw < 0) break;
                if (qw % d.stride_cols) continue;
                const index_t q = qw / d.stride_cols;
                if (q >= d.out_cols) continue;
                const T* f = filter + ((r * d.filter_cols + s) * d.filter_in_depth + cg) * d.out_depth;
                for (index_t k = k0; k < k0 + out_per_group; ++k)
                    acc += to_acc<Acc>(f[k]) * to_acc<Acc>(out_backprop[out.offset(n, p, q, k)]);
            }
        }
        input_grad[i] = from_acc<T, Acc>(acc);
    }
}

// The filter taps of one dimension that reach input positions with a given phase
// (position mod stride): r = first + i * step for i < count.
// 32-bit: the launcher checks that strides, pads and filter sizes fit (cursor_extents), and
// the dilation enters only modulo the stride.
struct PhaseTaps {
    int first, step, count;
    PhaseTaps() = default;  // trivial: InputGradProblem is a __shared__ variable's member (igemm::Loader)
    __device__ __forceinline__ PhaseTaps(int first_, int step_, int count_) : first(first_), step(step_), count(count_) {}
    __device__ __forceinline__ PhaseTaps(int phase, int pad, int stride, int dilation_mod_stride, int filter_size) {
        // r * dilation = phase + pad (mod stride) has solutions r = first (mod stride / gcd).
        int a = stride, b = dilation_mod_stride;
        while (b) { const int t = a % b; a = b; b = t; }
        step = stride / a;
        const int target = (phase + pad) % stride;
        first = 0;
        count = 0;  // no tap reaches this phase unless a solution is found below
        int residue = 0;  // r * dilation mod stride
        for (int r = 0; r < step; ++r) {
            if (residue == target) {
                first = r;
                count = r < filter_size ? (filter_size - r + step - 1) / step : 0;
                break;
            }
            residue += dilation_mod_stride;
            if (residue >= stride) residue -= stride;
        }
    }
};

// The launcher's plan of the grid (gradops/backends/cuda/conv2d_backprop_input.py:
// phase_plans), in int words: a header, then one entry per stride phase.  Computed once per
// geometry on the host (and cached on the device), it holds what every thread's prologue would
// otherwise derive with integer divisions (64-bit ones among them), a gcd loop and FastDiv
// constructions.  A FastDiv is three words: magic, shift, divisor.  Both records are whole
// 16-byte words (int4 loads).
namespace phase_plan {
enum Header { SPLITS = 0, PHASES = 3, OUT_PER_GROUP = 6, HEADER_WORDS = 12 };
enum Entry {
    M_SIZE = 0,      // batch x the phase's input positions (rows x cols)
    REDUCTION = 1,   // taps_r.count x taps_s.count x out_per_group
    PHASE_ROW = 2,
    PHASE_COL = 3,
    P_OFFSET = 4,    // the out_backprop row of position i's first tap, minus i (q alike)
    Q_OFFSET = 5,
    P_STEP = 6,      // out_backprop rows between consecutive taps of the phase (q alike)
    Q_STEP = 7,
    TAPS_R_FIRST = 8,
    TAPS_R_STEP = 9,
    TAPS_S_FIRST = 10,
    TAPS_S_STEP = 11,
    DIV_J = 12,      // FastDiv by the phase's input columns
    DIV_I = 15,      // ... by its input rows
    DIV_TAPS_S = 18, // ... by its column tap count (1 when no tap reaches it)
    ENTRY_WORDS = 24
};
static_assert(HEADER_WORDS % 4 == 0 && ENTRY_WORDS % 4 == 0, "records of whole int4 words");
// N words from src (16-byte aligned).
template <int N> __device__ __forceinline__ void load(const int* __restrict__ src, int (&w)[N]) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
        const int4 v = reinterpret_cast<const int4*>(src)[i];
        w[4 * i] = v.x;
        w[4 * i + 1] = v.y;
        w[4 * i + 2] = v.z;
        w[4 * i + 3] = v.w;
    }
}
__device__ __forceinline__ FastDiv fast_div(const int* w) {
    return FastDiv(static_cast<unsigned>(w[0]), w[1], w[2]);
}
}  // namespace phase_plan

// The implicit GEMM of one (group, row phase, col phase), NHWC.  m = (n, i, j) is input
// position (phase_row + i * stride_rows, phase_col + j * stride_cols); the reduction index is
// (tap row index, tap col index, out channel k) with k fastest.
template <typename T, typename Acc, bool SPLIT> struct InputGradProblem {
    // out_backprop and the filter are both contiguous along out channels (the reduction).
    static constexpr bool A_K_CONTIG = true;
    static constexpr bool B_K_CONTIG = true;

    int m_size, n_size, k_begin, k_end;
    const T* __restrict__ filter;
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc, SPLIT> dst;  // the input gradient (NHWC), or this split's slice of the scratch
    ConvDims d;
    const int* __restrict__ entry;  // the phase's plan entry (phase_plan)
    FastDiv div_kg, div_taps_s, div_j, div_i;
    int phase_row, phase_col;
    PhaseTaps taps_r, taps_s;  // taps_r.count unused (in the plan's reduction)
    int p_offset, q_offset;    // see a_row
    int p_step, q_step;  // out_backprop rows (columns) between consecutive taps of the phase
    // 32-bit sizes (the launcher checks that an image of out_backprop and the filter fit).
    int out_rows, out_cols, out_depth, out_per_group, filter_cols, tap_elements;  // Cg * out_depth
    index_t out_image;  // out_rows * out_cols * out_depth
    index_t in_channel0, out_channel0;

    // The reduction cursor: kk = (ri * taps_s.count + si) * out_per_group + k, the phase's taps
    // r = taps_r.first + ri * taps_r.step (likewise s) and out channel k within the group.
    struct KPos {
        int ri, si, c;  // c: the out channel
    };
    __device__ __forceinline__ KPos k_pos(int kk) const {
        int c, si;
        const int ri = div_taps_s.divmod(div_kg.divmod(kk, c), si);
        return {ri, si, c};
    }
    __device__ __forceinline__ void k_advance(KPos& pos, const KPos& step) const {
        pos.c += step.c;
        pos.si += step.si;
        pos.ri += step.ri;
        if (pos.c >= out_per_group) { pos.c -= out_per_group; ++pos.si; }
        if (pos.si >= taps_s.count) { pos.si -= taps_s.count; ++pos.ri; }
    }

    // Row cursor of A: input position m = (n, i, j) as the out_backprop row and column its
    // phase's first taps read, p0 = (phase_row + i * stride_rows + pad_top - taps_r.first *
    // dilation_rows) / stride_rows = i + p_offset (exact: the phase's taps make the numerator
    // a multiple of the stride; the plan holds p_offset), and likewise q0.  Tap index ri then
    // reads row p0 - ri * p_step, p_step = taps_r.step * dilation_rows / stride_rows (exact:
    // step * dilation is a multiple of the stride), so neither the prologue nor the main loop
    // divides by a stride.
    struct ARow {  // 32-bit: the launcher checks the padded extents (_conv_igemm.cursor_extents)
        const T* image;  // out_backprop's image n, at the group's first channel
        int p0, q0;
    };
    using BRow = igemm::ChannelRow;  // input channel c (within the group)
    __device__ __forceinline__ ARow a_row(int m) const {
        int i, j;
        const int n = div_i.divmod(div_j.divmod(m, j), i);
        return {out_backprop + n * out_image + out_channel0, i + p_offset, j + q_offset};
    }
    // B's row part: input channel c's filter row at the group's first out channel.
    __device__ __forceinline__ BRow b_row(int c) const {
        return {c * out_depth + static_cast<int>(out_channel0)};
    }

    // Chunks run along out channels k (the reduction's fastest part) in both operands.
    __device__ __forceinline__ igemm::Src<T> a_src(const ARow& row, const KPos& kk, int) const {
        const int p = row.p0 - kk.ri * p_step;
        const int q = row.q0 - kk.si * q_step;
        return {row.image + ((p * out_cols + q) * out_depth + kk.c), p >= 0 && p < out_rows && q >= 0 && q < out_cols};
    }
    __device__ __forceinline__ igemm::Src<T> b_src(const BRow& row, const KPos& kk, int) const {
        const int r = taps_r.first + kk.ri * taps_r.step;
        const int s = taps_s.first + kk.si * taps_s.step;
        return {filter + ((r * filter_cols + s) * tap_elements + row.offset + kk.c), true};
    }
    __device__ __forceinline__ const T* a_base() const { return out_backprop; }
    __device__ __forceinline__ const T* b_base() const { return filter; }

    // The scalar path's k table (igemm::HasKTable): what reduction index kk = (ri, si, c)
    // contributes, so that an element costs two subtractions, two unsigned compares and one
    // wide multiply-add instead of kk's decomposition.  32-bit: the launcher keeps (padded rows
    // x out_cols + padded columns) x out_depth below 2^31 (tiled_eligible), which bounds every
    // offset between a row cursor's origin and an element.
    static constexpr bool K_TABLE = true;
    struct alignas(16) KEntry {  // one 16-byte shared-memory read
        int dp, dq;    // ri * p_step, si * q_step: out_backprop rows (columns) back from p0 (q0)
        int a_offset;  // c - (dp * out_cols + dq) * out_depth: from A's row pointer (p0, q0)
        int b_offset;  // (r * filter_cols + s) * tap_elements + c: from B's row pointer
    };
    // Past k_end, dp = p_offset - out_rows puts every row's p = p0 - dp at p0 - p_offset +
    // out_rows, in [out_rows, out_rows + the last i] (p0 = i + p_offset: see ARow), which the
    // unsigned row test refuses without wrapping (both terms are below 2^31).
    __device__ __forceinline__ KEntry k_entry(const KPos& k, bool in_reduction) const {
        const int dp = k.ri * p_step, dq = k.si * q_step;
        const int r = taps_r.first + k.ri * taps_r.step, s = taps_s.first + k.si * taps_s.step;
        return {in_reduction ? dp : static_cast<int>(static_cast<unsigned>(p_offset) - out_rows), dq,
                k.c - (dp * out_cols + dq) * out_depth, (r * filter_cols + s) * tap_elements + k.c};
    }
    // The table path's row cursors: pointers to A's element (p0, q0) (a position the taps may
    // not reach: the pointer is formed, and only the elements inside are read) and to B's row,
    // opaque (opaque_value(), gradops_common.cuh) so that each element's address is one wide
    // multiply-add.
    struct TableARow {
        const T* origin;  // out_backprop's image n at (p0, q0), the group's first channel
        int p0, q0;
    };
    struct TableBRow {
        const T* row;  // the filter at input channel c's row, the group's first out channel
    };
    __device__ __forceinline__ TableARow table_a_row(int m) const {
        const ARow a = a_row(m);
        return {opaque_value(a.image + (a.p0 * out_cols + a.q0) * out_depth), a.p0, a.q0};
    }
    __device__ __forceinline__ TableBRow table_b_row(int c) const {
        return {opaque_value(filter + b_row(c).offset)};
    }
    __device__ __forceinline__ igemm::Src<T> a_entry_src(const TableARow& row, const KEntry& e) const {
        return {row.origin + e.a_offset,
                static_cast<unsigned>(row.p0) - static_cast<unsigned>(e.dp) < static_cast<unsigned>(out_rows) &&
                    static_cast<unsigned>(row.q0) - static_cast<unsigned>(e.dq) < static_cast<unsigned>(out_cols)};
    }
    __device__ __forceinline__ igemm::Src<T> b_entry_src(const TableBRow& row, const KEntry& e) const {
        return {row.row + e.b_offset, true};
    }

    // Offset of the input-gradient element (position m, the group's first channel).  The
    // tensor-core epilogue's row table (out_row, once per CTA after the main loop) reloads its
    // divisors from the plan at an offset opaque to the optimiser, so that the prologue's are
    // not kept in registers across the main loop; the SIMT epilogue (store, per element)
    // uses the prologue's.
    __device__ __forceinline__ index_t out_row_by(int m, const FastDiv& by_i, const FastDiv& by_j) const {
        int i, j;
        const int n = by_i.divmod(by_j.divmod(m, j), i);
        const index_t h = phase_row + static_cast<index_t>(i) * d.stride_rows;
        const index_t w = phase_col + static_cast<index_t>(j) * d.stride_cols;
        return ((n * d.in_rows + h) * d.in_cols + w) * d.in_depth + in_channel0;
    }
    __device__ __forceinline__ index_t out_row(int m) const {
        int w[phase_plan::ENTRY_WORDS];
        phase_plan::load(entry + opaque_value(0), w);
        return out_row_by(m, phase_plan::fast_div(w + phase_plan::DIV_I), phase_plan::fast_div(w + phase_plan::DIV_J));
    }
    __device__ __forceinline__ void store_at(index_t row, int c, Acc v) const { dst.at(row + c, v); }
    __device__ __forceinline__ void store_chunk(index_t row, int c, const float (&v)[8]) const { dst.chunk(row + c, v); }
    __device__ __forceinline__ void store(int m, int c, Acc v) const { store_at(out_row_by(m, div_i, div_j), c, v); }
};

// grid: (ceil(batch * ceil(in_rows / stride_rows) * ceil(in_cols / stride_cols) / BM),
//        ceil(Cg / BN), groups * stride_rows * stride_cols * splits).
// Every input element belongs to exactly one phase and is written once (zero when no tap reaches
// it).  Split z % splits covers reduction indices [split * split_size, (split + 1) * split_size)
// of its phase's GEMM; with splits > 1 it writes its sums to partial[split][input element]
// (NHWC; zero where its range holds none of the phase's taps) and split_reduce adds them.
// plan: the launcher's phase_plan (header, then an entry per phase; 16-byte aligned); the
// split count is its header's (splits stays in the argument list the 1x1 kernel shares).
// VECTOR: 16-byte loads (out_per_group a multiple of 16 / sizeof(T), pointers 16-byte aligned).
// SPLIT: whether the launcher splits the reduction (splits > 1); an unsplit instantiation has
// no scratch path in its epilogue.
template <typename T, typename Acc, int Kind, bool VECTOR, bool SPLIT, int TILE_M = 128, int TILE_N = 128>
__global__ void __launch_bounds__(igemm::Threads<T, Kind, TILE_M, TILE_N>::value,
                                  igemm::MinBlocks<T, Kind, igemm::DGRAD, VECTOR, SPLIT, TILE_M, TILE_N>::value)
conv2d_backprop_input_igemm(const T* __restrict__ filter, const T* __restrict__ out_backprop,
                            T* __restrict__ input_grad, Acc* __restrict__ partial, const int* __restrict__ plan,
                            GRADOPS_CONV_DIMS_PARAMS, long long splits, long long split_size) {
    using namespace phase_plan;
    InputGradProblem<T, Acc, SPLIT> prob{};
    prob.d = GRADOPS_CONV_DIMS;
    const ConvDims& d = prob.d;
    // z = (group x phases + phase) x splits + split, below 65536.
    int header[HEADER_WORDS];
    load(plan, header);
    int split = 0, phase;
    const int group_phase = SPLIT ? fast_div(header + SPLITS).divmod(static_cast<int>(blockIdx.z), split)
                                  : static_cast<int>(blockIdx.z);
    const int group = fast_div(header + PHASES).divmod(group_phase, phase);
    prob.entry = plan + HEADER_WORDS + ENTRY_WORDS * phase;
    int w[ENTRY_WORDS];
    load(prob.entry, w);
    prob.m_size = w[M_SIZE];
    if (static_cast<index_t>(blockIdx.x) * igemm::Tile<T, Kind, TILE_M, TILE_N>::BM >= prob.m_size) return;  // whole CTA

    prob.phase_row = w[PHASE_ROW];
    prob.phase_col = w[PHASE_COL];
    prob.p_offset = w[P_OFFSET];
    prob.q_offset = w[Q_OFFSET];
    prob.p_step = w[P_STEP];
    prob.q_step = w[Q_STEP];
    prob.div_j = fast_div(w + DIV_J);
    prob.div_i = fast_div(w + DIV_I);
    prob.div_taps_s = fast_div(w + DIV_TAPS_S);
    prob.div_kg = fast_div(header + OUT_PER_GROUP);
    prob.taps_r = PhaseTaps(w[TAPS_R_FIRST], w[TAPS_R_STEP], 0);
    prob.taps_s = PhaseTaps(w[TAPS_S_FIRST], w[TAPS_S_STEP], prob.div_taps_s.divisor);
    // 32-bit sizes (the launcher checks that an image of out_backprop and the filter fit).
    prob.out_rows = static_cast<int>(d.out_rows);
    prob.out_cols = static_cast<int>(d.out_cols);
    prob.out_depth = static_cast<int>(d.out_depth);
    prob.filter_cols = static_cast<int>(d.filter_cols);
    prob.out_image = d.out_rows * d.out_cols * d.out_depth;
    prob.out_per_group = prob.div_kg.divisor;
    prob.tap_elements = static_cast<int>(d.filter_in_depth * d.out_depth);
    prob.n_size = static_cast<int>(d.filter_in_depth);
    prob.k_begin = split * static_cast<int>(split_size);
    prob.k_end = min(w[REDUCTION], prob.k_begin + static_cast<int>(split_size));
    prob.filter = filter;
    prob.out_backprop = out_backprop;
    prob.dst = {input_grad, SPLIT ? partial + split * d.batch * d.in_rows * d.in_cols * d.in_depth : nullptr};
    prob.in_channel0 = group * d.filter_in_depth;
    prob.out_channel0 = group * static_cast<index_t>(prob.out_per_group);
    igemm::run_cta<T, Acc, Kind, VECTOR, TILE_M, TILE_N>(prob);
}

// The GEMM of conv2d_backprop_input_1x1_igemm (NHWC, one group): rows of out_backprop and of
// the filter's [in channel][out channel] matrix are both contiguous along the reduction.
template <typename T, typename Acc, bool SPLIT> struct PointwiseInputGradProblem {
    static constexpr bool A_K_CONTIG = true;
    static constexpr bool B_K_CONTIG = true;

    int m_size, n_size, k_begin, k_end;
    const T* __restrict__ filter;
    const T* __restrict__ out_backprop;
    igemm::SplitStore<T, Acc, SPLIT> dst;  // the input gradient (NHWC), or this split's slice of the scratch
    // 32-bit channel counts and channel indices (4 registers, not 8: the split instantiations
    // fit 128 registers without a spill); row offsets are 64-bit products.
    int out_depth, in_depth, in_channel0, out_channel0;

    struct ARow {
        const T* row;  // out_backprop's row m at the group's first out channel
    };
    using BRow = igemm::ChannelRow;  // filter row of input channel c, at the group's first out channel
    using KPos = int;                // the out channel within the group
    __device__ __forceinline__ ARow a_row(int m) const {
        return {out_backprop + static_cast<index_t>(m) * out_depth + out_channel0};
    }
    __device__ __forceinline__ BRow b_row(int c) const { return {c * out_depth + out_channel0}; }
    __device__ __forceinline__ KPos k_pos(int k) const { return k; }
    __device__ __forceinline__ void k_advance(KPos& k, const KPos& step) const { k += step; }
    __device__ __forceinline__ igemm::Src<T> a_src(const ARow& row, const KPos& k, int) const { return {row.row + k, true}; }
    __device__ __forceinline__ igemm::Src<T> b_src(const BRow& row, const KPos& k, int) const {
        return {filter + (row.offset + k), true};
    }
    __device__ __forceinline__ const T* a_base() const { return out_backprop; }
    __device__ __forceinline__ const T* b_base() const { return filter; }
    __device__ __forceinline__ index_t out_row(int m) const { return static_cast<index_t>(m) * in_depth + in_channel0; }
    __device__ __forceinline__ void store_at(index_t row, int c, Acc v) const { dst.at(row + c, v); }
    __device__ __forceinline__ void store_chunk(index_t row, int c, const float (&v)[8]) const { dst.chunk(row + c, v); }
    __device__ __forceinline__ void store(int m, int c, Acc v) const { store_at(out_row(m), c, v); }
};

// grid: (ceil(batch * in_rows * in_cols / BM), ceil(Cg / BN), groups * splits); the launcher
// takes it for filter_rows == filter_cols == 1, strides 1 and no padding (out_backprop's
// positions are the input's).  Splits, VECTOR and SPLIT as for conv2d_backprop_input_igemm;
// split_magic, split_shift: FastDiv constants of splits (_runtime.division_magic).
template <typename T, typename Acc, int Kind, bool VECTOR, bool SPLIT, int TILE_M = 128, int TILE_N = 128>
__global__ void __launch_bounds__(igemm::Threads<T, Kind, TILE_M, TILE_N>::value, igemm::MinBlocks<T, Kind, igemm::DGRAD_1X1, VECTOR, false, TILE_M, TILE_N>::value)
conv2d_backprop_input_1x1_igemm(const T* __restrict__ filter, const T* __restrict__ out_backprop,
                                T* __restrict__ input_grad, Acc* __restrict__ partial, GRADOPS_CONV_DIMS_PARAMS,
                                long long splits, long long split_size, unsigned split_magic, int split_shift) {
    const ConvDims d = GRADOPS_CONV_DIMS;
    // z = group x splits + split (below 65536), split by the host's FastDiv constants: the
    // split index and its scratch slice stay in uniform registers (a vector division made the
    // slice offset a vector value that the split instantiation spilled across the main loop).
    int split = 0;
    const index_t group = SPLIT ? FastDiv(split_magic, split_shift, static_cast<int>(splits))
                                      .divmod(static_cast<int>(blockIdx.z), split)
                                : static_cast<int>(blockIdx.z);
    PointwiseInputGradProblem<T, Acc, SPLIT> prob;
    prob.m_size = static_cast<int>(d.batch * d.in_rows * d.in_cols);
    prob.n_size = static_cast<int>(d.filter_in_depth);
    prob.k_begin = static_cast<int>(split * split_size);
    prob.k_end = static_cast<int>(min(d.out_per_group(), (split + 1) * split_size));
    prob.filter = filter;
    prob.out_backprop = out_backprop;
    prob.dst = {input_grad, SPLIT ? partial + split * d.batch * d.in_rows * d.in_cols * d.in_depth : nullptr};
    prob.out_depth = static_cast<int>(d.out_depth);
    prob.in_depth = static_cast<int>(d.in_depth);
    prob.in_channel0 = static_cast<int>(group * d.filter_in_depth);
    prob.out_channel0 = static_cast<int>(group * d.out_per_group());
    igemm::run_cta<T, Acc, Kind, VECTOR, TILE_M, TILE_N>(prob);
}

// conv2d_backprop_input_few_channels: NHWC, one group, CIN <= 4 input channels (the stem: an
// image's 3), where a GEMM tile would be almost all padding.  Thread = one input position,
// producing its CIN channels.  CTA (x, h, n): input row h of image n, so the row's stride phase
// (hence its filter rows) is uniform in the CTA, and the CTA stages those filter rows once, as
// Acc, in shared memory; along the row, threads take columns phase by phase (w = phase + j *
// stride_cols), so a warp shares its filter columns (broadcast shared-memory reads) except
// where it crosses into the next phase.  Per tap that reaches the position: out_backprop's row
// of out_depth channels in 16-byte chunks, each chunk's elements converted once and multiplied
// by the CIN staged filter rows.  The taps come from PhaseTaps as in the GEMM kernel below: no
// division per tap.  32-bit offsets inside an image and in the filter (the launcher checks
// them); 64-bit image starts.  Fixed summation order (taps, then channels): deterministic.
inline constexpr int kFewChannelThreads = 256;
// Shared memory for the staged filter rows: 40 KB, so 5 CTAs fit an H100 SM (228 KB) and the
// kernel stays within the 48 KB of static shared memory.  The launcher requires the whole
// filter to fit (FEW_CHANNEL_FILTER_BYTES).
inline constexpr int kFewChannelFilterBytes = 40 * 1024;
// At least 2 CTAs per SM (<= 128 registers).  Without a minimum ptxas (CUDA 13) spills some
// instantiations at 48-64 registers; with 4 it spills others.
inline constexpr int kFewChannelMinBlocks = 2;

template <typename T, typename Acc, int CIN>
__global__ void __launch_bounds__(kFewChannelThreads, kFewChannelMinBlocks)
conv2d_backprop_input_few_channels(const T* __restrict__ filter, const T* __restrict__ out_backprop,
                                   T* __restrict__ input_grad, GRADOPS_CONV_DIMS_PARAMS) {
    constexpr int C = igemm::ChunkSize<T>::value;  // elements per 16-byte chunk
    constexpr int AC = static_cast<int>(sizeof(uint4) / sizeof(Acc));  // Acc per 16-byte shared read
    static_assert(C % AC == 0, "a chunk is whole shared-memory reads");
    __shared__ __align__(16) Acc staged[kFewChannelFilterBytes / sizeof(Acc)];

    const int stride_r = static_cast<int>(stride_rows), stride_c = static_cast<int>(stride_cols);
    const int h = static_cast<int>(blockIdx.y), n = static_cast<int>(blockIdx.z);
    const int dil_r = static_cast<int>(dilation_rows), dil_c = static_cast<int>(dilation_cols);
    const int pad_t = static_cast<int>(pad_top), pad_l = static_cast<int>(pad_left);
    const int rows_out = static_cast<int>(out_rows), cols_out = static_cast<int>(out_cols);
    const int depth_out = static_cast<int>(out_depth), taps_cols = static_cast<int>(filter_cols);
    const int tap_elements = CIN * depth_out;  // one (r, s) of the HWIO filter

    // The row phase's filter rows r = first + ri * step, staged as staged[(ri * S + s) * CIN *
    // out_depth + c * out_depth + k], 16 bytes of T at a time.
    const PhaseTaps taps_r(h % stride_r, pad_t, stride_r, dil_r % stride_r, static_cast<int>(filter_rows));
    // 16 bytes as C elements of T or AC of Acc, kept in registers (a union, not an address-taken array).
    union Chunk {
        uint4 raw;
        T e[C];
    };
    union Staged {
        uint4 raw;
        Acc e[AC];
    };
    const int row_chunks = taps_cols * tap_elements / C;  // one filter row's chunks
    for (int e = static_cast<int>(threadIdx.x); e < taps_r.count * row_chunks; e += kFewChannelThreads) {
        const int ri = e / row_chunks, chunk = e - ri * row_chunks;
        Chunk v;
        v.raw = *reinterpret_cast<const uint4*>(
            filter + (taps_r.first + ri * taps_r.step) * taps_cols * tap_elements + chunk * C);
#pragma unroll
        for (int i = 0; i < C; ++i) staged[e * C + i] = to_acc<Acc>(v.e[i]);
    }
    __syncthreads();

    const int image_cols = static_cast<int>(in_cols);
    const int phase_cols = (image_cols + stride_c - 1) / stride_c;  // columns per column phase
    const int slot = static_cast<int>(blockIdx.x) * kFewChannelThreads + static_cast<int>(threadIdx.x);
    if (slot >= stride_c * phase_cols) return;
    const int phase_col = slot / phase_cols;
    const int w = phase_col + (slot - phase_col * phase_cols) * stride_c;
    if (w >= image_cols) return;

    const PhaseTaps taps_s(phase_col, pad_l, stride_c, dil_c % stride_c, taps_cols);
    // The out_backprop row (column) the phase's first tap reads: exact divisions.
    const int p0 = (h + pad_t - taps_r.first * dil_r) / stride_r, p_step = taps_r.step * dil_r / stride_r;
    const int q0 = (w + pad_l - taps_s.first * dil_c) / stride_c, q_step = taps_s.step * dil_c / stride_c;
    const T* image = out_backprop + static_cast<index_t>(n) * out_rows * out_cols * out_depth;

    Acc acc[CIN];
#pragma unroll
    for (int c = 0; c < CIN; ++c) acc[c] = Acc(0);
    for (int ri = 0; ri < taps_r.count; ++ri) {
        const int p = p0 - ri * p_step;
        if (p < 0) break;  // decreases with ri
        if (p >= rows_out) continue;
        for (int si = 0; si < taps_s.count; ++si) {
            const int q = q0 - si * q_step;
            if (q < 0) break;
            if (q >= cols_out) continue;
            const T* dy = image + (p * cols_out + q) * depth_out;
            const Acc* f = staged + (ri * taps_cols + taps_s.first + si * taps_s.step) * tap_elements;
            for (int k = 0; k < depth_out; k += C) {
                Chunk chunk;
                chunk.raw = *reinterpret_cast<const uint4*>(dy + k);
                Acc dyk[C];
#pragma unroll
                for (int e = 0; e < C; ++e) dyk[e] = to_acc<Acc>(chunk.e[e]);
#pragma unroll
                for (int c = 0; c < CIN; ++c) {
#pragma unroll
                    for (int e0 = 0; e0 < C; e0 += AC) {
                        Staged fk;
                        if constexpr (sizeof(Acc) == 4) {
                            // Inline PTX: NVVM compiled this float load to one ld.shared.v4 in
                            // most compiles and to a v4 of which it kept half plus a v2 in 1 to 7
                            // of 40 (tests/test_cuda_compile.py, NVVM_UNSTABLE; 2026-12-06).
                            const float4 v = ptx::ld_shared_16(f + c * depth_out + k + e0);
                            fk.e[0] = v.x, fk.e[1] = v.y, fk.e[2] = v.z, fk.e[3] = v.w;
                        } else {
                            fk.raw = *reinterpret_cast<const uint4*>(f + c * depth_out + k + e0);
                        }
#pragma unroll
                        for (int e = 0; e < AC; ++e) acc[c] += fk.e[e] * dyk[e0 + e];
                    }
                }
            }
        }
    }
    T* out = input_grad + ((static_cast<index_t>(n) * in_rows + h) * in_cols + w) * CIN;
#pragma unroll
    for (int c = 0; c < CIN; ++c) out[c] = from_acc<T, Acc>(acc[c]);
}

}  // namespace gradops
