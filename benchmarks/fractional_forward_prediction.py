"""Static counts of the forward fractional poolings' kernels on the fractional benchmark shapes.

    PYTHONPATH=. python3 benchmarks/fractional_forward_prediction.py [--arch sm_90]

Compiles ``fractional_avg_pool`` and ``fractional_max_pool`` (``cuda_src/fractional_pool.cu``)
for float16 and float32 with 32-bit indexing and the launcher's vectors of channels, and counts
every warp of the launcher's launch of each benchmark geometry (the fractional suite's shapes,
ratio 1.44, disjoint and overlapping; the forward's input is the gradient's ``orig_input``):

* Count: the kernel's loops split as ``gradops/bench/static_cells.py`` splits the gradients'
  cells kernels (``loop_counts``): everything outside the cell-row loop once per warp and chunk
  of cell rows, the cell-row loop's own instructions per cell row, the input-row loop's per row
  of the cell, and the column loop's per row as often as the warp's widest cell needs (its lanes
  run the union: a lane whose cell is narrower idles).  Every branch is counted: upper bounds.
* DRAM: the compulsory bytes, the input read once and the output written once, and the two
  tables.  L2: every element a cell reads (overlapping cells read their shared row and column
  twice), the output, the tables.
* Latency: a thread's chain of dependent round trips, one per load the column loop waits for
  (``--unrolled-columns`` of them a row where the kernel issues that many loads before their
  first use), over its chunk of cell rows, x waves of resident CTAs (occupancy at the launch's
  128-thread blocks) x 600 ns, the static report's assumed loaded DRAM round trip.

**Predicted, not measured.**  Assumed rates: the static report's H100 model (132 SMs at 1.755
GHz, 4 warp-instructions a clock an SM, 16 conversions to or from 64-bit types a clock an SM, L2
at 6.5 TB/s) with DRAM at the H200's 4.8 TB/s, as the latency-aware estimate was fitted
(``gradops/bench/latency_model.py``: 2 us + the largest of DRAM, L2, the busiest pipe, the
scheduler limit / 0.5, and 1.5 x the latency chain + a resident warp's own instructions at 8
clocks each; 88% of the H200 run's 386 gradient kernels within 1.5x of it).  No GPU has run these
kernels.
"""

from __future__ import annotations

import argparse
import math
import subprocess

import numpy as np

import gradops
from gradops.backends.cuda import _sass
from gradops.bench import latency_model, static_cells, suites

# The static report's H100 limits with DRAM at the H200's bandwidth: what the latency-aware
# estimate (gradops/bench/latency_model.py) was fitted to on the H200 run of 2026-11-28.
SMS, CLOCK, BANDWIDTH, L2_BANDWIDTH, LATENCY = 132, 1.755e9, 4.8e12, 6.5e12, 600e-9
RATES = {"issue": 4 * 32, "conversion": 16}  # thread-operations a clock an SM
OPS = ("fractional_avg_pool", "fractional_max_pool")


def launcher():
    import importlib

    return importlib.import_module("gradops.backends.cuda.fractional_pool")


def forward_geometry(case):
    """The forward pooling of the case's input over its sequences."""
    from gradops._geometry import fractional_pool_forward_geometry

    rows, cols = case.pooling_sequences()
    return fractional_pool_forward_geometry("fractional_pool", case.input_shape, [int(v) for v in rows],
                                            [int(v) for v in cols], case.overlapping)


def sizes(starts, ends) -> np.ndarray:
    return np.maximum(np.asarray(ends, np.int64) - np.asarray(starts, np.int64) + 1, 0)


