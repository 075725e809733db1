"""Predicted ResNet-50 convolution-gradient table for the H100 SXM (**predicted, not measured**).

An absolute model, no measurement needed: per ResNet-50 layer (the ``resnet50`` suite's NHWC
cases, at batch 32 and 256), op (``conv2d_backprop_filter`` = wgrad, ``conv2d_backprop_input``
= dgrad) and dtype (float16, bfloat16, float32; and float32 with ``allow_tf32=True``):

* **which kernel our launcher runs**, from the launcher modules' own functions (path choice,
  math kind, tile shape, split-K count, 16-byte load eligibility), for compute capability 9.0;
* **its grid**: CTAs, warps per CTA, k-tiles per CTA, splits, waves;
* **its static figures** from a static report JSON (``gradops.bench.static_report``): main-loop
  SASS per warp per k-tile, the rest of the kernel's SASS (counted once per warp: prologue,
  epilogue, slow paths), resident CTAs per SM (occupancy);
* **our time** = max(issue, math pipe, DRAM) of the tiled kernel, plus the split-K reduction
  kernel when the launcher runs one:

  - issue: warp-instructions / (SMs x 4 schedulers x clock x issue efficiency);
  - math pipe: the FLOPs the tiles execute (padding included) / the pipe's peak (tensor-core
    ``mma.sync`` for float16/bfloat16 and TF32, FP32 FFMA for exact float32);
  - issue and math are multiplied by the wave quantisation ceil(w) / w, w = CTAs / (SMs x
    resident CTAs per SM);
  - DRAM: compulsory bytes (each tensor once; the split-K partial sums written once) / HBM
    bandwidth;
  - split-K reduction: max(its DRAM bytes / bandwidth + a fixed cost, splits x a per-split
    latency): an empirical fit to the measured reduction kernels (stated in the output);
  - the direct path (conv1's dgrad: 3 input channels, the few-channel kernel) is not modelled;

* **cuDNN's time** = FLOPs / (efficiency x dense peak), bounded below by the compulsory DRAM
  time, with the efficiency a parameter per op (defaults fitted to the measured batch-32
  float16 cuDNN kernel times);
* the **limiter**: the largest of our terms (issue, math, DRAM; "+reduce" when the reduction
  kernel is more than a quarter of the time).

With ``--measured RESULTS_DIR --measured-static STATIC.json`` it also prints the model run on the
measured revision's kernels (their own static report) beside the Nsight Compute kernel times of
that run (batch 32, float16): the model's error.

    PYTHONPATH=. python benchmarks/conv_table.py benchmarks/results/static_report.json \\
        --measured benchmarks/results/gpu_h100_2026-11-22 \\
        --measured-static benchmarks/results/gpu_h100_2026-11-22/static_conv_kernels_measured.json \\
        > benchmarks/results/conv_resnet50_predicted.md
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import math
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradops import options  # noqa: E402
from gradops.backends.cuda import _conv_igemm as ig  # noqa: E402
from gradops.backends.cuda import _runtime  # noqa: E402
from gradops.bench import metrics, suites  # noqa: E402

import conv_prediction  # noqa: E402  (the input gradient's grid per phase and split)

# The launcher modules (the package re-exports functions of the same names).
WGRAD = importlib.import_module("gradops.backends.cuda.conv2d_backprop_filter")
DGRAD = importlib.import_module("gradops.backends.cuda.conv2d_backprop_input")
LAUNCHERS = {suites.CONV_FILTER: WGRAD, suites.CONV_INPUT: DGRAD}
OPS = (suites.CONV_FILTER, suites.CONV_INPUT)
SHORT = {suites.CONV_FILTER: "wgrad", suites.CONV_INPUT: "dgrad"}
LABEL = "predicted, not measured"
ARCH = 90  # H100
BATCHES = (32, 256)
#: (table key, numpy dtype, gradops allow_tf32): float32 twice, gradops' default (exact FP32
#: FMA) and with ``gradops.options(allow_tf32=True)`` (TF32 tensor cores).
VARIANTS = (("float16", np.dtype(np.float16), False), ("bfloat16", suites.DTYPES["bfloat16"], False),
            ("float32", np.dtype(np.float32), False), ("float32, allow_tf32", np.dtype(np.float32), True))


@dataclass(frozen=True)
class Assumptions:
    """Every number the model assumes (all command-line parameters)."""

    sms: int = 132
    schedulers: int = 4
    clock_hz: float = 1.98e9
    #: Fraction of the schedulers' issue slots our tiled kernels fill, by resident warps per SM
    #: ((warps, efficiency) points, linear in between, the end values beyond).  1.0 is the pure
    #: instruction bound; the defaults are fitted to the measured batch-32 float16 run (the
    #: measured revision's kernels, their own static report): see the calibration section.
    issue_efficiency: tuple[tuple[int, float], ...] = ((8, 0.34), (16, 0.50))
    #: NVIDIA H100 SXM datasheet dense peaks (the sparse figures halved), FLOP/s.
    wgmma_half_peak: float = 989.4e12  # FP16/BF16 tensor, dense (wgmma)
    wgmma_tf32_peak: float = 494.7e12  # TF32 tensor, dense
    fp32_peak: float = 66.9e12  # FP32 FFMA: 132 SMs x 128 lanes x 2 x 1.98 GHz
    #: What legacy warp-level mma.sync (our kernels: ldmatrix + mma.sync.m16n8k16; WMMA for TF32)
    #: reaches on Hopper, as a fraction of the dense wgmma peak.  ASSUMED, not measured here:
    #: mma.sync cannot feed Hopper's tensor cores at wgmma's rate; 2/3 is our reading of public
    #: microbenchmarks, not an NVIDIA figure.
    mma_sync_fraction: float = 2 / 3
    bandwidth: float = 3.35e12  # HBM3, datasheet
    #: Split-K reduction kernel (gradops::split_reduce, one thread per filter element summing
    #: its splits in order): time = max(bytes / bandwidth + fixed, splits x per_split).  Both
    #: fitted to the measured reduction kernels of the batch-32 float16 run.
    reduce_fixed_s: float = 4e-6
    reduce_per_split_s: float = 125e-9
    #: Whether the reduction is today's batched split_reduce (cuda_src/igemm_tiles.cuh: batches of
    #: 32 splits, about two DRAM round trips each from its sm_90 SASS, then tail batches of 8,
    #: one round trip each) or the measured revision's plain loop (unrolled 4 deep by nvcc: a
    #: round trip per 4 splits, which is what reduce_per_split_s was fitted to).  ASSUMED: a
    #: round trip of the batched kernel costs what 4 splits of the measured one did.
    reduce_batched: bool = True
    #: cuDNN: a fixed cost per call + max(FLOPs / (efficiency x dense peak of the math it uses),
    #: compulsory DRAM time).  Defaults: fitted per op to the measured batch-32 float16 cuDNN
    #: kernels (least squares on log time; gradops' own layout copies excluded; conv1 left out:
    #: cuDNN pads its 3 channels with extra kernels), used unchanged for every dtype and batch.
    cudnn_efficiency_wgrad: float = 0.56
    cudnn_efficiency_dgrad: float = 0.40
    cudnn_overhead_wgrad_s: float = 9.5e-6
    cudnn_overhead_dgrad_s: float = 3.5e-6
    #: The math cuDNN uses for float32: "tf32" (TensorFlow's default on Ampere and newer:
    #: tf.config.experimental.enable_tensor_float_32_execution is on) or "fp32".
    cudnn_f32_math: str = "tf32"

    def reduce_latency_s(self, splits: int) -> float:
        """The split-K reduction's chain of DRAM round trips per thread (see reduce_batched)."""
        if not self.reduce_batched:
            return splits * self.reduce_per_split_s
        full, tail = divmod(splits - 1, 32)
        return (2 * full + math.ceil(tail / 8)) * 4 * self.reduce_per_split_s

    def issue_eff(self, warps_per_sm: int) -> float:
        """Issue efficiency at ``warps_per_sm`` resident warps (interpolated in the points)."""
        points = sorted(self.issue_efficiency)
        if warps_per_sm <= points[0][0]:
            return points[0][1]
        for (w0, e0), (w1, e1) in itertools.pairwise(points):
            if warps_per_sm <= w1:
                return e0 + (e1 - e0) * (warps_per_sm - w0) / (w1 - w0)
        return points[-1][1]

    def issue_rate(self, warps_per_sm: int) -> float:
        """Warp-instructions per second of the whole GPU."""
        return self.sms * self.schedulers * self.clock_hz * self.issue_eff(warps_per_sm)

    def ours_peak(self, dtype, kind: int) -> tuple[float, str]:
        """(FLOP/s, name) of the pipe our tiled kernel of math ``kind`` runs on."""
        if kind == ig.WMMA_HALF:
            return self.mma_sync_fraction * self.wgmma_half_peak, "mma.sync f16/bf16"
        if kind == ig.WMMA_TF32:
            return self.mma_sync_fraction * self.wgmma_tf32_peak, "mma.sync TF32"
        if np.dtype(dtype) == np.dtype(np.float32):
            return self.fp32_peak, "FP32 FFMA"
        raise ValueError(f"no peak for {np.dtype(dtype).name} kind {kind}")

    def cudnn_peak(self, dtype, allow_tf32: bool) -> float:
        if np.dtype(dtype) != np.dtype(np.float32):
            return self.wgmma_half_peak
        return self.wgmma_tf32_peak if (allow_tf32 or self.cudnn_f32_math == "tf32") else self.fp32_peak

    def cudnn_efficiency(self, op: str) -> float:
        return self.cudnn_efficiency_wgrad if op == suites.CONV_FILTER else self.cudnn_efficiency_dgrad

    def cudnn_overhead(self, op: str) -> float:
        return self.cudnn_overhead_wgrad_s if op == suites.CONV_FILTER else self.cudnn_overhead_dgrad_s


