"""fractional_max_pool_grad and fractional_max_pool: brute force, TF parity, NaN, validation.

The brute-force reference (reference.py) is TF's kernel loop (fractional_max_pool_op.cc)
written out: for each batch, row cell, column cell, scan rows then columns, per channel take
the first element and replace it by any strictly greater one; then add out_backprop, in
output order, to the chosen elements.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gradops
from gradops._dtypes import FRACTIONAL_POOL_DTYPES

from conftest import FLOAT_DTYPES, to_gpu, to_host
from pooling_cases import TINY_POOLS, max_pool_grad_sequences, pool_sequence
from reference import fractional_max_pool_grad as brute_grad
from reference import fractional_max_pool as brute_forward
from reference import fractional_max_pool_select as brute_select

ALL_DTYPES = FLOAT_DTYPES + [np.int32, np.int64]
TF_DTYPES = [np.float32, np.float64, np.int32, np.int64]


def random_sequence(rng, size, count, overlapping):
    """Increasing cells covering ``size``, count of them, each non-empty."""
    if overlapping:
        inner = np.sort(rng.choice(np.arange(1, size - 1), count - 1, replace=False)) if count > 1 else []
        return [0, *map(int, inner), size - 1 if rng.random() < 0.5 else size]
    inner = np.sort(rng.choice(np.arange(1, size), count - 1, replace=False)) if count > 1 else []
    return [0, *map(int, inner), size]


def tied_input(rng, shape, dtype):
    """Few distinct values, so cells hold ties."""
    return rng.integers(-2, 3, shape).astype(dtype)


def forward_then_grad(x, rows, cols, overlapping, rng, backend="numpy"):
    y = gradops.fractional_max_pool(x, rows, cols, overlapping, backend=backend)
    dy = rng.integers(-3, 4, y.shape).astype(x.dtype)
    return y, dy, gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend=backend)


# --------------------------------------------------------------------------- brute force


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force(dtype, overlapping, seed):
    rng = np.random.default_rng(seed)
    n, h, w, c = 2, int(rng.integers(3, 8)), int(rng.integers(3, 8)), int(rng.integers(1, 4))
    out_rows, out_cols = int(rng.integers(1, h - 1)), int(rng.integers(1, w - 1))
    rows = random_sequence(rng, h, out_rows, overlapping)
    cols = random_sequence(rng, w, out_cols, overlapping)
    x = tied_input(rng, (n, h, w, c), dtype)
    _, maxima = brute_select(x, rows, cols, out_rows, out_cols, overlapping)
    y, dy, grad = forward_then_grad(x, rows, cols, overlapping, rng)
    np.testing.assert_array_equal(y, maxima)
    want = brute_grad(x, dy, rows, cols, overlapping)
    assert grad.dtype == np.dtype(dtype) and grad.shape == x.shape
    np.testing.assert_array_equal(grad, want)


@pytest.mark.parametrize("overlapping, rows, cols", [
    (True, [0, 2, 2, 4], [1, 1, 3, 5]),  # equal entries: one-row / one-column cells, stacked
    (True, [0, 4, 4], [0, 0, 0, 6]),  # the same single column twice
    (False, [0, 1, 9], [2, 3, 5, 50]),  # ends past the input are clamped; column 0, 1 unused
    (False, [4, 5], [0, 6]),  # one cell, rows 0..3 unused
])
def test_hand_made_sequences(overlapping, rows, cols):
    """Hand-made sequences, read as TF reads them.  Every cell must be non-empty, so sequences
    increase (non-overlapping) or never decrease (overlapping)."""
    rng = np.random.default_rng(7)
    x = tied_input(rng, (2, 5, 6, 2), np.float32)
    out_rows, out_cols = len(rows) - 1, len(cols) - 1
    _, maxima = brute_select(x, rows, cols, out_rows, out_cols, overlapping)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    np.testing.assert_array_equal(y, maxima)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    grad = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)
    np.testing.assert_array_equal(grad, brute_grad(x, dy, rows, cols, overlapping))


def test_ties_go_to_first_in_row_major_scan():
    x = np.array([1, 5, 5, 2, 5, 0, 3, 3, 1], np.float32).reshape(1, 3, 3, 1)
    grad = gradops.fractional_max_pool_grad(x, np.full((1, 1, 1, 1), 5, np.float32),
                                            np.ones((1, 1, 1, 1), np.float32), [0, 3], [0, 3])
    assert grad.reshape(-1).tolist() == [0, 1, 0, 0, 0, 0, 0, 0, 0]
    # Column before row: (0, 2) is later in the scan than (0, 1) but earlier than (1, 0).
    x = np.array([0, 1, 7, 7], np.float64).reshape(1, 2, 2, 1)
    grad = gradops.fractional_max_pool_grad(x, np.full((1, 1, 1, 1), 7.0), np.ones((1, 1, 1, 1)), [0, 2], [0, 2])
    assert grad.reshape(-1).tolist() == [0, 0, 1, 0]
    # +0.0 and -0.0 compare equal: the first one wins.
    assert _one_cell([-0.0, 0.0], 0.0).reshape(-1).tolist() == [1, 0]
    assert _one_cell([0.0, -0.0], -0.0).reshape(-1).tolist() == [1, 0]


def test_overlapping_boundary_element_sums_both_cells():
    x = np.array([0, 0, 9, 0, 0], np.float64).reshape(1, 1, 5, 1).repeat(2, axis=0)
    y = gradops.fractional_max_pool(x, [0, 1], [0, 2, 4], True)
    assert y.reshape(-1).tolist() == [9, 9] * 2
    dy = np.array([2.0, 3.0, 4.0, 0.5]).reshape(2, 1, 2, 1)
    grad = gradops.fractional_max_pool_grad(x, y, dy, [0, 1], [0, 2, 4], True)
    assert grad.reshape(-1).tolist() == [0, 0, 5, 0, 0, 0, 0, 4.5, 0, 0]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_types_select_as_float32_and_sum_in_float32(dtype):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 7, 3)).astype(dtype)
    rows, cols = [0, 2, 4, 6], [0, 3, 5, 7]
    y = gradops.fractional_max_pool(x, rows, cols)
    np.testing.assert_array_equal(y.astype(np.float32), gradops.fractional_max_pool(x.astype(np.float32), rows, cols))
    dy = rng.standard_normal(y.shape).astype(dtype)
    grad = gradops.fractional_max_pool_grad(x, y, dy, rows, cols)
    want = gradops.fractional_max_pool_grad(x.astype(np.float32), y.astype(np.float32), dy.astype(np.float32),
                                            rows, cols).astype(dtype)
    np.testing.assert_array_equal(grad.astype(np.float32), want.astype(np.float32))


# --------------------------------------------------------------------------- memory


# Repeated entries pool one long input dimension into one cell while the other sequence repeats
# 0, making many one-element cells: the cells' total size is then in_rows x out_cols, not the
# input's size.  TF walks the cells one by one; the NumPy backend gathers them in chunks.
LONG = 2**13
MANY_CELLS = [(1, LONG, 1, 1), [0, LONG], [0] * (LONG // 2)]


@pytest.mark.parametrize("transposed", [False, True], ids=["long-rows", "long-cols"])
def test_cells_covering_the_input_many_times_are_gathered_in_bounded_memory(transposed):
    """Before chunking, the forward op held 128-256 MiB and the gradient 160-416 MiB for this
    32 KiB input and 16 KiB result (measured with tracemalloc); now a few MiB: the chunk
    floor (1 MiB of float32) and its working copies."""
    import tracemalloc

    shape, rows, cols = MANY_CELLS
    if transposed:
        shape, rows, cols = (1, 1, LONG, 1), cols, rows
    x = np.random.default_rng(5).permutation(LONG).astype(np.float32).reshape(shape)
    tracemalloc.start()
    try:
        y = gradops.fractional_max_pool(x, rows, cols, True)
        dy = np.arange(y.size, dtype=np.float32).reshape(y.shape)
        grad = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    # Every cell is the whole input line (the long cell x one element 0 of the other axis):
    # each pools the line's maximum, and all of out_backprop goes to it (integer sums below
    # 2**24, exact in float32).
    assert y.size == LONG // 2 - 1 and (y == x.max()).all()
    want = np.zeros(LONG, np.float32)
    want[np.argmax(x)] = dy.sum()
    np.testing.assert_array_equal(grad.reshape(-1), want)


@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32], ids=lambda d: np.dtype(d).name)
def test_chunked_windows_match_brute_force(monkeypatch, overlapping, dtype):
    """With chunks of one cell, of a few cells and of whole size groups, chunk boundaries
    cross rows, columns and both: the results must still be TF's, element for element."""
    from gradops.backends import numpy_backend

    rng = np.random.default_rng(11)
    x = tied_input(rng, (2, 9, 8, 3), dtype)
    rows = random_sequence(rng, 9, 6, overlapping)
    cols = random_sequence(rng, 8, 5, overlapping)
    cells = (len(rows) - 1) * (len(cols) - 1)
    _, maxima = brute_select(x, rows, cols, len(rows) - 1, len(cols) - 1, overlapping)
    chunks = []
    real = numpy_backend._cell_windows

    def counted(g, value):
        for part in real(g, value):
            chunks.append((part[0].size * part[1].size, len(value)))  # (cells, images)
            yield part

    monkeypatch.setattr(numpy_backend, "_cell_windows", counted)
    monkeypatch.setattr(numpy_backend, "WINDOW_CHUNK_FACTOR", 0)
    for budget in (1, 150, 10**6):  # elements: one cell a chunk, a few cells, every group whole
        monkeypatch.setattr(numpy_backend, "WINDOW_CHUNK_MIN_ELEMENTS", budget)
        chunks.clear()
        y, dy, grad = forward_then_grad(x, rows, cols, overlapping, rng)
        np.testing.assert_array_equal(y, maxima)
        np.testing.assert_array_equal(grad, brute_grad(x, dy, rows, cols, overlapping))
        # the forward and the gradient (whole batch, or runs of images) each visit every
        # cell of every image once
        assert sum(c * n for c, n in chunks) == 2 * cells * len(x)
        if budget == 1:
            assert max(c for c, _ in chunks) == 1
        if budget == 150:
            assert 1 < max(c for c, _ in chunks) < cells


@pytest.mark.parametrize("overlapping", [False, True])
def test_numpy_batch_runs_on_the_thread_pool(monkeypatch, overlapping):
    """The NumPy backend takes runs of images on its thread pool: with runs of two images (the
    last one short) every image is in one run, the result is the reference's (float32 sums of
    up to four terms in output order, where overlapping cells share a corner) and its bits do
    not depend on the number of workers."""
    from gradops.backends import numpy_backend as nb

    rng = np.random.default_rng(5)
    x = rng.standard_normal((5, 9, 8, 3)).astype(np.float32)
    rows, cols = random_sequence(rng, 9, 5, overlapping), random_sequence(rng, 8, 4, overlapping)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    per_image = (x[0].nbytes * 2 + y[0].nbytes * 2 + y[0].size * 8)  # inputs, gradient, chosen offsets
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 2 * per_image)
    runs = []
    windows = nb._cell_windows

    def recorded(g, value):
        runs.append(len(value))
        return windows(g, value)

    monkeypatch.setattr(nb, "_cell_windows", recorded)
    results = []
    for workers in (1, 2, 3):
        monkeypatch.setattr(nb, "_WORKERS", workers)
        results.append(gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping))
    assert sorted(runs) == [1] * 3 + [2] * 6
    np.testing.assert_array_equal(results[0], brute_grad(x, dy, rows, cols, overlapping))
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])


def test_numpy_batch_runs_report_the_first_mismatch_in_batch_order(monkeypatch):
    """Where images 1 and 3 both break orig_output, the error names image 1's element, also when
    the run holding image 3 finishes first."""
    import threading
    import time

    from gradops.backends import numpy_backend as nb

    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 6, 6, 2)).astype(np.float32)
    rows, cols = [0, 2, 4, 6], [0, 3, 6]
    y = gradops.fractional_max_pool(x, rows, cols)
    y[3, 1, 0, 0] += 1
    y[1, 2, 1, 1] -= 1
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)  # one image a run
    monkeypatch.setattr(nb, "_WORKERS", 4)
    windows = nb._cell_windows
    slow = []

    def delayed(g, value):
        if np.shares_memory(value, x[1]):  # image 1's run checks last
            slow.append(threading.get_ident())
            time.sleep(0.2)
        return windows(g, value)

    monkeypatch.setattr(nb, "_cell_windows", delayed)
    with pytest.raises(gradops.InvalidArgumentError, match=r"at \[1, 2, 1, 1\] orig_output holds"):
        gradops.fractional_max_pool_grad(x, y, np.ones_like(y), rows, cols)
    assert slow  # x reached the backend as passed, and image 1 was delayed


# The NumPy backend finds each cell's chosen element by a scan (small cells) or by argmax.
MAXIMUM_SEARCHES = {"scan": 10**9, "argmax": 0}


@pytest.mark.parametrize("search", list(MAXIMUM_SEARCHES))
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True])
def test_both_maximum_searches_follow_tf_scan(monkeypatch, search, dtype, overlapping):
    """Ties, NaN after the first element and infinities: each search chooses TF's element, and
    a NaN first element is refused by both."""
    from gradops.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "SCAN_MAX_CELL_ELEMENTS", MAXIMUM_SEARCHES[search])
    rng = np.random.default_rng(21)
    x = tied_input(rng, (2, 9, 8, 3), dtype)
    rows, cols = random_sequence(rng, 9, 4, overlapping), random_sequence(rng, 8, 3, overlapping)
    if np.dtype(dtype).kind != "i":
        firsts = {(r, c) for r in rows[:-1] for c in cols[:-1]}
        flat = [(i, j) for i in range(9) for j in range(8) if (i, j) not in firsts]
        for (i, j), value in zip(rng.permutation(flat)[:12], [np.nan] * 6 + [np.inf] * 3 + [-np.inf] * 3):
            x[rng.integers(2), i, j, rng.integers(3)] = value
    _, maxima = brute_select(x, rows, cols, len(rows) - 1, len(cols) - 1, overlapping)
    y, dy, grad = forward_then_grad(x, rows, cols, overlapping, rng)
    np.testing.assert_array_equal(y, maxima)
    np.testing.assert_array_equal(grad, brute_grad(x, dy, rows, cols, overlapping))
    if np.dtype(dtype).kind != "i":
        x[0, rows[0], cols[0], 0] = np.nan  # the first element of the first cell
        with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
            gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)


# --------------------------------------------------------------------------- NaN and infinities


def _one_cell(x, out, dy=1.0, dtype=np.float32):
    """The gradient of one cell spanning row 0 of a [1, 2, len(x), 1] input (TF refuses
    len(rows) * len(cols) > the input's size, so the input has a second, unpooled row)."""
    x = np.concatenate([np.asarray(x, dtype).reshape(1, 1, -1, 1), np.zeros((1, 1, len(x), 1), dtype)], axis=1)
    grad = gradops.fractional_max_pool_grad(x, np.full((1, 1, 1, 1), out, dtype), np.full((1, 1, 1, 1), dy, dtype),
                                            [0, 1], [0, x.shape[2]])
    assert not grad[:, 1].any()
    return grad[:, 0]


def test_nan_after_the_first_element_is_never_chosen():
    assert _one_cell([1, np.nan, 3, np.nan], 3.0).reshape(-1).tolist() == [0, 0, 1, 0]
    assert _one_cell([2, np.nan, np.nan], 2.0).reshape(-1).tolist() == [1, 0, 0]


