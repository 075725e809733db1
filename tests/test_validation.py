"""One test per validation rule: every invalid call raises a clear error naming its argument."""

from __future__ import annotations

import numpy as np
import pytest

import gradops
from gradops import InvalidArgumentError

S1 = [1, 1, 1, 1]


def x_(shape=(2, 6, 6, 4), dtype=np.float32):
    return np.ones(shape, dtype)


def filter_grad(**kw):
    """A valid conv2d_backprop_filter call (SAME, stride 1) with keyword overrides."""
    args = dict(input=x_(), filter_sizes=[3, 3, 4, 5], out_backprop=x_((2, 6, 6, 5)), strides=S1,
                padding="SAME")
    args.update(kw)
    return gradops.conv2d_backprop_filter(**args)


def input_grad(**kw):
    args = dict(input_sizes=[2, 6, 6, 4], filter=x_((3, 3, 4, 5)), out_backprop=x_((2, 6, 6, 5)), strides=S1,
                padding="SAME")
    args.update(kw)
    return gradops.conv2d_backprop_input(**args)


def depthwise_grad(**kw):
    args = dict(input_sizes=[2, 6, 6, 4], filter=x_((3, 3, 4, 2)), out_backprop=x_((2, 6, 6, 8)), strides=S1,
                padding="SAME")
    args.update(kw)
    return gradops.depthwise_conv2d_native_backprop_input(**args)


def pool_grad(**kw):
    args = dict(orig_input_tensor_shape=[1, 6, 6, 2], out_backprop=x_((1, 3, 3, 2)),
                row_pooling_sequence=[0, 2, 4, 6], col_pooling_sequence=[0, 2, 4, 6], overlapping=False)
    args.update(kw)
    return gradops.fractional_avg_pool_grad(**args)


def depthwise_filter_grad(**kw):
    args = dict(input=x_((2, 6, 6, 4)), filter_sizes=[3, 3, 4, 2], out_backprop=x_((2, 6, 6, 8)), strides=S1,
                padding="SAME")
    args.update(kw)
    return gradops.depthwise_conv2d_native_backprop_filter(**args)


CONV_CALLS = {"conv2d_backprop_filter": filter_grad, "conv2d_backprop_input": input_grad,
              "depthwise_conv2d_native_backprop_input": depthwise_grad,
              "depthwise_conv2d_native_backprop_filter": depthwise_filter_grad}


def raises(call, *words, error=InvalidArgumentError, **kw):
    with pytest.raises(error) as info:
        call(**kw)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"
    return message


def test_valid_baseline_calls_succeed():
    """The helpers' default arguments are valid, so each test below fails for its one change."""
    assert filter_grad().shape == (3, 3, 4, 5)
    assert input_grad().shape == (2, 6, 6, 4)
    assert depthwise_grad().shape == (2, 6, 6, 4)
    assert pool_grad().shape == (1, 6, 6, 2)


def test_invalid_argument_error_is_a_value_error():
    assert issubclass(InvalidArgumentError, ValueError)


@pytest.fixture(params=sorted(CONV_CALLS))
def conv_call(request):
    return CONV_CALLS[request.param]


# ---------------------------------------------------------------- attributes shared by the conv ops


@pytest.mark.parametrize("data_format", ["NWHC", "nhwc", "NCDHW", ""])
def test_data_format_must_be_nhwc_or_nchw(conv_call, data_format):
    raises(conv_call, "data_format", data_format=data_format)


@pytest.mark.parametrize("padding", ["same", "FULL", ""])
def test_padding_must_be_same_valid_or_explicit(conv_call, padding):
    raises(conv_call, "padding", padding=padding)


@pytest.mark.parametrize("strides", [[1, 1, 1], [1, 1, 1, 1, 1], []])
def test_strides_need_four_entries(conv_call, strides):
    raises(conv_call, "strides", "4 entries", strides=strides)


@pytest.mark.parametrize("strides", [[2, 1, 1, 1], [1, 1, 1, 2]])
def test_strides_must_be_one_in_batch_and_depth(conv_call, strides):
    raises(conv_call, "strides", "batch and depth", strides=strides)


@pytest.mark.parametrize("strides", [[1, 0, 1, 1], [1, 1, -2, 1]])
def test_strides_must_be_positive(conv_call, strides):
    raises(conv_call, "strides", "positive", strides=strides)


