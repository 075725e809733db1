"""Launcher for cuda_src/depthwise_conv2d_native_backprop_input.cu.

Six paths (see the .cu file); ``path=`` forces one (the tests run each on small shapes):

* ``tiled``: a CTA per (14 x 8 input-gradient positions at stride 1, 7 x 8 on images of at
  most 7 rows; 8 x 16 at stride 2, 8 x 8 where 16-column tiles would leave half a tile empty,
  :func:`tile_shape`; 32 channels, 16 for float64 and 16 when multiplier 2 is paired, see
  :func:`pair_multipliers`) stages the out_backprop tile with its halo and the filter slice in
  shared memory (16-byte loads when :func:`use_vector_loads` holds), and each thread computes
  7 x 4 (stride 1) or 4 x 4 positions x 2 channels (1 for float64) in registers with 32-bit
  offsets and no division per element.
  Compile-time 3x3 / 5x5 filters at strides 1x1 / 2x2 (:data:`SPECIALISATIONS`), dilation 1,
  every tensor below 2**31 elements and the grid within CUDA's limits (:func:`tiled_eligible`).
* ``mma``: tensor cores on compute capability 8.0+, NCHW float16 / bfloat16, 3x3 / 5x5 filters
  at stride 1, multipliers 1 and 2 (:func:`mma_possible`); a warp computes 16 x 16 positions of
  one plane as mma.sync products of staged out_backprop rows with the filter's banded matrices
  (float sums), recomputing a unit on the CUDA cores where an Inf or NaN met the band's zeros;
  its forms (:func:`mma_form`) stage a unit by rows, a 14 x 14 or 16 x 16 plane whole, or four
  7 x 7 images packed into one unit.  The launcher picks it where the static model predicts it
  faster than ``planes`` (:data:`MMA_CHOICE`, :data:`MMA_PLANE_CHOICE`,
  :data:`MMA_PACKED_CHOICE`, :func:`mma_chosen`).  Its runs form stores a row's results as
  16-byte runs through the warp's tile where in_cols is a multiple of 8; opt-in until a GPU times
  it (``path="mma_runs"``, :data:`MMA_RUNS_BY_DEFAULT`).
* ``mma_nhwc``: the same products for NHWC float16 / bfloat16 (:func:`mma_nhwc_possible`: in_depth a
  multiple of 8; out_backprop 16-byte aligned, else the launcher's choice runs ``tiled``): a CTA of
  8 warps owns 8 channels of a 16 x 16 unit position and takes a run of images, transposing each
  image's staged window into channel planes in shared memory and its results back into 16-byte
  chunks.  The launcher picks it where the static model predicts it faster than ``tiled``
  (:data:`MMA_NHWC_CHOICE`, :func:`mma_nhwc_chosen`).
* ``planes``: NCHW, 3x3 / 5x5 filters at strides 1x1 and 2x2 and dilation 1, any multiplier
  (:func:`planes_possible`): a CTA of 256 threads owns several consecutive channel planes of
  one image and a band of rows across the whole width, stages their out_backprop rows (one
  contiguous run of memory per slice) with a zero border in shared memory, and each thread
  computes 2 x 4 positions per work item (2 x 8 at stride 2, :func:`planes_item_cols`;
  :func:`planes_plan`); at stride 2 bands start at even
  padded rows and the sums take the columns' stride phase at compile time, so only the taps that
  land are computed.  The launcher's NCHW kernel wherever it runs and the tensor cores are not
  chosen (:data:`PLANES_BY_DEFAULT`; ahead of the tiled kernel on 44 of 50 NCHW layer-dtypes
  the H200 timed on 2026-12-04, behind at float32 3x3 stride 2: :data:`PLANES_FLOAT32_TILED`).
  Its staged form (the kernel's STAGED, stride 2) writes the results through shared memory and
  out in whole 32-byte sectors; ``path="planes"`` takes it for narrow maps
  (:func:`planes_staged_narrow`, :data:`PLANES_STAGED_BY_DEFAULT`, the H100's A/B), and
  ``path="planes_staged"`` / ``path="planes_direct"`` force one form or the other.
* ``transpose``: NCHW run as NHWC: out_backprop transposed to NHWC, the ``tiled`` kernel on the
  NHWC twin of the geometry (:func:`nhwc_twin`), the result transposed back (two launches of
  ``_layout``'s batched transpose: 32 x 32 tiles through shared memory, 16-bit elements in
  32-bit pairs on 64 x 64 tiles where sizes and alignment allow).  Each tensor crosses
  DRAM three times instead of once, but measured on an H200 the tiled kernel took 1.6 to 4.6
  times as long in NCHW as in NHWC on the same shapes, so the extra bytes can cost less than
  NCHW's access pattern (``benchmarks/results/nchw_transpose_breakeven.md``).  The same bits
  as ``tiled`` in NCHW: every element sums its taps in the same order in either layout.  Opt-in
  (``path="transpose"``, :data:`TRANSPOSE_BY_DEFAULT`): the H200 timed it on 2026-12-04 behind the
  launcher's kernel on 50 of the 52 NCHW benchmark layer-dtypes (ahead on two float32 layers at
  stride 2: 1.05x and 1.13x).
* ``direct``: the gather kernel, one thread per element with 64-bit offsets: everything else
  (dilations, other filters and strides, tensors past 2**31 elements), and the reference for
  unusual shapes.  Its 3x3 / 5x5 specialisations unroll the tap loops.

Where neither the tensor cores nor the planes kernel can run an NCHW geometry (for example a
row too wide for one staged row of every slice at a large multiplier), the tiled kernel runs it
in its own layout rather than transposing: it stages out_backprop
from the channel planes a row at a time (chunks of 16, 8 or 4 bytes of a row, the widest that
divides the row and the array's alignment, :func:`nchw_chunk_bytes`; any multiplier) into a
position-inner tile (a plane of staged rows per channel, runs of up to 4 columns per
shared-memory store where the chunks' phase allows), reads it 4 columns per 16-byte load, and
stores each work item's rows from registers (4 or 2 columns per store where
:func:`nchw_store_cols` allows).  Each byte of out_backprop and of the result then crosses DRAM
once, where a transpose to NHWC and back would move both tensors three times (read, write the
NHWC copy, read it again); the price is a chunk's 2-8 shared-memory stores against NHWC's one
or two 16-byte ones (about 18-57 SASS instructions per element for float16 against 12-41 in
NHWC, sm_90 static counts with 16-byte chunks; 21-61 with NHWC's channel-inner tile and a result
pass through shared memory, 34-81 before the row staging).

Every path computes every element in a fixed order (bitwise reproducible results) and skips
taps that fall on padding, so an Inf or NaN in the filter reaches only the elements it
multiplies.  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ..._geometry import Conv2DGeometry
from . import _build, _layout, _runtime

SOURCE = "depthwise_conv2d_native_backprop_input.cu"
KERNEL = "gradops::depthwise_conv2d_native_backprop_input"
TILED_KERNEL = "gradops::depthwise_conv2d_native_backprop_input_tiled"
PLANES_KERNEL = "gradops::depthwise_conv2d_native_backprop_input_planes"
MMA_KERNEL = "gradops::depthwise_conv2d_native_backprop_input_mma"
MMA_NHWC_KERNEL = "gradops::depthwise_conv2d_native_backprop_input_mma_nhwc"

#: Template value of each data_format (``gradops::Layout`` in gradops_common.cuh).
LAYOUTS = {"NHWC": 0, "NCHW": 1}

#: Compile-time (filter_rows, filter_cols, stride_rows, stride_cols): the common 3x3 and 5x5
#: filters at unit and 2x2 strides.  The direct kernel runs everything else with its generic
#: (0, 0, 0, 0) instantiation; the tiled kernel runs only these (at dilation 1).
SPECIALISATIONS = ((3, 3, 1, 1), (3, 3, 2, 2), (5, 5, 1, 1), (5, 5, 2, 2))
GENERIC = (0, 0, 0, 0)

#: Kernel paths; tests force each with ``path=``.
PATHS = ("direct", "tiled", "mma", "mma_runs", "mma_nhwc", "planes", "planes_staged", "planes_direct", "transpose")

#: The planes kernel (``_planes``, NCHW): these square filters at these strides (the same on
#: both axes) and dilation 1.
PLANES_FILTERS = (3, 5)
PLANES_STRIDES = (1, 2)
#: Its block (``dwplanes::kThreads``), positions per work item (``kSegment``), static shared
#: memory per CTA (``kSharedBytes``), and the work items a CTA aims for at most (4 a thread:
#: more planes or rows per CTA share its fixed costs; fewer leave more CTAs to fill the GPU).
PLANES_THREADS = 256
PLANES_SEGMENT = 4
#: Rows of a work item (``dwplanes::kItemRows``): a band's items cover its rows rounded up to it.
PLANES_ITEM_ROWS = 2
PLANES_SHARED_BYTES = 24576
PLANES_ITEMS = 4 * PLANES_THREADS
#: out_backprop elements a thread stages per step (``dwplanes::kChunk``).
PLANES_CHUNK = 8
#: Whether the launcher picks the planes kernel by itself for the NCHW shapes it can run where
#: it does not take the tensor cores (False: only when asked for, ``path="planes"``).  The H200
#: measured it on 2026-12-04 (benchmarks/results/gpu_h200_2026-12-04/ncu_ab.md): ahead of the
#: tiled kernel on 44 of the 50 NCHW layer-dtypes, by up to 4.9x (float16 5x5 stride 2), level to
#: 1.07x behind on dw1 / dw3 / dw5 multiplier 2 float32, and behind at 3x3 stride 2 in float32
#: (:data:`PLANES_FLOAT32_TILED`).  The latency-aware estimate (fitted to the H200 run, within 1.5x of 88% of its
#: kernels, where the bound that had kept it opt-in was 1.3-10x optimistic) puts it ahead of the
#: tiled kernel on every NCHW benchmark layer (MobileNetV2, EfficientNet; float16, float32), by
#: 1.23-3.15x on the H100 and 1.05-3.49x on the A100, and by 1.20-2.54x and 1.08-2.79x under its
#: refit at occupancy exponent 0.5 (its 24-48 resident warps per SM against the tiled kernel's
#: 8-16; benchmarks/path_estimates.py, results/path_estimates.md; predicted, not measured).  The H200 measured the tiled kernel 2.2-3.8
#: times slower in NCHW than in NHWC on the same shapes.  scripts/device-session.sh's A/B times
#: both (``--paths tiled,planes,...``); ``path="tiled"`` still forces the tiled kernel.
PLANES_BY_DEFAULT = True
#: The strides at which the launcher takes the planes kernel by itself for float64.  Its double
#: sums hold 32 (3x3) and 16 (5x5) resident warps per SM where the tiled kernel's hold 10-16, and
#: the estimate puts it level with or behind the tiled kernel at stride 1 (56 x 56 3x3 multiplier
#: 1: tiled 1.09x ahead, 1.29x by the refit at exponent 0.5; 14 x 14 5x5: 1.49-1.61x) and ahead at
#: stride 2 (1.09-2.41x, H100; benchmarks/results/path_estimates.md's float64 rows; the
#: benchmark times float64 only on MobileNetV2's dw10, 7 x 7 at stride 1).
PLANES_FLOAT64_STRIDES = (2,)
#: (filter size, stride, multiplier) where the launcher takes the tiled kernel for float32 rather
#: than the planes kernel: 3x3 at stride 2, multiplier 1, where the H200 measured the tiled kernel
#: level or ahead on all four benchmark layers (tiled / planes 0.89-1.01: 56 x 56 0.90, 28 x 28
#: 0.89, 14 x 14 0.90, 112 x 112 1.01; benchmarks/results/gpu_h200_2026-12-04/ncu_ab.md), where in
#: float16 the planes kernel was 1.21-2.35x ahead; at 5x5 stride 2 the planes kernel was
#: 1.39-2.37x ahead in float32.  Multiplier 2 at stride 2 was not measured; the estimate keeps
#: the planes kernel there.  Those were the direct stores: the planes kernel's staged form is
#: ahead of the tiled kernel on all four layers (H100, 2026-12-06: 94.0 / 41.2 / 16.2 / 13.2 us
#: against 101.0 / 41.4 / 18.4 / 25.2, results/gpu_h100_2026-12-06/stride2_ab.md), so the launcher
#: takes the tiled kernel here only where the staged form is not taken (:func:`planes_chosen`).
PLANES_FLOAT32_TILED = frozenset({(3, 2, 1)})

#: Whether the launcher picks the transpose path by itself for the NCHW shapes it can run (False:
#: only when asked for, ``path="transpose"``).  The H200 timed it beside the other paths on
#: 2026-12-04 (benchmarks/results/gpu_h200_2026-12-04/ncu_ab.md): behind the launcher's kernel on
#: 50 of the 52 NCHW benchmark layer-dtypes, ahead on two float32 layers at stride 2 (dw9 14 x 14
#: 3x3 1.05x, dw5x5-5 14 x 14 5x5 1.13x: 27.4 against the planes kernel's 30.9 us), so it stays
#: opt-in.
TRANSPOSE_BY_DEFAULT = False

#: The tensor-core kernel (``_mma``): NCHW half types, these square filters at stride 1 and
#: dilation 1, these multipliers, compute capability 8.0 and newer (mma.sync m16n8k16 with f32
#: accumulation); a warp computes a unit of MMA_UNIT x MMA_UNIT positions, MMA_WARPS warps a CTA.
MMA_FILTERS = (3, 5)
MMA_MULTIPLIERS = (1, 2)
MMA_DTYPES = ("float16", "bfloat16")
MMA_ARCH = 80
MMA_UNIT = 16
MMA_WARPS = 4
#: Where the launcher picks the tensor-core kernel's row form by itself (:func:`mma_chosen`; the
#: whole-plane form: MMA_PLANE_CHOICE): per (filter size K, multiplier), the least fraction of the
#: computed positions that lie inside the image (:func:`mma_fill`: a 7 x 7 map fills 19% of a
#: 16 x 16 unit, 14 x 14 and 28 x 28 maps 77%, multiples of 16 all of it) and the least staging
#: load in elements (:func:`mma_chunk`: 8 where out_cols is a multiple of 8, 4 for 28, 2 for 14);
#: elsewhere the planes kernel runs NCHW.  Measured on an H200 (Nsight Compute kernel times,
#: benchmarks/results/gpu_h200_2026-12-04/ncu_ab.md): on every row-form layer of the benchmark
#: (float16: 112 x 112, 56 x 56 and 28 x 28 maps, 3x3 and 5x5, multipliers 1 and 2) the tensor
#: cores were level with or ahead of the planes kernel (mma / planes 0.70-1.01: 28 x 28 3x3
#: multiplier 2 0.70, 28 x 28 5x5 multiplier 1 0.76, 28 x 28 3x3 multiplier 1 0.85, 112 x 112 3x3
#: multiplier 1 0.89), so every pair takes them wherever the fill holds, whatever the staging
#: chunk.  The latency-aware estimate these entries were read off before (predicted, not
#: measured: results/path_estimates.md) had the planes kernel ahead at multiplier 1 (1.17-1.19x on
#: the H100) and at 28 x 28 3x3 multiplier 2 (1.26x): the measurement reverses both.  The fill
#: bound stays the estimate's (every measured map fills 77% or more).  Not measured on an A100,
#: where the estimate put the planes kernel further ahead at multiplier 1 (1.18-1.47x).
#: Since then the planes kernel's staging stores went 16 bytes wide (session 80), and on the H100
#: (2026-12-06, results/gpu_h100_2026-12-06/ncu_ab.md, float16; the tensor-core kernel's times
#: within 2% of the 2026-12-05 machine's) it is ahead at 3x3 on every row-form layer: mma /
#: planes 1.11 / 1.19 / 1.15 at multiplier 1 (112 x 112, 56 x 56, 28 x 28), 1.10 / 1.02 / 1.08
#: at multiplier 2, as the estimate had said; at 5x5 (28 x 28) 1.04 at multiplier 1, 0.94 at 2.
#: So 3x3 takes the planes kernel there and 5x5 keeps the tensor cores.  The H200 has not timed
#: the planes kernel since session 80 (its 2026-12-04 figures above predate it).
MMA_CHOICE = {(5, 1): (0.75, 1), (5, 2): (0.75, 1)}
#: The (K, multiplier) pairs for which the launcher picks the tensor-core kernel wherever its
#: whole-plane form runs (:func:`mma_plane_chunk`: one unit a plane, 14 x 14 and 16 x 16 maps),
#: in place of MMA_CHOICE's test: all of them, by the same estimate (the benchmark's 14 x 14
#: layers: 3x3 multiplier 1 1.14-1.29x ahead of the planes kernel on the H100 and 1.10-1.18x on
#: the A100, level by the refit at exponent 0.5; multiplier 2 and 5x5 1.4-2.2x ahead).
MMA_PLANE_CHOICE = frozenset({(3, 1), (3, 2), (5, 1), (5, 2)})
#: The same for the packed form (:func:`mma_pack_stride`: four 7 x 7 images a unit), by the same
#: estimate: 5x5 (1.28-1.35x ahead of the planes kernel on the H100); at 3x3 the planes kernel is
#: ahead or level (multiplier 1: 1.43x on the H100, 1.50x on the A100; multiplier 2 1.06x, level on
#: the A100).
MMA_PACKED_CHOICE = frozenset({(5, 1), (5, 2)})
#: Units a warp takes at most (it builds its filter fragments once for all of them), and the
#: warps a launch aims for before it gives a warp more than one unit (enough to fill any GPU's
#: SMs several times; the choice depends on the geometry only, never on the GPU).
MMA_UNITS_PER_WARP = 8
MMA_TARGET_WARPS = 8192
#: Whether the launcher picks the tensor-core kernel by itself where :data:`MMA_CHOICE` says so
#: (False: only when asked for, ``path="mma"``).
MMA_BY_DEFAULT = True

#: The NHWC tensor-core kernel (``_mma_nhwc``): the same filters, strides, multipliers, dtypes and
#: compute capabilities as the _mma kernel, NHWC with in_depth a multiple of MMA_NHWC_CHANNELS (a
#: CTA's input channels, one a warp: a position's out_backprop values of them are whole 16-byte
#: chunks) and out_backprop 16-byte aligned; a CTA of MMA_NHWC_THREADS takes one unit position
#: (MMA_UNIT x MMA_UNIT) of its channels in a run of images.
MMA_NHWC_CHANNELS = 8
MMA_NHWC_THREADS = 256
#: Images a CTA takes at most (it builds its bands once for all of them), and the CTAs a launch
#: aims for before it gives a CTA more than one (the geometry alone decides, never the GPU).
MMA_NHWC_IMAGES_PER_CTA = 8
MMA_NHWC_TARGET_CTAS = 1024
#: Where the launcher picks the NHWC tensor-core kernel by itself (:func:`mma_nhwc_chosen`): per
#: (filter size K, multiplier), the least fraction of the computed positions inside the image
#: (:func:`mma_fill`: 77% for the 14 x 14 .. 112 x 112 maps of 224 x 224 networks, 19% for 7 x 7)
#: and the least units a map (:func:`mma_units`).  Read off the latency-aware estimate of the
#: benchmark's NHWC float16 layers, H100 and A100 (benchmarks/path_estimates.py,
#: results/path_estimates.md; predicted, not measured): 5x5 at multiplier 2 1.40-1.49x ahead of
#: the tiled kernel on the H100 (1.8-2.0x on the A100), whose float sums alone (50 FFMA an element)
#: use 70% of the issue budget of 75% of HBM; 3x3 at multiplier 2 1.13x on 112 x 112 (49 units a
#: map; A100 1.22x), behind from 56 x 56 (16 units: 0.93x) down (0.88x at 14 x 14), where a CTA's
#: fixed costs and its images' round trips weigh more; at multiplier 1 the tiled kernel is ahead
#: or level on the H100 (1.5-1.8x at 3x3, level to 1.09x at 5x5, where the A100 would gain
#: 1.17-1.33x from the tensor cores: the choice does not depend on the GPU).
MMA_NHWC_CHOICE = {(5, 2): (0.75, 1), (3, 2): (0.75, 32)}
#: Whether the launcher picks the NHWC tensor-core kernel by itself where MMA_NHWC_CHOICE says so
#: (False: only when asked for, ``path="mma_nhwc"``).  Off since the H200 measured it
#: (benchmarks/results/gpu_h200_2026-12-04/ncu_ab.md, float16): behind the tiled kernel on every
#: NHWC layer it could run (14), 1.02-2.1x: where it was chosen, 112 x 112 3x3 multiplier 2 1.31x,
#: 28 x 28 5x5 multiplier 2 1.17x, 14 x 14 5x5 multiplier 2 1.02-1.03x, where the estimate above
#: had it 1.13-1.49x ahead.  Not measured on an A100.
MMA_NHWC_BY_DEFAULT = False

#: Bytes of accumulators per staged position (``dwconv::kPositionBytes``: 32 float or 16 double
#: channels per CTA) and per thread (``kLaneBytes``: 2 float or 1 double channels).
POSITION_BYTES = 128
LANE_BYTES = 8
#: At least the rows or columns of any tile: the size checks leave this much headroom.
TILE_SPAN = 16
#: The tiled kernel's sizes and offsets are 32-bit ints.
INT32_MAX = 2**31 - 1


def _expression(dtype, data_format: str, shape: tuple[int, int, int, int]) -> str:
    element, accumulator = _build.c_types(dtype)
    kh, kw, sh, sw = shape
    return f"{KERNEL}<{element}, {accumulator}, {LAYOUTS[data_format]}, {kh}, {kw}, {sh}, {sw}>"


#: The tiled kernel's filter shapes with 7 x 4 work items (``dwconv::Shape::TALL``: stride 1):
#: 2 of them across a tile, where the stride-2 ones have 4 of 4 x 4.
TALL = ((3, 3, 1, 1), (5, 5, 1, 1))


def full_item_cols(shape: tuple[int, int, int, int]) -> int:
    """Work items across a full tile (the kernel's ``C``): 4, or 2 for :data:`TALL`."""
    return 2 if shape in TALL else 4


def _tiled_expression(dtype, data_format: str, shape: tuple[int, int, int, int], item_rows: int = 2,
                      item_cols: int | None = None) -> str:
    element, accumulator = _build.c_types(dtype)
    kh, kw, sh, sw = shape
    item_cols = full_item_cols(shape) if item_cols is None else item_cols
    return (f"{TILED_KERNEL}<{element}, {accumulator}, {LAYOUTS[data_format]}, {kh}, {kw}, {sh}, {sw}, {item_rows}, "
            f"{item_cols}>")


#: The tiled instantiations with one work item down a tile (``R`` = 1): the stride-1 ones.
SHORT_TILES = TALL
#: The tiled instantiations with two work items across a tile (``C`` = 2, 8 x 8 positions)
#: besides :data:`TALL`'s full ones: every other specialisation.
NARROW_TILES = tuple(shape for shape in SPECIALISATIONS if shape not in TALL)


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for on compute capability ``arch`` (None: any):
    per dtype and layout, the direct kernel's specialisations and generic form, then the tiled
    kernel's, the batched transposes; from sm_80, the tensor-core kernel's."""
    names = []
    for dtype in _build.C_TYPES:
        for data_format in LAYOUTS:
            names += [_expression(dtype, data_format, shape) for shape in (*SPECIALISATIONS, GENERIC)]
            names += [_tiled_expression(dtype, data_format, shape) for shape in SPECIALISATIONS]
            names += [_tiled_expression(dtype, data_format, shape, 1) for shape in SHORT_TILES]
            names += [_tiled_expression(dtype, data_format, shape, 2, 2) for shape in NARROW_TILES]
        names += [_planes_expression(dtype, k, s, staged) for k in PLANES_FILTERS for s in PLANES_STRIDES
                  for staged in ((False, True) if s in PLANES_STAGED_STRIDES else (False,))]
    names += _layout.expressions()  # the transpose path's
    if arch is None or arch >= MMA_ARCH:  # mma.sync m16n8k16 needs sm_80
        names += [_mma_expression(dtype, k, m, form) for dtype in MMA_DTYPES for k in MMA_FILTERS
                  for m in MMA_MULTIPLIERS for form in range(len(MMA_FORMS))]
        names += [_mma_nhwc_expression(dtype, k, m) for dtype in MMA_DTYPES for k in MMA_FILTERS
                  for m in MMA_MULTIPLIERS]
    return {SOURCE: names}


def _planes_expression(dtype, filter_size: int, stride: int, staged: bool = False) -> str:
    element, accumulator = _build.c_types(dtype)
    staged_flag = ", true" if staged else ""
    return f"{PLANES_KERNEL}<{element}, {accumulator}, {filter_size}, {filter_size}, {stride}{staged_flag}>"


def _mma_expression(dtype, filter_size: int, multiplier: int, form: int = 0) -> str:
    element, _ = _build.c_types(dtype)
    return f"{MMA_KERNEL}<{element}, {filter_size}, {multiplier}{f', {form}' if form else ''}>"


def _mma_nhwc_expression(dtype, filter_size: int, multiplier: int) -> str:
    element, _ = _build.c_types(dtype)
    return f"{MMA_NHWC_KERNEL}<{element}, {filter_size}, {multiplier}>"


def specialisation(g: Conv2DGeometry) -> tuple[int, int, int, int]:
    """The compile-time (KH, KW, SH, SW) the direct kernel runs with for ``g``, or GENERIC."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    return shape if shape in SPECIALISATIONS else GENERIC


def kernel_scalars(g: Conv2DGeometry) -> tuple[np.int64, ...]:
    """The direct kernel's ``long long`` parameters, in order, after its three pointers."""
    return tuple(_runtime.i64(v) for v in (
        g.batch, g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
        g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols, g.dilation_rows, g.dilation_cols,
        g.pad_top, g.pad_left))


def tile_channels(dtype) -> int:
    """Channels per CTA of the tiled kernel (``dwconv::Block<Acc>::CHANNELS``): 32, or 16 for
    float64 (whose accumulators are twice as wide)."""
    return POSITION_BYTES // np.dtype(_accumulator(dtype)).itemsize


def item_rows_per_tile(g: Conv2DGeometry) -> int:
    """Work items down a tile (the kernel's ``R``): 2, or 1 for a stride-1 image of at most 7
    rows (one work item's), which a 14-row tile would half fill."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    return 1 if shape in SHORT_TILES and g.in_rows <= 7 else 2


def item_cols_per_tile(g: Conv2DGeometry) -> int:
    """Work items across a tile (the kernel's ``C``): 2 at stride 1 (:data:`TALL`); at stride 2,
    4, or 2 where 8-column tiles cover the image's columns, counted from the first tile's start
    (pad_left % stride_cols columns before the image), with fewer columns than 16-column ones:
    where the last 16-column tile would be at most half inside the image.  A 7 x 7 map fills 77%
    of an 8 x 8 tile against 38% of an 8 x 16 one, a 56-column map 100% against 87.5%.  Elsewhere
    16-column tiles, whose staged halo and fixed costs per CTA are spread over twice the
    positions (the static model predicts the narrow tile 0-10% dearer per element where both
    cover the image alike, 28 or 112 columns)."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    cols = g.in_cols + g.pad_left % g.stride_cols
    if shape in NARROW_TILES and -(-cols // 8) * 8 < -(-cols // 16) * 16:
        return 2
    return full_item_cols(shape)


def pick_item_cols(g: Conv2DGeometry, narrow: bool | None = None) -> int:
    """Work items across a tile: :func:`item_cols_per_tile`'s choice, or (``narrow``, tests and
    the static model of revisions without narrow tiles) 2 or the full tile's; True raises at
    stride 1, whose full tile is already two work items wide."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    if narrow is None:
        return item_cols_per_tile(g)
    if narrow and shape not in NARROW_TILES:
        raise ValueError("narrow tiles are for the stride-2 filters (3x3 and 5x5 at stride 2)")
    return 2 if narrow else full_item_cols(shape)


def tile_shape(g: Conv2DGeometry, item_cols: int | None = None) -> tuple[int, int, int]:
    """(tile rows, tile cols, work items) of the tiled kernel for ``g`` (``dwconv::Shape``):
    at stride 2, 8 x 16 positions in 8 work items of 4 x 4 (8 x 8 in 4, :func:`item_cols_per_tile`);
    at stride 1, 14 x 8 in 4 of 7 x 4 (7 x 8 in 2 for images of at most 7 rows).
    ``item_cols``: work items across (:func:`pick_item_cols`; None: the launcher's choice)."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    rows, cols = item_rows_per_tile(g), (item_cols_per_tile(g) if item_cols is None else item_cols)
    item_rows = 7 if shape in TALL else 4
    return item_rows * rows, 4 * cols, rows * cols


def tile_threads(g: Conv2DGeometry, item_cols: int | None = None) -> int:
    """Threads per CTA of the tiled kernel: one per (lane of LANE_BYTES, work item): 128, or 64
    for narrow tiles and at stride 1 (32 for its short tiles)."""
    return POSITION_BYTES // LANE_BYTES * tile_shape(g, item_cols)[2]


def tiles(g: Conv2DGeometry, item_cols: int | None = None) -> tuple[int, int]:
    """(tiles across, tiles down).  ``item_cols``: as :func:`tile_shape`."""
    rows, cols, _ = tile_shape(g, item_cols)
    return tile_counts(g, rows, cols)


def tile_counts(g: Conv2DGeometry, rows: int, cols: int) -> tuple[int, int]:
    """(tiles across, tiles down) of ``rows`` x ``cols`` tiles.  Tiles start at a multiple of the
    stride in padded coordinates, so with an odd pad and stride 2 the first starts one position
    before the image."""
    return (-(-(g.in_cols + g.pad_left % g.stride_cols) // cols),
            -(-(g.in_rows + g.pad_top % g.stride_rows) // rows))


def columns_per_warp(g: Conv2DGeometry, item_cols: int | None = None) -> bool:
    """How a warp's two work items sit in a tile of two item rows (the kernel's
    ``columns_per_warp``): one above the other (True) or side by side (False), whichever idles
    more whole warps where the image ends inside the last tile row or column; an idle warp skips
    the inner loop, a warp with one empty work item does not."""
    rows, cols, items = tile_shape(g, item_cols)
    if item_rows_per_tile(g) != 2:
        return False
    across_items = items // 2
    item_rows, item_cols = rows // 2, cols // across_items
    across, down = tiles(g, item_cols)
    spare_cols = (across * cols - g.pad_left % g.stride_cols - g.in_cols) // item_cols  # item columns past the image
    spare_rows = (down * rows - g.pad_top % g.stride_rows - g.in_rows) // item_rows
    idle_columns = spare_cols * down
    idle_sides = spare_rows * (across_items // 2) * across + 2 * (spare_cols // 2) * down
    return idle_columns > idle_sides


def pair_multipliers(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tiled kernel pairs multipliers (its ``pair_multipliers``): multiplier 2 with
    float accumulators, whose two channels per thread then hold both multiplier slices of one
    input channel.  A CTA then owns half as many input channels and stages both slices at once
    (with 16-byte loads where :func:`use_vector_loads` holds) instead of one slice per pass."""
    return g.depth_multiplier == 2 and LANE_BYTES // np.dtype(_accumulator(dtype)).itemsize == 2


def _accumulator(dtype):
    return np.float64 if _build.c_types(dtype)[1] == "double" else np.float32


def input_channels_per_cta(g: Conv2DGeometry, dtype) -> int:
    """Input channels per CTA of the tiled kernel: :func:`tile_channels`, halved when paired."""
    return tile_channels(dtype) // (2 if pair_multipliers(g, dtype) else 1)


def tile_grid(g: Conv2DGeometry, dtype, item_cols: int | None = None) -> tuple[int, int, int]:
    """The tiled kernel's grid: (tiles across x channel blocks, tiles down, batch)."""
    across, down = tiles(g, item_cols)
    return across * -(-g.in_depth // input_channels_per_cta(g, dtype)), down, g.batch


def _offsets_fit_int32(g: Conv2DGeometry) -> bool:
    """Every tensor, and every padded coordinate and staged row or column of a last tile or band
    (TILE_SPAN past the image), below 2**31: the tiled and planes kernels' int offsets."""
    out_depth = g.in_depth * g.depth_multiplier
    sizes = (g.batch * g.in_rows * g.in_cols * g.in_depth, g.batch * g.out_rows * g.out_cols * out_depth,
             g.filter_rows * g.filter_cols * out_depth,
             g.pad_top + g.in_rows + 2 * TILE_SPAN, g.pad_left + g.in_cols + 2 * TILE_SPAN,
             g.out_rows + 2 * TILE_SPAN, g.out_cols + 2 * TILE_SPAN)
    return max(sizes) <= INT32_MAX


def tiled_eligible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tiled kernel can run ``g``: a specialised filter and stride at dilation 1,
    every tensor and every size or offset it computes in 32-bit range, and the grid within
    CUDA's limits."""
    if (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols) not in SPECIALISATIONS:
        return False
    if (g.dilation_rows, g.dilation_cols) != (1, 1):
        return False
    if not _offsets_fit_int32(g):
        return False
    across, down, batch = tile_grid(g, dtype)
    return across <= INT32_MAX and down <= _runtime.GRID_YZ_LIMIT and batch <= _runtime.GRID_YZ_LIMIT


def vector_loads_possible(g: Conv2DGeometry, dtype) -> bool:
    """The part of :func:`use_vector_loads` that does not depend on the arrays: NHWC, multiplier
    1 or paired and out_backprop channels a multiple of the vector width; NCHW, out_backprop
    rows (out_cols) a multiple of it, any multiplier."""
    if g.data_format == "NCHW":  # the widest chunk is a 16-byte one
        return nchw_chunk_bytes(g, dtype) == _runtime.VECTOR_BYTES
    one_slice = g.depth_multiplier == 1 or pair_multipliers(g, dtype)
    return one_slice and (g.in_depth * g.depth_multiplier) % _runtime.vector_width(dtype) == 0


#: NCHW staging chunks (bytes) and their bits in the kernel's ``vector_loads``.
NCHW_CHUNK_BITS = {16: 1, 8: 4, 4: 8}
#: NCHW result stores of 4 or 2 columns (:func:`nchw_store_cols`) and their bits in ``vector_loads``.
NCHW_STORE_BITS = {4: 2, 2: 16, 1: 0}


def nchw_chunk_bytes(g: Conv2DGeometry, dtype, arrays=()) -> int:
    """NCHW staging: the widest chunk (16, 8 or 4 bytes, more than one element) that divides an
    out_backprop row (out_cols x itemsize) and to which ``arrays`` (out_backprop) are aligned,
    or the element size (one element per load)."""
    itemsize = np.dtype(dtype).itemsize
    for chunk in NCHW_CHUNK_BITS:
        if (chunk > itemsize and g.out_cols * itemsize % chunk == 0
                and all(int(_runtime.pointer(a)) % chunk == 0 for a in arrays)):
            return chunk
    return itemsize


def staged_col_origin(g: Conv2DGeometry) -> int:
    """The out_backprop column of staged column 0 in the NCHW staging of the tiled and planes
    kernels (their ``o_col0`` of the first tile, ``col_origin``): pad_left / stride_cols - HALO."""
    return g.pad_left // g.stride_cols - (g.filter_cols - 1) // g.stride_cols


def nchw_staging_run(g: Conv2DGeometry, chunk_elements: int) -> int:
    """NCHW staging (``stage_planes``): columns per shared-memory store, RUN = min(chunk_elements,
    4) where every tile's first staged out_backprop column, ``o_col0 = pad_left / stride_cols +
    tile_col * TILE_COLS / stride_cols - HALO``, is a multiple of RUN, else 1 (element by
    element).  TILE_COLS / stride_cols is a multiple of 4, so one residue holds for every tile.
    SAME padding gives o_col0 = -1 (mod 4) at 3x3 and -2 at 5x5: element stores but for runs of
    2 (chunks of 2 elements) at 5x5."""
    run = min(chunk_elements, 4)
    return run if run > 1 and staged_col_origin(g) % run == 0 else 1


def nchw_store_cols(g: Conv2DGeometry) -> int:
    """NCHW: columns per result store of the tiled kernel (:data:`NCHW_STORE_BITS`): 4 where
    in_cols and every tile's first column are multiples of 4 (tiles start pad_left %
    stride_cols columns before the image), 2 where they are even (14-column maps), else 1; 1
    for NHWC.  in_backprop is a fresh allocation, so aligned."""
    if g.data_format != "NCHW" or g.pad_left % g.stride_cols:
        return 1
    return 4 if g.in_cols % 4 == 0 else 2 if g.in_cols % 2 == 0 else 1


def use_vector_loads(g: Conv2DGeometry, dtype, arrays, vector: bool | None = None) -> bool:
    """Whether the tiled kernel stages with 16-byte loads: NHWC, multiplier 1 or paired
    (:func:`pair_multipliers`), an out_backprop channel count that is a multiple of 16 / itemsize
    (so no load straddles a position) and 16-byte aligned arrays; NCHW (chunks of plane rows),
    out_cols a multiple of 16 / itemsize (every row starts aligned) and an aligned out_backprop,
    any multiplier.  ``vector`` (tests) forces the choice; True raises when it cannot hold."""
    chunk = _runtime.vector_width(dtype)  # dwconv::kVectorBytes
    eligible = vector_loads_possible(g, dtype) and _runtime.vector_aligned(*arrays)
    if vector is None:
        return eligible
    if vector and not eligible:
        if g.data_format == "NCHW":
            raise ValueError(f"vector loads need (NCHW) out_backprop rows of a multiple of {chunk} elements and a "
                             f"16-byte aligned out_backprop")
        raise ValueError(f"vector loads need NHWC, multiplier 1 (or 2 with float accumulators), an out_backprop "
                         f"channel count that is a multiple of {chunk} and 16-byte aligned arrays")
    return bool(vector)


def mma_units(g: Conv2DGeometry) -> tuple[int, int]:
    """The tensor-core kernel's units (MMA_UNIT x MMA_UNIT positions of one image's plane) down
    and across a plane."""
    return -(-g.in_rows // MMA_UNIT), -(-g.in_cols // MMA_UNIT)


def mma_fill(g: Conv2DGeometry) -> float:
    """The fraction of the positions the tensor-core kernel computes that lie inside the image."""
    down, across = mma_units(g)
    return g.in_rows * g.in_cols / (down * across * MMA_UNIT * MMA_UNIT)


def _mma_products_take(g: Conv2DGeometry, dtype, data_format: str) -> bool:
    """Whether the tensor-core kernels' band products take ``g`` in ``data_format``: float16 /
    bfloat16, a square filter of :data:`MMA_FILTERS` at stride 1 and dilation 1, a multiplier of
    :data:`MMA_MULTIPLIERS`."""
    return (g.data_format == data_format and np.dtype(dtype).name in MMA_DTYPES and g.filter_rows == g.filter_cols
            and g.filter_rows in MMA_FILTERS and g.depth_multiplier in MMA_MULTIPLIERS
            and (g.stride_rows, g.stride_cols, g.dilation_rows, g.dilation_cols) == (1, 1, 1, 1))


def mma_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the tensor-core kernel can run ``g`` on a GPU that has it (compute capability
    8.0+): NCHW, float16 / bfloat16, a 3x3 or 5x5 filter at stride 1 and dilation 1, multiplier
    1 or 2, every tensor and every offset of a unit in 32-bit range, in_depth within grid y."""
    if not _mma_products_take(g, dtype, "NCHW"):
        return False
    out_depth = g.in_depth * g.depth_multiplier
    down, across = mma_units(g)
    sizes = (g.batch * g.in_rows * g.in_cols * g.in_depth, g.batch * g.out_rows * g.out_cols * out_depth,
             g.filter_rows * g.filter_cols * out_depth, down * across, g.batch + MMA_WARPS * MMA_UNITS_PER_WARP,
             # a unit's padded coordinates and staged rows / columns (32 past its first)
             g.pad_top + g.in_rows + 2 * MMA_UNIT, g.pad_left + g.in_cols + 4 * MMA_UNIT)
    return (max(sizes) <= INT32_MAX and g.in_depth <= _runtime.GRID_YZ_LIMIT
            and mma_grid(g)[2] <= _runtime.GRID_YZ_LIMIT)


def mma_chosen(g: Conv2DGeometry, dtype, arch: int | None = None) -> bool:
    """Whether the launcher picks the tensor-core kernel by itself: :data:`MMA_BY_DEFAULT`,
    :func:`mma_possible`, where the whole-plane or packed form runs (:func:`mma_form`) the filter
    size and multiplier in :data:`MMA_PLANE_CHOICE` / :data:`MMA_PACKED_CHOICE`, elsewhere the fill and staging chunk :data:`MMA_CHOICE` asks of
    them (for aligned arrays: the choice depends on the geometry only), and a GPU with mma.sync
    (compute capability ``arch``; None: the current device's)."""
    if not (MMA_BY_DEFAULT and mma_possible(g, dtype)):
        return False
    key = (g.filter_rows, g.depth_multiplier)
    form = MMA_FORMS[mma_form(g, dtype)]
    if form in ("plane", "packed"):
        if key not in (MMA_PACKED_CHOICE if form == "packed" else MMA_PLANE_CHOICE):
            return False
    else:
        least = MMA_CHOICE.get(key)
        if least is None or mma_fill(g) < least[0] or mma_chunk(g, dtype) < least[1]:
            return False
    return (_runtime.compute_capability() if arch is None else arch) >= MMA_ARCH


def mma_expression(g: Conv2DGeometry, dtype, out_backprop=None, runs: bool | None = None) -> str:
    """The name expression of the tensor-core instantiation for ``g`` (its :func:`mma_form` for
    the call's out_backprop, None: an aligned one, and ``runs``)."""
    return _mma_expression(dtype, g.filter_rows, g.depth_multiplier, mma_form(g, dtype, out_backprop, runs))


#: The tensor-core kernel's forms (its FORM template argument is the index): units staged by rows
#: (``chunk``), whole planes (:func:`mma_plane_chunk`), four images packed a unit
#: (:func:`mma_pack_stride`), and rows whose results go out as each row's two 16-byte runs from
#: an image of the unit in the warp's tile (in_cols a multiple of 8; the rows form stores a lane's
#: pairs straight from its accumulators).
MMA_FORMS = ("rows", "plane", "packed", "runs")
#: Whether the launcher takes the runs form where it can run.  Why: on the H100 (2026-12-05,
#: benchmarks/results/gpu_h100_2026-12-05/full_sections.md, dw1 112x112x32 float16 NCHW) the
#: rows form held L2 at 75% of its peak and DRAM at 33%, with 40% of its global sectors in excess
#: of the requests' bytes.  Counted per unit (16 x 16 results of one plane; SAME 3x3: a staged
#: row's 32 columns from 8 before the unit span 3 sectors): its staging loads touch 54 sectors (18
#: rows of 3) and its pair stores 32 (four instructions, each on 8 rows' sectors half), 34 of those
#: 86 in excess, the measured 40%.  The runs store the same 16 sectors once each (86 -> 70 a unit)
#: for one shared-memory round trip of the warp's results.  Opt-in (``path="mma_runs"``, or
#: ``runs=True`` to :func:`mma_form`): the H100 timed it on 2026-12-06
#: (results/gpu_h100_2026-12-06/ncu_ab.md, float16) and the stores did fill their sectors (result
#: bytes per store sector 16 -> 32 on 112 columns, 16 -> 20.4 on 56), but the kernel did not get
#: faster: dw1 multiplier 1 35.0 -> 36.5 us, multiplier 2 54.6 -> 54.4, dw3 42.7 -> 48.8 and
#: 67.1 -> 69.3; the rows form's stalls are the staging loads' (long scoreboard 59% of its stall
#: cycles, full_sections.md there), not its stores.  Its instantiations also take more registers
#: on some GPUs and compilers, fewer CTAs an SM (install-check compiles, 2026-12-06: NVRTC 13.5
#: keeps every one's CTAs on sm_80 and sm_90 and loses some on sm_86-89 and sm_100-121, 3x3
#: multiplier 2 8 -> 4 on sm_86; NVRTC 12.9 loses sm_90 float16 3x3 multiplier 1, 5 -> 4).
MMA_RUNS_BY_DEFAULT = False


def mma_form(g: Conv2DGeometry, dtype, out_backprop=None, runs: bool | None = None) -> int:
    """The form the tensor-core kernel takes for ``g`` (an index of :data:`MMA_FORMS`): packed
    where :func:`mma_pack_stride` allows, else whole planes where :func:`mma_plane_chunk` does
    (for the call's out_backprop; None: an aligned one), else runs where in_cols is a multiple of
    8 and ``runs`` asks for them (None: :data:`MMA_RUNS_BY_DEFAULT`), else rows."""
    if mma_pack_stride(g):
        return MMA_FORMS.index("packed")
    if mma_plane_chunk(g, dtype, out_backprop):
        return MMA_FORMS.index("plane")
    wanted = MMA_RUNS_BY_DEFAULT if runs is None else runs
    return MMA_FORMS.index("runs" if wanted and g.in_cols % 8 == 0 else "rows")


def mma_runs_possible(g: Conv2DGeometry, dtype, out_backprop=None) -> bool:
    """Whether the runs form can run ``g`` when asked for (:func:`mma_form` with runs=True): the
    rows form's maps (for the call's out_backprop; None: an aligned one) with in_cols a multiple
    of 8."""
    return MMA_FORMS[mma_form(g, dtype, out_backprop, runs=True)] == "runs"


def mma_chunk(g: Conv2DGeometry, dtype, out_backprop=None) -> int:
    """The tensor-core kernel's staging loads: elements per load (8, 4 or 2: 16, 8 or 4 bytes,
    the widest that divides an out_backprop row and to which out_backprop is aligned), else 1."""
    return nchw_chunk_bytes(g, dtype, () if out_backprop is None else (out_backprop,)) // np.dtype(dtype).itemsize


#: Whole-plane staging of the tensor-core kernel (``dwmma::stage_plane``): elements per load it
#: may take (16 or 8 bytes of halves), and the chunks a plane may have (``kPlaneSteps`` x 32).
MMA_PLANE_CHUNKS = (8, 4)
MMA_PLANE_MAX_CHUNKS = 64
#: Columns of the tensor-core kernel's staged window (``dwmma::kStagedCols``).
MMA_STAGED_COLS = 32


def mma_window_col0(g: Conv2DGeometry) -> int:
    """The first out_backprop column of the staged window of a unit at column 0 (the kernel's
    ``a0``): pad_left - (K - 1), less the shift that makes it a multiple of 8 (16-byte aligned
    ldmatrix rows)."""
    first = g.pad_left - (g.filter_cols - 1)
    return first - first % 8


def mma_plane_chunk(g: Conv2DGeometry, dtype, out_backprop=None) -> int:
    """The tensor-core kernel's whole-plane staging (``plane_chunk``): elements per load (8 or 4,
    the widest that divides a plane and to which out_backprop is aligned) where one unit covers
    the image, the unit's staged window (rows pad_top - (K - 1) .., 16 + K - 1 of them; columns
    from a0 = pad_left - (K - 1) - shift, shift making a0 a multiple of 8, 32 of them) holds the
    whole out_backprop plane, out_cols is even (a chunk is stored as pairs of one row) and the
    plane has at most :data:`MMA_PLANE_MAX_CHUNKS` chunks; else 0 (rows staged, :func:`mma_chunk`)."""
    k = g.filter_rows
    o_row0 = g.pad_top - (k - 1)
    a0 = mma_window_col0(g)
    if (mma_units(g) != (1, 1) or o_row0 > 0 or g.out_rows - o_row0 > MMA_UNIT + k - 1 or a0 > 0
            or g.out_cols - a0 > MMA_STAGED_COLS or g.out_cols % 2):
        return 0
    itemsize = np.dtype(dtype).itemsize
    size = g.out_rows * g.out_cols
    for vec in MMA_PLANE_CHUNKS:
        if (size % vec == 0 and size // vec <= MMA_PLANE_MAX_CHUNKS
                and (out_backprop is None or int(_runtime.pointer(out_backprop)) % (vec * itemsize) == 0)):
            return vec
    return 0


#: Images a unit of the packed form holds (2 x 2) and the elements a lane stages of them at most
#: (``dwmma::kPackSteps`` x 32 for all four planes).
MMA_PACK_IMAGES = 4
MMA_PACK_MAX_ELEMENTS = 7 * 32


def mma_pack_stride(g: Conv2DGeometry) -> int:
    """The packed form's stride S (``pack_stride``): four images a unit, image p at unit row
    (p // 2) S and column (p % 2) S, where S keeps each image's reads of the staged tile off the
    others' out_backprop: S >= rows + pad_top (the last row's reads end before the next image's
    first out_backprop row) and S >= K - pad_top + out_rows - 1 (the next image's reads begin after
    this one's last), the same for columns; 0 where the images do not fit a unit (S + rows <= 16),
    their out_backprop does not fit the staged window (pads past K - 1, S + out_rows - pad_top >
    16, columns past the 32 staged), the four planes have more than :data:`MMA_PACK_MAX_ELEMENTS`
    elements or four images' offsets pass 32 bits."""
    k = g.filter_rows
    if g.pad_top > k - 1 or g.pad_left > k - 1:
        return 0
    stride = max(g.in_rows + g.pad_top, k - g.pad_top + g.out_rows - 1,
                 g.in_cols + g.pad_left, k - g.pad_left + g.out_cols - 1)
    a0 = mma_window_col0(g)
    out_depth = g.in_depth * g.depth_multiplier
    if (stride + max(g.in_rows, g.in_cols) > MMA_UNIT or stride + g.out_rows - g.pad_top > MMA_UNIT
            or stride + g.out_cols - 1 - a0 >= MMA_STAGED_COLS
            or MMA_PACK_IMAGES * g.out_rows * g.out_cols > MMA_PACK_MAX_ELEMENTS
            or MMA_PACK_IMAGES * max(out_depth * g.out_rows * g.out_cols, g.in_depth * g.in_rows * g.in_cols) > INT32_MAX):
        return 0
    return stride


def mma_grid(g: Conv2DGeometry) -> tuple[int, int, int]:
    """The tensor-core kernel's grid: (unit positions in a plane, in_depth, image groups); a unit
    takes one image (the packed form: :data:`MMA_PACK_IMAGES`), a warp up to
    :data:`MMA_UNITS_PER_WARP` units where the launch has more than :data:`MMA_TARGET_WARPS`."""
    down, across = mma_units(g)
    groups = -(-g.batch // (MMA_PACK_IMAGES if mma_pack_stride(g) else 1))  # units down a plane's images
    units = groups * down * across * g.in_depth
    per_warp = max(1, min(MMA_UNITS_PER_WARP, -(-units // MMA_TARGET_WARPS)))
    return down * across, g.in_depth, -(-groups // (MMA_WARPS * per_warp))


def planes_item_cols(g: Conv2DGeometry) -> int:
    """Columns of a planes work item (``dwplanes::kItemCols``): 4, and 8 at stride 2."""
    return PLANES_SEGMENT * g.stride_cols


def planes_segments(g: Conv2DGeometry) -> int:
    """Work items across a row of the planes kernel."""
    return -(-g.in_cols // planes_item_cols(g))


def planes_pitch(g: Conv2DGeometry) -> int:
    """Staged values per staged row of the planes kernel, a multiple of 4 (aligned rows): 4 per
    work item (its columns / stride, at either stride) and 4 more, so that every item's window of
    8 from 4 x item lies inside it (filters up to 5 wide)."""
    return PLANES_SEGMENT * planes_segments(g) + PLANES_SEGMENT


def _planes_taps(g: Conv2DGeometry) -> int:
    return -(-g.filter_rows * g.filter_cols // 4) * 4  # dwplanes::Taps::PADDED


def _planes_buffer(dtype) -> int:
    return PLANES_SHARED_BYTES // np.dtype(_accumulator(dtype)).itemsize


def planes_staged_rows(g: Conv2DGeometry, band: int) -> int:
    """Staged rows per slice of the planes kernel: the out_backprop rows of the band's rows
    rounded up to whole work items (/ stride), and the filter's halo ((filter_rows - 1) /
    stride)."""
    stride = g.stride_rows
    return -(-band // PLANES_ITEM_ROWS) * PLANES_ITEM_ROWS // stride + (g.filter_rows - 1) // stride


def planes_rows_cap(g: Conv2DGeometry, band: int) -> int:
    """The most out_backprop rows a band of the planes kernel stages (its ``rows_cap``)."""
    return min(g.out_rows, planes_staged_rows(g, band))


def planes_chunks_per_row(g: Conv2DGeometry) -> int:
    """Staging chunks of PLANES_CHUNK elements per out_backprop row (the last one may be short)."""
    return -(-g.out_cols // PLANES_CHUNK)


def planes_items(g: Conv2DGeometry, band: int) -> int:
    """Work items of one plane's band (2 rows x :func:`planes_item_cols` columns each)."""
    return -(-band // PLANES_ITEM_ROWS) * planes_segments(g)


def planes_band_rows(g: Conv2DGeometry) -> int:
    """Input rows the planes kernel's bands cover: in_rows, and at stride 2 the row above the
    image where pad_top is odd (bands start at even padded rows)."""
    return g.in_rows + g.pad_top % g.stride_rows


def _planes_fit(g: Conv2DGeometry, dtype, planes: int, band: int, staged: bool = False) -> bool:
    per_slice = _planes_taps(g) + planes_staged_rows(g, band) * planes_pitch(g)
    values = planes * g.depth_multiplier * per_slice
    if staged:  # the result image: the band's rows of the planes, and up to 15 bytes to align it
        itemsize = np.dtype(dtype).itemsize
        image = planes * min(band, g.in_rows) * g.in_cols * itemsize + 16 - itemsize
        values += -(-image // np.dtype(_accumulator(dtype)).itemsize)
    return values <= _planes_buffer(dtype)


def planes_plan(g: Conv2DGeometry, dtype, staged: bool | None = None) -> tuple[int, int]:
    """(planes, band) of the planes kernel: a CTA owns ``planes`` consecutive input channels and
    ``band`` input rows (:func:`planes_band_rows`; at stride 2 an even number, whole items of
    both stride phases).  The band is the whole image where one plane of it fits the shared
    memory and holds at most :data:`PLANES_ITEMS` work items, else the most rows that keep both;
    then as many planes (a power of two, at most in_depth rounded up) as fit both.  (0, 0) where
    not even one item row of one plane fits (wide rows at large multipliers).  ``staged``: with
    the result image in the shared memory too (:func:`planes_staged_result`; None: the
    launcher's choice)."""
    if staged is None:
        staged = planes_staged_result(g, dtype)
    step = g.stride_rows  # band granularity: 1, or a whole item at stride 2
    if not _planes_fit(g, dtype, 1, step, staged):
        return 0, 0
    rows = planes_band_rows(g)
    band = min(-(-rows // step) * step, max(step, PLANES_ITEMS // planes_segments(g) * PLANES_ITEM_ROWS))
    while band > step and not _planes_fit(g, dtype, 1, band, staged):
        band -= step
    planes = 1
    # More than one plane only where a band covers the image: a CTA's result rows are then one
    # contiguous run of in_backprop (the staged result stores need it).
    while (planes < g.in_depth and 2 * planes * planes_items(g, band) <= PLANES_ITEMS and band >= rows
           and _planes_fit(g, dtype, 2 * planes, band, staged)):
        planes *= 2
    return planes, band


def planes_grid(g: Conv2DGeometry, dtype, staged: bool | None = None) -> tuple[int, int, int]:
    """The planes kernel's grid: (channel groups, bands, batch)."""
    planes, band = planes_plan(g, dtype, staged)
    return -(-g.in_depth // planes), -(-planes_band_rows(g) // band), g.batch


#: The planes kernel's staged form (STAGED: results through shared memory, copied out 16 bytes a
#: store; "Result stores" in the source) is for launches whose direct stores would write fewer
#: than this many bytes into each 32-byte sector they touch (:func:`planes_direct_store_sectors`,
#: :func:`planes_staged_narrow`), and at exactly this many at :data:`PLANES_STAGED_AT_HALF`.
#: Measured on the H100 (2026-12-06, results/gpu_h100_2026-12-06/stride2_ab.md and ncu_ab.md:
#: both forms forced on MobileNetV2's and EfficientNet's NCHW stride-2 layers, four dtypes,
#: multipliers 1 and 2), staged / direct kernel time: below 16 bytes 0.42-0.88 (12.4: 28 columns
#: in the 16-bit types; 5.1 and 8: 14 columns), at 27.3-32 bytes 0.93-1.33 (below 1 only for
#: float64 on 28 columns: 0.93, 0.98).  At 16 (float32 on every
#: map, float64 at 14 columns) it depends: 3x3 multiplier 1 0.76-0.86 (float32 112 / 56 / 28,
#: float64 14 columns), but multiplier 2 0.79-1.26 (float32 112 columns 1.15, float64 14
#: columns 1.26) and 5x5 1.03 (float32 56 columns, 2026-12-06 run 1).
PLANES_STAGED_BELOW = 16.0
#: (filter size, multiplier) whose launches stage at exactly :data:`PLANES_STAGED_BELOW` bytes a
#: sector too (above).
PLANES_STAGED_AT_HALF = frozenset({(3, 1)})
#: Whether the launcher takes the staged form by itself where :func:`planes_staged_narrow` holds
#: (False: only when asked for, ``path="planes_staged"`` or ``staged=True``).  The results are
#: the direct stores' bit for bit; the H100's A/B above decided it.
PLANES_STAGED_BY_DEFAULT = True
#: Strides whose planes kernels have a staged form: at stride 1 the image offset does not fit the
#: register bounds (float 3x3 spilled 4-20 bytes: sm_90, NVRTC 13.5), and in the launcher's
#: default paths stride 1 small maps take the tensor-core kernel in the half types.
PLANES_STAGED_STRIDES = (2,)


@functools.lru_cache(maxsize=256)
def planes_direct_store_sectors(g: Conv2DGeometry, dtype) -> tuple[int, int, int]:
    """(warp store instructions, 32-byte sectors, bytes) of the planes kernel's direct result
    stores in one full CTA (block (0, 0, 0) of the plan without staging): its lanes take
    consecutive work items (plane, row pair, segment), each stores its item's rows as
    ``dwplanes::store_item_row`` does (:func:`planes_store_cols` elements a store), and a sector
    counts once per warp store instruction that writes into it (in_backprop aligned to 256)."""
    itemsize = np.dtype(dtype).itemsize
    planes, band = planes_plan(g, dtype, staged=False)
    stride = g.stride_rows
    item_cols = planes_item_cols(g)
    segments = planes_segments(g)
    items = planes_items(g, band)
    store_cols = planes_store_cols(g)
    per_store = 8 if store_cols == 8 and itemsize == 2 else 4 if store_cols == 8 else store_cols

    def row_stores(x: int) -> list[tuple[int, int]]:
        if per_store == 8:
            return [(x, 8)]
        return [(x + h + k, min(per_store, g.in_cols - x - h - k)) for h in range(0, item_cols, 4)
                if h == 0 or x + h < g.in_cols for k in range(0, 4, per_store) if x + h + k < g.in_cols]

    y0 = -(g.pad_top % stride)
    instructions = sectors = written = 0
    for first in range(0, planes * items, 32):  # a warp: 32 consecutive items
        lanes = []
        for item in range(first, min(first + 32, planes * items)):
            p, rest = divmod(item, items)
            pair, segment = divmod(rest, segments)
            i, x = PLANES_ITEM_ROWS * pair, segment * item_cols
            rows = []
            for r in (0, 1):  # row i, then row i + 1
                y = y0 + i + r
                stored = 0 <= y < g.in_rows and (r == 0 or i + 1 < band)
                base = (p * g.in_rows + y) * g.in_cols
                rows.append([(base + c, n) for c, n in row_stores(x)] if stored else [])
            lanes.append(rows)
        for r in (0, 1):
            for j in range(max(len(lane[r]) for lane in lanes)):
                touched, nbytes = set(), 0
                for lane in lanes:
                    if j < len(lane[r]):
                        start, n = lane[r][j]
                        touched.update(range(start * itemsize // 32, ((start + n) * itemsize - 1) // 32 + 1))
                        nbytes += n * itemsize
                if touched:
                    instructions, sectors, written = instructions + 1, sectors + len(touched), written + nbytes
    return instructions, sectors, written


def planes_staged_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the planes kernel's staged form can run ``g``: at :data:`PLANES_STAGED_STRIDES`,
    with a plan whose result image fits the shared memory and whose CTAs' result rows are one
    contiguous run each (one plane, or whole planes)."""
    if g.stride_rows not in PLANES_STAGED_STRIDES:
        return False
    planes, band = planes_plan(g, dtype, staged=True)
    return ((planes, band) != (0, 0) and (planes == 1 or band >= planes_band_rows(g))
            and _planes_fit(g, dtype, planes, band, True))


def planes_staged_narrow(g: Conv2DGeometry, dtype) -> bool:
    """Whether ``g`` is a launch the staged form is for: it can run it, and the direct stores
    would write fewer than :data:`PLANES_STAGED_BELOW` bytes a 32-byte sector (or as many, at
    :data:`PLANES_STAGED_AT_HALF`)."""
    if planes_plan(g, dtype, staged=False) == (0, 0) or not planes_staged_possible(g, dtype):
        return False
    _, sectors, written = planes_direct_store_sectors(g, dtype)
    if (g.filter_rows, g.depth_multiplier) in PLANES_STAGED_AT_HALF:
        return written <= PLANES_STAGED_BELOW * sectors
    return written < PLANES_STAGED_BELOW * sectors


def planes_staged_result(g: Conv2DGeometry, dtype, staged: bool | None = None) -> bool:
    """Whether the planes kernel stages its results: ``staged`` when given (ValueError where the
    staged form cannot run), else :data:`PLANES_STAGED_BY_DEFAULT` where
    :func:`planes_staged_narrow` holds."""
    if staged is not None:
        if staged and not planes_staged_possible(g, dtype):
            raise ValueError("the planes kernel cannot stage its results for this geometry (stride 2, and the "
                             "result image in its shared memory)")
        return staged
    return PLANES_STAGED_BY_DEFAULT and planes_staged_narrow(g, dtype)


def planes_path_staged(g: Conv2DGeometry, dtype, path: str, staged: bool | None = None) -> bool:
    """Whether a planes launch of ``path`` stages its results: "planes_staged" / "planes_direct"
    force the form, "planes" takes ``staged`` or the launcher's (:func:`planes_staged_result`)."""
    if path in ("planes_staged", "planes_direct"):
        staged = path == "planes_staged"
    return planes_staged_result(g, dtype, staged)


def planes_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the planes kernel can run ``g``: NCHW, a 3x3 or 5x5 filter at stride 1x1 or 2x2
    and dilation 1, a slice row that fits its shared memory (:func:`planes_plan`), every tensor
    and padded coordinate in 32-bit range, and the grid within CUDA's limits."""
    if g.data_format != "NCHW" or g.filter_rows != g.filter_cols or g.filter_rows not in PLANES_FILTERS:
        return False
    if g.stride_rows != g.stride_cols or g.stride_rows not in PLANES_STRIDES or (g.dilation_rows,
                                                                                 g.dilation_cols) != (1, 1):
        return False
    if planes_plan(g, dtype) == (0, 0) or not _offsets_fit_int32(g):
        return False
    grid = planes_grid(g, dtype)
    return grid[1] <= _runtime.GRID_YZ_LIMIT and grid[2] <= _runtime.GRID_YZ_LIMIT


def planes_chosen(g: Conv2DGeometry, dtype) -> bool:
    """Whether the launcher picks the planes kernel by itself (:data:`PLANES_BY_DEFAULT`; float64
    at :data:`PLANES_FLOAT64_STRIDES` only; float32 at :data:`PLANES_FLOAT32_TILED` only in its
    staged form, :func:`planes_staged_result`)."""
    if not (PLANES_BY_DEFAULT and planes_possible(g, dtype)):
        return False
    if np.dtype(dtype) == np.float64 and g.stride_rows not in PLANES_FLOAT64_STRIDES:
        return False
    if np.dtype(dtype) == np.float32 and (g.filter_rows, g.stride_rows, g.depth_multiplier) in PLANES_FLOAT32_TILED:
        return planes_staged_result(g, dtype)
    return True


def planes_expression(g: Conv2DGeometry, dtype, staged: bool | None = None) -> str:
    """The name expression of the planes instantiation for ``g`` (``staged``: the result image's,
    :func:`planes_staged_result`; None: the launcher's choice)."""
    return _planes_expression(dtype, g.filter_rows, g.stride_rows, planes_staged_result(g, dtype, staged))


def planes_store_cols(g: Conv2DGeometry) -> int:
    """Result columns per store of the planes kernel: 8 at stride 2 where in_cols % 8 == 0 (a work
    item row of 8 columns starts at a multiple of 8 and lies inside the image: one 16-byte store
    in the half types, ``dwplanes::store_item_row``), else 4 where in_cols % 4 == 0 (every work
    item starts at a multiple of 4), 2 where it is even, else 1 (``dwconv::store_quad``)."""
    if planes_item_cols(g) == 8 and g.in_cols % 8 == 0:
        return 8
    return 4 if g.in_cols % 4 == 0 else 2 if g.in_cols % 2 == 0 else 1


def planes_load_elements(g: Conv2DGeometry, dtype, out_backprop=None) -> int:
    """Elements per staging load of the planes kernel (its ``load_elements``): the widest chunk
    of :func:`nchw_chunk_bytes` (16, 8 or 4 bytes that divide an out_backprop row and to which
    ``out_backprop`` is aligned; None: an aligned one), in elements, else 1."""
    return nchw_chunk_bytes(g, dtype, () if out_backprop is None else (out_backprop,)) // np.dtype(dtype).itemsize


def planes_tail_padding(g: Conv2DGeometry, dtype) -> int:
    """Elements past out_backprop's end the planes kernel's staging reads: at a row's start it
    loads the 16 bytes' worth of accumulators (PER) before the chunk without a predicate, from the
    chunk itself (values it does not use), which for the tensor's last row runs past the end
    where a row is shorter than PER (and the staging has a lead, :func:`planes_staging_lead`).
    The launcher hands the kernel a copy with that many elements more there; 0 elsewhere."""
    per = 16 // np.dtype(_accumulator(dtype)).itemsize
    return per - g.out_cols if planes_staging_lead(g, dtype) > 0 and g.out_cols < per else 0


def planes_staging_lead(g: Conv2DGeometry, dtype) -> int:
    """The staged column of out_backprop column 0 modulo the accumulators of a 16-byte store
    (4, or 2 for float64): how many values before a chunk start its first 16-byte staging store
    (the kernel's ``lead``, computed there from the same geometry; the static model's)."""
    return -staged_col_origin(g) % (16 // np.dtype(_accumulator(dtype)).itemsize)


@functools.lru_cache(maxsize=256)
def _planes_args(g: Conv2DGeometry, dtype: np.dtype, load_elements: int, staged: bool) -> tuple:
    """The planes kernel's int arguments after its three pointers (see the .cu file)."""
    i32 = _runtime.i32
    planes, band = planes_plan(g, dtype, staged)
    segments = planes_segments(g)
    rows_cap = planes_rows_cap(g, band)
    magic = [v for d in (planes_chunks_per_row(g), rows_cap, planes_items(g, band), segments)
             for v in _runtime.division_magic(d)]
    return (*(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
                               g.pad_top, g.pad_left, planes, band, segments, rows_cap, planes_store_cols(g),
                               load_elements)),
            *magic)


@functools.lru_cache(maxsize=256)
def mma_nhwc_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the NHWC tensor-core kernel can run ``g`` on a GPU that has it (compute capability
    8.0+; for an out_backprop aligned to 16 bytes): NHWC, float16 / bfloat16, a 3x3 or 5x5 filter
    at stride 1 and dilation 1, multiplier 1 or 2, in_depth a multiple of
    :data:`MMA_NHWC_CHANNELS`, every tensor and every offset of a unit's staged window (up to two
    units past the image and before it) in 32-bit range, the grid within CUDA's limits."""
    if not _mma_products_take(g, dtype, "NHWC") or g.in_depth % MMA_NHWC_CHANNELS:
        return False
    out_depth = g.in_depth * g.depth_multiplier
    margin = 2 * MMA_UNIT
    sizes = ((g.batch * g.in_rows + margin) * (g.in_cols + margin) * g.in_depth,
             (g.batch * g.out_rows + g.pad_top + margin) * (g.out_cols + g.pad_left + margin) * out_depth,
             g.filter_rows * g.filter_cols * out_depth, g.batch + MMA_NHWC_IMAGES_PER_CTA)
    grid = mma_nhwc_grid(g)
    return max(sizes) <= INT32_MAX and grid[0] <= INT32_MAX and max(grid[1:]) <= _runtime.GRID_YZ_LIMIT


def mma_nhwc_chosen(g: Conv2DGeometry, dtype, arch: int | None = None) -> bool:
    """Whether the launcher picks the NHWC tensor-core kernel by itself (for an aligned
    out_backprop): :data:`MMA_NHWC_BY_DEFAULT`, :func:`mma_nhwc_possible`, the fill and units a
    map :data:`MMA_NHWC_CHOICE` asks of the filter size and multiplier, and a GPU with mma.sync
    (compute capability ``arch``; None: the current device's)."""
    if not (MMA_NHWC_BY_DEFAULT and mma_nhwc_possible(g, dtype)):
        return False
    least = MMA_NHWC_CHOICE.get((g.filter_rows, g.depth_multiplier))
    if least is None or mma_fill(g) < least[0] or math.prod(mma_units(g)) < least[1]:
        return False
    return (_runtime.compute_capability() if arch is None else arch) >= MMA_ARCH


def mma_nhwc_grid(g: Conv2DGeometry) -> tuple[int, int, int]:
    """The NHWC tensor-core kernel's grid: (unit positions in an image, channel blocks of
    :data:`MMA_NHWC_CHANNELS`, image groups); a CTA takes up to :data:`MMA_NHWC_IMAGES_PER_CTA`
    images where the launch has more than :data:`MMA_NHWC_TARGET_CTAS` units."""
    down, across = mma_units(g)
    blocks = max(1, g.in_depth // MMA_NHWC_CHANNELS)
    units = down * across * blocks * g.batch
    per_cta = max(1, min(MMA_NHWC_IMAGES_PER_CTA, -(-units // MMA_NHWC_TARGET_CTAS)))
    return down * across, blocks, -(-g.batch // per_cta)


def mma_nhwc_expression(g: Conv2DGeometry, dtype) -> str:
    """The name expression of the NHWC tensor-core instantiation for ``g``."""
    return _mma_nhwc_expression(dtype, g.filter_rows, g.depth_multiplier)


def nhwc_twin(g: Conv2DGeometry) -> Conv2DGeometry:
    """``g`` in NHWC: the geometry the transpose path runs the tiled kernel on."""
    return dataclasses.replace(g, data_format="NHWC")


def transpose_possible(g: Conv2DGeometry, dtype) -> bool:
    """Whether the transpose path can run ``g``: NCHW, and the tiled kernel can run its NHWC twin."""
    return g.data_format == "NCHW" and tiled_eligible(nhwc_twin(g), dtype)


def transpose_chosen(g: Conv2DGeometry, dtype) -> bool:
    """Whether the launcher picks the transpose path by itself (:data:`TRANSPOSE_BY_DEFAULT`)."""
    return TRANSPOSE_BY_DEFAULT and transpose_possible(g, dtype)


def pick_path(g: Conv2DGeometry, dtype, path: str | None = None, arch: int | None = None) -> str:
    """``path`` if given (checked), else mma where :func:`mma_chosen` (on compute capability
    ``arch``; None: the current device's), mma_nhwc where :func:`mma_nhwc_chosen` (the same; the
    launch falls back to tiled for an out_backprop not 16-byte aligned), planes where
    :func:`planes_chosen`, transpose where :func:`transpose_chosen`, tiled where it can run, else
    direct."""
    eligible = tiled_eligible(g, dtype)
    if path is None:
        if mma_chosen(g, dtype, arch):
            return "mma"
        if mma_nhwc_chosen(g, dtype, arch):
            return "mma_nhwc"
        if planes_chosen(g, dtype):
            return "planes"
        return "transpose" if transpose_chosen(g, dtype) else "tiled" if eligible else "direct"
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "tiled" and not eligible:
        raise ValueError("the tiled kernel cannot run this geometry (a filter or stride other than 3x3 / 5x5 at "
                         "1x1 / 2x2, a dilation, or sizes beyond 32-bit offsets)")
    if path in ("mma", "mma_runs") and not (mma_possible(g, dtype) and _runtime.compute_capability() >= MMA_ARCH):
        raise ValueError("the mma kernel cannot run this geometry (it takes NCHW float16 / bfloat16, 3x3 or 5x5 "
                         "filters at stride 1 without dilation, multiplier 1 or 2, 32-bit offsets, and a GPU of "
                         "compute capability 8.0 or newer)")
    if path == "mma_runs" and not mma_runs_possible(g, dtype):
        raise ValueError("the mma kernel's runs form cannot run this geometry (it takes the rows form's maps, "
                         "neither a whole plane nor packed images, with in_cols a multiple of 8)")
    if path == "mma_nhwc" and not (mma_nhwc_possible(g, dtype) and _runtime.compute_capability() >= MMA_ARCH):
        raise ValueError("the mma_nhwc kernel cannot run this geometry (it takes NHWC float16 / bfloat16 with "
                         f"in_depth a multiple of {MMA_NHWC_CHANNELS}, 3x3 or 5x5 filters at stride 1 without "
                         "dilation, multiplier 1 or 2, 32-bit offsets, and a GPU of compute capability 8.0 or newer)")
    if path in ("planes", "planes_staged", "planes_direct") and not planes_possible(g, dtype):
        raise ValueError("the planes kernel cannot run this geometry (it takes NCHW, 3x3 or 5x5 filters at stride "
                         "1x1 or 2x2 without dilation, a slice row that fits its shared memory, and 32-bit offsets)")
    if path == "planes_staged" and not planes_staged_possible(g, dtype):
        raise ValueError("the planes kernel's staged form cannot run this geometry (stride 2, and the result image "
                         "in its shared memory)")
    if path == "transpose" and not transpose_possible(g, dtype):
        raise ValueError("the transpose path cannot run this geometry (it takes NCHW where the tiled kernel can run "
                         "the NHWC twin: 3x3 / 5x5 filters at 1x1 / 2x2 strides without dilation, 32-bit offsets)")
    return path


def tiled_expression(g: Conv2DGeometry, dtype, item_cols: int | None = None) -> str:
    """The name expression of the tiled instantiation the launcher runs for ``g``."""
    shape = (g.filter_rows, g.filter_cols, g.stride_rows, g.stride_cols)
    item_cols = item_cols_per_tile(g) if item_cols is None else item_cols
    return _tiled_expression(dtype, g.data_format, shape, item_rows_per_tile(g), item_cols)


@functools.lru_cache(maxsize=256)
def _tiled_plan(g: Conv2DGeometry, dtype: np.dtype, item_cols: int) -> tuple:
    """What a tiled launch for ``g`` takes that does not depend on the arrays, worked out once
    per geometry, dtype and tile width (every call with the same shapes and attributes reuses it): the
    name expression, grid, block, the int arguments before ``vector_loads`` and after it,
    whether 16-byte loads are possible but for the arrays' alignment, and the NCHW store bit of
    ``vector_loads`` (:func:`nchw_store_cols`, :data:`NCHW_STORE_BITS`)."""
    i32 = _runtime.i32
    return (tiled_expression(g, dtype, item_cols), tile_grid(g, dtype, item_cols),
            (tile_threads(g, item_cols),),
            tuple(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.depth_multiplier, g.out_rows, g.out_cols,
                                   g.pad_top, g.pad_left, tiles(g, item_cols)[0])),
            (i32(1 if columns_per_warp(g, item_cols) else 0), i32(1 if pair_multipliers(g, dtype) else 0)),
            vector_loads_possible(g, dtype), NCHW_STORE_BITS[nchw_store_cols(g)])


def depthwise_conv2d_native_backprop_input(g: Conv2DGeometry, filter, out_backprop, *, path: str | None = None,
                                           vector: bool | None = None, narrow: bool | None = None,
                                           staged: bool | None = None):
    """Input gradient [N, in_rows, in_cols, in_depth] in ``g.data_format``, out_backprop's dtype.

    filter: [filter_rows, filter_cols, in_depth, depth_multiplier]; out_backprop: [N, out_rows,
    out_cols, in_depth * depth_multiplier] in ``g.data_format``; both CuPy arrays on the current
    device, any strides.  Launches on the current stream without synchronising.  ``path``
    ("direct" / "tiled" / "mma" / "mma_runs" / "mma_nhwc" / "planes" / "planes_staged" / "planes_direct" /
    "transpose"), ``vector``
    (tiled only: 16-byte or scalar staging loads) and
    ``narrow`` (tiled only: 8-column or full-width tiles, :func:`pick_item_cols`) and ``staged``
    (planes only: results through shared memory, :func:`planes_staged_result`) override the
    automatic choices.
    """
    import cupy

    dtype = out_backprop.dtype
    if 0 in g.input_shape:
        return cupy.empty(g.input_shape, dtype)
    if 0 in filter.shape or 0 in out_backprop.shape:  # no tap reaches any input element
        return cupy.zeros(g.input_shape, dtype)
    forced = path
    path = pick_path(g, dtype, path)
    filter = _runtime.contiguous(filter)
    out_backprop = _runtime.contiguous(out_backprop)
    if path == "mma_nhwc" and not _runtime.vector_aligned(out_backprop):
        if forced:
            raise ValueError("the mma_nhwc kernel needs out_backprop aligned to 16 bytes")
        path = "tiled"  # NHWC float16 / bfloat16 at 3x3 / 5x5 stride 1: the tiled kernel runs it
    if path == "transpose":
        return _through_nhwc(g, filter, out_backprop, vector, narrow)
    in_backprop = cupy.empty(g.input_shape, dtype)
    if path == "direct":
        fn = _runtime.kernel(SOURCE, _expression(dtype, g.data_format, specialisation(g)))
        args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
                *kernel_scalars(g))
        _runtime.launch_1d(fn, in_backprop.size, args)
        return in_backprop
    if path in ("mma", "mma_runs"):
        i32 = _runtime.i32
        runs = True if path == "mma_runs" else None
        if runs and not mma_runs_possible(g, dtype, out_backprop):
            raise ValueError("the mma kernel's runs form cannot run this call: out_backprop takes another form")
        args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
                *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.out_rows, g.out_cols, g.pad_top, g.pad_left,
                                   mma_units(g)[1], g.batch, mma_chunk(g, dtype, out_backprop),
                                   1 if g.in_cols % 2 == 0 else 0, mma_plane_chunk(g, dtype, out_backprop),
                                   mma_pack_stride(g))))
        fn = _runtime.kernel(SOURCE, mma_expression(g, dtype, out_backprop, runs))
        fn(mma_grid(g), (MMA_WARPS * 32,), args)
        return in_backprop
    if path == "mma_nhwc":
        i32 = _runtime.i32
        args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
                *(i32(v) for v in (g.in_rows, g.in_cols, g.in_depth, g.out_rows, g.out_cols, g.pad_top, g.pad_left,
                                   mma_units(g)[1], g.batch)))
        _runtime.kernel(SOURCE, mma_nhwc_expression(g, dtype))(mma_nhwc_grid(g), (MMA_NHWC_THREADS,), args)
        return in_backprop
    if path in ("planes", "planes_staged", "planes_direct"):
        staged = planes_path_staged(g, dtype, path, staged)
        tail = planes_tail_padding(g, dtype)
        if tail:  # a copy with readable elements past its end
            padded = cupy.empty(out_backprop.size + tail, dtype)
            padded[:out_backprop.size] = out_backprop.ravel()
            out_backprop = padded[:out_backprop.size].reshape(out_backprop.shape)
        args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
                *_planes_args(g, np.dtype(dtype), planes_load_elements(g, dtype, out_backprop), staged))
        _runtime.kernel(SOURCE, planes_expression(g, dtype, staged))(planes_grid(g, dtype, staged), (PLANES_THREADS,),
                                                                     args)
        return in_backprop

    expression, grid, block, sizes, flags, vector_possible, stores = _tiled_plan(g, np.dtype(dtype),
                                                                                pick_item_cols(g, narrow))
    if g.data_format == "NCHW":  # the filter is read one element per load: out_backprop's alignment decides
        if vector is None:
            chunk = nchw_chunk_bytes(g, dtype, (out_backprop,))
        else:  # tests: 16-byte chunks (checked), or one element per load
            chunk = _runtime.VECTOR_BYTES if use_vector_loads(g, dtype, (out_backprop,), vector) else 0
        bits = NCHW_CHUNK_BITS.get(chunk, 0) | stores
    else:
        if vector is None:
            vector = vector_possible and _runtime.vector_aligned(filter, out_backprop)
        else:
            vector = use_vector_loads(g, dtype, (filter, out_backprop), vector)
        bits = 1 if vector else 0
    args = (_runtime.pointer(filter), _runtime.pointer(out_backprop), _runtime.pointer(in_backprop), *sizes,
            _runtime.i32(bits), *flags)
    _runtime.kernel(SOURCE, expression)(grid, block, args)
    return in_backprop


def _through_nhwc(g: Conv2DGeometry, filter, out_backprop, vector: bool | None, narrow: bool | None):
    """The transpose path: NCHW out_backprop [N, out_depth, out_rows * out_cols] to NHWC, the
    tiled kernel on the NHWC twin (``vector`` and ``narrow`` as for it), and its result
    [N, in_rows * in_cols, in_depth] back to NCHW.  Two temporaries, the size of out_backprop and
    of the result, come from CuPy's pool on the current stream."""
    import cupy

    dtype = out_backprop.dtype
    twin = nhwc_twin(g)
    out_positions, in_positions = g.out_rows * g.out_cols, g.in_rows * g.in_cols
    staged = cupy.empty(twin.out_backprop_shape, dtype)
    _layout.transpose(SOURCE, out_backprop, staged, g.batch, g.out_depth, out_positions)
    result = depthwise_conv2d_native_backprop_input(twin, filter, staged, path="tiled", vector=vector, narrow=narrow)
    in_backprop = cupy.empty(g.input_shape, dtype)
    _layout.transpose(SOURCE, result, in_backprop, g.batch, in_positions, g.in_depth)
    return in_backprop
