"""The host execution model of tests/cuda_host.py finds the bugs it is trusted to find.

The CUDA launcher tests run on the CPU through that model (the ``cuda_device`` fixture's
"host" parameter).  These tests show that it is not a rubber stamp: barrier misuse is reported,
races between threads change the result with the execution order, a racecheck build reports a
shared-memory hazard in any order, writes outside an array and
unwritten elements are caught, the wmma emulation multiplies correctly, and deliberate bugs
planted in copies of the real kernel sources make the launcher tests' comparisons fail.  The
last tests cover the stand-in under gradops' public API: routing, zero-copy foreign views,
the per-device launch check, and bugs planted in the dispatcher and a launcher.
"""

from __future__ import annotations

import importlib
import shutil
import warnings

import numpy as np
import pytest

import cuda_host
import reference
from conftest import assert_close, random_array
from conv_cases import NO_PADS, conv_geometry

import gradops

pytestmark = pytest.mark.skipif(cuda_host.unavailable_reason() is not None,
                                reason=f"no host build: {cuda_host.unavailable_reason()}")

TEST_KERNELS = r"""
#include "gradops_common.cuh"
#include <mma.h>

// Each thread publishes its index in shared memory and reads its neighbour's.
template <bool BARRIER>
__global__ void neighbour(int* out) {
    __shared__ int values[64];
    values[threadIdx.x] = static_cast<int>(threadIdx.x) * 10;
    if (BARRIER) __syncthreads();
    out[threadIdx.x] = values[(threadIdx.x + 1) % blockDim.x];
}

__global__ void divergent_syncthreads(int* out) {
    if (threadIdx.x < 16) __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void early_exit_then_syncthreads(int* out) {
    if (threadIdx.x == 3) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void divergent_syncwarp(int* out) {
    if (threadIdx.x % 32 < 8) __syncwarp();
    out[threadIdx.x] = 1;
}

// Writes one element past the end of an n-element array.
__global__ void write_past_end(float* out, long long n) {
    GRADOPS_GRID_STRIDE_LOOP(i, n + 1) out[i] = 1.0f;
}

__global__ void copy_one(const float* in, float* out) { out[0] = in[0]; }

// Each lane's value shuffled up and down by DELTA (unsigned and float); LANES < 32: only the
// first LANES lanes of the warp shuffle (a partial warp, which the full mask forbids).
template <int DELTA, int LANES>
__global__ void shuffles(const unsigned* bits, const float* values, unsigned* up, unsigned* down, float* up_f,
                         float* down_f) {
    const int l = static_cast<int>(threadIdx.x);
    if (l >= LANES) return;
    up[l] = __shfl_up_sync(0xffffffffu, bits[l], DELTA);
    down[l] = __shfl_down_sync(0xffffffffu, bits[l], DELTA);
    up_f[l] = __shfl_up_sync(0xffffffffu, values[l], DELTA);
    down_f[l] = __shfl_down_sync(0xffffffffu, values[l], DELTA);
}

// One warp: c = a (16x16, row-major) x b (16x16, row-major) + 1, through wmma.
template <typename T, typename In, int K>
__global__ void warp_mma(const T* a, const T* b, float* c) {
    using namespace nvcuda;
    wmma::fragment<wmma::accumulator, 16, 16, K, float> acc;
    wmma::fill_fragment(acc, 1.0f);
    for (int k0 = 0; k0 < 16; k0 += K) {
        wmma::fragment<wmma::matrix_a, 16, 16, K, In, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, K, In, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, a + k0, 16);
        wmma::load_matrix_sync(fb, b + k0 * 16, 16);
        if constexpr (std::is_same<In, wmma::precision::tf32>::value) {
            for (int t = 0; t < fa.num_elements; ++t) fa.x[t] = wmma::__float_to_tf32(fa.x[t]);
            for (int t = 0; t < fb.num_elements; ++t) fb.x[t] = wmma::__float_to_tf32(fb.x[t]);
        }
        wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c, acc, 16, wmma::mem_row_major);
}
"""

EXPRESSIONS = ["neighbour<true>", "neighbour<false>", "divergent_syncthreads", "early_exit_then_syncthreads",
               "divergent_syncwarp", "write_past_end", "copy_one", "shuffles<1, 32>", "shuffles<3, 32>", "shuffles<1, 16>",
               "warp_mma<__half, __half, 16>",
               "warp_mma<__nv_bfloat16, __nv_bfloat16, 16>", "warp_mma<float, nvcuda::wmma::precision::tf32, 8>"]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("host_kernels")
    shutil.copy(cuda_host._build.source_dir() / "gradops_common.cuh", directory)
    (directory / "host_model.cu").write_text(TEST_KERNELS)
    return cuda_host.HostKernels("host_model.cu", EXPRESSIONS, directory)


def test_planted_bug_problems_are_named_by_code_and_plain_captures():
    """A planted-bug test runs the real sources once per problem: two runs share a key only with
    the same code and equal plain captures; a captured array is never taken as the same problem."""
    def runs(value):
        return lambda: value

    def check(got, want):
        return None

    key = cuda_host._problem_key
    assert key("a.cu", runs(1), check, 3) == key("a.cu", runs(1), check, 3)
    assert key("a.cu", runs(1), check, 3) != key("a.cu", runs(2), check, 3)
    assert key("a.cu", runs(np.float32), check, 3) != key("a.cu", runs(np.float64), check, 3)
    assert key("a.cu", runs(1), check, 3) != key("a.cu", runs(1), check, 4)
    assert key("a.cu", runs(1), check, 3) != key("a.cu", lambda: 1, check, 3)
    assert key("a.cu", runs(np.zeros(3)), check, 3) is None
    assert key("a.cu", runs(1), lambda got, want, tol=np.zeros(1): None, 3) is None


def test_host_builds_take_the_precompiled_runtime_header(tmp_path):
    """g++ reads the precompiled runtime header (``-H`` marks a precompiled header it used
    with ``!``), also for a build posing as sm_75; a kernel source next to it is still parsed."""
    import subprocess

    folder = cuda_host.runtime_header_pch()
    assert folder is not None
    source = tmp_path / "probe.cpp"
    source.write_text(f'#include "{cuda_host.RUNTIME_HEADER.name}"\n#include "gradops_common.cuh"\n')
    for defines in ([], ["-DGRADOPS_HOST_ARCH=750"]):
        build = subprocess.run(["g++", *cuda_host.HOST_CXX_FLAGS, "-fsyntax-only", "-H", *defines, f"-I{folder}",
                                f"-I{cuda_host.HERE}", f"-I{cuda_host._build.source_dir()}",
                                f"-I{cuda_host.toolkit_include()}", str(source)], capture_output=True, text=True)
        assert build.returncode == 0, build.stderr
        included = build.stderr.splitlines()
        assert included[0] == f"! {folder / cuda_host.RUNTIME_HEADER.name}.gch"
        assert any(line.endswith("gradops_common.cuh") for line in included)


BUILD_ONCE_CHILD = r"""
import subprocess, sys
sys.path[:0] = sys.argv[1:3]
import cuda_host
real_run = subprocess.run
def run(args, *more, **options):  # log each library build (g++ -shared) before running it
    if args[0] == "g++" and "-shared" in args:
        with open(sys.argv[4], "a") as log:
            log.write("build\n")
    return real_run(args, *more, **options)
cuda_host.subprocess.run = run
cuda_host.HostKernels("probe.cu", ["copy_one"], sys.argv[3])
"""


def new_probe_sources(folder, text=None):
    """``folder`` holding gradops_common.cuh and a probe.cu of the test kernels under a fresh
    comment (a library no earlier run built), or of ``text``; returns probe.cu's text."""
    import uuid

    folder.mkdir(exist_ok=True)
    shutil.copy(cuda_host._build.source_dir() / "gradops_common.cuh", folder)
    text = text or f"// {uuid.uuid4()}: a library no earlier run built\n{TEST_KERNELS}"
    (folder / "probe.cu").write_text(text)
    return text


def test_workers_build_a_library_once(tmp_path):
    """Two processes (test workers) that need the same library at once: one runs g++, the other
    waits for it and loads what it wrote."""
    import os
    import subprocess
    import sys

    new_probe_sources(tmp_path)
    log = tmp_path / "builds.log"
    tests, root = str(cuda_host.HERE), str(cuda_host.HERE.parent)
    children = [subprocess.Popen([sys.executable, "-c", BUILD_ONCE_CHILD, tests, root, str(tmp_path), str(log)],
                                 env={**os.environ, "PYTHONPATH": os.pathsep.join([tests, root])}) for _ in range(2)]
    assert [child.wait(timeout=300) for child in children] == [0, 0]
    assert log.read_text().splitlines() == ["build"]


def test_build_log_has_a_line_for_each_library_g_plus_plus_builds(tmp_path, monkeypatch):
    """``GRADOPS_HOST_BUILD_LOG``: a library built gets one line (its file, kernels, defines, not
    from the checkout, its seconds); a library read back from the build folder gets none."""
    import json

    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("GRADOPS_HOST_BUILD_LOG", str(log))
    new_probe_sources(tmp_path)
    cuda_host.HostKernels("probe.cu", ["copy_one"], tmp_path, arch=75)
    cuda_host.HostKernels("probe.cu", ["copy_one"], tmp_path, arch=75)
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert (row["file"], row["kernels"], row["defines"], row["checkout"]) == (
        "probe.cu", 1, ["-DGRADOPS_HOST_ARCH=750"], False)
    assert row["seconds"] > 0 and "test_build_log_has_a_line" in row["test"]


def test_the_same_sources_in_another_folder_reuse_their_library(tmp_path, monkeypatch):
    """A library is named by what g++ reads, not by the folder: the same sources copied to a
    second folder (a planted-bug test's copy, made anew each run) load the first folder's
    library without a build; an edit in any file of the folder builds anew."""
    import json

    log = tmp_path / "builds.jsonl"
    monkeypatch.setenv("GRADOPS_HOST_BUILD_LOG", str(log))
    folders = [tmp_path / name for name in ("first", "second", "edited")]
    text = new_probe_sources(folders[0])
    for folder in folders[1:]:
        new_probe_sources(folder, text)
    with open(folders[2] / "gradops_common.cuh", "a") as header:
        header.write("// an edit in a header the kernel source includes\n")
    first, second, edited = (cuda_host.HostKernels("probe.cu", ["copy_one"], folder) for folder in folders)
    assert second._lib._name == first._lib._name != edited._lib._name
    assert len(log.read_text().splitlines()) == 2
    assert all(json.loads(line)["file"] == "probe.cu" for line in log.read_text().splitlines())


