"""Predicted kernel time of the tiled convolution kernels after a main-loop change, from a
measured baseline (**predicted, not measured**).

Inputs: the Nsight Compute run of the ResNet-50 suite (``ncu_cases.csv.gz`` + ``ncu_index.json``
of a GPU results folder, measured at a commit whose kernels match ``BASELINE``), the static
report JSON of those kernels (``BASELINE``: per-instantiation main-loop SASS per warp per k-tile)
and the static report JSON of the current kernels (``CURRENT``).  Per ResNet-50 case and op on
the tiled kernel:

* measured: our kernel time and cuDNN's (both from the same ncu run);
* warp-instructions of the tiled kernel: per warp, k-tiles x main-loop instructions per k-tile
  plus the rest of the kernel's static SASS once (prologue, epilogue, slow paths: an upper bound
  of the straight-line code a warp runs), times CTAs x warps;
* the implied issue utilisation: those warp-instructions / (SMs x 4 schedulers x clock) /
  measured time.  Near 1 means instruction issue explains the measured time; well below 1 means
  the kernel waits (memory latency, barriers, too few warps) and fewer instructions help less
  than in proportion;
* predicted: measured time x (current / baseline warp-instructions) for the tiled kernel, other
  kernels (split-K reduction, the direct kernel) unchanged: the time if the kernel were
  issue-bound, so an optimistic bound where the utilisation is low.  It does not credit the
  occupancy column (more warps per SM hide more latency), nor the input gradient's split
  reduction for small grids (more CTAs: the GPU fuller), which it charges the split CTAs' extra
  prologues and epilogues plus the reduction kernel's DRAM time.

    PYTHONPATH=. python benchmarks/conv_prediction.py RESULTS_DIR BASELINE.json CURRENT.json > out.md
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ncu_table import kernels_by_case  # noqa: E402

import numpy as np  # noqa: E402

from gradops.backends.cuda import _conv_igemm as ig  # noqa: E402
from gradops.bench import suites  # noqa: E402

#: What the issue utilisation assumes of the H100 SXM the baseline ran on (ncu with
#: --clock-control none: the GPU boosts, to at most 1980 MHz).
SMS, SCHEDULERS, CLOCK_HZ = 132, 4, 1.98e9
BANDWIDTH = 3.35e12  # H100 SXM HBM3, bytes/s (NVIDIA's datasheet)
LABEL = "predicted, not measured"


def main_loops(path: str, arch: str = "sm_90") -> dict[str, dict]:
    """``{kernel expression: record}`` of the tiled convolution kernels in a static report JSON."""
    data = json.loads(Path(path).read_text())
    return {k["kernel"]: k for k in data["kernels"] if k["arch"] == arch and k.get("main_loop")}


def expression(ncu_name: str) -> str | None:
    """``gradops::conv2d_backprop_filter_igemm<__half, float, 1, true>`` from ncu's demangled name."""
    m = re.match(r"void (gradops::conv2d\w*_igemm)<([^>]*)>", ncu_name)
    if not m:
        return None
    args = [a.strip() for a in m.group(2).split(",")]
    args[-1] = {"1": "true", "0": "false"}.get(args[-1], args[-1])
    return f"{m.group(1)}<{', '.join(args)}>"


def few_channel_wgrad(g, dtype) -> bool:
    """Whether today's filter-gradient launcher runs its few-channel kernel on an sm_90 GPU."""
    from unittest import mock

    from gradops.backends.cuda import _runtime

    wgrad = importlib.import_module("gradops.backends.cuda.conv2d_backprop_filter")
    with mock.patch.object(_runtime, "compute_capability", return_value=90):
        return wgrad.few_channels_eligible(g, dtype)


def current_tile(op: str, g, dtype, kind: int) -> ig.Tile:
    """The tile today's launcher picks on an sm_90 GPU (16-byte aligned arrays, as CuPy's)."""
    launcher = importlib.import_module(f"gradops.backends.cuda.{op}")
    m, n, _ = launcher._gemm_sizes(g)
    vector = ig.use_vector_loads(g, dtype, ())
    return ig.scalar_table_tile(ig.pick_tile(dtype, kind, vector, m, n, arch=90), dtype, kind, vector)


