// FractionalMaxPoolGrad in two gather passes, without atomics: one fixed order per element.
// Where the cells partition the input (what TF's generator makes, overlapping or not),
// fractional_max_pool_grad_cells (at the end of this file) does both in one pass: a thread per
// cell writes the cell's own region, the few elements it shares with the cells above and to
// its left included.
//
// Shapes (NHWC only: the op has no data_format):
//   orig_input, in_backprop     [batch, in_rows, in_cols, depth]
//   orig_output, out_backprop   [batch, out_rows, out_cols, depth]
// Cell tables (built on the host from the validated geometry, element type I as the indices):
//   row_bounds  [2 * out_rows]   first and last input row of each row cell (inclusive; every
//                                cell is non-empty: the op hands the backends no empty one)
//   row_offsets [in_rows + 1]    input row y lies in the row cells of
//   row_entries [entries]        row_entries[row_offsets[y] .. row_offsets[y + 1]), in increasing
//                                cell order, each a CellEntry: the cell, the rows of the cell
//                                above y and the cell's row count (16 bytes for int: one load)
//   col_bounds, col_offsets, col_entries: the same for columns.
//
// What is computed (TF's fractional_max_pool_op.cc).  Per output element (n, r, q, c), TF scans
// its cell row by row, each row left to right, takes the first element and replaces the choice
// by a later element only if `chosen < element` (T's own comparison).  Ties therefore go to the
// first maximum in that order; a NaN is chosen only as the first element, and then kept.  TF
// refuses the call unless every recomputed maximum == orig_output (so a NaN maximum is always
// refused).  Then it adds out_backprop to the chosen elements in output order, in T.
//
// * fractional_max_pool_select: per output element (a thread takes V, see Channels, and a run
//   of cells down one output column) repeats TF's scan, stores the chosen element, and sets
//   *mismatch = 1 (a plain store: every writer writes the same value) where the maximum differs
//   from orig_output.  The launcher reads the flag back and refuses the call, as TF does.
//   Overlapping cells share a row with the next cell of the column, which a run reads once (see
//   the kernel): on the benchmark's overlapping float16 shape the L2 traffic of select's input
//   reads was the op's limiter (static report).
// * fractional_max_pool_gather: per input element (V per thread) sums, over the cells containing it
//   in increasing (row cell, column cell) order, which is increasing output offset, the
//   out_backprop elements whose chosen offset is its own.  Each sum is TF's, term by term in
//   TF's order, starting from zero, in T (float for the half types, rounded once).  Per cell it
//   makes one entry load (the column cell and, with the row entry, the element's place in the
//   cell: rows above x columns + columns left), one load of the V choices, and compares them
//   four one-byte places per word (Matches); 32-bit kernels split the thread index by
//   host-computed multiply-shifts, not divisions.  Why (static SASS, sm_90, float16, V = 8,
//   one-byte places, per element): a pixel in 2 x 2 cells (overlapping pooling) cost 58
//   instructions with per-cell bound loads, byte-by-byte compares and three divisions; 34 now.
//
// Channels.  A thread takes V adjacent channels of one pixel (V = 8 for the 2-byte types, 4 for
// the others, where the launcher finds depth % V == 0 and aligned arrays; else 1): its index
// math, cell bounds and table reads are shared by V elements, and its loads and stores of
// elements and chosen offsets are packs of V (16 bytes per access: 16 bytes of float16 or
// float, 32 of int offsets for V = 8).  Each channel keeps its own scan and its own sum, in the
// order above, so the result is bitwise that of V = 1.
//
// The chosen element, C: its flat input offset (C = I), or where every cell has at most 256
// elements its place in the cell's scan, row-major from 0 (C = unsigned char: a quarter or an
// eighth of the bytes written by select and read by gather; gather then recomputes the
// place of its own element in each cell from the cell bounds).
//
// Indices are I: int when every tensor and table has fewer than 2^31 elements, else long long.
// Grid-stride loops never step past `total` (no signed overflow near 2^31).
#include "fractional_cells.cuh"  // includes gradops_common.cuh

namespace gradops {
namespace fractional_max {

template <typename T> struct Acc { typedef T type; };
template <> struct Acc<__half> { typedef float type; };
template <> struct Acc<__nv_bfloat16> { typedef float type; };

// Values compared in a type that orders them exactly as T does (the half types widen exactly).
template <typename T> __device__ __forceinline__ typename Acc<T>::type widen(T x) {
    return to_acc<typename Acc<T>::type, T>(x);
}
template <> __device__ __forceinline__ float widen<__nv_bfloat16>(__nv_bfloat16 x) {
    return bfloat16_bits_to_float(x);  // see gradops_common.cuh (the overlapping cells kernel: 151 -> 127 registers)
}

template <typename I> __device__ __forceinline__ I next(I i, I stride, I total) {
    return total - i > stride ? i + stride : total;
}

// V adjacent values of type X in one access (16-byte aligned at most: 32 bytes are two loads).
template <typename X, int V> struct alignas(V * sizeof(X) < 16 ? V * sizeof(X) : 16) Pack {
    X v[V];
};
template <int V, typename X> __device__ __forceinline__ Pack<X, V> load_pack(const X* p) {
    return *reinterpret_cast<const Pack<X, V>*>(p);
}
template <int V, typename X> __device__ __forceinline__ void store_pack(X* p, const Pack<X, V>& value) {
    *reinterpret_cast<Pack<X, V>*>(p) = value;
}


// One entry of gather's per-index cell lists (row_entries / col_entries): a cell containing the
// index, in increasing cell order, with the index's distance from the cell's first index
// (`before`: rows above it in the cell, or columns left of it) and the cell's size along that
// dimension.  16 bytes for int: one load per entry.
template <typename I> struct alignas(4 * sizeof(I) < 16 ? 4 * sizeof(I) : 16) CellEntry {
    I cell, before, size, unused;
};

// Columns of a cell's row that select keeps in registers for the next cell of its run, and
// that the cells kernel's scan loads together: a pooling ratio below 3 makes cells of at most
// 3 columns, 4 where cells overlap.
inline constexpr int kCarryCols = 4;

// The scan's first element for the V channels: the choice so far (place 0, or flat offset
// ``offset`` + u).
template <bool LOCAL, typename T, int V, typename A, typename C, typename I>
__device__ __forceinline__ void begin_scan(const Pack<T, V>& values, A (&best_value)[V], Pack<C, V>& best, I offset) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
        best.v[u] = LOCAL ? C(0) : static_cast<C>(offset + u);
        best_value[u] = widen(values.v[u]);
    }
}

// TF's scan step for the V channels of one element: a later element replaces the choice only if
// `chosen < element` (strictly greater; a NaN never replaces, and a NaN first element is kept).
// ``place``: the element's place in the cell's scan; ``offset``: its first channel's flat offset.
template <bool LOCAL, typename T, int V, typename A, typename C, typename I>
__device__ __forceinline__ void consider(const Pack<T, V>& values, A (&best_value)[V], Pack<C, V>& best, I place,
                                         I offset) {
#pragma unroll
    for (int u = 0; u < V; ++u) {
        const A value = widen(values.v[u]);
        if (best_value[u] < value) {  // TF's test: strictly greater, NaN never
            best_value[u] = value;
            best.v[u] = static_cast<C>(LOCAL ? place : offset + u);
        }
    }
}

