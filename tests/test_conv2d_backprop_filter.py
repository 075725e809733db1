"""conv2d_backprop_filter and conv2d_backprop_filter_v2 against the brute-force loop reference.

Every expected value comes from ``reference.conv2d_backprop_filter`` (NHWC / HWIO, float64),
fed the very values the op sees (inputs are drawn already rounded to the test dtype).  The
only gradops-vs-gradops checks are the adjoint identities and V2 == V1.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume

import gradops
import reference
from gradops.backends.cuda import _conv_igemm as ig
from gradops.bench.static_report import template_args
from conftest import assert_close, misaligned_on_gpu, random_array, to_gpu, to_host
from conv_cases import (ALL_REPRESENTATIVE, ASYMMETRIC_PADS, CUDA_PATHS, DTYPES, GRID_ARGS, HALF_DTYPES, LAYOUTS,
                        MMA_TILE_SHAPES, NON_CONTIGUOUS, TF32_CASES, TF32_PLANTED_CASE, check_planted_tf32_bug,
                        check_tf32_rounding,
                        NO_PADS, REPRESENTATIVE, SIZE_TYPES, TF_CASES, attrs, check_drawn, conv_geometry,
                        cuda_conv_problems, cuda_launcher, drawn_problems, empty_cases, from_layout, geometry_grid,
                        non_contiguous, out_size, pads_id, seeded, shape_in, to_layout,
                        run_tiny_problems, tiny_choices, valid_truncation)

# --------------------------------------------------------------------------- helpers


def make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """Random NHWC input and out_backprop (rounded to ``dtype``) and the HWIO filter shape."""
    oh = out_size(h, r, strides[0], dilations[0], padding, pads[0])
    ow = out_size(w, s, strides[1], dilations[1], padding, pads[1])
    x = random_array(rng, (n, h, w, groups * cg), dtype)
    dy = random_array(rng, (n, oh, ow, groups * og), dtype)
    return x, (r, s, cg, groups * og), dy


def planted_host_device(monkeypatch, tmp_path, filename, edit, seed):
    """The host stand-in built from kernel sources with ``edit`` (text, replacement) made in
    ``filename``, installed (skips where the host model cannot build)."""
    import cuda_host

    return cuda_host.planted_host_device(tmp_path, filename, edit, order="shuffled", seed=seed).install(monkeypatch)


def expected_grad(x, filter_shape, dy, strides, padding, dilations, pads):
    return reference.conv2d_backprop_filter(x.astype(np.float64), filter_shape, dy.astype(np.float64),
                                            strides, padding, dilations, pads)


def check_against_reference(rng, dtype, layout, n, h, w, groups, cg, og, r, s, strides, padding,
                            dilations=(1, 1), pads=NO_PADS):
    """Run conv2d_backprop_filter on one random problem and compare with the loop reference."""
    x, fshape, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    got = gradops.conv2d_backprop_filter(to_layout(x, layout), fshape, to_layout(dy, layout),
                                         **attrs(layout, strides, padding, dilations, pads))
    assert isinstance(got, np.ndarray)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, expected_grad(x, fshape, dy, strides, padding, dilations, pads), dtype)
    return got


# --------------------------------------------------------------------------- 1. grids

def _grid_sizes(i, groups):
    """(h, w, r, s, cg, og) of geometry-grid case ``i``."""
    cg, og = (1 + i % 2, 1 + (i // 2) % 2) if groups < 3 else (1, 1 + i % 2)
    return 4 + i % 4, 4 + (3 * i + 1) % 4, 1 + i % 3, 1 + (i + 1) % 3, cg, og


GEOMETRY_GRID = geometry_grid(
    [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 0), (0, 2))), ("EXPLICIT", ((4, 1), (0, 3)))],
    [(1, 1), (2, 2), (1, 2)], ("NHWC", "NCHW"), _grid_sizes)


@pytest.mark.parametrize(GRID_ARGS, GEOMETRY_GRID)
def test_geometry_grid_float64(rng, layout, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """Every padding/stride/dilation/groups combination matches the loop reference (float64)."""
    check_against_reference(rng, np.float64, layout, 2, h, w, groups, cg, og, r, s, strides, padding,
                            dilations, pads)


@DTYPES
@LAYOUTS
@ALL_REPRESENTATIVE
def test_dtypes_and_layouts(rng, dtype, layout, case):
    """All four dtypes in both layouts match the reference, and the result keeps the input dtype."""
    check_against_reference(rng, dtype, layout, n=2, **REPRESENTATIVE[case])


@pytest.mark.parametrize("pads", ASYMMETRIC_PADS, ids=pads_id)
@LAYOUTS
def test_explicit_padding_asymmetric_and_larger_than_filter(rng, pads, layout):
    """Asymmetric explicit pads, including pads wider than the filter (all-padding windows), are exact."""
    check_against_reference(rng, np.float64, layout, 2, 4, 5, 1, 2, 3, 2, 3, (2, 1), "EXPLICIT", (1, 1), pads)


# --------------------------------------------------------------------------- 2. adjoint identity

ADJOINT_CASES = {
    "same-s1": dict(strides=(1, 1), padding="SAME"),
    "valid-s2": dict(strides=(2, 2), padding="VALID"),
    "explicit-s12-d2": dict(strides=(1, 2), padding="EXPLICIT", dilations=(2, 2), pads=((3, 1), (0, 2))),
    "same-s3-d21-g2": dict(strides=(3, 3), padding="SAME", dilations=(2, 1), groups=2),
    "valid-d12-g3": dict(strides=(1, 1), padding="VALID", dilations=(1, 2), groups=3),
}


@LAYOUTS
@pytest.mark.parametrize("case", list(ADJOINT_CASES), ids=str)
def test_adjoint_identity(rng, layout, case):
    """<conv2d(x, w), dy> == <x, backprop_input(dy)> == <w, backprop_filter(x, dy)> (float64)."""
    kw = dict(ADJOINT_CASES[case])
    groups, pads = kw.pop("groups", 1), kw.pop("pads", NO_PADS)
    strides, padding, dilations = kw["strides"], kw["padding"], kw.get("dilations", (1, 1))
    x, fshape, dy = make_problem(rng, np.float64, 2, 7, 6, groups, 2, 2, 3, 2, strides, padding, dilations, pads)
    w = random_array(rng, fshape, np.float64)
    a = attrs(layout, strides, padding, dilations, pads)
    xl, dyl = to_layout(x, layout), to_layout(dy, layout)
    y = gradops.conv2d(xl, w, **a)
    assert y.shape == dyl.shape
    dx = gradops.conv2d_backprop_input(xl.shape, w, dyl, **a)
    dw = gradops.conv2d_backprop_filter(xl, fshape, dyl, **a)
    lhs = float(np.sum(y * dyl))
    assert abs(lhs) > 1e-3  # a non-trivial pairing, so the identity has something to check
    np.testing.assert_allclose(float(np.sum(xl * dx)), lhs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(float(np.sum(w * dw)), lhs, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- 3. property test


@drawn_problems(60)
def test_property_matches_reference(p):
    """Random layout/padding/pads/strides/dilations/groups/dtype combinations match the reference."""
    check_drawn(check_against_reference, p)


# --------------------------------------------------------------------------- 4. edge cases


@empty_cases("x_shape")
def test_empty_gives_zeros(x_shape, fshape, dy_shape, kw, dtype):
    """Empty tensors (batch/depth/output size 0) give zeros of filter_sizes' shape in the input dtype."""
    kw = {"strides": [1, 1, 1, 1], **kw}
    x = np.ones(x_shape, dtype)
    dy = np.ones(dy_shape, dtype)
    got = gradops.conv2d_backprop_filter(x, fshape, dy, **kw)
    assert isinstance(got, np.ndarray) and got.dtype == np.dtype(dtype)
    assert got.shape == fshape
    assert not np.any(got.astype(np.float64))


