#!/usr/bin/env bash
# GPU CI: the one entry point, in the container (its default command) or from a checkout on
# a GPU machine.  Steps, each logged to $GRADOPS_ARTIFACTS/<step>.log:
#   info       python -m gradops info (+ nvidia-smi)
#   cpu-tests  pytest -m "not gpu"
#   gpu-tests  pytest -m gpu, FAILING if any GPU test was skipped or none passed: on a GPU
#              runner a skip means a broken setup (no GPU in the container, CuPy missing)
#   sanitizer  compute-sanitizer memcheck over a small GPU subset (same no-skip rule)
#   bench      python -m gradops bench --mode gpu --suite smoke, report kept as an artifact
# Every step runs even when an earlier one failed (all artifacts are produced); the exit
# status is 1 if any step failed.  Environment (all optional):
#   GRADOPS_ARTIFACTS            output dir (default: <checkout>/build/ci-artifacts)
#   GRADOPS_CI_STEPS             comma-separated subset of the steps above (default: all)
#   GRADOPS_CI_MARKEXPR          extra pytest marker restriction, e.g. "not slow" (default: none)
#   GRADOPS_CI_ALLOWED_GPU_SKIPS regex of skip reasons tolerated in the GPU runs (default: the
#                                two-GPU tests on a one-GPU runner, "needs two GPUs")
#   GRADOPS_CI_SANITIZER         "require" (default: fail when compute-sanitizer is absent)
#                                or "skip" (warn and skip the step, e.g. on a bare checkout)
#   GRADOPS_CI_SANITIZER_TESTS   pytest paths (relative to the checkout) for the memcheck pass
#                                (default: tests/test_advisories.py tests/test_nan_inf.py)
#   GRADOPS_CI_SANITIZER_TIMEOUT seconds (default: 1800)
#   GRADOPS_CI_BENCH_SUITE       benchmark suite (default: smoke)
#   PYTHON                       interpreter with gradops installed (default: python3)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
ARTIFACTS="${GRADOPS_ARTIFACTS:-$ROOT/build/ci-artifacts}"
STEPS="${GRADOPS_CI_STEPS:-info,cpu-tests,gpu-tests,sanitizer,bench}"
MARKEXPR="${GRADOPS_CI_MARKEXPR:-}"
ALLOWED_GPU_SKIPS="${GRADOPS_CI_ALLOWED_GPU_SKIPS-^needs two GPUs}"
SANITIZER_MODE="${GRADOPS_CI_SANITIZER:-require}"
# Small tensors through every kernel: the advisories' edge cases (empty, degenerate, hostile
# shapes) and the NaN/Inf propagation grid.
SANITIZER_TESTS="${GRADOPS_CI_SANITIZER_TESTS:-tests/test_advisories.py tests/test_nan_inf.py}"
SANITIZER_TIMEOUT="${GRADOPS_CI_SANITIZER_TIMEOUT:-1800}"
BENCH_SUITE="${GRADOPS_CI_BENCH_SUITE:-smoke}"
# compute-sanitizer's exit status when it reports errors: distinct from pytest's 0-5 and
# from timeout's 124, so the log can say which of them failed.
SANITIZER_ERROR_EXIT=86
TIMEOUT_EXIT=124
# The sanitizer step's status for "skipped on request": not one pytest (0-5) or timeout uses.
STEP_SKIPPED_EXIT=78

case "$SANITIZER_MODE" in require | skip) ;; *)
    echo "gpu-ci: GRADOPS_CI_SANITIZER must be 'require' or 'skip', not '$SANITIZER_MODE'" >&2
    exit 2 ;;
esac
for step in ${STEPS//,/ }; do
    case "$step" in info | cpu-tests | gpu-tests | sanitizer | bench) ;; *)
        echo "gpu-ci: unknown step '$step' in GRADOPS_CI_STEPS" >&2
        exit 2 ;;
    esac
done

mkdir -p "$ARTIFACTS" || exit 2
ARTIFACTS="$(cd "$ARTIFACTS" && pwd)"
# Writable state (pytest's cwd, where hypothesis keeps its database; CuPy's kernel cache when
# $HOME is not writable) goes to a scratch dir: the image's checkout is read-only and the
# container may run under the host runner's uid, which has no home directory.
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gradops-ci.XXXXXX")" || exit 2
trap 'rm -rf "$SCRATCH"' EXIT
if [ ! -w "${HOME:-/}" ]; then
    export HOME="$SCRATCH/home"
    mkdir -p "$HOME"
fi
export PYTHONPATH="$ROOT/scripts${PYTHONPATH:+:$PYTHONPATH}"
if [ -f "$ROOT/gradops/__init__.py" ]; then
    # A checkout: test its sources, as `python -m pytest` from the root would.
    export PYTHONPATH="$ROOT:$PYTHONPATH"
fi
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-3}"

markexpr() { # markexpr BASE: BASE restricted by GRADOPS_CI_MARKEXPR
    if [ -n "$MARKEXPR" ]; then echo "($1) and ($MARKEXPR)"; else echo "$1"; fi
}

pytest_run() { # pytest_run NAME PYTEST-ARGS...: junit report in $ARTIFACTS/NAME.junit.xml
    local name="$1"
    shift
    (cd "$SCRATCH" && "$PYTHON" -m pytest -c "$ROOT/pyproject.toml" --rootdir "$ROOT" \
        -p no:cacheprovider --junitxml "$ARTIFACTS/$name.junit.xml" "$@")
}

