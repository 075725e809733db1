"""Launcher for cuda_src/depthwise_conv2d_native_backprop_filter.cu.

Two launches (see the .cu file): partial sums of fixed slices of the output positions per
(tap, out_backprop channel) into a float (double for float64) scratch buffer, then a fixed-
order sum of the slices, rounded once to the element type.  No atomics: the slicing depends
on the geometry only, never on the GPU, so results are bitwise reproducible everywhere.  One
launch where the geometry gives one slice (:func:`reduce_needed`): the first kernel writes the
result, rounded as the fixed-order sum of one slice would round it (the same bits).  One launch
also where a specialised kernel has a few slices (:func:`fused_reduce`): the last CTA or warp of
each channel block to finish, found by an integer ticket (:func:`_runtime.ticket_counters`),
adds the block's slices in the order the second kernel would (the same bits again).

The partial sums come from the tiled kernel (a CTA per channel block and slice of tiles, the
sums in registers) where it runs (:func:`tiled_eligible`: NHWC, 3x3 or 5x5 at stride 1 or 2,
no dilation, 32-bit offsets), from the planes kernel in the same cases for NCHW
(:func:`planes_eligible`: a warp per out_backprop channel and slice of work items, the sums in
registers), else from the per-element ``_partial`` kernel (any geometry and layout, 32-bit
index math where every index fits, :func:`fits_int32`, else 64-bit).  On compute capability
8.0+ the tensor-core kernel takes the NCHW half-type planes of at most 32 x 32 out_backprop
positions at stride 1 (:func:`mma_possible`, :func:`mma_chosen`: a warp per channel and slice
of images, each tap row of the filter gradient a diagonal of mma.sync products), and the NHWC
half-type 3x3 / 5x5 maps at stride 1 (:func:`mma_nhwc_eligible`, :func:`pick_mma_nhwc`: the
same products, a CTA per 16 / M channels transposing 16 x 16 output tiles, or four images of
at most 8 x 8, into planes in shared memory).  Either layout runs in place (no transpose of the
tensors in memory).  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import math
import types

import numpy as np

from ..._dtypes import accumulator_dtype
from ..._geometry import Conv2DGeometry
from . import _build, _conv_igemm, _runtime

SOURCE = "depthwise_conv2d_native_backprop_filter.cu"
PARTIAL_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_partial"
REDUCE_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_reduce"
TILED_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_tiled"
PLANES_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_planes"
MMA_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_mma"
MMA_NHWC_KERNEL = "gradops::depthwise_conv2d_native_backprop_filter_mma_nhwc"

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
#: The reduction's CTA: kReduceElements filter elements x :func:`reduce_groups` groups of
#: slices, at most kReduceMaxGroups; a group sums at most REDUCE_LOADS slices where that many
#: groups allow: one batch a thread of the kernel's kReduceBatch loads, issued together.
REDUCE_ELEMENTS = 32
REDUCE_MAX_GROUPS = 32
REDUCE_LOADS = 16
#: One launch for a few slices (the .cu file's section of that name): the specialised kernels'
#: last CTA (warp) of a channel block adds the block's slices itself where there are at most
#: REDUCE_LOADS of them (one batch of loads, summed in the second kernel's order: it has one
#: group then) and each of its threads has at most FUSED_MAX_ELEMENTS filter elements to sum
#: (a round trip each, on the launch's critical path; a 3x3 filter's 288 of a 128-thread tiled
#: CTA are 3).  What it saves is the second launch, a fixed 3.4-4.2 us a call on the H100
#: (2026-12-05, benchmarks/results/gpu_h100_2026-12-05/ncu_filter.md).
FUSED_MAX_ELEMENTS = 4

#: The tiled kernel's specialisations: square filters and equal strides (``dwfilter::Shape``).
TILED_FILTERS = (3, 5)
TILED_STRIDES = (1, 2)
#: Work items across a tile (``C``): 4 (16 output columns) or 2 (8, for narrow maps).
TILED_ITEMS_ACROSS = (4, 2)
#: Threads per CTA (``dwfilter::kThreads``) and work items per CTA (``kItems``).
TILED_THREADS = 128
TILED_ITEMS = 8
#: Output channels per CTA (``dwconv::Block<Acc>::CHANNELS``): 128 bytes of accumulators; a
#: thread's lane of them (``dwconv::kLaneBytes``): 8 bytes.
TILED_CHANNEL_BYTES = 128
TILED_LANE_BYTES = 8
#: The tiled slicing aims at about this many CTAs (channel blocks x slices): several waves on
#: any GPU, a constant so that the summation order is the same everywhere ...
TILED_TARGET_CTAS = 384
#: ... with at least this many tiles per slice where there are enough, so that a CTA's final
#: sum of its work items (and the partial buffer it writes) is spread over several tiles.
TILED_MIN_UNITS = 4
#: Largest grid y extent (slices) CUDA allows.
MAX_GRID_Y = 65535

#: The planes kernel (NCHW): a warp per out_backprop channel (``dwplanes::kWarps`` per CTA of
#: ``kThreads``), work items of 4 x 4 output positions at stride 1, 2 x 4 at stride 2.
PLANES_WARPS = 4
PLANES_THREADS = 32 * PLANES_WARPS
PLANES_ITEM_COLS = 4
#: The planes slicing aims at about this many warps (channels x slices), a constant so that the
#: summation order is the same everywhere ...
PLANES_TARGET_WARPS = 4096
#: ... with at least this many work items per slice (4 per lane) where there are enough: a
#: warp's fixed work (its set-up, its lanes' sum in lane order) is about one item, and small
#: maps still have warps enough to keep loads in flight.  In the static report (H100, the
#: NCHW MobileNetV2 / EfficientNet layers, once each item waited for its loads once), 128 gave
#: the best float16 geomeans of 32, 64, 96, 128, 192 and 256; at 256 the latency limit binds.
PLANES_MIN_ITEMS = 128
#: The planes kernel's window load forms (``dwplanes::WindowForm``): one value a load, aligned
#: pairs from the window's first column, aligned pairs from the column before it.
PLANES_SINGLES, PLANES_PAIRS, PLANES_PAIRS_FROM_COLUMN_BEFORE = 0, 1, 2
#: ... and lane blocks (half types): form PLANES_LANE_BLOCKS + pad_left, pad_left below
#: PLANES_LANE_BLOCK_PADS: an interior item loads its own 4 x stride columns in one 8- or 16-byte
#: load and takes the columns beside them from the neighbouring lanes by shuffles
#: (``dwplanes::LaneBlock``).  Opt-in (:data:`PLANES_LANES_BY_DEFAULT`) until a GPU has timed
#: it: on the float16 benchmark layers its warps' loads touch 1.6-3.6x fewer 32-byte sectors
#: than the pair forms' (which read each other's columns: L1 serves the repeats), for 6-16% more
#: SASS instructions an element on sm_90, at the pair forms' occupancy or more
#: (benchmarks/results/planes_lane_blocks.md, predicted, not measured).
PLANES_LANE_BLOCKS, PLANES_LANE_BLOCK_PADS = 3, 3
PLANES_LANES_BY_DEFAULT = False


#: The tensor-core kernel (``_mma``): NCHW half types, these square filters at stride 1 and
#: dilation 1, these multipliers, out_backprop planes of at most MMA_TILE x MMA_TILE positions,
#: compute capability 8.0 and newer (mma.sync m16n8k16 with f32 accumulation); MMA_WARPS warps
#: a CTA, one slice of images each.
MMA_FILTERS = (3, 5)
MMA_MULTIPLIERS = (1, 2)
MMA_DTYPES = ("float16", "bfloat16")
MMA_ARCH = _conv_igemm.MMA_SYNC_ARCH
MMA_TILE = 32
MMA_WARPS = 4
MMA_THREADS = 32 * MMA_WARPS
#: Staging chunks (``vec``): elements per load, the widest that divides in_cols and out_cols
#: and to which both arrays are aligned (an input column shift of a multiple of 4 keeps every
#: chunk's staged place aligned).
MMA_CHUNKS = (4, 2, 1)
#: Staging slots of each region a lane loads before it stores them (``dwfmma::kStageBatch``);
#: where an image's regions take one such batch and chunks are 4 bytes or smaller, a warp loads
#: two images' before it stores either (its pair loop).
MMA_STAGE_BATCH = 4
#: The slicing aims at about this many warps (channels x slices), a constant so that the
#: summation order is the same everywhere: fewer warps wait for more images in turn, more pay
#: their fixed work (zeroing the stage, the diagonal sums) over fewer images and add partial
#: sums to the second kernel.  In the static report (H100, the NCHW MobileNetV2 / EfficientNet
#: layers it takes, float16) 4096 gave the best geomean of 2048, 4096, 8192 and 16384.
MMA_TARGET_WARPS = 4096
#: The launcher picks the tensor-core kernel by itself only where out_backprop fills at least
#: this much of the 16-row x 8-column blocks of its products (:func:`mma_fill`): a 7 x 7 plane
#: fills 38% and costs as much as a 16 x 8 one, where the planes kernel is predicted faster;
#: 14 x 14 and 28 x 28 planes fill 77%.
MMA_MIN_FILL = 0.5
#: Whether the launcher picks the tensor-core kernel by itself where it can run (False: only
#: when asked for, ``mma=True``).
MMA_BY_DEFAULT = True

#: The NHWC tensor-core kernel (``_mma_nhwc``): the same products for NHWC half types, a CTA of
#: MMA_NHWC_THREADS per 16 / M input channels (``dwfnhwc::Stage::CHANNELS``: 16-byte loads of
#: 8 channels, so in_depth a multiple of that and both arrays 16-byte aligned) and slice of
#: units, a unit one image's tile of MMA_NHWC_TILE x MMA_NHWC_TILE output positions, or for maps
#: of at most MMA_NHWC_PACKED_SIDE a side MMA_NHWC_PACKED images 2 x 2 (the packed form,
#: :func:`mma_nhwc_pack_stride`; where no stride fits, those maps take the tiled kernel).
MMA_NHWC_THREADS = 256
MMA_NHWC_TILE = 16
MMA_NHWC_PACKED_SIDE = 8
MMA_NHWC_PACKED = 4
#: The slicing aims at about this many CTAs (channel groups x slices), a constant so that the
#: summation order is the same everywhere ...
MMA_NHWC_TARGET_CTAS = 512
#: ... with at least this many units a slice where there are that many: a CTA's fixed work
#: (zeroing its planes, the diagonal sums) is about two units, and its first unit's loads wait
#: alone.
MMA_NHWC_MIN_UNITS = 4


def _partial_expression(dtype, data_format: str, index_bits: int) -> str:
    element, accumulator = _build.c_types(dtype)
    return f"{PARTIAL_KERNEL}<{element}, {accumulator}, {LAYOUTS[data_format]}, {INDEX_TYPES[index_bits]}>"


def _reduce_expression(dtype) -> str:
    element, accumulator = _build.c_types(dtype)
    return f"{REDUCE_KERNEL}<{element}, {accumulator}>"


def _tiled_expression(dtype, filter_size: int, stride: int, items_across: int, asynchronous: bool = False) -> str:
    element, accumulator = _build.c_types(dtype)
    tail = ", true" if asynchronous else ""
    return f"{TILED_KERNEL}<{element}, {accumulator}, {filter_size}, {stride}, {items_across}{tail}>"


def _planes_expression(dtype, filter_size: int, stride: int, window_form: int = 0) -> str:
    element, accumulator = _build.c_types(dtype)
    return f"{PLANES_KERNEL}<{element}, {accumulator}, {filter_size}, {stride}, {window_form}>"


def _mma_expression(dtype, filter_size: int, multiplier: int, chunk: int) -> str:
    element, _ = _build.c_types(dtype)
    return f"{MMA_KERNEL}<{element}, {filter_size}, {multiplier}, {chunk}>"


def _mma_nhwc_expression(dtype, filter_size: int, multiplier: int, packed: bool = False) -> str:
    element, _ = _build.c_types(dtype)
    return f"{MMA_NHWC_KERNEL}<{element}, {filter_size}, {multiplier}, {'true' if packed else 'false'}>"


def planes_window_forms(dtype) -> tuple[int, ...]:
    """The planes kernel's window load forms for ``dtype`` (``dwplanes::WindowForm``): singles,
    and where a pair of values fits a 4- or 8-byte load (not double) pairs from the window's
    first column or from the column before it, and for half types lane blocks at each pad_left
    below :data:`PLANES_LANE_BLOCK_PADS`."""
    itemsize = np.dtype(dtype).itemsize
    if itemsize > 4:
        return (PLANES_SINGLES,)
    lanes = tuple(PLANES_LANE_BLOCKS + pad for pad in range(PLANES_LANE_BLOCK_PADS)) if itemsize == 2 else ()
    return (PLANES_SINGLES, PLANES_PAIRS, PLANES_PAIRS_FROM_COLUMN_BEFORE) + lanes


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for on compute capability ``arch`` (None:
    any): the tensor-core kernel's and the tiled kernel's asynchronous forms from 8.0 on."""
    names = []
    if arch is None or arch >= MMA_ARCH:  # mma.sync m16n8k16 needs sm_80
        names += [_mma_expression(dtype, k, m, v) for dtype in MMA_DTYPES for k in MMA_FILTERS
                  for m in MMA_MULTIPLIERS for v in MMA_CHUNKS]
        names += [_mma_nhwc_expression(dtype, k, m, packed) for dtype in MMA_DTYPES for k in MMA_FILTERS
                  for m in MMA_MULTIPLIERS for packed in (False, True)]
    for dtype in _build.C_TYPES:
        for data_format in LAYOUTS:
            names += [_partial_expression(dtype, data_format, bits) for bits in INDEX_TYPES]
        names.append(_reduce_expression(dtype))
        names += [_tiled_expression(dtype, k, s, c) for k in TILED_FILTERS for s in TILED_STRIDES
                  for c in TILED_ITEMS_ACROSS]
        if arch is None or arch >= ASYNC_ARCH:  # cp.async needs sm_80
            names += [_tiled_expression(dtype, k, s, c, True) for k in TILED_FILTERS for s in TILED_STRIDES
                      for c in TILED_ITEMS_ACROSS if async_compiled(dtype, k, s, c)]
        names += [_planes_expression(dtype, k, s, f) for k in TILED_FILTERS for s in TILED_STRIDES
                  for f in planes_window_forms(dtype)]
    return {SOURCE: names}


