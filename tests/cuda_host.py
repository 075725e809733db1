"""Run the kernels of cuda_src/ on the CPU: their real source, compiled by the host C++ compiler.

CUDA's headers let host compilers build ``__global__``/``__device__`` code (the qualifiers
expand to nothing and cuda_fp16.h / cuda_bf16.h have host conversions).
``tests/cuda_host_runtime.h`` supplies the rest of the execution model: blocks and their
threads (fibers, one block at a time), ``__syncthreads``/``__syncwarp`` barriers, ``__shared__``
memory and emulations of ``nvcuda::wmma`` and of the PTX primitives of
``cuda_src/tensor_core_ptx.cuh`` (ldmatrix, mma.sync, cp.async); see its header comment.  This checks the kernels'
index math, tiling, barriers and summation on machines without a GPU; it says nothing about
speed or the real tensor-core and warp hardware (the GPU tests cover those).  It counts, where a
test asks, the bank wavefronts of shared-memory accesses that the emulated primitives or the
kernels report (``HostKernels.shared_stats``) and the 32-byte sectors of the global vector loads
made through cuda_src's ``load_vector`` (``HostKernels.global_load_stats``), per warp-level
instruction: coalescing and bank conflicts, of those accesses only.

Two ways in:

* :class:`HostKernels` compiles the instantiations of one ``.cu`` file; ``launch(expression,
  grid, block, pointers, scalars)`` runs one (``run`` is a one-thread launch).
* :class:`HostDevice` stands in for CuPy and a GPU under the real launchers
  (``gradops.backends.cuda.*``) and gradops' public API: ``install(monkeypatch)`` makes
  ``import cupy`` return a NumPy-backed module whose arrays (:class:`HostArray`) sit between
  NaN-filled guard bytes and present themselves as GPU memory (``__cuda_array_interface__``,
  DLPack, ``.device``), and routes ``_runtime.kernel`` to :class:`HostKernels`.  After every
  launch the guards are checked, so a kernel that writes outside an array fails the test;
  outputs start as NaN, so an element a kernel forgets to write shows up, and an out-of-bounds
  read of an input picks up guard NaN that propagates into the result.  Two devices are
  emulated, and a launch given memory that is not an array of the current device fails.

Racecheck builds (``HostKernels(racecheck=True)``, ``HostDevice(racecheck=True)``, the
``racecheck_device`` fixture; ``GRADOPS_HOST_RACECHECK=1`` makes every ``cuda_device`` test use
them) add g++'s ThreadSanitizer instrumentation, whose hooks the runtime header defines: every
access to a kernel's ``__shared__`` variables is checked against the block's barriers, and a
launch fails at the first hazard between two threads (what compute-sanitizer's racecheck reports
on a GPU), in whatever order the threads happened to run; and every access of kernel code that
g++ emits with its type's alignment, global or shared, is checked for that alignment (a GPU's
misaligned address error), and every access to the guard bytes around a ``HostDevice`` array is
refused (memcheck: out of bounds, reads included).  It checks accesses as the C++ source makes them, not as the
compiled SASS does.

Every build poisons the ``__shared__`` variables before each block (``poison_shared``): a GPU
leaves shared memory undefined when a block starts, so a kernel that reads what it has not
written gets NaN or finite garbage that changes with the block and the order of the run; and
racecheck builds start automatic variables as 0xfe bytes (``RACECHECK_CXX_FLAGS``), as a GPU's
registers hold garbage.

``GRADOPS_HOST_BUILD_LOG=FILE`` appends a JSON line to FILE for each library g++ builds (source
file, kernels, defines, whether from the checkout, seconds, the test): where a run's build time
goes.

What the stand-in cannot show: streams (every launch runs to completion at once), and
anything about the real CuPy beyond the handful of functions gradops calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import types
import weakref
from functools import lru_cache
from pathlib import Path

import numpy as np

from gradops import _arrays
from gradops.backends.cuda import _build
from gradops.backends.cudnn import _loader as _cudnn_loader

HERE = Path(__file__).resolve().parent
RUNTIME_HEADER = HERE / "cuda_host_runtime.h"

#: Launch orders of the host runtime (``gradops_host::Order``).
ORDERS = {"forward": 0, "reverse": 1, "shuffled": 2}


def toolkit_include() -> str | None:
    """A CUDA include directory that host compilers can use (the NVIDIA wheels of the test
    extra, or a toolkit install), or None."""
    for d in _build.cuda_include_dirs(13) + ["/usr/local/cuda/include"]:
        if all((Path(d) / name).is_file() for name in ("crt/host_defines.h", "cuda_fp16.h", "nv/target")):
            return d
    return None


def unavailable_reason() -> str | None:
    if os.environ.get("GRADOPS_TEST_HOST_MODEL") == "0":  # scripts/test-newest-numpy.sh (CI's time)
        return "GRADOPS_TEST_HOST_MODEL=0"
    if not sys.platform.startswith("linux"):
        return "the host runtime uses ucontext fibers (Linux)"
    if shutil.which("g++") is None:
        return "g++ is not installed"
    if toolkit_include() is None:
        return "no CUDA toolkit include directory (crt/host_defines.h) found"
    return None


class HostLaunchError(RuntimeError):
    """The host runtime refused a launch (a divergent barrier)."""


#: g++'s options for every host build.  No FMA contraction: sums round exactly as written, on
#: every host architecture.  Hidden visibility: each library's kernel code (its ``__shared__``
#: variables) is its own; the runtime header keeps itself visible (see its top).
HOST_CXX_FLAGS = ("-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-w", "-fvisibility=hidden")


#: g++'s options added for a racecheck build (HostKernels(racecheck=True)): ThreadSanitizer's
#: instrumentation of every memory access, without its calls at each function's entry and exit;
#: and no STB_GNU_UNIQUE symbols, so that the runtime's statics, whose racecheck state ordinary
#: builds lack, are the build's own, not shared with an ordinary build loaded in the same
#: process.  (Only here: it gives each library its own scheduler and fiber stacks, which in
#: every build multiplied a test worker's memory.)
#: Automatic variables start as 0xfe bytes there (a local that kernel code reads before writing it
#: gets a wrong value, as a GPU register's garbage would), not whatever the fiber's stack held.
#: Only there: 0xfefe is NaN in float16, which the tensor-core kernels' checked sums heal, so the
#: pattern hid a planted bug (nhwc-first-unit-not-loaded) that the stack's leftovers expose in
#: plain builds; the two kinds of build see the two kinds of garbage.
RACECHECK_CXX_FLAGS = ("-fsanitize=thread", "--param", "tsan-instrument-func-entry-exit=0", "-fno-gnu-unique",
                       "-ftrivial-auto-var-init=pattern")


def shared_variables(library: Path, loaded: ctypes.CDLL) -> list[tuple[int, int, str]]:
    """(address, bytes, name) of the ``__shared__`` variables of the kernels in ``library``:
    the runtime header makes them function-local statics, so they are the writable
    function-local statics of functions in namespace ``gradops`` (the emulated primitives of
    ``gradops::ptx`` have none; the runtime's own are in ``gradops_host``), found in the symbol
    table by ``nm`` and placed where the library was loaded."""
    base = ctypes.cast(loaded.shared_stats, ctypes.c_void_p).value
    return [(base + offset, size, name) for offset, size, name in _shared_variable_offsets(str(library))]


@lru_cache(maxsize=None)
def _shared_variable_offsets(library: str) -> tuple[tuple[int, int, str], ...]:
    """:func:`shared_variables` relative to ``shared_stats``, read once a process: a library's
    name is the digest of what built it, and nm takes about 50 ms on a whole source's library,
    which every test that loads it would pay again."""
    listing = subprocess.run(["nm", "-C", "-S", "--defined-only", library], capture_output=True, text=True,
                             check=True).stdout
    anchor = None
    variables = []
    for line in listing.splitlines():
        parts = line.split(None, 3)
        if len(parts) != 4:
            continue
        address, size, kind, name = parts
        if name == "shared_stats":
            anchor = int(address, 16)
        elif (kind in "bBdDuVv" and name.startswith("gradops::") and not name.startswith("gradops::ptx::")
              and ")::" in name):
            variables.append((int(address, 16), int(size, 16), name))
    if anchor is None:
        raise RuntimeError(f"no shared_stats symbol in {library}")
    return tuple((address - anchor, size, name) for address, size, name in variables)


#: Whether a checkout build posing as an older GPU (HostDevice's compute_capability below
#: sm_80, or build_as_arch) holds each kernel a test runs in its own library rather than the
#: whole source: False builds the whole source once a pose, as before 2026-12-07.
POSED_BUILDS_ALONE = True


def _build_directory() -> Path:
    directory = Path(tempfile.gettempdir()) / "gradops_host_kernels"
    directory.mkdir(exist_ok=True)
    return directory


def runtime_header_pch() -> Path | None:
    """A folder holding ``cuda_host_runtime.h.gch``: the runtime header (with the C++ and CUDA
    half-type headers it includes) precompiled once per content, which g++ takes in place of
    the header when it is first on the include path; None if it cannot be built (g++ then
    parses the header, as without it).  It spares each host build about a third of its time:
    planted-bug tests build a library each from their edited copy, a few hundred a run.  Only the
    runtime header is precompiled: the kernel sources, which planted-bug tests edit, are
    always parsed from the folder a build names."""
    digest = hashlib.sha256((" ".join(HOST_CXX_FLAGS) + str(toolkit_include()) + RUNTIME_HEADER.read_text()
                             ).encode()).hexdigest()[:16]
    folder = _build_directory() / f"pch_{digest}"
    pch = folder / f"{RUNTIME_HEADER.name}.gch"
    if not pch.exists():
        folder.mkdir(exist_ok=True)
        with _build.file_lock(pch):
            if not pch.exists():
                partial = folder / f"{RUNTIME_HEADER.name}.{os.getpid()}.tmp"
                build = subprocess.run(["g++", *HOST_CXX_FLAGS, "-x", "c++-header", str(RUNTIME_HEADER),
                                        f"-I{toolkit_include()}", "-o", str(partial)], capture_output=True, text=True)
                if build.returncode:
                    partial.unlink(missing_ok=True)
                    return None
                partial.replace(pch)  # atomic, as the libraries below
    return folder


def _instantiations(arch: int | None) -> dict[str, tuple[str, ...]]:
    """``_build.all_instantiations(arch)``, built once a process: every launch checks its kernel
    against it, and the launchers take milliseconds to list their kernels, which thousands of
    tests paid again (the lists are the launchers' constants).  A test that replaces
    ``_build.all_instantiations`` gets what its replacement says."""
    if _build.all_instantiations is not _ALL_INSTANTIATIONS:
        return _build.all_instantiations(arch)
    return _launchers_instantiations(arch)


_ALL_INSTANTIATIONS = _build.all_instantiations
#: The checkout's cuda_src/, whose reads and digests a process keeps (a test that points
#: ``_build.source_dir`` elsewhere, or builds edited copies, gets them afresh).
CHECKOUT_SOURCES = _build.source_dir()


@lru_cache(maxsize=None)
def _launchers_instantiations(arch: int | None) -> dict[str, tuple[str, ...]]:
    return {filename: tuple(expressions) for filename, expressions in _ALL_INSTANTIATIONS(arch).items()}


def _read_sources(source_dir: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """(every .cu / .cuh file's name and text, for a build's digest; ``{kernel name: (template
    parameters, max threads bound)}`` of each ``__launch_bounds__`` kernel).  Not the folder's
    name: a build reads the folder only through those files, so a planted-bug test's copy in a
    new temporary folder each run reuses the library an earlier run built from the same text."""
    texts, bounded = [], {}
    for path in sorted(source_dir.glob("*.cu*")):
        text = path.read_text()
        texts.append(f"{path.name} {len(text)}\n{text}")  # each file by name: no two layouts join alike
        for params, bounds, name in LAUNCH_BOUNDS.findall(text):
            bounded[name] = (params, max_threads_bound(bounds))
    return "".join(texts), bounded


def _library_text(filename: str, expressions: tuple[str, ...], source_dir: Path, defines: tuple[str, ...],
                  racecheck: bool) -> tuple[str, Path]:
    """(the C++ text of a host build of ``expressions``, the library it builds to: its name is
    the digest of the text, the flags, the sources and the runtime header)."""
    defines = list(defines)
    code = [f'#include "{RUNTIME_HEADER.name}"', f'#include "{filename}"']
    for i, expression in enumerate(expressions):
        code.append(f'GRADOPS_HOST_EXPORT int kernel_{i}(void* const* p, const long long* s, const unsigned* grid, '
                    f'const unsigned* block, int order, unsigned seed, const unsigned long long* only, '
                    f'long long only_count, char* error, int error_size) '
                    f'{{ return gradops_host::launch_kernel(&{expression}, p, s, grid, block, order, seed, '
                    f'only, only_count, error, error_size); }}')
        code.append(f'GRADOPS_HOST_EXPORT int signature_{i}(int* codes, int capacity) '
                    f'{{ return gradops_host::kernel_signature(&{expression}, codes, capacity); }}')
    code.append('GRADOPS_HOST_EXPORT void shared_regions(const unsigned long long* at, '
                'const unsigned long long* bytes, long long count) { '
                'auto& r = gradops_host::scheduler().shared_regions; r.clear(); '
                'for (long long i = 0; i < count; ++i) '
                'r.emplace_back(reinterpret_cast<unsigned char*>(at[i]), bytes[i]); }')
    code.append('GRADOPS_HOST_EXPORT void global_load_stats(long long* out, int reset) { '
                'auto& s = gradops_host::scheduler(); auto& t = s.global_loads; '
                'out[0] = t.accesses; out[1] = t.wavefronts; out[2] = t.ideal; if (reset) t = {}; }')
    code.append('GRADOPS_HOST_EXPORT void count_global_loads(int on) { '
                'gradops_host::scheduler().count_global = on != 0; }')
    code.append('GRADOPS_HOST_EXPORT void shared_stats(long long* out, int kind, int reset) { '
                'auto& t = gradops_host::scheduler().shared[kind]; '
                'out[0] = t.accesses; out[1] = t.wavefronts; out[2] = t.ideal; if (reset) t = {}; }')
    # __launch_bounds__: each bounded kernel template gets a constexpr twin returning its bound,
    # evaluated per instantiation below (the host build ignores the attribute itself).
    sources, bounded = _read_sources(source_dir)
    names = {expression_parts(e)[0] for e in expressions}
    for name in sorted(names & bounded.keys()):
        params, bound = bounded[name]
        code.append(f"namespace gradops {{ template <{params}> constexpr int host_launch_bound_{name}() "
                    f"{{ return {bound}; }} }}")
    for i, expression in enumerate(expressions):
        name, args = expression_parts(expression)
        value = (f"gradops::host_launch_bound_{name}<{args}>()" if name in bounded
                 else str(MAX_THREADS_PER_BLOCK))
        code.append(f'GRADOPS_HOST_EXPORT int launch_bound_{i}() {{ return {value}; }}')
    text = "\n".join(code) + "\n"
    flags = defines + (list(RACECHECK_CXX_FLAGS) if racecheck else [])
    digest = hashlib.sha256((" ".join(HOST_CXX_FLAGS + tuple(flags)) + text + sources + RUNTIME_HEADER.read_text()).encode()
                            ).hexdigest()[:16]
    directory = _build_directory()
    library = directory / f"{Path(filename).stem}_{digest}.so"
    return text, library


@lru_cache(maxsize=256)
def _checkout_library_text(filename, expressions, source_dir, defines, racecheck, stamp):
    """:func:`_library_text` of the checkout's sources, once a process while their sizes and
    times (``stamp``) stay the same: a test's device builds its libraries anew, and the text and
    digest of a whole source's took milliseconds that thousands of tests paid."""
    return _library_text(filename, expressions, source_dir, defines, racecheck)


def _log_build(filename, kernels, defines, checkout, seconds):
    """Where ``GRADOPS_HOST_BUILD_LOG`` names a file, append a JSON line for a library g++ just
    built: what a run's builds cost, by kind (the checkout's whole sources, edited copies,
    racecheck, posed archs), which a cold run (CI's: a fresh temporary folder) pays in full."""
    path = os.environ.get("GRADOPS_HOST_BUILD_LOG")
    if not path:
        return
    row = {"file": filename, "kernels": kernels, "defines": list(defines), "checkout": checkout,
           "seconds": round(seconds, 2), "test": os.environ.get("PYTEST_CURRENT_TEST", "")}
    with open(path, "a") as log:  # a line in one append: the test workers share the file
        log.write(json.dumps(row) + "\n")


class HostKernels:
    """The instantiations of one .cu file, compiled for the host."""

    def __init__(self, filename: str, expressions: list[str], source_dir: Path | None = None,
                 arch: int | None = None, racecheck: bool = False):
        """``source_dir``: where ``filename`` and its headers are (default: cuda_src/); the
        runtime's own tests point it at edited copies of the sources.  ``arch``: the compute
        capability (e.g. 75) the build poses as (``GRADOPS_HOST_ARCH``: the kernels take that
        GPU's code paths, e.g. WMMA instead of mma.sync before sm_80); default the newest.
        ``racecheck``: instrument every access to ``__shared__`` memory, and fail a launch at
        the first hazard between threads of a block (``racecheck`` in cuda_host_runtime.h);
        slower, for tests on small problems."""
        source_dir = Path(source_dir) if source_dir is not None else _build.source_dir()
        defines = [f"-DGRADOPS_HOST_ARCH={int(arch) * 10}"] if arch is not None else []
        if racecheck:
            defines.append("-DGRADOPS_HOST_RACECHECK=1")
        self.racecheck = racecheck
        self.filename = filename
        self.expressions = list(expressions)
        if source_dir == CHECKOUT_SOURCES:
            stamp = tuple((p.name, st.st_mtime_ns, st.st_size)
                          for p in [RUNTIME_HEADER, *sorted(source_dir.glob("*.cu*"))] for st in [p.stat()])
            text, library = _checkout_library_text(filename, tuple(self.expressions), source_dir, tuple(defines),
                                                   racecheck, stamp)
        else:
            text, library = _library_text(filename, tuple(self.expressions), source_dir, tuple(defines), racecheck)
        if not library.exists():
            with _build.file_lock(library):
                if not library.exists():
                    source = library.with_suffix(".cpp")
                    source.write_text(text)
                    partial = library.with_suffix(f".{os.getpid()}.tmp")
                    includes = [f"-I{HERE}", f"-I{source_dir}", f"-I{toolkit_include()}"]
                    if racecheck:
                        # Compiled with ThreadSanitizer's instrumentation, linked without its run-time
                        # library: the runtime header defines the entry points the instrumentation calls.
                        objects = partial.with_suffix(".o")
                        steps = [["g++", *HOST_CXX_FLAGS, *RACECHECK_CXX_FLAGS, *defines, *includes, "-c", str(source),
                                  "-o", str(objects)],
                                 ["g++", "-shared", str(objects), "-o", str(partial)]]
                    else:
                        pch = runtime_header_pch()
                        steps = [["g++", *HOST_CXX_FLAGS, "-shared", *defines, *([f"-I{pch}"] if pch else []),
                                  *includes, str(source), "-o", str(partial)]]
                    started = time.perf_counter()
                    for step in steps:
                        build = subprocess.run(step, capture_output=True, text=True)
                        if build.returncode:
                            raise RuntimeError(f"g++ could not build {filename} for the host:\n{build.stderr}")
                    if racecheck:
                        objects.unlink()
                    partial.replace(library)  # atomic: a concurrent run never loads half a library
                    _log_build(filename, len(self.expressions), defines, source_dir == CHECKOUT_SOURCES,
                               time.perf_counter() - started)
        self._lib = ctypes.CDLL(str(library))
        variables = shared_variables(library, self._lib)
        if racecheck:
            for address, size, name in variables:
                self._lib.gradops_register_shared(ctypes.c_void_p(address), ctypes.c_size_t(size), name.encode())
        # Poisoned before each block of a launch (see the runtime header): a GPU leaves them
        # undefined.  ``poison_shared = False`` keeps them as the last block left them (only for
        # tests of the host model itself).
        self.poison_shared = True
        self._shared_regions = tuple(np.array([v[i] for v in variables] or [0], np.uint64) for i in (0, 1))
        self._shared_count = len(variables)

    def launch(self, expression: str, grid, block, pointers, scalars, order: str = "forward",
               seed: int = 0, blocks=None, allocations=None) -> None:
        """Run ``expression`` over ``grid`` x ``block`` (up to 3 entries each) with ``pointers``
        (arrays, or raw addresses as ints) and int64 ``scalars``, each in parameter order.
        ``blocks``: run only the blocks with these linear ids (x fastest), not the whole grid.
        ``allocations``: (buffer start, array start, array end, buffer end) addresses of the
        arrays between guard bytes (HostDevice's); a racecheck build fails the launch at any
        access of kernel code to a guard byte (memcheck: out of bounds)."""
        fn = getattr(self._lib, f"kernel_{self.expressions.index(expression)}")
        addresses = []
        for a in pointers:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous
                addresses.append(a.ctypes.data)
            else:
                addresses.append(int(a))
        pointer_array = (ctypes.c_void_p * max(1, len(addresses)))(*addresses)
        scalar_array = np.ascontiguousarray(np.array([int(s) for s in scalars] or [0], np.int64))
        dims = [tuple(int(v) for v in d) + (1,) * (3 - len(d)) for d in (grid, block)]
        grid_array, block_array = ((ctypes.c_uint * 3)(*d) for d in dims)
        only = np.ascontiguousarray(np.array(list(blocks) if blocks is not None else [0], np.uint64))
        only_count = len(only) if blocks is not None else 0
        if blocks is not None and only_count == 0:
            return  # no block of this launch was asked for
        error = ctypes.create_string_buffer(512)
        if self.racecheck:
            bounds = np.ascontiguousarray(np.array(allocations or [(0, 0, 0, 0)], np.uint64).reshape(-1, 4))
            self._lib.gradops_set_allocations(bounds.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)),
                                              ctypes.c_longlong(len(allocations or ())))
        at, size = self._shared_regions
        self._lib.shared_regions(at.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)),
                                 size.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)),
                                 ctypes.c_longlong(self._shared_count if self.poison_shared else 0))
        status = fn(pointer_array, scalar_array.ctypes.data_as(ctypes.POINTER(ctypes.c_longlong)),
                    grid_array, block_array, ctypes.c_int(ORDERS[order]), ctypes.c_uint(seed),
                    only.ctypes.data_as(ctypes.POINTER(ctypes.c_ulonglong)), ctypes.c_longlong(only_count),
                    error, ctypes.c_int(len(error)))
        if status:
            raise HostLaunchError(f"{expression}: {error.value.decode()}")

    def signature(self, expression: str) -> list[int]:
        """The kernel's parameters: 0 for a pointer, the byte size of an integer, minus that of a
        floating-point type (``gradops_host::kernel_signature``)."""
        fn = getattr(self._lib, f"signature_{self.expressions.index(expression)}")
        codes = (ctypes.c_int * 64)()
        count = fn(codes, 64)
        return list(codes[:count])

    #: The shared-memory primitives whose traffic the host runtime counts (``SharedKind``).
    SHARED_KINDS = ("ldmatrix", "st_shared_16", "cp_async", "ld_shared_32", "load", "store", "ld_shared_16")

    def shared_stats(self, reset: bool = True, kind: str = "ldmatrix") -> dict[str, int]:
        """Shared-memory traffic of one emulated primitive (``ldmatrix``, the 16-byte stores
        of ``st_shared_16``, the shared-memory writes of 16-byte ``cp_async``, the 4-byte
        loads of ``ld_shared_32`` or the 16-byte loads of ``ld_shared_16``), or of the plain
        ``load``s and ``store``s a kernel reports itself (``gradops_host::count_access`` with
        their width), since the last reset: ``accesses`` (warp-level instructions),
        ``wavefronts`` (bank passes they took) and ``ideal`` (the fewest passes the same bytes
        could take); wavefronts > ideal means bank conflicts.  ``reset``: start counting afresh."""
        out = (ctypes.c_longlong * 3)()
        self._lib.shared_stats(out, ctypes.c_int(self.SHARED_KINDS.index(kind)), ctypes.c_int(int(reset)))
        return dict(zip(("accesses", "wavefronts", "ideal"), (int(v) for v in out)))

    def count_global_loads(self, on: bool = True) -> None:
        """Start (or stop) counting the sectors of the kernels' global vector loads (cuda_src's
        ``load_vector``; see :meth:`global_load_stats`), from zero."""
        self.global_load_stats(reset=True)
        self._lib.count_global_loads(ctypes.c_int(int(on)))

    def global_load_stats(self, reset: bool = True) -> dict[str, int]:
        """The global vector loads counted since the last reset, per warp-level instruction (the
        lanes' n-th loads from one call site of ``load_vector``; an instruction that not all 32
        lanes of a warp make is left out): ``accesses`` (warp-level loads), ``sectors`` (the
        distinct 32-byte sectors each touches, summed) and ``ideal`` (the fewest sectors the
        distinct bytes each reads could fill); sectors > ideal means partly used sectors, what
        Nsight Compute reports as excess sectors.  Count only launches whose lanes make the same
        loads (interior tiles): a lane that skips a load before another from the same call site
        would have that one grouped with its neighbours' earlier loads."""
        out = (ctypes.c_longlong * 3)()
        self._lib.global_load_stats(out, ctypes.c_int(int(reset)))
        return dict(zip(("accesses", "sectors", "ideal"), (int(v) for v in out)))

    def race_accesses(self) -> int:
        """Accesses to ``__shared__`` memory that a racecheck build has checked so far."""
        self._lib.gradops_race_accesses.restype = ctypes.c_longlong
        return int(self._lib.gradops_race_accesses())

    def launch_bound(self, expression: str) -> int:
        """The kernel's ``__launch_bounds__`` maximum threads per block (1024 when it has none)."""
        return int(getattr(self._lib, f"launch_bound_{self.expressions.index(expression)}")())

    def run(self, expression: str, pointers: list[np.ndarray], scalars) -> None:
        """A one-thread launch: a grid-stride kernel visits every element in this one call."""
        self.launch(expression, (1,), (1,), pointers, scalars)


