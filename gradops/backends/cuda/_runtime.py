"""CuPy side of the kernel framework: compile what a call needs, once per device, and launch it.

Each kernel is one template instantiation (a name expression an op's launcher lists) of
``cuda_src/<op>.cu``, compiled on first use for the device's architecture by CuPy's NVRTC
entry point (``cupy.cuda.compiler.compile_using_nvrtc``) with CuPy's own include folders and C++
standard (``assemble_cupy_compiler_options``, what ``RawModule`` uses), and loaded from memory
with ``cupy.cuda.Module`` (``RawModule``'s loader, without its need for a file).  A first call
therefore compiles one kernel, not every instantiation of a file.  Three deliberate differences
from ``RawModule(code=...)``:

* no ``-ftz=true``: float32 subnormals are kept, as in TF's CPU kernels, NumPy and the host
  execution model the tests run the same sources on (CuPy's cached compile appends the flag
  after the caller's options, and NVRTC takes the last one);
* the compiled binary is cached on disk by gradops (``GRADOPS_KERNEL_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/gradops/kernels`` or ``~/.cache/gradops/kernels``), keyed by the source (with
  its headers' digest), the instantiation, the options, the NVRTC version and the target arch;
  with CuPy's ``CUPY_CACHE_IN_MEMORY=1`` (unless ``GRADOPS_KERNEL_CACHE_DIR`` names a folder),
  or where no folder can be named or written, kernels are compiled once per process and
  nothing is written: compiling (in memory, not through a temporary source file) and loading
  need no writable folder;
* a damaged cached binary (shorter than its ELF header says, or one the driver refuses) is
  compiled again, not an error, and never reaches the driver truncated.

Compiling is logged at INFO level on the ``gradops`` logger.  Launches never synchronise the host.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np

from . import _build

log = logging.getLogger("gradops")

#: Threads per block for the 1-D grid-stride kernels: a multiple of the 32-thread warp that
#: keeps several blocks resident per SM on every architecture since sm_60.
BLOCK_1D = 256
#: Grid-stride kernels get at most this many blocks per SM; more only adds scheduling cost.
BLOCKS_PER_SM = 32
#: CUDA's limits on gridDim.x and on gridDim.y / gridDim.z.
GRID_X_LIMIT = 2**31 - 1
GRID_YZ_LIMIT = 65535
#: Bytes per global load of the kernels' vector paths (a ``uint4``).
VECTOR_BYTES = 16

_lock = threading.Lock()
_kernels: dict[tuple[str, str, int], object] = {}
_sm_counts: dict[int, int] = {}
_capabilities: dict[int, int] = {}


def _cuda_major() -> int:
    import cupy

    return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000


def gradops_options(cuda_major: int) -> tuple[str, ...]:
    """gradops' own NVRTC options: cuda_src/, the header wheels' folders (CUDA 12 keeps the
    ``crt/`` headers that mma.h includes in the nvcc wheel, a folder CuPy does not add), then a
    toolkit named by ``CUDA_PATH`` / ``CUDA_HOME`` (the same lookup as the install check), and
    float32 subnormals kept."""
    options = [f"-I{_build.source_dir()}"]
    options += [f"-I{d}" for d in _build.cuda_include_dirs(cuda_major)]
    options.append("-ftz=false")
    return tuple(options)


def nvrtc_options(cuda_major: int | None = None) -> tuple[str, ...]:
    """Every NVRTC option but the arch: CuPy's (its include folders, the CUDA headers it found,
    ``--std``) around gradops' own."""
    from cupy._core import core

    if cuda_major is None:
        cuda_major = _cuda_major()
    return tuple(core.assemble_cupy_compiler_options(gradops_options(cuda_major)))  # CuPy >= 14 (the extras)


