"""Static counts of the fractional pooling gradients' cells kernels on the fractional benchmark shapes.

    PYTHONPATH=. python3 benchmarks/fractional_cells_prediction.py [--arch sm_90]

Compiles ``fractional_avg_pool_grad_cells`` and ``fractional_max_pool_grad_cells`` (both
modes each) for float16 and float32 with 32-bit indexing and vectors of channels, finds a
thread's cell-row loop in the SASS and the loops inside it, and weighs them by the region
shapes of each benchmark geometry: per element of the input gradient, the thread-instructions,
64-bit conversions and FP64 instructions, and the time each of those and DRAM would take on an
H200.

* Average: the static report's own count of the kernel (``gradops/bench/static_cells.py``: every
  warp of the launcher's launch, a cell row's shares with every branch counted, the region's rows
  and, per warp, its widest region's columns): upper bounds.
* Max: the scan (a cell's rows of at most 4 columns, loaded together; overlapping cells are a
  row and a column larger than their region, and the halo threads' scans are added), then the
  writes (overlapping: the region's first row, then its other rows' first column, then the
  rest).  A scanned row costs the cheapest path through the row loop that compares as many
  elements as the row has (``CFG.path_table``, counted by FSETP: one per channel and element);
  every other loop and the cell row's body count every branch: upper bounds.  The latency
  column: each thread's chain of dependent round trips (a scanned row one, the outputs'
  loads overlapping the first; overlapping cells take their first row from the cell above,
  held in registers, and a chunk first scans the row above) x waves
  of resident threads (occupancy at the launch's 128-thread blocks, the halo's row among them
  with overlapping cells) x 600 ns, the static report's assumed loaded DRAM round trip.  The
  overlapping kernel's barrier a cell row is not modelled.

**Predicted, not measured.**  Assumed H200 rates: 132 SMs at 1.98 GHz, 4 warp-instructions a
clock an SM, 64 FP64 and 16 conversions to or from 64-bit types a clock an SM, 4.8 TB/s; DRAM
bytes are the compulsory ones (average: out_backprop and the input gradient; max: orig_input,
orig_output and out_backprop, and the input gradient).
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
from collections import Counter

import numpy as np

import gradops
from gradops.backends.cuda import _sass
from gradops.bench import static_cells, suites

avg = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")
mx = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

SMS, CLOCK, BANDWIDTH, LATENCY = 132, 1.98e9, 4.8e12, 600e-9
RATES = {"issue": 4 * 32, "fp64": 64, "conversion": 16}  # thread-operations a clock an SM
KEYS = ("all", "conversion", "fp64")


def loop_counts(cfg, loop) -> Counter:
    bases = Counter(i.base for i in cfg.loop_instructions(loop))
    return Counter(all=sum(bases.values()), conversion=sum(v for b, v in bases.items() if b in ("F2F", "I2F", "F2I")),
                   fp64=sum(v for b, v in bases.items() if b.startswith("D")))


def _cell_loop(cfg):
    """The cell-row loop: the largest loop directly inside the three grid-stride loops (with
    overlapping cells, a chunk's rescans of the row above sit beside it)."""
    return max((loop for loop in cfg._loops() if loop.depth == 4),
               key=lambda loop: len(cfg.loop_instructions(loop)))


def max_counts(kernel, g, vector: int, halo: float) -> tuple[Counter, float]:
    """(thread-operations, round trips) of fractional_max_pool_grad_cells over one (batch item,
    channel vector)'s cells of ``g`` (see the module docstring); ``halo``: the overlapping
    kernel's halo threads per thread that writes (their scans are counted too)."""
    cfg = _sass.CFG(kernel.function)
    cell = _cell_loop(cfg)
    children = sorted(cell.children, key=lambda loop: loop.header)
    bases = [Counter(i.base for i in cfg.loop_instructions(loop)) for loop in children]
    # the scan of a narrow cell (rows of at most 4 columns, loaded together); the wide one's loop
    # has a column loop inside
    (narrow,) = [loop for loop, b in zip(children, bases) if b["LDG"] and not b["STG"] and not loop.children]
    first_row = [loop for loop, b in zip(children, bases) if b["STG"] and not loop.children]
    (rows_loop,) = [loop for loop, b in zip(children, bases) if b["STG"] and loop.children]
    (interior,) = rows_loop.children
    overlapping = g.overlapping
    assert len(first_row) == (1 if overlapping else 0)
    body = loop_counts(cfg, cell)
    for loop in children:
        body -= loop_counts(cfg, loop)
    body = Counter({k: body[k] for k in KEYS})
    path = cfg.path_table(narrow, counted=lambda i: i.base == "FSETP", kmax=4 * vector)  # one per channel and element

    def scan(height: int, width: int) -> int:  # a narrow cell's rows (the first: one element fewer)
        assert width <= 4, "the benchmark cells are narrow"
        return path[vector * (width - 1)][0] + (height - 1) * path[vector * width][0]

    row_counts, col_counts = np.diff(g.row_partition), np.diff(g.col_partition)
    out_rows, out_cols = len(row_counts), len(col_counts)
    heights = row_counts + (np.arange(out_rows) + 1 < out_rows) * overlapping
    widths = col_counts + (np.arange(out_cols) + 1 < out_cols) * overlapping
    total = Counter({k: body[k] * out_rows * out_cols * (1 + halo) for k in KEYS})
    trips = 0.0
    for h in heights:
        for w in widths:
            total["all"] += scan(h, w) * (1 + halo)
            # a row a round trip (orig_output and out_backprop are loaded before the scan: their
            # trip overlaps the first); overlapping cells hold their first row from the cell above
            trips += h - overlapping
    first_rows = 1 if overlapping else 0
    rows_total, interior_total = loop_counts(cfg, rows_loop), loop_counts(cfg, interior)
    for key in KEYS:
        if overlapping:
            total[key] += loop_counts(cfg, first_row[0])[key] * out_rows * col_counts.sum()
        total[key] += (rows_total[key] - interior_total[key]) * (row_counts - first_rows).sum() * out_cols
        total[key] += interior_total[key] * (row_counts - first_rows).sum() * (col_counts - 1).sum()
    return total, trips / (out_rows * out_cols)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    dtypes = (np.float16, np.float32)
    forms = {(suites.FRACTIONAL, d, o): avg._cells_expression(d, "int", 16 // np.dtype(d).itemsize, o)
             for d in dtypes for o in (False, True)}
    forms.update({(suites.FRACTIONAL_MAX, d, o): mx._cells_expression(d, "int", mx.vector_channels(d), o)
                  for d in dtypes for o in (False, True)})
    kernels = {k.expression: k for source in (avg.SOURCE, mx.SOURCE)
               for k in _sass.compile_kernels((args.arch,), [source], only=list(forms.values()))}
    print("# Fractional pooling gradients' cells kernels: static counts (predicted, not measured)\n")
    print(f"`benchmarks/fractional_cells_prediction.py`: SASS from NVRTC {_sass.nvrtc_version()} for {args.arch}, "
          "weighed by each benchmark geometry's cell sizes; times at the H200 rates of the script's docstring. "
          "**Predicted, not measured.** The H200's measured times of the launchers' kernels on these shapes are in "
          "`gpu_h200_2026-11-28/measured_vs_predicted.md`.\n")
    print("| op | case | dtype | registers | SASS / element | conversions / element | FP64 / element "
          "| issue µs | FP64 µs | conversion µs | DRAM µs | round trips / cell | latency µs | limit |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in suites.suite("fractional"):
        g = case.geometry()
        if (case.op, np.float16, g.overlapping) not in forms:
            continue
        rows = np.diff(g.row_partition).mean()
        for dtype in dtypes:
            expression = forms[(case.op, dtype, g.overlapping)]
            kernel = kernels[expression]
            vector = int(expression.rsplit(",", 2)[1].strip(" >"))
            total = g.batch * g.in_rows * g.in_cols * g.depth
            outputs = g.batch * g.out_rows * g.out_cols * g.depth
            if case.op == suites.FRACTIONAL:
                warp_instructions, counts = static_cells.warp_counts(
                    kernel, g, avg.cells_plan(g, dtype, vector=vector))
                per = {"all": 32 * warp_instructions / total, "conversion": 32 * counts["class:conversion"] / total,
                       "fp64": 32 * counts["class:fp64"] / total}
                latency = None
                moved = total + outputs
            else:
                plan = mx.max_cells_plan(g, dtype, vector=vector)
                block = plan.block
                halo = block[1] / plan.block_columns - 1
                counts, cell_trips = max_counts(kernel, g, vector, halo)
                per = {key: counts[key] / (g.in_rows * g.in_cols * vector) for key in KEYS}
                threads = g.batch * g.out_cols * (g.depth // vector) * plan.row_chunks * (1 + halo)
                occ = _sass.occupancy(int(args.arch.removeprefix("sm_")), kernel.ptxas["registers"],
                                      kernel.ptxas["shared_bytes"], block[0] * block[1])
                resident = SMS * occ["warps_per_sm"] * 32
                # a thread's chain: its chunk's cells, and with overlapping cells the row above rescanned
                chain = plan.chunk_rows * cell_trips + (rows + 1 if g.overlapping else 0)
                latency = max(1.0, threads / resident) * chain * LATENCY
                moved = 2 * (total + outputs)
            times = {"issue": per["all"] * total / (SMS * RATES["issue"] * CLOCK),
                     "fp64": per["fp64"] * total / (SMS * RATES["fp64"] * CLOCK),
                     "conversion": per["conversion"] * total / (SMS * RATES["conversion"] * CLOCK),
                     "DRAM": moved * np.dtype(dtype).itemsize / BANDWIDTH}
            if latency is not None:
                times["latency"] = latency
            limit = max(times, key=times.get)
            trips_text = f"{chain:.1f}" if latency is not None else "-"
            latency_text = f"{latency * 1e6:.1f}" if latency is not None else "-"
            print(f"| {case.op.replace('_pool_grad', '')} | {case.label} | {np.dtype(dtype).name} "
                  f"| {kernel.ptxas['registers']} | {per['all']:.1f} | {per['conversion']:.2f} | {per['fp64']:.1f} "
                  f"| {times['issue'] * 1e6:.1f} | {times['fp64'] * 1e6:.1f} | {times['conversion'] * 1e6:.1f} "
                  f"| {times['DRAM'] * 1e6:.1f} | {trips_text} | {latency_text} | {limit} |")
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    print(f"\ngradops {gradops.__version__} at {commit or 'unknown commit'}; counts: average, every warp of the "
          "launcher's launch (gradops/bench/static_cells.py: every branch of a cell row, upper bounds; its latency "
          "and the latency-aware estimate are in the static report and path_estimates.md), per input-gradient "
          "element; max, scanned rows by their cheapest path, the rest every branch, per element of a thread's "
          "region (every cell) x its channels; round trips: a thread's chain (its chunk of cells), max only.")


if __name__ == "__main__":
    main()
