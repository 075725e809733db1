"""The engines the harness times, each computing one op of a :class:`~.suites.Case`.

GPU mode: gradops' cuDNN backend, gradops' CUDA kernels, PyTorch (``torch.nn.grad``, which
calls cuDNN or its native depthwise kernels) and JAX/XLA (``jax.vjp`` of
``lax.conv_general_dilated``).  CPU mode: gradops' NumPy backend and tensorflow-cpu.
GPU libraries are imported only when an engine is used.

Every engine gets the same host arrays (TF layouts: tensors in ``data_format``, filters HWIO
or [rows, cols, depth, multiplier]), copies them to its device once in :meth:`prepare`, and
returns results to the host in the same layouts from :meth:`to_host`.  Layout conversions a
library needs for its own conventions (PyTorch's OIHW filters) happen outside the timed call.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import numpy as np

from .._dtypes import bfloat16
from .suites import (CONV_FILTER, CONV_INPUT, DEPTHWISE_FILTER, DEPTHWISE_INPUT, FRACTIONAL, FRACTIONAL_AVG_FORWARD,
                     FRACTIONAL_FORWARD_OPS, FRACTIONAL_MAX, FRACTIONAL_MAX_FORWARD, FRACTIONAL_OPS, POOLING_OPS,
                     Case)

CUDA_EVENTS = "cuda-events"
WALL_CLOCK = "wall-clock"
#: The operands that are tensors (moved to a device, widened for the reference); the pooling
#: sequences stay host integer vectors.
TENSORS = ("input", "filter", "out_backprop", "orig_input", "orig_output", "value")


# --------------------------------------------------------------------------- inputs


def make_inputs(case: Case, dtype: np.dtype, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random operands of ``case`` (standard normal rounded to ``dtype``), in TF layouts.

    Fractional max pooling's ``orig_output`` is the forward max pooling of ``orig_input``
    (gradops' NumPy ``fractional_max_pool``, exact in every dtype), as the op requires.
    """
    geometry = case.geometry()

    def normal(shape):
        work = np.float64 if np.dtype(dtype) == np.float64 else np.float32
        return rng.standard_normal(shape, dtype=work).astype(dtype)

    if case.op in POOLING_OPS:
        rows, cols = case.pooling_sequences()
        arrays = {"row_pooling_sequence": rows, "col_pooling_sequence": cols}
        if case.op in FRACTIONAL_FORWARD_OPS:
            arrays["value"] = normal(geometry.input_shape)
            return arrays
        if case.op == FRACTIONAL_MAX:
            import gradops

            arrays["orig_input"] = normal(geometry.input_shape)
            arrays["orig_output"] = gradops.fractional_max_pool(arrays["orig_input"], rows, cols, case.overlapping,
                                                                backend="numpy")
        arrays["out_backprop"] = normal(geometry.output_shape)
        return arrays
    arrays = {"out_backprop": normal(geometry.out_backprop_shape)}
    if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
        arrays["input"] = normal(geometry.input_shape)
    else:
        arrays["filter"] = normal(geometry.filter_shape)
    return arrays


def batch_slice(case: Case, arrays: dict[str, np.ndarray], batch: int) -> tuple[Case, dict[str, np.ndarray]]:
    """The same call on the first ``batch`` items (batch is axis 0 in every layout; the forward
    pooling of each item depends on that item alone, so orig_output slices as well)."""
    small = case.with_batch(batch)
    out = dict(arrays)
    for name in ("input", "out_backprop", "orig_input", "orig_output", "value"):
        if name in out:
            out[name] = np.ascontiguousarray(out[name][:batch])
    return small, out


