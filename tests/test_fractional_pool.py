"""The forward fractional poolings' CUDA kernels (cuda_src/fractional_pool.cu): bit for bit the
NumPy backend's results (which tests/test_fractional_{avg,max}_pool_grad.py check against TF and
brute force), on the HostDevice stand-in everywhere and on a GPU where there is one.

The forwards' semantics and their NumPy and TF tests live beside their gradients; this module
covers what the GPU adds: the launch's choices (vectors of channels, 32/64-bit indices, chunks of
cell rows, blocks of channels), tensors of every kind and alignment, and the special values each
kernel must treat as TF does.
"""

from __future__ import annotations

import importlib

import ml_dtypes
import numpy as np
import pytest

import cuda_host
import gradops
from conftest import FLOAT_DTYPES, FOREIGN_GPU_WRAPPERS, misaligned_on_gpu, to_gpu, to_host

ALL_DTYPES = [np.int32, np.int64, *FLOAT_DTYPES]
OPS = ["fractional_avg_pool", "fractional_max_pool"]


def launcher():
    return importlib.import_module("gradops.backends.cuda.fractional_pool")


def forward(op):
    return getattr(gradops, op)


def random_value(rng, shape, dtype):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    # Few distinct values: ties (and their first-in-scan rule) in most max pooling cells.
    return (rng.integers(-8, 8, size=shape) * 0.375).astype(dtype)


def comparable_bits(x):
    """x's bits as unsigned integers, every NaN as one pattern: a NaN's payload and sign are not
    compared (a GPU's arithmetic and conversions make the canonical NaN, NumPy keeps its input's)."""
    x = np.array(x)
    if x.dtype.kind != "i":
        x[np.isnan(x.astype(np.float64))] = np.nan
    return x.view(f"u{x.itemsize}")


def assert_same_bits(got, want):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(comparable_bits(got), comparable_bits(want))


def numpy_result(op, x, rows, cols, overlapping):
    return forward(op)(x, rows, cols, overlapping, backend="numpy")


def geometry(x_shape, rows, cols, overlapping):
    from gradops._geometry import fractional_pool_forward_geometry

    return fractional_pool_forward_geometry("fractional_pool", x_shape, [int(v) for v in rows],
                                            [int(v) for v in cols], overlapping)


#: (value shape, row sequence, column sequence); None: drawn by TF's generator at ratio 1.44.
SEQUENCES = {
    "generated": ((2, 11, 9, 3), None, None),
    "equal-entries": ((1, 5, 6, 2), [0, 2, 2, 4], [1, 1, 3, 5]),  # empty cells when disjoint
    "clamped": ((2, 5, 6, 1), [0, 1, 9], [2, 3, 5, 50]),  # ends past the input
    "one-cell": ((1, 5, 6, 4), [4, 5], [0, 6]),
    "unordered": ((1, 6, 7, 2), [3, 1, 5, 1, 6], [0, 4, 2, 7]),  # decreasing entries: empty cells
    "stacked": ((1, 4, 5, 2), [0, 4, 1, 4], [0, 5, 1, 3]),  # cells covering parts of the input twice
    "past-the-input": ((1, 4, 4, 2), [0, 2, 7, 9], [0, 4, 6]),  # cells starting past it: empty
}


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("case", list(SEQUENCES))
@pytest.mark.parametrize("op", OPS)
def test_cuda_matches_numpy_bit_for_bit(cuda_device, op, case, overlapping, dtype):
    rng = np.random.default_rng(31)
    shape, rows, cols = SEQUENCES[case]
    if rows is None:
        rows = gradops.fractional_pooling_sequence(shape[1], 1.44, True, seed=3)
        cols = gradops.fractional_pooling_sequence(shape[2], 1.44, False, seed=4)
    x = random_value(rng, shape, dtype)
    got = forward(op)(to_gpu(x), rows, cols, overlapping)
    decision = gradops.last_backend_decision()
    assert (decision.op, decision.backend) == (op, "cuda")
    assert f"cuDNN has no {op}" in decision.reason
    assert_same_bits(to_host(got), numpy_result(op, x, rows, cols, overlapping))


