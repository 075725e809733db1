"""Arrays from other libraries: zero-copy GPU inputs, arrays on a second GPU, mixed host/GPU calls.

CPU tests use fake objects that expose ``__cuda_array_interface__`` or ``__dlpack_device__``
(never dereferenced: the call must be refused before any data is read).  GPU tests (gpu mark)
use PyTorch / JAX when installed (importorskip) and compare with the NumPy backend.  The
two-GPU tests also run on the host stand-in (``cuda_device``), which emulates two devices and
fails any launch that is given an array of a device other than the current one.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradops
from gradops import _arrays

S1 = [1, 1, 1, 1]


class FakeCudaArray:
    """Claims GPU memory through the CUDA array interface (data pointer 0: must never be read)."""

    def __init__(self, shape, typestr="<f4"):
        self.shape = shape
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 3}


class FakeDlpackTensor:
    """Reports a DLPack device the way torch / JAX tensors do; __dlpack__ must not be reached."""

    def __init__(self, shape, device_type):
        self.shape = shape
        self._device_type = device_type

    def __dlpack_device__(self):
        return (self._device_type, 0)

    def __dlpack__(self, *args, **kwargs):  # pragma: no cover - reaching it is the failure
        raise AssertionError("a mixed host/GPU call read a tensor before refusing")


CUDA, CUDA_MANAGED, CPU, CUDA_HOST = 2, 13, 1, 3


@pytest.mark.parametrize("gpu_tensor", [
    pytest.param(lambda s: FakeCudaArray(s), id="cuda-array-interface"),
    pytest.param(lambda s: FakeDlpackTensor(s, CUDA), id="dlpack-cuda"),
    pytest.param(lambda s: FakeDlpackTensor(s, CUDA_MANAGED), id="dlpack-cuda-managed"),
])
@pytest.mark.parametrize("gpu_arg", ["input", "out_backprop"])
def test_mixed_host_and_gpu_arguments_get_a_clear_error(gpu_tensor, gpu_arg):
    kw = dict(input=np.ones((1, 4, 4, 2), np.float32), filter_sizes=[3, 3, 2, 3],
              out_backprop=np.ones((1, 4, 4, 3), np.float32), strides=S1, padding="SAME")
    kw[gpu_arg] = gpu_tensor(kw[gpu_arg].shape)
    with pytest.raises(gradops.InvalidArgumentError) as info:
        gradops.conv2d_backprop_filter(**kw)
    message = str(info.value)
    other = "out_backprop" if gpu_arg == "input" else "input"
    assert gpu_arg in message and other in message and "GPU" in message and "host" in message


@pytest.mark.parametrize("call", [
    pytest.param(lambda g: gradops.conv2d_backprop_input([1, 4, 4, 2], np.ones((3, 3, 2, 3), np.float32), g,
                                                         S1, "SAME"), id="conv2d_backprop_input"),
    pytest.param(lambda g: gradops.depthwise_conv2d_native_backprop_input(
        [1, 4, 4, 2], np.ones((3, 3, 2, 1), np.float32), g, S1, "SAME"), id="depthwise"),
    pytest.param(lambda g: gradops.conv2d(g, np.ones((3, 3, 3, 2), np.float32), S1, "SAME"), id="conv2d"),
])
def test_every_conv_op_refuses_mixed_locations(call):
    with pytest.raises(gradops.InvalidArgumentError, match="GPU"):
        call(FakeCudaArray((1, 4, 4, 3)))


@pytest.mark.parametrize("device_type", [CPU, CUDA_HOST])
def test_dlpack_host_devices_count_as_host(device_type):
    """kDLCPU and kDLCUDAHost (pinned host memory) are host data, not GPU data."""
    assert _arrays.location(FakeDlpackTensor((1,), device_type)) == _arrays.HOST


def test_broken_dlpack_device_is_treated_as_host_and_then_refused_as_non_numeric():
    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("broken")

    assert _arrays.location(Broken()) == _arrays.HOST
    with pytest.raises(TypeError):
        gradops.conv2d_backprop_filter(Broken(), [1, 1, 1, 1], np.ones((1, 1, 1, 1), np.float32), S1, "SAME")


# --------------------------------------------------------------------------- GPU: zero-copy inputs


def _reference_and_gpu_inputs(rng):
    x = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    dy = rng.standard_normal((2, 6, 5, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 3)).astype(np.float32)
    expected = {
        "filter": gradops.conv2d_backprop_filter(x, [3, 3, 4, 3], dy, S1, "SAME"),
        "input": gradops.conv2d_backprop_input([2, 6, 5, 4], w, dy, S1, "SAME"),
    }
    return x, dy, w, expected


def _check_against_numpy(out_filter, out_input, expected, to_numpy):
    import cupy

    for got, want in ((out_filter, expected["filter"]), (out_input, expected["input"])):
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_allclose(to_numpy(got), want, rtol=1e-5, atol=1e-5)


def _gpu_call_or_skip(fn, *args, **kw):
    try:
        return fn(*args, **kw)
    except gradops.BackendUnavailableError as exc:
        pytest.skip(f"no GPU backend computes this yet: {exc}")


@pytest.mark.gpu
def test_torch_cuda_tensors_are_read_zero_copy():
    torch = pytest.importorskip("torch")
    import cupy

    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    x, dy, w, expected = _reference_and_gpu_inputs(np.random.default_rng(0))
    tx, tdy, tw = (torch.from_numpy(a).cuda() for a in (x, dy, w))
    # Zero copy: the CuPy view gradops makes shares the tensor's memory.
    assert cupy.from_dlpack(tx).data.ptr == tx.data_ptr()
    out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, tx, [3, 3, 4, 3], tdy, S1, "SAME")
    out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], tw, tdy, S1, "SAME")
    _check_against_numpy(out_f, out_i, expected, cupy.asnumpy)
    # A non-contiguous torch view (transposed NCHW storage read as NHWC) is computed correctly too.
    t_nchw = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).cuda()
    out_v = _gpu_call_or_skip(gradops.conv2d_backprop_filter, t_nchw.permute(0, 2, 3, 1), [3, 3, 4, 3], tdy,
                              S1, "SAME")
    np.testing.assert_allclose(cupy.asnumpy(out_v), expected["filter"], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_jax_gpu_arrays_are_read_zero_copy():
    jax = pytest.importorskip("jax")
    import cupy

    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU")
    x, dy, w, expected = _reference_and_gpu_inputs(np.random.default_rng(1))
    jx, jdy, jw = (jax.device_put(a, device) for a in (x, dy, w))
    assert cupy.from_dlpack(jx).data.ptr == jx.unsafe_buffer_pointer()
    out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, jx, [3, 3, 4, 3], jdy, S1, "SAME")
    out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], jw, jdy, S1, "SAME")
    _check_against_numpy(out_f, out_i, expected, cupy.asnumpy)


def test_arrays_on_a_second_gpu_are_computed_there(cuda_device):
    """Inputs on GPU 1 while GPU 0 is current: the result lives on GPU 1 and is right."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    x, dy, w, expected = _reference_and_gpu_inputs(np.random.default_rng(2))
    with cupy.cuda.Device(1):
        gx, gdy, gw = (cupy.asarray(a) for a in (x, dy, w))
    with cupy.cuda.Device(0):
        out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, gx, [3, 3, 4, 3], gdy, S1, "SAME")
        out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], gw, gdy, S1, "SAME")
        assert cupy.cuda.Device().id == 0  # the caller's current device is left alone
    assert out_f.device.id == 1 and out_i.device.id == 1
    _check_against_numpy(out_f, out_i, expected, cupy.asnumpy)


def test_tensors_on_different_gpus_are_refused(cuda_device):
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    with cupy.cuda.Device(0):
        gx = cupy.ones((1, 4, 4, 2), cupy.float32)
    with cupy.cuda.Device(1):
        gdy = cupy.ones((1, 4, 4, 3), cupy.float32)
    with pytest.raises(gradops.InvalidArgumentError, match="different GPUs"):
        gradops.conv2d_backprop_filter(gx, [3, 3, 2, 3], gdy, S1, "SAME")
