"""Helpers and case tables shared by the conv2d_backprop_filter and conv2d_backprop_input tests.

Layout/attribute builders, the tiny-shape hypothesis strategy, the non-contiguous view maker,
and the parameter lists both test files run through.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import reference
from conftest import FLOAT_DTYPES, random_array, run_forced_cases
from gradops.backends.cuda import _conv_igemm

NO_PADS = ((0, 0), (0, 0))

GRID_ARGS = "layout,h,w,groups,cg,og,r,s,strides,padding,dilations,pads"


def layout_attr(rows, cols, layout, fill=1):
    """A 4-entry strides/dilations list with (rows, cols) in the spatial slots of ``layout``."""
    return [{"N": fill, "H": rows, "W": cols, "C": fill}[d] for d in layout]


def attrs(layout="NHWC", strides=(1, 1), padding="VALID", dilations=(1, 1), pads=NO_PADS):
    """gradops/TF keyword attributes for one convolution, ``data_format`` = ``layout``."""
    kw = {
        "strides": layout_attr(*strides, layout),
        "padding": padding,
        "data_format": layout,
        "dilations": layout_attr(*dilations, layout),
    }
    if padding == "EXPLICIT":
        per_dim = {"N": (0, 0), "H": pads[0], "W": pads[1], "C": (0, 0)}
        kw["explicit_paddings"] = [p for d in layout for p in per_dim[d]]
    return kw


def to_layout(x, layout):
    """NHWC array -> ``layout``."""
    return x if layout == "NHWC" else x.transpose(0, 3, 1, 2)


def from_layout(x, layout):
    """``layout`` array -> NHWC."""
    return x if layout == "NHWC" else x.transpose(0, 2, 3, 1)


def shape_in(shape_nhwc, layout):
    """An NHWC shape reordered to ``layout``."""
    return tuple(shape_nhwc["NHWC".index(d)] for d in layout)


def out_size(in_size, filter_size, stride, dilation, padding, pads):
    return reference.window(in_size, filter_size, stride, dilation, padding, pads)[0]


def dtype_id(dtype):
    return np.dtype(dtype).name


# --------------------------------------------------------------------------- case tables

LAYOUTS = pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_id)

STRIDES = [(1, 1), (2, 2), (3, 3), (1, 2)]
GROUPS = [1, 2, 3]


def geometry_grid(paddings, dilations, layouts, sizes):
    """Every padding x stride x dilation x groups; ``sizes(i, groups)`` gives case i's (h, w, r, s, cg, og)."""
    cases = []
    for i, ((padding, pads), strides, dil, groups) in enumerate(
            itertools.product(paddings, STRIDES, dilations, GROUPS)):
        h, w, r, s, cg, og = sizes(i, groups)
        layout = layouts[(i // 3) % 2]
        ident = (f"{padding}{pads if padding == 'EXPLICIT' else ''}-s{strides}-d{dil}-g{groups}"
                 f"-{layout}-x{h}x{w}-f{r}x{s}").replace(" ", "")
        cases.append(pytest.param(layout, h, w, groups, cg, og, r, s, strides, padding, dil, pads, id=ident))
    return cases


REPRESENTATIVE = {
    "same-s1": dict(h=5, w=6, groups=1, cg=3, og=2, r=3, s=3, strides=(1, 1), padding="SAME"),
    "valid-s2-d2-g2": dict(h=7, w=6, groups=2, cg=2, og=2, r=2, s=3, strides=(2, 2), padding="VALID",
                           dilations=(2, 1)),
    "explicit-s12-g3": dict(h=4, w=7, groups=3, cg=1, og=2, r=3, s=2, strides=(1, 2), padding="EXPLICIT",
                            pads=((2, 0), (1, 3))),
    "same-s3-d12": dict(h=6, w=5, groups=1, cg=4, og=3, r=2, s=2, strides=(3, 3), padding="SAME",
                        dilations=(1, 2)),
}

ALL_REPRESENTATIVE = pytest.mark.parametrize("case", list(REPRESENTATIVE), ids=str)

ASYMMETRIC_PADS = [((0, 3), (2, 0)), ((3, 0), (0, 0)), ((5, 4), (4, 6)), ((0, 0), (7, 1)), ((1, 2), (2, 1))]


def pads_id(pads):
    return f"pads{pads}".replace(" ", "")


# (input shape, filter shape, out_backprop shape, extra attributes), all with an empty dimension.
EMPTY_CASES = [
    pytest.param((0, 4, 4, 2), (3, 3, 2, 3), (0, 4, 4, 3), dict(padding="SAME"), id="batch0"),
    # Input depth 0 forms no groups: consistent only with out_depth 0 (else refused, see
    # test_validation.test_input_depth_0_forms_no_groups).
    pytest.param((2, 4, 4, 0), (3, 3, 1, 0), (2, 2, 2, 0), dict(padding="VALID"), id="in_depth0"),
    pytest.param((2, 4, 4, 2), (3, 3, 2, 0), (2, 4, 4, 0), dict(padding="SAME"), id="out_depth0"),
    pytest.param((2, 4, 4, 4), (3, 3, 2, 0), (2, 2, 2, 0), dict(padding="VALID"), id="out_depth0-g2"),
    pytest.param((2, 2, 4, 2), (5, 1, 2, 3), (2, 0, 2, 3), dict(padding="VALID", strides=[1, 2, 2, 1]),
                 id="valid-rows0-truncated"),
    pytest.param((1, 2, 2, 1), (3, 3, 1, 2), (1, 0, 0, 2), dict(padding="VALID"), id="valid-input-smaller-than-filter"),
    pytest.param((2, 0, 3, 2), (1, 1, 2, 2), (2, 0, 3, 2), dict(padding="SAME"), id="rows0"),
]



def empty_cases(first):
    """Parametrize ``first`` (the input shape), fshape, dy_shape, kw over EMPTY_CASES, and dtype."""
    def decorate(test):
        test = pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16], ids=dtype_id)(test)
        return pytest.mark.parametrize(f"{first},fshape,dy_shape,kw", EMPTY_CASES)(test)
    return decorate


