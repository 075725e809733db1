"""Fractional average pooling's gradient (tf.raw_ops.FractionalAvgPoolGrad), and its forward op.

Layout is NHWC throughout (TF's fractional pooling has no data_format).  Output cell (r, c)
averages input rows ``row_pooling_sequence[r] .. row_pooling_sequence[r+1]`` (inclusive when
``overlapping``, else exclusive) and likewise for columns, ends clamped to the input edge, as
TF's FractionalAvgPoolGrad reads the sequences: in any order, a cell that ends before it
starts (decreasing entries, equal entries when not overlapping, a start past the input) being
empty.  An empty cell spreads no gradient, and averages to 0 in the forward op.  The gradient's
sums run in float64 and are cast once, truncating toward zero for integer types, as TF's
FractionalAvgPoolGrad does; the forward op adds as TF's FractionalAvgPool does, in the element
type (float32 for the half types), so both are TF's bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _arrays
from ._dispatch import prepare, run, select_backend
from ._dtypes import FRACTIONAL_POOL_DTYPES
from ._errors import InvalidArgumentError
from ._geometry import fractional_pool_forward_geometry, fractional_pool_geometry, pooling_sequence_args


def fractional_avg_pool_grad(orig_input_tensor_shape: Any, out_backprop: Any, row_pooling_sequence: Any,
                             col_pooling_sequence: Any, overlapping=False, name=None, *, backend=None):
    """Gradient of fractional average pooling w.r.t. its input.

    orig_input_tensor_shape: 1-D ints [N, in_rows, in_cols, C]; out_backprop: [N, out_rows,
    out_cols, C] (or fewer images or channels, as TF allows: the rest of the gradient is
    zero; more only where every cell is empty, which gives zeros, as in TF); pooling
    sequences: ints of any rank, read flat as TF reads them, of at least out_rows + 1 /
    out_cols + 1 entries.
    Returns [N, in_rows, in_cols, C] in out_backprop's dtype.
    """
    op = "fractional_avg_pool_grad"
    orig_shape = _arrays.host_int_vector(op, "orig_input_tensor_shape", orig_input_tensor_shape)
    # TF's kernel reads the sequences flat, whatever their rank (its max pooling wants 1-D).
    rows = _arrays.host_int_vector(op, "row_pooling_sequence", row_pooling_sequence, flat=True)
    cols = _arrays.host_int_vector(op, "col_pooling_sequence", col_pooling_sequence, flat=True)
    where, arrays, dtype = prepare(op, FRACTIONAL_POOL_DTYPES, out_backprop=out_backprop)
    geometry = fractional_pool_geometry(op, orig_shape, arrays["out_backprop"].shape, rows, cols, overlapping)
    # More images or channels than the input pass validation only where no cell holds an input
    # element: what lies past the input's batch and depth is then never read.
    arrays["out_backprop"] = arrays["out_backprop"][:geometry.batch, :, :, :geometry.depth]
    # An out_backprop of fewer images or channels than the input (TF leaves the rest of the
    # gradient zero) is padded with zeros to geometry.output_shape, once validated.
    pad_bytes = _arrays.zero_extension_bytes(arrays["out_backprop"], geometry.output_shape)
    # The result's own memory check first (its message is the precise one), then the tables',
    # both before ready_for_backend copies anything.
    _arrays.check_fits_in_memory(op, where, geometry.input_shape, *arrays.values(), extra_bytes=pad_bytes)
    _check_cell_tables_fit(op, where, geometry, arrays, pad_bytes)
    arrays = _arrays.ready_for_backend(op, where, geometry.input_shape, arrays)
    arrays["out_backprop"] = _arrays.zero_extended(arrays["out_backprop"], geometry.output_shape)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.fractional_avg_pool_grad, geometry, arrays["out_backprop"])


def _check_cell_tables_fit(op: str, where: str, g, arrays: dict[str, Any], pad_bytes: int) -> None:
    """Every backend lists, on the host, the cells containing each input index: one int64 per
    (index, cell) pair, which grows with how much the cells overlap rather than with the
    tensors (n cells each covering all rows hold n * rows pairs).  Building the lists holds
    about four such arrays; refuse a call for which that cannot fit in this machine's memory.
    The GPU backend then uploads them with per-index offsets, cell sizes and per-tile cell
    ranges (at most 8 bytes each): refuse a GPU call whose tables cannot fit beside its result
    and out_backprop (and its ``pad_bytes`` zero-extended copy) in the GPU's memory."""
    entries = g.cell_table_entries
    need = 4 * 8 * entries
    limit = _arrays.host_memory_bytes()
    if need > limit:
        raise InvalidArgumentError(
            f"{op}: the cells of row_pooling_sequence and col_pooling_sequence hold {entries} (input index, "
            f"cell) pairs in all; listing them per input index needs about {need} bytes, more than this "
            f"machine's {limit} bytes of memory")
    if where != _arrays.GPU:
        return
    tables = gpu_table_bytes(g)
    need = tables + _arrays.tensor_bytes(g.input_shape, *arrays.values()) + pad_bytes
    limit = _arrays.memory_bytes(where, arrays.values())
    if need > limit:
        raise InvalidArgumentError(
            f"{op}: the cells of row_pooling_sequence and col_pooling_sequence hold {entries} (input index, "
            f"cell) pairs in all; their GPU tables ({tables} bytes at most) beside the result and "
            f"out_backprop need about {need} bytes, more than the GPU's {limit} bytes of memory")