def test_strides_must_be_integers(conv_call):
    raises(conv_call, "strides", error=TypeError, strides=[1, 1.5, 1, 1])
    raises(conv_call, "strides", error=TypeError, strides="1111")
    raises(conv_call, "strides", error=TypeError, strides=[1, True, 1, 1])


@pytest.mark.parametrize("dilations", [[1, 1, 1], [2, 1, 1, 1], [1, 1, 1, 3], [1, 0, 1, 1], [1, 1, -1, 1]])
def test_dilations_rules(conv_call, dilations):
    raises(conv_call, "dilations", dilations=dilations)


def test_explicit_paddings_must_be_empty_unless_explicit(conv_call):
    raises(conv_call, "explicit_paddings", "empty", explicit_paddings=[0] * 8)


@pytest.mark.parametrize("pads", [[], [0, 0, 1, 1, 1, 1], [0] * 10])
def test_explicit_paddings_need_eight_entries(conv_call, pads):
    raises(conv_call, "explicit_paddings", "8 entries", padding="EXPLICIT", explicit_paddings=pads)


def test_explicit_paddings_must_be_non_negative(conv_call):
    raises(conv_call, "explicit_paddings", "non-negative", padding="EXPLICIT",
           explicit_paddings=[0, 0, -1, 1, 1, 1, 0, 0])


@pytest.mark.parametrize("pads", [[1, 0, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0, 2]])
def test_explicit_paddings_must_be_zero_in_batch_and_depth(conv_call, pads):
    raises(conv_call, "explicit_paddings", "batch and depth", padding="EXPLICIT", explicit_paddings=pads)


def test_explicit_padding_batch_depth_positions_follow_data_format():
    """In NCHW the depth pads are entries 2-3, so padding H there is legal in NHWC terms only."""
    nchw = dict(input=x_((2, 4, 6, 6)), out_backprop=x_((2, 5, 6, 6)), data_format="NCHW", padding="EXPLICIT")
    raises(filter_grad, "explicit_paddings", explicit_paddings=[0, 0, 1, 1, 0, 0, 0, 0], **nchw)


def test_use_cudnn_on_gpu_must_be_bool():
    raises(filter_grad, "use_cudnn_on_gpu", error=TypeError, use_cudnn_on_gpu="yes")
    raises(input_grad, "use_cudnn_on_gpu", error=TypeError, use_cudnn_on_gpu=1)


def test_none_is_an_attributes_default(conv_call):
    """As in TF's Python wrappers, None for a defaulted attribute means its default
    (use_cudnn_on_gpu where the op has it)."""
    expected = conv_call()
    defaults = dict(explicit_paddings=None, data_format=None, dilations=None)
    if conv_call in (filter_grad, input_grad):
        defaults["use_cudnn_on_gpu"] = None
    np.testing.assert_array_equal(conv_call(**defaults), expected)
    raises(conv_call, "strides", error=TypeError, strides=None)  # no default: still required


def test_none_overlapping_is_false():
    np.testing.assert_array_equal(pool_grad(overlapping=None), pool_grad())
    x = np.arange(36, dtype=np.float32).reshape(1, 6, 6, 1)
    y = gradops.fractional_max_pool(x, [0, 2, 4, 6], [0, 3, 6], None)
    np.testing.assert_array_equal(y, gradops.fractional_max_pool(x, [0, 2, 4, 6], [0, 3, 6]))
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, y, np.ones_like(y), [0, 2, 4, 6], [0, 3, 6], None),
                                  gradops.fractional_max_pool_grad(x, y, np.ones_like(y), [0, 2, 4, 6], [0, 3, 6]))
    np.testing.assert_array_equal(gradops.fractional_avg_pool(x, [0, 2, 4, 6], [0, 3, 6], None),
                                  gradops.fractional_avg_pool(x, [0, 2, 4, 6], [0, 3, 6]))


@pytest.mark.parametrize("strides", [np.array([1, 1, 1, 1]), (1, 1, 1, 1), range(1, 2)], ids=["array", "tuple", "range"])
def test_attribute_lists_may_be_sequences_or_1d_arrays(strides):
    """Lists, tuples, ranges and 1-D NumPy arrays of integers are attribute lists."""
    if isinstance(strides, range):
        np.testing.assert_array_equal(filter_grad(dilations=[*strides] * 4), filter_grad())
    else:
        np.testing.assert_array_equal(filter_grad(strides=strides), filter_grad())


