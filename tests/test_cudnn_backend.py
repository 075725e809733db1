"""The cuDNN backend: selection and 'unavailable' paths on CPU, the real thing on a GPU.

CPU part: the backend runs end to end against a simulated cuDNN Frontend (``FakeCudnn``):
graphs are described exactly as for the real frontend, "device pointers" are NumPy data
addresses, and executing a plan reads the operands through the declared NCHW dims and
strides and convolves them with its own loops in cuDNN's NCHW/KCRS convention.  Wrong
dims, strides, padding, filter layout or operand binding therefore give wrong numbers,
which are compared with gradops' NumPy backend.  Import failures of ``cudnn`` are simulated
with stand-in packages.

GPU part (``@pytest.mark.gpu``): the real cuDNN against the NumPy backend over the shared
parameter grid, and against gradops' CUDA kernels wherever both support a case.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import logging
import os
import subprocess
import sys
import textwrap
import threading
import types
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import gradops
from conftest import FLOAT_DTYPES, RTOL, assert_close, random_array, to_gpu, to_host
from conv_cases import GRID_ARGS, NO_PADS, REPRESENTATIVE, attrs, geometry_grid, out_size
from gradops import _arrays, _dispatch
from gradops._errors import BackendUnavailableError
from gradops._geometry import conv2d_geometry
from gradops.backends import cudnn as cudnn_backend
from gradops.backends import numpy_backend
from gradops.backends.cudnn import _graphs, _loader, _spec

HALF_AND_FLOAT = [np.float16, ml_dtypes.bfloat16, np.float32]

# --------------------------------------------------------------------------- problems


def geometry_of(op, layout, n, h, w, groups, cg, og, r, s, strides=(1, 1), padding="VALID", dilations=(1, 1),
                pads=NO_PADS, depthwise=False):
    """(geometry, NHWC input shape, filter shape, NHWC out_backprop shape) of one problem."""
    oh = out_size(h, r, strides[0], dilations[0], padding, pads[0])
    ow = out_size(w, s, strides[1], dilations[1], padding, pads[1])
    x_shape = (n, h, w, groups * cg)
    f_shape = (r, s, groups, og) if depthwise else (r, s, cg, groups * og)
    dy_shape = (n, oh, ow, groups * og)
    kw = attrs(layout, strides, padding, dilations, pads)
    in_layout = [x_shape[0], x_shape[3], x_shape[1], x_shape[2]] if layout == "NCHW" else x_shape
    dy_layout = [dy_shape[0], dy_shape[3], dy_shape[1], dy_shape[2]] if layout == "NCHW" else dy_shape
    g = conv2d_geometry(op, in_layout, f_shape, dy_layout, kw["strides"], padding, kw.get("explicit_paddings", []),
                        layout, kw["dilations"], depthwise=depthwise)
    return g


def arrays_for(rng, g, dtype):
    """Random input, filter and out_backprop (in the geometry's layout), rounded to ``dtype``."""
    return (random_array(rng, g.input_shape, dtype), random_array(rng, g.filter_shape, dtype),
            random_array(rng, g.out_backprop_shape, dtype))


def expected(op, g, x, f, dy):
    """gradops' NumPy backend in float64 on the same (already rounded) values."""
    x, f, dy = (a.astype(np.float64) for a in (x, f, dy))
    if op in ("conv2d_backprop_filter", "depthwise_conv2d_native_backprop_filter"):
        return getattr(numpy_backend, op)(g, x, dy)
    if op in ("conv2d_backprop_input", "depthwise_conv2d_native_backprop_input"):
        return getattr(numpy_backend, op)(g, f, dy)
    return getattr(numpy_backend, op)(g, x, f)


def run_backend(module, op, g, x, f, dy):
    if op in ("conv2d_backprop_filter", "depthwise_conv2d_native_backprop_filter"):
        return getattr(module, op)(g, x, dy)
    if op in ("conv2d_backprop_input", "depthwise_conv2d_native_backprop_input"):
        return getattr(module, op)(g, f, dy)
    return getattr(module, op)(g, x, f)


def _grid_sizes(i, groups):
    """(h, w, r, s, cg, og) of grid case ``i`` (small, varied, every filter size 1..3)."""
    cg, og = (1 + i % 2, 1 + (i // 2) % 2) if groups < 3 else (1, 1 + i % 2)
    return 4 + i % 4, 4 + (3 * i + 1) % 4, 1 + i % 3, 1 + (i + 1) % 3, cg, og


GRID = geometry_grid(
    [("SAME", NO_PADS), ("VALID", NO_PADS), ("EXPLICIT", ((1, 0), (0, 2))), ("EXPLICIT", ((4, 1), (0, 3)))],
    [(1, 1), (2, 2), (1, 2)], ("NHWC", "NCHW"), _grid_sizes)
CONV_OPS = ["conv2d_backprop_filter", "conv2d_backprop_input", "conv2d"]
DEPTHWISE_CASES = {
    "valid-m1": dict(h=5, w=6, groups=3, cg=1, og=1, r=3, s=2),
    "same-s2-m2": dict(h=7, w=5, groups=2, cg=1, og=2, r=3, s=3, strides=(2, 2), padding="SAME"),
    "explicit-s12-d21-m3": dict(h=6, w=7, groups=4, cg=1, og=3, r=2, s=3, strides=(1, 2), dilations=(2, 1),
                                padding="EXPLICIT", pads=((1, 2), (0, 1))),
}

DEPTHWISE_OPS = ["depthwise_conv2d_native_backprop_input", "depthwise_conv2d_native_backprop_filter",
                 "depthwise_conv2d_native"]

# --------------------------------------------------------------------------- simulated cuDNN Frontend


class FakeTensor:
    def __init__(self, name, dim=None, stride=None, data_type=None):
        self.name, self.dim, self.stride, self.data_type, self.output = name, dim, stride, data_type, False

    def set_output(self, value):
        self.output = value
        return self

    def set_dim(self, dim):
        self.dim = list(dim)
        return self

    def set_stride(self, stride):
        self.stride = list(stride)
        return self

    def set_data_type(self, data_type):
        self.data_type = data_type
        return self


class FakePlan:
    def __init__(self, name, notes=(), declines=False, workspace=0):
        self.name, self.notes, self.declines, self.workspace = name, tuple(notes), declines, workspace


class FakeGraphNotSupported(Exception):
    pass


def _strided(ptr, dims, strides, dtype):
    """A NumPy view of the memory at ``ptr`` with element ``strides`` (what cuDNN would read)."""
    dtype = np.dtype(dtype)
    extent = 1 + sum((d - 1) * s for d, s in zip(dims, strides))
    flat = np.frombuffer((ctypes.c_char * (extent * dtype.itemsize)).from_address(ptr), dtype=dtype)
    return np.lib.stride_tricks.as_strided(flat, tuple(dims), tuple(s * dtype.itemsize for s in strides))


def fake_convolution(kind, x, w, y, pre, post, stride, dilation):
    """cuDNN's grouped cross-correlation in NCHW / KCRS, float64: returns the graph's output.

    x [N, C, H, W], w [K, C/G, R, S], y [N, K, P, Q] (the operand not read may be None-shaped
    zeros); checks cuDNN's consistency rule P = (H + pre + post - effective) // stride + 1.
    """
    n, c, h, wd = x.shape
    k, cg, r_, s_ = w.shape
    p, q = y.shape[2:]
    if c % cg or k % (c // cg):
        raise FakeGraphNotSupported(f"channels {c} / filter {cg} / out {k} do not form groups")
    groups, kg = c // cg, k // (c // cg)
    for size, filt, pr, po, st, d, out, name in ((h, r_, pre[0], post[0], stride[0], dilation[0], p, "rows"),
                                                 (wd, s_, pre[1], post[1], stride[1], dilation[1], q, "cols")):
        if (size + pr + po - ((filt - 1) * d + 1)) // st + 1 != out:
            raise FakeGraphNotSupported(f"output {name} {out} inconsistent with the convolution")
    padded = np.zeros((n, c, h + pre[0] + post[0], wd + pre[1] + post[1]))
    padded[:, :, pre[0]:pre[0] + h, pre[1]:pre[1] + wd] = x
    out = np.zeros(padded.shape if kind == "dgrad" else (y.shape if kind == "fprop" else w.shape))
    for r in range(r_):
        for s in range(s_):
            rows = r * dilation[0] + stride[0] * np.arange(p)
            cols = s * dilation[1] + stride[1] * np.arange(q)
            for g in range(groups):
                cs, ks = slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)
                patch = padded[:, cs][:, :, rows][:, :, :, cols]
                if kind == "fprop":
                    out[:, ks] += np.einsum("ncpq,kc->nkpq", patch, w[ks, :, r, s])
                elif kind == "wgrad":
                    out[ks, :, r, s] += np.einsum("ncpq,nkpq->kc", patch, y[:, ks])
                else:
                    out[:, cs, rows[:, None], cols[None, :]] += np.einsum("nkpq,kc->ncpq", y[:, ks], w[ks, :, r, s])
    if kind == "dgrad":
        out = out[:, :, pre[0]:pre[0] + h, pre[1]:pre[1] + wd]
    return out


class FakeGraph:
    def __init__(self, module, io_data_type, intermediate_data_type, compute_data_type, handle):
        self.m = module
        module.graphs.append(self)
        self.types = (io_data_type, intermediate_data_type, compute_data_type)
        self.handle = handle
        self.tensors, self.node, self.deselected, self.built, self.modes = [], None, [], set(), None

    def tensor(self, name, dim, stride, data_type):
        t = FakeTensor(name, list(dim), list(stride), data_type)
        self.tensors.append(t)
        return t

    def _conv(self, kind, inputs, **params):
        assert self.node is None, "one convolution per graph"
        out = FakeTensor(f"{kind}::out")
        self.node = (kind, inputs, params, out)
        self.tensors.append(out)
        return out

    def conv_fprop(self, image, weight, **params):
        return self._conv("fprop", {"x": image, "w": weight}, **params)

    def conv_dgrad(self, loss, filter, **params):
        return self._conv("dgrad", {"y": loss, "w": filter}, **params)

    def conv_wgrad(self, image, loss, **params):
        return self._conv("wgrad", {"x": image, "y": loss}, **params)

    def validate(self):
        kind, inputs, params, out = self.node
        assert out.output and out.dim and out.stride, "the output must be marked and fully described"
        assert set(params) == {"pre_padding", "post_padding", "stride", "dilation", "compute_data_type"}
        if self.m.reject_validate:
            raise RuntimeError(self.m.reject_validate)

    def build_operation_graph(self):
        pass

    def create_execution_plans(self, modes):
        self.modes = list(modes)

    def deselect_numeric_notes(self, notes):
        self.deselected += list(notes)

    def get_execution_plan_count(self):
        return len(self.m.plans)

    def build_plan_at_index(self, index):
        plan = self.m.plans[index]
        if set(plan.notes) & set(self.deselected):
            raise RuntimeError("[cudnn_frontend] Error: Deselecting execution plan")
        if plan.declines:
            raise FakeGraphNotSupported(f"{plan.name} does not support this graph")
        self.built.add(index)

    def get_workspace_size_plan_at_index(self, index):
        return self.m.plans[index].workspace

    def get_plan_name_at_index(self, index):
        return self.m.plans[index].name

    def execute_plan_at_index(self, pack, workspace, index, handle):
        assert index in self.built, "executing a plan that was not built"
        assert handle is self.m.handles_by_thread[threading.get_ident()]
        assert handle.stream == NumpyRuntime.STREAM, "the handle must be bound to the current stream"
        plan = self.m.plans[index]
        if plan.workspace:
            assert workspace is not None, "the plan needs a workspace"
        kind, inputs, params, out = self.node
        dtype = self.m.NUMPY_TYPES[self.types[0]]
        roles = {**inputs, {"fprop": "y", "dgrad": "x", "wgrad": "w"}[kind]: out}
        assert set(pack) == set(roles.values()), "every operand, and nothing else, is bound"
        views = {role: _strided(pack[t], t.dim, t.stride, dtype) for role, t in roles.items()}
        operands = {role: views[role].astype(np.float64) for role in inputs}
        for role, t in roles.items():
            operands.setdefault(role, np.zeros(t.dim))
        result = fake_convolution(kind, operands["x"], operands["w"], operands["y"], params["pre_padding"],
                                  params["post_padding"], params["stride"], params["dilation"])
        views[{"fprop": "y", "dgrad": "x", "wgrad": "w"}[kind]][...] = result.astype(dtype)
        self.m.executed.append(plan.name)


class FakeHandle:
    def __init__(self):
        self.stream = None


def make_fake_cudnn(plans=None):
    """A stand-in ``cudnn`` module with the frontend surface gradops uses."""
    m = types.ModuleType("cudnn")
    m.__version__ = "1.28.0"
    m.data_type = types.SimpleNamespace(HALF="HALF", BFLOAT16="BFLOAT16", FLOAT="FLOAT")
    m.NUMPY_TYPES = {"HALF": np.float16, "BFLOAT16": ml_dtypes.bfloat16, "FLOAT": np.float32}
    m.numerical_note = types.SimpleNamespace(**{n: n for n in (
        "TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT", "NONDETERMINISTIC",
        "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13", "STRICT_NAN_PROP")})
    m.heur_mode = types.SimpleNamespace(A="A", B="B", FALLBACK="FALLBACK")
    m.cudnnGraphNotSupportedError = FakeGraphNotSupported
    m.plans = plans if plans is not None else [FakePlan("engine0", workspace=64)]
    m.graphs, m.executed, m.handles_by_thread, m.reject_validate = [], [], {}, None
    m.backend_version = lambda: 91400
    m.backend_version_string = lambda: "9.14.0"
    m.pygraph = lambda **kw: FakeGraph(m, **kw)

    def create_handle():
        h = FakeHandle()
        m.handles_by_thread[threading.get_ident()] = h
        return h

    def set_stream(handle, stream):
        handle.stream = stream

    m.create_handle, m.set_stream = create_handle, set_stream
    return m


class NumpyRuntime:
    """The device runtime with host memory: pointers are NumPy data addresses."""

    STREAM = 0x5EED
    xp = np

    def device_id(self):
        return 0

    def stream_ptr(self):
        return self.STREAM

    @staticmethod
    def pointer(array):
        return int(array.ctypes.data)

    def workspace(self, nbytes):
        return np.zeros(nbytes, np.uint8)


@pytest.fixture
def fake(monkeypatch):
    """gradops' cuDNN backend wired to FakeCudnn and host memory, with empty caches."""
    module = make_fake_cudnn()
    monkeypatch.setattr(_loader, "_state", (module, "cuDNN 9.14.0 through the cuDNN Frontend 1.28.0"))
    monkeypatch.setattr(_graphs, "runtime", NumpyRuntime())
    monkeypatch.setattr(_graphs, "_state", _graphs._ThreadState())
    monkeypatch.setattr(cudnn_backend, "_probed", {})
    monkeypatch.setattr(cudnn_backend, "cupy_device_status", lambda: (True, "1 CUDA device(s)"))
    return module


# --------------------------------------------------------------------------- descriptors (pure)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_spec_strides_describe_the_arrays_memory(layout):
    """dims are NCHW / KCRS; strides are those of the real arrays (activations, scratch filter)."""
    g = geometry_of("conv2d_backprop_input", layout, 2, 5, 7, 2, 3, 2, 3, 2, (2, 1), "SAME")
    spec = _spec.conv_spec(_spec.DGRAD, g, np.float32)
    x = np.empty(g.input_shape, np.float32)
    nchw_view = x if layout == "NCHW" else x.transpose(0, 3, 1, 2)
    assert spec.x.dims == nchw_view.shape == (2, 6, 5, 7)
    assert spec.x.strides == tuple(st // 4 for st in nchw_view.strides)
    w = _spec.filter_to_cudnn(np, np.empty(g.filter_shape, np.float32), g)
    kcrs_view = w if spec.filter_layout == "KCRS" else w.transpose(0, 3, 1, 2)
    assert spec.w.dims == kcrs_view.shape == (4, 3, 3, 2)
    assert spec.w.strides == tuple(st // 4 for st in kcrs_view.strides)
    assert spec.filter_layout == ("KRSC" if layout == "NHWC" else "KCRS")
    # SAME, 5 rows, stride 2, 3 taps: out 3, 2 rows of padding, the odd one at the bottom (TF).
    assert (spec.pre_padding, spec.post_padding, spec.stride) == ((1, 0), (1, 1), (2, 1))


def test_filter_layout_round_trip_and_depthwise_mapping(rng):
    g = geometry_of("conv2d", "NHWC", 1, 4, 4, 3, 2, 2, 2, 3)
    f = rng.standard_normal(g.filter_shape)
    assert np.array_equal(_spec.filter_from_cudnn(np, _spec.filter_to_cudnn(np, f, g), g), f)
    d = geometry_of("depthwise_conv2d_native", "NCHW", 1, 4, 4, 3, 1, 2, 2, 3, depthwise=True)
    fd = rng.standard_normal(d.filter_shape)  # [R, S, C, M]
    kcrs = _spec.filter_to_cudnn(np, fd, d)
    assert kcrs.shape == (6, 1, 2, 3)
    for c in range(3):
        for m in range(2):
            assert np.array_equal(kcrs[c * 2 + m, 0], fd[:, :, c, m])  # output channel c*M + m


def test_spec_is_a_cache_key_sensitive_to_layout_and_dtype():
    g1 = geometry_of("conv2d", "NHWC", 1, 4, 4, 1, 2, 2, 2, 2)
    g2 = geometry_of("conv2d", "NCHW", 1, 4, 4, 1, 2, 2, 2, 2)
    specs = {_spec.conv_spec(k, g, d) for k in (_spec.FPROP, _spec.WGRAD) for g in (g1, g2)
             for d in (np.float16, np.float32)}
    assert len(specs) == 8
    assert _spec.conv_spec(_spec.FPROP, g1, np.float32) == _spec.conv_spec(_spec.FPROP, g1, np.float32)


# --------------------------------------------------------------------------- end to end on the fake


@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize(GRID_ARGS, [c for c in GRID if c.values[10] != (1, 2)])
def test_fake_cudnn_grid_matches_numpy(fake, rng, op, layout, h, w, groups, cg, og, r, s, strides, padding,
                                       dilations, pads):
    """The whole cuDNN path (descriptors, scratch filters, binding, result layout) on the grid."""
    g = geometry_of(op, layout, 2, h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    x, f, dy = arrays_for(rng, g, np.float32)
    got = run_backend(cudnn_backend, op, g, x, f, dy)
    assert got.dtype == np.float32 and got.flags.c_contiguous
    assert_close(got, expected(op, g, x, f, dy), np.float32)
    assert fake.executed == ([] if _spec.is_empty(g) else ["engine0"])  # empty ones never reach cuDNN


@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(REPRESENTATIVE))
@pytest.mark.parametrize("op", CONV_OPS)
def test_fake_cudnn_dtypes_and_layouts(fake, rng, op, case, layout, dtype):
    kw = dict(REPRESENTATIVE[case])
    g = geometry_of(op, layout, 2, **kw)
    x, f, dy = arrays_for(rng, g, dtype)
    got = run_backend(cudnn_backend, op, g, x, f, dy)
    assert got.dtype == np.dtype(dtype)
    assert_close(got, expected(op, g, x, f, dy), dtype)
    graph = fake.graphs[-1]
    assert graph.types == ({np.dtype(np.float16): "HALF", np.dtype(ml_dtypes.bfloat16): "BFLOAT16",
                            np.dtype(np.float32): "FLOAT"}[np.dtype(dtype)], "FLOAT", "FLOAT")


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(DEPTHWISE_CASES))
@pytest.mark.parametrize("op", DEPTHWISE_OPS)
def test_fake_cudnn_depthwise_as_grouped_convolution(fake, rng, op, case, layout):
    g = geometry_of(op, layout, 2, depthwise=True, **DEPTHWISE_CASES[case])
    x, f, dy = arrays_for(rng, g, np.float32)
    got = run_backend(cudnn_backend, op, g, x, f, dy)
    assert got.shape == expected(op, g, x, f, dy).shape
    assert_close(got, expected(op, g, x, f, dy), np.float32)
    kind, _, _, out = fake.graphs[-1].node
    assert kind == cudnn_backend.OPS[op]
    w = out if kind == "wgrad" else next(t for t in fake.graphs[-1].tensors if t.name == "w")
    assert w.dim[0] == g.out_depth and w.dim[1] == 1  # [C*M, 1, R, S], groups = C


@pytest.mark.parametrize("kind", ["strided", "misaligned"])
def test_fake_cudnn_copies_views_it_cannot_describe(fake, rng, kind):
    """cuDNN reads dense, 16-byte aligned memory: strided views and odd offsets are copied first."""
    g = geometry_of("conv2d_backprop_filter", "NHWC", 2, 5, 5, 1, 3, 2, 3, 3, padding="SAME")
    x, f, dy = arrays_for(rng, g, np.float32)
    if kind == "strided":
        big = np.zeros(x.shape[:3] + (2 * x.shape[3],), np.float32)
        big[..., 1::2] = x
        x_arg = big[..., 1::2]
        assert not x_arg.flags.c_contiguous
    else:
        raw = np.zeros(x.size + 1, np.float32)
        raw[1:] = x.ravel()
        x_arg = raw[1:].reshape(x.shape)  # 4 bytes past an aligned address
        assert x_arg.ctypes.data % _spec.ALIGNMENT
    assert_close(cudnn_backend.conv2d_backprop_filter(g, x_arg, dy), expected("conv2d_backprop_filter", g, x, f, dy),
                 np.float32)


def test_fake_cudnn_empty_problems_give_zeros_without_a_graph(fake):
    g = geometry_of("conv2d_backprop_input", "NHWC", 0, 4, 4, 1, 2, 3, 3, 3, padding="SAME")
    assert cudnn_backend.supports("conv2d_backprop_input", g, np.float32) == (
        True, "empty tensors: zeros without calling cuDNN")
    dx = cudnn_backend.conv2d_backprop_input(g, np.ones(g.filter_shape, np.float32),
                                             np.ones(g.out_backprop_shape, np.float32))
    assert dx.shape == g.input_shape and not dx.any()
    g = geometry_of("conv2d_backprop_filter", "NCHW", 2, 2, 2, 1, 1, 2, 3, 3)  # VALID: 0 output rows
    dw = cudnn_backend.conv2d_backprop_filter(g, np.ones(g.input_shape, np.float32),
                                              np.ones(g.out_backprop_shape, np.float32))
    assert dw.shape == g.filter_shape and not dw.any()
    assert fake.graphs == []


# --------------------------------------------------------------------------- engine choice


def _notes_case(fake, dtype, **options):
    g = geometry_of("conv2d_backprop_filter", "NHWC", 1, 4, 4, 1, 2, 2, 2, 2)
    rng = np.random.default_rng(0)
    x, f, dy = arrays_for(rng, g, dtype)
    with gradops.options(**options):
        got = cudnn_backend.conv2d_backprop_filter(g, x, dy)
    assert_close(got, expected("conv2d_backprop_filter", g, x, f, dy), dtype)
    return fake.executed[-1], set(fake.graphs[-1].deselected)


TRANSFORMS = {"FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13"}


def test_default_options_exclude_nondeterministic_tf32_and_down_converting_engines(fake):
    fake.plans[:] = [FakePlan("fast-atomics", ["NONDETERMINISTIC"]), FakePlan("tf32", ["TENSOR_CORE"]),
                     FakePlan("fp16-inputs", ["DOWN_CONVERT_INPUTS"]), FakePlan("exact")]
    plan, deselected = _notes_case(fake, np.float32)
    assert plan == "exact"
    assert deselected == {"NONDETERMINISTIC", "TENSOR_CORE", "DOWN_CONVERT_INPUTS", *TRANSFORMS}
    assert fake.graphs[-1].modes == ["A", "FALLBACK"]


def test_options_let_cudnn_pick_faster_engines(fake):
    fake.plans[:] = [FakePlan("fast-atomics", ["NONDETERMINISTIC"]), FakePlan("tf32", ["TENSOR_CORE"]),
                     FakePlan("exact")]
    assert _notes_case(fake, np.float32, deterministic=False)[0] == "fast-atomics"
    assert _notes_case(fake, np.float32, allow_tf32=True)[0] == "tf32"
    plan, deselected = _notes_case(fake, np.float32, deterministic=False, allow_tf32=True)
    assert plan == "fast-atomics" and deselected == {"DOWN_CONVERT_INPUTS", *TRANSFORMS}


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16], ids=["float16", "bfloat16"])
def test_half_types_keep_tensor_cores_but_accumulate_in_float32(fake, dtype):
    fake.plans[:] = [FakePlan("half-reduction", ["REDUCED_PRECISION_REDUCTION"]),
                     FakePlan("tensor-core", ["TENSOR_CORE"])]
    plan, deselected = _notes_case(fake, dtype)
    assert plan == "tensor-core"
    assert "TENSOR_CORE" not in deselected and "REDUCED_PRECISION_REDUCTION" in deselected


@pytest.mark.parametrize("op,dilations,expected_plan", [
    ("conv2d_backprop_filter", (1, 2), "eng0"),  # eng1 / eng20 are skipped for dilated wgrad
    ("conv2d_backprop_filter", (1, 1), "eng1_k2=6_k3=0"),
    ("conv2d_backprop_input", (1, 2), "eng1_k2=6_k3=0"),
])
def test_engines_with_wrong_dilated_filter_gradients_are_skipped(fake, rng, op, dilations, expected_plan):
    fake.plans[:] = [FakePlan("eng1_k2=6_k3=0"), FakePlan("eng20"), FakePlan("eng0")]
    g = geometry_of(op, "NCHW", 2, 4, 5, 2, 1, 1, 2, 3, (2, 2), "EXPLICIT", dilations, ((1, 0), (0, 2)))
    x, f, dy = arrays_for(rng, g, np.float32)
    got = run_backend(cudnn_backend, op, g, x, f, dy)
    assert fake.executed[-1] == expected_plan
    assert_close(got, expected(op, g, x, f, dy), np.float32)


def test_declining_plans_are_skipped_and_no_plan_means_unsupported(fake):
    fake.plans[:] = [FakePlan("picky", declines=True), FakePlan("ok")]
    assert _notes_case(fake, np.float32)[0] == "ok"
    fake.plans[:] = [FakePlan("picky", declines=True), FakePlan("tf32", ["TENSOR_CORE"])]
    g = geometry_of("conv2d_backprop_input", "NCHW", 1, 5, 5, 1, 2, 2, 3, 3)
    ok, reason = cudnn_backend.supports("conv2d_backprop_input_v2", g, np.float32)
    assert not ok
    assert "no cuDNN engine for this dgrad survives" in reason and "picky does not support" in reason
    assert "Deselecting" in reason and "allow_tf32=False" in reason
    with gradops.options(allow_tf32=True):  # another cache entry, and now an engine is left
        assert cudnn_backend.supports("conv2d_backprop_input", g, np.float32)[0]


def test_rejected_graph_is_unsupported_with_cudnns_message(fake):
    fake.reject_validate = "CUDNN_STATUS_NOT_SUPPORTED: dilation with this padding"
    g = geometry_of("conv2d", "NHWC", 1, 5, 5, 1, 2, 2, 3, 3, dilations=(2, 2))
    ok, reason = cudnn_backend.supports("conv2d", g, np.float16)
    assert not ok and "cuDNN rejected the fprop graph" in reason and "dilation with this padding" in reason
    with pytest.raises(_graphs.GraphUnsupported):
        cudnn_backend.conv2d(g, np.ones(g.input_shape, np.float16), np.ones(g.filter_shape, np.float16))


# --------------------------------------------------------------------------- caching, handles


def test_graphs_are_built_once_and_reused_with_new_pointers(fake, rng):
    g = geometry_of("conv2d_backprop_input", "NHWC", 2, 5, 6, 1, 2, 3, 3, 2, (2, 2), "SAME")
    assert cudnn_backend.supports("conv2d_backprop_input", g, np.float32)[0]
    for _ in range(3):  # fresh arrays (new addresses) every call
        x, f, dy = arrays_for(rng, g, np.float32)
        assert_close(cudnn_backend.conv2d_backprop_input(g, f, dy), expected("conv2d_backprop_input", g, x, f, dy),
                     np.float32)
    assert len(fake.graphs) == 1 and len(fake.executed) == 3
    with gradops.options(deterministic=False):  # options are part of the key
        cudnn_backend.conv2d_backprop_input(g, f, dy)
    with gradops.options(allow_tf32=True):
        cudnn_backend.conv2d_backprop_input(g, f, dy)
    assert len(fake.graphs) == 3
    assert _graphs.cache_info() == {"built": 3, "unsupported": 0}


def test_unsupported_results_are_cached_too(fake):
    fake.plans[:] = [FakePlan("picky", declines=True)]
    g = geometry_of("conv2d", "NHWC", 1, 4, 4, 1, 1, 1, 2, 2)
    for _ in range(3):
        assert not cudnn_backend.supports("conv2d", g, np.float32)[0]
    assert len(fake.graphs) == 1 and _graphs.cache_info() == {"built": 0, "unsupported": 1}


def test_one_handle_per_thread_bound_to_the_current_stream(fake, rng):
    g = geometry_of("conv2d_backprop_filter", "NCHW", 1, 4, 5, 2, 1, 1, 2, 2)
    x, f, dy = arrays_for(rng, g, np.float32)
    want = expected("conv2d_backprop_filter", g, x, f, dy)
    results, errors = [], []
    # Both threads stay alive until both have called: a finished thread's ident can be reused
    # by the next one, which would make two threads look like one.
    both_called = threading.Barrier(2, timeout=30)

    def work():
        try:
            results.append(cudnn_backend.conv2d_backprop_filter(g, x, dy))
        except Exception as exc:  # surfaced below: assertion errors inside the thread
            errors.append(exc)
        finally:
            both_called.wait()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(fake.handles_by_thread) == 2 and len(fake.graphs) == 2  # per-thread handles and graphs
    for got in results:
        assert_close(got, want, np.float32)


def test_cache_is_bounded(fake, monkeypatch):
    monkeypatch.setattr(_graphs, "CACHE_SIZE", 2)
    for h in (4, 5, 6):
        g = geometry_of("conv2d", "NHWC", 1, h, 4, 1, 1, 1, 2, 2)
        assert cudnn_backend.supports("conv2d", g, np.float32)[0]
    assert _graphs.cache_info()["built"] == 2


# --------------------------------------------------------------------------- supports / available


@pytest.mark.parametrize("op,dtype,fragment", [
    ("conv2d_backprop_filter", np.float64, "do not support float64"),
    ("conv2d_backprop_input_v2", np.float64, "do not support float64"),
    ("fractional_avg_pool_grad", np.float32, "cuDNN has no fractional_avg_pool_grad"),
    ("conv2d_backprop_filter", np.int32, "not int32"),
])
def test_supports_refuses_with_a_reason_before_touching_cudnn(monkeypatch, op, dtype, fragment):
    monkeypatch.setattr(_loader, "load", lambda: pytest.fail("cuDNN must not be loaded for this answer"))
    g = geometry_of("conv2d_backprop_filter", "NHWC", 1, 4, 4, 1, 1, 1, 2, 2)
    ok, reason = cudnn_backend.supports(op, g, dtype)
    assert not ok and fragment in reason


@pytest.fixture
def cudnn_import_sandbox():
    """``import cudnn`` starts afresh in this test (no module imported, the loader's outcome
    forgotten), and afterwards every ``cudnn`` module this test imported (a stand-in package) is
    gone, and the ones imported before (the real frontend) and the loader's outcome are back:
    the real-frontend tests pass before, after and between these tests."""
    def ours():
        return {n: m for n, m in sys.modules.items() if n == "cudnn" or n.startswith("cudnn.")}

    before, state = ours(), _loader._state
    for name in before:
        del sys.modules[name]
    _loader.reset()
    try:
        yield
    finally:
        for name in ours():
            del sys.modules[name]
        sys.modules.update(before)
        _loader._state = state


def _fake_package(tmp_path, monkeypatch, body):
    """Make ``import cudnn`` find a stand-in package whose __init__ is ``body`` (use with the
    ``cudnn_import_sandbox`` fixture, which removes it afterwards)."""
    package = tmp_path / "cudnn"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))