// Whether a scan's maxima differ from orig_output's (``maxima``), select's flag: by T's ==, so
// a NaN maximum always differs.
template <typename T, int V, typename A>
__device__ __forceinline__ bool maxima_differ(const A (&best_value)[V], const Pack<T, V>& maxima) {
    bool differs = false;
#pragma unroll
    for (int u = 0; u < V; ++u) differs |= !(best_value[u] == widen(maxima.v[u]));
    return differs;
}

// n / divisor: magic_divide for 32-bit indices (the host's division_magic), a division for
// 64-bit ones.
__device__ __forceinline__ int divide(int n, int, unsigned magic, int shift) { return magic_divide(n, magic, shift); }
__device__ __forceinline__ long long divide(long long n, long long divisor, unsigned, int) { return n / divisor; }

// Which of a thread's V channels chose the element: for cell places (LOCAL), the bytes of the
// V one-byte places equal to the element's, found four at a time in each 32-bit word (bit 7 of
// byte u set where byte u matches: no byte extraction per channel); for flat offsets, bit u.
template <int V, bool LOCAL> struct Matches {
    static constexpr int WORDS = LOCAL ? (V + 3) / 4 : 1;
    unsigned word[WORDS];
    __device__ __forceinline__ Matches() {
#pragma unroll
        for (int k = 0; k < WORDS; ++k) word[k] = 0u;
    }
    __device__ __forceinline__ void set(int u, bool match) { word[0] |= static_cast<unsigned>(match) << u; }
    // The V one-byte places at ``at`` against ``place`` (< 256), loaded as whole words where V
    // is a multiple of 4 (the pack is then aligned to 4 bytes at least), else byte by byte.
    __device__ __forceinline__ void places(const unsigned char* at, unsigned place) {
        const unsigned spread = place * 0x01010101u;
        unsigned w[WORDS];
        if constexpr (V % 4 == 0) {
            const Pack<unsigned, WORDS> words = load_pack<WORDS>(reinterpret_cast<const unsigned*>(at));
#pragma unroll
            for (int k = 0; k < WORDS; ++k) w[k] = words.v[k];
        } else {
            const Pack<unsigned char, V> bytes = load_pack<V>(at);
#pragma unroll
            for (int k = 0; k < WORDS; ++k) {
                w[k] = 0u;
#pragma unroll
                for (int b = 0; b < 4 && 4 * k + b < V; ++b) w[k] |= static_cast<unsigned>(bytes.v[4 * k + b]) << (8 * b);
            }
        }
#pragma unroll
        for (int k = 0; k < WORDS; ++k) {
            // x is zero in the matching bytes; ((x & 0x7f7f7f7f) + 0x7f7f7f7f) sets bit 7 of every
            // byte whose low 7 bits are not all zero, without carries between bytes; or-ing x sets
            // it for bytes with bit 7 set; so its complement's bit 7 marks exactly the zero bytes
            // (of the V that exist: ``live``).
            const unsigned x = w[k] ^ spread;
            const unsigned live = V - 4 * k >= 4 ? 0x80808080u : (0x80808080u >> (8 * (4 - (V - 4 * k))));
            word[k] = ~(((x & 0x7f7f7f7fu) + 0x7f7f7f7fu) | x) & live;
        }
    }
    __device__ __forceinline__ bool any() const {
        unsigned all = 0u;
#pragma unroll
        for (int k = 0; k < WORDS; ++k) all |= word[k];
        return all != 0u;
    }
    __device__ __forceinline__ bool has(int u) const {
        return LOCAL ? (word[u / 4] >> (8 * (u % 4) + 7)) & 1u : (word[0] >> u) & 1u;
    }
};

}  // namespace fractional_max

// Thread work: V channels c .. c + V - 1 of output pixels (n, r, q) for the ``run`` output rows
// r0 = k * run .. (k + 1) * run - 1 of output column q (the column's last run may be shorter):
// the cells of a run are scanned one after the other, each exactly as one cell per thread
// would be.  Overlapping pooling makes each cell's last row the next cell's first; where a cell
// spans at most kCarryCols columns the thread holds the packs of the row it read last in
// registers and takes that row from them when the next cell starts on it, so the run reads a
// shared row once (the launcher's run of 4 reads about (rows - 3/4) x columns packs per cell
// instead of rows x columns).  Wider cells take the one-element-at-a-time loop, which reads
// every row.
template <typename T, typename I, int V, typename C>
__global__ void fractional_max_pool_select(const T* __restrict__ orig_input, const T* __restrict__ orig_output,
                                           C* __restrict__ chosen, int* __restrict__ mismatch,
                                           const I* __restrict__ row_bounds, const I* __restrict__ col_bounds,
                                           I batch, I in_rows, I in_cols, I depth, I out_rows, I out_cols, I run) {
    using namespace fractional_max;
    typedef typename Acc<T>::type A;
    constexpr bool LOCAL = sizeof(C) == 1;  // the place in the cell's scan, else the flat offset
    const I groups = depth / V;  // the launcher takes V > 1 only where V divides depth
    const I runs = (out_rows + run - 1) / run;  // runs per output column
    const I total = batch * runs * out_cols * groups;
    const I stride = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
    for (I t = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
         t < total; t = next(t, stride, total)) {
        I rest = t;
        const I c = rest % groups * V; rest /= groups;
        const I q = rest % out_cols; rest /= out_cols;
        const I r0 = rest % runs * run;
        const I n = rest / runs;
        const I r_end = out_rows - r0 > run ? r0 + run : out_rows;
        const I x0 = col_bounds[2 * q], x1 = col_bounds[2 * q + 1];
        const I cols = x1 - x0 + 1;
        Pack<T, V> held[kCarryCols];  // input row held_row, columns x0 .. x0 + cols - 1: the row read last
        I held_row = -1;
        for (I r = r0; r < r_end; ++r) {
            const I y0 = row_bounds[2 * r], y1 = row_bounds[2 * r + 1];
            const I o = ((n * out_rows + r) * out_cols + q) * depth + c;  // the first channel's output offset
            Pack<C, V> best;
            A best_value[V];
            if (cols <= kCarryCols) {
                // (one row an iteration: the static report's model counts iterations as rows)
#pragma unroll 1
                for (I y = y0; y <= y1; ++y) {
                    const I row_first = ((n * in_rows + y) * in_cols + x0) * depth + c;
                    const I row_place = (y - y0) * cols;  // of (y, x0) in the cell's scan
                    if (y != held_row) {  // else the previous cell's last row, already held
#pragma unroll
                        for (int j = 0; j < kCarryCols; ++j)
                            if (j < cols) held[j] = load_pack<V>(orig_input + row_first + j * depth);
                        held_row = y;
                    }
#pragma unroll
                    for (int j = 0; j < kCarryCols; ++j) {
                        if (j >= cols) break;
                        if (j == 0 && y == y0) {
                            begin_scan<LOCAL>(held[0], best_value, best, row_first);
                        } else {
                            consider<LOCAL>(held[j], best_value, best, row_place + j, row_first + j * depth);
                        }
                    }
                }
            } else {
                const I first = ((n * in_rows + y0) * in_cols + x0) * depth + c;
                begin_scan<LOCAL>(load_pack<V>(orig_input + first), best_value, best, first);
                I place = 0;  // of the element (y, x) in the cell's scan
                for (I y = y0; y <= y1; ++y) {
                    const I row = (n * in_rows + y) * in_cols;
                    for (I x = (y == y0 ? x0 + 1 : x0); x <= x1; ++x) {
                        ++place;
                        const I offset = (row + x) * depth + c;
                        consider<LOCAL>(load_pack<V>(orig_input + offset), best_value, best, place, offset);
                    }
                }
            }
            store_pack<V>(chosen + o, best);
            if (maxima_differ(best_value, load_pack<V>(orig_output + o))) *mismatch = 1;
        }
    }
}

