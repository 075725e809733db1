"""One call per benchmark case and engine under Nsight Compute, for benchmarks/ncu_table.py.

Each case is called once outside the profiled range (compile, cuDNN build), then once inside
it (cudaProfilerStart/Stop, so run ncu with ``--profile-from-start off``), preceded by a marker
kernel whose grid size is the case's index.  Writes the index JSON.  On a GPU:

    ncu --profile-from-start off --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        python benchmarks/ncu_cases.py [SUITE-SUBSTRING] [INDEX.json] > ncu.csv
"""
import json, sys
import numpy as np, cupy, ml_dtypes
from gradops.bench import suites
from gradops.bench.engines import GradopsGpuEngine, TorchEngine, make_inputs

marker = cupy.RawKernel('extern "C" __global__ void gradops_case_marker() {}', "gradops_case_marker")
stream = cupy.cuda.Stream(non_blocking=True); stream.use()
plan = []
for name in ("mobilenetv2", "efficientnet", "fractional"):
    for case in suites.suite(name):
        for dt in ("float16", "float32"):
            engines = ["gradops-cuda"] + (["torch"] if case.op.startswith("depthwise") else [])
            plan += [(case, dt, e) for e in engines]
for case in suites.suite("resnet50"):
    if case.data_format == "NHWC":
        plan += [(case, "float16", e) for e in ("gradops-cuda", "gradops-cudnn")]
only = sys.argv[1] if len(sys.argv) > 1 else None
torch_engine = TorchEngine(stream_ptr=stream.ptr)
index = []
for i, (case, dt, eng) in enumerate(plan):
    if only and only not in case.suite:
        continue
    dtype = np.dtype(dt)
    arrays = make_inputs(case, dtype, np.random.default_rng(0))
    e = torch_engine if eng == "torch" else GradopsGpuEngine(eng.split("-")[1])
    try:
        fn = e.prepare(case, dtype, arrays)
        fn(); stream.synchronize()  # compile / build / autotune outside the marked region
        cupy.cuda.runtime.profilerStart(); marker((i + 1,), (32,), ()); fn(); stream.synchronize(); cupy.cuda.runtime.profilerStop()
        index.append(dict(i=i + 1, suite=case.suite, label=case.label, op=case.op, dtype=dt, engine=eng))
    except Exception as exc:
        print("skip", i, case.label, eng, type(exc).__name__, exc, file=sys.stderr)
    e.release() if eng != "torch" else None
json.dump(index, open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/ncu_index.json", "w"))
print(len(index), "cases")
