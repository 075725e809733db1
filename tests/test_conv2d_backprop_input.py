"""conv2d_backprop_input / conv2d_backprop_input_v2, and the forward conv2d, against loop references.

Expected values come from ``reference.conv2d_backprop_input`` and ``reference.conv2d`` (NHWC /
HWIO, float64) fed the very values the op sees (inputs are drawn already rounded to the test
dtype).  The only gradops-vs-gradops checks are the adjoint identity and V2 == V1.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume

import gradops
import reference
from gradops.backends.cuda import _conv_igemm as ig
from gradops.bench.static_report import template_args
from conftest import assert_close, random_array, to_gpu, to_host
from conv_cases import (ALL_REPRESENTATIVE, ASYMMETRIC_PADS, CUDA_PATHS, DTYPES, GRID_ARGS, HALF_DTYPES, LAYOUTS,
                        MMA_TILE_SHAPES, NON_CONTIGUOUS, TF32_CASES, TF32_PLANTED_CASE, check_planted_tf32_bug,
                        check_tf32_rounding,
                        NO_PADS, REPRESENTATIVE, SIZE_TYPES, TF_CASES, attrs, check_drawn, conv_geometry,
                        cuda_conv_problems, cuda_launcher, drawn_problems, empty_cases, from_layout, geometry_grid,
                        non_contiguous, out_size, pads_id, seeded, shape_in, to_layout,
                        run_tiny_problems, tiny_choices, valid_truncation)

# --------------------------------------------------------------------------- helpers


def make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """NHWC input shape, random HWIO filter and NHWC out_backprop (rounded to ``dtype``)."""
    oh = out_size(h, r, strides[0], dilations[0], padding, pads[0])
    ow = out_size(w, s, strides[1], dilations[1], padding, pads[1])
    x_shape = (n, h, w, groups * cg)
    filt = random_array(rng, (r, s, cg, groups * og), dtype)
    dy = random_array(rng, (n, oh, ow, groups * og), dtype)
    return x_shape, filt, dy


def expected_grad(x_shape, filt, dy, strides, padding, dilations, pads):
    return reference.conv2d_backprop_input(x_shape, filt.astype(np.float64), dy.astype(np.float64),
                                           strides, padding, dilations, pads)


def check_against_reference(rng, dtype, layout, n, h, w, groups, cg, og, r, s, strides, padding,
                            dilations=(1, 1), pads=NO_PADS):
    """Run conv2d_backprop_input on one random problem and compare with the loop reference."""
    x_shape, filt, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    got = gradops.conv2d_backprop_input(shape_in(x_shape, layout), filt, to_layout(dy, layout),
                                        **attrs(layout, strides, padding, dilations, pads))
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype)
    assert got.shape == shape_in(x_shape, layout)
    assert_close(from_layout(got, layout), expected_grad(x_shape, filt, dy, strides, padding, dilations, pads),
                 dtype)
    return got


def check_forward(rng, dtype, layout, n, h, w, groups, cg, og, r, s, strides, padding, dilations=(1, 1),
                  pads=NO_PADS):
    """Run the forward conv2d on one random problem and compare with the loop reference."""
    x = random_array(rng, (n, h, w, groups * cg), dtype)
    filt = random_array(rng, (r, s, cg, groups * og), dtype)
    got = gradops.conv2d(to_layout(x, layout), filt, **attrs(layout, strides, padding, dilations, pads))
    assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
    want = reference.conv2d(x.astype(np.float64), filt.astype(np.float64), strides, padding, dilations, pads)
    assert got.shape == shape_in(want.shape, layout)
    assert_close(from_layout(got, layout), want, dtype)


# --------------------------------------------------------------------------- 1. grids

def _grid_sizes(i, groups):
    """(h, w, r, s, cg, og) of geometry-grid case ``i``."""
    cg, og = (1 + (i // 2) % 2, 1 + i % 2) if groups < 3 else (1 + i % 2, 1)
    return 4 + (i + 2) % 4, 4 + (3 * i) % 4, 1 + (i + 2) % 3, 1 + i % 3, cg, og


GEOMETRY_GRID = geometry_grid(
    [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((0, 2), (1, 0))), ("EXPLICIT", ((1, 4), (3, 0)))],
    [(1, 1), (2, 2), (2, 1)], ("NCHW", "NHWC"), _grid_sizes)


@pytest.mark.parametrize(GRID_ARGS, GEOMETRY_GRID)
def test_geometry_grid_float64(rng, layout, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """Every padding/stride/dilation/groups combination matches the loop reference (float64)."""
    check_against_reference(rng, np.float64, layout, 2, h, w, groups, cg, og, r, s, strides, padding,
                            dilations, pads)


@pytest.mark.parametrize(GRID_ARGS, GEOMETRY_GRID)
def test_forward_geometry_grid_float64(rng, layout, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """The forward conv2d matches the loop reference for every padding/stride/dilation/groups combination."""
    check_forward(rng, np.float64, layout, 2, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)


@DTYPES
@LAYOUTS
@ALL_REPRESENTATIVE
def test_dtypes_and_layouts(rng, dtype, layout, case):
    """All four dtypes in both layouts match the reference, and the result keeps the input dtype."""
    check_against_reference(rng, dtype, layout, n=2, **REPRESENTATIVE[case])


@DTYPES
@LAYOUTS
@ALL_REPRESENTATIVE
def test_forward_dtypes_and_layouts(rng, dtype, layout, case):
    """The forward conv2d matches the reference in all four dtypes and both layouts."""
    check_forward(rng, dtype, layout, n=2, **REPRESENTATIVE[case])


@pytest.mark.parametrize("pads", ASYMMETRIC_PADS, ids=pads_id)
@LAYOUTS
def test_explicit_padding_asymmetric_and_larger_than_filter(rng, pads, layout):
    """Asymmetric explicit pads, including pads wider than the filter (all-padding windows), are exact."""
    check_against_reference(rng, np.float64, layout, 2, 4, 5, 1, 2, 3, 2, 3, (2, 1), "EXPLICIT", (1, 1), pads)
    check_forward(rng, np.float64, layout, 2, 4, 5, 1, 2, 3, 2, 3, (2, 1), "EXPLICIT", (1, 2), pads)


@pytest.mark.parametrize("h,stride", [(5, 2), (6, 2), (7, 3), (8, 3), (9, 3)])
def test_rows_beyond_last_window_get_zero_gradient(rng, h, stride):
    """Input rows no window reaches (VALID with a stride that does not divide) get exactly zero gradient."""
    got = check_against_reference(rng, np.float64, "NHWC", 1, h, 4, 1, 2, 2, 2, 1, (stride, 1), "VALID")
    last = (out_size(h, 2, stride, 1, "VALID", (0, 0)) - 1) * stride + 1
    assert np.all(got[:, last + 1:] == 0)
    assert np.any(got[:, last] != 0)


# --------------------------------------------------------------------------- 2. adjoint identity (property)


@drawn_problems(40)
def test_property_adjoint_identity(p):
    """<conv2d(x, w), dy> == <x, conv2d_backprop_input(x.shape, w, dy)> (float64) for any valid attributes."""
    assume(valid_truncation(p))
    rng, p = seeded(p)
    x_shape, filt, dy = make_problem(rng, np.float64, p["n"], p["h"], p["w"], p["groups"], p["cg"], p["og"],
                                     p["r"], p["s"], p["strides"], p["padding"], p["dilations"], p["pads"])
    x = random_array(rng, x_shape, np.float64)
    a = attrs(p["layout"], p["strides"], p["padding"], p["dilations"], p["pads"])
    xl, dyl = to_layout(x, p["layout"]), to_layout(dy, p["layout"])
    y = gradops.conv2d(xl, filt, **a)
    assert y.shape == dyl.shape
    dx = gradops.conv2d_backprop_input(xl.shape, filt, dyl, **a)
    scale = float(np.sum(np.abs(y) * np.abs(dyl))) + 1.0
    assert abs(float(np.sum(xl * dx)) - float(np.sum(y * dyl))) <= 1e-12 * scale


# --------------------------------------------------------------------------- 3. property test vs reference


@drawn_problems(60)
def test_property_matches_reference(p):
    """Random layout/padding/pads/strides/dilations/groups/dtype combinations match the reference."""
    check_drawn(check_against_reference, p)


@drawn_problems(40)
def test_property_forward_matches_reference(p):
    """The forward conv2d matches the reference for random attribute combinations."""
    check_drawn(check_forward, p)


# --------------------------------------------------------------------------- 4. edge cases


@empty_cases("sizes")
def test_empty_gives_zeros(sizes, fshape, dy_shape, kw, dtype):
    """Empty tensors give zeros of input_sizes' shape in the input dtype (also from _v2 and forward conv2d)."""
    kw = {"strides": [1, 1, 1, 1], **kw}
    filt = np.ones(fshape, dtype)
    dy = np.ones(dy_shape, dtype)
    for got in (gradops.conv2d_backprop_input(np.array(sizes), filt, dy, **kw),
                gradops.conv2d_backprop_input_v2(np.ones(sizes, dtype), filt, dy, **kw)):
        assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
        assert got.shape == sizes
        assert not np.any(got.astype(np.float64))
    y = gradops.conv2d(np.ones(sizes, dtype), filt, **kw)
    assert y.shape == dy_shape and y.dtype == np.dtype(dtype)
    assert not np.any(y.astype(np.float64))


