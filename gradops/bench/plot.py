"""PNG of a report: per suite, the speedups per layer and each engine's % of roofline.

Needs matplotlib (the ``bench`` extra); drawn with the Agg backend, so no display is needed.
"""

from __future__ import annotations

from pathlib import Path

from .suites import OP_SHORT as _OP_SHORT
#: Inches of figure width per case on the x axis (keeps the rotated labels legible), and limits.
INCH_PER_CASE = 0.22
MIN_WIDTH, MAX_WIDTH = 8.0, 80.0


def plot(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta, rows = report["meta"], report["rows"]
    suites = [s for s in meta["suites"] if any(r["suite"] == s for r in rows)]
    engines = list(meta.get("timers") or sorted({e for r in rows for e in r["engines"]}))
    pairs = sorted({p for r in rows for p in r.get("speedups", {})})
    most = max((sum(r["suite"] == s for r in rows) for s in suites), default=1)
    width = min(MAX_WIDTH, max(MIN_WIDTH, INCH_PER_CASE * most))
    fig, axes = plt.subplots(2 * max(1, len(suites)), 1, figsize=(width, 7.0 * max(1, len(suites))), squeeze=False)
    where = meta.get("device") if meta["mode"] == "gpu" else f"{meta.get('cpu_count')}-core CPU"
    fig.suptitle(f"gradops bench ({meta['mode']}, {where}, commit {meta['commit']}, {meta['date']})")
    for k, suite in enumerate(suites or ["(no cases)"]):
        suite_rows = [r for r in rows if r["suite"] == suite]
        labels = [f"{r['label']} {_OP_SHORT.get(r['op'], r['op'])} {r['dtype']}" for r in suite_rows]
        x = list(range(len(suite_rows)))
        ax = axes[2 * k][0]
        bar = 0.8 / max(1, len(pairs))
        for j, pair in enumerate(pairs):
            values = [r.get("speedups", {}).get(pair) for r in suite_rows]
            xs = [i + (j - (len(pairs) - 1) / 2) * bar for i, v in enumerate(values) if v]
            ax.bar(xs, [v for v in values if v], width=bar, label=pair)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if any(r.get("speedups") for r in suite_rows):
            ax.set_yscale("log")
        ax.set_ylabel("speedup (time B / time A)")
        ax.set_title(f"{suite}: speedup per layer" + ("" if pairs else " (no pair of engines timed)"))
        if pairs:
            ax.legend(fontsize="small")
        ax.set_xticks(x, [""] * len(x))
        ax.set_xlim(-0.5, max(0.5, len(x) - 0.5))

        ax = axes[2 * k + 1][0]
        # % of roofline needs the device's peaks; without them (CPU mode, unknown GPU) show times.
        key = "pct_roofline" if meta.get("peaks") else "time_ms"
        plotted = False
        for name in engines:
            points = [(i, r["engines"].get(name, {}).get(key)) for i, r in enumerate(suite_rows)]
            points = [(i, v) for i, v in points if v is not None]
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], "o", label=name, markersize=4)
                plotted = True
        if key == "pct_roofline":
            ax.set_ylabel("% of roofline")
            ax.set_title(f"{suite}: % of roofline")
        else:
            ax.set_ylabel("time (ms)")
            ax.set_title(f"{suite}: time per call (no peak table for this device, so no roofline)")
            if plotted:
                ax.set_yscale("log")
        if plotted:
            ax.legend(fontsize="small")
        ax.set_xticks(x, labels, rotation=90, fontsize=6)
        ax.set_xlim(-0.5, max(0.5, len(x) - 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