@pytest.mark.parametrize("name", ["strides", "dilations", "explicit_paddings"])
@pytest.mark.parametrize("value", [np.array(1), np.ones((2, 2), np.int64), {1, 2}, {1: 1, 2: 2}, (v for v in [1, 1, 1, 1]), 1],
                         ids=["0d_array", "2d_array", "set", "dict", "generator", "int"])
def test_attribute_lists_of_other_kinds_are_refused_by_name(conv_call, name, value):
    """Anything else (a 0-d or 2-D array, a set, a dict, a generator, a number) is a TypeError
    naming the attribute, not NumPy's own message nor a dict read by its keys."""
    kw = {name: value}
    if name == "explicit_paddings":
        kw["padding"] = "EXPLICIT"
    raises(conv_call, name, "list of integers", error=TypeError, **kw)


# ---------------------------------------------------------------- tensor shapes


def test_input_must_be_4d():
    raises(filter_grad, "input", "4-dimensional", input=x_((6, 6, 4)))


def test_filter_must_be_4d():
    raises(input_grad, "filter", "4-dimensional", filter=x_((3, 3, 4)))
    raises(depthwise_grad, "filter", "4-dimensional", filter=x_((3, 3, 4, 2, 1)))


def test_out_backprop_must_be_4d(conv_call):
    raises(conv_call, "out_backprop", "4-dimensional", out_backprop=x_((2, 6, 6)))


def test_batch_sizes_must_match(conv_call):
    raises(conv_call, "batch", out_backprop=x_((3, 6, 6, 8 if conv_call is depthwise_grad else 5)))


def test_filter_depth_must_be_positive():
    raises(filter_grad, "filter depth", "greater than zero", filter_sizes=[3, 3, 0, 5])
    raises(input_grad, "filter depth", filter=x_((3, 3, 0, 5)))


def test_input_depth_must_be_divisible_by_filter_depth():
    raises(filter_grad, "divisible by filter depth", filter_sizes=[3, 3, 3, 5])


def test_out_depth_must_match_filter():
    raises(filter_grad, "out_depth", filter_sizes=[3, 3, 4, 6])
    raises(input_grad, "out_depth", out_backprop=x_((2, 6, 6, 6)))


def test_grouped_out_depth_must_be_divisible_by_groups():
    """4 input channels / filter depth 2 = 2 groups; 5 output channels cannot be split."""
    raises(filter_grad, "groups", filter_sizes=[3, 3, 2, 5])


@pytest.mark.parametrize("batch", [0, 2], ids=["empty_batch", "batch2"])
def test_input_depth_0_forms_no_groups(batch):
    """Input depth 0 over filter depth 1 or 2 is 0 groups: out_depth > 0 is refused by every
    non-depthwise op (however empty the tensors); out_depth 0 is consistent (empty results)."""
    x0, dy = x_((batch, 6, 6, 0)), x_((batch, 6, 6, 5))
    for fin in (1, 2):
        raises(filter_grad, "number of groups", "input depth 0", input=x0, filter_sizes=[3, 3, fin, 5],
               out_backprop=dy)
        raises(input_grad, "number of groups", input_sizes=[batch, 6, 6, 0], filter=x_((3, 3, fin, 5)),
               out_backprop=dy)
        raises(gradops.conv2d, "number of groups", input=x0, filter=x_((3, 3, fin, 5)), strides=S1, padding="SAME")
        raises(gradops.conv2d_backprop_filter_v2, "number of groups", input=x0, filter=x_((3, 3, fin, 5)),
               out_backprop=dy, strides=S1, padding="SAME")
        raises(gradops.conv2d_backprop_input_v2, "number of groups", input=x0, filter=x_((3, 3, fin, 5)),
               out_backprop=dy, strides=S1, padding="SAME")
    dy0 = x_((batch, 6, 6, 0))
    assert filter_grad(input=x0, filter_sizes=[3, 3, 1, 0], out_backprop=dy0).shape == (3, 3, 1, 0)
    assert not input_grad(input_sizes=[batch, 6, 6, 0], filter=x_((3, 3, 1, 0)), out_backprop=dy0).size
    assert gradops.conv2d(x0, x_((3, 3, 1, 0)), S1, "SAME").shape == (batch, 6, 6, 0)
    # Depthwise is not grouped by the filter depth: in_depth 0 there means a [R, S, 0, M] filter.
    assert not depthwise_grad(input_sizes=[batch, 6, 6, 0], filter=x_((3, 3, 0, 2)), out_backprop=dy0).size
    raises(depthwise_grad, "in_depth", input_sizes=[batch, 6, 6, 0], filter=x_((3, 3, 1, 2)),
           out_backprop=x_((batch, 6, 6, 2)))


