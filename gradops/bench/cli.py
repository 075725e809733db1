"""``python -m gradops bench``: run suites, print a summary, write JSON / markdown / PNG."""

from __future__ import annotations

import argparse
from pathlib import Path

from .suites import ALL, DTYPES, SUITES
from .timing import TimingSettings

MIN_SECONDS = 0.5
#: The smoke suite checks that everything runs; its timings only need to be plausible.
SMOKE_MIN_SECONDS = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", action="append", choices=SUITES + ("all",), default=None,
                        help=f"suite to run (repeatable); default: all = {', '.join(ALL)} on a GPU, "
                             "numpy_vs_tf in CPU mode")
    parser.add_argument("--dtype", action="append", choices=tuple(DTYPES), default=None,
                        help="only these dtypes (repeatable); default: each case's own list")
    parser.add_argument("--out", type=Path, default=None, help="directory for the .json/.md/.png report")
    parser.add_argument("--mode", choices=("auto", "gpu", "cpu"), default="auto",
                        help="gpu: gradops cuDNN / CUDA kernels vs PyTorch and JAX; cpu: NumPy backend vs "
                             "tensorflow-cpu; auto: gpu when a CUDA device is visible")
    parser.add_argument("--engine", action="append", default=None,
                        help="only these engines (repeatable); gpu mode also takes gradops-cuda:PATH, the depthwise "
                             "input gradient with its kernel path forced (tiled, planes, mma, mma_nhwc, direct, transpose), the filter "
                             "gradient's tiled kernel with its staging forced (sync, async) or its tensor-core kernel "
                             "(mma), or a fractional pooling "
                             "gradient's kernels forced (gather, cells)")
    parser.add_argument("--repeats", type=int, default=7, help="minimum timed runs per engine (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before timing")
    parser.add_argument("--min-seconds", type=float, default=None,
                        help=f"keep timing until this much time passed (default {MIN_SECONDS}; "
                             f"{SMOKE_MIN_SECONDS} for the smoke suite alone)")
    parser.add_argument("--max-repeats", type=int, default=50, help="never more timed runs than this")
    parser.add_argument("--allow-tf32", action="store_true",
                        help="let float32 use TF32 tensor cores (gradops option, PyTorch and JAX alike)")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="let cuDNN / PyTorch / XLA pick non-deterministic algorithms")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG (no matplotlib needed)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="start no new case after this long (the report says what was left out)")


def main(args: argparse.Namespace, console) -> int:
    from . import report as report_mod
    from .runner import gpu_present, run

    mode = args.mode if args.mode != "auto" else ("gpu" if gpu_present() else "cpu")
    if mode == "gpu" and not args.engine and not gpu_present():
        console.print("[red]error[/]: --mode gpu needs a CUDA GPU and CuPy, and this machine has none "
                      "(`python -m gradops info` says why; --mode cpu times the NumPy backend against TF)")
        return 2
    suites = args.suite or (["all"] if mode == "gpu" else ["numpy_vs_tf"])
    if mode == "cpu":
        console.print("[yellow]no CUDA device (or --mode cpu): timing gradops' NumPy backend against "
                      "tensorflow-cpu[/]")
    min_seconds = args.min_seconds
    if min_seconds is None:
        min_seconds = SMOKE_MIN_SECONDS if suites == ["smoke"] else MIN_SECONDS
    settings = TimingSettings(warmup=args.warmup, repeats=args.repeats, min_seconds=min_seconds,
                              max_repeats=args.max_repeats)
    try:
        report = run(suites, dtypes=args.dtype, mode=mode, engines=args.engine, settings=settings,
                     allow_tf32=args.allow_tf32, deterministic=not args.nondeterministic,
                     progress=not args.no_progress, time_limit=args.time_limit)
    except ValueError as exc:  # an unknown engine name
        from rich.markup import escape  # a message may name an extra, e.g. gradops[cuda12]

        console.print(f"[red]error[/]: {escape(str(exc))}")
        return 2
    _print_summary(console, report)
    if args.out:
        paths = report_mod.write(report, args.out, plot=not args.no_plot)
        console.print("wrote " + ", ".join(str(p) for p in paths))
    failed = [(r["label"], r["op"], r["dtype"], name, e["status"]) for r in report["rows"]
              for name, e in r["engines"].items() if e["status"] in ("error", "mismatch")]
    for label, op, dtype, name, status in failed:
        console.print(f"[red]{status}[/]: {name} on {label} {op} {dtype}")
    # Wrong numbers from anyone, or gradops itself failing, fail the run (CI calls the smoke suite).
    ours = ("gradops-", "numpy")
    return 1 if any(status == "mismatch" or name.startswith(ours) for *_, name, status in failed) else 0


def _print_summary(console, report: dict) -> None:
    from rich.table import Table

    summary = report["summary"]
    pairs = sorted({p for g in summary["groups"] for p in g["speedups"]})
    engines = list(report["meta"].get("timers", {}))
    table = Table(title=f"gradops bench ({report['meta']['mode']} mode): geometric means")
    for col in ["suite", "op", "dtype", "cases"] + pairs + [f"{e} timed" for e in engines]:
        table.add_column(col)
    for g in summary["groups"]:
        cells = [g["suite"], g["op"], g["dtype"], str(g["cases"])]
        for p in pairs:
            s = g["speedups"].get(p)
            cells.append(f"{s['geomean']:.2f}" if s and s["geomean"] else "-")
        cells += [str(g["engines"].get(e, {}).get("timed", 0)) for e in engines]
        table.add_row(*cells)
    console.print(table)