BROKEN_INSTALLS = {
    "missing-sublibrary": ("raise OSError('libcudnn_graph.so.9: cannot open shared object file')",
                           "failed to import: OSError: libcudnn_graph.so.9"),
    "two-libcudnn-copies": ("raise AssertionError('Found 2 libcudnn.so.x in nvidia-cudnn-cuXX.')",
                            "failed to import: AssertionError: Found 2"),
    "broken-extension": ("from ._compiled_module import backend_version", "failed to import: ImportError"),
    "not-the-frontend": ("VERSION = 'something else'", "is not NVIDIA's cuDNN Frontend"),
    "library-missing": ("""
        __version__ = '1.28.0'
        pygraph = create_handle = set_stream = heur_mode = numerical_note = data_type = object()
        def backend_version():
            raise RuntimeError('Unable to find symbol cudnnGetVersion')
        """, "the cuDNN library (libcudnn) could not be loaded: RuntimeError: Unable to find symbol"),
}


@pytest.mark.parametrize("case", list(BROKEN_INSTALLS))
def test_broken_cudnn_installs_report_unavailable(tmp_path, monkeypatch, cudnn_import_sandbox, case):
    body, fragment = BROKEN_INSTALLS[case]
    _fake_package(tmp_path, monkeypatch, body)
    ok, reason = cudnn_backend.available()
    assert not ok and fragment in reason, reason
    assert gradops.backend_status()["cudnn"] == (False, reason)
    versions = cudnn_backend.versions()
    assert set(versions) == {"frontend", "library"}
    if case == "library-missing":
        assert versions["frontend"] == "1.28.0" and fragment in versions["library"]


