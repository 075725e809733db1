"""Where arrays live, and turning them into NumPy or CuPy arrays without copies."""

from __future__ import annotations

import contextlib
import math
import os
from typing import Any

import numpy as np

from ._dtypes import bfloat16
from ._errors import InvalidArgumentError

HOST = "host"
GPU = "gpu"

# DLPack device types (dlpack.h): kDLCUDA, kDLCUDAHost is host memory, kDLCUDAManaged.
_DLPACK_CUDA = 2
_DLPACK_CUDA_MANAGED = 13
#: Host memory in DLPack's device types: kDLCPU, kDLCUDAHost, kDLROCMHost.
_DLPACK_HOST = (1, 3, 11)


def _cuda_array_interface(x: Any) -> tuple[dict | None, BaseException | None]:
    """(``x.__cuda_array_interface__``, None), (None, None) when ``x`` has none, or (None, the
    error) when the producer has the property but refuses it (PyTorch raises RuntimeError for a
    tensor that requires grad): a producer's error never escapes from here."""
    try:
        interface = x.__cuda_array_interface__
    except AttributeError:  # absent (PyTorch also raises it for CPU tensors)
        return None, None
    except Exception as exc:
        return None, exc
    if not isinstance(interface, dict):
        return None, TypeError(f"__cuda_array_interface__ is a {type(interface).__name__}, not a dict")
    return interface, None


def _dlpack_device_type(x: Any) -> int | None:
    """The DLPack device type ``x`` reports, or None (no protocol, NumPy, or a broken one)."""
    dlpack_device = getattr(x, "__dlpack_device__", None)
    if dlpack_device is None or isinstance(x, np.ndarray):  # NumPy's is kDLCPU
        return None
    try:
        return int(dlpack_device()[0])
    except Exception:  # a foreign object with a broken protocol
        return None


def location(x: Any) -> str:
    """``GPU`` for CuPy arrays, ``__cuda_array_interface__`` and CUDA DLPack tensors, else ``HOST``.

    Never raises: a producer whose ``__cuda_array_interface__`` raises (a PyTorch tensor that
    requires grad) is placed by its DLPack device, and counts as GPU data without one (it is
    then refused, by name, when it is read).
    """
    interface, refused = _cuda_array_interface(x)
    if interface is not None:
        return GPU
    device_type = _dlpack_device_type(x)
    if device_type is not None:
        return GPU if device_type in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED) else HOST
    return GPU if refused is not None else HOST


def common_location(op: str, **tensors: Any) -> str:
    """The one location of all ``tensors``; mixed host/GPU arguments are an error."""
    where = {name: location(x) for name, x in tensors.items()}
    kinds = set(where.values())
    if len(kinds) > 1:
        on_gpu = [n for n, w in where.items() if w == GPU]
        on_host = [n for n, w in where.items() if w == HOST]
        raise InvalidArgumentError(
            f"{op}: {', '.join(on_gpu)} on the GPU but {', '.join(on_host)} in host memory; "
            "pass all tensors on the same side"
        )
    return kinds.pop() if kinds else HOST


def as_host_array(op: str, name: str, x: Any) -> np.ndarray:
    """``x`` as a NumPy array (no copy when it already is one, nor for a host DLPack tensor
    without NumPy's own protocols, which is read with ``np.from_dlpack``)."""
    try:
        array = np.asarray(x)
    except Exception as exc:  # ragged lists, objects NumPy cannot read
        raise TypeError(f"{op}: {name} is not an array: {exc}") from None
    if array.dtype == object and array.ndim == 0 and callable(getattr(x, "__dlpack__", None)):
        try:
            return np.from_dlpack(x)
        except Exception as exc:  # bfloat16 (kDLBfloat) before NumPy 2.5, a broken producer
            device = _dlpack_device_type(x)
            kind = ("a host DLPack tensor" if device in _DLPACK_HOST else
                    f"a DLPack tensor on device type {device} (neither host memory nor CUDA)")
            raise TypeError(f"{op}: {name} is {kind} NumPy cannot read ({_first_line(exc)}); "
                            "pass a NumPy array") from None
    if array.dtype == object:
        raise TypeError(f"{op}: {name} is not a numeric array (got {type(x).__name__})")
    return array


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def _is_raw_2_byte_dtype(dtype: np.dtype) -> bool:
    """2 raw bytes (``V2``) without fields: how PyTorch (and ml_dtypes) describe bfloat16 in the
    array interfaces, which have no code for it."""
    return dtype.kind == "V" and dtype.itemsize == 2 and dtype.fields is None


