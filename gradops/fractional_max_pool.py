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

import numpy as np

from . import _arrays
from ._dispatch import arrays_device, prepare, run, select_backend
from ._dtypes import FRACTIONAL_POOL_DTYPES, lowest
from ._errors import InvalidArgumentError
from ._geometry import fractional_max_pool_cells, fractional_pool_forward_geometry


def fractional_max_pool_grad(orig_input: Any, orig_output: Any, out_backprop: Any, row_pooling_sequence: Any,
                             col_pooling_sequence: Any, overlapping=False, name=None, *, backend=None):
    """Gradient of fractional max pooling w.r.t. its input.

    orig_input: [N, in_rows, in_cols, C]; orig_output: the forward result [N, out_rows,
    out_cols, C] (checked: it must equal the maxima TF's rule recomputes); out_backprop:
    orig_output's shape (or, as TF reads it, any shape of at most its size: its flat elements
    in order, the rest zero); pooling sequences: 1-D ints, cell k from entry k to entry k + 1.
    A cell that is empty, or that a sequence of fewer than out_rows + 1 / out_cols + 1 entries
    never defines, and an image or channel of orig_output past orig_input's, chooses nothing
    (orig_output holds the lowest value there), and out_backprop's flat elements must stop
    before the first such entry, as TF requires.
    Returns [N, in_rows, in_cols, C] in the common dtype.
    """
    op = "fractional_max_pool_grad"
    rows = _arrays.host_int_vector(op, "row_pooling_sequence", row_pooling_sequence)
    cols = _arrays.host_int_vector(op, "col_pooling_sequence", col_pooling_sequence)
    where, arrays, dtype = prepare(op, FRACTIONAL_POOL_DTYPES, orig_input=orig_input, orig_output=orig_output,
                                   out_backprop=out_backprop)
    geometry, kept_rows, kept_cols = fractional_max_pool_cells(
        op, arrays["orig_input"].shape, arrays["orig_output"].shape, arrays["out_backprop"].shape, rows, cols,
        overlapping)
    live = (geometry.batch, len(kept_rows), len(kept_cols), geometry.depth)
    if live != arrays["orig_output"].shape:  # entries holding no element's maximum
        with arrays_device(arrays.values()):
            arrays["orig_output"] = without_empty_cells(op, arrays["orig_output"], live[0], kept_rows, kept_cols,
                                                        live[3])
    # TF reads out_backprop flat, in order, as far as it goes: another shape of orig_output's
    # size is the same gradient, a smaller one is padded with zeros (validated, once).
    pad_bytes = _arrays.zero_extension_bytes(arrays["out_backprop"], geometry.output_shape)
    arrays = _arrays.ready_for_backend(op, where, geometry.input_shape, arrays, extra_bytes=pad_bytes)
    arrays["out_backprop"] = _arrays.zero_extended(arrays["out_backprop"], geometry.output_shape, flat=True)
    impl = select_backend(op, where, backend, geometry, dtype, arrays=arrays)
    if not geometry.holds_elements:  # TF chooses nothing: the gradient is zero
        with arrays_device(arrays.values()):
            return (np if where == _arrays.HOST else _cupy()).zeros(geometry.input_shape, dtype)
    return run(impl.fractional_max_pool_grad, geometry, arrays["orig_input"], arrays["orig_output"],
               arrays["out_backprop"])


#: orig_output elements compared at a time in empty cells on the host: a broadcast orig_output
#: of millions of empty-cell entries makes no temporary of their size ...
EMPTY_CELLS_CHUNK = 1 << 14
#: ... and on a GPU, where each chunk's answer is read back (a host synchronisation).
EMPTY_CELLS_GPU_CHUNK = 1 << 22


