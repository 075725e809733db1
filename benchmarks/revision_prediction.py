"""The depthwise kernels of two revisions side by side under the static report's model
(**predicted, not measured**): compiled for sm_90 with NVRTC (no GPU), counted from their SASS.

* Input gradient, NHWC tiled kernel, on every MobileNetV2 and EfficientNet NHWC layer in
  float16 and float32 (``static_report.predict(..., path="tiled")`` on the H100 SXM model, with
  ``latency_model``'s latency-aware estimate): registers, resident warps per SM, SASS per
  element, the estimate (us and % of HBM) and its limiting term, and the new / old ratio under
  ``latency_model.SHALLOW_OCCUPANCY`` too.
* Filter gradient's reduction, float16 / float32 / float64 on sm_90 and float32 on sm_80:
  registers, the global-load round trips of a batch of 16 loads (``_sass.load_round_trips``
  from the first load to the barrier) and the busiest thread's path at 12 / 16 / 19 loads
  (``static_report.filter_reduce_cost``).

    PYTHONPATH=. python benchmarks/revision_prediction.py --old a94e130 [--new HEAD] [--out FILE]

Both revisions' kernels are compiled from ``git show REV:cuda_src/...``; the model is this
checkout's.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradops.backends.cuda import _build, _sass  # noqa: E402
from gradops.bench import latency_model, static_report as sr  # noqa: E402
from gradops.bench.suites import DEPTHWISE_INPUT  # noqa: E402


def source_at(revision: str, source: str) -> str:
    return subprocess.check_output(["git", "show", f"{revision}:cuda_src/{source}"], cwd=ROOT, text=True)


def tiled_rows(revisions) -> list[str]:
    src = sr.DEPTHWISE_SOURCE
    wanted = [e for e in _build.all_instantiations(90)[src]
              if "_tiled<" in e and "double" not in e and sr.template_args(e)[2] == "0"]
    device = sr.DEVICES[0]
    meta = asdict(device)
    found = {}
    for revision in revisions:
        kernels = {(k.arch, k.expression): k
                   for k in _sass.compile_kernels(("sm_90",), [src], texts={src: source_at(revision, src)}, only=wanted)}
        for case in sr.suite("mobilenetv2") + sr.suite("efficientnet"):
            if case.op != DEPTHWISE_INPUT or case.data_format != "NHWC":
                continue
            for dtype in ("float16", "float32"):
                p = sr.predict(case, dtype, device, kernels, path="tiled")
                if "not_modelled" in p:
                    found.setdefault((case.suite, case.label, dtype), {})[revision] = None
                    continue
                latency_model.annotate({"meta": {"devices": [meta]}, "predictions": [p]})
                shallow, _ = latency_model.prediction_estimate(p, meta, latency_model.SHALLOW_OCCUPANCY)
                registers = kernels[("sm_90", p["kernel"])].ptxas["registers"]
                found.setdefault((case.suite, case.label, dtype), {})[revision] = (
                    registers, p["resident_warps_per_sm"], p["sass_per_element"], p["latency_aware"]["ms"] * 1e3,
                    p["latency_aware"]["pct_hbm"], p["latency_aware"]["term"], shallow)
    old, new = revisions
    rows = [f"| suite | layer | dtype | registers | warps/SM | SASS/elem | estimate, us (% of HBM) {old} | "
            f"estimate, us (% of HBM) {new} | new / old | term | new / old, square-root fit |",
            "|---|---|---|---|---|---|---:|---:|---:|---|---:|"]
    for (suite, label, dtype), by in found.items():
        a, b = by.get(old), by.get(new)
        if a is None or b is None:
            rows.append(f"| {suite} | {label} | {dtype} | not modelled: {old} {a is not None}, {new} {b is not None} "
                        f"| | | | | | | |")
            continue
        rows.append(f"| {suite} | {label} | {dtype} | {a[0]} → {b[0]} | {a[1]} → {b[1]} | {a[2]:.1f} → {b[2]:.1f} | "
                    f"{a[3]:.1f} ({a[4]:.1f}%) | {b[3]:.1f} ({b[4]:.1f}%) | {b[3] / a[3]:.2f} | {b[5]} | "
                    f"{b[6] / a[6]:.2f} |")
    return rows


def reduce_rows(revisions) -> list[str]:
    src = sr.DEPTHWISE_FILTER_SOURCE
    dwf = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_filter")
    rows = ["| arch | dtype | revision | registers | round trips of 16 loads | global loads | "
            "path SASS at 12 / 16 / 19 loads |", "|---|---|---|---:|---:|---|---|"]
    for arch, dtypes in (("sm_90", ("float16", "float32", "float64")), ("sm_80", ("float32",))):
        for dtype in dtypes:
            for revision in revisions:
                expression = dwf._reduce_expression(sr.DTYPES[dtype])
                [k] = _sass.compile_kernels((arch,), [src], texts={src: source_at(revision, src)}, only=[expression])
                ins = k.function.instructions
                first = next(i for i, x in enumerate(ins) if x.base == "LDG")
                barrier = next(i for i, x in enumerate(ins) if x.base == "BAR")
                widths = sorted({f"LDG.{8 * _sass.access_width(x)}" for x in ins[first:barrier] if x.base == "LDG"})
                costs = " / ".join(str(sr.filter_reduce_cost(k, n)[0]) for n in (12, 16, 19))
                rows.append(f"| {arch} | {dtype} | {revision} | {k.ptxas['registers']} | "
                            f"{_sass.load_round_trips(ins[first:barrier])} | {', '.join(widths)} | {costs} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", default="HEAD")
    parser.add_argument("--out", type=Path, default=None, help="write the markdown here (default: print it)")
    args = parser.parse_args()
    revisions = [subprocess.check_output(["git", "rev-parse", "--short", r], cwd=ROOT, text=True).strip()
                 for r in (args.old, args.new)]
    text = "\n".join([
        f"# Depthwise kernels at {revisions[0]} and {revisions[1]}: PREDICTED, NOT MEASURED", "",
        f"**Predicted, not measured.** Generated by `PYTHONPATH=. python benchmarks/revision_prediction.py "
        f"--old {revisions[0]} --new {revisions[1]}`; NVRTC {_sass.nvrtc_version()}, nvdisasm "
        f"{_sass.tool_version('nvdisasm')}; sm_90 (and sm_80 for the reduction). Model: the static report's "
        f"(benchmarks/results/static_report.md, its assumptions), on the {sr.DEVICES[0].key} device, "
        "with the latency-aware estimate (gradops/bench/latency_model.py). The last column is the same "
        "ratio under latency_model.SHALLOW_OCCUPANCY, the fit that credits resident warps by their square "
        "root only (the H200 runs cannot tell the two apart).", "",
        "## Input gradient: the NHWC tiled kernel (path \"tiled\")", "", *tiled_rows(revisions), "",
        "## Filter gradient: the reduction of the slices' partial sums", "", *reduce_rows(revisions), ""])
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
