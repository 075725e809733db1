"""The static model (predicted, not measured) beside the H100 Nsight Compute run (measured).

For every depthwise input-gradient and fractional average pooling case that
``benchmarks/results/gpu_h100_2026-11-22/`` measured with gradops' CUDA kernels, this predicts
the kernel time of the kernel *as measured*: the depthwise source of the measured revision
(:data:`gradops.bench.static_tiled.MEASURED_DEPTHWISE_REVISION`, compiled from ``git show``
with today's headers, launched by that revision's rules: no paired multipliers, 16-byte
staging only at multiplier 1) and the fractional average pooling source of that revision
(:data:`gradops.bench.static_tiled.MEASURED_FRACTIONAL_REVISION`, ``git show`` likewise),
launched as that revision's own launcher module (``git show``, run beside today's) plans it.
It writes ``static_calibration.md`` and ``.json`` into that folder, measured and predicted
columns apart, with the ratio measured / predicted and its geometric mean and spread.

    python benchmarks/static_calibration.py [--results benchmarks/results/gpu_h100_2026-11-22]

No GPU: NVRTC, nvdisasm and cuobjdump from NVIDIA's wheels (``pip install gradops[static]``).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ncu_table import kernels_by_case  # noqa: E402

from gradops.bench import static_report as sr  # noqa: E402
from gradops.bench import static_tiled as st  # noqa: E402
from gradops.bench.metrics import bytes_moved  # noqa: E402
from gradops.bench.suites import DEPTHWISE_INPUT, DTYPES, FRACTIONAL, suite  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu_h100_2026-11-22"
LABEL = "predicted, not measured"
DEVICE = sr.DEVICES[0]  # H100 SXM: the measured GPU
OPS = (DEPTHWISE_INPUT, FRACTIONAL)


def _git(*args) -> str:
    return subprocess.check_output(["git", *args], cwd=ROOT, text=True)


def measured_cases(results: Path) -> list[dict]:
    """The gradops-cuda cases of :data:`OPS` with their measured kernels (Nsight Compute)."""
    by_case = kernels_by_case(str(results / "ncu_cases.csv.gz"))
    index = json.loads((results / "ncu_index.json").read_text())
    out = []
    for entry in index:
        if entry["engine"] != "gradops-cuda" or entry["op"] not in OPS or not by_case.get(entry["i"]):
            continue
        kernels = by_case[entry["i"]]
        out.append({**entry, "measured_us": sum(k["ns"] for k in kernels) / 1e3,
                    "measured_dram_bytes": sum(k["read"] + k["write"] for k in kernels),
                    "measured_kernels": [k["name"] for k in kernels]})
    return out


def _case(entry):
    return next(c for c in suite(entry["suite"]) if c.label == entry["label"] and c.op == entry["op"])


def _tiled_expression(case, dtype):
    return st.measured_depthwise_expression(case.geometry(), dtype)


def _fractional_launch(case, dtype):
    """(launcher module, plan, expression) of the measured revision's fractional launcher."""
    fr = st.fractional_launcher(st.MEASURED_FRACTIONAL_REVISION)
    plan = fr.plan(case.geometry(), dtype)
    return fr, plan, fr._expression(dtype, plan.index, plan.vector)


def compile_measured(entries) -> tuple[dict, dict]:
    """({expression: kernel} of the measured revision's depthwise source, {expression: kernel} of
    its fractional source), sm_90."""
    from gradops.backends.cuda import _sass

    revision = st.MEASURED_DEPTHWISE_REVISION
    old = _git("show", f"{revision}:cuda_src/{sr.DEPTHWISE_SOURCE}")
    wanted = {_tiled_expression(_case(e), DTYPES[e["dtype"]]) for e in entries if e["op"] == DEPTHWISE_INPUT}
    depthwise = {k.expression: k for k in _sass.compile_kernels(("sm_90",), [sr.DEPTHWISE_SOURCE],
                                                                 texts={sr.DEPTHWISE_SOURCE: old}, only=wanted)}
    frac_text = _git("show", f"{st.MEASURED_FRACTIONAL_REVISION}:cuda_src/{sr.FRACTIONAL_SOURCE}")
    wanted = {_fractional_launch(_case(e), DTYPES[e["dtype"]])[2] for e in entries if e["op"] == FRACTIONAL}
    fractional = {k.expression: k for k in _sass.compile_kernels(("sm_90",), [sr.FRACTIONAL_SOURCE],
                                                                  texts={sr.FRACTIONAL_SOURCE: frac_text}, only=wanted)}
    return depthwise, fractional


