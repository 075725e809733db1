"""benchmarks/conv_table.py: the predicted ResNet-50 convolution table (no GPU, no compile)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gradops._dtypes import bfloat16
from gradops.backends.cuda import _conv_igemm as ig

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ct():
    return _load("conv_table")


def _synthetic_report(ct, path: Path, loop: int = 200, sass: int = 1000, per_sm: int = 2) -> str:
    """A static report with every sm_90 tiled conv-gradient kernel the launchers can pick."""
    kernels = []
    for launcher in ct.LAUNCHERS.values():
        for dtype in (np.float16, bfloat16, np.float32):
            for kind in ig.math_kinds(dtype, ct.ARCH):
                for vector in (False, True):
                    for split in (False, True):
                        kernels.append({"arch": "sm_90", "kernel": launcher._tiled_name(dtype, kind, vector, split),
                                        "sass_instructions": sass, "main_loop": {"instructions": loop},
                                        "occupancy": {"blocks_per_sm": per_sm}})
    for dtype in (np.float16, bfloat16):  # the filter gradient's few-channel kernels
        for channels in ct.WGRAD.FEW_CHANNELS:
            kernels.append({"arch": "sm_90", "kernel": ct.WGRAD._few_channels_name(dtype, channels),
                            "sass_instructions": sass, "main_loop": {"instructions": loop},
                            "occupancy": {"blocks_per_sm": per_sm}})
    path.write_text(json.dumps({"meta": {"commit": "synthetic", "date": "-"}, "kernels": kernels}))
    return str(path)


def test_script_runs_on_a_synthetic_report_and_labels_every_table(ct, tmp_path, capsys):
    report = _synthetic_report(ct, tmp_path / "static.json")
    ct.main([report, "--batches", "32", "--cudnn-efficiency-wgrad", "0.5"])
    out = capsys.readouterr().out
    assert out.startswith("# ") and "**predicted, not measured**" in out.splitlines()[0]
    tables = [line for line in out.splitlines() if line.startswith("## ") and ", batch " in line]
    assert len(tables) == 4  # float16, bfloat16, float32, float32 allow_tf32 at batch 32
    assert all("**predicted, not measured**" in line for line in tables)
    assert "--cudnn-efficiency-wgrad 0.5" in out and "0.50 (wgrad)" in out  # command and parameter written out
    assert "1.98 GHz" in out and "3.35 TB/s" in out


def test_every_prediction_obeys_the_model_invariants(ct, tmp_path):
    a = ct.Assumptions()
    table = ct.rows(_synthetic_report(ct, tmp_path / "static.json"), a)
    assert len(table) == 2 * len(ct.VARIANTS) * 48  # 2 batches x 4 variants x 24 layers x 2 ops
    direct = [r for r in table if r["path"] == "direct"]
    assert {(r["layer"], r["op"]) for r in direct} == {("conv1 7x7/2 3->64", "conv2d_backprop_input")}
    for r in table:
        if r["path"] == "direct":
            continue
        terms = r["terms"]
        assert r["main_s"] == max(terms.values()) and r["time_s"] == pytest.approx(r["main_s"] + r["reduce_s"])
        assert r["time_s"] >= terms["DRAM"] > 0
        assert r["limiter"].split("+")[0] == max(terms, key=terms.get)
        assert ("+reduce" in r["limiter"]) == (r["reduce_s"] > r["time_s"] / 4)
        assert (r["reduce_s"] > 0) == (r["splits"] > 1)
        assert r["ratio"] == pytest.approx(r["cudnn_s"] / r["time_s"])
        assert r["cudnn_s"] >= terms["DRAM"] - 1e-15 or r["splits"] > 1  # ours adds split-K scratch bytes
        assert r["tile_flops"] >= r["flops"]  # the tiles execute at least the useful FLOPs
        assert r["waves"] > 0 and r["ctas"] > 0
    by_key = {(r["batch"], r["dtype"], r["label"], r["op"]): r for r in table}
    for (batch, dtype, label, op), r in by_key.items():
        if batch == 32:
            assert by_key[(256, dtype, label, op)]["flops"] == 8 * r["flops"]


def test_limiter_follows_the_parameters(ct, tmp_path):
    report = _synthetic_report(ct, tmp_path / "static.json")
    a = ct.Assumptions()
    fast_issue = replace(a, issue_efficiency=((1, 1e6),))
    slow_math = replace(fast_issue, mma_sync_fraction=1e-4, bandwidth=1e18)
    half = [r for r in ct.rows(report, slow_math, batches=(32,), variants=ct.VARIANTS[:1]) if r["path"] == "tiled"]
    assert half and all(r["limiter"].startswith("math") for r in half)
    slow_dram = replace(fast_issue, bandwidth=1e6)
    assert all(r["limiter"].startswith("DRAM") for r in ct.rows(report, slow_dram, batches=(32,),
                                                                   variants=ct.VARIANTS[:1]) if r["path"] == "tiled")
    base = {(r["dtype"], r["label"], r["op"]): r["time_s"] for r in ct.rows(report, a, batches=(32,))
            if r["path"] == "tiled"}
    slower = replace(a, issue_efficiency=tuple((w, e / 2) for w, e in a.issue_efficiency))
    for r in ct.rows(report, slower, batches=(32,)):
        if r["path"] == "tiled":
            assert r["time_s"] >= base[(r["dtype"], r["label"], r["op"])] - 1e-15


def test_plan_agrees_with_conv_prediction(ct):
    """The grid this model builds (with the input gradient's split reduction and the launcher's
    tile) gives conv_prediction.warp_k_tiles' warps and warp x k-tiles."""
    cp = _load("conv_prediction")
    for case in ct.resnet50_cases(32):
        g = case.geometry()
        for dtype in (np.float16, np.float32):
            p = ct.plan(case.op, g, dtype)
            if p.path == "direct" or "_few_channels<" in p.kernel:  # (tested below)
                continue
            tile = cp.current_tile(case.op, g, dtype, p.kind)
            assert p.tile == tile[:4]
            warps, warp_tiles = cp.warp_k_tiles(case.op, g, dtype, p.kind, split=True, tile=tile)
            assert p.ctas * p.warps_per_cta == warps
            assert sum(c * p.warps_per_cta * k for c, k in p.groups) == warp_tiles
    # float32 is exact SIMT by default and TF32 tensor cores with allow_tf32; half types use mma.sync
    g = ct.resnet50_cases(32)[2].geometry()
    assert ct.plan(ct.OPS[0], g, np.float32).kind == ig.SIMT
    assert ct.plan(ct.OPS[0], g, np.float32, allow_tf32=True).kind == ig.WMMA_TF32
    assert ct.plan(ct.OPS[0], g, bfloat16).kind == ig.WMMA_HALF


