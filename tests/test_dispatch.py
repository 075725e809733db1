"""Backend selection by array location, use_cudnn_on_gpu and backend=, without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

import gradops
from gradops import _arrays, _dispatch
from gradops._errors import BackendUnavailableError, InvalidArgumentError


class FakeDlpackGpuTensor:
    """Reports a CUDA DLPack device (type 2) the way torch/JAX GPU tensors do."""

    shape = (1, 2, 2, 1)

    def __dlpack_device__(self):
        return (2, 0)


class FakeDlpackCpuTensor:
    def __dlpack_device__(self):
        return (1, 0)


def test_location_of_numpy_lists_and_foreign_tensors():
    assert _arrays.location(np.zeros(3)) == _arrays.HOST
    assert _arrays.location([1.0, 2.0]) == _arrays.HOST
    assert _arrays.location(FakeDlpackGpuTensor()) == _arrays.GPU
    assert _arrays.location(FakeDlpackCpuTensor()) == _arrays.HOST


def test_host_arrays_select_numpy_by_default():
    module = _dispatch.select_backend("conv2d_backprop_input", _arrays.HOST, None, None, np.dtype(np.float32))
    assert module.NAME == "numpy"
    module = _dispatch.select_backend("conv2d_backprop_input", _arrays.HOST, None, None, np.dtype(np.float32),
                                      use_cudnn_on_gpu=False)
    assert module.NAME == "numpy"


def test_gpu_arrays_prefer_cudnn_then_cuda(monkeypatch):
    """With both GPU backends 'available', use_cudnn_on_gpu decides; fractional pooling has no cuDNN route."""
    import types

    fake = {name: types.SimpleNamespace(NAME=name, available=lambda: (True, "ok"), supports=lambda *a: (True, "ok"))
            for name in ("cuda", "cudnn")}
    monkeypatch.setattr(_dispatch, "backend_module",
                        lambda name: fake.get(name) or __import__("gradops.backends.numpy_backend",
                                                                  fromlist=["x"]))
    f32 = np.dtype(np.float32)
    assert _dispatch.select_backend("conv2d_backprop_filter", _arrays.GPU, None, None, f32).NAME == "cudnn"
    assert _dispatch.select_backend("conv2d_backprop_filter", _arrays.GPU, None, None, f32,
                                    use_cudnn_on_gpu=False).NAME == "cuda"
    assert _dispatch.select_backend("fractional_avg_pool_grad", _arrays.GPU, None, None, f32).NAME == "cuda"
    assert _dispatch.select_backend("conv2d_backprop_input", _arrays.GPU, "cuda", None, f32).NAME == "cuda"
    fake["cudnn"].supports = lambda *a: (False, "float64 is not supported by cuDNN graphs")
    assert _dispatch.select_backend("conv2d_backprop_input", _arrays.GPU, None, None, f32).NAME == "cuda"
    with pytest.raises(BackendUnavailableError, match="float64 is not supported"):
        _dispatch.select_backend("conv2d_backprop_input", _arrays.GPU, "cudnn", None, f32)


def test_backend_cudnn_contradicting_use_cudnn_on_gpu_is_an_error():
    with pytest.raises(InvalidArgumentError, match="contradicts"):
        _dispatch.select_backend("conv2d_backprop_input", _arrays.GPU, "cudnn", None, np.dtype(np.float32),
                                 use_cudnn_on_gpu=False)


def test_numpy_backend_refuses_gpu_arrays():
    with pytest.raises(InvalidArgumentError, match="host"):
        _dispatch.select_backend("conv2d_backprop_input", _arrays.GPU, "numpy", None, np.dtype(np.float32))


def test_unavailable_gpu_backends_say_why():
    status = gradops.backend_status()
    assert status["numpy"][0] is True
    for name in ("cuda", "cudnn"):
        ok, reason = status[name]
        if not ok:
            assert reason  # e.g. 'CuPy is not installed', 'no CUDA device found'


def test_explicit_numpy_backend_matches_default():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, 5, 2)).astype(np.float32)
    dy = rng.standard_normal((1, 5, 5, 3)).astype(np.float32)
    a = gradops.conv2d_backprop_filter(x, [3, 3, 2, 3], dy, [1, 1, 1, 1], "SAME")
    b = gradops.conv2d_backprop_filter(x, [3, 3, 2, 3], dy, [1, 1, 1, 1], "SAME", backend="numpy")
    np.testing.assert_array_equal(a, b)


def test_use_cudnn_on_gpu_false_still_computes_on_host():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 3, 2, 3)).astype(np.float64)
    dy = rng.standard_normal((1, 5, 5, 3))
    a = gradops.conv2d_backprop_input([1, 5, 5, 2], w, dy, [1, 1, 1, 1], "SAME", use_cudnn_on_gpu=False)
    b = gradops.conv2d_backprop_input([1, 5, 5, 2], w, dy, [1, 1, 1, 1], "SAME", use_cudnn_on_gpu=True)
    np.testing.assert_array_equal(a, b)


def test_cupy_arrays_reach_a_gpu_backend_or_say_why(cuda_device):
    """On a GPU machine: CuPy in -> CuPy out from the CUDA backend, or a clear BackendUnavailableError."""
    import cupy

    x = cupy.ones((1, 5, 5, 2), cupy.float32)
    dy = cupy.ones((1, 5, 5, 3), cupy.float32)
    try:
        out = gradops.conv2d_backprop_filter(x, [3, 3, 2, 3], dy, [1, 1, 1, 1], "SAME")
    except BackendUnavailableError as exc:
        assert "not implemented" in str(exc) or "cannot run" in str(exc)
    else:
        assert isinstance(out, cupy.ndarray)


def test_conv_kernel_path_choice():
    from gradops.backends.cuda import _conv_igemm as ig

    small, big = ig.TILED_MIN_DIM - 1, ig.TILED_MIN_DIM
    assert ig.pick_path(None, True, big, big) == "tiled"
    assert ig.pick_path(None, True, small, big) == "direct"   # too little work for a tile
    assert ig.pick_path(None, False, big, big) == "direct"    # the tiled kernel cannot run it
    assert ig.pick_path("direct", True, big, big) == "direct"
    with pytest.raises(ValueError, match="tiled kernel cannot run"):
        ig.pick_path("tiled", False, big, big)
    with pytest.raises(ValueError, match="path must be one of"):
        ig.pick_path("fast", True, big, big)


# --------------------------------------------------------------------------- backends asked on the arrays' device


def _spy_backends(monkeypatch, cuda_reason="supported", cudnn_supports=(False, "spy: not this call")):
    """cuda and cudnn backends that record the current device whenever dispatch asks them
    anything; cuda computes with gradops' real CUDA launchers."""
    import types

    import cupy

    from gradops.backends import cuda as real_cuda

    seen = []

    def spy(name, what, answer):
        def ask(*args):
            seen.append((name, what, cupy.cuda.Device().id))
            return answer
        return ask

    fakes = {
        "cuda": types.SimpleNamespace(NAME="cuda", available=spy("cuda", "available", (True, "ok")),
                                      supports=spy("cuda", "supports", (True, cuda_reason)),
                                      conv2d_backprop_filter=real_cuda.conv2d_backprop_filter),
        "cudnn": types.SimpleNamespace(NAME="cudnn", available=spy("cudnn", "available", (True, "ok")),
                                       supports=spy("cudnn", "supports", cudnn_supports)),
    }
    real = _dispatch.backend_module
    monkeypatch.setattr(_dispatch, "backend_module", lambda name: fakes.get(name) or real(name))
    return seen


