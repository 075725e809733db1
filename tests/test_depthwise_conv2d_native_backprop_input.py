"""gradops.depthwise_conv2d_native_backprop_input against brute-force loops, adjointness and TF."""

from __future__ import annotations

import contextlib

import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gradops
from conftest import FLOAT_DTYPES, FOREIGN_GPU_WRAPPERS, RTOL, assert_close, random_array, to_gpu, to_host
from conv_cases import from_layout
from depthwise_cases import (DTYPE_IDS, NO_PADS, adjoint_args, adjoint_grid, attr4, depthwise_cases, explicit8,
                             geometry_grid, out_hw, padding_format_dtype_grid, to_format)
from reference import conv2d, conv2d_backprop_input, depthwise_to_hwio


# --------------------------------------------------------------------------- helpers


def expected_grad(x_shape, w, dy, strides, padding, dilations, pads):
    """Reference input gradient (NHWC float64) and its error scale max(sum |terms|)."""
    hwio = depthwise_to_hwio(w.astype(np.float64))
    dy64 = dy.astype(np.float64)
    ref = conv2d_backprop_input(x_shape, hwio, dy64, strides, padding, dilations, pads)
    mag = conv2d_backprop_input(x_shape, np.abs(hwio), np.abs(dy64), strides, padding, dilations, pads)
    return ref, max(1.0, float(mag.max()) if mag.size else 1.0)


def run_case(rng, *, x_shape, filt_hw, multiplier, strides=(1, 1), dilations=(1, 1), padding="VALID",
             pads=NO_PADS, data_format="NHWC", dtype=np.float64):
    """Call gradops on random data (NHWC shapes given, converted to data_format) and check the reference."""
    n, h, w_, c = x_shape
    oh, ow = out_hw((h, w_), filt_hw, strides, dilations, padding, pads)
    w = random_array(rng, (*filt_hw, c, multiplier), dtype)
    dy = random_array(rng, (n, oh, ow, c * multiplier), dtype)
    got = gradops.depthwise_conv2d_native_backprop_input(
        np.array(to_format(x_shape, data_format)), w, to_format(dy, data_format),
        attr4(*strides, data_format), padding,
        explicit8(pads, data_format) if padding == "EXPLICIT" else [],
        data_format, attr4(*dilations, data_format))
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype)
    ref, scale = expected_grad(x_shape, w, dy, strides, padding, dilations, pads)
    assert_close(got, to_format(ref, data_format), dtype, scale)
    return got


# --------------------------------------------------------------------------- grids


@geometry_grid
def test_geometry_grid(rng, filt_hw, strides, dilations, padding, pads):
    """Every filter size x stride x dilation x padding combination matches the loop reference."""
    x_shape = (1, 6, 7, 2) if filt_hw != (5, 5) else (1, 9, 10, 2)  # VALID with 5x5 dil 2 needs 9 rows
    run_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=2, strides=strides, dilations=dilations,
             padding=padding, pads=pads)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3, 4], ids=lambda m: f"M{m}")
def test_multiplier_format_dtype_grid(rng, multiplier, data_format, dtype):
    """Channel multipliers 1-4 in both layouts and all float dtypes match the reference."""
    run_case(rng, x_shape=(2, 5, 4, 3), filt_hw=(3, 2), multiplier=multiplier, strides=(2, 1),
             dilations=(1, 2), padding="SAME", data_format=data_format, dtype=dtype)


@padding_format_dtype_grid
def test_padding_format_dtype_grid(rng, padding, pads, data_format, dtype):
    """VALID and asymmetric EXPLICIT padding in both layouts and all float dtypes match the reference."""
    run_case(rng, x_shape=(1, 6, 5, 2), filt_hw=(3, 3), multiplier=3, strides=(1, 2), dilations=(2, 1),
             padding=padding, pads=pads, data_format=data_format, dtype=dtype)


def test_channel_multiplier_mapping():
    """Output channel c*M+m is read through filter[:, :, c, m] from input channel c (one hot tap)."""
    c_, m_ = 3, 2
    w = np.zeros((1, 1, c_, m_))
    w[0, 0, 2, 1] = 5.0  # only output channel 2*2+1 = 5 sees input channel 2
    dy = np.zeros((1, 2, 2, c_ * m_))
    dy[..., 5] = 1.0
    dy[..., 4] = 100.0  # channel 4 = (c=2, m=0) has a zero filter: must not leak
    got = gradops.depthwise_conv2d_native_backprop_input([1, 2, 2, c_], w, dy, [1, 1, 1, 1], "VALID")
    expected = np.zeros((1, 2, 2, c_))
    expected[..., 2] = 5.0
    np.testing.assert_array_equal(got, expected)


def test_golden_example():
    """A hand-computed 1-D-like case: 1x3 input, 1x2 filter, VALID, multiplier 1.

    forward: y0 = x0*w0 + x1*w1, y1 = x1*w0 + x2*w1, with w = [2, 3] and dy = [1, 10]:
    dx0 = dy0*w0 = 2, dx1 = dy0*w1 + dy1*w0 = 3 + 20 = 23, dx2 = dy1*w1 = 30.
    """
    w = np.array([2.0, 3.0]).reshape(1, 2, 1, 1)
    dy = np.array([1.0, 10.0]).reshape(1, 1, 2, 1)
    got = gradops.depthwise_conv2d_native_backprop_input([1, 1, 3, 1], w, dy, [1, 1, 1, 1], "VALID")
    np.testing.assert_array_equal(got.ravel(), [2.0, 23.0, 30.0])


# --------------------------------------------------------------------------- adjoint identity


@adjoint_grid
def test_adjoint_identity(rng, padding, pads, data_format):
    """<conv(x, w), dy> == <x, backprop_input(x.shape, w, dy)> in float64."""
    x = rng.standard_normal(to_format((2, 7, 6, 3), data_format))
    w = rng.standard_normal((3, 2, 3, 2))
    args = adjoint_args(padding, pads, data_format)
    y = gradops.depthwise_conv2d_native(x, w, **args)
    x_nhwc = x if data_format == "NHWC" else x.transpose(0, 2, 3, 1)
    ref_y = conv2d(x_nhwc, depthwise_to_hwio(w), (2, 1), padding, (1, 2), pads)
    assert_close(y, to_format(ref_y, data_format), np.float64)  # the forward op itself is right
    dy = rng.standard_normal(y.shape)
    dx = gradops.depthwise_conv2d_native_backprop_input(np.array(x.shape), w, dy, **args)
    lhs, rhs = float(np.sum(y * dy)), float(np.sum(x * dx))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, float(np.sum(np.abs(y * dy))))


# --------------------------------------------------------------------------- hypothesis


@settings(max_examples=60, deadline=None)
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1))
def test_property_matches_reference(case, seed):
    """Random shapes, strides, dilations, paddings, layouts and dtypes all match the loop reference."""
    run_case(np.random.default_rng(seed), **case)


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape,multiplier", [((0, 4, 4, 2), 2), ((1, 4, 4, 0), 2), ((2, 4, 4, 2), 0)],
                         ids=["batch0", "depth0", "multiplier0"])
def test_empty_tensors(x_shape, multiplier, dtype):
    """Empty batch, depth or multiplier gives zeros of the input shape and dtype."""
    n, h, w, c = x_shape
    filt = np.ones((3, 3, c, multiplier), dtype)
    dy = np.ones((n, h, w, c * multiplier), dtype)
    got = gradops.depthwise_conv2d_native_backprop_input(list(x_shape), filt, dy, [1, 1, 1, 1], "SAME")
    assert isinstance(got, np.ndarray)
    assert got.shape == x_shape and got.dtype == np.dtype(dtype)
    assert not np.any(got.astype(np.float64))


def test_dilations_are_honoured(rng):
    """dilations [1,2,2,1] differ from [1,1,1,1] and match the dilated reference (TF ignores them)."""
    w = rng.standard_normal((3, 3, 2, 2))
    dy = rng.standard_normal((1, 7, 7, 4))
    plain = gradops.depthwise_conv2d_native_backprop_input([1, 7, 7, 2], w, dy, [1, 1, 1, 1], "SAME")
    dilated = gradops.depthwise_conv2d_native_backprop_input([1, 7, 7, 2], w, dy, [1, 1, 1, 1], "SAME",
                                                             dilations=[1, 2, 2, 1])
    assert not np.allclose(plain, dilated)
    ref, scale = expected_grad((1, 7, 7, 2), w, dy, (1, 1), "SAME", (2, 2), NO_PADS)
    assert_close(dilated, ref, np.float64, scale)


def test_keyword_arguments_with_tf_names(rng):
    """All arguments can be passed by TF's names, in any order, including explicit_paddings."""
    w = rng.standard_normal((2, 2, 2, 1)).astype(np.float32)
    dy = rng.standard_normal((1, 2, 4, 2)).astype(np.float32)
    got = gradops.depthwise_conv2d_native_backprop_input(
        dilations=[1, 1, 1, 1], data_format="NCHW", explicit_paddings=[0, 0, 0, 0, 1, 0, 0, 1],
        padding="EXPLICIT", strides=[1, 1, 2, 1], out_backprop=dy.transpose(0, 3, 1, 2), filter=w,
        input_sizes=np.array([1, 2, 3, 4], np.int32))
    assert type(got) is np.ndarray and got.dtype == np.float32 and got.shape == (1, 2, 3, 4)
    ref, scale = expected_grad((1, 3, 4, 2), w, dy, (2, 1), "EXPLICIT", (1, 1), ((1, 0), (0, 1)))
    assert_close(got, ref.transpose(0, 3, 1, 2), np.float32, scale)


@pytest.mark.parametrize("kwargs,word", [
    (dict(input_sizes=[4, 4]), "input_sizes"),
    (dict(input_sizes=[1, 4, 4, 3]), "in_depth"),
    (dict(strides=[2, 1, 1, 1]), "strides"),
    (dict(dilations=[1, 1, 1, 2]), "dilations"),
    (dict(padding="EXPLICIT"), "explicit_paddings"),
    (dict(out_backprop=np.zeros((1, 3, 4, 4))), "rows"),
], ids=["sizes_len2", "depth_mismatch", "batch_stride", "depth_dilation", "explicit_missing", "bad_out_rows"])
def test_invalid_arguments(kwargs, word):
    """Malformed calls raise InvalidArgumentError naming the offending argument."""
    args = dict(input_sizes=[1, 4, 4, 2], filter=np.zeros((3, 3, 2, 2)), out_backprop=np.zeros((1, 4, 4, 4)),
                strides=[1, 1, 1, 1], padding="SAME")
    args.update(kwargs)
    with pytest.raises(gradops.InvalidArgumentError, match=word):
        gradops.depthwise_conv2d_native_backprop_input(**args)


# --------------------------------------------------------------------------- TensorFlow parity


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 0), (2, 1)))],
                         ids=["SAME", "VALID", "EXPLICIT"])
@pytest.mark.parametrize("stride", [1, 2], ids=["s1", "s2"])
def test_matches_tensorflow(tf, rng, stride, padding, pads, dtype):
    """TF's DepthwiseConv2dNativeBackpropInput (NHWC, equal strides, no dilation) agrees."""
    x_shape, multiplier = (2, 7, 6, 3), 2
    oh, ow = out_hw(x_shape[1:3], (3, 3), (stride, stride), (1, 1), padding, pads)
    w = random_array(rng, (3, 3, 3, multiplier), dtype)
    dy = random_array(rng, (2, oh, ow, 3 * multiplier), dtype)
    args = dict(strides=[1, stride, stride, 1], padding=padding,
                explicit_paddings=explicit8(pads, "NHWC") if padding == "EXPLICIT" else [])
    tf_dtype = tf.bfloat16 if np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16) else tf.as_dtype(dtype)
    expected = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=tf.constant(x_shape, tf.int32), filter=tf.constant(w, tf_dtype),
        out_backprop=tf.constant(dy, tf_dtype), **args).numpy()
    got = gradops.depthwise_conv2d_native_backprop_input(np.array(x_shape), w, dy, **args)
    assert got.dtype == np.dtype(dtype)
    _, scale = expected_grad(x_shape, w, dy, (stride, stride), padding, (1, 1), pads)
    # TF itself rounds (it may accumulate half types in half), so allow two roundings' worth.
    assert_close(got, expected.astype(np.float64), dtype, 2 * scale)


# --------------------------------------------------------------------------- CUDA kernel
#
# The kernel source runs twice: on the CPU (compiled by g++ through tests/cuda_host.py, so its
# index math is checked on every machine) and, with @pytest.mark.gpu, through CuPy on a GPU.
# Both compare against the brute-force loops (via expected_grad) or the NumPy backend.

import importlib  # noqa: E402

import cuda_host  # noqa: E402
from gradops._geometry import conv2d_geometry  # noqa: E402
from gradops.backends.cuda import _layout  # noqa: E402

cuda_launcher = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
OP = "depthwise_conv2d_native_backprop_input"

CUDA_GEOMETRIES = [  # (filt_hw, strides, dilations): every specialisation and the generic kernel
    ((3, 3), (1, 1), (1, 1)), ((3, 3), (2, 2), (1, 1)), ((5, 5), (1, 1), (1, 1)), ((5, 5), (2, 2), (1, 1)),
    ((3, 3), (1, 1), (2, 2)), ((5, 5), (2, 2), (2, 1)), ((3, 3), (1, 2), (1, 1)), ((3, 3), (2, 1), (1, 2)),
    ((1, 1), (1, 1), (1, 1)), ((1, 1), (3, 2), (1, 1)), ((3, 2), (2, 3), (2, 1)), ((4, 5), (3, 3), (2, 2)),
    ((2, 2), (2, 2), (3, 3)), ((7, 1), (1, 1), (1, 1)),
]
CUDA_X_SHAPE = (2, 11, 10, 2)  # odd rows; every geometry below has outputs at every padding
CUDA_GEOMETRY_IDS = [f"f{f[0]}x{f[1]}-s{s[0]}x{s[1]}-d{d[0]}x{d[1]}" for f, s, d in CUDA_GEOMETRIES]
CUDA_PADDINGS = [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3))),
                 ("EXPLICIT", ((0, 5), (4, 0)))]
CUDA_PADDING_IDS = ["SAME", "VALID", "EXPLICIT", "EXPLICIT_wide"]


def case_kwargs(rng, *, x_shape, filt_hw, multiplier, strides=(1, 1), dilations=(1, 1), padding="VALID",
                pads=NO_PADS, data_format="NHWC", dtype=np.float64):
    """Random filter and out_backprop for an NHWC-described case, as gradops' keyword arguments
    (tensors in ``data_format``), without a reference: for tests that need only the call or its
    geometry (the brute-force reference takes seconds on the larger shapes)."""
    n, h, w_, c = x_shape
    oh, ow = out_hw((h, w_), filt_hw, strides, dilations, padding, pads)
    w = random_array(rng, (*filt_hw, c, multiplier), dtype)
    dy = random_array(rng, (n, oh, ow, c * multiplier), dtype)
    return dict(input_sizes=np.array(to_format(x_shape, data_format)), filter=w,
                out_backprop=np.ascontiguousarray(to_format(dy, data_format)),
                strides=attr4(*strides, data_format), padding=padding,
                explicit_paddings=explicit8(pads, data_format) if padding == "EXPLICIT" else [],
                data_format=data_format, dilations=attr4(*dilations, data_format))


def make_case(rng, *, x_shape, filt_hw, multiplier, strides=(1, 1), dilations=(1, 1), padding="VALID",
              pads=NO_PADS, data_format="NHWC", dtype=np.float64):
    """:func:`case_kwargs` (the same draws) with the float64 reference (in ``data_format``) and
    its scale."""
    kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, strides=strides,
                         dilations=dilations, padding=padding, pads=pads, data_format=data_format, dtype=dtype)
    ref, scale = expected_grad(x_shape, kwargs["filter"], from_layout(kwargs["out_backprop"], data_format), strides,
                               padding, dilations, pads)
    return kwargs, to_format(ref, data_format), scale


def geometry_of(kwargs):
    """The validated geometry of a make_case call (what the launcher receives)."""
    return conv2d_geometry(OP, tuple(kwargs["input_sizes"]), kwargs["filter"].shape, kwargs["out_backprop"].shape,
                           kwargs["strides"], kwargs["padding"], kwargs["explicit_paddings"],
                           kwargs["data_format"], kwargs["dilations"], depthwise=True)


@pytest.fixture(scope="module")
def host_kernels():
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel source for the host: {reason}")
    return cuda_host.HostKernels(cuda_launcher.SOURCE, cuda_launcher.instantiations()[cuda_launcher.SOURCE])


def run_on_host(kernels, kwargs):
    """The launcher's instantiation and arguments, run on the CPU; unwritten elements stay NaN."""
    g = geometry_of(kwargs)
    dtype = kwargs["out_backprop"].dtype
    grad = np.full(g.input_shape, np.nan, dtype)
    expression = cuda_launcher._expression(dtype, g.data_format, cuda_launcher.specialisation(g))
    kernels.run(expression, [np.ascontiguousarray(kwargs["filter"]), kwargs["out_backprop"], grad],
                cuda_launcher.kernel_scalars(g))
    return grad


def test_instantiations_cover_every_launch():
    """Every dtype x layout x (specialisation or generic) the launcher can pick is instantiated,
    for the direct kernel, every dtype x layout x specialisation for the tiled one, each half
    type x filter x multiplier x form (rows, whole planes, packed images) for the tensor-core one and each half
    type x filter x multiplier for the NHWC tensor-core one, and each dtype x filter x stride for the
    planes one (NCHW only; and its staged form at stride 2), and the batched transpose per element
    width and index type; none twice."""
    names = cuda_launcher.instantiations()[cuda_launcher.SOURCE]
    listed = set(names)
    assert len(names) == len(listed)
    mma = (len(cuda_launcher.MMA_DTYPES) * len(cuda_launcher.MMA_FILTERS) * len(cuda_launcher.MMA_MULTIPLIERS)
           * len(cuda_launcher.MMA_FORMS))
    mma += len(cuda_launcher.MMA_DTYPES) * len(cuda_launcher.MMA_FILTERS) * len(cuda_launcher.MMA_MULTIPLIERS)  # NHWC
    planes = 4 * len(cuda_launcher.PLANES_FILTERS) * (len(cuda_launcher.PLANES_STRIDES)
                                                      + len(cuda_launcher.PLANES_STAGED_STRIDES))  # staged forms
    transposes = 3 * 2 + 2  # 2-, 4- and 8-byte elements and 16-bit pairs, int and long long indices
    assert len(listed) == 4 * 2 * (2 * len(cuda_launcher.SPECIALISATIONS) + 1 + len(cuda_launcher.SHORT_TILES)
                                   + len(cuda_launcher.NARROW_TILES)) + mma + planes + transposes
    for index in ("int", "long long"):
        assert _layout.pairs_expression(index) in listed
        for itemsize in (2, 4, 8):
            assert _layout.expression(itemsize, index) in listed
    for dtype in FLOAT_DTYPES:
        for k in cuda_launcher.PLANES_FILTERS:
            for stride in cuda_launcher.PLANES_STRIDES:
                assert cuda_launcher._planes_expression(dtype, k, stride) in listed
                assert (cuda_launcher._planes_expression(dtype, k, stride, True) in listed) == \
                    (stride in cuda_launcher.PLANES_STAGED_STRIDES)
    for dtype in cuda_launcher.MMA_DTYPES:
        for k in cuda_launcher.MMA_FILTERS:
            for m in cuda_launcher.MMA_MULTIPLIERS:
                for form in range(len(cuda_launcher.MMA_FORMS)):
                    assert cuda_launcher._mma_expression(np.dtype(getattr(ml_dtypes, dtype, dtype)), k, m,
                                                         form) in listed
                assert cuda_launcher._mma_nhwc_expression(np.dtype(getattr(ml_dtypes, dtype, dtype)), k, m) in listed
    for dtype in FLOAT_DTYPES:
        for data_format in ("NHWC", "NCHW"):
            for shape in (*cuda_launcher.SPECIALISATIONS, cuda_launcher.GENERIC):
                assert cuda_launcher._expression(dtype, data_format, shape) in listed
            for shape in cuda_launcher.SPECIALISATIONS:
                assert cuda_launcher._tiled_expression(dtype, data_format, shape) in listed
            for shape in cuda_launcher.SHORT_TILES:
                assert cuda_launcher._tiled_expression(dtype, data_format, shape, 1) in listed
            for shape in cuda_launcher.NARROW_TILES:
                assert cuda_launcher._tiled_expression(dtype, data_format, shape, 2, 2) in listed


def test_specialisation_choice():
    """3x3 / 5x5 filters at strides 1x1 / 2x2 get their compile-time kernels, the rest the generic one."""
    kwargs = case_kwargs(np.random.default_rng(0), x_shape=(1, 8, 8, 1), filt_hw=(5, 5), multiplier=1,
                         strides=(2, 2), padding="SAME")
    assert cuda_launcher.specialisation(geometry_of(kwargs)) == (5, 5, 2, 2)
    kwargs = case_kwargs(np.random.default_rng(0), x_shape=(1, 8, 8, 1), filt_hw=(3, 3), multiplier=1,
                         strides=(1, 2), padding="SAME")
    assert cuda_launcher.specialisation(geometry_of(kwargs)) == cuda_launcher.GENERIC


def tiled_ok(**case):
    """Whether the launcher may run the tiled kernel for a make_case description."""
    kwargs = case_kwargs(np.random.default_rng(0), **case)
    return cuda_launcher.tiled_eligible(geometry_of(kwargs), kwargs["out_backprop"].dtype)


def test_tiled_choice():
    """The tiled kernel takes the 3x3 / 5x5 filters at strides 1x1 / 2x2 without dilation, in
    either layout, any multiplier and padding; everything else goes to the direct kernel."""
    base = dict(x_shape=(2, 9, 10, 3), multiplier=2, padding="SAME")
    for filt, stride in ((3, 1), (3, 2), (5, 1), (5, 2)):
        for data_format in ("NHWC", "NCHW"):
            assert tiled_ok(**base, filt_hw=(filt, filt), strides=(stride, stride), data_format=data_format)
    assert tiled_ok(**dict(base, padding="EXPLICIT", pads=((3, 0), (1, 4))), filt_hw=(5, 5), strides=(2, 2))
    assert not tiled_ok(**base, filt_hw=(3, 3), dilations=(2, 2))
    assert not tiled_ok(**base, filt_hw=(3, 3), dilations=(1, 2))
    assert not tiled_ok(**base, filt_hw=(3, 3), strides=(1, 2))
    assert not tiled_ok(**base, filt_hw=(3, 2))
    assert not tiled_ok(**base, filt_hw=(1, 1))
    assert not tiled_ok(**base, filt_hw=(3, 3), strides=(3, 3))


def test_tiled_kernel_needs_32_bit_sizes():
    """Past 2**31 elements in any tensor (or a grid past CUDA's limits) the launcher keeps the
    direct kernel, whose offsets are 64-bit."""
    from gradops._geometry import conv2d_geometry

    def geometry(x_shape, multiplier=1):
        n, h, w, c = x_shape
        return conv2d_geometry(OP, x_shape, (3, 3, c, multiplier), (n, h, w, c * multiplier), [1, 1, 1, 1], "SAME",
                               [], "NHWC", [1, 1, 1, 1], depthwise=True)

    f16 = np.dtype(np.float16)
    assert cuda_launcher.tiled_eligible(geometry((1, 46340, 46340, 1)), f16)  # 2**31 - 14,844 elements
    assert not cuda_launcher.tiled_eligible(geometry((1, 46341, 46500, 1)), f16)
    assert not cuda_launcher.tiled_eligible(geometry((1, 1024, 1024, 1024), 2), f16)  # out_backprop 2**31
    assert not cuda_launcher.tiled_eligible(geometry((65536, 1, 1, 1)), f16)  # gridDim.z
    # gridDim.y: 3x3 stride 1 tiles are 14 rows (two 7-row work items), so 14 * 65535 rows is the last fit
    assert cuda_launcher.tiled_eligible(geometry((1, 14 * 65535, 1, 1)), f16)
    assert not cuda_launcher.tiled_eligible(geometry((1, 14 * 65535 + 1, 1, 1)), f16)
    assert cuda_launcher.pick_path(geometry((1, 46341, 46500, 1)), f16) == "direct"
    with pytest.raises(ValueError, match="tiled kernel cannot run"):
        cuda_launcher.pick_path(geometry((1, 46341, 46500, 1)), f16, "tiled")
    with pytest.raises(ValueError, match="path must be one of"):
        cuda_launcher.pick_path(geometry((1, 4, 4, 1)), f16, "gather")


def test_cuda_backend_entry_points_are_functions():
    """Importing the launcher submodules must not replace the backend's op functions of the same name."""
    from gradops.backends import cuda
    from gradops.backends.cuda import _build

    _build.all_instantiations()  # imports every launcher module
    assert callable(cuda.depthwise_conv2d_native_backprop_input)
    assert callable(cuda.fractional_avg_pool_grad)


@pytest.mark.parametrize("padding,pads", CUDA_PADDINGS, ids=CUDA_PADDING_IDS)
@pytest.mark.parametrize("filt_hw,strides,dilations", CUDA_GEOMETRIES, ids=CUDA_GEOMETRY_IDS)
def test_kernel_source_on_host_geometry_grid(host_kernels, rng, filt_hw, strides, dilations, padding, pads):
    """The kernel source (run on the CPU) matches the loop reference for every specialisation."""
    for data_format in ("NHWC", "NCHW"):
        kwargs, ref, scale = make_case(rng, x_shape=CUDA_X_SHAPE, filt_hw=filt_hw, multiplier=2, strides=strides,
                                       dilations=dilations, padding=padding, pads=pads, data_format=data_format)
        assert_close(run_on_host(host_kernels, kwargs), ref, np.float64, scale)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3, 4], ids=lambda m: f"M{m}")
def test_kernel_source_on_host_multiplier_dtype_grid(host_kernels, rng, multiplier, data_format, dtype):
    """Multipliers 1-4, both layouts, all element types (accumulating in float for half types)."""
    for filt_hw, strides in (((3, 3), (1, 1)), ((3, 3), (2, 2)), ((3, 2), (2, 1))):
        kwargs, ref, scale = make_case(rng, x_shape=(2, 7, 6, 3), filt_hw=filt_hw, multiplier=multiplier,
                                       strides=strides, dilations=(1, 2), padding="SAME",
                                       data_format=data_format, dtype=dtype)
        got = run_on_host(host_kernels, kwargs)
        assert got.dtype == np.dtype(dtype)
        assert_close(got, ref, dtype, scale)


