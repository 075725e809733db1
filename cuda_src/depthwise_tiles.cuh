// Pieces shared by the tiled depthwise kernels (input gradient and filter gradient): the
// channel block of one CTA, one thread's lane of it, and 16-byte loads widened to accumulators.
// A staged position holds kPositionBytes of accumulators (one 128-byte shared-memory row, all
// 32 banks); a thread reads kLaneBytes of it, so the 16 lanes of a half-warp read one position
// without a bank conflict.
#pragma once

#include "gradops_common.cuh"

namespace gradops {
namespace dwconv {

// Bytes of accumulators per staged position: one 128-byte shared-memory row (32 banks).
inline constexpr int kPositionBytes = 128;
// Global loads of the vector paths.
inline constexpr int kVectorBytes = 16;
// Bytes of accumulators one thread reads per staged position: 2 float or 1 double channels.
inline constexpr int kLaneBytes = 8;

template <typename Acc> struct Block {
    static constexpr int CHANNELS = kPositionBytes / static_cast<int>(sizeof(Acc));  // 32 float, 16 double
    static constexpr int V = kLaneBytes / static_cast<int>(sizeof(Acc));             // channels per thread
    static constexpr int LANES = CHANNELS / V;                                         // 16
};

// The V channels of one thread at one position: one 8-byte shared-memory access.
template <typename Acc> struct alignas(kLaneBytes) Lane {
    Acc v[kLaneBytes / sizeof(Acc)];
};

template <typename T> struct TwoOf;
template <> struct TwoOf<__half> { using type = __half2; };
template <> struct TwoOf<__nv_bfloat16> { using type = __nv_bfloat162; };
__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }

// The raw type of a chunk of BYTES bytes (one load and one store of a staging step).
template <int BYTES> struct ChunkOf;
template <> struct ChunkOf<2> { using type = unsigned short; };
template <> struct ChunkOf<4> { using type = unsigned; };
template <> struct ChunkOf<8> { using type = uint2; };
template <> struct ChunkOf<16> { using type = uint4; };

// One vector load of V from global memory at p, which must be aligned to sizeof(V): a GPU
// faults on a misaligned vector access; the host model (which a CPU would not fault) checks, and
// counts the sectors of each warp-level load where a test asks (tests/cuda_host_runtime.h,
// count_global_load; its call site tells one load instruction from another).
#ifdef GRADOPS_HOST_MODEL
template <typename V>
__device__ __forceinline__ V load_vector(const V* p, const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    gradops_host::check_vector_alignment(p, sizeof(V));
    gradops_host::count_global_load(p, static_cast<int>(sizeof(V)), file, line);
    return *p;
}
#else
template <typename V> __device__ __forceinline__ V load_vector(const V* p) { return *p; }
#endif

// Where channel offset k of a staged position lies in the tiled kernels' swizzled channel-inner
// tiles (both gradients; "Swizzle" in the input gradient's source): k ^ 4 in an odd position.
__device__ __forceinline__ int swizzled(int k, bool odd) { return odd ? k ^ 4 : k; }

// 16 bytes of T (one vector load) widened to accumulators.
template <typename T> struct VectorSize {
    static constexpr int value = kVectorBytes / static_cast<int>(sizeof(T));
};
template <typename T, typename Acc>
__device__ __forceinline__ void widen(const uint4& raw, Acc (&out)[VectorSize<T>::value]) {
    if constexpr (sizeof(T) == sizeof(Acc)) {  // float, double: the bits as they are
        const Acc* v = reinterpret_cast<const Acc*>(&raw);
#pragma unroll
        for (int u = 0; u < VectorSize<T>::value; ++u) out[u] = v[u];
    } else {  // __half, __nv_bfloat16: four pairs
        const typename TwoOf<T>::type* h = reinterpret_cast<const typename TwoOf<T>::type*>(&raw);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float2 f = to_float2(h[u]);
            out[2 * u] = f.x;
            out[2 * u + 1] = f.y;
        }
    }
}

// N accumulators to 16-byte aligned shared memory, 16 bytes per store.
template <typename Acc, int N> __device__ __forceinline__ void store16(Acc* dst, const Acc (&v)[N]) {
    if constexpr (sizeof(Acc) == 4) {
#pragma unroll
        for (int u = 0; u < N; u += 4)
            reinterpret_cast<float4*>(dst)[u / 4] = make_float4(v[u], v[u + 1], v[u + 2], v[u + 3]);
    } else {
#pragma unroll
        for (int u = 0; u < N; u += 2) reinterpret_cast<double2*>(dst)[u / 2] = make_double2(v[u], v[u + 1]);
    }
}

// Element j of both 16-byte chunks of two neighbouring positions (8 two-byte elements each) as one
// word, the first position's in the low half: a transpose of NHWC chunks into channel planes stores
// a plane's two columns at once.
// One byte permute (PRMT): bytes 0, 1 of a's word and of b's (0x5410), or bytes 2, 3 of each (0x7632).
__device__ __forceinline__ unsigned pair_word(const uint4 (&pair)[2], int j) {
    const unsigned a[4] = {pair[0].x, pair[0].y, pair[0].z, pair[0].w};
    const unsigned b[4] = {pair[1].x, pair[1].y, pair[1].z, pair[1].w};
    return __byte_perm(a[j / 2], b[j / 2], j % 2 == 0 ? 0x5410u : 0x7632u);
}

}  // namespace dwconv
}  // namespace gradops
