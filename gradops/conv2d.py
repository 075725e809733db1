"""Conv2D gradients with TensorFlow's semantics (tf.raw_ops.Conv2DBackpropFilter/Input and V2).

Layouts: ``input``/``out_backprop`` are [N, H, W, C] (NHWC) or [N, C, H, W] (NCHW) as
``data_format`` says; filters are always HWIO [rows, cols, in_depth / groups, out_depth].
Grouped convolution follows from the shapes: groups = input depth / filter in_depth.
"""

from __future__ import annotations

from typing import Any

from . import _arrays
from ._dispatch import check_use_cudnn, prepare, run, select_backend
from ._dtypes import FLOAT_DTYPES
from ._geometry import conv2d_geometry, filter_shape_from_sizes, input_shape_from_sizes

DEFAULT_DILATIONS = (1, 1, 1, 1)


def _backprop_filter(op, input, filter_shape, out_backprop, strides, padding, use_cudnn_on_gpu,
                     explicit_paddings, data_format, dilations, backend):
    use_cudnn_on_gpu = check_use_cudnn(op, use_cudnn_on_gpu)
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, input=input, out_backprop=out_backprop)
    geometry = conv2d_geometry(op, arrays["input"].shape, filter_shape, arrays["out_backprop"].shape,
                               strides, padding, explicit_paddings, data_format, dilations)
    arrays = _arrays.ready_for_backend(op, where, geometry.filter_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, use_cudnn_on_gpu, arrays=arrays)
    return run(impl.conv2d_backprop_filter, geometry, arrays["input"], arrays["out_backprop"])


def _backprop_input(op, input_shape_fn, filter, out_backprop, strides, padding, use_cudnn_on_gpu,
                    explicit_paddings, data_format, dilations, backend):
    use_cudnn_on_gpu = check_use_cudnn(op, use_cudnn_on_gpu)
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, filter=filter, out_backprop=out_backprop)
    input_shape = input_shape_fn(arrays["filter"].shape, arrays["out_backprop"].shape)
    geometry = conv2d_geometry(op, input_shape, arrays["filter"].shape, arrays["out_backprop"].shape,
                               strides, padding, explicit_paddings, data_format, dilations)
    arrays = _arrays.ready_for_backend(op, where, geometry.input_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, use_cudnn_on_gpu, arrays=arrays)
    return run(impl.conv2d_backprop_input, geometry, arrays["filter"], arrays["out_backprop"])


def conv2d_backprop_filter(input: Any, filter_sizes: Any, out_backprop: Any, strides, padding,
                           use_cudnn_on_gpu=True, explicit_paddings=(), data_format="NHWC",
                           dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Gradient of conv2d w.r.t. its filter (tf.raw_ops.Conv2DBackpropFilter).

    input: [N, H, W, C] or [N, C, H, W]; filter_sizes: 1-D ints [rows, cols, in_depth, out_depth];
    out_backprop: [N, out_rows, out_cols, out_depth] in ``data_format``.
    Returns the filter gradient, shape ``filter_sizes`` (HWIO), in the input's dtype.
    """
    op = "conv2d_backprop_filter"
    filter_shape = filter_shape_from_sizes(op, _arrays.host_int_vector(op, "filter_sizes", filter_sizes))
    return _backprop_filter(op, input, filter_shape, out_backprop, strides, padding, use_cudnn_on_gpu,
                            explicit_paddings, data_format, dilations, backend)


def conv2d_backprop_filter_v2(input: Any, filter: Any, out_backprop: Any, strides, padding,
                              use_cudnn_on_gpu=True, explicit_paddings=(), data_format="NHWC",
                              dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """As :func:`conv2d_backprop_filter`, the filter shape taken from ``filter`` (values unused)."""
    op = "conv2d_backprop_filter_v2"
    where, arrays, _ = prepare(op, FLOAT_DTYPES, input=input, filter=filter)  # TF types filter as T
    return _backprop_filter(op, arrays["input"], arrays["filter"].shape, out_backprop, strides, padding,
                            use_cudnn_on_gpu, explicit_paddings, data_format, dilations, backend)


def conv2d_backprop_input(input_sizes: Any, filter: Any, out_backprop: Any, strides, padding,
                          use_cudnn_on_gpu=True, explicit_paddings=(), data_format="NHWC",
                          dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Gradient of conv2d w.r.t. its input (tf.raw_ops.Conv2DBackpropInput).

    input_sizes: 1-D ints, the input shape in ``data_format`` or just [rows, cols] (batch taken
    from out_backprop, depth from the filter); filter: HWIO; out_backprop in ``data_format``.
    Returns the 4-D input gradient (shape ``input_sizes``, or with [rows, cols] the batch and
    depth so taken) in the filter's dtype.
    """
    op = "conv2d_backprop_input"
    sizes = _arrays.host_int_vector(op, "input_sizes", input_sizes)

    def input_shape_fn(filter_shape, out_backprop_shape):
        return input_shape_from_sizes(op, sizes, filter_shape, out_backprop_shape, data_format)

    return _backprop_input(op, input_shape_fn, filter, out_backprop, strides, padding, use_cudnn_on_gpu,
                           explicit_paddings, data_format, dilations, backend)


def conv2d_backprop_input_v2(input: Any, filter: Any, out_backprop: Any, strides, padding,
                             use_cudnn_on_gpu=True, explicit_paddings=(), data_format="NHWC",
                             dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """As :func:`conv2d_backprop_input`, the input shape taken from ``input`` (values unused)."""
    op = "conv2d_backprop_input_v2"
    where, arrays, _ = prepare(op, FLOAT_DTYPES, input=input, filter=filter)  # TF types input as T
    input_shape = arrays["input"].shape
    return _backprop_input(op, lambda *_: input_shape, arrays["filter"], out_backprop, strides, padding,
                           use_cudnn_on_gpu, explicit_paddings, data_format, dilations, backend)


def conv2d(input: Any, filter: Any, strides, padding, use_cudnn_on_gpu=True, explicit_paddings=(),
           data_format="NHWC", dilations=DEFAULT_DILATIONS, name=None, *, backend=None):
    """Forward convolution (tf.raw_ops.Conv2D), the op whose gradients the others are.

    input: [N, H, W, C] or [N, C, H, W]; filter: HWIO [rows, cols, C / groups, out_depth].
    Returns [N, out_rows, out_cols, out_depth] in ``data_format``.
    """
    op = "conv2d"
    use_cudnn_on_gpu = check_use_cudnn(op, use_cudnn_on_gpu)
    where, arrays, dtype = prepare(op, FLOAT_DTYPES, input=input, filter=filter)
    geometry = conv2d_geometry(op, arrays["input"].shape, arrays["filter"].shape, None,
                               strides, padding, explicit_paddings, data_format, dilations)
    arrays = _arrays.ready_for_backend(op, where, geometry.out_backprop_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, use_cudnn_on_gpu, arrays=arrays)
    return run(impl.conv2d, geometry, arrays["input"], arrays["filter"])
