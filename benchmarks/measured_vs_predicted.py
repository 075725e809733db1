"""Nsight Compute kernel times of a GPU run (measured) beside the static report (predicted, not measured).

Reads every ``ncu_<name>.csv.gz`` with its ``ncu_<name>_index.json`` in a results folder (the
output of ``benchmarks/ncu_cases.py`` under ``ncu``, see ``scripts/device-session.sh``) and the
committed static report (``benchmarks/results/static_report.json``), and writes
``measured_vs_predicted.{md,json}`` into the folder:

* per case and engine: kernel time (the sum of the case's kernels), each kernel's time, and
  compulsory bytes / kernel time as a percentage of the measured GPU's HBM bandwidth;
* per gradops-cuda case: the static report's H100 SXM prediction re-targeted to the measured
  GPU's HBM bandwidth (only the DRAM limit scales; the issue, L2 and latency limits stay the
  H100 model's, which assumes the same 132 SMs and clock as an H200), and measured / predicted;
* per gradops-cuda case the issue fraction the kernels reached: the model's warp-instructions
  (its SASS path counts) / measured time, as a fraction of the model's issue rate (132 SMs x 4
  schedulers x 1.755 GHz, one instruction per scheduler per clock); beside the model's resident
  warps per SM;
* per gradops-cuda case the latency-aware estimate (``gradops.bench.latency_model``) of the same
  stages, DRAM re-targeted likewise, and measured / that estimate;
* per case the DRAM bytes Nsight Compute counted, read and written, over the compulsory bytes
  read and written: ncu flushes the caches before each profiled kernel (its default
  ``--cache-control all``), so the reads come from DRAM, while results that fit the L2 may still
  be there, unwritten, when the kernel ends;
* geometric means per suite, op, dtype and layout, and the issue fraction per kernel.

    python benchmarks/measured_vs_predicted.py benchmarks/results/gpu_h200_2026-11-28 \\
        --device "H200 SXM" --static 549728a:benchmarks/results/static_report.json

``--static`` takes a path or ``REV:path``: the static report of the measured commit (default:
the checkout's ``benchmarks/results/static_report.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ml_dtypes  # noqa: E402,F401 (registers bfloat16 with NumPy)
import numpy as np  # noqa: E402

from ncu_table import kernels_by_case  # noqa: E402

from gradops.bench import latency_model, metrics, suites  # noqa: E402
from gradops.bench.runner import geomean  # noqa: E402

MODEL_DEVICE = "H100 SXM"  # the static report's device whose limits are re-targeted


def _case(entry):
    return next(c for c in suites.suite(entry["suite"]) if c.label == entry["label"] and c.op == entry["op"])


def _short(name: str) -> str:
    """A kernel's name without ``void``, namespace and parameter list."""
    name = re.sub(r"\(.*", "", name.removeprefix("void "))
    return name.replace("gradops::", "")


def load_runs(folder: Path) -> list[dict]:
    """Every (case, engine) the folder's ncu runs measured: kernel time and kernels."""
    rows = []
    for csv_path in sorted(folder.glob("ncu_*.csv*")):
        stem = csv_path.name.split(".csv")[0]
        index = json.loads((folder / f"{stem}_index.json").read_text())
        by_case = kernels_by_case(str(csv_path))
        for entry in index:
            kernels = by_case.get(entry["i"], [])
            rows.append({**{k: entry[k] for k in ("suite", "label", "op", "dtype", "engine")}, "run": stem,
                         "us": sum(k["ns"] for k in kernels) / 1e3,
                         "dram_read": sum(k["read"] for k in kernels), "dram_write": sum(k["write"] for k in kernels),
                         "kernels": [(_short(k["name"]), k["ns"] / 1e3) for k in kernels]})
    return rows


def predicted_us(prediction: dict, bandwidth: float) -> tuple[float, str] | None:
    """(predicted µs at ``bandwidth``, limiter) from a static-report row of the H100 model."""
    limits = prediction.get("limits_ms")
    if not limits:
        return None
    model_bandwidth = metrics.KNOWN_PEAKS[MODEL_DEVICE].bandwidth
    scaled = dict(limits, DRAM=limits["DRAM"] * model_bandwidth / bandwidth)
    limiter = max(scaled, key=scaled.get)
    return scaled[limiter] * 1e3, limiter


