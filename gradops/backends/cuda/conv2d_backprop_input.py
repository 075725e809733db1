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

import math

import numpy as np

from ..._dtypes import accumulator_dtype
from . import _conv_igemm as ig
from . import _runtime

SOURCE = "conv2d_backprop_input.cu"


def _direct_name(dtype, layout: str) -> str:
    return f"gradops::conv2d_backprop_input_direct<{ig.template_types(dtype)}, {ig.LAYOUT[layout]}>"


def _tiled_name(dtype, kind: int, vector: bool, split: bool = False, tile_args: str = "") -> str:
    return (f"gradops::conv2d_backprop_input_igemm<{ig.template_types(dtype)}, {kind}, {ig.cpp_bool(vector)}, "
            f"{ig.cpp_bool(split)}{tile_args}>")


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


def _pointwise_name(dtype, kind: int, split: bool = False, tile_args: str = "") -> str:
    return (f"gradops::conv2d_backprop_input_1x1_igemm<{ig.template_types(dtype)}, {kind}, true, "
            f"{ig.cpp_bool(split)}{tile_args}>")


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """The name expressions compute capability ``arch`` can run (None: every one)."""
    pointwise = [_pointwise_name(dtype, kind, split) for dtype in ig.instantiation_dtypes()
                 for kind in ig.math_kinds(dtype, arch) for split in (False, True)]
    few = [_few_channels_name(dtype, c) for dtype in ig.instantiation_dtypes() for c in FEW_CHANNELS]
    split = [_tiled_name(dtype, kind, vector, split=True) for dtype in ig.instantiation_dtypes()
             for kind in ig.math_kinds(dtype, arch) for vector in (False, True)]
    narrow = ig.tile_variant_names(lambda dtype, kind, split, args: _tiled_name(dtype, kind, True, split, args),
                                   _pointwise_name, arch=arch)
    return {SOURCE: ig.kernel_names(_direct_name, _tiled_name, _reduce_name, arch=arch) + split + pointwise + few
            + narrow}


