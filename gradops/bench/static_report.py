"""Static performance report: SASS figures per kernel and a roofline prediction per benchmark
shape, **predicted, not measured** (no GPU runs here).

``python -m gradops static-report --out benchmarks/results`` compiles the depthwise and
fractional pooling kernels (and, unless ``--no-conv``, the tiled convolution kernels) for
sm_90 and sm_80, reads their SASS (:mod:`gradops.backends.cuda._sass`) and writes
``static_report.md`` and ``static_report.json``.

Per kernel: registers, shared memory, spills, occupancy at the launcher's block size, the
global loads and stores with their widths, and the SASS instructions of the steady-state
path per output element.  The kernels that stage a tile per CTA, the tiled depthwise input
gradient and the fractional average pooling gradient, are modelled by :mod:`.static_tiled`
(a thread's, or every warp's, common path through the whole kernel); the tiled depthwise
filter gradient and its reduction here (:func:`filter_tiled_unit_cost`,
:func:`filter_reduce_cost`).  For the grid-stride kernels the path's *work* is given per
kernel family (see :func:`depthwise_work`, :func:`depthwise_filter_row_work`,
:func:`fractional_gather_work`, and :class:`SelectModel` per cell of a run); :mod:`._sass` finds the cheapest path
through the grid-stride loop body that does exactly that work with no slow-path call.

Per benchmark shape (the ``mobilenetv2``, ``efficientnet`` and ``fractional`` suites of
:mod:`.suites`, float16 and float32) and device (:data:`DEVICES`): the predicted time is the
largest of four limits, each stated in :data:`ASSUMPTIONS` and in the report (for the two-kernel
ops, the depthwise filter gradient and the fractional max pooling gradient, the sum over both
kernels of each kernel's largest limit):

* ``DRAM``: compulsory bytes (:func:`.metrics.bytes_moved`, plus the fractional cell tables)
  / HBM bandwidth;
* ``L2``: modelled L2->SM bytes / an assumed L2 bandwidth;
* ``issue``: warp-instructions / (SMs x 4 schedulers x clock x issue efficiency), or the
  busiest narrow pipe (FP64, MUFU, conversions, IMAD, integer, FP32) at its documented
  rate, whichever is slower;
* ``occupancy``: Little's law with one element in flight per resident thread: elements /
  (SMs x resident threads) x DRAM latency.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from .._dtypes import accumulator_dtype
from . import latency_model
from .metrics import KNOWN_PEAKS, bytes_moved
from .suites import DEPTHWISE_FILTER, DEPTHWISE_INPUT, DTYPES, FRACTIONAL, FRACTIONAL_MAX, OP_SHORT, Case, suite

LABEL = "predicted, not measured"
SUITES = ("mobilenetv2", "efficientnet", "fractional")
REPORT_DTYPES = ("float16", "float32")
DEPTHWISE_SOURCE = "depthwise_conv2d_native_backprop_input.cu"
FRACTIONAL_SOURCE = "fractional_avg_pool_grad.cu"
DEPTHWISE_FILTER_SOURCE = "depthwise_conv2d_native_backprop_filter.cu"
FRACTIONAL_MAX_SOURCE = "fractional_max_pool_grad.cu"
CONV_SOURCES = ("conv2d.cu", "conv2d_backprop_filter.cu", "conv2d_backprop_input.cu")
#: Fraction of HBM bandwidth the instruction budgets are computed for (the issue's target).
BUDGET_FRACTION = 0.75


@dataclass(frozen=True)
class Device:
    """What the roofline assumes of a GPU.  ``pipes``: results per clock per SM of the
    narrow pipes (CUDA C++ Programming Guide, "Arithmetic Instructions" throughput table, as
    read for compute capability 8.0 and 9.0); a warp-instruction takes 32 of them."""

    key: str
    arch: int
    sms: int
    clock_hz: float
    bandwidth: float          # bytes/s, HBM (datasheet, as gradops.bench.metrics)
    l2_bandwidth: float       # bytes/s, L2 -> SMs (assumed)
    dram_latency_s: float     # loaded DRAM round trip (assumed)
    issue_efficiency: float   # fraction of 1 warp-instruction per scheduler per clock
    pipes: tuple[tuple[str, int], ...]

    @property
    def issue_rate(self) -> float:
        """Warp-instructions per second over the whole GPU."""
        return self.sms * 4 * self.clock_hz * self.issue_efficiency


DEVICES = (
    Device("H100 SXM", 90, 132, 1.755e9, KNOWN_PEAKS["H100 SXM"].bandwidth, 6.5e12, 600e-9, 1.0,
           (("fp64", 64), ("mufu", 16), ("conversion", 16), ("imad", 64), ("int", 64), ("fp32", 128))),
    Device("A100 SXM 80GB", 80, 108, 1.41e9, KNOWN_PEAKS["A100 SXM 80GB"].bandwidth, 4.5e12, 600e-9, 1.0,
           (("fp64", 32), ("mufu", 16), ("conversion", 16), ("imad", 64), ("int", 64), ("fp32", 64))),
)

ASSUMPTIONS = [
    "Every figure in this report is PREDICTED, NOT MEASURED: it comes from the SASS of the compiled kernels and "
    "the model below, not from running them.",
    "Calibration: on an H200 (Nsight Compute, 2026-11-28, benchmarks/results/gpu_h200_2026-11-28/"
    "measured_vs_predicted.md) the modelled kernels took 1.3 to 10.4 times the predicted time (geometric mean "
    "3.0), with this model's H100 limits and the DRAM limit re-targeted to 4.8 TB/s. The model charges no "
    "instruction latency or barrier stall: read its times as a bound the kernels do not reach, and its % of "
    "HBM as an upper bound.",
    "Latency-aware estimate (the columns so named; gradops/bench/latency_model.py): per kernel, 2 us + the "
    "largest of DRAM, L2, the busiest pipe, the scheduler limit / 0.5, and 1.5 x the latency chain + one resident "
    "warp's own instructions (warp-instructions / (SMs x resident warps)) at 8 clocks each; a two-kernel op sums "
    "its kernels. Its constants were fitted to the H200 run's 386 kernels (benchmarks/results/"
    "gpu_h200_2026-11-28/latency_fit.md: 88% within 1.5x of the measured time, the bound above 2%); on the A100 "
    "they are an extrapolation. Kernels changed since that run were not in the fit.",
    "Clock: H100 SXM 1.755 GHz (the clock the issue's budgets use, below the 1.98 GHz maximum boost), A100 SXM "
    "1.41 GHz (its boost clock); issue efficiency 1.0 (one warp-instruction per scheduler per clock, 4 schedulers "
    "per SM): H100 132 SMs x 4 x 1.755 GHz = 926.6 G warp-instructions/s, A100 108 x 4 x 1.41 GHz = 609.1 G/s.",
    "Narrow pipes (results per clock per SM, CUDA C++ Programming Guide throughput table as read for cc 8.0/9.0): "
    "FP64 add/mul/fma 32 (A100) / 64 (H100): DFMA, DADD, DMUL, DSETP, DMNMX; MUFU 16; conversions 16: F2F, F2I, "
    "I2F, I2I; 32-bit integer multiply-add 64: every IMAD form (IMAD.MOV, IMAD.SHL, IMAD.WIDE counted as one); "
    "integer add/logic/compare/shift 64: IADD3, LOP3, ISETP, SHF, LEA, SEL, IMNMX; FP32 64 (A100) / 128 (H100). "
    "A warp-instruction uses 32 results. The issue limit is the slower of the 4-scheduler limit and the busiest "
    "pipe. Other instructions (MOV, VIADD, CS2R, branches, BSSY/BSYNC, loads, stores) count only toward the "
    "scheduler limit.",
    "HBM: 3.35 TB/s (H100 SXM), 2.039 TB/s (A100 SXM 80GB), NVIDIA datasheets (gradops.bench.metrics). DRAM bytes "
    "are the compulsory bytes the GPU benchmark also uses (every tensor read once, the gradient written once), plus "
    "the cell tables for fractional pooling (average: the gather launcher's ten tables in its index type, as "
    "uploaded, the cells kernel's four; max: select + gather's six tables, the cells kernel's two).",
    "L2 -> SM bandwidth: 6.5 TB/s (H100 SXM), 4.5 TB/s (A100): ASSUMED, not an NVIDIA figure (order of magnitude of "
    "public microbenchmarks); L2 traffic model: L1 catches reuse within a thread block (neighbouring columns) but "
    "not between input rows (other blocks), so depthwise reads out_backprop filter_rows times from L2 and each "
    "block's filter slice once; fractional average pooling reads each tile's staged cells once per tile (cells "
    "straddling two tiles twice) and writes the gradient once.",
    "Occupancy/latency limit: Little's law with one element (one grid-stride iteration) in flight per resident "
    "thread and one loaded DRAM round trip of 600 ns per iteration (ASSUMED, both GPUs): time = elements / (SMs x "
    "resident threads per SM) x 600 ns. Resident threads come from the occupancy formula (cuda_occupancy.h) at the "
    "launcher's block size (256 threads for the 1-D kernels).",
    "Steady-state path (grid-stride kernels): the cheapest path through one grid-stride iteration that makes "
    "exactly the element's element-width global loads (depthwise: out_backprop and filter, 2 per tap and "
    "multiplier), with every inner loop run as the work requires (depthwise multiplier loop: depth_multiplier "
    "times per tap) and no block that calls a subroutine (the slow paths of 64-bit integer division with "
    "operands of more than 32 bits and of full-range double division, which the benchmark shapes never take). "
    "Every instruction on the path counts once, predicated or not.",
    "Depthwise taps: for a specialised (unrolled) kernel the optimiser places the element's k valid taps on the "
    "cheapest k tap slots; an element whose taps span more filter rows than that placement pays one more row "
    "entry (~40-100 instructions) than counted (stride-2 kernels only).",
    "Warps: a warp executes the union of its threads' paths. Depthwise warps are enumerated per shape (NHWC: 32 "
    "channels, possibly of two pixels; NCHW: 32 consecutive columns, possibly of several rows) and each costs the "
    "path of the union of its threads' taps; fractional average pooling warps: see its entry below.",
    "Depthwise input gradient, tiled kernel (gradops.bench.static_tiled): one thread's common path through the "
    "whole kernel: every barrier's block and the unchecked inner loop's (finite filter: the block with the most "
    "FFMA, which must hold the source's tap count) passed, the global loads and stores of one thread of an "
    "interior tile (the busiest lane: guarded last steps taken; the fewest loads >= that count), at least the "
    "staged tile's words stored to shared memory, the multiplier-slice loop run once per slice (once when "
    "multiplier 2 is paired), staging loops as their loads need; 16-byte staging where the launcher chooses it "
    "(NHWC, multiplier 1 or paired, channels a multiple of 16 bytes, aligned arrays; its one slice is staged before "
    "the slice loop, and a path with it takes no global load of another width). NCHW: chunks of plane rows "
    "(the widest of 16, 8, 4 bytes that divides an out_backprop row, else elements), every filter element the "
    "busiest thread stores counted, and the staged values stored to shared memory a run of up to 4 columns at "
    "a time only where the launch's tiles' first staged column is a multiple of the run, else one element at a "
    "time (as SAME padding gives at 3x3, and at 5x5 with chunks of 4 or more elements); the kernel table's NCHW "
    "rows take element stores. SASS/elem of a kernel: path "
    "x threads per CTA / outputs of a full tile. Per shape: every CTA of the launcher's grid is charged the "
    "interior path (edge tiles' checks not counted; the positions an overhanging tile computes but does not "
    "store are), but for its warps whose two work items lie wholly outside the image (the launcher's tile shape "
    "and pairing of a warp's items, walked warp by warp), which skip the sums and the stores and are charged "
    "the cheapest path through the same barriers with the same staging loads and no store; SASS/elem = that / "
    "the shape's elements. DRAM: compulsory bytes; L2: each CTA's staged tile "
    "with halo, filter slice and outputs; latency: waves of resident CTAs (occupancy at the launcher's block of "
    "128 or 64 threads) x the dependent staging round trips per CTA (16-byte staging: one per batch of up to 16 "
    "loads; scalar NHWC: the filter then one per unrolled-by-4 step; NCHW: the filter then one per batch of up "
    "to 40 registers of chunks) "
    "x 600 ns, per slice.",
    "Depthwise input gradient, tensor-core kernel (NCHW float16 / bfloat16, 3x3 / 5x5 at stride 1, multipliers 1 "
    "and 2; the launcher's choice where MMA_CHOICE holds, on sm_80 and newer; static_tiled.predict_depthwise_mma): "
    "every unit of 16 x 16 positions costs one lane's cheapest path through the unit loop holding every HMMA, its "
    "staging loads of the launcher's chunk and its result stores (pairs where in_cols is even), and every warp of the "
    "grid the fixed path (band fragments: the whole kernel's cheapest path with one unit, less the unit path); "
    "the whole-plane form (one unit a plane, the launcher's where mma_plane_chunk holds: 14 x 14 planes at SAME "
    "padding) stages the plane in chunks of 8 or 4 elements, the busiest lane's ceil(chunks / 32) loads a slice, "
    "and the packed form (four images a unit, where mma_pack_stride holds: 7 x 7) the four planes' elements one a "
    "load, ceil(elements / 32) a slice, and stores 8 elements a lane (units: ceil(batch / 4) per channel); "
    "SASS/elem = 32 x (units x unit path + warps x fixed path) / the shape's elements (positions a unit computes "
    "outside the image included). Tensor pipe: one HMMA.16816 (m16n8k16, float sums) per 2 clocks per SM and an "
    "HMMA.1688 half of that (ASSUMED: A100's datasheet rate, taken for H100's mma.sync too). DRAM: compulsory "
    "bytes; L2: each unit's staged rows (16 + K - 1 rows x 32 columns per multiplier slice; the whole-plane form: "
    "the plane; the packed form: its four planes) and its results; "
    "latency: waves of resident CTAs x one DRAM round trip per unit a warp takes in turn x 600 ns.",
    "Depthwise input gradient, NHWC tensor-core kernel (NHWC float16 / bfloat16, 3x3 / 5x5 at stride 1, "
    "multipliers 1 and 2, in_depth a multiple of 8; the launcher's choice where MMA_NHWC_CHOICE holds, on sm_80 "
    "and newer; static_tiled.predict_depthwise_mma_nhwc): a CTA of 256 threads (8 warps, one input channel each) "
    "owns a 16 x 16 unit position of 8 channels and takes a run of images; every (CTA, image) iteration costs each "
    "of its threads the cheapest path through one iteration of the image loop with its warp's HMMAs, all its "
    "staging slots (two 16-byte loads each, predicated, so all count, and 8 word stores each; a thread past the "
    "last slot is charged them too), its warp's 4 result-plane stores, and the result gather's 16-byte store "
    "taken; every CTA each thread's fixed path (the whole kernel's cheapest path with one image, less the image "
    "path: zeroed columns, band fragments, slot offsets; loops run once); SASS/elem = 256 x (iterations x image "
    "path + CTAs x fixed path) / the shape's elements (positions a unit computes outside the image included). "
    "Tensor pipe as for the NCHW kernel, 8 warps' HMMAs an iteration. DRAM: compulsory bytes; L2: each iteration's "
    "staged window ((16 + K - 1)^2 positions x 16 M bytes) and the results; latency: waves of resident CTAs x one "
    "DRAM round trip per image a CTA takes in turn (the next image's loads are issued before this one's products, "
    "which the model does not credit; the band's filter loads are issued after the first image's) x 600 ns.",
    "Fractional average pooling gradient, staged tile kernel (gradops.bench.static_tiled): the launch and tile "
    "shape are the launcher's own plan() for the shape and dtype (16-byte vectors of channels where the depth "
    "allows, aligned arrays), its cells and per-tile cell ranges its own cell_tables() and tile_cell_ranges(). "
    "Every warp of every tile of the grid is enumerated and charged its busiest lane's path: staging (the most "
    "cells any lane stages, one per staging slot), positions (the warp's rows: the most row cells any lane's "
    "position lies in) and column cells (the most of the warp's columns). A warp's path = the cheapest whole-kernel "
    "path (both barriers passed, the grid loops and the batch-staging loop once, the slot loop once per staged "
    "cell) with exactly one V-element global store and 2V shared words read (one position of 1 x 1 cells; none "
    "for a warp with no position), the fewest staging-width global loads >= vectors x staged cells and >= 2V "
    "shared words stored per staged vector (the finite-vector path: 16-byte shared stores, cheaper than the "
    "Inf/NaN path's 8-byte ones); plus per position, in place of that one, the cheapest iteration of the position "
    "loop (the innermost loop that reads shared memory and stores to global memory) reading exactly 2V words per "
    "cell with the source's index-table loads (2 row offsets + 1 row-cell id per row cell: this tells the row-cell "
    "loop from the second column cell). Tiles taking the direct path, several batch items per tile or positions "
    "in no cell are not modelled (none at the benchmark shapes). SASS/elem = 32 x the warps' instructions / "
    "input-gradient elements. Latency: waves of resident CTAs (occupancy at the plan's 256-thread block and 48 KiB "
    "of static shared memory) x (1 round trip for the tile's table chain + one per out_backprop vector the busiest "
    "staging lane loads, as its loads are serialised: each vector's load sits in its own block ending in the "
    "branch on that vector's finiteness) x 600 ns; the position loop's table and shared-memory loads (L1) are not "
    "counted.",
    "Fractional average pooling gradient, cells kernel (disjoint partitions: the launcher's choice, "
    "CELLS_BY_DEFAULT; gradops.bench.static_cells): the launch is the "
    "launcher's cells_plan (a thread per batch item, cell column and 16-byte vector of channels, walking down a "
    "chunk of cell rows; 128-thread blocks, no shared memory). Every warp of the launch is counted: every "
    "instruction outside the cell-row loop once per warp and chunk, the cell-row loop's own (the shares: every "
    "branch, Inf/NaN handling included, an upper bound) once per cell row, the input-row loop's once per input "
    "row, and the column loop's per input row as often as the warp's widest region needs beyond its first column "
    "(the lanes share their rows; a narrower region's lane idles). Warps past the last column are not counted. "
    "DRAM: compulsory bytes and the four cell tables; L2: out_backprop once per cell row and thread (with "
    "overlapping cells also the left neighbour's and, once per chunk, the row above's), the gradient, the tables; "
    "latency: waves of resident CTAs x (the chunk's cell rows + 1 with overlapping cells) x 600 ns, a round trip "
    "a cell row.",
    "Fractional max pooling gradient, cells kernel (disjoint partitions: the launcher's choice, CELLS_BY_DEFAULT; "
    "one kernel in place of select + gather; gradops.bench.static_cells.predict_max): the launcher's "
    "max_cells_plan; every warp of the launch: every instruction outside the cell-row loop once per warp and chunk, "
    "per cell row it scans (its chunk's, and with overlapping cells the row above the chunk's first) the cell-row "
    "loop's own (every branch) and the scan of the warp's widest cell (each scanned row the cheapest iteration of "
    "the scan loop that compares that many elements, one FSETP or DSETP a channel and element, the first row one "
    "fewer), per cell row it writes the warp's widest region's stores (a column-loop iteration an element; with "
    "overlapping cells the first row's loop, then a row-loop iteration per later row and the column loop for its "
    "other elements). Overlapping cells: the halo row of threads shares its warps with other columns and adds no "
    "warp; the barrier a cell row is not charged. DRAM: compulsory bytes and the two bound tables; L2: every "
    "scanned element once, orig_output and out_backprop once per cell, the gradient; latency: waves of resident "
    "CTAs x a thread's round trips (a scanned row each, the first row of an overlapping cell held from the cell "
    "above, plus the row above a chunk) x 600 ns. Integer elements are not modelled.",
    "Kernel time only: no launch latency, no allocation, no host-to-device copy of the fractional cell tables "
    "(the GPU benchmark's CUDA-event time includes all of those).",
    "Two-kernel ops (depthwise filter gradient: partial sums then their fixed-order sum; fractional max pooling "
    "gradient where it runs select then gather (overlapping cells; disjoint ones take its cells kernel, below), "
    "with the mismatch flag read back between them, host time left out): each "
    "kernel gets its own four limits; the row's limits and predicted time are the sums over both kernels, its "
    "limiter is the dearer kernel's; SASS/elem and the budget are per partial sum (filter gradient: one thread of "
    "the first kernel, slices x taps x out_depth of them, slicing as the launcher's) or per input element (max "
    "pooling), each kernel's instructions counted once.",
    "Depthwise filter gradient, first kernel: a partial sum runs its slice's rows; a row whose input row is in the "
    "image runs its in-image columns (2 element loads each), the others skip. Cost of rows x columns: the "
    "cheapest one-row path with the fewest loads >= 2 x columns (the unrolled column loop's remainder is "
    "predicated, counted whether it executes or not), plus per further row the second row's increment, plus per "
    "skipped row a no-load row iteration. A warp is 32 k (a channel group; the last one's idle lanes skip) of one "
    "(slice, tap) and takes its path; threads: the channel groups padded to 32 lanes. L2 -> SM bytes: a 256-thread "
    "block holds 8 taps of one (slice, channel group), which share out_backprop reads, and its taps of one filter "
    "row share input rows (L1), nothing shared between blocks; the partial-sum buffer "
    "(at most about 2^17 accumulators) is written to and read from L2, not DRAM. Round trips: the unrolled column "
    "loop issues its loads together, so a row costs ceil(columns / steps per unrolled iteration) + 1 loaded DRAM "
    "round trips (600 ns, as above), a skipped row 1; the latency limit is max(1, threads / resident threads) "
    "waves x round trips per thread x 600 ns (a thread's rows are a chain; an upper bound where loads hit L1/L2).",
    "Depthwise filter gradient, tiled first kernel (NHWC 3x3 / 5x5 at stride 1 / 2, the launcher's choice "
    "wherever it runs; its rows give SASS/elem and the budget per out_backprop element, position x channel): a "
    "thread's instructions = units of its CTA x the cheapest path through one iteration of the unit loop that "
    "passes its barriers and the unchecked sums (the FMA-richest run of fall-through blocks) with the busiest thread's 16-byte staging "
    "loads and all its work item's out_backprop loads (the unit loop sits in the loop of the slice's passes: "
    "pass 0 unchecked, then one probe per sum and a vote, pass 1 checked only where a sum is not finite, which "
    "the model leaves out), plus fixed instructions (every instruction outside the unit loop and the final sum's "
    "loop, an upper bound: the probe and vote, and the reset before a second pass too, and the cheapest "
    "iteration of the work items' final sum x its trips); every tile is "
    "counted whole (positions past the output cost what inside ones do), except that a warp whose two work items "
    "lie wholly past the output (the launcher's pairing of a warp's items: side by side or one above the other, "
    "whichever idles more warps) costs, per unit, the cheapest unit-loop path with the staging loads and barriers "
    "but no out_backprop load and no sums, which it skips. L2 -> SM bytes: each unit's staged input "
    "(tile with halo, a block's input channels) and out_backprop tile, and the partial sums written. Latency: "
    "waves of resident CTAs x (1 round trip per unit: the out_backprop loads are issued before the barrier and "
    "overlap the staging loads; + 1) x 600 ns.",
    "Depthwise filter gradient, tensor-core first kernel (NCHW float16 / bfloat16 3x3 / 5x5 at stride 1, "
    "multipliers 1 and 2, planes up to 32 x 32 filling at least half of its 16-row x 8-column product blocks: "
    "the launcher's choice there on sm_80 and newer, mma_chosen; SASS/elem and the budget per out_backprop "
    "element; static_report.filter_mma_costs): every image of the launch costs one lane's cheapest path through "
    "one iteration of the image loop with exactly its HMMAs (k-steps x column blocks x K x M, the block loop run "
    "as often as the plane has blocks) and at least the busiest lane's staging loads (a batch's predicated "
    "slots all count), and every warp its fixed path (the whole kernel's cheapest finite path with one image, less "
    "the image, plus the zeroing loop's and the diagonal sums' further iterations); x 32 lanes. Tensor pipe: its "
    "HMMAs as for the input gradient's tensor-core kernel. DRAM: compulsory bytes; L2 -> SM: each image's staged "
    "input rows and columns (whole chunks) and its M out_backprop planes, and the partial sums written. Latency: "
    "waves of resident CTAs x (its images x staging batches each + 1) x 600 ns.",
    "Depthwise filter gradient, planes first kernel (NCHW 3x3 / 5x5 at stride 1 / 2, the launcher's choice "
    "wherever it runs but where the tensor-core kernel does; SASS/elem and the budget per out_backprop element): a warp per (channel, slice) issues "
    "ceil(its slice's run of interior items / 32) iterations of the interior item loop and ceil(its run of "
    "border items / 32) of the border loop (each slice a run of both), each the cheapest path through one iteration with every window load and a whole item's "
    "out_backprop loads (one per row where out_cols is a multiple of 4 and the arrays aligned, as in the "
    "benchmark; else one per value), in the cheapest loop whose window loads are unconditional (interior) and "
    "the cheapest whose window loads are predicated (border; the checked border loop runs only where a slice's "
    "sums are not finite); plus every instruction outside the "
    "loops (an upper bound); a border item past the output costs what an inside one does. L2 -> SM bytes: out_backprop once, the input once per multiplier with the halo of a warp's items' "
    "windows (rows ((rows - 1) S + K) / (rows S), columns of its run of at most 32 items across), and the "
    "partial sums written. Latency: waves of resident CTAs x (the busiest warp's items x their dependent load "
    "round trips + 1) x 600 ns, an item's round trips counted in its loop's SASS in issue order: a wait each "
    "time an instruction reads or writes a register that a load issued since the last wait fills (each load "
    "taken as slower than the loop body; half-type window loads widened next to their loads wait per batch).",
    "Depthwise filter gradient, second kernel: 8 threads (groups of slices) per filter element, each costing the "
    "busiest thread's path (group 0: ceil(slices / 8) accumulator loads, the fewest >= that a path makes, the "
    "barrier and the groups' sum; an upper bound for the other groups); latency: waves of resident 256-thread "
    "CTAs x (ceil(loads / 16) + 1) round trips of 600 ns; DRAM: the filter gradient written; L2: the partial "
    "sums read.",
    "Fractional max pooling gradient: a thread takes V channels of one pixel (V = 8 for float16/bfloat16, 4 for "
    "the others, where depth % V == 0, as at every benchmark shape, with aligned arrays; else 1), its element and "
    "index accesses packs of V (16 bytes per load: a 32-byte pack is two); SASS per element = the thread's path / V, and a warp spanning several pixels (32 V < depth "
    "does not hold) pays the union of their paths. Select: a thread takes a run of 4 cells down one output "
    "column where row cells share rows (overlapping pooling), else 1 (fractional_max_pool_grad.select_run); "
    "per cell, the cheapest path through one iteration of its cell loop that runs the row loop of cells of at "
    "most 4 columns once per cell row, issues a row's loads (every column's: they are predicated) for each row "
    "not held from the previous cell, and makes one floating-point compare per channel of each element after "
    "the scan's first; a run costs the grid-stride loop's own instructions (the path around a one-row cell, "
    "less that cell) plus its cells; a warp spanning several (run, column) pairs pays the widest column and the "
    "run with the most rows read; wider cells, as before, count every element's pack load with the row loop run "
    "once per row. Select's L2 bytes are what its threads read (the rows not held, times the cell's columns, "
    "per thread: before 2026-11-28 this counted each warp's widest cell for all of its threads, which "
    "overstated the 32x112x112x64 shapes' L2 bytes); its latency chain one round trip per cell. Gather counts index-width and pack loads (two row offsets, per row cell its "
    "index, per cell its column-cell index and chosen-offset pack, and with V = 4 its out_backprop pack: some "
    "channel of the pack matches in most cells) with the row-cell loop run once per row cell; both take the "
    "fewest loads >= those counts. With V = 1 a cell's out_backprop load and add for the element it chose are "
    "predicated in gather's unrolled column loop (counted on every path) and a skipped branch of about 10 "
    "instructions on its remainder path (under-counted: about out/in = 0.48 matches per input element). DRAM: "
    "orig_input, orig_output, out_backprop read and the gradient written once, plus the chosen-element buffer "
    "written by select and read by gather (output elements x 1 byte, each way, where every cell has at most 256 "
    "elements, as at the benchmark shapes: the chosen element's place in its cell; else x the index width: its "
    "flat offset; gather then also reads the cell bounds) and the cell tables; L2: each "
    "cell's elements (select), each cell's chosen offset (gather). One loaded DRAM round trip per element, as for "
    "the other 1-D kernels (the cell tables are a few KB, L1/L2-resident).",
]


# --------------------------------------------------------------------------- helpers


def _popcount(values: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values)
    out = np.zeros(values.shape, np.int64)
    v = values.astype(np.uint64)
    while np.any(v):
        out += (v & np.uint64(1)).astype(np.int64)
        v >>= np.uint64(1)
    return out


def element_width(expression: str) -> int | None:
    """Bytes of the element type of an instantiation (its first template argument)."""
    import importlib

    # Every element type a kernel takes: the fractional launcher's (the float types and TF's ints).
    element_types = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad").ELEMENT_TYPES
    first = expression.split("<", 1)[1].split(",")[0].strip()
    return {c_type: np.dtype(dtype).itemsize for dtype, c_type in element_types.items()}.get(first)


def template_args(expression: str) -> list[str]:
    return [a.strip() for a in expression.split("<", 1)[1].rsplit(">", 1)[0].split(",")]


def counted_loads(width: int | tuple[int, ...]):
    """The loads a path's work is counted in: global loads of the element width (or of any of
    the widths given: the element's and the index tables')."""
    from ..backends.cuda import _sass

    widths = (width,) if isinstance(width, int) else tuple(width)
    return lambda ins: any(_sass.is_global_load(ins, w) for w in widths)


def block_size(expression: str) -> int:
    """Threads per block the launcher uses for an instantiation."""
    import importlib

    from ..backends.cuda import _conv_igemm, _runtime

    if "_igemm<" in expression:
        args = template_args(expression)
        if len(args) == 7:  # ..., SPLIT, TILE_M, TILE_N: a tile shape other than the default
            return _conv_igemm.mma_tile_threads((int(args[5]), int(args[6])))
        c_type = {v[0]: k for k, v in _conv_igemm._build.C_TYPES.items()}[args[0]]
        return _conv_igemm.TILES[(c_type, int(args[2]))][3]
    if "_input_tiled<" in expression:
        from .static_tiled import DepthwiseTile

        return DepthwiseTile.of(expression, False, False, 1).threads
    if "_input_mma<" in expression:
        dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
        return 32 * dw.MMA_WARPS
    if "depthwise_conv2d_native_backprop_filter_reduce<" in expression:
        dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
        return dwf.REDUCE_ELEMENTS * dwf.REDUCE_MAX_GROUPS  # its largest block (groups follow the slices)
    if "_backprop_filter_tiled<" in expression:
        return importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter").TILED_THREADS
    if "_backprop_filter_planes<" in expression:
        return importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter").PLANES_THREADS
    if "_backprop_filter_mma<" in expression:
        return importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter").MMA_THREADS
    if "_backprop_filter_mma_nhwc<" in expression:
        return importlib.import_module(
            "gradops.backends.cuda.depthwise_conv2d_native_backprop_filter").MMA_NHWC_THREADS
    if "conv2d_backprop_filter_direct<" in expression:
        return importlib.import_module("gradops.backends.cuda.conv2d_backprop_filter").FILTER_DIRECT_THREADS
    if "conv2d_backprop_filter_few_channels<" in expression:
        return importlib.import_module("gradops.backends.cuda.conv2d_backprop_filter").FEW_THREADS
    if "pool_grad_cells<" in expression:  # both fractional cells kernels take blocks of CELLS_THREADS
        return importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad").CELLS_THREADS
    if "::transpose_batched" in expression:  # both forms: elements and 16-bit pairs
        from ..backends.cuda import _layout

        return _layout.TILE * _layout.BLOCK_ROWS
    return _runtime.BLOCK_1D


def grid_loop(cfg):
    """The grid-stride loop: the outermost loop holding a global store."""
    stores = [lp for lp in cfg.top_loops()
              if any(x.base in ("STG", "ST") for x in cfg.loop_instructions(lp, include_cold=True))]
    if not stores:
        raise ValueError(f"{cfg.function.name}: no loop stores to global memory")
    return max(stores, key=lambda lp: len(lp.blocks))


def _path_summary(counts: Counter) -> dict:
    memory = {k: v for k, v in sorted(counts.items()) if k[:3] in ("LDG", "STG", "LDS", "STS") and "." in k}
    classes = {k.removeprefix("class:"): v for k, v in sorted(counts.items()) if k.startswith("class:")}
    return {"instructions": counts["total"], "memory": memory, "classes": classes}


# --------------------------------------------------------------------------- work models


class PathModel:
    """Cheapest steady-state paths of one kernel, cached by work."""

    def __init__(self, kernel, width: int | tuple[int, ...], trips_depth: int = 1):
        self.kernel = kernel
        self.cfg = kernel.cfg
        self.loop = grid_loop(kernel.cfg)
        self.counted = counted_loads(width)
        self.trips_depth = trips_depth
        self._tables: dict = {}

    def cost(self, loads: int, trips: tuple[int, int | None] | dict | None,
             at_least: bool = False) -> tuple[int, Counter]:
        """(instructions, counts) of the cheapest path with ``loads`` counted loads; ``trips``:
        ``(iterations, counted per iteration)`` of the loop at ``trips_depth``, or a dict
        ``{relative depth: (iterations, counted per iteration or None)}``.  ``at_least``: the
        fewest loads >= ``loads`` that a path makes (an unrolled loop's remainder block is
        predicated: its loads count whether they execute or not, so some counts have no path)."""
        table = self._table(trips, loads + (PREDICATED_SLACK if at_least else 0))
        if at_least:
            loads = min((k for k in table if k >= loads), default=loads)
        if loads not in table:
            from ..backends.cuda._sass import PathError

            raise PathError(f"{self.kernel.expression}: no path makes {loads} counted loads (has {sorted(table)})")
        return table[loads]

    def _table(self, trips, loads: int) -> dict:
        if isinstance(trips, dict):
            key, spec = tuple(sorted(trips.items())), trips
        else:
            key, spec = trips, ({self.trips_depth: trips} if trips else {})
        known, table = self._tables.get(key, (-1, None))
        if loads > known:
            table = self.cfg.path_table(self.loop, self.counted, spec, kmax=loads)
            self._tables[key] = (loads, table)
        return table


#: Counted loads an ``at_least`` path may make beyond the work: an unrolled loop's predicated
#: remainder (up to 3 iterations of 2 loads seen) or loads the compiler did not hoist.
PREDICATED_SLACK = 16


def depthwise_work(taps: int, multiplier: int) -> tuple[int, tuple[int, int]]:
    """(counted loads, trips of the multiplier loop) of an element with ``taps`` valid taps."""
    return 2 * taps * multiplier, (multiplier, 2)


def depthwise_filter_row_work(cols: int) -> tuple[int, dict]:
    """(counted loads, trips) of one partial sum of the depthwise filter gradient's first kernel
    over one in-image output row of ``cols`` in-image output columns: an input and an
    out_backprop load per column, the row loop run once (:func:`filter_partial_cost` extends
    it to several rows)."""
    return 2 * cols, {1: (1, None)}


#: Columns of a cell's row that the select kernel holds for the next cell of its run
#: (``fractional_max::kCarryCols``): cells at most this wide take the loop that holds a row.
SELECT_CARRY_COLS = 4


class SelectModel:
    """Paths of max pooling's select kernel, whose thread scans a run of cells down one output
    column: the grid-stride loop holds the loop over the run's cells, which holds two row
    loops, one for cells of at most :data:`SELECT_CARRY_COLS` columns (one row an iteration,
    its columns unrolled: a loaded row issues the loads of every column, predicated, and a
    narrower cell leaves the column sequence early) and one for wider cells (an inner loop over
    the columns).  A cell's cost is the cheapest path through one iteration of the cell loop
    that runs the narrow row loop once per row and makes, in it, the row loads of the rows it
    reads (a row the previous cell read last is held: no loads) and one floating-point compare
    (``FSETP``/``DSETP``) per channel of every element after the scan's first (the key packs
    both counts); a run adds the grid-stride loop's own instructions once (:meth:`run`)."""

    #: Radix of the packed key (row loads x RADIX + compares): more than any cell's compares.
    RADIX = 4096
    COMPARES = ("FSETP", "DSETP", "HSETP2")

    def __init__(self, kernel, element_width: int, element_loads: int, channels: int):
        from ..backends.cuda import _sass

        self.cfg = cfg = kernel.cfg
        self.grid = grid_loop(cfg)
        self.cells = max(self.grid.children, key=lambda lp: len(lp.blocks))
        narrow = [lp for lp in self.cells.children if not lp.children]
        wide = [lp for lp in self.cells.children if lp.children]
        if len(narrow) != 1 or len(wide) != 1:
            raise _sass.PathError(f"{kernel.expression}: expected one row loop with and one without a column loop")
        self.narrow, self.wide = narrow[0], wide[0]
        inside = [x for b in self.narrow.blocks for x in cfg.instructions(b)]
        loads = {x.offset for x in inside if _sass.is_global_load(x)}
        compares = {x.offset for x in inside if x.base in self.COMPARES}
        self.row_loads = len(loads)  # a loaded row's load instructions (every column's, predicated)
        self.channels = channels
        radix = self.RADIX
        self._narrow_counted = lambda ins: radix if ins.offset in loads else int(ins.offset in compares)
        self._element_counted = counted_loads(element_width)
        self.element_loads = element_loads
        self._memo: dict = {}

    def _narrow_path(self, loop, rows: int, held: int, cols: int, trips: dict) -> tuple[int, Counter]:
        from ..backends.cuda._sass import KeyLimit, PathError

        radix = self.RADIX
        key = self.row_loads * (rows - held) * radix + self.channels * (rows * cols - 1)
        limit = KeyLimit(key, lambda k: k % radix < radix - 1)
        table, _ = self.cfg._tables(loop, self._narrow_counted, trips, limit, loop.depth,
                                    frozenset({self.narrow.header}))
        if key not in table:
            raise PathError(f"no select path of {rows} x {cols} ({held} held) makes key {key}")
        return table[key]

    def cell(self, rows: int, held: int, cols: int) -> tuple[int, Counter]:
        """(instructions, counts) of one cell of ``rows`` x ``cols`` whose first row is held
        (``held`` = 1: the previous cell's last) or read."""
        key = (rows, held if cols <= SELECT_CARRY_COLS else 0, cols)
        if key not in self._memo:
            if cols <= SELECT_CARRY_COLS:
                self._memo[key] = self._narrow_path(self.cells, rows, key[1], cols, {1: (rows, None)})
            else:  # every element loaded, one inner-loop iteration each (the first before the loop)
                want = self.element_loads * (rows * cols + 1)  # the cell's elements and orig_output
                table, _ = self.cfg._tables(self.cells, self._element_counted, {1: (rows, None)},
                                            want + PREDICATED_SLACK, self.cells.depth, frozenset({self.wide.header}))
                self._memo[key] = table[min(k for k in table if k >= want)]
        return self._memo[key]

    def run(self, cells: tuple, cols: int) -> tuple[int, Counter]:
        """(instructions, counts) of a thread's run: ``cells`` ((rows, held), ...) in order."""
        if "prologue" not in self._memo:  # the grid-stride loop around one one-row cell, less the cell
            whole = self._narrow_path(self.grid, 1, 0, 1, {1: (1, None), 2: (1, None)})
            one = self.cell(1, 0, 1)
            self._memo["prologue"] = (whole[0] - one[0], whole[1] - one[1])
        cost, counts = self._memo["prologue"]
        counts = Counter(counts)
        for rows, held in cells:
            c, n = self.cell(rows, held, cols)
            cost += c
            counts.update(n)
        return cost, counts


