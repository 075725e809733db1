"""Parity with tensorflow-cpu 2.21 on every configuration class its CPU kernels accept.

Each parity case runs ``tf.raw_ops.<Op>`` and the gradops op on the same NumPy inputs and
compares the results (same shape, same dtype, values within a dtype-appropriate tolerance).
The grids are enumerated at import time without TensorFlow; ``PARITY_CASES`` lists them all
(``test_parity_case_count`` prints the breakdown).  Beside the grids, ``test_random_calls_match_tf``
draws calls at random (the fuzzer's valid calls, every public op TF has, the V2 ops against
TF's V1 op on the same shapes) and compares each one TF's CPU kernels run; ``-m slow`` adds a
20,000-draw soak of it, and a soak of the fuzzer's hostile calls that gradops accepts, each
sent to TF in a worker process (``test_accepted_hostile_calls_agree_with_tf_long``).

Which dtypes TF registers on CPU (``kernels.get_registered_kernels_for_op``, TF 2.21):

* Conv2DBackpropFilter: half, bfloat16, float, double
* Conv2DBackpropInput: half, bfloat16, float, double, **int32** (gradops has no int32: see
  ``test_int32_conv2d_backprop_input_is_not_supported``)
* DepthwiseConv2dNativeBackpropInput: half, bfloat16, float, double
* FractionalAvgPoolGrad: float, double, int32, int64 (no half types: gradops' float16 /
  bfloat16 support there has no TF counterpart)
* Conv2DBackpropFilterV2 / Conv2DBackpropInputV2: no CPU kernel at all (NotFoundError)

TF's CPU kernels come in two flavours: the stock Eigen ("custom") C++ kernels, which are the
spec, and oneDNN kernels that TF 2.21 wheels route float32/bfloat16 calls to by default.
conftest sets ``TF_ENABLE_ONEDNN_OPTS=0`` so these tests compare with the stock kernels.
They refuse the following classes, which are therefore not parity cases (they are gradops'
deliberate extensions, covered by its own tests):

* data_format NCHW ("Conv2DCustomBackprop*Op only supports NHWC"; depthwise: Unimplemented)
* dilations > 1 for conv2d_backprop_filter / _input ("do not yet support dilation rates > 1")
* grouped convolution (filter in_depth < input depth); its degenerate shapes are pinned one
  by one in ``GROUP_CASES`` (TF's and gradops' outcome for Conv2D and both gradients)
* depthwise with unequal row/column strides
* depthwise with 2-entry input_sizes (only conv2d_backprop_input accepts [rows, cols])
* VALID / EXPLICIT geometries whose computed output size is negative
* explicit_paddings given with SAME / VALID padding
* the V2 ops (no CPU kernel)
* FractionalAvgPoolGrad with any empty out_backprop / original-input dimension (gradops
  rejects these too: they are error-parity cases)

(With oneDNN on, TF 2.21 computes the first four classes, returns zeros for negative output
sizes, gives float32 / bfloat16 Conv2D and DepthwiseConv2dNative an output column of zeros
where VALID leaves none (a 1-column input, a 2-column filter; its float16 / float64 kernels
give the empty result) and ignores explicit_paddings given with SAME; it also aborts the
whole process with a CHECK failure on several invalid calls: strides of 3 entries, 3-D input/filter, 1- or 3-entry
input_sizes, negative 4-entry input_sizes.  Those crashers are deliberately kept out of
``ERROR_CASES`` so that the file is safe with either setting.)

Classes never compared because the semantics differ on purpose:

* depthwise with dilations > 1: TF accepts the attribute but *ignores* it (both kernel
  flavours compute the undilated gradient); gradops honours it
  (``test_depthwise_dilations_differ_from_tf_on_purpose``).
* FractionalAvgPoolGrad with an out_backprop batch/depth larger than orig_input_tensor_shape:
  TF corrupts its heap (orig batch < out_backprop batch aborts the process with "malloc():
  invalid size"); gradops raises InvalidArgumentError.  A smaller one is a parity case (TF
  leaves the rest of the gradient zero: ``test_fractional_smaller_batch_or_depth_computed_as_tf``),
  as are decreasing sequences, empty cells and cells starting past the input
  (``UNORDERED_SEQUENCES``) and sequences of any rank, which TF reads flat
  (``test_fractional_sequences_of_any_rank_are_read_flat``).

TF bug met on the way: Conv2DBackpropFilter with an *empty* out_backprop (e.g. VALID with an
input smaller than the filter) returns an uninitialised filter gradient (arbitrary values,
NaN) for every dtype, and float16 with strides (2, 2) segfaults the process.  For those grid
points gradops is checked against the exact answer (zeros) without calling TF.

TF crashes the whole process (CHECK failure) on several invalid calls with oneDNN on, e.g.
strides of 3 entries, 3-D input/filter, 1- or 3-entry input_sizes, negative 4-entry
input_sizes; those are deliberately *not* in ``ERROR_CASES`` (gradops' own tests cover them).
"""

from __future__ import annotations

import itertools
import zlib
from collections import Counter
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import pytest

import gradops
from conftest import RTOL, random_array

pytestmark = pytest.mark.tf

F16, BF16, F32, F64 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)
I32, I64 = np.dtype(np.int32), np.dtype(np.int64)
CONV_DTYPES = (F16, BF16, F32, F64)
FRACTIONAL_DTYPES = (F32, F64, I32, I64)

PADDINGS = ("SAME", "VALID", "EXPLICIT")
STRIDES = ((1, 1), (2, 2), (3, 3), (1, 2), (2, 1))
DEPTHWISE_STRIDES = ((1, 1), (2, 2), (3, 3))
FILTERS = ((1, 1), (2, 2), (3, 3), (5, 5), (3, 1))
INPUTS = ((1, 1), (2, 3), (5, 5), (6, 7))  # includes inputs smaller than the 3x3/5x5 filters
# (batch, in_depth, out_depth) for conv; (batch, in_depth, multiplier) for depthwise.
CONV_CHANNELS = ((1, 1, 1), (2, 3, 2), (1, 2, 3), (2, 1, 4))
DEPTHWISE_CHANNELS = ((1, 1, 1), (2, 2, 2), (1, 3, 1), (2, 1, 3), (1, 2, 3))
# (top, bottom, left, right) for EXPLICIT padding.
EXPLICIT_PADS = ((0, 0, 0, 0), (1, 1, 1, 1), (0, 2, 1, 0), (2, 1, 0, 3))


# --------------------------------------------------------------------------- geometry