def grid_stride_elements(grid, block, total: int, minimum: int = 0) -> np.ndarray:
    """The elements (>= ``minimum``) that the last block of a 1-D grid-stride launch visits:
    i = (blocks - 1) * threads + t + j * threads * blocks, below ``total``."""
    threads, blocks = int(block[0]), int(grid[0])
    starts = np.arange((blocks - 1) * threads, total, threads * blocks, dtype=np.int64)
    visited = (starts[:, None] + np.arange(threads)[None, :]).reshape(-1)
    return visited[(visited < total) & (visited >= minimum)]


@contextlib.contextmanager
def capped_grids(limit: int = 1):
    """Launchers that cap their grids at ``_runtime.GRID_X_LIMIT`` / ``GRID_YZ_LIMIT`` launch at
    most ``limit`` blocks along each dimension, which then stride over every block of work the
    real grid would have had.  Only there does a barrier at the end of a block's loop body
    matter (no block reaches CUDA's limits in a test), so this is how the tests reach it."""
    import pytest

    from gradops.backends.cuda import _runtime

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(_runtime, "GRID_X_LIMIT", limit)
        monkeypatch.setattr(_runtime, "GRID_YZ_LIMIT", limit)
        yield


# --------------------------------------------------------------------------- CuPy stand-in

