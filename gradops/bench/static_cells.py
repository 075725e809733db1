"""The fractional pooling gradients' cells kernels in the static model (predicted, not measured).

``fractional_avg_pool_grad_cells`` and ``fractional_max_pool_grad_cells`` take sequences whose
cells partition the input (TF's generator makes such sequences): a thread per (batch item, cell
column, vector of channels) walks down a chunk of cell rows and writes each cell's region
(``fractional_cells::for_each_cell_column``).  This module prices one launch of either, as its
launcher plans it (``cells_plan``, ``max_cells_plan``), with the static report's limits
(:func:`gradops.bench.static_report.roofline`), so that the latency-aware estimate can rank it
against the gather kernels (``predict(..., path="cells")``).  Max pooling's count is
:func:`max_warp_counts`'; average pooling's follows.

The count, per warp (a warp is ``32 / block_vectors`` consecutive (batch item, cell column) pairs
of one block of channels, one chunk of cell rows):

- once per warp and chunk: every instruction outside the cell-row loop (the grid loops, the
  column's set-up, with overlapping cells the row above's shares), each branch counted;
- per cell row: the cell-row loop's own instructions (the shares: loads, the reciprocal, the
  roundings, every branch counted, Inf/NaN handling included: an upper bound; blocks that call
  a subroutine are left out as cold: the float reciprocal's slow path and, for disjoint float32
  cells, the out-of-line division of results below 2**-126 or of Inf and NaN);
- per input row of the cell: the row loop's own instructions, then the column loop's as often as
  the warp's widest region needs (its lanes run the union: a lane whose region is narrower
  idles).  Overlapping cells summed in double run two cell rows an iteration and write a region
  as its corner (counted in the cell row), its first row's other columns (per cell row, as often
  as the widest region needs), its other rows' first column and their other columns (per input
  row past a region's first): :func:`loop_counts`.

The lanes of a warp share their cell rows, so only the columns diverge.  Warps whose pairs all
lie past the last column skip everything but the grid loops, which is not counted.  Latency: a
thread's iterations of the cell-row loop are a chain (an iteration's loads come after the
previous one's stores), each iteration the round trips its SASS waits for (a load whose result
is used before the next load is issued ends one; overlapping cells load a cell row's own and
left neighbour's vectors together at its top: one a cell row), plus the row above's with
overlapping cells: :func:`chain_round_trips`; the launch's waves of resident CTAs times that
chain times the report's 600 ns round trip.  L2: out_backprop read once per cell row and thread
(with overlapping cells also the left neighbour's and, once per chunk, the row above's), the
gradient written once, the four tables.
"""

from __future__ import annotations

import importlib
import math
from collections import Counter

import numpy as np

#: The cells kernels' cell-row loop lies inside their three grid-stride loops.
CELL_LOOP_DEPTH = 4


def launcher():
    """The fractional average pooling launcher module."""
    from .static_tiled import fractional_launcher

    return fractional_launcher()


def cells_launch(g, dtype):
    """(expression, plan) of the average pooling cells kernel the launcher runs for ``g`` with
    fresh (aligned) arrays."""
    fr = launcher()
    p = fr.cells_plan(g, dtype)
    return fr._cells_expression(dtype, p.index, p.vector, g.overlapping), p


def _cell_loop(kernel):
    """The cell-row loop: the largest loop at :data:`CELL_LOOP_DEPTH` (with overlapping max
    pooling cells, a chunk's rescans of the row above sit beside it)."""
    from ..backends.cuda import _sass

    loops = [loop for loop in kernel.cfg._loops() if loop.depth == CELL_LOOP_DEPTH]
    if not loops:
        raise _sass.PathError(f"{kernel.expression}: no cell-row loop")
    return max(loops, key=lambda loop: len(kernel.cfg.loop_instructions(loop)))


