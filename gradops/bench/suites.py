"""Named benchmark suites: the layers whose gradients the report times.

A :class:`Case` is one op on one set of shapes and attributes, in one data format, with the
dtypes it is timed in.  Shapes are given NHWC (batch, rows, cols, depth) whatever the
layout; :meth:`Case.geometry` runs gradops' own validation, so a suite can only hold calls
the library accepts.  Fractional pooling is NHWC only (TF's op has no data_format).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .._dtypes import bfloat16
from .._geometry import (Conv2DGeometry, FractionalPoolGeometry, conv2d_geometry, fractional_max_pool_geometry,
                         fractional_pool_forward_geometry, fractional_pool_geometry, from_nhwc)

CONV_FILTER = "conv2d_backprop_filter"
CONV_INPUT = "conv2d_backprop_input"
DEPTHWISE_INPUT = "depthwise_conv2d_native_backprop_input"
DEPTHWISE_FILTER = "depthwise_conv2d_native_backprop_filter"
FRACTIONAL = "fractional_avg_pool_grad"
FRACTIONAL_MAX = "fractional_max_pool_grad"
#: The forward poolings (sequences given): the gradients' adjoints, and max pooling's orig_output.
FRACTIONAL_AVG_FORWARD = "fractional_avg_pool"
FRACTIONAL_MAX_FORWARD = "fractional_max_pool"
OPS = (CONV_FILTER, CONV_INPUT, DEPTHWISE_INPUT, DEPTHWISE_FILTER, FRACTIONAL, FRACTIONAL_MAX, FRACTIONAL_AVG_FORWARD,
       FRACTIONAL_MAX_FORWARD)
DEPTHWISE_OPS = (DEPTHWISE_INPUT, DEPTHWISE_FILTER)
#: The fractional pooling gradients (the static report's and the kernel A/Bs' pooling ops).
FRACTIONAL_OPS = (FRACTIONAL, FRACTIONAL_MAX)
FRACTIONAL_FORWARD_OPS = (FRACTIONAL_AVG_FORWARD, FRACTIONAL_MAX_FORWARD)
#: Every op whose case is a pooling (ratio, overlapping and sequences; NHWC only).
POOLING_OPS = FRACTIONAL_OPS + FRACTIONAL_FORWARD_OPS
#: Short names of the ops in plots and tables.
OP_SHORT = {CONV_FILTER: "dW", CONV_INPUT: "dX", DEPTHWISE_INPUT: "dw dX", DEPTHWISE_FILTER: "dw dW",
            FRACTIONAL: "frac avg", FRACTIONAL_MAX: "frac max", FRACTIONAL_AVG_FORWARD: "frac avg fwd",
            FRACTIONAL_MAX_FORWARD: "frac max fwd"}

DTYPES = {"float16": np.dtype(np.float16), "bfloat16": bfloat16, "float32": np.dtype(np.float32),
          "float64": np.dtype(np.float64)}
HALF_AND_SINGLE = ("float16", "bfloat16", "float32")
WITH_DOUBLE = HALF_AND_SINGLE + ("float64",)
LAYOUTS = ("NHWC", "NCHW")


@dataclass(frozen=True)
class Case:
    """One benchmarked call.

    ``input_shape`` is the forward input, NHWC; ``filter_shape`` is HWIO for the convolutions
    and [rows, cols, depth, multiplier] for depthwise; ``pads`` is ((pad_top, pad_bottom),
    (pad_left, pad_right)) when ``padding`` is EXPLICIT.  Fractional pooling (average and max)
    uses ``pooling_ratio``, ``overlapping`` and ``seed`` (its pooling sequences come from
    :func:`gradops.fractional_pooling_sequence`, pseudo-random, so a case is reproducible).
    """

    suite: str
    layer: str
    op: str
    input_shape: tuple[int, int, int, int]
    data_format: str = "NHWC"
    filter_shape: tuple[int, int, int, int] | None = None
    strides: tuple[int, int] = (1, 1)
    padding: str = "SAME"
    pads: tuple[tuple[int, int], tuple[int, int]] | None = None
    dilations: tuple[int, int] = (1, 1)
    pooling_ratio: float = 1.0
    overlapping: bool = False
    seed: int = 0
    dtypes: tuple[str, ...] = HALF_AND_SINGLE
    name: str | None = None  # label in reports; default built from layer, op and layout

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return f"{self.layer} {self.data_format}" if self.op not in POOLING_OPS else self.layer

    @property
    def batch(self) -> int:
        return self.input_shape[0]

    def with_batch(self, batch: int) -> "Case":
        return replace(self, input_shape=(batch,) + tuple(self.input_shape[1:]))

    # TF attribute lists, in data_format order ------------------------------------------

    def tf_strides(self) -> list[int]:
        return list(from_nhwc(1, self.strides[0], self.strides[1], 1, self.data_format))

    def tf_dilations(self) -> list[int]:
        return list(from_nhwc(1, self.dilations[0], self.dilations[1], 1, self.data_format))

    def tf_explicit_paddings(self) -> list[int]:
        if self.padding != "EXPLICIT":
            return []
        (top, bottom), (left, right) = self.pads
        per_dim = {"N": (0, 0), "H": (top, bottom), "W": (left, right), "C": (0, 0)}
        return [p for d in self.data_format for p in per_dim[d]]

    def input_tensor_shape(self) -> tuple[int, ...]:
        """The forward input's (= the input gradient's) shape in data_format."""
        return from_nhwc(*self.input_shape, self.data_format)

    # validated geometry ---------------------------------------------------------------

    def pooling_sequences(self) -> tuple[np.ndarray, np.ndarray]:
        from ..fractional_avg_pool import fractional_pooling_sequence

        _, rows, cols, _ = self.input_shape
        return (fractional_pooling_sequence(rows, self.pooling_ratio, pseudo_random=True, seed=self.seed),
                fractional_pooling_sequence(cols, self.pooling_ratio, pseudo_random=True, seed=self.seed + 1))

    def geometry(self) -> Conv2DGeometry | FractionalPoolGeometry:
        """gradops' validation of this call (raises InvalidArgumentError if it is not a valid one)."""
        if self.op in POOLING_OPS:
            rows, cols = self.pooling_sequences()
            n, _, _, c = self.input_shape
            out_shape = (n, len(rows) - 1, len(cols) - 1, c)
            rows, cols = [int(v) for v in rows], [int(v) for v in cols]
            if self.op in FRACTIONAL_FORWARD_OPS:
                return fractional_pool_forward_geometry(self.op, self.input_shape, rows, cols, self.overlapping)
            if self.op == FRACTIONAL_MAX:  # orig_output and out_backprop both have the output's shape
                return fractional_max_pool_geometry(self.op, self.input_shape, out_shape, out_shape, rows, cols,
                                                    self.overlapping)
            return fractional_pool_geometry(self.op, list(self.input_shape), out_shape, rows, cols, self.overlapping)
        depthwise = self.op in DEPTHWISE_OPS
        forward = conv2d_geometry(self.op, self.input_tensor_shape(), self.filter_shape, None,
                                  self.tf_strides(), self.padding, self.tf_explicit_paddings(), self.data_format,
                                  self.tf_dilations(), depthwise=depthwise)
        # Validate once more as the gradient op sees it (with out_backprop's shape given).
        return conv2d_geometry(self.op, self.input_tensor_shape(), self.filter_shape, forward.out_backprop_shape,
                               self.tf_strides(), self.padding, self.tf_explicit_paddings(), self.data_format,
                               self.tf_dilations(), depthwise=depthwise)


