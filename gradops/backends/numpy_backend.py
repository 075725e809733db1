"""NumPy backend: the reference every GPU backend is tested against, and the CPU fallback.

Each function takes a validated geometry from ``gradops._geometry`` and NumPy arrays in the
geometry's layout, and returns a new array in the input dtype.  Convolutions run as one
vectorised contraction per filter tap over all batches and output positions: a tap's valid
output range is computed in closed form, so padding is not materialised (explicit paddings
can be huge) and no work is spent on padded zeros.  The exceptions, where padding is modest:
unit-stride convolutions, where a zero-padded flat copy turns every tap into contiguous rows
(see ``_flat_layout``), and the depthwise input gradient, one einsum per stride phase over
a zero-padded copy of out_backprop (``_depthwise_input_grad``).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .._dtypes import accumulator_dtype
from .._dtypes import lowest as dtype_lowest
from .._errors import InvalidArgumentError
from .._geometry import Conv2DGeometry, FractionalPoolGeometry

NAME = "numpy"


def available() -> tuple[bool, str]:
    return True, "always available"


def supports(op, geometry, dtype) -> tuple[bool, str]:
    return True, "computes every valid call"


# --------------------------------------------------------------------------- helpers


def _to_nhwc(x: np.ndarray, data_format: str) -> np.ndarray:
    return x if data_format == "NHWC" else x.transpose(0, 2, 3, 1)


def _from_nhwc(x: np.ndarray, data_format: str) -> np.ndarray:
    return x if data_format == "NHWC" else x.transpose(0, 3, 1, 2)


def _tap_range(out_size: int, in_size: int, stride: int, offset: int):
    """Output indices o in [o_begin, o_end) whose input index o*stride + offset is in [0, in_size).

    ``offset`` is ``tap * dilation - pad_before``.  Returns (o_begin, o_end, i_begin); empty
    ranges have o_end <= o_begin.
    """
    o_begin = max(0, -(offset // stride)) if offset < 0 else 0  # ceil(-offset / stride)
    o_end = min(out_size, (in_size - 1 - offset) // stride + 1) if in_size - 1 - offset >= 0 else 0
    return o_begin, o_end, o_begin * stride + offset


def _dim_taps(filter_size, out_size, in_size, stride, dilation, pad_before):
    """[(tap, out_slice, in_slice)] for the taps of one spatial dimension that reach the input."""
    taps = []
    for t in range(filter_size):
        o0, o1, i0 = _tap_range(out_size, in_size, stride, t * dilation - pad_before)
        if o1 > o0:
            taps.append((t, slice(o0, o1), slice(i0, i0 + (o1 - o0 - 1) * stride + 1, stride)))
    return taps


def _row_taps(g: Conv2DGeometry):
    return _dim_taps(g.filter_rows, g.out_rows, g.in_rows, g.stride_rows, g.dilation_rows, g.pad_top)


def _col_taps(g: Conv2DGeometry):
    return _dim_taps(g.filter_cols, g.out_cols, g.in_cols, g.stride_cols, g.dilation_cols, g.pad_left)


def _taps(g: Conv2DGeometry):
    """Yield (r, s, out_slices, in_slices) for each filter tap that reaches the input.

    ``out_slices``/``in_slices`` index the (rows, cols) axes of NHWC output/input arrays; the
    two views have equal shapes.
    """
    col_taps = _col_taps(g)
    for r, rows_out, rows_in in _row_taps(g):
        for s, cols_out, cols_in in col_taps:
            yield r, s, (rows_out, cols_out), (rows_in, cols_in)


def _reshaped_view(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``array`` in ``shape`` as a view (writes go through); raises ValueError where that
    would need a copy.  NumPy 2.5 deprecates setting ``.shape``, which did this before
    ``reshape(copy=False)`` (NumPy 2.1)."""
    try:
        return np.reshape(array, shape, copy=False)
    except TypeError:  # NumPy < 2.1: reshape has no copy argument
        view = array.view()
        try:
            view.shape = shape
        except AttributeError as error:
            raise ValueError(str(error)) from None
        return view


def _split_last(view: np.ndarray, groups: int) -> np.ndarray:
    """[..., G * K] -> [..., G, K] as a view (writes go through); never a copy."""
    return _reshaped_view(view, view.shape[:-1] + (groups, view.shape[-1] // groups))


def _dot(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """np.dot(a, b) of a [m, k] and b [k, n], with every product IEEE's and TF's +0 sums.

    BLAS may skip a product whose scalar operand is zero: OpenBLAS does for an inner size of 1
    (its axpy and scal by 0 return early), so inf * 0 came out 0, not NaN; and a lone -0 product
    stayed -0 where TF's sums, which start from +0, give +0.  An inner size of 1 is a broadcast
    product instead, plus +0.
    """
    if a.shape[1] != 1:
        return np.dot(a, b, out=out)
    out = np.multiply(a, b, out=out)
    out += 0.0  # -0 -> +0, as a sum from +0 gives; every other value unchanged
    return out


def _accumulate_tap(dst: np.ndarray, src: np.ndarray, w_tap: np.ndarray) -> None:
    """dst[n, h, w, (g, o)] += sum_k src[n, h, w, (g, k)] * w_tap[g, k, o], one tap's contribution.

    ``dst``/``src`` are strided [n, h, w, C] views; ``w_tap`` is [G, K, O].
    """
    groups, k, o = w_tap.shape
    n, h, w, _ = src.shape
    if groups == 1:  # a plain matrix product: BLAS (np.dot measured faster than matmul here)
        dst += _dot(src.reshape(n * h * w, k), w_tap[0]).reshape(n, h, w, o)
        return
    if k == 1 and o == 1:  # depthwise, multiplier 1: one weight per channel, contiguous
        dst += src * w_tap[:, 0, 0]
        return
    src_g, dst_g = _split_last(src, groups), _split_last(dst, groups)
    if k == 1:  # depthwise forward: a broadcast product, no reduction
        dst_g += src_g * w_tap[:, 0, :]
    elif o == 1:  # depthwise input gradient: a few multiply-adds beat einsum's generic loop
        for j in range(k):
            dst += src_g[..., j] * w_tap[:, j, 0]
    else:
        dst_g += np.einsum("nhwgk,gko->nhwgo", src_g, w_tap, optimize=True)


def _filter_by_group(w: np.ndarray, groups: int) -> np.ndarray:
    """HWIO filter [R, S, Cg, O] -> [R, S, G, Cg, O/G] (group g owns output channels g*O/G...)."""
    r, s, cg, o = w.shape
    return w.reshape(r, s, cg, groups, o // groups).transpose(0, 1, 3, 2, 4)


def _hwio(g: Conv2DGeometry, filter: np.ndarray) -> np.ndarray:
    """The filter as HWIO; a depthwise [R, S, C, M] filter is [R, S, 1, C*M]."""
    if g.depthwise:
        return filter.reshape(g.filter_rows, g.filter_cols, 1, g.out_depth)
    return filter


def _is_empty(*shapes) -> bool:
    return any(0 in shape for shape in shapes)


# --------------------------------------------------------------------------- convolutions

# Batch chunks are sized so one chunk's operands stay in a core's caches while all filter
# taps are applied to it (a whole-tensor pass per tap would stream from DRAM each time), and
# so that each of NumPy's calls on a chunk is long enough to pay for its own overhead.  On
# 2 cores with 2 MiB of L2 each, 4 MiB chunks were 1.1-1.6x faster than 1 MiB ones in the
# depthwise gradients (8x56x56x96 to 64x7x7x960; 2026-12-02).
_CHUNK_BYTES = 4 << 20
_WORKERS = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))
_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:  # two threads' first calls must not start two pools
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="gradops")
        return _POOL


def _forget_pool_in_child() -> None:
    """After ``fork``: the child inherits the pool object but none of its threads (and maybe a
    lock another thread held), so work submitted to it would wait forever; the child starts its
    own pool on its first call."""
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_in_child)


