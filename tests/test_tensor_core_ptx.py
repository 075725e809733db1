"""The host emulation of cuda_src/tensor_core_ptx.cuh (ldmatrix, mma.sync, cp.async) against
the PTX ISA.

The fragment layouts are written out here a second time, from the ISA's tables ("Warp-level
matrix load instruction: ldmatrix", "Matrix Fragments for mma.m16n8k16 with floating point
type", "Matrix Fragments for mma.m16n8k8"), as Python functions of (lane, register) that the
tests use to pack operands and unpack results.  A layout error in the emulation then shows as a
mismatch against these tables instead of cancelling out between two emulated primitives.  On
top of that, a whole 16x8x16 GEMM through cp.async + ldmatrix + mma is compared with NumPy in
every operand layout, and copies of that kernel with one deliberate misuse each (a wrong
``.trans``, lanes addressing the wrong x4 matrix, a missing ``wait_group``, swapped B
registers) must give a wrong answer.
"""

from __future__ import annotations

import importlib
import shutil

import numpy as np
import pytest

import cuda_host
import gradops
from conftest import random_array
from conv_cases import NO_PADS, conv_geometry

pytestmark = pytest.mark.skipif(cuda_host.unavailable_reason() is not None,
                                reason=f"no host build: {cuda_host.unavailable_reason()}")


# --------------------------------------------------------------------------- the ISA's tables
def ldmatrix_element(lane: int, matrix: int, half: int, trans: bool) -> tuple[int, int]:
    """(row, column) of matrix ``matrix`` that half ``half`` (0: low 16 bits) of lane ``lane``'s
    destination register ``matrix`` holds: without .trans lane l holds row l/4, columns 2(l%4)
    and 2(l%4)+1; .trans delivers the transposed matrix."""
    del matrix  # every matrix has the same layout, in its own register
    row, col = lane // 4, 2 * (lane % 4) + half
    return (col, row) if trans else (row, col)


def m16n8k16_a(lane: int, reg: int, half: int) -> tuple[int, int]:
    """A (16x16, row): a_i, i = 2 reg + half, is at row groupID (+8 for i in 2,3,6,7) and column
    threadID_in_group * 2 + (i & 1) (+8 for i >= 4)."""
    i = 2 * reg + half
    group, thread = lane >> 2, lane % 4
    row = group + (8 if i in (2, 3, 6, 7) else 0)
    col = thread * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def m16n8k16_b(lane: int, reg: int, half: int) -> tuple[int, int]:
    """B (16x8, col): b_i, i = 2 reg + half, is at row (k) threadID_in_group * 2 + (i & 1)
    (+8 for i >= 2) and column (n) groupID."""
    i = 2 * reg + half
    group, thread = lane >> 2, lane % 4
    return thread * 2 + (i & 1) + (8 if i >= 2 else 0), group


def m16n8_c(lane: int, reg: int) -> tuple[int, int]:
    """C/D (16x8, f32): c_i is at row groupID (+8 for i >= 2), column threadID_in_group * 2 + (i & 1)."""
    group, thread = lane >> 2, lane % 4
    return group + (8 if reg >= 2 else 0), thread * 2 + (reg & 1)


def m16n8k8_a(lane: int, reg: int, half: int) -> tuple[int, int]:
    """A (16x8, row, .f16/.bf16): a_i, i = 2 reg + half, is at row groupID (+8 for i = 2, 3) and
    column threadID_in_group * 2 + (i & 1)."""
    i = 2 * reg + half
    group, thread = lane >> 2, lane % 4
    return group + (8 if i >= 2 else 0), thread * 2 + (i & 1)


def m16n8k8_b(lane: int, half: int) -> tuple[int, int]:
    """B (8x8, col, .f16/.bf16): b_i, i = half of the one register, is at row (k)
    threadID_in_group * 2 + i and column (n) groupID."""
    group, thread = lane >> 2, lane % 4
    return thread * 2 + half, group


def m16n8k8_tf32_a(lane: int, reg: int) -> tuple[int, int]:
    """A (16x8, tf32): a_i at row groupID (+8 for i = 1, 3), column threadID_in_group (+4 for i >= 2)."""
    group, thread = lane >> 2, lane % 4
    return group + (8 if reg in (1, 3) else 0), thread + (4 if reg >= 2 else 0)


def m16n8k8_tf32_b(lane: int, reg: int) -> tuple[int, int]:
    """B (8x8, tf32): b_i at row (k) threadID_in_group (+4 for i = 1), column (n) groupID."""
    group, thread = lane >> 2, lane % 4
    return thread + (4 if reg == 1 else 0), group


def test_the_tables_cover_each_fragment_once():
    """Each table maps the 32 lanes' registers onto every element of its matrix exactly once."""
    def covered(cells, shape):
        grid = np.zeros(shape, int)
        for r, c in cells:
            grid[r, c] += 1
        return np.all(grid == 1)

    lanes = range(32)
    assert covered([m16n8k16_a(l, r, h) for l in lanes for r in range(4) for h in range(2)], (16, 16))
    assert covered([m16n8k16_b(l, r, h) for l in lanes for r in range(2) for h in range(2)], (16, 8))
    assert covered([m16n8_c(l, r) for l in lanes for r in range(4)], (16, 8))
    assert covered([m16n8k8_a(l, r, h) for l in lanes for r in range(2) for h in range(2)], (16, 8))
    assert covered([m16n8k8_b(l, h) for l in lanes for h in range(2)], (8, 8))
    assert covered([m16n8k8_tf32_a(l, r) for l in lanes for r in range(4)], (16, 8))
    assert covered([m16n8k8_tf32_b(l, r) for l in lanes for r in range(2)], (8, 8))
    for trans in (False, True):
        assert covered([ldmatrix_element(l, 0, h, trans) for l in lanes for h in range(2)], (8, 8))


