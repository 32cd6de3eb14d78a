"""vector_add: codegen (vectorized, predicated tail) and the runner in compile-only mode (CPU); exactness (GPU)."""

import pytest

import tilelang_tour
import tourkit
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
