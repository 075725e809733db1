"""Property-based fuzzing of every public op with hostile arguments (NumPy backend; and the
same draws on GPU arrays, through the CPU stand-in everywhere and a GPU when there is one).

Contract under test, for every call: it returns the correct result or raises
``InvalidArgumentError`` / ``TypeError``; nothing else escapes, nothing crashes, and the peak
memory NumPy allocates during the call (tracemalloc traces NumPy's allocations) stays within
``MEMORY_FACTOR`` x the bytes of the result, the inputs (for a refused call: only the memory
they own, so a zero-stride view of 2**40 elements counts as one) and the backend's one documented
working buffer, all counted at 8 bytes per element (the widest type the backend works in:
float64 sums in fractional pooling, float32 copies of half inputs), plus ``SLACK_BYTES``.
Huge-but-valid-looking sizes (2**31, 2**40, 2**62 ...) must therefore be refused *before*
anything of their size is allocated.

Two kinds of draws:

* valid calls in hostile clothing (Fortran order, strided / negative-stride / transposed
  views, byte-swapped arrays, sizes as int32 / int64 / tuples, NaN and Inf values) must
  succeed and match the brute-force loops of tests/reference.py (NaN and Inf positions
  exactly, finite values within the dtype's tolerance);
* a valid call with one to three hostile mutations (wrong ranks and lengths, zero / negative
  / 2**31 / 2**40 / 2**63 sizes, strides and paddings, wrapped int32 values, unknown padding
  and data_format strings, bool / complex / integer / mismatched dtypes, 0-d and empty
  arrays, zero-stride broadcast views of 2**40 elements, non-bool flags) must obey the
  contract; when it is accepted, running it again on plain C-ordered copies with list sizes
  must give the same bits.

The default suite runs the "fuzz-ci" hypothesis profile (tests/conftest.py, a few thousand
examples in all); ``-m slow`` adds the "fuzz-long" soak of the same properties.
"""

from __future__ import annotations

import math
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import gradops
import reference
from conftest import RTOL, to_gpu, to_host
from conv_cases import conv_problems, layout_attr, to_layout, valid_truncation
from pooling_cases import max_pool_grad_sequences, pool_sequence

# The working set the NumPy backend may hold, in units of result + inputs (+ its im2col row),
# each element counted at 8 bytes: measured peaks are 0.9x-2.3x on 0.5 MB problems, and 5x
# for the forward fractional pooling's float64 prefix sums over a single-row input.
MEMORY_FACTOR = 6
# Interpreter and NumPy bookkeeping that does not scale with the tensors (thread-pool futures,
# small index arrays, exception objects): measured at under 64 KiB for the tiny fuzz shapes.
SLACK_BYTES = 256 * 1024
WORKING_ITEMSIZE = 8

CI = settings.get_profile("fuzz-ci")
LONG = settings.get_profile("fuzz-long")

CONV_OPS = ["conv2d_backprop_filter", "conv2d_backprop_filter_v2", "conv2d_backprop_input",
            "conv2d_backprop_input_v2", "conv2d", "depthwise_conv2d_native_backprop_input",
            "depthwise_conv2d_native_backprop_filter", "depthwise_conv2d_native"]
POOL_OPS = ["fractional_avg_pool_grad", "fractional_avg_pool", "fractional_max_pool_grad", "fractional_max_pool"]
INT_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))

HOSTILE_INTS = [0, -1, 1, 2, 3, 7, 2**31 - 1, 2**31, -(2**31), 2**32 - 6, 2**40, 2**62, 2**63 - 1, 2**63,
                -(2**63), 2**64, 2**100]
HOSTILE_STRINGS = ["same", "valid", "", "FULL", "NHWC ", "NCHW\x00", "NDHWC", "SAME\n", "É", b"SAME",
                   b"NHWC", b"\xff\xfe", None, 3, 1.5, ["SAME"], True]
HOSTILE_FLAGS = ["yes", "", 0, 1, 2, None, 1.0, [True], np.int64(1), np.array([True, False])]
HOSTILE_DTYPES = [np.bool_, np.complex64, np.complex128, np.int8, np.int32, np.int64, np.uint8, np.uint64,
                  np.float16, np.float32, np.float64, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
                  np.dtype("datetime64[s]"), np.dtype("U3"), np.dtype([("a", np.float32)])]


# --------------------------------------------------------------------------- measuring a call

_byte_bounds = getattr(getattr(np.lib, "array_utils", None), "byte_bounds", None) or np.byte_bounds


def owned_bytes(x) -> int:
    """Bytes of memory an argument occupies (a broadcast view of 2**40 elements owns one)."""
    if isinstance(x, np.ndarray):
        if x.size == 0:
            return 0
        low, high = _byte_bounds(x)
        return high - low
    return 0


# Calls whose result would fit in the machine's memory are valid and computed; the fuzzer
# must not spend a shared CI machine's gigabytes on them, so within this module the host
# "has" this much memory and such calls take the (tested) refusal path instead.
FUZZ_HOST_MEMORY = 64 * 2**20


@pytest.fixture(scope="module", autouse=True)
def small_host_memory():
    from gradops import _arrays

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_arrays, "host_memory_bytes", lambda: FUZZ_HOST_MEMORY)
        # The CPU stand-in's "GPU" memory is the host's (cuda_host asks _arrays.host_memory_bytes
        # at each call): its totals, cached per device, are asked afresh under this limit, where a
        # worker's earlier tests may have cached the real memory.
        patch.setattr(_arrays, "_device_totals", {})
        yield


