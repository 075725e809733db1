"""The one validation step: TF attributes and shapes -> a normalised geometry.

Every public op calls one of the builders here before any backend runs; backends trust
what they receive.  The rules follow TensorFlow's kernels (conv_grad_shape_utils.cc,
kernel_shape_util.cc, depthwise_conv_grad_op.cc, fractional_avg_pool_op.cc), with the
deliberate extensions listed in README.md.
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._memo import memoised
from ._errors import InvalidArgumentError

PADDINGS = ("SAME", "VALID", "EXPLICIT")
DATA_FORMATS = ("NHWC", "NCHW")

# TensorShape refuses shapes of more elements than an int64 holds; TF's integer attributes
# (strides, dilations, explicit_paddings) and sizes are int64 too, though its convolution
# kernels read strides and dilations as int32 (see _spatial_attr).
MAX_ELEMENTS = 2**63 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


# --------------------------------------------------------------------------- attributes


def _check_choice(op: str, name: str, value: Any, choices: Sequence[str], default: str | None = None) -> str:
    """``value``, one of ``choices`` (bytes decoded); None is ``default`` where there is one."""
    if value is None and default is not None:
        value = default
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, str):
        raise TypeError(f"{op}: {name} must be a string, one of {', '.join(choices)}; got {value!r}")
    if value not in choices:
        raise InvalidArgumentError(f"{op}: {name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_bool(op: str, name: str, value: Any, default: bool) -> bool:
    """A bool attribute (Python or NumPy bool); None is its default, as in TF's wrappers."""
    if value is None:
        return default
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a bool, got {value!r}")
    return bool(value)


def int_list(op: str, name: str, value: Any, length: int | None = None) -> list[int]:
    """An attribute list of integers (``strides``, ``dilations``, ``explicit_paddings``): a
    list, tuple or range, or a 1-D NumPy array (TF takes lists and tuples)."""
    is_vector = isinstance(value, np.ndarray) and value.ndim == 1
    if not (is_vector or isinstance(value, (list, tuple, range))):
        raise TypeError(f"{op}: {name} must be a list of integers, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{op}: {name} must be a list of integers, got {list(value)!r}")
        out.append(int(v))
    if any(not INT64_MIN <= v <= INT64_MAX for v in out):
        raise InvalidArgumentError(f"{op}: {name} values must fit in int64, got {out}")
    if length is not None and len(out) != length:
        raise InvalidArgumentError(f"{op}: {name} must have {length} entries, got {len(out)}: {out}")
    return out


def _spatial_attr(op: str, name: str, value: Any, data_format: str, what: str) -> tuple[int, int]:
    """(rows, cols) of a 4-entry ``strides``/``dilations`` list; batch and depth must be 1."""
    values = int_list(op, name, value, 4)
    # TF's convolution kernels read both attributes as int32 lists, refusing any other value
    # before they look at it (its depthwise gradients, which ignore dilations, read only strides).
    for v in values:
        if not INT32_MIN <= v <= INT32_MAX:
            raise InvalidArgumentError(f"{op}: {name} has value {v} out of range for an int32, got {values}")
    n, h, w, c = (data_format.index(d) for d in "NHWC")
    if values[n] != 1 or values[c] != 1:
        raise InvalidArgumentError(
            f"{op}: {name} must be 1 in the batch and depth dimensions, got {values} ({data_format})"
        )
    if values[h] <= 0 or values[w] <= 0:
        raise InvalidArgumentError(f"{op}: {name} must be positive ({what}), got {values}")
    return values[h], values[w]


def _explicit_pads(op: str, padding: str, explicit_paddings: Any, data_format: str):
    """((pad_top, pad_bottom), (pad_left, pad_right)) for EXPLICIT padding, else None."""
    pads = int_list(op, "explicit_paddings", explicit_paddings)
    if padding != "EXPLICIT":
        if pads:
            raise InvalidArgumentError(
                f"{op}: explicit_paddings must be empty unless padding is 'EXPLICIT' "
                f"(padding={padding!r}, explicit_paddings={pads})"
            )
        return None
    if len(pads) != 8:
        raise InvalidArgumentError(
            f"{op}: explicit_paddings must have 8 entries (before/after for each of {data_format}) "
            f"when padding is 'EXPLICIT', got {len(pads)}"
        )
    if any(p < 0 for p in pads):
        raise InvalidArgumentError(f"{op}: explicit_paddings must be non-negative, got {pads}")
    n, h, w, c = (data_format.index(d) for d in "NHWC")
    if pads[2 * n] or pads[2 * n + 1] or pads[2 * c] or pads[2 * c + 1]:
        raise InvalidArgumentError(
            f"{op}: explicit_paddings must be 0 in the batch and depth dimensions, got {pads} ({data_format})"
        )
    return (pads[2 * h], pads[2 * h + 1]), (pads[2 * w], pads[2 * w + 1])


def _trunc_div(a: int, b: int) -> int:
    """C++ integer division (truncates toward zero), as TF computes window counts; b > 0."""
    q = abs(a) // b
    return q if a >= 0 else -q


@dataclass(frozen=True)
class WindowDim:
    """One spatial dimension of a convolution, as TF's GetWindowedOutputSizeVerbose sees it."""

    input_size: int
    filter_size: int
    output_size: int
    stride: int
    dilation: int
    pad_before: int  # forward-convolution padding; pad_after may exceed what the last window uses
    pad_after: int

    @property
    def effective_filter_size(self) -> int:
        return (self.filter_size - 1) * self.dilation + 1


