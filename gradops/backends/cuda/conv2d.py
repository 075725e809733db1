"""Launcher for cuda_src/conv2d.cu: the forward (grouped) conv2d, and depthwise_conv2d_native.

The forward op is the gradients' adjoint (the GPU adjoint tests and ``python -m gradops check``
use it).  Two paths, as for the gradients: ``direct`` (any layout and size, one thread per
output element) and ``tiled`` (NHWC implicit GEMM, NCHW transposed to NHWC and back; tensor
cores for float16/bfloat16, exact SIMT FMA for float32 unless
``gradops.options(allow_tf32=True)``, SIMT for float64).
"""

from __future__ import annotations

import numpy as np

from . import _conv_igemm as ig
from . import _runtime

SOURCE = "conv2d.cu"


def _direct_name(dtype, layout: str) -> str:
    return f"gradops::conv2d_direct<{ig.template_types(dtype)}, {ig.LAYOUT[layout]}>"


def _tiled_name(dtype, kind: int, vector: bool) -> str:
    return f"gradops::conv2d_igemm<{ig.template_types(dtype)}, {kind}, {ig.cpp_bool(vector)}>"


def instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """The name expressions compute capability ``arch`` can run (None: every one)."""
    return {SOURCE: ig.kernel_names(_direct_name, _tiled_name, arch=arch)}


def _gemm_sizes(g) -> tuple[int, int, int]:
    """(M, N, reduction) of one group's GEMM: output positions, out channels, taps x in channels."""
    return (g.batch * g.out_rows * g.out_cols, g.out_depth // g.groups,
            g.filter_rows * g.filter_cols * g.filter_in_depth)


def pick_path(g, dtype, path: str | None = None) -> str:
    """The caller's ``path`` if valid, else tiled where it can run and the GEMM is at least
    ``TILED_MIN_DIM`` wide both ways, else direct (``_conv_igemm.pick_path``)."""
    return ig.pick_path(path, tiled_eligible(g, dtype), *_gemm_sizes(g)[:2])


def tiled_eligible(g, dtype) -> bool:
    m, n, red = _gemm_sizes(g)
    bn = ig.TILES[(np.dtype(dtype), ig.math_kind(dtype))][1]
    return (ig.fits_int32(m, n, red, g.in_rows, g.in_cols, g.out_rows, g.out_cols, *ig.cursor_extents(g))
            and ig.ceil_div(n, bn) <= ig.GRID_YZ_LIMIT and g.groups <= ig.GRID_YZ_LIMIT)


def supports(op, geometry, dtype) -> tuple[bool, str]:
    return ig.supported(dtype)


def conv2d(geometry, input, filter, *, path: str | None = None, vector: bool | None = None):
    """Output [batch, out_rows, out_cols, out_depth] in ``geometry.data_format`` of ``input``
    (data_format) and the HWIO ``filter``, in their dtype.  ``path`` ("direct" / "tiled") and
    ``vector`` (tiled only: 16-byte or scalar loads) override the automatic choices."""
    import cupy

    g = geometry
    dtype = np.dtype(input.dtype)
    if ig.is_empty(g.out_backprop_shape, input.shape, filter.shape):
        return cupy.zeros(g.out_backprop_shape, dtype)
    path = pick_path(g, dtype, path)

    x = _runtime.contiguous(input)
    w = _runtime.contiguous(filter)
    dims = ig.dims_args(g)

    if path == "direct":
        out = cupy.empty(g.out_backprop_shape, dtype)
        fn = _runtime.kernel(SOURCE, _direct_name(dtype, g.data_format))
        _runtime.launch_1d(fn, out.size, (x, w, out, *dims))
        return out

    kind = ig.math_kind(dtype)
    bm, bn, _, threads = ig.TILES[(dtype, kind)]
    x = ig.to_nhwc(x, g.data_format)
    out = cupy.empty((g.batch, g.out_rows, g.out_cols, g.out_depth), dtype)
    m, n, _ = _gemm_sizes(g)
    vector = ig.use_vector_loads(g, dtype, (x, w, out), vector)
    fn = _runtime.kernel(SOURCE, _tiled_name(dtype, kind, vector))
    fn((ig.ceil_div(m, bm), ig.ceil_div(n, bn), g.groups), (threads,), (x, w, out, *dims))
    return ig.from_nhwc(out, g.data_format)


def depthwise_conv2d_native(geometry, input, filter, *, path: str | None = None):
    """Depthwise forward: the filter [R, S, in_depth, multiplier] is, in memory, the HWIO filter
    [R, S, 1, in_depth * multiplier] of a grouped convolution with groups = in_depth (TF's output
    channel c * multiplier + m is HWIO out channel c * multiplier + m), which the geometry describes."""
    g = geometry
    hwio = _runtime.contiguous(filter).reshape(g.filter_rows, g.filter_cols, 1, g.out_depth)
    return conv2d(g, input, hwio, path=path)
