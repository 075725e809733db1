"""gradops.depthwise_conv2d_native_backprop_input against brute-force loops, adjointness and TF."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import gradops
from conftest import FLOAT_DTYPES, FOREIGN_GPU_WRAPPERS, RTOL, assert_close, random_array, to_gpu, to_host
from reference import conv2d, conv2d_backprop_input, depthwise_to_hwio, window

NO_PADS = ((0, 0), (0, 0))
DTYPE_IDS = [np.dtype(d).name for d in FLOAT_DTYPES]


# --------------------------------------------------------------------------- helpers


def attr4(rows, cols, data_format):
    """A strides/dilations attribute in ``data_format`` order."""
    return [1, rows, cols, 1] if data_format == "NHWC" else [1, 1, rows, cols]


def explicit8(pads, data_format):
    """((top, bottom), (left, right)) as TF's 8-entry explicit_paddings in ``data_format`` order."""
    (t, b), (l, r) = pads
    return [0, 0, t, b, l, r, 0, 0] if data_format == "NHWC" else [0, 0, 0, 0, t, b, l, r]


def to_format(x, data_format):
    """An NHWC array (or shape tuple) in ``data_format``."""
    if data_format == "NHWC":
        return x
    if isinstance(x, tuple):
        return (x[0], x[3], x[1], x[2])
    return x.transpose(0, 3, 1, 2)


def out_hw(in_hw, filt_hw, strides, dilations, padding, pads):
    """Output (rows, cols) from the reference's window()."""
    return tuple(window(in_hw[i], filt_hw[i], strides[i], dilations[i], padding, pads[i])[0] for i in range(2))


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


@pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3)))],
                         ids=["SAME", "VALID", "EXPLICIT"])
@pytest.mark.parametrize("dilations", [(1, 1), (2, 2), (1, 2)], ids=lambda d: f"dil{d[0]}x{d[1]}")
@pytest.mark.parametrize("strides", [(1, 1), (2, 2), (1, 2), (2, 1)], ids=lambda s: f"str{s[0]}x{s[1]}")
@pytest.mark.parametrize("filt_hw", [(1, 1), (3, 3), (5, 5)], ids=lambda f: f"f{f[0]}x{f[1]}")
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


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", [("VALID", NO_PADS), ("EXPLICIT", ((0, 3), (2, 1)))],
                         ids=["VALID", "EXPLICIT"])
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


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 2), (0, 1)))],
                         ids=["SAME", "VALID", "EXPLICIT"])
def test_adjoint_identity(rng, padding, pads, data_format):
    """<conv(x, w), dy> == <x, backprop_input(x.shape, w, dy)> in float64."""
    x = rng.standard_normal(to_format((2, 7, 6, 3), data_format))
    w = rng.standard_normal((3, 2, 3, 2))
    args = dict(strides=attr4(2, 1, data_format), padding=padding,
                explicit_paddings=explicit8(pads, data_format) if padding == "EXPLICIT" else [],
                data_format=data_format, dilations=attr4(1, 2, data_format))
    y = gradops.depthwise_conv2d_native(x, w, **args)
    x_nhwc = x if data_format == "NHWC" else x.transpose(0, 2, 3, 1)
    ref_y = conv2d(x_nhwc, depthwise_to_hwio(w), (2, 1), padding, (1, 2), pads)
    assert_close(y, to_format(ref_y, data_format), np.float64)  # the forward op itself is right
    dy = rng.standard_normal(y.shape)
    dx = gradops.depthwise_conv2d_native_backprop_input(np.array(x.shape), w, dy, **args)
    lhs, rhs = float(np.sum(y * dy)), float(np.sum(x * dx))
    assert abs(lhs - rhs) <= 1e-10 * max(1.0, float(np.sum(np.abs(y * dy))))


# --------------------------------------------------------------------------- hypothesis


@st.composite
def depthwise_cases(draw):
    n = draw(st.integers(1, 2))
    h, w = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    c, m = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    fr, fc = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    strides = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilations = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = NO_PADS
    if padding == "EXPLICIT":
        pads = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(2))
    oh, ow = out_hw((h, w), (fr, fc), strides, dilations, padding, pads)
    assume(oh > 0 and ow > 0)  # TF (and gradops) refuse negative output sizes; keep it simple
    return dict(x_shape=(n, h, w, c), filt_hw=(fr, fc), multiplier=m, strides=strides, dilations=dilations,
                padding=padding, pads=pads, data_format=draw(st.sampled_from(["NHWC", "NCHW"])),
                dtype=draw(st.sampled_from(FLOAT_DTYPES)))


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


def make_case(rng, *, x_shape, filt_hw, multiplier, strides=(1, 1), dilations=(1, 1), padding="VALID",
              pads=NO_PADS, data_format="NHWC", dtype=np.float64):
    """Random filter and out_backprop for an NHWC-described case, as gradops' keyword arguments
    (tensors in ``data_format``), with the float64 reference (in ``data_format``) and its scale."""
    n, h, w_, c = x_shape
    oh, ow = out_hw((h, w_), filt_hw, strides, dilations, padding, pads)
    w = random_array(rng, (*filt_hw, c, multiplier), dtype)
    dy = random_array(rng, (n, oh, ow, c * multiplier), dtype)
    kwargs = dict(input_sizes=np.array(to_format(x_shape, data_format)), filter=w,
                  out_backprop=np.ascontiguousarray(to_format(dy, data_format)),
                  strides=attr4(*strides, data_format), padding=padding,
                  explicit_paddings=explicit8(pads, data_format) if padding == "EXPLICIT" else [],
                  data_format=data_format, dilations=attr4(*dilations, data_format))
    ref, scale = expected_grad(x_shape, w, dy, strides, padding, dilations, pads)
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
    """Every dtype x layout x (specialisation or generic) the launcher can pick is instantiated."""
    listed = set(cuda_launcher.instantiations()[cuda_launcher.SOURCE])
    assert len(listed) == 4 * 2 * (len(cuda_launcher.SPECIALISATIONS) + 1)
    for dtype in FLOAT_DTYPES:
        for data_format in ("NHWC", "NCHW"):
            for shape in (*cuda_launcher.SPECIALISATIONS, cuda_launcher.GENERIC):
                assert cuda_launcher._expression(dtype, data_format, shape) in listed