def read_static(source: str) -> tuple[dict, str]:
    """A static report JSON from a path, or from ``REV:path`` (``git show``: the report of the
    measured commit), and how to name it."""
    path = Path(source)
    if not path.is_file() and ":" in source:
        return json.loads(subprocess.check_output(["git", "show", source], cwd=ROOT, text=True)), source
    path = path.resolve()
    return json.loads(path.read_text()), str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def build(folder: Path, device: str, static_source: str) -> dict:
    bandwidth = metrics.KNOWN_PEAKS[device].bandwidth
    static, shown = read_static(static_source)
    model = next(d for d in static["meta"]["devices"] if d["key"] == MODEL_DEVICE)
    issue_rate = model["sms"] * 4 * model["clock_hz"] * model["issue_efficiency"]  # warp-instructions/s
    predictions = {(p["suite"], p["label"], p["op"], p["dtype"]): p for p in static["predictions"]
                   if p["device"] == MODEL_DEVICE}
    measured = load_runs(folder)
    times = {(r["suite"], r["label"], r["op"], r["dtype"], r["engine"]): r["us"] for r in measured if r["us"]}
    rows = []
    for r in measured:
        if not r["us"]:
            r["note"] = "no kernel recorded"
            rows.append(r)
            continue
        case = _case(r)
        itemsize = np.dtype(r["dtype"]).itemsize
        need = metrics.bytes_moved(case, case.geometry(), itemsize)
        written = metrics.result_bytes(case, case.geometry(), itemsize)
        r["layout"] = case.data_format
        r["compulsory_bytes"] = need
        r["compulsory_written_bytes"] = written
        r["dram_read_over_compulsory"] = r["dram_read"] / (need - written)
        r["dram_write_over_compulsory"] = r["dram_write"] / written
        r["pct_hbm"] = 100 * need / (r["us"] * 1e-6) / bandwidth
        if r["engine"] == "gradops-cuda":
            p = predictions.get((r["suite"], r["label"], r["op"], r["dtype"]))
            got = predicted_us(p, bandwidth) if p else None
            if got:
                r["predicted_us"], r["predicted_limiter"] = got
                r["measured_over_predicted"] = r["us"] / got[0]
            if p and "limits_ms" in p:
                r["latency_aware_us"] = 1e6 * sum(
                    latency_model.estimate(latency_model.stage_features(stage, model, bandwidth))[0]
                    for stage in (p.get("stages") or [p]))
                r["measured_over_latency_aware"] = r["us"] / r["latency_aware_us"]
            if p and p.get("warp_instructions"):
                r["kernel_family"] = kernel_family(p["kernel"])
                r["resident_warps_per_sm"] = p.get("resident_warps_per_sm")
                r["issue_fraction"] = p["warp_instructions"] / (r["us"] * 1e-6) / issue_rate
            for other in ("torch", "gradops-cudnn"):
                t = times.get((r["suite"], r["label"], r["op"], r["dtype"], other))
                if t:
                    r[f"{other}_over_gradops"] = t / r["us"]
        rows.append(r)
    return {"meta": {"device": device, "model_issue_rate": issue_rate, "bandwidth": bandwidth, "static_report": shown,
                     "static_commit": static["meta"].get("commit"), "model_device": MODEL_DEVICE},
            "rows": rows, "summary": summarise(rows), "issue": issue_summary(rows)}


def kernel_family(kernel: str) -> str:
    """The static report's kernel name (``a<...> + b<...>`` for two kernels) without namespaces
    and template arguments, the op's common prefix shortened: ``filter_tiled``."""
    names = [part.split("<", 1)[0].split("::")[-1] for part in kernel.split(" + ")]
    return " + ".join(n.replace("depthwise_conv2d_native_backprop_", "") for n in names)


