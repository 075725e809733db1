"""Report: geometric means, JSON, markdown (and the PNG via :mod:`.plot`).

Speedups are ``baseline time / engine time`` (> 1: the engine is faster); their geometric
mean is taken over the rows where both engines were timed.  % of peak is of the device's
compute peak for the dtype (convolutions) or of its memory bandwidth (depthwise, pooling);
% of roofline is the shortest time the roofline allows divided by the measured time.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from .metrics import MEMORY_BOUND_OPS
from .runner import geomean

STATUSES = ("ok", "mismatch", "error", "n/a", "unavailable")


def _group_summary(rows: list[dict]) -> dict:
    pairs = sorted({p for r in rows for p in r.get("speedups", {})})
    engines = sorted({e for r in rows for e in r["engines"]})
    out = {"cases": len(rows), "speedups": {}, "engines": {}}
    for pair in pairs:
        values = [r["speedups"][pair] for r in rows if pair in r.get("speedups", {})]
        out["speedups"][pair] = {"geomean": geomean(values), "n": len(values)}
    for name in engines:
        timed = [r["engines"][name] for r in rows if r["engines"].get(name, {}).get("time_ms")]
        counts = defaultdict(int)
        for r in rows:
            counts[r["engines"].get(name, {}).get("status", "missing")] += 1
        out["engines"][name] = {
            "timed": len(timed), "status": dict(counts),
            "geomean_tflops": geomean(t.get("tflops") for t in timed),
            "geomean_gbps": geomean(t.get("gbps") for t in timed),
            "geomean_pct_peak": geomean(t.get("pct_peak") for t in timed),
            "geomean_pct_roofline": geomean(t.get("pct_roofline") for t in timed),
        }
    return out


def summarize(rows: list[dict]) -> dict:
    """Geometric means per (suite, op, dtype) and per suite."""
    by_group, by_suite = defaultdict(list), defaultdict(list)
    for r in rows:
        by_group[(r["suite"], r["op"], r["dtype"])].append(r)
        by_suite[r["suite"]].append(r)
    return {
        "groups": [dict(suite=s, op=o, dtype=d, **_group_summary(rs)) for (s, o, d), rs in by_group.items()],
        "suites": [dict(suite=s, **_group_summary(rs)) for s, rs in by_suite.items()],
    }


# --------------------------------------------------------------------------- markdown


def _fmt(value, spec=".2f", missing="-") -> str:
    return missing if value is None else format(value, spec)


def _engine_cell(entry: dict, memory_bound: bool) -> str:
    status = entry.get("status", "-")
    if status != "ok" or entry.get("time_ms") is None:
        return status
    rate = (f"{entry['gbps']:.3g} GB/s" if memory_bound or entry.get("tflops") is None
            else f"{entry['tflops']:.3g} TFLOP/s")
    pct = f", {entry['pct_roofline']:.3g}% roof" if entry.get("pct_roofline") is not None else ""
    return f"{entry['time_ms']:.3f} ms ({rate}{pct})"


def _engines(report: dict) -> list[str]:
    return list(report["meta"].get("timers") or sorted({e for r in report["rows"] for e in r["engines"]}))


def attach_predictions(report: dict, predictions: dict, source: str = "") -> int:
    """Put the static report's prediction beside each row it has one for (same device, op, case
    label and dtype): ``row["predicted"]``.  ``predictions``: from
    :func:`gradops.bench.static_report.load_predictions`.  Returns the number of rows matched."""
    peaks = report["meta"].get("peaks") or {}
    device = peaks.get("device")
    matched = 0
    for row in report["rows"]:
        p = predictions.get((device, row["op"], row["label"], row["dtype"]))
        if p and "predicted_ms" in p:  # a shape whose kernel the static report does not model has none
            row["predicted"] = {"ms": p["predicted_ms"], "limiter": p["limiter"], "pct_hbm": p["pct_hbm"],
                                "sass_per_element": p["sass_per_element"]}
            if "latency_aware" in p:
                row["predicted"]["latency_aware_ms"] = p["latency_aware"]["ms"]
            matched += 1
    if matched:
        meta = predictions.get("_meta", {})
        report["meta"]["predicted"] = {"label": meta.get("label", "predicted, not measured"),
                                       "commit": meta.get("commit"), "source": source, "rows": matched}
    return matched


def _predicted_cells(row: dict) -> list[str]:
    p = row.get("predicted")
    if not p:
        return ["-", "-"]
    measured = row["engines"].get("gradops-cuda", {}).get("time_ms")
    ratio = f"{measured / p['ms']:.2f}" if measured else "-"
    cell = f"{p['ms']:.3f} ms ({p['limiter']})"
    if "latency_aware_ms" in p:
        cell += f"; latency-aware {p['latency_aware_ms']:.3f} ms"
        ratio += f"; {measured / p['latency_aware_ms']:.2f}" if measured else ""
    return [cell, ratio]


def markdown(report: dict) -> str:
    meta, rows = report["meta"], report["rows"]
    engines = _engines(report)
    lines = [f"# gradops benchmark: {', '.join(meta['suites'])} ({meta['mode']} mode)", ""]
    if meta["mode"] == "gpu":
        lines.append(f"{meta.get('device')} (sm {meta.get('compute_capability')}, {meta.get('sm_count')} SMs), "
                     f"driver {meta.get('driver')}, CUDA runtime {meta.get('cuda_runtime')}, CuPy {meta.get('cupy')}, "
                     f"cuDNN {meta.get('cudnn', meta.get('torch_cudnn', 'unknown'))}, torch {meta.get('torch', '-')}, "
                     f"jax {meta.get('jax', '-')}.")
        peaks = meta.get("peaks")
        lines.append("Peaks: " + (f"{peaks['device']} ({peaks['source']}): FP16/BF16 tensor "
                                  f"{peaks['fp16_tensor'] / 1e12:.0f}, TF32 {peaks['tf32_tensor'] / 1e12:.0f}, FP32 "
                                  f"{peaks['fp32'] / 1e12:.0f}, FP64 {peaks['fp64'] / 1e12:.0f} TFLOP/s dense; "
                                  f"{peaks['bandwidth'] / 1e12:.2f} TB/s." if peaks else meta.get("peaks_note", "none")))
    else:
        lines.append(f"{meta.get('cpu_count')} CPU cores ({meta.get('machine')}), numpy {meta.get('numpy')}, "
                     f"tensorflow {meta.get('tensorflow', '-')} (TF_ENABLE_ONEDNN_OPTS: "
                     f"{meta.get('TF_ENABLE_ONEDNN_OPTS', '-')}).")
    lines.append(f"gradops {meta['gradops']}, commit {meta['commit']}, {meta['date']}; allow_tf32={meta['allow_tf32']}, "
                 f"deterministic={meta['deterministic']}; median of >= {meta['timing']['repeats']} runs after "
                 f"{meta['timing']['warmup']} warm-up runs; timers: "
                 + ", ".join(f"{k} {v}" for k, v in meta.get("timers", {}).items()) + ".")
    lines += ["", "Speedup A vs B = time(B) / time(A) (> 1: A is faster). Cells: time (throughput, % of roofline); "
              "`n/a` = the engine has no such op/config, `unavailable` = engine not usable here.", ""]
    if meta.get("stopped_early"):
        lines += [f"**Incomplete:** {meta['stopped_early']}.", ""]
    predicted = meta.get("predicted")
    if predicted:
        lines += [f"Predicted: the static report's roofline ({predicted['label']}; commit {predicted['commit']}, "
                  f"{predicted['source']}), kernel time only; `cuda / predicted` = measured gradops-cuda time / "
                  "predicted time (the bound; then the latency-aware estimate where the report has it).", ""]

    lines += ["## Geometric means", ""]
    pairs = sorted({p for g in report["summary"]["groups"] for p in g["speedups"]})
    peak_engines = engines if meta.get("peaks") else []  # % of peak needs the device's peak table
    header = ["suite", "op", "dtype", "cases"] + [f"{p}" for p in pairs] + [f"{e} % peak" for e in peak_engines]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for group in report["summary"]["groups"] + [dict(g, op="all", dtype="all") for g in report["summary"]["suites"]]:
        cells = [group["suite"], group["op"], group["dtype"], str(group["cases"])]
        for p in pairs:
            s = group["speedups"].get(p)
            cells.append(f"{s['geomean']:.2f} (n={s['n']})" if s and s["geomean"] else "-")
        for e in peak_engines:
            cells.append(_fmt(group["engines"].get(e, {}).get("geomean_pct_peak"), ".3g"))
        lines.append("| " + " | ".join(cells) + " |")

    for suite_name in meta["suites"]:
        suite_rows = [r for r in rows if r["suite"] == suite_name]
        if not suite_rows:
            continue
        lines += ["", f"## {suite_name}", ""]
        with_predictions = any(r.get("predicted") for r in suite_rows)
        header = ["case", "op", "dtype"] + engines + pairs
        header += ["predicted (not measured)", "cuda / predicted"] if with_predictions else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        notes = []
        for r in suite_rows:
            memory_bound = r["op"] in MEMORY_BOUND_OPS
            cells = [r["label"], r["op"], r["dtype"]]
            for e in engines:
                entry = r["engines"].get(e, {})
                cells.append(_engine_cell(entry, memory_bound))
                if entry.get("status") in ("error", "mismatch"):
                    notes.append(f"- {r['label']} {r['op']} {r['dtype']}, {e}: {entry['status']}: {entry.get('note')}")
            cells += [_fmt(r.get("speedups", {}).get(p)) for p in pairs]
            cells += _predicted_cells(r) if with_predictions else []
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        if notes:
            lines += ["", "Errors and mismatches:", ""] + notes
    return "\n".join(lines) + "\n"


def write(report: dict, out: Path, stem: str | None = None, plot: bool = True) -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and (with matplotlib) ``<stem>.png`` into ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stem = stem or f"{report['meta']['mode']}_{'+'.join(report['meta']['suites'])}"
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(report, indent=1, default=_json_default) + "\n")
    paths[1].write_text(markdown(report))
    if plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            # The numbers are written already; a missing plotting library must not lose them.
            import warnings

            warnings.warn("matplotlib is not installed (pip install 'gradops[bench]'): no PNG written",
                          stacklevel=2)
            return paths
        from .plot import plot as draw

        paths.append(draw(report, out / f"{stem}.png"))
    return paths


def _json_default(value):
    if hasattr(value, "item"):  # NumPy scalars
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


# --------------------------------------------------------------------------- numpy_vs_tf


def numpy_vs_tf(report: dict) -> tuple[dict, str]:
    """The report in benchmarks/results/numpy_vs_tf.{json,md}'s format (issue 2's speed check).

    ``ratio`` is gradops time / TF time (< 1: gradops faster), target geomean <= 1.5.
    Rows where either side was not timed are left out and listed in the markdown.
    """
    meta = report["meta"]
    legacy_meta = {k: meta.get(k) for k in ("commit", "date", "machine", "processor", "cpu_count", "python", "numpy",
                                            "tensorflow", "gradops")}
    rows, skipped = [], []
    for r in report["rows"]:
        ours, theirs = r["engines"].get("numpy", {}), r["engines"].get("tensorflow", {})
        if not ours.get("time_ms") or not theirs.get("time_ms"):
            skipped.append(f"{r['op']} {r['label']}: numpy {ours.get('status')}, tensorflow {theirs.get('status')}")
            continue
        error = r.get("pairwise", {}).get("numpy", {}).get("tensorflow")
        rows.append(dict(op=r["op"], case=r["label"], gradops_ms=ours["time_ms"], tf_ms=theirs["time_ms"],
                         ratio=ours["time_ms"] / theirs["time_ms"], max_rel_error=error))
    ratio = geomean(row["ratio"] for row in rows)
    data = dict(meta=legacy_meta, geomean_ratio=ratio, rows=rows)
    lines = [f"NumPy backend vs tensorflow-cpu {legacy_meta['tensorflow']}, {legacy_meta['cpu_count']} CPU cores "
             f"({legacy_meta['machine']}), numpy {legacy_meta['numpy']}, commit {legacy_meta['commit']}, "
             f"{legacy_meta['date']}.", "",
             "| op | case | gradops (ms) | TF (ms) | ratio | max rel. error |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['op']} | {r['case']} | {r['gradops_ms']:.2f} | {r['tf_ms']:.2f} | {r['ratio']:.2f} | "
              f"{_fmt(r['max_rel_error'], '.1e')} |" for r in rows]
    lines += ["", f"Geometric mean of time ratios (gradops / TF): **{_fmt(ratio, '.3f')}** (target <= 1.5)."]
    if skipped:
        lines += ["", "Not timed:", ""] + [f"- {s}" for s in skipped]
    return data, "\n".join(lines) + "\n"