def test_planted_devices_build_the_named_kernels_together(tmp_path, monkeypatch):
    """A device on edited sources builds the kernels named in ``build_together`` into one library
    when the first of them is asked for, and any other kernel alone; ``requested`` lists what
    was asked for, in order (what a planted-bug test's real-source run hands its planted run)."""
    filename = "fractional_max_pool_grad.cu"
    first, second, other = cuda_host._build.all_instantiations(90)[filename][:3]
    cuda_host.planted_sources(tmp_path, filename)
    built = []
    real_host_kernels = cuda_host.HostKernels

    def host_kernels(name, expressions, *args, **kwargs):
        built.append((name, list(expressions)))
        return real_host_kernels(name, expressions, *args, **kwargs)

    monkeypatch.setattr(cuda_host, "HostKernels", host_kernels)
    device = cuda_host.HostDevice(source_dir=tmp_path, build_together={filename: [first, second]})
    together = device.host_kernels(filename, second)
    assert device.host_kernels(filename, first) is together
    alone = device.host_kernels(filename, other)
    assert alone is not together
    assert built == [(filename, [first, second]), (filename, [other])]
    assert device.requested == {filename: [second, first, other]}
    assert together.signature(first) and alone.signature(other)


@pytest.mark.parametrize("pose", [dict(compute_capability=75), dict(compute_capability=90, build_as_arch=True)],
                         ids=["sm75", "sm90-as-arch"])
def test_posed_checkout_devices_build_each_kernel_alone(monkeypatch, pose):
    """A device on the checkout's sources posing as an older GPU (or building as its arch)
    builds each kernel it is asked for in a library of its own, the newest-arch device the whole
    file in one (shared by every test), and with POSED_BUILDS_ALONE off the posed device the
    whole file as its arch compiles it (no g++ here: the builds are recorded, not made)."""
    filename = "fractional_max_pool_grad.cu"
    first, second = cuda_host._build.all_instantiations(pose["compute_capability"])[filename][:2]
    built = []

    def host_kernels(name, expressions, *args, arch=None, **kwargs):
        built.append((name, list(expressions), arch))
        return object()

    monkeypatch.setattr(cuda_host, "HostKernels", host_kernels)
    posed = cuda_host.HostDevice(**pose)
    one = posed.host_kernels(filename, first)
    assert posed.host_kernels(filename, first) is one and posed.host_kernels(filename, second) is not one
    arch = pose["compute_capability"]
    assert built == [(filename, [first], arch), (filename, [second], arch)]
    built.clear()
    newest = cuda_host.HostDevice()
    assert newest.host_kernels(filename, first) is newest.host_kernels(filename, second)
    assert built == [(filename, list(cuda_host._build.all_instantiations()[filename]), None)]
    built.clear()
    monkeypatch.setattr(cuda_host, "POSED_BUILDS_ALONE", False)
    whole = cuda_host.HostDevice(**pose)
    assert whole.host_kernels(filename, first) is whole.host_kernels(filename, second)
    assert built == [(filename, list(cuda_host._build.all_instantiations(arch)[filename]), arch)]


def test_barrier_orders_shared_memory(kernels):
    """With __syncthreads every order gives the same answer; without it the answer depends on
    which thread runs first, so running in two orders exposes the race."""
    results = {}
    for barrier in (True, False):
        for order in ("forward", "reverse", "shuffled"):
            out = np.full(64, -1, np.int32)
            kernels.launch(f"neighbour<{str(barrier).lower()}>", (1,), (64,), [out], [], order=order, seed=5)
            results[barrier, order] = out
    want = (np.arange(1, 65) % 64) * 10
    for order in ("forward", "reverse", "shuffled"):
        np.testing.assert_array_equal(results[True, order], want)
    assert not np.array_equal(results[False, "forward"], results[False, "reverse"])


RACE_KERNELS = r"""
#include "gradops_common.cuh"
#include "tensor_core_ptx.cuh"

// In namespace gradops, as the kernels of cuda_src/ (cuda_host.shared_variables looks there).
namespace gradops {

// Each thread writes its own slot of a shared array and then reads slot (t + SHIFT) % 64 of
// it, with BARRIER between: 0 none, 1 __syncthreads, 2 __syncwarp.
template <int BARRIER, int SHIFT>
__global__ void exchange(int* out) {
    __shared__ int values[64];
    values[threadIdx.x] = static_cast<int>(threadIdx.x);
    if (BARRIER == 1) __syncthreads();
    if (BARRIER == 2) __syncwarp();
    out[threadIdx.x] = values[(threadIdx.x + SHIFT) % 64];
}

// Every thread writes one word (write-after-write), or thread 0 reads it and thread 1 writes
// it; then the next block of the grid does the same.
template <bool ALL_WRITE>
__global__ void one_word(int* out) {
    __shared__ int word;
    if (!ALL_WRITE && threadIdx.x == 0) out[blockIdx.x] = word;
    if (ALL_WRITE || threadIdx.x == 1) word = static_cast<int>(threadIdx.x);
}

// Each lane stores 16 bytes with st.shared.v4 and reads its neighbour's first word with
// ld.shared.b32, WARP_BARRIER deciding whether a __syncwarp lies between.
template <bool WARP_BARRIER>
__global__ void primitives(unsigned* out) {
    __shared__ __align__(16) unsigned rows[32][4];
    const unsigned mine[4] = {threadIdx.x, 1u, 2u, 3u};
    gradops::ptx::st_shared_16(rows[threadIdx.x], mine);
    if (WARP_BARRIER) __syncwarp();
    out[threadIdx.x] = gradops::ptx::ld_shared_32(rows[(threadIdx.x + 1) % 32]);
}

}  // namespace gradops
"""

RACE_EXPRESSIONS = [f"gradops::{name}" for name in (
    "exchange<0, 1>", "exchange<1, 1>", "exchange<2, 1>", "exchange<2, 32>", "exchange<0, 0>", "one_word<true>",
    "one_word<false>", "primitives<true>", "primitives<false>")]


@pytest.fixture(scope="module")
def race_kernels(tmp_path_factory):
    directory = tmp_path_factory.mktemp("race_kernels")
    for header in ("gradops_common.cuh", "tensor_core_ptx.cuh"):
        shutil.copy(cuda_host._build.source_dir() / header, directory)
    (directory / "races.cu").write_text(RACE_KERNELS)
    return cuda_host.HostKernels("races.cu", RACE_EXPRESSIONS, directory, racecheck=True)


#: A read and a write of one byte by two threads: which comes first depends on the order.
EITHER = "(read-after-write|write-after-read)"


@pytest.mark.parametrize("expression,block,grid,hazard", [
    ("exchange<0, 1>", 64, 1, EITHER),                # thread t reads slot t + 1, which thread t + 1 writes
    ("exchange<1, 1>", 64, 1, None),
    ("exchange<2, 1>", 32, 1, None),                  # one warp: __syncwarp orders its lanes
    ("exchange<2, 1>", 64, 1, EITHER),                # lane 31 reads warp 1's slot 32: no block barrier
    ("exchange<2, 32>", 64, 1, EITHER),
    ("exchange<0, 0>", 64, 1, None),                  # each thread its own slot: no other thread's
    ("one_word<true>", 64, 1, "write-after-write"),
    ("one_word<false>", 64, 1, EITHER),
    ("one_word<true>", 1, 3, None),                   # one thread a block: blocks are ordered
    ("primitives<true>", 32, 1, None),
    ("primitives<false>", 32, 1, EITHER),             # the emulated primitives report their accesses
], ids=lambda v: str(v))
@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_racecheck_finds_hazards_in_any_order(race_kernels, expression, block, grid, hazard, order):
    """A racecheck build fails a launch at the first shared-memory access of one thread that no
    barrier orders after another thread's conflicting access, in every thread order (it needs
    no wrong result), and accepts the same kernels with their barriers."""
    out = np.zeros(64, np.int32)
    expression = f"gradops::{expression}"
    if hazard is None:
        race_kernels.launch(expression, (grid,), (block,), [out], [], order=order, seed=3)
    else:
        with pytest.raises(cuda_host.HostLaunchError, match=f"racecheck: {hazard} hazard on __shared__ "):
            race_kernels.launch(expression, (grid,), (block,), [out], [], order=order, seed=3)


def test_racecheck_names_the_variable_and_byte(race_kernels):
    out = np.zeros(64, np.int32)
    with pytest.raises(cuda_host.HostLaunchError,
                       match=r"write-after-read hazard on __shared__ gradops::exchange<0, 1>\(int\*\)::values, "
                             r"byte 4: thread \(0,0,0\) then thread \(1,0,0\)"):
        race_kernels.launch("gradops::exchange<0, 1>", (1,), (64,), [out], [], order="forward")


def test_racecheck_registers_every_shared_variable(race_kernels):
    """The racecheck build finds each kernel's __shared__ variables (the ranges it checks) and
    its instrumentation calls into them: a library whose hooks were dead would pass every
    racecheck launch."""
    names = {name.split("::")[-1] for _, _, name in cuda_host.shared_variables(
        cuda_host.Path(race_kernels._lib._name), race_kernels._lib)}
    assert names == {"values", "word", "rows"}
    before = race_kernels.race_accesses()
    race_kernels.launch("gradops::exchange<1, 1>", (1,), (64,), [np.zeros(64, np.int32)], [])
    assert race_kernels.race_accesses() - before == 128  # 64 writes and 64 reads


@pytest.mark.parametrize("kernel,message", [("divergent_syncthreads", "__syncthreads reached by 16 threads"),
                                            ("early_exit_then_syncthreads", "while 1 had exited"),
                                            ("divergent_syncwarp", "reached by 8 of 32 lanes")])
def test_divergent_barriers_are_reported(kernels, kernel, message):
    out = np.zeros(64, np.int32)
    with pytest.raises(cuda_host.HostLaunchError, match=message):
        kernels.launch(kernel, (1,), (64,), [out], [])


def test_writes_outside_an_array_are_caught(kernels):
    device = cuda_host.HostDevice()
    out = device.empty((10,), np.float32)
    assert np.all(np.isnan(out)), "arrays start as NaN, so unwritten elements show"
    kernels.launch("write_past_end", (2,), (4,), [out], [np.int64(9)])
    device.check_guards()  # 9 + 1 elements: still inside
    kernels.launch("write_past_end", (2,), (4,), [out], [np.int64(10)])
    with pytest.raises(AssertionError, match="outside an array of 40 bytes"):
        device.check_guards()


def test_arrays_are_aligned_as_cuda_mallocs_are():
    """Every array the stand-in allocates starts at a multiple of 256 bytes, as cudaMalloc's do
    (NumPy aligns its own buffers to 16 or 64 bytes), with its guards around it: which 32-byte
    sectors a kernel's loads touch (HostKernels.global_load_stats) depends on it."""
    device = cuda_host.HostDevice()
    for count, dtype in ((1, np.float16), (3, np.float32), (1000, np.float64), (4097, np.uint8)):
        for _ in range(4):
            out = device.empty((count,), dtype)
            assert out.ctypes.data % cuda_host.GUARD_ALIGN == 0, (count, dtype)
    for start, array_start, array_end, end in device.allocation_bounds():
        assert start % cuda_host.GUARD_ALIGN == 0 and array_start - start >= cuda_host.GUARD_ALIGN
        assert end - array_end == array_start - start