@pytest.mark.parametrize("out", [np.nan, 3.0])
def test_nan_first_element_is_refused_as_tf_does(out):
    """TF keeps a NaN first element as the maximum; NaN != orig_output, so it refuses."""
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        _one_cell([np.nan, 1, 3], out)


def test_forward_ignores_nan_and_starts_from_lowest():
    x = np.array([np.nan, 1, np.nan, np.nan, -np.inf, -np.inf], np.float32).reshape(1, 1, 6, 1)
    y = gradops.fractional_max_pool(x, [0, 1], [0, 2, 4, 6])
    lowest = np.finfo(np.float32).min
    assert y.reshape(-1).tolist() == [1.0, lowest, lowest]
    assert gradops.fractional_max_pool(np.full((1, 1, 1, 1), -5, np.int32), [0, 1], [0, 1]).item() == -5


def test_infinities_are_ordinary_values():
    assert _one_cell([-np.inf, np.inf, np.inf], np.inf).reshape(-1).tolist() == [0, 1, 0]
    assert _one_cell([-np.inf, -np.inf], -np.inf).reshape(-1).tolist() == [1, 0]


# --------------------------------------------------------------------------- validation


def _call(x_shape=(1, 4, 4, 1), y_shape=(1, 2, 2, 1), dy_shape=None, rows=(0, 2, 4), cols=(0, 2, 4),
          overlapping=False, dtype=np.float32, **kwargs):
    x = np.arange(np.prod(x_shape), dtype=dtype).reshape(x_shape)
    y = np.zeros(y_shape, dtype)
    dy = np.ones(y_shape if dy_shape is None else dy_shape, dtype)
    return gradops.fractional_max_pool_grad(x, y, dy, np.asarray(rows, np.int64), np.asarray(cols, np.int64),
                                            overlapping, **kwargs)


@pytest.mark.parametrize("kwargs, names", [
    (dict(x_shape=(4, 4, 1)), "orig_input"),
    (dict(y_shape=(2, 2, 1)), "orig_output"),
    (dict(dy_shape=(1, 2, 3, 1)), "out_backprop"),
    (dict(dy_shape=(1, 5, 1)), "out_backprop"),  # more elements than orig_output: TF reads past its argmax
    (dict(x_shape=(0, 4, 4, 1)), "orig_input"),
    (dict(x_shape=(1, 4, 0, 1)), "orig_input"),
    (dict(y_shape=(1, 0, 2, 1)), "orig_output"),
    (dict(y_shape=(2, 2, 2, 1)), "orig_output"),
    (dict(y_shape=(1, 2, 2, 2)), "orig_output"),
    (dict(rows=(0, 2)), "row_pooling_sequence"),
    (dict(cols=(0,)), "col_pooling_sequence"),
    (dict(rows=(-1, 2, 4)), "row_pooling_sequence"),  # TF PR #126911: still reads before the input
    (dict(cols=(0, -2, 4)), "col_pooling_sequence"),
    (dict(rows=(0, 0, 4)), "row_pooling_sequence"),  # an empty cell
    (dict(rows=(0, 4, 5)), "row_pooling_sequence"),  # starts past the input: empty
    (dict(cols=(2, 1, 4), overlapping=True), "col_pooling_sequence"),  # decreasing: empty
    (dict(rows=(0, 2, 3, 4)), "row_pooling_sequence"),  # an extra, non-empty cell
    (dict(rows=tuple(range(17)), cols=(0, 2, 4)), "row_pooling_sequence"),  # Pooling region > input
])
def test_refusals_name_the_argument(kwargs, names):
    with pytest.raises(gradops.InvalidArgumentError, match=names):
        _call(**kwargs)


def test_orig_output_must_hold_the_maxima():
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        _call()  # zeros, not the maxima


def test_short_sequence_message_names_orig_output():
    """The cells' count comes from orig_output's shape (out_backprop's may differ), and the
    message says so: a sequence too short for it leaves cells TF never visits, refused where
    out_backprop reaches them (here, all of it)."""
    with pytest.raises(gradops.InvalidArgumentError,
                       match=r"has 2 elements, so TF's loop visits 1 of orig_output's 2 rows .* orig_output\[0, 1, 0, 0\]"):
        _call(rows=(0, 2))


def test_extra_empty_cells_are_ignored_as_tf_does():
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4, 1)
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    dy = np.arange(1, 9, dtype=np.float32).reshape(y.shape)
    want = gradops.fractional_max_pool_grad(x, y, dy, [0, 2, 4], [0, 2, 4])
    got = gradops.fractional_max_pool_grad(x, y, dy, [0, 2, 4, 4, 1], [0, 2, 4, 9])
    np.testing.assert_array_equal(got, want)


def test_arguments_of_the_wrong_kind():
    with pytest.raises(TypeError, match="overlapping"):
        _call(overlapping=1)
    with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence"):
        _call(rows=np.zeros((1, 3), np.int64))
    x = np.zeros((1, 4, 4, 1), np.float32)
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        gradops.fractional_max_pool_grad(x, np.zeros((1, 2, 2, 1), np.float64), np.zeros((1, 2, 2, 1), np.float32),
                                         [0, 2, 4], [0, 2, 4])
    with pytest.raises(gradops.InvalidArgumentError, match="supported dtypes"):
        gradops.fractional_max_pool(np.zeros((1, 2, 2, 1), np.uint8), [0, 2], [0, 2])


def test_forward_validation():
    x = np.zeros((1, 4, 4, 1), np.float32)
    with pytest.raises(gradops.InvalidArgumentError, match="value"):
        gradops.fractional_max_pool(x[0], [0, 2], [0, 2])
    with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence"):
        gradops.fractional_max_pool(x, [0], [0, 2])
    with pytest.raises(gradops.InvalidArgumentError, match="col_pooling_sequence"):
        gradops.fractional_max_pool(x, [0, 2], [-1, 2])
    # An empty cell pools nothing: the lowest value, as TF's forward loop leaves it.
    y = gradops.fractional_max_pool(x, [0, 2, 2], [0, 4])
    assert y.reshape(-1).tolist() == [0.0, float(np.finfo(np.float32).min)]


def test_gpu_backends_refuse_with_the_reason():
    """Host arrays with backend='cuda' / 'cudnn' are refused as for every op."""
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    for backend in ("cuda", "cudnn"):
        with pytest.raises(gradops.InvalidArgumentError, match="GPU arrays"):
            gradops.fractional_max_pool_grad(x, y, y, [0, 2, 4], [0, 2, 4], backend=backend)


def test_no_cudnn_op():
    from gradops import _dispatch

    assert "fractional_max_pool_grad" not in _dispatch.CUDNN_OPS


# --------------------------------------------------------------------------- TF parity


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


def _tf_grad(tf, x, y, dy, rows, cols, overlapping):
    return tf.raw_ops.FractionalMaxPoolGrad(
        orig_input=x, orig_output=y, out_backprop=dy, row_pooling_sequence=np.asarray(rows, np.int64),
        col_pooling_sequence=np.asarray(cols, np.int64), overlapping=overlapping).numpy()


# out_backprop as TF reads it: flat, in order, as far as it goes (orig_output is [2, 3, 2, 3]).
OUT_BACKPROP_FORMS = {
    "flat": lambda dy: dy.reshape(-1),
    "other_shape": lambda dy: dy.reshape(6, 6),
    "rank_5": lambda dy: dy[None],
    "scalar": lambda dy: dy.reshape(-1)[0],
    "prefix": lambda dy: dy.reshape(-1)[:20],
    "fewer_images": lambda dy: dy[:1],
    "strided_prefix": lambda dy: dy.reshape(6, 6)[:5, ::2],
    "empty": lambda dy: dy.reshape(-1)[:0],
}


def _forms_case(rng, dtype):
    x = rng.permutation(180).reshape(2, 6, 5, 3).astype(dtype)
    rows, cols = [0, 2, 4, 6], [0, 2, 5]
    y = gradops.fractional_max_pool(x, rows, cols)
    dy = rng.integers(-5, 5, y.shape).astype(dtype)
    return x, y, dy, rows, cols


@pytest.mark.parametrize("form", list(OUT_BACKPROP_FORMS))
def test_out_backprop_of_another_shape_is_read_as_tf_reads_it(tf, rng, form):
    """Any out_backprop of at most orig_output's size: TF adds its flat elements in order to
    the chosen elements of the first cells and leaves the rest zero; so does gradops."""
    x, y, dy, rows, cols = _forms_case(rng, np.float32)
    dy_form = np.asarray(OUT_BACKPROP_FORMS[form](dy))
    got = gradops.fractional_max_pool_grad(x, y, dy_form, rows, cols)
    np.testing.assert_array_equal(got, _tf_grad(tf, x, y, dy_form, rows, cols, False))
    padded = np.zeros(y.size, dy.dtype)
    padded[:dy_form.size] = dy_form.reshape(-1)
    np.testing.assert_array_equal(got, brute_grad(x, padded.reshape(y.shape), rows, cols, False))


@pytest.mark.parametrize("form", ["other_shape", "prefix", "strided_prefix", "empty"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["float32", "float16"])
def test_cuda_out_backprop_of_another_shape(cuda_device, rng, form, dtype):
    """The GPU path pads on the arrays' device and gives the NumPy backend's result."""
    x, y, dy, rows, cols = _forms_case(rng, dtype)
    dy_form = OUT_BACKPROP_FORMS[form](dy)
    expected = gradops.fractional_max_pool_grad(x, y, dy_form, rows, cols)
    got = gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy_form), rows, cols, backend="cuda")
    np.testing.assert_array_equal(to_host(got), expected)
    assert to_host(got).dtype == expected.dtype


@pytest.mark.parametrize("dtype", TF_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True])
@pytest.mark.parametrize("pseudo_random", [False, True])
def test_tf_forward_and_grad_parity(tf, dtype, overlapping, pseudo_random):
    """TF draws the sequences; gradops' forward on them equals TF's, and so does the gradient
    (tied inputs: TF's tie-break is exercised)."""
    rng = np.random.default_rng(11)
    for seed, shape in enumerate([(2, 9, 11, 3), (1, 13, 7, 5), (3, 5, 5, 1)]):
        x = tied_input(rng, shape, dtype)
        y_tf, rows, cols = tf.raw_ops.FractionalMaxPool(
            value=x, pooling_ratio=[1.0, 1.44, 1.73, 1.0], pseudo_random=pseudo_random, overlapping=overlapping,
            deterministic=True, seed=seed + 1, seed2=7)
        rows, cols, y_tf = rows.numpy(), cols.numpy(), y_tf.numpy()
        y = gradops.fractional_max_pool(x, rows, cols, overlapping)
        np.testing.assert_array_equal(y, y_tf)
        dy = rng.integers(-5, 6, y.shape).astype(dtype)
        grad = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping)
        np.testing.assert_array_equal(grad, _tf_grad(tf, x, y_tf, dy, rows, cols, overlapping))


@pytest.mark.parametrize("overlapping", [False, True])
def test_tf_parity_random_floats_and_sums(tf, overlapping):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 10, 9, 4)).astype(np.float32)
    rows, cols = [0, 1, 3, 6, 8, 10], [0, 2, 3, 5, 9]
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping),
                                  _tf_grad(tf, x, y, dy, rows, cols, overlapping))


def test_tf_parity_nan(tf):
    """A NaN inside a cell is skipped by both; a NaN first element makes both refuse; TF's
    forward (ignoring NaN, all-NaN cells at the lowest value) is ours."""
    x = np.arange(16, dtype=np.float32).reshape(1, 4, 4, 1)
    x[0, 1, 1, 0] = np.nan
    x[0, 3, 3, 0] = np.nan
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    dy = np.ones(y.shape, np.float32)
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, y, dy, [0, 2, 4], [0, 2, 4]),
                                  _tf_grad(tf, x, y, dy, [0, 2, 4], [0, 2, 4], False))
    x[0, 0, 0, 0] = np.nan
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor_out_dup"):
        _tf_grad(tf, x, y, dy, [0, 2, 4], [0, 2, 4], False)
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        gradops.fractional_max_pool_grad(x, y, dy, [0, 2, 4], [0, 2, 4])
    for depth in (1, 8):  # TF's forward: scalar and vectorised cwiseMax
        z = np.arange(4 * 4 * depth, dtype=np.float32).reshape(1, 4, 4, depth)
        z[0, 0, 0], z[0, 2:, 2:] = np.nan, np.nan
        z[0, 0, 2:] = -np.inf
        z[0, 1, 2:] = -np.inf
        y_tf, rows, cols = tf.raw_ops.FractionalMaxPool(value=z, pooling_ratio=[1.0, 2.0, 2.0, 1.0],
                                                        pseudo_random=False, overlapping=False, deterministic=True,
                                                        seed=1, seed2=2)
        np.testing.assert_array_equal(gradops.fractional_max_pool(z, rows.numpy(), cols.numpy()), y_tf.numpy())


@pytest.mark.parametrize("depth", [1, 3, 64])  # TF's scalar and vectorised cwiseMax; NumPy's too
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_tf_forward_signed_zeros(tf, dtype, overlapping, depth):
    """Of equal zeros TF's running max keeps the first in its scan order, so a cell whose
    maximum is 0 takes its first zero's sign (NumPy's fmax keeps either, differently in its
    scalar and SIMD loops: 1,664 of 4,608 signs differed at depth 64 before this was handled)."""
    rng = np.random.default_rng(depth + 2 * overlapping)
    x = np.where(rng.random((2, 9, 9, depth)) < 0.5, -0.0, 0.0).astype(dtype)
    x[rng.random(x.shape) < 0.2] = -1.0
    x[rng.random(x.shape) < 0.05] = np.nan
    y_tf, rows, cols = tf.raw_ops.FractionalMaxPool(value=x, pooling_ratio=[1.0, 1.5, 1.5, 1.0], pseudo_random=True,
                                                    overlapping=overlapping, deterministic=True, seed=3, seed2=4)
    y_tf = y_tf.numpy()
    y = gradops.fractional_max_pool(x, rows.numpy(), cols.numpy(), overlapping)
    zero = y_tf == 0
    assert np.signbit(y_tf[zero]).any() and not np.signbit(y_tf[zero]).all()
    np.testing.assert_array_equal(y, y_tf)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(y_tf))
    loop = brute_forward(x, rows.numpy(), cols.numpy(), overlapping)
    np.testing.assert_array_equal(np.signbit(loop), np.signbit(y_tf))