def _counts(kernel, loop=None) -> Counter:
    """:func:`gradops.backends.cuda._sass.summarize` of a loop's instructions, or (None) of the
    whole kernel's, cold blocks left out."""
    from ..backends.cuda import _sass

    cfg = kernel.cfg
    if loop is not None:
        return _sass.summarize(cfg.loop_instructions(loop))
    return _sass.summarize([x for n in sorted(cfg.blocks) if not cfg.cold(n) for x in cfg.instructions(n)])


def _mean(counters) -> Counter:
    """The mean of ``counters`` (equal parts of one loop unrolled), key by key."""
    total = Counter()
    for c in counters:
        total.update(c)
    return Counter({key: v / len(counters) for key, v in total.items()})


def loop_counts(kernel) -> dict[str, Counter]:
    """Instruction counts (:func:`gradops.backends.cuda._sass.summarize`, cold blocks left out,
    every branch counted) of the cells kernel's parts: ``fixed`` (everything outside the cell-row
    loop) and ``cell`` (the cell-row loop's own, per cell row), then the region's stores.

    * One cell row an iteration (disjoint cells; overlapping ones summed in float-float):
      ``row`` (the input-row loop's own) and ``col`` (its column loop).
    * Two or more (overlapping cells' double shares, unrolled so that the carried shares are not
      copied): each row's region is written by the corner's store and three loops, in this
      order, each the mean of its unrolled copies: ``top`` (the first row's other columns),
      ``left`` (the other rows' first column), ``inner_row`` and its ``inner_col`` (the other
      rows' other columns)."""
    cell = _cell_loop(kernel)
    children = sorted(cell.children, key=lambda loop: loop.header)
    if len(children) == 1:
        (row,) = children
        (col,) = row.children
        c_cell, c_row, c_col = _counts(kernel, cell), _counts(kernel, row), _counts(kernel, col)
        return {"fixed": _counts(kernel) - c_cell, "cell": c_cell - c_row, "row": c_row - c_col, "col": c_col}
    copies = [children[i:i + 3] for i in range(0, len(children), 3)]
    if len(children) % 3 or any([len(top.children), len(left.children), len(inner.children)] != [0, 0, 1]
                                for top, left, inner in copies):
        raise ValueError(f"{kernel.expression}: a cell-row loop of {len(children)} loops, not the regions' "
                         "top, left and inner loops a cell row")
    c_cell = _counts(kernel, cell)
    own = c_cell.copy()
    for loop in children:
        own.subtract(_counts(kernel, loop))
    inner_cols = [_counts(kernel, inner.children[0]) for _, _, inner in copies]
    return {"fixed": _counts(kernel) - c_cell, "cell": Counter({key: v / len(copies) for key, v in own.items()}),
            "top": _mean([_counts(kernel, top) for top, _, _ in copies]),
            "left": _mean([_counts(kernel, left) for _, left, _ in copies]),
            "inner_row": _mean([_counts(kernel, inner) - col for (_, _, inner), col in zip(copies, inner_cols)]),
            "inner_col": _mean(inner_cols)}


def cell_rows_per_iteration(kernel) -> int:
    """Cell rows one iteration of the cell-row loop handles: 1, or (overlapping cells' double
    shares) as many as the loop holds copies of the region's three loops."""
    children = _cell_loop(kernel).children
    return 1 if len(children) == 1 else len(children) // 3