def without_empty_cells(op: str, orig_output, batch: int, kept_rows: tuple[int, ...], kept_cols: tuple[int, ...],
                        depth: int):
    """orig_output [out_batch, out_rows, out_cols, out_depth] (NumPy or CuPy) at its entries
    that hold a maximum: the first ``batch`` images, the cells that hold elements (rows
    ``kept_rows``, columns ``kept_cols``), the first ``depth`` channels; what the backends
    take, in the same order.

    TF's walk leaves the maximum of an empty cell (or of one the sequences never define), and
    of an image or channel past orig_input's, at T's lowest value and chooses nothing there;
    the geometry has let no out_backprop element reach such an entry.  So orig_output must
    hold that value there (TF's "tensor_out_dup is not the same as tensor_out" check),
    compared here in chunks, bit for bit (NaN is refused).
    """
    # a NumPy scalar (CuPy takes those as operands, not NumPy arrays, even 0-d ones)
    bits = np.asarray(lowest(orig_output.dtype)).view(f"u{orig_output.dtype.itemsize}")[()]
    # the unsigned integers of orig_output's bytes, in its byte order (a host array may be swapped)
    as_bits = bits.dtype if orig_output.dtype.isnative else bits.dtype.newbyteorder()
    # orig_output's unvisited images; in the others, its unvisited channels; in the visited
    # ones, its empty row cells, then its empty column cells (none kept: the rows' were all)
    every = slice(None)
    regions = [(slice(batch, None), every, every, every), (slice(0, batch), every, every, slice(depth, None))]
    regions += [(slice(0, batch), slice(start, stop), every, slice(0, depth))
                for start, stop in _gaps(kept_rows, orig_output.shape[1])]
    regions += [(slice(0, batch), every, slice(start, stop), slice(0, depth))
                for start, stop in _gaps(kept_cols, orig_output.shape[2]) if kept_rows]
    for region in regions:
        view = orig_output[region]
        if view.size:
            found = _first_other(view.view(as_bits), bits, EMPTY_CELLS_CHUNK if _arrays.location(orig_output)
                                 == _arrays.HOST else EMPTY_CELLS_GPU_CHUNK)
            if found is not None:
                at = [i + (r.start or 0) for i, r in zip(found[0], region)]
                held = found[1]
                value = np.asarray(held, bits.dtype).view(lowest(orig_output.dtype).dtype)[()]  # native order
                raise InvalidArgumentError(
                    f"{op}: orig_output is not the max pooling of orig_input over the pooling sequences (TF: "
                    f"tensor_out_dup is not the same as tensor_out): at {at} orig_output holds {value!r}, but TF's "
                    f"walk chooses no element for that entry (an empty or unvisited cell, image or channel), so its "
                    f"maximum stays the lowest value {lowest(orig_output.dtype)!r}")
    return orig_output[:batch, _index(kept_rows)][:, :, _index(kept_cols)][..., :depth]


def _gaps(kept: tuple[int, ...], size: int):
    """(start, stop) of each run of 0 .. size - 1 not in ``kept`` (increasing)."""
    previous = 0
    for k in [*kept, size]:
        if k > previous:
            yield previous, k
        previous = k + 1


def _index(kept: tuple[int, ...]):
    """A slice where ``kept`` is a run of consecutive numbers (a view, even of a broadcast), else the list."""
    return slice(kept[0], kept[-1] + 1) if kept and kept[-1] - kept[0] + 1 == len(kept) else list(kept)


def _first_other(view, value, chunk: int) -> tuple[list[int], int] | None:
    """(index, value) of the first element of ``view`` (4-D, any strides) other than ``value``
    in C order, or None; compared in chunks of at most ``chunk`` elements."""
    steps, room = [1, 1, 1, 1], chunk
    for axis in (3, 2, 1, 0):  # an axis takes more than one index only when the later ones are whole
        steps[axis] = max(1, min(view.shape[axis], room))
        if steps[axis] < view.shape[axis]:
            break
        room //= max(1, view.shape[axis])
    for corner in _c_order([-(-n // step) for n, step in zip(view.shape, steps)]):
        first = [c * step for c, step in zip(corner, steps)]
        chunk = view[tuple(slice(f, f + step) for f, step in zip(first, steps))]
        other = chunk != value
        if bool(other.any()):
            where = [int(i) for i in np.unravel_index(int(other.reshape(-1).argmax()), chunk.shape)]
            return [f + i for f, i in zip(first, where)], int(chunk[tuple(where)])
    return None


def _c_order(counts: list[int]):
    """Every index of a grid of ``counts`` (all positive) in C order, one at a time (np.ndindex
    and itertools.product hold the whole range: 10 MB for 2**18 chunks)."""
    index = [0] * len(counts)
    while True:
        yield index
        for axis in reversed(range(len(counts))):
            index[axis] += 1
            if index[axis] < counts[axis]:
                break
            index[axis] = 0
        else:
            return


def _cupy():
    import cupy

    return cupy


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