// Thread work: V channels c .. c + V - 1 of input pixel (n, y, x).  ``pixel_magic`` and the
// other multiply-shift pairs (32-bit indices only; the launcher's division_magic) divide by
// groups = depth / V, in_cols and in_rows without a division instruction.
template <typename T, typename I, int V, typename C>
__global__ void fractional_max_pool_gather(const T* __restrict__ out_backprop, const C* __restrict__ chosen,
                                           T* __restrict__ in_backprop,
                                           const I* __restrict__ row_offsets,
                                           const fractional_max::CellEntry<I>* __restrict__ row_entries,
                                           const I* __restrict__ col_offsets,
                                           const fractional_max::CellEntry<I>* __restrict__ col_entries,
                                           I batch, I in_rows, I in_cols, I depth, I out_rows, I out_cols,
                                           unsigned groups_magic, int groups_shift, unsigned cols_magic,
                                           int cols_shift, unsigned rows_magic, int rows_shift) {
    using namespace fractional_max;
    typedef typename Acc<T>::type A;
    const I groups = depth / V;
    const I total = batch * in_rows * in_cols * groups;
    const I stride = static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x);
    for (I t = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
         t < total; t = next(t, stride, total)) {
        const I pixel = divide(t, groups, groups_magic, groups_shift);  // (n * in_rows + y) * in_cols + x
        const I c = (t - pixel * groups) * V;
        const I image_row = divide(pixel, in_cols, cols_magic, cols_shift);  // n * in_rows + y
        const I x = pixel - image_row * in_cols;
        const I n = divide(image_row, in_rows, rows_magic, rows_shift);
        const I y = image_row - n * in_rows;
        const I i = t * V;  // the first channel's input offset, pixel * depth + c
        A sum[V];
#pragma unroll
        for (int u = 0; u < V; ++u) sum[u] = A(0);
        constexpr bool LOCAL = sizeof(C) == 1;
        const I q_begin = col_offsets[x], q_end = col_offsets[x + 1];
        const I rk_end = row_offsets[y + 1];
        for (I rk = row_offsets[y]; rk < rk_end; ++rk) {
            const CellEntry<I> row = row_entries[rk];
            const I base = (n * out_rows + row.cell) * out_cols;
            for (I qk = q_begin; qk < q_end; ++qk) {
                const CellEntry<I> col = col_entries[qk];
                const I o = (base + col.cell) * depth + c;
                Matches<V, LOCAL> mine;
                if constexpr (LOCAL) {  // (y, x)'s place in the cell's scan
                    mine.places(reinterpret_cast<const unsigned char*>(chosen + o),
                                static_cast<unsigned>(row.before * col.size + col.before));
                } else {
                    const Pack<C, V> picks = load_pack<V>(chosen + o);
#pragma unroll
                    for (int u = 0; u < V; ++u) mine.set(u, picks.v[u] == static_cast<C>(i + u));
                }
                if (mine.any()) {  // at most one cell per channel chooses an element of a disjoint pool
                    const Pack<T, V> grads = load_pack<V>(out_backprop + o);
#pragma unroll
                    for (int u = 0; u < V; ++u)
                        if (mine.has(u)) sum[u] += to_acc<A, T>(grads.v[u]);
                }
            }
        }
        Pack<T, V> result;
#pragma unroll
        for (int u = 0; u < V; ++u) result.v[u] = from_acc<T, A>(sum[u]);
        store_pack<V>(in_backprop + i, result);
    }
}

