"""``python -m gradops check``: every op on every available backend against a reference.

GPU backends are compared with the NumPy backend on the same inputs.  The NumPy backend is
checked two independent ways: the adjoint (dot-product) identity with the forward op, and
TensorFlow's own kernels when tensorflow is importable (on the configurations its CPU
kernels support).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import _dispatch
from ._dtypes import FLOAT_DTYPES, bfloat16
from ._errors import BackendUnavailableError

# Allowed max |error| relative to the largest |reference| value (and at least 1).
TOLERANCE = {
    np.dtype(np.float16): 5e-3,
    bfloat16: 3e-2,
    np.dtype(np.float32): 2e-5,
    np.dtype(np.float64): 1e-11,
}


@dataclass
class Case:
    op: str
    description: str
    dtype: np.dtype
    run: Callable[[str, Callable], np.ndarray]  # (backend, to_device) -> result
    tf_run: Callable[[object], np.ndarray] | None  # tf module -> TF's result, None if TF can't
    adjoint: Callable[[], tuple[float, float]] | None  # NumPy (lhs, rhs) of <A x, y> = <x, A^T y>
    exact: bool = False  # results must equal the reference bit for bit (NaN payloads aside)


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _cases(rng) -> list[Case]:
    import gradops as g

    cases = []
    conv_configs = [
        dict(x=(2, 9, 8, 6), w=(3, 3, 6, 5), strides=[1, 1, 1, 1], padding="SAME", ep=[], dil=[1, 1, 1, 1]),
        dict(x=(2, 9, 8, 6), w=(3, 2, 6, 4), strides=[1, 2, 2, 1], padding="VALID", ep=[], dil=[1, 1, 1, 1]),
        dict(x=(1, 7, 9, 4), w=(2, 3, 4, 3), strides=[1, 2, 1, 1], padding="EXPLICIT",
             ep=[0, 0, 1, 2, 0, 3, 0, 0], dil=[1, 1, 1, 1]),
        dict(x=(2, 8, 8, 6), w=(3, 3, 2, 6), strides=[1, 1, 2, 1], padding="SAME", ep=[], dil=[1, 2, 1, 1]),
    ]
    for dtype in FLOAT_DTYPES:
        for cfg in conv_configs:
            for layout in ("NHWC", "NCHW"):
                cases += _conv_cases(g, rng, dtype, layout, **cfg)
        for mult, strides, dil in ((1, [1, 1, 1, 1], [1, 1, 1, 1]), (2, [1, 2, 2, 1], [1, 1, 1, 1]),
                                   (3, [1, 1, 2, 1], [1, 2, 2, 1])):
            for layout in ("NHWC", "NCHW"):
                cases += _depthwise_cases(g, rng, dtype, layout, mult, strides, dil)
    for dtype in FLOAT_DTYPES + (np.dtype(np.int32), np.dtype(np.int64)):
        for overlapping in (False, True):
            cases.append(_fractional_case(g, rng, dtype, overlapping))
            cases.append(_fractional_max_case(g, rng, dtype, overlapping))
            cases += _fractional_forward_cases(g, rng, dtype, overlapping)
    return cases


def _to_layout(shape_nhwc, layout):
    n, h, w, c = shape_nhwc
    return (n, h, w, c) if layout == "NHWC" else (n, c, h, w)


def _attr_to_layout(values, layout):
    return values if layout == "NHWC" else [values[0], values[3], values[1], values[2]]


def _pads_to_layout(pads, layout):
    if layout == "NHWC" or not pads:
        return pads
    return pads[0:2] + pads[6:8] + pads[2:6]


def _conv_cases(g, rng, dtype, layout, x, w, strides, padding, ep, dil):
    strides, dil, ep = _attr_to_layout(strides, layout), _attr_to_layout(dil, layout), _pads_to_layout(ep, layout)
    attrs = dict(strides=strides, padding=padding, explicit_paddings=ep, data_format=layout, dilations=dil)
    xv = _rand(rng, _to_layout(x, layout), dtype)
    wv = _rand(rng, w, dtype)
    y = g.conv2d(xv.astype(np.float64), wv.astype(np.float64), **attrs)
    dy = _rand(rng, y.shape, dtype)
    desc = f"{layout} x{list(x)} w{list(w)} {padding} s{strides} d{dil}"
    # TF's CPU kernels: NHWC, no dilation, no groups; half types only where registered.
    tf_ok = layout == "NHWC" and dil == [1, 1, 1, 1] and x[3] == w[2]

    def adjoint_filter():
        x64, w64, dy64 = (a.astype(np.float64) for a in (xv, wv, dy))
        lhs = float(np.sum(g.conv2d(x64, w64, **attrs) * dy64))
        return lhs, float(np.sum(w64 * g.conv2d_backprop_filter(x64, w, dy64, **attrs)))

    def adjoint_input():
        x64, w64, dy64 = (a.astype(np.float64) for a in (xv, wv, dy))
        lhs = float(np.sum(g.conv2d(x64, w64, **attrs) * dy64))
        return lhs, float(np.sum(x64 * g.conv2d_backprop_input(xv.shape, w64, dy64, **attrs)))

    return [
        Case("conv2d_backprop_filter", desc, np.dtype(dtype),
             lambda b, dev: g.conv2d_backprop_filter(dev(xv), w, dev(dy), **attrs, backend=b),
             (lambda tf: tf.raw_ops.Conv2DBackpropFilter(input=xv, filter_sizes=w, out_backprop=dy, **attrs).numpy())
             if tf_ok else None, adjoint_filter),
        Case("conv2d_backprop_input", desc, np.dtype(dtype),
             lambda b, dev: g.conv2d_backprop_input(xv.shape, dev(wv), dev(dy), **attrs, backend=b),
             (lambda tf: tf.raw_ops.Conv2DBackpropInput(input_sizes=xv.shape, filter=wv, out_backprop=dy,
                                                        **attrs).numpy()) if tf_ok else None, adjoint_input),
    ]


def _depthwise_cases(g, rng, dtype, layout, mult, strides, dil):
    strides, dil = _attr_to_layout(strides, layout), _attr_to_layout(dil, layout)
    attrs = dict(strides=strides, padding="SAME", data_format=layout, dilations=dil)
    xv = _rand(rng, _to_layout((2, 9, 10, 4), layout), dtype)
    wv = _rand(rng, (3, 3, 4, mult), dtype)
    dy = _rand(rng, g.depthwise_conv2d_native(xv, wv, **attrs).shape, dtype)
    tf_ok = layout == "NHWC" and dil == [1, 1, 1, 1] and strides[1] == strides[2]
    desc = f"{layout} m{mult} s{strides} d{dil}"

    def adjoint_input():
        x64, w64, dy64 = (a.astype(np.float64) for a in (xv, wv, dy))
        lhs = float(np.sum(g.depthwise_conv2d_native(x64, w64, **attrs) * dy64))
        return lhs, float(np.sum(x64 * g.depthwise_conv2d_native_backprop_input(xv.shape, w64, dy64, **attrs)))

    def adjoint_filter():
        x64, w64, dy64 = (a.astype(np.float64) for a in (xv, wv, dy))
        lhs = float(np.sum(g.depthwise_conv2d_native(x64, w64, **attrs) * dy64))
        return lhs, float(np.sum(w64 * g.depthwise_conv2d_native_backprop_filter(x64, wv.shape, dy64, **attrs)))

    return [
        Case("depthwise_conv2d_native_backprop_input", desc, np.dtype(dtype),
             lambda b, dev: g.depthwise_conv2d_native_backprop_input(xv.shape, dev(wv), dev(dy), **attrs, backend=b),
             (lambda tf: tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                 input_sizes=xv.shape, filter=wv, out_backprop=dy, **attrs).numpy()) if tf_ok else None,
             adjoint_input),
        Case("depthwise_conv2d_native_backprop_filter", desc, np.dtype(dtype),
             lambda b, dev: g.depthwise_conv2d_native_backprop_filter(dev(xv), wv.shape, dev(dy), **attrs, backend=b),
             (lambda tf: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                 input=xv, filter_sizes=wv.shape, out_backprop=dy, **attrs).numpy()) if tf_ok else None,
             adjoint_filter),
    ]


def _fractional_case(g, rng, dtype, overlapping):
    shape = (2, 13, 11, 3)
    rows = g.fractional_pooling_sequence(shape[1], 1.44, pseudo_random=True, seed=1)
    cols = g.fractional_pooling_sequence(shape[2], 1.44, pseudo_random=False, seed=2)
    out_shape = (shape[0], len(rows) - 1, len(cols) - 1, shape[3])
    if np.issubdtype(dtype, np.integer):
        dy = rng.integers(-50, 50, out_shape).astype(dtype)
    else:
        dy = _rand(rng, out_shape, dtype)

    def adjoint():
        x64 = rng.standard_normal(shape)
        lhs = float(np.sum(g.fractional_avg_pool(x64, rows, cols, overlapping) * dy.astype(np.float64)))
        return lhs, float(np.sum(x64 * g.fractional_avg_pool_grad(shape, dy.astype(np.float64), rows, cols,
                                                                   overlapping)))

    return Case("fractional_avg_pool_grad", f"{list(shape)} overlapping={overlapping}", np.dtype(dtype),
                lambda b, dev: g.fractional_avg_pool_grad(shape, dev(dy), rows, cols, overlapping, backend=b),
                lambda tf: tf.raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=shape, out_backprop=dy,
                                                            row_pooling_sequence=rows, col_pooling_sequence=cols,
                                                            overlapping=overlapping).numpy(),
                adjoint)


def _fractional_max_case(g, rng, dtype, overlapping):
    shape = (2, 13, 11, 3)
    rows = g.fractional_pooling_sequence(shape[1], 1.44, pseudo_random=True, seed=3)
    cols = g.fractional_pooling_sequence(shape[2], 1.44, pseudo_random=False, seed=4)
    # Few distinct values: cells hold ties, which every backend must break as TF does.
    x = rng.integers(-4, 5, shape).astype(dtype)
    y = g.fractional_max_pool(x, rows, cols, overlapping)
    if np.issubdtype(dtype, np.integer):
        dy = rng.integers(-50, 50, y.shape).astype(dtype)
    else:
        dy = _rand(rng, y.shape, dtype)

    def adjoint():  # <max_pool(x), dy> = <x, grad>: each cell's maximum is its chosen element
        x64 = rng.standard_normal(shape)
        y64 = g.fractional_max_pool(x64, rows, cols, overlapping)
        lhs = float(np.sum(y64 * dy.astype(np.float64)))
        return lhs, float(np.sum(x64 * g.fractional_max_pool_grad(x64, y64, dy.astype(np.float64), rows, cols,
                                                                   overlapping)))

    return Case("fractional_max_pool_grad", f"{list(shape)} overlapping={overlapping}", np.dtype(dtype),
                lambda b, dev: g.fractional_max_pool_grad(dev(x), dev(y), dev(dy), rows, cols, overlapping, backend=b),
                lambda tf: tf.raw_ops.FractionalMaxPoolGrad(orig_input=x, orig_output=y, out_backprop=dy,
                                                            row_pooling_sequence=rows, col_pooling_sequence=cols,
                                                            overlapping=overlapping).numpy(),
                adjoint)


def _fractional_forward_cases(g, rng, dtype, overlapping):
    """The forward poolings, bit for bit: GPU against NumPy on irregular sequences, and NumPy
    against TF on sequences TF's own draw gives (a ratio that divides the input: every seed
    draws equal cells).  Integer values: ties in the maxima, exact sums in every dtype."""
    shape = (2, 13, 11, 3)
    rows = g.fractional_pooling_sequence(shape[1], 1.44, pseudo_random=True, seed=5)
    cols = g.fractional_pooling_sequence(shape[2], 1.44, pseudo_random=False, seed=6)
    x = rng.integers(-4, 5, shape).astype(dtype)
    tf_shape, ratios = (2, 12, 12, 3), (2.0, 3.0)
    tf_x = rng.integers(-4, 5, tf_shape).astype(dtype)
    tf_rows, tf_cols = np.arange(0, 13, 2), np.arange(0, 13, 3)
    cases = []
    for op, tf_op in (("fractional_avg_pool", "FractionalAvgPool"), ("fractional_max_pool", "FractionalMaxPool")):
        def tf_run(tf, tf_op=tf_op):
            out, row_seq, col_seq = getattr(tf.raw_ops, tf_op)(
                value=tf_x, pooling_ratio=[1.0, *ratios, 1.0], pseudo_random=True, overlapping=overlapping,
                deterministic=True, seed=1, seed2=2)
            assert list(row_seq.numpy()) == list(tf_rows) and list(col_seq.numpy()) == list(tf_cols)
            return out.numpy()

        cases.append(Case(op, f"{list(shape)} overlapping={overlapping}", np.dtype(dtype),
                          lambda b, dev, op=op: getattr(g, op)(dev(x), rows, cols, overlapping, backend=b), None,
                          None, exact=True))
        cases.append(Case(op, f"{list(tf_shape)} ratios {ratios} overlapping={overlapping}", np.dtype(dtype),
                          lambda b, dev, op=op: getattr(g, op)(dev(tf_x), tf_rows, tf_cols, overlapping, backend=b),
                          tf_run, None, exact=True))
    return cases


def _exact_error(actual, expected) -> tuple[float, float]:
    """(0, 1) where ``actual`` is ``expected`` bit for bit (any NaN equal to any NaN), else
    (max |actual - expected| or inf, 1)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf"), 1.0
    if actual.dtype.kind == "i":
        same = actual == expected
    else:
        wide_actual, wide_expected = actual.astype(np.float64), expected.astype(np.float64)
        same = (actual.view(f"u{actual.itemsize}") == expected.view(f"u{expected.itemsize}")) | (
            np.isnan(wide_actual) & np.isnan(wide_expected))
    if same.all():
        return 0.0, 1.0
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))[~same]
    return float(np.nan_to_num(diff.max(), nan=np.inf)) or float("inf"), 1.0