def call_gradops(case: Case, arrays: dict[str, Any], backend: str | None):
    """The public gradops function for ``case.op`` on ``arrays``, as a TF user would call it."""
    import gradops

    attrs = dict(explicit_paddings=case.tf_explicit_paddings(), data_format=case.data_format,
                 dilations=case.tf_dilations(), backend=backend)
    if case.op == CONV_FILTER:
        return gradops.conv2d_backprop_filter(arrays["input"], list(case.filter_shape), arrays["out_backprop"],
                                              case.tf_strides(), case.padding, **attrs)
    if case.op == CONV_INPUT:
        return gradops.conv2d_backprop_input(list(case.input_tensor_shape()), arrays["filter"], arrays["out_backprop"],
                                             case.tf_strides(), case.padding, **attrs)
    if case.op == DEPTHWISE_INPUT:
        return gradops.depthwise_conv2d_native_backprop_input(list(case.input_tensor_shape()), arrays["filter"],
                                                              arrays["out_backprop"], case.tf_strides(), case.padding,
                                                              **attrs)
    if case.op == DEPTHWISE_FILTER:
        return gradops.depthwise_conv2d_native_backprop_filter(arrays["input"], list(case.filter_shape),
                                                               arrays["out_backprop"], case.tf_strides(), case.padding,
                                                               **attrs)
    if case.op in FRACTIONAL_FORWARD_OPS:  # fractional_avg_pool, fractional_max_pool
        return getattr(gradops, case.op)(arrays["value"], arrays["row_pooling_sequence"],
                                         arrays["col_pooling_sequence"], case.overlapping, backend=backend)
    if case.op == FRACTIONAL_MAX:
        return gradops.fractional_max_pool_grad(arrays["orig_input"], arrays["orig_output"], arrays["out_backprop"],
                                                arrays["row_pooling_sequence"], arrays["col_pooling_sequence"],
                                                case.overlapping, backend=backend)
    return gradops.fractional_avg_pool_grad(list(case.input_shape), arrays["out_backprop"],
                                            arrays["row_pooling_sequence"], arrays["col_pooling_sequence"],
                                            case.overlapping, backend=backend)


def numpy_reference(case: Case, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The NumPy backend in float64 on the same (already rounded) values: the check's reference."""
    wide = {k: (v.astype(np.float64) if k in TENSORS else v) for k, v in arrays.items()}
    return call_gradops(case, wide, "numpy")


# --------------------------------------------------------------------------- base


class Engine:
    """One library computing the ops.  Subclasses override what differs."""

    name = "engine"
    timer = WALL_CLOCK

    def available(self) -> tuple[bool, str]:
        return True, "available"

    def supports(self, case: Case, dtype: np.dtype) -> tuple[bool, str]:
        return True, "supported"

    def prepare(self, case: Case, dtype: np.dtype, arrays: dict[str, np.ndarray]) -> Callable[[], Any]:
        """Copy operands to the device; return a no-argument callable that runs the op once."""
        raise NotImplementedError

    def to_host(self, case: Case, result: Any) -> np.ndarray:
        return np.asarray(result)

    def sync(self, result: Any) -> None:
        """Wait until ``result`` is computed (wall-clock timing of asynchronous engines)."""

    def release(self) -> None:
        """Drop cached device memory between cases."""

    def versions(self) -> dict[str, str]:
        return {}


# --------------------------------------------------------------------------- CPU mode


class NumpyEngine(Engine):
    name = "numpy"

    def prepare(self, case, dtype, arrays):
        return lambda: call_gradops(case, arrays, "numpy")


class TensorFlowEngine(Engine):
    """tensorflow-cpu as installed (oneDNN as its environment says), raw ops on NumPy arrays."""

    name = "tensorflow"

    def __init__(self):
        self._tf = None

    def _import(self):
        if self._tf is None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
            import tensorflow as tf

            self._tf = tf
        return self._tf

    def available(self):
        try:
            self._import()
        except Exception as exc:  # not installed, or a broken install
            return False, f"tensorflow not importable: {type(exc).__name__}: {exc}"
        return True, "available"

    def supports(self, case, dtype):
        if case.op in FRACTIONAL_FORWARD_OPS:
            return False, "TF's forward fractional poolings draw their own pooling sequences"
        if case.op in FRACTIONAL_OPS:
            if np.dtype(dtype) not in (np.dtype(np.float32), np.dtype(np.float64)):
                name = "FractionalAvgPoolGrad" if case.op == FRACTIONAL else "FractionalMaxPoolGrad"
                return False, f"TF registers {name} for float32/float64 (and ints) only"
            return True, "supported"
        if case.data_format != "NHWC":
            return False, "TF's CPU kernels support NHWC only"
        if case.dilations != (1, 1):
            return False, "TF's CPU kernels do not support dilations > 1"
        return True, "supported"

    def prepare(self, case, dtype, arrays):
        tf = self._import()
        raw = tf.raw_ops
        attrs = dict(strides=case.tf_strides(), padding=case.padding, explicit_paddings=case.tf_explicit_paddings(),
                     data_format=case.data_format, dilations=case.tf_dilations())
        if case.op == CONV_FILTER:
            return lambda: raw.Conv2DBackpropFilter(input=arrays["input"], filter_sizes=list(case.filter_shape),
                                                    out_backprop=arrays["out_backprop"], **attrs).numpy()
        if case.op == CONV_INPUT:
            return lambda: raw.Conv2DBackpropInput(input_sizes=list(case.input_tensor_shape()), filter=arrays["filter"],
                                                   out_backprop=arrays["out_backprop"], **attrs).numpy()
        if case.op == DEPTHWISE_INPUT:
            return lambda: raw.DepthwiseConv2dNativeBackpropInput(
                input_sizes=list(case.input_tensor_shape()), filter=arrays["filter"],
                out_backprop=arrays["out_backprop"], **attrs).numpy()
        if case.op == DEPTHWISE_FILTER:
            return lambda: raw.DepthwiseConv2dNativeBackpropFilter(
                input=arrays["input"], filter_sizes=list(case.filter_shape), out_backprop=arrays["out_backprop"],
                **attrs).numpy()
        if case.op == FRACTIONAL_MAX:
            return lambda: raw.FractionalMaxPoolGrad(
                orig_input=arrays["orig_input"], orig_output=arrays["orig_output"],
                out_backprop=arrays["out_backprop"], row_pooling_sequence=arrays["row_pooling_sequence"],
                col_pooling_sequence=arrays["col_pooling_sequence"], overlapping=case.overlapping).numpy()
        return lambda: raw.FractionalAvgPoolGrad(
            orig_input_tensor_shape=list(case.input_shape), out_backprop=arrays["out_backprop"],
            row_pooling_sequence=arrays["row_pooling_sequence"], col_pooling_sequence=arrays["col_pooling_sequence"],
            overlapping=case.overlapping).numpy()

    def versions(self):
        tf = self._import()
        return {"tensorflow": tf.__version__,
                "TF_ENABLE_ONEDNN_OPTS": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "unset (oneDNN on)")}