gate_gpu() { # gate_gpu NAME: no skipped GPU test, at least one passed
    "$PYTHON" "$ROOT/scripts/junit_gate.py" "$ARTIFACTS/$1.junit.xml" --label "$1" \
        --no-skips --allow-skip "$ALLOWED_GPU_SKIPS" --min-passed 1
}

find_sanitizer() {
    local candidate
    for candidate in "$(command -v compute-sanitizer || true)" \
        "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
        /usr/local/cuda/bin/compute-sanitizer \
        /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

step_info() {
    echo "commit: ${GRADOPS_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi || true
    else
        echo "nvidia-smi: not found"
    fi
    echo "compute-sanitizer: $(find_sanitizer || echo 'not found')"
    "$PYTHON" -m gradops info
}

step_cpu_tests() {
    pytest_run cpu-tests -m "$(markexpr "not gpu")" "$ROOT/tests"
}

step_gpu_tests() {
    local status=0
    pytest_run gpu-tests -m "$(markexpr gpu)" "$ROOT/tests" || status=$?
    gate_gpu gpu-tests || status=1
    return "$status"
}

step_sanitizer() {
    local sanitizer status=0 paths=()
    if ! sanitizer="$(find_sanitizer)"; then
        if [ "$SANITIZER_MODE" = skip ]; then
            echo "WARNING: compute-sanitizer not found; memcheck pass skipped (GRADOPS_CI_SANITIZER=skip)"
            return "$STEP_SKIPPED_EXIT"
        fi
        echo "compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda): install the"
        echo "toolkit's cuda-sanitizer-<major>-<minor> package, or set GRADOPS_CI_SANITIZER=skip"
        return 1
    fi
    "$sanitizer" --version
    for path in $SANITIZER_TESTS; do paths+=("$ROOT/$path"); done
    # --report-api-errors no: memcheck's job here is memory accesses.  CUDA API errors are
    # raised as exceptions by CuPy anyway, and the driver-symbol probes of NVIDIA's own Python
    # bindings (cuGetProcAddress with names this driver lacks) would otherwise count as 34
    # errors of a clean run (seen on an H100, driver 580, CuPy 14.2).
    # PYTEST_ADDOPTS is cleared: parallel workers (-n) under memcheck outran a 150 s limit on
    # an H100 where one process took 6 s.
    PYTEST_ADDOPTS="" timeout "$SANITIZER_TIMEOUT" "$sanitizer" --tool memcheck --error-exitcode "$SANITIZER_ERROR_EXIT" \
        --report-api-errors no \
        --target-processes all \
        "$PYTHON" -m pytest -c "$ROOT/pyproject.toml" --rootdir "$ROOT" -p no:cacheprovider \
        -p pytest_cupy_no_pool --junitxml "$ARTIFACTS/sanitizer.junit.xml" \
        -m "$(markexpr gpu)" "${paths[@]}" || status=$?
    case "$status" in
        0) ;;
        "$SANITIZER_ERROR_EXIT") echo "gpu-ci: compute-sanitizer memcheck reported errors (above)" ;;
        "$TIMEOUT_EXIT") echo "gpu-ci: memcheck pass timed out after ${SANITIZER_TIMEOUT}s" ;;
        *) echo "gpu-ci: memcheck pass: pytest exited with status $status" ;;
    esac
    gate_gpu sanitizer || status=1
    return "$status"
}

step_bench() {
    local out="$ARTIFACTS/bench" plot=()
    if ! "$PYTHON" -m gradops bench --help >/dev/null 2>&1; then
        echo "gpu-ci: this gradops has no 'python -m gradops bench' command"
        return 1
    fi
    # The PNG needs matplotlib, which the image does not install; the .json/.md need nothing.
    "$PYTHON" -c "import matplotlib" 2>/dev/null || plot=(--no-plot)
    # --mode gpu: a GPU runner that cannot see its GPU must fail here, not time the CPU.
    "$PYTHON" -m gradops bench --mode gpu --suite "$BENCH_SUITE" --out "$out" --no-progress \
        "${plot[@]}" || return $?
    if [ -z "$(ls -A "$out" 2>/dev/null)" ]; then
        echo "gpu-ci: the benchmark wrote no report under $out"
        return 1
    fi
    ls -l "$out"
}

run_step() {
    case "$1" in
        info) step_info ;;
        cpu-tests) step_cpu_tests ;;
        gpu-tests) step_gpu_tests ;;
        sanitizer) step_sanitizer ;;
        bench) step_bench ;;
    esac
}

failed=0
summary="$ARTIFACTS/summary.txt"
echo "gradops GPU CI: $(date -u +%Y-%m-%dT%H:%M:%SZ), artifacts in $ARTIFACTS" >"$summary"
for step in ${STEPS//,/ }; do
    echo "===== gpu-ci: $step"
    run_step "$step" 2>&1 | tee "$ARTIFACTS/$step.log"
    status=${PIPESTATUS[0]}
    if [ "$status" = 0 ]; then
        result=PASS
    elif [ "$step" = sanitizer ] && [ "$status" = "$STEP_SKIPPED_EXIT" ]; then
        result="SKIPPED (warning: GRADOPS_CI_SANITIZER=skip)"
    else
        result="FAIL (status $status)"
        failed=1
    fi
    printf '%-10s %s\n' "$step" "$result" | tee -a "$summary"
done
echo "===== gpu-ci summary"
cat "$summary"
exit "$failed"
