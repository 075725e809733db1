#!/usr/bin/env bash
# Second call: the tensor-core dW hang, the tests the first call did not finish, EfficientNet under ncu.
set -u
W=/tmp/w; mkdir -p "$W" "$OUT"; T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD:$PWD/scripts" PYTHONUNBUFFERED=1 GRADOPS_KERNEL_CACHE_DIR=/tmp/kc GRADOPS_COMMIT="${GRADOPS_COMMIT:-unknown}"
timeout 60 python3 scripts/warm_kernel_cache.py --jobs 16 >"$W/warm.log" 2>&1
stamp "warm: $(tail -1 "$W/warm.log")"
timeout 80 python3 .gpu/diag_mma.py >"$W/diag_mma.log" 2>&1
stamp "diag done"; cat "$W/diag_mma.log"
pkill -9 -f diag_one 2>/dev/null
mapfile -t TESTS < .gpu/tests.txt
(cd /tmp && timeout -s INT -k 15 90 python3 -m pytest -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
    -p no:cacheprovider -n 12 -q -m "gpu and not slow" --timeout 40 --timeout-method thread \
    --junitxml "$W/rerun.junit.xml" "${TESTS[@]/#/$OLDPWD/}") >"$W/rerun.log" 2>&1
echo "exit $?" >>"$W/rerun.log"
stamp "rerun: $(grep -E 'passed|failed' "$W/rerun.log" | tail -1)"
pkill -9 -f "python3 -m pytest" 2>/dev/null; sleep 1
left=$((250 - $(date +%s) + T0))
timeout -s INT -k 10 $((left + 40)) ncu --profile-from-start off --clock-control none --csv \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_eff_index.json" --suites efficientnet --time-limit "$left" \
    >"$W/ncu_eff.csv" 2>"$W/ncu_eff.err"
stamp "ncu: $(tail -1 "$W/ncu_eff.err")"
python3 benchmarks/ncu_table.py "$W/ncu_eff.csv" "$W/ncu_eff_index.json" --bandwidth 4.8e12 --summary 2>&1 | tail -12
tar czf "$OUT/results2.tgz" -C "$W" .
stamp done