def test_specialisation_choice():
    """3x3 / 5x5 filters at strides 1x1 / 2x2 get their compile-time kernels, the rest the generic one."""
    kwargs, _, _ = make_case(np.random.default_rng(0), x_shape=(1, 8, 8, 1), filt_hw=(5, 5), multiplier=1,
                             strides=(2, 2), padding="SAME")
    assert cuda_launcher.specialisation(geometry_of(kwargs)) == (5, 5, 2, 2)
    kwargs, _, _ = make_case(np.random.default_rng(0), x_shape=(1, 8, 8, 1), filt_hw=(3, 3), multiplier=1,
                             strides=(1, 2), padding="SAME")
    assert cuda_launcher.specialisation(geometry_of(kwargs)) == cuda_launcher.GENERIC


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


def cuda_call(kwargs, **tensors):
    """gradops on the GPU (backend="cuda") for a make_case call; ``tensors`` override the GPU arrays."""
    gpu = dict(kwargs, filter=to_gpu(kwargs["filter"]), out_backprop=to_gpu(kwargs["out_backprop"]))
    gpu.update(tensors)
    return gradops.depthwise_conv2d_native_backprop_input(**gpu, backend="cuda")


def check_cuda(kwargs, ref, scale):
    """The CUDA result has the right type, shape and dtype and matches both the loops and the NumPy backend."""
    import cupy

    got = cuda_call(kwargs)
    assert isinstance(got, cupy.ndarray)
    dtype = kwargs["out_backprop"].dtype
    assert got.dtype == dtype and got.shape == tuple(kwargs["input_sizes"])
    got = to_host(got)
    assert_close(got, ref, dtype, scale)
    expected = gradops.depthwise_conv2d_native_backprop_input(**kwargs, backend="numpy")
    assert_close(got, expected, dtype, 2 * scale)  # two roundings: each side's own
    return got


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", CUDA_PADDINGS, ids=CUDA_PADDING_IDS)
@pytest.mark.parametrize("filt_hw,strides,dilations", CUDA_GEOMETRIES, ids=CUDA_GEOMETRY_IDS)
def test_cuda_geometry_grid(cuda_device, rng, filt_hw, strides, dilations, padding, pads, data_format):
    """Every specialisation and the generic kernel, every padding, both layouts (float64)."""
    check_cuda(*make_case(rng, x_shape=CUDA_X_SHAPE, filt_hw=filt_hw, multiplier=2, strides=strides,
                          dilations=dilations, padding=padding, pads=pads, data_format=data_format))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("multiplier", [1, 2, 3, 4], ids=lambda m: f"M{m}")
def test_cuda_multiplier_format_dtype_grid(cuda_device, rng, multiplier, data_format, dtype):
    """Multipliers 1-4, both layouts, all float dtypes, on specialised and generic kernels."""
    for filt_hw, strides, padding in (((3, 3), (1, 1), "SAME"), ((5, 5), (2, 2), "SAME"),
                                      ((3, 2), (2, 1), "VALID")):
        check_cuda(*make_case(rng, x_shape=(2, 9, 8, 3), filt_hw=filt_hw, multiplier=multiplier,
                              strides=strides, dilations=(1, 2), padding=padding, data_format=data_format,
                              dtype=dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding,pads", [("VALID", NO_PADS), ("EXPLICIT", ((0, 3), (2, 1)))],
                         ids=["VALID", "EXPLICIT"])
def test_cuda_padding_format_dtype_grid(cuda_device, rng, padding, pads, data_format, dtype):
    """VALID and asymmetric EXPLICIT padding, both layouts, all float dtypes, odd sizes."""
    check_cuda(*make_case(rng, x_shape=(1, 7, 5, 3), filt_hw=(3, 3), multiplier=3, strides=(1, 2),
                          dilations=(2, 1), padding=padding, pads=pads, data_format=data_format, dtype=dtype))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=depthwise_cases(), seed=st.integers(0, 2**32 - 1))
def test_cuda_property(cuda_device, case, seed):
    """Random shapes, strides, dilations, paddings, layouts and dtypes match the loops and NumPy."""
    check_cuda(*make_case(np.random.default_rng(seed), **case))


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
    kwargs, _, _ = make_case(rng, x_shape=(4, 33, 31, 8), filt_hw=(5, 5), multiplier=3, strides=(1, 1),
                             dilations=(2, 1), padding="SAME", dtype=dtype)
    filt, dy = to_gpu(kwargs["filter"]), to_gpu(kwargs["out_backprop"])
    first = to_host(cuda_call(kwargs, filter=filt, out_backprop=dy))
    if cuda_device is not None:
        cuda_device.seed += 1
    second = to_host(cuda_call(kwargs, filter=filt, out_backprop=dy))
    assert first.tobytes() == second.tobytes()


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

