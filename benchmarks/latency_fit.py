"""Fit the static report's latency-aware estimate (gradops.bench.latency_model) to a GPU run.

Every gradops-cuda kernel an Nsight Compute run timed (``ncu_*.csv.gz`` of a results folder, as
``measured_vs_predicted.py`` reads them) is paired with its stage in the static report of the
measured commit (H100 SXM rows, DRAM limit re-targeted to the measured GPU's HBM).  Those
pairs (the samples) and the fit go to ``latency_fit.{json,md}`` in the folder:

* the grid point (gradops.bench.latency_model.GRID) with the least mean squared log error;
* its error per kernel family, in sample and with that family left out of the fit;
* the bound's (the report's own prediction) error beside it.

    python benchmarks/latency_fit.py [FOLDER] [--report-commit 549728a] [--samples-only]

``--samples-only`` refits from the folder's committed ``latency_fit.json`` (no git, no ncu CSV).
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

import numpy as np  # noqa: E402

from gradops.bench import latency_model as lm  # noqa: E402
from gradops.bench import metrics  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "gpu_h200_2026-11-28"
#: The commit holding the static report of the kernels the H200 run measured (regenerated at
#: f5cb4c9, which changed no kernel of cb65573's but the tensor-core filter's hang fix).
REPORT_COMMIT = "549728a"
MODEL_DEVICE = "H100 SXM"
MEASURED_DEVICE = "H200 SXM"


def _base(name: str) -> str:
    return name.split("<", 1)[0].split("::")[-1]


def _bound(stage: dict, dram_scale: float) -> float:
    """The report's prediction of a stage (seconds) with its DRAM limit scaled by ``dram_scale``."""
    limits = dict(stage["limits_ms"], DRAM=stage["limits_ms"]["DRAM"] * dram_scale)
    return max(limits.values()) / 1e3


def samples(folder: Path, report: dict, device: str = MEASURED_DEVICE) -> list[dict]:
    """One sample per measured gradops-cuda kernel whose case the report models, its stages
    matching the measured kernels one for one, by name and order."""
    from measured_vs_predicted import load_runs

    model = next(d for d in report["meta"]["devices"] if d["key"] == MODEL_DEVICE)
    bandwidth = metrics.KNOWN_PEAKS[device].bandwidth
    predictions = {(p["suite"], p["label"], p["op"], p["dtype"]): p for p in report["predictions"]
                   if p["device"] == MODEL_DEVICE and "not_modelled" not in p}
    out = []
    for r in load_runs(folder):
        p = predictions.get((r["suite"], r["label"], r["op"], r["dtype"]))
        if r["engine"] != "gradops-cuda" or not p or not r["kernels"]:
            continue
        stages = p.get("stages") or [p]
        if [_base(s["kernel"]) for s in stages] != [_base(name) for name, _ in r["kernels"]]:
            continue
        for stage, (name, us) in zip(stages, r["kernels"]):
            out.append({"suite": r["suite"], "label": r["label"], "op": r["op"], "dtype": r["dtype"],
                        "kernel": name, "family": _base(name).replace("depthwise_conv2d_native_backprop_", ""),
                        "measured_s": us * 1e-6, "bound_s": _bound(stage, model["bandwidth"] / bandwidth),
                        **lm.stage_features(stage, model, bandwidth)})
    return out


def _summary(errors: np.ndarray) -> dict:
    return {"n": int(errors.size), "geomean_ratio": float(np.exp(errors.mean())),
            "rms_log": float(np.sqrt((errors ** 2).mean())), "min_ratio": float(np.exp(errors.min())),
            "max_ratio": float(np.exp(errors.max())),
            "within_1_5x": float((np.abs(errors) < math.log(1.5)).mean())}


