"""The planes filter-gradient kernel's window loads in pairs and in lane blocks, side by side
(static counts, predicted, not measured): global load sectors and SASS instructions of its
interior work items, per NCHW float16 benchmark layer.

The planes kernel (``depthwise_conv2d_native_backprop_filter_planes``, NCHW) gives lane l of a
warp interior item first + l of each step of 32 (numbered column fastest, ``dwplanes`` in the
kernel source).  In the pair forms each lane loads its whole window, 4-byte pairs of columns,
so a warp's load of one window row's pair j reads every other 4 bytes of 256 to 512 bytes:
Nsight Compute's "excess sectors" (63-88% of the kernel's sectors on the H100, 2026-12-06).  In
lane blocks (opt-in, ``lanes=True``) a lane loads its own 4 x stride columns in one 8- or 16-byte
load and takes the columns beside them from its neighbours by warp shuffles; a lane whose
neighbour is not adjacent (lanes 0 and 31, a box row's ends) loads those pairs itself.

Sectors: every step of the interior runs of the launcher's slices (all of them on layers of up
to 2,000 runs, else an even sample of 2,000), each warp-level load counted once per distinct
32-byte sector its lanes touch, ``ideal`` the sectors its distinct bytes fill (input 256-byte
aligned); the pair forms' loads as the source writes them (4 bytes a pair: ptxas narrows a
pair of which a window reads one value to 2 bytes, the same sectors), out_backprop's row loads
in both.  A lane past its run's end in lane blocks loads a stand-in item (image 0's first
interior item): counted.  Instructions: the cheapest path through one iteration of the
interior item loop (sm_90 SASS, ``static_report.filter_planes_item_cost`` for the pair form;
the lane-block loop found as the loop with a whole item's own-column loads), per out_backprop
element; registers and resident warps (128-thread CTAs) from ptxas.

    python benchmarks/planes_lane_blocks.py > benchmarks/results/planes_lane_blocks.md
"""

from __future__ import annotations

import importlib
import math
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradops.bench.suites import suite  # noqa: E402

dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")

SECTOR = 32
MAX_RUNS = 2000


def _interior_items(g, first: int, stop: int):
    """(image, item row, item column) of interior items first .. stop - 1 (column fastest)."""
    row0, row1, col0, col1 = dwf.planes_interior_box(g)
    cols, rows = col1 - col0, row1 - row0
    i = np.arange(first, stop)
    return i // (cols * rows), row0 + i // cols % rows, col0 + i % cols, i % cols, cols


