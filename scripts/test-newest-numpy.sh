#!/usr/bin/env bash
# Run the tests that need only gradops' core dependencies under the newest NumPy, in a fresh
# virtual environment of the newest Python found here (3.12 or later).  NumPy's newest
# releases need a newer Python than CI's (NumPy 2.5: 3.12+, the GPU image's Python), so the
# README's test command never meets them; pytest turns a deprecation raised from gradops' own
# code into an error (pyproject.toml), and NumPy 2.5 deprecated one the NumPy backend used.
# Without TensorFlow and NVRTC the parity and SASS tests skip, the NVRTC compile tests (which
# fail rather than skip without the test extra's NVRTC) are left out, and so is the CPU execution
# model (GRADOPS_TEST_HOST_MODEL=0: its g++ builds would double CI's time; =1 keeps it); the
# NumPy backend, validation, dispatch, fuzzing and property tests run.
#
# Usage: scripts/test-newest-numpy.sh [pytest arguments]
#        (default: -m "not slow" -n auto --ignore=tests/test_cuda_compile.py)
# Settings: GRADOPS_NEWEST_PYTHON (an interpreter to use instead of searching),
#           GRADOPS_NEWEST_NUMPY_DIR (the environment; build/newest-numpy).
# Exits 0 with a line saying so where no Python 3.12+ runs here (nothing was tested).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${GRADOPS_NEWEST_NUMPY_DIR:-$root/build/newest-numpy}"

# ensurepip: Debian's Pythons lack venv's pip without their python3.X-venv package.
runs_312() { "$1" -c 'import sys, ensurepip; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; }
python=""
if [ -n "${GRADOPS_NEWEST_PYTHON:-}" ]; then
    runs_312 "$GRADOPS_NEWEST_PYTHON" || { echo "test-newest-numpy.sh: $GRADOPS_NEWEST_PYTHON is not Python 3.12+" >&2; exit 2; }
    python="$GRADOPS_NEWEST_PYTHON"
else
    # PATH first, then pyenv's installed versions (its shims fail for versions not selected).
    candidates=(python3.14 python3.13 python3.12)
    if command -v pyenv >/dev/null 2>&1; then
        for version in $(pyenv versions --bare 2>/dev/null | sort -rV); do
            candidates+=("$(pyenv root)/versions/$version/bin/python3")
        done
    fi
    for candidate in "${candidates[@]}"; do
        if runs_312 "$candidate"; then python="$candidate"; break; fi
    done
fi
if [ -z "$python" ]; then
    echo "test-newest-numpy.sh: not run: no Python 3.12 or later here (set GRADOPS_NEWEST_PYTHON)"
    exit 0
fi

"$python" -m venv --clear "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$root" pytest pytest-xdist hypothesis
"$venv/bin/python" -c 'import sys, numpy; print(f"Python {sys.version.split()[0]}, NumPy {numpy.__version__}")'
cd "$root"
if [ "$#" -eq 0 ]; then set -- -m "not slow" -n auto --ignore=tests/test_cuda_compile.py; fi
# python -m pytest puts the root first on sys.path, so the tests import the checkout's gradops,
# as the README's command does; the installed copy is there for its dependencies.
GRADOPS_TEST_HOST_MODEL="${GRADOPS_TEST_HOST_MODEL:-0}" "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