def _submit(fn, *args):
    """``fn(*args)`` on the thread pool, under the caller's NumPy floating-point error settings
    (``np.errstate`` is per thread, and pool threads would otherwise warn where the caller
    asked for silence)."""
    settings = np.geterr()

    def call():
        with np.errstate(**settings):
            return fn(*args)

    return _pool().submit(call)


def _in_order(fn, slices):
    """``fn(sl)`` for each slice, yielded in slice order: computed on the thread pool (NumPy's
    loops release the GIL) where there are workers and several slices, else one by one as
    they are consumed.  Where the pool takes no more work (it is shut down once the interpreter
    starts to exit, before ``atexit`` handlers run; or no thread can be started), the rest are
    computed here: the slices, and so the results, do not depend on where they run."""
    if _WORKERS == 1 or len(slices) == 1:
        return map(fn, slices)
    futures = []
    for index, sl in enumerate(slices):
        try:
            futures.append(_submit(fn, sl))
        except RuntimeError:
            return itertools.chain(_results(futures), map(fn, slices[index:]))
    return _results(futures)


def _results(futures):
    """The futures' results in order; a caller that stops early (Ctrl-C, an error in one
    chunk) cancels the chunks not yet started, which would otherwise run on and hold up the
    next call's chunks behind them."""
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()


def _image_bytes(g: Conv2DGeometry, acc: np.dtype) -> int:
    """Bytes of one image's input plus its out_backprop in the accumulator type."""
    return (g.in_rows * g.in_cols * g.in_depth + g.out_rows * g.out_cols * g.out_depth) * acc.itemsize