@pytest.mark.parametrize("delta", [1, 3])
def test_warp_shuffles_follow_the_isa(kernels, rng, delta):
    """shfl.sync.up / .down (width 32): lane l gets lane l - delta's (l + delta's) value, and its
    own where that lane is outside the warp; 32-bit words and floats (NaN bits included) pass
    unchanged."""
    bits = rng.integers(0, 2**32, 32, dtype=np.uint32)
    values = rng.standard_normal(32).astype(np.float32)
    values[7] = np.nan
    outs = [np.zeros(32, np.uint32), np.zeros(32, np.uint32), np.zeros(32, np.float32), np.zeros(32, np.float32)]
    kernels.launch(f"shuffles<{delta}, 32>", (1,), (32,), [bits, values, *outs], [], order="shuffled", seed=5)
    lanes = np.arange(32)
    up_from = np.where(lanes - delta >= 0, lanes - delta, lanes)
    down_from = np.where(lanes + delta < 32, lanes + delta, lanes)
    np.testing.assert_array_equal(outs[0], bits[up_from])
    np.testing.assert_array_equal(outs[1], bits[down_from])
    np.testing.assert_array_equal(outs[2].view(np.uint32), values[up_from].view(np.uint32))
    np.testing.assert_array_equal(outs[3].view(np.uint32), values[down_from].view(np.uint32))


def test_warp_shuffles_need_the_whole_warp(kernels, rng):
    """A full-mask shuffle that half the warp's lanes skip is refused (a GPU's result is
    undefined and it can hang)."""
    args = [np.zeros(32, np.uint32), np.zeros(32, np.float32)] + [np.zeros(32, np.uint32)] * 2 + [
        np.zeros(32, np.float32)] * 2
    with pytest.raises(cuda_host.HostLaunchError, match="partial warp|reached by"):
        kernels.launch("shuffles<1, 16>", (1,), (32,), args, [])


def test_memory_faults_end_the_launch_not_the_process(kernels):
    out = np.zeros(1, np.float32)
    unmapped = 16  # the first page is never mapped
    with pytest.raises(cuda_host.HostLaunchError, match="memory fault"):
        kernels.launch("copy_one", (1,), (1,), [unmapped, out], [])
    kernels.launch("copy_one", (1,), (1,), [np.ones(1, np.float32), out], [])  # the runtime still works
    assert out[0] == 1


@pytest.mark.parametrize("expression,dtype", [
    ("warp_mma<__half, __half, 16>", np.float16),
    ("warp_mma<__nv_bfloat16, __nv_bfloat16, 16>", "bfloat16"),
    ("warp_mma<float, nvcuda::wmma::precision::tf32, 8>", np.float32)])
def test_wmma_emulation_multiplies(kernels, rng, expression, dtype):
    """Fragments load, multiply and store like the hardware's: c = a b + 1 for every lane's
    elements (float32 in TF32 mode: inputs rounded to 10 mantissa bits first)."""
    import ml_dtypes

    dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    a, b = random_array(rng, (16, 16), dtype), random_array(rng, (16, 16), dtype)
    c = np.full((16, 16), np.nan, np.float32)
    kernels.launch(expression, (1,), (32,), [a, b, c], [], order="shuffled", seed=3)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if dtype == np.float32:
        a64, b64 = tf32(a), tf32(b)
        assert not np.array_equal(a64, a.astype(np.float64)), "rounding to TF32 changed some inputs"
    want = a64 @ b64 + 1
    # float sums of exact products: error below 16 roundings of the sum of |terms|.
    assert np.all(np.abs(c - want) <= 16 * 2.0**-24 * (np.abs(a64) @ np.abs(b64) + 1))


def tf32(x):
    """float32 rounded to TF32 (10 mantissa bits, ties away from zero), as float64."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


# Bugs planted in the filter gradient's scalar row table (igemm_tiles.cuh, Loader::ROW_TABLE),
# run on a problem of float32 with 30 input channels (scalar loads; 270 taps: three CTAs along
# the GEMM's rows, whose tables differ) and a two-way split reduction.  The host model's
# __shared__ variables are function statics that outlive a block (and, being inline functions'
# statics, are shared with the real sources' build loaded before), so a table read before its
# barrier finds another CTA's entries, not zeros: only a problem whose CTAs' tables differ
# shows that bug.
ROW_TABLE_PLANTED = {
    "row-table-read-before-its-barrier": (
        "            fill_row_table(p, m0);\n            __syncthreads();", "            fill_row_table(p, m0);"),
    "row-table-position-past-the-reduction-not-absent": ("in_reduction ? w : kAbsent,", "w,"),
    "row-table-columns-read-as-rows": (
        "load_ints<C>(reinterpret_cast<const int*>(&table.w[row]), w);",
        "load_ints<C>(reinterpret_cast<const int*>(&table.h[row]), w);"),
}


# Bugs planted in the input gradient's scalar k table (Loader, K_TABLE), run on a problem of
# float32 with 6 input and 40 output channels (scalar loads; up to 4 taps x 40 channels: up to
# 10 k-tiles of 16 per stride phase, 5 of 32 for float16, so the table's slots are refilled
# inside the main loop):
# run_k_table_problem.  The fill's cursors are registers for float32 (the SIMT kernel) and
# shared memory for float16 (the tensor-core kernel, SHARED_FILL): K_TABLE_DTYPES.
K_TABLE_PLANTED = {
    "k-table-read-before-its-barrier": (
        "            init_k_table(p);\n            __syncthreads();", "            init_k_table(p);"),
    "k-table-refills-the-slot-about-to-be-read": (
        "fill_k_table(p, buf, k0 + 2 * BK);  // tile i + 2", "fill_k_table(p, buf ^ 1, k0 + 2 * BK);  // tile i + 2"),
    "k-table-cursor-not-advanced": ("            cursor() = pos;\n", "\n"),
    "k-table-entries-past-the-reduction-not-absent": (
        "return {in_reduction ? dp : static_cast<int>(static_cast<unsigned>(p_offset) - out_rows), dq,",
        "return {dp, dq,"),
    "k-table-b-past-the-reduction-not-zeroed": (
        "if (in_reduction && src.ok) rb[e * C + v]", "if (src.ok) rb[e * C + v]"),
}


K_TABLE_DTYPES = {"k-table-cursor-not-advanced": (np.float32, np.float16),
                  "k-table-refills-the-slot-about-to-be-read": (np.float32, np.float16)}


def run_k_table_problem(rng, nan_row: bool, dtype=np.float32):
    """(launcher result, NumPy result) of the k-table problem; ``nan_row``: out_backprop's row 4
    is NaN in channel 0.  A tile's entries past the end of a phase's reduction (40 or 80 of
    them: 8 past a multiple of 16) then decompose to the tap row after the phase's last, which
    reads a row that the element's real taps do not: were they not absent, the NaN (0 * NaN)
    would reach input-gradient positions that the reference leaves finite."""
    import cupy

    x_shape, f_shape, strides = (2, 13, 11, 6), (3, 3, 6, 40), (2, 2)
    filt = random_array(rng, f_shape, dtype)
    dy = random_array(rng, (2, 7, 6, 40), dtype)
    if nan_row:
        dy[:, 4, :, 0] = np.nan
    g = conv_geometry("conv2d_backprop_input", x_shape, f_shape, dy.shape, "NHWC", strides, "SAME", (1, 1), NO_PADS)
    launcher = importlib.import_module("gradops.backends.cuda.conv2d_backprop_input")
    got = launcher.conv2d_backprop_input(g, cupy.asarray(filt), cupy.asarray(dy), path="tiled", vector=False)
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, strides=[1, *strides, 1], padding="SAME",
                                         backend="numpy")
    return np.asarray(got), want


def assert_same_with_nan(got, want, dtype):
    """NaN exactly where ``want`` has NaN, and close elsewhere."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    assert_close(got[finite], want[finite], dtype)


@pytest.mark.parametrize("bug,dtype", [(bug, dtype) for bug in sorted(K_TABLE_PLANTED)
                                       for dtype in K_TABLE_DTYPES.get(bug, (np.float32,))])
def test_planted_k_table_bugs_fail_the_comparison(bug, dtype, tmp_path, monkeypatch):
    def run():
        nan_row = "absent" in bug
        got, want = run_k_table_problem(np.random.default_rng(7), nan_row, dtype)
        if nan_row:
            assert np.isnan(want).any() and not np.isnan(want).all()
        assert_same_with_nan(got, want, dtype)

    cuda_host.HostDevice(order="shuffled", seed=11).install(monkeypatch)
    run()
    filename = "conv2d_backprop_input.cu" if "absent" in bug else "igemm_tiles.cuh"
    cuda_host.planted_sources(tmp_path, filename, K_TABLE_PLANTED[bug])
    cuda_host.HostDevice(order="shuffled", seed=11, source_dir=tmp_path).install(monkeypatch)
    with pytest.raises((AssertionError, cuda_host.HostLaunchError)):  # wrong, or a fault
        run()


@pytest.mark.parametrize("bug", sorted(ROW_TABLE_PLANTED))
def test_planted_row_table_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    def run():
        return run_planted_problem("conv2d_backprop_filter", "tiled", np.float32, np.random.default_rng(7),
                                   depths=(30, 4), vector=False)

    cuda_host.assert_planted_bug_caught("igemm_tiles.cuh", ROW_TABLE_PLANTED[bug], run,
                                        lambda got, want: assert_close(got, want, np.float32), 11, tmp_path,
                                        monkeypatch)


