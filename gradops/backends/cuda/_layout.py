"""Batched NCHW <-> NHWC transposes on the GPU (``cuda_src/layout_transpose.cuh``), for a
launcher that runs an NCHW call through an NHWC kernel.

The kernel is instantiated from the source of the op that uses it (that launcher's
``instantiations()`` lists :func:`expressions`).  It moves bits only: one instantiation per
element width, so bfloat16, -0.0 and NaN payloads come through unchanged.
"""

from __future__ import annotations

import numpy as np

from . import _runtime

KERNEL = "gradops::transpose_batched"
#: Elements per tile side (``layout::kTile``) and warps per CTA (``layout::kBlockRows``).
TILE = 32
BLOCK_ROWS = 4
#: The unsigned integer of each element width the kernel is instantiated with.
WORDS = {2: "unsigned short", 4: "unsigned", 8: "unsigned long long"}
INT32_MAX = 2**31 - 1


def expression(itemsize: int, index: str) -> str:
    """The name expression for elements of ``itemsize`` bytes and index type ``index``."""
    return f"{KERNEL}<{WORDS[itemsize]}, {index}>"


def expressions() -> list[str]:
    """Every instantiation: each element width, 32- and 64-bit indices."""
    return [expression(size, index) for size in WORDS for index in ("int", "long long")]


def index_type(batch: int, rows: int, cols: int) -> str:
    """``int`` where every offset the kernel forms (a whole last tile past each dimension
    included) fits in 32 bits, else ``long long``."""
    return "int" if batch * (rows + TILE) * (cols + TILE) <= INT32_MAX else "long long"


def grid(batch: int, rows: int, cols: int) -> tuple[int, int, int]:
    """(column tiles, row tiles, batch items), each within CUDA's grid limits (the kernel strides
    over the rest)."""
    return (min(-(-cols // TILE), _runtime.GRID_X_LIMIT), min(-(-rows // TILE), _runtime.GRID_YZ_LIMIT),
            min(batch, _runtime.GRID_YZ_LIMIT))


def transpose(source: str, src, dst, batch: int, rows: int, cols: int) -> None:
    """dst[n, j, i] = src[n, i, j] for src [batch, rows, cols] and dst [batch, cols, rows] (both
    C-contiguous CuPy arrays of one dtype, any other dimensions flattened into those), with the
    instantiation compiled from ``source``; on the current stream."""
    if batch * rows * cols == 0:
        return
    index = index_type(batch, rows, cols)
    scalar = _runtime.i32 if index == "int" else _runtime.i64
    fn = _runtime.kernel(source, expression(np.dtype(src.dtype).itemsize, index))
    fn(grid(batch, rows, cols), (TILE, BLOCK_ROWS),
       (_runtime.pointer(src), _runtime.pointer(dst),
        *(scalar(v) for v in (batch, rows, cols, -(-rows // TILE), -(-cols // TILE)))))
