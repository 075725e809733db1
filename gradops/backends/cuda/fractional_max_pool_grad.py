"""Launcher for cuda_src/fractional_max_pool_grad.cu (see its header comment for the design).

Two launches on the current stream: ``fractional_max_pool_select`` (each cell's chosen element,
by TF's scan, and a flag set where orig_output is not the recomputed maximum; a thread takes a
run of :func:`select_run` cells down one output column) and
``fractional_max_pool_gather`` (each input element sums the out_backprop of the cells that
chose it).  A thread takes :func:`vector_channels` adjacent channels where depth allows
(:func:`channels_per_thread`), else one; the chosen element passes between the kernels as a
one-byte place in its cell where cells are small enough (:func:`local_places`), else as a flat
offset.  The flag is read back before the result is returned, so this op synchronises the
host: TF refuses a call whose orig_output does not match (InvalidArgumentError), and so must
gradops, which needs the answer.  Cell tables (bounds per cell, and per input index the cells
containing it, with its place in each: :func:`cell_entries`) are built on the host and uploaded once per geometry, index type, device and
stream, then kept (the small LRU of device copies that fractional_avg_pool_grad's launcher
keeps), so a training loop that repeats a geometry uploads nothing after its first call.
CuPy is imported only when a call runs.

Where the cells partition the input (TF's generated sequences, overlapping or not), one kernel
can do both passes (``fractional_max_pool_grad_cells``, ``path="cells"``): a thread per cell
scans it and writes its own region; with overlapping cells the neighbouring threads pass their
choices through shared memory for the elements their cells share, and each block has a halo row
of threads (:func:`max_cells_plan`, :attr:`CellsPlan.block`).  The launcher's choice wherever
it can run (:data:`CELLS_BY_DEFAULT`).
"""

from __future__ import annotations

import numpy as np

from ..._errors import InvalidArgumentError
from ..._geometry import FractionalPoolGeometry, cells_by_index
from . import _runtime
from ._runtime import cached_tables, division_magic
from .fractional_avg_pool_grad import ELEMENT_TYPES, CellsPlan, cells_by_default, cells_plan, cells_scalars

SOURCE = "fractional_max_pool_grad.cu"
KERNELS = ("gradops::fractional_max_pool_select", "gradops::fractional_max_pool_gather")
CELLS_KERNEL = "gradops::fractional_max_pool_grad_cells"
#: Kernel paths (``path=``): select then gather, or the one-pass cells kernel.
PATHS = ("gather", "cells")
#: Whether the launcher picks the cells kernel by itself where it can run, for disjoint and for
#: overlapping cells (False: only when asked for, ``path="cells"``).  Measured on an H200 (Nsight
#: Compute kernel times, benchmarks/results/gpu_h200_2026-12-04/ncu_ab_fractional.md; the
#: fractional suite's 32x112x112x64 and 32x56x56x256 at ratio 1.44): the one pass is ahead of
#: select + gather on every disjoint case, 1.5-1.7x (float32 74.4 against 112.3 us, 85% of HBM),
#: and on three of the four overlapping ones, 1.04-1.19x; behind on the fourth (32x56x56x256
#: float16: 91.7 against 80.8 us, 1.13x), a geometric mean of 1.05x ahead.  It also writes no
#: chosen buffer.  The static model's latency-aware estimate (predicted, not measured:
#: benchmarks/results/path_estimates.md, gradops/bench/static_cells.py) had put select + gather
#: ahead for overlapping cells by 1.1-1.9x (the exchange of choices through shared memory and its
#: halo left the kernel 16-20 resident warps with about 64-79 SASS instructions an element; since
#: session 89, 28 / 28 warps on sm_90 at 46-47 / 74-75 for float16 / float32: not yet timed).
CELLS_BY_DEFAULT = {"disjoint": True, "overlapping": True}
#: Index (and table) types: 32-bit when every tensor and table is below 2**31 elements.
INDEX_TYPES = {"int": np.dtype(np.int32), "long long": np.dtype(np.int64)}