# --------------------------------------------------------------------------- kernels
KERNELS = r"""
#include "gradops_common.cuh"
#include "tensor_core_ptx.cuh"
using namespace gradops::ptx;

// One warp: ldmatrix.xX of a 64-row shared tile with LD 16-bit elements per row; lane l's row
// address is &tile[offset[l]].  out[l * X + i] = lane l's register i.
template <int X, bool TRANS, int LD>
__global__ void load_matrices(const unsigned short* tile, const int* offset, unsigned* out) {
    __shared__ __align__(128) unsigned short s[64 * LD];
    for (int i = threadIdx.x; i < 64 * LD; i += 32) s[i] = tile[i];
    __syncthreads();
    unsigned d[X];
    ldmatrix<X, TRANS>(d, &s[offset[threadIdx.x]]);
    for (int i = 0; i < X; ++i) out[threadIdx.x * X + i] = d[i];
}

// One warp: lane l stores 16 bytes (src[8 l ..]) at row l / 4, chunk l % 4 of a tile whose rows
// are LD 16-bit elements long (the Loader's order for 32-element rows), then copies the tile out.
template <int LD>
__global__ void store_rows(const unsigned short* src, unsigned short* out) {
    __shared__ __align__(128) unsigned short s[8 * LD];
    const int l = threadIdx.x;
    st_shared_16(&s[(l / 4) * LD + 8 * (l % 4)], &src[8 * l]);
    __syncthreads();
    for (int i = l; i < 8 * LD; i += 32) out[i] = s[i];
}

// One warp: d = mma(a, b, c) with lane l passing registers a[4 l ..], b[2 l ..], c[4 l ..].
template <typename T>
__global__ void mma_m16n8k16_lanes(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int l = threadIdx.x;
    const unsigned ra[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
    const unsigned rb[2] = {b[2 * l], b[2 * l + 1]};
    float acc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
    mma_m16n8k16<T>(acc, ra, rb, acc);  // d aliasing c, as kernels accumulate
    for (int r = 0; r < 4; ++r) d[4 * l + r] = acc[r];
}

// The same for m16n8k8 with half types: registers a[2 l ..], b[l]; d written apart from c.
template <typename T>
__global__ void mma_m16n8k8_lanes(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int l = threadIdx.x;
    const unsigned ra[2] = {a[2 * l], a[2 * l + 1]};
    const float rc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
    float rd[4];
    mma_m16n8k8<T>(rd, ra, b[l], rc);
    for (int r = 0; r < 4; ++r) d[4 * l + r] = rd[r];
}

__global__ void mma_m16n8k8_tf32_lanes(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int l = threadIdx.x;
    const unsigned ra[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
    const unsigned rb[2] = {b[2 * l], b[2 * l + 1]};
    const float rc[4] = {c[4 * l], c[4 * l + 1], c[4 * l + 2], c[4 * l + 3]};
    float rd[4];
    mma_m16n8k8_tf32(rd, ra, rb, rc);
    for (int r = 0; r < 4; ++r) d[4 * l + r] = rd[r];
}

// One warp, ldmatrix.x1 (row l % 8 of an 8x8 tile) then mma.m16n8k16 (a, b: the lane's registers),
// each issued from two places: lanes below SPLIT take the first branch, the others the second
// (row addresses and operands from arrays, so the compiler cannot merge the branches).  SPLIT 0
// or 32 keeps the warp converged; any other splits it between two instructions, which .aligned
// leaves undefined (the tensor-core depthwise filter gradient hung an H200 so), and the model
// must refuse.  MMA: whether the mma is the split one (else the ldmatrix).
template <int SPLIT, bool MMA>
__global__ void split_warp(const unsigned short* tile, const int* first, const int* second, const unsigned* a,
                           const unsigned* b, unsigned* out, float* d) {
    __shared__ __align__(128) unsigned short s[64];
    const int l = threadIdx.x;
    for (int i = l; i < 64; i += 32) s[i] = tile[i];
    __syncthreads();
    unsigned r[1];
    if (MMA || l < SPLIT) ldmatrix<1, false>(r, &s[first[l]]);
    else ldmatrix<1, false>(r, &s[second[l]]);
    out[l] = r[0];
    const unsigned ra[4] = {a[4 * l], a[4 * l + 1], a[4 * l + 2], a[4 * l + 3]};
    const unsigned rb[2] = {b[2 * l], b[2 * l + 1]}, rb2[2] = {b[64 + 2 * l], b[64 + 2 * l + 1]};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (!MMA || l < SPLIT) mma_m16n8k16<__half>(acc, ra, rb, acc);
    else mma_m16n8k16<__half>(acc, ra, rb2, acc);
    for (int q = 0; q < 4; ++q) d[4 * l + q] = acc[q];
}

// One warp: lane l reads the 4 bytes at word offset[l] of a 1024-word shared tile with
// ld_shared_32 (ld_shared_32_volatile) into out[l].
template <bool VOLATILE>
__global__ void load_words(const unsigned* tile, const int* offset, unsigned* out) {
    __shared__ __align__(128) unsigned s[1024];
    for (int i = threadIdx.x; i < 1024; i += 32) s[i] = tile[i];
    __syncthreads();
    out[threadIdx.x] = VOLATILE ? ld_shared_32_volatile(&s[offset[threadIdx.x]]) : ld_shared_32(&s[offset[threadIdx.x]]);
}

// One warp: lane l reads the 16 bytes at float offset[l] of a 1024-float shared tile with
// ld_shared_16 into out[4 l .. 4 l + 3].
__global__ void load_quads(const float* tile, const int* offset, float* out) {
    __shared__ __align__(128) float s[1024];
    for (int i = threadIdx.x; i < 1024; i += 32) s[i] = tile[i];
    __syncthreads();
    const float4 v = ld_shared_16(&s[offset[threadIdx.x]]);
    out[4 * threadIdx.x] = v.x, out[4 * threadIdx.x + 1] = v.y, out[4 * threadIdx.x + 2] = v.z;
    out[4 * threadIdx.x + 3] = v.w;
}

// One warp, grid-stride: out[i] = round_tf32(bits[i]).
__global__ void round_words_to_tf32(const unsigned* bits, unsigned* out, int n) {
    for (int i = threadIdx.x; i < n; i += 32) out[i] = round_tf32(bits[i]);
}

// One thread, three 16-byte chunks in two groups (chunk 0; chunks 1 and 2) into a shared buffer
// that starts as -1.  WAIT < 0: no wait at all; else cp.async.wait_group WAIT.  fill[i] = 0:
// chunk i is zero-filled (src-size 0).
template <int WAIT>
__global__ void async_copy(const float* src, const int* fill, float* out) {
    __shared__ __align__(16) float s[12];
    for (int i = 0; i < 12; ++i) s[i] = -1.0f;
    cp_async_16(&s[0], src, fill[0] != 0);
    cp_async_commit_group();
    cp_async_16(&s[4], src + 4, fill[1] != 0);
    cp_async_16(&s[8], src + 8, fill[2] != 0);
    cp_async_commit_group();
    if constexpr (WAIT >= 0) cp_async_wait_group<(WAIT >= 0 ? WAIT : 0)>();
    for (int i = 0; i < 12; ++i) out[i] = s[i];
}
"""

