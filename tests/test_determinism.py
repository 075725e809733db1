"""With default options every GPU op is bitwise reproducible: across runs and across streams.

gradops' default is ``deterministic=True`` (no floating-point atomics in our kernels, only
cuDNN engines without the non-deterministic note).  Each op runs with default backend
selection on CuPy arrays twice on the default stream and once on each of two new streams;
all results must have identical bits.  The shapes are big enough that a kernel splitting the
reduction over blocks (where atomics would reorder sums) is exercised.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import gradops

pytestmark = pytest.mark.gpu

S1 = [1, 1, 1, 1]
S2 = [1, 2, 2, 1]


def _calls(rng, dtype):
    """(name, fn, args, kwargs) for every public GPU op, on host arrays to be moved to the GPU."""
    r = lambda *shape: rng.standard_normal(shape).astype(dtype)  # noqa: E731
    x, dy, w = r(8, 33, 31, 16), r(8, 33, 31, 24), r(3, 3, 16, 24)
    dyg, wg = r(8, 17, 16, 24), r(3, 3, 4, 24)  # stride 2, 4 groups
    wd, dyd = r(3, 3, 16, 2), r(8, 33, 31, 32)
    pool_dy = r(8, 11, 10, 16)
    rows, cols = np.array([0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 33]), np.arange(0, 31, 3)
    return [
        ("conv2d_backprop_filter", gradops.conv2d_backprop_filter, (x, [3, 3, 16, 24], dy, S1, "SAME"), {}),
        ("conv2d_backprop_filter-grouped-s2", gradops.conv2d_backprop_filter, (x, [3, 3, 4, 24], dyg, S2, "SAME"), {}),
        ("conv2d_backprop_input", gradops.conv2d_backprop_input, ([8, 33, 31, 16], w, dy, S1, "SAME"), {}),
        ("conv2d_backprop_input-grouped-s2", gradops.conv2d_backprop_input, ([8, 33, 31, 16], wg, dyg, S2, "SAME"),
         {}),
        ("conv2d_backprop_filter_v2", gradops.conv2d_backprop_filter_v2, (x, w, dy, S1, "SAME"), {}),
        ("conv2d_backprop_input_v2", gradops.conv2d_backprop_input_v2, (x, w, dy, S1, "SAME"), {}),
        ("conv2d", gradops.conv2d, (x, w, S1, "SAME"), {}),
        ("depthwise_conv2d_native_backprop_input", gradops.depthwise_conv2d_native_backprop_input,
         ([8, 33, 31, 16], wd, dyd, S1, "SAME"), {}),
        ("depthwise_conv2d_native_backprop_filter", gradops.depthwise_conv2d_native_backprop_filter,
         (x, list(wd.shape), dyd, S1, "SAME"), {}),
        ("depthwise_conv2d_native", gradops.depthwise_conv2d_native, (x, wd, S1, "SAME"), {}),
        ("fractional_avg_pool_grad", gradops.fractional_avg_pool_grad,
         ([8, 33, 31, 16], pool_dy, rows, cols, True), {}),
        ("fractional_avg_pool", gradops.fractional_avg_pool, (x, rows, cols, True), {}),
        ("fractional_max_pool", gradops.fractional_max_pool, (x, rows, cols, True), {}),
    ]


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.float64],
                         ids=["float16", "bfloat16", "float32", "float64"])
def test_every_gpu_op_is_bitwise_reproducible_across_runs_and_streams(dtype):
    cupy = pytest.importorskip("cupy")
    assert gradops.get_options().deterministic, "the default must be deterministic"
    rng = np.random.default_rng(11)
    unsupported = []
    for name, fn, args, kw in _calls(rng, dtype):
        # Tensors go to the GPU; size vectors and pooling sequences stay host lists.
        moved = [cupy.asarray(a) if isinstance(a, np.ndarray) and a.ndim == 4 else a for a in args]
        # The uploads are queued on the current stream; a non-blocking stream must wait for them
        # (CUDA's rule for any work across streams: an H200 run read inputs not yet uploaded).
        uploaded = cupy.cuda.get_current_stream().record()
        try:
            first = fn(*moved, **kw)
        except gradops.BackendUnavailableError as exc:
            unsupported.append(f"{name}: {exc}")
            continue
        except gradops.InvalidArgumentError as exc:  # e.g. a dtype the op does not take
            unsupported.append(f"{name}: {exc}")
            continue
        results = [first, fn(*moved, **kw)]
        for _ in range(2):
            stream = cupy.cuda.Stream(non_blocking=True)
            stream.wait_event(uploaded)
            with stream:
                results.append(fn(*moved, **kw))
            stream.synchronize()
        bits = [cupy.asnumpy(r).view(np.uint8) for r in results]
        for i, b in enumerate(bits[1:], 1):
            assert np.array_equal(bits[0], b), f"{name}: run {i} differs from run 0 in its bits"
    if len(unsupported) == len(_calls(rng, dtype)):
        pytest.skip("no GPU backend computes these ops yet: " + "; ".join(unsupported))