@pytest.fixture(scope="module", autouse=True)
def warm_up(small_host_memory):
    """Run every code path once untraced: first calls import modules and fill caches."""
    one = np.ones((2, 4, 4, 2), np.float32)
    for dtype in (np.float16, np.float32):
        x = one.astype(dtype)
        for sizes in ([3, 3, 2, 2], [3, 3, 1, 2]):
            gradops.conv2d_backprop_filter(x, sizes, x, [1, 1, 1, 1], "SAME")
            gradops.conv2d_backprop_input([2, 4, 4, 2], np.ones(sizes, dtype), x, [1, 1, 1, 1], "SAME")
            gradops.conv2d(x.transpose(0, 3, 1, 2), np.ones(sizes, dtype), [1, 1, 1, 1], "SAME", data_format="NCHW")
        gradops.depthwise_conv2d_native_backprop_input([2, 4, 4, 2], np.ones((3, 3, 2, 2), dtype),
                                                       np.ones((2, 4, 4, 4), dtype), [1, 1, 1, 1], "SAME")
        gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 2], np.ones((2, 4, 4, 4), dtype),
                                                        [1, 1, 1, 1], "SAME")
        gradops.depthwise_conv2d_native(x, np.ones((3, 3, 2, 1), dtype), [1, 1, 1, 1], "SAME")
        gradops.fractional_avg_pool_grad([2, 4, 4, 2], x[:, :2, :2], [0, 2, 4], [0, 2, 4], True)
        gradops.fractional_avg_pool(x, [0, 2, 4], [0, 2, 4], True)
        pooled = gradops.fractional_max_pool(x, [0, 2, 4], [0, 2, 4], True)
        gradops.fractional_max_pool_grad(x, pooled, pooled, [0, 2, 4], [0, 2, 4], True)
    gradops.fractional_pooling_sequence(10, 1.5, True, 0)


def measure(fn, kwargs):
    """(result, error, peak traced bytes) of ``fn(**kwargs)``; forbidden exceptions propagate."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        try:
            return fn(**kwargs), None, tracemalloc.get_traced_memory()[1]
        except (gradops.InvalidArgumentError, TypeError) as exc:
            return None, exc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def as_array_or_none(x):
    try:
        return np.asarray(x)
    except Exception:  # a hostile non-array: it owns no tensor memory
        return None


def memory_bound(kwargs, result, im2col_elements=0) -> int:
    """Allowed traced peak: see the module docstring (Python lists count as the arrays they become)."""
    elements = 0
    for value in kwargs.values():
        array = value if isinstance(value, np.ndarray) else as_array_or_none(value) if isinstance(value, list) else None
        if array is not None and array.dtype != object:
            # A refused call may not touch more than the memory an input owns (one element of
            # a broadcast view); an accepted one works on the input's logical elements.
            elements += array.size if result is not None else owned_bytes(array) // max(1, array.itemsize)
    if result is not None:
        elements += result.size
    return MEMORY_FACTOR * WORKING_ITEMSIZE * (elements + im2col_elements) + SLACK_BYTES


def im2col_elements(op, result, kwargs) -> int:
    """The NumPy filter gradient gathers one filter row's input columns: out positions x cols x in_depth."""
    if result is None or not op.startswith("conv2d_backprop_filter"):
        return 0
    dy = np.asarray(kwargs["out_backprop"])
    return (dy.size // max(1, dy.shape[-1] if kwargs.get("data_format", "NHWC") == "NHWC" else dy.shape[1])
            * result.shape[1] * result.shape[2])


def check_memory(op, kwargs, result, peak):
    bound = memory_bound(kwargs, result, im2col_elements(op, result, kwargs))
    assert peak <= bound, f"{op} traced a peak of {peak} bytes, bound {bound}"


# --------------------------------------------------------------------------- comparing results


def assert_ieee_close(actual, expected, dtype):
    """Same shape; NaN and +-Inf at exactly the same positions; finite values within tolerance."""
    dtype = np.dtype(dtype)
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == dtype, (actual.dtype, dtype)
    a = actual.astype(np.float64)
    if dtype in INT_DTYPES:
        # Sums are cast once with truncation; the forward op's prefix-sum differences may land
        # a hair below an integer the loop hits exactly, so allow one unit.
        assert np.max(np.abs(a - np.trunc(expected)), initial=0) <= 1
        return
    np.testing.assert_array_equal(np.isnan(a), np.isnan(expected), err_msg="NaN positions differ")
    np.testing.assert_array_equal(np.isposinf(a), np.isposinf(expected), err_msg="+Inf positions differ")
    np.testing.assert_array_equal(np.isneginf(a), np.isneginf(expected), err_msg="-Inf positions differ")
    finite = np.isfinite(expected)
    if finite.any():
        e = expected[finite]
        scale = max(1.0, float(np.max(np.abs(e))))
        err = float(np.max(np.abs(a[finite] - e)))
        assert err <= RTOL[dtype] * scale * 4, f"max error {err} > {RTOL[dtype] * scale * 4} ({dtype.name})"


# --------------------------------------------------------------------------- array clothing

FORMS = ["c", "fortran", "strided", "negative", "transposed", "byteswapped", "list"]


def dress(x: np.ndarray, form: str):
    """The same values as another kind of array (never changes what the op should compute)."""
    if form == "fortran":
        return np.asfortranarray(x)
    if form == "strided":
        big = np.zeros(tuple(2 * d + 1 for d in x.shape), x.dtype)
        view = big[tuple(slice(1, 2 * d + 1, 2) for d in x.shape)]
        view[...] = x
        return view
    if form == "negative":
        return np.ascontiguousarray(x[::-1, ::-1, ::-1, ::-1])[::-1, ::-1, ::-1, ::-1]
    if form == "transposed":
        return np.ascontiguousarray(x.transpose(3, 2, 1, 0)).transpose(3, 2, 1, 0)
    if form == "byteswapped" and x.dtype.itemsize > 1 and x.dtype != ml_dtypes.bfloat16:
        return x.astype(x.dtype.newbyteorder("S"))
    if form == "list" and x.dtype == np.float64 and x.size:  # an empty nested list loses its shape
        return x.tolist()
    return x


SIZE_FORMS = [list, tuple, lambda v: np.asarray(v, np.int32), lambda v: np.asarray(v, np.int64),
              lambda v: np.asarray(v, np.uint16)]