// Partitions (the sequences TF's generator makes): cells that start at 0, follow one another
// and end at the last input index.  Each cell's own region is rows row_bounds[r] ..
// row_bounds[r + 1] - 1 and columns col_bounds[c] .. col_bounds[c + 1] - 1; overlapping cells
// (OVERLAP) also take the next region's first row and first column, except the last cell of
// each dimension.  A thread per (cell column, V channels) walks down a chunk of chunk_rows cell
// rows, scans each cell in TF's order (as select does, places counted in registers; the half
// types two channels to a compare where the GPU has one: PairScan), flags a maximum that
// differs from orig_output (as select does) and writes the cell's own region of in_backprop:
// one pass over orig_input and in_backprop, no chosen buffer and no second kernel.
//
// Disjoint cells: every element lies in one cell, so its gradient is its cell's out_backprop
// where the cell chose it and zero elsewhere.  Threads: fractional_cells::for_each_cell_column
// (fractional_cells.cuh), as in fractional_avg_pool_grad_cells.
//
// Overlapping cells: the region's first row (r > 0) also lies in the cell above, its first
// column (c > 0) in the cell to the left and its first element in the cell above that one, and
// gather's sum runs over them in output order: (r-1, c-1), (r-1, c), (r, c-1), (r, c).  Each
// thread publishes its cell's choices and out_backprop in shared memory, and after the row's
// barrier reads its left neighbour's (the neighbour's thread's slot) and those of the row
// above (its own slot and its neighbour's, one row back): a block is blockDim.x vectors x
// (blockDim.y - 1) cell columns plus a halo row of threads (threadIdx.y = 0) that scans the
// cells left of the block's first column and writes nothing.
// Every thread of a block runs the same cell rows (one barrier each; a chunk starting at r0 > 0
// first scans row r0 - 1 for the row above), so the loops are block-uniform.
//
// Each element's value is gather's sum: A(0) plus the out_backprop of each cell choosing it, in
// that order, rounded once (so -0.0 becomes +0.0, as in TF's += into zeros); an element no cell
// chose is +0.  The half types where the GPU compares them in pairs (kPairScan) pass their
// choices and write their regions two channels to an instruction, with the same bits
// (PairChoice, "the overlapping kernel's region, in pairs" below).  Only a thread's own cells
// are checked against orig_output (the halo's and the row above's are some other thread's own).
//
// Tables: row_bounds [out_rows + 1] and col_bounds [out_cols + 1], the first index of each
// region and then the input's size.
namespace fractional_max {

// A scan's state, one channel at a time: each channel's maximum so far in A (the half types
// widened: they compare as T does) and its place in the cell's scan.
template <typename T, int V, typename A, typename I> struct ChannelScan {
    A (&best_value)[V];
    Pack<I, V>& best;
    __device__ __forceinline__ void begin(const Pack<T, V>& values) { begin_scan<true>(values, best_value, best, I(0)); }
    __device__ __forceinline__ void consider(const Pack<T, V>& values, I place) {
        fractional_max::consider<true>(values, best_value, best, place, I(0));
    }
};

// The half types' pairs and the first arch that compares a pair in one instruction (HSET2:
// float16 from sm_53, bfloat16 from sm_90); 0: no pair type.  The host model takes it for both.
template <typename T> struct PairOf { static constexpr int first_arch = 0; };
template <> struct PairOf<__half> {
    typedef __half2 type;
    static constexpr int first_arch = 530;
};
template <> struct PairOf<__nv_bfloat16> {
    typedef __nv_bfloat162 type;
    static constexpr int first_arch = 900;
};
#ifdef __CUDA_ARCH__
inline constexpr int kPairArch = __CUDA_ARCH__;
#else
inline constexpr int kPairArch = PairOf<__nv_bfloat16>::first_arch;  // the host model: both types
#endif

// Channels 2k and 2k + 1 of a pack as one word (channel 2k in the low half, as T lies in
// memory), and a word as a pair of T.
template <typename T, int V> __device__ __forceinline__ unsigned pair_word(const Pack<T, V>& p, int k) {
    unsigned bits;
    memcpy(&bits, &p.v[2 * k], sizeof(bits));
    return bits;
}
template <typename T> __device__ __forceinline__ typename PairOf<T>::type word_pair(unsigned bits) {
    typename PairOf<T>::type pair;
    memcpy(&pair, &bits, sizeof(bits));
    return pair;
}

// Places a PairScan holds: 16 bits each.
inline constexpr int kPairScanPlaces = 1 << 16;

// The overlapping kernel's places in pairs (PairChoice, below): kPlaceBias + place as the bits of
// a T, for places below kPairPlaces; kNoPlaces for a missing neighbour's (NaN bits).
inline constexpr unsigned kPlaceBias = 0x0400u;
inline constexpr unsigned kPairPlaces = 0x7C00u - kPlaceBias;
inline constexpr unsigned kNoPlaces = 0xFFFFFFFFu;
// ``place`` + ``bias`` in both halves of a word.
__device__ __forceinline__ unsigned spread_place(unsigned place, unsigned bias = kPlaceBias) {
    return (place + bias) * 0x10001u;
}

// A scan's state two channels at a time (T a half type, V even, every place below
// kPairScanPlaces): channels 2k and 2k + 1's maxima as the bits of one pair of T (value[k],
// channel 2k in the low half, as T lies in memory) and their places as two 16-bit halves
// (place[k]).  One compare of the pair (__hlt2_mask: 0xFFFF in each half whose `chosen <
// element` holds, TF's test in T: NaN never) and two bitwise selects take the later element
// where it wins: 3 instructions a pair, where ChannelScan takes 8 (two widenings, two
// compares, four selects).  finish(): whether the maxima differ from orig_output's
// (__heq2_mask: T's ==, NaN never equal, as maxima_differ), and the places: as I in best, as
// ChannelScan leaves them (BIAS 0), or as the words themselves, each place + BIAS (PairChoice's).
template <typename T, int V, typename I, unsigned BIAS = 0u> struct PairScan {
    static_assert(V % 2 == 0, "channels in pairs");
    static constexpr int PAIRS = V / 2;
    unsigned value[PAIRS];
    unsigned place[PAIRS];
    __device__ __forceinline__ void begin(const Pack<T, V>& values) {
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) {
            value[k] = pair_word(values, k);
            place[k] = spread_place(0u, BIAS);
        }
    }
    __device__ __forceinline__ void consider(const Pack<T, V>& values, I at) {
        const unsigned spread = spread_place(static_cast<unsigned>(at), BIAS);  // the place in both halves
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) {
            const unsigned element = pair_word(values, k);
            const unsigned wins = __hlt2_mask(word_pair<T>(value[k]), word_pair<T>(element));
            value[k] = (element & wins) | (value[k] & ~wins);
            place[k] = (spread & wins) | (place[k] & ~wins);
        }
    }
    // Whether pair k of the maxima differs from orig_output's.
    __device__ __forceinline__ bool pair_differs(const Pack<T, V>& maxima, int k) const {
        return __heq2_mask(word_pair<T>(value[k]), word_pair<T>(pair_word(maxima, k))) != 0xFFFFFFFFu;
    }
    __device__ __forceinline__ bool finish(const Pack<T, V>& maxima, Pack<I, V>& best) const {
        static_assert(BIAS == 0u, "places as I from unbiased words");
        bool any = false;
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) {
            any |= pair_differs(maxima, k);
            best.v[2 * k] = static_cast<I>(place[k] & 0xFFFFu);
            best.v[2 * k + 1] = static_cast<I>(place[k] >> 16);
        }
        return any;
    }
    __device__ __forceinline__ bool finish(const Pack<T, V>& maxima, Pack<unsigned, PAIRS>& words) const {
        bool any = false;
#pragma unroll
        for (int k = 0; k < PAIRS; ++k) {
            any |= pair_differs(maxima, k);
            words.v[k] = place[k];
        }
        return any;
    }
};

// TF's scan of a narrow cell (at most kCarryCols columns: every cell of a pooling ratio below
// 3) of rows x cols elements whose first (V channels) is input[first], rows in_row apart and
// columns depth apart, into ``scan`` (ChannelScan or PairScan).  Each row's packs are loaded
// together into ``row``, so a row costs one memory round trip, not one per element; with
// ``first_row_held`` the first row's packs are already there (scan_cell_holding).
template <typename T, int V, typename I, typename Scan>
__device__ __forceinline__ void scan_narrow_rows(Scan& scan, const T* __restrict__ input, I first, I rows, I cols,
                                                 I in_row, I depth, Pack<T, V> (&row)[kCarryCols],
                                                 bool first_row_held) {
    I place = 0;  // of (y, 0) in the cell's scan
#pragma unroll 1
    for (I y = 0; y < rows; ++y, place += cols) {
        const I row_first = first + y * in_row;
        if (y > 0 || !first_row_held) {
#pragma unroll
            for (int j = 0; j < kCarryCols; ++j)
                if (j < cols) row[j] = load_pack<V>(input + row_first + j * depth);
        }
#pragma unroll
        for (int j = 0; j < kCarryCols; ++j) {
            if (j >= cols) break;
            if (j == 0 && y == 0) {
                scan.begin(row[0]);
            } else {
                scan.consider(row[j], place + j);
            }
        }
    }
}

// Whether scan_narrow takes a cell: at most kCarryCols columns, and where it scans in pairs, at
// most kPairScanPlaces / kCarryCols rows, so at most kPairScanPlaces elements (a taller cell
// takes the wide cells' loop; a constant bound: no division).
template <typename T, int V>
inline constexpr bool kPairScan = PairOf<T>::first_arch > 0 && kPairArch >= PairOf<T>::first_arch && V % 2 == 0;
template <typename T, int V, typename I> __device__ __forceinline__ bool narrow_cell(I rows, I cols) {
    return cols <= kCarryCols && (!kPairScan<T, V> || rows <= kPairScanPlaces / kCarryCols);
}

