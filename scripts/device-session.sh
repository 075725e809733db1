#!/usr/bin/env bash
# One lent-GPU session (the `device` tool), prepared to fit its 15 minutes (one call of about
# 8 minutes plus a machine start): warm the kernel cache, GPU tests beside compute-sanitizer
# memcheck and racecheck, Nsight Compute A/Bs of the input gradient's NCHW kernels (tiled
# against planes and the transpose path) and of the fractional pooling gradients' (launcher's against cells), ncu's full sections (stall reasons, occupancy) for a few representative
# kernels, then Nsight Compute kernel times of the input gradient on the launcher beside gradops'
# cuDNN path (the default for GPU arrays; never timed) and PyTorch.  Every step has its
# own time cap, and a hung kernel fails its test (pytest-timeout) instead of stalling a worker:
# the H200 run of 2026-11-28 lost 35 tests and both sanitizers to one hang.  Results go to
# $OUT/results.tgz.  Needs the carried wheels in .whl/ (../shared/device/wheels.sh
# "nvidia-cuda-crt==13.0.88").  Environment: GRADOPS_COMMIT (recorded), SESSION_NCU_ENGINES
# (the last step's engines, default gradops-cuda,gradops-cudnn,torch).
set -u
OUT="${OUT:-/tmp/out}"
W=/tmp/w
mkdir -p "$W" "$OUT"
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH="/tmp/site:$PWD:$PWD/scripts" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export GRADOPS_KERNEL_CACHE_DIR=/tmp/kc GRADOPS_COMMIT="${GRADOPS_COMMIT:-unknown}"
SAN="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
NCU="$(command -v ncu || echo ncu)"
ENGINES="${SESSION_NCU_ENGINES:-gradops-cuda,gradops-cudnn,torch}"
# A test whose kernel hangs is failed after this many seconds (its worker is replaced).
TIMEOUT=()
python3 -c "import pytest_timeout" 2>/dev/null && TIMEOUT=(--timeout 60 --timeout-method thread)
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
sanitize() { # sanitize TOOL[:NAME] CAP KEYWORDS TESTS... (KEYWORDS: a pytest -k expression, or "")
    local tool=${1%%:*} name=${1#*:} cap=$2 select=()
    [ -n "$3" ] && select=(-k "$3")
    shift 3
    (cd /tmp && PYTEST_ADDOPTS="" "$SAN" --tool "$tool" --report-api-errors no --target-processes all \
        timeout -s INT -k 15 "$cap" python3 -m pytest -c "$OLDPWD/pyproject.toml" --rootdir "$OLDPWD" \
        -p no:cacheprovider -p pytest_cupy_no_pool -q -m "gpu and not slow" "${select[@]}" "${TIMEOUT[@]}" \
        --junitxml "$W/$name.junit.xml" "${@/#/$OLDPWD/}") >"$W/$name.log" 2>&1
    echo "exit $?" >>"$W/$name.log"
}
timeout 100 python3 scripts/warm_kernel_cache.py --jobs 14 >"$W/warm.log" 2>&1 &
WARM=$!
sanitize memcheck 260 "" tests/test_advisories.py tests/test_nan_inf.py \
    tests/test_depthwise_conv2d_native_backprop_filter.py tests/test_fractional_max_pool_grad.py &
# memcheck on the input gradient's planes kernel and transpose path and the fractional pooling
# gradients' cells kernels (new since the last GPU run; the fractional tests run them beside the
# launchers' kernels), then the forward poolings' kernel (new in session 65) over every kind of
# sequence in float32 (28 tests, last: what the cap leaves).
sanitize memcheck:memcheck-planes 200 \
    "planes or mma or transpose or cuda_generated or cuda_hand_written or cells or (cuda_matches_numpy_bit_for_bit and float32)" \
    tests/test_depthwise_conv2d_native_backprop_input.py tests/test_fractional_avg_pool_grad.py \
    tests/test_fractional_pool.py &
# racecheck on the filter gradient's asynchronous staging (cp.async into shared memory and its
# barriers, new since the last GPU run) and the overlapping fractional max pooling cells kernel
# (neighbours' choices through shared memory, a barrier a cell row; new in session 40; the
# "capped_grids" cases stride blocks, where the barrier after a chunk's last row matters), whose
# tests the run over whole files may not reach; one more process only (the GPU tests share the
# GPU and 16 cores with the sanitizers).
sanitize racecheck:racecheck-async 150 "async or (cells_kernel and overlapping) or overlapping_sum_order" \
    tests/test_depthwise_conv2d_native_backprop_filter.py tests/test_fractional_max_pool_grad.py &
# racecheck: the kernels that share memory between threads (tiles, stages, tensor cores).
sanitize racecheck 260 "tiled or mma or planes or staged or select or transpose_path_is" \
    tests/test_depthwise_conv2d_native_backprop_filter.py tests/test_fractional_max_pool_grad.py \
    tests/test_fractional_avg_pool_grad.py tests/test_depthwise_conv2d_native_backprop_input.py &
wait $WARM
stamp "warm: $(tail -1 "$W/warm.log")"

# gpu-ci.sh's gpu-tests step, with pytest itself under the time cap (SIGINT: junit still written).
(cd /tmp && PYTEST_ADDOPTS="" timeout -s INT -k 30 240 python3 -m pytest -c "$OLDPWD/pyproject.toml" \
    --rootdir "$OLDPWD" -p no:cacheprovider -n 14 -q -m "gpu and not slow" "${TIMEOUT[@]}" \
    --junitxml "$W/gpu-tests.junit.xml" "$OLDPWD/tests") >"$W/gpu-tests.log" 2>&1
echo "exit $?" >>"$W/gpu-tests.log"
# The device image has no TensorFlow (its CPU wheel is far over the 64 MiB a call may carry; 1.3 GB
# installed), so the TF parity tests' GPU cases skip there; the GPU CI image (Dockerfile: the
# test extra) has it.
python3 scripts/junit_gate.py "$W/gpu-tests.junit.xml" --label gpu-tests --no-skips \
    --allow-skip "^needs two GPUs|^could not import 'tensorflow'" --min-passed 1 >>"$W/gpu-tests.log" 2>&1
stamp "gpu tests: $(grep -E 'passed|failed' "$W/gpu-tests.log" | tail -2 | tr '\n' ' ')"
wait
pkill -9 -f "python3 -m pytest" 2>/dev/null
sleep 1 # nothing else on the GPU while ncu times
stamp "sanitizers: $(tail -3 "$W/memcheck.log" | tr '\n' ' ') | $(tail -3 "$W/racecheck.log" | tr '\n' ' ')"
stamp "racecheck (async): $(tail -2 "$W/racecheck-async.log" | tr '\n' ' ')"

# The global store sectors too (session 82): the planes input-gradient kernel's result stores on
# maps of 14 or 7 columns write 4-13 bytes a sector by the static count
# (benchmarks/results/planes_store_sectors.md), 32 on the wide maps; ncu_table.py shows result
# bytes / store sectors beside each call.
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
# The summaries' % of HBM at this GPU's datasheet bandwidth (the H100 run of 2026-12-05 was
# summarised at the H200's 4.8 TB/s, which this script had written in; 4.8e12 if unknown).
BW=$(python3 -c "import cupy; from gradops.bench.metrics import peaks_for; p = peaks_for(cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()); print(p.bandwidth if p else 4.8e12)" 2>/dev/null || echo 4.8e12)
stamp "HBM bandwidth for the summaries: $BW bytes/s"
# The steps below fit what is left of a call of about 540 s after the tests (at most about
# 340 s): A/B (170 + 70), the planes kernel's shared-memory counters (40), the full sections
# (100), then kernel times in the rest: the filter gradient's launcher, then the input
# gradient's engines.
# A/B first: the NCHW input-gradient cases (stride 1, and stride 2 at multipliers 1 and 2) on the
# launcher's choice, the tiled kernel, the planes kernel, the transpose path and the tensor-core
# kernel (engines gradops-cuda, gradops-cuda:tiled, gradops-cuda:planes_direct, gradops-cuda:transpose:
# NCHW as NHWC between two batched transposes, 3 kernels a call; gradops-cuda:mma, half types
# only, skipped elsewhere), whose defaults this measurement decides (PLANES_BY_DEFAULT since
# session 46, and MMA_CHOICE and its siblings, read off the latency-aware estimate:
# benchmarks/results/path_estimates.md; TRANSPOSE_BY_DEFAULT, opt-in); about 230 calls, 52 of them of 3 kernels, at the 2.2 a
# second of the last run (40 s more than before: 20 from the full sections' cap, 20 from the
# filter gradient's timing at the end).  Then the NHWC stride-1 multiplier-2 cases and 5x5
# multiplier 1 on the launcher's choice, the tiled kernel and the NHWC tensor-core kernel
# (gradops-cuda:mma_nhwc, half types only; MMA_NHWC_CHOICE, new in session 53): about 50 calls
# more, 20 s taken from the filter gradient's timing.  The planes kernel's two result-store forms
# forced (gradops-cuda:planes_direct, gradops-cuda:planes_staged; stride 2 only, 6 layers a
# dtype): the H100 of 2026-12-06 decided PLANES_STAGED_BY_DEFAULT (results/gpu_h100_2026-12-06,
# stride2_ab.md), and this keeps the rule measured where "planes" is now the launcher's form.  The
# tensor-core kernel's runs form (gradops-cuda:mma_runs) is no longer timed: the same run
# measured it level or slower than the pair stores (MMA_RUNS_BY_DEFAULT).  Stride 2 at
# multiplier 2 too (about 40 calls: the runs form's 14, the rest from the last step's time):
# the staged-form rule there rests on MobileNetV2 alone (stride2_ab.md), EfficientNet's
# 5x5 multiplier-2 layers were never timed, and the 2026-12-06 A/B finished inside its limit.
timeout -s INT -k 10 170 "$NCU" --profile-from-start off --clock-control none --csv --metrics "$METRICS" \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_ab_index.json" --suites mobilenetv2,efficientnet \
    --engines gradops-cuda --paths tiled,planes_direct,planes_staged,transpose,mma,mma_nhwc --ops backprop_input \
    --labels "3x3/1 m1 NCHW,3x3/1 m2 NCHW,5x5/1 m1 NCHW,5x5/1 m2 NCHW,3x3/2 m1 NCHW,5x5/2 m1 NCHW,3x3/2 m2 NCHW,5x5/2 m2 NCHW,3x3/1 m2 NHWC,5x5/1 m2 NHWC,5x5/1 m1 NHWC" --time-limit 150 \
    >"$W/ncu_ab.csv" 2>"$W/ncu_ab.err"
stamp "ncu A/B: $(tail -1 "$W/ncu_ab.err")"
python3 benchmarks/ncu_table.py "$W/ncu_ab.csv" "$W/ncu_ab_index.json" --bandwidth "$BW" >"$W/ncu_ab.md" 2>&1
python3 benchmarks/ncu_table.py "$W/ncu_ab.csv" "$W/ncu_ab_index.json" --bandwidth "$BW" --summary 2>&1 \
    | tee "$W/ncu_ab_summary.md"

# The planes input-gradient kernel's shared-memory traffic (its measured limiter: L1/TEX at 86%
# on the H200): instructions, wavefronts and bank conflicts of its loads and stores, forced on
# the NCHW 3x3/1 m1 layers of 112 / 56 / 28 / 14 columns, float16 and float32, 8 calls.  The H100
# run of 2026-12-05 (run 2, one image of 32 channels) counted stores at 2.7-5.1 wavefronts per
# one needed; session 80's 16-byte staging stores aim at 1.6-2 (the execution model's count).
timeout -s INT -k 10 40 "$NCU" --profile-from-start off --clock-control none --csv \
    --metrics smsp__sass_inst_executed_op_shared_ld.sum,smsp__sass_inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,gpu__time_duration.sum \
    python3 benchmarks/ncu_cases.py '' "$W/planes_shared_index.json" --suites mobilenetv2 \
    --engines gradops-cuda:planes --ops backprop_input \
    --labels "dw1 112x112x32 3x3/1 m1 NCHW,dw3 56x56x144 3x3/1 m1 NCHW,dw5 28x28x192 3x3/1 m1 NCHW,dw7 14x14x384 3x3/1 m1 NCHW" \
    --time-limit 30 >"$W/planes_shared.csv" 2>"$W/planes_shared.err"
stamp "ncu planes shared memory: $(tail -1 "$W/planes_shared.err")"

# A/B of the fractional pooling gradients: the gather kernels (gradops-cuda:gather: average's
# staged gather, max's select + gather) against the cells kernels (gradops-cuda:cells; max's
# overlapping form new since session 40), which decide CELLS_BY_DEFAULT (both ops: cells for
# disjoint cells since session 55, by the latency-aware estimate; overlapping: gather), beside
# the launchers' choices: the fractional cases in float16 and float32, 48 calls.  Then the forward
# poolings' kernel (cuda_src/fractional_pool.cu, new in session 65, never timed) on the same
# shapes, 16 calls, beside benchmarks/results/fractional_forward_prediction.md's estimates.
timeout -s INT -k 10 70 "$NCU" --profile-from-start off --clock-control none --csv --metrics "$METRICS" \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_ab_fractional_index.json" --suites fractional,fractional_forward \
    --engines gradops-cuda --paths gather,cells --ops fractional --time-limit 60 \
    >"$W/ncu_ab_fractional.csv" 2>"$W/ncu_ab_fractional.err"
stamp "ncu A/B fractional: $(tail -1 "$W/ncu_ab_fractional.err")"
python3 benchmarks/ncu_table.py "$W/ncu_ab_fractional.csv" "$W/ncu_ab_fractional_index.json" --bandwidth "$BW" \
    2>&1 | tee "$W/ncu_ab_fractional.md"

# Why the kernels take 1.3 to 10 times the static model's time (2026-11-28): ncu's full
# sections (issue slots, stall reasons, achieved occupancy, L1/L2/DRAM) for representative
# float16 cases: the input gradient's tiled NHWC / NCHW kernels and its tensor-core NCHW kernel,
# the filter gradient's tiled NHWC kernel, both fractional pooling gradients, and last (if the
# time allows) the worst measured layer, the NCHW input gradient at 5x5 stride 2 (5.9% of HBM,
# 4.6x its NHWC time), whose slowness the SASS does not explain.  The NCHW input-gradient cases
# on the planes kernel (the launcher's since session 46) and on the tiled kernel (--paths tiled):
# their L1/L2 sectors per request side by side.  Measured, the tiled kernel's NCHW/NHWC time ratio grows as its NCHW result stores
# narrow (4 / 2 / 1 columns a lane: geometric means 2.0 / 2.4 / 3.3, H200), and a lane stores
# to its own channel plane; these sections show whether sectors, not bytes, set its time.
# The per-reason stall metrics too (the details page lists only the reasons ncu's CPIStall rule
# flags; benchmarks/ncu_full_summary.py reads these where present), and the summary itself.
# Session 82: dw9 14x14x576 3x3/2 m1 NCHW in place of dw8 (sectioned on the H200 and the H100
# already): the planes kernel's stride-2 small maps are the furthest from the latency-aware
# estimate (H100 2026-12-05, measured_vs_predicted.md: dw9 float16 19.1 us, 2.7x; dw5x5-5
# float32 35.4 us, 3.3x), and no run has their stall reasons.
timeout -s INT -k 10 100 "$NCU" --profile-from-start off --clock-control none --csv --page details --set full \
    --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_full_index.json" --suites mobilenetv2,fractional,efficientnet \
    --engines gradops-cuda --paths tiled,cells --dtypes float16 \
    --labels "dw1 112x112x32 3x3/1 m1,dw9 14x14x576 3x3/2 m1 NCHW,ratio 1.44 overlapping,dw5x5-1 56x56x144 5x5/2 m1 NCHW" \
    --time-limit 80 >"$W/ncu_full.csv" 2>"$W/ncu_full.err"
stamp "ncu full: $(tail -1 "$W/ncu_full.err")"
python3 benchmarks/ncu_full_summary.py "$W/ncu_full.csv" "$W/ncu_full_index.json" >"$W/ncu_full.md" 2>&1

# A/B of the planes filter-gradient kernel's window loads (NCHW, half types): pairs (the
# launcher's) against lane blocks (PLANES_LANES_BY_DEFAULT, opt-in since session 86, never
# timed), on the layers lane blocks can run, beside the launcher: about 84 calls.  Static counts
# (benchmarks/results/planes_lane_blocks.md): 1.6-3.6x fewer global load sectors an item, 6-16%
# more instructions an element; which wins is the GPU's to say.
timeout -s INT -k 10 45 "$NCU" --profile-from-start off --clock-control none --csv --metrics "$METRICS" \
    python3 benchmarks/ncu_cases.py '' "$W/ncu_filter_ab_index.json" --suites mobilenetv2,efficientnet \
    --engines gradops-cuda --paths planes_pairs,planes_lanes --ops backprop_filter --dtypes float16,bfloat16 \
    --labels "NCHW" --time-limit 35 >"$W/ncu_filter_ab.csv" 2>"$W/ncu_filter_ab.err"
stamp "ncu filter A/B: $(tail -1 "$W/ncu_filter_ab.err")"
python3 benchmarks/ncu_table.py "$W/ncu_filter_ab.csv" "$W/ncu_filter_ab_index.json" --bandwidth "$BW" --summary \
    2>&1 | tee "$W/ncu_filter_ab_summary.md"

# Kernel times of the depthwise filter gradient on its launcher (gradops-cuda), half of what is
# left: no step above times it, and every change to its kernels since the 2026-12-04 run is
# untimed (the reduction's load batches, the NHWC tensor-core kernel's whole-sector loads, the
# tiled kernel's swizzled half-type staging, float32 3x3 stride 1 at 16 warps (tiled) and 24 on
# sm_90 (planes)); the 2026-12-04 figures are in results/gpu_h200_2026-12-04/ncu_summary.md.
left=$((520 - $(date +%s) + T0))
if [ "$left" -gt 60 ]; then
    half=$((left / 2))
    timeout -s INT -k 10 "$half" "$NCU" --profile-from-start off --clock-control none --csv --metrics "$METRICS" \
        python3 benchmarks/ncu_cases.py '' "$W/ncu_filter_index.json" --suites mobilenetv2,efficientnet \
        --engines gradops-cuda --ops backprop_filter --time-limit $((half - 15)) \
        >"$W/ncu_filter.csv" 2>"$W/ncu_filter.err"
    stamp "ncu filter: $(tail -1 "$W/ncu_filter.err")"
    python3 benchmarks/ncu_table.py "$W/ncu_filter.csv" "$W/ncu_filter_index.json" --bandwidth "$BW" --summary 2>&1 \
        | tee "$W/ncu_filter_summary.md"
fi
# Kernel times of the input gradient in what is left: the launcher (its choices changed on the
# A/Bs of 2026-12-04, which timed each path forced: the A/B above now times the new launcher)
# beside gradops' cuDNN path, which GPU arrays take by default for this op and which no run has
# timed (the filter gradient's, timed on 2026-12-04, was 1.0-24x slower: _dispatch.CUDA_BY_DEFAULT),
# and PyTorch.
left=$((520 - $(date +%s) + T0))
if [ "$left" -gt 30 ]; then
    timeout -s INT -k 10 "$left" "$NCU" --profile-from-start off --clock-control none --csv --metrics "$METRICS" \
        python3 benchmarks/ncu_cases.py '' "$W/ncu_index.json" --suites mobilenetv2,efficientnet \
        --engines "$ENGINES" --ops backprop_input --time-limit $((left - 20)) \
        >"$W/ncu.csv" 2>"$W/ncu.err"
    stamp "ncu: $(tail -1 "$W/ncu.err")"
    python3 benchmarks/ncu_table.py "$W/ncu.csv" "$W/ncu_index.json" --bandwidth "$BW" --summary 2>&1 \
        | tee "$W/ncu_summary.md"
fi
stamp "done"
cp "$W/info.log" "$W/ncu_summary.md" "$W/ncu_filter_summary.md" "$W/ncu_ab_summary.md" "$W/ncu_ab_fractional.md" \
    "$W/ncu_full.md" "$W/ncu_filter_ab_summary.md" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$W" .