#: Forced launch choices (cells_plan's keywords), each run on a problem that needs it: a depth
#: of 16 takes 16-byte vectors of every dtype, and 4 vectors a block split 4 blocks of channels
#: when a block holds one.
FORCED = {
    "default": {},
    "one-channel-a-thread": dict(vector=1),
    "64-bit-indices": dict(index="long long"),
    "64-bit-one-channel": dict(index="long long", vector=1),
    "chunks-of-one-row": dict(chunk_rows=1),
    "chunks-of-three-rows": dict(chunk_rows=3),
    "a-vector-a-block": dict(block_vectors=1),
}


@pytest.mark.parametrize("force", list(FORCED))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("op", OPS)
def test_cuda_launch_choices(cuda_device, op, overlapping, dtype, force):
    rng = np.random.default_rng(32)
    x = random_value(rng, (3, 13, 11, 16), dtype)
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=5)
    cols = [0, 1, 3, 4, 7, 9, 11]
    g = geometry(x.shape, rows, cols, overlapping)
    got = getattr(launcher(), op)(g, to_gpu(x), **FORCED[force])
    assert_same_bits(to_host(got), numpy_result(op, x, rows, cols, overlapping))


def test_launch_choices_take_effect(cuda_device, monkeypatch):
    """The forced choices reach the launch: the instantiation loaded (its template arguments),
    recorded where the launcher asks for it, so on a GPU as on the stand-in (whose record of
    launches a GPU lacks: the H200 run of 2026-12-04 failed here on ``None.launches``)."""
    import cupy

    runtime = launcher()._runtime
    load, loaded = runtime.kernel, []
    monkeypatch.setattr(runtime, "kernel", lambda filename, expression: loaded.append(expression) or load(filename, expression))
    x = np.zeros((3, 13, 11, 16), np.float16)
    g = geometry(x.shape, gradops.fractional_pooling_sequence(13, 1.44, True, seed=5), [0, 1, 3, 4, 7, 9, 11], True)
    assert launcher().cells_plan(g, x.dtype).vector == 8
    for force, kernel in [({}, "<__half, int, 8>"), (dict(vector=1), "<__half, int, 1>"),
                          (dict(index="long long"), "<__half, long long, 8>")]:
        loaded.clear()
        launcher().fractional_max_pool(g, cupy.asarray(x), **force)
        assert loaded == [f"gradops::fractional_max_pool{kernel}"]
        if cuda_device is not None:
            ((expression, _, _),) = cuda_device.launches[-1:]
            assert expression == loaded[0]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.int64], ids=lambda d: np.dtype(d).name)
def test_cuda_misaligned_and_strided_values(cuda_device, op, dtype):
    """A value one element into its allocation takes one channel a thread (16-byte loads would
    fault on a GPU: the stand-in checks each access's alignment); a strided one is copied."""
    rng = np.random.default_rng(33)
    x = random_value(rng, (2, 9, 10, 8), dtype)
    rows, cols = [0, 2, 3, 5, 7, 9], [0, 1, 3, 4, 6, 8, 10]
    want = numpy_result(op, x, rows, cols, True)
    misaligned = misaligned_on_gpu(x)
    assert not launcher()._runtime.vector_aligned(misaligned)
    assert_same_bits(to_host(forward(op)(misaligned, rows, cols, True)), want)
    wide = np.concatenate([x, x[..., ::-1]], axis=3)
    assert_same_bits(to_host(forward(op)(to_gpu(wide)[..., ::2], rows, cols, True)),
                     numpy_result(op, wide[..., ::2], rows, cols, True))


@FOREIGN_GPU_WRAPPERS
@pytest.mark.parametrize("op", OPS)
def test_cuda_foreign_tensors(cuda_device, op, wrapper):
    rng = np.random.default_rng(34)
    x = random_value(rng, (2, 7, 8, 4), np.float32)
    rows, cols = [0, 2, 3, 5, 7], [0, 1, 3, 5, 8]
    got = forward(op)(wrapper(to_gpu(x)), rows, cols)
    assert_same_bits(to_host(got), numpy_result(op, x, rows, cols, False))


