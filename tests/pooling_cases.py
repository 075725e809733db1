"""Hypothesis strategies for fractional pooling sequences, shared by the fuzzer
(test_fuzz.py) and the TF parity properties (test_fractional_max_pool_grad.py).

Sequences are lists of Python ints read as TF reads them: cell k runs from entry k to entry
k + 1 (inclusive when overlapping, else exclusive), its end clamped to the input.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st


@st.composite
def pool_sequence(draw, size, overlapping):
    """A valid pooling sequence for ``size`` inputs (possibly starting late, ending past the
    end), or one in any order (decreasing, empty cells, cells past the input) as TF reads it."""
    if draw(st.booleans()):
        low = 0 if overlapping else 1  # a disjoint cell may not end before index 0
        return [draw(st.integers(0, size + 3)),
                *draw(st.lists(st.integers(low, size + 3), min_size=1, max_size=size + 1))]
    start = draw(st.integers(0, size - 1))
    if overlapping:
        cuts = sorted(draw(st.lists(st.integers(start, size - 1), max_size=size)))
    else:
        cuts = sorted(draw(st.sets(st.integers(start + 1, size - 1), max_size=size))) if start + 1 < size else []
    last = cuts[-1] if cuts else start
    end = draw(st.integers(last if overlapping else last + 1, size + 3))
    return [start, *cuts, end]


@st.composite
def max_pool_sequence(draw, size, overlapping):
    """Cells a max pooling gradient accepts: each non-empty, so the entries start within the
    input and never decrease (overlapping; else increase), the last possibly past the end."""
    entries = [draw(st.integers(0, size - 1))]
    for _ in range(draw(st.integers(1, size + 1))):
        low = entries[-1] + (0 if overlapping else 1)
        if low > size - 1:
            break
        entries.append(draw(st.integers(low, size - 1)))
    if len(entries) == 1 or draw(st.booleans()):
        entries.append(draw(st.integers(entries[-1] + (0 if overlapping else 1), size + 3)))
    return entries


@st.composite
def empty_cells(draw, sequence, size, overlapping):
    """Entries after a max pooling's cells that TF walks too: each makes an empty cell with the
    entry before it (one that ends before it starts, or starts past the input)."""
    extra, last = [], sequence[-1]
    for _ in range(draw(st.integers(0, 2))):
        if last >= size:  # a start past the input: any end
            entry = draw(st.integers(0, size + 3))
        elif last == 0 and overlapping:
            break  # no end comes before 0, and negative entries are refused
        else:
            entry = draw(st.integers(0, last - 1 if overlapping else last))
        extra.append(entry)
        last = entry
    return extra


@st.composite
def max_pool_grad_sequences(draw, shape, overlapping):
    """(row sequence, column sequence, out_rows, out_cols) of a fractional_max_pool_grad call
    TF computes on an NHWC ``shape``: non-empty cells, possibly followed by entries that make
    empty cells, within TF's "Pooling region" bound (all entries count)."""
    n, h, w, c = shape
    rows, cols = draw(max_pool_sequence(h, overlapping)), draw(max_pool_sequence(w, overlapping))
    row_extra, col_extra = draw(empty_cells(rows, h, overlapping)), draw(empty_cells(cols, w, overlapping))
    assume((len(rows) + len(row_extra)) * (len(cols) + len(col_extra)) <= n * h * w * c)
    return rows + row_extra, cols + col_extra, len(rows) - 1, len(cols) - 1


#: Tiny maps for the pooling gradients' memcheck tests (NHWC shape, row sequence, column
#: sequence): 1-7 rows and columns, 1-16 channels (odd ones: no channel vectors), one cell, cells
#: of one element, cells that do not start at 0, where a row, a cell or a channel run is shorter
#: than a kernel's vectors, chunks or tiles.
TINY_POOLS = (((1, 1, 1, 1), [0, 1], [0, 1]), ((2, 2, 3, 3), [0, 1, 2], [0, 2, 3]),
              ((1, 3, 2, 5), [0, 2, 3], [0, 1, 2]), ((1, 2, 2, 1), [0, 2], [0, 2]),
              ((2, 4, 7, 16), [0, 1, 3, 4], [0, 2, 3, 5, 7]), ((1, 5, 1, 8), [0, 2, 3, 5], [0, 1]),
              ((1, 3, 5, 2), [0, 1, 3], [0, 2, 4, 5]), ((1, 5, 4, 4), [1, 3, 5], [0, 1, 3]))
