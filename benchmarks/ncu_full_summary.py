"""One markdown row per kernel launch of an Nsight Compute ``--set full`` run (measured, not predicted).

Input: the CSV of ``ncu --profile-from-start off --csv --page details --set full`` over
benchmarks/ncu_cases.py (which launches a marker kernel ``gradops_case_marker``, grid size = case
index, before each case; every kernel between two markers belongs to the case), and the index
JSON that script wrote (``[{"i", "suite", "label", "op", "dtype", "engine"}]``).  As
scripts/device-session.sh's "ncu full" step runs it:

    ncu --profile-from-start off --clock-control none --csv --page details --set full \\
        python3 benchmarks/ncu_cases.py '' full_index.json --suites mobilenetv2,fractional,efficientnet \\
        --engines gradops-cuda --paths tiled,cells --dtypes float16 --labels ... > full.csv

    python benchmarks/ncu_full_summary.py full.csv[.gz] full_index.json [--stalls 3] > summary.md

The details page has two kinds of row per kernel launch: a metric row (16 fields: section
name, metric name, unit, value) per metric of the sections' headers, and a rule row (20 fields:
the section's identifier, rule name, type, description, estimated speedup) per rule that fired.
Output, per launch: the case, op, layout, engine, kernel, duration, the speed-of-light,
occupancy, scheduler and cache metrics of :data:`METRICS`, and what only the rules report:

* **stalls**: the details page has no per-reason stall metrics (the Warp State section's chart
  is not printed; ``--page raw`` would list ``smsp__average_warps_issue_stalled_*``).  The
  ``CPIStall`` rule names the reasons that exceed its threshold, each with its cycles per issued
  instruction and its share of all cycles between two issues; the largest ``--stalls`` of them
  are shown, mapped to the names ncu's Warp State chart uses (:data:`STALL_REASONS`);
* **shared-memory bank conflicts**: the ``SharedMemoryConflicts`` rule (n-way, conflicts as a
  share of the loads' / stores' shared wavefronts), where it fired;
* **uncoalesced global accesses**: the ``UncoalescedGlobalAccess`` rule (excessive L2 sectors as
  a share of all global sectors), where it fired.

A "-" is a metric not in the CSV or a rule that did not fire (not a zero).
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
from collections import defaultdict

MARKER = "gradops_case_marker"

# Column -> (section name, metric name) in the details page, one value per launch.
METRICS = {
    "time (us)": ("GPU Speed Of Light Throughput", "Duration"),
    "SOL SM %": ("GPU Speed Of Light Throughput", "Compute (SM) Throughput"),
    "SOL L1 %": ("GPU Speed Of Light Throughput", "L1/TEX Cache Throughput"),
    "SOL L2 %": ("GPU Speed Of Light Throughput", "L2 Cache Throughput"),
    "DRAM % of peak": ("GPU Speed Of Light Throughput", "DRAM Throughput"),
    "achieved occ. %": ("Occupancy", "Achieved Occupancy"),
    "theoretical occ. %": ("Occupancy", "Theoretical Occupancy"),
    "regs/thread": ("Launch Statistics", "Registers Per Thread"),
    "waves/SM": ("Launch Statistics", "Waves Per SM"),
    "issue slots busy %": ("Compute Workload Analysis", "Issue Slots Busy"),
    "issued warp/scheduler": ("Scheduler Statistics", "Issued Warp Per Scheduler"),
    "no eligible %": ("Scheduler Statistics", "No Eligible"),
    "warp cycles/issued inst": ("Warp State Statistics", "Warp Cycles Per Issued Instruction"),
    "L1 hit %": ("Memory Workload Analysis", "L1/TEX Hit Rate"),
    "L2 hit %": ("Memory Workload Analysis", "L2 Hit Rate"),
}
# The Occupancy section's per-SM block limits: the smallest sets the theoretical occupancy.
BLOCK_LIMITS = {"Block Limit Registers": "regs", "Block Limit Shared Mem": "smem",
                "Block Limit Warps": "warps", "Block Limit SM": "blocks", "Block Limit Barriers": "barriers"}
TIME_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
# The CPIStall rule's wording ("... cycles being stalled <phrase>.") -> the Warp State chart's name.
# The first three occur in the H200 run of 2026-12-04; the others follow the Profiling Guide's
# stall descriptions.  A phrase matching none is shown as it is.
STALL_REASONS = [
    ("scoreboard dependency on a L1TEX", "Long Scoreboard"),
    ("after EXIT", "Drain"),
    ("to fetch an instruction", "No Instruction"),
    ("scoreboard dependency on a MIO", "Short Scoreboard"),
    ("at a CTA barrier", "Barrier"),
    ("MIO (memory input/output) instruction queue", "MIO Throttle"),
    ("(LG) memory operations", "LG Throttle"),
    ("fixed latency execution dependency", "Wait"),
    ("execution pipe to be available", "Math Pipe Throttle"),
]
OP_SHORT = {"depthwise_conv2d_native_backprop_input": "dw input grad",
            "depthwise_conv2d_native_backprop_filter": "dw filter grad",
            "fractional_avg_pool_grad": "frac avg pool grad", "fractional_max_pool_grad": "frac max pool grad"}
NHWC_ONLY = ("fractional_",)  # gradops' fractional pooling ops take NHWC only (their labels name no layout)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def read_launches(csv_path: str) -> list[dict]:
    """Every kernel launch of an ncu details CSV (``.gz`` or plain), in ID order:
    ``{"id", "name", "grid", "block", "metrics": {(section, metric): (value, unit)}, "rules": [...]}``,
    a rule being ``{"section", "rule", "type", "text", "speedup"}``.  Lines before the header
    (ncu's ``==PROF==`` and ``==WARNING==`` lines, the program's output) are skipped."""
    opener = gzip.open if str(csv_path).endswith(".gz") else open
    with opener(csv_path, "rt", newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header = rows[start]
    launches: dict[str, dict] = {}
    for r in rows[start + 1:]:
        if len(r) < 15 or not r[0].isdigit():
            continue
        d = dict(zip(header, r + [""] * (len(header) - len(r))))
        k = launches.setdefault(d["ID"], {"id": int(d["ID"]), "name": d["Kernel Name"], "grid": d["Grid Size"],
                                          "block": d["Block Size"], "metrics": {}, "rules": []})
        if d["Metric Name"]:
            k["metrics"][(d["Section Name"], d["Metric Name"])] = (d["Metric Value"], d["Metric Unit"])
        elif d.get("Rule Name"):
            k["rules"].append({"section": d["Section Name"], "rule": d["Rule Name"], "type": d["Rule Type"],
                               "text": d["Rule Description"], "speedup": d["Estimated Speedup"]})
    return sorted(launches.values(), key=lambda k: k["id"])


def by_case(launches: list[dict]) -> dict[int, list[dict]]:
    """``{case index: [launch, ...]}``: the launches after the marker whose grid size is the index."""
    cases: dict[int, list[dict]] = defaultdict(list)
    current = None
    for k in launches:
        if k["name"].startswith(MARKER):
            current = int(re.findall(r"\d+", k["grid"])[0])
        elif current is not None:
            cases[current].append(k)
    return cases


def metric(launch: dict, section: str, name: str) -> float | None:
    """A metric's value as a number (durations in microseconds), None if absent or not a number."""
    value, unit = launch["metrics"].get((section, name), ("", ""))
    try:
        number = _number(value)
    except ValueError:
        return None
    return number * TIME_SCALE[unit] if unit in TIME_SCALE else number


