"""Launcher for cuda_src/conv2d_backprop_filter.cu: the filter gradient of a (grouped) conv2d.

Two paths.  ``direct``: any layout and size, one CTA per HWIO filter element reducing over
batch x output positions.  ``tiled``: implicit GEMM (tensor cores for float16/bfloat16, exact
SIMT FMA for float32 unless ``gradops.options(allow_tf32=True)``, SIMT for float64) on NHWC
tensors (NCHW is transposed to NHWC first), with the reduction split across CTAs when the
filter alone gives too few tiles; the partial sums go to a scratch buffer from CuPy's pool and a
second kernel adds them in a fixed order, so results are bitwise reproducible.  A 1x1 filter
at stride 1 without padding, with 16-byte loads, takes the tiled path's plain-GEMM kernel
(``_1x1_igemm``: no position decomposition, no bounds tests).  A filter of one to four input
channels (a network's stem: an image's 3), one group, float16 / bfloat16 on sm_80 and newer,
takes ``_few_channels``: 64 out channels x 64 taps per CTA with a per-CTA tap table.
The launcher takes the tiled path where it can run and a group's GEMM is at least
``TILED_MIN_DIM`` wide both ways, or, on the tensor cores, has :data:`TILED_MIN_GROUP_ELEMENTS`
elements (:func:`pick_path`: grouped convolutions of a few channels a group).
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import accumulator_dtype, bfloat16
from . import _build, _runtime
from . import _conv_igemm as ig

SOURCE = "conv2d_backprop_filter.cu"
#: ``kFilterDirectThreads`` in the kernel source (a power of two, for its tree reduction).
FILTER_DIRECT_THREADS = 128

#: ``kFewFilterOut``, ``kFewFilterTaps``, ``kFewFilterBK``, ``kFewFilterThreads``: the few-channel
#: kernel's out channels and taps per CTA, positions per k-tile, threads per CTA.
FEW_OUT, FEW_TAPS, FEW_BK, FEW_THREADS = 64, 64, 32, 128
#: The few-channel kernel's input channel counts (its CIN template argument).
FEW_CHANNELS = (1, 2, 3, 4)
#: The few-channel kernel's split reduction aims at this many CTAs (a constant, for bitwise
#: reproducibility across GPUs): its CTAs are a quarter of the general kernel's tile and a stem
#: has 3 of them before the split, so twice the general target keeps every SM of a large GPU
#: busy with several CTAs.
FEW_TARGET_CTAS = 2 * ig.SPLIT_TARGET_CTAS
#: Its 32-bit coordinates must stay below this: a missing tap's row shift is -2**30
#: (``kFewFilterNoTap``), which must make every padded row negative without overflowing.
FEW_COORD_LIMIT = 2**30
#: dtypes the few-channel kernel takes (mma.sync on half types).
FEW_DTYPES = (np.dtype(np.float16), bfloat16)


def _direct_name(dtype, layout: str) -> str:
    return f"gradops::conv2d_backprop_filter_direct<{ig.template_types(dtype)}, {ig.LAYOUT[layout]}>"


def _tiled_name(dtype, kind: int, vector: bool, split: bool = False, tile_args: str = "") -> str:
    return (f"gradops::conv2d_backprop_filter_igemm<{ig.template_types(dtype)}, {kind}, {ig.cpp_bool(vector)}, "
            f"{ig.cpp_bool(split)}{tile_args}>")


def _pointwise_name(dtype, kind: int, split: bool = False, tile_args: str = "") -> str:
    return (f"gradops::conv2d_backprop_filter_1x1_igemm<{ig.template_types(dtype)}, {kind}, true, "
            f"{ig.cpp_bool(split)}{tile_args}>")


def _reduce_name(dtype) -> str:
    return f"gradops::split_reduce<{ig.template_types(dtype)}>"


def _few_channels_name(dtype, channels: int) -> str:
    return f"gradops::conv2d_backprop_filter_few_channels<{_build.c_types(dtype)[0]}, {channels}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """The name expressions compute capability ``arch`` can run (None: every one)."""
    pointwise = [_pointwise_name(dtype, kind, split) for dtype in ig.instantiation_dtypes()
                 for kind in ig.math_kinds(dtype, arch) for split in (False, True)]
    few = [_few_channels_name(dtype, c) for dtype in FEW_DTYPES for c in FEW_CHANNELS
           if arch is None or arch >= ig.MMA_SYNC_ARCH]
    split = [_tiled_name(dtype, kind, vector, split=True) for dtype in ig.instantiation_dtypes()
             for kind in ig.math_kinds(dtype, arch) for vector in (False, True)]
    narrow = ig.tile_variant_names(lambda dtype, kind, split, args: _tiled_name(dtype, kind, True, split, args),
                                   _pointwise_name, arch=arch)
    return {SOURCE: ig.kernel_names(_direct_name, _tiled_name, _reduce_name, arch=arch) + split + pointwise + few
            + narrow}


def _gemm_sizes(g) -> tuple[int, int, int]:
    """(M, N, reduction) of one group's GEMM: taps x in channels, out channels, batch x positions."""
    return (g.filter_rows * g.filter_cols * g.filter_in_depth, g.out_depth // g.groups,
            g.batch * g.out_rows * g.out_cols)


