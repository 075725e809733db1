"""gradops.depthwise_conv2d_native_backprop_filter against brute-force loops, adjointness and TF."""

from __future__ import annotations

import math
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gradops
from conftest import FLOAT_DTYPES, assert_close, random_array, run_forced_cases
from depthwise_cases import (DTYPE_IDS, NO_PADS, adjoint_args, adjoint_grid, attr4, depthwise_cases, explicit8,
                             geometry_grid, out_hw, padding_format_dtype_grid, to_format)
from reference import conv2d, conv2d_backprop_filter, depthwise_to_hwio

OP = "depthwise_conv2d_native_backprop_filter"


# --------------------------------------------------------------------------- helpers


def expected_grad(x, filter_sizes, dy, strides, padding, dilations, pads):
    """Reference filter gradient [R, S, C, M] (float64) and its error scale max(sum |terms|)."""
    r, s, c, m = filter_sizes
    hwio = (r, s, 1, c * m)
    x64, dy64 = x.astype(np.float64), dy.astype(np.float64)
    ref = conv2d_backprop_filter(x64, hwio, dy64, strides, padding, dilations, pads)
    mag = conv2d_backprop_filter(np.abs(x64), hwio, np.abs(dy64), strides, padding, dilations, pads)
    return ref.reshape(filter_sizes), max(1.0, float(mag.max()) if mag.size else 1.0)


def make_case(rng, *, x_shape, filt_hw, multiplier, strides=(1, 1), dilations=(1, 1), padding="VALID",
              pads=NO_PADS, data_format="NHWC", dtype=np.float64):
    """(kwargs for the op in ``data_format``, NHWC x, NHWC dy, filter_sizes)."""
    n, h, w_, c = x_shape
    oh, ow = out_hw((h, w_), filt_hw, strides, dilations, padding, pads)
    x = random_array(rng, x_shape, dtype)
    dy = random_array(rng, (n, oh, ow, c * multiplier), dtype)
    sizes = (*filt_hw, c, multiplier)
    kwargs = dict(input=to_format(x, data_format), filter_sizes=np.array(sizes, np.int32),
                  out_backprop=to_format(dy, data_format), strides=attr4(*strides, data_format), padding=padding,
                  explicit_paddings=explicit8(pads, data_format) if padding == "EXPLICIT" else [],
                  data_format=data_format, dilations=attr4(*dilations, data_format))
    return kwargs, x, dy, sizes


def run_case(rng, *, strides=(1, 1), dilations=(1, 1), padding="VALID", pads=NO_PADS, dtype=np.float64, **case):
    kwargs, x, dy, sizes = make_case(rng, strides=strides, dilations=dilations, padding=padding, pads=pads,
                                     dtype=dtype, **case)
    got = gradops.depthwise_conv2d_native_backprop_filter(**kwargs)
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype) and got.shape == sizes
    ref, scale = expected_grad(x, sizes, dy, strides, padding, dilations, pads)
    assert_close(got, ref, dtype, scale)
    return got


# --------------------------------------------------------------------------- grids


@geometry_grid
def test_geometry_grid(rng, filt_hw, strides, dilations, padding, pads):
    """Every filter size x stride x dilation x padding combination matches the loop reference."""
    x_shape = (2, 6, 7, 2) if filt_hw != (5, 5) else (1, 9, 10, 2)  # VALID with 5x5 dil 2 needs 9 rows
    run_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=2, strides=strides, dilations=dilations,
             padding=padding, pads=pads)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3], ids=lambda m: f"M{m}")
def test_multiplier_format_dtype_grid(rng, multiplier, data_format, dtype):
    """Channel multipliers 1-3 in both layouts and all float dtypes match the reference."""
    run_case(rng, x_shape=(2, 5, 4, 3), filt_hw=(3, 2), multiplier=multiplier, strides=(2, 1),
             dilations=(1, 2), padding="SAME", data_format=data_format, dtype=dtype)


@padding_format_dtype_grid
def test_padding_format_dtype_grid(rng, padding, pads, data_format, dtype):
    """VALID and asymmetric EXPLICIT padding in both layouts and all float dtypes match the reference."""
    run_case(rng, x_shape=(2, 6, 5, 2), filt_hw=(3, 3), multiplier=3, strides=(1, 2), dilations=(2, 1),
             padding=padding, pads=pads, data_format=data_format, dtype=dtype)


def test_channel_multiplier_mapping():
    """filter[:, :, c, m] collects input channel c against out_backprop channel c*M+m only."""
    c_, m_ = 3, 2
    x = np.zeros((1, 2, 2, c_))
    x[..., 2] = 1.0
    x[..., 1] = 100.0  # channel 1 meets only out_backprop channels 2 and 3, which are zero
    dy = np.zeros((1, 2, 2, c_ * m_))
    dy[..., 5] = 1.0  # (c=2, m=1)
    got = gradops.depthwise_conv2d_native_backprop_filter(x, [1, 1, c_, m_], dy, [1, 1, 1, 1], "VALID")
    expected = np.zeros((1, 1, c_, m_))
    expected[0, 0, 2, 1] = 4.0  # four positions of 1 * 1
    np.testing.assert_array_equal(got, expected)


def test_golden_example():
    """A hand-computed 1-D-like case: 1x3 input, 1x2 filter, VALID, multiplier 1.

    forward: y0 = x0*w0 + x1*w1, y1 = x1*w0 + x2*w1, with x = [1, 2, 3] and dy = [1, 10]:
    dw0 = x0*dy0 + x1*dy1 = 1 + 20 = 21, dw1 = x1*dy0 + x2*dy1 = 2 + 30 = 32.
    """
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 1, 3, 1)
    dy = np.array([1.0, 10.0]).reshape(1, 1, 2, 1)
    got = gradops.depthwise_conv2d_native_backprop_filter(x, [1, 2, 1, 1], dy, [1, 1, 1, 1], "VALID")
    np.testing.assert_array_equal(got.ravel(), [21.0, 32.0])


# --------------------------------------------------------------------------- adjoint identity


@adjoint_grid
def test_adjoint_identity(rng, padding, pads, data_format):
    """<depthwise_conv2d_native(x, w), dy> == <w, backprop_filter(x, w.shape, dy)> in float64."""
    x = rng.standard_normal(to_format((2, 7, 6, 3), data_format))
    w = rng.standard_normal((3, 2, 3, 2))
    args = adjoint_args(padding, pads, data_format)
    y = gradops.depthwise_conv2d_native(x, w, **args)
    x_nhwc = x if data_format == "NHWC" else x.transpose(0, 2, 3, 1)
    ref_y = conv2d(x_nhwc, depthwise_to_hwio(w), (2, 1), padding, (1, 2), pads)
    assert_close(y, to_format(ref_y, data_format), np.float64)  # the forward op itself is right
    dy = rng.standard_normal(y.shape)
    dw = gradops.depthwise_conv2d_native_backprop_filter(x, np.array(w.shape), dy, **args)
    lhs, rhs = float(np.sum(y * dy)), float(np.sum(w * dw))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, float(np.sum(np.abs(y * dy))))


# --------------------------------------------------------------------------- hypothesis


@settings(max_examples=60, deadline=None)
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1))
def test_property_matches_reference(case, seed):
    """Random shapes, strides, dilations, paddings, layouts and dtypes all match the loop reference."""
    run_case(np.random.default_rng(seed), **case)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape,filter_sizes", [((0, 4, 4, 2), (3, 3, 2, 2)), ((1, 4, 4, 0), (3, 3, 0, 2)),
                                                  ((2, 4, 4, 2), (3, 3, 2, 0)), ((2, 4, 4, 2), (0, 3, 2, 2))],
                         ids=["batch0", "depth0", "multiplier0", "rows0"])
def test_empty_tensors(x_shape, filter_sizes, dtype):
    """Empty batch, depth, multiplier or filter gives zeros of filter_sizes in the input's dtype."""
    n, h, w, c = x_shape
    x = np.ones(x_shape, dtype)
    dy = np.ones((n, h, w, c * filter_sizes[3]), dtype)
    got = gradops.depthwise_conv2d_native_backprop_filter(x, list(filter_sizes), dy, [1, 1, 1, 1], "SAME")
    assert isinstance(got, np.ndarray)
    assert got.shape == filter_sizes and got.dtype == np.dtype(dtype)
    assert not np.any(got.astype(np.float64))


def test_nonfinite_values_stay_where_tf_puts_them():
    """An inf in the input reaches only the taps that read it (padded zeros are never multiplied)."""
    x = np.ones((1, 3, 3, 1))
    x[0, 0, 0, 0] = np.inf
    dy = np.ones((1, 3, 3, 1))
    got = gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 1, 1], dy, [1, 1, 1, 1], "SAME")
    ref, _ = expected_grad(x, (3, 3, 1, 1), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    np.testing.assert_array_equal(got, ref)
    assert not np.isnan(got).any()


def test_dilations_are_honoured(rng):
    """dilations [1,2,2,1] differ from [1,1,1,1] and match the dilated reference (TF ignores them)."""
    x = rng.standard_normal((1, 7, 7, 2))
    dy = rng.standard_normal((1, 7, 7, 4))
    plain = gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 2], dy, [1, 1, 1, 1], "SAME")
    dilated = gradops.depthwise_conv2d_native_backprop_filter(x, [3, 3, 2, 2], dy, [1, 1, 1, 1], "SAME",
                                                              dilations=[1, 2, 2, 1])
    assert not np.allclose(plain, dilated)
    ref, scale = expected_grad(x, (3, 3, 2, 2), dy, (1, 1), "SAME", (2, 2), NO_PADS)
    assert_close(dilated, ref, np.float64, scale)


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 3])
def test_numpy_batch_chunks_sum_in_a_fixed_order(rng, monkeypatch, multiplier, data_format):
    """The NumPy backend adds per-chunk partial gradients computed on its thread pool: with
    chunks of two images (the last one short) the result matches the reference, every image is
    in exactly one chunk, and the bits do not depend on the number of workers."""
    from gradops.backends import numpy_backend as nb
    kwargs, x, dy, sizes = make_case(rng, x_shape=(7, 6, 5, 3), filt_hw=(3, 2), multiplier=multiplier,
                                     strides=(2, 1), padding="SAME", data_format=data_format, dtype=np.float32)
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 2 * (x[0].nbytes + dy[0].nbytes))
    chunks = []
    sum_over_batch_chunks = nb._sum_over_batch_chunks
    monkeypatch.setattr(nb, "_sum_over_batch_chunks", lambda batch, item, result_bytes, partial: sum_over_batch_chunks(
        batch, item, result_bytes, lambda b: chunks.append((b.start, b.stop)) or partial(b)))
    results = []
    for workers in (1, 2, 3):
        monkeypatch.setattr(nb, "_WORKERS", workers)
        results.append(gradops.depthwise_conv2d_native_backprop_filter(**kwargs))
    assert sorted(chunks) == [(0, 2), (0, 2), (0, 2), (2, 4), (2, 4), (2, 4), (4, 6), (4, 6), (4, 6),
                              (6, 7), (6, 7), (6, 7)]
    ref, scale = expected_grad(x, sizes, dy, (2, 1), "SAME", (1, 1), NO_PADS)
    assert_close(results[0], ref, np.float32, scale)
    for got in results[1:]:
        np.testing.assert_array_equal(got, results[0])


def test_numpy_batch_chunks_grow_with_the_partial_results(monkeypatch):
    """Chunks hold at least as many operand bytes as one partial result, so the partial results
    held at once never outweigh the operands; they are added in batch order."""
    from gradops.backends import numpy_backend as nb
    monkeypatch.setattr(nb, "_CHUNK_BYTES", 1)
    for workers in (1, 2):
        monkeypatch.setattr(nb, "_WORKERS", workers)
        order = []
        total = nb._sum_over_batch_chunks(10, 100, 300, lambda b: order.append(b.start) or np.array([b.stop - b.start]))
        assert sorted(order) == [0, 3, 6, 9] and total.tolist() == [10]
        assert nb._sum_over_batch_chunks(10, 100, 1, lambda b: np.array([b.stop - b.start])).tolist() == [10]
        assert nb._sum_over_batch_chunks(1, 100, 10**9, lambda b: np.array([b.stop - b.start])).tolist() == [1]
        # float32 terms whose sum depends on the order; the first chunk finishes last
        terms = np.float32([1e8, 1, -1e8, 1])

        def partial(b):
            if b.start == 0:
                time.sleep(0.05)
            return terms[b.start:b.start + 1].copy()

        assert nb._sum_over_batch_chunks(4, 100, 4, partial).tolist() == [1.0]  # ((1e8 + 1) - 1e8) + 1


def test_keyword_arguments_with_tf_names(rng):
    """All arguments can be passed by TF's names, in any order, including explicit_paddings."""
    x = rng.standard_normal((1, 3, 4, 2)).astype(np.float32)
    dy = rng.standard_normal((1, 2, 4, 2)).astype(np.float32)
    got = gradops.depthwise_conv2d_native_backprop_filter(
        dilations=[1, 1, 1, 1], data_format="NCHW", explicit_paddings=[0, 0, 0, 0, 1, 0, 0, 1],
        padding="EXPLICIT", strides=[1, 1, 2, 1], out_backprop=dy.transpose(0, 3, 1, 2),
        input=x.transpose(0, 3, 1, 2), filter_sizes=np.array([2, 2, 2, 1], np.int32))
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == (2, 2, 2, 1)
    ref, scale = expected_grad(x, (2, 2, 2, 1), dy, (2, 1), "EXPLICIT", (1, 1), ((1, 0), (0, 1)))
    assert_close(got, ref, np.float32, scale)


@pytest.mark.parametrize("kwargs,word", [
    (dict(filter_sizes=[3, 3, 2]), "filter_sizes"),
    (dict(filter_sizes=[3, 3, 2, 2, 1]), "filter_sizes"),
    (dict(filter_sizes=[[3, 3, 2, 2]]), "filter_sizes"),
    (dict(filter_sizes=[3, -3, 2, 2]), "Dimension 1 of filter_sizes"),
    (dict(filter_sizes=[3, 3, 3, 2]), "in_depth"),
    (dict(filter_sizes=[3, 3, 2, 3]), "depth_multiplier"),
    (dict(input=np.zeros((2, 4, 4, 2))), "batch"),
    (dict(input=np.zeros((4, 4, 2))), "input"),
    (dict(strides=[2, 1, 1, 1]), "strides"),
    (dict(dilations=[1, 1, 1, 2]), "dilations"),
    (dict(padding="EXPLICIT"), "explicit_paddings"),
    (dict(padding="FULL"), "padding"),
    (dict(data_format="NCWH"), "data_format"),
    (dict(out_backprop=np.zeros((1, 3, 4, 4))), "rows"),
    (dict(input=np.zeros((1, 4, 4, 2), np.int32)), "input has dtype int32"),
], ids=["sizes_len3", "sizes_len5", "sizes_2d", "sizes_negative", "depth_mismatch", "multiplier_mismatch",
        "batch_mismatch", "input_rank", "batch_stride", "depth_dilation", "explicit_missing", "bad_padding",
        "bad_format", "bad_out_rows", "int_input"])
def test_invalid_arguments(kwargs, word):
    """Malformed calls raise InvalidArgumentError naming the offending argument."""
    args = dict(input=np.zeros((1, 4, 4, 2)), filter_sizes=[3, 3, 2, 2], out_backprop=np.zeros((1, 4, 4, 4)),
                strides=[1, 1, 1, 1], padding="SAME")
    args.update(kwargs)
    with pytest.raises(gradops.InvalidArgumentError, match=word):
        gradops.depthwise_conv2d_native_backprop_filter(**args)


@pytest.mark.parametrize("kwargs", [dict(filter_sizes=[3.0, 3.0, 2.0, 2.0]), dict(strides="1111")],
                         ids=["float_sizes", "string_strides"])
def test_type_errors(kwargs):
    """Wrongly typed arguments raise TypeError, as TF's type checks do."""
    args = dict(input=np.zeros((1, 4, 4, 2)), filter_sizes=[3, 3, 2, 2], out_backprop=np.zeros((1, 4, 4, 4)),
                strides=[1, 1, 1, 1], padding="SAME")
    args.update(kwargs)
    with pytest.raises(TypeError):
        gradops.depthwise_conv2d_native_backprop_filter(**args)


def test_mixed_dtypes_refused():
    """input and out_backprop must share one dtype (TF's T)."""
    with pytest.raises(gradops.InvalidArgumentError, match="dtype"):
        gradops.depthwise_conv2d_native_backprop_filter(np.zeros((1, 4, 4, 2), np.float32), [3, 3, 2, 2],
                                                        np.zeros((1, 4, 4, 4)), [1, 1, 1, 1], "SAME")


# --------------------------------------------------------------------------- TensorFlow parity


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 0), (2, 1)))],
                         ids=["SAME", "VALID", "EXPLICIT"])
@pytest.mark.parametrize("stride", [1, 2], ids=["s1", "s2"])
def test_matches_tensorflow(tf, rng, stride, padding, pads, dtype):
    """TF's DepthwiseConv2dNativeBackpropFilter (NHWC, equal strides, no dilation) agrees."""
    x_shape, multiplier = (2, 7, 6, 3), 2
    oh, ow = out_hw(x_shape[1:3], (3, 3), (stride, stride), (1, 1), padding, pads)
    x = random_array(rng, x_shape, dtype)
    dy = random_array(rng, (2, oh, ow, 3 * multiplier), dtype)
    sizes = (3, 3, 3, multiplier)
    args = dict(strides=[1, stride, stride, 1], padding=padding,
                explicit_paddings=explicit8(pads, "NHWC") if padding == "EXPLICIT" else [])
    tf_dtype = tf.bfloat16 if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16) else tf.as_dtype(dtype)
    expected = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
        input=tf.constant(x, tf_dtype), filter_sizes=tf.constant(sizes, tf.int32),
        out_backprop=tf.constant(dy, tf_dtype), **args).numpy()
    got = gradops.depthwise_conv2d_native_backprop_filter(x, np.array(sizes), dy, **args)
    assert got.dtype == np.dtype(dtype) and got.shape == sizes
    _, scale = expected_grad(x, sizes, dy, (stride, stride), padding, (1, 1), pads)
    # TF itself rounds (it may accumulate half types in half), so allow two roundings' worth.
    assert_close(got, expected.astype(np.float64), dtype, 2 * scale)


@pytest.mark.parametrize("kwargs", [dict(filter_sizes=[3, 3, 3, 2]), dict(filter_sizes=[3, 3, 2, 3]),
                                    dict(out_backprop=np.zeros((1, 3, 4, 4), np.float32)),
                                    dict(filter_sizes=[3, 3, 2])],
                         ids=["depth_mismatch", "multiplier_mismatch", "bad_out_rows", "sizes_len3"])
def test_tensorflow_refuses_the_same_calls(tf, kwargs):
    """Calls gradops refuses, TF refuses too (the validation is not stricter than the spec)."""
    args = dict(input=np.zeros((1, 4, 4, 2), np.float32), filter_sizes=[3, 3, 2, 2],
                out_backprop=np.zeros((1, 4, 4, 4), np.float32), strides=[1, 1, 1, 1], padding="SAME")
    args.update(kwargs)
    with pytest.raises(gradops.InvalidArgumentError):
        gradops.depthwise_conv2d_native_backprop_filter(**args)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=args["input"], filter_sizes=tf.constant(args["filter_sizes"], tf.int32),
            out_backprop=args["out_backprop"], strides=args["strides"], padding=args["padding"])


# --------------------------------------------------------------------------- CUDA kernel
#
# The kernel source runs on the CPU through tests/cuda_host.py (the "host" / "cuda-host"
# fixture cases, everywhere) and, marked gpu, through CuPy on a GPU.

import importlib  # noqa: E402

from conftest import misaligned_on_gpu, to_gpu, to_host  # noqa: E402
from gradops._geometry import conv2d_geometry  # noqa: E402

cuda_launcher = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")

CUDA_GEOMETRIES = [  # (filt_hw, strides, dilations)
    ((3, 3), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)), ((5, 5), (1, 1), (1, 1)), ((3, 3), (1, 1), (2, 2)),
    ((5, 5), (2, 2), (2, 1)), ((3, 3), (1, 2), (1, 1)), ((3, 2), (2, 3), (2, 1)), ((1, 1), (3, 2), (1, 1)),
    ((7, 1), (1, 1), (1, 1)),
]
CUDA_GEOMETRY_IDS = [f"f{f[0]}x{f[1]}-s{s[0]}x{s[1]}-d{d[0]}x{d[1]}" for f, s, d in CUDA_GEOMETRIES]
CUDA_PADDINGS = [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3))), ("EXPLICIT", ((0, 5), (4, 0)))]
CUDA_PADDING_IDS = ["SAME", "VALID", "EXPLICIT", "EXPLICIT_wide"]
CUDA_X_SHAPE = (2, 11, 10, 2)