# --------------------------------------------------------------------------- the launcher's plan


@dataclass
class Plan:
    """What our launcher runs for one call: path, kernel, grid, k-tiles."""

    path: str  # "tiled" or "direct"
    kernel: str | None = None  # the tiled kernel's name expression
    kind: int | None = None
    vector: bool | None = None
    tile: tuple[int, int, int, int] | None = None  # BM, BN, BK, threads
    splits: int = 1
    #: (CTAs, k-tiles each) groups: wgrad's splits (the last may be shorter), dgrad's phases x splits.
    groups: list[tuple[int, int]] = field(default_factory=list)
    reduce_elements: int = 0  # gradient elements the split-K reduction sums (0: no reduction)
    general: str | None = None  # the general tiled kernel, where a report predates the 1x1 kernels

    @property
    def ctas(self) -> int:
        return sum(c for c, _ in self.groups)

    @property
    def warps_per_cta(self) -> int:
        return self.tile[3] // 32


def plan(op: str, g, dtype, allow_tf32: bool = False, few_channels: bool = True, tiles: bool = True) -> Plan:
    """The launcher's choices for geometry ``g`` on compute capability 9.0, from its own
    functions (``tiled_eligible``, ``pick_path``, ``math_kind``, ``split_count``,
    ``use_vector_loads`` with 16-byte aligned arrays, as CuPy allocates them, and the filter
    gradient's ``few_channels_eligible``; ``few_channels=False``: as a revision without that
    kernel chose; ``tiles=False``: the default tile, as a revision without the narrower ones)."""
    launcher = LAUNCHERS[op]
    dtype = np.dtype(dtype)
    with options(allow_tf32=allow_tf32), mock.patch.object(_runtime, "compute_capability", return_value=ARCH):
        kind = ig.math_kind(dtype, ARCH)
        m, n, _ = launcher._gemm_sizes(g)
        path = launcher.pick_path(g, dtype)
        few = few_channels and op == suites.CONV_FILTER and path == "tiled" and WGRAD.few_channels_eligible(g, dtype)
    if path == "direct":
        return Plan("direct")
    if few:
        return _few_channels_plan(g, dtype, kind)
    vector = ig.use_vector_loads(g, dtype, ())
    tile = (ig.scalar_table_tile(ig.pick_tile(dtype, kind, vector, m, n, arch=ARCH), dtype, kind, vector) if tiles
            else ig.default_tile(dtype, kind))
    bm, bn, bk, threads = tile[:4]
    # A 1x1 filter at stride 1 without padding runs the _1x1_igemm kernel (same grid and tile);
    # both ops' kernels have a SPLIT argument (true where the launcher splits).
    split = LAUNCHERS[op].split_count(g, dtype, kind, tile=tile)[0] > 1
    name = (launcher._pointwise_name(dtype, kind, split, tile.args) if ig.pick_pointwise(g, vector, None)
            else launcher._tiled_name(dtype, kind, vector, split, tile.args))
    p = Plan("tiled", name, kind, vector, (bm, bn, bk, threads))
    p.general = launcher._tiled_name(dtype, kind, vector)
    if op == suites.CONV_FILTER:
        m, n, red = WGRAD._gemm_sizes(g)
        splits, split_size = WGRAD.split_count(g, dtype, kind, tile=tile)
        tiles = ig.ceil_div(m, bm) * ig.ceil_div(n, bn) * g.groups
        per_split = [ig.ceil_div(min(split_size, red - s * split_size), bk) for s in range(splits)]
        p.splits = splits
        p.groups = [(tiles * per_split.count(k), k) for k in sorted(set(per_split), reverse=True)]
        p.reduce_elements = m * n * g.groups if splits > 1 else 0
        return p
    splits = DGRAD.split_count(g, dtype, kind, tile=tile)[0]
    p.splits = splits
    p.groups = conv_prediction.dgrad_groups(g, dtype, kind, split=True, tile=tile)
    p.reduce_elements = g.batch * g.in_rows * g.in_cols * g.in_depth if splits > 1 else 0
    return p


