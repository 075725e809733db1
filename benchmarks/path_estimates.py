"""Every kernel path of the depthwise gradients and of the fractional pooling gradients that can
run a benchmark case, side by side under the static report's bound and its latency-aware
estimate (**predicted, not measured**).

The launchers pick one kernel per geometry from fixed tables (for example the input gradient's
``MMA_CHOICE``, ``MMA_PLANE_CHOICE`` and ``MMA_PACKED_CHOICE``, or the fractional pooling
gradients' ``CELLS_BY_DEFAULT``).  Those tables were first read off
the bound, which the H200 measured 1.3 to 10 times optimistic.  This script gives each table a
basis in the estimate (``gradops/bench/latency_model.py``), which came within 1.5x of 88% of that
run's kernels.  For each case of the MobileNetV2, EfficientNet and fractional suites (float16 and float32),
it runs ``static_report.predict(..., path=P)`` for every path P the case admits (and, for the input
gradient's NCHW cases, in float64 too, which the benchmark does not time: the launcher's float64
choice):
- input gradient: ``static_report.input_paths``: tiled, mma where the tensor-core kernel can run, and
  planes (NCHW);
- filter gradient: ``static_report.filter_paths``: mma, mma_nhwc, tiled, planes, partial;
- fractional pooling gradients: ``static_report.fractional_paths`` and ``fractional_max_paths``:
  gather (max pooling: select + gather), and cells where the cells partition the input
  (``gradops/bench/static_cells.py``).

Cases with a single path are left out.  The rows give the launcher's path and, per path, the
estimate (µs and % of HBM) and the bound's % of HBM.  The estimate's fit cannot tell how much
resident warps are worth (``latency_model.SHALLOW_OCCUPANCY``), so each case is ranked twice:
by the estimate and by its refit that credits resident warps by their square root only.  A last column gives the H200's measured
time of the launcher's kernel for the case (Nsight Compute, 2026-11-28, revision cb65573,
``gpu_h200_2026-11-28/measured_vs_predicted.json``), together with which kernel family that was.
It is measured, but for one path only and at an older revision, so it is not a comparison of
paths.

    PYTHONPATH=. python benchmarks/path_estimates.py [--archs sm_90,sm_80] [--out benchmarks/results]
    PYTHONPATH=. python benchmarks/path_estimates.py --markdown-only   # re-render the committed JSON
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gradops.bench import latency_model  # noqa: E402
from gradops.bench import static_report as sr  # noqa: E402

LABEL = "predicted, not measured"
MEASURED = ROOT / "benchmarks/results/gpu_h200_2026-11-28/measured_vs_predicted.json"
OPS = {sr.DEPTHWISE_INPUT: "dw dX", sr.DEPTHWISE_FILTER: "dw dW", sr.FRACTIONAL: "frac avg",
       sr.FRACTIONAL_MAX: "frac max"}
SUITES = ("mobilenetv2", "efficientnet", "fractional")
DTYPES = ("float16", "float32")
#: Dtypes the table adds to an op's cases beyond the benchmark's own (which times float16 and
#: float32): the input gradient's float64 choice in NCHW (PLANES_FLOAT64_STRIDES).
EXTRA_DTYPES = {sr.DEPTHWISE_INPUT: ("float64",)}


def dtypes_of(case) -> tuple[str, ...]:
    """The dtypes the table ranks ``case``'s paths in."""
    extra = EXTRA_DTYPES.get(case.op, ()) if case.data_format == "NCHW" else ()
    return tuple(d for d in case.dtypes if d in DTYPES) + extra
#: Where the estimate calls a race a tie (the fit's rms error of log time is 0.28, so a 5%
#: difference says nothing about which kernel is faster).
TIE = 1.05


def paths_of(case, dtype_name: str) -> tuple[str, ...]:
    g, dtype = case.geometry(), sr.DTYPES[dtype_name]
    paths = {sr.DEPTHWISE_INPUT: sr.input_paths, sr.DEPTHWISE_FILTER: sr.filter_paths,
             sr.FRACTIONAL: sr.fractional_paths, sr.FRACTIONAL_MAX: sr.fractional_max_paths}[case.op]
    return paths(g, dtype)


def launcher_path(case, dtype_name: str, arch: int) -> str:
    """The path the launcher takes for the benchmark's (aligned) arrays on compute capability ``arch``."""
    import importlib

    g, dtype = case.geometry(), sr.DTYPES[dtype_name]
    if case.op == sr.DEPTHWISE_INPUT:
        dw = importlib.import_module("gradops.backends.cuda.depthwise_conv2d_native_backprop_input")
        return dw.pick_path(g, dtype, arch=arch)
    if case.op in (sr.FRACTIONAL, sr.FRACTIONAL_MAX):
        return importlib.import_module(f"gradops.backends.cuda.{case.op}").pick_path(g, dtype)
    return sr.filter_launcher_path(g, dtype, arch)


