"""Static counts of the fractional pooling gradients' cells kernels on the fractional benchmark shapes.

    PYTHONPATH=. python3 benchmarks/fractional_cells_prediction.py [--arch sm_90]

Compiles ``fractional_avg_pool_grad_cells`` and ``fractional_max_pool_grad_cells`` (both
modes each) for float16 and float32 with 32-bit indexing and vectors of channels, and counts
every warp of the launchers' launch of each benchmark geometry with the static report's own
model (``gradops/bench/static_cells.py``): per element of the input gradient, the warp
instructions x 32, 64-bit conversions and FP64 instructions, and the time each of those, DRAM
and the latency chain would take on an H200; then the average kernels' issue and FP64 times
against DRAM's on a GeForce-class part (FP64 at 1/64 of FP32: :data:`GEFORCE`).

* Average: a cell row's shares with every branch counted (upper bounds), the region's rows and,
  per warp, its widest region's columns.
* Max: the scan of the warp's widest cell (rows of at most 4 columns, loaded together;
  overlapping cells are a row and a column larger than their region; a chunk first scans the
  row above), each scanned row the cheapest scan iteration comparing that many elements
  (``CFG.path_table``, counted by FSETP: one per channel and element), then the writes; every
  other part counts every branch: upper bounds.  The overlapping kernel's barrier a cell row is
  not modelled.
* Latency: each thread's chain of dependent round trips (average: the cell-row loop's
  iterations x the round trips one waits for in its SASS, plus the row above with overlapping
  cells; max: a scanned row one, the outputs' loads overlapping the
  first, overlapping cells taking their first row from the cell above, held in registers) x
  waves of resident CTAs (occupancy at the launch's 128-thread blocks) x 600 ns, the static
  report's assumed loaded DRAM round trip.

**Predicted, not measured.**  Assumed H200 rates: 132 SMs at 1.98 GHz, 4 warp-instructions a
clock an SM, 64 FP64 and 16 conversions to or from 64-bit types a clock an SM, 4.8 TB/s; DRAM
bytes are the compulsory ones (average: out_backprop and the input gradient; max: orig_input,
orig_output and out_backprop, and the input gradient).  The static report
(``benchmarks/results/static_report.md``) and ``path_estimates.md`` give the same kernels'
H100 and A100 limits and latency-aware estimates beside the gather kernels'.
"""

from __future__ import annotations

import argparse
import math
import subprocess

import numpy as np

import gradops
from gradops.backends.cuda import _sass
from gradops.bench import static_cells, suites

SMS, CLOCK, BANDWIDTH, LATENCY = 132, 1.98e9, 4.8e12, 600e-9
RATES = {"issue": 4 * 32, "fp64": 64, "conversion": 16}  # thread-operations a clock an SM
#: A GeForce-class part whose FP64 runs at 1/64 of FP32 (NVIDIA's GA102 whitepaper: 2 FP64
#: results a clock an SM): the RTX 3090's 82 SMs, 1.695 GHz boost clock and 936 GB/s (its
#: datasheet), compiled for its sm_86 (where overlapping cells sum in float-float).  Issue (4
#: warp-instructions a clock an SM), FP64 and DRAM are priced there; not latency or occupancy.
GEFORCE = {"name": "RTX 3090 (sm_86)", "arch": "sm_86", "sms": 82, "clock": 1.695e9, "fp64": 2, "bandwidth": 936e9}