def _few_channels_plan(g, dtype, kind: int) -> Plan:
    """The filter gradient's few-channel kernel: 64 taps x 64 out channels per CTA (the model's
    M x N: FLOPs per tile are the same either way), 128 threads, its own split count."""
    taps, n, red = WGRAD._gemm_sizes(g)
    splits, split_size = WGRAD.few_channels_split_count(g)
    bk = WGRAD.FEW_BK
    p = Plan("tiled", WGRAD._few_channels_name(dtype, g.filter_in_depth), kind, True,
             (WGRAD.FEW_TAPS, WGRAD.FEW_OUT, bk, WGRAD.FEW_THREADS))
    tiles = ig.ceil_div(taps, WGRAD.FEW_TAPS) * ig.ceil_div(n, WGRAD.FEW_OUT)
    per_split = [ig.ceil_div(min(split_size, red - s * split_size), bk) for s in range(splits)]
    p.splits = splits
    p.groups = [(tiles * per_split.count(k), k) for k in sorted(set(per_split), reverse=True)]
    p.reduce_elements = taps * n if splits > 1 else 0
    return p


# --------------------------------------------------------------------------- the model


def static_kernels(path: str, arch: str = "sm_90") -> dict[str, dict]:
    """``{name expression: record}`` of a static report JSON's kernels for ``arch``."""
    data = json.loads(Path(path).read_text())
    return {k["kernel"]: k for k in data["kernels"] if k.get("arch") == arch}