def occupancy_limiter(launch: dict) -> str:
    """The block limit(s) with the fewest blocks per SM ("regs", "smem", ...), "" if none reported."""
    limits = {short: metric(launch, "Occupancy", name) for name, short in BLOCK_LIMITS.items()}
    limits = {k: v for k, v in limits.items() if v is not None}
    if not limits:
        return ""
    least = min(limits.values())
    return "+".join(k for k, v in limits.items() if v == least)


#: The per-reason stall metrics ``--metrics "regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$"``
#: adds beside ``--set full`` (scripts/device-session.sh's "ncu full" step since 2026-12-04), in
#: whichever section the details page lists them: cycles a warp spends in that state per issued
#: instruction.  "selected" is the issuing state itself, not a stall.
STALL_METRIC = re.compile(r"^smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")


def measured_stalls(launch: dict) -> list[tuple[str, float, float]]:
    """The per-reason stall metrics where the CSV has them, largest first: ``(reason, cycles per
    issued instruction, % of all the reasons' cycles)``; [] where it has none."""
    found = {}
    for (_, name), (value, _) in launch.get("metrics", {}).items():
        m = STALL_METRIC.match(name)
        if m and m.group(1) != "selected":
            try:
                found[m.group(1).replace("_", " ").title()] = _number(value)
            except ValueError:
                continue
    total = sum(found.values())
    return sorted(((reason, cycles, 100.0 * cycles / total if total else float("nan"))
                   for reason, cycles in found.items()), key=lambda s: -s[1])


