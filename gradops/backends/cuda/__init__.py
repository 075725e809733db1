"""gradops' own CUDA kernels (``cuda_src/``), compiled at run time by CuPy's NVRTC step
(as RawModule does) and loaded from memory.

One launcher module per op (named after it) holds the host side: it allocates the result,
picks the template instantiation and launches on the current CuPy stream.  ``_build`` knows
the sources and instantiations (no CuPy needed, so CI compile-checks them on a CPU);
``_runtime`` compiles and caches modules per device.
"""

from __future__ import annotations

from .._gpu_probe import cupy_device_status

NAME = "cuda"

#: op -> launcher module (relative to this package) that defines a function of the same name.
_OPS = {
    "conv2d": "conv2d",
    "conv2d_backprop_filter": "conv2d_backprop_filter",
    "conv2d_backprop_input": "conv2d_backprop_input",
    "depthwise_conv2d_native": "conv2d",
    "depthwise_conv2d_native_backprop_input": "depthwise_conv2d_native_backprop_input",
    "depthwise_conv2d_native_backprop_filter": "depthwise_conv2d_native_backprop_filter",
    "fractional_avg_pool_grad": "fractional_avg_pool_grad",
    "fractional_max_pool_grad": "fractional_max_pool_grad",
    "fractional_avg_pool": "fractional_pool",
    "fractional_max_pool": "fractional_pool",
}


def _launcher(op: str):
    import importlib

    return importlib.import_module(f"{__name__}.{_OPS[op]}")


# Importing a submodule binds it as an attribute of this package, which would replace the op
# function of the same name defined below (the dispatcher calls ``backend.<op>(...)``).
# Import every launcher now (they import CuPy only when called) so the functions below win.
for _op in _OPS:
    _launcher(_op)
del _op


def available() -> tuple[bool, str]:
    return cupy_device_status()


def supports(op, geometry, dtype) -> tuple[bool, str]:
    op = op.removesuffix("_v2")  # the V2 ops compute exactly what V1 does
    if op not in _OPS or not hasattr(_launcher(op), op):
        return False, f"gradops' CUDA kernels do not implement {op}"
    check = getattr(_launcher(op), "supports", None)
    return check(op, geometry, dtype) if check else (True, "supported")


def conv2d(geometry, input, filter):
    return _launcher("conv2d").conv2d(geometry, input, filter)


def conv2d_backprop_filter(geometry, input, out_backprop):
    return _launcher("conv2d_backprop_filter").conv2d_backprop_filter(geometry, input, out_backprop)


def conv2d_backprop_input(geometry, filter, out_backprop):
    return _launcher("conv2d_backprop_input").conv2d_backprop_input(geometry, filter, out_backprop)


def depthwise_conv2d_native(geometry, input, filter):
    return _launcher("depthwise_conv2d_native").depthwise_conv2d_native(geometry, input, filter)


def depthwise_conv2d_native_backprop_input(geometry, filter, out_backprop):
    return _launcher("depthwise_conv2d_native_backprop_input").depthwise_conv2d_native_backprop_input(
        geometry, filter, out_backprop)


def depthwise_conv2d_native_backprop_filter(geometry, input, out_backprop):
    return _launcher("depthwise_conv2d_native_backprop_filter").depthwise_conv2d_native_backprop_filter(
        geometry, input, out_backprop)


def fractional_avg_pool_grad(geometry, out_backprop):
    return _launcher("fractional_avg_pool_grad").fractional_avg_pool_grad(geometry, out_backprop)


def fractional_avg_pool(geometry, value):
    return _launcher("fractional_avg_pool").fractional_avg_pool(geometry, value)


def fractional_max_pool(geometry, value):
    return _launcher("fractional_max_pool").fractional_max_pool(geometry, value)


def fractional_max_pool_grad(geometry, orig_input, orig_output, out_backprop):
    return _launcher("fractional_max_pool_grad").fractional_max_pool_grad(geometry, orig_input, orig_output,
                                                                         out_backprop)
