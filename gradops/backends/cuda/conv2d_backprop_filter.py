"""Launcher for cuda_src/conv2d_backprop_filter.cu: the filter gradient of a (grouped) conv2d.

Two paths.  ``direct``: any layout and size, one CTA per HWIO filter element reducing over
batch x output positions.  ``tiled``: implicit GEMM (tensor cores for float16/bfloat16, exact
SIMT FMA for float32 unless ``gradops.options(allow_tf32=True)``, SIMT for float64) on NHWC
tensors (NCHW is transposed to NHWC first), with the reduction split across CTAs when the
filter alone gives too few tiles; the partial sums go to a scratch buffer from CuPy's pool and a
second kernel adds them in a fixed order, so results are bitwise reproducible.  A 1x1 filter
at stride 1 without padding, with 16-byte loads, takes the tiled path's plain-GEMM kernel
(``_1x1_igemm``: no position decomposition, no bounds tests).
"""

from __future__ import annotations

import numpy as np

from ..._dtypes import accumulator_dtype
from . import _conv_igemm as ig
from . import _runtime

SOURCE = "conv2d_backprop_filter.cu"
#: ``kFilterDirectThreads`` in the kernel source (a power of two, for its tree reduction).
FILTER_DIRECT_THREADS = 128


def _direct_name(dtype, layout: str) -> str:
    return f"gradops::conv2d_backprop_filter_direct<{ig.template_types(dtype)}, {ig.LAYOUT[layout]}>"


def _tiled_name(dtype, kind: int, vector: bool) -> str:
    return f"gradops::conv2d_backprop_filter_igemm<{ig.template_types(dtype)}, {kind}, {ig.cpp_bool(vector)}>"


def _pointwise_name(dtype, kind: int) -> str:
    return f"gradops::conv2d_backprop_filter_1x1_igemm<{ig.template_types(dtype)}, {kind}, true>"


def _reduce_name(dtype) -> str:
    return f"gradops::split_reduce<{ig.template_types(dtype)}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """The name expressions compute capability ``arch`` can run (None: every one)."""
    pointwise = [_pointwise_name(dtype, kind) for dtype in ig.instantiation_dtypes()
                 for kind in ig.math_kinds(dtype, arch)]
    return {SOURCE: ig.kernel_names(_direct_name, _tiled_name, _reduce_name, arch=arch) + pointwise}


def _gemm_sizes(g) -> tuple[int, int, int]:
    """(M, N, reduction) of one group's GEMM: taps x in channels, out channels, batch x positions."""
    return (g.filter_rows * g.filter_cols * g.filter_in_depth, g.out_depth // g.groups,
            g.batch * g.out_rows * g.out_cols)


def tiled_eligible(g, dtype) -> bool:
    """Whether the tiled kernel can run this call (32-bit GEMM indices, grid limits)."""
    m, n, red = _gemm_sizes(g)
    bn = ig.TILES[(np.dtype(dtype), ig.math_kind(dtype))][1]
    return (ig.fits_int32(m, n, red, g.in_rows, g.in_cols, g.out_rows, g.out_cols, *ig.cursor_extents(g))
            and ig.ceil_div(n, bn) <= ig.GRID_YZ_LIMIT and g.groups <= ig.GRID_YZ_LIMIT)


def split_count(g, dtype, kind: int, splits: int | None = None) -> tuple[int, int]:
    """(splits, split_size): the reduction is cut into ``splits`` chunks of ``split_size``
    indices (a multiple of BK), by default enough to give about ig.SPLIT_TARGET_CTAS CTAs
    (:func:`._conv_igemm.split_reduction`); ``splits`` (tests) overrides the count."""
    bm, bn, bk, _ = ig.TILES[(np.dtype(dtype), kind)]
    m, n, red = _gemm_sizes(g)
    tiles = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * g.groups
    return ig.split_reduction(tiles, red, bk, ig.GRID_YZ_LIMIT // g.groups, splits)


def supports(op, geometry, dtype) -> tuple[bool, str]:
    if geometry.depthwise:
        return False, "depthwise filters are not handled by the conv2d_backprop_filter kernels"
    return ig.supported(dtype)


def conv2d_backprop_filter(geometry, input, out_backprop, *, path: str | None = None, splits: int | None = None,
                           vector: bool | None = None, pointwise: bool | None = None):
    """HWIO filter gradient [filter_rows, filter_cols, filter_in_depth, out_depth] of ``input``
    and ``out_backprop`` (both in ``geometry.data_format``), in their dtype.

    ``path`` ("direct" / "tiled"), ``splits``, ``vector`` and ``pointwise`` (tiled only: the
    split count, 16-byte or scalar loads, the 1x1 kernel where it can run or the general one)
    override the automatic choices; the tests use them to run every path on small shapes.
    """
    import cupy

    g = geometry
    dtype = np.dtype(input.dtype)
    if ig.is_empty(g.filter_shape, input.shape, out_backprop.shape):
        return cupy.zeros(g.filter_shape, dtype)
    path = ig.pick_path(path, tiled_eligible(g, dtype), *_gemm_sizes(g)[:2])

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
    bm, bn, _, threads = ig.TILES[(dtype, kind)]
    x = ig.to_nhwc(x, g.data_format)
    dy = ig.to_nhwc(dy, g.data_format)
    m, n, _ = _gemm_sizes(g)
    splits, split_size = split_count(g, dtype, kind, splits)
    # One float (double for float64) partial filter per split; unused (empty) without a split.
    partial = cupy.empty((splits, out.size) if splits > 1 else (0,), accumulator_dtype(dtype))
    grid = (ig.ceil_div(m, bm), ig.ceil_div(n, bn), g.groups * splits)
    vector = ig.use_vector_loads(g, dtype, (x, dy, out), vector)
    name = _pointwise_name(dtype, kind) if ig.pick_pointwise(g, vector, pointwise) else _tiled_name(dtype, kind, vector)
    fn = _runtime.kernel(SOURCE, name)
    fn(grid, (threads,), (x, dy, out, partial, *dims, np.int64(splits), np.int64(split_size)))
    if splits > 1:
        reduce = _runtime.kernel(SOURCE, _reduce_name(dtype))
        _runtime.launch_1d(reduce, out.size, (partial, out, np.int64(out.size), np.int64(splits)))
    return out