def _gemm_sizes(g) -> tuple[int, int, int]:
    """(M, N, reduction) of the largest phase's GEMM (phase 0 has the most positions and at most
    ceil(R / ...) taps; the reduction bound uses all taps)."""
    phase_rows = ig.ceil_div(g.in_rows, g.stride_rows)
    phase_cols = ig.ceil_div(g.in_cols, g.stride_cols)
    return (g.batch * phase_rows * phase_cols, g.filter_in_depth,
            g.filter_rows * g.filter_cols * (g.out_depth // g.groups))


def pick_path(g, dtype, path: str | None = None) -> str:
    """The caller's ``path`` if valid, else tiled where it can run and the GEMM is at least
    ``TILED_MIN_DIM`` wide both ways, else direct (``_conv_igemm.pick_path``)."""
    return ig.pick_path(path, tiled_eligible(g, dtype), *_gemm_sizes(g)[:2])


def tiled_eligible(g, dtype) -> bool:
    """Whether the tiled kernel can run this call (32-bit GEMM indices, grid limits).  The
    scalar path's k table also holds offsets of out_backprop between an element and a row
    cursor's origin, each within the padded extents' rows and columns of an image."""
    m, n, red = _gemm_sizes(g)
    bn = ig.TILES[(np.dtype(dtype), ig.math_kind(dtype))][1]
    rows, cols = ig.cursor_extents(g)[:2]
    return (ig.fits_int32(m, n, red, g.in_rows, g.in_cols, g.out_rows, g.out_cols, *ig.cursor_extents(g),
                          (rows * g.out_cols + cols) * g.out_depth)
            and ig.ceil_div(n, bn) <= ig.GRID_YZ_LIMIT
            and g.groups * g.stride_rows * g.stride_cols <= ig.GRID_YZ_LIMIT)


def split_count(g, dtype, kind: int, splits: int | None = None, tile=None) -> tuple[int, int]:
    """(splits, split_size) of the tiled path's reduction (:func:`._conv_igemm.split_reduction`
    over the grid of every phase; the reduction's bound is the one of all taps, so a phase with
    fewer taps leaves its last splits empty: they write zeros).  ``splits`` (tests) overrides;
    ``tile``: the :class:`._conv_igemm.Tile` launched (default: the kind's default)."""
    bm, bn, bk, threads = (tile or ig.default_tile(dtype, kind))[:4]
    m, n, red = _gemm_sizes(g)
    groups_phases = g.groups * g.stride_rows * g.stride_cols
    ctas = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * groups_phases
    return ig.split_reduction(ctas, red, bk, ig.GRID_YZ_LIMIT // groups_phases, splits,
                              **ig.split_targets(threads))


#: The general tiled kernel's plan (cuda_src/conv2d_backprop_input.cu, namespace phase_plan):
#: word indices of the header and of each phase's entry (a FastDiv takes three words: magic,
#: shift, divisor), and their sizes, each a whole number of int4s.
PLAN_HEADER = {"SPLITS": 0, "PHASES": 3, "OUT_PER_GROUP": 6, "HEADER_WORDS": 12}
PLAN_ENTRY = {"M_SIZE": 0, "REDUCTION": 1, "PHASE_ROW": 2, "PHASE_COL": 3, "P_OFFSET": 4, "Q_OFFSET": 5,
              "P_STEP": 6, "Q_STEP": 7, "TAPS_R_FIRST": 8, "TAPS_R_STEP": 9, "TAPS_S_FIRST": 10,
              "TAPS_S_STEP": 11, "DIV_J": 12, "DIV_I": 15, "DIV_TAPS_S": 18, "ENTRY_WORDS": 24}
_FAST_DIV_FIELDS = {"SPLITS", "PHASES", "OUT_PER_GROUP", "DIV_J", "DIV_I", "DIV_TAPS_S"}


def _record(layout: dict, size: str, **fields) -> list[int]:
    """One plan record: each field at its word index, a FastDiv field (a divisor) as its
    three words."""
    words = [0] * layout[size]
    for name, value in fields.items():
        at = layout[name.upper()]
        if name.upper() in _FAST_DIV_FIELDS:
            magic, shift = _runtime.division_magic(value)
            words[at:at + 3] = [int(np.uint32(magic).view(np.int32)), int(shift), value]
        else:
            words[at] = value
    return words


def phase_taps(phase: int, pad: int, stride: int, dilation: int, filter_size: int) -> tuple[int, int, int]:
    """(first, step, count): the filter taps r = first + i * step, i < count, of one dimension
    that reach the input positions of ``phase`` (position mod stride), i.e. those with
    r * dilation = phase + pad (mod stride); the kernels' ``PhaseTaps``."""
    step = stride // math.gcd(stride, dilation % stride)
    target = (phase + pad) % stride
    for r in range(step):
        if r * dilation % stride == target:
            return r, step, (ig.ceil_div(filter_size - r, step) if r < filter_size else 0)
    return 0, step, 0


def phase_plans(g, splits: int) -> np.ndarray:
    """The general tiled kernel's plan (int32): a header (FastDivs by ``splits``, by the phase
    count and by the out channels per group), then per phase (row phase major) the phase's
    positions, reduction, taps, cursor offsets and FastDivs (the kernel's ``phase_plan``
    names each word).  What every thread would otherwise compute in its prologue."""
    out_per_group = g.out_depth // g.groups
    words = _record(PLAN_HEADER, "HEADER_WORDS", splits=splits, phases=g.stride_rows * g.stride_cols,
                    out_per_group=out_per_group)
    for phase_row in range(g.stride_rows):
        for phase_col in range(g.stride_cols):
            first_r, step_r, count_r = phase_taps(phase_row, g.pad_top, g.stride_rows, g.dilation_rows, g.filter_rows)
            first_s, step_s, count_s = phase_taps(phase_col, g.pad_left, g.stride_cols, g.dilation_cols,
                                                  g.filter_cols)
            rows = ig.ceil_div(g.in_rows - phase_row, g.stride_rows) if g.in_rows > phase_row else 0
            cols = ig.ceil_div(g.in_cols - phase_col, g.stride_cols) if g.in_cols > phase_col else 0
            # The offsets are exact divisions where the phase has taps (its taps make the
            # numerators multiples of the stride) and unused where it has none.
            words += _record(PLAN_ENTRY, "ENTRY_WORDS", m_size=g.batch * rows * cols,
                             reduction=count_r * count_s * out_per_group, phase_row=phase_row, phase_col=phase_col,
                             p_offset=(phase_row + g.pad_top - first_r * g.dilation_rows) // g.stride_rows,
                             q_offset=(phase_col + g.pad_left - first_s * g.dilation_cols) // g.stride_cols,
                             p_step=step_r * g.dilation_rows // g.stride_rows,
                             q_step=step_s * g.dilation_cols // g.stride_cols,
                             taps_r_first=first_r, taps_r_step=step_r, taps_s_first=first_s, taps_s_step=step_s,
                             div_j=max(cols, 1), div_i=max(rows, 1), div_taps_s=max(count_s, 1))
    return np.asarray(words, np.int64).astype(np.int32)


def _device_plan(g, splits: int):
    """:func:`phase_plans` on the device: built and uploaded once per geometry and split count."""
    # The geometry is frozen (hashable) and names everything the plan depends on.
    return _runtime.cached_tables(("conv2d_backprop_input plan", splits, g), lambda: [phase_plans(g, splits)])[0]


def supports(op, geometry, dtype) -> tuple[bool, str]:
    if geometry.depthwise:
        return False, "depthwise filters are not handled by the conv2d_backprop_input kernels"
    return ig.supported(dtype)


def conv2d_backprop_input(geometry, filter, out_backprop, *, path: str | None = None,
                          vector: bool | None = None, pointwise: bool | None = None,
                          few_channels: bool | None = None, splits: int | None = None,
                          tile: tuple[int, int] | None = None):
    """Input gradient (shape ``geometry.input_shape``, in ``geometry.data_format``) from the HWIO
    ``filter`` and ``out_backprop``, in their dtype.  ``path`` ("direct" / "tiled"), ``vector``
    (tiled only: 16-byte or scalar loads), ``pointwise`` (tiled only: the 1x1 kernel where
    :func:`._conv_igemm.pointwise_eligible` and 16-byte loads allow it, else the general one)
    ``few_channels`` (direct only: the few-channel kernel where :func:`few_channels_eligible`,
    else the general one), ``splits`` (tiled only: the split count) and ``tile`` (tiled only:
    the (BM, BN) tile shape, :func:`._conv_igemm.pick_tile`) override the automatic choices; the
    tests use them to run every path on small shapes."""
    import cupy

    g = geometry
    dtype = np.dtype(out_backprop.dtype)
    if ig.is_empty(g.input_shape, filter.shape, out_backprop.shape):
        return cupy.zeros(g.input_shape, dtype)
    path = pick_path(g, dtype, path)

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
    dy = ig.to_nhwc(dy, g.data_format)
    out = cupy.empty((g.batch, g.in_rows, g.in_cols, g.in_depth), dtype)  # NHWC; every element written
    m, n, _ = _gemm_sizes(g)
    vector = ig.use_vector_loads(g, dtype, (w, dy, out), vector)
    shape = ig.scalar_table_tile(ig.pick_tile(dtype, kind, vector, m, n, tile=tile), dtype, kind, vector)
    splits, split_size = split_count(g, dtype, kind, splits, shape)
    # One float (double for float64) partial input gradient per split; unused (empty) without a split.
    partial = cupy.empty((splits, out.size) if splits > 1 else (0,), accumulator_dtype(dtype))
    grid = (ig.ceil_div(m, shape.bm), ig.ceil_div(n, shape.bn), g.groups * g.stride_rows * g.stride_cols * splits)
    split = splits > 1
    tail = (*dims, np.int64(splits), np.int64(split_size))
    if ig.pick_pointwise(g, vector, pointwise):
        fn = _runtime.kernel(SOURCE, _pointwise_name(dtype, kind, split, shape.args))
        fn(grid, (shape.threads,), (w, dy, out, partial, *tail, *_runtime.division_magic(splits)))
    else:
        fn = _runtime.kernel(SOURCE, _tiled_name(dtype, kind, vector, split, shape.args))
        fn(grid, (shape.threads,), (w, dy, out, partial, _device_plan(g, splits), *tail))
    if splits > 1:
        reduce = _runtime.kernel(SOURCE, _reduce_name(dtype))
        _runtime.launch_1d(reduce, out.size, (partial, out, np.int64(out.size), np.int64(splits)))
    return ig.from_nhwc(out, g.data_format)
