"""Work and traffic of a case, the devices' peaks, and the roofline.

FLOPs count a multiply-add as 2 (the forward convolution's count, which each gradient
repeats, the depthwise ones included with groups = in_depth): 2 * N * out_rows * out_cols *
filter_rows * filter_cols * in_depth * out_depth / groups.  Fractional pooling has none (a
share-add per cell, or a comparison and an add for max: no floating-point work to speak of).
Bytes are the compulsory traffic: every tensor the op reads once plus the gradient it
writes once (fractional max pooling reads orig_input, orig_output and out_backprop).
Pooling sequences are left out (a few hundred int64s against megabytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._geometry import Conv2DGeometry, FractionalPoolGeometry
from .suites import (CONV_FILTER, CONV_INPUT, DEPTHWISE_FILTER, DEPTHWISE_INPUT, DEPTHWISE_OPS, FRACTIONAL,
                     FRACTIONAL_FORWARD_OPS, FRACTIONAL_MAX, POOLING_OPS, Case)

TERA = 1e12
GIGA = 1e9


def _count(shape) -> int:
    return math.prod(int(d) for d in shape)


def flops(case: Case, geometry: Conv2DGeometry | FractionalPoolGeometry) -> int | None:
    """FLOPs of the convolution gradients; None for fractional pooling (no meaningful count)."""
    if case.op in POOLING_OPS:
        return None
    return geometry.flops


def result_bytes(case: Case, geometry: Conv2DGeometry | FractionalPoolGeometry, itemsize: int) -> int:
    """Bytes of the op's result tensor (the tensor :func:`bytes_moved` counts written): the input
    gradient, the filter gradient, or the forward pooling's output."""
    g = geometry
    if case.op in FRACTIONAL_FORWARD_OPS:
        return itemsize * _count(g.output_shape)
    if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
        return itemsize * _count(g.filter_shape)
    return itemsize * _count(g.input_shape)  # the input gradients, fractional pooling's included


def bytes_moved(case: Case, geometry: Conv2DGeometry | FractionalPoolGeometry, itemsize: int) -> int:
    """Compulsory bytes: tensors read once plus the result written once."""
    if case.op in FRACTIONAL_FORWARD_OPS:  # value read, output written
        return itemsize * (_count(geometry.input_shape) + _count(geometry.output_shape))
    if case.op == FRACTIONAL:  # out_backprop read, input gradient written
        return itemsize * (_count(geometry.output_shape) + _count(geometry.input_shape))
    if case.op == FRACTIONAL_MAX:  # orig_input, orig_output, out_backprop read, input gradient written
        return itemsize * 2 * (_count(geometry.output_shape) + _count(geometry.input_shape))
    g = geometry
    if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
        tensors = (g.input_shape, g.out_backprop_shape, g.filter_shape)  # read, read, written
    elif case.op in (CONV_INPUT, DEPTHWISE_INPUT):
        tensors = (g.filter_shape, g.out_backprop_shape, g.input_shape)  # read, read, written
    else:
        raise ValueError(f"unknown op {case.op}")
    return itemsize * sum(_count(s) for s in tensors)


#: Ops judged against bandwidth rather than FLOP/s (depthwise and pooling: <~10 FLOP/byte).
MEMORY_BOUND_OPS = DEPTHWISE_OPS + POOLING_OPS


def memory_bound(case: Case) -> bool:
    """Whether ``case`` is judged against bandwidth (:data:`MEMORY_BOUND_OPS`)."""
    return case.op in MEMORY_BOUND_OPS


# --------------------------------------------------------------------------- peaks


@dataclass(frozen=True)
class Peaks:
    """Dense peak throughput (FLOP/s) per math mode and memory bandwidth (bytes/s)."""

    device: str
    fp16_tensor: float
    bf16_tensor: float
    tf32_tensor: float
    fp32: float
    fp64: float  # the best FP64 rate (FP64 tensor cores where the GPU has them)
    bandwidth: float
    source: str

    def compute(self, dtype: np.dtype, allow_tf32: bool) -> float:
        name = np.dtype(dtype).name
        if name == "float16":
            return self.fp16_tensor
        if name == "bfloat16":
            return self.bf16_tensor
        if name == "float32":
            return self.tf32_tensor if allow_tf32 else self.fp32
        return self.fp64


def _sparse_to_dense(tflops_with_sparsity: float) -> float:
    """NVIDIA's datasheets quote tensor-core rates "with sparsity"; dense math runs at half."""
    return tflops_with_sparsity / 2 * TERA