# How a sizes argument (filter_sizes / input_sizes) is passed.
SIZE_TYPES = [
    pytest.param(list, id="list"),
    pytest.param(tuple, id="tuple"),
    pytest.param(lambda s: np.array(s, np.int32), id="int32"),
    pytest.param(lambda s: np.array(s, np.int64), id="int64"),
]

TF_CASES = pytest.mark.parametrize(
    "padding,pads,strides",
    [("SAME", NO_PADS, (2, 2)), ("VALID", NO_PADS, (1, 2)), ("EXPLICIT", ((2, 0), (1, 3)), (3, 1))],
    ids=["same", "valid", "explicit"])


# --------------------------------------------------------------------------- property tests


@st.composite
def conv_problems(draw):
    """Any valid attribute combination on tiny shapes."""
    padding = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
    pads = NO_PADS
    if padding == "EXPLICIT":
        pads = tuple(tuple(draw(st.integers(0, 4)) for _ in range(2)) for _ in range(2))
    return dict(
        layout=draw(st.sampled_from(["NHWC", "NCHW"])),
        dtype=draw(st.sampled_from(FLOAT_DTYPES)),
        n=draw(st.integers(1, 2)), h=draw(st.integers(1, 7)), w=draw(st.integers(1, 7)),
        groups=draw(st.integers(1, 3)), cg=draw(st.integers(1, 2)), og=draw(st.integers(1, 2)),
        r=draw(st.integers(1, 3)), s=draw(st.integers(1, 3)),
        strides=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        dilations=(draw(st.integers(1, 3)), draw(st.integers(1, 3))),
        padding=padding, pads=pads,
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@st.composite
def cuda_conv_problems(draw):
    """conv_problems for the tiled CUDA kernels: also channel counts that allow 16-byte loads
    (multiples of 2, 4 and 8 elements) and images that span several row tiles."""
    p = draw(conv_problems())
    p.update(h=draw(st.integers(1, 12)), w=draw(st.integers(1, 12)),
             cg=draw(st.sampled_from([1, 2, 3, 4, 8, 16])), og=draw(st.sampled_from([1, 2, 4, 5, 8, 16])))
    return p


def valid_truncation(p):
    """False where TF's output size would be negative (in + pads - eff + stride <= -stride): an error."""
    for size, f, stride, d, pd in ((p["h"], p["r"], p["strides"][0], p["dilations"][0], p["pads"][0]),
                                   (p["w"], p["s"], p["strides"][1], p["dilations"][1], p["pads"][1])):
        if p["padding"] != "SAME" and size + sum(pd) - ((f - 1) * d + 1) + stride <= -stride:
            return False
    return True


def seeded(p):
    """(rng seeded from ``p["seed"]``, the rest of ``p``) for a drawn conv_problems case."""
    p = dict(p)
    return np.random.default_rng(p.pop("seed")), p


def drawn_problems(max_examples, strategy=None):
    """Hypothesis decorator: the test gets ``max_examples`` draws of ``strategy`` (default
    conv_problems), no deadline.  Function-scoped fixtures (cuda_device) are set up once and
    shared by the examples, which is what the tests using them want."""
    def decorate(test):
        return settings(max_examples=max_examples, deadline=None,
                        suppress_health_check=[HealthCheck.function_scoped_fixture])(
            given(conv_problems() if strategy is None else strategy)(test))
    return decorate


def check_drawn(check, p):
    """Run ``check(rng, **p)`` on a drawn case, skipping the ones TF rejects."""
    assume(valid_truncation(p))
    rng, p = seeded(p)
    check(rng, **p)


# --------------------------------------------------------------------------- non-contiguous views

NON_CONTIGUOUS = ["strided-slice", "fortran", "negative-strides", "transposed-view"]


def non_contiguous(rng, kind, shape, dtype, place=lambda a: a):
    """A random array of ``shape`` that is a non-C-contiguous view of the given kind.

    ``place`` moves the underlying contiguous array first (``to_gpu``), so the view is taken
    where the op reads it: copying a view to a GPU would make most kinds contiguous again
    (CuPy keeps only a Fortran order).
    """
    if kind == "strided-slice":
        return place(random_array(rng, tuple(2 * d for d in shape), dtype))[::2, ::2, ::2, ::2]
    if kind == "fortran":
        return place(random_array(rng, shape[::-1], dtype)).T
    if kind == "negative-strides":
        return place(random_array(rng, shape, dtype))[::-1, ::-1, ::-1, ::-1]
    # transposed-view: rows and columns swapped in memory (neither C nor Fortran order)
    return place(random_array(rng, (shape[0], shape[2], shape[1], shape[3]), dtype)).transpose(0, 2, 1, 3)


# --------------------------------------------------------------------------- GPU helpers (cuda backend)

#: Kernel paths of the conv launchers: the automatic choice, the direct fallback, the implicit GEMM.
CUDA_PATHS = pytest.mark.parametrize("path", [None, "direct", "tiled"], ids=["auto", "direct", "tiled"])


def cuda_launcher(op):
    """gradops.backends.cuda.<op> (the launcher module, not the package's same-named function)."""
    import importlib

    return importlib.import_module(f"gradops.backends.cuda.{op}")


#: The half types: the tensor-core (mma.sync) kernels' dtypes, and with them their tile shapes.
HALF_DTYPES = pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=dtype_id)
#: Every mma.sync tile shape (BM, BN) of the tiled conv kernels.
MMA_TILE_SHAPES = pytest.mark.parametrize("tile", _conv_igemm.MMA_TILES, ids=lambda t: f"{t[0]}x{t[1]}")