def fractional_gather_work(row_cells: int, col_cells: int, chosen_loads: int = 1,
                           grad_loads: int = 0) -> tuple[int, dict]:
    """(counted loads, trips) of one thread of max pooling's gather kernel whose pixel lies in
    row_cells x col_cells cells, counting loads of the index's width, of cell entries and of
    the packs: its four cell-list offsets (row and column, begin and end), per row cell its
    entry, per cell its column entry (16 bytes each with 32-bit indices: the cell, and the
    distances and size that give the element's place), its chosen elements (``chosen_loads``
    per pack) and, where counted (``grad_loads``, V > 1: some channel of the pack matches in
    most cells), its out_backprop pack; the row-cell loop run row_cells times.  With V = 1 a
    cell that chose the element adds its out_backprop load and add on a branch that the
    cheapest path skips (at most one match per cell)."""
    return 4 + row_cells * (1 + col_cells * (1 + chosen_loads + grad_loads)), {1: (row_cells, None)}


def gather_entry_bytes(index_width: int) -> int:
    """Bytes per load of an entry of gather's cell lists (``fractional_max::CellEntry<I>``: four
    indices, 16-byte aligned at most, so a 32-byte entry of 64-bit indices is two loads)."""
    return min(4 * index_width, 16)


def _valid_taps(in_size, pad, filter_size, dilation, stride, out_size) -> np.ndarray:
    """[in_size, filter_size] bool: whether tap t reaches input index i from a valid output."""
    i = np.arange(in_size)[:, None] + pad
    t = np.arange(filter_size)[None, :]
    d = i - t * dilation
    return (d >= 0) & (d % stride == 0) & (d // stride < out_size)


def depthwise_warp_taps(g) -> Counter:
    """``{taps in the warp's union: warps}`` over one batch item (every item is the same) of
    the depthwise input gradient's elements in memory order."""
    rows = _valid_taps(g.in_rows, g.pad_top, g.filter_rows, g.dilation_rows, g.stride_rows, g.out_rows)
    cols = _valid_taps(g.in_cols, g.pad_left, g.filter_cols, g.dilation_cols, g.stride_cols, g.out_cols)
    bits = (1 << (np.arange(g.filter_rows)[:, None] * g.filter_cols + np.arange(g.filter_cols)[None, :])).astype(np.int64)
    mask = np.einsum("yr,xs,rs->yx", rows.astype(np.int64), cols.astype(np.int64), bits)  # [y, x] tap bitmask
    per_image = g.in_rows * g.in_cols * g.in_depth
    images = 1 if per_image % 32 == 0 else g.batch
    if g.data_format == "NHWC":
        order = np.broadcast_to(mask[:, :, None], (g.in_rows, g.in_cols, g.in_depth))
    else:
        order = np.broadcast_to(mask[None, :, :], (g.in_depth, g.in_rows, g.in_cols))
    flat = np.tile(order.reshape(-1), images)
    flat = np.concatenate([flat, np.zeros(-len(flat) % 32, np.int64)])
    union = np.bitwise_or.reduce(flat.reshape(-1, 32), axis=1)
    counts = Counter(_popcount(union).tolist())
    return Counter({int(k): v * (g.batch // images) for k, v in counts.items()})


def fractional_warp_cells(g) -> Counter:
    """``{(row cells, col cells): warps}``: every warp is 32 channels of one pixel (depth % 32 == 0)."""
    # Cells per input row (column): the lengths of the geometry's per-index cell lists.
    row_offsets, col_offsets = g.cells_by_index("rows")[0], g.cells_by_index("cols")[0]
    rows, cols = Counter(np.diff(row_offsets).tolist()), Counter(np.diff(col_offsets).tolist())
    warps_per_pixel = g.batch * g.depth / 32
    return Counter({(int(r), int(c)): nr * nc * warps_per_pixel for r, nr in rows.items() for c, nc in cols.items()})


# --------------------------------------------------------------------------- kernel figures


def kernel_record(kernel) -> dict:
    """Resources, occupancy and memory instructions of one compiled instantiation."""
    from ..backends.cuda import _sass

    arch = _sass_arch(kernel.arch)
    block = block_size(kernel.expression)
    p = kernel.ptxas
    occ = _sass.occupancy(arch, p["registers"], p["shared_bytes"], block)
    record = {
        "source": kernel.source, "arch": kernel.arch, "kernel": kernel.expression, "mangled": kernel.mangled,
        "registers": p["registers"], "shared_bytes": p["shared_bytes"], "spill_stores": p["spill_stores"],
        "spill_loads": p["spill_loads"], "stack_bytes": p["stack_bytes"],
        "cuobjdump": kernel.res_usage, "block": block, "occupancy": occ,
        "sass_instructions": len(kernel.function.instructions),
        "memory_static": dict(sorted(kernel.memory_instructions().items())),
    }
    if "_igemm<" in kernel.expression or "conv2d_backprop_filter_few_channels<" in kernel.expression:
        record["main_loop"] = main_loop_summary(kernel)
    return record


def _sass_arch(arch: str) -> int:
    return int(str(arch).removeprefix("sm_"))


def main_loop_summary(kernel) -> dict | None:
    """Per k-tile figures of a tiled kernel: the innermost loop holding a barrier and the MMA
    (or FMA) instructions; every instruction of its body (nested loops once, slow-path blocks
    left out) counted once per iteration, per warp, divided by the k-tiles an iteration runs
    (one barrier each: the multistage loop runs STAGES tiles per iteration).
    ``iteration_instructions`` is the undivided body."""
    cfg = kernel.cfg
    math_ops = ("HMMA", "FFMA", "DFMA")
    candidates = []
    for lp in cfg.loops:
        body = cfg.loop_instructions(lp)
        bases = Counter(x.base for x in body)
        if bases["BAR"] and any(bases[m] for m in math_ops):
            candidates.append((len(lp.blocks), lp, body))
    if not candidates:
        return None
    _, lp, body = min(candidates, key=lambda c: c[0])
    counts = Counter(x.base for x in body)
    memory = Counter(k for x in body if (k := _memory_kind(x)))
    tiles = counts["BAR"]

    def per_tile(n):
        return n // tiles if n % tiles == 0 else round(n / tiles, 1)

    return {"header_offset": kernel.function.instructions[cfg.blocks[lp.header].start].offset,
            "depth": lp.depth, "k_tiles_per_iteration": tiles, "iteration_instructions": len(body),
            "instructions": per_tile(len(body)),
            **{op: per_tile(counts[op]) for op in ("HMMA", "FFMA", "DFMA", "LDS", "LDSM", "LDG", "STS", "LDGSTS", "BAR")},
            "memory": {k: per_tile(v) for k, v in sorted(memory.items())}}


def _memory_kind(ins):
    from ..backends.cuda import _sass

    return _sass.memory_kind(ins)


#: Why a kernel has no per-element figure: the path counter models one element per iteration of
#: a grid-stride loop whose global loads are the element's data; the staged (shared-memory tile)
#: kernels load a tile per block and sum from shared memory, which it cannot attribute.
NOT_MODELLED = ("not modelled: a staged tile kernel (global loads per block, sums from shared memory); the "
                "grid-stride path counter cannot attribute its instructions to elements")


def _planes_lane_blocks() -> int:
    """The planes filter-gradient kernel's first lane-block window form (opt-in, not modelled)."""
    import importlib

    return importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter").PLANES_LANE_BLOCKS


def reference_paths(kernel) -> dict | None:
    """The kernel table's per-element figures for a depthwise or fractional instantiation, or
    ``{"not_modelled": reason}`` for a kernel the path counter cannot model."""
    from ..backends.cuda._sass import PathError

    if "::transpose_batched" in kernel.expression:  # the opt-in transpose path's; its own figures elsewhere
        return {"not_modelled": "opt-in (path=\"transpose\"): NCHW <-> NHWC copies; its instructions per element and "
                                "the path's break-even are in nchw_transpose_breakeven.md "
                                "(benchmarks/nchw_transpose_breakeven.py)"}
    if "pool_grad_cells<" in kernel.expression:
        from . import static_cells

        try:
            if "_avg_pool_grad_cells<" in kernel.expression:
                return static_cells.reference_paths(kernel)
            return static_cells.max_reference_paths(kernel)
        except (PathError, ValueError) as exc:
            return {"not_modelled": f"not modelled: {exc}"}
    if "_filter_planes<" in kernel.expression and int(template_args(kernel.expression)[4]) >= _planes_lane_blocks():
        return {"not_modelled": "opt-in (lanes=True): lane-block window loads; their interior items' instructions "
                                "and sectors are in planes_lane_blocks.md (benchmarks/planes_lane_blocks.py); the "
                                "GPU A/B (gradops-cuda:planes_lanes) decides whether the launcher takes them"}
    if "_filter_tiled<" in kernel.expression and kernel.expression.endswith(", true>"):
        return {"not_modelled": "opt-in (async_copies=True): asynchronous staging, not modelled; the GPU A/B "
                                "(gradops-cuda:async) decides whether the launcher takes it"}
    try:
        return _reference_paths(kernel)
    except (PathError, ValueError) as exc:
        if kernel.source == FRACTIONAL_SOURCE:  # the staged model's own limits (static_tiled)
            return {"not_modelled": f"not modelled: {exc}"}
        return {"not_modelled": f"{NOT_MODELLED} ({exc})"}


def _reference_paths(kernel) -> dict | None:
    width = element_width(kernel.expression)
    if "_input_tiled<" in kernel.expression:
        return _tiled_reference_paths(kernel)
    if "_input_mma<" in kernel.expression:
        return _mma_reference_paths(kernel)
    if "_input_mma_nhwc<" in kernel.expression:
        return _mma_nhwc_reference_paths(kernel)
    if "_input_planes<" in kernel.expression:
        return _planes_reference_paths(kernel)
    if kernel.source == DEPTHWISE_SOURCE:
        args = template_args(kernel.expression)
        kh, kw, sh, sw = (int(a) for a in args[3:7])
        cfg = kernel.cfg
        if kh == 0:  # generic: per tap iteration of the column loop (multiplier loop once inside)
            model = PathModel(kernel, width, trips_depth=3)
            loads, trips = depthwise_work(1, 1)
            one, counts = model.cost(loads, trips)
            two, _ = model.cost(*depthwise_work(2, 1))
            return {"work": "1 tap, multiplier 1 (generic kernel: tap loops at run time)",
                    "per_element": one, "per_extra_tap": two - one, "path": _path_summary(counts),
                    "call_sites": _call_sites(cfg)}
        model = PathModel(kernel, width)
        # Interior element: every tap of its stride phase; mean over the sh x sw phases.
        phases = [len(range(py, kh, sh)) * len(range(px, kw, sw)) for py in range(sh) for px in range(sw)]
        costs = [model.cost(*depthwise_work(t, 1)) for t in phases]
        full, counts = model.cost(*depthwise_work(max(phases), 1))
        fewer, _ = model.cost(*depthwise_work(max(phases) - 1, 1))
        work = (f"interior element, all {kh * kw} taps, multiplier 1" if sh == sw == 1 else
                f"interior element, mean over the {sh * sw} stride phases ({', '.join(map(str, phases))} taps), "
                f"multiplier 1")
        return {"work": work, "per_element": sum(c for c, _ in costs) / len(costs),
                "per_extra_tap": full - fewer, "path": _path_summary(counts if sh == sw == 1 else costs[0][1]),
                "call_sites": _call_sites(cfg)}
    if kernel.source in (DEPTHWISE_FILTER_SOURCE, FRACTIONAL_MAX_SOURCE):
        return _two_stage_reference_paths(kernel, width)
    if kernel.source == FRACTIONAL_SOURCE:
        return _fractional_reference_paths(kernel)
    return None


def fractional_reference_cases() -> tuple[Case, Case]:
    """The shapes the kernel table gives the staged fractional kernel's figures for: the
    fractional suite's first disjoint and first overlapping average pooling case."""
    cases = [c for c in suite("fractional") if c.op == FRACTIONAL]
    return (next(c for c in cases if "overlapping" not in c.label), next(c for c in cases if "overlapping" in c.label))


def _fractional_reference_paths(kernel) -> dict:
    """The kernel table's figures for a staged fractional average pooling instantiation
    (:mod:`.static_tiled`): the whole launch of the suite's first disjoint shape with the
    launcher's plan (index type and vector width forced to the instantiation's), every warp of
    every tile charged its busiest lane's path, per input-gradient element; the overlapping
    shape's figure beside it.  The path shown is the launch's commonest staging warp's."""
    from . import static_tiled as st

    disjoint, overlapping = fractional_reference_cases()
    g, og = disjoint.geometry(), overlapping.geometry()
    p = st.fractional_plan(g, kernel.expression)
    model = st.fractional_tiled(kernel, g, p)
    other = st.fractional_tiled(kernel, og, st.fractional_plan(og, kernel.expression))
    staging = max((w for w in model["warps"] if w.staged), key=lambda w: model["warps"][w])
    _, counts = st.fractional_warp_cost(kernel, staging)
    return {"work": f"{disjoint.label}: every warp of the launch's {model['ctas']} tiles "
                    f"({p.block[0]}x{p.block[1]} threads, {p.tile_height}x{p.tile_cols} positions, V={p.vector}); "
                    f"path of a staging warp ({staging.staged} cell, {len(staging.rows)} positions)",
            "per_element": model["per_element"], "overlapping_per_element": other["per_element"],
            "extra_text": f"overlapping: {other['per_element']:.1f}",
            "path": _path_summary(counts), "call_sites": _kernel_call_sites(kernel.cfg),
            "staging_warp": {"staged": staging.staged, "vectors": staging.vectors, "cols": staging.cols,
                             "rows": list(staging.rows), "instructions": counts["total"]},
            "tiled": True}


def _tiled_reference_paths(kernel) -> dict:
    """The kernel table's figures for a tiled depthwise instantiation: one thread's common path
    (:mod:`.static_tiled`) at multiplier 1 (16-byte staging in NHWC), and for float
    accumulators the paired multiplier 2 beside it."""
    from . import static_tiled as st

    nhwc = template_args(kernel.expression)[2] == "0"
    one = st.depthwise_tiled_path(kernel, True, False, 1)  # 16-byte staging (NCHW: chunks of plane rows)
    t = one["tile"]
    staging = f"{t.load_width}-byte staging" + ("" if nhwc else f" (NCHW plane rows, stored to shared memory an element "
                                                               f"at a time as at SAME padding, {t.store_width}-byte "
                                                               f"stores)")
    record = {"work": f"one thread of an interior {t.tile[0]}x{t.tile[1]}-position tile, multiplier 1, {staging}, "
                      f"finite filter; / {t.outputs // t.threads} outputs per thread",
              "per_element": one["per_element"], "thread_instructions": one["instructions"],
              "path": one["path"], "call_sites": _kernel_call_sites(kernel.cfg),
              "global_bytes_per_element": one["global_bytes_per_element"], "tiled": True}
    if t.v == 2:  # float accumulators: multiplier 2 pairs its slices
        two = st.depthwise_tiled_path(kernel, True, True, 2)
        record["paired_m2_per_element"] = two["per_element"]
        record["extra_text"] = f"m2 paired: {two['per_element']:.1f}"
    else:
        record["extra_text"] = "-"
    return record


#: The whole-plane tensor-core kernel's reference plane in the kernel table: 14 x 14 (EfficientNet's
#: 5x5 layers at 14 x 14, MobileNetV2's 3x3 ones), 8-byte chunks of 4 halves.
MMA_PLANE_REFERENCE = (14, 14, 4)
#: The packed form's: four 7 x 7 images (MobileNetV2's and EfficientNet's last layers), SAME.
MMA_PACKED_REFERENCE = (7, 7)


def _mma_reference_paths(kernel) -> dict:
    """The kernel table's figures for the tensor-core depthwise kernel: one lane's unit path
    (16 x 16 positions, 16-byte staging, pair stores; the whole-plane form: a 14 x 14 plane in
    8-byte chunks) per position of a full unit (of the plane), the warp's fixed path beside it.
    The launcher picks it where MMA_CHOICE says (else path="mma")."""
    from . import static_tiled as st

    k, m = st.mma_template(kernel.expression)
    form = st.mma_form_of(kernel.expression)
    if form == 1:
        rows, cols, vec = MMA_PLANE_REFERENCE
        paths = st.mma_paths(kernel, vec, True, rows * cols)
        positions = rows * cols
        what = f"one lane's unit of a {rows} x {cols} plane (multiplier {m}), {2 * vec}-byte whole-plane " \
               f"staging, pair stores; / {positions} positions"
    elif form == 2:
        rows, cols = MMA_PACKED_REFERENCE
        vec, positions = 1, 4 * rows * cols
        paths = st.mma_paths(kernel, vec, False, positions)
        what = f"one lane's unit of four {rows} x {cols} images (multiplier {m}), packed, element staging and " \
               f"stores; / {positions} positions"
    else:
        vec, positions = 8, 256
        paths = st.mma_paths(kernel, vec, True)
        stores = "16-byte result runs" if form == st.MMA_RUNS_FORM else "pair stores"
        what = f"one lane's unit of 16 x 16 positions (multiplier {m}), 16-byte staging, {stores}; " \
               f"/ 8 positions per lane"
    loads = paths["loads"] * 2 * vec + paths["stores"] * (16 if form == st.MMA_RUNS_FORM else 4 if form < 2 else 2)
    return {"work": f"{what} (chosen per shape: MMA_CHOICE)",
            "per_element": paths["unit"] * 32 / positions, "thread_instructions": paths["unit"],
            "path": _path_summary(paths["unit_counts"]), "call_sites": _kernel_call_sites(kernel.cfg),
            "global_bytes_per_element": loads * 32 / positions, "tiled": True,
            "extra_text": f"fixed {paths['fixed']} per warp, {paths['hmma']} HMMA per unit "
                          f"({paths['tensor']:g} in HMMA.16816 units)"}


def _mma_nhwc_reference_paths(kernel) -> dict:
    """The kernel table's figures for the NHWC tensor-core depthwise kernel: one thread's path
    through one image of a unit (16 x 16 positions x 8 channels: 8 outputs a thread), its fixed
    path beside it."""
    from . import static_tiled as st

    k, m = st.mma_template(kernel.expression)
    paths = st.mma_nhwc_paths(kernel)
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    outputs = dw.MMA_UNIT ** 2 * dw.MMA_NHWC_CHANNELS // dw.MMA_NHWC_THREADS  # a thread's: 8
    loads = paths["loads"] * 16 + 16  # its staging loads and its result chunk
    return {"work": f"one thread's image of a unit of 16 x 16 positions x 8 channels (multiplier {m}), 16-byte "
                    f"staging and stores; / {outputs} outputs per thread (chosen per shape: MMA_NHWC_CHOICE)",
            "per_element": paths["image"] / outputs, "thread_instructions": paths["image"],
            "path": _path_summary(paths["image_counts"]), "call_sites": _kernel_call_sites(kernel.cfg),
            "global_bytes_per_element": loads / outputs, "tiled": True,
            "extra_text": f"fixed {paths['fixed']} per thread, {paths['hmma']} HMMA per warp and image "
                          f"({paths['tensor']:g} in HMMA.16816 units)"}


def _planes_reference_paths(kernel) -> dict:
    """The kernel table's figures for the planes depthwise kernel (NCHW): one work item of one
    slice (2 x 4 positions, 2 x 8 at stride 2), results stored 4 columns at a time, column phase
    0, staging loads of 16 bytes (:func:`.static_tiled.planes_loop_figures`), per position;
    staging, zero fill and filter per CTA are left out (the shape rows count them)."""
    from . import static_tiled as st

    stride = int(template_args(kernel.expression)[4])
    f = st.planes_loop_figures(kernel.arch, 4, 0, st.planes_widest_load(kernel.expression))[kernel.expression]
    positions = 2 * 4 * stride
    counts = f["rest"][1] + f["sums"][1]
    return {"work": f"one work item of 2 x {4 * stride} positions, multiplier 1, stores of 4 columns, finite "
                    f"filter (staging {f['staging'][0]} per chunk of 8 in 16-byte loads, {f['straight']} "
                    f"straight-line per thread, not included); / {positions} positions",
            "per_element": (f["rest"][0] + f["sums"][0]) / positions, "thread_instructions": f["rest"][0] + f["sums"][0],
            "path": _path_summary(counts), "call_sites": _kernel_call_sites(kernel.cfg), "tiled": True,
            "extra_text": f"sums {f['sums'][0]} a slice"}


#: Out-of-line helpers a kernel calls on purpose, once at its end (not a slow path): the depthwise
#: filter gradient's one-launch reduction (``add_few_slices``).
DELIBERATE_CALLS = ("add_few_slices",)


def _kernel_call_sites(cfg) -> int:
    """Subroutine calls anywhere in the kernel (each a slow path beside an inline fast path),
    but for :data:`DELIBERATE_CALLS`."""
    return sum(1 for x in cfg.function.instructions if x.base == "CALL" and (x.target or "").startswith("$")
               and not any(name in x.target for name in DELIBERATE_CALLS))


def _two_stage_reference_paths(kernel, width: int) -> dict | None:
    """The kernel table's figures for the depthwise filter gradient's and max pooling's kernels
    (float16/bfloat16/float32 with 32-bit indices: the benchmark's; others are left out)."""
    args = template_args(kernel.expression)
    if "_filter_tiled<" in kernel.expression:
        return _filter_tiled_reference_paths(kernel, width) if width in (2, 4) else None
    if "_filter_planes<" in kernel.expression:
        return _filter_planes_reference_paths(kernel, width) if width in (2, 4) else None
    if "_filter_mma<" in kernel.expression:
        return _filter_mma_reference_paths(kernel)
    if "_filter_mma_nhwc<" in kernel.expression:
        return _filter_mma_nhwc_reference_paths(kernel)
    max_pool = "_select<" in kernel.expression or "_gather<" in kernel.expression
    index_type = args[1] if max_pool else args[-1]  # max pooling: <T, I, V, C>
    if width not in (2, 4) or index_type != "int" and "_reduce<" not in kernel.expression:
        return None
    cfg = kernel.cfg
    if "_partial<" in kernel.expression:
        model = PathModel(kernel, width)
        one, counts = filter_partial_cost(model, 1, 0, 1)
        short, _ = filter_partial_cost(model, 1, 0, 48)
        long, _ = filter_partial_cost(model, 1, 0, 112)
        row, _ = filter_partial_cost(model, 2, 0, 48)
        return {"work": "one partial sum: 1 in-image row of 1 column (2 loads); per step: mean over columns 49-112 "
                        "of a row; per row: one more row of 48 columns",
                "per_element": one, "extra_text": f"per step {(long - short) / 64:.1f}, per row {row - short:.0f}",
                "per_step": (long - short) / 64, "per_row": row - short, "path": _path_summary(counts),
                "call_sites": _call_sites(cfg), "loads_per_batch": loads_per_batch(kernel, width)}
    if "_reduce<" in kernel.expression:
        one, counts = filter_reduce_cost(kernel, 1)
        many, _ = filter_reduce_cost(kernel, 65)
        return {"work": "the busiest thread (group 0) of a filter element summing 1 slice (1 accumulator load) and "
                        "the groups; per slice: mean over its slices 2-65",
                "per_element": one, "extra_text": f"per slice {(many - one) / 64:.1f}",
                "per_slice": (many - one) / 64, "path": _path_summary(counts), "call_sites": _kernel_call_sites(cfg)}
    import importlib

    fm = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    index, v = 4, int(args[2])  # the int instantiations; V channels per thread
    local = args[3] == fm.LOCAL_TYPE  # chosen elements as one-byte cell places
    element_width, element_loads = fm.pack_accesses(v, width)
    index_width, index_loads = fm.pack_accesses(v, 1 if local else index)
    if "_select<" in kernel.expression:
        if args[0] not in ("__half", "__nv_bfloat16", "float"):  # the model counts floating-point compares
            return None
        model = SelectModel(kernel, element_width, element_loads, v)
        one, counts = model.run(((1, 0),), 1)
        overlapping = ((3, 0),) + ((3, 1),) * (fm.SELECT_RUN - 1)  # rows 0-2, 2-4, 4-6, 6-8
        four, _ = model.run(overlapping, 3)
        return {"work": f"output element of a 1x1 cell (disjoint pooling), {v} per thread, a run of one cell",
                "per_element": one / v,
                "extra_text": f"3x3 overlapping cells, run of {fm.SELECT_RUN}: {four / fm.SELECT_RUN / v:.1f}",
                "per_element_3x3_overlapping_run": four / fm.SELECT_RUN / v,
                "path": _path_summary(counts), "call_sites": _call_sites(cfg)}
    widths = {index, index_width, gather_entry_bytes(index)} | ({element_width} if v > 1 else set())
    model = PathModel(kernel, tuple(sorted(widths)))
    grad = element_loads if v > 1 else 0
    one, counts = model.cost(*fractional_gather_work(1, 1, index_loads, grad), at_least=True)
    four, _ = model.cost(*fractional_gather_work(2, 2, index_loads, grad), at_least=True)
    chosen = "a channel of the pack chosen" if v > 1 else "not chosen"
    places = ", cell places" if local else ""
    return {"work": f"input element in 1 row cell x 1 column cell, {chosen}, {v} per thread{places}",
            "per_element": one / v, "extra_text": f"2x2 cells: {four / v:.1f}", "per_element_2x2_cells": four / v,
            "path": _path_summary(counts), "call_sites": _call_sites(cfg)}


def _filter_tiled_reference_paths(kernel, width: int) -> dict:
    """The kernel table's figures for the tiled depthwise filter-gradient kernel: one unit of a
    thread (16-byte staging of multiplier 1, an interior tile of a 56 x 56 x 144 map) per
    out_backprop element it multiplies in (its work item's positions x V channels)."""
    import importlib

    from .._geometry import conv2d_geometry

    k, s, c = (int(a) for a in template_args(kernel.expression)[2:5])
    size, channels = 56, 144
    g = conv2d_geometry("depthwise_conv2d_native_backprop_filter", (1, size, size, channels),
                        (k, k, channels, 1), (1, size // s, size // s, channels), [1, s, s, 1], "SAME", [], "NHWC",
                        [1, 1, 1, 1], depthwise=True)
    dtype = {2: np.float16, 4: np.float32}[width]
    per_unit, fixed, counts = filter_tiled_unit_cost(kernel, dtype, g)
    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    outputs = math.prod(dwf.item_shape(g)) * dwf.lane_channels(dtype)
    return {"work": f"one unit of one thread: {outputs} out_backprop elements (its work item's positions x "
                    f"channels), 16-byte staging, multiplier 1", "per_element": per_unit / outputs,
            "extra_text": f"unit {per_unit}, fixed {fixed}", "per_unit": per_unit, "fixed": fixed,
            "path": _path_summary(counts), "call_sites": _kernel_call_sites(kernel.cfg)}


def _filter_planes_reference_paths(kernel, width: int) -> dict:
    """The kernel table's figures for the planes depthwise filter-gradient kernel: one work
    item of a thread (a 56 x 56 x 144 NCHW map, out_backprop rows in one load) per position,
    its padding (K - 1) / 2 on each side, or for pair window loads one less where that has
    not the parity the kernel's form needs (even: from the window's first column; odd: the
    column before)."""
    import importlib

    from .._geometry import conv2d_geometry

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    k, s, form = (int(a) for a in template_args(kernel.expression)[2:5])
    size, channels = 56, 144
    pad = (k - 1) // 2
    if form != dwf.PLANES_SINGLES and pad % 2 != (form == dwf.PLANES_PAIRS_FROM_COLUMN_BEFORE):
        pad -= 1  # (K - 1) / 2 >= 1
    out = (size + 2 * pad - k) // s + 1
    g = conv2d_geometry("depthwise_conv2d_native_backprop_filter", (1, channels, size, size),
                        (k, k, channels, 1), (1, channels, out, out), [1, 1, s, s], "EXPLICIT",
                        [0, 0, 0, 0, pad, pad, pad, pad], "NCHW", [1, 1, 1, 1], depthwise=True)
    dtype = {2: np.float16, 4: np.float32}[width]
    assert dwf.planes_window_form(g, dtype, pairs=form != dwf.PLANES_SINGLES) == form
    (per_item, counts), (per_border, _), fixed, (trips, border_trips) = filter_planes_item_cost(kernel, dtype, g,
                                                                                                  True, form)
    outputs = math.prod(dwf.planes_item_shape(g))
    loads, load_bytes = dwf.planes_window_loads(g, dtype, form)
    return {"work": f"one interior work item of one thread: {outputs} out_backprop elements (positions of one "
                    f"channel), out_backprop rows in one load, {loads} window loads of {load_bytes} bytes "
                    f"(padding {pad})", "per_element": per_item / outputs,
            "extra_text": f"interior item {per_item} ({trips} round trips), border item {per_border} "
                          f"({border_trips}), fixed {fixed}", "per_item": per_item,
            "per_border_item": per_border, "fixed": fixed, "round_trips": [trips, border_trips],
            "path": _path_summary(counts),
            "call_sites": _kernel_call_sites(kernel.cfg)}


def _filter_mma_reference_paths(kernel) -> dict:
    """The kernel table's figures for the tensor-core depthwise filter-gradient kernel: one image
    of a warp (one lane's path, :func:`filter_mma_costs`) on the SAME plane its staging chunk
    suits (7 x 7: elements, 14 x 14: pairs, 28 x 28: 4-element chunks), 144 channels, 4 images;
    per element: 32 lanes x the image path / the image's out_backprop elements."""
    import importlib

    from .._geometry import conv2d_geometry

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    args = template_args(kernel.expression)
    k, m, vec = (int(a) for a in args[1:4])
    size, channels = {1: 7, 2: 14, 4: 28}[vec], 144
    g = conv2d_geometry("depthwise_conv2d_native_backprop_filter", (4, channels, size, size), (k, k, channels, m),
                        (4, channels * m, size, size), [1, 1, 1, 1], "SAME", [], "NCHW", [1, 1, 1, 1],
                        depthwise=True)
    dtype = DTYPES["bfloat16" if "bfloat16" in args[0] else "float16"]
    assert dwf.mma_chunk(g, dtype) == vec
    costs = filter_mma_costs(kernel, dtype, g)
    outputs = size * size * m
    image = costs["double"] / 2 if costs["pair"] else costs["single"]
    counts = costs["double_counts"] if costs["pair"] else costs["single_counts"]
    pair = f", pair {costs['double']}" if costs["pair"] else ""
    return {"work": f"one image of one warp ({'half a pair' if costs['pair'] else 'alone'}): a {size}x{size} SAME "
                    f"plane, {m} out_backprop plane(s), {vec}-element staging chunks, {costs['hmma']} HMMA; / "
                    f"{outputs} out_backprop elements x 32 lanes",
            "per_element": 32 * image / outputs,
            "extra_text": f"image {costs['single']}{pair}, fixed {costs['fixed']}", "per_image": image,
            "image": costs["single"], "pair": costs["double"] if costs["pair"] else None,
            "fixed": costs["fixed"], "path": _path_summary(counts),
            "call_sites": _kernel_call_sites(kernel.cfg)}


def _filter_mma_nhwc_reference_paths(kernel) -> dict:
    """The kernel table's figures for the NHWC tensor-core depthwise filter-gradient kernel: one
    unit of a thread (:func:`filter_mma_nhwc_costs`) on a SAME map of 144 channels, 4 images:
    14 x 14, or 7 x 7 for the packed form (the four images in one unit); per element: the CTA's
    threads x the unit path / the unit's out_backprop elements (196 positions x 16 output
    channels either way)."""
    import importlib

    from .._geometry import conv2d_geometry

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    args = template_args(kernel.expression)
    k, m = (int(a) for a in args[1:3])
    packed = args[3] == "true"
    size, channels = (7 if packed else 14), 144
    g = conv2d_geometry("depthwise_conv2d_native_backprop_filter", (4, size, size, channels), (k, k, channels, m),
                        (4, size, size, channels * m), [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1],
                        depthwise=True)
    dtype = DTYPES["bfloat16" if "bfloat16" in args[0] else "float16"]
    assert dwf.mma_nhwc_packed(g) == packed
    costs = filter_mma_nhwc_costs(kernel, dtype, g)
    outputs = (4 if packed else 1) * size * size * dwf.mma_nhwc_channels(g) * m
    what = "four 7x7 SAME images" if packed else f"a {size}x{size} SAME tile"
    return {"work": f"one unit of one thread: {what} of {dwf.mma_nhwc_channels(g)} channels, "
                    f"{costs['hmma']} HMMA a warp; x {dwf.MMA_NHWC_THREADS} threads / {outputs} out_backprop "
                    "elements", "per_element": dwf.MMA_NHWC_THREADS * costs["unit"] / outputs,
            "extra_text": f"unit {costs['unit']}, fixed {costs['fixed']}", "per_unit": costs["unit"],
            "fixed": costs["fixed"], "path": _path_summary(costs["unit_counts"]),
            "call_sites": _kernel_call_sites(kernel.cfg)}


def _call_sites(cfg) -> int:
    """Subroutine calls in the grid-stride loop (each a slow path beside an inline fast path)."""
    loop = grid_loop(cfg)
    return sum(1 for x in cfg.loop_instructions(loop, include_cold=True)
               if x.base == "CALL" and (x.target or "").startswith("$"))


# --------------------------------------------------------------------------- shapes


def _kernel_for(case: Case, dtype, geometry, kernels: dict, arch: str, path: str | None = None):
    import importlib

    # The launcher modules (the package re-exports functions of the same names).
    if case.op == DEPTHWISE_INPUT:
        dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
        if path is None:
            path = dw.pick_path(geometry, dtype, arch=int(arch.removeprefix("sm_")))  # what the launcher runs
        if path == "mma":
            return kernels[(arch, dw.mma_expression(geometry, dtype))]
        if path == "mma_nhwc":
            return kernels[(arch, dw.mma_nhwc_expression(geometry, dtype))]
        if path == "tiled":
            return kernels[(arch, dw.tiled_expression(geometry, dtype))]
        if path in ("planes", "planes_direct", "planes_staged"):
            return kernels[(arch, dw.planes_expression(geometry, dtype, dw.planes_path_staged(geometry, dtype, path)))]
        return kernels[(arch, dw._expression(dtype, geometry.data_format, dw.specialisation(geometry)))]
    fr = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")
    if fr.pick_path(geometry, dtype, path) == "cells":
        from . import static_cells

        return kernels[(arch, static_cells.cells_launch(geometry, dtype)[0])]
    p = _fractional_launch(geometry, dtype)  # the launcher's plan: its index type and vector width
    return kernels[(arch, fr._expression(dtype, p.index, p.vector))]


def _fractional_launch(geometry, dtype):
    """The fractional launcher's plan for a benchmark call (fresh, 16-byte-aligned arrays)."""
    import importlib

    return importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad").plan(geometry, dtype)


def input_paths(g, dtype, forms: bool = False) -> tuple[str, ...]:
    """The depthwise input gradient's kernels the model can predict for ``g`` on a GPU with
    tensor cores (``predict``'s ``path``): tiled, mma and planes (the launcher's store form), each
    where it can run; with ``forms``, also planes_direct and planes_staged (the planes kernel's
    result stores forced) where they can."""
    import importlib

    dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
    planes = dw.planes_possible(g, dtype)
    return tuple(p for p, ok in (("tiled", dw.tiled_eligible(g, dtype)), ("mma", dw.mma_possible(g, dtype)),
                                 ("mma_nhwc", dw.mma_nhwc_possible(g, dtype)), ("planes", planes),
                                 ("planes_direct", forms and planes),
                                 ("planes_staged", forms and planes and dw.planes_staged_possible(g, dtype))) if ok)


def fractional_paths(g, dtype) -> tuple[str, ...]:
    """The fractional average pooling gradient's kernels the model can predict for ``g``
    (``predict``'s ``path``): gather, and cells where the cells partition the input."""
    import importlib

    fr = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")
    return ("gather", "cells") if fr.cells_possible(g, dtype) else ("gather",)


def fractional_max_paths(g, dtype) -> tuple[str, ...]:
    """The fractional max pooling gradient's kernels the model can predict for ``g``: gather
    (select + gather), and cells where the cells partition the input."""
    import importlib

    fm = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    return ("gather", "cells") if fm.cells_bounds(g) is not None else ("gather",)


def filter_paths(g, dtype) -> tuple[str, ...]:
    """The depthwise filter gradient's first kernels the model can predict for ``g`` (aligned
    arrays, a GPU with tensor cores; ``predict``'s ``path``), in the launcher's order of preference:
    mma (NCHW), mma_nhwc, tiled, planes, and partial (the per-element kernel, which runs anything).
    The model's tiled kernel stages 16 bytes at a time; where it cannot, the launcher still runs
    the tiled kernel with scalar staging, which the model does not price (it falls back to the
    next path, as it did before ``path`` existed)."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    able = {"mma": dwf.mma_possible(g, dtype), "mma_nhwc": dwf.mma_nhwc_eligible(g, dtype),
            "tiled": dwf.tiled_eligible(g, dtype) and dwf.vector_staging_possible(g, dtype),
            "planes": dwf.planes_eligible(g, dtype), "partial": True}
    return tuple(p for p, ok in able.items() if ok)


def filter_launcher_path(g, dtype, arch: int) -> str:
    """The first kernel the filter gradient's launcher takes for ``g`` with aligned arrays on
    compute capability ``arch`` (one of :func:`filter_paths`)."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    if dwf.mma_chosen(g, dtype, arch=arch):
        return "mma"
    if dwf.mma_nhwc_chosen(g, dtype, arch):
        return "mma_nhwc"
    return next(p for p in ("tiled", "planes", "partial") if p in filter_paths(g, dtype))


def predict(case: Case, dtype_name: str, device: Device, kernels: dict, path: str | None = None) -> dict:
    """The roofline prediction of one benchmark case on one device (see the module docstring),
    or the case with ``not_modelled`` (the reason) when its kernel cannot be modelled.  ``path``:
    the kernel the launcher would run (None), or another of the depthwise gradients' or of the
    fractional pooling gradients' (:func:`input_paths` with its planes kernel's forms,
    :func:`filter_paths`, :func:`fractional_paths`, :func:`fractional_max_paths`; ValueError where
    it cannot run the case)."""
    from ..backends.cuda import _sass

    dtype = DTYPES[dtype_name]
    g = case.geometry()
    if path is not None:
        paths_of = {DEPTHWISE_INPUT: functools.partial(input_paths, forms=True), DEPTHWISE_FILTER: filter_paths,
                    FRACTIONAL: fractional_paths, FRACTIONAL_MAX: fractional_max_paths}
        if case.op not in paths_of:
            raise ValueError(f"{case.op}: the model predicts only the launcher's kernels")
        if path not in paths_of[case.op](g, dtype):
            raise ValueError(f"{path}: not a modelled path of this case ({paths_of[case.op](g, dtype)})")
    two_stage = {DEPTHWISE_FILTER: functools.partial(_predict_depthwise_filter, path=path),
                 FRACTIONAL_MAX: functools.partial(_predict_fractional_max, path=path)}
    if case.op in two_stage:
        try:
            return two_stage[case.op](case, dtype_name, device, kernels, g)
        except (_sass.PathError, ValueError) as exc:
            return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name,
                    "device": device.key, "not_modelled": f"not modelled: {exc}"}
    kernel = _kernel_for(case, dtype, g, kernels, f"sm_{device.arch}", path)
    try:
        if "_input_tiled<" in kernel.expression:
            from . import static_tiled as st

            return st.predict_depthwise(case, dtype_name, device, kernel, g, st.depthwise_launch(g, dtype))
        if "_input_mma<" in kernel.expression:
            from . import static_tiled as st

            return st.predict_depthwise_mma(case, dtype_name, device, kernel, g)
        if "_input_mma_nhwc<" in kernel.expression:
            from . import static_tiled as st

            return st.predict_depthwise_mma_nhwc(case, dtype_name, device, kernel, g)
        if "_input_planes<" in kernel.expression:
            from . import static_tiled as st

            return st.predict_depthwise_planes(case, dtype_name, device, kernel, g, path or "planes")
        if "pool_grad_cells<" in kernel.expression:
            from . import static_cells

            return static_cells.predict(case, dtype_name, device, kernel, g)
        if case.op == FRACTIONAL:
            from . import static_tiled as st

            return st.predict_fractional(case, dtype_name, device, kernel, g, _fractional_launch(g, dtype))
        return _predict(case, dtype_name, device, kernel, g)
    except (_sass.PathError, ValueError) as exc:
        reason = f"not modelled: {exc}" if case.op == FRACTIONAL else f"{NOT_MODELLED} ({exc})"
        return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
                "kernel": kernel.expression, "not_modelled": reason}


def _predict(case: Case, dtype_name: str, device: Device, kernel, g) -> dict:
    from ..backends.cuda import _sass

    dtype = DTYPES[dtype_name]
    width = dtype.itemsize
    elements = math.prod(g.input_shape)
    model = PathModel(kernel, width)
    if case.op != DEPTHWISE_INPUT:  # the staged fractional kernel: static_tiled.predict_fractional
        raise ValueError(f"{case.op}: no grid-stride model")
    mult = g.depth_multiplier
    warps = depthwise_warp_taps(g)
    work = {taps: depthwise_work(taps, mult) for taps in warps}
    out_bytes = width * math.prod(g.out_backprop_shape)
    filter_slice = g.filter_rows * g.filter_cols * mult * width * min(g.in_depth, 256)
    l2_bytes = (g.filter_rows * out_bytes + math.ceil(elements / 256) * filter_slice + width * elements)
    total_warps = sum(warps.values())
    mean_cost, pipe_counts = 0.0, Counter()
    for key, n in warps.items():
        cost, counts = model.cost(*work[key])
        mean_cost += cost * n / total_warps
        for cls, v in counts.items():
            if cls.startswith("class:"):
                pipe_counts[cls.removeprefix("class:")] += v * n / total_warps
    traffic = bytes_moved(case, g, width)
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], block_size(kernel.expression))
    limits = roofline(device, elements, mean_cost, pipe_counts, traffic, l2_bytes, occ["warps_per_sm"] * 32)
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2_bytes,
            "sass_per_element": mean_cost, "resident_warps_per_sm": occ["warps_per_sm"], **limits,
            "work_histogram": {str(k): v for k, v in sorted(warps.items())}}