def _out_size(in_size, k, stride, padding, before=0, after=0, dilation=1):
    """TF's GetWindowedOutputSizeVerbose (C++ division truncates toward zero)."""
    eff = (k - 1) * dilation + 1
    if padding == "SAME":
        return -(-in_size // stride)
    num = in_size + before + after - eff + stride
    return int(num / stride) if num < 0 else num // stride


def _explicit_attr(pads, data_format="NHWC"):
    top, bottom, left, right = pads
    if data_format == "NHWC":
        return [0, 0, top, bottom, left, right, 0, 0]
    return [0, 0, 0, 0, top, bottom, left, right]


@dataclass(frozen=True)
class Case:
    op: str  # filter | input4 | input2 | depthwise | fractional
    dtype: np.dtype
    params: tuple = field(default=())

    @property
    def id(self):
        return f"{self.op}-{self.dtype.name}-" + "-".join(str(p).replace(" ", "") for p in self.params)


def _conv_cases():
    out = []
    for i, (padding, strides, fsize, isize) in enumerate(itertools.product(PADDINGS, STRIDES, FILTERS, INPUTS)):
        pads = EXPLICIT_PADS[i % len(EXPLICIT_PADS)] if padding == "EXPLICIT" else (0, 0, 0, 0)
        oh = _out_size(isize[0], fsize[0], strides[0], padding, pads[0], pads[1])
        ow = _out_size(isize[1], fsize[1], strides[1], padding, pads[2], pads[3])
        if oh < 0 or ow < 0:
            continue  # TF (Eigen) refuses: "Computed output size would be negative"
        for j, dtype in enumerate(CONV_DTYPES):
            channels = CONV_CHANNELS[(i + j) % len(CONV_CHANNELS)]
            geom = (padding, strides, fsize, isize, channels, pads, (oh, ow))
            out.append(Case("filter", dtype, geom))
            out.append(Case("input4", dtype, geom))
            if (i + j) % 4 == 0:  # the [rows, cols] form of input_sizes on a quarter of the grid
                out.append(Case("input2", dtype, geom))
    return out


def _depthwise_cases():
    out = []
    for i, (padding, strides, fsize, isize) in enumerate(
            itertools.product(PADDINGS, DEPTHWISE_STRIDES, FILTERS, INPUTS)):
        pads = EXPLICIT_PADS[i % len(EXPLICIT_PADS)] if padding == "EXPLICIT" else (0, 0, 0, 0)
        oh = _out_size(isize[0], fsize[0], strides[0], padding, pads[0], pads[1])
        ow = _out_size(isize[1], fsize[1], strides[1], padding, pads[2], pads[3])
        if oh < 0 or ow < 0:
            continue
        for j, dtype in enumerate(CONV_DTYPES):
            channels = DEPTHWISE_CHANNELS[(i + j) % len(DEPTHWISE_CHANNELS)]
            out.append(Case("depthwise", dtype, (padding, strides, fsize, isize, channels, pads, (oh, ow))))
    return out


def _sequence(in_size, ratio, pseudo_random, seed):
    return [int(v) for v in gradops.fractional_pooling_sequence(in_size, ratio, pseudo_random, seed)]


# (shape, row sequence, col sequence): valid in both modes (a disjoint cell must not end
# before index 0, so entries after the first are >= 1).  Cells that end before they start are
# empty: decreasing entries, equal entries (disjoint), starts past the input.
UNORDERED_SEQUENCES = [
    ((1, 4, 5, 2), (0, 3, 2, 4), (0, 2, 1, 5)),  # decreasing
    ((2, 4, 3, 1), (0, 5, 10), (1, 7, 2)),  # second cells start past the input
    ((2, 5, 4, 3), (0, 2, 2, 5), (1, 1, 3, 4)),  # equal entries
    ((1, 6, 7, 2), (0, 4, 2, 6, 1, 3), (6, 1, 3, 2, 8)),  # row 3 in cells 0 and 2, not 1
    ((1, 3, 3, 1), (4, 5, 6), (0, 3)),  # every row cell past the input: all zeros
    ((2, 7, 6, 2), (6, 1, 5, 2, 7, 1, 3), (5, 5, 1, 4, 6)),
]


def _fractional_cases():
    out = []
    sizes = ((1, 1), (4, 4), (7, 5), (9, 10), (2, 6))
    ratios = ((1.0, 1.0), (1.44, 1.73), (2.0, 2.0), (1.5, 3.0))
    for i, ((rows, cols), (rr, cr), pseudo, overlapping) in enumerate(
            itertools.product(sizes, ratios, (False, True), (False, True))):
        if rows // rr < 1 or cols // cr < 1:
            continue
        rseq = _sequence(rows, rr, pseudo, seed=i)
        cseq = _sequence(cols, cr, pseudo, seed=1000 + i)
        for j, dtype in enumerate(FRACTIONAL_DTYPES):
            batch, depth = ((1, 1), (2, 3), (1, 2))[(i + j) % 3]
            out.append(Case("fractional", dtype, ((batch, rows, cols, depth), tuple(rseq), tuple(cseq), overlapping,
                                                  (len(rseq) - 1, len(cseq) - 1))))
    # Hand-made sequences TF accepts: longer than needed, stopping short of the input's end,
    # running past it (clamped), repeated values with overlapping cells, a single cell.
    # (shape, row sequence, col sequence, overlapping, (out_rows, out_cols))
    special = [
        ((2, 7, 5, 3), (0, 2, 4, 7, 9), (0, 3, 5, 6), False, (3, 2)),  # longer than needed
        ((2, 7, 5, 3), (0, 2, 4, 7, 9), (0, 3, 5, 6), True, (3, 2)),
        ((2, 7, 5, 3), (0, 2, 4, 5), (0, 3, 4), False, (3, 2)),
        ((2, 7, 5, 3), (0, 2, 4, 9), (0, 3, 8), False, (3, 2)),
        ((2, 7, 5, 3), (0, 2, 4, 9), (0, 3, 8), True, (3, 2)),
        ((1, 7, 5, 2), (0, 2, 2, 7), (0, 0, 5), True, (3, 2)),
        ((1, 6, 6, 1), (0, 6), (0, 6), False, (1, 1)),
        ((1, 6, 6, 1), (0, 6), (0, 6), True, (1, 1)),
        ((2, 5, 8, 2), (1, 3, 5), (2, 4, 6, 8), False, (2, 3)),  # first cells start after index 0
    ]
    # Sequences TF reads in any order: decreasing, equal entries, cells past the input.
    special += [(shape, rseq, cseq, overlapping, (len(rseq) - 1, len(cseq) - 1))
                for shape, rseq, cseq in UNORDERED_SEQUENCES for overlapping in (False, True)]
    for shape, rseq, cseq, overlapping, out_hw in special:
        for dtype in FRACTIONAL_DTYPES:
            out.append(Case("fractional", dtype, (shape, rseq, cseq, overlapping, out_hw)))
    return out


CONV_CASES = _conv_cases()
DEPTHWISE_CASES = _depthwise_cases()
FRACTIONAL_CASES = _fractional_cases()
PARITY_CASES = CONV_CASES + DEPTHWISE_CASES + FRACTIONAL_CASES


# --------------------------------------------------------------------------- comparison


def _seed(case: Case) -> int:
    return zlib.crc32(case.id.encode())


def _assert_matches_tf(actual, expected, dtype, scale):
    """Same shape and dtype; |actual - expected| <= RTOL[dtype] * scale elementwise.

    ``scale`` is the op applied to |inputs| in float64, i.e. the sum of |terms| of each output
    element, so half-precision results are compared relative to the magnitudes they summed
    (TF and gradops may accumulate in a different order / precision).
    """
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == np.dtype(dtype), (actual.dtype, dtype)
    if not expected.size:
        return
    a = actual.astype(np.float64)
    e = expected.astype(np.float64)
    assert np.all(np.isfinite(a)), "non-finite values in gradops' result"
    tol = RTOL[np.dtype(dtype)] * np.asarray(scale, np.float64) + np.finfo(np.float64).tiny
    # one rounding of the result to the output dtype on top of the accumulated error
    tol = tol + np.abs(e) * float(ml_dtypes.finfo(dtype).eps)
    bad = np.abs(a - e) > tol
    assert not bad.any(), (
        f"{int(bad.sum())} of {bad.size} elements differ from TF; worst |diff| "
        f"{float(np.max(np.abs(a - e)))} ({np.dtype(dtype).name})")


def _run_conv(case: Case, tf):
    padding, strides, fsize, isize, channels, pads, (oh, ow) = case.params
    dtype = case.dtype
    rng = np.random.default_rng(_seed(case))
    ep = _explicit_attr(pads) if padding == "EXPLICIT" else []
    strides4 = [1, strides[0], strides[1], 1]
    if case.op == "depthwise":
        n, c, m = channels
        filt = random_array(rng, (*fsize, c, m), dtype)
        dy = random_array(rng, (n, oh, ow, c * m), dtype)
        sizes = [n, *isize, c]
        got = gradops.depthwise_conv2d_native_backprop_input(
            np.array(sizes, np.int32), filt, dy, strides4, padding, explicit_paddings=ep)
        want = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=np.array(sizes, np.int32), filter=filt, out_backprop=dy, strides=strides4,
            padding=padding, explicit_paddings=ep).numpy()
        scale = gradops.depthwise_conv2d_native_backprop_input(
            sizes, np.abs(filt.astype(np.float64)), np.abs(dy.astype(np.float64)), strides4, padding,
            explicit_paddings=ep)
        return got, want, scale
    n, cin, cout = channels
    dy = random_array(rng, (n, oh, ow, cout), dtype)
    if case.op == "filter":
        x = random_array(rng, (n, *isize, cin), dtype)
        fs = (*fsize, cin, cout)
        got = gradops.conv2d_backprop_filter(x, tuple(fs), dy, strides4, padding, explicit_paddings=ep)
        if dy.size == 0:
            # TF bug: with an empty out_backprop the CPU filter gradient is left uninitialised
            # (garbage, NaN) and float16 with strides > 1 segfaults, so TF is not called here:
            # the exact answer is zeros of filter_sizes, in the input dtype.
            return got, np.zeros(fs, dtype), None
        want = tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=np.array(fs, np.int32), out_backprop=dy, strides=strides4,
            padding=padding, explicit_paddings=ep).numpy()
        scale = gradops.conv2d_backprop_filter(
            np.abs(x.astype(np.float64)), list(fs), np.abs(dy.astype(np.float64)), strides4, padding,
            explicit_paddings=ep)
        return got, want, scale
    w = random_array(rng, (*fsize, cin, cout), dtype)
    sizes = [n, *isize, cin] if case.op == "input4" else list(isize)
    # vary the container gradops gets the sizes in: list, tuple, int32 / int64 arrays
    kind = _seed(case) % 4
    go_sizes = [list(sizes), tuple(sizes), np.array(sizes, np.int32), np.array(sizes, np.int64)][kind]
    got = gradops.conv2d_backprop_input(go_sizes, w, dy, strides4, padding, explicit_paddings=ep)
    want = tf.raw_ops.Conv2DBackpropInput(
        input_sizes=np.array(sizes, np.int32), filter=w, out_backprop=dy, strides=strides4,
        padding=padding, explicit_paddings=ep).numpy()
    scale = gradops.conv2d_backprop_input(
        sizes, np.abs(w.astype(np.float64)), np.abs(dy.astype(np.float64)), strides4, padding,
        explicit_paddings=ep)
    return got, want, scale


@pytest.mark.parametrize("case", CONV_CASES + DEPTHWISE_CASES, ids=lambda c: c.id)
def test_conv_parity(case, tf):
    got, want, scale = _run_conv(case, tf)
    assert isinstance(got, np.ndarray)
    if case.params[6][0] * case.params[6][1] == 0:
        # Empty out_backprop: the gradient is exactly zero (TF's input gradients agree; its
        # filter gradient is not called, see _run_conv).
        assert got.shape == want.shape and got.dtype == want.dtype == case.dtype
        assert not np.any(got.astype(np.float64)), "gradient of an empty out_backprop must be 0"
        assert not np.any(want.astype(np.float64))
        return
    _assert_matches_tf(got, want, case.dtype, scale)


def _fractional_out_backprop(rng, shape, dtype):
    if np.issubdtype(dtype, np.integer):
        # values of both signs, so TF's truncation toward zero of each cell's share is exercised
        return rng.integers(-60, 61, size=shape).astype(dtype)
    return random_array(rng, shape, dtype) * np.asarray(10, dtype)


@pytest.mark.parametrize("case", FRACTIONAL_CASES, ids=lambda c: c.id)
def test_fractional_avg_pool_grad_parity(case, tf):
    shape, rseq, cseq, overlapping, (out_rows, out_cols) = case.params
    rng = np.random.default_rng(_seed(case))
    dy = _fractional_out_backprop(rng, (shape[0], out_rows, out_cols, shape[3]), case.dtype)
    kind = _seed(case) % 3
    go_shape = [list(shape), tuple(shape), np.array(shape, np.int64)][kind]
    go_rseq = [list(rseq), tuple(rseq), np.array(rseq, np.int64)][kind]
    got = gradops.fractional_avg_pool_grad(go_shape, dy, go_rseq, np.array(cseq, np.int32), overlapping)
    want = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array(shape, np.int64), out_backprop=dy,
        row_pooling_sequence=np.array(rseq, np.int64), col_pooling_sequence=np.array(cseq, np.int64),
        overlapping=overlapping).numpy()
    assert isinstance(got, np.ndarray)
    assert got.shape == want.shape and got.dtype == want.dtype == case.dtype, (got.shape, got.dtype, want.shape)
    if np.issubdtype(case.dtype, np.integer):
        np.testing.assert_array_equal(got, want)  # both: float64 sums, one truncating cast
    else:
        # both compute each element as a double sum of dy/cell_size; only the order may differ
        rtol = 1e-6 if case.dtype == F32 else 1e-13
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.max(np.abs(dy), initial=1.0)))