#: Where a group's GEMM is narrower than ``_conv_igemm.TILED_MIN_DIM`` (a grouped convolution of
#: a few channels a group, such as ResNeXt 32x4d's 4), the launcher still takes the tiled kernel
#: on the tensor cores once a group's filter elements (taps x in channels x out channels, M x N)
#: reach this.  The direct kernel's CTA of 128 threads owns one filter element and spends about
#: 200 SASS instructions a thread per position (sm_90, NVRTC 13.5: its reduction loop, unrolled
#: twice, takes 400 for two positions on its cheapest path): 6.25 warp-instructions per position
#: and element.  The tensor-core kernel with scalar loads (channels not a multiple of 8) spends
#: 352 a thread per 32-position k-tile in its 8 warps (static report, main loop): 88 per
#: position for a whole tile of up to 128 x 128 elements.  The two meet at 14 elements a group;
#: 64 leaves a margin of 4.5x for what those counts leave out (the tiled kernel's prologue,
#: epilogue and split reduction).  SIMT math (float32, float64, half types before sm_70) keeps
#: TILED_MIN_DIM: there the tiled kernel's 1,273-1,494 instructions per 16-position k-tile meet
#: the direct kernel near 100 elements a group.  Predicted from instruction counts, not measured.
TILED_MIN_GROUP_ELEMENTS = 64


def pick_path(g, dtype, path: str | None = None, arch: int | None = None) -> str:
    """The caller's ``path`` if valid (``_conv_igemm.pick_path``), else: the tiled kernel where it
    can run and the group's GEMM is at least ``TILED_MIN_DIM`` wide both ways, or, on the tensor
    cores (compute capability ``arch``; None: the current device's), has at least
    :data:`TILED_MIN_GROUP_ELEMENTS` elements; the direct kernel otherwise."""
    m, n, _ = _gemm_sizes(g)
    eligible = tiled_eligible(g, dtype)
    if (path is None and eligible and m * n >= TILED_MIN_GROUP_ELEMENTS
            and ig.math_kind(dtype, arch) == ig.WMMA_HALF):
        return "tiled"
    return ig.pick_path(path, eligible, m, n)


def tiled_eligible(g, dtype) -> bool:
    """Whether the tiled kernel can run this call (32-bit GEMM indices, grid limits)."""
    m, n, red = _gemm_sizes(g)
    bn = ig.TILES[(np.dtype(dtype), ig.math_kind(dtype))][1]
    return (ig.fits_int32(m, n, red, g.in_rows, g.in_cols, g.out_rows, g.out_cols, *ig.cursor_extents(g))
            and ig.ceil_div(n, bn) <= ig.GRID_YZ_LIMIT and g.groups <= ig.GRID_YZ_LIMIT)


