"""gemm_schedules: the lesson's builder, schedules, shared-memory estimate, codegen and report (CPU); odd sizes (GPU)."""

import pytest

import tilelang_tour
import tourkit
from sections import gemm_schedules
from sections.gemm_schedules import (GemmConfig, compile_gemm, fits, gemm_flops, gemm_program, lesson_schedules,
                                     reference, wave_traffic)

EXPECTED = {"sm_80": ["cp_async", "ldmatrix", "mma_sync"], "sm_90a": ["wgmma", "tma_load", "mbarrier"],
            "sm_75": ["ldmatrix", "mma_sync"]}
FAMILY = {"sm_80": "ampere", "sm_90a": "hopper", "sm_75": "turing"}


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def compiled_report(request):
    """The default schedule of the arch's family at a ragged size, lowered and nvcc-compiled once."""
    arch = request.param
    config = lesson_schedules(FAMILY[arch])[0]
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


LOWERED = [(arch, c, False) for arch in ("sm_90a", "sm_80", "sm_75") for c in lesson_schedules(FAMILY[arch])]
LOWERED += [("sm_90a", lesson_schedules("hopper")[0], True), ("sm_80", lesson_schedules("ampere")[0], True),
            ("sm_90a", GemmConfig(64, 128, 64, 2, 128, True, staged_store=False), False)]


@pytest.mark.parametrize("arch,config,epilogue", LOWERED, ids=lambda p: p.label() if hasattr(p, "label") else str(p))
def test_every_lesson_schedule_lowers_within_its_smem_estimate(arch, config, epilogue):
    func = gemm_program(1001, 1032, 1000, config, bias=epilogue, activation="gelu" if epilogue else None)
    report = tourkit.inspect_kernel("gemm", func, arch, nvcc=False)
    tourkit.require_markers(report, EXPECTED[arch])
    pipeline = config.num_stages * (config.block_M + config.block_N) * config.block_K * 2
    assert pipeline <= report.smem_bytes <= config.smem_bytes() < report.smem_bytes + 4096  # a tight bound
    assert report.markers["rasterization"] == (1 if config.swizzle else 0)
    assert ("exp2f(" in report.source) == epilogue


def test_three_consumer_warpgroups_split_the_registers_explicitly():
    """256x192 on 384 threads: TileLang adds a producer warpgroup (512 threads); the kernel asks for 160
    registers a consumer thread, so that 3 x 128 x 160 + 128 x 24 fits the SM's 65536."""
    from sections.gemm_schedules import PRODUCER_REGISTERS, consumer_registers

    config = next(c for c in lesson_schedules("hopper") if c.threads == 384)
    report = tourkit.inspect_kernel("gemm", gemm_program(1000, 1000, 1000, config), "sm_90a", nvcc=False)
    assert report.threads == 512
    assert f"reg_alloc<{consumer_registers(384)}>" in report.source and "reg_dealloc<24>" in report.source
    assert 384 * consumer_registers(384) + 128 * PRODUCER_REGISTERS <= 65536
    assert consumer_registers(256) == 240


def test_schedules_differ_by_family_fit_their_budgets_and_change_one_knob():
    hopper = lesson_schedules("hopper")
    # the measured Hopper schedules stay the lesson's: 128x256x64 s4 t256 first, and 256x192x64 FullCol
    assert hopper[0] == GemmConfig(128, 256, 64, 4, 256, True)
    assert GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol") in hopper
    assert any(not c.swizzle for c in hopper) and any(c.num_stages != hopper[0].num_stages for c in hopper)
    assert lesson_schedules("ada") == lesson_schedules("ampere") != hopper
    for family, arch in (("hopper", "sm_90a"), ("ampere", "sm_80"), ("ampere", "sm_86"), ("ada", "sm_89"),
                         ("turing", "sm_75")):
        table = lesson_schedules(family)
        assert 3 <= len(table) <= 5 and len(set(table)) == len(table)
        assert all(fits(c, tourkit.ARCH_SPECS[arch].smem_per_block_optin) for c in table)
    assert not fits(hopper[0], tourkit.ARCH_SPECS["sm_86"].smem_per_block_optin)
    with pytest.raises(ValueError, match="family"):
        lesson_schedules("volta")


def test_labels_columns_and_flops():
    config = GemmConfig(128, 256, 64, 4, 256, True)
    assert config.label() == "T.Pipelined 128x256x64, 4 stages, 256 threads, swizzle panel 10"
    assert GemmConfig(256, 192, 64, 4, 384, False, policy="FullCol").label().endswith("swizzle off, FullCol")
    assert config.columns() == {"kernel": "T.Pipelined", "tile": "128x256x64", "stages": 4, "threads": 256,
                                "swizzle": "panel 10", "policy": "Square"}
    assert gemm_flops(2, 3, 4) == 48


