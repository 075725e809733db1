"""TensorFlow's security advisories on the ops gradops implements, as regression tests.

Each test feeds the advisory's reproducer (the ``tf.raw_ops`` call from its GHSA / TFSA
page) to gradops on every backend.  The only acceptable outcomes are the correct result
(zeros of the right shape and dtype where the call is well defined, e.g. empty tensors) or
``gradops.InvalidArgumentError`` whose message names the offending argument; a crash,
IndexError, ZeroDivisionError, MemoryError, another exception type or a wrong shape fails.

Backends other than "numpy" need CuPy and a GPU: their parameters carry the ``gpu`` mark
(skipped without one) and get CuPy arrays.  The comment on each test records what
tensorflow-cpu 2.21 does with the reproducer today, with oneDNN on (the x86 default) and off
(``TF_ENABLE_ONEDNN_OPTS=0``).

Audit (TF security advisories in tensorflow/security/advisory and the GitHub advisory
database, searched by op name): Conv2DBackpropFilter CVE-2021-29524, CVE-2021-29538,
CVE-2021-29540; Conv2DBackpropInput CVE-2021-29525, CVE-2022-35999; FractionalAvgPoolGrad
CVE-2021-29578, CVE-2021-37651, CVE-2022-21730, CVE-2022-35963; FractionalMaxPoolGrad
CVE-2021-29580, CVE-2022-35981, CVE-2022-41897 and the open TF PR #126911 (negative
sequence values, still read out of bounds by TF 2.21); and the two that cover
"convolution operators" as a family, CVE-2021-37675 (shape inference) and CVE-2021-41209
(zero-size filters), run here on every convolution op gradops has.  No advisory names
DepthwiseConv2dNativeBackpropInput itself; it is covered by the family advisories and by the
public fuzzer reproducer at the end of this file.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradops

# Exceptions that must never escape: they are the advisories' failure modes in Python dress.
FORBIDDEN = (IndexError, ZeroDivisionError, MemoryError, OverflowError, FloatingPointError)


def _device(backend, x):
    """The array on the backend's side: NumPy for "numpy", CuPy (imported lazily) otherwise."""
    x = np.asarray(x)
    if backend == "numpy":
        return x
    ok, reason = gradops.backend_status()[backend]
    if not ok:  # a GPU without this backend built: report a skip, never a pass
        pytest.skip(f"backend {backend!r} unavailable: {reason}")
    import cupy

    return cupy.asarray(x)


def _host(x):
    if isinstance(x, np.ndarray):
        return x
    import cupy

    return cupy.asnumpy(x)


def _call(fn, **kwargs):
    """Run ``fn``; turn forbidden exception types into test failures with a clear message."""
    try:
        return fn(**kwargs), None
    except gradops.InvalidArgumentError as exc:
        return None, exc
    except FORBIDDEN as exc:  # pragma: no cover - only on a regression
        pytest.fail(f"{type(exc).__name__} escaped: {exc}")


def assert_zeros(result, shape, dtype):
    result = _host(result)
    assert result.shape == tuple(shape), (result.shape, shape)
    assert result.dtype == np.dtype(dtype), (result.dtype, dtype)
    assert not np.any(result), "expected an all-zero gradient"


def assert_rejected(error, *names):
    assert error is not None, "expected InvalidArgumentError"
    assert isinstance(error, gradops.InvalidArgumentError)
    message = str(error)
    assert any(name in message for name in names), f"message names none of {names}: {message}"


def assert_zeros_or_rejected(outcome, shape, dtype, *names):
    """Either the (zero) gradient of the right shape, or a rejection naming the argument."""
    result, error = outcome
    if error is not None:
        assert_rejected(error, *names)
    else:
        assert_zeros(result, shape, dtype)


# --------------------------------------------------------------------------- Conv2DBackpropFilter


