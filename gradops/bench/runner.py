"""The benchmark loop: for every (case, dtype), check each engine, then time the ones that agree.

Per (case, dtype):

1. Operands are drawn once (standard normal, rounded to the dtype).
2. Small check: every engine computes the case on the first ``check_batch`` batch items; the
   result must match the NumPy backend run in float64 on the same values (check.TOLERANCE).
3. Full check: the engines that passed compute the full case once; their results are
   compared with each other (check.by_vote).
4. Only engines that passed both are timed.  An engine that raises is reported as ``error``,
   one that disagrees as ``mismatch``, with the reason; neither is timed.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
import zlib
from pathlib import Path
from typing import Callable

import numpy as np

from . import check, metrics
from .engines import CPU_SPEEDUPS, CUDA_EVENTS, GPU_SPEEDUPS, Engine, batch_slice, make_inputs, numpy_reference
from .suites import DTYPES, POOLING_OPS, Case, expand, suite
from .timing import TimingSettings, cuda_events, wall_clock

#: Batch items the small check runs (enough to catch batch-stride bugs, cheap for NumPy in float64).
CHECK_BATCH = 2


def gpu_present() -> bool:
    from ..backends._gpu_probe import cupy_device_status

    return cupy_device_status()[0]


def git_commit() -> str:
    """``$GRADOPS_COMMIT`` when the caller states it (a container, a copied tree whose .git may
    be stale: seen on the lent GPU machine); else the short commit of the checkout gradops runs
    from ("-dirty" with uncommitted changes), or unknown."""
    stated = os.environ.get("GRADOPS_COMMIT", "").strip()
    if stated:  # the caller knows better than a checkout's .git (a copied tree can carry a stale one)
        return f"{stated[:12]} (stated by GRADOPS_COMMIT)"
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                         stderr=subprocess.DEVNULL).strip()
        dirty = subprocess.check_output(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                        text=True, stderr=subprocess.DEVNULL).strip()
        return commit + ("-dirty" if dirty else "")
    except Exception:
        return "unknown"


def _cpu_meta() -> dict:
    import gradops

    return dict(date=time.strftime("%Y-%m-%d"), time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                commit=git_commit(), gradops=gradops.__version__, python=platform.python_version(),
                numpy=np.__version__, machine=platform.machine(), processor=platform.processor() or "unknown",
                cpu_count=os.cpu_count())


def _gpu_meta() -> dict:
    import cupy

    device = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(device.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return dict(device=name, compute_capability=f"{props['major']}.{props['minor']}",
                sm_count=int(props["multiProcessorCount"]),
                driver=str(cupy.cuda.runtime.driverGetVersion()), cuda_runtime=str(cupy.cuda.runtime.runtimeGetVersion()),
                cupy=cupy.__version__)


class Runner:
    """Runs cases on engines and collects report rows (plain dicts, JSON-ready)."""

    def __init__(self, engines: list[Engine], mode: str, settings: TimingSettings, allow_tf32: bool = False,
                 peaks: metrics.Peaks | None = None, seed: int = 0, check_batch: int = CHECK_BATCH,
                 timer: Callable[[Engine, Callable, TimingSettings], float] | None = None):
        self.engines = engines
        self.mode = mode
        self.settings = settings
        self.allow_tf32 = allow_tf32
        self.peaks = peaks
        self.seed = seed
        self.check_batch = check_batch
        self.timer = timer or self._time
        self.status = {e.name: e.available() for e in engines}

    @staticmethod
    def _time(engine: Engine, fn: Callable, settings: TimingSettings) -> float:
        if engine.timer == CUDA_EVENTS:
            return cuda_events(fn, settings)
        return wall_clock(fn, settings, engine.sync)

    def run_case(self, case: Case, dtype_name: str) -> dict:
        dtype = DTYPES[dtype_name]
        geometry = case.geometry()
        work = metrics.flops(case, geometry)
        traffic = metrics.bytes_moved(case, geometry, dtype.itemsize)
        row = dict(suite=case.suite, layer=case.layer, label=case.label, op=case.op, data_format=case.data_format,
                   dtype=dtype_name, input_shape=list(case.input_tensor_shape()),
                   filter_shape=list(case.filter_shape) if case.filter_shape else None,
                   strides=list(case.strides), padding=case.padding, pads=case.pads,
                   pooling_ratio=case.pooling_ratio if case.op in POOLING_OPS else None,
                   overlapping=case.overlapping if case.op in POOLING_OPS else None,
                   flops=work, bytes=traffic, engines={}, pairwise={})
        results: dict[str, dict] = row["engines"]
        tolerance = check.TOLERANCE[dtype_name]

        candidates = []
        for engine in self.engines:
            ok, reason = self.status[engine.name]
            if not ok:
                results[engine.name] = dict(status="unavailable", note=reason)
                continue
            try:
                ok, reason = engine.supports(case, dtype)
            except Exception as exc:
                ok, reason = False, f"supports() raised {type(exc).__name__}: {exc}"
            if not ok:
                results[engine.name] = dict(status="n/a", note=reason)
            else:
                candidates.append(engine)
        if not candidates:
            return row

        # Operands depend only on the case, dtype and seed, not on which other cases run.
        key = zlib.crc32(f"{case.suite}|{case.label}|{case.op}|{dtype_name}".encode())
        arrays = make_inputs(case, dtype, np.random.default_rng([self.seed, key]))

        # 1. small check against the float64 NumPy reference
        small_case, small_arrays = batch_slice(case, arrays, min(case.batch, self.check_batch))
        reference = numpy_reference(small_case, small_arrays)
        passed = []
        for engine in candidates:
            try:
                out = engine.to_host(small_case, engine.prepare(small_case, dtype, small_arrays)())
            except Exception as exc:
                results[engine.name] = dict(status="error", note=f"{type(exc).__name__}: {exc}")
                continue
            verdict = check.against_reference({engine.name: out}, reference, tolerance)[engine.name]
            if not verdict.ok:
                results[engine.name] = dict(status="mismatch", error=verdict.error,
                                            note=f"batch {small_case.batch}: {verdict.note}")
            else:
                results[engine.name] = dict(status="ok", reference_error=verdict.error)
                passed.append(engine)

        # 2. full size: run once, compare the engines with each other
        runs, full = {}, {}
        for engine in passed:
            try:
                fn = engine.prepare(case, dtype, arrays)
                full[engine.name] = engine.to_host(case, fn())
                runs[engine.name] = fn
            except Exception as exc:
                results[engine.name] = dict(status="error", note=f"{type(exc).__name__}: {exc}")
        if full:
            verdicts, pairwise = check.by_vote(full, tolerance)
            row["pairwise"] = pairwise
            for name, verdict in verdicts.items():
                if not verdict.ok:
                    results[name] = dict(status="mismatch", error=verdict.error, note=verdict.note)
                    runs.pop(name)
                elif verdict.note:
                    results[name]["note"] = verdict.note
        del full

        # 3. time what passed
        for engine in passed:
            fn = runs.get(engine.name)
            if fn is None:
                continue
            try:
                seconds = self.timer(engine, fn, self.settings)
            except Exception as exc:
                results[engine.name] = dict(status="error", note=f"while timing: {type(exc).__name__}: {exc}")
                continue
            results[engine.name].update(time_ms=seconds * 1e3, timer=engine.timer,
                                        **metrics.throughput(case, work, traffic, seconds, dtype, self.peaks,
                                                             self.allow_tf32))
        runs.clear()
        for engine in candidates:
            try:
                engine.release()
            except Exception:
                pass
        row["speedups"] = speedups(row, GPU_SPEEDUPS if self.mode == "gpu" else CPU_SPEEDUPS)
        return row


def speedups(row: dict, pairs) -> dict[str, float]:
    """``{"A/B": time_B / time_A}`` for each pair where both engines were timed (>1: A faster)."""
    out = {}
    for a, b in pairs:
        ta = row["engines"].get(a, {}).get("time_ms")
        tb = row["engines"].get(b, {}).get("time_ms")
        if ta and tb:
            out[f"{a} vs {b}"] = tb / ta
    return out


def selected(suites: list[str], dtypes: list[str] | None) -> list[tuple[Case, str]]:
    items = []
    for name in expand(suites):
        for case in suite(name):
            for dtype in case.dtypes:
                if dtypes is None or dtype in dtypes:
                    items.append((case, dtype))
    return items


def run(suites: list[str], dtypes: list[str] | None = None, mode: str = "auto", engines: list[str] | None = None,
        settings: TimingSettings = TimingSettings(), allow_tf32: bool = False, deterministic: bool = True,
        seed: int = 0, progress: bool = True, engine_list: list[Engine] | None = None,
        peaks: metrics.Peaks | None = None, timer: Callable | None = None, predictions: Path | None = None,
        time_limit: float | None = None) -> dict:
    """Run the suites and return the report: ``{"meta": ..., "rows": [...], "summary": ...}``.

    ``mode`` "gpu" times gradops' GPU backends against PyTorch and JAX; "cpu" times the NumPy
    backend against tensorflow-cpu; "auto" picks gpu when CuPy sees a device.  ``engines``
    keeps only the named engines; ``engine_list`` replaces them (tests use fake engines).
    ``peaks`` overrides the device's peak table entry (an unlisted GPU); ``timer(engine, fn,
    settings) -> seconds`` replaces the timers (tests).  In GPU mode each row gets the static
    report's prediction for the device (``predictions``: its JSON, default
    benchmarks/results/static_report.json of the checkout) when it has one.  ``time_limit``
    (seconds): start no new case after that long; the report says how many cases it skipped.
    """
    from . import report
    from .._options import options

    if mode == "auto":
        mode = "gpu" if gpu_present() else "cpu"
    if mode not in ("gpu", "cpu"):
        raise ValueError(f"mode must be auto, gpu or cpu; got {mode!r}")
    meta = _cpu_meta()
    meta.update(mode=mode, suites=expand(suites), dtypes=dtypes, seed=seed, allow_tf32=allow_tf32,
                deterministic=deterministic, check_batch=CHECK_BATCH, tolerance=check.TOLERANCE,
                timing=dict(warmup=settings.warmup, repeats=settings.repeats, min_seconds=settings.min_seconds,
                            max_repeats=settings.max_repeats, statistic="median"))
    stream = None
    if mode == "gpu" and engine_list is None:
        import cupy

        meta.update(_gpu_meta())
        peaks = peaks or metrics.peaks_for(meta["device"])
        # One non-default stream for every engine that CUDA events time (see timing.cuda_events).
        stream = cupy.cuda.Stream(non_blocking=True)
        stream.use()
        from .engines import GradopsGpuEngine, gpu_engines

        engine_list = gpu_engines(allow_tf32, deterministic, stream.ptr)
        # gradops-cuda:PATH: the depthwise input gradient with its kernel path forced, or the filter
        # gradient's tiled kernel with its staging forced (A/B timings)
        engine_list += [GradopsGpuEngine("cuda", path=name.split(":", 1)[1]) for name in engines or ()
                        if name.startswith("gradops-cuda:")]
    elif engine_list is None:
        from .engines import cpu_engines

        engine_list = cpu_engines()
    if engines:
        unknown = set(engines) - {e.name for e in engine_list}
        if unknown:
            raise ValueError(f"unknown engine(s) {', '.join(sorted(unknown))}; "
                             f"{mode} mode has {', '.join(e.name for e in engine_list)}")
        engine_list = [e for e in engine_list if e.name in engines]
    meta["peaks"] = None if peaks is None else dict(peaks.__dict__)
    if mode == "gpu" and peaks is None:
        meta["peaks_note"] = f"no peak table entry for {meta.get('device')!r}: % of peak not reported"

    items = selected(suites, dtypes)
    rows = []
    with options(allow_tf32=allow_tf32, deterministic=deterministic):
        runner = Runner(engine_list, mode, settings, allow_tf32, peaks, seed, timer=timer)
        meta["engines"] = {name: dict(available=ok, reason=reason) for name, (ok, reason) in runner.status.items()}
        for engine in engine_list:
            if runner.status[engine.name][0]:
                try:
                    meta.update(engine.versions())
                except Exception:
                    pass
        meta["timers"] = {e.name: e.timer for e in engine_list}
        started = time.monotonic()
        with _progress(progress, len(items)) as advance:
            for case, dtype in items:
                if time_limit is not None and time.monotonic() - started > time_limit:
                    meta["stopped_early"] = (f"time limit {time_limit:g} s reached: {len(items) - len(rows)} of "
                                             f"{len(items)} cases not run")
                    break
                advance(f"{case.suite}: {case.label} {case.op} {dtype}")
                rows.append(runner.run_case(case, dtype))
            advance(None)
    if stream is not None:
        stream.synchronize()
    result = dict(meta=meta, rows=rows, summary=report.summarize(rows))
    if mode == "gpu":
        from . import static_report

        path = Path(predictions) if predictions else static_report.default_path()
        try:
            report.attach_predictions(result, static_report.load_predictions(path), str(path))
        except (OSError, ValueError, KeyError) as exc:  # a damaged file must not lose the measurements
            meta["predicted_error"] = f"{path}: {type(exc).__name__}: {exc}"
    return result


class _progress:
    """A rich progress bar on stderr (nothing when disabled); ``advance(text)`` moves it on."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self._bar = self._task = None
        self._started = False

    def __enter__(self):
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=Console(stderr=True))
            self._bar.start()
            self._task = self._bar.add_task("bench", total=self.total)
        return self._advance

    def _advance(self, text: str | None):
        if self._bar is None:
            return
        if self._started:
            self._bar.advance(self._task)
        self._started = True
        if text is not None:
            self._bar.update(self._task, description=text[:70])

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.stop()
        return False


def geomean(values) -> float | None:
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None