def test_valid_truncation_to_zero_rows_not_an_error():
    """VALID, input 2, effective filter 5 (3 taps, dilation 2), stride 2: 0 output rows, no error (TF's C++ division)."""
    filt = np.ones((3, 1, 1, 1), np.float32)
    kw = dict(strides=[1, 2, 1, 1], padding="VALID", dilations=[1, 2, 1, 1])
    assert gradops.conv2d(np.ones((1, 2, 3, 1), np.float32), filt, **kw).shape == (1, 0, 3, 1)
    got = gradops.conv2d_backprop_input([1, 2, 3, 1], filt, np.ones((1, 0, 3, 1), np.float32), **kw)
    np.testing.assert_array_equal(got, np.zeros((1, 2, 3, 1), np.float32))


def test_one_by_one_filter_is_a_matmul(rng):
    """A 1x1 filter's input gradient is dy @ w^T at every position."""
    filt = random_array(rng, (1, 1, 3, 2), np.float64)
    dy = random_array(rng, (2, 5, 4, 2), np.float64)
    got = gradops.conv2d_backprop_input([2, 5, 4, 3], filt, dy, [1, 1, 1, 1], "VALID")
    np.testing.assert_allclose(got, np.einsum("nhwo,co->nhwc", dy, filt[0, 0]), rtol=1e-12)


@LAYOUTS
def test_filter_larger_than_input_same(rng, layout):
    """SAME with a filter larger than the input (most taps hit padding) matches the reference."""
    check_against_reference(rng, np.float64, layout, 2, 2, 3, 1, 2, 2, 5, 4, (1, 1), "SAME")
    check_against_reference(rng, np.float32, layout, 1, 3, 2, 2, 1, 1, 3, 6, (2, 1), "SAME", (2, 1))
    check_forward(rng, np.float64, layout, 2, 2, 3, 1, 2, 2, 5, 4, (1, 1), "SAME")


@pytest.mark.parametrize("sizes", SIZE_TYPES)
@LAYOUTS
def test_input_sizes_types(rng, sizes, layout):
    """input_sizes as list, tuple, int32 or int64 array (4 entries, data_format order) give the reference result."""
    x_shape, filt, dy = make_problem(rng, np.float64, 2, 5, 5, 1, 2, 3, 3, 2, (2, 1), "SAME", (1, 1), NO_PADS)
    got = gradops.conv2d_backprop_input(sizes(shape_in(x_shape, layout)), filt, to_layout(dy, layout),
                                        **attrs(layout, (2, 1), "SAME"))
    assert got.shape == shape_in(x_shape, layout)
    assert_close(from_layout(got, layout), expected_grad(x_shape, filt, dy, (2, 1), "SAME", (1, 1), NO_PADS),
                 np.float64)


@pytest.mark.parametrize("sizes", SIZE_TYPES)
@LAYOUTS
def test_input_sizes_two_entries(rng, sizes, layout):
    """input_sizes [rows, cols]: batch comes from out_backprop, depth from filter.shape[2]; same as 4 entries."""
    x_shape, filt, dy = make_problem(rng, np.float64, 3, 6, 5, 1, 2, 2, 2, 3, (2, 2), "VALID", (1, 1), NO_PADS)
    a = attrs(layout, (2, 2), "VALID")
    dyl = to_layout(dy, layout)
    got = gradops.conv2d_backprop_input(sizes([6, 5]), filt, dyl, **a)
    assert got.shape == shape_in(x_shape, layout)
    assert_close(from_layout(got, layout), expected_grad(x_shape, filt, dy, (2, 2), "VALID", (1, 1), NO_PADS),
                 np.float64)
    np.testing.assert_array_equal(got, gradops.conv2d_backprop_input(shape_in(x_shape, layout), filt, dyl, **a))


@DTYPES
@LAYOUTS
def test_v2_equals_v1(rng, dtype, layout):
    """conv2d_backprop_input_v2 takes the input's shape (not values) and equals V1 bit for bit."""
    strides, padding, dilations, pads = (2, 1), "EXPLICIT", (1, 2), ((0, 1), (2, 2))
    x_shape, filt, dy = make_problem(rng, dtype, 2, 6, 5, 2, 2, 1, 2, 3, strides, padding, dilations, pads)
    a = attrs(layout, strides, padding, dilations, pads)
    dyl = to_layout(dy, layout)
    v1 = gradops.conv2d_backprop_input(shape_in(x_shape, layout), filt, dyl, **a)
    v2 = gradops.conv2d_backprop_input_v2(np.full(shape_in(x_shape, layout), np.nan, dtype), filt, dyl, **a)
    assert v2.dtype == np.dtype(dtype) and isinstance(v2, np.ndarray)
    np.testing.assert_array_equal(v2.astype(np.float64), v1.astype(np.float64))
    assert_close(from_layout(v2, layout), expected_grad(x_shape, filt, dy, strides, padding, dilations, pads), dtype)


def test_keyword_arguments_with_tf_names(rng):
    """All three ops accept every argument by TF's names, and the positional TF order gives the same result."""
    pads2 = ((1, 0), (2, 1))
    x_shape, filt, dy = make_problem(rng, np.float64, 2, 5, 6, 1, 2, 2, 2, 3, (2, 2), "EXPLICIT", (1, 1), pads2)
    dyc, sizes = to_layout(dy, "NCHW"), list(shape_in(x_shape, "NCHW"))
    pads = [0, 0, 0, 0, 1, 0, 2, 1]
    want = expected_grad(x_shape, filt, dy, (2, 2), "EXPLICIT", (1, 1), pads2)
    common = dict(strides=[1, 1, 2, 2], padding="EXPLICIT", use_cudnn_on_gpu=False, explicit_paddings=pads,
                  data_format="NCHW", dilations=[1, 1, 1, 1])
    v1 = gradops.conv2d_backprop_input(input_sizes=sizes, filter=filt, out_backprop=dyc, **common)
    v2 = gradops.conv2d_backprop_input_v2(input=np.zeros(sizes), filter=filt, out_backprop=dyc, **common)
    positional = gradops.conv2d_backprop_input(sizes, filt, dyc, [1, 1, 2, 2], "EXPLICIT", True, pads, "NCHW",
                                               [1, 1, 1, 1])
    for got in (v1, v2, positional):
        assert_close(from_layout(got, "NCHW"), want, np.float64)
    x = random_array(rng, x_shape, np.float64)
    y = gradops.conv2d(input=to_layout(x, "NCHW"), filter=filt, **common)
    assert_close(from_layout(y, "NCHW"), reference.conv2d(x, filt, (2, 2), "EXPLICIT", (1, 1), pads2), np.float64)