def test_parity_case_count():
    """The grid is as large as documented, and covers every op/dtype pair TF registers."""
    counts = Counter((c.op, c.dtype.name) for c in PARITY_CASES)
    per_op = Counter(c.op for c in PARITY_CASES)
    print(f"\nTF parity configurations: {len(PARITY_CASES)} (+ {len(ERROR_CASES)} error-parity cases)")
    for op in sorted(per_op):
        detail = ", ".join(f"{d}={n}" for (o, d), n in sorted(counts.items()) if o == op)
        print(f"  {op}: {per_op[op]} ({detail})")
    for op in ("filter", "input4", "depthwise"):
        assert {d for (o, d) in counts if o == op} == {d.name for d in CONV_DTYPES}
    assert {d for (o, d) in counts if o == "fractional"} == {d.name for d in FRACTIONAL_DTYPES}
    assert counts[("input2", "float32")] > 0
    assert 1000 <= len(PARITY_CASES) <= 4000
    # the grid really contains the corner cases it is meant to: empty out_backprop
    # (input smaller than the filter under VALID) and each stride / filter / padding
    geoms = [c.params for c in CONV_CASES]
    assert any(0 in g[6] for g in geoms)
    assert {g[1] for g in geoms} == set(STRIDES)
    assert {g[2] for g in geoms} == set(FILTERS)
    assert {g[0] for g in geoms} == set(PADDINGS)


# --------------------------------------------------------------------------- error parity

_X = np.ones((1, 5, 5, 2), np.float32)
_W = np.ones((3, 3, 2, 4), np.float32)
_DY = np.ones((1, 5, 5, 4), np.float32)
_WD = np.ones((3, 3, 2, 2), np.float32)
_S1 = [1, 1, 1, 1]


def _f(name, words, x=_X, fs=(3, 3, 2, 4), dy=_DY, strides=_S1, padding="SAME", ep=()):
    return ("filter", name, words, dict(input=x, filter_sizes=list(fs), out_backprop=dy, strides=list(strides),
                                         padding=padding, explicit_paddings=list(ep)))


def _i(name, words, sizes=(1, 5, 5, 2), w=_W, dy=_DY, strides=_S1, padding="SAME", ep=()):
    return ("input", name, words, dict(input_sizes=list(sizes), filter=w, out_backprop=dy, strides=list(strides),
                                        padding=padding, explicit_paddings=list(ep)))


def _d(name, words, sizes=(1, 5, 5, 2), w=_WD, dy=_DY, strides=_S1, padding="SAME"):
    return ("depthwise", name, words, dict(input_sizes=list(sizes), filter=w, out_backprop=dy,
                                            strides=list(strides), padding=padding))


def _df(name, words, x=_X, fs=(3, 3, 2, 2), dy=_DY, strides=_S1, padding="SAME"):
    return ("depthwise_filter", name, words, dict(input=x, filter_sizes=list(fs), out_backprop=dy,
                                                   strides=list(strides), padding=padding))


def _fr(name, words, shape=(2, 7, 5, 3), dy_shape=(2, 3, 2, 3), rseq=(0, 2, 4, 7), cseq=(0, 3, 5)):
    return ("fractional", name, words, dict(orig_input_tensor_shape=list(shape),
                                             out_backprop=np.ones(dy_shape, np.float32),
                                             row_pooling_sequence=list(rseq), col_pooling_sequence=list(cseq)))


# (op, name, words one of which gradops' message must contain, kwargs).  Every case was
# checked to raise (not crash) in TF 2.21 both with and without oneDNN (the empty
# FractionalAvgPoolGrad ones without oneDNN only, which does not touch that op).
ERROR_CASES = [
    _f("out_backprop_rows_mismatch", ("out_backprop",), dy=_DY[:, :4]),
    _f("out_backprop_depth_mismatch", ("out_backprop", "out_depth"), dy=_DY[..., :3]),
    _f("batch_mismatch", ("batch",), dy=np.ones((2, 5, 5, 4), np.float32)),
    _f("filter_depth_not_divisor", ("filter depth", "divisible"), fs=(3, 3, 3, 4)),
    _f("filter_sizes_3_entries", ("filter_sizes",), fs=(3, 3, 2)),
    _f("negative_filter_sizes", ("filter_sizes",), fs=(-3, 3, 2, 4)),
    _f("stride_in_batch", ("strides",), strides=(2, 1, 1, 1)),
    _f("zero_stride", ("strides",), strides=(1, 0, 1, 1)),
    _f("explicit_6_entries", ("explicit_paddings",), padding="EXPLICIT", ep=(0, 0, 1, 1, 1, 1)),
    _f("explicit_negative", ("explicit_paddings",), padding="EXPLICIT", ep=(0, 0, -1, 1, 1, 1, 0, 0)),
    _f("explicit_batch_pad", ("explicit_paddings",), padding="EXPLICIT", ep=(1, 0, 1, 1, 1, 1, 0, 0)),
    _f("bad_padding", ("padding",), padding="FOO"),
    _i("out_backprop_rows_mismatch", ("out_backprop",), dy=_DY[:, :4]),
    _i("out_backprop_depth_mismatch", ("out_backprop", "out_depth"), dy=_DY[..., :3]),
    _i("batch_mismatch", ("batch",), sizes=(2, 5, 5, 2)),
    _i("input_depth_not_multiple", ("depth",), sizes=(1, 5, 5, 3)),
    _i("two_entry_sizes_mismatch", ("out_backprop",), sizes=(4, 5)),
    _i("two_entry_negative", ("input_sizes",), sizes=(-5, 5)),
    _i("stride_in_batch", ("strides",), strides=(2, 1, 1, 1)),
    _i("zero_stride", ("strides",), strides=(1, 0, 1, 1)),
    _i("explicit_6_entries", ("explicit_paddings",), padding="EXPLICIT", ep=(0, 0, 1, 1, 1, 1)),
    _i("explicit_negative", ("explicit_paddings",), padding="EXPLICIT", ep=(0, 0, -1, 1, 1, 1, 0, 0)),
    _i("explicit_batch_pad", ("explicit_paddings",), padding="EXPLICIT", ep=(1, 0, 1, 1, 1, 1, 0, 0)),
    _d("out_backprop_depth_mismatch", ("depth",), dy=_DY[..., :3]),
    _d("filter_in_depth_mismatch", ("in_depth",), sizes=(1, 5, 5, 3)),
    _d("stride_in_batch", ("strides",), strides=(2, 1, 1, 1)),
    _d("zero_stride", ("strides",), strides=(1, 0, 0, 1)),
    _d("out_backprop_rows_mismatch", ("out_backprop",), dy=_DY[:, :4]),
    _d("batch_mismatch", ("batch",), sizes=(2, 5, 5, 2)),
    _df("out_backprop_depth_mismatch", ("depth",), dy=_DY[..., :3]),
    _df("filter_in_depth_mismatch", ("in_depth",), fs=(3, 3, 3, 2)),
    _df("filter_sizes_3_entries", ("filter_sizes",), fs=(3, 3, 2)),
    _df("negative_filter_sizes", ("filter_sizes",), fs=(3, -3, 2, 2)),
    _df("stride_in_batch", ("strides",), strides=(2, 1, 1, 1)),
    _df("zero_stride", ("strides",), strides=(1, 0, 0, 1)),
    _df("out_backprop_rows_mismatch", ("out_backprop",), dy=_DY[:, :4]),
    _df("batch_mismatch", ("batch",), x=np.ones((2, 5, 5, 2), np.float32)),
    _fr("row_sequence_too_short", ("row_pooling_sequence",), rseq=(0, 2, 4)),
    _fr("col_sequence_too_short", ("col_pooling_sequence",), cseq=(0, 3)),
    _fr("negative_row_sequence", ("row_pooling_sequence",), rseq=(-1, 2, 4, 7)),
    # Disjoint cells end at the next entry - 1: a next entry of 0 ends one at -1 ("Row
    # sequence tensor values must not be negative, got 0 0 4 7").
    _fr("row_cell_ends_before_0", ("row_pooling_sequence",), rseq=(0, 0, 4, 7)),
    _fr("col_cell_ends_before_0", ("col_pooling_sequence",), cseq=(3, 0, 5)),
    _fr("orig_shape_3_entries", ("orig_input_tensor_shape",), shape=(2, 7, 5)),
    _fr("out_backprop_3d", ("out_backprop",), dy_shape=(3, 2, 3)),
    _fr("zero_input_rows", ("orig_input_tensor_shape", "row_pooling_sequence"), shape=(2, 0, 5, 3), rseq=(0, 1, 2, 3)),
    _fr("empty_batch", ("out_backprop", "orig_input_tensor_shape"), shape=(0, 7, 5, 3), dy_shape=(0, 3, 2, 3)),
    _fr("empty_depth", ("out_backprop", "orig_input_tensor_shape"), shape=(2, 7, 5, 0), dy_shape=(2, 3, 2, 0)),
    _fr("empty_out_rows", ("out_backprop",), dy_shape=(2, 0, 2, 3), rseq=(0,)),
]

_TF_OPS = {"filter": "Conv2DBackpropFilter", "input": "Conv2DBackpropInput",
           "depthwise": "DepthwiseConv2dNativeBackpropInput", "depthwise_filter": "DepthwiseConv2dNativeBackpropFilter",
           "fractional": "FractionalAvgPoolGrad"}
_GO_OPS = {"filter": gradops.conv2d_backprop_filter, "input": gradops.conv2d_backprop_input,
           "depthwise": gradops.depthwise_conv2d_native_backprop_input,
           "depthwise_filter": gradops.depthwise_conv2d_native_backprop_filter,
           "fractional": gradops.fractional_avg_pool_grad}


def _tf_kwargs(op, kwargs):
    kw = dict(kwargs)
    if op == "fractional":
        for key in ("orig_input_tensor_shape", "row_pooling_sequence", "col_pooling_sequence"):
            kw[key] = np.array(kw[key], np.int64)
    else:
        key = "filter_sizes" if op in ("filter", "depthwise_filter") else "input_sizes"
        kw[key] = np.array(kw[key], np.int32)
    return kw


@pytest.mark.parametrize("op,name,words,kwargs", ERROR_CASES, ids=[f"{c[0]}-{c[1]}" for c in ERROR_CASES])
def test_error_parity(op, name, words, kwargs, tf):
    with pytest.raises((tf.errors.OpError, ValueError, TypeError)):
        getattr(tf.raw_ops, _TF_OPS[op])(**_tf_kwargs(op, kwargs))
    with pytest.raises(gradops.InvalidArgumentError) as info:
        _GO_OPS[op](**kwargs)
    message = str(info.value)
    assert any(word in message for word in words), message