def analyse(data: list[dict]) -> dict:
    """The fit, its errors per family (in sample, left out) and the bound's."""
    fitted, rms = lm.fit(data)
    errors = lm.log_errors(data, fitted)
    bound = np.array([math.log(s["measured_s"] / s["bound_s"]) for s in data])
    families = defaultdict(list)
    for i, s in enumerate(data):
        families[s["family"]].append(i)
    per_family = {}
    for family, idx in sorted(families.items()):
        rest = [s for i, s in enumerate(data) if s["family"] != family]
        held, _ = lm.fit(rest)
        left_out = lm.log_errors([data[i] for i in idx], held)
        per_family[family] = {"in_sample": _summary(errors[idx]), "bound": _summary(bound[idx]),
                              "left_out": _summary(left_out), "left_out_fit": held.__dict__}
    every_left_out = np.concatenate([
        lm.log_errors([data[i] for i in idx], lm.LatencyFit(**per_family[f]["left_out_fit"]))
        for f, idx in sorted(families.items())])
    return {"fit": fitted.__dict__, "rms_log": rms, "in_sample": _summary(errors), "bound": _summary(bound),
            "left_out": _summary(every_left_out), "families": per_family}


def markdown(result: dict) -> str:
    f = result["fit"]
    lines = ["# The latency-aware estimate fitted to the H200 run (fit of predictions to measurements)", "",
             "Generated by `python benchmarks/latency_fit.py`; do not edit by hand.", "",
             f"- **Measured**: Nsight Compute kernel times in this folder ({result['samples']} kernels of "
             f"gradops-cuda, `ncu_*.csv.gz`).",
             f"- **Model**: `gradops/bench/latency_model.py` on the stages of the static report at "
             f"{result['report_commit']} (the measured kernels), H100 SXM limits with DRAM re-targeted to "
             f"{result['device']}.",
             f"- **Fit**: fixed {f['fixed_s'] * 1e6:.1f} us a kernel (held), cpi {f['cpi']}, latency factor "
             f"{f['latency_factor']}, issue efficiency {f['issue_efficiency']}; rms of log(measured / "
             f"estimate) {result['rms_log']:.3f}.",
             "- **Left out**: each family's error with the constants refitted without that family.",
             "- ratio = measured / estimate (> 1: the kernel was slower than estimated).", "",
             "| kernels | n | bound: geomean ratio (range) | estimate in sample: geomean (range) | within 1.5x | "
             "left out: geomean (range) | within 1.5x |", "|---|---:|---|---|---:|---|---:|"]

    def row(name, b, i, o):
        return (f"| {name} | {i['n']} | {b['geomean_ratio']:.2f} ({b['min_ratio']:.2f}-{b['max_ratio']:.2f}) | "
                f"{i['geomean_ratio']:.2f} ({i['min_ratio']:.2f}-{i['max_ratio']:.2f}) | {i['within_1_5x']:.0%} | "
                f"{o['geomean_ratio']:.2f} ({o['min_ratio']:.2f}-{o['max_ratio']:.2f}) | {o['within_1_5x']:.0%} |")
    for family, v in result["families"].items():
        lines.append(row(f"`{family}`", v["bound"], v["in_sample"], v["left_out"]))
    lines.append(row("**all**", result["bound"], result["in_sample"], result["left_out"]))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", nargs="?", default=str(RESULTS))
    ap.add_argument("--report-commit", default=REPORT_COMMIT)
    ap.add_argument("--device", default=MEASURED_DEVICE)
    ap.add_argument("--samples-only", action="store_true", help="refit from the folder's latency_fit.json")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    out = folder / "latency_fit.json"
    if args.samples_only:
        data = json.loads(out.read_text())["samples"]
    else:
        text = subprocess.check_output(["git", "show", f"{args.report_commit}:benchmarks/results/static_report.json"],
                                       cwd=ROOT, text=True)
        data = samples(folder, json.loads(text), args.device)
    result = {"label": "fit of predictions to measurements", "report_commit": args.report_commit,
              "device": args.device, "samples": len(data), **analyse(data)}
    out.write_text(json.dumps({**result, "samples": data}, indent=1) + "\n")
    (folder / "latency_fit.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