@pytest.mark.parametrize("shape", [(2, 5, 6, 5), (2, 6, 7, 5)])
def test_out_backprop_spatial_size_must_match(shape):
    raises(filter_grad, "out_backprop", "computed", out_backprop=x_(shape))


def test_output_size_that_would_be_negative_is_rejected():
    """VALID, input 1, filter 5: (1 - 5 + 1) / 1 = -3 in TF's arithmetic."""
    raises(filter_grad, "negative", padding="VALID", input=x_((2, 1, 6, 4)), filter_sizes=[5, 3, 4, 5],
           out_backprop=x_((2, 0, 4, 5)))


def test_truncating_division_gives_zero_not_an_error():
    """VALID, input 2, filter 5, stride 2: TF computes (2 - 5 + 2) / 2 = 0 (C++ truncation)."""
    out = filter_grad(padding="VALID", input=x_((2, 2, 6, 4)), filter_sizes=[5, 1, 4, 5],
                      strides=[1, 2, 1, 1], out_backprop=x_((2, 0, 6, 5)))
    assert out.shape == (5, 1, 4, 5) and not out.any()


def test_shapes_beyond_int64_elements_are_rejected():
    """A result of 2 * 2**62 * 2**62 * 4 elements is refused before anything is allocated."""
    raises(input_grad, "2**63", input_sizes=[2, 2**62, 2**62, 4], padding="VALID",
           strides=[1, 2**31 - 1, 2**31 - 1, 1], filter=x_((1, 1, 4, 5)), out_backprop=x_((2, 1, 1, 5)))


EMPTY_TOO_WIDE = [1, 2**31, 2**31, 0]  # 2**62 non-zero elements: 2**63 bytes in float16


