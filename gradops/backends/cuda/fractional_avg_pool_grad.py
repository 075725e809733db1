"""Launcher for cuda_src/fractional_avg_pool_grad.cu (see its header comment for the design).

Two kernels (``path=`` forces one; :func:`pick_path`):
- ``gather`` (``fractional_avg_pool_grad``): any valid sequences.  Tiles of the input gradient
  sum the shares of the cells each position lies in, staged in shared memory.
- ``cells`` (``fractional_avg_pool_grad_cells``): sequences whose cells partition the input,
  overlapping or not (what TF's generator makes).  A thread per cell writes the cell's values
  over its own region.  The launcher's choice wherever it can run (:data:`CELLS_BY_DEFAULT`).

The geometry's pooling cells (validated once, on the host) become small integer tables: for
each input row (column), the list of row (column) cells containing it in cell order (CSR:
offsets and cell indices; cells need not be ordered, empty cells are in no list), each cell's
size, and per tile of rows (columns) the range of cells its rows (columns) lie in.  They are
built and uploaded once per geometry, tile shape, device and stream, and kept (a small LRU of
device copies), so a training loop that repeats a geometry uploads nothing after its first
call.  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..._dtypes import bfloat16
from ..._errors import BackendUnavailableError
from ..._geometry import FractionalPoolGeometry, cells_by_index
from . import _build, _runtime
from ._runtime import TABLE_CACHE_SIZE, cached_tables, clear_table_cache, division_magic  # noqa: F401 (re-exported)

SOURCE = "fractional_avg_pool_grad.cu"
KERNEL = "gradops::fractional_avg_pool_grad"
CELLS_KERNEL = "gradops::fractional_avg_pool_grad_cells"
#: Kernel paths; tests and the bench engine force each with ``path=``.
PATHS = ("gather", "cells")
#: Whether the launcher picks the cells kernel by itself where the sequences allow it, for
#: disjoint and for overlapping cells (False: only when asked for, ``path="cells"``).  Measured
#: on an H200 (Nsight Compute kernel times, benchmarks/results/gpu_h200_2026-12-04/
#: ncu_ab_fractional.md; the fractional suite's 32x112x112x64 and 32x56x56x256 at ratio 1.44):
#: cells ahead of gather on every case, disjoint 1.6-2.4x (float16 21.4 against 45.6 us, 73-78%
#: of HBM) and overlapping 1.5-2.0x (float16 37.8-42.4 against 74.3-76.9 us; float32 46.9-50.3
#: against 74.0-74.8 us).  The static model's latency-aware estimate (predicted, not measured:
#: benchmarks/results/path_estimates.md, gradops/bench/static_cells.py) had put gather ahead for
#: overlapping cells by 1.1-1.4x (the overlapping cells kernel's four roundings and neighbours'
#: shares: 94 registers in float16); the measurement reverses it.
CELLS_BY_DEFAULT = {"disjoint": True, "overlapping": True}
#: Cell rows a thread of the cells kernel walks down (the most; fewer when the grid would hold
#: fewer than CELLS_TARGET_THREADS threads).  Overlapping cells recompute the row above each
#: chunk's first, so longer chunks cost fewer share computations.
CELLS_CHUNK_ROWS = 4
#: About one H100's resident threads (132 SMs x 2048 threads is 2**18.04).
CELLS_TARGET_THREADS = 2**18
#: Threads per block of the cells kernel.  It has no shared memory and no barriers, so the
#: block size only sets the register allocation's granularity: at 128 the overlapping float16
#: kernel (94 registers on sm_90) keeps 20 warps an SM resident where 256 would keep 16.
CELLS_THREADS = 128

#: C++ element type per dtype: the float types as everywhere, plus TF's integer types.
ELEMENT_TYPES = {
    **{dtype: element for dtype, (element, _) in _build.C_TYPES.items()},
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}
#: Index (and table) types: 32-bit when every tensor and table is below 2**31 elements.
INDEX_TYPES = {"int": np.dtype(np.int32), "long long": np.dtype(np.int64)}
#: Threads per block at most, and the kernel's constants (fractional::kShareCapacity, kCellPad).
THREADS = 256
SHARE_CAPACITY = 6144
CELL_PAD = 2
#: Channel vectors per block at most (fractional::kBlockVectors): 64 bytes of channels per position.
BLOCK_VECTORS = 4
#: The kernel divides exactly by cell sizes below this (see the .cu file's header comment).
MAX_CELL_SIZE = 2**50
#: Input rows per thread at most (each thread sums and stores one position per row).
ROWS_PER_THREAD = 8
#: The cells kernel computes these types' shares in float (disjoint cells everywhere,
#: overlapping cells where FP64 is slow), exactly for cells of at most FLOAT_SHARE_CELLS
#: elements (fractional::kFloatShareCells; the proof in the .cu file needs fewer than 2**13);
#: larger cells take the gather kernel.
FLOAT_SHARE_DTYPES = (np.dtype(np.float16), bfloat16, np.dtype(np.float32))
FLOAT_SHARE_CELLS = 4096


def _expression(dtype, index: str = "int", vector: int | None = None) -> str:
    vector = _runtime.vector_width(dtype) if vector is None else vector
    return f"{KERNEL}<{ELEMENT_TYPES[np.dtype(dtype)]}, {index}, {vector}>"


def _cells_expression(dtype, index: str, vector: int, overlapping: bool) -> str:
    return f"{CELLS_KERNEL}<{ELEMENT_TYPES[np.dtype(dtype)]}, {index}, {vector}, {str(overlapping).lower()}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture): per
    dtype, 32- and 64-bit indexing, 16-byte vectors of channels or one channel per thread; for
    the cells kernel also both modes."""
    forms = [(dtype, index, vector) for dtype in ELEMENT_TYPES for index in INDEX_TYPES
             for vector in (_runtime.vector_width(dtype), 1)]
    return {SOURCE: [_expression(*form) for form in forms]
            + [_cells_expression(*form, overlapping) for form in forms for overlapping in (False, True)]}


