"""Compile every kernel instantiation the current GPU can run into gradops' on-disk kernel cache,
in parallel processes, so that a test or benchmark session does not compile them one at a time.

    python scripts/warm_kernel_cache.py [--jobs N] [--source FILE.cu ...]

Uses the runtime's own path (``_runtime.kernel``: CuPy's NVRTC step, the cache key, the load), so
what it caches is exactly what a call would compile.  ``GRADOPS_KERNEL_CACHE_DIR`` picks the cache.
Prints one line per source: kernels compiled, failures, seconds.  Exit status 1 if any failed.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor


def _compile(item):
    filename, expression = item
    from gradops.backends.cuda import _runtime

    start = time.perf_counter()
    try:
        _runtime.kernel(filename, expression)
        return filename, expression, time.perf_counter() - start, None
    except Exception as exc:  # reported, never hidden: the caller counts and prints failures
        return filename, expression, time.perf_counter() - start, f"{type(exc).__name__}: {exc}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--source", action="append", help="only these cuda_src files")
    args = parser.parse_args()

    from gradops.backends.cuda import _build, _runtime

    arch = _runtime.compute_capability()
    items = [(f, e) for f, exprs in _build.all_instantiations(arch).items()
             if not args.source or f in args.source for e in exprs]
    # The convolution sources compile slowest: start them first so no worker is left with a tail.
    items.sort(key=lambda item: not item[0].startswith("conv2d"))
    print(f"sm_{arch}: {len(items)} instantiations, {args.jobs} processes, cache {_runtime.cache_dir()}",
          flush=True)
    start = time.perf_counter()
    done, failed, seconds = Counter(), Counter(), Counter()
    context = multiprocessing.get_context("spawn")  # CUDA contexts do not survive fork
    with ProcessPoolExecutor(args.jobs, mp_context=context) as pool:
        for filename, expression, took, error in pool.map(_compile, items):
            done[filename] += 1
            seconds[filename] += took
            if error:
                failed[filename] += 1
                print(f"FAILED {filename} {expression}: {error}", flush=True)
    for filename in done:
        print(f"{filename}: {done[filename]} kernels, {failed[filename]} failed, "
              f"{seconds[filename]:.0f} s of compile", flush=True)
    print(f"total {sum(done.values())} kernels, {sum(failed.values())} failed, "
          f"{time.perf_counter() - start:.0f} s wall", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