// TF's scan of the cell of rows x cols elements whose first (V channels) is input[first], rows
// in_row apart and columns depth apart: each channel's place in the scan, row-major from 0
// (best), and whether its maximum differs from orig_output's (``maxima``).  A narrow_cell takes
// scan_narrow_rows (PairScan where kPairScan, else ChannelScan) and leaves its last row's packs
// in ``row`` (``narrow``); the others take one element at a time.
template <typename T, int V, typename I>
__device__ __forceinline__ bool scan_any_cell(const T* __restrict__ input, I first, I rows, I cols, I in_row, I depth,
                                              const Pack<T, V>& maxima, Pack<I, V>& best,
                                              Pack<T, V> (&row)[kCarryCols], bool first_row_held, bool& narrow) {
    narrow = narrow_cell<T, V>(rows, cols);
    if constexpr (kPairScan<T, V>) {
        if (narrow) {
            PairScan<T, V, I> scan{};
            scan_narrow_rows<T, V>(scan, input, first, rows, cols, in_row, depth, row, first_row_held);
            return scan.finish(maxima, best);
        }
    }
    typename Acc<T>::type best_value[V];
    if (!kPairScan<T, V> && narrow) {
        ChannelScan<T, V, typename Acc<T>::type, I> scan{best_value, best};
        scan_narrow_rows<T, V>(scan, input, first, rows, cols, in_row, depth, row, first_row_held);
    } else {
        begin_scan<true>(load_pack<V>(input + first), best_value, best, first);
        I place = 0;  // of (y, x) in the cell's scan
#pragma unroll 1
        for (I y = 0; y < rows; ++y) {
#pragma unroll 1
            for (I x = y == 0 ? 1 : 0; x < cols; ++x) {
                const I offset = first + y * in_row + x * depth;
                consider<true>(load_pack<V>(input + offset), best_value, best, ++place, offset);
            }
        }
    }
    return maxima_differ(best_value, maxima);
}

// scan_any_cell of one cell.
template <typename T, int V, typename I>
__device__ __forceinline__ bool scan_cell(const T* __restrict__ input, I first, I rows, I cols, I in_row, I depth,
                                          const Pack<T, V>& maxima, Pack<I, V>& best) {
    Pack<T, V> row[kCarryCols];
    bool narrow;
    return scan_any_cell<T, V>(input, first, rows, cols, in_row, depth, maxima, best, row, false, narrow);
}

// scan_cell for a column of overlapping cells, walked down: a cell's last row is the next
// cell's first, so a narrow cell leaves its last row's packs in ``held`` and the next call takes
// its first row from there (``have_held``) instead of loading it again: a cell of h rows costs
// h - 1 round trips, not h.  Wide cells hold nothing.
template <typename T, int V, typename I>
__device__ __forceinline__ bool scan_cell_holding(const T* __restrict__ input, I first, I rows, I cols, I in_row,
                                                  I depth, const Pack<T, V>& maxima, Pack<I, V>& best,
                                                  Pack<T, V> (&held)[kCarryCols], bool& have_held) {
    bool narrow;
    const bool differs =
        scan_any_cell<T, V>(input, first, rows, cols, in_row, depth, maxima, best, held, have_held, narrow);
    have_held = narrow;
    return differs;
}

// scan_cell_holding for the overlapping kernel's pairs (kPairScan, every place below
// kPairPlaces): the places as PairChoice holds them, two to a word, each + kPlaceBias; a narrow
// cell's straight from PairScan, a wide one's packed from the channels'.
template <typename T, int V, typename I>
__device__ __forceinline__ bool scan_cell_holding(const T* __restrict__ input, I first, I rows, I cols, I in_row,
                                                  I depth, const Pack<T, V>& maxima, Pack<unsigned, V / 2>& places,
                                                  Pack<T, V> (&held)[kCarryCols], bool& have_held) {
    if (narrow_cell<T, V>(rows, cols)) {
        PairScan<T, V, I, kPlaceBias> scan;  // (begin() sets it: zeroed first, 1.2 SASS an element more)
        scan_narrow_rows<T, V>(scan, input, first, rows, cols, in_row, depth, held, have_held);
        have_held = true;
        return scan.finish(maxima, places);
    }
    Pack<I, V> best;
    bool narrow;
    const bool differs =
        scan_any_cell<T, V>(input, first, rows, cols, in_row, depth, maxima, best, held, false, narrow);
    have_held = false;
#pragma unroll
    for (int k = 0; k < V / 2; ++k)
        places.v[k] = (static_cast<unsigned>(best.v[2 * k]) | static_cast<unsigned>(best.v[2 * k + 1]) << 16) +
                      spread_place(0u);
    return differs;
}

// A cell's choices and out_backprop, as a thread passes them to its right neighbour.
template <typename T, typename I, int V> struct CellChoice {
    Pack<I, V> best;
    Pack<T, V> grads;
};

// A missing neighbour's choices: places that no cell element has.
template <typename T, typename I, int V> __device__ __forceinline__ CellChoice<T, I, V> no_choice() {
    CellChoice<T, I, V> none{};
#pragma unroll
    for (int u = 0; u < V; ++u) none.best.v[u] = -1;
    return none;
}

// gather's sum for one element, term by term: from A(0), each cell choosing the element (its
// place ``place`` in that cell's scan) in output order, rounded once (so -0.0 becomes +0.0).
template <typename A, int V> __device__ __forceinline__ void start_sum(A (&sum)[V]) {
#pragma unroll
    for (int u = 0; u < V; ++u) sum[u] = A(0);
}
template <typename A, typename T, typename I, int V>
__device__ __forceinline__ void add_chosen(A (&sum)[V], const CellChoice<T, I, V>& cell, I place) {
#pragma unroll
    for (int u = 0; u < V; ++u)
        if (cell.best.v[u] == place) sum[u] += to_acc<A, T>(cell.grads.v[u]);
}
template <typename T, typename A, int V> __device__ __forceinline__ Pack<T, V> rounded(const A (&sum)[V]) {
    Pack<T, V> out;
#pragma unroll
    for (int u = 0; u < V; ++u) out.v[u] = from_acc<T, A>(sum[u]);
    return out;
}

// Threads of an overlapping cells kernel's block: CELLS_THREADS (the launcher's 128), the halo
// row among them (max_cells_plan).
inline constexpr int kMaxCellsThreads = 128;

