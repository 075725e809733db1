"""The benchmark harness (gradops.bench) on a CPU: suites, formulas, agreement checks, CPU mode.

The GPU engines (gradops cuda/cudnn, PyTorch, JAX) need a GPU; here the logic around them is
tested with fake engines, the gradops-cuda engine runs on the CPU stand-in of
tests/cuda_host.py (timer excepted), and the CPU mode (NumPy backend vs tensorflow-cpu) runs
for real.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gradops
from gradops.bench import check, metrics, report, runner, suites
from gradops.bench.engines import Engine, NumpyEngine, _symmetric_padding, call_gradops
from gradops.bench.timing import TimingSettings

REPO = Path(__file__).resolve().parents[1]


def _find(suite_name, layer, op, layout="NHWC"):
    matches = [c for c in suites.suite(suite_name) if c.layer == layer and c.op == op and c.data_format == layout]
    assert len(matches) == 1, (suite_name, layer, op, layout, matches)
    return matches[0]


# --------------------------------------------------------------------------- suites


@pytest.mark.parametrize("name", suites.SUITES)
def test_every_case_passes_gradops_validation(name):
    cases = suites.suite(name)
    assert cases
    for case in cases:
        case.geometry()  # raises InvalidArgumentError for a call gradops would refuse
        assert case.op in suites.OPS
        assert case.dtypes and set(case.dtypes) <= set(suites.DTYPES)
    labels = [(c.label, c.op, c.data_format) for c in cases]
    assert len(labels) == len(set(labels)), "duplicate cases"


def test_suites_cover_what_the_issue_names():
    resnet = suites.suite("resnet50")
    assert {c.batch for c in resnet} == {32}
    stem = _find("resnet50", "conv1 7x7/2 3->64", "conv2d_backprop_filter")
    assert stem.filter_shape == (7, 7, 3, 64) and stem.strides == (2, 2) and stem.input_shape == (32, 224, 224, 3)
    kinds = {(c.filter_shape[:2], c.strides) for c in resnet}
    assert {((1, 1), (1, 1)), ((3, 3), (1, 1)), ((3, 3), (2, 2)), ((1, 1), (2, 2))} <= kinds
    for stage in ("conv2", "conv3", "conv4", "conv5"):
        assert any(c.layer.startswith(stage + " 3x3") for c in resnet)
        assert any(c.layer.startswith(stage + " 1x1") for c in resnet)
    mobilenet = suites.suite("mobilenetv2")
    assert {c.filter_shape[3] for c in mobilenet} == {1, 2}
    assert {c.strides for c in mobilenet} == {(1, 1), (2, 2)}
    assert {c.input_shape[1:] for c in mobilenet} >= {(112, 112, 32), (7, 7, 960)}
    assert {c.filter_shape[:2] for c in suites.suite("efficientnet")} == {(5, 5)}
    fractional = suites.suite("fractional")
    for op in suites.FRACTIONAL_OPS:  # average and max on the same shapes
        assert {(c.input_shape, c.overlapping) for c in fractional if c.op == op} == {
            ((32, 112, 112, 64), False), ((32, 112, 112, 64), True), ((32, 56, 56, 256), False),
            ((32, 56, 56, 256), True)}
    assert {c.pooling_ratio for c in fractional} == {1.44}
    # The forward poolings: the gradients' shapes, sequences and dtypes, in a suite of their own.
    forward = suites.suite("fractional_forward")
    assert {c.op for c in forward} == set(suites.FRACTIONAL_FORWARD_OPS)
    for op, grad in zip(suites.FRACTIONAL_FORWARD_OPS, suites.FRACTIONAL_OPS):
        assert [(c.label, c.input_shape, c.overlapping, c.seed, c.dtypes) for c in forward if c.op == op] == [
            (c.label, c.input_shape, c.overlapping, c.seed, c.dtypes) for c in fractional if c.op == grad]
    # The depthwise filter gradient is benchmarked on exactly the layers of the input gradient.
    for name in ("mobilenetv2", "efficientnet"):
        layers = {op: {(c.label, c.input_shape, c.filter_shape, c.strides, c.padding, c.dtypes)
                       for c in suites.suite(name) if c.op == op} for op in suites.DEPTHWISE_OPS}
        assert layers[suites.DEPTHWISE_INPUT] and layers[suites.DEPTHWISE_INPUT] == layers[suites.DEPTHWISE_FILTER]
    for name in ("resnet50", "mobilenetv2", "efficientnet"):
        assert {c.data_format for c in suites.suite(name)} == {"NHWC", "NCHW"}
        assert any("float64" in c.dtypes for c in suites.suite(name)) or name == "efficientnet"
    every = [c for name in suites.ALL for c in suites.suite(name)]
    assert all(set(suites.HALF_AND_SINGLE) <= set(c.dtypes) for c in every)
    assert any("float64" in c.dtypes for c in every)
    smoke = suites.suite("smoke")
    assert {c.op for c in smoke} == set(suites.OPS)
    assert {d for c in smoke for d in c.dtypes} == set(suites.DTYPES)


def test_numpy_vs_tf_suite_keeps_the_original_case_list():
    names = [(c.op, c.label) for c in suites.suite("numpy_vs_tf")]
    committed = json.loads((REPO / "benchmarks" / "results" / "numpy_vs_tf.json").read_text())["rows"]
    assert names == [(r["op"], r["case"]) for r in committed]


# --------------------------------------------------------------------------- formulas


def test_flops_and_bytes_by_hand():
    case = _find("resnet50", "conv2 3x3 64", "conv2d_backprop_filter")
    g = case.geometry()
    # 2 * N * OH * OW * KH * KW * Cin * Cout = 2 * 32 * 56 * 56 * 3 * 3 * 64 * 64
    assert metrics.flops(case, g) == 7_398_752_256
    # float16: x (32*56*56*64 = 6,422,528) + dy (same) read, dW (3*3*64*64 = 36,864) written
    assert metrics.bytes_moved(case, g, 2) == 2 * (6_422_528 + 6_422_528 + 36_864)

    dw = _find("mobilenetv2", "dw2 112x112x96 3x3/2 m1", "depthwise_conv2d_native_backprop_input")
    g = dw.geometry()
    # groups = C: 2 * 32 * 56 * 56 * 3 * 3 * 96 (Cin / groups = 1, Cout = 96)
    assert metrics.flops(dw, g) == 173_408_256
    # float32: filter 3*3*96 + dy 32*56*56*96 read, dx 32*112*112*96 written
    assert metrics.bytes_moved(dw, g, 4) == 4 * (864 + 9_633_792 + 38_535_168)
    assert metrics.result_bytes(dw, g, 4) == 4 * 38_535_168  # dx

    frac = [c for c in suites.suite("fractional") if c.input_shape == (32, 112, 112, 64) and not c.overlapping][0]
    g = frac.geometry()
    assert g.out_rows == g.out_cols == 77  # floor(112 / 1.44)
    assert metrics.flops(frac, g) is None
    # bfloat16: dy 32*77*77*64 read, dx 32*112*112*64 written
    assert metrics.bytes_moved(frac, g, 2) == 2 * (12_142_592 + 25_690_112)
    assert metrics.result_bytes(frac, g, 2) == 2 * 25_690_112
    assert metrics.result_bytes(case, case.geometry(), 2) == 2 * 36_864  # dW of the conv filter gradient

    dwf = _find("mobilenetv2", "dw2 112x112x96 3x3/2 m1", "depthwise_conv2d_native_backprop_filter")
    g = dwf.geometry()
    assert metrics.flops(dwf, g) == 173_408_256  # the forward's count, as for the input gradient
    # float32: x 32*112*112*96 + dy 32*56*56*96 read, dW 3*3*96 written
    assert metrics.bytes_moved(dwf, g, 4) == 4 * (38_535_168 + 9_633_792 + 864)
    assert metrics.memory_bound(dwf)

    fmax = [c for c in suites.suite("fractional") if c.op == "fractional_max_pool_grad"
            and c.input_shape == (32, 112, 112, 64) and not c.overlapping][0]
    g = fmax.geometry()
    assert (g.out_rows, g.out_cols) == (77, 77) and metrics.flops(fmax, g) is None
    # float16: orig_input 32*112*112*64 + orig_output and dy 32*77*77*64 read, dx 32*112*112*64 written
    assert metrics.bytes_moved(fmax, g, 2) == 2 * (25_690_112 + 2 * 12_142_592 + 25_690_112)
    assert metrics.memory_bound(fmax)


def test_fractional_max_inputs_hold_the_real_forward_output():
    """orig_output is the max pooling of orig_input over the case's cells (the op refuses
    anything else), also after the small check's batch slice; sequences as the average case's."""
    import gradops
    from gradops.bench.engines import batch_slice, make_inputs

    case = [c for c in suites.suite("smoke") if c.op == "fractional_max_pool_grad" and c.overlapping][0]
    avg = [c for c in suites.suite("smoke") if c.op == "fractional_avg_pool_grad" and c.overlapping][0]
    rows, cols = case.pooling_sequences()
    assert all(np.array_equal(a, b) for a, b in zip((rows, cols), avg.pooling_sequences()))
    arrays = make_inputs(case, np.dtype(np.float16), np.random.default_rng(1))
    x = arrays["orig_input"]
    assert x.dtype == np.float16 and arrays["orig_output"].dtype == np.float16
    g = case.geometry()
    for r in range(g.out_rows):
        for q in range(g.out_cols):
            cell = x[:, g.row_starts[r]:g.row_ends[r] + 1, g.col_starts[q]:g.col_ends[q] + 1, :]
            np.testing.assert_array_equal(arrays["orig_output"][:, r, q, :], cell.max(axis=(1, 2)))
    small, sliced = batch_slice(case, arrays, 2)
    assert sliced["orig_input"].shape[0] == sliced["orig_output"].shape[0] == sliced["out_backprop"].shape[0] == 2
    np.testing.assert_array_equal(sliced["orig_output"],
                                  gradops.fractional_max_pool(sliced["orig_input"], rows, cols, True))


def test_peaks_table_and_roofline():
    h100 = metrics.peaks_for("NVIDIA H100 80GB HBM3")
    assert h100.device == "H100 SXM" and h100.bandwidth == 3.35e12
    assert h100.fp16_tensor == h100.bf16_tensor == 989.5e12  # 1979 with sparsity, halved
    assert h100.compute(np.dtype(np.float32), allow_tf32=False) == 67e12
    assert h100.compute(np.dtype(np.float32), allow_tf32=True) == 494.5e12
    assert metrics.peaks_for("NVIDIA H100 PCIe").device == "H100 PCIe"
    assert metrics.peaks_for("NVIDIA H200").device == "H200 SXM"
    assert metrics.peaks_for("NVIDIA H200 NVL").bandwidth == 4.8e12
    assert metrics.peaks_for("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None
    assert metrics.peaks_for("Some Future GPU") is None

    conv = _find("resnet50", "conv2 3x3 64", "conv2d_backprop_input")
    out = metrics.throughput(conv, 989.5e9, 3.35e9, 2e-3, np.dtype(np.float16), h100, False)
    assert out["tflops"] == pytest.approx(494.75)  # 989.5 GFLOP in 2 ms
    assert out["gbps"] == pytest.approx(1675.0)
    assert out["pct_peak"] == pytest.approx(50.0)  # compute-bound op: % of the FP16 tensor peak
    # Roofline time: max(989.5e9 / 989.5e12, 3.35e9 / 3.35e12) = 1 ms, measured 2 ms.
    assert out["pct_roofline"] == pytest.approx(50.0)
    dw = _find("mobilenetv2", "dw1 112x112x32 3x3/1 m1", "depthwise_conv2d_native_backprop_input")
    out = metrics.throughput(dw, 1e9, 3.35e9, 4e-3, np.dtype(np.float32), h100, False)
    assert out["pct_peak"] == pytest.approx(25.0)  # memory-bound op: % of bandwidth
    assert out["pct_roofline"] == pytest.approx(25.0)
    assert metrics.throughput(dw, 1e9, 1e9, 1e-3, np.dtype(np.float32), None, False)["pct_peak"] is None


def test_torch_padding_split_for_tf_same():
    stem = _find("resnet50", "conv1 7x7/2 3->64", "conv2d_backprop_input")
    g = stem.geometry()
    assert (g.pad_top, g.pad_bottom, g.pad_left, g.pad_right) == (2, 3, 2, 3)  # odd total: extra at bottom/right
    assert _symmetric_padding(stem) == ((2, 2), (0, 1, 0, 1))
    smoke = [c for c in suites.suite("smoke") if c.padding == "EXPLICIT"][0]  # pads (2, 1), (0, 3)
    assert _symmetric_padding(smoke) == ((1, 0), (1, 0, 0, 3))


# --------------------------------------------------------------------------- agreement


def test_rel_error_and_vote():
    a = np.arange(10.0)
    assert check.rel_error(a, a) == 0.0
    assert check.rel_error(a + 0.09, a) == pytest.approx(0.01)  # 0.09 / max(1, 9)
    assert check.rel_error(a[:5], a) == float("inf")
    assert check.rel_error(np.full(3, np.nan), np.zeros(3)) == float("inf")

    wrong = a * 1.01
    verdicts, pairwise = check.by_vote({"x": a, "y": a + 1e-9, "z": wrong}, 1e-5)
    assert verdicts["x"].ok and verdicts["y"].ok and not verdicts["z"].ok
    assert "disagrees with x, y" in verdicts["z"].note
    assert pairwise["x"]["z"] == pairwise["z"]["x"] > 1e-5
    verdicts, _ = check.by_vote({"x": a, "z": wrong}, 1e-5)  # two that disagree: no way to tell who is right
    assert not verdicts["x"].ok and not verdicts["z"].ok
    verdicts, _ = check.by_vote({"x": a}, 1e-5)
    assert verdicts["x"].ok and "no other engine" in verdicts["x"].note
    verdicts = check.against_reference({"x": a, "z": wrong}, a, 1e-5)
    assert verdicts["x"].ok and not verdicts["z"].ok


class _Fake(Engine):
    """Computes the op with the NumPy backend, then applies ``corrupt(result, case)``."""

    def __init__(self, name, corrupt=None, fail=None, supported=True):
        self.name, self.corrupt, self.fail, self.supported = name, corrupt, fail, supported
        self.prepared_batches = []

    def supports(self, case, dtype):
        return (True, "supported") if self.supported else (False, "fake engine lacks this op")

    def prepare(self, case, dtype, arrays):
        self.prepared_batches.append(case.batch)

        def fn():
            if self.fail:
                raise RuntimeError(self.fail)
            out = call_gradops(case, arrays, "numpy")
            return self.corrupt(out, case) if self.corrupt else out

        return fn


def test_runner_reports_errors_and_mismatches_and_times_only_agreeing_engines():
    case = [c for c in suites.suite("smoke") if c.op == "conv2d_backprop_input" and c.data_format == "NHWC"][0]
    engines = [
        NumpyEngine(),
        _Fake("gradops-cuda"),  # right
        _Fake("gradops-cudnn", corrupt=lambda out, c: out * np.asarray(1.001, out.dtype)),  # wrong everywhere
        _Fake("torch", corrupt=lambda out, c: out + (1 if c.batch > 2 else 0)),  # right only at the small batch
        _Fake("jax", fail="boom"),
        _Fake("other", supported=False),
    ]
    times = {"numpy": 4.0, "gradops-cuda": 1.0, "gradops-cudnn": 2.0, "torch": 3.0}
    timed = []

    def timer(engine, fn, settings):
        fn()
        timed.append(engine.name)
        return times[engine.name] * 1e-3

    r = runner.Runner(engines, "gpu", TimingSettings(), timer=timer)
    row = r.run_case(case, "float32")
    status = {name: e["status"] for name, e in row["engines"].items()}
    assert status == {"numpy": "ok", "gradops-cuda": "ok", "gradops-cudnn": "mismatch", "torch": "mismatch",
                      "jax": "error", "other": "n/a"}
    assert "float64 NumPy reference" in row["engines"]["gradops-cudnn"]["note"]  # caught by the small check
    assert "full size" in row["engines"]["torch"]["note"]  # caught by the vote at full size
    assert "boom" in row["engines"]["jax"]["note"]
    assert sorted(timed) == ["gradops-cuda", "numpy"]  # nothing that failed a check is timed
    assert "time_ms" not in row["engines"]["gradops-cudnn"] and "time_ms" not in row["engines"]["torch"]
    assert row["engines"]["gradops-cuda"]["time_ms"] == pytest.approx(1.0)
    assert row["engines"]["gradops-cuda"]["tflops"] == pytest.approx(row["flops"] / 1e-3 / 1e12)
    assert row["speedups"] == {}  # the pairs need cudnn / torch / jax times, which failed
    assert engines[3].prepared_batches == [2, case.batch]  # small check first, then full size


def test_speedups_and_geomeans():
    rows = [
        dict(suite="s", op="op", dtype="float16", engines={"gradops-cuda": {"time_ms": 1.0, "status": "ok"},
                                                          "torch": {"time_ms": 2.0, "status": "ok"}}),
        dict(suite="s", op="op", dtype="float16", engines={"gradops-cuda": {"time_ms": 4.0, "status": "ok"},
                                                          "torch": {"time_ms": 2.0, "status": "ok"}}),
        dict(suite="s", op="op", dtype="float16", engines={"gradops-cuda": {"status": "mismatch"},
                                                          "torch": {"time_ms": 2.0, "status": "ok"}}),
    ]
    for row in rows:
        row["speedups"] = runner.speedups(row, [("gradops-cuda", "torch")])
    assert rows[0]["speedups"] == {"gradops-cuda vs torch": 2.0} and rows[2]["speedups"] == {}
    group = report.summarize(rows)["groups"][0]
    assert group["speedups"]["gradops-cuda vs torch"] == {"geomean": pytest.approx(1.0), "n": 2}  # sqrt(2 * 0.5)
    assert group["engines"]["gradops-cuda"]["status"] == {"ok": 2, "mismatch": 1}


def test_gpu_report_prints_predictions_beside_measurements(tmp_path):
    """With a static report for the device, each matching row shows the predicted time and the
    measured / predicted ratio; rows without a prediction show '-'."""
    case = suites.suite("smoke")[0]
    static = {"meta": {"label": "predicted, not measured", "commit": "abc1234"},
              "predictions": [{"device": "H100 SXM", "op": case.op, "label": case.label, "dtype": "float32",
                               "predicted_ms": 0.25, "limiter": "DRAM", "pct_hbm": 75.0, "sass_per_element": 40.0}]}
    path = tmp_path / "static_report.json"
    path.write_text(json.dumps(static))
    h100 = metrics.peaks_for("NVIDIA H100 80GB HBM3")
    engines = [_Fake("gradops-cuda")]
    result = runner.run(["smoke"], dtypes=["float32"], mode="gpu", engine_list=engines, peaks=h100, progress=False,
                        timer=lambda engine, fn, settings: 1e-3, predictions=path)
    matched = [r for r in result["rows"] if r.get("predicted")]
    assert len(matched) == 1 and matched[0]["label"] == case.label and matched[0]["predicted"]["ms"] == 0.25
    assert result["meta"]["predicted"]["commit"] == "abc1234"
    md = report.markdown(result)
    assert "predicted (not measured)" in md and "| 0.250 ms (DRAM) | 4.00 |" in md
    assert "abc1234" in md
    # no static report: no prediction column
    bare = runner.run(["smoke"], dtypes=["float32"], mode="gpu", engine_list=engines, peaks=h100, progress=False,
                      timer=lambda engine, fn, settings: 1e-3, predictions=tmp_path / "missing.json")
    assert not any(r.get("predicted") for r in bare["rows"]) and "predicted (not measured)" not in report.markdown(bare)


def test_gpu_mode_report_with_fake_engines(tmp_path):
    """GPU-mode bookkeeping end to end: speedups, % of peak/roofline, geomeans, markdown, PNG."""
    pytest.importorskip("matplotlib")
    times = {"gradops-cuda": 1.0, "gradops-cudnn": 2.0, "torch": 4.0}
    engines = [_Fake("gradops-cudnn"), _Fake("gradops-cuda"), _Fake("torch")]
    h100 = metrics.peaks_for("NVIDIA H100 80GB HBM3")
    result = runner.run(["smoke"], dtypes=["float32"], mode="gpu", engine_list=engines, peaks=h100, progress=False,
                        timer=lambda engine, fn, settings: times[engine.name] * 1e-3)
    assert result["meta"]["peaks"]["device"] == "H100 SXM"
    for row in result["rows"]:
        assert row["speedups"] == {"gradops-cuda vs gradops-cudnn": 2.0, "gradops-cuda vs torch": 4.0,
                                   "gradops-cudnn vs torch": 2.0}
        ours = row["engines"]["gradops-cuda"]
        if row["op"] in suites.DEPTHWISE_OPS + suites.POOLING_OPS:
            assert ours["pct_peak"] == pytest.approx(100 * row["bytes"] / 1e-3 / 3.35e12)
        else:
            assert ours["pct_peak"] == pytest.approx(100 * row["flops"] / 1e-3 / 67e12)  # FP32, TF32 off
    suite_summary = result["summary"]["suites"][0]
    assert suite_summary["speedups"]["gradops-cuda vs torch"]["geomean"] == pytest.approx(4.0)
    paths = report.write(result, tmp_path)
    assert [p.name for p in paths] == ["gpu_smoke.json", "gpu_smoke.md", "gpu_smoke.png"]
    md = paths[1].read_text()
    assert "gradops-cuda % peak" in md and "H100 SXM" in md and "4.00 (n=" in md



def test_gradops_cuda_engine_on_the_host_stand_in(cuda_device):
    """The benchmark's own gradops-cuda engine, end to end through the runner's checks on the
    smoke suite: operands moved by the engine, our real launchers and kernels (on the CPU
    stand-in here, on the GPU in the [gpu] case), results checked against the float64 NumPy
    reference and between batch sizes.  Only the timer is a stand-in on the host."""
    from gradops.bench.engines import GradopsGpuEngine

    timer = (lambda engine, fn, settings: (fn(), 1e-3)[1]) if cuda_device is not None else None
    peaks = metrics.peaks_for("NVIDIA H100 80GB HBM3") if cuda_device is not None else None
    result = runner.run(["smoke"], dtypes=["float16", "float32"], mode="gpu", engine_list=[GradopsGpuEngine("cuda")],
                        peaks=peaks, progress=False, timer=timer)
    rows = result["rows"]
    assert len(rows) == sum(dtype in case.dtypes for case in suites.suite("smoke") for dtype in ("float16", "float32"))
    for row in rows:
        assert row["engines"]["gradops-cuda"]["status"] == "ok", row


def test_gradops_cuda_path_engine_on_the_host_stand_in(cuda_device):
    """gradops-cuda:PATH forces the depthwise input gradient's kernel path (A/B timings): it
    supports exactly the cases its path runs, launches that kernel, and matches the NumPy
    backend; a path is refused for other backends."""
    import cupy

    from gradops.bench.engines import GradopsGpuEngine, make_inputs

    planes = GradopsGpuEngine("cuda", path="planes")
    assert planes.name == "gradops-cuda:planes"
    with pytest.raises(ValueError, match="cuda backend"):
        GradopsGpuEngine("cudnn", path="planes")
    nchw = suites.Case("t", "dw 3x3/1 m2 NCHW", "depthwise_conv2d_native_backprop_input", (2, 9, 10, 6), "NCHW",
                       (3, 3, 6, 2), (1, 1), "SAME")
    nhwc = suites.Case("t", "dw 3x3/1 m2 NHWC", "depthwise_conv2d_native_backprop_input", (2, 9, 10, 6), "NHWC",
                       (3, 3, 6, 2), (1, 1), "SAME")
    strided = suites.Case("t", "dw 3x3/3 NCHW", "depthwise_conv2d_native_backprop_input", (2, 9, 10, 6), "NCHW",
                          (3, 3, 6, 1), (3, 3), "SAME")
    filt = suites.Case("t", "dwf 3x3/1 NCHW", "depthwise_conv2d_native_backprop_filter", (2, 9, 10, 6), "NCHW",
                       (3, 3, 6, 1), (1, 1), "SAME")
    dtype = np.dtype(np.float32)
    assert planes.supports(nchw, dtype) == (True, "supported")
    for case in (nhwc, strided, filt):
        assert not planes.supports(case, dtype)[0]
    arrays = make_inputs(nchw, dtype, np.random.default_rng(0))
    got = cupy.asnumpy(planes.prepare(nchw, dtype, arrays)())
    if cuda_device is not None:
        assert "_planes<" in cuda_device.launches[-1][0]
    want = gradops.depthwise_conv2d_native_backprop_input(list(nchw.input_tensor_shape()), arrays["filter"],
                                                          arrays["out_backprop"], nchw.tf_strides(), nchw.padding,
                                                          data_format="NCHW", backend="numpy")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="planes kernel cannot run"):
        planes.prepare(strided, dtype, make_inputs(strided, dtype, np.random.default_rng(0)))


def test_gradops_cuda_staging_path_engines_on_the_host_stand_in(cuda_device):
    """gradops-cuda:sync / :async force the depthwise filter gradient's tiled kernel with its
    staging (A/B timings): they support the NHWC cases the tiled kernel runs (async: where its
    asynchronous form exists), launch it, and match the NumPy backend bit for bit each other;
    gradops-cuda:mma forces the tensor-core kernel where it runs."""
    import cupy

    from gradops.bench.engines import GradopsGpuEngine, make_inputs

    engines = {p: GradopsGpuEngine("cuda", path=p) for p in ("sync", "async")}
    nhwc = suites.Case("t", "dwf 3x3/1 m2 NHWC", "depthwise_conv2d_native_backprop_filter", (2, 9, 10, 8), "NHWC",
                       (3, 3, 8, 2), (1, 1), "SAME")
    five = suites.Case("t", "dwf 5x5/2 NHWC", "depthwise_conv2d_native_backprop_filter", (2, 9, 10, 8), "NHWC",
                       (5, 5, 8, 1), (2, 2), "SAME")
    nchw = suites.Case("t", "dwf 3x3/1 NCHW", "depthwise_conv2d_native_backprop_filter", (2, 9, 10, 8), "NCHW",
                       (3, 3, 8, 1), (1, 1), "SAME")
    grad_input = suites.Case("t", "dw 3x3/1 NHWC", "depthwise_conv2d_native_backprop_input", (2, 9, 10, 8), "NHWC",
                             (3, 3, 8, 1), (1, 1), "SAME")
    dtype = np.dtype(np.float32)
    for path, engine in engines.items():
        assert engine.name == f"gradops-cuda:{path}"
        assert engine.supports(nhwc, dtype) == (True, "supported")
        assert not engine.supports(nchw, dtype)[0] and not engine.supports(grad_input, dtype)[0]
    assert engines["sync"].supports(five, dtype)[0] and not engines["async"].supports(five, dtype)[0]
    assert engines["async"].supports(five, np.dtype(np.float16))[0]
    arrays = make_inputs(nhwc, dtype, np.random.default_rng(0))
    got = {}
    for path, engine in engines.items():
        before = len(cuda_device.launches) if cuda_device is not None else 0
        got[path] = cupy.asnumpy(engine.prepare(nhwc, dtype, arrays)())
        if cuda_device is not None:
            # the partial sums, which are the result here (one slice of float32 sums: no reduction)
            (kernel,) = [launch[0] for launch in cuda_device.launches[before:]]
            assert "_filter_tiled<float, float, 3, 1, " in kernel and kernel.endswith(", true>") == (path == "async")
    assert got["sync"].tobytes() == got["async"].tobytes()
    want = gradops.depthwise_conv2d_native_backprop_filter(arrays["input"], list(nhwc.filter_shape),
                                                           arrays["out_backprop"], nhwc.tf_strides(), nhwc.padding,
                                                           backend="numpy")
    np.testing.assert_allclose(got["async"], want, rtol=1e-5, atol=1e-5)
    # gradops-cuda:mma: the layout's tensor-core kernel (half types; NHWC: in_depth a multiple of 16 / M).
    mma = GradopsGpuEngine("cuda", path="mma")
    half = np.dtype(np.float16)
    wide = suites.Case("t", "dwf 3x3/1 m1 NHWC", "depthwise_conv2d_native_backprop_filter", (2, 9, 10, 16), "NHWC",
                       (3, 3, 16, 1), (1, 1), "SAME")
    assert mma.supports(wide, half)[0] and not mma.supports(wide, dtype)[0] and not mma.supports(five, half)[0]
    arrays = make_inputs(wide, half, np.random.default_rng(1))
    before = len(cuda_device.launches) if cuda_device is not None else 0
    got = cupy.asnumpy(mma.prepare(wide, half, arrays)())
    if cuda_device is not None:
        assert "_filter_mma_nhwc<" in cuda_device.launches[before][0]
    want = gradops.depthwise_conv2d_native_backprop_filter(arrays["input"], list(wide.filter_shape),
                                                           arrays["out_backprop"], wide.tf_strides(), wide.padding,
                                                           backend="numpy")
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-2, atol=2e-2 * np.abs(want).max())


def test_gradops_cuda_fractional_path_engines_on_the_host_stand_in(cuda_device):
    """gradops-cuda:gather / :cells force a fractional pooling gradient's kernels (A/B timings):
    both support the suite's generated sequences (disjoint and overlapping) and only those ops,
    launch their kernels, and give the same bits as each other and the public API."""
    import cupy

    from gradops.bench.engines import TENSORS, GradopsGpuEngine, call_gradops, make_inputs

    engines = {p: GradopsGpuEngine("cuda", path=p) for p in ("gather", "cells")}
    cases = [suites.Case("t", f"frac {mode}", op, (2, 13, 11, 8), pooling_ratio=1.44,
                         overlapping=mode == "overlapping", seed=3)
             for op in ("fractional_avg_pool_grad", "fractional_max_pool_grad") for mode in ("disjoint", "overlapping")]
    grad_input = suites.Case("t", "dw 3x3/1 NHWC", "depthwise_conv2d_native_backprop_input", (2, 9, 10, 8), "NHWC",
                             (3, 3, 8, 1), (1, 1), "SAME")
    dtype = np.dtype(np.float16)
    for path, engine in engines.items():
        assert engine.name == f"gradops-cuda:{path}"
        assert not engine.supports(grad_input, dtype)[0]
    for case in cases:
        arrays = make_inputs(case, dtype, np.random.default_rng(0))
        got = {}
        for path, engine in engines.items():  # (TF's generated sequences partition the input, both modes)
            assert engine.supports(case, dtype) == (True, "supported")
            got[path] = cupy.asnumpy(engine.prepare(case, dtype, arrays)())
            if cuda_device is not None:
                assert ("_cells<" in cuda_device.launches[-1][0]) == (path == "cells")
        public = cupy.asnumpy(call_gradops(case, {k: (cupy.asarray(v) if k in TENSORS else v) for k, v in arrays.items()},
                                           "cuda"))
        assert all(result.tobytes() == public.tobytes() for result in got.values())


def test_numpy_vs_tf_format():
    fake = dict(meta=dict(commit="abc", date="2026-01-01", machine="x86_64", processor="p", cpu_count=2,
                          python="3.11", numpy="2", tensorflow="2.21", gradops="0.1"),
                rows=[dict(op="conv2d_backprop_input", label="case a", engines={
                          "numpy": {"time_ms": 3.0}, "tensorflow": {"time_ms": 2.0}},
                          pairwise={"numpy": {"tensorflow": 1e-7}}),
                      dict(op="fractional_avg_pool_grad", label="case b", engines={
                          "numpy": {"time_ms": 1.0}, "tensorflow": {"time_ms": 3.0}},
                          pairwise={"numpy": {"tensorflow": 0.0}})])
    data, md = report.numpy_vs_tf(fake)
    assert set(data) == {"meta", "geomean_ratio", "rows"}
    assert [r["ratio"] for r in data["rows"]] == [1.5, pytest.approx(1 / 3)]
    assert data["geomean_ratio"] == pytest.approx((1.5 / 3) ** 0.5)
    assert set(data["rows"][0]) == {"op", "case", "gradops_ms", "tf_ms", "ratio", "max_rel_error"}
    assert "| conv2d_backprop_input | case a | 3.00 | 2.00 | 1.50 | 1.0e-07 |" in md
    assert "Geometric mean of time ratios (gradops / TF): **0.707**" in md


# --------------------------------------------------------------------------- third-party engines on a CPU


def _layout_cases():
    """Smoke cases plus small copies of the awkward ones: TF SAME with odd padding, strided 1x1, depthwise m2."""
    cases = [c for c in suites.suite("smoke") if c.op not in suites.POOLING_OPS]
    for layout in suites.LAYOUTS:
        for op in ("conv2d_backprop_filter", "conv2d_backprop_input"):
            cases.append(suites.Case("t", "7x7/2 SAME (pads 2, 3)", op, (2, 20, 19, 3), layout, (7, 7, 3, 4), (2, 2)))
            cases.append(suites.Case("t", "1x1/2", op, (2, 8, 8, 6), layout, (1, 1, 6, 5), (2, 2)))
        for op in suites.DEPTHWISE_OPS:
            cases.append(suites.Case("t", "dw 5x5/2 m2", op, (2, 10, 9, 3), layout, (5, 5, 3, 2), (2, 2)))
    return cases


def _agrees_with_numpy(engine, dtype_name="float32"):
    rng = np.random.default_rng(0)
    dtype = suites.DTYPES[dtype_name]
    for case in _layout_cases():
        from gradops.bench.engines import make_inputs, numpy_reference

        arrays = make_inputs(case, dtype, rng)
        got = engine.to_host(case, engine.prepare(case, dtype, arrays)())
        err = check.rel_error(got, numpy_reference(case, arrays))
        assert err <= check.TOLERANCE[dtype_name], (case, err)


def test_jax_engine_layouts_match_tf_semantics():
    """The JAX engine's padding, filter layout and groups, run on JAX's CPU backend."""
    pytest.importorskip("jax")
    from gradops.bench.engines import JaxEngine

    engine = JaxEngine(platform="cpu")
    assert engine.available()[0]
    _agrees_with_numpy(engine)
    _agrees_with_numpy(engine, "bfloat16")


def test_torch_engine_layouts_match_tf_semantics():
    """The PyTorch engine's OIHW filters, channels-last views and asymmetric padding, on its CPU device."""
    pytest.importorskip("torch")
    from gradops.bench.engines import TorchEngine

    engine = TorchEngine(device="cpu")
    assert engine.available()[0]
    _agrees_with_numpy(engine)


