"""Warp-level SASS instruction counts of the (new) fractional_avg_pool_grad kernel on a real geometry.

Each lane's path through the SASS is walked (walk.py) with the branch decisions that the kernel
source's control flow takes for that lane (emulated here from the launcher's plan and tables);
a warp issues an instruction as many times as its most frequent lane executes it (the code is
structured and reconverges), so a warp's issue count is the sum over addresses of the maximum
over its lanes of visits.  Per element = warp-instructions * 32 / input-gradient elements.
"""
import importlib
import sys
from pathlib import Path
from collections import Counter
sys.path.insert(0, str(Path(__file__).resolve().parents[2])); sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import gradops
from gradops._geometry import fractional_pool_geometry
from walk import sass_lines, walk
L = importlib.import_module("gradops.backends.cuda.fractional_avg_pool_grad")


def lane_decisions(p, g, lane, tables):
    (row_off, row_cells, row_sizes, row_tiles, col_off, col_cells, col_sizes, col_tiles) = tables
    cv, tx, tz, tn, by, ct, thread, threads = lane
    d = Counter()
    seq = {}
    def add(role, *values):
        seq.setdefault(role, []).extend(values)
    n, x, c = tn, ct * p.tile_cols + tx, cv * p.vector
    has_column = n < g.batch and c < g.depth and x < g.in_cols
    row_lo, row_hi = row_tiles[2 * by], row_tiles[2 * by + 1]
    col_lo, col_hi = col_tiles[2 * ct], col_tiles[2 * ct + 1]
    rows, cols = row_hi - row_lo + 1, col_hi - col_lo + 1
    assert rows > 0 and cols > 0 and rows * cols <= p.share_cells
    add("tb_ge_1", False)
    TJ = p.stage_cols
    CH = p.block_vectors * p.vector
    for t in range(p.tile_batch):
        add("nt_ge_batch", t >= g.batch)
        if t >= g.batch:
            break
        slots = rows * TJ
        add("no_slot", thread >= slots)
        if thread < slots:
            slot = thread
            while True:
                i, j = slot // TJ, slot % TJ
                add("j_skip", j >= cols)
                if j < cols:
                    while True:
                        size = row_sizes[row_lo + i] * col_sizes[col_lo + j]
                        add("size0", size == 0)
                        if size:
                            nq = min(p.block_vectors, (g.depth - 0) // p.vector)
                            for q in range(4):
                                if q > 0:
                                    add(f"stop{q}", q == nq)
                                if q == nq:
                                    break
                                add(f"finite{q}", True)
                        j += TJ
                        add("j_back", j < cols)
                        if j >= cols:
                            break
                slot += threads
                add("slot_back", slot < slots)
                if slot >= slots:
                    break
        add("t_back", t + 1 < p.tile_batch)
    add("no_column", not has_column)
    if has_column:
        C = col_off[x + 1] - col_off[x]
        y0 = by * p.tile_height + tz
        positions = min(p.rows_per_thread, -(-(g.in_rows - y0) // p.tile_rows)) if y0 < g.in_rows else 0
        add("no_positions", positions == 0)
        for q in range(positions):
            y = y0 + q * p.tile_rows
            R = row_off[y + 1] - row_off[y]
            add("empty", C == 0 or R == 0)
            if not (C == 0 or R == 0):
                for ri in range(R):
                    pre = "first_" if ri == 0 else "loop_"
                    add(pre + "c_le_1", C <= 1)
                    if C > 1:
                        add(pre + "c_le_2", C <= 2)
                        if C > 2:
                            add(pre + "extra_back", *([True] * (C - 3) + [False]))
                    if ri == 0:
                        add("no_more_rows", R == 1)
                    else:
                        add("row_back", ri < R - 1)
            add("pos_back", q < positions - 1)
    return seq


def estimate(sass, function, roles, shape, ratio, overlapping, dtype, seed=1):
    lines = sass_lines(sass, function)
    rows = gradops.fractional_pooling_sequence(shape[1], ratio, True, seed=seed)
    cols = gradops.fractional_pooling_sequence(shape[2], ratio, True, seed=seed + 1)
    out_shape = (shape[0], len(rows) - 1, len(cols) - 1, shape[3])
    g = fractional_pool_geometry("fractional_avg_pool_grad", list(shape), out_shape, [int(v) for v in rows],
                                 [int(v) for v in cols], overlapping)
    p = L.plan(g, np.dtype(dtype))
    tables = [np.asarray(t, np.int64) for t in L.kernel_tables(g, p)]
    per_addr = Counter()
    elements = 0
    threads = p.block_vectors * p.tile_cols * p.tile_rows * p.tile_batch
    for by in range(p.row_tiles):
        for ct in range(p.col_tiles):
            warp_visits = [Counter() for _ in range(-(-threads // 32))]
            for t in range(threads):
                cv = t % p.block_vectors
                yi = t // p.block_vectors
                tx, tz, tn = yi % p.tile_cols, (yi // p.tile_cols) % p.tile_rows, yi // (p.tile_cols * p.tile_rows)
                seq = lane_decisions(p, g, (cv, tx, tz, tn, by, ct, t, threads), tables)
                decisions = {a: [False] for a in roles["never"]}
                decisions[roles["staged"]] = [True]
                for role, values in seq.items():
                    decisions.setdefault(roles[role], []).extend(values)
                _, visits = walk(lines, decisions)
                wv = warp_visits[t // 32]
                for a, v in visits.items():
                    wv[a] = max(wv[a], v)
                x = ct * p.tile_cols + tx
                if cv * p.vector < g.depth and x < g.in_cols and tn < g.batch:
                    ys = [by * p.tile_height + tz + q * p.tile_rows for q in range(p.rows_per_thread)]
                    elements += p.vector * sum(y < g.in_rows for y in ys)
            for wv in warp_visits:
                per_addr.update(wv)
    total = sum(per_addr.values())
    estimate.per_addr = {a: v * 32 / elements for a, v in per_addr.items()}
    return total * 32 / elements, p