def windowed_output_size(op: str, dim_name: str, input_size: int, filter_size: int, stride: int,
                         dilation: int, padding: str, explicit: tuple[int, int] | None) -> WindowDim:
    """Output size and padding of one spatial dimension, exactly as TF computes them."""
    effective = (filter_size - 1) * dilation + 1
    # TF computes these in int64 (overflow there is undefined behaviour); kernels index with
    # int64 offsets, so every extent of the padded problem must fit in one.
    padded = input_size + (sum(explicit) if padding == "EXPLICIT" else effective)
    if effective > INT64_MAX or padded > INT64_MAX:
        raise InvalidArgumentError(
            f"{op}: {dim_name}: filter size {filter_size} with dilation {dilation} (effective size "
            f"{effective}) over input size {input_size} and its padding does not fit in int64")
    if padding == "VALID":
        output_size = _trunc_div(input_size - effective + stride, stride)
        before = after = 0
    elif padding == "EXPLICIT":
        before, after = explicit
        output_size = _trunc_div(input_size + before + after - effective + stride, stride)
    else:  # SAME
        output_size = _trunc_div(input_size + stride - 1, stride)
        needed = max(0, (output_size - 1) * stride + effective - input_size)
        before = needed // 2  # odd totals pad one more at the bottom/right, like TF
        after = needed - before
    if output_size < 0:
        raise InvalidArgumentError(
            f"{op}: computed output {dim_name} would be negative: {output_size} "
            f"[input_size: {input_size}, effective_filter_size: {effective}, stride: {stride}] "
            f"(the input is smaller than the filter with padding={padding!r})"
        )
    return WindowDim(input_size, filter_size, output_size, stride, dilation, before, after)


# --------------------------------------------------------------------------- shapes


def check_shape(op: str, name: str, shape: Sequence[int], rank: int = 4) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if len(shape) != rank:
        raise InvalidArgumentError(f"{op}: {name} must be {rank}-dimensional, got shape {list(shape)}")
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"{op}: {name} must have non-negative dimensions, got {list(shape)}")
    if any(d > INT64_MAX for d in shape):  # an empty shape's product can hide one
        raise InvalidArgumentError(f"{op}: {name} dimensions must fit in int64, got {list(shape)}")
    total = 1
    for d in shape:
        total *= d
    if total > MAX_ELEMENTS:
        raise InvalidArgumentError(f"{op}: {name} shape {list(shape)} has more than 2**63-1 elements")
    return shape


def nhwc(shape: Sequence[int], data_format: str) -> tuple[int, int, int, int]:
    """(N, H, W, C) of a 4-D shape given in ``data_format``."""
    return tuple(shape[data_format.index(d)] for d in "NHWC")  # type: ignore[return-value]


def from_nhwc(n: int, h: int, w: int, c: int, data_format: str) -> tuple[int, int, int, int]:
    dims = {"N": n, "H": h, "W": w, "C": c}
    return tuple(dims[d] for d in data_format)  # type: ignore[return-value]


@dataclass(frozen=True)
class Conv2DGeometry:
    """A validated 2-D (grouped) convolution, seen from the forward op.

    The forward convolution maps ``input`` [N, in_rows, in_cols, in_depth] (in ``data_format``)
    and ``filter`` [filter_rows, filter_cols, in_depth / groups, out_depth] (HWIO) to
    ``out_backprop``'s shape [N, out_rows, out_cols, out_depth].  Output row ``oh`` reads input
    rows ``oh * stride_rows + r * dilation_rows - pad_top`` for filter rows ``r``; rows outside
    [0, in_rows) are zero padding.  Depthwise convolution is the case ``groups == in_depth`` with
    ``depthwise_multiplier = out_depth / in_depth`` (its filter [R, S, C, M] is HWIO [R, S, 1, C*M]).
    """

    data_format: str
    batch: int
    in_rows: int
    in_cols: int
    in_depth: int
    filter_rows: int
    filter_cols: int
    filter_in_depth: int  # in_depth / groups (1 for depthwise)
    out_depth: int
    out_rows: int
    out_cols: int
    stride_rows: int
    stride_cols: int
    dilation_rows: int
    dilation_cols: int
    pad_top: int
    pad_bottom: int
    pad_left: int
    pad_right: int
    groups: int
    depthwise: bool = False

    @property
    def depth_multiplier(self) -> int:
        return self.out_depth // self.in_depth if self.in_depth else 0

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return from_nhwc(self.batch, self.in_rows, self.in_cols, self.in_depth, self.data_format)

    @property
    def out_backprop_shape(self) -> tuple[int, int, int, int]:
        return from_nhwc(self.batch, self.out_rows, self.out_cols, self.out_depth, self.data_format)

    @property
    def filter_shape(self) -> tuple[int, int, int, int]:
        """The filter as the op takes it: HWIO, or [R, S, C, M] for depthwise."""
        if self.depthwise:
            return (self.filter_rows, self.filter_cols, self.in_depth, self.depth_multiplier)
        return (self.filter_rows, self.filter_cols, self.filter_in_depth, self.out_depth)

    @property
    def flops(self) -> int:
        """2 * multiply-adds of the forward convolution (and of each of its gradients)."""
        return (2 * self.batch * self.out_rows * self.out_cols * self.filter_rows * self.filter_cols
                * self.filter_in_depth * self.out_depth)


#: Ops whose input or filter shape comes from a sizes argument rather than a tensor.
SHAPE_ARGUMENTS = {
    "conv2d_backprop_input": ("input_sizes", "filter"),
    "depthwise_conv2d_native_backprop_input": ("input_sizes", "filter"),
    "conv2d_backprop_filter": ("input", "filter_sizes"),
    "depthwise_conv2d_native_backprop_filter": ("input", "filter_sizes"),
}