# --------------------------------------------------------------------------- CPU mode, end to end


def test_importing_the_harness_imports_no_gpu_library():
    code = ("import sys, gradops.bench, gradops.bench.engines, gradops.bench.report, gradops.bench.cli; "
            "print(sorted(m for m in ('cupy', 'torch', 'jax', 'matplotlib', 'tensorflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cpu_mode_smoke_writes_json_markdown_and_png(tmp_path):
    pytest.importorskip("matplotlib")
    args = ["bench", "--mode", "cpu", "--suite", "smoke", "--dtype", "float32", "--out", str(tmp_path),
            "--repeats", "1", "--warmup", "1", "--min-seconds", "0", "--no-progress"]
    result = subprocess.run([sys.executable, "-m", "gradops", *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "geometric means" in result.stdout
    data = json.loads((tmp_path / "cpu_smoke.json").read_text())
    expected = [(c.label, c.op) for c in suites.suite("smoke") if "float32" in c.dtypes]
    assert [(r["label"], r["op"]) for r in data["rows"]] == expected
    assert data["meta"]["mode"] == "cpu" and data["meta"]["suites"] == ["smoke"] and data["meta"]["commit"]
    for row in data["rows"]:
        numpy_entry = row["engines"]["numpy"]
        assert numpy_entry["status"] == "ok" and numpy_entry["time_ms"] > 0, row
        assert numpy_entry["reference_error"] <= check.TOLERANCE["float32"]
        tf_entry = row["engines"]["tensorflow"]
        if row["data_format"] == "NCHW" and row["op"] not in suites.POOLING_OPS:
            assert tf_entry["status"] in ("n/a", "unavailable")
        elif row["op"] in suites.FRACTIONAL_FORWARD_OPS:  # TF's forwards draw their own sequences
            assert tf_entry["status"] in ("n/a", "unavailable")
        elif tf_entry["status"] != "unavailable":  # tensorflow is an optional test dependency
            assert tf_entry["status"] == "ok", row
            assert row["pairwise"]["numpy"]["tensorflow"] <= check.TOLERANCE["float32"]
            assert row["speedups"]["numpy vs tensorflow"] > 0
    md = (tmp_path / "cpu_smoke.md").read_text()
    assert "## Geometric means" in md and "## smoke" in md
    assert md.count("| conv 3x3 16->32 NHWC |") == 1
    png = (tmp_path / "cpu_smoke.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_time_limit_stops_starting_cases_and_the_report_says_so(monkeypatch):
    import gradops.bench.runner as runner_mod
    from gradops.bench import report as report_mod

    clock = iter(range(0, 1000, 10))  # each case takes 10 "seconds"
    monkeypatch.setattr(runner_mod.time, "monotonic", lambda: next(clock))
    report = runner_mod.run(["smoke"], dtypes=["float32"], mode="cpu", engine_list=[_Fake("numpy")],
                            progress=False, time_limit=15)
    assert 1 <= len(report["rows"]) < 10
    assert "time limit 15 s reached" in report["meta"]["stopped_early"]
    assert "**Incomplete:**" in report_mod.markdown(report)


def test_jax_takes_float64_only_with_x64_enabled():
    """Without jax_enable_x64 JAX computes float64 inputs in float32: the engine says n/a
    rather than reporting a float32 result as float64 (seen as mismatches on an H100)."""
    import types

    from gradops.bench.engines import JaxEngine
    from gradops.bench.suites import suite

    case = next(c for c in suite("smoke") if c.op not in suites.FRACTIONAL_OPS)
    engine = JaxEngine()
    engine._jax = types.SimpleNamespace(config=types.SimpleNamespace(jax_enable_x64=False))
    ok, reason = engine.supports(case, np.dtype(np.float64))
    assert not ok and "jax_enable_x64" in reason
    assert engine.supports(case, np.dtype(np.float32))[0]
    engine._jax.config.jax_enable_x64 = True
    assert engine.supports(case, np.dtype(np.float64))[0]


def test_ncu_table_groups_kernels_by_the_marker_before_them(tmp_path):
    """benchmarks/ncu_table.py: the kernels after marker i (grid size i) are case i's."""
    import importlib.util
    import json
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("ncu_table", Path(__file__).parents[1] / "benchmarks" / "ncu_table.py")
    ncu_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ncu_table)
    header = ["ID", "Kernel Name", "Grid Size", "Metric Name", "Metric Unit", "Metric Value"]
    launches = [("0", "gradops_case_marker", "(1, 1, 1)", []),
                ("1", "kernel_a", "(9, 1, 1)", [("gpu__time_duration.sum", "usecond", "2.5"),
                                                ("dram__bytes_read.sum", "Mbyte", "1.5"),
                                                ("dram__bytes_write.sum", "byte", "1,000")]),
                ("2", "kernel_b", "(3, 1, 1)", [("gpu__time_duration.sum", "nsecond", "500")]),
                ("3", "gradops_case_marker", "(2, 1, 1)", []),
                ("4", "kernel_c", "(3, 1, 1)", [("gpu__time_duration.sum", "nsecond", "4,000"),
                                                ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum", "sector", "1,000")])]
    rows = [",".join(f'"{c}"' for c in header), '"==PROF== a line ncu prints"']
    for lid, name, grid, metrics_ in launches:
        for metric in metrics_ or [("gpu__time_duration.sum", "nsecond", "1")]:
            rows.append(",".join(f'"{c}"' for c in (lid, name, grid, *metric)))
    path = tmp_path / "ncu.csv"
    path.write_text(rows[1] + "\n" + rows[0] + "\n" + "\n".join(rows[2:]) + "\n")
    cases = ncu_table.kernels_by_case(str(path))
    assert [k["name"] for k in cases[1]] == ["kernel_a", "kernel_b"] and [k["name"] for k in cases[2]] == ["kernel_c"]
    assert cases[1][0] == {"name": "kernel_a", "ns": 2500.0, "read": 1.5e6, "write": 1000.0}
    assert sum(k["ns"] for k in cases[1]) == 3000.0
    assert ncu_table.markers_by_case(str(path)) == {1: 1.0, 2: 1.0}  # each marker's own time
    from gradops.bench.suites import suite

    case = suite("fractional")[0]
    forward = suite("fractional_forward")[0]  # a forward pooling: its own compulsory bytes
    index = tmp_path / "index.json"
    index.write_text(json.dumps([dict(i=i, suite=c.suite, label=c.label, op=c.op, dtype="float32",
                                      engine="gradops-cuda") for i, c in ((1, forward), (2, case))]))
    lines = ncu_table.table(str(path), str(index), 1e12).splitlines()
    line = next(row for row in lines if case.op in row)
    assert "| 4.0 |" in line and "gradops-cuda" in line  # 4,000 ns
    # result bytes (the input gradient, float32) / the 1,000 store sectors ncu counted
    assert line.endswith(f"| {4 * 32 * 112 * 112 * 64 / 1000:.1f} |"), line
    assert cases[2][0]["store_sectors"] == 1000.0 and "store_sectors" not in cases[1][0]
    line = next(row for row in lines if f"| {forward.op} |" in row)
    need = metrics.bytes_moved(forward, forward.geometry(), 4)
    assert need == 4 * (32 * 112 * 112 * 64 + 32 * 77 * 77 * 64)  # value read, output written
    assert "| 3.0 |" in line and f"| {100 * need / 3e-6 / 1e12:.1f} |" in line, line
    assert line.endswith("| - |"), line  # no store sectors measured


def _load_benchmark_script(name: str):
    import importlib.util

    folder = Path(__file__).parents[1] / "benchmarks"
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conv_prediction_with_unchanged_kernels_predicts_the_measured_time():
    """benchmarks/conv_prediction.py on the committed H100 run: with the measured kernels' own
    static figures as "current", every prediction equals the measurement, every tiled case finds
    its kernel, and the measured geometric-mean ratios are those of ncu_kernels.md (0.47, 0.15)."""
    cp = _load_benchmark_script("conv_prediction")
    results = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu_h100_2026-11-22"
    baseline = str(results / "static_conv_kernels_measured.json")
    table = cp.rows(str(results), baseline, baseline)
    assert len(table) == 48
    tiled = [r for r in table if r["kernel"] != "direct"]
    assert len(tiled) == 47  # conv1's dgrad (3 input channels) ran the direct kernel
    for r in table:
        assert r["predicted_us"] == pytest.approx(r["measured_us"])
        assert r["cudnn_us"] > 0
    for r in tiled:
        assert 0 < r["issue_utilisation"] < 1 and 0 < r["main_loop_share"] <= 1
    for op, ratio in (("conv2d_backprop_filter", 0.47), ("conv2d_backprop_input", 0.15)):
        got = cp.geomean(r["cudnn_us"] / r["measured_us"] for r in table if r["op"] == op)
        assert round(got, 2) == ratio


def test_conv_prediction_reads_kernel_names_and_counts_k_tiles():
    cp = _load_benchmark_script("conv_prediction")
    assert (cp.expression("void gradops::conv2d_backprop_input_igemm<__half, float, 1, 1>(const T1 *, long long)")
            == "gradops::conv2d_backprop_input_igemm<__half, float, 1, true>")
    assert cp.expression("void gradops::split_reduce<__half, float>(const T2 *)") is None
    from gradops._geometry import conv2d_geometry

    # dgrad, 1x1 stride 1, 64 -> 64 channels on 2 x 16 x 16: one phase, M = 512 (4 CTAs of 128),
    # N = 64 (one CTA column), reduction 64 = 2 k-tiles of 32; 8 warps per CTA.
    g = conv2d_geometry("Conv2DBackpropInput", (2, 16, 16, 64), (1, 1, 64, 64), (2, 16, 16, 64), [1, 1, 1, 1],
                        "VALID", [], "NHWC", [1, 1, 1, 1])
    assert cp.warp_k_tiles("conv2d_backprop_input", g, np.float16, 1) == (4 * 8, 4 * 8 * 2)
    # stride 2, 3x3 SAME on 2 x 8 x 8: phases (0, 0), (0, 1), (1, 0), (1, 1) have 2 x 2, 2 x 1, 1 x 2
    # and 1 x 1 taps (pad 0 before: TF's SAME pads 1 after) over 2 x 4 x 4 = 32 positions each.
    g = conv2d_geometry("Conv2DBackpropInput", (2, 8, 8, 64), (3, 3, 64, 64), (2, 4, 4, 64), [1, 2, 2, 1],
                        "SAME", [], "NHWC", [1, 1, 1, 1])
    taps = (4, 2, 2, 1)
    assert cp.warp_k_tiles("conv2d_backprop_input", g, np.float16, 1) == (4 * 8, sum(8 * t * 2 for t in taps))


def test_conv_prediction_maps_1x1_cases_to_the_1x1_kernels():
    """Cases the launchers now run on the _1x1_igemm kernels (1x1, stride 1, no padding, 16-byte
    loads) are predicted with those kernels' figures; others keep the measured kernel."""
    cp = _load_benchmark_script("conv_prediction")
    from gradops._geometry import conv2d_geometry

    one = conv2d_geometry("Conv2DBackpropInput", (2, 16, 16, 64), (1, 1, 64, 64), (2, 16, 16, 64), [1, 1, 1, 1],
                          "VALID", [], "NHWC", [1, 1, 1, 1])
    strided = conv2d_geometry("Conv2DBackpropInput", (2, 16, 16, 64), (1, 1, 64, 64), (2, 8, 8, 64), [1, 2, 2, 1],
                              "VALID", [], "NHWC", [1, 1, 1, 1])
    # both ops' tiled kernels gained a SPLIT argument since the measured run
    wgrad = "gradops::conv2d_backprop_filter_igemm<__half, float, 1, {}>"
    assert (cp.current_kernel(wgrad.format("true"), one, True)
            == "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, true>")
    assert cp.current_kernel(wgrad.format("false"), one) == wgrad.format("false, false")
    assert cp.current_kernel(wgrad.format("true"), strided) == wgrad.format("true, false")
    dgrad = "gradops::conv2d_backprop_input_igemm<__half, float, 1, {}>"
    assert cp.current_kernel(dgrad.format("true"), one, True) == "gradops::conv2d_backprop_input_1x1_igemm<__half, float, 1, true, true>"
    assert cp.current_kernel(dgrad.format("false"), one) == dgrad.format("false, false")
    assert cp.current_kernel(dgrad.format("true"), strided) == dgrad.format("true, false")


def test_few_channel_prediction_counts_each_warps_busiest_lane():
    """benchmarks/few_channel_prediction.py's grid count against a brute-force count of the taps
    that reach each input position (3x3 SAME, stride 1, 8x8 image: one 256-thread CTA per row,
    its first warp holding the row's 8 columns, the other 7 warps idle)."""
    cp = _load_benchmark_script("few_channel_prediction")
    from gradops._geometry import conv2d_geometry

    g = conv2d_geometry("Conv2DBackpropInput", (2, 8, 8, 3), (3, 3, 3, 16), (2, 8, 8, 16), [1, 1, 1, 1],
                        "SAME", [], "NHWC", [1, 1, 1, 1])
    figures = {"channel_loop": 10, "loads_128": 2, "tap_loop_rest": 5, "rest": 100}
    total, warps = cp.warp_instructions(g, figures, 2)  # float16: 16 channels per iteration, 1 iteration

    def taps(h, w):
        return sum(1 for r in range(3) for s in range(3) if 0 <= h + 1 - r < 8 and 0 <= w + 1 - s < 8)

    want = sum(8 * 100 + max(taps(h, w) for w in range(8)) * (10 + 5) for h in range(8)) * 2
    assert (total, warps) == (want, 2 * 8 * 8)


def test_planes_prediction_counts_a_ctas_work():
    """benchmarks/planes_prediction.py's per-element count against the CTA's work counted by hand:
    7 x 7 x 960 NCHW 3x3 SAME multiplier 1, float32: 32 planes a CTA, 4 x 2 items a plane (2 x 4
    positions each), one chunk of 8 a row (at the row's end: 7 elements), 32 x 10 x 12 / 4 zero
    stores (7 rows rounded up to whole items, and the halo), 9 x 32 filter taps, 256 threads'
    straight-line code."""
    pp = _load_benchmark_script("planes_prediction")
    g = next(c for c in suites.suite("mobilenetv2") if c.label == "dw10 7x7x960 3x3/1 m1 NCHW"
             and c.op == "depthwise_conv2d_native_backprop_input").geometry()
    f = {"sums": 90, "item_rest": 100, "staging": 70, "staging_edge": 60, "zero_per_store": 1.25, "filter": 30,
         "straight": 80}
    assert pp.dx.planes_plan(g, np.dtype(np.float32)) == (32, 7)
    want = (32 * 8 * (100 + 90) + 32 * 7 * 60 + 32 * 10 * 12 / 4 * 1.25 + 9 * 32 * 30 + 256 * 80) / (32 * 7 * 7)
    assert pp.per_element(g, np.dtype(np.float32), f) == pytest.approx(want)
    # Stride 2, dw9 14 x 14 x 576 3x3/2 (SAME pads 0 above and left): 32 planes of 7 x 2 items
    # (2 x 8 positions each); 7 out_backprop rows of 7 (one short chunk each); 8 staged rows (7
    # and the halo) of 12 (4 x 2 items + 4) values.
    g = next(c for c in suites.suite("mobilenetv2") if c.label == "dw9 14x14x576 3x3/2 m1 NCHW"
             and c.op == "depthwise_conv2d_native_backprop_input").geometry()
    assert pp.dx.planes_plan(g, np.dtype(np.float32), staged=False) == (32, 14)
    want = (32 * 14 * (100 + 90) + 32 * 7 * 60 + 32 * 8 * 12 / 4 * 1.25 + 9 * 32 * 30 + 256 * 80) / (32 * 14 * 14)
    assert pp.per_element(g, np.dtype(np.float32), f) == pytest.approx(want)


def test_measured_vs_predicted_retargets_only_the_dram_limit():
    """benchmarks/measured_vs_predicted.py: the H100 model's DRAM limit scales with the measured
    GPU's bandwidth, the other limits stay, and the limiter is the largest after scaling."""
    mvp = _load_benchmark_script("measured_vs_predicted")
    limits = {"DRAM": 0.0048, "L2": 0.003, "issue": 0.004, "occupancy": 0.001}  # ms, H100 SXM (3.35 TB/s)
    us, limiter = mvp.predicted_us({"limits_ms": limits}, 4.8e12)  # DRAM 3.35 us: issue is the limit
    assert (us, limiter) == (pytest.approx(4.0), "issue")
    us, limiter = mvp.predicted_us({"limits_ms": limits}, 3.35e12)
    assert (us, limiter) == (pytest.approx(4.8), "DRAM")
    assert mvp.predicted_us({"not_modelled": "x"}, 4.8e12) is None
    assert mvp.kernel_family("gradops::depthwise_conv2d_native_backprop_filter_tiled<__half, float, 3, 1, 4> + "
                             "gradops::depthwise_conv2d_native_backprop_filter_reduce<__half, float>") == \
        "filter_tiled + filter_reduce"


def test_measured_vs_predicted_committed_report_renders_from_its_json():
    """The committed H200 comparison: its markdown is what its JSON renders, its summary what its
    rows give, and every gradops-cuda row of a modelled kernel has measured / predicted."""
    mvp = _load_benchmark_script("measured_vs_predicted")
    folder = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu_h200_2026-11-28"
    report = json.loads((folder / "measured_vs_predicted.json").read_text())
    assert report["summary"] == json.loads(json.dumps(mvp.summarise(report["rows"])))
    assert report["issue"] == json.loads(json.dumps(mvp.issue_summary(report["rows"])))
    assert all(0 < g["issue_fraction"] < 1 for g in report["issue"])  # below the model's assumed 1.0
    assert (folder / "measured_vs_predicted.md").read_text() == mvp.markdown(report)
    ours = [r for r in report["rows"] if r["engine"] == "gradops-cuda"]
    assert len(ours) == 258 and all("measured_over_predicted" in r for r in ours)
    # the latency-aware estimate was fitted to this run: in sample, it sits around the measured times
    ratios = [r["measured_over_latency_aware"] for r in ours]
    assert len(ratios) == 258 and 0.9 < math.exp(sum(map(math.log, ratios)) / len(ratios)) < 1.1
    assert report["meta"]["static_report"] == "549728a:benchmarks/results/static_report.json"
    assert all(r["us"] > 0 for r in report["rows"])


def test_launch_floor_table_is_the_scripts_output():
    """benchmarks/launch_floor.py: the committed table of the H100 run is its output; the marker
    kernel's measured time bounds each case's % of HBM (t_dram / (t_dram + k x marker)), which
    the measured figure never exceeds, and the kernel time above the floor stays below HBM speed."""
    module = _load_benchmark_script("launch_floor")
    run = Path(__file__).parents[1] / "benchmarks" / "results" / "gpu_h100_2026-12-05"
    assert (run / "launch_floor.md").read_text() == module.report(run, 3.35e12)
    data = module.rows(run, 3.35e12)
    assert len(data) == 169 and {r["op"] for r in data} == set(module.TARGETS)
    for r in data:
        assert 2.0 < r["floor_us"] < 3.1 and r["pct"] < r["ceiling"] <= r["ceiling_one"]
        assert r["ceiling"] == pytest.approx(100 * r["dram_us"] / (r["dram_us"] + r["kernels"] * r["floor_us"]))
        assert r["pct"] < r["above_floor"] < 100
    dw10 = next(r for r in data if r["label"] == "dw10 7x7x960 3x3/1 m1 NHWC" and r["dtype"] == "float16"
                and r["op"] == "depthwise_conv2d_native_backprop_filter")
    assert dw10["kernels"] == 2 and dw10["ceiling_one"] < 75  # 6 MB: about 1.8 us at HBM speed


def test_planes_store_sectors_table_is_the_scripts_output():
    """benchmarks/planes_store_sectors.py: the committed table is its output; on MobileNetV2 dw1
    (112 columns, lanes along a row) the direct stores write whole sectors, on dw9 (14 columns at
    stride 2, two lanes a row) 5.1 bytes a sector, a launch the staged form is for (in 16 planes a
    CTA, where 32 do not fit with the image)."""
    module = _load_benchmark_script("planes_store_sectors")
    committed = (Path(__file__).parents[1] / "benchmarks" / "results" / "planes_store_sectors.md").read_text()
    assert committed == module.main([])
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in committed.splitlines()}
    assert "| 32.0 | no |" in rows[("mobilenetv2 dw1 112x112x32 3x3/1 m1 NCHW", "float32")]
    assert "| 5.1 | yes (16 x 14) |" in rows[("mobilenetv2 dw9 14x14x576 3x3/2 m1 NCHW", "float16")]