def test_tf_parity_extra_empty_cells_and_pooling_region_check(tf):
    x = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    y = np.full((1, 1, 1, 1), 8, np.float32)
    dy = np.ones((1, 1, 1, 1), np.float32)
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, y, dy, [0, 3, 3], [0, 3]),
                                  _tf_grad(tf, x, y, dy, [0, 3, 3], [0, 3], False))
    z = np.zeros((1, 1, 2, 1), np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Pooling region has more elements"):
        _tf_grad(tf, z, np.zeros((1, 1, 1, 1), np.float32), dy, [0, 1], [0, 2], False)
    with pytest.raises(gradops.InvalidArgumentError, match="Pooling region has more elements"):
        gradops.fractional_max_pool_grad(z, np.zeros((1, 1, 1, 1), np.float32), dy, [0, 1], [0, 2])


# Empty cells and cells a short sequence never defines: TF's walk leaves them the lowest value
# and no choice, and computes the call where out_backprop stops before them.
# name: (input shape, rows, cols, overlapping, orig_output rows and columns)
EMPTY_CELLS = {
    "empty-row-cell": ((2, 7, 9, 3), [0, 2, 4, 6, 6, 7], [0, 3, 6, 9], False, (5, 3)),
    "unvisited-row-cells": ((2, 7, 9, 3), [0, 2, 4, 7], [0, 3, 6, 9], False, (5, 3)),
    "empty-col-cell": ((1, 6, 8, 2), [0, 3, 6], [0, 3, 3, 8], False, (2, 3)),
    "unvisited-col-cell": ((1, 6, 8, 2), [0, 3, 6], [0, 4], False, (2, 2)),
    "decreasing-overlapping": ((2, 6, 6, 2), [0, 2, 4, 1, 5], [0, 3, 5], True, (4, 2)),
    "start-past-the-input": ((1, 5, 5, 4), [0, 2, 4, 9, 5], [0, 2, 5], False, (4, 2)),
    "one-entry": ((1, 4, 4, 1), [0, 4], [3], False, (1, 1)),
    "next-entry-zero": ((1, 4, 5, 2), [0, 2, 4], [0, 3, 0, 5], False, (2, 3)),
    "every-cell-empty": ((2, 4, 4, 2), [0, 4], [5, 7], False, (1, 1)),
    # no column cell holds an element, so TF walks nothing: a negative row start and an extra
    # non-empty row cell read and write nothing
    "negative-start-no-column": ((1, 4, 4, 2), [-1, 2], [3, 1], False, (1, 1)),
    "extra-row-no-column": ((1, 4, 4, 2), [0, 2, 4], [2, 2], False, (1, 1)),
}


# Orig_output with more images or channels than orig_input: TF's walk never visits those, so
# they hold the lowest value and no choice, as an empty cell does.
# name: (a case of EMPTY_CELLS, or "full": no empty cell; orig_output's extra images, channels)
FULL_CELLS = {"full": ((2, 5, 7, 3), [0, 2, 5], [0, 3, 5, 7], True, (2, 3))}
EXTRA_ENTRIES = {
    "images": ("full", 2, 0),
    "channels": ("full", 0, 3),
    "images-and-channels": ("full", 1, 1),
    "images-and-an-empty-cell": ("empty-row-cell", 1, 0),
    "channels-and-an-unvisited-cell": ("unvisited-col-cell", 0, 2),
}


def empty_cells_case(name, dtype, rng, depth=None, images=0, channels=0):
    """(x, orig_output, out_backprop, rows, cols, overlapping, reach): out_backprop has
    orig_output's shape (random values) and TF reads its first ``reach`` flat elements at most,
    those before the first empty or unvisited cell, image or channel.  ``depth`` replaces the
    case's; orig_output has ``images`` and ``channels`` more than x."""
    shape, rows, cols, overlapping, (out_rows, out_cols) = {**EMPTY_CELLS, **FULL_CELLS}[name]
    shape = shape if depth is None else shape[:3] + (depth,)
    x = (rng.permutation(np.prod(shape)) - 20).reshape(shape).astype(dtype)
    chosen, y = brute_select(x, rows, cols, out_rows, out_cols, overlapping, shape[0] + images, shape[3] + channels)
    dy = rng.integers(-50, 51, y.shape).astype(dtype)
    reach = int(np.argmax(chosen.reshape(-1) < 0)) if (chosen < 0).any() else chosen.size
    return x, y, dy, rows, cols, overlapping, reach


@pytest.mark.parametrize("dtype", TF_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(EMPTY_CELLS))
def test_tf_parity_empty_and_unvisited_cells(tf, name, dtype):
    """TF computes a call with empty cells, or cells its sequences never define, where
    out_backprop's flat elements stop before the first of them (orig_output holding the lowest
    value there): the same bits; one element more, and both refuse."""
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case(name, dtype, np.random.default_rng(3))
    assert reach < y.size  # an empty cell somewhere
    _assert_tf_parity_up_to(tf, reach, "_pooling_sequence", x, y, dy, rows, cols, overlapping)


def _assert_tf_parity_up_to(tf, reach, named, x, y, dy, rows, cols, overlapping):
    """TF and gradops compute the same bits (the brute force's too) with 0, half and all of
    out_backprop's first ``reach`` flat elements, and both refuse one element more, gradops
    naming ``named``."""
    for elements in sorted({0, reach // 2, reach}):
        prefix = dy.reshape(-1)[:elements]
        got = gradops.fractional_max_pool_grad(x, y, prefix, rows, cols, overlapping)
        np.testing.assert_array_equal(got, _tf_grad(tf, x, y, prefix, rows, cols, overlapping))
        np.testing.assert_array_equal(got, brute_grad(x, dy, rows, cols, overlapping, elements))
    prefix = dy.reshape(-1)[:reach + 1]
    with pytest.raises(tf.errors.InvalidArgumentError, match="Invalid input backprop index: -1"):
        _tf_grad(tf, x, y, prefix, rows, cols, overlapping)
    with pytest.raises(gradops.InvalidArgumentError, match=f"{named} .*TF: Invalid input backprop index: -1"):
        gradops.fractional_max_pool_grad(x, y, prefix, rows, cols, overlapping)


@pytest.mark.parametrize("dtype", TF_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(EXTRA_ENTRIES))
def test_tf_parity_more_images_or_channels_in_orig_output(tf, name, dtype):
    """TF walks orig_input's images and channels, at orig_output's offsets: orig_output's extra
    ones keep the lowest value and no choice, and TF computes the call where out_backprop
    stops before the first of them (with extra channels: within the first cell's channels):
    the same bits; one element more, and both refuse."""
    base, images, channels = EXTRA_ENTRIES[name]
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case(base, dtype, np.random.default_rng(5),
                                                                images=images, channels=channels)
    assert y.shape == (x.shape[0] + images,) + y.shape[1:3] + (x.shape[3] + channels,)
    # with extra channels TF reaches the first cell's; else the whole of orig_input's images
    # where every cell holds elements, and less where one does not
    assert reach == x.shape[3] if channels else reach == x.shape[0] * y[0].size if base == "full" else reach < y[0].size
    named = "channels" if channels else "images" if base == "full" else "_pooling_sequence"
    _assert_tf_parity_up_to(tf, reach, named, x, y, dy, rows, cols, overlapping)


@pytest.mark.parametrize("where", ["image", "channel"])
def test_extra_images_and_channels_need_the_lowest_value(tf, where):
    """TF's check covers orig_output's extra images and channels too: any value but the
    lowest there is refused, by TF and by gradops (which names the element)."""
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("full", np.float64, np.random.default_rng(8),
                                                                images=1, channels=1)
    y = y.copy()
    at = (2, 0, 1, 0) if where == "image" else (1, 1, 2, 3)
    y[at] = -1e308  # not the lowest float64
    prefix = dy.reshape(-1)[:reach]
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor_out_dup is not the same as tensor_out"):
        _tf_grad(tf, x, y, prefix, rows, cols, overlapping)
    with pytest.raises(gradops.InvalidArgumentError, match=rf"at \[{', '.join(map(str, at))}\] orig_output holds"):
        gradops.fractional_max_pool_grad(x, y, prefix, rows, cols, overlapping)


def test_fewer_images_or_channels_in_orig_output(tf):
    """Fewer images or channels in orig_output than in orig_input: TF's walk writes past its
    buffers (images), or into the next cells' entries (channels), and gradops refuses, naming
    orig_output; where no cell holds an element TF's walk touches nothing, and both return
    zeros."""
    x = np.arange(2 * 4 * 4 * 2, dtype=np.float32).reshape(2, 4, 4, 2)
    for y_shape in ((1, 2, 2, 2), (2, 2, 2, 1)):
        with pytest.raises(gradops.InvalidArgumentError, match="orig_output's batch and depth must be at least"):
            gradops.fractional_max_pool_grad(x, np.zeros(y_shape, np.float32), np.zeros(0, np.float32),
                                             [0, 2, 4], [0, 2, 4])
    # A known deviation (README): with fewer channels TF writes a cell's further channels into
    # the next cells' entries, in bounds here (orig_output's second image is never walked), and
    # computes a result; gradops refuses.
    x1, y1 = np.array([1, 5, 3, 2, 0, 7, 4, -1], np.float32).reshape(1, 2, 2, 2), np.array([4, 7], np.float32)
    dy1 = np.array([10, 100], np.float32)
    tf_result = _tf_grad(tf, x1, y1.reshape(2, 1, 1, 1), dy1, [0, 2], [0, 2], False)
    assert tf_result.reshape(-1).tolist() == [0, 0, 0, 0, 0, 100, 10, 0]
    with pytest.raises(gradops.InvalidArgumentError, match="a result gradops does not compute"):
        gradops.fractional_max_pool_grad(x1, y1.reshape(2, 1, 1, 1), dy1, [0, 2], [0, 2])
    y = np.full((1, 1, 1, 1), np.finfo(np.float32).min, np.float32)
    dy = np.zeros(0, np.float32)
    got = gradops.fractional_max_pool_grad(x, y, dy, [5, 6], [0, 2])  # row cell 0 starts past the input
    np.testing.assert_array_equal(got, _tf_grad(tf, x, y, dy, [5, 6], [0, 2], False))
    assert got.shape == x.shape and not got.any()


def test_empty_cells_need_the_lowest_value_in_orig_output(tf):
    """TF's check covers the empty cells: their maximum is the lowest value, and any other
    orig_output there is refused, by TF and by gradops."""
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("empty-row-cell", np.float32,
                                                                 np.random.default_rng(4))
    y = y.copy()
    y[1, 3, 2, 1] = 0  # an empty cell's
    prefix = dy.reshape(-1)[:reach]
    with pytest.raises(tf.errors.InvalidArgumentError, match="tensor_out_dup is not the same as tensor_out"):
        _tf_grad(tf, x, y, prefix, rows, cols, overlapping)
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output is not the max pooling"):
        gradops.fractional_max_pool_grad(x, y, prefix, rows, cols, overlapping)


def test_backends_see_no_empty_cell(monkeypatch, rng):
    """The op checks the empty cells itself and hands the backend the other cells only: the
    pooling of those, with orig_output there, in the same output order."""
    from gradops.backends import numpy_backend

    seen = []
    real = numpy_backend.fractional_max_pool_grad

    def spy(g, orig_input, orig_output, out_backprop):
        seen.append((g, orig_output.shape, out_backprop.shape))
        return real(g, orig_input, orig_output, out_backprop)

    monkeypatch.setattr(numpy_backend, "fractional_max_pool_grad", spy)
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("empty-row-cell", np.float32, rng)
    got = gradops.fractional_max_pool_grad(x, y, dy.reshape(-1)[:reach], rows, cols, overlapping)
    np.testing.assert_array_equal(got, brute_grad(x, dy, rows, cols, overlapping, reach))
    (g, y_shape, dy_shape), = seen
    assert min(g.row_cell_sizes) > 0 and min(g.col_cell_sizes) > 0 and (g.out_rows, g.out_cols) == (4, 3)
    assert y_shape == dy_shape == (2, 4, 3, 3)


@pytest.mark.parametrize("chunk", [1, 3, 1 << 14])
def test_empty_cells_are_checked_in_chunks(monkeypatch, chunk):
    """orig_output's empty cells are compared a chunk at a time (any chunk size: the same
    answer), and the message names the first wrong element in C order."""
    import importlib

    module = importlib.import_module("gradops.fractional_max_pool")  # the module, not the function
    monkeypatch.setattr(module, "EMPTY_CELLS_CHUNK", chunk)
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("empty-col-cell", np.float64,
                                                                 np.random.default_rng(2))
    prefix = dy.reshape(-1)[:reach]
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, y, prefix, rows, cols, overlapping),
                                  brute_grad(x, dy, rows, cols, overlapping, reach))
    wrong = y.copy()
    wrong[0, 1, 1, 1] = np.nan  # column cell 1 is empty: NaN is not the lowest value either
    wrong[0, 1, 1, 0] = 7.0
    with pytest.raises(gradops.InvalidArgumentError, match=r"at \[0, 1, 1, 0\] orig_output holds np.float64\(7.0\)"):
        gradops.fractional_max_pool_grad(x, wrong, prefix, rows, cols, overlapping)
    wrong[0, 1, 1, 0] = y[0, 1, 1, 0]
    with pytest.raises(gradops.InvalidArgumentError, match=r"at \[0, 1, 1, 1\] orig_output holds np.float64\(nan\)"):
        gradops.fractional_max_pool_grad(x, wrong, prefix, rows, cols, overlapping)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32], ids=lambda d: np.dtype(d).name)
def test_empty_cells_of_a_byteswapped_orig_output(dtype):
    """The empty cells' check compares bits in orig_output's own byte order (a big-endian array
    holds the same values; the fuzzer's case), and names the value it found."""
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("unvisited-col-cell", dtype,
                                                                 np.random.default_rng(9))
    swapped = y.astype(y.dtype.newbyteorder())
    prefix = dy.reshape(-1)[:reach]
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(x, swapped, prefix, rows, cols, overlapping),
                                  brute_grad(x, dy, rows, cols, overlapping, reach))
    swapped[0, 0, 1, 1] = 5
    with pytest.raises(gradops.InvalidArgumentError, match=r"at \[0, 0, 1, 1\] orig_output holds .*5"):
        gradops.fractional_max_pool_grad(x, swapped, prefix, rows, cols, overlapping)


def test_a_broadcast_orig_output_of_empty_cells_allocates_little():
    """2**20 rows of orig_output that a one-cell sequence never visits, as a broadcast view:
    checked, refused or computed, without a temporary of their size (the fuzzer's case)."""
    import tracemalloc

    x = np.array([0.25, -1.0, 0.5, 2.0], np.float16).reshape(1, 2, 2, 1)
    dy = np.array([3.0], np.float16)
    for fill, expect in ((np.float16(1), "chooses no element for that entry"), (np.float16(-65504), None)):
        y = np.broadcast_to(fill, (1, 1 << 20, 1, 1))
        if expect is None:
            y = y.copy()
            y[0, 0, 0, 0] = 2.0  # the one visited cell, rows 0..1 x column 1: max(-1, 2)
            y = np.broadcast_to(y, y.shape)  # a read-only view: the op must not write it
        tracemalloc.start()
        try:
            if expect is None:
                got = gradops.fractional_max_pool_grad(x, y, dy, [0, 2], [1, 2])
                assert got.reshape(-1).tolist() == [0, 0, 0, 3]
            else:
                with pytest.raises(gradops.InvalidArgumentError, match=expect):
                    gradops.fractional_max_pool_grad(x, y, dy, [0, 2], [1, 2])
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < (1 << 20) // 4, peak  # the view's logical size is 2 MiB


def test_empty_cells_are_compared_with_a_numpy_scalar(monkeypatch):
    """CuPy takes NumPy scalars as operands but refuses NumPy arrays, even 0-d ones; the CPU
    stand-in (tests/cuda_host.py, NumPy underneath) accepts both, so this pins what the op's
    empty-cell check passes to the comparison."""
    import importlib

    module = importlib.import_module("gradops.fractional_max_pool")
    seen = []
    real = module._first_other

    def spy(view, value, chunk):
        seen.append(value)
        return real(view, value, chunk)

    monkeypatch.setattr(module, "_first_other", spy)
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case("empty-row-cell", ml_dtypes.bfloat16,
                                                                 np.random.default_rng(1))
    gradops.fractional_max_pool_grad(x, y, dy.reshape(-1)[:reach], rows, cols, overlapping)
    assert seen and all(isinstance(v, np.generic) and not isinstance(v, np.ndarray) for v in seen)


