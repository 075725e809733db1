"""Static counts of the fractional pooling gradients' cells kernels on the fractional benchmark shapes.

    PYTHONPATH=. python3 benchmarks/fractional_cells_prediction.py [--arch sm_90]

Compiles ``fractional_avg_pool_grad_cells`` (both modes) and ``fractional_max_pool_grad_cells``
(disjoint cells only) for float16 and float32 with 32-bit indexing and vectors of channels,
finds a thread's cell-row loop in the SASS and the loops inside it (average: a region's rows,
each with its further columns; max: the scan's rows and columns, then the writes' rows and
columns), and weighs them by the region shapes of each benchmark geometry: per element of the
input gradient, the thread-instructions, 64-bit conversions and FP64 instructions, and the
time each of those and DRAM would take on an H200.  Every branch of a cell row's body is
counted (neighbour cells, the roundings a region may not need), so the counts are upper bounds.
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
from gradops.bench import suites

avg = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")
mx = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

SMS, CLOCK, BANDWIDTH = 132, 1.98e9, 4.8e12
RATES = {"issue": 4 * 32, "fp64": 64, "conversion": 16}  # thread-operations a clock an SM
KEYS = ("all", "conversion", "fp64")


def loop_counts(cfg, loop) -> Counter:
    bases = Counter(i.base for i in cfg.loop_instructions(loop))
    return Counter(all=sum(bases.values()), conversion=sum(v for b, v in bases.items() if b in ("F2F", "I2F", "F2I")),
                   fp64=sum(v for b, v in bases.items() if b.startswith("D")))


def per_cell(kernel, rows: float, cols: float) -> Counter:
    """Thread-operations per cell row for mean region sizes ``rows`` x ``cols``: the cell loop's
    own instructions once, each inner row loop's ``rows`` times and each column loop's as often
    as its kernel runs it (average: rows x (cols - 1); max: the scan rows x cols - 1, the writes
    rows x cols)."""
    cfg = _sass.CFG(kernel.function)
    (cell,) = [loop for loop in cfg._loops() if loop.depth == 4]  # inside the three grid-stride loops
    total = loop_counts(cfg, cell)
    row_loops = sorted(cell.children, key=lambda loop: loop.header)
    col_trips = [rows * (cols - 1)] if len(row_loops) == 1 else [rows * cols - 1, rows * cols]
    for row, trips in zip(row_loops, col_trips):
        row_total = loop_counts(cfg, row)
        (col,) = row.children
        col_total = loop_counts(cfg, col)
        for key in KEYS:
            total[key] += -row_total[key] + rows * (row_total[key] - col_total[key]) + trips * col_total[key]
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    dtypes = (np.float16, np.float32)
    forms = {(suites.FRACTIONAL, d, o): avg._cells_expression(d, "int", 16 // np.dtype(d).itemsize, o)
             for d in dtypes for o in (False, True)}
    forms.update({(suites.FRACTIONAL_MAX, d, False): mx._cells_expression(d, "int", mx.vector_channels(d)) for d in dtypes})
    kernels = {k.expression: k for source in (avg.SOURCE, mx.SOURCE)
               for k in _sass.compile_kernels((args.arch,), [source], only=list(forms.values()))}
    print("# Fractional pooling gradients' cells kernels: static counts (predicted, not measured)\n")
    print(f"`benchmarks/fractional_cells_prediction.py`: SASS from NVRTC {_sass.nvrtc_version()} for {args.arch}, "
          "weighed by each benchmark geometry's cell sizes; times at the H200 rates of the script's docstring. "
          "**Predicted, not measured.** The H200's measured times of the launchers' kernels on these shapes are in "
          "`gpu_h200_2026-11-28/measured_vs_predicted.md`.\n")
    print("| op | case | dtype | registers | SASS / element | conversions / element | FP64 / element "
          "| issue µs | FP64 µs | conversion µs | DRAM µs | limit |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in suites.suite("fractional"):
        g = case.geometry()
        if (case.op, np.float16, g.overlapping) not in forms:
            continue
        row_counts, col_counts = np.diff(g.row_partition), np.diff(g.col_partition)
        rows, cols = row_counts.mean(), col_counts.mean()
        for dtype in dtypes:
            expression = forms[(case.op, dtype, g.overlapping)]
            kernel = kernels[expression]
            vector = int(expression.rsplit(",", 2 if case.op == suites.FRACTIONAL else 1)[1].strip(" >"))
            counts = per_cell(kernel, rows, cols)
            per = {key: counts[key] / (rows * cols * vector) for key in KEYS}
            total = g.batch * g.in_rows * g.in_cols * g.depth
            outputs = g.batch * g.out_rows * g.out_cols * g.depth
            moved = (total + outputs) if case.op == suites.FRACTIONAL else 2 * (total + outputs)
            times = {"issue": per["all"] * total / (SMS * RATES["issue"] * CLOCK),
                     "fp64": per["fp64"] * total / (SMS * RATES["fp64"] * CLOCK),
                     "conversion": per["conversion"] * total / (SMS * RATES["conversion"] * CLOCK),
                     "DRAM": moved * np.dtype(dtype).itemsize / BANDWIDTH}
            limit = max(times, key=times.get)
            print(f"| {case.op.replace('_pool_grad', '')} | {case.label} | {np.dtype(dtype).name} "
                  f"| {kernel.ptxas['registers']} | {per['all']:.1f} | {per['conversion']:.2f} | {per['fp64']:.1f} "
                  f"| {times['issue'] * 1e6:.1f} | {times['fp64'] * 1e6:.1f} | {times['conversion'] * 1e6:.1f} "
                  f"| {times['DRAM'] * 1e6:.1f} | {limit} |")
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    print(f"\ngradops {gradops.__version__} at {commit or 'unknown commit'}; counts: every branch of a cell row "
          "(upper bounds); elements: a thread's region (mean rows x mean columns of the geometry's cells) x its "
          "channels.")


if __name__ == "__main__":
    main()
