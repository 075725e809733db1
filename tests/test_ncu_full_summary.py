"""benchmarks/ncu_full_summary.py: Nsight Compute ``--page details --set full`` CSV -> one row per kernel.

The synthetic CSV is rows of the H200 run of 2026-12-04 (benchmarks/results/gpu_h200_2026-12-04/
full_sections.csv.gz), trimmed: four kernels of three cases, a few metrics each, the rule
descriptions cut to the sentences the script reads.  Written as ncu writes it: every field
quoted, a metric row's 15 fields and a trailing comma (no rule columns), a rule row's 20 fields.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gpu_h200_2026-12-04"

HEADER = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
          "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value", "Rule Name",
          "Rule Type", "Rule Description", "Estimated Speedup Type", "Estimated Speedup")
MARKER = "gradops_case_marker"
INPUT_TILED = ("void gradops::depthwise_conv2d_native_backprop_input_tiled<__half, float, 0, 3, 3, 1, 1, 2, 2>"
               "(const T1 *, const T1 *, T1 *, int, int, int, int, int, int, int, int, int, int, int, int)")
FILTER_MMA = ("void gradops::depthwise_conv2d_native_backprop_filter_mma_nhwc<__half, 3, 1, 0>(const T1 *, "
              "const T1 *, float *, T1 *, int, int, int, int, int, int, int, int, int, int, int, int, int)")
FILTER_REDUCE = ("void gradops::depthwise_conv2d_native_backprop_filter_reduce<__half, float>"
                 "(const T2 *, T1 *, long long, long long)")
INPUT_PLANES = ("void gradops::depthwise_conv2d_native_backprop_input_planes<__half, float, 3, 3, 1>(const T1 *, "
                "const T1 *, T1 *, int, int, int, int, int, int, int, int, int, int, int, int, int, unsigned int, "
                "int, unsigned int, int, unsigned int, int, unsigned int, int)")
# ID -> (kernel name, block, grid): marker 0 opens case 1, marker 4 case 3, marker 7 case 4.
KERNELS = {0: (MARKER, "(32, 1, 1)", "(1, 1, 1)"), 1: (INPUT_TILED, "(64, 1, 1)", "(14, 8, 32)"),
           4: (MARKER, "(32, 1, 1)", "(3, 1, 1)"), 5: (FILTER_MMA, "(256, 1, 1)", "(2, 224, 1)"),
           6: (FILTER_REDUCE, "(448, 1, 1)", "(9, 1, 1)"), 7: (MARKER, "(32, 1, 1)", "(4, 1, 1)"),
           8: (INPUT_PLANES, "(256, 1, 1)", "(32, 3, 32)")}
SOL, MWA, OCC = "GPU Speed Of Light Throughput", "Memory Workload Analysis", "Occupancy"
METRIC_ROWS = [  # (ID, section, metric, unit, value) as ncu printed them
    (0, SOL, "Duration", "ns", "1,632"),
    (1, SOL, "DRAM Throughput", "%", "27.95"), (1, SOL, "Duration", "ns", "23,936"),
    (1, MWA, "Memory Throughput", "byte/s", "1,343,465,240,641.71"),
    (1, MWA, "L1/TEX Hit Rate", "%", "22.86"), (1, MWA, "L2 Hit Rate", "%", "55.68"),
    (1, "Scheduler Statistics", "No Eligible", "%", "59.98"),
    (1, "Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycle", "6.95"),
    (1, "Launch Statistics", "Registers Per Thread", "register/thread", "160"),
    (1, OCC, "Block Limit Registers", "block", "6"), (1, OCC, "Block Limit Shared Mem", "block", "7"),
    (1, OCC, "Theoretical Occupancy", "%", "18.75"), (1, OCC, "Achieved Occupancy", "%", "17.14"),
    (4, SOL, "Duration", "ns", "1,632"),
    (5, SOL, "DRAM Throughput", "%", "29.22"), (5, SOL, "Duration", "ns", "38,304"),
    (5, "Launch Statistics", "Registers Per Thread", "register/thread", "123"),
    (5, OCC, "Block Limit Registers", "block", "2"), (5, OCC, "Block Limit Shared Mem", "block", "4"),
    (6, SOL, "Duration", "ns", "8,736"), (6, SOL, "DRAM Throughput", "%", "0.63"),
    (6, "Warp State Statistics", "Warp Cycles Per Issued Instruction", "cycle", "64.57"),
    (6, OCC, "Block Limit Registers", "block", "4"), (6, OCC, "Block Limit Shared Mem", "block", "12"),
    (7, SOL, "Duration", "ns", "1,632"),
    (8, SOL, "Duration", "ns", "37,184"), (8, MWA, "L1/TEX Hit Rate", "%", "81.59"),
    (8, OCC, "Block Limit Registers", "block", "6"), (8, OCC, "Block Limit Shared Mem", "block", "6"),
]
LONG_SCOREBOARD = ("On average, each warp of this workload spends {} cycles being stalled waiting for a scoreboard "
                   "dependency on a L1TEX (local, global, surface, texture) operation. This stall type represents "
                   "about {}% of the total average of {} cycles between issuing two instructions.")
POINTER = ("Check the Warp Stall Sampling (All Samples) table for the top stall locations in your source based on "
           "sampling data.")
CONFLICTS = ("The memory access pattern for shared {kind}s might not be optimal and causes on average a {way} - way "
             "bank conflict across all {n} shared {kind} requests.This results in {c} bank conflicts,  which "
             "represent {pct}% of the overall {w} wavefronts for shared {kind}s.")
UNCOALESCED = ("This kernel has uncoalesced global accesses resulting in a total of {} excessive sectors ({}% of the "
               "total {} sectors).")
TABLES, WARP, SOURCE = "MemoryWorkloadAnalysis_Tables", "WarpStateStats", "SourceCounters"
RULE_ROWS = [  # (ID, section, rule, type, description, speedup type, speedup)
    (1, TABLES, "SharedMemoryConflicts", "OPT",
     CONFLICTS.format(kind="store", way="5.0", n=247296, c=631131, pct="50.73", w=1243995), "global", "29.99"),
    (5, TABLES, "SharedMemoryConflicts", "OPT",
     CONFLICTS.format(kind="store", way="2.0", n=542528, c=451584, pct="40.84", w=1105664), "global", "35.1"),
    (5, WARP, "CPIStall", "OPT", LONG_SCOREBOARD.format("4.9", "30.6", "16.1"), "global", "28.3"),
    (5, WARP, "CPIStall", "INF", POINTER, "", ""),
    (5, SOURCE, "UncoalescedGlobalAccess", "OPT", UNCOALESCED.format(1826176, 50, 3638272), "global", "43.67"),
    (6, WARP, "CPIStall", "OPT", LONG_SCOREBOARD.format("52.7", "81.7", "64.6"), "global", "81.67"),
    (6, WARP, "CPIStall", "INF", POINTER, "", ""),
    (8, TABLES, "SharedMemoryConflicts", "OPT",
     CONFLICTS.format(kind="load", way="3.8", n=563200, c=661335, pct="31.08", w=2127703), "global", "26.64"),
    (8, TABLES, "SharedMemoryConflicts", "OPT",
     CONFLICTS.format(kind="store", way="4.7", n=576512, c=1704726, pct="62.80", w=2714390), "global", "53.84"),
    (8, SOURCE, "UncoalescedGlobalAccess", "OPT", UNCOALESCED.format(5832704, 78, 7482368), "global", "68.47"),
]
INDEX = [
    {"i": 1, "suite": "mobilenetv2", "label": "dw1 112x112x32 3x3/1 m1 NHWC",
     "op": "depthwise_conv2d_native_backprop_input", "dtype": "float16", "engine": "gradops-cuda"},
    {"i": 3, "suite": "mobilenetv2", "label": "dw1 112x112x32 3x3/1 m1 NHWC",
     "op": "depthwise_conv2d_native_backprop_filter", "dtype": "float16", "engine": "gradops-cuda"},
    {"i": 4, "suite": "mobilenetv2", "label": "dw1 112x112x32 3x3/1 m1 NCHW",
     "op": "depthwise_conv2d_native_backprop_input", "dtype": "float16", "engine": "gradops-cuda"},
]


def _quoted(fields) -> str:
    return ",".join(f'"{f}"' for f in fields)


def _csv_text() -> str:
    lines = ["==WARNING== Note: Running with unmodified GPU clocks. If not controlled otherwise, profiling "
             "results may be inconsistent.", "==PROF== Connected to process 20146 (/usr/bin/python3.12)",
             "", _quoted(HEADER)]
    for kid, (name, block, grid) in KERNELS.items():
        launch = (kid, 20146, "python3.12", "127.0.0.1", name, 1, 13, block, grid, 0, "9.0")
        lines += [_quoted(launch + row[1:]) + "," for row in METRIC_ROWS if row[0] == kid]
        lines += [_quoted(launch + row[1:2] + ("", "", "") + row[2:]) for row in RULE_ROWS if row[0] == kid]
    return "\n".join(lines + ["==PROF== Disconnected from process 20146", ""])


@pytest.fixture(scope="module")
def summary():
    spec = importlib.util.spec_from_file_location("ncu_full_summary", ROOT / "benchmarks" / "ncu_full_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def files(tmp_path):
    csv_path, index_path = tmp_path / "full.csv.gz", tmp_path / "index.json"
    with gzip.open(csv_path, "wt", newline="") as f:
        f.write(_csv_text())
    index_path.write_text(json.dumps(INDEX))
    return str(csv_path), str(index_path)


def test_rule_rows_have_ncu_layout():
    """The fixture itself: rule rows carry 20 fields with empty metric cells, metric rows 16."""
    rule = _csv_text().splitlines()[-2]
    assert rule.count('","') == 19 and '"SourceCounters","","","","UncoalescedGlobalAccess"' in rule


def test_launches_and_cases(summary, files):
    launches = summary.read_launches(files[0])
    assert [k["id"] for k in launches] == [0, 1, 4, 5, 6, 7, 8]
    cases = summary.by_case(launches)
    assert {i: [k["id"] for k in ks] for i, ks in cases.items()} == {1: [1], 3: [5, 6], 4: [8]}
    # "Memory Throughput" is in two sections: the key is (section, metric).
    assert summary.metric(launches[1], MWA, "Memory Throughput") == pytest.approx(1.34346524064171e12)


def test_rows(summary, files):
    rows = summary.rows(*files)
    assert [(r["case"], r["layout"], r["op"], r["kernel"]) for r in rows] == [
        ("dw1 112x112x32 3x3/1 m1 NHWC", "NHWC", "dw input grad", "input_tiled<__half,float,0,3,3,1,1,2,2>"),
        ("dw1 112x112x32 3x3/1 m1 NHWC", "NHWC", "dw filter grad", "filter_mma_nhwc<__half,3,1,0>"),
        ("dw1 112x112x32 3x3/1 m1 NHWC", "NHWC", "dw filter grad", "filter_reduce<__half,float>"),
        ("dw1 112x112x32 3x3/1 m1 NCHW", "NCHW", "dw input grad", "input_planes<__half,float,3,3,1>")]
    tiled, mma, reduce, planes = rows
    assert tiled["time (us)"] == pytest.approx(23.936)  # "23,936" ns
    assert tiled["DRAM % of peak"] == pytest.approx(27.95)
    assert (tiled["theoretical occ. %"], tiled["achieved occ. %"], tiled["regs/thread"]) == (18.75, 17.14, 160)
    assert (tiled["no eligible %"], tiled["L1 hit %"], tiled["L2 hit %"]) == (59.98, 22.86, 55.68)
    assert tiled["occupancy limiter"] == "regs" and planes["occupancy limiter"] == "regs+smem"
    assert tiled["stalls"] == [] and tiled["issue slots busy %"] is None  # no CPIStall rule; metric not in the CSV
    assert mma["stalls"] == [("Long Scoreboard", 4.9, 30.6)]
    assert reduce["stalls"] == [("Long Scoreboard", 52.7, 81.7)]
    assert reduce["warp cycles/issued inst"] == pytest.approx(64.57)
    assert tiled["bank conflicts"] == {"store": (5.0, 50.73)}
    assert planes["bank conflicts"] == {"load": (3.8, 31.08), "store": (4.7, 62.8)}
    assert reduce["bank conflicts"] == {} and reduce["uncoalesced global %"] is None
    assert (mma["uncoalesced global %"], planes["uncoalesced global %"]) == (50, 78)


def test_stall_reasons_largest_first_and_capped(summary):
    other = LONG_SCOREBOARD.replace("waiting for a scoreboard dependency on a L1TEX (local, global, surface, "
                                    "texture) operation", "after EXIT waiting for all outstanding memory operations")
    launch = {"rules": [{"rule": "CPIStall", "text": LONG_SCOREBOARD.format("4.9", "30.6", "16.1")},
                        {"rule": "CPIStall", "text": other.format("8.0", "49.7", "16.1")},
                        {"rule": "CPIStall", "text": POINTER}]}
    assert summary.stalls(launch) == [("Drain", 8.0, 49.7), ("Long Scoreboard", 4.9, 30.6)]


def test_stall_metrics_take_precedence_over_the_rule(summary):
    """With the per-reason metrics in the CSV (--metrics regex:smsp__average_warps_issue_stalled_...),
    every reason is read from them, largest first, as a share of their sum ("selected", the
    issuing state, left out), and the CPIStall rule is not used; a launch without them falls back
    to the rule."""
    prefix, suffix = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
    cmd = "Command line profiler metrics"
    launch = {"metrics": {(cmd, prefix + "long_scoreboard" + suffix): ("6.00", ""),
                          (cmd, prefix + "barrier" + suffix): ("3.00", ""),
                          (cmd, prefix + "mio_throttle" + suffix): ("1.00", ""),
                          (cmd, prefix + "selected" + suffix): ("1.00", ""),
                          (cmd, prefix + "wait" + suffix): ("1.00", ""),
                          ("Warp State Statistics", "Warp Cycles Per Issued Instruction"): ("11.00", "cycle")},
              "rules": [{"rule": "CPIStall", "text": LONG_SCOREBOARD.format("4.9", "30.6", "16.1")}]}
    assert summary.stalls(launch) == [("Long Scoreboard", 6.0, pytest.approx(54.5454, rel=1e-4)),
                                      ("Barrier", 3.0, pytest.approx(27.2727, rel=1e-4)),
                                      ("Mio Throttle", 1.0, pytest.approx(9.0909, rel=1e-4)),
                                      ("Wait", 1.0, pytest.approx(9.0909, rel=1e-4))]
    launch["metrics"] = {k: v for k, v in launch["metrics"].items() if not k[1].startswith(prefix)}
    assert summary.stalls(launch) == [("Long Scoreboard", 4.9, 30.6)]


def test_table_and_cli(summary, files):
    text = summary.table(*files)
    lines = text.splitlines()
    assert len(lines) == 2 + 4 and lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert "| 23.9 |" in lines[2] and "| 18.8 (regs) | 160 |" in lines[2] and "store 5.0-way 51%" in lines[2]
    assert "Long Scoreboard 52.7 (82%)" in lines[4]
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_full_summary.py"), *files],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith(text) and "`Occupancy / Achieved Occupancy`" in out


@pytest.mark.skipif(not (RESULTS / "full_sections.csv.gz").exists(), reason="the H200 run's CSV is not here")
def test_the_h200_run(summary):
    rows = summary.rows(str(RESULTS / "full_sections.csv.gz"), str(RESULTS / "full_sections_index.json"))
    assert len(rows) == 23  # 18 calls: 5 of them two kernels (filter gradient + reduction, select + gather)
    assert rows[0]["time (us)"] == pytest.approx(23.936) and rows[0]["issue slots busy %"] == pytest.approx(32.04)