# --------------------------------------------------------------------------- the tiled kernel

def tiled_channels(dtype) -> int:
    """Output channels per CTA of the tiled kernel: 32 (float accumulators) or 16 (double)."""
    return TILED_CHANNEL_BYTES // accumulator_dtype(dtype).itemsize


def lane_channels(dtype) -> int:
    """Output channels of one thread's lane (``dwconv::Block<Acc>::V``): 2 float or 1 double."""
    return TILED_LANE_BYTES // accumulator_dtype(dtype).itemsize


def item_shape(g: Conv2DGeometry) -> tuple[int, int]:
    """(rows, columns) of output positions per work item (``dwfilter::Shape``): 2 x 4 at
    stride 1, 1 x 4 at stride 2."""
    return (2 if g.stride_rows == 1 else 1), 4


def tile_shape(g: Conv2DGeometry, items_across: int) -> tuple[int, int]:
    """(rows, columns) of output positions per tile (``dwfilter::Shape``): ``items_across``
    work items across and 8 / that down."""
    item_rows, item_cols = item_shape(g)
    return TILED_ITEMS // items_across * item_rows, items_across * item_cols


def staged_shape(g: Conv2DGeometry, items_across: int) -> tuple[int, int]:
    """(rows, columns) of input positions a tile stages (``Shape::STAGED_ROWS / STAGED_COLS``)."""
    rows, cols = tile_shape(g, items_across)
    return (rows - 1) * g.stride_rows + g.filter_rows, (cols - 1) * g.stride_cols + g.filter_cols


