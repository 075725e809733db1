"""Launcher for cuda_src/conv2d_backprop_input.cu: the input gradient of a (grouped) conv2d.

Two paths.  ``direct``: any layout and size, one thread per input element gathering the taps
that read it.  ``tiled``: implicit GEMM on NHWC tensors (NCHW is transposed to NHWC and back),
one GEMM per (group, stride phase) so that strided convolutions spend no work on the zeros of
a dilated out_backprop; tensor cores for float16/bfloat16, exact SIMT FMA for float32 unless
``gradops.options(allow_tf32=True)``, SIMT for float64.  A 1x1 filter at stride 1 without
padding, with 16-byte loads, takes the tiled path's plain-GEMM kernel (``_1x1_igemm``: no
position or tap decomposition).  Where the grid would under-fill the GPU, the tiled path splits
the reduction across CTAs into a float/double scratch shaped like the input gradient, which a
second kernel sums in split order.  Both paths write every element in a fixed order: results
are bitwise reproducible.
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import accumulator_dtype
from . import _conv_igemm as ig
from . import _runtime

SOURCE = "conv2d_backprop_input.cu"


def _direct_name(dtype, layout: str) -> str:
    return f"gradops::conv2d_backprop_input_direct<{ig.template_types(dtype)}, {ig.LAYOUT[layout]}>"


def _tiled_name(dtype, kind: int, vector: bool, split: bool = False) -> str:
    return (f"gradops::conv2d_backprop_input_igemm<{ig.template_types(dtype)}, {kind}, {ig.cpp_bool(vector)}, "
            f"{ig.cpp_bool(split)}>")


def _few_channels_name(dtype, channels: int) -> str:
    return f"gradops::conv2d_backprop_input_few_channels<{ig.template_types(dtype)}, {channels}>"


#: The few-channel kernel's input channel counts (its CIN template argument).
FEW_CHANNELS = (1, 2, 3, 4)
#: ``kFewChannelThreads`` and ``kFewChannelFilterBytes`` in the kernel source: the filter is
#: staged in shared memory in the accumulator type.
FEW_CHANNEL_THREADS = 256
FEW_CHANNEL_FILTER_BYTES = 40 * 1024


def few_channels_eligible(g, dtype, arrays=()) -> bool:
    """Whether the direct path can run the few-channel kernel: one group of at most 4 input
    channels, out channels in whole 16-byte chunks, the filter within the kernel's shared
    memory (as accumulator values), 16-byte aligned arrays, the grid's y and z (input rows,
    batch) within CUDA's limits, and 32-bit offsets inside an out_backprop image, the filter
    and a padded row or column."""
    chunk = _runtime.vector_width(dtype)
    staged = ig.prod(g.filter_shape) * np.dtype(accumulator_dtype(dtype)).itemsize
    return (g.groups == 1 and g.in_depth in FEW_CHANNELS and g.out_depth % chunk == 0
            and staged <= FEW_CHANNEL_FILTER_BYTES
            and _runtime.vector_aligned(*arrays)
            and g.in_rows <= ig.GRID_YZ_LIMIT and g.batch <= ig.GRID_YZ_LIMIT
            and ig.fits_int32(g.out_rows * g.out_cols * g.out_depth, ig.prod(g.filter_shape),
                              g.in_cols * g.stride_cols, *ig.cursor_extents(g)))


def _reduce_name(dtype) -> str:
    return f"gradops::split_reduce<{ig.template_types(dtype)}>"


def _pointwise_name(dtype, kind: int, split: bool = False) -> str:
    return f"gradops::conv2d_backprop_input_1x1_igemm<{ig.template_types(dtype)}, {kind}, true, {ig.cpp_bool(split)}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """The name expressions compute capability ``arch`` can run (None: every one)."""
    pointwise = [_pointwise_name(dtype, kind, split) for dtype in ig.instantiation_dtypes()
                 for kind in ig.math_kinds(dtype, arch) for split in (False, True)]
    few = [_few_channels_name(dtype, c) for dtype in ig.instantiation_dtypes() for c in FEW_CHANNELS]
    split = [_tiled_name(dtype, kind, vector, split=True) for dtype in ig.instantiation_dtypes()
             for kind in ig.math_kinds(dtype, arch) for vector in (False, True)]
    return {SOURCE: ig.kernel_names(_direct_name, _tiled_name, _reduce_name, arch=arch) + split + pointwise + few}


def _gemm_sizes(g) -> tuple[int, int, int]:
    """(M, N, reduction) of the largest phase's GEMM (phase 0 has the most positions and at most
    ceil(R / ...) taps; the reduction bound uses all taps)."""
    phase_rows = ig.ceil_div(g.in_rows, g.stride_rows)
    phase_cols = ig.ceil_div(g.in_cols, g.stride_cols)
    return (g.batch * phase_rows * phase_cols, g.filter_in_depth,
            g.filter_rows * g.filter_cols * (g.out_depth // g.groups))


def tiled_eligible(g, dtype) -> bool:
    """Whether the tiled kernel can run this call (32-bit GEMM indices, grid limits)."""
    m, n, red = _gemm_sizes(g)
    bn = ig.TILES[(np.dtype(dtype), ig.math_kind(dtype))][1]
    return (ig.fits_int32(m, n, red, g.in_rows, g.in_cols, g.out_rows, g.out_cols, *ig.cursor_extents(g))
            and ig.ceil_div(n, bn) <= ig.GRID_YZ_LIMIT
            and g.groups * g.stride_rows * g.stride_cols <= ig.GRID_YZ_LIMIT)


def split_count(g, dtype, kind: int, splits: int | None = None) -> tuple[int, int]:
    """(splits, split_size) of the tiled path's reduction (:func:`._conv_igemm.split_reduction`
    over the grid of every phase; the reduction's bound is the one of all taps, so a phase with
    fewer taps leaves its last splits empty: they write zeros).  ``splits`` (tests) overrides."""
    bm, bn, bk, _ = ig.TILES[(np.dtype(dtype), kind)]
    m, n, red = _gemm_sizes(g)
    groups_phases = g.groups * g.stride_rows * g.stride_cols
    ctas = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * groups_phases
    return ig.split_reduction(ctas, red, bk, ig.GRID_YZ_LIMIT // groups_phases, splits)


def supports(op, geometry, dtype) -> tuple[bool, str]:
    if geometry.depthwise:
        return False, "depthwise filters are not handled by the conv2d_backprop_input kernels"
    return ig.supported(dtype)


def conv2d_backprop_input(geometry, filter, out_backprop, *, path: str | None = None,
                          vector: bool | None = None, pointwise: bool | None = None,
                          few_channels: bool | None = None, splits: int | None = None):
    """Input gradient (shape ``geometry.input_shape``, in ``geometry.data_format``) from the HWIO
    ``filter`` and ``out_backprop``, in their dtype.  ``path`` ("direct" / "tiled"), ``vector``
    (tiled only: 16-byte or scalar loads), ``pointwise`` (tiled only: the 1x1 kernel where
    :func:`._conv_igemm.pointwise_eligible` and 16-byte loads allow it, else the general one)
    ``few_channels`` (direct only: the few-channel kernel where :func:`few_channels_eligible`,
    else the general one) and ``splits`` (tiled only: the split count) override the automatic
    choices; the tests use them to run every path on small shapes."""
    import cupy

    g = geometry
    dtype = np.dtype(out_backprop.dtype)
    if ig.is_empty(g.input_shape, filter.shape, out_backprop.shape):
        return cupy.zeros(g.input_shape, dtype)
    path = ig.pick_path(path, tiled_eligible(g, dtype), *_gemm_sizes(g)[:2])

    w = _runtime.contiguous(filter)
    dy = _runtime.contiguous(out_backprop)
    dims = ig.dims_args(g)

    if path == "direct" and few_channels is not False and few_channels_eligible(g, dtype, (w, dy)):
        dy = ig.to_nhwc(dy, g.data_format)
        out = cupy.empty((g.batch, g.in_rows, g.in_cols, g.in_depth), dtype)  # NHWC; every element written
        fn = _runtime.kernel(SOURCE, _few_channels_name(dtype, g.in_depth))
        columns = g.stride_cols * ig.ceil_div(g.in_cols, g.stride_cols)  # the kernel's column slots
        fn((ig.ceil_div(columns, FEW_CHANNEL_THREADS), g.in_rows, g.batch), (FEW_CHANNEL_THREADS,), (w, dy, out, *dims))
        return ig.from_nhwc(out, g.data_format)
    if few_channels:
        raise ValueError("the few-channel kernel needs one group of at most 4 input channels, out channels in "
                         "16-byte chunks, aligned arrays and sizes its grid and 32-bit offsets can hold")
    if path == "direct":
        out = cupy.empty(g.input_shape, dtype)
        fn = _runtime.kernel(SOURCE, _direct_name(dtype, g.data_format))
        _runtime.launch_1d(fn, out.size, (w, dy, out, *dims))
        return out

    kind = ig.math_kind(dtype)
    bm, bn, _, threads = ig.TILES[(dtype, kind)]
    dy = ig.to_nhwc(dy, g.data_format)
    out = cupy.empty((g.batch, g.in_rows, g.in_cols, g.in_depth), dtype)  # NHWC; every element written
    m, n, _ = _gemm_sizes(g)
    splits, split_size = split_count(g, dtype, kind, splits)
    # One float (double for float64) partial input gradient per split; unused (empty) without a split.
    partial = cupy.empty((splits, out.size) if splits > 1 else (0,), accumulator_dtype(dtype))
    grid = (ig.ceil_div(m, bm), ig.ceil_div(n, bn), g.groups * g.stride_rows * g.stride_cols * splits)
    vector = ig.use_vector_loads(g, dtype, (w, dy, out), vector)
    split = splits > 1
    name = (_pointwise_name(dtype, kind, split) if ig.pick_pointwise(g, vector, pointwise)
            else _tiled_name(dtype, kind, vector, split))
    fn = _runtime.kernel(SOURCE, name)
    fn(grid, (threads,), (w, dy, out, partial, *dims, np.int64(splits), np.int64(split_size)))
    if splits > 1:
        reduce = _runtime.kernel(SOURCE, _reduce_name(dtype))
        _runtime.launch_1d(reduce, out.size, (partial, out, np.int64(out.size), np.int64(splits)))
    return ig.from_nhwc(out, g.data_format)