def test_int32_conv2d_backprop_input_is_not_supported(tf):
    """Known disagreement: TF's CPU Conv2DBackpropInput is registered for int32, gradops is not.

    TF computes an exact integer result; gradops refuses int32 with InvalidArgumentError (its
    dtype list follows TF's GPU registrations).  This pins both behaviours: it fails if TF stops
    computing int32 or gradops starts (then turn it into a parity check).
    """
    w = np.arange(3 * 3 * 2 * 4, dtype=np.int32).reshape(3, 3, 2, 4) % 5 - 2
    dy = np.arange(25 * 4, dtype=np.int32).reshape(1, 5, 5, 4) % 7 - 3
    want = tf.raw_ops.Conv2DBackpropInput(input_sizes=np.array([1, 5, 5, 2], np.int32), filter=w, out_backprop=dy,
                                          strides=_S1, padding="SAME").numpy()
    ref = gradops.conv2d_backprop_input([1, 5, 5, 2], w.astype(np.float64), dy.astype(np.float64), _S1, "SAME")
    np.testing.assert_array_equal(want, ref.astype(np.int32))
    with pytest.raises(gradops.InvalidArgumentError, match="int32"):
        gradops.conv2d_backprop_input([1, 5, 5, 2], w, dy, _S1, "SAME")


@pytest.mark.parametrize("op", ["depthwise_conv2d_native_backprop_input", "conv2d_backprop_filter"])
def test_padding_is_skipped_not_multiplied_unlike_tf(tf, op):
    """Known disagreement, on purpose: gradops skips taps that fall on padding in every op and
    backend (tests/test_nan_inf.py), so an Inf next to a border stays Inf or finite.  TF's
    DepthwiseConv2dNativeBackpropInput multiplies the filter by its zero-filled out_backprop
    buffer and its Conv2DBackpropFilter the out_backprop by its zero-padded input patches:
    0 * Inf = NaN there.  (Its Conv2DBackpropInput skips padding, and agrees with gradops.)
    gradops' result is the brute-force skip-padding loop; TF's has NaN exactly where that
    result is finite next to the Inf, and equals it elsewhere."""
    import reference

    ones = np.ones((1, 3, 3, 1), np.float32)
    if op == "conv2d_backprop_filter":
        dy = ones.copy()
        dy[0, 0, 0, 0] = np.inf
        got = gradops.conv2d_backprop_filter(ones, [3, 3, 1, 1], dy, _S1, "SAME")
        want = reference.conv2d_backprop_filter(ones, (3, 3, 1, 1), dy, (1, 1), "SAME")
        tf_result = tf.raw_ops.Conv2DBackpropFilter(input=ones, filter_sizes=[3, 3, 1, 1], out_backprop=dy,
                                                    strides=_S1, padding="SAME").numpy()
    else:
        w = np.ones((3, 3, 1, 1), np.float32)
        w[0, 0, 0, 0] = np.inf
        got = gradops.depthwise_conv2d_native_backprop_input([1, 3, 3, 1], w, ones, _S1, "SAME")
        want = reference.conv2d_backprop_input((1, 3, 3, 1), w, ones, (1, 1), "SAME")
        tf_result = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(input_sizes=[1, 3, 3, 1], filter=w, out_backprop=ones,
                                                                  strides=_S1, padding="SAME").numpy()
    np.testing.assert_array_equal(got, want)
    finite = np.isfinite(want)
    assert finite.any() and np.isinf(want).any()
    assert np.isnan(tf_result[finite]).all()
    np.testing.assert_array_equal(tf_result[~finite], want[~finite])


def test_depthwise_dilations_differ_from_tf_on_purpose(tf):
    """TF accepts dilations on depthwise but ignores them; gradops honours them (documented).

    TF's result for dilation 2 equals the undilated gradient, gradops' does not: the call
    needs an out_backprop of the *undilated* size to get past TF's shape check, which gradops
    (computing the dilated output size) rejects.
    """
    rng = np.random.default_rng(7)
    filt = random_array(rng, (3, 3, 2, 1), np.float32)
    dy = random_array(rng, (1, 3, 3, 2), np.float32)  # VALID, 5x5 input, 3x3 filter, no dilation
    kwargs = dict(strides=_S1, padding="VALID")
    want = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=np.array([1, 5, 5, 2], np.int32), filter=filt, out_backprop=dy, dilations=[1, 2, 2, 1],
        **kwargs).numpy()
    undilated = gradops.depthwise_conv2d_native_backprop_input([1, 5, 5, 2], filt, dy, **kwargs)
    np.testing.assert_allclose(want, undilated, rtol=1e-5, atol=1e-5)
    with pytest.raises(gradops.InvalidArgumentError, match="out_backprop"):
        gradops.depthwise_conv2d_native_backprop_input([1, 5, 5, 2], filt, dy, dilations=[1, 2, 2, 1], **kwargs)


def test_depthwise_filter_gradient_dilations_differ_from_tf_on_purpose(tf):
    """As for the input gradient: TF's DepthwiseConv2dNativeBackpropFilter ignores dilations
    (its result equals the undilated one); gradops honours them and so refuses TF's
    undilated out_backprop size."""
    rng = np.random.default_rng(7)
    x = random_array(rng, (1, 5, 5, 2), np.float32)
    dy = random_array(rng, (1, 3, 3, 2), np.float32)  # VALID, 5x5 input, 3x3 filter, no dilation
    kwargs = dict(strides=_S1, padding="VALID")
    want = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=x, filter_sizes=np.array([3, 3, 2, 1], np.int32), out_backprop=dy, dilations=[1, 2, 2, 1],
        **kwargs).numpy()
    undilated = gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 1], dy, **kwargs)
    np.testing.assert_allclose(want, undilated, rtol=1e-5, atol=1e-5)
    with pytest.raises(gradops.InvalidArgumentError, match="out_backprop"):
        gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 1], dy, dilations=[1, 2, 2, 1], **kwargs)


# --------------------------------------------------------------------------- grouped convolution: degenerate shapes
#
# groups = input depth / filter in_depth.  TF's CPU gradient kernels compute no grouped
# convolution at all (Conv2DBackpropInput: "Gradients for grouped convolutions are not
# supported on CPU"; Conv2DBackpropFilter: "filter_size does not have enough elements"), its
# Conv2D does; gradops computes all three (README).  The degenerate shapes must be refused
# where TF refuses them, for the reason TF's Conv2D names; the only disagreements left are
# pinned here: TF's gradient kernels refusing every grouped call, and TF returning an empty
# or zero result *before* its group checks when a tensor is empty (Conv2D with an empty
# input; Conv2DBackpropFilter with an empty filter), where gradops judges the geometry alone.
#
# (name, input NHWC, filter HWIO, strides, {op: (TF outcome, gradops outcome)}, words of
# gradops' refusal).  "ok": computed (values compared where both compute), "error": refused.
# TF 2.21 outcomes were recorded with TF_ENABLE_ONEDNN_OPTS=0, eager, on CPU.

_GROUP_S1 = (1, 1, 1, 1)
_BOTH_OK = {"conv2d": ("ok", "ok"), "filter": ("ok", "ok"), "input": ("ok", "ok")}
GROUP_CASES = [
    # CVE-2021-29524's reproducer: input depth 0, filter in_depth 1 -> 0 groups, out_depth 1.
    ("cve_2021_29524", (0, 0, 1, 0), (1, 1, 1, 1), (1, 66, 18, 1),
     {"conv2d": ("ok", "error"), "filter": ("error", "error"), "input": ("error", "error")}, ("groups",)),
    ("in_depth0_out_depth2", (1, 3, 3, 0), (1, 1, 1, 2), _GROUP_S1,
     {"conv2d": ("ok", "error"), "filter": ("error", "error"), "input": ("error", "error")}, ("groups",)),
    ("in_depth0_filter_depth2", (2, 3, 3, 0), (1, 1, 2, 3), _GROUP_S1,
     {"conv2d": ("ok", "error"), "filter": ("error", "error"), "input": ("error", "error")}, ("groups",)),
    # 0 groups and 0 output channels: every tensor is empty, every result is empty or zero.
    ("in_depth0_out_depth0", (1, 3, 3, 0), (1, 1, 1, 0), _GROUP_S1,
     {"conv2d": ("ok", "ok"), "filter": ("ok", "ok"), "input": ("error", "ok")}, ()),
    ("filter_depth0", (1, 3, 3, 2), (1, 1, 0, 2), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("filter depth",)),
    ("in_depth0_filter_depth0", (1, 3, 3, 0), (1, 1, 0, 2), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("filter depth",)),
    ("filter_depth_not_divisor", (1, 3, 3, 3), (1, 1, 2, 2), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("divisible by filter depth",)),
    ("filter_depth_above_in_depth", (1, 3, 3, 2), (1, 1, 4, 2), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("divisible by filter depth",)),
    ("out_depth_not_multiple_of_groups", (1, 3, 3, 4), (1, 1, 2, 3), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("number of groups",)),
    ("out_depth_not_multiple_of_3_groups", (1, 3, 3, 6), (1, 1, 2, 4), _GROUP_S1,
     {op: ("error", "error") for op in ("conv2d", "filter", "input")}, ("number of groups",)),
    # TF's Conv2D returns an empty result before its group check when the batch is empty.
    ("out_depth_not_multiple_empty_batch", (0, 3, 3, 4), (1, 1, 2, 3), _GROUP_S1,
     {"conv2d": ("ok", "error"), "filter": ("error", "error"), "input": ("error", "error")}, ("number of groups",)),
    # TF's Conv2DBackpropFilter returns an empty result before any group check for an empty
    # filter (its Conv2D refuses a filter of zero elements, or returns zeros for an empty input).
    ("empty_filter_out_depth_not_multiple", (1, 3, 3, 4), (0, 1, 2, 3), _GROUP_S1,
     {"conv2d": ("error", "error"), "filter": ("ok", "error"), "input": ("error", "error")}, ("number of groups",)),
    ("empty_filter_in_depth0", (1, 3, 3, 0), (0, 1, 1, 2), _GROUP_S1,
     {"conv2d": ("ok", "error"), "filter": ("ok", "error"), "input": ("error", "error")}, ("groups",)),
    ("groups1_out_depth0", (1, 3, 3, 2), (1, 1, 2, 0), _GROUP_S1, _BOTH_OK, ()),
    ("groups2_out_depth0", (1, 3, 3, 4), (1, 1, 2, 0), _GROUP_S1,
     {"conv2d": ("ok", "ok"), "filter": ("ok", "ok"), "input": ("error", "ok")}, ()),
    ("groups2", (2, 3, 3, 4), (2, 2, 2, 4), _GROUP_S1,
     {"conv2d": ("ok", "ok"), "filter": ("error", "ok"), "input": ("error", "ok")}, ()),
    ("groups3", (1, 4, 3, 6), (2, 1, 2, 3), (1, 2, 1, 1),
     {"conv2d": ("ok", "ok"), "filter": ("error", "ok"), "input": ("error", "ok")}, ()),
]


