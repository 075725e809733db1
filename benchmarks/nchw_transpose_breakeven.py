"""When the depthwise input gradient's transpose path can beat its NCHW kernels, from H200 times.

    PYTHONPATH=. python3 benchmarks/nchw_transpose_breakeven.py [--measured JSON] [--arch sm_90]

The transpose path (``path="transpose"``) runs an NCHW call as NHWC: out_backprop transposed to
NHWC, the tiled kernel, the result transposed back.  It adds the two transposes' bytes, 2 x
(out_backprop + input gradient): each is read and written once more.  For every benchmark case
the H200 run measured in both layouts (``measured_vs_predicted.json``: Nsight Compute kernel
times of the launcher's kernels), this writes

* **measured** (H200, revision cb65573; the tiled kernel has not changed since): the launcher's
  NCHW time and the tiled kernel's NHWC time;
* the **break-even**: the fraction of 4.8 TB/s at which the two transposes, moving those bytes,
  would take exactly the time NCHW loses to NHWC.  It uses the measured times and exact byte
  counts only; the path wins wherever its transposes run faster than that;
* **predicted, not measured**: the transposes' SASS per element (full tiles, from ``--arch``),
  and the path's time if the transposes reach 60% of 4.8 TB/s (the NHWC time is the measured
  one; 60% is an assumption, not a figure of this kernel).

Cases whose break-even is above 100% cannot gain on this GPU however fast the transposes run.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import numpy as np

from gradops.backends.cuda import _layout, _sass
from gradops.bench import suites

BANDWIDTH = 4.8e12
ASSUMED_EFFICIENCY = 0.6
OP = "depthwise_conv2d_native_backprop_input"
SOURCE = "depthwise_conv2d_native_backprop_input.cu"
DEFAULT_MEASURED = Path(__file__).parent / "results" / "gpu_h200_2026-11-28" / "measured_vs_predicted.json"


def _shortest(cfg, blocks, start: int, goal: int, header: int) -> float:
    """Instructions on the cheapest path from ``start`` to ``goal`` within ``blocks`` (both
    counted; back edges to the loop header not followed), by Dijkstra on block sizes."""
    import heapq

    best, queue = {start: len(cfg.instructions(start))}, [(len(cfg.instructions(start)), start)]
    while queue:
        cost, block = heapq.heappop(queue)
        if block == goal:
            return cost
        if cost > best.get(block, float("inf")):
            continue
        for succ in cfg.blocks[block].succs:
            if succ in blocks and succ != header:
                total = cost + len(cfg.instructions(succ))
                if total < best.get(succ, float("inf")):
                    best[succ] = total
                    heapq.heappush(queue, (total, succ))
    return float("inf")


def full_tile_instructions(arch: str) -> dict[str, float]:
    """SASS instructions per element on each transpose kernel's full-tile path (32-bit
    indices): the cheapest trip around its tile loop that passes the block issuing a thread's
    loads unchecked (as many global loads as the thread has elements) and then the one issuing
    its stores likewise, divided by those elements (words x 2 for the 16-bit pairs)."""
    names = {_layout.expression(w, "int"): f"{w}-byte elements" for w in _layout.WORDS}
    names[_layout.pairs_expression("int")] = "16-bit pairs"
    out = {}
    for kernel in _sass.compile_kernels((arch,), [SOURCE], only=list(names)):
        cfg = kernel.cfg
        (inner,) = [loop for loop in cfg.loops if not loop.children]
        pairs = "_pairs<" in kernel.expression
        steps = (2 * _layout.TILE if pairs else _layout.TILE) // _layout.BLOCK_ROWS

        def with_all(kind: str) -> int:
            (block,) = [b for b in inner.blocks
                        if sum(1 for i in cfg.instructions(b) if (_sass.memory_kind(i) or "").startswith(kind)) == steps]
            return block

        loads, stores = with_all("LDG"), with_all("STG")
        (latch,) = inner.latches
        header = inner.header
        total = (_shortest(cfg, inner.blocks, header, loads, header) + _shortest(cfg, inner.blocks, loads, stores, header)
                 + _shortest(cfg, inner.blocks, stores, latch, header)
                 - len(cfg.instructions(loads)) - len(cfg.instructions(stores)))
        out[names[kernel.expression]] = total / (steps * (2 if pairs else 1))
    return out


def cases_by_label() -> dict[str, suites.Case]:
    out = {}
    for name in ("mobilenetv2", "efficientnet"):
        for case in suites.suite(name):
            if case.op == OP:
                out[case.label] = case
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=DEFAULT_MEASURED)
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    data = json.loads(args.measured.read_text())
    rows = [r for r in data["rows"] if r["op"] == OP and r["engine"] == "gradops-cuda"]
    by = {}
    for r in rows:
        by.setdefault((r["suite"], r["label"].rsplit(" ", 1)[0], r["dtype"]), {})[r["layout"]] = r
    cases = cases_by_label()
    per_element = full_tile_instructions(args.arch)

    lines = [
        "# The depthwise input gradient's transpose path: break-even against the H200's NCHW times",
        "",
        "Generated by `python benchmarks/nchw_transpose_breakeven.py`; do not edit by hand.",
        "",
        f"- **Measured** (`{args.measured.name}` of `{args.measured.parent.name}`, "
        f"{data['meta'].get('device', 'H200')}): Nsight Compute kernel times of the launcher's NCHW kernel and of the tiled "
        "kernel in NHWC, revision cb65573 (the tiled kernel's source has not changed since).",
        "- **Break-even**: the two transposes move 2 x (out_backprop + input gradient) bytes; the break-even is the "
        "fraction of 4.8 TB/s at which they take exactly NCHW time - NHWC time. Measured times and exact byte counts "
        "only. The path wins where its transposes run faster than that; above 100% it cannot win on this GPU.",
        f"- **Predicted, not measured**: the path's time if the transposes reach {ASSUMED_EFFICIENCY:.0%} of 4.8 TB/s "
        "(an assumption, not a figure of this kernel), added to the measured NHWC time; the speed-up is NCHW time "
        "over that.",
        f"- The transpose kernels' full tiles ({args.arch} SASS, 32-bit indices, **predicted, not measured**), "
        "instructions per element: " + ", ".join(f"{v:.1f} ({k})" for k, v in per_element.items())
        + ". 16-bit elements move in pairs where both transposes' rows and columns are even (every row here "
        "but the 7 x 7 maps'). Each element (pair) is one global load, one shared-memory store, one "
        "shared-memory load (two for a pair) and one global store.",
        "",
        "| suite | case | dtype | NCHW kernel | NCHW µs (measured) | NHWC µs (measured) | transposes MB | "
        f"break-even % of HBM | path µs at {ASSUMED_EFFICIENCY:.0%} (predicted) | speed-up (predicted) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    wins = {}
    for (suite, label, dtype), pair in sorted(by.items()):
        if "NCHW" not in pair or "NHWC" not in pair:
            continue
        nchw, nhwc = pair["NCHW"], pair["NHWC"]
        g = cases[f"{label} NCHW"].geometry()
        itemsize = np.dtype(dtype).itemsize
        moved = 2 * itemsize * (int(np.prod(g.out_backprop_shape)) + int(np.prod(g.input_shape)))
        lost = (nchw["us"] - nhwc["us"]) * 1e-6
        breakeven = moved / (BANDWIDTH * lost) if lost > 0 else float("inf")
        path_us = nhwc["us"] + moved / (BANDWIDTH * ASSUMED_EFFICIENCY) * 1e6
        kernel = nchw["kernel_family"].replace("input_", "")
        wins.setdefault(dtype, []).append(breakeven)
        lines.append(f"| {suite} | {label} | {dtype} | {kernel} | {nchw['us']:.1f} | {nhwc['us']:.1f} | "
                     f"{moved / 1e6:.1f} | {breakeven * 100:.0f} | {path_us:.1f} | {nchw['us'] / path_us:.2f} |")
    lines += ["", "## Summary", "",
              "| dtype | cases | break-even <= 30% | <= 60% | > 100% (cannot win) |", "|---|---:|---:|---:|---:|"]
    for dtype, values in sorted(wins.items()):
        v = np.array(values)
        lines.append(f"| {dtype} | {len(v)} | {(v <= 0.3).sum()} | {(v <= 0.6).sum()} | {(v > 1).sum()} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