def special_values(dtype):
    """A value holding, per dtype, what each kernel must treat as TF does: NaN, +-Inf, signed
    zeros in both orders, the largest and smallest finite values, subnormals (kept: no
    flush-to-zero), and for integers both extremes (sums wrap, divisions truncate toward zero)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        pool = [info.max, info.max, info.min, info.min, -7, -1, 0, 1, 5, info.max - 3, info.min + 2, -3]
    else:
        info = ml_dtypes.finfo(dtype)
        tiny = float(info.smallest_subnormal)
        pool = [np.nan, np.inf, -np.inf, 0.0, -0.0, -0.0, 0.0, float(info.max), float(info.min), tiny, -tiny,
                3 * tiny, -1.5, 2.25, float(info.max), -1.0]
    rng = np.random.default_rng(35)
    return rng.choice(np.asarray(pool, dtype if dtype.kind == "i" else np.float64), size=(2, 9, 8, 8)).astype(dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("op", OPS)
def test_cuda_special_values(cuda_device, op, overlapping, dtype):
    x = special_values(dtype)
    for rows, cols in [([0, 2, 3, 5, 7, 9], [0, 1, 3, 4, 6, 8]), ([0, 9], [0, 8]), ([0, 1, 2, 4], [0, 2, 2, 8])]:
        got = forward(op)(to_gpu(x), rows, cols, overlapping)
        assert_same_bits(to_host(got), numpy_result(op, x, rows, cols, overlapping))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32, np.int32], ids=lambda d: np.dtype(d).name)
def test_cuda_max_of_empty_nan_and_minus_inf_cells_is_the_lowest(cuda_device, dtype):
    """TF's running max starts from the type's lowest finite value (independent of NumPy's)."""
    kind_float = np.dtype(dtype).kind != "i"
    lowest = ml_dtypes.finfo(dtype).min if kind_float else np.iinfo(dtype).min
    x = np.full((1, 2, 4, 1), np.nan if kind_float else np.iinfo(dtype).min, dtype)
    if kind_float:
        x[0, :, 2:, 0] = -np.inf
    # cells: NaN only (or the lowest integer), -inf only, and an empty row cell [2, 1] of two
    got = to_host(gradops.fractional_max_pool(to_gpu(x), [0, 2, 2], [0, 2, 4]))
    assert got.dtype == np.dtype(dtype)
    assert got.reshape(-1).astype(np.float64).tolist() == [float(lowest)] * 4


def test_cuda_max_keeps_the_first_zero_and_avg_sums_from_plus_zero(cuda_device):
    x = np.array([-0.0, 0.0, 0.0, -0.0, -0.0, -0.0], np.float32).reshape(1, 1, 6, 1)
    cols = [0, 2, 4, 6]
    y = to_host(gradops.fractional_max_pool(to_gpu(x), [0, 1], cols)).reshape(-1)
    assert np.signbit(y).tolist() == [True, False, True]
    a = to_host(gradops.fractional_avg_pool(to_gpu(x), [0, 1], cols)).reshape(-1)
    assert np.signbit(a).tolist() == [False, False, False]


def test_cuda_integer_average_wraps_and_truncates_toward_zero(cuda_device):
    big = np.iinfo(np.int32).max
    x = np.array([big, 1, -7, 2, -1, 0], np.int32).reshape(1, 1, 6, 1)
    got = to_host(gradops.fractional_avg_pool(to_gpu(x), [0, 1], [0, 2, 4, 6])).reshape(-1)
    # (2^31 - 1) + 1 wraps to -2^31, halved; -5 / 2 and -1 / 2 truncate toward zero
    assert got.tolist() == [-(2**30), -2, 0]


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_cuda_max_pool_output_is_the_gradients_orig_output(cuda_device, overlapping, dtype):
    """What a GPU caller does: the GPU forward's maxima pass fractional_max_pool_grad's check that
    orig_output holds them, and the gradient is the NumPy backend's."""
    rng = np.random.default_rng(36)
    x = random_value(rng, (2, 12, 10, 8), dtype)
    rows = gradops.fractional_pooling_sequence(12, 1.44, True, seed=7)
    cols = gradops.fractional_pooling_sequence(10, 1.44, False, seed=8)
    y = gradops.fractional_max_pool(to_gpu(x), rows, cols, overlapping)
    dy = rng.standard_normal(y.shape).astype(dtype)
    grad = gradops.fractional_max_pool_grad(to_gpu(x), y, to_gpu(dy), rows, cols, overlapping)
    y_host = gradops.fractional_max_pool(x, rows, cols, overlapping)
    assert_same_bits(to_host(grad), gradops.fractional_max_pool_grad(x, y_host, dy, rows, cols, overlapping))


@pytest.mark.parametrize("overlapping", [False, True], ids=["disjoint", "overlapping"])
def test_cuda_avg_pool_adjoint_of_its_gradient(cuda_device, overlapping):
    """<avg_pool(x), dy> = <x, avg_pool_grad(dy)> in float64, both sides on the device."""
    rng = np.random.default_rng(37)
    x = rng.standard_normal((2, 13, 11, 4))
    rows = gradops.fractional_pooling_sequence(13, 1.44, True, seed=9)
    cols = gradops.fractional_pooling_sequence(11, 1.44, False, seed=10)
    y = to_host(gradops.fractional_avg_pool(to_gpu(x), rows, cols, overlapping))
    dy = rng.standard_normal(y.shape)
    dx = to_host(gradops.fractional_avg_pool_grad(list(x.shape), to_gpu(dy), rows, cols, overlapping))
    assert np.isclose(np.sum(y * dy), np.sum(x * dx), rtol=1e-12, atol=0)


@pytest.mark.parametrize("arch", [60, 75, 80])
def test_older_gpus_run_the_forwards(monkeypatch, arch):
    """The launcher takes the kernels on a stand-in posing as Pascal, Turing and Ampere (no
    architecture check refuses them; that they compile for each arch is the install check's)."""
    cuda_host.HostDevice(order="shuffled", seed=arch, compute_capability=arch).install(monkeypatch)
    rng = np.random.default_rng(arch)
    for dtype in (np.float16, ml_dtypes.bfloat16, np.float32):
        x = random_value(rng, (2, 9, 9, 8), dtype)
        for op in OPS:
            got = forward(op)(to_gpu(x), [0, 2, 3, 5, 6, 8, 9], [0, 1, 3, 4, 6, 7, 9], True)
            assert_same_bits(to_host(got), numpy_result(op, x, [0, 2, 3, 5, 6, 8, 9], [0, 1, 3, 4, 6, 7, 9], True))


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32], ids=lambda d: np.dtype(d).name)
def test_cuda_memcheck(racecheck_device, dtype):
    """No access outside an array's bytes and no misaligned vector access (the racecheck build
    checks both), over every kind of sequence, with vectors, one channel a thread, 64-bit
    indices and chunks of one row."""
    rng = np.random.default_rng(38)
    for shape, rows, cols in SEQUENCES.values():
        if rows is None:
            rows = gradops.fractional_pooling_sequence(shape[1], 1.44, True, seed=3)
            cols = gradops.fractional_pooling_sequence(shape[2], 1.44, False, seed=4)
        x = random_value(rng, shape[:3] + (8,), dtype)
        for overlapping in (False, True):
            g = geometry(x.shape, rows, cols, overlapping)
            for force in ({}, dict(vector=1), dict(index="long long", chunk_rows=1)):
                for op in OPS:
                    got = getattr(launcher(), op)(g, to_gpu(x), **force)
                    assert_same_bits(to_host(got), numpy_result(op, x, rows, cols, overlapping))


