"""Compile every kernel the way a GPU run will, on a machine without a GPU.

``python -m gradops install-check`` runs the runtime's own compile step
(:func:`_runtime.compile_kernels`: CuPy's NVRTC entry point, CuPy's include folders and C++
standard, gradops' options) for every instantiation each architecture can run.  The one piece of
CuPy it replaces is the lookup of the current device's architecture, which needs a GPU: the
check names the architecture instead, and targets it as CuPy does (a cubin for an arch NVRTC
knows, PTX beyond).  ``only_environment`` also refuses headers from outside the Python
environment (a system CUDA toolkit), so that a fresh environment holding one GPU extra proves
the extra complete (``scripts/check-gpu-install.sh``).

A file's instantiations for one arch compile as one NVRTC program (the runtime compiles one
instantiation at a time, with the same options); compile errors do not depend on the grouping.
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import _build, _runtime

#: The GPU generations checked: Volta (V100), Turing (T4), Ampere (A100; consumer and A10),
#: Ada (L4, L40), Hopper (H100), Blackwell (B200; consumer).  An arch the installed NVRTC cannot
#: target (CUDA 13 dropped Volta) is reported as such, not compiled.
ARCHS = (70, 75, 80, 86, 89, 90, 100, 120)


@contextlib.contextmanager
def _target(arch_of_device_lookup):
    """Within the block, CuPy's compiler takes the arch from the caller, not from a device."""
    from cupy.cuda import compiler

    saved = compiler._get_arch_for_options_for_nvrtc
    compiler._get_arch_for_options_for_nvrtc = arch_of_device_lookup
    try:
        yield
    finally:
        compiler._get_arch_for_options_for_nvrtc = saved


def _arch_option(arch=None):
    """CuPy's rule (``compiler._get_arch_for_options_for_nvrtc``) without its device lookup:
    SASS for an arch NVRTC can target, PTX for the driver to compile otherwise."""
    from cupy.cuda import compiler

    if not compiler._use_ptx and int(arch) <= int(compiler._get_max_compute_capability()):
        return f"-arch=sm_{arch}", "cubin"
    return f"-arch=compute_{arch}", "ptx"


def foreign_include_dirs(options) -> list[str]:
    """``-I`` folders of ``options`` outside this Python environment and gradops' own sources."""
    roots = [Path(sys.prefix).resolve(), _build.source_dir().resolve()]
    out = []
    for option in options:
        if option.startswith("-I"):
            folder = Path(option[2:]).resolve()
            if not any(folder == root or root in folder.parents for root in roots):
                out.append(option[2:])
    return out


def run(archs=ARCHS, sources=None, jobs: int = 1, only_environment: bool = False) -> dict:
    """Compile everything; returns ``{"nvrtc", "options", "foreign", "rows"}`` where each row is
    ``{arch, source, kernels, status ("ok" | "failed" | "not targetable"), seconds, detail}``."""
    import cupy

    nvrtc = cupy.cuda.nvrtc.getVersion()
    targetable = set(cupy.cuda.nvrtc.getSupportedArchs())
    options = _runtime.nvrtc_options()
    foreign = foreign_include_dirs(options) if only_environment else []
    missing = _build.missing_headers([o[2:] for o in options if o.startswith("-I")])
    jobs_todo = []
    rows = []
    for arch in archs:
        arch = _build.arch_number(arch)
        todo = _build.all_instantiations(arch)
        for source in sorted(todo):
            if sources and source not in sources:
                continue
            row = {"arch": f"sm_{arch}", "source": source, "kernels": len(todo[source]),
                   "status": "not targetable", "seconds": 0.0,
                   "detail": f"NVRTC {nvrtc[0]}.{nvrtc[1]} cannot target sm_{arch}"}
            rows.append(row)
            if arch in targetable:
                jobs_todo.append((row, arch, source, todo[source]))

    def compile_one(item):
        row, arch, source, expressions = item
        start = time.perf_counter()
        try:
            _runtime.compile_kernels(source, expressions, str(arch))
            row.update(status="ok", detail="")
        except Exception as exc:  # CompileException carries NVRTC's log
            row.update(status="failed", detail=f"{type(exc).__name__}: {exc}".strip())
        row["seconds"] = time.perf_counter() - start

    # Longest first, so that no large program is left compiling alone at the end: the cost of a
    # program grows with its kernels and its source (a rough guess that puts the depthwise input
    # gradient, about half of the total, first).
    jobs_todo.sort(key=lambda item: -len(item[3]) * len(_build.source_code(item[2])))
    with _target(_arch_option), ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(compile_one, jobs_todo))
    return {"nvrtc": f"{nvrtc[0]}.{nvrtc[1]}", "options": options, "foreign": foreign, "missing": missing,
            "rows": rows}