def test_cve_2021_29524_conv2d_backprop_filter_division_by_zero(any_backend):
    """CVE-2021-29524 (GHSA-r4pj-74mg-8868, TFSA-2021-013): division by 0 in Conv2DBackpropFilter.

    TF computed ``in_depth % filter_in_depth`` with a caller-controlled divisor; the
    reproducer has an empty input [0, 0, 1, 0], filter_sizes [1, 1, 1, 1], empty out_backprop
    [0, 0, 1, 1] and strides [1, 66, 18, 1].  Input depth 0 over filter depth 1 forms 0
    groups, which cannot hold out_depth 1: the geometry is inconsistent however empty the
    batch, and must be refused naming the groups (TF's Conv2D: "number of groups must be
    stricly positive").  Dividing by zero, or returning zeros, is wrong.

    TF 2.21: oneDNN on -> returns zeros [1, 1, 1, 1]; oneDNN off -> InvalidArgumentError
    "filter_size does not have enough elements, requested 0, got 1".
    """
    result, error = _call(
        gradops.conv2d_backprop_filter,
        input=_device(any_backend, np.zeros((0, 0, 1, 0), np.float32)),
        filter_sizes=[1, 1, 1, 1],
        out_backprop=_device(any_backend, np.zeros((0, 0, 1, 1), np.float32)),
        strides=[1, 66, 18, 1], use_cudnn_on_gpu=True, padding="SAME", explicit_paddings=[],
        data_format="NHWC", dilations=[1, 1, 1, 1], backend=any_backend)
    assert result is None
    assert_rejected(error, "groups")


def test_cve_2021_29538_conv2d_backprop_filter_all_empty_division_by_zero(any_backend):
    """CVE-2021-29538 (TFSA-2021-027): division by zero in Conv2DBackpropFilter.

    All shapes empty ([0, 0, 0, 0] input, out_backprop and filter_sizes) made TF's
    ``work_unit_size`` 0 and its shard-size division crash.  The filter has in_depth 0, which
    TF's own shape rules refuse ("filter depth must be strictly greater than zero"); the
    gradient of an empty call would be an empty [0, 0, 0, 0] tensor.  Either outcome is right;
    a division by zero is not.

    TF 2.21: oneDNN on -> returns an empty float32 [0, 0, 0, 0]; oneDNN off ->
    InvalidArgumentError "filter depth must be strictly greated than zero".
    """
    outcome = _call(
        gradops.conv2d_backprop_filter,
        input=_device(any_backend, np.zeros((0, 0, 0, 0), np.float32)),
        filter_sizes=[0, 0, 0, 0],
        out_backprop=_device(any_backend, np.zeros((0, 0, 0, 0), np.float32)),
        strides=[1, 1, 1, 1], use_cudnn_on_gpu=False, padding="SAME", explicit_paddings=[],
        data_format="NHWC", dilations=[1, 1, 1, 1], backend=any_backend)
    assert_zeros_or_rejected(outcome, (0, 0, 0, 0), np.float32, "filter")


def test_cve_2021_29540_conv2d_backprop_filter_heap_overflow(any_backend):
    """CVE-2021-29540 (TFSA-2021-028): heap overflow in Conv2DBackpropFilter.

    TF sized the filter buffer from its own computation rather than filter_sizes and wrote
    past it.  Reproducer: input [1, 1, 1, 2], filter_sizes [1, 1, 1, 1], out_backprop
    [1, 1, 1, 1], strides [1, 66, 49, 1], VALID.  Input depth 2 over filter depth 1 makes 2
    groups, but out_depth 1 is not divisible by 2: the call has no meaning and must be
    rejected, the message naming the filter / out_depth / groups rule.

    TF 2.21: InvalidArgumentError both ways (oneDNN: "output depth must be evenly divisible
    by number of groups: 1 vs 2"; Eigen: "filter_size does not have enough elements,
    requested 2, got 1").
    """
    result, error = _call(
        gradops.conv2d_backprop_filter,
        input=_device(any_backend, np.array([386.078431372549, 386.07843139643234], np.float32).reshape(1, 1, 1, 2)),
        filter_sizes=[1, 1, 1, 1],
        out_backprop=_device(any_backend, np.array([386.078431372549], np.float32).reshape(1, 1, 1, 1)),
        strides=[1, 66, 49, 1], use_cudnn_on_gpu=True, padding="VALID", explicit_paddings=[],
        data_format="NHWC", dilations=[1, 1, 1, 1], backend=any_backend)
    assert result is None
    assert_rejected(error, "out_depth", "groups", "filter")