#: Guard bytes on each side of every array the stand-in allocates: as many as the array has
#: (up to GUARD_MAX), rounded up to a multiple of GUARD_ALIGN (the buffer starts at one too, so
#: the array is as aligned as cudaMalloc's), so an index up to twice too large still lands in a
#: guard.  0xFF bytes read as NaN in every float dtype.
GUARD_ALIGN = 256
GUARD_MAX = 16 << 20
GUARD_BYTE = 0xFF


#: The first compute capability whose half-type tiled kernels use mma.sync (GRADOPS_HAS_MMA_SM80
#: in cuda_src/tensor_core_ptx.cuh); the stand-in builds older ones as that architecture.
FIRST_MMA_SYNC_ARCH = 80

#: CUDA's launch limits: gridDim.x < 2**31, gridDim.y/z and blockDim.z bounds, threads per
#: block, and the dynamic shared memory a launch gets without an opt-in attribute.
GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024
MAX_DYNAMIC_SHARED_BYTES = 48 * 1024


#: ``template <params> __global__ void __launch_bounds__(bound) name(`` in a kernel source.
LAUNCH_BOUNDS = re.compile(r"template\s*<([^;{}]*?)>\s*__global__\s+void\s+__launch_bounds__\(([^()]*)\)\s*(\w+)\s*\(")