# NVIDIA datasheets, TFLOP/s (tensor rates marked * there are with 2:4 sparsity) and TB/s:
# - H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/): H100 SXM: FP64 34,
#   FP64 Tensor 67, FP32 67, TF32 989*, BF16/FP16 1979*, 3.35 TB/s; H100 PCIe: 26, 51, 51,
#   756*, 1513*, 2 TB/s; H100 NVL: 30, 60, 60, 835*, 1671*, 3.9 TB/s.
# - H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/): H200 SXM: 34, 67, 67,
#   989*, 1979*, 4.8 TB/s; H200 NVL: 30, 60, 60, 835*, 1671*, 4.8 TB/s.
# - A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100/): FP64 9.7, FP64 Tensor
#   19.5, FP32 19.5, TF32 312*, BF16/FP16 624*; 80GB SXM 2039 GB/s, 80GB PCIe 1935 GB/s,
#   40GB (SXM and PCIe) 1555 GB/s.
def _peaks(device, fp64_tensor, fp32, tf32_sparse, half_sparse, tb_per_s, source) -> Peaks:
    return Peaks(device, _sparse_to_dense(half_sparse), _sparse_to_dense(half_sparse),
                 _sparse_to_dense(tf32_sparse), fp32 * TERA, fp64_tensor * TERA, tb_per_s * TERA, source)


_H100 = "NVIDIA H100 Tensor Core GPU datasheet"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet"
_A100 = "NVIDIA A100 Tensor Core GPU datasheet"
KNOWN_PEAKS = {
    "H100 SXM": _peaks("H100 SXM", 67, 67, 989, 1979, 3.35, _H100),
    "H100 PCIe": _peaks("H100 PCIe", 51, 51, 756, 1513, 2.0, _H100),
    "H100 NVL": _peaks("H100 NVL", 60, 60, 835, 1671, 3.9, _H100),
    "H200 SXM": _peaks("H200 SXM", 67, 67, 989, 1979, 4.8, _H200),
    "H200 NVL": _peaks("H200 NVL", 60, 60, 835, 1671, 4.8, _H200),
    "A100 SXM 80GB": _peaks("A100 SXM 80GB", 19.5, 19.5, 312, 624, 2.039, _A100),
    "A100 PCIe 80GB": _peaks("A100 PCIe 80GB", 19.5, 19.5, 312, 624, 1.935, _A100),
    "A100 40GB": _peaks("A100 40GB", 19.5, 19.5, 312, 624, 1.555, _A100),
}

# (substrings that must all appear in the CUDA device name, table key); first match wins.
_NAME_RULES = (
    (("H200", "NVL"), "H200 NVL"),
    (("H200",), "H200 SXM"),
    (("H100", "NVL"), "H100 NVL"),
    (("H100", "PCIE"), "H100 PCIe"),
    (("H100",), "H100 SXM"),  # the SXM part reports itself as "NVIDIA H100 80GB HBM3"
    (("A100", "80GB", "PCIE"), "A100 PCIe 80GB"),
    (("A100", "80GB"), "A100 SXM 80GB"),
    (("A100",), "A100 40GB"),
)


def peaks_for(device_name: str) -> Peaks | None:
    """The table entry for a CUDA device name, or None (unknown GPU, or a MIG slice of one)."""
    upper = device_name.upper()
    if "MIG" in upper.split():
        return None  # a MIG instance has a fraction of the SMs and bandwidth
    for needles, key in _NAME_RULES:
        if all(n in upper for n in needles):
            return KNOWN_PEAKS[key]
    return None


def roofline_time(work: int | None, traffic: int, compute_peak: float, bandwidth: float) -> float:
    """Shortest time the device allows: the slower of doing the math and moving the bytes."""
    t_math = (work or 0) / compute_peak
    return max(t_math, traffic / bandwidth)


def throughput(case: Case, work: int | None, traffic: int, seconds: float, dtype, peaks: Peaks | None,
               allow_tf32: bool) -> dict:
    """TFLOP/s, GB/s, % of the relevant peak and % of the roofline for one timed run."""
    out = {"tflops": None if work is None else work / seconds / TERA, "gbps": traffic / seconds / GIGA,
           "pct_peak": None, "pct_roofline": None}
    if peaks is not None:
        compute_peak = peaks.compute(dtype, allow_tf32)
        if memory_bound(case):
            out["pct_peak"] = 100.0 * traffic / seconds / peaks.bandwidth
        else:
            out["pct_peak"] = 100.0 * work / seconds / compute_peak
        out["pct_roofline"] = 100.0 * roofline_time(work, traffic, compute_peak, peaks.bandwidth) / seconds
    return out