def check_empty_results_no_numpy_array_can_hold(put, backend):
    """NumPy refuses an empty shape whose non-zero dimensions span 2**63 bytes or more ("array
    is too big"); a fuzzed conv2d with 2**31 - 1 explicit padding each side made one and the
    NumPy backend raised that ValueError.  gradops refuses it by name on every device; the
    float16 shape spanning 2**62 bytes is computed."""
    pad = 2**31 - 1
    forward = dict(input=put(x_((1, 1, 1, 1), np.float16)), filter=put(x_((1, 1, 1, 0), np.float16)),
                   strides=S1, padding="EXPLICIT", explicit_paddings=[0, 0, 0, pad, pad, 0, 0, 0],
                   backend=backend)
    raises(gradops.conv2d, "result shape", str(EMPTY_TOO_WIDE), "no NumPy array", **forward)
    half = dict(forward, explicit_paddings=[0, 0, 0, pad // 2, pad // 2, 0, 0, 0])
    assert gradops.conv2d(**half).shape == (1, 2**30, 2**30, 0)
    # The element width counts: the shape that float16 can take, float64 cannot.
    wide = dict(half, input=put(x_((1, 1, 1, 1), np.float64)), filter=put(x_((1, 1, 1, 0), np.float64)))
    raises(gradops.conv2d, "8-byte elements", **wide)
    # A result given by a size argument: filter_sizes of the filter gradient.
    raises(gradops.conv2d_backprop_filter, "result shape", input=put(x_((1, 1, 1, 1), np.float16)),
           filter_sizes=[2**31, 2**31, 1, 0], out_backprop=put(x_((1, 1, 1, 0), np.float16)), strides=S1,
           padding="EXPLICIT", explicit_paddings=[0, 0, pad, 0, pad, 0, 0, 0], backend=backend)


def test_empty_results_no_numpy_array_can_hold_are_refused():
    check_empty_results_no_numpy_array_can_hold(lambda a: a, "numpy")


def test_empty_results_no_numpy_array_can_hold_are_refused_on_gpu(gpu_backend):
    """The same refusal for GPU arrays, where CuPy might hold the empty result: a call's result
    or error does not depend on where its tensors live."""
    from conftest import to_gpu

    check_empty_results_no_numpy_array_can_hold(to_gpu, gpu_backend)


# ---------------------------------------------------------------- size tensors


@pytest.mark.parametrize("sizes", [[3, 3, 4], [3, 3, 4, 5, 1], []])
def test_filter_sizes_need_four_entries(sizes):
    raises(filter_grad, "filter_sizes", filter_sizes=sizes)


def test_filter_sizes_must_be_1d_non_negative_integers():
    raises(filter_grad, "filter_sizes", "1-dimensional", filter_sizes=np.array([[3, 3], [4, 5]]))
    raises(filter_grad, "filter_sizes", "non-negative", filter_sizes=[3, -3, 4, 5])
    raises(filter_grad, "filter_sizes", error=TypeError, filter_sizes=np.array([3.0, 3, 4, 5]))


@pytest.mark.parametrize("sizes", [[2, 6, 6], [6], [2, 6, 6, 4, 1]])
def test_input_sizes_need_four_or_two_entries(sizes):
    raises(input_grad, "input_sizes", input_sizes=sizes)


def test_input_sizes_must_be_non_negative():
    raises(input_grad, "input_sizes", "non-negative", input_sizes=[2, -6, 6, 4])
    raises(input_grad, "input_sizes", "non-negative", input_sizes=[-6, 6])


def test_input_sizes_wrapped_int32_values_are_rejected():
    """2**32 - 6 stored as int32 reads as -6: negative, so rejected (never reinterpreted)."""
    raises(input_grad, "input_sizes", input_sizes=np.array([2, 2**32 - 6, 6, 4], dtype=np.int64).astype(np.int32))


def test_input_sizes_two_entries_take_batch_and_depth_from_tensors():
    assert input_grad(input_sizes=[6, 6]).shape == (2, 6, 6, 4)


def test_depthwise_input_sizes_need_four_entries():
    raises(depthwise_grad, "input_sizes", "4 values", input_sizes=[6, 6])


def test_depthwise_filter_in_depth_must_equal_input_depth():
    raises(depthwise_grad, "in_depth", filter=x_((3, 3, 2, 4)))


def test_depthwise_out_depth_must_be_in_depth_times_multiplier():
    raises(depthwise_grad, "depth_multiplier", out_backprop=x_((2, 6, 6, 6)))


# ---------------------------------------------------------------- dtypes and array types


def test_tensors_must_share_a_dtype():
    raises(filter_grad, "out_backprop", "float64", out_backprop=x_((2, 6, 6, 5), np.float64))
    raises(input_grad, "dtype", filter=x_((3, 3, 4, 5), np.float16))


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.bool_, np.complex64, np.uint8])
def test_conv_ops_reject_non_float_dtypes(conv_call, dtype):
    depthwise = conv_call in (depthwise_grad, depthwise_filter_grad)
    kw = {"out_backprop": x_((2, 6, 6, 8 if depthwise else 5), dtype)}
    if conv_call in (filter_grad, depthwise_filter_grad):
        kw["input"] = x_((2, 6, 6, 4), dtype)
    else:
        kw["filter"] = x_((3, 3, 4, 2 if conv_call is depthwise_grad else 5), dtype)
    raises(conv_call, "dtype", **kw)


def test_non_arrays_raise_type_error():
    raises(filter_grad, "input", error=TypeError, input=object())
    raises(input_grad, "filter", error=TypeError, filter=[[1.0], [1.0, 2.0]])


def test_v2_ops_type_their_shape_tensor_like_tf():
    """TF's V2 ops take the shape tensor as type T: it must match the others' dtype."""
    raises(gradops.conv2d_backprop_filter_v2, "filter", input=x_(), filter=x_((3, 3, 4, 5), np.float64),
           out_backprop=x_((2, 6, 6, 5)), strides=S1, padding="SAME")
    raises(gradops.conv2d_backprop_input_v2, "input", input=x_(dtype=np.float16), filter=x_((3, 3, 4, 5)),
           out_backprop=x_((2, 6, 6, 5)), strides=S1, padding="SAME")