def test_valid_truncation_to_zero_rows_not_an_error():
    """VALID, input 2, effective filter 5 (3 taps, dilation 2), stride 2: 0 output rows, no error (TF's C++ division)."""
    x = np.ones((1, 2, 3, 1), np.float32)
    dy = np.ones((1, 0, 3, 1), np.float32)
    got = gradops.conv2d_backprop_filter(x, [3, 1, 1, 1], dy, [1, 2, 1, 1], "VALID", dilations=[1, 2, 1, 1])
    np.testing.assert_array_equal(got, np.zeros((3, 1, 1, 1), np.float32))


def test_one_by_one_filter_is_a_matmul(rng):
    """A 1x1 filter's gradient is x^T dy summed over batch and positions."""
    x = random_array(rng, (2, 5, 4, 3), np.float64)
    dy = random_array(rng, (2, 5, 4, 2), np.float64)
    got = gradops.conv2d_backprop_filter(x, [1, 1, 3, 2], dy, [1, 1, 1, 1], "VALID")
    want = np.einsum("nhwc,nhwo->co", x, dy)[None, None]
    np.testing.assert_allclose(got, want, rtol=1e-12)


@LAYOUTS
def test_filter_larger_than_input_same(rng, layout):
    """SAME with a filter larger than the input (most taps hit padding) matches the reference."""
    check_against_reference(rng, np.float64, layout, 2, 2, 3, 1, 2, 2, 5, 4, (1, 1), "SAME")
    check_against_reference(rng, np.float32, layout, 1, 3, 2, 2, 1, 1, 3, 6, (2, 1), "SAME", (2, 1))


@pytest.mark.parametrize("sizes", SIZE_TYPES)
def test_filter_sizes_types(rng, sizes):
    """filter_sizes as list, tuple, int32 or int64 array all give the reference result."""
    x, fshape, dy = make_problem(rng, np.float64, 2, 5, 5, 1, 2, 3, 3, 2, (2, 1), "SAME", (1, 1), NO_PADS)
    got = gradops.conv2d_backprop_filter(x, sizes(fshape), dy, [1, 2, 1, 1], "SAME")
    assert got.shape == fshape
    assert_close(got, expected_grad(x, fshape, dy, (2, 1), "SAME", (1, 1), NO_PADS), np.float64)


@DTYPES
@LAYOUTS
def test_v2_equals_v1(rng, dtype, layout):
    """conv2d_backprop_filter_v2 takes the filter's shape (not values) and equals V1 bit for bit."""
    strides, padding, dilations, pads = (1, 2), "EXPLICIT", (2, 1), ((1, 2), (0, 1))
    x, fshape, dy = make_problem(rng, dtype, 2, 6, 5, 2, 2, 1, 2, 3, strides, padding, dilations, pads)
    a = attrs(layout, strides, padding, dilations, pads)
    xl, dyl = to_layout(x, layout), to_layout(dy, layout)
    v1 = gradops.conv2d_backprop_filter(xl, fshape, dyl, **a)
    v2 = gradops.conv2d_backprop_filter_v2(xl, np.full(fshape, np.nan, dtype), dyl, **a)
    assert v2.dtype == np.dtype(dtype) and isinstance(v2, np.ndarray)
    np.testing.assert_array_equal(v2.astype(np.float64), v1.astype(np.float64))
    assert_close(v2, expected_grad(x, fshape, dy, strides, padding, dilations, pads), dtype)


def test_keyword_arguments_with_tf_names(rng):
    """Both ops accept every argument by TF's names, and the positional TF order gives the same result."""
    x, fshape, dy = make_problem(rng, np.float64, 2, 5, 6, 1, 2, 2, 2, 3, (2, 2), "EXPLICIT", (1, 1),
                                 ((1, 0), (2, 1)))
    xc, dyc = to_layout(x, "NCHW"), to_layout(dy, "NCHW")
    pads = [0, 0, 0, 0, 1, 0, 2, 1]
    want = expected_grad(x, fshape, dy, (2, 2), "EXPLICIT", (1, 1), ((1, 0), (2, 1)))
    common = dict(strides=[1, 1, 2, 2], padding="EXPLICIT", use_cudnn_on_gpu=False, explicit_paddings=pads,
                  data_format="NCHW", dilations=[1, 1, 1, 1])
    v1 = gradops.conv2d_backprop_filter(input=xc, filter_sizes=list(fshape), out_backprop=dyc, **common)
    v2 = gradops.conv2d_backprop_filter_v2(input=xc, filter=np.zeros(fshape), out_backprop=dyc, **common)
    positional = gradops.conv2d_backprop_filter(xc, fshape, dyc, [1, 1, 2, 2], "EXPLICIT", True, pads, "NCHW",
                                                [1, 1, 1, 1])
    for got in (v1, v2, positional):
        assert_close(got, want, np.float64)


@pytest.mark.parametrize("kind", NON_CONTIGUOUS)
@LAYOUTS
def test_non_contiguous_inputs(rng, kind, layout):
    """Non-contiguous views of input and out_backprop give the contiguous copies' result and the reference's."""
    strides, padding = (1, 2), "SAME"
    x_shape, fshape, dy_shape = (2, 5, 6, 3), (2, 3, 3, 2), (2, 5, 3, 2)
    x = non_contiguous(rng, kind, shape_in(x_shape, layout), np.float32)
    dy = non_contiguous(rng, kind, shape_in(dy_shape, layout), np.float32)
    assert not (x.flags.c_contiguous or dy.flags.c_contiguous)
    a = attrs(layout, strides, padding)
    got = gradops.conv2d_backprop_filter(x, fshape, dy, **a)
    copy = gradops.conv2d_backprop_filter(np.ascontiguousarray(x), fshape, np.ascontiguousarray(dy), **a)
    np.testing.assert_array_equal(got, copy)
    assert_close(got, expected_grad(from_layout(x, layout), fshape, from_layout(dy, layout), strides, padding, (1, 1), NO_PADS), np.float32)


# --------------------------------------------------------------------------- TensorFlow cross-check


