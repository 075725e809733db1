"""Per-call cost of gradops on a GPU, for a few benchmark cases: the CUDA-event time of one call
(as the benchmark measures it), the wall time per call over 200 back-to-back calls without
synchronising, PyTorch's back-to-back time for the convolutions, and a cProfile of gradops'
host side.  ``python benchmarks/host_cost.py`` on a GPU machine."""
import cProfile, io, pstats, sys, time
import numpy as np, cupy
from gradops.bench import suites
from gradops.bench.engines import GradopsGpuEngine, TorchEngine, make_inputs

PICK = [("mobilenetv2", "dw1 112x112x32 3x3/1 m1 NHWC", "float16"),
        ("mobilenetv2", "dw2 112x112x96 3x3/2 m1 NHWC", "float32"),
        ("fractional", "32x112x112x64 ratio 1.44 disjoint", "float16"),
        ("fractional", "32x56x56x256 ratio 1.44 disjoint", "float32"),
        ("resnet50", "conv2 3x3 64 NHWC", "float16"),
        ("resnet50", "conv2 1x1 64->256 NCHW", "float16")]
mode = sys.argv[1] if len(sys.argv) > 1 else "time"
cases = []
for suite_name, label, dtype in PICK:
    for case in suites.suite(suite_name):
        if case.label == label:
            cases.append((case, np.dtype(dtype) if dtype != "bfloat16" else None, dtype))
stream = cupy.cuda.Stream(non_blocking=True); stream.use()
for case, _, dtype_name in cases:
    import ml_dtypes
    dtype = np.dtype(ml_dtypes.bfloat16) if dtype_name == "bfloat16" else np.dtype(dtype_name)
    arrays = make_inputs(case, dtype, np.random.default_rng(0))
    for backend in (["cuda", "cudnn"] if "conv" in case.op and "depthwise" not in case.op else ["cuda"]):
        eng = GradopsGpuEngine(backend)
        fn = eng.prepare(case, dtype, arrays)
        for _ in range(1 if mode == "ncu" else 5): fn()
        stream.synchronize()
        if mode == "ncu":
            cupy.cuda.runtime.profilerStart() if False else None
            fn(); stream.synchronize(); continue
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        ev = []
        for _ in range(20):
            a.record(stream); fn(); b.record(stream); b.synchronize(); ev.append(cupy.cuda.get_elapsed_time(a, b))
        n = 200; t = time.perf_counter()
        for _ in range(n): fn()
        stream.synchronize(); wall = (time.perf_counter() - t) / n * 1e3
        pr = cProfile.Profile(); pr.enable()
        for _ in range(100): fn()
        pr.disable(); stream.synchronize()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(14)
        print(f"### {case.suite} | {case.label} | {case.op} | {dtype_name} | gradops-{backend}: event {np.median(ev):.3f} ms, back-to-back wall {wall:.3f} ms/call")
        print("\n".join(l for l in s.getvalue().splitlines()[6:] if l.strip())[:3500])
    if mode == "time" and "conv" in case.op:
        try:
            t_eng = TorchEngine(stream_ptr=stream.ptr)
            ok, why = t_eng.available()
            if ok and t_eng.supports(case, dtype)[0]:
                fn = t_eng.prepare(case, dtype, arrays)
                for _ in range(5): fn()
                stream.synchronize(); n = 200; t = time.perf_counter()
                for _ in range(n): fn()
                stream.synchronize(); import torch; torch.cuda.synchronize()
                print(f"### torch back-to-back wall {(time.perf_counter()-t)/n*1e3:.3f} ms/call ({case.label} {dtype_name})")
        except Exception as exc:
            print("torch:", exc)
