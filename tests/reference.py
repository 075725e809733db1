"""Brute-force references: plain loops over every index, written from the ops' definitions.

Independent of gradops' geometry code and vectorised math; only for tiny shapes.  All
arrays are NHWC / HWIO and computed in float64.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def window(in_size, filter_size, stride, dilation, padding, explicit=(0, 0)):
    """(out_size, pad_before) of one spatial dimension, from the textbook definitions."""
    eff = (filter_size - 1) * dilation + 1
    if padding == "VALID":
        before, after = 0, 0
    elif padding == "EXPLICIT":
        before, after = explicit
    else:
        out = math.ceil(in_size / stride)
        total = max(0, (out - 1) * stride + eff - in_size)
        return out, total // 2
    span = in_size + before + after
    return ((span - eff) // stride + 1 if span >= eff else 0), before


def conv2d(x, w, strides, padding, dilations=(1, 1), explicit=((0, 0), (0, 0))):
    """Forward grouped convolution by loops. x [N,H,W,C], w [R,S,C/G,O]."""
    n_, h_, w_, c_ = x.shape
    r_, s_, cg, o_ = w.shape
    groups = c_ // cg
    og = o_ // groups
    oh_, ph = window(h_, r_, strides[0], dilations[0], padding, explicit[0])
    ow_, pw = window(w_, s_, strides[1], dilations[1], padding, explicit[1])
    out = np.zeros((n_, oh_, ow_, o_))
    for n, oh, ow, o, r, s, ci in itertools.product(range(n_), range(oh_), range(ow_), range(o_),
                                                    range(r_), range(s_), range(cg)):
        ih = oh * strides[0] + r * dilations[0] - ph
        iw = ow * strides[1] + s * dilations[1] - pw
        if 0 <= ih < h_ and 0 <= iw < w_:
            c = (o // og) * cg + ci
            out[n, oh, ow, o] += float(x[n, ih, iw, c]) * float(w[r, s, ci, o])
    return out


def conv2d_backprop_input(input_shape, w, dy, strides, padding, dilations=(1, 1), explicit=((0, 0), (0, 0))):
    """d(sum(conv2d(x) * dy))/dx by scattering every product back to its input element."""
    n_, h_, w_, c_ = input_shape
    r_, s_, cg, o_ = w.shape
    groups = c_ // cg
    og = o_ // groups
    _, oh_, ow_, _ = dy.shape
    _, ph = window(h_, r_, strides[0], dilations[0], padding, explicit[0])
    _, pw = window(w_, s_, strides[1], dilations[1], padding, explicit[1])
    dx = np.zeros(input_shape)
    for n, oh, ow, o, r, s, ci in itertools.product(range(n_), range(oh_), range(ow_), range(o_),
                                                    range(r_), range(s_), range(cg)):
        ih = oh * strides[0] + r * dilations[0] - ph
        iw = ow * strides[1] + s * dilations[1] - pw
        if 0 <= ih < h_ and 0 <= iw < w_:
            dx[n, ih, iw, (o // og) * cg + ci] += float(dy[n, oh, ow, o]) * float(w[r, s, ci, o])
    return dx


def conv2d_backprop_filter(x, filter_shape, dy, strides, padding, dilations=(1, 1), explicit=((0, 0), (0, 0))):
    """d(sum(conv2d(x, w) * dy))/dw by loops."""
    n_, h_, w_, c_ = x.shape
    r_, s_, cg, o_ = filter_shape
    groups = c_ // cg
    og = o_ // groups
    _, oh_, ow_, _ = dy.shape
    _, ph = window(h_, r_, strides[0], dilations[0], padding, explicit[0])
    _, pw = window(w_, s_, strides[1], dilations[1], padding, explicit[1])
    dw = np.zeros(filter_shape)
    for n, oh, ow, o, r, s, ci in itertools.product(range(n_), range(oh_), range(ow_), range(o_),
                                                    range(r_), range(s_), range(cg)):
        ih = oh * strides[0] + r * dilations[0] - ph
        iw = ow * strides[1] + s * dilations[1] - pw
        if 0 <= ih < h_ and 0 <= iw < w_:
            dw[r, s, ci, o] += float(x[n, ih, iw, (o // og) * cg + ci]) * float(dy[n, oh, ow, o])
    return dw


def depthwise_to_hwio(w):
    """Depthwise filter [R, S, C, M] as the grouped HWIO filter [R, S, 1, C*M]."""
    r_, s_, c_, m_ = w.shape
    return w.reshape(r_, s_, 1, c_ * m_)


def fractional_avg_pool_grad(orig_shape, dy, row_seq, col_seq, overlapping):
    """TF's FractionalAvgPoolGrad loop (fractional_avg_pool_op.cc), in float64: over
    out_backprop's batch, cells and depth (which may be smaller than the input's)."""
    _, h_, w_, _ = orig_shape
    n_, oh_, ow_, c_ = dy.shape
    dx = np.zeros(orig_shape)
    for n, r, c in itertools.product(range(n_), range(oh_), range(ow_)):
        r0 = row_seq[r]
        r1 = min(row_seq[r + 1] if overlapping else row_seq[r + 1] - 1, h_ - 1)
        c0 = col_seq[c]
        c1 = min(col_seq[c + 1] if overlapping else col_seq[c + 1] - 1, w_ - 1)
        count = (r1 - r0 + 1) * (c1 - c0 + 1)
        for ih in range(r0, r1 + 1):
            for iw in range(c0, c1 + 1):
                for d in range(c_):
                    dx[n, ih, iw, d] += float(dy[n, r, c, d]) / count
    return dx


def fractional_avg_pool(x, row_seq, col_seq, overlapping):
    """TF's FractionalAvgPool loop: per cell a running sum from zero of its elements, row by
    row and each row left to right, in x's type (float32 for the half types, cast once at the
    end; integers wrap), divided by the element count as a counter of that type reaches it (a
    float32 one stops at 2**24; integers truncated toward zero); an empty cell (its clamped end before its start) averages to 0, the adjoint of the
    gradient giving it to no input element.  Result in x's dtype."""
    n_, h_, w_, c_ = x.shape
    oh_, ow_ = len(row_seq) - 1, len(col_seq) - 1
    acc = np.dtype(np.float32) if x.dtype.itemsize == 2 else x.dtype
    out = np.zeros((n_, oh_, ow_, c_), acc)
    with np.errstate(all="ignore"):
        for n, r, c in itertools.product(range(n_), range(oh_), range(ow_)):
            r1 = min(row_seq[r + 1] if overlapping else row_seq[r + 1] - 1, h_ - 1)
            c1 = min(col_seq[c + 1] if overlapping else col_seq[c + 1] - 1, w_ - 1)
            if r1 < row_seq[r] or c1 < col_seq[c]:
                continue
            for d in range(c_):
                total, count = acc.type(0), acc.type(0)
                for i in range(row_seq[r], r1 + 1):
                    for j in range(col_seq[c], c1 + 1):
                        total = acc.type(total + acc.type(x[n, i, j, d]))
                        count = acc.type(count + acc.type(1))
                if acc.kind == "i":  # C++'s truncating division, exact in Python integers
                    quotient = abs(int(total)) // int(count)
                    out[n, r, c, d] = -quotient if total < 0 else quotient
                else:
                    out[n, r, c, d] = total / count
    return out.astype(x.dtype)