def geometry_of(kwargs):
    """The validated geometry of a make_case call (what the launcher receives)."""
    return conv2d_geometry(OP, kwargs["input"].shape, tuple(kwargs["filter_sizes"]), kwargs["out_backprop"].shape,
                           kwargs["strides"], kwargs["padding"], kwargs["explicit_paddings"],
                           kwargs["data_format"], kwargs["dilations"], depthwise=True)


def check_cuda(kwargs, x, dy, case, backend="cuda", **launcher_kw):
    """The GPU result (public API, or the launcher with ``launcher_kw`` forced) has the right
    type, shape and dtype and matches the loops and the NumPy backend."""
    import cupy

    dtype = np.dtype(kwargs["input"].dtype)
    gpu = dict(kwargs, input=to_gpu(kwargs["input"]), out_backprop=to_gpu(kwargs["out_backprop"]))
    if launcher_kw:
        got = cuda_launcher.depthwise_conv2d_native_backprop_filter(geometry_of(kwargs), gpu["input"],
                                                                    gpu["out_backprop"], **launcher_kw)
    else:
        got = gradops.depthwise_conv2d_native_backprop_filter(**gpu, backend=backend)
    assert isinstance(got, cupy.ndarray)
    sizes = tuple(int(v) for v in kwargs["filter_sizes"])
    assert got.dtype == dtype and got.shape == sizes
    got = to_host(got)
    ref, scale = expected_grad(x, sizes, dy, case["strides"], case["padding"], case["dilations"], case["pads"])
    assert_close(got, ref, dtype, scale)
    numpy_result = gradops.depthwise_conv2d_native_backprop_filter(**kwargs, backend="numpy")
    assert_close(got, numpy_result, dtype, 2 * scale)  # two roundings: each side's own
    return got


def cuda_case(rng, **case):
    case = dict(dict(strides=(1, 1), dilations=(1, 1), padding="VALID", pads=NO_PADS), **case)
    kwargs, x, dy, _ = make_case(rng, **case)
    return kwargs, x, dy, case


#: The filter gradient's kernels, each forced through the launcher (None: its own choice), with
#: the layouts and dtypes it takes: the tiled kernels NHWC, the planes kernel NCHW, the tensor
#: cores half types.
RACECHECK_PATHS = {"auto": (None, ("NHWC", "NCHW"), (np.float16, np.float32)),
                   "per-element": (dict(tiled=False), ("NHWC", "NCHW"), (np.float16, np.float32)),
                   "tiled": (dict(tiled=True), ("NHWC",), (np.float16, np.float32)),
                   "tiled-async": (dict(tiled=True, async_copies=True), ("NHWC",), (np.float16, np.float32)),
                   "planes": (dict(planes=True), ("NCHW",), (np.float16, np.float32)),
                   "mma": (dict(mma=True), ("NHWC", "NCHW"), (np.float16,))}


@pytest.mark.parametrize("capped", [False, True], ids=["grid", "capped-grid"])
@pytest.mark.parametrize("path,data_format,dtype", [
    (path, data_format, dtype) for path, (_, layouts, dtypes) in RACECHECK_PATHS.items() for data_format in layouts
    for dtype in dtypes], ids=lambda v: np.dtype(v).name if isinstance(v, type) else str(v))
def test_cuda_racecheck(racecheck_device, rng, path, data_format, dtype, capped):
    """No shared-memory hazard in any kernel (racecheck builds on the host, which fail a launch
    at the first one), with the launcher's grid and with grids capped to one block a dimension,
    so that blocks loop over units and slices.  A forced kernel that cannot run a case (a
    stride or multiplier it does not take) skips that case, and runs at least one."""
    import contextlib

    import cuda_host

    forced = RACECHECK_PATHS[path][0] or {}
    ran = 0
    with cuda_host.capped_grids() if capped else contextlib.nullcontext():
        for shape, filt, strides, multiplier in (((2, 14, 13, 16), 3, (1, 1), 1), ((3, 14, 14, 16), 5, (1, 1), 2),
                                                 ((2, 13, 12, 8), 3, (2, 2), 2), ((2, 7, 7, 16), 5, (1, 1), 1)):
            kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=multiplier,
                                            strides=strides, padding="SAME", data_format=data_format, dtype=dtype)
            try:
                check_cuda(kwargs, x, dy, case, **forced)
            except ValueError as error:
                if not forced or not ("cannot run" in str(error) or "needs" in str(error)):
                    raise
                continue
            ran += 1
    assert ran >= (4 if not forced else 1), f"{path} ran {ran} of the 4 cases"


#: The kernels on tiny maps, forced as in RACECHECK_PATHS, with the layouts and dtypes each
#: takes (the planes kernel's pairs: half types and float), and with a fused and an unfused
#: reduction of several slices.
HALVES, FLOATS = tuple(FLOAT_DTYPES[:2]), tuple(FLOAT_DTYPES)
TINY_PATHS = {"auto": (None, ("NHWC", "NCHW"), FLOATS),
              "per-element": (dict(tiled=False), ("NHWC", "NCHW"), FLOATS),
              "per-element-64": (dict(tiled=False, index_bits=64), ("NHWC", "NCHW"), FLOATS),
              "tiled": (dict(tiled=True), ("NHWC",), FLOATS), "tiled-staged": (dict(tiled=True, staging=1), ("NHWC",), FLOATS),
              "tiled-async": (dict(tiled=True, async_copies=True), ("NHWC",), FLOATS),
              "planes": (dict(planes=True), ("NCHW",), FLOATS),
              "planes-pairs": (dict(planes=True, pairs=True), ("NCHW",), HALVES + (np.float32,)),
              "mma": (dict(mma=True), ("NHWC", "NCHW"), HALVES),
              "slices-fused": (dict(slices=3, fused=True), ("NHWC", "NCHW"), FLOATS),
              "slices-unfused": (dict(slices=3, fused=False), ("NHWC", "NCHW"), FLOATS)}
#: Maps of 1-7 rows and columns, 1-16 channels (x_shape NHWC, filt_hw, strides, multiplier):
#: rows shorter than a kernel's vectors, chunks or tiles, where a load that is right on larger
#: maps reaches past a tensor's end.
TINY_MAPS = (((1, 1, 1, 1), (3, 3), (1, 1), 1), ((2, 1, 3, 3), (3, 3), (2, 2), 2), ((1, 3, 2, 5), (5, 5), (1, 1), 1),
             ((1, 2, 5, 8), (5, 5), (2, 2), 1), ((1, 5, 1, 2), (3, 3), (1, 1), 2), ((3, 4, 3, 16), (3, 3), (2, 2), 1),
             ((1, 3, 3, 1), (1, 1), (1, 1), 1), ((2, 2, 7, 4), (3, 3), (2, 1), 1), ((1, 7, 2, 8), (3, 3), (1, 1), 1),
             ((2, 3, 4, 2), (3, 3), (1, 1), 1), ((1, 3, 2, 16), (3, 3), (1, 1), 1), ((2, 1, 3, 8), (5, 5), (1, 1), 2))


@pytest.mark.parametrize("path,data_format,dtype", [
    (path, data_format, dtype) for path, (_, layouts, dtypes) in TINY_PATHS.items() for data_format in layouts
    for dtype in dtypes], ids=lambda v: np.dtype(v).name if isinstance(v, type) else str(v))
def test_cuda_tiny_maps_memcheck(racecheck_device, rng, path, data_format, dtype):
    """Every kernel on tiny maps, in racecheck builds: no access outside input, out_backprop, the
    partial sums or the gradient (the guard bytes around each array), no shared-memory hazard,
    right results.  A forced kernel that cannot run a case (a stride, multiplier or odd in_cols
    it does not take) skips that case, and runs at least two."""
    forced = TINY_PATHS[path][0] or {}

    def run(tiny_map):
        x_shape, filt_hw, strides, multiplier = tiny_map
        kwargs, x, dy, case = cuda_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                                        strides=strides, padding="SAME", data_format=data_format, dtype=dtype)
        check_cuda(kwargs, x, dy, case, **forced)

    run_forced_cases(path, TINY_MAPS, forced, run, least=2)


def test_instantiations_cover_every_launch():
    """Every dtype x layout x index width of the partial kernel, and every dtype's reduction."""
    from gradops.backends.cuda import _build

    listed = set(cuda_launcher.instantiations()[cuda_launcher.SOURCE])
    # Per dtype: partial (2 layouts x 2 index widths), reduce, tiled (2 x 2 x 2), planes (2 x 2
    # x its window forms: 3 (half types 6), or 1 for double); per half type the tensor-core kernel (2 filters x
    # 2 multipliers x 3 staging chunks) and its NHWC form (2 filters x 2 multipliers x tiled or
    # packed).
    # Asynchronous tiled forms: every half type's 8, float32's and float64's 3x3 ones (4 each).
    # Planes: 3 pair forms for half types and float, and half types' 3 lane-block forms.
    planes = 2 * 2 * (3 * 3 + 2 * 3 + 1)
    assert len(listed) == (4 * (2 * 2 + 1 + 2 * 2 * 2) + planes + 2 * 2 * 2 * 3 + 2 * 2 * 2 * 2
                           + 2 * 8 + 2 * 4)
    assert len(cuda_launcher.instantiations(75)[cuda_launcher.SOURCE]) == 4 * (2 * 2 + 1 + 2 * 2 * 2) + planes
    for dtype in (np.float16, ml_dtypes.bfloat16):
        for k in (3, 5):
            for m in (1, 2):
                for chunk in (1, 2, 4):
                    assert cuda_launcher._mma_expression(np.dtype(dtype), k, m, chunk) in listed
                for packed in (False, True):
                    assert cuda_launcher._mma_nhwc_expression(np.dtype(dtype), k, m, packed) in listed
    for dtype in FLOAT_DTYPES:
        assert cuda_launcher._reduce_expression(dtype) in listed
        for k in (3, 5):
            for s in (1, 2):
                for form in cuda_launcher.planes_window_forms(dtype):
                    assert cuda_launcher._planes_expression(dtype, k, s, form) in listed
                for c in (2, 4):
                    assert cuda_launcher._tiled_expression(dtype, k, s, c) in listed
        for data_format in ("NHWC", "NCHW"):
            for bits in (32, 64):
                assert cuda_launcher._partial_expression(dtype, data_format, bits) in listed
    assert cuda_launcher.__name__ in _build.LAUNCHERS
    assert set(listed) <= set(_build.all_instantiations()[cuda_launcher.SOURCE])


def test_slicing_is_a_function_of_the_geometry():
    """Slices cover every (batch, out_row) once, none empty, about TARGET_PARTIALS partial sums."""
    for batch, rows, channels, filt in ((1, 1, 1, 1), (8, 56, 32, 3), (128, 112, 32, 3), (2, 5, 1024, 5),
                                        (1, 300, 4096, 7)):
        g = conv2d_geometry(OP, (batch, rows, rows, channels), (filt, filt, channels, 1),
                            (batch, rows, rows, channels), [1, 1, 1, 1], "SAME", [], "NHWC", [1, 1, 1, 1],
                            depthwise=True)
        slices, per = cuda_launcher.slicing(g)
        assert slices >= 1 and per >= 1
        assert (slices - 1) * per < batch * rows <= slices * per
        assert slices * filt * filt * channels <= max(cuda_launcher.TARGET_PARTIALS, filt * filt * channels)


def test_32_bit_indices_only_where_they_fit():
    def geometry(x_shape, multiplier=1, pads=None):
        n, h, w, c = x_shape
        padding, explicit = ("EXPLICIT", [0, 0, *pads, 0, 0]) if pads else ("SAME", [])
        oh = h + (sum(pads[:2]) - 2 if pads else 0)
        ow = w + (sum(pads[2:]) - 2 if pads else 0)
        return conv2d_geometry(OP, x_shape, (3, 3, c, multiplier), (n, oh, ow, c * multiplier), [1, 1, 1, 1],
                               padding, explicit, "NHWC", [1, 1, 1, 1], depthwise=True)

    assert cuda_launcher.fits_int32(geometry((1, 46340, 46340, 1)), 1, 256)
    assert not cuda_launcher.fits_int32(geometry((1, 46341, 46500, 1)), 1, 256)
    assert not cuda_launcher.fits_int32(geometry((1, 1024, 1024, 1024), 2), 1, 256)  # out_backprop 2**31
    assert not cuda_launcher.fits_int32(geometry((1, 4, 4, 1), pads=[2**31, 0, 0, 0]), 1, 256)  # padded rows


@pytest.mark.slow
def test_host_input_of_more_than_2_31_elements(monkeypatch):
    """The kernel source's 64-bit offsets, executed on the CPU through the launcher: a float16
    input of 46500 x 46341 = 2**31 + 7372852 elements, 3x3 VALID stride 2.  Only the block of
    the partial-sum launch that computes the last partial sum runs (and the reduction's last
    block): its partial sums include the last slices, whose input rows lie past the 2**31-th
    element; each is checked against a NumPy sum over its slice."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    total = {}  # the partial-sum launch's element count, known once the geometry is

    def block_filter(expression, grid):
        if "_partial<" in expression:  # the block whose grid-stride walk ends at the last element
            return [((total["partial"] - 1) % (grid[0] * _runtime.BLOCK_1D)) // _runtime.BLOCK_1D]
        return [grid[0] - 1]

    device = cuda_host.HostDevice(block_filter=block_filter).install(monkeypatch)
    import cupy  # the HostDevice stand-in

    from gradops.backends.cuda import _runtime

    launches = []
    launch_1d = _runtime.launch_1d
    monkeypatch.setattr(_runtime, "launch_1d", lambda fn, total, args, **kw: (launches.append((total, args)),
                                                                              launch_1d(fn, total, args, **kw)))
    rows, cols = 46500, 46341
    assert rows * cols > 2**31
    x_shape = (1, rows, cols, 1)
    # Exact float16 values (integers below 2**11 over 512), filled in place in slices: no 4 GB copy.
    x = cupy.empty(x_shape, np.float16)
    x_flat = x.reshape(-1)
    for start in range(0, rows * cols, 1 << 26):
        index = np.arange(start, min(rows * cols, start + (1 << 26)), dtype=np.int64)
        x_flat[start:start + index.size] = ((index * 7919) % 2003 - 1001) / 512
    out_rows, out_cols = (rows - 3) // 2 + 1, (cols - 3) // 2 + 1
    dy = np.random.default_rng(5).integers(-64, 64, (1, out_rows, out_cols, 1)).astype(np.float16) / 64
    dy_gpu = cupy.asarray(dy)
    kwargs = dict(input=x, filter_sizes=np.array([3, 3, 1, 1]), out_backprop=dy_gpu, strides=[1, 2, 2, 1],
                  padding="VALID", explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1])
    g = geometry_of(kwargs)
    slices, rows_per_slice = cuda_launcher.slicing(g)
    # threads: one per (slice, tap, lane of a 32-lane channel group); one channel, so lane 0 of
    # each (slice, tap) computes partial sum slice * 9 + tap and the others idle
    total["partial"] = cuda_launcher.partial_threads(g, slices)
    assert total["partial"] == slices * 9 * 32
    cuda_launcher.depthwise_conv2d_native_backprop_filter(g, x, dy_gpu)
    expression, grid, block = next(launch for launch in device.launches if "_partial<" in launch[0])
    assert expression.endswith(", long long>")  # the 64-bit variant
    count, args = launches[0]
    assert count == total["partial"]
    partial = np.asarray(device._view(int(args[2]), (slices * 9,), np.float32, None))  # the float32 partial sums
    run = block_filter(expression, grid)[0]
    starts = np.arange(run * block[0], count, block[0] * grid[0])
    threads = (starts[:, None] + np.arange(block[0])[None, :]).reshape(-1)
    threads = threads[(threads < count) & (threads % 32 == 0)]
    written = threads // 32
    assert written.size > 3 and written[-1] == slices * 9 - 1
    deepest = 0
    for e in written:
        slice_, tap = divmod(int(e), 9)
        r, s = divmod(tap, 3)
        p = np.arange(slice_ * rows_per_slice, min(out_rows, (slice_ + 1) * rows_per_slice))
        h = 2 * p + r
        deepest = max(deepest, int(h[-1]) * cols + 2 * (out_cols - 1) + s)
        inputs = np.stack([x_flat[int(row) * cols + s:int(row) * cols + s + 2 * out_cols - 1:2] for row in h])
        terms = inputs.astype(np.float64) * dy[0, p, :, 0].astype(np.float64)
        expected, magnitude = terms.sum(), np.abs(terms).sum()
        assert abs(float(partial[e]) - expected) <= 1e-6 * max(1.0, magnitude), (slice_, tap)
    assert deepest > 2**31 + 7_000_000  # the sums read input elements far past the 2**31-th


@pytest.mark.parametrize("padding,pads", CUDA_PADDINGS, ids=CUDA_PADDING_IDS)
@pytest.mark.parametrize("filt_hw,strides,dilations", CUDA_GEOMETRIES, ids=CUDA_GEOMETRY_IDS)
def test_cuda_geometry_grid(cuda_device, rng, filt_hw, strides, dilations, padding, pads):
    """Filter sizes, strides (unequal too), dilations and paddings, both layouts, float64."""
    for data_format in ("NHWC", "NCHW"):
        kwargs, x, dy, case = cuda_case(rng, x_shape=CUDA_X_SHAPE, filt_hw=filt_hw, multiplier=2, strides=strides,
                                        dilations=dilations, padding=padding, pads=pads, data_format=data_format)
        check_cuda(kwargs, x, dy, case)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3], ids=lambda m: f"M{m}")
def test_cuda_multiplier_format_dtype_grid(cuda_device, rng, multiplier, data_format, dtype):
    """Multipliers 1-3, both layouts, all element types (accumulating in float for half types)."""
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 7, 6, 3), filt_hw=(3, 2), multiplier=multiplier,
                                    strides=(2, 1), dilations=(1, 2), padding="SAME", data_format=data_format,
                                    dtype=dtype)
    check_cuda(kwargs, x, dy, case)


@pytest.mark.parametrize("slices", [1, 2, 3, 7, 1000], ids=lambda s: f"slices{s}")
@pytest.mark.parametrize("index_bits", [32, 64])
def test_cuda_slices_and_index_widths(cuda_device, rng, slices, index_bits):
    """Every slice count (one slice, uneven runs, one row per slice) and both index widths."""
    for data_format in ("NHWC", "NCHW"):
        kwargs, x, dy, case = cuda_case(rng, x_shape=(3, 9, 8, 2), filt_hw=(3, 3), multiplier=2, strides=(2, 1),
                                        padding="SAME", data_format=data_format)
        check_cuda(kwargs, x, dy, case, slices=slices, index_bits=index_bits)


# ---- the tiled kernel (NHWC, 3x3 / 5x5 at stride 1 / 2, no dilation)

TILED_SHAPES = [(k, s, c) for k in (3, 5) for s in (1, 2) for c in (2, 4)]


def test_tiled_kernel_is_picked_where_it_runs():
    """NHWC 3x3 / 5x5 at equal strides 1 / 2 without dilation takes the tiled kernel; NCHW,
    other filters, unequal strides, dilations do not; the tile width covers narrow maps with
    fewer positions."""
    def geometry(x_shape=(2, 14, 14, 32), filt=3, strides=(1, 1), dilations=(1, 1), data_format="NHWC"):
        n, h, w, c = x_shape
        x = x_shape if data_format == "NHWC" else (n, c, h, w)
        oh, ow = -(-h // strides[0]), -(-w // strides[1])
        dy = (n, oh, ow, c) if data_format == "NHWC" else (n, c, oh, ow)
        return conv2d_geometry(OP, x, (filt, filt, c, 1), dy, attr4(*strides, data_format), "SAME", [],
                               data_format, attr4(*dilations, data_format), depthwise=True)

    for filt in (3, 5):
        for stride in (1, 2):
            assert cuda_launcher.tiled_eligible(geometry(filt=filt, strides=(stride, stride)), np.float16)
    for g in (geometry(data_format="NCHW"), geometry(filt=7), geometry(strides=(1, 2)),
              geometry(dilations=(2, 2)), geometry(filt=1)):
        assert not cuda_launcher.tiled_eligible(g, np.float32)
    assert cuda_launcher.pick_items_across(geometry((1, 7, 7, 8))) == 2  # 8 x 8 tiles: one for 7 x 7
    assert cuda_launcher.pick_items_across(geometry((1, 56, 56, 8))) == 2  # 16 columns: 3.5 tiles across
    assert cuda_launcher.pick_items_across(geometry((1, 112, 112, 8))) == 4  # both exact: the wider
    assert cuda_launcher.pick_items_across(geometry((1, 64, 64, 8), strides=(2, 2))) == 4
    with pytest.raises(ValueError, match="tiled"):
        cuda_launcher.pick_tiled(geometry(data_format="NCHW"), np.float32, True)


def test_tiled_slicing_is_a_function_of_the_geometry():
    """Slices cover every tile once, none empty, about TILED_TARGET_CTAS CTAs, and at least
    TILED_MIN_UNITS tiles per slice where there are that many."""
    for batch, size, channels, stride in ((1, 1, 1, 1), (32, 112, 32, 1), (32, 14, 576, 1), (2, 5, 1024, 2),
                                          (128, 56, 144, 2), (3, 9, 40, 1)):
        g = conv2d_geometry(OP, (batch, size, size, channels), (3, 3, channels, 1),
                            (batch, -(-size // stride), -(-size // stride), channels), attr4(stride, stride, "NHWC"),
                            "SAME", [], "NHWC", [1, 1, 1, 1], depthwise=True)
        for dtype in (np.float32, np.float64):
            c = cuda_launcher.pick_items_across(g)
            down, across = cuda_launcher.tile_counts(g, c)
            units = batch * down * across
            slices, per = cuda_launcher.tiled_slicing(g, dtype, c)
            assert slices >= 1 and per >= 1 and (slices - 1) * per < units <= slices * per
            blocks = -(-channels // cuda_launcher.tiled_channels(dtype))
            assert per >= min(units, cuda_launcher.TILED_MIN_UNITS)
            assert blocks * slices < cuda_launcher.TILED_TARGET_CTAS + blocks


@pytest.mark.parametrize("filt,stride,items_across", TILED_SHAPES, ids=[f"f{k}-s{s}-c{c}" for k, s, c in TILED_SHAPES])
def test_cuda_tiled_shapes(cuda_device, rng, filt, stride, items_across):
    """Every specialisation and tile width: SAME, VALID and asymmetric EXPLICIT padding, maps
    that end inside a tile, multipliers 1 and 2 staged with 16-byte loads and 3 one element
    at a time, 40 float channels (a full block of 32 and one of 8), float64 (blocks of 16);
    slices of 1, 2 and 3 tiles (the last one short)."""
    paddings = [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3)))]
    for i, (padding, pads) in enumerate(paddings):
        for multiplier, channels, dtype in ((1, 40, np.float32), (2, 8, np.float16), (3, 3, np.float64)):
            kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 11 + i, 13 + 3 * i, channels), filt_hw=(filt, filt),
                                            multiplier=multiplier, strides=(stride, stride), padding=padding,
                                            pads=pads, dtype=dtype)
            check_cuda(kwargs, x, dy, case, tiled=True, items_across=items_across, units_per_slice=1 + i)


def brute_idle_warps(g, items_across: int, columns: bool) -> int:
    """Warps of one image's tiles whose two work items lie wholly past the output, by walking
    every warp of every tile (the kernel's item numbering: ``columns_per_warp``)."""
    item_rows, item_cols = cuda_launcher.item_shape(g)
    rows, cols = cuda_launcher.tile_shape(g, items_across)
    down, across = cuda_launcher.tile_counts(g, items_across)
    items_down = cuda_launcher.TILED_ITEMS // items_across
    idle = 0
    for tile_row in range(down):
        for tile_col in range(across):
            for warp in range(cuda_launcher.TILED_ITEMS // 2):
                inside = []
                for item in (2 * warp, 2 * warp + 1):
                    r, c = (item % items_down, item // items_down) if columns else divmod(item, items_across)
                    inside.append(tile_row * rows + r * item_rows < g.out_rows
                                  and tile_col * cols + c * item_cols < g.out_cols)
                idle += not any(inside)
    return idle


def test_tiled_idle_warps_match_the_tiles():
    """The closed form of idle warps agrees with a walk over every warp, for every tile width,
    both pairings, both strides and output maps of 1 to 40 rows and columns; the kernel's pairing
    is the one that idles more warps (side by side on a tie)."""
    for stride in (1, 2):
        for out_rows in range(1, 41, 3):
            for out_cols in range(1, 41, 2):
                g = conv2d_geometry(OP, (1, out_rows * stride, out_cols * stride, 8), (3, 3, 8, 1),
                                    (1, out_rows, out_cols, 8), attr4(stride, stride, "NHWC"), "SAME", [], "NHWC",
                                    [1, 1, 1, 1], depthwise=True)
                for c in cuda_launcher.TILED_ITEMS_ACROSS:
                    idle = [cuda_launcher.tiled_idle_warps(g, c, columns) for columns in (False, True)]
                    assert idle == [brute_idle_warps(g, c, columns) for columns in (False, True)], (g, c)
                    assert cuda_launcher.tiled_columns_per_warp(g, c) == (idle[1] > idle[0])


@pytest.mark.parametrize("filt,stride,items_across", TILED_SHAPES, ids=[f"f{k}-s{s}-c{c}" for k, s, c in TILED_SHAPES])
def test_cuda_tiled_warp_pairings(cuda_device, rng, filt, stride, items_across):
    """Both ways of pairing a warp's work items give the loops' sums on maps whose last tile
    row and column hold items partly inside the output and items wholly past it (which skip the
    sums), with an Inf in the input there (the checked loop)."""
    out_rows, out_cols = (9, 11) if items_across == 2 else (5, 21)
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, out_rows * stride, out_cols * stride, 6), filt_hw=(filt, filt),
                                    multiplier=1, strides=(stride, stride), padding="SAME", dtype=np.float32)
    g = geometry_of(kwargs)
    assert (g.out_rows, g.out_cols) == (out_rows, out_cols)
    assert min(cuda_launcher.tiled_idle_warps(g, items_across, columns) for columns in (False, True)) > 0
    for columns in (False, True):
        check_cuda(kwargs, x, dy, case, tiled=True, items_across=items_across, columns_per_warp=columns)
    x = x.copy()
    x[1, -1, -1, 2] = np.inf
    want, _ = expected_grad(x, (filt, filt, 6, 1), dy, (stride, stride), "SAME", (1, 1), NO_PADS)
    assert np.isinf(want).any() or np.isnan(want).any()
    for columns in (False, True):
        got = cuda_launcher.depthwise_conv2d_native_backprop_filter(
            g, to_gpu(x.astype(np.float32)), to_gpu(kwargs["out_backprop"]), tiled=True, items_across=items_across,
            columns_per_warp=columns)
        assert_same_nonfinite_and_close(to_host(got), want)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("multiplier", [1, 2], ids=lambda m: f"M{m}")
def test_cuda_tiled_staging_modes(cuda_device, rng, multiplier, dtype):
    """16-byte staging (in_depth a multiple of 16 / itemsize) and element staging of the same
    call agree with the loops, and out_backprop lanes read in one load or per channel."""
    channels = 16 // np.dtype(dtype).itemsize * 2
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 9, 10, channels), filt_hw=(3, 3), multiplier=multiplier,
                                    padding="SAME", dtype=dtype)
    g = geometry_of(kwargs)
    assert cuda_launcher.staging_mode(g, dtype, to_gpu(kwargs["input"])) == multiplier
    vector = check_cuda(kwargs, x, dy, case, tiled=True)
    element = check_cuda(kwargs, x, dy, case, tiled=True, staging=0)
    assert vector.tobytes() == element.tobytes()  # the same sums in the same order


