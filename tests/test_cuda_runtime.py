"""The runtime's compile step (gradops/backends/cuda/_runtime.py) without a GPU: what it asks
CuPy for, what it compiles, caches and logs.

CuPy is not installed on CPU CI, so these tests give ``_runtime`` a recording stand-in for the
few CuPy calls it makes (``compile_using_nvrtc``, ``assemble_cupy_compiler_options``,
``cupy.cuda.Module().load(bytes)`` and ``get_function``, ``CUDADriverError``, the current
device), with CuPy 14's argument types (cupy/cuda/function.pyx: ``load`` takes ``bytes`` only).  The real CuPy compile step runs in the install
check (``python -m gradops install-check``, scripts/check-gpu-install.sh) and on a GPU."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from gradops.backends.cuda import _build, _runtime

SOURCE = "fractional_avg_pool_grad.cu"


class FakeCupy:
    """Records compiles and loads; ``device`` is the current device id."""

    def __init__(self, compute_capability: int = 86):
        self.compiles: list[tuple[str, tuple, list]] = []
        self.loads: list[bytes] = []
        self.device = 0
        self.compute_capability = compute_capability
        self.log = ""
        fake = self

        class Device:
            def __init__(self, device=None):
                self.id = fake.device if device is None else device
                self.compute_capability = str(fake.compute_capability)

        class CUDADriverError(RuntimeError):
            def __init__(self, status, message):  # CuPy's carries the CUresult as .status
                super().__init__(message)
                self.status = status

        class Module:
            """cuModuleLoadData as CuPy wraps it: a binary the driver cannot read raises."""

            def load(self, cubin):
                if not isinstance(cubin, bytes):  # Cython's ``bytes cubin``
                    raise TypeError(f"Argument 'cubin' has incorrect type (expected bytes, got {type(cubin).__name__})")
                if not (cubin.startswith(b"binary of") or _runtime.elf_size(cubin) is not None):
                    raise CUDADriverError(200, "CUDA_ERROR_INVALID_IMAGE: device kernel image is invalid")
                fake.loads.append(cubin)
                self.binary = cubin

            def get_function(self, name):
                return ("kernel", name, self.binary)

        # CuPy 14's signature (cupy/cuda/compiler.py); a log stream receives NVRTC's program log.
        def compile_using_nvrtc(source, options=(), arch=None, filename="kern.cu", name_expressions=None,
                                log_stream=None, cache_in_memory=False, jitify=None, method=None):
            fake.compiles.append((filename, tuple(options), list(name_expressions)))
            if not cache_in_memory:  # CuPy 14 names the program after a source file it writes first
                import os
                import tempfile

                with tempfile.TemporaryDirectory() as root:
                    with open(os.path.join(root, filename), "w") as f:
                        f.write(source)
            if log_stream is not None:
                log_stream.write(fake.log)
            return f"binary of {name_expressions}".encode(), {e: f"_mangled_{i}" for i, e in enumerate(name_expressions)}

        self.module = types.ModuleType("cupy")
        self.module.__version__ = "14.2.0"
        self.module.cuda = types.SimpleNamespace(
            Device=Device,
            Module=Module,
            driver=types.SimpleNamespace(CUDADriverError=CUDADriverError),
            runtime=types.SimpleNamespace(runtimeGetVersion=lambda: 13000),
            compiler=types.SimpleNamespace(compile_using_nvrtc=compile_using_nvrtc),
            nvrtc=types.SimpleNamespace(getVersion=lambda: (13, 0)))
        core = types.ModuleType("cupy._core.core")
        # CuPy's own additions, as CuPy 14 makes them: its include folders and --std.
        core.assemble_cupy_compiler_options = lambda options: ("-I/cupy/include", *options, "--std=c++17")
        self.core = core

    def install(self, monkeypatch, tmp_path):
        monkeypatch.setitem(sys.modules, "cupy", self.module)
        monkeypatch.setitem(sys.modules, "cupy.cuda", self.module.cuda)
        monkeypatch.setitem(sys.modules, "cupy._core", types.SimpleNamespace(core=self.core))
        monkeypatch.setitem(sys.modules, "cupy._core.core", self.core)
        monkeypatch.setenv("GRADOPS_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
        monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
        monkeypatch.setattr(_runtime, "_kernels", {})
        monkeypatch.setattr(_runtime, "_capabilities", {})
        return self


@pytest.fixture
def fake_cupy(monkeypatch, tmp_path):
    return FakeCupy().install(monkeypatch, tmp_path)


def expressions():
    return _build.all_instantiations()[SOURCE]


def test_a_call_compiles_only_the_kernel_it_needs_once_per_device(fake_cupy):
    first, second = expressions()[:2]
    k = _runtime.kernel(SOURCE, first)
    assert [c[2] for c in fake_cupy.compiles] == [[first]]  # one instantiation, not the file
    assert _runtime.kernel(SOURCE, first) is k               # the loaded kernel is kept
    _runtime.kernel(SOURCE, second)
    fake_cupy.device = 1
    k1 = _runtime.kernel(SOURCE, first)
    assert k1 is not k                                       # loaded again on the other device
    assert [c[2] for c in fake_cupy.compiles] == [[first], [second]]  # ...from the disk cache
    assert len(fake_cupy.loads) == 3


def test_the_disk_cache_survives_the_process_and_keys_on_arch(fake_cupy, monkeypatch):
    first = expressions()[0]
    _runtime.kernel(SOURCE, first)
    monkeypatch.setattr(_runtime, "_kernels", {})  # a new process: only the disk cache is left
    _runtime.kernel(SOURCE, first)
    assert len(fake_cupy.compiles) == 1
    monkeypatch.setattr(_runtime, "_kernels", {})
    monkeypatch.setattr(_runtime, "_capabilities", {})
    fake_cupy.compute_capability = 90  # another GPU: another binary
    _runtime.kernel(SOURCE, first)
    assert len(fake_cupy.compiles) == 2


def test_compile_options_keep_subnormals_and_name_the_headers(fake_cupy):
    _runtime.kernel(SOURCE, expressions()[0])
    (_, options, _), = fake_cupy.compiles
    assert options[0] == "-I/cupy/include" and options[-1] == "--std=c++17"  # CuPy's, around ours
    assert f"-I{_build.source_dir()}" in options
    ftz = [o for o in options if o.startswith("-ftz")]
    assert ftz == ["-ftz=false"], "float32 subnormals must be kept (no -ftz=true)"


def test_compiling_is_logged_at_info(fake_cupy, caplog):
    with caplog.at_level(logging.INFO, logger="gradops"):
        _runtime.kernel(SOURCE, expressions()[0])
        _runtime.kernel(SOURCE, expressions()[0])
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len([m for m in messages if "compiling" in m]) == 1, messages
    assert any("sm_86" in m and "cached in" in m for m in messages)


def test_an_unwritable_cache_still_gives_a_kernel(fake_cupy, monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GRADOPS_KERNEL_CACHE_DIR", str(blocker / "cache"))  # under a file: not creatable
    kind, name, binary = _runtime.kernel(SOURCE, expressions()[0])
    assert name == "_mangled_0" and binary.startswith(b"binary of")


def test_no_home_folder_compiles_without_a_cache(fake_cupy, monkeypatch, caplog):
    """No cache folder named and no home (``docker run --user N`` with no passwd entry and no
    HOME: Path.home() raises RuntimeError): the kernel is compiled in the process and not
    cached; the first call used to fail with "Could not determine home directory"."""
    import logging
    from pathlib import Path

    monkeypatch.delenv("GRADOPS_KERNEL_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert _runtime.cache_dir() is None
    with caplog.at_level(logging.INFO, logger="gradops"):
        kind, name, binary = _runtime.kernel(SOURCE, expressions()[0])
    assert name == "_mangled_0" and binary.startswith(b"binary of")
    assert any("not cached: no home folder" in r.getMessage() for r in caplog.records)


def _cache_files(tmp_path):
    folder = tmp_path / "cache"
    return sorted(f.name for f in folder.iterdir()) if folder.exists() else []


@pytest.mark.parametrize("value, in_memory", [("1", True), ("0", False), ("", False), ("yes", False), ("2", False)])
def test_cupy_cache_in_memory_is_read_as_cupy_reads_it(monkeypatch, value, in_memory):
    """CuPy's _get_bool_env_variable: only an integer equal to 1 is true."""
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", value)
    assert _runtime.cache_in_memory() is in_memory