def test_cudnn_not_installed(cudnn_import_sandbox):
    sys.modules["cudnn"] = None  # makes `import cudnn` fail as if absent (the sandbox removes it)
    ok, reason = cudnn_backend.available()
    assert not ok and "cuDNN Frontend is not installed" in reason and "gradops[cuda13]" in reason


def test_available_needs_a_gpu_after_the_library(fake, monkeypatch):
    monkeypatch.setattr(cudnn_backend, "cupy_device_status", lambda: (False, "CuPy is not installed"))
    assert cudnn_backend.available() == (False, "CuPy is not installed")


def test_available_runs_a_self_test_once_per_device(fake):
    assert cudnn_backend.available() == (True, "cuDNN 9.14.0 through the cuDNN Frontend 1.28.0")
    assert cudnn_backend.available()[0]
    assert fake.executed == ["engine0"]  # the 2x2 filter-gradient self-test ran once


def test_a_failing_self_test_makes_cudnn_unavailable(fake):
    def create_handle():
        raise RuntimeError("CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED: libcudnn_engines_precompiled.so.9")

    fake.create_handle = create_handle
    ok, reason = cudnn_backend.available()
    assert not ok and "self-test" in reason and "SUBLIBRARY_LOADING_FAILED" in reason


def test_a_wrong_self_test_result_makes_cudnn_unavailable(fake, monkeypatch):
    monkeypatch.setattr(_graphs, "execute", lambda *a, **k: None)  # leaves the output uninitialised (zeros)
    monkeypatch.setattr(NumpyRuntime, "xp", types.SimpleNamespace(
        arange=np.arange, ones=np.ones, empty=np.zeros, ascontiguousarray=np.ascontiguousarray), raising=False)
    ok, reason = cudnn_backend.available()
    assert not ok and "wrong result" in reason


