"""What the GPU backends need from the machine: CuPy and a CUDA device."""

from __future__ import annotations

import ctypes
import sys

#: The CUDA driver library each platform loads (what the CUDA runtime itself opens).
DRIVER_LIBRARY = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
#: The oldest driver branch for each CUDA major (NVIDIA's CUDA toolkit release notes, table 3).
MINIMUM_DRIVER = {12: "R525", 13: "R580"}


_UNREADABLE = (f"{DRIVER_LIBRARY} loads but reports no CUDA version (cuDriverGetVersion failed: a "
               "toolkit's stub library found before the driver's, or a broken driver install)")


def _load_driver():
    """The CUDA driver library, or None where none is installed (or visible: a container run
    without ``--gpus``)."""
    try:
        return ctypes.CDLL(DRIVER_LIBRARY)
    except OSError:
        return None


def driver_status() -> tuple[str, int | None]:
    """("ok", the newest CUDA version the installed driver supports, e.g. 12080 for 12.8), or
    ("missing", None) where the driver library does not load, or ("unreadable", None) where it
    loads but ``cuDriverGetVersion`` (which needs no device and no cuInit) reports nothing: a
    toolkit's stub library, a broken install."""
    driver = _load_driver()
    if driver is None:
        return "missing", None
    version = ctypes.c_int(0)
    try:
        status = driver.cuDriverGetVersion(ctypes.byref(version))
    except (AttributeError, OSError):
        return "unreadable", None
    return ("ok", int(version.value)) if status == 0 and version.value > 0 else ("unreadable", None)


def describe_driver() -> str:
    """One line on the driver for ``info``."""
    state, version = driver_status()
    if state == "ok":
        return f"supports CUDA up to {_format(version)}"
    if state == "missing":
        return f"none found ({DRIVER_LIBRARY} does not load)"
    return _UNREADABLE


def _format(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def driver_hint(runtime_version: int) -> str:
    """Why a CUDA runtime of ``runtime_version`` (CuPy's) may find no usable driver, where the
    driver can say: none installed, or one too old for the runtime's CUDA major; else ''."""
    state, driver = driver_status()
    if state == "missing":
        return (f"no NVIDIA driver was found: {DRIVER_LIBRARY} does not load (in a container, run it "
                "with --gpus all)")
    if driver is None:
        return _UNREADABLE
    runtime_major = runtime_version // 1000
    if driver // 1000 < runtime_major:
        minimum = MINIMUM_DRIVER.get(runtime_major)
        return (f"the NVIDIA driver supports CUDA up to {_format(driver)} and CuPy is built for CUDA "
                f"{_format(runtime_version)}: update the driver"
                + (f" ({minimum} or newer)" if minimum else "")
                + (f" or install gradops[cuda{driver // 1000}]" if driver // 1000 in MINIMUM_DRIVER else ""))
    return ""


def cupy_device_status() -> tuple[bool, str]:
    """(True, device description) when CuPy imports and sees a CUDA device, else (False, why)."""
    try:
        import cupy
    except ImportError:
        return False, "CuPy is not installed (extras cuda12 / cuda13)"
    except Exception as exc:  # a broken CUDA install can fail at import time
        return False, f"CuPy failed to import: {type(exc).__name__}: {exc}"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        reason = f"no usable CUDA driver/device: {type(exc).__name__}: {exc}"
        try:
            hint = driver_hint(int(cupy.cuda.runtime.runtimeGetVersion()))
        except Exception:  # noqa: BLE001 - the hint is a courtesy; the reason stands without it
            hint = ""
        return False, reason + (f"; {hint}" if hint else "")
    if count == 0:
        return False, "no CUDA device found"
    return True, f"{count} CUDA device(s)"


def unbuilt_backend_status(not_built: str) -> tuple[bool, str]:
    """Status of a GPU backend whose implementation has not landed: the first missing piece."""
    ok, reason = cupy_device_status()
    return False, (not_built if ok else reason)