# --------------------------------------------------------------------------- planted bugs
# Each entry edits one line of a copy of cuda_src/ and runs a launcher on a problem that the
# real sources get right (the launcher tests show that): the result must now be wrong, or the
# launch refused.  (file, text, replacement, op, path)
PLANTED = {
    "missing-barrier-after-tile-store": (
        "igemm_tiles.cuh", "            if (more) store(As[buf ^ 1], Bs[buf ^ 1]);\n"
        "            __syncthreads();  // tile i + 1",
        "            if (more) store(As[buf ^ 1], Bs[buf ^ 1]);\n"
        "            // tile i + 1",
        "conv2d_backprop_filter", np.float64),
    "tile-stored-into-the-buffer-being-read": (
        "igemm_tiles.cuh", "            if (more) store(As[buf ^ 1], Bs[buf ^ 1]);",
        "            if (more) store(As[buf], Bs[buf]);",
        "conv2d_backprop_filter", np.float16),
    # sm_70/75's half-type tensor-core path (WMMA; the stand-in poses as sm_75: PLANTED_ARCH).
    "wmma-epilogue-missing-syncwarp": (
        "igemm_tiles.cuh", "            wmma::store_matrix_sync(st, acc[i][j], 16, wmma::mem_row_major);\n"
        "            __syncwarp();\n",
        "            wmma::store_matrix_sync(st, acc[i][j], 16, wmma::mem_row_major);\n",
        "conv2d_backprop_input", np.float16),
    # sm_80+'s half-type tensor-core path (mma_cta: ldmatrix + mma.sync).
    "mma-epilogue-missing-syncwarp": (
        "igemm_tiles.cuh", "            __syncwarp();  // the staged block is complete\n", "\n",
        "conv2d_backprop_input", np.float16),
    "mma-a-fragment-loaded-without-trans": (
        "igemm_tiles.cuh", "ptx::ldmatrix<4, true>(a[i], &As[buf][a_trans", "ptx::ldmatrix<4, false>(a[i], &As[buf][a_trans",
        "conv2d_backprop_filter", np.float16),
    "mma-k-contiguous-a-loaded-with-trans": (
        "igemm_tiles.cuh", "ptx::ldmatrix<4, false>(a[i],", "ptx::ldmatrix<4, true>(a[i],",
        "conv2d_backprop_input", np.float16),
    "mma-swizzled-a-tile-read-unswizzled": (
        "igemm_tiles.cuh", "LayoutA::offset(wm + 8 * (matrix % 2) + row, kk + KH * (matrix / 2))",
        "(wm + 8 * (matrix % 2) + row) * BK + kk + KH * (matrix / 2)",
        "conv2d_backprop_input", np.float16),
    "mma-b-fragment-n8-tiles-swapped": (
        "igemm_tiles.cuh", "                b[j][0] = q[0];\n                b[j][1] = q[1];\n"
        "                b[j + 1][0] = q[2];\n                b[j + 1][1] = q[3];\n",
        "                b[j][0] = q[2];\n                b[j][1] = q[3];\n"
        "                b[j + 1][0] = q[0];\n                b[j + 1][1] = q[1];\n",
        "conv2d_backprop_input", np.float16),
    "split-reduction-reads-past-the-batch": (
        "conv2d_backprop_filter.cu", "min(reduction, (split + 1) * split_size));\n    prob.x =",
        "(split + 1) * split_size);\n    prob.x =",
        "conv2d_backprop_filter", np.float64),
    "vector-chunk-start-not-scaled": (
        "igemm_tiles.cuh", "k = u % (BK / C) * C;", "k = u % (BK / C);", "conv2d_backprop_input", np.float64),
    "filter-direct-tree-reduction-off-by-one": (
        "conv2d_backprop_filter.cu", "for (int half = kFilterDirectThreads / 2; half > 0; half /= 2)",
        "for (int half = kFilterDirectThreads / 2; half > 1; half /= 2)", "conv2d_backprop_filter", np.float64),
}


#: The compute capability the stand-in reports (and builds the kernels as) for a planted bug,
#: where it is not the default sm_90.
PLANTED_ARCH = {"wmma-epilogue-missing-syncwarp": 75}


