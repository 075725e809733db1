"""Launcher for cuda_src/fractional_pool.cu: the forward ``fractional_avg_pool`` and
``fractional_max_pool`` (see the .cu file's header comment for what they compute).

Both take the cells kernels' work split (:func:`.fractional_avg_pool_grad.cells_plan`: a thread
per batch item, cell column and vector of channels, down a chunk of cell rows) over any valid
sequences, and one table per dimension: each cell's first and last index.  The tables are built
and uploaded once per geometry, index type, device and stream and kept
(:func:`._runtime.cached_tables`), so a training loop that repeats a geometry uploads nothing
after its first call.  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import numpy as np

from ..._geometry import FractionalPoolGeometry
from . import _runtime
from ._runtime import cached_tables
from .fractional_avg_pool_grad import ELEMENT_TYPES, INDEX_TYPES, CellsPlan, cells_plan, cells_scalars

SOURCE = "fractional_pool.cu"
KERNELS = {"fractional_avg_pool": "gradops::fractional_avg_pool", "fractional_max_pool": "gradops::fractional_max_pool"}


def _expression(op: str, dtype, index: str, vector: int) -> str:
    return f"{KERNELS[op]}<{ELEMENT_TYPES[np.dtype(dtype)]}, {index}, {vector}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture): per op
    and dtype, 32- and 64-bit indexing, 16-byte vectors of channels or one channel a thread."""
    return {SOURCE: [_expression(op, dtype, index, vector) for op in KERNELS for dtype in ELEMENT_TYPES
                     for index in INDEX_TYPES for vector in (_runtime.vector_width(dtype), 1)]}


def cell_bounds(starts, ends) -> np.ndarray:
    """[first0, last0, first1, last1, ...] (int64) of one dimension's cells: the geometry's
    starts and clamped inclusive ends, (0, -1) for an empty cell (a start past the input may not
    fit the kernel's index type; an empty cell's start is never read)."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    empty = ends < starts
    return np.stack([np.where(empty, 0, starts), np.where(empty, -1, ends)], axis=1).reshape(-1)


def kernel_tables(g: FractionalPoolGeometry, p: CellsPlan) -> list[np.ndarray]:
    """The kernels' two table parameters in the plan's index type: row_bounds [2 * out_rows],
    col_bounds [2 * out_cols]."""
    return [cell_bounds(g.row_starts, g.row_ends).astype(INDEX_TYPES[p.index]),
            cell_bounds(g.col_starts, g.col_ends).astype(INDEX_TYPES[p.index])]


def device_tables(g: FractionalPoolGeometry, p: CellsPlan):
    """(device array, element offset of each table in it) for ``g`` and ``p`` on the current
    device and stream (:func:`._runtime.cached_tables`)."""
    key = ("forward", p.index, g.in_rows, g.in_cols, g.row_starts, g.row_ends, g.col_starts, g.col_ends)
    return cached_tables(key, lambda: kernel_tables(g, p))


def _pool(op: str, g: FractionalPoolGeometry, value, index, vector, chunk_rows, block_vectors):
    import cupy

    dtype = value.dtype
    if 0 in g.input_shape or 0 in g.output_shape:  # the geometry rejects these; stay safe
        return cupy.zeros(g.output_shape, dtype)
    if index is None and 2 * max(g.out_rows, g.out_cols) + 2 >= 2**31:
        index = "long long"  # the tables' (first, last) pairs are indexed by 2 * cell + 1
    value = _runtime.contiguous(value)
    output = cupy.empty(g.output_shape, dtype)
    p = cells_plan(g, dtype, aligned=_runtime.vector_aligned(value, output), index=index, vector=vector,
                   chunk_rows=chunk_rows, block_vectors=block_vectors)
    packed, offsets = device_tables(g, p)
    fn = _runtime.kernel(SOURCE, _expression(op, dtype, p.index, p.vector))
    args = (_runtime.pointer(value), _runtime.pointer(output), *(_runtime.pointer(packed, offset) for offset in offsets),
            *cells_scalars(g, p))
    fn(p.grid, p.block, args)
    return output


def fractional_avg_pool(g: FractionalPoolGeometry, value, *, index: str | None = None, vector: int | None = None,
                        chunk_rows: int | None = None, block_vectors: int | None = None):
    """[N, out_rows, out_cols, C] (NHWC) averages of value [N, in_rows, in_cols, C], a CuPy array
    on the current device with any strides, in its dtype.  Launches on the current stream
    without synchronising the host; the keywords force the launch's choices (tests use them on
    small problems, see :func:`.fractional_avg_pool_grad.cells_plan`)."""
    return _pool("fractional_avg_pool", g, value, index, vector, chunk_rows, block_vectors)


def fractional_max_pool(g: FractionalPoolGeometry, value, *, index: str | None = None, vector: int | None = None,
                        chunk_rows: int | None = None, block_vectors: int | None = None):
    """The maxima, as :func:`fractional_avg_pool` takes and returns its tensors."""
    return _pool("fractional_max_pool", g, value, index, vector, chunk_rows, block_vectors)
