"""gradops.fractional_avg_pool_grad against TF's loop (reference.py), adjointness and TF itself."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradops
from conftest import FLOAT_DTYPES, FOREIGN_GPU_WRAPPERS, assert_close, random_array, to_gpu, to_host
from pooling_cases import TINY_POOLS
from reference import fractional_avg_pool, fractional_avg_pool_grad

INT_DTYPES = [np.int32, np.int64]
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES
ALL_IDS = [np.dtype(d).name for d in ALL_DTYPES]
TF_DTYPES = [np.int32, np.int64, np.float32, np.float64]


# --------------------------------------------------------------------------- helpers


def is_int(dtype):
    return np.issubdtype(np.dtype(dtype), np.integer)


def random_backprop(rng, shape, dtype):
    """Small signed integers for integer dtypes (so truncation matters), normals otherwise."""
    if is_int(dtype):
        return rng.integers(-30, 31, shape).astype(dtype)
    return random_array(rng, shape, dtype)


def assert_grad_matches(got, ref, dtype):
    """``got`` is ``ref`` (float64, summed in TF's loop order) cast once to ``dtype``.

    Integers must equal trunc(ref) exactly: the summation order decides x.0 vs (x-1).999...,
    and gradops promises TF's order (see test_integer_truncation_sum_order_matches_tf).
    """
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    if is_int(dtype):
        np.testing.assert_array_equal(got, np.trunc(ref).astype(dtype))
    else:
        assert_close(got, ref, dtype)


def check(rng, orig_shape, rows, cols, overlapping, dtype, out_rows=None, out_cols=None):
    """Random out_backprop for the given sequences; gradops must match TF's loop."""
    out_rows = len(rows) - 1 if out_rows is None else out_rows
    out_cols = len(cols) - 1 if out_cols is None else out_cols
    dy = random_backprop(rng, (orig_shape[0], out_rows, out_cols, orig_shape[3]), dtype)
    got = gradops.fractional_avg_pool_grad(np.array(orig_shape), dy, np.array(rows), np.array(cols), overlapping)
    assert_grad_matches(got, fractional_avg_pool_grad(orig_shape, dy, list(rows), list(cols), overlapping), dtype)
    return got


# --------------------------------------------------------------------------- grids


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("pseudo_random", [False, True], ids=["shuffled", "pseudo_random"])
@pytest.mark.parametrize("ratio", [1.44, 1.5, 2.0])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_generated_sequences_grid(rng, overlapping, ratio, pseudo_random, dtype):
    """Sequences from fractional_pooling_sequence, both modes, every dtype match TF's loop."""
    shape = (2, 7, 9, 3)
    rows = gradops.fractional_pooling_sequence(7, ratio, pseudo_random, seed=3)
    cols = gradops.fractional_pooling_sequence(9, ratio, pseudo_random, seed=4)
    check(rng, shape, rows, cols, overlapping, dtype)


@pytest.mark.parametrize("pseudo_random", [False, True], ids=["shuffled", "pseudo_random"])
@pytest.mark.parametrize("ratio", [1.0, 1.44, 1.5, 2.0, 2.7])
@pytest.mark.parametrize("size", [5, 7, 10])
def test_pooling_sequence_shape(size, ratio, pseudo_random):
    """fractional_pooling_sequence: int64, 0..size, floor(size/ratio) cells of size k or k+1."""
    seq = gradops.fractional_pooling_sequence(size, ratio, pseudo_random, seed=11)
    out = int(size // ratio)
    assert seq.dtype == np.int64 and seq.shape == (out + 1,)
    assert seq[0] == 0 and seq[-1] == size
    k = size // out
    assert set(np.diff(seq).tolist()) <= {k, k + 1}


HAND_CASES = {
    # name: (orig NHWC shape, row seq, col seq, out_rows, out_cols)
    "size1_cells": ((1, 4, 3, 2), [0, 1, 2, 3, 4], [0, 1, 2, 3], 4, 3),
    "last_entry_past_input": ((1, 5, 6, 1), [0, 2, 4, 9], [0, 3, 20], 3, 2),
    "longer_than_needed": ((2, 6, 5, 1), [0, 2, 4, 5, 6, 7], [0, 1, 3, 5, 99], 2, 2),
    "starts_after_zero": ((1, 5, 5, 2), [1, 3, 5], [2, 4, 5], 2, 2),
    "single_cell": ((1, 3, 4, 1), [0, 3], [0, 4], 1, 1),
    # Sequences TF reads without ordering them: each cell is clamped to the input on its own,
    # and one that ends before it starts is empty (it spreads no gradient).
    "decreasing": ((1, 4, 5, 2), [0, 3, 2, 4], [0, 2, 1, 5], 3, 3),
    "cells_past_input": ((1, 4, 3, 1), [0, 5, 10], [1, 7, 2], 2, 2),
    "equal_entries": ((2, 5, 4, 1), [0, 2, 2, 5], [1, 1, 3, 4], 3, 3),
    "late_start_then_back": ((1, 6, 6, 1), [5, 1, 3, 2], [4, 1, 6], 3, 2),
    "all_row_cells_empty": ((1, 3, 3, 1), [4, 5, 6], [0, 3], 2, 1),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("case", list(HAND_CASES), ids=list(HAND_CASES))
def test_hand_written_sequences(rng, case, overlapping, dtype):
    """Size-1 cells, clamped last entries, over-long sequences, late starts match TF's loop."""
    shape, rows, cols, out_rows, out_cols = HAND_CASES[case]
    check(rng, shape, rows, cols, overlapping, dtype, out_rows, out_cols)


def test_size1_cells_are_identity():
    """Disjoint cells of one element each pass out_backprop through unchanged."""
    dy = np.arange(24, dtype=np.float32).reshape(1, 4, 3, 2)
    got = gradops.fractional_avg_pool_grad([1, 4, 3, 2], dy, [0, 1, 2, 3, 4], [0, 1, 2, 3], False)
    np.testing.assert_array_equal(got, dy)


def test_overlapping_allows_repeated_entries(rng):
    """Overlapping mode accepts equal neighbours (a one-row cell) and matches TF's loop."""
    check(rng, (1, 5, 4, 1), [0, 2, 2, 4], [0, 1, 1, 3], True, np.float64)


def test_golden_decreasing_and_past_input():
    """Hand-computed: 4 input rows (1 column), dy = [1, 2, 3], rows [0, 3, 2, 4].

    Disjoint: cells 0..2, 3..1 (empty: its 2 spreads nowhere), 2..min(3, 3): row 2 gets
    1/3 + 3/2, row 3 gets 3/2.  Overlapping: 0..3, 3..2 (empty), 2..3.  Rows [0, 5, 10]:
    cell 1 starts past the input and is empty, cell 0 is clamped to 0..3.
    """
    dy = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1, 1)
    disjoint = gradops.fractional_avg_pool_grad([1, 4, 1, 1], dy, [0, 3, 2, 4], [0, 1], False)
    np.testing.assert_array_equal(disjoint.reshape(-1), [1 / 3, 1 / 3, 1 / 3 + 1.5, 1.5])
    overlapping = gradops.fractional_avg_pool_grad([1, 4, 1, 1], dy, [0, 3, 2, 4], [0, 1], True)
    np.testing.assert_array_equal(overlapping.reshape(-1), [0.25, 0.25, 0.25 + 1.5, 0.25 + 1.5])
    for overlap in (False, True):
        past = gradops.fractional_avg_pool_grad([1, 4, 1, 1], dy[:, :2], [0, 5, 10], [0, 1], overlap)
        np.testing.assert_array_equal(past.reshape(-1), [0.25] * 4)


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_empty_cells_in_both_dimensions(rng, overlapping):
    """Cells empty in rows, in columns, in both, and a whole gradient of empty cells (zeros)."""
    for dtype in ALL_DTYPES:
        check(rng, (2, 5, 6, 2), [3, 1, 4, 4, 9], [6, 2, 2, 5, 1], overlapping, dtype)
        got = check(rng, (1, 3, 3, 2), [3, 4, 7], [0, 2, 3], overlapping, dtype)
        assert not np.any(got.astype(np.float64))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=["int32", "int64"])
def test_integer_truncation_toward_zero(dtype):
    """7 over a 2x2 cell is 1.75 -> 1 and -7 is -1.75 -> -1 (toward zero, not floor)."""
    dy = np.array([7, -7], dtype).reshape(1, 1, 2, 1)
    got = gradops.fractional_avg_pool_grad([1, 2, 4, 1], dy, [0, 2], [0, 2, 4], False)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got[0, :, :, 0], [[1, 1, -1, -1], [1, 1, -1, -1]])


def test_golden_overlapping_clamped():
    """Hand-computed: 3x3 input, overlapping, rows [0, 1, 3], cols [0, 3].

    Row cells: 0..1 and 1..min(3, 2) = 1..2 (clamped); the col cell is 0..min(3, 2) = 0..2.
    Both cells hold 2 * 3 = 6 elements, so dy = [6, 12] spreads 1 and 2 per element:
    row 0 gets 1, row 1 (in both cells) gets 1 + 2 = 3, row 2 gets 2, in every column.
    """
    dy = np.array([6.0, 12.0], np.float32).reshape(1, 2, 1, 1)
    got = gradops.fractional_avg_pool_grad([1, 3, 3, 1], dy, [0, 1, 3], [0, 3], True)
    np.testing.assert_array_equal(got[0, :, :, 0], [[1, 1, 1], [3, 3, 3], [2, 2, 2]])


def test_integer_truncation_sum_order_matches_tf():
    """int32 sums in TF's loop order: element (1, 1) is 4/4 + 2/6 + 4/6 = 2 in TF, not 1.

    Cells (overlapping, 4x4, rows [0, 1, 3], cols [0, 1, 4]) covering element (1, 1): (0,0) size 4
    gets 4/4 = 1, (0,1) size 6 gets 2/6, (1,0) size 6 gets 4/6, (1,1) gets 0.  TF adds them in
    cell order: 1 + 1/3 + 2/3 + 0 == 2.0 exactly, so TF returns 2.  Summing rows first,
    (1 + 2/3) + (1/3 + 0) == 1.9999999999999998, truncates to 1.
    """
    dy = np.array([[4, 2], [4, 0]], np.int32).reshape(1, 2, 2, 1)
    got = gradops.fractional_avg_pool_grad([1, 4, 4, 1], dy, [0, 1, 3], [0, 1, 4], True)
    ref = np.trunc(fractional_avg_pool_grad((1, 4, 4, 1), dy, [0, 1, 3], [0, 1, 4], True)).astype(np.int32)
    assert ref[0, 1, 1, 0] == 2
    np.testing.assert_array_equal(got, ref)


# --------------------------------------------------------------------------- forward op, NumPy runs


def test_numpy_forward_batch_runs_match_one_run(monkeypatch):
    """The forward average takes runs of images on the thread pool: every run of images (and
    any number of workers) gives the one-run result bit for bit, which is TF's loop (an Inf in
    one image stays in that image's cells)."""
    from gradops.backends import numpy_backend as nb

    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 9, 8, 3)) * 10.0 ** rng.integers(-6, 7, (5, 9, 8, 3))
    x[3, 4, 2, 1] = np.inf
    rows, cols = [0, 2, 3, 6, 9], [0, 3, 5, 8]
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1 << 40)
    whole = gradops.fractional_avg_pool(x, rows, cols)
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)  # one image a run
    for workers in (1, 2, 3):
        monkeypatch.setattr(nb, "_WORKERS", workers)
        np.testing.assert_array_equal(gradops.fractional_avg_pool(x, rows, cols), whole)
    assert np.isinf(whole[3]).any() and np.isfinite(np.delete(whole, 3, axis=0)).all()
    np.testing.assert_array_equal(whole, fractional_avg_pool(x, rows, cols, False))


@pytest.mark.parametrize("step_elements", [0, 10**9], ids=["adds", "accumulate"])
def test_numpy_forward_running_sums_keep_tf_order(monkeypatch, step_elements):
    """A cell's running sum is a Python loop of adds or, for many short steps, one
    np.add.accumulate: both add in TF's order (np.add.reduce would add a contiguous run
    pairwise), and both give +0.0 for a cell of -0.0 only, as TF's sum from zero does."""
    from gradops.backends import numpy_backend as nb

    monkeypatch.setattr(nb, "RUNNING_SUM_STEP_ELEMENTS", step_elements)
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((1, 40, 40, 1)) * 10.0 ** rng.uniform(-3, 3, (1, 40, 40, 1))).astype(np.float32)
    x[0, :4, :4] = -0.0
    rows, cols = [0, 4, 40], [0, 4, 40]  # a -0.0 cell, and cells of 144 to 1296 elements
    got = gradops.fractional_avg_pool(x, rows, cols)
    np.testing.assert_array_equal(got, fractional_avg_pool(x, rows, cols, False))
    assert got[0, 0, 0, 0] == 0 and not np.signbit(got[0, 0, 0, 0])
    pairwise = np.add.reduce(x[0, 4:, 4:, 0].reshape(-1)) / np.float32(36 * 36)
    assert got[0, 1, 1, 0] != pairwise  # the order shows in these values


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_numpy_forward_half_types_sum_in_float32(dtype, overlapping):
    """Half types (an extension: TF's FractionalAvgPool has none) sum and divide in float32 and
    round once: the loop's bits, and not those of float64 sums where they differ."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((2, 9, 10, 3)) * 10.0 ** rng.integers(-2, 3, (2, 9, 10, 3))).astype(dtype)
    rows, cols = [0, 2, 3, 5, 9], [0, 4, 5, 7, 10]  # cells of up to 4 x 4
    got = gradops.fractional_avg_pool(x, rows, cols, overlapping)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.view(np.uint16), fractional_avg_pool(x, rows, cols, overlapping).view(np.uint16))


# --------------------------------------------------------------------------- adjoint identity


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("rows,cols", [([0, 2, 3, 5, 7], [0, 1, 3, 4, 6, 8]), ([1, 2, 5, 9], [0, 4, 7, 12]),
                                       ([5, 1, 3, 3, 9, 2], [7, 2, 1, 4, 8])],
                         ids=["exact", "clamped_late", "unordered_with_empty_cells"])
def test_adjoint_identity(rng, rows, cols, overlapping):
    """<pool(x), dy> == <x, pool_grad(x.shape, dy)> in float64; the forward op matches the loop."""
    x = rng.standard_normal((2, 7, 8, 3))
    y = gradops.fractional_avg_pool(x, rows, cols, overlapping)
    out_rows, out_cols = len(rows) - 1, len(cols) - 1
    assert_close(y, fractional_avg_pool(x, rows, cols, overlapping), np.float64)
    dy = rng.standard_normal((2, out_rows, out_cols, 3))
    dx = gradops.fractional_avg_pool_grad(x.shape, dy, rows, cols, overlapping)
    lhs, rhs = float(np.sum(y * dy)), float(np.sum(x * dx))
    assert abs(lhs - rhs) <= 1e-12 * max(1.0, float(np.sum(np.abs(y * dy))))


# --------------------------------------------------------------------------- hypothesis


@st.composite
def pooling_sequences(draw, size, overlapping):
    """A valid sequence for ``size`` inputs: sorted cut points (repeats only when overlapping),
    optionally starting late, ending past the input, and with unused trailing entries."""
    start = draw(st.integers(0, size - 1))
    room = size - 1 - start  # cut points live in [start + 1, size - 1] (or [start, size - 1])
    if overlapping:
        cuts = sorted(draw(st.lists(st.integers(start, size - 1), max_size=size)))
    elif room:
        cuts = sorted(draw(st.sets(st.integers(start + 1, size - 1), max_size=room)))
    else:
        cuts = []
    last = cuts[-1] if cuts else start
    end = draw(st.integers(last if overlapping else last + 1, size + 3))
    extra = draw(st.lists(st.integers(-3, 20), max_size=2))
    return [start, *cuts, end], extra


@st.composite
def unordered_pooling_sequences(draw, size, overlapping):
    """Any sequence TF accepts for ``size`` inputs: entries anywhere in [0, size + 3], in any
    order (cells may be empty or start past the input), except that a disjoint cell may not
    end before index 0 (entries after the first are >= 1 when not overlapping)."""
    first = draw(st.integers(0, size + 3))
    rest = draw(st.lists(st.integers(0 if overlapping else 1, size + 3), min_size=1, max_size=size + 2))
    extra = draw(st.lists(st.integers(-3, 20), max_size=2))
    return [first, *rest], extra


@st.composite
def fractional_cases(draw):
    overlapping = draw(st.booleans())
    n, h, w, d = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 8)), draw(st.integers(1, 3))
    sequences = draw(st.sampled_from([pooling_sequences, unordered_pooling_sequences]))
    rows, row_extra = draw(sequences(h, overlapping))
    cols, col_extra = draw(sequences(w, overlapping))
    return dict(orig_shape=(n, h, w, d), rows=rows + row_extra, cols=cols + col_extra,
                out_rows=len(rows) - 1, out_cols=len(cols) - 1, overlapping=overlapping,
                dtype=draw(st.sampled_from(ALL_DTYPES)))


@settings(max_examples=60, deadline=None)
@given(case=fractional_cases(), seed=st.integers(0, 2**32 - 1))
def test_property_matches_reference(case, seed):
    """Random valid sequences, shapes, modes and dtypes all match TF's loop."""
    check(np.random.default_rng(seed), **case)


# --------------------------------------------------------------------------- edge cases