def _name_matches(measured: str, expression: str) -> bool:
    """Nsight Compute's (possibly truncated) ``void gradops::...<...>`` name names ``expression``."""
    name = measured.removeprefix("void ").split("(", 1)[0]
    return expression.startswith(name) or name.startswith(expression)


def predict(entry, depthwise: dict, fractional: dict) -> dict:
    case, dtype = _case(entry), DTYPES[entry["dtype"]]
    g = case.geometry()
    if entry["op"] == FRACTIONAL:
        fr, plan, expression = _fractional_launch(case, dtype)
        kernel = fractional[expression]
        p = st.predict_fractional(case, entry["dtype"], DEVICE, kernel, g, plan, fr)
    else:
        kernel = depthwise[_tiled_expression(case, dtype)]
        launch = st.depthwise_launch(g, dtype, st.MEASURED_DEPTHWISE_REVISION)
        p = st.predict_depthwise(case, entry["dtype"], DEVICE, kernel, g, launch)
    p["kernel_matches_measured"] = all(_name_matches(n, kernel.expression) for n in entry["measured_kernels"])
    p["compulsory_bytes"] = bytes_moved(case, g, dtype.itemsize)
    return p


def _geo(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _spread(values) -> float:
    """Geometric standard deviation factor of the ratios."""
    if len(values) < 2:
        return math.nan
    logs = [math.log(v) for v in values]
    mean = sum(logs) / len(logs)
    return math.exp(math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1)))


def _group(row) -> str:
    if row["op"] == FRACTIONAL:
        return f"fractional {row['dtype']} {'overlapping' if 'overlapping' in row['label'] else 'disjoint'}"
    label = row["label"]
    layout = "NCHW" if label.endswith("NCHW") else "NHWC"
    mult = label.split()[-2]
    return f"{row['suite']} {row['dtype']} {layout} {mult}"


def build(results: Path = RESULTS) -> dict:
    entries = measured_cases(results)
    print(f"compiling the measured kernels of {len(entries)} cases (sm_90)", file=sys.stderr, flush=True)
    depthwise, fractional = compile_measured(entries)
    changed = _git("diff", "--stat", st.MEASURED_FRACTIONAL_REVISION, "--", f"cuda_src/{sr.FRACTIONAL_SOURCE}").strip()
    rows = []
    for e in entries:
        print(f"predicting {e['suite']} {e['label']} {e['dtype']}", file=sys.stderr, flush=True)
        p = predict(e, depthwise, fractional)
        row = {k: e[k] for k in ("suite", "label", "op", "dtype", "measured_us", "measured_dram_bytes",
                                 "measured_kernels")}
        row["measured_pct_hbm"] = 100 * p["compulsory_bytes"] / (e["measured_us"] * 1e-6) / DEVICE.bandwidth
        if "not_modelled" in p:
            row["predicted"] = {"not_modelled": p["not_modelled"]}
        else:
            row["predicted"] = {k: p[k] for k in ("kernel", "limiter", "predicted_ms", "limits_ms", "sass_per_element",
                                                  "kernel_matches_measured")}
            row["predicted"]["tiled"] = p.get("tiled")
            row["ratio"] = e["measured_us"] / (p["predicted_ms"] * 1e3)
        rows.append(row)
    return {"meta": {"label": LABEL, "commit": _git("rev-parse", "--short", "HEAD").strip(),
                     "measured": str(results.relative_to(ROOT)),
                     "depthwise_revision": st.MEASURED_DEPTHWISE_REVISION,
                     "fractional_revision": st.MEASURED_FRACTIONAL_REVISION,
                     "fractional_source_changed_since": changed or None, "device": DEVICE.key},
            "rows": rows, "summary": summarise(rows)}


