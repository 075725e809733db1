"""cuDNN Frontend graphs: build once per problem, execute with new pointers every call.

A graph (one fprop, dgrad or wgrad node) is built for a :class:`~._spec.ConvSpec`, the
device and the numerical options, and kept in a per-thread LRU cache.  Per thread because a
finalized plan belongs to the handle it was built with and the frontend's graph objects are
not safe to drive from two threads at once; each thread owns one handle per device, bound to
CuPy's current stream before every launch.  Workspace comes from CuPy's memory pool.

Engine choice follows :func:`gradops.get_options`:

- ``deterministic`` (default True): engines with the NONDETERMINISTIC numerical note are
  deselected (they reduce with floating-point atomics); False lets cuDNN's heuristics pick
  the fastest.
- ``allow_tf32`` (default False): for float32, engines with the TENSOR_CORE note (which for
  float32 data means TF32 products) are deselected, so float32 stays float32-exact.

Always deselected: DOWN_CONVERT_INPUTS (inputs rounded to a narrower type); the
transform-domain engines (FFT, WINOGRAD and its tile sizes), whose transforms mix a whole tile,
so one Inf in the filter or out_backprop turns outputs that no tap of it reaches into NaN
(seen on an H100 with cuDNN 9.19: TF's direct convolution and gradops' kernels keep them
finite); and for the half types REDUCED_PRECISION_REDUCTION, since gradops promises float32
accumulation for them (compute type FLOAT).  When the filters leave no engine, the call is not supported by
cuDNN and the dispatcher uses gradops' own kernels, saying why.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..._options import Options
from ._spec import ALIGNMENT, DGRAD, FPROP, WGRAD, ConvSpec

log = logging.getLogger("gradops")

#: Built (or failed) graphs kept per thread; a plan holds little device memory, and a
#: training loop sees a few dozen distinct shapes.
CACHE_SIZE = 512
#: Heuristic modes asked for plans: A (the fast, usual query) then FALLBACK (engines that
#: support almost everything, in case A offers none that survive the note filters).
HEURISTIC_MODES = ("A", "FALLBACK")
#: Engines that gave wrong dilated filter gradients: on an H100 with cuDNN 9.19.0, a wgrad with
#: stride 2, dilation (1, 2) and padding ((1, 0), (0, 2)) over a 4x5 input came out of eng1 and
#: eng20 with errors of 3 to 8 (values of size 7; every other engine within 3e-7 or 2e-3), in
#: NCHW and NHWC, grouped or not; heuristics mode A ranked eng1 first.  gradops skips them for
#: every dilated wgrad (engine ids are stable within a cuDNN major version).
WRONG_DILATED_WGRAD_ENGINES = frozenset({"eng1", "eng20"})
#: Numerical notes of engines that compute in a transform domain (see the module docstring).
TRANSFORM_NOTES = ("FFT", "WINOGRAD", "WINOGRAD_TILE_4x4", "WINOGRAD_TILE_6x6", "WINOGRAD_TILE_13x13")

_HALF_TYPES = ("float16", "bfloat16")
_IO_TYPES = {"float16": "HALF", "bfloat16": "BFLOAT16", "float32": "FLOAT"}


class GraphUnsupported(Exception):
    """cuDNN cannot build a graph for this problem (no engine, or a rejected descriptor)."""


# --------------------------------------------------------------------------- device runtime


class CupyRuntime:
    """What the cuDNN path needs from CuPy; CPU tests swap in a NumPy stand-in."""

    @property
    def xp(self):
        import cupy

        return cupy

    def device_id(self) -> int:
        import cupy

        return cupy.cuda.Device().id

    def stream_ptr(self) -> int:
        import cupy

        return cupy.cuda.get_current_stream().ptr

    @staticmethod
    def pointer(array) -> int:
        return int(array.data.ptr)

    def workspace(self, nbytes: int):
        """``nbytes`` of device memory from CuPy's pool (released to it when dropped)."""
        import cupy

        return cupy.empty(nbytes, dtype=cupy.uint8)