def split_count(g, dtype, kind: int, splits: int | None = None, tile=None) -> tuple[int, int]:
    """(splits, split_size): the reduction is cut into ``splits`` chunks of ``split_size``
    indices (a multiple of BK), by default enough to give about ig.SPLIT_TARGET_CTAS CTAs of 256 threads
    (:func:`._conv_igemm.split_reduction`); ``splits`` (tests) overrides the count; ``tile``:
    the :class:`._conv_igemm.Tile` launched (default: the kind's default)."""
    bm, bn, bk, threads = (tile or ig.default_tile(dtype, kind))[:4]
    m, n, red = _gemm_sizes(g)
    tiles = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * g.groups
    return ig.split_reduction(tiles, red, bk, ig.GRID_YZ_LIMIT // g.groups, splits,
                              **ig.split_targets(threads))


def few_channels_kernel(dtype, arch: int | None = None) -> bool:
    """Whether compute capability ``arch`` (None: the current device's) has the few-channel
    kernel for ``dtype``: float16 / bfloat16 on tensor cores with mma.sync."""
    if arch is None:
        arch = _runtime.compute_capability()
    return (np.dtype(dtype) in FEW_DTYPES and ig.math_kind(dtype, arch) == ig.WMMA_HALF
            and arch >= ig.MMA_SYNC_ARCH)


def few_channels_eligible(g, dtype, arrays=()) -> bool:
    """Whether the few-channel kernel can run this call: one group, FEW_CHANNELS input
    channels, out_depth a multiple of 8 (16-byte rows of out_backprop) with ``arrays`` (the
    out_backprop it reads) 16-byte aligned, float16 / bfloat16 on tensor cores with mma.sync (sm_80+), and its 32-bit
    positions, coordinates and offsets below FEW_COORD_LIMIT."""
    if not few_channels_kernel(dtype) or g.groups != 1 or g.filter_in_depth not in FEW_CHANNELS:
        return False
    red = g.batch * g.out_rows * g.out_cols
    rows, cols = ig.cursor_extents(g)[:2]
    # A window origin (h0 * in_cols + w0) * CIN and a tap's offset are 32-bit: both lie within
    # the padded, dilated extent of rows x columns x channels.
    window = rows * cols * g.filter_in_depth
    return (g.out_depth % _runtime.vector_width(dtype) == 0 and _runtime.vector_aligned(*arrays)
            and all(0 <= v < FEW_COORD_LIMIT for v in (red + FEW_BK, window, *ig.cursor_extents(g)))
            and ig.ceil_div(g.out_depth, FEW_OUT) <= ig.GRID_YZ_LIMIT)


def pick_few_channels(g, dtype, out_backprop, few_channels: bool | None) -> bool:
    """Whether the tiled path runs the few-channel kernel: wherever it can, unless
    ``few_channels`` (tests) is False; True raises where it cannot."""
    can = few_channels_eligible(g, dtype, (out_backprop,))
    if few_channels and not can:
        raise ValueError("the few-channel kernel needs one group, 1 to 4 input channels, out_depth a multiple of 8, "
                         "16-byte aligned out_backprop and float16 / bfloat16 on sm_80 or newer")
    return can and few_channels is not False


def few_channels_split_count(g, splits: int | None = None) -> tuple[int, int]:
    """(splits, split_size) of the few-channel kernel's reduction over batch x positions."""
    taps, _, red = _gemm_sizes(g)
    ctas = ig.ceil_div(taps, FEW_TAPS) * ig.ceil_div(g.out_depth, FEW_OUT)
    return ig.split_reduction(ctas, red, FEW_BK, ig.GRID_YZ_LIMIT, splits, target_ctas=FEW_TARGET_CTAS)


def supports(op, geometry, dtype) -> tuple[bool, str]:
    if geometry.depthwise:
        return False, "depthwise filters are not handled by the conv2d_backprop_filter kernels"
    return ig.supported(dtype)