def summarise(rows) -> list[dict]:
    """Per (suite, op, dtype, layout): geometric means, and gradops-cuda's DRAM bytes over the
    compulsory ones, read and written, of all the group's cases together (a ratio of sums: a
    result the L2 kept counts 0 bytes written)."""
    groups: dict = defaultdict(lambda: defaultdict(list))
    traffic: dict = defaultdict(lambda: np.zeros(4))
    for r in rows:
        if "pct_hbm" not in r:
            continue
        key = (r["suite"], r["op"], r["dtype"], r["layout"])
        groups[key][f"pct {r['engine']}"].append(r["pct_hbm"])
        for field in ("measured_over_predicted", "measured_over_latency_aware", "torch_over_gradops",
                      "gradops-cudnn_over_gradops"):
            if field in r:
                groups[key][field].append(r[field])
        if r["engine"] == "gradops-cuda":
            traffic[key] += np.array([r["dram_read"], r["compulsory_bytes"] - r["compulsory_written_bytes"],
                                      r["dram_write"], r["compulsory_written_bytes"]], dtype=float)
    out = []
    for key in sorted(groups):
        g = groups[key]
        out.append({"suite": key[0], "op": key[1], "dtype": key[2], "layout": key[3],
                    "cases": len(g.get("pct gradops-cuda", [])),
                    **{field: geomean(values) for field, values in g.items()},
                    "dram_read_over_compulsory": traffic[key][0] / traffic[key][1] if key in traffic else None,
                    "dram_write_over_compulsory": traffic[key][2] / traffic[key][3] if key in traffic else None,
                    "measured_over_predicted_range": ((min(g["measured_over_predicted"]),
                                                       max(g["measured_over_predicted"]))
                                                      if g.get("measured_over_predicted") else None)})
    return out


def issue_summary(rows) -> list[dict]:
    """Per kernel family and dtype: the issue fraction reached (geometric mean, range) and the
    model's resident warps per SM."""
    groups: dict = defaultdict(list)
    for r in rows:
        if "issue_fraction" in r:
            groups[(r["kernel_family"], r["dtype"])].append(r)
    out = []
    for (family, dtype), members in sorted(groups.items()):
        fractions = [r["issue_fraction"] for r in members]
        out.append({"kernel": family, "dtype": dtype, "cases": len(members), "issue_fraction": geomean(fractions),
                    "min": min(fractions), "max": max(fractions),
                    "resident_warps_per_sm": sorted({r["resident_warps_per_sm"] for r in members
                                                     if r["resident_warps_per_sm"]})})
    return out