def launch(case, dtype):
    """(expression, plan, the source) of the launcher's cells kernel for ``case``."""
    if case.op == suites.FRACTIONAL:
        return (*static_cells.cells_launch(case.geometry(), dtype), static_cells.launcher().SOURCE)
    return (*static_cells.max_cells_launch(case.geometry(), dtype), static_cells.max_launcher().SOURCE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    arch = int(args.arch.removeprefix("sm_"))
    dtypes = (np.dtype(np.float16), np.dtype(np.float32))
    cases = [c for c in suites.suite("fractional") if c.op in (suites.FRACTIONAL, suites.FRACTIONAL_MAX)]
    launches = {(c.label, c.op, d): launch(c, d) for c in cases for d in dtypes}
    wanted = {}
    for expression, _, source in launches.values():
        wanted.setdefault(source, set()).add(expression)
    kernels = {k.expression: k for source, names in wanted.items()
               for k in _sass.compile_kernels((args.arch,), [source], only=sorted(names))}
    print("# Fractional pooling gradients' cells kernels: static counts (predicted, not measured)\n")
    print(f"`benchmarks/fractional_cells_prediction.py`: SASS from NVRTC {_sass.nvrtc_version()} for {args.arch}, "
          "every warp of each benchmark geometry's launch (`gradops/bench/static_cells.py`); times at the H200 "
          "rates of the script's docstring. **Predicted, not measured.** The H200's measured times of the gather "
          "kernels on these shapes are in `gpu_h200_2026-11-28/measured_vs_predicted.md`.\n")
    print("| op | case | dtype | registers | SASS / element | conversions / element | FP64 / element "
          "| issue µs | FP64 µs | conversion µs | DRAM µs | round trips / thread | latency µs | limit |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for case in cases:
        g = case.geometry()
        for dtype in dtypes:
            expression, p, _ = launches[(case.label, case.op, dtype)]
            kernel = kernels[expression]
            total = math.prod(g.input_shape)
            outputs = math.prod(g.output_shape)
            if case.op == suites.FRACTIONAL:
                warp_instructions, counts = static_cells.warp_counts(kernel, g, p)
                trips = static_cells.chain_round_trips(kernel, p.chunk_rows, g.overlapping)
                moved = total + outputs
            else:
                warp_instructions, counts, trips = static_cells.max_warp_counts(kernel, g, p)
                moved = 2 * (total + outputs)
            per = {"all": 32 * warp_instructions / total, "conversion": 32 * counts["class:conversion"] / total,
                   "fp64": 32 * counts["class:fp64"] / total}
            occ = _sass.occupancy(arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], p.block[0] * p.block[1])
            ctas = p.column_blocks * p.row_chunks * p.channel_blocks
            waves = max(1.0, ctas / (SMS * occ["blocks_per_sm"])) if occ["blocks_per_sm"] else math.inf
            times = {"issue": per["all"] * total / (SMS * RATES["issue"] * CLOCK),
                     "fp64": per["fp64"] * total / (SMS * RATES["fp64"] * CLOCK),
                     "conversion": per["conversion"] * total / (SMS * RATES["conversion"] * CLOCK),
                     "DRAM": moved * dtype.itemsize / BANDWIDTH, "latency": waves * trips * LATENCY}
            limit = max(times, key=times.get)
            print(f"| {case.op.replace('_pool_grad', '')} | {case.label} | {dtype.name} "
                  f"| {kernel.ptxas['registers']} | {per['all']:.1f} | {per['conversion']:.2f} | {per['fp64']:.1f} "
                  f"| {times['issue'] * 1e6:.1f} | {times['fp64'] * 1e6:.1f} | {times['conversion'] * 1e6:.1f} "
                  f"| {times['DRAM'] * 1e6:.1f} | {trips:.1f} | {times['latency'] * 1e6:.1f} | {limit} |")
    geforce_table(cases, launches, wanted)
    commit = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True).stdout.strip()
    print(f"\ngradops {gradops.__version__} at {commit or 'unknown commit'}; counts: every warp of the launchers' "
          "launch (gradops/bench/static_cells.py: every branch of a cell row but max pooling's scan, upper bounds), "
          "per input-gradient element; round trips: a thread's chain (average: its cell-row loop's iterations x "
          "the round trips of one, plus the row above with overlapping cells).")


def geforce_table(cases, launches, wanted) -> None:
    """The average pooling cells kernels' issue and FP64 times against DRAM's on :data:`GEFORCE`."""
    kernels = {k.expression: k for source, names in wanted.items()
               for k in _sass.compile_kernels((GEFORCE["arch"],), [source], only=sorted(names))}
    print(f"\n## Issue and FP64 against DRAM on a {GEFORCE['name']} (predicted, not measured)\n")
    print(f"FP64 at {GEFORCE['fp64']} results a clock an SM (1/64 of FP32), 4 warp-instructions a clock an SM, "
          f"{GEFORCE['sms']} SMs at {GEFORCE['clock'] / 1e9:.3f} GHz, {GEFORCE['bandwidth'] / 1e9:.0f} GB/s; SASS "
          f"for {GEFORCE['arch']}, counted as above. The largest of the three bounds the kernel.\n")
    print("| case | dtype | registers | SASS / element | FP64 / element | issue µs | FP64 µs | DRAM µs | limit |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for case in cases:
        if case.op != suites.FRACTIONAL:
            continue
        g = case.geometry()
        for dtype in (np.dtype(np.float16), np.dtype(np.float32)):
            expression, p, _ = launches[(case.label, case.op, dtype)]
            kernel = kernels[expression]
            warp_instructions, counts = static_cells.warp_counts(kernel, g, p)
            total = math.prod(g.input_shape)
            fp64 = 32 * counts["class:fp64"]
            times = {"issue": 32 * warp_instructions / (GEFORCE["sms"] * RATES["issue"] * GEFORCE["clock"]),
                     "FP64": fp64 / (GEFORCE["sms"] * GEFORCE["fp64"] * GEFORCE["clock"]),
                     "DRAM": (total + math.prod(g.output_shape)) * dtype.itemsize / GEFORCE["bandwidth"]}
            print(f"| {case.label} | {dtype.name} | {kernel.ptxas['registers']} | {32 * warp_instructions / total:.1f} "
                  f"| {fp64 / total:.1f} | {times['issue'] * 1e6:.1f} | {times['FP64'] * 1e6:.1f} "
                  f"| {times['DRAM'] * 1e6:.1f} | {max(times, key=times.get)} |")


if __name__ == "__main__":
    main()
