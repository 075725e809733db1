"""cuDNN through NVIDIA's cuDNN Frontend Python package (``import cudnn``, pinned 1.28.0).

Ops: conv2d_backprop_filter and depthwise_conv2d_native_backprop_filter (wgrad graphs),
conv2d_backprop_input and depthwise_conv2d_native_backprop_input (dgrad graphs), and the
forward conv2d / depthwise_conv2d_native (fprop); depthwise filters are the grouped filter
[C*M, 1, R, S] with groups = C; all for float16, bfloat16 and float32.  cuDNN graphs have
no float64 convolutions: those calls go to gradops' CUDA kernels (``supports`` says so).
Arrays are CuPy arrays on the current device; results are new CuPy arrays in the input dtype.

``supports`` builds (and caches) the graph for the current device and options (dispatch makes
the arrays' device current before asking, and runs the call there), so a problem
for which no cuDNN engine survives the numerical filters (see ``_graphs``) is reported as
unsupported with cuDNN's reason rather than failing at run time.
"""

from __future__ import annotations

import threading

import numpy as np

from ..._options import Options, get_options
from .._gpu_probe import cupy_device_status
from . import _graphs, _loader
from ._spec import DGRAD, FPROP, WGRAD, conv_spec, filter_from_cudnn, filter_storage_shape, filter_to_cudnn, is_empty

NAME = "cudnn"

#: op (without a ``_v2`` suffix) -> the cuDNN graph that computes it.
OPS = {
    "conv2d": FPROP,
    "depthwise_conv2d_native": FPROP,
    "conv2d_backprop_input": DGRAD,
    "depthwise_conv2d_native_backprop_input": DGRAD,
    "conv2d_backprop_filter": WGRAD,
    "depthwise_conv2d_native_backprop_filter": WGRAD,
}
DTYPES = ("float16", "bfloat16", "float32")

_probe_lock = threading.Lock()
_probed: dict[int, tuple[bool, str]] = {}


def versions() -> dict[str, str]:
    """{'frontend': ..., 'library': ...} versions, or why they are unknown; never raises."""
    return _loader.versions()


def _probe(cudnn) -> tuple[bool, str]:
    """Run a 2x2 float32 filter gradient once per device: catches missing libcudnn sub-libraries
    (engines, heuristics), which only fail when a graph is built, and checks the answer."""
    from ..._geometry import conv2d_geometry

    device = _graphs.runtime.device_id()
    with _probe_lock:
        if device not in _probed:
            try:
                xp = _graphs.runtime.xp
                geometry = conv2d_geometry("cudnn probe", (1, 2, 2, 1), (1, 1, 1, 1), (1, 2, 2, 1), [1, 1, 1, 1],
                                           "VALID", [], "NHWC", [1, 1, 1, 1])
                x = xp.arange(1, 5, dtype=np.float32).reshape(1, 2, 2, 1)
                dw = _filter_gradient(cudnn, Options(), geometry, x, xp.ones((1, 2, 2, 1), dtype=np.float32))
                got = float(dw.reshape(-1)[0])
                # sum(x * 1) over the four positions = 1 + 2 + 3 + 4
                if got != 10.0:
                    _probed[device] = (False, f"cuDNN computed a wrong result in a self-test (10 expected, got {got})")
                else:
                    _probed[device] = (True, "")
            except Exception as exc:
                _probed[device] = (False, f"cuDNN failed a self-test on GPU {device}: {_graphs.first_line(exc)}")
        return _probed[device]


def available() -> tuple[bool, str]:
    """(True, versions) when the frontend, libcudnn, CuPy and a GPU all work; else (False, why)."""
    cudnn, description = _loader.load()
    if cudnn is None:
        return False, description
    ok, reason = cupy_device_status()
    if not ok:
        return False, reason
    ok, reason = _probe(cudnn)
    if not ok:
        return False, reason
    return True, description


