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
