"""Helpers and case grids shared by the depthwise_conv2d_native_backprop_input and
depthwise_conv2d_native_backprop_filter tests.

The depthwise tests' names for conv_cases' layout builders, the grids of geometry and padding
both gradients run through, and the tiny-shape hypothesis strategy.  Shapes are NHWC
(``x_shape = (batch, rows, cols, in_depth)``) and converted to ``data_format`` at the call.
"""

from __future__ import annotations

import pytest
from hypothesis import assume
from hypothesis import strategies as st

from conftest import FLOAT_DTYPES
from conv_cases import NO_PADS, attrs, dtype_id, layout_attr, out_size, shape_in, to_layout

DTYPE_IDS = [dtype_id(d) for d in FLOAT_DTYPES]


def attr4(rows, cols, data_format):
    """A strides/dilations attribute in ``data_format`` order."""
    return layout_attr(rows, cols, data_format)


def explicit8(pads, data_format):
    """((top, bottom), (left, right)) as TF's 8-entry explicit_paddings in ``data_format`` order."""
    return attrs(data_format, padding="EXPLICIT", pads=pads)["explicit_paddings"]


def to_format(x, data_format):
    """An NHWC array (or shape tuple) in ``data_format``."""
    return shape_in(x, data_format) if isinstance(x, tuple) else to_layout(x, data_format)


def out_hw(in_hw, filt_hw, strides, dilations, padding, pads):
    """Output (rows, cols) from the reference's window()."""
    return tuple(out_size(in_hw[i], filt_hw[i], strides[i], dilations[i], padding, pads[i]) for i in range(2))


def _marks(*marks):
    def apply(test):
        for mark in reversed(marks):
            test = mark(test)
        return test
    return apply


#: Every filter size x stride x dilation x padding combination (test arguments filt_hw,
#: strides, dilations, padding, pads).
geometry_grid = _marks(
    pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((2, 0), (1, 3)))],
                            ids=["SAME", "VALID", "EXPLICIT"]),
    pytest.mark.parametrize("dilations", [(1, 1), (2, 2), (1, 2)], ids=lambda d: f"dil{d[0]}x{d[1]}"),
    pytest.mark.parametrize("strides", [(1, 1), (2, 2), (1, 2), (2, 1)], ids=lambda s: f"str{s[0]}x{s[1]}"),
    pytest.mark.parametrize("filt_hw", [(1, 1), (3, 3), (5, 5)], ids=lambda f: f"f{f[0]}x{f[1]}"),
)

#: VALID and asymmetric EXPLICIT padding in both layouts and every float dtype (test arguments
#: padding, pads, data_format, dtype).
padding_format_dtype_grid = _marks(
    pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=DTYPE_IDS),
    pytest.mark.parametrize("data_format", ["NHWC", "NCHW"]),
    pytest.mark.parametrize("padding,pads", [("VALID", NO_PADS), ("EXPLICIT", ((0, 3), (2, 1)))],
                            ids=["VALID", "EXPLICIT"]),
)

#: The adjoint identities' paddings in both layouts (test arguments padding, pads, data_format).
adjoint_grid = _marks(
    pytest.mark.parametrize("data_format", ["NHWC", "NCHW"]),
    pytest.mark.parametrize("padding,pads", [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 2), (0, 1)))],
                            ids=["SAME", "VALID", "EXPLICIT"]),
)


def adjoint_args(padding, pads, data_format):
    """The adjoint identities' attributes: strides (2, 1), dilations (1, 2)."""
    return attrs(data_format, strides=(2, 1), padding=padding, dilations=(1, 2), pads=pads)


@st.composite
def depthwise_cases(draw):
    """Tiny depthwise problems: any filter, stride, dilation, padding, layout and float dtype
    with a non-empty output (keyword arguments of the test files' ``run_case``)."""
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