def test_no_cell_holding_elements_still_checks_the_backend():
    """Where no cell holds an element the gradient is zero, but the call is checked as any
    other: a wrong backend name, and host arrays for a GPU backend, are refused."""
    x = np.arange(9, dtype=np.float32).reshape(1, 3, 3, 1)
    y = np.full((1, 1, 1, 1), np.finfo(np.float32).min, np.float32)
    dy = np.zeros((0,), np.float32)
    assert gradops.fractional_max_pool_grad(x, y, dy, [0], [0]).tolist() == np.zeros_like(x).tolist()
    with pytest.raises(gradops.InvalidArgumentError, match="backend must be"):
        gradops.fractional_max_pool_grad(x, y, dy, [0], [0], backend="bogus")
    with pytest.raises(gradops.InvalidArgumentError, match="needs GPU arrays"):
        gradops.fractional_max_pool_grad(x, y, dy, [0], [0], backend="cuda")


def test_long_sequences_are_shortened_in_messages():
    """A refusal quotes a long sequence by its first entries and its length."""
    x = np.zeros((1, 4, 4, 8), np.float32)  # TF's bound: 43 x 2 sequence entries <= 128 elements
    rows = [0, 2, 2] + [2] * 40  # cell 1 and the extra cells empty
    with pytest.raises(gradops.InvalidArgumentError, match=r"got \[0, 2, 2, 2, .*, 2, \.\.\.\] \(43 elements\)"):
        gradops.fractional_max_pool_grad(x, np.zeros((1, 2, 1, 8), np.float32), np.ones(9, np.float32), rows, [0, 4])


def test_forward_output_of_empty_cells_is_the_gradients_orig_output(rng):
    """gradops' own forward gives the lowest value in empty cells, which its gradient accepts as
    orig_output (with an out_backprop that stops before them, as TF requires)."""
    x, _, dy, rows, cols, overlapping, reach = empty_cells_case("decreasing-overlapping", np.float16, rng)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    got = gradops.fractional_max_pool_grad(x, y, dy.reshape(-1)[:reach], rows, cols, overlapping)
    np.testing.assert_array_equal(got, brute_grad(x, dy, rows, cols, overlapping, reach))


@st.composite
def empty_cell_calls(draw):
    """A call with sequences in any order (empty cells anywhere) or too short, sometimes an
    orig_output of more images or channels, in TF's dtypes, with out_backprop's flat elements
    stopping at or before the first empty cell, image or channel."""
    overlapping = draw(st.booleans())
    n, h, w, c = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 3)))
    rows, cols = draw(pool_sequence(h, overlapping)), draw(pool_sequence(w, overlapping))
    out_rows = draw(st.integers(1, len(rows) + 1))
    out_cols = draw(st.integers(1, len(cols) + 1))
    # TF's "Pooling region" bound; cells past orig_output's that are non-empty are refused
    assume(len(rows) * len(cols) <= n * h * w * c)
    assume(all(e < s for s, e in (_cell(rows, k, h, overlapping) for k in range(out_rows, len(rows) - 1))))
    assume(all(e < s for s, e in (_cell(cols, k, w, overlapping) for k in range(out_cols, len(cols) - 1))))
    dtype = np.dtype(draw(st.sampled_from(TF_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = tied_input(rng, (n, h, w, c), dtype) if draw(st.booleans()) else (rng.standard_normal((n, h, w, c)) * 100)
    x = x.astype(dtype)
    images, channels = draw(st.sampled_from([(0, 0)] * 4 + [(1, 0), (0, 1), (2, 2)]))
    chosen, y = brute_select(x, rows, cols, out_rows, out_cols, overlapping, n + images, c + channels)
    reach = int(np.argmax(chosen.reshape(-1) < 0)) if (chosen < 0).any() else chosen.size
    elements = draw(st.one_of(st.just(reach), st.integers(0, reach)))  # mostly all TF reads
    dy = rng.integers(-50, 51, elements).astype(dtype)
    return x, y, dy, rows, cols, overlapping


def _cell(sequence, k, size, overlapping):
    return sequence[k], min(sequence[k + 1] if overlapping else sequence[k + 1] - 1, size - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=empty_cell_calls())
def test_tf_parity_property_empty_cells(tf, call):
    """Random calls with empty and unvisited cells that TF computes: the same bits."""
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(*call), _tf_grad(tf, *call))


@st.composite
def tf_gradient_calls(draw):
    """A call TF's FractionalMaxPoolGrad computes: non-empty cells, trailing entries making
    empty ones, TF's "Pooling region" bound, tied or distinct values with infinities."""
    overlapping = draw(st.booleans())
    n, h, w, c = (draw(st.integers(1, 2)), draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 3)))
    rows, cols, out_rows, out_cols = draw(max_pool_grad_sequences((n, h, w, c), overlapping))
    dtype = np.dtype(draw(st.sampled_from(TF_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = tied_input(rng, (n, h, w, c), dtype) if draw(st.booleans()) else (rng.standard_normal((n, h, w, c)) * 100)
    x = x.astype(dtype)
    if dtype.kind == "f" and draw(st.booleans()):
        x.reshape(-1)[rng.integers(0, x.size, 2)] = rng.choice([np.inf, -np.inf], 2)
    _, y = brute_select(x, rows, cols, out_rows, out_cols, overlapping)
    dy = rng.integers(-50, 51, y.shape).astype(dtype)
    return x, y, dy, rows, cols, overlapping


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=tf_gradient_calls())
def test_tf_parity_property(tf, call):
    """Random calls TF computes (the fuzzer's valid draws in TF's dtypes): the same bits."""
    np.testing.assert_array_equal(gradops.fractional_max_pool_grad(*call), _tf_grad(tf, *call))


# --------------------------------------------------------------------------- CUDA kernels
# On a GPU ([gpu]) and on tests/cuda_host.py's CPU execution model ([host]): the real launcher
# and .cu source, blocks and threads in a shuffled order, NaN-guarded arrays.


def _cuda_case(rng, shape, rows, cols, overlapping, dtype):
    x = tied_input(rng, shape, dtype)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    dy = (rng.integers(-5, 6, y.shape) if np.issubdtype(dtype, np.integer) else rng.standard_normal(y.shape))
    return x, y, dy.astype(dtype)


def _check_cuda(x, y, dy, rows, cols, overlapping, **kwargs):
    import cupy

    want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
    got = gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy), rows, cols, overlapping,
                                           backend="cuda", **kwargs)
    assert isinstance(got, cupy.ndarray)
    got = to_host(got)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))  # bit for bit
    g = _geometry(x, y, dy, rows, cols, overlapping)
    # the opt-in one-pass kernel, forced: the same bits (where no cell is empty: the op drops those)
    if max_launcher().cells_bounds(g) is not None and g.output_shape == y.shape:
        cells = to_host(max_launcher().fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), path="cells"))
        np.testing.assert_array_equal(cells.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
    return got


def max_launcher():
    import importlib

    return importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")


def _geometry(x, y, dy, rows, cols, overlapping):
    from gradops._geometry import fractional_max_pool_geometry

    return fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, [int(v) for v in rows],
                                        [int(v) for v in cols], overlapping)


CUDA_SEQUENCES = {
    "generated": ((2, 7, 9, 3), None, None),
    "equal-entries": ((1, 5, 6, 2), [0, 2, 2, 4], [1, 1, 3, 5]),
    "clamped": ((2, 5, 6, 1), [0, 1, 9], [2, 3, 5, 50]),
    "one-cell": ((1, 5, 6, 4), [4, 5], [0, 6]),
}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("case", list(CUDA_SEQUENCES))
def test_cuda_matches_numpy_bit_for_bit(cuda_device, case, overlapping, dtype):
    rng = np.random.default_rng(21)
    shape, rows, cols = CUDA_SEQUENCES[case]
    if case == "equal-entries" and not overlapping:  # equal entries make empty disjoint cells
        rows, cols = [0, 2, 3, 4], [1, 2, 3, 5]
    if rows is None:
        rows = gradops.fractional_pooling_sequence(shape[1], 1.44, True, seed=3)
        cols = gradops.fractional_pooling_sequence(shape[2], 1.44, False, seed=4)
    _check_cuda(*_cuda_case(rng, shape, rows, cols, overlapping, dtype), rows, cols, overlapping)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(EMPTY_CELLS))
def test_cuda_empty_and_unvisited_cells(cuda_device, name, dtype):
    """The op checks orig_output's empty cells on the arrays' device and hands the kernels the
    others: bit for bit NumPy's result (8 or 4 channels a thread), a CuPy array also where no
    cell holds an element, and a wrong orig_output in an empty cell refused."""
    depth = 8 if np.dtype(dtype).itemsize == 2 else 4
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case(name, dtype, np.random.default_rng(6), depth)
    prefix = dy.reshape(-1)[:reach]
    _check_cuda(x, y, prefix, rows, cols, overlapping)
    wrong = y.copy()
    wrong.reshape(-1)[reach] = 0  # the first empty cell's first element: TF's lowest value there
    with pytest.raises(gradops.InvalidArgumentError,
                       match=r"orig_output is not the max pooling.* chooses no element for that entry"):
        gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(wrong), to_gpu(prefix), rows, cols, overlapping,
                                         backend="cuda")


@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", list(EXTRA_ENTRIES))
def test_cuda_more_images_or_channels_in_orig_output(cuda_device, name, dtype):
    """orig_output's extra images and channels are checked on the arrays' device and left out
    of what the kernels get: bit for bit NumPy's result, and a wrong value there refused."""
    base, images, channels = EXTRA_ENTRIES[name]
    depth = 8 if np.dtype(dtype).itemsize == 2 else 4
    x, y, dy, rows, cols, overlapping, reach = empty_cells_case(base, dtype, np.random.default_rng(7), depth,
                                                                images, channels)
    prefix = dy.reshape(-1)[:reach]
    got = _check_cuda(x, y, prefix, rows, cols, overlapping)
    np.testing.assert_array_equal(got, brute_grad(x, dy, rows, cols, overlapping, reach))
    wrong = y.copy()
    wrong[-1, -1, -1, -1] = 0  # an extra image's or channel's
    with pytest.raises(gradops.InvalidArgumentError, match=r"orig_output is not the max pooling.* chooses no element"):
        gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(wrong), to_gpu(prefix), rows, cols, overlapping,
                                         backend="cuda")


@pytest.mark.parametrize("local", [True, False], ids=["cell-places", "flat-offsets"])
@pytest.mark.parametrize("vector", [True, False], ids=["vector", "1-channel"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_channels_per_thread(cuda_device, overlapping, dtype, vector, local):
    """8 (2-byte types) or 4 channels per thread, and 1, with the chosen elements as one-byte
    cell places or flat offsets, forced on the same problems: bit for bit NumPy's result (tied
    inputs, overlapping cells, one and three channel groups per pixel), and the launcher's own
    choice (vectors, places) through the public API."""
    rng = np.random.default_rng(31)
    for shape, seed in (((2, 7, 9, 8), 3), ((1, 6, 5, 24), 5)):
        rows = gradops.fractional_pooling_sequence(shape[1], 1.44, True, seed=seed)
        cols = gradops.fractional_pooling_sequence(shape[2], 1.44, False, seed=seed + 1)
        x, y, dy = _cuda_case(rng, shape, rows, cols, overlapping, dtype)
        _check_cuda(x, y, dy, rows, cols, overlapping)
        import importlib

        from gradops._geometry import fractional_max_pool_geometry

        launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
        g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, rows, cols,
                                         overlapping)
        got = launcher.fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), vector=vector, local=local)
        want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
        np.testing.assert_array_equal(to_host(got).view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))


@pytest.mark.parametrize("misaligned", ["orig_input", "orig_output", "out_backprop"])
def test_cuda_misaligned_array_takes_one_channel_per_thread(cuda_device, misaligned):
    """An array that starts 2 bytes into its allocation cannot be read in 16-byte packs: the
    launcher runs one channel per thread (and refuses vector=True), with the same result."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    rng = np.random.default_rng(8)
    rows = gradops.fractional_pooling_sequence(7, 1.44, True, seed=2)
    cols = gradops.fractional_pooling_sequence(9, 1.44, False, seed=3)
    x, y, dy = _cuda_case(rng, (2, 7, 9, 16), rows, cols, False, np.float16)
    arrays = {"orig_input": x, "orig_output": y, "out_backprop": dy}
    gpu = {name: to_gpu(a) for name, a in arrays.items()}
    a = arrays[misaligned]
    padded = to_gpu(np.concatenate([np.zeros(1, a.dtype), a.reshape(-1)]))
    gpu[misaligned] = padded[1:].reshape(a.shape)
    assert gpu[misaligned].flags.c_contiguous
    g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, rows, cols, False)
    order = (gpu["orig_input"], gpu["orig_output"], gpu["out_backprop"])
    assert launcher.channels_per_thread(g, x.dtype, order) == 1
    assert launcher.channels_per_thread(g, x.dtype, (to_gpu(x), to_gpu(y), to_gpu(dy))) == 8
    with pytest.raises(ValueError, match="aligned arrays"):
        launcher.fractional_max_pool_grad(g, *order, vector=True)
    got = to_host(launcher.fractional_max_pool_grad(g, *order))
    want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, False, backend="numpy")
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


def test_cell_places_choice_and_a_large_cell():
    """One-byte cell places where every cell has at most 256 elements (rows x columns of the
    longest cells), flat offsets otherwise: a 17 x 16 cell (272 elements) takes offsets, and the
    result still matches NumPy; forcing places on it is refused."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

    def geometry(rows, cols, in_rows, in_cols):
        out = (1, len(rows) - 1, len(cols) - 1, 2)
        return fractional_max_pool_geometry("fractional_max_pool_grad", (1, in_rows, in_cols, 2), out, out, rows,
                                            cols, False)

    assert geometry([0, 16, 17], [0, 16, 17], 17, 17).largest_cell == 256
    assert launcher.local_places(geometry([0, 16, 17], [0, 16, 17], 17, 17))
    big = geometry([0, 17, 18], [0, 16, 17], 18, 17)
    assert big.largest_cell == 272 and not launcher.local_places(big)
    with pytest.raises(ValueError, match="at most 256"):
        launcher.local_places(big, True)


def test_cuda_large_cells_take_flat_offsets(cuda_device):
    """A 17 x 16 cell (272 elements, past a byte's places): flat offsets, NumPy's result."""
    rng = np.random.default_rng(12)
    rows, cols = [0, 17, 18], [0, 16, 17]
    x, y, dy = _cuda_case(rng, (1, 18, 17, 4), rows, cols, False, np.float32)
    _check_cuda(x, y, dy, rows, cols, False)