EMPTY_CASES = {
    # name: (orig NHWC shape, out_backprop shape, row sequence)
    "batch0": ((0, 4, 4, 2), (0, 2, 2, 2), [0, 2, 4]),
    "depth0": ((2, 4, 4, 0), (2, 2, 2, 0), [0, 2, 4]),
    "out_rows0": ((1, 4, 4, 2), (1, 0, 2, 2), [0]),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("case", list(EMPTY_CASES), ids=list(EMPTY_CASES))
def test_empty_tensors_rejected(case, dtype):
    """Empty batch, depth or output raise InvalidArgumentError naming out_backprop, as TF's kernel does."""
    orig_shape, dy_shape, rows = EMPTY_CASES[case]
    with pytest.raises(gradops.InvalidArgumentError, match="out_backprop"):
        gradops.fractional_avg_pool_grad(list(orig_shape), np.ones(dy_shape, dtype), rows, [0, 2, 4], False)


@pytest.mark.parametrize("case", list(EMPTY_CASES), ids=list(EMPTY_CASES))
def test_tensorflow_rejects_empty_tensors(tf, case):
    """TF 2.21's FractionalAvgPoolGrad refuses the same empty tensors (the behaviour gradops mirrors)."""
    orig_shape, dy_shape, rows = EMPTY_CASES[case]
    with pytest.raises(tf.errors.InvalidArgumentError, match="out_backprop"):
        tf.raw_ops.FractionalAvgPoolGrad(
            orig_input_tensor_shape=np.array(orig_shape, np.int64), out_backprop=np.ones(dy_shape),
            row_pooling_sequence=np.array(rows, np.int64), col_pooling_sequence=np.array([0, 2, 4], np.int64))


VALID_CALL = dict(orig_input_tensor_shape=[1, 5, 6, 2], out_backprop=np.ones((1, 2, 2, 2)),
                  row_pooling_sequence=[0, 2, 5], col_pooling_sequence=[0, 3, 6])

INVALID_CASES = {
    # name: (overrides, overlapping, word the message must contain)
    "negative_row": (dict(row_pooling_sequence=[-1, 2, 5]), False, "row_pooling_sequence"),
    "negative_col": (dict(col_pooling_sequence=[-2, 3, 6]), True, "col_pooling_sequence"),
    "short_row": (dict(row_pooling_sequence=[0, 2]), False, "row_pooling_sequence"),
    "short_col": (dict(col_pooling_sequence=[0, 6]), True, "col_pooling_sequence"),
    # A disjoint cell [s, next - 1] with next == 0 ends before index 0: TF refuses it as a
    # negative value ("Row sequence tensor values must not be negative, got 0 0 5").
    "row_cell_ends_before_0": (dict(row_pooling_sequence=[0, 0, 5]), False, "row_pooling_sequence"),
    "col_cell_ends_before_0": (dict(col_pooling_sequence=[4, 0, 6]), False, "col_pooling_sequence"),
    "batch_mismatch": (dict(out_backprop=np.ones((2, 2, 2, 2))), False, "orig_input_tensor_shape"),
    "depth_mismatch": (dict(out_backprop=np.ones((1, 2, 2, 3))), False, "orig_input_tensor_shape"),
    "orig_shape_rank": (dict(orig_input_tensor_shape=[1, 5, 6]), False, "orig_input_tensor_shape"),
    "orig_shape_negative": (dict(orig_input_tensor_shape=[1, -5, 6, 2]), False, "orig_input_tensor_shape"),
}


@pytest.mark.parametrize("case", list(INVALID_CASES), ids=list(INVALID_CASES))
def test_invalid_arguments(case):
    """Sequence and shape rule violations raise InvalidArgumentError naming the argument."""
    overrides, overlapping, word = INVALID_CASES[case]
    args = {**VALID_CALL, **overrides, "overlapping": overlapping}
    with pytest.raises(gradops.InvalidArgumentError, match=word):
        gradops.fractional_avg_pool_grad(**args)


@pytest.mark.parametrize("dy_slice", [np.s_[:1], np.s_[..., :2], np.s_[:1, :, :, 1:], np.s_[:, :2, :1]],
                         ids=["fewer_images", "fewer_channels", "both", "fewer_cells"])
def test_smaller_out_backprop_is_computed_as_tf_does(tf, rng, dy_slice):
    """TF loops over out_backprop's batch and depth: fewer images or channels than the input
    leave the rest of the gradient zero (gradops pads with zeros); fewer cells than the
    sequences define use the first ones.  Larger ones are refused (test_invalid_arguments)."""
    dy = rng.standard_normal((2, 3, 2, 3))[dy_slice]
    rows, cols = [0, 2, 4, 6], [0, 2, 5]
    got = gradops.fractional_avg_pool_grad([2, 6, 5, 3], dy, rows, cols)
    np.testing.assert_array_equal(got, fractional_avg_pool_grad((2, 6, 5, 3), dy, rows, cols, False))
    expected = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array([2, 6, 5, 3], np.int64), out_backprop=dy,
        row_pooling_sequence=np.array(rows, np.int64), col_pooling_sequence=np.array(cols, np.int64))
    np.testing.assert_array_equal(got, expected.numpy())


def test_int64_min_entry_wraps_as_tf_computes_it(tf):
    """A disjoint cell's end is the next entry - 1 in int64: after INT64_MIN it wraps to
    INT64_MAX, clamped to the last row, so TF's cell runs from its start to the input's end
    (TF 2.21 computes it; gradops refused the negative entry).  The max pooling gradient reads
    cells with the same function."""
    dy = np.ones((1, 1, 1, 1), np.float64)
    rows, cols = np.array([1, -2**63], np.int64), np.array([0, 3], np.int64)
    got = gradops.fractional_avg_pool_grad([1, 3, 3, 1], dy, rows, cols)
    expected = tf.raw_ops.FractionalAvgPoolGrad(orig_input_tensor_shape=np.array([1, 3, 3, 1], np.int64),
                                                out_backprop=dy, row_pooling_sequence=rows, col_pooling_sequence=cols)
    np.testing.assert_array_equal(got, expected.numpy())
    assert got[0, 0].tolist() == [[0.0]] * 3 and got[0, 1:].reshape(-1).tolist() == [1 / 6] * 6


# (rows, cols, overlapping): every cell empty (starting past the input, or ending before it starts)
ALL_CELLS_EMPTY = {
    "rows_past_the_input": ([6, 7, 9], [0, 2, 5], False),
    "cols_end_before_start": ([0, 2, 6], [4, 2, 1], True),
    "equal_entries_disjoint": ([0, 3, 6], [2, 2], False),
}


@pytest.mark.parametrize("dy_shape", [(3, 2, 2, 3), (2, 2, 2, 5), (4, 2, 2, 4)],
                         ids=["more_images", "more_channels", "both"])
@pytest.mark.parametrize("case", list(ALL_CELLS_EMPTY), ids=list(ALL_CELLS_EMPTY))
def test_larger_out_backprop_with_every_cell_empty_is_tf_zeros(tf, rng, case, dy_shape):
    """More images or channels than the input write out of bounds in TF unless no cell holds an
    input element: then TF writes nothing and returns zeros (TF 2.21), and so does gradops;
    with one non-empty cell it is refused (TF corrupted its heap there)."""
    rows, cols, overlapping = ALL_CELLS_EMPTY[case]
    dy = rng.standard_normal(dy_shape[:1] + (len(rows) - 1, len(cols) - 1) + dy_shape[3:])
    got = gradops.fractional_avg_pool_grad([2, 6, 5, 3], dy, rows, cols, overlapping)
    expected = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array([2, 6, 5, 3], np.int64), out_backprop=dy,
        row_pooling_sequence=np.array(rows, np.int64), col_pooling_sequence=np.array(cols, np.int64),
        overlapping=overlapping)
    assert got.shape == (2, 6, 5, 3) and got.dtype == dy.dtype and not got.any()
    np.testing.assert_array_equal(got, expected.numpy())
    with pytest.raises(gradops.InvalidArgumentError, match="batch and depth must not exceed .* where a cell"):
        gradops.fractional_avg_pool_grad([2, 6, 5, 3], dy, [0, 2, 6], [0, 2, 5], overlapping)


# Sequences gradops refused before TF 2.21's behaviour was reproduced: TF computes them.
FORMERLY_INVALID = {
    "decreasing_row_overlapping": (dict(row_pooling_sequence=[0, 3, 2]), True),
    "decreasing_col": (dict(col_pooling_sequence=[0, 4, 2]), False),
    "empty_cell_disjoint": (dict(col_pooling_sequence=[0, 3, 3]), False),
    "cell_starts_outside": (dict(row_pooling_sequence=[0, 5, 7]), True),
    "col_cell_starts_outside": (dict(col_pooling_sequence=[0, 6, 9]), False),
    "cell_ends_at_0_overlapping": (dict(row_pooling_sequence=[0, 0, 5]), True),
}


@pytest.mark.parametrize("case", list(FORMERLY_INVALID), ids=list(FORMERLY_INVALID))
def test_unordered_sequences_match_tf_loop(case):
    """Decreasing sequences, empty cells and cells past the input give TF's loop result."""
    overrides, overlapping = FORMERLY_INVALID[case]
    args = {**VALID_CALL, **overrides, "overlapping": overlapping}
    dy = np.arange(1.0, 9.0).reshape(1, 2, 2, 2)
    args["out_backprop"] = dy
    got = gradops.fractional_avg_pool_grad(**args)
    expected = fractional_avg_pool_grad(tuple(args["orig_input_tensor_shape"]), dy, args["row_pooling_sequence"],
                                        args["col_pooling_sequence"], overlapping)
    np.testing.assert_array_equal(got, expected)


def test_cell_tables_that_cannot_fit_are_refused(monkeypatch):
    """The per-index cell lists grow with the cells' overlap, not with the tensors: 512 cells
    each covering all 256 rows hold 2**17 (row, cell) pairs.  With 1 MiB of host memory that
    is refused before anything is built, naming the sequences; with the real memory it is
    computed (every row is in the 512 even cells: 512 * 1/256 = 2)."""
    from gradops import _arrays

    n, in_rows = 1024, 256
    rows = [0, in_rows] * (n // 2) + [0]  # overlapping: even cells 0..255, odd cells 256..0 (empty)
    args = (np.array([1, in_rows, 1, 1]), np.ones((1, n, 1, 1)), rows, [0, 1], True)
    with monkeypatch.context() as patch:
        patch.setattr(_arrays, "host_memory_bytes", lambda: 2**20)
        with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence"):
            gradops.fractional_avg_pool_grad(*args)
    np.testing.assert_array_equal(gradops.fractional_avg_pool_grad(*args), np.full((1, in_rows, 1, 1), 2.0))


def test_many_cells_beside_a_long_one_stay_within_the_tables_memory():
    """One cell of all 2**13 rows beside 4095 one-column cells (repeated 0s): only 12,287
    (index, cell) pairs, but the gather of every row's shares for every column cell held
    in_rows x out_cols float64 (256 MiB for a 32 KiB gradient, measured with tracemalloc)
    until it was done per block past the gradient's size."""
    import tracemalloc

    in_rows, out_cols = 2**13, 2**12 - 1
    dy = np.arange(out_cols, dtype=np.float32).reshape(1, 1, out_cols, 1)
    tracemalloc.start()
    try:
        grad = gradops.fractional_avg_pool_grad([1, in_rows, 1, 1], dy, [0, in_rows], [0] * (out_cols + 1), True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # Every element gets k / 2**13 from cell k: exact binary fractions, so every order sums exactly.
    np.testing.assert_array_equal(grad, np.full((1, in_rows, 1, 1), out_cols * (out_cols - 1) / 2 / in_rows))


@pytest.mark.parametrize("dtype", [np.int32, np.float64], ids=["int32", "float64"])
@pytest.mark.parametrize("rows, cols", [
    ([0, 4, 1, 5, 2], [0, 2, 0, 1, 0, 2, 1, 2, 0]),  # more column cells than columns: blocks gathered alone
    ([0, 2, 0, 2, 0, 2], [0, 1, 0, 2]),  # rows stacked, few column cells: the step's rows gathered once
])
def test_stacked_cells_sum_in_tf_order(rng, dtype, rows, cols):
    """Both ways _pool_grad_steps gathers shares keep TF's per-element order (integers
    truncate the float64 sum once, so any other order shows as a unit's difference)."""
    shape = (2, 5, 3, 2)
    dy = random_backprop(rng, (2, len(rows) - 1, len(cols) - 1, 2), dtype)
    got = gradops.fractional_avg_pool_grad(list(shape), dy, rows, cols, True)
    assert_grad_matches(got, fractional_avg_pool_grad(shape, dy, rows, cols, True), dtype)


def test_valid_call_of_invalid_cases_passes():
    """The baseline call the invalid cases perturb is itself accepted (so each case tests one rule)."""
    for overlapping in (False, True):
        got = gradops.fractional_avg_pool_grad(**VALID_CALL, overlapping=overlapping)
        assert got.shape == (1, 5, 6, 2)


def test_keyword_arguments_with_tf_names(rng):
    """TF's argument names work as keywords in any order; result is an ndarray in the dtype."""
    dy = rng.standard_normal((1, 2, 3, 1)).astype(np.float32)
    got = gradops.fractional_avg_pool_grad(overlapping=True, col_pooling_sequence=np.array([0, 2, 3, 5]),
                                           row_pooling_sequence=np.array([0, 2, 4]), out_backprop=dy,
                                           orig_input_tensor_shape=np.array([1, 4, 5, 1], np.int64))
    assert type(got) is np.ndarray
    assert_grad_matches(got, fractional_avg_pool_grad((1, 4, 5, 1), dy, [0, 2, 4], [0, 2, 3, 5], True), np.float32)


# --------------------------------------------------------------------------- TensorFlow parity


@pytest.mark.parametrize("dtype", TF_DTYPES, ids=[np.dtype(d).name for d in TF_DTYPES])
@pytest.mark.parametrize("pseudo_random", [False, True], ids=["shuffled", "pseudo_random"])
@pytest.mark.parametrize("ratio", [1.44, 1.5, 2.0])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_matches_tensorflow(tf, rng, overlapping, ratio, pseudo_random, dtype):
    """FractionalAvgPoolGrad on TF's own sequences agrees with gradops (forward too, for floats)."""
    x = random_backprop(rng, (2, 9, 8, 2), dtype)
    out, rows, cols = tf.raw_ops.FractionalAvgPool(
        value=x, pooling_ratio=[1.0, ratio, ratio, 1.0], pseudo_random=pseudo_random, overlapping=overlapping,
        deterministic=True, seed=1, seed2=2)
    rows, cols = rows.numpy(), cols.numpy()
    dy = random_backprop(rng, out.shape, dtype)
    expected = tf.raw_ops.FractionalAvgPoolGrad(
        orig_input_tensor_shape=np.array(x.shape, np.int64), out_backprop=dy, row_pooling_sequence=rows,
        col_pooling_sequence=cols, overlapping=overlapping).numpy()
    got = gradops.fractional_avg_pool_grad(np.array(x.shape), dy, rows, cols, overlapping)
    if is_int(dtype):
        ref = fractional_avg_pool_grad(x.shape, dy, list(rows), list(cols), overlapping)
        np.testing.assert_array_equal(expected, np.trunc(ref))  # the loop reference is TF bit for bit
        np.testing.assert_array_equal(got, expected)
    else:
        assert_close(got, expected, dtype)
    np.testing.assert_array_equal(gradops.fractional_avg_pool(x, rows, cols, overlapping), out.numpy())


def _forward_parity_input(rng, dtype, shape):
    """Values TF's forward sums are sensitive to: for floats, 6 decades of magnitude (sums in
    other orders or wider types round differently), -0.0 and +0.0 (TF's sums from zero give no
    -0.0), +-Inf and NaN; for integers, the full range (TF's sums wrap)."""
    if is_int(dtype):
        high = np.iinfo(dtype).max
        return rng.integers(-high, high, shape, dtype=dtype, endpoint=True)
    x = (rng.standard_normal(shape) * 10.0 ** rng.uniform(-3, 3, shape)).astype(dtype)
    pick = rng.random(shape)
    x[pick < 0.15] = -0.0
    x[(pick >= 0.15) & (pick < 0.3)] = 0.0
    x[(pick >= 0.3) & (pick < 0.31)] = np.inf
    x[(pick >= 0.31) & (pick < 0.32)] = -np.inf
    x[(pick >= 0.32) & (pick < 0.325)] = np.nan
    return x


def _same_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual.view(f"u{actual.dtype.itemsize}") if actual.dtype.kind == "f" else actual,
                                  expected.view(f"u{expected.dtype.itemsize}") if expected.dtype.kind == "f" else expected)


@pytest.mark.parametrize("dtype", TF_DTYPES, ids=[np.dtype(d).name for d in TF_DTYPES])
@pytest.mark.parametrize("ratio", [1.44, 2.7, 5.3])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_forward_matches_tensorflow_bit_for_bit(tf, overlapping, ratio, dtype):
    """The forward op is TF's FractionalAvgPool bit for bit (NaN payloads aside), on TF's own
    sequences: signed zeros, Inf and NaN, sums over 6 decades in float32 and float64, wrapping
    integer sums; cells of up to 7 x 7.  (The loop reference agrees with TF here too.)"""
    rng = np.random.default_rng(int(ratio * 100) + overlapping)
    x = _forward_parity_input(rng, dtype, (2, 19, 17, 5))
    out, rows, cols = tf.raw_ops.FractionalAvgPool(
        value=x, pooling_ratio=[1.0, ratio, ratio, 1.0], pseudo_random=True, overlapping=overlapping,
        deterministic=True, seed=3, seed2=4)
    rows, cols = rows.numpy(), cols.numpy()
    results = [gradops.fractional_avg_pool(x, rows, cols, overlapping),
               fractional_avg_pool(x, list(rows), list(cols), overlapping), out.numpy()]
    if not is_int(dtype):
        nan = np.isnan(results[-1])
        assert nan.any() and (np.signbit(results[-1]) & (results[-1] == 0)).sum() == 0  # TF gives no -0.0
        for result in results:
            assert (np.isnan(result) == nan).all()
            result[nan] = np.nan  # one NaN pattern: TF's payloads are not compared
    for result in results[:2]:
        _same_bits(result, results[-1])


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_forward_count_of_a_huge_cell_matches_tensorflow(tf, dtype):
    """TF counts a cell's elements in the element type, one increment an element, so a float32
    count stops at 2**24: one cell of 2**24 + 2**17 elements, a 4096 among zeros, averages to
    4096 / 2**24 in float32 (an exact count would give 4096 / 16908288) and to the exact
    quotient in float64.  TF's own sequences ([0, rows] at ratio rows)."""
    rows = 2**24 + 2**17
    x = np.zeros((1, rows, 1, 1), dtype)
    x[0, 12345, 0, 0] = 4096.0
    out, row_seq, col_seq = tf.raw_ops.FractionalAvgPool(
        value=x, pooling_ratio=[1.0, float(rows), 1.0, 1.0], pseudo_random=False, overlapping=False,
        deterministic=True, seed=1, seed2=1)
    assert list(row_seq.numpy()) == [0, rows] and list(col_seq.numpy()) == [0, 1]
    _same_bits(gradops.fractional_avg_pool(x, row_seq.numpy(), col_seq.numpy()), out.numpy())
    expected = 2.0**-12 if dtype == np.float32 else 4096.0 / rows
    assert float(out.numpy()[0, 0, 0, 0]) == expected


def test_element_count_is_a_counter_of_the_sums_type():
    """element_count(n, T) is what n increments of a T counter from 0 give (TF's count)."""
    from gradops.backends.numpy_backend import element_count

    counter = np.float32(2**24 - 3)
    for n in range(2**24 - 3, 2**24 + 5):
        assert element_count(n, np.dtype(np.float32)) == counter, n
        counter = np.float32(counter + np.float32(1))
    assert element_count(2**53 + 7, np.dtype(np.float64)) == 2.0**53
    assert element_count(2**40 + 1, np.dtype(np.float64)) == 2**40 + 1
    assert element_count(2**31 - 1, np.dtype(np.int32)) == 2**31 - 1


# --------------------------------------------------------------------------- CUDA kernel
#
# The kernel source runs twice: on the CPU (compiled by g++ through tests/cuda_host.py, so its
# index math and summation order are checked on every machine) and, with @pytest.mark.gpu,
# through CuPy on a GPU.  Both sum in double in TF's order and round once, so results are
# compared exactly with TF's loop (reference.py) cast to the dtype.

import contextlib  # noqa: E402
import importlib  # noqa: E402
import shutil  # noqa: E402


import cuda_host  # noqa: E402
from gradops._dtypes import FRACTIONAL_POOL_DTYPES  # noqa: E402
from gradops._geometry import fractional_pool_geometry, partition_bounds  # noqa: E402

cuda_launcher = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")
OP = "fractional_avg_pool_grad"
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def bfloat16_rounded_once(x):
    """float64 -> bfloat16 with a single round to nearest even, as CUDA's __double2bfloat16.

    ml_dtypes before 0.7 converted through float32 and could round twice (1 + 2**-8 + 2**-30
    became 1, not 1 + 2**-7).  Rounding to float32 "to odd" (truncate, then set the last bit when inexact)
    keeps the information a second rounding to the 8-bit significand needs.
    """
    x = np.asarray(x, np.float64)
    f = x.astype(np.float32)
    bits = f.view(np.uint32).copy()
    inexact = f.astype(np.float64) != x
    bits[inexact & (np.abs(f.astype(np.float64)) > np.abs(x))] -= 1  # toward zero (sign-magnitude)
    bits[inexact] |= 1
    return bits.view(np.float32).astype(BFLOAT16)


def _bfloat16_nearest_even(x):
    """float64 -> bfloat16 by search: the nearest of all finite bfloat16 values, ties to the even
    bit pattern (an independent reference for the helper above; finite values in range only)."""
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = bits[(bits & 0x7F80) != 0x7F80].view(BFLOAT16)  # exponent all ones: Inf and NaN
    values = finite.astype(np.float64)
    order = np.argsort(values, kind="stable")
    finite, values = finite[order], values[order]
    hi = np.clip(np.searchsorted(values, x), 1, len(values) - 1)
    lo = hi - 1
    d_lo, d_hi = x - values[lo], values[hi] - x
    even_hi = (finite[hi].view(np.uint16) & 1) == 0
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & even_hi)
    return np.where(pick_hi, finite[hi], finite[lo])