@pytest.mark.parametrize("kind", NON_CONTIGUOUS)
@LAYOUTS
def test_non_contiguous_inputs(rng, kind, layout):
    """Non-contiguous filter/out_backprop/input views give the contiguous copies' result and the reference's."""
    strides, padding = (1, 2), "SAME"
    x_shape, fshape = (2, 5, 6, 3), (2, 3, 3, 2)
    dy_shape = (2, 5, 3, 2)
    filt = non_contiguous(rng, kind, fshape, np.float32)
    dy = non_contiguous(rng, kind, shape_in(dy_shape, layout), np.float32)
    x = non_contiguous(rng, kind, shape_in(x_shape, layout), np.float32)
    assert not (filt.flags.c_contiguous or dy.flags.c_contiguous or x.flags.c_contiguous)
    a = attrs(layout, strides, padding)
    sizes = shape_in(x_shape, layout)
    got = gradops.conv2d_backprop_input(sizes, filt, dy, **a)
    copy = gradops.conv2d_backprop_input(sizes, np.ascontiguousarray(filt), np.ascontiguousarray(dy), **a)
    np.testing.assert_array_equal(got, copy)
    assert_close(from_layout(got, layout),
                 expected_grad(x_shape, filt, from_layout(dy, layout), strides, padding, (1, 1), NO_PADS), np.float32)
    y = gradops.conv2d(x, filt, **a)
    np.testing.assert_array_equal(y, gradops.conv2d(np.ascontiguousarray(x), np.ascontiguousarray(filt), **a))
    assert_close(from_layout(y, layout), reference.conv2d(from_layout(x, layout).astype(np.float64),
                                                          filt.astype(np.float64), strides, padding), np.float32)


# --------------------------------------------------------------------------- TensorFlow cross-check


@pytest.mark.tf
@TF_CASES
def test_reference_agrees_with_tensorflow(tf, rng, padding, pads, strides):
    """The loop reference (and gradops) agree with tf.raw_ops.Conv2DBackpropInput where TF's CPU kernel runs."""
    x_shape, filt, dy = make_problem(rng, np.float64, 2, 6, 7, 1, 3, 2, 3, 2, strides, padding, (1, 1), pads)
    a = attrs("NHWC", strides, padding, (1, 1), pads)
    want = tf.raw_ops.Conv2DBackpropInput(input_sizes=list(x_shape), filter=filt, out_backprop=dy, **a).numpy()
    np.testing.assert_allclose(expected_grad(x_shape, filt, dy, strides, padding, (1, 1), pads), want,
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gradops.conv2d_backprop_input(x_shape, filt, dy, **a), want, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- CUDA backend (GPU)
# Our kernels (backend="cuda") against the NumPy backend on the same problems; ``path`` runs the
# automatic choice, the direct fallback and the implicit-GEMM kernel (stride-phase GEMMs) on
# every case.  The forward conv2d kernels are checked alongside.


def run_cuda(rng, dtype, layout, n, h, w, groups, cg, og, r, s, strides, padding, dilations=(1, 1), pads=NO_PADS,
             path=None, vector=None):
    """(CUDA input gradient on the host, NumPy backend's, CUDA forward output, NumPy's) of one problem."""
    x_shape, filt, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    x = random_array(rng, x_shape, dtype)
    xl, dyl = to_layout(x, layout), to_layout(dy, layout)
    a = attrs(layout, strides, padding, dilations, pads)
    g = conv_geometry("conv2d_backprop_input", xl.shape, filt.shape, dyl.shape, layout, strides, padding, dilations,
                      pads)
    kw = {} if path is None else {"path": path}
    if vector is not None:
        kw["vector"] = vector
    dx = to_host(cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), **kw))
    y = to_host(cuda_launcher("conv2d").conv2d(g, to_gpu(xl), to_gpu(filt), **kw))
    assert dx.dtype == np.dtype(dtype) and dx.shape == xl.shape
    assert y.dtype == np.dtype(dtype) and y.shape == dyl.shape
    return (dx, gradops.conv2d_backprop_input(xl.shape, filt, dyl, **a, backend="numpy"),
            y, gradops.conv2d(xl, filt, **a, backend="numpy"))


@pytest.mark.parametrize("path", ["tiled", "direct"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_cuda_racecheck(racecheck_device, rng, path, dtype, layout):
    """No shared-memory hazard in the input-gradient and forward kernels (racecheck builds on
    the host, which fail a launch at the first one): a grouped, strided, padded problem larger
    than one tile in each GEMM dimension (several k-tiles through the staging pipeline)."""
    check_cuda(rng, dtype, layout, 2, 9, 8, 2, 24, 40, 3, 2, (2, 1), "SAME", path=path)


@tiny_choices("conv2d_backprop_input")
@LAYOUTS
def test_cuda_tiny_problems_memcheck(racecheck_device, rng, choice, forced, dtype, layout):
    """Each kernel of the input gradient and the forward on tiny problems, in racecheck builds:
    no access outside filter, out_backprop, input or the result (the guard bytes around each
    array), no shared-memory hazard, results as NumPy's.  A forced kernel that cannot run a
    problem (a ValueError saying so) skips it; each runs at least one."""
    forward = {k: v for k, v in forced.items() if k in ("path", "vector")}

    def run(problem):
        n, h, w, groups, cg, og, r, s, strides, padding = problem
        x_shape, filt, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, (1, 1), NO_PADS)
        x = to_layout(random_array(rng, x_shape, dtype), layout)
        dyl = to_layout(dy, layout)
        g = conv_geometry("conv2d_backprop_input", x.shape, filt.shape, dyl.shape, layout, strides, padding, (1, 1),
                          NO_PADS)
        a = attrs(layout, strides, padding)
        dx = cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), **forced)
        assert_close(to_host(dx), gradops.conv2d_backprop_input(x.shape, filt, dyl, **a, backend="numpy"), dtype)
        y = cuda_launcher("conv2d").conv2d(g, to_gpu(x), to_gpu(filt), **forward)
        assert_close(to_host(y), gradops.conv2d(x, filt, **a, backend="numpy"), dtype)

    run_tiny_problems(choice, forced, run)


def vector_arg(expression: str) -> str:
    """The VECTOR template argument of a tiled kernel's name (T, Acc, Kind, VECTOR[, SPLIT])."""
    return template_args(expression)[3]


def check_cuda(rng, dtype, *args, **kwargs):
    dx, dx_want, y, y_want = run_cuda(rng, dtype, *args, **kwargs)
    assert_close(dx, dx_want, dtype)
    assert_close(y, y_want, dtype)