def test_select_run_choice():
    """Select takes SELECT_RUN (4) output rows per thread where consecutive row cells share a
    row (overlapping pooling with two or more row cells), else 1; tests may force any run of
    at least one row."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

    def geometry(rows, overlapping):
        out = (1, len(rows) - 1, 3, 2)
        return fractional_max_pool_geometry("fractional_max_pool_grad", (1, 7, 7, 2), out, out, rows,
                                            [0, 2, 4, 6], overlapping)

    assert launcher.SELECT_RUN == 4
    assert launcher.select_run(geometry([0, 2, 4, 6], True)) == 4
    assert launcher.select_run(geometry([0, 2, 4, 7], False)) == 1
    assert launcher.select_run(geometry([0, 6], True)) == 1  # one row cell: nothing to share
    assert launcher.select_run(geometry([0, 2, 4, 6], True), 3) == 3
    with pytest.raises(ValueError, match="at least one"):
        launcher.select_run(geometry([0, 2, 4, 6], True), 0)


#: Overlapping cells of 1 to 3 rows (an equal pair of entries makes a one-row cell, which shares
#: its row with both neighbours) and of 2 to 6 columns: a 6-column cell takes select's
#: element-at-a-time loop, the others the loop that holds a row for the next cell.
RUN_ROWS, RUN_COLS = [0, 1, 1, 3, 4, 6, 8], [0, 5, 7, 8, 10]


@pytest.mark.parametrize("run", [1, 2, 3, 4, 6, 7])
@pytest.mark.parametrize("vector", [True, False], ids=["vector", "1-channel"])
@pytest.mark.parametrize("dtype", [np.float16, np.float64], ids=lambda d: np.dtype(d).name)
def test_cuda_select_runs(cuda_device, dtype, vector, run):
    """Select's runs of 1 to 7 output rows per thread (6 row cells: whole runs, a short last
    run, one run of all), forced, with vector or single channels, cell places and flat offsets,
    32- and 64-bit indexing: bit for bit NumPy's result on tied inputs."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    rng = np.random.default_rng(run)
    x, y, dy = _cuda_case(rng, (2, 9, 11, 16), RUN_ROWS, RUN_COLS, True, dtype)
    g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, RUN_ROWS, RUN_COLS, True)
    want = gradops.fractional_max_pool_grad(x, y, dy, RUN_ROWS, RUN_COLS, True, backend="numpy")
    for local, index in ((True, "int"), (False, "int"), (False, "long long")):
        got = launcher.fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), vector=vector, local=local,
                                                index=index, run=run)
        np.testing.assert_array_equal(to_host(got).view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))


def test_cuda_select_run_refuses_a_wrong_maximum_in_a_held_row(cuda_device):
    """orig_output wrong for a cell whose first row select took from the previous cell's held
    row: refused, as TF refuses it."""
    rng = np.random.default_rng(3)
    x, y, dy = _cuda_case(rng, (1, 9, 11, 8), RUN_ROWS, RUN_COLS, True, np.float32)
    y = y.copy()
    y[0, 3, 1, 5] += 1  # row cell 3 starts on row 3, row cell 2's last
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy), RUN_ROWS, RUN_COLS, True, backend="cuda")


def test_channels_per_thread_choice():
    """8 (2-byte types) or 4 channels per thread where depth is a multiple of that (and the
    arrays aligned), else 1; forcing vectors on a depth they do not divide is refused."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

    def geometry(depth):
        return fractional_max_pool_geometry("fractional_max_pool_grad", (1, 5, 5, depth), (1, 3, 3, depth),
                                            (1, 3, 3, depth), [0, 2, 4, 5], [0, 1, 3, 5], False)

    f16, f32, f64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
    assert launcher.channels_per_thread(geometry(8), f32) == 4
    assert launcher.channels_per_thread(geometry(64), f16) == 8
    assert launcher.channels_per_thread(geometry(12), f16) == 1 and launcher.channels_per_thread(geometry(12), f64) == 4
    assert launcher.channels_per_thread(geometry(6), f32) == 1
    assert launcher.channels_per_thread(geometry(8), f32, vector=False) == 1
    with pytest.raises(ValueError, match="multiple of 4"):
        launcher.channels_per_thread(geometry(6), f32, vector=True)
    assert launcher.pack_accesses(8, 4) == (16, 2) and launcher.pack_accesses(4, 2) == (8, 1)


def test_cells_channels_keep_the_pairs_to_their_places():
    """The cells kernel takes one channel a thread for overlapping cells of a 2-byte type past
    PAIR_PLACES elements (its pairs hold 16-bit places) and channels_per_thread's otherwise:
    at PAIR_PLACES itself, for disjoint cells and for 4-byte types; forcing vectors past it is
    refused."""
    from gradops._geometry import fractional_max_pool_geometry

    launcher = max_launcher()
    limit = launcher.PAIR_PLACES
    assert limit == 0x7800  # place + 0x0400 stays below float16's Inf (0x7C00): the kernel's kPairPlaces

    def geometry(rows, overlapping):
        return fractional_max_pool_geometry("fractional_max_pool_grad", (1, rows, 4, 8), (1, 1, 1, 8), (1, 1, 1, 8),
                                            [0, rows], [0, 4], overlapping)

    f16, bf16, f32 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32)
    at, past = geometry(limit // 4, True), geometry(limit // 4 + 1, True)
    assert at.largest_cell == limit and past.largest_cell == limit + 4
    assert launcher.cells_channels(at, f16) == launcher.cells_channels(at, bf16) == 8
    assert launcher.cells_channels(past, f16) == launcher.cells_channels(past, bf16) == 1
    assert launcher.cells_channels(past, f32) == 4
    assert launcher.cells_channels(geometry(limit // 4 + 1, False), f16) == 8
    with pytest.raises(ValueError, match="at most 30720 elements"):
        launcher.cells_channels(past, f16, vector=True)


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_64_bit_indexing_path(cuda_device, overlapping):
    """The "long long" instantiations (taken past 2**31 elements), forced on a small problem."""
    import cupy

    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

    rng = np.random.default_rng(4)
    rows, cols = [0, 2, 3, 5, 7], [0, 1, 3, 6, 9]
    x, y, dy = _cuda_case(rng, (2, 7, 9, 3), rows, cols, overlapping, np.float64)
    g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, rows, cols, overlapping)
    assert launcher.index_type(g) == "int"
    got = launcher.fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), index="long long")
    np.testing.assert_array_equal(cupy.asnumpy(got), gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping))


def test_cell_tables_are_uploaded_once_per_geometry_and_index_type(monkeypatch, rng):
    """The launcher keeps its device copy of the cell tables (fractional_avg_pool_grad's LRU):
    a repeated geometry uploads nothing and still computes TF's result; other cells, another
    index type, or average pooling's tables of the same cells are other entries."""
    import importlib
    import sys

    import cuda_host

    from gradops._geometry import fractional_max_pool_geometry

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    cuda_host.HostDevice().install(monkeypatch)
    rows_a, rows_b, cols = [0, 2, 3, 5, 7], [0, 3, 5, 6, 7], [0, 1, 3, 6, 9]
    cases = {name: _cuda_case(rng, (2, 7, 9, 3), rows, cols, False, np.float32)
             for name, rows in (("a", rows_a), ("b", rows_b))}
    device_arrays = {name: tuple(to_gpu(v) for v in case) for name, case in cases.items()}
    cupy = sys.modules["cupy"]
    uploads, real = [], cupy.asarray

    def asarray(x, *args, **kwargs):  # host arrays reaching the device: the tables (tensors moved above)
        if isinstance(x, np.ndarray) and not isinstance(x, cuda_host.HostArray):
            uploads.append(x.dtype)
        return real(x, *args, **kwargs)

    monkeypatch.setattr(cupy, "asarray", asarray)

    def call(name, rows, **kwargs):
        x, y, dy = cases[name]
        g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, rows, cols, False)
        got = launcher.fractional_max_pool_grad(g, *device_arrays[name], **kwargs)
        want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, False, backend="numpy")
        np.testing.assert_array_equal(to_host(got), want)

    call("a", rows_a)
    assert uploads == [np.int32]  # one packed upload of 32-bit tables
    call("a", rows_a)
    assert len(uploads) == 1
    call("b", rows_b)  # other row cells
    assert len(uploads) == 2
    call("a", rows_a, index="long long")
    assert uploads[-1] == np.int64 and len(uploads) == 3
    call("a", rows_a)
    assert len(uploads) == 3
    gradops.fractional_avg_pool_grad([2, 7, 9, 3], device_arrays["a"][2], rows_a, cols, False, backend="cuda")
    assert len(uploads) == 4  # average pooling's tables are others


@pytest.mark.slow
@pytest.mark.parametrize("path", ["gather", "cells"])
def test_host_input_of_more_than_2_31_elements(monkeypatch, path):
    """Both paths' 64-bit offsets, executed on the CPU through the launcher: a float16
    orig_input of 46400 x 46344 = 2**31 + 2877952 elements in disjoint 8x8 cells, with many
    ties (61 distinct values).  gather: select runs in full (the gather reads every cell's
    choice and the mismatch flag must stay clear); of gather, the block whose walk ends at the
    last element runs.  cells: the last four blocks of cell columns of the last chunk of cell
    rows run, a region past the 2**31-th element.  Every element written past
    the 2**31-th is checked: out_backprop of its cell if it is the cell's first maximum in TF's
    scan order, else 0."""
    import importlib

    import cuda_host

    from gradops._geometry import fractional_max_pool_geometry
    from gradops.backends.cuda import _runtime

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    rows, cols, cell = 46400, 46344, 8
    total = rows * cols
    assert total > 2**31
    out_rows, out_cols = rows // cell, cols // cell
    sequence_rows, sequence_cols = list(range(0, rows + 1, cell)), list(range(0, cols + 1, cell))
    shape_out = (1, out_rows, out_cols, 1)
    g = fractional_max_pool_geometry("fractional_max_pool_grad", (1, rows, cols, 1), shape_out, shape_out,
                                     sequence_rows, sequence_cols, False)
    assert launcher.index_type(g) == "long long"
    p = launcher.max_cells_plan(g, np.float16, index="long long", vector=1)
    assert p.row_chunks > 1 and p.grid[0] == p.column_blocks > 4
    cells_rows = ((p.row_chunks - 1) * p.chunk_rows * cell, rows)
    cells_cols = ((p.column_blocks - 4) * p.block_columns * cell, cols)
    assert cells_rows[0] * cols >= 2**31

    def block_filter(expression, grid):
        if "_select<" in expression:
            return list(range(grid[0]))
        if "_cells<" in expression:
            return [bx + grid[0] * (p.row_chunks - 1) for bx in range(grid[0] - 4, grid[0])]
        return [((total - 1) % (grid[0] * _runtime.BLOCK_1D)) // _runtime.BLOCK_1D]

    device = cuda_host.HostDevice(block_filter=block_filter).install(monkeypatch)
    import cupy  # the HostDevice stand-in

    x = cupy.empty((1, rows, cols, 1), np.float16)
    x_flat = x.reshape(-1)
    y = np.empty((out_rows, out_cols), np.float16)
    first = np.empty((out_rows, out_cols), np.int64)  # flat index in its cell of the first maximum
    step = 64  # cell rows per chunk
    for top in range(0, out_rows, step):
        start, stop = top * cell * cols, min(out_rows, top + step) * cell * cols
        index = np.arange(start, stop, dtype=np.int64)
        chunk = (((index * 7919) % 61 - 30) / 16).astype(np.float16)  # exact in float16
        x_flat[start:stop] = chunk
        cells = chunk.reshape(-1, cell, out_cols, cell).transpose(0, 2, 1, 3).reshape(-1, out_cols, cell * cell)
        y[top:top + len(cells)] = cells.max(axis=2)
        first[top:top + len(cells)] = cells.argmax(axis=2)  # row by row, left to right: TF's scan
    dy = (np.random.default_rng(9).integers(-64, 64, (out_rows, out_cols)) / 64).astype(np.float16)
    got = launcher.fractional_max_pool_grad(g, x, cupy.asarray(y.reshape(shape_out)),
                                            cupy.asarray(dy.reshape(shape_out)), path=path)
    # <T, I, V, ...>: every launch indexes in 64 bits
    assert all(expression.split(", ")[1] == "long long" for expression, _, _ in device.launches)
    expression, grid, block = device.launches[-1]
    if path == "gather":
        assert "_gather<" in expression
        run = block_filter(expression, grid)[0]
        starts = np.arange(run * block[0], total, block[0] * grid[0])
        written = (starts[:, None] + np.arange(block[0])[None, :]).reshape(-1)
        written = written[(written < total) & (written >= 2**31)]
        assert written.size > 100 and written[-1] == total - 1
    else:
        assert "_grad_cells<" in expression and len(device.launches) == 1
        ys, xs = np.meshgrid(np.arange(*cells_rows), np.arange(*cells_cols), indexing="ij")
        written = (ys * cols + xs).reshape(-1)
        assert written.size > 100 and written[-1] == total - 1 and written[0] >= 2**31
    got_flat = got.reshape(-1)
    row, col = np.divmod(written, cols)
    r, q = row // cell, col // cell
    mine = (row % cell) * cell + col % cell == first[r, q]
    values = got_flat[cupy.asarray(written)] if hasattr(got_flat, "get") else got_flat[written]
    values = values.get() if hasattr(values, "get") else np.asarray(values)
    np.testing.assert_array_equal(values.astype(np.float32), np.where(mine, dy[r, q], 0).astype(np.float32))
    assert 0 < mine.sum() < written.size  # both kinds of element were checked


def test_cuda_refuses_what_tf_refuses(cuda_device):
    """orig_output other than the maxima, and a NaN first in its cell: InvalidArgumentError."""
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4, 1)
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    dy = np.ones(y.shape, np.float32)
    wrong = y.copy()
    wrong[1, 1, 0, 0] += 1
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(wrong), to_gpu(dy), [0, 2, 4], [0, 2, 4], backend="cuda")
    x[0, 2, 0, 0] = np.nan  # first element of cell (1, 0)
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy), [0, 2, 4], [0, 2, 4], backend="cuda")
    x[0, 2, 0, 0] = 0.0
    x[0, 3, 1, 0] = np.nan  # not first: skipped, as TF does
    y = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4])
    _check_cuda(x, y, dy, [0, 2, 4], [0, 2, 4], False)


def test_cuda_non_contiguous_inputs(cuda_device):
    import cupy

    rng = np.random.default_rng(8)
    rows, cols = [0, 2, 3, 5], [0, 2, 4, 6]
    x, y, dy = _cuda_case(rng, (2, 5, 6, 3), rows, cols, False, np.float32)
    want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols)
    # Every tensor a strided view: channels reversed through a doubled buffer.
    views = []
    for a in (x, y, dy):
        wide = to_gpu(np.repeat(a, 2, axis=3))
        views.append(wide[..., ::2])
    assert not views[0].flags.c_contiguous
    got = gradops.fractional_max_pool_grad(*views, rows, cols, backend="cuda")
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


def test_cuda_default_dispatch_and_deterministic(cuda_device):
    rng = np.random.default_rng(9)
    rows, cols = [0, 2, 3, 5, 7], [0, 1, 3, 6, 9]
    x, y, dy = _cuda_case(rng, (2, 7, 9, 3), rows, cols, True, np.float32)
    first = to_host(gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy), rows, cols, True))
    decision = gradops.last_backend_decision()
    assert decision.backend == "cuda" and "cuDNN has no fractional_max_pool_grad" in decision.reason
    second = to_host(gradops.fractional_max_pool_grad(to_gpu(x), to_gpu(y), to_gpu(dy), rows, cols, True))
    np.testing.assert_array_equal(first, second)


# ---- the cells kernel: cells that partition the input (disjoint or overlapping), in one pass