// A Pack<X, V> for each of SLOTS threads in shared memory, word-major: a pack is cut into words
// of at most 16 bytes (one shared-memory access each: LDS/STS.128, .64, .32 or .16), and word k
// of every slot lies together, so the 32 lanes of a warp, which take consecutive slots, access
// consecutive words: one pass over the banks per 128 bytes at any width.  Whole packs side by
// side (the layout before) put lanes 32 or 64 bytes apart where a pack holds more than one
// word: 2 or 4 passes for each 16-byte access (float and int with int choices, float64 and
// 64-bit integers with long long ones), 2 or 4 for the narrow packs' 2- to 8-byte accesses.
template <typename X, int V, int SLOTS> struct SlotWords {
    static constexpr int W = V * static_cast<int>(sizeof(X)) <= 16 ? V : 16 / static_cast<int>(sizeof(X));  // a word's
    Pack<X, W> words[V / W][SLOTS];
    // Word k of a slot; the host model counts the access (STORE: put's, else get's) for its
    // bank-conflict figures.
    __device__ __forceinline__ Pack<X, W>& word(int k, int slot, bool store) {
        Pack<X, W>& w = words[k][slot];
#ifdef GRADOPS_HOST_MODEL
        gradops_host::count_access(&w, store ? gradops_host::STORE : gradops_host::LOAD,
                                   static_cast<int>(sizeof(Pack<X, W>)));
#else
        static_cast<void>(store);
#endif
        return w;
    }
    __device__ __forceinline__ void put(int slot, const Pack<X, V>& p) {
#pragma unroll
        for (int k = 0; k < V / W; ++k) {
            Pack<X, W> w;
#pragma unroll
            for (int u = 0; u < W; ++u) w.v[u] = p.v[k * W + u];
            word(k, slot, true) = w;
        }
    }
    __device__ __forceinline__ Pack<X, V> get(int slot) {
        Pack<X, V> p;
#pragma unroll
        for (int k = 0; k < V / W; ++k) {
            const Pack<X, W> w = word(k, slot, false);
#pragma unroll
            for (int u = 0; u < W; ++u) p.v[k * W + u] = w.v[u];
        }
        return p;
    }
};

// One cell row's choices of every thread of a block (see the overlapping kernel).
template <typename T, typename I, int V> struct PassedRow {
    SlotWords<I, V, kMaxCellsThreads> best;
    SlotWords<T, V, kMaxCellsThreads> grads;
    __device__ __forceinline__ void put(int slot, const CellChoice<T, I, V>& c) {
        best.put(slot, c.best);
        grads.put(slot, c.grads);
    }
    __device__ __forceinline__ CellChoice<T, I, V> get(int slot) { return {best.get(slot), grads.get(slot)}; }
};

// ------------------------------------------------ the overlapping kernel's region, in pairs
// Where the scan takes the half types in pairs (kPairScan), the overlapping kernel's region is
// written two channels to an instruction too (PairChoice, in place of CellChoice):
// * A cell's places stay 16 bits a channel, two to a word as PairScan leaves them, and each is
//   compared as the bits of a T: for places below kPairPlaces, place + kPlaceBias lies in
//   0x0400 .. 0x7BFF, normal, positive and finite in both half types (float16's normals start
//   at 0x0400 and its Inf is 0x7C00; bfloat16's start at 0x0080, Inf 0x7F80), so T's ==
//   (__heq2_mask: HSET2, one instruction a pair) holds exactly for equal places, and no
//   flushing of subnormals can merge two; a missing neighbour's places are NaN bits
//   (kNoPlaces), which equal nothing.  Where a cell has more than kPairPlaces elements the
//   launcher takes one channel a thread, which never pairs (its cells_channels, PAIR_PLACES).
// * A cell's out_backprop is kept as 0 + out_backprop in T (__hadd2 with +0: -0.0 becomes +0.0,
//   the one term a sum may start from), and a place's mask selects its bits or +0.
// * An element in two cells (its region's first row or first column) is the two masked terms'
//   sum in T (HADD2): gather's float sum of at most two T terms, rounded once, is the same
//   number, because float's 24 bits are at least 2p + 2 (p = 11 for float16, 8 for bfloat16:
//   rounding first to float is then innocuous for a sum), the terms are never -0.0 and a term
//   not chosen is +0.0, which leaves the other as it is (a NaN term gives a NaN either way).
//   So 5 instructions a pair (2 compares, 2 masks, 1 add) where the channel form takes 13 (for
//   each channel and cell a compare, a widening and an add; then one rounding).
// * An element in one cell (the rest) is the masked term: 2 a pair.
// * The region's first element (four cells) keeps gather's float sum, the masked terms widened.

// A cell's choices two channels a word (see above) and its 0 + out_backprop in T.
template <typename T, int V> struct PairChoice {
    static constexpr int PAIRS = V / 2;
    Pack<unsigned, PAIRS> places;
    Pack<T, V> grads;
};


// A cell's out_backprop as PairChoice keeps it: 0 + out_backprop in T (-0.0 becomes +0.0).
template <typename T, int V> __device__ __forceinline__ Pack<T, V> plus_zero(const Pack<T, V>& grads) {
    Pack<T, V> out;
    const typename PairOf<T>::type zero = word_pair<T>(0u);  // +0 in both halves
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
        const typename PairOf<T>::type g = __hadd2(zero, word_pair<T>(pair_word(grads, k)));
        memcpy(&out.v[2 * k], &g, sizeof(g));
    }
    return out;
}
template <typename T, int V> __device__ __forceinline__ PairChoice<T, V> no_pair_choice() {
    PairChoice<T, V> none{};
#pragma unroll
    for (int k = 0; k < V / 2; ++k) none.places.v[k] = kNoPlaces;
    return none;
}

// Pair k of the cell's out_backprop where the cell chose ``spread`` (a place in both halves),
// else +0: T's bits under the compare's mask.
template <typename T, int V>
__device__ __forceinline__ unsigned chosen_word(const PairChoice<T, V>& cell, int k, unsigned spread) {
    const unsigned match = __heq2_mask(word_pair<T>(cell.places.v[k]), word_pair<T>(spread));
    return pair_word(cell.grads, k) & match;
}

// The one-cell element (``place`` in ``cell``) and the two-cell one (first ``a`` then ``b``).
template <typename T, int V, typename P>
__device__ __forceinline__ Pack<T, V> one_cell(const PairChoice<T, V>& cell, P place) {
    const unsigned spread = spread_place(static_cast<unsigned>(place));
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
        const unsigned w = chosen_word(cell, k, spread);
        memcpy(&out.v[2 * k], &w, sizeof(w));
    }
    return out;
}
template <typename T, int V, typename P>
__device__ __forceinline__ Pack<T, V> two_cells(const PairChoice<T, V>& a, P a_place, const PairChoice<T, V>& b,
                                                P b_place) {
    const unsigned a_spread = spread_place(static_cast<unsigned>(a_place));
    const unsigned b_spread = spread_place(static_cast<unsigned>(b_place));
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
        const typename PairOf<T>::type sum =
            __hadd2(word_pair<T>(chosen_word(a, k, a_spread)), word_pair<T>(chosen_word(b, k, b_spread)));
        memcpy(&out.v[2 * k], &sum, sizeof(sum));
    }
    return out;
}
// gather's float sum, one more cell (the region's first element); with START, the sum's first
// term: 0 + the term is the term itself, never -0.0 (see above), so it is widened without the add.
template <bool START = false, typename A, typename T, int V, typename P>
__device__ __forceinline__ void add_chosen(A (&sum)[V], const PairChoice<T, V>& cell, P place) {
    const unsigned spread = spread_place(static_cast<unsigned>(place));
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
        const unsigned w = chosen_word(cell, k, spread);
        T two[2];
        memcpy(two, &w, sizeof(w));
        // + (+0) where not chosen: the same sum (never -0)
        sum[2 * k] = START ? to_acc<A, T>(two[0]) : sum[2 * k] + to_acc<A, T>(two[0]);
        sum[2 * k + 1] = START ? to_acc<A, T>(two[1]) : sum[2 * k + 1] + to_acc<A, T>(two[1]);
    }
}

