"""How whole the global store sectors of the planes input-gradient kernel's result stores are
(static count, predicted, not measured), beside its measured kernel time.

The planes kernel (``depthwise_conv2d_native_backprop_input_planes``, NCHW) stores each work
item's two rows with ``dwplanes::store_item_row``: ``planes_store_cols`` elements a store (8, 4,
2 or 1, by in_cols' divisibility), lanes taking consecutive work items (plane, row pair, segment
of ``planes_item_cols`` columns).  Where a row holds many segments, a warp's lanes store
consecutive runs of one row: whole 32-byte sectors.  Where it holds two (14 columns) or one
(7), consecutive lanes jump rows, and each store writes a few bytes into each of up to 32
sectors.  This script replays that mapping for one full CTA (block (0, 0, 0): all its planes,
its first band) and counts, per warp store instruction, the distinct 32-byte sectors its active
lanes write (a tensor aligned to 256 bytes), and the bytes they write.  Output: markdown, one row
per NCHW benchmark layer and dtype the planes kernel can run, with the H100's measured kernel
time and % of HBM of the planes kernel forced (``gradops-cuda:planes`` in the A/B run's
``ncu_ab.md``) where that run timed it.

    python benchmarks/planes_store_sectors.py [RUN_DIR] > benchmarks/results/planes_store_sectors.md
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradops.bench.suites import suite  # noqa: E402

launcher = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")

SECTOR = 32


def item_row_stores(g, x: int, item_cols: int, store_cols: int, itemsize: int) -> list[tuple[int, int]]:
    """(first column, elements) of each store ``store_item_row`` makes for the row of the work
    item at column x: one 8-element store (half types, store_cols 8), else store_quad's stores of
    min(4, store_cols) elements over each 4-column quad inside the row."""
    if store_cols == 8 and itemsize == 2:
        return [(x, 8)]
    per_store = 4 if store_cols == 8 else store_cols
    stores = []
    for h in range(0, item_cols, 4):
        if h and x + h >= g.in_cols:
            continue
        for k in range(0, 4, per_store):
            c = x + h + k
            if c < g.in_cols:
                stores.append((c, min(per_store, g.in_cols - c)))
    return stores


def cta_store_sectors(g, dtype) -> dict:
    """The result stores of block (0, 0, 0): warp store instructions, sectors, bytes."""
    dtype = np.dtype(dtype)
    planes, band = launcher.planes_plan(g, dtype)
    stride = g.stride_rows
    item_cols = launcher.planes_item_cols(g)
    segments = launcher.planes_segments(g)
    items = -(-band // 2) * segments
    store_cols = launcher.planes_store_cols(g)
    y0 = -(g.pad_top % stride)  # the first band's first row (row -1 at stride 2, odd pad_top)
    instructions = sectors = written = 0
    for first in range(0, planes * items, 32):  # a warp's lanes: consecutive work items
        lanes = []
        for item in range(first, min(first + 32, planes * items)):
            p, rest = divmod(item, items)
            pair, segment = divmod(rest, segments)
            i, x = 2 * pair, segment * item_cols
            rows = []
            for r in (0, 1):  # the kernel stores row i, then row i + 1
                y = y0 + i + r
                stored = 0 <= y < g.in_rows and (r == 0 or i + 1 < band)
                base = (p * g.in_rows + y) * g.in_cols
                rows.append([(base + c, n) for c, n in item_row_stores(g, x, item_cols, store_cols, dtype.itemsize)]
                            if stored else [])
            lanes.append(rows)
        for r in (0, 1):
            for j in range(max(len(lane[r]) for lane in lanes)):
                touched, nbytes = set(), 0
                for lane in lanes:
                    if j < len(lane[r]):
                        start, n = lane[r][j]
                        touched.update(range(start * dtype.itemsize // SECTOR,
                                             ((start + n) * dtype.itemsize - 1) // SECTOR + 1))
                        nbytes += n * dtype.itemsize
                if touched:
                    instructions += 1
                    sectors += len(touched)
                    written += nbytes
    return {"planes": planes, "band": band, "store_cols": store_cols, "instructions": instructions,
            "sectors": sectors, "bytes": written}


def measured_planes(run: Path) -> dict:
    """{(label, dtype): (us, % of HBM)} of gradops-cuda:planes in the run's ncu_ab.md."""
    out = {}
    path = run / "ncu_ab.md"
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        f = [c.strip() for c in line.split("|")]
        # | suite | case | op | dtype | engine | kernels | time | DRAM | compulsory | % of HBM | ...
        if len(f) > 10 and f[5] == "gradops-cuda:planes" and f[3].endswith("backprop_input"):
            out[(f[2], f[4])] = (float(f[7]), float(f[10]))
    return out


def main(argv: list[str]) -> str:
    run = Path(argv[0]) if argv else Path(__file__).parent / "results" / "gpu_h100_2026-12-05"
    measured = measured_planes(run)
    lines = ["# The planes input-gradient kernel's result stores: bytes per 32-byte sector (static count, predicted, not measured)",
             "",
             "Generated by `python benchmarks/planes_store_sectors.py`; do not edit by hand.  One full CTA "
             "(block (0, 0, 0)) of each launch, the launcher's plan (`planes_plan`), stores as "
             "`dwplanes::store_item_row` makes them, lanes on consecutive work items; a sector is "
             "counted once per warp store instruction that writes into it.  32 bytes a sector: whole "
             "sectors.  Measured columns: the planes kernel forced (`gradops-cuda:planes`) in "
             f"`{run.name}/ncu_ab.md` (kernel time, compulsory bytes / time as % of HBM); - where not timed.",
             "",
             "| layer | dtype | planes x band | elements a store | warp stores a CTA | sectors a CTA | bytes a sector | measured us | measured % of HBM |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name in ("mobilenetv2", "efficientnet"):
        for case in suite(name):
            if not case.op.endswith("backprop_input") or case.data_format != "NCHW":
                continue
            g = case.geometry()
            for dtype in ("float16", "float32"):
                if not launcher.planes_possible(g, np.dtype(dtype)):
                    continue
                s = cta_store_sectors(g, dtype)
                us, pct = measured.get((case.label, dtype), (None, None))
                lines.append(f"| {name} {case.label} | {dtype} | {s['planes']} x {s['band']} | {s['store_cols']} | "
                             f"{s['instructions']} | {s['sectors']} | {s['bytes'] / s['sectors']:.1f} | "
                             f"{'-' if us is None else f'{us:.1f}'} | {'-' if pct is None else f'{pct:.1f}'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(main(sys.argv[1:]))
