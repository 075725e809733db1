"""Static figures of the depthwise input gradient's planes kernel (NCHW, strides 1 and 2) beside
the kernel the launcher runs today, on the benchmark shapes (**predicted, not measured**), and
the H200's measured times of the planes kernel on them.

The planes kernel (``depthwise_conv2d_native_backprop_input_planes`` in
cuda_src/depthwise_conv2d_native_backprop_input.cu) was opt-in until session 46, which made it
the launcher's NCHW default by the static report's latency-aware estimate
(``PLANES_BY_DEFAULT``; the report models it since: ``static_tiled.predict_depthwise_planes``).
This script compiles it for sm_90 (NVRTC, no GPU) and counts, from its SASS
(``static_tiled.planes_loop_figures``), the instructions of each loop's steady-state path:

* the item loop's per-slice sums (the inner loop; its unchecked variant: the checked one runs
  only in a CTA whose filter slices hold an Inf or NaN, so the source is compiled with it off;
  at stride 2, the sums of the geometry's column phase, pad_left % 2, compiled as a constant),
  and the rest of the item loop (index split, both rows' result stores of the geometry's store
  width), each the cheapest path of an iteration that does that work (``CFG.path_table``);
* the staging loop (a chunk of 8 out_backprop elements: its path for a chunk inside a row and
  for a row's last, clamped chunk, with the load width the launcher picks for the shape's aligned
  arrays, ``planes_load_elements``), the zero fill and the filter loop, each per iteration;
* the straight-line code every thread runs: the blocks outside loops on every path to the item
  loop (they dominate its header) and after it.

Per CTA of the direct stores' plan (:func:`planes_plan`, ``staged=False``; the staged form is
not modelled here): thread-instructions = items x (rest + multiplier x sums) + chunks x
staging + zero-fill and filter iterations + the straight-line code once per thread; divided
by the CTA's input-gradient elements.  That is the static report's "SASS per element" (a
thread's instructions per element it produces), which the table prints beside the static report's figure for the launcher's kernel (since session 46 the planes
kernel itself, or mma; the tiled kernel's figures are in results/path_estimates.md) and
the resident warps per SM of each (the occupancy formula at the kernel's registers, shared
memory and block).  The H200's Nsight Compute kernel times of 2026-12-04 close each row
(``gpu_h200_2026-12-04/measured_vs_predicted.json``, at commit 8193847, whose planes kernel
staged one element a load): the planes kernel forced (``gradops-cuda:planes``), and the
launcher's kernel in NCHW and in NHWC.  The static columns are of the kernel as it is now.

    PYTHONPATH=. python benchmarks/planes_prediction.py [--out benchmarks/results/planes_prediction.md]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gradops.backends.cuda import _build, _sass  # noqa: E402
from gradops.bench import static_tiled as st  # noqa: E402
from gradops.bench import suites  # noqa: E402

dx = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")

LABEL = "predicted, not measured"
SOURCE = dx.SOURCE
ARCH = "sm_90"
MEASURED = ROOT / "benchmarks/results/gpu_h200_2026-12-04/measured_vs_predicted.json"
STATIC = ROOT / "benchmarks/results/static_report.json"


def loop_figures(store_cols: int, phase: int = 0, load_elements: int = 1, lead: int = 1) -> dict:
    """Per planes instantiation (name expression): each loop's steady-state path on sm_90, from
    the source with the checked sums off, results stored ``store_cols`` at a time, (stride 2)
    the sums of column phase ``phase``, staging loads of ``load_elements`` elements and 16-byte
    staging stores of lead ``lead`` (``static_tiled.planes_loop_figures``, which the static
    report's planes model uses too), as thread-instructions; instantiations whose elements make
    wider loads than 16 bytes, or whose 16-byte stores hold no more than ``lead`` values, are absent."""
    figures = st.planes_loop_figures(ARCH, store_cols, phase, load_elements, lead)
    return {e: {"sums": f["sums"][0], "item_rest": f["rest"][0], "staging": f["staging"][0],
                "staging_edge": f["staging_edge"], "zero_per_store": f["zero"], "filter": f["filter"],
                "straight": f["straight"]} for e, f in figures.items()}


def registers() -> dict:
    names = [e for e in _build.all_instantiations(90)[SOURCE] if "_planes<" in e]
    return {k.expression: k.ptxas["registers"] for k in _sass.compile_kernels((ARCH,), [SOURCE], only=names)}


def per_element(g, dtype, f: dict) -> float:
    """Thread-instructions per input-gradient element of a full CTA of the launcher's plan."""
    planes, band = dx.planes_plan(g, dtype, staged=False)
    m = g.depth_multiplier
    slices = planes * m
    items = planes * dx.planes_items(g, band)
    rows_cap = dx.planes_rows_cap(g, band)
    whole = g.out_cols // dx.PLANES_CHUNK  # chunks wholly inside a row, and the row's last part
    chunk_cost = whole * f["staging"] + (f["staging_edge"] if g.out_cols % dx.PLANES_CHUNK else 0)
    staging = slices * rows_cap * chunk_cost
    per_store = 16 // np.dtype(np.float64 if dtype == np.float64 else np.float32).itemsize
    zero_stores = slices * dx.planes_staged_rows(g, band) * dx.planes_pitch(g) / per_store
    taps = g.filter_rows * g.filter_cols * slices
    total = (items * (f["item_rest"] + m * f["sums"]) + staging + zero_stores * f["zero_per_store"]
             + taps * f["filter"] + dx.PLANES_THREADS * f["straight"])
    return total / (planes * min(band, g.in_rows) * g.in_cols)


def rows(figures: dict, regs: dict) -> list[dict]:
    static = json.loads(STATIC.read_text())
    predictions = {(p["suite"], p["label"], p["dtype"]): p for p in static["predictions"]
                   if p["device"] == "H100 SXM" and p["op"] == "depthwise_conv2d_native_backprop_input"}
    measured = {}  # (engine, suite, label, dtype) -> us
    if MEASURED.exists():
        for r in json.loads(MEASURED.read_text())["rows"]:
            if r["engine"] in ("gradops-cuda", "gradops-cuda:planes") and r["op"] == "depthwise_conv2d_native_backprop_input":
                measured[(r["engine"], r["suite"], r["label"], r["dtype"])] = r["us"]
    out = []
    for name in ("mobilenetv2", "efficientnet"):
        for case in suites.suite(name):
            if case.op != "depthwise_conv2d_native_backprop_input" or case.data_format != "NCHW":
                continue
            g = case.geometry()
            for dtype_name in ("float16", "float32"):
                dtype = np.dtype(dtype_name)
                if not dx.planes_possible(g, dtype):
                    continue
                expression = dx.planes_expression(g, dtype, staged=False)
                f = figures[figure_key(g, dtype)][expression]
                occ = _sass.occupancy(90, regs[expression], dx.PLANES_SHARED_BYTES, dx.PLANES_THREADS)
                p = predictions.get((name, case.label, dtype_name), {})
                kernel = p.get("kernel", "").split("<")[0].rsplit("_", 1)[-1]
                nhwc = case.label.replace("NCHW", "NHWC")
                out.append(dict(suite=name, label=case.label, dtype=dtype_name, plan=dx.planes_plan(g, dtype, staged=False),
                                load_elements=dx.planes_load_elements(g, dtype),
                                planes_sass=per_element(g, dtype, f), planes_warps=occ["warps_per_sm"],
                                kernel=kernel, kernel_sass=p.get("sass_per_element"),
                                kernel_warps=p.get("resident_warps_per_sm"),
                                planes_us=measured.get(("gradops-cuda:planes", name, case.label, dtype_name)),
                                measured_us=measured.get(("gradops-cuda", name, case.label, dtype_name)),
                                measured_nhwc_us=measured.get(("gradops-cuda", name, nhwc, dtype_name))))
    return out


def markdown(table: list[dict], figures: dict, regs: dict) -> str:
    lines = [f"# The input gradient's planes kernel beside today's NCHW kernel ({LABEL})", "",
             "Generated by `PYTHONPATH=. python benchmarks/planes_prediction.py`; do not edit by hand.", "",
             f"SASS from NVRTC {_sass.nvrtc_version()} for {ARCH}. The planes columns are {LABEL}: static "
             "instruction counts of the planes kernel as it is now (see the script's docstring). 'today' is the "
             "static report's figure for the kernel the launcher runs (planes, mma or tiled), also static. The three "
             "measured columns are the H200's Nsight Compute kernel times of 2026-12-04 "
             "(benchmarks/results/gpu_h200_2026-12-04, commit 8193847, whose planes kernel staged one element a "
             "load): the planes kernel forced, and the launcher's kernel in NCHW and in NHWC.", "",
             "## Loop figures (sm_90, thread-instructions per iteration)", "",
             "Staging at lead 1 (the 3x3 SAME filters': each chunk's 16-byte staging stores start one value before "
             "it); the per-shape table takes each shape's own lead (`planes_staging_lead`).", "",
             "| instantiation | registers | sums (one slice, one item: 2 x 4, stride 2 2 x 8) | rest of an item (stores of 8 / 4 / 2 / 1) "
             "| staging, a chunk of 8 inside a row / at its end: an element a load | 16-byte loads "
             "| zero fill (a 16-byte store) | filter (a tap) | straight-line | stride 2, odd column phase: sums / rest (stores of 4) |",
             "|---|---:|---:|---|---|---|---:|---:|---:|---|"]
    for expression in sorted(figures[4, 0, 1, 1]):
        f8, f4, f2, f1 = (figures[c, 0, 1, 1][expression] for c in (8, 4, 2, 1))
        odd = figures[4, 1, 1, 1][expression]
        phase = f"{odd['sums']} / {odd['item_rest']}" if expression.endswith(", 2>") else "-"
        widest = figures[4, 0, st.planes_widest_load(expression), 1][expression]
        lines.append(f"| `{expression.split('::')[1]}` | {regs[expression]} | {f4['sums']} | "
                     f"{f8['item_rest'] if expression.endswith(', 2>') else '-'} / {f4['item_rest']} / {f2['item_rest']} / "
                     f"{f1['item_rest']} | {f4['staging']} / {f4['staging_edge']} | "
                     f"{widest['staging']} / {widest['staging_edge']} | "
                     f"{f4['zero_per_store']:.2f} | {f4['filter']:.0f} | {f4['straight']} | {phase} |")
    lines += ["", "## Per benchmark shape", "",
              "Staging loads as the launcher picks them for aligned arrays (`planes_load_elements`: 16, 8 or 4 "
              "bytes that divide an out_backprop row, else an element).", "",
              "| suite | case | dtype | planes plan (planes, band) | staging load (elements) | planes SASS/elem "
              "| planes warps/SM | today's kernel | today SASS/elem | today warps/SM | planes µs (H200, measured) "
              "| launcher NCHW µs (H200, measured) | launcher NHWC µs (H200, measured) |",
              "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in table:
        lines.append(f"| {r['suite']} | {r['label']} | {r['dtype']} | {r['plan']} | {r['load_elements']} | "
                     f"{r['planes_sass']:.1f} | {r['planes_warps']} | {r['kernel'] or '-'} | "
                     f"{num(r['kernel_sass'], '.1f')} | {num(r['kernel_warps'], 'd')} | {num(r['planes_us'], '.1f')} | "
                     f"{num(r['measured_us'], '.1f')} | {num(r['measured_nhwc_us'], '.1f')} |")
    return "\n".join(lines) + "\n"


def figure_key(g, dtype) -> tuple:
    """(store_cols, phase, load_elements, lead) of the launch for ``g``."""
    return (dx.planes_store_cols(g), g.pad_left % g.stride_cols, dx.planes_load_elements(g, dtype),
            dx.planes_staging_lead(g, dtype))


def figure_keys() -> set:
    """The (store_cols, phase, load_elements, lead) the tables read: the loop table's (every
    store width and the odd phase with element loads; each load width with stores of 4; lead 1,
    the 3x3 SAME filters') and each benchmark shape's."""
    keys = ({(cols, 0, 1, 1) for cols in st.PLANES_STORE_COLS} | {(4, 1, 1, 1)}
            | {(4, 0, e, 1) for e in (1, 2, 4, 8)})
    for name in ("mobilenetv2", "efficientnet"):
        for case in suites.suite(name):
            if case.op == "depthwise_conv2d_native_backprop_input" and case.data_format == "NCHW":
                g = case.geometry()
                for dtype in (np.dtype(np.float16), np.dtype(np.float32)):
                    if dx.planes_possible(g, dtype):
                        keys.add(figure_key(g, dtype))
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here (default: print it)")
    args = parser.parse_args()
    figures = {key: loop_figures(*key) for key in sorted(figure_keys())}
    regs = registers()
    text = markdown(rows(figures, regs), figures, regs)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