#: The cells kernel's choices the tests force: 64-bit indexing, one channel per thread, chunks
#: of one and of three cell rows, one channel group a block (several channel blocks).
CELLS_FORCED = {
    "planned": {},
    "index64": dict(index="long long"),
    "one_channel": dict(vector=False),
    "one_row_chunks": dict(chunk_rows=1),
    "three_row_chunks": dict(chunk_rows=3),
    "one_group_blocks": dict(block_vectors=1),
}


@pytest.mark.parametrize("forced", list(CELLS_FORCED))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_cells_kernel(cuda_device, overlapping, dtype, forced):
    """Tied inputs, generated partitions (ratios 1.44 to 3, cells of 1 to 3 rows and columns, 2
    to 4 where they overlap) and cut points (a cell of all rows but one), batches, depths with
    and without channel groups: the cells kernel gives NumPy's result bit for bit on every
    forced choice."""
    rng = np.random.default_rng(41)
    for shape, ratio in (((2, 13, 11, 16), 1.44), ((3, 9, 17, 5), 2.0), ((1, 10, 7, 24), 3.0)):
        for rows, cols in ((gradops.fractional_pooling_sequence(shape[1], ratio, True, seed=shape[1]),
                            gradops.fractional_pooling_sequence(shape[2], ratio, False, seed=shape[2])),
                           ([0, shape[1] - 1, shape[1]], [0, 1, 2, shape[2]])):
            x, y, dy = _cuda_case(rng, shape, rows, cols, overlapping, dtype)
            g = _geometry(x, y, dy, rows, cols, overlapping)
            got = to_host(max_launcher().fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), path="cells",
                                                                  **CELLS_FORCED[forced]))
            want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
            np.testing.assert_array_equal(got.view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))
            if cuda_device is not None:
                assert "_grad_cells<" in cuda_device.launches[-1][0]


@pytest.mark.parametrize("blocks", [1, 2], ids=["one_block", "two_blocks"])
@pytest.mark.parametrize("forced", ["planned", "three_row_chunks", "one_group_blocks"])
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_cells_kernel_capped_grids(cuda_device, overlapping, dtype, forced, blocks):
    """Grids capped at one or two blocks a dimension (cuda_host.capped_grids): each block strides
    over column blocks, chunks and channel blocks, and (overlapping cells) its threads start the
    next one only after all have read the last row's slots.  NumPy's result bit for bit."""
    import cuda_host

    rng = np.random.default_rng(43)
    shape = (3, 13, 11, 16)
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=2)
    cols = gradops.fractional_pooling_sequence(11, 1.5, False, seed=3)
    x, y, dy = _cuda_case(rng, shape, rows, cols, overlapping, dtype)
    g = _geometry(x, y, dy, rows, cols, overlapping)
    want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
    plan = max_launcher().max_cells_plan(g, np.dtype(dtype), vector=max_launcher().channels_per_thread(g, dtype),
                                         **CELLS_FORCED[forced])  # the launcher's plan (aligned arrays)
    real = plan.grid
    assert max(real) > blocks  # blocks of work for fewer blocks to stride over
    with cuda_host.capped_grids(blocks):
        capped = tuple(min(n, blocks) for n in real)
        assert plan.grid == capped
        got = to_host(max_launcher().fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), path="cells",
                                                              **CELLS_FORCED[forced]))
    np.testing.assert_array_equal(got.view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))
    if cuda_device is not None:
        assert cuda_device.launches[-1][1] == capped


@st.composite
def partition_cases(draw):
    """Random partitions (sorted cut points: cells of any size down to one row or column) of
    random shapes and depths, either mode, any dtype, tied or distinct input values."""
    n, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 14)), draw(st.integers(1, 14))
    rows = [0, *sorted(draw(st.sets(st.integers(1, h - 1)))), h] if h > 1 else [0, 1]
    cols = [0, *sorted(draw(st.sets(st.integers(1, w - 1)))), w] if w > 1 else [0, 1]
    return dict(shape=(n, h, w, draw(st.sampled_from([1, 2, 3, 8, 12, 16, 24, 40]))), rows=rows, cols=cols,
                overlapping=draw(st.booleans()), dtype=draw(st.sampled_from(ALL_DTYPES)), tied=draw(st.booleans()))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=partition_cases(), forced=st.sampled_from(list(CELLS_FORCED)), seed=st.integers(0, 2**32 - 1))
def test_cuda_cells_kernel_property(case, forced, seed):
    """Random partitions, shapes, depths, modes, dtypes and forced choices, blocks and threads in
    a random order on the host model: the cells kernel gives NumPy's result bit for bit."""
    import cuda_host

    if reason := cuda_host.unavailable_reason():
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    shape, rows, cols, overlapping, dtype = case["shape"], case["rows"], case["cols"], case["overlapping"], case["dtype"]
    assume(len(rows) * len(cols) <= np.prod(shape))  # else refused, as TF refuses it (test_refusals_name_the_argument)
    rng = np.random.default_rng(seed)
    x = tied_input(rng, shape, dtype) if case["tied"] else rng.permutation(np.prod(shape)).reshape(shape).astype(dtype)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    dy = rng.integers(-5, 6, y.shape).astype(dtype) if np.issubdtype(dtype, np.integer) else \
        rng.standard_normal(y.shape).astype(dtype)
    want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
    with pytest.MonkeyPatch.context() as monkeypatch:
        cuda_host.HostDevice(order="shuffled", seed=seed).install(monkeypatch)
        g = _geometry(x, y, dy, rows, cols, overlapping)
        force = dict(CELLS_FORCED[forced])
        if force.get("vector") is None and shape[3] % max_launcher().vector_channels(dtype):
            force.pop("vector", None)
        got = to_host(max_launcher().fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), path="cells",
                                                              **force))
    np.testing.assert_array_equal(got.view(f"u{want.itemsize}"), want.view(f"u{want.itemsize}"))


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_cells_kernel_refuses_what_tf_refuses(cuda_device, overlapping):
    """A wrong orig_output and a NaN first in its cell: InvalidArgumentError from the cells kernel
    too; a NaN later in a cell is skipped; -0.0 out_backprop becomes +0.0 (TF's += into zeros).
    Overlapping cells [0, 2] and [2, 3]: the NaN first in cell (1, 0) is also inside cell (0, 0),
    not first there."""
    launcher = max_launcher()
    x = np.arange(32, dtype=np.float32).reshape(2, 4, 4, 1)
    rows = cols = [0, 2, 4]
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    dy = np.ones(y.shape, np.float32)
    dy[0, 0, 1, 0] = -0.0
    wrong = y.copy()
    wrong[1, 1, 0, 0] += 1
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        launcher.fractional_max_pool_grad(_geometry(x, wrong, dy, rows, cols, overlapping), to_gpu(x), to_gpu(wrong),
                                          to_gpu(dy), path="cells")
    got = to_host(launcher.fractional_max_pool_grad(_geometry(x, y, dy, rows, cols, overlapping), to_gpu(x), to_gpu(y),
                                                    to_gpu(dy), path="cells"))
    assert not np.signbit(got).any()
    x[0, 2, 0, 0] = np.nan  # first element of cell (1, 0)
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    with pytest.raises(gradops.InvalidArgumentError, match="orig_output"):
        launcher.fractional_max_pool_grad(_geometry(x, y, dy, rows, cols, overlapping), to_gpu(x), to_gpu(y), to_gpu(dy),
                                          path="cells")
    x[0, 2, 0, 0] = 0.0
    x[0, 3, 1, 0] = np.nan  # not first: skipped, as TF does
    y = gradops.fractional_max_pool(x, rows, cols, overlapping)
    _check_cuda(x, y, dy, rows, cols, overlapping)


def mode(overlapping):
    return "overlapping" if overlapping else "disjoint"


def test_cells_path_choice(monkeypatch):
    """The launcher's choice (CELLS_BY_DEFAULT): cells for partitions, disjoint and overlapping
    (measured on an H200, 2026-12-04), each mode's default can be turned either way; only cells
    that partition the input take the cells kernel; forcing it elsewhere is refused with the
    reason."""
    launcher = max_launcher()
    assert launcher.CELLS_BY_DEFAULT == {"disjoint": True, "overlapping": True}
    x = np.zeros((1, 5, 5, 1), np.float32)

    def geometry(rows, cols, overlapping):
        y = np.zeros((1, len(rows) - 1, len(cols) - 1, 1), np.float32)
        return _geometry(x, y, y, rows, cols, overlapping)

    for overlapping in (False, True):
        partition = geometry([0, 2, 5], [0, 3, 5], overlapping)
        assert launcher.cells_bounds(partition)[0].tolist() == [0, 2, 5]
        assert launcher.cells_bounds(partition)[1].tolist() == [0, 3, 5]
        assert launcher.pick_path(partition, np.float32) == "cells"
        assert launcher.pick_path(partition, np.float32, "cells") == "cells"
        assert launcher.pick_path(partition, np.float32, "gather") == "gather"
        for default in ({"disjoint": False, "overlapping": True}, {"disjoint": True, "overlapping": False}):
            monkeypatch.setattr(launcher, "CELLS_BY_DEFAULT", default)
            assert launcher.pick_path(partition, np.float32) == ("cells" if default[mode(overlapping)] else "gather")
        monkeypatch.undo()
    # row 4 in no disjoint cell; row 0 in no overlapping cell; a one-row cell inside its neighbour
    for other in (geometry([0, 2, 4], [0, 3, 5], False), geometry([1, 3, 5], [0, 3, 5], True),
                  geometry([0, 2, 2, 5], [0, 3, 5], True)):
        assert launcher.cells_bounds(other) is None
        assert launcher.pick_path(other, np.float32) == "gather"
        with pytest.raises(ValueError, match="partition"):
            launcher.pick_path(other, np.float32, "cells")
    with pytest.raises(ValueError, match="no kernel path"):
        launcher.pick_path(partition, np.float32, "select")


def test_cells_block_has_a_halo_row_for_overlapping_cells():
    """The overlapping cells kernel's block holds CELLS_THREADS threads (the kernel's
    kMaxCellsThreads, which sizes its shared memory), one row of them the halo: at most
    HALO_VECTORS vectors wide unless forced, the rest its columns, which the grid covers; disjoint
    cells take cells_plan's block."""
    from gradops.backends.cuda import _build
    from gradops.backends.cuda.fractional_avg_pool_grad import CELLS_THREADS, cells_plan

    launcher = max_launcher()
    source = (_build.source_dir() / launcher.SOURCE).read_text()
    assert "constexpr int kMaxCellsThreads = 128;" in source and CELLS_THREADS == 128
    rows = cols = [0, 2, 5, 9]
    for depth, planned in ((64, 16), (256, 16), (8, 2)):  # float32 vectors of 4: 16, 64 (32 a block) and 2
        x = np.zeros((3, 9, 9, depth), np.float32)
        for overlapping in (False, True):
            y = np.zeros((3, 3, 3, depth), np.float32)
            g = _geometry(x, y, y, rows, cols, overlapping)
            for forced in (None, 1, 2):
                p = launcher.max_cells_plan(g, np.float32, vector=4, block_vectors=forced)
                block = p.block  # the launch's block
                if not overlapping:
                    assert p == cells_plan(g, np.float32, vector=4, block_vectors=forced) and block == p.block
                    continue
                assert block[0] * block[1] == CELLS_THREADS and block == (p.block_vectors, p.block_columns + 1)
                assert p.block_vectors == (forced or planned)
                assert p.column_blocks * p.block_columns >= 3 * 3 > (p.column_blocks - 1) * p.block_columns
                assert p.channel_blocks * p.block_vectors == depth // 4


def _corner_problem():
    """(x, orig_output, out_backprop, rows, cols) of float32 overlapping 3 x 3 cells whose
    shared corner (2, 2) is the maximum of the four cells around it, with out_backprop 1e8, 1,
    -1e8, 1 in those cells (channel 0; the other channels rotate them): the corner's gradient
    depends on the order of its four terms (TF's: cells (0, 0), (0, 1), (1, 0), (1, 1))."""
    rng = np.random.default_rng(7)
    x = rng.random((1, 5, 5, 4)).astype(np.float32)
    x[0, 2, 2, :] = 10.0
    rows = cols = [0, 2, 4, 5]
    y = gradops.fractional_max_pool(x, rows, cols, True)
    dy = rng.random(y.shape).astype(np.float32)
    terms = np.array([1e8, 1.0, -1e8, 1.0], np.float32)
    for channel in range(4):
        dy[0, :2, :2, channel] = np.roll(terms, channel).reshape(2, 2)
    return x, y, dy, rows, cols


def test_cuda_cells_overlapping_sum_order(cuda_device):
    """A corner in four overlapping cells takes their out_backprop in TF's order, as gather and
    NumPy do: ((1e8 + 1) - 1e8) + 1 = 1 in float32, not the 2 of another order."""
    x, y, dy, rows, cols = _corner_problem()
    got = _check_cuda(x, y, dy, rows, cols, True)  # gather and the cells kernel, bit for bit
    assert got[0, 2, 2, 0] == 1.0


#: Rows of the one narrow cell of one of :func:`_cells_problem`'s calls: 4 x TALL_ROWS elements,
#: more places than a PairScan holds (16 bits), so the cell takes the wide cells' loop.
TALL_ROWS = 16400
#: Rows of the one overlapping cell of another: 4 x PAIR_ROWS elements, the most that the
#: overlapping kernel's pairs of half types take (the launcher's PAIR_PLACES).
PAIR_ROWS = max_launcher().PAIR_PLACES // 4


