"""Instructions per element of the old kernel's grid-stride loop (one iteration = one element),
averaged over the elements of a real geometry (all lanes of a warp share (n, y, x) when depth >= 32,
so warp issue = thread path)."""
import importlib
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[2])); sys.path.insert(0, str(Path(__file__).resolve().parent))
from walk import sass_lines, walk
from collections import Counter
import numpy as np, gradops
from gradops._geometry import fractional_pool_geometry, cells_by_index

def per_element(sass, fn, A, R, C):
    lines = sass_lines(sass, fn)
    start = [i for i, (a, t) in enumerate(lines) if a == A["head"]][0]
    d = {A["div1"]: [True], A["div2"]: [True], A["div3"]: [True], A["rows_empty"]: [R == 0], A["back"]: [False]}
    if R:
        d[A["cols_empty"]] = [C == 0] * R
        if C:
            rem = C % 4
            d[A["rem0"]] = [rem == 0] * R
            fast = []
            if rem >= 1:
                d[A["rem_ne_1"]] = [rem == 1] * R
            if rem >= 2:
                d[A["rem_ne_2"]] = [rem == 2] * R
            nterms_rem = rem
            d[A["divfast1"]] = [True] * (R if rem >= 1 else 0)
            d[A["divfast2"]] = [True] * (R if rem >= 2 else 0)
            d[A["divfast3"]] = [True] * (R if rem >= 3 else 0)
            d[A["ge4"]] = [C < 4] * R
            assert C < 4
        d[A["row_back"]] = [True] * (R - 1) + [False]
    d = {k: v for k, v in d.items() if v}
    n, _ = walk(lines[start:], d)
    return n - 1  # the EXIT after the loop's back edge

def average(sass, fn, A, shape, ratio, overlapping, seed=1):
    rows = gradops.fractional_pooling_sequence(shape[1], ratio, True, seed=seed)
    cols = gradops.fractional_pooling_sequence(shape[2], ratio, True, seed=seed + 1)
    g = fractional_pool_geometry("fractional_avg_pool_grad", list(shape), (shape[0], len(rows) - 1, len(cols) - 1, shape[3]),
                                 [int(v) for v in rows], [int(v) for v in cols], overlapping)
    ro, _ = g.cells_by_index("rows"); co, _ = g.cells_by_index("cols")
    Rs, Cs = np.diff(ro), np.diff(co)
    cache = {}
    total = 0
    for R, nr in Counter(Rs.tolist()).items():
        for C, nc in Counter(Cs.tolist()).items():
            if (R, C) not in cache:
                cache[R, C] = per_element(sass, fn, A, R, C)
            total += cache[R, C] * nr * nc
    return total / (len(Rs) * len(Cs)), cache

# Branch addresses in the SASS of the old source (commit 39b8b12) compiled by NVRTC 13 for sm_90.
F32 = dict(head=0x210, div1=0x250, div2=0x530, div3=0x830, rows_empty=0xb80, cols_empty=0xc40, rem0=0xd70,
           divfast1=0x1050, rem_ne_1=0x10e0, divfast2=0x13d0, rem_ne_2=0x1460, divfast3=0x1710, ge4=0x1810,
           row_back=0x24d0, back=0x2580)
F16 = dict(head=0x210, div1=0x250, div2=0x530, div3=0x830, rows_empty=0xb80, cols_empty=0xc40, rem0=0xd70,
           divfast1=0x1060, rem_ne_1=0x10f0, divfast2=0x13f0, rem_ne_2=0x1480, divfast3=0x1740, ge4=0x1840,
           row_back=0x2540, back=0x25f0)
for name, fn, A in (("f16", "I6__halfdE", F16), ("f32", "IfdE", F32)):
    for shape in ((1, 112, 112, 64), (1, 56, 56, 256)):
        for ov in (False, True):
            avg, cache = average(sys.argv[1], fn, A, shape, 1.44, ov)
            print(f"old {name} {shape} {'overlapping' if ov else 'disjoint   '} {avg:7.2f}  per (R, C): {dict(sorted(cache.items()))}")