// add_chosen's first term of a sum just started (start_sum).
template <typename A, typename T, int V, typename P>
__device__ __forceinline__ void start_chosen(A (&sum)[V], const PairChoice<T, V>& cell, P place) {
    add_chosen<true>(sum, cell, place);
}
// The channel form's: its terms may be -0.0, which the add from 0 turns into +0.0.
template <typename A, typename T, typename I, int V>
__device__ __forceinline__ void start_chosen(A (&sum)[V], const CellChoice<T, I, V>& cell, I place) {
    start_sum(sum);
    add_chosen(sum, cell, place);
}

// One cell row's PairChoices of every thread of a block.
template <typename T, int V> struct PassedPairs {
    SlotWords<unsigned, V / 2, kMaxCellsThreads> places;
    SlotWords<T, V, kMaxCellsThreads> grads;
    __device__ __forceinline__ void put(int slot, const PairChoice<T, V>& c) {
        places.put(slot, c.places);
        grads.put(slot, c.grads);
    }
    __device__ __forceinline__ PairChoice<T, V> get(int slot) { return {places.get(slot), grads.get(slot)}; }
};

// The overlapping kernel's threads (see above): calls work(n, c, ch, chunk, valid, halo) once
// per (block of cell columns, chunk of cell rows, block of channels) this block owns, in every
// thread of the block alike; ``valid``: the thread has a cell column and channels; ``halo``:
// it is the halo's (column j0 - 1, scanned for its right neighbour only).
template <typename I, int V, typename Work>
__device__ __forceinline__ void for_each_block_of_columns(I depth, I out_cols, I columns, I column_blocks,
                                                          I row_chunks, I channel_blocks, unsigned out_cols_magic,
                                                          int out_cols_shift, Work&& work) {
    const I block_columns = static_cast<I>(blockDim.y) - 1;
    const bool halo = threadIdx.y == 0;
    for (I bz = blockIdx.z; bz < channel_blocks; bz += gridDim.z) {
        const I ch = (bz * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x)) * V;
        for (I by = blockIdx.y; by < row_chunks; by += gridDim.y) {
            for (I bx = blockIdx.x; bx < column_blocks; bx += gridDim.x) {
                const I j = bx * block_columns + static_cast<I>(threadIdx.y) - 1;  // the halo's: j0 - 1
                const bool valid = j >= 0 && j < columns && ch < depth;
                I n = 0;
                if (valid) {
                    if constexpr (sizeof(I) == 4) {
                        n = magic_divide(j, out_cols_magic, out_cols_shift);
                    } else {
                        n = j / out_cols;
                    }
                }
                work(n, j - n * out_cols, ch, by, valid, halo);
            }
        }
    }
}

}  // namespace fractional_max