# --------------------------------------------------------------------------- GPU mode


class GradopsGpuEngine(Engine):
    """gradops on CuPy arrays with ``backend="cuda"`` (our kernels) or ``backend="cudnn"``.

    ``path`` (cuda only): the depthwise input gradient's kernel path forced through its launcher
    (its launcher's PATHS: "tiled", "planes", "planes_staged", "planes_direct", "mma", "mma_runs", "mma_nhwc",
    "direct", "transpose"), the depthwise filter gradient's tiled kernel with its
    staging forced ("sync", "async"), its layout's tensor-core kernel ("mma") or its planes kernel's
    window loads ("planes_pairs", "planes_lanes"), or either fractional pooling
    gradient's kernels ("gather",
    "cells"); the engine is then ``gradops-cuda:PATH`` and supports only the cases that path
    can run, for A/B timings of kernels on one device."""

    timer = CUDA_EVENTS

    def __init__(self, backend: str, path: str | None = None):
        if path is not None and backend != "cuda":
            raise ValueError("a kernel path is a cuda backend choice")
        self.backend = backend
        self.path = path
        self.name = f"gradops-{backend}" + (f":{path}" if path else "")

    def _module(self):
        from .._dispatch import backend_module

        return backend_module(self.backend)

    @staticmethod
    def _launcher(op: str):
        import importlib

        return importlib.import_module(f"gradops.backends.cuda.{op}")

    def _paths(self, op: str) -> tuple[str, ...]:
        """The paths ``op``'s launcher can be forced to (none for the ops without a choice)."""
        if op not in (DEPTHWISE_INPUT, DEPTHWISE_FILTER, FRACTIONAL, FRACTIONAL_MAX):
            return ()
        launcher = self._launcher(op)
        return launcher.STAGING_PATHS if op == DEPTHWISE_FILTER else launcher.PATHS

    def available(self):
        try:
            return self._module().available()
        except Exception as exc:
            return False, f"failed to load: {type(exc).__name__}: {exc}"

    def supports(self, case, dtype):
        from .._dispatch import CUDNN_OPS

        if self.backend == "cudnn" and case.op not in CUDNN_OPS:
            return False, "not a cuDNN op"
        if self.path is not None:
            if self.path not in self._paths(case.op):
                return False, f"{case.op} has no kernel path {self.path}"
            launcher = self._launcher(case.op)
            try:
                if case.op == DEPTHWISE_FILTER:
                    launcher.check_staging_path(case.geometry(), np.dtype(dtype), self.path)
                else:
                    launcher.pick_path(case.geometry(), np.dtype(dtype), self.path)
            except ValueError as exc:
                return False, str(exc)
            return True, "supported"
        return self._module().supports(case.op, case.geometry(), np.dtype(dtype))

    def prepare(self, case, dtype, arrays):
        import cupy

        device = {k: (cupy.asarray(v) if k in TENSORS else v) for k, v in arrays.items()}
        if self.path is not None:
            ok, reason = self.supports(case, dtype)
            if not ok:
                raise ValueError(reason)
            g = case.geometry()
            launch = getattr(self._launcher(case.op), case.op)
            if case.op == FRACTIONAL:
                return lambda: launch(g, device["out_backprop"], path=self.path)
            if case.op == FRACTIONAL_MAX:
                return lambda: launch(g, device["orig_input"], device["orig_output"], device["out_backprop"],
                                      path=self.path)
            if case.op == DEPTHWISE_FILTER:
                if self.path == "mma":
                    return lambda: launch(g, device["input"], device["out_backprop"], mma=True)
                if self.path.startswith("planes_"):  # the planes kernel's window loads: pairs or lane blocks
                    lanes = self.path == "planes_lanes"
                    return lambda: launch(g, device["input"], device["out_backprop"], planes=True, pairs=True,
                                          lanes=lanes)
                copies = self.path == "async"
                return lambda: launch(g, device["input"], device["out_backprop"], tiled=True, async_copies=copies)
            return lambda: launch(g, device["filter"], device["out_backprop"], path=self.path)
        return lambda: call_gradops(case, device, self.backend)

    def to_host(self, case, result):
        import cupy

        return cupy.asnumpy(result)

    def release(self):
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()

    def versions(self):
        if self.backend != "cudnn":
            return {}
        try:
            from ..backends.cudnn import versions

            found = versions()
            return {"cudnn_frontend": str(found["frontend"]), "cudnn": str(found["library"])}
        except Exception:  # versions are report metadata: never fail the run over them
            return {}