def test_planted_over_read_only_memcheck_catches(tmp_path, monkeypatch):
    """Loading a row's last columns unguarded reads past the cell (unused, so the results stay
    right) and, at the input's last element, past the array: the memcheck build refuses it."""
    def run():
        x = random_value(np.random.default_rng(39), (1, 5, 6, 8), np.float32)
        rows, cols = [0, 2, 5], [0, 3, 6]
        g = geometry(x.shape, rows, cols, False)
        assert_same_bits(to_host(launcher().fractional_max_pool(g, to_gpu(x))), numpy_result(
            "fractional_max_pool", x, rows, cols, False))

    cuda_host.assert_only_racecheck_catches(
        launcher().SOURCE, ("if (k < rest) packs[k] = load_pack<V>(row + k * depth);",
                            "packs[k] = load_pack<V>(row + k * depth);"),
        run, "memcheck: a .* read .* past the end of an array", 5, tmp_path, monkeypatch)


@pytest.mark.parametrize("backend", [None, "numpy", "cuda"])
def test_integer_average_of_a_cell_too_large_for_its_count_is_refused(backend):
    """TF counts a cell's elements in the element type: an int32 cell of 2**31 elements or more
    (8 GiB) would overflow the count (zero at 2**32), so the op refuses it before any backend
    runs, naming the value (a broadcast view: nothing is allocated)."""
    value = np.broadcast_to(np.int32(3), (1, 2**16, 2**15 + 1, 1))
    with pytest.raises(gradops.InvalidArgumentError, match="value is int32 .* 2147549184 elements"):
        gradops.fractional_avg_pool(value, [0, 2**16], [0, 2**15 + 1], backend=backend)
    # int64 counts hold it; a cell of 2**31 - 1 elements fits int32's count (not computed here)
    g = geometry(value.shape, [0, 2**16], [0, 2**15 + 1], False)
    assert g.largest_cell == 2**31 + 2**16