@CUDA_PATHS
@pytest.mark.parametrize(GRID_ARGS, GEOMETRY_GRID)
def test_cuda_geometry_grid_float64(cuda_device, rng, path, layout, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """Every padding/stride/dilation/groups combination: CUDA kernels == NumPy backend (float64)."""
    check_cuda(rng, np.float64, layout, 2, h, w, groups, cg, og, r, s, strides, padding, dilations, pads, path=path)


@CUDA_PATHS
@DTYPES
@LAYOUTS
@ALL_REPRESENTATIVE
def test_cuda_dtypes_and_layouts(cuda_device, rng, path, dtype, layout, case):
    """All four dtypes in both layouts on every path match the NumPy backend."""
    check_cuda(rng, dtype, layout, n=2, path=path, **REPRESENTATIVE[case])


@pytest.mark.parametrize("path", ["tiled", "direct"])
@DTYPES
@LAYOUTS
@pytest.mark.parametrize("strides,dilations", [((1, 1), (1, 1)), ((2, 2), (1, 1)), ((3, 2), (2, 3))],
                         ids=["s1", "s2", "s32-d23"])
def test_cuda_several_tiles(cuda_device, rng, path, dtype, layout, strides, dilations):
    """Problems larger than one CTA tile in every GEMM dimension (partial edge tiles, many
    reduction steps, grouped), including stride phases that no filter tap reaches."""
    check_cuda(rng, dtype, layout, 2, 14, 13, 2, 136, 72, 3, 3, strides, "SAME", dilations, path=path)


@DTYPES
@LAYOUTS
@pytest.mark.parametrize("groups,cg,og,h,w", [(1, 64, 64, 5, 7), (1, 136, 200, 9, 16), (2, 16, 40, 3, 3), (1, 8, 8, 1, 1)],
                         ids=["64x64", "partial-tiles", "grouped", "one-position"])
@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_cuda_1x1_kernel(cuda_device, rng, dtype, layout, groups, cg, og, h, w, padding):
    """A 1x1 filter at stride 1 without padding takes the plain-GEMM kernel automatically (where
    16-byte loads hold), and it matches the NumPy backend and the general tiled kernel:
    partial tiles in M, N and the reduction, several reduction tiles, groups."""
    x_shape, filt, dy = make_problem(rng, dtype, 2, h, w, groups, cg, og, 1, 1, (1, 1), padding, (1, 1), NO_PADS)
    dyl = to_layout(dy, layout)
    g = conv_geometry("conv2d_backprop_input", to_layout(np.empty(x_shape, dtype), layout).shape, filt.shape,
                      dyl.shape, layout, (1, 1), padding, (1, 1), NO_PADS)
    launcher = cuda_launcher("conv2d_backprop_input")
    assert ig.pointwise_eligible(g)
    want = gradops.conv2d_backprop_input(g.input_shape, filt, dyl, **attrs(layout, (1, 1), padding, (1, 1), NO_PADS),
                                         backend="numpy")
    got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), path="tiled"))
    general = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), path="tiled", pointwise=False))
    assert_close(got, want, dtype)
    assert_close(general, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches
        names = [e for e, _, _ in cuda_device.launches if "conv2d_backprop_input" in e]
        assert "_1x1_igemm<" in names[0] and "_1x1_igemm<" not in names[1], names


@DTYPES
@pytest.mark.parametrize("splits", [2, 3])
@pytest.mark.parametrize("r,strides,dilations,pointwise", [(3, (1, 1), (1, 1), None), (3, (2, 2), (1, 1), None),
                                                           (3, (3, 2), (2, 3), None), (1, (1, 1), (1, 1), True),
                                                           (1, (1, 1), (1, 1), False)],
                         ids=["3x3-s1", "3x3-s2", "s32-d23", "1x1-kernel", "1x1-general"])
def test_cuda_split_reduction(cuda_device, rng, dtype, splits, r, strides, dilations, pointwise):
    """A reduction split across CTAs (a float/double scratch summed in split order) gives the
    NumPy backend's result: several reduction tiles per split, phases whose taps leave the last
    splits empty, the 1x1 kernel and the general one; both layouts through NHWC."""
    layout = "NCHW" if splits == 3 else "NHWC"
    x_shape, filt, dy = make_problem(rng, dtype, 2, 9, 10, 1, 16, 136, r, r, strides, "SAME", dilations, NO_PADS)
    dyl = to_layout(dy, layout)
    g = conv_geometry("conv2d_backprop_input", to_layout(np.empty(x_shape, dtype), layout).shape, filt.shape,
                      dyl.shape, layout, strides, "SAME", dilations, NO_PADS)
    launcher = cuda_launcher("conv2d_backprop_input")
    assert launcher.split_count(g, np.dtype(dtype), ig.math_kind(dtype), splits)[0] == splits
    want = gradops.conv2d_backprop_input(g.input_shape, filt, dyl, **attrs(layout, strides, "SAME", dilations, NO_PADS),
                                         backend="numpy")
    options = {} if pointwise is None else {"pointwise": pointwise}
    got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), path="tiled", splits=splits, **options))
    assert_close(got, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches: the GEMM, then the sum
        names = [e for e, _, _ in cuda_device.launches]
        assert "split_reduce<" in names[-1] and any("igemm" in n and template_args(n)[4] == "true" for n in names), names


@HALF_DTYPES
@MMA_TILE_SHAPES
@pytest.mark.parametrize("r,strides,splits", [(3, (1, 1), None), (3, (2, 2), 2), (1, (1, 1), None), (1, (1, 1), 2)],
                         ids=["3x3-s1", "3x3-s2-split", "1x1-kernel", "1x1-kernel-split"])
def test_cuda_tile_shapes(cuda_device, rng, dtype, tile, r, strides, splits):
    """Each mma.sync tile shape, forced, matches the NumPy backend: 72 input channels (N: a
    full and a partial 64-wide column, one partial 128-wide one), 2 x 9 x 10 positions (M:
    partial tiles of 64 and 128 rows), several k-tiles, stride phases, a split reduction, the
    general and the 1x1 kernel; the launch runs that shape's instantiation with its threads."""
    x_shape, filt, dy = make_problem(rng, dtype, 2, 9, 10, 1, 72, 48, r, r, strides, "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", strides, "SAME", (1, 1), NO_PADS)
    launcher = cuda_launcher("conv2d_backprop_input")
    got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy), path="tiled", splits=splits, tile=tile))
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, **attrs("NHWC", strides, "SAME", (1, 1), NO_PADS),
                                         backend="numpy")
    assert_close(got, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches
        (name, grid, block), = [launch for launch in cuda_device.launches if "_igemm<" in launch[0]]
        assert ("_1x1_igemm<" in name) == (r == 1)
        assert template_args(name)[5:] == ([] if tile == (128, 128) else [str(tile[0]), str(tile[1])])
        m, n, _ = launcher._gemm_sizes(g)  # the largest phase's M (all 180 positions at stride 1), N = 72
        assert block == (ig.mma_tile_threads(tile),) and grid[:2] == (ig.ceil_div(m, tile[0]), ig.ceil_div(n, tile[1]))


#: Warp grids planted in mma_cta, and the tiles each one breaks: the default tile's 4 warp
#: columns hard-coded (128 x 64's 2 x 2 warps compute the wrong patches; 1-row grids and the
#: default's own stay right), and warps numbered down 2 rows first (a permutation of the 2-row
#: grids' patches, so 128 x 128 and 128 x 64 stay right; the 1-row grids of 64 x 128 and 64 x 64
#: put warp 1 below the tile: wrong results, or the host model's memory fault where its epilogue
#: reads past the tile's row table).
PLANTED_WARP_GRIDS = {
    "four-warp-columns": ("const int wm = (warp / 4) * WM, wn = (warp % 4) * WN;", {(128, 64)}),
    "two-warp-rows-first": ("const int wm = (warp % 2) * WM, wn = (warp / 2) * WN;", {(64, 128), (64, 64)}),
}


@pytest.mark.parametrize("grid", PLANTED_WARP_GRIDS)
@MMA_TILE_SHAPES
def test_planted_warp_grid_bug_fails_the_narrow_tiles(monkeypatch, tmp_path, tile, grid):
    """A wrong warp grid in mma_cta gives wrong results in exactly the tiles whose patches it
    misplaces (PLANTED_WARP_GRIDS): each narrow tile's warp grid is told apart from the others'."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    planted, breaks = PLANTED_WARP_GRIDS[grid]
    cuda_host.planted_sources(tmp_path, "igemm_tiles.cuh", (
        "const int wm = (warp / C::WARPS_N) * WM, wn = (warp % C::WARPS_N) * WN;\n"
        "    // ldmatrix.x4: lane l",
        planted + "\n    // ldmatrix.x4: lane l"))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path).install(monkeypatch)
    rng = np.random.default_rng(5)
    x_shape, filt, dy = make_problem(rng, np.float16, 2, 9, 10, 1, 72, 48, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, **attrs("NHWC", (1, 1), "SAME", (1, 1), NO_PADS),
                                         backend="numpy")

    def run():
        launcher = cuda_launcher("conv2d_backprop_input")
        got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy), path="tiled", tile=tile))
        assert_close(got, want, np.float16)

    if tuple(tile) not in breaks:
        run()
    else:
        with pytest.raises((AssertionError, cuda_host.HostLaunchError)):
            run()


def test_tile_choice():
    """The tile heuristic: a mma.sync tile of fewer warps where it cuts the padded GEMM area to
    at most 3/4 of the larger tile's (64-channel layers) in a grid of several default tiles, the
    default elsewhere and wherever only the default exists."""
    def pick(m, n, dtype=np.float16, kind=ig.WMMA_HALF, vector=True, arch=90, **kw):
        return ig.pick_tile(dtype, kind, vector, m, n, arch=arch, **kw)[:2]

    assert pick(3136, 64) == (128, 64)  # dgrad of a 64-channel input: a 128-wide tile is half padding
    assert pick(576, 64) == (128, 64)  # wgrad 3x3 64 -> 64: M = 9 x 64 (64 x 64 would save 1/10)
    assert pick(64, 256) == (64, 128)  # wgrad 1x1 64 -> 256 (64 x 64: as much padding, fewer warps)
    assert pick(320, 64) == (128, 64)  # both 4-warp shapes pad alike: the first
    assert pick(192, 64) == (64, 64)  # 3/4 of 128 x 64's area: 2 warps
    assert pick(192, 192) == (64, 64)  # 3/4 of 128 x 64's, which is 3/4 of the default's
    assert pick(64, 64) == (128, 128)  # a single tile either way (the split reduction fills the GPU)
    assert ig.pick_tile(np.float16, ig.WMMA_HALF, True, 192, 64, arch=90).threads == 64
    assert pick(576, 192) == (128, 64)  # 3/4 of the default's area
    assert pick(576, 320) == (128, 128)  # 5/6: not worth the narrower tile's extra copies
    # 64 x 64 has 3/4 of the default's area there, with a quarter of its warps: it needs (3/4)^2
    assert pick(320, 320) == (128, 128)  # 64 x 64: 0.69 of the default's area
    assert pick(3136, 256) == (128, 128)
    assert ig.pick_tile(np.float16, ig.WMMA_HALF, True, 3136, 64, arch=90).threads == 128
    # Only the mma.sync path has other shapes: not scalar loads, CUDA cores, TF32 or sm_75's WMMA.
    assert pick(3136, 64, vector=False) == (128, 128)
    assert pick(3136, 64, arch=75) == (128, 128)
    assert pick(3136, 64, dtype=np.float32, kind=ig.SIMT) == (128, 128)
    assert pick(3136, 64, dtype=np.float32, kind=ig.WMMA_TF32) == (128, 128)
    assert pick(3136, 64, dtype=np.float64, kind=ig.SIMT) == (64, 64)
    with pytest.raises(ValueError, match="tile"):
        pick(3136, 64, vector=False, tile=(128, 64))
    assert pick(3136, 256, tile=(64, 128)) == (64, 128)


@pytest.mark.parametrize("text,replacement", [
    ("prob.k_end = min(w[REDUCTION], prob.k_begin + static_cast<int>(split_size));",
     "prob.k_end = min(w[REDUCTION], prob.k_begin + 2 * static_cast<int>(split_size));"),
    ("prob.k_begin + static_cast<int>(split_size));\n    prob.filter = filter;\n    prob.out_backprop = out_backprop;\n"
     "    prob.dst = {input_grad, SPLIT ? partial + split",
     "prob.k_begin + static_cast<int>(split_size));\n    prob.filter = filter;\n    prob.out_backprop = out_backprop;\n"
     "    prob.dst = {input_grad, SPLIT ? partial + 0 * split"),
], ids=["splits-overlap", "splits-share-one-slice"])
def test_planted_split_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement):
    """Bugs planted in the general kernel's split ranges and scratch slices give wrong results."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cuda_host.planted_sources(tmp_path, "conv2d_backprop_input.cu", (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path).install(monkeypatch)
    rng = np.random.default_rng(5)
    x_shape, filt, dy = make_problem(rng, np.float32, 2, 9, 10, 1, 16, 136, 3, 3, (2, 2), "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", (2, 2), "SAME", (1, 1), NO_PADS)
    got = to_host(cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy),
                                                                                path="tiled", splits=3))
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, **attrs("NHWC", (2, 2), "SAME", (1, 1), NO_PADS),
                                         backend="numpy")
    with pytest.raises(AssertionError):
        assert_close(got, want, np.float32)