def _for_batch_chunks(batch: int, bytes_per_item: int, work) -> None:
    """Run ``work(batch_slice)`` over disjoint batch chunks, spread over a thread pool; their
    writes are to disjoint batch slices."""
    chunk = min(max(1, _CHUNK_BYTES // max(1, bytes_per_item)), -(-batch // _WORKERS))
    for _ in _in_order(work, [slice(b, min(b + chunk, batch)) for b in range(0, batch, chunk)]):
        pass


def _sum_over_batch_chunks(batch: int, bytes_per_item: int, result_bytes: int, partial) -> np.ndarray:
    """The sum of ``partial(batch_slice)`` over batch chunks, computed on the thread pool.

    The chunks depend only on the sizes (not on the number of workers) and their results are
    added in batch order, so the sum is the same on every machine.  Chunks are made larger
    where their partial results together would outweigh the operands.
    """
    chunk = max(1, _CHUNK_BYTES // max(1, bytes_per_item), -(-result_bytes // max(1, bytes_per_item)))
    results = _in_order(partial, [slice(b, min(b + chunk, batch)) for b in range(0, batch, chunk)])
    total = next(results)
    for result in results:
        total += result
    return total


def _sum_over_taps(g: Conv2DGeometry, src: np.ndarray, weights: np.ndarray, dst_shape, acc: np.dtype,
                   transposed: bool) -> np.ndarray:
    """Accumulate every filter tap's contribution of ``src`` into a new NHWC array.

    Forward (``transposed=False``): src is the input, dst the output, weights [R, S, G, Cg, O/G].
    Transposed: src is out_backprop, dst the input gradient, weights [R, S, G, O/G, Cg]; each tap
    adds to the input positions it read.
    """
    dst = np.zeros(dst_shape, acc)
    groups = weights.shape[2]

    def work(b):
        src_b, dst_b = src[b].astype(acc, copy=False), dst[b]
        for r, s, out_idx, in_idx in _taps(g):
            read, write = (out_idx, in_idx) if transposed else (in_idx, out_idx)
            _accumulate_tap(dst_b[:, write[0], write[1], :], src_b[:, read[0], read[1], :], weights[r, s])

    if groups == 1:  # per-tap GEMMs over the whole batch: BLAS threads and blocks them itself
        work(slice(0, g.batch))
    else:
        _for_batch_chunks(g.batch, _image_bytes(g, acc), work)
    return dst


# --------------------------------------------------------------------------- unit-stride convolutions

# With unit strides, a tap's reads are the result positions shifted by a constant; on a
# zero-padded operand laid out as one flat [positions, channels] matrix that shift is a row
# offset, so each tap is one GEMM on contiguous rows (no per-tap patch copies).  Every tap
# then runs over every position, padding included, so the path is taken only while that is
# at most this factor more products than the tap paths compute (explicit paddings can be
# huge, and taps of a thin image mostly read padding).
_MAX_FLAT_GROWTH = 1.5


def _tap_products(g: Conv2DGeometry) -> int:
    """(output, input) position pairs over all filter taps that read the input: the products
    per channel pair that the tap paths make, padding left out."""
    return (sum(t[1].stop - t[1].start for t in _row_taps(g)) *
            sum(t[1].stop - t[1].start for t in _col_taps(g)))


class _FlatLayout(NamedTuple):
    """Padded per-image blocks of ``rows`` x ``cols`` positions; see ``_flat_layout``."""

    rows: int
    cols: int
    row_offsets: list  # tap r reads row_offsets[r] * cols + col_offsets[s] flat rows further
    col_offsets: list
    front: int  # zero rows before the first block
    back: int  # zero rows after the last block


def _flat_layout(g: Conv2DGeometry, transposed: bool) -> _FlatLayout | None:
    """Flat layout of a unit-stride convolution, or None where it would cost too much.

    Forward (``transposed=False``) each output position o reads the input at
    o + tap * dilation - pad; transposed, each input position i reads out_backprop at
    i - tap * dilation + pad.  Each image's operand sits at the top-left of its [rows, cols]
    block, the rest of the block zero, and result positions use the same block coordinates.
    A read past the operand's last row or column lands in the block's zero rows/columns; one
    before its first row or column wraps, in flat order, into the previous block's (or the
    front margin's) zero rows or the previous row's zero columns.  Hence rows >= result rows +
    the largest offset and >= operand rows - the smallest, likewise for columns.
    """
    sign = -1 if transposed else 1
    row_offsets = [sign * (r * g.dilation_rows - g.pad_top) for r in range(g.filter_rows)]
    col_offsets = [sign * (s * g.dilation_cols - g.pad_left) for s in range(g.filter_cols)]
    inputs, outputs = (g.in_rows, g.in_cols), (g.out_rows, g.out_cols)
    (result_rows, result_cols), (read_rows, read_cols) = (inputs, outputs) if transposed else (outputs, inputs)
    rows = max(result_rows + max(0, max(row_offsets)), read_rows - min(0, min(row_offsets)))
    cols = max(result_cols + max(0, max(col_offsets)), read_cols - min(0, min(col_offsets)))
    if rows * cols * g.filter_rows * g.filter_cols > _MAX_FLAT_GROWTH * _tap_products(g):
        return None
    front = max(0, -(min(row_offsets) * cols + min(col_offsets)))
    back = max(0, max(row_offsets) * cols + max(col_offsets))
    return _FlatLayout(rows, cols, row_offsets, col_offsets, front, back)


def _flat_operand(x: np.ndarray, layout: _FlatLayout, acc: np.dtype) -> np.ndarray:
    """NHWC ``x`` in ``layout``'s zero-padded blocks, as [front + N*rows*cols + back, C]."""
    n, h, w, c = x.shape
    size = n * layout.rows * layout.cols
    flat = np.zeros((layout.front + size + layout.back, c), acc)
    flat[layout.front:layout.front + size].reshape(n, layout.rows, layout.cols, c)[:, :h, :w] = x
    return flat


def _column_taps(src: np.ndarray, layout: _FlatLayout, lo: int, hi: int, columns: slice = slice(None)):
    """The column taps' reads for result rows [lo, hi), side by side: ``(taps, first)`` with
    taps[j, s*C:(s+1)*C] = src[front + lo + first + j + col_offsets[s]] (contiguous) for the
    filter columns s in ``columns`` (numbered from its start); filter row r's reads are then
    taps[k : k + hi - lo] with k = row_offsets[r] * cols - first.

    One copy serves all filter rows (each is a contiguous row range of it), so each filter
    row is one GEMM with K = S * C.
    """
    first = min(layout.row_offsets) * layout.cols + lo
    count = max(layout.row_offsets) * layout.cols + hi - first
    offsets = layout.col_offsets[columns]
    step = offsets[1] - offsets[0] if len(offsets) > 1 else 0  # +-dilation: offsets are evenly spaced
    row = src.strides[0]
    view = np.lib.stride_tricks.as_strided(src[layout.front + first + offsets[0]:], (count, len(offsets), src.shape[1]),
                                           (row, step * row, src.strides[1]), writeable=False)
    return np.ascontiguousarray(view).reshape(count, -1), first - lo


def _unit_stride_input_grad(g: Conv2DGeometry, w_t: np.ndarray, dy: np.ndarray, acc: np.dtype):
    """conv2d_backprop_input for groups == 1 and unit strides, or None where padding would
    cost too much.  ``w_t`` is [R, S, O, C], ``dy`` NHWC; returns the NHWC gradient (a view).

    The column taps are S * O wide against the result's C, so they are built per chunk of
    result rows, at most about twice the result's size in all.
    """
    layout = _flat_layout(g, transposed=True)
    if layout is None:
        return None
    size = g.batch * layout.rows * layout.cols
    src = _flat_operand(dy, layout, acc)
    dst = np.empty((size, g.in_depth), acc)
    span = (max(layout.row_offsets) - min(layout.row_offsets)) * layout.cols  # rows every chunk copies again
    chunk = max(span, 1, 2 * size * g.in_depth // (g.filter_cols * g.out_depth))
    for lo in range(0, size, chunk):
        hi = min(size, lo + chunk)
        taps, first = _column_taps(src, layout, lo, hi)
        for r, offset in enumerate(layout.row_offsets):
            start = offset * layout.cols - first
            w_row = w_t[r].reshape(-1, g.in_depth)  # [S * O, C], matching the taps' (s, o) order
            if r == 0:
                _dot(taps[start:start + hi - lo], w_row, out=dst[lo:hi])
            else:
                dst[lo:hi] += _dot(taps[start:start + hi - lo], w_row)
    return dst.reshape(g.batch, layout.rows, layout.cols, g.in_depth)[:, :g.in_rows, :g.in_cols]


def _unit_stride_filter_grad(g: Conv2DGeometry, x: np.ndarray, dy: np.ndarray, acc: np.dtype):
    """conv2d_backprop_filter for groups == 1 and unit strides, or None where padding would
    cost too much.  ``x``/``dy`` NHWC; returns [R, S, C, O].

    out_backprop is zero at the padded positions, so whatever they read adds nothing.
    """
    layout = _flat_layout(g, transposed=False)
    if layout is None:
        return None
    size = g.batch * layout.rows * layout.cols
    src = _flat_operand(x, layout, acc)
    dy_flat = np.zeros((size, g.out_depth), acc)
    dy_flat.reshape(g.batch, layout.rows, layout.cols, g.out_depth)[:, :g.out_rows, :g.out_cols] = dy
    grad = np.empty((g.filter_rows, g.filter_cols * g.in_depth, g.out_depth), acc)
    c = g.in_depth
    for s0, s1 in _filter_column_chunks(g, len(src) * c, x.size + dy.size):
        taps, first = _column_taps(src, layout, 0, size, slice(s0, s1))
        for r, offset in enumerate(layout.row_offsets):
            start = offset * layout.cols - first
            _dot(taps[start:start + size].T, dy_flat, out=grad[r, s0 * c:s1 * c])
    return grad.reshape(g.filter_rows, g.filter_cols, g.in_depth, g.out_depth)


#: The filter gradient's gathered input columns (positions x filter columns x in_depth) may
#: hold this many times the input's and out_backprop's elements (a 3x3 filter's three columns
#: fit), or COLUMN_CHUNK_MIN_ELEMENTS, or the result's size; wider filters are gathered and
#: contracted a few filter columns at a time.
COLUMN_CHUNK_FACTOR = 4
COLUMN_CHUNK_MIN_ELEMENTS = 1 << 22


def _filter_column_chunks(g: Conv2DGeometry, per_column: int, operands: int):
    """[(s0, s1)] ranges of filter columns whose gathered input columns (``per_column``
    elements each) fit the budget above: a 1024-column filter over a 1024-column row held
    positions x 1024 x in_depth, 256 MiB for a 16 MiB result, before it was split."""
    budget = max(COLUMN_CHUNK_MIN_ELEMENTS, COLUMN_CHUNK_FACTOR * operands, math.prod(g.filter_shape))
    step = max(1, budget // max(1, per_column))
    return [(s0, min(s0 + step, g.filter_cols)) for s0 in range(0, g.filter_cols, step)]


class _PhaseTaps(NamedTuple):
    """One dimension of a depthwise input gradient, for the inputs i = phase + stride * u.

    Those inputs receive from the taps t = first + step * j (j < taps) whose reads land on
    out_backprop positions, input u from position u + offset - step_offset * j.
    """

    phase: int
    inputs: int  # count of u
    first: int
    step: int
    taps: int
    offset: int
    step_offset: int


def _phase_taps(in_size, filter_size, stride, dilation, pad_before) -> list[_PhaseTaps]:
    """The stride phases of one dimension that hold inputs and taps.

    Tap t reads out_backprop position o = (i + pad - t * dilation) / stride for input i where
    that divides exactly, so the taps of a phase recur every stride / gcd(stride, dilation)
    filter positions, their positions falling by dilation / gcd(stride, dilation) each time.
    """
    period = stride // math.gcd(stride, dilation)
    phases = []
    for phase in range(min(stride, in_size)):
        inputs = -(-(in_size - phase) // stride)
        first = next((t for t in range(min(period, filter_size))
                      if (phase + pad_before - t * dilation) % stride == 0), None)
        if first is None:
            continue
        taps = -(-(filter_size - first) // period)
        # one tap has no next: a step of 0 keeps a huge dilation out of the views' strides
        step_offset = period * dilation // stride if taps > 1 else 0
        phases.append(_PhaseTaps(phase, inputs, first, period, taps, (phase + pad_before - first * dilation) // stride,
                                 step_offset))
    return phases


#: The depthwise input gradient tiles each phase's filter taps along a run of inputs ([row
#: taps, column taps, run * out_depth]); each filter tap is in one phase, so runs of
#: DEPTHWISE_TILE_ELEMENTS // filter elements inputs keep the phases' tiles together within
#: this many elements (runs of one input at least: the tiles are then the filter's size).
DEPTHWISE_TILE_ELEMENTS = 1 << 18


def _depthwise_input_grad(g: Conv2DGeometry, w: np.ndarray, dy: np.ndarray, acc: np.dtype, dtype: np.dtype):
    """conv2d_backprop_input when every group has one input channel (depthwise), for any
    strides and dilations, or None where padding would cost too much.  ``w`` is [R, S, O] with
    output channel c * multiplier + m belonging to input channel c; ``dy`` NHWC; returns the
    NHWC gradient in ``dtype``.

    Per image and stride phase (rows, columns), one einsum multiplies and adds all the phase's
    taps: out_backprop sits in a zero-padded [rows, columns * O] buffer, so that a row of a
    phase's inputs reads, for each tap, a contiguous run of columns * O values, which the
    filter tap's values tiled along the row multiply (a 56 x 56 x 96 image: 5376 values a
    product instead of 96).  Each input is computed once, by the taps that reach it, without
    accumulating into the result; the multiplier's channels are summed last.
    """
    rows = _phase_taps(g.in_rows, g.filter_rows, g.stride_rows, g.dilation_rows, g.pad_top)
    cols = _phase_taps(g.in_cols, g.filter_cols, g.stride_cols, g.dilation_cols, g.pad_left)
    shape = (g.batch, g.in_rows, g.in_cols, g.in_depth)
    if not rows or not cols:
        return np.zeros(shape, dtype)

    def extent(phases):  # [lo, hi]: the out_backprop positions the phases read, padding included
        return (min(p.offset - p.step_offset * (p.taps - 1) for p in phases),
                max(p.inputs - 1 + p.offset for p in phases))

    (row_lo, row_hi), (col_lo, col_hi) = extent(rows), extent(cols)
    # Products with padding count against the tap paths' (which make none), as for _flat_layout,
    # and so does the padded buffer's size: phases whose reads lie far apart (a huge dilation,
    # each phase's one tap reading its own stretch of padding) would span them all.
    computed = sum(p.inputs * p.taps for p in rows) * sum(p.inputs * p.taps for p in cols)
    positions = (row_hi - row_lo + 1) * (col_hi - col_lo + 1)
    if (computed > _MAX_FLAT_GROWTH * _tap_products(g)
            or positions > _MAX_FLAT_GROWTH * (g.in_rows * g.in_cols + g.out_rows * g.out_cols)):
        return None
    out_depth, depth = g.out_depth, g.in_depth
    multiplier = out_depth // depth
    item = np.dtype(acc).itemsize
    # the buffer's rows and columns of out_backprop that exist
    top, bottom = max(0, row_lo), min(g.out_rows, row_hi + 1)
    left, right = max(0, col_lo), min(g.out_cols, col_hi + 1)
    buffer_shape = (row_hi - row_lo + 1, (col_hi - col_lo + 1) * out_depth)
    # column runs of a phase: tiles of the filter's values are built for one run and reused
    plans = []
    run_inputs = max(1, DEPTHWISE_TILE_ELEMENTS // (g.filter_rows * g.filter_cols * out_depth))
    for pr in rows:
        for pc in cols:
            run = min(pc.inputs, run_inputs)
            # taps in the order their reads go up in memory (last tap first): einsum on views
            # with negative strides held the GIL (no gain from a second thread, measured here)
            taps = w[pr.first::pr.step][:pr.taps][::-1, pc.first::pc.step][:, :pc.taps][:, ::-1]  # [taps r, taps c, O]
            tile = np.ascontiguousarray(np.broadcast_to(taps[:, :, None, :], taps.shape[:2] + (run, out_depth)))
            plans.append((pr, pc, run, tile.reshape(pr.taps, pc.taps, run * out_depth)))
    # inputs of a phase without taps receive nothing
    every_phase = len(rows) == min(g.stride_rows, g.in_rows) and len(cols) == min(g.stride_cols, g.in_cols)
    result = (np.empty if every_phase else np.zeros)(shape, dtype)

    # Results go straight into the gradient where its rows of a phase are runs of inputs *
    # channels (unit column stride, no multiplier, no cast); else through buffers allocated
    # once per chunk of images, not per product.
    direct = g.stride_cols == 1 and multiplier == 1 and dtype == acc
    most_rows = max(p.inputs for p in rows)
    most_run = max(run for _, _, run, _ in plans)

    def work(images: slice) -> None:
        # The chunk's images in each einsum: its set-up holds the GIL, so fewer, larger calls
        # leave more of the time to a second thread.
        k = images.stop - images.start
        buffer = np.zeros((k,) + buffer_shape, acc)
        buffer.reshape(k, buffer_shape[0], -1, out_depth)[:, top - row_lo:bottom - row_lo, left - col_lo:right - col_lo] = \
            dy[images, top:bottom, left:right]
        products = None if direct else np.empty((k, most_rows, most_run * out_depth), acc)
        summed = np.empty((k, most_rows, most_run, depth), acc) if multiplier > 1 and dtype != acc else None
        for pr, pc, run, tile in plans:
            dst = result[images, pr.phase::g.stride_rows, pc.phase::g.stride_cols]  # [k, inputs r, inputs c, C]
            for u0 in range(0, pc.inputs, run):
                width = min(run, pc.inputs - u0)
                start = buffer[:, pr.offset - pr.step_offset * (pr.taps - 1) - row_lo,
                               (u0 + pc.offset - pc.step_offset * (pc.taps - 1) - col_lo) * out_depth:]
                taps = np.lib.stride_tricks.as_strided(
                    start, (k, pr.inputs, pr.taps, pc.taps, width * out_depth),
                    (buffer.strides[0], buffer.strides[1], pr.step_offset * buffer.strides[1],
                     pc.step_offset * out_depth * item, item), writeable=False)
                target = dst[:, :, u0:u0 + width]
                if direct:
                    out = _reshaped_view(target, (k, pr.inputs, width * out_depth))
                else:
                    out = products[:, :pr.inputs, :width * out_depth]
                np.einsum("nhrsj,rsj->nhj", taps, tile[:, :, :width * out_depth], out=out)
                if direct:
                    continue
                sums = out.reshape(k, pr.inputs, width, depth, multiplier)
                if multiplier == 1:
                    target[...] = sums[..., 0]
                    continue
                total = target if summed is None else summed[:, :pr.inputs, :width]
                np.add(sums[..., 0], sums[..., 1], out=total)
                for m in range(2, multiplier):
                    total += sums[..., m]
                if summed is not None:
                    target[...] = total

    image = (buffer_shape[0] * buffer_shape[1] + g.in_rows * g.in_cols * depth) * item
    _for_batch_chunks(g.batch, image, work)
    return result


def conv2d(g: Conv2DGeometry, input: np.ndarray, filter: np.ndarray) -> np.ndarray:
    """Forward convolution: input (data_format) x filter (HWIO or depthwise) -> output (data_format)."""
    if _is_empty(input.shape, filter.shape, g.out_backprop_shape):
        return np.zeros(g.out_backprop_shape, input.dtype)
    acc = accumulator_dtype(input.dtype)
    w = np.ascontiguousarray(_filter_by_group(_hwio(g, filter).astype(acc, copy=False), g.groups))
    out = _sum_over_taps(g, _to_nhwc(input, g.data_format), w,
                         (g.batch, g.out_rows, g.out_cols, g.out_depth), acc, transposed=False)
    return _from_nhwc(out, g.data_format).astype(input.dtype, copy=False)


def conv2d_backprop_input(g: Conv2DGeometry, filter: np.ndarray, out_backprop: np.ndarray) -> np.ndarray:
    """Gradient w.r.t. the input: filter (HWIO or depthwise) x out_backprop -> input shape.

    The transposed convolution: each filter tap adds out_backprop x filter[tap]^T to the input
    positions that tap read.
    """
    if _is_empty(g.input_shape, filter.shape, out_backprop.shape):
        return np.zeros(g.input_shape, out_backprop.dtype)
    acc = accumulator_dtype(out_backprop.dtype)
    w_t = np.ascontiguousarray(
        _filter_by_group(_hwio(g, filter).astype(acc, copy=False), g.groups).transpose(0, 1, 2, 4, 3))
    dy = _to_nhwc(out_backprop, g.data_format)
    grad = None
    # The flat path multiplies padded zeros by the filter, and 0 * inf is NaN.
    if np.isfinite(w_t).all():
        if g.groups == 1 and g.stride_rows == g.stride_cols == 1:
            grad = _unit_stride_input_grad(g, w_t[:, :, 0], dy, acc)
        elif g.filter_in_depth == 1:
            grad = _depthwise_input_grad(g, w_t.reshape(g.filter_rows, g.filter_cols, g.out_depth), dy, acc,
                                         out_backprop.dtype)
    if grad is None:
        grad = _sum_over_taps(g, dy, w_t, (g.batch, g.in_rows, g.in_cols, g.in_depth), acc, transposed=True)
    return _from_nhwc(grad, g.data_format).astype(out_backprop.dtype, copy=False)


def conv2d_backprop_filter(g: Conv2DGeometry, input: np.ndarray, out_backprop: np.ndarray) -> np.ndarray:
    """Gradient w.r.t. the filter: input x out_backprop (data_format) -> filter shape (HWIO/depthwise).

    Each filter tap is one contraction of the input positions it read with out_backprop,
    over batch and output positions.
    """
    if _is_empty(g.filter_shape, input.shape, out_backprop.shape):
        return np.zeros(g.filter_shape, out_backprop.dtype)
    acc = accumulator_dtype(out_backprop.dtype)
    G, cg, og = g.groups, g.filter_in_depth, g.out_depth // g.groups
    x = _to_nhwc(input, g.data_format).astype(acc, copy=False)
    dy = _to_nhwc(out_backprop, g.data_format).astype(acc, copy=False)
    # The flat path multiplies padded zeros by both operands, and 0 * inf is NaN.
    if G == 1 and g.stride_rows == g.stride_cols == 1 and np.isfinite(x).all() and np.isfinite(dy).all():
        grad = _unit_stride_filter_grad(g, x, dy, acc)
        if grad is not None:
            return grad.reshape(g.filter_shape).astype(out_backprop.dtype, copy=False)
    grad = np.zeros((g.filter_rows, g.filter_cols, G, cg, og), acc)
    # The column gather writes zeros where a tap reads padding, and 0 * inf is NaN: with
    # non-finite out_backprop use the per-tap path, which never touches padded taps.
    if G == 1 and np.isfinite(dy).all():
        # Per filter row: gather the input columns every column tap reads (zero where a tap
        # reads padding) and contract them with out_backprop's rows in one GEMM.
        col_taps = _col_taps(g)
        for r, rows_out, rows_in in _row_taps(g):
            dy_r = dy[:, rows_out]
            n, h, w, _ = dy_r.shape
            for s0, s1 in _filter_column_chunks(g, n * h * w * cg, x.size + dy.size):
                columns = np.zeros((n, h, w, s1 - s0, cg), acc)
                for s, cols_out, cols_in in col_taps:
                    if s0 <= s < s1:
                        columns[:, :, cols_out, s - s0, :] = x[:, rows_in, cols_in, :]
                grad[r, s0:s1, 0] = _dot(columns.reshape(n * h * w, (s1 - s0) * cg).T,
                                           dy_r.reshape(n * h * w, og)).reshape(s1 - s0, cg, og)
    else:
        for r, s, out_idx, in_idx in _taps(g):
            patch = x[:, in_idx[0], in_idx[1], :]
            n, h, wd, _ = patch.shape
            a = patch.reshape(n * h * wd, G, cg)
            b = dy[:, out_idx[0], out_idx[1], :].reshape(n * h * wd, G, og)
            grad[r, s] = np.einsum("pgc,pgo->gco", a, b, optimize=True)
    # [R, S, G, Cg, O/G] -> HWIO [R, S, Cg, G * O/G]
    hwio = grad.transpose(0, 1, 3, 2, 4).reshape(g.filter_rows, g.filter_cols, cg, G * og)
    return hwio.reshape(g.filter_shape).astype(out_backprop.dtype, copy=False)


def depthwise_conv2d_native_backprop_input(g: Conv2DGeometry, filter: np.ndarray,
                                           out_backprop: np.ndarray) -> np.ndarray:
    """Depthwise input gradient: a grouped convolution with groups == in_depth."""
    return conv2d_backprop_input(g, filter, out_backprop)


def depthwise_conv2d_native_backprop_filter(g: Conv2DGeometry, input: np.ndarray,
                                            out_backprop: np.ndarray) -> np.ndarray:
    """Depthwise filter gradient [R, S, C, M]: for each tap, the products of the input channel c
    it read with out_backprop's channels c * M + m, summed over batch and output positions."""
    if _is_empty(g.filter_shape, input.shape, out_backprop.shape):
        return np.zeros(g.filter_shape, out_backprop.dtype)
    acc = accumulator_dtype(out_backprop.dtype)
    c, m = g.in_depth, g.depth_multiplier
    x_all, dy_all = _to_nhwc(input, g.data_format), _to_nhwc(out_backprop, g.data_format)

    # Taps that read only padding stay zero; the others never touch padding, so an inf in the
    # input is not multiplied by a padded zero (NaN), as in TF's loops.
    # einsum's own loops on the strided views: flattening them (or optimize=True, which
    # reshapes for BLAS) would copy both operands for every tap (measured 10-30x slower).
    def partial(b: slice) -> np.ndarray:
        x, dy = x_all[b].astype(acc, copy=False), dy_all[b].astype(acc, copy=False)
        grad = np.zeros((g.filter_rows, g.filter_cols, c, m), acc)
        if m == 1:
            for r, s, out_idx, in_idx in _taps(g):
                dy_tap = _split_last(dy[:, out_idx[0], out_idx[1], :], c)  # [n, h, w, C, 1], a view
                np.einsum("nhwc,nhwcm->cm", x[:, in_idx[0], in_idx[1], :], dy_tap, out=grad[r, s])
            return grad
        # With a multiplier, "nhwc,nhwcm->cm" runs einsum's generic loop (20 ms a tap on
        # 8x56x56x96, m=2, against about 1 ms for "nhwc,nhwc->c" on contiguous channels):
        # out_backprop is split once per chunk into one [N, H, W, C] plane per multiplier index.
        # (einsum writing straight into the strided grad[r, s, :, j] is 2.4x slower than a copy.)
        planes = np.ascontiguousarray(np.moveaxis(_split_last(dy, c), 4, 0))  # [M, N, H, W, C]
        for r, s, out_idx, in_idx in _taps(g):
            x_tap = x[:, in_idx[0], in_idx[1], :]
            for j in range(m):
                grad[r, s, :, j] = np.einsum("nhwc,nhwc->c", x_tap, planes[j][:, out_idx[0], out_idx[1], :])
        return grad

    grad = _sum_over_batch_chunks(g.batch, _image_bytes(g, acc), math.prod(g.filter_shape) * acc.itemsize, partial)
    return grad.astype(out_backprop.dtype, copy=False)


def depthwise_conv2d_native(g: Conv2DGeometry, input: np.ndarray, filter: np.ndarray) -> np.ndarray:
    return conv2d(g, input, filter)


# --------------------------------------------------------------------------- fractional pooling


def _cell_slots(g: FractionalPoolGeometry, dim: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One dimension's cells per input index as slots: ``(offsets, cells, counts)`` from
    :meth:`FractionalPoolGeometry.cells_by_index` plus how many cells contain each index; the
    k-th cell (in cell order) of index i is ``cells[offsets[i] + k]`` for k < counts[i]."""
    offsets, cells = g.cells_by_index(dim)
    return offsets, cells, np.diff(offsets)


def _slot_table(offsets, cells, counts, depth: int, pad: int) -> np.ndarray:
    """[depth, in_size]: the k-th cell containing each index, or ``pad`` (a zero cell)."""
    index = np.full((depth, len(counts)), pad, np.int64)
    for k in range(depth):
        has = counts > k
        index[k, has] = cells[offsets[:-1][has] + k]
    return index


def _slot_steps(offsets, cells, counts) -> list:
    """[(input indices, their k-th cells)] for k = 0, 1, ...: only the indices in more than k
    cells, so the steps hold each (index, cell) pair once; a run of indices becomes a slice."""
    steps = []
    for k in range(int(counts.max(initial=0))):
        where = np.flatnonzero(counts > k)
        chosen = cells[offsets[where] + k]
        if where[-1] - where[0] + 1 == len(where):
            where = slice(int(where[0]), int(where[-1]) + 1)
        steps.append((where, chosen))
    return steps


def fractional_avg_pool_grad(g: FractionalPoolGeometry, out_backprop: np.ndarray) -> np.ndarray:
    """Spread each out_backprop cell evenly over its input cell (NHWC), summing in float64.

    TF divides every element by its cell's size in double and adds the shares to a zeroed
    double buffer in cell order (row cell, then column cell) before one cast to the output
    type.  Each input element here adds its shares from the cells containing it in that same
    order, so sums round exactly as TF's do (it matters for integers: 1 + 1/3 + 2/3 truncates
    to 2, 1 + (2/3 + 1/3) to 1).  Cells need not be ordered; empty cells add nothing.
    """
    if _is_empty(g.input_shape, out_backprop.shape):
        return np.zeros(g.input_shape, out_backprop.dtype)
    rows = _cell_slots(g, "rows")
    cols = _cell_slots(g, "cols")
    row_depth, col_depth = (int(counts.max(initial=0)) for _, _, counts in (rows, cols))
    # Divide (not multiply by a reciprocal) so each share rounds exactly as TF's does.  Empty
    # cells (size 0) are in no index's list: their shares are never read.
    row_sizes = np.maximum(np.asarray(g.row_cell_sizes, np.float64), 1.0)
    col_sizes = np.maximum(np.asarray(g.col_cell_sizes, np.float64), 1.0)
    cell_sizes = (row_sizes[:, None] * col_sizes[None, :])[None, :, :, None]
    grad = np.empty(g.input_shape, out_backprop.dtype)
    if row_depth <= 2 and col_depth <= 2:  # every index in at most two cells per dimension
        row_index = _slot_table(*rows, max(1, row_depth), g.out_rows)
        col_index = _slot_table(*cols, max(1, col_depth), g.out_cols)

        def work(shares, out):
            _pool_grad_two_cells(shares, row_index, col_index, out)
    else:  # repeated entries, or unordered sequences stacking cells
        row_steps, col_steps = _slot_steps(*rows), _slot_steps(*cols)

        def work(shares, out):
            _pool_grad_steps(shares, row_steps, col_steps, out)

    def run(b):
        # One zero row and column at the end serve the padding cell index.  Adding +0.0 turns a
        # -0.0 share into +0.0, as TF's first add to its zeroed buffer does.
        shares = np.zeros((b.stop - b.start, g.out_rows + 1, g.out_cols + 1, g.depth))
        np.divide(out_backprop[b], cell_sizes, out=shares[:, :-1, :-1, :], dtype=np.float64)
        shares += 0.0
        work(shares, grad[b])

    item = (g.in_rows * g.in_cols + g.out_rows * g.out_cols) * g.depth * 8
    _for_batch_chunks(g.batch, item, run)
    return grad


def _pool_grad_steps(shares, row_steps, col_steps, out):
    """out[n, i, j] = cast(sum of shares[n, r, c] over the cells (r, c) containing (i, j)), in
    TF's order: the k-th row cell of i before its (k+1)-th, and within each, the column cells
    of j in order.  Each (row step, column step) adds one block; no index is in a step twice."""
    total = np.zeros(out.shape)
    for row_where, row_cells in row_steps:
        # Gathering the step's rows of every column cell first is faster, but that copy has
        # in_rows x out_cols cells, which repeated column entries can make far larger than the
        # input and the result (a 2**13-row cell beside 2**12 one-column cells: 256 MiB for a
        # 32 KiB gradient); past the gradient's size, each block is gathered alone.
        rows = shares[:, row_cells] if len(row_cells) * shares.shape[2] <= out.shape[1] * out.shape[2] else None
        for col_where, col_cells in col_steps:
            if rows is None:
                block = shares[:, row_cells[:, None], col_cells[None, :]]
            else:
                block = rows[:, :, col_cells]  # fancy indexing: measured faster than np.take here
            if isinstance(row_where, slice) or isinstance(col_where, slice):
                total[:, row_where, col_where] += block
            else:
                total[:, row_where[:, None], col_where[None, :]] += block
    out[...] = _cast_from_float64(total, out.dtype)


def _pool_grad_two_cells(shares, row_index, col_index, out):
    """As _pool_grad_steps when every index is in at most two cells (per dimension).

    Overlapping cells share only their boundary index, so only boundary rows sum two row
    cells' shares; the others are one gathered (row-cell) sum each.  Second cells that do not
    exist index the zero padding cell: adding +0.0 leaves a sum unchanged, so the per-element
    order stays TF's: (r1, c1), (r1, c2), (r2, c1), (r2, c2).  Gathers along rows copy whole
    contiguous rows, so the row stage runs last, on as few rows as possible.
    """
    col_first = np.take(shares, col_index[0], axis=2)  # (r, c1) for every input column
    if len(col_index) == 2:
        col_second = np.take(shares, col_index[1], axis=2)
        row_sum = col_first + col_second  # (r, c1) + (r, c2)
    else:
        col_second, row_sum = None, col_first
    if out.dtype == np.float64:
        np.take(row_sum, row_index[0], axis=1, out=out)
    else:
        np.take(_cast_from_float64(row_sum, out.dtype), row_index[0], axis=1, out=out)
    if len(row_index) == 2:
        rows_b = np.flatnonzero(row_index[1] != shares.shape[1] - 1)
        first, second = row_index[0][rows_b], row_index[1][rows_b]
        total = _take_rows(row_sum, first) + _take_rows(col_first, second)
        if col_second is not None:
            total += _take_rows(col_second, second)
        out[:, rows_b] = _cast_from_float64(total, out.dtype)


def _take_rows(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """x[:, index], as a view when ``index`` is a run of consecutive rows (boundary rows of
    increasing sequences are)."""
    if len(index) and (np.diff(index) == 1).all():
        return x[:, index[0]:index[-1] + 1]
    return np.take(x, index, axis=1)


#: A running sum of steps of fewer elements than this (cells of many elements, few cells and
#: channels at a time) is one np.add.accumulate call, not a Python loop of an add a step: the
#: loop's ~0.3 us a step costs more than accumulate's ~2.5 ns an element below about 128
#: elements (float32, measured here: [1000, 64] 148 vs 290 us, [1000, 128] 347 vs 292 us).
RUNNING_SUM_STEP_ELEMENTS = 128


def _running_sum(terms: np.ndarray) -> np.ndarray:
    """terms[0] + terms[1] + ... in that order (np.add.reduce may add pairwise), as a sum from
    zero: -0.0 only where every term is -0.0, which a sum from +0.0 makes +0.0, as adding +0.0
    at the end does (otherwise the two sums are the same)."""
    if terms[0].size < RUNNING_SUM_STEP_ELEMENTS and len(terms) > 2:
        total = np.add.accumulate(terms, axis=0, dtype=terms.dtype)[-1]  # strictly in order; ints not widened
    else:
        total = terms[0].copy()
        for term in terms[1:]:
            total += term
    total += terms.dtype.type(0)
    return total


def element_count(elements: int, dtype: np.dtype):
    """A cell's element count as TF's FractionalAvgPool holds it: a counter of the sum's type
    (``dtype``) incremented once an element.  A float counter stops where adding 1 rounds back
    (2**24 in float32, 2**53 in float64), so a float32 cell of more than 2**24 elements is
    divided by 2**24 (TF 2.21: a 4097 x 4097 cell of 0.5 averages to 0.5, not 0.49976)."""
    if dtype.kind == "f":
        return dtype.type(min(elements, 2 ** (np.finfo(dtype).nmant + 1)))
    return dtype.type(elements)  # the op refuses integer cells past the type's maximum


def fractional_avg_pool(g: FractionalPoolGeometry, value: np.ndarray) -> np.ndarray:
    """Forward average over each (row cell x column cell), NHWC, as TF's FractionalAvgPool
    computes it: a running sum from zero of the cell's elements in TF's scan order (row by row,
    each row left to right) in the element type, divided by the cell's element count in that
    type (:func:`element_count`), so the results are TF's bit for bit: IEEE Inf and NaN, no
    -0.0 sums, integers wrapping on overflow as TF's adds do and divided truncating toward zero.  Half types (an
    extension: TF's op has none) sum and divide in float32 and are cast once.  An empty cell
    averages to 0, the adjoint of the gradient (TF's own sequences make none)."""
    if _is_empty(g.output_shape, value.shape):
        return np.zeros(g.output_shape, value.dtype)
    work = _comparable(value[:0]).dtype  # half types widened, exactly
    out = np.zeros(g.output_shape, work)  # empty cells keep 0

    def run(b):
        images = out[b]
        for row_cells, col_cells, _, _, window in _cell_windows(g, _comparable(value[b])):
            total = _running_sum(window)
            count = element_count(len(window), work)
            if work.kind == "i":  # C++'s division truncates toward zero; NumPy's // floors
                total, remainder = np.divmod(total, count)
                total += (remainder != 0) & (total < 0)
            else:
                total /= count
            images[np.ix_(np.arange(len(images)), row_cells, col_cells)] = total

    _for_batch_chunks(g.batch, (g.in_rows * g.in_cols + g.out_rows * g.out_cols) * g.depth * work.itemsize, run)
    return out.astype(value.dtype, copy=False)


def _cast_from_float64(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast once, truncating toward zero for integer types as C++ static_cast does."""
    if np.issubdtype(dtype, np.integer):
        return np.trunc(x).astype(dtype)
    return x.astype(dtype)


# --------------------------------------------------------------------------- fractional max pooling


def _comparable(x: np.ndarray) -> np.ndarray:
    """``x`` in a type NumPy compares natively, with the same order (exact for half types)."""
    if x.dtype.kind == "f" and x.dtype.itemsize >= 4 or np.issubdtype(x.dtype, np.integer):
        return x
    return x.astype(np.float32)


def _size_groups(starts, ends):
    """[(size, cell numbers, their starts)] grouping one dimension's cells by size (fractional
    pooling has two or three sizes), empty cells left out: gathering a group's cells copies
    each (cell, index) pair once, whatever the cells' sizes."""
    starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
    sizes = np.maximum(ends - starts + 1, 0)
    groups = []
    for size in np.unique(sizes[sizes > 0]):
        cells = np.flatnonzero(sizes == size)
        groups.append((int(size), cells, starts[cells]))
    return groups


#: Elements a chunk of cell windows (both pooling forwards, the max pooling gradient) may hold,
#: in units of max(input, result) elements:
#: overlapping cells at TF's ratios (1.4-2) copy about 2-3x the input, which stays one chunk.
WINDOW_CHUNK_FACTOR = 4
#: ... and at least this many (a few MiB of working copies), so that a small input pooled into
#: many cells is not walked in thousands of Python-sized chunks.
WINDOW_CHUNK_MIN_ELEMENTS = 1 << 18


def _cell_windows(g: FractionalPoolGeometry, value: np.ndarray):
    """Per chunk of (row-size group, column-size group) of ``value`` (NHWC: ``g``'s images or a
    run of them): (row cells, column cells, row table, column table, windows [rows * cols, N,
    row cells, column cells, C]), the cell elements in TF's scan order (row by row, each row
    left to right) on the first axis, so that each is a contiguous slice for the scans and
    reductions over it.

    The windows copy each cell whole, so their size is the sum over cells of the cell's size,
    which repeated sequence entries can make the product of an input dimension and a result
    dimension (a 2**13-row, one-column input pooled into one cell of all its rows beside 2**12
    one-column cells held 130 MiB for a 32 KiB input before chunking).  Chunks hold at most
    WINDOW_CHUNK_FACTOR x max(input, result) elements (WINDOW_CHUNK_MIN_ELEMENTS at least), or
    one cell (never more than the input)."""
    images = len(value)  # a chunk of the batch, or all of it
    budget = max(WINDOW_CHUNK_MIN_ELEMENTS,
                 WINDOW_CHUNK_FACTOR * images * g.depth * max(g.in_rows * g.in_cols, g.out_rows * g.out_cols))
    col_groups = _size_groups(g.col_starts, g.col_ends)
    batch = np.arange(images)[None, None, :, None, None]
    for rows, row_cells, row_starts in _size_groups(g.row_starts, g.row_ends):
        for cols, col_cells, col_starts in col_groups:
            cell_elements = images * rows * cols * g.depth
            col_chunk = max(1, min(len(col_cells), budget // cell_elements))
            row_chunk = max(1, budget // (cell_elements * col_chunk))
            for r in range(0, len(row_cells), row_chunk):
                # [cells, size] index tables, built per chunk: whole groups' tables can be as
                # large as the windows (2048 cells of 4096 rows: 64 MiB)
                row_part = row_starts[r:r + row_chunk, None] + np.arange(rows)
                for c in range(0, len(col_cells), col_chunk):
                    col_part = col_starts[c:c + col_chunk, None] + np.arange(cols)
                    # [rows, cols, N, row cells, col cells, C] in one C-contiguous gather (all
                    # three spatial indices advanced): no band of whole input rows, no transposed copy
                    window = value[batch, row_part.T[:, None, None, :, None], col_part.T[None, :, None, None, :]]
                    window = window.reshape(rows * cols, images, len(row_part), len(col_part), g.depth)
                    yield row_cells[r:r + row_chunk], col_cells[c:c + col_chunk], row_part, col_part, window


#: Cells of up to this many elements are scanned element by element (TF's ratios make 1 to 9);
#: larger ones by argmax, whose cost does not grow with a Python loop over the cell.
SCAN_MAX_CELL_ELEMENTS = 16


def _first_maxima(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(maxima, number of the chosen element) over axis 0 of ``key`` [cell elements, ...] by
    TF's scan: the first element, replaced only by a strictly greater one.  Ties keep the first
    maximum and a NaN never replaces; a NaN first element, which TF keeps, gives a NaN maximum
    (TF then refuses the call: NaN != orig_output)."""
    if len(key) > SCAN_MAX_CELL_ELEMENTS:
        ranked = key
        if key.dtype.kind == "f":
            nan = np.isnan(key)
            if nan.any():
                ranked = np.where(nan, -np.inf, key)  # never chosen ...
                ranked[0][nan[0]] = np.inf  # ... unless first: then kept
        step = np.argmax(ranked, axis=0)  # the first maximum
        return np.take_along_axis(key, step[None], axis=0)[0], step
    # Small cells: the scan over contiguous slices, with arithmetic rather than masked copies
    # (np.copyto(where=) costs 30x an fmax here): fmax keeps the current maximum where the
    # new element is NaN or not greater, and the chosen element's number k advances by
    # (k - step) where it is strictly greater.
    maximum = np.fmax if key.dtype.kind == "f" else np.maximum
    best = key[0].copy()
    step = np.zeros(best.shape, np.min_scalar_type(len(key)))
    for k in range(1, len(key)):
        greater = key[k] > best
        maximum(best, key[k], out=best)
        step += greater.astype(step.dtype) * (step.dtype.type(k) - step)
    if key.dtype.kind == "f":
        best[np.isnan(key[0])] = np.nan
    return best, step


def fractional_max_pool_grad(g: FractionalPoolGeometry, orig_input: np.ndarray, orig_output: np.ndarray,
                             out_backprop: np.ndarray) -> np.ndarray:
    """Route each out_backprop element to the element TF's scan chooses in its cell (NHWC).

    TF's rule per cell and channel: take the first element, replace it by any later one that
    is strictly greater (``current < x``); :func:`_first_maxima` applies it to every cell of a
    chunk at once.  A NaN first element, which TF keeps, makes TF refuse the call (NaN !=
    orig_output), and so does the check below.  Every cell is non-empty (the op hands the
    backends no empty one).  The recomputed maxima must equal orig_output (TF's check).  Sums
    run in the accumulator type in output order, as TF's loop adds them (float32 for the half
    types, cast once).  Images are independent: runs of them go to the thread pool, and the
    first image (in batch order) that fails the check is the one reported.
    """
    acc = out_backprop.dtype if out_backprop.dtype.itemsize > 2 else np.dtype(np.float32)
    # The gradient is allocated once a run of images has passed TF's check, so a call refused
    # there (say a broadcast orig_input of millions of elements) does not hold one.
    grads, lock = [], threading.Lock()

    def gradient() -> np.ndarray:
        with lock:
            if not grads:
                grads.append(np.zeros(g.input_shape, acc))
            return grads[0]

    channel = np.arange(g.depth, dtype=np.int64)

    def run(b: slice) -> None:
        images = b.stop - b.start
        chosen = np.empty((images,) + g.output_shape[1:], np.int64)  # flat offsets in the run's images
        maxima = np.empty(chosen.shape, _comparable(orig_input[:0]).dtype)
        batch = np.arange(images, dtype=np.int64)[:, None, None, None]
        for row_cells, col_cells, row_index, col_index, window in _cell_windows(g, orig_input[b]):
            rows, cols = row_index.shape[1], col_index.shape[1]
            best, step = _first_maxima(_comparable(window))  # window: [rows * cols, n, row cells, col cells, C]
            # k -> the element's offset from its cell's first element, in flat NHWC elements
            k = np.arange(rows * cols, dtype=np.int64)
            offset = np.take((k // cols * g.in_cols + k % cols) * g.depth, step)
            first = ((batch * g.in_rows + row_index[:, 0][None, :, None, None]) * g.in_cols
                     + col_index[:, 0][None, None, :, None]) * g.depth + channel
            offset += first
            # Index the cells, not the channels: each (image, cell) copies its C contiguous values.
            cell = np.ix_(np.arange(images), row_cells, col_cells)
            chosen[cell] = offset
            maxima[cell] = best
        equal = maxima == _comparable(orig_output[b])
        if not equal.all():
            where = tuple(int(i) for i in np.argwhere(~equal)[0])
            at = (where[0] + b.start,) + where[1:]
            raise InvalidArgumentError(
                f"fractional_max_pool_grad: orig_output is not the max pooling of orig_input over the pooling "
                f"sequences (TF: tensor_out_dup is not the same as tensor_out): at {list(at)} orig_output holds "
                f"{orig_output[at]!r}, the cell's maximum by TF's rule is {orig_input.dtype.type(maxima[where])!r}")
        # np.add.at adds in index order, unbuffered: flat output order, as TF's loop.
        np.add.at(gradient()[b].reshape(-1), chosen.reshape(-1), out_backprop[b].reshape(-1).astype(acc, copy=False))

    item = (g.in_rows * g.in_cols * (orig_input.itemsize + acc.itemsize)
            + g.out_rows * g.out_cols * (orig_output.itemsize + out_backprop.itemsize + 8)) * g.depth
    _for_batch_chunks(g.batch, item, run)
    return gradient().astype(out_backprop.dtype, copy=False)


def fractional_max_pool(g: FractionalPoolGeometry, value: np.ndarray) -> np.ndarray:
    """Forward max over each (row cell x column cell), NHWC, as TF's forward kernel computes
    it: a running ``max(current, x)`` (``current < x ? x : current``) from the type's lowest
    value, so NaN is never taken, an empty or all-NaN cell (or one of -inf only) gives the
    lowest finite value, and of equal zeros the first in TF's scan order (row by row, each row
    left to right) gives the result's sign."""
    lowest = dtype_lowest(value.dtype)
    work = _comparable(value)
    out = np.full(g.output_shape, lowest, work.dtype)  # empty cells keep it
    floating = work.dtype.kind == "f"
    reduce = np.fmax.reduce if floating else np.maximum.reduce  # fmax ignores NaN
    for row_cells, col_cells, _, _, window in _cell_windows(g, work):
        maxima = reduce(window, axis=0, initial=lowest)
        if floating:
            # fmax keeps either of two equal zeros (its SIMD and scalar loops differ); TF keeps
            # the first: where the maximum is zero, the sign of the cell's first zero
            zero = maxima == 0
            if zero.any():
                candidates = window[:, zero]
                first = np.argmax(candidates == 0, axis=0)
                maxima[zero] = np.where(np.signbit(candidates[first, np.arange(len(first))]), -0.0, 0.0)
        out[np.ix_(np.arange(g.batch), row_cells, col_cells)] = maxima
    return out.astype(value.dtype, copy=False)