def test_cve_2021_29540_conv2d_backprop_filter_heap_overflow_empty_variant(any_backend):
    """CVE-2021-29540, the advisory's second reproducer: empty tensors.

    input [0, 1, 1, 5], filter_sizes [3, 8, 1, 1], out_backprop [0, 1, 1, 1], strides
    [1, 66, 49, 1], VALID.  Two things are wrong: 5 groups (input depth 5 / filter depth 1)
    do not divide out_depth 1, and a VALID 3-row filter over 1 input row gives 0 output rows,
    not out_backprop's 1.  Rejection naming either rule is required even though the batch is
    empty (an empty batch does not make an inconsistent geometry valid).

    TF 2.21: oneDNN on -> returns zeros [3, 8, 1, 1] (lenient); oneDNN off ->
    InvalidArgumentError "Size of out_backprop doesn't match computed: actual = 1, computed = 0".
    """
    result, error = _call(
        gradops.conv2d_backprop_filter,
        input=_device(any_backend, np.zeros((0, 1, 1, 5), np.float32)),
        filter_sizes=[3, 8, 1, 1],
        out_backprop=_device(any_backend, np.zeros((0, 1, 1, 1), np.float32)),
        strides=[1, 66, 49, 1], use_cudnn_on_gpu=True, padding="VALID", explicit_paddings=[],
        data_format="NHWC", dilations=[1, 1, 1, 1], backend=any_backend)
    assert result is None
    assert_rejected(error, "out_depth", "groups", "out_backprop")


# --------------------------------------------------------------------------- Conv2DBackpropInput


def test_cve_2021_29525_conv2d_backprop_input_division_by_zero(any_backend):
    """CVE-2021-29525 (GHSA-xm2v-8rrw-w9pm, TFSA-2021-014): division by 0 in Conv2DBackpropInput.

    input_sizes [52, 1, 1, 5], an empty filter [0, 1, 5, 0] and out_backprop [52, 1, 1, 0]:
    TF's shard size divided by a work-unit size of 0.  The call is well defined: SAME padding
    keeps 1x1 output, out_depth is 0, so every input element receives a sum of no terms.
    The correct result is float32 zeros of shape [52, 1, 1, 5].

    TF 2.21: returns zeros [52, 1, 1, 5] (oneDNN on and off).
    """
    result, error = _call(
        gradops.conv2d_backprop_input,
        input_sizes=[52, 1, 1, 5],
        filter=_device(any_backend, np.zeros((0, 1, 5, 0), np.float32)),
        out_backprop=_device(any_backend, np.zeros((52, 1, 1, 0), np.float32)),
        strides=[1, 1, 1, 1], use_cudnn_on_gpu=True, padding="SAME", explicit_paddings=[],
        data_format="NHWC", dilations=[1, 1, 1, 1], backend=any_backend)
    assert error is None, error
    assert_zeros(result, (52, 1, 1, 5), np.float32)


def test_cve_2022_35999_conv2d_backprop_input_empty_out_backprop(any_backend):
    """CVE-2022-35999 (GHSA-37jf-mjv6-xfqw): CHECK failure in Conv2DBackpropInput.

    An empty out_backprop [3, 1, 0, 3] (input_sizes [3, 1, 1, 2], filter [1, 3, 2, 3],
    strides [1, 1, 2, 1], VALID) made the oneDNN / cuDNN kernels CHECK-fail.  The geometry is
    consistent (a 3-column VALID filter over 1 column gives 0 output columns), so the input
    gradient is all zeros of shape [3, 1, 1, 2] in the filter's dtype (float64 here, as the
    reproducer passes np.ones).

    TF 2.21: returns float64 zeros [3, 1, 1, 2] (oneDNN on and off).  cuDNN has no float64
    convolutions (an explicit backend="cudnn" refuses them), so that backend gets float32.
    """
    dtype = np.float32 if any_backend == "cudnn" else np.float64
    result, error = _call(
        gradops.conv2d_backprop_input,
        input_sizes=[3, 1, 1, 2],
        filter=_device(any_backend, np.ones([1, 3, 2, 3], dtype)),
        out_backprop=_device(any_backend, np.ones([3, 1, 0, 3], dtype)),
        strides=[1, 1, 2, 1], padding="VALID", backend=any_backend)
    assert error is None, error
    assert_zeros(result, (3, 1, 1, 2), dtype)