ASYNC_SHAPES = [(k, s, c, dtype) for dtype in FLOAT_DTYPES for k, s, c in TILED_SHAPES
                if cuda_launcher.async_compiled(np.dtype(dtype), k, s, c)]


@pytest.mark.parametrize("filt,stride,items_across,dtype", ASYNC_SHAPES,
                         ids=[f"f{k}-s{s}-c{c}-{np.dtype(d).name}" for k, s, c, d in ASYNC_SHAPES])
def test_cuda_tiled_async_staging(cuda_device, rng, filt, stride, items_across, dtype):
    """Asynchronous staging (cp.async copies of the next unit while the CTA sums this one) gives
    bitwise the synchronous staging's sums, which match the loops: SAME, VALID and asymmetric
    EXPLICIT padding, maps ending inside a tile, multipliers 1 and 2, channels past a full
    block, slices of 1 to 3 tiles (every unit but a slice's first is copied during its
    predecessor's sums), and an Inf in the input (the checked second pass copies its units
    again)."""
    vec = 16 // np.dtype(dtype).itemsize
    paddings = [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3)))]
    for i, (padding, pads) in enumerate(paddings):
        for multiplier in (1, 2):
            channels = cuda_launcher.tiled_channels(dtype) // multiplier + vec
            kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 11 + i, 13 + 3 * i, channels), filt_hw=(filt, filt),
                                            multiplier=multiplier, strides=(stride, stride), padding=padding,
                                            pads=pads, dtype=dtype)
            g = geometry_of(kwargs)
            assert cuda_launcher.async_possible(g, np.dtype(dtype), to_gpu(kwargs["input"]),
                                                to_gpu(kwargs["out_backprop"]), items_across)
            forced = dict(tiled=True, items_across=items_across, units_per_slice=1 + i)
            copied = check_cuda(kwargs, x, dy, case, async_copies=True, **forced)
            loaded = check_cuda(kwargs, x, dy, case, async_copies=False, **forced)
            assert copied.tobytes() == loaded.tobytes()
    x = x.copy()
    x[1, -1, 0, 1] = np.inf
    want, _ = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (stride, stride), padding, (1, 1), pads)
    assert not np.isfinite(want).all()
    got = [to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(
        geometry_of(kwargs), to_gpu(x), to_gpu(kwargs["out_backprop"]), async_copies=copies, **forced))
        for copies in (True, False)]
    assert got[0].tobytes() == got[1].tobytes()
    finite = np.isfinite(want)
    np.testing.assert_array_equal(np.isnan(got[0]), np.isnan(want))
    assert_close(got[0][finite], want[finite], dtype, max(1.0, float(np.abs(want[finite]).max())))


def test_async_staging_is_opt_in_and_checked(cuda_device, rng, monkeypatch):
    """The launcher never stages asynchronously by itself (ASYNC_BY_DEFAULT), and forcing it is
    refused where it cannot run: element staging, a misaligned out_backprop, a specialisation
    without an asynchronous form, a GPU before sm_80."""
    assert not cuda_launcher.ASYNC_BY_DEFAULT
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 9, 10, 8), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                    dtype=np.float32)
    g = geometry_of(kwargs)
    gx, gdy = to_gpu(kwargs["input"]), to_gpu(kwargs["out_backprop"])
    assert cuda_launcher.async_possible(g, np.dtype(np.float32), gx, gdy, 4)
    with pytest.raises(ValueError, match="asynchronous staging"):
        cuda_launcher.depthwise_conv2d_native_backprop_filter(g, gx, gdy, tiled=True, staging=0, async_copies=True)
    assert not cuda_launcher.async_possible(g, np.dtype(np.float32), gx, misaligned_on_gpu(kwargs["out_backprop"]), 4)
    with pytest.raises(ValueError, match="asynchronous staging"):
        cuda_launcher.depthwise_conv2d_native_backprop_filter(g, gx, misaligned_on_gpu(kwargs["out_backprop"]),
                                                              tiled=True, async_copies=True)
    five = cuda_case(rng, x_shape=(2, 9, 10, 8), filt_hw=(5, 5), multiplier=1, padding="SAME", dtype=np.float32)[0]
    assert not cuda_launcher.async_compiled(np.dtype(np.float32), 5, 1, 4)
    with pytest.raises(ValueError, match="asynchronous staging"):
        cuda_launcher.depthwise_conv2d_native_backprop_filter(geometry_of(five), to_gpu(five["input"]),
                                                              to_gpu(five["out_backprop"]), tiled=True,
                                                              async_copies=True)
    monkeypatch.setattr(cuda_launcher._runtime, "compute_capability", lambda: 75)
    assert not cuda_launcher.async_possible(g, np.dtype(np.float32), gx, gdy, 4)


def test_cuda_tiled_nonfinite_values_meet_no_padding(cuda_device):
    """Inf and NaN reach exactly the taps TF's loops give them: an Inf next to the padding, a
    NaN in out_backprop at the image corner (where padded zeros would make NaN of every tap)
    and an Inf in an input column no output reads (VALID, stride 2)."""
    x = np.ones((1, 9, 10, 2), np.float32)
    x[0, 0, 3, 0] = np.inf
    x[0, 4, 9, 1] = np.inf  # column 9: VALID 3x3 stride 2 reads columns 0..8 only
    for strides, padding in (((1, 1), "SAME"), ((2, 2), "VALID"), ((2, 2), "SAME")):
        oh = x.shape[1] // strides[0] if padding == "SAME" else (x.shape[1] - 3) // strides[0] + 1
        ow = -(-x.shape[2] // strides[1]) if padding == "SAME" else (x.shape[2] - 3) // strides[1] + 1
        oh = -(-x.shape[1] // strides[0]) if padding == "SAME" else oh
        dy = np.ones((1, oh, ow, 2), np.float32)
        dy[0, 0, 0, 1] = np.nan
        got = gradops.depthwise_conv2d_native_backprop_filter(to_gpu(x), [3, 3, 2, 1], to_gpu(dy),
                                                              [1, *strides, 1], padding, backend="cuda")
        ref, _ = expected_grad(x.astype(np.float64), (3, 3, 2, 1), dy.astype(np.float64), strides, padding, (1, 1),
                               NO_PADS)
        np.testing.assert_array_equal(np.isnan(to_host(got)), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(to_host(got)), np.isinf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(to_host(got)[finite], ref[finite], rtol=1e-6)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1), slices=st.integers(1, 9))
def test_cuda_property(cuda_device, case, seed, slices):
    """Random shapes, strides, dilations, paddings, layouts, dtypes and slice counts."""
    kwargs, x, dy, case = cuda_case(np.random.default_rng(seed), **case)
    check_cuda(kwargs, x, dy, case, slices=slices)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape,filter_sizes", [((0, 4, 4, 2), (3, 3, 2, 2)), ((1, 4, 4, 0), (3, 3, 0, 2)),
                                                  ((2, 4, 4, 2), (3, 3, 2, 0)), ((2, 4, 4, 2), (0, 3, 2, 2))],
                         ids=["batch0", "depth0", "multiplier0", "rows0"])
def test_cuda_empty_tensors(cuda_device, x_shape, filter_sizes, dtype):
    """Empty tensors give zeros of filter_sizes in the input's dtype on the GPU."""
    import cupy

    n, h, w, c = x_shape
    x = to_gpu(np.ones(x_shape, dtype))
    dy = to_gpu(np.ones((n, h, w, c * filter_sizes[3]), dtype))
    got = gradops.depthwise_conv2d_native_backprop_filter(x, list(filter_sizes), dy, [1, 1, 1, 1], "SAME",
                                                          backend="cuda")
    assert isinstance(got, cupy.ndarray) and got.shape == filter_sizes and got.dtype == np.dtype(dtype)
    assert not np.any(to_host(got).astype(np.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_cuda_deterministic(cuda_device, rng, dtype):
    """Repeated calls give bitwise-identical results (no atomics; a fixed summation order)."""
    kwargs, _, _, _ = cuda_case(rng, x_shape=(4, 12, 11, 3), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                dtype=dtype)
    gpu = dict(kwargs, input=to_gpu(kwargs["input"]), out_backprop=to_gpu(kwargs["out_backprop"]))
    first = to_host(gradops.depthwise_conv2d_native_backprop_filter(**gpu, backend="cuda"))
    for _ in range(3):
        again = to_host(gradops.depthwise_conv2d_native_backprop_filter(**gpu, backend="cuda"))
        assert first.tobytes() == again.tobytes()


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_cuda_non_contiguous_and_nonfinite_inputs(cuda_device, rng, data_format):
    """Strided views are read correctly, and an Inf in the input reaches only the taps that read it."""
    x = np.ones((1, 3, 3, 1))
    x[0, 0, 0, 0] = np.inf
    dy = np.ones((1, 3, 3, 1))
    got = gradops.depthwise_conv2d_native_backprop_filter(to_gpu(x), [3, 3, 1, 1], to_gpu(dy), [1, 1, 1, 1], "SAME",
                                                          backend="cuda")
    ref, _ = expected_grad(x, (3, 3, 1, 1), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    np.testing.assert_array_equal(to_host(got), ref)

    big = rng.standard_normal(to_format(np.empty((2, 12, 10, 6)), data_format).shape).astype(np.float32)
    view_x = big[:, ::2] if data_format == "NCHW" else big[..., ::2]  # every other channel: 3
    x_nhwc = view_x if data_format == "NHWC" else view_x.transpose(0, 2, 3, 1)
    dy = random_array(rng, (2, 12, 10, 3), np.float32)
    kw = dict(strides=[1, 1, 1, 1], padding="SAME", data_format=data_format)
    got = gradops.depthwise_conv2d_native_backprop_filter(to_gpu(big)[:, ::2] if data_format == "NCHW"
                                                          else to_gpu(big)[..., ::2], [3, 3, 3, 1],
                                                          to_gpu(np.ascontiguousarray(to_format(dy, data_format))),
                                                          **kw, backend="cuda")
    ref, scale = expected_grad(np.ascontiguousarray(x_nhwc), (3, 3, 3, 1), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    assert_close(to_host(got), ref, np.float32, scale)


def test_cuda_default_dispatch_on_gpu_arrays(cuda_device, rng):
    """backend=None on GPU arrays: these kernels, whether or not cuDNN could run the call
    (_dispatch.CUDA_BY_DEFAULT: the H200 measured cuDNN's grouped wgrad slower)."""
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 6, 5, 2), filt_hw=(3, 3), multiplier=2, padding="SAME")
    gpu = dict(kwargs, input=to_gpu(kwargs["input"]), out_backprop=to_gpu(kwargs["out_backprop"]))
    got = gradops.depthwise_conv2d_native_backprop_filter(**gpu)
    decision = gradops.last_backend_decision()
    assert decision.op == OP and decision.backend == "cuda"
    assert decision.reason.startswith("gradops' CUDA kernels by default for this op")
    ref, scale = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    assert_close(to_host(got), ref, np.float64, scale)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=DTYPE_IDS[:3])
def test_gpu_cudnn_and_cuda_kernels_agree(rng, dtype):
    """Where cuDNN computes the call, it agrees with gradops' kernel within two roundings."""
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 9, 8, 4), filt_hw=(3, 3), multiplier=2, strides=(2, 2),
                                    padding="SAME", dtype=dtype)
    results = {}
    for backend in ("cudnn", "cuda"):
        try:
            results[backend] = check_cuda(kwargs, x, dy, case, backend=backend)
        except gradops.BackendUnavailableError as exc:
            pytest.skip(f"{backend} does not support this case: {exc}")
    _, scale = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (2, 2), "SAME", (1, 1), NO_PADS)
    assert_close(results["cudnn"], results["cuda"].astype(np.float64), dtype, 2 * scale)


# ---- bugs planted in copies of the kernel source must fail the comparison (tests/test_cuda_host.py's pattern)

PLANTED = {  # name: (text of the real source, its replacement)
    "last-slice-runs-past-the-batch": ("min(all_rows, first + rows_per_slice)", "first + rows_per_slice"),
    "first-column-rounds-down": ("(-col_offset + stride_cols - 1) / stride_cols", "-col_offset / stride_cols"),
    "last-column-dropped": ("min(out_cols, last_col / stride_cols + 1)", "min(out_cols, last_col / stride_cols)"),
    "channel-of-output-wrong": ("const I c = k / multiplier;", "const I c = k % in_depth;"),
    "dilation-ignored-on-rows": ("const I row_offset = r * dilation_rows - pad_top;", "const I row_offset = r - pad_top;"),
    "idle-lanes-not-skipped": ("if (k >= out_depth) continue;", ""),
    "channel-group-ignored": ("const I k = group * kGroup + lane;", "const I k = lane;"),
}
PLANTED_REDUCE = {  # bugs in the reduction: (edit, the reduce_problem it runs on: REDUCE_PROBLEMS)
    "reduce-drops-the-last-slice": (("index_t left = slices - group;", "index_t left = slices - 1 - group;"), "few"),
    "reduce-skips-a-group": (("for (int g0 = 1; g0 < groups; g0 += kReduceGroupBatch)",
                              "for (int g0 = 2; g0 < groups; g0 += kReduceGroupBatch)"), "few"),
    "reduce-one-group-too-many": (("const int groups = static_cast<int>(blockDim.x) / kReduceElements;",
                                   "const int groups = static_cast<int>(blockDim.x) / kReduceElements + 1;"), "few"),
    "reduce-reads-the-groups-before-the-barrier": (("sums[group][lane] = acc;\n    __syncthreads();",
                                                    "sums[group][lane] = acc;"), "few"),
    "reduce-sums-a-wrong-tap": (("batch[i] = i < count ? partial[at] : Acc(0);",
                                 "batch[i] = i < count ? partial[at - e + (e + 1) % elements] : Acc(0);"), "few"),
    # The batches (kReduceBatch slices a thread, kReduceGroupBatch groups' sums): the "many"
    # problem has two batches of slices per group and 32 groups (four batches of group sums).
    "reduce-batches-overlap": (("offset += kReduceBatch * stride", "offset += stride"), "many"),
    "reduce-second-batch-skipped": (("left -= kReduceBatch * groups, offset += kReduceBatch * stride",
                                     "left -= 2 * kReduceBatch * groups, offset += 2 * kReduceBatch * stride"), "many"),
    "reduce-batch-loses-its-last-slice": (("for (int i = 0; i < kReduceBatch; ++i)\n                if (i < count)",
                                           "for (int i = 0; i < kReduceBatch - 1; ++i)\n                if (i < count)"),
                                          "many"),
    # A batch of a group with fewer than kReduceBatch slices left reads past them (into the
    # next group's slices and past the partial sums: the guard bytes' NaN).
    "reduce-batch-reads-past-its-slices": (
        ("const int count = (reach + groups - 1) / groups;", "const int count = kReduceBatch;"), "few"),
    "reduce-group-batches-skip-a-group": (("g0 += kReduceGroupBatch)", "g0 += kReduceGroupBatch + 1)"), "many"),
    "reduce-group-batch-loses-its-last-group": (
        ("for (int i = 0; i < kReduceGroupBatch; ++i)\n                if (g0",
         "for (int i = 0; i < kReduceGroupBatch - 1; ++i)\n                if (g0"), "many"),
}


