#!/usr/bin/env bash
# Install gradops with one GPU extra, and nothing else, into a fresh virtual environment, then
# compile every CUDA kernel for each GPU generation through CuPy's own compile step, as the
# first call on a GPU would (python -m gradops install-check; no GPU needed).  The check runs
# outside the checkout (so the installed package is the one imported), with an environment
# that names no CUDA toolkit, and fails if a header folder lies outside the virtualenv: a
# toolkit installed on this machine must not hide a header the extra lacks.
#
# Usage: scripts/check-gpu-install.sh EXTRA [ARCH...] [classes [each:ARCH...]]   e.g. cuda13,
#        cuda12 sm_80 sm_90, cuda12 classes (of the archs that see the same preprocessed source
#        file, only the oldest), or cuda12 classes each:sm_80 each:sm_90 (of each class, the archs
#        named with each:, else the oldest)
# Settings: GRADOPS_INSTALL_CHECK_DIR (where the environments go; build/install-check),
#           GRADOPS_INSTALL_CHECK_JOBS (NVRTC programs at once; the number of CPUs),
#           GRADOPS_INSTALL_CHECK_KEEP=1 keeps the environment afterwards,
#           GRADOPS_INSTALL_CHECK_STEP=install only builds the environment (and keeps it),
#           =compile only compiles, in the environment an install step left (CI downloads the
#           extras, about 2 GB each, while its tests run; the default does both).
set -euo pipefail
extra=${1:?usage: check-gpu-install.sh EXTRA [ARCH...]}
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
base="${GRADOPS_INSTALL_CHECK_DIR:-$root/build/install-check}"
venv="$base/$extra"
jobs="${GRADOPS_INSTALL_CHECK_JOBS:-$(nproc)}"

step="${GRADOPS_INSTALL_CHECK_STEP:-all}"
case "$step" in
    all|install)
        python3 -m venv --clear "$venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "${root}[${extra}]"
        if [ "$step" = install ]; then exit 0; fi ;;
    compile)
        if [ ! -x "$venv/bin/python" ]; then
            echo "check-gpu-install.sh: no environment at $venv (run the install step first)" >&2
            exit 2
        fi ;;
    *) echo "check-gpu-install.sh: GRADOPS_INSTALL_CHECK_STEP must be all, install or compile" >&2; exit 2 ;;
esac

arch_args=()
for arch in "$@"; do
    case "$arch" in
        classes) arch_args+=(--one-per-class) ;;
        each:*) arch_args+=(--each "${arch#each:}") ;;
        *) arch_args+=(--arch "$arch") ;;
    esac
done
status=0
workdir="$(mktemp -d)"
# env -i: no CUDA_PATH / CUDA_HOME / LD_LIBRARY_PATH, and a PATH without a toolkit's nvcc.
(cd "$workdir" && env -i HOME="$HOME" PATH="$venv/bin:/usr/bin:/bin" COLUMNS=160 \
    "$venv/bin/python" -m gradops install-check --only-environment --jobs "$jobs" "${arch_args[@]}") || status=$?
rm -rf "$workdir"
if [ "${GRADOPS_INSTALL_CHECK_KEEP:-0}" != 1 ]; then
    rm -rf "$venv"
fi
exit "$status"