def huge_cell_problem(dtype):
    """(x, row sequence, column sequence): a cell of 2**24 + 2**17 elements holding one 4096
    among zeros (its TF average 2**-12), beside cells of 4."""
    rows = 2**24 + 2**17 + 4
    x = np.zeros((1, rows, 2, 1), dtype)
    x[0, 7, 0, 0] = 4096.0
    x[0, :3, 1, 0] = 1.0
    return x, [0, 4, rows], [0, 1, 2]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=lambda d: np.dtype(d).name)
def test_cuda_float_count_of_a_huge_cell_stops_at_2_24(cuda_device, dtype):
    """A float32 counter stops at 2**24 (TF's count of a cell's elements; the half types count in
    float32): a cell of 2**24 + 2**17 elements (a count the types would tell apart) with one value
    4096 and zeros averages to 4096 / 2**24 = 2**-12, as the NumPy backend (checked against TF)
    gives; a cell of 4 beside it divides by 4."""
    x, rows_seq, cols_seq = huge_cell_problem(dtype)
    got = to_host(gradops.fractional_avg_pool(to_gpu(x), rows_seq, cols_seq))
    assert_same_bits(got, numpy_result("fractional_avg_pool", x, rows_seq, cols_seq, False))
    assert float(got[0, 1, 0, 0]) == 2.0**-12
    assert float(got[0, 0, 1, 0]) == 0.75


def test_planted_exact_float_count_is_caught(tmp_path, monkeypatch):
    """The float count converted exactly (not as TF's float counter stops) fails the test above."""
    def problem():
        x, rows, cols = huge_cell_problem(np.float32)
        got = to_host(gradops.fractional_avg_pool(to_gpu(x), rows, cols))
        return got.view(np.uint32), numpy_result("fractional_avg_pool", x, rows, cols, False).view(np.uint32)

    cuda_host.assert_planted_bug_caught(launcher().SOURCE, ("count < I(1 << 24) ? static_cast<float>(count) : 16777216.0f",
                                                            "static_cast<float>(count)"),
                                        problem, lambda got, want: np.testing.assert_array_equal(got, want), 5,
                                        tmp_path, monkeypatch)


def test_cuda_tables_are_kept_per_geometry(cuda_device):
    """A repeated geometry uploads its cell tables once; another one uploads its own."""
    from gradops.backends.cuda import _runtime

    x = to_gpu(np.ones((1, 7, 7, 2), np.float32))
    rows = cols = [0, 2, 4, 7]
    _runtime.clear_table_cache()
    gradops.fractional_avg_pool(x, rows, cols)
    gradops.fractional_max_pool(x, rows, cols)
    assert len(_runtime._table_cache) == 1
    gradops.fractional_avg_pool(x, rows, [0, 3, 7])
    assert len(_runtime._table_cache) == 2


