"""The few-rows GEMM on the CUDA cores (sections/gemm_rows.py): its schedule (pure Python), the rule that takes it,
its kernel and reduction lowering and compiling for any N and K (CPU), its results on odd sizes (GPU)."""

from dataclasses import replace

import pytest

import tourkit
from sections import fusion, gemm_schedules
from sections.gemm_plans import GemmLauncher, RowsConfig, plan_problem, rivals
from sections.gemm_rows import ROWS_MAX, UNROLLED_SPLITS, rows_program, rows_schedule, widest_vector

H200 = dict(family="hopper", sm_count=132, smem_budget=232448)
SHAPES = [(1, 4097, 4096), (1, 4096, 4096), (2, 1025, 8191), (8, 11007, 4096), (1, 50257, 4096), (1, 128, 32768),
          (3, 7, 5), (1, 1, 1), (8, 64, 100000), (4, 14336, 4096)]


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_the_schedule_loads_aligned_vectors_and_spreads_b_over_the_sms(M, N, K):
    """Loads no wider than every row of B keeps aligned; 64 rows' worth of 2-byte loads in flight a thread (8
    rows of 16-byte vectors); enough blocks for the SMs where B has the columns and rows for them, each group
    of threads at least two steps of K, and no more runs than the reduction unrolls."""
    config = rows_schedule(M, N, K, 132)
    assert N % config.vec == 0 and config.vec * config.block_K == 64
    assert config.vec == 1 or config.lanes * config.vec <= N
    rows = config.groups * config.block_K
    assert 1 <= config.split_k <= UNROLLED_SPLITS
    assert config.split_k == 1 or K // config.split_k >= 2 * rows
    strips = -(-N // config.block_N)
    if strips * K >= 4 * 132 * 2 * rows * 16:  # room for 4 blocks an SM with a split that keeps the partials small
        assert strips * config.split_k >= 2 * 132, (strips, config)


def test_widest_vector_keeps_every_row_aligned_and_a_warp_busy():
    assert [widest_vector(n) for n in (4096, 4100, 4098, 4097, 128, 64, 8)] == [8, 4, 2, 1, 4, 2, 1]


def test_a_few_rows_take_the_cuda_cores_on_hopper_and_are_timed_beside_the_tensor_cores():
    for M, N, K in [(1, 4096, 4096), (ROWS_MAX, 4097, 4095), (3, 7, 5)]:
        plan = plan_problem(M, N, K, **H200)
        assert isinstance(plan.config, RowsConfig) and not plan.pad and not plan.padded
        assert "CUDA cores" in plan.describe() and "blocks on 132 SMs" in plan.describe()
        (rival,) = rivals(plan, "hopper", 132, H200["smem_budget"])
        assert not isinstance(rival.config, RowsConfig) and rival.M == M
    assert not isinstance(plan_problem(ROWS_MAX + 1, 4096, 4096, **H200).config, RowsConfig)
    for family, budget in [("ampere", 166912), ("turing", 65536)]:  # not measured there: tensor cores as before
        assert not isinstance(plan_problem(1, 4096, 4096, family, 108, budget).config, RowsConfig)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("shape,dtype,epilogue", [((1, 4097, 4096), "float16", False), ((3, 7, 5), "float16", True),
                                                  ((8, 11007, 4096), "bfloat16", True), ((2, 4096, 4095), "float16", False)])
def test_the_kernel_and_its_reduction_lower_for_any_n_and_k(arch, shape, dtype, epilogue):
    """Split or not, with bias + GELU (in the kernel, or in the reduction after a split): every program lowers,
    fits its declared shared memory, and has no tensor-core instruction."""
    plan = plan_problem(*shape, **H200, dtype=dtype)
    activation = "gelu" if epilogue else None
    programs = plan.programs(bias=epilogue, activation=activation)
    assert set(programs) == {"gemm"} | ({"reduce"} if plan.config.split_k > 1 else set())
    for part, func in programs.items():
        report = tourkit.inspect_kernel(part, func, arch, pass_configs=plan.pass_configs(part, activation), nvcc=False)
        assert report.smem_bytes <= plan.config.smem_bytes() and report.markers.get("wgmma", 0) == 0


@pytest.mark.parametrize("shape", [(1, 4097, 4096), (8, 4096, 4096), (5, 777, 333)])
def test_the_kernel_compiles_with_nvcc_without_spilling(shape):
    """Every thread's sums of all M rows stay in registers: the loops over them are unrolled."""
    plan = plan_problem(*shape, **H200)
    report = tourkit.inspect_kernel("gemm", plan.programs(bias=True, activation="gelu")["gemm"], "sm_90a",
                                    pass_configs=plan.pass_configs("gemm", "gelu"))
    if report.nvcc.startswith("not run"):
        pytest.skip("nvcc not found")
    assert report.nvcc == "compiled" and report.spill_stores == 0, report.nvcc


def test_a_config_that_cannot_load_its_vectors_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        rows_program(1, 4097, 64, RowsConfig(vec=8))
    with pytest.raises(ValueError, match="at most"):
        rows_program(ROWS_MAX + 1, 4096, 64, RowsConfig())


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype", [(1, 4097, 4095, "float16"), (8, 11007, 4096, "bfloat16"), (5, 777, 333, "float16"),
                                         (1, 50257, 768, "bfloat16"), (8, 64, 100000, "float16"), (1, 1, 1, "float16"),
                                         (2, 4096, 4096, "float16"), (7, 130, 9, "float16")])
@pytest.mark.parametrize("epilogue,split", [(False, None), (True, None), (True, 1)])
def test_the_kernel_is_correct_on_odd_sizes(M, N, K, dtype, epilogue, split):
    """The rule's schedule, and the same without a K split (one block a strip, C written by the kernel)."""
    import tilelang

    device = tourkit.detect_device()
    plan = plan_problem(M, N, K, "hopper", device.sm_count, device.smem_per_block_optin, dtype)
    if split is not None:
        plan = replace(plan, config=replace(plan.config, split_k=split))
    activation = "gelu" if epilogue else None
    kernels = {part: tilelang.compile(f, out_idx=None, target="cuda", pass_configs=plan.pass_configs(part, activation))
               for part, f in plan.programs(bias=epilogue, activation=activation).items()}
    run = GemmLauncher(plan, kernels)
    a, b, bias, c = fusion.fused_inputs(M, N, K, seed=11, dtype=dtype)
    ref = gemm_schedules.reference(a, b, bias if epilogue else None, activation)
    call = (lambda: run(a, b, bias, c)) if epilogue else (lambda: run(a, b, c))
    check = tourkit.validate(f"{M}x{N}x{K} {dtype}", call, c, ref, gemm_schedules.TOLERANCE)
    assert check.passed, check.line()
