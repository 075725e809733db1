// Ampere-class warp-level tensor-core and asynchronous-copy primitives as device functions with
// inline PTX: ldmatrix, mma.sync (m16n8k16 and m16n8k8 f16/bf16, m16n8k8 TF32), the TF32 rounding its
// callers apply, cp.async (16 bytes, zero-fill), a 16-byte shared-memory store and a 4-byte
// shared-memory load (plain and volatile).  Each function follows one section of NVIDIA's "Parallel Thread Execution ISA"
// document, cited below by section title (section numbers move between ISA versions).
//
// Fragments are plain 32-bit registers (``unsigned``): a ``.b16`` pair packs the element at the
// lower address / lower column index in the low half, as the ISA specifies for .f16x2/.bf16x2.
// Which (row, col) of a matrix each lane's register holds is the ISA's, and nothing in these
// functions re-arranges it; the layouts are restated next to each function so that a caller
// can derive its addressing without the ISA at hand.
//
// The host execution model (tests/cuda_host_runtime.h, which defines GRADOPS_HOST_MODEL) defines
// the same functions for the CPU with exact lane ownership (each lane passes only its own
// registers; the warp exchanges them through an emulated crossbar between two __syncwarp
// barriers), so the real kernels using them run in the CPU tests.  tests/test_tensor_core_ptx.py
// checks the emulation against the ISA's fragment tables written out independently.
//
// Architectures: mma.sync.m16n8k16 with f16/bf16 inputs, m16n8k8 TF32 and cp.async need sm_80;
// this header defines them only where GRADOPS_HAS_MMA_SM80 holds (st_shared_16, st_shared_16_if,
// ld_shared_32, ld_shared_32_volatile and ld_shared_16 everywhere).  sm_70/sm_75 builds keep the
// WMMA and SIMT paths of igemm_tiles.cuh (_conv_igemm.math_kinds decides per dtype and arch which
// math kinds are instantiated; which primitives a kind uses is decided here, by GRADOPS_ARCH).
#pragma once

// The architecture being compiled, for the tensor-core paths: NVRTC defines __CUDA_ARCH__; the
// host execution model (tests/cuda_host.py) does not and emulates every tensor-core path, so it
// counts as the newest architecture, unless it poses as an older GPU (GRADOPS_HOST_ARCH, e.g.
// 750, so that the CPU tests also run the WMMA path that sm_70/sm_75 get).
#if defined(__CUDA_ARCH__)
#define GRADOPS_ARCH __CUDA_ARCH__
#elif defined(GRADOPS_HOST_ARCH)
#define GRADOPS_ARCH GRADOPS_HOST_ARCH
#else
#define GRADOPS_ARCH 100000
#endif
// The compiler's major version (NVRTC defines __CUDACC_VER_MAJOR__: 12 for the cuda12 extra, 13
// for cuda13), for register budgets that one ptxas meets and another does not; the host model
// counts as the newest.
#if defined(__CUDACC_VER_MAJOR__)
#define GRADOPS_CUDACC_MAJOR __CUDACC_VER_MAJOR__
#else
#define GRADOPS_CUDACC_MAJOR 99
#endif
// ldmatrix exists from sm_75, but m16n8k16 with f32 accumulation on f16/bf16, m16n8k8 TF32
// and cp.async all need sm_80: the primitives come as one set.
#define GRADOPS_HAS_MMA_SM80 (GRADOPS_ARCH >= 800)

