"""Launcher for cuda_src/depthwise_conv2d_native_backprop_filter.cu.

Two launches (see the .cu file): partial sums of fixed slices of batch x output rows per
(tap, out_backprop channel) into a float (double for float64) scratch buffer, then a fixed-
order sum of the slices, rounded once to the element type.  No atomics: the slicing depends
on the geometry only, never on the GPU, so results are bitwise reproducible everywhere.
Index math is 32-bit where every index and offset fits (:func:`fits_int32`), else 64-bit.
Either layout runs in place (no transpose).  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import accumulator_dtype
from ..._geometry import Conv2DGeometry
from . import _build, _runtime

SOURCE = "depthwise_conv2d_native_backprop_filter.cu"
PARTIAL_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_partial"
REDUCE_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_reduce"

#: Template value of each data_format (``gradops::Layout`` in gradops_common.cuh).
LAYOUTS = {"NHWC": 0, "NCHW": 1}
#: C++ index type of the partial kernel, per width.
INDEX_TYPES = {32: "int", 64: "long long"}
#: The slicing aims at about this many partial sums (threads of the first kernel): enough to
#: fill a large GPU several times over.  A constant, not a multiple of the SM count, so that
#: the summation order (hence every bit of the result) is the same on every GPU.
TARGET_PARTIALS = 1 << 17
INT32_MAX = 2**31 - 1
#: k per channel group of the partial kernel (``kGroup``): a warp's lanes.
GROUP = 32


def _partial_expression(dtype, data_format: str, index_bits: int) -> str:
    element, accumulator = _build.c_types(dtype)
    return f"{PARTIAL_KERNEL}<{element}, {accumulator}, {LAYOUTS[data_format]}, {INDEX_TYPES[index_bits]}>"


def _reduce_expression(dtype) -> str:
    element, accumulator = _build.c_types(dtype)
    return f"{REDUCE_KERNEL}<{element}, {accumulator}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture)."""
    names = []
    for dtype in _build.C_TYPES:
        for data_format in LAYOUTS:
            names += [_partial_expression(dtype, data_format, bits) for bits in INDEX_TYPES]
        names.append(_reduce_expression(dtype))
    return {SOURCE: names}


def slicing(g: Conv2DGeometry, target: int = TARGET_PARTIALS) -> tuple[int, int]:
    """(slices, rows_per_slice): batch x out_rows cut into runs so that slices x taps x
    out_depth is about ``target`` (at least one slice, at most one row each)."""
    rows = g.batch * g.out_rows
    per_slice = g.filter_rows * g.filter_cols * g.out_depth
    slices = max(1, min(rows, target // max(1, per_slice)))
    rows_per_slice = -(-rows // slices)
    return -(-rows // rows_per_slice), rows_per_slice  # no empty trailing slice


def partial_threads(g: Conv2DGeometry, slices: int) -> int:
    """Threads of the partial kernel's grid-stride loop: one per (slice, channel group, tap,
    lane), the last channel group padded to :data:`GROUP` lanes."""
    return slices * -(-g.out_depth // GROUP) * g.filter_rows * g.filter_cols * GROUP


def fits_int32(g: Conv2DGeometry, slices: int, threads: int) -> bool:
    """Whether the partial kernel's 32-bit variant is exact: every tensor, its thread index
    (plus one grid stride, ``threads``), every padded coordinate and the (batch, out_row)
    run bounds below 2**31."""
    sizes = (g.batch * g.in_rows * g.in_cols * g.in_depth, g.batch * g.out_rows * g.out_cols * g.out_depth,
             partial_threads(g, slices) + threads,
             g.out_rows * g.stride_rows + (g.filter_rows - 1) * g.dilation_rows + g.pad_top + g.in_rows,
             g.out_cols * g.stride_cols + (g.filter_cols - 1) * g.dilation_cols + g.pad_left + g.in_cols,
             2 * g.batch * g.out_rows)  # a slice's end before clamping: up to twice the rows
    return max(sizes) <= INT32_MAX


def kernel_scalars(g: Conv2DGeometry, slices: int, rows_per_slice: int) -> tuple[np.int64, ...]:
    """The partial kernel's ``long long`` parameters, in order, after its three pointers."""
    return tuple(_runtime.i64(v) for v in (
        g.batch, g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
        g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols, g.dilation_rows, g.dilation_cols,
        g.pad_top, g.pad_left, slices, rows_per_slice))


def depthwise_conv2d_native_backprop_filter(g: Conv2DGeometry, input, out_backprop, *, slices: int | None = None,
                                            index_bits: int | None = None):
    """Filter gradient [filter_rows, filter_cols, in_depth, depth_multiplier] in the input's dtype.

    input: [N, in_rows, in_cols, in_depth], out_backprop: [N, out_rows, out_cols, in_depth *
    depth_multiplier], both in ``g.data_format``, CuPy arrays on the current device, any strides.
    Launches on the current stream without synchronising.  ``slices`` (a target slice count)
    and ``index_bits`` (32 / 64) override the automatic choices; the tests use them.
    """
    import cupy

    dtype = np.dtype(input.dtype)
    if 0 in g.filter_shape:
        return cupy.empty(g.filter_shape, dtype)
    if 0 in (g.batch, g.out_rows, g.out_cols):  # nothing to sum
        return cupy.zeros(g.filter_shape, dtype)
    if slices is None:
        slices, rows_per_slice = slicing(g)
    else:
        slices, rows_per_slice = slicing(g, target=max(1, slices) * g.filter_rows * g.filter_cols * g.out_depth)
    elements = g.filter_rows * g.filter_cols * g.out_depth
    total = slices * elements
    work = partial_threads(g, slices)
    threads = min(-(-work // _runtime.BLOCK_1D), _runtime.sm_count() * _runtime.BLOCKS_PER_SM) * _runtime.BLOCK_1D
    narrow = fits_int32(g, slices, threads)
    if index_bits is None:
        index_bits = 32 if narrow else 64
    elif index_bits == 32 and not narrow:
        raise ValueError("32-bit indices cannot address this geometry")
    x = _runtime.contiguous(input)
    dy = _runtime.contiguous(out_backprop)
    partial = cupy.empty((total,), accumulator_dtype(dtype))
    grad = cupy.empty(g.filter_shape, dtype)
    fn = _runtime.kernel(SOURCE, _partial_expression(dtype, g.data_format, index_bits))
    _runtime.launch_1d(fn, work, (_runtime.pointer(x), _runtime.pointer(dy), _runtime.pointer(partial),
                                   *kernel_scalars(g, slices, rows_per_slice)))
    reduce = _runtime.kernel(SOURCE, _reduce_expression(dtype))
    _runtime.launch_1d(reduce, elements, (_runtime.pointer(partial), _runtime.pointer(grad),
                                          _runtime.i64(elements), _runtime.i64(slices)))
    return grad