# --------------------------------------------------------------------------- FractionalAvgPoolGrad


def _fractional(backend, shape, out_backprop, rows, cols, overlapping):
    return _call(
        gradops.fractional_avg_pool_grad,
        orig_input_tensor_shape=np.asarray(shape, np.int64),
        out_backprop=_device(backend, out_backprop),
        row_pooling_sequence=np.asarray(rows, np.int64),
        col_pooling_sequence=np.asarray(cols, np.int64),
        overlapping=overlapping, backend=backend)


def test_cve_2021_29578_fractional_avg_pool_grad_short_sequences(any_backend):
    """CVE-2021-29578 (GHSA-6f89-8j54-29xf, TFSA-2021-067): heap overflow in FractionalAvgPoolGrad.

    TF did not check that the pooling sequences have out_rows + 1 / out_cols + 1 elements and
    read past them.  Reproducer: orig_input_tensor_shape [1, 3, 2, 3], int64 out_backprop
    [1, 1, 1, 1], sequences [1] and [1].  out_backprop's depth (1) also differs from the
    original input's (3), so rejection may name either; a second call with matching depth
    isolates the advisory's rule, and must name row_pooling_sequence.

    TF 2.21: InvalidArgumentError "Given out_backprop shape [1,1,1,1], row_seq_tensor must
    have at least 2 elements, but got 1" (oneDNN on and off).
    """
    out_backprop = np.array([2], np.int64).reshape(1, 1, 1, 1)
    result, error = _fractional(any_backend, [1, 3, 2, 3], out_backprop, [1], [1], False)
    assert result is None
    assert_rejected(error, "row_pooling_sequence", "col_pooling_sequence", "out_backprop",
                    "orig_input_tensor_shape")
    result, error = _fractional(any_backend, [1, 3, 2, 1], out_backprop, [1], [1], False)
    assert result is None
    assert_rejected(error, "row_pooling_sequence")


def test_cve_2021_37651_fractional_avg_pool_grad_empty_input(any_backend):
    """CVE-2021-37651 (GHSA-hpv4-7p9c-mvfr): heap buffer overflow in FractionalAvgPoolGrad.

    TF did not check that the original input is non-empty and indexed an empty buffer.
    Reproducer: orig_input_tensor_shape [0, 1, 2, 3], out_backprop [[[[541], [541]], [[541],
    [541]]]] (shape [1, 2, 2, 1], int64), row sequence [0, 0, 0, 0, 0], col sequence
    [-2, 0, 0, 2, 0], overlapping.  Batch and depth disagree with the original shape and the
    column sequence is negative: it must be rejected; with consistent shapes the negative
    column sequence must be named.  The consistent empty case (batch 0 everywhere, valid
    sequences) is mathematically a zero gradient of the original shape; TF's fix rejects it,
    so either zeros [0, 4, 4, 1] or a rejection naming the empty tensor is accepted.

    TF 2.21: InvalidArgumentError "Batch dimension of input must not be 0" (and
    "out_backprop must be positive for all dimension" for any empty out_backprop).
    """
    out_backprop = np.array([[[[541], [541]], [[541], [541]]]])
    result, error = _fractional(any_backend, [0, 1, 2, 3], out_backprop, [0, 0, 0, 0, 0], [-2, 0, 0, 2, 0], True)
    assert result is None
    assert_rejected(error, "out_backprop", "orig_input_tensor_shape", "col_pooling_sequence")

    result, error = _fractional(any_backend, [1, 1, 2, 1], out_backprop, [0, 0, 0, 0, 0], [-2, 0, 0, 2, 0], True)
    assert result is None
    assert_rejected(error, "col_pooling_sequence")

    outcome = _fractional(any_backend, [0, 4, 4, 1], np.zeros((0, 2, 2, 1), np.int64), [0, 2, 4], [0, 2, 4], True)
    assert_zeros_or_rejected(outcome, (0, 4, 4, 1), np.int64, "out_backprop", "orig_input_tensor_shape")