def summarise(rows) -> dict:
    """Ratio statistics per group (suite, dtype, layout, multiplier), per predicted limiter and
    over every modelled case."""
    groups = defaultdict(list)
    for r in rows:
        if "ratio" in r:
            groups[_group(r)].append(r["ratio"])
            groups[f"predicted limiter: {r['predicted']['limiter']}"].append(r["ratio"])
            groups["all modelled"].append(r["ratio"])
            if r["op"] == FRACTIONAL:
                groups["fractional (all)"].append(r["ratio"])
    return {k: {"cases": len(v), "geomean": _geo(v), "spread": _spread(v), "min": min(v), "max": max(v)}
            for k, v in groups.items()}


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = [
        "# Static model vs the H100 Nsight Compute run", "",
        f"Generated by `python benchmarks/static_calibration.py` at commit {m['commit']}; do not edit by hand.", "",
        "- **Measured** columns: Nsight Compute kernel time (`gpu__time_duration.sum`, all the case's kernels) on "
        f"the H100 of `{m['measured']}` (README there); % of HBM = compulsory bytes / kernel time / 3.35 TB/s.",
        f"- **Predicted** columns are **{LABEL}**: the static report's roofline ({m['device']}: 1.755 GHz, 132 SMs, "
        "issue efficiency 1.0, 3.35 TB/s, 6.5 TB/s L2 assumed, 600 ns DRAM latency assumed) for the kernel *as "
        f"measured*: the depthwise tiled kernel compiled from `git show {m['depthwise_revision']}` (no paired "
        "multipliers then: multiplier 2 staged one slice per pass with scalar loads) with that revision's launch "
        "rules; the staged fractional average pooling kernel compiled from `git show "
        f"{m.get('fractional_revision', m['depthwise_revision'])}` (today's source differs: "
        f"{'no' if not m['fractional_source_changed_since'] else 'yes, ' + m['fractional_source_changed_since']}) and "
        "planned by that revision's own launcher (`git show`, its plan() and tables), every warp of every tile "
        "charged its busiest lane's path (static report's assumptions).",
        "- ratio = measured time / predicted time (1 = the model explains the time; > 1 = slower than predicted).",
        "",
        "## Summary (ratio measured / predicted)", "",
        "| group | cases | geomean | spread (geometric SD) | min | max |", "|---|---:|---:|---:|---:|---:|"]
    order = lambda kv: (kv[0] != "all modelled", not kv[0].startswith("predicted limiter"), kv[0])  # noqa: E731
    for k, s in sorted(report["summary"].items(), key=order):
        lines.append(f"| {k} | {s['cases']} | {s['geomean']:.2f} | {s['spread']:.2f} | {s['min']:.2f} | "
                     f"{s['max']:.2f} |")
    lines += ["", "## Per case", "",
              "| suite | case | dtype | measured µs | measured % HBM | predicted µs | predicted limiter | predicted "
              "DRAM / L2 / issue / latency µs | predicted SASS/elem | ratio |",
              "|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    for r in report["rows"]:
        p = r["predicted"]
        head = f"| {r['suite']} | {r['label']} | {r['dtype']} | {r['measured_us']:.1f} | {r['measured_pct_hbm']:.1f} |"
        if "not_modelled" in p:
            lines.append(f"{head} - | {p['not_modelled'].split(':')[0]} | - | - | - |")
            continue
        lim = p["limits_ms"]
        limits = " / ".join(f"{lim[k] * 1e3:.1f}" for k in ("DRAM", "L2", "issue", "occupancy"))
        flag = "" if p["kernel_matches_measured"] else " (kernel differs!)"
        lines.append(f"{head} {p['predicted_ms'] * 1e3:.1f} | {p['limiter']}{flag} | {limits} | "
                     f"{p['sass_per_element']:.1f} | {r['ratio']:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=None, help="folder for static_calibration.{md,json} "
                        "(default: --results)")
    parser.add_argument("--render", action="store_true", help="only recompute the summary and the markdown "
                        "from the folder's static_calibration.json (no compile)")
    args = parser.parse_args(argv)
    out = args.out or args.results
    if args.render:
        report = json.loads((out / "static_calibration.json").read_text())
        report["summary"] = summarise(report["rows"])
    else:
        report = build(args.results.resolve())
    out.mkdir(parents=True, exist_ok=True)
    (out / "static_calibration.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "static_calibration.md").write_text(markdown(report))
    print(f"wrote {out / 'static_calibration.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