def test_cupy_cache_in_memory_writes_nothing(fake_cupy, monkeypatch, tmp_path, caplog):
    """With CUPY_CACHE_IN_MEMORY=1 (CuPy's switch for a read-only filesystem) gradops writes no
    cache either: each process compiles its kernels once, and loads them from memory."""
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    monkeypatch.delenv("GRADOPS_KERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = expressions()[0]
    with caplog.at_level(logging.INFO, logger="gradops"):
        kind, name, binary = _runtime.kernel(SOURCE, first)
    assert name == "_mangled_0" and binary.startswith(b"binary of")
    assert list(tmp_path.iterdir()) == []
    assert any("CUPY_CACHE_IN_MEMORY" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(_runtime, "_kernels", {})  # a new process compiles again
    _runtime.kernel(SOURCE, first)
    assert len(fake_cupy.compiles) == 2 and list(tmp_path.iterdir()) == []


def test_gradops_own_cache_folder_wins_over_cupy_cache_in_memory(fake_cupy, monkeypatch, tmp_path):
    """GRADOPS_KERNEL_CACHE_DIR (set by the fixture) names gradops' folder: CuPy's switch for
    its own cache does not override it (scripts/warm_kernel_cache.py fills that folder)."""
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    _runtime.kernel(SOURCE, expressions()[0])
    assert len(_cache_files(tmp_path)) == 2  # the binary and its name


def test_a_read_only_filesystem_still_gives_a_kernel(fake_cupy, monkeypatch, tmp_path):
    """No writable cache folder and no usable temporary folder (a container with a read-only
    root): the kernel is loaded from memory.  The loader used to fall back to a temporary file,
    and failed here with "No usable temporary directory found"."""
    import tempfile

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("GRADOPS_KERNEL_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    with pytest.raises(OSError):
        tempfile.TemporaryDirectory()  # the premise: no temporary folder
    kind, name, binary = _runtime.kernel(SOURCE, expressions()[0])
    assert name == "_mangled_0" and binary.startswith(b"binary of")


@pytest.mark.parametrize("damage, words", [
    (b"\x7fELF damaged", "is damaged (12 bytes, not a whole cubin)"),  # never reaches the driver
    (b"not a module", "could not be loaded"),                             # the driver refuses it
])
def test_a_damaged_cached_binary_is_compiled_again(fake_cupy, monkeypatch, tmp_path, caplog, damage, words):
    """A cache file that is truncated (by hand, a disk error) or that the driver refuses is
    replaced, with a warning; it must not make every later process fail.  A cubin shorter than
    its ELF header says is never handed to the driver: cuModuleLoadData takes no length."""
    first = expressions()[0]
    _runtime.kernel(SOURCE, first)
    (binary_file,) = [f for f in (tmp_path / "cache").iterdir() if f.suffix == ".bin"]
    binary_file.write_bytes(damage)
    monkeypatch.setattr(_runtime, "_kernels", {})
    loads = len(fake_cupy.loads)
    with caplog.at_level(logging.INFO, logger="gradops"):
        kind, name, binary = _runtime.kernel(SOURCE, first)
    assert binary.startswith(b"binary of") and len(fake_cupy.compiles) == 2
    assert fake_cupy.loads[loads:] == [binary]  # only the new binary reached the loader
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and words in warnings[0] and "compiling it again" in warnings[0]
    assert binary_file.read_bytes().startswith(b"binary of")  # the cache holds a good binary again
    monkeypatch.setattr(_runtime, "_kernels", {})
    _runtime.kernel(SOURCE, first)
    assert len(fake_cupy.compiles) == 2  # ...which the next process reads


@pytest.mark.skipif(not (sys.platform == "linux" and sys.version_info >= (3, 11)),
                    reason="the NVRTC wheels of the test extra exist for Linux x86_64, Python >= 3.11")
def test_only_a_whole_cubin_is_intact():
    whole = _real_cubin()
    assert _runtime.intact(whole) and _runtime.intact(b"//\n.version 9.0\n")
    for cut in (1, 8, len(whole) // 2, len(whole) - 60):
        assert not _runtime.intact(whole[:len(whole) - cut])
    assert not _runtime.intact(b"")


def test_a_driver_error_that_does_not_blame_the_file_is_raised(fake_cupy, monkeypatch):
    """Out of memory (CUDA_ERROR_OUT_OF_MEMORY, 2) while loading a cached kernel is the
    device's problem: raised as it is, not taken for a damaged file and recompiled."""
    first = expressions()[0]
    _runtime.kernel(SOURCE, first)
    monkeypatch.setattr(_runtime, "_kernels", {})
    error = fake_cupy.module.cuda.driver.CUDADriverError

    def out_of_memory(self, cubin):
        raise error(2, "CUDA_ERROR_OUT_OF_MEMORY: out of memory")

    monkeypatch.setattr(fake_cupy.module.cuda.Module, "load", out_of_memory)
    with pytest.raises(error, match="OUT_OF_MEMORY"):
        _runtime.kernel(SOURCE, first)
    assert len(fake_cupy.compiles) == 1


def test_a_failed_cache_write_leaves_no_partial_file(fake_cupy, monkeypatch, tmp_path):
    """A full disk (here: the rename fails) leaves no ``*.tmp`` behind and still gives a kernel."""
    import os

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    kind, name, binary = _runtime.kernel(SOURCE, expressions()[0])
    assert binary.startswith(b"binary of")
    assert _cache_files(tmp_path) == []


def test_the_stand_in_has_the_cupy_surface_the_runtime_uses(fake_cupy):
    """The same check the install check runs against each GPU extra's real CuPy (CI, no GPU),
    for the compile and load steps: the stand-in these tests use offers what real CuPy offers
    the runtime."""
    assert _runtime.cupy_api_problems(_runtime.LOADER_CUPY_NAMES) == []
    assert "cupy.empty is missing" in _runtime.cupy_api_problems()  # the rest is not its to offer


def _cupy_names_in_sources() -> set[str]:
    """Every dotted CuPy name gradops' sources use: attribute chains on a name bound to CuPy or
    one of its modules (``import cupy``, ``import cupy as xp``, ``from cupy.cuda import
    compiler``; the cuDNN path's ``xp``, which is its runtime's CuPy module) and
    ``getattr(<such a chain>, "name", ...)``."""
    import ast
    from pathlib import Path

    import gradops

    def chain(node, aliases):
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in aliases:
            return ".".join([aliases[node.id], *reversed(parts)])
        return None

    found = set()
    for path in Path(gradops.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        aliases = {"xp": "cupy"} if "cudnn" in path.parts else {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases.update({a.asname or "cupy": a.name for a in node.names if a.name.split(".")[0] == "cupy"})
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cupy":
                aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        for node in ast.walk(tree):
            name = chain(node, aliases) if isinstance(node, ast.Attribute) else None
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                base = chain(node.args[0], aliases)
                name = f"{base}.{node.args[1].value}" if base else None
            if name:
                found.add(name)
    return {n for n in found if not any(other.startswith(n + ".") for other in found)}


def test_the_listed_cupy_names_are_exactly_those_the_sources_use():
    """A new CuPy call in gradops must be listed in CUPY_NAMES, so that the install check looks
    it up in the real CuPy of both GPU extras (CI); a name no longer used must go."""
    used = _cupy_names_in_sources()
    assert "cupy.cuda.runtime.getDeviceCount" in used and "cupy.cuda.compiler.compile_using_nvrtc" in used
    assert set(_runtime.CUPY_NAMES) == used, (sorted(used - set(_runtime.CUPY_NAMES)),
                                               sorted(set(_runtime.CUPY_NAMES) - used))


def test_the_cupy_surface_check_catches_what_the_loader_would_trip_on(fake_cupy, monkeypatch):
    cuda = fake_cupy.module.cuda
    real_compile, real_module = cuda.compiler.compile_using_nvrtc, cuda.Module

    def old_compile(source, options=(), arch=None, filename="kern.cu", name_expressions=None):
        return real_compile(source, options, arch, filename, name_expressions)

    monkeypatch.setattr(cuda.compiler, "compile_using_nvrtc", old_compile)
    loader = _runtime.LOADER_CUPY_NAMES
    assert _runtime.cupy_api_problems(loader) == [
        "cupy.cuda.compiler.compile_using_nvrtc takes no log_stream, cache_in_memory"]
    monkeypatch.setattr(cuda.compiler, "compile_using_nvrtc", real_compile)

    class NoLoader(real_module):
        load = None

    monkeypatch.setattr(cuda, "Module", NoLoader)
    assert _runtime.cupy_api_problems(loader) == ["cupy.cuda.Module has no load()"]
    monkeypatch.delattr(cuda, "Module")
    monkeypatch.delattr(cuda, "driver")
    assert _runtime.cupy_api_problems(loader) == ["cupy.cuda.Module is missing",
                                                  "cupy.cuda.driver.CUDADriverError is missing"]


def test_the_real_cupy_has_the_surface_the_runtime_uses():
    """Where CuPy is installed (a GPU machine, a GPU extra's environment): no GPU needed."""
    pytest.importorskip("cupy")
    assert _runtime.cupy_api_problems() == []


def test_cuda12_options_add_the_nvcc_wheels_crt_headers(monkeypatch, tmp_path):
    """CUDA 12 keeps crt/mma.h (which mma.h includes) in the nvcc wheel, a folder CuPy does not
    add: the runtime adds it.  CUDA 13's crt wheel shares the runtime's folder."""
    site = tmp_path / "site"
    for sub in ("nvidia/cuda_runtime/include", "nvidia/cuda_nvcc/include/crt", "nvidia/cu13/include/crt"):
        (site / sub).mkdir(parents=True)
    monkeypatch.setattr(sys, "path", [str(site)])
    assert f"-I{site}/nvidia/cuda_nvcc/include" in _runtime.gradops_options(12)
    assert f"-I{site}/nvidia/cu13/include" not in _runtime.gradops_options(12)
    assert f"-I{site}/nvidia/cu13/include" in _runtime.gradops_options(13)
    assert not any("cuda_nvcc" in o for o in _runtime.gradops_options(13))


def test_header_lookup_ignores_an_unnamed_system_toolkit(monkeypatch, tmp_path):
    """Only the header wheels and a toolkit named by CUDA_PATH / CUDA_HOME: /usr/local/cuda
    must not hide a header the environment lacks."""
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    assert _build.cuda_include_dirs() == []
    toolkit = tmp_path / "toolkit"
    (toolkit / "include").mkdir(parents=True)
    monkeypatch.setenv("CUDA_PATH", str(toolkit))
    assert _build.cuda_include_dirs() == [str(toolkit / "include")]


def test_install_check_flags_headers_from_outside_the_environment(monkeypatch, tmp_path):
    from gradops.backends.cuda import _install_check

    inside = f"{sys.prefix}/lib/site-packages/nvidia/cu13/include"
    options = (f"-I{inside}", f"-I{_build.source_dir()}", "-I/usr/local/cuda/include", "--std=c++17")
    assert _install_check.foreign_include_dirs(options) == ["/usr/local/cuda/include"]
    (tmp_path / "crt").mkdir()
    for header in ("cuda_fp16.h", "cuda_bf16.h", "mma.h"):
        (tmp_path / header).write_text("")
    assert _build.missing_headers([tmp_path]) == ["crt/mma.h"]
    (tmp_path / "crt" / "mma.h").write_text("")
    assert _build.missing_headers([tmp_path]) == []


def test_compile_kernels_passes_the_log_stream_and_ptxas_verbose(fake_cupy):
    import io

    fake_cupy.log = "ptxas info    : Used 8 registers"
    log = io.StringIO()
    _runtime.compile_kernels(SOURCE, expressions()[:1], "90", log=log, ptxas_verbose=True)
    _runtime.compile_kernels(SOURCE, expressions()[:1], "90")
    (_, verbose, _), (_, plain, _) = fake_cupy.compiles
    assert verbose == plain + (_runtime.PTXAS_VERBOSE,)  # the only difference from the runtime's options
    assert log.getvalue() == fake_cupy.log


def _real_cubin(source: str = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }") -> bytes:
    """A whole cubin from NVRTC (cuda.core, the test extra), as ``nvrtcGetCUBIN`` returns it."""
    pytest.importorskip("cuda.core")
    from cuda.core import Program, ProgramOptions

    program = Program(source, "c++", ProgramOptions(arch="sm_90"))
    try:
        return bytes(program.compile("cubin").code)
    finally:
        program.close()


@pytest.mark.skipif(not (sys.platform == "linux" and sys.version_info >= (3, 11)),
                    reason="the NVRTC wheels of the test extra exist for Linux x86_64, Python >= 3.11")
def test_whole_cubin_puts_back_the_byte_cupy_drops_and_nothing_else():
    """CuPy 14's ``nvrtc.getCUBIN`` returns ``cubin[:size - 1]`` (it strips a "trailing NULL"
    as for PTX): the runtime restores that byte, which is zero, and leaves whole cubins, PTX
    and anything shorter alone."""
    whole = _real_cubin()
    assert _runtime.elf_size(whole) == len(whole) and whole[-1] == 0
    assert _runtime.whole_cubin(whole[:-1]) == whole
    assert _runtime.whole_cubin(whole) == whole
    assert _runtime.whole_cubin(whole[:-2]) == whole[:-2]  # not CuPy's cut: not guessed at
    ptx = b".version 8.8\n.target sm_90\n"
    assert _runtime.elf_size(ptx) is None and _runtime.whole_cubin(ptx) == ptx


def test_whole_cubin_pads_a_one_byte_cut_whatever_ends_the_file():
    """A file whose last bytes are a section's, not a header table's, is padded too: the zero
    is what the driver reads from memory after the bytes (as in CuPy's own in-memory loads), so
    the cached file is what was loaded, and not one that fails intact() in every process.  A
    longer cut is not guessed at."""
    import struct

    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    # One section at 64 with 16 bytes of data ending the file, its header table before it.
    struct.pack_into("<QQ", header, 0x20, 0, 80)           # e_phoff (no program headers), e_shoff
    struct.pack_into("<HHHH", header, 0x36, 56, 0, 64, 1)  # phentsize, phnum, shentsize, shnum
    section = bytearray(64)
    struct.pack_into("<I", section, 4, 1)                  # SHT_PROGBITS
    struct.pack_into("<QQ", section, 0x18, 144, 16)        # its bytes: 144..160
    elf = bytes(header) + bytes(16) + bytes(section) + b"x" * 16
    assert _runtime.elf_size(elf) == len(elf) == 160
    assert _runtime.whole_cubin(elf[:-1]) == elf[:-1] + b"\0"
    assert _runtime.whole_cubin(elf[:-2]) == elf[:-2] and not _runtime.intact(elf[:-2])


def test_the_cached_binary_is_the_whole_cubin(fake_cupy, tmp_path):
    """With CuPy 14's short cubin, what the runtime caches and loads is the whole file."""
    whole = _real_cubin() if sys.platform == "linux" and sys.version_info >= (3, 11) else None
    if whole is None:
        pytest.skip("the NVRTC wheels of the test extra exist for Linux x86_64, Python >= 3.11")
    compile_using_nvrtc = fake_cupy.module.cuda.compiler.compile_using_nvrtc

    def getcubin_like(*args, **kwargs):
        _, names = compile_using_nvrtc(*args, **kwargs)
        return whole[:len(whole) - 1], names  # cupy_backends/cuda/libs/nvrtc.pyx: getCUBIN

    fake_cupy.module.cuda.compiler.compile_using_nvrtc = getcubin_like
    kernel = _runtime.kernel(SOURCE, expressions()[0])
    assert kernel[2] == whole
    (cached,) = (tmp_path / "cache").glob("*.bin")
    assert cached.read_bytes() == whole


SPILLING_KERNEL = r'''
extern "C" __global__ void spills(float* out, int i) {
    float scratch[64];  // written and read at run-time indices: a stack frame, not registers
    for (int k = 0; k < 64; ++k) scratch[(k * i) & 63] = out[k];
    out[0] = scratch[i & 63];
}
extern "C" __global__ void fits(float* out) { out[threadIdx.x] += 1.0f; }
'''


@pytest.mark.skipif(not (sys.platform == "linux" and sys.version_info >= (3, 11)),
                    reason="the NVRTC wheels of the test extra exist for Linux x86_64, Python >= 3.11")
def test_install_check_reads_ptxas_report_and_refuses_a_stack_frame():
    """The install check's verdict on NVRTC's real ptxas log (the log CuPy's ``log_stream``
    receives): a kernel with a stack frame fails the check, a kernel in registers passes, and a
    kernel ptxas did not report on is not taken as passing."""
    import io

    pytest.importorskip("cuda.core")
    from cuda.core import Program, ProgramOptions

    from gradops.backends.cuda import _install_check

    options = ProgramOptions(arch="sm_90", ptxas_options=["-v"])
    log = io.StringIO()
    program = Program(SPILLING_KERNEL, "c++", options)
    try:
        program.compile("cubin", logs=log)
    finally:
        program.close()
    text = log.getvalue().replace("\0", "")
    bad = _install_check.resource_verdict({"spills": "spills"}, text)
    assert bad["status"] == "spills" and "spills: 0 B spill stores, 0 B spill loads, 256 B stack" in bad["detail"]
    good = _install_check.resource_verdict({"fits": "fits"}, text)
    assert good == {"status": "ok", "registers": good["registers"], "detail": "", "known_spills": []}
    assert 0 < good["registers"] < 32
    accepted = _install_check.resource_verdict({"spills": "spills"}, text, {"spills": (0, 0, 256)})
    assert accepted["status"] == "ok" and accepted["known_spills"] == [bad["detail"]]
    grown = _install_check.resource_verdict({"spills": "spills"}, text, {"spills": (0, 0, 128)})
    assert grown["status"] == "spills" and grown["known_spills"] == []
    missing = _install_check.resource_verdict({"fits": "fits", "other": "_Z5other"}, text)
    assert missing["status"] == "spills" and missing["detail"] == "other: no ptxas report"


def test_arch_classes_follow_the_arch_tests_of_sources_and_headers(monkeypatch, tmp_path):
    """Archs share a class where every arch test of the sources and the headers they include
    answers alike; nv/target's own definitions (one per arch) are not tests, its uses are."""
    from gradops.backends.cuda import _install_check

    sources, headers = tmp_path / "src", tmp_path / "include"
    (headers / "nv").mkdir(parents=True)
    sources.mkdir()
    (sources / "k.cu").write_text('#include "local.cuh"\n#include <half.h>\n')
    (sources / "local.cuh").write_text("#define HAS_MMA (GRADOPS_ARCH >= 800)\n")
    (headers / "half.h").write_text("#include <nv/target>\nNV_IF_TARGET(NV_PROVIDES_SM_90, (fast();), (slow();))\n"
                                    "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 750\nold();\n#endif\n")
    (headers / "nv" / "target").write_text("#define NV_PROVIDES_SM_86 \\\n  __NV_PROVIDES_SM_86\n"
                                           "#define NV_IS_EXACTLY_SM_89 __NV_IS_EXACTLY_SM_89\n")
    monkeypatch.setattr(_build, "source_dir", lambda: sources)
    tests = _install_check.arch_tests([headers])
    assert tests == {(">=", 800), (">=", 900), ("<", 750)}
    assert _install_check.arch_classes(_install_check.ARCHS, tests) == [
        [50, 52, 60, 61, 70], [75], [80, 86, 87, 89], [90, 100, 101, 103, 110, 120, 121]]
    assert _install_check.arch_classes((75, 80), {(">=", 750)}) == [[75, 80]]


def test_compile_plan_compiles_the_named_archs_and_covers_the_rest_of_their_classes():
    from gradops.backends.cuda import _install_check

    classes = [[50, 52], [60, 61], [70], [80, 86, 87, 89], [90, 100, 103, 120, 121]]
    every = {a: a for group in classes for a in group}
    assert _install_check.compile_plan(classes) == every                       # a full run
    assert _install_check.compile_plan(classes, each=(80,)) == every          # each only with classes
    oldest = _install_check.compile_plan(classes, one_per_class=True)
    assert oldest == {50: 50, 52: 50, 60: 60, 61: 60, 70: 70, 80: 80, 86: 80, 87: 80, 89: 80,
                      90: 90, 100: 90, 103: 90, 120: 90, 121: 90}
    ci = _install_check.compile_plan(classes, one_per_class=True, each=(70, 80, 86, 89, 90, 100, 120))
    assert ci == {50: 50, 52: 50, 60: 60, 61: 60, 70: 70, 80: 80, 86: 86, 87: 80, 89: 89,
                  90: 90, 100: 100, 103: 90, 120: 120, 121: 90}


def _real_arch_classes(sources=None):
    """The arch tests of gradops' sources (``sources``: these files only) and the test extra's
    CUDA headers, and the classes of _install_check.ARCHS they make (skips without those
    headers)."""
    from gradops.backends.cuda import _install_check

    dirs = _build.cuda_include_dirs(13)
    if not dirs:
        pytest.skip("no CUDA headers (the test extra's wheels)")
    tests = _install_check.arch_tests(dirs, sources)
    return tests, _install_check.arch_classes(_install_check.ARCHS, tests)


def test_arch_classes_of_the_real_sources_keep_the_tensor_core_split():
    """With the test extra's CUDA headers: every arch in one class, and sm_75 apart from sm_80
    (gradops' own GRADOPS_ARCH >= 800 and the headers' sm_80 paths)."""
    from gradops.backends.cuda import _install_check

    tests, classes = _real_arch_classes()
    assert (">=", 800) in tests
    assert sorted(a for group in classes for a in group) == sorted(_install_check.ARCHS)
    assert not any(75 in group and 80 in group for group in classes)


def test_archs_that_take_a_siblings_spills_preprocess_as_it_does():
    """An arch of SPILLS_AS accepts its sibling's known spills because ptxas allocated alike on
    both, which presumes the same source: in each source file that holds a kernel of the
    sibling's known spills, each must be in its sibling's class (with the test extra's CUDA
    headers), as CI's check, which compiles the sibling for it, presumes too.  (Other files may
    split them: fractional_avg_pool_grad.cu tells sm_100's fast FP64 from sm_101/sm_103's.)"""
    from gradops.backends.cuda import _install_check

    source_of = {e: source for source, expressions in _build.all_instantiations().items() for e in expressions}
    checked = 0
    for arch, sibling in _install_check.SPILLS_AS.items():
        sources = {source_of[e] for (_, a, e) in _install_check.KNOWN_SPILLS if a == sibling}
        assert sources, (arch, sibling)  # a sibling without known spills needs no entry
        for source in sorted(sources):
            _, classes = _real_arch_classes([source])
            class_of = {a: tuple(group) for group in classes for a in group}
            assert class_of[_build.arch_number(arch)] == class_of[_build.arch_number(sibling)], (arch, sibling, source)
            checked += 1
    assert checked >= len(_install_check.SPILLS_AS)


def test_arch_classes_are_per_source_file():
    """An arch test in one source splits the archs of that file only: kFastFp64 in the
    fractional pooling gradient parts sm_100 from sm_103 there, and nowhere else."""
    def together(source, a, b):
        _, classes = _real_arch_classes([source])
        return any(a in group and b in group for group in classes)

    assert not together("fractional_avg_pool_grad.cu", 100, 103)
    assert not together("fractional_avg_pool_grad.cu", 80, 86)
    assert together("conv2d_backprop_filter.cu", 100, 103)
    assert together("conv2d_backprop_filter.cu", 80, 86)
    everything, _ = _real_arch_classes()
    assert everything == set().union(*(_real_arch_classes([s])[0] for s in _build.all_instantiations()))


def test_known_spills_name_kernels_that_exist():
    """Every accepted spill names an instantiation compiled for its arch (a misspelt entry would
    accept nothing and hide that the list is stale)."""
    from gradops.backends.cuda import _install_check

    for major, arch, expression in _install_check.KNOWN_SPILLS:
        assert major in (12, 13)
        listed = {e for names in _build.all_instantiations(_build.arch_number(arch)).values() for e in names}
        assert expression in listed, (arch, expression)


# --------------------------------------------------------------------------- the loader on a real GPU


def _real_gpu_kernel(monkeypatch, tmp_path):
    """One small instantiation through the real loader, with a fresh cache folder and nothing
    kept from earlier calls; returns the kernel and the cache folder's files."""
    monkeypatch.setenv("GRADOPS_KERNEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_runtime, "_kernels", {})
    return _runtime.kernel(SOURCE, expressions()[0]), sorted((tmp_path / "cache").glob("*"))


@pytest.mark.gpu
def test_real_loader_caches_loads_from_memory_and_survives_a_damaged_file(monkeypatch, tmp_path, caplog):
    """Under real CuPy and the driver: a kernel is compiled, cached and loaded from memory
    (a cupy.cuda.Function, launchable as RawKernel is); a truncated cache file (caught by its
    ELF size before the driver sees it) and one the driver refuses (CUDA_ERROR_INVALID_IMAGE)
    are compiled again with a warning; CUPY_CACHE_IN_MEMORY=1 writes nothing."""
    import cupy

    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    fn, files = _real_gpu_kernel(monkeypatch, tmp_path)
    assert isinstance(fn, cupy.cuda.Function) and callable(fn)
    (binary,) = [f for f in files if f.suffix == ".bin"]
    good = binary.read_bytes()
    binary.write_bytes(good[: len(good) // 2])  # a truncated cubin
    with caplog.at_level(logging.INFO, logger="gradops"):
        fn, _ = _real_gpu_kernel(monkeypatch, tmp_path)
    assert isinstance(fn, cupy.cuda.Function)
    assert any(r.levelno == logging.WARNING and "compiling it again" in r.getMessage() for r in caplog.records)
    rewritten = binary.read_bytes()
    assert rewritten != good[: len(good) // 2] and _runtime.elf_size(rewritten) == len(rewritten)  # whole again
    binary.write_bytes(b"//\n.version 1.0\n.target sm_10\nnot a module\n")  # PTX no driver accepts
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gradops"):
        fn, _ = _real_gpu_kernel(monkeypatch, tmp_path)
    assert any(r.levelno == logging.WARNING and "could not be loaded" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("CUPY_CACHE_IN_MEMORY", "1")
    monkeypatch.delenv("GRADOPS_KERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "in-memory"))
    monkeypatch.setattr(_runtime, "_kernels", {})
    assert isinstance(_runtime.kernel(SOURCE, expressions()[0]), cupy.cuda.Function)
    assert not (tmp_path / "in-memory").exists()