def run_planted_problem(op, path, dtype, rng, depths=(6, 4), vector=None, splits=2, tile=None):
    """(launcher result, NumPy backend result) of a problem with two tiles along the GEMM's rows,
    stride 2 and, for the filter gradient's tiled path, a ``splits``-way split reduction (by
    default 2, whose first split spans several reduction tiles: 84 = 2 x 7 x 6 reduction
    indices).  ``depths``: input and output channels.  The default even counts give float64 the
    tiled kernels' vector loads (2 elements); float16 (8) not.  ``vector`` and ``tile`` (the
    tiled path's (BM, BN)) force the choices."""
    import cupy  # the installed HostDevice: its arrays sit between NaN guards

    launcher = importlib.import_module(f"gradops.backends.cuda.{op}")
    x_shape, f_shape, strides = (2, 13, 11, depths[0]), (3, 3, *depths), (2, 2)
    x, filt = random_array(rng, x_shape, dtype), random_array(rng, f_shape, dtype)
    a = dict(strides=[1, *strides, 1], padding="SAME")
    dy = gradops.conv2d(x, filt, **a, backend="numpy")
    g = conv_geometry(op, x_shape, f_shape, dy.shape, "NHWC", strides, "SAME", (1, 1), NO_PADS)
    options = {} if vector is None else {"vector": vector}
    if tile is not None:
        options["tile"] = tile
    if op == "conv2d_backprop_filter":
        if path == "tiled" and splits:
            options["splits"] = splits
        got = launcher.conv2d_backprop_filter(g, cupy.asarray(x), cupy.asarray(dy), path=path, **options)
        return got, gradops.conv2d_backprop_filter(x, f_shape, dy, **a, backend="numpy")
    got = launcher.conv2d_backprop_input(g, cupy.asarray(filt), cupy.asarray(dy), path=path, **options)
    return got, gradops.conv2d_backprop_input(x_shape, filt, dy, **a, backend="numpy")


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    filename, text, replacement, op, dtype = PLANTED[bug]
    path = "direct" if "direct" in bug else "tiled"

    arch = PLANTED_ARCH.get(bug, 90)
    # The real sources get this problem right ...
    cuda_host.HostDevice(order="shuffled", seed=11, compute_capability=arch).install(monkeypatch)
    got, want = run_planted_problem(op, path, dtype, np.random.default_rng(7))
    assert_close(got, want, dtype)

    # ... and the edited ones do not.
    cuda_host.planted_sources(tmp_path, filename, (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=11, source_dir=tmp_path, compute_capability=arch).install(monkeypatch)
    try:
        got, want = run_planted_problem(op, path, dtype, np.random.default_rng(7))
    except (AssertionError, cuda_host.HostLaunchError):
        return  # refused: a barrier error or a write outside an array
    with pytest.raises(AssertionError):
        assert_close(got, want, dtype)


# Bugs planted in the scalar-load half-type filter gradient's ldmatrix.trans addresses (mma_cta,
# TRANS_XOR: a block's address is block 0's XOR its chunk offset), run on float16 with 6 input
# and 20 output channels (scalar loads; B's second n8 tile pair holds output channels 16-19, so
# its address is read for channels that exist).
TRANS_XOR_PLANTED = {
    "trans-xor-a-blocks-added": ("a_trans ^ (MMA_M * i)", "a_trans + (MMA_M * i)"),
    "trans-xor-b-tile-pairs-added": ("b_trans ^ (MMA_N * j)", "b_trans + (MMA_N * j)"),
    "trans-xor-a-base-without-the-lane-row": ("kk + 8 * (matrix / 2) + row)) : 0;", "kk + 8 * (matrix / 2))) : 0;"),
}


@pytest.mark.parametrize("bug", sorted(TRANS_XOR_PLANTED))
def test_planted_trans_xor_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    def run():
        return run_planted_problem("conv2d_backprop_filter", "tiled", np.float16, np.random.default_rng(7),
                                   depths=(6, 20), vector=False)

    cuda_host.assert_planted_bug_caught("igemm_tiles.cuh", TRANS_XOR_PLANTED[bug], run,
                                        lambda got, want: assert_close(got, want, np.float16), 11, tmp_path,
                                        monkeypatch)


# Bugs planted in copies of the depthwise tiled kernel, each run on problems the real source
# gets right: (text, replacement, [(problem, ...)]), a problem being (x_shape NHWC, filter
# size, stride, padding, pads, multiplier, dtype, Inf at filter tap (0, 0) of channel 1?[,
# layout: "NHWC" unless given; NCHW runs the same sizes with channels first]).
DEPTHWISE_SOURCE = "depthwise_conv2d_native_backprop_input.cu"
DW_3X3 = ((2, 17, 21, 40), 3, 1, "SAME", NO_PADS, 1, np.float16, False)   # 16-byte staging, slot columns, 2 tiles down
DW_5X5_S2 = ((2, 19, 23, 12), 5, 2, "EXPLICIT", ((1, 2), (3, 0)), 1, np.float32, False)  # odd pads
DW_F32_S1 = ((2, 13, 21, 40), 3, 1, "SAME", NO_PADS, 1, np.float32, False)  # 16-byte staging, walked rows
DW_M2 = ((1, 9, 18, 37), 5, 1, "SAME", NO_PADS, 2, np.float64, False)  # one element per load
DW_INF = ((2, 13, 21, 40), 3, 1, "SAME", NO_PADS, 1, np.float32, True)
DW_M2_INF = ((1, 9, 18, 37), 5, 1, "SAME", NO_PADS, 2, np.float64, True)  # slice 0 of two not finite
# NCHW (a ninth field): 16-byte chunks of out_backprop rows starting 7 (float16) or 3 (float32)
# columns before the tile, 4-column result stores with the image ending inside the last tile
# (8-column tiles at stride 1: 40 = 5 x 8, 20 = 2 x 8 + 4).
DW_NCHW_F16 = ((2, 13, 40, 20), 3, 1, "SAME", NO_PADS, 1, np.float16, False, "NCHW")
DW_NCHW_F32 = ((1, 11, 20, 36), 3, 1, "SAME", NO_PADS, 1, np.float32, False, "NCHW")
DW_NCHW_M3 = ((1, 11, 32, 9), 3, 2, "SAME", NO_PADS, 3, np.float32, False, "NCHW")  # three slices
DW_NCHW_ROWS8 = ((1, 9, 28, 12), 3, 1, "SAME", NO_PADS, 1, np.float16, False, "NCHW")  # 8-byte chunks
# NCHW staging stores: runs of 4 columns with chunks starting 4 columns before the tile (o_col0 =
# 4 mod 8), and element stores with chunks starting 6 before it (o_col0 = 2 mod 4); staged rows
# of 18 columns in rows of 20 (the pitch is not the width).  Paired multiplier 2: NCHW's slot
# order.
DW_NCHW_SHIFT4 = ((1, 9, 24, 20), 3, 1, "EXPLICIT", ((1, 1), (6, 4)), 1, np.float16, False, "NCHW")
DW_NCHW_ODD = ((1, 9, 32, 20), 3, 1, "EXPLICIT", ((1, 1), (0, 2)), 1, np.float16, False, "NCHW")
DW_NCHW_PAIRED = ((1, 11, 20, 18), 3, 1, "SAME", NO_PADS, 2, np.float32, False, "NCHW")
DW_NCHW_COLS29 = ((2, 9, 29, 12), 3, 1, "SAME", NO_PADS, 1, np.float32, False, "NCHW")  # element result stores
# Narrow 8 x 8 tiles (a tenth field; stride 2 only): three tiles across 20 columns (the last one
# 4 past the image), and a 7 x 7 map in one tile.
DW_NARROW_NHWC = ((2, 9, 20, 40), 3, 2, "SAME", NO_PADS, 1, np.float16, False, "NHWC", "narrow")
DW_NARROW_NCHW = ((1, 11, 20, 36), 3, 2, "SAME", NO_PADS, 1, np.float32, False, "NCHW", "narrow")
DW_NARROW_7X7 = ((2, 7, 7, 24), 3, 2, "SAME", NO_PADS, 2, np.float32, False, "NHWC", "narrow")
# Two row groups per staging unit: 5x5 stride 2 on narrow tiles, float32 (64 threads, 3 chunks x
# 32 slots of 6 staged rows: dwconv::row_groups picks 2).
DW_NCHW_GROUPS = ((1, 11, 24, 36), 5, 2, "SAME", NO_PADS, 1, np.float32, False, "NCHW", "narrow")
DEPTHWISE_PLANTED = {
    # The slice loop's two barriers: slices staged one element per load (DW_M2's two) need both.
    # The 16-byte staging of a single slice runs before the loop, so either barrier fences it from
    # the sums (neither edit alone breaks DW_3X3 or DW_NARROW_NHWC).
    "depthwise-tile-read-before-the-barrier": (
        "        __syncthreads();  // the slice is staged\n", "\n", [DW_M2]),
    "depthwise-next-slice-staged-while-this-one-is-read": (
        "        __syncthreads();  // the flag is initialised; the previous slice has been read\n", "\n", [DW_M2]),
    "depthwise-halo-one-row-short": (
        "constexpr int STEPS = (Rows::STAGED + GROUPS - 1) / GROUPS;",
        "constexpr int STEPS = (Rows::STAGED - 1 + GROUPS - 1) / GROUPS;", [DW_3X3]),
    "depthwise-staged-rows-start-one-late": (
        "tile_row * (S::TILE_ROWS / SH) - Rows::HALO;", "tile_row * (S::TILE_ROWS / SH) - Rows::HALO + 1;",
        [DW_3X3, DW_M2, DW_NARROW_7X7]),
    "depthwise-tile-ignores-the-pad-phase": (
        "const int y0 = tile_row * S::TILE_ROWS - pad_top % SH;", "const int y0 = tile_row * S::TILE_ROWS;",
        [DW_5X5_S2]),
    "depthwise-row-walk-without-carry": ("            offset += wrap;\n", "\n", [DW_F32_S1]),
    "depthwise-padding-taps-multiplied": ("            if (nonfinite_slice != q) {", "            if (true) {",
                                          [DW_INF]),
    # The flag of a non-finite slice, set after the loop's first barrier for both stagings (the
    # 16-byte staging runs before the loop, and thread 0 clears the flag before that barrier).
    "depthwise-non-finite-slice-not-flagged": (
        "        if (finite != Acc(0)) nonfinite_slice = q;  // NaN: some value was Inf or NaN\n", "\n", [DW_INF, DW_M2_INF]),
    # NCHW plane-row staging and quad stores
    "depthwise-nchw-chunks-ignore-the-column-phase": (
        "const int shift = o_col0 & (VEC - 1);", "const int shift = 0;", [DW_NCHW_F16, DW_NCHW_F32, DW_NCHW_ROWS8]),
    "depthwise-nchw-8-byte-chunks-taken-for-16": (
        "(vector_loads & 4) ? 8 :", "(vector_loads & 4) ? 16 :", [DW_NCHW_ROWS8]),
    "depthwise-nchw-row-groups-step-one-row": (
        "const int row_step = GROUPS * out_cols;", "const int row_step = out_cols;", [DW_NCHW_GROUPS]),
    "depthwise-nchw-chunk-edge-not-clipped": (
        "if (VEC == 1 || static_cast<unsigned>(p.first + e) < static_cast<unsigned>(COLS)) at[e] = values[e];",
        "if (VEC == 1 || p.first + e >= 0) at[e] = values[e];", [DW_NCHW_ODD]),
    "depthwise-nchw-runs-not-clipped": (
        "if (static_cast<unsigned>(p.first + e) < static_cast<unsigned>(COLS)) put_run<RUN>(at + e, values + e);",
        "put_run<RUN>(at + e, values + e);", [DW_NCHW_SHIFT4]),
    "depthwise-nchw-staged-rows-pitched-by-their-width": (
        "Acc* const at = p.to + k * GROUPS * RP;", "Acc* const at = p.to + k * GROUPS * COLS;",
        [DW_NCHW_F16, DW_NCHW_SHIFT4]),
    "depthwise-nchw-taps-stored-slot-major": (  # a lane reads its slots' taps as one adjacent pair
        "const int slot_at = L == NCHW ? V * (c % LANES) + c / LANES : swizzled(c, SWIZZLE && tap % 2 != 0);",
        "const int slot_at = L == NCHW ? c : swizzled(c, SWIZZLE && tap % 2 != 0);", [DW_NCHW_F16, DW_NCHW_F32]),
    "depthwise-nchw-paired-filter-in-nhwc-order": (
        "nchw_pairs ? 2 * (c % LANES) + c / LANES : c * channel_step + q", "c * channel_step + q", [DW_NCHW_PAIRED]),
    "depthwise-nchw-paired-planes-one-apart": (
        "const int step_lo = (pairs ? 2 : channel_step) * plane;", "const int step_lo = (pairs ? 1 : channel_step) * plane;",
        [DW_NCHW_PAIRED]),
    "depthwise-nchw-second-slot-stored-as-the-next-channel": (
        "const int c = channel + u * LANES;", "const int c = channel + u;", [DW_NCHW_F16, DW_NCHW_F32]),
    "depthwise-nchw-rows-stored-past-the-image": (
        "if (static_cast<unsigned>(y_first + i) >= static_cast<unsigned>(in_rows)) continue;\n                Acc quad",
        "\n                Acc quad", [DW_NCHW_F16, DW_NCHW_F32, DW_NARROW_NCHW]),
    "depthwise-nchw-elements-stored-past-the-image": (
        "if (static_cast<unsigned>(x + k) < static_cast<unsigned>(in_cols)) dst[k] = from_acc<T>(v[k]);",
        "dst[k] = from_acc<T>(v[k]);", [DW_NCHW_COLS29]),
    "depthwise-nchw-slice-planes-not-offset": (
        "const int plane0 = (n * out_depth + oc0 + q) * plane;", "const int plane0 = (n * out_depth + oc0) * plane;",
        [DW_NCHW_M3]),
    # NCHW taps: 16-byte reads of the staged rows (float accumulators at stride 1: ptx::ld_shared_16)
    "depthwise-nchw-taps-read-off-the-16-byte-grid": (
        "wr * RP + k * READ, row + k * READ);", "wr * RP + k * READ + 2, row + k * READ);", [DW_NCHW_F16, DW_NCHW_F32]),
    "depthwise-nchw-taps-runs-read-in-reverse": (
        "wr * RP + k * READ, row + k * READ);", "wr * RP + (RUNS - 1 - k) * READ, row + k * READ);",
        [DW_NCHW_F16, DW_NCHW_F32]),
    # narrow tiles: the tile origin and its staged columns must follow the tile's own width
    "depthwise-tile-origin-assumes-16-columns": (
        "const int x0 = tile_col * S::TILE_COLS - pad_left % SW;", "const int x0 = tile_col * 16 - pad_left % SW;",
        [DW_NARROW_NHWC, DW_NARROW_NCHW]),
    "depthwise-staged-columns-assume-16-columns": (
        "tile_col * (S::TILE_COLS / SW) - Cols::HALO;", "tile_col * (16 / SW) - Cols::HALO;",
        [DW_NARROW_NHWC, DW_NARROW_NCHW]),
}


def run_depthwise_planted(problem, rng):
    """(launcher result on the tiled path, NumPy backend result) of one planted-bug problem."""
    import cupy  # the installed HostDevice

    launcher = importlib.import_module(f"gradops.backends.cuda.{DEPTHWISE_SOURCE[:-3]}")
    from gradops._geometry import conv2d_geometry

    x_shape, f, stride, padding, pads, multiplier, dtype, inf, *rest = problem
    layout = rest[0] if rest else "NHWC"
    narrow = len(rest) > 1 and rest[1] == "narrow"
    if not narrow and (f, stride) == (5, 1):
        narrow = None  # 5x5 stride 1: its one tile width
    elif not narrow:
        narrow = False
    n, h, w, c = x_shape
    filt = random_array(rng, (f, f, c, multiplier), dtype)
    if inf:
        filt[0, 0, 1, 0] = np.inf
    out = [reference.window(size, f, stride, 1, padding, pad)[0] for size, pad in zip((h, w), pads)]
    if layout == "NHWC":
        explicit = [0, 0, *pads[0], *pads[1], 0, 0] if padding == "EXPLICIT" else []
        strides, sizes, dy_shape = [1, stride, stride, 1], list(x_shape), (n, *out, c * multiplier)
    else:
        explicit = [0, 0, 0, 0, *pads[0], *pads[1]] if padding == "EXPLICIT" else []
        strides, sizes, dy_shape = [1, 1, stride, stride], [n, c, h, w], (n, c * multiplier, *out)
    args = dict(strides=strides, padding=padding, explicit_paddings=explicit, data_format=layout)
    dy = random_array(rng, dy_shape, dtype)
    g = conv2d_geometry(DEPTHWISE_SOURCE[:-3], tuple(sizes), filt.shape, dy_shape, strides, padding, explicit,
                        layout, [1, 1, 1, 1], depthwise=True)
    # full-width tiles, which these problems' sizes were chosen for (image edges inside a tile,
    # chunk phases, row groups); the narrow ones (DW_NARROW_*) are forced likewise
    got = launcher.depthwise_conv2d_native_backprop_input(g, cupy.asarray(filt), cupy.asarray(dy), path="tiled",
                                                          narrow=narrow)
    with warnings.catch_warnings():  # the NumPy backend's own products of Inf and padded zeros
        warnings.simplefilter("ignore", RuntimeWarning)
        want = gradops.depthwise_conv2d_native_backprop_input(sizes, filt, dy, **args, backend="numpy")
    return np.asarray(got), want


def assert_same_result(got, want, dtype):
    """NaN and Inf where the NumPy backend has them, finite values close."""
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(want64))
    np.testing.assert_array_equal(np.isinf(got64), np.isinf(want64))
    finite = np.isfinite(want64)
    assert_close(got64[finite], want64[finite], dtype)


