"""Shared fixtures: dtypes and tolerances, the optional TensorFlow import, GPU detection."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# TF 2.21 wheels route these ops to oneDNN by default, which departs from the C++ kernels
# that are the spec (and aborts the process on some invalid inputs): compare with the stock ones.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# JAX would otherwise take 75% of the GPU's memory at its first use, and PyTorch or CuPy in the
# same (or a parallel pytest-xdist) process then runs out (seen on an H100 with -n 14).
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

FLOAT_DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64]

# Relative tolerance per dtype, against a float64 reference, scaled by the sum of |terms|.
RTOL = {
    np.dtype(np.float16): 2e-3,
    np.dtype(ml_dtypes.bfloat16): 1.6e-2,
    np.dtype(np.float32): 1e-5,
    np.dtype(np.float64): 1e-12,
}


def assert_close(actual, expected, dtype, scale=None):
    """|actual - expected| <= rtol(dtype) * scale elementwise (scale defaults to max |expected|, min 1)."""
    actual = np.asarray(actual).astype(np.float64)
    expected = np.asarray(expected).astype(np.float64)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if scale is None:
        scale = max(1.0, float(np.max(np.abs(expected)))) if expected.size else 1.0
    tol = RTOL[np.dtype(dtype)] * scale
    err = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    assert err <= tol, f"max error {err} > tolerance {tol} ({np.dtype(dtype).name})"


def run_forced_cases(name: str, cases, forced: dict, run, least: int = 1) -> None:
    """``run(case)`` for each of ``cases``, where a forced kernel that cannot run one (a
    ValueError saying it cannot run it, or what it needs) skips it: every case runs with nothing
    forced, at least ``least`` with a forced choice (``name`` in the message)."""
    import re

    ran = 0
    for case in cases:
        try:
            run(case)
        except ValueError as error:
            if not forced or not re.search("cannot run|needs? ", str(error)):
                raise
            continue
        ran += 1
    assert ran >= (len(cases) if not forced else least), f"{name} ran {ran} of {len(cases)} cases"


def random_array(rng, shape, dtype):
    """Standard normal values rounded to ``dtype`` (so references see exactly what the op sees)."""
    return rng.standard_normal(shape).astype(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _gpu_available()


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the slow marks added here must count
def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(skip_gpu)
        params = getattr(item, "callspec", None)
        if "slow_on_host" in item.keywords and params and params.params.get("cuda_device") == "host":
            item.add_marker(pytest.mark.slow)
    # Their NVRTC compiles make these the longest tests (up to 100 s each on 2 cores): first,
    # so that pytest-xdist's workers are not left with them at the end, one working, one idle.
    items.sort(key=lambda item: item.path.name not in LONGEST_MODULES)


#: Test modules run before the others (see pytest_collection_modifyitems).
LONGEST_MODULES = ("test_static_report.py", "test_cuda_compile.py")


def to_gpu(a):
    """A host array on the current GPU (``cupy``: the real one, or tests/cuda_host.py's
    stand-in while installed), in the layout CuPy keeps (C, or Fortran).  bfloat16 moves as raw
    bits, so it arrives whatever CuPy can compute on (its bfloat16 support is partial)."""
    import cupy

    a = np.asarray(a)
    if a.dtype.kind != "V":
        return cupy.asarray(a)
    return cupy.asarray(a.view(f"u{a.itemsize}")).view(a.dtype)


def misaligned_on_gpu(a):
    """A contiguous device copy of ``a`` that starts one element into its allocation (aligned to
    no more than its element; bfloat16 as raw bits, as to_gpu)."""
    a = np.ascontiguousarray(a)
    raw = np.zeros(a.size + 1, f"u{a.itemsize}")
    raw[1:] = a.reshape(-1).view(raw.dtype)
    return to_gpu(raw)[1:].view(a.dtype).reshape(a.shape)


def to_host(x):
    """A GPU array back as a NumPy array of the same dtype (bfloat16 as raw bits, as to_gpu)."""
    import cupy

    if x.dtype.kind != "V":
        return cupy.asnumpy(x)
    return cupy.asnumpy(x.view(f"u{x.itemsize}")).view(x.dtype)

class CudaArrayInterfaceOnly:
    """A foreign GPU tensor exposing only ``__cuda_array_interface__``."""

    def __init__(self, array):
        self._array = array

    @property
    def __cuda_array_interface__(self):
        return self._array.__cuda_array_interface__


class DLPackOnly:
    """A foreign tensor exposing only the DLPack protocol, on the wrapped array's device (a GPU
    array's, or a NumPy array's: a host tensor NumPy reads only through DLPack)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


#: Parametrises a test's ``wrapper`` over both kinds of foreign GPU tensor.
FOREIGN_GPU_WRAPPERS = pytest.mark.parametrize("wrapper", [CudaArrayInterfaceOnly, DLPackOnly], ids=["cai", "dlpack"])


