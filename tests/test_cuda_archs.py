"""GPU generations: what each compute capability compiles and runs, and that the fallbacks
(half types and TF32 on CUDA cores where a GPU has no tensor cores for them) compute the right
thing.  Runs on the host execution model with the stand-in reporting an older architecture;
the stand-in also refuses any launch of an instantiation the emulated arch does not have."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import cuda_host
import gradops
import reference
from conftest import assert_close, random_array, to_host
from gradops._dtypes import bfloat16
from gradops.backends.cuda import _build
from gradops.backends.cuda import _conv_igemm as ig
from gradops.backends.cuda import _install_check

# The package binds each op's function over its launcher module's name: import the modules.
CONV_LAUNCHERS = tuple(importlib.import_module(f"gradops.backends.cuda.{name}")
                       for name in ("conv2d", "conv2d_backprop_filter", "conv2d_backprop_input"))
ARCHS = _install_check.ARCHS  # every arch the install check compiles for
FLOAT_DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32), np.dtype(np.float64))


def tiled_kinds(expressions, element: str) -> set[int]:
    """Math kinds of the tiled instantiations of one element type in a list of expressions."""
    kinds = set()
    for e in expressions:
        if "_igemm<" in e and e.split("<", 1)[1].startswith(element + ","):
            kinds.add(int(e.split(",")[2]))
    return kinds


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_core_instantiations_only_where_the_arch_has_them(arch):
    for source in ("conv2d.cu", "conv2d_backprop_filter.cu", "conv2d_backprop_input.cu"):
        names = _build.all_instantiations(arch)[source]
        assert tiled_kinds(names, "__half") == ({ig.SIMT, ig.WMMA_HALF} if arch >= 70 else {ig.SIMT})
        assert tiled_kinds(names, "__nv_bfloat16") == ({ig.SIMT, ig.WMMA_HALF} if arch >= 80 else {ig.SIMT})
        assert tiled_kinds(names, "float") == ({ig.SIMT, ig.WMMA_TF32} if arch >= 80 else {ig.SIMT})
        assert tiled_kinds(names, "double") == {ig.SIMT}
        assert set(names) <= set(_build.all_instantiations()[source])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("allow_tf32", [False, True])
def test_every_kernel_a_launch_can_ask_for_is_instantiated_for_its_arch(arch, allow_tf32):
    with gradops.options(allow_tf32=allow_tf32):
        for launcher in CONV_LAUNCHERS:
            names = launcher.instantiations(arch)[launcher.SOURCE]
            for dtype in FLOAT_DTYPES:
                kind = ig.math_kind(dtype, arch)
                for vector in (False, True):
                    assert launcher._tiled_name(dtype, kind, vector) in names
                for layout in ig.LAYOUT:
                    assert launcher._direct_name(dtype, layout) in names
                if hasattr(launcher, "_pointwise_name"):  # the gradients' 1x1 kernels
                    assert launcher._pointwise_name(dtype, kind) in names
                if hasattr(launcher, "few_channels_kernel"):  # the filter gradient's: half types, sm_80+
                    few = launcher.few_channels_kernel(dtype, arch)
                    assert few == (dtype in launcher.FEW_DTYPES and arch >= 80)
                    assert all((launcher._few_channels_name(dtype, c) in names) == few for c in launcher.FEW_CHANNELS)
                elif hasattr(launcher, "_few_channels_name"):  # the input gradient's stem kernel
                    assert all(launcher._few_channels_name(dtype, c) in names for c in launcher.FEW_CHANNELS)


@pytest.mark.parametrize("arch, dtype, allow_tf32, kind, note", [
    (90, np.float16, False, ig.WMMA_HALF, None),
    (90, bfloat16, False, ig.WMMA_HALF, None),
    (90, np.float32, True, ig.WMMA_TF32, None),
    (90, np.float32, False, ig.SIMT, None),
    (75, np.float16, False, ig.WMMA_HALF, None),
    (75, bfloat16, False, ig.SIMT, "bfloat16 tensor cores need sm_80 or newer (this GPU is sm_75)"),
    (75, np.float32, True, ig.SIMT, "TF32 need sm_80 or newer (this GPU is sm_75)"),
    (75, np.float32, False, ig.SIMT, None),  # exact float32 was asked for: nothing falls back
    (60, np.float16, False, ig.SIMT, "float16 tensor cores need sm_70 or newer (this GPU is sm_60)"),
    (60, np.float64, False, ig.SIMT, None),
])
def test_math_kind_and_the_reason_given_per_arch(arch, dtype, allow_tf32, kind, note):
    with gradops.options(allow_tf32=allow_tf32):
        assert ig.math_kind(dtype, arch) == kind
        got = ig.math_note(dtype, arch)
        assert (got is None) if note is None else got.startswith(note)


def test_capability_summary_names_what_runs_where():
    assert ig.capability_summary(90) == "tensor cores for float16, bfloat16, TF32"
    assert ig.capability_summary(75) == ("tensor cores for float16; CUDA cores for bfloat16 (tensor cores "
                                         "from sm_80), TF32 (tensor cores from sm_80)")


def _conv_problem(rng, dtype):
    """Channel counts that take the tiled path with 16-byte loads, several tiles along M."""
    x = random_array(rng, (2, 9, 9, 16), dtype)
    w = random_array(rng, (3, 3, 16, 24), dtype)
    dy = random_array(rng, (2, 9, 9, 24), dtype)
    return x, w, dy


@pytest.mark.parametrize("arch, dtype, allow_tf32, kind", [
    (75, bfloat16, False, ig.SIMT),
    (75, np.float32, True, ig.SIMT),
    (75, np.float16, False, ig.WMMA_HALF),
    (60, np.float16, False, ig.SIMT),
])
@pytest.mark.parametrize("op", ["conv2d_backprop_input", "conv2d_backprop_filter"])
def test_older_gpus_run_the_tiled_kernels_they_have(monkeypatch, rng, arch, dtype, allow_tf32, kind, op):
    """On a GPU without tensor cores for the type, the tiled kernels run on CUDA cores (the
    SIMT instantiation for half types is new) and agree with the float64 NumPy reference."""
    device = cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    import cupy

    x, w, dy = _conv_problem(rng, dtype)
    strides, padding = [1, 1, 1, 1], "SAME"
    with gradops.options(allow_tf32=allow_tf32):
        if op == "conv2d_backprop_input":
            got = gradops.conv2d_backprop_input(list(x.shape), cupy.asarray(w), cupy.asarray(dy), strides, padding,
                                                backend="cuda")
            want = reference.conv2d_backprop_input(x.shape, w.astype(np.float64), dy.astype(np.float64),
                                                   (1, 1), "SAME")
        else:
            got = gradops.conv2d_backprop_filter(cupy.asarray(x), list(w.shape), cupy.asarray(dy), strides, padding,
                                                 backend="cuda")
            want = reference.conv2d_backprop_filter(x.astype(np.float64), w.shape, dy.astype(np.float64),
                                                    (1, 1), "SAME")
    tiled = [e for e, _, _ in device.launches if "_igemm<" in e]
    assert tiled and all(int(e.split(",")[2]) == kind for e in tiled), device.launches
    assert_close(to_host(got), want, dtype)


@pytest.mark.parametrize("arch, dtype, allow_tf32, kind", [
    (75, bfloat16, False, ig.SIMT),
    (75, np.float32, True, ig.SIMT),
    (75, np.float16, False, ig.WMMA_HALF),
    (60, np.float16, False, ig.SIMT),
])
@pytest.mark.parametrize("op", ["conv2d_backprop_input", "conv2d_backprop_filter"])
def test_older_gpus_run_the_1x1_kernels(monkeypatch, rng, arch, dtype, allow_tf32, kind, op):
    """A 1x1 stride-1 convolution runs the _1x1_igemm kernel of the arch's math kind (the
    register-staged loader below sm_80) and agrees with the float64 NumPy reference."""
    device = cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    import cupy

    x = random_array(rng, (2, 9, 9, 16), dtype)
    w = random_array(rng, (1, 1, 16, 40), dtype)
    dy = random_array(rng, (2, 9, 9, 40), dtype)
    with gradops.options(allow_tf32=allow_tf32):
        if op == "conv2d_backprop_input":
            got = gradops.conv2d_backprop_input(list(x.shape), cupy.asarray(w), cupy.asarray(dy), [1, 1, 1, 1],
                                                "VALID", backend="cuda")
            want = reference.conv2d_backprop_input(x.shape, w.astype(np.float64), dy.astype(np.float64),
                                                   (1, 1), "VALID")
        else:
            got = gradops.conv2d_backprop_filter(cupy.asarray(x), list(w.shape), cupy.asarray(dy), [1, 1, 1, 1],
                                                 "VALID", backend="cuda")
            want = reference.conv2d_backprop_filter(x.astype(np.float64), w.shape, dy.astype(np.float64),
                                                    (1, 1), "VALID")
    tiled = [e for e, _, _ in device.launches if "_igemm<" in e]
    assert tiled and all("_1x1_igemm<" in e and int(e.split(",")[2]) == kind for e in tiled), device.launches
    assert_close(to_host(got), want, dtype)


@pytest.mark.parametrize("arch", [60, 75])
def test_older_gpus_run_the_few_channel_kernel(monkeypatch, rng, arch):
    """The stem's input gradient (3 input channels) takes the few-channel kernel on any arch."""
    device = cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    import cupy

    w = random_array(rng, (7, 7, 3, 16), np.float16)
    dy = random_array(rng, (2, 6, 6, 16), np.float16)
    got = gradops.conv2d_backprop_input([2, 12, 12, 3], cupy.asarray(w), cupy.asarray(dy), [1, 2, 2, 1], "SAME",
                                        backend="cuda")
    want = reference.conv2d_backprop_input((2, 12, 12, 3), w.astype(np.float64), dy.astype(np.float64), (2, 2),
                                           "SAME")
    assert any("_few_channels<" in e for e, _, _ in device.launches), device.launches
    assert_close(to_host(got), want, np.float16)