@pytest.fixture
def host_device(request, monkeypatch):
    """The host stand-in for CuPy and two GPUs (tests/cuda_host.py), or skip."""
    from conftest import _install_host_device

    return _install_host_device(request, monkeypatch)


@pytest.mark.parametrize("backend", [None, "cuda"])
def test_backends_are_asked_on_the_arrays_device(host_device, monkeypatch, backend):
    """Arrays on device 1 while device 0 is current (the host stand-in's two devices): every
    available()/supports() of the selection runs with device 1 current, as the call does, and
    the caller's device is left current."""
    import cupy

    seen = _spy_backends(monkeypatch)
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((1, 5, 4, 2)), rng.standard_normal((1, 5, 4, 3))
    with cupy.cuda.Device(1):
        gx, gdy = cupy.asarray(x), cupy.asarray(dy)
    with cupy.cuda.Device(0):
        got = gradops.conv2d_backprop_filter(gx, [3, 3, 2, 3], gdy, [1, 1, 1, 1], "SAME", backend=backend)
        assert host_device.current_device == 0
    asked = {"cudnn", "cuda"} if backend is None else {"cuda"}
    assert {name for name, _, _ in seen} == asked and {what for _, what, _ in seen} == {"available", "supports"}
    assert [d for _, _, d in seen] == [1] * len(seen), seen
    assert got.device.id == 1
    np.testing.assert_allclose(cupy.asnumpy(got), gradops.conv2d_backprop_filter(x, [3, 3, 2, 3], dy, [1, 1, 1, 1],
                                                                                 "SAME"), rtol=1e-12)