def predict_ours(op: str, g, dtype, allow_tf32: bool, kernels: dict[str, dict], a: Assumptions,
                 case=None) -> dict:
    """Our predicted time of one call and its terms (seconds), or ``{"path": "direct"}``."""
    p = plan(op, g, dtype, allow_tf32)
    row = {"path": p.path, "flops": g.flops}
    if p.path == "direct":
        return row
    if p.kernel not in kernels and "_few_channels<" in p.kernel:  # a report older than that kernel
        p = plan(op, g, dtype, allow_tf32, few_channels=False)
    if p.kernel not in kernels and p.tile[:2] != ig.default_tile(dtype, p.kind)[:2]:  # ... or the tile shapes
        p = plan(op, g, dtype, allow_tf32, tiles=False)
    if p.kernel not in kernels:  # a static report of kernels older than the 1x1 (or split) ones
        p.kernel = p.general
    if p.kernel not in kernels:  # ... or older than the input gradient's SPLIT argument
        p.kernel = re.sub(r", (true|false), (true|false)>$", r", \1>", p.kernel)
    rec = kernels[p.kernel]
    loop = rec["main_loop"]["instructions"]  # per k-tile
    rest = rec["sass_instructions"] - rec["main_loop"].get("iteration_instructions", loop)
    per_sm = rec["occupancy"]["blocks_per_sm"]
    bm, bn, bk, _ = p.tile
    warps = p.warps_per_cta
    warp_k_tiles = sum(c * warps * k for c, k in p.groups)
    warp_instructions = warp_k_tiles * loop + p.ctas * warps * rest
    waves = p.ctas / (a.sms * per_sm)
    quantisation = math.ceil(waves) / waves
    peak, pipe = a.ours_peak(dtype, p.kind)
    tile_flops = warp_k_tiles * (bm * bn * bk * 2 // warps)  # what the tiles execute, padding included
    itemsize = np.dtype(dtype).itemsize
    compulsory = _compulsory_bytes(op, g, itemsize, case)
    scratch = 0
    if p.reduce_elements:  # partial sums written instead of the filter (the reduction writes it)
        acc = 4  # float partials for the half types and float32
        scratch = p.splits * p.reduce_elements * acc - p.reduce_elements * itemsize
    warps_per_sm = per_sm * warps
    terms = {"issue": warp_instructions / a.issue_rate(warps_per_sm) * quantisation,
             "math": tile_flops / peak * quantisation,
             "DRAM": (compulsory + scratch) / a.bandwidth}
    main = max(terms.values())
    limiter = max(terms, key=terms.get)
    reduce = 0.0
    if p.reduce_elements:
        reduce_bytes = p.splits * p.reduce_elements * 4 + p.reduce_elements * itemsize
        reduce = max(reduce_bytes / a.bandwidth + a.reduce_fixed_s, a.reduce_latency_s(p.splits))
    total = main + reduce
    if reduce > total / 4:
        limiter += "+reduce"
    ks = sorted({k for _, k in p.groups})
    row.update(kernel=p.kernel, kind=p.kind, vector=p.vector, pipe=pipe, ctas=p.ctas, warps_per_cta=warps,
               k_tiles=(ks[0], ks[-1]), splits=p.splits, ctas_per_sm=per_sm, warps_per_sm=warps_per_sm,
               issue_efficiency=a.issue_eff(warps_per_sm), waves=waves,
               main_loop=loop, rest=rest, warp_instructions=warp_instructions, tile_flops=tile_flops,
               dram_bytes=compulsory + scratch, terms=terms, main_s=main, reduce_s=reduce, time_s=total,
               limiter=limiter)
    return row


def _compulsory_bytes(op: str, g, itemsize: int, case=None) -> int:
    """Each tensor read once, the gradient written once (gradops.bench.metrics.bytes_moved)."""
    if case is None:
        case = suites.Case("model", "model", op, (1, 1, 1, 1))
    return metrics.bytes_moved(replace(case, op=op), g, itemsize)


def predict_cudnn(op: str, g, dtype, allow_tf32: bool, a: Assumptions, case=None, efficiency=None,
                  overhead=None) -> dict:
    """cuDNN's predicted time: overhead + max(FLOPs / (efficiency x peak), compulsory DRAM time)."""
    efficiency = a.cudnn_efficiency(op) if efficiency is None else efficiency
    overhead = a.cudnn_overhead(op) if overhead is None else overhead
    compute = g.flops / (efficiency * a.cudnn_peak(dtype, allow_tf32))
    dram = _compulsory_bytes(op, g, np.dtype(dtype).itemsize, case) / a.bandwidth
    return {"time_s": overhead + max(compute, dram), "limiter": "DRAM" if dram > compute else "compute"}


def resnet50_cases(batch: int) -> list:
    """The ``resnet50`` suite's NHWC cases of both ops at ``batch``."""
    return [c.with_batch(batch) for c in suites.suite("resnet50") if c.data_format == "NHWC" and c.op in OPS]


def rows(static: str, a: Assumptions, batches=BATCHES, variants=VARIANTS) -> list[dict]:
    kernels = static_kernels(static)
    out = []
    for batch in batches:
        for key, dtype, tf32 in variants:
            for case in resnet50_cases(batch):
                g = case.geometry()
                ours = predict_ours(case.op, g, dtype, tf32, kernels, a, case)
                cudnn = predict_cudnn(case.op, g, dtype, tf32, a, case)
                r = {"batch": batch, "dtype": key, "layer": case.layer, "label": case.label, "op": case.op,
                     **ours, "cudnn_s": cudnn["time_s"], "cudnn_limiter": cudnn["limiter"]}
                if ours["path"] == "tiled":
                    r["ratio"] = cudnn["time_s"] / ours["time_s"]
                out.append(r)
    return out


def geomean(values) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


# --------------------------------------------------------------------------- calibration


def measured_rows(results: str, measured_static: str, a: Assumptions) -> list[dict]:
    """Model (on the measured revision's kernels) vs the Nsight Compute run (batch 32, float16)."""
    from ncu_table import kernels_by_case

    index = json.loads((Path(results) / "ncu_index.json").read_text())
    by_case = kernels_by_case(str(Path(results) / "ncu_cases.csv.gz"))
    kernels = static_kernels(measured_static)
    cases = {(c.label, c.op): c for c in suites.suite("resnet50")}
    cudnn = {}
    for e in index:
        if e["suite"] == "resnet50" and e["engine"] == "gradops-cudnn" and e["dtype"] == "float16":
            # cuDNN's own kernels; gradops' layout copies around the call (cupy_copy) left out
            cudnn[(e["label"], e["op"])] = sum(k["ns"] for k in by_case.get(e["i"], [])
                                               if not k["name"].startswith("cupy_")) * 1e-9
    out = []
    for e in index:
        if not (e["suite"] == "resnet50" and e["engine"] == "gradops-cuda" and e["dtype"] == "float16"
                and e["op"] in OPS and by_case.get(e["i"])):
            continue
        case = cases[(e["label"], e["op"])]
        if case.data_format != "NHWC":
            continue
        g = case.geometry()
        ks = by_case[e["i"]]
        # the measured revision's kernels, its plain split_reduce loop included
        ours = predict_ours(case.op, g, np.float16, False, kernels, replace(a, reduce_batched=False), case)
        reduce_ns = sum(k["ns"] for k in ks if "split_reduce" in k["name"])
        out.append({"layer": case.layer, "op": case.op, **ours,
                    "measured_s": sum(k["ns"] for k in ks) * 1e-9, "measured_reduce_s": reduce_ns * 1e-9,
                    "cudnn_measured_s": cudnn.get((e["label"], e["op"]), float("nan")),
                    "cudnn_model_s": predict_cudnn(case.op, g, np.float16, False, a, case)["time_s"],
                    "cudnn_compute_unit_s": g.flops / a.cudnn_peak(np.float16, False),
                    "cudnn_dram_s": _compulsory_bytes(case.op, g, 2, case) / a.bandwidth})
    return out


def fitted(measured: list[dict], a: Assumptions) -> dict:
    """The parameters the measured run implies (the defaults are these, rounded; printed).

    * issue efficiency per resident warps per SM: geomean over the tiled cases of the issue
      term at efficiency 1 / the measured tiled-kernel time (the reduction kernel's time taken
      out);
    * cuDNN per op: (overhead, efficiency) minimising the squared log error of
      overhead + max(FLOPs / (efficiency x peak), DRAM), on a grid (0.5 us, 0.01), conv1 left
      out (cuDNN pads its 3 channels with extra kernels)."""
    tiled = [r for r in measured if r["path"] == "tiled"]
    issue = {}
    for w in sorted({r["warps_per_sm"] for r in tiled}):
        sel = [r for r in tiled if r["warps_per_sm"] == w]
        issue[w] = (len(sel), geomean(r["terms"]["issue"] * r["issue_efficiency"] / (r["measured_s"] - r["measured_reduce_s"])
                                      for r in sel))
    cudnn = {}
    for op in OPS:
        sel = [r for r in measured if r["op"] == op and not r["layer"].startswith("conv1")
               and math.isfinite(r["cudnn_measured_s"])]
        if not sel:
            continue
        unit = np.array([r["cudnn_compute_unit_s"] for r in sel])  # FLOPs / peak (efficiency 1)
        dram = np.array([r["cudnn_dram_s"] for r in sel])
        logt = np.log([r["cudnn_measured_s"] for r in sel])
        best = None
        for overhead in np.arange(0, 40.01, 0.5) * 1e-6:
            for eff in np.arange(0.05, 1.0001, 0.01):
                loss = float(np.sum((np.log(overhead + np.maximum(unit / eff, dram)) - logt) ** 2))
                if best is None or loss < best[0]:
                    best = (loss, overhead, eff)
        cudnn[op] = (len(sel), best[1], best[2])
    return {"issue_efficiency": issue, "cudnn": cudnn}


# --------------------------------------------------------------------------- markdown


def _commit() -> str:
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "benchmarks/conv_table.py", "gradops"],
                               cwd=ROOT, check=False).returncode
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _us(s: float) -> str:
    return f"{s * 1e6:.1f}"


