"""Fractional max pooling's gradient (tf.raw_ops.FractionalMaxPoolGrad), and its forward op.

Layout is NHWC throughout (TF's fractional pooling has no data_format).  Output cell (r, c)
covers input rows ``row_pooling_sequence[r] .. row_pooling_sequence[r+1]`` (inclusive when
``overlapping``, else exclusive) and likewise for columns, ends clamped to the input edge.

Which element of a cell receives the cell's gradient is TF's rule, per (batch, channel): the
cell is scanned row by row, each row left to right; the first element is taken, and a later
one replaces the current choice only if it is strictly greater (``current < x``).  So ties go
to the first maximum in that order; a NaN is never chosen unless it is the cell's first
element, and then nothing replaces it (and TF refuses the call, since NaN != orig_output).
The gradient is out_backprop summed per chosen element in output order, in the element type
(float32 for float16/bfloat16, cast once).
"""

from __future__ import annotations

from typing import Any

from . import _arrays
from ._dispatch import prepare, run, select_backend
from ._dtypes import FRACTIONAL_POOL_DTYPES
from ._geometry import fractional_max_pool_geometry, fractional_pool_forward_geometry


def fractional_max_pool_grad(orig_input: Any, orig_output: Any, out_backprop: Any, row_pooling_sequence: Any,
                             col_pooling_sequence: Any, overlapping=False, name=None, *, backend=None):
    """Gradient of fractional max pooling w.r.t. its input.

    orig_input: [N, in_rows, in_cols, C]; orig_output: the forward result [N, out_rows,
    out_cols, C] (checked: it must equal the maxima TF's rule recomputes); out_backprop:
    orig_output's shape (or, as TF reads it, any shape of at most its size: its flat elements
    in order, the rest zero); pooling sequences: 1-D ints of at least out_rows + 1 /
    out_cols + 1 entries.  Returns [N, in_rows, in_cols, C] in the common dtype.
    """
    op = "fractional_max_pool_grad"
    rows = _arrays.host_int_vector(op, "row_pooling_sequence", row_pooling_sequence)
    cols = _arrays.host_int_vector(op, "col_pooling_sequence", col_pooling_sequence)
    where, arrays, dtype = prepare(op, FRACTIONAL_POOL_DTYPES, orig_input=orig_input, orig_output=orig_output,
                                   out_backprop=out_backprop)
    geometry = fractional_max_pool_geometry(op, arrays["orig_input"].shape, arrays["orig_output"].shape,
                                            arrays["out_backprop"].shape, rows, cols, overlapping)
    # TF reads out_backprop flat, in order, as far as it goes: another shape of orig_output's
    # size is the same gradient, a smaller one is padded with zeros (validated, once).
    pad_bytes = _arrays.zero_extension_bytes(arrays["out_backprop"], geometry.output_shape)
    arrays = _arrays.ready_for_backend(op, where, geometry.input_shape, arrays, extra_bytes=pad_bytes)
    arrays["out_backprop"] = _arrays.zero_extended(arrays["out_backprop"], geometry.output_shape, flat=True)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.fractional_max_pool_grad, geometry, arrays["orig_input"], arrays["orig_output"],
               arrays["out_backprop"])


def fractional_max_pool(value: Any, row_pooling_sequence: Any, col_pooling_sequence: Any, overlapping=False,
                        name=None, *, backend=None):
    """Forward fractional max pooling over given pooling sequences.

    tf.raw_ops.FractionalMaxPool draws its sequences at random and returns them; here they
    are arguments, so the op is deterministic.  value: [N, in_rows, in_cols, C]; returns [N,
    out_rows, out_cols, C] with out_rows = len(row_pooling_sequence) - 1.  As TF's forward
    kernel computes it: each cell's maximum ignoring NaN (a running ``max`` from the type's
    lowest value), so a cell of NaNs only, or an empty cell, gives the lowest value, and a
    maximum of 0 has the sign of the cell's first zero (row by row, each row left to right).
    """
    op = "fractional_max_pool"
    rows = _arrays.host_int_vector(op, "row_pooling_sequence", row_pooling_sequence)
    cols = _arrays.host_int_vector(op, "col_pooling_sequence", col_pooling_sequence)
    where, arrays, dtype = prepare(op, FRACTIONAL_POOL_DTYPES, value=value)
    geometry = fractional_pool_forward_geometry(op, arrays["value"].shape, rows, cols, overlapping)
    arrays = _arrays.ready_for_backend(op, where, geometry.output_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.fractional_max_pool, geometry, arrays["value"])