def _f(v, fmt=".1f"):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def markdown(report: dict) -> str:
    m = report["meta"]
    lines = [
        f"# Kernel times on the {m['device']} (measured) beside the static model (predicted, not measured)", "",
        "Generated by `python benchmarks/measured_vs_predicted.py`; do not edit by hand.", "",
        f"- **Measured**: Nsight Compute `gpu__time_duration.sum` of every kernel of a case (one call, "
        "after a warm-up call), `--clock-control none`; % of HBM = compulsory bytes (each tensor once) / "
        f"kernel time / {m['bandwidth'] / 1e12:.2f} TB/s.",
        f"- **Predicted** (predicted, not measured): `{m['static_report']}` (commit {m['static_commit']}), its "
        f"{m['model_device']} limits with the DRAM limit re-targeted to {m['bandwidth'] / 1e12:.2f} TB/s "
        "(issue, L2 and latency limits unchanged: same 132 SMs; the model's clock is 1.755 GHz).",
        "- **Latency-aware** (predicted, not measured): `gradops/bench/latency_model.py` on the same stages and "
        "limits (DRAM re-targeted likewise). Its constants were fitted to the H200 run of 2026-11-28: on that "
        "run's kernels it is in sample (`latency_fit.md` there).",
        "- measured / predicted > 1: slower than the model says.",
        "- **DRAM read / write**: the DRAM bytes Nsight Compute counted (`dram__bytes_read.sum`, "
        "`dram__bytes_write.sum`, all of a case's kernels) over the compulsory bytes read (the inputs once) and "
        "written (the result once), gradops-cuda, summed over the group's cases. ncu flushes the caches "
        "before each profiled kernel (its default `--cache-control all`), so the inputs are read from DRAM, "
        "not from the warm-up call's L2; "
        "results that fit the L2 may still sit there, not yet written back, when the kernel ends, so "
        "`dram__bytes_write` counts less than the result on small layers (their % of HBM includes writes "
        "the L2 absorbed).", "",
        "## Geometric means", "",
        "| suite | op | dtype | layout | cases | gradops-cuda % of HBM | torch % of HBM | torch time / gradops "
        "time | measured / predicted (range) | measured / latency-aware | DRAM read / compulsory | DRAM write / "
        "compulsory |", "|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for s in report["summary"]:
        rng = s["measured_over_predicted_range"]
        spread = f" ({rng[0]:.2f}-{rng[1]:.2f})" if rng else ""
        lines.append(f"| {s['suite']} | {s['op']} | {s['dtype']} | {s['layout']} | {s['cases']} | "
                     f"{_f(s.get('pct gradops-cuda'))} | {_f(s.get('pct torch'))} | "
                     f"{_f(s.get('torch_over_gradops'), '.2f')} | {_f(s.get('measured_over_predicted'), '.2f')}"
                     f"{spread} | {_f(s.get('measured_over_latency_aware'), '.2f')} | "
                     f"{_f(s.get('dram_read_over_compulsory'), '.2f')} | "
                     f"{_f(s.get('dram_write_over_compulsory'), '.2f')} |")
    lines += ["", "## Issue fraction reached", "",
              f"The model's warp-instructions per case (its SASS path counts) / measured time, as a fraction of "
              f"its issue rate ({m['model_issue_rate'] / 1e9:.1f} G warp-instructions/s: 1.0 is its assumption). "
              "Resident warps per SM: the model's occupancy at the launcher's block (first kernel).", "",
              "| kernel | dtype | cases | issue fraction (geomean) | range | resident warps per SM |",
              "|---|---|---:|---:|---|---|"]
    for g in report["issue"]:
        lines.append(f"| {g['kernel']} | {g['dtype']} | {g['cases']} | {g['issue_fraction']:.2f} | "
                     f"{g['min']:.2f}-{g['max']:.2f} | {', '.join(str(w) for w in g['resident_warps_per_sm'])} |")
    lines += ["", "## gradops-cuda per case", "",
              "| suite | case | op | dtype | kernels (µs each) | measured µs | % of HBM | predicted µs (limiter) | "
              "measured / predicted | latency-aware µs | measured / latency-aware | torch µs |",
              "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    torch = {(r["suite"], r["label"], r["op"], r["dtype"]): r["us"] for r in report["rows"]
             if r["engine"] == "torch" and r["us"]}
    for r in report["rows"]:
        if r["engine"] != "gradops-cuda":
            continue
        if "pct_hbm" not in r:
            lines.append(f"| {r['suite']} | {r['label']} | {r['op']} | {r['dtype']} | {r.get('note')} | - | - | - | - "
                         "| - | - | - |")
            continue
        kernels = "; ".join(f"{n[:70]} {t:.1f}" for n, t in r["kernels"])
        pred = f"{r['predicted_us']:.1f} ({r['predicted_limiter']})" if "predicted_us" in r else "not modelled"
        t = torch.get((r["suite"], r["label"], r["op"], r["dtype"]))
        lines.append(f"| {r['suite']} | {r['label']} | {r['op'].replace('depthwise_conv2d_native_', '')} | "
                     f"{r['dtype']} | {kernels} | {r['us']:.1f} | {r['pct_hbm']:.1f} | {pred} | "
                     f"{_f(r.get('measured_over_predicted'), '.2f')} | {_f(r.get('latency_aware_us'))} | "
                     f"{_f(r.get('measured_over_latency_aware'), '.2f')} | {_f(t)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--device", default="H200 SXM", choices=sorted(metrics.KNOWN_PEAKS))
    parser.add_argument("--static", default=str(ROOT / "benchmarks" / "results" / "static_report.json"),
                        help="the static report: a path, or REV:path (git show)")
    args = parser.parse_args(argv)
    report = build(args.folder.resolve(), args.device, args.static)
    (args.folder / "measured_vs_predicted.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.folder / "measured_vs_predicted.md").write_text(markdown(report))
    print(f"wrote {args.folder / 'measured_vs_predicted.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