def _assumption_lines(a: Assumptions) -> list[str]:
    half = a.mma_sync_fraction * a.wgmma_half_peak
    tf32 = a.mma_sync_fraction * a.wgmma_tf32_peak
    return [
        "## Assumptions (all of them; every one is a command-line parameter)", "",
        f"- GPU: H100 SXM, {a.sms} SMs x {a.schedulers} schedulers, clock {a.clock_hz / 1e9:.2f} GHz (maximum boost; "
        "the Nsight Compute run used `--clock-control none`).",
        "- Issue efficiency, by resident warps per SM: "
        + ", ".join(f"{e:.2f} at {w} warps ({a.issue_rate(w) / 1e9:.0f} G warp-instructions/s for the GPU)"
                    for w, e in sorted(a.issue_efficiency))
        + ", linear in between. It is the share of the schedulers' issue slots our kernels fill; 1.0 would be the "
        "pure instruction bound. Both points are FITTED to the measured run below: 16 warps from the measured wgrad "
        "kernel, 8 warps mostly from the measured dgrad kernel. They stand in for latency, barriers and occupancy, "
        "which the model does not otherwise describe. Every f16/bf16 kernel these tables use runs 16 warps per SM, as "
        "the measured wgrad kernel did. Their main loops differ from the measured ones (cp.async staging, fewer "
        "instructions per k-tile: the static report's figures), so carrying the efficiency over is an extrapolation.",
        f"- Tensor cores, our kernels: mma.sync reaches {a.mma_sync_fraction:.3f} of the dense wgmma peak (ASSUMED, "
        f"not measured here), so {half / 1e12:.0f} TFLOP/s for f16/bf16 and {tf32 / 1e12:.0f} TFLOP/s for TF32. "
        f"The dense wgmma peaks are NVIDIA's datasheet figures, sparse figures halved: {a.wgmma_half_peak / 1e12:.1f} "
        f"TFLOP/s FP16/BF16 and {a.wgmma_tf32_peak / 1e12:.1f} TFLOP/s TF32. Our math term counts the FLOPs the "
        "128x128 tiles execute, padding included.",
        f"- FP32 FFMA peak {a.fp32_peak / 1e12:.1f} TFLOP/s, for our float32 kernel. gradops' default float32 is exact "
        "SIMT FMA; the `float32, allow_tf32` tables run `gradops.options(allow_tf32=True)`, which uses TF32 tensor "
        "cores.",
        f"- HBM {a.bandwidth / 1e12:.2f} TB/s. DRAM bytes are the compulsory bytes: each tensor read once and the "
        "gradient written once, plus the split-K partial sums (float, written once, then read by the reduction). "
        "Re-reads that miss L2 are not counted.",
        "- Wave quantisation multiplies the issue and math terms by ceil(w) / w, where w = CTAs / (SMs x resident CTAs "
        "per SM). Resident CTAs per SM come from the static report's occupancy.",
        "- Tiles: the launcher's (`_conv_igemm.pick_tile`): 128 x 128, or for half types 128 x 64 / 64 x 128 "
        "(4 warps) where the narrower tile cuts the padded GEMM area to 3/4 or less of a grid of several "
        "128 x 128 tiles (64-channel layers), and 64 x 64 (2 warps) where it cuts that of the tile it would "
        "replace to 3/4 or less per halving of the warps; a launch of 4 or 2 warps per CTA aims its split "
        "reduction at 2 or 4 times the CTAs.",
        f"- Split-K reduction (when splits > 1; dgrad splits only grids below {ig.SPLIT_TARGET_CTAS // 2} CTAs of "
        "8 warps) takes max(bytes / HBM + {a.reduce_fixed_s * 1e6:.1f} us, "
        f"splits x {a.reduce_per_split_s * 1e9:.0f} ns). Both constants are FITTED to the measured reduction kernels "
        "(7 to 25 us at batch 32), not derived. The measured kernel was a plain loop that nvcc unrolled 4 deep (one "
        "DRAM round trip per 4 splits); today's split_reduce loads 32 splits before adding them (about 2 round trips "
        "per batch, sm_90 SASS) and then the rest in batches of 8 (1 round trip each), so its latency term is "
        f"round trips x {4 * a.reduce_per_split_s * 1e9:.0f} ns"
        + (" (ASSUMED: a round trip costs what 4 measured splits did)." if a.reduce_batched else
           " (switched off here: --reduce-batched false)."),
        f"- cuDNN: overhead + max(FLOPs / (efficiency x dense peak), compulsory DRAM time). Efficiency is "
        f"{a.cudnn_efficiency_wgrad:.2f} (wgrad) and {a.cudnn_efficiency_dgrad:.2f} (dgrad) of the dense peak "
        f"({a.wgmma_half_peak / 1e12:.1f} TFLOP/s for f16/bf16). The fixed overhead per call is "
        f"{a.cudnn_overhead_wgrad_s * 1e6:.1f} us (wgrad) and {a.cudnn_overhead_dgrad_s * 1e6:.1f} us (dgrad): split-K "
        "reductions, padding and filter kernels, and ramp-up. All four are FITTED to the measured batch-32 float16 "
        "cuDNN kernel times. The fit uses least squares on log time, excludes gradops' own `cupy_copy` layout copies, "
        "and leaves out conv1, which cuDNN runs with channel-padding kernels. The same values serve every dtype and "
        "batch 256. Batch 256 is an extrapolation of a fit made at batch 32. `--cudnn-overhead-*-s 0` gives "
        "the pure FLOPs / (efficiency x peak) form.",
        f"- cuDNN float32 math: {a.cudnn_f32_math} (TensorFlow's default on Ampere and newer is TF32 for convolutions, "
        f"peak {a.wgmma_tf32_peak / 1e12:.1f} TFLOP/s; `--cudnn-f32-math fp32` gives {a.fp32_peak / 1e12:.1f}). The "
        "`float32` tables therefore compare our exact FP32 with cuDNN's TF32, as a default TF user would see it.",
        "- Not modelled: the direct path (conv1's dgrad: its 3 input channels are below the tiled kernel's minimum "
        "of 8, so the launcher runs the direct path, now its few-channel kernel; TF does not compute the first "
        "layer's input gradient in training); launch gaps; L2 misses beyond the compulsory bytes; NCHW (transposes). Only NHWC cases are listed.",
        "",
    ]