def test_decision_carries_the_cuda_kernels_own_reason(host_device, monkeypatch):
    """When the CUDA kernels compute a call, what their supports() said (an architecture
    fallback, say) follows the reason of the choice."""
    import cupy

    note = "bfloat16 tensor cores need sm_80: SIMT kernel"
    _spy_backends(monkeypatch, cuda_reason=note)
    x, dy = cupy.ones((1, 4, 4, 1)), cupy.ones((1, 4, 4, 1))
    for kw, why in (({}, "cuDNN does not support this call: spy: not this call"),
                    ({"use_cudnn_on_gpu": False}, "use_cudnn_on_gpu=False"),
                    ({"backend": "cuda"}, "backend='cuda' requested")):
        gradops.conv2d_backprop_filter(x, [2, 2, 1, 1], dy, [1, 1, 1, 1], "SAME", **kw)
        assert gradops.last_backend_decision() == gradops.BackendDecision(
            "conv2d_backprop_filter", "cuda", f"{why}; gradops' CUDA kernels: {note}")


def test_fractional_pooling_asks_its_backend_on_the_arrays_device(host_device, monkeypatch):
    import cupy

    from gradops.backends import cuda as cuda_backend

    asked = []
    real_supports = cuda_backend.supports

    def supports(op, geometry, dtype):
        asked.append((op, host_device.current_device))
        return real_supports(op, geometry, dtype)

    monkeypatch.setattr(cuda_backend, "supports", supports)
    dy = np.arange(8, dtype=np.float32).reshape(1, 2, 2, 2)
    with cupy.cuda.Device(1):
        gdy = cupy.asarray(dy)
    with cupy.cuda.Device(0):
        got = gradops.fractional_avg_pool_grad([1, 4, 4, 2], gdy, [0, 2, 4], [0, 2, 4])
    assert asked == [("fractional_avg_pool_grad", 1)], asked
    np.testing.assert_array_equal(cupy.asnumpy(got), gradops.fractional_avg_pool_grad([1, 4, 4, 2], dy, [0, 2, 4],
                                                                                      [0, 2, 4]))


# --------------------------------------------------------------------------- the driver hint


class _FakeDriver:
    """libcuda's cuDriverGetVersion, reporting ``version`` (e.g. 12080 for CUDA 12.8), or
    failing as a stub library's does (CUDA_ERROR_STUB_LIBRARY, 34) with ``version=None``."""

    def __init__(self, version: int | None):
        self.version = version

    def cuDriverGetVersion(self, pointer):
        if self.version is None:
            return 34
        pointer._obj.value = self.version
        return 0  # CUDA_SUCCESS


def _broken_cupy(runtime_version: int):
    import types

    def get_device_count():
        raise RuntimeError("cudaErrorInsufficientDriver: CUDA driver version is insufficient for CUDA runtime version")

    runtime = types.SimpleNamespace(getDeviceCount=get_device_count, runtimeGetVersion=lambda: runtime_version)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime))


@pytest.mark.parametrize("driver, runtime, words", [
    ("missing", 13000, "no NVIDIA driver was found: libcuda.so.1 does not load (in a container, run it with "
                       "--gpus all)"),
    (None, 13000, "libcuda.so.1 loads but reports no CUDA version (cuDriverGetVersion failed: a toolkit's stub "
                  "library found before the driver's, or a broken driver install)"),
    (12080, 13000, "the NVIDIA driver supports CUDA up to 12.8 and CuPy is built for CUDA 13.0: update the driver "
                   "(R580 or newer) or install gradops[cuda12]"),
    (11080, 12080, "the NVIDIA driver supports CUDA up to 11.8 and CuPy is built for CUDA 12.8: update the driver "
                   "(R525 or newer)"),
])
def test_an_unusable_driver_is_named_with_what_to_do(monkeypatch, driver, runtime, words):
    """CuPy says "CUDA driver version is insufficient" both with no driver and with one too old
    for its CUDA major (an R570 driver under gradops[cuda13]); gradops tells which, and what to do."""
    import sys

    from gradops.backends import _gpu_probe

    monkeypatch.setattr(_gpu_probe, "DRIVER_LIBRARY", "libcuda.so.1")
    monkeypatch.setattr(_gpu_probe, "_load_driver", lambda: None if driver == "missing" else _FakeDriver(driver))
    monkeypatch.setitem(sys.modules, "cupy", _broken_cupy(runtime))
    ok, reason = _gpu_probe.cupy_device_status()
    assert not ok
    assert reason == ("no usable CUDA driver/device: RuntimeError: cudaErrorInsufficientDriver: CUDA driver version "
                      f"is insufficient for CUDA runtime version; {words}")


def test_a_driver_new_enough_adds_no_hint(monkeypatch):
    """Same major (minor-version compatibility) or newer: the runtime's own error stands alone
    (no device, a device in use, ...)."""
    from gradops.backends import _gpu_probe

    for driver in (13000, 13020, 14000):
        monkeypatch.setattr(_gpu_probe, "_load_driver", lambda d=driver: _FakeDriver(d))
        assert _gpu_probe.driver_hint(13010) == ""


def test_the_real_driver_lookup_never_raises():
    """On this machine, whatever it has: an int version or None, without cuInit or a device."""
    from gradops.backends import _gpu_probe

    state, version = _gpu_probe.driver_status()
    assert version is None or version >= 1000