@memoised()
def conv2d_geometry(op: str, input_shape: Sequence[int], filter_shape: Sequence[int],
                    out_backprop_shape: Sequence[int] | None, strides: Any, padding: Any,
                    explicit_paddings: Any, data_format: Any, dilations: Any,
                    *, depthwise: bool = False) -> Conv2DGeometry:
    """Validate a conv2d / depthwise gradient call and describe it (TF's ConvBackpropComputeDimensionsV2).

    Shapes are the tensors' shapes: input and out_backprop in ``data_format``, the filter HWIO
    ([R, S, in_depth, multiplier] when ``depthwise``).  ``out_backprop_shape=None`` describes a
    forward convolution: its output shape is computed instead of checked.
    """
    # None is an attribute's default, as in TF's Python wrappers (strides and padding have none).
    data_format = _check_choice(op, "data_format", data_format, DATA_FORMATS, default="NHWC")
    padding = _check_choice(op, "padding", padding, PADDINGS)
    dilations = (1, 1, 1, 1) if dilations is None else dilations
    explicit_paddings = () if explicit_paddings is None else explicit_paddings
    stride_rows, stride_cols = _spatial_attr(op, "strides", strides, data_format, "the window step")
    dilation_rows, dilation_cols = _spatial_attr(op, "dilations", dilations, data_format,
                                                 "the spacing of filter taps")
    explicit = _explicit_pads(op, padding, explicit_paddings, data_format)

    # The arguments that gave the input's and filter's shapes, for the messages.
    input_name, filter_name = SHAPE_ARGUMENTS.get(op, ("input", "filter"))
    input_shape = check_shape(op, input_name, input_shape)
    filter_shape = check_shape(op, filter_name, filter_shape)
    batch, in_rows, in_cols, in_depth = nhwc(input_shape, data_format)
    filter_rows, filter_cols, filter_in_depth, filter_out = filter_shape
    forward = out_backprop_shape is None
    if forward:
        out_depth = in_depth * filter_out if depthwise else filter_out
        ob_batch, ob_rows, ob_cols, ob_depth = batch, None, None, out_depth
    else:
        out_backprop_shape = check_shape(op, "out_backprop", out_backprop_shape)
        ob_batch, ob_rows, ob_cols, ob_depth = nhwc(out_backprop_shape, data_format)

    if batch != ob_batch:
        raise InvalidArgumentError(
            f"{op}: {input_name} and out_backprop must have the same batch size, got {batch} and {ob_batch}")
    if depthwise:
        if in_depth != filter_in_depth:
            raise InvalidArgumentError(
                f"{op}: {input_name} and {filter_name} must have the same in_depth, got {in_depth} and "
                f"{filter_in_depth}")
        out_depth = in_depth * filter_out
        if out_depth != ob_depth:
            raise InvalidArgumentError(
                f"{op}: depth_multiplier * in_depth must equal out_backprop's depth: "
                f"{filter_out} * {in_depth} != {ob_depth}")
        groups = in_depth
        filter_in_depth = 1
    else:
        if filter_in_depth <= 0:
            raise InvalidArgumentError(
                f"{op}: filter depth must be strictly greater than zero, got {filter_name} {list(filter_shape)}")
        if in_depth % filter_in_depth:
            raise InvalidArgumentError(
                f"{op}: input depth must be evenly divisible by filter depth, got {in_depth} ({input_name}) and "
                f"{filter_in_depth} ({filter_name})")
        out_depth = filter_out
        if out_depth != ob_depth:
            raise InvalidArgumentError(
                f"{op}: {filter_name} and out_backprop must have the same out_depth, got {out_depth} and {ob_depth}")
        groups = in_depth // filter_in_depth
        # Each group maps filter_in_depth input channels to out_depth / groups output channels.
        # An input depth of 0 makes no group, which only an out_depth of 0 (all tensors empty)
        # is consistent with; TF's Conv2D refuses 0 groups ("number of groups must be stricly
        # positive") unless an empty tensor returns first.
        if groups == 0 and out_depth:
            raise InvalidArgumentError(
                f"{op}: number of groups must be strictly positive, got 0 (input depth 0 / filter depth "
                f"{filter_in_depth}) with filter's out_depth {out_depth}; 0 groups only fit an out_depth of 0")
        if groups and out_depth % groups:
            raise InvalidArgumentError(
                f"{op}: output depth must be evenly divisible by number of groups: {out_depth} vs {groups} "
                f"(filter's out_depth {out_depth}; groups = input depth {in_depth} / filter depth {filter_in_depth})")

    rows = windowed_output_size(op, "rows", in_rows, filter_rows, stride_rows, dilation_rows,
                                padding, explicit[0] if explicit else None)
    cols = windowed_output_size(op, "cols", in_cols, filter_cols, stride_cols, dilation_cols,
                                padding, explicit[1] if explicit else None)
    for dim, name, actual in ((rows, "rows", ob_rows), (cols, "cols", ob_cols)):
        if not forward and dim.output_size != actual:
            raise InvalidArgumentError(
                f"{op}: out_backprop {name} don't match the computed output size: actual = {actual}, "
                f"computed = {dim.output_size} [input: {dim.input_size}, filter: {dim.filter_size}, "
                f"stride: {dim.stride}, dilation: {dim.dilation}, padding: {padding}]")
    if forward:
        output_shape = check_shape(op, "output", from_nhwc(batch, rows.output_size, cols.output_size, out_depth,
                                                           data_format))
        # TF's Conv2D returns an empty output at once, then its launchers refuse an empty filter
        # ("filter must not have zero elements") and explicit paddings their int offsets cannot
        # hold ("filter too large"); DepthwiseConv2dNative and the gradients compute both.
        if not depthwise and 0 not in output_shape:
            if 0 in filter_shape:
                raise InvalidArgumentError(
                    f"{op}: filter must not have zero elements (i.e. all dimensions must be non-zero), got "
                    f"{filter_name} {list(filter_shape)} for an output of {list(output_shape)}")
            if explicit and max(*explicit[0], *explicit[1]) >= INT32_MAX:
                raise InvalidArgumentError(
                    f"{op}: explicit_paddings must be below 2**31 - 1, as TF's Conv2D requires, got "
                    f"{[*explicit[0], *explicit[1]]} (top, bottom, left, right)")

    return Conv2DGeometry(
        data_format=data_format, batch=batch, in_rows=in_rows, in_cols=in_cols, in_depth=in_depth,
        filter_rows=filter_rows, filter_cols=filter_cols, filter_in_depth=filter_in_depth, out_depth=out_depth,
        out_rows=rows.output_size, out_cols=cols.output_size,
        stride_rows=stride_rows, stride_cols=stride_cols,
        dilation_rows=dilation_rows, dilation_cols=dilation_cols,
        pad_top=rows.pad_before, pad_bottom=rows.pad_after,
        pad_left=cols.pad_before, pad_right=cols.pad_after,
        groups=groups, depthwise=depthwise)