def test_import_gradops_and_info_with_a_broken_cudnn(tmp_path):
    """A process whose `import cudnn` raises still imports gradops and runs `info`."""
    package = tmp_path / "cudnn"
    package.mkdir()
    (package / "__init__.py").write_text("raise OSError('libcudnn_ops.so.9: cannot open shared object file')\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(repo)])}
    result = subprocess.run([sys.executable, "-m", "gradops", "info"], capture_output=True, text=True, env=env,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "libcudnn_ops.so.9" in result.stdout and "backend cudnn" in result.stdout


def test_info_shows_frontend_and_library_versions(fake, monkeypatch):
    from rich.console import Console

    from gradops.__main__ import info

    monkeypatch.setattr(_dispatch, "backend_status", lambda: {"cudnn": (True, "fake")})
    console = Console(width=200, record=True)
    assert info(console) == 0
    text = console.export_text()
    assert "cuDNN Frontend (import cudnn)" in text and "1.28.0" in text
    assert "cuDNN library (libcudnn)" in text and "9.14.0" in text


# --------------------------------------------------------------------------- the real cuDNN Frontend, no GPU


@pytest.fixture
def real_frontend():
    """NVIDIA's cuDNN Frontend at the pinned version (the test extra installs it), or skip.
    Without libcudnn and a GPU its Python layer still describes and checks graphs.

    An installed pinned frontend that ``import cudnn`` does not give (a stand-in package of
    another test left in ``sys.modules``) fails the test rather than skipping it."""
    try:
        installed = importlib.metadata.version("nvidia-cudnn-frontend")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvidia-cudnn-frontend is not installed (the test extra installs it)")
    if installed != _loader.PINNED_FRONTEND:
        pytest.skip(f"the cuDNN Frontend here is {installed}, not the pinned {_loader.PINNED_FRONTEND}")
    try:
        import cudnn
    except ImportError as exc:
        pytest.skip(f"the installed cuDNN Frontend does not import here: {exc}")
    assert getattr(cudnn, "__version__", None) == installed, (
        f"`import cudnn` gives {getattr(cudnn, '__file__', cudnn)!r}, not the installed frontend {installed}: "
        "a test left a stand-in `cudnn` in sys.modules")
    return cudnn


REAL_FRONTEND_CASES = [  # (op, layout, dtype, geometry_of arguments)
    *[(op, layout, dtype, dict(n=2, h=7, w=6, groups=groups, cg=3, og=2, r=3, s=2, strides=strides,
                               padding="EXPLICIT", pads=((2, 0), (1, 3)), dilations=dilations))
      for op in CONV_OPS for layout in ("NHWC", "NCHW") for dtype in HALF_AND_FLOAT
      for groups, strides, dilations in ((1, (1, 1), (1, 1)), (2, (2, 1), (1, 2)))],
    *[(op, layout, np.float32, dict(DEPTHWISE_CASES["same-s2-m2"], n=1, depthwise=True))
      for op in DEPTHWISE_OPS for layout in ("NHWC", "NCHW")],
]


@pytest.mark.parametrize("op,layout,dtype,case", REAL_FRONTEND_CASES,
                         ids=[f"{op}-{layout}-{np.dtype(dtype).name}-{i}"
                              for i, (op, layout, dtype, _) in enumerate(REAL_FRONTEND_CASES)])
def test_real_frontend_accepts_the_graph_descriptions(real_frontend, op, layout, dtype, case):
    """The pinned frontend's own Python layer takes gradops' graph as described for the GPU:
    its port and attribute names (it rejects unknown ones), tensor dims and strides, and the
    operand roles; and its shape rule for a forward convolution gives the y dims of the spec.
    What needs libcudnn and a GPU (the C++ validation, engines, plans) is not reached here."""
    cudnn = real_frontend
    g = geometry_of(op, layout, **case)
    kind = cudnn_backend.OPS[op]
    spec = _spec.conv_spec(kind, g, dtype)
    graph, tensors = _graphs.describe(cudnn, None, spec)
    graph._backend_lowerable = lambda: False  # stop before the C++ lowering, which needs libcudnn
    graph.validate()

    (node,) = graph._nodes
    assert node.params["pre_padding"] == list(spec.pre_padding)
    assert node.params["post_padding"] == list(spec.post_padding)
    assert node.params["stride"] == list(spec.stride) and node.params["dilation"] == list(spec.dilation)
    ports = {_spec.FPROP: {"image": "x", "weight": "w"}, _spec.DGRAD: {"loss": "y", "filter": "w"},
             _spec.WGRAD: {"image": "x", "loss": "y"}}[kind]
    assert {port: node.inputs[port] for port in ports} == {port: tensors[role] for port, role in ports.items()}
    (output,) = node.outputs.values()
    assert output is tensors[{_spec.FPROP: "y", _spec.DGRAD: "x", _spec.WGRAD: "w"}[kind]]
    assert not output.is_virtual and output.dim_assigned and output.stride_assigned
    io = {"float16": cudnn.data_type.HALF, "bfloat16": cudnn.data_type.BFLOAT16,
          "float32": cudnn.data_type.FLOAT}[np.dtype(dtype).name]
    descs = {"x": spec.x, "w": spec.w, "y": spec.y}
    for role, tensor in tensors.items():
        assert (tuple(tensor.dim), tuple(tensor.stride)) == (descs[role].dims, descs[role].strides), role
        assert tensor.data_type == io, role
    if kind == _spec.FPROP:
        from cudnn._pygraph import _conv_fprop_dims

        assert tuple(_conv_fprop_dims(node)) == spec.y.dims


def test_real_frontend_rejects_a_misnamed_attribute(real_frontend):
    """The check above has teeth: the frontend refuses a port or attribute it does not know."""
    cudnn = real_frontend
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT)
    y = graph.tensor(name="y", dim=[1, 2, 3, 3], stride=[18, 9, 3, 1], data_type=cudnn.data_type.FLOAT)
    w = graph.tensor(name="w", dim=[2, 2, 1, 1], stride=[2, 1, 1, 1], data_type=cudnn.data_type.FLOAT)
    with pytest.raises(TypeError, match="strides"):
        graph.conv_dgrad(loss=y, filter=w, pre_padding=[0, 0], post_padding=[0, 0], strides=[1, 1],
                         dilation=[1, 1])


def test_real_frontend_without_libcudnn_is_reported_unavailable(real_frontend):
    """The frontend imports but its library is missing (a CPU machine): cuDNN is unavailable
    with the library named, and the frontend's version is still reported."""
    try:
        real_frontend.backend_version()
    except Exception:
        pass
    else:
        pytest.skip("libcudnn loads here")
    _loader.reset()
    try:
        ok, reason = cudnn_backend.available()
        assert not ok and "libcudnn" in reason, reason
        assert cudnn_backend.versions()["frontend"] == _loader.PINNED_FRONTEND
    finally:
        _loader.reset()


# --------------------------------------------------------------------------- selection, explained


@pytest.fixture
def fake_backends(monkeypatch):
    """GPU backends as stand-ins (no GPU here): cuda always works, cudnn as configured."""
    fakes = {name: types.SimpleNamespace(NAME=name, available=lambda: (True, "ok"),
                                         supports=lambda *a: (True, "ok")) for name in ("cuda", "cudnn")}
    monkeypatch.setattr(_dispatch, "backend_module", lambda name: fakes.get(name) or numpy_backend)
    return fakes


def _select(op="conv2d_backprop_filter", backend=None, use_cudnn_on_gpu=True, dtype=np.float32):
    return _dispatch.select_backend(op, _arrays.GPU, backend, None, np.dtype(dtype), use_cudnn_on_gpu).NAME


def test_last_backend_decision_explains_why_not_cudnn(fake_backends, caplog):
    caplog.set_level(logging.DEBUG, logger="gradops")
    kernels = "; gradops' CUDA kernels: ok"  # the cuda backend's supports() reason follows
    assert _select() == "cudnn"
    assert gradops.last_backend_decision().reason.startswith("use_cudnn_on_gpu=True and cuDNN supports")
    assert _select(use_cudnn_on_gpu=False) == "cuda"
    assert gradops.last_backend_decision() == gradops.BackendDecision(
        "conv2d_backprop_filter", "cuda", "use_cudnn_on_gpu=False" + kernels)
    assert _select("fractional_avg_pool_grad") == "cuda"
    assert gradops.last_backend_decision().reason == "cuDNN has no fractional_avg_pool_grad" + kernels
    fake_backends["cudnn"].supports = lambda *a: (False, "cuDNN graphs do not support float64 convolutions")
    assert _select(dtype=np.float64) == "cuda"
    assert gradops.last_backend_decision().reason == (
        "cuDNN does not support this call: cuDNN graphs do not support float64 convolutions" + kernels)
    fake_backends["cudnn"].available = lambda: (False, "the cuDNN Frontend is not installed")
    assert _select() == "cuda"
    assert gradops.last_backend_decision().reason == (
        "cuDNN is unavailable: the cuDNN Frontend is not installed" + kernels)
    assert _select(backend="cuda") == "cuda"
    assert gradops.last_backend_decision().reason == "backend='cuda' requested" + kernels
    with pytest.raises(BackendUnavailableError, match="the cuDNN Frontend is not installed"):
        _select(backend="cudnn")
    logged = [r.getMessage() for r in caplog.records if r.name == "gradops"]
    assert "conv2d_backprop_filter: backend cuda (use_cudnn_on_gpu=False" + kernels + ")" in logged


@pytest.mark.parametrize("op, run", [("depthwise_conv2d_native_backprop_filter", "gpu_h200_2026-12-04"),
                                     ("depthwise_conv2d_native_backprop_input", "gpu_h100_2026-12-05")])
def test_depthwise_gradients_take_the_kernels_by_default(fake_backends, op, run):
    """Both depthwise gradients go to gradops' kernels on GPU arrays even where cuDNN supports
    the call (_dispatch.CUDA_BY_DEFAULT: cuDNN measured slower, the filter gradient's grouped
    wgrad on an H200, the input gradient on an H100), saying why and naming the run;
    backend="cudnn" still takes cuDNN; the convolutions keep cuDNN's default."""
    assert _dispatch.CUDA_BY_DEFAULT.keys() == {"depthwise_conv2d_native_backprop_filter",
                                                "depthwise_conv2d_native_backprop_input"}
    assert _select(op) == "cuda"
    reason = gradops.last_backend_decision().reason
    assert reason.startswith("gradops' CUDA kernels by default for this op (backend='cudnn' takes cuDNN)")
    assert run in reason and reason.endswith("; gradops' CUDA kernels: ok")
    assert _select(op, backend="cudnn") == "cudnn"
    assert gradops.last_backend_decision().reason == "backend='cudnn' requested"
    assert _select(op, use_cudnn_on_gpu=False) == "cuda"
    assert gradops.last_backend_decision().reason.startswith("use_cudnn_on_gpu=False")
    for sibling in ("conv2d_backprop_input", "conv2d_backprop_filter"):
        assert _select(sibling) == "cudnn"


def test_last_backend_decision_for_host_calls_and_per_thread():
    x = np.ones((1, 3, 3, 1), np.float32)
    gradops.conv2d_backprop_filter(x, [2, 2, 1, 1], np.ones((1, 2, 2, 1), np.float32), [1, 1, 1, 1], "VALID")
    assert gradops.last_backend_decision() == gradops.BackendDecision(
        "conv2d_backprop_filter", "numpy", "the tensors are in host memory")
    seen = []
    t = threading.Thread(target=lambda: seen.append(gradops.last_backend_decision()))
    t.start()
    t.join()
    assert seen == [None]  # another thread made no call yet


def test_dispatch_uses_the_real_cudnn_module_reasons(fake, monkeypatch):
    """select_backend with the real cuDNN module (on the fake frontend) and a stand-in cuda backend."""
    cuda = types.SimpleNamespace(NAME="cuda", available=lambda: (True, "ok"), supports=lambda *a: (True, "ok"))
    real = _dispatch.backend_module
    monkeypatch.setattr(_dispatch, "backend_module", lambda name: cuda if name == "cuda" else real(name))
    g = geometry_of("conv2d_backprop_input", "NHWC", 1, 4, 4, 1, 2, 2, 2, 2)
    pick = _dispatch.select_backend
    assert pick("conv2d_backprop_input", _arrays.GPU, None, g, np.dtype(np.float32)).NAME == "cudnn"
    assert "cuDNN plan engine0" in gradops.last_backend_decision().reason
    assert pick("conv2d_backprop_input", _arrays.GPU, None, g, np.dtype(np.float64)).NAME == "cuda"
    assert "float64" in gradops.last_backend_decision().reason
    fake.plans[:] = [FakePlan("tf32-only", ["TENSOR_CORE"])]
    g2 = geometry_of("conv2d_backprop_input", "NHWC", 1, 5, 4, 1, 2, 2, 2, 2)
    assert pick("conv2d_backprop_input", _arrays.GPU, None, g2, np.dtype(np.float32)).NAME == "cuda"
    assert "survives the numerical-note filters" in gradops.last_backend_decision().reason
    with pytest.raises(BackendUnavailableError, match="survives the numerical-note filters"):
        pick("conv2d_backprop_input", _arrays.GPU, "cudnn", g2, np.dtype(np.float32))


class StandInRuntime(_graphs.CupyRuntime):
    """The cuDNN path's runtime on the host stand-in (tests/cuda_host.py): CuPy's calls (the
    stand-in's arrays and current device), pointers as the fake frontend reads them."""

    def stream_ptr(self):
        return NumpyRuntime.STREAM

    @staticmethod
    def pointer(array):
        return int(array.ctypes.data)

    def workspace(self, nbytes):
        return self.xp.empty(nbytes, np.uint8)


def test_cudnn_probes_builds_and_runs_on_the_arrays_device(rng, monkeypatch, request):
    """Arrays on device 1 while device 0 is current (the host stand-in's two devices): cuDNN's
    self-test, its handle, its graph (built by supports() during selection) and the launch all
    happen on device 1, and the graph built during selection is the one that runs."""
    from conftest import _install_host_device

    host_device = _install_host_device(request, monkeypatch)
    import cupy

    # The stand-in has no arange (the self-test's input); its install keeps cuDNN off: undone here.
    monkeypatch.setattr(cupy, "arange", lambda *a, **k: host_device.asarray(np.arange(*a, **k)), raising=False)
    module = make_fake_cudnn()
    handle_devices = []
    create_handle = module.create_handle

    def spy_create_handle():
        handle_devices.append(cupy.cuda.Device().id)
        return create_handle()

    module.create_handle = spy_create_handle
    monkeypatch.setattr(_loader, "load", lambda: (module, "cuDNN 9.14.0 through the cuDNN Frontend 1.28.0"))
    monkeypatch.setattr(_graphs, "runtime", StandInRuntime())
    monkeypatch.setattr(_graphs, "_state", _graphs._ThreadState())
    monkeypatch.setattr(cudnn_backend, "_probed", {})

    g = geometry_of("conv2d_backprop_input", "NHWC", 2, 5, 6, 1, 2, 3, 3, 2, (2, 2), "SAME")
    x, f, dy = arrays_for(rng, g, np.float32)
    with cupy.cuda.Device(1):
        gf, gdy = cupy.asarray(f), cupy.asarray(dy)
    with cupy.cuda.Device(0):
        got = gradops.conv2d_backprop_input(list(g.input_shape), gf, gdy, [1, 2, 2, 1], "SAME")
    assert gradops.last_backend_decision().backend == "cudnn"
    assert got.device.id == 1
    assert_close(cupy.asnumpy(got), expected("conv2d_backprop_input", g, x, f, dy), np.float32)
    assert set(cudnn_backend._probed) == {1}  # the self-test ran on device 1 only
    assert handle_devices == [1]
    assert [key[0] for key in _graphs._state.graphs] == [1, 1]  # the self-test's graph and the call's
    assert len(module.graphs) == 2 and module.executed == ["engine0", "engine0"]


# --------------------------------------------------------------------------- on a GPU

gpu = pytest.mark.gpu


def _public_call(op, g, x, f, dy, backend, layout_kw):
    """Call the public op on GPU arrays with ``backend``; returns a NumPy result."""
    import cupy

    xg, fg, dyg = (to_gpu(a) for a in (x, f, dy))
    if op == "conv2d_backprop_filter":
        out = gradops.conv2d_backprop_filter(xg, list(g.filter_shape), dyg, **layout_kw, backend=backend)
    elif op == "conv2d_backprop_input":
        out = gradops.conv2d_backprop_input(list(g.input_shape), fg, dyg, **layout_kw, backend=backend)
    elif op == "depthwise_conv2d_native_backprop_input":
        out = gradops.depthwise_conv2d_native_backprop_input(list(g.input_shape), fg, dyg, **layout_kw,
                                                             backend=backend)
    elif op == "depthwise_conv2d_native_backprop_filter":
        out = gradops.depthwise_conv2d_native_backprop_filter(xg, list(g.filter_shape), dyg, **layout_kw,
                                                              backend=backend)
    elif op == "depthwise_conv2d_native":
        out = gradops.depthwise_conv2d_native(xg, fg, **layout_kw, backend=backend)
    else:
        out = gradops.conv2d(xg, fg, **layout_kw, backend=backend)
    assert isinstance(out, cupy.ndarray)
    return to_host(out)


def _gpu_case(rng, op, layout, dtype, depthwise=False, **kw):
    g = geometry_of(op, layout, 2, depthwise=depthwise, **kw)
    x, f, dy = arrays_for(rng, g, dtype)
    layout_kw = attrs(layout, kw.get("strides", (1, 1)), kw.get("padding", "VALID"), kw.get("dilations", (1, 1)),
                      kw.get("pads", NO_PADS))
    return g, x, f, dy, layout_kw


def _grid_kw(h, w, groups, cg, og, r, s, strides, padding, dilations, pads):
    return dict(h=h, w=w, groups=groups, cg=cg, og=og, r=r, s=s, strides=strides, padding=padding,
                dilations=dilations, pads=pads)


@gpu
@pytest.mark.parametrize("op", CONV_OPS)
@pytest.mark.parametrize(GRID_ARGS, GRID)
def test_gpu_cudnn_grid_matches_numpy(rng, op, layout, h, w, groups, cg, og, r, s, strides, padding, dilations,
                                      pads):
    g, x, f, dy, kw = _gpu_case(rng, op, layout, np.float32,
                                **_grid_kw(h, w, groups, cg, og, r, s, strides, padding, dilations, pads))
    try:
        got = _public_call(op, g, x, f, dy, "cudnn", kw)
    except BackendUnavailableError as exc:
        pytest.skip(f"cuDNN does not support this case here: {exc}")  # the reason is printed with -rs
    assert_close(got, expected(op, g, x, f, dy), np.float32)


@gpu
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(REPRESENTATIVE))
@pytest.mark.parametrize("op", CONV_OPS)
def test_gpu_cudnn_dtypes_layouts_match_numpy(rng, op, case, layout, dtype):
    g, x, f, dy, kw = _gpu_case(rng, op, layout, dtype, **REPRESENTATIVE[case])
    try:
        got = _public_call(op, g, x, f, dy, "cudnn", kw)
    except BackendUnavailableError as exc:
        pytest.skip(f"cuDNN does not support this case here: {exc}")
    assert got.dtype == np.dtype(dtype)
    assert_close(got, expected(op, g, x, f, dy), dtype)


@gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", list(DEPTHWISE_CASES))
@pytest.mark.parametrize("op", DEPTHWISE_OPS)
def test_gpu_cudnn_depthwise_matches_numpy(rng, op, case, layout):
    g, x, f, dy, kw = _gpu_case(rng, op, layout, np.float32, depthwise=True, **DEPTHWISE_CASES[case])
    try:
        got = _public_call(op, g, x, f, dy, "cudnn", kw)
    except BackendUnavailableError as exc:
        pytest.skip(f"cuDNN does not support this case here: {exc}")
    assert_close(got, expected(op, g, x, f, dy), np.float32)


@gpu
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", CONV_OPS[:2] + ["depthwise_conv2d_native_backprop_input"])
@pytest.mark.parametrize(GRID_ARGS, GRID[::7])
def test_gpu_cudnn_and_cuda_kernels_agree(rng, op, dtype, layout, h, w, groups, cg, og, r, s, strides, padding,
                                          dilations, pads):
    """Wherever both GPU backends support a case, they agree within the dtype's tolerance."""
    depthwise = op.startswith("depthwise")
    kw = _grid_kw(h, w, groups, cg, og, r, s, strides, padding, dilations, pads)
    if depthwise:
        kw["cg"] = 1
    g, x, f, dy, call_kw = _gpu_case(rng, op, layout, dtype, depthwise=depthwise, **kw)
    results = {}
    for backend in ("cudnn", "cuda"):
        try:
            results[backend] = _public_call(op, g, x, f, dy, backend, call_kw)
        except BackendUnavailableError as exc:
            pytest.skip(f"{backend} does not support this case: {exc}")
    want = expected(op, g, x, f, dy)
    scale = 2 * max(1.0, float(np.abs(want).max())) if want.size else 1.0  # both carry rounding error
    assert_close(results["cudnn"], results["cuda"].astype(np.float64), dtype, scale=scale)