def run_planted_problem(rng):
    """(launcher result, NumPy backend result): SAME padding, column stride 2, row dilation 2,
    multiplier 2 on 17 channels (34 out_backprop channels: a full channel group of 32 and one
    of 2 with 30 idle lanes), and 4 uneven slices of the 10 (batch, out_row) pairs."""
    import cupy  # the installed HostDevice: its arrays sit between NaN guards

    kwargs, _, _, _ = cuda_case(rng, x_shape=(2, 5, 9, 17), filt_hw=(3, 3), multiplier=2, strides=(1, 2),
                                dilations=(2, 1), padding="SAME")
    got = cuda_launcher.depthwise_conv2d_native_backprop_filter(
        geometry_of(kwargs), cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"]), slices=4)
    return to_host(got), gradops.depthwise_conv2d_native_backprop_filter(**kwargs, backend="numpy")


def assert_planted_bug_caught(edit, run, check, seed, tmp_path, monkeypatch):
    """:func:`cuda_host.assert_planted_bug_caught` for this op's kernel source."""
    import cuda_host

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, edit, run, check, seed, tmp_path, monkeypatch)


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED[bug], lambda: run_planted_problem(np.random.default_rng(7)),
                              lambda got, want: assert_close(got, want, np.float64), 11, tmp_path, monkeypatch)


#: reduce_problem's calls: "few", 3 groups of 12 slices (36 slices of the 36 (batch, out_row)
#: pairs); "many", 32 groups of 18 or 19 slices (600 slices of 600 pairs: two batches of loads a
#: thread, four batches of the groups' sums).
REDUCE_PROBLEMS = {"few": ((3, 12, 5, 17), 36), "many": ((2, 300, 3, 17), 600)}


def reduce_problem(rng, problem="few"):
    """(launcher result, NumPy backend result) of a call whose reduction takes REDUCE_PROBLEMS'
    shape and slices."""
    import cupy

    x_shape, slices = REDUCE_PROBLEMS[problem]
    kwargs, _, _, _ = cuda_case(rng, x_shape=x_shape, filt_hw=(3, 3), multiplier=2, padding="SAME")
    got = cuda_launcher.depthwise_conv2d_native_backprop_filter(
        geometry_of(kwargs), cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"]), slices=slices)
    return to_host(got), gradops.depthwise_conv2d_native_backprop_filter(**kwargs, backend="numpy")


def test_reduce_groups():
    """A group sums at most REDUCE_LOADS slices (one batch of the unrolled loop's loads) where 32
    groups allow; from the slice count alone."""
    assert [cuda_launcher.reduce_groups(s) for s in (1, 16, 17, 36, 369, 512, 513, 5000)] == [1, 1, 2, 3, 24, 32,
                                                                                            32, 32]


def test_reduce_problems_take_their_batches():
    """REDUCE_PROBLEMS' slices give the groups and the batches the planted bugs need."""
    few, many = (cuda_launcher.reduce_groups(REDUCE_PROBLEMS[p][1]) for p in ("few", "many"))
    assert few == 3 and many == cuda_launcher.REDUCE_MAX_GROUPS == 32
    assert -(-600 // many) > cuda_launcher.REDUCE_LOADS  # a second batch of loads


@pytest.mark.parametrize("problem", sorted(REDUCE_PROBLEMS))
def test_cuda_reduce_problems(cuda_device, problem):
    got, want = reduce_problem(np.random.default_rng(7), problem)
    assert_close(got, want, np.float64)


@pytest.mark.parametrize("bug", sorted(PLANTED_REDUCE))
def test_planted_reduce_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    edit, problem = PLANTED_REDUCE[bug]
    assert_planted_bug_caught(edit, lambda: reduce_problem(np.random.default_rng(7), problem),
                              lambda got, want: assert_close(got, want, np.float64), 11, tmp_path, monkeypatch)


PLANTED_ONE_SLICE = {  # bugs in store_sum's one-slice store, run on one_slice_problem
    "one-slice-result-never-written": ("result[index] = from_acc<T, Acc>(Acc(0) + sum);", ""),
    "one-slice-result-one-element-on": ("result[index] = from_acc<T, Acc>(Acc(0) + sum);",
                                        "result[index + 1] = from_acc<T, Acc>(Acc(0) + sum);"),
    "one-slice-result-truncated": ("result[index] = from_acc<T, Acc>(Acc(0) + sum);",
                                   "result[index] = from_acc<T, Acc>(Acc(0) + static_cast<Acc>(static_cast<int>(sum)));"),
}


def one_slice_problem(rng):
    """(launcher result, NumPy backend result) of a float16 call in one slice (the first
    kernel writes the result): multiplier 2 on 5 channels, SAME padding."""
    import cupy

    kwargs, _, _, _ = cuda_case(rng, x_shape=(2, 6, 7, 5), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                dtype=np.float16)
    got = cuda_launcher.depthwise_conv2d_native_backprop_filter(
        geometry_of(kwargs), cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"]), slices=1)
    return to_host(got), gradops.depthwise_conv2d_native_backprop_filter(**kwargs, backend="numpy")


@pytest.mark.parametrize("bug", sorted(PLANTED_ONE_SLICE))
def test_planted_one_slice_store_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_ONE_SLICE[bug], lambda: one_slice_problem(np.random.default_rng(9)),
                              lambda got, want: assert_close(got, want, np.float16), 11, tmp_path, monkeypatch)


PLANTED_TILED = {  # bugs in the tiled kernel: name -> (text of the real source, its replacement)
    "tiled-slice-drops-its-last-tile": ("const int stop = min(units, first + units_per_slice);",
                                        "const int stop = min(units, first + units_per_slice - 1);"),
    "tiled-slice-runs-past-the-tiles": ("const int stop = min(units, first + units_per_slice);",
                                        "const int stop = first + units_per_slice;"),
    "tiled-stages-a-row-past-the-image": ("return row >= row_begin && row < row_end", "return row >= row_begin && row <= row_end"),
    "tiled-no-barrier-before-restaging": ("__syncthreads();  // the previous unit's staged tile has been read", ""),
    "tiled-item-sums-skip-the-last-item": ("for (int w = 1; w < kItems; ++w)", "for (int w = 1; w < kItems - 1; ++w)"),
    "tiled-taps-mirrored": ("const int r = wr - i * S;  // the tap", "const int r = K - 1 - (wr - i * S);  // the tap"),
    "tiled-last-output-column-dropped": ("cols = min(Sh::ITEM_COLS, out_cols - q)",
                                         "cols = min(Sh::ITEM_COLS, out_cols - q - 1)"),
    "tiled-checked-loop-ignores-the-top-edge": ("max(0, -wy), in_rows - wy", "0, in_rows - wy"),
    "tiled-never-checks-nonfinite": ("if (!__syncthreads_or(sums_probe != sums_probe)) break;",
                                     "if (!__syncthreads_or(0)) break;"),
    "tiled-second-pass-unchecked": ("                if (!checked) {", "                if (true) {"),
    "tiled-second-pass-keeps-the-first-pass-sums": ("acc[t][u] = Acc(0);\n    }", "acc[t][u] += Acc(0);\n    }"),
    "tiled-skips-an-item-one-row-inside": ("if (rows > 0 && cols > 0) {", "if (rows > 1 && cols > 0) {"),
    "tiled-skips-an-item-partly-inside-across": ("if (rows > 0 && cols > 0) {",
                                                 "if (rows > 0 && cols == Sh::ITEM_COLS) {"),
    "tiled-warp-columns-repeat-an-item-row": ("const int item_row = columns ? item % ITEMS_DOWN : item / C;",
                                              "const int item_row = columns ? item % 2 : item / C;"),
    "tiled-multiplier-2-staged-once": ("twice[2 * u] = twice[2 * u + 1] = v[u];",
                                       "twice[2 * u] = v[u], twice[2 * u + 1] = Acc(0);"),
    "tiled-channel-block-ignored": ("const int k0 = static_cast<int>(blockIdx.x) * CHANNELS;", "const int k0 = 0;"),
    # out_backprop values are kept as loaded until after the staging barrier (widen_lane)
    "tiled-lane-widens-its-first-channel-twice": (
        "for (int u = 0; u < Block<Acc>::V; ++u) v.v[u] = to_acc<Acc>(e[u]);",
        "for (int u = 0; u < Block<Acc>::V; ++u) v.v[u] = to_acc<Acc>(e[0]);"),
    "tiled-positions-past-the-output-not-zero": ("memset(&raw.bits, 0, sizeof raw.bits);",
                                                 "memset(&raw.bits, 0x3c, sizeof raw.bits);"),
}


PLANTED_ASYNC = {  # bugs in the tiled kernel's asynchronous staging, run on the same problem
    "async-no-wait-before-the-barrier": ("if (ASYNC) ptx::cp_async_wait_group<0>();", ""),
    "async-next-unit-never-copied": ("if (ASYNC && unit + 1 < stop) copy(n, tile_row, tile_col);", ""),
    "async-first-unit-never-copied": ("if (ASYNC && first < stop) copy(n, tile_row, tile_col);", ""),
    "async-copies-out_backprop-past-the-output": (
        "const bool fill = row < out_rows_left && col < out_cols_left && k < out_depth;",
        "const bool fill = k < out_depth;"),
    "async-item-reads-the-first-items-values": (
        "((item_row * Sh::ITEM_ROWS * Sh::TILE_COLS + item_col * Sh::ITEM_COLS) * CHANNELS + lane * V)",
        "(lane * V)"),
    "async-out_backprop-rows-a-tile-apart": ("item_dy + (i * Sh::TILE_COLS + j) * CHANNELS", "item_dy + (i * Sh::ITEM_COLS + j) * CHANNELS"),
    "async-staging-reads-another-threads-chunk": ("if (CHUNKS % kThreads == 0 || e < CHUNKS) raw[b] = raw_chunks[e];",
                                                  "if (CHUNKS % kThreads == 0 || e < CHUNKS) raw[b] = raw_chunks[e ^ 1];"),
}


def run_planted_tiled_problem(rng, async_copies=False):
    """(launcher results, loops' result twice): SAME 3x3 stride 1 on 3 images of 9 x 11,
    multiplier 2 on 20 float32 channels (40 out_backprop channels: blocks of 32 and 8, 16-byte
    staging of multiplier 2), 12 tiles of 8 x 8 in slices of 5 (the last one short), and a NaN in
    out_backprop at one image's corner (the checked loop: taps that would meet the padding stay
    finite); once with a warp's work items side by side, once one above the other (the last
    tile row and column hold items with one row or column inside the output, and items wholly
    past it: 6 idle warps of 16 per image side by side, 7 one above the other)."""
    import cupy  # the installed HostDevice

    kwargs, x, dy, case = cuda_case(rng, x_shape=(3, 9, 11, 20), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                    dtype=np.float32)
    dy = dy.copy()
    dy[1, 0, 0, 5] = np.nan
    kwargs["out_backprop"] = dy.astype(np.float32)
    g = geometry_of(kwargs)
    assert cuda_launcher.staging_mode(g, np.float32, cupy.asarray(kwargs["input"])) == 2
    assert [cuda_launcher.tiled_idle_warps(g, 2, columns) for columns in (False, True)] == [6, 7]
    got = [to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(
        g, cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"]), tiled=True, items_across=2,
        units_per_slice=5, columns_per_warp=columns, async_copies=async_copies)) for columns in (False, True)]
    want, _ = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    assert np.isnan(want).any() and np.isfinite(want).any()
    return np.stack(got), np.stack([want, want])


def assert_same_nonfinite_and_close(got, want):
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite], np.float32, max(1.0, float(np.abs(want[finite]).max())))


@pytest.mark.parametrize("bug", sorted(PLANTED_TILED))
def test_planted_tiled_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_TILED[bug], lambda: run_planted_tiled_problem(np.random.default_rng(5)),
                              assert_same_nonfinite_and_close, 3, tmp_path, monkeypatch)


@pytest.mark.parametrize("bug", sorted(PLANTED_ASYNC))
def test_planted_async_staging_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_ASYNC[bug],
                              lambda: run_planted_tiled_problem(np.random.default_rng(5), async_copies=True),
                              assert_same_nonfinite_and_close, 3, tmp_path, monkeypatch)


def run_async_border_problem(rng):
    """(launcher result, loops' result): SAME 3x3 stride 1, float32, multiplier 1, 3 images of 9 x
    11 that are images 1-3 of a 5-image array, so that a tile's staged positions outside the
    image read finite values of the neighbouring pixels or images (a copy that ignores the
    image's border would add them: no guard NaN sends the CTA to its checked pass)."""
    import cupy  # the installed HostDevice

    kwargs, x, dy, case = cuda_case(rng, x_shape=(5, 9, 11, 8), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                    dtype=np.float32)
    big = cupy.asarray(kwargs["input"])
    g = geometry_of(dict(kwargs, input=kwargs["input"][1:4], out_backprop=kwargs["out_backprop"][1:4]))
    got = cuda_launcher.depthwise_conv2d_native_backprop_filter(
        g, big[1:4], cupy.asarray(kwargs["out_backprop"][1:4]), tiled=True, items_across=2, units_per_slice=5,
        async_copies=True)
    want, _ = expected_grad(x[1:4], (3, 3, 8, 1), dy[1:4], (1, 1), "SAME", (1, 1), NO_PADS)
    return to_host(got), want


def test_planted_async_copy_of_the_image_border_fails_the_comparison(tmp_path, monkeypatch):
    assert_planted_bug_caught(("const bool fill = inside.holds(row, col) && c < in_depth;",
                               "const bool fill = c < in_depth;"),
                              lambda: run_async_border_problem(np.random.default_rng(9)),
                              lambda got, want: assert_close(got, want, np.float32), 3, tmp_path, monkeypatch)

def test_tiled_kernel_needs_32_bit_offsets_of_whole_tiles():
    """The tiled kernel forms the offsets of whole tiles (past the output, and padded rows of
    the input before the image) before it tests them: geometries whose tensors fit 2**31 but
    whose tiles' offsets would not take the per-element kernel."""
    def geometry(rows, cols, channels, pads=(1, 1, 1, 1)):
        out_rows, out_cols = rows + pads[0] + pads[1] - 2, cols + pads[2] + pads[3] - 2
        return conv2d_geometry(OP, (1, rows, cols, channels), (3, 3, channels, 1), (1, out_rows, out_cols, channels),
                               [1, 1, 1, 1], "EXPLICIT", [0, 0, *pads, 0, 0], "NHWC", [1, 1, 1, 1], depthwise=True)

    assert cuda_launcher.tiled_eligible(geometry(56, 56, 144), np.float16)
    near = geometry(4096, 4096, 96)  # 1.6e9 elements: the tensors fit, their tiles' offsets too
    assert 4096 * 4096 * 96 < 2**31 and cuda_launcher.tiled_eligible(near, np.float16)
    assert not cuda_launcher.tiled_eligible(geometry(4096, 4096, 127), np.float16)  # 2.13e9: tiles past the end
    assert not cuda_launcher.tiled_eligible(geometry(64, 64, 8, (2**24, 0, 1, 1)), np.float32)  # huge top pad


# ---- the planes kernel (NCHW, 3x3 / 5x5 at stride 1 / 2, no dilation)

PLANES_SHAPES = [(k, s) for k in (3, 5) for s in (1, 2)]


