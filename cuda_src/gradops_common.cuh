// Shared device helpers for gradops' kernels: element/accumulator conversion, the one
// thread-index convention, and layout-aware 4-D offsets.  Every kernel file includes this.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace gradops {

// Tensors can exceed 2^31 elements: index_t is 64-bit (kernels with a 32-bit variant for
// smaller tensors take their index type as a template parameter).
typedef long long index_t;

// The value of x, opaque to the optimiser: it can neither fold what it knows of x into the math
// that follows nor recompute x where that math needs it instead of keeping it in a register.
// Kernels pass index math through it to choose where that math happens (their comments say why).
// A pointer through it is no longer known to be global and read-only, so loads through it say so
// (igemm's load_readonly: ld.global.nc, as for a restrict input; a generic load otherwise).
// (The host model's compiler takes "r" for 64-bit values too.)
// (Not named opaque: the texts of measured revisions that tests compile against today's headers,
// e.g. the depthwise input kernel at d2276ad, define an opaque of their own in a namespace they
// open with a using-directive, where a second one would be ambiguous.)
__device__ __forceinline__ int opaque_value(int x) {
    asm volatile("" : "+r"(x));
    return x;
}
__device__ __forceinline__ long long opaque_value(long long x) {
#ifdef __CUDA_ARCH__
    asm volatile("" : "+l"(x));
#else
    asm volatile("" : "+r"(x));
#endif
    return x;
}
template <typename P> __device__ __forceinline__ P* opaque_value(P* x) {
#ifdef __CUDA_ARCH__
    asm volatile("" : "+l"(x));
#else
    asm volatile("" : "+r"(x));
#endif
    return x;
}

// X if B, else Y (std::conditional, which NVRTC's headers need not provide).
template <bool B, class X, class Y> struct Select { using type = X; };
template <class X, class Y> struct Select<false, X, Y> { using type = Y; };

// ---------------------------------------------------------------- element <-> accumulator
// Half types are widened to float for arithmetic and rounded (to nearest even) on store.
template <typename Acc, typename T> __device__ __forceinline__ Acc to_acc(T x) { return static_cast<Acc>(x); }
template <> __device__ __forceinline__ float to_acc<float, __half>(__half x) { return __half2float(x); }
template <> __device__ __forceinline__ float to_acc<float, __nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// __bfloat162float's value (NaNs included) built from the bits, bfloat16 being float's upper
// half.  NVRTC 13.5 for sm_90 kept __bfloat162float's widened packs live next to their loads in
// the fractional pooling kernels (select 93 registers where float16 takes 66, avg's gather 96
// against 80); with this, 68 and 80.  Not to_acc's form: elsewhere it lengthened the bfloat16
// convolutions' main loops and cost some depthwise kernels occupancy (SASS, 2026-11-29).
__device__ __forceinline__ float bfloat16_bits_to_float(__nv_bfloat16 x) {
    return __uint_as_float(static_cast<unsigned>(__bfloat16_as_ushort(x)) << 16);
}

template <typename T, typename Acc> __device__ __forceinline__ T from_acc(Acc x) { return static_cast<T>(x); }
template <> __device__ __forceinline__ __half from_acc<__half, float>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16, float>(float x) { return __float2bfloat16_rn(x); }

// An out-of-line device function (a rare path kept out of a kernel's steady-state code); the
// host build (tests/cuda_host.py, g++) has no __noinline__ and inlines as it likes.
#if defined(__CUDACC__)
#define GRADOPS_NOINLINE __noinline__
#else
#define GRADOPS_NOINLINE
#endif

// ---------------------------------------------------------------- thread indexing
// Elementwise kernels use a 1-D grid-stride loop over a 64-bit linear index, so any grid
// size (the host caps it, see _runtime.launch_1d) covers any tensor size.
#define GRADOPS_GRID_STRIDE_LOOP(i, n)                                                        \
    for (::gradops::index_t i = static_cast<::gradops::index_t>(blockIdx.x) * blockDim.x + threadIdx.x; \
         i < (n); i += static_cast<::gradops::index_t>(blockDim.x) * gridDim.x)

__host__ __device__ __forceinline__ index_t ceil_div(index_t a, index_t b) { return (a + b - 1) / b; }

// n / divisor for 0 <= n < 2^31 as (n * magic) >> shift, with the host's constants
// (gradops/backends/cuda/_runtime.py: division_magic): a multiply and a shift, not a division.
__device__ __forceinline__ int magic_divide(int n, unsigned magic, int shift) {
    return static_cast<int>((static_cast<unsigned long long>(static_cast<unsigned>(n)) * magic) >> shift);
}

// Floor division for a possibly negative numerator and positive divisor.
__host__ __device__ __forceinline__ index_t floor_div(index_t a, index_t b) {
    return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// ---------------------------------------------------------------- layouts
// Compile-time data_format: kernels are instantiated once per layout, so the offset
// arithmetic folds to constants instead of branching per element.
enum Layout { NHWC = 0, NCHW = 1 };

template <int L> struct Tensor4 {
    index_t rows, cols, depth;
    __device__ __forceinline__ index_t offset(index_t n, index_t y, index_t x, index_t c) const {
        return L == NHWC ? ((n * rows + y) * cols + x) * depth + c
                         : ((n * depth + c) * rows + y) * cols + x;
    }
    // Split a linear index in this layout's memory order into (n, y, x, c).
    __device__ __forceinline__ void coords(index_t i, index_t& n, index_t& y, index_t& x, index_t& c) const {
        if (L == NHWC) {
            c = i % depth; i /= depth;
            x = i % cols;  i /= cols;
            y = i % rows;  n = i / rows;
        } else {
            x = i % cols;  i /= cols;
            y = i % rows;  i /= rows;
            c = i % depth; n = i / depth;
        }
    }
};

}  // namespace gradops