def gpu_table_bytes(g) -> int:
    """An upper bound of the GPU backend's tables for geometry ``g``, in bytes: per dimension
    the per-index offsets (size + 1), the cell lists, each cell's size and the per-tile cell
    ranges (two per tile, at most 2 * (size + 1)), 8 bytes each (64-bit indexing)."""
    return 8 * (g.cell_table_entries + 3 * (g.in_rows + g.in_cols + 2) + len(g.row_starts) + len(g.col_starts))


def fractional_avg_pool(value: Any, row_pooling_sequence: Any, col_pooling_sequence: Any, overlapping=False,
                        name=None, *, backend=None):
    """Forward fractional average pooling over given pooling sequences.

    tf.raw_ops.FractionalAvgPool draws its sequences at random from ``pooling_ratio`` and
    returns them; here they are arguments (see :func:`fractional_pooling_sequence`), so the op
    is deterministic.  value: [N, in_rows, in_cols, C]; returns [N, out_rows, out_cols, C] with
    out_rows = len(row_pooling_sequence) - 1.  As TF computes it: each cell's running sum from
    zero, row by row and each row left to right, in value's type (float32 for float16/bfloat16,
    cast once; integers wrap on overflow), divided by the cell's element count as TF counts
    it, in that type (a float32 count stops at 2**24; integers truncated toward zero).  An
    integer value with a cell of more elements than its type holds is refused: TF's count
    would overflow (undefined, and zero at 2**32 elements in int32).
    """
    op = "fractional_avg_pool"
    rows = _arrays.host_int_vector(op, "row_pooling_sequence", row_pooling_sequence)
    cols = _arrays.host_int_vector(op, "col_pooling_sequence", col_pooling_sequence)
    where, arrays, dtype = prepare(op, FRACTIONAL_POOL_DTYPES, value=value)
    geometry = fractional_pool_forward_geometry(op, arrays["value"].shape, rows, cols, overlapping)
    if dtype.kind == "i" and geometry.largest_cell > np.iinfo(dtype).max:
        raise InvalidArgumentError(
            f"{op}: value is {dtype.name} and a pooling cell holds {geometry.largest_cell} elements: its "
            f"element count, which TF keeps in {dtype.name}, would overflow (at most {np.iinfo(dtype).max})")
    arrays = _arrays.ready_for_backend(op, where, geometry.output_shape, arrays)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    return run(impl.fractional_avg_pool, geometry, arrays["value"])


def fractional_pooling_sequence(input_size: int, pooling_ratio: float, pseudo_random: bool = False,
                                seed: int | None = None) -> np.ndarray:
    """A pooling sequence as TF's FractionalAvgPool draws it (fractional_pool_common.cc).

    Output size is floor(input_size / pooling_ratio); the sequence has that many + 1 entries,
    from 0 to input_size.  ``pseudo_random`` picks the paper's a_i = ceil(alpha * (i + u))
    sequence, otherwise cell sizes k and k + 1 are shuffled.  TF's Philox stream is not
    reproduced: the same seed gives a different (equally valid) sequence than TF.
    """
    op = "fractional_pooling_sequence"
    input_size, pooling_ratio, pseudo_random, seed = pooling_sequence_args(
        op, input_size, pooling_ratio, pseudo_random, seed)
    output_size = int(math.floor(input_size / pooling_ratio))
    if output_size <= 0:
        raise InvalidArgumentError(
            f"{op}: input_size {input_size} / pooling_ratio {pooling_ratio} gives no output "
            "(output size must be positive)")
    _arrays.check_fits_in_memory(op, _arrays.HOST, (output_size + 1,))
    rng = np.random.default_rng(seed)
    if input_size % output_size == 0:
        diff = np.full(output_size, input_size // output_size, np.int64)
    elif pseudo_random:
        alpha = input_size / output_size
        k = input_size // output_size
        max_u = min((k + 2) / alpha - 1, (input_size + 1 - k) / alpha - (output_size - 1))
        u = rng.random() * max_u
        cum = np.empty(output_size + 1, np.int64)
        cum[0], cum[output_size] = 1, input_size + 1
        cum[1:output_size] = np.ceil(alpha * (np.arange(1, output_size) + u))
        diff = np.diff(cum)
    else:
        k, extra = divmod(input_size, output_size)
        diff = np.full(output_size, k, np.int64)
        diff[:extra] += 1
        rng.shuffle(diff)
    return np.concatenate([[0], np.cumsum(diff)]).astype(np.int64)
