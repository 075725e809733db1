"""The static report's latency-aware estimate (gradops.bench.latency_model) and its fit.

The fit's data are the H200 run's measured kernel times with their modelled stages, committed in
``benchmarks/results/gpu_h200_2026-11-28/latency_fit.json`` by ``benchmarks/latency_fit.py``.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

from gradops.bench import latency_model as lm
from gradops.bench import static_report as sr

ROOT = Path(__file__).resolve().parents[1]
FIT_JSON = ROOT / "benchmarks" / "results" / "gpu_h200_2026-11-28" / "latency_fit.json"
H100 = {"key": "H100 SXM", "sms": 132, "clock_hz": 1.755e9, "bandwidth": 3.35e12}


def _stage(dram_ms=0.01, l2_ms=0.005, scheduler_s=4e-6, pipe_s=1e-6, chain_ms=0.002, warp_instructions=1e6,
           warps=16, name=None):
    stage = {"limits_ms": {"DRAM": dram_ms, "L2": l2_ms, "issue": max(scheduler_s, pipe_s) * 1e3,
                           "occupancy": chain_ms},
             "issue_detail": {"scheduler_s": scheduler_s, "busiest_pipe": "int", "busiest_pipe_s": pipe_s},
             "warp_instructions": warp_instructions, "resident_warps_per_sm": warps}
    return dict(stage, stage=name, kernel=name) if name else stage


def test_estimate_by_hand():
    """fixed + the largest of the terms; the warp path is 1.5 x the chain + a warp's own
    instructions at 8 clocks."""
    fit = lm.LatencyFit(fixed_s=2e-6, cpi=8.0, latency_factor=1.5, issue_efficiency=0.5)
    x = lm.stage_features(_stage(), H100)
    own = 1e6 / (132 * 16) * 8 / 1.755e9
    seconds, term = lm.estimate(x, fit)
    assert term == "DRAM" and seconds == pytest.approx(2e-6 + 10e-6)
    x = lm.stage_features(_stage(dram_ms=0.001, chain_ms=0.004), H100)
    seconds, term = lm.estimate(x, fit)
    assert term == "warp path" and seconds == pytest.approx(2e-6 + 1.5 * 4e-6 + own)
    # fewer resident warps lengthen each warp's own path
    assert lm.estimate(lm.stage_features(_stage(dram_ms=0.001, chain_ms=0.004, warps=8), H100), fit)[0] > seconds
    x = lm.stage_features(_stage(dram_ms=0.001, scheduler_s=20e-6, chain_ms=0.0), H100)
    assert lm.estimate(x, fit) == (pytest.approx(2e-6 + 40e-6), "issue")
    # no resident warp: the kernel cannot run, the estimate says so
    assert lm.estimate(lm.stage_features(_stage(warps=0), H100), fit)[0] == math.inf


def test_dram_is_retargeted_to_another_bandwidth():
    x = lm.stage_features(_stage(dram_ms=0.048), H100, bandwidth=4.8e12)
    assert x["dram_s"] == pytest.approx(48e-6 * 3.35 / 4.8)


def test_annotate_sums_the_stages_and_names_the_dearer():
    report = {"meta": {"devices": [H100]}, "predictions": [
        {"device": "H100 SXM", "bytes": 1e8, "compulsory_bytes": 3.35e7,
         "stages": [_stage(name="tiled"), _stage(dram_ms=0.0, l2_ms=0.0, scheduler_s=1e-8, pipe_s=1e-8, chain_ms=0.0012,
                                                 warp_instructions=100.0, warps=64, name="reduce")]},
        {"device": "H100 SXM", "bytes": 3.35e7, **_stage()},
        {"device": "H100 SXM", "not_modelled": "not modelled: x"}]}
    assert lm.annotate(report) == 2
    two, one, skipped = report["predictions"]
    tiled = lm.estimate(lm.stage_features(_stage(), H100))[0]
    reduce_ = lm.FIT.fixed_s + lm.FIT.latency_factor * 1.2e-6 + 100 / (132 * 64) * lm.FIT.cpi / 1.755e9
    assert two["latency_aware"]["ms"] == pytest.approx((tiled + reduce_) * 1e3)
    assert two["latency_aware"]["term"] == "DRAM (tiled)"
    # % of HBM from the compulsory bytes, not the stages' own
    assert two["latency_aware"]["pct_hbm"] == pytest.approx(100 * 3.35e7 / (tiled + reduce_) / 3.35e12)
    assert one["latency_aware"]["term"] == "DRAM" and "latency_aware" not in skipped
    assert report["meta"]["latency_model"]["cpi"] == lm.FIT.cpi


def test_fit_recovers_planted_constants():
    """Samples timed by known constants on the grid: the fit returns them with zero error."""
    rng = np.random.default_rng(5)
    truth = lm.LatencyFit(fixed_s=2e-6, cpi=6.5, latency_factor=2.25, issue_efficiency=0.6)
    data = []
    for _ in range(200):
        x = lm.stage_features(_stage(dram_ms=rng.uniform(0.001, 0.05), l2_ms=rng.uniform(0.001, 0.05),
                                     scheduler_s=rng.uniform(1e-6, 4e-5), pipe_s=rng.uniform(1e-7, 1e-5),
                                     chain_ms=rng.uniform(0.0005, 0.02), warp_instructions=rng.uniform(1e5, 3e7),
                                     warps=int(rng.choice([8, 12, 16, 24, 32, 48, 64]))), H100)
        data.append(dict(x, measured_s=lm.estimate(x, truth)[0]))
    got, rms = lm.fit(data, fixed_s=truth.fixed_s)
    assert got == truth and rms == pytest.approx(0.0, abs=1e-12)


def test_committed_fit_is_reproduced_from_its_samples():
    """FIT is what the fit gives on the committed H200 samples, with the error its docstring
    states; the samples are the run's 386 kernels of every measured family."""
    data = json.loads(FIT_JSON.read_text())
    samples = data["samples"]
    assert len(samples) == 386 and data["fit"] == lm.FIT.__dict__
    got, rms = lm.fit(samples)
    assert got == lm.FIT and rms == pytest.approx(data["rms_log"]) and 0.27 < rms < 0.29
    errors = lm.log_errors(samples)
    assert np.mean(np.abs(errors) < math.log(1.5)) == pytest.approx(data["in_sample"]["within_1_5x"])
    bound = np.array([math.log(s["measured_s"] / s["bound_s"]) for s in samples])
    assert np.sqrt(np.mean(bound ** 2)) > 1.1  # the bound's own error, for contrast
    assert {s["family"] for s in samples} >= {"input_tiled", "filter_tiled", "filter_planes", "filter_mma",
                                                "filter_reduce", "fractional_avg_pool_grad"}


