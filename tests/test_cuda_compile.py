"""Every CUDA kernel instantiation compiles with NVRTC for sm_75, sm_80 and sm_90, with no GPU.

sm_80 and sm_90 also get ptxas' resource check; sm_75 (Turing: float16 tensor cores only) is
where the per-arch instantiation lists differ.  Outside ``slow`` runs only the sources that
compile in seconds are compiled here: the whole matrix (sm_70 to sm_120, through CuPy's own
compile step, in a fresh environment per GPU extra, with the same resource check) is
scripts/check-gpu-install.sh, which CI runs.

Uses cuda.core's Program (NVRTC from the nvidia-cuda-nvrtc wheel, CUDA headers from
nvidia-cuda-runtime): the ``test`` extra installs them on Linux x86_64 with Python >= 3.11,
where this check must run rather than skip.
"""

from __future__ import annotations

import platform
import re
import sys

import pytest

from gradops.backends.cuda import _build

SUPPORTED_PLATFORM = (sys.platform == "linux" and platform.machine() == "x86_64"
                      and sys.version_info >= (3, 11))

if not SUPPORTED_PLATFORM:
    pytest.skip("the NVRTC wheels of the test extra exist for Linux x86_64, Python >= 3.11",
                allow_module_level=True)

ARCHS = ("sm_80", "sm_90")
SOURCES = sorted(_build.all_instantiations())

#: Sources that compile for both arches in well under a minute on CI's two cores.  The others
#: (one to five minutes an arch each) are ``slow`` here: CI's install check compiles every source
#: for every arch, with each GPU extra's NVRTC through CuPy, and fails on the same spills
#: (scripts/check-gpu-install.sh, gradops/backends/cuda/_install_check.py).
QUICK_SOURCES = {"conv2d.cu", "fractional_avg_pool_grad.cu", "fractional_max_pool_grad.cu"}


def _quick_or_slow(source, quick: bool):
    return source if quick else pytest.param(source, marks=pytest.mark.slow)


def test_sources_are_found_and_listed():
    directory = _build.source_dir()
    on_disk = sorted(p.name for p in directory.glob("*.cu"))
    assert on_disk == SOURCES, "every cuda_src/*.cu has instantiations and vice versa"
    assert QUICK_SOURCES < set(SOURCES)


def test_header_edits_change_the_cache_key(tmp_path, monkeypatch):
    for name in ("gradops_common.cuh", "k.cu"):
        (tmp_path / name).write_text("// v1\n")
    monkeypatch.setattr(_build, "source_dir", lambda: tmp_path)
    _build.source_code.cache_clear()
    try:
        before = _build.source_code("k.cu")
        (tmp_path / "gradops_common.cuh").write_text("// v2\n")
        _build.source_code.cache_clear()
        assert _build.source_code("k.cu") != before
    finally:
        _build.source_code.cache_clear()


def test_compile_cache_answers_only_the_same_compile(tmp_path, monkeypatch):
    """_build._compiled keeps each compile in GRADOPS_SASS_CACHE_DIR: the same compile again is
    read back (NVRTC not called: the same cubin, names and log), while another text, arch or
    option compiles afresh, and cache=False always compiles (the reproducibility tests)."""
    import cuda.core

    monkeypatch.setenv("GRADOPS_SASS_CACHE_DIR", str(tmp_path / "cache"))
    programs = []

    class CountedProgram(cuda.core.Program):
        def __init__(self, *args, **kwargs):
            programs.append(args[0])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(cuda.core, "Program", CountedProgram)
    source = "fractional_pool.cu"
    only = _build.all_instantiations(90)[source][:1]

    def compile_once(arch="sm_90", **kwargs):
        (row,) = _build._compiled((arch,), [source], True, only=only, **kwargs)
        return row[3].code, row[3].symbol_mapping, row[4]

    first = compile_once()
    assert len(programs) == 1 and b"ELF" in first[0][:4] and "Used" in first[2]
    assert compile_once() == first and len(programs) == 1
    assert compile_once(cache=False)[0] == first[0] and len(programs) == 2
    compile_once("sm_80")
    compile_once(options={"fma": False})
    compile_once(texts={source: _build.source_code(source) + "\n// edited\n"})
    assert len(programs) == 5
    assert compile_once(options={"fma": False}) and len(programs) == 5