# One warp: c (16x8 row-major float) = a (16x16) b (16x8), both staged in shared memory by
# cp.async and read with ldmatrix into mma.m16n8k16 fragments.  A_K_MAJOR: a is stored [k][m]
# (m contiguous, as igemm_tiles.cuh's tiles are), else [m][k]; B_K_MAJOR: b is [k][n], else
# [n][k].  NAME is replaced per variant (the planted bugs edit copies of this text).
GEMM = r"""
template <typename T, bool A_K_MAJOR, bool B_K_MAJOR>
__global__ void NAME(const T* a, const T* b, float* c) {
    constexpr int PAD = 8;  // 16 bytes: every row stays 16-byte aligned and rows skew banks
    __shared__ __align__(128) T As[16][16 + PAD];
    __shared__ __align__(128) T Bs[16][16 + PAD];
    const int l = threadIdx.x;
    // Zero first, so a copy that has not landed reads as zeros, not as a previous launch's data.
    for (int i = l; i < 16 * (16 + PAD); i += 32) {
        (&As[0][0])[i] = T(0.0f);
        (&Bs[0][0])[i] = T(0.0f);
    }
    __syncthreads();
    // 16 rows of 16 elements: two 16-byte chunks per row, one per lane.
    cp_async_16(&As[l / 2][8 * (l % 2)], a + (l / 2) * 16 + 8 * (l % 2), true);
    // b: 16 rows of 8 ([k][n]) or 8 rows of 16 ([n][k]), 16 chunks.
    if (l < 16) {
        const int row = B_K_MAJOR ? l : l / 2, col = B_K_MAJOR ? 0 : 8 * (l % 2);
        cp_async_16(&Bs[row][col], b + row * (B_K_MAJOR ? 8 : 16) + col, true);
    }
    cp_async_commit_group();
    cp_async_wait_group<0>();
    __syncthreads();

    // A's four 8x8 matrices in the order of the A fragment: a[mi] covers rows 8 (mi % 2) and
    // columns 8 (mi / 2) of the 16x16 tile; lane l addresses row r of matrix mi.
    const int mi = l / 8, r = l % 8;
    const int m_off = 8 * (mi % 2), k_off = 8 * (mi / 2);
    unsigned ra[4];
    if (A_K_MAJOR) ldmatrix<4, A_K_MAJOR>(ra, &As[k_off + r][m_off]);
    else ldmatrix<4, A_K_MAJOR>(ra, &As[m_off + r][k_off]);
    // B's two 8x8 matrices: k rows 0-7, then 8-15.
    unsigned bt[2];
    if (B_K_MAJOR) ldmatrix<2, true>(bt, &Bs[l % 16][0]);
    else ldmatrix<2, false>(bt, &Bs[l % 8][8 * ((l / 8) % 2)]);
    const unsigned rb[2] = {bt[0], bt[1]};
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_m16n8k16<T>(acc, ra, rb, acc);
    for (int q = 0; q < 4; ++q) c[(l / 4 + 8 * (q / 2)) * 8 + 2 * (l % 4) + q % 2] = acc[q];
}
"""

#: Deliberate misuses, each one edit of GEMM: (text, replacement).
PLANTED = {
    # Both A loads (k-major and m-major) take the other transposition.
    "wrong-trans-on-a": ("ldmatrix<4, A_K_MAJOR>", "ldmatrix<4, !A_K_MAJOR>"),
    "x4-lanes-address-the-wrong-matrix": ("m_off = 8 * (mi % 2), k_off = 8 * (mi / 2)",
                                          "m_off = 8 * (mi / 2), k_off = 8 * (mi % 2)"),
    "missing-wait-group": ("    cp_async_wait_group<0>();\n", "\n"),
    "swapped-b-registers": ("const unsigned rb[2] = {bt[0], bt[1]};", "const unsigned rb[2] = {bt[1], bt[0]};"),
}

LAYOUTS = [(ak, bk) for ak in (False, True) for bk in (False, True)]
LDS = (8, 16, 64, 72)  # row pitch in 16-bit elements: 16, 32, 128 and 144 bytes


def gemm_name(bug: str | None) -> str:
    return "gemm_16816" if bug is None else "gemm_16816_" + bug.replace("-", "_")


def gemm_source() -> str:
    parts = [GEMM.replace("NAME", gemm_name(None))]
    for bug, (text, replacement) in PLANTED.items():
        body = GEMM.replace("NAME", gemm_name(bug))
        assert text in body, f"planted edit {bug} must match the kernel"
        parts.append(body.replace(text, replacement))
    return "\n".join(parts)


def bool_arg(v: bool) -> str:
    return "true" if v else "false"


EXPRESSIONS = (
    [f"load_matrices<{x}, {bool_arg(t)}, {ld}>" for x in (1, 2, 4) for t in (False, True) for ld in LDS]
    + ["mma_m16n8k16_lanes<__half>", "mma_m16n8k16_lanes<__nv_bfloat16>", "mma_m16n8k8_tf32_lanes"]
    + ["mma_m16n8k8_lanes<__half>", "mma_m16n8k8_lanes<__nv_bfloat16>"]
    + ["load_words<false>", "load_words<true>", "load_quads", "round_words_to_tf32"]
    + [f"async_copy<{w}>" for w in (-1, 0, 1)]
    + [f"store_rows<{ld}>" for ld in (32, 40, 64)]
    + [f"split_warp<{split}, {bool_arg(mma)}>" for split in (0, 16, 31, 32) for mma in (False, True)]
    + [f"{gemm_name(None)}<{t}, {bool_arg(ak)}, {bool_arg(bk)}>" for t in ("__half", "__nv_bfloat16")
       for ak, bk in LAYOUTS]
    + [f"{gemm_name(bug)}<__half, {bool_arg(ak)}, {bool_arg(bk)}>" for bug in PLANTED for ak, bk in LAYOUTS])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tensor_core_ptx")
    for header in ("gradops_common.cuh", "tensor_core_ptx.cuh"):
        shutil.copy(cuda_host._build.source_dir() / header, directory)
    (directory / "ptx_model.cu").write_text(KERNELS + gemm_source())
    return cuda_host.HostKernels("ptx_model.cu", EXPRESSIONS, directory)


def bf16():
    import ml_dtypes

    return ml_dtypes.bfloat16