def test_wave_traffic_of_the_docstrings_example():
    """8192^3, 128x256 tiles, a wave of 132: 5 A panels and 32 B panels row by row, 10 and 14 swizzled."""
    row_major, swizzled = wave_traffic(8192, 8192, 8192, lesson_schedules("hopper")[0], 132)
    assert (row_major, swizzled) == (138 * 2**20, 76 * 2**20)


@pytest.mark.parametrize("M,N,K,activation", [(0, 64, 64, None), (64, 64, 64, "relu")])
def test_bad_problems_are_rejected_clearly(M, N, K, activation):
    with pytest.raises(ValueError):
        gemm_program(M, N, K, lesson_schedules("hopper")[0], activation=activation)
    with pytest.raises(ValueError, match="warp policy"):
        gemm_program(64, 64, 64, GemmConfig(64, 64, 32, 2, 128, True, policy="Diagonal"))


def test_declared_kernels_follow_the_arch():
    hopper = gemm_schedules.kernels(tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False))
    ampere = gemm_schedules.kernels(tourkit.TourContext(compile_only=True, arch="sm_86", echo=False))
    names = [d.name for d in hopper]
    reduce = sum(n.endswith("(reduce)") for n in names)  # the 77x1001x999 pick splits K: its partials' sum
    assert reduce == 1 and len(set(names)) == len(names) == 4 + 3 + 2 + reduce  # rows, odd sizes, the appendix twice
    assert sum("hand-written" in n for n in names) == 2 and not any("hand-written" in d.name for d in ampere)
    assert [d.nvcc for d in hopper].count(True) == 3  # the default, one ragged size, the appendix kernel
    assert all(d.smem_limit for d in hopper)
    assert all(d.markers == (() if d.name.endswith("(reduce)") else ("wgmma",) if "@77x1001x999" in d.name
                             else ("wgmma", "tma_load", "mbarrier")) for d in hopper)  # 77x1001x999: masked, no TMA
    assert hopper[-1].threads == 384 and hopper[0].threads == 256  # the appendix asks for its producer itself
    full = gemm_schedules.kernels(tourkit.TourContext(arch="sm_90a", echo=False))
    assert full[0].name.endswith("@8192x8192x8192")


def test_run_times_the_lesson_and_the_appendix_in_one_call_and_headlines_each(monkeypatch, fake_gemm_timing):
    speed = {"T.Pipelined 256x192x64": 1.0, "T.Pipelined 128x256x64, 4 stages, 256 threads, swizzle panel 10": 1.05,
             "hand-written": 0.95}
    calls = fake_gemm_timing(lambda label: next((v for k, v in speed.items() if label.startswith(k)), 1.2))
    monkeypatch.setattr(gemm_schedules, "check_odd_shapes", lambda ctx, built, configs: None)
    ctx = tourkit.TourContext(arch="sm_90a", echo=False)
    gemm_schedules.run(ctx)
    assert len(calls) == 1 and calls[0][0] == 8192 and calls[0][2] == gemm_schedules.ROUNDS
    assert len(calls[0][1]) == 6 and "hand-written" in calls[0][1][-1]  # four lesson schedules, the persistent walk
    assert "persistent on 132 SMs" in calls[0][1][-2]
    assert ctx.headlines["lesson"].startswith("T.Pipelined 256x192x64")  # the fastest lesson row in this run
    assert ctx.headlines["lesson_vs_cublas"] == 1.0 and ctx.headlines["appendix_vs_cublas"] == round(1 / 0.95, 3)
    assert any("kernel" in line and "tile (MxNxK)" in line and "vs cuBLAS" in line for line in ctx.report)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_section_compile_only_through_the_runner(arch):
    run = tilelang_tour.main(["--only", "gemm_schedules", "--compile-only", "--arch", arch])
    result = run.results[0]
    assert result.status == "passed", result.error_message
    assert result.headline["kernels"] == (10 if arch == "sm_90a" else 9)  # a split-K pick and its reduction; B copies


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (1001, 1032, 1000), (128, 256, 72), (2048, 2048, 2048)])
def test_gemm_is_correct_on_the_gpu_including_ragged_sizes(M, N, K):
    import torch

    device = tourkit.detect_device()
    config = next(c for c in lesson_schedules(device.family) if fits(c, device.smem_per_block_optin))
    kernel = compile_gemm(M, N, K, config)
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    c = torch.empty((M, N), dtype=torch.float16, device="cuda")
    check = tourkit.validate(f"{M}x{N}x{K}", lambda: kernel(a, b, c), c, reference(a, b), 5e-3)
    assert check.passed, check.line()
