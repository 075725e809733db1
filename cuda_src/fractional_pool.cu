// The forward fractional poolings over given pooling sequences (TF's FractionalAvgPool and
// FractionalMaxPool draw their sequences; here they are arguments): the gradients' adjoints, and
// the forward a GPU caller needs for fractional_max_pool_grad's orig_output, which must be the
// maxima bit for bit.
//
// Shapes (NHWC only: TF's fractional pooling has no data_format):
//   value   [batch, in_rows, in_cols, depth]
//   output  [batch, out_rows, out_cols, depth]
// Cell tables (built once per geometry on the host, gradops/backends/cuda/fractional_pool.py;
// element type I, as the indices):
//   row_bounds [2 * out_rows]   first and last input row of each row cell (inclusive, clamped to
//                               the input as TF clamps them; an empty cell is (0, -1))
//   col_bounds [2 * out_cols]   the same for columns.
// Cells may overlap, repeat, stack or be empty: nothing here assumes a partition.
//
// What is computed, per output element (n, r, c, channel), over the cell's elements in TF's scan
// order (row by row, each row left to right):
// * fractional_avg_pool: a running sum from zero in Sum<T> (T itself; float for the half types;
//   unsigned for the integers, so that overflow wraps as TF's adds do, with no signed overflow),
//   divided by the cell's element count as a counter of that type reaches it (TF counts in T, one
//   increment an element: a float counter stops at 2^24, a double one at 2^53), by IEEE division
//   (integers truncate toward zero, as C++ divides), rounded to T once.  An empty cell gives 0.
// * fractional_max_pool: TF's running max from T's lowest value, `current < x ? x : current`, in a
//   type that orders T exactly (the half types widen exactly): NaN never replaces, an empty,
//   all-NaN or all -inf cell gives the lowest finite value, and of equal zeros the first keeps its
//   sign.  The result is one of the cell's values (or the lowest), so it is stored exactly.
// Both are gradops/backends/numpy_backend.py's results bit for bit.
//
// Work: fractional_cells.cuh's split (a thread per batch item, cell column and vector of V
// channels, down a chunk of cell rows), V = 16 bytes of channels where the depth and the arrays'
// alignment allow (else 1), so every load and store of a vector is one 16-byte access.  Each
// output element reads its cell once; with overlapping cells a row or column shared by two cells
// is read by both (the second read usually from L1 or L2).  I = int when every tensor and table has
// fewer than 2^31 elements, else long long.
#include "fractional_cells.cuh"  // includes gradops_common.cuh