# --------------------------------------------------------------------------- ldmatrix
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("x", [1, 2, 4])
def test_ldmatrix_follows_the_isa_table(kernels, x, trans, rng):
    """Each lane's registers hold the elements the ISA assigns it, from the rows the
    address-supplying lanes (8 i + row for matrix i) point at; lanes past 8 x supply nothing
    (their addresses here are misaligned, and must be ignored)."""
    ld = 72
    tile = np.arange(64 * ld, dtype=np.uint16)  # every element its own value
    rows = rng.permutation(64)[:32]  # any rows, in any order: lane -> row
    offsets = (rows * ld + 8 * rng.integers(0, ld // 8, 32)).astype(np.int32)
    offsets[8 * x:] = 3  # not 16-byte aligned: ignored lanes
    out = np.zeros(32 * x, np.uint32)
    kernels.launch(f"load_matrices<{x}, {bool_arg(trans)}, {ld}>", (1,), (32,), [tile, offsets, out], [],
                   order="shuffled", seed=1)
    want = np.zeros((32, x), np.uint32)
    for lane in range(32):
        for i in range(x):
            halves = []
            for half in range(2):
                row, col = ldmatrix_element(lane, i, half, trans)
                halves.append(int(tile[offsets[8 * i + row] + col]))
            want[lane, i] = halves[0] | halves[1] << 16
    np.testing.assert_array_equal(out.reshape(32, x), want)


@pytest.mark.parametrize("ld,per_matrix", [(8, 1), (16, 2), (64, 8), (72, 1)])
def test_ldmatrix_bank_conflicts_are_counted(kernels, ld, per_matrix):
    """8 rows of 16 bytes at a pitch of 16 or 144 bytes fall in 32 distinct banks (one
    wavefront per matrix); a 32-byte pitch puts two rows in each bank group (2 wavefronts), a
    128-byte pitch all eight (8 wavefronts)."""
    tile = np.zeros(64 * ld, np.uint16)
    offsets = (np.arange(32) * ld).astype(np.int32)  # lane l -> row l
    out = np.zeros(32 * 4, np.uint32)
    kernels.shared_stats(reset=True)
    kernels.launch(f"load_matrices<4, false, {ld}>", (1,), (32,), [tile, offsets, out], [])
    assert kernels.shared_stats() == {"accesses": 1, "wavefronts": 4 * per_matrix, "ideal": 4}


@pytest.mark.parametrize("ld,per_phase", [(32, 1), (40, 2), (64, 2)])
def test_16_byte_store_bank_conflicts_are_counted(kernels, ld, per_phase):
    """A warp's 16-byte stores are served 8 lanes (128 bytes) at a time: two 64-byte rows that
    are adjacent fill the 32 banks once; 80 or 128 bytes apart they overlap (2 wavefronts)."""
    src = np.arange(256, dtype=np.uint16)
    out = np.zeros(8 * ld, np.uint16)
    kernels.shared_stats(reset=True, kind="st_shared_16")
    kernels.launch(f"store_rows<{ld}>", (1,), (32,), [src, out], [], order="shuffled", seed=4)
    assert kernels.shared_stats(kind="st_shared_16") == {"accesses": 1, "wavefronts": 4 * per_phase, "ideal": 4}
    np.testing.assert_array_equal(out.reshape(8, ld)[:, :32], src.reshape(8, 32))


def test_ldmatrix_needs_aligned_rows_and_a_whole_warp(kernels):
    tile = np.zeros(64 * 8, np.uint16)
    out = np.zeros(32, np.uint32)
    misaligned = (np.arange(32) * 8).astype(np.int32)
    misaligned[5] += 1
    with pytest.raises(cuda_host.HostLaunchError, match="not 16-byte aligned"):
        kernels.launch("load_matrices<1, false, 8>", (1,), (32,), [tile, misaligned, out], [])
    with pytest.raises(cuda_host.HostLaunchError, match="partial warp"):
        kernels.launch("load_matrices<1, false, 8>", (1,), (16,), [tile, (np.arange(32) * 8).astype(np.int32), out],
                       [])


@pytest.mark.parametrize("mma", [False, True], ids=["ldmatrix", "mma"])
@pytest.mark.parametrize("split", [0, 16, 31, 32])
def test_a_warp_split_between_two_aligned_instructions_is_refused(kernels, rng, split, mma):
    """ldmatrix and mma.sync are .aligned: every lane must execute the same instruction.  A warp
    whose lanes reach them from two places in the code is refused (a GPU's result is undefined;
    an H200 hung on it); the same code with the warp in one branch runs and loads as the ISA says."""
    tile = rng.integers(0, 2**16, 64, dtype=np.uint16)
    rows = ((np.arange(32) % 8) * 8).astype(np.int32)
    a = rng.integers(0, 2**32, 128, dtype=np.uint32) & np.uint32(0x3C003C00)  # halves of 1.0 or 0
    b = rng.integers(0, 2**32, 128, dtype=np.uint32) & np.uint32(0x3C003C00)
    out, d = np.zeros(32, np.uint32), np.zeros(128, np.float32)
    args = [tile, rows, rows.copy(), a, b, out, d]
    name = f"split_warp<{split}, {bool_arg(mma)}>"
    if split in (0, 32):
        kernels.launch(name, (1,), (32,), args, [], order="shuffled", seed=3)
        for lane in range(32):
            row, col = ldmatrix_element(lane, 0, 0, False)
            assert out[lane] & 0xFFFF == tile[8 * row + col]
        return
    with pytest.raises(cuda_host.HostLaunchError, match="divergent warp"):
        kernels.launch(name, (1,), (32,), args, [], order="shuffled", seed=3)


# --------------------------------------------------------------------------- mma.sync
def pack_pairs(matrix, cell, regs, dtype):
    """Lane registers (32 x regs uint32) of 16-bit ``matrix`` per table ``cell(lane, reg, half)``."""
    bits = np.ascontiguousarray(matrix.astype(dtype)).view(np.uint16)
    out = np.zeros((32, regs), np.uint32)
    for lane in range(32):
        for reg in range(regs):
            lo, hi = (int(bits[cell(lane, reg, h)]) for h in range(2))
            out[lane, reg] = lo | hi << 16
    return out


def within_float_sums(got, want, scale):
    """float sums of exact products: within 16 roundings of the sum of the terms' magnitudes."""
    return np.all(np.abs(got - want) <= 16 * 2.0**-24 * scale)


def mma_lanes_result(kernels, name, ra, rb, c, **order):
    """Launch one warp of ``name`` (an ``mma_*_lanes`` kernel) on the lane registers ``ra`` /
    ``rb`` and the accumulator matrix ``c`` (16x8, packed per the C/D table), and return D as a
    16x8 matrix unpacked per the same table."""
    rc = np.array([[c[m16n8_c(l, r)] for r in range(4)] for l in range(32)], np.float32)
    rd = np.full((32, 4), np.nan, np.float32)
    kernels.launch(name, (1,), (32,), [ra, rb, rc, rd], [], **order)
    d = np.full((16, 8), np.nan)
    for lane in range(32):
        for reg in range(4):
            d[m16n8_c(lane, reg)] = rd[lane, reg]
    return d


@pytest.mark.parametrize("k", [16, 8], ids=["m16n8k16", "m16n8k8"])
@pytest.mark.parametrize("type_name", ["__half", "__nv_bfloat16"])
def test_mma_half_types_follow_the_isa_tables(kernels, rng, type_name, k):
    dtype = np.float16 if type_name == "__half" else bf16()
    a, b = random_array(rng, (16, k), dtype), random_array(rng, (k, 8), dtype)
    c = random_array(rng, (16, 8), np.float32)
    if k == 16:
        ra = pack_pairs(a, lambda l, r, h: m16n8k16_a(l, r, h), 4, dtype)
        rb = pack_pairs(b, lambda l, r, h: m16n8k16_b(l, r, h), 2, dtype)
        d = mma_lanes_result(kernels, f"mma_m16n8k16_lanes<{type_name}>", ra, rb, c, order="shuffled", seed=2)
    else:
        ra = pack_pairs(a, lambda l, r, h: m16n8k8_a(l, r, h), 2, dtype)
        rb = pack_pairs(b, lambda l, r, h: m16n8k8_b(l, h), 1, dtype)[:, 0].copy()
        d = mma_lanes_result(kernels, f"mma_m16n8k8_lanes<{type_name}>", ra, rb, c, order="shuffled", seed=5)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert within_float_sums(d, a64 @ b64 + c, np.abs(a64) @ np.abs(b64) + np.abs(c))


def tf32_bits(x):
    """float32 rounded to TF32 (cvt.rna: ties away from zero), as the bits of a float32."""
    return (x.astype(np.float32).view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)


def test_mma_m16n8k8_tf32_follows_the_isa_tables(kernels, rng):
    a, b = random_array(rng, (16, 8), np.float32), random_array(rng, (8, 8), np.float32)
    c = random_array(rng, (16, 8), np.float32)
    ta, tb = tf32_bits(a), tf32_bits(b)
    ra = np.array([[ta[m16n8k8_tf32_a(l, r)] for r in range(4)] for l in range(32)], np.uint32)
    rb = np.array([[tb[m16n8k8_tf32_b(l, r)] for r in range(2)] for l in range(32)], np.uint32)
    # The tensor cores ignore a TF32 register's low 13 bits: set them, the result must not move.
    ra |= np.uint32(0x1FFF)
    d = mma_lanes_result(kernels, "mma_m16n8k8_tf32_lanes", ra, rb, c, order="reverse")
    a64, b64 = ta.view(np.float32).astype(np.float64), tb.view(np.float32).astype(np.float64)
    assert not np.array_equal(a64, a.astype(np.float64)), "rounding to TF32 changed some inputs"
    assert within_float_sums(d, a64 @ b64 + c, np.abs(a64) @ np.abs(b64) + np.abs(c))


def test_round_tf32_follows_the_isa(kernels):
    """cvt.rna.tf32.f32 (PTX ISA): the nearest value with 10 mantissa bits, ties away from zero,
    Inf and NaN unchanged: against conv_cases.round_tf32 (NumPy, from the ISA) on ties, values
    just below and above them, both signs, subnormals, the largest finite float (rounds to Inf)
    and NaN payloads whose rounding would carry into the exponent."""
    from conv_cases import round_tf32

    mantissas = np.array([0, 1, 0xFFF, 0x1000, 0x1001, 0x2FFF, 0x3000, 0x7FF000, 0x7FFFFF], np.uint32)
    exponents = np.array([0, 1, 0x7E, 0x7F, 0xFE], np.uint32) << np.uint32(23)
    finite = (exponents[:, None] | mantissas[None, :]).ravel()
    bits = np.concatenate([finite, finite | np.uint32(0x80000000),
                           np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0x7FFFF000, 0xFFFFFFFF], np.uint32)])
    out = np.zeros_like(bits)
    kernels.launch("round_words_to_tf32", (1,), (32,), [bits, out], [np.int32(bits.size)])
    want = round_tf32(bits.view(np.float32))
    got = out.view(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(out[~nan], want.view(np.uint32)[~nan])
    assert np.isinf(got[bits == 0x7F7FFFFF]).all()  # the largest finite float rounds up to Inf
    assert (out & np.uint32(0x1FFF) == 0)[~nan].all()


@pytest.mark.parametrize("stride,wavefronts", [(1, 1), (2, 2), (32, 32), (0, 1), (33, 1)])
@pytest.mark.parametrize("volatile", [False, True], ids=["plain", "volatile"])
def test_4_byte_load_reads_and_bank_conflicts_are_counted(kernels, stride, wavefronts, volatile):
    """ld_shared_32 (and its volatile form) returns the word it addresses; a warp's 32 four-byte
    loads are one pass when they hit 32 distinct banks (consecutive words, or words 33 apart) or
    one word (a broadcast), and take 2 or 32 passes when 2 or 32 distinct words share a bank."""
    tile = np.arange(1024, dtype=np.uint32) * np.uint32(2654435761)
    offsets = (np.arange(32) * stride % 1024).astype(np.int32)
    out = np.zeros(32, np.uint32)
    kernels.shared_stats(reset=True, kind="ld_shared_32")
    kernels.launch(f"load_words<{'true' if volatile else 'false'}>", (1,), (32,), [tile, offsets, out], [],
                   order="shuffled", seed=2)
    np.testing.assert_array_equal(out, tile[offsets])
    assert kernels.shared_stats(kind="ld_shared_32") == {"accesses": 1, "wavefronts": wavefronts, "ideal": 1}


@pytest.mark.parametrize("stride,wavefronts", [(4, 4), (8, 8), (16, 16), (32, 32), (0, 4), (36, 4)])
def test_16_byte_load_reads_and_bank_conflicts_are_counted(kernels, stride, wavefronts):
    """ld_shared_16 returns the 4 floats it addresses, in order; a warp's 32 sixteen-byte loads
    are served a quarter-warp at a time, so consecutive quads (or quads 36 floats apart, or one
    quad) take 4 passes, and quads 8, 16 or 32 floats apart put 2, 4 or 8 lanes of a quarter on
    the same banks."""
    tile = np.arange(1024, dtype=np.float32) * np.float32(1.5) - 7
    offsets = (np.arange(32) * stride % 1024).astype(np.int32)
    out = np.zeros(128, np.float32)
    kernels.shared_stats(reset=True, kind="ld_shared_16")
    kernels.launch("load_quads", (1,), (32,), [tile, offsets, out], [], order="shuffled", seed=3)
    np.testing.assert_array_equal(out.reshape(32, 4), tile[offsets[:, None] + np.arange(4)])
    assert kernels.shared_stats(kind="ld_shared_16") == {"accesses": 1, "wavefronts": wavefronts, "ideal": 4}


def test_16_byte_load_needs_an_aligned_address(kernels):
    """A 16-byte shared load from an address that is not 16-byte aligned fails the launch, as
    ld.shared.v4 faults on a GPU (misaligned address)."""
    offsets = (np.arange(32) * 4).astype(np.int32)
    offsets[9] += 2
    with pytest.raises(cuda_host.HostLaunchError, match="not 16-byte aligned"):
        kernels.launch("load_quads", (1,), (32,), [np.zeros(1024, np.float32), offsets, np.zeros(128, np.float32)], [])


# --------------------------------------------------------------------------- cp.async
@pytest.mark.parametrize("wait,landed", [(-1, (False, False, False)), (1, (True, False, False)),
                                         (0, (True, True, True))])
def test_cp_async_lands_at_wait_group(kernels, wait, landed):
    """Copies land when wait_group retires their group: with no wait the buffer still holds what
    was there (-1), wait_group 1 leaves the newest of two groups in flight, wait_group 0 none;
    a chunk with src-size 0 lands as zeros."""
    src = np.arange(1, 13, dtype=np.float32)
    fill = np.array([1, 1, 0], np.int32)
    out = np.zeros(12, np.float32)
    kernels.launch(f"async_copy<{wait}>", (1,), (1,), [src, fill, out], [])
    want = np.full(12, -1.0, np.float32)
    for chunk in range(3):
        if landed[chunk]:
            want[4 * chunk:4 * chunk + 4] = src[4 * chunk:4 * chunk + 4] if fill[chunk] else 0
    np.testing.assert_array_equal(out, want)


def test_zero_fill_does_not_read_the_source(kernels):
    """src-size 0 reads nothing: a source address that faults if read is fine."""
    unmapped = 16 * 4096  # below every mapping of a Linux process, and 16-byte aligned
    out = np.zeros(12, np.float32)
    with pytest.raises(cuda_host.HostLaunchError, match="memory fault"):
        kernels.launch("async_copy<0>", (1,), (1,), [unmapped, np.array([1, 0, 0], np.int32), out], [])
    kernels.launch("async_copy<0>", (1,), (1,), [unmapped, np.zeros(3, np.int32), out], [])
    np.testing.assert_array_equal(out, np.zeros(12, np.float32))


# --------------------------------------------------------------------------- a whole GEMM
def run_gemm(kernels, name, type_name, a_k_major, b_k_major, rng, seed=0):
    dtype = np.float16 if type_name == "__half" else bf16()
    a, b = random_array(rng, (16, 16), dtype), random_array(rng, (16, 8), dtype)
    a_stored = np.ascontiguousarray(a.T if a_k_major else a)
    b_stored = np.ascontiguousarray(b if b_k_major else b.T)
    c = np.full((16, 8), np.nan, np.float32)
    kernels.launch(f"{name}<{type_name}, {bool_arg(a_k_major)}, {bool_arg(b_k_major)}>", (1,), (32,),
                   [a_stored, b_stored, c], [], order="shuffled", seed=seed)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return c, a64 @ b64, np.abs(a64) @ np.abs(b64)


@pytest.mark.parametrize("a_k_major,b_k_major", LAYOUTS)
@pytest.mark.parametrize("type_name", ["__half", "__nv_bfloat16"])
def test_gemm_through_cp_async_ldmatrix_and_mma(kernels, rng, type_name, a_k_major, b_k_major):
    """16x8x16 through cp.async -> ldmatrix -> mma.m16n8k16, against NumPy.  The fragments pair
    elements along k, so ldmatrix transposes where the stored rows run along m (A k-major) or n
    (B k-major), and does not where they run along k."""
    got, want, scale = run_gemm(kernels, gemm_name(None), type_name, a_k_major, b_k_major, rng)
    assert within_float_sums(got, want, scale)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_primitive_misuse_fails_the_gemm(kernels, bug):
    """Every misuse gives a wrong product in every operand layout (the unedited kernel is right on
    the same inputs: the test above, same seeds)."""
    for a_k_major, b_k_major in LAYOUTS:
        got, want, scale = run_gemm(kernels, gemm_name(None), "__half", a_k_major, b_k_major,
                                    np.random.default_rng(5))
        assert within_float_sums(got, want, scale)
        got, want, scale = run_gemm(kernels, gemm_name(bug), "__half", a_k_major, b_k_major,
                                    np.random.default_rng(5))
        assert not within_float_sums(got, want, scale), f"{bug} passed with layout {a_k_major, b_k_major}"


# --------------------------------------------------------------------------- in the conv kernels
def run_half_conv_gradient(op, vector, rng, tile=None):
    """(launcher result, NumPy result) of test_cuda_host's planted-bug problem in float16
    through the tiled kernel: ``vector`` False, its 6 and 4 channels (scalar loads, the
    register-staged double buffer, wgrad split 2 ways); True, 16 and 48 channels, unsplit
    (16-byte chunks, the cp.async pipeline; 48 out channels give dgrad's phases 2 to 6
    reduction tiles, the last one partial, and carries in every digit of its reduction cursor;
    wgrad has 3 reduction tiles)."""
    from test_cuda_host import run_planted_problem

    if vector:
        return run_planted_problem(op, "tiled", np.float16, rng, depths=(16, 48), vector=True, splits=None,
                                   tile=tile)
    return run_planted_problem(op, "tiled", np.float16, rng, vector=False)


def count_conv_gradients(monkeypatch, dtype, math_kind, vector, solve, source_dir=None):
    """wgrad and dgrad through the real launchers on the host model, each op's tiled kernel
    (dtype, math kind, load width) counting its shared-memory traffic afresh; ``solve(op)`` runs
    the op and says whether its result is right.  Returns ({op: {kind: shared-memory stats}},
    every result right?)."""
    device = cuda_host.HostDevice(order="shuffled", seed=3, source_dir=source_dir).install(monkeypatch)
    stats, ok = {}, True
    for op in ("conv2d_backprop_filter", "conv2d_backprop_input"):
        # build, then count afresh
        launcher = importlib.import_module(f"gradops.backends.cuda.{op}")
        kernels = device.host_kernels(f"{op}.cu", launcher._tiled_name(dtype, math_kind, vector))
        for kind in kernels.SHARED_KINDS:
            kernels.shared_stats(reset=True, kind=kind)
        ok = solve(op) and ok
        stats[op] = {kind: kernels.shared_stats(kind=kind) for kind in kernels.SHARED_KINDS}
    return stats, ok


def run_half_conv_gradients(monkeypatch, vector, source_dir=None, tile=None):
    """The float16 wgrad and dgrad of one small problem (run_half_conv_gradient) on the host
    model (their tiled kernels: mma_cta); returns count_conv_gradients's (stats, results ok?)."""
    from conftest import assert_close

    def solve(op):
        got, want = run_half_conv_gradient(op, vector, np.random.default_rng(7), tile)
        try:
            assert_close(got, want, np.float16)
        except AssertionError:
            return False
        return True

    return count_conv_gradients(monkeypatch, np.float16, 1, vector, solve, source_dir)


#: Each main loop's shared-memory writes: the register-staged loader's 16-byte stores, or the
#: pipeline's cp.async copies.
WRITES = {False: "st_shared_16", True: "cp_async"}


@pytest.mark.parametrize("vector,tile", [(False, None), (True, (128, 128)), (True, (128, 64)), (True, (64, 128)),
                                         (True, (64, 64))],
                         ids=["scalar-double-buffer", "vector-cp-async", "vector-cp-async-128x64",
                              "vector-cp-async-64x128", "vector-cp-async-64x64"])
def test_igemm_main_loop_shared_memory_is_conflict_free(monkeypatch, tmp_path, vector, tile):
    """The half-type tiles' main-loop shared-memory traffic (ldmatrix reads, 16-byte chunk
    stores or cp.async writes) takes the fewest wavefronts, in every tile shape: wgrad's tiles
    are [k][row] with 256-byte rows (128-byte ones for a 64-wide side), dgrad's [row][k] with
    64-byte rows, both with XOR-swizzled 16-byte chunks.  Without the swizzles the count sees
    the ldmatrix conflicts (the results stay right): rows 128 or 256 bytes apart put a matrix's
    8 rows in the same banks (8 wavefronts), rows 64 bytes apart 4 rows (4 wavefronts); and in
    the narrow tiles, whose 8-lane write phases cover 2 k (4 warps: 4 lanes per k) or 4 k (64 x
    64: 2 lanes per k) of wgrad's [k][row] tiles, the writes conflict too."""
    stats, ok = run_half_conv_gradients(monkeypatch, vector, tile=tile)
    assert ok
    for op, by_kind in stats.items():
        for kind in ("ldmatrix", WRITES[vector]):
            s = by_kind[kind]
            assert s["accesses"] > 0, f"{op}: no {kind} ran (the tiled kernels must use mma_cta)"
            assert s["wavefronts"] == s["ideal"], f"{op}: {kind} bank conflicts {s}"
        unused = WRITES[not vector]
        assert by_kind[unused]["accesses"] == 0, f"{op}: {unused} ran in the other main loop"

    cuda_host.planted_sources(tmp_path, "igemm_tiles.cuh",
                              ("(chunk ^ line % LINE_CHUNKS)", "chunk"),
                              ("((row / C) ^ swizzle(k % LINE_CHUNKS))", "(row / C)"))
    stats, ok = run_half_conv_gradients(monkeypatch, vector, tmp_path, tile=tile)
    assert ok, "the swizzle changes the speed, not the result"
    factor = {"conv2d_backprop_filter": 8, "conv2d_backprop_input": 4}
    narrow = tile not in (None, (128, 128))
    for op, by_kind in stats.items():
        s = by_kind["ldmatrix"]
        assert s["wavefronts"] == factor[op] * s["ideal"], f"{op}: {s}"
        s = by_kind[WRITES[vector]]
        if narrow and op == "conv2d_backprop_filter":  # 2 or 4 k 128 or 256 bytes apart per phase
            assert s["wavefronts"] > s["ideal"], f"{op}: {s}"
        else:  # a write phase is 128 contiguous bytes
            assert s["wavefronts"] == s["ideal"], f"{op}: {s}"


@pytest.mark.parametrize("tile", [(128, 64), (64, 128), (64, 64)], ids=["128x64", "64x128", "64x64"])
def test_planted_swizzle_of_one_k_per_phase_conflicts_in_the_narrow_tiles(monkeypatch, tmp_path, tile):
    """The 128 x 128 tiles' swizzle (k % 8) in the narrow tiles: wgrad's cp.async write phases
    (4 warps: two k, chunks 0..3 of each; 64 x 64: four k, chunks 2e and 2e + 1 of each) then
    hit each bank group twice; results stay right."""
    cuda_host.planted_sources(tmp_path, "igemm_tiles.cuh",
                              ("return (k % PHASE_KS) * RUN ^ (k / PHASE_KS) % RUN;", "return k;"))
    stats, ok = run_half_conv_gradients(monkeypatch, True, tmp_path, tile=tile)
    assert ok
    s = stats["conv2d_backprop_filter"]["cp_async"]
    assert s["wavefronts"] == 2 * s["ideal"], s
    s = stats["conv2d_backprop_filter"]["ldmatrix"]  # 8 consecutive k: k % 8 is a permutation too
    assert s["wavefronts"] == s["ideal"], s


def run_tf32_conv_gradients(monkeypatch, source_dir=None):
    """The TF32 wgrad and dgrad (float32, allow_tf32, 16 and 48 channels: 16-byte chunks, the
    cp.async pipeline) of test_cuda_host's planted problem on the host model; returns
    count_conv_gradients's (stats, results within TF32's error?)."""
    from test_cuda_host import run_planted_problem

    def solve(op):
        with gradops.options(allow_tf32=True):
            got, want = run_planted_problem(op, "tiled", np.float32, np.random.default_rng(7), depths=(16, 48),
                                            vector=True, splits=None)
        got = cuda_host.HostDevice.asnumpy(got)
        return float(np.max(np.abs(got - want))) <= 1e-2 * float(np.max(np.abs(want)))

    return count_conv_gradients(monkeypatch, np.float32, 2, True, solve, source_dir)


def test_tf32_main_loop_shared_memory_is_conflict_free(monkeypatch, tmp_path):
    """TF32 on mma_cta: wgrad's [k][row] tiles are read one element per lane (ld_shared_32),
    dgrad's [row][k] tiles by ldmatrix, both written by cp.async and rewritten rounded to TF32
    (st_shared_16, each thread its own chunks), all in the fewest wavefronts.
    With the half types' swizzle (one k per phase) in place of the TF32 one, the 4 k a warp
    reads at once (lanes t = 0..3) fall in the same bank groups two by two."""
    stats, ok = run_tf32_conv_gradients(monkeypatch)
    assert ok
    expected = {"conv2d_backprop_filter": ("ld_shared_32", "cp_async", "st_shared_16"),
                "conv2d_backprop_input": ("ldmatrix", "cp_async", "st_shared_16")}
    for op, kinds in expected.items():
        for kind in kinds:
            s = stats[op][kind]
            assert s["accesses"] > 0 and s["wavefronts"] == s["ideal"], f"{op}: {kind} {s}"
    assert stats["conv2d_backprop_input"]["ld_shared_32"]["accesses"] == 0
    assert stats["conv2d_backprop_filter"]["ldmatrix"]["accesses"] == 0

    cuda_host.planted_sources(tmp_path, "igemm_tiles.cuh",
                              ("using LayoutA = Swizzled<T, BM, BK, A_ROWS, TF32 ? 4 : KS_A>;",
                               "using LayoutA = Swizzled<T, BM, BK, A_ROWS, KS_A>;"),
                              ("using LayoutB = Swizzled<T, BN, BK, B_ROWS, TF32 ? 4 : KS_B>;",
                               "using LayoutB = Swizzled<T, BN, BK, B_ROWS, KS_B>;"))
    stats, ok = run_tf32_conv_gradients(monkeypatch, tmp_path)
    assert ok, "the swizzle changes the speed, not the result"
    s = stats["conv2d_backprop_filter"]["ld_shared_32"]
    assert s["wavefronts"] == 2 * s["ideal"], s


# Bugs planted in the cp.async pipeline (AsyncLoader) and the reduction cursors, each run on the
# 16-byte-chunk problems of run_half_conv_gradient (file, text, replacement, ops it must break).
PIPELINE_PLANTED = {
    "cp-async-missing-wait-group": (
        "igemm_tiles.cuh", "            ptx::cp_async_wait_group<STAGES - 2>();\n", "\n", None),
    "cp-async-waits-for-one-group-too-few": (
        "igemm_tiles.cuh", "ptx::cp_async_wait_group<STAGES - 2>();", "ptx::cp_async_wait_group<STAGES - 1>();", None),
    "cp-async-missing-barrier-after-wait": (
        "igemm_tiles.cuh", "            __syncthreads();  // tile t is in shared memory; tile t - 1's stage (write) is free\n",
        "\n", None),
    "unrolled-stages-run-past-the-reduction": (
        "igemm_tiles.cuh", "                if (k0 >= p.k_end) break;\n", "\n",
        # wgrad's 3 reduction tiles are a whole iteration; dgrad's phases have 2 to 6
        ("conv2d_backprop_input",)),
    "cp-async-issues-into-the-stage-being-read": (
        "igemm_tiles.cuh", "issue(p, k_next, As[write], Bs[write]);", "issue(p, k_next, As[read], Bs[read]);", None),
    "cp-async-copies-a-unswizzled": (
        "igemm_tiles.cuh", "ptx::cp_async_16(sa + LayoutA::offset(row, k),",
        "ptx::cp_async_16(sa + (LayoutA::K_CONTIG ? row * BK + k : k * BM + row),", None),
    "cp-async-zero-chunk-filled-from-the-base": (
        "igemm_tiles.cuh", "ptx::cp_async_16(sa + LayoutA::offset(row, k), src.ok ? src.ptr : p.a_base(), src.ok);",
        "ptx::cp_async_16(sa + LayoutA::offset(row, k), src.ok ? src.ptr : p.a_base(), true);",
        # wgrad's A is zero in the padding; dgrad's SAME stride-2 phases never leave out_backprop
        ("conv2d_backprop_filter",)),
    "position-cursor-drops-the-column-carry": (
        "igemm_tiles.cuh", "if (pos.q >= out_cols) { pos.q -= out_cols; ++pos.p; }",
        "if (pos.q >= out_cols) { pos.q -= out_cols; }", ("conv2d_backprop_filter",)),
    "rows-map-gives-every-chunk-the-first-row": (
        "igemm_tiles.cuh", "row = (t % PER_K + e * PER_K) * C;", "row = (t % PER_K) * C;", ("conv2d_backprop_filter",)),
    "position-cursor-drops-the-image-carry": (
        "igemm_tiles.cuh", "if (pos.p >= out_rows) { pos.p -= out_rows; pos.image += image; }",
        "if (pos.p >= out_rows) { pos.p -= out_rows; }", ("conv2d_backprop_filter",)),
    "wgrad-cursor-keeps-the-first-out-backprop-row": (
        "conv2d_backprop_filter.cu", "x.advance(pos.x, step.x);\n        pos.dy += step.dy - out_backprop;",
        "x.advance(pos.x, step.x);", ("conv2d_backprop_filter",)),
    "dgrad-cursor-drops-the-tap-carry": (
        "conv2d_backprop_input.cu", "if (pos.si >= taps_s.count) { pos.si -= taps_s.count; ++pos.ri; }",
        "if (pos.si >= taps_s.count) { pos.si -= taps_s.count; }", ("conv2d_backprop_input",)),
}


def run_half_1x1_gradient(op, rng):
    """(launcher result, NumPy result) of a float16 1x1 stride-1 problem on the ``_1x1_igemm``
    kernels: 2 x 13 x 11 positions of 16 -> 48 channels (dgrad: 2 reduction tiles, the last one
    partial; wgrad: 9, the last one partial; the N tile partial in both)."""
    import cupy

    launcher = importlib.import_module(f"gradops.backends.cuda.{op}")
    x_shape, f_shape = (2, 13, 11, 16), (1, 1, 16, 48)
    x, filt = random_array(rng, x_shape, np.float16), random_array(rng, f_shape, np.float16)
    a = dict(strides=[1, 1, 1, 1], padding="VALID")
    dy = gradops.conv2d(x, filt, **a, backend="numpy")
    g = conv_geometry(op, x_shape, f_shape, dy.shape, "NHWC", (1, 1), "VALID", (1, 1), NO_PADS)
    if op == "conv2d_backprop_filter":
        got = launcher.conv2d_backprop_filter(g, cupy.asarray(x), cupy.asarray(dy), path="tiled", splits=1,
                                              pointwise=True)
        return got, gradops.conv2d_backprop_filter(x, f_shape, dy, **a, backend="numpy")
    got = launcher.conv2d_backprop_input(g, cupy.asarray(filt), cupy.asarray(dy), path="tiled", pointwise=True)
    return got, gradops.conv2d_backprop_input(x_shape, filt, dy, **a, backend="numpy")


# Bugs planted in the 1x1 kernels' problems (file, text, replacement, op).  Each stays inside
# the arrays: a planted write far past an array's guard bytes would corrupt the test process.
POINTWISE_PLANTED = {
    "1x1-wgrad-cursor-keeps-the-first-out-backprop-row": (
        "conv2d_backprop_filter.cu", "pos.x += step.x - input;\n        pos.dy += step.dy - out_backprop;",
        "pos.x += step.x - input;", "conv2d_backprop_filter"),
    "1x1-wgrad-every-row-reads-the-first-channels": (
        "conv2d_backprop_filter.cu", "ARow a_row(int c) const { return {static_cast<int>(in_channel0) + c}; }",
        "ARow a_row(int) const { return {static_cast<int>(in_channel0)}; }", "conv2d_backprop_filter"),
    "1x1-dgrad-cursor-not-advanced": (
        "conv2d_backprop_input.cu", "void k_advance(KPos& k, const KPos& step) const { k += step; }",
        "void k_advance(KPos&, const KPos&) const {}", "conv2d_backprop_input"),
    "1x1-dgrad-filter-row-stride-is-in-depth": (
        "conv2d_backprop_input.cu", "BRow b_row(int c) const { return {c * out_depth + out_channel0}; }",
        "BRow b_row(int c) const { return {c * in_depth + out_channel0}; }", "conv2d_backprop_input"),
}


@pytest.mark.parametrize("op", ["conv2d_backprop_filter", "conv2d_backprop_input"])
def test_1x1_kernels_match_numpy_on_the_planted_problem(monkeypatch, op):
    """The real sources get the 1x1 problem of the planted-bug test right."""
    from conftest import assert_close

    device = cuda_host.HostDevice(order="shuffled", seed=3).install(monkeypatch)
    got, want = run_half_1x1_gradient(op, np.random.default_rng(7))
    assert_close(got, want, np.float16)
    assert any("_1x1_igemm<" in name for name, _, _ in device.launches)


@pytest.mark.parametrize("bug", sorted(POINTWISE_PLANTED))
def test_planted_1x1_kernel_bugs_fail_the_comparison(monkeypatch, tmp_path, bug):
    """Each bug planted in a 1x1 kernel's cursor or row arithmetic gives a wrong result (or a
    refused launch: a write outside an array)."""
    from conftest import assert_close

    filename, text, replacement, op = POINTWISE_PLANTED[bug]
    cuda_host.planted_sources(tmp_path, filename, (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=3, source_dir=tmp_path).install(monkeypatch)
    try:
        got, want = run_half_1x1_gradient(op, np.random.default_rng(7))
    except (AssertionError, cuda_host.HostLaunchError):
        return  # refused
    with pytest.raises(AssertionError):
        assert_close(got, want, np.float16)


@pytest.mark.parametrize("bug", sorted(PIPELINE_PLANTED))
def test_planted_pipeline_bugs_fail_the_comparison(monkeypatch, tmp_path, bug):
    """The multistage main loop's synchronisation, stage rotation, swizzle and zero fill, and
    the reduction cursors' carries: each planted bug makes an op the real sources get right
    (test_igemm_main_loop_shared_memory_is_conflict_free) give a wrong result, or the launch
    is refused (a barrier error or a write outside an array)."""
    from conftest import assert_close

    filename, text, replacement, ops = PIPELINE_PLANTED[bug]
    cuda_host.planted_sources(tmp_path, filename, (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=3, source_dir=tmp_path).install(monkeypatch)
    for op in ops or ("conv2d_backprop_filter", "conv2d_backprop_input"):
        try:
            got, want = run_half_conv_gradient(op, True, np.random.default_rng(7))
        except (AssertionError, cuda_host.HostLaunchError):
            continue  # refused
        with pytest.raises(AssertionError):
            assert_close(got, want, np.float16)