# --------------------------------------------------------------------------- builders


def _conv_pair(suite, layer, x, w, stride=1, padding="SAME", pads=None, dtypes=HALF_AND_SINGLE, layouts=LAYOUTS):
    """Both convolution gradients (filter and input) of one layer, in each layout."""
    cases = []
    for layout in layouts:
        for op in (CONV_FILTER, CONV_INPUT):
            cases.append(Case(suite, layer, op, x, layout, w, (stride, stride), padding, pads, dtypes=dtypes))
    return cases


def _resnet50(batch: int = 32) -> list[Case]:
    """ResNet-50 v1.5 (stride on the 3x3) at 224x224: the stem and every distinct layer shape."""
    s = "resnet50"
    cases = _conv_pair(s, "conv1 7x7/2 3->64", (batch, 224, 224, 3), (7, 7, 3, 64), stride=2)
    # (stage, input size, bottleneck width, input depth of the stage's first block)
    stages = (("conv2", 56, 64, 64), ("conv3", 28, 128, 256), ("conv4", 14, 256, 512), ("conv5", 7, 512, 1024))
    for stage, size, width, in_depth in stages:
        out_depth = 4 * width
        first_stride = 1 if stage == "conv2" else 2
        in_size = size * first_stride
        # First block: 1x1 reduce at the previous stage's size, (strided) 3x3, projection shortcut.
        cases += _conv_pair(s, f"{stage} 1x1 {in_depth}->{width} (block 1)", (batch, in_size, in_size, in_depth),
                            (1, 1, in_depth, width))
        if first_stride == 2:
            cases += _conv_pair(s, f"{stage} 3x3/2 {width}", (batch, in_size, in_size, width), (3, 3, width, width),
                                stride=2)
        cases += _conv_pair(s, f"{stage} 1x1/{first_stride} projection {in_depth}->{out_depth}",
                            (batch, in_size, in_size, in_depth), (1, 1, in_depth, out_depth), stride=first_stride)
        # The repeated blocks' layers (block 1's 3x3 and 1x1 expand have these shapes too at stride 1).
        cases += _conv_pair(s, f"{stage} 3x3 {width}", (batch, size, size, width), (3, 3, width, width),
                            dtypes=WITH_DOUBLE if stage == "conv5" else HALF_AND_SINGLE)
        cases += _conv_pair(s, f"{stage} 1x1 {width}->{out_depth}", (batch, size, size, width),
                            (1, 1, width, out_depth))
        cases += _conv_pair(s, f"{stage} 1x1 {out_depth}->{width}", (batch, size, size, out_depth),
                            (1, 1, out_depth, width))
    return cases


