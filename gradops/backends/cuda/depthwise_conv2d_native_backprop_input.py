"""Launcher for cuda_src/depthwise_conv2d_native_backprop_input.cu.

One gather kernel over the input gradient (see the .cu file), instantiated per element type,
layout and filter-size/stride specialisation.  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import numpy as np

from ..._geometry import Conv2DGeometry
from . import _build, _runtime

SOURCE = "depthwise_conv2d_native_backprop_input.cu"
KERNEL = "gradops::depthwise_conv2d_native_backprop_input"

#: Template value of each data_format (``gradops::Layout`` in gradops_common.cuh).
LAYOUTS = {"NHWC": 0, "NCHW": 1}

#: Compile-time (filter_rows, filter_cols, stride_rows, stride_cols): the common 3x3 and 5x5
#: filters at unit and 2x2 strides.  Everything else runs the generic (0, 0, 0, 0) kernel.
SPECIALISATIONS = ((3, 3, 1, 1), (3, 3, 2, 2), (5, 5, 1, 1), (5, 5, 2, 2))
GENERIC = (0, 0, 0, 0)


def _expression(dtype, data_format: str, shape: tuple[int, int, int, int]) -> str:
    element, accumulator = _build.c_types(dtype)
    kh, kw, sh, sw = shape
    return f"{KERNEL}<{element}, {accumulator}, {LAYOUTS[data_format]}, {kh}, {kw}, {sh}, {sw}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture): dtypes x layouts x specialisations."""
    return {SOURCE: [_expression(dtype, data_format, shape)
                     for dtype in _build.C_TYPES
                     for data_format in LAYOUTS
                     for shape in (*SPECIALISATIONS, GENERIC)]}


def specialisation(g: Conv2DGeometry) -> tuple[int, int, int, int]:
    """The compile-time (KH, KW, SH, SW) the kernel runs with for ``g``, or GENERIC."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    return shape if shape in SPECIALISATIONS else GENERIC


def kernel_scalars(g: Conv2DGeometry) -> tuple[np.int64, ...]:
    """The kernel's ``long long`` parameters, in order, after its three pointers."""
    return tuple(_runtime.i64(v) for v in (
        g.batch, g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
        g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols, g.dilation_rows, g.dilation_cols,
        g.pad_top, g.pad_left))


def depthwise_conv2d_native_backprop_input(g: Conv2DGeometry, filter, out_backprop):
    """Input gradient [N, in_rows, in_cols, in_depth] in ``g.data_format``, out_backprop's dtype.

    filter: [filter_rows, filter_cols, in_depth, depth_multiplier]; out_backprop: [N, out_rows,
    out_cols, in_depth * depth_multiplier] in ``g.data_format``; both CuPy arrays on the current
    device, any strides.  Launches on the current stream without synchronising.
    """
    import cupy

    dtype = out_backprop.dtype
    if 0 in g.input_shape:
        return cupy.empty(g.input_shape, dtype)
    if 0 in filter.shape or 0 in out_backprop.shape:  # no tap reaches any input element
        return cupy.zeros(g.input_shape, dtype)
    filter = _runtime.contiguous(filter)
    out_backprop = _runtime.contiguous(out_backprop)
    in_backprop = cupy.empty(g.input_shape, dtype)
    fn = _runtime.kernel(SOURCE, _expression(dtype, g.data_format, specialisation(g)))
    args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
            *kernel_scalars(g))
    _runtime.launch_1d(fn, in_backprop.size, args)
    return in_backprop
