# GPU CI image: gradops installed with its cuda12 and test extras, the test suite, and
# compute-sanitizer; the default command is scripts/gpu-ci.sh.  No GPU is needed to build it.
#   docker build -t gradops-gpu-ci .
#   docker run --rm --gpus all --user "$(id -u):$(id -g)" -v "$PWD/artifacts:/artifacts" gradops-gpu-ci
# See README.md, "Containerised GPU CI".

# CUDA 12.8 runtime libraries (libnvrtc, cuBLAS...; no compiler, no headers) on Ubuntu 24.04,
# whose distribution Python is 3.12.  Pinned by tag and by digest.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04@sha256:828c4d878adcaa4265d80c95d8ec877149b49bb2419a4cf3bb6aa889bbb7ca2e

# ---------------------------------------------------------------- python: base of both stages
FROM ${CUDA_IMAGE} AS python
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Ubuntu's archive keeps only the latest build of a package, so pinning its exact version
# would break the build at the next security update; the release (24.04) and the base image
# digest pin the Python minor version.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 \
    && rm -rf /var/lib/apt/lists/*

# ---------------------------------------------------------------- build: wheel + virtualenv
FROM python AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gradops/ gradops/
COPY cuda_src/ cuda_src/
# Dependency versions are pyproject.toml's.  The cuda12 extra is installed alone first, and the
# kernels are compiled through CuPy's own compile step for Ampere and Hopper: the build fails if
# a header they include is missing from what that extra installs, or comes from outside the
# virtualenv (the base image has no CUDA headers; the test extra, installed after, brings CUDA
# 13 header wheels for the CPU tests, which must not stand in for the extra's own).  python -P
# imports the installed package, not /src/gradops.  `pip check` fails the build on a conflict.
# The sources change with every commit, so this layer is rebuilt each time: pip's download
# cache lives in a BuildKit cache mount (kept by the build host, never in the image).
RUN --mount=type=cache,target=/root/.cache/pip \
    python3.12 -m venv /opt/venv \
    && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install "$(ls /wheels/gradops-*.whl)[cuda12]" \
    && /opt/venv/bin/python -P -m gradops install-check --only-environment --arch sm_80 --arch sm_90 --jobs 4 \
    && /opt/venv/bin/pip install "$(ls /wheels/gradops-*.whl)[cuda12,test]" \
    && /opt/venv/bin/python -m pip check

# ---------------------------------------------------------------- ci: the image that runs
FROM python AS ci
# compute-sanitizer for the memcheck pass; NVIDIA's CUDA repository (configured by the base
# image) keeps every version, so the one matching CUDA 12.8.1 is pinned.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cuda-sanitizer-12-8=12.8.93-1 \
    && rm -rf /var/lib/apt/lists/*
ENV PATH=/opt/venv/bin:/usr/local/cuda/bin:${PATH} \
    GRADOPS_ARTIFACTS=/artifacts
# A fixed numeric uid/gid (not 1000: the base image's "ubuntu" user has it), so USER below
# is resolvable without /etc/passwd.
RUN groupadd --gid 10001 gradops \
    && useradd --create-home --uid 10001 --gid 10001 gradops \
    && install -d -o 10001 -g 10001 /artifacts
COPY --from=build /opt/venv /opt/venv
# The checkout parts the CI script needs: pytest's configuration, the tests, the scripts.
# Root-owned and read-only for the CI user; the script writes to $GRADOPS_ARTIFACTS and $TMPDIR.
WORKDIR /opt/gradops
COPY pyproject.toml ./
COPY tests/ tests/
COPY scripts/ scripts/
# Last: the commit changes every build and would invalidate every layer after it.
ARG VCS_REF=unknown
LABEL org.opencontainers.image.title="gradops GPU CI" \
      org.opencontainers.image.revision="${VCS_REF}"
ENV GRADOPS_COMMIT=${VCS_REF}
USER 10001:10001
CMD ["/opt/gradops/scripts/gpu-ci.sh"]