#: Tiny problems (n, h, w, groups, cg, og, r, s, strides, padding): maps of 1-5 rows and
#: columns, 1-16 channels a group, pointwise and grouped, where rows, channel runs or a GEMM
#: dimension are shorter than a kernel's vectors or tiles and a load that is right on larger
#: problems reaches past a tensor's end.
TINY_PROBLEMS = ((1, 1, 1, 1, 1, 1, 1, 1, (1, 1), "VALID"), (2, 1, 3, 1, 3, 2, 3, 3, (1, 1), "SAME"),
                 (1, 3, 2, 2, 2, 3, 3, 1, (2, 2), "SAME"), (1, 2, 5, 1, 8, 8, 1, 1, (1, 1), "VALID"),
                 (1, 5, 1, 1, 4, 16, 3, 3, (2, 1), "SAME"), (2, 2, 3, 4, 1, 1, 3, 3, (1, 1), "SAME"),
                 (1, 3, 3, 1, 16, 8, 5, 5, (1, 1), "SAME"), (1, 1, 2, 1, 2, 4, 1, 1, (1, 1), "VALID"))
#: Forced choices of the conv launchers for the tiny problems, with the dtypes each takes (each
#: launcher refuses, with a ValueError, a problem it cannot run): the implicit GEMM with and
#: without 16-byte loads, a split, the 1x1 kernel, the smallest mma.sync tile; the direct
#: kernels; the few-channel kernels (the input gradient's direct one, the filter gradient's
#: tiled one).
TINY_CHOICES = {"auto": ({}, FLOAT_DTYPES), "direct": (dict(path="direct"), FLOAT_DTYPES),
                "tiled": (dict(path="tiled"), FLOAT_DTYPES), "tiled-scalar": (dict(path="tiled", vector=False), FLOAT_DTYPES),
                "tiled-vector": (dict(path="tiled", vector=True), FLOAT_DTYPES),
                "tiled-split": (dict(path="tiled", splits=2), FLOAT_DTYPES),
                "tiled-pointwise": (dict(path="tiled", pointwise=True), FLOAT_DTYPES),
                "tiled-64x64": (dict(path="tiled", tile=(64, 64)), FLOAT_DTYPES[:2])}