def chain_round_trips(kernel, chunk_rows: int, overlapping: bool) -> int:
    """A thread's dependent memory round trips (module docstring): the cell-row loop's iterations
    times the round trips of one (``Cfg.loop_round_trips``, in address order: an upper bound),
    plus the row above's with overlapping cells."""
    per_iteration = kernel.cfg.loop_round_trips(_cell_loop(kernel))
    return -(-chunk_rows // cell_rows_per_iteration(kernel)) * per_iteration + (1 if overlapping else 0)


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
    weights = {"fixed": warps * p.row_chunks, "cell": warps * g.out_rows}
    if "row" in parts:
        weights.update(row=warps * rows, col=rows * extra_columns)
    else:  # a region's first row, then its other rows (rows - out_rows of them in all)
        weights.update(top=g.out_rows * extra_columns, left=warps * (rows - g.out_rows),
                       inner_row=warps * (rows - g.out_rows), inner_col=(rows - g.out_rows) * extra_columns)
    counts = Counter()
    for part, weight in weights.items():
        for key, v in parts[part].items():
            counts[key] += v * weight * p.channel_blocks
    return counts["total"], counts


def _prediction(case, dtype_name: str, device, kernel, g, p, warp_instructions: float, counts: Counter,
                tables: int, l2_bytes: float, round_trips: float, **cells) -> dict:
    """One cells kernel's prediction in the static report's format: its instructions per
    input-gradient element and by pipe, DRAM (compulsory bytes and ``tables``), ``l2_bytes``,
    the occupancy of the plan ``p``'s block and the latency of ``round_trips`` a thread over the
    launch's waves of CTAs; ``cells``: figures added to the row's ``cells`` entry."""
    from ..backends.cuda import _sass
    from . import static_tiled as st
    from .metrics import bytes_moved
    from .static_report import DTYPES, roofline, with_latency_limit

    elements = math.prod(g.input_shape)
    per_element = 32 * warp_instructions / elements
    classes = {k.removeprefix("class:"): 32 * v / elements for k, v in counts.items() if k.startswith("class:")}
    compulsory = bytes_moved(case, g, DTYPES[dtype_name].itemsize)
    traffic = compulsory + tables
    threads = p.block[0] * p.block[1]
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], threads)
    limits = roofline(device, elements, per_element, classes, traffic, l2_bytes, occ["warps_per_sm"] * 32)
    ctas = p.column_blocks * p.row_chunks * p.channel_blocks
    with_latency_limit(limits, device, traffic, st.latency_limit_s(device, ctas, occ, round_trips))
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "compulsory_bytes": compulsory,
            "l2_bytes": l2_bytes, "sass_per_element": per_element, "resident_warps_per_sm": occ["warps_per_sm"],
            **limits, "cells": {"ctas": ctas, "threads_per_cta": threads, "chunk_rows": p.chunk_rows,
                                "round_trips": round_trips, "blocks_per_sm": occ["blocks_per_sm"], **cells}}


def predict(case, dtype_name: str, device, kernel, g) -> dict:
    """The roofline of one fractional average pooling shape run by the cells kernel (module
    docstring), in the static report's prediction format."""
    from .static_report import DTYPES

    dtype = DTYPES[dtype_name]
    expression, p = cells_launch(g, dtype)
    if kernel.expression != expression:
        raise ValueError(f"{kernel.expression}: not the cells kernel the launcher runs for this shape")
    warp_instructions, counts = warp_counts(kernel, g, p)
    tables = launcher().INDEX_TYPES[p.index].itemsize * (2 * (g.out_rows + g.out_cols) + 2)
    neighbours = 1 + ((1 + 2 / p.chunk_rows) if g.overlapping else 0)
    l2 = dtype.itemsize * (math.prod(g.output_shape) * neighbours + math.prod(g.input_shape)) + tables
    warps, extra = column_warps(g, p.block_vectors)
    return _prediction(case, dtype_name, device, kernel, g, p, warp_instructions, counts, tables, l2,
                       chain_round_trips(kernel, p.chunk_rows, g.overlapping), column_warps=warps,
                       mean_extra_columns_per_warp=extra / warps if warps else 0.0)


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
    if "row" in parts:
        per_row = parts["row"]["total"] + parts["col"]["total"] * extra / max(warps, 1)
        path = parts["cell"] + parts["row"]
    else:  # an input row past a region's first: its left and inner loops (the corner is the cell row's)
        per_row = (parts["left"]["total"] + parts["inner_row"]["total"]
                   + parts["inner_col"]["total"] * extra / max(warps, 1))
        path = parts["cell"]
    return {"work": f"{case.label}: every warp of the launch ({p.block[0]}x{p.block[1]} threads, chunks of "
                    f"{p.chunk_rows} cell rows, V={p.vector}); per cell row {parts['cell']['total']} (every "
                    f"branch), per input row {per_row:.0f}; path: a cell row of one input row and column",
            "per_element": 32 * warp_instructions / elements, "extra_text": f"fixed {parts['fixed']['total']}",
            "path": _path_summary(path), "call_sites": 0}