@pytest.mark.parametrize("source", [_quick_or_slow(s, s in QUICK_SOURCES) for s in SOURCES])
def test_every_instantiation_compiles_without_spilling(source):
    """Every instantiation compiles for each arch without a warning, and ptxas keeps every
    kernel in registers (no spill stores or loads, no stack frame): a static check of what would
    otherwise only show up as lost speed on a GPU.  No warning: #20054 (a ``__shared__``
    variable with a constructor, which the device never runs and the CPU model runs once, by
    whichever thread comes first) made the model differ from the GPU and its racecheck report a
    write-after-write that the GPU does not have."""
    rows = _build.kernel_resources(ARCHS, sources=[source])
    expressions = _build.all_instantiations()[source]
    assert [(r["arch"], r["kernel"]) for r in rows] == [(a, e) for a in ARCHS for e in expressions]
    assert all(0 < r["registers"] <= 255 for r in rows)
    assert not {(r["arch"], w) for r in rows for w in r["warnings"]}
    spilling = [(r["arch"], r["kernel"], r["spill_stores"], r["stack_bytes"]) for r in rows
                if r["spill_stores"] or r["spill_loads"] or r["stack_bytes"]]
    assert not spilling


#: Sources whose sm_75 list is sm_80's are ``slow`` here too (nothing Turing-specific is
#: instantiated), as are those outside QUICK_SOURCES; CI compiles all of them for sm_75 anyway.
TURING_SOURCES = [_quick_or_slow(source, source in QUICK_SOURCES and
                                 _build.all_instantiations(75)[source] != _build.all_instantiations(80)[source])
                  for source in SOURCES]


@pytest.mark.parametrize("source", TURING_SOURCES)
def test_every_instantiation_compiles_for_turing(source):
    """sm_75 compiles what it can run: no bfloat16 or TF32 tensor-core kernels (mma.h declares
    none there), the SIMT kernels for those types instead."""
    rows = _build.compile_check(("sm_75",), sources=[source])
    assert rows == [(source, "sm_75", len(_build.all_instantiations(75)[source]))]