def nchw_geometry(x_shape=(2, 32, 14, 14), filt=3, strides=(1, 1), dilations=(1, 1), data_format="NCHW",
                  padding="SAME", pads=None):
    """A depthwise geometry (multiplier 1) from an NCHW (or NHWC) input shape."""
    n, c, h, w = x_shape if data_format == "NCHW" else (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
    if padding == "EXPLICIT":
        oh = (h + pads[0] + pads[1] - filt) // strides[0] + 1
        ow = (w + pads[2] + pads[3] - filt) // strides[1] + 1
        explicit = [0, 0, 0, 0, *pads] if data_format == "NCHW" else [0, 0, *pads, 0, 0]
    else:
        oh, ow = -(-h // strides[0]), -(-w // strides[1])
        explicit = []
    dy = (n, c, oh, ow) if data_format == "NCHW" else (n, oh, ow, c)
    return conv2d_geometry(OP, x_shape, (filt, filt, c, 1), dy, attr4(*strides, data_format), padding, explicit,
                           data_format, attr4(*dilations, data_format), depthwise=True)


def test_planes_kernel_is_picked_where_it_runs():
    """NCHW 3x3 / 5x5 at equal strides 1 / 2 without dilation takes the planes kernel; NHWC,
    other filters, unequal strides and dilations do not, and forcing it there is refused."""
    for filt in (3, 5):
        for stride in (1, 2):
            assert cuda_launcher.planes_eligible(nchw_geometry(filt=filt, strides=(stride, stride)), np.float16)
    for g in (nchw_geometry((2, 14, 14, 32), data_format="NHWC"), nchw_geometry(filt=7),
              nchw_geometry(strides=(1, 2)), nchw_geometry(dilations=(2, 2)), nchw_geometry(filt=1)):
        assert not cuda_launcher.planes_eligible(g, np.float32)
    with pytest.raises(ValueError, match="planes"):
        cuda_launcher.pick_planes(nchw_geometry(filt=7), np.float32, True)
    assert cuda_launcher.pick_planes(nchw_geometry(), np.float32, None)
    assert not cuda_launcher.pick_planes(nchw_geometry(), np.float32, False)


def test_planes_slicing_is_a_function_of_the_geometry():
    """Slices cover every work item once, none empty, about PLANES_TARGET_WARPS warps, and at
    least PLANES_MIN_ITEMS items per slice where there are that many."""
    for batch, size, channels, stride in ((1, 1, 1, 1), (32, 112, 32, 1), (32, 7, 960, 1), (2, 5, 1024, 2),
                                          (128, 56, 144, 2), (3, 9, 40, 1)):
        g = nchw_geometry((batch, channels, size, size), strides=(stride, stride))
        down, across = cuda_launcher.planes_item_counts(g)
        rows, cols = cuda_launcher.planes_item_shape(g)
        assert (down - 1) * rows < g.out_rows <= down * rows and (across - 1) * cols < g.out_cols <= across * cols
        items = batch * down * across
        slices, per = cuda_launcher.planes_slicing(g)
        assert slices >= 1 and per >= 1 and (slices - 1) * per < items <= slices * per
        assert per >= min(items, cuda_launcher.PLANES_MIN_ITEMS)
        assert channels * slices < cuda_launcher.PLANES_TARGET_WARPS + channels


def test_planes_interior_box():
    """Interior work items: positions inside the output and windows inside the image; an
    empty box puts every item in the border bands."""
    g = nchw_geometry((2, 8, 14, 20))  # SAME 3x3 stride 1: pads 1; 4 x 5 items of 4 x 4
    assert cuda_launcher.planes_item_counts(g) == (4, 5)
    assert cuda_launcher.planes_interior_box(g) == (1, 3, 1, 4)  # row 3: positions 12..15 pass 14 rows
    valid = nchw_geometry((1, 8, 16, 16), padding="EXPLICIT", pads=(0, 0, 0, 0))  # VALID: 14 x 14 out
    assert cuda_launcher.planes_interior_box(valid) == (0, 3, 0, 3)
    strided = nchw_geometry((1, 8, 56, 56), filt=5, strides=(2, 2))  # 28 x 28 out, items 2 x 4, pads 1 / 2
    row0, row1, col0, col1 = cuda_launcher.planes_interior_box(strided)
    assert (row0, col0) == (1, 1) and row1 == 13 and col1 == 6
    tiny = nchw_geometry((1, 8, 7, 7))
    assert cuda_launcher.planes_interior_box(tiny) == (2, 2, 2, 2)  # empty


def test_planes_window_form():
    """Window loads in pairs where a pair fits a 4- or 8-byte load, in_cols is even and the
    input aligned to a pair; from the column before the window where pad_left is odd (a
    window's first column has its parity); one value at a time otherwise."""
    launcher = cuda_launcher
    even_pads = nchw_geometry((1, 8, 16, 16), padding="EXPLICIT", pads=(1, 1, 2, 0))
    odd_pads = nchw_geometry((1, 8, 16, 16))  # SAME 3x3: pad_left 1
    strided = nchw_geometry((1, 8, 16, 16), strides=(2, 2))  # SAME 3x3 stride 2 on 16: pad_left 0
    assert (odd_pads.pad_left, strided.pad_left) == (1, 0)
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        assert launcher.planes_window_form(even_pads, dtype) == launcher.PLANES_PAIRS
        assert launcher.planes_window_form(strided, dtype) == launcher.PLANES_PAIRS
        assert launcher.planes_window_form(odd_pads, dtype) == launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE
        assert launcher.planes_window_form(odd_pads, dtype, pairs=False) == launcher.PLANES_SINGLES
        assert launcher.planes_window_form(nchw_geometry((1, 8, 16, 15)), dtype) == launcher.PLANES_SINGLES
    assert launcher.planes_window_form(odd_pads, np.float64) == launcher.PLANES_SINGLES
    with pytest.raises(ValueError, match="pair"):
        launcher.planes_window_form(nchw_geometry((1, 8, 16, 15)), np.float32, pairs=True)
    with pytest.raises(ValueError, match="pair"):
        launcher.planes_window_form(odd_pads, np.float64, pairs=True)
    rows, cols = launcher.planes_window_shape(odd_pads)
    assert (rows, cols) == (6, 6)
    assert launcher.planes_window_loads(odd_pads, np.float16, launcher.PLANES_SINGLES) == (36, 2)
    assert launcher.planes_window_loads(odd_pads, np.float16, launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE) == (24, 4)
    assert launcher.planes_window_loads(even_pads, np.float32, launcher.PLANES_PAIRS) == (18, 8)
    assert launcher.planes_window_loads(strided, np.float32, launcher.PLANES_PAIRS) == (5 * 5, 8)  # 9 columns


def test_planes_kernel_needs_32_bit_offsets_of_whole_items():
    """Geometries whose tensors fit 2**31 but whose work items' offsets (rows past the output,
    a huge padding) would not take the per-element kernel."""
    assert cuda_launcher.planes_eligible(nchw_geometry((32, 144, 56, 56)), np.float16)
    near = nchw_geometry((1, 96, 4096, 4096))  # 1.6e9 elements
    assert 96 * 4096 * 4096 < 2**31 and cuda_launcher.planes_eligible(near, np.float16)
    tight = nchw_geometry((1, 2047, 1024, 1024))  # 2.1464e9 elements: 1e6 below 2**31, items' rows past it
    assert 2047 * 1024 * 1024 < 2**31 and not cuda_launcher.planes_eligible(tight, np.float16)
    huge_pad = nchw_geometry((1, 8, 64, 64), padding="EXPLICIT", pads=(2**24, 0, 1, 1))
    assert not cuda_launcher.planes_eligible(huge_pad, np.float32)


@pytest.mark.parametrize("filt,stride", PLANES_SHAPES, ids=[f"f{k}-s{s}" for k, s in PLANES_SHAPES])
def test_cuda_planes_shapes(cuda_device, rng, filt, stride):
    """Every specialisation: SAME, VALID and asymmetric EXPLICIT padding, planes that end inside
    a work item, out_backprop rows of a multiple of 4 (one load a row) and not, multipliers 1
    (6 channels: a CTA with idle warps), 2 and 3, every element type, and slices shorter than
    a warp, of a warp and a bit, and over several images (the item step wrapping images)."""
    paddings = [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3)))]
    cases = ((1, 6, np.float32, (3, 8 + 4 * stride, 16)), (2, 3, np.float16, (2, 11, 13)),
             (3, 2, np.float64, (4, 7, 7)), (1, 2, ml_dtypes.bfloat16, (1, 9, 140)))
    for i, (padding, pads) in enumerate(paddings):
        for multiplier, channels, dtype, (n, h, w) in cases:
            if padding == "VALID" and min(h, w) < filt:
                continue
            kwargs, x, dy, case = cuda_case(rng, x_shape=(n, h, w, channels), filt_hw=(filt, filt),
                                            multiplier=multiplier, strides=(stride, stride), padding=padding,
                                            pads=pads, data_format="NCHW", dtype=dtype)
            for per_slice in (None, 5 + 14 * i, 33):
                check_cuda(kwargs, x, dy, case, planes=True, items_per_slice=per_slice)


ONE_SLICE_PATHS = {  # path -> (layout, filter, the launcher's overrides that make one slice, its kernel)
    "per-element": ("NHWC", (3, 2), dict(tiled=False, slices=1), "_partial<"),
    "tiled": ("NHWC", (3, 3), dict(tiled=True, units_per_slice=10 ** 6), "_tiled<"),
    "planes": ("NCHW", (3, 3), dict(planes=True, items_per_slice=10 ** 6), "_planes<"),
    "mma": ("NCHW", (3, 3), dict(mma=True, images_per_slice=10 ** 6), "_mma<"),
    "mma-nhwc": ("NHWC", (5, 5), dict(mma=True, images_per_slice=10 ** 6), "_mma_nhwc<"),
}
ONE_SLICE_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
                    "float64": np.float64}


@pytest.mark.parametrize("path,dtype", [(p, d) for p in ONE_SLICE_PATHS for d in ONE_SLICE_DTYPES
                                        if not p.startswith("mma") or d in ("float16", "bfloat16")])
def test_cuda_one_slice_needs_no_reduction(cuda_device, monkeypatch, path, dtype):
    """With one slice the first kernel writes the result and no reduction runs, in every dtype and
    from every first kernel; its bits are those the reduction would have written (the half
    types' float sums rounded as the reduction rounds one slice's sum)."""
    rng = np.random.default_rng(71)
    data_format, filt, forced, first = ONE_SLICE_PATHS[path]
    dtype = ONE_SLICE_DTYPES[dtype]
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 7, 9, 16), filt_hw=filt, multiplier=1, padding="SAME",
                                    data_format=data_format, dtype=dtype)
    assert not cuda_launcher.reduce_needed(1)
    assert cuda_launcher.reduce_needed(2)
    before = len(cuda_device.launches) if cuda_device is not None else 0
    one = check_cuda(kwargs, x, dy, case, **forced)
    if cuda_device is not None:
        kernels = [launch[0] for launch in cuda_device.launches[before:]]
        assert len(kernels) == 1 and first in kernels[0], kernels
    monkeypatch.setattr(cuda_launcher, "reduce_needed", lambda slices: True)
    before = len(cuda_device.launches) if cuda_device is not None else 0
    two = check_cuda(kwargs, x, dy, case, **forced)
    if cuda_device is not None:
        kernels = [launch[0] for launch in cuda_device.launches[before:]]
        assert len(kernels) == 2 and first in kernels[0] and "_reduce<" in kernels[1], kernels
    np.testing.assert_array_equal(one.view(np.uint8), two.view(np.uint8))


FEW_SLICES_PATHS = {  # path -> (layout, filter, the kernel forced, the override of its units per slice)
    "tiled": ("NHWC", (3, 3), dict(tiled=True), "units_per_slice"),
    "tiled-5x5": ("NHWC", (5, 5), dict(tiled=True), "units_per_slice"),
    "planes": ("NCHW", (3, 3), dict(planes=True), "items_per_slice"),
    "mma": ("NCHW", (3, 3), dict(mma=True), "images_per_slice"),
    "mma-nhwc": ("NHWC", (5, 5), dict(mma=True), "images_per_slice"),
}
FEW_SLICES_ORDERS = ("forward", "reverse", "shuffled")


def few_slices_units(path, g) -> int:
    """The units ``path``'s kernel cuts into slices (tiles, work items, images)."""
    if path.startswith("tiled"):
        return g.batch * math.prod(cuda_launcher.tile_counts(g, cuda_launcher.pick_items_across(g)))
    if path == "planes":
        return g.batch * math.prod(cuda_launcher.planes_item_counts(g))
    return g.batch if path == "mma" else cuda_launcher.mma_nhwc_units(g)


def few_slices_call(path, dtype, slices, fused):
    """The launcher's result (on the host) for a 16-image case cut into ``slices`` slices by
    ``path``'s kernel, in one launch or two (``fused``)."""
    data_format, filt, forced, override = FEW_SLICES_PATHS[path]
    rng = np.random.default_rng(83)
    kwargs, x, dy, case = cuda_case(rng, x_shape=(16, 7, 9, 16), filt_hw=filt, multiplier=1, padding="SAME",
                                    data_format=data_format, dtype=dtype)
    units = few_slices_units(path, geometry_of(kwargs))
    per_slice = -(-units // slices)
    assert -(-units // per_slice) == slices
    return check_cuda(kwargs, x, dy, case, **forced, **{override: per_slice}, fused=fused)


@pytest.mark.parametrize("order", FEW_SLICES_ORDERS)
@pytest.mark.parametrize("slices", [2, 16])
@pytest.mark.parametrize("path,dtype", [(p, d) for p in FEW_SLICES_PATHS for d in ONE_SLICE_DTYPES
                                        if not p.startswith("mma") or d in ("float16", "bfloat16")])
def test_cuda_few_slices_in_one_launch(monkeypatch, path, dtype, slices, order):
    """With 2 to REDUCE_LOADS slices a specialised kernel's last CTA (warp) of each channel block
    adds the slices itself: one launch, the same bits as the two launches, whichever block
    finishes last (the host runs them forward, in reverse and shuffled), its ticket counters
    left zeroed for the next launch, whose result is the same again."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice(order=order, seed=slices).install(monkeypatch)
    from gradops.backends.cuda import _runtime

    dtype = ONE_SLICE_DTYPES[dtype]
    first = {"tiled": "_tiled<", "tiled-5x5": "_tiled<", "planes": "_planes<", "mma": "_mma<",
             "mma-nhwc": "_mma_nhwc<"}[path]
    results = []
    for fused in (True, False, True):
        before = len(device.launches)
        got = few_slices_call(path, dtype, slices, fused)
        kernels = [launch[0] for launch in device.launches[before:]]
        assert first in kernels[0] and len(kernels) == (1 if fused else 2), kernels
        if not fused:
            assert "_reduce<" in kernels[1]
            grid = device.launches[before][1]
            assert grid[1] == (-(-slices // 4) if path == "mma" else slices)  # the slices asked for
        results.append(got.view(np.uint8))
        counters = to_host(_runtime.ticket_counters(1))
        assert counters.dtype == np.uint32 and not counters.any()  # left zeroed
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[2], results[1])


def test_fused_reduce_choice():
    """One launch where the slices are 2 to REDUCE_LOADS (one batch, summed in the second kernel's
    single group order) and each thread of a ticket's owner sums at most FUSED_MAX_ELEMENTS
    filter elements; the tiled kernel's 3x3 channel block (288 elements, 128 threads) qualifies,
    its 5x5 one (800) does not."""
    fused = cuda_launcher.fused_reduce
    loads = cuda_launcher.REDUCE_LOADS
    assert cuda_launcher.reduce_groups(loads) == 1 and cuda_launcher.reduce_groups(loads + 1) == 2
    assert [fused(s, 288, 128) for s in (1, 2, loads, loads + 1)] == [False, True, True, False]
    assert fused(2, 9, 32) and fused(2, 25 * 2, 32) and fused(2, 25 * 16, 256)
    assert not fused(2, 25 * 32, 128)
    assert fused(2, 4 * 128, 128) and not fused(2, 4 * 128 + 1, 128)


def few_slices_problem(path, dtype, slices=16):
    """(the second of two one-launch calls, the two-launch result) of ``path``'s kernel on the
    few-slices case: the planted bugs below live in the one-launch code only."""
    few_slices_call(path, dtype, slices, True)
    second = few_slices_call(path, dtype, slices, True)
    return second, few_slices_call(path, dtype, slices, False)


def assert_same_bits(got, want):
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))


_TICKET = """    const bool last = atomicAdd(ticket, 1u) == count - 1u;
    if (last) {
        *ticket = 0u;"""
PLANTED_FUSED = {  # bugs in one launch for a few slices: (edit, path, dtype of few_slices_problem)
    # The one ticket helper, planted once for a kernel of CTA tickets and once for one of warp tickets.
    "cta-ticket-one-early": ((_TICKET, _TICKET.replace("count - 1u", "count - 2u")), "tiled", np.float32),
    "cta-counter-not-reset": ((_TICKET, _TICKET.replace("*ticket = 0u;", "")), "mma-nhwc", np.float16),
    "warp-ticket-one-early": ((_TICKET, _TICKET.replace("count - 1u", "count - 2u")), "planes", np.float64),
    "warp-counter-not-reset": ((_TICKET, _TICKET.replace("*ticket = 0u;", "")), "mma", np.float16),
    "warp-ticket-of-the-channel-pair": (("add_few_slices<false, T, Acc>(partial, result, tickets + k, gridDim.y",
                                         "add_few_slices<false, T, Acc>(partial, result, tickets + k / 2, gridDim.y"),
                                        "planes", np.float32),
    "sum-from-the-last-slice": (("if (z < slices) sum += batch[z];",
                                 "if (kReduceBatch - 1 - z < slices) sum += batch[kReduceBatch - 1 - z];"),
                                "tiled", np.float64),
    "sum-drops-the-last-slice": (("batch[z] = z < slices ?", "batch[z] = z + 1 < slices ?"), "mma", np.float16),
    "tiled-block-a-quarter-of-its-channels": (
        ("out_depth, k0, CHANNELS, tid, kThreads);", "out_depth, k0, CHANNELS / 4, tid, kThreads);"), "tiled",
        np.float32),
    "mma-nhwc-block-of-the-wrong-channels": (("out_depth, c0 * M, St::CHANNELS * M, tid,",
                                              "out_depth, (c0 + 1) * M, St::CHANNELS * M, tid,"), "mma-nhwc",
                                             np.float16),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_FUSED))
def test_planted_few_slices_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """Each planted bug of the one-launch reduction changes the result's bits (or its values
    beyond the tolerance, or a launch is refused).  Not plantable here: a missing barrier or
    fence before the ticket, which the host model (blocks run one after another) cannot show;
    compute-sanitizer's racecheck covers only shared memory, so that order rests on review."""
    edit, path, dtype = PLANTED_FUSED[bug]
    assert_planted_bug_caught(edit, lambda: few_slices_problem(path, dtype), assert_same_bits, 13, tmp_path,
                              monkeypatch)


@pytest.mark.gpu
def test_gpu_few_slices_on_streams_at_once():
    """One launch for a few slices on two non-blocking streams, queued without waiting: each
    stream's launches take their own ticket counters (one array per stream), so every call's
    bits equal the two-launch result's, and each array is left zeroed."""
    import cupy

    from gradops.backends.cuda import _runtime

    rng = np.random.default_rng(29)
    kwargs, _, _, _ = cuda_case(rng, x_shape=(16, 28, 28, 96), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                dtype=np.float32)
    g = geometry_of(kwargs)
    x, dy = cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"])
    units = few_slices_units("tiled", g)
    per_slice = -(-units // 8)
    want = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(g, x, dy, tiled=True,
                                                                        units_per_slice=per_slice, fused=False))
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    results, counters = [], []
    for i in range(8):
        with streams[i % 2]:
            results.append(cuda_launcher.depthwise_conv2d_native_backprop_filter(
                g, x, dy, tiled=True, units_per_slice=per_slice, fused=True))
            counters.append(_runtime.ticket_counters(1))
    for stream in streams:
        stream.synchronize()
    assert counters[0].data.ptr != counters[1].data.ptr  # one array per stream
    for got in results:
        assert_same_bits(to_host(got), want)
    for c in counters[:2]:
        assert not to_host(c).any()


@pytest.mark.parametrize("arch,cols,one_launch", [(80, 14, False), (80, 16, True), (86, 14, False), (90, 14, True)])
def test_cuda_mma_few_slices_where_its_build_has_them(monkeypatch, arch, cols, one_launch):
    """The NCHW tensor-core kernel's 3x3 multiplier-1 build for 2-element chunks (14 columns) on
    sm_80 - sm_89 has no one-launch reduction (its call spilled there): the launcher runs the
    second kernel for it, refuses to force one launch, and takes one launch for 4-element chunks
    (16 columns) and on sm_90 (host builds as each architecture)."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice(compute_capability=arch, build_as_arch=True).install(monkeypatch)
    rng = np.random.default_rng(41)
    kwargs, x, dy, case = cuda_case(rng, x_shape=(8, 14, cols, 8), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                    data_format="NCHW", dtype=np.float16)
    g = geometry_of(kwargs)
    chunk = 2 if cols == 14 else 4
    assert cuda_launcher.mma_chunk(g, np.float16) == chunk
    assert cuda_launcher.mma_adds_few_slices(g, chunk, arch) == one_launch
    before = len(device.launches)
    check_cuda(kwargs, x, dy, case, mma=True, images_per_slice=2)  # 4 slices
    kernels = [launch[0] for launch in device.launches[before:]]
    assert "_mma<" in kernels[0] and len(kernels) == (1 if one_launch else 2), kernels
    if not one_launch:
        with pytest.raises(ValueError, match="no one-launch reduction"):
            check_cuda(kwargs, x, dy, case, mma=True, images_per_slice=2, fused=True)


def test_cuda_few_slices_forced_past_one_batch(cuda_device):
    """Forcing one launch for more slices than one batch of loads holds is refused."""
    rng = np.random.default_rng(3)
    kwargs, x, dy, case = cuda_case(rng, x_shape=(20, 7, 9, 16), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                    data_format="NCHW", dtype=np.float32)
    with pytest.raises(ValueError, match="one launch sums at most 16 slices, not 20"):
        check_cuda(kwargs, x, dy, case, planes=True, items_per_slice=6, fused=True)


def test_cuda_planes_one_load_a_row_or_four(cuda_device):
    """out_backprop rows read 4 values per load (aligned, out_cols a multiple of 4) and one at
    a time (a misaligned view) give the same bits."""
    import cupy

    rng = np.random.default_rng(4)
    kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 9, 12, 3), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                    data_format="NCHW", dtype=np.float16)
    g = geometry_of(kwargs)
    aligned = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
    shifted = misaligned_on_gpu(kwargs["out_backprop"])
    assert cuda_launcher.planes_lane_loads(g, np.float16, aligned)
    assert not cuda_launcher.planes_lane_loads(g, np.float16, shifted)
    x_gpu = cupy.asarray(kwargs["input"])
    four = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, aligned, planes=True))
    one = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, shifted, planes=True))
    assert four.tobytes() == one.tobytes()
    ref, scale = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), "SAME", (1, 1), NO_PADS)
    assert_close(four, ref, np.float16, scale)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=lambda d: np.dtype(d).name)
def test_cuda_planes_pair_window_loads(cuda_device, dtype):
    """Window loads in pairs, from the window's first column (pad_left even) and from the
    column before it (odd), give the bits of one value a load, at every specialisation, with
    interior and border items; a misaligned input (a view one element in) loads singles."""
    import cupy

    rng = np.random.default_rng(5)
    launcher = cuda_launcher
    for filt, stride in PLANES_SHAPES:
        for pads in (((1, 2), (2, 1)), ((0, 1), (1, 2)), ((2, 2), (3, 0))):
            kwargs, x, dy, case = cuda_case(rng, x_shape=(2, 13, 22, 3), filt_hw=(filt, filt), multiplier=2,
                                            strides=(stride, stride), padding="EXPLICIT", pads=pads,
                                            data_format="NCHW", dtype=dtype)
            g = geometry_of(kwargs)
            x_gpu = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
            dy_gpu = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
            form = launcher.planes_window_form(g, dtype, x_gpu)
            assert form == (launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE if pads[1][0] % 2 else launcher.PLANES_PAIRS)
            pairs = to_host(launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, dy_gpu, planes=True,
                                                                            items_per_slice=7))
            singles = to_host(launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, dy_gpu, planes=True,
                                                                              items_per_slice=7, pairs=False))
            assert pairs.tobytes() == singles.tobytes(), (filt, stride, pads)
            check_cuda(kwargs, x, dy, case, planes=True)
    shifted = misaligned_on_gpu(kwargs["input"])
    assert launcher.planes_window_form(g, dtype, shifted) == launcher.PLANES_SINGLES
    with pytest.raises(ValueError, match="pair"):
        launcher.depthwise_conv2d_native_backprop_filter(g, shifted, dy_gpu, planes=True, pairs=True)
    got = to_host(launcher.depthwise_conv2d_native_backprop_filter(g, shifted, dy_gpu, planes=True,
                                                                  items_per_slice=7))
    assert got.tobytes() == singles.tobytes()


#: Lane-block problems (NHWC input shape, filter, stride, explicit pads, items per slice): every
#: specialisation at pad_left 0, 1 and 2; rows of 2 to 10 interior items, so that a step of 32
#: lanes wraps box rows and images (neighbours that are not adjacent load their own pairs);
#: slices of 7 items (a run shorter than a warp: one partial step), 100 (interior runs of 54: a
#: full step and a partial one), 45 and the launcher's own.
LANE_BLOCK_CASES = [((4, 22, 48, 2), 3, 1, ((1, 1), (1, 1)), 100), ((3, 13, 24, 3), 3, 1, ((1, 1), (1, 1)), 7), ((2, 11, 48, 2), 3, 1, ((1, 0), (0, 2)), 45),
                    ((2, 9, 40, 3), 3, 1, ((0, 2), (2, 0)), None), ((3, 14, 24, 2), 3, 2, ((1, 1), (0, 1)), 45),
                    ((2, 12, 48, 2), 3, 2, ((0, 1), (1, 1)), None), ((2, 15, 32, 3), 3, 2, ((2, 0), (2, 2)), 7),
                    ((2, 12, 24, 3), 5, 1, ((2, 2), (2, 2)), 45), ((2, 14, 32, 2), 5, 1, ((1, 0), (1, 3)), None),
                    ((3, 9, 20, 2), 5, 1, ((0, 1), (0, 0)), 7), ((2, 17, 40, 2), 5, 2, ((1, 2), (1, 2)), 45),
                    ((2, 13, 48, 3), 5, 2, ((2, 2), (2, 1)), None), ((3, 11, 24, 2), 5, 2, ((0, 0), (0, 2)), 7)]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_cuda_planes_lane_block_window_loads(cuda_device, dtype):
    """Lane blocks (interior windows: each lane's own columns in one load, the columns beside
    them shuffled from its neighbours or loaded where a neighbour is not adjacent) give the
    bits of pair loads, at every specialisation and pad_left 0 to 2, with full and partial steps,
    and the loops' results; not offered for float32, an in_cols that is not a multiple of 4 x
    stride or a misaligned input."""
    import cupy

    rng = np.random.default_rng(15)
    launcher = cuda_launcher
    for shape, filt, stride, pads, per_slice in LANE_BLOCK_CASES:
        kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=2,
                                        strides=(stride, stride), padding="EXPLICIT", pads=pads,
                                        data_format="NCHW", dtype=dtype)
        g = geometry_of(kwargs)
        row0, row1, col0, col1 = launcher.planes_interior_box(g)
        assert (row1 - row0) * (col1 - col0) > 0, shape
        x_gpu = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
        dy_gpu = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
        assert launcher.planes_window_form(g, dtype, x_gpu, lanes=True) == launcher.PLANES_LANE_BLOCKS + pads[1][0]
        assert launcher.planes_window_form(g, dtype, x_gpu) == launcher.planes_window_form(g, dtype, x_gpu, lanes=False)
        blocks = to_host(launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, dy_gpu, planes=True, lanes=True,
                                                                         items_per_slice=per_slice))
        pairs = to_host(launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, dy_gpu, planes=True, lanes=False,
                                                                        items_per_slice=per_slice))
        assert blocks.tobytes() == pairs.tobytes(), (shape, filt, stride, pads)
        check_cuda(kwargs, x, dy, case, planes=True, lanes=True)
    assert not launcher.planes_lane_blocks_possible(g, np.float32)
    assert not launcher.planes_lane_blocks_possible(nchw_geometry((1, 8, 16, 18)), dtype)  # 18 columns
    assert not launcher.planes_lane_blocks_possible(nchw_geometry((1, 8, 16, 20), strides=(2, 2)), dtype)
    shifted = misaligned_on_gpu(kwargs["input"])
    with pytest.raises(ValueError, match="lane-block"):
        launcher.depthwise_conv2d_native_backprop_filter(g, shifted, dy_gpu, planes=True, lanes=True)


def test_cuda_planes_lane_blocks_memcheck(racecheck_device):
    """Lane blocks in racecheck builds, every LANE_BLOCK_CASES problem in float16: no load outside
    the input or out_backprop (their guard bytes: the own columns' 8- and 16-byte loads, the
    pairs beside them, the stand-in items of a run's last step), no misaligned vector load, and
    the loops' results."""
    rng = np.random.default_rng(16)
    for shape, filt, stride, pads, per_slice in LANE_BLOCK_CASES:
        kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=1,
                                        strides=(stride, stride), padding="EXPLICIT", pads=pads,
                                        data_format="NCHW", dtype=np.float16)
        check_cuda(kwargs, x, dy, case, planes=True, lanes=True, items_per_slice=per_slice)


def test_planted_lane_block_stand_in_past_the_batch_is_caught_by_memcheck(tmp_path, monkeypatch):
    """A run's last step whose idle lanes keep their own coordinates instead of the stand-in
    item loads past the last image (the run's items end there) and adds nothing: the results
    stay right, so only the racecheck build's guard bytes catch it."""
    import cuda_host

    def run():
        rng = np.random.default_rng(16)
        shape, filt, stride, pads, per_slice = LANE_BLOCK_CASES[0]  # the last run: 52 items, 12 idle lanes
        kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=1,
                                        strides=(stride, stride), padding="EXPLICIT", pads=pads,
                                        data_format="NCHW", dtype=np.float16)
        check_cuda(kwargs, x, dy, case, planes=True, lanes=True, items_per_slice=per_slice)

    cuda_host.assert_only_racecheck_catches(
        cuda_launcher.SOURCE, ("active ? n : 0, g.box_row0 + (active ? row : 0),", "n, g.box_row0 + row,"), run,
        "guard|outside|out of bounds", 4, tmp_path, monkeypatch)


PLANTED_LANE_BLOCKS = {  # bugs in the lane-block window loads: name -> (text of the real source, its replacement)
    "lanes-left-neighbour-across-a-box-row": ("true, lane > 0 && col > 0,", "true, lane > 0,"),
    "lanes-right-neighbour-past-the-run": ("col + 1 < box_cols && i + 1 < stop, acc);", "col + 1 < box_cols, acc);"),
    "lanes-left-pair-shuffled-down": ("shuffle_pair<true>(window[wr][Lb::LEFT + Lb::OWN_PAIRS - 1]",
                                      "shuffle_pair<false>(window[wr][Lb::LEFT + Lb::OWN_PAIRS - 1]"),
    "lanes-left-pair-the-neighbours-first": ("shuffle_pair<true>(window[wr][Lb::LEFT + Lb::OWN_PAIRS - 1]);",
                                             "shuffle_pair<true>(window[wr][Lb::LEFT]);"),
    "lanes-right-pairs-swapped": ("shuffle_pair<false>(window[wr][Lb::LEFT + j]);",
                                  "shuffle_pair<false>(window[wr][Lb::LEFT + Lb::RIGHT - 1 - j]);"),
    "lanes-idle-lanes-add-their-stand-in": ("if (active)  // no shuffle past here", "if (true)  // no shuffle past here"),
    "lanes-last-partial-step-skipped": ("if (i - lane < stop) {  // the run's last step", "if (false) {  // the run's last step"),
    "lanes-recheck-by-lane": ("if (pass == 1 || !__any_sync(kFullWarp, !finite)) break;", "if (pass == 1 || finite) break;"),
    "lanes-never-recheck": ("if (pass == 1 || !__any_sync(kFullWarp, !finite)) break;", "break;"),
}


def run_planted_lane_block_problem(rng):
    """(lane-block results, pair-load results) of float16 problems that every planted bug must
    change (pair loads, which the loops check elsewhere, are the reference: the two forms give
    the same bits):
    * 4 images of 22 x 48, 3x3 / 1, SAME: 4 x 10 interior items an image, 3 slices (interior
      runs of 54: a full step of 32, whose lanes wrap box rows, then 22 lanes, the last one
      mid-row), a NaN in one interior input value and one in out_backprop at an image's corner
      (the warp sums again, the border items checked);
    * 2 images of 14 x 32, 5x5 / 1, pad_left 1: two right-hand pairs a window row;
    * LANE_BLOCK_CASES' last, 5x5 / 2 with slices of 7 (partial steps only)."""
    import cupy  # the installed HostDevice

    got, want = [], []
    for case, nan_at in ((((4, 22, 48, 2), 3, 1, ((1, 1), (1, 1)), 100), (1, 9, 20, 1)),
                         (((2, 14, 32, 2), 5, 1, ((1, 0), (1, 3)), 45), None), (LANE_BLOCK_CASES[-1], None)):
        shape, filt, stride, pads, per_slice = case
        kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=2,
                                        strides=(stride, stride), padding="EXPLICIT", pads=pads,
                                        data_format="NCHW", dtype=np.float16)
        x, dy = x.copy(), dy.copy()
        if nan_at is not None:
            x[nan_at] = np.nan
            dy[2, 0, 0, 1] = np.nan  # input channel 0: the NaN input value is channel 1's
        g = geometry_of(kwargs)
        x_gpu = cupy.asarray(np.ascontiguousarray(to_format(x, "NCHW")))
        dy_gpu = cupy.asarray(np.ascontiguousarray(to_format(dy, "NCHW")))
        for lanes, out in ((True, got), (False, want)):
            result = cuda_launcher.depthwise_conv2d_native_backprop_filter(
                g, x_gpu, dy_gpu, planes=True, lanes=lanes, items_per_slice=per_slice)
            out.append(to_host(result).astype(np.float64).ravel())
    want = np.concatenate(want)
    assert np.isnan(want).any() and np.isfinite(want).any()
    return np.concatenate(got), want


