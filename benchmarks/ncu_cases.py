"""One call per benchmark case and engine under Nsight Compute, for benchmarks/ncu_table.py.

Each case is called once outside the profiled range (compile, cuDNN build), then once inside
it (cudaProfilerStart/Stop, so run ncu with ``--profile-from-start off``), preceded by a marker
kernel whose grid size is the case's index.  Writes the index JSON.  On a GPU:

    ncu --profile-from-start off --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        python benchmarks/ncu_cases.py [SUITE-SUBSTRING] [INDEX.json] \
        [--suites mobilenetv2,efficientnet,fractional,resnet50] [--dtypes float16,float32] \
        [--engines gradops-cuda,torch,gradops-cudnn] [--ops SUBSTRING] [--labels A,B] \
        [--paths tiled,planes,transpose,sync,async,cells] [--time-limit S] > ncu.csv

Defaults: the three memory-bound suites in float16 and float32 on gradops-cuda and (depthwise)
PyTorch, and ResNet-50 NHWC float16 on gradops-cuda and gradops-cudnn.  ``--engines`` restricts
or extends that (gradops-cudnn on the depthwise cases too when named).  ``--paths`` adds, for
each depthwise input-gradient case, an engine ``gradops-cuda:PATH`` per named kernel path that
can run the case (the launcher's ``path=``), and for each filter-gradient case one per named
staging path of the tiled kernel (sync, async: its ``async_copies=``): an A/B of kernels on
one device in one run.
"""
import argparse, json, sys, time
import numpy as np, cupy, ml_dtypes  # noqa: F401 (ml_dtypes registers bfloat16 with NumPy)
from gradops.bench import suites
from gradops.bench.engines import GradopsGpuEngine, TorchEngine, make_inputs

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("only", nargs="?", help="keep the suites whose name holds this")
parser.add_argument("index", nargs="?", default="/tmp/ncu_index.json")
parser.add_argument("--suites", default="mobilenetv2,efficientnet,fractional,resnet50")
parser.add_argument("--dtypes", default="float16,float32", help="of the memory-bound suites")
parser.add_argument("--engines", default=None, help="default: see the module docstring")
parser.add_argument("--ops", default=None, help="keep the ops whose name holds this")
parser.add_argument("--labels", default=None,
                    help="comma-separated: keep the cases whose label holds one of these (e.g. 'dw1 ,dw8 ')")
parser.add_argument("--paths", default=None,
                    help="comma-separated depthwise input-gradient kernel paths (the launcher's PATHS: tiled,planes,"
                         "planes_staged,planes_direct,mma,mma_runs,mma_nhwc,direct,transpose), filter-"
                         "gradient paths (sync,async: the tiled kernel's staging; mma) and the fractional pooling gradients' "
                         "kernels (gather,cells), "
                         "each timed as engine gradops-cuda:PATH on the cases of its op that it can run")
parser.add_argument("--time-limit", type=float, default=None,
                    help="seconds: start no case after this (ncu prints its CSV only when the program exits)")
args = parser.parse_args()
chosen = set(args.engines.split(",")) if args.engines else None
# Which --paths each op takes: the input gradient's kernel paths, the filter gradient's staging,
# the fractional pooling gradients' kernels: the launchers' own lists (the engine's), so that a
# path a launcher adds is timed when named (a fixed list here dropped planes_staged, session 82's,
# without a word).
PATHS_OF = {op: GradopsGpuEngine("cuda")._paths(op) for op in suites.DEPTHWISE_OPS + suites.FRACTIONAL_OPS}
unknown = set(args.paths.split(",")) - {p for paths in PATHS_OF.values() for p in paths} if args.paths else set()
if unknown:
    sys.exit(f"--paths: no op's launcher has {sorted(unknown)} (paths: {PATHS_OF})")

marker = cupy.RawKernel('extern "C" __global__ void gradops_case_marker() {}', "gradops_case_marker")
stream = cupy.cuda.Stream(non_blocking=True); stream.use()
plan = []
for name in args.suites.split(","):
    for case in suites.suite(name):
        if name == "resnet50":
            if case.data_format != "NHWC":
                continue
            dtypes, default = ("float16",), ("gradops-cuda", "gradops-cudnn")
        else:
            dtypes = args.dtypes.split(",")
            default = ("gradops-cuda", "torch") if case.op.startswith("depthwise") else ("gradops-cuda",)
        engines = [e for e in (default if chosen is None else sorted(chosen))
                   if e != "torch" or case.op.startswith("depthwise")]
        if args.paths and case.op in PATHS_OF:
            engines += [f"gradops-cuda:{p}" for p in args.paths.split(",") if p in PATHS_OF[case.op]]
        plan += [(case, dt, e) for dt in dtypes for e in engines]
torch_engine = TorchEngine(stream_ptr=stream.ptr) if any(e == "torch" for _, _, e in plan) else None
index, inputs = [], {}
deadline = time.monotonic() + args.time_limit if args.time_limit else None
for i, (case, dt, eng) in enumerate(plan):
    if deadline is not None and time.monotonic() > deadline:
        print(f"time limit: stopped before case {i + 1} of {len(plan)}", file=sys.stderr)
        break
    if (args.only and args.only not in case.suite) or (args.ops and args.ops not in case.op):
        continue
    if args.labels and not any(part in case.label for part in args.labels.split(",")):
        continue
    dtype = np.dtype(dt)
    key = (case.suite, case.label, case.op, dt)
    if key not in inputs:  # the engines of one case and dtype share its inputs
        inputs = {key: make_inputs(case, dtype, np.random.default_rng(0))}
    arrays = inputs[key]
    if eng == "torch":
        e = torch_engine
    elif ":" in eng:
        e = GradopsGpuEngine("cuda", path=eng.split(":")[1])
    else:
        e = GradopsGpuEngine(eng.split("-")[1])
    try:
        fn = e.prepare(case, dtype, arrays)
        fn(); stream.synchronize()  # compile / build / autotune outside the marked region
        cupy.cuda.runtime.profilerStart(); marker((i + 1,), (32,), ()); fn(); stream.synchronize(); cupy.cuda.runtime.profilerStop()
        index.append(dict(i=i + 1, suite=case.suite, label=case.label, op=case.op, dtype=dt, engine=eng))
    except Exception as exc:
        print("skip", i, case.label, eng, type(exc).__name__, exc, file=sys.stderr)
    e.release() if eng != "torch" else None
    json.dump(index, open(args.index, "w"))  # after every case: a run stopped early keeps its index
print(len(index), "cases", file=sys.stderr)
