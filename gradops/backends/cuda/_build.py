"""Kernel sources and their instantiations: shared by the runtime (CuPy) and the CPU compile check.

Nothing here imports CuPy.  Each op's launcher module lists the template instantiations it
launches (``instantiations()``); :func:`all_instantiations` gathers them so that the NVRTC
compile check (``tests/test_cuda_compile.py``, ``python -m gradops kernels``) compiles
exactly what the runtime can ask for.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..._dtypes import bfloat16

#: C++ element type and accumulator type per NumPy dtype (half types accumulate in float).
C_TYPES = {
    np.dtype(np.float16): ("__half", "float"),
    bfloat16: ("__nv_bfloat16", "float"),
    np.dtype(np.float32): ("float", "float"),
    np.dtype(np.float64): ("double", "double"),
}

#: C++ standard and flags every kernel is compiled with (runtime and compile check alike).
CXX_STD = "c++17"

#: Launcher modules, each with ``instantiations() -> {source file: [name expressions]}``.
LAUNCHERS = (
    "gradops.backends.cuda.depthwise_conv2d_native_backprop_input",
    "gradops.backends.cuda.depthwise_conv2d_native_backprop_filter",
    "gradops.backends.cuda.fractional_avg_pool_grad",
    "gradops.backends.cuda.fractional_max_pool_grad",
    "gradops.backends.cuda.fractional_pool",
    "gradops.backends.cuda.conv2d",
    "gradops.backends.cuda.conv2d_backprop_filter",
    "gradops.backends.cuda.conv2d_backprop_input",
)


def c_types(dtype) -> tuple[str, str]:
    """(element, accumulator) C++ type names for a NumPy dtype."""
    return C_TYPES[np.dtype(dtype)]


@lru_cache(maxsize=None)
def source_dir() -> Path:
    """``cuda_src/``: packaged as ``gradops.cuda_src`` in a wheel, or next to ``gradops/`` in a checkout."""
    package = Path(__file__).resolve().parents[2]  # .../gradops
    candidates = [package / "cuda_src", package.parent / "cuda_src"]
    for path in candidates:
        if (path / "gradops_common.cuh").is_file():
            return path
    raise FileNotFoundError("gradops' CUDA sources (cuda_src/) were not found; searched "
                            + ", ".join(str(p) for p in candidates))


def _headers_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for header in sorted(directory.glob("*.cuh")):
        digest.update(header.name.encode())
        digest.update(header.read_bytes())
    return digest.hexdigest()


@lru_cache(maxsize=None)
def source_code(filename: str) -> str:
    """The text of ``cuda_src/<filename>``, stamped with a digest of the shared headers.

    CuPy's on-disk kernel cache keys on the source text and options, not on the contents of
    ``-I`` headers; the stamp makes a header edit produce a new key.
    """
    directory = source_dir()
    text = (directory / filename).read_text()
    return f"// gradops headers sha256 {_headers_digest(directory)}\n{text}"


#: Where NVIDIA's pip wheels put CUDA headers, under ``site-packages/nvidia/``: CUDA 13 has one
#: folder for every component (``cu13/include``: the runtime's cuda_fp16.h and mma.h, and the
#: ``crt/`` headers mma.h includes, from ``nvidia-cuda-crt``); CUDA 12 has one per wheel
#: (``cuda_runtime/include`` for cuda_fp16.h and mma.h, ``cuda_nvcc/include`` for ``crt/``).
WHEEL_INCLUDE_DIRS = {13: ("cu13/include",), 12: ("cuda_runtime/include", "cuda_nvcc/include")}
#: The headers the kernels need: the half types (gradops_common.cuh), WMMA (igemm_tiles.cuh)
#: and the ``crt/`` header that mma.h includes.
REQUIRED_HEADERS = ("cuda_fp16.h", "cuda_bf16.h", "mma.h", "crt/mma.h")


def wheel_include_dirs(cuda_major: int | None = None) -> list[Path]:
    """Include folders of NVIDIA's CUDA header wheels on ``sys.path`` (CUDA ``cuda_major``, or
    every major), in :data:`WHEEL_INCLUDE_DIRS` order."""
    majors = [cuda_major] if cuda_major else sorted(WHEEL_INCLUDE_DIRS, reverse=True)
    dirs = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if not base.is_dir():
            continue
        for major in majors:
            dirs += [base / sub for sub in WHEEL_INCLUDE_DIRS.get(major, ()) if (base / sub).is_dir()]
    return dirs


def cuda_include_dirs(cuda_major: int | None = None) -> list[str]:
    """Folders holding the CUDA headers the kernels include, for a compile outside CuPy (the
    NVRTC compile check, the host build): the header wheels on ``sys.path``, then a toolkit the
    caller names with ``CUDA_PATH`` / ``CUDA_HOME``.  Nothing else: a toolkit that happens to be
    installed (``/usr/local/cuda``) must not hide a header the environment lacks."""
    dirs = wheel_include_dirs(cuda_major)
    dirs += [Path(os.environ[var]) / "include" for var in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(var)]
    seen, out = set(), []
    for d in dirs:
        if d.is_dir() and str(d) not in seen:
            seen.add(str(d))
            out.append(str(d))
    return out


def missing_headers(include_dirs) -> list[str]:
    """The :data:`REQUIRED_HEADERS` that none of ``include_dirs`` holds."""
    return [h for h in REQUIRED_HEADERS if not any((Path(d) / h).is_file() for d in include_dirs)]


def all_instantiations(arch: int | None = None) -> dict[str, list[str]]:
    """``{source file: [name expressions]}`` over every launcher module: those that compute
    capability ``arch`` (e.g. 75) can run, or every one (None)."""
    merged: dict[str, list[str]] = {}
    for name in LAUNCHERS:
        module = importlib.import_module(name)
        for filename, expressions in module.instantiations(arch).items():
            merged.setdefault(filename, [])
            merged[filename].extend(e for e in expressions if e not in merged[filename])
    return merged


def arch_number(arch) -> int:
    """``"sm_90"`` / ``"90"`` / 90 -> 90."""
    return int(str(arch).removeprefix("sm_").removeprefix("compute_"))


def _kernel_name(expression: str) -> str:
    """The template's name in a name expression (``ns::kernel<args>`` -> ``ns::kernel``)."""
    return expression.split("<", 1)[0].strip()