# --------------------------------------------------------------------------- max pooling's cells kernel

MAX_LAUNCHER = "gradops.backends.cuda.fractional_max_pool_grad"


def max_launcher():
    return importlib.import_module(MAX_LAUNCHER)


def max_cells_launch(g, dtype):
    """(expression, plan) of the max pooling cells kernel the launcher runs for ``g`` with fresh
    (aligned) arrays; the plan's vector is the kernel's channels a thread."""
    fm = max_launcher()
    v = fm.cells_channels(g, dtype)
    p = fm.max_cells_plan(g, dtype, index=fm.index_type(g), vector=v)
    return fm._cells_expression(dtype, p.index, v, g.overlapping), p


def max_loop_parts(kernel, vector: int) -> dict:
    """The max pooling cells kernel's parts (:func:`gradops.backends.cuda._sass.summarize`
    counts, cold blocks left out): ``fixed`` (outside the cell-row loop), ``cell`` (the cell-row
    loop's own, every branch), ``first_row`` (overlapping: the store loop of the region's first
    row after its first element, an iteration), ``row`` and ``interior`` (the later rows' loop's
    own, an iteration, and its column loop's), and ``scan``: {elements compared: cheapest path
    through one iteration of the scan loop} (a row of at most 4 columns loaded together, one
    FSETP or DSETP a channel and element, or with PairScan one HSET2 a pair of channels and
    element; integer elements: ValueError)."""
    if "<int," in kernel.expression or "<long long," in kernel.expression:
        raise ValueError("integer elements: the scan's compares (ISETP) are not told from its loop control")
    cfg = kernel.cfg
    cell = _cell_loop(kernel)
    children = sorted(cell.children, key=lambda loop: loop.header)
    bases = [Counter(i.base for i in cfg.loop_instructions(loop)) for loop in children]
    scans = [(loop, b) for loop, b in zip(children, bases) if b["LDG"] and not b["STG"] and not loop.children]
    # Half types where the GPU compares them in pairs have two narrow scans: PairScan (HSET2, two
    # channels a compare), which every cell below 2**16 elements takes, and ChannelScan for the rest.
    pairs = [loop for loop, b in scans if b["HSET2"]]
    (scan,) = pairs or [loop for loop, _ in scans]
    first_rows = [loop for loop, b in zip(children, bases) if b["STG"] and not loop.children]
    (rows,) = [loop for loop, b in zip(children, bases) if b["STG"] and loop.children]
    (interior,) = rows.children
    own = _counts(kernel, cell)
    for loop in children:
        own = own - _counts(kernel, loop)
    # one compare a channel and element: FSETP (the half types compare as float), DSETP for
    # double; PairScan's HSET2, one a pair of channels and element
    if pairs:
        per_element = vector // 2
        table = cfg.path_table(scan, counted=lambda i: i.base == "HSET2", kmax=4 * per_element)
    else:
        per_element = vector
        table = cfg.path_table(scan, counted=lambda i: i.base in ("FSETP", "DSETP"), kmax=4 * vector)
    return {"fixed": _counts(kernel) - _counts(kernel, cell), "cell": own,
            "first_row": _counts(kernel, first_rows[0]) if first_rows else Counter(),
            "row": _counts(kernel, rows) - _counts(kernel, interior), "interior": _counts(kernel, interior),
            "scan": {k // per_element: table[k] for k in table if k % per_element == 0}}


def max_warp_columns(g, p) -> list[tuple[int, int]]:
    """(the widest scan, the widest region) in columns of each warp of one block row of the grid
    (every column block; one chunk of cell rows and one block of channels), for warps with at
    least one lane that has a cell column; overlapping: threadIdx.y 0 is the halo (column j0 - 1,
    scanned only), and a cell's scan takes the next region's first column too."""
    widths = np.diff(np.asarray(g.col_partition, dtype=np.int64))
    out_cols = widths.size
    scan = widths + ((np.arange(out_cols) + 1 < out_cols) if g.overlapping else 0)
    columns = g.batch * out_cols
    block_y = p.block[1]
    lanes_y = 32 // p.block_vectors  # thread rows (threadIdx.y) a warp holds
    warps = []
    for bx in range(p.column_blocks):
        for w in range(block_y // lanes_y if block_y % lanes_y == 0 else -(-block_y // lanes_y)):
            ty = np.arange(w * lanes_y, min((w + 1) * lanes_y, block_y))
            j = bx * p.block_columns + ty - (1 if p.halo else 0)
            j = j[(j >= 0) & (j < columns)]
            if j.size:
                c = j % out_cols
                warps.append((int(scan[c].max()), int(widths[c].max())))
    return warps


def max_warp_counts(kernel, g, p) -> tuple[float, Counter, float]:
    """(warp-instructions, their counts by class, a thread's dependent round trips) of one launch
    of the max pooling cells kernel with plan ``p``: per warp and chunk of cell rows, the fixed
    part once; per cell row it scans (its chunk's, and with overlapping cells the row above the
    chunk's first) the cell-row loop's own and the scan of the warp's widest cell (the region's
    rows, plus the next region's first with overlapping cells; each scanned row the cheapest
    scan iteration comparing that many elements, the first one fewer); per cell row it writes,
    the stores of the warp's widest region (disjoint: a row loop iteration per row and a column
    loop iteration, which stores, per element; overlapping: the region's first element in the
    cell-row loop's own, the first row's loop for each of its other elements, then per later
    row the row loop's iteration, which stores its first column, and the column loop's for the
    others)."""
    parts = max_loop_parts(kernel, p.vector)
    scan_table = parts["scan"]
    heights = np.diff(np.asarray(g.row_partition, dtype=np.int64))
    out_rows = heights.size
    overlapping = bool(g.overlapping)
    scanned = heights + ((np.arange(out_rows) + 1 < out_rows) if overlapping else 0)

    # Every count is linear in the parts, so each part's multiplicity is summed over the chunks
    # and the warps first (a warp's by its widths: warps of the same widths count alike), and
    # the parts are weighted once.
    warps = Counter(max_warp_columns(g, p))
    for width in {scan_width for scan_width, _ in warps}:  # every chunk scans at least one row
        if width > 4 or width not in scan_table or width - 1 not in scan_table:
            raise ValueError(f"{kernel.expression}: no narrow scan path of {width} columns")
    weights = Counter()   # part name -> times
    scans = Counter()     # scan_table key (elements compared) -> scanned rows
    for chunk in range(p.row_chunks):
        r0, r1 = chunk * p.chunk_rows, min((chunk + 1) * p.chunk_rows, out_rows)
        first = r0 - 1 if overlapping and r0 > 0 else r0
        scanned_rows = r1 - first
        later_rows = int(heights[r0:r1].sum()) - (r1 - r0 if overlapping else 0)
        scanned_below_first = int(scanned[first:r1].sum()) - scanned_rows
        for (scan_width, width), n in warps.items():
            weights["fixed"] += n
            weights["cell"] += n * scanned_rows
            scans[scan_width - 1] += n * scanned_rows  # a cell's first row compares one element fewer
            scans[scan_width] += n * scanned_below_first
            if overlapping:  # the region's first element is the cell-row loop's own
                weights["first_row"] += n * (width - 1) * (r1 - r0)
            weights["row"] += n * later_rows
            # the later rows' own loop stores their first column where cells overlap
            weights["interior"] += n * later_rows * (width - 1 if overlapping else width)
    total = Counter()
    terms = [(parts[name], times) for name, times in weights.items()]
    terms += [(scan_table[width][1], times) for width, times in scans.items()]
    for counter, times in terms:
        for key, v in counter.items():
            total[key] += v * times
    counts = Counter({k: v * p.channel_blocks for k, v in total.items()})
    trips = p.chunk_rows * float(np.mean(scanned - (1 if overlapping else 0))) + (
        float(np.mean(scanned)) if overlapping else 0.0)
    return counts["total"], counts, trips


def predict_max(case, dtype_name: str, device, kernel, g) -> dict:
    """The roofline of one fractional max pooling shape run by the cells kernel (one kernel in
    place of select + gather; :func:`max_warp_counts`), per input-gradient element.  DRAM:
    compulsory bytes and the two bound tables; L2: every scanned element once (with overlapping
    cells the shared rows and columns twice, less the rows a thread holds), orig_output and
    out_backprop once per cell, the gradient written; latency: waves of resident CTAs x a
    thread's chain of round trips (a scanned row each) x 600 ns."""
    from .static_report import DTYPES

    dtype = DTYPES[dtype_name]
    expression, p = max_cells_launch(g, dtype)
    if kernel.expression != expression:
        raise ValueError(f"{kernel.expression}: not the cells kernel the launcher runs for this shape")
    warp_instructions, counts, trips = max_warp_counts(kernel, g, p)
    tables = max_launcher().INDEX_TYPES[p.index].itemsize * (g.out_rows + g.out_cols + 2)
    heights = np.diff(np.asarray(g.row_partition, dtype=np.int64)) + (1 if g.overlapping else 0)
    widths = np.diff(np.asarray(g.col_partition, dtype=np.int64)) + (1 if g.overlapping else 0)
    scanned = g.batch * g.depth * float(heights.sum() * widths.sum())
    l2 = dtype.itemsize * (scanned + 2 * math.prod(g.output_shape) + math.prod(g.input_shape)) + tables
    return _prediction(case, dtype_name, device, kernel, g, p, warp_instructions, counts, tables, l2, trips,
                       column_warps=len(max_warp_columns(g, p)))


def max_reference_paths(kernel) -> dict:
    """The kernel table's figures for a max pooling cells instantiation: its warp count
    (:func:`max_warp_counts`) per input-gradient element on the fractional suite's first max
    pooling shape of its mode, with the instantiation's index type and channels a thread."""
    from .static_report import FRACTIONAL_MAX, _path_summary, suite, template_args

    fm = max_launcher()
    element, index, vector, overlapping = (a.strip() for a in template_args(kernel.expression))
    dtype = next(d for d, c_type in fm.ELEMENT_TYPES.items() if c_type == element)
    case = next(c for c in suite("fractional") if c.op == FRACTIONAL_MAX and c.overlapping == (overlapping == "true"))
    g = case.geometry()
    vector = int(vector)
    if g.depth % vector:
        return {"not_modelled": f"not modelled: {vector} channels a thread do not divide the suite's depth"}
    p = fm.max_cells_plan(g, dtype, index=index, vector=vector)
    warp_instructions, _, trips = max_warp_counts(kernel, g, p)
    parts = max_loop_parts(kernel, vector)
    # overlapping: the cell-row loop's own stores a region's first element
    stores = Counter() if g.overlapping else parts["row"] + parts["interior"]
    one = parts["cell"] + parts["scan"][0][1] + stores
    return {"work": f"{case.label}: every warp of the launch ({p.block[0]}x{p.block[1]} threads, chunks of "
                    f"{p.chunk_rows} cell rows, {vector} channels a thread); per cell row {parts['cell']['total']} "
                    f"(every branch) + its scan, a scanned row of 1 / 2 / 3 columns "
                    f"{' / '.join(str(parts['scan'][w][0]) for w in (1, 2, 3) if w in parts['scan'])}; "
                    f"path: a cell row of one element",
            "per_element": 32 * warp_instructions / math.prod(g.input_shape),
            "extra_text": f"{trips:.1f} round trips a thread", "path": _path_summary(one), "call_sites": 0}