# ---------------------------------------------------------------- fractional pooling


def test_orig_input_tensor_shape_needs_four_non_negative_entries():
    raises(pool_grad, "orig_input_tensor_shape", orig_input_tensor_shape=[1, 6, 6])
    raises(pool_grad, "orig_input_tensor_shape", orig_input_tensor_shape=np.array([[1, 6], [6, 2]]))
    raises(pool_grad, "orig_input_tensor_shape", orig_input_tensor_shape=[1, -6, 6, 2])


def test_fractional_out_backprop_must_be_4d():
    raises(pool_grad, "out_backprop", out_backprop=x_((3, 3, 2)))


@pytest.mark.parametrize("shape", [(2, 3, 3, 2), (1, 3, 3, 3)], ids=["batch2", "depth3"])
def test_fractional_batch_and_depth_must_not_exceed_original(shape):
    """TF writes past the end of its gradient buffer when out_backprop's batch or depth is
    larger (a smaller one leaves the rest zero, and is computed: test_tf_parity)."""
    raises(pool_grad, "batch and depth", out_backprop=x_(shape))


def test_pooling_sequence_must_be_long_enough():
    raises(pool_grad, "row_pooling_sequence", "at least 4", row_pooling_sequence=[0, 2, 4])
    raises(pool_grad, "col_pooling_sequence", "at least 4", col_pooling_sequence=[0, 6])


def test_pooling_sequence_must_not_be_negative():
    raises(pool_grad, "row_pooling_sequence", "negative", row_pooling_sequence=[-1, 2, 4, 6])


def test_disjoint_pooling_cell_must_not_end_before_index_0():
    """A disjoint cell ends at next entry - 1: a next entry of 0 ends it at -1, which TF refuses
    as a negative value; the overlapping cell ending at 0 is fine."""
    raises(pool_grad, "row_pooling_sequence", "negative", row_pooling_sequence=[0, 0, 4, 6])
    raises(pool_grad, "col_pooling_sequence", "negative", col_pooling_sequence=[3, 0, 4, 6])
    assert pool_grad(row_pooling_sequence=[0, 0, 4, 6], overlapping=True).shape == (1, 6, 6, 2)


def test_pooling_sequence_values_must_fit_in_int64():
    """TF's sequences are int64: a uint64 entry past 2**63 - 1 is refused, not wrapped (a cell
    starting that far past the input would otherwise be an empty cell)."""
    raises(pool_grad, "row_pooling_sequence", "int64", row_pooling_sequence=np.array([0, 2**63, 4, 6], np.uint64))
    raises(gradops.fractional_avg_pool, "col_pooling_sequence", "int64", value=x_((1, 6, 6, 2)),
           row_pooling_sequence=[0, 6], col_pooling_sequence=np.array([2**64 - 1, 6], np.uint64))


def test_unordered_pooling_sequences_are_accepted():
    """Decreasing sequences, equal entries (empty disjoint cells) and cells starting past the
    input are read as TF reads them: the empty cells spread no gradient."""
    for kw in (dict(col_pooling_sequence=[0, 4, 2, 6]), dict(row_pooling_sequence=[0, 2, 2, 6]),
               dict(row_pooling_sequence=[0, 3, 2, 6], overlapping=True), dict(row_pooling_sequence=[0, 2, 6, 8])):
        assert pool_grad(**kw).shape == (1, 6, 6, 2)


def test_pooling_sequence_must_be_integers():
    raises(pool_grad, "row_pooling_sequence", error=TypeError, row_pooling_sequence=[0.0, 2.0, 4.0, 6.0])
    for unit in ("s", "ns"):  # NumPy files timedelta64 under its integer types
        raises(pool_grad, "row_pooling_sequence", "integers", error=TypeError,
               row_pooling_sequence=np.array([0, 2, 4, 6], f"timedelta64[{unit}]"))
        raises(filter_grad, "filter_sizes", "integers", error=TypeError,
               filter_sizes=np.array([3, 3, 4, 5], f"timedelta64[{unit}]"))


def test_overlapping_must_be_bool():
    raises(pool_grad, "overlapping", error=TypeError, overlapping="yes")