@settings(max_examples=60, deadline=None)
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1))
def test_kernel_source_on_host_property(host_kernels, case, seed):
    """Random shapes, strides, dilations, paddings, layouts and dtypes: the kernel source matches the loops."""
    kwargs, ref, scale = make_case(np.random.default_rng(seed), **case)
    assert_close(run_on_host(host_kernels, kwargs), ref, case["dtype"], scale)


# ---- through the public API, on a GPU or on the host stand-in (the cuda_device fixture)


#: The launcher's kernel paths, each forced, and its own choice ("auto", through the public API).
PATHS_FORCED = ("direct", "tiled", "mma", "mma_runs", "mma_nhwc", "planes", "planes_staged", "planes_direct",
                "transpose")
CUDA_PATHS = pytest.mark.parametrize("path", [None, *PATHS_FORCED], ids=["auto", *PATHS_FORCED])


def cuda_call(kwargs, path=None, vector=None, narrow=None, **tensors):
    """gradops on the GPU for a make_case call: through the public API (backend="cuda"), or with
    ``path`` / ``vector`` / ``narrow`` given, through the launcher with that choice forced.
    ``tensors`` override the GPU arrays."""
    gpu = dict(kwargs, filter=to_gpu(kwargs["filter"]), out_backprop=to_gpu(kwargs["out_backprop"]))
    gpu.update(tensors)
    if path is None and vector is None and narrow is None:
        return gradops.depthwise_conv2d_native_backprop_input(**gpu, backend="cuda")
    return cuda_launcher.depthwise_conv2d_native_backprop_input(geometry_of(kwargs), gpu["filter"],
                                                                gpu["out_backprop"], path=path, vector=vector,
                                                                narrow=narrow)


def launched(device):
    """The kernel of the last launch on the host stand-in ("tiled" / "mma" / "mma_nhwc" / "planes" /
    "planes_staged" (its staged form) / "direct", or "transpose" where it is the transpose path's
    second transpose after the tiled kernel), None on a GPU."""
    if device is None:
        return None
    name = device.launches[-1][0]
    if "::transpose_batched" in name:  # either form: elements or 16-bit pairs
        names = [launch[0] for launch in device.launches[-3:]]
        assert len(names) == 3 and "::transpose_batched" in names[0] and "_tiled<" in names[1]
        return "transpose"
    return ("tiled" if "_tiled<" in name else "mma" if "_mma<" in name else "mma_nhwc" if "_mma_nhwc<" in name
            else ("planes_staged" if name.endswith(", true>") else "planes") if "_planes<" in name else "direct")


def planes_form(g, dtype, path) -> str:
    """The planes kernel's form a launch of ``path`` ("planes": the launcher's choice,
    "planes_staged", "planes_direct") takes, named as :func:`launched` names it."""
    return "planes_staged" if cuda_launcher.planes_path_staged(g, dtype, path) else "planes"


def mma_runs(g, dtype) -> bool:
    """Whether the tensor-core kernel can run ``g`` on the current (or stand-in) GPU."""
    from gradops.backends.cuda import _runtime

    return cuda_launcher.mma_possible(g, dtype) and _runtime.compute_capability() >= cuda_launcher.MMA_ARCH


def mma_nhwc_runs(g, dtype) -> bool:
    """Whether the NHWC tensor-core kernel can run ``g`` on the current (or stand-in) GPU."""
    from gradops.backends.cuda import _runtime

    return cuda_launcher.mma_nhwc_possible(g, dtype) and _runtime.compute_capability() >= cuda_launcher.MMA_ARCH


def check_cuda(kwargs, ref, scale, path=None, vector=None, device=None, narrow=None):
    """The CUDA result has the right type, shape and dtype and matches both the loops and the
    NumPy backend.  ``path="tiled"`` on a geometry the tiled kernel does not take must be
    refused (ValueError) instead; on the host stand-in (``device``) the launched kernel is
    checked: the forced one, or for "auto" the tiled one exactly when it can run."""
    import cupy

    dtype = kwargs["out_backprop"].dtype
    g = geometry_of(kwargs)
    eligible = cuda_launcher.tiled_eligible(g, dtype)
    if path == "tiled" and not eligible:
        with pytest.raises(ValueError, match="tiled kernel cannot run"):
            cuda_call(kwargs, path=path, vector=vector)
        return None
    if path in ("mma", "mma_runs") and not mma_runs(g, dtype):
        with pytest.raises(ValueError, match="mma kernel cannot run"):
            cuda_call(kwargs, path=path)
        return None
    if path == "mma_runs" and not cuda_launcher.mma_runs_possible(g, dtype):
        with pytest.raises(ValueError, match="runs form cannot run"):
            cuda_call(kwargs, path=path)
        return None
    if path == "mma_nhwc" and not mma_nhwc_runs(g, dtype):
        with pytest.raises(ValueError, match="mma_nhwc kernel cannot run"):
            cuda_call(kwargs, path=path)
        return None
    if path in ("planes", "planes_direct") and not cuda_launcher.planes_possible(g, dtype):
        with pytest.raises(ValueError, match="planes kernel cannot run"):
            cuda_call(kwargs, path=path)
        return None
    if path == "planes_staged" and not (cuda_launcher.planes_possible(g, dtype)
                                        and cuda_launcher.planes_staged_possible(g, dtype)):
        with pytest.raises(ValueError, match="planes kernel cannot run|staged form cannot run"):
            cuda_call(kwargs, path=path)
        return None
    if path == "transpose" and not cuda_launcher.transpose_possible(g, dtype):
        with pytest.raises(ValueError, match="transpose path cannot run"):
            cuda_call(kwargs, path=path)
        return None
    got = cuda_call(kwargs, path=path, vector=vector, narrow=narrow)
    assert isinstance(got, cupy.ndarray)
    assert got.dtype == dtype and got.shape == tuple(kwargs["input_sizes"])
    if device is not None and 0 not in got.shape and kwargs["filter"].size and kwargs["out_backprop"].size:
        auto = ("mma" if cuda_launcher.mma_chosen(g, dtype) else "mma_nhwc" if cuda_launcher.mma_nhwc_chosen(g, dtype)
                else "planes" if cuda_launcher.planes_chosen(g, dtype)
                else "transpose" if cuda_launcher.transpose_chosen(g, dtype) else "tiled" if eligible else "direct")
        expected = path or auto
        if expected.startswith("planes"):
            expected = planes_form(g, dtype, expected)
        assert launched(device) == {"mma_runs": "mma"}.get(expected, expected)
    got = to_host(got)
    assert_close(got, ref, dtype, scale)
    expected = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    assert_close(got, expected, dtype, 2 * scale)  # two roundings: each side's own
    return got


@pytest.mark.parametrize("capped", [False, True], ids=["grid", "capped-grid"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@CUDA_PATHS
def test_cuda_racecheck(racecheck_device, rng, path, data_format, dtype, capped):
    """No shared-memory hazard on any path (racecheck builds on the host, which fail a launch at
    the first one), with the launcher's grid and with grids capped to one block a dimension, so
    that blocks loop and the barriers at the end of a block's work are needed."""
    import cuda_host

    with cuda_host.capped_grids() if capped else contextlib.nullcontext():
        for filt_hw, strides, multiplier in (((3, 3), (1, 1), 1), ((5, 5), (2, 2), 2), ((3, 3), (2, 2), 2),
                                             ((5, 5), (1, 1), 1)):
            check_cuda(*make_case(rng, x_shape=(2, 14, 13, 8), filt_hw=filt_hw, multiplier=multiplier,
                                  strides=strides, padding="SAME", data_format=data_format, dtype=dtype),
                       path=path, device=racecheck_device)


#: Maps of 1-7 rows and columns, 1-16 channels (x_shape NHWC, filt_hw, strides, multiplier):
#: rows shorter than a kernel's vectors, chunks or tiles, where a load that is right on larger
#: maps reaches past a tensor's end.
TINY_MAPS = (((1, 1, 1, 1), (3, 3), (1, 1), 1), ((2, 1, 3, 3), (3, 3), (2, 2), 2), ((1, 3, 2, 5), (5, 5), (1, 1), 1),
             ((1, 2, 5, 8), (5, 5), (2, 2), 1), ((1, 5, 1, 2), (3, 3), (1, 1), 2), ((3, 4, 3, 16), (3, 3), (2, 2), 1),
             ((1, 3, 3, 1), (1, 1), (1, 1), 1), ((2, 2, 7, 4), (3, 3), (2, 1), 1), ((1, 7, 2, 8), (3, 3), (1, 1), 1))


#: Every path (as CUDA_PATHS), and the tiled kernel's scalar staging and both tile widths.
TINY_CHOICES = dict({"auto": {}}, **{path: dict(path=path) for path in PATHS_FORCED},
                    **{"tiled-scalar": dict(path="tiled", vector=False), "tiled-narrow": dict(path="tiled", narrow=True),
                       "tiled-wide": dict(path="tiled", narrow=False)})


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("choice", list(TINY_CHOICES))
def test_cuda_tiny_maps_memcheck(racecheck_device, rng, choice, data_format, dtype):
    """Every path on tiny maps, in racecheck builds: no access outside out_backprop, filter or
    the gradient (the guard bytes around each array), no shared-memory hazard, right results
    (a forced kernel that cannot run a map must refuse it, as check_cuda checks; narrow tiles
    are asked for on the stride-2 maps only, the others raise)."""
    for x_shape, filt_hw, strides, multiplier in TINY_MAPS:
        if choice == "tiled-narrow" and strides != (2, 2):
            continue
        check_cuda(*make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, strides=strides,
                              padding="SAME", data_format=data_format, dtype=dtype),
                   **TINY_CHOICES[choice], device=racecheck_device)


@CUDA_PATHS
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", CUDA_PADDINGS, ids=CUDA_PADDING_IDS)
@pytest.mark.parametrize("filt_hw,strides,dilations", CUDA_GEOMETRIES, ids=CUDA_GEOMETRY_IDS)
def test_cuda_geometry_grid(cuda_device, rng, path, filt_hw, strides, dilations, padding, pads, data_format):
    """Every specialisation and the generic kernel, every padding, both layouts (float64), on
    each path (the tiled one refuses what it cannot run)."""
    check_cuda(*make_case(rng, x_shape=CUDA_X_SHAPE, filt_hw=filt_hw, multiplier=2, strides=strides,
                          dilations=dilations, padding=padding, pads=pads, data_format=data_format),
               path=path, device=cuda_device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3, 4], ids=lambda m: f"M{m}")
@CUDA_PATHS
def test_cuda_multiplier_format_dtype_grid(cuda_device, rng, path, multiplier, data_format, dtype):
    """Multipliers 1-4, both layouts, all float dtypes, on specialised and generic kernels and
    each path."""
    for filt_hw, strides, padding, dilations in (((3, 3), (1, 1), "SAME", (1, 2)), ((3, 3), (1, 1), "SAME", (1, 1)),
                                                 ((5, 5), (2, 2), "SAME", (1, 2)), ((5, 5), (2, 2), "SAME", (1, 1)),
                                                 ((5, 5), (1, 1), "VALID", (1, 1)), ((3, 2), (2, 1), "VALID", (1, 2))):
        check_cuda(*make_case(rng, x_shape=(2, 9, 8, 3), filt_hw=filt_hw, multiplier=multiplier,
                              strides=strides, dilations=dilations, padding=padding, data_format=data_format,
                              dtype=dtype), path=path, device=cuda_device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", [("VALID", NO_PADS), ("EXPLICIT", ((0, 3), (2, 1)))],
                         ids=["VALID", "EXPLICIT"])
@CUDA_PATHS
def test_cuda_padding_format_dtype_grid(cuda_device, rng, path, padding, pads, data_format, dtype):
    """VALID and asymmetric EXPLICIT padding, both layouts, all float dtypes, odd sizes, each path."""
    for strides, dilations in (((1, 2), (2, 1)), ((2, 2), (1, 1)), ((1, 1), (1, 1))):
        check_cuda(*make_case(rng, x_shape=(1, 7, 5, 3), filt_hw=(3, 3), multiplier=3, strides=strides,
                              dilations=dilations, padding=padding, pads=pads, data_format=data_format, dtype=dtype),
                   path=path, device=cuda_device)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1))