def vector_channels(dtype) -> int:
    """Channels per thread of the vector instantiations (the kernels' ``V``): 8 for the 2-byte
    types (16 bytes of elements per access), 4 for the others (16, or 32 in two accesses)."""
    return 8 if np.dtype(dtype).itemsize == 2 else 4


#: The chosen element's type where it is a place in the cell's scan (:func:`local_places`).
LOCAL_TYPE = "unsigned char"
#: Most elements a cell may have for :data:`LOCAL_TYPE` places (0 .. 255).
LOCAL_CELL_LIMIT = 256


def _expression(kernel: str, dtype, index: str, channels: int = 1, local: bool = False) -> str:
    chosen = LOCAL_TYPE if local else index
    return f"{kernel}<{ELEMENT_TYPES[np.dtype(dtype)]}, {index}, {channels}, {chosen}>"


def _cells_expression(dtype, index: str, channels: int, overlapping: bool) -> str:
    return f"{CELLS_KERNEL}<{ELEMENT_TYPES[np.dtype(dtype)]}, {index}, {channels}, {str(overlapping).lower()}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture): both
    kernels per dtype, with 32- and 64-bit indexing, 1 or :func:`vector_channels` channels per
    thread, and flat offsets or cell places as the chosen elements; the cells kernel per dtype,
    index type, channels per thread and cell mode (disjoint or overlapping)."""
    return {SOURCE: [_expression(kernel, dtype, index, v, local)
                     for kernel in KERNELS for dtype in ELEMENT_TYPES for index in INDEX_TYPES
                     for v in (1, vector_channels(dtype)) for local in (False, True)]
            + [_cells_expression(dtype, index, v, overlapping) for dtype in ELEMENT_TYPES for index in INDEX_TYPES
               for v in (1, vector_channels(dtype)) for overlapping in (False, True)]}


def cells_bounds(g: FractionalPoolGeometry) -> tuple[np.ndarray, np.ndarray] | None:
    """(row bounds, column bounds) of the cells kernel (the first index of each cell's own
    region, then the input's size), or None where it cannot run ``g``: cells that do not
    partition the input (:func:`gradops._geometry.partition_bounds`)."""
    if g.row_partition is None or g.col_partition is None:
        return None
    return np.asarray(g.row_partition, np.int64), np.asarray(g.col_partition, np.int64)


def pick_path(g: FractionalPoolGeometry, dtype, path: str | None = None) -> str:
    """The kernels for ``g``: ``path`` when given (ValueError where the cells kernel cannot run
    it), else cells where :data:`CELLS_BY_DEFAULT` takes the cells' mode and it can run, else
    gather (select + gather)."""
    if path is None:
        return "cells" if cells_by_default(CELLS_BY_DEFAULT, g) and cells_bounds(g) is not None else "gather"
    if path not in PATHS:
        raise ValueError(f"fractional_max_pool_grad: no kernel path {path!r} (paths: {', '.join(PATHS)})")
    if path == "cells" and cells_bounds(g) is None:
        raise ValueError("fractional_max_pool_grad: the cells kernel takes pooling sequences whose cells "
                         "partition the input (as TF's generator makes them)")
    return path


#: Channel vectors a block of the overlapping cells kernel spans at most: its halo row (see
#: :func:`max_cells_plan`) is that wide, so 16 vectors make the halo 1/7 of a 128-thread block's
#: threads where a warp-wide row would make it 1/4 (the benchmark's 256 channels).
HALO_VECTORS = 16


def max_cells_plan(g: FractionalPoolGeometry, dtype, *, index: str | None = None, vector: int | None = None,
                   chunk_rows: int | None = None, block_vectors: int | None = None) -> CellsPlan:
    """The cells kernel's launch (:func:`cells_plan`, whose keywords these are).  Overlapping
    cells take CELLS_THREADS threads a block too, one row of them (threadIdx.y = 0) the halo
    that scans the cells left of the block's first column: at most :data:`HALO_VECTORS` vectors
    a row (unless ``block_vectors`` forces a width), so CELLS_THREADS / vectors - 1 columns a
    block."""
    return cells_plan(g, dtype, index=index, vector=vector, chunk_rows=chunk_rows, block_vectors=block_vectors,
                      halo_vectors=HALO_VECTORS if g.overlapping else None)


def local_places(g: FractionalPoolGeometry, local: bool | None = None) -> bool:
    """Whether select stores each chosen element as its place in the cell's scan (one byte)
    rather than its flat input offset (4 or 8 bytes): where every cell has at most
    :data:`LOCAL_CELL_LIMIT` elements (fractional pooling's cells are a few elements).
    ``local`` (tests) forces the choice; True raises when a cell is too large."""
    eligible = g.largest_cell <= LOCAL_CELL_LIMIT
    if local and not eligible:
        raise ValueError(f"one-byte places need cells of at most {LOCAL_CELL_LIMIT} elements")
    return eligible if local is None else bool(local)


def pack_accesses(channels: int, itemsize: int) -> tuple[int, int]:
    """(bytes per access, accesses) of a pack of ``channels`` values (``fractional_max::Pack``:
    aligned to 16 bytes at most, so larger packs take several 16-byte accesses)."""
    size = channels * itemsize
    return min(_runtime.VECTOR_BYTES, size), max(1, size // _runtime.VECTOR_BYTES)


def channels_per_thread(g: FractionalPoolGeometry, dtype, arrays=(), vector: bool | None = None) -> int:
    """:func:`vector_channels` when depth is a multiple of it and ``arrays`` (orig_input,
    orig_output, out_backprop; the chosen offsets and the result are fresh allocations) are
    aligned for its accesses, else 1.  ``vector`` (tests) forces the choice; True raises when
    it cannot hold."""
    v = vector_channels(dtype)
    alignment = pack_accesses(v, np.dtype(dtype).itemsize)[0]
    eligible = g.depth % v == 0 and all(int(_runtime.pointer(a)) % alignment == 0 for a in arrays)
    if vector and not eligible:
        raise ValueError(f"{v} channels per thread need a depth that is a multiple of {v} and aligned arrays")
    return v if (eligible if vector is None else vector) else 1


#: Most elements a cell may have where the overlapping cells kernel takes the half types in
#: pairs (its PairChoice: place + 0x0400 as the bits of a T, below float16's Inf, 0x7C00;
#: ``kPairPlaces`` in the kernel).
PAIR_PLACES = 0x7C00 - 0x0400


def cells_channels(g: FractionalPoolGeometry, dtype, arrays=(), vector: bool | None = None) -> int:
    """The cells kernel's channels per thread: :func:`channels_per_thread`, but one for
    overlapping cells of a 2-byte type with a cell past :data:`PAIR_PLACES` elements (the vector
    form takes those types in pairs, whose places have 16 bits; one channel a thread never pairs).
    ``vector=True`` raises there."""
    if g.overlapping and np.dtype(dtype).itemsize == 2 and g.largest_cell > PAIR_PLACES:
        if vector:
            raise ValueError(f"{vector_channels(dtype)} channels per thread need overlapping cells of at most "
                             f"{PAIR_PLACES} elements for a 2-byte type")
        return 1
    return channels_per_thread(g, dtype, arrays, vector)


def index_type(g: FractionalPoolGeometry) -> str:
    """"int" when every tensor, cell table and offset fits below 2**31, else "long long"."""
    largest = max(int(np.prod(g.input_shape, dtype=object)), int(np.prod(g.output_shape, dtype=object)),
                  g.cell_table_entries, g.in_rows + 1, g.in_cols + 1, 2 * g.out_rows, 2 * g.out_cols)
    return "int" if largest < 2**31 else "long long"


def cell_entries(starts, ends, in_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [in_size + 1], entries [n, 4]) of one dimension, int64, for gather: index i lies
    in the cells of entries[offsets[i]:offsets[i + 1]], in cell order, each entry (cell, the
    index's distance from the cell's first index, the cell's size, 0): the kernel's
    ``fractional_max::CellEntry``."""
    offsets, cells = cells_by_index(starts, ends, in_size)
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    index = np.repeat(np.arange(in_size, dtype=np.int64), np.diff(offsets))
    entries = np.stack([cells, index - starts[cells], ends[cells] - starts[cells] + 1, np.zeros_like(cells)], axis=1)
    return offsets, entries.reshape(-1, 4)


def kernel_tables(g: FractionalPoolGeometry, index: str) -> list[np.ndarray]:
    """The tables, flat, in the index type: row entries and column entries (gather's, first, so
    that each starts 16-byte aligned in the packed upload: both are whole entries of 4 values),
    row bounds and column bounds (select's: first and last index of each cell), row offsets and
    column offsets (gather's)."""
    row_offsets, row_entries = cell_entries(g.row_starts, g.row_ends, g.in_rows)
    col_offsets, col_entries = cell_entries(g.col_starts, g.col_ends, g.in_cols)
    row_bounds = np.stack([g.row_starts, g.row_ends], axis=1).reshape(-1)
    col_bounds = np.stack([g.col_starts, g.col_ends], axis=1).reshape(-1)
    tables = [row_entries.reshape(-1), col_entries.reshape(-1), row_bounds, col_bounds, row_offsets, col_offsets]
    return [np.asarray(t).astype(INDEX_TYPES[index]) for t in tables]


def gather_magic(g: FractionalPoolGeometry, channels: int) -> tuple:
    """Gather's multiply-shift pairs (magic, shift) for dividing by depth / channels, in_cols and
    in_rows (32-bit indexing; the 64-bit kernel divides and ignores them)."""
    return tuple(v for divisor in (g.depth // channels, g.in_cols, g.in_rows) for v in division_magic(max(1, divisor)))


#: Output rows (cells of one column) per select thread where consecutive row cells share a row
#: (:func:`select_run`): a run of 4 reads (rows - 3/4) rows per cell, not rows; longer runs
#: would save little more and leave fewer threads.
SELECT_RUN = 4


def select_run(g: FractionalPoolGeometry, run: int | None = None) -> int:
    """Output rows per select thread: :data:`SELECT_RUN` where some row cell's last row is the
    next cell's first (overlapping pooling), else 1 (nothing to share).  ``run`` (tests) forces
    it (at least 1)."""
    if run is not None:
        if run < 1:
            raise ValueError("a select run holds at least one output row")
        return int(run)
    shared = any(start == end for start, end in zip(g.row_starts[1:], g.row_ends[:-1]))
    return SELECT_RUN if shared else 1


def select_threads(g: FractionalPoolGeometry, channels: int, run: int) -> int:
    """Threads of the select kernel: one per (image, run of ``run`` output rows, output column,
    group of ``channels`` channels)."""
    return g.batch * -(-g.out_rows // run) * g.out_cols * (g.depth // channels)


MISMATCH = ("fractional_max_pool_grad: orig_output is not the max pooling of orig_input over the pooling "
            "sequences (TF: tensor_out_dup is not the same as tensor_out)")


def fractional_max_pool_grad(g: FractionalPoolGeometry, orig_input, orig_output, out_backprop, *,
                             path: str | None = None, index: str | None = None, vector: bool | None = None,
                             local: bool | None = None, run: int | None = None, chunk_rows: int | None = None,
                             block_vectors: int | None = None):
    """Input gradient [N, in_rows, in_cols, C] (NHWC) in the inputs' dtype.

    orig_input, orig_output, out_backprop: CuPy arrays on the current device, any strides.
    ``path`` forces the kernels (:func:`pick_path`),
    ``index`` forces "int" or "long long" indexing (tests run the 64-bit path on small problems),
    ``vector`` :func:`vector_channels` or 1 channels per thread (:func:`channels_per_thread`; the
    cells kernel :func:`cells_channels`),
    ``local`` cell places or flat offsets as the chosen elements (:func:`local_places`),
    ``run`` output rows per select thread (:func:`select_run`), ``chunk_rows`` and
    ``block_vectors`` the cells kernel's (:func:`max_cells_plan`).
    Raises InvalidArgumentError, as TF does, when orig_output is not the recomputed maxima.
    """
    import cupy

    dtype = np.dtype(orig_input.dtype)
    index = index or index_type(g)
    wide = _runtime.i32 if index == "int" else _runtime.i64
    x = _runtime.contiguous(orig_input)
    y = _runtime.contiguous(orig_output)
    dy = _runtime.contiguous(out_backprop)
    if pick_path(g, dtype, path) == "cells":
        v = cells_channels(g, dtype, (x, y, dy), vector)
        p = max_cells_plan(g, dtype, index=index, vector=v, chunk_rows=chunk_rows, block_vectors=block_vectors)
        key = ("max-cells", index, g.in_rows, g.in_cols, g.row_starts, g.row_ends, g.col_starts, g.col_ends,
               g.overlapping)
        packed, (row_bounds, col_bounds) = cached_tables(key, lambda: [t.astype(INDEX_TYPES[index]) for t in cells_bounds(g)])
        in_backprop = cupy.empty(g.input_shape, dtype)
        mismatch = cupy.zeros((1,), np.int32)
        fn = _runtime.kernel(SOURCE, _cells_expression(dtype, index, v, g.overlapping))
        fn(p.grid, p.block, (_runtime.pointer(x), _runtime.pointer(y), _runtime.pointer(dy), _runtime.pointer(in_backprop),
                             _runtime.pointer(mismatch), _runtime.pointer(packed, row_bounds),
                             _runtime.pointer(packed, col_bounds), *cells_scalars(g, p)))
        if int(cupy.asnumpy(mismatch)[0]):  # the one host synchronisation, TF's check
            raise InvalidArgumentError(MISMATCH)
        return in_backprop
    key = ("max", index, g.in_rows, g.in_cols, g.row_starts, g.row_ends, g.col_starts, g.col_ends)
    packed, offsets = cached_tables(key, lambda: kernel_tables(g, index))
    row_entries, col_entries, row_bounds, col_bounds, row_offsets, col_offsets = (
        _runtime.pointer(packed, o) for o in offsets)
    sizes = tuple(wide(v) for v in (g.batch, g.in_rows, g.in_cols, g.depth, g.out_rows, g.out_cols))
    v = channels_per_thread(g, dtype, (x, y, dy), vector)
    local = local_places(g, local)
    chosen = cupy.empty(g.output_shape, np.uint8 if local else INDEX_TYPES[index])
    mismatch = cupy.zeros((1,), np.int32)
    run = select_run(g, run)
    select = _runtime.kernel(SOURCE, _expression(KERNELS[0], dtype, index, v, local))
    _runtime.launch_1d(select, select_threads(g, v, run), (_runtime.pointer(x), _runtime.pointer(y), _runtime.pointer(chosen),
                                      _runtime.pointer(mismatch), row_bounds, col_bounds, *sizes, wide(run)))
    if int(cupy.asnumpy(mismatch)[0]):  # the one host synchronisation, TF's check
        raise InvalidArgumentError(MISMATCH)
    in_backprop = cupy.empty(g.input_shape, dtype)
    gather = _runtime.kernel(SOURCE, _expression(KERNELS[1], dtype, index, v, local))
    _runtime.launch_1d(gather, int(np.prod(g.input_shape)) // v,
                       (_runtime.pointer(dy), _runtime.pointer(chosen), _runtime.pointer(in_backprop),
                        row_offsets, row_entries, col_offsets, col_entries, *sizes, *gather_magic(g, v)))
    return in_backprop