def lane_block_loads(g) -> dict:
    """One window row of a float16 interior item in lane blocks (``dwplanes::LaneBlock``): its
    own columns' loads (``own``, of ``own_bytes``: up to 16 bytes a load) and the pairs before and
    after them (``left``, ``right``) that the neighbouring lanes send or the lane loads."""
    _, cols = dwf.planes_window_shape(g)
    block = dwf.planes_lane_block_cols(g)
    own_bytes = min(2 * block, 16)
    left = (g.pad_left + 1) // 2
    right = -(-(cols + g.pad_left % 2) // 2) - left - block // 2
    return {"own": 2 * block // own_bytes, "own_bytes": own_bytes, "left": left, "right": right}


def _sectors(starts: np.ndarray, width: int) -> tuple[int, int]:
    """(distinct sectors, sectors the distinct bytes fill) of one warp-level load: lanes reading
    ``width`` bytes at byte addresses ``starts``."""
    if starts.size == 0:
        return 0, 0
    touched = {sector for s in starts.tolist() for sector in range(s // SECTOR, (s + width - 1) // SECTOR + 1)}
    distinct = len({s + b for s in starts.tolist() for b in range(width)})
    return len(touched), -(-distinct // SECTOR)


def window_sectors(g, lanes: bool) -> dict:
    """Per 32 interior items (a warp's full step) of float16 ``g``: warp-level global loads,
    sectors and ideal sectors of their windows (pairs or lane blocks) and out_backprop rows (see
    the module docstring)."""
    width = 2
    item_rows, item_cols = dwf.planes_item_shape(g)
    window_rows, window_cols = dwf.planes_window_shape(g)
    s = g.stride_cols
    blocks = lane_block_loads(g)
    slices = dwf.planes_slicing(g)[0]
    interior, _, per_slice, _ = dwf.planes_runs(g, slices)
    runs = [(z * per_slice, min(interior, (z + 1) * per_slice)) for z in range(slices)]
    runs = [r for r in runs if r[0] < r[1]]
    if len(runs) > MAX_RUNS:
        runs = [runs[i] for i in np.linspace(0, len(runs) - 1, MAX_RUNS).astype(int)]
    plane = g.in_rows * g.in_cols
    out_plane = g.out_rows * g.out_cols
    totals = Counter()
    items = 0
    for first, stop in runs:
        for step in range(first, stop, 32):
            n, r, c, local_col, box_cols = _interior_items(g, step, step + 32)
            active = np.arange(step, step + 32) < stop
            items += int(active.sum())
            if lanes:  # lanes past the run's end load image 0's first interior item
                n0, r0, c0, _, _ = _interior_items(g, 0, 1)
                n, r, c = (np.where(active, a, b[0]) for a, b in ((n, n0), (r, r0), (c, c0)))
                loading = np.ones(32, bool)
            else:
                loading = active
            lane = np.arange(32)
            y0 = r * item_rows * g.stride_rows - g.pad_top
            q0 = c * item_cols
            base = (n * g.in_depth) * plane  # channel 0 (plane sizes here are multiples of 32 bytes)
            dy_base = (n * g.out_depth) * out_plane + r * item_rows * g.out_cols + q0
            loads = []
            for wr in range(window_rows):
                row = base + (y0 + wr) * g.in_cols
                if lanes:
                    own = row + q0 * s
                    for v in range(blocks["own"]):
                        loads.append((width * own + v * blocks["own_bytes"], blocks["own_bytes"], loading))
                    # The lanes whose neighbour holds the item beside theirs take its pairs by shuffle.
                    left = (lane > 0) & (local_col > 0) & active
                    right = (lane < 31) & (local_col + 1 < box_cols) & (np.arange(step, step + 32) + 1 < stop)
                    for j in range(blocks["left"]):
                        loads.append((width * (own - 2), 4, ~left))
                    for j in range(blocks["right"]):
                        loads.append((width * (own + item_cols * s + 2 * j), 4, ~right))
                else:
                    shift = g.pad_left % 2
                    x0 = q0 * s - g.pad_left
                    for j in range(-(-(window_cols + shift) // 2)):
                        loads.append((width * (row + x0 - shift + 2 * j), 4, loading))
            for a in range(item_rows):
                loads.append((width * (dy_base + a * g.out_cols), item_cols * width, loading))
            for starts, size, mask in loads:
                sectors, ideal = _sectors(np.asarray(starts)[mask], size)
                totals["loads"] += bool(mask.any())
                totals["sectors"] += sectors
                totals["ideal"] += ideal
    return {key: 32 * value / items for key, value in totals.items()}


def _interior_instructions(kernel, g, form: int) -> int:
    """SASS instructions of one interior item (the cheapest path through the item loop)."""
    from gradops.backends.cuda import _sass
    from gradops.bench import static_report as sr

    if form < dwf.PLANES_LANE_BLOCKS:
        return sr.filter_planes_item_cost(kernel, np.float16, g, True, form)[0][0]
    cfg = kernel.cfg
    rows, cols = dwf.planes_item_shape(g)
    window_rows, _ = dwf.planes_window_shape(g)
    blocks = lane_block_loads(g)
    own, own_bytes = window_rows * blocks["own"], blocks["own_bytes"]
    widths = {own_bytes, 4, cols * 2}
    key = own + window_rows * (blocks["left"] + blocks["right"]) + rows
    best = None
    # The item loops lie inside the kernel's pass loop (both passes run one copy of them).
    for lp in (inner for top in cfg.top_loops() for inner in (top.children or [top])):
        if sum(1 for x in cfg.loop_instructions(lp) if not x.predicate and _sass.is_global_load(x, own_bytes)) < own:
            continue
        try:
            table = cfg.path_table(lp, lambda ins: int(any(_sass.is_global_load(ins, w) for w in widths)),
                                   kmax=key + rows)
        except _sass.PathError:
            continue
        enough = [table[k][0] for k in table if k >= key]
        if enough and (best is None or min(enough) < best):
            best = min(enough)
    if best is None:
        raise _sass.PathError(f"{kernel.expression}: no lane-block item loop")
    return best


def main(argv: list[str]) -> str:
    from gradops.backends.cuda import _sass

    cases = []
    for name in ("mobilenetv2", "efficientnet"):
        for case in suite(name):
            if not case.op.endswith("backprop_filter") or case.data_format != "NCHW":
                continue
            g = case.geometry()
            if not (dwf.planes_eligible(g, np.float16) and dwf.planes_lane_blocks_possible(g, np.float16)):
                continue
            cases.append((name, case, g))
    expressions = {}
    for _, _, g in cases:
        for lanes in (False, True):
            form = dwf.planes_window_form(g, np.float16, pairs=True, lanes=lanes)
            expressions[(g.filter_rows, g.stride_rows, form)] = dwf._planes_expression(np.float16, g.filter_rows,
                                                                                        g.stride_rows, form)
    compiled = {k.expression: k for k in _sass.compile_kernels(("sm_90",), [dwf.SOURCE],
                                                               only=sorted(set(expressions.values())))}
    lines = ["# The planes filter-gradient kernel's window loads: pairs and lane blocks (static counts, predicted, "
             "not measured)",
             "",
             "Generated by `python benchmarks/planes_lane_blocks.py`; do not edit by hand.  float16, NCHW, the "
             "benchmark layers where lane blocks can run (in_cols a multiple of 4 x stride).  Per 32 interior work "
             "items (a warp's step; an item: 4 x 4 positions at stride 1, 2 x 4 at stride 2), over the launcher's "
             "slices: warp-level global loads of their windows and out_backprop, the 32-byte sectors they touch and "
             "the sectors their distinct bytes would fill (`ideal`; Nsight Compute's excess sectors are the "
             "difference), then sm_90 SASS "
             "instructions of the item loop's cheapest iteration, per out_backprop element, and the registers and "
             "resident warps an SM (128-thread CTAs).  Pairs: the launcher's form; lane blocks: `lanes=True`, "
             "opt-in until a GPU times both (`gradops-cuda:planes_pairs`, `gradops-cuda:planes_lanes`).  "
             "The module docstring states what is counted.",
             "",
             "| layer | form | warp loads a step | sectors a step | ideal | excess % | SASS an element | registers | "
             "warps an SM |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, case, g in cases:
        elements = math.prod(dwf.planes_item_shape(g))
        for lanes in (False, True):
            form = dwf.planes_window_form(g, np.float16, pairs=True, lanes=lanes)
            kernel = compiled[expressions[(g.filter_rows, g.stride_rows, form)]]
            counts = window_sectors(g, lanes)
            per_element = _interior_instructions(kernel, g, form) / elements
            registers = kernel.ptxas["registers"]
            warps = _sass.occupancy(90, registers, kernel.ptxas["shared_bytes"], dwf.PLANES_THREADS)["warps_per_sm"]
            excess = 100 * (counts["sectors"] - counts["ideal"]) / counts["sectors"]
            label = "lane blocks" if lanes else {dwf.PLANES_PAIRS: "pairs",
                                                 dwf.PLANES_PAIRS_FROM_COLUMN_BEFORE: "pairs (column before)"}[form]
            lines.append(f"| {name} {case.label} | {label} | {counts['loads']:.1f} | {counts['sectors']:.1f} | "
                         f"{counts['ideal']:.1f} | {excess:.0f} | {per_element:.2f} | {registers} | {warps} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(main(sys.argv[1:]))
