"""Arrays from other libraries: zero-copy GPU inputs, arrays on a second GPU, mixed host/GPU calls.

CPU tests use fake objects that expose ``__cuda_array_interface__`` or ``__dlpack_device__``
(never dereferenced: the call must be refused before any data is read), and fakes of PyTorch
CUDA tensors (bfloat16, requires_grad) over the host stand-in's memory, on which the public ops
run.  GPU tests (gpu mark) use PyTorch / JAX when installed (importorskip) and compare with the
NumPy backend; the stream handshake with PyTorch is tested there only.  The
two-GPU tests also run on the host stand-in (``cuda_device``), which emulates two devices and
fails any launch that is given an array of a device other than the current one.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import gradops
from conftest import DLPackOnly, assert_close, to_gpu, to_host
from gradops import _arrays
from gradops._dtypes import bfloat16

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
    pytest.param(lambda g: gradops.depthwise_conv2d_native_backprop_filter(
        np.ones((1, 4, 4, 1), np.float32), [3, 3, 1, 3], g, S1, "SAME"), id="depthwise_filter"),
    pytest.param(lambda g: gradops.conv2d(g, np.ones((3, 3, 3, 2), np.float32), S1, "SAME"), id="conv2d"),
])
def test_every_conv_op_refuses_mixed_locations(call):
    with pytest.raises(gradops.InvalidArgumentError, match="GPU"):
        call(FakeCudaArray((1, 4, 4, 3)))


@pytest.mark.parametrize("gpu_arg", ["orig_input", "orig_output", "out_backprop"])
def test_fractional_max_pool_grad_refuses_mixed_locations(gpu_arg):
    """Its three tensors must live together; the one on the GPU is named, with where the others are."""
    kw = dict(orig_input=np.ones((1, 4, 4, 2), np.float32), orig_output=np.ones((1, 2, 2, 2), np.float32),
              out_backprop=np.ones((1, 2, 2, 2), np.float32), row_pooling_sequence=[0, 2, 4],
              col_pooling_sequence=[0, 2, 4])
    kw[gpu_arg] = FakeCudaArray(kw[gpu_arg].shape)
    with pytest.raises(gradops.InvalidArgumentError, match="GPU") as info:
        gradops.fractional_max_pool_grad(**kw)
    assert gpu_arg in str(info.value) and "host" in str(info.value)


@pytest.mark.parametrize("device_type", [CPU, CUDA_HOST])
def test_dlpack_host_devices_count_as_host(device_type):
    """kDLCPU and kDLCUDAHost (pinned host memory) are host data, not GPU data."""
    assert _arrays.location(FakeDlpackTensor((1,), device_type)) == _arrays.HOST


def test_a_host_dlpack_only_tensor_is_read_without_a_copy():
    """kDLCPU tensors that offer only DLPack are host data and are read through np.from_dlpack
    (they used to be refused as "not a numeric array"); a strided one keeps its strides."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 10, 3)).astype(np.float32)[:, :, ::2]  # a strided view
    dy = rng.standard_normal((2, 6, 5, 4)).astype(np.float32)
    assert np.asarray(DLPackOnly(x)).dtype == object  # the premise: NumPy cannot read it otherwise
    expected = gradops.conv2d_backprop_filter(x, [3, 3, 3, 4], dy, S1, "SAME")
    got = gradops.conv2d_backprop_filter(DLPackOnly(x), [3, 3, 3, 4], DLPackOnly(dy), S1, "SAME")
    assert type(got) is np.ndarray
    np.testing.assert_array_equal(got, expected)
    assert np.shares_memory(_arrays.as_host_array("op", "input", DLPackOnly(x)), x)


def test_a_dlpack_tensor_on_another_accelerator_is_named_as_such():
    """A ROCm tensor (kDLROCM, 10) is not host data to read; its device type is named.  (The
    fake's __dlpack__ raises, as NumPy's reader would for that device.)"""
    with pytest.raises(TypeError, match="input is a DLPack tensor on device type 10 \\(neither host memory nor CUDA"):
        gradops.conv2d_backprop_filter(FakeDlpackTensor((1, 1, 1, 1), 10), [1, 1, 1, 1], np.ones((1, 1, 1, 1)),
                                       S1, "SAME")