def test_cve_2022_21730_fractional_avg_pool_grad_negative_sequence(any_backend):
    """CVE-2022-21730 (GHSA-vjg4-v33c-ggc4): out-of-bounds read in FractionalAvgPoolGrad.

    A negative pooling-sequence value (row sequence [-10, 1, 2, 3], col [1, 2, 3, 4],
    orig_input_tensor_shape [2, 2, 2, 2], out_backprop [1, 2, 3, 2], overlapping) made TF
    read before its buffer.  The batch (1 vs 2) also disagrees, so the rejection may name
    out_backprop / orig_input_tensor_shape; with consistent shapes ([1, 4, 4, 2]) the message
    must name row_pooling_sequence.

    TF 2.21: InvalidArgumentError "Row sequence tensor values must not be negative, got
    -10 1 2 3" (oneDNN on and off).
    """
    out_backprop = np.array([[[[1, 2], [3, 4], [5, 6]], [[7, 8], [9, 10], [11, 12]]]])
    result, error = _fractional(any_backend, [2, 2, 2, 2], out_backprop, [-10, 1, 2, 3], [1, 2, 3, 4], True)
    assert result is None
    assert_rejected(error, "row_pooling_sequence", "out_backprop", "orig_input_tensor_shape")

    result, error = _fractional(any_backend, [1, 4, 4, 2], out_backprop, [-10, 1, 2, 3], [1, 2, 3, 4], True)
    assert result is None
    assert_rejected(error, "row_pooling_sequence")


def test_cve_2022_35963_fractional_avg_pool_grad_negative_shape(any_backend):
    """CVE-2022-35963 (GHSA-84jm-4cf3-9jfm): CHECK failures in FractionalAvgPoolGrad.

    orig_input_tensor_shape full of -1879048192 (an overflowing, negative shape) with an empty
    float64 out_backprop [0, 0, 0, 0] and sequences [1, 1, 1, 1] made TF CHECK-fail building
    the output shape.  A negative dimension can never be right: InvalidArgumentError naming
    orig_input_tensor_shape, and nothing allocated (no MemoryError).

    TF 2.21: rejected during shape inference (ValueError from tf.function tracing; the shape
    function refuses the negative dimensions).
    """
    result, error = _fractional(any_backend, np.full(4, -1879048192, np.int64), np.zeros((0, 0, 0, 0), np.float64),
                                np.ones(4, np.int64), np.ones(4, np.int64), True)
    assert result is None
    assert_rejected(error, "orig_input_tensor_shape")


# --------------------------------------------------------------------------- FractionalMaxPoolGrad


def _fractional_max(backend, orig_input, orig_output, out_backprop, rows, cols, overlapping):
    return _call(
        gradops.fractional_max_pool_grad,
        orig_input=_device(backend, orig_input), orig_output=_device(backend, orig_output),
        out_backprop=_device(backend, out_backprop),
        row_pooling_sequence=np.asarray(rows, np.int64), col_pooling_sequence=np.asarray(cols, np.int64),
        overlapping=overlapping, backend=backend)


