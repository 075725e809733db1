"""Backend selection: by where the arrays live, ``use_cudnn_on_gpu`` and ``backend=``.

Ops call :func:`prepare` (locate and convert the tensors, check dtypes), build their
geometry, then :func:`select_backend` (given the arrays, so that backends are asked on their
device) and :func:`run`; the chosen backend module has one function per op, named after it,
taking ``(geometry, *arrays)``.  GPU backends plug in by implementing
``available()``, ``supports(op, geometry, dtype)`` and the op functions in their module.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from . import _arrays
from ._dtypes import check_dtypes
from ._errors import BackendUnavailableError, InvalidArgumentError
from ._geometry import check_bool

log = logging.getLogger("gradops")

BACKENDS = ("numpy", "cuda", "cudnn")
_MODULES = {
    "numpy": "gradops.backends.numpy_backend",
    "cuda": "gradops.backends.cuda",
    "cudnn": "gradops.backends.cudnn",
}
#: Ops that cuDNN can compute (TF routes these to cuDNN when use_cudnn_on_gpu is true).
CUDNN_OPS = frozenset({
    "conv2d", "conv2d_backprop_filter", "conv2d_backprop_filter_v2", "conv2d_backprop_input",
    "conv2d_backprop_input_v2", "depthwise_conv2d_native", "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter",
})

#: Ops that take gradops' CUDA kernels on GPU arrays by default even where cuDNN supports the
#: call (``backend="cudnn"`` still takes cuDNN), with the reason the decision gives.  TF gives
#: these ops no ``use_cudnn_on_gpu`` attribute, so the choice is gradops' own, by measurement.
CUDA_BY_DEFAULT = {
    "depthwise_conv2d_native_backprop_filter": (
        "gradops' CUDA kernels by default for this op (backend='cudnn' takes cuDNN): on an H200, "
        "cuDNN 9.19's grouped wgrad took 1.0 to 24 times their kernel time (geometric means by "
        "dtype, layout and multiplier over MobileNetV2 and EfficientNet layers; up to 3,200 times at "
        "multiplier 2), benchmarks/results/gpu_h200_2026-12-04"),
    "depthwise_conv2d_native_backprop_input": (
        "gradops' CUDA kernels by default for this op (backend='cudnn' takes cuDNN): on an H100, "
        "cuDNN 9.19 took 1.09 to 28.5 times their kernel time on every MobileNetV2 layer, dtype and "
        "layout timed (geometric means 4.1 to 8.4 by dtype and layout), "
        "benchmarks/results/gpu_h100_2026-12-05"),
}


@dataclass(frozen=True)
class BackendDecision:
    """Which backend computed a call, and why (``reason`` says why not cuDNN when it was not)."""

    op: str
    backend: str
    reason: str


_last_decision: contextvars.ContextVar[BackendDecision | None] = contextvars.ContextVar(
    "gradops_last_backend_decision", default=None)


def last_backend_decision() -> BackendDecision | None:
    """The backend choice of the last gradops call made from this thread / asyncio task.

    ``None`` before the first call.  For example, after a call on GPU arrays that did not use
    cuDNN: ``BackendDecision(op='conv2d_backprop_input', backend='cuda', reason="cuDNN does
    not support this call: cuDNN graphs do not support float64 ...; gradops' CUDA kernels:
    supported")``: when the CUDA kernels compute a call, what their ``supports()`` said follows.  The same decisions
    are logged at DEBUG level on the "gradops" logger.
    """
    return _last_decision.get()


def _decided(op: str, module: ModuleType, reason: str) -> ModuleType:
    _last_decision.set(BackendDecision(op, module.NAME, reason))
    log.debug("%s: backend %s (%s)", op, module.NAME, reason)
    return module


def backend_module(name: str) -> ModuleType:
    return importlib.import_module(_MODULES[name])


def backend_status() -> dict[str, tuple[bool, str]]:
    """``{backend: (available, reason)}`` for every backend, never raising."""
    status = {}
    for name in BACKENDS:
        try:
            status[name] = backend_module(name).available()
        except Exception as exc:  # a broken optional install must not take the caller down
            status[name] = (False, f"failed to load: {type(exc).__name__}: {exc}")
    return status


def prepare(op: str, allowed_dtypes, **tensors: Any) -> tuple[str, dict[str, Any], np.dtype]:
    """Locate the tensors (all host or all GPU), convert them without copying, check dtypes."""
    where = _arrays.common_location(op, **tensors)
    if where == _arrays.GPU:
        try:
            import cupy  # noqa: F401
        except ImportError:
            raise BackendUnavailableError(
                f"{op}: the tensors are on a GPU but CuPy is not installed "
                "(pip install 'gradops[cuda12]' or 'gradops[cuda13]')") from None
        arrays = {name: _arrays.as_gpu_array(op, name, x) for name, x in tensors.items()}
        devices = {name: a.device.id for name, a in arrays.items()}
        if len(set(devices.values())) > 1:
            raise InvalidArgumentError(
                f"{op}: the tensors are on different GPUs ("
                + ", ".join(f"{n} on GPU {d}" for n, d in devices.items()) + "); put them on one device")
    else:
        arrays = {name: _arrays.as_host_array(op, name, x) for name, x in tensors.items()}
    dtype = check_dtypes(op, allowed_dtypes, **{name: a.dtype for name, a in arrays.items()})
    return where, arrays, dtype


def arrays_device(arrays) -> Any:
    """A context that makes the GPU holding ``arrays`` (an iterable; one device, as
    :func:`prepare` checks) current, or does nothing for host arrays / no arrays."""
    first = next(iter(arrays), None)
    if first is None or _arrays.location(first) == _arrays.HOST:  # NumPy's .device is "cpu"
        return contextlib.nullcontext()
    return first.device


def run(fn, geometry: Any, *arrays: Any):
    """``fn(geometry, *arrays)`` on the device that holds the arrays (CuPy's current device otherwise).

    NumPy's floating-point error handling is off for the call: NaN, Inf, overflow and
    underflow follow IEEE arithmetic silently, as in TF and on the GPU, whatever the caller's
    ``np.seterr`` (a caller's ``all="raise"`` made a NaN input raise FloatingPointError, and
    the default printed RuntimeWarnings from the NumPy backend's internals).
    """
    with arrays_device(arrays), np.errstate(all="ignore"):
        return fn(geometry, *arrays)


def check_use_cudnn(op: str, use_cudnn_on_gpu: Any) -> bool:
    return check_bool(op, "use_cudnn_on_gpu", use_cudnn_on_gpu, default=True)


def select_backend(op: str, where: str, backend: str | None, geometry: Any, dtype: np.dtype,
                   use_cudnn_on_gpu: bool = True, *, arrays: Any = ()) -> ModuleType:
    """The backend module that computes this call, or a clear error saying why none can.

    ``arrays``: the call's (converted) arrays.  Backends are asked (``available()``,
    ``supports()``: cuDNN builds its graph there) with the arrays' GPU current, the device
    :func:`run` computes on; without them, on CuPy's current device.
    """
    if backend is not None and backend not in BACKENDS:
        raise InvalidArgumentError(f"{op}: backend must be None or one of {', '.join(BACKENDS)}; got {backend!r}")
    if isinstance(arrays, dict):
        arrays = arrays.values()
    with arrays_device(arrays if where == _arrays.GPU else ()):
        return _select(op, where, backend, geometry, dtype, use_cudnn_on_gpu)


def _select(op, where, backend, geometry, dtype, use_cudnn_on_gpu) -> ModuleType:
    if backend is None:
        if where == _arrays.HOST:
            return _decided(op, backend_module("numpy"), "the tensors are in host memory")
        if not use_cudnn_on_gpu:
            why_not_cudnn = "use_cudnn_on_gpu=False"
        elif op not in CUDNN_OPS:
            why_not_cudnn = f"cuDNN has no {op}"
        elif op in CUDA_BY_DEFAULT:
            why_not_cudnn = CUDA_BY_DEFAULT[op]
        else:
            cudnn = backend_module("cudnn")
            ok, reason = cudnn.available()
            if ok:
                ok, reason = cudnn.supports(op, geometry, dtype)
                if ok:
                    return _decided(op, cudnn, f"use_cudnn_on_gpu=True and cuDNN supports this call ({reason})")
                why_not_cudnn = f"cuDNN does not support this call: {reason}"
            else:
                why_not_cudnn = f"cuDNN is unavailable: {reason}"
        backend, why = "cuda", why_not_cudnn
    else:
        why = f"backend={backend!r} requested"
    if backend == "numpy":
        if where != _arrays.HOST:
            raise InvalidArgumentError(
                f"{op}: backend='numpy' needs host (NumPy) arrays, but the tensors are on a GPU")
        return _decided(op, backend_module("numpy"), why)
    if where != _arrays.GPU:
        raise InvalidArgumentError(
            f"{op}: backend={backend!r} needs GPU arrays (CuPy, __cuda_array_interface__ or CUDA "
            "DLPack), but the tensors are NumPy/host arrays")
    if backend == "cudnn" and not use_cudnn_on_gpu:
        raise InvalidArgumentError(f"{op}: backend='cudnn' contradicts use_cudnn_on_gpu=False")
    module = backend_module(backend)
    ok, reason = module.available()
    if ok:
        ok, reason = module.supports(op, geometry, dtype)
    if not ok:
        raise BackendUnavailableError(f"{op}: backend {backend!r} cannot run this call: {reason}")
    if backend == "cuda" and reason:  # the kernels' own note, e.g. an architecture fallback
        why = f"{why}; gradops' CUDA kernels: {reason}"
    return _decided(op, module, why)