class UnreadableHostDLPack:
    """A host DLPack tensor whose producer fails to export it, as NumPy's reader fails on a dtype
    it lacks (bfloat16 before NumPy 2.5): the error comes from the __dlpack__ call."""

    def __dlpack__(self, **kwargs):
        raise BufferError("DLPack only supports signed/unsigned integers, float and complex dtypes.")

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def _numpy_reads_bfloat16_dlpack() -> bool:
    try:
        np.from_dlpack(np.ones(1, bfloat16))
    except BufferError:  # NumPy < 2.5
        return False
    return True


def test_a_host_dlpack_tensor_numpy_cannot_read_is_refused_by_name():
    """A host DLPack tensor NumPy's reader refuses: a clear TypeError naming the argument."""
    with pytest.raises(TypeError, match="out_backprop is a host DLPack tensor NumPy cannot read "
                                        "\\(BufferError: DLPack only "):
        gradops.conv2d_backprop_input([1, 2, 2, 1], np.ones((1, 1, 1, 1), bfloat16), UnreadableHostDLPack(), S1,
                                      "SAME")


def test_a_host_bfloat16_dlpack_tensor_is_computed_where_numpy_reads_it():
    """NumPy 2.5 reads a kDLBfloat DLPack tensor as ml_dtypes' bfloat16, and gradops computes with it
    (without a copy); an older NumPy refuses it, and so does gradops, naming the argument."""
    rng = np.random.default_rng(3)
    dy, w = (rng.standard_normal(shape).astype(bfloat16) for shape in ((1, 3, 3, 2), (2, 2, 1, 2)))
    call = lambda dy: gradops.conv2d_backprop_input([1, 3, 3, 1], w, dy, S1, "SAME")  # noqa: E731
    if not _numpy_reads_bfloat16_dlpack():
        with pytest.raises(TypeError, match="out_backprop is a host DLPack tensor NumPy cannot read"):
            call(DLPackOnly(dy))
        return
    assert _arrays.as_host_array("op", "out_backprop", DLPackOnly(dy)).ctypes.data == dy.ctypes.data
    got = call(DLPackOnly(dy))
    assert got.dtype == np.dtype(bfloat16)
    np.testing.assert_array_equal(got.view(np.uint16), call(dy).view(np.uint16))


def test_broken_dlpack_device_is_treated_as_host_and_then_refused_as_non_numeric():
    class Broken:
        def __dlpack_device__(self):
            raise RuntimeError("broken")

    assert _arrays.location(Broken()) == _arrays.HOST
    with pytest.raises(TypeError):
        gradops.conv2d_backprop_filter(Broken(), [1, 1, 1, 1], np.ones((1, 1, 1, 1), np.float32), S1, "SAME")


# --------------------------------------------------------------------------- PyTorch-like producers, on the stand-in
#
# Fakes of a PyTorch CUDA tensor's interop surface (torch/_tensor.py), backed by memory of the host
# stand-in (tests/cuda_host.py), so the public ops run on them on any machine:
# * __cuda_array_interface__: version 2, no stream entry, bfloat16 as typestr "<V2" (torch's
#   _dtype_to_typestr); RuntimeError for a tensor that requires grad (torch's message);
# * __dlpack__(*, stream, max_version, dl_device, copy): bfloat16 as kDLBfloat (code 4, 16 bits);
#   a tensor that requires grad is refused too (BufferError in torch >= 2.6, RuntimeError before);
# * __dlpack_device__(): (kDLCUDA, device index).

KDL_CUDA, KDL_UINT, KDL_BFLOAT = 2, 1, 4


class _DLTensor(ctypes.Structure):
    """The head of dlpack.h's DLTensor (the start of an unversioned "dltensor" capsule's DLManagedTensor)."""

    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