def test_cuda_property(cuda_device, case, seed):
    """Random shapes, strides, dilations, paddings, layouts and dtypes match the loops and NumPy."""
    check_cuda(*make_case(np.random.default_rng(seed), **case), device=cuda_device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("x_shape,multiplier", [((0, 4, 4, 2), 2), ((1, 4, 4, 0), 2), ((2, 4, 4, 2), 0)],
                         ids=["batch0", "depth0", "multiplier0"])
def test_cuda_empty_tensors(cuda_device, x_shape, multiplier, dtype):
    """Empty batch, depth or multiplier: zeros of the input shape and dtype, on the GPU."""
    import cupy

    n, h, w, c = x_shape
    filt = to_gpu(np.ones((3, 3, c, multiplier), dtype))
    dy = to_gpu(np.ones((n, h, w, c * multiplier), dtype))
    got = gradops.depthwise_conv2d_native_backprop_input(list(x_shape), filt, dy, [1, 1, 1, 1], "SAME",
                                                         backend="cuda")
    assert isinstance(got, cupy.ndarray)
    assert got.shape == x_shape and got.dtype == np.dtype(dtype)
    assert not np.any(to_host(got).astype(np.float64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
def test_cuda_non_contiguous_inputs(cuda_device, rng, data_format, dtype):
    """Strided views (every other element, and a transposed layout) give the contiguous result."""
    kwargs, ref, scale = make_case(rng, x_shape=(2, 9, 8, 3), filt_hw=(3, 3), multiplier=2, strides=(2, 2),
                                   padding="SAME", data_format=data_format, dtype=dtype)
    w, dy = kwargs["filter"], kwargs["out_backprop"]
    w_wide = np.zeros((*w.shape[:3], 2 * w.shape[3]), dtype)
    w_wide[..., ::2] = w
    dy_t = to_gpu(np.ascontiguousarray(np.moveaxis(dy, 0, -1)))  # [.., N] then a view back to dy's order
    filter_view, dy_view = to_gpu(w_wide)[..., ::2], dy_t.transpose(3, 0, 1, 2)
    assert not filter_view.flags.c_contiguous and not dy_view.flags.c_contiguous
    got = to_host(cuda_call(kwargs, filter=filter_view, out_backprop=dy_view))
    assert_close(got, ref, dtype, scale)


@FOREIGN_GPU_WRAPPERS
def test_cuda_foreign_gpu_tensors(cuda_device, rng, wrapper):
    """Inputs given as __cuda_array_interface__ or DLPack producers are read in place."""
    import cupy

    kwargs, ref, scale = make_case(rng, x_shape=(2, 7, 6, 3), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                   dtype=np.float32)
    got = cuda_call(kwargs, filter=wrapper(to_gpu(kwargs["filter"])),
                    out_backprop=wrapper(to_gpu(kwargs["out_backprop"])))
    assert isinstance(got, cupy.ndarray)
    assert_close(to_host(got), ref, np.float32, scale)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_cuda_deterministic(cuda_device, rng, dtype):
    """Two runs give bitwise equal results (a gather in a fixed order, no atomics); on the host
    the second run visits blocks and threads in another order."""
    kwargs = case_kwargs(rng, x_shape=(4, 33, 31, 8), filt_hw=(5, 5), multiplier=3, strides=(1, 1),
                         dilations=(2, 1), padding="SAME", dtype=dtype)
    filt, dy = to_gpu(kwargs["filter"]), to_gpu(kwargs["out_backprop"])
    first = to_host(cuda_call(kwargs, filter=filt, out_backprop=dy))
    if cuda_device is not None:
        cuda_device.seed += 1
    second = to_host(cuda_call(kwargs, filter=filt, out_backprop=dy))
    assert first.tobytes() == second.tobytes()


# ---- the tiled kernel's own edges: tiles, channel blocks, vector widths, phases, multipliers

#: (x_shape NHWC, filt_hw, strides, padding, pads, multiplier, dtype): sizes that are not
#: multiples of the tile (8 x 16, or 14 x 8 for 5x5 stride 1) and images smaller than one;
#: channel counts that are not multiples of the vector width (16 / itemsize) or of the 32 (16
#: for float64) channels of a CTA, odd ones (unpaired stores); multipliers 1-3; strides 1 and 2
#: with odd and even pads (a tile then starts one position before the image); batch > 1.
TILE_EDGE_CASES = {
    "f16-s1-17x19-c40": ((2, 17, 19, 40), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f16-s1-c37-odd": ((1, 9, 18, 37), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "bf16-s2-c33-oddpads": ((3, 13, 21, 33), (3, 3), (2, 2), "EXPLICIT", ((1, 2), (3, 0)), 1, ml_dtypes.bfloat16),
    "f32-s1-5x5-c6": ((2, 23, 9, 6), (5, 5), (1, 1), "SAME", NO_PADS, 1, np.float32),
    "f32-s2-5x5-m2": ((2, 19, 34, 20), (5, 5), (2, 2), "SAME", NO_PADS, 2, np.float32),
    "f16-s2-5x5-m3-oddpads": ((1, 18, 17, 9), (5, 5), (2, 2), "EXPLICIT", ((3, 1), (1, 4)), 3, np.float16),
    "f64-s1-c20": ((2, 10, 17, 20), (3, 3), (1, 1), "EXPLICIT", ((0, 2), (2, 1)), 1, np.float64),
    "f64-s1-5x5-c17-m2": ((1, 17, 9, 17), (5, 5), (1, 1), "VALID", NO_PADS, 2, np.float64),
    "f16-s1-5x5-1x1-image": ((2, 1, 1, 8), (5, 5), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f32-s2-3x3-valid-wide": ((1, 5, 40, 64), (3, 3), (2, 2), "VALID", NO_PADS, 1, np.float32),
    "bf16-s1-5x5-pads-past-filter": ((1, 6, 5, 16), (5, 5), (1, 1), "EXPLICIT", ((6, 5), (4, 7)), 1,
                                     ml_dtypes.bfloat16),
    "f32-s2-3x3-c64-m1-batch4": ((4, 16, 32, 64), (3, 3), (2, 2), "SAME", NO_PADS, 1, np.float32),
    # 5x5 stride 1 on images of at most 7 rows: tiles one work item (7 rows) high
    "f16-s1-5x5-7x7-c40": ((2, 7, 7, 40), (5, 5), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f32-s1-5x5-6x30-c36-m2": ((1, 6, 30, 36), (5, 5), (1, 1), "EXPLICIT", ((1, 3), (2, 0)), 2, np.float32),
    # 5x5 stride 1 on 28 columns: a warp takes an item column, the last one idles
    "bf16-s1-5x5-15x28-c16": ((2, 15, 28, 16), (5, 5), (1, 1), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    # paired multiplier 2: 16 input channels per CTA (20: a full and a partial block), 16-byte
    # loads where 2 x in_depth is a multiple of the vector width, odd in_depth, short tiles
    "f16-s1-m2-c20-paired": ((2, 17, 19, 20), (3, 3), (1, 1), "SAME", NO_PADS, 2, np.float16),
    "bf16-s2-m2-c17-oddpads": ((1, 13, 21, 17), (3, 3), (2, 2), "EXPLICIT", ((1, 2), (3, 0)), 2, ml_dtypes.bfloat16),
    "f16-s1-5x5-7x7-m2-c36": ((2, 7, 7, 36), (5, 5), (1, 1), "SAME", NO_PADS, 2, np.float16),
    # NCHW plane-row staging: out_backprop rows a multiple of the vector width (16-byte chunks)
    # whose first staged column sits at every phase of a chunk (shift 0 .. width - 1: pads and
    # strides), partial channel blocks, multipliers; in_cols a multiple of 4 or not, tiles at a
    # multiple of 4 columns or one before (4-column result stores or element stores)
    "f16-s1-rows16-shift7-c33": ((2, 10, 32, 33), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f16-s1-rows16-shift4": ((1, 9, 24, 20), (3, 3), (1, 1), "EXPLICIT", ((1, 1), (6, 4)), 1, np.float16),
    "bf16-s2-rows16-shift7-m3": ((1, 11, 32, 9), (3, 3), (2, 2), "SAME", NO_PADS, 3, ml_dtypes.bfloat16),
    "f32-s1-5x5-rows16-shift1-m2": ((2, 16, 20, 18), (5, 5), (1, 1), "EXPLICIT", ((2, 2), (1, 3)), 2, np.float32),
    "f32-s2-5x5-rows16-oddpad": ((1, 17, 16, 34), (5, 5), (2, 2), "SAME", NO_PADS, 1, np.float32),
    "f64-s1-rows16-shift0": ((1, 9, 14, 17), (3, 3), (1, 1), "EXPLICIT", ((1, 1), (0, 2)), 1, np.float64),
    "f16-s1-5x5-7x7-rows-short": ((2, 7, 16, 40), (5, 5), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f32-s2-3x3-m2-paired-rows16": ((2, 12, 16, 20), (3, 3), (2, 2), "SAME", NO_PADS, 2, np.float32),
    # NCHW rows that take 8- or 4-byte chunks (auto): float16 rows of 14 (4 bytes) and 28 (8
    # bytes), float32 rows of 14 (8 bytes)
    "f16-s1-rows4-14x14-shift1": ((1, 14, 14, 24), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f32-s1-rows8-shift0-m2": ((2, 9, 14, 12), (3, 3), (1, 1), "EXPLICIT", ((1, 1), (2, 0)), 2, np.float32),
    "bf16-s2-5x5-rows8-shift2": ((1, 11, 56, 10), (5, 5), (2, 2), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    "f16-s1-5x5-7x28-rows8-m3": ((1, 7, 28, 11), (5, 5), (1, 1), "SAME", NO_PADS, 3, np.float16),
    # images of at most 8 columns (from the first tile's start): 8 x 8 tiles (C = 2) for 3x3
    # and 5x5 stride 2; 7 x 7 maps (MobileNetV2's last blocks), a tile starting one column
    # before a 7-column image, 8 columns exactly, rows past one tile, paired and odd multipliers
    "f16-s1-narrow-7x7-c40": ((2, 7, 7, 40), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float16),
    "f32-s1-narrow-7x7-m2-c24": ((2, 7, 7, 24), (3, 3), (1, 1), "SAME", NO_PADS, 2, np.float32),
    "bf16-s2-narrow-oddpad-7": ((1, 9, 7, 16), (3, 3), (2, 2), "EXPLICIT", ((1, 0), (1, 1)), 1, ml_dtypes.bfloat16),
    "f16-s2-5x5-narrow-8-m3": ((2, 13, 8, 10), (5, 5), (2, 2), "SAME", NO_PADS, 3, np.float16),
    "f64-s1-narrow-20x8-c18": ((1, 20, 8, 18), (3, 3), (1, 1), "EXPLICIT", ((2, 0), (0, 2)), 1, np.float64),
    "f32-s1-narrow-3x5-c33": ((2, 3, 5, 33), (3, 3), (1, 1), "SAME", NO_PADS, 1, np.float32),
}


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(TILE_EDGE_CASES))
def test_cuda_tiled_tile_edges(cuda_device, rng, case, data_format):
    """The tiled kernel at its edges, with 16-byte and one-element staging loads where both can
    run (NHWC, multiplier 1 or paired multiplier 2, out_backprop channel counts a multiple of the
    vector width)."""
    x_shape, filt_hw, strides, padding, pads, multiplier, dtype = TILE_EDGE_CASES[case]
    kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, strides=strides,
                                   padding=padding, pads=pads, data_format=data_format, dtype=dtype)
    g = geometry_of(kwargs)
    assert cuda_launcher.tiled_eligible(g, np.dtype(dtype))
    chunk = 16 // np.dtype(dtype).itemsize
    paired = multiplier == 2 and np.dtype(dtype) != np.float64
    assert cuda_launcher.pair_multipliers(g, np.dtype(dtype)) == paired
    if data_format == "NHWC":
        vector = (multiplier == 1 or paired) and x_shape[3] * multiplier % chunk == 0
    else:  # NCHW: 16-byte chunks of out_backprop rows, any multiplier
        vector = g.out_cols % chunk == 0
    if vector:
        assert cuda_launcher.use_vector_loads(g, np.dtype(dtype), (to_gpu(kwargs["filter"]),
                                                                   to_gpu(kwargs["out_backprop"])))
        check_cuda(kwargs, ref, scale, path="tiled", vector=True, device=cuda_device)
    else:
        with pytest.raises(ValueError, match="vector loads need"):
            cuda_call(kwargs, path="tiled", vector=True)
    check_cuda(kwargs, ref, scale, path="tiled", vector=False, device=cuda_device)
    check_cuda(kwargs, ref, scale, device=cuda_device)  # auto: the tiled kernel


def test_nchw_staging_chunk_choice():
    """NCHW staging loads the widest chunk (16, 8 or 4 bytes, more than one element) that divides
    an out_backprop row and the array's alignment, else one element; 4-column result stores
    need in_cols % 4 == 0 and tiles that start at a multiple of 4 (pad_left % stride == 0),
    2-column ones the same for 2; NHWC stores by position."""
    from gradops._geometry import conv2d_geometry

    def geometry(w, s=1, pads=None):
        explicit = [0, 0, 0, 0, 1, 1, *pads] if pads else []
        out = -(-w // s) if not pads else (w + sum(pads) - 3) // s + 1
        return conv2d_geometry(OP, (1, 8, 6, w), (3, 3, 8, 1), (1, 8, -(-6 // s) if not pads else 5 // s + 1, out),
                               [1, 1, s, s], "EXPLICIT" if pads else "SAME", explicit, "NCHW", [1, 1, 1, 1],
                               depthwise=True)

    chunk = cuda_launcher.nchw_chunk_bytes
    for w, half, single, double in ((112, 16, 16, 16), (56, 16, 16, 16), (28, 8, 16, 16), (14, 4, 8, 16),
                                    (7, 2, 4, 8), (10, 4, 8, 16)):
        g = geometry(w)
        assert (chunk(g, np.float16), chunk(g, np.float32), chunk(g, np.float64)) == (half, single, double), w
    assert cuda_launcher.use_vector_loads(geometry(56), np.dtype(np.float16), ())
    assert not cuda_launcher.use_vector_loads(geometry(28), np.dtype(np.float16), ())  # 8-byte chunks
    cols = cuda_launcher.nchw_store_cols
    assert (cols(geometry(28)), cols(geometry(14)), cols(geometry(7)), cols(geometry(10))) == (4, 2, 1, 2)
    assert cols(geometry(28, 2)) == 4  # SAME, even size, stride 2: pad_left 0
    assert cols(geometry(28, 2, (1, 0))) == cols(geometry(14, 2, (1, 0))) == 1  # tiles start one column early
    nhwc = conv2d_geometry(OP, (1, 6, 28, 8), (3, 3, 8, 1), (1, 6, 28, 8), [1, 1, 1, 1], "SAME", [], "NHWC",
                           [1, 1, 1, 1], depthwise=True)
    assert cols(nhwc) == 1


def _warp_pairings():
    """(shape, columns, narrow) with narrow tiles only where the launcher has them (stride 2:
    stride 1 has no narrower tile than its full one), so that no GPU run reports a skip."""
    shapes = {"3x3-s1": ((3, 3), (1, 1)), "5x5-s2": ((5, 5), (2, 2)), "5x5-s1": ((5, 5), (1, 1))}
    return [pytest.param(shape, columns, narrow,
                         id=f"{name}-{'one-above-the-other' if columns else 'side-by-side'}-"
                            f"{'narrow' if narrow else 'full-width'}")
            for name, shape in shapes.items() for columns in (False, True) for narrow in (False, True)
            if not narrow or (*shape[0], *shape[1]) in cuda_launcher.NARROW_TILES]


@pytest.mark.parametrize("shape, columns, narrow", _warp_pairings())
def test_cuda_tiled_warp_pairings(cuda_device, rng, monkeypatch, shape, columns, narrow):
    """Both ways a warp's two work items can sit in a tile give the right result (the launcher
    picks one per geometry; here each is forced), on images that end inside a tile both ways,
    with full-width tiles and (forced on a wide image) narrow 8 x 8 ones."""
    filt_hw, strides = shape
    kwargs, ref, scale = make_case(rng, x_shape=(2, 19, 29, 24), filt_hw=filt_hw, multiplier=1, strides=strides,
                                   padding="SAME", dtype=np.float32)
    monkeypatch.setattr(cuda_launcher, "columns_per_warp", lambda g, item_cols=None: columns)
    # a fresh plan cache: the cached plans hold the pairing that earlier calls computed
    monkeypatch.setattr(cuda_launcher, "_tiled_plan", functools.lru_cache(cuda_launcher._tiled_plan.__wrapped__))
    check_cuda(kwargs, ref, scale, path="tiled", narrow=narrow, device=cuda_device)


def test_warp_pairing_choice():
    """One item column per warp where the image's last columns leave a whole item column of a
    tile empty (28 columns, 8-column tiles); side by side where its last rows leave an item row
    empty, or with one work item down a tile."""
    from gradops._geometry import conv2d_geometry

    def geometry(h, w, f, s):
        return conv2d_geometry(OP, (1, h, w, 8), (f, f, 8, 1), (1, -(-h // s), -(-w // s), 8), [1, s, s, 1], "SAME",
                               [], "NHWC", [1, 1, 1, 1], depthwise=True)

    assert cuda_launcher.columns_per_warp(geometry(28, 28, 5, 1))
    assert not cuda_launcher.columns_per_warp(geometry(14, 14, 5, 1))  # nothing idles either way
    assert not cuda_launcher.columns_per_warp(geometry(7, 28, 5, 1))  # one work item down the tile
    assert cuda_launcher.item_rows_per_tile(geometry(7, 28, 5, 1)) == 1
    assert cuda_launcher.item_rows_per_tile(geometry(8, 28, 5, 1)) == 2
    assert not cuda_launcher.columns_per_warp(geometry(20, 32, 3, 2))  # 20 rows: an item row of 24 idles
    assert cuda_launcher.columns_per_warp(geometry(16, 20, 3, 2))  # 20 columns: an item column of 24 idles
    assert cuda_launcher.columns_per_warp(geometry(28, 28, 3, 1))  # 3x3 stride 1: 14 x 8 tiles, as 5x5


def test_narrow_tile_choice():
    """8 x 8 tiles (two work items across) for 3x3 and 5x5 stride-2 filters where 8-column tiles
    cover the columns from the first tile's start (pad_left % stride before the image) with
    fewer columns than 16-column ones; 16-column tiles otherwise; stride-1 filters keep their
    8-column tiles of 7-row work items (14 rows, or 7 on images of at most 7 rows)."""
    from gradops._geometry import conv2d_geometry

    def geometry(h, w, f, s, pad_left=None):
        if pad_left is None:
            padding, explicit = "SAME", []
            out_w = -(-w // s)
        else:
            padding, explicit = "EXPLICIT", [0, 0, 1, 1, pad_left, 1, 0, 0]
            out_w = (w + pad_left + 1 - f) // s + 1
        return conv2d_geometry(OP, (1, h, w, 8), (f, f, 8, 1),
                               (1, -(-h // s) if pad_left is None else (h + 2 - f) // s + 1, out_w, 8),
                               [1, s, s, 1], padding, explicit, "NHWC", [1, 1, 1, 1], depthwise=True)

    def cols(g):
        return cuda_launcher.item_cols_per_tile(g), cuda_launcher.tile_shape(g)

    assert cols(geometry(7, 7, 3, 1)) == (2, (7, 8, 2))
    assert cols(geometry(14, 14, 3, 1)) == cols(geometry(8, 112, 3, 1)) == (2, (14, 8, 4))
    assert cols(geometry(8, 8, 3, 2)) == (2, (8, 8, 4))
    assert cols(geometry(8, 10, 3, 2)) == (4, (8, 16, 8))
    assert cols(geometry(8, 14, 3, 2)) == (4, (8, 16, 8))
    assert cols(geometry(8, 56, 3, 2)) == (2, (8, 8, 4))  # 56 columns: 7 narrow tiles against 4 wide
    assert cols(geometry(8, 28, 3, 2)) == (4, (8, 16, 8))  # 32 columns either way
    assert cols(geometry(8, 24, 3, 2)) == (2, (8, 8, 4))
    assert cols(geometry(8, 112, 3, 2)) == (4, (8, 16, 8))
    assert cols(geometry(7, 7, 3, 2, pad_left=1)) == (2, (8, 8, 4))  # the first tile starts one column early
    assert cols(geometry(7, 8, 3, 2, pad_left=1)) == (4, (8, 16, 8))  # 9 columns from the tile's start
    assert cols(geometry(7, 7, 5, 2)) == (2, (8, 8, 4))  # SAME: pad_left 2
    assert cols(geometry(7, 8, 5, 2)) == (4, (8, 16, 8))  # SAME: pad_left 1, 9 columns
    assert cols(geometry(7, 7, 5, 1)) == (2, (7, 8, 2))
    assert cols(geometry(14, 7, 5, 1)) == (2, (14, 8, 4))
    assert cuda_launcher.tile_threads(geometry(7, 7, 3, 2)) == 64
    assert cuda_launcher.tile_threads(geometry(7, 7, 3, 1)) == 32
    assert cuda_launcher.tiles(geometry(7, 7, 3, 2)) == (1, 1)
    assert cuda_launcher.tiles(geometry(7, 7, 3, 2), 4) == (1, 1)
    assert cuda_launcher.tile_shape(geometry(7, 7, 3, 2), 4) == (8, 16, 8)
    assert cuda_launcher.pick_item_cols(geometry(7, 7, 3, 2), narrow=False) == 4
    assert cuda_launcher.pick_item_cols(geometry(14, 14, 3, 2), narrow=True) == 2
    for f in (3, 5):  # stride 1: its full tile
        assert cuda_launcher.pick_item_cols(geometry(7, 7, f, 1), narrow=False) == 2
        with pytest.raises(ValueError, match="narrow tiles are for"):
            cuda_launcher.pick_item_cols(geometry(7, 7, f, 1), narrow=True)
    assert cuda_launcher.tiled_expression(geometry(7, 7, 3, 1), np.float16).endswith(", 3, 3, 1, 1, 1, 2>")
    assert cuda_launcher.tiled_expression(geometry(14, 14, 3, 1), np.float16).endswith(", 3, 3, 1, 1, 2, 2>")
    assert cuda_launcher.tiled_expression(geometry(7, 7, 3, 2), np.float16).endswith(", 3, 3, 2, 2, 2, 2>")
    assert cuda_launcher.tiled_expression(geometry(14, 14, 3, 2), np.float16).endswith(", 3, 3, 2, 2, 2, 4>")


@pytest.mark.parametrize("case", [dict(filt_hw=(3, 3), dilations=(2, 2)), dict(filt_hw=(5, 5), strides=(1, 2)),
                                  dict(filt_hw=(3, 3), strides=(2, 1), dilations=(1, 2)), dict(filt_hw=(3, 2))],
                         ids=["dilated", "unequal-strides", "unequal-dilated", "3x2"])
def test_cuda_shapes_the_tiled_kernel_leaves_to_the_direct_one(cuda_device, rng, case):
    """Dilations, unequal strides and other filters: "auto" runs the direct kernel, "tiled" is refused."""
    kwargs, ref, scale = make_case(rng, x_shape=(2, 12, 19, 16), multiplier=2, padding="SAME", dtype=np.float32,
                                   **case)
    for path in (None, "tiled", "direct"):
        check_cuda(kwargs, ref, scale, path=path, device=cuda_device)


def shifted_gpu(a, shift: int):
    """``a`` on the GPU, C-contiguous, starting ``shift`` elements into its allocation (so
    aligned to less than the allocation is)."""
    padded = to_gpu(np.concatenate([np.zeros(shift, a.dtype), a.reshape(-1)]))
    return padded[shift:].reshape(a.shape)


def test_cuda_tiled_misaligned_out_backprop(cuda_device, rng):
    """An out_backprop that starts 2 bytes into an allocation cannot be read 16 bytes at a time:
    the launcher stages it one element per load (and refuses vector=True)."""
    kwargs, ref, scale = make_case(rng, x_shape=(2, 11, 20, 16), filt_hw=(3, 3), multiplier=1, padding="SAME",
                                   dtype=np.float16)
    dy = kwargs["out_backprop"]
    dy_view = shifted_gpu(dy, 1)
    assert dy_view.flags.c_contiguous
    g, w = geometry_of(kwargs), to_gpu(kwargs["filter"])
    assert not cuda_launcher.use_vector_loads(g, np.dtype(np.float16), (w, dy_view))
    with pytest.raises(ValueError, match="vector loads need"):
        cuda_launcher.depthwise_conv2d_native_backprop_input(g, w, dy_view, path="tiled", vector=True)
    got = to_host(cuda_call(kwargs, out_backprop=dy_view))
    assert launched(cuda_device) in ("tiled", None)
    assert_close(got, ref, np.float16, scale)


@st.composite
def tiled_cases(draw):
    """Shapes the tiled kernel takes: 3x3 or 5x5, strides 1x1 or 2x2, no dilation; any sizes,
    channel counts, multipliers, paddings, layouts and dtypes."""
    n = draw(st.integers(1, 3))
    h, w = draw(st.integers(1, 26)), draw(st.integers(1, 26))
    c, m = draw(st.integers(1, 40)), draw(st.integers(1, 3))
    f, stride = draw(st.sampled_from([3, 5])), draw(st.sampled_from([1, 2]))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = NO_PADS
    if padding == "EXPLICIT":
        pads = tuple((draw(st.integers(0, 5)), draw(st.integers(0, 5))) for _ in range(2))
    oh, ow = out_hw((h, w), (f, f), (stride, stride), (1, 1), padding, pads)
    assume(oh > 0 and ow > 0)
    return dict(x_shape=(n, h, w, c), filt_hw=(f, f), multiplier=m, strides=(stride, stride), padding=padding,
                pads=pads, data_format=draw(st.sampled_from(["NHWC", "NCHW"])),
                dtype=draw(st.sampled_from(FLOAT_DTYPES)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=tiled_cases(), seed=st.integers(0, 2**32 - 1), vector=st.booleans())
def test_cuda_tiled_property(cuda_device, case, seed, vector):
    """Random shapes on the tiled path (16-byte staging loads where they can run, or forced off)
    match the loops and the NumPy backend."""
    kwargs, ref, scale = make_case(np.random.default_rng(seed), **case)
    arrays = (to_gpu(kwargs["filter"]), to_gpu(kwargs["out_backprop"]))
    vector = vector and cuda_launcher.use_vector_loads(geometry_of(kwargs), kwargs["out_backprop"].dtype, arrays)
    check_cuda(kwargs, ref, scale, path="tiled", vector=vector, device=cuda_device)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [((5, 5), (1, 1), 1), ((3, 3), (2, 2), 3), ((5, 5), (2, 2), 1)],
                         ids=["5x5-s1-m1", "3x3-s2-m3", "5x5-s2-m1"])
def test_cuda_tiled_deterministic(cuda_device, rng, dtype, shape):
    """The tiled kernel gives bitwise equal results in two runs; on the host the second run
    visits blocks and threads in another order (with an Inf in the filter, so that the checked
    inner loop runs too)."""
    filt_hw, strides, multiplier = shape
    kwargs = case_kwargs(rng, x_shape=(3, 29, 37, 40), filt_hw=filt_hw, multiplier=multiplier, strides=strides,
                         padding="SAME", dtype=dtype)
    filt, dy = to_gpu(kwargs["filter"]), to_gpu(kwargs["out_backprop"])
    runs = []
    for inf in (False, True):
        if inf:
            w = kwargs["filter"].copy()
            w[0, 0, 5, 0] = np.inf
            filt = to_gpu(w)
        first = to_host(cuda_call(kwargs, path="tiled", filter=filt, out_backprop=dy))
        if cuda_device is not None:
            cuda_device.seed += 1
        second = to_host(cuda_call(kwargs, path="tiled", filter=filt, out_backprop=dy))
        assert first.tobytes() == second.tobytes()
        runs.append(first)
    assert np.isinf(runs[1]).any() and not np.isnan(runs[1]).any()


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [((3, 3), (1, 1), 1), ((5, 5), (2, 2), 2)], ids=["3x3-s1-m1", "5x5-s2-m2"])
def test_cuda_tiled_non_finite_filter_skips_padding(cuda_device, rng, shape, dtype, data_format):
    """An Inf and a NaN in the filter reach exactly the elements whose taps land inside
    out_backprop: the tiled kernel stages zeros outside it, so a CTA whose filter slice is not
    finite takes the inner loop that skips them (0 * Inf would be NaN).  Compared with the NumPy
    backend position by position."""
    filt_hw, strides, multiplier = shape
    kwargs = case_kwargs(rng, x_shape=(2, 11, 20, 40), filt_hw=filt_hw, multiplier=multiplier, strides=strides,
                         padding="SAME", data_format=data_format, dtype=dtype)
    w = kwargs["filter"].copy()
    w[0, 0, 3, 0] = np.inf       # tap (0, 0): on the padding for the last rows and columns
    w[-1, -1, 36, -1] = np.nan   # the last tap: on the padding for the first ones
    kwargs["filter"] = w
    got = to_host(cuda_call(kwargs, path="tiled"))
    want = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    channel_axis = 3 if data_format == "NHWC" else 1
    for name, mask in (("NaN", np.isnan), ("Inf", np.isinf)):
        np.testing.assert_array_equal(mask(got.astype(np.float64)), mask(want.astype(np.float64)), err_msg=name)
    assert np.isinf(np.take(got, 3, axis=channel_axis).astype(np.float64)).any()
    assert not np.isnan(np.take(got, 3, axis=channel_axis).astype(np.float64)).all()  # not every element
    assert np.isnan(np.take(got, 36, axis=channel_axis).astype(np.float64)).any()
    finite = np.isfinite(want.astype(np.float64))
    assert_close(got[finite], want[finite], dtype, scale=float(np.abs(want[finite].astype(np.float64)).max()))


# The sm_90 / sm_100 build's register-bounded specialisations of the tiled kernel (half types,
# NHWC, 3x3 and 5x5 at stride 1, 2 x 2 work items; "Register budgets" in the source): each case
# runs one of them on an image that ends inside a tile, with asymmetric padding.  Multiplier 1
# stages 16-byte vectors, 2 pairs its slices, 3 stages one element a load.
BOUNDED_CASES = {
    "f16-3x3-m1": ((2, 17, 21, 32), (3, 3), 1, np.float16),
    "bf16-3x3-m2": ((1, 15, 18, 16), (3, 3), 2, ml_dtypes.bfloat16),
    "f16-3x3-m3": ((1, 16, 9, 5), (3, 3), 3, np.float16),
    "bf16-5x5-m1": ((1, 16, 19, 24), (5, 5), 1, ml_dtypes.bfloat16),
    "f16-5x5-m2": ((2, 15, 10, 8), (5, 5), 2, np.float16),
}
BOUNDED_PADS = ((2, 0), (0, 1))  # (top, bottom), (left, right): pad_top and pad_left differ


def run_bounded_case(case, seed, **device):
    """``case`` of BOUNDED_CASES on a host stand-in (``device``: HostDevice's arguments) through the
    public API: (result, NumPy backend's result, the tiled kernel's launches)."""
    x_shape, filt_hw, multiplier, dtype = BOUNDED_CASES[case]
    host = cuda_host.HostDevice(order="shuffled", seed=seed, compute_capability=90, **device)
    kwargs = case_kwargs(np.random.default_rng(seed), x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                         padding="EXPLICIT", pads=BOUNDED_PADS, dtype=dtype)
    want = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    with pytest.MonkeyPatch.context() as patch:
        host.install(patch)
        import cupy  # the stand-in

        got = gradops.depthwise_conv2d_native_backprop_input(
            **dict(kwargs, filter=cupy.asarray(kwargs["filter"]), out_backprop=cupy.asarray(kwargs["out_backprop"])),
            backend="cuda")
        got = to_host(got)
    return got, want, [e for e, _, _ in host.launches if "_tiled<" in e]


@pytest.mark.parametrize("case", list(BOUNDED_CASES))
def test_sm90_build_runs_the_register_bounded_tiled_kernels(case):
    """Built as sm_90 (GRADOPS_ARCH 900), the launcher's tiled kernel for these cases is one of the
    bounded specialisations, and it computes what the NumPy backend does."""
    got, want, tiled = run_bounded_case(case, 5, build_as_arch=True)
    from gradops.backends.cuda import _build

    x_shape, (k, _), _, dtype = BOUNDED_CASES[case]
    element, accumulator = _build.c_types(dtype)
    assert tiled == [f"gradops::depthwise_conv2d_native_backprop_input_tiled<{element}, {accumulator}, 0, {k}, {k}, 1, "
                     f"1, 2, 2>"]
    assert_close(got, want, dtype, scale=float(np.abs(want.astype(np.float64)).max()))


def test_only_the_sm90_build_compiles_the_bounded_specialisations(tmp_path):
    """A planted bug in the specialisations (pad_top and pad_left swapped in the call of the
    kernel body) fails the sm_90 build's result and leaves the newest arch's build, which has no
    specialisation, right: the test above runs the specialisations, not the template."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    call = "dwconv::tiled_input_gradient<ELEMENT, float, NHWC, K, K, 1, 1, 2, 2>(GRADOPS_DW_TILED_ARGS);"
    swapped = ("dwconv::tiled_input_gradient<ELEMENT, float, NHWC, K, K, 1, 1, 2, 2>(filter, out_backprop, "
               "in_backprop, in_rows, in_cols, in_depth, depth_multiplier, out_rows, out_cols, pad_left, pad_top, "
               "tiles_across, vector_loads, columns_per_warp, pair_multipliers);")
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, (call, swapped))
    for case in ("f16-3x3-m1", "bf16-5x5-m1"):
        dtype = BOUNDED_CASES[case][3]
        got, want, _ = run_bounded_case(case, 6, source_dir=tmp_path)
        assert_close(got, want, dtype, scale=float(np.abs(want.astype(np.float64)).max()))
        got, want, _ = run_bounded_case(case, 6, source_dir=tmp_path, build_as_arch=True)
        with pytest.raises(AssertionError):
            assert_close(got, want, dtype, scale=float(np.abs(want.astype(np.float64)).max()))


#: The swizzle of the staged tile planted off: every staged position keeps its channels in order.
PLANTED_NO_SWIZZLE = ("constexpr bool SWIZZLE = L == NHWC && sizeof(T) == 2 && S::TALL;",
                      "constexpr bool SWIZZLE = false;")


@pytest.mark.parametrize("dtype,k,planted", [(np.float16, 3, False), (ml_dtypes.bfloat16, 5, False),
                                             (np.float32, 3, False), (np.float16, 3, True), (np.float16, 5, True)],
                         ids=["float16-3x3", "bfloat16-5x5", "float32-3x3", "planted-unswizzled-3x3",
                              "planted-unswizzled-5x5"])
def test_tiled_nhwc_staging_stores_are_conflict_free(tmp_path, dtype, k, planted):
    """The NHWC tiled kernel's 16-byte staging stores take the fewest bank wavefronts at stride 1
    (counted by the execution model per warp-level store: tests/cuda_host_runtime.h,
    count_access): half types widen a 16-byte load to two 16-byte stores, and the swizzle keeps a
    quarter-warp's two staged positions on distinct banks.  Planted unswizzled, the same stores
    take twice the wavefronts (the 51% store conflicts the H200 measured, full_sections.md), with
    the same, right result.  Float32 (one 16-byte store a load) needs no swizzle."""
    from gradops.backends.cuda import _build

    host = cuda_host.planted_host_device(tmp_path, cuda_launcher.SOURCE, PLANTED_NO_SWIZZLE if planted else None,
                                         order="shuffled", seed=4)
    element, accumulator = _build.c_types(dtype)
    expression = f"gradops::depthwise_conv2d_native_backprop_input_tiled<{element}, {accumulator}, 0, {k}, {k}, 1, 1, 2, 2>"
    kwargs = case_kwargs(np.random.default_rng(4), x_shape=(2, 14, 16, 32), filt_hw=(k, k), multiplier=1,
                         padding="SAME", dtype=dtype)
    want = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    with pytest.MonkeyPatch.context() as patch:
        host.install(patch)
        import cupy  # the stand-in

        kernels = host.host_kernels(cuda_launcher.SOURCE, expression)
        kernels.shared_stats(reset=True, kind="store")
        got = to_host(gradops.depthwise_conv2d_native_backprop_input(
            **dict(kwargs, filter=cupy.asarray(kwargs["filter"]), out_backprop=cupy.asarray(kwargs["out_backprop"])),
            backend="cuda"))
        stores = kernels.shared_stats(kind="store")
    assert [e for e, _, _ in host.launches] == [expression]
    assert_close(got, want, dtype, scale=float(np.abs(want.astype(np.float64)).max()))
    # Two tiles of 14 x 8 positions; staged rows of 10 or 12 positions, 4 (half) or 8 (float)
    # threads each, one warp-level store per row and 16-byte store of a thread; warps whose
    # lanes are not all staging (the last rows of 64 slots) are not counted.
    assert stores["accesses"] > 0 and stores["ideal"] == 4 * stores["accesses"], stores
    assert stores["wavefronts"] == (2 if planted else 1) * stores["ideal"], stores


@pytest.mark.gpu
def test_cuda_non_default_stream(rng):
    """Under a non-blocking stream the call runs on that stream; its result is right once synchronised."""
    import cupy

    kwargs, ref, scale = make_case(rng, x_shape=(3, 40, 37, 5), filt_hw=(3, 3), multiplier=2, strides=(2, 2),
                                   padding="SAME", dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        got = cuda_call(kwargs)
        result = cupy.empty_like(got)
        result[...] = got  # ordered after the kernel only when the kernel ran on this stream
    stream.synchronize()
    assert_close(to_host(result), ref, np.float32, scale)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("filt_hw", [(3, 3), (3, 2)], ids=["specialised", "generic"])
def test_cuda_more_than_2_31_elements(filt_hw):
    """A float16 input gradient of 2**31 + 4633 elements: sampled positions (many past 2**31) match
    a NumPy sum over the out_backprop neighbourhood they gather from."""
    import cupy

    rtol = RTOL[np.dtype(np.float16)]
    rows = cols = 46341  # rows * cols = 2**31 + 4633
    x_shape = (1, rows, cols, 1)
    assert rows * cols > 2**31
    rng = np.random.default_rng(7)
    w = rng.standard_normal((*filt_hw, 1, 1)).astype(np.float16)
    dy = cupy.random.default_rng(7).standard_normal(x_shape, dtype=np.float32).astype(np.float16)
    got = gradops.depthwise_conv2d_native_backprop_input(list(x_shape), to_gpu(w), dy, [1, 1, 1, 1], "SAME",
                                                         backend="cuda")
    assert got.shape == x_shape and got.dtype == np.float16
    pad_top, pad_left = (filt_hw[0] - 1) // 2, (filt_hw[1] - 1) // 2  # SAME, stride 1
    flat = [0, 2**31 - 1, 2**31, 2**31 + 1, rows * cols - 1, *rng.integers(2**31, rows * cols, 40).tolist(),
            *rng.integers(0, rows * cols, 20).tolist()]
    for index in flat:
        y, x = divmod(int(index), cols)
        expected = magnitude = 0.0
        for r in range(filt_hw[0]):
            for s in range(filt_hw[1]):
                oy, ox = y + pad_top - r, x + pad_left - s  # stride 1: output row/col of tap (r, s)
                if 0 <= oy < rows and 0 <= ox < cols:
                    term = float(dy[0, oy, ox, 0]) * float(w[r, s, 0, 0])
                    expected, magnitude = expected + term, magnitude + abs(term)
        tolerance = rtol * max(1.0, magnitude)
        assert abs(float(got[0, y, x, 0]) - expected) <= tolerance, (y, x)


@pytest.mark.slow
@pytest.mark.parametrize("filt_hw", [(3, 3), (2, 3)], ids=["3x3-specialised", "2x3-generic"])
def test_host_more_than_2_31_elements(monkeypatch, filt_hw):
    """The kernel source's 64-bit offsets, executed on the CPU through the launcher: a float16
    input gradient of 2**31 + 7372852 elements (SAME, stride 1).  Only the last block of the
    grid-stride launch runs; elements it writes past the 2**31-th are checked against the sum
    over the out_backprop neighbourhood they gather from."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    device = cuda_host.HostDevice(block_filter=lambda expression, grid: [grid[0] - 1]).install(monkeypatch)
    import cupy  # the HostDevice stand-in: arrays between NaN guards

    rows, cols = 46341, 46500
    total = rows * cols
    x_shape = (1, rows, cols, 1)
    rng = np.random.default_rng(7)
    w = rng.standard_normal((*filt_hw, 1, 1)).astype(np.float16)
    # out_backprop is as large as the gradient: filled in place in slices with exact float16
    # values (integers below 2**11 over 512), so no second 4 GB copy is made.
    dy = cupy.empty(x_shape, np.float16)
    dy_flat = dy.reshape(-1)
    for start in range(0, total, 1 << 26):
        index = np.arange(start, min(total, start + (1 << 26)), dtype=np.int64)
        dy_flat[start:start + index.size] = ((index * 7919) % 2003 - 1001) / 512
    kwargs = dict(input_sizes=np.array(x_shape), filter=w, out_backprop=dy, strides=[1, 1, 1, 1], padding="SAME",
                  explicit_paddings=[], data_format="NHWC", dilations=[1, 1, 1, 1])
    g = geometry_of(kwargs)
    got = cuda_launcher.depthwise_conv2d_native_backprop_input(g, cupy.asarray(w), dy).reshape(-1)
    _, grid, block = device.launches[-1]
    written = cuda_host.grid_stride_elements(grid, block, total, minimum=2**31)
    assert written.size > 1000

    rtol = RTOL[np.dtype(np.float16)]
    pad_top, pad_left = (filt_hw[0] - 1) // 2, (filt_hw[1] - 1) // 2  # SAME, stride 1
    for index in [*written[:100], *written[-100:], *rng.choice(written, 100)]:
        y, x = divmod(int(index), cols)
        expected = magnitude = 0.0
        for r in range(filt_hw[0]):
            for s in range(filt_hw[1]):
                oy, ox = y + pad_top - r, x + pad_left - s  # stride 1: output row/col of tap (r, s)
                if 0 <= oy < rows and 0 <= ox < cols:
                    term = float(dy_flat[oy * cols + ox]) * float(w[r, s, 0, 0])
                    expected, magnitude = expected + term, magnitude + abs(term)
        assert abs(float(got[index]) - expected) <= rtol * max(1.0, magnitude), (y, x)
    assert np.isnan(got[:1000]).all(), "blocks outside the filter did not run"



# ---- the tensor-core kernel (NCHW float16 / bfloat16, 3x3 / 5x5 at stride 1, multipliers 1 and 2)

#: (x_shape NHWC, filt_hw, padding, pads, multiplier, dtype): maps that are not multiples of the
#: 16 x 16 unit (partial units down and across), several units per plane, out_backprop smaller
#: than the image (VALID), pads past the filter (staged rows and columns wholly outside
#: out_backprop), odd in_cols (element stores) and even ones (pair stores), a 1 x 1 image;
#: out_backprop rows staged 16, 8, 4 bytes or one element at a time (out_cols 16 / 48, 28, 14 /
#: 18, odd), and band shifts that take one k-step (VALID 5x5, EXPLICIT left pads 0 and 4) or two
#: (SAME).
MMA_CASES = {
    "f16-3x3-17x19-c3": ((2, 17, 19, 3), (3, 3), "SAME", NO_PADS, 1, np.float16),
    "bf16-5x5-33x16-m2": ((1, 33, 16, 2), (5, 5), "SAME", NO_PADS, 2, ml_dtypes.bfloat16),
    "f16-5x5-valid-20x35-m2": ((2, 20, 35, 3), (5, 5), "VALID", NO_PADS, 2, np.float16),
    "bf16-3x3-pads-past-filter": ((1, 14, 14, 2), (3, 3), "EXPLICIT", ((5, 0), (0, 6)), 1, ml_dtypes.bfloat16),
    "f16-5x5-15x15-odd-pads": ((3, 15, 15, 2), (5, 5), "EXPLICIT", ((1, 3), (4, 0)), 1, np.float16),
    "f16-5x5-14x14-c5-m2": ((2, 14, 14, 5), (5, 5), "SAME", NO_PADS, 2, np.float16),
    "bf16-3x3-1x1-image": ((2, 1, 1, 4), (3, 3), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    "f16-5x5-12x28-rows8": ((2, 12, 28, 3), (5, 5), "SAME", NO_PADS, 1, np.float16),
    "bf16-3x3-40x48-rows16-m2": ((1, 40, 48, 2), (3, 3), "EXPLICIT", ((2, 1), (0, 3)), 2, ml_dtypes.bfloat16),
    # the runs form (in_cols a multiple of 8: the 40 x 48 and 33 x 16 above too): rows that start
    # half way into a sector (40 and 24 columns), a last unit half wide (40: its second run past
    # the row), a unit row past the image (18 rows), 5x5 multiplier 2
    "f16-3x3-20x40-runs": ((2, 20, 40, 2), (3, 3), "SAME", NO_PADS, 1, np.float16),
    "bf16-5x5-18x24-runs-m2": ((2, 18, 24, 3), (5, 5), "SAME", NO_PADS, 2, ml_dtypes.bfloat16),
    # the whole-plane form (one unit a plane, the plane inside the staged window, out_cols even):
    # 16-byte chunks (16 x 16, 12 x 12, 20 x 20 from pads of K - 1 all round, where the window
    # starts at the plane), 8-byte ones (14 x 14 above; VALID 3x3 on 16 x 16; 10 x 14 with the
    # window's first row the plane's; 14 x 2, where a chunk spans two rows)
    "f16-5x5-12x12-plane16": ((2, 12, 12, 3), (5, 5), "SAME", NO_PADS, 1, np.float16),
    "bf16-3x3-16x16-plane16-m2": ((3, 16, 16, 2), (3, 3), "SAME", NO_PADS, 2, ml_dtypes.bfloat16),
    "f16-5x5-pads-4-plane16": ((2, 16, 16, 2), (5, 5), "EXPLICIT", ((4, 4), (4, 4)), 1, np.float16),
    "f16-3x3-valid-16x16-plane8-m2": ((2, 16, 16, 3), (3, 3), "VALID", NO_PADS, 2, np.float16),
    "bf16-5x5-10x14-top-row-0-plane8": ((3, 10, 14, 2), (5, 5), "EXPLICIT", ((4, 0), (2, 2)), 1, ml_dtypes.bfloat16),
    "bf16-3x3-14x2-plane8": ((2, 14, 2, 3), (3, 3), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    # the packed form (four images a unit, 2 x 2): 7 x 7 at 5x5 and 3x3, batches that leave a unit
    # one to three images short, 6 x 6, VALID (3 x 3 out_backprop), pads of K - 1 on one side and
    # 0 on the other, 1 x 1 images (above), 5 x 7
    "f16-5x5-7x7-packed-m2": ((5, 7, 7, 3), (5, 5), "SAME", NO_PADS, 2, np.float16),
    "bf16-3x3-7x7-packed": ((7, 7, 7, 2), (3, 3), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    "f16-5x5-6x6-packed": ((6, 6, 6, 2), (5, 5), "SAME", NO_PADS, 1, np.float16),
    "bf16-5x5-valid-7x7-packed-m2": ((4, 7, 7, 2), (5, 5), "VALID", NO_PADS, 2, ml_dtypes.bfloat16),
    "f16-5x5-pads-4-0-packed": ((9, 5, 6, 2), (5, 5), "EXPLICIT", ((4, 0), (0, 4)), 1, np.float16),
    "f16-3x3-5x7-packed-m2": ((2, 5, 7, 3), (3, 3), "SAME", NO_PADS, 2, np.float16),
}


@pytest.mark.parametrize("target_warps", [None, 2], ids=["one-unit-per-warp", "several-units-per-warp"])
@pytest.mark.parametrize("case", list(MMA_CASES))
def test_cuda_mma_edges(cuda_device, rng, monkeypatch, case, target_warps):
    """The tensor-core kernel (forced) matches the loops and the NumPy backend at its edges; with
    a small warp target each warp takes several units (its filter fragments reused)."""
    x_shape, filt_hw, padding, pads, multiplier, dtype = MMA_CASES[case]
    if target_warps is not None:
        monkeypatch.setattr(cuda_launcher, "MMA_TARGET_WARPS", target_warps)
    kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, padding=padding,
                                   pads=pads, data_format="NCHW", dtype=dtype)
    g = geometry_of(kwargs)
    assert cuda_launcher.mma_possible(g, np.dtype(dtype))
    if target_warps is not None:  # some warp takes more than one image, where a CTA's warps cannot take one each
        assert cuda_launcher.mma_grid(g)[2] * cuda_launcher.MMA_WARPS < g.batch or g.batch <= cuda_launcher.MMA_WARPS
    check_cuda(kwargs, ref, scale, path="mma", device=cuda_device)
    if cuda_device is not None:  # the form the launcher's tests give
        assert launched_form(cuda_device) == cuda_launcher.mma_form(g, np.dtype(dtype))
    if cuda_launcher.mma_runs_possible(g, np.dtype(dtype)):
        check_cuda(kwargs, ref, scale, path="mma_runs", device=cuda_device)
        if cuda_device is not None:
            assert launched_form(cuda_device) == cuda_launcher.MMA_FORMS.index("runs")
    if case.endswith("packed") or "-packed-" in case:
        assert cuda_launcher.mma_form(g, np.dtype(dtype)) == cuda_launcher.MMA_FORMS.index("packed")
    elif "plane" in case:
        assert cuda_launcher.mma_form(g, np.dtype(dtype)) == cuda_launcher.MMA_FORMS.index("plane")


def launched_form(device) -> int:
    """The form (an index of MMA_FORMS) of the tensor-core kernel last launched on the host stand-in."""
    name = device.launches[-1][0]
    assert "_mma<" in name
    args = name.split("<", 1)[1].rsplit(">", 1)[0].split(",")
    return int(args[3]) if len(args) > 3 else 0


#: Runs-form geometries (x_shape NHWC, filt_hw, padding, pads, multiplier): rows on whole sectors
#: (112 columns) and half way (56, 40, 24), partial units across and down, EXPLICIT pads, 5x5.
MMA_RUNS_CASES = (((2, 18, 112, 2), (3, 3), "SAME", NO_PADS, 1), ((1, 21, 56, 3), (3, 3), "SAME", NO_PADS, 2),
                  ((2, 20, 40, 2), (5, 5), "SAME", NO_PADS, 1), ((3, 9, 24, 2), (5, 5), "SAME", NO_PADS, 2),
                  ((1, 17, 16, 2), (3, 3), "EXPLICIT", ((2, 0), (0, 2)), 1))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_cuda_mma_runs_equal_the_pair_stores(cuda_device, rng, dtype):
    """The runs form's results (path="mma_runs", in_cols a multiple of 8) are bit for bit the rows
    form's (path="mma", the launcher's: the same accumulators, rounded by the same conversion), on
    rows that start on a sector and half way into one, partial units, and a plane with an Inf in
    out_backprop (its units take the checked sums, then the runs)."""
    for x_shape, filt_hw, padding, pads, multiplier in MMA_RUNS_CASES:
        kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                                       padding=padding, pads=pads, data_format="NCHW", dtype=dtype)
        dy = kwargs["out_backprop"].copy()
        dy[0, -1, dy.shape[2] // 2, 3] = np.inf
        for out_backprop in (kwargs["out_backprop"], dy):
            case = dict(kwargs, out_backprop=out_backprop)
            g = geometry_of(case)
            assert cuda_launcher.mma_runs_possible(g, np.dtype(dtype))
            runs = to_host(cuda_call(case, path="mma_runs"))
            if cuda_device is not None:
                assert launched_form(cuda_device) == cuda_launcher.MMA_FORMS.index("runs")
            pairs = to_host(cuda_call(case, path="mma"))
            if cuda_device is not None:
                assert launched_form(cuda_device) == cuda_launcher.MMA_FORMS.index("rows")
            np.testing.assert_array_equal(runs.view(np.uint16), pairs.view(np.uint16))
            want = gradops.depthwise_conv2d_native_backprop_input(**case, backend="numpy")
            assert_same_non_finite(runs, want, dtype)


def test_mma_runs_choice(monkeypatch):
    """The runs form is the rows form's where in_cols is a multiple of 8 and it is asked for
    (runs=True, path="mma_runs"; by itself only with MMA_RUNS_BY_DEFAULT, off until a GPU times
    it); never the whole-plane or packed forms'."""
    forms = cuda_launcher.MMA_FORMS

    def form(x_shape, filt=3, runs=None):
        kwargs = case_kwargs(np.random.default_rng(0), x_shape=x_shape, filt_hw=(filt, filt), multiplier=1,
                             padding="SAME", data_format="NCHW", dtype=np.float16)
        return forms[cuda_launcher.mma_form(geometry_of(kwargs), np.dtype(np.float16), runs=runs)]

    assert not cuda_launcher.MMA_RUNS_BY_DEFAULT and form((2, 112, 112, 2)) == "rows"
    assert [form((2, 112, 112, 2), runs=True), form((2, 56, 56, 2), runs=True),
            form((1, 20, 40, 2), 5, runs=True)] == ["runs"] * 3
    assert [form(shape, runs=True) for shape in ((2, 28, 28, 2), (2, 20, 35, 2), (2, 30, 44, 2))] == ["rows"] * 3
    assert [form((2, 16, 16, 2), runs=True), form((5, 7, 7, 2), 5, runs=True),
            form((2, 8, 8, 2), runs=True)] == ["plane", "packed", "plane"]
    monkeypatch.setattr(cuda_launcher, "MMA_RUNS_BY_DEFAULT", True)
    assert form((2, 112, 112, 2)) == "runs" and form((2, 112, 112, 2), runs=False) == "rows"
    f16 = np.dtype(np.float16)
    small = geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(2, 16, 16, 2), filt_hw=(3, 3), multiplier=1,
                                    padding="SAME", data_format="NCHW", dtype=np.float16))
    from gradops.backends.cuda import _runtime

    monkeypatch.setattr(_runtime, "compute_capability", lambda: 90)
    with pytest.raises(ValueError, match="runs form cannot run"):
        cuda_launcher.pick_path(small, f16, "mma_runs")  # the whole-plane form's map


def mma_runs_problems(rng):
    """[(kwargs, reference)] of MMA_RUNS_CASES in float16, the second with an Inf in out_backprop."""
    problems = []
    for i, (x_shape, filt_hw, padding, pads, multiplier) in enumerate(MMA_RUNS_CASES):
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, padding=padding,
                             pads=pads, data_format="NCHW", dtype=np.float16)
        if i == 1:
            kwargs["out_backprop"][0, 5, 10, 30] = np.inf  # NCHW: channel 5, row 10, column 30
        problems.append((kwargs, gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")))
    return problems


#: Bugs planted in the runs form's stores: (text, replacement).
PLANTED_MMA_RUNS = {
    "runs-row-of-the-next-unit-row": ("const int y = y0 + a_row, x = x0 + a_col;",
                                      "const int y = y0 + (a_row + 1) % 16, x = x0 + a_col;"),
    "runs-first-run-twice": ("const int y = y0 + a_row, x = x0 + a_col;", "const int y = y0 + a_row, x = x0;"),
    "runs-past-the-last-row": ("if (y < in_rows && x < in_cols)  // in_cols a multiple of 8",
                               "if (x < in_cols)  // in_cols a multiple of 8"),
    "runs-image-pairs-misplaced": ("dwconv::store_pair<T>(image + (g + 8 * h) * kRowPitch + 8 * j + 2 * t,",
                                   "dwconv::store_pair<T>(image + (g + 8 * h) * kRowPitch + 8 * j + t,"),
    # the image over the tile before every lane's last ldmatrix of it, and the runs read before
    # every lane has written its pairs: races, which the host model's lanes (fibers) lose
    "runs-image-before-the-products-end": (
        "__syncwarp();  // every lane's reads of the tile (ldmatrix, the checked sums) are done\n", ""),
    "runs-read-before-the-image-is-written": (
        "acc[j][2 * h], acc[j][2 * h + 1]);\n            __syncwarp();\n", "acc[j][2 * h], acc[j][2 * h + 1]);\n"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_MMA_RUNS))
def test_planted_mma_runs_bugs(bug, tmp_path, monkeypatch):
    """Each bug planted in the runs form's stores is caught by the comparison with NumPy on
    mma_runs_problems (the races too: the host model's lanes run them in an order that loses)."""
    edit = PLANTED_MMA_RUNS[bug]

    def results():
        problems = mma_runs_problems(np.random.default_rng(17))
        return [to_host(cuda_call(kwargs, path="mma_runs")) for kwargs, _ in problems], [want for _, want in problems]

    def check(got, want):
        for one, reference in zip(got, want):
            assert_same_non_finite(one, reference, np.float16)

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, edit, results, check, 5, tmp_path, monkeypatch)


def test_mma_runs_racecheck(racecheck_device, rng):
    """The runs form in a racecheck build: no shared-memory hazard between the products' reads,
    the image's writes and the runs' reads, and no access past an array (several units a warp)."""
    for kwargs, want in mma_runs_problems(rng):
        assert_same_non_finite(to_host(cuda_call(kwargs, path="mma_runs")), want, np.float16)
        assert launched_form(racecheck_device) == cuda_launcher.MMA_FORMS.index("runs")


def test_mma_plane_chunk():
    """Where the tensor-core kernel stages whole planes, and in chunks of how many elements: one
    unit a plane, every out_backprop row and column inside the unit's staged window, out_cols
    even, at most 64 chunks; 16-byte chunks where they divide the plane, else 8-byte ones."""
    def g(x_shape, filt=5, padding="SAME", pads=NO_PADS):
        kwargs = case_kwargs(np.random.default_rng(0), x_shape=x_shape, filt_hw=(filt, filt), multiplier=1,
                             padding=padding, pads=pads, data_format="NCHW", dtype=np.float16)
        return geometry_of(kwargs)

    half = np.dtype(np.float16)
    cases = {
        ((2, 14, 14, 3), 5, "SAME", NO_PADS): 4,   # 196 elements: 49 chunks of 4
        ((2, 14, 14, 3), 3, "SAME", NO_PADS): 4,
        ((2, 16, 16, 3), 5, "SAME", NO_PADS): 8,   # 256: 32 chunks of 8
        ((2, 12, 12, 3), 5, "SAME", NO_PADS): 8,
        ((2, 16, 16, 3), 5, "EXPLICIT", ((4, 4), (4, 4))): 8,  # 20 x 20 = 400: 50 chunks of 8
        ((2, 16, 16, 3), 3, "VALID", NO_PADS): 4,  # 14 x 14
        ((2, 7, 7, 3), 5, "SAME", NO_PADS): 0,     # out_cols odd
        ((2, 28, 28, 3), 5, "SAME", NO_PADS): 0,   # 2 x 2 units
        ((2, 14, 17, 3), 5, "SAME", NO_PADS): 0,   # 2 units across
        ((2, 14, 14, 3), 3, "EXPLICIT", ((5, 0), (0, 6))): 0,  # out_backprop rows above the window
        ((2, 16, 16, 3), 5, "EXPLICIT", ((0, 8), (0, 0))): 0,  # rows below it
        ((2, 16, 16, 3), 5, "EXPLICIT", ((0, 0), (0, 20))): 0,  # 32 columns, 8 of them before the window's first
    }
    for (x_shape, filt, padding, pads), want in cases.items():
        geometry = g(x_shape, filt, padding, pads)
        assert cuda_launcher.mma_plane_chunk(geometry, half) == want, (x_shape, filt, padding, pads)
    # more than 64 chunks of 4: 18 x 18 = 324 elements, not a multiple of 8 (81 chunks of 4)
    wide = g((2, 16, 16, 3), 5, "EXPLICIT", ((3, 3), (3, 3)))
    assert (wide.out_rows, wide.out_cols) == (18, 18) and cuda_launcher.mma_plane_chunk(wide, half) == 0


def test_mma_pack_stride():
    """The packed form's stride S and where it runs: S the least that keeps each image's reads
    off the others' out_backprop (rows + pad_top, K - pad_top + out_rows - 1, the same across),
    two images of S + rows <= 16 a unit, their out_backprop inside the staged window and the four
    planes within 224 elements."""
    def g(x_shape, filt=5, padding="SAME", pads=NO_PADS):
        kwargs = case_kwargs(np.random.default_rng(0), x_shape=x_shape, filt_hw=(filt, filt), multiplier=1,
                             padding=padding, pads=pads, data_format="NCHW", dtype=np.float16)
        return geometry_of(kwargs)

    cases = {
        ((2, 7, 7, 3), 5, "SAME", NO_PADS): 9,      # 7 + 2 and 5 - 2 + 7 - 1: 9 + 7 = 16
        ((2, 7, 7, 3), 3, "SAME", NO_PADS): 8,
        ((2, 6, 6, 3), 5, "SAME", NO_PADS): 8,
        ((2, 7, 7, 3), 5, "VALID", NO_PADS): 7,     # 3 x 3 out_backprop: 7 and 5 + 3 - 1
        ((2, 5, 6, 3), 5, "EXPLICIT", ((4, 0), (0, 4))): 10,  # columns: 5 - 0 + 6 - 1
        ((2, 1, 1, 3), 3, "SAME", NO_PADS): 2,
        ((2, 8, 8, 3), 3, "SAME", NO_PADS): 0,      # S = 9: 9 + 8 > 16
        ((2, 7, 9, 3), 5, "SAME", NO_PADS): 0,      # S = 11 across
        ((2, 14, 14, 3), 5, "SAME", NO_PADS): 0,
        ((2, 6, 6, 3), 5, "EXPLICIT", ((5, 0), (0, 0))): 0,  # a pad past K - 1
    }
    for (x_shape, filt, padding, pads), want in cases.items():
        geometry = g(x_shape, filt, padding, pads)
        assert cuda_launcher.mma_pack_stride(geometry) == want, (x_shape, filt, padding, pads)
        assert (cuda_launcher.mma_form(geometry, np.float16) == cuda_launcher.MMA_FORMS.index("packed")) == (want > 0)


def test_cuda_mma_plane_alignment(cuda_device, rng):
    """The whole-plane form takes the widest chunk out_backprop is aligned to: 16 bytes, 8 bytes
    from an allocation 8 bytes in, and staged rows (the row form) from one 2 bytes in; every
    result matches the loops."""
    kwargs, ref, scale = make_case(rng, x_shape=(2, 16, 16, 3), filt_hw=(5, 5), multiplier=2, padding="SAME",
                                   data_format="NCHW", dtype=np.float16)
    g = geometry_of(kwargs)
    dy = kwargs["out_backprop"]
    for shift, chunk in ((0, 8), (4, 4), (1, 0)):
        view = shifted_gpu(dy, shift)
        assert cuda_launcher.mma_plane_chunk(g, np.float16, view) == chunk
        got = to_host(cuda_call(kwargs, path="mma", out_backprop=view))
        if cuda_device is not None:
            assert launched_form(cuda_device) == (1 if chunk else 0)
        assert_close(got, ref, np.float16, scale)


def test_cuda_mma_misaligned_out_backprop(cuda_device, rng):
    """An out_backprop that starts 2 bytes into an allocation is staged one element per load."""
    kwargs, ref, scale = make_case(rng, x_shape=(2, 11, 32, 3), filt_hw=(5, 5), multiplier=1, padding="SAME",
                                   data_format="NCHW", dtype=np.float16)
    dy = kwargs["out_backprop"]
    dy_view = shifted_gpu(dy, 1)
    g = geometry_of(kwargs)
    assert cuda_launcher.mma_chunk(g, np.float16) == 8 and cuda_launcher.mma_chunk(g, np.float16, dy_view) == 1
    got = to_host(cuda_call(kwargs, path="mma", out_backprop=dy_view))
    assert cuda_device is None or launched(cuda_device) == "mma"
    assert_close(got, ref, np.float16, scale)


def test_mma_choice(monkeypatch):
    """What the tensor-core kernel takes, and where the launcher picks it by itself
    (MMA_CHOICE: 5x5 at multipliers 1 and 2 on maps whose units are at least 75% inside, whatever
    the staging; 3x3 row-form maps take the planes kernel, as the H100 measured on 2026-12-06;
    MMA_PLANE_CHOICE: wherever the whole-plane form runs (14 x 14);
    MMA_PACKED_CHOICE: where the packed form runs (7 x 7), at 5x5; never float32 or before sm_80,
    where the planes kernel runs NCHW)."""
    def g(x_shape=(2, 28, 28, 8), filt_hw=(5, 5), multiplier=1, strides=(1, 1), dilations=(1, 1),
          data_format="NCHW", dtype=np.float16):
        """The validated geometry of a SAME case (shapes only: no arrays, no reference)."""
        n, h, w, c = x_shape
        oh, ow = out_hw((h, w), filt_hw, strides, dilations, "SAME", NO_PADS)
        geometry = conv2d_geometry(OP, to_format(x_shape, data_format), (*filt_hw, c, multiplier),
                                   to_format((n, oh, ow, c * multiplier), data_format),
                                   attr4(*strides, data_format), "SAME", [], data_format,
                                   attr4(*dilations, data_format), depthwise=True)
        return geometry, np.dtype(dtype)

    assert cuda_launcher.mma_possible(*g())
    assert cuda_launcher.mma_possible(*g(filt_hw=(3, 3), multiplier=2, dtype=ml_dtypes.bfloat16))
    for refused in (g(data_format="NHWC"), g(dtype=np.float32), g(dtype=np.float64), g(strides=(2, 2)),
                    g(dilations=(2, 1)), g(multiplier=3), g(filt_hw=(3, 5)), g(filt_hw=(7, 7))):
        assert not cuda_launcher.mma_possible(*refused)
    assert cuda_launcher.mma_fill(g()[0]) == pytest.approx(28 * 28 / (32 * 32))
    chosen = [g(multiplier=2), g(multiplier=2, dtype=ml_dtypes.bfloat16),  # rows: 77% inside, 4-byte staging
              g(), g(dtype=ml_dtypes.bfloat16),  # 5x5 multiplier 1 likewise
              g(x_shape=(2, 14, 14, 8), multiplier=2),
              g(x_shape=(2, 14, 14, 8)),  # whole planes in 8-byte chunks (rows would take 4-byte ones)
              g(x_shape=(2, 14, 14, 8), filt_hw=(3, 3), multiplier=2),  # whole planes (77% of the unit inside)
              g(x_shape=(2, 14, 14, 8), filt_hw=(3, 3)),  # whole planes at 3x3 multiplier 1
              g(x_shape=(2, 7, 7, 8), multiplier=2), g(x_shape=(2, 7, 7, 8)),  # packed, 4 images a unit
              g(x_shape=(2, 64, 64, 8)),  # 5x5 multiplier 1: all inside, 16-byte staging
              g(x_shape=(2, 112, 112, 8), multiplier=2)]  # 5x5 multiplier 2 likewise
    not_chosen = [g(x_shape=(2, 7, 7, 8), filt_hw=(3, 3)),  # packed, but 3x3 at multiplier 1
                  g(x_shape=(2, 7, 7, 8), filt_hw=(3, 3), multiplier=2),  # packed, 3x3 at multiplier 2
                  g(x_shape=(2, 40, 40, 8), filt_hw=(3, 3)),  # 16-byte staging, but 69% inside
                  g(x_shape=(2, 40, 40, 8), filt_hw=(5, 5), multiplier=2),  # 69% inside
                  g(dtype=np.float32), g(data_format="NHWC"), g(strides=(2, 2))]
    # 3x3 row-form maps, which the kernel runs: the planes kernel (MMA_CHOICE has no 3x3 entry)
    rows_3x3 = [g(x_shape=(2, side, side, 8), filt_hw=(3, 3), multiplier=m) for side in (112, 56, 28) for m in (1, 2)]
    rows_3x3.append(g(x_shape=(1, 32, 48, 8), filt_hw=(3, 3), multiplier=2))
    assert all(cuda_launcher.mma_possible(*c) and cuda_launcher.mma_fill(c[0]) >= 0.75 for c in rows_3x3)
    assert [cuda_launcher.MMA_FORMS[cuda_launcher.mma_form(*c)] for c in rows_3x3] == ["rows"] * len(rows_3x3)
    assert [cuda_launcher.pick_path(*c, arch=90) for c in rows_3x3] == ["planes"] * len(rows_3x3)
    assert [cuda_launcher.mma_chosen(*c, arch=90) for c in chosen] == [True] * len(chosen)
    assert [cuda_launcher.mma_chosen(*c, arch=90) for c in not_chosen] == [False] * len(not_chosen)
    m2 = g(multiplier=2)
    assert not cuda_launcher.mma_chosen(*m2, arch=75) and cuda_launcher.mma_chosen(*m2, arch=80)
    assert cuda_launcher.pick_path(*m2, arch=90) == "mma" and cuda_launcher.pick_path(*m2, arch=75) == "planes"
    assert cuda_launcher.pick_path(*g(x_shape=(2, 40, 40, 8), filt_hw=(3, 3)), arch=90) == "planes"
    assert cuda_launcher.pick_path(*g(data_format="NHWC"), arch=90) == "tiled"
    monkeypatch.setattr(cuda_launcher, "MMA_BY_DEFAULT", False)
    assert not cuda_launcher.mma_chosen(*m2, arch=90)
    # units over MMA_TARGET_WARPS images a warp (at most MMA_UNITS_PER_WARP): 50176 -> 7, 21504 -> 3
    assert cuda_launcher.mma_grid(g(x_shape=(32, 112, 112, 32))[0]) == (7 * 7, 32, 2)
    assert cuda_launcher.mma_grid(g(x_shape=(32, 14, 14, 672))[0]) == (1, 672, 3)
    assert cuda_launcher.mma_grid(g(x_shape=(2, 14, 14, 8))[0]) == (1, 8, 1)  # one image a warp, 2 warps idle
    # packed: four images a unit, 8 units a channel, two a warp: 9216 units over 8192
    assert cuda_launcher.mma_grid(g(x_shape=(32, 7, 7, 1152))[0]) == (1, 1152, 1)
    assert cuda_launcher.mma_grid(g(x_shape=(9, 7, 7, 8))[0]) == (1, 8, 1)  # 3 units (the last one image)
    assert "_mma<" not in " ".join(cuda_launcher.instantiations(75)[cuda_launcher.SOURCE])
    assert sum("_mma<" in e for e in cuda_launcher.instantiations(80)[cuda_launcher.SOURCE]) == 32  # 2 x 2 x 2 x 4 forms


def mma_non_finite_problem(rng, dtype=np.float16):
    """(kwargs, reference result): NCHW 5x5 multiplier 2 on 2 images of 20 x 35 (2 x 3 units), an
    Inf in out_backprop inside one unit, a NaN filter tap that lands on the padding for the
    image's edges, an Inf tap, and otherwise finite values."""
    kwargs = case_kwargs(rng, x_shape=(2, 20, 35, 3), filt_hw=(5, 5), multiplier=2, padding="SAME",
                         data_format="NCHW", dtype=dtype)
    dy = kwargs["out_backprop"].copy()
    dy[1, 3, 12, 20] = np.inf
    w = kwargs["filter"].copy()
    w[0, 0, 1, 1] = np.nan
    w[4, 4, 2, 0] = np.inf
    kwargs.update(out_backprop=dy, filter=w)
    return kwargs, gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")


def assert_same_non_finite(got, want, dtype):
    for name, mask in (("NaN", np.isnan), ("Inf", np.isinf)):
        np.testing.assert_array_equal(mask(got.astype(np.float64)), mask(want.astype(np.float64)), err_msg=name)
    finite = np.isfinite(want.astype(np.float64))
    assert_close(got[finite], want[finite], dtype, scale=float(np.abs(want[finite].astype(np.float64)).max()))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_cuda_mma_non_finite_values(cuda_device, rng, dtype):
    """An Inf in out_backprop and an Inf and a NaN in the filter reach exactly the elements TF's
    sums give them: units where the band's zeros met them are recomputed by the checked sums.
    Two runs are bitwise equal (on the host, blocks and threads in another order)."""
    kwargs, want = mma_non_finite_problem(rng, dtype)
    got = to_host(cuda_call(kwargs, path="mma"))
    assert cuda_device is None or launched(cuda_device) == "mma"
    assert np.isnan(want.astype(np.float64)).any() and np.isinf(want.astype(np.float64)).any()
    assert_same_non_finite(got, want, dtype)
    if cuda_device is not None:
        cuda_device.seed += 1
    assert to_host(cuda_call(kwargs, path="mma")).tobytes() == got.tobytes()


PLANTED_MMA = {  # bugs in the tensor-core kernel: name -> (text of the real source, its replacement)
    "mma-band-mirrored": ("const int sg = g - 2 * t + shift + K - 1;", "const int sg = 2 * t - g + shift + K - 1;"),
    "mma-band-ignores-the-shift": ("const int sg = g - 2 * t + shift + K - 1;", "const int sg = g - 2 * t + K - 1;"),
    "mma-band-reads-the-other-copy": ("const int copy = (sg + kBandZero) & 1;", "const int copy = (sg + kBandZero + 1) & 1;"),
    "mma-band-pairs-the-wrong-neighbour": ("band[q][rs / K][1][kBandZero + 1 - rs % K] = value;",
                                           "band[q][rs / K][1][kBandZero - 1 - rs % K] = value;"),
    "mma-band-filter-of-another-slice": ("const T value = filter[(rs * in_depth + c) * M + q];",
                                         "const T value = filter[(rs * in_depth + c) * M];"),
    "mma-rows-not-shifted-per-tap": ("ptx::ldmatrix<4, false>(groups[1], &tile[q][a_row + K - 1 - r][16 + a_col]);",
                                     "ptx::ldmatrix<4, false>(groups[1], &tile[q][a_row + r][16 + a_col]);"),
    "mma-second-half-reads-the-first": ("group1[2] = {groups[0][2], groups[0][3]}", "group1[2] = {groups[0][0], groups[0][1]}"),
    "mma-group-rows-swapped": ("group2[2] = {groups[1][0], groups[1][1]}", "group2[2] = {groups[1][1], groups[1][0]}"),
    "mma-first-half-skips-its-third-group": ("ptx::mma_m16n8k8<T>(acc[0], group2, band_hi[q][r][1], acc[0]);", ""),
    "mma-second-half-takes-the-first-halfs-band": ("ptx::mma_m16n8k16<T>(acc[1], groups[1], band_hi[q][r], acc[1]);",
                                                   "ptx::mma_m16n8k16<T>(acc[1], groups[1], band_lo[q][r], acc[1]);"),
    "mma-band-second-copy-of-block-1-misplaced": ("ptx::ld_shared_32_volatile(block + 8)",
                                                  "ptx::ld_shared_32_volatile(block + 6)"),
    "mma-band-blocks-misplaced": ("band_hi[q][r][1] = ptx::ld_shared_32(block + 16);",
                                  "band_hi[q][r][1] = ptx::ld_shared_32(block + 12);"),
    "mma-slices-share-a-plane": ("(n * out_depth + c * M + q) * out_rows", "(n * out_depth + c * M) * out_rows"),
    "mma-last-image-dropped": ("n < batch; n += image_step", "n < batch - 1; n += image_step"),
    "mma-last-image-row-dropped": ("if (y >= in_rows || x >= in_cols) continue;",
                                   "if (y >= in_rows - 1 || x >= in_cols) continue;"),
    "mma-never-checks-non-finite": ("return !__any_sync(0xffffffffu, probe != 0.0f);", "return !__any_sync(0xffffffffu, 0);"),
    "mma-checked-sums-ignore-the-top-edge": (
        "if (static_cast<unsigned>(y_in + pad_top - r) >= static_cast<unsigned>(out_rows)) continue;", ""),
    "mma-staging-ignores-the-left-edge": ("const bool col_in = static_cast<unsigned>(a0 + col) < static_cast<unsigned>(out_cols);",
                                          "const bool col_in = a0 + col < out_cols;"),
    "mma-staging-drops-the-last-row": ("if (CHUNKS % 32 == 0 || row < ROWS) *reinterpret_cast<Raw*>",
                                       "if (row < ROWS - 1) *reinterpret_cast<Raw*>"),
    # Caught since the host model poisons shared memory before each block (a GPU leaves it
    # undefined): the band's zeros (taps outside the filter) would otherwise be a fresh static's.
    "mma-band-zeros-never-written": ("for (int i = lane; i < kZeroChunks; i += 32) chunks[i] = make_uint4(0, 0, 0, 0);",
                                     "(void)chunks;"),
}


def mma_plane_problem(rng, dtype=np.float16):
    """[(kwargs, reference result)] for the whole-plane form: 5x5 multiplier 2 on 9 images of
    14 x 14 (8-byte chunks; 49 a plane, so lanes 0 - 16 stage two), and 3x3 multiplier 2 on 9
    images of 16 x 16 (16-byte chunks), each with an Inf in out_backprop and a NaN filter tap
    that lands on the padding; a small warp target gives each warp several images (its zeros
    outside the plane written once)."""
    problems = []
    for x_shape, filt in (((9, 14, 14, 3), 5), ((9, 16, 16, 2), 3)):
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=(filt, filt), multiplier=2, padding="SAME",
                             data_format="NCHW", dtype=dtype)
        dy = kwargs["out_backprop"].copy()
        dy[4, 1, 7, 3] = np.inf
        w = kwargs["filter"].copy()
        w[0, filt - 1, 1, 1] = np.nan
        kwargs.update(out_backprop=dy, filter=w)
        problems.append((kwargs, gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")))
    return problems


#: Bugs planted in the whole-plane form, each caught by mma_plane_problem.  The zeros outside the
#: plane are written once a warp: one bug writes float16 ones there (finite: NaNs there would
#: only send every unit through the checked sums, which skip them), one never writes them (caught
#: since the host model poisons shared memory before each block, as a GPU leaves it undefined:
#: NaN in half the blocks, whose units then take the checked sums, and a finite value in the
#: others, which the products take in; before that, a fresh static's zeros hid it).
PLANTED_MMA_PLANE = {
    "mma-plane-pairs-never-wrap-to-the-next-row": ("if (col == out_cols) col = 0, ++row;", ""),
    "mma-plane-one-offset-a-chunk": ("*reinterpret_cast<unsigned*>(tile + offset[i][p]) = words[p];",
                                     "*reinterpret_cast<unsigned*>(tile + offset[i][0] + 2 * p) = words[p];"),
    "mma-plane-offsets-ignore-the-windows-first-column": (
        "offset[i][p] = (row - o_row0) * kRowPitch + col - a0;", "offset[i][p] = (row - o_row0) * kRowPitch + col;"),
    "mma-plane-last-chunk-not-stored": ("for (int i = 0; i < kPlaneSteps; ++i)\n        if (lane + 32 * i < chunks) {",
                                        "for (int i = 0; i < kPlaneSteps; ++i)\n        if (lane + 32 * i < chunks - 1) {"),
    "mma-plane-second-step-not-loaded": ("if (lane + 32 * i < chunks) raw[i] =", "if (i == 0) raw[i] ="),
    "mma-plane-slices-share-a-plane": ("(n * out_depth + c * M + q) * plane_size", "(n * out_depth + c * M) * plane_size"),
    "mma-plane-ones-outside-the-plane": ("chunks[i] = make_uint4(0, 0, 0, 0);\n    }",
                                         "chunks[i] = make_uint4(0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u);\n    }"),
    "mma-plane-zeros-outside-the-plane-never-written": ("chunks[i] = make_uint4(0, 0, 0, 0);\n    }",
                                                        "(void)chunks;\n    }"),
    "mma-plane-chunk-of-4-taken-for-8": ("stage_plane<8>(&tile[q][0][0], whole, lane, plane_chunks, plane_offset);",
                                         "stage_plane<4>(&tile[q][0][0], whole, lane, plane_chunks, plane_offset);"),
}


def mma_packed_problem(rng, dtype=np.float16):
    """[(kwargs, reference result)] for the packed form: 5x5 multiplier 2 on 7 images of 7 x 7 (a
    unit of four and one of three) with an Inf in out_backprop, a NaN filter tap that lands on
    the padding and an Inf one; 3x3 on 18 images of 5 x 7 (five units a channel, the last two
    images; with a warp target of 2, as the tests set, a warp takes two)."""
    problems = []
    for x_shape, filt, multiplier in (((7, 7, 7, 3), 5, 2), ((18, 5, 7, 2), 3, 1)):
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=(filt, filt), multiplier=multiplier, padding="SAME",
                             data_format="NCHW", dtype=dtype)
        dy = kwargs["out_backprop"].copy()
        dy[5, 1, 3, 2] = np.inf
        w = kwargs["filter"].copy()
        w[0, filt - 1, 1, 0] = np.nan
        w[filt // 2, 0, 0, 0] = np.inf
        kwargs.update(out_backprop=dy, filter=w)
        problems.append((kwargs, gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")))
    return problems


#: Bugs planted in the packed form, each caught by mma_packed_problem.  Not among them: staging
#: the images past the batch from memory instead of as zeros.  Only those images' results, which
#: are not stored, read them (or, if not finite, they send the unit through the checked sums), so
#: the values stay right; the reads past out_backprop are what is wrong, which a racecheck build's
#: memcheck refuses (test_planted_out_of_bounds_read_only_memcheck_catches), as compute-sanitizer's
#: memcheck would on a GPU (scripts/device-session.sh runs the mma tests under it).  Nor storing the
#: results of the gap between images: they land in the next plane's first row, where the right
#: value may or may not overwrite them, depending on the blocks' order.
PLANTED_MMA_PACKED = {
    "mma-packed-images-side-by-side-only": ("((p / 2) * pack_stride + row - o_row0) * kRowPitch", "(row - o_row0) * kRowPitch"),
    "mma-packed-image-stride-ignored": ("source[i] = inside ? p * image_stride + within : kPackNone;",
                                        "source[i] = inside ? within : kPackNone;"),
    "mma-packed-rows-split-at-the-wrong-width": ("col = within - row * out_cols;", "col = within - row * (out_cols - 1);"),
    "mma-packed-lower-images-results-a-row-down": ("const int y = row - pr * pack_stride,",
                                                   "const int y = row - pr * (pack_stride - 1),"),
    "mma-packed-results-in-the-first-image": ("(2 * pr + pc) * in_image_stride + y * in_cols + x : -1;",
                                              "y * in_cols + x : -1;"),
    "mma-packed-a-warps-next-unit-skips-an-image": ("kWarps * IMAGES;\n", "kWarps * IMAGES + 1;\n"),
    "mma-packed-checked-sums-in-unit-coordinates": (
        "const int y_in = PACKED ? i - (i >= pack_stride ? pack_stride : 0) : y0 + i;", "const int y_in = y0 + i;"),
    "mma-packed-quotient-truncated-low": ("return static_cast<int>((static_cast<float>(e) + 0.5f) * inv);",
                                          "return static_cast<int>((static_cast<float>(e) - 0.5f) * inv);"),
}


#: The whole-plane and packed forms' problems, their planted bugs and the seed the planted-bug
#: tests take.
MMA_FORM_PROBLEMS = {"plane": (mma_plane_problem, PLANTED_MMA_PLANE, 5),
                     "packed": (mma_packed_problem, PLANTED_MMA_PACKED, 7)}


@pytest.mark.parametrize("form", list(MMA_FORM_PROBLEMS))
def test_cuda_mma_form_non_finite_values(cuda_device, rng, monkeypatch, form):
    """The form's problem (mma_plane_problem, mma_packed_problem) through that form, with several
    units a warp: every element as the NumPy backend has it (an Inf's unit recomputed by the
    checked sums), and the form is the one launched."""
    monkeypatch.setattr(cuda_launcher, "MMA_TARGET_WARPS", 2)
    problem, _, _ = MMA_FORM_PROBLEMS[form]
    for kwargs, want in problem(rng):
        g = geometry_of(kwargs)
        assert cuda_launcher.mma_form(g, np.float16) == cuda_launcher.MMA_FORMS.index(form)
        if form == "plane":
            assert cuda_launcher.mma_plane_chunk(g, np.float16) in (4, 8) and cuda_launcher.mma_grid(g)[2] == 1
        got = to_host(cuda_call(kwargs, path="mma"))
        if cuda_device is not None:
            assert launched_form(cuda_device) == cuda_launcher.MMA_FORMS.index(form)
        assert np.isnan(want.astype(np.float64)).any() and np.isinf(want.astype(np.float64)).any()
        assert_same_non_finite(got, want, np.float16)


@pytest.mark.parametrize("form, bug", [(form, bug) for form, (_, bugs, _) in MMA_FORM_PROBLEMS.items()
                                       for bug in sorted(bugs)])
def test_planted_mma_form_bugs_fail_the_comparison(form, bug, tmp_path, monkeypatch):
    """Each bug planted in the whole-plane or packed form makes that form's problem's result
    differ from the NumPy backend (or the launch fail on an access outside an array); the real
    source passes."""
    monkeypatch.setattr(cuda_launcher, "MMA_TARGET_WARPS", 2)
    problem, bugs, seed = MMA_FORM_PROBLEMS[form]

    def run():
        problems = problem(np.random.default_rng(seed))
        return [to_host(cuda_call(kwargs, path="mma")) for kwargs, _ in problems], [want for _, want in problems]

    def check(got, want):
        for one, reference in zip(got, want):
            assert_same_non_finite(one, reference, np.float16)

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, bugs[bug], run, check, 5, tmp_path, monkeypatch)


def test_planted_out_of_bounds_read_only_memcheck_catches(tmp_path, monkeypatch):
    """The packed form staging the images past the batch from memory (out_backprop's guard bytes
    on the host) instead of as zeros: the results stay right, since only those images' results,
    which are not stored, read them, so a plain build passes the comparison; a racecheck build
    fails the launch at the first read past out_backprop (its memcheck)."""
    monkeypatch.setattr(cuda_launcher, "MMA_TARGET_WARPS", 2)

    def run():
        problems = mma_packed_problem(np.random.default_rng(11))
        for kwargs, want in problems:
            assert_same_non_finite(to_host(cuda_call(kwargs, path="mma")), want, np.float16)

    cuda_host.assert_only_racecheck_catches(
        cuda_launcher.SOURCE, ("if (source[i] < limit) value[i] = planes[source[i]];",
                               "if (source[i] != kPackNone) value[i] = planes[source[i]];"),
        run, "memcheck: a 2-byte read .* past the end of an array", 5, tmp_path, monkeypatch)


@pytest.mark.parametrize("bug", sorted(PLANTED_MMA))
def test_planted_mma_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """Each bug planted in a copy of the tensor-core kernel makes mma_non_finite_problem's result
    differ from the NumPy backend (or the launch fail on an access outside an array); the real
    source passes."""
    def run():
        kwargs, want = mma_non_finite_problem(np.random.default_rng(3))
        return to_host(cuda_call(kwargs, path="mma")), want

    def check(got, want):
        assert_same_non_finite(got, want, np.float16)

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_MMA[bug], run, check, 5, tmp_path, monkeypatch)


# ------------------------------------------------------------------ the NHWC tensor-core kernel

#: (x_shape [N, H, W, C], filter, padding, pads, multiplier, dtype) for the NHWC tensor-core
#: kernel (in_depth a multiple of 8): images ending inside a unit down and across, one and several
#: channel blocks, SAME / VALID / EXPLICIT pads (past the filter's reach too, and none), one unit
#: a map (14 x 14), units that fit exactly (16 x 32), a 1 x 1 image.
MMA_NHWC_CASES = {
    "f16-3x3-17x19-c8": ((2, 17, 19, 8), (3, 3), "SAME", NO_PADS, 1, np.float16),
    "bf16-5x5-20x35-c16-m2": ((2, 20, 35, 16), (5, 5), "SAME", NO_PADS, 2, ml_dtypes.bfloat16),
    "f16-5x5-valid-20x21-m2": ((2, 20, 21, 8), (5, 5), "VALID", NO_PADS, 2, np.float16),
    "bf16-3x3-pads-past-filter": ((1, 14, 14, 8), (3, 3), "EXPLICIT", ((5, 0), (0, 6)), 1, ml_dtypes.bfloat16),
    "f16-5x5-15x15-odd-pads-c24": ((3, 15, 15, 24), (5, 5), "EXPLICIT", ((1, 3), (4, 0)), 1, np.float16),
    "f16-3x3-14x14-m2": ((3, 14, 14, 8), (3, 3), "SAME", NO_PADS, 2, np.float16),
    "bf16-5x5-1x1-image": ((2, 1, 1, 8), (5, 5), "SAME", NO_PADS, 1, ml_dtypes.bfloat16),
    "f16-5x5-16x32-whole-units": ((2, 16, 32, 8), (5, 5), "SAME", NO_PADS, 1, np.float16),
}


@pytest.mark.parametrize("target_ctas", [None, 1], ids=["one-image-per-cta", "several-images-per-cta"])
@pytest.mark.parametrize("case", list(MMA_NHWC_CASES))
def test_cuda_mma_nhwc_edges(cuda_device, rng, monkeypatch, case, target_ctas):
    """The NHWC tensor-core kernel (forced) matches the loops and the NumPy backend at its edges;
    with a CTA target of 1 each CTA takes several images (its bands reused, the next image's
    loads in flight during this one's products)."""
    x_shape, filt_hw, padding, pads, multiplier, dtype = MMA_NHWC_CASES[case]
    if target_ctas is not None:
        monkeypatch.setattr(cuda_launcher, "MMA_NHWC_TARGET_CTAS", target_ctas)
    kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, padding=padding,
                                   pads=pads, data_format="NHWC", dtype=dtype)
    g = geometry_of(kwargs)
    assert cuda_launcher.mma_nhwc_possible(g, np.dtype(dtype))
    if target_ctas is not None:
        assert cuda_launcher.mma_nhwc_grid(g)[2] < g.batch or g.batch == 1
    check_cuda(kwargs, ref, scale, path="mma_nhwc", device=cuda_device)


def test_mma_nhwc_choice(monkeypatch):
    """Where the NHWC tensor-core kernel can run, that the launcher does not take it by itself
    (MMA_NHWC_BY_DEFAULT, off since the H200 measured it behind the tiled kernel), where it would
    with the default turned on (MMA_NHWC_CHOICE), and its grid."""
    half = np.dtype(np.float16)

    def g(x_shape=(32, 28, 28, 16), filt=5, multiplier=2, strides=(1, 1), dilations=(1, 1), data_format="NHWC"):
        """The validated geometry of a SAME case (shapes only)."""
        n, h, w, c = x_shape
        oh, ow = out_hw((h, w), (filt, filt), strides, dilations, "SAME", NO_PADS)
        return conv2d_geometry(OP, to_format(x_shape, data_format), (filt, filt, c, multiplier),
                               to_format((n, oh, ow, c * multiplier), data_format), attr4(*strides, data_format),
                               "SAME", [], data_format, attr4(*dilations, data_format), depthwise=True)

    assert cuda_launcher.mma_nhwc_possible(g(), half)
    assert cuda_launcher.mma_nhwc_possible(g(filt=3, multiplier=1), np.dtype(ml_dtypes.bfloat16))
    for refused, dtype in ((g(x_shape=(32, 28, 28, 12)), half), (g(), np.dtype(np.float32)),
                           (g(data_format="NCHW"), half), (g(strides=(2, 2)), half),
                           (g(dilations=(2, 2)), half), (g(multiplier=3), half), (g(filt=7), half)):
        assert not cuda_launcher.mma_nhwc_possible(refused, dtype)
    assert not cuda_launcher.MMA_NHWC_BY_DEFAULT
    assert not cuda_launcher.mma_nhwc_chosen(g(), half, arch=90) and cuda_launcher.pick_path(g(), half, arch=90) == "tiled"
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_BY_DEFAULT", True)
    assert cuda_launcher.mma_nhwc_chosen(g(), half, arch=90) and cuda_launcher.mma_nhwc_chosen(g(), half, arch=80)
    assert not cuda_launcher.mma_nhwc_chosen(g(), half, arch=75)
    assert cuda_launcher.pick_path(g(), half, arch=90) == "mma_nhwc"
    assert cuda_launcher.pick_path(g(), half, arch=75) == "tiled"
    # MMA_NHWC_CHOICE: 5x5 multiplier 2 where a map's units are 75% inside; 3x3 multiplier 2 on maps
    # of 32 units or more (112 x 112); never multiplier 1 (the tiled kernel)
    chosen = (g(x_shape=(32, 14, 14, 480)), g(x_shape=(2, 16, 16, 8)), g(filt=3, x_shape=(32, 112, 112, 32)),
              g(filt=3, x_shape=(2, 128, 64, 8)))
    not_chosen = (g(x_shape=(32, 7, 7, 1152)), g(x_shape=(2, 20, 20, 8)), g(filt=3, x_shape=(32, 56, 56, 144)),
                  g(filt=3, x_shape=(2, 128, 48, 8)), g(filt=3, multiplier=1, x_shape=(32, 112, 112, 32)),
                  g(multiplier=1, x_shape=(32, 28, 28, 240)))
    assert [cuda_launcher.mma_nhwc_chosen(c, half, arch=90) for c in chosen] == [True] * len(chosen)
    assert [cuda_launcher.mma_nhwc_chosen(c, half, arch=90) for c in not_chosen] == [False] * len(not_chosen)
    assert all(cuda_launcher.mma_nhwc_possible(c, half) for c in not_chosen)
    assert cuda_launcher.mma_nhwc_grid(g(x_shape=(32, 112, 112, 32))) == (49, 4, 5)
    assert cuda_launcher.mma_nhwc_grid(g(x_shape=(32, 14, 14, 480))) == (1, 60, 16)
    assert cuda_launcher.mma_nhwc_grid(g(x_shape=(3, 14, 14, 8))) == (1, 1, 3)
    names = cuda_launcher.instantiations(80)[cuda_launcher.SOURCE]
    assert sum("_mma_nhwc<" in e for e in names) == 8
    assert "_mma_nhwc<" not in " ".join(cuda_launcher.instantiations(75)[cuda_launcher.SOURCE])


def test_cuda_mma_nhwc_misaligned_out_backprop(cuda_device, rng, monkeypatch):
    """An out_backprop view 2 bytes off a 16-byte boundary: the launcher's own choice (with
    MMA_NHWC_BY_DEFAULT turned on) falls back to the tiled kernel, the forced path is refused, and
    the result is right."""
    from gradops.backends.cuda import _runtime

    kwargs, ref, scale = make_case(rng, x_shape=(2, 14, 14, 8), filt_hw=(5, 5), multiplier=2, padding="SAME",
                                   data_format="NHWC", dtype=np.float16)
    g = geometry_of(kwargs)
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_BY_DEFAULT", True)
    assert cuda_launcher.mma_nhwc_chosen(g, np.float16, arch=90)
    dy = kwargs["out_backprop"]
    view = to_gpu(np.concatenate([np.zeros(1, np.float16), dy.reshape(-1)]))[1:].reshape(dy.shape)
    assert int(_runtime.pointer(view)) % 16 == 2
    got = to_host(cuda_call(kwargs, out_backprop=view))  # the public API: the launcher's own choice
    assert cuda_device is None or launched(cuda_device) == "tiled"
    assert_close(got, ref, np.float16, scale)
    with pytest.raises(ValueError, match="aligned to 16 bytes"):
        cuda_call(kwargs, path="mma_nhwc", out_backprop=view)


def mma_nhwc_non_finite_problem(rng, dtype=np.float16):
    """(kwargs, reference result): NHWC 5x5 multiplier 2 on 3 images of 20 x 35 x 16 (2 x 3 units,
    two channel blocks), an Inf in out_backprop inside one unit, a NaN filter tap that lands on
    the padding for the image's edges, an Inf tap, and otherwise finite values."""
    kwargs = case_kwargs(rng, x_shape=(3, 20, 35, 16), filt_hw=(5, 5), multiplier=2, padding="SAME",
                         data_format="NHWC", dtype=dtype)
    dy = kwargs["out_backprop"].copy()
    dy[1, 12, 20, 19] = np.inf
    w = kwargs["filter"].copy()
    w[0, 0, 9, 1] = np.nan
    w[4, 4, 2, 0] = np.inf
    kwargs.update(out_backprop=dy, filter=w)
    return kwargs, gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["f16", "bf16"])
def test_cuda_mma_nhwc_non_finite_values(cuda_device, rng, monkeypatch, dtype):
    """An Inf in out_backprop and an Inf and a NaN in the filter reach exactly the elements TF's
    sums give them through the NHWC tensor-core kernel (with CTAs taking several images); two runs
    are bitwise equal (on the host, blocks and threads in another order)."""
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_TARGET_CTAS", 1)
    kwargs, want = mma_nhwc_non_finite_problem(rng, dtype)
    got = to_host(cuda_call(kwargs, path="mma_nhwc"))
    assert cuda_device is None or launched(cuda_device) == "mma_nhwc"
    assert np.isnan(want.astype(np.float64)).any() and np.isinf(want.astype(np.float64)).any()
    assert_same_non_finite(got, want, dtype)
    if cuda_device is not None:
        cuda_device.seed += 1
    assert to_host(cuda_call(kwargs, path="mma_nhwc")).tobytes() == got.tobytes()


#: Bugs planted in the NHWC tensor-core kernel, each caught by mma_nhwc_non_finite_problem (with
#: CTAs taking several images; 5x5 multiplier 2, whose band holds block 1 once from sm_90, as the
#: host builds it).  The band and products are the _mma kernel's (PLANTED_MMA).
PLANTED_MMA_NHWC = {
    "nhwc-pairs-unpaired-columns": ("col = 2 * (pair % (St::ROWS / 2));", "col = pair % (St::ROWS / 2);"),
    "nhwc-pair-halves-swapped": ("dst[j * TILE_WORDS] = dwconv::pair_word(raw[i], j);",
                                 "dst[j * TILE_WORDS] = __byte_perm(dwconv::pair_word(raw[i], j), 0u, 0x1032u);"),
    "nhwc-second-position-of-a-pair-not-loaded": ("first + slot[i].source + d * position_chunks", "first + slot[i].source"),
    "nhwc-second-chunk-to-the-first-chunks-tiles": ("s.word = (8 * chunk * St::ROWS * dwmma::kRowPitch",
                                                    "s.word = (chunk * St::ROWS * dwmma::kRowPitch"),
    "nhwc-staging-ignores-the-top-edge": ("static_cast<unsigned>(o_row0 + row) < static_cast<unsigned>(out_rows);",
                                          "o_row0 + row < out_rows;"),
    "nhwc-staging-ignores-the-left-edge": ("static_cast<unsigned>(a0 + col + d) < static_cast<unsigned>(out_cols);",
                                           "a0 + col + d < out_cols;"),
    "nhwc-slot-source-rows-of-the-input": ("s.source = (row * out_cols + col) * (out_depth / 8) + chunk;",
                                           "s.source = (row * (out_cols + 1) + col) * (out_depth / 8) + chunk;"),
    "nhwc-result-planes-unpadded": ("plane[((g + 8 * h) * kResultPitch + 8 * j + 2 * t) / 2]",
                                    "plane[((g + 8 * h) * kUnit + 8 * j + 2 * t) / 2]"),
    "nhwc-result-channels-swapped": ("const uint4 chunk = make_uint4(values[at] | static_cast<unsigned>(values[at + PLANE]) << 16,",
                                     "const uint4 chunk = make_uint4(values[at + PLANE] | static_cast<unsigned>(values[at]) << 16,"),
    "nhwc-last-image-dropped": ("for (; n < batch; n += step) {", "for (; n < batch - 1; n += step) {"),
    "nhwc-prefetch-reloads-this-image": ("load_slots<K, M>(source + (first + (n + step) * image_chunks), slot,",
                                         "load_slots<K, M>(source + (first + n * image_chunks), slot,"),
    "nhwc-checked-sums-of-the-first-unit": ("i, col, y0 + i, x0 + col,", "i, col, i, col,"),
    "nhwc-warps-share-the-first-channels-band": ("load_band<T, K, M, kBlock1Twice>(band[warp], filter, c0 + warp,",
                                                 "load_band<T, K, M, kBlock1Twice>(band[warp], filter, c0,"),
    "nhwc-block-1-of-the-low-operand-for-the-high": (
        "BLOCK1_TWICE ? ptx::ld_shared_32_volatile(block + 8) : band_lo[q][r][1];",
        "BLOCK1_TWICE ? ptx::ld_shared_32_volatile(block + 8) : band_lo[q][r][0];"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_MMA_NHWC))
def test_planted_mma_nhwc_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """Each bug planted in a copy of the NHWC tensor-core kernel makes mma_nhwc_non_finite_problem's
    result differ from the NumPy backend (or the launch fail on an access outside an array); the
    real source passes."""
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_TARGET_CTAS", 1)

    def run():
        kwargs, want = mma_nhwc_non_finite_problem(np.random.default_rng(13))
        return to_host(cuda_call(kwargs, path="mma_nhwc")), want

    def check(got, want):
        assert_same_non_finite(got, want, np.float16)

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_MMA_NHWC[bug], run, check, 5, tmp_path,
                                        monkeypatch)


def test_mma_nhwc_band_with_block_1_twice_gives_the_same_bits(tmp_path, monkeypatch):
    """5x5 multiplier 2 keeps block 1 of the band in two registers on sm_80 and in one from sm_90
    (kBlock1Twice); the host builds the latter.  Built with the sm_80 form, the non-finite problem
    gives the NumPy backend's result and the same bits as the default build."""
    if cuda_host.unavailable_reason():
        pytest.skip(f"cannot build the kernel sources for the host: {cuda_host.unavailable_reason()}")
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_TARGET_CTAS", 1)
    kwargs, want = mma_nhwc_non_finite_problem(np.random.default_rng(13))
    with monkeypatch.context() as patch:
        cuda_host.HostDevice(order="shuffled", seed=5).install(patch)
        default = to_host(cuda_call(kwargs, path="mma_nhwc"))
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, (
        "constexpr bool kBlock1Twice = !(K == 5 && M == 2 && GRADOPS_ARCH >= 900);", "constexpr bool kBlock1Twice = true;"))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path).install(monkeypatch)
    twice = to_host(cuda_call(kwargs, path="mma_nhwc"))
    assert_same_non_finite(twice, want, np.float16)
    assert twice.tobytes() == default.tobytes()


#: Barriers of the NHWC tensor-core kernel, each removed: the tiles restaged while another warp
#: still reads them, the tiles read before every warp has staged its part, the result planes read
#: before every warp has written its own.
NHWC_BARRIERS = {
    "before-restaging": ("        __syncthreads();  // every warp is done with the previous image's tiles and result planes\n",
                         ""),
    "after-staging": ("raw);\n        __syncthreads();\n        if (n + step < batch)", "raw);\n        if (n + step < batch)"),
    "before-the-results": ("        __syncthreads();\n        if (store) {\n", "        if (store) {\n"),
}


@pytest.mark.parametrize("barrier", list(NHWC_BARRIERS))
def test_planted_mma_nhwc_barrier_bugs_racecheck_catches(barrier, tmp_path, monkeypatch):
    """Each of the NHWC tensor-core kernel's barriers removed: a racecheck build of the host model
    fails the launch on the shared-memory race it leaves."""
    monkeypatch.setattr(cuda_launcher, "MMA_NHWC_TARGET_CTAS", 1)
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE, NHWC_BARRIERS[barrier])
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path, racecheck=True).install(monkeypatch)
    kwargs, _ = mma_nhwc_non_finite_problem(np.random.default_rng(13))
    with pytest.raises(cuda_host.HostLaunchError, match="race"):
        cuda_call(kwargs, path="mma_nhwc")


# ------------------------------------------------------------------ the planes kernel (NCHW)

#: (x_shape [N, H, W, C], filter, padding, pads, multiplier, dtype, PLANES_ITEMS or None, stride):
#: bands of rows (a small work-item budget), partial channel groups, wide explicit pads, and
#: each result store width (in_cols % 4 == 0, even, odd), at strides 1 and 2.
PLANES_EDGE_CASES = {
    "f32-3x3-m1-bands-odd-cols": ((2, 23, 9, 5), (3, 3), "SAME", NO_PADS, 1, np.float32, 12, 1),  # bands of 8 rows
    "f16-5x5-m3-partial-group": ((1, 6, 6, 11), (5, 5), "SAME", NO_PADS, 3, np.float16, None, 1),
    "bf16-5x5-wide-pads-odd-cols": ((2, 9, 13, 3), (5, 5), "EXPLICIT", ((4, 0), (0, 6)), 1, ml_dtypes.bfloat16, None, 1),
    "f64-3x3-m2-valid-cols8": ((2, 10, 8, 4), (3, 3), "VALID", NO_PADS, 2, np.float64, None, 1),
    "f32-3x3-m2-cols14-bands": ((1, 30, 14, 6), (3, 3), "SAME", NO_PADS, 2, np.float32, 14, 1),  # bands of 7 rows
    "f16-3x3-m1-7x7-groups": ((2, 7, 7, 40), (3, 3), "SAME", NO_PADS, 1, np.float16, None, 1),
    "f32-5x5-pads-past-the-filter": ((1, 8, 12, 3), (5, 5), "EXPLICIT", ((6, 1), (0, 7)), 2, np.float32, 6, 1),
    "f16-3x3-odd-bands": ((2, 9, 5, 4), (3, 3), "SAME", NO_PADS, 1, np.float16, "odd", 1),
    # Stride 2: odd pads (row -1 computed, not stored; the odd column phase) with bands, a partial
    # channel group, 8- (one store for the half types), 4- and 2-column stores, pads wider than the
    # filter.
    "f16-5x5-s2-odd-pads-bands": ((2, 22, 16, 5), (5, 5), "SAME", NO_PADS, 1, np.float16, 12, 2),
    "bf16-3x3-s2-m3-partial-group": ((1, 9, 9, 11), (3, 3), "SAME", NO_PADS, 3, ml_dtypes.bfloat16, None, 2),
    "f64-3x3-s2-m2-valid-cols8": ((2, 11, 8, 4), (3, 3), "VALID", NO_PADS, 2, np.float64, None, 2),
    "f32-5x5-s2-pads-past-the-filter": ((1, 9, 12, 3), (5, 5), "EXPLICIT", ((6, 1), (0, 7)), 2, np.float32, 6, 2),
    "f16-3x3-s2-cols14": ((2, 14, 14, 6), (3, 3), "SAME", NO_PADS, 1, np.float16, None, 2),
    "f32-3x3-s2-7x7-groups": ((2, 7, 7, 40), (3, 3), "SAME", NO_PADS, 1, np.float32, None, 2),
    "f16-3x3-s2-cols12": ((2, 9, 12, 5), (3, 3), "SAME", NO_PADS, 2, np.float16, None, 2),
}


@pytest.mark.parametrize("case", list(PLANES_EDGE_CASES))
def test_cuda_planes_edges(cuda_device, rng, monkeypatch, case):
    """The planes kernel at its edges: several bands per plane (the launcher's work-item budget
    shrunk), channel groups that end past in_depth, pads wider than the filter, every result
    store width; against the loops and the NumPy backend."""
    x_shape, filt_hw, padding, pads, multiplier, dtype, items, stride = PLANES_EDGE_CASES[case]
    if items == "odd":  # bands of 3 rows: each band's last item reaches into the next band
        monkeypatch.setattr(cuda_launcher, "planes_plan", lambda g, dtype, staged=None: (2, 3))
        cuda_launcher._planes_args.cache_clear()
    elif items is not None:
        monkeypatch.setattr(cuda_launcher, "PLANES_ITEMS", items)
        cuda_launcher._planes_args.cache_clear()
    kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                                   strides=(stride, stride), padding=padding, pads=pads, data_format="NCHW",
                                   dtype=dtype)
    g = geometry_of(kwargs)
    assert cuda_launcher.planes_possible(g, np.dtype(dtype))
    if case == "f16-5x5-s2-odd-pads-bands":  # 16 columns: item rows in one 16-byte store
        assert g.pad_top % 2 and g.pad_left % 2 and cuda_launcher.planes_store_cols(g) == 8
    if case == "f64-3x3-s2-m2-valid-cols8":  # 8 columns: whole item rows, stored a quad at a time
        assert cuda_launcher.planes_store_cols(g) == 8
    if case == "f16-3x3-s2-cols12":
        assert cuda_launcher.planes_store_cols(g) == 4
    planes, band = cuda_launcher.planes_plan(g, np.dtype(dtype))
    if items is not None:
        assert band < g.in_rows  # several bands
    if case == "f32-3x3-m1-bands-odd-cols":
        assert band % 2 == 0 and g.in_rows % band == 7  # a last band that ends inside an item
    check_cuda(kwargs, ref, scale, path="planes", device=cuda_device)
    cuda_launcher._planes_args.cache_clear()


def test_planes_plan():
    """Whole planes where they fit, as many as keep a CTA within its work-item budget (a power of
    two); bands of rows for wide planes; refused where one staged row of every slice cannot fit."""
    def geometry(rows, cols, depth, k=3, multiplier=1, stride=1):
        return geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(1, rows, cols, depth), filt_hw=(k, k),
                                       multiplier=multiplier, strides=(stride, stride), padding="SAME",
                                       data_format="NCHW", dtype=np.float32))

    f32 = np.dtype(np.float32)
    assert cuda_launcher.planes_plan(geometry(7, 7, 960), f32) == (32, 7)      # 256 items of 8 a plane, 64 (5.3 KiB) fit
    assert cuda_launcher.planes_plan(geometry(14, 14, 576), f32) == (16, 14)   # 448 items; 32 planes would not fit
    assert cuda_launcher.planes_plan(geometry(7, 7, 3), f32) == (4, 7)         # no more planes than channels
    assert cuda_launcher.planes_plan(geometry(112, 112, 32), f32) == (1, 50)   # 52 staged rows of 116 fit, 700 items
    planes, band = cuda_launcher.planes_plan(geometry(14, 14, 480, k=5, multiplier=2), f32)
    assert (planes, band) == (4, 14) and cuda_launcher._planes_fit(geometry(14, 14, 480, 5, 2), f32, planes, band)
    assert not cuda_launcher._planes_fit(geometry(14, 14, 480, 5, 2), f32, 2 * planes, band)
    wide = geometry(4, 2000, 2, multiplier=2)  # one row of two slices: 2 x (12 + 3 x 2004) floats > 6144
    assert cuda_launcher.planes_plan(wide, f32) == (0, 0) and not cuda_launcher.planes_possible(wide, f32)
    nhwc = geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(1, 7, 7, 8), filt_hw=(3, 3), multiplier=1,
                                   padding="SAME", data_format="NHWC", dtype=np.float32))
    assert not cuda_launcher.planes_possible(nhwc, f32)
    assert cuda_launcher.PLANES_BY_DEFAULT and cuda_launcher.planes_chosen(geometry(7, 7, 960), f32)
    assert cuda_launcher.pick_path(geometry(7, 7, 960), f32) == "planes"
    f64 = np.dtype(np.float64)  # float64 takes it at stride 2 only (PLANES_FLOAT64_STRIDES)
    assert cuda_launcher.planes_possible(geometry(14, 14, 8), f64) and cuda_launcher.pick_path(geometry(14, 14, 8), f64) == "tiled"
    assert cuda_launcher.pick_path(geometry(14, 14, 8, stride=2), f64) == "planes"
    # float32 3x3 at stride 2, multiplier 1, takes the planes kernel in its staged form only
    # (PLANES_FLOAT32_TILED), else the tiled kernel; 5x5 there, multiplier 2 there and float16
    # take the planes kernel
    assert cuda_launcher.planes_possible(geometry(14, 14, 8, stride=2), f32)
    assert cuda_launcher.pick_path(geometry(14, 14, 8, stride=2), f32) == "planes"
    assert cuda_launcher.planes_staged_result(geometry(14, 14, 8, stride=2), f32)
    unstaged = geometry(4, 2800, 1, stride=2)  # the result image does not fit beside the slices
    assert cuda_launcher.planes_possible(unstaged, f32) and not cuda_launcher.planes_staged_possible(unstaged, f32)
    assert cuda_launcher.pick_path(unstaged, f32) == "tiled"
    assert cuda_launcher.pick_path(unstaged, f32, "planes") == "planes"
    assert cuda_launcher.pick_path(geometry(14, 14, 8, k=5, stride=2), f32) == "planes"
    assert cuda_launcher.pick_path(geometry(14, 14, 8, multiplier=2, stride=2), f32) == "planes"
    assert cuda_launcher.pick_path(geometry(14, 14, 8, stride=2), np.dtype(np.float16), arch=90) == "planes"
    # Stride 2: even bands from an even padded row, items of 2 x 8.  SAME 5x5 on 56 x 56 pads 1
    # above and left: rows -1 .. 56 (58, one band) in items of 2 rows, columns 0 .. 55 in 7 items
    # (odd phase); 4 planes (812 items), staged 29 + 2 rows of 32 (4 x 7 + 4) values a slice.
    s2 = geometry(56, 56, 144, k=5, stride=2)
    assert (s2.pad_top, s2.pad_left) == (1, 1) and cuda_launcher.planes_band_rows(s2) == 57
    assert cuda_launcher.planes_plan(s2, f32) == (4, 58) and cuda_launcher.planes_grid(s2, f32) == (36, 1, 1)
    assert cuda_launcher.planes_item_cols(s2) == 8 and cuda_launcher.planes_segments(s2) == 7
    assert cuda_launcher.planes_pitch(s2) == 32 and cuda_launcher.planes_items(s2, 58) == 203
    assert cuda_launcher.planes_staged_rows(s2, 58) == 31 and cuda_launcher.planes_store_cols(s2) == 8
    wide2 = geometry(112, 112, 96, stride=2)  # 14 items a row: the whole plane, 56 x 14 items
    assert cuda_launcher.planes_plan(wide2, f32, staged=False) == (1, 112)
    assert cuda_launcher.planes_grid(wide2, f32, staged=False)[1] == 1
    # its staged form (the launcher's: 16 bytes a sector) stages 42 rows of the result a band
    assert cuda_launcher.planes_staged_result(wide2, f32) and cuda_launcher.planes_plan(wide2, f32) == (1, 42)
    assert cuda_launcher.planes_pitch(wide2) == 60 and cuda_launcher.planes_store_cols(wide2) == 8  # 4 x 14 + 4
    small = dict(x_shape=(1, 9, 9, 2), filt_hw=(3, 3), multiplier=1, strides=(2, 2), padding="VALID",
                    data_format="NCHW", dtype=np.float32)
    valid = geometry_of(case_kwargs(np.random.default_rng(0), **small))
    assert cuda_launcher.planes_plan(valid, f32)[1] % 2 == 0  # 9 rows: a band of 10
    for strides in ((3, 3), (2, 1), (1, 2)):
        other = geometry_of(case_kwargs(np.random.default_rng(0), **dict(small, strides=strides)))
        assert not cuda_launcher.planes_possible(other, f32)


PLANES_ITEMS_DEFAULT = cuda_launcher.PLANES_ITEMS  # planes_problem's calls reset to it between them


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=tiled_cases(), seed=st.integers(0, 2**32 - 1), items=st.sampled_from([None, 4, 12, 40]))
def test_cuda_planes_property(cuda_device, monkeypatch, case, seed, items):
    """Random NCHW shapes on the planes path (3x3 / 5x5 at strides 1 and 2; any sizes, pads,
    multipliers and dtypes; whole planes, or bands from a shrunk work-item budget) match the
    loops and the NumPy backend, or are refused where one item row cannot fit; so does the staged
    form where it runs (stride 2)."""
    monkeypatch.setattr(cuda_launcher, "PLANES_ITEMS", items or PLANES_ITEMS_DEFAULT)
    cuda_launcher._planes_args.cache_clear()
    try:
        kwargs, ref, scale = make_case(np.random.default_rng(seed), **dict(case, data_format="NCHW"))
        check_cuda(kwargs, ref, scale, path="planes", device=cuda_device)
        check_cuda(kwargs, ref, scale, path="planes_staged", device=cuda_device)  # refused below stride 2
    finally:
        cuda_launcher._planes_args.cache_clear()


#: planes_problem's calls: (x_shape, filter, stride, pads, multiplier, PLANES_ITEMS).
PLANES_PROBLEM = (
    ((2, 13, 11, 7), (5, 5), 1, ((1, 3), (6, 0)), 2, 6),
    ((2, 6, 6, 11), (3, 3), 1, ((2, 0), (0, 1)), 1, 60),
    # Stride 2: odd pads on both axes (row -1 computed, not stored; the odd column phase, whose
    # item's last column takes tap column 0 from out_backprop column 5 of 9), bands of 4 rows;
    # then even pads and 4 planes a CTA, the last group of 3.
    ((2, 13, 19, 7), (5, 5), 2, ((1, 2), (3, 0)), 2, 6),
    ((2, 10, 12, 11), (3, 3), 2, ((2, 1), (0, 2)), 1, 60),
    # 16-column rows at lead 1 (3x3 SAME): each row's last chunk is whole, its last value in a
    # third 16-byte group (the staging stores).
    ((1, 5, 16, 6), (3, 3), 1, ((1, 1), (1, 1)), 1, 60),
)


def planes_problem(rng, monkeypatch):
    """NCHW calls of the planes kernel (:data:`PLANES_PROBLEM`, at strides 1 and 2) that between
    them take bands of rows, partial channel groups, both sides' pads (a left pad wider than the
    filter: staged columns before the stage's first), odd pads at stride 2, rows shorter than a
    staging chunk, the checked loop (an Inf and a NaN in the filter) and the unchecked one (the
    CTAs without them); (result, NumPy backend's) of all, flattened and joined."""
    got, want = [], []
    for x_shape, filt_hw, stride, pads, multiplier, items in PLANES_PROBLEM:
        monkeypatch.setattr(cuda_launcher, "PLANES_ITEMS", items or PLANES_ITEMS_DEFAULT)
        cuda_launcher._planes_args.cache_clear()
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                             strides=(stride, stride), padding="EXPLICIT", pads=pads, data_format="NCHW",
                             dtype=np.float32)
        w = kwargs["filter"].copy()
        w[0, 0, 1, 0] = np.inf
        w[-1, -1, 5, -1] = np.nan
        kwargs["filter"] = w
        got.append(to_host(cuda_call(kwargs, path="planes")).ravel())
        want.append(gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy").ravel())
    cuda_launcher._planes_args.cache_clear()
    return np.concatenate(got), np.concatenate(want)


def assert_planes_result(got, want):
    for name, mask in (("NaN", np.isnan), ("Inf", np.isinf)):
        np.testing.assert_array_equal(mask(got), mask(want), err_msg=name)
    finite = np.isfinite(want)
    assert_close(got[finite], want[finite], np.float32, scale=float(np.abs(want[finite]).max()))


def test_cuda_planes_non_finite_filter_and_determinism(cuda_device, rng, monkeypatch):
    """An Inf and a NaN in the filter reach exactly the elements whose taps land inside
    out_backprop (the checked loop skips the staged zeros), position by position against the
    NumPy backend; a second run (on the host, blocks and threads in another order) is bitwise
    equal."""
    first, want = planes_problem(np.random.default_rng(11), monkeypatch)
    assert np.isnan(want).any() and np.isinf(want).any() and np.isfinite(want).any()
    assert_planes_result(first, want)
    if cuda_device is not None:
        cuda_device.seed += 1
    second, _ = planes_problem(np.random.default_rng(11), monkeypatch)
    assert first.tobytes() == second.tobytes()


PLANTED_PLANES = {  # bugs in the planes kernel: name -> (text of the real source, its replacement)
    "planes-tap-rows-not-flipped": ("const int r = j + KH - 1 - a;", "const int r = a - j;"),
    "planes-second-row-of-an-item-not-stored": ("if (i + 1 < band && y + 1 < in_rows)", "if (i + 1 < band && y + 1 < 0)"),
    "planes-tap-columns-not-flipped": ("const int k = u + KW - 1 - s;  // staged column", "const int k = u + s;  // staged column"),
    "planes-every-slice-reads-slice-0": ("const int slice = p * M + q;", "const int slice = p * M;"),
    "planes-band-origin-ignores-pad-top": ("const int row_origin = (y0 + pad_top) / S - (KH - 1) / S;",
                                           "const int row_origin = y0 / S - (KH - 1) / S;"),
    "planes-filter-of-the-first-group": ("filter[tap * in_depth * M + c0 * M + slice]", "filter[tap * in_depth * M + slice]"),
    "planes-no-zero-fill": ("dwconv::store16(stage + k, zeros);", "(void)zeros;"),
    "planes-checked-loop-never-taken": ("const bool checked = __syncthreads_or(nonfinite);",
                                        "const bool checked = __syncthreads_or(0);"),
    "planes-checked-loop-ignores-the-left-edge": ("if (CHECKED && (x + k < col_begin || x + k >= col_end)) continue;",
                                                  "if (CHECKED && x + k >= col_end) continue;"),
    "planes-last-row-dropped": ("if (y >= in_rows) continue;", "if (y >= in_rows - 1) continue;"),
    "planes-staging-drops-a-row": ("if (r >= rows_run) continue;", "if (r >= rows_run - 1) continue;"),
    "planes-staging-drops-a-rows-last-element": ("group[u] = j * PER + u - LEAD <= last ? v[j * PER + u] : Acc(0);",
                                                 "group[u] = j * PER + u - LEAD < last ? v[j * PER + u] : Acc(0);"),
    "planes-staging-stores-past-the-row": ("            if (last < kChunk - 1) {\n                // A row's last chunk, short",
                                           "            if (false) {\n                // A row's last chunk, short"),
    "planes-wide-pads-stage-before-the-plane-row": (
        "                put_group(dst + j * PER, group, static_cast<unsigned>(g0 + j * PER) < limit);\n            }\n            if",
        "                put_group(dst + j * PER, group, g0 + j * PER < static_cast<int>(limit));\n            }\n            if"),
    # Not planted: loads past the tensor's end (no element-by-element last chunk).  Their values
    # are never stored, so the host model, which checks writes and values but not reads of its
    # guard bytes, cannot see them; compute-sanitizer's memcheck on a GPU does
    # (scripts/device-session.sh runs the planes tests under it).
    "planes-tensors-last-chunk-drops-its-last-element": ("if (e <= last) elements[e] = src[e];",
                                                         "if (e < last) elements[e] = src[e];"),
    # The 16-byte staging stores' groups (LEAD values before a chunk's first: 3x3 SAME, lead 1).
    "planes-staging-lead-values-of-the-chunk-itself": ("src - (x > 0 ? PER : 0)", "src - (0)"),
    "planes-staging-left-halo-of-row-values": ("v[i] = x > 0 ? to_acc<Acc>(prev[PER - LEAD + i]) : Acc(0);",
                                               "v[i] = to_acc<Acc>(prev[PER - LEAD + i]);"),
    "planes-staging-rows-last-values-dropped": ("g0 + (last < kChunk ? LEAD + last + 1 : kChunk)",
                                                "g0 + (last < kChunk ? last + 1 : kChunk)"),
    "planes-staging-lead-ignored": ("const int lead = ((-col_origin) % PER + PER) % PER;", "const int lead = 0;"),
    "planes-staging-chunks-of-the-wrong-row": ("const int offset = slice * plane_size + r * out_cols + x;",
                                               "const int offset = slice * plane_size + r * pitch + x;"),
    "planes-no-barrier-after-staging": ("    __syncthreads();\n\n    // Staged rows and columns inside out_backprop",
                                        "\n    // Staged rows and columns inside out_backprop"),
    "planes-result-in-the-next-channel": ("in_backprop + ((n * in_depth + c0 + p) * in_rows + y)",
                                          "in_backprop + ((n * in_depth + c0 + p + 1) * in_rows + y)"),
    # Stride 2 (PLANES_PROBLEM's last two calls).
    "planes-s2-tap-rows-of-the-other-phase": ("const int r = j + 2 * (HALO_ROWS - a);",
                                              "const int r = 1 - j + 2 * (HALO_ROWS - a);"),
    "planes-s2-tap-columns-of-the-other-phase": ("const int s = PC + u + 2 * (HALO_COLS - k);",
                                                 "const int s = (PC ^ 1) + u + 2 * (HALO_COLS - k);"),
    "planes-s2-column-phase-ignored": ("} else if (pad_left % 2 == 0) {", "} else if (true) {"),
    "planes-s2-window-without-the-phase-column": ("constexpr int COLS = kItemCols<2> / 2 + HALO_COLS + PC;",
                                                  "constexpr int COLS = kItemCols<2> / 2 + HALO_COLS;"),
    "planes-s2-second-quad-of-an-item-dropped": ("if (h == 0 || x + h < in_cols) dwconv::store_quad",
                                                 "if (h == 0) dwconv::store_quad"),
    "planes-s2-window-a-row-short": ("for (int a = 0; a <= HALO_ROWS; ++a)", "for (int a = 0; a < HALO_ROWS; ++a)"),
    "planes-s2-bands-ignore-an-odd-pad-top": ("* band - pad_top % S;", "* band;"),
    "planes-s2-row-above-the-image-stored": ("if (S == 1 || y >= 0) store_item_row", "store_item_row"),
    "planes-s2-checked-loop-ignores-the-left-edge": ("if (CHECKED && (x + k < col_begin || col_end <= x + k))",
                                                     "if (CHECKED && col_end <= x + k)"),
    "planes-s2-staged-rows-without-the-halo": ("/ S + (KH - 1) / S;\n", "/ S;\n"),
}


def test_planted_planes_staging_overlap_racecheck_catches(tmp_path, monkeypatch):
    """A chunk that also stores its last LEAD values (the group the row's next chunk stores,
    zeros past its own) writes 16 bytes another thread writes with no barrier between: a
    racecheck build of the host model fails the launch on it, whichever thread writes last."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE,
                              ("g0 + (last < kChunk ? LEAD + last + 1 : kChunk)",
                               "g0 + (last < kChunk ? LEAD + last + 1 : kChunk + LEAD)"))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path, racecheck=True).install(monkeypatch)
    with pytest.raises(cuda_host.HostLaunchError, match="racecheck: write-after-write hazard"):
        planes_problem(np.random.default_rng(3), monkeypatch)


def planes_half_problem(rng):
    """(results, NumPy backend's) of two float16 stride-2 calls of the planes kernel: 16 columns
    (item rows in one 16-byte store each) and 12 (quads: the last item's second quad lies past
    the row)."""
    got, want = [], []
    for x_shape in ((2, 10, 16, 5), (2, 9, 12, 5)):
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=(3, 3), multiplier=1, strides=(2, 2), padding="SAME",
                             data_format="NCHW", dtype=np.float16)
        assert cuda_launcher.planes_store_cols(geometry_of(kwargs)) == (8 if x_shape[2] == 16 else 4)
        got.append(to_host(cuda_call(kwargs, path="planes")).ravel())
        want.append(gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy").ravel())
    return np.concatenate(got), np.concatenate(want)


PLANTED_PLANES_HALF = {  # bugs in the half types' 16-byte item-row store, run on planes_half_problem
    "planes-s2-eight-column-store-swaps-two-pairs": (
        "pack_pair<T>(v[4], v[5]), pack_pair<T>(v[6], v[7]));", "pack_pair<T>(v[6], v[7]), pack_pair<T>(v[4], v[5]));"),
    "planes-s2-half-pair-packed-backwards": ("const __half2 h = __floats2half2_rn(a, b);",
                                             "const __half2 h = __floats2half2_rn(b, a);"),
    "planes-s2-eight-column-store-past-the-row": ("        if (cols == 8) {\n            dwconv::store_eight",
                                                  "        if (cols >= 4) {\n            dwconv::store_eight"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANES_HALF))
def test_planted_planes_half_store_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_PLANES_HALF[bug],
                                        lambda: planes_half_problem(np.random.default_rng(4)),
                                        lambda got, want: assert_close(got, want, np.float16), 5, tmp_path, monkeypatch)


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANES))
def test_planted_planes_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """Each bug planted in a copy of the planes kernel makes planes_problem's result differ from
    the NumPy backend (or the launch fail on an access outside an array); the real source
    passes."""
    def run():
        return planes_problem(np.random.default_rng(3), monkeypatch)

    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_PLANES[bug], run, assert_planes_result, 5,
                                        tmp_path, monkeypatch)


#: Staged result stores (planes_staged_result, stride 2): (x_shape [N, H, W, C], filter, multiplier,
#: dtype).  Planes of 169 / 196 / 110 / 81 / 3 elements: CTA runs that start off a 16-byte
#: boundary (the image placed to match), runs shorter than a vector, tails; bands of one plane
#: (a band of a wide plane); odd pads (row -1 computed, not stored).
PLANES_STAGED_CASES = {
    "f16-3x3-13x13-groups": ((2, 13, 13, 40), (3, 3), 1, np.float16),
    "f32-3x3-14x14": ((2, 14, 14, 19), (3, 3), 1, np.float32),
    "bf16-5x5-odd-pads-11x10": ((2, 11, 10, 9), (5, 5), 2, ml_dtypes.bfloat16),
    "f64-3x3-m3-9x9": ((1, 9, 9, 5), (3, 3), 3, np.float64),
    "f16-5x5-14x14-m2": ((2, 14, 14, 6), (5, 5), 2, np.float16),
    "f32-3x3-bands-of-a-wide-plane": ((1, 40, 30, 2), (3, 3), 1, np.float32),
    "f16-3x3-1x3": ((3, 1, 3, 5), (3, 3), 1, np.float16),
}


def planes_staged_kwargs(case, rng):
    x_shape, filt_hw, multiplier, dtype = PLANES_STAGED_CASES[case]
    return make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier, strides=(2, 2),
                     padding="SAME", data_format="NCHW", dtype=dtype)


@pytest.mark.parametrize("case", list(PLANES_STAGED_CASES))
def test_cuda_planes_staged_results_equal_direct_stores(cuda_device, rng, monkeypatch, case):
    """The planes kernel's result image and its copy-out (staged=True) write the bits its direct
    stores write (staged=False; path="planes_staged" forces it too), and both match the loops and
    the NumPy backend; a band of a wide plane (the work-item budget shrunk) stages too."""
    if case == "f32-3x3-bands-of-a-wide-plane":
        monkeypatch.setattr(cuda_launcher, "PLANES_ITEMS", 24)
    cuda_launcher._planes_args.cache_clear()
    try:
        kwargs, ref, scale = planes_staged_kwargs(case, rng)
        g = geometry_of(kwargs)
        dtype = np.dtype(kwargs["out_backprop"].dtype)
        planes, band = cuda_launcher.planes_plan(g, dtype, staged=True)
        if case == "f32-3x3-bands-of-a-wide-plane":
            assert planes == 1 and band < g.in_rows
        else:
            assert band >= g.in_rows and (planes > 1 or g.in_depth == 1)
        gpu = dict(filter=to_gpu(kwargs["filter"]), out_backprop=to_gpu(kwargs["out_backprop"]))
        results = {staged: to_host(cuda_launcher.depthwise_conv2d_native_backprop_input(
            g, gpu["filter"], gpu["out_backprop"], path="planes", staged=staged)) for staged in (True, False)}
        forced = to_host(cuda_launcher.depthwise_conv2d_native_backprop_input(g, gpu["filter"], gpu["out_backprop"],
                                                                              path="planes_staged"))
        assert forced.tobytes() == results[True].tobytes()
        if cuda_device is not None:
            assert launched(cuda_device) == "planes_staged"
        direct = to_host(cuda_launcher.depthwise_conv2d_native_backprop_input(g, gpu["filter"], gpu["out_backprop"],
                                                                              path="planes_direct"))
        assert direct.tobytes() == results[False].tobytes()
        if cuda_device is not None:
            assert launched(cuda_device) == "planes"
        assert results[True].tobytes() == results[False].tobytes()
        check_cuda(kwargs, ref, scale, path="planes", device=cuda_device)
    finally:
        cuda_launcher._planes_args.cache_clear()


def test_planes_staged_result_choice(monkeypatch):
    """The staged form is for stride-2 launches whose direct stores would write fewer than
    PLANES_STAGED_BELOW bytes a 32-byte sector, or as many at PLANES_STAGED_AT_HALF (3x3,
    multiplier 1) (planes_direct_store_sectors, planes_staged_narrow): MobileNetV2's 14 x 14 and
    28 x 28 stride-2 layers in float16, float32 at multiplier 1 on every map, not the 112 x 112 and
    56 x 56 ones in float16, nor float32 at multiplier 2 or 5x5 where its stores fill half a
    sector, nor stride 1 (no staged form); its image halves the planes of a CTA where both would
    not fit.  The launcher takes it by itself (PLANES_STAGED_BY_DEFAULT) for path="planes" and
    its own choice; path="planes_staged" / "planes_direct" force one form; a forced choice it
    cannot run is refused."""
    def geometry(rows, cols, depth, k=3, multiplier=1, stride=1):
        return geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(1, rows, cols, depth), filt_hw=(k, k),
                                       multiplier=multiplier, strides=(stride, stride), padding="SAME",
                                       data_format="NCHW", dtype=np.float32))

    f16, f32 = np.dtype(np.float16), np.dtype(np.float32)
    wide, small, s2 = geometry(112, 112, 32), geometry(7, 7, 960), geometry(14, 14, 576, stride=2)
    # 112 columns: lanes along a row, 16-byte (float32) stores: whole sectors
    assert cuda_launcher.planes_direct_store_sectors(wide, f32)[1:] == (700, 700 * 32)
    assert not cuda_launcher.planes_staged_narrow(wide, f32)
    # 7 columns: one element a store, two lanes a row; but stride 1 has no staged form
    instructions, sectors, written = cuda_launcher.planes_direct_store_sectors(small, f16)
    assert written == 32 * 7 * 7 * 2 and written < 4 * sectors + 64
    assert not cuda_launcher.planes_staged_possible(small, f16) and not cuda_launcher.planes_staged_narrow(small, f16)
    with pytest.raises(ValueError, match="cannot stage"):
        cuda_launcher.planes_staged_result(small, f16, staged=True)
    assert cuda_launcher.pick_path(small, f16, "planes_direct") == "planes_direct"  # what stride 1 has
    with pytest.raises(ValueError, match="staged form cannot run"):
        cuda_launcher.pick_path(small, f16, "planes_staged")
    # 14 x 14 at stride 2: 5.1 bytes a sector; 32 planes and their image do not fit 24 KiB, 16 do
    _, sectors, written = cuda_launcher.planes_direct_store_sectors(s2, f16)
    assert 5 < written / sectors < 5.2
    assert cuda_launcher.planes_staged_narrow(s2, f16) and cuda_launcher.planes_staged_narrow(s2, f32)
    assert cuda_launcher.planes_plan(s2, f16, staged=False) == (32, 14)
    assert cuda_launcher.planes_plan(s2, f16, staged=True) == (16, 14)
    assert not cuda_launcher._planes_fit(s2, f16, 32, 14, True) and cuda_launcher._planes_fit(s2, f16, 32, 14)
    assert not cuda_launcher.planes_staged_narrow(geometry(56, 56, 144, stride=2), f16)  # 27.4 bytes a sector
    # exactly half a sector (float32 on 56 columns): staged at 3x3 multiplier 1 only
    half = {(k, m): geometry(56, 56, 144, k=k, multiplier=m, stride=2) for k in (3, 5) for m in (1, 2)}
    for (k, m), g in half.items():
        _, sectors, written = cuda_launcher.planes_direct_store_sectors(g, f32)
        assert written == 16 * sectors
        assert cuda_launcher.planes_staged_narrow(g, f32) == ((k, m) in cuda_launcher.PLANES_STAGED_AT_HALF)
    assert cuda_launcher.PLANES_STAGED_AT_HALF == {(3, 1)}
    # the launcher's own choice and path="planes": staged where narrow; forced forms either way
    assert cuda_launcher.PLANES_STAGED_BY_DEFAULT and cuda_launcher.planes_staged_result(s2, f16)
    assert cuda_launcher.planes_plan(s2, f16) == (16, 14) and cuda_launcher.planes_grid(s2, f16) == (36, 1, 1)
    assert cuda_launcher.planes_expression(s2, f16).endswith(", 3, 3, 2, true>")
    assert cuda_launcher.pick_path(s2, f16, arch=90) == "planes"
    assert cuda_launcher.pick_path(s2, f16, "planes_staged") == "planes_staged"
    assert cuda_launcher.pick_path(s2, f16, "planes_direct") == "planes_direct"
    assert not cuda_launcher.planes_staged_result(s2, f16, staged=False)
    assert not cuda_launcher.planes_expression(s2, f16, staged=False).endswith("true>")
    assert not cuda_launcher.planes_staged_result(wide, f32)
    monkeypatch.setattr(cuda_launcher, "PLANES_STAGED_BY_DEFAULT", False)
    assert not cuda_launcher.planes_staged_result(s2, f16) and cuda_launcher.planes_plan(s2, f16) == (32, 14)
    # float32 3x3 stride 2 multiplier 1 then takes the tiled kernel (PLANES_FLOAT32_TILED)
    assert cuda_launcher.pick_path(s2, f32) == "tiled"
    # no image for a plane whose one item row with the image cannot fit
    huge = geometry(4, 2800, 1, stride=2)  # a band of 2 rows: 12 + 2 x 1404 floats fit 6144, with 2 x 2800 more not
    assert cuda_launcher.planes_plan(huge, f32, staged=False) != (0, 0)
    assert not cuda_launcher.planes_staged_possible(huge, f32) and not cuda_launcher.planes_staged_result(huge, f32)
    with pytest.raises(ValueError, match="cannot stage"):
        cuda_launcher.planes_staged_result(huge, f32, staged=True)


def planes_staged_problem(rng):
    """(results, NumPy backend's) of the planes kernel with staged results forced, over
    PLANES_STAGED_CASES' whole-plane cases."""
    got, want = [], []
    for case in ("f16-3x3-13x13-groups", "f32-3x3-14x14", "bf16-5x5-odd-pads-11x10", "f16-3x3-1x3"):
        kwargs, _, _ = planes_staged_kwargs(case, rng)
        g = geometry_of(kwargs)
        out = cuda_launcher.depthwise_conv2d_native_backprop_input(
            g, to_gpu(kwargs["filter"]), to_gpu(kwargs["out_backprop"]), path="planes", staged=True)
        got.append(to_host(out).astype(np.float64).ravel())
        want.append(gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy").astype(np.float64).ravel())
    return np.concatenate(got), np.concatenate(want)


PLANTED_PLANES_STAGED = {  # bugs in the staged result stores, run on planes_staged_problem
    "planes-image-not-aligned-as-the-run": ("(run_first % (16 / static_cast<int>(sizeof(T))) - row_stored * in_cols)",
                                            "(0 - row_stored * in_cols)"),
    "planes-copy-out-of-whole-bands": ("(min(in_rows, y0 + band) - row_stored)", "(band)"),
    "planes-copy-out-tail-dropped": ("for (int k = head + vectors * VEC + tid; k < length; k += kThreads)",
                                     "for (int k = length + tid; k < length; k += kThreads)"),
    "planes-copy-out-head-dropped": ("for (int k = tid; k < head; k += kThreads) out[k] = image[k];",
                                     "(void)head;"),
    "planes-image-row-of-the-item-above": ("image_first) + (p * in_rows + y) * in_cols + x);",
                                           "image_first) + (p * in_rows + y - 1) * in_cols + x);"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANES_STAGED))
def test_planted_planes_staged_result_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_PLANES_STAGED[bug],
                                        lambda: planes_staged_problem(np.random.default_rng(6)),
                                        lambda got, want: assert_close(got, want, np.float16, scale=float(np.abs(want).max())),
                                        5, tmp_path, monkeypatch)


def test_planted_planes_staged_without_the_barrier_racecheck_catches(tmp_path, monkeypatch):
    """The barrier between the items' writes to the result image and the copy-out removed: a
    racecheck build of the host model fails the launch on the read-after-write race."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cuda_host.planted_sources(tmp_path, cuda_launcher.SOURCE,
                              ("        // consecutive 16 bytes: whole sectors), then the rest one a store.\n        __syncthreads();",
                               "        // consecutive 16 bytes: whole sectors), then the rest one a store."))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path, racecheck=True).install(monkeypatch)
    with pytest.raises(cuda_host.HostLaunchError, match="race"):
        planes_staged_problem(np.random.default_rng(6))


def test_planes_short_last_rows_read_inside_out_backprop(monkeypatch):
    """out_backprop rows shorter than a 16-byte group of accumulators (1 x 3 maps at stride 1,
    SAME 3x3: lead 1): the staging's unpredicated load before a row's first chunk reads the
    chunk itself, past the tensor's end on its last row; the launcher pads a copy
    (planes_tail_padding), so the racecheck build's bounds checks pass, and without the padding
    they fail the launch."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    kwargs, ref, scale = make_case(np.random.default_rng(8), x_shape=(1, 1, 3, 1), filt_hw=(3, 3), multiplier=1,
                                   padding="SAME", data_format="NCHW", dtype=np.float16)
    g = geometry_of(kwargs)
    assert cuda_launcher.planes_tail_padding(g, np.dtype(np.float16)) == 1  # 3 values, 4 a group
    cuda_host.HostDevice(order="shuffled", seed=5, racecheck=True).install(monkeypatch)
    np.testing.assert_array_equal(to_host(cuda_call(kwargs, path="planes")),
                                  gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy"))
    monkeypatch.setattr(cuda_launcher, "planes_tail_padding", lambda g, dtype: 0)
    with pytest.raises(cuda_host.HostLaunchError, match="out of bounds"):
        cuda_call(kwargs, path="planes")


def test_planes_staged_racecheck_passes(monkeypatch):
    """The real source, staged results forced, under the racecheck build: no hazard."""
    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    cuda_host.HostDevice(order="shuffled", seed=5, racecheck=True).install(monkeypatch)
    got, want = planes_staged_problem(np.random.default_rng(6))
    assert_close(got, want, np.float16, scale=float(np.abs(want).max()))


# ------------------------------------------------------------------ the transpose path (NCHW as NHWC)

#: Unsigned integer types of the transpose kernel's element widths.
WORD_DTYPES = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def host_transpose(kernels, x, grid=None, index="int", order="forward", seed=0, pairs=False):
    """transpose_batched (``pairs``: transpose_batched_pairs, 16-bit elements, even sizes) on the
    host: x [batch, rows, cols] (any dtype of 2, 4 or 8 bytes) -> [batch, cols, rows]; ``grid``
    (default the launcher's) may be smaller, so that blocks take several tiles; unwritten
    elements keep the all-ones guard pattern."""
    batch, rows, cols = x.shape
    words = np.ascontiguousarray(x).view(WORD_DTYPES[x.dtype.itemsize])
    out = np.full((batch, cols, rows), np.iinfo(words.dtype).max, words.dtype)
    tile = _layout.PAIRS_TILE if pairs else _layout.TILE
    expression = _layout.pairs_expression(index) if pairs else _layout.expression(x.dtype.itemsize, index)
    kernels.launch(expression, grid or _layout.grid(batch, rows, cols, tile), (_layout.TILE, _layout.BLOCK_ROWS),
                   [words, out], [batch, rows, cols, -(-rows // tile), -(-cols // tile)], order=order, seed=seed)
    return out.view(x.dtype)


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("index", ["int", "long long"])
@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_transpose_kernel_on_host(host_kernels, rng, itemsize, index, order):
    """Every bit pattern comes through (NaN payloads, -0.0, subnormals: only bits move), on full
    and part tiles, sizes below, at and past one tile, and grids smaller than the tile count (a
    block then takes several tiles, so its second barrier matters), in any block order."""
    dtype = WORD_DTYPES[itemsize]
    for shape, grid in (((3, 5, 7), None), ((2, 32, 32), None), ((2, 64, 96), None), ((2, 33, 65), None),
                        ((1, 1, 100), None), ((3, 100, 1), None), ((2, 70, 45), (1, 1, 1)), ((5, 64, 64), (2, 1, 2)),
                        ((2, 96, 40), (1, 2, 1))):
        x = rng.integers(0, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True)
        got = host_transpose(host_kernels, x, grid, index, order, seed=7)
        np.testing.assert_array_equal(got, np.ascontiguousarray(x.transpose(0, 2, 1)))


@pytest.mark.parametrize("index", ["int", "long long"])
@pytest.mark.parametrize("order", ["forward", "reverse", "shuffled"])
def test_transpose_pairs_kernel_on_host(host_kernels, rng, index, order):
    """The paired 16-bit kernel: every bit pattern, even sizes below, at and past its 64-element
    tiles (part tiles in either dimension), grids smaller than the tile count."""
    for shape, grid in (((3, 6, 10), None), ((2, 64, 64), None), ((2, 128, 192), None), ((2, 66, 130), None),
                        ((1, 2, 200), None), ((3, 200, 2), None), ((2, 70, 46), (1, 1, 1)), ((5, 128, 64), (2, 1, 2)),
                        ((2, 96, 40), (1, 2, 1))):
        x = rng.integers(0, 2**16, shape, dtype=np.uint16)
        got = host_transpose(host_kernels, x, grid, index, order, seed=7, pairs=True)
        np.testing.assert_array_equal(got, np.ascontiguousarray(x.transpose(0, 2, 1)))


def test_transpose_pairs_choice():
    """Pairs for 16-bit elements with even rows and columns and 4-byte aligned arrays only."""
    import types

    def array(dtype, address=256):
        return types.SimpleNamespace(dtype=np.dtype(dtype), data=types.SimpleNamespace(ptr=address), itemsize=2)

    half = array(np.float16)
    assert _layout.pairs_possible(half, half, 6, 10)
    assert not _layout.pairs_possible(half, half, 6, 49)  # a 7 x 7 map: odd rows of positions
    assert not _layout.pairs_possible(half, half, 5, 10)
    assert not _layout.pairs_possible(array(np.float16, 258), half, 6, 10)  # a view 1 element in
    assert not _layout.pairs_possible(array(np.float32), array(np.float32), 6, 10)


def test_transpose_index_type_and_grid():
    """32-bit offsets while a whole last tile past each dimension stays below 2**31; grids within
    CUDA's limits (the kernel strides over the rest)."""
    assert _layout.index_type(32, 144, 56 * 56) == "int"
    assert _layout.index_type(1, 2**15, 2**16 - 64) == "long long"  # the padded tile corner passes 2**31
    assert _layout.index_type(2**20, 2**10, 2**10) == "long long"
    assert _layout.grid(70000, 33, 65) == (3, 2, 65535)
    assert _layout.grid(1, 2**21, 31) == (1, 65535, 1)


TRANSPOSE_CASES = [  # (x_shape, filter, strides, multiplier, padding, pads)
    ((2, 9, 8, 5), (3, 3), (1, 1), 1, "SAME", NO_PADS),
    ((1, 7, 7, 20), (3, 3), (1, 1), 2, "SAME", NO_PADS),
    ((2, 10, 11, 3), (3, 3), (2, 2), 3, "VALID", NO_PADS),
    ((1, 12, 9, 9), (5, 5), (2, 2), 1, "SAME", NO_PADS),
    ((2, 8, 13, 4), (5, 5), (1, 1), 2, "EXPLICIT", ((0, 3), (2, 1))),
    ((1, 40, 36, 33), (3, 3), (1, 1), 1, "SAME", NO_PADS),  # several tiles of 32 positions and channels
    ((2, 10, 12, 6), (3, 3), (1, 1), 1, "SAME", NO_PADS),  # even sizes: 16-bit elements move in pairs
    ((1, 18, 20, 70), (3, 3), (1, 1), 1, "SAME", NO_PADS),  # pairs on part tiles of 64 either way
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
def test_cuda_transpose_path_is_the_tiled_kernels_bits(cuda_device, rng, dtype):
    """The transpose path gives the NCHW tiled kernel's bits exactly (each element sums its taps in
    the same order in either layout), and the loops' values."""
    for x_shape, filt_hw, strides, multiplier, padding, pads in TRANSPOSE_CASES:
        kwargs, ref, scale = make_case(rng, x_shape=x_shape, filt_hw=filt_hw, multiplier=multiplier,
                                       strides=strides, padding=padding, pads=pads, data_format="NCHW", dtype=dtype)
        through = check_cuda(kwargs, ref, scale, path="transpose", device=cuda_device)
        tiled = to_host(cuda_call(kwargs, path="tiled"))
        np.testing.assert_array_equal(through.view(WORD_DTYPES[through.dtype.itemsize]),
                                      tiled.view(WORD_DTYPES[tiled.dtype.itemsize]))


def test_transpose_path_choice():
    """NCHW where the tiled kernel takes the NHWC twin; opt-in; refused otherwise."""
    kwargs = case_kwargs(np.random.default_rng(0), x_shape=(1, 8, 8, 4), filt_hw=(3, 3), multiplier=1,
                         padding="SAME", data_format="NCHW")
    g = geometry_of(kwargs)
    f32 = np.dtype(np.float32)
    assert cuda_launcher.transpose_possible(g, f32)
    twin = cuda_launcher.nhwc_twin(g)
    assert twin.data_format == "NHWC" and twin.out_backprop_shape == (1, 8, 8, 4)
    assert not cuda_launcher.transpose_possible(twin, f32)  # NHWC has nothing to transpose
    assert not cuda_launcher.TRANSPOSE_BY_DEFAULT and not cuda_launcher.transpose_chosen(g, f32)
    assert cuda_launcher.pick_path(g, f32, "transpose") == "transpose"
    dilated = case_kwargs(np.random.default_rng(0), x_shape=(1, 8, 8, 4), filt_hw=(3, 3), multiplier=1,
                          dilations=(2, 2), padding="SAME", data_format="NCHW")
    with pytest.raises(ValueError, match="transpose path cannot run"):
        cuda_launcher.pick_path(geometry_of(dilated), f32, "transpose")


#: The transpose kernel's header.
TRANSPOSE_HEADER = "layout_transpose.cuh"

PLANTED_TRANSPOSE = {  # bugs in transpose_batched: name -> (text of the real source, its replacement)
    "transpose-no-barrier-before-the-next-tile": (
        "        __syncthreads();  // every thread has read the tile before the next one is staged\n    });\n}\n\n"
        "// The paired form", "    });\n}\n\n// The paired form"),
    "transpose-tile-read-untransposed": ("p[k * dst_step] = tile[tx][ty + k * kBlockRows];\n            } else",
                                         "p[k * dst_step] = tile[ty + k * kBlockRows][tx];\n            } else"),
    "transpose-part-tile-row-test-on-columns": ("v[k] = column && i0 + ty + k * kBlockRows < rows ? p[k * src_step] : W(0);",
                                                "v[k] = column && i0 + ty + k * kBlockRows < cols ? p[k * src_step] : W(0);"),
    "transpose-part-tile-writes-past-the-row": ("} else if (i0 + tx < rows) {", "} else if (true) {"),
    "transpose-part-tile-drops-its-last-column": (
        "if (j0 + ty + k * kBlockRows < cols) p[k * dst_step] = tile[tx]",
        "if (j0 + ty + k * kBlockRows < cols - 1) p[k * dst_step] = tile[tx]"),
    # The tile walk both kernels share (for_each_tile).
    "tile-full-test-on-rows-only": ("work(n, i0, j0, i0 + TILE <= rows && j0 + TILE <= cols);",
                                    "work(n, i0, j0, i0 + TILE <= rows);"),
    "tile-full-test-on-columns-only": ("work(n, i0, j0, i0 + TILE <= rows && j0 + TILE <= cols);",
                                       "work(n, i0, j0, j0 + TILE <= cols);"),
    "transpose-batch-item-offset-dropped": ("W* const p = dst + n * plane + (j0 + ty) * rows + (i0 + tx);",
                                            "W* const p = dst + (j0 + ty) * rows + (i0 + tx);"),
    # The paired 16-bit kernel (transpose_problem's float16 calls).
    "pairs-swizzle-not-undone": ("const int w = (c >> 1) ^ tx;", "const int w = c >> 1;"),
    "pairs-halves-of-the-other-column": ("const int shift = 16 * (ty & 1);", "const int shift = 16 * (~ty & 1);"),
    "pairs-rows-packed-backwards": (
        "return ((tile[2 * tx][w] >> shift) & 0xffffu) | ((tile[2 * tx + 1][w] >> shift) << 16);",
        "return ((tile[2 * tx + 1][w] >> shift) & 0xffffu) | ((tile[2 * tx][w] >> shift) << 16);"),
    "pairs-part-tile-drops-its-last-column": ("if (j0 + ty + k * kBlockRows < cols) p[k * dst_step] = word(",
                                              "if (j0 + ty + k * kBlockRows < cols - 1) p[k * dst_step] = word("),
    "pairs-part-tile-row-test-on-columns": ("i0 + ty + (b + k) * kBlockRows < rows ? p[(b + k) * src_step] : 0u;",
                                            "i0 + ty + (b + k) * kBlockRows < cols ? p[(b + k) * src_step] : 0u;"),
    "pairs-second-load-batch-over-the-first": ("const int r = ty + (b + k) * kBlockRows;",
                                               "const int r = ty + k * kBlockRows;"),
    # Not planted: part-tile read tests that let a thread read past its src row or past the last
    # src row (j0 + tx < cols; no row test).  What such reads bring is never written (dst rows past
    # cols and dst words past rows are skipped), so only a read past the array's end shows it: the
    # host model does not check reads of its guard bytes; compute-sanitizer's memcheck on a GPU
    # does (scripts/device-session.sh runs the transpose tests under it).
    "pairs-part-tile-writes-past-the-rows": ("} else if (i0 + 2 * tx < rows) {", "} else if (i0 + tx < rows) {"),
    "pairs-no-barrier-before-the-next-tile": (
        "        __syncthreads();  // every thread has read the tile before the next one is staged\n    });\n}\n\n"
        "}  // namespace gradops", "    });\n}\n\n}  // namespace gradops"),
}


def transpose_problem(rng):
    """(the transpose path's result, the tiled kernel's) on NCHW calls whose tensors have full and
    part tiles, through the launcher (float32: the element kernel; float16 with even sizes: the
    paired one), plus direct launches on a grid of one block (a block then takes every tile)."""
    got, want = [], []
    for x_shape, dtype in (((2, 9, 7, 40), np.float32), ((1, 12, 12, 33), np.float32), ((1, 18, 20, 70), np.float16),
                           ((2, 10, 12, 6), np.float16)):
        kwargs = case_kwargs(rng, x_shape=x_shape, filt_hw=(3, 3), multiplier=1, padding="SAME",
                             data_format="NCHW", dtype=dtype)
        got.append(to_host(cuda_call(kwargs, path="transpose")).view(WORD_DTYPES[np.dtype(dtype).itemsize]).ravel())
        want.append(to_host(cuda_call(kwargs, path="tiled")).view(WORD_DTYPES[np.dtype(dtype).itemsize]).ravel())
    import cupy

    x = rng.standard_normal((2, 70, 45)).astype(np.float32)
    out = cupy.empty((2, 45, 70), np.float32)
    _layout.transpose(cuda_launcher.SOURCE, to_gpu(x), out, 2, 70, 45)
    one_block = cupy.empty((2, 45, 70), np.float32)
    fn = cuda_launcher._runtime.kernel(cuda_launcher.SOURCE, _layout.expression(4, "int"))
    fn((1, 1, 1), (_layout.TILE, _layout.BLOCK_ROWS),
       (cuda_launcher._runtime.pointer(to_gpu(x)), cuda_launcher._runtime.pointer(one_block),
        *(np.int32(v) for v in (2, 70, 45, 3, 2))))
    got += [to_host(out).view(np.uint32).ravel(), to_host(one_block).view(np.uint32).ravel()]
    want += [x.transpose(0, 2, 1).view(np.uint32).ravel()] * 2
    halves = rng.integers(0, 2**16, (2, 130, 70), dtype=np.uint16)
    one_block = cupy.empty((2, 70, 130), np.uint16)
    fn = cuda_launcher._runtime.kernel(cuda_launcher.SOURCE, _layout.pairs_expression("int"))
    fn((1, 1, 1), (_layout.TILE, _layout.BLOCK_ROWS),
       (cuda_launcher._runtime.pointer(to_gpu(halves)), cuda_launcher._runtime.pointer(one_block),
        *(np.int32(v) for v in (2, 130, 70, 3, 2))))
    got.append(to_host(one_block).ravel().astype(np.uint32))
    # The 64-bit form (its loads in two batches), on the launcher's grid.
    wide = cupy.empty((2, 70, 130), np.uint16)
    fn = cuda_launcher._runtime.kernel(cuda_launcher.SOURCE, _layout.pairs_expression("long long"))
    fn(_layout.grid(2, 130, 70, _layout.PAIRS_TILE), (_layout.TILE, _layout.BLOCK_ROWS),
       (cuda_launcher._runtime.pointer(to_gpu(halves)), cuda_launcher._runtime.pointer(wide),
        *(np.int64(v) for v in (2, 130, 70, 3, 2))))
    got.append(to_host(wide).ravel().astype(np.uint32))
    want += [halves.transpose(0, 2, 1).ravel().astype(np.uint32)] * 2
    return np.concatenate(got), np.concatenate(want)


@pytest.mark.parametrize("bug", sorted(PLANTED_TRANSPOSE))
def test_planted_transpose_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    """Each bug planted in a copy of the transpose kernel makes transpose_problem's results differ
    (or a launch touch memory outside an array); the real source passes."""
    cuda_host.assert_planted_bug_caught(TRANSPOSE_HEADER, PLANTED_TRANSPOSE[bug],
                                        lambda: transpose_problem(np.random.default_rng(6)),
                                        lambda got, want: np.testing.assert_array_equal(got, want), 5, tmp_path,
                                        monkeypatch)


# ---- the planes kernel's staging loads (16, 8 or 4 bytes where rows and the array allow)

#: (dtype, out_backprop element shift into its allocation, load elements the launcher takes): on
#: 16-column rows every width divides a row, so the array's alignment decides.
PLANES_LOAD_WIDTHS = [
    (np.float16, 0, 8), (np.float16, 4, 4), (np.float16, 2, 2), (np.float16, 1, 1),
    (ml_dtypes.bfloat16, 0, 8), (ml_dtypes.bfloat16, 1, 1),
    (np.float32, 0, 4), (np.float32, 2, 2), (np.float32, 1, 1),
    (np.float64, 0, 2), (np.float64, 1, 1),
]


@pytest.mark.parametrize("dtype,shift,elements", PLANES_LOAD_WIDTHS,
                         ids=[f"{np.dtype(d).name}-shift{s}" for d, s, _ in PLANES_LOAD_WIDTHS])
def test_cuda_planes_staging_load_widths(cuda_device, rng, dtype, shift, elements):
    """The planes kernel stages out_backprop in the widest loads (16, 8 or 4 bytes) that divide a
    row and to which the array is aligned, else an element a load; each width gives the loops'
    result, at both strides (a 16-column map: 16 and 8 out_backprop columns)."""
    for stride in (1, 2):
        kwargs, ref, scale = make_case(rng, x_shape=(2, 9, 16, 5), filt_hw=(3, 3), multiplier=2,
                                       strides=(stride, stride), padding="SAME", data_format="NCHW", dtype=dtype)
        g = geometry_of(kwargs)
        dy = kwargs["out_backprop"]
        view = shifted_gpu(dy, shift)
        assert cuda_launcher.planes_load_elements(g, np.dtype(dtype), view) == elements
        got = to_host(cuda_call(kwargs, path="planes", out_backprop=view))
        assert cuda_device is None or launched(cuda_device) == planes_form(g, np.dtype(dtype), "planes")
        assert_close(got, ref, np.dtype(dtype), scale)


def test_planes_load_elements():
    """Elements a staging load: the widest of 16, 8 and 4 bytes (more than one element) that
    divides an out_backprop row, for an aligned array."""
    def g(cols, stride=1):
        return geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(1, 8, cols, 4), filt_hw=(3, 3),
                                       multiplier=1, strides=(stride, stride), padding="SAME", data_format="NCHW",
                                       dtype=np.float32))

    half, single, double = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
    assert [cuda_launcher.planes_load_elements(g(c), half) for c in (112, 56, 28, 14, 7)] == [8, 8, 4, 2, 1]
    assert [cuda_launcher.planes_load_elements(g(c), single) for c in (112, 56, 28, 14, 7)] == [4, 4, 4, 2, 1]
    assert [cuda_launcher.planes_load_elements(g(c), double) for c in (112, 14, 7)] == [2, 2, 1]
    assert cuda_launcher.planes_load_elements(g(112, stride=2), half) == 8  # 56 out_backprop columns
    assert cuda_launcher.planes_load_elements(g(28, stride=2), half) == 2   # 14


def test_planes_staging_lead():
    """The staged column of out_backprop column 0 modulo a 16-byte store's accumulators (the
    kernel's ``lead``, which the static model compiles as a constant): 1 for 3x3 SAME at either
    stride, 2 for 5x5 SAME, 2 and 0 for 3x3 and 5x5 VALID at stride 1, float64's modulo 2, and
    a left pad wider than the filter reaches (staged column 0 past out_backprop column 0)."""
    def g(filt, stride, padding="SAME", pads=NO_PADS, cols=16):
        return geometry_of(case_kwargs(np.random.default_rng(0), x_shape=(1, 8, cols, 4), filt_hw=(filt, filt),
                                       multiplier=1, strides=(stride, stride), padding=padding, pads=pads,
                                       data_format="NCHW", dtype=np.float32))

    single, double = np.dtype(np.float32), np.dtype(np.float64)
    lead = cuda_launcher.planes_staging_lead
    assert [lead(g(3, 1), single), lead(g(3, 2), single), lead(g(5, 1), single), lead(g(5, 2), single)] == [1, 1, 2, 2]
    assert [lead(g(3, 1, "VALID"), single), lead(g(5, 1, "VALID"), single)] == [2, 0]
    assert [lead(g(3, 1), double), lead(g(5, 1), double)] == [1, 0]
    assert lead(g(5, 1, "EXPLICIT", ((0, 0), (6, 0))), single) == 2  # column origin 6 - 4 = 2 past the stage's first


@pytest.mark.parametrize("shift", [0, 1], ids=["aligned", "element-by-element"])
def test_planes_staging_loads_fill_whole_sectors(monkeypatch, shift):
    """Counted by the execution model per warp-level load (tests/cuda_host_runtime.h,
    count_global_load): the planes kernel's 16-byte staging loads of a float16 map with 16-column
    rows touch only whole sectors (a warp's 32 chunks, 512 consecutive bytes, in 16 sectors);
    staged an element a load (an out_backprop 2 bytes into its allocation) each warp-level load
    reads 2 bytes a lane across the same 16 or 17 sectors, 8 loads a chunk: the 78% excess sectors
    the H200 measured on this kernel (2026-12-04).  Each chunk also loads the 4 elements before
    it (its group's first value, 3x3 SAME: lead 1; see "Staging stores"), 8 bytes a lane 16 bytes
    apart: 16 sectors for 8 sectors' bytes, every one of them a sector the chunk loads also read
    (L1 serves them again; on a GPU ptxas narrows the load to the one value used, 2 bytes, in
    the same sectors).  One CTA of 8 planes, 16 staged rows of 2 chunks a slice: 256 chunks,
    one a thread."""
    import cuda_host

    device = cuda_host.planted_host_device(None, cuda_launcher.SOURCE).install(monkeypatch)
    kwargs = case_kwargs(np.random.default_rng(8), x_shape=(1, 16, 16, 8), filt_hw=(3, 3), multiplier=1,
                         padding="SAME", data_format="NCHW", dtype=np.float16)
    g = geometry_of(kwargs)
    assert cuda_launcher.planes_plan(g, np.dtype(np.float16)) == (8, 16)
    dy = kwargs["out_backprop"]
    view = shifted_gpu(dy, shift)
    kernels = device.host_kernels(cuda_launcher.SOURCE, cuda_launcher.planes_expression(g, np.dtype(np.float16)))
    kernels.count_global_loads(True)
    try:
        got = to_host(cuda_call(kwargs, path="planes", out_backprop=view))
        loads = kernels.global_load_stats()
    finally:
        kernels.count_global_loads(False)
    want = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    assert_close(got, want, np.float16, scale=float(np.abs(want.astype(np.float64)).max()))
    # 8 warps, one chunk a lane (the tensor's last chunk ends at its last element: read whole)
    if shift == 0:
        # the chunks' 16-byte loads, whole sectors; the 8-byte loads of the 4 elements before them
        assert loads["accesses"] == 8 + 8, loads
        assert loads["ideal"] == 16 * 8 + 8 * 8 and loads["sectors"] == 16 * 8 + 16 * 8, loads
    else:
        # 8 element loads a chunk and 4 before it, 64 bytes a warp-level load
        assert loads["accesses"] == 8 * 8 + 8 * 4 and loads["ideal"] == 2 * (8 * 8 + 8 * 4), loads
        assert loads["sectors"] >= 16 * 8 * 8, loads


#: The planes kernel's shared-memory wavefronts per ideal, as the execution model counts them
#: (float32 3x3 stride 1, SAME, one image of 32 channels; columns -> (window and tap loads,
#: staging stores)): the upper bounds a change must not pass.
PLANES_WAVEFRONTS = {56: (1.0, 1.6), 112: (1.11, 1.7), 28: (1.75, 2.0), 14: (1.65, 1.8)}


@pytest.mark.parametrize("cols", sorted(PLANES_WAVEFRONTS))
def test_planes_shared_memory_wavefronts(monkeypatch, cols):
    """Bank wavefronts of the planes kernel's shared-memory traffic, counted per warp-level
    access by the execution model (dwplanes::load_aligned reports the loads, the emulated
    st.shared.v4 of put_group the stores, a lane whose group is not stored as idle): the
    window reads are conflict-free at 56 columns (a quarter-warp's 8 items run on into the next
    row pair's 16-byte words), 1.1x ideal at 112 and 1.6-1.75x at 28 and 14, where the next row
    pair's first item lands on a bank of the quarter-warp's first items.  The staging stores, 16
    bytes a store since this count was first taken, take 1.6-2 wavefronts for 1 (consecutive
    lanes' groups 32 bytes apart: lanes 4 apart share banks within a row); stored an element a
    store, consecutive lanes' 32 bytes apart, they took about 5 (the count at 56 and 112
    columns, with 2.0-2.4 times as many wavefronts in all as now; the H100 measured the float32
    kernel's shared stores at 2.7-5.1 wavefronts for one on these maps, 2026-12-05, the H200
    the float16 kernel's 4.7-way on 112 x 112, 2026-12-04)."""
    import cuda_host

    device = cuda_host.planted_host_device(None, cuda_launcher.SOURCE).install(monkeypatch)
    kwargs = case_kwargs(np.random.default_rng(cols), x_shape=(1, cols, cols, 32), filt_hw=(3, 3), multiplier=1,
                         padding="SAME", data_format="NCHW", dtype=np.float32)
    g = geometry_of(kwargs)
    kernels = device.host_kernels(cuda_launcher.SOURCE, cuda_launcher.planes_expression(g, np.dtype(np.float32)))
    for kind in ("load", "st_shared_16"):
        kernels.shared_stats(reset=True, kind=kind)
    got = to_host(cuda_call(kwargs, path="planes"))
    loads, stores = (kernels.shared_stats(kind=kind) for kind in ("load", "st_shared_16"))
    want = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    assert_close(got, want, np.float32, scale=float(np.abs(want).max()))
    load_bound, store_bound = PLANES_WAVEFRONTS[cols]
    assert loads["accesses"] > 0 and loads["wavefronts"] <= load_bound * loads["ideal"], loads
    if cols == 56:
        assert loads["wavefronts"] == loads["ideal"], loads
    assert stores["accesses"] > 0 and stores["wavefronts"] <= store_bound * stores["ideal"], stores
    # 16-byte stores: a warp-level store of 32 lanes is at least 4 passes of 8
    assert stores["ideal"] >= 3 * stores["accesses"], stores


#: Bugs in the planes kernel's vector staging, run on planes_vector_problem.
PLANTED_PLANES_VECTOR = {
    "planes-vector-loads-repeat-the-first-piece": (
        "raw[j] = dwconv::load_vector(reinterpret_cast<const Raw*>(src) + j);",
        "raw[j] = dwconv::load_vector(reinterpret_cast<const Raw*>(src));"),
    "planes-vector-loads-a-piece-short": ("constexpr int LOADS = kChunk / VEC;", "constexpr int LOADS = kChunk / VEC - 1;"),
    "planes-element-staging-dropped": ("    if (load_elements == 1) stage_with(dwconv::Int<1>{});\n", "\n"),
}


def planes_vector_problem(rng):
    """(results, NumPy backend's) of planes calls whose staging takes every load width: float32
    and float16 on 16-column rows from allocations shifted 0, 1 and 2 elements (16, 4 and 8 bytes
    for float32; 16, 2 and 4 for float16), and float16 from one 4 elements in (8 bytes)."""
    got, want = [], []
    for dtype, shifts in ((np.float32, (0, 1, 2)), (np.float16, (0, 1, 2, 4))):
        for shift in shifts:
            kwargs = case_kwargs(rng, x_shape=(2, 7, 16, 3), filt_hw=(3, 3), multiplier=2, padding="SAME",
                                 data_format="NCHW", dtype=dtype)
            dy = kwargs["out_backprop"]
            got.append(to_host(cuda_call(kwargs, path="planes", out_backprop=shifted_gpu(dy, shift)))
                       .astype(np.float64).ravel())
            want.append(gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
                        .astype(np.float64).ravel())
    return np.concatenate(got), np.concatenate(want)


@pytest.mark.parametrize("bug", sorted(PLANTED_PLANES_VECTOR))
def test_planted_planes_vector_staging_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    cuda_host.assert_planted_bug_caught(cuda_launcher.SOURCE, PLANTED_PLANES_VECTOR[bug],
                                        lambda: planes_vector_problem(np.random.default_rng(6)),
                                        lambda got, want: assert_close(got, want, np.float16,
                                                                       scale=float(np.abs(want).max())),
                                        5, tmp_path, monkeypatch)


def test_planes_misaligned_vector_loads_are_refused_by_the_model(monkeypatch):
    """The execution model refuses a vector load from an address not aligned to its size (a GPU's
    misaligned address error): a launcher that took 16-byte loads for an out_backprop 2 bytes
    into its allocation fails its launch."""
    import cuda_host

    cuda_host.planted_host_device(None, cuda_launcher.SOURCE).install(monkeypatch)
    monkeypatch.setattr(cuda_launcher, "planes_load_elements", lambda g, dtype, out_backprop=None: 8)
    kwargs = case_kwargs(np.random.default_rng(2), x_shape=(1, 6, 16, 4), filt_hw=(3, 3), multiplier=1,
                         padding="SAME", data_format="NCHW", dtype=np.float16)
    dy = kwargs["out_backprop"]
    with pytest.raises(cuda_host.HostLaunchError, match="align"):
        cuda_call(kwargs, path="planes", out_backprop=shifted_gpu(dy, 1))