def _cells_problem():
    """(cells-kernel results, NumPy's) of thirteen calls: float32 over a tied input with generated
    cells of 1 to 3 rows and columns in chunks of two cell rows, one channel group a block (4
    channel blocks), two batch items; float16 with cells of 1 to 9 rows; float32 with the same
    generated sequences overlapping (cells of 2 to 3 rows and columns); float32 with four
    overlapping cells choosing their shared corner (:func:`_corner_problem`); float64 with
    overlapping cells of 3 to 5 rows and columns over an input of distinct values (an interior
    maximum whose out_backprop is -0.0); float32 overlapping over five batch items in the
    launcher's plan (4 vectors a block, so 32 cell columns a block: two blocks, a halo of a
    column in use, and left neighbours across batch items); that call and the first's forced
    choices over overlapping cells again with one block (cuda_host.capped_grids), which
    loops over the column blocks, chunks and channel blocks; float16 and bfloat16 over the
    generated overlapping cells (PairScan and the region in pairs, a tied input); float16 with one
    disjoint cell of 4 columns and TALL_ROWS rows whose maximum is its last element (past 2**16
    places); float16 over overlapping cells of up to 7 columns (the element-at-a-time scan, the
    region in pairs); float16 with one overlapping cell of 4 x PAIR_ROWS elements whose maximum
    is its last element (the last place the pairs hold).  Each
    with a -0.0 in out_backprop (+0.0 in the result), and a wrong orig_output in a second call;
    whether a call was refused is part of the result."""
    import contextlib

    import cuda_host

    launcher = max_launcher()
    rng = np.random.default_rng(13)
    got, want = [], []
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=2).tolist()
    cols = gradops.fractional_pooling_sequence(11, 1.5, False, seed=3).tolist()
    corner = _corner_problem()
    force = dict(chunk_rows=2, block_vectors=1)
    for shape, rows, cols, dtype, force, overlapping in (((2, 13, 11, 16), rows, cols, np.float32, force, False),
                                                         ((2, 10, 7, 8), [0, 9, 10], [0, 1, 2, 7], np.float16, {}, False),
                                                         ((2, 13, 11, 16), rows, cols, np.float32, force, True),
                                                         (corner[0].shape, corner[3], corner[4], np.float32, {}, True),
                                                         ((1, 14, 13, 4), [0, 3, 5, 9, 14], [0, 4, 6, 8, 13], np.float64,
                                                          {}, True),
                                                         ((5, 13, 11, 16), rows, cols, np.float32, {}, True),
                                                         ((5, 13, 11, 16), rows, cols, np.float32, dict(one_block=True), True),
                                                         ((2, 13, 11, 16), rows, cols, np.float32,
                                                          dict(force, one_block=True), True),
                                                         ((2, 13, 11, 16), rows, cols, np.float16, {}, True),
                                                         ((2, 13, 11, 16), rows, cols, ml_dtypes.bfloat16, {}, True),
                                                         ((1, TALL_ROWS, 4, 8), [0, TALL_ROWS], [0, 4], np.float16, {},
                                                          False),
                                                         ((2, 14, 13, 8), [0, 4, 9, 14], [0, 5, 11, 13], np.float16, {},
                                                          True),
                                                         ((1, PAIR_ROWS, 4, 8), [0, PAIR_ROWS], [0, 4], np.float16, {},
                                                          True)):
        if shape[1] in (TALL_ROWS, PAIR_ROWS):
            x = rng.integers(-2, 3, shape).astype(dtype)
            x[0, -1, -1, :] = 100  # the maximum at the last place of the one cell's scan
            y = gradops.fractional_max_pool(x, rows, cols, overlapping)
            dy = rng.standard_normal(y.shape).astype(dtype)
        elif shape == corner[0].shape:
            x, y, dy = (a.copy() for a in corner[:3])
        elif dtype == np.float64:
            x = rng.permutation(np.prod(shape)).reshape(shape).astype(dtype)
            x[0, 4, 5, :] = 1e6  # the maximum of cell (1, 1) only, inside its region
            y = gradops.fractional_max_pool(x, rows, cols, overlapping)
            dy = rng.standard_normal(y.shape)
            dy[0, 1, 1, :] = -0.0
        else:
            x, y, dy = _cuda_case(rng, shape, rows, cols, overlapping, dtype)
        dy[0, -1, 0, 0] = -0.0
        g = _geometry(x, y, dy, rows, cols, overlapping)
        want.append(gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy").reshape(-1).view(np.uint8))
        wrong = y.copy()
        wrong[-1, -1, -1, -1] += 1
        force = dict(force)
        one_block = force.pop("one_block", False)
        for orig_output, refused in ((y, False), (wrong, True)):
            try:
                with cuda_host.capped_grids() if one_block else contextlib.nullcontext():
                    out = launcher.fractional_max_pool_grad(g, to_gpu(x), to_gpu(orig_output), to_gpu(dy),
                                                            path="cells", **force)
                if not refused:
                    got.append(to_host(out).reshape(-1).view(np.uint8))
                got.append(np.zeros(1, np.uint8))
            except gradops.InvalidArgumentError:
                got.append(np.ones(1, np.uint8))
            want.append(np.array([refused], np.uint8))
    return got, want


#: The cells kernels' shared work split (fractional_avg_pool_grad_cells takes it too).
CELLS_HEADER = "fractional_cells.cuh"

PLANTED_CELLS = {  # bugs in the cells kernel: name -> (text of the real source, its replacement[, file])
    # the scan: wide cells one element at a time, narrow ones a row at a time
    "cells-first-element-scanned-twice": ("for (I x = y == 0 ? 1 : 0; x < cols; ++x) {", "for (I x = 0; x < cols; ++x) {"),
    "cells-scan-skips-the-last-row": ("for (I y = 0; y < rows; ++y) {\n#pragma unroll 1\n            for (I x = y == 0",
                                      "for (I y = 0; y < rows - 1; ++y) {\n#pragma unroll 1\n            for (I x = y == 0"),
    "cells-narrow-scan-skips-the-last-column": ("if (j >= cols) break;\n            if (j == 0 && y == 0) {\n                scan.begin(row[0]);",
                                                "if (j + 1 >= cols) break;\n            if (j == 0 && y == 0) {\n                scan.begin(row[0]);"),
    "cells-narrow-scan-place-ignores-the-rows-above": ("++y, place += cols) {\n        const I row_first = first + y * in_row;\n        if (y > 0",
                                                       "++y, place += 0) {\n        const I row_first = first + y * in_row;\n        if (y > 0"),
    "cells-narrow-scan-loads-the-first-row-again": ("if (j < cols) row[j] = load_pack<V>(input + row_first + j * depth);",
                                                    "if (j < cols) row[j] = load_pack<V>(input + first + j * depth);"),
    "cells-mismatch-never-flagged": ("if (differs) mismatch[0] = 1;", "if (differs) mismatch[0] = 0;"),
    # disjoint cells' writes
    "cells-negative-zero-kept": ("chosen[u] = from_acc<T, A>(A(0) + to_acc<A, T>(grads.v[u]));",
                                 "chosen[u] = grads.v[u];"),
    "cells-writes-skip-the-last-column": ("for (I x = 0; x < cols; ++x) {\n                            Pack<T, V> out;",
                                          "for (I x = 0; x < cols - 1; ++x) {\n                            Pack<T, V> out;"),
    "cells-writes-place-ignores-the-rows-above": ("for (I y = 0; y < rows; ++y, place += cols) {\n                        T* const dx",
                                                  "for (I y = 0; y < rows; ++y, place += 0) {\n                        T* const dx"),
    "cells-region-rows-of-the-next-cell": ("const I y0 = row_bounds[r], rows = row_bounds[r + 1] - y0;",
                                           "const I y0 = row_bounds[r], rows = row_bounds[r + 1] - y0 + (r + 1 < out_rows);"),
    # the disjoint kernel's threads (fractional_cells.cuh)
    "cells-batch-item-from-a-wrong-split": ("n = magic_divide(j, out_cols_magic, out_cols_shift);\n                } else {\n                    n = j / out_cols;\n                }\n                work(n, j - n * out_cols, ch, r0, r1);",
                                            "n = magic_divide(j, out_cols_magic, out_cols_shift + 1);\n                } else {\n                    n = j / out_cols;\n                }\n                work(n, j - n * out_cols, ch, r0, r1);", CELLS_HEADER),
    "cells-channel-block-ignored": ("const I ch = (bz * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x)) * V;",
                                    "const I ch = static_cast<I>(threadIdx.x) * V;", CELLS_HEADER),
    "cells-chunk-skips-its-last-row": ("const I r1 = min(r0 + chunk_rows, out_rows);",
                                       "const I r1 = min(r0 + chunk_rows - 1, out_rows);", CELLS_HEADER),
    # overlapping cells: the held row, the neighbours through shared memory, the sums
    "cells-cell-without-the-shared-column": ("width = cols + (c + 1 < out_cols);", "width = cols;"),
    "cells-cell-without-the-shared-row": ("const I height = rows + (r + 1 < out_rows);", "const I height = rows;"),
    "cells-held-row-kept-across-columns": ("bool have_held = false;\n", "bool have_held = true;\n"),
    "cells-held-row-taken-for-every-row": ("if (y > 0 || !first_row_held) {", "if (!first_row_held) {"),
    # PairScan: two channels a compare, places in 16 bits
    "cells-pair-scan-ties-go-to-the-later-element": ("__hlt2_mask(word_pair<T>(value[k]), word_pair<T>(element))",
                                                     "__hle2_mask(word_pair<T>(value[k]), word_pair<T>(element))"),
    "cells-pair-scan-place-in-the-low-half-only": ("return (place + bias) * 0x10001u;", "return (place + bias) * 0x1u;"),
    "cells-pair-scan-keeps-the-first-value": ("value[k] = (element & wins) | (value[k] & ~wins);", ""),
    "cells-pair-scan-high-place-from-the-low-half": ("best.v[2 * k + 1] = static_cast<I>(place[k] >> 16);",
                                                     "best.v[2 * k + 1] = static_cast<I>(place[k] & 0xFFFFu);"),
    "cells-pair-scan-checks-the-low-channel-only": (
        "return __heq2_mask(word_pair<T>(value[k]), word_pair<T>(pair_word(maxima, k))) != 0xFFFFFFFFu;",
        "return (__heq2_mask(word_pair<T>(value[k]), word_pair<T>(pair_word(maxima, k))) & 0xFFFFu) != 0xFFFFu;"),
    "cells-pair-scan-for-cells-past-16-bit-places": ("rows <= kPairScanPlaces / kCarryCols", "rows <= kPairScanPlaces"),
    "cells-chunk-without-the-row-above": ("const I r_first = r0 > 0 ? r0 - 1 : r0;", "const I r_first = r0;"),
    # the carried cell-row bounds: this row's first input row, and the row above's
    "cells-carried-bound-not-advanced": ("y0_above = y0;\n                    y0 = y_end;", "y0_above = y0;"),
    "cells-row-above-bound-never-carried": ("y0_above = y0;\n                    y0 = y_end;", "y0 = y_end;"),
    "cells-row-above-bound-one-row-late": ("y0_above = y0;\n                    y0 = y_end;",
                                           "y0 = y_end;\n                    y0_above = y0;"),
    "cells-row-above-writes-too": ("const bool writes = r >= r0 && !halo;", "const bool writes = !halo;"),
    "cells-halo-writes-too": ("const bool writes = r >= r0 && !halo;", "const bool writes = r >= r0;"),
    "cells-no-barrier-before-the-neighbours-are-read": (
        "__syncthreads();  // the neighbours' choices of row r are in passed[buffer]", ""),
    "cells-no-barrier-before-the-next-block-of-columns": (
        "__syncthreads();  // the last row's slots are read before the next block of columns writes them", ""),
    "cells-two-buffers-for-three-rows": ("buffer = buffer == 2 ? 0 : buffer + 1)", "buffer = buffer == 1 ? 0 : buffer + 1)"),
    "cells-left-slot-of-the-right-neighbour": ("const int left_slot = slot - static_cast<int>(blockDim.x);",
                                               "const int left_slot = slot + static_cast<int>(blockDim.x);"),
    "cells-halo-not-left-of-the-first-column": ("static_cast<I>(threadIdx.y) - 1;  // the halo's: j0 - 1",
                                                "static_cast<I>(threadIdx.y);  // the halo's: j0 - 1"),
    "cells-block-columns-with-the-halo": ("const I block_columns = static_cast<I>(blockDim.y) - 1;",
                                          "const I block_columns = static_cast<I>(blockDim.y);"),
    "cells-overlapping-batch-item-from-a-wrong-split": ("n = magic_divide(j, out_cols_magic, out_cols_shift);\n                    } else {",
                                                        "n = magic_divide(j, out_cols_magic, out_cols_shift + 1);\n                    } else {"),
    "cells-corner-at-a-wrong-place": ("passed[above].get(left_slot), height_above * left_width - 1)",
                                      "passed[above].get(left_slot), height_above * left_width - 2)"),
    "cells-row-above-one-row-low": ("const I up_first = (height_above - 1) * width;", "const I up_first = height_above * width;"),
    "cells-left-place-not-advanced": ("left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    A sum",
                                      "left_place += left_width - 1) {\n                                    T* const dx_row = dx + y * in_row;\n                                    A sum"),
    "cells-writes-place-ignores-the-shared-column": ("place += width, left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    A sum",
                                                     "place += cols, left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    A sum"),
    "cells-corner-left-place-of-row-one": ("passed[buffer].get(left_slot), left_width - 1)",
                                           "passed[buffer].get(left_slot), 2 * left_width - 1)"),
    "cells-overlapping-negative-zero-kept": (
        "chosen[u] = from_acc<T, A>(A(0) + to_acc<A, T>(own.grads.v[u]));", "chosen[u] = own.grads.v[u];"),
    "cells-sum-starts-from-negative-zero": ("start_sum(A (&sum)[V]) {\n#pragma unroll\n    for (int u = 0; u < V; ++u) sum[u] = A(0);",
                                            "start_sum(A (&sum)[V]) {\n#pragma unroll\n    for (int u = 0; u < V; ++u) sum[u] = -A(0);"),
    "cells-left-added-before-the-cell-above": (
        "if (has_up) add_chosen(sum, passed[above].get(slot), up_first);\n"
        "                            if (has_left) add_chosen(sum, passed[buffer].get(left_slot), left_width - 1);",
        "if (has_left) add_chosen(sum, passed[buffer].get(left_slot), left_width - 1);\n"
        "                            if (has_up) add_chosen(sum, passed[above].get(slot), up_first);"),
    "cells-corner-without-its-own-cell": ("add_chosen(sum, own, I(0));", ""),
    "cells-first-row-skips-its-second-element": ("for (I x = 1; x < cols; ++x) {\n                                    A sum[V];",
                                                 "for (I x = 2; x < cols; ++x) {\n                                    A sum[V];"),
    "cells-first-row-without-the-cell-above": ("add_chosen(sum, up, up_first + x);", ""),
    "cells-first-row-reads-the-cell-above-from-this-row": ("has_up ? passed[above].get(slot) : no_choice",
                                                           "has_up ? passed[buffer].get(slot) : no_choice"),
    "cells-first-column-without-the-left-cell": ("add_chosen(sum, left, left_place);", ""),
    # the overlapping region in pairs (PairChoice: float16 and bfloat16, 8 channels a thread)
    "cells-pairs-narrow-places-unbiased": ("PairScan<T, V, I, kPlaceBias> scan;", "PairScan<T, V, I, 0u> scan;"),
    "cells-pairs-wide-places-unbiased": ("<< 16) +\n                      spread_place(0u);", "<< 16);"),
    "cells-pairs-high-place-shifted-short": ("static_cast<unsigned>(best.v[2 * k + 1]) << 16",
                                            "static_cast<unsigned>(best.v[2 * k + 1]) << 15"),
    "cells-pairs-negative-zero-kept": ("__hadd2(zero, word_pair<T>(pair_word(grads, k)))",
                                       "word_pair<T>(pair_word(grads, k))"),
    "cells-pairs-mask-keeps-the-high-channel": ("return pair_word(cell.grads, k) & match;",
                                                "return pair_word(cell.grads, k) & (match | 0xFFFF0000u);"),
    "cells-pairs-two-cells-drop-the-first": (
        "__hadd2(word_pair<T>(chosen_word(a, k, a_spread)), word_pair<T>(chosen_word(b, k, b_spread)))",
        "__hadd2(word_pair<T>(0u), word_pair<T>(chosen_word(b, k, b_spread)))"),
    "cells-pairs-corner-takes-the-low-channel-twice": (": sum[2 * k + 1] + to_acc<A, T>(two[1]);",
                                                       ": sum[2 * k + 1] + to_acc<A, T>(two[0]);"),
    "cells-pairs-corner-first-term-takes-the-low-channel-twice": ("START ? to_acc<A, T>(two[1])", "START ? to_acc<A, T>(two[0])"),
    "cells-pairs-corner-first-term-dropped": ("add_chosen<true>(sum, cell, place);", "start_sum(sum);"),
    "cells-pairs-bias-past-the-finite-halves": ("kPlaceBias = 0x0400u;", "kPlaceBias = 0x0800u;"),
    "cells-pairs-first-row-skips-its-second-element": ("for (I x = 1; x < cols; ++x)\n                                    store_pack<V>(dx + x",
                                                       "for (I x = 2; x < cols; ++x)\n                                    store_pack<V>(dx + x"),
    "cells-pairs-first-row-without-the-cell-above": ("two_cells(up, up_first + x, own, x)",
                                                     "two_cells(no_pair_choice<T, V>(), up_first + x, own, x)"),
    "cells-pairs-first-row-reads-the-cell-above-from-this-row": ("has_up ? passed[above].get(slot) : no_pair_choice",
                                                                 "has_up ? passed[buffer].get(slot) : no_pair_choice"),
    "cells-pairs-first-column-without-the-left-cell": ("two_cells(left, left_place, own, place)",
                                                       "two_cells(no_pair_choice<T, V>(), left_place, own, place)"),
    "cells-pairs-left-place-not-advanced": (
        "left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    store",
        "left_place += left_width - 1) {\n                                    T* const dx_row = dx + y * in_row;\n                                    store"),
    "cells-pairs-writes-place-ignores-the-shared-column": (
        "place += width, left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    store",
        "place += cols, left_place += left_width) {\n                                    T* const dx_row = dx + y * in_row;\n                                    store"),
    "cells-pairs-interior-at-the-next-place": ("one_cell(own, place + x)", "one_cell(own, place + x + 1)"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_CELLS))
def test_planted_cells_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    import cuda_host

    def same(got, want):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)

    text, replacement, *where = PLANTED_CELLS[bug]
    cuda_host.assert_planted_bug_caught(where[0] if where else max_launcher().SOURCE, (text, replacement),
                                        _cells_problem, same, 11, tmp_path, monkeypatch)