def _grid(r: dict) -> str:
    lo, hi = r["k_tiles"]
    kt = f"{hi}" if lo == hi else f"{lo}-{hi}"
    return f"{r['ctas']}x{r['warps_per_cta']}w, kt {kt}, s {r['splits']}, {r['waves']:.2f} waves"


def _kernel_short(r: dict) -> str:
    args = r["kernel"].split("<", 1)[1].rstrip(">").split(", ")
    kind = {ig.SIMT: "SIMT", ig.WMMA_HALF: "mma.sync", ig.WMMA_TF32: "TF32"}[r["kind"]]
    return f"{args[0]} {kind}{' vec' if r['vector'] else ''}"


def markdown(table: list[dict], a: Assumptions, command: str, static: str, measured: list[dict] | None = None,
             bound: list[dict] | None = None) -> str:
    """The report; ``bound``: the same rows at issue efficiency 1.0 (the summary's last column)."""
    meta = json.loads(Path(static).read_text()).get("meta", {})
    lines = [f"# ResNet-50 convolution gradients on the H100 SXM: **{LABEL}**", "",
             f"**{LABEL.capitalize()}.** Every time, TFLOP/s and ratio in the tables below is the output of a model. "
             "None of them was run on a GPU. Only the calibration section at the end has measured columns, "
             "and they are labelled **measured**.", "",
             f"Generated by `{command}` at commit `{_commit()}`. The static report `{static}` "
             f"(kernels compiled at `{meta.get('commit', '?')}`, {meta.get('date', '?')}) supplies the SASS counts "
             "(`benchmarks/conv_table.py` docstring: the model).", ""]
    lines += _assumption_lines(a)
    lines += [f"## Summary: geometric mean of the predicted cuDNN / ours time ratio (**{LABEL}**)", "",
              "A ratio below 1 means cuDNN is predicted faster. Tiled cases only (conv1's dgrad runs the unmodelled "
              "direct kernel).", "",
              "The last column repeats the ratio with issue efficiency 1.0 at every occupancy, the pure instruction "
              "bound and so the most our kernels could reach if they stopped stalling. It is an optimistic bound, "
              "not a forecast.", "",
              "| op | dtype | batch | cases | ratio cuDNN / ours | our TFLOP/s (geomean) | limiters (issue / math / DRAM) | "
              "ratio at issue efficiency 1.0 |",
              "|---|---|---|---|---|---|---|---|"]
    ideal = {}
    if bound is not None:
        ideal = {(r["op"], r["dtype"], r["batch"], r["layer"]): r.get("ratio") for r in bound}
    keys = []
    for r in table:
        k = (r["dtype"], r["batch"])
        if k not in keys:
            keys.append(k)
    for op in OPS:
        for dtype, batch in keys:
            sel = [r for r in table if r["op"] == op and r["dtype"] == dtype and r["batch"] == batch
                   and r["path"] == "tiled"]
            lim = [sum(1 for r in sel if r["limiter"].startswith(t)) for t in ("issue", "math", "DRAM")]
            best = geomean(ideal.get((op, dtype, batch, r["layer"])) or float("nan") for r in sel)
            lines.append(f"| {SHORT[op]} | {dtype} | {batch} | {len(sel)} | {geomean(r['ratio'] for r in sel):.2f} | "
                         f"{geomean(r['flops'] / r['time_s'] for r in sel) / 1e12:.0f} | "
                         f"{lim[0]} / {lim[1]} / {lim[2]} | {best:.2f} |")
    lines.append("")
    for dtype, batch in keys:
        sel = [r for r in table if r["dtype"] == dtype and r["batch"] == batch]
        lines += [f"## {dtype}, batch {batch} (**{LABEL}**)", "",
                  "Columns: `kernel` is T, math and load width. `grid` is CTAs x warps per CTA, k-tiles per CTA, "
                  "splits and waves. `issue`, `math` and `DRAM` are the tiled kernel's terms in us. `reduce` is the "
                  "split-K reduction kernel in us. `ours` = max(issue, math, DRAM) + reduce.", "",
                  "| layer | op | kernel | grid | limiter | issue | math | DRAM | reduce | ours (us) | ours TFLOP/s | "
                  "cuDNN (us) | cuDNN / ours |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sel:
            if r["path"] == "direct":
                lines.append(f"| {r['layer']} | {SHORT[r['op']]} | direct | - | not modelled | - | - | - | - | - | - | "
                             f"{_us(r['cudnn_s'])} | - |")
                continue
            t = r["terms"]
            lines.append(f"| {r['layer']} | {SHORT[r['op']]} | {_kernel_short(r)} | {_grid(r)} | {r['limiter']} | "
                         f"{_us(t['issue'])} | {_us(t['math'])} | {_us(t['DRAM'])} | {_us(r['reduce_s'])} | "
                         f"{_us(r['time_s'])} | {r['flops'] / r['time_s'] / 1e12:.0f} | {_us(r['cudnn_s'])} | "
                         f"{r['ratio']:.2f} |")
        for op in OPS:
            ops = [r for r in sel if r["op"] == op and r["path"] == "tiled"]
            lines.append(f"| **geomean** | {SHORT[op]} | | | | | | | | | "
                         f"{geomean(r['flops'] / r['time_s'] for r in ops) / 1e12:.0f} | | "
                         f"{geomean(r['ratio'] for r in ops):.2f} |")
        lines.append("")
    if measured:
        lines += _calibration(measured, a)
    return "\n".join(lines) + "\n"


def _calibration(measured: list[dict], a: Assumptions) -> list[str]:
    fit = fitted(measured, a)
    tiled = [r for r in measured if r["path"] == "tiled"]
    lines = ["## Calibration: the model against the measured batch-32 float16 run", "",
             "Columns marked **measured** are Nsight Compute kernel times from `benchmarks/results/gpu_h100_2026-11-22`. "
             "Its README gives commit `d2276ad`, an H100 SXM and `--clock-control none`. Our measured time sums every "
             "gradops kernel of the call (the tiled kernel plus `split_reduce`). cuDNN's measured time sums cuDNN's own "
             "kernels; gradops' `cupy_copy` layout copies are left out.", "",
             "The kernels measured there are older than today's. Their main loops ran 369 (wgrad) and 570 (dgrad) "
             "instructions per warp per k-tile, against 184 and 146 now, and the dgrad kernel had 8 resident warps per "
             "SM. The columns marked **model** therefore run this same model on those kernels' own static report "
             "(`--measured-static`), with the same launcher rules: the launchers' plan functions are unchanged since "
             f"`d2276ad`. Everything not marked measured is **{LABEL}**. error = model / measured.", "",
             "Fitted from this run (the defaults above are these, rounded):", "",
             "- issue efficiency: " + ", ".join(f"{e:.3f} at {w} warps per SM ({n} cases)"
                                                 for w, (n, e) in fit["issue_efficiency"].items())
             + ". This is the issue term at efficiency 1 divided by the measured tiled-kernel time, as a geomean;",
             "- cuDNN: " + "; ".join(f"{SHORT[op]} overhead {o * 1e6:.1f} us, efficiency {e:.2f} ({n} cases)"
                                      for op, (n, o, e) in fit["cudnn"].items()) + ".", "",
             "These are fitted, so the errors below are in-sample. The figures that test the model are the spread "
             "(min - max, geometric SD), not the geomean. They test it only for the kernels and the batch that were "
             "measured.", ""]
    lines += ["| op | cases | ours: error geomean | min - max | geometric SD | cuDNN model: error geomean (conv1 "
              "excluded) | min - max | geometric SD |", "|---|---|---|---|---|---|---|---|"]

    def gsd(values):
        return math.exp(float(np.std([math.log(v) for v in values])))

    for op in OPS:
        e = [r["time_s"] / r["measured_s"] for r in tiled if r["op"] == op]
        c = [r["cudnn_model_s"] / r["cudnn_measured_s"] for r in measured
             if r["op"] == op and not r["layer"].startswith("conv1")]
        lines.append(f"| {SHORT[op]} | {len(e)} | {geomean(e):.2f} | {min(e):.2f} - {max(e):.2f} | {gsd(e):.2f} | "
                     f"{geomean(c):.2f} | {min(c):.2f} - {max(c):.2f} | {gsd(c):.2f} |")
    lines += ["", "Geomean of cuDNN / ours over the tiled cases, **measured**: " + ", ".join(
                  f"{SHORT[op]} {geomean(r['cudnn_measured_s'] / r['measured_s'] for r in tiled if r['op'] == op):.2f}"
                  for op in OPS) + "; the model's: " + ", ".join(
                  f"{SHORT[op]} {geomean(r['cudnn_model_s'] / r['time_s'] for r in tiled if r['op'] == op):.2f}"
                  for op in OPS) + ".", "",
              "| layer | op | limiter (model) | warps/SM | ours model (us) | ours **measured** (us) | error | "
              "reduce model (us) | reduce **measured** (us) | cuDNN model (us) | cuDNN **measured** (us) | error |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in measured:
        cud = f"{_us(r['cudnn_model_s'])} | {_us(r['cudnn_measured_s'])} | {r['cudnn_model_s'] / r['cudnn_measured_s']:.2f}"
        if r["path"] == "direct":
            lines.append(f"| {r['layer']} | {SHORT[r['op']]} | direct, not modelled | - | - | {_us(r['measured_s'])} | "
                         f"- | - | - | {cud} |")
            continue
        lines.append(f"| {r['layer']} | {SHORT[r['op']]} | {r['limiter']} | {r['warps_per_sm']} | {_us(r['time_s'])} | "
                     f"{_us(r['measured_s'])} | {r['time_s'] / r['measured_s']:.2f} | {_us(r['reduce_s'])} | "
                     f"{_us(r['measured_reduce_s'])} | {cud} |")
    return lines + [""]


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return text.lower() == "true"


def _points(text: str) -> tuple[tuple[int, float], ...]:
    """``"8=0.34,16=0.5"`` (or one number for every occupancy) as (warps, efficiency) points."""
    if "=" not in text:
        return ((1, float(text)),)
    return tuple((int(w), float(e)) for w, e in (item.split("=") for item in text.split(",")))


def main(argv=None) -> None:
    d = Assumptions()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("static", help="static report JSON of the kernels to predict (sm_90 records)")
    ap.add_argument("--measured", help="a GPU results folder with ncu_cases.csv.gz and ncu_index.json")
    ap.add_argument("--measured-static", help="static report JSON of the kernels that were measured")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    for name, value in asdict(d).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            ap.add_argument(flag, type=_boolean, default=value, metavar="true|false")
        elif isinstance(value, str):
            ap.add_argument(flag, default=value, choices=("tf32", "fp32"))
        elif isinstance(value, tuple):
            ap.add_argument(flag, type=_points, default=value, metavar="WARPS=EFF,...",
                            help="issue efficiency by resident warps per SM, e.g. 8=0.34,16=0.5")
        else:
            ap.add_argument(flag, type=type(value), default=value)
    args = ap.parse_args(argv)
    a = Assumptions(**{k: getattr(args, k) for k in asdict(d)})
    table = rows(args.static, a, batches=tuple(args.batches))
    measured = None
    if args.measured:
        if not args.measured_static:
            ap.error("--measured needs --measured-static (the measured kernels' static report)")
        measured = measured_rows(args.measured, args.measured_static, a)
    command = "PYTHONPATH=. python benchmarks/conv_table.py " + " ".join(sys.argv[1:] if argv is None else argv)
    bound = rows(args.static, replace(a, issue_efficiency=((1, 1.0),)), batches=tuple(args.batches))
    sys.stdout.write(markdown(table, a, command, args.static, measured, bound))


if __name__ == "__main__":
    main()
