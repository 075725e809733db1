"""Kernel-level table of a GPU benchmark run measured with Nsight Compute (measured, not predicted).

Input: the CSV of ``ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,
dram__bytes_write.sum,...`` over a script that launches a marker kernel
(``gradops_case_marker``, grid size = case index) before each case, and that script's index
JSON (``[{"i", "suite", "label", "op", "dtype", "engine"}]``).  Every kernel between two
markers belongs to the case.  Output: markdown, one row per case and engine: kernel time (sum
of the case's kernels), DRAM bytes read + written as ncu counted them, compulsory bytes (each
tensor once, :func:`gradops.bench.metrics.bytes_moved`), and compulsory bytes / kernel time
as a fraction of the device's HBM bandwidth.

    python benchmarks/ncu_table.py NCU.csv INDEX.json [--bandwidth 3.35e12] > table.md
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
from collections import defaultdict

import numpy as np

from gradops.bench import metrics, suites


def kernels_by_case(csv_path: str) -> dict[int, list[dict]]:
    """``{case index: [{"name", "ns", "read", "write"}]}`` from ncu's CSV (one row per metric)."""
    return _by_case(csv_path)[0]


def markers_by_case(csv_path: str) -> dict[int, float]:
    """``{case index: the marker kernel's gpu__time_duration in ns}``: the empty kernel launched
    before each case, the floor of any kernel's time as ncu measures it on that GPU."""
    return _by_case(csv_path)[1]