def test_fractional_dtypes():
    raises(pool_grad, "dtype", out_backprop=x_((1, 3, 3, 2), np.uint8))
    raises(pool_grad, "dtype", out_backprop=x_((1, 3, 3, 2), np.complex128))


# ---------------------------------------------------------------- backends and array locations


def test_unknown_backend_is_rejected():
    raises(filter_grad, "backend", backend="tpu")


@pytest.mark.parametrize("backend", ["cuda", "cudnn"])
def test_gpu_backend_with_host_arrays_is_rejected(backend):
    raises(filter_grad, f"backend={backend!r}", "host", backend=backend)


class FakeGpuArray:
    """Claims to live on a GPU through __cuda_array_interface__ (never dereferenced)."""

    shape = (2, 6, 6, 5)
    __cuda_array_interface__ = {"shape": (2, 6, 6, 5), "typestr": "<f4", "data": (0, False), "version": 3}


def test_mixed_host_and_gpu_arguments_are_rejected():
    raises(filter_grad, "out_backprop", "GPU", "input", out_backprop=FakeGpuArray())


def test_gpu_arrays_without_cupy_say_why():
    try:
        import cupy  # noqa: F401
    except ImportError:
        fake_in = FakeGpuArray()
        fake_in.shape = (2, 6, 6, 4)
        raises(filter_grad, "CuPy is not installed", error=gradops.BackendUnavailableError,
               input=fake_in, out_backprop=FakeGpuArray())
    else:
        pytest.skip("CuPy is installed: the 'no CuPy' path cannot be exercised")


# --------------------------------------------------------------------------- memoised validation


def test_memoised_geometry_keeps_value_types_apart_and_caches_no_refusal():
    """A valid call caches its geometry; an argument equal to it but of another type (gradops
    refuses bool strides, which TF's Python wrapper converts) or an invalid one is still
    validated, every time."""
    from gradops._geometry import conv2d_geometry

    args = ("conv2d_backprop_input", (1, 5, 5, 2), (3, 3, 2, 4), (1, 5, 5, 4))
    first = conv2d_geometry(*args, [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1])
    assert conv2d_geometry(*args, [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1]) is first  # the cache hit
    assert conv2d_geometry(*args, (1, 1, 1, 1), "SAME", (), "NHWC", (1, 1, 1, 1)) == first
    for _ in range(2):
        with pytest.raises((TypeError, gradops.InvalidArgumentError)):
            conv2d_geometry(*args, [True, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1])
        with pytest.raises(gradops.InvalidArgumentError):
            conv2d_geometry(*args, [1, 1, 1, 1], "SAME", [], "NHWC", [2, 1, 1, 1])


def test_memoised_cache_survives_an_eviction_between_a_hit_and_its_reorder(monkeypatch):
    """Threads share the cache: a second thread that inserts (evicting the entry a first
    thread has just found) must not make the first thread's reorder raise KeyError.  The
    interleaving is forced: right after the first thread's lookup succeeds, the second
    thread's call runs (without the lock) or waits for the first to finish (with it)."""
    import threading

    from gradops import _memo

    test_thread = threading.current_thread()
    intruders: list[threading.Thread] = []

    class InterleavingDict(_memo.OrderedDict):
        def _after_lookup(self, found):
            if found and threading.current_thread() is test_thread and not intruders:
                intruders.append(threading.Thread(target=square, args=(3,)))
                intruders[0].start()
                intruders[0].join(timeout=0.2)  # done unless it waits for a lock the lookup holds

        def __getitem__(self, key):
            value = super().__getitem__(key)
            self._after_lookup(True)
            return value

        def get(self, key, default=None):
            value = super().get(key, default)
            self._after_lookup(value is not default)
            return value

    monkeypatch.setattr(_memo, "OrderedDict", InterleavingDict)

    @_memo.memoised(maxsize=1)
    def square(x):
        return x * x

    assert square(2) == 4
    assert square(2) == 4  # the hit the intruder interrupts
    intruders[0].join()
    assert square(3) == 9 and square(2) == 4


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_memoised_cache_works_in_a_child_forked_while_another_thread_held_its_lock(monkeypatch):
    """A fork copies a lock another thread holds, and that thread does not exist in the child:
    without a new lock the child's first call to a memoised function (every op validates
    through one) waited forever.  Here a thread is held inside the cache's lookup, under the
    lock, while the process forks."""
    import multiprocessing
    import threading
    import warnings

    from gradops import _memo

    inside, release = threading.Event(), threading.Event()
    holder_thread: list[threading.Thread] = []

    class HoldingDict(_memo.OrderedDict):
        def get(self, key, default=None):
            if holder_thread and threading.current_thread() is holder_thread[0]:
                inside.set()
                release.wait(30)
            return super().get(key, default)

    monkeypatch.setattr(_memo, "OrderedDict", HoldingDict)

    @_memo.memoised()
    def square(x):
        return x * x

    holder_thread.append(threading.Thread(target=square, args=(2,)))
    holder_thread[0].start()
    assert inside.wait(30)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    try:
        with warnings.catch_warnings():  # Python >= 3.12 warns on fork in a process with threads
            warnings.simplefilter("ignore", DeprecationWarning)
            process = context.Process(target=lambda: send.send((square(3), square(3))))
            process.start()
        assert receive.poll(60), "the forked child's call did not finish in 60 s"
        assert receive.recv() == (9, 9)
    finally:
        release.set()
        holder_thread[0].join()
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
    assert square(2) == 4