# ---- bugs planted in copies of the kernel source must fail the comparison (tests/test_cuda_host.py's pattern)

PLANTED = {  # name: (text of the real source, its replacement[, chosen elements as cell places or flat offsets])
    "ties-go-to-the-last": ("if (best_value[u] < value) {", "if (best_value[u] <= value) {"),
    "first-element-skipped-twice": ("(y == y0 ? x0 + 1 : x0)", "x0 + 1"),
    "last-row-of-a-narrow-cell-dropped": ("for (I y = y0; y <= y1; ++y) {\n                    const I row_first",
                                          "for (I y = y0; y < y1; ++y) {\n                    const I row_first"),
    "last-row-of-a-wide-cell-dropped": ("for (I y = y0; y <= y1; ++y) {\n                    const I row = ",
                                        "for (I y = y0; y < y1; ++y) {\n                    const I row = "),
    "held-row-taken-for-the-next-row": ("held_row = y;", "held_row = y + 1;"),
    "narrow-cell-last-column-skipped": ("if (j >= cols) break;\n                        if (j == 0 && y == y0) {",
                                        "if (j + 1 >= cols) break;\n                        if (j == 0 && y == y0) {"),
    "narrow-cell-place-ignores-the-rows-above": ("const I row_place = (y - y0) * cols;", "const I row_place = 0;",
                                                 True),
    "first-choice-drops-the-channel": ("static_cast<C>(offset + u);", "static_cast<C>(offset);", False),
    "wide-cell-held-as-narrow": ("if (cols <= kCarryCols) {\n                // (one row an iteration",
                                 "if (cols <= kCarryCols + 2) {\n                // (one row an iteration"),
    "run-one-cell-short": ("? r0 + run : out_rows;", "? r0 + run - 1 : out_rows;"),
    "mismatch-never-flagged": ("*mismatch = 1;", "*mismatch = 0;"),
    "overlap-sums-one-cell-only": ("q_end = col_offsets[x + 1];", "q_end = col_offsets[x] + 1;"),
    "chosen-compared-with-the-wrong-index": ("picks.v[u] == static_cast<C>(i + u)",
                                             "picks.v[u] == static_cast<C>(i + u + 1)", False),
    "select-drops-the-channel-of-a-lane": ("LOCAL ? place : offset + u", "LOCAL ? place : offset", False),
    "select-place-not-advanced": ("++place;", "", True),
    "gather-place-ignores-the-rows-above": ("row.before * col.size", "0 * col.size", True),
    "gather-place-ignores-the-column": ("+ col.before)", ")", True),
    "gather-adds-only-when-lane-0-matches": ("if (mine.any()) {", "if (mine.has(0)) {"),
    "gather-reads-the-first-channel-only": ("const I c = (t - pixel * groups) * V;", "const I c = 0;"),
    "gather-byte-match-ignores-bit-7": ("| x) & live;", ") & live;", True),
    "gather-byte-match-lets-carries-cross": ("((x & 0x7f7f7f7fu) + 0x7f7f7f7fu)", "(x + 0x7f7f7f7fu)", True),
    "gather-takes-channel-3-for-channel-1": ("(word[u / 4] >> (8 * (u % 4) + 7)) & 1u",
                                             "(word[u / 4] >> (8 * ((u ^ 2) % 4) + 7)) & 1u", True),
    "gather-division-shift-off-by-one": ("return magic_divide(n, magic, shift);",
                                         "return magic_divide(n, magic, shift + 1);"),
    "gather-row-entries-one-short": ("const I rk_end = row_offsets[y + 1];", "const I rk_end = row_offsets[y + 1] - 1;"),
}


#: Bugs in gather's byte matching that only places of 128 or more show: their planted problem
#: has cells of 12 x 12 = 144 elements.
LARGE_CELL_BUGS = {"gather-byte-match-ignores-bit-7", "gather-byte-match-lets-carries-cross"}


def _planted_problem(wrong_output=False, local=None, large_cells=False):
    """(CUDA result or the error it raised, NumPy result): overlapping cells over a tied input
    (5 row cells: a select run of 4 and one of 1; cells of 2 to 4 columns and one of 6, which
    takes select's element-at-a-time loop), 8 channels (4 per thread); ``local``: the chosen elements as cell places or flat offsets
    (None: the launcher's choice, places).  ``large_cells``: instead, disjoint 12 x 12 cells of
    distinct values, so that chosen places run past 127 (one-byte places with bit 7 set)."""
    import importlib

    from gradops._geometry import fractional_max_pool_geometry

    launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")
    rng = np.random.default_rng(5)
    if large_cells:
        rows, cols, overlapping = [0, 12, 24], [0, 12, 24], False
        x = rng.permutation(2 * 24 * 24 * 8).astype(np.float32).reshape(2, 24, 24, 8)
        y = gradops.fractional_max_pool(x, rows, cols, overlapping)
        dy = rng.standard_normal(y.shape).astype(np.float32)
    else:
        rows, cols, overlapping = [0, 1, 2, 4, 5, 6], [0, 5, 7, 8, 11], True
        x, y, dy = _cuda_case(rng, (2, 7, 12, 8), rows, cols, overlapping, np.float32)
    if wrong_output:
        y = y.copy()
        y.reshape(-1)[4] += 1
    want = (gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
            if not wrong_output else None)
    g = fractional_max_pool_geometry("fractional_max_pool_grad", x.shape, y.shape, dy.shape, rows, cols, overlapping)
    try:
        # select + gather, which the planted bugs edit (the disjoint large cells would take the cells kernel)
        got = to_host(launcher.fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), local=local,
                                                        path="gather"))
    except gradops.InvalidArgumentError as exc:
        return exc, want
    return got, want


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    import importlib

    import cuda_host

    cuda_launcher = importlib.import_module("gradops.backends.cuda.fractional_max_pool_grad")

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    text, replacement, *local = PLANTED[bug]
    local = local[0] if local else None
    wrong_output = bug == "mismatch-never-flagged"  # that bug shows only on an orig_output to refuse
    large = bug in LARGE_CELL_BUGS
    # The real source gets this problem right (or refuses it) ...
    real = cuda_host.HostDevice(order="shuffled", seed=11).install(monkeypatch)
    got, want = _planted_problem(wrong_output, local, large)
    if wrong_output:
        assert isinstance(got, gradops.InvalidArgumentError)
    else:
        np.testing.assert_array_equal(got, want)

    # ... and the edited one does not.
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=11, source_dir=tmp_path,
                         build_together=real.requested).install(monkeypatch)
    try:
        got, want = _planted_problem(wrong_output, local, large)
    except (AssertionError, cuda_host.HostLaunchError):
        return  # refused: a read or write outside an array
    if wrong_output:
        assert not isinstance(got, gradops.InvalidArgumentError)
    else:
        assert isinstance(got, gradops.InvalidArgumentError) or not np.array_equal(got, want)


def test_cuda_racecheck(racecheck_device):
    """No shared-memory hazard in the cells kernel's exchange of choices between neighbouring
    threads (racecheck builds on the host, which fail a launch at the first one): the eight
    calls of :func:`_cells_problem`, with the launcher's grid and with one block that loops over
    column blocks, chunks and channel blocks; and select + gather on the same sequences."""
    got, want = _cells_problem()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    rng = np.random.default_rng(17)
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=2).tolist()
    cols = gradops.fractional_pooling_sequence(11, 1.5, False, seed=3).tolist()
    for overlapping in (False, True):
        x = rng.standard_normal((2, 13, 11, 16)).astype(np.float32)
        y = gradops.fractional_max_pool(x, rows, cols, overlapping)
        _check_cuda(x, y, rng.standard_normal(y.shape).astype(np.float32), rows, cols, overlapping)


#: Forced choices of the launcher for the tiny maps: select + gather with channel vectors where
#: the depth allows and one channel a thread, flat offsets, 64-bit indices, two rows a select
#: thread; the cells kernel with one channel a thread and with 64-bit indices in one-row chunks.
TINY_CHOICES = {"auto": {}, "gather": dict(path="gather"), "gather-scalar": dict(path="gather", vector=False),
                "gather-flat": dict(path="gather", local=False),
                "gather-64": dict(path="gather", index="long long", run=2), "cells": dict(path="cells"),
                "cells-scalar": dict(path="cells", vector=False),
                "cells-64": dict(path="cells", index="long long", chunk_rows=1)}


@pytest.mark.parametrize("choice", list(TINY_CHOICES))
@pytest.mark.parametrize("dtype", FRACTIONAL_POOL_DTYPES, ids=lambda d: np.dtype(d).name)
def test_cuda_tiny_maps_memcheck(racecheck_device, choice, dtype):
    """Each kernel on tiny maps, disjoint and overlapping, in racecheck builds: no access outside
    orig_input, orig_output, out_backprop, the choices or the input gradient (the guard bytes
    around each array), no shared-memory hazard, the NumPy backend's bits.  A forced kernel that
    cannot run a case (the cells kernel on cells that do not partition the input) skips it; each
    runs at least one.  The 1x1 map has more sequence entries than elements, which TF refuses."""
    rng = np.random.default_rng(43)
    ran = 0
    for shape, rows, cols in TINY_POOLS:
        for overlapping in (False, True):
            x, y, dy = _cuda_case(rng, shape, rows, cols, overlapping, dtype)  # ties in the cells
            if len(rows) * len(cols) > x.size:
                continue  # TF's "Pooling region" bound refuses it (the 1x1 map)
            want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, overlapping, backend="numpy")
            try:
                got = max_launcher().fractional_max_pool_grad(_geometry(x, y, dy, rows, cols, overlapping), to_gpu(x),
                                                              to_gpu(y), to_gpu(dy), **TINY_CHOICES[choice])
            except ValueError as error:
                if "cells kernel takes" not in str(error):
                    raise
                continue
            got = to_host(got)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), want.view(f"u{want.itemsize}"))
            ran += 1
    assert ran >= (2 * len(TINY_POOLS) - 2 if choice == "auto" else 1), f"{choice} ran {ran} cases"


def _slot_bank_figures(device, dtypes=(np.float16, np.float32, np.float64, np.int64)):
    """{(dtype, "load" / "store"): the host model's shared-memory counts} of the overlapping cells
    kernel's exchange of choices (SlotWords), with 32 channel vectors a block (the halo row one
    whole warp, which does not read; every other warp's lanes on one cell column: the same
    neighbours, so its accesses are converged and the model counts them), 32-bit and 64-bit
    indices; each result still NumPy's."""
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=2).tolist()
    cols = gradops.fractional_pooling_sequence(11, 1.5, False, seed=3).tolist()
    rng = np.random.default_rng(23)
    figures = {}
    for dtype in dtypes:
        for index in ("int", "long long"):
            vector = max_launcher().vector_channels(dtype)
            x = rng.standard_normal((2, 13, 11, 32 * vector)).astype(dtype)
            y = gradops.fractional_max_pool(x, rows, cols, True)
            dy = rng.standard_normal(y.shape).astype(dtype)
            g = _geometry(x, y, dy, rows, cols, True)
            kernels = device.host_kernels(max_launcher().SOURCE, max_launcher()._cells_expression(
                np.dtype(dtype), index, vector, True))
            for kind in ("load", "store"):
                kernels.shared_stats(reset=True, kind=kind)
            got = max_launcher().fractional_max_pool_grad(g, to_gpu(x), to_gpu(y), to_gpu(dy), path="cells",
                                                          index=index, block_vectors=32)
            want = gradops.fractional_max_pool_grad(x, y, dy, rows, cols, True, backend="numpy")
            np.testing.assert_array_equal(to_host(got), want)
            for kind in ("load", "store"):
                figures[np.dtype(dtype).name, index, kind] = kernels.shared_stats(kind=kind)
    return figures


def test_cells_slots_have_no_bank_conflicts(monkeypatch):
    """The overlapping cells kernel's slots (SlotWords: word-major) are read and written with
    one pass over the banks per 128 bytes in every dtype and index width, counted by the host
    model over every converged warp-level access; whole packs side by side (the layout before,
    which a planted layout reproduces) take 2 to 4 passes where a pack has more than one word."""
    import cuda_host

    if cuda_host.unavailable_reason():
        pytest.skip(f"cannot build the kernel sources for the host: {cuda_host.unavailable_reason()}")
    device = cuda_host.HostDevice(order="shuffled", seed=3).install(monkeypatch)
    for key, stats in _slot_bank_figures(device).items():
        assert stats["accesses"] > 0 and stats["wavefronts"] == stats["ideal"], (key, stats)


def test_planted_slot_layout_shows_bank_conflicts(tmp_path, monkeypatch):
    """The bank figures can fail: packs laid out slot-major (each slot's words together, lanes a
    pack apart) give the same results and more passes than the banks need wherever a pack has
    two words (32-byte packs: long long choices of 4 channels, float64's 4 channels), and the
    same passes where every pack is one word (float32 with int choices)."""
    import cuda_host

    if cuda_host.unavailable_reason():
        pytest.skip(f"cannot build the kernel sources for the host: {cuda_host.unavailable_reason()}")
    cuda_host.planted_sources(tmp_path, max_launcher().SOURCE, ("Pack<X, W>& w = words[k][slot];",
                                                                "Pack<X, W>& w = words[0][slot * (V / W) + k];"))
    device = cuda_host.HostDevice(order="shuffled", seed=3, source_dir=tmp_path).install(monkeypatch)
    figures = _slot_bank_figures(device, dtypes=(np.float32, np.float64))
    conflicted = {key[:2] for key, stats in figures.items() if stats["wavefronts"] > stats["ideal"]}
    assert conflicted == {("float32", "long long"), ("float64", "int"), ("float64", "long long")}, figures
    for key, stats in figures.items():
        if key[:2] in conflicted:
            assert stats["wavefronts"] >= 1.5 * stats["ideal"], (key, stats)