def _depthwise(suite, layer, batch, size, depth, kernel, stride, dtypes=HALF_AND_SINGLE):
    """Both depthwise gradients (input and filter) of one layer, multipliers 1 and 2, each layout."""
    cases = []
    for multiplier in (1, 2):
        for layout in LAYOUTS:
            for op in DEPTHWISE_OPS:
                cases.append(Case(suite, f"{layer} {size}x{size}x{depth} {kernel}x{kernel}/{stride} m{multiplier}",
                                  op, (batch, size, size, depth), layout, (kernel, kernel, depth, multiplier),
                                  (stride, stride), "SAME", dtypes=dtypes))
    return cases


def _mobilenetv2(batch: int = 32) -> list[Case]:
    """MobileNetV2's 3x3 depthwise layers at 224x224 input (expanded depth = 6 x bottleneck)."""
    layers = ((112, 32, 1), (112, 96, 2), (56, 144, 1), (56, 144, 2), (28, 192, 1), (28, 192, 2),
              (14, 384, 1), (14, 576, 1), (14, 576, 2), (7, 960, 1))
    cases = []
    for i, (size, depth, stride) in enumerate(layers):
        dtypes = WITH_DOUBLE if (size, depth) == (7, 960) else HALF_AND_SINGLE
        cases += _depthwise("mobilenetv2", f"dw{i + 1}", batch, size, depth, 3, stride, dtypes)
    return cases


def _efficientnet(batch: int = 32) -> list[Case]:
    """EfficientNet-B0's 5x5 depthwise layers at 224x224 input."""
    layers = ((56, 144, 2), (28, 240, 1), (14, 480, 1), (14, 672, 1), (14, 672, 2), (7, 1152, 1))
    cases = []
    for i, (size, depth, stride) in enumerate(layers):
        cases += _depthwise("efficientnet", f"dw5x5-{i + 1}", batch, size, depth, 5, stride)
    return cases


def _fractional(batch: int = 32, suite_name: str = "fractional", ops=FRACTIONAL_OPS) -> list[Case]:
    """Average and max pooling gradients on the same shapes, cells and sequences."""
    cases = []
    for size, depth in ((112, 64), (56, 256)):
        for overlapping in (False, True):
            dtypes = WITH_DOUBLE if (size, overlapping) == (56, False) else HALF_AND_SINGLE
            for op in ops:
                cases.append(Case(suite_name, f"{batch}x{size}x{size}x{depth} ratio 1.44 "
                                  f"{'overlapping' if overlapping else 'disjoint'}", op,
                                  (batch, size, size, depth), pooling_ratio=1.44, overlapping=overlapping, seed=size,
                                  dtypes=dtypes))
    return cases