def test_cve_2021_29580_fractional_max_pool_grad_empty_orig_output(any_backend):
    """CVE-2021-29580 (GHSA-x8h6-xgqx-jqgp): undefined behaviour and CHECK-fail in FractionalMaxPoolGrad.

    TF did not check that the tensors are non-empty and of rank 4.  Reproducer: orig_input
    [2, 3] as int64 [1, 1, 1, 2], orig_output an empty int64 vector (shape [0]), out_backprop
    zeros [2, 3, 6, 6], sequences [0] and [0], not overlapping.  Rejected naming orig_output
    (its rank); with a rank-4 but empty orig_output, naming orig_output again; an empty
    orig_input likewise.

    TF 2.21: InvalidArgumentError "orig_output should be a tensor of rank 4, got ... shape
    [0]" (oneDNN on and off).
    """
    orig_input = np.array([2, 3], np.int64).reshape(1, 1, 1, 2)
    out_backprop = np.zeros((2, 3, 6, 6), np.int64)
    result, error = _fractional_max(any_backend, orig_input, np.array([], np.int64), out_backprop, [0], [0], False)
    assert result is None
    assert_rejected(error, "orig_output")
    result, error = _fractional_max(any_backend, orig_input, np.zeros((1, 0, 1, 2), np.int64),
                                    np.zeros((1, 0, 1, 2), np.int64), [0], [0], False)
    assert result is None
    assert_rejected(error, "orig_output")
    result, error = _fractional_max(any_backend, np.zeros((1, 0, 1, 2), np.int64), np.zeros((1, 1, 1, 2), np.int64),
                                    np.zeros((1, 1, 1, 2), np.int64), [0, 1], [0, 1], False)
    assert result is None
    assert_rejected(error, "orig_input")


def test_cve_2022_35981_fractional_max_pool_grad_check_fail(any_backend):
    """CVE-2022-35981 (GHSA-vxv8-r8q2-63xw): CHECK fail in FractionalMaxPoolGrad.

    Reproducer: orig_input, orig_output and out_backprop all float32 [1, 7, 13, 1] filled with
    0.453409232, sequences of five zeros, overlapping.  Five entries cannot bound 7 row cells
    (and the cells they would give, 0..0, leave the rest of orig_output unvisited: TF's argmax
    stayed -1 and a CHECK aborted).  Rejected naming row_pooling_sequence.

    TF 2.21: InvalidArgumentError "tensor_out_dup is not the same as tensor_out" (oneDNN on
    and off).
    """
    full = np.full((1, 7, 13, 1), 0.453409232, np.float32)
    result, error = _fractional_max(any_backend, full, full, full, np.zeros(5), np.zeros(5), True)
    assert result is None
    assert_rejected(error, "row_pooling_sequence", "col_pooling_sequence")


def test_cve_2022_41897_fractional_max_pool_grad_outsize_sequences(any_backend):
    """CVE-2022-41897 (GHSA-f2w8-jw48-fr7j): heap out-of-bounds read in FractionalMaxPoolGrad.

    Reproducer: orig_input [[[[1, 1, 1, 1, 1]]]] ([1, 1, 1, 5]), orig_output [[[[1, 1, 1]]]]
    ([1, 1, 1, 3]), out_backprop [[[[3], [3], [6]]]] ([1, 1, 3, 1]), both sequences
    [-0x4000000, 1, 1], not overlapping.  3 x 3 sequence entries exceed orig_input's 5
    elements: TF's fix refuses that first ("Pooling region has more elements than the input
    tensor"), and so does gradops, naming the sequences.  With a large enough input the
    negative start (and the mismatched shapes) are refused in turn.

    TF 2.21: InvalidArgumentError "Pooling region has more elements than the input tensor"
    (oneDNN on and off).
    """
    seq = [-0x4000000, 1, 1]
    result, error = _fractional_max(any_backend, np.ones((1, 1, 1, 5), np.int32), np.ones((1, 1, 1, 3), np.int32),
                                    np.array([[[[3], [3], [6]]]], np.int32), seq, seq, False)
    assert result is None
    assert_rejected(error, "row_pooling_sequence", "col_pooling_sequence")
    assert "Pooling region" in str(error)
    result, error = _fractional_max(any_backend, np.ones((1, 3, 3, 1), np.int32), np.ones((1, 2, 2, 1), np.int32),
                                    np.ones((1, 2, 2, 1), np.int32), seq, seq, False)
    assert result is None
    assert_rejected(error, "row_pooling_sequence")