runtime: Any = CupyRuntime()


def prepared(array):
    """``array`` as a dense C-order array at an aligned address (a copy only when needed)."""
    if not array.flags.c_contiguous or runtime.pointer(array) % ALIGNMENT:
        array = array.copy(order="C")
    return array


# --------------------------------------------------------------------------- per-thread state


class _ThreadState(threading.local):
    def __init__(self):
        self.handles: dict[int, Any] = {}
        self.graphs: OrderedDict[tuple, Built | GraphUnsupported] = OrderedDict()


_state = _ThreadState()


def handle(cudnn, device: int):
    """This thread's cuDNN handle for ``device`` (created on first use, on the current device)."""
    h = _state.handles.get(device)
    if h is None:
        h = _state.handles[device] = cudnn.create_handle()
    return h


def clear_cache() -> None:
    """Drop this thread's built graphs (handles are kept)."""
    _state.graphs.clear()


def cache_info() -> dict[str, int]:
    built = sum(1 for v in _state.graphs.values() if isinstance(v, Built))
    return {"built": built, "unsupported": len(_state.graphs) - built}


# --------------------------------------------------------------------------- building


@dataclass
class Built:
    """A graph with a built plan: its operand tensors by role and what it needs to run."""

    graph: Any
    tensors: dict[str, Any]  # role ("x", "w", "y") -> the graph's tensor
    plan_index: int
    plan_name: str
    workspace_size: int


def excluded_notes(cudnn, dtype: str, options: Options) -> list:
    """Numerical notes whose engines must not run this problem (see the module docstring)."""
    notes = [cudnn.numerical_note.DOWN_CONVERT_INPUTS]
    notes += [getattr(cudnn.numerical_note, name) for name in TRANSFORM_NOTES
              if hasattr(cudnn.numerical_note, name)]
    if options.deterministic:
        notes.append(cudnn.numerical_note.NONDETERMINISTIC)
    if dtype == "float32" and not options.allow_tf32:
        notes.append(cudnn.numerical_note.TENSOR_CORE)
    if dtype in _HALF_TYPES:
        notes.append(cudnn.numerical_note.REDUCED_PRECISION_REDUCTION)
    return notes


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def describe(cudnn, cudnn_handle, spec: ConvSpec) -> tuple[Any, dict[str, Any]]:
    """The frontend graph of ``spec`` (one conv node, operands by role "x", "w", "y"), not yet
    validated: the part of building that needs no libcudnn (CPU tests run it on the real
    frontend)."""
    io = getattr(cudnn.data_type, _IO_TYPES[spec.dtype])
    fp32 = cudnn.data_type.FLOAT  # accumulation / compute type, also for the half types
    graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=fp32, compute_data_type=fp32,
                          handle=cudnn_handle)
    tensors = {}
    conv = dict(pre_padding=list(spec.pre_padding), post_padding=list(spec.post_padding),
                stride=list(spec.stride), dilation=list(spec.dilation), compute_data_type=fp32)
    descs = {"x": spec.x, "w": spec.w, "y": spec.y}
    inputs = {FPROP: ("x", "w"), DGRAD: ("y", "w"), WGRAD: ("x", "y")}[spec.kind]
    output = {FPROP: "y", DGRAD: "x", WGRAD: "w"}[spec.kind]
    for role in inputs:
        tensors[role] = graph.tensor(name=role, dim=list(descs[role].dims), stride=list(descs[role].strides),
                                     data_type=io)
    if spec.kind == FPROP:
        out = graph.conv_fprop(image=tensors["x"], weight=tensors["w"], **conv)
    elif spec.kind == DGRAD:
        out = graph.conv_dgrad(loss=tensors["y"], filter=tensors["w"], **conv)
    else:
        out = graph.conv_wgrad(image=tensors["x"], loss=tensors["y"], **conv)
    # cuDNN cannot infer dgrad/wgrad output dims (strided convs are ambiguous): give all.
    out.set_output(True).set_dim(list(descs[output].dims)).set_stride(list(descs[output].strides))
    out.set_data_type(io)
    tensors[output] = out
    return graph, tensors


