"""NaN and Inf propagate exactly as IEEE arithmetic over the op's definition would propagate them.

The rule tested (TF semantics for every kernel gradops has):

* every output element is the sum of the products of the taps that read *inside* the input:
  ``x * w`` (forward), ``dy * w`` (input gradient), ``x * dy`` (filter gradient); a NaN in any
  such term makes the sum NaN, ``inf * 0`` is NaN, ``inf + -inf`` is NaN, ``inf + finite``
  stays inf with its sign;
* taps that fall on padding are skipped, never multiplied by a padded zero, so an Inf in
  ``out_backprop`` next to a border does not become NaN through the padding.  (TF's stock
  CPU Conv2DBackpropFilter multiplies by the zeros of its im2col buffer, and its
  DepthwiseConv2dNativeBackpropInput the filter by a zero-filled out_backprop buffer, and
  both produce NaN there; its Conv2DBackpropInput skips padding.  gradops follows the
  skip-padding rule in every op and every backend, so results do not depend on the backend:
  test_tf_parity.test_padding_is_skipped_not_multiplied_unlike_tf pins the difference.)
* fractional pooling: each output (forward) or input (gradient) element sums the shares of
  the cells containing it; a non-finite value reaches only those cells.

The NumPy backend is checked against the brute-force float64 loops of tests/reference.py,
which implement exactly this rule with Python floats (IEEE doubles); the GPU backends (on a GPU,
and gradops' CUDA kernels also on the CPU stand-in of tests/cuda_host.py) are checked
against the NumPy backend.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradops
import reference
from conftest import to_gpu, to_host
from pooling_cases import pool_sequence

NAN, INF = np.nan, np.inf
DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]
DTYPE_IDS = [np.dtype(d).name for d in DTYPES]
# Relative tolerance on finite elements, scaled by max |expected| (accumulation order differs).
RTOL = {np.dtype(np.float16): 4e-3, np.dtype(ml_dtypes.bfloat16): 3e-2, np.dtype(np.float32): 1e-5,
        np.dtype(np.float64): 1e-12}


def assert_same_ieee(actual, expected, dtype):
    """NaN, +Inf and -Inf at exactly the same positions; finite elements close."""
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    assert actual.shape == expected.shape
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(actual), np.isposinf(expected), err_msg="+Inf positions differ")
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected), err_msg="-Inf positions differ")
    finite = np.isfinite(expected)
    if finite.any():
        scale = max(1.0, float(np.max(np.abs(expected[finite]))))
        assert float(np.max(np.abs(actual[finite] - expected[finite]))) <= RTOL[np.dtype(dtype)] * scale


def with_specials(rng, shape, dtype, specials):
    """Standard normal values in ``dtype`` with ``specials`` {flat index: value} written in."""
    x = rng.standard_normal(shape).astype(dtype)
    flat = x.reshape(-1)
    for index, value in specials.items():
        flat[index % x.size] = value
    return x


# Which tensor gets which specials; indices are flat (mod size) so each shape can take them.
PLACEMENTS = {
    "nan-in-out_backprop": {"dy": {0: NAN}},
    "inf-at-border": {"dy": {0: INF, -1: -INF}},  # corners: their taps also read padding
    "inf-meets-minus-inf": {"dy": {0: INF, 1: -INF}},  # neighbours share input taps: inf - inf
    "inf-times-zero": {"w": {0: INF}, "dy_zero": True},  # 0 * inf in every tap of that weight
    "inf-in-input": {"x": {5: INF, 6: NAN}},
    "inf-in-filter": {"w": {1: -INF}},
}

# (rows, cols, channels, filter rows, cols, filter in_depth, out_depth, strides, padding, pads)
CONV_GEOMETRIES = {
    "same-s1": (5, 6, 2, 3, 3, 2, 3, (1, 1), "SAME", ((0, 0), (0, 0))),
    "explicit-s2-g2": (6, 5, 4, 3, 2, 2, 4, (2, 1), "EXPLICIT", ((2, 1), (0, 3))),
    "valid-s1": (5, 5, 1, 2, 3, 1, 2, (1, 1), "VALID", ((0, 0), (0, 0))),
}


def _conv_problem(rng, geometry, placement, dtype):
    h, w, c, r, s, cg, o, strides, padding, pads = CONV_GEOMETRIES[geometry]
    oh = reference.window(h, r, strides[0], 1, padding, pads[0])[0]
    ow = reference.window(w, s, strides[1], 1, padding, pads[1])[0]
    spec = PLACEMENTS[placement]
    x = with_specials(rng, (2, h, w, c), dtype, spec.get("x", {}))
    filt = with_specials(rng, (r, s, cg, o), dtype, spec.get("w", {}))
    dy = with_specials(rng, (2, oh, ow, o), dtype, spec.get("dy", {}))
    if spec.get("dy_zero"):
        dy[...] = 0
    kw = dict(strides=[1, *strides, 1], padding=padding)
    if padding == "EXPLICIT":
        kw["explicit_paddings"] = [0, 0, *pads[0], *pads[1], 0, 0]
    geo = dict(strides=strides, padding=padding, explicit=pads)
    return x, filt, dy, kw, geo


f64 = lambda a: np.asarray(a).astype(np.float64)  # noqa: E731


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("geometry", list(CONV_GEOMETRIES))
def test_conv_ops_propagate_like_ieee_loops(geometry, placement, dtype):
    rng = np.random.default_rng(7)
    x, filt, dy, kw, geo = _conv_problem(rng, geometry, placement, dtype)
    assert_same_ieee(gradops.conv2d_backprop_filter(x, list(filt.shape), dy, **kw),
                     reference.conv2d_backprop_filter(f64(x), filt.shape, f64(dy), **geo), dtype)
    assert_same_ieee(gradops.conv2d_backprop_input(list(x.shape), filt, dy, **kw),
                     reference.conv2d_backprop_input(x.shape, f64(filt), f64(dy), **geo), dtype)
    assert_same_ieee(gradops.conv2d(x, filt, **kw), reference.conv2d(f64(x), f64(filt), **geo), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
def test_depthwise_ops_propagate_like_ieee_loops(placement, dtype):
    rng = np.random.default_rng(8)
    spec = PLACEMENTS[placement]
    x = with_specials(rng, (2, 5, 6, 3), dtype, spec.get("x", {}))
    filt = with_specials(rng, (3, 2, 3, 2), dtype, spec.get("w", {}))
    dy = with_specials(rng, (2, 3, 6, 6), dtype, spec.get("dy", {}))
    if spec.get("dy_zero"):
        dy[...] = 0
    kw = dict(strides=[1, 2, 1, 1], padding="SAME")
    geo = dict(strides=(2, 1), padding="SAME")
    hwio = reference.depthwise_to_hwio(f64(filt))
    assert_same_ieee(gradops.depthwise_conv2d_native_backprop_input(list(x.shape), filt, dy, **kw),
                     reference.conv2d_backprop_input(x.shape, hwio, f64(dy), **geo), dtype)
    assert_same_ieee(gradops.depthwise_conv2d_native(x, filt, **kw), reference.conv2d(f64(x), hwio, **geo), dtype)
    assert_same_ieee(gradops.depthwise_conv2d_native_backprop_filter(x, list(filt.shape), dy, **kw),
                     reference.conv2d_backprop_filter(f64(x), hwio.shape, f64(dy), **geo).reshape(filt.shape), dtype)


def _special_calls(dtype):
    """{op: zero-argument call} with +Inf and -Inf meeting in a sum (NaN), a NaN, and values
    whose float16 sums overflow; batch 3, so the NumPy backend's thread pool gets one chunk an
    image when chunks are tiny.  (fractional_max_pool does no arithmetic on the values, so it
    is not among them.)"""
    rng = np.random.default_rng(5)
    big = 6e4 if np.dtype(dtype) == np.float16 else 3e38
    x = with_specials(rng, (3, 5, 6, 2), dtype, {0: INF, 1: -INF, 7: NAN, 9: big, 10: big})
    dy = with_specials(rng, (3, 5, 6, 4), dtype, {0: INF, 1: -INF, 3: NAN, 20: big, 21: big})
    filt = with_specials(rng, (3, 3, 2, 4), dtype, {0: INF, 4: -INF, 5: big, 6: big})
    depthwise_filt = filt.reshape(3, 3, 2, 2, 2)[..., 0].copy()
    conv = dict(strides=[1, 1, 1, 1], padding="SAME")
    rows, cols = [0, 2, 4, 5], [0, 1, 3, 5, 6]  # overlapping cells: shared rows and columns sum
    pool_x = with_specials(rng, (3, 6, 7, 2), dtype, {0: INF, 2: -INF, 5: big})  # one channel, one cell
    pool_y = gradops.fractional_max_pool(pool_x, rows, cols, True)
    pool_dy = with_specials(rng, pool_y.shape, dtype, {0: INF, 2: -INF, 4: INF, 6: -INF, 9: NAN, 11: big, 13: big})
    return {
        "conv2d": lambda: gradops.conv2d(x, filt[:, :, :, :4], **conv),
        "conv2d_backprop_input": lambda: gradops.conv2d_backprop_input(x.shape, filt, dy, **conv),
        "conv2d_backprop_filter": lambda: gradops.conv2d_backprop_filter(x, filt.shape, dy, **conv),
        "depthwise_conv2d_native": lambda: gradops.depthwise_conv2d_native(x, depthwise_filt, **conv),
        "depthwise_conv2d_native_backprop_input": lambda: gradops.depthwise_conv2d_native_backprop_input(
            x.shape, depthwise_filt, dy, **conv),
        "depthwise_conv2d_native_backprop_filter": lambda: gradops.depthwise_conv2d_native_backprop_filter(
            x, depthwise_filt.shape, dy, **conv),
        "fractional_avg_pool": lambda: gradops.fractional_avg_pool(pool_x, rows, cols, True),
        "fractional_avg_pool_grad": lambda: gradops.fractional_avg_pool_grad(pool_x.shape, pool_dy, rows, cols, True),
        "fractional_max_pool_grad": lambda: gradops.fractional_max_pool_grad(pool_x, pool_y, pool_dy, rows, cols, True),
    }


SPECIAL_OPS = list(_special_calls(np.float32))


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("op", SPECIAL_OPS)
def test_specials_raise_no_floating_point_error_or_warning(monkeypatch, op, dtype):
    """NaN, Inf and overflow follow IEEE arithmetic silently, as in TF and on the GPU: no
    RuntimeWarning and no FloatingPointError, even under a caller's np.errstate(all="raise"),
    also from the NumPy backend's pool threads (forced: 2 workers, tiny chunks); the caller's
    settings are its own again afterwards."""
    from gradops.backends import numpy_backend as nb
    monkeypatch.setattr(nb, "_WORKERS", 2)
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)
    call = _special_calls(dtype)[op]
    with warnings.catch_warnings():  # the expected result, under NumPy's default settings
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = call()
    assert not np.isfinite(f64(expected)).all()
    with warnings.catch_warnings(), np.errstate(all="raise", under="warn"):
        warnings.simplefilter("error")
        got = call()
        assert np.geterr() == {"divide": "raise", "over": "raise", "under": "warn", "invalid": "raise"}
    np.testing.assert_array_equal(f64(got), f64(expected))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_inf_next_to_padding_does_not_become_nan_in_filter_gradient(dtype):
    """One +Inf at out_backprop[0, 0, 0]: the taps that read padding there contribute nothing.

    SAME 3x3 over 3x3 ones: tap (r, s) meets out position (0, 0) only if it reads input
    (r - 1, s - 1), inside for r, s >= 1.  Those four taps are +Inf, the other five get no
    term from that position and stay finite (0 here, as every other out_backprop is 0).
    """
    x = np.ones((1, 3, 3, 1), dtype)
    dy = np.zeros((1, 3, 3, 1), dtype)
    dy[0, 0, 0, 0] = INF
    grad = gradops.conv2d_backprop_filter(x, [3, 3, 1, 1], dy, [1, 1, 1, 1], "SAME")[..., 0, 0].astype(np.float64)
    expected = np.array([[0, 0, 0], [0, INF, INF], [0, INF, INF]])
    np.testing.assert_array_equal(grad, expected)


# Single-channel problems: every matrix product the NumPy backend does has an inner size of 1
# (one channel, or a tap that meets one position), where OpenBLAS skips a product whose scalar
# operand is 0 (inf * 0 came out 0, not NaN).  (shape of x, filter [r, s], strides, padding)
SINGLE_CHANNEL = {
    "1x2 1x1 VALID": ((1, 1, 2, 1), (1, 1), (1, 1), "VALID"),
    "1x2 1x2 VALID": ((1, 1, 2, 1), (1, 2), (1, 1), "VALID"),
    "3x4 2x2 SAME": ((2, 3, 4, 1), (2, 2), (1, 1), "SAME"),
    "1x1 3x3 SAME stride 4": ((1, 1, 1, 1), (3, 3), (4, 4), "SAME"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("holder", ["x", "w", "dy"])
@pytest.mark.parametrize("problem", list(SINGLE_CHANNEL))
def test_inf_times_zero_is_nan_in_single_channel_products(problem, holder, dtype):
    """An Inf in one operand meets zeros in the other: each op's products are the loops' (NaN)."""
    x_shape, (r, s), strides, padding = SINGLE_CHANNEL[problem]
    oh = reference.window(x_shape[1], r, strides[0], 1, padding)[0]
    ow = reference.window(x_shape[2], s, strides[1], 1, padding)[0]
    operands = {"x": np.zeros(x_shape, dtype), "w": np.zeros((r, s, 1, 1), dtype),
                "dy": np.zeros((x_shape[0], oh, ow, 1), dtype)}
    flat = operands[holder].reshape(-1)
    flat[flat.size // 2] = INF  # the middle: in every problem here some product meets it
    x, filt, dy = operands["x"], operands["w"], operands["dy"]
    kw = dict(strides=[1, *strides, 1], padding=padding)
    geo = dict(strides=strides, padding=padding)
    want_dw = reference.conv2d_backprop_filter(f64(x), filt.shape, f64(dy), **geo)
    want_dx = reference.conv2d_backprop_input(x.shape, f64(filt), f64(dy), **geo)
    want_y = reference.conv2d(f64(x), f64(filt), **geo)
    assert np.isnan(np.concatenate([want_dw.ravel(), want_dx.ravel(), want_y.ravel()])).any()  # a live case
    for got, want in ((gradops.conv2d_backprop_filter(x, list(filt.shape), dy, **kw), want_dw),
                      (gradops.depthwise_conv2d_native_backprop_filter(x, list(filt.shape), dy, **kw), want_dw),
                      (gradops.conv2d_backprop_input(list(x.shape), filt, dy, **kw), want_dx),
                      (gradops.depthwise_conv2d_native_backprop_input(list(x.shape), filt, dy, **kw), want_dx),
                      (gradops.conv2d(x, filt, **kw), want_y), (gradops.depthwise_conv2d_native(x, filt, **kw), want_y)):
        assert_same_ieee(got, want, dtype)


def test_inf_plus_minus_inf_is_nan_and_same_sign_infs_stay_inf():
    """1x1 filter [1, 1] -> out depth 2 per input channel: dx = dy0 * 1 + dy1 * 1."""
    filt = np.ones((1, 1, 1, 2), np.float32)
    dy = np.array([INF, -INF, INF, INF, -INF, 1.0], np.float32).reshape(1, 1, 3, 2)
    dx = gradops.conv2d_backprop_input([1, 1, 3, 1], filt, dy, [1, 1, 1, 1], "VALID")[0, 0, :, 0]
    assert np.isnan(dx[0]) and dx[1] == INF and dx[2] == -INF


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=DTYPE_IDS)
@pytest.mark.parametrize("overlapping", [False, True])
def test_fractional_pooling_propagates_per_cell(overlapping, dtype):
    rng = np.random.default_rng(9)
    rows, cols = [0, 2, 3, 5, 6], [0, 1, 3, 5]
    x = with_specials(rng, (2, 6, 5, 2), dtype, {0: INF, 7: -INF, 20: NAN, 40: INF})
    assert_same_ieee(gradops.fractional_avg_pool(x, rows, cols, overlapping),
                     reference.fractional_avg_pool(f64(x), rows, cols, overlapping), dtype)
    dy = with_specials(rng, (2, 4, 3, 2), dtype, {0: INF, 3: -INF, 9: NAN, 14: INF, 15: -INF})
    assert_same_ieee(gradops.fractional_avg_pool_grad([2, 6, 5, 2], dy, rows, cols, overlapping),
                     reference.fractional_avg_pool_grad((2, 6, 5, 2), f64(dy), rows, cols, overlapping), dtype)


def test_one_inf_in_forward_pooling_reaches_only_its_cells():
    """Prefix-sum cell sums would give inf - inf = NaN in every later cell; they must stay finite."""
    x = np.ones((1, 4, 1, 1))
    x[0, 0, 0, 0] = INF
    out = gradops.fractional_avg_pool(x, [0, 1, 2, 3, 4], [0, 1], False)[0, :, 0, 0]
    np.testing.assert_array_equal(out, [INF, 1, 1, 1])


@st.composite
def specials_pooling(draw):
    """A forward average pooling over any sequences TF reads, with NaN / +-Inf at random places."""
    overlapping = draw(st.booleans())
    n, h, w, c = draw(st.integers(1, 2)), draw(st.integers(1, 7)), draw(st.integers(1, 7)), draw(st.integers(1, 3))
    rows, cols = draw(pool_sequence(h, overlapping)), draw(pool_sequence(w, overlapping))
    dtype = draw(st.sampled_from([np.float16, ml_dtypes.bfloat16, np.float32, np.float64]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    count = draw(st.integers(1, 6))
    specials = dict(zip(rng.integers(0, n * h * w * c, count).tolist(), rng.choice([NAN, INF, -INF], count)))
    return with_specials(rng, (n, h, w, c), dtype, specials), rows, cols, overlapping


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=specials_pooling())
def test_forward_pooling_specials_property(case):
    """Random cells (stacked, empty, past the input) and specials: TF's loop (reference.py,
    summing in the dtype, float32 for the half types) bit for bit, NaN payloads aside."""
    x, rows, cols, overlapping = case
    got = gradops.fractional_avg_pool(x, rows, cols, overlapping)
    want = reference.fractional_avg_pool(x, rows, cols, overlapping)
    assert got.dtype == want.dtype == x.dtype
    nan = np.isnan(f64(want))
    np.testing.assert_array_equal(np.isnan(f64(got)), nan)
    np.testing.assert_array_equal(got.view(f"u{x.dtype.itemsize}")[~nan], want.view(f"u{x.dtype.itemsize}")[~nan])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64], ids=DTYPE_IDS)
@pytest.mark.parametrize("rows, cols, overlapping", [
    ([0, 2, 3, 5, 6], [0, 1, 3, 5], True),
    ([0, 3, 1, 6, 6, 2], [2, 0, 5, 1], True),  # unordered: stacked and empty cells
    ([0, 2, 4, 6], [0, 2, 5], False),
])
def test_forward_pooling_specials(dtype, rows, cols, overlapping):
    """+Inf and -Inf in one cell give NaN, a lone infinity its sign, NaN NaN, empty cells 0,
    finite cells their mean, against the loop of reference.py."""
    rng = np.random.default_rng(12)
    x = with_specials(rng, (2, 6, 5, 2), dtype, {0: INF, 2: -INF, 23: NAN, 40: INF, 47: -INF, 58: INF})
    want = reference.fractional_avg_pool(f64(x), rows, cols, overlapping)
    assert np.isnan(want).any() and np.isinf(want).any()  # the specials reach the result
    assert_same_ieee(gradops.fractional_avg_pool(x, rows, cols, overlapping), want, dtype)


# --------------------------------------------------------------------------- GPU backends

def _gpu_or_skip(backend):
    ok, reason = gradops.backend_status()[backend]
    if not ok:
        pytest.skip(f"backend {backend!r} unavailable: {reason}")


def _on_backend(fn, backend, *args, **kw):
    """fn on the GPU backend with CuPy copies of the array arguments."""
    moved = [to_gpu(a) if isinstance(a, np.ndarray) else a for a in args]
    return to_host(fn(*moved, backend=backend, **kw))


def _check_on_backend(fn, backend, dtype, *args, **kw):
    """fn on the GPU backend propagates NaN/Inf like the NumPy backend.  cuDNN, which has no
    float64 convolutions, refuses float64 with a reason saying so, and its engines may add NaN
    (see assert_cudnn_keeps_specials)."""
    if backend == "cudnn" and np.dtype(dtype) == np.float64:
        with pytest.raises(gradops.BackendUnavailableError, match="float64"):
            _on_backend(fn, backend, *args, **kw)
        return
    check = assert_cudnn_keeps_specials if backend == "cudnn" else assert_same_ieee
    check(_on_backend(fn, backend, *args, **kw), fn(*args, **kw), dtype)


def assert_cudnn_keeps_specials(actual, expected, dtype):
    """cuDNN never hides a NaN or an Inf and gets every other element right, but may add NaN.

    Seen on an H100 with cuDNN 9.19 (half types, and float32 dgrad): its engines multiply the
    filter by the zero padding of out_backprop and, for depthwise half-precision problems, by
    zero-filled channel blocks, so an Inf or NaN there makes 0 * Inf = NaN in elements that
    TF's CPU kernels, gradops' CUDA kernels and NumPy leave finite.  That is NVIDIA's choice of
    arithmetic, which gradops documents rather than changes.
    """
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    assert actual.shape == expected.shape
    assert np.all(np.isnan(actual[np.isnan(expected)])), "a NaN disappeared"
    for sign in (np.inf, -np.inf):
        where = expected == sign
        assert np.all((actual[where] == sign) | np.isnan(actual[where])), f"an {sign} disappeared"
    finite = np.isfinite(expected)
    assert not np.any(np.isinf(actual[finite])), "an Inf appeared where NumPy's result is finite"
    both = finite & np.isfinite(actual)
    if both.any():
        scale = max(1.0, float(np.max(np.abs(expected[finite]))))
        assert float(np.max(np.abs(actual[both] - expected[both]))) <= RTOL[np.dtype(dtype)] * scale


def test_the_cudnn_check_catches_lost_specials_and_wrong_values():
    expected = np.array([np.nan, np.inf, -np.inf, 1.0, 2.0])
    assert_cudnn_keeps_specials(np.array([np.nan, np.inf, np.nan, np.nan, 2.0]), expected, np.float32)
    for broken in ([0.0, np.inf, -np.inf, 1.0, 2.0], [np.nan, 5.0, -np.inf, 1.0, 2.0],
                   [np.nan, np.inf, -np.inf, np.inf, 2.0], [np.nan, np.inf, -np.inf, 1.0, 2.5]):
        with pytest.raises(AssertionError):
            assert_cudnn_keeps_specials(np.array(broken), expected, np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("geometry", list(CONV_GEOMETRIES))
def test_gpu_conv_ops_propagate_like_numpy(geometry, placement, dtype, gpu_backend):
    _gpu_or_skip(gpu_backend)
    rng = np.random.default_rng(7)
    x, filt, dy, kw, _ = _conv_problem(rng, geometry, placement, dtype)
    for fn, args in ((gradops.conv2d_backprop_filter, (x, list(filt.shape), dy)),
                     (gradops.conv2d_backprop_input, (list(x.shape), filt, dy)),
                     (gradops.conv2d, (x, filt))):
        _check_on_backend(fn, gpu_backend, dtype, *args, **kw)


# (input shape, filter shape, strides, padding): gradops' CUDA kernels run the first on their
# direct kernel, the others on the tiled one (whose zeros staged outside out_backprop must not
# meet an Inf or NaN in the filter), with one-element and 16-byte staging loads.
DEPTHWISE_GEOMETRIES = {
    "3x2-s2x1": ([2, 5, 6, 3], (3, 2, 3, 2), [1, 2, 1, 1], "SAME"),
    "3x3-s1-m2": ([2, 5, 6, 3], (3, 3, 3, 2), [1, 1, 1, 1], "SAME"),
    "5x5-s2-m1-c8": ([2, 7, 6, 8], (5, 5, 8, 1), [1, 2, 2, 1], "SAME"),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("geometry", list(DEPTHWISE_GEOMETRIES))
def test_gpu_depthwise_propagates_like_numpy(geometry, placement, dtype, gpu_backend):
    _gpu_or_skip(gpu_backend)
    rng = np.random.default_rng(8)
    spec = PLACEMENTS[placement]
    x_shape, filter_shape, strides, padding = DEPTHWISE_GEOMETRIES[geometry]
    filt = with_specials(rng, filter_shape, dtype, spec.get("w", {}))
    kw = dict(strides=strides, padding=padding)
    dy_shape = gradops.depthwise_conv2d_native(np.zeros(x_shape, dtype), filt, **kw, backend="numpy").shape
    dy = with_specials(rng, dy_shape, dtype, spec.get("dy", {}))
    if spec.get("dy_zero"):
        dy[...] = 0
    fn = gradops.depthwise_conv2d_native_backprop_input
    _check_on_backend(fn, gpu_backend, dtype, x_shape, filt, dy, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("geometry", list(DEPTHWISE_GEOMETRIES))
def test_gpu_depthwise_filter_gradient_propagates_like_numpy(geometry, placement, dtype, gpu_backend):
    _gpu_or_skip(gpu_backend)
    rng = np.random.default_rng(8)
    spec = PLACEMENTS[placement]
    x_shape, filter_shape, strides, padding = DEPTHWISE_GEOMETRIES[geometry]
    x = with_specials(rng, tuple(x_shape), dtype, spec.get("x", {}))
    kw = dict(strides=strides, padding=padding)
    dy_shape = gradops.depthwise_conv2d_native(x, np.zeros(filter_shape, dtype), **kw, backend="numpy").shape
    dy = with_specials(rng, dy_shape, dtype, spec.get("dy", {}))
    if spec.get("dy_zero"):
        dy[...] = 0
    fn = gradops.depthwise_conv2d_native_backprop_filter
    _check_on_backend(fn, gpu_backend, dtype, x, list(filter_shape), dy, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gpu_fractional_pool_grad_propagates_like_numpy(cuda_device, dtype):
    _gpu_or_skip("cuda")
    rng = np.random.default_rng(9)
    dy = with_specials(rng, (2, 4, 3, 2), dtype, {0: INF, 3: -INF, 9: NAN, 14: INF, 15: -INF})
    for overlapping in (False, True):
        args = ([2, 6, 5, 2], dy, [0, 2, 3, 5, 6], [0, 1, 3, 5], overlapping)
        assert_same_ieee(_on_backend(gradops.fractional_avg_pool_grad, "cuda", *args),
                         gradops.fractional_avg_pool_grad(*args), dtype)


# ---------------------------------------------------------------- float32 subnormals
# A float32 subnormal (below 2**-126) survives as in IEEE arithmetic on every backend: the CUDA
# kernels are compiled without -ftz=true (gradops/backends/cuda/_runtime.py), so a GPU, the
# host build of the same sources and NumPy agree; with flush-to-zero these would come out 0.
SUBNORMALS = np.array([1e-40, -3e-39, 2e-45, 1.1754942e-38], np.float32)


def test_float32_subnormals_are_subnormal():
    assert np.all(np.abs(SUBNORMALS) < np.finfo(np.float32).tiny) and np.all(SUBNORMALS != 0)


@pytest.mark.parametrize("op", ["conv2d_backprop_input", "conv2d_backprop_filter",
                                "depthwise_conv2d_native_backprop_input", "fractional_avg_pool_grad"])
def test_float32_subnormals_are_kept(op, any_backend):
    """Each output element is one subnormal times 1 (a 1x1 filter of ones, an input of ones, a
    pooling cell of one element): exactly that subnormal.  cuDNN's engines are NVIDIA's and
    choose their own flush mode: there each element is the subnormal or zero."""
    if any_backend == "cudnn" and op == "fractional_avg_pool_grad":
        with pytest.raises(gradops.BackendUnavailableError):
            gradops.fractional_avg_pool_grad([1, 2, 2, 1], to_gpu(SUBNORMALS.reshape(1, 2, 2, 1)), [0, 1, 2],
                                             [0, 1, 2], backend=any_backend)
        return
    move = np.asarray if any_backend == "numpy" else to_gpu
    dy = SUBNORMALS.reshape(1, 2, 2, 1)
    ones = np.ones((1, 1, 1, 1), np.float32)
    strides = [1, 1, 1, 1]
    if op == "conv2d_backprop_filter":  # one subnormal in out_backprop, an input of ones
        dy = np.where(np.arange(4).reshape(1, 2, 2, 1) == 0, SUBNORMALS[0], 0).astype(np.float32)
        got = gradops.conv2d_backprop_filter(move(np.ones_like(dy)), [1, 1, 1, 1], move(dy), strides, "VALID",
                                             backend=any_backend)
        want = np.full((1, 1, 1, 1), SUBNORMALS[0], np.float32)
    elif op == "fractional_avg_pool_grad":
        got = gradops.fractional_avg_pool_grad([1, 2, 2, 1], move(dy), [0, 1, 2], [0, 1, 2], backend=any_backend)
        want = dy
    else:
        got = getattr(gradops, op)([1, 2, 2, 1], move(ones), move(dy), strides, "VALID", backend=any_backend)
        want = dy
    got = np.asarray(got) if any_backend == "numpy" else to_host(got)
    if any_backend == "cudnn":
        assert got.shape == want.shape and np.all((got == want) | (got == 0)), got
    else:
        np.testing.assert_array_equal(got, want)
