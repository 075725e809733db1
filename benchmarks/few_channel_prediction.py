"""Predicted time of conv2d_backprop_input's few-channel kernel on ResNet-50's stem (conv1,
7x7/2, 3 -> 64 channels) on an H100 (**predicted, not measured**).

The kernel (``conv2d_backprop_input_few_channels`` in cuda_src/conv2d_backprop_input.cu) has
one thread per input position and loops over the filter taps that reach it, and for each tap
over out_backprop's channels in 16-byte chunks.  This script compiles the instantiation for
sm_90 (NVRTC, no GPU), takes from its SASS the innermost loop (the channel loop) and the
channels one of its iterations covers (its 16-byte global loads x the elements per load),
and counts, per warp of the launcher's grid, the taps of its busiest lane.  Warp-instructions
= per warp: taps x (channel-loop iterations x loop instructions + the tap loop's own
instructions) + the rest of the kernel's SASS once (prologue, staging, epilogue: an upper
bound of the straight-line code).  Time = warp-instructions / (SMs x 4 schedulers x clock x
issue efficiency), printed at issue efficiency 1.0 and at the efficiency ``--efficiency``.

    PYTHONPATH=. python benchmarks/few_channel_prediction.py [--batch 32] [--dtype float16]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
from collections import Counter

import numpy as np

from gradops.backends.cuda import _conv_igemm as ig
from gradops.backends.cuda import _sass
from gradops.bench import suites

SMS, SCHEDULERS, CLOCK_HZ = 132, 4, 1.98e9
LABEL = "predicted, not measured"
SOURCE = "conv2d_backprop_input.cu"


def loop_figures(expression: str, arch: str = "sm_90") -> dict:
    """The channel loop's instructions and channels per iteration, the tap loop's own
    instructions (its body less the channel loop's), and the kernel's other instructions."""
    (kernel,) = [k for k in _sass.compile_kernels(archs=(arch,), sources=[SOURCE], only=[expression])
                 if k.expression == expression]
    cfg = kernel.cfg
    deepest = max(cfg.loops, key=lambda lp: lp.depth)
    inner = cfg.loop_instructions(deepest)
    parent = cfg.loop_instructions(deepest.parent) if deepest.parent else inner
    loads = Counter(k for x in inner if (k := _sass.memory_kind(x)))
    return {"channel_loop": len(inner), "loads_128": loads.get("LDG.128", 0), "tap_loop_rest": len(parent) - len(inner),
            "rest": len(kernel.function.instructions) - len(parent), "registers": kernel.ptxas["registers"],
            "memory": dict(loads)}


def stem_geometry(batch: int):
    """The ResNet-50 suite's conv1 input gradient (NHWC) at ``batch``."""
    case = next(c for c in suites.suite("resnet50") if c.label.startswith("conv1")
                and c.op == "conv2d_backprop_input" and "NHWC" in c.label)
    return dataclasses.replace(case.geometry(), batch=batch)


def _taps(size: int, out: int, pad: int, stride: int, dilation: int, filter_size: int) -> np.ndarray:
    i = np.arange(size)[:, None] + pad - np.arange(filter_size)[None, :] * dilation
    return ((i % stride == 0) & (i >= 0) & (i // stride < out)).sum(axis=1)


def warp_instructions(g, figures: dict, itemsize: int) -> tuple[float, int]:
    """(warp-instructions of the whole grid, warps) for the launcher's grid on geometry ``g``."""
    launcher = importlib.import_module("gradops.backends.cuda.conv2d_backprop_input")
    threads = launcher.FEW_CHANNEL_THREADS
    row_taps = _taps(g.in_rows, g.out_rows, g.pad_top, g.stride_rows, g.dilation_rows, g.filter_rows)
    col_taps = _taps(g.in_cols, g.out_cols, g.pad_left, g.stride_cols, g.dilation_cols, g.filter_cols)
    # Column slots phase by phase, as the kernel assigns them; past the row's end: idle.
    per_phase = ig.ceil_div(g.in_cols, g.stride_cols)
    slots = [pc + j * g.stride_cols for pc in range(g.stride_cols) for j in range(per_phase)]
    slots = [w if w < g.in_cols else None for w in slots]
    slots += [None] * (-len(slots) % threads)
    channels_per_iteration = figures["loads_128"] * 16 // itemsize
    iterations = ig.ceil_div(g.out_depth, channels_per_iteration)
    per_tap = iterations * figures["channel_loop"] + figures["tap_loop_rest"]
    total, warps = 0.0, 0
    for h in range(g.in_rows):
        for w0 in range(0, len(slots), 32):
            lanes = [w for w in slots[w0:w0 + 32] if w is not None]
            taps = max((int(row_taps[h] * col_taps[w]) for w in lanes), default=0)
            total += figures["rest"] + taps * per_tap
            warps += 1
    return total * g.batch, warps * g.batch


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32"))
    ap.add_argument("--efficiency", type=float, default=0.5,
                    help="issue efficiency (benchmarks/conv_table.py fits 0.50 at 16 warps per SM)")
    a = ap.parse_args(argv)
    launcher = importlib.import_module("gradops.backends.cuda.conv2d_backprop_input")
    g = stem_geometry(a.batch)
    dtype = np.dtype(suites.DTYPES[a.dtype])
    expression = launcher._few_channels_name(dtype, g.in_depth)
    figures = loop_figures(expression)
    total, warps = warp_instructions(g, figures, dtype.itemsize)
    rate = SMS * SCHEDULERS * CLOCK_HZ
    print(f"# conv1 dgrad, batch {a.batch}, {a.dtype}: few-channel kernel on the H100 ({LABEL})")
    print(f"- kernel `{expression}`, sm_90: {figures['registers']} registers; channel loop "
          f"{figures['channel_loop']} instructions per {figures['loads_128'] * 16 // dtype.itemsize} channels "
          f"(memory {figures['memory']}), tap loop {figures['tap_loop_rest']} more, rest of the kernel "
          f"{figures['rest']}")
    print(f"- {warps} warps, {total / 1e6:.0f} M warp-instructions")
    print(f"- issue-bound time: {total / rate * 1e3:.3f} ms at issue efficiency 1.0, "
          f"{total / rate / a.efficiency * 1e3:.3f} ms at {a.efficiency:.2f} "
          f"({SMS} SMs x {SCHEDULERS} schedulers x {CLOCK_HZ / 1e9:.2f} GHz)")
    dram = (math.prod(g.out_backprop_shape) + math.prod(g.input_shape)) * dtype.itemsize / 3.35e12
    print(f"- DRAM floor (out_backprop read once, the gradient written once, 3.35 TB/s): {dram * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