def test_fit_script_refits_from_the_committed_samples(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import latency_fit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "latency_fit.json").write_text(FIT_JSON.read_text())
    assert latency_fit.main([str(folder), "--samples-only"]) == 0
    again = json.loads((folder / "latency_fit.json").read_text())
    committed = json.loads(FIT_JSON.read_text())
    assert again["fit"] == committed["fit"] and again["left_out"] == pytest.approx(committed["left_out"])
    text = (folder / "latency_fit.md").read_text()
    assert "| **all** | 386 |" in text and "cpi 8.0" in text
    # the committed constants are this run's fit: on its samples they err as the fit does
    assert again["committed"]["fit"] == committed["fit"]
    assert again["committed"]["rms_log"] == pytest.approx(again["rms_log"])
    assert "- **The committed constants** (`latency_model.FIT`: cpi 8.0" in text
    assert again["report_commit"] == committed["report_commit"] and again["device"] == committed["device"]
    # out of sample: the H100 run's kernels, which the fit never saw
    other = again["other_run"]
    for kind in ("estimate", "bound"):
        assert other[kind] == pytest.approx(committed["other_run"][kind])
    assert other["estimate"]["n"] == 136
    assert other["estimate"]["within_1_5x"] > 2 * other["bound"]["within_1_5x"]
    assert "## Out of sample: the H100 run of 2026-11-22" in text
    # the errors by waves: the same from the committed samples' waves
    # (approx compares a list's dicts exactly, so each row is compared on its own: another
    # NumPy's summation order moves the geometric means by an ulp)
    assert len(again["by_waves"]) == len(committed["by_waves"]) and "## Launches of few waves" in text
    for row, committed_row in zip(again["by_waves"], committed["by_waves"]):
        assert row == pytest.approx(committed_row)


def test_waves_of_a_stage_and_the_errors_by_waves():
    """stage_waves: CTAs / (SMs x CTAs an SM), the CTAs an SM from the plan or from its threads
    and the resident warps; None where the plan gives neither.  by_waves bins the samples by it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import latency_fit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert latency_fit.stage_waves({"tiled": {"ctas": 396, "blocks_per_sm": 2}}, H100) == pytest.approx(1.5)
    assert latency_fit.stage_waves({"tiled": {"ctas": 264, "threads_per_cta": 256}, "resident_warps_per_sm": 16},
                                   H100) == pytest.approx(1.0)
    assert latency_fit.stage_waves({"tiled": {"ctas": 264}, "resident_warps_per_sm": 16}, H100) is None
    assert latency_fit.stage_waves({"resident_warps_per_sm": 16}, H100) is None
    data = [{"waves": 0.5, "label": "a NHWC"}, {"waves": 1.2, "label": "b NHWC"}, {"waves": 1.4, "label": "c NCHW"},
            {"waves": 9.0, "label": "d NHWC"}, {"label": "e NCHW"}]
    bins = latency_fit.by_waves(data, np.log(np.array([2.0, 1.5, 1.5, 1.0, 1.0])))
    assert [(b["layout"], b["low"], b["n"]) for b in bins] == [
        ("NHWC", 0.0, 1), ("NHWC", 1.0, 1), ("NHWC", 5.0, 1), ("NCHW", 1.0, 1), (None, None, 1)]
    assert bins[1]["geomean_ratio"] == pytest.approx(1.5) and bins[0]["within_1_5x"] == 0.0
    # the committed run: every sample in one bin; NHWC launches of few waves came out above their
    # estimate, those of more waves below it
    committed = json.loads(FIT_JSON.read_text())["by_waves"]
    assert sum(b["n"] for b in committed) == 386
    nhwc = [b for b in committed if b["layout"] == "NHWC"]
    few = [b["geomean_ratio"] for b in nhwc if b["high"] <= latency_fit.FEW_WAVES]
    many = [b["geomean_ratio"] for b in nhwc if b["low"] >= latency_fit.FEW_WAVES]
    assert few and many and min(few) > 1.0 > max(many)


def test_other_run_samples_rebuild_the_bound():
    """The H100 run's samples: the bound rebuilt from their limits is the prediction that run's
    calibration recorded, and the scheduler limit from the rebuilt warp-instructions is at most
    its issue limit (which also holds the pipes)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import latency_fit
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    data = json.loads(latency_fit.OTHER_RUN.read_text())
    samples = latency_fit.other_run_samples()
    assert len(samples) == len(data["rows"]) == 136
    for s, r in zip(samples, data["rows"]):
        limits = r["predicted"]["limits_ms"]
        assert s["bound_s"] == pytest.approx(max(limits.values()) / 1e3)
        assert s["scheduler_s"] <= limits["issue"] / 1e3 * (1 + 1e-9)
        assert s["resident_warps_per_sm"] in range(4, 65)