PLAN_BUG_TEXTS = [
    ("prob.p_offset = w[P_OFFSET];", "prob.p_offset = w[Q_OFFSET];"),
    ("prob.taps_s = PhaseTaps(w[TAPS_S_FIRST], w[TAPS_S_STEP]", "prob.taps_s = PhaseTaps(w[TAPS_R_FIRST], w[TAPS_S_STEP]"),
    ("const int group = fast_div(header + PHASES).divmod(group_phase, phase);",
     "const int group = fast_div(header + SPLITS).divmod(group_phase, phase);"),
    ("return out_row_by(m, phase_plan::fast_div(w + phase_plan::DIV_I), phase_plan::fast_div(w + phase_plan::DIV_J));",
     "return out_row_by(m, phase_plan::fast_div(w + phase_plan::DIV_J), phase_plan::fast_div(w + phase_plan::DIV_I));"),
    ("prob.entry = plan + HEADER_WORDS + ENTRY_WORDS * phase;",  # (a permutation of phases would be harmless)
     "prob.entry = plan + HEADER_WORDS + ENTRY_WORDS * (phase / 2 * 2);"),
]


def _plan_problem(dtype):
    """The planted plan bugs' problem (rows and columns differ in size, padding, stride and
    dilation; two splits), run on the installed device: (the tiled kernel's result, NumPy's)."""
    rng = np.random.default_rng(5)
    strides, dilations, pads = (2, 3), (1, 2), ((2, 1), (0, 2))
    x_shape, filt, dy = make_problem(rng, dtype, 2, 9, 14, 1, 16, 24, 3, 4, strides, "EXPLICIT", dilations, pads)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", strides, "EXPLICIT", dilations,
                      pads)
    got = to_host(cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy),
                                                                                path="tiled", splits=2))
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, **attrs("NHWC", strides, "EXPLICIT", dilations, pads),
                                         backend="numpy")
    return got, want


@pytest.mark.parametrize("text,replacement", PLAN_BUG_TEXTS,
                         ids=["row-offset-from-columns", "column-taps-from-rows", "phase-decoded-by-splits",
                              "epilogue-divisors-swapped", "two-phases-share-an-entry"])
def test_planted_plan_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement):
    """Bugs planted where the general kernel reads the launcher's phase plan give wrong results
    (or writes the host model's guards catch) in float16, whose tensor-core epilogue rereads
    the plan."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    source = (cuda_host._build.source_dir() / "conv2d_backprop_input.cu").read_text()
    assert source.count(text) == 1
    cuda_host.planted_sources(tmp_path, "conv2d_backprop_input.cu", (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path).install(monkeypatch)
    with pytest.raises(AssertionError):
        got, want = _plan_problem(np.float16)
        assert_close(got, want, np.float16)


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_planted_plan_problem_passes_unplanted(monkeypatch, dtype):
    """test_planted_plan_bugs_fail_the_comparison's problem, on the real kernel: correct."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cuda_host.HostDevice(order="shuffled", seed=5).install(monkeypatch)
    got, want = _plan_problem(dtype)
    assert_close(got, want, dtype)


def test_planted_launcher_phase_taps_bug_fails_the_comparison(monkeypatch):
    """The tiled kernel takes its taps from the launcher's plan: a phase_taps that rounds the
    tap count down (the kernels' former in-thread bug, planted on the host) gives wrong results."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    launcher = cuda_launcher("conv2d_backprop_input")
    real = launcher.phase_taps

    def rounds_down(phase, pad, stride, dilation, filter_size):
        first, step, _ = real(phase, pad, stride, dilation, filter_size)
        return first, step, max(0, (filter_size - first) // step)

    monkeypatch.setattr(launcher, "phase_taps", rounds_down)
    cuda_host.HostDevice(order="shuffled", seed=5).install(monkeypatch)
    with pytest.raises(AssertionError):
        got, want = _plan_problem(np.float32)
        assert_close(got, want, np.float32)


def test_phase_plan_words_are_the_kernels():
    """The launcher writes each plan word where the kernel's phase_plan enums read it."""
    import re

    import cuda_host

    launcher = cuda_launcher("conv2d_backprop_input")
    source = (cuda_host._build.source_dir() / launcher.SOURCE).read_text()
    block = source[source.index("namespace phase_plan {"):source.index("}  // namespace phase_plan")]
    enums = {name: int(value) for name, value in re.findall(r"\b([A-Z_]+) = (\d+)", block)}
    assert enums == {**launcher.PLAN_HEADER, **launcher.PLAN_ENTRY}