def _group_call(module, op, x, w, dy, strides):
    """The op on NumPy tensors: ``module`` is tf.raw_ops (TF's names) or gradops."""
    attrs = dict(strides=list(strides), padding="SAME")
    if module is gradops:
        if op == "conv2d":
            return gradops.conv2d(x, w, **attrs)
        if op == "filter":
            return gradops.conv2d_backprop_filter(x, list(w.shape), dy, **attrs)
        return gradops.conv2d_backprop_input(list(x.shape), w, dy, **attrs)
    if op == "conv2d":
        return module.Conv2D(input=x, filter=w, **attrs).numpy()
    if op == "filter":
        return module.Conv2DBackpropFilter(input=x, filter_sizes=np.array(w.shape, np.int32), out_backprop=dy,
                                           **attrs).numpy()
    return module.Conv2DBackpropInput(input_sizes=np.array(x.shape, np.int32), filter=w, out_backprop=dy,
                                      **attrs).numpy()


@pytest.mark.parametrize("op", ["conv2d", "filter", "input"])
@pytest.mark.parametrize("case", GROUP_CASES, ids=[c[0] for c in GROUP_CASES])
def test_grouped_degenerate_shapes(tf, case, op):
    """Accept / refuse as pinned in GROUP_CASES, for TF and gradops; equal values where both compute."""
    name, x_shape, w_shape, strides, outcomes, words = case
    tf_outcome, go_outcome = outcomes[op]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    n, h, w, _ = x_shape
    oh, ow = -(-h // strides[1]), -(-w // strides[2])  # SAME
    x = random_array(rng, x_shape, np.float32)
    filt = random_array(rng, w_shape, np.float32)
    dy = random_array(rng, (n, oh, ow, w_shape[3]), np.float32)
    try:
        want = _group_call(tf.raw_ops, op, x, filt, dy, strides)
    except tf.errors.InvalidArgumentError:
        want = None
    assert ("ok" if want is not None else "error") == tf_outcome, f"TF's outcome changed: {want!r}"
    if go_outcome == "error":
        with pytest.raises(gradops.InvalidArgumentError) as info:
            _group_call(gradops, op, x, filt, dy, strides)
        assert any(word in str(info.value) for word in words), str(info.value)
        return
    got = _group_call(gradops, op, x, filt, dy, strides)
    expected_shape = {"conv2d": (n, oh, ow, w_shape[3]), "filter": w_shape, "input": x_shape}[op]
    assert got.shape == expected_shape and got.dtype == np.float32
    if want is not None:
        assert want.shape == got.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if 0 in x_shape or 0 in w_shape:
        assert not np.any(got), "a result of empty tensors must be zeros"


@pytest.mark.parametrize("case", [c for c in GROUP_CASES if c[4]["filter"][1] == "error"],
                         ids=[c[0] for c in GROUP_CASES if c[4]["filter"][1] == "error"])
def test_grouped_degenerate_shapes_v2_ops(case):
    """The V2 ops (no TF kernel) refuse exactly what their V1 forms refuse, with the same reason."""
    name, x_shape, w_shape, strides, _, words = case
    x, filt = np.zeros(x_shape, np.float32), np.zeros(w_shape, np.float32)
    n, h, w, _ = x_shape
    dy = np.zeros((n, -(-h // strides[1]), -(-w // strides[2]), w_shape[3]), np.float32)
    for fn in (gradops.conv2d_backprop_filter_v2, gradops.conv2d_backprop_input_v2):
        with pytest.raises(gradops.InvalidArgumentError) as info:
            fn(x, filt, dy, list(strides), "SAME")
        assert any(word in str(info.value) for word in words), str(info.value)


# --------------------------------------------------------------------------- fractional pooling: unordered sequences


def _bits(x):
    x = np.asarray(x)
    return x.view(f"u{x.itemsize}")


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("dtype", FRACTIONAL_DTYPES, ids=[d.name for d in FRACTIONAL_DTYPES])
@pytest.mark.parametrize("shape,rseq,cseq", UNORDERED_SEQUENCES, ids=[str(i) for i in range(len(UNORDERED_SEQUENCES))])
def test_fractional_unordered_sequences_bit_exact(tf, shape, rseq, cseq, overlapping, dtype):
    """Decreasing sequences, empty cells, cells past the input: TF's result bit for bit (both
    sum each element's shares in double in cell order and cast once)."""
    rng = np.random.default_rng(zlib.crc32(repr((shape, rseq, cseq, overlapping, dtype.name)).encode()))
    dy = _fractional_out_backprop(rng, (shape[0], len(rseq) - 1, len(cseq) - 1, shape[3]), dtype)
    want = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array(shape, np.int64), out_backprop=dy,
        row_pooling_sequence=np.array(rseq, np.int64), col_pooling_sequence=np.array(cseq, np.int64),
        overlapping=overlapping).numpy()
    got = gradops.fractional_avg_pool_grad(list(shape), dy, list(rseq), list(cseq), overlapping)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_fractional_cell_ending_before_0_refused_like_tf(tf, overlapping):
    """Rows [0, 0, 4]: TF refuses the disjoint cell [0, -1] (a "negative" value) but computes
    the overlapping one-row cell [0, 0]; gradops does the same."""
    dy = np.arange(1.0, 3.0).reshape(1, 2, 1, 1)
    kw = dict(orig_input_tensor_shape=[1, 4, 1, 1], out_backprop=dy, row_pooling_sequence=[0, 0, 4],
              col_pooling_sequence=[0, 1], overlapping=overlapping)
    tf_kw = {k: (np.array(v, np.int64) if isinstance(v, list) else v) for k, v in kw.items()}
    if overlapping:
        want = tf.raw_ops.FractionalAvgPoolGrad(**tf_kw).numpy()
        np.testing.assert_array_equal(gradops.fractional_avg_pool_grad(**kw), want)
        return
    with pytest.raises(tf.errors.InvalidArgumentError, match="must not be negative"):
        tf.raw_ops.FractionalAvgPoolGrad(**tf_kw)
    with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence"):
        gradops.fractional_avg_pool_grad(**kw)


@pytest.mark.parametrize("dy_shape", [(1, 2, 1, 2), (2, 2, 1, 1)], ids=["smaller_batch", "smaller_depth"])
def test_fractional_smaller_batch_or_depth_computed_as_tf(tf, dy_shape):
    """An out_backprop with fewer batches or channels than the original input is memory-safe
    in TF, which leaves the gradient's other batches / channels 0: gradops returns that result
    (it pads out_backprop with zeros).  A larger one makes TF write out of bounds and is
    refused (only the smaller direction is run through TF: the larger one corrupts its heap)."""
    dy = np.arange(1.0, 1.0 + np.prod(dy_shape)).reshape(dy_shape)
    shape = (2, 4, 1, 2)
    want = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array(shape, np.int64), out_backprop=dy,
        row_pooling_sequence=np.array([0, 2, 4], np.int64), col_pooling_sequence=np.array([0, 1], np.int64)).numpy()
    n, _, _, d = dy_shape
    padded = np.zeros((2, 2, 1, 2))
    padded[:n, :, :, :d] = dy
    np.testing.assert_array_equal(want, gradops.fractional_avg_pool_grad(list(shape), padded, [0, 2, 4], [0, 1]))
    np.testing.assert_array_equal(want, gradops.fractional_avg_pool_grad(list(shape), dy, [0, 2, 4], [0, 1]))
    with pytest.raises(gradops.InvalidArgumentError, match="orig_input_tensor_shape"):
        gradops.fractional_avg_pool_grad([1, 4, 1, 1], dy, [0, 2, 4], [0, 1])


@pytest.mark.parametrize("rows", [[[0, 2], [5, 6]], [[[0, 2, 5]]]], ids=["2d", "3d"])
def test_fractional_sequences_of_any_rank_are_read_flat(tf, rows):
    """FractionalAvgPoolGrad reads its pooling sequences flat whatever their rank; so does
    gradops (its max pooling gradient, like TF's, wants 1-D)."""
    dy = np.arange(1.0, 9.0).reshape(1, 2, 2, 2)
    rows = np.array(rows, np.int64)
    want = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array([1, 5, 6, 2], np.int64), out_backprop=dy, row_pooling_sequence=rows,
        col_pooling_sequence=np.array([0, 3, 6], np.int64)).numpy()
    np.testing.assert_array_equal(gradops.fractional_avg_pool_grad([1, 5, 6, 2], dy, rows, [0, 3, 6]), want)
    np.testing.assert_array_equal(gradops.fractional_avg_pool_grad([1, 5, 6, 2], dy, rows.reshape(-1), [0, 3, 6]), want)


# --------------------------------------------------------------------------- signed zeros
#
# np.testing.assert_array_equal and assert_close take -0.0 for +0.0, so the parity tests above
# cannot see a zero's sign.  These inputs are mostly zeros of both signs (products of zeros
# and sums of them decide the result's sign), and every backend's zeros must carry TF's sign.


def _signed_zeros(rng, shape, dtype):
    """Zeros of random sign, a tenth of the elements small integers (exact in every dtype)."""
    x = np.where(rng.random(shape) < 0.5, -0.0, 0.0)
    pick = rng.random(shape) < 0.1
    x[pick] = rng.integers(-3, 4, int(pick.sum()))
    return x.astype(dtype)


def _assert_tf_signs(name, got, want, dtype):
    got, want = np.asarray(got).astype(np.float64), np.asarray(want).astype(np.float64)
    assert_tf_close(got, want, dtype)
    zero = (got == 0) & (want == 0)
    wrong = int((np.signbit(got[zero]) != np.signbit(want[zero])).sum())
    assert wrong == 0, f"{name}: {wrong} of {int(zero.sum())} zeros have the other sign than TF's"


def assert_tf_close(got, want, dtype):
    tol = RTOL[np.dtype(dtype)] * max(1.0, float(np.max(np.abs(want))) if want.size else 1.0)
    assert float(np.max(np.abs(got - want))) <= tol if want.size else True


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("depth", [1, 8, 32])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
def test_convolution_gradients_give_tf_signed_zeros(tf, any_backend, dtype, stride, depth, data_format):
    """The four convolution gradients, every backend (NCHW through a transpose of TF's NHWC
    result, which TF cannot compute)."""
    from conftest import to_gpu, to_host

    rng = np.random.default_rng(depth * 10 + stride)
    x = _signed_zeros(rng, (2, 9, 9, depth), dtype)
    depthwise_filter = _signed_zeros(rng, (3, 3, depth, 1), dtype)
    conv_filter = _signed_zeros(rng, (3, 3, depth, 4), dtype)
    strides = [1, stride, stride, 1]
    out_rows = -(-9 // stride)
    dy = _signed_zeros(rng, (2, out_rows, out_rows, depth), dtype)
    dy4 = _signed_zeros(rng, (2, out_rows, out_rows, 4), dtype)
    nchw = data_format == "NCHW"
    layout = (lambda a: np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))) if nchw else (lambda a: a)
    back = (lambda a: np.transpose(a, (0, 2, 3, 1))) if nchw else (lambda a: a)
    ours_strides = [1, 1, stride, stride] if nchw else strides
    on = (lambda a: to_gpu(layout(a))) if any_backend != "numpy" else layout
    host = to_host if any_backend != "numpy" else (lambda a: a)
    common = dict(padding="SAME", data_format=data_format, backend=any_backend)
    filter_on = to_gpu if any_backend != "numpy" else (lambda a: a)
    kinds = (("dw", gradops.depthwise_conv2d_native_backprop_input, gradops.depthwise_conv2d_native_backprop_filter,
              tf.raw_ops.DepthwiseConv2dNativeBackpropInput, tf.raw_ops.DepthwiseConv2dNativeBackpropFilter,
              depthwise_filter, dy),
             ("conv", gradops.conv2d_backprop_input, gradops.conv2d_backprop_filter,
              tf.raw_ops.Conv2DBackpropInput, tf.raw_ops.Conv2DBackpropFilter, conv_filter, dy4))
    for kind, input_grad, filter_grad, tf_input_grad, tf_filter_grad, filt, grad in kinds:
        tf_args = dict(out_backprop=grad, strides=strides, padding="SAME")
        cases = {
            f"{kind} input gradient": (
                lambda: back(host(input_grad(list(layout(x).shape), filter_on(filt), on(grad), ours_strides,
                                             **common))),
                lambda: tf_input_grad(input_sizes=x.shape, filter=filt, **tf_args)),
            f"{kind} filter gradient": (
                lambda: host(filter_grad(on(x), list(filt.shape), on(grad), ours_strides, **common)),
                lambda: tf_filter_grad(input=x, filter_sizes=filt.shape, **tf_args)),
        }
        for name, (ours, theirs) in cases.items():
            try:
                got = ours()
            except gradops.BackendUnavailableError as exc:  # cuDNN: no float64, say
                assert any_backend == "cudnn", exc
                continue
            _assert_tf_signs(name, got, theirs().numpy(), dtype)