def _by_case(csv_path: str) -> tuple[dict[int, list[dict]], dict[int, float]]:
    opener = gzip.open if str(csv_path).endswith(".gz") else open
    with opener(csv_path, "rt", newline="") as f:
        rows = [r for r in csv.reader(f)]
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header = rows[start]
    launches: dict[str, dict] = {}
    for r in rows[start + 1:]:
        if len(r) != len(header):
            continue
        d = dict(zip(header, r))
        k = launches.setdefault(d["ID"], {"name": d["Kernel Name"], "grid": d["Grid Size"]})
        value = float(d["Metric Value"].replace(",", "")) if d["Metric Value"] else 0.0
        unit = d["Metric Unit"]
        scale = {"ns": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "nsecond": 1,
                 "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
        k[d["Metric Name"]] = value * scale
    cases: dict[int, list[dict]] = defaultdict(list)
    markers: dict[int, float] = {}
    current = None
    for _, k in sorted(launches.items(), key=lambda item: int(item[0])):
        if k["name"].startswith("gradops_case_marker"):
            current = int(re.findall(r"\d+", k["grid"])[0])
            markers[current] = k.get("gpu__time_duration.sum", 0.0)
            continue
        if current is not None:
            kernel = {"name": k["name"], "ns": k.get("gpu__time_duration.sum", 0.0),
                      "read": k.get("dram__bytes_read.sum", 0.0), "write": k.get("dram__bytes_write.sum", 0.0)}
            if STORE_SECTORS in k:  # runs since session 82 (scripts/device-session.sh's METRICS)
                kernel["store_sectors"] = k[STORE_SECTORS]
            cases[current].append(kernel)
    return cases, markers


#: Global store sectors (32 bytes) the kernel's stores touched, as L1/TEX counted them.
STORE_SECTORS = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"


def _load(csv_path: str, index_path: str):
    """(the index entries, kernels by case index, the suites' Case by (suite, label, op))."""
    index = json.load(open(index_path))
    by_key = {(case.suite, case.label, case.op): case
              for suite_name in {e["suite"] for e in index} for case in suites.suite(suite_name)}
    return index, kernels_by_case(csv_path), by_key


def table(csv_path: str, index_path: str, bandwidth: float) -> str:
    index, cases, by_key = _load(csv_path, index_path)
    lines = ["| suite | case | op | dtype | engine | kernels | kernel time (us) | DRAM read+write (MB) | "
             "compulsory (MB) | compulsory / time, % of HBM | result bytes / global store sectors |",
             "|" + "---|" * 11]
    for e in index:
        ks = cases.get(e["i"], [])
        case = by_key[(e["suite"], e["label"], e["op"])]
        itemsize = np.dtype(e["dtype"]).itemsize
        need = metrics.bytes_moved(case, case.geometry(), itemsize)
        ns = sum(k["ns"] for k in ks)
        dram = sum(k["read"] + k["write"] for k in ks)
        pct = 100 * need / (ns * 1e-9) / bandwidth if ns else float("nan")
        names = "; ".join(sorted({re.sub(r"\(.*", "", k["name"])[:60] for k in ks}))
        # Bytes a store sector: 32 where every sector the kernels store to is whole and written
        # once; less where stores are narrow and scattered (or where partial sums are stored too).
        sectors = sum(k.get("store_sectors", 0.0) for k in ks)
        per_sector = f"{metrics.result_bytes(case, case.geometry(), itemsize) / sectors:.1f}" if sectors else "-"
        lines.append(f"| {e['suite']} | {e['label']} | {e['op']} | {e['dtype']} | {e['engine']} | {len(ks)}: {names} | "
                     f"{ns / 1e3:.1f} | {dram / 1e6:.1f} | {need / 1e6:.1f} | {pct:.1f} | {per_sector} |")
    return "\n".join(lines) + "\n"


def summary(csv_path: str, index_path: str, bandwidth: float) -> str:
    """Per suite, op, dtype and layout: the geometric mean of % of HBM per engine, and of the
    kernel-time ratio of each other engine to gradops-cuda (> 1: gradops-cuda is faster)."""
    index, cases, by_key = _load(csv_path, index_path)
    pct: dict = defaultdict(lambda: defaultdict(list))
    ns: dict = {}
    for e in index:
        case = by_key[(e["suite"], e["label"], e["op"])]
        t = sum(k["ns"] for k in cases.get(e["i"], []))
        if not t:
            continue
        group = (e["suite"], e["op"], e["dtype"], case.data_format)
        need = metrics.bytes_moved(case, case.geometry(), np.dtype(e["dtype"]).itemsize)
        pct[group][e["engine"]].append(100 * need / (t * 1e-9) / bandwidth)
        ns[(e["suite"], e["label"], e["op"], e["dtype"], e["engine"])] = t
    ratio: dict = defaultdict(lambda: defaultdict(list))
    for (suite, label, op, dtype, engine), t in ns.items():
        ours = ns.get((suite, label, op, dtype, "gradops-cuda"))
        if engine != "gradops-cuda" and ours:
            layout = by_key[(suite, label, op)].data_format
            ratio[(suite, op, dtype, layout)][engine].append(t / ours)

    def gmean(values):
        return float(np.exp(np.mean(np.log(values)))) if values else float("nan")

    lines = ["| suite | op | dtype | layout | cases | % of HBM (compulsory bytes / kernel time), geometric mean | "
             "kernel time of X / gradops-cuda, geometric mean |", "|" + "---|" * 7]
    for group in sorted(pct):
        cells = ", ".join(f"{eng} {gmean(v):.1f}" for eng, v in sorted(pct[group].items()))
        ratios = ", ".join(f"{eng} {gmean(v):.2f}" for eng, v in sorted(ratio[group].items())) or "-"
        lines.append(f"| {' | '.join(group)} | {len(pct[group]['gradops-cuda'])} | {cells} | {ratios} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv")
    parser.add_argument("index")
    parser.add_argument("--bandwidth", type=float, default=3.35e12, help="HBM bytes/s (H100 SXM: 3.35e12)")
    parser.add_argument("--summary", action="store_true", help="geometric means per suite, op, dtype, layout")
    args = parser.parse_args()
    print((summary if args.summary else table)(args.csv, args.index, args.bandwidth), end="")


if __name__ == "__main__":
    main()