def input_shape_from_sizes(op: str, input_sizes: list[int], filter_shape: Sequence[int],
                           out_backprop_shape: Sequence[int], data_format: str,
                           allow_two: bool = True) -> tuple[int, ...]:
    """TF's Conv2DBackpropComputeInputShape: ``input_sizes`` of 4 entries, or [rows, cols]."""
    data_format = _check_choice(op, "data_format", data_format, DATA_FORMATS, default="NHWC")
    if len(input_sizes) == 4:
        if any(v < 0 for v in input_sizes):
            raise InvalidArgumentError(f"{op}: input_sizes must be non-negative, got {input_sizes}")
        return tuple(input_sizes)
    if len(input_sizes) == 2 and allow_two:
        rows, cols = input_sizes
        if rows < 0 or cols < 0:
            raise InvalidArgumentError(f"{op}: input_sizes must be non-negative, got {input_sizes}")
        filter_shape = check_shape(op, "filter", filter_shape)
        out_backprop_shape = check_shape(op, "out_backprop", out_backprop_shape)
        batch = nhwc(out_backprop_shape, data_format)[0]
        return from_nhwc(batch, rows, cols, filter_shape[2], data_format)
    expected = "4 values or 2 values ([rows, cols])" if allow_two else "4 values"
    raise InvalidArgumentError(f"{op}: input_sizes must contain {expected}, got {len(input_sizes)}: {input_sizes}")


def filter_shape_from_sizes(op: str, filter_sizes: list[int]) -> tuple[int, ...]:
    if len(filter_sizes) != 4:
        raise InvalidArgumentError(
            f"{op}: filter_sizes must contain 4 values [rows, cols, in_depth, out_depth], got {filter_sizes}")
    if any(v < 0 for v in filter_sizes):
        raise InvalidArgumentError(f"{op}: filter_sizes must be non-negative, got {filter_sizes}")
    return tuple(filter_sizes)


# --------------------------------------------------------------------------- fractional pooling