def _is_raw_2_byte(typestr: Any, descr: Any = None) -> bool:
    """An interface's typestr (and descr, if any) of 2 raw bytes: see :func:`_is_raw_2_byte_dtype`."""
    try:
        dtype = np.dtype(typestr)
    except Exception:
        return False
    plain_descr = descr is None or (isinstance(descr, (list, tuple)) and len(descr) == 1
                                    and isinstance(descr[0], (list, tuple)) and not descr[0][0])
    return _is_raw_2_byte_dtype(dtype) and plain_descr


class _RawBitsInterface:
    """``producer``'s CUDA array interface with a ``<V2`` typestr read as uint16 (same memory,
    same stream entry): CuPy views it, and gradops reinterprets the bits as bfloat16."""

    def __init__(self, producer: Any, interface: dict):
        self._producer = producer  # keeps the memory alive as long as the view
        self.__cuda_array_interface__ = {**interface, "typestr": "<u2"}
        self.__cuda_array_interface__.pop("descr", None)


def _bfloat16_if_raw(array):
    """A 2-byte raw (void) array as gradops' bfloat16, zero-copy; other arrays unchanged."""
    if _is_raw_2_byte_dtype(array.dtype) and array.dtype != bfloat16:
        return array.view(bfloat16)
    return array


def as_gpu_array(op: str, name: str, x: Any):
    """``x`` as a CuPy array without a copy; a :class:`TypeError` naming ``name`` when it cannot be read.

    CuPy arrays are used as they are.  Other producers are read through DLPack when they have
    it (``cupy.from_dlpack`` passes CuPy's current stream on the tensor's device to
    ``__dlpack__(stream=...)``, so the producer orders its pending work on the tensor before
    gradops' kernels; it also carries bfloat16), else through ``__cuda_array_interface__``
    (CuPy synchronises on its ``stream`` entry when there is one; a ``<V2`` typestr is read as
    bfloat16).  Errors of the producer's protocols are collected into gradops' own message.
    """
    import cupy

    if isinstance(x, cupy.ndarray):
        return x
    failures = []
    if callable(getattr(x, "__dlpack__", None)) and _dlpack_device_type(x) in (_DLPACK_CUDA, _DLPACK_CUDA_MANAGED):
        try:
            return _bfloat16_if_raw(cupy.from_dlpack(x))
        except Exception as exc:  # e.g. PyTorch refuses tensors that require grad, old CuPy refuses bfloat16
            failures.append(f"through DLPack: {_first_line(exc)}")
    interface, refused = _cuda_array_interface(x)
    if refused is not None:
        failures.append(f"through __cuda_array_interface__: {_first_line(refused)}")
    elif interface is not None:
        try:
            if _is_raw_2_byte(interface.get("typestr"), interface.get("descr")):
                return cupy.asarray(_RawBitsInterface(x, interface)).view(bfloat16)
            return cupy.asarray(x)
        except Exception as exc:
            failures.append(f"through __cuda_array_interface__: {_first_line(exc)}")
    if not failures:
        failures.append("it has neither __cuda_array_interface__ nor CUDA DLPack (__dlpack__, __dlpack_device__)")
    raise TypeError(f"{op}: {name} could not be read as a GPU array ({type(x).__name__}): " + "; ".join(failures))