def _nvrtc(source: str, arch: int, expressions=(), extra_options=()) -> tuple[bool, str, str]:
    """Compile ``source`` to PTX for ``compute_<arch>`` with NVRTC (cuda.bindings: cuda.core's
    Program asks the driver before it returns PTX), ``expressions`` as name expressions, with the
    project's C++ standard, cuda_src/ and CUDA 13's headers, then ``extra_options``:
    (succeeded, NVRTC's log, the PTX, empty where it failed)."""
    from cuda.bindings import nvrtc

    options = [f"--gpu-architecture=compute_{arch}".encode(), f"--std={_build.CXX_STD}".encode()] + [
        b"-I" + folder.encode() for folder in [str(_build.source_dir())] + _build.cuda_include_dirs(13)
    ] + [o.encode() for o in extra_options]
    _, program = nvrtc.nvrtcCreateProgram(_build.source_code(source).encode(), source.encode(), 0, [], [])
    try:
        for expression in expressions:
            assert nvrtc.nvrtcAddNameExpression(program, expression.encode())[0] == nvrtc.nvrtcResult.NVRTC_SUCCESS
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        ok = result == nvrtc.nvrtcResult.NVRTC_SUCCESS
        _, size = nvrtc.nvrtcGetProgramLogSize(program)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(program, log)
        ptx = b""
        if ok:
            _, size = nvrtc.nvrtcGetPTXSize(program)
            ptx = b" " * size
            nvrtc.nvrtcGetPTX(program, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return ok, log.decode(errors="replace").replace("\0", ""), ptx.decode()


def _nvrtc_archs() -> list[int]:
    from cuda.bindings import nvrtc

    return list(nvrtc.nvrtcGetSupportedArchs()[1])


@pytest.mark.parametrize("source", SOURCES)
def test_every_source_parses_for_every_arch(source):
    """Each source, with no kernel instantiated, compiles for every arch this NVRTC targets
    (sm_75 to sm_121; a tenth of a second each).  Instantiating is slow, so outside ``slow`` runs
    most sources' kernels are compiled only by CI's install check; but a template's declaration is
    parsed whatever is instantiated, and the code an arch guard (``GRADOPS_HAS_MMA_SM80``) leaves
    out differs by arch.  Before this test, a kernel declaration that named a type defined only
    inside the sm_80 guard (its ``__launch_bounds__``) failed for sm_75, and only CI's install
    check, 25 minutes in, said so."""
    archs = _nvrtc_archs()
    assert 75 in archs and 90 in archs
    failed = {arch: log for arch in archs for ok, log, _ in [_nvrtc(source, arch)] if not ok}
    assert not failed, "\n".join(f"sm_{arch}: {log}" for arch, log in failed.items())


def test_the_parse_check_fails_on_a_declaration_outside_the_guard(tmp_path, monkeypatch):
    """The check above fails when a kernel's declaration names what only the sm_80 guard
    defines: sm_75 refuses it, sm_80 accepts it."""
    text = """#include "gradops_common.cuh"
#include "tensor_core_ptx.cuh"
#if GRADOPS_HAS_MMA_SM80
namespace guarded { template <int K> struct MinBlocks { static constexpr int value = 2; }; }
#endif
template <int K> __global__ void __launch_bounds__(256, guarded::MinBlocks<K>::value) k(float* out) {
#if GRADOPS_HAS_MMA_SM80
    out[threadIdx.x] = K;
#endif
}
"""
    for header in _build.source_dir().glob("*.cuh"):
        (tmp_path / header.name).write_text(header.read_text())
    (tmp_path / "planted.cu").write_text(text)
    monkeypatch.setattr(_build, "source_dir", lambda: tmp_path)
    _build.source_code.cache_clear()
    try:
        ok75, log75, _ = _nvrtc("planted.cu", 75)
        ok80, log80, _ = _nvrtc("planted.cu", 80)
    finally:
        _build.source_code.cache_clear()
    assert not ok75 and "guarded" in log75
    assert ok80, log80


def _ptx(source: str, expressions: list[str], extra_options=()) -> str:
    """NVRTC's sm_90 PTX of ``expressions`` of ``source``."""
    ok, log, ptx = _nvrtc(source, 90, expressions, extra_options)
    assert ok, log
    return ptx


def test_runtime_options_keep_float32_subnormals():
    """The runtime's own NVRTC options (``-ftz=false``; CuPy's cached compile would append
    ``-ftz=true``) give PTX without flush-to-zero float32 arithmetic, so a GPU keeps subnormals
    as NumPy, TF's CPU kernels and the host build do."""
    from gradops.backends.cuda import _runtime

    extra = [o for o in _runtime.gradops_options(13) if not o.startswith("-I")]
    assert extra == ["-ftz=false"]
    ptx = _ptx("fractional_avg_pool_grad.cu", ["gradops::fractional_avg_pool_grad<float, int, 4>"], extra)
    float_ops = [line for line in ptx.splitlines() if ".f32" in line]
    assert float_ops and not [line for line in float_ops if ".ftz" in line]


def test_ptxas_report_is_parsed():
    log = """ptxas info    : 138 bytes gmem
ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90'
ptxas info    : Function properties for _Z1kPf
ptxas         .     392 bytes stack frame, 368 bytes spill stores, 364 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 392 bytes cumulative stack size, 25600 bytes smem
ptxas info    : Compiling entry function '_Z1gv' for 'sm_90'
ptxas info    : Function properties for _Z1gv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 48 registers, used 0 barriers
"""
    assert _build.parse_ptxas_log(log) == {
        "_Z1kPf": {"registers": 255, "spill_stores": 368, "spill_loads": 364, "stack_bytes": 392,
                   "shared_bytes": 25600},
        "_Z1gv": {"registers": 48, "spill_stores": 0, "spill_loads": 0, "stack_bytes": 0, "shared_bytes": 0}}


def test_kernels_command_reports_every_kernel(capsys):
    from gradops.__main__ import main

    assert main(["kernels", "--arch", "sm_90", "--source", "fractional_avg_pool_grad.cu"]) == 0
    out = capsys.readouterr().out
    count = len(_build.all_instantiations()["fractional_avg_pool_grad.cu"])
    assert f"{count} kernels compiled, 0 with spills or a stack frame" in out


SHARED_WITH_CONSTRUCTOR = r'''
struct Cursor { int at; __device__ Cursor() : at(1) {} };
__device__ Cursor& cursor() { __shared__ Cursor c; return c; }
extern "C" __global__ void with_constructor(int* out) { out[threadIdx.x] = cursor().at; }
'''
CLEAN_SHARED = r'''
extern "C" __global__ void clean(int* out) { __shared__ int s[32]; s[threadIdx.x] = 1; __syncthreads(); out[0] = s[0]; }
'''


def test_compile_warnings_are_read_from_nvrtc_log():
    """NVRTC's real log: a ``__shared__`` variable with a constructor (which the device never
    runs) is warning #20054 and :func:`_build.compile_warnings` returns it; a clean program
    has none.  The install check and the test above refuse any warning."""
    import io

    pytest.importorskip("cuda.core")
    from cuda.core import Program, ProgramOptions

    def warnings(text):
        log = io.StringIO()
        program = Program(text, "c++", ProgramOptions(arch="sm_90", name="k.cu"))
        try:
            program.compile("cubin", logs=log)
        finally:
            program.close()
        return _build.compile_warnings(log.getvalue().replace("\0", ""))

    found = warnings(SHARED_WITH_CONSTRUCTOR)
    assert len(found) == 1 and "k.cu(3): warning #20054-D: dynamic initialization is not supported" in found[0]
    assert warnings(CLEAN_SHARED) == []


#: Kernels whose PTX NVVM itself does not reproduce (NVRTC 12.9 and 13.5 alike; measured
#: 2026-11-30): the depthwise input gradient's planes kernels with float accumulators, which read
#: shared memory 16 bytes at a time through ``load_run``'s float4.  In runs of 10 to 24 compiles
#: of those kernels together, one to five of them gave a second PTX text: one 16-byte ``ld.shared.v4.f32``
#: of which NVVM kept half, plus an ``ld.shared.v2.f32`` of the other half (or only a
#: ``.pragma "used_bytes_mask 255"`` on the load), where another compile has the one load.  ptxas
#: is not the cause: one PTX text always gave one cubin.  The NCHW tiled kernels at stride 1 did
#: the same until their loads became ``ptx::ld_shared_16`` (NVVM emits inline asm as it stands;
#: :func:`test_tiled_nchw_ptx_is_reproducible`); the planes kernels keep the float4, which costs
#: fewer registers there.  The compiles below leave these kernels out, so that they still catch
#: any other change from run to run.  (The convolution input gradient's few-channel kernels with
#: float accumulators did the same with their staged filter's 16-byte loads, which failed
#: test_compiles_are_reproducible once on 2026-12-06: 12 compiles of conv2d_backprop_input.cu gave
#: 4 PTX texts and 2 cubins, 40 compiles of those 16 kernels 11 texts, 7 cubins off the usual one;
#: with ``ptx::ld_shared_16`` there, 40 compiles gave one text.)
NVVM_UNSTABLE = re.compile(r"depthwise_conv2d_native_backprop_input_planes<[^,]+, float,")


def _named(pattern: re.Pattern, expression: str) -> bool:
    """Whether ``pattern`` matches the name expression without its ``gradops::``."""
    return pattern.match(expression.removeprefix("gradops::")) is not None


def _nvvm_unstable(expression: str) -> bool:
    return _named(NVVM_UNSTABLE, expression)


def _stable(source: str) -> list[str]:
    """The name expressions of ``source`` that NVVM compiles reproducibly (all but
    :data:`NVVM_UNSTABLE`), for sm_90."""
    return [e for e in _build.all_instantiations(90)[source] if not _nvvm_unstable(e)]


def test_nvvm_unstable_names_the_kernels_it_means():
    """The pattern names the 18 planes kernels with float accumulators of one source (12, and the
    6 staged forms at stride 2) and nothing else, so that a renamed template cannot make it
    silently leave out nothing or everything."""
    left_out = {source: [e for e in expressions if _nvvm_unstable(e)]
                for source, expressions in _build.all_instantiations(90).items()}
    assert {s for s, names in left_out.items() if names} == {"depthwise_conv2d_native_backprop_input.cu"}
    names = left_out["depthwise_conv2d_native_backprop_input.cu"]
    assert len(names) == 18 and all("_planes<" in e for e in names)
    assert sum(e.endswith(", true>") for e in names) == 6
    assert "gradops::depthwise_conv2d_native_backprop_input_planes<__half, float, 5, 5, 1>" in names
    assert not [e for e in names if "double" in e]


#: The NCHW tiled kernels at stride 1 with float accumulators, whose PTX varied from compile to
#: compile before their 16-byte shared loads became ``ptx::ld_shared_16`` (see NVVM_UNSTABLE).
TILED_NCHW_FLOAT = re.compile(r"depthwise_conv2d_native_backprop_input_tiled<[^,]+, float, 1, \d, \d, 1, 1,")


@pytest.mark.slow
def test_tiled_nchw_ptx_is_reproducible():
    """Four compiles of the 12 NCHW tiled kernels at stride 1 with float accumulators give one PTX
    text each.  Before ptx::ld_shared_16 (HEAD f2bb13a), 2 compiles of these kernels already gave
    two texts for 6 of them; 4 compiles now give one for all 12 (2026-11-30, NVRTC 13.5)."""
    source = "depthwise_conv2d_native_backprop_input.cu"
    names = [e for e in _build.all_instantiations(90)[source] if _named(TILED_NCHW_FLOAT, e)]
    assert len(names) == 12
    first = _ptx(source, names)
    assert "ld.shared.v4.f32" in first
    for _ in range(3):
        assert _ptx(source, names) == first


@pytest.mark.parametrize("source", [_quick_or_slow(s, s in QUICK_SOURCES) for s in SOURCES])
def test_ptx_is_reproducible(source):
    """Two compiles of one source give the same PTX (:data:`NVVM_UNSTABLE` left out), with no
    internal-linkage names in it.
    NVRTC emits each namespace-scope ``constexpr`` as a global and named internal-linkage ones
    with a per-compile random suffix (``_ZN78_INTERNAL_..._cu_ec61727d_327277...``); ptxas'
    schedule depended on those names, so the same source compiled to different SASS.  The
    sources declare them ``inline constexpr`` (external linkage, a fixed name)."""
    first = _ptx(source, _stable(source))
    assert "_INTERNAL_" not in first
    assert _ptx(source, _stable(source)) == first


@pytest.mark.parametrize("source", [_quick_or_slow(s, s in QUICK_SOURCES) for s in SOURCES])
def test_compiles_are_reproducible(source):
    """Two compiles of one source give the same cubin, byte for byte, so that the static report
    and the install check's register counts do not move with no change to the source (see
    :func:`test_ptx_is_reproducible` for what made them move; :data:`NVVM_UNSTABLE` left out)."""
    first, second = ([bytes(code.code) for _, _, _, code, _ in
                      _build._compiled(("sm_90",), [source], False, only=_stable(source), cache=False)]
                      for _ in range(2))
    assert first == second