def cache_dir() -> Path | None:
    """Where compiled kernels are kept between processes; None, so that kernels are compiled
    in each process and nothing is written, where gradops' folder is not named and CuPy is told
    to cache in memory (:func:`cache_in_memory`), or there is no home folder (a container's user
    without a passwd entry or HOME; a shared folder such as /tmp could hold another user's
    binaries)."""
    explicit = os.environ.get("GRADOPS_KERNEL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    if cache_in_memory():
        return None
    base = os.environ.get("XDG_CACHE_HOME")
    if not base:
        try:
            base = Path.home() / ".cache"
        except (RuntimeError, KeyError):  # Path.home(): "Could not determine home directory."
            return None
    return Path(base) / "gradops" / "kernels"


#: NVRTC's option that has ptxas report each kernel's registers, spills and stack (informational:
#: the code is the same with or without it).
PTXAS_VERBOSE = "--ptxas-options=-v"


def compile_kernels(filename: str, expressions, arch: str | None = None, log=None,
                    ptxas_verbose: bool = False) -> tuple[bytes, dict[str, str]]:
    """Compile instantiations of ``cuda_src/<filename>`` into one binary with CuPy's NVRTC entry
    point: ``(cubin or PTX, {expression: mangled name})``.  ``arch`` (e.g. ``"90"``): the target;
    None: the current device's, as CuPy picks it.  ``log``: a text stream that receives NVRTC's
    log; ``ptxas_verbose`` adds :data:`PTXAS_VERBOSE` to the options, so that a cubin's log
    holds ptxas' resource report.  The runtime compiles one expression at a time; the install
    check (``python -m gradops install-check``) a file's worth per arch."""
    from cupy.cuda import compiler

    options = nvrtc_options() + ((PTXAS_VERBOSE,) if ptxas_verbose else ())
    # cache_in_memory=True: without it CuPy writes the source into a temporary folder first
    # (only to name the program), which a read-only filesystem does not have.
    binary, mapping = compiler.compile_using_nvrtc(
        _build.source_code(filename), options, arch, filename=filename, name_expressions=list(expressions),
        log_stream=log, cache_in_memory=True)
    names = {e: (m.decode() if isinstance(m, bytes) else m) for e, m in mapping.items()}
    return whole_cubin(binary.encode() if isinstance(binary, str) else bytes(binary)), names


_ELF64_LSB = b"\x7fELF\x02\x01"


def _header_tables(binary: bytes) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """A 64-bit ELF header's program and section header tables, each (offset, entry size,
    entries)."""
    phoff, shoff = struct.unpack_from("<QQ", binary, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", binary, 0x36)
    return (phoff, phentsize, phnum), (shoff, shentsize, shnum)


def _header_table_ends(binary: bytes) -> tuple[int, ...]:
    """Where a 64-bit ELF header says its program and section header tables end."""
    return tuple(offset + size * count for offset, size, count in _header_tables(binary))


def elf_size(binary: bytes) -> int | None:
    """Where a 64-bit little-endian ELF file (a cubin) ends by its own header: the end of its
    program header table, its section header table or its last section's bytes, whichever is
    furthest; None for anything else (PTX) or a header too short to read."""
    if not binary.startswith(_ELF64_LSB) or len(binary) < 64:
        return None
    end = max(_header_table_ends(binary))
    _, (shoff, shentsize, shnum) = _header_tables(binary)
    for i in range(shnum):
        at = shoff + i * shentsize
        if at + 64 > len(binary):
            break
        kind, = struct.unpack_from("<I", binary, at + 4)
        offset, size = struct.unpack_from("<QQ", binary, at + 0x18)
        if kind != 8:  # SHT_NOBITS (.bss, .nv.shared) occupies no bytes of the file
            end = max(end, offset + size)
    return end


def whole_cubin(binary: bytes) -> bytes:
    """``binary`` with the byte CuPy 14's ``nvrtc.getCUBIN`` drops put back.  getCUBIN strips
    a "trailing NULL" from the cubin as from PTX, but a cubin is not a string: its last byte
    goes.  NVRTC (12.9 and 13.x) writes a header table last, so that byte is the top byte of the
    last entry's last field (a 64-bit alignment or entry size), zero.  A cubin exactly one byte
    short of its ELF header's size is padded with a zero, whatever ends it: that is also what
    the driver reads from memory (Python keeps a zero after every bytes object), as in CuPy's
    own in-memory loads, and the file gradops caches is then what was loaded (NVIDIA's nvdisasm
    and cuobjdump refuse a short file).  Anything else (PTX, a whole cubin, a longer cut) is
    returned as it is."""
    if elf_size(binary) == len(binary) + 1:
        return binary + b"\0"
    return binary


def _cache_key(filename: str, expression: str, arch: str) -> str:
    import cupy
    from cupy.cuda import nvrtc

    parts = (_build.source_code(filename), expression, nvrtc_options(), arch, nvrtc.getVersion(),
             cupy.__version__, os.environ.get("CUPY_COMPILE_WITH_PTX", ""))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def cache_in_memory() -> bool:
    """CuPy's ``CUPY_CACHE_IN_MEMORY`` as CuPy reads it (``1``: true; unset, empty or anything
    else: false): where CuPy is told to keep its kernel cache off the disk (a read-only
    filesystem, a container without a writable home), gradops does not write its own either,
    unless ``GRADOPS_KERNEL_CACHE_DIR`` names a folder for it."""
    value = os.environ.get("CUPY_CACHE_IN_MEMORY")
    if not value:
        return False
    try:
        return int(value) == 1
    except ValueError:
        return False


def _module_function(binary: bytes, mangled: str):
    """One kernel of a cubin (or PTX) held in memory: ``cuModuleLoadData`` through CuPy's
    ``cupy.cuda.Module`` (the loader ``RawModule`` uses), so that loading never needs a file.
    The returned ``cupy.cuda.Function`` keeps its module loaded and launches as ``RawKernel``
    does: ``fn(grid, block, args, shared_mem=...)`` on the current stream."""
    import cupy

    module = cupy.cuda.Module()
    module.load(bytes(binary))
    return module.get_function(mangled)


#: Driver errors (cuda.h's CUresult) that blame the module image or its kernel name, so that a
#: cached binary which raises one is compiled again: INVALID_IMAGE, NO_BINARY_FOR_GPU,
#: INVALID_PTX, UNSUPPORTED_PTX_VERSION, INVALID_SOURCE, NOT_FOUND (a mangled name the module
#: lacks).  Any other error (out of memory, a lost context) is raised as it is.
IMAGE_ERRORS = frozenset({200, 209, 218, 222, 300, 500})


def intact(binary: bytes) -> bool:
    """Whether a binary can be handed to the driver: a cubin exactly as long as its own ELF
    header says (``cuModuleLoadData`` takes no length, so a truncated cubin would have the
    driver read past the buffer), or non-empty PTX (text: Python's bytes end in a NUL)."""
    if binary.startswith(_ELF64_LSB[:4]):
        return elf_size(binary) == len(binary)
    return len(binary) > 0


def _read_cache(binary_path: Path, meta_path: Path) -> tuple[bytes, str] | None:
    """A cached binary and its mangled name, or None where there is none or it cannot be read
    (a damaged binary is logged)."""
    try:
        if not binary_path.is_file():
            return None
        binary, mangled = binary_path.read_bytes(), json.loads(meta_path.read_text())["mangled"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not intact(binary):
        log.warning("gradops: cached kernel %s is damaged (%d bytes, not a whole cubin); compiling it again",
                    binary_path, len(binary))
        return None
    return binary, mangled


def _load(filename: str, expression: str, device: int):
    """The kernel of one instantiation on ``device`` (current): read from the disk cache, else
    compiled (and written to the cache where it can be), and loaded from memory either way."""
    import cupy

    arch = compute_capability()
    key = _cache_key(filename, expression, str(arch))
    directory = cache_dir()
    if directory is not None:
        binary_path, meta_path = directory / f"{key}.bin", directory / f"{key}.json"
        cached = _read_cache(binary_path, meta_path)
        if cached is not None:
            try:
                return _module_function(*cached)
            except cupy.cuda.driver.CUDADriverError as exc:
                if getattr(exc, "status", None) not in IMAGE_ERRORS:
                    raise  # the device's or context's problem, not the file's: compiling would not help
                log.warning("gradops: cached kernel %s could not be loaded (%s); compiling it again",
                            binary_path, exc)
    where = (f"cached in {directory}" if directory is not None else
             "not cached: CUPY_CACHE_IN_MEMORY=1" if cache_in_memory() else
             "not cached: no home folder, and neither GRADOPS_KERNEL_CACHE_DIR nor XDG_CACHE_HOME set")
    log.info("gradops: compiling %s from %s for sm_%s (first use; %s)", expression, filename, arch, where)
    start = time.perf_counter()
    binary, names = compile_kernels(filename, [expression])
    mangled = names[expression]
    log.info("gradops: compiled %s in %.1f s", expression, time.perf_counter() - start)
    if directory is not None:
        try:
            _build.write_atomic(binary_path, binary)
            _build.write_atomic(meta_path, json.dumps({"mangled": mangled, "expression": expression}).encode())
        except OSError as exc:  # a read-only home: the kernel is still loaded, from memory
            log.info("gradops: kernel cache %s is not writable (%s); not caching", directory, exc)
    return _module_function(binary, mangled)


#: The parameters of ``compile_using_nvrtc`` that :func:`compile_kernels` passes.
_NVRTC_PARAMETERS = ("source", "options", "arch", "filename", "name_expressions", "log_stream", "cache_in_memory")

#: The CuPy names this module's compile and load steps use.
LOADER_CUPY_NAMES = (
    "cupy.__version__",
    "cupy._core.core.assemble_cupy_compiler_options",
    "cupy.cuda.Device",
    "cupy.cuda.Module",
    "cupy.cuda.compiler.compile_using_nvrtc",
    "cupy.cuda.driver.CUDADriverError",
    "cupy.cuda.nvrtc.getVersion",
    "cupy.cuda.runtime.runtimeGetVersion",
)
#: Every CuPy name gradops' sources use (tests/test_cuda_runtime.py reads them off the sources
#: and requires this list to be exactly that), which the install check looks up in the real
#: CuPy of each GPU extra: a CuPy release that renames or drops one fails CI, not a user's GPU.
CUPY_NAMES = tuple(sorted(set(LOADER_CUPY_NAMES) | {
    "cupy.arange", "cupy.asarray", "cupy.ascontiguousarray", "cupy.asnumpy", "cupy.empty",
    "cupy.from_dlpack", "cupy.get_default_memory_pool", "cupy.ndarray", "cupy.ones", "cupy.uint8",
    "cupy.zeros",
    "cupy.cuda.Stream", "cupy.cuda.get_current_stream",
    # CuPy internals the install check uses to target an arch without a device:
    "cupy.cuda.compiler._get_arch_for_options_for_nvrtc", "cupy.cuda.compiler._get_max_compute_capability",
    "cupy.cuda.compiler._use_ptx",
    "cupy.cuda.nvrtc.getSupportedArchs",
    "cupy.cuda.runtime.driverGetVersion", "cupy.cuda.runtime.getDeviceCount",
    "cupy.cuda.runtime.getDeviceProperties", "cupy.cuda.runtime.memGetInfo",
}))


def resolve_cupy_name(name: str):
    """The object a dotted CuPy name (``cupy.cuda.runtime.getDeviceCount``) names, importing
    submodules CuPy does not import itself; raises AttributeError or ImportError."""
    import importlib

    parts = name.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


def cupy_api_problems(names=CUPY_NAMES) -> list[str]:
    """What the installed CuPy lacks of ``names`` (default: every name gradops uses) and of the
    loader's expectations of them (empty: all there).  The install check runs it against the
    real CuPy of each GPU extra without a GPU, and the tests' CuPy stand-in must pass it for
    :data:`LOADER_CUPY_NAMES`, so that a CuPy release that moves one of these fails CI instead
    of a user's first GPU call."""
    import inspect

    problems, found = [], {}
    for name in names:
        try:
            found[name] = resolve_cupy_name(name)
        except (AttributeError, ImportError):
            problems.append(f"{name} is missing")
    compile_fn = found.get("cupy.cuda.compiler.compile_using_nvrtc")
    if compile_fn is not None:
        try:
            parameters = set(inspect.signature(compile_fn).parameters)
        except (TypeError, ValueError):
            parameters = set(_NVRTC_PARAMETERS)  # a compiled function without a signature: cannot tell
        absent = [n for n in _NVRTC_PARAMETERS if n not in parameters]
        if absent:
            problems.append(f"cupy.cuda.compiler.compile_using_nvrtc takes no {', '.join(absent)}")
    module = found.get("cupy.cuda.Module")
    if module is not None:
        problems += [f"cupy.cuda.Module has no {m}()" for m in ("load", "get_function")
                     if not callable(getattr(module, m, None))]
    error = found.get("cupy.cuda.driver.CUDADriverError")
    if error is not None and not (isinstance(error, type) and issubclass(error, Exception)):
        problems.append("cupy.cuda.driver.CUDADriverError is not an exception class")
    return problems


def kernel(filename: str, expression: str):
    """One instantiation (a name expression listed by the op's ``instantiations()``) as a
    launchable kernel (``cupy.cuda.Function``: ``fn(grid, block, args, shared_mem=...)``) of the
    current device, compiled on its first use and kept per device."""
    import cupy

    device = cupy.cuda.Device().id
    key = (filename, expression, device)
    fn = _kernels.get(key)
    if fn is None:
        with _lock:
            fn = _kernels.get(key)
            if fn is None:
                fn = _kernels[key] = _load(filename, expression, device)
    return fn


def compute_capability() -> int:
    """The current device's compute capability as a number (75 for a T4, 90 for an H100)."""
    import cupy

    device = cupy.cuda.Device().id
    if device not in _capabilities:
        _capabilities[device] = int(cupy.cuda.Device(device).compute_capability)
    return _capabilities[device]


def sm_count() -> int:
    import cupy

    device = cupy.cuda.Device().id
    if device not in _sm_counts:
        _sm_counts[device] = int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
    return _sm_counts[device]


def launch_1d(fn, total: int, args: tuple, block: int = BLOCK_1D, shared_mem: int = 0) -> None:
    """Launch a grid-stride kernel over ``total`` items on the current stream (no-op when empty)."""
    if total <= 0:
        return
    blocks = min(-(-total // block), sm_count() * BLOCKS_PER_SM)
    fn((blocks,), (block,), args, shared_mem=shared_mem)


def contiguous(x):
    """``x`` as a C-contiguous CuPy array (a copy only when the input is a strided view).

    The copy moves raw bits (viewed as unsigned ints of the same width), so it needs no
    arithmetic support for the element type (CuPy's bfloat16 support is recent and partial).
    """
    import cupy

    if x.flags.c_contiguous:
        return x
    return cupy.ascontiguousarray(x.view(f"u{x.dtype.itemsize}")).view(x.dtype)


def pointer(x, offset: int = 0) -> np.uint64:
    """A device-pointer kernel argument ``offset`` elements into ``x``: the raw address, so any
    element type CuPy can hold (bfloat16 included) reaches the kernel unchanged."""
    return np.uint64(x.data.ptr + offset * x.itemsize)


def vector_width(dtype) -> int:
    """Elements of ``dtype`` in one :data:`VECTOR_BYTES` load."""
    return VECTOR_BYTES // np.dtype(dtype).itemsize


def vector_aligned(*arrays, alignment: int = VECTOR_BYTES) -> bool:
    """Whether every array starts on an ``alignment``-byte boundary (a vector load's size)."""
    return all(int(pointer(a)) % alignment == 0 for a in arrays)


def i64(value: int) -> np.int64:
    """A kernel scalar argument of C++ type ``long long``."""
    return np.int64(value)


def i32(value: int) -> np.int32:
    """A kernel scalar argument of C++ type ``int`` (only for values that are provably small)."""
    return np.int32(value)


# --------------------------------------------------------------------------- launch tables

#: Device copies of launch tables kept (per device, stream and everything a table depends on).
TABLE_CACHE_SIZE = 16
#: ... and their bytes in all: typical tables are kilobytes, but fractional pooling's grow with
#: how much its cells overlap (up to gigabytes); an upload larger than this is used once and
#: dropped, so that a few such geometries cannot hold the GPU's memory between calls.
TABLE_CACHE_BYTES = 64 * 2**20


def division_magic(divisor: int) -> tuple[np.uint32, np.int32]:
    """(m, s) with n // divisor == (n * m) >> s for every 0 <= n < 2**31 (m < 2**32): the
    constants of ``FastDiv`` (cuda_src/igemm_tiles.cuh) and of the fractional pooling kernels'
    index splits, computed once on the host instead of in every thread."""
    shift = 31 + (int(divisor) - 1).bit_length()
    magic = -(-(1 << shift) // int(divisor))
    assert magic < 2**32
    return np.uint32(magic), i32(shift)


_table_cache: OrderedDict = OrderedDict()
_table_lock = threading.Lock()


def _current_stream(cupy):
    """CuPy's current stream; None for a CuPy-like module without streams (the CPU stand-in of
    the tests, on which every launch completes at once)."""
    get = getattr(cupy.cuda, "get_current_stream", None)
    return get() if get is not None else None


def _stream_key(cupy, stream) -> tuple:
    """What a per-stream device cache is keyed by: the CuPy module, the current device, the stream."""
    return id(cupy), cupy.cuda.Device().id, None if stream is None else int(stream.ptr)


def cached_tables(key: tuple, build):
    """(device array, element offset of each table in it) of the host tables ``build()``
    returns, packed into one upload on the current device and stream, cached under ``key``
    (which must name everything the tables depend on) in a small LRU shared by the launchers
    that pass tables (fractional pooling's cells, the input gradient's phase plans;
    :data:`TABLE_CACHE_SIZE` entries and :data:`TABLE_CACHE_BYTES` bytes at most, least recently
    used first out; an upload larger than the byte budget is returned without being kept).

    The full key adds the CuPy module (the tests' CPU stand-in is a new one per emulated GPU),
    the device and the stream.  Per stream, because the upload is queued on the current stream:
    a kernel on another stream could read the tables before they arrive, and the memory of an
    evicted copy returns to the pool of the stream that allocated it.  The entry keeps the stream
    object and the module, so that neither its handle nor the module's id is reused while the
    entry lives (a stand-in's id taken by the next one handed it the first's dead tables).
    """
    import cupy

    stream = _current_stream(cupy)
    key = (*_stream_key(cupy, stream), *key)
    with _table_lock:
        entry = _table_cache.get(key)
        if entry is not None:
            _table_cache.move_to_end(key)
            return entry[0], entry[1]
    tables = build()
    offsets = tuple(int(v) for v in np.cumsum([0] + [len(t) for t in tables[:-1]]))
    # One upload: CuPy stages host data through pinned memory and copies on the current stream.
    packed = cupy.asarray(np.concatenate(tables))
    if packed.nbytes > TABLE_CACHE_BYTES:
        return packed, offsets
    with _table_lock:
        _table_cache[key] = (packed, offsets, stream, cupy)
        _table_cache.move_to_end(key)
        while len(_table_cache) > TABLE_CACHE_SIZE or _cached_table_bytes() > TABLE_CACHE_BYTES:
            _table_cache.popitem(last=False)
    return packed, offsets


#: Ticket counter arrays kept (one per CuPy module, device and stream): :func:`ticket_counters`.
TICKET_CACHE_SIZE = 16
_ticket_cache: OrderedDict = OrderedDict()


def ticket_counters(count: int):
    """A zeroed uint32 device array of at least ``count`` counters on the current device, for the
    launches on the current stream of kernels that find the last of their CTAs by an integer
    ticket (the depthwise filter gradient's one launch for a few slices): each such launch takes
    ``count`` counters from 0 and its last CTAs set them back to 0 before it ends, so the next
    launch on the stream (which starts after it) finds them zeroed.  Per stream, because two
    launches on different streams may run at once; the entry keeps the stream and the module
    alive, as :func:`cached_tables`' do.  A larger request replaces the array (zeroed on the
    current stream; the old one's memory returns to the pool of that stream, after the launches
    queued there).  Not for launches that could overlap on one stream: a CUDA graph replayed on
    two streams at once would share its counters."""
    import cupy

    stream = _current_stream(cupy)
    key = _stream_key(cupy, stream)
    with _table_lock:
        entry = _ticket_cache.get(key)
        if entry is not None and entry[0].size >= count:
            _ticket_cache.move_to_end(key)
            return entry[0]
        counters = cupy.zeros(max(256, 1 << (int(count) - 1).bit_length()), np.uint32)
        _ticket_cache[key] = (counters, stream, cupy)
        _ticket_cache.move_to_end(key)
        while len(_ticket_cache) > TICKET_CACHE_SIZE:
            _ticket_cache.popitem(last=False)
        return counters


def _cached_table_bytes() -> int:
    return sum(entry[0].nbytes for entry in _table_cache.values())


def clear_table_cache() -> None:
    """Drop every cached device copy of the launch tables, and the ticket counters."""
    with _table_lock:
        _table_cache.clear()
        _ticket_cache.clear()