#: Problems the real sources were seen to get right in this process (:func:`_problem_key`), each
#: with the kernels it asked for (``HostDevice.requested``).
_REAL_SOURCE_PASSED: dict = {}

#: Values a problem's functions may capture and still name the problem by their repr.
_PLAIN = (int, float, str, bool, type(None), type, np.dtype)


def _problem_key(filename: str, run, check, seed):
    """What names a planted-bug problem: the source file, the seed, and the code of ``run`` and
    ``check`` with the values they capture; None (never cached) where a captured value is not
    plain data whose repr says what it is (an array, say)."""
    def function_key(f):
        code = getattr(f, "__code__", None)
        if code is None:
            return None
        cells = [c.cell_contents for c in (f.__closure__ or ())] + list(f.__defaults__ or ())
        plain = all(isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v))
                    for v in cells)
        return (code, repr(cells)) if plain else None

    run_key, check_key = function_key(run), function_key(check)
    if run_key is None or check_key is None:
        return None
    return filename, run_key, check_key, seed


def assert_planted_bug_caught(filename: str, edit, run, check, seed, tmp_path, monkeypatch,
                              compute_capability: int = 90):
    """``run()`` gives (launcher result, reference) that pass ``check`` from the real kernel
    sources, and that fail it (or the launch is refused) with ``edit`` (text, replacement)
    planted in a copy of ``filename``, on a HostDevice of ``compute_capability``; skips where
    the host model cannot build."""
    import pytest

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    # The real source gets this problem right (once per problem and process: a test's
    # parameters plant different bugs in one problem) ...
    key = _problem_key(filename, run, check, seed)
    key = (*key, compute_capability) if key is not None else None
    requested = _REAL_SOURCE_PASSED.get(key) if key is not None else None
    if requested is None:
        real = HostDevice(order="shuffled", seed=seed, compute_capability=compute_capability).install(monkeypatch)
        check(*run())
        requested = real.requested
        if key is not None:
            _REAL_SOURCE_PASSED[key] = requested

    # ... and the edited one does not.  The kernels the problem asked for are built from the
    # edited copy into one library a file (HostDevice's build_together), not one each.
    planted_sources(tmp_path, filename, edit)
    HostDevice(order="shuffled", seed=seed, source_dir=tmp_path, build_together=requested,
               compute_capability=compute_capability).install(monkeypatch)
    try:
        got, want = run()
    except (AssertionError, HostLaunchError):
        return  # refused: a read or write outside an array
    with pytest.raises(AssertionError):
        check(got, want)


