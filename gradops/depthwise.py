"""Depthwise convolution's gradients (tf.raw_ops.DepthwiseConv2dNativeBackpropInput / Filter).

Layouts: ``input_sizes``/``out_backprop`` in ``data_format`` (NHWC or NCHW); the filter is
[rows, cols, in_depth, depth_multiplier]; output channel ``c * depth_multiplier + m`` reads
input channel ``c`` through ``filter[:, :, c, m]``.

Unlike TF's kernels, ``dilations`` are honoured (TF's kernels ignore them) and row and
column strides may differ.
"""

from __future__ import annotations

from typing import Any

from . import _arrays
from ._dispatch import prepare, run, select_backend
from ._dtypes import FLOAT_DTYPES
from ._errors import InvalidArgumentError
from ._geometry import conv2d_geometry, input_shape_from_sizes

DEFAULT_DILATIONS = (1, 1, 1, 1)


def depthwise_conv2d_native_backprop_input(input_sizes: Any, filter: Any, out_backprop: Any, strides,
                                           padding, explicit_paddings=(), data_format="NHWC",
                                           dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Gradient of depthwise_conv2d_native w.r.t. its input.

    input_sizes: 1-D ints of 4 entries, the input shape in ``data_format``; filter:
    [rows, cols, in_depth, multiplier]; out_backprop: [N, out_rows, out_cols, in_depth *
    multiplier] in ``data_format``.  Returns the input gradient in the filter's dtype.  On GPU
    arrays gradops' CUDA kernels compute it unless ``backend="cudnn"`` asks for cuDNN
    (``_dispatch.CUDA_BY_DEFAULT``).
    """
    op = "depthwise_conv2d_native_backprop_input"
    sizes = _arrays.host_int_vector(op, "input_sizes", input_sizes)
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, filter=filter, out_backprop=out_backprop)
    input_shape = input_shape_from_sizes(op, sizes, arrays["filter"].shape, arrays["out_backprop"].shape,
                                         data_format, allow_two=False)
    geometry = conv2d_geometry(op, input_shape, arrays["filter"].shape, arrays["out_backprop"].shape,
                               strides, padding, explicit_paddings, data_format, dilations, depthwise=True)
    arrays = _arrays.ready_for_backend(op, where, geometry.input_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.depthwise_conv2d_native_backprop_input, geometry, arrays["filter"], arrays["out_backprop"])


def depthwise_conv2d_native_backprop_filter(input: Any, filter_sizes: Any, out_backprop: Any, strides,
                                            padding, explicit_paddings=(), data_format="NHWC",
                                            dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Gradient of depthwise_conv2d_native w.r.t. its filter.

    input: [N, H, W, in_depth] in ``data_format``; filter_sizes: 1-D ints [rows, cols, in_depth,
    multiplier]; out_backprop: [N, out_rows, out_cols, in_depth * multiplier] in ``data_format``.
    Returns the filter gradient, shape ``filter_sizes``, in the input's dtype.  On GPU arrays
    gradops' CUDA kernels compute it unless ``backend="cudnn"`` asks for cuDNN
    (``_dispatch.CUDA_BY_DEFAULT``).
    """
    op = "depthwise_conv2d_native_backprop_filter"
    sizes = _arrays.host_int_vector(op, "filter_sizes", filter_sizes)
    # TF's messages: each dimension is checked before the rank ("filter must be 4-dimensional").
    for i, v in enumerate(sizes):
        if v < 0:
            raise InvalidArgumentError(f"{op}: Dimension {i} of filter_sizes must be >= 0, got {sizes}")
    if len(sizes) != 4:
        raise InvalidArgumentError(
            f"{op}: filter_sizes must contain 4 values [rows, cols, in_depth, depth_multiplier] "
            f"(filter must be 4-dimensional), got {len(sizes)}: {sizes}")
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, input=input, out_backprop=out_backprop)
    geometry = conv2d_geometry(op, arrays["input"].shape, tuple(sizes), arrays["out_backprop"].shape,
                               strides, padding, explicit_paddings, data_format, dilations, depthwise=True)
    arrays = _arrays.ready_for_backend(op, where, geometry.filter_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    grad = run(impl.depthwise_conv2d_native_backprop_filter, geometry, arrays["input"], arrays["out_backprop"])
    # With in_depth 0 the geometry cannot know the multiplier (out_depth is 0 whatever it is):
    # the backends return [R, S, 0, 0], as empty as filter_sizes' shape.
    return grad if geometry.in_depth else grad.reshape(tuple(sizes))


def depthwise_conv2d_native(input: Any, filter: Any, strides, padding, explicit_paddings=(),
                            data_format="NHWC", dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Forward depthwise convolution (tf.raw_ops.DepthwiseConv2dNative), dilations honoured.

    input in ``data_format``; filter [rows, cols, in_depth, multiplier]; returns
    [N, out_rows, out_cols, in_depth * multiplier] in ``data_format``.
    """
    op = "depthwise_conv2d_native"
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, input=input, filter=filter)
    geometry = conv2d_geometry(op, arrays["input"].shape, arrays["filter"].shape, None, strides, padding,
                               explicit_paddings, data_format, dilations, depthwise=True)
    arrays = _arrays.ready_for_backend(op, where, geometry.out_backprop_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.depthwise_conv2d_native, geometry, arrays["input"], arrays["filter"])