def tile_counts(g: Conv2DGeometry, items_across: int) -> tuple[int, int]:
    """(tiles down, tiles across) covering the output."""
    rows, cols = tile_shape(g, items_across)
    return -(-g.out_rows // rows), -(-g.out_cols // cols)


def tiled_idle_warps(g: Conv2DGeometry, items_across: int, columns: bool) -> int:
    """Warps of one image's tiles whose two work items lie wholly past the output (they skip the
    sums), with a warp's items side by side in an item row (``columns`` False) or one above the
    other in an item column (True; the kernel's ``columns_per_warp``).  Only the last tile row
    and column hold such items: ``active_rows`` / ``active_cols`` item rows / columns of them
    reach into the output."""
    item_rows, item_cols = item_shape(g)
    rows, cols = tile_shape(g, items_across)
    down, across = tile_counts(g, items_across)
    items_down = TILED_ITEMS // items_across
    active_rows = -(-(g.out_rows - (down - 1) * rows) // item_rows)
    active_cols = -(-(g.out_cols - (across - 1) * cols) // item_cols)
    if columns:  # a warp: item rows 2w, 2w + 1 of one item column
        return ((items_across - active_cols) * (items_down // 2) * down
                + (items_down // 2 - -(-active_rows // 2)) * (items_across * (across - 1) + active_cols))
    # a warp: item columns 2w, 2w + 1 of one item row
    return ((items_down - active_rows) * (items_across // 2) * across
            + (items_across // 2 - -(-active_cols // 2)) * (items_down * (down - 1) + active_rows))


def tiled_columns_per_warp(g: Conv2DGeometry, items_across: int) -> bool:
    """The kernel's ``columns_per_warp``: whether a warp's two work items sit one above the
    other, where that idles more whole warps than side by side (side by side on a tie)."""
    return tiled_idle_warps(g, items_across, True) > tiled_idle_warps(g, items_across, False)


def pick_items_across(g: Conv2DGeometry) -> int:
    """The tile width whose tiles cover the output with the fewest positions (the wider on a tie)."""
    def covered(c):
        down, across = tile_counts(g, c)
        return down * across * math.prod(tile_shape(g, c))
    return min(TILED_ITEMS_ACROSS, key=covered)


def specialised(g: Conv2DGeometry) -> bool:
    """Whether the tiled (NHWC) and planes (NCHW) kernels have a specialisation for ``g``: a
    3x3 or 5x5 filter at stride 1x1 or 2x2, no dilation."""
    return (g.filter_rows == g.filter_cols and g.filter_rows in TILED_FILTERS and g.stride_rows == g.stride_cols
            and g.stride_rows in TILED_STRIDES and g.dilation_rows == g.dilation_cols == 1)


def _slices(units: int, parallel: int, target: int, minimum: int) -> tuple[int, int]:
    """(slices, units per slice): ``units`` cut into about ``target / parallel`` slices (each
    run by ``parallel`` CTAs or warps) of at least ``minimum`` units where there are that
    many, no empty trailing slice."""
    slices = max(1, min(-(-target // parallel), units // minimum, MAX_GRID_Y))
    per_slice = -(-units // slices)
    return -(-units // per_slice), per_slice


def _pick(kernel: str, eligible: bool, forced: bool | None, other_layout: str) -> bool:
    """``forced`` if given (True checked against ``eligible``), else ``eligible``."""
    if forced and not eligible:
        raise ValueError(f"the {kernel} kernel cannot run this geometry ({other_layout}, a filter or stride other "
                         "than 3x3 / 5x5 at 1x1 / 2x2, a dilation, or sizes beyond 32-bit offsets)")
    return eligible if forced is None else bool(forced)


def tiled_eligible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tiled kernel can run ``g``: NHWC, :func:`specialised`, and 32-bit offsets
    (both tensors and the partial buffer below 2**31 elements)."""
    if not (g.data_format == "NHWC" and specialised(g)):
        return False
    slices, _ = tiled_slicing(g, dtype, pick_items_across(g))
    down, across = tile_counts(g, min(TILED_ITEMS_ACROSS))  # the most tiles of either width
    # The kernel forms offsets of whole tiles before it tests them: output positions up to 8
    # rows / 16 columns past the output; staged input rows from -pad_top to 14 past the padded
    # bottom (a last tile's 7 further rows at stride 2), columns from -pad_left to 30 past.
    sizes = ((g.batch * g.in_rows + g.pad_bottom + 16) * (g.in_cols + g.pad_right + 32) * g.in_depth,
             (g.pad_top + 1) * (g.in_cols + g.pad_left + 1) * g.in_depth,
             (g.batch * g.out_rows + 8) * (g.out_cols + 16) * g.out_depth,
             slices * g.filter_rows * g.filter_cols * g.out_depth,
             g.batch * down * across + TILED_MIN_UNITS * slices)
    return max(sizes) <= INT32_MAX


def tiled_slicing(g: Conv2DGeometry, dtype, items_across: int) -> tuple[int, int]:
    """(slices, tiles per slice) of the tiled kernel: about :data:`TILED_TARGET_CTAS` CTAs with
    at least :data:`TILED_MIN_UNITS` tiles per slice (where there are that many), from the
    geometry alone."""
    down, across = tile_counts(g, items_across)
    units = g.batch * down * across
    return _slices(units, -(-g.out_depth // tiled_channels(dtype)), TILED_TARGET_CTAS, TILED_MIN_UNITS)


def pick_tiled(g: Conv2DGeometry, dtype, tiled: bool | None = None) -> bool:
    """``tiled`` if given (True checked), else whether the tiled kernel can run ``g``."""
    return _pick("tiled", tiled_eligible(g, dtype), tiled, "NCHW")


def vector_staging_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tiled kernel can stage with 16-byte loads but for the input's alignment:
    multiplier 1 or 2 and in_depth a multiple of 16 / itemsize."""
    return g.depth_multiplier <= 2 and g.in_depth % _runtime.vector_width(dtype) == 0


def staging_mode(g: Conv2DGeometry, dtype, input) -> int:
    """The tiled kernel's ``staging``: 1 (16-byte loads, multiplier 1) or 2 (multiplier 2) where
    :func:`vector_staging_possible` and the input is 16-byte aligned, else 0 (one element per
    load)."""
    return g.depth_multiplier if vector_staging_possible(g, dtype) and _runtime.vector_aligned(input) else 0


#: Whether the launcher takes the tiled kernel's asynchronous staging (cp.async copies of the
#: next unit while the CTA sums this one) by itself (``gradops-cuda:async`` in the benchmarks,
#: ``async_copies=True`` here).  False: the H200 timed it against the synchronous staging on
#: 2026-12-04 (benchmarks/results/gpu_h200_2026-12-04/ncu_summary.md, NHWC layers), no faster
#: overall: geometric means of % of HBM async / sync 10.7 / 11.2 (EfficientNet float16), 17.0 /
#: 16.1 (MobileNetV2 float16), 28.0 / 30.1 (MobileNetV2 float32).
ASYNC_BY_DEFAULT = False
#: cp.async needs compute capability 8.0.
ASYNC_ARCH = 80
#: Static shared memory a kernel may declare.
STATIC_SHARED_BYTES = 48 * 1024


def async_shared_bytes(dtype, filter_size: int, stride: int, items_across: int) -> int:
    """Shared memory of the tiled kernel with asynchronous staging (``dwfilter::AsyncStaging``):
    the staged tile (or the work items' sums, the larger), the raw input tile and the raw
    out_backprop tile."""
    square = types.SimpleNamespace(filter_rows=filter_size, filter_cols=filter_size, stride_rows=stride,
                                   stride_cols=stride)
    width, acc = np.dtype(dtype).itemsize, np.dtype(accumulator_dtype(dtype)).itemsize
    channels = tiled_channels(dtype)
    staged = math.prod(staged_shape(square, items_across))
    tile = math.prod(tile_shape(square, items_across))
    sums = TILED_ITEMS * filter_size * filter_size * channels * acc
    return max(staged * channels * acc, sums) + (staged + tile) * channels * width


def async_compiled(dtype, filter_size: int, stride: int, items_across: int) -> bool:
    """Whether the asynchronous form of a tiled specialisation exists: its buffers fit in static
    shared memory (every float16 / bfloat16 one; float32 / float64 only at 3x3, whose 5x5 sums
    alone take 25 KiB)."""
    return async_shared_bytes(dtype, filter_size, stride, items_across) <= STATIC_SHARED_BYTES


#: The tiled kernel's staging forms, for A/B timings (``gradops-cuda:sync`` / ``:async``).
#: The kernel paths the GPU benchmark can force (``gradops-cuda:PATH``): the tiled kernel with
#: synchronous or asynchronous staging, the layout's tensor-core kernel, or the planes kernel
#: with its window loads in pairs or lane blocks.
STAGING_PATHS = ("sync", "async", "mma", "planes_pairs", "planes_lanes")


def check_staging_path(g: Conv2DGeometry, dtype, path: str) -> None:
    """Raises ValueError unless ``path`` can run ``g`` on 16-byte aligned arrays on this GPU: the
    tiled kernel with staging "sync" or "async", "mma" the layout's tensor-core kernel, or the
    planes kernel with its window loads in pairs ("planes_pairs") or lane blocks
    ("planes_lanes")."""
    if path not in STAGING_PATHS:
        raise ValueError(f"staging path must be one of {STAGING_PATHS}, got {path!r}")
    if path.startswith("planes_"):
        if not planes_eligible(g, dtype):
            raise ValueError("the planes kernel cannot run this geometry")
        planes_window_form(g, dtype, pairs=True, lanes=path == "planes_lanes")  # raises where it cannot
        return
    if path == "mma":  # the launcher's own checks, which raise where it cannot run
        if g.data_format == "NHWC":
            pick_mma_nhwc(g, dtype, mma=True)
        else:
            pick_mma(g, dtype, True)
        return
    if not tiled_eligible(g, dtype):
        raise ValueError("the tiled kernel cannot run this geometry")
    if path == "async" and not async_eligible(g, dtype, pick_items_across(g)):
        raise ValueError("asynchronous staging cannot run this geometry here (it needs multiplier 1 or 2, in_depth "
                         "and out_depth multiples of 16 bytes, a specialisation with an asynchronous form and "
                         "compute capability 8.0+)")


def async_eligible(g: Conv2DGeometry, dtype, items_across: int) -> bool:
    """Whether the tiled kernel can stage ``g`` asynchronously on 16-byte aligned arrays:
    :func:`vector_staging_possible`, out_depth a multiple of 16 / itemsize (its out_backprop
    tile is copied 16 bytes at a time), :func:`async_compiled`, and cp.async (compute
    capability 8.0+)."""
    return (vector_staging_possible(g, dtype) and g.out_depth % _runtime.vector_width(dtype) == 0
            and async_compiled(dtype, g.filter_rows, g.stride_rows, items_across)
            and _runtime.compute_capability() >= ASYNC_ARCH)


def async_possible(g: Conv2DGeometry, dtype, input, out_backprop, items_across: int) -> bool:
    """:func:`async_eligible` for these arrays: both 16-byte aligned."""
    return async_eligible(g, dtype, items_across) and _runtime.vector_aligned(input, out_backprop)


def lane_loads(g: Conv2DGeometry, dtype, out_backprop) -> bool:
    """Whether the tiled kernel reads a lane's out_backprop channels in one load: out_depth a
    multiple of the lane's channels and out_backprop aligned to their bytes."""
    v = lane_channels(dtype)
    return g.out_depth % v == 0 and int(_runtime.pointer(out_backprop)) % (v * np.dtype(dtype).itemsize) == 0


# --------------------------------------------------------------------------- the planes kernel

def planes_item_shape(g: Conv2DGeometry) -> tuple[int, int]:
    """(rows, columns) of output positions per work item of the planes kernel
    (``dwplanes::Shape``): 4 x 4 at stride 1, 2 x 4 at stride 2."""
    return (4 if g.stride_rows == 1 else 2), PLANES_ITEM_COLS


def planes_item_counts(g: Conv2DGeometry) -> tuple[int, int]:
    """(work items down, work items across) one plane of out_backprop."""
    rows, cols = planes_item_shape(g)
    return -(-g.out_rows // rows), -(-g.out_cols // cols)


def planes_window_shape(g: Conv2DGeometry) -> tuple[int, int]:
    """(rows, columns) of input positions one work item reads (``Shape::WINDOW_ROWS / _COLS``)."""
    rows, cols = planes_item_shape(g)
    return (rows - 1) * g.stride_rows + g.filter_rows, (cols - 1) * g.stride_cols + g.filter_cols


def planes_window_loads(g: Conv2DGeometry, dtype, form: int) -> tuple[int, int]:
    """(loads, bytes a load) of one work item's window in load form ``form``
    (``WindowLoads::LOADS_PER_ROW`` a row)."""
    rows, cols = planes_window_shape(g)
    width = np.dtype(dtype).itemsize
    if form == PLANES_SINGLES:
        return rows * cols, width
    shift = 1 if form == PLANES_PAIRS_FROM_COLUMN_BEFORE else 0
    return rows * -(-(cols + shift) // 2), 2 * width


def planes_interior_box(g: Conv2DGeometry) -> tuple[int, int, int, int]:
    """(first row, end row, first column, end column) of the work items of a plane whose
    positions are inside the output and whose windows are inside the image (the kernel's
    unconditional loop); an empty box is (down, down, across, across)."""
    rows, cols = planes_item_shape(g)
    window_rows, window_cols = planes_window_shape(g)
    down, across = planes_item_counts(g)

    def span(count, size, out_size, stride, pad, window, in_size):
        inside = [i for i in range(count) if (i + 1) * size <= out_size and i * size * stride - pad >= 0
                  and i * size * stride - pad + window <= in_size]
        return (inside[0], inside[-1] + 1) if inside else (count, count)  # contiguous: each test is monotone

    row0, row1 = span(down, rows, g.out_rows, g.stride_rows, g.pad_top, window_rows, g.in_rows)
    col0, col1 = span(across, cols, g.out_cols, g.stride_cols, g.pad_left, window_cols, g.in_cols)
    if row0 == row1 or col0 == col1:
        return down, down, across, across
    return row0, row1, col0, col1


def planes_runs(g: Conv2DGeometry, slices: int) -> tuple[int, int, int, int]:
    """(interior items, border items, interior items per slice, border items per slice): each
    of ``slices`` slices takes a run of both (the last runs short or empty)."""
    row0, row1, col0, col1 = planes_interior_box(g)
    interior = g.batch * (row1 - row0) * (col1 - col0)
    border = g.batch * math.prod(planes_item_counts(g)) - interior
    return interior, border, max(1, -(-interior // slices)), max(1, -(-border // slices))


def planes_slicing(g: Conv2DGeometry) -> tuple[int, int]:
    """(slices, work items per slice) of the planes kernel: about :data:`PLANES_TARGET_WARPS`
    warps with at least :data:`PLANES_MIN_ITEMS` items per slice (where there are that many),
    from the geometry alone."""
    return _slices(g.batch * math.prod(planes_item_counts(g)), g.out_depth, PLANES_TARGET_WARPS, PLANES_MIN_ITEMS)


def planes_eligible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the planes kernel can run ``g``: NCHW, :func:`specialised`, and 32-bit offsets
    of whole work items (positions up to 3 rows and columns past the output, window rows and
    columns from the padding to a stride past the padded image), of the item runs' indices
    (a lane's past its run's end) and of the partial buffer."""
    if not (g.data_format == "NCHW" and specialised(g)):
        return False
    slices, _ = planes_slicing(g)
    _, _, interior_per_slice, border_per_slice = planes_runs(g, slices)
    margin = 8  # rows / columns: an item's last positions past the output, times the stride
    sizes = ((g.batch * g.in_depth * g.in_rows + g.pad_bottom + margin) * (g.in_cols + g.pad_right + margin),
             (g.pad_top + 1) * (g.in_cols + g.pad_left + 1),
             (g.batch * g.out_depth * g.out_rows + margin) * (g.out_cols + margin),
             slices * g.filter_rows * g.filter_cols * g.out_depth,
             (slices + 1) * max(interior_per_slice, border_per_slice) + 32)
    return max(sizes) <= INT32_MAX


def pick_planes(g: Conv2DGeometry, dtype, planes: bool | None = None) -> bool:
    """``planes`` if given (True checked), else whether the planes kernel can run ``g``."""
    return _pick("planes", planes_eligible(g, dtype), planes, "NHWC")


def planes_row_loads_possible(g: Conv2DGeometry) -> bool:
    """Whether an item row's 4 out_backprop values can be one load but for the array's
    alignment: out_cols a multiple of 4."""
    return g.out_cols % PLANES_ITEM_COLS == 0


def planes_pair_loads_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the planes kernel can load its windows in pairs but for the array's alignment:
    a pair fits a 4- or 8-byte load (not double) and in_cols is even (a pair at an even column
    never straddles two image rows, nor the image's edge)."""
    return PLANES_PAIRS in planes_window_forms(dtype) and g.in_cols % 2 == 0


def planes_lane_block_cols(g: Conv2DGeometry) -> int:
    """A lane block's own columns of a window row: the work item's 4 x stride."""
    return PLANES_ITEM_COLS * g.stride_cols


def planes_lane_block_bytes(g: Conv2DGeometry, dtype) -> int:
    """Bytes of a lane block's own columns: its loads' alignment."""
    return planes_lane_block_cols(g) * np.dtype(dtype).itemsize


def planes_lane_blocks_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the planes kernel can load its interior windows in lane blocks but for the
    array's alignment: a half type, :func:`planes_pair_loads_possible`, pad_left below
    :data:`PLANES_LANE_BLOCK_PADS` and in_cols a multiple of a block's 4 x stride columns (every
    block aligned to its load)."""
    return (PLANES_LANE_BLOCKS in planes_window_forms(dtype) and planes_pair_loads_possible(g, dtype)
            and g.pad_left < PLANES_LANE_BLOCK_PADS and g.in_cols % planes_lane_block_cols(g) == 0)


def planes_window_form(g: Conv2DGeometry, dtype, input=None, pairs: bool | None = None,
                       lanes: bool | None = None) -> int:
    """The window load form (``dwplanes::WindowForm``) of a launch: pairs where
    :func:`planes_pair_loads_possible` and ``input`` is aligned to a pair (None: assumed
    aligned, as the allocator's arrays are), from the column before the window where
    pad_left is odd (a window starts at column 4 x stride x item - pad_left); else singles.
    Lane blocks (PLANES_LANE_BLOCKS + pad_left) where ``lanes`` (None:
    :data:`PLANES_LANES_BY_DEFAULT`), :func:`planes_lane_blocks_possible` and ``input`` is
    aligned to a block.  ``pairs`` (tests): False forces singles; True asks for pairs (checked);
    ``lanes`` True asks for lane blocks (checked)."""
    itemsize = np.dtype(dtype).itemsize
    possible = planes_pair_loads_possible(g, dtype) and (
        input is None or _runtime.vector_aligned(input, alignment=2 * itemsize))
    if pairs and not possible:
        raise ValueError("pair window loads need half, bfloat16 or float, an even in_cols and an input aligned "
                         "to a pair")
    blocks = planes_lane_blocks_possible(g, dtype) and (
        input is None or _runtime.vector_aligned(input, alignment=planes_lane_block_bytes(g, dtype)))
    if lanes and (not blocks or pairs is False):
        raise ValueError("lane-block window loads need float16 or bfloat16, pad_left 0 to 2, in_cols a multiple of "
                         "4 x stride and an input aligned to 4 x stride values")
    if blocks and pairs is not False and (PLANES_LANES_BY_DEFAULT if lanes is None else lanes):
        return PLANES_LANE_BLOCKS + g.pad_left
    if not possible or pairs is False:
        return PLANES_SINGLES
    return PLANES_PAIRS_FROM_COLUMN_BEFORE if g.pad_left % 2 else PLANES_PAIRS


def planes_lane_loads(g: Conv2DGeometry, dtype, out_backprop) -> bool:
    """Whether the planes kernel reads an item row's 4 out_backprop values in one load:
    :func:`planes_row_loads_possible` and out_backprop aligned to their bytes."""
    width = PLANES_ITEM_COLS * np.dtype(dtype).itemsize
    return planes_row_loads_possible(g) and _runtime.vector_aligned(out_backprop, alignment=width)


# --------------------------------------------------------------------------- the tensor-core kernel

def mma_slicing(g: Conv2DGeometry) -> tuple[int, int]:
    """(slices, images per slice) of the tensor-core kernel: about :data:`MMA_TARGET_WARPS`
    warps (a warp per channel and slice), from the geometry alone."""
    per_slice = max(1, -(-g.batch * g.in_depth // MMA_TARGET_WARPS))
    return -(-g.batch // per_slice), per_slice


def mma_input_rows(g: Conv2DGeometry) -> int:
    """Input rows the tensor-core kernel stages per image: those TF reads for the output (<= 0: none)."""
    return min(g.in_rows, g.out_rows + g.filter_rows - 1 - g.pad_top)


def mma_input_cols(g: Conv2DGeometry) -> int:
    """Input columns the tensor-core kernel stages per row: those TF reads for the output."""
    return min(g.in_cols, g.out_cols + g.filter_cols - 1 - g.pad_left)


def mma_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tensor-core kernel can run ``g`` on a GPU that has it (compute capability
    8.0+): NCHW, float16 / bfloat16, a 3x3 or 5x5 filter at stride 1 and dilation 1,
    multiplier 1 or 2, out_backprop planes of at most :data:`MMA_TILE` x :data:`MMA_TILE` and
    at most as many input columns read per row (a row's staging chunks fit a warp), every tensor and the partial buffer in 32-bit range, the grid within CUDA's limits."""
    if g.data_format != "NCHW" or np.dtype(dtype).name not in MMA_DTYPES:
        return False
    if not (specialised(g) and g.filter_rows in MMA_FILTERS and g.stride_rows == 1
            and g.depth_multiplier in MMA_MULTIPLIERS):
        return False
    if g.out_rows > MMA_TILE or g.out_cols > MMA_TILE or mma_input_cols(g) > MMA_TILE:
        return False
    slices, _ = mma_slicing(g)
    sizes = (g.batch * g.in_rows * g.in_cols * g.in_depth, g.batch * g.out_rows * g.out_cols * g.out_depth,
             (slices + MMA_WARPS) * g.filter_rows * g.filter_cols * g.out_depth,
             # staged rows and columns: the padding and the products' extent
             g.pad_top + g.in_rows + MMA_TILE, g.pad_left + g.in_cols + MMA_TILE)
    return (max(sizes) <= INT32_MAX and g.in_depth <= INT32_MAX
            and -(-slices // MMA_WARPS) <= MAX_GRID_Y)


def mma_fill(g: Conv2DGeometry) -> float:
    """The fraction of the tensor-core kernel's product blocks (16 out_backprop rows x 8
    columns) that out_backprop fills."""
    return g.out_rows * g.out_cols / (-(-g.out_rows // 16) * 16 * -(-g.out_cols // 8) * 8)


def mma_chosen(g: Conv2DGeometry, dtype, arch: int | None = None) -> bool:
    """Whether the launcher picks the tensor-core kernel by itself: :data:`MMA_BY_DEFAULT`,
    :func:`mma_possible`, a fill of at least :data:`MMA_MIN_FILL` (a function of the geometry
    only), and a GPU with mma.sync (compute capability ``arch``; None: the current device's)."""
    if not (MMA_BY_DEFAULT and mma_possible(g, dtype) and mma_fill(g) >= MMA_MIN_FILL):
        return False
    return (_runtime.compute_capability() if arch is None else arch) >= MMA_ARCH


def pick_mma(g: Conv2DGeometry, dtype, mma: bool | None = None) -> bool:
    """``mma`` if given (True checked against :func:`mma_possible` and the GPU), else
    :func:`mma_chosen`."""
    if mma is None:
        return mma_chosen(g, dtype)
    if mma and not (mma_possible(g, dtype) and _runtime.compute_capability() >= MMA_ARCH):
        raise ValueError("the mma kernel cannot run this geometry (it needs NCHW float16 / bfloat16, a 3x3 or 5x5 "
                         "filter at stride 1 without dilation, multiplier 1 or 2, out_backprop planes of at most "
                         f"{MMA_TILE} x {MMA_TILE}, 32-bit sizes and compute capability 8.0+)")
    return bool(mma)


def mma_chunk(g: Conv2DGeometry, dtype, arrays=()) -> int:
    """The tensor-core kernel's ``vec``: elements per staging load, the widest of
    :data:`MMA_CHUNKS` that divides in_cols and out_cols and to whose bytes every one of
    ``arrays`` is aligned."""
    width = np.dtype(dtype).itemsize
    return next(v for v in MMA_CHUNKS if g.in_cols % v == 0 and g.out_cols % v == 0
                and _runtime.vector_aligned(*arrays, alignment=v * width))


# --------------------------------------------------------------------------- the NHWC tensor-core kernel

def mma_nhwc_channels(g: Conv2DGeometry) -> int:
    """Input channels per CTA of the NHWC tensor-core kernel: 16 at multiplier 1, 8 at 2 (a
    position's out_backprop values of a CTA are 32 bytes either way)."""
    return 16 // g.depth_multiplier


def mma_nhwc_packed(g: Conv2DGeometry) -> bool:
    """Whether the NHWC tensor-core kernel packs images (maps of at most
    :data:`MMA_NHWC_PACKED_SIDE` a side)."""
    return max(g.out_rows, g.out_cols) <= MMA_NHWC_PACKED_SIDE


def mma_nhwc_pack_stride(g: Conv2DGeometry) -> int | None:
    """The packed form's stride S between a unit's images (rows and columns alike): the
    smallest with S >= pad + in_size (each image's input apart from the next one's padding) and
    S >= out_size + K - 1 - pad (an image's taps reach the next one's staged values only where
    they are zeros), and at least out_size; None where S + out_size exceeds the tile."""
    stride = max(g.pad_top + g.in_rows, g.pad_left + g.in_cols, g.out_rows + g.filter_rows - 1 - g.pad_top,
                 g.out_cols + g.filter_cols - 1 - g.pad_left, g.out_rows, g.out_cols)
    return stride if stride + max(g.out_rows, g.out_cols) <= MMA_NHWC_TILE else None


def mma_nhwc_tiles(g: Conv2DGeometry) -> tuple[int, int]:
    """(tiles down, tiles across) of an image: (1, 1) in the packed form."""
    if mma_nhwc_packed(g):
        return 1, 1
    return -(-g.out_rows // MMA_NHWC_TILE), -(-g.out_cols // MMA_NHWC_TILE)


def mma_nhwc_units(g: Conv2DGeometry) -> int:
    """Units of the launch: a tile of one image each, or :data:`MMA_NHWC_PACKED` images packed."""
    if mma_nhwc_packed(g):
        return -(-g.batch // MMA_NHWC_PACKED)
    down, across = mma_nhwc_tiles(g)
    return g.batch * down * across


def mma_nhwc_slicing(g: Conv2DGeometry) -> tuple[int, int]:
    """(slices, units per slice): about :data:`MMA_NHWC_TARGET_CTAS` CTAs with at least
    :data:`MMA_NHWC_MIN_UNITS` units a slice where there are that many, from the geometry alone."""
    return _slices(mma_nhwc_units(g), max(1, g.in_depth // mma_nhwc_channels(g)), MMA_NHWC_TARGET_CTAS,
                   MMA_NHWC_MIN_UNITS)


def mma_nhwc_eligible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the NHWC tensor-core kernel can run ``g`` on a GPU that has it (compute
    capability 8.0+) but for the arrays' alignment: NHWC, float16 / bfloat16, a 3x3 or 5x5
    filter at stride 1 and dilation 1, multiplier 1 or 2, in_depth a multiple of
    :func:`mma_nhwc_channels`, a pack stride where the map is packed
    (:func:`mma_nhwc_pack_stride`), 32-bit offsets (the units' staged input from -pad_top /
    -pad_left to a tile and a filter past the output, their out_backprop tiles, four images
    past the batch where packed, the partial buffer)."""
    if g.data_format != "NHWC" or np.dtype(dtype).name not in MMA_DTYPES:
        return False
    if not (specialised(g) and g.filter_rows in MMA_FILTERS and g.stride_rows == 1
            and g.depth_multiplier in MMA_MULTIPLIERS and g.in_depth % mma_nhwc_channels(g) == 0):
        return False
    if mma_nhwc_packed(g) and mma_nhwc_pack_stride(g) is None:
        return False
    slices, per_slice = mma_nhwc_slicing(g)
    reach = MMA_NHWC_TILE + g.filter_rows
    images = g.batch + MMA_NHWC_PACKED
    sizes = ((images * (g.in_rows + g.pad_top + reach) + g.pad_top) * (g.in_cols + g.pad_left + reach) * g.in_depth,
             (images * (g.out_rows + MMA_NHWC_TILE)) * (g.out_cols + MMA_NHWC_TILE) * g.out_depth,
             slices * g.filter_rows * g.filter_cols * g.out_depth,
             mma_nhwc_units(g) + per_slice)
    return max(sizes) <= INT32_MAX and slices <= MAX_GRID_Y


def mma_nhwc_possible(g: Conv2DGeometry, dtype, arrays=()) -> bool:
    """:func:`mma_nhwc_eligible` and every one of ``arrays`` 16-byte aligned."""
    return mma_nhwc_eligible(g, dtype) and _runtime.vector_aligned(*arrays, alignment=16)


def mma_nhwc_chosen(g: Conv2DGeometry, dtype, arch: int | None = None) -> bool:
    """Whether the launcher takes the NHWC tensor-core kernel by itself for aligned arrays:
    :data:`MMA_BY_DEFAULT`, :func:`mma_nhwc_eligible` and a GPU with mma.sync (compute
    capability ``arch``; None: the current device's).  The launcher takes it wherever it can
    (the static report, benchmarks/README)."""
    if not (MMA_BY_DEFAULT and mma_nhwc_eligible(g, dtype)):
        return False
    return (_runtime.compute_capability() if arch is None else arch) >= MMA_ARCH


def pick_mma_nhwc(g: Conv2DGeometry, dtype, arrays=(), mma: bool | None = None) -> bool:
    """``mma`` if given (True checked against :func:`mma_nhwc_possible` and the GPU), else
    :func:`mma_nhwc_chosen` for 16-byte aligned ``arrays``."""
    if mma is None:
        return _runtime.vector_aligned(*arrays, alignment=16) and mma_nhwc_chosen(g, dtype)
    if mma and not (mma_nhwc_possible(g, dtype, arrays) and _runtime.compute_capability() >= MMA_ARCH):
        raise ValueError("the mma kernel cannot run this geometry (in NHWC it needs float16 / bfloat16, a 3x3 or "
                         "5x5 filter at stride 1 without dilation, multiplier 1 or 2, in_depth a multiple of 16 / "
                         "multiplier, for maps of at most 8 x 8 padding that lets four images share a 16 x 16 tile, "
                         "16-byte aligned arrays, 32-bit sizes and compute capability 8.0+)")
    return bool(mma)


def reduce_needed(slices: int) -> bool:
    """Whether the partial sums need the second kernel: more than one slice.  With one, the
    first kernel writes the result itself (``store_sum``), in every dtype: one slice's sums are
    laid out as the filter gradient (tap-major, then out_backprop channel), and it rounds each as
    the second kernel would (``0 + sum``, then to the result's type: the same bits)."""
    return slices > 1


def fused_reduce(slices: int, block_elements: int, block_threads: int) -> bool:
    """Whether a specialised kernel's launch of ``slices`` slices adds them itself (one launch
    for a few slices): more than one slice and at most :data:`REDUCE_LOADS`, and at most
    :data:`FUSED_MAX_ELEMENTS` of the ``block_elements`` filter elements a ticket owner (a CTA's
    channel block, or a warp's channel) sums for each of its ``block_threads`` threads.  From the
    geometry alone, and the sum's order is the second kernel's: the same bits either way."""
    return 1 < slices <= REDUCE_LOADS and -(-block_elements // block_threads) <= FUSED_MAX_ELEMENTS


def ticket_owners(kernel: str, g: Conv2DGeometry, dtype) -> tuple[int, int, int]:
    """(ticket counters, filter elements of each, threads that sum them) of a specialised
    kernel's launch (``kernel``: "tiled", "planes", "mma" or "mma_nhwc"): a counter per channel
    block of a CTA (tiled, mma_nhwc: 32 (16 double) or 16 out_backprop channels, the CTA's
    threads) or per channel of a warp (planes: out_backprop channels; mma: input channels, each
    with its multiplier's), its K x K taps each."""
    taps = g.filter_rows * g.filter_cols
    if kernel == "tiled":
        return -(-g.out_depth // tiled_channels(dtype)), taps * tiled_channels(dtype), TILED_THREADS
    if kernel == "planes":
        return g.out_depth, taps, 32
    if kernel == "mma":
        return g.in_depth, taps * g.depth_multiplier, 32
    if kernel == "mma_nhwc":
        channels = mma_nhwc_channels(g)
        return g.in_depth // channels, taps * channels * g.depth_multiplier, MMA_NHWC_THREADS
    raise ValueError(f"no ticket owners for {kernel!r}")


def mma_adds_few_slices(g: Conv2DGeometry, chunk: int, arch: int) -> bool:
    """Whether the NCHW tensor-core kernel built for compute capability ``arch`` has the one-launch
    reduction: all but the 3x3 multiplier-1 instantiation of 2-element chunks on 8.0 - 8.9
    (``FEW_SLICES`` in the kernel: the call spilled there)."""
    return not (80 <= arch < 90 and g.filter_rows == 3 and g.depth_multiplier == 1 and chunk == 2)


def reduce_groups(slices: int) -> int:
    """Groups of slices per reduction CTA (threads: REDUCE_ELEMENTS x this): enough that a group
    sums at most REDUCE_LOADS slices, at most REDUCE_MAX_GROUPS.  From the slice count alone,
    so that the summation order (every bit of the result) is the same on every GPU."""
    return max(1, min(REDUCE_MAX_GROUPS, -(-slices // REDUCE_LOADS)))


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
                                            index_bits: int | None = None, tiled: bool | None = None,
                                            staging: int | None = None, items_across: int | None = None,
                                            units_per_slice: int | None = None, planes: bool | None = None,
                                            items_per_slice: int | None = None, pairs: bool | None = None,
                                            lanes: bool | None = None,
                                            columns_per_warp: bool | None = None, mma: bool | None = None,
                                            images_per_slice: int | None = None, async_copies: bool | None = None,
                                            fused: bool | None = None):
    """Filter gradient [filter_rows, filter_cols, in_depth, depth_multiplier] in the input's dtype.

    input: [N, in_rows, in_cols, in_depth], out_backprop: [N, out_rows, out_cols, in_depth *
    depth_multiplier], both in ``g.data_format``, CuPy arrays on the current device, any strides.
    Launches on the current stream without synchronising.  The tests override the automatic
    choices: ``tiled`` (the tiled kernel or the per-element one); for the per-element kernel
    ``slices`` (a target slice count) and ``index_bits`` (32 / 64); for the tiled one
    ``staging`` (0, or the multiplier for 16-byte loads), ``items_across`` (2 / 4),
    ``units_per_slice`` (tiles per slice), ``columns_per_warp`` (how a warp's two work items
    sit in a tile) and ``async_copies`` (asynchronous staging, :data:`ASYNC_BY_DEFAULT`); ``planes`` (NCHW: the planes kernel or the per-element
    one), its ``items_per_slice``, ``pairs`` (window loads in pairs or one value at a time) and
    ``lanes`` (lane blocks, :func:`planes_window_form`);
    ``mma`` (the tensor-core kernel of the layout or not) and its ``images_per_slice`` (NHWC:
    units per slice).  Any override of another kernel leaves the tensor-core kernels out.
    ``fused``: whether a specialised kernel with 2 to :data:`REDUCE_LOADS` slices adds them itself
    (:func:`fused_reduce`); the per-element kernel never does.
    """
    import cupy

    dtype = np.dtype(input.dtype)
    if 0 in g.filter_shape:
        return cupy.empty(g.filter_shape, dtype)
    if 0 in (g.batch, g.out_rows, g.out_cols):  # nothing to sum
        return cupy.zeros(g.filter_shape, dtype)
    x = _runtime.contiguous(input)
    dy = _runtime.contiguous(out_backprop)
    elements = g.filter_rows * g.filter_cols * g.out_depth
    grad = cupy.empty(g.filter_shape, dtype)

    def outputs(slices: int, kernel: str | None = None, possible: bool = True) -> tuple:
        """(partial-sum buffer or None, whether the first kernel adds the slices itself, its
        pointers ``partial``, ``result`` and, for the specialised ``kernel``s
        (:func:`ticket_owners`), ``tickets``): float32 (float64 for float64) partial sums for
        the reduction, or, with one slice, the result itself and no buffer (``partial`` null;
        see ``store_sum``); ``result`` and ``tickets`` not null where the launch has a few slices
        (:func:`fused_reduce`, or ``fused``) and the kernel's build adds them (``possible``)."""
        if not reduce_needed(slices):
            pointers = (np.uint64(0), _runtime.pointer(grad))
            return None, False, pointers + ((np.uint64(0),) if kernel else ())
        partial = cupy.empty((slices * elements,), accumulator_dtype(dtype))
        if kernel is None:
            return partial, False, (_runtime.pointer(partial), np.uint64(0))
        owners, block_elements, block_threads = ticket_owners(kernel, g, dtype)
        one_launch = possible and fused_reduce(slices, block_elements, block_threads) if fused is None else fused
        if one_launch and slices > REDUCE_LOADS:
            raise ValueError(f"one launch sums at most {REDUCE_LOADS} slices, not {slices}")
        if one_launch and not possible:
            raise ValueError("this build of the kernel has no one-launch reduction (mma_adds_few_slices)")
        if not one_launch:
            return partial, False, (_runtime.pointer(partial), np.uint64(0), np.uint64(0))
        tickets = _runtime.ticket_counters(owners)
        return partial, True, (_runtime.pointer(partial), _runtime.pointer(grad), _runtime.pointer(tickets))
    if tiled is None and (slices is not None or index_bits is not None):
        tiled = False  # the per-element kernel's overrides
    if planes is None and tiled is not None:
        planes = False  # ``tiled`` names the NHWC tiled kernel or the per-element one
    others = (planes, items_per_slice, pairs, lanes, staging, items_across, units_per_slice, columns_per_warp, async_copies)
    if mma is None and any(v is not None for v in others):
        mma = False  # the other kernels' overrides
    if g.data_format == "NHWC" and pick_mma_nhwc(g, dtype, (x, dy), mma):
        slices, per_slice = mma_nhwc_slicing(g)
        down, across = mma_nhwc_tiles(g)
        units = mma_nhwc_units(g)
        if images_per_slice is not None:  # units per slice here
            per_slice = images_per_slice
            slices = -(-units // per_slice)
        packed = mma_nhwc_packed(g)
        channels = mma_nhwc_channels(g)  # input channels of a CTA
        partial, one_launch, sums = outputs(slices, "mma_nhwc")
        fn = _runtime.kernel(SOURCE, _mma_nhwc_expression(dtype, g.filter_rows, g.depth_multiplier, packed))
        i32 = _runtime.i32
        fn((g.in_depth // channels, slices), (MMA_NHWC_THREADS,),
           (_runtime.pointer(x), _runtime.pointer(dy), *sums,
            *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.out_rows, g.out_cols, g.pad_top, g.pad_left,
                               down, across, units, per_slice, g.batch,
                               mma_nhwc_pack_stride(g) if packed else 0))))
    elif g.data_format == "NCHW" and pick_mma(g, dtype, mma):
        slices, per_slice = mma_slicing(g)
        if images_per_slice is not None:
            per_slice = images_per_slice
            slices = -(-g.batch // per_slice)
        chunk = mma_chunk(g, dtype, (x, dy))
        partial, one_launch, sums = outputs(slices, "mma", mma_adds_few_slices(g, chunk, _runtime.compute_capability()))
        fn = _runtime.kernel(SOURCE, _mma_expression(dtype, g.filter_rows, g.depth_multiplier, chunk))
        i32 = _runtime.i32
        fn((g.in_depth, -(-slices // MMA_WARPS)), (MMA_THREADS,),
           (_runtime.pointer(x), _runtime.pointer(dy), *sums,
            *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.out_rows, g.out_cols, g.pad_top, g.pad_left,
                               g.batch, per_slice))))
    elif pick_planes(g, dtype, planes):
        down, across = planes_item_counts(g)
        slices = planes_slicing(g)[0] if items_per_slice is None else -(-g.batch * down * across // items_per_slice)
        row0, row1, col0, col1 = planes_interior_box(g)
        interior, border, interior_per_slice, border_per_slice = planes_runs(g, slices)
        partial, one_launch, sums = outputs(slices, "planes")
        form = planes_window_form(g, dtype, x, pairs, lanes)
        fn = _runtime.kernel(SOURCE, _planes_expression(dtype, g.filter_rows, g.stride_rows, form))
        i32 = _runtime.i32
        fn((-(-g.out_depth // PLANES_WARPS), slices), (PLANES_THREADS,),
           (_runtime.pointer(x), _runtime.pointer(dy), *sums,
            *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
                               g.pad_top, g.pad_left, down, across, row0, row1, col0, col1, interior, border,
                               interior_per_slice, border_per_slice, int(planes_lane_loads(g, dtype, dy))))))
    elif pick_tiled(g, dtype, tiled):
        c = pick_items_across(g) if items_across is None else items_across
        slices, per_slice = tiled_slicing(g, dtype, c)
        if units_per_slice is not None:
            per_slice = units_per_slice
            slices = -(-g.batch * math.prod(tile_counts(g, c)) // per_slice)
        mode = staging_mode(g, dtype, x) if staging is None else staging
        if mode and mode != staging_mode(g, dtype, x):
            raise ValueError("16-byte staging needs multiplier 1 or 2, in_depth a multiple of 16 / itemsize and a "
                             "16-byte aligned input")
        down, across = tile_counts(g, c)
        columns = tiled_columns_per_warp(g, c) if columns_per_warp is None else columns_per_warp
        possible = async_possible(g, dtype, x, dy, c)
        copies = (ASYNC_BY_DEFAULT and possible) if async_copies is None else async_copies
        if copies and not (possible and mode == staging_mode(g, dtype, x)):
            raise ValueError("asynchronous staging needs 16-byte staging, out_depth a multiple of 16 / itemsize, a "
                             "16-byte aligned out_backprop, a filter size and stride whose buffers fit in static "
                             "shared memory and compute capability 8.0+")
        blocks = -(-g.out_depth // tiled_channels(dtype))
        partial, one_launch, sums = outputs(slices, "tiled")
        fn = _runtime.kernel(SOURCE, _tiled_expression(dtype, g.filter_rows, g.stride_rows, c, bool(copies)))
        i32 = _runtime.i32
        fn((blocks, slices), (TILED_THREADS,),
           (_runtime.pointer(x), _runtime.pointer(dy), *sums,
            *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
                               g.pad_top, g.pad_left, down, across, g.batch * down * across, per_slice, mode,
                               int(lane_loads(g, dtype, dy)), int(columns)))))
    else:
        if slices is None:
            slices, rows_per_slice = slicing(g)
        else:
            slices, rows_per_slice = slicing(g, target=max(1, slices) * elements)
        work = partial_threads(g, slices)
        threads = min(-(-work // _runtime.BLOCK_1D), _runtime.sm_count() * _runtime.BLOCKS_PER_SM) * _runtime.BLOCK_1D
        narrow = fits_int32(g, slices, threads)
        if index_bits is None:
            index_bits = 32 if narrow else 64
        elif index_bits == 32 and not narrow:
            raise ValueError("32-bit indices cannot address this geometry")
        partial, one_launch, sums = outputs(slices)
        fn = _runtime.kernel(SOURCE, _partial_expression(dtype, g.data_format, index_bits))
        _runtime.launch_1d(fn, work, (_runtime.pointer(x), _runtime.pointer(dy), *sums,
                                       *kernel_scalars(g, slices, rows_per_slice)))
    if not reduce_needed(slices) or one_launch:
        return grad
    reduce = _runtime.kernel(SOURCE, _reduce_expression(dtype))
    reduce((-(-elements // REDUCE_ELEMENTS),), (REDUCE_ELEMENTS * reduce_groups(slices),),
           (_runtime.pointer(partial), _runtime.pointer(grad), _runtime.i64(elements), _runtime.i64(slices)))
    return grad