@pytest.mark.parametrize("dtype", [F16, F32, F64], ids=["float16", "float32", "float64"])
def test_a_lone_negative_zero_product_sums_to_tf_positive_zero(tf, any_backend, dtype):
    """One channel and a tap that meets one position: each sum has a single product, -0 * 1.
    TF's sums start from +0, so they give +0; a sum that is just the product keeps -0."""
    from conftest import to_gpu, to_host

    on = to_gpu if any_backend != "numpy" else (lambda a: a)
    host = to_host if any_backend != "numpy" else (lambda a: a)
    minus_zero, one = np.full((1, 1, 1, 1), -0.0, dtype), np.ones((1, 1, 1, 1), dtype)
    strides, common = [1, 1, 1, 1], dict(padding="VALID", backend=any_backend)
    cases = {
        "conv filter gradient": (lambda: gradops.conv2d_backprop_filter(on(minus_zero), [1, 1, 1, 1], on(one), strides,
                                                                        **common),
                                 lambda: tf.raw_ops.Conv2DBackpropFilter(input=minus_zero, filter_sizes=[1, 1, 1, 1],
                                                                         out_backprop=one, strides=strides,
                                                                         padding="VALID")),
        "conv input gradient": (lambda: gradops.conv2d_backprop_input([1, 1, 1, 1], on(minus_zero), on(one), strides,
                                                                      **common),
                                lambda: tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 1, 1, 1], filter=minus_zero,
                                                                       out_backprop=one, strides=strides,
                                                                       padding="VALID")),
        "dw filter gradient": (lambda: gradops.depthwise_conv2d_native_backprop_filter(
                                   on(minus_zero), [1, 1, 1, 1], on(one), strides, **common),
                               lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
                                   input=minus_zero, filter_sizes=[1, 1, 1, 1], out_backprop=one, strides=strides,
                                   padding="VALID")),
        "dw input gradient": (lambda: gradops.depthwise_conv2d_native_backprop_input(
                                  [1, 1, 1, 1], on(minus_zero), on(one), strides, **common),
                              lambda: tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
                                  input_sizes=[1, 1, 1, 1], filter=minus_zero, out_backprop=one, strides=strides,
                                  padding="VALID")),
    }
    for name, (ours, theirs) in cases.items():
        want = theirs().numpy()
        assert not np.signbit(want).any(), f"{name}: TF gave -0 here"  # the rule this test pins
        try:
            got = host(ours())
        except gradops.BackendUnavailableError as exc:  # cuDNN: no float64, say
            assert any_backend == "cudnn", exc
            continue
        _assert_tf_signs(name, got, want, dtype)


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("depth", [1, 8, 32])
def test_fractional_pooling_gradients_give_tf_signed_zeros(tf, any_backend, overlapping, depth):
    """Both fractional pooling gradients, every backend, float32 (the type both TF ops share
    with every gradops backend)."""
    from conftest import to_gpu, to_host

    if any_backend == "cudnn":
        pytest.skip("cuDNN has no fractional pooling")
    rng = np.random.default_rng(depth + overlapping)
    x = _signed_zeros(rng, (2, 12, 12, depth), np.float32)
    y, rows, cols = tf.raw_ops.FractionalMaxPool(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0], pseudo_random=True,
                                                 overlapping=overlapping, deterministic=True, seed=3, seed2=4)
    rows, cols, y = rows.numpy(), cols.numpy(), y.numpy()
    dy = _signed_zeros(rng, y.shape, np.float32)
    on = to_gpu if any_backend != "numpy" else (lambda a: a)
    host = to_host if any_backend != "numpy" else (lambda a: a)
    _assert_tf_signs("fractional avg pool gradient",
                     host(gradops.fractional_avg_pool_grad(list(x.shape), on(dy), rows, cols, overlapping,
                                                           backend=any_backend)),
                     tf.raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=x.shape, out_backprop=dy,
                                                      row_pooling_sequence=rows, col_pooling_sequence=cols,
                                                      overlapping=overlapping).numpy(), np.float32)
    _assert_tf_signs("fractional max pool gradient",
                     host(gradops.fractional_max_pool_grad(on(x), on(y), on(dy), rows, cols, overlapping,
                                                           backend=any_backend)),
                     tf.raw_ops.FractionalMaxPoolGrad(orig_input=x, orig_output=y, out_backprop=dy,
                                                      row_pooling_sequence=rows, col_pooling_sequence=cols,
                                                      overlapping=overlapping).numpy(), np.float32)


#: Each gradops op and the tf.raw_ops op whose arguments it takes.
SIGNATURE_OPS = {
    "conv2d_backprop_filter": "Conv2DBackpropFilter",
    "conv2d_backprop_filter_v2": "Conv2DBackpropFilterV2",
    "conv2d_backprop_input": "Conv2DBackpropInput",
    "conv2d_backprop_input_v2": "Conv2DBackpropInputV2",
    "depthwise_conv2d_native_backprop_input": "DepthwiseConv2dNativeBackpropInput",
    "depthwise_conv2d_native_backprop_filter": "DepthwiseConv2dNativeBackpropFilter",
    "fractional_avg_pool_grad": "FractionalAvgPoolGrad",
    "fractional_max_pool_grad": "FractionalMaxPoolGrad",
    "conv2d": "Conv2D",
    "depthwise_conv2d_native": "DepthwiseConv2dNative",
}


def _tf_default(value):
    return tuple(value) if isinstance(value, list) else value  # TF's [] / [1, 1, 1, 1]: tuples here


@pytest.mark.parametrize("op", sorted(SIGNATURE_OPS))
def test_arguments_are_tf_raw_ops_own(tf, op):
    """Names, order and defaults of every argument as tf.raw_ops has them (``name`` included, so
    that a TF call with ``name=`` runs unchanged), then gradops' keyword-only ``backend``."""
    import inspect

    ours = inspect.signature(getattr(gradops, op)).parameters.values()
    theirs = inspect.signature(getattr(tf.raw_ops, SIGNATURE_OPS[op])).parameters.values()
    assert [(p.name, _tf_default(p.default)) for p in ours if p.kind is not p.KEYWORD_ONLY] == \
           [(p.name, _tf_default(p.default)) for p in theirs]
    assert [p.name for p in ours if p.kind is p.KEYWORD_ONLY] == ["backend"]


@pytest.mark.parametrize("name", [None, "grad", "", 5])
def test_name_is_accepted_and_ignored_as_in_tf_eager(tf, name):
    """TF's eager mode ignores ``name`` whatever it is; so does gradops."""
    x = np.ones((1, 3, 3, 1), np.float32)
    f = np.ones((2, 2, 1, 1), np.float32)
    dy = np.ones((1, 2, 2, 1), np.float32)
    expected = tf.raw_ops.Conv2DBackpropInput(input_sizes=x.shape, filter=f, out_backprop=dy, strides=[1, 1, 1, 1],
                                              padding="VALID", name=name).numpy()
    got = gradops.conv2d_backprop_input(x.shape, f, dy, [1, 1, 1, 1], "VALID", name=name)
    np.testing.assert_array_equal(got, expected)


# --------------------------------------------------------------------------- random draws

# The grids above enumerate configuration classes; these properties draw calls at random (the
# fuzzer's valid-call strategies, tests/test_fuzz.py, on tiny shapes, with NaN / Inf, strided,
# byte-swapped and list inputs) and compare every one TF's CPU kernels run.  A call TF refuses
# must be refused for one of the reasons in TF_EXTENSION_REFUSALS (gradops' extensions, listed
# in the module docstring), or be refused by gradops too.

from hypothesis import event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conv_cases import conv_problems  # noqa: E402
from test_fuzz import CI, LONG, conv_calls, pool_calls  # noqa: E402