def _dltensor(capsule) -> _DLTensor:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return _DLTensor.from_address(get(capsule, b"dltensor"))


class TorchLikeCudaTensor:
    """A PyTorch CUDA tensor as gradops sees it (see above), over the stand-in array ``array``.
    ``dlpack_calls`` records the keyword arguments of every ``__dlpack__`` call, and
    ``interface_reads`` counts the reads of ``__cuda_array_interface__``."""

    def __init__(self, array, requires_grad=False):
        self._array = array
        self.shape = array.shape
        self.requires_grad = requires_grad
        self.dlpack_calls = []
        self.interface_reads = 0

    @property
    def __cuda_array_interface__(self):
        self.interface_reads += 1
        if self.requires_grad:
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad. If gradients "
                               "aren't required, use var.detach() to get Variable that doesn't require grad.")
        a = self._array
        typestr = "<V2" if a.dtype == bfloat16 else a.dtype.str
        strides = None if a.flags.c_contiguous else a.strides
        return dict(typestr=typestr, shape=a.shape, strides=strides, data=(a.ctypes.data, False), version=2)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.dlpack_calls.append(dict(stream=stream, max_version=max_version))
        if self.requires_grad:
            raise BufferError("Can't export tensors that require gradient, use tensor.detach()")
        a = np.asarray(self._array)  # the same memory, as a plain NumPy array (which exports it)
        if a.dtype != bfloat16:
            return a.__dlpack__()
        capsule = a.view(np.uint16).__dlpack__()  # NumPy has no bfloat16 code: write torch's
        _dltensor(capsule).code = KDL_BFLOAT
        return capsule

    def __dlpack_device__(self):
        return (KDL_CUDA, self._array.device.id)


class CaiRefusedDLPackWorks(TorchLikeCudaTensor):
    """A producer whose __cuda_array_interface__ raises (not AttributeError) while DLPack works."""

    @property
    def __cuda_array_interface__(self):
        raise RuntimeError("this producer cannot describe its memory that way")


class _Capsule:
    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU: NumPy reads the stand-in's memory, which is host memory


def _cupy_like_host_device(takes_bfloat16: bool):
    import cuda_host

    class CupyLikeDLPackHostDevice(cuda_host.HostDevice):
        """The stand-in with CuPy's from_dlpack for CUDA producers: __dlpack__ is given CuPy's
        current stream (the legacy default stream, 1: the stand-in has no other), and a kDLBfloat
        tensor becomes an ml_dtypes bfloat16 array as in CuPy >= 14 (whichever NumPy reads it:
        NumPy refuses bfloat16 before 2.5), or is refused, as CuPy before 14 did."""

        def from_dlpack(self, x):
            if isinstance(x, cuda_host.HostArray):
                return x
            device_type, _ = x.__dlpack_device__()
            if device_type != KDL_CUDA:
                raise TypeError(f"from_dlpack: not a CUDA tensor (DLPack device type {device_type})")
            capsule = x.__dlpack__(stream=1)
            head = _dltensor(capsule)
            is_bfloat16 = (head.code, head.bits, head.lanes) == (KDL_BFLOAT, 16, 1)
            if is_bfloat16 and not takes_bfloat16:
                raise TypeError("Unsupported dtype: bfloat16 (DLPack code 4)")
            if is_bfloat16:
                head.code = KDL_UINT  # NumPy reads the bits as uint16
            host = np.from_dlpack(_Capsule(capsule))
            out = self._view(host.ctypes.data, host.shape, host.dtype, host.strides)
            return out.view(bfloat16) if is_bfloat16 else out

    return CupyLikeDLPackHostDevice


@pytest.fixture(params=["cupy-like-dlpack", "old-cupy-dlpack"])
def stand_in(request, monkeypatch):
    """The host stand-in, with a from_dlpack that takes bfloat16 as CuPy >= 14's does
    ("cupy-like-dlpack"), or one that refuses bfloat16 as an older CuPy did ("old-cupy-dlpack"):
    gradops must then read bfloat16 through the CUDA array interface."""
    import zlib

    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cls = _cupy_like_host_device(takes_bfloat16=request.param == "cupy-like-dlpack")
    device = cls(order="shuffled", seed=zlib.crc32(request.node.nodeid.encode())).install(monkeypatch)
    device.bfloat16_dlpack = request.param == "cupy-like-dlpack"
    return device


