"""Launcher for cuda_src/fractional_avg_pool_grad.cu.

The geometry's pooling cells (validated once, on the host) become small int64 tables: for
each input row (column), the list of row (column) cells containing it in cell order (CSR:
offsets and cell indices; cells need not be ordered, empty cells are in no list), and each
cell's size.  They go to the device in one upload on the current stream; the kernel then
gathers each input element's shares.  CuPy is imported only when a call runs.
"""

from __future__ import annotations

import numpy as np

from ..._geometry import FractionalPoolGeometry, cells_by_index
from . import _build, _runtime

SOURCE = "fractional_avg_pool_grad.cu"
KERNEL = "gradops::fractional_avg_pool_grad"

#: C++ element type per dtype: the float types as everywhere, plus TF's integer types.
ELEMENT_TYPES = {
    **{dtype: element for dtype, (element, _) in _build.C_TYPES.items()},
    np.dtype(np.int32): "int",
    np.dtype(np.int64): "long long",
}
#: TF sums every dtype's shares in double (see the .cu file), half types included.
ACCUMULATOR = "double"


def _expression(dtype) -> str:
    return f"{KERNEL}<{ELEMENT_TYPES[np.dtype(dtype)]}, {ACCUMULATOR}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """Every name expression the launcher can ask for (the same on every architecture): one per supported dtype."""
    return {SOURCE: [_expression(dtype) for dtype in ELEMENT_TYPES]}


def cell_tables(starts, ends, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell_offsets [in_size + 1], cells [entries], cell_sizes [cells]) of one dimension, int64.

    Input index i lies in cells ``cells[cell_offsets[i]:cell_offsets[i + 1]]``, in increasing
    cell order (TF's summation order); a cell ending before it starts is empty, in no list,
    and has size 0.  Starts and ends are the geometry's (clamped, inclusive, in any order).
    """
    offsets, cells = cells_by_index(starts, ends, in_size)
    sizes = np.maximum(np.asarray(ends, np.int64) - np.asarray(starts, np.int64) + 1, 0)
    return offsets, cells, sizes


def kernel_tables(g: FractionalPoolGeometry) -> list[np.ndarray]:
    """The kernel's six int64 table parameters, in order: rows' cell_offsets, cells,
    cell_sizes, then the same for columns (see :func:`cell_tables`)."""
    return [*cell_tables(g.row_starts, g.row_ends, g.in_rows),
            *cell_tables(g.col_starts, g.col_ends, g.in_cols)]


def kernel_scalars(g: FractionalPoolGeometry) -> tuple[np.int64, ...]:
    """The kernel's ``long long`` parameters, in order, after its pointers."""
    return tuple(_runtime.i64(v) for v in (g.batch, g.in_rows, g.in_cols, g.depth, g.out_rows, g.out_cols))


def fractional_avg_pool_grad(g: FractionalPoolGeometry, out_backprop):
    """Input gradient [N, in_rows, in_cols, C] (NHWC) in out_backprop's dtype.

    out_backprop: [N, out_rows, out_cols, C], a CuPy array on the current device, any strides.
    Launches on the current stream without synchronising the host.
    """
    import cupy

    dtype = out_backprop.dtype
    if 0 in g.input_shape or 0 in out_backprop.shape:  # the geometry rejects these; stay safe
        return cupy.zeros(g.input_shape, dtype)
    tables = kernel_tables(g)
    # One upload: CuPy stages host data through pinned memory and copies on the current stream.
    packed = cupy.asarray(np.concatenate(tables))
    offsets = np.cumsum([0] + [len(t) for t in tables[:-1]])
    out_backprop = _runtime.contiguous(out_backprop)
    in_backprop = cupy.empty(g.input_shape, dtype)
    fn = _runtime.kernel(SOURCE, _expression(dtype))
    args = (_runtime.pointer(out_backprop), _runtime.pointer(in_backprop),
            *(_runtime.pointer(packed, int(offset)) for offset in offsets), *kernel_scalars(g))
    _runtime.launch_1d(fn, in_backprop.size, args)
    return in_backprop
