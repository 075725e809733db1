"""Batched NCHW <-> NHWC transposes on the GPU (``cuda_src/layout_transpose.cuh``), for a
launcher that runs an NCHW call through an NHWC kernel.

The kernels are instantiated from the source of the op that uses them (that launcher's
``instantiations()`` lists :func:`expressions`).  They move bits only: one instantiation per
element width, so bfloat16, -0.0 and NaN payloads come through unchanged.  16-bit elements move
in 32-bit pairs (``transpose_batched_pairs``) where :func:`pairs_possible` holds.
"""

from __future__ import annotations

import numpy as np

from . import _runtime

KERNEL = "gradops::transpose_batched"
PAIRS_KERNEL = "gradops::transpose_batched_pairs"
#: Elements per tile side (``layout::kTile``; twice that for the pairs kernel) and warps per CTA
#: (``layout::kBlockRows``).
TILE = 32
PAIRS_TILE = 2 * TILE
BLOCK_ROWS = 4
#: The unsigned integer of each element width the kernel is instantiated with.
WORDS = {2: "unsigned short", 4: "unsigned", 8: "unsigned long long"}
INT32_MAX = 2**31 - 1


def expression(itemsize: int, index: str) -> str:
    """The name expression for elements of ``itemsize`` bytes and index type ``index``."""
    return f"{KERNEL}<{WORDS[itemsize]}, {index}>"


def pairs_expression(index: str) -> str:
    """The name expression of the paired 16-bit kernel with index type ``index``."""
    return f"{PAIRS_KERNEL}<{index}>"


def expressions() -> list[str]:
    """Every instantiation: each element width, then the 16-bit pairs; 32- and 64-bit indices."""
    indices = ("int", "long long")
    return [expression(size, index) for size in WORDS for index in indices] + [pairs_expression(i) for i in indices]


def index_type(batch: int, rows: int, cols: int) -> str:
    """``int`` where every offset either kernel forms (a whole last tile past each dimension
    included) fits in 32 bits, else ``long long``."""
    return "int" if batch * (rows + PAIRS_TILE) * (cols + PAIRS_TILE) <= INT32_MAX else "long long"


def pairs_possible(src, dst, rows: int, cols: int) -> bool:
    """Whether the paired kernel can move ``src`` to ``dst``: 16-bit elements, even rows and
    columns (every src and dst row a whole number of 32-bit words) and 4-byte aligned arrays."""
    return (np.dtype(src.dtype).itemsize == 2 and rows % 2 == 0 and cols % 2 == 0
            and _runtime.vector_aligned(src, dst, alignment=4))


def grid(batch: int, rows: int, cols: int, tile: int = TILE) -> tuple[int, int, int]:
    """(column tiles, row tiles, batch items) of ``tile`` x ``tile`` tiles, each within CUDA's grid
    limits (the kernels stride over the rest)."""
    return (min(-(-cols // tile), _runtime.GRID_X_LIMIT), min(-(-rows // tile), _runtime.GRID_YZ_LIMIT),
            min(batch, _runtime.GRID_YZ_LIMIT))


def transpose(source: str, src, dst, batch: int, rows: int, cols: int) -> None:
    """dst[n, j, i] = src[n, i, j] for src [batch, rows, cols] and dst [batch, cols, rows] (both
    C-contiguous CuPy arrays of one dtype, any other dimensions flattened into those), with the
    instantiation compiled from ``source``; on the current stream."""
    if batch * rows * cols == 0:
        return
    index = index_type(batch, rows, cols)
    scalar = _runtime.i32 if index == "int" else _runtime.i64
    if pairs_possible(src, dst, rows, cols):
        tile, name = PAIRS_TILE, pairs_expression(index)
    else:
        tile, name = TILE, expression(np.dtype(src.dtype).itemsize, index)
    _runtime.kernel(source, name)(grid(batch, rows, cols, tile), (TILE, BLOCK_ROWS),
                                  (_runtime.pointer(src), _runtime.pointer(dst),
                                   *(scalar(v) for v in (batch, rows, cols, -(-rows // tile), -(-cols // tile)))))