@gpu
def test_gpu_default_selection_prefers_cudnn_and_explains_float64(rng):
    g, x, f, dy, kw = _gpu_case(rng, "conv2d_backprop_input", "NHWC", np.float32, **REPRESENTATIVE["same-s1"])
    ok, reason = cudnn_backend.available()
    assert ok, reason
    _public_call("conv2d_backprop_input", g, x, f, dy, None, kw)
    assert gradops.last_backend_decision().backend == "cudnn"
    x64, f64, dy64 = (a.astype(np.float64) for a in (x, f, dy))
    try:
        _public_call("conv2d_backprop_input", g, x64, f64, dy64, None, kw)
    except BackendUnavailableError as exc:
        pytest.skip(f"gradops' CUDA kernels cannot run float64 here either: {exc}")
    decision = gradops.last_backend_decision()
    assert decision.backend == "cuda" and "float64" in decision.reason


@gpu
def test_gpu_deterministic_by_default_and_tf32_off(rng):
    """Two runs are bitwise equal, and float32 results keep float32 accuracy (no TF32)."""
    g, x, f, dy, kw = _gpu_case(rng, "conv2d_backprop_filter", "NHWC", np.float32, h=17, w=19, groups=1, cg=32,
                                og=32, r=3, s=3, padding="SAME")
    first = _public_call("conv2d_backprop_filter", g, x, f, dy, "cudnn", kw)
    second = _public_call("conv2d_backprop_filter", g, x, f, dy, "cudnn", kw)
    assert np.array_equal(first, second)
    want = expected("conv2d_backprop_filter", g, x, f, dy)
    # TF32 keeps 10 mantissa bits: its error here would be ~1e-3 of the scale, far above float32's.
    assert float(np.abs(first - want).max()) <= RTOL[np.dtype(np.float32)] * float(np.abs(want).max())