def test_stem_wgrad_plans_the_few_channel_kernel(ct, tmp_path):
    """conv1's filter gradient in a half type runs the few-channel kernel: 147 taps x 64 out
    channels in 3 CTAs of 4 warps, times the launcher's splits, 32 positions per k-tile; with a
    report that lacks the kernel (an older revision's), the general kernel's plan."""
    conv1 = next(c for c in ct.resnet50_cases(32) if c.label.startswith("conv1") and c.op == ct.OPS[0])
    g = conv1.geometry()
    p = ct.plan(conv1.op, g, np.float16)
    splits, split_size = ct.WGRAD.few_channels_split_count(g)
    assert p.kernel == "gradops::conv2d_backprop_filter_few_channels<__half, 3>" and p.splits == splits > 1
    assert p.ctas == 3 * splits and p.warps_per_cta == 4
    assert sum(c * k for c, k in p.groups) == 3 * ig.ceil_div(32 * 112 * 112, 32)
    assert p.reduce_elements == 147 * 64
    assert ct.plan(conv1.op, g, np.float32).kernel != p.kernel  # float32: the general kernel
    general = ct.plan(conv1.op, g, np.float16, few_channels=False)
    assert "_igemm<" in general.kernel
    a = ct.Assumptions()
    report = ct.static_kernels(_synthetic_report(ct, tmp_path / "static.json"))
    assert ct.predict_ours(conv1.op, g, np.float16, False, report, a)["kernel"] == p.kernel
    del report[p.kernel]
    assert ct.predict_ours(conv1.op, g, np.float16, False, report, a)["kernel"] == general.kernel