def current_kernel(measured: str, g, split: bool = False, tile_args: str = "") -> str:
    """The instantiation today's launcher runs where the measured run ran ``measured`` (whose
    names predate the tiled kernels' SPLIT argument): the ``_1x1_igemm`` kernel (same grid)
    for a 1x1 filter at stride 1 without padding with 16-byte loads, else the same kind; with
    ``split`` as its last argument."""
    name = measured
    if name.endswith(", true>") and "_1x1_" not in name and ig.pointwise_eligible(g):
        name = name.replace("_igemm<", "_1x1_igemm<")
    if "_igemm<" in name:
        name = f"{name[:-1]}, {ig.cpp_bool(split)}{tile_args}>"
    return name


def warp_k_tiles(op: str, g, dtype, kind: int, split: bool = False, tile: ig.Tile | None = None
                 ) -> tuple[int, int]:
    """(warps, warp x k-tile iterations of the main loop) of the tiled kernel's whole grid;
    ``split``: with the input gradient's split reduction as today's launcher chooses it (the
    measured kernels had none); ``tile``: the tile launched (default: the kind's default, as
    measured)."""
    tile = tile or ig.default_tile(dtype, kind)
    bm, bn, bk, threads = tile[:4]
    warps = threads // 32
    if op == "conv2d_backprop_filter":
        # the launcher module (the package re-exports a function of the same name)
        wgrad = importlib.import_module("gradops.backends.cuda.conv2d_backprop_filter")
        m, n, red = wgrad._gemm_sizes(g)
        splits, split_size = wgrad.split_count(g, dtype, kind, tile=tile)
        ctas = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * g.groups
        k_tiles = sum(ig.ceil_div(min(split_size, red - s * split_size), bk) for s in range(splits))
        return ctas * splits * warps, ctas * warps * k_tiles
    groups = dgrad_groups(g, dtype, kind, split, tile)
    return sum(c for c, _ in groups) * warps, sum(c * k for c, k in groups) * warps


def dgrad_groups(g, dtype, kind: int, split: bool = False, tile: ig.Tile | None = None) -> list[tuple[int, int]]:
    """``[(CTAs, k-tiles each)]`` of the input gradient's tiled grid, per (stride phase, split):
    a phase's working CTAs (those past its positions return at once), a split past the phase's
    reduction none of its k-tiles.  ``split`` and ``tile`` as for :func:`warp_k_tiles`."""
    tile = tile or ig.default_tile(dtype, kind)
    bm, bn, bk = tile[:3]
    dgrad = importlib.import_module("gradops.backends.cuda.conv2d_backprop_input")
    splits, split_size = dgrad.split_count(g, dtype, kind, tile=tile) if split else (1, 1 << 62)
    # Each phase's positions and reduction, from the launcher's own plan of the grid.
    plan = dgrad.phase_plans(g, splits)[dgrad.PLAN_HEADER["HEADER_WORDS"]:]
    entries = plan.reshape(-1, dgrad.PLAN_ENTRY["ENTRY_WORDS"])
    groups = []
    for entry in entries:
        m_size, reduction = int(entry[dgrad.PLAN_ENTRY["M_SIZE"]]), int(entry[dgrad.PLAN_ENTRY["REDUCTION"]])
        ctas = ig.ceil_div(m_size, bm) * ig.ceil_div(g.filter_in_depth, bn) * g.groups
        groups += [(ctas, ig.ceil_div(max(0, min(split_size, reduction - s * split_size)), bk))
                   for s in range(splits)]
    return groups