def assert_same_values(got, want):
    """NaN where ``want`` has it, every other value equal."""
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@pytest.mark.parametrize("bug", sorted(PLANTED_LANE_BLOCKS))
def test_planted_lane_block_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_LANE_BLOCKS[bug], lambda: run_planted_lane_block_problem(np.random.default_rng(9)),
                              assert_same_values, 5, tmp_path, monkeypatch)


def test_cuda_planes_nonfinite_values_meet_no_padding(cuda_device):
    """Inf and NaN reach exactly the taps TF's loops give them (the checked loop): an Inf next
    to the padding, a NaN in out_backprop at the image corner and an Inf in an input column no
    output reads (VALID, stride 2); and a slice of finite values beside them stays unchecked."""
    x = np.ones((1, 9, 10, 2), np.float32)
    x[0, 0, 3, 0] = np.inf
    x[0, 4, 9, 1] = np.inf  # column 9: VALID 3x3 stride 2 reads columns 0..8 only
    for strides, padding in (((1, 1), "SAME"), ((2, 2), "VALID"), ((2, 2), "SAME")):
        if padding == "SAME":
            oh, ow = -(-x.shape[1] // strides[0]), -(-x.shape[2] // strides[1])
        else:
            oh, ow = (x.shape[1] - 3) // strides[0] + 1, (x.shape[2] - 3) // strides[1] + 1
        dy = np.ones((1, oh, ow, 2), np.float32)
        dy[0, 0, 0, 1] = np.nan
        got = gradops.depthwise_conv2d_native_backprop_filter(
            to_gpu(to_format(x, "NCHW")), [3, 3, 2, 1], to_gpu(to_format(dy, "NCHW")), attr4(*strides, "NCHW"),
            padding, data_format="NCHW", backend="cuda")
        ref, _ = expected_grad(x.astype(np.float64), (3, 3, 2, 1), dy.astype(np.float64), strides, padding, (1, 1),
                               NO_PADS)
        np.testing.assert_array_equal(np.isnan(to_host(got)), np.isnan(ref))
        np.testing.assert_array_equal(np.isinf(to_host(got)), np.isinf(ref))
        finite = np.isfinite(ref)
        np.testing.assert_allclose(to_host(got)[finite], ref[finite], rtol=1e-6)


PLANTED_PLANES = {  # bugs in the planes kernel: name -> (text of the real source, its replacement)
    "planes-slice-drops-its-last-border-item": (
        "const int stop_border = min(border_items, slice * border_per_slice + border_per_slice);",
        "const int stop_border = min(border_items, slice * border_per_slice + border_per_slice - 1);"),
    "planes-slice-runs-into-the-next-interior-run": (
        "const int stop_interior = min(interior_items, slice * interior_per_slice + interior_per_slice);",
        "const int stop_interior = min(interior_items, slice * interior_per_slice + interior_per_slice + 1);"),
    "planes-interior-run-of-the-border-slicing": ("const int first_interior = slice * interior_per_slice + lane;",
                                                  "const int first_interior = slice * border_per_slice + lane;"),
    "planes-window-row-past-the-image": ("const bool row_inside = wr >= row_begin && wr < row_end;",
                                         "const bool row_inside = wr >= row_begin && wr <= row_end;"),
    "planes-taps-mirrored": ("const int r = wr - a * S;  // the tap", "const int r = K - 1 - (wr - a * S);  // the tap"),
    "planes-last-output-column-dropped": ("cols = min(Sh::ITEM_COLS, g.out_cols - q0)",
                                          "cols = min(Sh::ITEM_COLS, g.out_cols - q0 - 1)"),
    "planes-never-rechecks-nonfinite": ("if (!finite) {", "if (false) {"),
    "planes-checked-loop-keeps-padding": (
        "if (CHECKED && !(wr >= row_begin && wr < row_end && wc >= col_begin && wc < col_end)) continue;", ""),
    "planes-step-forgets-the-row-carry": ("            col -= box_cols;\n            ++row;",
                                          "            col -= box_cols;"),
    "planes-step-forgets-the-image-carry": ("            row -= box_rows;\n            ++n;",
                                            "            row -= box_rows;"),
    "planes-interior-items-at-the-box-corner": ("g.box_row0 + row, g.box_col0 + col, acc);", "row, col, acc);"),
    "planes-bottom-band-from-the-box-top": ("            row += g.box_row1;", "            row += g.box_row0;"),
    "planes-side-band-skips-no-box-columns": ("col += col < g.box_col0 ? 0 : box_cols;", "col += 0;"),
    "planes-border-loads-past-the-last-row": ("rows_of_four[a] = LOADS == kInterior || a < rows ?",
                                              "rows_of_four[a] = true ?"),
    "planes-pair-test-of-the-window-not-the-image": ("const bool inside = LOADS == kInterior || (row_inside && wc >= -x0 && wc < col_end);",
                                                     "const bool inside = LOADS == kInterior || (row_inside && wc >= col_begin && wc < col_end);"),
    "planes-pairs-from-the-window-column": ("static constexpr int SHIFT = FORM == kPairsFromColumnBefore ? 1 : 0;",
                                            "static constexpr int SHIFT = 0;"),
    "planes-pair-value-always-the-first": ("static float value(type pair, int i) { return i ? pair.y : pair.x; }",
                                           "static float value(type pair, int i) { return pair.x; }"),
    "planes-lane-sum-skips-the-last-lane": ("for (int l = 1; l < kWarpSize; ++l)", "for (int l = 1; l < kWarpSize - 1; ++l)"),
    "planes-no-warp-barrier": ("    __syncwarp();\n    if (lane < K * K) {", "    if (lane < K * K) {"),
    "planes-multiplier-ignored": ("const int c = k / multiplier;", "const int c = k;"),
}


def run_planted_planes_problem(rng):
    """(launcher results, loops' results), three SAME 3x3 stride-1 problems, multiplier 2 on 3
    float32 channels, so that lanes run several items and a step of 32 items wraps columns,
    rows and images:
    * 20 images of 7 x 12: 2 x 3 items a plane, none interior, out_backprop rows in one load,
      a NaN in out_backprop at one image's corner (the checked loop), slices of 37 items (the
      last one short);
    * 9 images of 6 x 13: 2 x 4 items, the last column alone in its item, rows one value at a
      time, slices of 37;
    * 11 images of 18 x 20: 5 x 5 items, 3 x 3 of them interior (top, bottom and side bands
      around the box), rows in one load, two slices with runs of 50 and 49 interior items (a
      lane's step wraps an interior row and image) and 88 border items each;
    * VALID, 5 images of 10 x 16 (8 x 14 out): 2 x 4 items, the last column's half past the
      output (2 x 3 interior), rows one value at a time.
    Window loads: pairs from the column before the window (SAME: pad_left 1) on even widths,
    pairs from the window's first column (VALID), one value a time on width 13."""
    import cupy  # the installed HostDevice

    got, want = [], []
    forms = []
    for images, rows, cols, nan_image, per_slice, padding in (
            (20, 7, 12, 3, 37, "SAME"), (9, 6, 13, None, 37, "SAME"), (11, 18, 20, None, 140, "SAME"),
            (5, 10, 16, None, 37, "VALID")):
        kwargs, x, dy, case = cuda_case(rng, x_shape=(images, rows, cols, 3), filt_hw=(3, 3), multiplier=2,
                                        padding=padding, data_format="NCHW", dtype=np.float32)
        dy = dy.copy()
        if nan_image is not None:
            dy[nan_image, 0, 0, 5] = np.nan
        kwargs["out_backprop"] = to_format(dy, "NCHW").astype(np.float32)
        g = geometry_of(kwargs)
        row0, row1, col0, col1 = cuda_launcher.planes_interior_box(g)
        assert (row1 - row0) * (col1 - col0) == (9 if rows == 18 else 6 if padding == "VALID" else 0)
        if rows == 18:
            assert cuda_launcher.planes_runs(g, 2) == (99, 176, 50, 88)
        gpu_dy = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
        assert cuda_launcher.planes_lane_loads(g, np.float32, gpu_dy) == (g.out_cols % 4 == 0)
        gpu_x = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
        forms.append(cuda_launcher.planes_window_form(g, np.float32, gpu_x))
        result = cuda_launcher.depthwise_conv2d_native_backprop_filter(
            g, gpu_x, gpu_dy, planes=True, items_per_slice=per_slice)
        expected, _ = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), padding, (1, 1), NO_PADS)
        got.append(to_host(result).ravel())
        want.append(expected.ravel())
    want = np.concatenate(want)
    assert np.isnan(want).any() and np.isfinite(want).any()
    assert forms == [cuda_launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE, cuda_launcher.PLANES_SINGLES,
                     cuda_launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE, cuda_launcher.PLANES_PAIRS]
    return np.concatenate(got), want