def test_the_decision_says_why_an_older_gpu_runs_on_cuda_cores(monkeypatch, rng):
    cuda_host.HostDevice(compute_capability=75).install(monkeypatch)
    import cupy

    x, w, dy = _conv_problem(rng, bfloat16)
    gradops.conv2d_backprop_input(list(x.shape), cupy.asarray(w), cupy.asarray(dy), [1, 1, 1, 1], "SAME")
    decision = gradops.last_backend_decision()
    assert decision.backend == "cuda"
    assert "bfloat16 tensor cores need sm_80 or newer (this GPU is sm_75)" in decision.reason, decision.reason


@pytest.mark.parametrize("pads", [(2**31 - 8, 0), (0, 2**31 - 8)], ids=["top", "bottom"])
def test_tiled_kernels_need_32_bit_cursors(monkeypatch, pads):
    """Padding that pushes padded coordinates past 32 bits sends every convolution to its direct
    kernel: the tiled kernels' row cursors are 32-bit (igemm_tiles.cuh, "Row cursors")."""
    from gradops._geometry import conv2d_geometry

    cuda_host.HostDevice(compute_capability=90).install(monkeypatch)

    # A row stride of 2**28 keeps out_backprop's rows (and every GEMM size) small.
    explicit, stride = [0, 0, *pads, 0, 0, 0, 0], 2**28
    out_rows = (64 + sum(pads) - 3) // stride + 1
    g = conv2d_geometry("Conv2DBackpropInput", (1, 64, 64, 64), (3, 3, 64, 64), (1, out_rows, 62, 64),
                        [1, stride, 1, 1], "EXPLICIT", explicit, "NHWC", [1, 1, 1, 1])
    assert out_rows < 16
    small = conv2d_geometry("Conv2DBackpropInput", (1, 64, 64, 64), (3, 3, 64, 64), (1, 62, 62, 64), [1, 1, 1, 1],
                            "VALID", [], "NHWC", [1, 1, 1, 1])
    for launcher in CONV_LAUNCHERS:
        assert launcher.tiled_eligible(small, np.dtype(np.float16))
        assert not launcher.tiled_eligible(g, np.dtype(np.float16))