namespace gradops {
namespace ptx {

#if defined(__CUDA_ARCH__)
// A shared-memory address in the .shared state space (32 bits), as ldmatrix, cp.async and
// st.shared take it: a generic pointer to __shared__ memory is converted, not truncated.
__device__ __forceinline__ unsigned shared_address(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// PTX ISA, "Data Movement and Conversion Instructions: st": st.shared.v4.b32, one 16-byte store
// to shared memory (STS.128), from 16 bytes at src (16-byte aligned, as dst).  What a uint4
// assignment compiles to; a function so that the host model can count the bank wavefronts of
// each warp-level store.
__device__ __forceinline__ void st_shared_16(void* dst, const void* src) {
    const uint4 v = *static_cast<const uint4*>(src);
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(shared_address(dst)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}

// st_shared_16 under a predicate (PTX ISA, "Instruction Statements: Predicated Execution"):
// one STS.128 whose lanes store where ``store`` holds, the address computed either way, where an
// if around st_shared_16 compiled to a branch per store, each recomputing the address.
__device__ __forceinline__ void st_shared_16_if(void* dst, const void* src, bool store) {
    const uint4 v = *static_cast<const uint4*>(src);
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n@p st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n}\n"
                 :: "r"(shared_address(dst)), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(static_cast<int>(store))
                 : "memory");
}

// PTX ISA, "Data Movement and Conversion Instructions: ld": ld.shared.b32, one 4-byte load from
// shared memory (LDS.32; src 4-byte aligned), as raw bits.  A function so that the host model
// counts the bank wavefronts of each warp-level load (the TF32 fragments that ldmatrix cannot
// transpose); volatile with a memory clobber, as the stores and cp.async waits around it are.
__device__ __forceinline__ unsigned ld_shared_32(const void* src) {
    unsigned v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(shared_address(src)) : "memory");
    return v;
}

// PTX ISA, "Data Movement and Conversion Instructions: ld", .volatile: the same load, which the
// compiler may neither merge with another load of the same word nor repeat.  For a register
// that must hold a second copy of a value (one value in two mma operand pairs, which must each
// be an aligned register pair): from a plain load ptxas keeps one register and, where registers
// are reused inside a loop, copies it into the other pair on every iteration.
__device__ __forceinline__ unsigned ld_shared_32_volatile(const void* src) {
    unsigned v;
    asm volatile("ld.volatile.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(shared_address(src)) : "memory");
    return v;
}

// PTX ISA, "Data Movement and Conversion Instructions: ld": ld.shared.v4.f32, one 16-byte load
// from shared memory (LDS.128; src 16-byte aligned).  What a float4 dereference should compile
// to; NVVM (CUDA 12.9 and 13.x) sometimes turns some of those into a v4 load of which it uses 8
// bytes plus a v2 load of the other 8, differently from one compile to the next
// (benchmarks/README.md).  This one load is emitted as written, in every compile.
__device__ __forceinline__ float4 ld_shared_16(const void* src) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(shared_address(src)) : "memory");
    return v;
}
#endif

#if defined(__CUDA_ARCH__) && GRADOPS_HAS_MMA_SM80

// ---------------------------------------------------------------- ldmatrix
// PTX ISA, "Warp-level matrix load instruction: ldmatrix":
//   ldmatrix.sync.aligned.m8n8{.x1,.x2,.x4}{,.trans}.shared.b16
// Loads X (1, 2 or 4) 8x8 matrices of 16-bit elements.  Lane l supplies the address of row
// l % 8 of matrix l / 8 (lanes 0-7 for .x1, 0-15 for .x2, all 32 for .x4; the other lanes'
// addresses are ignored); each row is 16 contiguous bytes, 16-byte aligned.  Destination
// register d[i] of lane l holds matrix i's elements
//   without .trans: row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1;
//   with .trans:    rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4 (the matrix transposed).
// ``row`` is this lane's row address (a generic pointer into shared memory).
template <int X, bool TRANS>
__device__ __forceinline__ void ldmatrix(unsigned (&d)[X], const void* row) {
    static_assert(X == 1 || X == 2 || X == 4, "ldmatrix loads 1, 2 or 4 matrices");
    const unsigned a = shared_address(row);
    if constexpr (X == 1 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(a));
    else if constexpr (X == 1 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(d[0]) : "r"(a));
    else if constexpr (X == 2 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(d[0]), "=r"(d[1]) : "r"(a));
    else if constexpr (X == 2 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(d[0]), "=r"(d[1]) : "r"(a));
    else if constexpr (!TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(a));
}

// ---------------------------------------------------------------- mma.sync
// PTX ISA, "Multiply-and-Accumulate Instruction: mma", fragments in "Matrix Fragments for
// mma.m16n8k16 with floating point type" and "Matrix Fragments for mma.m16n8k8" (.f16/.bf16, .tf32).
// With groupID g = l / 4 and threadID_in_group t = l % 4 of lane l:
//   m16n8k16 .f16/.bf16 (A 16x16 row, B 16x8 col, C/D 16x8 f32):
//     a[r] (two elements, columns c and c + 1): row g + 8 (r % 2), column 2 t + 8 (r / 2);
//     b[r] (two elements, rows k and k + 1):    row (k) 2 t + 8 r, column (n) g;
//     c[r], d[r] (one float):                   row g + 8 (r / 2), column 2 t + r % 2.
//   m16n8k8 .f16/.bf16 (A 16x8 row, B 8x8 col; C/D as above): the first half of m16n8k16's
//     a[r] (r < 2): row g + 8 r, columns 2 t and 2 t + 1;  b[0]: rows 2 t and 2 t + 1, column g.
//   m16n8k8 .tf32 (A 16x8, B 8x8, one TF32 per register; C/D as above):
//     a[r]: row g + 8 (r % 2), column t + 4 (r / 2);   b[r]: row t + 4 r, column g.
// D = A B + C with f32 accumulation.  The order of the hardware's internal additions is not
// specified by the ISA, so callers must not rely on it beyond float accuracy.
template <typename T> struct MmaM16n8k16;  // defined for the two input types the ISA has
template <> struct MmaM16n8k16<__half> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                               const float (&c)[4]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    }
};
template <> struct MmaM16n8k16<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                               const float (&c)[4]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                       "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    }
};
// T: __half or __nv_bfloat16, the type of the elements packed in a and b.
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                             const float (&c)[4]) {
    MmaM16n8k16<T>::run(d, a, b, c);
}