def test_host_model_refuses_a_misaligned_pair_load(tmp_path, monkeypatch):
    """A GPU faults on a misaligned vector load and a CPU does not: the execution model checks
    ``load_vector``'s alignment, so pair loads planted one column off end the launch."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, PLANTED_PLANES["planes-pairs-from-the-window-column"])
    cuda_host.HostDevice(source_dir=tmp_path).install(monkeypatch)
    with pytest.raises(cuda_host.HostLaunchError, match="misaligned"):
        run_planted_planes_problem(np.random.default_rng(6))


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANES))
def test_planted_planes_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_PLANES[bug], lambda: run_planted_planes_problem(np.random.default_rng(6)),
                              assert_same_nonfinite_and_close, 3, tmp_path, monkeypatch)


PLANTED_BFLOAT16_PAIRS = {  # PairOf<__nv_bfloat16>: a pair's word widened by integer operations
    "planes-bfloat16-pair-high-half-twice": ("return __uint_as_float(i ? bits & 0xffff0000u : bits << 16);",
                                             "return __uint_as_float(bits & 0xffff0000u);"),
    "planes-bfloat16-pair-halves-swapped": ("return __uint_as_float(i ? bits & 0xffff0000u : bits << 16);",
                                            "return __uint_as_float(i ? bits << 16 : bits & 0xffff0000u);"),
}


def run_bfloat16_pairs_problem(rng):
    """(launcher result, loops' result): bfloat16 NCHW 3x3 stride 1, SAME on 4 images of 7 x 10
    (pairs from the column before the window) and VALID on 3 of 8 x 12 (pairs from its first
    column), the planes kernel."""
    import cupy  # the installed HostDevice

    bf16 = np.dtype(ml_dtypes.bfloat16)
    got, want = [], []
    for images, rows, cols, padding, form in ((4, 7, 10, "SAME", cuda_launcher.PLANES_PAIRS_FROM_COLUMN_BEFORE),
                                              (3, 8, 12, "VALID", cuda_launcher.PLANES_PAIRS)):
        kwargs, x, dy, case = cuda_case(rng, x_shape=(images, rows, cols, 2), filt_hw=(3, 3), multiplier=1,
                                        padding=padding, data_format="NCHW", dtype=bf16)
        g = geometry_of(kwargs)
        gpu_x = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
        assert cuda_launcher.planes_window_form(g, bf16, gpu_x) == form
        result = cuda_launcher.depthwise_conv2d_native_backprop_filter(
            g, gpu_x, cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"])), planes=True)
        expected, _ = expected_grad(x.astype(np.float64), tuple(kwargs["filter_sizes"]), dy.astype(np.float64),
                                    (1, 1), padding, (1, 1), NO_PADS)
        got.append(to_host(result).astype(np.float64).ravel())
        want.append(expected.ravel())
    return np.concatenate(got), np.concatenate(want)


def assert_bfloat16_close(got, want):
    assert_close(got, want, ml_dtypes.bfloat16, max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("bug", sorted(PLANTED_BFLOAT16_PAIRS))
def test_planted_bfloat16_pair_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_BFLOAT16_PAIRS[bug], lambda: run_bfloat16_pairs_problem(np.random.default_rng(8)),
                              assert_bfloat16_close, 3, tmp_path, monkeypatch)


# --------------------------------------------------------------------------- the tensor-core kernel

def test_mma_kernel_is_picked_where_it_runs():
    """NCHW float16 / bfloat16 3x3 / 5x5 at stride 1, multiplier 1 or 2, planes of at most 32 x
    32 out_backprop positions take the tensor-core kernel on sm_80+; everything else does not,
    and forcing it there is refused."""
    half, bf16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
    for filt in (3, 5):
        for shape in ((32, 960, 7, 7), (32, 384, 14, 14), (2, 8, 32, 32), (1, 1, 1, 1), (3, 5, 30, 13)):
            g = nchw_geometry(shape, filt=filt)
            assert cuda_launcher.mma_possible(g, half) and cuda_launcher.mma_possible(g, bf16)
            chosen = cuda_launcher.mma_fill(g) >= cuda_launcher.MMA_MIN_FILL
            assert chosen == (shape[2] not in (7, 1))  # 7 x 7: 49 / 128; 30 x 13: 390 / 512
            assert cuda_launcher.mma_chosen(g, half, arch=80) == chosen
            assert not cuda_launcher.mma_chosen(g, half, arch=75)
    refused = [(nchw_geometry((2, 8, 33, 32)), half), (nchw_geometry((2, 8, 32, 33)), half),
               (nchw_geometry(strides=(2, 2)), half), (nchw_geometry(dilations=(2, 2)), half),
               (nchw_geometry(filt=7), half), (nchw_geometry((2, 14, 14, 8), data_format="NHWC"), half),
               (nchw_geometry(), np.dtype(np.float32)), (nchw_geometry(), np.dtype(np.float64)),
               # no padding, 5x5 on 36 x 36: 32 x 32 outputs but 36 input columns read a row
               (nchw_geometry((1, 2, 36, 36), filt=5, padding="EXPLICIT", pads=(0, 0, 0, 0)), half)]
    for g, dtype in refused:
        assert not cuda_launcher.mma_possible(g, dtype)
    assert cuda_launcher.mma_possible(nchw_geometry((1, 2, 36, 32), filt=5, padding="EXPLICIT", pads=(0, 0, 0, 0)),
                                      half)  # 32 x 28 outputs, 32 columns read
    g3 = conv2d_geometry(OP, (2, 4, 9, 9), (3, 3, 4, 3), (2, 12, 9, 9), [1, 1, 1, 1], "SAME", [], "NCHW",
                         [1, 1, 1, 1], depthwise=True)
    assert not cuda_launcher.mma_possible(g3, half)  # multiplier 3
    assert cuda_launcher.mma_fill(nchw_geometry((32, 384, 14, 14))) == 196 / 256
    assert cuda_launcher.mma_slicing(nchw_geometry((32, 384, 14, 14))) == (11, 3)
    assert cuda_launcher.mma_slicing(nchw_geometry((32, 960, 7, 7))) == (4, 8)
    assert cuda_launcher.mma_slicing(nchw_geometry((2, 8, 14, 14))) == (2, 1)
    assert "_mma<" not in " ".join(cuda_launcher.instantiations(75)[cuda_launcher.SOURCE])
    assert sum("_mma<" in e for e in cuda_launcher.instantiations(80)[cuda_launcher.SOURCE]) == 24
    assert cuda_launcher.mma_chunk(nchw_geometry((2, 8, 28, 28)), half) == 4
    assert cuda_launcher.mma_chunk(nchw_geometry((2, 8, 14, 14)), half) == 2
    assert cuda_launcher.mma_chunk(nchw_geometry((2, 8, 14, 14), filt=5, padding="EXPLICIT", pads=(0, 0, 0, 0)),
                                   half) == 2  # 10 x 10 outputs
    assert cuda_launcher.mma_chunk(nchw_geometry((2, 8, 7, 7)), half) == 1


#: (NCHW input shape, filter, padding, explicit pads, images per slice) of the tensor-core grid:
#: planes of 1 .. 32 rows / columns, one and two k-steps, one to four column blocks, the vector
#: chunks 4 (28, 32 columns), 2 (14, 30) and 1 (7, 13), pad_left 0 .. 6 (staged column shifts 0,
#: 4 and 8), padding past the filter (taps that meet only zeros), slices of 1, 2 and 3 images.
MMA_CASES = [((2, 3, 7, 7), 3, "SAME", None, None), ((3, 2, 14, 14), 3, "SAME", None, 2),
             ((2, 2, 14, 14), 5, "SAME", None, 1), ((2, 2, 28, 28), 5, "SAME", None, None),
             ((1, 2, 32, 32), 3, "SAME", None, None), ((3, 2, 13, 30), 3, "VALID", None, 2),
             ((2, 2, 30, 13), 5, "VALID", None, 3), ((2, 2, 12, 20), 3, "EXPLICIT", (2, 0, 1, 3), 1),
             ((2, 2, 9, 24), 5, "EXPLICIT", (0, 3, 6, 2), None), ((2, 2, 3, 4), 3, "EXPLICIT", (4, 1, 5, 0), None),
             ((1, 2, 1, 1), 5, "SAME", None, None)]


@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_cuda_mma_shapes(cuda_device, rng, multiplier, dtype):
    """The tensor-core kernel against the loops and the NumPy backend over :data:`MMA_CASES`."""
    for (n, c, h, w), filt, padding, pads, per_slice in MMA_CASES:
        pairs = NO_PADS if pads is None else ((pads[0], pads[1]), (pads[2], pads[3]))
        kwargs, x, dy, case = cuda_case(rng, x_shape=(n, h, w, c), filt_hw=(filt, filt), multiplier=multiplier,
                                        padding=padding, pads=pairs, data_format="NCHW", dtype=dtype)
        assert cuda_launcher.mma_possible(geometry_of(kwargs), np.dtype(dtype))
        check_cuda(kwargs, x, dy, case, mma=True, images_per_slice=per_slice)


def test_cuda_mma_is_the_default_and_chunks_agree(cuda_device):
    """The public call takes the tensor-core kernel (on the host stand-in: sm_90), and staging
    one element a load (misaligned views) gives the bits of 2- and 4-element chunks."""
    import cupy

    rng = np.random.default_rng(12)
    for h, w, chunk in ((14, 14, 2), (12, 28, 4)):
        kwargs, x, dy, case = cuda_case(rng, x_shape=(3, h, w, 2), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                        data_format="NCHW", dtype=np.float16)
        g = geometry_of(kwargs)
        x_gpu = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
        dy_gpu = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
        assert cuda_launcher.mma_chunk(g, np.float16, (x_gpu, dy_gpu)) == chunk
        shifted = misaligned_on_gpu(kwargs["input"])
        assert cuda_launcher.mma_chunk(g, np.float16, (shifted, dy_gpu)) == 1
        wide = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(g, x_gpu, dy_gpu, mma=True))
        single = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(g, shifted, dy_gpu, mma=True))
        assert wide.tobytes() == single.tobytes()
        before = len(cuda_device.launches) if cuda_device is not None else 0
        default = to_host(gradops.depthwise_conv2d_native_backprop_filter(**dict(
            kwargs, input=x_gpu, out_backprop=dy_gpu), backend="cuda"))
        assert default.tobytes() == wide.tobytes()
        if cuda_device is not None:  # the host stand-in: the partial sums' kernel first
            assert cuda_device.launches[before][0] == \
                f"gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 3, 2, {chunk}>"
        check_cuda(kwargs, x, dy, case)


def mma_nonfinite_problem(dtype=np.float16):
    """(kwargs, loops' result) of a SAME 3x3 problem on 2 images of 2 channels, 9 x 10: an Inf
    in the input next to the padding (channel 0, image 0), a NaN in out_backprop at the corner
    (channel 1, image 1: that slice alone is checked with one image a slice) and, in bfloat16,
    finite values whose products pass float's range."""
    x = np.ones((2, 9, 10, 2), np.float32)
    dy = np.ones((2, 9, 10, 2), np.float32)
    x[0, 0, 3, 0] = np.inf
    dy[1, 0, 0, 1] = np.nan
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        x[1, 4, 4, 0] = 3e38
        dy[1, 5, 5, 0] = 2.0  # 6e38: the product overflows float, as it does in TF's float sums
    x, dy = x.astype(dtype), dy.astype(dtype)
    kwargs = dict(input=to_format(x, "NCHW"), filter_sizes=np.array([3, 3, 2, 1], np.int32),
                  out_backprop=to_format(dy, "NCHW"), strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[],
                  data_format="NCHW", dilations=[1, 1, 1, 1])
    want, _ = expected_grad(x.astype(np.float64), (3, 3, 2, 1), dy.astype(np.float64), (1, 1), "SAME", (1, 1),
                            NO_PADS)
    return kwargs, want


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_cuda_mma_nonfinite_values_meet_no_padding(cuda_device, dtype):
    """Inf and NaN reach exactly the taps TF's loops give them: the slices whose accumulators
    are not finite are recomputed on the CUDA cores."""
    kwargs, want = mma_nonfinite_problem(dtype)
    g = geometry_of(kwargs)
    got = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(
        g, to_gpu(kwargs["input"]), to_gpu(kwargs["out_backprop"]), mma=True, images_per_slice=1))
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        want = np.where(np.abs(want) > 3.4e38, np.inf * np.sign(want), want)
    assert_same_nonfinite_and_close(got.astype(np.float64), want)


def test_mma_forced_where_it_cannot_run():
    with pytest.raises(ValueError, match="mma kernel cannot run"):
        cuda_launcher.pick_mma(nchw_geometry(strides=(2, 2)), np.float16, True)


# Not planted here: the pair loop without its barrier before the second image's stores.  The
# host model's ldmatrix and mma.sync are warp barriers (every lane's reads of the stage are done
# when the warp's last collective of an image returns), so the comparison cannot tell that race
# from the real source; a racecheck build can (RACECHECK_PLANTED, at the end of this file).
# Not planted: a stage left unzeroed.  The host model's shared memory starts at zero and keeps
# the previous block's leftovers (the diagonal sums, floats), which as half values are mostly
# not finite somewhere, so the warp takes its checked sums and the result is right: the model
# cannot tell that bug from the real source.
PLANTED_MMA = {  # bugs in the tensor-core kernel: name -> (text of the real source, its replacement)
    # Caught since the host model poisons shared memory before each block (a GPU leaves it
    # undefined); a fresh static's zeros hid it before.
    "mma-staging-never-zeroed": ("for (int i = lane; i < WARP_BYTES / 16; i += 32) chunks[i] = make_uint4(0, 0, 0, 0);",
                                 "(void)chunks;"),
    "mma-diagonal-ignores-the-column-shift": ("((q * K + r) * 16 + s - pad_left + x_shift) * 8",
                                              "((q * K + r) * 16 + s) * 8"),
    "mma-rows-not-shifted-per-tap": ("xs + (16 * step + r + a_row) * PITCH", "xs + (16 * step + a_row) * PITCH"),
    "mma-second-k-step-skipped": ("const int k_steps = (out_rows + 15) / 16", "const int k_steps = 1"),
    "mma-last-column-block-skipped": ("blocks = (out_cols + 7) / 8;", "blocks = out_cols / 8;"),
    "mma-a-matrices-swapped": ("const int a_row = lane % 8 + 8 * (lane / 16), a_col = 8 * ((lane / 8) % 2);",
                               "const int a_row = lane % 8 + 8 * ((lane / 8) % 2), a_col = 8 * (lane / 16);"),
    "mma-b-rows-of-one-matrix": ("const int b_row = lane % 16;", "const int b_row = lane % 8;"),
    "mma-slice-runs-one-image-short": ("const int n1 = min(batch, n0 + images_per_slice);",
                                       "const int n1 = min(batch, n0 + images_per_slice - 1);"),
    "mma-never-rechecks-nonfinite": ("return !__any_sync(0xffffffffu, probe != 0.0f);", "return true;"),
    "mma-checked-loop-keeps-padding": ("if (x_col < 0 || x_col >= in_cols) continue;", ""),
    "mma-multiplier-slice-ignored": ("dwconv::load_vector(y_src + q * y_plane_chunks)", "dwconv::load_vector(y_src)"),
    "mma-pair-second-image-skipped": ("            if (second) {\n                store_batch", "            if (false) {\n                store_batch"),
    "mma-pair-loads-the-first-image-twice": ("load_batch<VEC, M>(x, x_plane + x_step, y, y_plane + y_step,",
                                             "load_batch<VEC, M>(x, x_plane, y, y_plane,"),
    "mma-pair-step-skips-an-image": ("n += 2, x_plane += 2 * x_step, y_plane += 2 * y_step",
                                     "n += 2, x_plane += 3 * x_step, y_plane += 3 * y_step"),
    "mma-pair-multiplier-slice-ignored": ("dwconv::load_vector(y_src + q * (y_plane_step / VEC))",
                                          "dwconv::load_vector(y_src)"),
    # The H200 hang: lanes with different slot counts took different paths to the products.
    "mma-path-chosen-per-lane": (
        "const int slots = max(warp_slots(x_rows, x_per_row), warp_slots(out_rows, out_cols / VEC));",
        "const int slots = max(x.slots, y.slots);"),
    "mma-region-drops-a-last-short-step": ("r.slots = (rows - row + rows_per_step - 1) / rows_per_step;",
                                           "r.slots = (rows - row) / rows_per_step;"),
    "mma-diagonal-drops-its-last-entry": ("for (int j = 1; j < 8; ++j) sum += diagonal[j * 9];",
                                          "for (int j = 1; j < 7; ++j) sum += diagonal[j * 9];"),
    "mma-input-rows-not-padded": ("xs + pad_top * kPitch + x_shift", "xs + x_shift"),
}


def run_planted_mma_problem(rng):
    """(launcher results, loops' results) of three float16 problems on the tensor-core kernel:
    * 3 images of 2 channels, 20 x 28, 5x5 SAME, multiplier 2: two k-steps, four column blocks,
      4-element chunks (7 a row: 4 rows a staging step, 20 and 22 rows end in short steps),
      slices of 2 images and 1, a NaN in out_backprop at a corner in the second slice (its checked
      sums);
    * 2 images of 3 channels, 13 x 14, 3x3 with EXPLICIT padding (1, 2) rows and (3, 0)
      columns: 15 output columns (one element a chunk), a column shift of 4 past pad_left 3;
    * 5 images of 2 channels, 14 x 14, 3x3 SAME, multiplier 2: 2-element chunks, one staging
      batch an image (the pair loop), slices of 3 images (a pair and an odd last one) and 2."""
    import cupy  # the installed HostDevice

    got, want = [], []
    for images, channels, (h, w), filt, multiplier, padding, pads, per_slice, nan in (
            (3, 2, (20, 28), 5, 2, "SAME", NO_PADS, 2, True),
            (2, 3, (13, 14), 3, 1, "EXPLICIT", ((1, 2), (3, 0)), None, False),
            (5, 2, (14, 14), 3, 2, "SAME", NO_PADS, 3, False)):
        kwargs, x, dy, case = cuda_case(rng, x_shape=(images, h, w, channels), filt_hw=(filt, filt),
                                        multiplier=multiplier, padding=padding, pads=pads, data_format="NCHW",
                                        dtype=np.float16)
        dy = dy.copy()
        if nan:
            dy[2, 0, 0, 1] = np.nan  # at the corner: TF skips the taps that meet the padding
        kwargs["out_backprop"] = to_format(dy, "NCHW").astype(np.float16)
        g = geometry_of(kwargs)
        result = cuda_launcher.depthwise_conv2d_native_backprop_filter(
            g, cupy.asarray(np.ascontiguousarray(kwargs["input"])),
            cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"])), mma=True, images_per_slice=per_slice)
        expected, _ = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), padding, (1, 1), pads)
        got.append(to_host(result).astype(np.float64).ravel())
        want.append(expected.ravel())
    want = np.concatenate(want)
    assert np.isnan(want).any() and np.isfinite(want).any()
    return np.concatenate(got), want


def assert_same_nonfinite_and_close_half(got, want):
    """Inf and NaN where the loops have them, the rest within float16's tolerance."""
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite], np.float16)


@pytest.mark.parametrize("bug", sorted(PLANTED_MMA))
def test_planted_mma_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_MMA[bug], lambda: run_planted_mma_problem(np.random.default_rng(8)),
                              assert_same_nonfinite_and_close_half, 5, tmp_path, monkeypatch)


# --------------------------------------------------------------------------- the NHWC tensor-core kernel

#: (NHWC input shape, filter, padding, explicit pads, units per slice) of the NHWC tensor-core
#: grid: one 16 x 16 tile (14 x 14, 9 x 4, 2 x 12, 13 x 9), 2 x 2 tiles (28 x 28), partial last
#: tiles (20 x 13, 17 x 30), one and two channel groups (16 and 32 channels: 16 or 8 a CTA),
#: padding past the filter (taps that meet only zeros), pad_left 0 .. 6, slices of 1, 2 and 3
#: units (across images and tiles); packed maps of at most 8 x 8 (7 x 7 SAME at 3x3 and 5x5:
#: strides 8 and 9; 5 x 7 VALID; 1 x 1; 3 x 2 with padding past the filter) with 5, 6, 4 and 9
#: images (a last unit of 1, 2 or 4).
MMA_NHWC_CASES = [((3, 14, 14, 16), 5, "SAME", None, 2), ((2, 9, 4, 16), 3, "SAME", None, None),
                  ((2, 28, 28, 16), 5, "SAME", None, 3), ((2, 20, 13, 32), 3, "VALID", None, 1),
                  ((1, 17, 30, 16), 5, "EXPLICIT", (0, 3, 6, 2), None), ((2, 2, 12, 16), 3, "EXPLICIT", (4, 1, 5, 0), 1),
                  ((3, 13, 9, 16), 5, "VALID", None, 2),
                  ((5, 7, 7, 16), 3, "SAME", None, None), ((6, 7, 7, 32), 5, "SAME", None, 1),
                  ((4, 7, 9, 16), 3, "VALID", None, None), ((9, 1, 1, 16), 5, "SAME", None, 2),
                  ((5, 3, 2, 16), 3, "EXPLICIT", (2, 1, 0, 3), None)]


def nhwc_case(rng, shape, filt, padding, pads, multiplier, dtype):
    pairs = NO_PADS if pads is None else ((pads[0], pads[1]), (pads[2], pads[3]))
    return cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=multiplier, padding=padding, pads=pairs,
                     data_format="NHWC", dtype=dtype)


@pytest.mark.parametrize("multiplier", [1, 2])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_cuda_mma_nhwc_shapes(cuda_device, rng, multiplier, dtype):
    """The NHWC tensor-core kernel against the loops and the NumPy backend over :data:`MMA_NHWC_CASES`."""
    packed = 0
    for shape, filt, padding, pads, per_slice in MMA_NHWC_CASES:
        kwargs, x, dy, case = nhwc_case(rng, shape, filt, padding, pads, multiplier, dtype)
        assert cuda_launcher.mma_nhwc_eligible(geometry_of(kwargs), np.dtype(dtype))
        packed += cuda_launcher.mma_nhwc_packed(geometry_of(kwargs))
        check_cuda(kwargs, x, dy, case, mma=True, images_per_slice=per_slice)
    assert packed == 5