def _fast_div_words_divide(words, numerators):
    magic, shift, divisor = int(np.int32(words[0]).view(np.uint32)), int(words[1]), int(words[2])
    return all((n * magic) >> shift == n // divisor for n in numerators)


@pytest.mark.parametrize("stride_rows,stride_cols", [(1, 1), (2, 2), (3, 2), (1, 4), (4, 3)])
def test_phase_plans_against_brute_force(stride_rows, stride_cols):
    """Every word of the plan from its definition: per phase, the taps that reach its positions
    (searched over the filter), its positions, and the out_backprop row each (position, tap)
    reads; the FastDivs divide exactly."""
    launcher = cuda_launcher("conv2d_backprop_input")
    rng = np.random.default_rng(stride_rows * 10 + stride_cols)
    numerators = [0, 1, 2, 3, 7, 1000, 2**20 + 3, 2**31 - 1, *rng.integers(0, 2**31, 64).tolist()]
    for _ in range(40):
        r, s = (int(v) for v in rng.integers(1, 6, 2))
        dilations = tuple(int(v) for v in rng.integers(1, 5, 2))
        pads = tuple((int(a), int(b)) for a, b in rng.integers(0, 4, (2, 2)))
        h = int(rng.integers((r - 1) * dilations[0] + 1, 20))
        w = int(rng.integers((s - 1) * dilations[1] + 1, 20))
        cg, og, n, splits = 2, int(rng.integers(1, 40)), int(rng.integers(1, 4)), int(rng.integers(1, 6))
        strides = (stride_rows, stride_cols)
        x_shape, filt, dy = make_problem(rng, np.float32, n, h, w, 1, cg, og, r, s, strides, "EXPLICIT", dilations,
                                         pads)
        g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", strides, "EXPLICIT",
                          dilations, pads)
        plan = launcher.phase_plans(g, splits)
        head, entry = launcher.PLAN_HEADER, launcher.PLAN_ENTRY
        assert plan.dtype == np.int32 and len(plan) == head["HEADER_WORDS"] + strides[0] * strides[1] * entry[
            "ENTRY_WORDS"]
        for name, divisor in (("SPLITS", splits), ("PHASES", strides[0] * strides[1]), ("OUT_PER_GROUP", og)):
            words = plan[head[name]:head[name] + 3]
            assert words[2] == divisor and _fast_div_words_divide(words, numerators)
        for phase_row in range(strides[0]):
            for phase_col in range(strides[1]):
                at = head["HEADER_WORDS"] + (phase_row * strides[1] + phase_col) * entry["ENTRY_WORDS"]
                e = {k: int(plan[at + v]) for k, v in entry.items() if k != "ENTRY_WORDS"}
                taps_r = [t for t in range(r) if (phase_row + pads[0][0] - t * dilations[0]) % strides[0] == 0]
                taps_s = [t for t in range(s) if (phase_col + pads[1][0] - t * dilations[1]) % strides[1] == 0]
                rows, cols = range(phase_row, h, strides[0]), range(phase_col, w, strides[1])
                assert (e["PHASE_ROW"], e["PHASE_COL"]) == (phase_row, phase_col)
                assert e["M_SIZE"] == n * len(rows) * len(cols)
                assert e["REDUCTION"] == len(taps_r) * len(taps_s) * og
                for taps, first, step in ((taps_r, e["TAPS_R_FIRST"], e["TAPS_R_STEP"]),
                                          (taps_s, e["TAPS_S_FIRST"], e["TAPS_S_STEP"])):
                    assert taps == list(range(first, len(taps) and max(taps) + 1, step))
                for name, size in (("DIV_I", len(rows)), ("DIV_J", len(cols)), ("DIV_TAPS_S", len(taps_s))):
                    words = [plan[at + entry[name] + k] for k in range(3)]
                    assert words[2] == max(size, 1) and _fast_div_words_divide(words, numerators)
                # The out_backprop row (column) position i (j) reads at tap index ri (si).
                for i, hh in enumerate(rows):
                    for ri, t in enumerate(taps_r):
                        assert i + e["P_OFFSET"] - ri * e["P_STEP"] == (hh + pads[0][0] - t * dilations[0]) // strides[0]
                for j, ww in enumerate(cols):
                    for si, t in enumerate(taps_s):
                        assert j + e["Q_OFFSET"] - si * e["Q_STEP"] == (ww + pads[1][0] - t * dilations[1]) // strides[1]


def test_split_count_fills_small_grids_only():
    """The automatic split count: ResNet-50's 7x7 layers at batch 32 (52 CTAs of 128 x 128) split,
    large grids and short reductions do not."""
    launcher = cuda_launcher("conv2d_backprop_input")

    def geometry(batch, size, cin, cout, r):
        return conv_geometry("conv2d_backprop_input", (batch, size, size, cin), (r, r, cin, cout),
                             (batch, size, size, cout), "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)

    kind = ig.WMMA_HALF  # the sm_80+ tile
    assert launcher.split_count(geometry(32, 7, 512, 512, 3), np.float16, kind)[0] == 4  # 52 CTAs, 144 k-tiles
    assert launcher.split_count(geometry(256, 7, 512, 512, 3), np.float16, kind)[0] == 1  # 392 CTAs
    assert launcher.split_count(geometry(32, 7, 512, 128, 1), np.float16, kind)[0] == 1  # 4 k-tiles


FEW_CHANNEL_CASES = {  # cin, r, s, strides, padding, dilations, pads
    "stem-7x7-s2-same": (3, 7, 7, (2, 2), "SAME", (1, 1), NO_PADS),
    "3x3-s1-valid-1ch": (1, 3, 3, (1, 1), "VALID", (1, 1), NO_PADS),
    "5x3-s31-d22-same-4ch": (4, 5, 3, (3, 1), "SAME", (2, 2), NO_PADS),  # a phase's taps 2 rows (columns) apart
    "explicit-asymmetric-2ch": (2, 3, 3, (2, 1), "EXPLICIT", (1, 1), ((2, 0), (1, 3))),
}


@DTYPES
@LAYOUTS
@pytest.mark.parametrize("case", sorted(FEW_CHANNEL_CASES))
def test_cuda_few_channel_kernel(cuda_device, rng, dtype, layout, case):
    """At most 4 input channels in one group (the stem) take the few-channel kernel on the
    direct path automatically: it matches the NumPy backend and the general direct kernel with
    strides, dilations, SAME/VALID/EXPLICIT padding, positions no tap reaches, in both layouts."""
    cin, r, s, strides, padding, dilations, pads = FEW_CHANNEL_CASES[case]
    x_shape, filt, dy = make_problem(rng, dtype, 2, 11, 13, 1, cin, 16, r, s, strides, padding, dilations, pads)
    dyl = to_layout(dy, layout)
    g = conv_geometry("conv2d_backprop_input", to_layout(np.empty(x_shape, dtype), layout).shape, filt.shape,
                      dyl.shape, layout, strides, padding, dilations, pads)
    launcher = cuda_launcher("conv2d_backprop_input")
    assert launcher.few_channels_eligible(g, dtype)
    want = gradops.conv2d_backprop_input(g.input_shape, filt, dyl, **attrs(layout, strides, padding, dilations, pads),
                                         backend="numpy")
    got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl)))
    general = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dyl), path="direct", few_channels=False))
    assert_close(got, want, dtype)
    assert_close(general, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches
        names = [e for e, _, _ in cuda_device.launches if "conv2d_backprop_input" in e]
        assert "_few_channels<" in names[0] and "_few_channels<" not in names[1], names


@pytest.mark.parametrize("text,replacement", [
    ("const int q = q0 - si * q_step;", "const int q = q0 - si;"),
    ("const int p = p0 - ri * p_step;", "const int p = p0 - ri;"),
    ("staged[e * C + i] = to_acc<Acc>(v.e[i]);", "staged[e * C + i] = to_acc<Acc>(v.e[0]);"),
    ("const int row_chunks = taps_cols * tap_elements / C;", "const int row_chunks = tap_elements / C;"),
    ("(filter_size - r + step - 1) / step", "(filter_size - r) / step"),
], ids=["column-tap-step", "row-tap-step", "staging-repeats-a-chunk's-first-element", "staging-takes-one-column",
        "phase-taps-count-rounds-down"])
def test_planted_few_channel_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement):
    """Each bug planted in the few-channel kernel makes test_cuda_few_channel_kernel's dilated
    case give a wrong result on the host model."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cuda_host.planted_sources(tmp_path, "conv2d_backprop_input.cu", (text, replacement))
    cuda_host.HostDevice(order="shuffled", seed=5, source_dir=tmp_path).install(monkeypatch)
    cin, r, s, strides, padding, dilations, pads = FEW_CHANNEL_CASES["5x3-s31-d22-same-4ch"]
    rng = np.random.default_rng(5)
    x_shape, filt, dy = make_problem(rng, np.float32, 2, 11, 13, 1, cin, 16, r, s, strides, padding, dilations, pads)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", strides, padding, dilations, pads)
    got = to_host(cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy),
                                                                                few_channels=True, path="direct"))
    want = gradops.conv2d_backprop_input(x_shape, filt, dy, **attrs("NHWC", strides, padding, dilations, pads),
                                         backend="numpy")
    with pytest.raises(AssertionError):
        assert_close(got, want, np.float32)


def test_few_channel_kernel_eligibility():
    """One group, at most 4 input channels, out channels in whole 16-byte chunks."""
    launcher = cuda_launcher("conv2d_backprop_input")

    def geometry(cin, cout, groups=1):
        return conv_geometry("conv2d_backprop_input", (1, 8, 8, cin), (3, 3, cin // groups, cout), (1, 4, 4, cout),
                             "NHWC", (2, 2), "SAME", (1, 1), NO_PADS)

    assert launcher.few_channels_eligible(geometry(3, 64), np.float16)
    assert launcher.few_channels_eligible(geometry(4, 8), np.float16)
    assert not launcher.few_channels_eligible(geometry(5, 64), np.float16)
    assert not launcher.few_channels_eligible(geometry(4, 64, groups=2), np.float16)
    assert not launcher.few_channels_eligible(geometry(3, 12), np.float16)  # 12 halves: not whole chunks
    assert launcher.few_channels_eligible(geometry(3, 12), np.float32)


def test_1x1_kernel_eligibility():
    """Only a 1x1 filter at stride 1 without padding reads out_backprop's row m for input row m."""
    launcher = cuda_launcher("conv2d_backprop_input")

    def geometry(r, strides, padding, pads=NO_PADS, h=6):
        return conv_geometry("conv2d_backprop_input", (1, h, h, 8), (r, r, 8, 8), (1, 6, 6, 8) if strides == (1, 1)
                             else (1, 3, 3, 8), "NHWC", strides, padding, (1, 1), pads)

    assert ig.pointwise_eligible(geometry(1, (1, 1), "VALID"))
    assert ig.pointwise_eligible(geometry(1, (1, 1), "SAME"))
    assert not ig.pointwise_eligible(geometry(1, (2, 2), "VALID"))
    assert not ig.pointwise_eligible(geometry(3, (1, 1), "SAME"))
    assert not ig.pointwise_eligible(geometry(1, (1, 1), "EXPLICIT", ((1, 0), (0, 1)), h=5))