def test_bfloat16_rounded_once():
    """The helper rounds float64 once to nearest even (ml_dtypes before 0.7 converted through
    float32 and rounded 1 + 2**-8 + 2**-30 twice, to 1), checked against a search of every
    bfloat16 value on ties, near-ties and random doubles."""
    assert float(bfloat16_rounded_once(1 + 2**-8 + 2**-30)) == 1 + 2**-7
    assert float(bfloat16_rounded_once(-(1 + 2**-8 + 2**-30))) == -(1 + 2**-7)
    assert float(bfloat16_rounded_once(1 + 2**-8)) == 1.0  # a tie: to the even significand
    assert float(bfloat16_rounded_once(1 + 3 * 2**-8)) == 1 + 2**-6
    rng = np.random.default_rng(0)
    ulp = 2.0 ** rng.integers(-30, 10, 4000) * 2**-8  # half a bfloat16 ulp at each scale
    ties = np.concatenate([ulp * 256 + ulp, ulp * 256 + ulp * 3])  # exact ties, both parities
    near = np.concatenate([ties + ties * 2**-40, ties - ties * 2**-40])
    values = np.concatenate([ties, near, rng.standard_normal(10000) * 2.0 ** rng.integers(-40, 40, 10000)])
    values = np.concatenate([values, -values])
    np.testing.assert_array_equal(bfloat16_rounded_once(values).view(np.uint16),
                                  _bfloat16_nearest_even(values).view(np.uint16))


def exact_grad(orig_shape, dy, rows, cols, overlapping):
    """TF's loop in float64 (its order), cast once: what the kernel must return bit for bit."""
    ref = fractional_avg_pool_grad(orig_shape, dy, list(rows), list(cols), overlapping)
    dtype = dy.dtype
    if is_int(dtype):
        return np.trunc(ref).astype(dtype)
    if dtype == BFLOAT16:
        return bfloat16_rounded_once(ref)
    return ref.astype(dtype)


def pool_case(rng, orig_shape, rows, cols, overlapping, dtype, out_rows=None, out_cols=None):
    """(kwargs for gradops, the exact expected gradient) for random out_backprop."""
    out_rows = len(rows) - 1 if out_rows is None else out_rows
    out_cols = len(cols) - 1 if out_cols is None else out_cols
    dy = random_backprop(rng, (orig_shape[0], out_rows, out_cols, orig_shape[3]), np.dtype(dtype))
    kwargs = dict(orig_input_tensor_shape=np.array(orig_shape), out_backprop=dy,
                  row_pooling_sequence=np.array(rows), col_pooling_sequence=np.array(cols),
                  overlapping=overlapping)
    return kwargs, exact_grad(orig_shape, dy, rows, cols, overlapping)


@pytest.fixture(scope="module")
def host_kernels():
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel source for the host: {reason}")
    return cuda_host.HostKernels(cuda_launcher.SOURCE, cuda_launcher.instantiations()[cuda_launcher.SOURCE])


def host_geometry(kwargs):
    dy = kwargs["out_backprop"]
    return fractional_pool_geometry(OP, [int(v) for v in kwargs["orig_input_tensor_shape"]], dy.shape,
                                    [int(v) for v in kwargs["row_pooling_sequence"]],
                                    [int(v) for v in kwargs["col_pooling_sequence"]], kwargs["overlapping"])


def run_on_host(kernels, kwargs, order="shuffled", seed=0, path="gather", **force):
    """The launcher's plan (instantiation, grid, block, tables, scalars) for kernel ``path`` run
    on the CPU, blocks and threads in ``order``; unwritten elements keep a sentinel.  ``force``:
    :func:`plan`'s overrides (index width, vector width, rows per thread, staged cells), or
    :func:`cells_plan`'s for the cells kernel (index and vector width, chunk rows, block vectors)."""
    dy = np.ascontiguousarray(kwargs["out_backprop"])
    g = host_geometry(kwargs)
    grad = np.full(g.input_shape, 12345 if is_int(dy.dtype) else np.nan, dy.dtype)
    aligned = dy.ctypes.data % 16 == 0 and grad.ctypes.data % 16 == 0
    if path == "cells":
        p = cuda_launcher.cells_plan(g, dy.dtype, aligned=aligned, **force)
        expression = cuda_launcher._cells_expression(dy.dtype, p.index, p.vector, g.overlapping)
        tables, scalars = cuda_launcher.cells_tables(g, p), cuda_launcher.cells_scalars(g, p)
    else:
        p = cuda_launcher.plan(g, dy.dtype, aligned=aligned, **force)
        expression = cuda_launcher._expression(dy.dtype, p.index, p.vector)
        tables, scalars = cuda_launcher.kernel_tables(g, p), cuda_launcher.kernel_scalars(g, p)
    kernels.launch(expression, p.grid, p.block, [dy, grad, *tables], scalars, order=order, seed=seed)
    return grad


def assert_identical(got, expected):
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{expected.itemsize}"))


