"""The NumPy backend's fast paths, each on shapes that reach it and its boundaries.

Unit-stride convolution gradients run on a zero-padded flat layout (``_flat_layout``), the
depthwise input gradient per stride phase on a zero-padded copy (``_depthwise_input_grad``),
and fractional pooling with at most two cells per index runs ``_pool_grad_two_cells``.  Each test
records which path ran (so a shape that silently falls back fails) and compares with the loop
references in ``reference.py``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import gradops
import reference
from conftest import assert_close, random_array
from gradops.backends import numpy_backend as nb

# --------------------------------------------------------------------------- path spies


@pytest.fixture
def taken(monkeypatch):
    """{fast path name: [True when it computed the call, False when it declined]}."""
    record = {}

    def spy(name):
        original = getattr(nb, name)

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            record.setdefault(name, []).append(result is not None)
            return result

        monkeypatch.setattr(nb, name, wrapper)

    for name in ("_unit_stride_input_grad", "_unit_stride_filter_grad", "_depthwise_input_grad",
                 "_pool_grad_two_cells", "_pool_grad_steps"):
        spy(name)
    return record


# --------------------------------------------------------------------------- unit-stride convolutions

# (name, (N, H, W), (R, S), padding, dilations, explicit ((top, bottom), (left, right))).
# Images are big enough that padding stays within _MAX_FLAT_GROWTH (small ones decline).
UNIT_STRIDE_CASES = [
    ("same_3x3", (2, 12, 11), (3, 3), "SAME", (1, 1), None),
    ("same_even_filter", (2, 12, 14), (2, 4), "SAME", (1, 1), None),  # odd padding at bottom/right
    ("valid_3x3", (3, 16, 15), (3, 3), "VALID", (1, 1), None),
    ("explicit_asymmetric", (2, 16, 20), (3, 2), "EXPLICIT", (1, 1), ((2, 0), (0, 3))),
    ("padding_only_outputs", (2, 20, 20), (2, 2), "EXPLICIT", (1, 1), ((3, 0), (0, 0))),  # out rows 0-1
    ("dilated_same", (2, 20, 20), (3, 2), "SAME", (2, 3), None),
    ("dilated_valid", (2, 24, 24), (2, 3), "VALID", (3, 2), None),
    ("one_column", (3, 5, 1), (3, 1), "SAME", (1, 1), None),
    ("one_row", (3, 1, 5), (1, 3), "SAME", (1, 1), None),
    ("one_by_one_filter", (2, 3, 4), (1, 1), "VALID", (1, 1), None),
    ("batch_one", (1, 12, 12), (3, 3), "SAME", (1, 1), None),
]
# Flat products would be more than _MAX_FLAT_GROWTH times the tap paths': the layout declines.
FALLBACK_CASES = [
    ("huge_explicit_pads", (2, 3, 3), (2, 2), "EXPLICIT", (1, 1), ((9, 9), (9, 9))),
    ("taps_on_padding_only", (2, 3, 3), (2, 2), "EXPLICIT", (1, 1), ((3, 1), (1, 4))),
    ("thin_image_square_filter", (3, 1, 5), (3, 3), "SAME", (1, 1), None),  # two of three filter rows read padding
    ("valid_filter_is_input", (2, 3, 4), (3, 4), "VALID", (1, 1), None),  # 1x1 output
    ("filter_larger_than_input", (2, 2, 3), (4, 5), "EXPLICIT", (1, 1), ((2, 2), (3, 2))),
    ("small_image", (2, 4, 4), (3, 3), "SAME", (1, 1), None),
]


def _attrs(padding, dilations, explicit, data_format="NHWC"):
    pads = ((0, 0), (0, 0)) if explicit is None else explicit
    kwargs = dict(strides=[1, 1, 1, 1], padding=padding,
                  dilations=[1, 1, *dilations] if data_format == "NCHW" else [1, *dilations, 1],
                  data_format=data_format)
    if padding == "EXPLICIT":
        spatial = [list(pads[0]), list(pads[1])]
        kwargs["explicit_paddings"] = [0, 0, 0, 0, *sum(spatial, [])] if data_format == "NCHW" else \
            [0, 0, *spatial[0], *spatial[1], 0, 0]
    return kwargs, pads


def _problem(rng, dtype, case, in_depth, out_depth, filter_in_depth=None):
    _, (n, h, w), (r, s), padding, dilations, explicit = case
    _, pads = _attrs(padding, dilations, explicit)
    oh, _ = reference.window(h, r, 1, dilations[0], padding, pads[0])
    ow, _ = reference.window(w, s, 1, dilations[1], padding, pads[1])
    x = random_array(rng, (n, h, w, in_depth), dtype)
    filt = random_array(rng, (r, s, filter_in_depth or in_depth, out_depth), dtype)
    dy = random_array(rng, (n, oh, ow, out_depth), dtype)
    return x, filt, dy, pads


def _ids(cases):
    return [c[0] for c in cases]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", UNIT_STRIDE_CASES, ids=_ids(UNIT_STRIDE_CASES))
def test_unit_stride_input_grad(rng, taken, case, dtype):
    x, filt, dy, pads = _problem(rng, dtype, case, 3, 4)
    kwargs, _ = _attrs(*case[3:])
    got = gradops.conv2d_backprop_input(x.shape, filt, dy, **kwargs)
    assert taken["_unit_stride_input_grad"] == [True]
    ref = reference.conv2d_backprop_input(x.shape, filt.astype(np.float64), dy.astype(np.float64), (1, 1),
                                          case[3], case[4], pads)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", UNIT_STRIDE_CASES, ids=_ids(UNIT_STRIDE_CASES))
def test_unit_stride_filter_grad(rng, taken, case, dtype):
    x, filt, dy, pads = _problem(rng, dtype, case, 3, 4)
    kwargs, _ = _attrs(*case[3:])
    got = gradops.conv2d_backprop_filter(x, filt.shape, dy, **kwargs)
    assert taken["_unit_stride_filter_grad"] == [True]
    ref = reference.conv2d_backprop_filter(x.astype(np.float64), filt.shape, dy.astype(np.float64), (1, 1),
                                           case[3], case[4], pads)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, ref, dtype)


@pytest.mark.parametrize("multiplier", [1, 2, 3])
@pytest.mark.parametrize("case", UNIT_STRIDE_CASES, ids=_ids(UNIT_STRIDE_CASES))
def test_unit_stride_depthwise_input_grad(rng, taken, case, multiplier):
    depth = 3
    _, filt, dy, pads = _problem(rng, np.float32, case, depth, depth * multiplier, filter_in_depth=1)
    n, h, w = case[1]
    depthwise_filter = filt.reshape(*filt.shape[:2], depth, multiplier)
    kwargs, _ = _attrs(*case[3:])
    got = gradops.depthwise_conv2d_native_backprop_input((n, h, w, depth), depthwise_filter, dy, **kwargs)
    assert taken["_depthwise_input_grad"] == [True]
    ref = reference.conv2d_backprop_input((n, h, w, depth), filt.astype(np.float64), dy.astype(np.float64),
                                          (1, 1), case[3], case[4], pads)
    assert_close(got, ref, np.float32)


# (name, (N, H, W), (R, S), strides, padding, dilations, explicit): the depthwise input
# gradient's stride phases, including phases no tap reaches (their inputs stay zero), taps
# recurring every stride / gcd(stride, dilation) filter positions, and odd image sizes.
STRIDED_DEPTHWISE_CASES = [
    ("same_3x3_s2", (2, 13, 12), (3, 3), (2, 2), "SAME", (1, 1), None),
    ("valid_5x5_s2", (2, 33, 31), (5, 5), (2, 2), "VALID", (1, 1), None),
    ("unequal_strides", (2, 14, 15), (3, 4), (3, 2), "SAME", (1, 1), None),
    ("filter_shorter_than_stride", (2, 12, 13), (1, 2), (3, 3), "VALID", (1, 1), None),  # empty phases
    ("dilation_shares_the_stride", (2, 20, 19), (3, 3), (2, 2), "SAME", (2, 2), None),  # one phase a tap row
    ("dilation_coprime", (2, 21, 22), (4, 3), (2, 3), "SAME", (3, 2), None),
    ("explicit_asymmetric", (2, 16, 18), (3, 3), (2, 2), "EXPLICIT", (1, 1), ((2, 0), (1, 3))),
    ("stride_past_the_image", (2, 3, 13), (2, 3), (4, 2), "VALID", (1, 1), None),  # phases 3.. hold no input
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("multiplier", [1, 2, 3])
@pytest.mark.parametrize("case", STRIDED_DEPTHWISE_CASES, ids=_ids(STRIDED_DEPTHWISE_CASES))
def test_strided_depthwise_input_grad(rng, taken, case, multiplier, dtype):
    _, (n, h, w), (r, s), strides, padding, dilations, explicit = case
    pads = ((0, 0), (0, 0)) if explicit is None else explicit
    depth = 3
    oh, _ = reference.window(h, r, strides[0], dilations[0], padding, pads[0])
    ow, _ = reference.window(w, s, strides[1], dilations[1], padding, pads[1])
    filt = random_array(rng, (r, s, depth, multiplier), dtype)
    dy = random_array(rng, (n, oh, ow, depth * multiplier), dtype)
    kwargs, _ = _attrs(padding, dilations, explicit)
    kwargs["strides"] = [1, *strides, 1]
    got = gradops.depthwise_conv2d_native_backprop_input((n, h, w, depth), filt, dy, **kwargs)
    assert taken["_depthwise_input_grad"] == [True]
    ref = reference.conv2d_backprop_input((n, h, w, depth), reference.depthwise_to_hwio(filt).astype(np.float64),
                                          dy.astype(np.float64), strides, padding, dilations, pads)
    assert got.dtype == np.dtype(dtype) and got.flags.c_contiguous
    assert_close(got, ref, dtype, scale=max(1.0, float(np.abs(ref).max())) * r * s)


def _record_tiles(monkeypatch):
    """[(the filter tile einsum read, the whole tile it is a run of)] for each einsum call
    (pass a ``monkeypatch.context()``, so that undoing it leaves the path spies in place)."""
    calls = []
    einsum = np.einsum

    def recorded(*args, **kwargs):
        calls.append((args[2], args[2].base if args[2].base is not None else args[2]))
        return einsum(*args, **kwargs)

    monkeypatch.setattr(nb.np, "einsum", recorded)
    return calls


# (input_sizes, filter (R, S), strides, dilations): dilations and strides near 2**31, the
# largest TF's kernels take (a fuzzer's draw of 2**62 once overflowed a view's strides; such
# values are now refused: test_tf_parity.py::test_int32_attributes_as_tf)
HUGE_STEP_CASES = [
    ((1, 1, 1, 1), (1, 1), (1, 2), (2**31 - 1, 1)),  # one tap a phase, its step 2**31 - 1
    ((1, 5, 6, 2), (2, 2), (1, 2), (2**31 - 2, 3)),
    ((1, 5, 6, 2), (2, 2), (2, 3), (3, 2**30)),
    ((1, 5, 6, 2), (2, 2), (2**31 - 1, 2), (1, 1)),
]


@pytest.mark.parametrize("case", HUGE_STEP_CASES, ids=["fuzz", "dilation_rows", "dilation_cols", "stride_rows"])
def test_depthwise_input_grad_huge_steps(rng, taken, case):
    """Huge dilations and strides give the loops' result: a phase's one tap takes no step (its
    step once overflowed the view's strides), and phases reading stretches of padding far
    apart leave the path to the tap loops rather than buffer the distance between them."""
    sizes, (r, s), strides, dilations = case
    oh, _ = reference.window(sizes[1], r, strides[0], dilations[0], "SAME")
    ow, _ = reference.window(sizes[2], s, strides[1], dilations[1], "SAME")
    filt = random_array(rng, (r, s, sizes[3], 1), np.float32)
    dy = random_array(rng, (1, oh, ow, sizes[3]), np.float32)
    got = gradops.depthwise_conv2d_native_backprop_input(sizes, filt, dy, [1, *strides, 1], "SAME",
                                                         dilations=[1, *dilations, 1])
    ref = reference.conv2d_backprop_input(sizes, reference.depthwise_to_hwio(filt).astype(np.float64),
                                          dy.astype(np.float64), strides, "SAME", dilations)
    assert_close(got, ref, np.float32)
    if case is HUGE_STEP_CASES[0]:
        assert taken["_depthwise_input_grad"] == [True]


def test_depthwise_input_grad_declines_buffering_far_apart_phases(rng, taken):
    """Stride 3, dilation 10**6, explicit padding (0, 10**6) over 4 rows: two phases' taps read
    out_backprop's 2 rows and one phase's tap padding 333,333 rows away.  Their products pass
    the products rule (3 against 2), but a buffer spanning both would hold 333,335 rows for a
    2-row out_backprop: the call takes the tap loops instead."""
    pads = ((0, 10**6), (0, 0))
    filt = random_array(rng, (2, 1, 2, 1), np.float32)  # one column: the columns add no padding products
    dy = random_array(rng, (1, 2, 5, 2), np.float32)
    got = gradops.depthwise_conv2d_native_backprop_input(
        (1, 4, 5, 2), filt, dy, [1, 3, 1, 1], "EXPLICIT", explicit_paddings=[0, 0, 0, 10**6, 0, 0, 0, 0],
        dilations=[1, 10**6, 1, 1])
    assert taken["_depthwise_input_grad"] == [False]
    assert_close(got, reference.conv2d_backprop_input((1, 4, 5, 2), reference.depthwise_to_hwio(filt).astype(np.float64),
                                                      dy.astype(np.float64), (3, 1), "EXPLICIT", (10**6, 1), pads),
                 np.float32)


@pytest.mark.parametrize("workers", [1, 2])
def test_depthwise_input_grad_column_runs(rng, taken, monkeypatch, workers):
    """Filter tiles shorter than a phase's row of inputs: each row is summed in several column
    runs (the last one short), the phases' tiles hold DEPTHWISE_TILE_ELEMENTS at most together,
    images go in several chunks, and the bits are the same for any worker count and run."""
    monkeypatch.setattr(nb, "_WORKERS", workers)
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)
    depth, multiplier = 2, 2
    filt = random_array(rng, (3, 3, depth, multiplier), np.float32)
    dy = random_array(rng, (3, 6, 9, depth * multiplier), np.float32)
    ref = reference.conv2d_backprop_input((3, 12, 17, depth), reference.depthwise_to_hwio(filt).astype(np.float64),
                                          dy.astype(np.float64), (2, 2), "SAME")
    results = []
    # stride 2, 3x3, SAME (pads: top 0, left 1): column phases of 9 and 8 inputs, each beside
    # 2 row phases; 9 taps x 4 channels x 2 inputs: runs of 2 inputs
    for budget, calls in ((2 * 9 * depth * multiplier, 3 * 2 * (5 + 4)),
                          (10**6, 3 * 4)):  # one run a phase
        monkeypatch.setattr(nb, "DEPTHWISE_TILE_ELEMENTS", budget)
        with monkeypatch.context() as patch:
            tiles = _record_tiles(patch)
            results.append(gradops.depthwise_conv2d_native_backprop_input((3, 12, 17, depth), filt, dy, [1, 2, 2, 1],
                                                                          "SAME"))
        assert len(tiles) == calls  # 3 chunks of one image
        assert sum({id(whole): whole.size for _, whole in tiles}.values()) <= budget
        assert_close(results[-1], ref, np.float32)
    np.testing.assert_array_equal(results[0], results[1])
    assert taken["_depthwise_input_grad"] == [True, True]


def _large_filter_tiles(rng, taken, monkeypatch, budget, filter_shape, input_sizes, dy_rows_cols, strides):
    """The filter tiles of a float64 depthwise input gradient (SAME) run with ``budget``,
    once the result is checked against the reference loops."""
    monkeypatch.setattr(nb, "DEPTHWISE_TILE_ELEMENTS", budget)
    filt = random_array(rng, filter_shape, np.float64)
    dy = random_array(rng, (input_sizes[0], *dy_rows_cols, filter_shape[2] * filter_shape[3]), np.float64)
    with monkeypatch.context() as patch:
        tiles = _record_tiles(patch)
        got = gradops.depthwise_conv2d_native_backprop_input(input_sizes, filt, dy, [1, *strides, 1], "SAME")
    assert taken["_depthwise_input_grad"] == [True]
    assert_close(got, reference.conv2d_backprop_input(input_sizes, reference.depthwise_to_hwio(filt), dy, strides,
                                                      "SAME"), np.float64)
    return tiles


def test_depthwise_input_grad_tiles_of_strided_large_filters(rng, taken, monkeypatch):
    """A 16 x 15 filter at strides 4 and 3 (12 phases): their tiles together stay within the
    budget, as they would not with a budget per phase (a review's 64 x 64 filter at stride 8
    tiled 64 phases' worth, 130 MiB for an 8 MiB result)."""
    budget = 16 * 15 * 4 * 3  # 3 inputs a run
    tiles = _large_filter_tiles(rng, taken, monkeypatch, budget, (16, 15, 2, 2), (1, 48, 41, 2), (12, 14), (4, 3))
    wholes = {id(whole): whole for _, whole in tiles}
    assert len(wholes) == 12 and sum(w.size for w in wholes.values()) == budget


def test_depthwise_input_grad_tile_of_a_large_filter(rng, taken, monkeypatch):
    """A 9 x 9 filter at unit stride: one phase of 81 taps, whose tile is capped at one input's
    worth beyond the budget (it would be 81 x a row's products)."""
    tiles = _large_filter_tiles(rng, taken, monkeypatch, 100, (9, 9, 3, 1), (1, 20, 21, 3), (20, 21), (1, 1))
    assert {tile.shape for tile, _ in tiles} == {(9, 9, 3)} and len(tiles) == 21  # one input column a run


@pytest.mark.parametrize("case", FALLBACK_CASES, ids=_ids(FALLBACK_CASES))
def test_flat_layout_declines_costly_padding(rng, taken, case):
    x, filt, dy, pads = _problem(rng, np.float64, case, 2, 3)
    kwargs, _ = _attrs(*case[3:])
    got_input = gradops.conv2d_backprop_input(x.shape, filt, dy, **kwargs)
    got_filter = gradops.conv2d_backprop_filter(x, filt.shape, dy, **kwargs)
    assert taken["_unit_stride_input_grad"] == [False]
    assert taken["_unit_stride_filter_grad"] == [False]
    args = ((1, 1), case[3], case[4], pads)
    assert_close(got_input, reference.conv2d_backprop_input(x.shape, filt, dy, *args), np.float64)
    assert_close(got_filter, reference.conv2d_backprop_filter(x, filt.shape, dy, *args), np.float64)


def test_grouped_and_strided_calls_keep_the_tap_paths(rng, taken):
    """Groups with several input channels, and strides > 1, never reach the flat paths."""
    x = random_array(rng, (2, 5, 5, 4), np.float64)
    filt = random_array(rng, (3, 3, 2, 6), np.float64)  # 2 groups
    dy = random_array(rng, (2, 5, 5, 6), np.float64)
    got = gradops.conv2d_backprop_input(x.shape, filt, dy, [1, 1, 1, 1], "SAME")
    assert_close(got, reference.conv2d_backprop_input(x.shape, filt, dy, (1, 1), "SAME"), np.float64)
    filt = random_array(rng, (3, 3, 4, 6), np.float64)
    dy = random_array(rng, (2, 3, 3, 6), np.float64)
    got = gradops.conv2d_backprop_filter(x, filt.shape, dy, [1, 2, 2, 1], "SAME")
    assert_close(got, reference.conv2d_backprop_filter(x, filt.shape, dy, (2, 2), "SAME"), np.float64)
    assert not any(taken.get(name) for name in
                   ("_unit_stride_input_grad", "_unit_stride_filter_grad", "_depthwise_input_grad"))


def test_nchw_reaches_the_flat_paths(rng, taken):
    case = UNIT_STRIDE_CASES[3]  # asymmetric explicit padding
    x, filt, dy, pads = _problem(rng, np.float64, case, 3, 4)
    kwargs, _ = _attrs(*case[3:], data_format="NCHW")
    nchw = (0, 3, 1, 2)
    got_input = gradops.conv2d_backprop_input(x.transpose(nchw).shape, filt, dy.transpose(nchw), **kwargs)
    got_filter = gradops.conv2d_backprop_filter(x.transpose(nchw), filt.shape, dy.transpose(nchw), **kwargs)
    assert taken["_unit_stride_input_grad"] == [True] and taken["_unit_stride_filter_grad"] == [True]
    args = ((1, 1), case[3], case[4], pads)
    assert_close(got_input, reference.conv2d_backprop_input(x.shape, filt, dy, *args).transpose(nchw), np.float64)
    assert_close(got_filter, reference.conv2d_backprop_filter(x, filt.shape, dy, *args), np.float64)


def test_input_grad_row_chunks(rng, taken, monkeypatch):
    """Out depth far above in depth: the column taps are built in several row chunks (the last
    one short)."""
    chunks = []
    column_taps = nb._column_taps
    monkeypatch.setattr(nb, "_column_taps", lambda *args: chunks.append(args[2:]) or column_taps(*args))
    case = UNIT_STRIDE_CASES[0]
    x, filt, dy, pads = _problem(rng, np.float64, case, 1, 7)
    got = gradops.conv2d_backprop_input(x.shape, filt, dy, **_attrs(*case[3:])[0])
    assert_close(got, reference.conv2d_backprop_input(x.shape, filt, dy, (1, 1), "SAME", (1, 1), pads), np.float64)
    assert taken["_unit_stride_input_grad"] == [True]
    assert len(chunks) > 2 and chunks[0][1] - chunks[0][0] > chunks[-1][1] - chunks[-1][0]


def test_depthwise_row_chunks(rng, taken, monkeypatch):
    """Many row chunks (the last one short), spread over the worker pool."""
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 999)
    case = UNIT_STRIDE_CASES[0]
    x, filt, dy, pads = _problem(rng, np.float64, case, 3, 6, filter_in_depth=1)
    got = gradops.depthwise_conv2d_native_backprop_input(x.shape, filt.reshape(3, 3, 3, 2), dy, [1, 1, 1, 1], "SAME")
    assert_close(got, reference.conv2d_backprop_input(x.shape, filt, dy, (1, 1), "SAME", (1, 1), pads), np.float64)
    assert taken["_depthwise_input_grad"] == [True]


@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"])
def test_half_types_accumulate_in_float32(rng, taken, dtype):
    dtype = np.dtype(dtype) if dtype != "bfloat16" else gradops._dtypes.bfloat16
    case = UNIT_STRIDE_CASES[0]
    x, filt, dy, pads = _problem(rng, dtype, case, 3, 4)
    kwargs, _ = _attrs(*case[3:])
    args = ((1, 1), case[3], case[4], pads)
    x64, filt64, dy64 = (a.astype(np.float64) for a in (x, filt, dy))
    got = gradops.conv2d_backprop_input(x.shape, filt, dy, **kwargs)
    assert got.dtype == dtype
    assert_close(got, reference.conv2d_backprop_input(x.shape, filt64, dy64, *args), dtype)
    got = gradops.conv2d_backprop_filter(x, filt.shape, dy, **kwargs)
    assert got.dtype == dtype
    assert_close(got, reference.conv2d_backprop_filter(x64, filt.shape, dy64, *args), dtype)
    assert taken["_unit_stride_input_grad"] == [True] and taken["_unit_stride_filter_grad"] == [True]


def _integer_valued(rng, shape):
    """float64 small integers: every sum is exact, so results compare bitwise, NaN included."""
    return rng.integers(-3, 4, shape).astype(np.float64)


@pytest.mark.parametrize("where", ["filter", "out_backprop", "input"])
@pytest.mark.parametrize("value", [np.inf, np.nan], ids=["inf", "nan"])
def test_non_finite_values_stay_in_their_own_products(rng, taken, where, value):
    """Padding is never multiplied by a non-finite value: 0 * inf would be NaN where TF (which
    skips padded taps) and the reference have none.  Non-finite operands take the tap paths."""
    case = UNIT_STRIDE_CASES[0]
    _, (n, h, w), _, padding, dilations, _ = case
    pads = ((1, 1), (1, 1))
    x = _integer_valued(rng, (n, h, w, 2))
    filt = _integer_valued(rng, (3, 3, 2, 2))
    dy = _integer_valued(rng, (n, h, w, 2))
    {"filter": filt, "out_backprop": dy, "input": x}[where][0, 0, 0, 0] = value
    kwargs, _ = _attrs(padding, dilations, None)
    args = ((1, 1), padding, dilations, pads)
    np.testing.assert_array_equal(gradops.conv2d_backprop_input(x.shape, filt, dy, **kwargs),
                                  reference.conv2d_backprop_input(x.shape, filt, dy, *args))
    np.testing.assert_array_equal(gradops.conv2d_backprop_filter(x, filt.shape, dy, **kwargs),
                                  reference.conv2d_backprop_filter(x, filt.shape, dy, *args))
    dw = _integer_valued(rng, (3, 3, 2, 1))
    dw[0, 0, 0, 0] = value if where == "filter" else dw[0, 0, 0, 0]
    np.testing.assert_array_equal(gradops.depthwise_conv2d_native_backprop_input(x.shape, dw, dy, **kwargs),
                                  reference.conv2d_backprop_input(x.shape, reference.depthwise_to_hwio(dw), dy, *args))
    # Each flat path runs exactly when the operands it multiplies by padding are finite.
    assert ("_unit_stride_input_grad" in taken) == (where != "filter")
    assert ("_depthwise_input_grad" in taken) == (where != "filter")
    assert ("_unit_stride_filter_grad" in taken) == (where == "filter")


# --------------------------------------------------------------------------- filter gradient in column chunks

# (strides, padding, filter (R, S)): the unit-stride flat path and the gathered-columns path.
COLUMN_CHUNK_CASES = [((1, 1), "SAME", (3, 3)), ((1, 1), "VALID", (2, 4)), ((2, 1), "SAME", (3, 4)),
                      ((1, 3), "VALID", (2, 3))]


@pytest.mark.parametrize("strides, padding, filter_rc", COLUMN_CHUNK_CASES,
                         ids=[f"{s[0]}x{s[1]}-{p}-{f[0]}x{f[1]}" for s, p, f in COLUMN_CHUNK_CASES])
def test_filter_grad_one_filter_column_at_a_time(rng, taken, monkeypatch, strides, padding, filter_rc):
    """With the column budget at its floor (the result's size), each filter column is gathered
    and contracted alone: the same gradient as the loops, on both paths."""
    monkeypatch.setattr(nb, "COLUMN_CHUNK_MIN_ELEMENTS", 1)
    monkeypatch.setattr(nb, "COLUMN_CHUNK_FACTOR", 0)
    chunks = []
    real = nb._filter_column_chunks
    monkeypatch.setattr(nb, "_filter_column_chunks", lambda *a: chunks.append(real(*a)) or chunks[-1])
    (r, s), (n, h, w) = filter_rc, (2, 14, 13)
    oh, _ = reference.window(h, r, strides[0], 1, padding)
    ow, _ = reference.window(w, s, strides[1], 1, padding)
    x, dy = random_array(rng, (n, h, w, 3), np.float64), random_array(rng, (n, oh, ow, 4), np.float64)
    got = gradops.conv2d_backprop_filter(x, (r, s, 3, 4), dy, [1, *strides, 1], padding)
    assert ("_unit_stride_filter_grad" in taken) == (strides == (1, 1))
    assert chunks and all(c == [(k, k + 1) for k in range(s)] for c in chunks)
    assert_close(got, reference.conv2d_backprop_filter(x, (r, s, 3, 4), dy, strides, padding), np.float64)


@pytest.mark.parametrize("strides", [(1, 1), (1, 2)], ids=["unit-stride", "strided"])
def test_wide_filter_gradient_gathers_in_bounded_memory(strides):
    """A 1024-column filter over a row of 1024 outputs, 64 channels in and out: the gathered
    columns held 1024 x 1024 x 64 float32 (256 MiB, a 288 MiB peak for a 16 MiB result, on
    both paths, measured with tracemalloc) before they were split by filter columns."""
    import tracemalloc

    cols, depth = 1024, 64
    x = np.ones((1, 1, strides[1] * (cols - 1) + cols, depth), np.float32)
    dy = np.ones((1, 1, cols, depth), np.float32)
    tracemalloc.start()
    try:
        got = gradops.conv2d_backprop_filter(x, [1, cols, depth, depth], dy, [1, *strides, 1], "VALID")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 96 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    np.testing.assert_array_equal(got, np.full((1, cols, depth, depth), cols, np.float32))  # every tap sees all


# --------------------------------------------------------------------------- fractional pooling


def _pool_case(rng, dtype, shape, rows, cols, overlapping):
    n, h, w, d = shape
    out_shape = (n, len(rows) - 1, len(cols) - 1, d)
    if np.issubdtype(dtype, np.integer):
        dy = rng.integers(-50, 50, out_shape).astype(dtype)
    else:
        dy = random_array(rng, out_shape, dtype)
    got = gradops.fractional_avg_pool_grad(shape, dy, rows, cols, overlapping)
    return got, reference.fractional_avg_pool_grad(shape, dy, list(rows), list(cols), overlapping)


# (shape, rows, cols): boundaries shared in both dimensions, in one, and trailing uncovered rows.
TWO_CELL_CASES = [
    ((2, 9, 8, 3), [0, 2, 3, 5, 6, 8], [0, 1, 3, 4, 7]),
    ((2, 9, 8, 3), [0, 2, 3, 5, 6, 8], [0, 8]),
    ((1, 6, 7, 2), [0, 6], [0, 2, 3, 5, 7]),
    ((2, 7, 5, 2), [0, 2, 4], [0, 1, 2, 3, 4, 5]),  # rows 5, 6 in no cell
    ((2, 6, 5, 2), [2, 5, 1, 3], [4, 1, 3, 2]),  # unordered: rows 2 (and 3) in cells 0 and 2, empty cells
]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("case", range(len(TWO_CELL_CASES)))
def test_two_cell_pool_grad(rng, taken, case, overlapping, dtype):
    shape, rows, cols = TWO_CELL_CASES[case]
    got, ref = _pool_case(rng, dtype, shape, rows, cols, overlapping)
    assert taken["_pool_grad_two_cells"] and "_pool_grad_steps" not in taken
    assert got.dtype == np.dtype(dtype)
    if np.issubdtype(dtype, np.integer):
        np.testing.assert_array_equal(got, np.trunc(ref).astype(dtype))
    else:
        # Same shares added in the same order: bitwise equal to the reference loop.
        np.testing.assert_array_equal(got, ref.astype(dtype))


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_index_in_three_cells_takes_the_general_path(rng, taken, overlapping):
    """Repeated entries (overlapping), and an unordered sequence putting row 2 in cells 0, 2
    and 4 (not 1, 3) beside empty cells, in either mode."""
    cases = [((2, 6, 7, 2), [0, 4, 2, 6, 1, 3], [6, 1, 3, 2, 8])]
    if overlapping:
        cases.append(((2, 6, 5, 2), [0, 1, 1, 3, 5], [0, 2, 2, 4]))
    for shape, rows, cols in cases:
        for dtype in (np.int32, np.float64):
            got, ref = _pool_case(rng, dtype, shape, rows, cols, overlapping)
            np.testing.assert_array_equal(got, np.trunc(ref).astype(dtype) if dtype == np.int32 else ref)
    assert taken["_pool_grad_steps"] and "_pool_grad_two_cells" not in taken


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_negative_zero_shares_give_positive_zero(taken, overlapping):
    """TF adds every share to a zeroed buffer, so -0.0 out_backprop gives +0.0."""
    dy = np.full((1, 2, 3, 2), -0.0, np.float32)
    dy[0, 1, 1, 0] = 6.0
    got = gradops.fractional_avg_pool_grad((1, 5, 6, 2), dy, [0, 2, 4], [0, 2, 4, 5], overlapping)
    assert not np.signbit(got).any()
    assert np.count_nonzero(got) > 0
    assert taken["_pool_grad_two_cells"]


def test_integer_sums_in_tf_order_on_boundaries(taken):
    """Boundary (row and column) elements sum four shares; TF's order gives 2 here (see
    test_fractional_avg_pool_grad.test_integer_truncation_sum_order_matches_tf), other orders 1."""
    dy = np.array([[4, 2], [4, 0]], np.int64).reshape(1, 2, 2, 1)
    got = gradops.fractional_avg_pool_grad([1, 4, 4, 1], dy, [0, 1, 3], [0, 1, 4], True)
    ref = np.trunc(reference.fractional_avg_pool_grad((1, 4, 4, 1), dy, [0, 1, 3], [0, 1, 4], True))
    assert got[0, 1, 1, 0] == 2
    np.testing.assert_array_equal(got, ref.astype(np.int64))
    assert taken["_pool_grad_two_cells"]


def test_take_rows_view_and_gather():
    """Consecutive row indices give a view; any other index a gather, with equal values."""
    x = np.arange(2 * 6 * 3, dtype=np.float64).reshape(2, 6, 3)
    run = nb._take_rows(x, np.array([2, 3, 4]))
    assert np.shares_memory(run, x)
    np.testing.assert_array_equal(run, x[:, [2, 3, 4]])
    for index in ([1, 3, 4], [4, 3, 2], [2, 2, 3], [5]):
        np.testing.assert_array_equal(nb._take_rows(x, np.array(index)), x[:, index])


@pytest.mark.parametrize("numpy_reshape", ["installed", "before 2.1"])
def test_reshaped_view_writes_through_and_never_copies(monkeypatch, numpy_reshape):
    """_reshaped_view is a view that writes go through, and refuses (ValueError) a shape that
    would need a copy, on NumPy's reshape(copy=False) and on the fallback for NumPy < 2.1
    (setting .shape on a view; NumPy 2.5 deprecates it, so the fallback runs only there)."""
    if numpy_reshape == "before 2.1":
        reshape = np.reshape

        def reshape_without_copy_argument(array, shape, **kwargs):
            if kwargs:
                raise TypeError("reshape() got an unexpected keyword argument 'copy'")
            return reshape(array, shape)

        monkeypatch.setattr(nb.np, "reshape", reshape_without_copy_argument)
        # Here on NumPy 2.5+, setting .shape warns; NumPy < 2.1, where the fallback runs, does not.
        warnings.filterwarnings("ignore", "Setting the shape", DeprecationWarning)
    x = np.zeros((2, 3, 8))
    split = nb._split_last(x[:, 1:], 2)  # rows 1 and 2 of each image: strided, still a view
    assert split.shape == (2, 2, 2, 4)
    split[1, 0, 1, 3] = 5.0
    assert x[1, 1, 7] == 5.0 and np.count_nonzero(x) == 1
    flat = nb._reshaped_view(x[:, 1:], (2, 16))
    flat[0, 15] = 6.0
    assert x[0, 2, 7] == 6.0
    with pytest.raises(ValueError):
        nb._reshaped_view(x[:, :, :4], (2, 12))  # rows of 4 of 8: no single stride


# --------------------------------------------------------------------------- the thread pool


def _pooled_call():
    """A depthwise input gradient of 4 batch chunks: with 2 workers, they go to the pool."""
    rng = np.random.default_rng(7)
    out_backprop = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
    filter = rng.standard_normal((3, 3, 3, 1)).astype(np.float32)
    return gradops.depthwise_conv2d_native_backprop_input(
        [4, 8, 8, 3], filter, out_backprop, [1, 1, 1, 1], "SAME")


@pytest.fixture
def two_chunks_on_two_workers(monkeypatch):
    """Two workers and chunks of one image, so that every call above uses the pool."""
    monkeypatch.setattr(nb, "_WORKERS", 2)
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_computes_after_the_parent_used_the_pool(two_chunks_on_two_workers, monkeypatch):
    """A child forked after the parent's pool started inherits the pool object but not its
    threads: without a new pool its first pooled call waited forever (a multiprocessing worker
    or a data loader forked after a training step hung)."""
    import multiprocessing
    import warnings

    monkeypatch.setattr(nb, "_POOL", None)  # this test's pool, not one another test shut down
    expected = _pooled_call()
    assert nb._POOL is not None, "the parent's call did not use the pool"
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child():
        send.send(_pooled_call())

    with warnings.catch_warnings():  # Python >= 3.12 warns on fork in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        process = context.Process(target=child)
        process.start()
    try:
        assert receive.poll(60), "the forked child's call did not finish in 60 s"
        np.testing.assert_array_equal(receive.recv(), expected)
    finally:
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()


def test_a_pool_that_takes_no_work_leaves_the_chunks_to_the_caller(two_chunks_on_two_workers, monkeypatch):
    """The pool is shut down once the interpreter starts to exit, before atexit handlers run
    (a call from one raised RuntimeError: cannot schedule new futures after shutdown); a pool
    that can start no thread refuses the same way.  The chunks it does not take run in the
    caller, in order, with the same result; chunks it took before refusing are still used."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(nb, "_WORKERS", 1)
    expected = _pooled_call()
    monkeypatch.setattr(nb, "_WORKERS", 2)

    shut = ThreadPoolExecutor(max_workers=2)
    shut.shutdown()
    monkeypatch.setattr(nb, "_POOL", shut)
    np.testing.assert_array_equal(_pooled_call(), expected)

    class RefusesAfterTwo(ThreadPoolExecutor):
        taken = 0

        def submit(self, fn, /, *args, **kwargs):
            if self.taken == 2:
                raise RuntimeError("can't start new thread")
            self.taken += 1
            return super().submit(fn, *args, **kwargs)

    with RefusesAfterTwo(max_workers=2) as partial:
        monkeypatch.setattr(nb, "_POOL", partial)
        np.testing.assert_array_equal(_pooled_call(), expected)
        assert partial.taken == 2


def test_a_call_from_an_atexit_handler_computes(tmp_path):
    """The whole story in a fresh interpreter: a gradient computed in an atexit handler, after
    the pool has been used and shut down."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "at_exit.py"
    script.write_text(
        "import atexit\n"
        "import numpy as np\n"
        "import gradops\n"
        "from gradops.backends import numpy_backend as nb\n"
        "nb._WORKERS, nb._CHUNK_BYTES = 2, 1\n"
        "x = np.arange(4 * 8 * 8 * 3, dtype=np.float32).reshape(4, 8, 8, 3)\n"
        "f = np.ones((3, 3, 3, 1), np.float32)\n"
        "def run(label):\n"
        "    r = gradops.depthwise_conv2d_native_backprop_input([4, 8, 8, 3], f, x, [1, 1, 1, 1], 'SAME')\n"
        "    print(label, float(r.sum()), flush=True)\n"
        "atexit.register(run, 'atexit')\n"
        "run('main')\n"
        "assert nb._POOL is not None\n")
    root = Path(__file__).resolve().parents[1]
    env = {**__import__("os").environ, "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "main" and lines[2] == "atexit" and lines[1] == lines[3], done.stdout


def test_a_call_abandoned_midway_cancels_its_chunks_not_yet_started(monkeypatch):
    """Ctrl-C (or an error in one chunk) stops the caller; the chunks still queued are
    cancelled, not run on in the background ahead of the next call's (a 100 MB call
    interrupted at 10% kept the CPU busy and made the next small call 100x slower)."""
    import threading
    import time

    monkeypatch.setattr(nb, "_WORKERS", 2)
    monkeypatch.setattr(nb, "_POOL", None)
    ran, lock = [], threading.Lock()

    def chunk(index):
        with lock:
            ran.append(index)
        if index == 0:
            raise KeyboardInterrupt  # what the caller sees first, as from a signal handler
        time.sleep(0.05)
        return index

    with pytest.raises(KeyboardInterrupt):
        for _ in nb._in_order(chunk, list(range(40))):
            pass
    time.sleep(0.3)  # long enough for the queue to drain 6 more chunks were they not cancelled
    assert len(ran) <= 3, f"{len(ran)} of 40 chunks ran after the call was abandoned"
    assert list(nb._in_order(lambda i: i * i, list(range(6)))) == [0, 1, 4, 9, 16, 25]  # the pool still works