def measured_launcher_times() -> dict:
    if not MEASURED.exists():
        return {}
    return {(r["suite"], r["label"], r["op"], r["dtype"]): (r["us"], r.get("kernel_family", ""))
            for r in json.loads(MEASURED.read_text())["rows"] if r["engine"] == "gradops-cuda"}


def build(archs=("sm_90", "sm_80"), progress=print) -> dict:
    from gradops.backends.cuda import _sass

    kernels = {}
    for source in (sr.DEPTHWISE_SOURCE, sr.DEPTHWISE_FILTER_SOURCE, sr.FRACTIONAL_SOURCE, sr.FRACTIONAL_MAX_SOURCE):
        for arch in archs:
            progress(f"compiling and disassembling {source} for {arch}")
            for k in _sass.compile_kernels((arch,), [source]):
                kernels[(k.arch, k.expression)] = k
    devices = [d for d in sr.DEVICES if f"sm_{d.arch}" in archs]
    measured = measured_launcher_times()
    rows = []
    for device in devices:
        device_meta = asdict(device)
        for name in SUITES:
            for case in sr.suite(name):
                if case.op not in OPS:
                    continue
                for dtype in dtypes_of(case):
                    paths = paths_of(case, dtype)
                    if len(paths) < 2:
                        continue
                    row = {"device": device.key, "suite": name, "op": case.op, "label": case.label, "dtype": dtype,
                           "launcher": launcher_path(case, dtype, device.arch), "paths": {}}
                    for path in paths:
                        p = sr.predict(case, dtype, device, kernels, path=path)
                        if "not_modelled" in p:
                            row["paths"][path] = {"not_modelled": p["not_modelled"]}
                            continue
                        latency_model.annotate({"meta": {"devices": [device_meta]}, "predictions": [p]})
                        shallow, _ = latency_model.prediction_estimate(p, device_meta, latency_model.SHALLOW_OCCUPANCY)
                        stages = p.get("stages") or [p]
                        row["paths"][path] = {"estimate_us": p["latency_aware"]["ms"] * 1e3,
                                              "shallow_us": shallow * 1e6,
                                              "estimate_pct_hbm": p["latency_aware"]["pct_hbm"],
                                              "term": p["latency_aware"]["term"], "bound_pct_hbm": p["pct_hbm"],
                                              "kernels": [s["kernel"] for s in stages],
                                              "resident_warps_per_sm": [s["resident_warps_per_sm"] for s in stages]}
                    if device.arch == 90:
                        m = measured.get((name, case.label, case.op, dtype))
                        if m:
                            row["h200_measured_launcher"] = {"us": m[0], "kernel_family": m[1]}
                    rows.append(row)
                    progress(f"{device.key} {case.label} {dtype}: {row['launcher']}")
    return {"meta": {"label": LABEL, "commit": sr._git("rev-parse", "--short", "HEAD"),
                     "dirty": bool(sr._git("status", "--porcelain", "--untracked-files=no").strip()),
                     "archs": list(archs), "latency_model": asdict(latency_model.FIT),
                     "shallow_occupancy": asdict(latency_model.SHALLOW_OCCUPANCY), "tie": TIE},
            "rows": rows}


def best_path(row: dict, tie: float = TIE, key: str = "estimate_us") -> tuple[str | None, float]:
    """(the path the estimate (``key``: or ``shallow_us``) puts first, how many times faster it is
    than the launcher's path); None for the path where the launcher's is within ``tie`` of the
    best or was not modelled."""
    modelled = {p: v[key] for p, v in row["paths"].items() if key in v}
    if row["launcher"] not in modelled:
        return None, math.nan
    best = min(modelled, key=modelled.get)
    ratio = modelled[row["launcher"]] / modelled[best]
    return (best, ratio) if ratio > tie else (None, ratio)