def _torch_like_case(rng, dtype, device_id=0, **kw):
    """Host inputs (rounded to dtype), their gradients in float64, and torch-like tensors on the stand-in."""
    import cupy

    x, dy, w = (rng.standard_normal(shape).astype(dtype) for shape in ((2, 6, 5, 4), (2, 6, 5, 3), (3, 3, 4, 3)))
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, w))
    want = {"filter": gradops.conv2d_backprop_filter(x64, [3, 3, 4, 3], dy64, S1, "SAME"),
            "input": gradops.conv2d_backprop_input([2, 6, 5, 4], w64, dy64, S1, "SAME")}
    with cupy.cuda.Device(device_id):
        tensors = tuple(TorchLikeCudaTensor(to_gpu(a), **kw) for a in (x, dy, w))
    return tensors, want


@pytest.mark.parametrize("dtype", [bfloat16, np.float32], ids=["bfloat16", "float32"])
def test_torch_like_tensors_compute_zero_copy_in_their_dtype(stand_in, rng, dtype):
    """PyTorch-like CUDA tensors (bfloat16: "<V2" in the CUDA array interface, kDLBfloat in DLPack)
    are read in place as gradops' dtype, through DLPack when it can carry the dtype, and the
    ops compute on them; the results are in that dtype."""
    import cupy

    (tx, tdy, tw), want = _torch_like_case(rng, dtype)
    view = _arrays.as_gpu_array("op", "input", tx)
    assert view.dtype == np.dtype(dtype) and view.ctypes.data == tx._array.ctypes.data  # zero copy
    # DLPack first; the interface ("<V2" read as bfloat16) only where the stand-in's DLPack
    # cannot carry bfloat16, as an older CuPy's could not.
    assert len(tx.dlpack_calls) == 1
    assert tx.interface_reads == (1 if dtype == bfloat16 and not stand_in.bfloat16_dlpack else 0)
    out_f = gradops.conv2d_backprop_filter(tx, [3, 3, 4, 3], tdy, S1, "SAME")
    out_i = gradops.conv2d_backprop_input([2, 6, 5, 4], tw, tdy, S1, "SAME")
    for got, expected in ((out_f, want["filter"]), (out_i, want["input"])):
        assert isinstance(got, cupy.ndarray) and got.dtype == np.dtype(dtype)
        assert_close(to_host(got), expected, dtype)
    assert [len(t.dlpack_calls) for t in (tx, tdy, tw)] == [2, 2, 1]


def test_cuda_array_interface_v2_typestr_is_read_as_bfloat16_keeping_its_stream(monkeypatch, stand_in):
    """A CUDA-array-interface producer whose typestr is "<V2" (PyTorch's and ml_dtypes' bfloat16)
    is viewed as bfloat16 in place, and CuPy sees the producer's own interface otherwise
    unchanged: its data, strides and v3 stream entry (on which CuPy synchronises)."""
    import cupy

    a = to_gpu(np.arange(24, dtype=np.float32).reshape(2, 3, 4).astype(bfloat16))[:, ::2]

    class Producer:
        shape = a.shape
        __cuda_array_interface__ = {"shape": a.shape, "typestr": "<V2", "strides": a.strides,
                                    "data": (a.ctypes.data, False), "version": 3, "stream": 7}

    seen = []
    asarray = cupy.asarray

    def spy(x, *args, **kw):
        seen.append(dict(getattr(x, "__cuda_array_interface__", {})))
        return asarray(x, *args, **kw)

    monkeypatch.setattr(cupy, "asarray", spy)
    view = _arrays.as_gpu_array("op", "x", Producer())
    assert view.dtype == bfloat16 and view.ctypes.data == a.ctypes.data and view.strides == a.strides
    np.testing.assert_array_equal(to_host(view).astype(np.float32), to_host(a).astype(np.float32))
    assert seen == [{**Producer.__cuda_array_interface__, "typestr": "<u2"}]