def stalls(launch: dict) -> list[tuple[str, float, float]]:
    """Stall reasons, largest first: ``(reason, cycles per issued instruction, % of the cycles
    between two issues)``: every reason from the per-reason metrics where the CSV has them
    (:func:`measured_stalls`), else those the CPIStall rule reports (the reasons above its
    threshold only)."""
    measured = measured_stalls(launch)
    if measured:
        return measured
    found = []
    for rule in launch["rules"]:
        if rule["rule"] != "CPIStall":
            continue
        m = re.search(r"spends ([\d.]+) cycles being stalled (.+?)\. ", rule["text"])
        if not m:
            continue  # the rule's pointer to the source-level sampling table
        phrase = m.group(2)
        reason = next((name for key, name in STALL_REASONS if key in phrase), phrase[:40])
        share = re.search(r"represents about ([\d.]+)% of the total", rule["text"])
        found.append((reason, float(m.group(1)), float(share.group(1)) if share else float("nan")))
    return sorted(found, key=lambda s: -s[1])


def bank_conflicts(launch: dict) -> dict[str, tuple[float, float]]:
    """``{"load"|"store": (n-way, conflicts as % of that kind's shared wavefronts)}`` from the
    SharedMemoryConflicts rule, where it fired."""
    found = {}
    for rule in launch["rules"]:
        if rule["rule"] != "SharedMemoryConflicts":
            continue
        m = re.search(r"([\d.]+) - way bank conflict across all \d+ shared (load|store) requests"
                      r".*?represent ([\d.]+)% of the overall", rule["text"])
        if m:
            found[m.group(2)] = (float(m.group(1)), float(m.group(3)))
    return found


def uncoalesced_global(launch: dict) -> float | None:
    """Excessive global sectors, % of all (the UncoalescedGlobalAccess rule), None if it did not fire."""
    for rule in launch["rules"]:
        m = re.search(r"\((\d+)% of the total \d+ sectors\)", rule["text"]) \
            if rule["rule"] == "UncoalescedGlobalAccess" else None
        if m:
            return float(m.group(1))
    return None