@drawn_problems(150, cuda_conv_problems())
def test_cuda_property_tiled_matches_numpy(cuda_device, p):
    """Random layouts, paddings, strides, dilations, groups, dtypes and channel counts (with and
    without 16-byte loads): the tiled input-gradient and forward kernels match the NumPy backend."""
    assume(valid_truncation(p))
    rng, p = seeded(p)
    check_cuda(rng, p.pop("dtype"), p.pop("layout"), path="tiled", **p)


@DTYPES
@LAYOUTS
@pytest.mark.parametrize("vector", [True, False], ids=["vector", "scalar"])
def test_cuda_vector_loads(cuda_device, rng, dtype, layout, vector):
    """Channel counts that are multiples of 16 bytes' worth of elements let the tiled kernels
    (input gradient and forward) load 16 bytes at a time (chosen automatically; forced both ways
    here): same results as the NumPy backend with padding, stride phases, groups, partial tiles."""
    check_cuda(rng, dtype, layout, 2, 9, 10, 2, 16, 24, 3, 3, (2, 2), "SAME", path="tiled", vector=vector)
    if cuda_device is not None:
        names = [name for name, _, _ in cuda_device.launches]
        assert sum(vector_arg(name) == str(vector).lower() for name in names) == 2, names


def test_cuda_vector_loads_need_aligned_arrays(cuda_device, rng):
    """A contiguous view that starts 4 bytes into an allocation cannot be read 16 bytes at a
    time: the automatic choice falls back to scalar loads, and forcing vector loads is refused."""
    launcher = cuda_launcher("conv2d_backprop_input")
    x_shape, filt, dy = make_problem(rng, np.float32, 2, 6, 7, 1, 8, 8, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    buffer = to_gpu(np.zeros(dy.size + 1, np.float32))
    dy_view = buffer[1:].reshape(dy.shape)
    dy_view[...] = to_gpu(dy)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1),
                      NO_PADS)
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher.conv2d_backprop_input(g, to_gpu(filt), dy_view, path="tiled", vector=True)
    got = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), dy_view, path="tiled"))
    assert_close(got, expected_grad(x_shape, filt, dy, (1, 1), "SAME", (1, 1), NO_PADS), np.float32)
    if cuda_device is not None:
        assert vector_arg(cuda_device.launches[-1][0]) == "false"


@pytest.mark.parametrize("pads", ASYMMETRIC_PADS, ids=pads_id)
@CUDA_PATHS
def test_cuda_explicit_padding_asymmetric(cuda_device, rng, pads, path):
    check_cuda(rng, np.float64, "NCHW", 2, 4, 5, 1, 2, 3, 2, 3, (2, 1), "EXPLICIT", (1, 1), pads, path=path)


@pytest.mark.parametrize("h,stride", [(5, 2), (7, 3), (9, 3)])
@pytest.mark.parametrize("path", ["tiled", "direct"])
def test_cuda_rows_beyond_last_window_get_zero_gradient(cuda_device, rng, h, stride, path):
    dx, want, _, _ = run_cuda(rng, np.float64, "NHWC", 1, h, 4, 1, 2, 2, 2, 1, (stride, 1), "VALID", path=path)
    np.testing.assert_array_equal(dx == 0, want == 0)
    assert_close(dx, want, np.float64)


@LAYOUTS
def test_cuda_public_api(cuda_device, rng, layout):
    """GPU arrays in, a GPU array out, through the public ops with backend='cuda' and with
    use_cudnn_on_gpu=False (which selects our kernels)."""
    import cupy

    x_shape, filt, dy = make_problem(rng, np.float32, 2, 6, 7, 1, 3, 4, 3, 3, (2, 1), "SAME", (1, 1), NO_PADS)
    a = attrs(layout, (2, 1), "SAME")
    want = expected_grad(x_shape, filt, dy, (2, 1), "SAME", (1, 1), NO_PADS)
    for kw in (dict(backend="cuda"), dict(use_cudnn_on_gpu=False)):
        got = gradops.conv2d_backprop_input(shape_in(x_shape, layout), to_gpu(filt), to_gpu(to_layout(dy, layout)),
                                            **a, **kw)
        assert isinstance(got, cupy.ndarray) and got.dtype == np.float32
        assert_close(from_layout(to_host(got), layout), want, np.float32)
    x = random_array(rng, x_shape, np.float32)
    y = gradops.conv2d(to_gpu(to_layout(x, layout)), to_gpu(filt), backend="cuda", **a)
    assert isinstance(y, cupy.ndarray)
    assert_close(from_layout(to_host(y), layout), reference.conv2d(x.astype(np.float64), filt.astype(np.float64),
                                                                   (2, 1), "SAME"), np.float32)


@empty_cases("sizes")
def test_cuda_empty_gives_zeros(cuda_device, sizes, fshape, dy_shape, kw, dtype):
    kw = {"strides": [1, 1, 1, 1], **kw}
    filt, dy = to_gpu(np.ones(fshape, dtype)), to_gpu(np.ones(dy_shape, dtype))
    got = to_host(gradops.conv2d_backprop_input(list(sizes), filt, dy, backend="cuda", **kw))
    assert got.shape == sizes and got.dtype == np.dtype(dtype)
    assert not np.any(got.astype(np.float64))
    y = to_host(gradops.conv2d(to_gpu(np.ones(sizes, dtype)), filt, backend="cuda", **kw))
    assert y.shape == dy_shape and not np.any(y.astype(np.float64))


@pytest.mark.parametrize("kind", ["fortran", "negative-strides", "transposed-view"])
@LAYOUTS
def test_cuda_non_contiguous_inputs(cuda_device, rng, kind, layout):
    """Non-contiguous GPU filter/out_backprop views give their contiguous copies' result."""
    import cupy

    x_shape, fshape, dy_shape = (2, 5, 6, 3), (2, 3, 3, 2), (2, 5, 3, 2)
    filt = non_contiguous(rng, kind, fshape, np.float32, to_gpu)
    dy = non_contiguous(rng, kind, shape_in(dy_shape, layout), np.float32, to_gpu)
    assert not (filt.flags.c_contiguous or dy.flags.c_contiguous)
    a = attrs(layout, (1, 2), "SAME")
    sizes = shape_in(x_shape, layout)
    got = to_host(gradops.conv2d_backprop_input(sizes, filt, dy, backend="cuda", **a))
    copy = to_host(gradops.conv2d_backprop_input(sizes, cupy.ascontiguousarray(filt), cupy.ascontiguousarray(dy),
                                                 backend="cuda", **a))
    np.testing.assert_array_equal(got, copy)
    assert_close(from_layout(got, layout), expected_grad(x_shape, to_host(filt), from_layout(to_host(dy), layout),
                                                         (1, 2), "SAME", (1, 1), NO_PADS), np.float32)