# --------------------------------------------------------------------------- two-kernel ops


def loads_per_batch(kernel, width) -> int:
    """Counted loads of the innermost loop's body (an unrolled loop issues them together, so
    they share one memory round trip); 1 when the kernel has no loop nested in the grid loop."""
    counted = counted_loads(width)
    grid = grid_loop(kernel.cfg)
    inner = [lp for lp in kernel.cfg.loops if lp is not grid and lp.blocks < grid.blocks and not lp.children]
    return max([sum(1 for x in kernel.cfg.loop_instructions(lp) if counted(x)) for lp in inner] + [1])


def _stage(name: str, device: Device, kernel, elements: int, mean_cost: float, pipes: dict, traffic: float,
           l2_bytes: float, round_trips: float = 1.0) -> dict:
    """One kernel's roofline: as :func:`roofline`, with ``round_trips`` dependent memory round
    trips per element in place of one (a thread running a long loop)."""
    from ..backends.cuda import _sass

    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"],
                          block_size(kernel.expression))
    limits = roofline(device, elements, mean_cost, pipes, traffic, l2_bytes, occ["warps_per_sm"] * 32)
    if round_trips != 1.0 and occ["warps_per_sm"]:
        # A thread's loop is a chain of round trips: at least one wave of them, however few threads.
        waves = max(1.0, elements / (device.sms * occ["warps_per_sm"] * 32))
        with_latency_limit(limits, device, traffic, waves * round_trips * device.dram_latency_s)
    return {"stage": name, "kernel": kernel.expression, "elements": elements, "bytes": traffic, "l2_bytes": l2_bytes,
            "sass_per_element": mean_cost, "round_trips_per_element": round_trips,
            "resident_warps_per_sm": occ["warps_per_sm"], **limits}