def conv2d_backprop_filter(geometry, input, out_backprop, *, path: str | None = None, splits: int | None = None,
                           vector: bool | None = None, pointwise: bool | None = None,
                           few_channels: bool | None = None, tile: tuple[int, int] | None = None):
    """HWIO filter gradient [filter_rows, filter_cols, filter_in_depth, out_depth] of ``input``
    and ``out_backprop`` (both in ``geometry.data_format``), in their dtype.

    ``path`` ("direct" / "tiled"), ``splits``, ``vector``, ``pointwise``, ``few_channels`` and
    ``tile`` (tiled only: the split count, 16-byte or scalar loads, the 1x1 kernel or the
    few-channel kernel where they can run, or the general one, the (BM, BN) tile shape of
    :func:`._conv_igemm.pick_tile`) override the automatic choices; the tests use them to run
    every path on small shapes.
    """
    import cupy

    g = geometry
    dtype = np.dtype(input.dtype)
    if ig.is_empty(g.filter_shape, input.shape, out_backprop.shape):
        return cupy.zeros(g.filter_shape, dtype)
    path = pick_path(g, dtype, path)

    x = _runtime.contiguous(input)
    dy = _runtime.contiguous(out_backprop)
    out = cupy.empty(g.filter_shape, dtype)
    dims = ig.dims_args(g)

    if path == "direct":
        fn = _runtime.kernel(SOURCE, _direct_name(dtype, g.data_format))
        blocks = min(out.size, _runtime.sm_count() * _runtime.BLOCKS_PER_SM)
        fn((blocks,), (FILTER_DIRECT_THREADS,), (x, dy, out, *dims))
        return out

    kind = ig.math_kind(dtype)
    x = ig.to_nhwc(x, g.data_format)
    dy = ig.to_nhwc(dy, g.data_format)
    m, n, _ = _gemm_sizes(g)
    if pick_few_channels(g, dtype, dy, few_channels):
        return _few_channels(g, x, dy, out, dims, splits)
    vector = ig.use_vector_loads(g, dtype, (x, dy, out), vector)
    shape = ig.scalar_table_tile(ig.pick_tile(dtype, kind, vector, m, n, tile=tile), dtype, kind, vector)
    splits, split_size = split_count(g, dtype, kind, splits, shape)
    # One float (double for float64) partial filter per split; unused (empty) without a split.
    partial = cupy.empty((splits, out.size) if splits > 1 else (0,), accumulator_dtype(dtype))
    grid = (ig.ceil_div(m, shape.bm), ig.ceil_div(n, shape.bn), g.groups * splits)
    args, split = (x, dy, out, partial, *dims, np.int64(splits), np.int64(split_size)), splits > 1
    # grid z = group x splits + split, which the SIMT kernels divide with these constants.
    split_div = _runtime.division_magic(splits)
    if ig.pick_pointwise(g, vector, pointwise):
        fn = _runtime.kernel(SOURCE, _pointwise_name(dtype, kind, split, shape.args))
        fn(grid, (shape.threads,), (*args, *split_div))
    else:
        fn = _runtime.kernel(SOURCE, _tiled_name(dtype, kind, vector, split, shape.args))
        fn(grid, (shape.threads,), (*args, *ig.input_div_args(g), *split_div))
    _reduce_splits(out, partial, splits)
    return out


def _few_channels(g, x, dy, out, dims, splits: int | None):
    """The few-channel kernel on NHWC ``x`` and ``dy`` into HWIO ``out``."""
    import cupy

    splits, split_size = few_channels_split_count(g, splits)
    partial = cupy.empty((splits, out.size) if splits > 1 else (0,), np.float32)
    grid = (ig.ceil_div(g.filter_rows * g.filter_cols * g.filter_in_depth, FEW_TAPS),
            ig.ceil_div(g.out_depth, FEW_OUT), splits)
    fn = _runtime.kernel(SOURCE, _few_channels_name(out.dtype, g.filter_in_depth))
    fn(grid, (FEW_THREADS,), (x, dy, out, partial, *dims, np.int64(splits), np.int64(split_size)))
    _reduce_splits(out, partial, splits)
    return out


def _reduce_splits(out, partial, splits: int) -> None:
    """Sum ``splits`` partial filters (float, double for float64) into ``out`` in split order."""
    if splits > 1:
        reduce = _runtime.kernel(SOURCE, _reduce_name(out.dtype))
        _runtime.launch_1d(reduce, out.size, (partial, out, np.int64(out.size), np.int64(splits)))