def assert_only_racecheck_catches(filename: str, edit, run, match: str, seed, tmp_path, monkeypatch):
    """A bug (``edit``, planted in a copy of ``filename``) that leaves the results right on the
    host model: ``run()``, which checks them, passes with a plain build, and a racecheck build
    fails the launch with an error matching ``match`` (a race, a misaligned or out-of-bounds
    access); skips where the host model cannot build."""
    import pytest

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    planted_sources(tmp_path, filename, edit)
    with monkeypatch.context() as patch:
        HostDevice(order="shuffled", seed=seed, source_dir=tmp_path).install(patch)
        run()
    HostDevice(order="shuffled", seed=seed, source_dir=tmp_path, racecheck=True).install(monkeypatch)
    with pytest.raises(HostLaunchError, match=match):
        run()


def planted_host_device(tmp_path, filename: str, edit=None, **options) -> "HostDevice":
    """A HostDevice (not installed; ``options`` as its own) built from the kernel sources, or from
    a copy in ``tmp_path`` with ``edit`` (text, replacement) made in ``filename`` where given;
    skips where the host model cannot build."""
    import pytest

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    if edit is not None:
        options["source_dir"] = planted_sources(tmp_path, filename, edit)
    return HostDevice(**options)


def planted_sources(directory, filename: str, *edits: tuple[str, str]) -> Path:
    """A copy of the kernel sources in ``directory`` with each (text, replacement) of ``edits``
    made in ``filename``, for planted-bug tests (``HostDevice(source_dir=...)`` builds it).  Each
    text must occur exactly once: a planted edit that matches nothing would test nothing."""
    directory = Path(directory)
    shutil.copytree(_build.source_dir(), directory, dirs_exist_ok=True)
    path = directory / filename
    source = path.read_text()
    for text, replacement in edits:
        assert source.count(text) == 1, "the planted edit must match the source exactly once"
        source = source.replace(text, replacement)
    path.write_text(source)
    return directory


