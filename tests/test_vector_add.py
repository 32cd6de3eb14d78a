"""vector_add: codegen (vectorized, predicated tail) and the runner in compile-only mode (CPU); exactness (GPU)."""

import pytest

import tilelang_tour
import tourkit
from sections import vector_add
from sections.vector_add import DEFAULT, SCHEDULES, AddConfig, compile_vector_add, vector_add_program


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def reports(request):
    arch = request.param
    return {n: tourkit.inspect_kernel(f"add {n}", vector_add_program(n), arch) for n in (2**20, 2**20 + 3)}


def test_aligned_size_uses_16_byte_accesses(reports):
    report = reports[2**20]
    assert report.nvcc == "compiled"
    assert report.source.count("float4") >= 3  # loads of A and B, store of C
    assert report.threads == DEFAULT.threads
    assert report.grid[0] == 2**20 // DEFAULT.block_size


def test_ragged_size_is_predicated(reports):
    report = reports[2**20 + 3]
    assert report.nvcc == "compiled"
    assert str(2**20 + 3) in report.source  # the bounds check against N
    assert report.grid[0] == -(-(2**20 + 3) // DEFAULT.block_size)


def test_configs():
    assert AddConfig(256, 8).block_size == 2048
    assert len(set(SCHEDULES)) == len(SCHEDULES) and DEFAULT == SCHEDULES[0]
    with pytest.raises(ValueError):
        vector_add_program(0)


def test_kernels_declared_for_a_run_are_what_it_checks_and_times():
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    ctx = tourkit.TourContext(device=device, echo=False)
    names = [d.name for d in vector_add.kernels(ctx)]
    n = vector_add.bench_size(ctx)
    assert n == 2**28 and len(set(names)) == len(names)
    assert names == [vector_add.kernel_name(m, DEFAULT) for m in vector_add.check_sizes(ctx)] + \
        [vector_add.kernel_name(n, c) for c in SCHEDULES]
    compile_only = tourkit.TourContext(arch="sm_80", compile_only=True, echo=False)
    assert [d.name for d in vector_add.kernels(compile_only)] == [vector_add.kernel_name(m, DEFAULT) for m in (2**20, 2**20 + 3)]


def test_benchmark_times_every_contender_in_one_call(monkeypatch):
    import torch

    calls = []

    def fake_bench(fns, **kwargs):
        calls.append(list(fns))
        return {name: (0.5 if name == "copy_(a)" else 1.0) for name in fns}

    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    monkeypatch.setattr(tourkit, "random_tensor", lambda shape, dtype: torch.randn(shape, dtype=dtype))  # CPU
    monkeypatch.setattr(tourkit, "validate", lambda *a: tourkit.Check("fake", 0.0, 0.0))
    ctx = tourkit.TourContext(echo=False)
    kernels = {vector_add.kernel_name(1000, c): (lambda a, b, c: None) for c in SCHEDULES}
    vector_add.benchmark(ctx, kernels, 1000)
    assert calls == [["torch.add(a, b)", "copy_(a)"] + [c.label() for c in SCHEDULES]]
    assert ctx.headlines["vs_torch"] == 1.0 and ctx.headlines["of_copy"] == 0.75  # 3 vs 2 vectors, half the time
    assert "elems/thread" in "\n".join(ctx.report)


def test_section_compile_only_through_the_runner():
    run = tilelang_tour.main(["--only", "vector_add", "--compile-only", "--arch", "sm_80"])
    assert run.results[0].status == "passed", run.results[0].error_message


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 7, 1000, 2**20 + 3, 2**22])
@pytest.mark.parametrize("config", SCHEDULES[:2])
def test_vector_add_is_exact_on_the_gpu(n, config):
    import torch

    kernel = compile_vector_add(n, config)
    a = tourkit.random_tensor((n,), torch.float32, seed=1)
    b = tourkit.random_tensor((n,), torch.float32, seed=2)
    c = torch.empty_like(a)
    check = tourkit.validate(f"N={n}", lambda: kernel(a, b, c), c, a + b, tolerance=0.0)
    assert check.passed, check.line()