def poison(draw, x: np.ndarray, specials=(np.nan, np.inf, -np.inf)) -> np.ndarray:
    """Put NaN / +Inf / -Inf at a few drawn positions of a float array (a copy)."""
    if x.size == 0 or x.dtype in INT_DTYPES:
        return x
    x = x.copy()
    flat = x.reshape(-1)
    for _ in range(draw(st.integers(1, 3))):
        flat[draw(st.integers(0, x.size - 1))] = draw(st.sampled_from(specials))
    return x


# --------------------------------------------------------------------------- valid calls


@st.composite
def conv_calls(draw, op=None, problems=conv_problems):
    """(op, kwargs, expected float64 result) of a valid convolution call on tiny shapes
    (``problems``: the strategy of its attributes, conv_cases.conv_problems by default)."""
    op = op or draw(st.sampled_from(CONV_OPS))
    p = draw(problems())
    assume(valid_truncation(p))
    depthwise = op.startswith("depthwise")
    rng = np.random.default_rng(p["seed"])
    dtype, layout = np.dtype(p["dtype"]), p["layout"]
    n, h, w, groups = p["n"], p["h"], p["w"], p["groups"]
    if depthwise:  # groups = in_depth, the filter [R, S, C, multiplier]
        c, o = groups, groups * p["og"]
        filt = rng.standard_normal((p["r"], p["s"], c, p["og"])).astype(dtype)
        hwio = reference.depthwise_to_hwio(filt)
    else:
        c, o = groups * p["cg"], groups * p["og"]
        filt = hwio = rng.standard_normal((p["r"], p["s"], p["cg"], o)).astype(dtype)
    geo = dict(strides=p["strides"], padding=p["padding"], dilations=p["dilations"], explicit=p["pads"])
    oh = reference.window(h, p["r"], p["strides"][0], p["dilations"][0], p["padding"], p["pads"][0])[0]
    ow = reference.window(w, p["s"], p["strides"][1], p["dilations"][1], p["padding"], p["pads"][1])[0]
    x = rng.standard_normal((n, h, w, c)).astype(dtype)
    dy = rng.standard_normal((n, oh, ow, o)).astype(dtype)
    if draw(st.booleans()):  # IEEE specials in one tensor (or two)
        x, filt, dy = (poison(draw, a) if draw(st.booleans()) else a for a in (x, filt, dy))
        hwio = reference.depthwise_to_hwio(filt) if depthwise else filt
    f64 = lambda a: a.astype(np.float64)  # noqa: E731
    kw = {"strides": layout_attr(*p["strides"], layout), "padding": p["padding"], "data_format": layout,
          "dilations": layout_attr(*p["dilations"], layout)}
    if p["padding"] == "EXPLICIT":
        per_dim = {"N": (0, 0), "H": p["pads"][0], "W": p["pads"][1], "C": (0, 0)}
        kw["explicit_paddings"] = [v for d in layout for v in per_dim[d]]
    if draw(st.booleans()):  # attributes as NumPy integers / tuples
        kw["strides"] = tuple(np.int64(v) for v in kw["strides"])
        kw["dilations"] = np.asarray(kw["dilations"], np.int32)
    form = lambda: draw(st.sampled_from(FORMS))  # noqa: E731
    size = draw(st.sampled_from(SIZE_FORMS))
    x_l, dy_l = to_layout(x, layout), to_layout(dy, layout)
    if op.startswith("conv2d_backprop_filter"):
        expected = reference.conv2d_backprop_filter(f64(x), hwio.shape, f64(dy), **geo)
        kw.update(input=dress(x_l, form()), out_backprop=dress(dy_l, form()))
        if op.endswith("_v2"):
            kw["filter"] = dress(np.zeros(filt.shape, dtype), form())
        else:
            kw["filter_sizes"] = size(list(filt.shape))
    elif op == "depthwise_conv2d_native_backprop_filter":
        expected = reference.conv2d_backprop_filter(f64(x), hwio.shape, f64(dy), **geo).reshape(filt.shape)
        kw.update(input=dress(x_l, form()), out_backprop=dress(dy_l, form()), filter_sizes=size(list(filt.shape)))
    elif op == "conv2d":
        expected = to_layout(reference.conv2d(f64(x), f64(hwio), **geo), layout)
        kw.update(input=dress(x_l, form()), filter=dress(filt, form()))
    elif op == "depthwise_conv2d_native":
        expected = to_layout(reference.conv2d(f64(x), f64(hwio), **geo), layout)
        kw.update(input=dress(x_l, form()), filter=dress(filt, form()))
        kw.pop("use_cudnn_on_gpu", None)
    else:
        expected = to_layout(reference.conv2d_backprop_input(x.shape, f64(hwio), f64(dy), **geo), layout)
        kw.update(filter=dress(filt, form()), out_backprop=dress(dy_l, form()))
        if op.endswith("_v2"):
            kw["input"] = dress(np.zeros(x_l.shape, dtype), form())
        elif not depthwise and groups == 1 and draw(st.booleans()):
            kw["input_sizes"] = size([h, w])  # TF's [rows, cols] form: depth is the filter's in_depth
        else:
            kw["input_sizes"] = size(list(x_l.shape))
    if op.startswith("conv2d") and draw(st.booleans()):
        kw["use_cudnn_on_gpu"] = draw(st.sampled_from([True, False, np.bool_(True)]))
    return op, kw, expected, dtype


POOL_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]