def warp_counts(kernel, g, p, unrolled: int = 1):
    """(warp-instructions, their counts by class) of one launch (module docstring); ``unrolled``
    columns a column-loop iteration (the rest, fewer, are the row loop's own)."""
    parts = static_cells.loop_counts(kernel)
    per_warp = 32 // p.block_vectors
    widths = np.tile(sizes(g.col_starts, g.col_ends), g.batch)
    padded = np.zeros(-(-widths.size // per_warp) * per_warp, dtype=np.int64)
    padded[:widths.size] = widths
    widest = padded.reshape(-1, per_warp).max(axis=1)
    warps = int(widest.size)
    rows = int(sizes(g.row_starts, g.row_ends).sum())
    weights = {"fixed": warps * p.row_chunks, "cell": warps * g.out_rows, "row": warps * rows,
               "col": rows * int((widest // unrolled).sum())}
    counts = {}
    for part, weight in weights.items():
        for key, v in parts[part].items():
            counts[key] = counts.get(key, 0) + v * weight * p.channel_blocks
    return counts["total"], counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--unrolled-columns", type=int, default=3,
                        help="columns whose loads issue together (the kernel's kColumnLoads; 1 for its first "
                             "version, one load a column)")
    args = parser.parse_args()
    arch = int(args.arch.removeprefix("sm_"))
    fp = launcher()
    dtypes = (np.dtype(np.float16), np.dtype(np.float32))
    cases = [c for c in suites.suite("fractional") if c.op == suites.FRACTIONAL]
    plans = {(c.label, d): fp.cells_plan(forward_geometry(c), d) for c in cases for d in dtypes}
    names = sorted({fp._expression(op, d, p.index, p.vector) for (_, d), p in plans.items() for op in OPS})
    kernels = {k.expression: k for k in _sass.compile_kernels((args.arch,), [fp.SOURCE], only=names)}
    print("# Forward fractional poolings: static counts (predicted, not measured)\n")
    print(f"`benchmarks/fractional_forward_prediction.py --arch {args.arch} --unrolled-columns "
          f"{args.unrolled_columns}`: SASS from NVRTC {_sass.nvrtc_version()}, every warp of each benchmark "
          "geometry's launch; times at the H200 rates of the script's docstring. **Predicted, not measured**: no "
          "GPU has run these kernels.\n")
    print("| op | case | dtype | registers | warps / SM | SASS / output | SASS / input | issue µs | DRAM µs "
          "| L2 µs | round trips / thread | latency µs | bound | % of HBM | latency-aware µs | term | % of HBM |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|")
    for case in cases:
        g = forward_geometry(case)
        heights, widths = sizes(g.row_starts, g.row_ends), sizes(g.col_starts, g.col_ends)
        inputs, outputs = math.prod(g.input_shape), math.prod(g.output_shape)
        read = g.batch * g.depth * float(heights.sum() * widths.sum())  # elements the cells read
        for dtype in dtypes:
            p = plans[(case.label, dtype)]
            for op in OPS:
                kernel = kernels[fp._expression(op, dtype, p.index, p.vector)]
                warp_instructions, counts = warp_counts(kernel, g, p, args.unrolled_columns)
                tables = fp.INDEX_TYPES[p.index].itemsize * 2 * (g.out_rows + g.out_cols)
                dram = (inputs + outputs) * dtype.itemsize + tables
                l2 = (read + outputs) * dtype.itemsize + tables
                occ = _sass.occupancy(arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"],
                                      p.block[0] * p.block[1])
                ctas = p.column_blocks * p.row_chunks * p.channel_blocks
                waves = max(1.0, ctas / (SMS * occ["blocks_per_sm"])) if occ["blocks_per_sm"] else math.inf
                trips = p.chunk_rows * float(np.mean(heights) * np.mean(np.ceil(widths / args.unrolled_columns)))
                times = {"issue": 32 * warp_instructions / (SMS * RATES["issue"] * CLOCK),
                         "conversion": 32 * counts.get("class:conversion", 0) / (SMS * RATES["conversion"] * CLOCK),
                         "DRAM": dram / BANDWIDTH, "L2": l2 / L2_BANDWIDTH, "latency": waves * trips * LATENCY}
                limit = max(times, key=times.get)
                aware, term = latency_model.estimate(
                    {"dram_s": times["DRAM"], "l2_s": times["L2"], "pipe_s": times["conversion"],
                     "scheduler_s": times["issue"], "chain_s": times["latency"], "warp_instructions": warp_instructions,
                     "resident_warps_per_sm": occ["warps_per_sm"], "sms": SMS, "clock_hz": CLOCK})
                print(f"| {op.removeprefix('fractional_')} | {case.label} | {dtype.name} | {kernel.ptxas['registers']} "
                      f"| {occ['warps_per_sm']} | {32 * warp_instructions / outputs:.1f} "
                      f"| {32 * warp_instructions / inputs:.1f} | {times['issue'] * 1e6:.1f} | {times['DRAM'] * 1e6:.1f} "
                      f"| {times['L2'] * 1e6:.1f} | {trips:.1f} | {times['latency'] * 1e6:.1f} | {limit} "
                      f"| {100 * times['DRAM'] / times[limit]:.0f} | {aware * 1e6:.1f} | {term} "
                      f"| {100 * times['DRAM'] / aware:.0f} |")
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    print(f"\ngradops {gradops.__version__} at {commit or 'unknown commit'}; counts: every warp of the launcher's "
          "launch, every branch (upper bounds), per output and per input element; % of HBM: the DRAM time over the "
          "limiting time.")


if __name__ == "__main__":
    main()