def test_instantiations_cover_every_launch():
    """Per supported dtype: 32- and 64-bit indexing, 16-byte channel vectors and one channel per
    thread, for the gather kernel and for the cells kernel in both modes."""
    from gradops._dtypes import FRACTIONAL_POOL_DTYPES

    listed = cuda_launcher.instantiations()[cuda_launcher.SOURCE]
    assert len(listed) == len(set(listed)) == 12 * len(FRACTIONAL_POOL_DTYPES)
    for dtype in FRACTIONAL_POOL_DTYPES:
        for index in ("int", "long long"):
            for vector in (16 // np.dtype(dtype).itemsize, 1):
                assert cuda_launcher._expression(dtype, index, vector) in listed
                for overlapping in (False, True):
                    assert cuda_launcher._cells_expression(dtype, index, vector, overlapping) in listed


def test_cell_tables():
    """Per input index, the cells containing it in cell order (CSR); each cell's size.

    Cells 0..2, 2..2, 2..4, 4..5 (non-decreasing): index 2 is in cells 0, 1, 2; 6 in none.
    """
    offsets, cells, sizes = cuda_launcher.cell_tables([0, 2, 2, 4], [2, 2, 4, 5], 7)
    assert offsets.tolist() == [0, 1, 2, 5, 6, 8, 9, 9]
    assert cells.tolist() == [0, 0, 0, 1, 2, 2, 2, 3, 3]
    assert sizes.tolist() == [3, 1, 3, 2]
    assert offsets.dtype == cells.dtype == sizes.dtype == np.int64


def test_cell_tables_unordered():
    """Decreasing starts, an empty cell (end < start) and one starting past the input: the
    cells of each index are listed in increasing cell order, empty cells nowhere.

    Cells (start, end): 3..4, 0..1, 2..1 (empty), 1..3, 6..4 (past a 5-row input: empty).
    """
    offsets, cells, sizes = cuda_launcher.cell_tables([3, 0, 2, 1, 6], [4, 1, 1, 3, 4], 5)
    per_index = [cells[offsets[i]:offsets[i + 1]].tolist() for i in range(5)]
    assert per_index == [[1], [1, 3], [3], [0, 3], [0]]
    assert sizes.tolist() == [2, 2, 0, 3, 0]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_kernel_source_on_host_grid(host_kernels, rng, overlapping, dtype):
    """Generated and hand-written sequences: the kernel source gives TF's loop result bit for bit."""
    for ratio in (1.44, 1.5, 2.0):
        for pseudo_random in (False, True):
            rows = gradops.fractional_pooling_sequence(7, ratio, pseudo_random, seed=3)
            cols = gradops.fractional_pooling_sequence(9, ratio, pseudo_random, seed=4)
            kwargs, expected = pool_case(rng, (2, 7, 9, 3), rows, cols, overlapping, dtype)
            assert_identical(run_on_host(host_kernels, kwargs), expected)
    for shape, rows, cols, out_rows, out_cols in HAND_CASES.values():
        kwargs, expected = pool_case(rng, shape, rows, cols, overlapping, dtype, out_rows, out_cols)
        assert_identical(run_on_host(host_kernels, kwargs), expected)


def test_kernel_source_on_host_sum_order(host_kernels):
    """The int32 case where only TF's summation order gives 2 (see test_integer_truncation_sum_order_matches_tf)."""
    dy = np.array([[4, 2], [4, 0]], np.int32).reshape(1, 2, 2, 1)
    kwargs = dict(orig_input_tensor_shape=np.array([1, 4, 4, 1]), out_backprop=dy,
                  row_pooling_sequence=np.array([0, 1, 3]), col_pooling_sequence=np.array([0, 1, 4]),
                  overlapping=True)
    got = run_on_host(host_kernels, kwargs)
    assert got[0, 1, 1, 0] == 2
    assert_identical(got, exact_grad((1, 4, 4, 1), dy, [0, 1, 3], [0, 1, 4], True))


def test_kernel_source_on_host_repeated_entries(host_kernels, rng):
    """Overlapping sequences with repeats put one input row in three cells (and a 3x3 block of cells)."""
    for dtype in ALL_DTYPES:
        kwargs, expected = pool_case(rng, (2, 5, 4, 2), [0, 2, 2, 4], [0, 1, 1, 3], True, dtype)
        assert_identical(run_on_host(host_kernels, kwargs), expected)


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_kernel_source_on_host_unordered(host_kernels, rng, overlapping):
    """Decreasing sequences whose cells cover rows out of cell order (row 3 is in cells 0 and
    2 but not 1), empty cells and cells past the input: TF's loop bit for bit, every dtype."""
    for dtype in ALL_DTYPES:
        kwargs, expected = pool_case(rng, (2, 6, 7, 2), [0, 4, 2, 6, 1, 3], [6, 1, 3, 2, 8], overlapping, dtype)
        assert_identical(run_on_host(host_kernels, kwargs), expected)


#: Paths the launcher can be made to take (plan()'s overrides): 64-bit indexing, one channel per
#: thread, one row per thread, every tile on the direct path, and few staged cells (some tiles
#: staged, others direct).
FORCED_PATHS = {
    "planned": {},
    "index64": dict(index="long long"),
    "scalar": dict(vector=1),
    "one_row_per_thread": dict(rows_per_thread=1),
    "three_rows_per_thread": dict(rows_per_thread=3),
    "direct": dict(share_cells=0),
    "few_staged_cells": dict(share_cells=6),
}


@settings(max_examples=80, deadline=None)
@given(case=fractional_cases(), depth=st.sampled_from([None, 4, 8, 12, 16, 24, 40]), path=st.sampled_from(list(FORCED_PATHS)),
       seed=st.integers(0, 2**32 - 1))
def test_kernel_source_on_host_property(host_kernels, case, depth, path, seed):
    """Random valid sequences, shapes, depths (vector widths and partial channel blocks), modes,
    dtypes and forced paths: TF's loop result bit for bit."""
    case = dict(case)
    shape = case.pop("orig_shape")
    if depth is not None:
        shape = (*shape[:3], depth)
    kwargs, expected = pool_case(np.random.default_rng(seed), shape, case.pop("rows"), case.pop("cols"),
                                 case.pop("overlapping"), case.pop("dtype"), **case)
    assert_identical(run_on_host(host_kernels, kwargs, seed=seed, **FORCED_PATHS[path]), expected)


# Shapes that do not fill the tiles: rows, columns and batches that are not multiples of the tile,
# depths that are not multiples of the vector width or of the block's channels, tiny images (a
# tile of several batch items).
TILE_EDGE_SHAPES = [(2, 37, 29, 24), (1, 19, 70, 40), (5, 3, 2, 8), (3, 1, 1, 16), (2, 50, 9, 12), (7, 2, 5, 3)]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("path", list(FORCED_PATHS))
def test_kernel_source_on_host_tile_edges(host_kernels, rng, path, dtype):
    """Partial tiles, partial channel blocks and batch tiles, on every path, with generated,
    overlapping, unordered and empty-cell sequences: TF's loop bit for bit."""
    for shape in TILE_EDGE_SHAPES:
        for overlapping in (False, True):
            for rows, cols in ((gradops.fractional_pooling_sequence(shape[1], min(1.44, shape[1]), True, seed=shape[1]),
                                gradops.fractional_pooling_sequence(shape[2], min(1.5, shape[2]), False, seed=shape[2])),
                               ([shape[1], 1, shape[1] // 2 + 1, 1, shape[1] + 2], [1, shape[2], 1, 2])):
                kwargs, expected = pool_case(rng, shape, rows, cols, overlapping, dtype)
                assert_identical(run_on_host(host_kernels, kwargs, **FORCED_PATHS[path]), expected)


@pytest.mark.parametrize("path", list(FORCED_PATHS))
def test_kernel_source_on_host_orders_agree(host_kernels, rng, path):
    """Forward, reverse and two shuffled block and thread orders give the same bits (no race
    between the staging and summing threads, nor between blocks)."""
    rows = gradops.fractional_pooling_sequence(45, 1.44, True, seed=7)
    cols = gradops.fractional_pooling_sequence(23, 1.44, False, seed=8)
    for dtype in (np.float16, np.float32, np.int32, np.float64):
        kwargs, expected = pool_case(rng, (3, 45, 23, 16), rows, cols, True, dtype)
        runs = [run_on_host(host_kernels, kwargs, order, seed, **FORCED_PATHS[path])
                for order, seed in (("forward", 0), ("reverse", 0), ("shuffled", 1), ("shuffled", 2))]
        for got in runs:
            assert_identical(got, expected)


@pytest.mark.parametrize("blocks", [1, 2], ids=["one_block", "two_blocks"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("path", ["planned", "direct", "scalar", "cells", "cells_one_vector_blocks"])
def test_kernel_source_on_host_capped_grids_do_every_tile(host_kernels, rng, path, dtype, blocks):
    """Grids capped at one or two blocks a dimension (cuda_host.capped_grids): each block strides
    over its tiles (or column blocks, chunks and channel blocks of the cells kernel), and each
    pass starts only once the last one has read its shared memory.  TF's loop bit for bit,
    threads shuffled."""
    force = dict(path="cells", block_vectors=1) if path == "cells_one_vector_blocks" else \
        dict(path="cells") if path == "cells" else FORCED_PATHS[path]
    rows = gradops.fractional_pooling_sequence(33, 1.44, True, seed=3)
    cols = gradops.fractional_pooling_sequence(20, 1.5, False, seed=4)
    for overlapping in (False, True):
        kwargs, expected = pool_case(rng, (3, 33, 20, 16), rows, cols, overlapping, dtype)  # 3 batch tiles
        g = host_geometry(kwargs)
        plan = (cuda_launcher.cells_plan(g, np.dtype(dtype), **{k: v for k, v in force.items() if k != "path"})
                if path.startswith("cells") else cuda_launcher.plan(g, np.dtype(dtype), **force))
        real = plan.grid
        assert max(real) > blocks  # blocks of work for fewer blocks to stride over
        with cuda_host.capped_grids(blocks):
            assert plan.grid == tuple(min(n, blocks) for n in real)
            assert_identical(run_on_host(host_kernels, kwargs, "shuffled", 5, **force), expected)


def test_plan_shapes_tiles_and_refusals():
    """The plan's tiles fit the staged cells of every tile, threads stay within one block of
    256, and a cell of 2**50 elements (never a real GPU's: the input gradient would not fit)
    is refused rather than divided inexactly."""
    for shape, ratio in (((32, 112, 112, 64), 1.44), ((8, 56, 56, 256), 1.44), ((4, 7, 7, 8), 1.5), ((64, 2, 2, 1), 1.0)):
        rows = gradops.fractional_pooling_sequence(shape[1], ratio, True, seed=1)
        cols = gradops.fractional_pooling_sequence(shape[2], ratio, True, seed=2)
        for overlapping in (False, True):
            g = fractional_pool_geometry(OP, list(shape), (shape[0], len(rows) - 1, len(cols) - 1, shape[3]),
                                         rows.tolist(), cols.tolist(), overlapping)
            for dtype in ALL_DTYPES:
                p = cuda_launcher.plan(g, dtype)
                assert np.prod(p.block) <= cuda_launcher.THREADS and p.share_cells * p.cell_doubles <= cuda_launcher.SHARE_CAPACITY
                tables = cuda_launcher.kernel_tables(g, p)
                for offsets, cells, ranges, tile in ((tables[0], tables[1], tables[3], p.tile_height),
                                                     (tables[4], tables[5], tables[7], p.tile_cols)):
                    for t, (lo, hi) in enumerate(zip(ranges[0::2], ranges[1::2])):  # every listed cell is in range
                        listed = cells[offsets[t * tile]:offsets[min((t + 1) * tile, len(offsets) - 1)]]
                        assert listed.size == 0 or (lo == listed.min() and hi == listed.max())
                rows_fit = tables[3][1::2] - tables[3][0::2] + 1
                cols_fit = tables[7][1::2] - tables[7][0::2] + 1
                assert rows_fit.max() * cols_fit.max() <= p.share_cells or p.rows_per_thread == 1
    huge = fractional_pool_geometry(OP, [1, 2**25, 2**25, 1], (1, 1, 1, 1), [0, 2**25], [0, 2**25], False)
    with pytest.raises(gradops.BackendUnavailableError, match="2\\*\\*50"):
        cuda_launcher.plan(huge, np.float32)


def test_division_magic():
    """n // d == (n * m) >> s for every divisor the launcher can pass and numerators up to 2**31 - 1."""
    rng = np.random.default_rng(0)
    numerators = np.concatenate([np.arange(4096), 2**31 - 1 - np.arange(4096), rng.integers(0, 2**31, 20000)])
    numerators = [int(v) for v in numerators]
    for d in [*range(1, 1100), *rng.integers(1100, 2**31, 300).tolist(), 2**31 - 1, 2**30, 2**30 + 1]:
        m, shift = cuda_launcher.division_magic(d)
        m, shift = int(m), int(shift)
        assert all((n * m) >> shift == n // d for n in numerators), d


# ---- the cells kernel: sequences whose cells partition the input (what TF's generator makes)


def pooled_cells(sequence, in_size, overlapping):
    """(starts, clamped inclusive ends) of a sequence's cells, as the geometry reads them."""
    sequence = np.asarray(sequence, np.int64)
    ends = np.minimum(sequence[1:] - (0 if overlapping else 1), in_size - 1)
    return sequence[:-1], ends


PARTITIONS = {
    # name: (sequence, in_size, overlapping, the cells kernel's region bounds or None)
    "disjoint": ([0, 2, 3, 5], 5, False, [0, 2, 3, 5]),
    "overlapping": ([0, 2, 3, 5], 5, True, [0, 2, 3, 5]),
    "one_cell": ([0, 5], 5, True, [0, 5]),
    "last_entry_past_input": ([0, 2, 9], 5, False, [0, 2, 5]),  # the last cell is clamped to the input
    "late_start": ([1, 3, 5], 5, False, None),
    "ends_early": ([0, 2, 4], 5, False, None),
    "repeated_entry": ([0, 2, 2, 5], 5, True, None),  # row 2 lies in three cells
    "decreasing": ([0, 3, 2, 5], 5, False, None),
    "last_cell_empty": ([0, 5, 7], 5, False, None),
}


@pytest.mark.parametrize("case", list(PARTITIONS), ids=list(PARTITIONS))
def test_partition_bounds(case):
    sequence, in_size, overlapping, bounds = PARTITIONS[case]
    got = partition_bounds(*pooled_cells(sequence, in_size, overlapping), in_size, overlapping)
    assert (got is None) if bounds is None else got.tolist() == bounds


def region_cells(bounds, overlapping):
    """Per input index, the cells the cells kernel gives it: its region's cell, and the one
    before where it is an overlapping region's first index."""
    listed = []
    for k in range(len(bounds) - 1):
        for i in range(bounds[k], bounds[k + 1]):
            listed.append([k - 1, k] if overlapping and k > 0 and i == bounds[k] else [k])
    return listed


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 30), overlapping=st.booleans(), data=st.data())
def test_partition_bounds_agree_with_the_cell_tables(size, overlapping, data):
    """Where partition_bounds accepts a sequence, the cells the kernel gives each index are the
    ones TF's loop adds there (cells_by_index), in its order; generated sequences and sorted cut
    points always qualify."""
    strategy = data.draw(st.sampled_from(["generated", "cuts", "valid", "unordered"]))
    if strategy == "generated":
        ratio = data.draw(st.floats(1.0, float(size)))
        sequence = gradops.fractional_pooling_sequence(size, ratio, data.draw(st.booleans()), seed=data.draw(st.integers(0, 99)))
    elif strategy == "cuts":
        sequence = [0, *sorted(data.draw(st.sets(st.integers(1, size - 1)))), size] if size > 1 else [0, 1]
    else:
        maker = pooling_sequences if strategy == "valid" else unordered_pooling_sequences
        sequence, _ = data.draw(maker(size, overlapping))
    starts, ends = pooled_cells(sequence, size, overlapping)
    bounds = partition_bounds(starts, ends, size, overlapping)
    if strategy in ("generated", "cuts"):
        assert bounds is not None
    if bounds is not None:
        offsets, cells = gradops._geometry.cells_by_index(starts, ends, size)
        assert region_cells(bounds.tolist(), overlapping) == [cells[offsets[i]:offsets[i + 1]].tolist() for i in range(size)]


#: The cells kernel's choices the tests force (cells_plan's overrides): 64-bit indexing, one
#: channel per thread, chunks of one and of three cell rows (chunks that start below the first
#: row), and one vector per block (several channel blocks).
CELLS_FORCED = {
    "planned": {},
    "index64": dict(index="long long"),
    "scalar": dict(vector=1),
    "one_row_chunks": dict(chunk_rows=1),
    "three_row_chunks": dict(chunk_rows=3),
    "one_vector_blocks": dict(block_vectors=1),
}


@pytest.fixture(scope="module")
def fast_fp64_kernels():
    """The cells kernels built as sm_90 (GRADOPS_ARCH 900): overlapping cells of the float types
    take the double shares there, where the default host build (the newest architecture, FP64
    slow as on every part but P100, V100, A100, H100/H200 and B200) sums them in float-float."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    expressions = [e for e in cuda_launcher.instantiations()[cuda_launcher.SOURCE] if "_cells<" in e]
    return cuda_host.HostKernels(cuda_launcher.SOURCE, expressions, arch=90)


@pytest.fixture(params=["float-sums", "double-sums"])
def cells_kernels(request, host_kernels):
    """The cells kernels with either path for overlapping cells of the float types."""
    return host_kernels if request.param == "float-sums" else request.getfixturevalue("fast_fp64_kernels")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("forced", list(CELLS_FORCED))
def test_kernel_source_on_host_cells(cells_kernels, rng, forced, overlapping, dtype):
    """Generated sequences (ratios 1.44 to 3, both generators), batches, depths that take
    vectors or not: the cells kernel gives TF's loop result bit for bit, on every forced choice."""
    for shape in ((2, 13, 11, 24), (3, 9, 17, 5), (1, 1, 7, 16)):
        for ratio, pseudo_random in ((1.44, True), (1.5, False), (2.0, True), (3.0, False)):
            rows = gradops.fractional_pooling_sequence(shape[1], min(ratio, shape[1]), pseudo_random, seed=shape[1])
            cols = gradops.fractional_pooling_sequence(shape[2], min(ratio, shape[2]), not pseudo_random, seed=shape[2])
            kwargs, expected = pool_case(rng, shape, rows, cols, overlapping, dtype)
            assert_identical(run_on_host(cells_kernels, kwargs, path="cells", **CELLS_FORCED[forced]), expected)


def sm60_cells_problem(rng, dtype, force):
    """(results, TF's loop results) of overlapping cells at two ratios through the launcher on
    the current device (the tests below: a stand-in posing as sm_60, P100, whose kernels are
    built as sm_60: the double shares, and for the half types one cell row an iteration)."""
    got, want = [], []
    shape = (2, 13, 11, 24)
    for ratio, pseudo_random in ((1.44, True), (2.0, False)):
        rows = gradops.fractional_pooling_sequence(shape[1], ratio, pseudo_random, seed=3)
        cols = gradops.fractional_pooling_sequence(shape[2], ratio, not pseudo_random, seed=4)
        kwargs, expected = pool_case(rng, shape, rows, cols, True, dtype)
        dy = kwargs["out_backprop"]
        out = cuda_launcher.fractional_avg_pool_grad(host_geometry(kwargs), to_gpu(dy), path="cells", **force)
        got.append(to_host(out).reshape(-1).view(np.uint8))
        want.append(expected.reshape(-1).view(np.uint8))
    return np.concatenate(got), np.concatenate(want)


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("forced", list(CELLS_FORCED))
def test_kernel_source_on_host_cells_as_sm60(monkeypatch, rng, forced, dtype):
    """Built as sm_60, the half types' overlapping cells (one cell row an iteration) give TF's
    loop result bit for bit."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cuda_host.HostDevice(order="shuffled", compute_capability=60).install(monkeypatch)
    np.testing.assert_array_equal(*sm60_cells_problem(rng, dtype, CELLS_FORCED[forced]))


@pytest.mark.parametrize("bug", [("up[v] = next[v];", "up[v] = up[v];"),
                                 ("up_left[v] = next_left[v];", "up_left[v] = 0.0;")],
                         ids=["row-above-not-carried", "corner-above-not-carried"])
def test_planted_sm60_cells_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """The sm_60 loop's carried shares, planted wrong, give other bits than TF's loop."""
    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, bug,
                                        lambda: sm60_cells_problem(np.random.default_rng(9), np.float16,
                                                                   dict(chunk_rows=3)),
                                        lambda got, want: np.testing.assert_array_equal(got, want), 9, tmp_path,
                                        monkeypatch, compute_capability=60)


@st.composite
def partition_cases(draw):
    """Random partitions (sorted cut points: cells of any size down to one row) of random shapes."""
    n, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 16)), draw(st.integers(1, 16))
    rows = [0, *sorted(draw(st.sets(st.integers(1, h - 1)))), h] if h > 1 else [0, 1]
    cols = [0, *sorted(draw(st.sets(st.integers(1, w - 1)))), w] if w > 1 else [0, 1]
    return dict(orig_shape=(n, h, w, draw(st.sampled_from([1, 2, 3, 8, 12, 16, 24, 40]))), rows=rows, cols=cols,
                overlapping=draw(st.booleans()), dtype=draw(st.sampled_from(ALL_DTYPES)))


@settings(max_examples=80, deadline=None)
@given(case=partition_cases(), forced=st.sampled_from(list(CELLS_FORCED)), seed=st.integers(0, 2**32 - 1))
def test_kernel_source_on_host_cells_property(host_kernels, fast_fp64_kernels, case, forced, seed):
    """Random partitions, shapes, depths, modes, dtypes and forced choices: TF's loop bit for
    bit, with both sum paths."""
    case = dict(case)
    kwargs, expected = pool_case(np.random.default_rng(seed), case.pop("orig_shape"), case.pop("rows"),
                                 case.pop("cols"), case.pop("overlapping"), case.pop("dtype"))
    for kernels in (host_kernels, fast_fp64_kernels):
        assert_identical(run_on_host(kernels, kwargs, seed=seed, path="cells", **CELLS_FORCED[forced]), expected)


def assert_same_values(got, want):
    """Equal bits, except that any NaN matches any NaN (hardware and NumPy differ in its sign)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    np.testing.assert_array_equal(got[~nan].view(f"u{got.itemsize}"), want[~nan].view(f"u{want.itemsize}"))


def with_non_finite(dy):
    """A copy of out_backprop ([N >= 2, rows >= 5, cols >= 5, C >= 16]) with Inf, -Inf and NaN:
    Inf beside -Inf in one cell row, Inf above NaN in a column, -Inf in the last image."""
    dy = dy.copy()
    dy[0, 1, 1, 3], dy[0, 1, 2, 3], dy[1, 2, 0, 9], dy[1, 3, 0, 9], dy[-1, 4, 4, 15] = np.inf, -np.inf, np.inf, np.nan, -np.inf
    return dy


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=[np.dtype(d).name for d in FLOAT_DTYPES])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_kernel_source_on_host_cells_non_finite(cells_kernels, rng, overlapping, dtype):
    """Inf, -Inf and NaN in out_backprop: their cells' shares are Inf or NaN as TF's division
    makes them, and overlapping sums of Inf and -Inf are NaN, on every forced choice."""
    rows = gradops.fractional_pooling_sequence(11, 1.44, True, seed=1)
    cols = gradops.fractional_pooling_sequence(10, 1.44, False, seed=2)
    kwargs, _ = pool_case(rng, (2, 11, 10, 16), rows, cols, overlapping, dtype)
    dy = kwargs["out_backprop"] = with_non_finite(kwargs["out_backprop"])
    expected = exact_grad((2, 11, 10, 16), dy, rows, cols, overlapping)
    assert np.isinf(expected.astype(np.float64)).any() and np.isnan(expected.astype(np.float64)).any()
    for forced in CELLS_FORCED.values():
        assert_same_values(run_on_host(cells_kernels, kwargs, path="cells", **forced), expected)


#: Two overlapping row cells of B1 and B2 rows in a one-column image: the row they share sums
#: a1 / B1 + a2 / B2, within reach of T's rounding midpoints (the float-float test's hard cases).
NEAR_MIDPOINT_CELLS = (4093, 4091)


def near_midpoint_pairs(dtype, rng, count=24):
    """(a1, a2) of ``dtype`` in [1, 2) whose a1 / B1 + a2 / B2 lies within a float ulp (float16)
    or 2**-18 of a float32 ulp (float32) of one of dtype's rounding midpoints, but not on it.
    float16: a search; float32: N = A1 B2 + A2 B1 chosen by the Chinese remainder theorem so
    that N 2**s mod B1 B2 is (B1 B2 + d) / 2 for small odd d (S = N / (2**23 B1 B2))."""
    b1, b2 = NEAR_MIDPOINT_CELLS
    q = b1 * b2
    pairs = []
    if np.dtype(dtype) == np.float16:
        halves = np.arange(0x3C00, 0x4000, dtype=np.uint16).view(np.float16).astype(np.float64)
        a1, a2 = rng.choice(halves, 2**20), rng.choice(halves, 2**20)
        total = a1 / b1 + a2 / b2
        exponent = np.floor(np.log2(total))
        units = total / 2.0 ** (exponent - 10)  # half ulps
        near = np.abs(units - np.floor(units) - 0.5) < 2.0**-12
        pairs = list(zip(a1[near], a2[near]))[:count]
    else:
        while len(pairs) < count:
            shift, d = int(rng.choice([10, 11])), int(rng.integers(-31, 32)) * 2 + 1
            n0 = (q + d) // 2 * pow(2, -shift, q) % q
            a1 = n0 * pow(b2, -1, b1) % b1 + b1 * int(rng.integers(2**23 // b1 + 1, 2**24 // b1))
            a2 = n0 * pow(b1, -1, b2) % b2 + b2 * int(rng.integers(2**23 // b2 + 1, 2**24 // b2))
            n = a1 * b2 + a2 * b1
            if 2**23 <= a1 < 2**24 and 2**23 <= a2 < 2**24 and (n << shift) < 2**23 * q * 2 <= (n << (shift + 1)):
                pairs.append((a1 / 2.0**23, a2 / 2.0**23))
    return np.array(pairs)


def near_midpoint_case(dtype, rng):
    """(kwargs, expected, pairs): overlapping row cells of B1 and B2 rows in a one-column image
    whose shared row sums each channel's pair (:func:`near_midpoint_pairs`)."""
    b1, b2 = NEAR_MIDPOINT_CELLS
    pairs = near_midpoint_pairs(dtype, rng)
    depth = -(-len(pairs) // 8) * 8
    dy = np.ones((1, 2, 1, depth), dtype)
    dy[0, 0, 0, : len(pairs)], dy[0, 1, 0, : len(pairs)] = pairs[:, 0], pairs[:, 1]
    rows, cols = [0, b1 - 1, b1 + b2 - 2], [0, 1]
    kwargs = dict(orig_input_tensor_shape=np.array([1, b1 + b2 - 1, 1, depth]), out_backprop=dy,
                  row_pooling_sequence=np.array(rows), col_pooling_sequence=np.array(cols), overlapping=True)
    return kwargs, exact_grad((1, b1 + b2 - 1, 1, depth), dy, rows, cols, True), pairs


def tiny_float32_case(bits):
    """(kwargs, expected): overlapping cells of float32 subnormals (``bits`` times 2**-149, the
    second batch item negative): each share lies below 2**-150 and rounds to zero in float, while
    the sums of four do not (TF: 2**-149, or -0.0 and -2**-149)."""
    rows = gradops.fractional_pooling_sequence(11, 1.44, True, seed=1)
    cols = gradops.fractional_pooling_sequence(10, 1.44, False, seed=2)
    dy = np.full((2, len(rows) - 1, len(cols) - 1, 16), bits, np.uint32).view(np.float32)
    dy[1] = -dy[1]
    kwargs = dict(orig_input_tensor_shape=np.array([2, 11, 10, 16]), out_backprop=dy,
                  row_pooling_sequence=np.array(rows), col_pooling_sequence=np.array(cols), overlapping=True)
    return kwargs, exact_grad((2, 11, 10, 16), dy, rows, cols, True)


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_kernel_source_on_host_cells_float32_subnormal_sums(cells_kernels, bits):
    """float32 subnormal out_backprop in overlapping cells: shares that round to zero in float
    but sum to 2**-149 (and the signs of zeros) give TF's bits on both sum paths."""
    kwargs, expected = tiny_float32_case(bits)
    assert (expected != 0).any() and (np.signbit(expected) & (expected == 0)).any()
    assert_identical(run_on_host(cells_kernels, kwargs, path="cells"), expected)


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_kernel_source_on_host_cells_near_rounding_midpoints(cells_kernels, rng, dtype):
    """Overlapping cells whose shared row's sum lies next to a rounding midpoint of the type
    (a float16 one within a float ulp, a float32 one within 2**-18 of a float32 ulp): TF's value
    bit for bit on both sum paths, where float16's own rounding of the float sum is wrong for
    some."""
    from fractions import Fraction

    b1, b2 = NEAR_MIDPOINT_CELLS
    kwargs, expected, pairs = near_midpoint_case(dtype, rng)
    assert len(pairs) >= 8
    for a1, a2 in pairs:  # next to a midpoint, not on it
        exact = Fraction(a1) / b1 + Fraction(a2) / b2
        bits = 11 if dtype == np.float16 else 24
        scale = Fraction(2) ** (exact.numerator.bit_length() - exact.denominator.bit_length() - bits)
        if exact / scale >= 2**bits:  # bit_length's estimate was one low
            scale *= 2
        off = exact / scale
        off -= off.numerator // off.denominator
        assert 0 < abs(off - Fraction(1, 2)) < (Fraction(1, 2**12) if dtype == np.float16 else Fraction(1, 2**18))
    if dtype == np.float16:  # rounding the float sum to float16 is wrong for some: the test matters
        through_float = (pairs[:, 0] / b1 + pairs[:, 1] / b2).astype(np.float32).astype(np.float16)
        assert (through_float != expected[0, b1 - 1, 0, : len(pairs)]).any()
    assert_identical(run_on_host(cells_kernels, kwargs, path="cells"), expected)


#: The source line that lets a test choose the overlapping cells' sum path.
FAST_FP64_CHOICE = "#if defined(GRADOPS_FRACTIONAL_FAST_FP64)"


@pytest.fixture(params=["float-sums", "double-sums"])
def forced_sum_path(request, cuda_device, monkeypatch, tmp_path):
    """The cells kernels with the overlapping cells' sum path forced (GRADOPS_FRACTIONAL_FAST_FP64,
    which the runtime never defines), whichever the device's arch would pick: on a GPU the
    source CuPy compiles gets the define (and kernels are loaded afresh), on the stand-in a
    copy of the sources does."""
    from gradops.backends.cuda import _build, _runtime

    define = f"#define GRADOPS_FRACTIONAL_FAST_FP64 {int(request.param == 'double-sums')}\n"
    if cuda_device is None:
        source_code = _build.source_code
        monkeypatch.setattr(_build, "source_code",
                            lambda name: define + source_code(name) if name == cuda_launcher.SOURCE else source_code(name))
        monkeypatch.setattr(_runtime, "_kernels", {})
    else:
        sources = cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, (FAST_FP64_CHOICE, define + FAST_FP64_CHOICE))
        cuda_host.HostDevice(order="shuffled", seed=cuda_device.seed, source_dir=sources).install(monkeypatch)
    return request.param


def test_cuda_cells_both_sum_paths(forced_sum_path, rng):
    """Both sum paths of overlapping cells on the device (an H100 or H200 takes the double shares
    by itself, a GeForce the float-float ones): TF's bits next to rounding midpoints, on float32
    subnormal sums, on Inf and NaN and on random TF-generated cells; float16, bfloat16, float32."""
    def run(kwargs):
        g = host_geometry(kwargs)
        return to_host(cuda_launcher.fractional_avg_pool_grad(g, to_gpu(kwargs["out_backprop"]), path="cells"))

    for dtype in (np.float16, np.float32):
        kwargs, expected, _ = near_midpoint_case(dtype, rng)
        assert_identical(run(kwargs), expected)
    for bits in (1, 2, 3):
        kwargs, expected = tiny_float32_case(bits)
        assert_identical(run(kwargs), expected)
    rows = gradops.fractional_pooling_sequence(61, 1.44, True, seed=1)
    cols = gradops.fractional_pooling_sequence(57, 1.7, False, seed=2)
    for dtype in (np.float16, BFLOAT16, np.float32):
        kwargs, expected = pool_case(rng, (3, 61, 57, 24), rows, cols, True, dtype)
        assert_identical(run(kwargs), expected)
        dy = kwargs["out_backprop"] = with_non_finite(kwargs["out_backprop"])
        assert_same_values(run(kwargs), exact_grad((3, 61, 57, 24), dy, rows, cols, True))


def test_kernel_source_on_host_cells_orders_agree(host_kernels, rng):
    """Forward, reverse and shuffled block and thread orders give the same bits."""
    rows = gradops.fractional_pooling_sequence(45, 1.44, True, seed=7)
    cols = gradops.fractional_pooling_sequence(23, 1.44, False, seed=8)
    for dtype in (np.float16, np.float32, np.int32, np.float64):
        for overlapping in (False, True):
            kwargs, expected = pool_case(rng, (3, 45, 23, 16), rows, cols, overlapping, dtype)
            for order, seed in (("forward", 0), ("reverse", 0), ("shuffled", 1)):
                assert_identical(run_on_host(host_kernels, kwargs, order, seed, path="cells", chunk_rows=2), expected)


def test_kernel_source_on_host_cells_sum_order(host_kernels):
    """The int32 corner where only TF's order gives 2: cells (0, 0), (0, 1), (1, 0), (1, 1)."""
    dy = np.array([[4, 2], [4, 0]], np.int32).reshape(1, 2, 2, 1)
    kwargs = dict(orig_input_tensor_shape=np.array([1, 4, 4, 1]), out_backprop=dy,
                  row_pooling_sequence=np.array([0, 1, 3]), col_pooling_sequence=np.array([0, 1, 4]),
                  overlapping=True)
    got = run_on_host(host_kernels, kwargs, path="cells")
    assert got[0, 1, 1, 0] == 2
    assert_identical(got, exact_grad((1, 4, 4, 1), dy, [0, 1, 3], [0, 1, 4], True))


def test_cells_plan():
    """The cells kernel's launch: blocks of 128 threads whose vectors are a power of two dividing
    the depth's (at most a warp), chunks of 4 cell rows where the grid still holds 2**18
    threads, fewer below, and the grid covering every (column, chunk, channel block)."""
    def plan_of(shape, dtype, ratio=1.44, **force):
        rows = gradops.fractional_pooling_sequence(shape[1], ratio, True, seed=1)
        cols = gradops.fractional_pooling_sequence(shape[2], ratio, True, seed=2)
        g = fractional_pool_geometry(OP, list(shape), (shape[0], len(rows) - 1, len(cols) - 1, shape[3]),
                                     rows.tolist(), cols.tolist(), False)
        return g, cuda_launcher.cells_plan(g, dtype, **force)

    g, p = plan_of((32, 112, 112, 64), np.float16)
    assert (p.vector, p.block, p.chunk_rows, p.index) == (8, (8, 16), 4, "int")
    assert (p.column_blocks, p.row_chunks, p.channel_blocks) == (-(-32 * 77 // 16), 20, 1)
    g, p = plan_of((32, 56, 56, 256), np.float32)
    assert (p.vector, p.block, p.chunk_rows) == ((4, (32, 4), 4))
    assert p.channel_blocks == 2 and p.grid == (-(-32 * 38 // 4), 10, 2)
    g, p = plan_of((2, 20, 20, 12), np.float32)  # 3 vectors: one a block; a small grid: chunks of one row
    assert (p.block, p.chunk_rows, p.channel_blocks) == ((1, 128), 1, 3)
    g, p = plan_of((1, 9, 9, 6), np.float16)  # no vectors (6 halves), and forced choices
    assert (p.vector, p.block_vectors) == (1, 2)
    assert cuda_launcher.cells_plan(g, np.float16, chunk_rows=3, index="long long").chunk_rows == 3


def test_cells_path_is_chosen_only_where_it_can_run(monkeypatch):
    """The launcher's choice: cells for partitions, disjoint and overlapping (CELLS_BY_DEFAULT,
    measured on an H200, 2026-12-04), gather for cells that do not partition the input; each
    mode's default can be turned either way; forcing cells where the cells do not partition the
    input is refused."""
    def geometry(rows, cols, overlapping):
        return fractional_pool_geometry(OP, [1, 5, 5, 1], (1, len(rows) - 1, len(cols) - 1, 1), rows, cols, overlapping)

    partitions = {mode: geometry([0, 2, 5], [0, 3, 5], mode == "overlapping") for mode in ("disjoint", "overlapping")}
    other = geometry([0, 2, 2, 5], [0, 3, 5], True)
    assert cuda_launcher.CELLS_BY_DEFAULT == {"disjoint": True, "overlapping": True}
    assert cuda_launcher.pick_path(partitions["disjoint"], np.float32) == "cells"
    assert cuda_launcher.pick_path(partitions["overlapping"], np.float32) == "cells"
    for g in partitions.values():
        assert cuda_launcher.pick_path(g, np.float32, "cells") == "cells"
        assert cuda_launcher.pick_path(g, np.float32, "gather") == "gather"
    with pytest.raises(ValueError, match="partition"):
        cuda_launcher.pick_path(other, np.float32, "cells")
    with pytest.raises(ValueError, match="no kernel path"):
        cuda_launcher.pick_path(partitions["disjoint"], np.float32, "tiles")
    monkeypatch.setattr(cuda_launcher, "CELLS_BY_DEFAULT", {"disjoint": False, "overlapping": True})
    assert cuda_launcher.pick_path(partitions["disjoint"], np.float32) == "gather"
    assert cuda_launcher.pick_path(partitions["overlapping"], np.float32) == "cells"
    assert cuda_launcher.pick_path(other, np.float32) == "gather"
    monkeypatch.setattr(cuda_launcher, "CELLS_BY_DEFAULT", {"disjoint": True, "overlapping": False})
    assert cuda_launcher.pick_path(partitions["disjoint"], np.float32) == "cells"
    assert cuda_launcher.pick_path(partitions["overlapping"], np.float32) == "gather"


def test_cells_path_takes_float_types_cells_up_to_float_share_cells(monkeypatch, rng):
    """Cells of float16, bfloat16 and float32, whose shares the cells kernel computes in float,
    run there up to FLOAT_SHARE_CELLS elements (the .cu file's proof needs fewer than 2**13),
    disjoint or overlapping; a larger cell takes gather (forcing cells is refused), with TF's
    values through the public API (the host stand-in).  Other dtypes keep the cells kernel."""
    assert cuda_launcher.FLOAT_SHARE_CELLS == 4096 and cuda_launcher.FLOAT_SHARE_CELLS < 2**13

    def geometry(rows, cols, overlapping=False):
        return fractional_pool_geometry(OP, [1, rows[-1], cols[-1], 1], (1, len(rows) - 1, len(cols) - 1, 1), rows,
                                        cols, overlapping)

    fits, too_large = geometry([0, 64, 65], [0, 64, 66]), geometry([0, 65, 66], [0, 64, 65])
    assert fits.largest_cell == 4096 and too_large.largest_cell == 4160
    for dtype in cuda_launcher.FLOAT_SHARE_DTYPES:
        assert cuda_launcher.pick_path(fits, dtype) == "cells"
        assert cuda_launcher.pick_path(too_large, dtype) == "gather"
        with pytest.raises(ValueError, match="4096 elements"):
            cuda_launcher.pick_path(too_large, dtype, "cells")
        assert cuda_launcher.pick_path(geometry([0, 65, 66], [0, 64, 65], True), dtype) == "gather"
    for dtype in (np.float64, np.int32, np.int64):
        assert cuda_launcher.pick_path(too_large, dtype) == "cells"
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice(order="shuffled", seed=3).install(monkeypatch)
    for g, kernel in ((fits, "_cells<"), (too_large, "_grad<")):
        kwargs, expected = pool_case(rng, (1, g.in_rows, g.in_cols, 8), g.row_starts + (g.in_rows,),
                                     g.col_starts + (g.in_cols,), False, np.float16)
        got = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=to_gpu(kwargs["out_backprop"])), backend="cuda")
        assert_identical(to_host(got), expected)
        assert kernel in device.launches[-1][0]


@pytest.mark.parametrize("overlapping", [False, True])
def test_cuda_cells_by_default(monkeypatch, rng, overlapping):
    """The public API launches the kernel CELLS_BY_DEFAULT names for generated sequences (cells,
    disjoint or overlapping) and gather for the others, with TF's loop result bit for bit (the
    host stand-in)."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice(order="shuffled", seed=3).install(monkeypatch)
    rows = gradops.fractional_pooling_sequence(9, 1.44, True, seed=3)
    cols = gradops.fractional_pooling_sequence(8, 1.5, False, seed=4)
    for sequences, kernel in (((rows, cols), "_cells<"), (([0, 4, 2, 9], [0, 3, 8]), "_grad<")):
        kwargs, expected = pool_case(rng, (2, 9, 8, 16), *sequences, overlapping, np.float32)
        got = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=to_gpu(kwargs["out_backprop"])), backend="cuda")
        assert_identical(to_host(got), expected)
        launched = device.launches[-1][0]
        assert kernel in launched
        if kernel == "_cells<":
            assert launched.endswith(f", {str(overlapping).lower()}>")


def cells_problem(rng):
    """(results, expected) of five cells-kernel calls through the launcher on the current device:
    the int32 sum-order corner; float64 (the double shares) and float32 (float-float sums on the
    host build) overlapping cells of 1 to 3 rows and columns, the float32 ones with an Inf and a
    -Inf, two batch items, chunks of two cell rows and one vector a block; float64 overlapping
    cells again in chunks of three rows (the double shares' loop takes two rows an iteration);
    float16 disjoint cells in chunks of three rows."""
    calls = [((1, 4, 4, 1), [0, 1, 3], [0, 1, 4], True, np.int32, {}),
             # float64 overlapping cells: the double shares on every build
             ((2, 13, 11, 16), gradops.fractional_pooling_sequence(13, 1.44, True, seed=5).tolist(),
              [0, 1, 3, 4, 7, 9, 11], True, np.float64, dict(chunk_rows=2, block_vectors=1)),
             # and in chunks of three cell rows: a pair of rows, then one
             ((1, 13, 5, 2), gradops.fractional_pooling_sequence(13, 1.44, True, seed=8).tolist(), [0, 2, 3, 5],
              True, np.float64, dict(chunk_rows=3, vector=1)),
             ((2, 13, 11, 16), gradops.fractional_pooling_sequence(13, 1.44, True, seed=5).tolist(),
              [0, 1, 3, 4, 7, 9, 11], True, np.float32, dict(chunk_rows=2, block_vectors=1)),
             ((2, 9, 10, 16), gradops.fractional_pooling_sequence(9, 1.44, False, seed=6).tolist(),
              gradops.fractional_pooling_sequence(10, 1.5, True, seed=7).tolist(), False, np.float16, dict(chunk_rows=3))]
    got, want = [], []
    for shape, rows, cols, overlapping, dtype, force in calls:
        kwargs, _ = pool_case(rng, shape, rows, cols, overlapping, dtype)
        dy = kwargs["out_backprop"]
        if dtype == np.int32:
            dy = np.array([[4, 2], [4, 0]], np.int32).reshape(1, 2, 2, 1)
        elif dtype == np.float32:
            dy = dy.copy()
            dy[1, 2, 3, 5], dy[0, 4, 0, 14] = np.inf, -np.inf
        out = cuda_launcher.fractional_avg_pool_grad(host_geometry(dict(kwargs, out_backprop=dy)), to_gpu(dy),
                                                     path="cells", **force)
        got.append(to_host(out).reshape(-1).view(np.uint8))
        want.append(exact_grad(shape, dy, rows, cols, overlapping).reshape(-1).view(np.uint8))
    return np.concatenate(got), np.concatenate(want)


#: The cells kernels' shared work split.
CELLS_HEADER = "fractional_cells.cuh"

PLANTED_CELLS = {  # bugs in the cells kernel: name -> (text of the real source, its replacement[, file])
    "cells-corner-adds-left-before-up": ("((up_left[v] + up[v]) + left_own[v]) + own[v]",
                                         "((up_left[v] + left_own[v]) + up[v]) + own[v]"),
    # overlapping cells in double: two cell rows an iteration, the carried shares in two sets
    "cells-second-row-takes-its-own-shares-as-the-row-above": (
        "double_row(r + 1, next, next_left, up, up_left);", "double_row(r + 1, up, next_left, up, up_left);"),
    "cells-second-row-takes-its-left-share-as-the-corner-above": (
        "double_row(r + 1, next, next_left, up, up_left);", "double_row(r + 1, next, up_left, up, up_left);"),
    "cells-first-row-takes-the-carried-sets-swapped": (
        "r += 2) {\n                        double_row(r, up, up_left, next, next_left);",
        "r += 2) {\n                        double_row(r, up_left, up, next, next_left);"),
    "cells-row-pairs-one-row-apart": ("for (I r = r0; r < r1; r += 2) {", "for (I r = r0; r < r1; ++r) {"),
    # a row's two vectors, loaded together at its top
    "cells-row-loads-its-own-vector-as-its-left": (
        "const Vec d_left = load_here<T, V>(dy - left_step);", "const Vec d_left = load_here<T, V>(dy);"),
    "cells-row-above-loads-its-own-vector-as-its-left": (
        "const Vec above_left = load_here<T, V>(dy_above - left_step);",
        "const Vec above_left = load_here<T, V>(dy_above);"),
    "cells-overlap-first-row-takes-the-inner-value": ("sum[v] = up[v] + own[v];", "sum[v] = own[v];"),
    "cells-overlap-first-column-takes-the-inner-value": ("const Vec left = round_vector<T, V>(sum);",
                                                         "const Vec left = round_vector<T, V>(own);"),
    "cells-overlap-first-row-drops-its-last-column": (
        "for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vec*>(dx + x * depth) = top;",
        "for (I x = 1; x < col_count - 1; ++x) *reinterpret_cast<Vec*>(dx + x * depth) = top;"),
    "cells-overlap-first-column-drops-its-last-row": (
        "for (I y = 1; y < row_count; ++y) *reinterpret_cast<Vec*>(dx + y * dx_row) = left;",
        "for (I y = 1; y < row_count - 1; ++y) *reinterpret_cast<Vec*>(dx + y * dx_row) = left;"),
    "cells-overlap-inner-rows-drop-their-last-column": (
        "for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vec*>(dx + y * dx_row + x * depth) = inner;",
        "for (I x = 1; x < col_count - 1; ++x) *reinterpret_cast<Vec*>(dx + y * dx_row + x * depth) = inner;"),
    "cells-chunk-ignores-the-row-above": ("if (OVERLAP && r0 > 0) {", "if (false) {"),
    "cells-left-neighbour-across-batch-items": ("const bool has_left = OVERLAP && c > 0;",
                                                "const bool has_left = OVERLAP && (n > 0 || c > 0);"),
    "cells-row-above-sized-as-its-own-row": ("const double row_size = static_cast<double>(row_sizes[r0 - 1]);",
                                             "const double row_size = static_cast<double>(row_sizes[r0]);"),
    "cells-left-cell-sized-as-its-own-column": ("static_cast<double>(col_sizes[c - 1])", "static_cast<double>(col_sizes[c])"),
    "cells-first-column-takes-the-inner-value": ("= y == 0 ? corner : left;", "= y == 0 ? corner : inner;"),
    "cells-first-row-takes-the-inner-value": ("const Vector<T, V> rest = y == 0 ? top : inner;",
                                              "const Vector<T, V> rest = inner;"),
    # the float-float sums of overlapping cells (the float types on the host build)
    "cells-float-row-above-not-carried": ("up_q[v] = own_q[v];", "up_q[v] = up_q[v];"),
    "cells-float-corner-above-not-carried": ("up_left_q[v] = left_q[v];", "up_left_q[v] = 0.0f;"),
    "cells-float-row-above-sized-as-its-own-row": ("const float row_size = static_cast<float>(row_sizes[r0 - 1]);",
                                                   "const float row_size = static_cast<float>(row_sizes[r0]);"),
    "cells-float-left-cell-sized-as-its-own-column": ("static_cast<float>(col_sizes[c - 1])",
                                                      "static_cast<float>(col_sizes[c])"),
    "cells-float-row-loads-its-own-vector-as-its-left": (
        "const Vec left_vector = load_here<T, V>(dy - left_step);", "const Vec left_vector = load_here<T, V>(dy);"),
    "cells-float-corner-misses-the-left-share": ("two_sum(s, left_q[v], s, t2);", "two_sum(s, 0.0f, s, t2);"),
    "cells-last-column-of-a-region-dropped": (
        "for (I x = 1; x < col_count; ++x) *reinterpret_cast<Vector<T, V>*>(dx + x * depth) = rest;",
        "for (I x = 1; x < col_count - 1; ++x) *reinterpret_cast<Vector<T, V>*>(dx + x * depth) = rest;"),
    "cells-last-row-of-a-region-dropped": ("for (I y = 0; y < row_count; ++y, dx += dx_row)",
                                           "for (I y = 0; y < row_count - 1; ++y, dx += dx_row)"),
    "cells-infinity-divided-as-finite": ("++v) shares[v] = element_share(d.e[v], b, y, false);",
                                         "++v) shares[v] = element_share(d.e[v], b, y, true);"),
    # The work split both cells kernels share (fractional_cells.cuh).
    "cells-batch-item-from-a-wrong-split": ("n = magic_divide(j, out_cols_magic, out_cols_shift);",
                                            "n = magic_divide(j, out_cols_magic, out_cols_shift + 1);", CELLS_HEADER),
    "cells-channel-block-ignored": ("const I ch = (bz * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x)) * V;",
                                    "const I ch = static_cast<I>(threadIdx.x) * V;", CELLS_HEADER),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_CELLS))
def test_planted_cells_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    text, replacement, *where = PLANTED_CELLS[bug]
    cuda_host.assert_planted_bug_caught(where[0] if where else cuda_launcher.SOURCE, (text, replacement),
                                        lambda: cells_problem(np.random.default_rng(5)),
                                        lambda got, want: np.testing.assert_array_equal(got, want), 5, tmp_path,
                                        monkeypatch)


# ---- through the public API, on a GPU or on the host stand-in (the cuda_device fixture)


def check_cuda(kwargs, expected, out_backprop=None):
    """backend="cuda" returns a CuPy array equal bit for bit to ``expected``, and agrees with NumPy."""
    import cupy

    dy = to_gpu(kwargs["out_backprop"]) if out_backprop is None else out_backprop
    got = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=dy), backend="cuda")
    assert isinstance(got, cupy.ndarray)
    got = to_host(got)
    assert_identical(got, expected)
    g = host_geometry(kwargs)
    if cuda_launcher.cells_possible(g, got.dtype):  # the opt-in cells kernel, forced, gives the same bits
        cells = cuda_launcher.fractional_avg_pool_grad(g, to_gpu(kwargs["out_backprop"]), path="cells")
        assert_identical(to_host(cells), expected)
    numpy_result = gradops.fractional_avg_pool_grad(**kwargs, backend="numpy")
    if got.dtype == BFLOAT16:  # ml_dtypes before 0.7 rounds twice (see bfloat16_rounded_once)
        assert_close(got, numpy_result, BFLOAT16)
    else:
        assert_identical(got, numpy_result)
    return got


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("pseudo_random", [False, True], ids=["shuffled", "pseudo_random"])
@pytest.mark.parametrize("ratio", [1.44, 1.5, 2.0])
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_generated_sequences_grid(cuda_device, rng, overlapping, ratio, pseudo_random, dtype):
    """Generated sequences, both modes, every dtype, odd sizes: TF's loop bit for bit."""
    rows = gradops.fractional_pooling_sequence(7, ratio, pseudo_random, seed=3)
    cols = gradops.fractional_pooling_sequence(9, ratio, pseudo_random, seed=4)
    check_cuda(*pool_case(rng, (2, 7, 9, 3), rows, cols, overlapping, dtype))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("case", list(HAND_CASES), ids=list(HAND_CASES))
def test_cuda_hand_written_sequences(cuda_device, rng, case, overlapping, dtype):
    """Size-1 cells, clamped last entries, over-long sequences, late starts."""
    shape, rows, cols, out_rows, out_cols = HAND_CASES[case]
    check_cuda(*pool_case(rng, shape, rows, cols, overlapping, dtype, out_rows, out_cols))


def test_cuda_sum_order_and_repeated_entries(cuda_device, rng):
    """TF's summation order (int32 gives 2) and a row inside three overlapping cells."""
    dy = np.array([[4, 2], [4, 0]], np.int32).reshape(1, 2, 2, 1)
    kwargs = dict(orig_input_tensor_shape=np.array([1, 4, 4, 1]), out_backprop=dy,
                  row_pooling_sequence=np.array([0, 1, 3]), col_pooling_sequence=np.array([0, 1, 4]),
                  overlapping=True)
    assert check_cuda(kwargs, exact_grad((1, 4, 4, 1), dy, [0, 1, 3], [0, 1, 4], True))[0, 1, 1, 0] == 2
    for dtype in ALL_DTYPES:
        check_cuda(*pool_case(rng, (2, 5, 4, 2), [0, 2, 2, 4], [0, 1, 1, 3], True, dtype))


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_unordered_sequences(cuda_device, rng, overlapping):
    """Decreasing sequences, empty cells and cells past the input through backend="cuda"."""
    for dtype in ALL_DTYPES:
        check_cuda(*pool_case(rng, (2, 6, 7, 2), [0, 4, 2, 6, 1, 3], [6, 1, 3, 2, 8], overlapping, dtype))


@pytest.mark.parametrize("case", list(ALL_CELLS_EMPTY), ids=list(ALL_CELLS_EMPTY))
def test_cuda_larger_out_backprop_with_every_cell_empty(cuda_device, rng, case):
    """More images and channels than the input, every cell empty: zeros on the device, as on the host."""
    import cupy

    rows, cols, overlapping = ALL_CELLS_EMPTY[case]
    dy = to_gpu(rng.standard_normal((3, len(rows) - 1, len(cols) - 1, 4)).astype(np.float32))
    got = gradops.fractional_avg_pool_grad([2, 6, 5, 3], dy, rows, cols, overlapping, backend="cuda")
    assert isinstance(got, cupy.ndarray) and got.shape == (2, 6, 5, 3) and got.dtype == np.float32
    assert not to_host(got).any()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=fractional_cases(), seed=st.integers(0, 2**32 - 1))
def test_cuda_property(cuda_device, case, seed):
    """Random valid sequences, shapes, modes and dtypes: TF's loop bit for bit."""
    case = dict(case)
    check_cuda(*pool_case(np.random.default_rng(seed), case.pop("orig_shape"), case.pop("rows"),
                          case.pop("cols"), case.pop("overlapping"), case.pop("dtype"), **case))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
@pytest.mark.parametrize("case", list(EMPTY_CASES), ids=list(EMPTY_CASES))
def test_cuda_empty_tensors_rejected(cuda_device, case, dtype):
    """Empty GPU tensors are refused before any kernel runs, as on the host."""
    orig_shape, dy_shape, rows = EMPTY_CASES[case]
    with pytest.raises(gradops.InvalidArgumentError, match="out_backprop"):
        gradops.fractional_avg_pool_grad(list(orig_shape), to_gpu(np.ones(dy_shape, dtype)), rows, [0, 2, 4],
                                         False, backend="cuda")


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
def test_cuda_non_contiguous_input(cuda_device, rng, dtype):
    """A strided out_backprop (every other channel of a wider array) gives the contiguous result."""
    rows = gradops.fractional_pooling_sequence(9, 1.5, True, seed=5)
    cols = gradops.fractional_pooling_sequence(8, 1.5, False, seed=6)
    kwargs, expected = pool_case(rng, (2, 9, 8, 3), rows, cols, True, dtype)
    dy = kwargs["out_backprop"]
    wide = np.zeros((*dy.shape[:3], 2 * dy.shape[3]), dy.dtype)
    wide[..., 1::2] = dy
    view = to_gpu(wide)[..., 1::2]
    assert not view.flags.c_contiguous
    check_cuda(kwargs, expected, out_backprop=view)


@FOREIGN_GPU_WRAPPERS
def test_cuda_foreign_gpu_tensor(cuda_device, rng, wrapper):
    """out_backprop given as a __cuda_array_interface__ or DLPack producer is read in place."""
    kwargs, expected = pool_case(rng, (2, 7, 9, 3), [0, 2, 4, 7], [0, 3, 5, 9], True, np.float32)
    check_cuda(kwargs, expected, out_backprop=wrapper(to_gpu(kwargs["out_backprop"])))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=ALL_IDS)
def test_cuda_deterministic(cuda_device, rng, dtype):
    """Two runs give bitwise equal results."""
    rows = gradops.fractional_pooling_sequence(61, 1.44, True, seed=1)
    cols = gradops.fractional_pooling_sequence(57, 1.7, False, seed=2)
    kwargs, _ = pool_case(rng, (3, 61, 57, 5), rows, cols, True, dtype)
    dy = to_gpu(kwargs["out_backprop"])
    first = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=dy), backend="cuda")
    if cuda_device is not None:  # the host runs the second pass in another block and thread order
        cuda_device.seed += 1
    second = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=dy), backend="cuda")
    assert to_host(first).tobytes() == to_host(second).tobytes()


@pytest.mark.gpu
def test_cuda_non_default_stream(rng):
    """Under a non-blocking stream the upload and the kernel run on it; right once synchronised."""
    import cupy

    rows = gradops.fractional_pooling_sequence(40, 1.5, True, seed=1)
    cols = gradops.fractional_pooling_sequence(37, 1.44, False, seed=2)
    kwargs, expected = pool_case(rng, (2, 40, 37, 4), rows, cols, False, np.float64)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        dy = to_gpu(kwargs["out_backprop"])
        got = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=dy), backend="cuda")
        result = cupy.empty_like(got)
        result[...] = got  # ordered after the kernel only when the kernel ran on this stream
    stream.synchronize()
    assert_identical(to_host(result), expected)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_more_than_2_31_elements(overlapping):
    """A float16 input gradient of 2**31 + 4633 elements: sampled positions (many past 2**31)
    equal TF's sum over the cells containing them, computed here from the sequences."""
    import cupy

    in_rows = in_cols = 46341  # in_rows * in_cols = 2**31 + 4633
    rows = gradops.fractional_pooling_sequence(in_rows, 1.5, True, seed=1)
    cols = gradops.fractional_pooling_sequence(in_cols, 1.44, False, seed=2)
    dy = cupy.random.default_rng(3).standard_normal((1, len(rows) - 1, len(cols) - 1, 1),
                                                   dtype=np.float32).astype(np.float16)
    got = gradops.fractional_avg_pool_grad([1, in_rows, in_cols, 1], dy, rows, cols, overlapping, backend="cuda")
    assert got.shape == (1, in_rows, in_cols, 1) and got.dtype == np.float16

    def cells(sequence, size, index):
        """(cell, cell size) of every cell containing ``index``, in order, from TF's definition."""
        starts = sequence[:-1]
        ends = np.minimum(sequence[1:] - (0 if overlapping else 1), size - 1)
        return [(k, int(ends[k] - starts[k] + 1)) for k in np.flatnonzero((starts <= index) & (index <= ends))]

    rng = np.random.default_rng(4)
    total = in_rows * in_cols
    for index in [0, 2**31 - 1, 2**31, total - 1, *rng.integers(2**31, total, 40).tolist(),
                  *rng.integers(0, total, 20).tolist()]:
        y, x = divmod(int(index), in_cols)
        expected = 0.0
        for row_cell, row_size in cells(rows, in_rows, y):
            for col_cell, col_size in cells(cols, in_cols, x):
                expected += float(dy[0, row_cell, col_cell, 0]) / (row_size * col_size)
        assert got[0, y, x, 0].get().tobytes() == np.float16(expected).tobytes(), (y, x)


@pytest.mark.slow
@pytest.mark.parametrize("path", cuda_launcher.PATHS)
@pytest.mark.parametrize("overlapping", [True, False])
def test_host_more_than_2_31_elements(monkeypatch, overlapping, path):
    """The kernel sources' 64-bit offsets and pooling-table indexing, executed on the CPU
    through the launcher: a float16 input gradient of 2**31 + 7372852 elements (the 64-bit
    instantiations of both kernels).  Only blocks of the last two rows of tiles (cells: of
    chunks of cell rows) run, at the right edge: every element they write lies past the
    2**31-th and is checked against TF's loop restricted to that element's cells (exact: both
    sum in double in TF's order and round once)."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    in_rows, in_cols = 46341, 46500  # in_rows * in_cols = 2**31 + 7372852
    rows = np.array(gradops.fractional_pooling_sequence(in_rows, 1.5, True, seed=1))
    cols = np.array(gradops.fractional_pooling_sequence(in_cols, 1.44, False, seed=2))
    rng = np.random.default_rng(3)
    dy = rng.standard_normal((1, len(rows) - 1, len(cols) - 1, 1)).astype(np.float16)
    g = fractional_pool_geometry(OP, [1, in_rows, in_cols, 1], dy.shape, rows.tolist(), cols.tolist(), overlapping)
    if path == "gather":
        p = cuda_launcher.plan(g, np.float16)
        assert p.index == "long long" and p.row_tiles > 2 and p.grid[0] == p.col_tiles > 4
        first_row = (p.row_tiles - 2) * p.tile_height
        first_col = (p.col_tiles - 4) * p.tile_cols
        expression = cuda_launcher._expression(np.float16, "long long", 1)
        row_blocks = p.row_tiles
    else:
        p = cuda_launcher.cells_plan(g, np.float16)
        assert p.index == "long long" and p.row_chunks > 2 and p.grid[0] == p.column_blocks > 4
        first_row = g.row_partition[(p.row_chunks - 2) * p.chunk_rows]
        first_col = g.col_partition[(p.column_blocks - 4) * p.block_columns]
        expression = cuda_launcher._cells_expression(np.float16, "long long", 1, overlapping)
        row_blocks = p.row_chunks
    assert first_row * in_cols >= 2**31  # every element of the chosen blocks lies past 2**31
    run = [bx + p.grid[0] * by for by in (row_blocks - 2, row_blocks - 1) for bx in range(p.grid[0] - 4, p.grid[0])]
    device = cuda_host.HostDevice(block_filter=lambda expression, grid: run).install(monkeypatch)
    got = cuda_launcher.fractional_avg_pool_grad(g, to_gpu(dy), path=path)[0, :, :, 0]
    assert device.launches[-1][0] == expression
    written = got[first_row:, first_col:]
    assert written.size > 1000 and not np.isnan(written).any()
    assert np.isnan(got[:first_row:1000, ::1000]).all() and np.isnan(got[first_row:, :first_col:100]).all(), \
        "blocks outside the filter did not run"

    def cells(sequence, size, index):
        """(cell, cell size) of every cell containing ``index``, in order, from TF's definition."""
        ends = np.minimum(sequence[1:] - (0 if overlapping else 1), size - 1)
        return [(k, int(ends[k] - sequence[k] + 1)) for k in np.flatnonzero((sequence[:-1] <= index) & (index <= ends))]

    ys, xs = np.meshgrid(np.arange(first_row, in_rows), np.arange(first_col, in_cols), indexing="ij")
    picks = np.concatenate([np.arange(200), np.arange(ys.size - 200, ys.size), rng.choice(ys.size, 200)])
    for y, x in zip(ys.reshape(-1)[picks], xs.reshape(-1)[picks]):
        expected = 0.0
        for row_cell, row_size in cells(rows, in_rows, y):
            for col_cell, col_size in cells(cols, in_cols, x):
                expected += float(dy[0, row_cell, col_cell, 0]) / (row_size * col_size)
        assert got[y, x].tobytes() == np.float16(expected).tobytes(), (y, x)


# ---- the exact share: a test kernel around the kernel source's share computation

SHARE_PROBE = r"""
#include "fractional_avg_pool_grad.cu"
// out[i * V + v]: the kernel's share of a[i * V + v] in a cell of b[i] elements; recip[i]: its 1 / b.
template <typename T, int V>
__global__ void share_probe(const T* a, const long long* b, double* out, double* recip, long long n) {
    GRADOPS_GRID_STRIDE_LOOP(i, n) {
        const double size = static_cast<double>(b[i]);
        const double y = gradops::fractional::reciprocal(size);
        recip[i] = y;
        const auto d = *reinterpret_cast<const gradops::fractional::Vector<T, V>*>(a + i * V);
        gradops::fractional::stage_shares<T, V>(d, size, y, out + i * V);
    }
}
// out[i * V + v]: the disjoint cells kernel's float-computed value of a[i * V + v] in a cell of b[i]
// elements (float16, bfloat16, float32).
template <typename T, int V>
__global__ void float_value_probe(const T* a, const long long* b, T* out, long long n) {
    using gradops::fractional::Vector;
    GRADOPS_GRID_STRIDE_LOOP(i, n) {
        const float size = static_cast<float>(b[i]);
        const auto d = *reinterpret_cast<const Vector<T, V>*>(a + i * V);
        *reinterpret_cast<Vector<T, V>*>(out + i * V) =
            gradops::fractional::float_cell_values<T, V>(d, size, gradops::fractional::float_reciprocal(size));
    }
}
"""
FLOAT_PROBE_TYPES = {"__half": np.float16, "__nv_bfloat16": BFLOAT16, "float": np.float32}
PROBE_TYPES = {"__half": np.float16, "__nv_bfloat16": BFLOAT16, "float": np.float32, "double": np.float64,
               "int": np.int32, "long long": np.int64}


def share_probe_kernels(directory):
    """The probe compiled for the host against the .cu files in ``directory``."""
    (directory / "share_probe.cu").write_text(SHARE_PROBE)
    expressions = [f"share_probe<{t}, {v}>" for t, d in PROBE_TYPES.items() for v in (1, 16 // np.dtype(d).itemsize)]
    expressions += [f"float_value_probe<{t}, {v}>" for t, d in FLOAT_PROBE_TYPES.items()
                    for v in (1, 16 // np.dtype(d).itemsize)]
    return cuda_host.HostKernels("share_probe.cu", expressions, directory)


@pytest.fixture(scope="module")
def share_probe(tmp_path_factory):
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("share_probe")
    shutil.copytree(cuda_host._build.source_dir(), directory, dirs_exist_ok=True)
    return share_probe_kernels(directory)


def probe_shares(kernels, ctype, a, b, vector=1):
    """(shares of a over cells of sizes b (one size per vector), reciprocals of b) from the probe."""
    a = np.ascontiguousarray(a, PROBE_TYPES[ctype])
    b = np.ascontiguousarray(b, np.int64)
    assert a.size == b.size * vector
    out, recip = np.full(a.size, np.nan), np.full(b.size, np.nan)
    kernels.run(f"share_probe<{ctype}, {vector}>", [a, b, out, recip], [b.size])
    return out, recip


def share_mismatches(out, a, b, vector):
    """Where the probe's shares differ from NumPy's correctly rounded float64 division (NaN
    payloads aside), and whether any share is -0.0 (the kernel's sums rely on none being)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.asarray(a).astype(np.float64) / np.repeat(np.asarray(b, np.float64), vector)
    same = (out.view(np.int64) == want.view(np.int64)) | (np.isnan(out) & np.isnan(want)) | ((out == 0) & (want == 0))
    return np.flatnonzero(~same), int(np.count_nonzero((out == 0) & np.signbit(out)))


# Cell sizes b whose 1/b lies within 2**-N / b of a rounding midpoint (b (2M + 1) = 2**N +- 1):
# the hardest reciprocals to round.  Found by factoring 2**N +- 1 for N = 73..103 with sympy
# (divisors b with ceil(log2 b) = N - 53); each is checked below to be that close.  Two Newton
# steps from the host build's starting point round all of them but the smallest wrongly.
HARD_RECIPROCALS = [1188813, 2741673, 10092057, 78396551, 1262270907, 1474361511, 1784159373, 2087350029,
                    73401746733, 106297196643, 4437206506005, 5643810965559, 7050769898553, 70667402454825,
                    82543981440075, 99079191802151, 112603888967275, 134816156452875, 559557773649819]


def test_hard_reciprocal_cases_are_near_midpoints():
    """Each b has an odd M2 in [2**53, 2**54) with b * M2 = 2**N +- 1 (N = 53 + ceil(log2 b)):
    1/b is then 2**-N / b from the midpoint M2 * 2**-N, the closest any 1/b can be."""
    for b in HARD_RECIPROCALS:
        n = 53 + (b - 1).bit_length()
        assert any((2**n + s) % b == 0 and (2**n + s) // b % 2 == 1 and 2**53 <= (2**n + s) // b < 2**54
                   for s in (1, -1)), b


@pytest.mark.parametrize("ctype", list(PROBE_TYPES))
def test_kernel_share_is_the_correctly_rounded_quotient(share_probe, ctype):
    """The kernel's share (reciprocal, FMA-corrected product, Inf/NaN handling) equals NumPy's
    float64 division bit for bit: every float16 and bfloat16 value over cells of 1..96 (and
    1..40) elements; float32 bit patterns (subnormals, extremes, Inf, NaN), int32 and int64
    extremes and float64 bit patterns (tiny, subnormal, huge) over small and large cells up to
    2**50 - 1, in scalar and vector form; no share is -0.0; every reciprocal is RN(1 / b),
    including the hardest-to-round ones."""
    rng = np.random.default_rng(5)
    dtype = np.dtype(PROBE_TYPES[ctype])
    vector = 16 // dtype.itemsize
    large = np.array([2**50 - 1, 2**49 + 1, 2**40 - 3, 3 * 2**33 + 1, 99991, 65537], np.int64)
    if dtype.itemsize == 2:
        values = np.arange(65536, dtype=np.uint16).view(dtype)
        sizes = np.arange(1, 97 if dtype == np.float16 else 41)
        a, b = np.repeat(values, sizes.size), np.tile(sizes, values.size)
        a, b = np.concatenate([a, values[:4096]]), np.concatenate([b, np.resize(large, 4096)])
    else:
        if dtype.kind == "f":
            bits = rng.integers(0, 2 ** (8 * dtype.itemsize), 2**18, dtype=np.uint64).astype(f"u{dtype.itemsize}")
            specials = [0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(dtype).max, -np.finfo(dtype).max,
                        np.finfo(dtype).smallest_subnormal, -np.finfo(dtype).smallest_subnormal, np.finfo(dtype).tiny]
            if dtype == np.float64:
                specials += [2.0**-970, -(2.0**-971), 1.5 * 2.0**-1022, 3 * 2.0**-1074]
                with np.errstate(all="ignore"):  # values spread over the small exponents, subnormals included
                    tiny = rng.integers(0, 2**62, 2**16, dtype=np.uint64).view(np.float64) * 2.0**-1000
                specials += tiny[np.isfinite(tiny)].tolist()
            a = np.concatenate([bits.view(dtype), np.array(specials, dtype)])
        else:
            info = np.iinfo(dtype)
            a = np.concatenate([rng.integers(info.min, info.max, 2**18, dtype=dtype, endpoint=True),
                                np.array([info.min, info.max, 0, 1, -1, 49, 98, 3, 7], dtype)])
        b = np.where(rng.random(a.size) < 0.6, rng.integers(1, 130, a.size), rng.integers(1, 2**50, a.size))
        b[: large.size] = large
    a = a[: a.size // vector * vector]
    b = b[: a.size]
    for v in (1, vector):
        out, recip = probe_shares(share_probe, ctype, a, b[::v], v)
        bad, negative_zeros = share_mismatches(out, a, b[::v], v)
        assert bad.size == 0, (a[bad[:5]], np.repeat(b[::v], v)[bad[:5]])
        assert negative_zeros == 0
    sizes = np.concatenate([np.arange(1, 2**16), HARD_RECIPROCALS, large, rng.integers(1, 2**50, 2**14)])
    _, recip = probe_shares(share_probe, "float", np.ones(sizes.size, np.float32), sizes)
    np.testing.assert_array_equal(recip.view(np.int64), (1.0 / sizes.astype(np.float64)).view(np.int64))


def probe_float_values(kernels, ctype, a, b, vector=1):
    """The disjoint cells kernel's float-computed values of a over cells of sizes b (one a vector)."""
    a = np.ascontiguousarray(a, FLOAT_PROBE_TYPES[ctype])
    b = np.ascontiguousarray(b, np.int64)
    assert a.size == b.size * vector
    out = np.zeros_like(a)
    kernels.run(f"float_value_probe<{ctype}, {vector}>", [a, b, out], [b.size])
    return out


def tf_disjoint_values(a, b):
    """TF's value of a disjoint cell: 0.0 + a / b in float64, rounded once to a's type."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        exact = 0.0 + np.asarray(a).astype(np.float64) / np.asarray(b, np.float64)
    return bfloat16_rounded_once(exact) if np.asarray(a).dtype == BFLOAT16 else exact.astype(np.asarray(a).dtype)


def float_value_cases(ctype, rng):
    """(values, cell sizes) that cover the float path's proof (the .cu file's parts D-F):
    every float16 and bfloat16 value over cells of 1..96 (1..40) elements and over the largest
    sizes it takes; float32 bit patterns, subnormals, exact subnormal midpoints (k 2**-149 over
    even cells), values around 2**-126 b, extremes, Inf and NaN, over small and large cells."""
    dtype = np.dtype(FLOAT_PROBE_TYPES[ctype])
    top = cuda_launcher.FLOAT_SHARE_CELLS
    large = np.array([top, top - 1, top - 3, 4093, 3001, 2049, 2048, 2047, 1025, 255, 127], np.int64)
    if dtype.itemsize == 2:
        values = np.arange(65536, dtype=np.uint16).view(dtype)
        sizes = np.concatenate([np.arange(1, 97 if dtype == np.float16 else 41), large])
        return np.repeat(values, sizes.size), np.tile(sizes, values.size)
    bits = rng.integers(0, 2**32, 2**18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    k = np.arange(1, 2**13, dtype=np.float64)
    subnormal = np.concatenate([k, 2**23 + k, 2**24 - k]) * 2.0**-149  # ties over even b, both sides of 2^-126
    boundary = (2.0**-126 * large[:, None] * (1 + np.array([-2**-23, 0, 2**-23]))).reshape(-1)
    info = np.finfo(np.float32)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, info.max, -info.max, info.tiny, -info.tiny,
                info.smallest_subnormal, -info.smallest_subnormal]
    with np.errstate(invalid="ignore"):  # NaN bit patterns
        a = np.concatenate([bits, subnormal, -subnormal, boundary, -boundary, specials]).astype(np.float32)
    b = rng.integers(1, 130, a.size)
    b[: bits.size // 2] = rng.integers(1, top + 1, bits.size // 2)
    b[bits.size: bits.size + 2 * subnormal.size] = rng.choice([2, 4, 6, 8, 10, 12, 14, 16, 2048, 4096],
                                                              2 * subnormal.size)
    b[-len(specials):] = rng.integers(1, top + 1, len(specials))
    return a, b


@pytest.mark.parametrize("ctype", list(FLOAT_PROBE_TYPES))
def test_kernel_float_value_is_tfs_rounding(share_probe, ctype):
    """The disjoint cells kernel's float path (float16, bfloat16, float32: no FP64) gives TF's
    value T(0.0 + a / b) bit for bit, in scalar and vector form: every float16 and bfloat16
    value over cells of 1..96 (1..40) elements and the largest the launcher gives it; float32 bit
    patterns, subnormal results and their exact midpoints, values at 2**-126 b, Inf and NaN."""
    assert_float_values_are_tfs(share_probe, ctype)


def assert_float_values_are_tfs(kernels, ctype):
    """The probe's values over :func:`float_value_cases` equal TF's bit for bit (NaN where TF's
    are NaN), in scalar and vector form."""
    a, b = float_value_cases(ctype, np.random.default_rng(6))
    vector = 16 // a.dtype.itemsize
    a, b = a[: a.size // vector * vector], b[: a.size // vector * vector]
    for v in (1, vector):
        sizes = np.repeat(b[::v], v)
        got, want = probe_float_values(kernels, ctype, a, b[::v], v), tf_disjoint_values(a, sizes)
        nan = np.isnan(want.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
        bad = np.flatnonzero(got[~nan].view(f"u{a.itemsize}") != want[~nan].view(f"u{a.itemsize}"))
        assert bad.size == 0, (a[~nan][bad[:5]], sizes[~nan][bad[:5]], got[~nan][bad[:5]])


def test_float_value_cases_reach_every_part_of_the_proof():
    """The float32 cases hold results below 2**-126 (part F), exact midpoints of the subnormal
    grid, results that round to -0.0 and Inf and NaN values: the probe test sees each."""
    a, b = float_value_cases("float", np.random.default_rng(6))
    with np.errstate(invalid="ignore"):
        z = a.astype(np.float64) / b
    finite = np.isfinite(z)
    z = np.where(finite, z, 0.0)
    tiny = finite & (np.abs(z) < 2.0**-126) & (z != 0)
    midpoint = tiny & (np.abs(z) / 2.0**-150 % 2 == 1)
    assert tiny.sum() > 10000 and midpoint.sum() > 1000
    assert (np.signbit(tf_disjoint_values(a, b)) & (tf_disjoint_values(a, b) == 0) & (a != 0)).any()
    assert np.isinf(a).any() and np.isnan(a).any()


# ---- bugs planted in copies of the kernel source must fail these tests

PLANTED = {
    # (edit: text -> replacement, what must catch it)
    "missing-barrier-after-staging": (
        "                    __syncthreads();  // the tile's shares are staged\n", "", "host-grid"),
    "missing-barrier-after-reading-the-shares": (  # the next tile's staging overwrites them
        "                    __syncthreads();  // every thread is done reading the shares\n", "", "host-one-block"),
    "second-row-cell-columns-swapped": (  # (0,0), (0,1), (1,1), (1,0) instead of TF's (1,0), (1,1)
        "                                    add_staged_shares<V>(sum, s0 + r);\n                                    add_other_columns(r);\n",
        "                                    add_other_columns(r);\n                                    add_staged_shares<V>(sum, s0 + r);\n",
        "sum-order"),
    "reciprocal-without-correction": (
        "    return fma(fma(-b, q0, a), y, q0);", "    return q0;", "truncation"),
    "reciprocal-missing-last-newton-step": (
        "    return fma(y, fma(-b, y, 1.0), y);\n}", "    return y;\n}", "share-probe"),
    "inf-and-nan-not-detected": (
        "    if (finite_vector(d)) {\n#pragma unroll\n        for (int v = 0; v < V; v += P) {",
        "    if (true) {\n#pragma unroll\n        for (int v = 0; v < V; v += P) {", "nan-inf"),
    # the disjoint cells kernel's float path (float_cell_values): caught by the float value probe
    "float-quotient-without-correction": (
        "    return fmaf(fmaf(-b, q0, a), y, q0);", "    return q0;", "float-probe"),
    "float-subnormal-quotient-not-stepped": (
        "    if (2.0f * fabsf(r) > b * 0x1p-149f) q += r > 0.0f ? 0x1p-149f : -0x1p-149f;", "", "float-probe"),
    "float-subnormal-quotient-not-rescaled": (
        "    float q = mul_rn(float_divide(a * 0x1p64f, b, y), 0x1p-64f);", "    float q = float_divide(a, b, y);",
        "float-probe"),
    "float-second-pass-skipped": ("    if (inexact) {\n#pragma unroll", "    if (false) {\n#pragma unroll", "float-probe"),
    "float-subnormal-results-not-tested": ("        return !(fabsf(q) >= 0x1p-126f || q == 0.0f);",
                                           "        return q != q;", "float-probe"),
    # overlapping cells' float-float sums (round_sum; the default host build takes them)
    "float-sums-neighbours-not-compared": (
        "        return bits16(below) == bits16(above);", "        return true;", "float-sums"),
    "float-sums-float32-interval-not-tested": (
        "        return h + add_directed<true>(low, bound) == h && h + add_directed<false>(low, -bound) == h;", "        return true;",
        "float-sums"),
    "float-sums-undecided-not-redone-in-double": ("                    if (!decided) {", "                    if (false) {",
                                                  "float-sums"),
    "float-sums-remainders-dropped": ("    e = mul_rn(fmaf(-b, q, a), y);", "    e = 0.0f;", "float-sums"),
    "float-sums-tiny-float32-summed-in-float": ("bool decided = !tiny;", "bool decided = true;", "float-sums"),
    "direct-path-column-cells-in-reverse": (
        "                                for (I ki = col_begin; ki < col_end; ++ki) {\n                                    const I col_cell = col_cells[ki];",
        "                                for (I ki = col_end - 1; ki >= col_begin; --ki) {\n                                    const I col_cell = col_cells[ki];",
        "sum-order-direct"),
}


def planted_check(kernels, check, rng):
    """Run one of the checks that must catch a planted bug; raises AssertionError when it does."""
    if check in ("host-grid", "host-one-block"):
        rows = gradops.fractional_pooling_sequence(33, 1.44, True, seed=3)
        cols = gradops.fractional_pooling_sequence(20, 1.5, False, seed=4)
        with cuda_host.capped_grids() if check == "host-one-block" else contextlib.nullcontext():
            for dtype in (np.float32, np.float16):
                kwargs, expected = pool_case(rng, (2, 33, 20, 16), rows, cols, True, dtype)
                assert_identical(run_on_host(kernels, kwargs, "shuffled", 3), expected)
    elif check in ("sum-order", "sum-order-direct"):
        # float64 sums of three or four shares round differently in another order (bits compared)
        force = dict(share_cells=0) if check == "sum-order-direct" else {}
        rows = gradops.fractional_pooling_sequence(17, 1.44, True, seed=5)
        cols = gradops.fractional_pooling_sequence(15, 1.44, True, seed=6)
        kwargs, expected = pool_case(rng, (2, 17, 15, 4), rows, cols, True, np.float64)
        assert_identical(run_on_host(kernels, kwargs, **force), expected)
    elif check == "float-sums":  # next to rounding midpoints, and generated sequences, overlapping
        for dtype in (np.float16, np.float32):
            kwargs, expected, _ = near_midpoint_case(dtype, rng)
            assert_identical(run_on_host(kernels, kwargs, path="cells"), expected)
        rows = gradops.fractional_pooling_sequence(21, 1.44, True, seed=8)
        cols = gradops.fractional_pooling_sequence(19, 1.44, False, seed=9)
        for dtype in (np.float16, BFLOAT16, np.float32):
            kwargs, expected = pool_case(rng, (2, 21, 19, 16), rows, cols, True, dtype)
            assert_identical(run_on_host(kernels, kwargs, path="cells"), expected)
        kwargs, expected = tiny_float32_case(1)
        assert_identical(run_on_host(kernels, kwargs, path="cells"), expected)
    elif check == "truncation":
        dy = np.full((1, 1, 1, 4), 49, np.int32)  # 49 / 49 is 1; 49 * RN(1/49) is 0.9999999999999999
        kwargs = dict(orig_input_tensor_shape=np.array([1, 7, 7, 4]), out_backprop=dy,
                      row_pooling_sequence=np.array([0, 7]), col_pooling_sequence=np.array([0, 7]), overlapping=False)
        np.testing.assert_array_equal(run_on_host(kernels, kwargs), np.ones((1, 7, 7, 4), np.int32))
    elif check == "nan-inf":
        dy = np.ones((1, 2, 2, 8), np.float16)
        dy[0, 0, 0, 3], dy[0, 1, 1, 5] = np.inf, -np.inf
        kwargs = dict(orig_input_tensor_shape=np.array([1, 4, 4, 8]), out_backprop=dy,
                      row_pooling_sequence=np.array([0, 2, 4]), col_pooling_sequence=np.array([0, 2, 4]), overlapping=False)
        got = run_on_host(kernels, kwargs)
        assert got[0, 0, 0, 3] == np.inf and got[0, 3, 3, 5] == -np.inf


def test_planted_checks_pass_on_the_real_source(host_kernels, share_probe, rng):
    """The checks the planted bugs must fail pass on the real kernel source."""
    for check in {check for _, _, check in PLANTED.values()} - {"share-probe", "float-probe"}:
        planted_check(host_kernels, check, rng)
    sizes = np.array(HARD_RECIPROCALS)
    _, recip = probe_shares(share_probe, "float", np.ones(sizes.size, np.float32), sizes)
    np.testing.assert_array_equal(recip, 1.0 / sizes)


class LaunchRecorder:
    """A HostKernels that lists the instantiations launched through it."""

    def __init__(self, kernels):
        self.kernels, self.expressions = kernels, []

    def launch(self, expression, *args, **kwargs):
        if expression not in self.expressions:
            self.expressions.append(expression)
        return self.kernels.launch(expression, *args, **kwargs)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_kernel_bugs_are_caught(bug, tmp_path, rng, host_kernels):
    text, replacement, check = PLANTED[bug]
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, (text, replacement))
    if check == "share-probe":
        sizes = np.array(HARD_RECIPROCALS)
        _, recip = probe_shares(share_probe_kernels(tmp_path), "float", np.ones(sizes.size, np.float32), sizes)
        assert not np.array_equal(recip, 1.0 / sizes)
        return
    if check == "float-probe":  # some dtype's values differ from TF's (the real source's pass: the probe test)
        kernels = share_probe_kernels(tmp_path)
        failures = 0
        for ctype in FLOAT_PROBE_TYPES:
            try:
                assert_float_values_are_tfs(kernels, ctype)
            except AssertionError:
                failures += 1
        assert failures > 0
        return
    # The edited copy builds only the instantiations the check launches (g++ takes seconds for
    # all of the file's), as the real source's run of it (its own random data) lists them.
    recorder = LaunchRecorder(host_kernels)
    planted_check(recorder, check, np.random.default_rng(0))
    kernels = cuda_host.HostKernels(cuda_launcher.SOURCE, recorder.expressions, tmp_path)
    with pytest.raises((AssertionError, cuda_host.HostLaunchError)):
        planted_check(kernels, check, rng)


# ---- vectors of channels with Inf and NaN in every lane

@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=[np.dtype(d).name for d in FLOAT_DTYPES])
@pytest.mark.parametrize("path", ["planned", "direct", "scalar"])
def test_kernel_source_on_host_inf_and_nan_in_vectors(host_kernels, rng, dtype, path):
    """Inf, -Inf and NaN in every lane of the 16-byte vectors, on the staged and direct paths:
    NaN exactly where TF's loop has NaN, every other element bit for bit."""
    shape = (2, 9, 7, 16)
    rows = gradops.fractional_pooling_sequence(9, 1.44, True, seed=1)
    cols = gradops.fractional_pooling_sequence(7, 1.44, True, seed=2)
    for overlapping in (False, True):
        kwargs, _ = pool_case(rng, shape, rows, cols, overlapping, dtype)
        dy = kwargs["out_backprop"]
        flat = dy.reshape(-1)
        for lane, value in enumerate([np.inf, -np.inf, np.nan] * 6):
            flat[(lane * 37 + lane) % flat.size] = value
        expected = exact_grad(shape, dy, rows, cols, overlapping)
        got = run_on_host(host_kernels, kwargs, **FORCED_PATHS[path])
        assert np.isnan(expected.astype(np.float64)).any() and np.isinf(expected.astype(np.float64)).any()
        nan = np.isnan(expected.astype(np.float64))
        np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
        np.testing.assert_array_equal(got[~nan].view(f"u{got.itemsize}"), expected[~nan].view(f"u{got.itemsize}"))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=["int32", "int64"])
def test_kernel_source_on_host_exact_integer_quotients(host_kernels, dtype):
    """k * 49 over a 7x7 cell is k exactly: truncation keeps k (a reciprocal multiply alone gives
    k - 1 for k = 1, 2, 3, 4, 6, ...), on every path and over a vector of channels."""
    k = np.arange(-20, 20).astype(dtype)
    dy = (k * 49).reshape(1, 1, 1, 40)
    kwargs = dict(orig_input_tensor_shape=np.array([1, 7, 7, 40]), out_backprop=dy,
                  row_pooling_sequence=np.array([0, 7]), col_pooling_sequence=np.array([0, 7]), overlapping=False)
    for path in FORCED_PATHS.values():
        np.testing.assert_array_equal(run_on_host(host_kernels, kwargs, **path), np.broadcast_to(k, (1, 7, 7, 40)))


# ---- device copies of the cell tables: uploaded once per geometry, device and stream

def count_table_uploads(monkeypatch):
    """Spy on the stand-in's ``cupy.asarray``: the uploads of host arrays (the launcher's tables;
    the tests move their tensors before spying)."""
    import sys

    cupy = sys.modules["cupy"]
    uploads = []
    real = cupy.asarray

    def asarray(x, *args, **kwargs):
        if isinstance(x, np.ndarray) and not isinstance(x, cuda_host.HostArray):
            uploads.append(x.dtype)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(cupy, "asarray", asarray)
    return uploads


def test_cell_tables_are_uploaded_once_per_geometry_device_and_stream(monkeypatch, rng):
    import types

    device = cuda_host.HostDevice().install(monkeypatch)
    import cupy

    rows_a, cols_a = [0, 2, 3, 5, 7], [0, 1, 3, 4, 6, 8]
    rows_b = [0, 3, 5, 7, 7]
    dy = rng.standard_normal((2, 4, 5, 3)).astype(np.float32)
    on_0, on_0_double = to_gpu(dy), to_gpu(dy.astype(np.float64))
    with cupy.cuda.Device(1):
        on_1 = to_gpu(dy)
    uploads = count_table_uploads(monkeypatch)

    def call(x, rows, overlapping=False):
        got = gradops.fractional_avg_pool_grad([2, 7, 8, 3], x, rows, cols_a, overlapping, backend="cuda")
        want = gradops.fractional_avg_pool_grad([2, 7, 8, 3], to_host(x), rows, cols_a, overlapping, backend="numpy")
        np.testing.assert_array_equal(to_host(got), want)

    call(on_0, rows_a)
    assert len(uploads) == 1 and uploads[0] == np.int32   # one packed upload, 32-bit tables
    call(on_0, rows_a)
    call(on_0_double, rows_a)                             # same cells and tile shape: nothing uploaded
    assert len(uploads) == 1
    call(on_0, rows_b)                                    # another geometry
    assert len(uploads) == 2
    call(on_0, rows_a, overlapping=True)                  # overlapping cells are other cells
    assert len(uploads) == 3
    with cupy.cuda.Device(1):                             # another device
        call(on_1, rows_a)
        assert len(uploads) == 4
        call(on_1, rows_a)
        assert len(uploads) == 4
    # another stream (CuPy's current stream; the stand-in has one, so one is faked here)
    streams = iter([types.SimpleNamespace(ptr=1234)] * 2 + [types.SimpleNamespace(ptr=0)])
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda: next(streams), raising=False)
    call(on_0, rows_a)
    call(on_0, rows_a)
    assert len(uploads) == 5
    call(on_0, rows_a)                                    # stream 0 is not the stand-in's "no stream"
    assert len(uploads) == 6
    # the cells kernel for the disjoint partitions, gather for the rest; each path's tables cached
    kernels = {name.split("<")[0] for name, _, _ in device.launches}
    assert kernels == {"gradops::fractional_avg_pool_grad", "gradops::fractional_avg_pool_grad_cells"}


def test_cell_table_cache_is_a_small_lru(monkeypatch, rng):
    """At most TABLE_CACHE_SIZE geometries are kept; the least recently used goes first."""
    cuda_host.HostDevice().install(monkeypatch)
    size = cuda_launcher.TABLE_CACHE_SIZE
    dy = to_gpu(rng.standard_normal((1, 2, 1, 1)))
    uploads = count_table_uploads(monkeypatch)

    def call(i):  # geometry i: rows [0, 1 + i, 2 + 2 i] of a (2 + 2 i)-row input
        gradops.fractional_avg_pool_grad([1, 2 + 2 * i, 3, 1], dy, [0, 1 + i, 2 + 2 * i], [0, 3], backend="cuda")

    for i in range(size):
        call(i)
    assert len(uploads) == size
    call(0)                      # refreshes geometry 0
    call(size)                   # evicts geometry 1, the least recently used
    assert len(uploads) == size + 1
    call(0)
    assert len(uploads) == size + 1
    call(1)
    assert len(uploads) == size + 2


def test_cell_table_cache_keeps_a_byte_budget(monkeypatch, rng):
    """Past TABLE_CACHE_BYTES in all the least recently used tables go first, and tables larger
    than the budget are uploaded for their call only, evicting nothing."""
    import sys

    from gradops.backends.cuda import _runtime

    cuda_host.HostDevice().install(monkeypatch)
    dy = to_gpu(rng.standard_normal((1, 3, 1, 1)))
    uploads = count_table_uploads(monkeypatch)
    sizes = {}
    real_asarray = sys.modules["cupy"].asarray

    def call(i):  # geometry i: two cells of all 2 + 2 i rows (gather's tables grow with i)
        def measured(x, *args, **kwargs):
            out = real_asarray(x, *args, **kwargs)
            sizes[i] = out.nbytes
            return out

        with monkeypatch.context() as patch:
            patch.setattr(sys.modules["cupy"], "asarray", measured)
            gradops.fractional_avg_pool_grad([1, 2 + 2 * i, 3, 1], dy, [0, 2 + 2 * i, 0, 2 + 2 * i], [0, 3],
                                             True, backend="cuda")

    for i in (0, 1, 2, 40):
        call(i)
    assert sizes[0] < sizes[1] < sizes[2] and sizes[0] + sizes[1] + sizes[2] < sizes[40]
    _runtime.clear_table_cache()
    monkeypatch.setattr(_runtime, "TABLE_CACHE_BYTES", sizes[1] + sizes[2])
    del uploads[:]
    for i in (0, 1, 2):        # 0 and 1 fit; 2 pushes the total past the budget: 0 goes
        call(i)
    for i in (1, 2):
        call(i)
    assert len(uploads) == 3
    call(0)                    # uploaded again; 1, now the least recently used, goes
    call(2)
    assert len(uploads) == 4
    call(40)
    call(40)                   # larger than the budget: never kept, and 2 and 0 stay
    assert len(uploads) == 6
    call(2)
    call(0)
    assert len(uploads) == 6
    call(1)
    assert len(uploads) == 7
    assert sum(entry[0].nbytes for entry in _runtime._table_cache.values()) <= _runtime.TABLE_CACHE_BYTES


def test_host_cell_tables_are_kept_only_when_small(monkeypatch, rng):
    """Each dimension's host cell lists are kept between calls up to CACHED_CELL_ENTRIES pairs;
    larger ones are rebuilt per call (and give the same result)."""
    cuda_host.HostDevice().install(monkeypatch)
    rows = [0, 5, 2, 9, 0, 12]
    kwargs, expected = pool_case(rng, (1, 12, 6, 8), rows, [0, 2, 4, 6], True, np.float64)
    dy = to_gpu(kwargs["out_backprop"])
    cuda_launcher._kept_cells.cache_clear()
    monkeypatch.setattr(cuda_launcher, "CACHED_CELL_ENTRIES", 12)  # the 7 column pairs kept, not the 27 row pairs
    for _ in range(2):
        cuda_launcher.clear_table_cache()
        got = gradops.fractional_avg_pool_grad(**dict(kwargs, out_backprop=dy), backend="cuda")
        assert_identical(to_host(got), expected)
    kept = cuda_launcher._kept_cells.cache_info()
    assert (kept.currsize, kept.misses) == (1, 1)  # the columns' lists, built once


def test_cached_tables_keep_the_cupy_module_they_are_keyed_by(rng):
    """The table cache keys by the CuPy module's id (the tests' stand-in is a new module per
    emulated GPU), and its entry keeps that module: no later module can take the id while the
    entry lives and be handed the dead stand-in's tables.  (Before, a hypothesis test that
    replayed a geometry could: "a pointer argument is not in device memory", 2026-12-02.)"""
    import gc
    import sys
    import weakref

    from gradops.backends.cuda import _runtime

    if reason := cuda_host.unavailable_reason():
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    with pytest.MonkeyPatch.context() as patch:
        cuda_host.HostDevice().install(patch)
        module = weakref.ref(sys.modules["cupy"])
        dy = to_gpu(rng.standard_normal((1, 2, 1, 1)))
        gradops.fractional_avg_pool_grad([1, 2, 3, 1], dy, [0, 1, 2], [0, 3], backend="cuda")
        del dy
    gc.collect()
    assert module() is not None
    _runtime.clear_table_cache()
    gc.collect()
    assert module() is None  # the cache was what kept it


def test_launcher_constants_are_the_kernels():
    """The launcher sizes tiles with the kernel's shared-memory capacity, cell padding and block
    vectors: the numbers in the .cu file."""
    import re

    source = (cuda_host._build.source_dir() / cuda_launcher.SOURCE).read_text()
    constants = dict(re.findall(r"constexpr int (k\w+) = (\d+);", source))
    assert int(constants["kShareCapacity"]) == cuda_launcher.SHARE_CAPACITY
    assert int(constants["kCellPad"]) == cuda_launcher.CELL_PAD
    assert int(constants["kBlockVectors"]) == cuda_launcher.BLOCK_VECTORS
    assert cuda_launcher.SHARE_CAPACITY * 8 <= cuda_host.MAX_DYNAMIC_SHARED_BYTES  # static shared memory: 48 KiB


@pytest.mark.parametrize("capped", [False, True], ids=["grid", "capped-grid"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=["float16", "float32", "float64"])
def test_cuda_racecheck(racecheck_device, dtype, capped):
    """No shared-memory hazard in the gather kernel's shared cell sums or the cells kernel
    (racecheck builds on the host, which fail a launch at the first one), overlapping or not,
    with the launcher's grid and with one block a dimension, which loops over its tiles."""
    import contextlib

    import cuda_host

    rng = np.random.default_rng(19)
    rows = gradops.fractional_pooling_sequence(45, 1.44, True, seed=7)
    cols = gradops.fractional_pooling_sequence(23, 1.44, False, seed=8)
    with cuda_host.capped_grids() if capped else contextlib.nullcontext():
        for overlapping in (False, True):
            check_cuda(*pool_case(rng, (3, 45, 23, 16), rows, cols, overlapping, dtype))


#: Forced choices of the launcher for the tiny maps: each kernel with 16-byte channel vectors
#: where the depth allows and with one channel a thread, 64-bit indices, the gather kernel's
#: direct shares and one row a thread, the cells kernel's one-row chunks.
TINY_CHOICES = {"auto": {}, "gather": dict(path="gather"), "gather-scalar": dict(path="gather", vector=1),
                "gather-64": dict(path="gather", index="long long", rows_per_thread=1, share_cells=0),
                "cells": dict(path="cells"), "cells-scalar": dict(path="cells", vector=1),
                "cells-64": dict(path="cells", index="long long", chunk_rows=1)}


@pytest.mark.parametrize("choice", list(TINY_CHOICES))
@pytest.mark.parametrize("dtype", FRACTIONAL_POOL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_cuda_tiny_maps_memcheck(racecheck_device, choice, dtype):
    """Each kernel on tiny maps, disjoint and overlapping, in racecheck builds: no access outside
    out_backprop, the cell tables or the input gradient (the guard bytes around each array), no
    shared-memory hazard, TF's bits.  A forced kernel that cannot run a case (the cells kernel
    on cells that do not partition the input) skips it; each runs at least one."""
    rng = np.random.default_rng(41)
    ran = 0
    for shape, rows, cols in TINY_POOLS:
        for overlapping in (False, True):
            kwargs, expected = pool_case(rng, shape, rows, cols, overlapping, dtype)
            try:
                got = cuda_launcher.fractional_avg_pool_grad(host_geometry(kwargs), to_gpu(kwargs["out_backprop"]),
                                                             **TINY_CHOICES[choice])
            except ValueError as error:
                if "cells kernel takes" not in str(error):
                    raise
                continue
            assert_identical(to_host(got), expected)
            ran += 1
    assert ran >= (2 * len(TINY_POOLS) if choice == "auto" else 1), f"{choice} ran {ran} cases"


def test_gpu_tables_that_cannot_fit_in_the_gpus_memory_are_refused(monkeypatch):
    """The same 2**17 (row, cell) pairs fit in the host's memory but their GPU tables (1 MiB at
    64-bit indexing) do not fit in a GPU of 512 KiB: refused before any upload, naming the
    sequences and the GPU (the stand-in's memory, which is otherwise the host's); with 2 MiB
    computed."""
    from gradops import _arrays

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice().install(monkeypatch)
    n, in_rows = 1024, 256
    rows = [0, in_rows] * (n // 2) + [0]
    args = (np.array([1, in_rows, 1, 1]), to_gpu(np.ones((1, n, 1, 1))), rows, [0, 1], True)
    monkeypatch.setattr(_arrays, "_device_memory_bytes", lambda arrays: 2**19)
    with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence.*the GPU's 524288 bytes"):
        gradops.fractional_avg_pool_grad(*args, backend="cuda")
    assert not device.launches
    monkeypatch.setattr(_arrays, "_device_memory_bytes", lambda arrays: 2**21)
    np.testing.assert_array_equal(to_host(gradops.fractional_avg_pool_grad(*args, backend="cuda")),
                                  np.full((1, in_rows, 1, 1), 2.0))


@pytest.mark.parametrize("rows, cols, overlapping", [
    ([0, 256] * 512 + [0], [0, 1], True),
    ([0, 3, 5, 9, 12], [0, 2, 5, 7], False),
    ([0, 5, 2, 9, 0, 12], [0, 7, 7, 1, 3], True),
])
def test_gpu_table_bound_covers_the_uploaded_tables(rows, cols, overlapping):
    """The refusal's bound is at least what the gather and cells kernels upload, 64-bit."""
    from gradops.fractional_avg_pool import gpu_table_bytes

    in_rows, in_cols = max(rows), max(cols)
    g = host_geometry({"orig_input_tensor_shape": [1, in_rows, in_cols, 8],
                       "out_backprop": np.ones((1, len(rows) - 1, len(cols) - 1, 8), np.float32),
                       "row_pooling_sequence": rows, "col_pooling_sequence": cols, "overlapping": overlapping})
    plan = cuda_launcher.plan(g, np.float32, index="long long")
    uploaded = [sum(t.nbytes for t in cuda_launcher.kernel_tables(g, plan))]
    if g.row_partition is not None and g.col_partition is not None:
        cells_plan = cuda_launcher.cells_plan(g, np.float32, index="long long")
        uploaded.append(sum(t.nbytes for t in cuda_launcher.cells_tables(g, cells_plan)))
    assert 0 < max(uploaded) <= gpu_table_bytes(g)


@pytest.mark.parametrize("dtype", [np.float32, BFLOAT16], ids=["float32", "bfloat16"])
def test_cuda_smaller_out_backprop(cuda_device, rng, dtype):
    """Fewer images and channels than the input on the GPU path: padded on the arrays' device,
    the NumPy backend's result."""
    dy = rng.standard_normal((2, 3, 2, 16)).astype(dtype)[:1, :, :, :12]
    args = ([2, 6, 5, 16], dy, [0, 2, 4, 6], [0, 2, 5], True)
    expected = gradops.fractional_avg_pool_grad(*args)
    got = gradops.fractional_avg_pool_grad(args[0], to_gpu(dy), *args[2:], backend="cuda")
    np.testing.assert_array_equal(to_host(got), expected)
    assert to_host(got).dtype == expected.dtype
