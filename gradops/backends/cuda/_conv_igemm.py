"""Host side shared by the convolution launchers (conv2d, conv2d_backprop_filter/input).

Mirrors ``cuda_src/igemm_tiles.cuh``: the kernels' size arguments, the tile shapes of each
math kind (for grid sizes), which math a dtype gets, when the tiled kernels may load 16 bytes
at a time, and the eligibility limits of the tiled (implicit GEMM) kernels.  Nothing here
imports CuPy at module level.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..._dtypes import bfloat16
from ..._options import get_options
from . import _build, _runtime

#: Layout template argument of the direct kernels (``enum Layout`` in gradops_common.cuh).
LAYOUT = {"NHWC": 0, "NCHW": 1}

#: ``igemm::MathKind``: SIMT FMA, tensor cores on half types, tensor cores on float as TF32.
SIMT, WMMA_HALF, WMMA_TF32 = 0, 1, 2

#: (BM, BN, BK, threads) of ``igemm::Config<T, Kind>``, keyed by (dtype, kind).
TILES = {
    (np.dtype(np.float16), WMMA_HALF): (128, 128, 32, 256),
    (bfloat16, WMMA_HALF): (128, 128, 32, 256),
    (np.dtype(np.float16), SIMT): (128, 128, 16, 256),
    (bfloat16, SIMT): (128, 128, 16, 256),
    (np.dtype(np.float32), WMMA_TF32): (128, 128, 16, 256),
    (np.dtype(np.float32), SIMT): (128, 128, 8, 256),
    (np.dtype(np.float64), SIMT): (64, 64, 8, 256),
}

#: The tile shapes (BM, BN) of the mma.sync path (``igemm::MmaConfig``; sm_80+, half types on
#: tensor cores, 16-byte chunks), built of the same 64 x 32 warp patches, largest CTA first: the
#: default 128 x 128 (TILES's), the 4-warp 128 x 64 and 64 x 128 for GEMMs with 64 columns or
#: rows, and the 2-warp 64 x 64 for GEMMs with both.
DEFAULT_TILE = (128, 128)
MMA_TILES = (DEFAULT_TILE, (128, 64), (64, 128), (64, 64))
#: A tile of half the warps is taken where its padded GEMM area (the tiles' M x N, the MMAs a
#: launch issues) is at most this fraction of the larger tile's it would replace (a quarter of
#: the warps: this fraction squared, as if through the shape between): it halves the work
#: of a 64-channel GEMM, but each of its warps issues more chunk copies per k-tile (4 warps: 6
#: instead of 4, 2 warps: 8) and its CTA's fixed work (prologue, epilogue) covers fewer
#: outputs, so a small saving is not worth it.
NARROW_TILE_AREA = 0.75


def mma_tile_threads(tile: tuple[int, int]) -> int:
    """Threads of an mma.sync tile: a warp per 64 x 32 patch."""
    return 32 * (tile[0] // 64) * (tile[1] // 32)


def tile_shapes(dtype, kind: int, vector: bool, arch: int | None = None) -> tuple[tuple[int, int], ...]:
    """The (BM, BN) tile shapes instantiated for this dtype, kind and load width on compute
    capability ``arch`` (None: any): :data:`MMA_TILES` for the mma.sync path, else the default."""
    mma = (np.dtype(dtype), kind) in TENSOR_CORE_ARCH and kind == WMMA_HALF
    if mma and vector and (arch is None or arch >= MMA_SYNC_ARCH):
        return MMA_TILES
    return (DEFAULT_TILE,)


def tile_template_args(tile: tuple[int, int]) -> str:
    """The kernels' trailing ``TILE_M, TILE_N`` template arguments: none for the default tile
    (its name expressions stay those of the kernels before tile shapes existed)."""
    return "" if tuple(tile) == DEFAULT_TILE else f", {tile[0]}, {tile[1]}"


class Tile(NamedTuple):
    """A launch's CTA tile: its extents, threads, and the kernels' trailing template arguments
    (:func:`tile_template_args`)."""
    bm: int
    bn: int
    bk: int
    threads: int
    args: str = ""


def default_tile(dtype, kind: int) -> Tile:
    return Tile(*TILES[(np.dtype(dtype), kind)])


#: The k-tile depth of the float SIMT kernels with scalar loads from a table (the gradients'
#: row table and k table; igemm::SimtDepth): twice TILES's.
TABLE_SIMT_BK = 16


def scalar_table_tile(tile: Tile, dtype, kind: int, vector: bool) -> Tile:
    """``tile`` as the filter and input gradients' kernels run it: float SIMT with scalar loads
    takes :data:`TABLE_SIMT_BK` (igemm::SimtDepth), so that the split reduction's sizes are
    whole k-tiles of it."""
    if not vector and kind == SIMT and np.dtype(dtype) == np.float32:
        return tile._replace(bk=TABLE_SIMT_BK)
    return tile


def pick_tile(dtype, kind: int, vector: bool, m: int, n: int, arch: int | None = None,
              tile: tuple[int, int] | None = None) -> Tile:
    """The :class:`Tile` a GEMM of M x N runs: of the shapes of :func:`tile_shapes`, walked from
    the default down, a shape replaces the one chosen so far where its padded area is at most
    :data:`NARROW_TILE_AREA` of that one's per halving of the warps, or smaller with as many warps
    (ties keep 128 x 64), the default's grid is more than one tile and the shape's grid y fits.  ``arch``:
    default the current device's.  ``tile`` (tests) forces a shape; one this call cannot run
    raises."""
    if arch is None and kind == WMMA_HALF and vector:
        arch = _runtime.compute_capability()
    shapes = tile_shapes(dtype, kind, vector, arch)
    if tile is not None:
        if tuple(tile) not in shapes:
            raise ValueError(f"tile {tuple(tile)} cannot run this call (shapes: {shapes})")
        chosen = tuple(tile)
    else:
        def area(shape):
            return ceil_div(m, shape[0]) * shape[0] * ceil_div(n, shape[1]) * shape[1]

        chosen = DEFAULT_TILE
        # One default tile: its padding costs no CTA (a narrower tile leaves the tile count at
        # one), and the split reduction that fills the GPU would take more CTAs of fewer warps,
        # for the same warps (the 1x1 64 -> 64 filter gradient).
        single = ceil_div(m, DEFAULT_TILE[0]) * ceil_div(n, DEFAULT_TILE[1]) == 1
        for shape in shapes[1:] if not single else ():
            halvings = (mma_tile_threads(chosen) // mma_tile_threads(shape)).bit_length() - 1
            smaller = (area(shape) <= NARROW_TILE_AREA ** halvings * area(chosen) if halvings
                       else area(shape) < area(chosen))
            if smaller and ceil_div(n, shape[1]) <= GRID_YZ_LIMIT:
                chosen = shape
    if chosen == DEFAULT_TILE:
        return default_tile(dtype, kind)
    return Tile(*chosen, TILES[(np.dtype(dtype), kind)][2], mma_tile_threads(chosen), tile_template_args(chosen))


#: GEMM indices in the tiled kernels are 32-bit (offsets are 64-bit): every GEMM extent must
#: stay below this, with room for one tile (<= 128) past the end so index + tile cannot overflow.
INT32_LIMIT = 2**31 - 1 - 128
GRID_YZ_LIMIT = _runtime.GRID_YZ_LIMIT
#: The tiled kernels are chosen automatically only when both output dimensions of the GEMM
#: reach this: below it a 128-wide tile is mostly padding, and the direct kernels do better.
TILED_MIN_DIM = 8


def dims_args(g) -> tuple:
    """The ``GRADOPS_CONV_DIMS_PARAMS`` scalars of geometry ``g``, in order."""
    values = (g.batch, g.in_rows, g.in_cols, g.in_depth, g.filter_rows, g.filter_cols, g.filter_in_depth,
              g.out_depth, g.out_rows, g.out_cols, g.groups, g.stride_rows, g.stride_cols,
              g.dilation_rows, g.dilation_cols, g.pad_top, g.pad_left)
    return tuple(np.int64(v) for v in values)


def input_div_args(g) -> tuple:
    """The ``GRADOPS_INPUT_DIVS_PARAMS`` scalars (cuda_src/igemm_tiles.cuh): the FastDiv
    constants (magic, shift) of the input operand's divisors, filter_in_depth, filter_cols,
    out_cols and out_rows."""
    return tuple(v for d in (g.filter_in_depth, g.filter_cols, g.out_cols, g.out_rows)
                 for v in _runtime.division_magic(max(d, 1)))


#: The first compute capability with tensor cores (WMMA) for each (dtype, kind): float16 from
#: Volta, bfloat16 and TF32 from Ampere (``igemm::HasTensorCores`` in the kernel source).
TENSOR_CORE_ARCH = {
    (np.dtype(np.float16), WMMA_HALF): 70,
    (bfloat16, WMMA_HALF): 80,
    (np.dtype(np.float32), WMMA_TF32): 80,
}


#: The first compute capability with mma.sync.m16n8k16 and ldmatrix (``GRADOPS_HAS_MMA_SM80`` in
#: cuda_src/tensor_core_ptx.cuh): kernels written only with them exist from this one on.
MMA_SYNC_ARCH = 80


def has_kind(dtype, kind: int, arch: int | None) -> bool:
    """Whether compute capability ``arch`` (e.g. 75; None: any architecture) can run ``kind`` on
    ``dtype``: SIMT everywhere, tensor cores from :data:`TENSOR_CORE_ARCH`."""
    first = TENSOR_CORE_ARCH.get((np.dtype(dtype), kind), 0)
    return arch is None or arch >= first


def math_kinds(dtype, arch: int | None = None) -> tuple[int, ...]:
    """Every math kind a dtype can run on ``arch`` (None: on any architecture), for the
    instantiation lists."""
    return tuple(kind for (dt, kind) in TILES if dt == np.dtype(dtype) and has_kind(dt, kind, arch))


def math_kind(dtype, arch: int | None = None) -> int:
    """Math for this call on compute capability ``arch`` (default: the current device's): tensor
    cores for half types where the GPU has them for the type; float32 is exact SIMT unless the
    caller opted into TF32 with ``gradops.options(allow_tf32=True)`` and the GPU has TF32; SIMT
    otherwise (float64 always)."""
    dtype = np.dtype(dtype)
    if arch is None:
        arch = _runtime.compute_capability()
    wanted = SIMT
    if dtype in (np.dtype(np.float16), bfloat16):
        wanted = WMMA_HALF
    elif dtype == np.dtype(np.float32) and get_options().allow_tf32:
        wanted = WMMA_TF32
    return wanted if has_kind(dtype, wanted, arch) else SIMT


def math_note(dtype, arch: int | None = None) -> str | None:
    """Why the tiled kernels run on CUDA cores although tensor cores were wanted (None if not)."""
    dtype = np.dtype(dtype)
    if arch is None:
        arch = _runtime.compute_capability()
    for (dt, kind), first in TENSOR_CORE_ARCH.items():
        if dt != dtype or arch >= first:
            continue
        if kind == WMMA_TF32 and not get_options().allow_tf32:
            continue
        what = "TF32" if kind == WMMA_TF32 else f"{dtype.name} tensor cores"
        return f"{what} need sm_{first} or newer (this GPU is sm_{arch}): the tiled kernels use CUDA cores"
    return None


def capability_summary(arch: int) -> str:
    """What the tiled conv kernels run on for compute capability ``arch`` (``gradops info``)."""
    names = {key: "TF32" if key[1] == WMMA_TF32 else key[0].name for key in TENSOR_CORE_ARCH}
    have = [names[key] for key in TENSOR_CORE_ARCH if has_kind(*key, arch)]
    lack = [f"{names[key]} (tensor cores from sm_{first})" for key, first in TENSOR_CORE_ARCH.items()
            if not has_kind(*key, arch)]
    parts = (["tensor cores for " + ", ".join(have)] if have else []) + (
        ["CUDA cores for " + ", ".join(lack)] if lack else [])
    return "; ".join(parts)


def supported(dtype) -> tuple[bool, str]:
    """``supports()``'s answer for a call the conv kernels can run: with the tensor-core
    fallback note for this GPU, if any."""
    return True, math_note(dtype) or "supported"


def template_types(dtype) -> str:
    """``"T, Acc"`` for a template argument list."""
    t, acc = _build.c_types(dtype)
    return f"{t}, {acc}"


def all_template_types() -> list[str]:
    return [f"{t}, {acc}" for t, acc in _build.C_TYPES.values()]


def instantiation_dtypes():
    return list(_build.C_TYPES)


def is_empty(*shapes) -> bool:
    return any(0 in tuple(s) for s in shapes)


def fits_int32(*values: int) -> bool:
    return all(0 <= v <= INT32_LIMIT for v in values)


def cursor_extents(g) -> tuple[int, ...]:
    """What the tiled kernels' 32-bit cursors and offsets (igemm_tiles.cuh, "Row cursors")
    hold or reach: padded input rows and columns plus a stride and the dilated filter's extent
    (every input coordinate a tap or a phase computes lies inside), the channel counts, and
    the elements of one input image, one output image and the filter (offsets inside an image
    are 32-bit; only an image's start is 64-bit)."""
    return (g.in_rows + g.pad_top + g.pad_bottom + g.stride_rows + (g.filter_rows - 1) * g.dilation_rows,
            g.in_cols + g.pad_left + g.pad_right + g.stride_cols + (g.filter_cols - 1) * g.dilation_cols,
            g.in_depth, g.out_depth, g.in_rows * g.in_cols * g.in_depth, g.out_rows * g.out_cols * g.out_depth,
            g.filter_rows * g.filter_cols * g.filter_in_depth * g.out_depth)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def to_nhwc(x, data_format: str):
    """A C-contiguous NHWC copy of an NCHW array (the tiled kernels are NHWC-only); NHWC as is."""
    import cupy

    if data_format == "NHWC":
        return x
    return cupy.ascontiguousarray(x.transpose(0, 2, 3, 1))


def from_nhwc(x, data_format: str):
    """The NHWC result ``x`` in ``data_format`` (a C-contiguous copy for NCHW)."""
    import cupy

    if data_format == "NHWC":
        return x
    return cupy.ascontiguousarray(x.transpose(0, 3, 1, 2))


def prod(shape) -> int:
    return math.prod(int(d) for d in shape)


def use_vector_loads(g, dtype, arrays, vector: bool | None = None) -> bool:
    """Whether the tiled kernel loads 16 bytes at a time: both per-group channel counts are
    multiples of 16 / itemsize (so no load straddles a tap or a group) and every array the
    kernel reads or writes is 16-byte aligned.  ``vector`` (tests) forces the choice; True
    raises when it cannot hold."""
    chunk = _runtime.vector_width(dtype)  # igemm::ChunkSize
    eligible = (g.filter_in_depth % chunk == 0 and (g.out_depth // g.groups) % chunk == 0
                and _runtime.vector_aligned(*arrays))
    if vector is None:
        return eligible
    if vector and not eligible:
        raise ValueError(f"vector loads need channel counts that are multiples of {chunk} and 16-byte aligned arrays")
    return bool(vector)


def cpp_bool(value: bool) -> str:
    return "true" if value else "false"


#: Kernel paths a launcher can take; tests force each with ``path=``.
PATHS = ("direct", "tiled")


#: A split reduction aims at this many CTAs.  A constant rather than a multiple of the SM count
#: so that the summation order, hence every bit of the result, is the same on every GPU.
SPLIT_TARGET_CTAS = 256
#: Each split gets at least this many BK-deep reduction steps, so that the scratch traffic of a
#: split (one partial tile per CTA) stays small next to the loads it replaces.
SPLIT_MIN_K_TILES = 16
#: Both targets are for CTAs of this many threads.  A launch of smaller CTAs (the 4- and 2-warp
#: tiles) aims at proportionally more CTAs, each split proportionally more k-tiles
#: (:func:`split_targets`): the same warps, the same warp x k-tile work per split, so no more
#: partial sums (scratch bytes) than with the larger tile.
SPLIT_TARGET_THREADS = 256


def split_targets(threads: int) -> dict[str, int]:
    """:func:`split_reduction`'s ``target_ctas`` and ``min_k_tiles`` for CTAs of ``threads``."""
    scale = SPLIT_TARGET_THREADS // threads
    return {"target_ctas": SPLIT_TARGET_CTAS * scale, "min_k_tiles": SPLIT_MIN_K_TILES * scale}


def split_reduction(ctas: int, red: int, bk: int, z_limit: int, splits: int | None = None,
                    target_ctas: int = SPLIT_TARGET_CTAS, min_k_tiles: int = SPLIT_MIN_K_TILES) -> tuple[int, int]:
    """(splits, split_size) of a reduction of ``red`` indices over a grid of ``ctas`` CTAs:
    ``splits`` chunks of ``split_size`` indices (a multiple of BK), by default enough to give
    about ``target_ctas`` CTAs with at least ``min_k_tiles`` k-tiles each; at most
    ``z_limit`` (the grid's z room); no empty trailing split."""
    k_tiles = ceil_div(red, bk)
    if splits is None:
        splits = min(target_ctas // max(1, ctas), k_tiles // min_k_tiles)
    splits = max(1, min(splits, z_limit))
    split_size = ceil_div(k_tiles, splits) * bk
    return ceil_div(red, split_size), split_size


def pointwise_eligible(g) -> bool:
    """Whether a conv's input positions are its output positions (1x1 filter, strides 1, no
    padding), so that its GEMMs are plain row-major ones: the ``_1x1_igemm`` kernels, which
    have 16-byte loads only."""
    return (g.filter_rows == g.filter_cols == 1 and g.stride_rows == g.stride_cols == 1
            and g.pad_top == g.pad_bottom == g.pad_left == g.pad_right == 0)


def pick_pointwise(g, vector: bool, pointwise: bool | None) -> bool:
    """Whether the tiled path runs its ``_1x1_igemm`` kernel: where it can (16-byte loads and
    :func:`pointwise_eligible`) unless ``pointwise`` (tests) is False; True raises where it cannot."""
    can = vector and pointwise_eligible(g)
    if pointwise and not can:
        raise ValueError("the 1x1 kernel needs a 1x1 filter, strides 1, no padding and 16-byte loads")
    return can and pointwise is not False


def pick_path(path, eligible: bool, gemm_m: int, gemm_n: int) -> str:
    """The caller's ``path`` if valid, else tiled when it can run and both GEMM output
    dimensions reach a tile's worth of work, else direct."""
    if path is None:
        return "tiled" if eligible and min(gemm_m, gemm_n) >= TILED_MIN_DIM else "direct"
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    if path == "tiled" and not eligible:
        raise ValueError("the tiled kernel cannot run this geometry (sizes beyond 32-bit GEMM indices)")
    return path


def tile_variant_names(*names, arch: int | None = None) -> list[str]:
    """The instantiations of the tile shapes other than the default (:func:`tile_shapes`, 16-byte
    chunks) that compute capability ``arch`` can run (None: any), unsplit and split:
    ``name(dtype, kind, split, tile_args)`` for each of ``names``."""
    return [name(dtype, kind, split, tile_template_args(tile)) for name in names
            for dtype in instantiation_dtypes() for kind in math_kinds(dtype, arch)
            for tile in tile_shapes(dtype, kind, True, arch)[1:] for split in (False, True)]


def kernel_names(direct_name, tiled_name, *per_dtype, arch: int | None = None) -> list[str]:
    """Every instantiation of a conv kernel file that compute capability ``arch`` can run (None:
    any): ``direct_name(dtype, layout)`` for each layout, ``tiled_name(dtype, kind, vector)`` for
    each math kind with scalar and vector loads, then each ``per_dtype(dtype)`` extra."""
    names = []
    for dtype in instantiation_dtypes():
        names += [direct_name(dtype, layout) for layout in LAYOUT]
        names += [tiled_name(dtype, kind, vector) for kind in math_kinds(dtype, arch) for vector in (False, True)]
        names += [extra(dtype) for extra in per_dtype]
    return names
