"""gemm_schedules: the builder's API, schedule choice, shared-memory estimate and codegen (CPU); odd sizes (GPU)."""

import pytest

import tilelang_tour
import tourkit
from sections.gemm_schedules import (GemmConfig, compile_gemm, default_schedules, fits, gemm_flops, gemm_program,
                                     reference)

HOPPER_DEFAULT = default_schedules("hopper")[0]
AMPERE_DEFAULT = default_schedules("ampere")[0]
EXPECTED = {"sm_80": ["cp_async", "ldmatrix", "mma_sync"], "sm_90a": ["wgmma", "tma_load", "mbarrier"]}
DEFAULT_FOR = {"sm_80": AMPERE_DEFAULT, "sm_90a": HOPPER_DEFAULT}


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def compiled_report(request):
    """The default schedule of the arch's family at a ragged size, lowered and nvcc-compiled once."""
    arch = request.param
    config = DEFAULT_FOR[arch]
    return arch, config, tourkit.inspect_kernel("gemm", gemm_program(1000, 1000, 1000, config), arch)


def test_kernel_lowers_and_compiles_with_the_expected_instructions(compiled_report):
    arch, config, report = compiled_report
    assert report.nvcc == "compiled"
    tourkit.require_markers(report, EXPECTED[arch])
    assert report.markers["rasterization"] > 0  # swizzle on
    if arch == "sm_90a":
        assert report.threads == config.threads + 128  # the producer warpgroup added by warp specialization
        assert report.markers["mma_sync"] == 0
    else:
        assert report.threads == config.threads
        assert report.markers["wgmma"] == 0 and report.markers["tma_load"] == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("config", [
    GemmConfig(128, 256, 64, 3, 256, True),
    GemmConfig(128, 128, 32, 4, 128, False),
    GemmConfig(64, 128, 64, 2, 128, True, staged_store=False),
    GemmConfig(64, 256, 32, 4, 128, True, policy="FullRow"),
    GemmConfig(128, 256, 64, 3, 256, True, panel=8, persistent=132),
])
@pytest.mark.parametrize("bias", [False, True])
def test_smem_estimate_bounds_the_lowered_kernel(arch, config, bias):
    func = gemm_program(512, 512, 512, config, bias=bias, activation="gelu" if bias else None)
    report = tourkit.inspect_kernel("gemm", func, arch, nvcc=False)
    pipeline = config.num_stages * (config.block_M + config.block_N) * config.block_K * 2
    assert pipeline <= report.smem_bytes <= config.smem_bytes()
    if not (config.persistent and arch == "sm_80"):  # there the planner still lets C reuse the A/B buffers
        assert config.smem_bytes() - report.smem_bytes < 4096  # an upper bound, but a tight one


def test_persistent_kernel_launches_one_block_per_sm_and_walks_the_tiles():
    config = GemmConfig(128, 256, 64, 3, 256, True, panel=8, persistent=114)
    report = tourkit.inspect_kernel("gemm", gemm_program(1000, 1000, 1000, config, bias=True, activation="gelu"),
                                    "sm_90a", nvcc=False)
    assert report.grid == (114, 1, 1) or list(report.grid) == [114, 1, 1]
    tourkit.require_markers(report, EXPECTED["sm_90a"])
    assert "exp2f(" in report.source and " < 32" in report.source  # 8 x 4 tiles of 128x256 cover 1000x1000
    assert config.label().endswith("persistent114")
    sized = [c for c in default_schedules("hopper", sm_count=78) if c.persistent]
    assert [c.persistent for c in sized] == [78]


def test_schedule_tables_differ_by_family_and_filter_by_budget():
    hopper, ampere = default_schedules("hopper"), default_schedules("ampere")
    assert len(hopper) >= 6 and len(ampere) >= 6 and len(default_schedules("turing")) >= 6
    assert hopper != ampere and default_schedules("ada") == ampere
    assert fits(HOPPER_DEFAULT, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)
    assert not fits(HOPPER_DEFAULT, tourkit.ARCH_SPECS["sm_86"].smem_per_block_optin)
    for family, arch in (("hopper", "sm_90a"), ("ampere", "sm_80"), ("ampere", "sm_86"), ("turing", "sm_75")):
        budget = tourkit.ARCH_SPECS[arch].smem_per_block_optin
        table = default_schedules(family)
        assert fits(table[0], budget) or arch == "sm_86"
        assert any(not fits(c, budget) for c in table)  # the table shows what a skip looks like
    with pytest.raises(ValueError, match="family"):
        default_schedules("volta")


def test_labels_and_flops():
    assert HOPPER_DEFAULT.label().startswith(f"{HOPPER_DEFAULT.block_M}x{HOPPER_DEFAULT.block_N}x")
    assert GemmConfig(128, 256, 64, 4, 256, True).label() == "128x256x64 s4 t256 swz"
    assert GemmConfig(128, 256, 64, 4, 256, False).label() == "128x256x64 s4 t256 noswz"
    assert gemm_flops(2, 3, 4) == 48


@pytest.mark.parametrize("M,N,K,activation", [(0, 64, 64, None), (64, 1001, 64, None), (64, 64, 1001, None),
                                               (64, 64, 64, "relu")])
def test_bad_problems_are_rejected_clearly(M, N, K, activation):
    with pytest.raises(ValueError):
        gemm_program(M, N, K, HOPPER_DEFAULT, activation=activation)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_section_compile_only_through_the_runner(arch):
    run = tilelang_tour.main(["--only", "gemm_schedules", "--compile-only", "--arch", arch])
    result = run.results[0]
    assert result.status == "passed", result.error_message
    assert result.headline["schedules"] >= 6


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------


def _local_default():
    device = tourkit.detect_device()
    budget = device.smem_per_block_optin
    return next(c for c in default_schedules(device.family) if fits(c, budget))


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (1001, 1032, 1000), (128, 256, 72), (2048, 2048, 2048)])
def test_gemm_is_correct_on_the_gpu_including_ragged_sizes(M, N, K):
    import torch

    config = _local_default()
    kernel = compile_gemm(M, N, K, config)
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    c = torch.empty((M, N), dtype=torch.float16, device="cuda")
    check = tourkit.validate(f"{M}x{N}x{K}", lambda: kernel(a, b, c), c, reference(a, b), 5e-3)
    assert check.passed, check.line()


def test_three_consumer_warpgroups_split_the_registers_explicitly():
    """256x192 on 384 threads: TileLang adds a producer warpgroup (512 threads); the kernel asks for 160
    registers a consumer thread, so that 3 x 128 x 160 + 128 x 24 fits the SM's 65536."""
    from sections.gemm_schedules import PRODUCER_REGISTERS, consumer_registers

    config = next(c for c in default_schedules("hopper") if c.threads == 384)
    report = tourkit.inspect_kernel("gemm", gemm_program(1000, 1000, 1000, config), "sm_90a", nvcc=False)
    assert report.threads == 512
    assert f"reg_alloc<{consumer_registers(384)}>" in report.source and "reg_dealloc<24>" in report.source
    assert 384 * consumer_registers(384) + 128 * PRODUCER_REGISTERS <= 65536
    assert consumer_registers(256) == 240  # two consumer warpgroups keep TileLang's default