def test_report_markdown_has_both_estimates():
    report = {"meta": {"devices": [dict(H100, arch=90, l2_bandwidth=6.5e12, dram_latency_s=6e-7,
                                        issue_efficiency=1.0)],
                       "commit": "x", "date": "d", "archs": ["sm_90"], "assumptions": [],
                       "tools": {"nvrtc": "-", "nvdisasm": "-", "cuobjdump": "-"}},
              "kernels": [],
              "predictions": [{"suite": "mobilenetv2", "label": "dw1 NHWC",
                               "op": "depthwise_conv2d_native_backprop_input", "dtype": "float16", "device": "H100 SXM", "bytes": 3.35e7, "sass_per_element": 10.0,
                               "budget_per_element_75pct_hbm": 40.0, "limiter": "DRAM", "predicted_ms": 0.01,
                               "pct_hbm": 100.0, **_stage()}]}
    lm.annotate(report)
    text = sr.markdown(report)
    la = report["predictions"][0]["latency_aware"]
    assert f"| 0.010 | 100.0 | {la['ms']:.3f} (DRAM) | {la['pct_hbm']:.1f} |" in text
    assert la["pct_hbm"] == pytest.approx(100 * 10 / 12)  # 2 us fixed + the 10 us DRAM term
    assert "| H100 SXM | 1 | 1 | 1 | 1 | 1 |" in text
    report["predictions"][0]["latency_aware"]["pct_hbm"] = 60.0
    assert "| H100 SXM | 1 | 1 | 0 | 1 | 1 |" in sr.markdown(report)


def test_occupancy_exponent_by_hand():
    """A warp's own path divides by 16 x (resident warps / 16) ** exponent: at 1 by the resident
    warps (the same figure as before the exponent existed), at 0.5 by 4 x their square root; at 16
    warps every exponent agrees."""
    def path_bound(warps):  # a kernel whose warp path is its largest term at every exponent
        return lm.stage_features(_stage(dram_ms=0.001, chain_ms=0.0, scheduler_s=1e-7, pipe_s=1e-8,
                                        warp_instructions=1e8, warps=warps), H100)

    x = path_bound(64)
    for exponent, parallel in ((1.0, 64), (0.5, 16 * 2), (0.0, 16)):
        fit = lm.LatencyFit(fixed_s=0.0, cpi=8.0, latency_factor=1.5, issue_efficiency=0.5,
                            occupancy_exponent=exponent)
        assert lm.estimate(x, fit) == (pytest.approx(1e8 / (132 * parallel) * 8 / 1.755e9), "warp path")
    assert len({lm.estimate(path_bound(16), lm.LatencyFit(0.0, 8.0, 1.5, 0.5, e))[0]
                for e in lm.OCCUPANCY_EXPONENTS}) == 1
    assert lm.estimate(x, lm.FIT)[0] == lm.FIT.fixed_s + 1e8 / (132 * 64) * 8 / 1.755e9  # bit for bit


def test_shallow_occupancy_is_the_refit_at_exponent_one_half():
    """SHALLOW_OCCUPANCY is the committed samples' fit at exponent 0.5, as good a fit as FIT
    (within 0.005 of its rms error), and the committed scan says so."""
    data = json.loads(FIT_JSON.read_text())
    got, rms = lm.fit(data["samples"], occupancy_exponent=0.5)
    assert got == lm.SHALLOW_OCCUPANCY and abs(rms - data["rms_log"]) < 0.005
    scan = {e["fit"]["occupancy_exponent"]: e["rms_log"] for e in data["occupancy_exponents"]}
    assert set(scan) == set(lm.OCCUPANCY_EXPONENTS) and scan[1.0] == pytest.approx(data["rms_log"])
    assert scan[0.0] > max(scan[0.5], scan[0.75], scan[1.0]) + 0.03  # resident warps matter