def _fractional_forward(batch: int = 32) -> list[Case]:
    """The forward average and max poolings on the gradients' shapes, cells and sequences (a
    suite of its own: the fractional suite's GPU runs time the gradients' kernels)."""
    return _fractional(batch, "fractional_forward", FRACTIONAL_FORWARD_OPS)


def _smoke() -> list[Case]:
    """A handful of small cases covering every op, both layouts and every dtype: seconds to run."""
    s = "smoke"
    cases = []
    for layout in LAYOUTS:
        cases.append(Case(s, "conv 3x3 16->32", CONV_FILTER, (4, 16, 16, 16), layout, (3, 3, 16, 32),
                          dtypes=WITH_DOUBLE))
        cases.append(Case(s, "conv 3x3/2 16->32", CONV_INPUT, (4, 17, 17, 16), layout, (3, 3, 16, 32), (2, 2),
                          dtypes=WITH_DOUBLE))
        cases.append(Case(s, "conv 5x3 explicit 8->8", CONV_INPUT, (2, 12, 10, 8), layout, (5, 3, 8, 8), (1, 2),
                          "EXPLICIT", ((2, 1), (0, 3)), dtypes=("float32",)))
        for op in DEPTHWISE_OPS:
            cases.append(Case(s, "dw 3x3/2 m2", op, (4, 16, 16, 24), layout, (3, 3, 24, 2), (2, 2),
                              dtypes=WITH_DOUBLE))
    for overlapping in (False, True):
        for op in POOLING_OPS:
            cases.append(Case(s, f"frac 4x20x20x8 ratio 1.44 {'overlapping' if overlapping else 'disjoint'}",
                              op, (4, 20, 20, 8), pooling_ratio=1.44, overlapping=overlapping, seed=3,
                              dtypes=WITH_DOUBLE))
    return cases


def _numpy_vs_tf() -> list[Case]:
    """The case list of benchmarks/bench_numpy_vs_tf.py (issue 2's CPU speed check, with issue
    17's depthwise filter and max pooling gradients on the same shapes), float32 NHWC."""
    s = "numpy_vs_tf"
    f32 = ("float32",)
    cases = []
    for stride, padding in ((1, "SAME"), (2, "SAME"), (1, "VALID")):
        name = f"8x28x28x64 3x3x64x64 s{stride} {padding}"
        for op in (CONV_FILTER, CONV_INPUT):
            cases.append(Case(s, name, op, (8, 28, 28, 64), "NHWC", (3, 3, 64, 64), (stride, stride), padding,
                              dtypes=f32, name=name))
    # Each op's cases in a block, the original list's first (the committed results' row order).
    for op in DEPTHWISE_OPS:
        for stride, multiplier in ((1, 1), (2, 1), (1, 2)):
            name = f"8x56x56x96 3x3 m{multiplier} s{stride} SAME"
            cases.append(Case(s, name, op, (8, 56, 56, 96), "NHWC", (3, 3, 96, multiplier),
                              (stride, stride), "SAME", dtypes=f32, name=name))
    for op in FRACTIONAL_OPS:
        for overlapping in (False, True):
            name = f"8x112x112x32 ratio 1.44 overlapping={overlapping}"
            cases.append(Case(s, name, op, (8, 112, 112, 32), pooling_ratio=1.44, overlapping=overlapping,
                              seed=1, dtypes=f32, name=name))
    return cases


_BUILDERS = {
    "smoke": _smoke,
    "resnet50": _resnet50,
    "mobilenetv2": _mobilenetv2,
    "efficientnet": _efficientnet,
    "fractional": _fractional,
    "fractional_forward": _fractional_forward,
    "numpy_vs_tf": _numpy_vs_tf,
}
SUITES = tuple(_BUILDERS)
#: What ``--suite all`` means: the named model suites (not smoke, not the CPU-only list).
ALL = ("resnet50", "mobilenetv2", "efficientnet", "fractional", "fractional_forward")


def suite(name: str) -> list[Case]:
    if name not in _BUILDERS:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}, all")
    return _BUILDERS[name]()


def expand(names: list[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        for n in (ALL if name == "all" else (name,)):
            if n not in _BUILDERS:
                raise ValueError(f"unknown suite {n!r}; known: {', '.join(SUITES)}, all")
            if n not in out:
                out.append(n)
    return out