def test_requires_grad_tensor_is_refused_by_name_with_the_producers_reasons(stand_in, rng):
    """PyTorch refuses to export a tensor that requires grad through both protocols: gradops
    places it (on the GPU, by its DLPack device) without letting the property's error escape,
    and raises its own TypeError naming the argument, with both of PyTorch's messages."""
    (tx, tdy, tw), _ = _torch_like_case(rng, np.float32)
    (rx, _, _), _ = _torch_like_case(rng, np.float32, requires_grad=True)
    assert _arrays.location(rx) == _arrays.GPU
    with pytest.raises(TypeError) as info:
        gradops.conv2d_backprop_filter(rx, [3, 3, 4, 3], tdy, S1, "SAME")
    message = str(info.value)
    assert message.startswith("conv2d_backprop_filter: input could not be read as a GPU array")
    assert "through DLPack: BufferError: Can't export tensors that require gradient, use tensor.detach()" in message
    assert "through __cuda_array_interface__: RuntimeError: Can't get __cuda_array_interface__ on Variable " \
           "that requires grad" in message
    # With host data beside it, it is the mixed-location error (not a crash in the property).
    with pytest.raises(gradops.InvalidArgumentError, match="input on the GPU but out_backprop in host memory"):
        gradops.conv2d_backprop_filter(rx, [3, 3, 4, 3], np.ones((2, 6, 5, 3), np.float32), S1, "SAME")
    # Detached (here: the same memory without the flag), it computes.
    rx.requires_grad = False
    gradops.conv2d_backprop_filter(rx, [3, 3, 4, 3], tdy, S1, "SAME")


def test_a_cuda_array_interface_that_raises_is_read_through_dlpack(stand_in, rng):
    """A producer whose __cuda_array_interface__ raises while its DLPack works is read through
    DLPack, in place, on its own device (device 1 here, device 0 current)."""
    import cupy

    x, dy = rng.standard_normal((1, 5, 5, 2)).astype(np.float32), rng.standard_normal((1, 5, 5, 3)).astype(np.float32)
    with cupy.cuda.Device(1):
        tx, tdy = (CaiRefusedDLPackWorks(to_gpu(a)) for a in (x, dy))
    assert _arrays.location(tx) == _arrays.GPU
    view = _arrays.as_gpu_array("op", "input", tx)
    assert view.ctypes.data == tx._array.ctypes.data and view.device.id == 1
    with cupy.cuda.Device(0):
        got = gradops.conv2d_backprop_filter(tx, [3, 3, 2, 3], tdy, S1, "SAME")
    assert got.device.id == 1
    assert_close(to_host(got), gradops.conv2d_backprop_filter(x.astype(np.float64), [3, 3, 2, 3],
                                                              dy.astype(np.float64), S1, "SAME"), np.float32)


def test_a_producer_with_no_usable_protocol_is_refused_by_name(stand_in, rng):
    """No property error escapes: an interface that raises, without DLPack, counts as GPU data
    and is refused by name; beside a host DLPack device it is host data."""
    (_, tdy, _), _ = _torch_like_case(rng, np.float32)

    class Raising:
        shape = (2, 6, 5, 4)

        @property
        def __cuda_array_interface__(self):
            raise ValueError("not now")

    class RaisingOnHost(Raising):
        def __dlpack_device__(self):
            return (1, 0)

    assert _arrays.location(Raising()) == _arrays.GPU
    assert _arrays.location(RaisingOnHost()) == _arrays.HOST
    with pytest.raises(TypeError, match=r"^conv2d_backprop_filter: input could not be read as a GPU array "
                                        r"\(Raising\): through __cuda_array_interface__: ValueError: not now$"):
        gradops.conv2d_backprop_filter(Raising(), [3, 3, 4, 3], tdy, S1, "SAME")


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