@dataclass(frozen=True)
class FractionalPoolGeometry:
    """A validated fractional pooling: NHWC input [batch, in_rows, in_cols, depth] pooled to
    [batch, out_rows, out_cols, depth].  Output cell (r, c) covers input rows
    ``row_starts[r]..row_ends[r]`` and columns ``col_starts[c]..col_ends[c]`` (inclusive), as
    TF's kernel reads the pooling sequences: starts are non-negative, ends are clamped to the
    last input index, and a cell whose end lies before its start is empty (TF's loops spread
    no gradient over it; the forward op averages it to 0).  Cells need not be ordered: a row
    may lie in cells 0 and 2 but not 1.  :meth:`cells_by_index` lists, per input index, the
    cells containing it."""

    batch: int
    in_rows: int
    in_cols: int
    depth: int
    out_rows: int
    out_cols: int
    row_starts: tuple[int, ...]
    row_ends: tuple[int, ...]
    col_starts: tuple[int, ...]
    col_ends: tuple[int, ...]
    overlapping: bool

    @property
    def input_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.in_rows, self.in_cols, self.depth)

    @property
    def output_shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.out_rows, self.out_cols, self.depth)

    # Cached on the (frozen, memoised) geometry: the launchers read them on every call.
    @functools.cached_property
    def row_cell_sizes(self) -> tuple[int, ...]:
        """Rows in each row cell (0 for an empty cell)."""
        return tuple(max(0, e - s + 1) for s, e in zip(self.row_starts, self.row_ends))

    @functools.cached_property
    def col_cell_sizes(self) -> tuple[int, ...]:
        return tuple(max(0, e - s + 1) for s, e in zip(self.col_starts, self.col_ends))

    @functools.cached_property
    def largest_cell(self) -> int:
        """Elements of the largest cell (0 if every cell is empty)."""
        return max(self.row_cell_sizes, default=0) * max(self.col_cell_sizes, default=0)

    @functools.cached_property
    def holds_elements(self) -> bool:
        """Whether some cell holds an input element (a non-empty row cell and column cell)."""
        return any(self.row_cell_sizes) and any(self.col_cell_sizes)

    @functools.cached_property
    def cell_table_entries(self) -> int:
        """(input index, cell containing it) pairs over rows and columns: the size of the
        :meth:`cells_by_index` tables, and the number of share-adds TF's loop makes per
        (batch, channel) divided by neither dimension's cell overlap."""
        return sum(self.row_cell_sizes) + sum(self.col_cell_sizes)

    @functools.cached_property
    def row_partition(self) -> tuple[int, ...] | None:
        """:func:`partition_bounds` of the row cells: each cell's own first row, then in_rows;
        None where the row cells do not partition the input."""
        bounds = partition_bounds(self.row_starts, self.row_ends, self.in_rows, self.overlapping)
        return None if bounds is None else tuple(int(v) for v in bounds)

    @functools.cached_property
    def col_partition(self) -> tuple[int, ...] | None:
        """:func:`partition_bounds` of the column cells."""
        bounds = partition_bounds(self.col_starts, self.col_ends, self.in_cols, self.overlapping)
        return None if bounds is None else tuple(int(v) for v in bounds)

    def cells_by_index(self, dim: str) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets, cells)``, int64, for ``dim`` "rows" or "cols": input index i lies in
        cells ``cells[offsets[i]:offsets[i + 1]]``, in increasing cell order (TF's summation
        order), empty cells in none.  ``offsets`` has in_size + 1 entries."""
        if dim == "rows":
            return cells_by_index(self.row_starts, self.row_ends, self.in_rows)
        return cells_by_index(self.col_starts, self.col_ends, self.in_cols)


def cells_by_index(starts: Sequence[int], ends: Sequence[int], in_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per input index, the (clamped, inclusive) cells containing it, in cell order, as CSR
    ``(offsets [in_size + 1], cells)``; see :meth:`FractionalPoolGeometry.cells_by_index`."""
    starts = np.asarray(starts, np.int64).reshape(-1)
    ends = np.asarray(ends, np.int64).reshape(-1)
    sizes = np.maximum(ends - starts + 1, 0)
    live = np.flatnonzero(sizes)  # ascending: each index meets its cells in cell order
    counts = np.zeros(in_size + 1, np.int64)
    np.add.at(counts, starts[live], 1)
    np.add.at(counts, ends[live] + 1, -1)  # ends are at most in_size - 1
    offsets = np.zeros(in_size + 1, np.int64)
    np.cumsum(np.cumsum(counts[:-1]), out=offsets[1:])
    total = int(offsets[-1])
    # Every (cell, index) pair, cell by cell; a stable sort by index keeps cell order per index.
    cell_of = np.repeat(live, sizes[live])
    first = np.zeros(len(live), np.int64)
    np.cumsum(sizes[live][:-1], out=first[1:])
    index = np.arange(total, dtype=np.int64)
    index += np.repeat(starts[live] - first, sizes[live])
    cells = cell_of[np.argsort(index, kind="stable")]
    return offsets, cells


def partition_bounds(starts: Sequence[int], ends: Sequence[int], in_size: int, overlapping: bool) -> np.ndarray | None:
    """The first index of each cell's own region and then ``in_size`` (int64), when the cells
    (clamped, inclusive starts and ends) partition 0 .. in_size - 1: the first starts at 0,
    starts increase, each cell ends where the next starts (overlapping) or just before it, and
    the last at in_size - 1 (TF's generated sequences always do).  None otherwise.

    Index i then lies in its region's cell k and, when overlapping and i is the region's first
    index with k > 0, also in cell k - 1: what :func:`cells_by_index` lists for it.  The
    fractional pooling gradients' cells kernels take such cells."""
    starts = np.asarray(starts, np.int64).reshape(-1)
    ends = np.asarray(ends, np.int64).reshape(-1)
    if starts.size == 0 or starts[0] != 0 or ends[-1] != in_size - 1 or np.any(np.diff(starts) <= 0):
        return None
    if not np.array_equal(ends[:-1], starts[1:] - (0 if overlapping else 1)) or starts[-1] > in_size - 1:
        return None
    return np.append(starts, np.int64(in_size))