#: gradops op -> (TF raw op, the TF argument a V2 op's shape tensor becomes).
RANDOM_OPS = {
    "conv2d": ("Conv2D", None),
    "conv2d_backprop_filter": ("Conv2DBackpropFilter", None),
    "conv2d_backprop_filter_v2": ("Conv2DBackpropFilter", ("filter", "filter_sizes")),
    "conv2d_backprop_input": ("Conv2DBackpropInput", None),
    "conv2d_backprop_input_v2": ("Conv2DBackpropInput", ("input", "input_sizes")),
    "depthwise_conv2d_native": ("DepthwiseConv2dNative", None),
    "depthwise_conv2d_native_backprop_filter": ("DepthwiseConv2dNativeBackpropFilter", None),
    "depthwise_conv2d_native_backprop_input": ("DepthwiseConv2dNativeBackpropInput", None),
    "fractional_avg_pool_grad": ("FractionalAvgPoolGrad", None),
    "fractional_max_pool_grad": ("FractionalMaxPoolGrad", None),
}
#: How TF 2.21's stock CPU kernels word their refusal of the classes gradops computes on purpose.
TF_EXTENSION_REFUSALS = (
    "do not yet support dilation rates larger than 1",
    "Gradients for grouped convolutions are not supported on CPU",
    "filter_size does not have enough elements",  # a grouped filter gradient: in_depth / groups
    "only supports equal length strides in the row and column dimensions",
    "only supports NHWC", "only supports the NHWC tensor format", "only supported for NHWC format",
    "Value for attr 'T' of half is not in the list", "Value for attr 'T' of bfloat16 is not in the list",
)


@st.composite
def tf_shaped_problems(draw):
    """conv_problems leaning toward what TF's CPU kernels run: NHWC, mostly no dilation and one
    group, equal strides half the time (depthwise needs them), maps up to 9 x 9."""
    p = draw(conv_problems())
    p.update(layout="NHWC", h=draw(st.integers(1, 9)), w=draw(st.integers(1, 9)))
    if draw(st.integers(0, 4)):
        p["dilations"] = (1, 1)
        if draw(st.booleans()):
            p["groups"] = 1
    if draw(st.booleans()):
        p["strides"] = (p["strides"][0], p["strides"][0])
    return p


def random_tf_calls():
    return st.one_of(conv_calls(problems=tf_shaped_problems), pool_calls())


def _as_tf_argument(value):
    """A dressed argument as TF takes it: native byte order, C order, nested lists as float64."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return np.asarray(value, np.float64)
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value.astype(value.dtype.newbyteorder("=")))
    return value


def _tf_call(op, kwargs):
    """(TF raw op name, its arguments) of a gradops call."""
    name, v2 = RANDOM_OPS[op]
    args = {key: _as_tf_argument(value) for key, value in kwargs.items() if key != "use_cudnn_on_gpu"}
    if v2:
        tensor, sizes = v2
        args[sizes] = np.asarray(np.shape(args.pop(tensor)), np.int32)
    for key in ("filter_sizes", "input_sizes"):
        if key in args:
            args[key] = np.asarray(args[key], np.int32)
    for key in ("orig_input_tensor_shape", "row_pooling_sequence", "col_pooling_sequence"):
        if key in args:
            args[key] = np.asarray(args[key], np.int64)
    for key in ("strides", "dilations", "explicit_paddings"):
        if key in args:
            args[key] = [int(v) for v in np.asarray(args[key]).reshape(-1)]
    if "overlapping" in args:
        args["overlapping"] = bool(args["overlapping"])
    return name, args


def _not_finite(args):
    return any(isinstance(v, np.ndarray) and v.dtype.kind in "fV" and v.size
               and not np.isfinite(v.astype(np.float64)).all() for v in args.values())


def _not_compared(op, args) -> str | None:
    """Why a call whose TF arguments are ``args`` is not sent to TF, or None."""
    if op.startswith("depthwise") and any(d != 1 for d in args["dilations"]):
        return "TF ignores depthwise dilations; gradops honours them (module docstring)"
    if op.startswith("depthwise_conv2d_native_backprop_input") and np.size(args["input_sizes"]) == 2:
        return "only Conv2DBackpropInput takes [rows, cols]"
    if "backprop_filter" in op and np.size(args["out_backprop"]) == 0:
        return "TF's uninitialised filter gradient (module docstring)"
    return None


def _is_extension(message: str) -> bool:
    return any(reason in message for reason in TF_EXTENSION_REFUSALS)


#: The arguments whose values a result sums over (a V2 op's shape tensor is all zeros).
SUMMED_TENSORS = ("input", "filter", "out_backprop")


def _magnitudes(op, kwargs):
    """The op on the tensors' absolute values in float64: each result element's sum of |terms|,
    the scale of its rounding errors (TF may sum half types in their own precision, gradops in
    float32: with cancellation the two differ by far more than the result's size)."""
    summed = {k: np.abs(np.asarray(v).astype(np.float64)) if k in SUMMED_TENSORS else v
              for k, v in kwargs.items()}
    with np.errstate(all="ignore"):
        return np.asarray(getattr(gradops, op)(**summed), np.float64)


def _assert_same_as_tf(op, kwargs, args, got, want):
    """gradops' result ``got`` of ``op(**kwargs)`` against TF's ``want`` for the same call as
    TF's arguments ``args``."""
    assert isinstance(got, np.ndarray) and got.shape == want.shape and got.dtype == want.dtype, \
        (got.shape, got.dtype, want.shape, want.dtype)
    if op == "fractional_max_pool_grad" or got.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)  # TF's selection and summation order
        return
    a, e = got.astype(np.float64), want.astype(np.float64)
    if "padding" in args and _not_finite(args):
        # TF multiplies Inf / NaN by the zeros of padded or missing out_backprop positions;
        # gradops skips those taps (README, "Semantics"): TF's NaN there, gradops' finite sum.
        e = np.where(np.isnan(e) & ~np.isnan(a), a, e)
    np.testing.assert_array_equal(np.isnan(a), np.isnan(e), err_msg="NaN positions differ")
    np.testing.assert_array_equal(a[np.isinf(e)], e[np.isinf(e)], err_msg="Inf positions differ")
    finite = np.isfinite(e)
    np.testing.assert_array_equal(np.isfinite(a), finite, err_msg="Inf positions differ")
    if finite.any():
        scale = np.abs(e) if op.startswith("fractional") else _magnitudes(op, kwargs) + np.abs(e)
        tolerance = 4 * RTOL[got.dtype] * np.maximum(scale, 1.0)  # not finite where Inf / NaN was summed
        bad = finite & ~(np.abs(a - e) <= tolerance)
        assert not bad.any(), (f"{int(bad.sum())} elements differ from TF beyond 4 x RTOL x their sums of "
                               f"|terms|; worst |diff| {float(np.max(np.abs(a - e)[bad]))}")


def check_random_call_against_tf(tf, call):
    op, kwargs, _, _ = call
    if op not in RANDOM_OPS:
        return  # the forward fractional poolings: TF draws its own sequences
    name, args = _tf_call(op, kwargs)
    if _not_compared(op, args):
        return
    try:
        want = getattr(tf.raw_ops, name)(**args).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as error:
        if _is_extension(str(error)):
            event(f"TF refuses {op} (a gradops extension)")
            return
        with pytest.raises(gradops.InvalidArgumentError):
            getattr(gradops, op)(**kwargs)
        return
    event(f"compared {op}")
    _assert_same_as_tf(op, kwargs, args, getattr(gradops, op)(**kwargs), want)


@settings(CI, max_examples=800)
@given(call=random_tf_calls())
def test_random_calls_match_tf(tf, call):
    check_random_call_against_tf(tf, call)


@pytest.mark.slow
@settings(LONG)
@given(call=random_tf_calls())
def test_random_calls_match_tf_long(tf, call):
    check_random_call_against_tf(tf, call)


#: Planted errors the random comparison must catch: (op, a wrong answer made from the right one).
#: Each must be caught at the CI size nearly always: the tolerance follows each element's sum of
#: |terms|, so a draw with cancelling terms hides a small error: a 1e-3 error and reversed rows
#: (a one-row result is its own reversal) were missed in 2 of 120 runs, a 1% error in 2 of 20.
PLANTED = {
    "v2 input gradient, sign flipped": ("conv2d_backprop_input_v2", lambda r: -r),
    "max pooling gradient, one element an ulp off": (
        "fractional_max_pool_grad",
        lambda r: np.concatenate([(np.nextafter(r.reshape(-1)[:1], np.inf) if r.dtype.kind == "f"
                                   else r.reshape(-1)[:1] + 1).astype(r.dtype), r.reshape(-1)[1:]]).reshape(r.shape)),
    "depthwise filter gradient, sign flipped": ("depthwise_conv2d_native_backprop_filter", lambda r: -r),
    "integer average pooling gradient, one too large": (
        "fractional_avg_pool_grad", lambda r: r + 1 if r.dtype.kind == "i" else r),
}


@pytest.mark.parametrize("plant", PLANTED)
def test_random_comparison_catches_planted_errors(tf, monkeypatch, plant):
    """The property above, at its CI size, fails on each planted wrong answer (no shrinking)."""
    from hypothesis import Phase

    op, wrong = PLANTED[plant]
    right = getattr(gradops, op)
    monkeypatch.setattr(gradops, op, lambda *a, **k: (lambda r: wrong(r) if r.size else r)(right(*a, **k)))

    @settings(CI, max_examples=800, database=None, phases=[Phase.generate])
    @given(call=random_tf_calls())
    def comparison(call):
        check_random_call_against_tf(tf, call)

    with pytest.raises(AssertionError):
        comparison()


# --------------------------------------------------------------------------- hostile calls gradops accepts

# The fuzzer's hostile calls (tests/test_fuzz.py) that gradops computes, sent to TF in a worker
# process (tests/tf_worker.py: TF aborts the process on some calls): TF must compute the same
# result, or refuse for one of gradops' documented extensions.  gradops is more lenient than TF's
# Python wrappers about how an argument is given, not about its value: attribute lists as NumPy
# arrays, flags as np.bool_, sizes as any integer array and tensors as nested lists (float64,
# as NumPy reads them); those are passed to TF as it takes them.  A call that crashes TF is an
# event, not a failure (gradops' answer is checked by the fuzzer against tests/reference.py).

from test_fuzz import FUZZ_HOST_MEMORY, hostile_calls  # noqa: E402

#: Tensors above this many elements (the fuzzer's zero-stride views of up to 2**40) are not sent.
TF_WORKER_MAX_ELEMENTS = 1 << 20