def test_tf_pr_126911_fractional_max_pool_grad_negative_sequence(any_backend):
    """TF PR #126911 (2026, open; "a bypass of the incomplete fix for CVE-2022-41897"): heap
    out-of-bounds read in FractionalMaxPoolGrad from a negative pooling-sequence value.

    TF checks neither sequence's values: a cell starting at -1 reads before orig_input.  The
    PR's case: row_pooling_sequence [-1, 2, 4] over a [1, 4, 4, 1] input, col [0, 2, 4].  The
    same holds for the columns, and for the public crashes with huge negative values (issues
    #66760 and #69461: orig_input [1, 4, 7, 1], orig_output and out_backprop [1, 7, 13, 1],
    one sequence of five -1250999896764, the other of five zeros, overlapping).  All rejected,
    naming the sequence.

    TF 2.21 (oneDNN off): the PR's case reads out of bounds, so its outcome varies from run to
    run (a gradient, or "tensor_out_dup is not the same as tensor_out"); the issues' case
    crashes the process (SIGSEGV).
    """
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    y = np.array([5, 7, 13, 15], np.float32).reshape(1, 2, 2, 1)
    dy = np.ones((1, 2, 2, 1), np.float32)
    result, error = _fractional_max(any_backend, x, y, dy, [-1, 2, 4], [0, 2, 4], False)
    assert result is None
    assert_rejected(error, "row_pooling_sequence")
    result, error = _fractional_max(any_backend, x, y, dy, [0, 2, 4], [-1, 2, 4], True)
    assert result is None
    assert_rejected(error, "col_pooling_sequence")
    big = np.full((1, 7, 13, 1), 0.453409232, np.float32)
    for rows, cols, name in (([-1250999896764] * 5, [0] * 5, "row_pooling_sequence"),
                             ([0] * 5, [-1250999896764] * 5, "col_pooling_sequence")):
        result, error = _fractional_max(any_backend, np.full((1, 4, 7, 1), 100, np.float32), big, big, rows, cols, True)
        assert result is None
        assert_rejected(error, "row_pooling_sequence", "col_pooling_sequence")
    # Shapes that agree, so that only the negative value is wrong.
    result, error = _fractional_max(any_backend, x, y, dy, [-1250999896764, 2, 4], [0, 2, 4], True)
    assert result is None
    assert_rejected(error, "row_pooling_sequence")


# --------------------------------------------------------------------------- convolution family

CONV_FAMILY = ["conv2d", "conv2d_backprop_filter", "conv2d_backprop_input", "depthwise_conv2d_native",
               "depthwise_conv2d_native_backprop_input", "depthwise_conv2d_native_backprop_filter"]
FILTER_GRADIENTS = ("conv2d_backprop_filter", "depthwise_conv2d_native_backprop_filter")


def _family_call(backend, op, input_shape, filter_shape, out_shape, **attrs):
    """Call one convolution op of the family with zero-filled tensors of the given shapes."""
    x = _device(backend, np.zeros(input_shape, np.float32))
    w = _device(backend, np.zeros(filter_shape, np.float32))
    dy = _device(backend, np.zeros(out_shape, np.float32))
    fn = getattr(gradops, op)
    if op in ("conv2d", "depthwise_conv2d_native"):
        return _call(fn, input=x, filter=w, backend=backend, **attrs)
    if op in FILTER_GRADIENTS:
        return _call(fn, input=x, filter_sizes=list(filter_shape), out_backprop=dy, backend=backend, **attrs)
    return _call(fn, input_sizes=list(input_shape), filter=w, out_backprop=dy, backend=backend, **attrs)


def _result_shape(op, input_shape, filter_shape, out_shape):
    if op in ("conv2d", "depthwise_conv2d_native"):
        return out_shape
    return filter_shape if op in FILTER_GRADIENTS else input_shape