def test_cell_bounds():
    """Each cell's first and last index; (0, -1) for an empty one, even one starting past 2**31."""
    bounds = launcher().cell_bounds([0, 3, 2**40, 5], [2, 4, 6, 4])
    assert bounds.dtype == np.int64
    assert bounds.tolist() == [0, 2, 3, 4, 0, -1, 0, -1]


def test_instantiations_cover_every_launch():
    from gradops.backends.cuda import _build

    expressions = _build.all_instantiations()[launcher().SOURCE]
    for op in OPS:
        for dtype in ALL_DTYPES:
            width = launcher()._runtime.vector_width(dtype)
            for index in ("int", "long long"):
                for vector in (width, 1):
                    assert launcher()._expression(op, dtype, index, vector) in expressions


# --------------------------------------------------------------------------- planted bugs


def planted_problem(rng):
    """(results, expected) of calls through both launchers on the current device: overlapping
    cells with signed zeros and NaN in float32 (vectors of 4, chunks of two rows), disjoint
    float16 cells of random values (rounded once to half), and an empty cell."""
    got, want = [], []
    x32 = special_values(np.float32)[..., :4].copy()
    x16 = random_value(rng, (2, 9, 8, 8), np.float16) * np.float16(1.1)
    calls = [(x32, [0, 2, 3, 5, 7, 9], [0, 1, 3, 4, 6, 8], True, dict(chunk_rows=2)),
             (x16, [0, 2, 3, 5, 7, 9], [0, 1, 3, 4, 6, 8], False, {}),
             (x16, [0, 3, 3, 9], [0, 8], False, {})]
    for x, rows, cols, overlapping, force in calls:
        g = geometry(x.shape, rows, cols, overlapping)
        for op in OPS:
            got.append(comparable_bits(to_host(getattr(launcher(), op)(g, to_gpu(x), **force))).reshape(-1).view(np.uint8))
            want.append(comparable_bits(numpy_result(op, x, rows, cols, overlapping)).reshape(-1).view(np.uint8))
    return np.concatenate(got), np.concatenate(want)


PLANTED = {  # name -> (text of the real source, its replacement)
    "max-ties-go-to-the-last": ("if (best < x) best = x;", "if (best <= x) best = x;"),
    "max-takes-nan": ("if (best < x) best = x;", "if (!(x <= best)) best = x;"),
    "scan-drops-the-last-row": ("for (I y = first_row; y <= last_row; ++y)", "for (I y = first_row; y < last_row; ++y)"),
    "scan-drops-the-last-column": ("const I rest = last_col - x + 1;", "const I rest = last_col - x;"),
    "scan-groups-only-wider-rows": ("for (; last_col - x >= kColumnLoads - 1;", "for (; last_col - x >= kColumnLoads;"),
    "scan-visits-a-group-out-of-order": ("for (int k = 0; k < kColumnLoads; ++k) visit(packs[k]);",
                                         "for (int k = kColumnLoads - 1; k >= 0; --k) visit(packs[k]);"),
    "avg-counts-one-column-less": ("(last_row - first_row + 1) * (last_col - first_col + 1)",
                                   "(last_row - first_row + 1) * (last_col - first_col)"),
    "half-mean-truncated": ("return __float2half_rn(s / Counter<float>::of(count));",
                            "return __float2half_rz(s / Counter<float>::of(count));"),
    "next-row-of-cells-one-output-row-short": ("r < r1; ++r, out += out_row) {", "r < r1; ++r, out += out_row - depth) {"),
}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_bugs_fail_the_comparison(bug, tmp_path, monkeypatch):
    text, replacement = PLANTED[bug]
    cuda_host.assert_planted_bug_caught(launcher().SOURCE, (text, replacement),
                                        lambda: planted_problem(np.random.default_rng(5)),
                                        lambda got, want: np.testing.assert_array_equal(got, want), 5, tmp_path,
                                        monkeypatch)