namespace gradops {
namespace fractional_pool {

// V adjacent values of type X in one access (16-byte aligned at most).
template <typename X, int V> struct alignas(V * sizeof(X) < 16 ? V * sizeof(X) : 16) Pack {
    X v[V];
};
// A GPU faults on a misaligned vector access; the host model (whose CPU would not) checks.
template <int V, typename X> __device__ __forceinline__ Pack<X, V> load_pack(const X* p) {
#ifdef GRADOPS_HOST_MODEL
    gradops_host::check_vector_alignment(p, sizeof(Pack<X, V>));
#endif
    return *reinterpret_cast<const Pack<X, V>*>(p);
}
template <int V, typename X> __device__ __forceinline__ void store_pack(X* p, const Pack<X, V>& value) {
#ifdef GRADOPS_HOST_MODEL
    gradops_host::check_vector_alignment(p, sizeof(Pack<X, V>));
#endif
    *reinterpret_cast<Pack<X, V>*>(p) = value;
}

// The value a counter of float type F reaches after `count` increments from 0 (TF's count of a
// cell's elements): exact up to 2^digits, where adding 1 first rounds back (2^24 for float, 2^53
// for double), and stuck there after.
template <typename F> struct Counter;
template <> struct Counter<float> {
    template <typename I> __device__ __forceinline__ static float of(I count) {
        return count < I(1 << 24) ? static_cast<float>(count) : 16777216.0f;  // 2^24
    }
};
template <> struct Counter<double> {
    // A cell of 2^53 elements is past any memory: the count converts exactly.
    template <typename I> __device__ __forceinline__ static double of(I count) { return static_cast<double>(count); }
};

// The average's running sum: Sum::type holds it, add() adds one element, mean() divides by the
// cell's element count (as TF's counter of that type holds it) and rounds to T.
template <typename T> struct Sum {
    typedef T type;
    __device__ __forceinline__ static type add(type s, T x) { return s + x; }
    template <typename I> __device__ __forceinline__ static T mean(type s, I count) {
        return s / Counter<type>::of(count);
    }
};
template <> struct Sum<__half> {
    typedef float type;
    __device__ __forceinline__ static type add(type s, __half x) { return s + __half2float(x); }
    template <typename I> __device__ __forceinline__ static __half mean(type s, I count) {
        return __float2half_rn(s / Counter<float>::of(count));
    }
};
template <> struct Sum<__nv_bfloat16> {
    typedef float type;
    __device__ __forceinline__ static type add(type s, __nv_bfloat16 x) { return s + bfloat16_bits_to_float(x); }
    template <typename I> __device__ __forceinline__ static __nv_bfloat16 mean(type s, I count) {
        return __float2bfloat16_rn(s / Counter<float>::of(count));
    }
};
// Integers add as unsigned (wrapping, as TF's two's-complement adds do, without the undefined
// signed overflow) and divide as signed: C++'s division truncates toward zero, as TF's does.  The
// count fits T: the op refuses cells of more elements than T's maximum (TF's count would overflow).
template <typename T, typename U> struct IntegerSum {
    typedef U type;
    __device__ __forceinline__ static type add(type s, T x) { return s + static_cast<U>(x); }
    template <typename I> __device__ __forceinline__ static T mean(type s, I count) {
        return static_cast<T>(s) / static_cast<T>(count);
    }
};
template <> struct Sum<int> : IntegerSum<int, unsigned> {};
template <> struct Sum<long long> : IntegerSum<long long, unsigned long long> {};

// The running max: Max::type orders T's values exactly (the half types widen exactly), narrow()
// stores a value of T exactly, lowest() is T's lowest finite value (Eigen::NumTraits<T>::lowest(),
// where TF's maxima start).
template <typename T> struct Max {
    typedef T type;
    __device__ __forceinline__ static type widen(T x) { return x; }
    __device__ __forceinline__ static T narrow(type x) { return x; }
};
template <> struct Max<__half> {
    typedef float type;
    __device__ __forceinline__ static type widen(__half x) { return __half2float(x); }
    __device__ __forceinline__ static __half narrow(type x) { return __float2half_rn(x); }
};
template <> struct Max<__nv_bfloat16> {
    typedef float type;
    __device__ __forceinline__ static type widen(__nv_bfloat16 x) { return bfloat16_bits_to_float(x); }
    __device__ __forceinline__ static __nv_bfloat16 narrow(type x) { return __float2bfloat16_rn(x); }
};
template <typename T> __device__ __forceinline__ typename Max<T>::type lowest();
template <> __device__ __forceinline__ float lowest<__half>() { return -0x1.ffcp15f; }        // -65504
template <> __device__ __forceinline__ float lowest<__nv_bfloat16>() { return -0x1.fep127f; }  // -(2 - 2^-7) 2^127
template <> __device__ __forceinline__ float lowest<float>() { return -0x1.fffffep127f; }
template <> __device__ __forceinline__ double lowest<double>() { return -0x1.fffffffffffffp1023; }
template <> __device__ __forceinline__ int lowest<int>() { return -2147483647 - 1; }
template <> __device__ __forceinline__ long long lowest<long long>() { return -9223372036854775807LL - 1; }

// Columns of a cell's row whose loads issue together, before the first is used: a thread then
// waits for one memory round trip a row of up to 3 columns (what a pooling ratio below 2 makes,
// overlapping or not), not one a column.  The static model's latency-aware estimate
// (benchmarks/fractional_forward_prediction.py, predicted, not measured) of the fractional suite's
// 16 forward launches on an H200: geometric mean 44.7 us loading one column at a time, 37.0 with
// pairs, 36.1 with 3 (overlapping float32 1.84x faster for the average, 1.37x for the maximum;
// none more than 1.06x slower), 37.2 with 4 (48 registers: a sixth fewer resident warps).
inline constexpr int kColumnLoads = 3;

// Calls visit(value pack) for each element of cell (first_row .. last_row) x (first_col ..
// last_col) in TF's scan order; element (y, x) is at value + at + y * in_row + x * depth.
template <typename T, int V, typename I, typename Visit>
__device__ __forceinline__ void scan_cell(const T* __restrict__ value, I at, I first_row, I last_row, I first_col,
                                          I last_col, I in_row, I depth, Visit&& visit) {
#pragma unroll 1
    for (I y = first_row; y <= last_row; ++y) {
        const T* row = value + at + y * in_row + first_col * depth;
        I x = first_col;
#pragma unroll 1
        for (; last_col - x >= kColumnLoads - 1; x += kColumnLoads, row += kColumnLoads * depth) {
            Pack<T, V> packs[kColumnLoads];
#pragma unroll
            for (int k = 0; k < kColumnLoads; ++k) packs[k] = load_pack<V>(row + k * depth);
#pragma unroll
            for (int k = 0; k < kColumnLoads; ++k) visit(packs[k]);
        }
        // The row's last columns, fewer than kColumnLoads (all of a narrow cell's): loads guarded.
        const I rest = last_col - x + 1;
        Pack<T, V> packs[kColumnLoads - 1];
#pragma unroll
        for (int k = 0; k < kColumnLoads - 1; ++k)
            if (k < rest) packs[k] = load_pack<V>(row + k * depth);
#pragma unroll
        for (int k = 0; k < kColumnLoads - 1; ++k)
            if (k < rest) visit(packs[k]);
    }
}

// The two poolings as one kernel body's policy: Acc holds a channel's running value from
// start(), add() takes one of the cell's values in TF's scan order, and result() gives the output
// element from it and the cell's bounds (inclusive; an empty cell is (0, -1)).
template <typename T> struct AvgPool {
    typedef Sum<T> S;
    typedef typename S::type Acc;
    __device__ __forceinline__ static Acc start() { return Acc(0); }
    __device__ __forceinline__ static Acc add(Acc sum, T x) { return S::add(sum, x); }
    template <int V, typename I>
    __device__ __forceinline__ static Pack<T, V> result(const Acc (&sum)[V], I first_row, I last_row, I first_col,
                                                        I last_col) {
        // An empty cell scanned nothing: its sum 0 over a count of 1 is +0.
        const bool empty = last_row < first_row || last_col < first_col;
        const I count = empty ? I(1) : (last_row - first_row + 1) * (last_col - first_col + 1);
        Pack<T, V> mean;
#pragma unroll
        for (int u = 0; u < V; ++u) mean.v[u] = S::mean(sum[u], count);
        return mean;
    }
};
template <typename T> struct MaxPool {
    typedef Max<T> M;
    typedef typename M::type Acc;
    __device__ __forceinline__ static Acc start() { return lowest<T>(); }
    __device__ __forceinline__ static Acc add(Acc best, T value) {
        const Acc x = M::widen(value);
        if (best < x) best = x;  // TF's test: strictly greater, so NaN never replaces
        return best;
    }
    template <int V, typename I>
    __device__ __forceinline__ static Pack<T, V> result(const Acc (&best)[V], I, I, I, I) {
        Pack<T, V> maxima;
#pragma unroll
        for (int u = 0; u < V; ++u) maxima.v[u] = M::narrow(best[u]);
        return maxima;
    }
};

// Thread work (fractional_cells.cuh): V channels ch .. ch + V - 1 of output cells (n, r, c), r
// in r0 .. r1 - 1.
template <typename Pool, typename T, typename I, int V>
__device__ __forceinline__ void pool_cells(const T* __restrict__ value, T* __restrict__ output,
                                           const I* __restrict__ row_bounds, const I* __restrict__ col_bounds,
                                           I in_rows, I in_cols, I depth, I out_rows, I out_cols, I columns,
                                           I column_blocks, I row_chunks, I channel_blocks, unsigned out_cols_magic,
                                           int out_cols_shift, int chunk_rows) {
    const I in_row = in_cols * depth;
    const I out_row = out_cols * depth;
    fractional_cells::for_each_cell_column<I, V>(
        depth, out_rows, out_cols, columns, column_blocks, row_chunks, channel_blocks, out_cols_magic,
        out_cols_shift, chunk_rows, [&](const I n, const I c, const I ch, const I r0, const I r1) {
            const I first_col = col_bounds[2 * c], last_col = col_bounds[2 * c + 1];
            const I image = n * in_rows * in_row + ch;
            T* out = output + (n * out_rows + r0) * out_row + c * depth + ch;
#pragma unroll 1
            for (I r = r0; r < r1; ++r, out += out_row) {
                const I first_row = row_bounds[2 * r], last_row = row_bounds[2 * r + 1];
                typename Pool::Acc acc[V];
#pragma unroll
                for (int u = 0; u < V; ++u) acc[u] = Pool::start();
                scan_cell<T, V>(value, image, first_row, last_row, first_col, last_col, in_row, depth,
                                [&](const Pack<T, V>& p) {
#pragma unroll
                                    for (int u = 0; u < V; ++u) acc[u] = Pool::add(acc[u], p.v[u]);
                                });
                store_pack<V>(out, Pool::template result<V>(acc, first_row, last_row, first_col, last_col));
            }
        });
}

}  // namespace fractional_pool

template <typename T, typename I, int V>
__global__ void fractional_avg_pool(const T* __restrict__ value, T* __restrict__ output,
                                    const I* __restrict__ row_bounds, const I* __restrict__ col_bounds, I in_rows,
                                    I in_cols, I depth, I out_rows, I out_cols, I columns, I column_blocks,
                                    I row_chunks, I channel_blocks, unsigned out_cols_magic, int out_cols_shift,
                                    int chunk_rows) {
    fractional_pool::pool_cells<fractional_pool::AvgPool<T>, T, I, V>(
        value, output, row_bounds, col_bounds, in_rows, in_cols, depth, out_rows, out_cols, columns, column_blocks,
        row_chunks, channel_blocks, out_cols_magic, out_cols_shift, chunk_rows);
}

template <typename T, typename I, int V>
__global__ void fractional_max_pool(const T* __restrict__ value, T* __restrict__ output,
                                    const I* __restrict__ row_bounds, const I* __restrict__ col_bounds, I in_rows,
                                    I in_cols, I depth, I out_rows, I out_cols, I columns, I column_blocks,
                                    I row_chunks, I channel_blocks, unsigned out_cols_magic, int out_cols_shift,
                                    int chunk_rows) {
    fractional_pool::pool_cells<fractional_pool::MaxPool<T>, T, I, V>(
        value, output, row_bounds, col_bounds, in_rows, in_cols, depth, out_rows, out_cols, columns, column_blocks,
        row_chunks, channel_blocks, out_cols_magic, out_cols_shift, chunk_rows);
}

}  // namespace gradops
