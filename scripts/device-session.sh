#!/usr/bin/env bash
# One lent-GPU session (the `device` tool), prepared to fit its 15 minutes: warm the kernel cache,
# GPU tests beside compute-sanitizer memcheck and racecheck, then Nsight Compute kernel times of
# the memory-bound suites.  Every step has its own time cap; the results go to $OUT/results.tgz.
# Needs the carried wheels in .whl/ (../shared/device/wheels.sh "nvidia-cuda-crt==13.0.88").
set -u
OUT="${OUT:-/tmp/out}"
W=/tmp/w
mkdir -p "$W" "$OUT"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export GRADOPS_KERNEL_CACHE_DIR=/tmp/kc GRADOPS_COMMIT="${GRADOPS_COMMIT:-unknown}"
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
NCU="$(command -v ncu || echo ncu)"
{
    stamp "commit $GRADOPS_COMMIT"
    nvidia-smi
    nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,memory.total --format=csv
    "$SAN" --version | tail -1
    "$NCU" --version | tail -1
    python3 -m gradops info
} >"$W/info.log" 2>&1
stamp "info done"

# Sanitizers run single-process (workers under memcheck outran their limits before) with
# CuPy's pool off, so a stray access hits unallocated memory; SIGINT lets pytest write its junit.
sanitize() { # sanitize TOOL CAP TESTS...
    local tool=$1 cap=$2
    shift 2
    (cd /tmp && PYTEST_ADDOPTS="" "$SAN" --tool "$tool" --report-api-errors no --target-processes all \
        timeout -s INT -k 15 "$cap" python3 -m pytest -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
        -p no:cacheprovider -p pytest_cupy_no_pool -q -m "gpu and not slow" \
        --junitxml "$W/$tool.junit.xml" "${@/#/$OLDPWD/}") >"$W/$tool.log" 2>&1
    echo "exit $?" >>"$W/$tool.log"
}
export PYTHONPATH="$PWD/scripts:$PYTHONPATH"
timeout 100 python3 scripts/warm_kernel_cache.py --jobs 14 >"$W/warm.log" 2>&1 &
WARM=$!
sanitize memcheck 250 tests/test_advisories.py tests/test_nan_inf.py \
    tests/test_depthwise_conv2d_native_backprop_filter.py tests/test_fractional_max_pool_grad.py &
sanitize racecheck 250 tests/test_depthwise_conv2d_native_backprop_filter.py \
    tests/test_fractional_max_pool_grad.py tests/test_fractional_avg_pool_grad.py \
    tests/test_depthwise_conv2d_native_backprop_input.py &
wait $WARM
stamp "warm: $(tail -1 "$W/warm.log")"

# gpu-ci.sh's gpu-tests step, with pytest itself under the time cap (SIGINT: junit still written).
(cd /tmp && PYTEST_ADDOPTS="" timeout -s INT -k 30 200 python3 -m pytest -c "$OLDPWD/pyproject.toml" \
    --rootdir "$OLDPWD" -p no:cacheprovider -n 14 -q -m "gpu and not slow" \
    --junitxml "$W/gpu-tests.junit.xml" "$OLDPWD/tests") >"$W/gpu-tests.log" 2>&1
echo "exit $?" >>"$W/gpu-tests.log"
python3 scripts/junit_gate.py "$W/gpu-tests.junit.xml" --label gpu-tests --no-skips \
    --allow-skip "^needs two GPUs" --min-passed 1 >>"$W/gpu-tests.log" 2>&1
stamp "gpu tests: $(grep -E 'passed|failed' "$W/gpu-tests.log" | tail -2 | tr '\n' ' ')"
wait
pkill -9 -f "python3 -m pytest" 2>/dev/null; sleep 1  # nothing else on the GPU while ncu times
stamp "sanitizers: $(tail -3 "$W/memcheck.log" | tr '\n' ' ') | $(tail -3 "$W/racecheck.log" | tr '\n' ' ')"

timeout -s INT -k 10 200 "$NCU" --profile-from-start off --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_index.json" --suites fractional,mobilenetv2,efficientnet --time-limit 150 \
    >"$W/ncu.csv" 2>"$W/ncu.err"
stamp "ncu: $(tail -1 "$W/ncu.err")"
python3 benchmarks/ncu_table.py "$W/ncu.csv" "$W/ncu_index.json" --bandwidth 4.8e12 --summary 2>&1 | tee "$W/ncu_summary.md"
# cuDNN (grouped convolution through the frontend) on the same cases, in what time is left.
left=$((440 - $(date +%s) + T0))
if [ "$left" -gt 30 ]; then
    timeout -s INT -k 10 $((left + 40)) "$NCU" --profile-from-start off --clock-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        python3 benchmarks/ncu_cases.py '' "$W/ncu_cudnn_index.json" --suites mobilenetv2,efficientnet \
        --engines gradops-cudnn --time-limit "$left" >"$W/ncu_cudnn.csv" 2>"$W/ncu_cudnn.err"
    stamp "ncu cudnn: $(tail -1 "$W/ncu_cudnn.err")"
fi
stamp "done"
cp "$W/info.log" "$W/ncu_summary.md" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$W" --exclude=kc .