def _jax_and_its_gpu():
    """JAX and its first GPU, or skip."""
    jax = pytest.importorskip("jax")
    try:
        return jax, jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX sees no GPU")


@pytest.mark.gpu
def test_jax_gpu_arrays_are_read_zero_copy():
    jax, device = _jax_and_its_gpu()
    import cupy

    x, dy, w, expected = _reference_and_gpu_inputs(np.random.default_rng(1))
    jx, jdy, jw = (jax.device_put(a, device) for a in (x, dy, w))
    assert cupy.from_dlpack(jx).data.ptr == jx.unsafe_buffer_pointer()
    out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, jx, [3, 3, 4, 3], jdy, S1, "SAME")
    out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], jw, jdy, S1, "SAME")
    _check_against_numpy(out_f, out_i, expected, cupy.asnumpy)


def _bfloat16_inputs_and_reference(rng):
    """bfloat16 host inputs and the float64 gradients of exactly those values."""
    x, dy, w = (rng.standard_normal(shape).astype(bfloat16) for shape in ((2, 6, 5, 4), (2, 6, 5, 3), (3, 3, 4, 3)))
    x64, dy64, w64 = (a.astype(np.float64) for a in (x, dy, w))
    expected = {"filter": gradops.conv2d_backprop_filter(x64, [3, 3, 4, 3], dy64, S1, "SAME"),
                "input": gradops.conv2d_backprop_input([2, 6, 5, 4], w64, dy64, S1, "SAME")}
    return x, dy, w, expected


def _check_bfloat16(out_filter, out_input, expected):
    import cupy

    for got, want in ((out_filter, expected["filter"]), (out_input, expected["input"])):
        assert isinstance(got, cupy.ndarray) and got.dtype == bfloat16
        assert_close(to_host(got), want, bfloat16)


def _torch_cuda_or_skip():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return torch


@pytest.mark.gpu
def test_torch_bfloat16_tensors_are_read_zero_copy_as_bfloat16():
    """torch.bfloat16 ("<V2" in its CUDA array interface) arrives as gradops' bfloat16, in place."""
    torch = _torch_cuda_or_skip()
    x, dy, w, expected = _bfloat16_inputs_and_reference(np.random.default_rng(5))
    tx, tdy, tw = (torch.from_numpy(a.view(np.int16)).cuda().view(torch.bfloat16) for a in (x, dy, w))
    view = _arrays.as_gpu_array("op", "input", tx)
    assert view.dtype == bfloat16 and view.data.ptr == tx.data_ptr()
    out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, tx, [3, 3, 4, 3], tdy, S1, "SAME")
    out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], tw, tdy, S1, "SAME")
    _check_bfloat16(out_f, out_i, expected)