def _weighted_mean(paths) -> tuple[float, Counter]:
    """Mean cost and pipe counts of ``[(weight, (cost, counts))]``."""
    paths = list(paths)
    total = sum(weight for weight, _ in paths)
    mean, pipes = 0.0, Counter()
    for weight, (cost, counts) in paths:
        mean += cost * weight / total
        for cls, v in counts.items():
            if cls.startswith("class:"):
                pipes[cls.removeprefix("class:")] += v * weight / total
    return mean, pipes


def _mean_path(model: PathModel, work: dict) -> tuple[float, Counter]:
    """Mean cost and pipe counts over ``{key: (weight, (loads, trips))}`` (at-least paths)."""
    return _weighted_mean((weight, model.cost(loads, trips, at_least=True)) for weight, (loads, trips) in work.values())


def _two_stage(case: Case, dtype_name: str, device: Device, g, elements: int, stages: list[dict]) -> dict:
    """A prediction of an op run as kernels one after the other: each limit and the predicted
    time are the stages' sums; SASS per element and the budget are per ``elements`` (the op's
    own unit, stated by the caller)."""
    traffic = bytes_moved(case, g, DTYPES[dtype_name].itemsize)
    predicted = sum(st["predicted_ms"] for st in stages)
    main = max(stages, key=lambda st: st["predicted_ms"])
    warp_instructions = sum(st["warp_instructions"] for st in stages)
    return {"suite": case.suite, "label": case.label, "op": case.op, "dtype": dtype_name, "device": device.key,
            "kernel": " + ".join(st["kernel"] for st in stages), "elements": elements,
            "bytes": sum(st["bytes"] for st in stages), "compulsory_bytes": traffic,
            "l2_bytes": sum(st["l2_bytes"] for st in stages), "sass_per_element": 32 * warp_instructions / elements,
            "resident_warps_per_sm": main["resident_warps_per_sm"], "warp_instructions": warp_instructions,
            "issue_detail": main["issue_detail"],
            "limits_ms": {k: sum(st["limits_ms"][k] for st in stages) for k in main["limits_ms"]},
            "limiter": f"{main['limiter']} ({main['stage']})", "predicted_ms": predicted,
            "pct_hbm": 100 * traffic / (predicted / 1e3) / device.bandwidth,
            "budget_per_element_75pct_hbm": instruction_budget(device, traffic, elements),
            "stages": stages}