@pytest.mark.parametrize("op", CONV_FAMILY)
def test_cve_2021_37675_convolution_shape_inference_division_by_zero(any_backend, op):
    """CVE-2021-37675 (GHSA-9c8h-2mv3-49ww): division by 0 in most convolution operators.

    Reproducer: tf.raw_ops.Conv2D with input and filter both empty [0, 0, 0, 0], strides
    [1, 1, 1, 1], SAME; TF's shape inference divided by the filter depth.  Filter depth 0
    means no groups: the plain convolutions must reject it naming the filter depth (TF's fix);
    for depthwise ops, in_depth 0 with multiplier 0 is a consistent empty problem, so empty
    zeros of the result shape are also correct.  Every op of the family gets the same shapes.

    TF 2.21 (Conv2D, eager): InvalidArgumentError.
    """
    outcome = _family_call(any_backend, op, (0, 0, 0, 0), (0, 0, 0, 0), (0, 0, 0, 0),
                           strides=[1, 1, 1, 1], padding="SAME")
    if op.startswith("depthwise"):
        assert_zeros_or_rejected(outcome, (0, 0, 0, 0), np.float32, "filter", "depth")
    else:
        result, error = outcome
        assert result is None
        assert_rejected(error, "filter depth")


@pytest.mark.parametrize("op", CONV_FAMILY)
@pytest.mark.parametrize("empty_dim", [0, 1, 2, 3], ids=["rows0", "cols0", "in_depth0", "out_depth0"])
def test_cve_2021_41209_convolution_zero_size_filter(any_backend, op, empty_dim):
    """CVE-2021-41209 (GHSA-6hpv-v2rx-c5g6): FPE in convolutions with zero size filters.

    The advisory publishes no reproducer, only "empty filter tensor arguments" to the
    convolution kernels (conv_ops.cc).  Each dimension of a [2, 2, 2, 3] filter (depthwise:
    [2, 2, 2, 3] is [rows, cols, in_depth, multiplier]) is set to 0 in turn, over an input
    [1, 4, 4, 2] with SAME padding.  Zero rows or columns leave a sum of no taps (zeros), which
    TF 2.21's Conv2D refuses (its fix) and its other ops compute; a zero out_depth / multiplier
    an empty result; a zero filter in_depth is rejected (plain convolution: no groups;
    depthwise: it must equal the input depth).  No division by zero.
    """
    filter_shape = [2, 2, 2, 3]
    filter_shape[empty_dim] = 0
    depthwise = op.startswith("depthwise")
    out_depth = 2 * filter_shape[3] if depthwise else filter_shape[3]
    input_shape, out_shape = (1, 4, 4, 2), (1, 4, 4, out_depth)
    outcome = _family_call(any_backend, op, input_shape, tuple(filter_shape), out_shape,
                           strides=[1, 1, 1, 1], padding="SAME")
    if empty_dim == 2:
        result, error = outcome
        assert result is None
        assert_rejected(error, "depth")
    elif op == "conv2d" and empty_dim < 2:
        # TF's fix (its Conv2D refuses a filter of zero elements where the output is not empty:
        # test_tf_parity.py::test_empty_filters_as_tf); the other ops compute zeros, as TF's do.
        result, error = outcome
        assert result is None
        assert_rejected(error, "zero elements")
    else:
        result, error = outcome
        assert error is None, error
        assert_zeros(result, _result_shape(op, input_shape, tuple(filter_shape), out_shape), np.float32)


def test_ivysyn_depthwise_conv2d_native_backprop_input_input_sizes_check_failure(any_backend):
    """Public fuzzer reproducer (IvySyn corpus; TF CHECK failure, not a published advisory).

    input_sizes of 13 entries all 1879048192 (int32), filter [1, 1, 48, 2], out_backprop
    [1, 1, 48, 2], strides [1, 1, 1, 1], SAME: TF aborted in TensorShape with "Check failed:
    0 <= new_num_elements".  input_sizes must have 4 entries: rejected, naming input_sizes,
    before any size is used.
    """
    result, error = _call(
        gradops.depthwise_conv2d_native_backprop_input,
        input_sizes=np.full(13, 1879048192, np.int32),
        filter=_device(any_backend, np.full((1, 1, 48, 2), 0.184634328, np.float32)),
        out_backprop=_device(any_backend, np.full((1, 1, 48, 2), 0.184634328, np.float32)),
        strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[], data_format="NHWC",
        dilations=[1, 1, 1, 1], backend=any_backend)
    assert result is None
    assert_rejected(error, "input_sizes")