def short_kernel(name: str) -> str:
    """``void gradops::depthwise_conv2d_native_backprop_input_tiled<__half, float, 0, ...>(...)``
    -> ``input_tiled<__half,float,0,...>``."""
    name = re.sub(r"^void ", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first "(" outside the template arguments
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            cut = i
            break
    name = name[:cut].replace("gradops::", "").replace(" ", "")
    return re.sub(r"^depthwise_conv2d_native_backprop_", "", name)


def layout(entry: dict) -> str:
    for fmt in ("NHWC", "NCHW"):
        if entry["label"].endswith(" " + fmt):
            return fmt
    return "NHWC" if entry["op"].startswith(NHWC_ONLY) else "-"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(csv_path: str, index_path: str, n_stalls: int = 3) -> list[dict]:
    """One dict per kernel launch of the index's cases, in the index's order: the table's cells."""
    index = json.load(open(index_path))
    cases = by_case(read_launches(csv_path))
    out = []
    for entry in index:
        for k in cases.get(entry["i"], []):
            values = {col: metric(k, *key) for col, key in METRICS.items()}
            conflicts = bank_conflicts(k)
            out.append({
                "case": entry["label"], "op": OP_SHORT.get(entry["op"], entry["op"]), "layout": layout(entry),
                "engine": entry["engine"], "kernel": short_kernel(k["name"]), "id": k["id"],
                **values, "occupancy limiter": occupancy_limiter(k),
                "stalls": stalls(k)[:n_stalls], "bank conflicts": conflicts,
                "uncoalesced global %": uncoalesced_global(k)})
    return out


def table(csv_path: str, index_path: str, n_stalls: int = 3) -> str:
    cols = ["case", "op", "layout", "engine", "kernel (ncu ID)", "time (us)", "SOL SM / L1 / L2 %", "DRAM % of peak",
            "achieved occ. %", "theoretical occ. % (limit)", "regs/thread", "waves/SM", "issue slots busy %",
            "issued warp/scheduler", "no eligible %", "warp cycles/issued inst",
            "stalls (cycles/inst, % of all)", "L1 hit %", "L2 hit %",
            "smem bank conflicts (n-way, % of wavefronts)", "uncoalesced global (excess sectors %)"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * 5 + "---:|" * 11 + "---|" + "---:|" * 2 + "---|---:|"]
    for r in rows(csv_path, index_path, n_stalls):
        stall = "; ".join(f"{name} {cyc:.1f} ({pct:.0f}%)" for name, cyc, pct in r["stalls"]) or "-"
        conflicts = "; ".join(f"{kind} {way:.1f}-way {pct:.0f}%" for kind, (way, pct) in sorted(r["bank conflicts"].items()))
        theo = _fmt(r["theoretical occ. %"]) + (f" ({r['occupancy limiter']})" if r["occupancy limiter"] else "")
        cells = [r["case"], r["op"], r["layout"], r["engine"], f"`{r['kernel']}` ({r['id']})", _fmt(r["time (us)"]),
                 " / ".join(_fmt(r[f"SOL {unit} %"], 0) for unit in ("SM", "L1", "L2")), _fmt(r["DRAM % of peak"]),
                 _fmt(r["achieved occ. %"]), theo, _fmt(r["regs/thread"], 0), _fmt(r["waves/SM"], 2),
                 _fmt(r["issue slots busy %"]),
                 _fmt(r["issued warp/scheduler"], 2), _fmt(r["no eligible %"]), _fmt(r["warp cycles/issued inst"]),
                 stall, _fmt(r["L1 hit %"]), _fmt(r["L2 hit %"]), conflicts or "-", _fmt(r["uncoalesced global %"], 0)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def metric_names() -> str:
    """What the table read, for the report."""
    used = [f"`{section} / {name}`" for section, name in METRICS.values()]
    used += [f"`Occupancy / {name}`" for name in BLOCK_LIMITS]
    return ("Metrics (details page, `Section Name / Metric Name`): " + ", ".join(used) + ".\n\n"
            "Rules (details page, `Rule Name`; only where they fired): `CPIStall` (stall reasons above its "
            "threshold; used where the CSV lacks the per-reason `smsp__average_warps_issue_stalled_*` metrics, "
            "which the details page does not list unless --metrics asks for them), `SharedMemoryConflicts`, "
            "`UncoalescedGlobalAccess`.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="ncu --csv --page details --set full output (.gz or plain)")
    parser.add_argument("index", help="benchmarks/ncu_cases.py's index JSON")
    parser.add_argument("--stalls", type=int, default=3, help="stall reasons to show per kernel (at most)")
    args = parser.parse_args()
    print(table(args.csv, args.index, args.stalls) + "\n" + metric_names(), end="")


if __name__ == "__main__":
    main()