def max_threads_bound(bounds: str) -> str:
    """The first argument of ``__launch_bounds__(max_threads[, min_blocks[, max_cluster]])``:
    the text up to the first comma outside angle brackets."""
    depth = 0
    for i, ch in enumerate(bounds):
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            return bounds[:i].strip()
    return bounds.strip()


def expression_parts(expression: str) -> tuple[str, str]:
    """``"gradops::k<float, 0>"`` -> ``("k", "float, 0")``."""
    head, _, args = expression.partition("<")
    return head.rsplit("::", 1)[-1], args[:-1] if args.endswith(">") else args


def check_launch_configuration(expression: str, grid, block, shared_mem: int = 0) -> None:
    """Refuse what CuPy's ``RawKernel.__call__`` (tuples) or the driver would refuse."""
    for name, dims, limits in (("grid", grid, GRID_LIMITS), ("block", block, BLOCK_LIMITS)):
        if not isinstance(dims, tuple) or not 1 <= len(dims) <= 3:
            raise HostLaunchError(f"{expression}: {name} must be a tuple of 1 to 3 ints (CuPy refuses "
                                  f"{type(dims).__name__} {dims!r})")
        for d, limit in zip(dims, limits):
            if not isinstance(d, (int, np.integer)) or isinstance(d, (bool, np.bool_)) or not 1 <= d <= limit:
                raise HostLaunchError(f"{expression}: {name} {dims!r}: each entry must be an int in [1, {limit}]")
    if math.prod(int(d) for d in block) > MAX_THREADS_PER_BLOCK:
        raise HostLaunchError(f"{expression}: block {block!r} has more than {MAX_THREADS_PER_BLOCK} threads")
    if not 0 <= shared_mem <= MAX_DYNAMIC_SHARED_BYTES:
        raise HostLaunchError(f"{expression}: {shared_mem} bytes of dynamic shared memory (at most "
                              f"{MAX_DYNAMIC_SHARED_BYTES} without an opt-in)")


def check_arguments(expression: str, signature: list[int], args) -> None:
    """Each argument against the kernel's parameter (see :meth:`HostKernels.signature`)."""
    if len(args) != len(signature):
        raise HostLaunchError(f"{expression}: {len(args)} arguments for {len(signature)} parameters")
    for i, (code, arg) in enumerate(zip(signature, args)):
        if code == 0:
            ok = isinstance(arg, np.ndarray) or (isinstance(arg, np.generic) and arg.dtype.itemsize == 8
                                                 and arg.dtype.kind in "iu")
            want = "a device array or a 64-bit integer address"
        else:
            kind = "f" if code < 0 else "iu"
            ok = (isinstance(arg, np.generic) and not isinstance(arg, np.ndarray)
                  and arg.dtype.kind in kind and arg.dtype.itemsize == abs(code))
            want = f"a NumPy {'float' if code < 0 else 'integer'} scalar of {abs(code)} bytes"
        if not ok:
            got = str(arg.dtype) if isinstance(arg, np.generic) else type(arg).__name__
            raise HostLaunchError(f"{expression}: argument {i} is {got}; the parameter needs {want}")


class HostArray(np.ndarray):
    """A :class:`HostDevice` array: NumPy memory that gradops takes for GPU memory.

    It exposes ``__cuda_array_interface__`` and a CUDA ``__dlpack_device__`` (so gradops'
    dispatch sends it to the GPU backends) and a ``device`` like CuPy's.  Views keep their
    base's device.
    """

    _device_id = 0
    _host_device: "HostDevice | None" = None

    def __array_finalize__(self, obj):
        self._device_id = getattr(obj, "_device_id", 0)
        self._host_device = getattr(obj, "_host_device", None)

    @property
    def device(self):
        return self._host_device.Device(self._device_id)

    @property
    def __cuda_array_interface__(self):
        strides = None if self.flags.c_contiguous else self.strides
        return {"shape": self.shape, "typestr": self.dtype.str, "strides": strides,
                "data": (self.ctypes.data, False), "version": 3}

    def __dlpack_device__(self):
        return (_DLPACK_CUDA, self._device_id)

    def __dlpack__(self, **kwargs):
        return np.asarray(self).__dlpack__(**kwargs)


_DLPACK_CUDA = 2  # dlpack.h kDLCUDA