def pooling_cells(op: str, name: str, sequence: list[int], cells: int, in_size: int, dim: str,
                  overlapping: bool, output: str = "out_backprop") -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(starts, inclusive ends) of ``cells`` pooling cells from a pooling sequence, as TF reads it.

    Cell k starts at ``sequence[k]`` and ends at ``sequence[k+1]`` (overlapping) or
    ``sequence[k+1] - 1``, the end clamped to the last input index (the start is not: a cell
    starting past the input, or ending before it starts, is empty).  Only the first cells + 1
    entries are read.  TF refuses a negative start or (clamped) end, which would index before
    the input: so do we, and the sequence must be long enough (``output`` names the tensor
    whose shape gives ``cells``).
    """
    if len(sequence) < cells + 1:
        raise InvalidArgumentError(
            f"{op}: {name} must have at least {cells + 1} elements ({output} has {cells} {dim}), "
            f"got {len(sequence)}")
    if any(v > INT64_MAX for v in sequence[:cells + 1]):  # e.g. a uint64 array; TF's sequences are int64
        raise InvalidArgumentError(f"{op}: {name} values must fit in int64, got {sequence[:cells + 1]}")
    starts, ends = [], []
    for k in range(cells):
        start, end = sequence_cell(sequence, k, in_size, overlapping)
        if start < 0 or end < 0:
            if start >= 0 and sequence[k + 1] >= 0:  # a disjoint cell [s, 0 - 1]
                raise InvalidArgumentError(
                    f"{op}: {name} values must not be negative as cell bounds: cell {k} would end at "
                    f"{name}[{k + 1}] - 1 = -1 (overlapping=False), got {sequence[:cells + 1]}")
            raise InvalidArgumentError(f"{op}: {name} values must not be negative, got {sequence[:cells + 1]}")
        starts.append(start)
        ends.append(end)
    return tuple(starts), tuple(ends)


def shown(sequence: Sequence[int], most: int = 16) -> str:
    """A sequence for a message: whole when short, else its first ``most`` entries and its length
    (a legal sequence can have as many entries as orig_input has elements)."""
    if len(sequence) <= most:
        return str(list(sequence))
    return f"[{', '.join(map(str, sequence[:most]))}, ...] ({len(sequence)} elements)"


def sequence_cell(sequence: Sequence[int], k: int, in_size: int, overlapping: bool) -> tuple[int, int]:
    """(start, inclusive end) of cell k as TF's fractional pooling kernels compute them in int64:
    ``sequence[k]`` and ``sequence[k + 1]`` (overlapping) or ``sequence[k + 1] - 1``, clamped to
    the last input index; the end's subtraction wraps as TF's does (INT64_MIN - 1 is INT64_MAX)."""
    end = sequence[k + 1] if overlapping else sequence[k + 1] - 1
    if end < -(INT64_MAX + 1):
        end += 2 ** 64
    return sequence[k], min(end, in_size - 1)


def fractional_pool_forward_geometry(op: str, value_shape: Sequence[int], row_pooling_sequence: list[int],
                                     col_pooling_sequence: list[int], overlapping: Any) -> FractionalPoolGeometry:
    """Validate a forward fractional pooling (avg or max; value NHWC) whose output size the
    sequences give (out_rows = len(row_pooling_sequence) - 1), and describe its cells."""
    if len(value_shape) != 4:
        raise InvalidArgumentError(f"{op}: value must be 4-dimensional, got shape {list(value_shape)}")
    for name, sequence in (("row_pooling_sequence", row_pooling_sequence),
                           ("col_pooling_sequence", col_pooling_sequence)):
        if len(sequence) < 2:  # out size = len - 1, and an empty output has no cell to name
            raise InvalidArgumentError(
                f"{op}: {name} needs at least 2 elements (one pooling cell), got {len(sequence)}")
    out_shape = (value_shape[0], len(row_pooling_sequence) - 1, len(col_pooling_sequence) - 1, value_shape[3])
    return fractional_pool_geometry(op, list(value_shape), out_shape, row_pooling_sequence, col_pooling_sequence,
                                    overlapping)


@memoised()
def fractional_pool_geometry(op: str, orig_input_shape: list[int], out_backprop_shape: Sequence[int],
                             row_pooling_sequence: list[int], col_pooling_sequence: list[int],
                             overlapping: Any) -> FractionalPoolGeometry:
    """Validate a fractional_avg_pool_grad call (shapes NHWC) and describe its cells."""
    overlapping = check_bool(op, "overlapping", overlapping, default=False)
    if len(orig_input_shape) != 4:
        raise InvalidArgumentError(
            f"{op}: orig_input_tensor_shape must be 1-dimensional with 4 elements, got {orig_input_shape}")
    batch, in_rows, in_cols, depth = check_shape(op, "orig_input_tensor_shape", orig_input_shape)
    out_batch, out_rows, out_cols, out_depth = check_shape(op, "out_backprop", out_backprop_shape)
    # TF's kernel rejects empty tensors here (the CVE-2021-37651 / CVE-2022-35963 fixes).
    if 0 in (out_batch, out_rows, out_cols, out_depth):
        raise InvalidArgumentError(
            f"{op}: out_backprop must have positive dimensions, got shape {list(out_backprop_shape)}")
    if 0 in (batch, in_rows, in_cols, depth):
        raise InvalidArgumentError(
            f"{op}: orig_input_tensor_shape must have positive dimensions, got {list(orig_input_shape)}")
    row_starts, row_ends = pooling_cells(op, "row_pooling_sequence", row_pooling_sequence, out_rows,
                                         in_rows, "rows", bool(overlapping))
    col_starts, col_ends = pooling_cells(op, "col_pooling_sequence", col_pooling_sequence, out_cols,
                                         in_cols, "cols", bool(overlapping))
    geometry = FractionalPoolGeometry(batch, in_rows, in_cols, depth, out_rows, out_cols,
                                      row_starts, row_ends, col_starts, col_ends, bool(overlapping))
    # TF loops over out_backprop's batch and depth: smaller ones leave the rest of the gradient
    # zero (the op pads out_backprop with zeros); larger ones write past the gradient's images
    # or into the next element's channels (out of bounds at the tensor's end), unless no cell
    # holds an input element: TF then writes nothing and returns zeros, and so does the op.
    if (out_batch > batch or out_depth > depth) and geometry.holds_elements:
        raise InvalidArgumentError(
            f"{op}: out_backprop's batch and depth must not exceed orig_input_tensor_shape's where a cell "
            f"holds input elements: out_backprop {list(out_backprop_shape)}, original input {list(orig_input_shape)}")
    return geometry


def pooling_sequence_args(op: str, input_size: Any, pooling_ratio: Any, pseudo_random: Any,
                          seed: Any) -> tuple[int, float, bool, int | None]:
    """Validate fractional_pooling_sequence's arguments; returns them normalised.

    input_size: a positive integer (int64); pooling_ratio: a finite real >= 1 giving at least
    one output; pseudo_random: a bool; seed: None or a non-negative integer.
    """
    if isinstance(input_size, (bool, np.bool_)) or not isinstance(input_size, numbers.Integral):
        raise TypeError(f"{op}: input_size must be an integer, got {input_size!r}")
    input_size = int(input_size)
    if not 0 < input_size <= INT64_MAX:
        raise InvalidArgumentError(f"{op}: input_size must be positive and fit in int64, got {input_size}")
    if isinstance(pooling_ratio, (bool, np.bool_)) or not isinstance(pooling_ratio, numbers.Real):
        raise TypeError(f"{op}: pooling_ratio must be a real number, got {pooling_ratio!r}")
    pooling_ratio = float(pooling_ratio)
    if not (pooling_ratio >= 1.0 and math.isfinite(pooling_ratio)):  # also refuses NaN
        raise InvalidArgumentError(f"{op}: pooling_ratio must be finite and >= 1.0, got {pooling_ratio}")
    if not isinstance(pseudo_random, (bool, np.bool_)):
        raise TypeError(f"{op}: pseudo_random must be a bool, got {pseudo_random!r}")
    if seed is not None:
        if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"{op}: seed must be None or an integer, got {seed!r}")
        seed = int(seed)
        if seed < 0:
            raise InvalidArgumentError(f"{op}: seed must be non-negative, got {seed}")
    return input_size, pooling_ratio, bool(pseudo_random), seed


def fractional_max_pool_geometry(op: str, orig_input_shape: Sequence[int], orig_output_shape: Sequence[int],
                                 out_backprop_shape: Sequence[int], row_pooling_sequence: list[int],
                                 col_pooling_sequence: list[int], overlapping: Any) -> FractionalPoolGeometry:
    """The geometry of :func:`fractional_max_pool_cells`: its cells that hold elements."""
    return fractional_max_pool_cells(op, orig_input_shape, orig_output_shape, out_backprop_shape,
                                     row_pooling_sequence, col_pooling_sequence, overlapping)[0]


@memoised()
def fractional_max_pool_cells(op: str, orig_input_shape: Sequence[int], orig_output_shape: Sequence[int],
                              out_backprop_shape: Sequence[int], row_pooling_sequence: list[int],
                              col_pooling_sequence: list[int],
                              overlapping: Any) -> tuple[FractionalPoolGeometry, tuple[int, ...], tuple[int, ...]]:
    """Validate a fractional_max_pool_grad call (shapes NHWC) and describe its cells: (the
    pooling of orig_output's row and column cells that hold input elements, in order, which is
    what the backends take; orig_output's number of each of those row cells; of each column
    cell).  Cells that hold no element (empty ones, those past a short sequence) are not
    listed, so the description's size follows the sequences, not orig_output's shape.

    TF's FractionalMaxPoolGrad (fractional_max_pool_op.cc) checks ranks, non-empty tensors and
    len(row_pooling_sequence) * len(col_pooling_sequence) <= orig_input's element count, in
    that order, then walks every cell the sequences define.  Everything else it leaves to a
    comparison of the recomputed maxima with orig_output and a bounds check of each argmax,
    which run after it has already read and written through the cells.  Here the calls that
    would take TF out of bounds, or that TF refuses after the walk, are refused up front, and
    the others are TF's:

    * batch and depth of orig_output must be at least orig_input's (TF's walk writes each
      image's and channel's maximum at orig_output's offsets: past its buffers where the
      images are fewer; where the channels are, into the next cells' entries, merging their
      maxima, and past the end from the last cell unless it is unvisited: gradops refuses
      those too, though TF computes some); its extra images and channels are never visited,
      so they hold TF's lowest value and no choice, like an empty cell;
    * out_backprop may have any shape of at most orig_output's element count: TF adds its
      flat elements in order to the chosen elements of orig_output's first cells (the op pads
      a smaller one with zeros), and reads its argmax buffer past the end for a larger one;
    * cell k of the first out_rows / out_cols runs from entry k to entry k + 1 as TF reads
      them; a non-empty cell must start at 0 or later (a negative row start reads the previous
      image's rows, a negative column start the previous row's columns, and before orig_input
      in the first image's first row: TF PR #126911, still open in 2.21; gradops refuses both
      even where TF stays inside orig_input).  A cell that is empty (ends before it starts, or
      starts past the input) or that a short sequence never defines holds TF's lowest value
      and no choice: TF refuses the call where out_backprop's flat elements reach it (an
      argmax of -1), and computes it otherwise, as does the op;
    * further entries define cells TF also walks, writing to out_index rows or columns past
      orig_output's: they must be empty (TF then touches nothing and returns its result);
    * the checks above of orig_output's batch and depth and of the cells apply where both
      dimensions have a cell holding elements: where one has none, TF's walk reads and writes
      nothing, and every entry of orig_output is empty.

    The data check (orig_output equal to the maxima) is the backends' for the cells that hold
    elements and the op's for the others (it needs the values).
    """
    overlapping = check_bool(op, "overlapping", overlapping, default=False)
    batch, in_rows, in_cols, depth = check_shape(op, "orig_input", orig_input_shape)
    if 0 in (batch, in_rows, in_cols, depth):
        raise InvalidArgumentError(f"{op}: orig_input must not be empty, got shape {list(orig_input_shape)}")
    out_batch, out_rows, out_cols, out_depth = check_shape(op, "orig_output", orig_output_shape)
    if 0 in (out_batch, out_rows, out_cols, out_depth):
        raise InvalidArgumentError(f"{op}: orig_output must not be empty, got shape {list(orig_output_shape)}")
    n_rows, n_cols = len(row_pooling_sequence), len(col_pooling_sequence)
    if n_rows * n_cols > batch * in_rows * in_cols * depth:
        raise InvalidArgumentError(
            f"{op}: Pooling region has more elements than the input tensor: row_pooling_sequence has {n_rows} "
            f"and col_pooling_sequence {n_cols} elements ({n_rows * n_cols} > orig_input's "
            f"{batch * in_rows * in_cols * depth})")
    if math.prod(int(d) for d in out_backprop_shape) > out_batch * out_rows * out_cols * out_depth:
        raise InvalidArgumentError(
            f"{op}: out_backprop must have at most orig_output's {out_batch * out_rows * out_cols * out_depth} "
            f"elements (shape {list(orig_output_shape)}), got shape {list(out_backprop_shape)}")
    dims = (("row_pooling_sequence", row_pooling_sequence, out_rows, in_rows, "rows"),
            ("col_pooling_sequence", col_pooling_sequence, out_cols, in_cols, "cols"))
    walks = []  # per dimension: the walked cells that hold elements, (k, start, end)
    for name, sequence, _, size, _ in dims:
        walked = max(0, len(sequence) - 1)  # TF walks len(sequence) - 1 cells
        if any(v > INT64_MAX for v in sequence[:walked + 1]):  # e.g. a uint64 array; TF's are int64
            raise InvalidArgumentError(f"{op}: {name} values must fit in int64, got {shown(sequence)}")
        cells_k = (sequence_cell(sequence, k, size, overlapping) for k in range(walked))
        walks.append([(k, start, end) for k, (start, end) in enumerate(cells_k) if end >= start])
    cells = []  # per dimension: (orig_output's cells that hold elements, their starts, their ends)
    for (name, sequence, count, size, dim), walk, other in zip(dims, walks, walks[::-1]):
        if not other:  # every cell TF walks is empty: it reads and writes nothing
            cells.append(((), (), ()))
            continue
        for k, start, end in walk:
            if k >= count:  # TF writes these cells' maxima past orig_output's rows / columns
                raise InvalidArgumentError(
                    f"{op}: {name} has {len(sequence)} elements, defining cell {k} ({start}..{end}) past "
                    f"orig_output's {count} {dim}; extra cells must be empty (TF would write its argmax "
                    f"out of bounds)")
            if start < 0:
                raise InvalidArgumentError(
                    f"{op}: {name} values must not be negative as the start of a non-empty cell: cell {k} "
                    f"would start at {start} (TF 2.21 reads before the cell's first {dim[:-1]}, before "
                    f"orig_input in the first image, PR #126911), got {shown(sequence)}")
        cells.append(tuple(zip(*walk)) if walk else ((), (), ()))
    (kept_rows, row_starts, row_ends), (kept_cols, col_starts, col_ends) = cells
    if kept_rows and kept_cols and (out_batch < batch or out_depth < depth):
        raise InvalidArgumentError(
            f"{op}: orig_output's batch and depth must be at least orig_input's where a cell holds input "
            f"elements (TF writes each image's and channel's maximum at orig_output's offsets: past its buffers, or, "
            f"with fewer channels, into the next cells' entries, a result gradops does not compute): orig_output "
            f"{list(orig_output_shape)}, orig_input {list(orig_input_shape)}")
    # An empty or unvisited cell, and an image or channel orig_output has past orig_input's,
    # keeps TF's maximum at T's lowest value (the op checks that orig_output holds it) and its
    # argmax at -1, which TF refuses only where out_backprop's flat elements reach it ("Invalid
    # input backprop index: -1").  The first such entry in flat order: in image 0, channel 0 of
    # row 0 of the first empty column cell or of column 0 of the first empty row cell; channel
    # `depth` of the first cell; or image `batch`'s first.
    first_row, first_col = (next((i for i, k in enumerate(kept) if i != k), len(kept))
                            for kept in (kept_rows, kept_cols))
    # (flat element, the unvisited part holds elements somewhere, what): a tie at element 0
    # names a dimension whose cells hold none, else the rows
    empty = min([(first_row * out_cols * out_depth, bool(walks[0]), "rows")] * (first_row < out_rows)
                + [(first_col * out_depth, bool(walks[1]), "cols")] * (first_col < out_cols)
                + [(depth, True, "channels")] * (out_depth > depth)
                + [(batch * out_rows * out_cols * out_depth, True, "images")] * (out_batch > batch), default=None)
    elements = math.prod(int(d) for d in out_backprop_shape)
    if empty is not None and elements > empty[0]:
        flat, _, what = empty
        at = [int(i) for i in np.unravel_index(flat, (out_batch, out_rows, out_cols, out_depth))]
        if what in ("rows", "cols"):
            name, sequence, k, count, size = (
                ("row_pooling_sequence", row_pooling_sequence, at[1], out_rows, in_rows) if what == "rows"
                else ("col_pooling_sequence", col_pooling_sequence, at[2], out_cols, in_cols))
            why = (f"{name} has {len(sequence)} elements, so TF's loop visits {max(0, len(sequence) - 1)} of "
                   f"orig_output's {count} {what} and cell {k} is never visited" if k >= len(sequence) - 1
                   else "{} makes pooling cell {} empty (from {} to {} with overlapping={}, clamped to {} {})".format(
                       name, k, *sequence_cell(sequence, k, size, overlapping), overlapping, size, what))
            got = f", got {shown(sequence)}"
        else:
            why = (f"orig_output has {out_depth} channels to orig_input's {depth}" if what == "channels"
                   else f"orig_output has {out_batch} images to orig_input's {batch}")
            why, got = f"{why}, which TF's walk never visits", ""
        raise InvalidArgumentError(
            f"{op}: {why}, and out_backprop's {elements} elements reach orig_output{at} (flat element {flat}), "
            f"for which TF's walk chose no input element (TF: Invalid input backprop index: -1); an empty or "
            f"unvisited entry takes no gradient{got}")
    live = FractionalPoolGeometry(batch, in_rows, in_cols, depth, len(kept_rows), len(kept_cols),
                                  row_starts, row_ends, col_starts, col_ends, overlapping)
    return live, kept_rows, kept_cols