def _symmetric_padding(case: Case):
    """PyTorch pads both sides equally: the common part, and what is left over per side.

    Returns ((pad_rows, pad_cols), (extra_top, extra_bottom, extra_left, extra_right)); TF's
    SAME puts an odd padding element at the bottom/right, which the extras carry.
    """
    g = case.geometry()
    pad_rows, pad_cols = min(g.pad_top, g.pad_bottom), min(g.pad_left, g.pad_right)
    return (pad_rows, pad_cols), (g.pad_top - pad_rows, g.pad_bottom - pad_rows,
                                  g.pad_left - pad_cols, g.pad_right - pad_cols)


class TorchEngine(Engine):
    """PyTorch's convolution gradients (``torch.nn.grad.conv2d_weight`` / ``conv2d_input``).

    NHWC tensors are handed over as channels-last views, so cuDNN runs in NHWC as for us;
    depthwise is ``groups = in_depth`` (filter [C * M, 1, R, S], output channel c * M + m as
    TF's).  Asymmetric padding (TF's SAME with an odd total)
    becomes symmetric padding on an input grown by the extra rows/columns: zero rows/columns
    added to ``input`` for the filter gradient (outside the timed call), a slice of a larger
    input gradient for the input gradient.
    """

    name = "torch"
    timer = CUDA_EVENTS

    def __init__(self, allow_tf32: bool = False, deterministic: bool = True, stream_ptr: int | None = None,
                 device: str = "cuda"):
        self.allow_tf32 = allow_tf32
        self.deterministic = deterministic
        self.stream_ptr = stream_ptr
        self.device = device  # "cpu" lets tests check the layout handling without a GPU
        self._torch = None

    def _import(self):
        if self._torch is None:
            import torch

            cudnn = torch.backends.cudnn
            conv_settings = getattr(cudnn, "conv", None)
            if conv_settings is not None and hasattr(conv_settings, "fp32_precision"):
                conv_settings.fp32_precision = "tf32" if self.allow_tf32 else "ieee"  # PyTorch >= 2.9
            else:
                cudnn.allow_tf32 = self.allow_tf32
            cudnn.deterministic = self.deterministic
            cudnn.benchmark = True  # autotune each shape (among deterministic algorithms if set)
            if self.stream_ptr is not None:
                # Launch on the harness's stream, where the timing events are recorded.
                torch.cuda.set_stream(torch.cuda.ExternalStream(self.stream_ptr))
            self._torch = torch
        return self._torch

    def available(self):
        try:
            torch = self._import()
        except Exception as exc:
            return False, f"torch not importable: {type(exc).__name__}: {exc}"
        if self.device == "cuda" and not torch.cuda.is_available():
            return False, "torch sees no CUDA device"
        return True, "available"

    def supports(self, case, dtype):
        if case.op in (FRACTIONAL, FRACTIONAL_AVG_FORWARD):
            return False, "PyTorch has no fractional average pooling"
        if case.op in (FRACTIONAL_MAX, FRACTIONAL_MAX_FORWARD):
            return False, ("PyTorch's fractional max pooling draws its own cell boundaries (_random_samples), "
                           "not TF's pooling sequences")
        return True, "supported"

    def _tensor(self, array: np.ndarray):
        torch = self._torch
        array = np.ascontiguousarray(array)
        if array.dtype == bfloat16:  # torch.from_numpy does not know ml_dtypes' bfloat16
            return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(self.device)
        return torch.from_numpy(array).to(self.device)

    def _activation(self, array: np.ndarray, data_format: str):
        """An [N, C, H, W] tensor: a channels-last view of NHWC data, or NCHW as is."""
        t = self._tensor(array)
        return t.permute(0, 3, 1, 2) if data_format == "NHWC" else t

    def prepare(self, case, dtype, arrays):
        torch = self._import()
        g = case.geometry()
        (pad_rows, pad_cols), (top, bottom, left, right) = _symmetric_padding(case)
        stride, dilation = case.strides, case.dilations
        channels_last = torch.channels_last if case.data_format == "NHWC" else torch.contiguous_format
        dy = self._activation(arrays["out_backprop"], case.data_format)
        if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
            x = self._activation(arrays["input"], case.data_format)
            if top or bottom or left or right:
                x = torch.nn.functional.pad(x, (left, right, top, bottom)).contiguous(memory_format=channels_last)
            weight_size = (g.out_depth, g.filter_in_depth, g.filter_rows, g.filter_cols)  # depthwise: [C*M, 1, R, S]
            return lambda: torch.nn.grad.conv2d_weight(x, weight_size, dy, stride, (pad_rows, pad_cols), dilation,
                                                       g.groups)
        if case.op == CONV_INPUT:
            w = self._tensor(arrays["filter"].transpose(3, 2, 0, 1))  # HWIO -> OIHW
        else:  # depthwise: filter [R, S, C, M] -> [C*M, 1, R, S]; output channel c*M + m
            r, s, c, m = arrays["filter"].shape
            w = self._tensor(arrays["filter"].reshape(r, s, c * m).transpose(2, 0, 1)[:, None])
        w = w.contiguous(memory_format=channels_last)
        grown = (g.batch, g.in_depth, g.in_rows + top + bottom, g.in_cols + left + right)
        rows, cols = slice(top, top + g.in_rows), slice(left, left + g.in_cols)
        return lambda: torch.nn.grad.conv2d_input(grown, w, dy, stride, (pad_rows, pad_cols), dilation,
                                                  g.groups)[:, :, rows, cols]

    def to_host(self, case, result):
        torch = self._torch
        if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
            # OIHW -> HWIO; depthwise: [R, S, 1, C * M] -> TF's [R, S, C, M] (channel c * M + m)
            result = result.permute(2, 3, 1, 0).reshape(case.filter_shape)
        elif case.data_format == "NHWC":
            result = result.permute(0, 2, 3, 1)
        wide = torch.float64 if result.dtype == torch.float64 else torch.float32  # exact for the half types
        return result.to(wide).contiguous().cpu().numpy()

    def release(self):
        if self._torch is not None and self.device == "cuda":
            self._torch.cuda.empty_cache()

    def versions(self):
        torch = self._import()
        return {"torch": torch.__version__, "torch_cudnn": str(torch.backends.cudnn.version())}


