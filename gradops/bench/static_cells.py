"""The fractional average pooling gradient's cells kernel in the static model (predicted, not measured).

``fractional_avg_pool_grad_cells`` (``cuda_src/fractional_avg_pool_grad.cu``) takes sequences whose
cells partition the input (TF's generator makes such sequences): a thread per (batch item, cell
column, vector of channels) walks down a chunk of cell rows, computes each cell's shares once and
stores them over the cell's region (``fractional_cells::for_each_cell_column``).  This module
prices one launch of it, as the launcher plans it (``cells_plan``), with the static report's limits
(:func:`gradops.bench.static_report.roofline`), so that the latency-aware estimate can rank it
against the staged gather kernel (``predict(..., path="cells")``).

The count, per warp (a warp is ``32 / block_vectors`` consecutive (batch item, cell column) pairs
of one block of channels, one chunk of cell rows):

- once per warp and chunk: every instruction outside the cell-row loop (the grid loops, the
  column's set-up, with overlapping cells the row above's shares), each branch counted;
- per cell row: the cell-row loop's own instructions (the shares: loads, the reciprocal, the
  roundings, every branch counted, Inf/NaN handling included: an upper bound);
- per input row of the cell: the row loop's own instructions, then the column loop's as often as
  the warp's widest region needs (its lanes run the union: a lane whose region is narrower
  idles).

The lanes of a warp share their cell rows, so only the columns diverge.  Warps whose pairs all
lie past the last column skip everything but the grid loops, which is not counted.  Latency: a
thread's cell rows are a chain of one DRAM round trip each (the next row's out_backprop load
comes after this row's stores in the unrolled-by-one loop), plus the row above's with overlapping
cells; the launch's waves of resident CTAs times that chain times the report's 600 ns round
trip.  L2: out_backprop read once per cell row and thread (with overlapping cells also the left
neighbour's and, once per chunk, the row above's), the gradient written once, the four tables.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter

import numpy as np

LAUNCHER = "gradops.backends.cuda.fractional_avg_pool_grad"
#: The cells kernel's loops inside its three grid-stride loops: cell rows, input rows, columns.
CELL_LOOP_DEPTH = 4


def launcher():
    return importlib.import_module(LAUNCHER)


def cells_expression(g, dtype) -> str:
    """The instantiation the launcher runs for ``g`` with fresh (aligned) arrays."""
    fr = launcher()
    p = fr.cells_plan(g, dtype)
    return fr._cells_expression(dtype, p.index, p.vector, g.overlapping)


def loop_counts(kernel) -> dict[str, Counter]:
    """Instruction counts (:func:`gradops.backends.cuda._sass.summarize`, cold blocks left out,
    every branch counted) of the cells kernel's parts: ``fixed`` (everything outside the cell-row
    loop), ``cell`` (the cell-row loop's own), ``row`` (the input-row loop's own), ``col`` (the
    column loop)."""
    from ..backends.cuda import _sass

    cfg = kernel.cfg
    cells = [loop for loop in cfg._loops() if loop.depth == CELL_LOOP_DEPTH]
    if len(cells) != 1:
        raise _sass.PathError(f"{kernel.expression}: expected one cell-row loop, found {len(cells)}")
    (cell,) = cells
    (row,) = cell.children
    (col,) = row.children
    everything = [x for n in sorted(cfg.blocks) if not cfg.cold(n) for x in cfg.instructions(n)]

    def count(instructions) -> Counter:
        return _sass.summarize(instructions)

    c_all, c_cell = count(everything), count(cfg.loop_instructions(cell))
    c_row, c_col = count(cfg.loop_instructions(row)), count(cfg.loop_instructions(col))
    return {"fixed": c_all - c_cell, "cell": c_cell - c_row, "row": c_row - c_col, "col": c_col}


def column_warps(g, block_vectors: int) -> tuple[int, int]:
    """(warps with at least one real column, sum over them of their widest region's columns
    beyond the first) of one block of channels and one chunk of cell rows: a warp holds
    ``32 // block_vectors`` consecutive (batch item, cell column) pairs."""
    per_warp = 32 // block_vectors
    widths = np.tile(np.diff(np.asarray(g.col_partition, dtype=np.int64)), g.batch)
    padded = np.zeros(-(-widths.size // per_warp) * per_warp, dtype=np.int64)
    padded[:widths.size] = widths
    widest = padded.reshape(-1, per_warp).max(axis=1)
    return int(widest.size), int((widest - 1).sum())


def warp_counts(kernel, g, p) -> tuple[float, Counter]:
    """(warp-instructions, their counts by class) of one launch with the launcher's plan ``p``."""
    parts = loop_counts(kernel)
    warps, extra_columns = column_warps(g, p.block_vectors)
    heights = np.diff(np.asarray(g.row_partition, dtype=np.int64))
    rows = int(heights.sum())
    weights = {"fixed": warps * p.row_chunks, "cell": warps * g.out_rows, "row": warps * rows,
               "col": rows * extra_columns}
    counts = Counter()
    for part, weight in weights.items():
        for key, v in parts[part].items():
            counts[key] += v * weight * p.channel_blocks
    return counts["total"], counts


def predict(case, dtype_name: str, device, kernel, g) -> dict:
    """The roofline of one fractional average pooling shape run by the cells kernel (module
    docstring), in the static report's prediction format."""
    from ..backends.cuda import _sass
    from . import static_tiled as st
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    fr = launcher()
    dtype = DTYPES[dtype_name]
    width = dtype.itemsize
    p = fr.cells_plan(g, dtype)
    if kernel.expression != fr._cells_expression(dtype, p.index, p.vector, g.overlapping):
        raise ValueError(f"{kernel.expression}: not the cells kernel the launcher runs for this shape")
    elements = math.prod(g.input_shape)
    outputs = math.prod(g.output_shape)
    warp_instructions, counts = warp_counts(kernel, g, p)
    per_element = 32 * warp_instructions / elements
    classes = {k.removeprefix("class:"): 32 * v / elements for k, v in counts.items() if k.startswith("class:")}
    tables = fr.INDEX_TYPES[p.index].itemsize * (2 * (g.out_rows + g.out_cols) + 2)
    traffic = bytes_moved(case, g, width) + tables
    neighbours = 1 + (2 if g.overlapping else 0) / max(p.chunk_rows, 1) + (1 if g.overlapping else 0)
    l2 = width * (outputs * neighbours + elements) + tables
    threads = p.block[0] * p.block[1]
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], threads)
    limits = roofline(device, elements, per_element, classes, traffic, l2, occ["warps_per_sm"] * 32)
    ctas = p.column_blocks * p.row_chunks * p.channel_blocks
    chain = p.chunk_rows + (1 if g.overlapping else 0)
    with_latency_limit(limits, device, traffic, st.latency_limit_s(device, ctas, occ, chain))
    warps, extra = column_warps(g, p.block_vectors)
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2,
            "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "cells": {"ctas": ctas, "threads_per_cta": threads, "chunk_rows": p.chunk_rows,
                      "round_trips": chain, "column_warps": warps,
                      "mean_extra_columns_per_warp": extra / warps if warps else 0.0,
                      "blocks_per_sm": occ["blocks_per_sm"]}}