@dataclass(frozen=True)
class Cubin:
    """What :func:`_compiled` keeps of NVRTC's output: the cubin and ``{name expression:
    mangled name}``."""

    code: bytes
    symbol_mapping: dict


def compile_cache_dir() -> Path | None:
    """Where :func:`_compiled` keeps its cubins and compile logs between processes
    (``GRADOPS_SASS_CACHE_DIR``; the tests name one folder per run, shared by their workers, so
    that a compile several tests or both workers need runs once); None: not kept."""
    value = os.environ.get("GRADOPS_SASS_CACHE_DIR")
    return Path(value) if value else None


def _include_digest(include) -> str:
    """Every file under the CUDA include folders by name, size and modification time: a header
    wheel updated without NVRTC changes the key too."""
    digest = hashlib.sha256()
    for folder in include:
        for root, _, files in sorted(os.walk(folder)):
            for name in sorted(files):
                stat = os.stat(os.path.join(root, name))
                digest.update(f"{root}/{name} {stat.st_size} {stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@contextmanager
def file_lock(target: Path):
    """An exclusive lock on ``target``'s lock file while ``target`` is made: processes that need
    it at once (pytest-xdist's workers) make it once, the others waiting, then reading what the
    first wrote; none where fcntl is missing (each process makes its own)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a concurrent process never reads half a file, and a
    full disk leaves no partial file behind."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _compiled(archs, sources, ptxas_verbose: bool, texts: dict | None = None, only=None, options: dict | None = None,
              cache: bool = True):
    """Compile each listed source for each arch with NVRTC (cuda.core, no GPU needed); yields
    ``(source file, arch, name expressions, Cubin, compile log)``.  Raises on the first
    compile error with NVRTC's log.  ``texts``: ``{source file: text}`` compiled in place of the
    checkout's file (e.g. an older revision's, with today's headers); ``only``: the name
    expressions to compile (default: every one the launchers ask for; for a file in ``texts``,
    also names the launchers no longer ask for, of kernels the file's launcher still has: an
    older revision may have spelled its template arguments differently); ``options``: further
    ``ProgramOptions`` fields (e.g. ``{"fma": False}``, NVRTC's ``--fmad=false``).  ``cache``:
    read and write :func:`compile_cache_dir` where one is named, keyed by everything the compile
    reads (the text, gradops' headers, the CUDA headers, the name expressions, arch, options and
    NVRTC's version); False compiles afresh (a test that two compiles agree)."""
    import io
    import json

    from cuda.bindings import nvrtc
    from cuda.core import Program, ProgramOptions

    include = [str(source_dir())] + cuda_include_dirs(13)
    texts = texts or {}
    directory = compile_cache_dir() if cache else None
    if directory is not None:
        _, *version = nvrtc.nvrtcVersion()
        common = (tuple(version), CXX_STD, tuple(include), _headers_digest(source_dir()),
                  _include_digest(include[1:]), ptxas_verbose, sorted((options or {}).items()))
    for arch in archs:
        todo = all_instantiations(arch_number(arch))
        if sources is not None:
            todo = {k: v for k, v in todo.items() if k in sources}
        if only is not None:
            todo = {k: [e for e in v if e in only] + sorted(
                        e for e in only if e not in v and k in texts and _kernel_name(e) in {_kernel_name(x) for x in v})
                    for k, v in todo.items()}
            todo = {k: v for k, v in todo.items() if v}
        for filename, expressions in sorted(todo.items()):
            text = texts[filename] if filename in texts else source_code(filename)
            entry = None
            if directory is not None:
                key = hashlib.sha256(repr((common, filename, arch, tuple(expressions), text)).encode()).hexdigest()
                entry = directory / key[:2] / key
            with file_lock(entry) if entry is not None else nullcontext():
                if entry is not None and (entry / "meta.json").is_file():
                    meta = json.loads((entry / "meta.json").read_text())
                    code = Cubin((entry / "code.cubin").read_bytes(), meta["symbol_mapping"])
                    log = meta["log"]
                else:
                    program_options = ProgramOptions(name=filename, arch=arch, std=CXX_STD, include_path=include,
                                                     ptxas_options=["-v"] if ptxas_verbose else None, **(options or {}))
                    program = Program(text, "c++", program_options)
                    logs = io.StringIO()
                    try:
                        compiled = program.compile("cubin", name_expressions=tuple(expressions), logs=logs)
                    finally:
                        program.close()
                    mapping = {e: m.decode() if isinstance(m, bytes) else m
                               for e in expressions for m in [compiled.symbol_mapping[e]]}
                    code, log = Cubin(bytes(compiled.code), mapping), logs.getvalue().replace("\0", "")
                    if entry is not None:  # meta.json last: an entry without it is not read
                        write_atomic(entry / "code.cubin", code.code)
                        write_atomic(entry / "meta.json", json.dumps({"symbol_mapping": mapping, "log": log}).encode())
            yield filename, arch, expressions, code, log


def compile_check(archs=("sm_80", "sm_90"), sources=None) -> list[tuple[str, str, int]]:
    """Compile every instantiation each arch can run with NVRTC (cuda.core, no GPU needed).

    Returns ``[(source file, arch, number of kernels)]``; raises on the first compile error
    with NVRTC's log.  Needs ``cuda-core``, ``cuda-bindings`` and the NVRTC/runtime-header wheels
    (the ``test`` extra on Linux x86_64).
    """
    return [(filename, arch, len(expressions))
            for filename, arch, expressions, _, _ in _compiled(archs, sources, ptxas_verbose=False)]


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
#: "Used N registers, ..., S bytes smem[, C bytes cmem[0]]": sm_80's ptxas puts cmem after smem,
#: sm_90's leaves it out, so smem is searched for anywhere on the line, not anchored at its end.
_PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?\b(\d+) bytes smem)?")


def parse_ptxas_log(log: str) -> dict[str, dict[str, int]]:
    """ptxas ``-v`` output -> ``{mangled kernel name: {registers, spill_stores, spill_loads,
    stack_bytes, shared_bytes}}``."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if m := _PTXAS_ENTRY.search(line):
            current = out.setdefault(m.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                                                  "stack_bytes": 0, "shared_bytes": 0})
        elif current is not None and (m := _PTXAS_FRAME.search(line)):
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(int, m.groups())
        elif current is not None and (m := _PTXAS_USED.search(line.strip())):
            current["registers"] = int(m.group(1))
            current["shared_bytes"] = int(m.group(2) or 0)
    return out


_NVRTC_WARNING = re.compile(r"warning #\d+")


def compile_warnings(log: str) -> list[str]:
    """NVRTC's warning lines in a compile log (``file(line): warning #N-D: text``), each once.
    Every one is treated as a defect: #20054, for one, is a ``__shared__`` variable whose
    constructor the device never runs but the CPU execution model would."""
    return sorted({line.strip() for line in log.splitlines() if _NVRTC_WARNING.search(line)})


def spill_bytes(stats: dict[str, int]) -> tuple[int, int, int]:
    """(spill store, spill load, stack frame) bytes of one kernel's :func:`parse_ptxas_log` entry:
    all zero where ptxas kept the kernel in registers."""
    return stats["spill_stores"], stats["spill_loads"], stats["stack_bytes"]


def kernel_resources(archs=("sm_80", "sm_90"), sources=None) -> list[dict]:
    """What ptxas reports for every instantiation (a static check, no GPU needed): one dict per
    (source, arch, kernel) with registers per thread, spill stores/loads and stack bytes per
    thread, static shared memory bytes per block, and ``warnings``: NVRTC's warnings for the
    kernel's source and arch (:func:`compile_warnings`; every kernel of that compile has them)."""
    rows = []
    for filename, arch, expressions, code, log in _compiled(archs, sources, ptxas_verbose=True):
        stats = parse_ptxas_log(log)
        warnings = compile_warnings(log)
        for expression in expressions:
            mangled = code.symbol_mapping[expression]
            mangled = mangled.decode() if isinstance(mangled, bytes) else mangled
            rows.append({"source": filename, "arch": arch, "kernel": expression, **stats[mangled],
                         "warnings": warnings})
    return rows