// The m16n8k8 form of the same (half the products of m16n8k16, one issue slot as well).
template <typename T> struct MmaM16n8k8;
template <> struct MmaM16n8k8<__half> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    }
};
template <> struct MmaM16n8k8<__nv_bfloat16> {
    __device__ __forceinline__ static void run(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %8, %9, %10};\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(b), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
    }
};
template <typename T>
__device__ __forceinline__ void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]) {
    MmaM16n8k8<T>::run(d, a, b, c);
}

// TF32 inputs are 32-bit registers of which the tensor cores read the top 19 bits (sign,
// exponent, 10 mantissa bits); callers round with cvt.rna.tf32.f32 first (the project's TF32
// is opt-in, see gradops.options(allow_tf32=True)).
//
// PTX ISA, "Data Movement and Conversion Instructions: cvt": cvt.rna.tf32.f32 rounds a float to
// TF32 (10 mantissa bits, ties away from zero; the result is a 32-bit register whose low 13
// bits are zero); Inf and NaN stay Inf and NaN.  ``bits``: the float's bits, as ldmatrix and
// ld_shared_32 deliver them.
__device__ __forceinline__ unsigned round_tf32(unsigned bits) {
    unsigned out;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(out) : "f"(__uint_as_float(bits)));
    return out;
}

__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 const float (&c)[4]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}

// ---------------------------------------------------------------- cp.async
// PTX ISA, "Data Movement and Conversion Instructions: cp.async":
// cp.async.cg.shared.global [dst], [src], 16, src_size copies 16 bytes from global to shared
// memory asynchronously, caching in L2 only (.cg, which the ISA allows only with 16-byte copies:
// the operands are streamed through shared memory, L1 would only hold a second copy).  Only the
// first src_size bytes (0 or 16 here) are read and the rest of the 16 are zero-filled, so
// src_size = 0 writes a zero chunk without reading src (padding and out-of-range taps; src must
// still be a global address, callers pass the tensor's base).  dst and src 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool fill) {
    const unsigned src_size = fill ? 16u : 0u;  // bytes read from src; the rest of 16 are zeros
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(shared_address(dst)), "l"(src), "r"(src_size) : "memory");
}

// PTX ISA, "cp.async.commit_group": the thread's cp.async operations issued since the last
// commit become one group.
__device__ __forceinline__ void cp_async_commit_group() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// PTX ISA, "cp.async.wait_group / cp.async.wait_all": wait until at most N of the thread's
// most recently committed groups are still pending, i.e. every older group has landed.  Other
// threads see the data only after a barrier (__syncthreads) that follows their writers' waits.
template <int N> __device__ __forceinline__ void cp_async_wait_group() {
    static_assert(N >= 0, "wait_group takes a non-negative constant");
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

#elif !defined(__CUDA_ARCH__) && !defined(GRADOPS_HOST_MODEL)
// A host compiler pass (nvcc's host side) without the host execution model: declarations only,
// so device code that calls them parses; nothing on the host calls them.
template <int X, bool TRANS> void ldmatrix(unsigned (&d)[X], const void* row);
template <typename T> void mma_m16n8k16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                        const float (&c)[4]);
template <typename T> void mma_m16n8k8(float (&d)[4], const unsigned (&a)[2], unsigned b, const float (&c)[4]);
void mma_m16n8k8_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], const float (&c)[4]);
unsigned round_tf32(unsigned bits);
void cp_async_16(void* dst, const void* src, bool fill);
void cp_async_commit_group();
template <int N> void cp_async_wait_group();
void st_shared_16(void* dst, const void* src);
void st_shared_16_if(void* dst, const void* src, bool store);
unsigned ld_shared_32(const void* src);
unsigned ld_shared_32_volatile(const void* src);
float4 ld_shared_16(const void* src);
#endif
// (GRADOPS_HOST_MODEL: tests/cuda_host_runtime.h has defined them, emulated, before this header.)

}  // namespace ptx
}  // namespace gradops