def reference_paths(kernel) -> dict:
    """The kernel table's figures for a cells instantiation: its warp count (module docstring)
    per input-gradient element on the fractional suite's first shape of its mode (disjoint or
    overlapping), launched with the instantiation's index type and vector width."""
    from .static_report import _path_summary, fractional_reference_cases, template_args

    fr = launcher()
    element, index, vector, overlapping = (a.strip() for a in template_args(kernel.expression))
    dtype = next(d for d, c_type in fr.ELEMENT_TYPES.items() if c_type == element)
    case = fractional_reference_cases()[overlapping == "true"]
    g = case.geometry()
    p = fr.cells_plan(g, dtype, index=index, vector=int(vector))
    warp_instructions, counts = warp_counts(kernel, g, p)
    elements = math.prod(g.input_shape)
    parts = loop_counts(kernel)
    warps, extra = column_warps(g, p.block_vectors)
    per_row = parts["row"]["total"] + parts["col"]["total"] * extra / max(warps, 1)
    return {"work": f"{case.label}: every warp of the launch ({p.block[0]}x{p.block[1]} threads, chunks of "
                    f"{p.chunk_rows} cell rows, V={p.vector}); per cell row {parts['cell']['total']} (every "
                    f"branch), per input row {per_row:.0f}; path: a cell row of one input row and column",
            "per_element": 32 * warp_instructions / elements, "extra_text": f"fixed {parts['fixed']['total']}",
            "path": _path_summary(parts["cell"] + parts["row"]), "call_sites": 0}