def shape_of(op: str, name: str, x: Any) -> tuple[int, ...]:
    """Shape of a tensor whose values are not used (the V2 ops' size-giving tensor)."""
    shape = getattr(x, "shape", None)
    if shape is None:
        shape = as_host_array(op, name, x).shape
    return tuple(int(d) for d in shape)


def host_int_vector(op: str, name: str, x: Any, *, flat: bool = False) -> list[int]:
    """A 1-D integer tensor of sizes (``filter_sizes``, ``input_sizes`` ...) as Python ints;
    with ``flat``, a tensor of any rank read in flat order (as TF reads some of them).

    TF keeps these tensors in host memory; a GPU array is copied back (they are tiny).
    """
    if location(x) == GPU:
        import cupy

        x = cupy.asnumpy(as_gpu_array(op, name, x))
    if isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a 1-D integer tensor, got a bool")
    if isinstance(x, (list, tuple)) and all(type(v) is int or isinstance(v, np.integer) for v in x):
        # Python ints as they are: NumPy would make 2**63 a float and 2**64 an object, and the
        # range check (which names the argument) would not be reached
        return [int(v) for v in x]
    array = as_host_array(op, name, x)
    if flat:
        array = array.reshape(-1)
    if array.ndim != 1:
        raise InvalidArgumentError(f"{op}: {name} must be 1-dimensional, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":  # not timedelta64, which NumPy files under integers
        raise TypeError(f"{op}: {name} must hold integers, got dtype {array.dtype}")
    return [int(v) for v in array]


# The widest type any backend works in (the NumPy backend sums fractional pooling in float64).
_WORKING_ITEMSIZE = 8


def host_memory_bytes() -> int:
    """Physical memory of this machine (no limit known: the largest NumPy allocation)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 2**63 - 1


_device_totals: dict[tuple[int, int], int] = {}


def _device_memory_bytes(arrays) -> int:
    """Total memory of the GPU holding ``arrays`` (asked once per device: it never changes)."""
    try:
        import cupy

        device = next((a.device for a in arrays if hasattr(a, "device")), None) or cupy.cuda.Device()
        key = (id(cupy), device.id)  # per CuPy module too: the tests' CPU stand-in is another one
        total = _device_totals.get(key)
        if total is None:
            with device:
                total = _device_totals[key] = int(cupy.cuda.runtime.memGetInfo()[1])
        return total
    except Exception:  # no way to ask: let the allocator decide
        return 2**63 - 1


def ready_for_backend(op: str, where: str, result_shape, arrays: dict[str, Any], extra_bytes: int = 0) -> dict[str, Any]:
    """``arrays`` as the backends take them, once the call is known to fit in memory.

    Byte-swapped host arrays (e.g. read from a big-endian file) hold the same values, but the
    backends and BLAS need native order: they are copied here, after validation, so a
    refused call never copies (a swapped broadcast view can have 2**40 logical elements).
    """
    check_fits_in_memory(op, where, result_shape, *arrays.values(), extra_bytes=extra_bytes)
    if where == GPU:
        return arrays
    return {name: native_order(a) for name, a in arrays.items()}


def native_order(a: np.ndarray) -> np.ndarray:
    """Host array ``a`` in native byte order: ``a`` itself if it is, else a copy of the elements
    it owns, its broadcast (zero-stride) dimensions broadcast again rather than copied: a call
    a backend's own check refuses (say fractional_max_pool_grad's orig_output test) then holds
    no copy of a swapped view's logical size (2**20 rows of one element: 8 MiB, the long fuzz
    run, 2026-12-07)."""
    if a.dtype.isnative:
        return a
    owned = a[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in a.strides)]
    swapped = owned.astype(owned.dtype.newbyteorder("="))
    return swapped if swapped.shape == a.shape else np.broadcast_to(swapped, a.shape)


def zero_extension_bytes(array: Any, shape) -> int:
    """Bytes of the copy :func:`zero_extended` makes of ``array`` for ``shape`` (0: none)."""
    return 0 if tuple(array.shape) == tuple(shape) else math.prod(shape) * array.dtype.itemsize


def zero_extended(array: Any, shape, *, flat: bool = False):
    """``array`` itself when it has ``shape``, else a zero tensor of ``shape`` and ``array``'s
    dtype, on ``array``'s device, holding ``array`` in its leading corner (``array[i, j, ...]``
    at ``[i, j, ...]``; no dimension of ``array`` larger than ``shape``'s) or, with ``flat``,
    its elements in C order as the flat prefix (``array.size`` at most ``shape``'s element
    count)."""
    if tuple(array.shape) == tuple(shape):
        return array
    if location(array) == HOST:
        xp, device = np, contextlib.nullcontext()
    else:
        import cupy as xp

        device = array.device
    with device:
        out = xp.zeros(tuple(shape), array.dtype)
        if flat:
            out.reshape(-1)[:array.size] = array.reshape(-1)
        else:
            out[tuple(slice(0, d) for d in array.shape)] = array
    return out


def memory_bytes(where: str, arrays=()) -> int:
    """The memory a call's allocations must fit in: the total of the GPU holding ``arrays``
    (where is GPU), else this machine's physical memory."""
    return _device_memory_bytes(arrays) if where == GPU else host_memory_bytes()