@pytest.mark.gpu
def test_torch_tensor_that_requires_grad_is_refused_by_name():
    """PyTorch exports such a tensor through neither protocol: gradops' TypeError names the
    argument and carries PyTorch's advice (detach); the detached tensor computes."""
    import cupy

    torch = _torch_cuda_or_skip()
    x, dy, _, expected = _reference_and_gpu_inputs(np.random.default_rng(6))
    tx = torch.from_numpy(x).cuda().requires_grad_(True)
    tdy = torch.from_numpy(dy).cuda()
    with pytest.raises(TypeError, match=r"^conv2d_backprop_filter: input could not be read as a GPU array.*detach"):
        gradops.conv2d_backprop_filter(tx, [3, 3, 4, 3], tdy, S1, "SAME")
    out = _gpu_call_or_skip(gradops.conv2d_backprop_filter, tx.detach(), [3, 3, 4, 3], tdy, S1, "SAME")
    np.testing.assert_allclose(cupy.asnumpy(out), expected["filter"], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_torch_work_pending_on_its_stream_is_ordered_before_gradops():
    """DLPack's stream handshake: values PyTorch is still writing on a side stream (queued
    behind a spin of ~0.1 s) are what gradops reads on a non-blocking CuPy stream, without the
    caller synchronising (gradops passes that stream to __dlpack__, PyTorch makes it wait)."""
    import cupy

    torch = _torch_cuda_or_skip()
    x, dy, _, expected = _reference_and_gpu_inputs(np.random.default_rng(7))
    sources = [torch.from_numpy(a).cuda() for a in (x, dy)]
    tx, tdy = (torch.zeros_like(t) for t in sources)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # GPU cycles spun on `side` before the writes below
        tx.copy_(sources[0])
        tdy.copy_(sources[1])
        with cupy.cuda.Stream(non_blocking=True) as ours:
            out = _gpu_call_or_skip(gradops.conv2d_backprop_filter, tx, [3, 3, 4, 3], tdy, S1, "SAME")
            ours.synchronize()
    np.testing.assert_allclose(cupy.asnumpy(out), expected["filter"], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_jax_bfloat16_arrays_are_read_zero_copy_as_bfloat16():
    jax, device = _jax_and_its_gpu()
    x, dy, w, expected = _bfloat16_inputs_and_reference(np.random.default_rng(8))
    jx, jdy, jw = (jax.device_put(a, device) for a in (x, dy, w))
    view = _arrays.as_gpu_array("op", "input", jx)
    assert view.dtype == bfloat16 and view.data.ptr == jx.unsafe_buffer_pointer()
    out_f = _gpu_call_or_skip(gradops.conv2d_backprop_filter, jx, [3, 3, 4, 3], jdy, S1, "SAME")
    out_i = _gpu_call_or_skip(gradops.conv2d_backprop_input, [2, 6, 5, 4], jw, jdy, S1, "SAME")
    _check_bfloat16(out_f, out_i, expected)


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


def _pooling_and_depthwise_calls(rng):
    """(name, call on arrays made by ``put``, NumPy result) of the ops beyond the conv pair."""
    x = rng.integers(-3, 4, (2, 6, 5, 4)).astype(np.float32)  # ties: max pooling's scan order decides
    rows, cols = [0, 2, 4, 6], [0, 2, 3, 5]
    y = gradops.fractional_max_pool(x, rows, cols, True)
    pooled_dy = rng.standard_normal(y.shape).astype(np.float32)
    depthwise_dy = rng.standard_normal((2, 6, 5, 8)).astype(np.float32)
    return [
        ("fractional_max_pool_grad",
         lambda put: gradops.fractional_max_pool_grad(put(x), put(y), put(pooled_dy), rows, cols, True),
         gradops.fractional_max_pool_grad(x, y, pooled_dy, rows, cols, True)),
        ("fractional_avg_pool_grad",
         lambda put: gradops.fractional_avg_pool_grad([2, 6, 5, 4], put(pooled_dy), rows, cols, True),
         gradops.fractional_avg_pool_grad([2, 6, 5, 4], pooled_dy, rows, cols, True)),
        ("depthwise_conv2d_native_backprop_filter",
         lambda put: gradops.depthwise_conv2d_native_backprop_filter(put(x), [3, 3, 4, 2], put(depthwise_dy), S1,
                                                                     "SAME"),
         gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 4, 2], depthwise_dy, S1, "SAME")),
    ]


def test_pooling_and_depthwise_gradients_on_either_gpu(cuda_device):
    """The same calls on GPU 0, then GPU 1, then GPU 0 again: each result lives where its inputs
    do and is right.  What a launcher keeps between calls (fractional pooling's cached cell
    tables, compiled kernels) must not cross devices: the stand-in fails a launch handed memory
    of another device."""
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    for name, call, expected in _pooling_and_depthwise_calls(np.random.default_rng(4)):
        for device in (0, 1, 0):
            with cupy.cuda.Device(device):
                got = call(cupy.asarray)
            with cupy.cuda.Device(0):
                assert isinstance(got, cupy.ndarray) and got.device.id == device, name
                np.testing.assert_allclose(to_host(got), expected, rtol=1e-5, atol=1e-5, err_msg=name)


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