def _max_pool_cells(seq, count, size, overlapping):
    """(first, last) input index of each of ``count`` cells, ends clamped to the input (a cell
    may be empty: last < first)."""
    return [(seq[k], min(seq[k + 1] if overlapping else seq[k + 1] - 1, size - 1)) for k in range(count)]


def fractional_max_pool_select(x, rows, cols, out_rows, out_cols, overlapping, out_batch=None, out_depth=None):
    """TF's FractionalMaxPoolGrad scan (fractional_max_pool_op.cc): per cell and channel, rows
    then columns, the first element, replaced by any strictly greater one.  Returns the chosen
    flat NHWC offsets and their values (the maxima), [out_batch, out_rows, out_cols,
    out_depth] (by default x's batch and depth).  As in TF's walk, only the first
    len(sequence) - 1 cells and x's images and channels are visited (the sequences' cells past
    out_rows / out_cols must be empty, out_batch and out_depth at least x's), and an empty or
    unvisited entry keeps the offset -1 and the type's lowest value."""
    import ml_dtypes

    n, h, w, c = x.shape
    out_batch, out_depth = n if out_batch is None else out_batch, c if out_depth is None else out_depth
    key = x.astype(np.float64) if x.dtype.kind in "fV" else x
    chosen = np.full((out_batch, out_rows, out_cols, out_depth), -1, np.int64)
    maxima = np.full(chosen.shape, (np.iinfo if x.dtype.kind == "i" else ml_dtypes.finfo)(x.dtype).min, x.dtype)
    row_cells = _max_pool_cells(rows, len(rows) - 1, h, overlapping)
    col_cells = _max_pool_cells(cols, len(cols) - 1, w, overlapping)
    if any(r1 >= r0 for r0, r1 in row_cells) and any(c1 >= c0 for c0, c1 in col_cells):  # else TF walks nothing
        assert all(r1 < r0 for r0, r1 in row_cells[out_rows:]) and all(c1 < c0 for c0, c1 in col_cells[out_cols:])
        assert out_batch >= n and out_depth >= c
    for b in range(n):
        for r, (r0, r1) in enumerate(row_cells[:out_rows]):
            for q, (c0, c1) in enumerate(col_cells[:out_cols]):
                for d in range(c):
                    best = None
                    for i in range(r0, r1 + 1):
                        for j in range(c0, c1 + 1):
                            if best is None or key[b, best[0], best[1], d] < key[b, i, j, d]:
                                best = (i, j)
                    if best is not None:
                        chosen[b, r, q, d] = ((b * h + best[0]) * w + best[1]) * c + d
                        maxima[b, r, q, d] = x[b, best[0], best[1], d]
    return chosen, maxima