template <typename T, typename I, int V, bool OVERLAP>
__global__ void fractional_max_pool_grad_cells(
    const T* __restrict__ orig_input, const T* __restrict__ orig_output, const T* __restrict__ out_backprop,
    T* __restrict__ in_backprop, int* __restrict__ mismatch, const I* __restrict__ row_bounds,
    const I* __restrict__ col_bounds, I in_rows, I in_cols, I depth, I out_rows, I out_cols, I columns,
    I column_blocks, I row_chunks, I channel_blocks, unsigned out_cols_magic, int out_cols_shift, int chunk_rows) {
    using namespace fractional_max;
    typedef typename Acc<T>::type A;
    const I in_row = in_cols * depth;
    const I o_row = out_cols * depth;
    const T zero = from_acc<T, A>(A(0));
    if constexpr (!OVERLAP) {
        fractional_cells::for_each_cell_column<I, V>(
            depth, out_rows, out_cols, columns, column_blocks, row_chunks, channel_blocks, out_cols_magic,
            out_cols_shift, chunk_rows, [&](const I n, const I c, const I ch, const I r0, const I r1) {
                const I col_first = col_bounds[c], cols = col_bounds[c + 1] - col_first;
                // Element (y, x) of the cell in row r is at x_column + (row_bounds[r] + y) * in_row + x * depth.
                const I x_column = (n * in_rows * in_cols + col_first) * depth + ch;
                const I o_column = (n * out_rows * out_cols + c) * depth + ch;
#pragma unroll 1
                for (I r = r0; r < r1; ++r) {
                    const I y0 = row_bounds[r], rows = row_bounds[r + 1] - y0;
                    const I first = x_column + y0 * in_row;
                    // (loaded before the scan: independent of it, so their round trip overlaps its first row's)
                    const I o = o_column + r * o_row;
                    const Pack<T, V> maxima = load_pack<V>(orig_output + o);
                    const Pack<T, V> grads = load_pack<V>(out_backprop + o);
                    Pack<I, V> best;
                    const bool differs = scan_cell<T, V>(orig_input, first, rows, cols, in_row, depth, maxima, best);
                    if (differs) mismatch[0] = 1;  // as select's flag
                    T chosen[V];
#pragma unroll
                    for (int u = 0; u < V; ++u) chosen[u] = from_acc<T, A>(A(0) + to_acc<A, T>(grads.v[u]));
                    I place = 0;  // of (y, 0) in the cell's scan
#pragma unroll 1
                    for (I y = 0; y < rows; ++y, place += cols) {
                        T* const dx = in_backprop + first + y * in_row;
#pragma unroll 1
                        for (I x = 0; x < cols; ++x) {
                            Pack<T, V> out;
#pragma unroll
                            for (int u = 0; u < V; ++u) out.v[u] = best.v[u] == place + x ? chosen[u] : zero;
                            store_pack<V>(dx + x * depth, out);
                        }
                    }
                }
            });
    } else {
        // Each thread's choices of its last three cell rows, for its right neighbour (row r) and
        // for itself and its right neighbour as the row above (row r - 1): row r's slot is
        // written again at row r + 3, after the barrier of row r + 2, which every thread passes
        // only after its reads of rows r and r - 1 (at rows r and r + 1).
        // The half types where the GPU compares them in pairs pass and write their choices in pairs.
        constexpr bool kPairs = kPairScan<T, V>;
        typedef typename Select<kPairs, PairChoice<T, V>, CellChoice<T, I, V>>::type Choice;
        typedef typename Select<kPairs, PassedPairs<T, V>, PassedRow<T, I, V>>::type Passed;
        __shared__ Passed passed[3];
        const int slot = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
        const int left_slot = slot - static_cast<int>(blockDim.x);
        for_each_block_of_columns<I, V>(
            depth, out_cols, columns, column_blocks, row_chunks, channel_blocks, out_cols_magic, out_cols_shift,
            [&](const I n, const I c, const I ch, const I chunk, const bool valid, const bool halo) {
                const I r0 = chunk * chunk_rows;
                const I r1 = min(r0 + chunk_rows, out_rows);
                const bool has_left = valid && !halo && c > 0;
                I col_first = 0, cols = 0, width = 0, left_width = 0;
                if (valid) {
                    col_first = col_bounds[c];
                    cols = col_bounds[c + 1] - col_first;
                    width = cols + (c + 1 < out_cols);  // the cell's columns: its region's and the next one's first
                }
                if (has_left) left_width = col_first - col_bounds[c - 1] + 1;  // it takes column col_first
                // Kept, not recomputed: left to itself, ptxas redid this math (and the split of the
                // cell column into n and c) twice in every cell row rather than hold two registers:
                // 36 of the 371 instructions of a cell row (sm_90, float16), 19 of 245 (float32).
                const I x_column = opaque_value((n * in_rows * in_cols + col_first) * depth + ch);
                const I o_column = opaque_value((n * out_rows * out_cols + c) * depth + ch);
                int buffer = 0, above = 2;  // passed[] of rows r and r - 1
                Pack<T, V> held[kCarryCols];  // the last row scanned, which is the next cell's first
                bool have_held = false;
                // Each cell row's first input row is the previous one's end, carried: one bound loaded
                // a cell row, and the row above's first (for height_above) taken from a register
                // rather than loaded again after the barrier, where its wait held up the writes.
                const I r_first = r0 > 0 ? r0 - 1 : r0;
                I y0 = valid ? row_bounds[r_first] : I(0), y0_above = 0;
#pragma unroll 1
                for (I r = r_first; r < r1; ++r, above = buffer, buffer = buffer == 2 ? 0 : buffer + 1) {
                    const bool writes = r >= r0 && !halo;  // else a row above or the halo: scanned only
                    const I y_end = valid ? row_bounds[r + 1] : I(0), rows = y_end - y0;
                    const I height = rows + (r + 1 < out_rows);  // the cell's rows: its region's and the next one's first
                    const I first = x_column + y0 * in_row;
                    const I o = o_column + r * o_row;
                    Choice own{};
                    if (valid) {
                        // (loaded before the scan: independent of it, so their round trip overlaps its first row's)
                        const Pack<T, V> maxima = load_pack<V>(orig_output + o);
                        const Pack<T, V> grads = load_pack<V>(out_backprop + o);
                        bool differs;
                        if constexpr (kPairs) {
                            own.grads = plus_zero(grads);
                            differs = scan_cell_holding<T, V>(orig_input, first, height, width, in_row, depth, maxima,
                                                              own.places, held, have_held);
                        } else {
                            own.grads = grads;
                            differs = scan_cell_holding<T, V>(orig_input, first, height, width, in_row, depth, maxima,
                                                              own.best, held, have_held);
                        }
                        if (differs && writes) mismatch[0] = 1;  // as select's flag
                        passed[buffer].put(slot, own);
                    }
                    __syncthreads();  // the neighbours' choices of row r are in passed[buffer]
                    if (valid && writes) {
                        // Cells (r - 1, c - 1), (r - 1, c) and (r, c - 1) share this region's first
                        // element, the first also the rest of its first row and the second the rest
                        // of its first column; its other elements lie in this cell only.  Each part
                        // reads the neighbours it needs from passed[] where it starts, so at most one
                        // neighbour's choices are in registers at a time (all three at once: 119
                        // registers, 16 warps an SM on sm_90 for float16).
                        const bool has_up = r > 0;
                        // (r > r0 - 1: this thread's previous iteration was row r - 1)
                        const I height_above = has_up ? y0 - y0_above + 1 : I(0);
                        const I up_first = (height_above - 1) * width;  // in the scan of the cell above
                        T* const dx = in_backprop + first;
                        {
                            A sum[V];
                            if (has_up && has_left) {
                                start_chosen(sum, passed[above].get(left_slot), height_above * left_width - 1);
                            } else {
                                start_sum(sum);
                            }
                            if (has_up) add_chosen(sum, passed[above].get(slot), up_first);
                            if (has_left) add_chosen(sum, passed[buffer].get(left_slot), left_width - 1);
                            add_chosen(sum, own, I(0));
                            store_pack<V>(dx, rounded<T>(sum));
                        }
                        if constexpr (kPairs) {
                            if (cols > 1) {
                                const Choice up = has_up ? passed[above].get(slot) : no_pair_choice<T, V>();
#pragma unroll 1
                                for (I x = 1; x < cols; ++x)
                                    store_pack<V>(dx + x * depth, two_cells(up, up_first + x, own, x));
                            }
                            if (rows > 1) {
                                const Choice left = has_left ? passed[buffer].get(left_slot) : no_pair_choice<T, V>();
                                I place = width;  // of (y, 0) in the cell's scan
                                I left_place = 2 * left_width - 1;  // of (y, 0) in the left neighbour's scan
#pragma unroll 1
                                for (I y = 1; y < rows; ++y, place += width, left_place += left_width) {
                                    T* const dx_row = dx + y * in_row;
                                    store_pack<V>(dx_row, two_cells(left, left_place, own, place));
#pragma unroll 1
                                    for (I x = 1; x < cols; ++x)
                                        store_pack<V>(dx_row + x * depth, one_cell(own, place + x));
                                }
                            }
                        } else {
                            if (cols > 1) {
                                const CellChoice<T, I, V> up = has_up ? passed[above].get(slot) : no_choice<T, I, V>();
#pragma unroll 1
                                for (I x = 1; x < cols; ++x) {
                                    A sum[V];
                                    start_sum(sum);
                                    add_chosen(sum, up, up_first + x);
                                    add_chosen(sum, own, x);
                                    store_pack<V>(dx + x * depth, rounded<T>(sum));
                                }
                            }
                            if (rows > 1) {
                                const CellChoice<T, I, V> left = has_left ? passed[buffer].get(left_slot) : no_choice<T, I, V>();
                                T chosen[V];
#pragma unroll
                                for (int u = 0; u < V; ++u) chosen[u] = from_acc<T, A>(A(0) + to_acc<A, T>(own.grads.v[u]));
                                I place = width;  // of (y, 0) in the cell's scan
                                I left_place = 2 * left_width - 1;  // of (y, 0) in the left neighbour's scan
#pragma unroll 1
                                for (I y = 1; y < rows; ++y, place += width, left_place += left_width) {
                                    T* const dx_row = dx + y * in_row;
                                    A sum[V];
                                    start_sum(sum);
                                    add_chosen(sum, left, left_place);
                                    add_chosen(sum, own, place);
                                    store_pack<V>(dx_row, rounded<T>(sum));
#pragma unroll 1
                                    for (I x = 1; x < cols; ++x) {
                                        Pack<T, V> out;
#pragma unroll
                                        for (int u = 0; u < V; ++u) out.v[u] = own.best.v[u] == place + x ? chosen[u] : zero;
                                        store_pack<V>(dx_row + x * depth, out);
                                    }
                                }
                            }
                        }
                    }
                    y0_above = y0;
                    y0 = y_end;
                }
                __syncthreads();  // the last row's slots are read before the next block of columns writes them
            });
    }
}

}  // namespace gradops