def markdown(report: dict) -> str:
    meta = report["meta"]
    fit = meta["latency_model"]
    lines = [
        "# The depthwise and fractional pooling gradients' kernel paths side by side (predicted, not measured)", "",
        "Generated by `PYTHONPATH=. python benchmarks/path_estimates.py`; do not edit by hand.", "",
        f"- Commit {meta['commit']}{' (dirty tree)' if meta['dirty'] else ''}; SASS from NVRTC for "
        f"{', '.join(meta['archs'])}, the static report's model (`gradops/bench/static_report.py`) with the "
        "path forced (`predict(..., path=)`).",
        f"- **Estimate**: the latency-aware estimate (`gradops/bench/latency_model.py`: fixed {fit['fixed_s'] * 1e6:g} "
        f"us a kernel, cpi {fit['cpi']:g}, latency factor {fit['latency_factor']:g}, issue efficiency "
        f"{fit['issue_efficiency']:g}; fitted to the H200 run of 2026-11-28, rms error of log time 0.28). "
        "**Bound**: the static report's roofline. Both are predicted, not measured.",
        f"- **Launcher**: the path the launcher takes for the case's aligned arrays. **Best**: the path the "
        f"estimate puts first, where it beats the launcher's by more than {meta['tie']:g}x (else blank).",
        f"- **At exponent 0.5**: the same ranking by the refit that divides a warp's own path by "
        f"{latency_model.REFERENCE_WARPS} x (resident warps / {latency_model.REFERENCE_WARPS}) ** 0.5 instead of "
        f"the resident warps (cpi {meta['shallow_occupancy']['cpi']:g}, latency factor "
        f"{meta['shallow_occupancy']['latency_factor']:g}, issue efficiency "
        f"{meta['shallow_occupancy']['issue_efficiency']:g}): it fits the H200 run as well (rms 0.280), and "
        "credits occupancy less (`gradops/bench/latency_model.py`, SHALLOW_OCCUPANCY).",
        "- **H200 measured**: the launcher's kernel for the case at revision cb65573 (Nsight Compute, "
        "2026-11-28), its family in brackets. This is measured, but for that one kernel only, and the launcher's "
        "choice may have changed since.", ""]
    for device in dict.fromkeys(r["device"] for r in report["rows"]):
        lines += [f"## {device}", "",
                  "| op | case | dtype | launcher | estimate µs (% of HBM; bound % of HBM) per path | best | "
                  "launcher / best | at exponent 0.5: best | launcher / best | H200 measured µs |",
                  "|---|---|---|---|---|---|---:|---|---:|---|"]
        for r in (r for r in report["rows"] if r["device"] == device):
            cells = []
            for path, v in r["paths"].items():
                if "estimate_us" in v:
                    cells.append(f"{path} {v['estimate_us']:.1f} ({v['estimate_pct_hbm']:.0f}%; "
                                 f"{v['bound_pct_hbm']:.0f}%)")
                else:
                    cells.append(f"{path} not modelled")
            best, ratio = best_path(r, meta["tie"])
            shallow, shallow_ratio = best_path(r, meta["tie"], "shallow_us")
            m = r.get("h200_measured_launcher")
            measured = f"{m['us']:.1f} ({m['kernel_family']})" if m else "-"
            lines.append(f"| {OPS[r['op']]} | {r['label']} | {r['dtype']} | {r['launcher']} | {'; '.join(cells)} | "
                         f"{best or ''} | {ratio:.2f} | {shallow or ''} | {shallow_ratio:.2f} | {measured} |")
        rows = sum(r["device"] == device for r in report["rows"])
        lines.append("")
        for key, what in (("estimate_us", "the estimate"), ("shallow_us", "the refit at exponent 0.5")):
            flagged = [r for r in report["rows"] if r["device"] == device and best_path(r, meta["tie"], key)[0]]
            lines.append(f"Cases where {what} puts another path more than {meta['tie']:g}x ahead of the launcher's: "
                         f"{len(flagged)} of {rows}{':' if flagged else '.'}")
            lines += ["", *(f"- {OPS[r['op']]} {r['label']} {r['dtype']}: {r['launcher']} -> "
                            f"{best_path(r, meta['tie'], key)[0]}, {best_path(r, meta['tie'], key)[1]:.2f}x"
                            for r in flagged), ""] if flagged else [""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--archs", default="sm_90,sm_80")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results")
    parser.add_argument("--markdown-only", action="store_true", help="re-render path_estimates.md from the JSON")
    args = parser.parse_args(argv)
    out_json, out_md = args.out / "path_estimates.json", args.out / "path_estimates.md"
    if args.markdown_only:
        report = json.loads(out_json.read_text())
    else:
        report = build(tuple(args.archs.split(",")), progress=lambda text: print(text, file=sys.stderr))
        out_json.write_text(json.dumps(report, indent=1) + "\n")
    out_md.write_text(markdown(report) + "\n")
    print(out_md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
