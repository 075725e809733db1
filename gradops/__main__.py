"""Command line: ``python -m gradops info``, ``check``, ``bench``, ``kernels``, ``static-report`` and ``install-check``."""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import platform
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def info(console: Console) -> int:
    import gradops
    from gradops._dispatch import backend_status

    table = Table(title=f"gradops {gradops.__version__}")
    table.add_column("component")
    table.add_column("status")
    table.add_row("python", f"{platform.python_version()} ({platform.machine()})")
    for dist in ("numpy", "ml_dtypes", "cupy-cuda12x", "cupy-cuda13x", "nvidia-cudnn-frontend",
                 "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "tensorflow-cpu", "tensorflow"):
        version = _version(dist)
        if version or dist in ("numpy", "ml_dtypes"):
            table.add_row(dist, version or "not installed")
    from gradops.backends import _gpu_probe

    table.add_row("CUDA driver", _gpu_probe.describe_driver())
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
        for i in range(count):
            props = cupy.cuda.runtime.getDeviceProperties(i)
            name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
            from gradops.backends.cuda._conv_igemm import capability_summary

            arch = props["major"] * 10 + props["minor"]
            table.add_row(f"GPU {i}", f"{name} (sm_{arch}): {capability_summary(arch)}")
        table.add_row("CUDA runtime", str(cupy.cuda.runtime.runtimeGetVersion()))
    except Exception as exc:
        table.add_row("GPU", escape(f"none ({type(exc).__name__}: {exc})") if "cupy" in sys.modules
                      else "none (CuPy not installed)")
    try:  # the import of the cuDNN Frontend is guarded inside; this guards a broken gradops install
        from gradops.backends.cudnn import versions

        cudnn_versions = versions()
    except Exception as exc:
        cudnn_versions = dict.fromkeys(("frontend", "library"), f"unknown ({type(exc).__name__}: {exc})")
    # escape(): reasons name extras such as gradops[cuda12], which rich would take for markup.
    table.add_row("cuDNN Frontend (import cudnn)", escape(cudnn_versions["frontend"]))
    table.add_row("cuDNN library (libcudnn)", escape(cudnn_versions["library"]))
    for name, (ok, reason) in backend_status().items():
        table.add_row(f"backend {name}", ("[green]available[/]" if ok else "[red]unavailable[/]") + f": {escape(reason)}")
    console.print(table)
    return 0


def check(console: Console, use_tf: bool) -> int:
    from gradops._check import run_check

    rows = run_check(use_tf=use_tf)
    table = Table(title="gradops check: every op on every available backend")
    for col in ("op", "backend", "reference", "dtype", "cases", "max rel. error", "tolerance", "result"):
        table.add_column(col)
    failed = 0
    for row in rows:
        # escape(): notes carry reasons that name extras such as gradops[cuda12] (see info).
        if row["passed"] is None:
            result = f"[yellow]{escape(row['note'])}[/]"
        elif row["passed"]:
            result = "[green]pass[/]"
        else:
            failed += 1
            result = "[red]FAIL[/]" + (f" {escape(row['note'])}" if row["note"] else "")
        err = row["max_error"]
        table.add_row(row["op"], row["backend"], row["reference"], row["dtype"], str(row["cases"]),
                      "-" if math.isnan(err) else f"{err:.2e}",
                      "-" if math.isnan(row["tolerance"]) else f"{row['tolerance']:.0e}", result)
    console.print(table)
    checked = sum(1 for r in rows if r["passed"] is not None)
    console.print(f"{checked - failed} passed, {failed} failed")
    return 1 if failed else 0


def kernels(console: Console, archs: list[str], sources: list[str] | None) -> int:
    """Compile every CUDA kernel instantiation with NVRTC (no GPU needed) and show what ptxas
    reports: registers per thread, spills, stack, static shared memory."""
    from gradops.backends.cuda import _build

    rows = _build.kernel_resources(tuple(archs), sources)
    table = Table(title="gradops CUDA kernels (ptxas -v)")
    for col in ("source", "arch", "kernel", "registers", "spill st/ld (B)", "stack (B)", "smem (B)"):
        table.add_column(col)
    spilling = 0
    for r in rows:
        spills = any(_build.spill_bytes(r))
        spilling += bool(spills)
        table.add_row(r["source"], r["arch"], r["kernel"].removeprefix("gradops::"), str(r["registers"]),
                      f"{'[red]' if spills else ''}{r['spill_stores']}/{r['spill_loads']}",
                      str(r["stack_bytes"]), str(r["shared_bytes"]))
    console.print(table)
    warnings = sorted({(r["source"], r["arch"], w) for r in rows for w in r["warnings"]})
    for source, arch, warning in warnings:
        console.print(f"[yellow]{source} ({arch}): {escape(warning)}")
    console.print(f"{len(rows)} kernels compiled, {spilling} with spills or a stack frame, "
                  f"{len(warnings)} compiler warnings")
    return 1 if spilling or warnings else 0


def static_report(console: Console, out, archs: list[str], conv: bool) -> int:
    """Compile and disassemble the kernels (no GPU), count their SASS and predict each benchmark
    shape's time on a roofline: **predicted, not measured**."""
    from gradops.bench import static_report as sr

    report = sr.build(tuple(archs), conv=conv, progress=lambda text: console.print(escape(text), style="dim"))
    table = Table(title=f"gradops static report ({sr.LABEL}): steady-state SASS per output element")
    for col in ("arch", "kernel", "regs", "warps/SM", "global ld/st on the path", "SASS/elem"):
        table.add_column(col)
    for r in report["kernels"]:
        s = r.get("steady_state")
        if s and "not_modelled" in s:
            table.add_row(r["arch"], escape(r["kernel"].removeprefix("gradops::")), str(r["registers"]),
                          str(r["occupancy"]["warps_per_sm"]), "-", "not modelled (staged tile kernel)")
        elif s:
            memory = ", ".join(f"{v} {k}" for k, v in s["path"]["memory"].items() if k.startswith(("LDG", "STG")))
            table.add_row(r["arch"], escape(r["kernel"].removeprefix("gradops::")), str(r["registers"]),
                          str(r["occupancy"]["warps_per_sm"]), memory, f"{s['per_element']:.0f}")
    console.print(table)
    console.print(f"{len(report['predictions'])} shape predictions ({sr.LABEL}), commit {report['meta']['commit']}")
    if out is not None:
        paths = sr.write(report, out)
        console.print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def install_check(console: Console, archs: list[str] | None, sources: list[str] | None, jobs: int,
                  only_environment: bool, one_per_class: bool = False, each: list[str] | None = None) -> int:
    """Compile every kernel for each GPU generation as a GPU run would (CuPy's compile step, no
    GPU needed), failing on a compile error or a cubin kernel that spills; with
    ``only_environment``, also on CUDA headers from outside this environment."""
    from gradops.backends.cuda import _build, _install_check

    try:
        import cupy  # noqa: F401  (its NVRTC compiles; no GPU needed)
    except ImportError as exc:
        console.print("[red]error[/]: " + escape(f"install-check compiles through CuPy's NVRTC step, and CuPy "
                                                 f"does not import here ({exc}): pip install 'gradops[cuda13]' "
                                                 "or 'gradops[cuda12]'"))
        return 2
    each = tuple(_build.arch_number(a) for a in each or ())
    checked = tuple(_build.arch_number(a) for a in archs) if archs else _install_check.ARCHS
    checked += tuple(a for a in each if a not in checked)
    result = _install_check.run(checked, sources, jobs, only_environment, one_per_class, each)
    console.print(f"NVRTC {result['nvrtc']}, {sys.prefix}")
    console.print("NVRTC options: " + escape(" ".join(result["options"])))
    console.print("archs that see the same preprocessed source"
                  + ((" (of each class, the archs named by --each compiled, else the oldest)" if each else
                      " (the oldest of each class compiled)") if one_per_class else "") + ":")
    for source, groups in result["classes"].items():
        console.print(f"  {source}: " + "; ".join(", ".join(group) for group in groups))
    table = Table(title="gradops kernels compiled through CuPy's NVRTC entry point")
    for col in ("arch", "source", "kernels", "result", "most registers", "seconds"):
        table.add_column(col)
    colour = {"ok": "green", "failed": "red", "spills": "red", "warnings": "red", "not targetable": "yellow",
              "covered": "cyan"}
    for r in result["rows"]:
        registers = str(r["registers"]) if "registers" in r else ("PTX" if r["status"] == "ok" else "")
        table.add_row(r["arch"], r["source"], str(r["kernels"]),
                      f"[{colour[r['status']]}]{r['status']}[/]", registers, f"{r['seconds']:.1f}")
    console.print(table)
    for r in result["rows"]:
        if r["status"] in ("failed", "spills", "warnings"):
            console.print(f"[red]{r['arch']} {r['source']}[/]: " + escape(r["detail"][:2000]))
    known = [(r["arch"], k) for r in result["rows"] for k in r.get("known_spills", ())]
    for arch, text in known:
        console.print(f"[yellow]known spill (accepted, a defect to fix) {arch}[/] " + escape(text))
    for folder in result["foreign"]:
        console.print("[red]header folder outside this environment:[/] " + escape(folder))
    for header in result["missing"]:
        console.print("[red]no include folder holds[/] " + escape(header))
    for problem in result["api"]:
        console.print("[red]CuPy lacks what the kernel loader uses:[/] " + escape(problem))
    counts = {s: sum(r["status"] == s for r in result["rows"]) for s in colour}
    console.print(f"{counts['ok']} compiled, {counts['failed']} failed, {counts['spills']} spilling, "
                  f"{counts['warnings']} with compiler warnings, "
                  f"{len(known)} known spills, "
                  f"{counts['covered']} covered by their class, {counts['not targetable']} not targetable by this NVRTC "
                  f"({sum(r['kernels'] for r in result['rows'] if r['status'] == 'ok')} kernels)")
    return 1 if (counts["failed"] or counts["spills"] or counts["warnings"] or result["foreign"] or result["missing"]
                 or result["api"] or not counts["ok"]) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="backends, versions, devices, and why a backend is unavailable")
    chk = sub.add_parser("check", help="every op on every available backend against a reference")
    chk.add_argument("--no-tf", action="store_true", help="skip the comparison with TensorFlow")
    from gradops.bench.cli import add_arguments as add_bench_arguments

    add_bench_arguments(sub.add_parser(
        "bench", help="time gradops' backends against cuDNN (PyTorch) and JAX, or NumPy against TF on a CPU"))
    ker = sub.add_parser("kernels", help="compile every CUDA kernel with NVRTC (no GPU) and report registers/spills")
    ker.add_argument("--arch", action="append", default=None, help="sm_XX (repeatable; default sm_80 and sm_90)")
    ker.add_argument("--source", action="append", default=None, help="a cuda_src/*.cu file (repeatable)")
    sta = sub.add_parser("static-report", help="SASS of the depthwise, fractional pooling and tiled conv kernels (no GPU) "
                         "and a roofline prediction per benchmark shape: predicted, not measured")
    sta.add_argument("--out", type=Path, default=None,
                     help="write static_report.md and static_report.json here (e.g. benchmarks/results)")
    sta.add_argument("--arch", action="append", default=None, help="sm_XX (repeatable; default sm_90 and sm_80)")
    sta.add_argument("--no-conv", action="store_true", help="leave out the tiled convolution kernels (minutes to compile)")
    ins = sub.add_parser("install-check", help="compile every kernel for each GPU generation through CuPy's "
                         "compile step, as a GPU run would (no GPU needed)")
    ins.add_argument("--arch", action="append", default=None,
                     help="sm_XX (repeatable; default: every arch of _install_check.ARCHS, sm_50 to sm_121)")
    ins.add_argument("--source", action="append", default=None, help="a cuda_src/*.cu file (repeatable)")
    ins.add_argument("--jobs", type=int, default=1, help="compile this many programs at once")
    ins.add_argument("--only-environment", action="store_true",
                     help="fail if a CUDA header folder lies outside this Python environment")
    ins.add_argument("--one-per-class", action="store_true",
                     help="of archs that see the same preprocessed source, compile only the oldest")
    ins.add_argument("--each", action="append", default=None,
                     help="sm_XX (repeatable): with --one-per-class, compile this arch for itself; the others "
                          "of its class are covered by it")
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.command == "info":
        return info(console)
    if args.command == "kernels":
        return kernels(console, args.arch or ["sm_80", "sm_90"], args.source)
    if args.command == "static-report":
        return static_report(console, args.out, args.arch or ["sm_90", "sm_80"], not args.no_conv)
    if args.command == "install-check":
        return install_check(console, args.arch, args.source, args.jobs, args.only_environment, args.one_per_class,
                             args.each)
    if args.command == "bench":
        from gradops.bench.cli import main as bench

        return bench(args, console)
    return check(console, use_tf=not args.no_tf)


if __name__ == "__main__":
    sys.exit(main())