@pytest.fixture(scope="module")
def tf_worker():
    pytest.importorskip("tensorflow")
    from tf_worker import TFWorker

    worker = TFWorker()
    yield worker
    worker.close()


def _tf_call_of_accepted(op, kwargs):
    """_tf_call's arguments for an accepted hostile call, or None where TF cannot be given them
    (a tensor too large to send, a size past int32 / int64)."""
    if any(np.size(v) > TF_WORKER_MAX_ELEMENTS for v in kwargs.values() if isinstance(v, np.ndarray)):
        return None
    sizes = [kwargs.get(k) for k in ("filter_sizes", "input_sizes") if kwargs.get(k) is not None]
    if any(np.asarray(v).dtype.kind not in "iub" or np.any(np.abs(np.asarray(v, np.float64)) >= 2**31)
           for v in sizes):
        return None
    try:
        return _tf_call(op, kwargs)
    except (TypeError, ValueError, OverflowError):  # e.g. an attribute list past int64
        return None


@pytest.mark.slow
@settings(LONG)
@given(call=hostile_calls())
def test_accepted_hostile_calls_agree_with_tf_long(tf_worker, call):
    op, kwargs = call
    if op not in RANDOM_OPS:
        return
    from gradops import _arrays

    try:
        # As in the fuzzer: valid calls too large for a test machine take the refusal path.
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_arrays, "host_memory_bytes", lambda: FUZZ_HOST_MEMORY)
            patch.setattr(_arrays, "_device_totals", {})
            got = getattr(gradops, op)(**kwargs)
    except (gradops.InvalidArgumentError, TypeError):
        return  # refusals: the fuzzer checks them
    tf_call = _tf_call_of_accepted(op, kwargs)
    if tf_call is None or _not_compared(op, tf_call[1]):
        return
    name, args = tf_call
    answer = tf_worker.call(name, args)
    if answer[0] == "crashed":
        event(f"TF crashed on {op} ({answer[1]})")
        return
    if answer[0] == "refused":
        assert _is_extension(answer[2]), f"gradops computed {op}, which TF refuses: {answer[1]}: {answer[2][:300]}"
        event(f"TF refuses {op} (a gradops extension)")
        return
    event(f"compared {op}")
    _assert_same_as_tf(op, kwargs, args, got, answer[1])


# --------------------------------------------------------------------------- empty filters

@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("filter_shape", [(0, 1, 2, 1), (1, 0, 2, 1), (0, 0, 2, 1), (1, 1, 2, 0)])
def test_empty_filters_as_tf(tf, filter_shape, padding):
    """TF's Conv2D refuses a filter of zero elements unless its output is empty (it returns
    before the check); DepthwiseConv2dNative and the gradients compute zeros.  Found by
    test_accepted_hostile_calls_agree_with_tf_long (gradops' conv2d computed zeros)."""
    x = np.ones((1, 3, 3, 2), np.float32)
    w = np.zeros(filter_shape, np.float32)
    attrs = dict(strides=[1, 1, 1, 1], padding=padding)
    try:
        want = tf.raw_ops.Conv2D(input=x, filter=w, **attrs).numpy()
    except tf.errors.InvalidArgumentError as error:
        assert "filter must not have zero elements" in str(error)
        assert 0 not in _stride1_output_shape(x.shape, filter_shape, padding)
        with pytest.raises(gradops.InvalidArgumentError, match="filter must not have zero elements"):
            gradops.conv2d(x, w, **attrs)
    else:
        np.testing.assert_array_equal(gradops.conv2d(x, w, **attrs), want)
    y = gradops.depthwise_conv2d_native(x, w, **attrs)
    np.testing.assert_array_equal(y, tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **attrs).numpy())
    dy = np.ones(y.shape, np.float32)
    np.testing.assert_array_equal(
        gradops.depthwise_conv2d_native_backprop_filter(x, filter_shape, dy, **attrs),
        tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(input=x, filter_sizes=np.array(filter_shape, np.int32),
                                                       out_backprop=dy, **attrs).numpy())
    got = gradops.depthwise_conv2d_native_backprop_input(x.shape, w, dy, **attrs)
    assert got.shape == x.shape and not np.any(got)
    if filter_shape[3]:  # multiplier 0 (an empty out_backprop): TF's result is uninitialised memory
        want = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(input_sizes=np.array(x.shape, np.int32), filter=w,
                                                             out_backprop=dy, **attrs).numpy()
        np.testing.assert_array_equal(got, want)
    if filter_shape[2] == x.shape[3]:  # one group
        dy = np.ones(_stride1_output_shape(x.shape, filter_shape, padding), np.float32)
        np.testing.assert_array_equal(
            gradops.conv2d_backprop_input(x.shape, w, dy, **attrs),
            tf.raw_ops.Conv2DBackpropInput(input_sizes=np.array(x.shape, np.int32), filter=w, out_backprop=dy,
                                           **attrs).numpy())
        np.testing.assert_array_equal(
            gradops.conv2d_backprop_filter(x, filter_shape, dy, **attrs),
            tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=np.array(filter_shape, np.int32), out_backprop=dy,
                                            **attrs).numpy())


def _stride1_output_shape(x_shape, filter_shape, padding):
    """A stride-1 convolution's NHWC output shape, as TF computes it."""
    n, h, w, _ = x_shape
    return (n, _out_size(h, filter_shape[0], 1, padding), _out_size(w, filter_shape[1], 1, padding), filter_shape[3])


# --------------------------------------------------------------------------- int32 attributes

_ONE = np.ones((1, 1, 1, 1), np.float32)
#: gradops op -> its call on one-element tensors (TF's is _tf_call's).
_INT32_OPS = {
    "conv2d": dict(input=_ONE, filter=_ONE),
    "conv2d_backprop_input": dict(input_sizes=[1, 1, 1, 1], filter=_ONE, out_backprop=_ONE),
    "conv2d_backprop_filter": dict(input=_ONE, filter_sizes=[1, 1, 1, 1], out_backprop=_ONE),
    "depthwise_conv2d_native": dict(input=_ONE, filter=_ONE),
    "depthwise_conv2d_native_backprop_input": dict(input_sizes=[1, 1, 1, 1], filter=_ONE, out_backprop=_ONE),
    "depthwise_conv2d_native_backprop_filter": dict(input=_ONE, filter_sizes=[1, 1, 1, 1], out_backprop=_ONE),
}


def _run_tf(tf, op, kwargs):
    name, args = _tf_call(op, kwargs)
    return getattr(tf.raw_ops, name)(**args).numpy()


@pytest.mark.parametrize("value", [2**31, 2**40, -(2**31) - 1])
@pytest.mark.parametrize("attribute", ["strides", "dilations"])
@pytest.mark.parametrize("op", sorted(_INT32_OPS))
def test_int32_attributes_as_tf(tf, op, attribute, value):
    """A stride or dilation past int32 is refused as TF refuses it ("out of range for an
    int32"), whatever else the call holds; TF's depthwise gradients, which ignore dilations,
    take any, and gradops validates them as its forward op does (README).  Found by
    test_accepted_hostile_calls_agree_with_tf_long: gradops computed such calls."""
    attrs = dict(strides=[1, 1, 1, 1], dilations=[1, 1, 1, 1], padding="SAME")
    attrs[attribute] = [1, value, value, 1]
    arguments = _INT32_OPS[op]
    try:
        _run_tf(tf, op, {**arguments, **attrs})
    except tf.errors.InvalidArgumentError as error:
        assert "out of range for an int32" in str(error)
    else:
        assert attribute == "dilations" and "depthwise_conv2d_native_backprop" in op  # the deliberate difference
    with pytest.raises(gradops.InvalidArgumentError, match=f"{attribute} has value {value} out of range for an int32"):
        getattr(gradops, op)(**arguments, **attrs)


@pytest.mark.parametrize("op", sorted(_INT32_OPS))
def test_int32_attributes_at_the_limit_as_tf(tf, op):
    """Strides of 2**31 - 1 are computed, by TF and gradops alike."""
    attrs = dict(strides=[1, 2**31 - 1, 2**31 - 1, 1], padding="SAME")
    arguments = _INT32_OPS[op]
    np.testing.assert_array_equal(getattr(gradops, op)(**arguments, **attrs), _run_tf(tf, op, {**arguments, **attrs}))


@pytest.mark.parametrize("pad", [2**31 - 2, 2**31 - 1, 2**40])
def test_conv2d_explicit_paddings_past_int32_as_tf(tf, pad):
    """TF's Conv2D refuses explicit paddings of 2**31 - 1 or more ("filter too large"); its
    gradients and DepthwiseConv2dNative compute them.  Strides of 2**31 - 1 keep the output small."""
    attrs = dict(strides=[1, 2**31 - 1, 2**31 - 1, 1], padding="EXPLICIT",
                 explicit_paddings=[0, 0, pad, 0, 0, 0, 0, 0])
    try:
        want = tf.raw_ops.Conv2D(input=_ONE, filter=_ONE, **attrs).numpy()
    except tf.errors.InvalidArgumentError as error:
        assert "filter too large" in str(error) and pad >= 2**31 - 1
        with pytest.raises(gradops.InvalidArgumentError, match="explicit_paddings must be below 2"):
            gradops.conv2d(_ONE, _ONE, **attrs)
    else:
        assert pad < 2**31 - 1
        np.testing.assert_array_equal(gradops.conv2d(_ONE, _ONE, **attrs), want)
    y = gradops.depthwise_conv2d_native(_ONE, _ONE, **attrs)
    y_tf = tf.raw_ops.DepthwiseConv2dNative(input=_ONE, filter=_ONE, **attrs).numpy()
    dy = np.ones(y.shape, np.float32)
    got = gradops.conv2d_backprop_input([1, 1, 1, 1], _ONE, dy, **attrs)
    want = tf.raw_ops.Conv2DBackpropInput(input_sizes=np.array([1, 1, 1, 1], np.int32), filter=_ONE,
                                          out_backprop=dy, **attrs).numpy()
    if pad < 2**31:
        np.testing.assert_array_equal(y, y_tf)
        np.testing.assert_array_equal(got, want)
    else:
        # No window reaches the input's row (2**40 is no multiple of the stride 2**31 - 1), so
        # the forward result and the gradient are all zeros, which gradops computes; TF's
        # kernels take the padding modulo 2**32 (0 here) and put a 1 in both: a TF bug, not followed.
        assert not np.any(y) and not np.any(got)
        assert y_tf[0, 0, 0, 0] == 1 and want[0, 0, 0, 0] == 1