def supports(op, geometry, dtype) -> tuple[bool, str]:
    """Whether cuDNN computes ``op`` (a ``_v2`` suffix allowed) for this geometry and dtype."""
    op = op.removesuffix("_v2")
    if op not in OPS:
        return False, f"cuDNN has no {op}"
    name = np.dtype(dtype).name
    if name == "float64":
        return False, "cuDNN graphs do not support float64 convolutions (gradops' CUDA kernels compute them)"
    if name not in DTYPES:
        return False, f"cuDNN convolutions take {', '.join(DTYPES)}, not {name}"
    if is_empty(geometry):
        return True, "empty tensors: zeros without calling cuDNN"
    cudnn, reason = _loader.load()
    if cudnn is None:
        return False, reason
    try:
        built = _graphs.get(cudnn, conv_spec(OPS[op], geometry, dtype), get_options())
    except _graphs.GraphUnsupported as exc:
        return False, str(exc)
    return True, f"cuDNN plan {built.plan_name}"


def _cudnn():
    cudnn, reason = _loader.load()
    if cudnn is None:
        from ..._errors import BackendUnavailableError

        raise BackendUnavailableError(f"cuDNN is unavailable: {reason}")
    return cudnn


def _filter_gradient(cudnn, options, geometry, input, out_backprop):
    xp = _graphs.runtime.xp
    spec = conv_spec(WGRAD, geometry, input.dtype)
    dw = xp.empty(filter_storage_shape(geometry), dtype=input.dtype)
    _graphs.execute(cudnn, spec, options, x=_graphs.prepared(input), y=_graphs.prepared(out_backprop), w=dw)
    return filter_from_cudnn(xp, dw, geometry)


def _input_gradient(geometry, filter, out_backprop):
    xp = _graphs.runtime.xp
    if is_empty(geometry):
        return xp.zeros(geometry.input_shape, dtype=filter.dtype)
    spec = conv_spec(DGRAD, geometry, filter.dtype)
    dx = xp.empty(geometry.input_shape, dtype=filter.dtype)
    w = filter_to_cudnn(xp, filter, geometry)
    _graphs.execute(_cudnn(), spec, get_options(), y=_graphs.prepared(out_backprop), w=_graphs.prepared(w), x=dx)
    return dx


def _forward(geometry, input, filter):
    xp = _graphs.runtime.xp
    if is_empty(geometry):
        return xp.zeros(geometry.out_backprop_shape, dtype=input.dtype)
    spec = conv_spec(FPROP, geometry, input.dtype)
    y = xp.empty(geometry.out_backprop_shape, dtype=input.dtype)
    w = filter_to_cudnn(xp, filter, geometry)
    _graphs.execute(_cudnn(), spec, get_options(), x=_graphs.prepared(input), w=_graphs.prepared(w), y=y)
    return y


def conv2d_backprop_filter(geometry, input, out_backprop):
    """Filter gradient, HWIO [R, S, C / groups, K], from input and out_backprop in ``data_format``."""
    if is_empty(geometry):
        return _graphs.runtime.xp.zeros(geometry.filter_shape, dtype=input.dtype)
    return _filter_gradient(_cudnn(), get_options(), geometry, input, out_backprop)


def depthwise_conv2d_native_backprop_filter(geometry, input, out_backprop):
    """Depthwise filter gradient [R, S, C, M]: a grouped wgrad (groups = C) whose HWIO result
    [R, S, 1, C*M] holds channel c * M + m, i.e. [R, S, C, M] in memory order."""
    if is_empty(geometry):
        return _graphs.runtime.xp.zeros(geometry.filter_shape, dtype=input.dtype)
    dw = _filter_gradient(_cudnn(), get_options(), geometry, input, out_backprop)
    return dw.reshape(geometry.filter_shape)


def conv2d_backprop_input(geometry, filter, out_backprop):
    """Input gradient in ``data_format`` from the HWIO filter and out_backprop."""
    return _input_gradient(geometry, filter, out_backprop)


def depthwise_conv2d_native_backprop_input(geometry, filter, out_backprop):
    """Input gradient from the depthwise filter [R, S, C, M] (a grouped dgrad with groups = C)."""
    return _input_gradient(geometry, filter, out_backprop)


def conv2d(geometry, input, filter):
    """Forward (grouped) convolution, output in ``data_format``."""
    return _forward(geometry, input, filter)


def depthwise_conv2d_native(geometry, input, filter):
    """Forward depthwise convolution, filter [R, S, C, M]."""
    return _forward(geometry, input, filter)
