"""Fit the static report's latency-aware estimate (gradops.bench.latency_model) to a GPU run.

Every gradops-cuda kernel an Nsight Compute run timed (``ncu_*.csv.gz`` of a results folder, as
``measured_vs_predicted.py`` reads them) is paired with its stage in the static report of the
measured commit (H100 SXM rows, DRAM limit re-targeted to the measured GPU's HBM).  Those
pairs (the samples) and the fit go to ``latency_fit.{json,md}`` in the folder:

* the grid point (gradops.bench.latency_model.GRID) with the least mean squared log error;
* its error per kernel family, in sample and with that family left out of the fit;
* the bound's (the report's own prediction) error beside it;
* out of sample: the estimate with those constants on the first GPU run (H100 SXM, 2026-11-22:
  other kernels, at the revision ``static_calibration.py`` compiled for it), from that run's
  ``static_calibration.json`` (see :func:`other_run_samples` for what it lacks).

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
OTHER_RUN = ROOT / "benchmarks" / "results" / "gpu_h100_2026-11-22" / "static_calibration.json"
#: The commit holding the static report of the kernels the H200 run measured (regenerated at
#: f5cb4c9, which changed no kernel of cb65573's but the tensor-core filter's hang fix).
REPORT_COMMIT = "549728a"
MODEL_DEVICE = "H100 SXM"
MEASURED_DEVICE = "H200 SXM"


def samples(folder: Path, report: dict, device: str = MEASURED_DEVICE) -> list[dict]:
    """One sample per measured gradops-cuda kernel whose case the report models, its stages
    matching the measured kernels one for one, by name and order."""
    from measured_vs_predicted import kernel_family, load_runs, predicted_us

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
        if [kernel_family(s["kernel"]) for s in stages] != [kernel_family(name) for name, _ in r["kernels"]]:
            continue
        for stage, (name, us) in zip(stages, r["kernels"]):
            out.append({"suite": r["suite"], "label": r["label"], "op": r["op"], "dtype": r["dtype"],
                        "kernel": name, "family": kernel_family(name),
                        "measured_s": us * 1e-6, "bound_s": predicted_us(stage, bandwidth)[0] * 1e-6,
                        **lm.stage_features(stage, model, bandwidth), "waves": stage_waves(stage, model)})
    return out


def stage_waves(stage: dict, device: dict) -> float | None:
    """The stage's CTAs / (SMs x its resident CTAs an SM), where the report records its CTAs and
    either its CTAs an SM or its threads a CTA (with the resident warps); else None."""
    plan = stage.get("tiled") or {}
    ctas, per_sm = plan.get("ctas"), plan.get("blocks_per_sm")
    if per_sm is None and plan.get("threads_per_cta"):
        per_sm = stage["resident_warps_per_sm"] * 32 / plan["threads_per_cta"]
    if not ctas or not per_sm:
        return None
    return ctas / (device["sms"] * per_sm)


#: Bins of :func:`stage_waves` for the errors by waves (lower edges; the last is open).
WAVE_BINS = (0.0, 1.0, 1.5, 2.5, 5.0)
#: "Few" waves in the summary: the bins up to this.
FEW_WAVES = 1.5


def _layout(sample: dict) -> str:
    return "NCHW" if "NCHW" in sample["label"] else "NHWC"


def by_waves(data: list[dict], errors: np.ndarray) -> list[dict]:
    """The estimate's errors per layout and :data:`WAVE_BINS` bin of the samples' waves, then
    those whose waves the report does not give (``low`` None)."""
    out = []
    for layout in ("NHWC", "NCHW"):
        waves = [s.get("waves") if _layout(s) == layout else -1.0 for s in data]
        for i, low in enumerate(WAVE_BINS):
            high = WAVE_BINS[i + 1] if i + 1 < len(WAVE_BINS) else math.inf
            idx = [j for j, w in enumerate(waves) if w is not None and low <= w < high]
            if idx:
                out.append({"layout": layout, "low": low, "high": high, **_summary(errors[idx])})
    unknown = [j for j, s in enumerate(data) if s.get("waves") is None]
    if unknown:
        out.append({"layout": None, "low": None, "high": None, **_summary(errors[unknown])})
    return out


def other_run_samples(path: Path = OTHER_RUN) -> list[dict]:
    """Samples of the H100 run from its ``static_calibration.json`` (the static model of the
    measured revision beside each measured kernel time; H100 SXM, single-kernel ops).  That
    file predates the stage records: warp-instructions are its SASS per element x the case's
    input elements / 32, the scheduler limit theirs / the model's issue rate, resident warps
    its tiled plan's CTAs per SM x threads per CTA / 32, and the busiest pipe is not recorded
    (taken as 0: the scheduler term / 0.5 covers the pipes of these kernels)."""
    from gradops.bench import static_report as sr
    from gradops.bench.suites import suite

    data = json.loads(path.read_text())
    device = next(d for d in sr.DEVICES if d.key == data["meta"]["device"])
    cases = {(c.suite, c.label, c.op): c for name in sr.SUITES for c in suite(name)}
    out = []
    for r in data["rows"]:
        p = r["predicted"]
        tiled, limits = p["tiled"], p["limits_ms"]
        elements = math.prod(cases[(r["suite"], r["label"], r["op"])].geometry().input_shape)
        warp_instructions = p["sass_per_element"] * elements / 32
        out.append({"suite": r["suite"], "label": r["label"], "op": r["op"], "dtype": r["dtype"],
                    "kernel": p["kernel"], "measured_s": r["measured_us"] * 1e-6, "bound_s": p["predicted_ms"] / 1e3,
                    "dram_s": limits["DRAM"] / 1e3, "l2_s": limits["L2"] / 1e3, "pipe_s": 0.0,
                    "scheduler_s": warp_instructions / device.issue_rate, "chain_s": limits["occupancy"] / 1e3,
                    "warp_instructions": warp_instructions,
                    "resident_warps_per_sm": tiled["blocks_per_sm"] * tiled["threads_per_cta"] // 32,
                    "sms": device.sms, "clock_hz": device.clock_hz})
    return out


def out_of_sample(other: list[dict], fitted: lm.LatencyFit) -> dict:
    """The estimate's and the bound's errors on another run's samples, overall and per op,
    dtype and layout."""
    errors = lm.log_errors(other, fitted)
    bound = np.array([math.log(s["measured_s"] / s["bound_s"]) for s in other])
    groups = defaultdict(list)
    for i, s in enumerate(other):
        groups[f"{s['op']} {s['dtype']} {_layout(s)}"].append(i)
    return {"estimate": _summary(errors), "bound": _summary(bound),
            "groups": {g: {"estimate": _summary(errors[idx]), "bound": _summary(bound[idx])}
                       for g, idx in sorted(groups.items())}}


def _summary(errors: np.ndarray) -> dict:
    return {"n": int(errors.size), "geomean_ratio": float(np.exp(errors.mean())),
            "rms_log": float(np.sqrt((errors ** 2).mean())), "min_ratio": float(np.exp(errors.min())),
            "max_ratio": float(np.exp(errors.max())),
            "within_1_5x": float((np.abs(errors) < math.log(1.5)).mean())}


def analyse(data: list[dict], other: list[dict] | None = None) -> dict:
    """The fit, its errors per family (in sample, left out) and the bound's; with ``other``
    (another run's samples), the fitted estimate's errors there."""
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
    exponents = []
    for exponent in lm.OCCUPANCY_EXPONENTS:  # how much resident warps shorten a warp's path
        at, at_rms = lm.fit(data, occupancy_exponent=exponent)
        exponents.append({"fit": at.__dict__, "rms_log": at_rms})
    result = {"fit": fitted.__dict__, "rms_log": rms, "in_sample": _summary(errors), "bound": _summary(bound),
              "left_out": _summary(every_left_out), "families": per_family, "occupancy_exponents": exponents,
              # the constants the static report uses (latency_model.FIT), on these samples: out of
              # sample unless this is the run they were fitted to
              "committed": {"fit": lm.FIT.__dict__, **_summary(lm.log_errors(data, lm.FIT))},
              "by_waves": by_waves(data, errors)}
    if other:
        result["other_run"] = out_of_sample(other, fitted)
    return result


def markdown(result: dict) -> str:
    f = result["fit"]
    c = result.get("committed")
    lines = [f"# The latency-aware estimate fitted to the {result['device']} run of this folder (fit of predictions "
             "to measurements)", "",
             "Generated by `python benchmarks/latency_fit.py`; do not edit by hand.", "",
             f"- **Measured**: Nsight Compute kernel times in this folder ({result['samples']} kernels of "
             f"gradops-cuda, `ncu_*.csv.gz`).",
             f"- **Model**: `gradops/bench/latency_model.py` on the stages of the static report at "
             f"{result['report_commit']} (the measured kernels), H100 SXM limits with DRAM re-targeted to "
             f"{result['device']}.",
             f"- **Fit**: fixed {f['fixed_s'] * 1e6:.1f} us a kernel (held), cpi {f['cpi']}, latency factor "
             f"{f['latency_factor']}, issue efficiency {f['issue_efficiency']}; rms of log(measured / "
             f"estimate) {result['rms_log']:.3f}.",
             *([f"- **The committed constants** (`latency_model.FIT`: cpi {c['fit']['cpi']}, latency factor "
                f"{c['fit']['latency_factor']}, issue efficiency {c['fit']['issue_efficiency']}: the static report's) "
                f"on these kernels: rms of log(measured / estimate) {c['rms_log']:.3f}, geometric "
                f"mean ratio {c['geomean_ratio']:.2f} ({c['min_ratio']:.2f}-{c['max_ratio']:.2f}), "
                f"{c['within_1_5x']:.0%} within 1.5x."] if c else []),
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
    lines += ["", "## How much do resident warps shorten a warp's path?", "",
              f"The warp-path term divides by {lm.REFERENCE_WARPS} x (resident warps / {lm.REFERENCE_WARPS}) ** "
              "exponent (1: by the resident warps, as in the fit above). Refitted at each exponent:", "",
              "| exponent | cpi | latency factor | issue efficiency | rms of log(measured / estimate) |",
              "|---:|---:|---:|---:|---:|"]
    for e in result["occupancy_exponents"]:
        f_ = e["fit"]
        lines.append(f"| {f_['occupancy_exponent']:g} | {f_['cpi']:g} | {f_['latency_factor']:g} | "
                     f"{f_['issue_efficiency']:g} | {e['rms_log']:.3f} |")
    lines += ["", "Exponents from 0.5 to 1 fit about equally: these samples cannot say how much more resident "
                  "warps are worth, only that they are worth something (exponent 0 fits worst)."]
    lines += ["", "## Launches of few waves", "",
              "The in-sample error by layout and by the launch's waves (its CTAs / (SMs x resident CTAs an SM), "
              "from the report's plan where it records one; the warp-path term spreads a launch's work evenly "
              "over the SMs' resident warps, as if waves were continuous):", "",
              "| layout | waves | n | estimate: geomean ratio (range) | within 1.5x |", "|---|---|---:|---|---:|"]
    for b in result["by_waves"]:
        name = ("not recorded" if b["low"] is None else
                f"{b['low']:g} or more" if math.isinf(b["high"]) else f"{b['low']:g} to {b['high']:g}")
        lines.append(f"| {b['layout'] or 'both'} | {name} | {b['n']} | {b['geomean_ratio']:.2f} "
                     f"({b['min_ratio']:.2f}-{b['max_ratio']:.2f}) | {b['within_1_5x']:.0%} |")
    def span(layout, few):
        ratios = [x["geomean_ratio"] for x in result["by_waves"] if x["layout"] == layout
                  and (x["high"] <= FEW_WAVES if few else x["low"] >= FEW_WAVES)]
        return f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "none"
    lines += ["", f"In NHWC, the launches under {FEW_WAVES:g} waves came out {span('NHWC', True)} their estimate "
                  f"(bins' geometric means), those of more waves {span('NHWC', False)}; in NCHW {span('NCHW', True)} "
                  f"and {span('NCHW', False)}. On the H200 run of 2026-11-28 the NCHW launches of few waves were "
                  "also the smallest planes (7 x 7 and 14 x 14: rows of 7 and 14 elements), so that run cannot tell "
                  "the waves from the short rows there; its NHWC kernels say that a choice that gains by fewer, "
                  "larger CTAs should expect to lose about a tenth more than the estimate says."]
    other = result.get("other_run")
    if other:
        lines += ["", "## Out of sample: the H100 run of 2026-11-22", "",
                  f"The constants above on {other['estimate']['n']} kernels the fit never saw: the first GPU run's "
                  "(H100 SXM, Nsight Compute), the depthwise input gradient and fractional average pooling at the "
                  "revision `static_calibration.py` compiled for it (`../gpu_h100_2026-11-22/static_calibration.json`; "
                  "its busiest pipe is not recorded and is taken as 0).", "",
                  "| group | n | bound: geomean ratio (range) | within 1.5x | estimate: geomean ratio (range) | "
                  "within 1.5x |", "|---|---:|---|---:|---|---:|"]

        def other_row(name, v):
            b, e = v["bound"], v["estimate"]
            return (f"| {name} | {e['n']} | {b['geomean_ratio']:.2f} ({b['min_ratio']:.2f}-{b['max_ratio']:.2f}) | "
                    f"{b['within_1_5x']:.0%} | {e['geomean_ratio']:.2f} ({e['min_ratio']:.2f}-{e['max_ratio']:.2f}) | "
                    f"{e['within_1_5x']:.0%} |")
        for name, v in other["groups"].items():
            lines.append(other_row(f"`{name}`", v))
        lines.append(other_row("**all**", other))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder", nargs="?", default=str(RESULTS))
    ap.add_argument("--report-commit", help=f"default: the folder's latency_fit.json's, else {REPORT_COMMIT}")
    ap.add_argument("--device", help=f"default: the folder's latency_fit.json's, else {MEASURED_DEVICE}")
    ap.add_argument("--samples-only", action="store_true", help="refit from the folder's latency_fit.json")
    args = ap.parse_args(argv)
    folder = Path(args.folder)
    out = folder / "latency_fit.json"
    before = json.loads(out.read_text()) if out.is_file() else {}
    args.report_commit = args.report_commit or before.get("report_commit", REPORT_COMMIT)
    args.device = args.device or before.get("device", MEASURED_DEVICE)
    if args.samples_only:
        data = before["samples"]
    else:
        text = subprocess.check_output(["git", "show", f"{args.report_commit}:benchmarks/results/static_report.json"],
                                       cwd=ROOT, text=True)
        data = samples(folder, json.loads(text), args.device)
    other = other_run_samples() if OTHER_RUN.is_file() else None
    result = {"label": "fit of predictions to measurements", "report_commit": args.report_commit,
              "device": args.device, "samples": len(data), **analyse(data, other)}
    out.write_text(json.dumps({**result, "samples": data}, indent=1) + "\n")
    (folder / "latency_fit.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