def rows(results: str, baseline: str, current: str) -> list[dict]:
    index = json.loads((Path(results) / "ncu_index.json").read_text())
    cases = kernels_by_case(str(Path(results) / "ncu_cases.csv.gz"))
    before, after = main_loops(baseline), main_loops(current)
    by_label = {(c.suite, c.label, c.op): c for c in suites.suite("resnet50")}
    cudnn = {(e["label"], e["op"], e["dtype"]): sum(k["ns"] for k in cases.get(e["i"], []))
             for e in index if e["suite"] == "resnet50" and e["engine"] == "gradops-cudnn"}
    out = []
    for e in index:
        if e["suite"] != "resnet50" or e["engine"] != "gradops-cuda" or e["i"] not in cases:
            continue
        kernels = cases[e["i"]]
        measured = sum(k["ns"] for k in kernels)
        tiled = [(k, expression(k["name"])) for k in kernels if expression(k["name"])]
        row = {"label": e["label"], "op": e["op"], "dtype": e["dtype"], "measured_us": measured / 1e3,
               "cudnn_us": cudnn.get((e["label"], e["op"], e["dtype"]), float("nan")) / 1e3}
        if not tiled:
            row.update(kernel="direct", predicted_us=measured / 1e3)
            out.append(row)
            continue
        (k, expr), = tiled
        case = by_label[("resnet50", e["label"], e["op"])]
        dtype = np.dtype(suites.DTYPES[e["dtype"]])
        kind = int(expr.split(",")[2])
        g = case.geometry()
        if e["op"] == suites.CONV_FILTER and current != baseline and few_channel_wgrad(g, dtype):
            # Today's launcher runs another kernel (another grid): no ratio of main loops applies.
            row.update(kernel="few-channels", predicted_us=measured / 1e3)
            out.append(row)
            continue
        # The current launcher splits small dgrad grids (the measured kernels never did: their
        # reduction kernel is added below); the filter gradient split then as it does today (its
        # measured time holds its reduction kernel).
        split = e["op"] == suites.CONV_INPUT and current != baseline
        launcher = importlib.import_module(f"gradops.backends.cuda.{e['op']}")
        def launch(tile):
            """(the input gradient's splits, today's kernel) with ``tile``."""
            count = launcher.split_count(g, dtype, kind, tile=tile)[0]
            splits = count if split else 1
            kernel_splits = count if e["op"] == suites.CONV_FILTER else splits
            return splits, current_kernel(expr, g, kernel_splits > 1, tile.args)

        # Today's tile (a narrower one for 64-channel GEMMs) where the report has its kernels.
        tile = current_tile(e["op"], g, dtype, kind) if current != baseline else ig.default_tile(dtype, kind)
        splits, current_expr = launch(tile)
        if current_expr not in after and tile.args:  # a report older than the tile shapes
            tile = ig.default_tile(dtype, kind)
            splits, current_expr = launch(tile)
        if current_expr not in after:  # a report of the measured kernels themselves
            current_expr = expr
        old, new = before[expr], after[current_expr]
        grids = {"old": warp_k_tiles(e["op"], g, dtype, kind),
                 "new": warp_k_tiles(e["op"], g, dtype, kind, split=split, tile=tile)}

        def issued(record, grid):
            warps, warp_tiles = grids[grid]
            loop = record["main_loop"]["instructions"]  # per k-tile; the body may hold several
            return warp_tiles * loop + warps * (record["sass_instructions"] -
                                                record["main_loop"].get("iteration_instructions", loop))

        scale = issued(new, "new") / issued(old, "old")
        # With a split, the second kernel's DRAM time (partials read, the gradient written).
        elements = g.batch * g.in_rows * g.in_cols * g.in_depth
        reduce_ns = (splits * elements * 4 + elements * dtype.itemsize) / BANDWIDTH * 1e9 if splits > 1 else 0.0
        predicted = measured - k["ns"] + k["ns"] * scale + reduce_ns
        warp_tiles = grids["old"][1]
        row.update(kernel=expr.split("<")[1].rstrip(">") + (" -> 1x1 kernel" if "_1x1_" in current_expr else "")
                   + (f", {tile.bm}x{tile.bn} tile" if tile.args and current_expr != expr else "")
                   + (f", split {splits} ways" if splits > 1 else ""),
                   main_loop_before=old["main_loop"]["instructions"],
                   main_loop_after=new["main_loop"]["instructions"],
                   warps_before=old["occupancy"]["warps_per_sm"], warps_after=new["occupancy"]["warps_per_sm"],
                   main_loop_share=warp_tiles * old["main_loop"]["instructions"] / issued(old, "old"),
                   issue_utilisation=issued(old, "old") / (SMS * SCHEDULERS * CLOCK_HZ) / (k["ns"] * 1e-9),
                   splits=splits, predicted_us=predicted / 1e3)
        out.append(row)
    return out


def geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def markdown(table: list[dict], results: str, baseline: str, current: str) -> str:
    lines = [f"# ResNet-50 convolution gradients on the H100: predicted time of the current kernels ({LABEL})", "",
             f"Generated by `PYTHONPATH=. python benchmarks/conv_prediction.py {results} {baseline} {current}`. "
             "Measured columns come from the Nsight Compute run in that folder (its README names the commit); "
             "the prediction scales the tiled kernel's measured time by its warp-instructions (main loop per "
             "k-tile x k-tiles + the rest of its static SASS once; current / baseline, sm_90): the time if the "
             "kernel were issue-bound, an optimistic bound where the measured issue utilisation is low "
             f"(clock {CLOCK_HZ / 1e9:.2f} GHz, {SMS} SMs x {SCHEDULERS} schedulers). It does not credit higher "
             "occupancy. See the module docstring.", ""]
    lines += ["| op | dtype | cases | cuDNN / ours, measured (geomean) | cuDNN / ours, predicted (geomean) |",
              "|---|---|---|---|---|"]
    for op in sorted({r["op"] for r in table}):
        for dtype in sorted({r["dtype"] for r in table if r["op"] == op}):
            sel = [r for r in table if r["op"] == op and r["dtype"] == dtype]
            lines.append(f"| {op} | {dtype} | {len(sel)} | {geomean(r['cudnn_us'] / r['measured_us'] for r in sel):.2f} | "
                         f"{geomean(r['cudnn_us'] / r['predicted_us'] for r in sel):.2f} |")
    lines += ["", "| case | op | dtype | kernel | main loop before -> after | warps/SM before -> after | "
              "main loop share of warp-instructions | issue utilisation (measured time) | ours measured (us) | "
              "ours predicted (us) | cuDNN measured (us) |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        if r["kernel"] == "direct":
            # The direct path's input gradient now runs the few-channel kernel on the stem, which
            # this script does not model: the measured direct kernel's time stays (an upper bound).
            lines.append(f"| {r['label']} | {r['op']} | {r['dtype']} | direct (now the few-channel kernel: "
                         f"benchmarks/few_channel_prediction.py) | - | - | - | - | {r['measured_us']:.1f} | "
                         f"{r['predicted_us']:.1f} (the measured direct kernel's, an upper bound) | "
                         f"{r['cudnn_us']:.1f} |")
            continue
        if r["kernel"] == "few-channels":
            lines.append(f"| {r['label']} | {r['op']} | {r['dtype']} | tiled (now the few-channel kernel: modelled in "
                         f"conv_resnet50_predicted.md) | - | - | - | - | {r['measured_us']:.1f} | "
                         f"{r['predicted_us']:.1f} (the measured tiled kernel's, an upper bound) | "
                         f"{r['cudnn_us']:.1f} |")
            continue
        lines.append(f"| {r['label']} | {r['op']} | {r['dtype']} | `{r['kernel']}` | {r['main_loop_before']} -> "
                     f"{r['main_loop_after']} | {r['warps_before']} -> {r['warps_after']} | "
                     f"{r['main_loop_share']:.2f} | {r['issue_utilisation']:.2f} | {r['measured_us']:.1f} | {r['predicted_us']:.1f} | "
                     f"{r['cudnn_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a GPU results folder with ncu_cases.csv.gz and ncu_index.json")
    ap.add_argument("baseline", help="static report JSON of the kernels that were measured")
    ap.add_argument("current", help="static report JSON of the kernels to predict")
    a = ap.parse_args(argv)
    sys.stdout.write(markdown(rows(a.results, a.baseline, a.current), a.results, a.baseline, a.current))


if __name__ == "__main__":
    main()
