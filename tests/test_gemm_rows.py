"""The few-rows GEMM on the CUDA cores (sections/gemm_rows.py): its schedule (pure Python), the rule that takes it,
its kernel and reduction lowering and compiling for any N and K, and their generated CUDA run on the CPU
(tests/cuda_on_cpu.py) against a float64 reference; its results on odd sizes on a GPU."""

from dataclasses import replace

import pytest

import tourkit
from sections import gemm_schedules
from sections.gemm_plans import GemmPlan, RowsConfig, plan_problem, rivals
from sections.gemm_epilogue import LAST_ADDS_BYTES
from sections.gemm_rows import ACC_REGISTERS, ROWS_MAX, UNROLLED_SPLITS, rows_program, rows_schedule, takes_rows, widest_vector

H200 = dict(family="hopper", sm_count=132, smem_budget=232448)
SHAPES = [(1, 4097, 4096), (1, 4096, 4096), (2, 1025, 8191), (8, 11007, 4096), (1, 50257, 4096), (1, 128, 32768),
          (3, 7, 5), (1, 1, 1), (8, 64, 100000), (4, 14336, 4096)]


@pytest.mark.parametrize("M,N,K", SHAPES)
def test_the_schedule_loads_aligned_vectors_and_spreads_b_over_the_sms(M, N, K):
    """Loads no wider than every row of B keeps aligned; 64 rows' worth of 2-byte loads in flight a thread (8
    rows of 16-byte vectors); enough blocks for the SMs where B has the columns and rows for them; runs of K
    of at least a step each, none left empty, and no more than the reduction unrolls."""
    config = rows_schedule(M, N, K, 132)
    assert N % config.vec == 0 and config.vec * config.block_K == 64
    assert config.vec == 1 or config.lanes * config.vec <= N
    rows = config.groups * config.block_K
    assert 1 <= config.split_k <= UNROLLED_SPLITS
    assert config.split_k == 1 or K // config.split_k >= rows
    assert config.split_k * config.run(K) >= K > (config.split_k - 1) * config.run(K)  # every run has rows of K
    strips = -(-N // config.block_N)
    if strips * K >= 4 * 132 * 2 * rows * 16:  # room for 4 blocks an SM with a split that keeps the partials small
        assert strips * config.split_k >= 2 * 132, (strips, config)
    # a strip's runs added by its last block where their partials are small
    partials = config.split_k * M * min(config.block_N, N) * 4
    assert config.last_adds == (config.split_k > 1 and partials <= LAST_ADDS_BYTES)


def test_more_rows_than_the_rule_takes_narrow_the_loads_and_size_the_shared_memory():
    """Past ROWS_MAX (the probe times up to KERNEL_ROWS_MAX): at most ACC_REGISTERS sums a thread, half the bytes
    in flight, shared memory for the rows asked; a config built for fewer rows refuses more."""
    for M, N, K in [(12, 1000, 1001), (25, 212, 14336), (32, 777, 5000)]:
        config = rows_schedule(M, N, K, 132)
        assert M * config.vec <= ACC_REGISTERS and config.vec * config.block_K == 32 and config.rows >= M
        assert config.smem_bytes() > rows_schedule(1, N, K, 132).smem_bytes()
    with pytest.raises(ValueError, match="at most 8 rows"):
        rows_program(12, 1000, 1001, rows_schedule(8, 1000, 1001, 132))


def test_widest_vector_keeps_every_row_aligned_and_a_warp_busy():
    assert [widest_vector(n) for n in (4096, 4100, 4098, 4097, 128, 64, 8)] == [8, 4, 2, 1, 4, 2, 1]


def rows_plan(M, N, K, dtype="float16", sm_count=H200["sm_count"]):
    """The few-rows kernel with its schedule for a problem, whether or not the rule would take it."""
    return GemmPlan(M, N, K, rows_schedule(M, N, K, sm_count), dtype, pad=False)


def test_a_few_rows_take_the_cuda_cores_on_hopper_and_are_timed_beside_the_tensor_cores():
    """One or two rows whatever their alignment; up to ROWS_MAX where N or K is not a multiple of 8."""
    for M, N, K in [(1, 4096, 4096), (2, 8192, 8192), (ROWS_MAX, 4097, 4095), (3, 7, 5), (5, 4096, 4097)]:
        plan = plan_problem(M, N, K, **H200)
        assert isinstance(plan.config, RowsConfig) and not plan.pad and not plan.padded
        assert "CUDA cores" in plan.describe() and "blocks on 132 SMs" in plan.describe()
        (rival,) = rivals(plan, "hopper", 132, H200["smem_budget"])
        assert not isinstance(rival.config, RowsConfig) and rival.M == M
    for M, N, K in [(ROWS_MAX + 1, 4096, 4096), (ROWS_MAX + 1, 4097, 4095), (3, 4096, 4096), (ROWS_MAX, 14336, 4096)]:
        assert not takes_rows(M, N, K)
        assert not isinstance(plan_problem(M, N, K, **H200).config, RowsConfig)
    for family, budget in [("ampere", 166912), ("turing", 65536)]:  # not measured there: tensor cores as before
        assert not isinstance(plan_problem(1, 4096, 4096, family, 108, budget).config, RowsConfig)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("shape,dtype,epilogue", [((1, 4097, 4096), "float16", False), ((3, 7, 5), "float16", True),
                                                  ((8, 11007, 4096), "bfloat16", True), ((2, 4096, 4095), "float16", False)])
@pytest.mark.parametrize("last_adds", [False, True])
def test_the_kernel_and_its_reduction_lower_for_any_n_and_k(arch, shape, dtype, epilogue, last_adds):
    """Split or not, with bias + GELU (in the kernel, or in the reduction after a split): every program lowers,
    fits its declared shared memory, and has no tensor-core instruction. With last_adds, one program: a split's
    runs added by the last block to arrive, counted by an atomic between fences."""
    plan = rows_plan(*shape, dtype)
    plan = replace(plan, config=replace(plan.config, last_adds=last_adds))
    activation = "gelu" if epilogue else None
    programs = plan.programs(bias=epilogue, activation=activation)
    split = plan.config.split_k > 1
    assert tuple(programs) == plan.parts == ("gemm",) + (("reduce",) if split and not last_adds else ())
    for part, func in programs.items():
        report = tourkit.inspect_kernel(part, func, arch, pass_configs=plan.pass_configs(part, activation), nvcc=False)
        assert report.smem_bytes <= plan.config.smem_bytes() and report.markers.get("wgmma", 0) == 0
    atomics = split and last_adds
    assert ("AtomicAddRet" in report.source) == atomics and ("__threadfence" in report.source) == atomics


@pytest.mark.parametrize("shape", [(1, 4097, 4096), (8, 4096, 4096), (5, 777, 333)])
def test_the_kernel_compiles_with_nvcc_without_spilling(shape):
    """Every thread's sums of all M rows stay in registers: the loops over them are unrolled."""
    plan = rows_plan(*shape)
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


def cpu_product(plan, a, b, bias=None, activation=None):
    """C as the plan's generated CUDA computes it, run on the CPU (tests/cuda_on_cpu.py): the GEMM, then with a
    K split the reduction of its partials. With last_adds the one kernel runs twice, its blocks in one order and
    then the other, so each strip's last run to arrive is a different one, and the arrival counts must be back
    at 0 after each call. Operands and C in the plan's dtype (bfloat16: uint16 bits)."""
    import numpy as np

    import cuda_on_cpu

    M, N, _ = plan.kernel_shape
    reports = {part: tourkit.inspect_kernel(part, func, "sm_90a", pass_configs=plan.pass_configs(part, activation),
                                            nvcc=False)
               for part, func in plan.programs(bias=bias is not None, activation=activation).items()}
    nan = np.nan if a.dtype == np.float16 else 0x7FC0  # bfloat16's NaN bits: a C the kernels leave unwritten fails
    epilogue, split = {} if bias is None else {"Bias": bias}, plan.config.split_k
    c, w = np.full((M, N), nan, a.dtype), np.full((split, M, N), np.nan, np.float32)
    if split == 1:
        cuda_on_cpu.run(reports["gemm"], {"A": a, "B": b, "C": c, **epilogue})
        return c
    if "reduce" in reports:
        cuda_on_cpu.run(reports["gemm"], {"A": a, "B": b, "C": w})
        cuda_on_cpu.run(reports["reduce"], {"W": w, "C": c, **epilogue})
        return c
    arrays = {"A": a, "B": b, "Arrivals": np.zeros(-(-N // plan.config.block_N), np.int32), **epilogue}
    results = []
    for reverse in (False, True):
        arrays.update(W=w.copy(), C=c.copy())
        cuda_on_cpu.run(reports["gemm"], arrays, reverse=reverse)
        assert not arrays["Arrivals"].any(), arrays["Arrivals"]
        results.append(arrays["C"])
    assert np.array_equal(*results)  # the runs added in the same order whichever arrived last
    return results[0]


@pytest.mark.parametrize("M,N,K,split,epilogue,dtype", [
    (3, 1000, 777, None, False, "float16"), (3, 1000, 777, None, True, "float16"), (1, 37, 300, None, True, "float16"),
    (8, 130, 129, None, False, "float16"), (2, 4097, 95, None, False, "float16"), (5, 77, 2000, None, True, "float16"),
    (4, 200, 1000, 1, True, "float16"), (6, 333, 1500, None, True, "bfloat16"), (1, 64, 70, 1, False, "bfloat16"),
    (7, 130, 9, None, True, "float16"), (7, 130, 9, 3, False, "float16"), (2, 1025, 4001, None, True, "bfloat16"),
    (6, 333, 1500, 4, True, "float16"), (25, 212, 700, None, True, "bfloat16"), (12, 100, 101, 2, False, "float16"),
    (32, 77, 300, None, False, "float16")])  # the last three: more rows than the rule gives the kernel
@pytest.mark.parametrize("last_adds", [False, True])
def test_the_generated_cuda_computes_the_product(M, N, K, split, epilogue, dtype, last_adds):
    """The kernel TileLang writes for the rule's schedule (and for one without a K split), with a split's runs
    added by a second kernel or by the last block to arrive, run on the CPU: every index, guard, barrier and
    atomic as generated, against a float64 reference on random inputs."""
    import math

    import numpy as np

    import cuda_on_cpu

    if cuda_on_cpu.host_compiler() is None:
        pytest.skip("no host C++ compiler")
    plan = rows_plan(M, N, K, dtype)
    if split is not None:
        plan = replace(plan, config=replace(plan.config, split_k=split))
    if last_adds and plan.config.split_k == 1:
        pytest.skip("no K split: nothing to add")
    plan = replace(plan, config=replace(plan.config, last_adds=last_adds))
    rng = np.random.default_rng(M * N + K)
    if dtype == "float16":
        encode, decode = (lambda x: x.astype(np.float16)), (lambda x: x.astype(np.float64))
    else:
        encode, decode = cuda_on_cpu.to_bfloat16_bits, (lambda x: cuda_on_cpu.from_bfloat16_bits(x).astype(np.float64))
    a, b = encode(rng.standard_normal((M, K))), encode(rng.standard_normal((K, N)) / K ** 0.5)
    bias = encode(rng.standard_normal(N)) if epilogue else None
    c = decode(cpu_product(plan, a, b, bias, "gelu" if epilogue else None))
    ref = decode(a) @ decode(b) + (0 if bias is None else decode(bias))
    if epilogue:
        ref = ref * 0.5 * (1 + np.vectorize(math.erf)(ref / math.sqrt(2)))
    error = np.linalg.norm(c - ref) / np.linalg.norm(ref)
    print(f"{M}x{N}x{K} {dtype}: rel. error {error:.2e}")
    assert error < gemm_schedules.TOLERANCE, (plan.config, error)


def test_the_cpu_harness_runs_a_lesson_kernel_and_refuses_tensor_core_ones():
    """Its own check: the vector_add lesson's kernel adds; a tensor-core kernel is refused, not mis-run."""
    import numpy as np

    import cuda_on_cpu
    from sections import vector_add

    if cuda_on_cpu.host_compiler() is None:
        pytest.skip("no host C++ compiler")
    n = 3000
    report = tourkit.inspect_kernel("add", vector_add.vector_add_program(n), "sm_90a", nvcc=False)
    a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
    c = np.zeros(n, np.float32)
    cuda_on_cpu.run(report, {"A": a, "B": b, "C": c})
    assert np.array_equal(c, a + b)
    tensor_core = plan_problem(64, 256, 256, **H200)
    report = tourkit.inspect_kernel("gemm", tensor_core.programs()["gemm"], "sm_90a", nvcc=False)
    with pytest.raises(ValueError, match="not a plain kernel"):
        cuda_on_cpu.run(report, {"A": a, "B": b, "C": c})


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype", [(1, 4097, 4095, "float16"), (8, 11007, 4096, "bfloat16"), (5, 777, 333, "float16"),
                                         (1, 50257, 768, "bfloat16"), (8, 64, 100000, "float16"), (1, 1, 1, "float16"),
                                         (2, 4096, 4096, "float16"), (7, 130, 9, "float16"), (4, 4096, 4096, "float16")])
@pytest.mark.parametrize("epilogue,split,last_adds", [(False, None, False), (True, None, False), (True, 1, False),
                                                     (False, None, True), (True, None, True)])
def test_the_kernel_is_correct_on_odd_sizes(M, N, K, dtype, epilogue, split, last_adds):
    """The kernel's schedule, the same without a K split (one block a strip, C written by the kernel), and with
    its split's runs added by the last block to arrive (checked after two calls: the counts must go back to 0)."""
    from test_gemm_shapes import check_on_gpu

    plan = rows_plan(M, N, K, dtype, tourkit.detect_device().sm_count)
    if split is not None:
        plan = replace(plan, config=replace(plan.config, split_k=split))
    if last_adds and plan.config.split_k == 1:
        pytest.skip("no K split: nothing to add")
    check_on_gpu(replace(plan, config=replace(plan.config, last_adds=last_adds)), epilogue, seed=11)