class _HostDLPackView:
    """A DLPack producer's capsule, presented to NumPy as host memory (which it is here)."""

    def __init__(self, producer):
        self._producer = producer

    def __dlpack__(self, **kwargs):
        return self._producer.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class HostDevice:
    """CuPy's role for the launchers and for gradops' public API, on the CPU (see the module
    docstring).

    ``order``/``seed`` choose the host runtime's block and thread order for every launch.
    ``block_filter(expression, grid)``, if given, returns the linear ids of the blocks to run
    in a launch (the rest of the grid is skipped): tests of huge tensors run only the blocks
    that reach their far end.  ``launches`` records (expression, grid, block) of each launch,
    for tests of the launchers' choices.

    ``compute_capability`` (e.g. 75) is what the launchers see as the device's architecture,
    so tests can run the choices an older GPU gets; below sm_80 the kernels are also built as
    that architecture (``HostKernels(arch=...)``), so its code paths run (WMMA for half types).
    ``build_as_arch``: build them as that architecture from sm_80 too (GRADOPS_ARCH: the code an
    sm_90 build alone compiles, such as its register-bounded specialisations, else the newest's).

    Each launch is checked as CuPy and the driver would check it: grid and block are tuples of
    1-3 positive ints within CUDA's limits and the kernel's ``__launch_bounds__`` (evaluated per
    instantiation by the host build), dynamic shared memory fits 48 KiB, and every
    argument matches the kernel's parameter (its C++ signature, from the host build): a device
    array or a 64-bit value for a pointer, a NumPy scalar of exactly the parameter's width and
    kind otherwise (CuPy passes each NumPy scalar at its own width).

    ``racecheck``: kernels are built with the host runtime's racecheck (``HostKernels``), so a
    launch fails at the first shared-memory hazard between threads of a block.

    ``requested`` records ``{source file: [name expressions]}`` of the kernels the launchers
    asked for.  ``build_together`` (for edited copies, ``source_dir``) names such kernels: the
    first that is asked for is built with the others of its file into one library.  g++ takes
    about a second for a library and a tenth of one for each instantiation added to it, and a
    planted-bug test's problem asks for several (:func:`assert_planted_bug_caught` passes what
    the real sources' run of the problem asked for); a kernel not named is built alone.

    ``device_count`` devices are emulated: arrays carry the id of the device that was current
    when they were allocated (``with cupy.cuda.Device(i):`` switches), and every launch checks
    that each pointer it is given lies inside an array of the current device, as a real GPU
    would need (a pointer into plain host memory or another device's array fails the test).
    """

    def __init__(self, order: str = "forward", seed: int = 0, source_dir: Path | None = None,
                 block_filter=None, device_count: int = 2, compute_capability: int = 90, racecheck: bool = False,
                 build_together: dict[str, list[str]] | None = None, build_as_arch: bool = False):
        self.compute_capability = compute_capability
        self.build_as_arch = build_as_arch
        self.racecheck = racecheck
        self.order = order
        self.seed = seed
        self.source_dir = source_dir
        self.block_filter = block_filter
        self.device_count = device_count
        self.current_device = 0
        self.launches: list[tuple[str, tuple, tuple]] = []
        self.requested: dict[str, list[str]] = {}
        self.build_together = {f: tuple(e) for f, e in (build_together or {}).items()}
        # (buffer, guard bytes, payload bytes, device id) of every allocation
        self._buffers: list[tuple[np.ndarray, int, int, int]] = []
        self._kernels: dict[tuple[str, str | tuple | None], HostKernels] = {}
        self.Device = self._device_class()

    def _device_class(self):
        # A class is cyclic garbage, which only the cycle collector frees: it holds the device
        # weakly, so that the device (and every allocation of a test, up to 16 GB for the
        # tests of more than 2**31 elements) goes when the test drops it, not at the next
        # full collection, which a test allocating few Python objects may never trigger.
        host_device = weakref.proxy(self)

        class Device:
            """``cupy.cuda.Device``: an id, and a context that makes it current."""

            def __init__(self, device=None):
                self.id = host_device.current_device if device is None else int(device)
                if not 0 <= self.id < host_device.device_count:
                    raise RuntimeError(f"invalid device ordinal {self.id}")
                self._previous: list[int] = []
                self.attributes = {"MultiProcessorCount": 2}

            def __enter__(self):
                self._previous.append(host_device.current_device)
                host_device.current_device = self.id
                return self

            def __exit__(self, *exc):
                host_device.current_device = self._previous.pop()

            def __eq__(self, other):
                return isinstance(other, Device) and other.id == self.id

            def __hash__(self):
                return self.id

        return Device

    # ---- arrays
    def empty(self, shape, dtype=np.float64):
        shape = (shape,) if np.isscalar(shape) else tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        guard = min(max(1, -(-nbytes // GUARD_ALIGN)) * GUARD_ALIGN, GUARD_MAX)
        # The buffer starts at a multiple of GUARD_ALIGN (NumPy aligns its own to 16 or 64 bytes),
        # so the array does too, as cudaMalloc's do: which 32-byte sectors a load touches
        # (HostKernels.global_load_stats) depends on it.
        raw = np.full(nbytes + 2 * guard + GUARD_ALIGN, GUARD_BYTE, np.uint8)
        shift = -raw.ctypes.data % GUARD_ALIGN
        buffer = raw[shift:shift + nbytes + 2 * guard]
        self._buffers.append((buffer, guard, nbytes, self.current_device))
        out = buffer[guard:guard + nbytes].view(dtype).reshape(shape).view(HostArray)
        out._device_id, out._host_device = self.current_device, self
        return out

    def zeros(self, shape, dtype=np.float64):
        out = self.empty(shape, dtype)
        out.view(np.uint8)[...] = 0
        return out

    def ones(self, shape, dtype=np.float64):
        out = self.empty(shape, dtype)
        out[...] = 1
        return out

    def empty_like(self, x):
        return self.empty(x.shape, x.dtype)

    def asarray(self, x, dtype=None):
        """As ``cupy.asarray``: a device array is returned as it is, a foreign GPU array (CUDA
        array interface) is viewed in place, host data is copied to the current device."""
        if isinstance(x, HostArray) and (dtype is None or np.dtype(dtype) == x.dtype):
            return x
        if not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__"):
            interface = x.__cuda_array_interface__
            return self._view(interface["data"][0], interface["shape"], np.dtype(interface["typestr"]),
                              interface.get("strides"))
        x = np.asarray(x, dtype=dtype)
        if x.flags.f_contiguous and not x.flags.c_contiguous:  # CuPy keeps a Fortran order, no other
            return self.asarray(x.T).T
        out = self.empty(x.shape, x.dtype)
        out[...] = x
        return out

    def from_dlpack(self, x):
        if isinstance(x, HostArray):
            return x
        device_type, _ = x.__dlpack_device__()
        if device_type != _DLPACK_CUDA:
            raise TypeError(f"from_dlpack: not a CUDA tensor (DLPack device type {device_type})")
        host = np.from_dlpack(_HostDLPackView(x))
        return self._view(host.ctypes.data, host.shape, host.dtype, host.strides)

    def _view(self, address: int, shape, dtype, strides):
        """A zero-copy HostArray over memory this device allocated (else an error, as a
        pointer CuPy cannot map would be)."""
        for buffer, _, _, device in self._buffers:
            start = buffer.ctypes.data
            if start <= address <= start + buffer.nbytes:
                out = np.ndarray(tuple(shape), dtype, buffer=buffer, offset=address - start,
                                 strides=tuple(strides) if strides else None).view(HostArray)
                out._device_id, out._host_device = device, self
                return out
        raise ValueError(f"address {address:#x} is not in memory this HostDevice allocated")

    def ascontiguousarray(self, x):
        if isinstance(x, HostArray) and x.flags.c_contiguous:
            return x
        out = self.empty(np.shape(x), np.asarray(x).dtype)
        out[...] = x
        return out

    @staticmethod
    def asnumpy(x):
        return np.array(x)

    def device_of(self, address: int) -> int | None:
        """The device whose allocation (guards included: NumPy may point an empty array at the
        front guard) holds ``address``, or None."""
        for buffer, _, _, device in self._buffers:
            if buffer.ctypes.data <= address <= buffer.ctypes.data + buffer.nbytes:
                return device
        return None

    def allocation_bounds(self) -> list[tuple[int, int, int, int]]:
        """(buffer start, array start, array end, buffer end) of every allocation: its guards
        are [buffer start, array start) and [array end, buffer end)."""
        out = []
        for buffer, guard, nbytes, _ in self._buffers:
            start = buffer.ctypes.data
            out.append((start, start + guard, start + guard + nbytes, start + buffer.nbytes))
        return out

    def check_guards(self) -> None:
        for buffer, guard, nbytes, _ in self._buffers:
            before, after = buffer[:guard], buffer[guard + nbytes:]
            if np.any(before != GUARD_BYTE) or np.any(after != GUARD_BYTE):
                raise AssertionError(f"a kernel wrote outside an array of {nbytes} bytes")

    # ---- kernels
    def host_kernels(self, filename: str, expression: str) -> HostKernels:
        """The host build that runs ``expression`` (built on first use): every instantiation
        of ``filename`` in one library for the real sources as the newest GPU (cached on disk,
        shared by all tests); for edited copies (``source_dir``, a planted bug per test)
        ``expression`` with the others of its file in ``build_together``, else alone; for the
        real sources posing as an older GPU (or ``build_as_arch``) ``expression`` alone too, as
        that pose's tests run a few of a file's hundreds of kernels (a whole depthwise source
        took 16-30 s of g++ a pose, cold, 2026-12-07)."""
        if expression not in _instantiations(self.compute_capability).get(filename, ()):
            raise HostLaunchError(f"{expression} is not among the instantiations of {filename} for "
                                  f"sm_{self.compute_capability}: on that GPU it would not be compiled")
        asked = self.requested.setdefault(filename, [])
        if expression not in asked:
            asked.append(expression)
        # Before sm_80 the kernels take other code paths (WMMA for half types, where the
        # newest GPUs run ldmatrix + mma.sync): build what that GPU would compile, as it.
        older = self.compute_capability < FIRST_MMA_SYNC_ARCH or self.build_as_arch
        together = self.build_together.get(filename, ())
        if self.source_dir is None:
            key = (filename, expression if older and POSED_BUILDS_ALONE else None)
        else:
            key = (filename, together if expression in together else expression)
        if key not in self._kernels:
            if key[1] is None:
                expressions = list(_instantiations(self.compute_capability if older else None)[filename])
            else:
                expressions = list(key[1]) if isinstance(key[1], tuple) else [expression]
            self._kernels[key] = HostKernels(filename, expressions, self.source_dir,
                                             arch=self.compute_capability if older else None,
                                             racecheck=self.racecheck)
        return self._kernels[key]

    def kernel(self, filename: str, expression: str):
        kernels = self.host_kernels(filename, expression)

        def launch(grid, block, args, shared_mem=0):
            check_launch_configuration(expression, grid, block, shared_mem)
            bound = kernels.launch_bound(expression)
            if math.prod(int(d) for d in block) > bound:
                raise HostLaunchError(f"{expression}: block {block!r} exceeds the kernel's __launch_bounds__ ({bound} "
                                      "threads): the driver refuses the launch")
            check_arguments(expression, kernels.signature(expression), args)
            pointers = [a for a in args if isinstance(a, (np.ndarray, np.uint64))]
            scalars = [a for a in args if not isinstance(a, (np.ndarray, np.uint64))]
            for p in pointers:
                address = p.ctypes.data if isinstance(p, np.ndarray) else int(p)
                if address == 0:
                    continue  # a null pointer, which a kernel may take (and must not dereference)
                owner = self.device_of(address)
                assert owner is not None, f"{expression}: a pointer argument is not in device memory"
                assert owner == self.current_device, (
                    f"{expression}: launched on device {self.current_device} with an array of device {owner}")
            self.launches.append((expression, tuple(grid), tuple(block)))
            blocks = self.block_filter(expression, tuple(grid)) if self.block_filter else None
            kernels.launch(expression, grid, block, pointers, scalars, self.order, self.seed, blocks,
                           allocations=self.allocation_bounds())
            self.check_guards()

        return launch

    def install(self, monkeypatch) -> "HostDevice":
        """Make ``import cupy`` and the CUDA launchers' runtime use this device for the test."""
        from gradops.backends.cuda import _runtime

        runtime = types.SimpleNamespace(
            getDeviceCount=lambda: self.device_count,
            # the "device" memory is the host's, as a test may have set it (_arrays.host_memory_bytes
            # looked up at each call, so a test's monkeypatch of it holds for the device too)
            memGetInfo=lambda: (_arrays.host_memory_bytes(),) * 2,
            runtimeGetVersion=lambda: 13000,
        )
        module = types.ModuleType("cupy")
        for name in ("empty", "zeros", "ones", "empty_like", "asarray", "ascontiguousarray", "asnumpy",
                     "from_dlpack"):
            setattr(module, name, getattr(self, name))
        for name in ("float16", "float32", "float64", "int32", "int64"):
            setattr(module, name, getattr(np, name))
        module.ndarray = HostArray
        module.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)
        module.cuda = types.SimpleNamespace(Device=self.Device, runtime=runtime)
        monkeypatch.setitem(sys.modules, "cupy", module)
        # On a machine with a GPU and cuDNN, default dispatch must not hand these arrays (host
        # memory) to the real cuDNN, nor cache a probe of it made through the stand-in.
        monkeypatch.setattr(_cudnn_loader, "load", lambda: (None, "cuDNN cannot run on the HostDevice stand-in"))
        monkeypatch.setattr(_runtime, "kernel", self.kernel)
        monkeypatch.setattr(_runtime, "sm_count", lambda: 2)
        monkeypatch.setattr(_runtime, "compute_capability", lambda: self.compute_capability)
        monkeypatch.setattr(_runtime, "pointer",
                            lambda x, offset=0: np.uint64(x.ctypes.data + offset * x.itemsize))
        return self