@gpu
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_gpu_adjoint_identity_through_cudnn(rng, layout):
    """<conv2d(x, w), dy> == <x, backprop_input(w, dy)> == <w, backprop_filter(x, dy)> on cuDNN (float32)."""
    kw_case = REPRESENTATIVE["valid-s2-d2-g2"]
    g, x, f, dy, kw = _gpu_case(rng, "conv2d", layout, np.float32, **kw_case)
    y = _public_call("conv2d", g, x, f, dy, "cudnn", kw)
    dx = _public_call("conv2d_backprop_input", g, x, f, dy, "cudnn", kw)
    dw = _public_call("conv2d_backprop_filter", g, x, f, dy, "cudnn", kw)
    products = y.astype(np.float64) * dy
    lhs, scale = float(products.sum()), float(np.abs(products).sum())  # scale: sum of |terms|
    for rhs in (float(np.sum(x.astype(np.float64) * dx)), float(np.sum(f.astype(np.float64) * dw))):
        assert abs(lhs - rhs) <= RTOL[np.dtype(np.float32)] * scale


@gpu
def test_gpu_non_contiguous_cupy_views(rng):
    import cupy

    g, x, f, dy, kw = _gpu_case(rng, "conv2d_backprop_filter", "NCHW", np.float32, **REPRESENTATIVE["same-s1"])
    xg = cupy.asarray(np.asfortranarray(x))
    dyg = cupy.asarray(np.ascontiguousarray(dy[:, :, ::-1]))[:, :, ::-1]  # negative strides, same values
    assert dyg.strides[2] < 0
    got = gradops.conv2d_backprop_filter(xg, list(g.filter_shape), dyg, **kw, backend="cudnn")
    assert_close(cupy.asnumpy(got), expected("conv2d_backprop_filter", g, x, f, dy), np.float32)


def test_float_dtypes_cover_what_cudnn_refuses():
    """float64 is the one gradops dtype without a cuDNN route (kept in sync with FLOAT_DTYPES)."""
    refused = {np.dtype(d).name for d in FLOAT_DTYPES} - set(cudnn_backend.DTYPES)
    assert refused == {"float64"}