# Older GPUs, the memory-bound ops: the launchers pick only kernels the arch was compiled with
# (the stand-in refuses others), the tensor-core depthwise filter gradient (mma.sync) only from
# sm_80, and every kernel computes what the NumPy backend does.  One arch of each class the
# kernels' own arch tests tell apart on the host model: no tensor cores (Maxwell and Pascal),
# WMMA only (Volta and Turing; sm_70 differs from sm_75 in launch bounds alone), mma.sync.
OLDER_ARCHS = (60, 75, 80)
ROWS_SEQUENCE, COLS_SEQUENCE = [0, 2, 3, 5, 6, 8, 9], [0, 1, 3, 4, 6, 7, 9]


@pytest.mark.parametrize("arch", OLDER_ARCHS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_older_gpus_run_the_depthwise_gradients(monkeypatch, rng, arch, dtype, data_format):
    device = cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    import cupy

    nhwc_input, multiplier = (2, 14, 14, 4), 2
    x = random_array(rng, nhwc_input, dtype)
    w = random_array(rng, (3, 3, 4, multiplier), dtype)
    dy = random_array(rng, (2, 14, 14, 4 * multiplier), dtype)
    if data_format == "NCHW":
        x, dy = np.ascontiguousarray(x.transpose(0, 3, 1, 2)), np.ascontiguousarray(dy.transpose(0, 3, 1, 2))
    args = ([1, 1, 1, 1], "SAME", (), data_format)
    got_input = gradops.depthwise_conv2d_native_backprop_input(list(x.shape), cupy.asarray(w), cupy.asarray(dy),
                                                               *args, backend="cuda")
    got_filter = gradops.depthwise_conv2d_native_backprop_filter(cupy.asarray(x), list(w.shape), cupy.asarray(dy),
                                                                 *args, backend="cuda")
    want_input = gradops.depthwise_conv2d_native_backprop_input(list(x.shape), w, dy, *args, backend="numpy")
    want_filter = gradops.depthwise_conv2d_native_backprop_filter(x, list(w.shape), dy, *args, backend="numpy")
    assert_close(to_host(got_input), want_input, dtype)
    assert_close(to_host(got_filter), want_filter, dtype, scale=float(np.abs(want_filter).max()))
    mma = [e for e, _, _ in device.launches if "_mma<" in e]
    # Where it can run, the launcher's own choice takes the tensor-core filter gradient on this
    # NCHW float16 3x3 problem (a 14 x 14 plane): the test so sees both sides of the arch test.
    assert bool(mma) == (arch >= 80 and data_format == "NCHW" and dtype == np.float16), device.launches


@pytest.mark.parametrize("arch", OLDER_ARCHS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("overlapping", [False, True])
def test_older_gpus_run_the_fractional_pooling_gradients(monkeypatch, rng, arch, dtype, overlapping):
    cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    import cupy

    x = random_array(rng, (2, 9, 9, 8), dtype)
    sequences = (ROWS_SEQUENCE, COLS_SEQUENCE, overlapping)
    y = gradops.fractional_max_pool(x, *sequences, backend="numpy")
    dy = random_array(rng, y.shape, dtype)
    got_max = gradops.fractional_max_pool_grad(cupy.asarray(x), cupy.asarray(y), cupy.asarray(dy), *sequences,
                                               backend="cuda")
    got_avg = gradops.fractional_avg_pool_grad(list(x.shape), cupy.asarray(dy), *sequences, backend="cuda")
    want_max = gradops.fractional_max_pool_grad(x, y, dy, *sequences, backend="numpy")
    want_avg = gradops.fractional_avg_pool_grad(list(x.shape), dy, *sequences, backend="numpy")
    assert_close(to_host(got_max), want_max, dtype)
    assert_close(to_host(got_avg), want_avg, dtype)