class JaxEngine(Engine):
    """JAX/XLA: ``jax.vjp`` of ``lax.conv_general_dilated``, jitted; timed by wall clock.

    XLA launches on its own streams, which the CUDA events of the other engines do not see,
    so each timed call ends with ``block_until_ready`` (dispatch overhead included).
    """

    name = "jax"
    timer = WALL_CLOCK

    def __init__(self, allow_tf32: bool = False, deterministic: bool = True, platform: str = "gpu"):
        self.allow_tf32 = allow_tf32
        self.deterministic = deterministic
        self.platform = platform  # "cpu" lets tests check the layout handling without a GPU
        self._jax = None

    def _import(self):
        if self._jax is None:
            # JAX grabs most of the GPU's memory at start-up by default; CuPy and PyTorch need it too.
            os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            if self.deterministic and "xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
                os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
            import jax

            self._jax = jax
        return self._jax

    def available(self):
        try:
            jax = self._import()
            devices = jax.devices(self.platform)
        except Exception as exc:
            return False, f"jax with a {self.platform} backend not available: {type(exc).__name__}: {exc}"
        return (True, "available") if devices else (False, f"jax sees no {self.platform} device")

    def supports(self, case, dtype):
        if case.op in POOLING_OPS:
            return False, "JAX has no fractional pooling"
        if np.dtype(dtype) == np.float64 and not getattr(self._import().config, "jax_enable_x64", False):
            # Without x64 JAX silently computes in float32 (seen as float64 "mismatches" on an H100).
            return False, "JAX computes float64 only with jax_enable_x64, which is off"
        return True, "supported"

    def prepare(self, case, dtype, arrays):
        jax = self._import()
        import jax.numpy as jnp
        from jax import lax

        g = case.geometry()
        precision = lax.Precision.DEFAULT if self.allow_tf32 else lax.Precision.HIGHEST
        dimension_numbers = (case.data_format, "HWIO", case.data_format)

        def conv(x, w):
            return lax.conv_general_dilated(x, w, case.strides, [(g.pad_top, g.pad_bottom), (g.pad_left, g.pad_right)],
                                            rhs_dilation=case.dilations, dimension_numbers=dimension_numbers,
                                            feature_group_count=g.groups, precision=precision)

        device = jax.devices(self.platform)[0]
        dy = jax.device_put(arrays["out_backprop"], device)
        if case.op in (CONV_FILTER, DEPTHWISE_FILTER):
            x = jax.device_put(arrays["input"], device)
            w_shape = (g.filter_rows, g.filter_cols, g.filter_in_depth, g.out_depth)  # depthwise: [R, S, 1, C*M]

            @jax.jit
            def grad(x, dy):
                _, vjp = jax.vjp(lambda w: conv(x, w), jnp.zeros(w_shape, dy.dtype))
                return vjp(dy)[0].reshape(case.filter_shape)  # depthwise: TF's [R, S, C, M] (a free reshape)

            return lambda: grad(x, dy)
        w = arrays["filter"]
        if case.op == DEPTHWISE_INPUT:
            r, s, c, m = w.shape
            w = w.reshape(r, s, 1, c * m)  # HWIO with groups = c; output channel c*M + m as TF
        w = jax.device_put(w, device)
        x_shape = case.input_tensor_shape()

        @jax.jit
        def grad(w, dy):
            _, vjp = jax.vjp(lambda x: conv(x, w), jnp.zeros(x_shape, dy.dtype))
            return vjp(dy)[0]

        return lambda: grad(w, dy)

    def to_host(self, case, result):
        return np.asarray(result)

    def sync(self, result):
        result.block_until_ready()

    def versions(self):
        jax = self._import()
        return {"jax": jax.__version__, "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}


def cpu_engines() -> list[Engine]:
    return [NumpyEngine(), TensorFlowEngine()]


def gpu_engines(allow_tf32: bool, deterministic: bool, stream_ptr: int | None) -> list[Engine]:
    return [GradopsGpuEngine("cudnn"), GradopsGpuEngine("cuda"), TorchEngine(allow_tf32, deterministic, stream_ptr),
            JaxEngine(allow_tf32, deterministic)]


#: Speed comparisons reported per mode: (engine, baseline); speedup = baseline time / engine time.
GPU_SPEEDUPS = (("gradops-cuda", "gradops-cudnn"), ("gradops-cuda", "torch"), ("gradops-cudnn", "torch"),
                ("gradops-cuda", "jax"))
CPU_SPEEDUPS = (("numpy", "tensorflow"),)
