"""One tensor-core dW case on the GPU, with a watchdog: python diag_one.py DTYPE M CASE_INDEX"""
import faulthandler, sys, time
sys.path.insert(0, "tests")
faulthandler.dump_traceback_later(12, exit=True)
import numpy as np, ml_dtypes, cupy
import gradops
import test_depthwise_conv2d_native_backprop_filter as T
from conftest import to_gpu
dt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[sys.argv[1]]
m, i = int(sys.argv[2]), int(sys.argv[3])
(n, c, h, w), filt, padding, pads, per_slice = T.MMA_CASES[i]
pairs = T.NO_PADS if pads is None else ((pads[0], pads[1]), (pads[2], pads[3]))
rng = np.random.default_rng(0)
kwargs, x, dy, case = T.cuda_case(rng, x_shape=(n, h, w, c), filt_hw=(filt, filt), multiplier=m,
                                  padding=padding, pads=pairs, data_format="NCHW", dtype=dt)
g = T.geometry_of(kwargs)
xg, dyg = to_gpu(kwargs["input"]), to_gpu(kwargs["out_backprop"])
cupy.cuda.runtime.deviceSynchronize()
chunk = T.cuda_launcher.mma_chunk(g, dt, (xg, dyg))
t = time.perf_counter()
got = T.cuda_launcher.depthwise_conv2d_native_backprop_filter(g, xg, dyg, mma=True, images_per_slice=per_slice)
cupy.cuda.runtime.deviceSynchronize()
ref = gradops.depthwise_conv2d_native_backprop_filter(**kwargs, backend="numpy")
err = np.abs(cupy.asnumpy(got).astype(np.float64) - np.asarray(ref).astype(np.float64)).max()
print(f"OK {sys.argv[1]} m{m} case{i} {T.MMA_CASES[i]} vec{chunk} {time.perf_counter()-t:.3f}s maxerr {err:.3g}")
