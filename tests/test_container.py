"""The GPU CI container and script, checked without Docker or a GPU.

The image cannot be built here, so these tests hold the Dockerfile to pyproject.toml (Python
version, extras, CUDA version), check that .dockerignore keeps what the Dockerfile copies, and
run the CPU-detectable logic of scripts/gpu-ci.sh: its JUnit gate, and its failing (for the
right reason) where the GPU tests can only skip; and CPU CI's scripts/test-newest-numpy.sh where
it finds no Python to run.  Skipped inside the image, which holds the tests but not the
Dockerfile.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import HAS_GPU

ROOT = Path(__file__).resolve().parents[1]
# A mark rather than a module-level skip: `pytest -m gpu` deselects marked tests, while a
# module skipped at collection counts as a skipped GPU test in scripts/gpu-ci.sh's gate.
pytestmark = pytest.mark.skipif(not (ROOT / "Dockerfile").is_file(),
                                reason="not a checkout (no Dockerfile): the GPU CI image runs these tests")

# Each Ubuntu release's python3 (public facts): the image must use the distribution's Python.
UBUNTU_PYTHON = {"22.04": "3.10", "24.04": "3.12"}


# ---------------------------------------------------------------- parsing
def instructions(text: str) -> list[tuple[str, str]]:
    """``[(KEYWORD, arguments)]`` of a Dockerfile: continuations joined, comments dropped."""
    out, buf = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # Docker drops comment lines, also inside a continued instruction
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        keyword, _, args = (buf + stripped).partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continued line"
    return out


def stages(text: str) -> tuple[dict[str, str], list[dict]]:
    """(global ARG defaults, ``[{name, base, body: [(KEYWORD, args)]}]`` per FROM)."""
    args, out = {}, []
    for keyword, rest in instructions(text):
        if keyword == "FROM":
            words = rest.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            out.append({"name": name, "base": words[0], "body": []})
        elif not out and keyword == "ARG":
            key, _, value = rest.partition("=")
            args[key] = value
        else:
            out[-1]["body"].append((keyword, rest))
    return args, out


@pytest.fixture(scope="module")
def dockerfile():
    args, st = stages((ROOT / "Dockerfile").read_text())
    by_name = {s["name"]: s for s in st if s["name"]}

    def root_image(stage):
        while stage["base"] in by_name:
            stage = by_name[stage["base"]]
        return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], stage["base"])

    def lineage(stage):
        """The stage and its ancestors, nearest first."""
        chain = [stage]
        while chain[-1]["base"] in by_name:
            chain.append(by_name[chain[-1]["base"]])
        return chain

    return {"args": args, "stages": st, "final": st[-1], "root_image": root_image, "lineage": lineage}


@pytest.fixture(scope="module")
def pyproject():
    try:
        import tomllib
    except ImportError:  # Python 3.10 (in a test, not at import: see pytestmark)
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def runs(stage_list) -> str:
    return " && ".join(args for s in stage_list for k, args in s["body"] if k == "RUN")


def base_image(dockerfile) -> re.Match:
    image = dockerfile["root_image"](dockerfile["final"])
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.(\d+)-runtime-ubuntu(\d+\.\d+)@sha256:[0-9a-f]{64}", image)
    assert match, f"base image {image!r}: want nvidia/cuda:X.Y.Z-runtime-ubuntuNN.NN@sha256:<digest>"
    return match


# ---------------------------------------------------------------- Dockerfile vs pyproject.toml
def test_base_image_is_a_pinned_cuda12_runtime_image(dockerfile):
    cuda_major = base_image(dockerfile).group(1)
    assert cuda_major == "12", "the image installs the cuda12 extra: its base must be CUDA 12"


def test_python_is_the_distributions_and_satisfies_requires_python(dockerfile, pyproject):
    ubuntu = base_image(dockerfile).group(4)
    final_runs = runs(dockerfile["lineage"](dockerfile["final"]))
    installed = set(re.findall(r"\bpython3\.(\d+)\b", final_runs))
    assert len(installed) == 1, f"exactly one python3.X package in the final image: {installed}"
    version = "3." + installed.pop()
    assert version == UBUNTU_PYTHON[ubuntu], f"Ubuntu {ubuntu} ships Python {UBUNTU_PYTHON[ubuntu]}, not {version}"
    assert version in SpecifierSet(pyproject["project"]["requires-python"])
    build_runs = runs(dockerfile["lineage"](next(s for s in dockerfile["stages"] if s["name"] == "build")))
    assert f"python{version} -m venv" in build_runs, "the virtualenv must use the image's Python"
    # The test extra's markers (TensorFlow parity, NVRTC compile check) must hold in the image,
    # or those tests would skip there.
    env = {"python_version": version, "python_full_version": version + ".0", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
           "extra": "test"}
    inactive = [r for r in pyproject["project"]["optional-dependencies"]["test"]
                if Requirement(r).marker and not Requirement(r).marker.evaluate(env)]
    assert not inactive, f"test requirements not installed with Python {version}: {inactive}"


def test_the_cuda12_extra_alone_compiles_the_kernels_before_the_test_extra(dockerfile, pyproject):
    """The image proves the GPU extra complete: it installs ``cuda12`` alone, compiles the kernels
    through CuPy with headers from the virtualenv only, and only then adds the test extra (whose
    CUDA 13 header wheels must not stand in for the extra's own)."""
    build = next(s for s in dockerfile["stages"] if s["name"] == "build")
    steps = [cmd.strip() for cmd in runs([build]).split("&&")]
    installs = [i for i, cmd in enumerate(steps) if re.search(r"\bpip install\b", cmd)]
    assert len(installs) == 2, steps
    extras = [re.findall(r"\[([\w,-]+)\]", steps[i]) for i in installs]
    assert [set(e[0].split(",")) for e in extras] == [{"cuda12"}, {"cuda12", "test"}], extras
    checks = [i for i, cmd in enumerate(steps) if "gradops install-check" in cmd]
    assert len(checks) == 1 and installs[0] < checks[0] < installs[1], steps
    assert "--only-environment" in steps[checks[0]]
    optional = pyproject["project"]["optional-dependencies"]
    assert {"cuda12", "test"} <= optional.keys()
    assert any(Requirement(r).name == "cupy-cuda12x" for r in optional["cuda12"])


def test_sanitizer_package_matches_the_cuda_version(dockerfile):
    major, minor = base_image(dockerfile).group(1, 2)
    pins = re.findall(r"\bcuda-sanitizer-(\d+)-(\d+)=(\d+)\.(\d+)\.[\d.-]+", runs([dockerfile["final"]]))
    assert pins == [(major, minor, major, minor)], pins


def test_runs_gpu_ci_as_a_non_root_user(dockerfile):
    body = dockerfile["final"]["body"]
    users = [args for k, args in body if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users
    (cmd,) = [args for k, args in body if k in ("CMD", "ENTRYPOINT")]
    assert cmd == '["/opt/gradops/scripts/gpu-ci.sh"]'
    workdir = [args for k, args in body if k == "WORKDIR"][-1]
    copied = {args.split()[-1].rstrip("/"): args.split()[0].rstrip("/")
              for k, args in body if k == "COPY" and "--from" not in args}
    assert {"tests", "scripts"} <= copied.keys() and workdir == "/opt/gradops"
    assert os.access(ROOT / "scripts" / "gpu-ci.sh", os.X_OK)


# ---------------------------------------------------------------- .dockerignore
def _pattern_regex(pattern: str) -> re.Pattern:
    """Docker's .dockerignore glob: ``**`` any number of path segments, ``*`` within one."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves ``path`` out of the context: the last matching pattern decides,
    and a pattern matching a parent directory matches everything under it."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        regex = _pattern_regex(raw.lstrip("!").strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_what_the_dockerfile_copies(dockerfile):
    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sources = set()
    for stage in dockerfile["stages"]:
        for keyword, args in stage["body"]:
            words = [w for w in args.split() if not w.startswith("--")]
            if keyword == "COPY" and "--from" not in args:
                sources |= {w.rstrip("/") for w in words[:-1]}  # the last word is the destination
    files = []
    for source in sorted(sources):
        path = ROOT / source
        assert path.exists(), f"COPY {source}: not in the checkout"
        files += [path] if path.is_file() else [p for p in path.rglob("*")
                                                   if p.is_file() and "__pycache__" not in p.parts]
    dropped = [str(p.relative_to(ROOT)) for p in files if dockerignored(str(p.relative_to(ROOT)), patterns)]
    assert not dropped, f".dockerignore drops files the Dockerfile copies: {dropped[:10]}"
    for kept_out in (".git/HEAD", "build/x", "benchmarks/results", ".venv/bin/python",
                     "gradops/__pycache__/x.pyc", "tests/__pycache__/conftest.cpython-312.pyc"):
        assert dockerignored(kept_out, patterns), kept_out


def test_dockerignore_matcher():
    assert dockerignored("a/b/c.pyc", ["**/*.pyc"]) and dockerignored("c.pyc", ["**/*.pyc"])
    assert not dockerignored("a/b/c.py", ["**/*.pyc"])
    assert not dockerignored("src/x", ["*", "!src/"]) and dockerignored("other/x", ["*", "!src/"])
    assert dockerignored("src/__pycache__/m.pyc", ["*", "!src/", "**/__pycache__"])


# ---------------------------------------------------------------- scripts/junit_gate.py
def _junit_gate():
    spec = importlib.util.spec_from_file_location("junit_gate", ROOT / "scripts" / "junit_gate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(tmp_path, *cases: str) -> str:
    path = tmp_path / "report.xml"
    body = "".join(f'<testcase classname="t" name="c{i}">{c}</testcase>' for i, c in enumerate(cases))
    path.write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return str(path)


SKIP = '<skipped type="pytest.skip" message="needs a CUDA GPU with CuPy">why</skipped>'
XFAIL = '<skipped type="pytest.xfail" message="known">x</skipped>'
FAIL = '<failure message="assert 0">trace</failure>'
ERROR = '<error message="fixture">trace</error>'


@pytest.mark.parametrize("cases, args, expected", [
    (["", ""], ["--no-skips", "--min-passed", "1"], 0),
    (["", XFAIL], ["--no-skips", "--min-passed", "1"], 0),       # xfail is not a skip
    (["", SKIP], ["--no-skips", "--min-passed", "1"], 1),
    ([SKIP, SKIP], ["--no-skips", "--min-passed", "1"], 1),
    ([SKIP], [], 0),                                               # skips allowed without --no-skips
    ([SKIP], ["--min-passed", "1"], 1),
    ([], ["--no-skips", "--min-passed", "1"], 1),                  # nothing collected
    (["", SKIP], ["--no-skips", "--allow-skip", "CUDA GPU"], 0),
    (["", SKIP], ["--no-skips", "--allow-skip", "sm_90"], 1),
    (["", FAIL], [], 1),
    (["", ERROR], [], 1),
])
def test_junit_gate(tmp_path, capsys, cases, args, expected):
    assert _junit_gate().main([_report(tmp_path, *cases), *args]) == expected


def test_junit_gate_names_modules_skipped_at_collection(tmp_path, capsys):
    skip = ('<skipped message="collection skipped">'
            "('tests/test_x.py', 9, 'Skipped: cupy not importable')</skipped>")
    path = tmp_path / "report.xml"
    path.write_text(f'<testsuites><testsuite><testcase classname="" name="tests.test_x">{skip}'
                    '</testcase><testcase classname="t" name="ok"/></testsuite></testsuites>')
    assert _junit_gate().main([str(path), "--no-skips"]) == 1
    assert "tests.test_x: collection skipped: ('tests/test_x.py', 9, 'Skipped: cupy not importable')" in capsys.readouterr().out
    assert _junit_gate().main([str(path), "--no-skips", "--allow-skip", "cupy not importable"]) == 0


def test_junit_gate_fails_on_a_missing_or_broken_report(tmp_path):
    gate = _junit_gate()
    assert gate.main([str(tmp_path / "missing.xml")]) == 1
    (tmp_path / "broken.xml").write_text("<testsuites><testcase")
    assert gate.main([str(tmp_path / "broken.xml")]) == 1


# ---------------------------------------------------------------- scripts/gpu-ci.sh without a GPU
def _gpu_ci(tmp_path, steps: str, **env) -> tuple[int, str, Path]:
    artifacts = tmp_path / "artifacts"
    full_env = {**os.environ, "GRADOPS_ARTIFACTS": str(artifacts), "GRADOPS_CI_STEPS": steps,
                "PYTHON": sys.executable, **env}
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-ci.sh")], env=full_env, capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr, artifacts


@pytest.mark.skipif(HAS_GPU, reason="checks the failure on a machine without a GPU")
def test_gpu_ci_fails_when_gpu_tests_skip(tmp_path):
    status, output, artifacts = _gpu_ci(tmp_path, "gpu-tests")
    assert status == 1, output
    log = (artifacts / "gpu-tests.log").read_text()
    assert "(FORBIDDEN): needs a CUDA GPU with CuPy" in log, log[-3000:]
    assert re.search(r"FAIL: \d+ tests were skipped that must run here", log), log[-3000:]
    assert (artifacts / "gpu-tests.junit.xml").is_file()
    assert re.search(r"^gpu-tests +FAIL", (artifacts / "summary.txt").read_text(), re.M)


def _has_sanitizer() -> bool:
    """Whether gpu-ci.sh would find compute-sanitizer (it looks in the same places)."""
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    places = (f"{cuda_home}/bin/compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer",
              "/usr/local/cuda/compute-sanitizer/compute-sanitizer")
    return shutil.which("compute-sanitizer") is not None or any(os.access(p, os.X_OK) for p in places)


@pytest.mark.skipif(_has_sanitizer(), reason="checks the behaviour without compute-sanitizer")
def test_gpu_ci_sanitizer_absent_fails_unless_skipped_on_request(tmp_path):
    status, output, artifacts = _gpu_ci(tmp_path, "sanitizer")
    assert status == 1 and "compute-sanitizer not found" in output, output
    status, output, artifacts = _gpu_ci(tmp_path, "sanitizer", GRADOPS_CI_SANITIZER="skip")
    assert status == 0, output
    assert re.search(r"^sanitizer +SKIPPED \(warning", (artifacts / "summary.txt").read_text(), re.M)


def test_gpu_ci_rejects_unknown_settings(tmp_path):
    status, output, _ = _gpu_ci(tmp_path, "info,gpu")
    assert status == 2 and "unknown step 'gpu'" in output, output
    status, output, _ = _gpu_ci(tmp_path, "info", GRADOPS_CI_SANITIZER="maybe")
    assert status == 2 and "GRADOPS_CI_SANITIZER" in output, output


# ---------------------------------------------------------------- CPU CI: scripts/test-newest-numpy.sh
def _newest_numpy_script(tmp_path, **env):
    """scripts/test-newest-numpy.sh with a PATH of dirname only (no Python, no pyenv)."""
    folder = tmp_path / "bin"
    folder.mkdir(parents=True)
    (folder / "dirname").symlink_to(shutil.which("dirname"))
    return subprocess.run(["/bin/bash", str(ROOT / "scripts" / "test-newest-numpy.sh")], capture_output=True,
                          text=True, env={"PATH": str(folder), "HOME": str(tmp_path), **env}, timeout=60)


def test_newest_numpy_script_says_it_did_not_run_without_a_newer_python(tmp_path):
    """Where no Python 3.12+ is found, the script tests nothing, says so and succeeds (CI's
    machine may have none); an interpreter named in GRADOPS_NEWEST_PYTHON that is older fails."""
    run = _newest_numpy_script(tmp_path)
    assert run.returncode == 0 and "not run: no Python 3.12 or later here" in run.stdout, run.stdout + run.stderr
    if sys.version_info < (3, 12):
        run = _newest_numpy_script(tmp_path / "older", GRADOPS_NEWEST_PYTHON=sys.executable)
        assert run.returncode == 2 and "is not Python 3.12+" in run.stderr, run.stdout + run.stderr
