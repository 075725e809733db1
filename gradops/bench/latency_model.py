"""A latency-aware estimate of kernel time beside the static report's bound (predicted, not measured).

The static report's roofline (:func:`gradops.bench.static_report.roofline`) takes the largest of
four limits and charges no instruction latency or stall, so it is a bound: on the H200
(``benchmarks/results/gpu_h200_2026-11-28``) the kernels took 1.3 to 10.4 times its time. This
module adds one term the bound lacks, a resident warp's own serial work, and three constants
fitted to that run.  For one kernel (a report stage, or a single-kernel row)::

    time = fixed + max(DRAM, L2, busiest pipe, scheduler / issue_efficiency,
                       latency_factor x latency chain + warp instructions / (SMs x resident warps) x cpi / clock)

- ``DRAM``, ``L2``, ``busiest pipe``, ``scheduler`` and ``latency chain`` are the report's own
  limits (``limits_ms``, ``issue_detail``; the latency chain is its ``occupancy`` limit: the
  dependent DRAM round trips of a resident thread).
- The last term is one resident warp's path: its round trips, then its own instructions at
  ``cpi`` clocks each (dependent arithmetic, shared-memory loads and barriers, which more
  resident warps hide only by running beside it, not by shortening it).
- ``fixed``: a kernel's launch-to-end cost on the GPU; not fitted (the error is nearly flat in
  it, see :data:`FIT`), set near the shortest kernel the H200 run measured.

Fitted on every kernel (stage) the H200 run timed under Nsight Compute, against the static
report of the measured commit: ``benchmarks/latency_fit.py`` (its samples and fit are
committed in that folder, ``latency_fit.json``).  The parameters are Hopper's; on the A100 the
same constants are an extrapolation.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

LABEL = "predicted, not measured (latency-aware, fitted to the H200 run of 2026-11-28)"


@dataclass(frozen=True)
class LatencyFit:
    """The estimate's constants (see the module docstring)."""

    fixed_s: float            # per kernel, not fitted
    cpi: float                # clocks per instruction of one warp's own path (at the model's clock)
    latency_factor: float     # x the report's latency chain (its 600 ns round trips)
    issue_efficiency: float   # fraction of one warp-instruction per scheduler per clock reached
    #: How a warp's own path shrinks with resident warps: the path term divides by
    #: REFERENCE_WARPS x (resident warps / REFERENCE_WARPS) ** exponent (1: by the resident warps).
    occupancy_exponent: float = 1.0


#: ``benchmarks/latency_fit.py`` on ``benchmarks/results/gpu_h200_2026-11-28/latency_fit.json``'s
#: 386 kernels: root-mean-square error of log(measured / estimate) 0.28 (the bound's: 1.14);
#: 88% of the kernels within 1.5x (the bound: 2%).  With each kernel family left out of the fit
#: in turn, 73%; the filter gradient's second kernel is the worst (42%, 0.44-1.58x).  Out of
#: sample, on the H100 run of 2026-11-22 (136 kernels of an older revision, input gradient and
#: fractional average pooling): 69% within 1.5x (the bound: 29%), and pessimistic there, a
#: geometric mean of measured / estimate of 0.79 (NHWC input gradients 0.70).
#: ``fixed_s`` was held at 2 us: with it free between 0 and 5 us the error moves only from 0.28
#: to 0.24 (the fit cannot tell it from the other terms), and the run's shortest kernels (the
#: filter gradient's second kernel with one load batch a thread) took 2.3-2.6 us.
#: Launches of few waves: the path term spreads a launch's work evenly over the SMs' resident
#: warps.  In NHWC the H200's kernels under 1.5 waves came out 1.04-1.07x their estimate, those of
#: more 0.85-0.98x (latency_fit.md, "Launches of few waves"; NCHW's few-wave kernels were also
#: its smallest planes, 1.8-2.0x): a choice that gains by fewer, larger CTAs loses about a tenth
#: more than the estimate says.
FIT = LatencyFit(fixed_s=2.0e-6, cpi=8.0, latency_factor=1.5, issue_efficiency=0.5)

#: The H200 samples cannot tell how much resident warps shorten a warp's own path: refitted at
#: each :data:`OCCUPANCY_EXPONENTS` value (``benchmarks/latency_fit.py``, ``latency_fit.md``), the
#: rms error is 0.280 at 0.5, 0.278 at 0.75 and 0.282 at 1 (FIT), 0.317 at 0 (no effect).  Within a
#: kernel family, FIT is pessimistic for the kernels with fewer warps (filter_tiled at 8-12 warps
#: 0.78x, at 16 1.19x), so decisions that trade resident warps for other costs are checked against
#: this fit too, which credits occupancy only by its square root.
SHALLOW_OCCUPANCY = LatencyFit(fixed_s=2.0e-6, cpi=8.5, latency_factor=1.5, issue_efficiency=1.0,
                               occupancy_exponent=0.5)
#: The resident warps at which the path term is the same for every exponent.
REFERENCE_WARPS = 16
#: The exponents ``benchmarks/latency_fit.py`` refits at.
OCCUPANCY_EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25)

#: The grid :func:`fit` searches (``fixed_s`` is held).
GRID = {
    "cpi": tuple(np.round(np.arange(1.0, 16.01, 0.5), 2)),
    "latency_factor": tuple(np.round(np.arange(1.0, 4.01, 0.25), 2)),
    "issue_efficiency": (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3),
}

#: A sample's fields (seconds, but ``warp_instructions``, ``resident_warps_per_sm``, ``sms``,
#: ``clock_hz``), as :func:`stage_features` returns them.
FEATURES = ("dram_s", "l2_s", "pipe_s", "scheduler_s", "chain_s", "warp_instructions",
            "resident_warps_per_sm", "sms", "clock_hz")


