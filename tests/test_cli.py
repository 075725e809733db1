"""The command line: ``python -m gradops info`` and ``python -m gradops check`` (the main job)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import gradops
from gradops import _check


def run(*args):
    return subprocess.run([sys.executable, "-m", "gradops", *args], capture_output=True, text=True, timeout=600)


def test_info_lists_every_backend_with_its_status():
    result = run("info")
    assert result.returncode == 0, result.stderr
    for backend in gradops.BACKENDS:
        assert f"backend {backend}" in result.stdout
    assert "available: always available" in result.stdout  # numpy
    from gradops.backends._gpu_probe import driver_status

    state, driver = driver_status()  # this machine's, whatever it has
    words = {"missing": "none found", "unreadable": "reports no CUDA version"}.get(state, "supports CUDA up to")
    assert "CUDA driver" in result.stdout and words in result.stdout


def test_check_passes_and_reports_a_table():
    result = run("check", "--no-tf")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "adjoint identity" in result.stdout
    assert "0 failed" in result.stdout


def test_check_rows_cover_every_op_and_fail_on_a_wrong_backend(monkeypatch):
    """The check compares real numbers: a backend that returns wrong values must fail it."""
    rows = _check.run_check(use_tf=False)
    ops = {row["op"] for row in rows if row["passed"] is not None}
    assert ops == {"conv2d_backprop_filter", "conv2d_backprop_input", "depthwise_conv2d_native_backprop_input",
                   "depthwise_conv2d_native_backprop_filter", "fractional_avg_pool_grad", "fractional_max_pool_grad"}
    assert all(row["passed"] for row in rows if row["passed"] is not None)

    from gradops.backends import numpy_backend

    real = numpy_backend.conv2d_backprop_input
    monkeypatch.setattr(numpy_backend, "conv2d_backprop_input", lambda g, w, dy: real(g, w, dy) * 1.001)
    rows = _check.run_check(use_tf=False)
    bad = [r for r in rows if r["op"] == "conv2d_backprop_input" and r["reference"] == "adjoint identity"]
    assert bad and not bad[0]["passed"]


@pytest.mark.tf
def test_check_compares_with_tensorflow(tf):
    rows = _check.run_check(use_tf=True)
    tf_rows = [r for r in rows if r["reference"] == "tensorflow"]
    assert {r["op"] for r in tf_rows} >= {"conv2d_backprop_filter", "conv2d_backprop_input",
                                          "depthwise_conv2d_native_backprop_input",
                                          "depthwise_conv2d_native_backprop_filter", "fractional_avg_pool_grad",
                                          "fractional_max_pool_grad"}
    assert all(r["passed"] for r in tf_rows)


@pytest.mark.tf
def test_check_compares_the_forwards_with_tensorflow_bit_for_bit(tf, monkeypatch):
    """The forward poolings' rows against TF (its dtypes, on sequences its own draw gives) allow
    no error at all: an average one ulp off, which a tolerance would pass, fails them."""
    forwards = ("fractional_avg_pool", "fractional_max_pool")

    def forward_rows():
        return {(r["op"], r["dtype"]): r for r in _check.run_check(use_tf=True)
                if r["op"] in forwards and r["reference"] == "tensorflow"}

    rows = forward_rows()
    assert set(rows) == {(op, dtype) for op in forwards for dtype in ("float32", "float64", "int32", "int64")}
    assert all(r["passed"] and r["tolerance"] == 0 and r["cases"] == 2 for r in rows.values())

    from gradops.backends import numpy_backend

    real = numpy_backend.fractional_avg_pool

    def one_ulp_up(g, value):
        out = real(g, value)
        return np.nextafter(out, np.inf).astype(out.dtype) if out.dtype.kind == "f" else out

    monkeypatch.setattr(numpy_backend, "fractional_avg_pool", one_ulp_up)
    rows = forward_rows()
    failed = {key for key, r in rows.items() if not r["passed"]}
    assert failed == {("fractional_avg_pool", "float32"), ("fractional_avg_pool", "float64")}


def test_check_prints_notes_verbatim(monkeypatch):
    """Notes that name extras reach the terminal as written: rich must not take ``[cuda12]``
    for markup (it printed "pip install 'gradops' or 'gradops'"), in skip notes and FAIL notes."""
    import io
    import math

    from rich.console import Console

    from gradops.__main__ import check
    from gradops.backends.cudnn._loader import INSTALL_HINT

    skip = f"skipped: the cuDNN Frontend is not installed ({INSTALL_HINT})"
    fail = "RuntimeError: reinstall gradops[cuda12]; [bold]not markup[/bold]"
    rows = [dict(op="(all ops)", backend="cudnn", reference="numpy", dtype="-", cases=0, max_error=math.nan,
                 tolerance=math.nan, passed=None, note=skip),
            dict(op="conv2d_backprop_filter", backend="cuda", reference="numpy", dtype="float32", cases=1,
                 max_error=math.nan, tolerance=2e-5, passed=False, note=fail)]
    monkeypatch.setattr(_check, "run_check", lambda use_tf: rows)
    console = Console(file=io.StringIO(), width=1000, color_system=None)
    assert check(console, use_tf=False) == 1
    text = console.file.getvalue()
    assert "pip install 'gradops[cuda13]' or 'gradops[cuda12]'" in text
    assert skip in text
    assert "FAIL " + fail in text
    assert "0 passed, 1 failed" in text


def test_bench_errors_are_printed_verbatim():
    """An error message goes through rich without its brackets being read as markup (an
    unknown engine named like an extra must be echoed as typed)."""
    result = run("bench", "--mode", "cpu", "--suite", "smoke", "--engine", "gradops[cuda12]", "--no-progress")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "unknown engine(s) gradops[cuda12]" in result.stdout, result.stdout


def test_check_reports_a_tensorflow_it_could_not_import(monkeypatch):
    """Without --no-tf and with no importable TensorFlow, the check says the comparison was
    skipped (a row like those of an unavailable GPU backend) instead of passing silently."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import tensorflow raises ImportError
    rows = _check.run_check(use_tf=True)
    skipped = [r for r in rows if r["reference"] == "tensorflow"]
    assert len(skipped) == 1 and skipped[0]["passed"] is None
    assert skipped[0]["note"].startswith("skipped: tensorflow does not import (ModuleNotFoundError")


@pytest.mark.parametrize("args, words", [
    (("bench", "--mode", "gpu", "--suite", "smoke", "--no-plot"), "--mode gpu needs a CUDA GPU and CuPy"),
    (("install-check", "--arch", "sm_80"), "install-check compiles through CuPy's NVRTC step"),
])
def test_gpu_commands_without_cupy_say_so(args, words):
    """Without CuPy (a CPU-only install), the GPU commands end with a sentence and exit
    status 2, not a ModuleNotFoundError traceback."""
    import importlib.util

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    result = run(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in " ".join(result.stdout.split()) and "Traceback" not in result.stderr