def build(cudnn, cudnn_handle, spec: ConvSpec, options: Options) -> Built:
    """Build the graph of ``spec`` and its first plan that survives the note filters.

    Raises :class:`GraphUnsupported` with cuDNN's reason when there is none.
    """
    try:
        graph, tensors = describe(cudnn, cudnn_handle, spec)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([getattr(cudnn.heur_mode, mode) for mode in HEURISTIC_MODES])
        graph.deselect_numeric_notes(excluded_notes(cudnn, spec.dtype, options))
        count = graph.get_execution_plan_count()
    except Exception as exc:  # the frontend reports rejected graphs as several exception types
        raise GraphUnsupported(f"cuDNN rejected the {spec.kind} graph: {first_line(exc)}") from exc
    # Walk the ranked plans ourselves: a deselected plan refuses to build, and any plan may
    # decline (alignment, shared memory); the first that builds is the heuristics' choice.
    failures = []
    dilated_wgrad = spec.kind == WGRAD and max(spec.dilation) > 1
    for index in range(count):
        if dilated_wgrad and _engine_of(graph, index) in WRONG_DILATED_WGRAD_ENGINES:
            failures.append(f"plan {index}: {_engine_of(graph, index)} gives wrong dilated filter gradients")
            continue
        try:
            graph.build_plan_at_index(index)
            workspace_size = int(graph.get_workspace_size_plan_at_index(index))
        except Exception as exc:
            failures.append(f"plan {index}: {first_line(exc)}")
            continue
        try:
            name = str(graph.get_plan_name_at_index(index))
        except Exception:  # the name is for logs only
            name = f"plan {index}"
        return Built(graph, tensors, index, name, workspace_size)
    detail = "; ".join(failures[:3]) + (f"; ... ({len(failures)} plans)" if len(failures) > 3 else "")
    raise GraphUnsupported(
        f"no cuDNN engine for this {spec.kind} survives the numerical-note filters "
        f"(deterministic={options.deterministic}, allow_tf32={options.allow_tf32})"
        + (f": {detail}" if detail else ": cuDNN proposed no plan"))


def _engine_of(graph, index: int) -> str:
    """The engine id ("eng20") of plan ``index``, from its name ("eng20_k2=6_k3=0"); "" if unnamed."""
    try:
        return str(graph.get_plan_name_at_index(index)).split("_")[0]
    except Exception:
        return ""


def get(cudnn, spec: ConvSpec, options: Options) -> Built:
    """The built graph for ``spec`` on the current device (cached); raises GraphUnsupported."""
    device = runtime.device_id()
    key = (device, spec, options.allow_tf32, options.deterministic)
    cache = _state.graphs
    entry = cache.get(key)
    if entry is None:
        try:
            entry = build(cudnn, handle(cudnn, device), spec, options)
            log.debug("cuDNN %s graph built on GPU %d: %s, workspace %d bytes (%s)", spec.kind, device,
                      entry.plan_name, entry.workspace_size, spec)
        except GraphUnsupported as exc:
            entry = exc
            log.debug("cuDNN cannot run %s on GPU %d: %s", spec, device, exc)
        cache[key] = entry
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    if isinstance(entry, GraphUnsupported):
        raise entry
    return entry


def execute(cudnn, spec: ConvSpec, options: Options, **arrays) -> None:
    """Run ``spec``'s graph on ``arrays`` (role -> dense, aligned array) on the current stream."""
    built = get(cudnn, spec, options)
    h = handle(cudnn, runtime.device_id())
    cudnn.set_stream(handle=h, stream=runtime.stream_ptr())
    workspace = runtime.workspace(built.workspace_size) if built.workspace_size > 0 else None
    pack = {built.tensors[role]: runtime.pointer(array) for role, array in arrays.items()}
    built.graph.execute_plan_at_index(pack, None if workspace is None else runtime.pointer(workspace),
                                      built.plan_index, h)