def fractional_max_pool_grad(x, dy, rows, cols, overlapping, elements=None):
    """out_backprop (orig_output's shape, whose batch and depth may exceed x's) added to the
    chosen elements in output order, in TF's accumulator type (float32 for the half types;
    unlike the rest of this module, so that it is bit-exact).  ``elements``: how many of dy's
    flat elements TF reads (default all)."""
    chosen, _ = fractional_max_pool_select(x, rows, cols, dy.shape[1], dy.shape[2], overlapping, dy.shape[0],
                                           dy.shape[3])
    acc = dy.dtype if np.dtype(dy.dtype).itemsize > 2 else np.float32
    grad = np.zeros(x.size, acc)
    for index, value in zip(chosen.reshape(-1)[:elements], dy.reshape(-1)[:elements].astype(acc)):
        if index < 0:
            raise ValueError("an out_backprop element reaches an empty cell (TF: Invalid input backprop index: -1)")
        grad[index] += value
    return grad.reshape(x.shape).astype(dy.dtype)


def fractional_max_pool(x, rows, cols, overlapping):
    """TF's forward loop: per cell a running ``current < v ? v : current`` from x's type's
    lowest finite value, so NaN is never taken and an empty cell (its clamped end before its
    start) gives that lowest value; float64 result."""
    import ml_dtypes

    lowest = (np.iinfo if np.issubdtype(x.dtype, np.integer) else ml_dtypes.finfo)(x.dtype).min
    n_, h_, w_, c_ = x.shape
    out = np.full((n_, len(rows) - 1, len(cols) - 1, c_), float(lowest))
    for n, (r, (r0, r1)), (q, (c0, c1)) in itertools.product(
            range(n_), enumerate(_max_pool_cells(rows, len(rows) - 1, h_, overlapping)),
            enumerate(_max_pool_cells(cols, len(cols) - 1, w_, overlapping))):
        for i, j, d in itertools.product(range(r0, r1 + 1), range(c0, c1 + 1), range(c_)):
            value = float(x[n, i, j, d])
            if out[n, r, q, d] < value:
                out[n, r, q, d] = value
    return out