def tensor_bytes(result_shape, *arrays: Any) -> int:
    """What :func:`check_fits_in_memory` counts: the result at the widest working precision
    plus the inputs' logical sizes."""
    need = math.prod(int(d) for d in result_shape) * _WORKING_ITEMSIZE
    return need + sum(math.prod(int(d) for d in a.shape) * a.dtype.itemsize for a in arrays)


def check_result_shape(op: str, result_shape, itemsize: int) -> None:
    """Refuse a result shape no NumPy array can take, even an empty one.

    NumPy multiplies the non-zero dimensions by the item size and refuses a product past
    2**63 - 1 whatever the other dimensions ("array is too big"), so an empty result such as
    [1, 2**31, 2**31, 0] in float16 cannot be made on the host.  TF returns such an empty
    tensor; gradops refuses it on every device, so that a call's result or error does not
    depend on where its tensors live (the host backend and the CPU stand-in of the GPU tests
    hold arrays in NumPy).  A non-empty shape past the limit is left to the memory check.
    """
    shape = [int(d) for d in result_shape]
    span = itemsize * math.prod(d for d in shape if d)
    if 0 in shape and span > 2**63 - 1:
        raise InvalidArgumentError(
            f"{op}: the result shape {list(result_shape)} is empty but its non-zero dimensions span "
            f"{span} bytes of {itemsize}-byte elements, past 2**63-1: no NumPy array has that shape")


def check_fits_in_memory(op: str, where: str, result_shape, *arrays: Any, extra_bytes: int = 0) -> None:
    """Refuse, before anything is allocated, a call that cannot fit in its device's memory.

    Counts the result at the widest working precision plus the inputs' logical sizes (a
    broadcast or strided view may be copied by a backend) and ``extra_bytes`` (a copy the op
    itself makes), against the physical memory of the host, or the total memory of the GPU
    holding the arrays.  A call that passes may still run
    out of memory when other work holds it; one that fails never could have run.  An empty
    result no NumPy array can take is refused first (:func:`check_result_shape`).
    """
    check_result_shape(op, result_shape, max((a.dtype.itemsize for a in arrays), default=_WORKING_ITEMSIZE))
    need = tensor_bytes(result_shape, *arrays) + extra_bytes
    limit = memory_bytes(where, arrays)
    if need > limit:
        place = "the GPU's" if where == GPU else "this machine's"
        raise InvalidArgumentError(
            f"{op}: the result {list(result_shape)} and the inputs need at least {need} bytes, "
            f"more than {place} {limit} bytes of memory")