def stage_features(stage: dict, device: dict, bandwidth: float | None = None) -> dict:
    """The estimate's inputs from one static-report stage (or single-kernel row) on ``device``
    (a report ``meta.devices`` entry); ``bandwidth`` re-targets the DRAM limit to another HBM."""
    limits, issue = stage["limits_ms"], stage["issue_detail"]
    dram = limits["DRAM"] / 1e3
    if bandwidth:
        dram *= device["bandwidth"] / bandwidth
    return {"dram_s": dram, "l2_s": limits["L2"] / 1e3, "pipe_s": issue["busiest_pipe_s"],
            "scheduler_s": issue["scheduler_s"], "chain_s": limits["occupancy"] / 1e3,
            "warp_instructions": stage["warp_instructions"],
            "resident_warps_per_sm": stage["resident_warps_per_sm"], "sms": device["sms"],
            "clock_hz": device["clock_hz"]}


def _parallel_warps(warps, exponent: float):
    """The resident warps per SM a warp's own path is divided by (``warps`` itself at exponent 1)."""
    return REFERENCE_WARPS * (np.asarray(warps, dtype=float) / REFERENCE_WARPS) ** exponent


def _terms(x: dict, fit: LatencyFit) -> dict:
    warps = x["resident_warps_per_sm"]
    own = (x["warp_instructions"] / (x["sms"] * float(_parallel_warps(warps, fit.occupancy_exponent)))
           * fit.cpi / x["clock_hz"]) if warps else math.inf
    return {"DRAM": x["dram_s"], "L2": x["l2_s"], "pipe": x["pipe_s"],
            "issue": x["scheduler_s"] / fit.issue_efficiency,
            "warp path": fit.latency_factor * x["chain_s"] + own}


def estimate(x: dict, fit: LatencyFit = FIT) -> tuple[float, str]:
    """(seconds, the largest term's name) of one kernel from its :func:`stage_features`."""
    terms = _terms(x, fit)
    term = max(terms, key=terms.get)
    return fit.fixed_s + terms[term], term


def prediction_estimate(p: dict, device: dict, fit: LatencyFit = FIT) -> tuple[float, str]:
    """(seconds, the dearest kernel's largest term) of one modelled static-report prediction on
    ``device`` (a report ``meta.devices`` entry); a two-kernel row sums its stages."""
    parts = [(estimate(stage_features(s, device), fit), s.get("stage")) for s in (p.get("stages") or [p])]
    seconds = sum(t for (t, _), _ in parts)
    (_, term), stage = max(parts, key=lambda part: part[0][0])
    return seconds, f"{term} ({stage})" if stage else term


def annotate(report: dict, fit: LatencyFit = FIT) -> int:
    """Adds ``latency_aware`` (ms, % of HBM, the dearest kernel's largest term) to every modelled
    prediction of a static report (:func:`prediction_estimate`).  Returns the rows done."""
    devices = {d["key"]: d for d in report["meta"]["devices"]}
    done = 0
    for p in report["predictions"]:
        if "not_modelled" in p:
            continue
        device = devices[p["device"]]
        seconds, term = prediction_estimate(p, device, fit)
        traffic = p.get("compulsory_bytes", p["bytes"])
        p["latency_aware"] = {"ms": seconds * 1e3, "pct_hbm": 100 * traffic / seconds / device["bandwidth"],
                              "term": term}
        done += 1
    report["meta"]["latency_model"] = {"label": LABEL, **asdict(fit)}
    return done


def log_errors(samples: list[dict], fit: LatencyFit = FIT) -> np.ndarray:
    """log(measured / estimate) of each sample (a :func:`stage_features` dict with ``measured_s``)."""
    return np.array([math.log(s["measured_s"] / estimate(s, fit)[0]) for s in samples])


def fit(samples: list[dict], fixed_s: float = FIT.fixed_s, grid: dict = GRID,
        occupancy_exponent: float = 1.0) -> tuple[LatencyFit, float]:
    """The :data:`GRID` point with the least mean squared log error over ``samples`` (ties: the
    first in grid order) at ``occupancy_exponent``, and that root-mean-square error."""
    col = {k: np.array([s[k] for s in samples], dtype=float) for k in FEATURES + ("measured_s",)}
    bound = np.maximum.reduce([col["dram_s"], col["l2_s"], col["pipe_s"]])
    warps = col["resident_warps_per_sm"]
    parallel = _parallel_warps(np.maximum(warps, 1), occupancy_exponent)
    own = np.where(warps > 0, col["warp_instructions"] / (col["sms"] * parallel) / col["clock_hz"], np.inf)
    cpi = np.array(grid["cpi"])[:, None, None]
    factor = np.array(grid["latency_factor"])[None, :, None]
    path = factor * col["chain_s"] + cpi * own                              # cpi x factor x samples
    measured = np.log(col["measured_s"])
    best = None
    for efficiency in grid["issue_efficiency"]:
        inner = np.maximum(np.maximum(bound, col["scheduler_s"] / efficiency), path)
        err = ((measured - np.log(fixed_s + inner)) ** 2).mean(axis=2)
        i, j = np.unravel_index(np.argmin(err), err.shape)
        if best is None or err[i, j] < best[0]:
            best = (float(err[i, j]), LatencyFit(fixed_s, float(grid["cpi"][i]), float(grid["latency_factor"][j]),
                                                 float(efficiency), float(occupancy_exponent)))
    return best[1], math.sqrt(best[0])