@DTYPES
@pytest.mark.parametrize("path", ["tiled", "direct"])
def test_cuda_bitwise_deterministic(cuda_device, rng, dtype, path):
    """Two runs give bitwise equal results (every element is written once, in a fixed order).
    On the host the second run executes blocks and threads in another order: a race check."""
    launcher = cuda_launcher("conv2d_backprop_input")
    n, h, w = (4, 30, 28) if cuda_device is None else (2, 14, 12)  # the host simulates every thread
    x_shape, filt, dy = make_problem(rng, dtype, n, h, w, 1, 24, 40, 3, 3, (2, 2), "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", (2, 2), "SAME", (1, 1),
                      NO_PADS)
    fg, dyg = to_gpu(filt), to_gpu(dy)
    first = to_host(launcher.conv2d_backprop_input(g, fg, dyg, path=path))
    if cuda_device is not None:
        cuda_device.seed += 1
    second = to_host(launcher.conv2d_backprop_input(g, fg, dyg, path=path))
    np.testing.assert_array_equal(first.view(np.uint8), second.view(np.uint8))
    assert_close(first, expected_grad(x_shape, filt, dy, (2, 2), "SAME", (1, 1), NO_PADS), dtype)


def check_tf32(rng, case):
    """check_tf32_rounding of the tiled kernel on one TF32_CASES problem."""
    n, h, w, groups, cg, og, r, s, strides = case
    x_shape, filt, dy = make_problem(rng, np.float32, n, h, w, groups, cg, og, r, s, strides, "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", strides, "SAME", (1, 1),
                      NO_PADS)
    check_tf32_rounding(
        lambda operand: gradops.conv2d_backprop_input(x_shape, operand(filt).astype(np.float64),
                                                      operand(dy).astype(np.float64),
                                                      **attrs("NHWC", strides, "SAME"), backend="numpy"),
        lambda: to_host(cuda_launcher("conv2d_backprop_input").conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy),
                                                                                     path="tiled")))


@TF32_CASES
def test_cuda_tf32_is_exact_float_math_on_rounded_operands(cuda_device, rng, case):
    """With allow_tf32 the tiled kernel's products are those of its operands rounded to TF32,
    summed in float32 (check_tf32)."""
    check_tf32(rng, case)


@pytest.mark.parametrize("edits", [
    # the half types' ldmatrix offset (8 elements) for float's [row][k] tiles: the second
    # matrix column 32 bytes on, the next k-step's
    (("kk + KH * (matrix / 2));  // [row][k]", "kk + 8 * (matrix / 2));  // [row][k]"),),
    (("kk + KH * (matrix % 2));  // [row][k]", "kk + 8 * (matrix % 2));  // [row][k]"),),
], ids=["tf32-a-ldmatrix-half-offset", "tf32-b-ldmatrix-half-offset"])
def test_planted_tf32_bugs_fail_the_comparison(monkeypatch, tmp_path, rng, edits):
    """Bugs planted in mma_cta's TF32 path fail check_tf32."""
    check_planted_tf32_bug(monkeypatch, tmp_path, edits, lambda: check_tf32(rng, TF32_PLANTED_CASE))


def test_cuda_allow_tf32(cuda_device, rng):
    """float32 is exact by default; with allow_tf32 the tiled kernel uses TF32 tensor cores
    (10-bit mantissa products): still close to the reference, but not bitwise the exact result."""
    launcher = cuda_launcher("conv2d_backprop_input")
    x_shape, filt, dy = make_problem(rng, np.float32, 2, 20, 20, 1, 32, 32, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    # The NumPy backend in float64 as the reference (checked against brute-force loops above).
    want = gradops.conv2d_backprop_input(x_shape, filt.astype(np.float64), dy.astype(np.float64),
                                         **attrs("NHWC", (1, 1), "SAME"), backend="numpy")
    g = conv_geometry("conv2d_backprop_input", x_shape, filt.shape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1),
                      NO_PADS)
    exact = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy), path="tiled"))
    assert_close(exact, want, np.float32)
    with gradops.options(allow_tf32=True):
        tf32 = to_host(launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy), path="tiled"))
    # TF32 keeps 10 of float32's 23 mantissa bits: products are off by up to ~2**-11 relative.
    assert float(np.max(np.abs(tf32 - want))) <= 1e-2 * float(np.max(np.abs(want)))
    assert not np.array_equal(tf32, exact)


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", ["tiled", "direct"])
def test_cuda_more_than_2_31_elements(path):
    """An input gradient of more than 2**31 elements (float16, ~4.3 GB) from a 1x1 filter:
    dx[n, h, w, c] = dy[n, h, w, 0] * filter[0, 0, c, 0], checked past the 2**31-th element."""
    import cupy

    launcher = cuda_launcher("conv2d_backprop_input")
    n, h, w, c = 2, 1024, 1024, 1025
    assert n * h * w * c > 2**31
    filt = cupy.random.default_rng(1).standard_normal((1, 1, c, 1), dtype=cupy.float32).astype(cupy.float16)
    dy = cupy.random.default_rng(2).standard_normal((n, h, w, 1), dtype=cupy.float32).astype(cupy.float16)
    g = conv_geometry("conv2d_backprop_input", (n, h, w, c), filt.shape, dy.shape, "NHWC", (1, 1), "VALID", (1, 1),
                      NO_PADS)
    got = launcher.conv2d_backprop_input(g, filt, dy, path=path)
    for index in ((0, 0, 0), (1, 1023, 1023), (1, 517, 1000)):
        want = (dy[index + (0,)].astype(cupy.float32) * filt[0, 0, :, 0].astype(cupy.float32)).astype(cupy.float16)
        np.testing.assert_array_equal(to_host(got[index]), to_host(want))


@pytest.mark.slow
@pytest.mark.parametrize("path", ["tiled", "direct"])
@pytest.mark.parametrize("channels", [1025, 1032], ids=["scalar-loads", "vector-loads"])
def test_host_more_than_2_31_elements(monkeypatch, path, channels):
    """The kernel sources' 64-bit offsets, executed on the CPU: an input gradient of more than
    2**31 float16 elements (~4.3 GB) from a 1x1 filter, dx[n, h, w, c] = dy[n, h, w, 0] *
    filter[0, 0, c, 0] (other out channels have a zero filter).  Only the blocks that write the far end of the tensor run (the last
    row tile of the tiled kernel; one grid-stride block of the direct kernel), and every
    element they write is checked; all of them lie past the 2**31-th element."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    n, h, w, c = 2, 1024, 1024, channels
    rows = n * h * w
    assert (rows - 128) * c > 2**31
    launcher = cuda_launcher("conv2d_backprop_input")

    def last_blocks(expression, grid):
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        if "igemm" in expression:  # the last row tile, every column tile
            return [gx - 1 + gx * y for y in range(gy)]
        return [gx - 1]  # one block of the grid-stride kernel

    device = cuda_host.HostDevice(block_filter=last_blocks).install(monkeypatch)
    rng = np.random.default_rng(3)
    # Vector loads need out channels in multiples of 8 too: out channels 1-7 get a zero filter,
    # so the sums stay exact.
    out_channels = 8 if c % 8 == 0 else 1
    filt = np.zeros((1, 1, c, out_channels), np.float16)
    filt[..., 0] = rng.standard_normal(c)
    dy = rng.standard_normal((n, h, w, out_channels)).astype(np.float16)
    g = conv_geometry("conv2d_backprop_input", (n, h, w, c), filt.shape, dy.shape, "NHWC", (1, 1), "VALID", (1, 1),
                      NO_PADS)
    dx = launcher.conv2d_backprop_input(g, to_gpu(filt), to_gpu(dy), path=path)
    expression, grid, block = device.launches[-1]
    assert ("igemm" in expression) == (path == "tiled")
    assert path != "tiled" or vector_arg(expression) == ("true" if c % 8 == 0 else "false")
    flat = dx.reshape(-1)
    if path == "tiled":
        first = (grid[0] - 1) * 128  # the last tile's first row
        got = flat[first * c:].reshape(-1, c)
        want = dy[..., 0].reshape(-1)[first:, None].astype(np.float32) * filt[0, 0, :, 0].astype(np.float32)
        written = np.arange(first * c, rows * c)
    else:
        written = cuda_host.grid_stride_elements(grid, block, rows * c, minimum=2**31 + 1)
        got = flat[written]
        want = (dy[..., 0].reshape(-1)[written // c].astype(np.float32)
                * filt[0, 0, :, 0][written % c].astype(np.float32))
    assert written.min() > 2**31 and written.size > 1000
    np.testing.assert_array_equal(got, want.astype(np.float16))
    assert np.isnan(flat[:1000]).all(), "blocks outside the filter did not run"