@pytest.mark.tf
@TF_CASES
def test_reference_agrees_with_tensorflow(tf, rng, padding, pads, strides):
    """The loop reference (and gradops) agree with tf.raw_ops.Conv2DBackpropFilter where TF's CPU kernel runs."""
    x, fshape, dy = make_problem(rng, np.float64, 2, 6, 7, 1, 3, 2, 3, 2, strides, padding, (1, 1), pads)
    a = attrs("NHWC", strides, padding, (1, 1), pads)
    want = tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=list(fshape), out_backprop=dy, **a).numpy()
    np.testing.assert_allclose(expected_grad(x, fshape, dy, strides, padding, (1, 1), pads), want, rtol=1e-10,
                               atol=1e-10)
    np.testing.assert_allclose(gradops.conv2d_backprop_filter(x, fshape, dy, **a), want, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- CUDA backend (GPU)
# Our kernels (backend="cuda") against the NumPy backend on the same problems; ``path`` runs the
# automatic choice, the direct fallback and the implicit-GEMM kernel on every case.


def run_cuda(rng, dtype, layout, n, h, w, groups, cg, og, r, s, strides, padding, dilations=(1, 1), pads=NO_PADS,
             path=None, splits=None, vector=None, pointwise=None, few_channels=None, tile=None):
    """(CUDA result on the host, NumPy backend result, geometry) of one random problem."""
    x, fshape, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    xl, dyl = to_layout(x, layout), to_layout(dy, layout)
    g = conv_geometry("conv2d_backprop_filter", xl.shape, fshape, dyl.shape, layout, strides, padding, dilations,
                      pads)
    kw = {} if path is None else {"path": path}
    if splits is not None:
        kw["splits"] = splits
    if vector is not None:
        kw["vector"] = vector
    if pointwise is not None:
        kw["pointwise"] = pointwise
    if few_channels is not None:
        kw["few_channels"] = few_channels
    if tile is not None:
        kw["tile"] = tile
    got = cuda_launcher("conv2d_backprop_filter").conv2d_backprop_filter(g, to_gpu(xl), to_gpu(dyl), **kw)
    want = gradops.conv2d_backprop_filter(xl, fshape, dyl, **attrs(layout, strides, padding, dilations, pads),
                                          backend="numpy")
    got = to_host(got)
    assert got.dtype == np.dtype(dtype) and got.shape == fshape
    return got, want, g


@CUDA_PATHS
@pytest.mark.parametrize(GRID_ARGS, GEOMETRY_GRID)
def test_cuda_geometry_grid_float64(cuda_device, rng, path, layout, h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    """Every padding/stride/dilation/groups combination: CUDA kernels == NumPy backend (float64)."""
    got, want, _ = run_cuda(rng, np.float64, layout, 2, h, w, groups, cg, og, r, s, strides, padding, dilations,
                            pads, path=path)
    assert_close(got, want, np.float64)


@CUDA_PATHS
@DTYPES
@LAYOUTS
@ALL_REPRESENTATIVE
def test_cuda_dtypes_and_layouts(cuda_device, rng, path, dtype, layout, case):
    """All four dtypes in both layouts on every path match the NumPy backend."""
    got, want, _ = run_cuda(rng, dtype, layout, n=2, path=path, **REPRESENTATIVE[case])
    assert_close(got, want, dtype)


@pytest.mark.parametrize("path,splits", [("tiled", None), ("tiled", 1), ("tiled", 7),
                                         pytest.param("direct", None, marks=pytest.mark.slow_on_host)])
@DTYPES
@LAYOUTS
def test_cuda_several_tiles(cuda_device, rng, path, splits, dtype, layout):
    """A problem larger than one CTA tile in every GEMM dimension (partial edge tiles, many
    reduction steps, grouped), with and without a split reduction."""
    got, want, _ = run_cuda(rng, dtype, layout, 2, 13, 12, 2, 75, 136, 3, 2, (2, 1), "EXPLICIT", (1, 2),
                            ((1, 2), (0, 1)), path=path, splits=splits)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("capped", [False, True], ids=["grid", "capped-grid"])
@pytest.mark.parametrize("path", ["direct", "tiled"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_cuda_racecheck(racecheck_device, rng, path, dtype, capped):
    """No shared-memory hazard in the direct and tiled kernels (racecheck builds on the host),
    with the launcher's grid and with grids capped to one block a dimension: the direct kernel's
    block then reduces every filter element in turn, with no barrier between one element's last
    read of its partial sums and the next element's first writes (none is needed)."""
    import contextlib

    import cuda_host

    with cuda_host.capped_grids() if capped else contextlib.nullcontext():
        for layout in ("NHWC", "NCHW"):
            got, want, _ = run_cuda(rng, dtype, layout, 2, 6, 5, 2, 3, 4, 3, 2, (2, 1), "SAME", path=path)
            assert_close(got, want, dtype)


@tiny_choices("conv2d_backprop_filter")
@LAYOUTS
def test_cuda_tiny_problems_memcheck(racecheck_device, rng, choice, forced, dtype, layout):
    """Each kernel of the filter gradient on tiny problems, in racecheck builds: no access
    outside input, out_backprop, the split buffer or the result (the guard bytes around each
    array), no shared-memory hazard, results as NumPy's.  A forced kernel that cannot run a
    problem (a ValueError saying so) skips it; each runs at least one."""
    def run(problem):
        n, h, w, groups, cg, og, r, s, strides, padding = problem
        x, fshape, dy = make_problem(rng, dtype, n, h, w, groups, cg, og, r, s, strides, padding, (1, 1), NO_PADS)
        xl, dyl = to_layout(x, layout), to_layout(dy, layout)
        g = conv_geometry("conv2d_backprop_filter", xl.shape, fshape, dyl.shape, layout, strides, padding, (1, 1),
                          NO_PADS)
        got = cuda_launcher("conv2d_backprop_filter").conv2d_backprop_filter(g, to_gpu(xl), to_gpu(dyl), **forced)
        want = gradops.conv2d_backprop_filter(xl, fshape, dyl, **attrs(layout, strides, padding), backend="numpy")
        assert_close(to_host(got), want, dtype)

    run_tiny_problems(choice, forced, run)


@drawn_problems(150, cuda_conv_problems())
def test_cuda_property_tiled_matches_numpy(cuda_device, p):
    """Random layouts, paddings, strides, dilations, groups, dtypes and channel counts (with and
    without 16-byte loads, split or not): the tiled filter-gradient kernel matches NumPy."""
    assume(valid_truncation(p))
    rng, p = seeded(p)
    splits = int(rng.integers(1, 4))
    dtype = p.pop("dtype")
    got, want, _ = run_cuda(rng, dtype, p.pop("layout"), path="tiled", splits=splits, **p)
    assert_close(got, want, dtype)


@DTYPES
@LAYOUTS
@pytest.mark.parametrize("groups,cg,og,h,w,splits", [(1, 64, 64, 5, 7, 1), (1, 136, 200, 9, 16, 3),
                                                     (2, 16, 40, 3, 3, 2), (1, 8, 8, 1, 1, 1)],
                         ids=["64x64", "partial-tiles-split", "grouped-split", "one-position"])
@pytest.mark.parametrize("padding", ["VALID", "SAME"])
def test_cuda_1x1_kernel(cuda_device, rng, dtype, layout, groups, cg, og, h, w, splits, padding):
    """A 1x1 filter at stride 1 without padding takes the plain-GEMM kernel automatically (where
    16-byte loads hold), and it matches the NumPy backend and the general tiled kernel: partial
    tiles in M, N and the reduction, several reduction tiles, split reductions, groups."""
    args = (dtype, layout, 2, h, w, groups, cg, og, 1, 1, (1, 1), padding)
    got, want, g = run_cuda(np.random.default_rng(7), *args, path="tiled", splits=splits)
    general, _, _ = run_cuda(np.random.default_rng(7), *args, path="tiled", splits=splits, pointwise=False)
    assert ig.pointwise_eligible(g)
    assert_close(got, want, dtype)
    assert_close(general, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches
        names = [e for e, _, _ in cuda_device.launches if "_igemm<" in e]
        assert "_1x1_igemm<" in names[0] and "_1x1_igemm<" not in names[1], names


# (n, h, w, in channels, out channels, r, s, strides, padding, dilations, pads) of the few-channel
# kernel's problems: the stem's 7x7 stride 2 (147 taps: three tap tiles, the last partial), one
# and two out-channel tiles (the second partial), dilations, asymmetric explicit padding, a 1x1
# filter (3 taps), one position per image.
FEW_CHANNEL_CASES = {
    "stem-7x7-s2": (2, 11, 13, 3, 16, 7, 7, (2, 2), "EXPLICIT", (1, 1), ((3, 3), (3, 3))),
    "1-channel-72-out": (2, 9, 7, 1, 72, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS),
    "2-channels-dilated": (3, 10, 6, 2, 8, 3, 2, (2, 1), "VALID", (2, 3), NO_PADS),
    "4-channels-asymmetric": (1, 8, 9, 4, 64, 4, 3, (1, 2), "EXPLICIT", (1, 1), ((2, 0), (1, 3))),
    "1x1": (2, 5, 6, 3, 24, 1, 1, (1, 1), "VALID", (1, 1), NO_PADS),
    "one-position": (2, 3, 3, 3, 8, 3, 3, (1, 1), "VALID", (1, 1), NO_PADS),
    "5x5-s2-72-out": (2, 17, 19, 3, 72, 5, 5, (2, 2), "SAME", (1, 1), NO_PADS),  # the planted-bug problem
}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@LAYOUTS
@pytest.mark.parametrize("case", list(FEW_CHANNEL_CASES))
@pytest.mark.parametrize("splits", [None, 1, 3])
def test_cuda_few_channels(cuda_device, rng, dtype, layout, case, splits):
    """One to four input channels (a stem) in a half type take the few-channel kernel
    automatically; it matches the NumPy backend and the general tiled kernel with its tap table
    past the filter's end, partial out-channel tiles, padding, strides, dilations, and with and
    without a split reduction (``splits=None``: the launcher's choice)."""
    n, h, w, cin, cout, r, s, strides, padding, dilations, pads = FEW_CHANNEL_CASES[case]
    args = (dtype, layout, n, h, w, 1, cin, cout, r, s, strides, padding, dilations, pads)
    got, want, g = run_cuda(np.random.default_rng(11), *args, path="tiled", splits=splits)
    assert_close(got, want, dtype)
    launched = [] if cuda_device is None else [e for e, _, _ in cuda_device.launches]
    if cuda_device is not None:
        few_splits = cuda_launcher("conv2d_backprop_filter").few_channels_split_count(g, splits)[0]
        assert ["_few_channels<" in e for e in launched] == [True] + [False] * (few_splits > 1), launched
        assert splits is None or 1 <= few_splits <= splits
    general, _, _ = run_cuda(np.random.default_rng(11), *args, path="tiled", splits=splits, few_channels=False)
    assert_close(general, want, dtype)
    if cuda_device is not None:
        assert not any("_few_channels<" in e for e, _, _ in cuda_device.launches[len(launched):])


def test_narrow_groups_take_the_tensor_cores(monkeypatch):
    """A group's GEMM narrower than TILED_MIN_DIM takes the tiled kernel on the tensor cores once
    it has TILED_MIN_GROUP_ELEMENTS filter elements (ResNeXt 32x4d's 3x3 layers: 36 x 4), the
    direct kernel below that, with SIMT math (float32, float64, half types before sm_70) and
    where the tiled kernel cannot run; a forced path is taken as it is."""
    from gradops.backends.cuda import _runtime

    launcher = cuda_launcher("conv2d_backprop_filter")
    # tiled_eligible reads the current device's tile (no GPU here): an H100's
    monkeypatch.setattr(_runtime, "compute_capability", lambda: 90)

    def geometry(groups, per_group, r=3, h=56):
        c = groups * per_group
        return conv_geometry("conv2d_backprop_filter", (32, h, h, c), (r, r, per_group, c), (32, h, h, c), "NHWC",
                             (1, 1), "SAME", (1, 1), NO_PADS)

    resnext = geometry(32, 4)
    m, n, _ = launcher._gemm_sizes(resnext)
    assert (m, n) == (36, 4) and min(m, n) < ig.TILED_MIN_DIM <= m and m * n >= launcher.TILED_MIN_GROUP_ELEMENTS
    for dtype in (np.float16, ml_dtypes.bfloat16):
        assert launcher.pick_path(resnext, dtype, arch=90) == "tiled"
        assert launcher.pick_path(resnext, dtype, arch=80) == "tiled"
        assert launcher.pick_path(resnext, dtype, arch=60) == "direct"  # no tensor cores: SIMT
    assert launcher.pick_path(resnext, np.float16, arch=75) == "tiled"  # float16 tensor cores from sm_70
    assert launcher.pick_path(resnext, ml_dtypes.bfloat16, arch=75) == "direct"  # bfloat16 ones from sm_80
    for dtype in (np.float32, np.float64):
        assert launcher.pick_path(resnext, dtype, arch=90) == "direct"
    # below the threshold: a 1x1 filter of 4 channels a group (16 elements), 3x3 of 2 (36)
    assert launcher.pick_path(geometry(32, 4, r=1), np.float16, arch=90) == "direct"
    assert launcher.pick_path(geometry(64, 2), np.float16, arch=90) == "direct"
    # wide groups are the generic rule's, forced paths the caller's
    assert launcher.pick_path(geometry(2, 64), np.float16, arch=90) == "tiled"
    assert launcher.pick_path(geometry(2, 64), np.float16, "direct", arch=90) == "direct"
    assert launcher.pick_path(resnext, np.float16, "direct", arch=90) == "direct"


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
@LAYOUTS
def test_cuda_narrow_groups_on_the_tensor_cores(cuda_device, rng, dtype, layout):
    """The launcher's own choice for 4 channels a group (3x3: 36 x 4 elements a group) runs the
    tiled kernel, which matches the NumPy backend and the direct kernel."""
    args = (dtype, layout, 2, 9, 8, 3, 4, 4, 3, 3, (1, 1), "SAME")
    got, want, g = run_cuda(rng, *args)
    assert cuda_launcher("conv2d_backprop_filter").pick_path(g, dtype) == "tiled"
    assert_close(got, want, dtype)
    if cuda_device is not None:
        launched = [e for e, _, _ in cuda_device.launches]
        assert launched and not any("_direct<" in e for e in launched), launched
    direct, _, _ = run_cuda(np.random.default_rng(0), *args, path="direct")
    assert_close(direct, run_cuda(np.random.default_rng(0), *args, path="tiled")[1], dtype)


@pytest.mark.parametrize("dtype,groups,cin,cout,why", [
    (np.float32, 1, 3, 16, "float32"), (np.float64, 1, 3, 16, "float64"), (np.float16, 2, 2, 16, "two groups"),
    (np.float16, 1, 5, 16, "five channels"), (np.float16, 1, 3, 12, "out_depth not a multiple of 8")])
def test_cuda_few_channels_eligibility(cuda_device, rng, dtype, groups, cin, cout, why):
    """Where the few-channel kernel cannot run, the general kernel does (same results) and
    forcing it is refused."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    args = (dtype, "NHWC", 2, 6, 5, groups, cin, cout // groups, 3, 3, (1, 1), "SAME")
    got, want, g = run_cuda(rng, *args, path="tiled")
    assert_close(got, want, dtype)
    assert not launcher.few_channels_eligible(g, dtype)
    with pytest.raises(ValueError, match="few-channel kernel needs"):
        run_cuda(rng, *args, path="tiled", few_channels=True)


def test_cuda_few_channels_needs_30_bit_coordinates(cuda_device):
    """An image of 2**30 or more elements (or coordinates that far) leaves the few-channel kernel
    (its missing-tap sentinel is -2**30) for the general one, whose limit is 2**31."""
    launcher = cuda_launcher("conv2d_backprop_filter")

    def geometry(h, w):
        return conv_geometry("conv2d_backprop_filter", (1, h, w, 3), (3, 3, 3, 8), (1, h // 2, w // 2, 8), "NHWC",
                             (2, 2), "SAME", (1, 1), NO_PADS)

    assert launcher.few_channels_eligible(geometry(2**14, 2**14), np.float16)  # input: 3 * 2**28 elements
    big = geometry(2**14, 2**14 + 2**13)  # 3 * 1.5 * 2**28 > 2**30
    assert not launcher.few_channels_eligible(big, np.float16)
    assert launcher.tiled_eligible(big, np.float16)
    # A one-row image whose explicit padding (and stride) puts the padded rows x columns x
    # channels, which bound window origins (h0 * in_cols + w0) * CIN, past 2**30.
    padded = conv_geometry("conv2d_backprop_filter", (1, 1, 2**19, 3), (1, 1, 3, 8), (1, 3, 1024, 8), "NHWC",
                           (512, 512), "EXPLICIT", (1, 1), ((512, 512), (0, 0)))
    assert all(v < 2**30 for v in ig.cursor_extents(padded))
    assert not launcher.few_channels_eligible(padded, np.float16)


def test_cuda_few_channels_needs_aligned_out_backprop(cuda_device, rng):
    """out_backprop's rows are read 16 bytes at a time: a view 2 bytes into an allocation falls
    back to the general kernel."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    x, fshape, dy = make_problem(rng, np.float16, 2, 6, 7, 1, 3, 8, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    dy_view = misaligned_on_gpu(dy)
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)
    assert launcher.few_channels_eligible(g, np.float16, (to_gpu(dy),))
    assert not launcher.few_channels_eligible(g, np.float16, (dy_view,))
    got = to_host(launcher.conv2d_backprop_filter(g, to_gpu(x), dy_view, path="tiled"))
    assert_close(got, expected_grad(x, fshape, dy, (1, 1), "SAME", (1, 1), NO_PADS), np.float16)
    if cuda_device is not None:
        assert not any("_few_channels<" in e for e, _, _ in cuda_device.launches)


def test_cuda_few_channels_bitwise_deterministic(cuda_device, rng):
    """Two runs of the few-channel kernel with a split reduction give the same bits; on the host
    the second executes blocks and threads in another order (a race check)."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    x, fshape, dy = make_problem(rng, np.float16, 2, 17, 19, 1, 3, 72, 5, 5, (2, 2), "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", (2, 2), "SAME", (1, 1), NO_PADS)
    xg, dyg = to_gpu(x), to_gpu(dy)
    first = to_host(launcher.conv2d_backprop_filter(g, xg, dyg, path="tiled", splits=3, few_channels=True))
    if cuda_device is not None:
        cuda_device.seed += 1
    second = to_host(launcher.conv2d_backprop_filter(g, xg, dyg, path="tiled", splits=3, few_channels=True))
    np.testing.assert_array_equal(first.view(np.uint8), second.view(np.uint8))
    assert_close(first, expected_grad(x, fshape, dy, (2, 2), "SAME", (1, 1), NO_PADS), np.float16)


def test_cuda_few_channels_split_count():
    """The stem at batch 32 (147 taps x 64 out channels: 3 CTAs) splits its 401,408 positions
    into enough chunks for about FEW_TARGET_CTAS CTAs, each a whole number of k-tiles."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    g = conv_geometry("conv2d_backprop_filter", (32, 224, 224, 3), (7, 7, 3, 64), (32, 112, 112, 64), "NHWC",
                      (2, 2), "SAME", (1, 1), NO_PADS)
    splits, size = launcher.few_channels_split_count(g)
    assert size % launcher.FEW_BK == 0 and (splits - 1) * size < 32 * 112 * 112 <= splits * size
    assert 3 * splits == pytest.approx(launcher.FEW_TARGET_CTAS, rel=0.01)


@DTYPES
@LAYOUTS
@pytest.mark.parametrize("vector", [True, False], ids=["vector", "scalar"])
def test_cuda_vector_loads(cuda_device, rng, dtype, layout, vector):
    """Channel counts that are multiples of 16 bytes' worth of elements let the tiled kernel load
    16 bytes at a time (chosen automatically; forced both ways here): same results as the NumPy
    backend with padding, stride, groups, a split reduction and partial tiles."""
    got, want, _ = run_cuda(rng, dtype, layout, 2, 9, 10, 2, 16, 24, 3, 3, (2, 2), "SAME", path="tiled",
                            splits=2, vector=vector)
    assert_close(got, want, dtype)
    if cuda_device is not None:
        # ..., VECTOR, SPLIT[, TILE_M, TILE_N]> (two splits)
        assert any(template_args(name)[3:5] == [str(vector).lower(), "true"] for name, _, _ in cuda_device.launches
                   if "_igemm<" in name)


@HALF_DTYPES
@MMA_TILE_SHAPES
@pytest.mark.parametrize("cg,r,strides,splits", [(8, 3, (1, 1), None), (8, 3, (2, 2), 2), (72, 1, (1, 1), None),
                                                 (72, 1, (1, 1), 2)],
                         ids=["3x3-s1", "3x3-s2-split", "1x1-kernel", "1x1-kernel-split"])
def test_cuda_tile_shapes(cuda_device, rng, dtype, tile, cg, r, strides, splits):
    """Each mma.sync tile shape, forced, matches the NumPy backend: M = 72 taps x input channels
    and N = 72 output channels (a full and a partial 64-wide tile, one partial 128-wide one),
    several k-tiles of positions, a split reduction, the general and the 1x1 kernel; the launch
    runs that shape's instantiation with its threads."""
    got, want, g = run_cuda(rng, dtype, "NHWC", 2, 9, 10, 1, cg, 72, r, r, strides, "SAME", path="tiled",
                            splits=splits, tile=tile)
    assert_close(got, want, dtype)
    if cuda_device is not None:  # the host stand-in records its launches
        (name, grid, block), = [launch for launch in cuda_device.launches if "_igemm<" in launch[0]]
        assert ("_1x1_igemm<" in name) == (r == 1)
        assert template_args(name)[5:] == ([] if tile == (128, 128) else [str(tile[0]), str(tile[1])])
        assert block == (ig.mma_tile_threads(tile),) and grid[:2] == (ig.ceil_div(72, tile[0]), ig.ceil_div(72, tile[1]))


def test_split_targets_scale_with_the_tile():
    """A 4-warp tile's split reduction aims at twice the CTAs, each over twice the k-tiles: the
    same warps and work per split as the 128 x 128 tile's.  ResNet-50's 3x3 64-channel filter
    gradient at batch 32 (M = 576, N = 64, 3136 k-tiles): 5 tiles x 51 splits of 8 warps by
    default, 5 x 98 of 4 warps in 128 x 64 tiles (the launcher's choice)."""
    assert ig.split_targets(256) == {"target_ctas": 256, "min_k_tiles": 16}
    assert ig.split_targets(128) == {"target_ctas": 512, "min_k_tiles": 32}
    launcher = cuda_launcher("conv2d_backprop_filter")
    g = conv_geometry("conv2d_backprop_filter", (32, 56, 56, 64), (3, 3, 64, 64), (32, 56, 56, 64), "NHWC", (1, 1),
                      "SAME", (1, 1), NO_PADS)
    m, n, _ = launcher._gemm_sizes(g)
    tile = ig.pick_tile(np.float16, ig.WMMA_HALF, True, m, n, arch=90)
    assert tile[:4] == (128, 64, 32, 128)
    assert launcher.split_count(g, np.float16, ig.WMMA_HALF)[0] == 51
    assert launcher.split_count(g, np.float16, ig.WMMA_HALF, tile=tile)[0] == 98


def test_cuda_vector_loads_need_aligned_arrays(cuda_device, rng):
    """A contiguous view that starts 4 bytes into an allocation cannot be read 16 bytes at a
    time: the automatic choice falls back to scalar loads, and forcing vector loads is refused."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    x, fshape, dy = make_problem(rng, np.float32, 2, 6, 7, 1, 8, 8, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    x_view = misaligned_on_gpu(x)
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)
    with pytest.raises(ValueError, match="16-byte aligned"):
        launcher.conv2d_backprop_filter(g, x_view, to_gpu(dy), path="tiled", vector=True)
    got = to_host(launcher.conv2d_backprop_filter(g, x_view, to_gpu(dy), path="tiled"))
    assert_close(got, expected_grad(x, fshape, dy, (1, 1), "SAME", (1, 1), NO_PADS), np.float32)
    if cuda_device is not None:
        tiled = [e for e, _, _ in cuda_device.launches if "_igemm<" in e]
        assert tiled[-1].rstrip(">").split(", ")[-2] == "false", tiled  # ..., VECTOR, SPLIT>


@pytest.mark.parametrize("pads", ASYMMETRIC_PADS, ids=pads_id)
@CUDA_PATHS
def test_cuda_explicit_padding_asymmetric(cuda_device, rng, pads, path):
    got, want, _ = run_cuda(rng, np.float64, "NHWC", 2, 4, 5, 1, 2, 3, 2, 3, (2, 1), "EXPLICIT", (1, 1), pads,
                            path=path)
    assert_close(got, want, np.float64)


@LAYOUTS
def test_cuda_public_api(cuda_device, rng, layout):
    """GPU arrays in, a GPU array out, through gradops.conv2d_backprop_filter with backend='cuda'
    and with use_cudnn_on_gpu=False (which selects our kernels)."""
    import cupy

    x, fshape, dy = make_problem(rng, np.float32, 2, 6, 7, 1, 3, 4, 3, 3, (1, 2), "SAME", (1, 1), NO_PADS)
    xl, dyl = to_layout(x, layout), to_layout(dy, layout)
    a = attrs(layout, (1, 2), "SAME")
    want = expected_grad(x, fshape, dy, (1, 2), "SAME", (1, 1), NO_PADS)
    for kw in (dict(backend="cuda"), dict(use_cudnn_on_gpu=False)):
        got = gradops.conv2d_backprop_filter(to_gpu(xl), fshape, to_gpu(dyl), **a, **kw)
        assert isinstance(got, cupy.ndarray) and got.dtype == np.float32
        assert_close(to_host(got), want, np.float32)


@empty_cases("x_shape")
def test_cuda_empty_gives_zeros(cuda_device, x_shape, fshape, dy_shape, kw, dtype):
    kw = {"strides": [1, 1, 1, 1], **kw}
    got = gradops.conv2d_backprop_filter(to_gpu(np.ones(x_shape, dtype)), fshape, to_gpu(np.ones(dy_shape, dtype)),
                                         backend="cuda", **kw)
    got = to_host(got)
    assert got.shape == fshape and got.dtype == np.dtype(dtype)
    assert not np.any(got.astype(np.float64))


@pytest.mark.parametrize("kind", NON_CONTIGUOUS)
@LAYOUTS
def test_cuda_non_contiguous_inputs(cuda_device, rng, kind, layout):
    """Non-contiguous GPU views give the same result as their contiguous copies, and the reference's."""
    import cupy

    x_shape, fshape, dy_shape = (2, 5, 6, 3), (2, 3, 3, 2), (2, 5, 3, 2)
    x = non_contiguous(rng, kind, shape_in(x_shape, layout), np.float32, to_gpu)
    dy = non_contiguous(rng, kind, shape_in(dy_shape, layout), np.float32, to_gpu)
    if kind == "strided-slice":  # views of device arrays, as a caller would slice them
        x = to_gpu(random_array(rng, tuple(2 * d for d in shape_in(x_shape, layout)), np.float32))[::2, ::2, ::2, ::2]
        dy = to_gpu(random_array(rng, tuple(2 * d for d in shape_in(dy_shape, layout)), np.float32))[::2, ::2, ::2, ::2]
    assert not (x.flags.c_contiguous or dy.flags.c_contiguous)
    a = attrs(layout, (1, 2), "SAME")
    got = gradops.conv2d_backprop_filter(x, fshape, dy, backend="cuda", **a)
    copy = gradops.conv2d_backprop_filter(cupy.ascontiguousarray(x), fshape, cupy.ascontiguousarray(dy),
                                          backend="cuda", **a)
    np.testing.assert_array_equal(to_host(got), to_host(copy))
    want = expected_grad(from_layout(to_host(x), layout), fshape, from_layout(to_host(dy), layout), (1, 2), "SAME",
                         (1, 1), NO_PADS)
    assert_close(to_host(got), want, np.float32)


@DTYPES
@pytest.mark.parametrize("path", ["tiled", pytest.param("direct", marks=pytest.mark.slow_on_host)])
def test_cuda_bitwise_deterministic_with_split_reduction(cuda_device, rng, dtype, path):
    """Two runs give bitwise equal results; the tiled shape (small filter, large image) takes the
    split reduction path on its own.  On the host the second run executes blocks and threads in
    another order: a race check."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    n, h, w = (4, 48, 40) if cuda_device is None else (2, 32, 32)  # the host simulates every thread
    x, fshape, dy = make_problem(rng, dtype, n, h, w, 1, 8, 16, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)
    if path == "tiled":
        from gradops.backends.cuda._conv_igemm import math_kind

        assert launcher.split_count(g, np.dtype(dtype), math_kind(dtype))[0] > 1
    xg, dyg = to_gpu(x), to_gpu(dy)
    first = to_host(launcher.conv2d_backprop_filter(g, xg, dyg, path=path))
    if cuda_device is not None:
        cuda_device.seed += 1
    second = to_host(launcher.conv2d_backprop_filter(g, xg, dyg, path=path))
    np.testing.assert_array_equal(first.view(np.uint8), second.view(np.uint8))
    assert_close(first, expected_grad(x, fshape, dy, (1, 1), "SAME", (1, 1), NO_PADS), dtype)


def test_cuda_allow_tf32(cuda_device, rng):
    """float32 is exact by default; with allow_tf32 the tiled kernel uses TF32 tensor cores
    (10-bit mantissa products): still close to the reference, but not bitwise the exact result."""
    launcher = cuda_launcher("conv2d_backprop_filter")
    x, fshape, dy = make_problem(rng, np.float32, 2, 20, 20, 1, 32, 32, 3, 3, (1, 1), "SAME", (1, 1), NO_PADS)
    # The NumPy backend in float64 as the reference (checked against brute-force loops above).
    want = gradops.conv2d_backprop_filter(x.astype(np.float64), fshape, dy.astype(np.float64),
                                          **attrs("NHWC", (1, 1), "SAME"), backend="numpy")
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", (1, 1), "SAME", (1, 1), NO_PADS)
    exact = to_host(launcher.conv2d_backprop_filter(g, to_gpu(x), to_gpu(dy), path="tiled"))
    assert_close(exact, want, np.float32)
    with gradops.options(allow_tf32=True):
        tf32 = to_host(launcher.conv2d_backprop_filter(g, to_gpu(x), to_gpu(dy), path="tiled"))
    scale = float(np.max(np.abs(want)))
    # TF32 keeps 10 of float32's 23 mantissa bits: products are off by up to ~2**-11 relative.
    assert float(np.max(np.abs(tf32 - want))) <= 1e-2 * scale
    assert not np.array_equal(tf32, exact)


def check_tf32(rng, case):
    """check_tf32_rounding of the tiled kernel on one TF32_CASES problem."""
    n, h, w, groups, cg, og, r, s, strides = case
    x, fshape, dy = make_problem(rng, np.float32, n, h, w, groups, cg, og, r, s, strides, "SAME", (1, 1), NO_PADS)
    g = conv_geometry("conv2d_backprop_filter", x.shape, fshape, dy.shape, "NHWC", strides, "SAME", (1, 1), NO_PADS)
    check_tf32_rounding(
        lambda operand: gradops.conv2d_backprop_filter(operand(x).astype(np.float64), fshape,
                                                       operand(dy).astype(np.float64),
                                                       **attrs("NHWC", strides, "SAME"), backend="numpy"),
        lambda: to_host(cuda_launcher("conv2d_backprop_filter").conv2d_backprop_filter(g, to_gpu(x), to_gpu(dy),
                                                                                       path="tiled")))


@TF32_CASES
def test_cuda_tf32_is_exact_float_math_on_rounded_operands(cuda_device, rng, case):
    """With allow_tf32 the tiled kernel's products are those of its operands rounded to TF32,
    summed in float32 (check_tf32)."""
    check_tf32(rng, case)


@pytest.mark.parametrize("edits", [
    # the loaders without cvt.rna.tf32: the tensor cores truncate (the host model as they do)
    (("chunk[v] = __uint_as_float(ptx::round_tf32(__float_as_uint(chunk[v])));", "chunk[v] = chunk[v];"),),
    # the multistage loader rounds only A's chunks
    (("                    round_own_chunks<MapB, LayoutB>(Bs[read]);\n", "\n"),),
    # A's one-element reads of the [k][row] tile with registers 1 and 2 swapped
    (("kk + t + 4 * (r / 2))]);", "kk + t + 4 * (r % 2))]);"),),
], ids=["tf32-truncates", "tf32-b-not-rounded", "tf32-a-fragment-registers-swapped"])
def test_planted_tf32_bugs_fail_the_comparison(monkeypatch, tmp_path, rng, edits):
    """Bugs planted in mma_cta's TF32 path fail check_tf32."""
    check_planted_tf32_bug(monkeypatch, tmp_path, edits, lambda: check_tf32(rng, TF32_PLANTED_CASE))


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("path", ["tiled", "direct"])
def test_cuda_more_than_2_31_elements(path):
    """An input of more than 2**31 elements (float16, ~4.3 GB): channels past the 2**31-th element
    are reduced correctly (checked against cupy sums of single channels)."""
    import cupy

    launcher = cuda_launcher("conv2d_backprop_filter")
    n, h, w, c = 2, 1024, 1024, 1025  # 2 * 1024 * 1024 * 1025 > 2**31
    assert n * h * w * c > 2**31
    x = cupy.random.default_rng(1).standard_normal((n, h, w, c), dtype=cupy.float32).astype(cupy.float16)
    dy = cupy.random.default_rng(2).standard_normal((n, h, w, 2), dtype=cupy.float32).astype(cupy.float16)
    g = conv_geometry("conv2d_backprop_filter", x.shape, (1, 1, c, 2), dy.shape, "NHWC", (1, 1), "VALID", (1, 1),
                      NO_PADS)
    got = launcher.conv2d_backprop_filter(g, x, dy, path=path)
    for ch in (0, 517, c - 1):
        for k in (0, 1):
            terms = x[..., ch].astype(cupy.float64) * dy[..., k].astype(cupy.float64)
            want = float(terms.sum())
            # float16 rounding of the result (2**-11 relative) plus float32 accumulation error.
            bound = 2.0**-10 * abs(want) + 1e-5 * float(cupy.abs(terms).sum())
            assert abs(float(got[0, 0, ch, k]) - want) <= bound, (ch, k)
    del x, dy


@pytest.mark.parametrize("text,replacement", [
    ("static_cast<unsigned>(w0 + e.col) < static_cast<unsigned>(cols_in))", "true)"),
    ("if (j0 + row < j_end && channel < depth)", "if (channel < depth)"),
    ("if (more) store(buf ^ 1);", "if (more) store(buf);"),
    ("tap = tap0 + wn + 8 * jn + 2 * t + r % 2;", "tap = tap0 + wn + 8 * jn + 2 * t + r / 2;"),
    ("&dys[buf][kk + 8 * (matrix / 2) + row][wm + 16 * i + 8 * (matrix % 2)]",
     "&dys[buf][kk + 8 * (matrix % 2) + row][wm + 16 * i + 8 * (matrix / 2)]"),
    ("const int j_end = static_cast<int>(min(reduction, (split + 1) * split_size));",
     "const int j_end = static_cast<int>(min(reduction, (split + 2) * split_size));"),
    ("e.offset = (e.row * cols_in + e.col) * CIN + c;", "e.offset = (e.row * cols_in + e.col) * CIN;"),
], ids=["column-bounds-dropped", "out-backprop-rows-past-the-split",
        "double-buffer-overwritten", "fragment-tap-mapping", "ldmatrix-a-matrices-swapped", "splits-overlap",
        "tap-channel-dropped"])
def test_planted_few_channel_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement):
    """Bugs planted in the few-channel kernel's gather, masks, double buffer, fragments and
    split ranges give wrong results on a padded, strided problem with partial tiles and two splits
    of several k-tiles each."""
    planted_host_device(monkeypatch, tmp_path, "conv2d_backprop_filter.cu", (text, replacement), seed=5)
    got, want, _ = run_cuda(np.random.default_rng(5), np.float16, "NHWC", 2, 17, 19, 1, 3, 72, 5, 5, (2, 2), "SAME",
                            path="tiled", splits=2, few_channels=True)
    with pytest.raises(AssertionError):
        assert_close(got, want, np.float16)


@pytest.mark.parametrize("pad", [True, False], ids=["padded-rows", "planted-unpadded-rows"])
def test_few_channel_shared_memory_is_conflict_free(monkeypatch, tmp_path, pad):
    """The few-channel kernel's ldmatrix reads and 16-byte stores take the fewest wavefronts:
    its shared rows are 144 bytes (16 bytes of padding), so 8 rows of a matrix, or 8 lanes'
    stores to 8 rows, start 4 banks apart.  Planted 128-byte rows put them in the same banks:
    the count sees 8 wavefronts per ldmatrix matrix (the result stays right)."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    source_dir = None
    if not pad:
        cuda_host.planted_sources(tmp_path, "conv2d_backprop_filter.cu",
                                  ("constexpr int kFewFilterPad = 8;", "constexpr int kFewFilterPad = 0;"))
        source_dir = tmp_path
    device = cuda_host.HostDevice(order="shuffled", seed=3, source_dir=source_dir).install(monkeypatch)
    launcher = cuda_launcher("conv2d_backprop_filter")
    kernels = device.host_kernels(launcher.SOURCE, launcher._few_channels_name(np.float16, 3))  # count afresh
    for kind in kernels.SHARED_KINDS:
        kernels.shared_stats(reset=True, kind=kind)
    got, want, _ = run_cuda(np.random.default_rng(3), np.float16, "NHWC", 2, 9, 11, 1, 3, 72, 5, 5, (2, 2), "SAME",
                            path="tiled", few_channels=True)
    assert_close(got, want, np.float16)
    reads, writes = (kernels.shared_stats(kind=kind) for kind in ("ldmatrix", "st_shared_16"))
    assert reads["accesses"] > 0 and writes["accesses"] > 0
    if pad:
        assert reads["wavefronts"] == reads["ideal"] and writes["wavefronts"] == writes["ideal"], (reads, writes)
    else:
        assert reads["wavefronts"] == 8 * reads["ideal"] and writes["wavefronts"] > writes["ideal"], (reads, writes)


def _many_splits(dtype, few_channels: bool):
    """The filter gradient of a 2 x 40 x 40 image (3,200 positions: 100 k-tiles of 32) split 50
    ways (60 asked for, 2 k-tiles each): split_reduce's batch of 32 splits, two whole tail
    batches of 8 and a partial one."""
    args = (dtype, "NHWC", 2, 40, 40, 1, 3, 16, 3, 3, (1, 1), "SAME")
    return run_cuda(np.random.default_rng(9), *args, path="tiled", splits=60, few_channels=few_channels)


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16-few-channels", "float32-general"])
def test_cuda_split_reduce_many_splits(cuda_device, dtype):
    """split_reduce sums 50 (58) splits (a batch, whole and partial tail batches) to the reference."""
    few = np.dtype(dtype) == np.float16
    got, want, g = _many_splits(dtype, few)
    assert_close(got, want, dtype)
    if cuda_device is not None:
        names = [e for e, _, _ in cuda_device.launches]
        assert "split_reduce<" in names[-1] and ("_few_channels<" in names[-2]) == few, names
    launcher = cuda_launcher("conv2d_backprop_filter")
    splits = (launcher.few_channels_split_count(g, 60) if few else
              launcher.split_count(g, np.dtype(dtype), ig.math_kind(dtype, 90), 60))[0]
    assert splits == (50 if few else 58)  # float32's SIMT k-tiles are 8 positions: 400 of them, 7 per split


def _divisor_problem(dtype):
    """(CUDA result, NumPy result) of the host-divisor tests' problem on the tiled kernel: 24
    input channels, a 3 x 2 filter, out_backprop 5 x 7 (four distinct divisors)."""
    got, want, _ = run_cuda(np.random.default_rng(4), dtype, "NHWC", 2, 10, 14, 1, 24, 16, 3, 2, (2, 2), "SAME",
                            path="tiled")
    return got, want


def _check_planted_on_divisor_problem(monkeypatch, tmp_path, edit, dtype):
    """With ``edit`` planted in igemm_tiles.cuh, _divisor_problem's result must differ."""
    planted_host_device(monkeypatch, tmp_path, "igemm_tiles.cuh", edit, seed=4)
    with pytest.raises(AssertionError):
        got, want = _divisor_problem(dtype)
        assert_close(got, want, dtype)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=["float16", "float32", "float64"])
def test_host_divisor_problem_passes_unplanted(cuda_device, dtype):
    """The planted host-divisor and vector-staging tests' problem on the real kernel: correct."""
    got, want = _divisor_problem(dtype)
    assert_close(got, want, dtype)


@pytest.mark.parametrize("text,replacement", [
    ("::gradops::FastDiv::pinned(q_magic, q_shift, static_cast<int>((dims).out_cols))",
     "::gradops::FastDiv::pinned(p_magic, p_shift, static_cast<int>((dims).out_cols))"),
    ("::gradops::FastDiv::pinned(cg_magic, cg_shift, static_cast<int>((dims).filter_in_depth))",
     "::gradops::FastDiv::pinned(s_magic, s_shift, static_cast<int>((dims).filter_in_depth))"),
], ids=["columns-divided-by-rows", "channels-divided-by-filter-columns"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["float16", "float32"])
def test_planted_host_divisor_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement, dtype):
    """The general kernel divides by the launcher's FastDiv constants (input_div_args): a kernel
    that pairs a divisor with another's constants gives wrong results on _divisor_problem."""
    _check_planted_on_divisor_problem(monkeypatch, tmp_path, (text, replacement), dtype)


@pytest.mark.parametrize("text,replacement", [
    ("uint4 v = make_uint4(0u, 0u, 0u, 0u);",
     "uint4 v = make_uint4(0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u);"),
    ("        *reinterpret_cast<uint4*>(dst) = v;\n", "        if (src.ok) *reinterpret_cast<uint4*>(dst) = v;\n"),
], ids=["padding-not-zero", "padding-keeps-the-last-tile's-chunk"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
def test_planted_vector_staging_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement, dtype):
    """The register-staged loader's 16-byte chunks (Loader::fetch_vector, the SIMT kernels'
    VECTOR path): a chunk without a source (the SAME padding of _divisor_problem) must be
    stored as zeros, every tile."""
    _check_planted_on_divisor_problem(monkeypatch, tmp_path, (text, replacement), dtype)


@pytest.mark.parametrize("text,replacement", [
    ("for (int u = 0; u < kSplitReduceBatch; ++u) v[u] = p[(s + u) * total];",
     "for (int u = 0; u < kSplitReduceBatch; ++u) v[u] = p[(s + u + 1) * total];"),
    ("for (; s < splits; s += kSplitReduceTail) {", "for (; s < splits; s += kSplitReduceTail + 1) {"),
    ("                if (s + u < splits) sum += v[u];", "                if (s + u + 1 < splits) sum += v[u];"),
], ids=["batch-reads-one-split-on", "tail-skips-a-split", "tail-drops-the-last-split"])
def test_planted_split_reduce_bugs_fail_the_comparison(monkeypatch, tmp_path, text, replacement):
    """Bugs planted in split_reduce's batch and tail loops give wrong results on 50 splits."""
    planted_host_device(monkeypatch, tmp_path, "igemm_tiles.cuh", (text, replacement), seed=9)
    got, want, _ = _many_splits(np.float16, True)
    with pytest.raises(AssertionError):
        assert_close(got, want, np.float16)