def cell_tables(starts, ends, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell_offsets [in_size + 1], cells [entries], cell_sizes [cells]) of one dimension, int64.

    Input index i lies in cells ``cells[cell_offsets[i]:cell_offsets[i + 1]]``, in increasing
    cell order (TF's summation order); a cell ending before it starts is empty, in no list,
    and has size 0.  Starts and ends are the geometry's (clamped, inclusive, in any order).
    """
    offsets, cells = cells_by_index(starts, ends, in_size)
    sizes = np.maximum(np.asarray(ends, np.int64) - np.asarray(starts, np.int64) + 1, 0)
    return offsets, cells, sizes


def tile_cell_ranges(offsets: np.ndarray, cells: np.ndarray, tile: int) -> np.ndarray:
    """Per tile of ``tile`` consecutive indices, the smallest and largest cell any of them lies
    in, interleaved ([lo0, hi0, lo1, hi1, ...], int64); a tile in no cell gets lo = 0, hi = -1."""
    size = len(offsets) - 1
    listed = offsets[1:] > offsets[:-1]
    first = np.full(size, 2**62, np.int64)
    last = np.full(size, -1, np.int64)
    first[listed] = cells[offsets[:-1][listed]]
    last[listed] = cells[offsets[1:][listed] - 1]
    starts = np.arange(0, size, tile)
    lo, hi = np.minimum.reduceat(first, starts), np.maximum.reduceat(last, starts)
    empty = hi < 0
    lo[empty], hi[empty] = 0, -1
    return np.stack([lo, hi], axis=1).reshape(-1).astype(np.int64)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


#: (index, cell) pairs up to which one dimension's host tables are kept between calls: 2**20
#: (8 MiB) covers dimensions up to 2**19 indices with TF's pooling sequences (each index in at
#: most two cells); larger lists, from longer dimensions or stacked cells, are rebuilt per call.
CACHED_CELL_ENTRIES = 2**20


def _cells(starts: tuple, ends: tuple, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`cell_tables`, kept per dimension (a training loop repeats its geometries) when
    it has at most :data:`CACHED_CELL_ENTRIES` pairs."""
    if sum(max(0, e - s + 1) for s, e in zip(starts, ends)) > CACHED_CELL_ENTRIES:
        return cell_tables(starts, ends, in_size)
    return _kept_cells(starts, ends, in_size)


@functools.lru_cache(maxsize=64)
def _kept_cells(starts: tuple, ends: tuple, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tables = cell_tables(starts, ends, in_size)
    for t in tables:
        t.flags.writeable = False
    return tables


def _row_cells(g: FractionalPoolGeometry):
    return _cells(g.row_starts, g.row_ends, g.in_rows)


def _col_cells(g: FractionalPoolGeometry):
    return _cells(g.col_starts, g.col_ends, g.in_cols)


@functools.lru_cache(maxsize=256)
def _tile_ranges(starts: tuple, ends: tuple, in_size: int, tile: int) -> np.ndarray:
    offsets, cells, _ = _cells(starts, ends, in_size)
    ranges = tile_cell_ranges(offsets, cells, tile)
    ranges.flags.writeable = False
    return ranges


def _widest(ranges: np.ndarray) -> int:
    """The most cells any tile's range holds."""
    return int(np.max(ranges[1::2] - ranges[0::2] + 1, initial=0))


@dataclass(frozen=True)
class Plan:
    """How one call is tiled and launched (see the kernel's header comment)."""

    index: str            # "int" or "long long"
    vector: int           # channels per thread
    block_vectors: int    # blockDim.x
    tile_cols: int        # power of two
    tile_rows: int        # power of two: rows of threads; the tile is tile_rows * rows_per_thread high
    tile_batch: int
    rows_per_thread: int
    stage_cols: int       # power of two >= the column cells of any tile (staging slots per row of cells)
    channel_blocks: int
    col_tiles: int
    row_tiles: int
    batch_tiles: int
    share_cells: int      # cells a tile may stage (else it takes the direct path)

    @property
    def block(self) -> tuple[int, int]:
        return (self.block_vectors, self.tile_cols * self.tile_rows * self.tile_batch)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (min(self.channel_blocks * self.col_tiles, _runtime.GRID_X_LIMIT), min(self.row_tiles, _runtime.GRID_YZ_LIMIT),
                min(self.batch_tiles, _runtime.GRID_YZ_LIMIT))

    @property
    def tile_height(self) -> int:
        return self.tile_rows * self.rows_per_thread

    @property
    def cell_doubles(self) -> int:
        """Doubles of shared memory per staged cell."""
        return self.tile_batch * (self.block_vectors * self.vector + CELL_PAD)


def index_type(g: FractionalPoolGeometry) -> str:
    """"int" when every tensor and cell table has fewer than 2**31 elements, else "long long"."""
    entries = max(g.cell_table_entries, g.in_rows + 1, g.in_cols + 1)
    largest = max(int(np.prod(g.input_shape, dtype=object)), int(np.prod(g.output_shape, dtype=object)), entries)
    return "int" if largest < 2**31 else "long long"


@functools.lru_cache(maxsize=256)  # a pure function of a frozen geometry: once per problem
def plan(g: FractionalPoolGeometry, dtype, *, aligned: bool = True, index: str | None = None,
         vector: int | None = None, rows_per_thread: int | None = None,
         share_cells: int | None = None) -> Plan:
    """The launch of ``g`` for ``dtype``.  ``aligned``: both tensors start on a 16-byte boundary.
    The keywords override the choices (tests use them to run the 64-bit, scalar and direct paths
    on small problems)."""
    largest_cell = g.largest_cell
    if largest_cell >= MAX_CELL_SIZE:  # never on a real device: the input gradient would not fit
        raise BackendUnavailableError(
            f"fractional_avg_pool_grad: gradops' CUDA kernel takes pooling cells of fewer than 2**50 elements "
            f"(its exact division needs it), got one of {largest_cell}")
    if vector is None:
        vector = _runtime.vector_width(dtype) if aligned and g.depth % _runtime.vector_width(dtype) == 0 else 1
    assert vector in (1, _runtime.vector_width(dtype)) and g.depth % vector == 0
    vectors = g.depth // vector
    block_vectors = min(vectors, BLOCK_VECTORS)
    positions = THREADS // block_vectors
    cols, rows = _pow2_at_least(g.in_cols), _pow2_at_least(g.in_rows)
    tile_cols = tile_rows = 1
    while tile_cols * tile_rows * 2 <= positions:  # square-ish, columns first (they are adjacent in memory)
        if tile_cols < cols and (tile_cols <= tile_rows or tile_rows >= rows):
            tile_cols *= 2
        elif tile_rows < rows:
            tile_rows *= 2
        else:
            break
    tile_batch = max(1, min(g.batch, positions // (tile_cols * tile_rows)))
    cell = tile_batch * (block_vectors * vector + CELL_PAD)
    if share_cells is None:
        share_cells = SHARE_CAPACITY // cell
    assert 0 <= share_cells * cell <= SHARE_CAPACITY
    widest_cols = _widest(_tile_ranges(g.col_starts, g.col_ends, g.in_cols, tile_cols))
    if rows_per_thread is None:
        # The tallest tile (up to ROWS_PER_THREAD rows per thread) whose cells all fit.
        rows_per_thread = 1
        for candidate in range(min(ROWS_PER_THREAD, -(-g.in_rows // tile_rows)), 1, -1):
            widest_rows = _widest(_tile_ranges(g.row_starts, g.row_ends, g.in_rows, tile_rows * candidate))
            if widest_rows * widest_cols <= share_cells:
                rows_per_thread = candidate
                break
    height = tile_rows * rows_per_thread
    return Plan(index=index or index_type(g), vector=vector, block_vectors=block_vectors,
                tile_cols=tile_cols, tile_rows=tile_rows, tile_batch=tile_batch, rows_per_thread=rows_per_thread,
                stage_cols=min(_pow2_at_least(max(widest_cols, 1)), THREADS),
                channel_blocks=-(-vectors // block_vectors), col_tiles=-(-g.in_cols // tile_cols),
                row_tiles=-(-g.in_rows // height), batch_tiles=-(-g.batch // tile_batch),
                share_cells=share_cells)


def kernel_tables(g: FractionalPoolGeometry, p: Plan) -> list[np.ndarray]:
    """The kernel's ten table parameters, in order, in the plan's index type: rows'
    cell_offsets, cells, cell_sizes and per-tile cell ranges, then the same for columns."""
    tables = [*_row_cells(g), _tile_ranges(g.row_starts, g.row_ends, g.in_rows, p.tile_height),
              *_col_cells(g), _tile_ranges(g.col_starts, g.col_ends, g.in_cols, p.tile_cols)]
    return [t.astype(INDEX_TYPES[p.index]) for t in tables]


def kernel_scalars(g: FractionalPoolGeometry, p: Plan) -> tuple:
    """The kernel's scalar parameters, in order, after its pointers: sizes and tile counts in the
    index type, then the division constants, tile shape and staged-cell capacity as ``int``."""
    wide = _runtime.i32 if p.index == "int" else _runtime.i64
    sizes = (g.batch, g.in_rows, g.in_cols, g.depth, g.out_rows, g.out_cols,
             p.channel_blocks, p.col_tiles, p.row_tiles, p.batch_tiles)
    magic, shift = division_magic(p.channel_blocks)
    return (*(wide(v) for v in sizes), magic, shift, _runtime.i32(p.tile_cols.bit_length() - 1),
            _runtime.i32(p.tile_rows.bit_length() - 1), _runtime.i32(p.rows_per_thread),
            _runtime.i32(p.stage_cols.bit_length() - 1), _runtime.i32(p.share_cells))


def device_tables(g: FractionalPoolGeometry, p: Plan):
    """(device array, element offset of each table in it) for ``g`` and ``p`` on the current
    device and stream: uploaded on the first call, then taken from the cache (see
    :func:`cached_tables`).  The key is everything the tables depend on: the cells, the index
    type and the tile shape."""
    key = ("avg", p.index, p.tile_height, p.tile_cols, g.in_rows, g.in_cols, g.row_starts, g.row_ends,
           g.col_starts, g.col_ends)
    return cached_tables(key, lambda: kernel_tables(g, p))


# --------------------------------------------------------------------------- the cells kernel


def cells_possible(g: FractionalPoolGeometry, dtype) -> bool:
    """Whether the cells kernel can run ``g`` for ``dtype``: both dimensions' cells are
    partitions (:func:`gradops._geometry.partition_bounds`), and cells of the float types, whose
    shares the kernel computes in float (disjoint cells everywhere, overlapping ones where FP64
    is slow), hold at most FLOAT_SHARE_CELLS elements."""
    if g.row_partition is None or g.col_partition is None:
        return False
    return np.dtype(dtype) not in FLOAT_SHARE_DTYPES or g.largest_cell <= FLOAT_SHARE_CELLS


def cells_by_default(defaults: dict, g: FractionalPoolGeometry) -> bool:
    """Whether a launcher's ``CELLS_BY_DEFAULT`` (``{"disjoint": bool, "overlapping": bool}``)
    takes the cells kernel for ``g``'s mode (where it can run)."""
    return defaults["overlapping" if g.overlapping else "disjoint"]


def pick_path(g: FractionalPoolGeometry, dtype, path: str | None = None) -> str:
    """The kernel for ``g``: ``path`` when given (ValueError where the cells kernel cannot run
    it), else cells where :data:`CELLS_BY_DEFAULT` takes the cells' mode and it can run, else
    gather."""
    if path is None:
        return "cells" if cells_by_default(CELLS_BY_DEFAULT, g) and cells_possible(g, dtype) else "gather"
    if path not in PATHS:
        raise ValueError(f"fractional_avg_pool_grad: no kernel path {path!r} (paths: {', '.join(PATHS)})")
    if path == "cells" and not cells_possible(g, dtype):
        raise ValueError("fractional_avg_pool_grad: the cells kernel takes pooling sequences whose cells "
                         "partition the input (as TF's generator makes them), and cells of at most "
                         f"{FLOAT_SHARE_CELLS} elements in float16, bfloat16 and float32")
    return path


@dataclass(frozen=True)
class CellsPlan:
    """How the cells kernel runs one call (see its comment in the .cu file)."""

    index: str            # "int" or "long long"
    vector: int           # channels per thread
    block_vectors: int    # blockDim.x: a power of two dividing the vectors
    block_columns: int    # blockDim.y: (batch item, cell column) pairs per block
    chunk_rows: int       # cell rows a thread walks down
    column_blocks: int
    row_chunks: int
    channel_blocks: int
    halo: bool = False    # blockDim.y is block_columns + 1: a halo row of threads first (max pooling's)

    @property
    def block(self) -> tuple[int, int]:
        return (self.block_vectors, self.block_columns + self.halo)

    @property
    def grid(self) -> tuple[int, int, int]:
        return (min(self.column_blocks, _runtime.GRID_X_LIMIT), min(self.row_chunks, _runtime.GRID_YZ_LIMIT),
                min(self.channel_blocks, _runtime.GRID_YZ_LIMIT))


@functools.lru_cache(maxsize=256)
def cells_plan(g: FractionalPoolGeometry, dtype, *, aligned: bool = True, index: str | None = None,
               vector: int | None = None, chunk_rows: int | None = None,
               block_vectors: int | None = None, halo_vectors: int | None = None) -> CellsPlan:
    """The cells kernel's launch of ``g`` (which :func:`cells_possible` accepts) for ``dtype``;
    the keywords override the choices (tests use them on small problems).  Fractional max
    pooling's cells kernel takes the same launch, with its own vector and index type, and with
    overlapping cells ``halo_vectors``: one row of the block's CELLS_THREADS threads is a halo
    (see :attr:`CellsPlan.halo`), at most that many vectors wide unless ``block_vectors`` is
    given."""
    if vector is None:
        vector = _runtime.vector_width(dtype) if aligned and g.depth % _runtime.vector_width(dtype) == 0 else 1
    assert g.depth % vector == 0
    vectors = g.depth // vector
    if block_vectors is None:
        block_vectors = min(vectors & -vectors, 32)  # the largest power of two dividing them, at most a warp
        if halo_vectors is not None:
            block_vectors = min(block_vectors, halo_vectors)
    assert block_vectors & (block_vectors - 1) == 0 and vectors % block_vectors == 0
    halo = halo_vectors is not None
    block_columns = CELLS_THREADS // block_vectors - halo
    assert block_columns >= 1, "a block needs a column besides its halo"
    columns = g.batch * g.out_cols
    if chunk_rows is None:
        chunk_rows = 1
        for candidate in range(CELLS_CHUNK_ROWS, 1, -1):
            if columns * vectors * -(-g.out_rows // candidate) >= CELLS_TARGET_THREADS:
                chunk_rows = candidate
                break
    return CellsPlan(index=index or index_type(g), vector=vector, block_vectors=block_vectors,
                     block_columns=block_columns, chunk_rows=chunk_rows,
                     column_blocks=-(-columns // block_columns), row_chunks=-(-g.out_rows // chunk_rows),
                     channel_blocks=vectors // block_vectors, halo=halo)


def cells_tables(g: FractionalPoolGeometry, p: CellsPlan) -> list[np.ndarray]:
    """The cells kernel's four table parameters in the plan's index type: row_bounds
    [out_rows + 1], row_sizes [out_rows], col_bounds [out_cols + 1], col_sizes [out_cols]."""
    tables = [g.row_partition, g.row_cell_sizes, g.col_partition, g.col_cell_sizes]
    return [np.asarray(t).astype(INDEX_TYPES[p.index]) for t in tables]


def cells_scalars(g: FractionalPoolGeometry, p: CellsPlan) -> tuple:
    """The cells kernel's scalar parameters, in order, after its pointers and tables (fractional
    max pooling's cells kernel takes the same ones)."""
    wide = _runtime.i32 if p.index == "int" else _runtime.i64
    sizes = (g.in_rows, g.in_cols, g.depth, g.out_rows, g.out_cols, g.batch * g.out_cols,
             p.column_blocks, p.row_chunks, p.channel_blocks)
    magic, shift = division_magic(g.out_cols)
    return (*(wide(v) for v in sizes), magic, shift, _runtime.i32(p.chunk_rows))


def cells_device_tables(g: FractionalPoolGeometry, p: CellsPlan):
    """:func:`device_tables` for the cells kernel."""
    key = ("avg-cells", p.index, g.in_rows, g.in_cols, g.row_starts, g.row_ends, g.col_starts, g.col_ends,
           g.overlapping)
    return cached_tables(key, lambda: cells_tables(g, p))


def fractional_avg_pool_grad(g: FractionalPoolGeometry, out_backprop, *, path: str | None = None,
                             index: str | None = None, vector: int | None = None,
                             rows_per_thread: int | None = None, share_cells: int | None = None,
                             chunk_rows: int | None = None, block_vectors: int | None = None):
    """Input gradient [N, in_rows, in_cols, C] (NHWC) in out_backprop's dtype.

    out_backprop: [N, out_rows, out_cols, C], a CuPy array on the current device, any strides.
    Launches on the current stream without synchronising the host.  ``path`` forces a kernel
    (:func:`pick_path`); the other keywords force its choices (see :func:`plan` and
    :func:`cells_plan`).
    """
    import cupy

    dtype = out_backprop.dtype
    if 0 in g.input_shape or 0 in out_backprop.shape:  # the geometry rejects these; stay safe
        return cupy.zeros(g.input_shape, dtype)
    path = pick_path(g, dtype, path)
    out_backprop = _runtime.contiguous(out_backprop)
    in_backprop = cupy.empty(g.input_shape, dtype)
    aligned = _runtime.vector_aligned(out_backprop, in_backprop)
    if path == "cells":
        cp = cells_plan(g, dtype, aligned=aligned, index=index, vector=vector, chunk_rows=chunk_rows,
                        block_vectors=block_vectors)
        packed, offsets = cells_device_tables(g, cp)
        fn = _runtime.kernel(SOURCE, _cells_expression(dtype, cp.index, cp.vector, g.overlapping))
        args = (_runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
                *(_runtime.pointer(packed, offset) for offset in offsets), *cells_scalars(g, cp))
        fn(cp.grid, cp.block, args)
        return in_backprop
    p = plan(g, dtype, aligned=aligned, index=index, vector=vector, rows_per_thread=rows_per_thread,
             share_cells=share_cells)
    packed, offsets = device_tables(g, p)
    fn = _runtime.kernel(SOURCE, _expression(dtype, p.index, p.vector))
    args = (_runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
            *(_runtime.pointer(packed, offset) for offset in offsets), *kernel_scalars(g, p))
    fn(p.grid, p.block, args)
    return in_backprop