def test_mma_nhwc_geometry():
    """Where the NHWC tensor-core kernel runs, its CTAs' channels and its slicing."""
    def nhwc(shape, filt=3, strides=(1, 1), multiplier=1, dilations=(1, 1)):
        kwargs, _, _, _ = cuda_case(np.random.default_rng(0), x_shape=shape, filt_hw=(filt, filt),
                                    multiplier=multiplier, padding="SAME", strides=strides, dilations=dilations,
                                    data_format="NHWC", dtype=np.float16)
        return geometry_of(kwargs)

    half, bf16 = np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)
    g = nhwc((2, 14, 14, 16))
    assert cuda_launcher.mma_nhwc_eligible(g, half) and cuda_launcher.mma_nhwc_eligible(g, bf16)
    assert cuda_launcher.mma_nhwc_chosen(g, half, 80) and not cuda_launcher.mma_nhwc_chosen(g, half, 75)
    for dtype in (np.float32, np.float64):
        assert not cuda_launcher.mma_nhwc_eligible(g, np.dtype(dtype))
    assert cuda_launcher.mma_nhwc_channels(g) == 16
    assert cuda_launcher.mma_nhwc_channels(nhwc((2, 14, 14, 8), multiplier=2)) == 8
    assert cuda_launcher.mma_nhwc_eligible(nhwc((2, 14, 14, 8), multiplier=2), half)
    assert cuda_launcher.mma_nhwc_eligible(nhwc((2, 9, 2, 16)), half)
    for other in (nhwc((2, 14, 14, 8)), nhwc((2, 14, 14, 16), strides=(2, 2)), nhwc((2, 14, 14, 16), filt=4),
                  nhwc((2, 14, 14, 16), multiplier=3), nhwc((2, 14, 14, 16), dilations=(2, 2)),
                  nhwc((2, 8, 8, 16))):  # 8 x 8 SAME: a stride of 9, 17 rows
        assert not cuda_launcher.mma_nhwc_eligible(other, half)
    assert cuda_launcher.mma_nhwc_tiles(nhwc((2, 28, 33, 16))) == (2, 3)
    assert cuda_launcher.mma_nhwc_units(nhwc((2, 28, 33, 16))) == 12
    # Packed: 7 x 7 SAME, strides 8 (3x3: pad 1 + 7 rows) and 9 (5x5: pad 2 + 7; 7 + 4 - 2); 4 images a unit.
    assert cuda_launcher.mma_nhwc_packed(nhwc((2, 7, 7, 16))) and not cuda_launcher.mma_nhwc_packed(nhwc((2, 9, 2, 16)))
    assert cuda_launcher.mma_nhwc_pack_stride(nhwc((2, 7, 7, 16))) == 8
    assert cuda_launcher.mma_nhwc_pack_stride(nhwc((2, 7, 7, 16), filt=5)) == 9
    assert cuda_launcher.mma_nhwc_pack_stride(nhwc((2, 8, 8, 16))) is None
    assert cuda_launcher.mma_nhwc_units(nhwc((9, 7, 7, 16))) == 3 and cuda_launcher.mma_nhwc_tiles(
        nhwc((9, 7, 7, 16))) == (1, 1)
    assert cuda_launcher.mma_nhwc_slicing(nhwc((32, 7, 7, 960))) == (2, 4)
    # 32 images of 14 x 14 x 480: 30 channel groups, 32 units; about 512 CTAs, 4 units a slice at least.
    assert cuda_launcher.mma_nhwc_slicing(nhwc((32, 14, 14, 480))) == (8, 4)
    assert cuda_launcher.mma_nhwc_slicing(nhwc((32, 56, 56, 144))) == (57, 9)
    assert cuda_launcher.mma_nhwc_slicing(nhwc((1, 9, 9, 16))) == (1, 1)
    with pytest.raises(ValueError, match="mma kernel cannot run"):
        cuda_launcher.pick_mma_nhwc(nhwc((2, 14, 14, 8)), half, (), True)


def test_cuda_mma_nhwc_is_the_default_and_alignment_decides(cuda_device):
    """The public call takes the NHWC tensor-core kernel for aligned half arrays (on the host
    stand-in: sm_90) and the tiled kernel for a misaligned view, with close results."""
    import cupy

    rng = np.random.default_rng(21)
    kwargs, x, dy, case = nhwc_case(rng, (3, 14, 14, 16), 3, "SAME", None, 2, np.float16)
    x_gpu = cupy.asarray(np.ascontiguousarray(kwargs["input"]))
    dy_gpu = cupy.asarray(np.ascontiguousarray(kwargs["out_backprop"]))
    before = len(cuda_device.launches) if cuda_device is not None else 0
    gradops.depthwise_conv2d_native_backprop_filter(**dict(kwargs, input=x_gpu, out_backprop=dy_gpu), backend="cuda")
    if cuda_device is not None:
        assert cuda_device.launches[before][0] == \
            "gradops::depthwise_conv2d_native_backprop_filter_mma_nhwc<__half, 3, 2, false>"
    shifted = misaligned_on_gpu(kwargs["input"])
    assert not cuda_launcher.mma_nhwc_possible(geometry_of(kwargs), np.float16, (shifted, dy_gpu))
    before = len(cuda_device.launches) if cuda_device is not None else 0
    gradops.depthwise_conv2d_native_backprop_filter(**dict(kwargs, input=shifted, out_backprop=dy_gpu),
                                                    backend="cuda")
    if cuda_device is not None:
        assert "_mma_nhwc<" not in cuda_device.launches[before][0]
    check_cuda(kwargs, x, dy, case)


#: Slot order of the NHWC tensor-core kernel's staging planted chunk-major (every pair's chunk 0,
#: then every chunk 1), as it was until the H200 measured its loads at 50% excess sectors.
PLANTED_MMA_NHWC_CHUNK_MAJOR = ("""        chunk = CHUNKS == 1 ? 0 : e % 2;
        const int pair = CHUNKS == 1 ? e : e / 2;""", """        chunk = CHUNKS == 1 ? 0 : e / (SIDE * SIDE / 2);
        const int pair = CHUNKS == 1 ? e : e % (SIDE * SIDE / 2);""")


@pytest.mark.parametrize("filt", [3, 5])
@pytest.mark.parametrize("chunk_major", [False, True], ids=["chunk-fastest", "planted-chunk-major"])
def test_mma_nhwc_staging_loads_fill_whole_sectors(monkeypatch, tmp_path, filt, chunk_major):
    """The NHWC tensor-core kernel's 16-byte staging loads (multiplier 1: a position's 16 channels
    are one 32-byte sector of the CTA's) touch only whole sectors: neighbouring lanes load the two
    halves of a sector in one instruction.  Counted by the execution model per warp-level load
    (tests/cuda_host_runtime.h, count_global_load) on one interior unit: VALID padding on a (16 +
    K - 1)-square image of 32 channels (64-byte positions, two CTAs), so that every lane makes
    every load.  Planted chunk-major slots load half of each sector per instruction: twice the
    sectors, with the same (right) result."""
    import cuda_host

    edit = PLANTED_MMA_NHWC_CHUNK_MAJOR if chunk_major else None
    device = cuda_host.planted_host_device(tmp_path, cuda_launcher.SOURCE, edit).install(monkeypatch)
    expression = cuda_launcher._mma_nhwc_expression(np.dtype(np.float16), filt, 1, False)
    kernels = device.host_kernels(cuda_launcher.SOURCE, expression)
    kernels.count_global_loads(True)
    try:
        kwargs, x, dy, case = nhwc_case(np.random.default_rng(8), (1, 15 + filt, 15 + filt, 32), filt, "VALID", None, 1,
                                        np.float16)
        check_cuda(kwargs, x, dy, case, mma=True)
        assert device.launches[0][0] == expression
        loads = kernels.global_load_stats()
    finally:
        kernels.count_global_loads(False)
    # Per CTA (256 threads): input slots 2 (16 + K - 1)^2 / 2, out_backprop slots 256, two loads
    # each; the last input slot's warp-level loads with fewer than 32 lanes are not counted.
    input_slots = (15 + filt) ** 2
    counted = 2 * 2 * (input_slots // 32 + 256 // 32)
    assert loads["accesses"] == counted, loads
    assert loads["ideal"] == 16 * loads["accesses"], loads  # 32 lanes x 16 bytes
    assert loads["sectors"] == (2 if chunk_major else 1) * loads["ideal"], loads


#: The tiled kernel's swizzle of its staged tile planted off (half types stage in channel order).
PLANTED_TILED_NO_SWIZZLE = ("constexpr bool SWIZZLE = sizeof(T) == 2 && !ASYNC && !(K == 5 && S == 2);",
                            "constexpr bool SWIZZLE = false;")


@pytest.mark.parametrize("dtype,stride,multiplier,planted,ratio", [
    (np.float16, 2, 1, False, 1), (ml_dtypes.bfloat16, 1, 1, False, 1), (np.float16, 2, 2, False, 2),
    (np.float32, 2, 1, False, 1), (np.float16, 2, 1, True, 2), (np.float16, 2, 2, True, 4)],
    ids=["float16-m1", "bfloat16-stride-1", "float16-m2", "float32-m1", "planted-unswizzled-m1",
         "planted-unswizzled-m2"])
def test_tiled_staging_stores_bank_wavefronts(tmp_path, monkeypatch, dtype, stride, multiplier, planted, ratio):
    """The NHWC tiled kernel's 16-byte staging stores, counted by the execution model per
    warp-level store (tests/cuda_host_runtime.h, count_access), take the fewest bank wavefronts
    at multiplier 1 and twice that at multiplier 2 (a quarter-warp's four positions on two bank
    halves) for half types, swizzled; planted unswizzled they take twice that (the two positions
    of a quarter-warp, four at multiplier 2, on the same banks), with the same, right result.
    Float32 at multiplier 1 (one 16-byte store a lane) needs no swizzle."""
    import cuda_host

    edit = PLANTED_TILED_NO_SWIZZLE if planted else None
    device = cuda_host.planted_host_device(tmp_path, cuda_launcher.SOURCE, edit).install(monkeypatch)
    expression = cuda_launcher._tiled_expression(np.dtype(dtype), 3, stride, 4)
    kernels = device.host_kernels(cuda_launcher.SOURCE, expression)
    kernels.shared_stats(reset=True, kind="store")
    kwargs, x, dy, case = cuda_case(np.random.default_rng(12), x_shape=(2, 9, 34, 32), filt_hw=(3, 3),
                                    multiplier=multiplier, padding="SAME", strides=(stride, stride),
                                    data_format="NHWC", dtype=dtype)
    check_cuda(kwargs, x, dy, case, tiled=True, items_across=4)
    assert any(launch[0] == expression for launch in device.launches), device.launches
    stores = kernels.shared_stats(kind="store")
    assert stores["accesses"] > 0 and stores["ideal"] == 4 * stores["accesses"], stores
    assert stores["wavefronts"] == ratio * stores["ideal"], stores


def mma_nhwc_nonfinite_problem(dtype=np.float16):
    """(kwargs, loops' result) of a SAME 5x5 problem on 2 images of 16 channels, 9 x 10: an Inf
    in the input next to the padding (channel 0, image 0), a NaN in out_backprop at the corner
    (channel 9, image 1: that slice alone is checked with one unit a slice) and, in bfloat16,
    finite values whose products pass float's range (channel 3)."""
    x = np.ones((2, 9, 10, 16), np.float32)
    dy = np.ones((2, 9, 10, 16), np.float32)
    x[0, 0, 3, 0] = np.inf
    dy[1, 0, 0, 9] = np.nan
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        x[1, 4, 4, 3] = 3e38
        dy[1, 5, 5, 3] = 2.0
    x, dy = x.astype(dtype), dy.astype(dtype)
    kwargs = dict(input=x, filter_sizes=np.array([5, 5, 16, 1], np.int32), out_backprop=dy, strides=[1, 1, 1, 1],
                  padding="SAME", explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1])
    want, _ = expected_grad(x.astype(np.float64), (5, 5, 16, 1), dy.astype(np.float64), (1, 1), "SAME", (1, 1),
                            NO_PADS)
    return kwargs, want


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_cuda_mma_nhwc_nonfinite_values_meet_no_padding(cuda_device, dtype):
    """Inf and NaN reach exactly the taps TF's loops give them: the warps whose accumulators
    are not finite recompute their channel's partial sums on the CUDA cores."""
    kwargs, want = mma_nhwc_nonfinite_problem(dtype)
    g = geometry_of(kwargs)
    got = to_host(cuda_launcher.depthwise_conv2d_native_backprop_filter(
        g, to_gpu(kwargs["input"]), to_gpu(kwargs["out_backprop"]), mma=True, images_per_slice=1))
    if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        want = np.where(np.abs(want) > 3.4e38, np.inf * np.sign(want), want)
    assert np.isnan(want).any() and np.isinf(want).any()
    assert_same_nonfinite_and_close(got.astype(np.float64), want)


# Not planted: the packed form's test for images past the batch.  Without it the loads read past
# the arrays, where the host model's guard bytes are NaN: the warps take their checked sums and
# the result is right (a GPU's compute-sanitizer memcheck must show those reads).
# Not planted: the barrier between a unit's stores and its products.  The host model runs every
# thread of a block up to its warp's first ldmatrix before that collective returns, so all the
# stores are done whether the barrier is there or not (tried: the comparison passed).
PLANTED_MMA_NHWC = {  # bugs in the NHWC tensor-core kernel: name -> (text of the real source, its replacement)
    "nhwc-diagonal-not-offset": ("sum += sums[lane * 8 + j * 9];", "sum += sums[lane * 8 + j * 8];"),
    "nhwc-input-tile-ignores-pad-left": ("* in_cols + q0 - pad_left) * in_depth + c0,", "* in_cols + q0) * in_depth + c0,"),
    "nhwc-input-columns-unbounded": ("y < in_rows && x >= 0 && x < in_cols && (!PACKED", "y < in_rows && x >= 0 && (!PACKED"),
    "nhwc-rows-past-the-output-loaded": ("if (slot && u.p0 + p < out_rows && ", "if (slot && "),
    "nhwc-second-chunk-ignored": ("(p * out_cols + at.col) * out_depth + 8 * at.chunk;",
                                  "(p * out_cols + at.col) * out_depth;"),
    "nhwc-second-input-chunk-to-the-first-planes": ("unsigned* const dst = stage + 8 * at.chunk * CHANNEL_WORDS",
                                                    "unsigned* const dst = stage"),
    "nhwc-multiplier-planes-swapped": ("dst[k / M * CHANNEL_WORDS + k % M * Y_WORDS] = dwconv::pair_word(raw_y[i], j);",
                                       "dst[k % M * CHANNEL_WORDS + k / M * Y_WORDS] = dwconv::pair_word(raw_y[i], j);"),
    "nhwc-pair-halves-swapped": ("dst[j * CHANNEL_WORDS] = dwconv::pair_word(raw_x[i], j);",
                                 "dst[j * CHANNEL_WORDS] = __byte_perm(dwconv::pair_word(raw_x[i], j), 0u, 0x1032u);"),
    "nhwc-first-unit-not-loaded": ("if (first < stop) load_next(raw_x, raw_y);", ""),
    "nhwc-prefetch-skips-the-advance": ("            tile_col = 0;\n            if (++tile_row == tiles_down) {",
                                        "            tile_col = 0;\n            if (tile_row == tiles_down) {"),
    "nhwc-second-column-block-skipped": ("St::Y_ELEMENTS, kTile / 8>", "St::Y_ELEMENTS, 1>"),
    "nhwc-warp-second-channel-skipped": ("for (int h = 0; h < CW; ++h) {\n            const T* const xs",
                                         "for (int h = 0; h < 1; ++h) {\n            const T* const xs"),
    "nhwc-slice-runs-one-unit-short": (", stop = min(units, first + units_per_slice);",
                                       ", stop = min(units, first + units_per_slice - 1);"),
    "nhwc-checked-sums-keep-padding": ("if (in_col < 0 || in_col >= in_cols) continue;", ""),
    "nhwc-packed-second-block-not-shifted": ("PACKED && at >= pack_stride ? 1 : 0;", "0;"),
    "nhwc-packed-checked-sums-of-one-image": ("image < min(batch, image0 + IMAGES); ++image",
                                              "image < min(batch, image0 + 1); ++image"),
    "nhwc-one-channel-decides-the-checked-sums": ("finite = dwfmma::warp_sums_finite(acc[h]) && finite;",
                                                  "finite = dwfmma::warp_sums_finite(acc[0]);"),
}


def run_planted_mma_nhwc_problem(rng):
    """(launcher results, loops' results) of three float16 problems on the NHWC tensor-core kernel:
    * 3 images of 16 channels, 20 x 13, 5x5 SAME, multiplier 2 (two CTAs of 8 channels): two
      tiles down (the second 4 rows deep), slices of 2 units across images, a NaN in
      out_backprop at a corner in the second slice (its checked sums);
    * 2 images of 16 channels, 9 x 10, 3x3 with EXPLICIT padding (1, 2) rows and (3, 0) columns,
      multiplier 1 (one CTA, two channels a warp, an Inf in channel 3's last input column: its
      warp's second channel is checked), padding past the filter;
    * 2 images of 16 channels, 28 x 30, 3x3 SAME: 2 x 2 tiles, both of the last ones partial,
      slices of 3 units;
    * 7 images of 16 channels, 7 x 7, 5x5 SAME, multiplier 1: packed (2 units, the second of 3
      images), one unit a slice, a NaN in out_backprop's last image at a corner (the second
      slice's checked sums)."""
    import cupy  # the installed HostDevice

    got, want = [], []
    for shape, filt, multiplier, padding, pads, per_slice, nan in (
            ((3, 20, 13, 16), 5, 2, "SAME", NO_PADS, 2, "dy"),
            ((2, 9, 10, 16), 3, 1, "EXPLICIT", ((1, 2), (3, 0)), None, "x"),
            ((2, 28, 30, 16), 3, 1, "SAME", NO_PADS, 3, None),
            ((7, 7, 7, 16), 5, 1, "SAME", NO_PADS, 1, "dy last")):
        kwargs, x, dy, case = cuda_case(rng, x_shape=shape, filt_hw=(filt, filt), multiplier=multiplier,
                                        padding=padding, pads=pads, data_format="NHWC", dtype=np.float16)
        x, dy = x.copy(), dy.copy()
        if nan == "dy":
            dy[1, 0, 0, 5] = np.nan  # units 2 and 3 (image 1): the second slice
        if nan == "dy last":
            dy[6, 0, 0, 2] = np.nan
        if nan == "x":
            x[1, 4, 9, 3] = np.inf  # the last column: on the diagonals it meets out_backprop zeros past the output
        kwargs["input"], kwargs["out_backprop"] = x.astype(np.float16), dy.astype(np.float16)
        result = cuda_launcher.depthwise_conv2d_native_backprop_filter(
            geometry_of(kwargs), cupy.asarray(kwargs["input"]), cupy.asarray(kwargs["out_backprop"]), mma=True,
            images_per_slice=per_slice)
        expected, _ = expected_grad(x, tuple(kwargs["filter_sizes"]), dy, (1, 1), padding, (1, 1), pads)
        got.append(to_host(result).astype(np.float64).ravel())
        want.append(expected.ravel())
    want = np.concatenate(want)
    assert np.isnan(want).any() and np.isfinite(want).any()
    return np.concatenate(got), want


@pytest.mark.parametrize("bug", sorted(PLANTED_MMA_NHWC))
def test_planted_mma_nhwc_kernel_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    assert_planted_bug_caught(PLANTED_MMA_NHWC[bug], lambda: run_planted_mma_nhwc_problem(np.random.default_rng(9)),
                              assert_same_nonfinite_and_close_half, 5, tmp_path, monkeypatch)


#: Barriers whose removal the comparisons above cannot see (the host runs a thread until its
#: next barrier, and the emulated ldmatrix / mma.sync are warp barriers, so every order the
#: model tries happens to be a safe one) and racecheck builds can: (kernel runner, edit).
RACECHECK_PLANTED = {
    "mma-pair-loop-no-barrier-before-the-second-image": (
        "run_planted_mma_problem",
        ("            __syncwarp();  // every lane is done with this image's stage\n            if (second) {",
         "            if (second) {")),
    "mma-nhwc-no-barrier-after-staging": (
        "run_planted_mma_nhwc_problem",
        ("        store_unit<K, M>(stage, tid, raw_x, raw_y);\n        __syncthreads();\n",
         "        store_unit<K, M>(stage, tid, raw_x, raw_y);\n")),
}


@pytest.mark.parametrize("bug", sorted(RACECHECK_PLANTED))
def test_planted_barrier_bugs_only_racecheck_catches(bug, tmp_path, monkeypatch):
    """A missing barrier that leaves the results right on the host model (a GPU would race)
    passes the comparison there and fails the launch in a racecheck build."""
    import cuda_host

    runner, edit = RACECHECK_PLANTED[bug]

    def run():
        assert_same_nonfinite_and_close_half(*globals()[runner](np.random.default_rng(9)))

    cuda_host.assert_only_racecheck_catches(cuda_launcher.SOURCE, edit, run,
                                            "racecheck: .* hazard on __shared__ .*::stage", 5, tmp_path, monkeypatch)