def test_memoised_geometry_takes_unhashable_arguments_uncached():
    from gradops._geometry import conv2d_geometry

    args = ("conv2d_backprop_input", (1, 5, 5, 2), (3, 3, 2, 4), (1, 5, 5, 4))
    with_array = conv2d_geometry(*args, np.array([1, 1, 1, 1]), "SAME", [], "NHWC", [1, 1, 1, 1])
    assert with_array == conv2d_geometry(*args, [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1])


def test_shape_messages_name_the_sizes_argument():
    """Where a shape comes from input_sizes or filter_sizes, the message names that argument
    (TF's wording says input / filter)."""
    raises(input_grad, "input_sizes and out_backprop", "batch size", input_sizes=[3, 6, 6, 4])
    raises(depthwise_grad, "input_sizes and filter", "in_depth", input_sizes=[2, 6, 6, 3])
    raises(filter_grad, "filter_sizes and out_backprop", "out_depth", filter_sizes=[3, 3, 4, 6])
    raises(filter_grad, "filter_sizes", "strictly greater than zero", filter_sizes=[3, 3, 0, 5])
    raises(filter_grad, "(input)", "(filter_sizes)", "evenly divisible", filter_sizes=[3, 3, 3, 5])
    raises(gradops.conv2d_backprop_input_v2, "input and out_backprop", input=x_((3, 6, 6, 4)), filter=x_((3, 3, 4, 5)),
           out_backprop=x_((2, 6, 6, 5)), strides=S1, padding="SAME")
    raises(input_grad, "padding='EXPLICIT'", "negative", padding="EXPLICIT", input_sizes=[2, 1, 6, 4],
           out_backprop=x_((2, 0, 6, 5)), explicit_paddings=[0, 0, 0, 0, 1, 1, 0, 0])


@pytest.mark.parametrize("value", [2**63, 2**64, 10**20])
def test_python_ints_past_int64_in_size_tensors_name_the_argument(value):
    """Size tensors given as Python lists reach the int64 range check: NumPy made 2**63 a
    float64 array ("must hold integers") and 2**64 an object array ("not a numeric array"),
    where a uint64 array of the same value was refused as out of range."""
    w, dy = np.ones((3, 3, 2, 2), np.float32), np.ones((2, 6, 7, 2), np.float32)
    calls = {
        "input_sizes": lambda: gradops.conv2d_backprop_input([2, 6, 7, value], w, dy, [1, 1, 1, 1], "SAME"),
        "filter_sizes": lambda: gradops.conv2d_backprop_filter(dy, [3, 3, 2, value], dy, [1, 1, 1, 1], "SAME"),
        "orig_input_tensor_shape": lambda: gradops.fractional_avg_pool_grad(
            [1, value, 4, 1], np.ones((1, 2, 2, 1)), [0, 2, 4], [0, 2, 4]),
        "row_pooling_sequence": lambda: gradops.fractional_max_pool(np.ones((1, 4, 4, 1)), [0, 2, value, 4], [0, 2, 4]),
    }
    for name, call in calls.items():
        with pytest.raises(gradops.InvalidArgumentError, match=f"{name} .*must fit in int64"):
            call()