@st.composite
def pool_calls(draw, op=None):
    op = op or draw(st.sampled_from(POOL_OPS))
    overlapping = draw(st.sampled_from([False, True, np.bool_(True)]))
    n, h, w, d = (draw(st.integers(1, 2)), draw(st.integers(1, 7)), draw(st.integers(1, 7)),
                  draw(st.integers(1, 3)))
    if op == "fractional_max_pool_grad":  # non-empty cells (and maybe an empty row: below)
        rows, cols, out_rows, out_cols = draw(max_pool_grad_sequences((n, h, w, d), bool(overlapping)))
    else:
        rows, cols = draw(pool_sequence(h, bool(overlapping))), draw(pool_sequence(w, bool(overlapping)))
    dtype = np.dtype(draw(st.sampled_from(POOL_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = 100 if dtype in INT_DTYPES else 1
    size = draw(st.sampled_from(SIZE_FORMS[:4]))
    form = lambda: draw(st.sampled_from(FORMS))  # noqa: E731
    if op == "fractional_avg_pool_grad":
        extra = draw(st.lists(st.integers(-3, 20), max_size=2))  # unused trailing entries are allowed
        dy = (rng.standard_normal((n, len(rows) - 1, len(cols) - 1, d)) * scale).astype(dtype)
        if draw(st.booleans()):
            dy = poison(draw, dy)
        expected = reference.fractional_avg_pool_grad((n, h, w, d), dy.astype(np.float64), rows, cols,
                                                      bool(overlapping))
        kw = dict(orig_input_tensor_shape=size([n, h, w, d]), out_backprop=dress(dy, form()),
                  row_pooling_sequence=size(rows + extra), col_pooling_sequence=size(cols + extra),
                  overlapping=overlapping)
    elif op == "fractional_max_pool_grad":
        # Few distinct values (ties: TF's first-in-scan rule decides) or distinct normals; no NaN
        # in orig_input: a NaN first in a cell is TF's maximum and refused (test_fractional_max_pool_grad).
        x = (rng.integers(-2, 3, (n, h, w, d)) if draw(st.booleans()) else rng.standard_normal((n, h, w, d)) * scale)
        x = x.astype(dtype)
        if draw(st.booleans()):
            x = poison(draw, x, (np.inf, -np.inf))
        # A last row of orig_output that the row cells leave empty (unvisited, or empty extra
        # cells): TF computes the call where out_backprop stops before it (image 0's rows above).
        # Or more images or channels, which TF's walk never visits either: out_backprop stops
        # before the first of them (with channels, within the first cell's).
        empty_row = draw(st.booleans())
        images, channels = draw(st.sampled_from([(0, 0)] * 3 + [(1, 0), (0, 2)]))
        _, y = reference.fractional_max_pool_select(x, rows, cols, out_rows + empty_row, out_cols, bool(overlapping),
                                                    n + images, d + channels)
        dy = (rng.standard_normal(y.shape) * scale).astype(dtype)
        if draw(st.booleans()):
            dy = poison(draw, dy)
        read = dy[:1, :1, :1, :draw(st.integers(0, d))] if channels else dy[:1, :out_rows] if empty_row else dy[:n]
        expected = reference.fractional_max_pool_grad(x, dy, rows, cols, bool(overlapping), read.size)
        expected = expected.astype(np.float64)
        kw = dict(orig_input=dress(x, form()), orig_output=dress(y, form()), out_backprop=dress(read, form()),
                  row_pooling_sequence=size(rows), col_pooling_sequence=size(cols),
                  overlapping=overlapping)
    else:
        x = (rng.standard_normal((n, h, w, d)) * scale).astype(dtype)
        if draw(st.booleans()):
            x = poison(draw, x)
        if op == "fractional_avg_pool":
            expected = reference.fractional_avg_pool(x.astype(np.float64), rows, cols, bool(overlapping))
        else:
            expected = reference.fractional_max_pool(x, rows, cols, bool(overlapping))
        kw = dict(value=dress(x, form()), row_pooling_sequence=size(rows), col_pooling_sequence=size(cols),
                  overlapping=overlapping)
    return op, kw, expected, dtype


def any_valid_call():
    return st.one_of(conv_calls(), pool_calls())


def check_valid(call):
    op, kw, expected, dtype = call
    result, error, peak = measure(getattr(gradops, op), kw)
    assert error is None, f"{op} rejected a valid call: {error}"
    assert isinstance(result, np.ndarray)
    assert_ieee_close(result, expected, dtype)
    check_memory(op, kw, result, peak)


@settings(CI, max_examples=400)
@given(call=any_valid_call())
def test_valid_calls_in_hostile_clothing_match_reference(call):
    check_valid(call)


@pytest.mark.slow
@settings(LONG)
@given(call=any_valid_call())
def test_valid_calls_in_hostile_clothing_match_reference_long(call):
    check_valid(call)


# --------------------------------------------------------------------------- hostile mutations

SIZE_KEYS = ("filter_sizes", "input_sizes", "orig_input_tensor_shape", "row_pooling_sequence",
             "col_pooling_sequence")
ATTR_KEYS = ("strides", "dilations", "explicit_paddings")
STRING_KEYS = ("padding", "data_format")
FLAG_KEYS = ("use_cudnn_on_gpu", "overlapping")
TENSOR_KEYS = ("input", "filter", "out_backprop", "value", "orig_input", "orig_output")


@st.composite
def hostile_int_list(draw, values):
    """A mutated integer list: a hostile entry, a wrong length, or the wrong kind of container."""
    try:
        values = [int(v) for v in np.asarray(values).reshape(-1)]
    except (TypeError, ValueError, OverflowError):  # already mutated into a non-list
        values = [1, 1, 1, 1]
    kind = draw(st.sampled_from(["entry", "entry", "length", "int32-wrap", "float", "bool", "2d", "0d",
                                 "empty", "none", "string", "huge-list"]))
    if kind == "entry" and values:
        values[draw(st.integers(0, len(values) - 1))] = draw(st.sampled_from(HOSTILE_INTS))
        return draw(st.sampled_from([list, tuple]))(values)
    if kind == "length":
        return values[:-1] if values and draw(st.booleans()) else values + [draw(st.sampled_from(HOSTILE_INTS))]
    if kind == "int32-wrap":  # the int32 a 64-bit size wraps to, as a serialised graph would hold it
        big = [(v % 2**31) + 2**32 * draw(st.integers(1, 3)) if i == 0 else v % 2**31
               for i, v in enumerate(values)]
        return np.asarray(big, np.int64).astype(np.int32)
    if kind == "float":
        return np.asarray(values, np.float64)  # floats hold any of the hostile ints
    if kind == "bool":
        return np.asarray(values, bool)
    if kind == "2d":
        return np.asarray([v % 2**62 for v in values + values], np.int64).reshape(2, -1)
    if kind == "0d":
        return np.int64(values[0] % 2**62 if values else 1)
    if kind == "empty":
        return np.zeros(0, np.int64)
    if kind == "none":
        return None
    if kind == "string":
        return "".join(str(v) for v in values)
    return [draw(st.sampled_from(HOSTILE_INTS)) for _ in range(draw(st.integers(0, 9)))]


def cast_or_zeros(x, dtype):
    """x cast to dtype, or zeros of dtype where NumPy refuses the cast: an earlier mutation may
    have made x any of HOSTILE_DTYPES, and NumPy refuses some pairs with TypeError/ValueError and
    datetime64 -> a short string with RuntimeError (CI's run of 75e3642 drew that pair)."""
    try:
        return x.astype(dtype)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        pass
    try:
        return np.zeros(x.shape, dtype)
    except ValueError:  # x.shape's elements of dtype's (wide) items pass NumPy's size limit
        return np.zeros((1,) * x.ndim, dtype)


@st.composite
def hostile_tensor(draw, x, broadcast=True):
    """A mutated tensor.  Huge broadcast filters are left out: the NumPy backend walks filter
    taps in a Python loop, so a valid 2**20-row filter takes seconds (correct, but not CI-sized)."""
    x = as_array_or_none(x)
    if x is None or x.dtype == object:  # already mutated into a non-array
        x = np.ones((1, 1, 1, 1), np.float32)
    kind = draw(st.sampled_from(["dtype", "dtype", "rank", "0d", "empty", "python", "none"]
                                + ["broadcast"] * broadcast))
    if kind == "dtype":
        dtype = np.dtype(draw(st.sampled_from(HOSTILE_DTYPES)))
        if x.size > 2**16:  # an earlier broadcast mutation: keep it a zero-stride view
            return np.broadcast_to(np.zeros((), dtype), x.shape)
        return cast_or_zeros(x, dtype)
    # An earlier broadcast mutation of the same tensor may have made x a 2**40-element view:
    # the mutations below must not materialise it (x.reshape(-1) would copy it).
    if kind == "rank":
        shape = x.shape[:draw(st.integers(0, 3))] + (1,) * draw(st.integers(0, 2))
        return np.broadcast_to(np.ones((), x.dtype), shape) if x.size > 2**16 else np.ones(shape, x.dtype)
    if kind == "0d":
        return x[(0,) * x.ndim] if x.size else np.float32(1)
    if kind == "empty":
        shape = list(x.shape) or [1]
        shape[draw(st.integers(0, len(shape) - 1))] = 0
        return np.zeros(shape, x.dtype)
    if kind == "broadcast":  # a zero-stride view: 2**40 logical elements in one element's memory
        big = draw(st.sampled_from([2**20, 2**31, 2**40]))
        shape = list(x.shape) if x.ndim == 4 and x.size <= 2**16 else [1, 1, 1, 1]  # one huge dim only
        axis = draw(st.integers(0, 3))
        shape[axis] = big
        try:
            return np.broadcast_to(np.ones(1, x.dtype).reshape(1, 1, 1, 1), shape)
        except ValueError:  # "iterator is too large": x's other dimensions times 2**40 pass NumPy's limit
            shape = [1, 1, 1, 1]
            shape[axis] = big
            return np.broadcast_to(np.ones(1, x.dtype).reshape(1, 1, 1, 1), shape)
    if kind == "python":
        return draw(st.sampled_from([1.0, [1.0, [2.0]], "abc", object(), {"a": 1}, b"\x00" * 16]))
    return None


@st.composite
def hostile_calls(draw, valid_calls=None):
    op, kw, _, _ = draw(valid_calls if valid_calls is not None else any_valid_call())
    kw = dict(kw)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(kw) + ["explicit_paddings"]))
        value = kw.get(key)
        if key in SIZE_KEYS:
            kw[key] = draw(hostile_int_list(value))
        elif key in ATTR_KEYS:
            if key == "explicit_paddings" and value is None:  # explicit pads with SAME/VALID, or huge ones
                kw["padding"] = draw(st.sampled_from(["EXPLICIT", kw.get("padding", "SAME")]))
                kw[key] = [0, 0] + [draw(st.sampled_from(HOSTILE_INTS)) for _ in range(4)] + [0, 0]
            else:
                kw[key] = draw(hostile_int_list(value))
        elif key in STRING_KEYS:
            kw[key] = draw(st.sampled_from(HOSTILE_STRINGS))
        elif key in FLAG_KEYS:
            kw[key] = draw(st.sampled_from(HOSTILE_FLAGS))
        elif key in TENSOR_KEYS:
            kw[key] = draw(hostile_tensor(value, broadcast=key != "filter"))
    return op, kw


def canonical(key, value):
    """The same argument as a plain C-ordered array or, for a size or sequence argument, a
    list of Python ints (a 1-D integer *tensor*, such as an out_backprop TF reads flat, stays
    an array: as a list it would become int64 and no longer share the call's dtype)."""
    if (key not in TENSOR_KEYS and isinstance(value, np.ndarray) and value.ndim == 1
            and np.issubdtype(value.dtype, np.integer)):
        return [int(v) for v in value]
    if isinstance(value, np.ndarray) and value.nbytes <= CANONICAL_MAX_BYTES:
        return np.array(value, order="C", copy=True)
    return value  # e.g. a broadcast view of 2**40 elements, which the op may accept unread


#: A C-ordered copy of a larger array is not made (the view is passed again as it is): an
#: out_backprop broadcast to 2**40 images is valid where every average-pooling cell is empty
#: (the op reads none of it), and copying it took 2 TiB (the long fuzz run, 2026-12-02).
CANONICAL_MAX_BYTES = 1 << 28


def check_hostile(call):
    op, kw = call
    result, error, peak = measure(getattr(gradops, op), kw)
    check_memory(op, kw, result, peak)
    if error is not None:
        assert str(error), "errors must say what is wrong"
        return
    assert isinstance(result, np.ndarray)
    again = getattr(gradops, op)(**{k: canonical(k, v) for k, v in kw.items()})
    # Not bitwise: BLAS may sum in another order for differently aligned copies.
    assert_same_result(result, again)


def assert_same_result(result, again):
    """``result`` (a host array) is ``again`` (the NumPy backend's) up to assert_ieee_close.  An
    empty result is compared by dtype and shape alone: widened to float64 for the comparison,
    it can pass NumPy's 2**63-byte limit on an array's non-zero dimensions where the result
    itself does not (an empty [1, 1, 2**61 + 1, 0] float16 result, 2**62 bytes to NumPy: the
    long fuzz run, 2026-12-07)."""
    assert result.dtype == again.dtype and result.shape == again.shape, (result.shape, again.shape)
    if again.size == 0:
        return
    assert_ieee_close(result, again.astype(np.float64), result.dtype)


@settings(CI, max_examples=1200)
@given(call=hostile_calls())
def test_hostile_arguments_give_result_or_clear_error(call):
    check_hostile(call)


@pytest.mark.slow
@settings(LONG)
@given(call=hostile_calls())
def test_hostile_arguments_give_result_or_clear_error_long(call):
    check_hostile(call)


@pytest.mark.parametrize("source", HOSTILE_DTYPES, ids=str)
def test_generator_casts_between_any_hostile_dtypes(source):
    """The fuzzer's dtype mutation may apply twice, so its cast must take every pair: a pair
    NumPy refuses in a way it did not catch made CI fail in the generator, not in gradops."""
    x = np.zeros((1, 1, 1, 1), source)
    for dtype in map(np.dtype, HOSTILE_DTYPES):
        cast = cast_or_zeros(x, dtype)
        assert cast.dtype == dtype and cast.shape == x.shape


# --------------------------------------------------------------------------- the same calls on GPU arrays
#
# The draws above with their tensors moved to the device (cuda_device: a GPU, or the CPU
# stand-in of tests/cuda_host.py, which runs the real launchers and kernel sources): default
# dispatch (cuDNN when it takes the call, else our kernels) must keep the same contract.
# Tensors move as native-byte-order copies (C order, or Fortran order, which CuPy keeps);
# the other strided GPU views are covered by each op's non-contiguous tests.  Tensors of more
# than MAX_MOVED elements (the zero-stride views of 2**40) and non-arrays stay on the host,
# which makes the call a mixed host/GPU one: it must be refused.  Host memory peaks are not
# measured here (the device allocates elsewhere).

MAX_MOVED = 1 << 16


def gpu_valid_calls():
    """Valid calls of every op on GPU arrays (each has GPU kernels)."""
    return st.one_of(conv_calls(), *(pool_calls(op) for op in POOL_OPS))


def on_device(kw):
    moved = dict(kw)
    for key in TENSOR_KEYS:
        value = kw.get(key)
        if isinstance(value, list):  # a nested list of numbers: the tensor a GPU caller would pass
            value = as_array_or_none(value)
        if isinstance(value, np.ndarray) and value.dtype.kind in "biufcV" and value.size <= MAX_MOVED:
            native = value if value.dtype.isnative else value.astype(value.dtype.newbyteorder("="))
            moved[key] = to_gpu(native)
    return moved


@settings(CI, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=gpu_valid_calls())
def test_gpu_valid_calls_match_reference(cuda_device, call):
    import cupy

    op, kw, expected, dtype = call
    result = getattr(gradops, op)(**on_device(kw))
    assert isinstance(result, cupy.ndarray)
    assert_ieee_close(to_host(result), expected, dtype)


def test_stand_in_gpu_has_the_modules_memory(host_device):
    """On the CPU stand-in, the "GPU" has this module's host memory too (FUZZ_HOST_MEMORY), as
    the hostile-argument test below needs: a GPU call the NumPy backend refuses for memory is
    refused on the device as well, not computed (a 128 MiB result here).  Until 2026-12-01 the
    stand-in kept the host_memory_bytes it imported (the real one wherever a test module imported
    cuda_host first, as in the full suite), and the hostile-argument test failed at random: a GPU
    call with a 5.7 GB result was computed that the NumPy backend then refused."""
    import cupy

    with pytest.raises(gradops.InvalidArgumentError, match=f"more than the GPU's {FUZZ_HOST_MEMORY} bytes"):
        gradops.conv2d_backprop_input([1, 4096, 4096, 1], cupy.ones((1, 1, 1, 1), np.float32),
                                      cupy.ones((1, 1, 1, 1), np.float32), [1, 4096, 4096, 1], "VALID")


@settings(CI, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(call=hostile_calls(gpu_valid_calls()))
def test_gpu_hostile_arguments_give_result_or_clear_error(cuda_device, call):
    import cupy

    op, kw = call
    moved = on_device(kw)
    try:
        result = getattr(gradops, op)(**moved)
    except (gradops.InvalidArgumentError, TypeError) as exc:
        event("refused")  # --hypothesis-show-statistics shows how many calls reached a kernel
        assert str(exc), "errors must say what is wrong"
        return
    event("computed")
    # Tensors past MAX_MOVED stay on the host, and a call with none on the GPU is a host call
    # (an out_backprop broadcast to 2**20 images, valid where every cell is empty, 2026-12-02)
    on_gpu = any(isinstance(value, cupy.ndarray) for value in moved.values())
    assert isinstance(result, cupy.ndarray if on_gpu else np.ndarray)
    again = getattr(gradops, op)(**{k: canonical(k, v) for k, v in kw.items()})  # NumPy backend
    assert_same_result(to_host(result) if on_gpu else result, again)


# --------------------------------------------------------------------------- fractional_pooling_sequence


@st.composite
def sequence_args(draw):
    kind = draw(st.sampled_from(["valid", "valid", "hostile"]))
    input_size = draw(st.integers(1, 60))
    ratio = draw(st.floats(1.0, float(input_size)))
    args = dict(input_size=input_size, pooling_ratio=ratio, pseudo_random=draw(st.booleans()),
                seed=draw(st.one_of(st.none(), st.integers(0, 2**64))))
    if kind == "hostile":
        key = draw(st.sampled_from(sorted(args)))
        args[key] = draw(st.sampled_from(HOSTILE_INTS + [1.5, float("nan"), float("inf"), -1.0, None, "3",
                                                         True, np.int32(-5), np.float64(2.0), [4]]))
    return kind, args


def check_sequence(case):
    kind, args = case
    result, error, peak = measure(gradops.fractional_pooling_sequence, args)
    assert peak <= SLACK_BYTES + MEMORY_FACTOR * WORKING_ITEMSIZE * (0 if result is None else result.size)
    if kind == "valid":
        assert error is None, error
    if error is not None:
        return
    size = args["input_size"]
    out = math.floor(size / args["pooling_ratio"])
    assert result.dtype == np.int64 and result.shape == (out + 1,)
    assert result[0] == 0 and result[-1] == size and np.all(np.diff(result) > 0)
    if size <= 4096:  # the sequence drives the forward op on an input of that size without complaint
        gradops.fractional_avg_pool(np.ones((1, size, 1, 1)), result, [0, 1])


@settings(CI, max_examples=400)
@given(case=sequence_args())
def test_fractional_pooling_sequence_fuzz(case):
    check_sequence(case)


@pytest.mark.slow
@settings(LONG)
@given(case=sequence_args())
def test_fractional_pooling_sequence_fuzz_long(case):
    check_sequence(case)


# --------------------------------------------------------------------------- regressions the fuzzer found


def test_huge_valid_looking_results_are_refused_before_allocating():
    """Consistent calls whose result alone exceeds this machine's memory: refused, nothing allocated."""
    one = np.ones((1, 1, 1, 1), np.float32)
    calls = [
        (gradops.fractional_avg_pool_grad, dict(orig_input_tensor_shape=[1, 2**40, 1, 1], out_backprop=one,
                                                row_pooling_sequence=[0, 2**40], col_pooling_sequence=[0, 1])),
        (gradops.conv2d_backprop_input, dict(input_sizes=[1, 2**31 - 1, 2**31 - 1, 1], filter=one, out_backprop=one,
                                             strides=[1, 2**31 - 1, 2**31 - 1, 1], padding="VALID")),
        (gradops.conv2d_backprop_filter, dict(input=one, filter_sizes=[2**20, 2**20, 1, 1], out_backprop=one,
                                              strides=[1, 1, 1, 1], padding="EXPLICIT",
                                              explicit_paddings=[0, 0, 2**19, 2**19 - 1, 2**19, 2**19 - 1, 0, 0])),
        (gradops.conv2d, dict(input=one, filter=one, strides=[1, 1, 1, 1], padding="EXPLICIT",
                              explicit_paddings=[0, 0, 2**20, 2**20, 2**20, 2**20, 0, 0])),
        (gradops.fractional_pooling_sequence, dict(input_size=2**40, pooling_ratio=1.0)),
    ]
    for fn, kw in calls:
        result, error, peak = measure(fn, kw)
        assert isinstance(error, gradops.InvalidArgumentError), (fn.__name__, result, error)
        assert "memory" in str(error)
        assert peak <= SLACK_BYTES, (fn.__name__, peak)


def test_empty_result_numpy_cannot_make_is_refused_by_name():
    """Found by the fuzzer (CI, 2026-12-07): conv2d padded 2**31 - 1 each side with a filter of
    0 output channels has the empty result [1, 2**31, 2**31, 0], whose non-zero dimensions span
    2**63 bytes of float16; NumPy's zeros raised ValueError ("array is too big") in the backend.
    (tests/test_validation.py checks the rule itself, on GPU arrays too.)"""
    check_hostile(("conv2d", dict(
        strides=[1, 1, 1, 1], padding="EXPLICIT", data_format="NHWC", dilations=[1, 1, 1, 1],
        input=np.array([[[[-0.1321]]]], np.float16), filter=np.zeros((1, 1, 1, 0), np.float16),
        explicit_paddings=[0, 0, 0, 2**31 - 1, 2**31 - 1, 0, 0, 0])))


def test_empty_result_too_wide_to_widen_is_compared_by_shape():
    """Found by the long fuzz run (2026-12-07): depthwise_conv2d_native padded 2**62 columns
    before, at column stride 2, with a filter of multiplier 0 has the empty float16 result
    [1, 1, 2**61 + 1, 0]; NumPy holds it (2**62 bytes of non-zero dimensions), but the test's
    own widening to float64 for the comparison (2**64 bytes) raised ValueError."""
    check_hostile(("depthwise_conv2d_native", dict(
        strides=[1, 1, 2, 1], padding="EXPLICIT", data_format="NHWC", dilations=[1, 1, 1, 1],
        input=np.array([[[[-0.1321]]]], np.float16), filter=np.zeros((1, 1, 1, 0), np.float16),
        explicit_paddings=[0, 0, 0, 0, 2**62, 0, 0, 0])))


def test_refused_call_on_a_swapped_broadcast_view_copies_only_what_it_owns():
    """Found by the long fuzz run (2026-12-07): fractional_max_pool_grad on a byte-swapped
    orig_input broadcast to [1, 2**20, 2, 2] with an orig_output that is not its max pooling is
    refused by the backend's check (TF's), after the native-order copy, which took the view's
    logical 8 MiB (bound: what the inputs own); the copy now keeps broadcast dimensions broadcast."""
    orig_input = np.broadcast_to(np.ones(1, ">f2").reshape(1, 1, 1, 1), (1, 2**20, 2, 2))
    kw = dict(orig_input=orig_input, orig_output=np.array([[[[0.6406, 0.1049]]]], np.float16),
              out_backprop=np.array([[[[-0.5356, 0.3616]]]], np.float16), row_pooling_sequence=[0, 1],
              col_pooling_sequence=[1, 2], overlapping=False)
    result, error, peak = measure(gradops.fractional_max_pool_grad, kw)
    assert isinstance(error, gradops.InvalidArgumentError) and "orig_output" in str(error)
    check_memory("fractional_max_pool_grad", kw, result, peak)


def test_forward_pooling_of_one_wide_row_stays_within_the_memory_bound():
    """Found by the fuzzer: fractional_avg_pool over a [1, 1, 2**20, 1] float16 broadcast view
    with rows [0, 0, 0] (two overlapping one-row cells) and cols [0, 0] summed rows first, and
    the row sums' fancy-indexed differences held four float64 copies of a 2**20-column plane
    (64 MiB, over the bound); reducing columns first leaves a 2 x 1 intermediate."""
    value = np.broadcast_to(np.ones(1, np.float16).reshape(1, 1, 1, 1), (1, 1, 2**20, 1))
    kw = dict(value=value, row_pooling_sequence=[0, 0, 0], col_pooling_sequence=[0, 0], overlapping=True)
    result, error, peak = measure(gradops.fractional_avg_pool, kw)
    assert error is None and result.shape == (1, 2, 1, 1) and (result == 1).all()
    check_memory("fractional_avg_pool", kw, result, peak)


def test_broadcast_views_of_huge_logical_size_are_refused():
    """A zero-stride view of 2**40 elements owns 4 bytes, but any copy of it would not fit."""
    huge = np.broadcast_to(np.float32(1), (2**20, 2**20, 1, 1))
    result, error, peak = measure(gradops.conv2d_backprop_filter_v2, dict(
        input=huge, filter=np.ones((1, 1, 1, 1), np.float32), out_backprop=huge, strides=[1, 1, 1, 1],
        padding="VALID"))
    assert isinstance(error, gradops.InvalidArgumentError) and "memory" in str(error)
    assert peak <= SLACK_BYTES


def test_memory_limit_is_checked_against_the_machine(monkeypatch):
    """With the host limit lowered to 1 MiB, a 512x512 result (2 MiB at 8 bytes) is refused, 16x16 is not."""
    from gradops import _arrays

    monkeypatch.setattr(_arrays, "host_memory_bytes", lambda: 2**20)
    with pytest.raises(gradops.InvalidArgumentError, match="memory"):
        gradops.conv2d_backprop_input([1, 512, 512, 1], np.ones((1, 1, 1, 1), np.float32),
                                      np.ones((1, 512, 512, 1), np.float32), [1, 1, 1, 1], "VALID")
    out = gradops.conv2d_backprop_input([1, 16, 16, 1], np.ones((1, 1, 1, 1), np.float32),
                                        np.ones((1, 16, 16, 1), np.float32), [1, 1, 1, 1], "VALID")
    assert out.shape == (1, 16, 16, 1)


@pytest.mark.parametrize("attr,value", [("strides", [1, 2**64, 1, 1]), ("dilations", [1, 1, 2**63, 1]),
                                        ("strides", [1, -(2**63) - 1, 1, 1])])
def test_attribute_values_must_fit_in_int64(attr, value):
    """TF's list(int) attributes are int64; a wider value is refused, never truncated or sliced with."""
    kw = dict(input=np.ones((1, 4, 4, 1), np.float32), filter_sizes=[1, 1, 1, 1],
              out_backprop=np.ones((1, 4, 4, 1), np.float32), strides=[1, 1, 1, 1], padding="SAME")
    kw[attr] = value
    with pytest.raises(gradops.InvalidArgumentError, match="int64"):
        gradops.conv2d_backprop_filter(**kw)


def test_effective_filter_size_beyond_int64_is_refused():
    """dilation 2**30 on a 2**34-tap filter spans about 2**64 positions: no int64 kernel could
    index it.  (A dilation past int32 is refused before: test_tf_parity.py::test_int32_attributes_as_tf.)"""
    with pytest.raises(gradops.InvalidArgumentError, match="int64"):
        gradops.conv2d_backprop_filter(np.ones((1, 5, 5, 1), np.float32), [2**34, 3, 1, 1],
                                       np.ones((1, 5, 5, 1), np.float32), [1, 1, 1, 1], "SAME",
                                       dilations=[1, 2**30, 1, 1])


def test_empty_shape_hiding_a_huge_dimension_is_refused():
    """[0, 2**63 + 5, 1, 1] has 0 elements, but 2**63 + 5 is no int64 dimension (NumPy cannot make it)."""
    with pytest.raises(gradops.InvalidArgumentError, match="int64"):
        gradops.conv2d_backprop_input(np.array([0, 2**63 + 5, 1, 1], np.uint64), np.ones((1, 1, 1, 1), np.float32),
                                      np.ones((0, 1, 1, 1), np.float32), [1, 1, 1, 1], "VALID")


def test_byte_swapped_arrays_are_computed_like_native_ones():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 5, 5, 2))
    dy = rng.standard_normal((1, 5, 5, 3))
    native = gradops.conv2d_backprop_filter(x, [3, 3, 2, 3], dy, [1, 1, 1, 1], "SAME")
    swapped = gradops.conv2d_backprop_filter(x.astype(">f8"), [3, 3, 2, 3], dy.astype(">f8"), [1, 1, 1, 1], "SAME")
    np.testing.assert_array_equal(native, swapped)
    assert swapped.dtype == np.float64 and swapped.dtype.isnative


@pytest.mark.parametrize("kw,error", [
    (dict(input_size=10, pooling_ratio=1.5, seed=-1), gradops.InvalidArgumentError),
    (dict(input_size=10, pooling_ratio=1.5, seed=1.5), TypeError),
    (dict(input_size=10.5, pooling_ratio=1.5), TypeError),
    (dict(input_size=True, pooling_ratio=1.0), TypeError),
    (dict(input_size=10, pooling_ratio=float("inf")), gradops.InvalidArgumentError),
    (dict(input_size=10, pooling_ratio=1.5, pseudo_random="yes"), TypeError),
])
def test_fractional_pooling_sequence_argument_rules(kw, error):
    with pytest.raises(error):
        gradops.fractional_pooling_sequence(**kw)


def test_forward_pooling_needs_one_cell_and_names_the_sequence():
    with pytest.raises(gradops.InvalidArgumentError, match="row_pooling_sequence"):
        gradops.fractional_avg_pool(np.ones((1, 4, 4, 1)), [0], [0, 4])
