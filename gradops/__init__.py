"""gradops: TensorFlow's convolution and pooling gradient ops, on NumPy, our CUDA kernels and cuDNN.

The eight gradient ops keep tf.raw_ops' names, argument order, defaults and meaning; each also
takes ``backend=None | "numpy" | "cuda" | "cudnn"``.  NumPy arrays in give NumPy arrays out.
"""

from ._dispatch import BACKENDS, BackendDecision, backend_status, last_backend_decision
from ._errors import BackendUnavailableError, InvalidArgumentError
from ._options import Options, get_options, options, set_options
from .conv2d import (
    conv2d,
    conv2d_backprop_filter,
    conv2d_backprop_filter_v2,
    conv2d_backprop_input,
    conv2d_backprop_input_v2,
)
from .depthwise import (
    depthwise_conv2d_native,
    depthwise_conv2d_native_backprop_filter,
    depthwise_conv2d_native_backprop_input,
)
from .fractional_avg_pool import fractional_avg_pool, fractional_avg_pool_grad, fractional_pooling_sequence
from .fractional_max_pool import fractional_max_pool, fractional_max_pool_grad

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendDecision",
    "BackendUnavailableError",
    "InvalidArgumentError",
    "Options",
    "backend_status",
    "conv2d",
    "conv2d_backprop_filter",
    "conv2d_backprop_filter_v2",
    "conv2d_backprop_input",
    "conv2d_backprop_input_v2",
    "depthwise_conv2d_native",
    "depthwise_conv2d_native_backprop_filter",
    "depthwise_conv2d_native_backprop_input",
    "fractional_avg_pool",
    "fractional_avg_pool_grad",
    "fractional_max_pool",
    "fractional_max_pool_grad",
    "fractional_pooling_sequence",
    "get_options",
    "last_backend_decision",
    "options",
    "set_options",
]