def filter_partial_groups(g, slices: int, rows_per_slice: int) -> Counter:
    """``{(in-image rows, out-of-image rows, in-image columns): warps}`` of the depthwise filter
    gradient's first kernel: a warp is 32 consecutive k (a channel group, the last one padded
    with idle lanes, which skip the loop) of one (slice, tap), so every warp of a (slice, tap)
    takes its path."""
    taps, depth = g.filter_rows * g.filter_cols, g.out_depth
    all_rows = g.batch * g.out_rows
    # rows of each slice whose input row is in the image, per filter row r
    row = np.arange(all_rows)
    h = (row % g.out_rows)[:, None] * g.stride_rows + np.arange(g.filter_rows)[None, :] * g.dilation_rows - g.pad_top
    inside = ((h >= 0) & (h < g.in_rows)).astype(np.int64)
    starts = np.arange(slices) * rows_per_slice
    valid = np.add.reduceat(inside, starts, axis=0)                      # [slice, r]
    length = np.diff(np.append(starts, all_rows))[:, None]               # rows in each slice
    s = np.arange(g.filter_cols)
    col_offset = s * g.dilation_cols - g.pad_left
    q_begin = np.where(col_offset < 0, (-col_offset + g.stride_cols - 1) // g.stride_cols, 0)
    last = g.in_cols - 1 - col_offset
    q_end = np.where(last < 0, 0, np.minimum(g.out_cols, last // g.stride_cols + 1))
    cols = np.maximum(q_end - q_begin, 0)                                # [s]
    tap_r, tap_s = np.divmod(np.arange(taps), g.filter_cols)
    keys = np.stack([valid[:, tap_r], (length - valid[:, tap_r]), np.broadcast_to(cols[tap_s], (slices, taps))],
                    axis=-1).reshape(-1, 3)                              # per (slice, tap)
    groups = -(-depth // 32)                                             # warps per (slice, tap)
    return Counter({key: n * groups for key, n in Counter(map(tuple, keys.tolist())).items()})


def filter_partial_l2_bytes(g, width: int, block: int) -> float:
    """L2 -> SM bytes of the depthwise filter gradient's first kernel: a block of ``block``
    threads holds t = block / 32 taps of one (slice, channel group of 32 k) (at most every tap;
    a block that straddles two groups is counted as whole t-tap runs), which share their
    out_backprop reads, and whose taps of one filter row share input rows (L1 catches that,
    nothing between blocks); the multiplier's threads of an input channel share its sectors."""
    taps = g.filter_rows * g.filter_cols
    positions = g.batch * g.out_rows * g.out_cols
    t = max(1, min(taps, block // 32))
    blocks = taps / t  # blocks per (slice, channel group) that read the same data
    filter_rows = min(g.filter_rows, math.ceil(t / g.filter_cols))
    return width * positions * blocks * (g.out_depth + g.in_depth * filter_rows)


def filter_partial_cost(model: PathModel, rows: int, skipped: int, cols: int) -> tuple[float, Counter]:
    """Cost of one partial sum: ``rows`` row iterations with ``cols`` steps each (two counted
    loads a step, the fewest >= that a row makes: the unrolled loop's remainder is predicated)
    and ``skipped`` row iterations whose input row lies outside the image (no loads).  Linear
    in the rows: the first row's path, plus per further row the second row's increment."""
    if rows == 0:
        zero, counts = model.cost(0, {1: (1, 0)})
        more, _ = model.cost(0, {1: (2, 0)})
        return zero + (skipped - 1) * (more - zero), counts
    work, trips = depthwise_filter_row_work(cols)
    one, counts = model.cost(work, trips, at_least=True)
    loads = min(k for k in model._table(trips, work + PREDICATED_SLACK) if k >= work)  # the row's actual count
    two, _ = model.cost(2 * loads, {1: (2, loads)})
    cost = one + (rows - 1) * (two - one)
    if skipped:
        zero, _ = model.cost(0, {1: (1, 0)})
        more, _ = model.cost(0, {1: (2, 0)})
        cost += skipped * (more - zero)
    return cost, counts


def filter_tiled_loops(cfg):
    """(passes, unit) loops of the tiled depthwise filter-gradient kernel: the unit loop is the
    innermost loop holding the unchecked sums (the sums are unrolled).  It sits in the loop of
    the slice's passes (pass 0 unchecked; pass 1, checked, only where a sum is not finite); the
    work items' final sum is the other top-level loop."""
    from . import static_tiled as st

    sums = st.through_blocks(cfg)[-1]
    passes = next(lp for lp in cfg.top_loops() if sums in lp.blocks)
    unit = passes
    while any(sums in child.blocks for child in unit.children):
        unit = next(child for child in unit.children if sums in child.blocks)
    return passes, unit


def filter_tiled_unit_cost(kernel, dtype, g, idle: bool = False) -> tuple[int, int, Counter]:
    """(instructions per unit, fixed instructions, counts per unit) of one thread of the tiled
    depthwise filter-gradient kernel, 16-byte staging: the cheapest path through one iteration
    of its unit loop that passes the barriers and the unchecked sums (the FMA-richest run of fall-through blocks)
    and makes the busiest thread's staging loads and every out_backprop load of a work item
    inside the output; ``idle``: instead a thread of a work item wholly past the output, which
    makes the staging loads and passes the barriers but loads no out_backprop value and skips
    the sums; fixed: the rest of a thread's work (every instruction outside the loops,
    an upper bound, and the cheapest iteration of the work items' final sum, ceil(K * K *
    CHANNELS / threads) times)."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    cfg = kernel.cfg
    through = st.through_blocks(cfg)
    passes, unit = filter_tiled_loops(cfg)
    epilogue = [lp for lp in cfg.top_loops() if lp is not passes]
    width, acc = np.dtype(dtype).itemsize, np.dtype(accumulator_dtype(dtype)).itemsize
    lane_bytes = dwf.lane_channels(dtype) * width  # a lane's out_backprop channels in one load
    rows, cols = dwf.item_shape(g)
    channels = dwf.tiled_channels(dtype)
    staged = math.prod(dwf.staged_shape(g, int(template_args(kernel.expression)[4])))
    vec = 16 // width
    chunks = staged * (channels // (vec * g.depth_multiplier))
    staging_loads = -(-chunks // dwf.TILED_THREADS)
    # The key: staging loads + dy_weight x out_backprop loads + sts_weight x 16-byte shared stores
    # (the staging loop may leave after any chunk: the path must store every chunk it loads).
    stores = vec * g.depth_multiplier * acc // 16  # 16-byte stores per chunk: VEC x M accumulators
    dy_weight, sts_weight = 32, 32 * 16

    def counted(ins):
        if _sass.is_global_load(ins, 16):
            return 1
        if _sass.is_global_load(ins, lane_bytes):
            return dy_weight
        return sts_weight if ins.base == "STS" and _sass.access_width(ins) == 16 else 0

    barriers = st.through_blocks(cfg, inner_loop=False)
    thr = frozenset(n for n in (barriers if idle else through) if n in unit.blocks)
    key = staging_loads + dy_weight * (0 if idle else rows * cols) + sts_weight * staging_loads * stores
    cycle, _ = cfg._tables(unit, counted, {1: (1, None)}, key, unit.depth, thr)
    if key not in cycle:
        raise _sass.PathError(f"{kernel.expression}: no unit path with {0 if idle else rows * cols} out_backprop loads, "
                              f"{staging_loads} staging loads and their {staging_loads * stores} 16-byte stores")
    per_unit, counts = cycle[key]
    epilogue_iterations = -(-g.filter_rows * g.filter_cols * channels // dwf.TILED_THREADS)
    fixed = 0
    for lp in epilogue:
        table = cfg.path_table(lp, kmax=0)
        fixed += epilogue_iterations * min(cost for cost, _ in table.values())
    # Every other instruction once (an upper bound: the passes' loop around the unit loop
    # counts its sums' probe and vote, and also the reset before a second pass, which runs only
    # where a sum is not finite).
    outside = set(cfg.blocks) - unit.blocks - set().union(*(lp.blocks for lp in epilogue))
    fixed += sum(len(cfg.instructions(n)) for n in outside if not cfg.cold(n))
    return per_unit, fixed, counts


def filter_tiled_unit_round_trips(kernel, dtype) -> int:
    """Dependent DRAM round trips of one unit of the tiled depthwise filter-gradient kernel on
    its vector path: 1 (the staging loads; the work item's out_backprop loads, issued before the
    barrier, overlap them) plus every wait on an out_backprop load before the unit's first
    barrier, where the warp stops until its loads return and only then stages.  Counted along
    every path from the unit loop's header to that barrier that avoids the blocks of the
    element-by-element form (loads narrower than a lane's vector), the most of any: the sm_90 SASS
    of the measured revision widened float16 / bfloat16 values next to their loads (at 3x3 stride
    1, 4 round trips a unit on its dearest path); float32 never waited there."""
    import importlib

    from ..backends.cuda import _sass

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    cfg = kernel.cfg
    _, unit = filter_tiled_loops(cfg)
    lane_bytes = dwf.lane_channels(dtype) * np.dtype(dtype).itemsize

    def barrier_at(n):
        return next((i for i, x in enumerate(cfg.instructions(n)) if x.base == "BAR"), None)

    def allowed(n):
        return n in unit.blocks and not cfg.cold(n) and not any(
            x.base == "LDG" and _sass.access_width(x) < lane_bytes for x in cfg.instructions(n))

    # Every path from the header to the first barrier through allowed blocks (the vector forms'
    # branches are few: the element form's blocks are left out); the most waits of any.
    most, stack, paths = None, [[unit.header]], 0
    while stack:
        path = stack.pop()
        stop = barrier_at(path[-1])
        if stop is not None:
            run = [x for n in path[:-1] for x in cfg.instructions(n)] + cfg.instructions(path[-1])[:stop]
            waits, _ = _sass.load_waits(run)
            most = waits if most is None else max(most, waits)
            paths += 1
            if paths > 4096:
                raise _sass.PathError(f"{kernel.expression}: too many paths to the unit's first barrier")
            continue
        stack += [path + [s] for s in cfg.blocks[path[-1]].succs if s not in path and allowed(s)]
    if most is None:
        raise _sass.PathError(f"{kernel.expression}: no vector path reaches the unit's first barrier")
    return 1 + most


def filter_reduce_cost(kernel, loads: int) -> tuple[int, Counter]:
    """(instructions, counts) of the busiest thread of the depthwise filter gradient's reduction
    (a thread of group 0): the fewest accumulator loads >= ``loads`` a path makes (a batch's
    loads are predicated), the barrier, and the groups' sum and its store."""
    from ..backends.cuda._sass import PathError

    cfg = kernel.cfg
    acc = 8 if template_args(kernel.expression)[1] == "double" else 4
    through = [n for n in cfg.blocks if any(x.base in ("BAR", "STG") for x in cfg.instructions(n))]
    table = cfg.function_table(counted_loads(acc), {}, kmax=loads + PREDICATED_SLACK, through=through)
    fewest = min((k for k in table if k >= loads), default=None)
    if fewest is None:
        raise PathError(f"{kernel.expression}: no path makes {loads} or more accumulator loads")
    return table[fewest]


def reduce_stages(device: Device, kernel, slices: int, filter_elements: int, width: int, acc: int,
                  first: dict, owners: tuple[int, int, int] | None = None) -> list[dict]:
    """The filter gradient's stages after ``first``: the reduction, or none where the launcher
    runs none (one slice: ``reduce_needed``; or a few, which the first kernel adds itself:
    ``fused_reduce`` of a specialised kernel's ``owners``, its ``ticket_owners``); then
    ``first`` writes the filter gradient, whose bytes its DRAM limit gains (they were the
    reduction's).  With a few slices the last CTA (warp) of each owner also reads the partial
    sums (L2) after the rest: its chain (the occupancy limit) gains the ticket's round trip and
    one per filter element a thread sums (a batch of loads each)."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    fused = owners is not None and dwf.reduce_needed(slices) and dwf.fused_reduce(slices, owners[1], owners[2])
    if dwf.reduce_needed(slices) and not fused:
        return [filter_reduce_stage(device, kernel, slices, filter_elements, width, acc)]
    first["bytes"] += width * filter_elements
    with_limit(first, device, first["bytes"], "DRAM", first["bytes"] / device.bandwidth)
    if fused:
        tail = 1 + -(-owners[1] // owners[2])
        first["l2_bytes"] += acc * slices * filter_elements
        first["one_launch_tail_round_trips"] = tail
        with_limit(first, device, first["bytes"], "L2", first["l2_bytes"] / device.l2_bandwidth)
        with_latency_limit(first, device, first["bytes"],
                           first["limits_ms"]["occupancy"] / 1e3 + tail * device.dram_latency_s)
    return []


def filter_reduce_stage(device: Device, kernel, slices: int, filter_elements: int, width: int, acc: int) -> dict:
    """The reduction's roofline: ``reduce_groups(slices)`` threads per filter element, each
    costing the busiest thread's path (an upper bound: only group 0 adds the groups; the path
    takes the groups' sum loop once), ceil(slices / groups) loads each; DRAM: the filter gradient written; L2: the partial sums read; latency: waves of
    resident CTAs x (a round trip per batch of REDUCE_LOADS loads, which a thread issues
    together, + 1 for the store)."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    groups = dwf.reduce_groups(slices)
    loads = -(-slices // groups)
    cost, counts = filter_reduce_cost(kernel, loads)
    per_element = groups * cost
    pipes = {k.removeprefix("class:"): v * groups for k, v in counts.items() if k.startswith("class:")}
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"],
                          dwf.REDUCE_ELEMENTS * groups)
    traffic, l2 = width * filter_elements, acc * slices * filter_elements + width * filter_elements
    limits = roofline(device, filter_elements, per_element, pipes, traffic, l2, occ["warps_per_sm"] * 32)
    round_trips = -(-loads // dwf.REDUCE_LOADS) + 1
    ctas = -(-filter_elements // dwf.REDUCE_ELEMENTS)
    with_latency_limit(limits, device, traffic, st.latency_limit_s(device, ctas, occ, round_trips))
    return {"stage": "reduce", "kernel": kernel.expression, "elements": filter_elements, "bytes": traffic,
            "l2_bytes": l2, "sass_per_element": per_element, "round_trips_per_element": round_trips,
            "resident_warps_per_sm": occ["warps_per_sm"], **limits}


def _predict_depthwise_filter_tiled(case: Case, dtype_name: str, device: Device, kernels: dict, g) -> dict:
    """Both kernels of the depthwise filter gradient when the tiled kernel makes the partial
    sums (16-byte staging).  Per element: per out_backprop element (position x channel)."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    dtype = DTYPES[dtype_name]
    width, acc = dtype.itemsize, np.dtype(accumulator_dtype(dtype)).itemsize
    arch = f"sm_{device.arch}"
    c = dwf.pick_items_across(g)
    kernel = kernels[(arch, dwf._tiled_expression(dtype, g.filter_rows, g.stride_rows, c))]
    reduce = kernels[(arch, dwf._reduce_expression(dtype))]
    slices, per_slice = dwf.tiled_slicing(g, dtype, c)
    down, across = dwf.tile_counts(g, c)
    units = g.batch * down * across
    blocks = -(-g.out_depth // dwf.tiled_channels(dtype))
    ctas = blocks * slices
    per_unit, fixed, counts = filter_tiled_unit_cost(kernel, dtype, g)
    # Warps whose two work items lie wholly past the output skip the sums (the kernel's pairing).
    columns = dwf.tiled_columns_per_warp(g, c)
    idle_warps = g.batch * dwf.tiled_idle_warps(g, c, columns)  # warp-units, over the whole output
    busy_warps = units * dwf.TILED_THREADS // 32 - idle_warps
    idle_unit, _, idle_counts = filter_tiled_unit_cost(kernel, dtype, g, idle=True) if idle_warps else (0, 0, Counter())
    elements = math.prod(g.out_backprop_shape)
    threads = ctas * dwf.TILED_THREADS
    thread_instructions = blocks * 32 * (busy_warps * per_unit + idle_warps * idle_unit) + threads * fixed
    per_element = thread_instructions / elements
    pipes = (Counter(st.classes_per_element(counts, blocks * 32 * busy_warps / elements))
             + Counter(st.classes_per_element(idle_counts, blocks * 32 * idle_warps / elements)))
    reads = width * (math.prod(g.input_shape) + math.prod(g.out_backprop_shape))
    taps = g.filter_rows * g.filter_cols
    partials = slices * taps * g.out_depth
    tile_rows, tile_cols = dwf.tile_shape(g, c)
    staged = math.prod(dwf.staged_shape(g, c))
    channels = dwf.tiled_channels(dtype)
    staged_channels = channels // g.depth_multiplier  # input channels a CTA loads per position
    l2 = blocks * units * width * (staged * staged_channels + tile_rows * tile_cols * channels) + acc * partials
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], dwf.TILED_THREADS)
    limits = roofline(device, elements, per_element, pipes, reads, l2, occ["warps_per_sm"] * 32)
    # A CTA's chain: its units' round trips (filter_tiled_unit_round_trips), and the partial
    # sums' stores.
    unit_trips = filter_tiled_unit_round_trips(kernel, dtype)
    round_trips = per_slice * unit_trips + 1
    with_latency_limit(limits, device, reads, st.latency_limit_s(device, ctas, occ, round_trips))
    first = {"stage": "tiled", "kernel": kernel.expression, "elements": elements, "bytes": reads, "l2_bytes": l2,
             "sass_per_element": per_element, "round_trips_per_element": round_trips,
             "resident_warps_per_sm": occ["warps_per_sm"], **limits,
             "tiled": {"ctas": ctas, "slices": slices, "units_per_slice": per_slice, "units": units,
                       "thread_instructions_per_unit": per_unit, "thread_fixed_instructions": fixed,
                       "round_trips_per_unit": unit_trips,
                       "columns_per_warp": columns, "idle_warp_units": idle_warps,
                       "idle_thread_instructions_per_unit": idle_unit,
                       "tile": [tile_rows, tile_cols], "tile_fill": g.out_rows * g.out_cols /
                       (down * across * tile_rows * tile_cols)}}
    second = reduce_stages(device, reduce, slices, taps * g.out_depth, width, acc, first,
                           dwf.ticket_owners("tiled", g, dtype))
    return _two_stage(case, dtype_name, device, g, elements, [first, *second])


def filter_planes_item_cost(kernel, dtype, g, four: bool, form: int = 0):
    """((instructions, counts) per interior work item, the same per border item, fixed
    instructions, (interior, border) load round trips per item) of one thread of the planes
    depthwise filter-gradient kernel.  An item's cost
    is the cheapest path through one iteration of an item loop with every window load and
    every out_backprop load of a whole item (one load a row where ``four``, else one per
    value; at least those, where the compiler predicated both forms into one block): in the interior loop (its window loads unconditional; the checked re-run repeats
    it) and in the border loop (predicated window loads, coordinates by division; where the
    checked border loop, run only where a slice's sums are not finite, predicates too, the
    cheaper).  Fixed: the cheapest path from the entry through both loops to the partial
    sums' store less one cheapest iteration of each (the loops' set-up, the finiteness test,
    the lanes' sum in lane order), the re-run left out.  Round trips: the most of
    :func:`_sass.load_round_trips` along any path through each loop (``CFG.loop_round_trips``;
    both out_backprop load forms where the compiler predicated them into one block: an upper
    bound)."""
    import importlib

    from ..backends.cuda import _sass

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    cfg = kernel.cfg
    width = np.dtype(dtype).itemsize
    rows, cols = dwf.planes_item_shape(g)
    window, window_width = dwf.planes_window_loads(g, dtype, form)
    row_bytes = cols * width  # an item row of out_backprop in one load
    dy_weight = 64  # above any count of element loads: the key says how many of each

    def counted(ins):
        if _sass.is_global_load(ins, row_bytes) or row_bytes > 16 and _sass.is_global_load(ins, 16):
            return dy_weight if four else 0  # the row loads count only for the form asked for
        return 1 if _sass.is_global_load(ins, window_width) or _sass.is_global_load(ins, width) else 0

    loads_per_row = -(-row_bytes // 16)  # 8-byte doubles: two 16-byte loads a row
    key = window + (dy_weight * rows * loads_per_row if four else rows * cols)
    # A path with at least the item's loads: where the compiler predicated both out_backprop
    # forms into one block, its one path has both (an upper bound).
    slack = dy_weight * rows * loads_per_row + rows * cols
    # The interior loops' window loads are unconditional; the border loop's are predicated.
    found = {False: [], True: []}
    for lp in cfg.top_loops():
        try:
            table = cfg.path_table(lp, counted, kmax=key + slack)
        except _sass.PathError:  # a loop of cold blocks only (a slow path), or no path that loads so much
            continue
        enough = [table[k] for k in table if k >= key]
        if enough:
            guarded = sum(1 for x in cfg.loop_instructions(lp) if x.predicate and _sass.is_global_load(x, window_width))
            found[guarded >= window // 2].append((min(enough, key=lambda cost: cost[0]), lp))
    if not found[False] or not found[True]:
        raise _sass.PathError(f"{kernel.expression}: no interior and border item loops with {window} window loads "
                              f"and a whole item's out_backprop loads")
    # The cheapest of each kind; of equal ones the first (the checked re-run repeats the loops later).
    (interior, inner), (border, outer) = (min(found[kind], key=lambda f: (f[0][0], cfg.blocks[f[1].header].start))
                                          for kind in (False, True))
    # Fixed: the cheapest path from the entry through both loops to the partial sums' store, less
    # one cheapest iteration of each loop (the re-run's set-up and the early exit left out).
    stores = [n for n in cfg.blocks if any(x.base == "STG" for x in cfg.instructions(n))]
    through = cfg.function_table(lambda ins: 0, {}, kmax=0, through=stores + [inner.header, outer.header])[0][0]
    fixed = through - sum(cfg.path_table(lp, kmax=0)[0][0] for lp in (inner, outer))
    trips = tuple(cfg.loop_round_trips(lp) for lp in (inner, outer))
    return interior, border, fixed, trips


def planes_iterations(g, slices: int) -> tuple[np.ndarray, np.ndarray]:
    """(interior, border) item-loop iterations of each slice's warp: ceil(the slice's run of
    interior items / 32), then ceil(its run of border items / 32)."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    interior, border, interior_per_slice, border_per_slice = dwf.planes_runs(g, slices)
    z = np.arange(slices, dtype=np.int64)
    inner = np.clip(np.minimum(interior - z * interior_per_slice, interior_per_slice), 0, None)
    outer = np.clip(np.minimum(border - z * border_per_slice, border_per_slice), 0, None)
    return -(-inner // 32), -(-outer // 32)


def _predict_depthwise_filter_planes(case: Case, dtype_name: str, device: Device, kernels: dict, g) -> dict:
    """Both kernels of the depthwise filter gradient when the planes kernel makes the partial
    sums (NCHW).  Per element: per out_backprop element (position x channel)."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    dtype = DTYPES[dtype_name]
    width, acc = dtype.itemsize, np.dtype(accumulator_dtype(dtype)).itemsize
    arch = f"sm_{device.arch}"
    form = dwf.planes_window_form(g, dtype)  # the benchmark's arrays are aligned
    kernel = kernels[(arch, dwf._planes_expression(dtype, g.filter_rows, g.stride_rows, form))]
    reduce = kernels[(arch, dwf._reduce_expression(dtype))]
    slices, per_slice = dwf.planes_slicing(g)
    down, across = dwf.planes_item_counts(g)
    items = g.batch * down * across
    four = dwf.planes_row_loads_possible(g)  # the benchmark's arrays are aligned
    ((per_interior, interior_counts), (per_border, border_counts), fixed,
     (trips_interior, trips_border)) = filter_planes_item_cost(kernel, dtype, g, four, form)
    row0, row1, col0, col1 = dwf.planes_interior_box(g)
    interior = g.batch * (row1 - row0) * (col1 - col0)
    # A warp issues its busiest lane's items: ceil(interior items of its slice / 32), then the border ones.
    inner_per_slice, outer_per_slice = planes_iterations(g, slices)
    inner, outer = int(inner_per_slice.sum()), int(outer_per_slice.sum())
    warps = g.out_depth * slices
    warp_instructions = g.out_depth * (inner * per_interior + outer * per_border) + warps * fixed
    elements = math.prod(g.out_backprop_shape)
    per_element = 32 * warp_instructions / elements
    pipes = Counter()
    for counts, iterations in ((interior_counts, inner), (border_counts, outer)):
        for k, v in counts.items():
            if k.startswith("class:"):
                pipes[k.removeprefix("class:")] += 32 * v * g.out_depth * iterations / elements
    reads = width * (math.prod(g.input_shape) + math.prod(g.out_backprop_shape))
    taps = g.filter_rows * g.filter_cols
    partials = slices * taps * g.out_depth
    rows, cols = dwf.planes_item_shape(g)
    # L2 -> SM: every warp reads its out_backprop once and its input plane with the halo of its
    # items' windows (rows ((rows - 1) S + K) / (rows S); columns of its run of items across),
    # once per multiplier (each output channel's warp reads its input channel).
    run = min(across, 32) * cols * g.stride_cols
    halo = ((rows - 1) * g.stride_rows + g.filter_rows) / (rows * g.stride_rows) * (run + g.filter_cols - g.stride_cols) / run
    l2 = width * (math.prod(g.out_backprop_shape) + halo * math.prod(g.input_shape) * g.depth_multiplier) + acc * partials
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], dwf.PLANES_THREADS)
    limits = roofline(device, elements, per_element, pipes, reads, l2, occ["warps_per_sm"] * 32)
    # The busiest warp's chain: each item's dependent load round trips, and the partial sums' store.
    round_trips = int((inner_per_slice * trips_interior + outer_per_slice * trips_border).max()) + 1
    ctas = -(-g.out_depth // dwf.PLANES_WARPS) * slices
    with_latency_limit(limits, device, reads, st.latency_limit_s(device, ctas, occ, round_trips))
    first = {"stage": "planes", "kernel": kernel.expression, "elements": elements, "bytes": reads, "l2_bytes": l2,
             "sass_per_element": per_element, "round_trips_per_element": round_trips,
             "resident_warps_per_sm": occ["warps_per_sm"], **limits,
             "tiled": {"ctas": ctas, "slices": slices, "items_per_slice": per_slice, "items": items,
                       "interior_items": interior, "thread_instructions_per_interior_item": per_interior,
                       "thread_instructions_per_border_item": per_border, "thread_fixed_instructions": fixed,
                       "round_trips_per_interior_item": trips_interior, "round_trips_per_border_item": trips_border,
                       "item": [rows, cols], "item_fill": g.out_rows * g.out_cols / (down * across * rows * cols),
                       "out_backprop_row_loads": "one" if four else "per value",
                       "window_loads": {dwf.PLANES_SINGLES: "per value", dwf.PLANES_PAIRS: "pairs",
                                        dwf.PLANES_PAIRS_FROM_COLUMN_BEFORE: "pairs from the column before"}[form]}}
    second = reduce_stages(device, reduce, slices, taps * g.out_depth, width, acc, first,
                           dwf.ticket_owners("planes", g, dtype))
    return _two_stage(case, dtype_name, device, g, elements, [first, *second])


def filter_mma_costs(kernel, dtype, g) -> dict:
    """One lane's costs in the tensor-core depthwise filter-gradient kernel for ``g``: ``single``,
    the cheapest path through one iteration of an image loop with exactly one image's HMMAs
    (k-steps x column blocks x K x M; the column-block loop run ``blocks`` times) and at least the
    busiest lane's staging loads (every predicated slot of its batches counts); where the
    kernel's pair loop runs (``pair``: 4-byte chunks or smaller, one staging batch an image),
    ``double``, the same through one iteration of that loop with two images, and ``single`` its
    iteration with one (a slice's odd last image); ``fixed``, the cheapest whole-kernel path with
    one image, less the cheapest one-image iteration, plus the zeroing loop's and the diagonal
    sums' further iterations (the finite path: the checked sums not taken)."""
    import importlib

    from ..backends.cuda import _sass
    from ..backends.cuda._sass import PathError
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    cfg = kernel.cfg
    k, m, vec = (int(a) for a in template_args(kernel.expression)[1:4])
    width = np.dtype(dtype).itemsize
    load_kind = f"LDG.{8 * vec * width}"
    k_steps, blocks = -(-g.out_rows // 16), -(-g.out_cols // 8)
    hmma = k_steps * blocks * k * m
    x_rows = dwf.mma_input_rows(g)
    x_per_row = -(-max(0, dwf.mma_input_cols(g)) // vec)

    def slots(rows, per_row, lane=0):  # the kernel's Region: lane 0 is a busiest lane
        if rows <= 0 or per_row <= 0:
            return 0
        step = 32 // per_row
        return -(-(rows - lane // per_row) // step)

    x_slots, y_slots = slots(x_rows, x_per_row), slots(g.out_rows, g.out_cols // vec)
    batches = -(-max(x_slots, y_slots) // dwf.MMA_STAGE_BATCH)
    pair = vec * width <= 4 and batches <= 1
    loads = max(batches, 1) * dwf.MMA_STAGE_BATCH * (1 + m)  # predicated slots count as issued
    stores = x_slots + m * y_slots  # the busiest lane's chunks stored to the stage
    store_kind = f"STS.{8 * vec * width}"
    # An image path: exactly its HMMAs and at least its staging loads and stores together (a
    # batch's loads are predicated, every slot counts; the stores and a pair's second image
    # branch).  One field for both keeps the path tables small.
    a = 2 * hmma + 1

    def counted(ins) -> int:
        kind = _sass.memory_kind(ins)
        return (1 if ins.base == "HMMA" else 0) + (a if kind in (load_kind, store_kind) else 0)

    def hmma_in(lp):
        return sum(x.base == "HMMA" for x in cfg.loop_instructions(lp))

    images = sorted((lp for lp in cfg.top_loops() if hmma_in(lp)), key=hmma_in)
    if len(images) != (2 if vec * width <= 4 else 1):
        raise PathError(f"{kernel.expression}: {len(images)} loops hold the HMMAs, expected the image loops")

    def cheapest(lp, images_):
        """Exactly the images' HMMAs and at least their staging loads and stores together."""
        memory = images_ * (loads + stores)
        table = cfg.path_table(lp, counted, {2: (blocks, None)}, kmax=images_ * hmma + a * (memory + 24))
        enough = [key for key in table if key % a == images_ * hmma and key // a >= memory]
        if not enough:
            raise PathError(f"{kernel.expression}: no path with {images_ * hmma} HMMAs and {memory} staging accesses")
        key = min(enough, key=lambda key: table[key][0])
        return key, table[key]

    loop = images[-1] if pair else images[0]
    key, (single, single_counts) = cheapest(loop, 1)
    double, double_counts = cheapest(loop, 2)[1] if pair else (2 * single, single_counts + single_counts)
    # Fixed: the cheapest whole-kernel path with one image's HMMAs and loads (the stores left
    # free: the diagonal sums' float stores may share the staging stores' width), less the
    # cheapest such iteration of either image loop, whichever the whole path may take.
    def loads_only(ins) -> int:
        return (1 if ins.base == "HMMA" else 0) + (a if _sass.memory_kind(ins) == load_kind else 0)

    one = hmma + a * loads
    iterations = [cfg.path_table(lp, loads_only, {2: (blocks, None)}, kmax=one).get(one) for lp in images]
    if not any(iterations):
        raise PathError(f"{kernel.expression}: no image iteration with {hmma} HMMAs and {loads} loads")
    image, image_counts = min((it for it in iterations if it), key=lambda cost: cost[0])
    whole_table = cfg.function_table(loads_only, {1: (1, None), 3: (blocks, None)}, kmax=one)
    if one not in whole_table:
        raise PathError(f"{kernel.expression}: no path through the kernel with one image")
    whole, whole_counts = whole_table[one]
    fixed, fixed_counts = whole - image, whole_counts - image_counts
    # Loops the one-image path ran once: the zeroing loop (16-byte stores) and the diagonal sums'.
    shared_bytes = ((dwf.MMA_TILE + k - 1) * (dwf.MMA_TILE + 8) + m * dwf.MMA_TILE * (dwf.MMA_TILE + 8)) * width
    for lp in cfg.top_loops():
        body = cfg.loop_instructions(lp)
        if any(_sass.memory_kind(x) == load_kind or x.base == "HMMA" for x in body):
            continue
        if any(_sass.memory_kind(x) == "STS.128" for x in body):  # zeroing: 16 bytes a lane a store
            stores = sum(_sass.memory_kind(x) == "STS.128" for x in body)
            extra = -(-shared_bytes // (16 * 32 * stores)) - 1
        elif any(x.base == "STG" for x in body) and not any(_sass.is_global_load(x) for x in body):
            extra = -(-m * k * k // 32) - 1  # the diagonal sums: lanes take M K K outputs
        else:
            continue
        try:
            per_iteration, per_counts = cfg.path_table(lp, kmax=0)[0]
        except PathError:  # cold blocks only (the checked sums)
            continue
        fixed += extra * per_iteration
        fixed_counts += Counter({c: v * extra for c, v in per_counts.items()})
    tensor = st.hmma_16816_equivalents(x for n in images[0].blocks for x in cfg.instructions(n)) / max(
        1, sum(x.base == "HMMA" for n in images[0].blocks for x in cfg.instructions(n))) * hmma
    return {"single": single, "single_counts": single_counts, "double": double, "double_counts": double_counts,
            "pair": pair, "fixed": fixed, "fixed_counts": fixed_counts, "hmma": hmma, "tensor": tensor,
            "loads": loads, "load_kind": load_kind, "batches": batches, "slots": (x_slots, y_slots)}


def filter_mma_warp_work(costs: dict, images: int) -> tuple[float, Counter, int]:
    """(instructions, counts, dependent round trips) of one warp's ``images`` in the tensor-core
    filter-gradient kernel: pairs and an odd last image where the pair loop runs (one round trip a
    pair), else one image and its staging batches at a time; plus its fixed path and the partial
    sums' store."""
    if costs["pair"]:
        pairs, odd = divmod(images, 2)
        work = pairs * costs["double"] + odd * costs["single"] + costs["fixed"]
        counts = Counter({c: pairs * v for c, v in costs["double_counts"].items()})
        counts += Counter({c: odd * v for c, v in costs["single_counts"].items()})
        trips = pairs + odd + 1
    else:
        work = images * costs["single"] + costs["fixed"]
        counts = Counter({c: images * v for c, v in costs["single_counts"].items()})
        trips = images * max(1, costs["batches"]) + 1
    return work, counts + costs["fixed_counts"], trips


def _predict_depthwise_filter_mma(case: Case, dtype_name: str, device: Device, kernels: dict, g) -> dict:
    """Both kernels of the depthwise filter gradient when the tensor-core kernel makes the
    partial sums (NCHW half types, planes up to 32 x 32).  Per element: per out_backprop element."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    dtype = DTYPES[dtype_name]
    width, acc = dtype.itemsize, 4
    arch = f"sm_{device.arch}"
    vec = dwf.mma_chunk(g, dtype)  # the benchmark's arrays are aligned
    kernel = kernels[(arch, dwf._mma_expression(dtype, g.filter_rows, g.depth_multiplier, vec))]
    reduce = kernels[(arch, dwf._reduce_expression(dtype))]
    slices, per_slice = dwf.mma_slicing(g)
    costs = filter_mma_costs(kernel, dtype, g)
    # Every slice's warps (one per channel) take per_slice images, the last slice the rest.
    last = g.batch - (slices - 1) * per_slice
    full_work, full_counts, trips = filter_mma_warp_work(costs, per_slice)
    last_work, last_counts, _ = filter_mma_warp_work(costs, last)
    elements = math.prod(g.out_backprop_shape)
    scale = 32 * g.in_depth / elements
    per_element = scale * ((slices - 1) * full_work + last_work)
    pipes = (Counter(st.classes_per_element(full_counts, scale * (slices - 1)))
             + Counter(st.classes_per_element(last_counts, scale)))
    pipes["tensor"] = 32 * costs["tensor"] * g.batch * g.in_depth / elements
    reads = width * (math.prod(g.input_shape) + math.prod(g.out_backprop_shape))
    taps = g.filter_rows * g.filter_cols
    partials = slices * taps * g.out_depth
    # L2 -> SM: each image's staged input region (whole chunks of the rows read) and its M
    # out_backprop planes, and the partial sums written.
    x_rows = max(0, dwf.mma_input_rows(g))
    x_cols = -(-max(0, dwf.mma_input_cols(g)) // vec) * vec
    l2 = width * g.batch * g.in_depth * (x_rows * x_cols + g.depth_multiplier * g.out_rows * g.out_cols) + acc * partials
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], dwf.MMA_THREADS)
    limits = roofline(st.with_tensor_pipe(device), elements, per_element, pipes, reads, l2,
                      occ["warps_per_sm"] * 32)
    # A warp's chain: one round trip per staging batch of each of its images (per pair of images
    # where the pair loop runs), and the partial sums' store.
    round_trips = trips
    ctas = g.in_depth * -(-slices // dwf.MMA_WARPS)
    with_latency_limit(limits, device, reads, st.latency_limit_s(device, ctas, occ, round_trips))
    first = {"stage": "mma", "kernel": kernel.expression, "elements": elements, "bytes": reads, "l2_bytes": l2,
             "sass_per_element": per_element, "round_trips_per_element": round_trips,
             "resident_warps_per_sm": occ["warps_per_sm"], **limits,
             "tiled": {"ctas": ctas, "slices": slices, "images_per_slice": per_slice, "chunk": vec,
                       "thread_instructions_per_image": costs["single"],
                       "thread_instructions_per_pair": costs["double"] if costs["pair"] else None,
                       "thread_fixed_instructions": costs["fixed"],
                       "hmma_per_image": costs["hmma"], "staging_loads_per_image": costs["loads"],
                       "staging_slots": list(costs["slots"]),
                       "plane_fill": dwf.mma_fill(g)}}
    second = reduce_stages(device, reduce, slices, taps * g.out_depth, width, acc, first,
                           dwf.ticket_owners("mma", g, dtype) if dwf.mma_adds_few_slices(g, vec, device.arch)
                           else None)
    return _two_stage(case, dtype_name, device, g, elements, [first, *second])


def filter_mma_nhwc_slots(g) -> tuple[int, int]:
    """(input, out_backprop) slots a thread loads per unit in the NHWC tensor-core kernel
    (``dwfnhwc::Stage``: X_SLOTS, Y_SLOTS): pairs of neighbouring positions x 16-byte chunks
    of a position (16 / M channels of input, 16 of out_backprop, 8 a chunk) over its threads."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    side = dwf.MMA_NHWC_TILE + g.filter_rows - 1
    x_chunks = dwf.mma_nhwc_channels(g) // 8
    y_chunks = x_chunks * g.depth_multiplier
    return (-(-x_chunks * side * side // 2 // dwf.MMA_NHWC_THREADS),
            -(-y_chunks * dwf.MMA_NHWC_TILE ** 2 // 2 // dwf.MMA_NHWC_THREADS))


def filter_mma_nhwc_costs(kernel, dtype, g) -> dict:
    """One thread's costs in the NHWC tensor-core depthwise filter-gradient kernel for ``g``:
    ``unit``, the cheapest path through one iteration of its unit loop with exactly one unit's
    HMMAs (2 column blocks x K x a warp's two out_backprop planes, the block loop unrolled) and at least the busiest
    thread's next-unit loads (two 16-byte loads a pair slot, every predicated one counted) and
    4-byte stores to the planes (8 a pair slot); ``fixed``, the cheapest whole-kernel path with
    one unit (its loads before the loop) and the diagonal sums' 2 x K stores (a warp's two planes
    x tap rows), less the cheapest
    unit iteration without loads, plus the zeroing loop's further iterations (the finite path:
    the checked sums not taken).  The packed form's path is the same but for where a position
    lies (the images' blocks)."""
    import importlib

    from ..backends.cuda import _sass
    from ..backends.cuda._sass import PathError
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    cfg = kernel.cfg
    k, m = (int(a) for a in template_args(kernel.expression)[1:3])
    hmma = dwf.MMA_NHWC_TILE // 8 * k * 2  # a warp's two planes: multiplier 2, or two channels
    x_slots, y_slots = filter_mma_nhwc_slots(g)
    loads, stores = 2 * (x_slots + y_slots), 8 * (x_slots + y_slots)
    a = hmma + 1

    def hmma_in(lp):
        return sum(x.base == "HMMA" for x in cfg.loop_instructions(lp))

    units = [lp for lp in cfg.top_loops() if hmma_in(lp)]
    if len(units) != 1 or hmma_in(units[0]) != hmma:
        raise PathError(f"{kernel.expression}: expected one unit loop holding {hmma} HMMAs")
    unit = units[0]

    def counted(ins) -> int:
        kind = _sass.memory_kind(ins)
        return (1 if ins.base == "HMMA" else 0) + (a if kind in ("LDG.128", "STS.32") else 0)

    memory = loads + stores
    table = cfg.path_table(unit, counted, kmax=hmma + a * (memory + 8))
    enough = [key for key in table if key % a == hmma and key // a >= memory]
    if not enough:
        raise PathError(f"{kernel.expression}: no unit path with {hmma} HMMAs, {loads} loads and {stores} stores")
    per_unit, unit_counts = table[min(enough, key=lambda key: table[key][0])]

    # Fixed: the whole kernel with one unit, its loads before the loop and the diagonal sums'
    # stores (the finite path), less one unit iteration without loads or stores to the planes
    # beyond the unit's own.
    def whole_counted(ins) -> int:
        kind = _sass.memory_kind(ins)
        return (1 if ins.base == "HMMA" else 0) + (a if kind == "LDG.128" else 0) + (
            a * (loads + 1) if kind == "STG.32" else 0)

    one = hmma + a * loads + a * (loads + 1) * 2 * k  # the diagonal sums: a store per plane and tap row
    whole_table = cfg.function_table(whole_counted, {1: (1, None)}, kmax=one)
    if one not in whole_table:
        raise PathError(f"{kernel.expression}: no path through the kernel with one unit and {2 * k} partial stores")
    whole, whole_counts = whole_table[one]

    def loads_only(ins) -> int:
        return (1 if ins.base == "HMMA" else 0) + (a if _sass.memory_kind(ins) == "LDG.128" else 0)

    bare = cfg.path_table(unit, loads_only, kmax=hmma).get(hmma)
    if bare is None:
        raise PathError(f"{kernel.expression}: no unit iteration without loads")
    fixed, fixed_counts = whole - bare[0], whole_counts - bare[1]
    shared_bytes = kernel.ptxas["shared_bytes"]
    for lp in cfg.top_loops():
        body = cfg.loop_instructions(lp)
        if any(_sass.memory_kind(x) == "STS.128" for x in body) and not any(x.base == "HMMA" for x in body):
            extra = -(-shared_bytes // (16 * dwf.MMA_NHWC_THREADS)) - 1  # the zeroing loop
            per_iteration, per_counts = cfg.path_table(lp, kmax=0)[0]
            fixed += extra * per_iteration
            fixed_counts += Counter({c: v * extra for c, v in per_counts.items()})
    tensor = st.hmma_16816_equivalents(cfg.loop_instructions(unit))
    return {"unit": per_unit, "unit_counts": unit_counts, "fixed": fixed, "fixed_counts": fixed_counts,
            "hmma": hmma, "tensor": tensor, "loads": loads, "stores": stores, "slots": (x_slots, y_slots)}


def filter_mma_nhwc_positions(g) -> tuple[int, int]:
    """(input positions, out_backprop positions) a CTA of the NHWC tensor-core kernel loads over
    the whole batch: its staged squares' positions inside an image (per block of the packed
    form) and its tiles' inside the output."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    tile = dwf.MMA_NHWC_TILE
    side = tile + g.filter_rows - 1

    def inside(starts, length, size):
        return sum(max(0, min(size, s + length) - max(0, s)) for s in starts)

    if dwf.mma_nhwc_packed(g):  # block 0 of a unit: staged rows [0, S); block 1: [S, side)
        stride = dwf.mma_nhwc_pack_stride(g)
        rows = [inside([-g.pad_top], stride, g.in_rows), inside([-g.pad_top], side - stride, g.in_rows)]
        cols = [inside([-g.pad_left], stride, g.in_cols), inside([-g.pad_left], side - stride, g.in_cols)]
        x = sum(rows[n % 4 // 2] * cols[n % 2] for n in range(g.batch))
        return x, g.batch * g.out_rows * g.out_cols
    down, across = dwf.mma_nhwc_tiles(g)
    x = (inside([t * tile - g.pad_top for t in range(down)], side, g.in_rows)
         * inside([t * tile - g.pad_left for t in range(across)], side, g.in_cols))
    return g.batch * x, g.batch * g.out_rows * g.out_cols


def _predict_depthwise_filter_mma_nhwc(case: Case, dtype_name: str, device: Device, kernels: dict, g) -> dict:
    """Both kernels of the depthwise filter gradient when the NHWC tensor-core kernel makes the
    partial sums.  Per element: per out_backprop element."""
    import importlib

    from ..backends.cuda import _sass
    from . import static_tiled as st

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    dtype = DTYPES[dtype_name]
    width, acc = dtype.itemsize, 4
    arch = f"sm_{device.arch}"
    tile = dwf.MMA_NHWC_TILE
    packed = dwf.mma_nhwc_packed(g)
    kernel = kernels[(arch, dwf._mma_nhwc_expression(dtype, g.filter_rows, g.depth_multiplier, packed))]
    reduce = kernels[(arch, dwf._reduce_expression(dtype))]
    slices, per_slice = dwf.mma_nhwc_slicing(g)
    units = dwf.mma_nhwc_units(g)
    groups = g.in_depth // dwf.mma_nhwc_channels(g)
    ctas = groups * slices
    costs = filter_mma_nhwc_costs(kernel, dtype, g)
    elements = math.prod(g.out_backprop_shape)
    threads = dwf.MMA_NHWC_THREADS
    per_element = (groups * threads * units * costs["unit"] + ctas * threads * costs["fixed"]) / elements
    pipes = (Counter(st.classes_per_element(costs["unit_counts"], groups * threads * units / elements))
             + Counter(st.classes_per_element(costs["fixed_counts"], ctas * threads / elements)))
    pipes["tensor"] = 32 * costs["tensor"] * units * g.in_depth / elements
    reads = width * (math.prod(g.input_shape) + math.prod(g.out_backprop_shape))
    taps = g.filter_rows * g.filter_cols
    partials = slices * taps * g.out_depth
    # L2 -> SM in 32-byte sectors: a CTA's out_backprop values of a position are one sector, its
    # input values one (multiplier 1) or half of one (multiplier 2: a 16-byte load fetches the
    # sector); and the partial sums written.
    x_positions, y_positions = filter_mma_nhwc_positions(g)
    l2 = groups * 32 * (x_positions + y_positions) + acc * partials
    occ = _sass.occupancy(device.arch, kernel.ptxas["registers"], kernel.ptxas["shared_bytes"], threads)
    limits = roofline(st.with_tensor_pipe(device), elements, per_element, pipes, reads, l2,
                      occ["warps_per_sm"] * 32)
    # A CTA's chain: the first unit's loads, then one round trip a unit (each unit's loads are
    # issued before the previous unit's products; counted as not overlapping at all, the upper
    # bound), and the partial sums' stores.
    round_trips = per_slice + 1
    with_latency_limit(limits, device, reads, st.latency_limit_s(device, ctas, occ, round_trips))
    first = {"stage": "mma_nhwc", "kernel": kernel.expression, "elements": elements, "bytes": reads, "l2_bytes": l2,
             "sass_per_element": per_element, "round_trips_per_element": round_trips,
             "resident_warps_per_sm": occ["warps_per_sm"], **limits,
             "tiled": {"ctas": ctas, "slices": slices, "units_per_slice": per_slice, "units": units,
                       "tile": [tile, tile], "thread_instructions_per_unit": costs["unit"],
                       "thread_fixed_instructions": costs["fixed"], "hmma_per_unit": costs["hmma"],
                       "staging_loads_per_unit": costs["loads"], "staging_slots": list(costs["slots"]),
                       "packed": packed, "pack_stride": dwf.mma_nhwc_pack_stride(g) if packed else None,
                       "tile_fill": g.batch * g.out_rows * g.out_cols / (units * tile * tile)}}
    second = reduce_stages(device, reduce, slices, taps * g.out_depth, width, acc, first,
                           dwf.ticket_owners("mma_nhwc", g, dtype))
    return _two_stage(case, dtype_name, device, g, elements, [first, *second])


def _predict_depthwise_filter(case: Case, dtype_name: str, device: Device, kernels: dict, g,
                              path: str | None = None) -> dict:
    """Both kernels of the depthwise filter gradient (partial sums, then their fixed-order sum).
    Per element: per partial sum (one thread of the first kernel); the tiled kernel where the
    launcher runs it (:func:`_predict_depthwise_filter_tiled`: per out_backprop element).
    ``path``: the first kernel (:func:`filter_paths`; None: the launcher's)."""
    import importlib

    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    dtype = DTYPES[dtype_name]
    if path is None:
        path = filter_launcher_path(g, dtype, device.arch)  # the benchmark's arrays are aligned
    first = {"mma": _predict_depthwise_filter_mma, "mma_nhwc": _predict_depthwise_filter_mma_nhwc,
             "tiled": _predict_depthwise_filter_tiled, "planes": _predict_depthwise_filter_planes}
    if path in first:
        return first[path](case, dtype_name, device, kernels, g)
    width, acc = dtype.itemsize, np.dtype(accumulator_dtype(dtype)).itemsize
    arch = f"sm_{device.arch}"
    slices, rows_per_slice = dwf.slicing(g)
    taps = g.filter_rows * g.filter_cols
    partials = slices * taps * g.out_depth
    from ..backends.cuda import _runtime

    # The launcher's grid: at most BLOCKS_PER_SM blocks per SM of this device.
    work = dwf.partial_threads(g, slices)  # partial sums, the last channel group padded to 32 lanes
    threads = min(-(-work // _runtime.BLOCK_1D), device.sms * _runtime.BLOCKS_PER_SM) * _runtime.BLOCK_1D
    bits = 32 if dwf.fits_int32(g, slices, threads) else 64
    partial = kernels[(arch, dwf._partial_expression(dtype, g.data_format, bits))]
    reduce = kernels[(arch, dwf._reduce_expression(dtype))]

    model = PathModel(partial, width)
    groups = filter_partial_groups(g, slices, rows_per_slice)
    total = sum(groups.values())
    mean, pipes = 0.0, Counter()
    batch = max(1, loads_per_batch(partial, width) // 2)  # (row, column) steps whose loads issue together
    trips = 0.0
    for (rows, skipped, cols), n in groups.items():
        cost, counts = filter_partial_cost(model, rows, skipped, cols)
        mean += cost * n / total
        trips += n / total * (rows * (math.ceil(cols / batch) + 1) + skipped)
        for cls, v in counts.items():
            if cls.startswith("class:"):
                pipes[cls.removeprefix("class:")] += v * n / total
    reads = width * (math.prod(g.input_shape) + math.prod(g.out_backprop_shape))
    first = _stage("partial", device, partial, work, mean, pipes, reads,
                   filter_partial_l2_bytes(g, width, _runtime.BLOCK_1D) + acc * partials, trips)

    second = reduce_stages(device, reduce, slices, taps * g.out_depth, width, acc, first)
    return _two_stage(case, dtype_name, device, g, partials, [first, *second])


def pixel_warps(row_sizes, col_sizes, batch: int, threads_per_pixel: float) -> Counter:
    """``{(row size, col size): warps}`` over an image of len(row_sizes) x len(col_sizes) pixels
    whose pixel (y, x) has sizes (row_sizes[y], col_sizes[x]) (cell extents, or the cells a
    pixel lies in), ``threads_per_pixel`` consecutive threads each: a warp of 32 threads spans
    32 / threads_per_pixel consecutive pixels in row-major order where that is more than one,
    and pays the union of their paths (the larger of each size); warps that would straddle two
    images are counted as if each image's pixels filled whole warps."""
    rows, cols = np.asarray(row_sizes, np.int64), np.asarray(col_sizes, np.int64)
    if threads_per_pixel >= 32:
        per_pixel = batch * threads_per_pixel / 32
        r, c = Counter(rows.tolist()), Counter(cols.tolist())
        return Counter({(int(h), int(w)): nh * nw * per_pixel for h, nh in r.items() for w, nw in c.items()})
    k = int(32 // threads_per_pixel)
    r = np.repeat(rows, cols.size)
    c = np.tile(cols, rows.size)
    pad = -r.size % k
    r, c = np.pad(r, (0, pad), mode="edge").reshape(-1, k), np.pad(c, (0, pad), mode="edge").reshape(-1, k)
    keys = np.stack([r.max(axis=1), c.max(axis=1)], axis=1)
    return Counter({(int(h), int(w)): n * batch for (h, w), n in Counter(map(tuple, keys.tolist())).items()})


def fractional_select_runs(g, run: int) -> list[tuple]:
    """The runs of the select kernel over one image's output rows (``run`` cells each, the last
    one shorter): per run ((rows, held), ...) per cell, held = 1 where the cell's first row is
    the previous cell's last (read once, where the cell is at most
    :data:`SELECT_CARRY_COLS` wide)."""
    starts, ends, rows = g.row_starts, g.row_ends, g.row_cell_sizes
    return [tuple((rows[r], int(r > r0 and starts[r] == ends[r - 1])) for r in range(r0, min(r0 + run, g.out_rows)))
            for r0 in range(0, g.out_rows, run)]


def fractional_select_groups(g, channels: int, run: int) -> Counter:
    """``{(run's cells, columns): warps}`` of the select kernel: a thread takes ``channels``
    channels of one output column's run (:func:`fractional_select_runs`), depth / channels
    consecutive threads per (run, column) in (run, column) order.  A warp spanning several
    (run, column) pairs pays the widest column and the run with the most rows read (one
    image's pairs fill whole warps, as :func:`pixel_warps` counts)."""
    runs, cols = fractional_select_runs(g, run), list(g.col_cell_sizes)
    threads = g.depth / channels
    if threads >= 32:
        per_pair = g.batch * threads / 32
        return Counter({(cells, int(w)): per_pair * runs.count(cells) * cols.count(w)
                        for cells in set(runs) for w in set(cols)})
    k = int(32 // threads)
    pairs = [(cells, w) for cells in runs for w in cols]
    pairs += [pairs[-1]] * (-len(pairs) % k)
    read = lambda cells: sum(rows - held for rows, held in cells)
    out = Counter()
    for i in range(0, len(pairs), k):
        group = pairs[i:i + k]
        out[(max((c for c, _ in group), key=read), max(w for _, w in group))] += g.batch
    return out


def fractional_select_packs(g, run: int) -> int:
    """Packs of orig_input the select kernel reads per channel pack over one image: per (run,
    column), the rows of its cells that are not held, times the column's width (a cell wider
    than :data:`SELECT_CARRY_COLS` reads every row)."""
    runs = fractional_select_runs(g, run)
    all_rows = sum(rows for cells in runs for rows, _ in cells)
    read = sum(rows - held for cells in runs for rows, held in cells)
    return sum(w * (read if w <= SELECT_CARRY_COLS else all_rows) for w in g.col_cell_sizes)


def fractional_max_groups(g, channels: int = 1) -> Counter:
    """``{(row cells, col cells): warps}`` of the gather kernel, a thread taking ``channels``
    channels of one pixel (:func:`pixel_warps`: depth / channels threads per pixel)."""
    threads = g.depth / channels
    row_offsets, col_offsets = g.cells_by_index("rows")[0], g.cells_by_index("cols")[0]
    return pixel_warps(np.diff(row_offsets), np.diff(col_offsets), g.batch, threads)


def _predict_fractional_max(case: Case, dtype_name: str, device: Device, kernels: dict, g,
                            path: str | None = None) -> dict:
    """Both kernels of the max pooling gradient (select, then gather; the flag read back between
    them is host time, left out), or where the launcher (or ``path``) takes it the cells kernel
    (:func:`.static_cells.predict_max`).  Per element: per input element (the gradient's)."""
    import importlib

    fm = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    dtype = DTYPES[dtype_name]
    if fm.pick_path(g, dtype, path) == "cells":
        from . import static_cells

        expression, _ = static_cells.max_cells_launch(g, dtype)
        return static_cells.predict_max(case, dtype_name, device, kernels[(f"sm_{device.arch}", expression)], g)
    width = dtype.itemsize
    index = fm.index_type(g)
    iw = fm.INDEX_TYPES[index].itemsize
    arch = f"sm_{device.arch}"
    v = fm.channels_per_thread(g, dtype)  # aligned arrays assumed
    local = fm.local_places(g)
    cw = 1 if local else iw  # bytes per chosen element
    select = kernels[(arch, fm._expression(fm.KERNELS[0], dtype, index, v, local))]
    gather = kernels[(arch, fm._expression(fm.KERNELS[1], dtype, index, v, local))]
    inputs, outputs = math.prod(g.input_shape), math.prod(g.output_shape)
    by_index = fractional_max_groups(g, v)
    element_width, element_loads = fm.pack_accesses(v, width)
    index_width, index_loads = fm.pack_accesses(v, cw)
    run = fm.select_run(g)
    runs = fractional_select_groups(g, v, run)
    smodel = SelectModel(select, element_width, element_loads, v)
    scost, spipes = _weighted_mean((warps, smodel.run(cells, cols)) for (cells, cols), warps in runs.items())
    threads = fm.select_threads(g, v, run)
    packs = g.batch * (g.depth // v) * fractional_select_packs(g, run)  # orig_input packs read, all threads
    bounds = iw * 2 * (g.out_rows + g.out_cols)
    # One round trip per cell, as for one cell per thread: the run's cells follow each other.
    first = _stage("select", device, select, threads, scost, spipes,
                   width * (inputs + outputs) + cw * outputs + bounds,
                   width * (packs * v + outputs) + cw * outputs, round_trips=outputs / v / threads)

    gmodel = PathModel(gather, tuple(sorted({iw, index_width, gather_entry_bytes(iw)} |
                                            ({element_width} if v > 1 else set()))))
    gwork = {k: (n, fractional_gather_work(*k, index_loads, element_loads if v > 1 else 0))
             for k, n in by_index.items()}
    gcost, gpipes = _mean_path(gmodel, gwork)
    mean_cells = sum(r * c * n for (r, c), n in by_index.items()) / sum(by_index.values())
    tables = iw * (g.in_rows + g.in_cols + 2 + 4 * g.cell_table_entries)  # offsets, entries of 4 values
    second = _stage("gather", device, gather, inputs // v, gcost, gpipes,
                    width * (outputs + inputs) + cw * outputs + tables,
                    cw * inputs * mean_cells + width * (outputs + inputs))
    return _two_stage(case, dtype_name, device, g, inputs, [first, second])


def roofline(device: Device, elements: int, sass_per_element: float, classes_per_element: dict, traffic: float,
             l2_bytes: float, resident_threads_per_sm: int) -> dict:
    """The four limits (seconds) and the prediction for ``elements`` output elements, each
    costing ``sass_per_element`` instructions (``classes_per_element``: per pipe class) with
    ``traffic`` DRAM bytes and ``l2_bytes`` L2 bytes in all."""
    warp_instructions = sass_per_element * elements / 32
    t_sched = warp_instructions / device.issue_rate
    pipe_times = {p: classes_per_element.get(p, 0) * elements / 32 / (device.sms * lanes / 32 * device.clock_hz)
                  for p, lanes in device.pipes}
    busiest = max(pipe_times, key=pipe_times.get)
    limits = {
        "DRAM": traffic / device.bandwidth,
        "L2": l2_bytes / device.l2_bandwidth,
        "issue": max(t_sched, pipe_times[busiest]),
        "occupancy": (elements / (device.sms * resident_threads_per_sm) * device.dram_latency_s
                      if resident_threads_per_sm else math.inf),
    }
    limiter = max(limits, key=limits.get)
    seconds = limits[limiter]
    return {"warp_instructions": warp_instructions,
            "issue_detail": {"scheduler_s": t_sched, "busiest_pipe": busiest, "busiest_pipe_s": pipe_times[busiest]},
            "limits_ms": {k: v * 1e3 for k, v in limits.items()}, "limiter": limiter, "predicted_ms": seconds * 1e3,
            "pct_hbm": 100 * traffic / seconds / device.bandwidth,
            "budget_per_element_75pct_hbm": instruction_budget(device, traffic, elements)}


def with_latency_limit(limits: dict, device: Device, traffic: float, seconds: float) -> dict:
    """Replaces a :func:`roofline` result's occupancy limit by ``seconds`` (a latency chain the
    caller models) and re-picks the limiter and prediction."""
    return with_limit(limits, device, traffic, "occupancy", seconds)


def with_limit(limits: dict, device: Device, traffic: float, name: str, seconds: float) -> dict:
    """Replaces a :func:`roofline` result's limit ``name`` by ``seconds`` and re-picks the
    limiter and prediction (% of HBM for ``traffic`` bytes)."""
    limits["limits_ms"][name] = seconds * 1e3
    limiter = max(limits["limits_ms"], key=limits["limits_ms"].get)
    limits.update(limiter=limiter, predicted_ms=limits["limits_ms"][limiter],
                  pct_hbm=100 * traffic / (limits["limits_ms"][limiter] / 1e3) / device.bandwidth)
    return limits


def instruction_budget(device: Device, traffic: float, elements: int, fraction: float = BUDGET_FRACTION) -> float:
    """SASS instructions per output element at which the scheduler limit equals the time to
    move ``traffic`` bytes at ``fraction`` of HBM bandwidth."""
    return 32 * device.issue_rate * (traffic / (fraction * device.bandwidth)) / elements


# --------------------------------------------------------------------------- the report


def _git(*args) -> str:
    import subprocess

    root = Path(__file__).resolve().parents[2]
    try:
        return subprocess.check_output(["git", *args], cwd=root, text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def build(archs=("sm_90", "sm_80"), conv: bool = True, suites=SUITES, dtypes=REPORT_DTYPES,
          devices=DEVICES, progress=None) -> dict:
    """Compile, analyse and predict: the report as a JSON-ready dict."""
    from ..backends.cuda import _sass

    say = progress or (lambda text: None)
    ops = {case.op for name in suites for case in suite(name)}
    sources = ([DEPTHWISE_SOURCE] if DEPTHWISE_INPUT in ops else []) + [FRACTIONAL_SOURCE]
    sources += [source for op, source in ((DEPTHWISE_FILTER, DEPTHWISE_FILTER_SOURCE),
                                          (FRACTIONAL_MAX, FRACTIONAL_MAX_SOURCE)) if op in ops]
    sources += list(CONV_SOURCES) if conv else []
    kernels = {}
    for source in sources:
        for arch in archs:
            say(f"compiling and disassembling {source} for {arch}")
            for k in _sass.compile_kernels((arch,), [source]):
                kernels[(k.arch, k.expression)] = k
    records = []
    for (arch, expression), k in kernels.items():
        record = kernel_record(k)
        record["steady_state"] = reference_paths(k)
        records.append(record)
    predictions = []
    for device in devices:
        if f"sm_{device.arch}" not in archs:
            continue
        for name in suites:
            for case in suite(name):
                for dtype in case.dtypes:
                    if dtype in dtypes:
                        say(f"predicting {device.key}: {case.label} {dtype}")
                        predictions.append(predict(case, dtype, device, kernels))
    report = {"meta": {"devices": [asdict(d) for d in devices if f"sm_{d.arch}" in archs]},
              "predictions": predictions}
    latency_model.annotate(report)
    commit = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    meta = {
        "label": LABEL, "commit": commit + ("-dirty" if dirty and dirty != "unknown" else ""),
        "date": time.strftime("%Y-%m-%d"), "archs": list(archs),
        "tools": {"nvrtc": _sass.nvrtc_version(), "nvdisasm": _sass.tool_version("nvdisasm"),
                  "cuobjdump": _sass.tool_version("cuobjdump"), "python": platform.python_version()},
        "devices": [asdict(d) for d in devices if f"sm_{d.arch}" in archs],
        "assumptions": ASSUMPTIONS, "budget_fraction": BUDGET_FRACTION,
        "latency_model": report["meta"]["latency_model"],
    }
    return {"meta": meta, "kernels": records, "predictions": predictions}


def _fmt_memory(memory: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in memory.items()) or "-"


def markdown(report: dict) -> str:
    meta = report["meta"]
    tools = meta["tools"]
    lines = [f"# gradops static performance report: {LABEL.upper()}", "",
             f"**{LABEL}.** Commit {meta['commit']}, {meta['date']}; NVRTC {tools['nvrtc']}, nvdisasm "
             f"{tools['nvdisasm']}, cuobjdump {tools['cuobjdump']}; archs {', '.join(meta['archs'])}. "
             "Regenerate with `python -m gradops static-report --out benchmarks/results`.", "",
             "## Assumptions", ""]
    lines += [f"- {a}" for a in meta["assumptions"]]
    lines += ["", "Devices:", "", "| device | arch | SMs | clock | HBM | L2 (assumed) | DRAM latency (assumed) | "
              "issue efficiency | warp-instr/s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for d in meta["devices"]:
        rate = d["sms"] * 4 * d["clock_hz"] * d["issue_efficiency"]
        lines.append(f"| {d['key']} | sm_{d['arch']} | {d['sms']} | {d['clock_hz'] / 1e9:.3f} GHz | "
                     f"{d['bandwidth'] / 1e12:.3g} TB/s | {d['l2_bandwidth'] / 1e12:.3g} TB/s | "
                     f"{d['dram_latency_s'] * 1e9:.0f} ns | {d['issue_efficiency']:.2f} | {rate / 1e9:.1f} G |")

    lines += ["", "## Per kernel: depthwise and fractional pooling (SASS, steady-state path per output element)", "",
              "SASS/elem: instructions on the steady-state path per output element (one thread, one element); "
              "per tap: the cost of one more tap; calls: subroutine call sites (slow paths of 64-bit integer or "
              "double division) in the grid-stride loop; occupancy at the launcher's 256-thread blocks. Tiled "
              "depthwise kernels (`_tiled<`): one thread's common path through the whole kernel x threads per CTA "
              "/ outputs of a full tile (multiplier 1; the 'per tap' column gives multiplier 2 paired), global "
              "ld/st are one thread's, occupancy at the launcher's 128- or 64-thread blocks. Staged fractional "
              "average pooling (`fractional_avg_pool_grad<`): every warp of the whole launch of the fractional "
              "suite's first disjoint shape (the 'per tap' column: its first overlapping one) / elements; ld/st and "
              "pipe counts are one staging warp's path.", "",
              "| arch | kernel | regs | smem | spills | warps/SM (limiter) | global ld/st on the path | SASS/elem | "
              "per tap | IMAD / int / FP64 / MUFU / conv on the path | calls | work |",
              "|---|---|---:|---:|---:|---|---|---:|---:|---|---:|---|"]
    for r in report["kernels"]:
        s = r.get("steady_state")
        if not s:
            continue
        if "not_modelled" in s:
            lines.append(f"| {r['arch']} | `{_short(r['kernel'])}` | {r['registers']} | {r['shared_bytes']} | "
                         f"{r['spill_stores']}/{r['spill_loads']} | {r['occupancy']['warps_per_sm']} "
                         f"({r['occupancy']['limiter']}) | - | - | - | - | - | {s['not_modelled'].split(';')[0]} |")
            continue
        c = s["path"]["classes"]
        occ = r["occupancy"]
        extra = s.get("per_extra_tap")
        if "extra_text" in s:
            extra_text = s["extra_text"]
        elif extra is None and "per_element_2x2_cells" in s:
            extra_text = f"2x2 cells: {s['per_element_2x2_cells']}"
        else:
            extra_text = str(extra)
        lines.append(
            f"| {r['arch']} | `{_short(r['kernel'])}` | {r['registers']} | {r['shared_bytes']} | "
            f"{r['spill_stores']}/{r['spill_loads']} | {occ['warps_per_sm']} ({occ['limiter']}) | "
            f"{_fmt_memory({k: v for k, v in s['path']['memory'].items() if k.startswith(('LDG', 'STG'))})} | "
            f"{s['per_element']:.0f} | {extra_text} | {c.get('imad', 0)} / {c.get('int', 0)} / {c.get('fp64', 0)} / "
            f"{c.get('mufu', 0)} / {c.get('conversion', 0)} | {s['call_sites']} | {s['work']} |")

    conv = [r for r in report["kernels"] if r.get("main_loop")]
    if conv:
        lines += ["", "## Per kernel: tiled convolution main loop (per k-tile, per warp; first cut)", "",
                  "Static count of the innermost loop holding the barrier and the MMA/FMA instructions: every "
                  "instruction of its body once (nested loops once, slow-path blocks left out), divided by the "
                  "k-tiles an iteration runs (its barriers: the cp.async pipeline's loop runs its 3 stages per "
                  "iteration).", "",
                  "| arch | kernel | regs | smem | warps/SM (limiter) | instr | HMMA | FFMA | LDS+LDSM | LDG (widths) | STS | "
                  "BAR |", "|---|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|"]
        for r in conv:
            m = r["main_loop"]
            occ = r["occupancy"]
            ldg = {k: v for k, v in m["memory"].items() if k.startswith("LDG")}
            lines.append(f"| {r['arch']} | `{_short(r['kernel'])}` | {r['registers']} | {r['shared_bytes']} | "
                         f"{occ['warps_per_sm']} ({occ['limiter']}) | {m['instructions']} | {m['HMMA']} | {m['FFMA']} | "
                         f"{m['LDS'] + m['LDSM']} | {_fmt_memory(ldg)} | {m['STS']} | {m['BAR']} |")

    lines += ["", "## Roofline per benchmark shape", "",
              f"**{LABEL}.** limits in ms: DRAM, L2, issue, occupancy; the largest is the prediction. "
              f"SASS/elem: mean over the shape's warps of the steady-state path (divergent warps pay the union). "
              f"Budget: SASS per element that keeps the scheduler limit at {BUDGET_FRACTION:.0%} of HBM. "
              "Two-kernel ops (depthwise filter gradient, fractional max pooling gradient): limits and predicted "
              "time summed over both kernels, the limiter is the dearer kernel's (named); SASS/elem and budget per "
              "partial sum (filter gradient; per out_backprop element where the tiled kernel runs) or per input element "
              "(max pooling); MB includes max pooling's "
              "chosen-offset buffer and cell tables. Latency-aware: the estimate of the assumption so named (its "
              "largest term in brackets), also predicted, not measured.", ""]
    lines += latency_summary(report)
    for device in meta["devices"]:
        rows = [p for p in report["predictions"] if p["device"] == device["key"]]
        if not rows:
            continue
        lines += [f"### {device['key']}", "",
                  "| suite | op | case | dtype | MB | SASS/elem | budget | DRAM | L2 | issue (pipe) | occupancy | "
                  "limiter | predicted ms | % HBM | latency-aware ms | % HBM |",
                  "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|"]
        for p in rows:
            op = OP_SHORT.get(p["op"], p["op"])
            if "not_modelled" in p:
                lines.append(f"| {p['suite']} | {op} | {p['label']} | {p['dtype']} | - | - | - | - | - | - | - | "
                             f"{p['not_modelled'].split(';')[0]} | - | - | - | - |")
                continue
            lim = p["limits_ms"]
            pipe = p["issue_detail"]["busiest_pipe"] if p["issue_detail"]["busiest_pipe_s"] > p["issue_detail"]["scheduler_s"] else "sched"
            lines.append(f"| {p['suite']} | {op} | {p['label']} | {p['dtype']} | {p['bytes'] / 1e6:.1f} | "
                         f"{p['sass_per_element']:.0f} | {p['budget_per_element_75pct_hbm']:.0f} | {lim['DRAM']:.3f} | "
                         f"{lim['L2']:.3f} | {lim['issue']:.3f} ({pipe}) | {lim['occupancy']:.3f} | {p['limiter']} | "
                         f"{p['predicted_ms']:.3f} | {p['pct_hbm']:.1f} | {_latency_cells(p)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _latency_cells(p: dict) -> str:
    la = p.get("latency_aware")
    return f"{la['ms']:.3f} ({la['term']}) | {la['pct_hbm']:.1f}" if la else "- | -"


def latency_summary(report: dict) -> list[str]:
    """Per device: how many rows reach 75% / 50% of HBM by the bound and by the latency-aware
    estimate, and the geometric mean % of HBM per suite, op, dtype and layout by each."""
    rows = [p for p in report["predictions"] if "latency_aware" in p]
    if not rows:
        return []
    lines = ["### Bound and latency-aware estimate, in brief", "",
             f"Both {LABEL}. Rows: modelled case-dtypes of the device.", "",
             "| device | rows | bound >= 75% | latency-aware >= 75% | bound >= 50% | latency-aware >= 50% |",
             "|---|---:|---:|---:|---:|---:|"]
    devices = [d["key"] for d in report["meta"]["devices"]]
    for device in devices:
        mine = [p for p in rows if p["device"] == device]
        if mine:
            def count(key, floor):
                return sum(1 for p in mine if (p["latency_aware"]["pct_hbm"] if key else p["pct_hbm"]) >= floor)
            lines.append(f"| {device} | {len(mine)} | {count(0, 75)} | {count(1, 75)} | {count(0, 50)} | "
                         f"{count(1, 50)} |")
    groups: dict = {}
    for p in rows:
        layout = next((t for t in ("NHWC", "NCHW") if t in p["label"]), "-")
        groups.setdefault((p["device"], p["suite"], OP_SHORT.get(p["op"], p["op"]), p["dtype"], layout), []).append(p)
    lines += ["", "Geometric mean % of HBM:", "",
              "| device | suite | op | dtype | layout | rows | bound | latency-aware |", "|---|---|---|---|---|---:|---:|---:|"]

    from .runner import geomean

    for (device, suite_name, op, dtype, layout), ps in sorted(groups.items(), key=lambda kv: (devices.index(kv[0][0]), kv[0][1:])):
        lines.append(f"| {device} | {suite_name} | {op} | {dtype} | {layout} | {len(ps)} | "
                     f"{geomean([p['pct_hbm'] for p in ps]):.1f} | {geomean([p['latency_aware']['pct_hbm'] for p in ps]):.1f} |")
    return lines + [""]


def _short(expression: str) -> str:
    return expression.removeprefix("gradops::")


def write(report: dict, out: Path) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "static_report.json", out / "static_report.md"]
    paths[0].write_text(json.dumps(report, indent=1) + "\n")
    paths[1].write_text(markdown(report))
    return paths


# --------------------------------------------------------------------------- benchmark side


def default_path() -> Path:
    """``benchmarks/results/static_report.json`` of the checkout gradops runs from."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "static_report.json"


def load_predictions(path: Path | None = None) -> dict:
    """``{(device key, op, case label, dtype): prediction}`` from a static report JSON ({} if
    there is none)."""
    path = Path(path) if path else default_path()
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    out = {(p["device"], p["op"], p["label"], p["dtype"]): p for p in data.get("predictions", [])}
    if out:
        out["_meta"] = data.get("meta", {})
    return out