@pytest.fixture(scope="session", autouse=True)
def _one_nvrtc_cache_a_run(tmp_path_factory):
    """The NVRTC compiles of the SASS tests (gradops.backends.cuda._build._compiled) kept in one
    folder a run, which pytest-xdist's workers share: several tests compile the same sources
    for the same archs (the static report's, the resource check's), and a module's fixture ran
    once a worker.  A new folder each run, so that a run compiles what it tests; a folder named
    in GRADOPS_SASS_CACHE_DIR is used as it is."""
    if os.environ.get("GRADOPS_SASS_CACHE_DIR"):
        yield
        return
    base = tmp_path_factory.getbasetemp()
    folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "nvrtc-cache"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADOPS_SASS_CACHE_DIR", str(folder))
        yield


@pytest.fixture(autouse=True)
def _fresh_launch_table_cache():
    """The launchers keep device copies of their tables (fractional pooling's cells, the input
    gradient's phase plans); a test's CPU stand-in (and the memory it holds) must not outlive
    the test through that cache."""
    yield
    import importlib

    importlib.import_module("gradops.backends.cuda._runtime").clear_table_cache()


def _install_host_device(request, monkeypatch):
    """The CPU stand-in for CuPy and a GPU (tests/cuda_host.py), installed for this test, with
    blocks and threads run in a shuffled order seeded by the test's name; or skip.  With
    GRADOPS_HOST_RACECHECK=1 in the environment its kernels are racecheck builds (slower: for a
    sweep of the host tests, which then also fail at any shared-memory hazard)."""
    import zlib

    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    seed = zlib.crc32(request.node.nodeid.encode())
    racecheck = os.environ.get("GRADOPS_HOST_RACECHECK", "") == "1"
    return cuda_host.HostDevice(order="shuffled", seed=seed, racecheck=racecheck).install(monkeypatch)


@pytest.fixture
def racecheck_device(request, monkeypatch):
    """The HostDevice stand-in with racecheck builds of the kernels (cuda_host.HostKernels): a
    launch fails at the first shared-memory hazard between threads of a block; or skip."""
    import zlib

    import cuda_host

    reason = cuda_host.unavailable_reason()
    if reason:
        pytest.skip(f"cannot build the kernel sources for the host: {reason}")
    seed = zlib.crc32(request.node.nodeid.encode())
    return cuda_host.HostDevice(order="shuffled", seed=seed, racecheck=True).install(monkeypatch)


@pytest.fixture
def host_device(request, monkeypatch):
    """The HostDevice stand-in alone, for tests of the stand-in itself: a GPU has nothing for them
    to check, and a GPU run's gate refuses skips."""
    return _install_host_device(request, monkeypatch)


@pytest.fixture(params=["host", pytest.param("gpu", marks=pytest.mark.gpu)])
def cuda_device(request, monkeypatch):
    """Where a test of gradops' CUDA kernels runs: "gpu" (CuPy on a GPU; skipped without one;
    the fixture's value is None) or "host" (the HostDevice stand-in: the same launchers, public
    API and kernel sources on the CPU through tests/cuda_host.py).  Tests written against
    ``import cupy`` / ``to_gpu`` / ``to_host`` run unchanged on both."""
    return None if request.param == "gpu" else _install_host_device(request, monkeypatch)


_GPU_BACKEND_PARAMS = [pytest.param("cuda-host", id="cuda-host"),
                       pytest.param("cuda", marks=pytest.mark.gpu, id="cuda"),
                       pytest.param("cudnn", marks=pytest.mark.gpu, id="cudnn")]


@pytest.fixture(params=_GPU_BACKEND_PARAMS)
def gpu_backend(request, monkeypatch):
    """The ``backend=`` name of a GPU backend: "cuda" and "cudnn" on a GPU (skipped without
    one), and "cuda" on the HostDevice stand-in (the "cuda-host" case, which runs everywhere)."""
    if request.param == "cuda-host":
        _install_host_device(request, monkeypatch)
        return "cuda"
    return request.param


@pytest.fixture(params=[pytest.param("numpy", id="numpy"), *_GPU_BACKEND_PARAMS])
def any_backend(request, monkeypatch):
    """Every backend's ``backend=`` name: "numpy", then as :func:`gpu_backend`."""
    if request.param == "cuda-host":
        _install_host_device(request, monkeypatch)
        return "cuda"
    return request.param


@pytest.fixture(scope="session")
def tf():
    """tensorflow-cpu, or skip (it is a test extra and not available on every platform)."""
    return pytest.importorskip("tensorflow")


# Hypothesis profiles of the hostile-argument fuzzer (tests/test_fuzz.py): "fuzz-ci" keeps the
# bounded run in the default suite under about a minute; "fuzz-long" is the @slow soak.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("fuzz-ci", max_examples=300, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.register_profile("fuzz-long", max_examples=20000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