TINY_FEW_CHANNELS = {"conv2d_backprop_input": ("direct-few", dict(path="direct", few_channels=True), FLOAT_DTYPES),
                     "conv2d_backprop_filter": ("tiled-few", dict(path="tiled", few_channels=True), FLOAT_DTYPES[:2])}


def run_tiny_problems(choice: str, forced: dict, run) -> None:
    """``run(problem)`` for each of :data:`TINY_PROBLEMS` (conftest.run_forced_cases: a forced
    kernel that cannot run one skips it, and runs at least one)."""
    run_forced_cases(choice, TINY_PROBLEMS, forced, run)


def tiny_choices(op):
    """pytest parameters (choice name, forced keywords, dtype) of :data:`TINY_CHOICES` and
    ``op``'s few-channel kernel."""
    name, forced, dtypes = TINY_FEW_CHANNELS[op]
    choices = dict(TINY_CHOICES, **{name: (forced, dtypes)})
    return pytest.mark.parametrize("choice,forced,dtype", [
        pytest.param(choice, forced, dtype, id=f"{choice}-{dtype_id(dtype)}")
        for choice, (forced, dtypes) in choices.items() for dtype in dtypes])

def conv_geometry(op, input_shape, filter_shape, out_backprop_shape, layout, strides, padding, dilations, pads):
    """The validated geometry the public op would build (shapes in ``layout``, filter HWIO)."""
    from gradops._geometry import conv2d_geometry

    a = attrs(layout, strides, padding, dilations, pads)
    return conv2d_geometry(op, input_shape, filter_shape, out_backprop_shape, a["strides"], padding,
                           a.get("explicit_paddings", ()), layout, a["dilations"])


def round_tf32(a) -> np.ndarray:
    """float32 values rounded as cvt.rna.tf32.f32 rounds them (PTX ISA: to 10 mantissa bits,
    ties away from zero; Inf and NaN unchanged), as float32, written from the ISA's definition
    (integer rounding of the bit pattern, not the kernels' or the host model's code)."""
    a = np.ascontiguousarray(a, np.float32)
    bits = a.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(np.isfinite(a), rounded.view(np.float32), a)


def truncate_tf32(a) -> np.ndarray:
    """float32 values with the 13 low mantissa bits cleared: what the tensor cores read of an
    unrounded TF32 operand."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def check_tf32_rounding(reference_on, run_tiled):
    """A TF32 result ``run_tiled()`` (run with allow_tf32) against ``reference_on(round_tf32)``
    (float64 math on the operands rounded as the ISA rounds), to float32's tolerance; and that
    this check tells rounding from truncation (``reference_on(truncate_tf32)`` fails it).
    ``reference_on(operand)``: the NumPy backend's result on ``operand`` of each input tensor."""
    import gradops
    from conftest import assert_close

    want = reference_on(round_tf32)
    with pytest.raises(AssertionError):
        assert_close(reference_on(truncate_tf32), want, np.float32)
    with gradops.options(allow_tf32=True):
        got = run_tiled()
    assert_close(got, want, np.float32)


#: The problem the planted TF32 bugs run (TF32_CASES' first).
TF32_PLANTED_CASE = (2, 20, 20, 1, 32, 32, 3, 3, (1, 1))


def check_planted_tf32_bug(monkeypatch, tmp_path, edits, check):
    """``check()`` fails on the host model built from kernel sources with ``edits`` (text,
    replacement pairs) made in igemm_tiles.cuh (skips where the host model cannot build)."""
    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(reason)
    cuda_host.planted_sources(tmp_path, "igemm_tiles.cuh", *edits)
    cuda_host.HostDevice(order="shuffled", seed=6, source_dir=tmp_path).install(monkeypatch)
    with pytest.raises(AssertionError):
        check()


#: TF32 cases of the tiled kernels (sizes as make_problem's: batch, rows, cols, groups, channels
#: per group in, out, filter rows, cols, strides): 16-byte chunks on the cp.async pipeline (32
#: channels: [k][row] tiles read one element per lane in wgrad, [row][k] tiles by ldmatrix in
#: dgrad), the register-staged scalar path (6 and 5 channels), stride 2 (dgrad's phases) and a
#: 1x1 filter (the plain-GEMM kernels).
TF32_CASES = pytest.mark.parametrize("case", [
    (2, 20, 20, 1, 32, 32, 3, 3, (1, 1)),
    (2, 11, 9, 1, 6, 5, 3, 3, (1, 1)),
    (2, 13, 12, 1, 16, 24, 3, 3, (2, 2)),
    (2, 9, 10, 1, 32, 48, 1, 1, (1, 1)),
], ids=["vector", "scalar", "stride2", "1x1"])