@pytest.mark.parametrize("bug", sorted(DEPTHWISE_PLANTED))
def test_planted_depthwise_tiled_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    text, replacement, problems = DEPTHWISE_PLANTED[bug]

    # The real source gets these problems right ...
    cuda_host.HostDevice(order="shuffled", seed=11).install(monkeypatch)
    for problem in problems:
        assert_same_result(*run_depthwise_planted(problem, np.random.default_rng(7)), problem[6])

    # ... and the edited one gets every one of them wrong.
    cuda_host.planted_sources(tmp_path, DEPTHWISE_SOURCE, (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=11, source_dir=tmp_path).install(monkeypatch)
    for problem in problems:
        try:
            got, want = run_depthwise_planted(problem, np.random.default_rng(7))
        except (AssertionError, cuda_host.HostLaunchError):
            continue  # refused: a barrier error or a write outside an array
        with pytest.raises(AssertionError):
            assert_same_result(got, want, problem[6])


@pytest.mark.parametrize("odd", [True, False], ids=["odd-planes", "planted-even-planes"])
def test_depthwise_nchw_tap_reads_are_conflict_free(monkeypatch, tmp_path, odd):
    """The NCHW tiled kernel's 16-byte tap reads (ptx::ld_shared_16, float accumulators at
    stride 1) take the fewest bank passes: its staged planes lie an odd number of 16 bytes apart,
    so the 8 lanes of a quarter-warp (8 slots, one column) read 8 different 16-byte bank groups
    (dwconv::Planes).  Planted planes an even number of 16 bytes apart put lanes on the same banks:
    the count sees more passes (the result stays right)."""
    source_dir = None
    expression = "gradops::depthwise_conv2d_native_backprop_input_tiled<float, float, 1, 3, 3, 1, 1, 2, 2>"
    if not odd:
        cuda_host.planted_sources(tmp_path, DEPTHWISE_SOURCE,
                                  ("(PLANE / UNIT) % 2 == 1 ? PLANE : PLANE + UNIT;", "(PLANE / UNIT) % 2 == 0 ? PLANE : PLANE + UNIT;"),
                                  ("(CP / UNIT) % 2 == 1, \"16-byte rows, odd", "true, \"16-byte rows, odd"))
        source_dir = tmp_path
    device = cuda_host.HostDevice(order="shuffled", seed=11, source_dir=source_dir).install(monkeypatch)
    kernels = device.host_kernels(DEPTHWISE_SOURCE, expression)
    kernels.shared_stats(reset=True, kind="ld_shared_16")
    assert_same_result(*run_depthwise_planted(DW_NCHW_F32, np.random.default_rng(7)), np.float32)
    reads = kernels.shared_stats(kind="ld_shared_16")
    assert reads["accesses"] > 0
    if odd:
        assert reads["wavefronts"] == reads["ideal"], reads
    else:
        assert reads["wavefronts"] > reads["ideal"], reads


# --------------------------------------------------------------------------- the public API on the stand-in


def test_public_api_routes_host_device_arrays_to_the_cuda_kernels(monkeypatch):
    """With the stand-in installed, gradops takes its arrays for GPU arrays: default dispatch
    (no cuDNN here) picks the CUDA backend, the kernels run through the host runtime, and the
    result is a stand-in array on the inputs' device."""
    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    rng = np.random.default_rng(3)
    w, dy = random_array(rng, (3, 3, 2, 2), np.float64), random_array(rng, (1, 5, 4, 4), np.float64)
    got = gradops.depthwise_conv2d_native_backprop_input([1, 5, 4, 2], cupy.asarray(w), cupy.asarray(dy),
                                                         [1, 1, 1, 1], "SAME")
    assert isinstance(got, cupy.ndarray) and got.device.id == 0
    assert gradops.last_backend_decision().backend == "cuda"
    assert [name for name, _, _ in device.launches] == [
        "gradops::depthwise_conv2d_native_backprop_input_tiled<double, double, 0, 3, 3, 1, 1, 1, 2>"]  # 5 rows: R = 1
    want = gradops.depthwise_conv2d_native_backprop_input([1, 5, 4, 2], w, dy, [1, 1, 1, 1], "SAME")
    np.testing.assert_allclose(cupy.asnumpy(got), want, rtol=1e-12)


def test_foreign_views_are_zero_copy_and_keep_their_device(monkeypatch):
    """CUDA-array-interface and DLPack producers are viewed in place, on their own device."""
    from conftest import CudaArrayInterfaceOnly, DLPackOnly

    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    with cupy.cuda.Device(1):
        a = cupy.asarray(np.arange(24, dtype=np.float32).reshape(2, 3, 4))[:, 1:, ::2]
    for wrapper in (CudaArrayInterfaceOnly, DLPackOnly):
        view = gradops._arrays.as_gpu_array("op", "x", wrapper(a))  # what gradops' dispatch does
        assert view.ctypes.data == a.ctypes.data and view.strides == a.strides and view.device.id == 1
        np.testing.assert_array_equal(cupy.asnumpy(view), cupy.asnumpy(a))
    with pytest.raises(ValueError, match="not in memory"):
        device.asarray(CudaArrayInterfaceOnly(np.zeros(3, np.float32).view(cuda_host.HostArray)))


def test_launches_with_host_memory_or_another_devices_array_are_refused(monkeypatch, kernels):
    """A kernel argument must point into an array of the current device, as on a GPU, or be
    null (a pointer the kernel does not use, as the depthwise filter gradient's one-slice
    launches pass)."""
    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    with cupy.cuda.Device(1):
        on_1 = cupy.zeros((4,), np.float32)
    launch = device.kernel("depthwise_conv2d_native_backprop_input.cu",
                           "gradops::depthwise_conv2d_native_backprop_input<float, float, 0, 0, 0, 0, 0>")
    host = np.zeros(4, np.float32)
    on_0 = cupy.zeros((4,), np.float32)
    sizes = (np.int64(0),) * 15  # the kernel's 15 long long sizes (zero: nothing to do)
    with pytest.raises(AssertionError, match="not in device memory"):
        launch((1,), (1,), (np.uint64(host.ctypes.data), on_0, on_0, *sizes))
    with pytest.raises(AssertionError, match="launched on device 0 with an array of device 1"):
        launch((1,), (1,), (np.uint64(on_1.ctypes.data), on_0, on_0, *sizes))
    launch((1,), (1,), (on_0, on_0, on_0, *sizes))  # the same launch, well formed
    launch((1,), (1,), (on_0, np.uint64(0), on_0, *sizes))  # a null pointer the empty launch never reads


DEPTHWISE = ("depthwise_conv2d_native_backprop_input.cu",
             "gradops::depthwise_conv2d_native_backprop_input<float, float, 0, 0, 0, 0, 0>")


def test_kernel_signature_comes_from_the_host_build(kernels):
    """The stand-in's argument check reads each kernel's C++ parameter list: three pointers,
    then 15 ``long long`` sizes for the depthwise kernel; double and int parameters elsewhere."""
    host = cuda_host.HostKernels(DEPTHWISE[0], [DEPTHWISE[1]])
    assert host.signature(DEPTHWISE[1]) == [0, 0, 0] + [8] * 15
    reduce = "gradops::split_reduce<double, double>"
    assert cuda_host.HostKernels("conv2d_backprop_filter.cu", [reduce]).signature(reduce) == [0, 0, 8, 8]


@pytest.mark.parametrize("grid, block, shared, message", [
    ([1], (1,), 0, "grid must be a tuple"),
    ((1,), [32], 0, "block must be a tuple"),
    ((0,), (32,), 0, "grid"),
    ((1, 65536), (32,), 0, "grid"),
    ((2**31,), (32,), 0, "grid"),
    ((1,), (1025,), 0, "block"),
    ((1,), (32, 32, 2), 0, "more than 1024 threads"),
    ((1,), (1, 1, 65), 0, "block"),
    ((1,), (32,), 48 * 1024 + 1, "dynamic shared memory"),
    ((1.0,), (32,), 0, "grid"),
])
def test_launch_configurations_cupy_or_the_driver_refuse_are_refused(monkeypatch, grid, block, shared, message):
    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    a = cupy.zeros((4,), np.float32)
    launch = device.kernel(*DEPTHWISE)
    with pytest.raises(cuda_host.HostLaunchError, match=message):
        launch(grid, block, (a, a, a, *(np.int64(0),) * 15), shared_mem=shared)


@pytest.mark.parametrize("position, value, message", [
    (3, np.int32(0), "argument 3 is int32"),          # CuPy would pass 4 bytes to a long long
    (3, 0, "argument 3 is int"),                       # a Python int: width left to CuPy
    (3, np.float64(0), "argument 3 is float64"),
    (0, np.int32(0), "argument 0 is int32"),           # a pointer needs 64 bits
    (None, None, "17 arguments for 18 parameters"),
])
def test_arguments_must_match_the_kernels_parameter_widths(monkeypatch, position, value, message):
    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    a = cupy.zeros((4,), np.float32)
    args = [a, a, a, *(np.int64(0),) * 15]
    if position is None:
        args.pop()
    else:
        args[position] = value
    with pytest.raises(cuda_host.HostLaunchError, match=message):
        device.kernel(*DEPTHWISE)((1,), (1,), tuple(args))


def test_a_launcher_passing_int32_for_a_long_long_is_caught(monkeypatch):
    """Planted: the launchers' ``i64`` helper narrows to np.int32.  Before the stand-in checked
    widths, it widened every scalar to 64 bits and the call passed on the CPU, while on a GPU
    CuPy would have passed 4 bytes for each 8-byte parameter."""
    import gradops
    from gradops.backends.cuda import _runtime

    cuda_host.HostDevice().install(monkeypatch)
    import cupy

    monkeypatch.setattr(_runtime, "i64", lambda v: np.int32(v))
    dy = cupy.asarray(np.ones((1, 3, 3, 2), np.float32))
    w = cupy.asarray(np.ones((3, 2, 2, 1), np.float32))  # 3x2: the direct kernel, whose sizes are long long
    with pytest.raises(cuda_host.HostLaunchError, match="is int32; the parameter needs a NumPy integer scalar of 8"):
        gradops.depthwise_conv2d_native_backprop_input([1, 3, 3, 2], w, dy, [1, 1, 1, 1], "SAME", backend="cuda")


def test_a_launcher_passing_int64_for_an_int_is_caught(monkeypatch):
    """Planted: the ``i32`` helper the depthwise tiled kernel's launcher uses for its ``int``
    sizes widens to np.int64: CuPy would pass 8 bytes for each 4-byte parameter."""
    import gradops
    from gradops.backends.cuda import _runtime

    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    dy = cupy.asarray(np.ones((1, 3, 3, 2), np.float32))
    w = cupy.asarray(np.ones((3, 3, 2, 1), np.float32))
    gradops.depthwise_conv2d_native_backprop_input([1, 3, 3, 2], w, dy, [1, 1, 1, 1], "SAME", backend="cuda")
    assert "_tiled<" in device.launches[-1][0]
    monkeypatch.setattr(_runtime, "i32", lambda v: np.int64(v))
    with pytest.raises(cuda_host.HostLaunchError, match="is int64; the parameter needs a NumPy integer scalar of 4"):
        gradops.depthwise_conv2d_native_backprop_input([1, 3, 3, 2], w, dy, [1, 1, 1, 1], "SAME", backend="cuda")


def test_a_call_not_run_on_its_arrays_device_is_caught(monkeypatch):
    """Planted: the dispatcher forgets to make the arrays' device current (gradops._dispatch.run
    without ``with device``): the two-GPU test's launch check fails."""
    conv2d_module = importlib.import_module("gradops.conv2d")  # gradops.conv2d is also a function
    cuda_host.HostDevice().install(monkeypatch)
    import cupy

    rng = np.random.default_rng(4)
    x, dy = random_array(rng, (1, 5, 5, 2), np.float32), random_array(rng, (1, 5, 5, 3), np.float32)
    with cupy.cuda.Device(1):
        gx, gdy = cupy.asarray(x), cupy.asarray(dy)
    got = gradops.conv2d_backprop_filter(gx, [3, 3, 2, 3], gdy, [1, 1, 1, 1], "SAME")  # the real dispatcher
    assert got.device.id == 1
    monkeypatch.setattr(conv2d_module, "run", lambda fn, geometry, *arrays: fn(geometry, *arrays))
    with pytest.raises(AssertionError, match="launched on device 0 with an array of device 1"):
        gradops.conv2d_backprop_filter(gx, [3, 3, 2, 3], gdy, [1, 1, 1, 1], "SAME")


def test_a_launcher_that_skips_the_contiguous_copy_is_caught(monkeypatch):
    """Planted: a launcher hands a strided view to a kernel that assumes dense rows
    (``_runtime.contiguous`` made the identity): the public API's result is wrong."""
    from gradops.backends.cuda import _runtime

    cuda_host.HostDevice().install(monkeypatch)
    import cupy

    rng = np.random.default_rng(5)
    dy = random_array(rng, (1, 3, 3, 2), np.float64)
    wide = cupy.asarray(np.repeat(dy, 2, axis=3) * np.array([1.0, -7.0] * 2))  # dy in the even channels
    args = ([1, 6, 5, 2], wide[..., ::2], [0, 2, 4, 6], [0, 2, 3, 5], True)
    want = gradops.fractional_avg_pool_grad([1, 6, 5, 2], dy, *args[2:])
    np.testing.assert_array_equal(cupy.asnumpy(gradops.fractional_avg_pool_grad(*args)), want)
    monkeypatch.setattr(_runtime, "contiguous", lambda x: x)
    assert not np.array_equal(cupy.asnumpy(gradops.fractional_avg_pool_grad(*args)), want)


def test_launch_bounds_are_read_per_instantiation(kernels):
    tiled = "gradops::conv2d_backprop_filter_igemm<float, float, 0, false, false>"
    direct = "gradops::conv2d_backprop_filter_direct<double, double, 1>"
    host = cuda_host.HostKernels("conv2d_backprop_filter.cu", [tiled, direct])
    assert host.launch_bound(tiled) == 256  # igemm::Threads<float, SIMT>
    assert host.launch_bound(direct) == 128  # kFilterDirectThreads
    assert cuda_host.HostKernels(DEPTHWISE[0], [DEPTHWISE[1]]).launch_bound(DEPTHWISE[1]) == 1024  # none


def test_a_block_past_the_launch_bounds_is_refused(monkeypatch):
    """Planted: a launcher that launches a 256-thread-bounded tiled kernel with 512 threads (the
    driver refuses it with 'too many resources requested for launch')."""
    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    a = cupy.zeros((4,), np.float32)
    tiled = "gradops::conv2d_backprop_filter_igemm<float, float, 0, false, false>"
    launch = device.kernel("conv2d_backprop_filter.cu", tiled)
    args = (a, a, a, a, *(np.int64(1),) * 19, *(np.uint32(2**31), np.int32(31)) * 5)  # dims, splits, FastDivs by 1
    with pytest.raises(cuda_host.HostLaunchError, match="exceeds the kernel's __launch_bounds__ \\(256"):
        launch((1,), (512,), args)


# --------------------------------------------------------------------------- fast division
FAST_DIV_KERNEL = r"""
#include "igemm_tiles.cuh"
// out[i * count + j] = FastDiv(divisors[i]).div(numerators[i * count + j]), a thread per divisor.
__global__ void fast_div_check(const int* divisors, const int* numerators, int* out, long long n_divisors,
                               long long count) {
    GRADOPS_GRID_STRIDE_LOOP(i, n_divisors) {
        const gradops::FastDiv by(divisors[i]);
        for (long long j = 0; j < count; ++j) out[i * count + j] = by.div(numerators[i * count + j]);
    }
}
"""


def test_fast_division_is_exact(tmp_path):
    """igemm's FastDiv (magic multiplier from a double quotient, settled by exact products) gives
    floor(n / d) for every divisor up to 4096, powers of two and their neighbours, divisors above
    2^22 (where the double quotient alone can be two short) and random ones up to 2^31 - 1, on
    numerators at 0, around multiples of d and near 2^31.  A magic number one too small fails
    (planted: the settling products removed)."""
    rng = np.random.default_rng(5)
    limit = 2**31 - 1
    divisors = set(range(1, 4097))
    for k in range(1, 31):
        divisors |= {2**k - 1, 2**k, 2**k + 1}
    divisors |= set(int(v) for v in rng.integers(2**22, limit, 3000)) | {limit, limit - 1}
    divisors = np.array(sorted(d for d in divisors if 1 <= d <= limit), dtype=np.int32)
    count = 12
    numerators = np.empty((divisors.size, count), dtype=np.int64)
    for i, d in enumerate(divisors.astype(np.int64)):
        q = limit // d
        numerators[i] = [0, 1, d - 1, d, d + 1, q * d - 1, q * d, limit, limit - 1,
                         *rng.integers(0, limit, 3)]
    numerators = np.clip(numerators, 0, limit).astype(np.int32)
    want = numerators.astype(np.int64) // divisors.astype(np.int64)[:, None]

    def run(directory):
        (directory / "fast_div.cu").write_text(FAST_DIV_KERNEL)
        kernels = cuda_host.HostKernels("fast_div.cu", ["fast_div_check"], directory)
        out = np.full(numerators.shape, -1, dtype=np.int32)
        kernels.run("fast_div_check", [divisors, numerators, out], [divisors.size, count])
        return out

    good = tmp_path / "good"
    good.mkdir()
    cuda_host.planted_sources(good, "igemm_tiles.cuh")
    assert np.array_equal(run(good), want)

    bad = tmp_path / "bad"
    bad.mkdir()
    cuda_host.planted_sources(bad, "igemm_tiles.cuh", ("        if (mul * dd < power) ++mul;\n" * 2, ""))
    assert not np.array_equal(run(bad), want)


BYTE_PERM_KERNEL = r"""
#include "depthwise_tiles.cuh"
// out[i] = __byte_perm(x[i], y[i], s[i]); pairs[i] = the depthwise kernels' pair_word of chunks
// x[i], y[i] (their words i % 4 repeated) and element i % 8.
__global__ void byte_perm_check(const unsigned* x, const unsigned* y, const unsigned* s, unsigned* out,
                                unsigned* pairs, long long n) {
    GRADOPS_GRID_STRIDE_LOOP(i, n) {
        out[i] = __byte_perm(x[i], y[i], s[i]);
        const uint4 pair[2] = {make_uint4(x[i], x[i], x[i], x[i]), make_uint4(y[i], y[i], y[i], y[i])};
        pairs[i] = gradops::dwconv::pair_word(pair, static_cast<int>(i % 8));
    }
}
"""


def test_byte_perm_follows_cudas_definition(tmp_path):
    """The host model's __byte_perm: byte n of the result is byte s<4n+2:4n> of y:x (CUDA's integer
    intrinsics), on random words and selectors with each nibble's bit 3 clear (where PTX's prmt,
    which sign-replicates with it set, agrees); pair_word (the NHWC transposes' words) is element j
    of both positions' chunks, the first's in the low half."""
    rng = np.random.default_rng(9)
    n = 4096
    x, y = (rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    s = (rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint32) & np.uint32(0x7777))
    s[:4] = (0x5410, 0x7632, 0x3210, 0x0000)
    (tmp_path / "depthwise_tiles.cuh").write_text((cuda_host._build.source_dir() / "depthwise_tiles.cuh").read_text())
    kernels = cuda_host.HostKernels("byte_perm.cu", ["byte_perm_check"],
                                    source_folder(tmp_path, "byte_perm.cu", BYTE_PERM_KERNEL))
    out, pairs = np.zeros(n, np.uint32), np.zeros(n, np.uint32)
    kernels.run("byte_perm_check", [x, y, s, out, pairs], [n])
    eight = (y.astype(np.uint64) << np.uint64(32)) | x.astype(np.uint64)
    want = np.zeros(n, np.uint64)
    for byte in range(4):
        index = (s.astype(np.uint64) >> np.uint64(4 * byte)) & np.uint64(7)
        want |= ((eight >> (np.uint64(8) * index)) & np.uint64(0xff)) << np.uint64(8 * byte)
    assert np.array_equal(out, want.astype(np.uint32))
    assert out[0] == (x[0] & 0xffff) | (y[0] << 16) and out[1] == (x[1] >> 16) | (y[1] & 0xffff0000)
    half = np.arange(n) % 2  # element j of a chunk: half j % 2 of word j / 2
    first = np.where(half == 0, x & 0xffff, x >> 16)
    second = np.where(half == 0, y & 0xffff, y >> 16)
    assert np.array_equal(pairs, (first | (second << 16)).astype(np.uint32))


def source_folder(folder, filename: str, text: str):
    """``folder``, holding ``text`` as ``filename`` beside gradops_common.cuh: a small kernel
    source for a host build."""
    shutil.copy(cuda_host._build.source_dir() / "gradops_common.cuh", folder)
    (folder / filename).write_text(text)
    return folder


#: A template kernel whose ``__shared__`` word survives from one launch to the next (the host
#: model keeps ``__shared__`` variables as statics, and poisons them before each block unless
#: told not to); MARK is what this build leaves in it.
SHARED_MARK = r"""
#include "gradops_common.cuh"
namespace gradops {
template <int N>
__global__ void leave_mark(int* out) {
    __shared__ int mark;
    out[0] = mark;
    mark = MARK;
}
}  // namespace gradops
"""


@pytest.mark.parametrize("racecheck", [False, True])
def test_each_build_has_its_own_shared_variables(racecheck, tmp_path):
    """Two builds of one kernel loaded in one process (the real sources and a planted bug's)
    each have their own ``__shared__`` variables.  g++ emits a template's statics as
    STB_GNU_UNIQUE symbols, which the loader binds process-wide even under RTLD_LOCAL: without
    the kernel code's hidden visibility, the second build read the mark the first one left."""
    builds = []
    for mark in (1, 2):
        folder = tmp_path / f"mark{mark}"
        folder.mkdir()
        source_folder(folder, "mark.cu", SHARED_MARK.replace("MARK;", f"{mark};"))
        builds.append(cuda_host.HostKernels("mark.cu", ["gradops::leave_mark<0>"], folder, racecheck=racecheck))
        builds[-1].poison_shared = False
    out = np.full(1, -1, np.int32)
    seen = []
    for build in builds + builds:
        build.launch("gradops::leave_mark<0>", (1,), (1,), [out], [])
        seen.append(int(out[0]))
    assert seen == [0, 0, 1, 2]


#: A kernel that reads a ``__shared__`` word and a float before writing them, then writes both.
SHARED_UNWRITTEN = r"""
#include "gradops_common.cuh"
namespace gradops {
template <int N>
__global__ void read_unwritten(unsigned* word_out, float* float_out) {
    __shared__ unsigned word;
    __shared__ float value[2];
    word_out[blockIdx.x] = word;
    float_out[blockIdx.x] = value[1];
    word = 0;
    value[1] = 0.0f;
}
}  // namespace gradops
"""


@pytest.mark.parametrize("racecheck", [False, True])
def test_shared_memory_is_poisoned_before_each_block(racecheck, tmp_path):
    """A GPU leaves shared memory undefined when a block starts; the host model fills it with
    0xff (NaN in every float type) or 0x5a (finite in every type) bytes, alternating by block and
    swapped between orders, so that a kernel which reads shared memory it has not written in
    the same block sees values that change with the block and the order (not the zeros of a
    fresh static, nor what the previous block left)."""
    source_folder(tmp_path, "unwritten.cu", SHARED_UNWRITTEN)
    build = cuda_host.HostKernels("unwritten.cu", ["gradops::read_unwritten<0>"], tmp_path, racecheck=racecheck)
    assert build.poison_shared
    words, floats = np.zeros(4, np.uint32), np.zeros(4, np.float32)
    finite = np.array([0x5A5A5A5A], np.uint32).view(np.float32)[0]
    for order, first in (("forward", 0xFFFFFFFF), ("reverse", 0x5A5A5A5A), ("shuffled", 0x5A5A5A5A)):
        build.launch("gradops::read_unwritten<0>", (4,), (1,), [words, floats], [], order=order)
        second = first ^ 0xFFFFFFFF ^ 0x5A5A5A5A
        assert words.tolist() == [first, second, first, second], order
        nan_blocks, finite_blocks = (floats[0::2], floats[1::2]) if first == 0xFFFFFFFF else (floats[1::2], floats[0::2])
        assert np.isnan(nan_blocks).all() and (finite_blocks == finite).all(), order
    build.poison_shared = False
    build.launch("gradops::read_unwritten<0>", (2,), (1,), [words, floats], [])
    assert words[:2].tolist() == [0, 0]  # what the last block left


#: A kernel that stores a local it never wrote (in C++ an indeterminate value; on a GPU, whatever
#: the register held).
UNINITIALIZED_LOCAL = r"""
#include "gradops_common.cuh"
namespace gradops {
template <int N>
__global__ void store_uninitialized(unsigned* out, float* value) {
    unsigned word[N];
    float sum;
    out[threadIdx.x] = word[threadIdx.x % N];
    value[threadIdx.x] = sum;
}
}  // namespace gradops
"""


def test_racecheck_builds_start_locals_as_a_pattern(tmp_path):
    """Racecheck builds start every automatic variable of kernel code as 0xfe bytes
    (-ftrivial-auto-var-init=pattern): kernel code that reads a local before writing it gets
    -1.7e38 in a float and 0xfefefefe in a word, not the zeros or stale values a CPU stack may
    hold, as a GPU register would give it garbage.  (Plain builds keep the stack's leftovers:
    see RACECHECK_CXX_FLAGS.)"""
    source_folder(tmp_path, "uninitialized.cu", UNINITIALIZED_LOCAL)
    build = cuda_host.HostKernels("uninitialized.cu", ["gradops::store_uninitialized<4>"], tmp_path, racecheck=True)
    words, values = np.zeros(8, np.uint32), np.zeros(8, np.float32)
    build.launch("gradops::store_uninitialized<4>", (1,), (8,), [words, values], [])
    assert (words == 0xFEFEFEFE).all()
    assert (values.view(np.uint32) == 0xFEFEFEFE).all()


#: One element read at ``index`` and written at ``index + shift``.
READ_AT = r"""
#include "gradops_common.cuh"
namespace gradops {
template <int N>
__global__ void read_at(const float* in, float* out, long long index, long long shift) {
    out[index + shift] = in[index];
}
}  // namespace gradops
"""


SET_ALLOCATIONS_CHILD = r"""
import ctypes, sys
library = ctypes.CDLL(sys.argv[1])
low, high = 1, 2**62  # two arrays' bounds, far below and far above the library's own data
bounds = (ctypes.c_ulonglong * 8)(low, low, low + 1, low + 1, high, high, high + 1, high + 1)
library.gradops_set_allocations(bounds, ctypes.c_longlong(2))
print("returned")
"""


def test_racecheck_library_takes_arrays_around_its_own_data(tmp_path):
    """A racecheck build checks an access against the arrays' guard bytes when it lies between
    the lowest and highest array, asking the scheduler whether a kernel runs: arrays mapped
    below and above the library (mmap places large ones beside it) make its own data such an
    access.  The scheduler is built when the library loads; built at the first such check, in
    the first launch's gradops_set_allocations, its instrumented constructor came back to that
    check and waited forever on its own initialisation guard (a full run of the suite hung in a
    planted barrier test of the depthwise filter gradient, 2026-12-04); this child, with one
    thread, gets libstdc++'s recursive_init_error instead.  The call runs in a child process,
    so a hang fails this test instead of stalling the run."""
    import subprocess
    import sys

    source_folder(tmp_path, "read_at.cu", READ_AT)
    build = cuda_host.HostKernels("read_at.cu", ["gradops::read_at<1>"], tmp_path, racecheck=True)
    try:
        child = subprocess.run([sys.executable, "-c", SET_ALLOCATIONS_CHILD, build._lib._name],
                               capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("gradops_set_allocations hung with arrays on both sides of the library's data")
    assert child.returncode == 0 and child.stdout.strip() == "returned", child.stderr


def test_racecheck_builds_refuse_accesses_to_guard_bytes(tmp_path, monkeypatch):
    """memcheck: racecheck builds fail a launch at any access of kernel code to the guard bytes
    around a HostDevice array (past its end or before its start), read or write, naming the
    access and the array; in-bounds accesses run.  Plain builds catch the writes only after the
    launch (the guards' bytes change) and never the reads."""
    source_folder(tmp_path, "read_at.cu", READ_AT)
    monkeypatch.setattr(cuda_host._build, "all_instantiations",
                        lambda arch=None: {"read_at.cu": ["gradops::read_at<0>"]})
    for racecheck in (False, True):
        device = cuda_host.HostDevice(racecheck=racecheck, source_dir=tmp_path)
        source, target = device.ones((8,), np.float32), device.zeros((8,), np.float32)
        launch = device.kernel("read_at.cu", "gradops::read_at<0>")
        launch((1,), (1,), (source, target, np.int64(7), np.int64(0)))
        assert float(target[7]) == 1.0
        if racecheck:
            with pytest.raises(cuda_host.HostLaunchError, match="memcheck: a 4-byte read 4 bytes past the end of an "
                                                                 "array of 32 bytes"):
                launch((1,), (1,), (source, target, np.int64(8), np.int64(-1)))
            with pytest.raises(cuda_host.HostLaunchError, match="memcheck: a 4-byte read 4 bytes before the start "
                                                                 "of an array of 32 bytes"):
                launch((1,), (1,), (source, target, np.int64(-1), np.int64(1)))
            with pytest.raises(cuda_host.HostLaunchError, match="memcheck: a 4-byte write 8 bytes past the end"):
                launch((1,), (1,), (source, target, np.int64(7), np.int64(2)))
        else:
            launch((1,), (1,), (source, target, np.int64(8), np.int64(-1)))  # an unseen read (guard NaN)
            assert np.isnan(float(target[7]))
            with pytest.raises(AssertionError, match="a kernel wrote outside an array of 32 bytes"):
                launch((1,), (1,), (source, target, np.int64(7), np.int64(2)))


#: Typed accesses at an element offset: aligned to their size when OFFSET is a multiple of it.
TYPED_ACCESS = r"""
#include "gradops_common.cuh"
namespace gradops {
template <typename W, int OFFSET>
__global__ void typed_access(const unsigned char* source, unsigned char* target) {
    __shared__ __align__(16) unsigned char stage[64];
    const W value = *reinterpret_cast<const W*>(source + OFFSET);      // a global load
    *reinterpret_cast<W*>(stage + OFFSET) = value;                     // a shared store
    *reinterpret_cast<W*>(target + OFFSET) = *reinterpret_cast<const W*>(stage + OFFSET);
}
}  // namespace gradops
"""


@pytest.mark.parametrize("width,size,scalar", [("unsigned short", 2, True), ("unsigned", 4, True), ("double", 8, True),
                                               ("uint2", 8, False), ("uint4", 16, False), ("__half2", 4, False)])
def test_racecheck_builds_refuse_misaligned_typed_accesses(width, size, scalar, tmp_path):
    """A GPU faults on an N-byte load or store whose address is not a multiple of N; a CPU does
    not.  Racecheck builds check every access of kernel code, global and shared, that g++
    emits with the alignment of its type (the hooks of -fsanitize=thread), so a misaligned
    offset fails the launch and aligned ones run.  The check sees the accesses g++ emits: a
    scalar's is its own width, but g++ may copy a vector struct (uint2, uint4, __half2) member
    by member, so an offset that is a multiple of the member but not of the struct is not
    caught there (global vector loads check themselves: load_vector)."""
    source_folder(tmp_path, "typed.cu", TYPED_ACCESS)
    offsets = {0: True, size: True, 1: False, **({size // 2: False} if scalar else {})}
    expressions = {offset: f"gradops::typed_access<{width}, {offset}>" for offset in offsets}
    build = cuda_host.HostKernels("typed.cu", list(expressions.values()), tmp_path, racecheck=True)
    source = np.arange(64, dtype=np.uint8)
    for offset, aligned in offsets.items():
        target = np.zeros(64, np.uint8)
        if aligned:
            build.launch(expressions[offset], (1,), (1,), [source, target], [])
            assert target[offset:offset + size].tolist() == source[offset:offset + size].tolist()
        else:
            with pytest.raises(cuda_host.HostLaunchError,
                               match=f"a {size if scalar else '[0-9]+'}-byte access to an address that is not "
                                     "aligned to its size"):
                build.launch(expressions[offset], (1,), (1,), [source, target], [])


#: The CuPy names gradops uses (gradops.backends.cuda._runtime.CUPY_NAMES) that the HostDevice
#: stand-in does not offer, and why none of its tests needs them.
NOT_ON_THE_STAND_IN = {
    # Compiling and loading: the stand-in replaces _runtime.kernel with g++ builds of the same
    # sources (the compile step is tests/test_cuda_runtime.py's, against a recording CuPy, and
    # the install check's, against the real one).
    **dict.fromkeys(("cupy.__version__", "cupy._core.core.assemble_cupy_compiler_options", "cupy.cuda.Module",
                     "cupy.cuda.compiler._get_arch_for_options_for_nvrtc",
                     "cupy.cuda.compiler._get_max_compute_capability", "cupy.cuda.compiler._use_ptx",
                     "cupy.cuda.compiler.compile_using_nvrtc", "cupy.cuda.driver.CUDADriverError",
                     "cupy.cuda.nvrtc.getSupportedArchs", "cupy.cuda.nvrtc.getVersion"), "compile and load"),
    # The cuDNN path's workspace and index arrays: cuDNN is refused on the stand-in.
    "cupy.arange": "cuDNN path", "cupy.uint8": "cuDNN path",
    # No streams: each launch completes before the call returns (_runtime._current_stream's
    # getattr default), so stream order is a GPU-only property.
    "cupy.cuda.get_current_stream": "no streams", "cupy.cuda.Stream": "no streams (GPU benchmark)",
    # Versions and device properties for `info` and the GPU benchmark's report.
    "cupy.cuda.runtime.driverGetVersion": "info / GPU benchmark",
    "cupy.cuda.runtime.getDeviceProperties": "info / GPU benchmark",
}


def test_the_stand_in_offers_every_cupy_name_but_those_listed_with_a_reason(monkeypatch):
    """Where the CPU stand-in cannot behave like CuPy, this test says so: every CuPy name
    gradops uses is offered by the installed stand-in except the ones above."""
    from gradops.backends.cuda import _runtime

    cuda_host.HostDevice().install(monkeypatch)
    missing = set()
    for name in _runtime.CUPY_NAMES:
        try:
            _runtime.resolve_cupy_name(name)
        except (AttributeError, ImportError):
            missing.add(name)
    assert missing == set(NOT_ON_THE_STAND_IN)