def test_64_channel_layers_plan_the_narrow_tiles(ct, tmp_path):
    """The launcher's narrower tiles where a 128-wide one would be half padding: conv2's 3x3
    layer (input gradient N = 64 input channels, filter gradient N = 64 output channels) runs
    128 x 64 tiles of 4 warps, the filter gradient of 1x1 64 -> 256 (M = 64 input channels)
    64 x 128; 256-channel GEMMs keep 128 x 128; float32 (SIMT) has only the default.  With a
    report that lacks the narrow kernels (an older revision's), the default tile's plan."""
    cases = {(c.label, c.op): c.geometry() for c in ct.resnet50_cases(32)}
    dgrad, wgrad = ct.suites.CONV_INPUT, ct.suites.CONV_FILTER
    for op in (dgrad, wgrad):
        p = ct.plan(op, cases[("conv2 3x3 64 NHWC", op)], np.float16)
        assert p.tile == (128, 64, 32, 128) and p.warps_per_cta == 4 and p.kernel.endswith(", 128, 64>")
        assert ct.plan(op, cases[("conv2 3x3 64 NHWC", op)], np.float32).tile[:2] == (128, 128)
    assert ct.plan(wgrad, cases[("conv2 1x1 64->256 NHWC", wgrad)], np.float16).tile[:2] == (64, 128)
    assert ct.plan(dgrad, cases[("conv2 1x1 256->64 NHWC", dgrad)], np.float16).tile[:2] == (128, 128)
    g = cases[("conv2 3x3 64 NHWC", dgrad)]
    a = ct.Assumptions()
    report = ct.static_kernels(_synthetic_report(ct, tmp_path / "static.json"))
    narrow = ct.plan(dgrad, g, np.float16)
    row = ct.predict_ours(dgrad, g, np.float16, False, report, a)
    assert row["kernel"] == ct.plan(dgrad, g, np.float16, tiles=False).kernel and row["warps_per_cta"] == 8
    report[narrow.kernel] = dict(report[row["kernel"]])
    row = ct.predict_ours(dgrad, g, np.float16, False, report, a)
    assert row["kernel"] == narrow.kernel and row["warps_per_cta"] == 4


def test_issue_efficiency_points_interpolate(ct):
    a = ct.Assumptions(issue_efficiency=((8, 0.3), (16, 0.5)))
    assert a.issue_eff(4) == 0.3 and a.issue_eff(8) == 0.3 and a.issue_eff(12) == pytest.approx(0.4)
    assert a.issue_eff(16) == 0.5 and a.issue_eff(64) == 0.5
    assert ct._points("8=0.3,16=0.5") == ((8, 0.3), (16, 0.5)) and ct._points("0.7") == ((1, 0.7),)


def test_committed_table_is_labelled():
    text = (BENCHMARKS / "results" / "conv_resnet50_predicted.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ") and ", batch " in line]
    assert len(headings) == 8 and all("**predicted, not measured**" in h for h in headings)
    assert "Generated by `PYTHONPATH=. python benchmarks/conv_table.py benchmarks/results/static_report.json" in text
    # measured figures appear only in the calibration section, in columns marked measured
    before, _, calibration = text.partition("## Calibration")
    assert calibration and "**measured**" in calibration
    assert not [line for line in before.splitlines() if line.startswith("|") and "measured" in line]
    assert not math.isnan(float(before.split("| wgrad | float16 | 256 | 24 | ")[1].split(" |")[0]))


def test_reduction_latency_counts_round_trips(ct):
    """Today's split_reduce: 2 round trips per batch of 32 splits after the first, 1 per tail
    batch of 8, each costing 4 of the measured plain loop's fitted per-split time; the plain
    loop (the measured revision's, --reduce-batched false) keeps splits x that time."""
    a = ct.Assumptions(reduce_per_split_s=100e-9)
    assert a.reduce_latency_s(2) == pytest.approx(400e-9)  # 1 split in a tail batch
    assert a.reduce_latency_s(9) == pytest.approx(400e-9)  # 8: one tail batch
    assert a.reduce_latency_s(33) == pytest.approx(800e-9)  # one batch of 32
    assert a.reduce_latency_s(50) == pytest.approx((2 + 3) * 400e-9)  # 32 + 8 + 8 + 1
    plain = replace(a, reduce_batched=False)
    assert plain.reduce_latency_s(50) == pytest.approx(50 * 100e-9)
    assert ct._boolean("false") is False and ct._boolean("True") is True
    with pytest.raises(Exception):
        ct._boolean("0")