def _max_error(actual, expected) -> tuple[float, float]:
    """(max |actual - expected|, max(1, max |expected|))."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        return float("inf"), 1.0
    if expected.size == 0:
        return 0.0, 1.0
    return float(np.max(np.abs(actual - expected))), max(1.0, float(np.max(np.abs(expected))))


def _tolerance(dtype) -> float:
    if np.issubdtype(dtype, np.integer):
        return 1.0  # a float64 sum of cell shares may land on the other side of an integer
    return TOLERANCE[np.dtype(dtype)]


def run_check(use_tf: bool = True) -> list[dict]:
    """Run every case; return one row per (op, backend, reference, dtype) with the worst error."""
    rng = np.random.default_rng(0)
    cases = _cases(rng)
    status = _dispatch.backend_status()
    tf = None
    tf_missing = ""
    if use_tf:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        try:
            import tensorflow as tf  # noqa: F811
        except Exception as exc:  # reported as a skipped row below, not hidden
            tf, tf_missing = None, f"{type(exc).__name__}: {exc}"
    rows: dict[tuple, dict] = {}

    def record(op, backend, reference, dtype, err, scale, n=1, note="", exact=False):
        key = (op, backend, reference, np.dtype(dtype).name)
        row = rows.setdefault(key, dict(op=op, backend=backend, reference=reference, dtype=np.dtype(dtype).name,
                                        cases=0, max_error=0.0, tolerance=0.0 if exact else _tolerance(dtype),
                                        passed=True, note=note))
        row["cases"] += n
        rel = err / scale
        row["max_error"] = max(row["max_error"], rel)
        row["passed"] = row["passed"] and rel <= row["tolerance"]

    for case in cases:
        reference = case.run("numpy", lambda a: a)
        for backend in ("cuda", "cudnn"):
            ok, reason = status[backend]
            if not ok:
                continue
            import cupy

            try:
                result = cupy.asnumpy(case.run(backend, cupy.asarray))
            except BackendUnavailableError as exc:  # e.g. cuDNN has no float64 graphs: a skip
                rows.setdefault((case.op, backend, "numpy", case.dtype.name, "unsupported"), dict(
                    op=case.op, backend=backend, reference="numpy", dtype=case.dtype.name, cases=0,
                    max_error=float("nan"), tolerance=float("nan"), passed=None,
                    note=f"skipped: {exc}"[:100]))
                continue
            except Exception as exc:  # unsupported config on that backend: report, don't hide
                rows.setdefault((case.op, backend, "numpy", case.dtype.name, "err"), dict(
                    op=case.op, backend=backend, reference="numpy", dtype=case.dtype.name, cases=1,
                    max_error=float("nan"), tolerance=_tolerance(case.dtype), passed=False,
                    note=f"{type(exc).__name__}: {exc}"[:80]))
                continue
            compare = _exact_error if case.exact else _max_error
            record(case.op, backend, "numpy", case.dtype, *compare(result, reference), exact=case.exact)
        if case.adjoint is not None and case.dtype == np.dtype(np.float64):
            lhs, rhs = case.adjoint()
            record(case.op, "numpy", "adjoint identity", np.float64, abs(lhs - rhs), max(1.0, abs(lhs)))
        if tf is not None and case.tf_run is not None:
            try:
                expected = case.tf_run(tf)
            except Exception:  # TF has no CPU kernel for this dtype/config: nothing to compare
                continue
            if case.exact:
                record(case.op, "numpy", "tensorflow", case.dtype, *_exact_error(reference, expected), exact=True)
                continue
            err, scale = _max_error(reference, expected)
            if case.dtype in (np.dtype(np.float16), bfloat16):
                scale *= 4  # TF's CPU kernels accumulate half types differently from float32
            record(case.op, "numpy", "tensorflow", case.dtype, err, scale)
    for backend in ("cuda", "cudnn"):
        ok, reason = status[backend]
        if not ok:
            rows[("*", backend)] = dict(op="(all ops)", backend=backend, reference="numpy", dtype="-", cases=0,
                                        max_error=float("nan"), tolerance=float("nan"), passed=None,
                                        note=f"skipped: {reason}")
    if tf_missing:
        rows[("*", "tensorflow")] = dict(op="(all ops)", backend="numpy", reference="tensorflow", dtype="-", cases=0,
                                         max_error=float("nan"), tolerance=float("nan"), passed=None,
                                         note=f"skipped: tensorflow does not import ({tf_missing})"[:120])
    return list(rows.values())
