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
For a cubin the check also has ptxas report each kernel (``--ptxas-options=-v``, which changes
no code) and fails where a kernel spills registers or keeps a stack frame: lost speed that would
otherwise only show on a GPU, now checked for every arch and both NVRTC majors.  It also checks
that the installed CuPy has every function and type the runtime calls to compile and load a
kernel (:func:`_runtime.cupy_api_problems`).
"""

from __future__ import annotations

import contextlib
import io
import operator
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import _build, _runtime

#: The GPU generations checked: every arch CuPy 14 runs on that NVRTC can target for a shipping
#: GPU.  Maxwell (sm_50, sm_52: M40, GTX 9xx) and Pascal (sm_60, sm_61: P100, P40, GTX 10xx),
#: which CuPy's CUDA 12 build still ships code for; Volta (V100), Turing (T4), Ampere (A100;
#: consumer and A10), Jetson Orin (sm_87), Ada (L4, L40), Hopper (H100), Blackwell (B200, B300:
#: sm_100, sm_103), Jetson Thor (sm_101 to CUDA 12.9, sm_110 from CUDA 13), consumer Blackwell
#: and DGX Spark (sm_120, sm_121).  An arch the installed NVRTC cannot target (CUDA 13 dropped
#: everything before Turing, and renamed sm_101) is reported as such, not compiled.  Left out:
#: the Jetson boards before Orin (sm_53, sm_62, sm_72), which have no CUDA 12, and sm_88 and
#: sm_107, which NVRTC 13 targets but no GPU we know of reports.
ARCHS = (50, 52, 60, 61, 70, 75, 80, 86, 87, 89, 90, 100, 101, 103, 110, 120, 121)


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


#: How the preprocessor asks about the target: __CUDA_ARCH__ and gradops' GRADOPS_ARCH compared
#: with a number (anywhere, macro bodies too), and nv/target's NV_PROVIDES_SM_XX /
#: NV_IS_EXACTLY_SM_XX where they are used (not on the ``#define`` lines of nv/target itself,
#: which define one for every arch).
_ARCH_TEST = re.compile(r"(?:__CUDA_ARCH__|GRADOPS_ARCH)\s*(>=|<=|==|!=|>|<)\s*(\d+)|(?<!\w)NV_(PROVIDES|IS_EXACTLY)_SM_(\d+)")
_DEFINE = re.compile(r"^\s*#\s*define\b(?:.*\\\n)*.*$", re.M)  # with its continuation lines
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)
_COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}


def arch_tests(include_dirs, sources=None) -> set[tuple[str, int]]:
    """Every question about the target arch, as (operator, __CUDA_ARCH__ value), in gradops'
    sources (``sources``: these file names in ``cuda_src/``, else every one) and the headers
    they include, followed through ``include_dirs`` as found there."""
    folders = [_build.source_dir(), *(Path(d) for d in include_dirs)]
    if sources is None:
        todo = sorted(_build.source_dir().glob("*.cu*"))
    else:
        todo = sorted(_build.source_dir() / name for name in sources)
    seen, tests = set(), set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        text = path.read_text(errors="replace")
        for m in _ARCH_TEST.finditer(text):
            if m.group(1):
                tests.add((m.group(1), int(m.group(2))))
        for m in _ARCH_TEST.finditer(_DEFINE.sub("", text)):
            if m.group(3):
                tests.add((">=" if m.group(3) == "PROVIDES" else "==", int(m.group(4)) * 10))
        for name in _INCLUDE.findall(text):
            for folder in (path.parent, *folders):
                if (folder / name).is_file():
                    todo.append((folder / name).resolve())
                    break
    return tests


def arch_classes(archs, tests) -> list[list[int]]:
    """``archs`` grouped by the answers they give to ``tests``: the archs of a group see the same
    preprocessed source (oldest first in each group, groups by their oldest)."""
    groups: dict[tuple, list[int]] = {}
    for arch in sorted(archs):
        answers = tuple(_COMPARE[op](arch * 10, value) for op, value in sorted(tests))
        groups.setdefault(answers, []).append(arch)
    return sorted(groups.values())


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


#: Spills ptxas reported when the check began reading its report (2026-11-27, NVRTC 13.5 and 12.9),
#: not yet removed:
#: ``{(NVRTC major, arch, expression): (spill store bytes, spill load bytes, stack bytes)}``.
#: The check accepts these, at most these bytes, and fails on any other spill; each is a defect
#: to fix.  MinBlocks (igemm_tiles.cuh) fitted the filter gradient's 128-register budgets on
#: sm_80 and sm_90, where these kernels keep to registers; on sm_86 / sm_89 the scalar-load half
#: type kernel and on Blackwell the scalar float split one spill under that budget (outside
#: their main loops), and ptxas for sm_120 gives the direct kernel's NHWC form an 8-byte frame.
#: Their cost on those GPUs is unmeasured.
#:
#: Where they sit (SASS of 2026-11-29: local loads and stores per trip of the main loop, the
#: loop with the most FFMA / HMMA; NVRTC 12.9's cubins for sm_70 and older are past CUDA 13's
#: nvdisasm, so the Maxwell, Pascal and Volta entries are not located):
#:
#: * NVRTC 13: none in the main loop of the sm_86 / sm_89 kernels or of the scalar float split
#:   filter gradient on Blackwell; one 8-byte load per filter element of the direct kernel (sm_120: its
#:   element loop's step, gridDim.x, spilled once and reloaded at the loop's back edge, outside the
#:   reduction over positions; SASS of NVRTC 13.5, 2026-12-01).
#: * NVRTC 12.9, sm_100: 64 x 64 tiles and the 1x1 input gradient 1 per k-tile; the 5x5
#:   tensor-core depthwise filter gradient none.  (The scalar-load
#:   tensor-core input and filter gradients, 22 and 4-7 per k-tile of 32 HMMA, and the 3x3
#:   tensor-core depthwise filter gradient, 3 per step of 15 HMMA, 4 on sm_120, went on
#:   2026-11-29 with budgets for NVRTC 12 on Blackwell: igemm::MinBlocks, dwfmma::MinBlocks.)
#:   sm_120's 3x3 depthwise: one 8-byte load per image pair, outside the products' loop.
#: * NVRTC 12.9, sm_120: the unsplit 16-byte float filter gradient 3 per k-tile; the depthwise
#:   input gradient: none.  (The float split filter gradients' spills on sm_75 to sm_120, the
#:   1x1 one's 6 local loads per k-tile and the scalar one's 1-12 (sm_90: 7), went on 2026-11-29
#:   with the SIMT kernels' split index from the host's FastDiv constants: 13 entries; sm_90's
#:   float 1x1 one gained one 4-byte load per k-tile.)
KNOWN_SPILLS = {
    **{(13, "sm_86", f"gradops::conv2d_backprop_filter_igemm<{t}, float, 1, false, true>"): (12, 8, 8)
       for t in ("__half", "__nv_bfloat16")},  # and sm_89 (SPILLS_AS)
    **{(13, "sm_120", f"gradops::conv2d_backprop_filter_direct<{t}, 0>"): (8, 8, 8)
       for t in ("__half, float", "__nv_bfloat16, float", "float, float", "double, double")},
    # Since the SIMT split kernels take their split index from the host's FastDiv constants
    # (2026-11-29), which took away sm_120's 16-byte float split spill (one load per k-tile):
    # 2 loads and 3 stores around the main loop, none in it.
    **{(13, arch, "gradops::conv2d_backprop_filter_igemm<float, float, 0, false, true>"): (16, 12, 16)
       for arch in ("sm_100", "sm_110", "sm_120")},
    # NVRTC 12.9 (the cuda12 extra) allocates registers less tightly than 13.x: the filter
    # gradients' igemm kernels under MinBlocks' budgets, and the depthwise filter gradient's
    # float32 5x5 planes kernel, spill on the archs it compiles.  (The depthwise tiled kernel's
    # float64 and sm_70 float32 5x5 spills went on 2026-11-28 with dwfilter::MinBlocks' 2 CTAs.
    # Volta has no uniform registers: the SIMT split kernels' FastDiv only shrank the float
    # one's spill there, from 100 bytes of stores.)
    (12, "sm_70", "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, false>"): (16, 24, 8),
    (12, "sm_70", "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, true>"): (100, 100, 88),
    (12, "sm_70", "gradops::conv2d_backprop_filter_direct<double, double, 0>"): (4, 4, 8),
    (12, "sm_70", "gradops::conv2d_backprop_filter_direct<double, double, 1>"): (4, 4, 8),
    (12, "sm_70", "gradops::conv2d_backprop_filter_igemm<__half, float, 1, true, false>"): (52, 60, 56),
    (12, "sm_70", "gradops::conv2d_backprop_filter_igemm<__half, float, 1, true, true>"): (108, 108, 96),
    (12, "sm_70", "gradops::conv2d_backprop_filter_igemm<float, float, 0, false, true>"): (48, 40, 32),
    (12, "sm_70", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 0>"): (4, 16, 8),
    (12, "sm_70", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 1>"): (4, 12, 8),
    (12, "sm_75", "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, true>"): (12, 8, 8),
    # One 4-byte load per k-tile of 512 FFMA since the split index comes from FastDiv constants
    # (before, this kernel spilled 40-48 bytes, 4-6 loads per k-tile, on sm_75 to sm_89 and
    # sm_120, and nothing on sm_90).  A 32-bit k range took it away but cost 11 more
    # instructions per k-tile under NVRTC 13.
    (12, "sm_90", "gradops::conv2d_backprop_filter_1x1_igemm<float, float, 0, true, true>"): (4, 4, 8),
    # NVRTC 12.9 on Maxwell (sm_50; sm_52 allocates alike, SPILLS_AS) and Pascal (sm_60, sm_61),
    # first checked 2026-11-29: the forward convolution's scalar-load half-type SIMT kernel and
    # the depthwise filter gradient's 5x5 planes kernels.
    (12, "sm_50", "gradops::conv2d_igemm<__half, float, 0, false>"): (96, 64, 32),
    (12, "sm_50", "gradops::conv2d_igemm<__nv_bfloat16, float, 0, false>"): (24, 12, 8),
    (12, "sm_50", "gradops::depthwise_conv2d_native_backprop_filter_planes<__half, float, 5, 1, 0>"): (36, 48, 40),
    (12, "sm_50", "gradops::depthwise_conv2d_native_backprop_filter_planes<__nv_bfloat16, float, 5, 1, 0>"): (40, 52, 40),
    (12, "sm_50", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 0>"): (48, 88, 48),
    (12, "sm_50", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 1>"): (48, 80, 48),
    (12, "sm_50", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 2>"): (16, 40, 16),
    (12, "sm_60", "gradops::conv2d_igemm<__half, float, 0, false>"): (36, 24, 16),
    (12, "sm_60", "gradops::conv2d_igemm<__nv_bfloat16, float, 0, false>"): (24, 12, 8),
    (12, "sm_60", "gradops::depthwise_conv2d_native_backprop_filter_planes<__half, float, 5, 1, 0>"): (40, 52, 40),
    (12, "sm_60", "gradops::depthwise_conv2d_native_backprop_filter_planes<__nv_bfloat16, float, 5, 1, 0>"): (40, 52, 40),
    (12, "sm_60", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 0>"): (48, 88, 48),
    (12, "sm_60", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 1>"): (48, 80, 48),
    (12, "sm_60", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 2>"): (16, 40, 16),
    (12, "sm_61", "gradops::conv2d_igemm<__half, float, 0, false>"): (96, 64, 32),
    (12, "sm_61", "gradops::conv2d_igemm<__nv_bfloat16, float, 0, false>"): (24, 12, 8),
    (12, "sm_61", "gradops::depthwise_conv2d_native_backprop_filter_planes<__half, float, 5, 1, 0>"): (40, 52, 40),
    (12, "sm_61", "gradops::depthwise_conv2d_native_backprop_filter_planes<__nv_bfloat16, float, 5, 1, 0>"): (40, 52, 40),
    (12, "sm_61", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 0>"): (48, 88, 48),
    (12, "sm_61", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 1>"): (48, 80, 48),
    (12, "sm_61", "gradops::depthwise_conv2d_native_backprop_filter_planes<float, float, 5, 1, 2>"): (16, 40, 16),
    # NVRTC 12.9 on sm_86, sm_89, sm_100 and sm_120, which CI's cuda12 check skipped until
    # 2026-11-28 (it compiled one arch per preprocessing class, but ptxas allocates per arch; its
    # first run on every arch found 87, and the depthwise input gradient's NCHW 224-byte frames,
    # since removed).  On 2026-11-29 the 40 128- and 192-byte frames of the implicit-GEMM
    # convolutions' 16-byte-load SIMT kernels on Blackwell (their staging arrays in local
    # memory; Loader::fetch_vector now stores a chunk once) went, but for the float filter
    # gradient on sm_120, which now spills 32 bytes instead: 48 left.  Later that day 14 more
    # went (the scalar-load tensor-core convolutions and the 3x3 tensor-core depthwise filter
    # gradient, with register budgets for NVRTC 12 on Blackwell) and 4 shrank, then the float
    # split filter gradients' (their split index from the host's FastDiv constants): 27 left on
    # these archs.  Left on Blackwell: the convolutions' 64 x 64 tensor-core kernels, the 1x1
    # input gradient and the half-type 1x1 split filter gradient spill 4-12 bytes, the unsplit
    # 16-byte float filter gradient 32 on sm_120, the tensor-core depthwise filter gradient 4-20.
    # (The depthwise tiled input gradient's 5x5 one-row tiles' 12 bytes on sm_120 went on
    # 2026-12-04, when the kernel's body became a device function the kernel calls.)
    # CUDA 13's NVRTC (the cuda13 extra, the GPU image's) keeps every one of them in registers
    # but those listed under 13 above.
    (12, "sm_100", "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, true, 128, 64>"): (12, 8, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_1x1_igemm<__half, float, 1, true, true, 64, 128>"): (12, 8, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_1x1_igemm<__nv_bfloat16, float, 1, true, true, 128, 64>"): (12, 8, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_1x1_igemm<__nv_bfloat16, float, 1, true, true, 64, 128>"): (12, 8, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_igemm<__half, float, 1, true, false, 64, 64>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_igemm<__half, float, 1, true, true, 64, 64>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_igemm<__nv_bfloat16, float, 1, true, false, 64, 64>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_filter_igemm<__nv_bfloat16, float, 1, true, true, 64, 64>"): (4, 4, 8),
    (12, "sm_120", "gradops::conv2d_backprop_filter_igemm<float, float, 0, true, false>"): (32, 32, 16),
    (12, "sm_100", "gradops::conv2d_backprop_input_1x1_igemm<__half, float, 1, true, false, 128, 64>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_input_1x1_igemm<__half, float, 1, true, false, 64, 128>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_input_1x1_igemm<__nv_bfloat16, float, 1, true, false, 128, 64>"): (4, 4, 8),
    (12, "sm_100", "gradops::conv2d_backprop_input_1x1_igemm<__nv_bfloat16, float, 1, true, false, 64, 128>"): (4, 4, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 3, 1, 1>"): (8, 8, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 3, 1, 2>"): (8, 8, 8),
    (12, "sm_100", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 5, 1, 1>"): (4, 4, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 5, 1, 1>"): (20, 20, 24),
    (12, "sm_100", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 5, 1, 2>"): (4, 4, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__half, 5, 1, 2>"): (20, 20, 24),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 3, 1, 1>"): (8, 8, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 3, 1, 2>"): (8, 8, 8),
    (12, "sm_100", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 5, 1, 1>"): (4, 4, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 5, 1, 1>"): (20, 20, 24),
    (12, "sm_100", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 5, 1, 2>"): (4, 4, 8),
    (12, "sm_120", "gradops::depthwise_conv2d_native_backprop_filter_mma<__nv_bfloat16, 5, 1, 2>"): (20, 20, 24),
}

#: Archs whose kernels ptxas allocated exactly as their sibling's when the check first covered
#: them (2026-11-29, NVRTC 13.5 and 12.9, every source: the same kernels spilling, by the same
#: bytes): they accept the sibling's known spills.  Pascal's two did not (sm_61's half-type
#: forward kernel spills 96 bytes, sm_60's 36), and list their own.  sm_89 (Ada) listed its own
#: until 2026-12-01, when every one of the 734 kernels got the same registers, spills, stack and
#: shared memory on it as on sm_86 under NVRTC 13.5 and 12.9; CI's check (.ci/run) compiles
#: sm_86 for both.
SPILLS_AS = {"sm_52": "sm_50", "sm_87": "sm_86", "sm_89": "sm_86", "sm_101": "sm_100", "sm_103": "sm_100",
             "sm_121": "sm_120"}


def known_spills(nvrtc_major: int, arch: str) -> dict[str, tuple[int, int, int]]:
    """The spills the check accepts for ``arch`` ("sm_XX") under this NVRTC major:
    ``{expression: (spill stores, spill loads, stack bytes)}`` (:data:`KNOWN_SPILLS`, with
    :data:`SPILLS_AS`)."""
    as_arch = SPILLS_AS.get(arch, arch)
    return {e: v for (major, a, e), v in KNOWN_SPILLS.items() if major == nvrtc_major and a == as_arch}


def resource_verdict(names: dict[str, str], log: str, known: dict | None = None) -> dict:
    """A cubin's row from ptxas' report in NVRTC's ``log`` (``names``: expression -> mangled
    name): ``status`` "ok", or "spills" where a kernel spills or keeps a stack frame beyond what
    ``known`` (``{expression: (spill stores, spill loads, stack bytes)}``) accepts, or ptxas
    reported nothing on it; with ``registers`` (the most any kernel uses), ``detail`` and
    ``known_spills`` (the accepted ones that occurred)."""
    known = known or {}
    stats = _build.parse_ptxas_log(log)
    unreported = sorted(e for e, mangled in names.items() if mangled not in stats)
    spilling, accepted = [], []
    for e, mangled in sorted(names.items()):
        s = stats.get(mangled)
        found = _build.spill_bytes(s) if s else (0, 0, 0)
        if any(found):
            text = f"{e}: {found[0]} B spill stores, {found[1]} B spill loads, {found[2]} B stack"
            ok = e in known and all(f <= k for f, k in zip(found, known[e]))
            (accepted if ok else spilling).append(text)
    registers = max((stats[m]["registers"] for m in names.values() if m in stats), default=0)
    problems = spilling + [f"{e}: no ptxas report" for e in unreported]
    return {"status": "spills" if problems else "ok", "registers": registers, "detail": "; ".join(problems),
            "known_spills": accepted}


def compile_plan(classes, one_per_class: bool = False, each=()) -> dict[int, int]:
    """``{arch: the arch compiled for it}`` over ``classes`` (:func:`arch_classes`): every arch
    for itself; with ``one_per_class``, of each class the archs in ``each``, or where it has none
    its oldest (whose features every other arch of the class has too), the rest covered by the
    first of those."""
    plan = {}
    for group in classes:
        compiled = group if not one_per_class else [a for a in group if a in each] or group[:1]
        plan.update({a: a if a in compiled else compiled[0] for a in group})
    return plan


def run(archs=ARCHS, sources=None, jobs: int = 1, only_environment: bool = False,
        one_per_class: bool = False, each=()) -> dict:
    """Compile everything; returns ``{"nvrtc", "options", "foreign", "missing", "api" (what the
    installed CuPy lacks of the surface the runtime uses: :func:`_runtime.cupy_api_problems`),
    "classes" (``{source: [[arch, ...], ...]}``), "rows"}`` where each row is ``{arch, source, kernels, status ("ok" | "failed" | "spills" |
    "warnings" (NVRTC's, :func:`_build.compile_warnings`) | "not targetable" | "covered"), seconds, detail}``, and ``registers`` (the most any kernel
    uses) where ptxas reported.  ``one_per_class``: of each class of targetable archs that see
    the same preprocessed source file (:func:`arch_classes`, per file), compile only the archs in ``each``,
    or the oldest where the class has none of them; the others are "covered"
    (:func:`compile_plan`)."""
    import cupy

    api = _runtime.cupy_api_problems()
    nvrtc = cupy.cuda.nvrtc.getVersion()
    targetable = set(cupy.cuda.nvrtc.getSupportedArchs())
    options = _runtime.nvrtc_options()
    foreign = foreign_include_dirs(options) if only_environment else []
    include_dirs = [o[2:] for o in options if o.startswith("-I")]
    missing = _build.missing_headers(include_dirs)
    numbers = [_build.arch_number(a) for a in archs]
    # Classes per source file: a program is compiled on its own, so an arch test in one file
    # (the fractional pooling gradient's kFastFp64) splits only that file's class.
    checked = sorted(s for s in _build.all_instantiations() if not sources or s in sources)
    tests = {source: arch_tests(include_dirs, [source]) for source in checked}
    classes = {source: arch_classes([a for a in numbers if a in targetable], tests[source]) for source in checked}
    compiled_as = {source: compile_plan(classes[source], one_per_class, each) for source in checked}
    jobs_todo = []
    rows = []
    for arch in numbers:
        todo = _build.all_instantiations(arch)
        for source in sorted(todo):
            if sources and source not in sources:
                continue
            row = {"arch": f"sm_{arch}", "source": source, "kernels": len(todo[source]),
                   "status": "not targetable", "seconds": 0.0,
                   "detail": f"NVRTC {nvrtc[0]}.{nvrtc[1]} cannot target sm_{arch}"}
            rows.append(row)
            as_arch = compiled_as[source].get(arch, arch)
            if arch in targetable and as_arch != arch:
                row.update(status="covered", detail=f"preprocesses as sm_{as_arch} does (the same answers to the "
                                                    f"{len(tests[source])} arch tests of {source} and its headers)")
            elif arch in targetable:
                jobs_todo.append((row, arch, source, todo[source]))

    def compile_one(item):
        row, arch, source, expressions = item
        start = time.perf_counter()
        log = io.StringIO()
        try:
            binary, names = _runtime.compile_kernels(source, expressions, str(arch), log=log, ptxas_verbose=True)
        except Exception as exc:  # CompileException carries NVRTC's log
            row.update(status="failed", detail=f"{type(exc).__name__}: {exc}".strip())
        else:
            if _arch_option(arch)[1] == "cubin" and _runtime.elf_size(binary) != len(binary):
                # What the runtime caches must be the whole file (see _runtime.whole_cubin).
                row.update(status="failed", detail=f"the cubin has {len(binary)} bytes, its ELF header says "
                                                   f"{_runtime.elf_size(binary)}")
            elif _arch_option(arch)[1] == "cubin":
                known = known_spills(nvrtc[0], f"sm_{arch}")
                row.update(resource_verdict(names, log.getvalue(), known))
            else:
                row.update(status="ok", detail="PTX: the driver compiles it, so ptxas reports nothing here")
            warnings = _build.compile_warnings(log.getvalue())
            if warnings and row["status"] == "ok":  # a source-level warning means what it says on every arch
                row.update(status="warnings", detail="; ".join(warnings))
        row["seconds"] = time.perf_counter() - start

    # Longest first, so that no large program is left compiling alone at the end: the cost of a
    # program grows with its kernels and its source (a rough guess that puts the depthwise input
    # gradient, about half of the total, first).
    jobs_todo.sort(key=lambda item: -len(item[3]) * len(_build.source_code(item[2])))
    with _target(_arch_option), ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(compile_one, jobs_todo))
    return {"nvrtc": f"{nvrtc[0]}.{nvrtc[1]}", "options": options, "foreign": foreign, "missing": missing, "api": api,
            "classes": {source: [[f"sm_{a}" for a in group] for group in groups] for source, groups in classes.items()},
            "rows": rows}
