"""The GEMM on users' problems: the rule that picks a schedule (pure Python), the padded and split-K launches
(CPU stand-ins for the kernels), the kernels lowering for ragged, skinny, tiny, unaligned and bfloat16
problems on sm_80 and sm_90a (a few through nvcc), the sections' --shape paths (CPU); correctness on odd
sizes (GPU)."""

import re
from dataclasses import replace

import pytest

import tourkit
from sections import gemm_epilogue as E
from sections.gemm_epilogue import LAST_ADDS_BYTES
from sections.gemm_rows import RowsConfig
from tourkit import ARCH_SPECS
from sections import autotune, fusion, gemm_schedules
from sections.gemm_plans import (CANDIDATES, ONE_WAVE_TILES, GemmConfig, GemmLauncher, GemmPlan, aligned, blocks_per_sm,
                                 candidate_schedules, check_problem, choose_schedule, estimate_seconds, fits,
                                 MASKED_MAX_THREADS, MASKED_STEP, fitted_to_k, gemm_pass_configs, k_steps,
                                 masked_seconds, masked_tile_fits, neighbours, plan_problem, tensor_core_plan)

H200 = dict(family="hopper", sm_count=132, smem_budget=232448)
BUDGETS = {"hopper": 232448, "ampere": 166912, "ada": 101376, "turing": 65536}
ODD = [(1, 1, 1), (7, 13, 5), (33, 4097, 65), (64, 8192, 1000), (2000, 3000, 4000), (1, 4096, 4096),
       (777, 4097, 1234), (100000, 64, 64), (64, 64, 100000)]


# ---- The rule --------------------------------------------------------------------------------------------


def pick(M, N, K, **machine):
    return choose_schedule(M, N, K, **{**H200, **machine})[0]


def test_big_problems_take_a_big_tile_whose_waves_come_out_whole():
    """The lesson's 128x256 tile, or 256x192 (three consumer warpgroups) where its waves fill the SMs better:
    5120x13824x5120 in 128x256 tiles is 16.36 waves (the last 64% empty), in 256x192 ones 10.91."""
    for shape in [(8192, 8192, 8192), (8192, 2048, 8192), (4096, 14336, 4096), (12288, 12288, 12288),
                  (4096, 4096, 1024)]:
        config = pick(*shape)
        assert (config.block_M, config.block_N, config.split_k) == (128, 256, 1), shape
    config = pick(5120, 13824, 5120)
    assert (config.block_M, config.block_N, config.threads, config.policy) == (256, 192, 384, "FullCol")


def test_skinny_problems_take_short_tiles_and_fill_the_sms():
    """Decode-like problems: tiles no taller than the problem (64 rows at least), and enough blocks (a split K
    where the tiles are few) for the SMs."""
    for M, N, K in [(64, 8192, 8192), (128, 4096, 11008), (1, 4096, 4096), (16, 5120, 5120), (256, 1024, 8192)]:
        config = pick(M, N, K)
        blocks = -(-M // config.block_M) * -(-N // config.block_N) * config.split_k
        assert config.block_M <= max(64, M) and 64 <= blocks <= 2 * 132, (M, N, K, config)
    assert pick(128, 4096, 11008).split_k > 1 and pick(1, 4096, 4096).split_k > 1


def test_mid_problems_weigh_wave_quantization():
    """2000x3000x4000: 128x256 tiles make 192 blocks, 1.45 waves of 132; 256x192 make 128, 0.97 waves.
    3000^3: 128x256 make 288 (2.18 waves), 192x192 make 256 (1.94); 1536^3 is under a wave with any tile:
    192x96 tiles make 128 blocks, where 128x192 make 96 and 128x256 72."""
    big = GemmConfig(128, 256, 64, 4, 256, True)
    for shape, tile in [((2000, 3000, 4000), (256, 192)), ((3000, 3000, 3000), (192, 192)),
                        ((1536, 1536, 1536), (192, 96)), ((3072, 768, 3072), (192, 96))]:
        config = pick(*shape)
        assert (config.block_M, config.block_N) == tile, shape
        assert estimate_seconds(*shape, config, "hopper", 132, 232448) < \
            estimate_seconds(*shape, big, "hopper", 132, 232448)


def test_problems_of_about_one_wave_of_128x128_tiles_take_them_with_whole_rows_per_warpgroup():
    for shape in [(1200, 1200, 1200), (512, 4096, 8192)]:
        config = pick(*shape)
        assert (config.block_M, config.block_N, config.policy, config.split_k) == (128, 128, "FullRow", 1), shape
        assert config.num_stages == 5 and not config.persistent, shape


def test_full_row_warpgroups_issue_64x128_wgmmas_on_a_128x128_tile():
    from tourkernels import lower_for_arch

    config = next(c for c in CANDIDATES["hopper"] if (c.block_M, c.block_N) == (128, 128))
    source = lower_for_arch(gemm_schedules.gemm_program(1024, 1024, 1024, config), "sm_90a",
                            gemm_pass_configs(config)).kernel_source
    assert "kFloat32, 64, 128, 16" in source and "kFloat32, 64, 64, 16" not in source  # M, N, K of one wgmma
    square = lower_for_arch(gemm_schedules.gemm_program(1024, 1024, 1024, replace(config, policy="Square")), "sm_90a",
                            gemm_pass_configs(config)).kernel_source
    assert "kFloat32, 64, 64, 16" in square


def test_one_wave_tiles_are_candidates_only_where_they_divide_the_problem_into_one_wave():
    """192x96 (three 64x96 warpgroups) is for problems it divides into at most a wave: not where a second wave
    is needed (2304x4608x2304: 576 blocks), nor where edge tiles would be partial (2131x1024x2048, 1000^3)."""
    for shape in [(1536, 1536, 1536), (3072, 768, 3072), (1536, 1536, 2048)]:
        blocks = [-(-shape[0] // c.block_M) * -(-shape[1] // c.block_N)
                  for c in candidate_schedules(*shape, **H200) if (c.block_M, c.block_N) in ONE_WAVE_TILES]
        assert blocks and max(blocks) <= 132, shape
    for shape in [(2304, 4608, 2304), (4096, 4096, 4096), (2000, 3000, 4000), (3072, 1536, 1536),
                  (2131, 1024, 2048), (2304, 1024, 2048), (1000, 1000, 1000), (1500, 1536, 777)]:
        tiles = {(c.block_M, c.block_N) for c in candidate_schedules(*shape, **H200)}
        assert not tiles & ONE_WAVE_TILES, shape
    assert (pick(2131, 1024, 2048).block_M, pick(2131, 1024, 2048).block_N) == (128, 192)


def test_three_warpgroup_tiles_run_whole_k_loops():
    """256x192 and 192x192 tiles take no split K: 1000x3000x8192 (16 tile columns, 8 rows of 128) fills a wave
    with unsplit 128x192 tiles."""
    for shape in [(1000, 3000, 8192), (512, 5120, 8192), (64, 8192, 8192), (2500, 1024, 8192)]:
        assert all(c.split_k == 1 for c in candidate_schedules(*shape, **H200) if c.threads > 256)
    config = pick(1000, 3000, 8192)
    assert (config.block_M, config.block_N, config.split_k) == (128, 192, 1)


def test_tall_narrow_problems_take_tall_narrow_tiles_and_only_they():
    """N no wider than 64 or 128 (a projection to a few features over millions of rows): 256x64 and 256x128
    tiles make half the blocks of 128-row ones with no zero columns; wider problems never take them."""
    for (M, N, K), tile in [((1_000_000, 64, 64), (256, 64)), ((100_000, 96, 300), (256, 128)),
                            ((20_000_000, 16, 16), (256, 64)), ((32768, 64, 64), (256, 64)),
                            ((1_000_000, 64, 200), (256, 64))]:
        config = pick(M, N, K)
        assert (config.block_M, config.block_N) == tile, (M, N, K, config)
    for shape in [(8192, 8192, 8192), (1_000_000, 192, 64), (100000, 96, 300), (2000, 3000, 4000)]:
        tall = [c for c in candidate_schedules(*shape, **H200) if c.block_M >= 2 * c.block_N]
        assert all(c.block_N >= shape[1] for c in tall), shape


@pytest.mark.parametrize("M,N,K", [(4096, 4096, 64), (8192, 8192, 128), (100_000, 512, 128), (4096, 4096, 1024),
                                   (8192, 8192, 512), (8192, 8192, 4096)])
def test_plain_gemms_of_more_big_tiles_than_sms_walk_them_persistently(M, N, K):
    """Short and mid K loops over many 128x256 tiles: one block an SM walks them (what the plain grid's best
    loses is each tile's first loads); with an epilogue, or on other families, the plain grid."""
    config, reason = choose_schedule(M, N, K, **H200)
    assert config.persistent == 132 and (config.block_M, config.block_N, config.num_stages) == (128, 256, 3)
    assert "walked by 132 persistent blocks" in reason and "first loads in flight" in reason
    plain = min((c for c in candidate_schedules(M, N, K, **H200) if not c.persistent),
                key=lambda c: estimate_seconds(M, N, K, c, **H200))
    assert estimate_seconds(M, N, K, config, **H200) < estimate_seconds(M, N, K, plain, **H200)
    assert not plan_problem(M, N, K, **H200, epilogue=True).config.persistent
    assert not choose_schedule(M, N, K, "ampere", 108, BUDGETS["ampere"])[0].persistent


@pytest.mark.parametrize("M,N,K", [(2048, 2048, 2048), (2000, 3000, 4000), (3000, 3000, 3000), (1536, 1536, 1536),
                                   (64, 8192, 8192), (1_000_000, 128, 128), (5120, 13824, 5120)])
def test_the_plain_grid_stays_where_its_waves_come_out_better(M, N, K):
    """Fewer tiles than SMs, tiles narrower than the problem's columns, or three-warpgroup tiles whose waves
    come out whole: no persistent walk."""
    assert not choose_schedule(M, N, K, **H200)[0].persistent


def test_short_k_loops_drop_the_producer_warpgroup_so_blocks_share_an_sm():
    """K of one or two steps: nothing to pipeline, so a block's first loads and its store are its time; without
    warp specialization two blocks share an SM. Longer loops, three-warpgroup tiles and other families keep
    their pipeline."""
    for shape in [(1_000_000, 64, 64), (20_000_000, 16, 16), (1_000_000, 128, 128), (16384, 256, 64),
                  (300_000, 100, 64)]:
        config, reason = choose_schedule(*shape, **H200)
        assert not config.warp_specialized and config.threads <= 256, shape
        assert blocks_per_sm(config, H200["smem_budget"], "hopper") == 2
        assert "without the producer warpgroup 2 blocks share an SM" in reason
    for shape in [(4096, 4096, 1024), (100_000, 96, 300), (8192, 8192, 8192), (64, 8192, 8192), (1536, 1536, 1536)]:
        assert all(c.warp_specialized for c in candidate_schedules(*shape, **H200)), shape
    for family in ("ampere", "ada", "turing"):
        assert all(c.warp_specialized for c in candidate_schedules(1_000_000, 64, 64, family, 82, BUDGETS[family]))
    # a block alone on its SM gains nothing from it: the tiniest problems keep TileLang's default
    assert pick(7, 13, 5).warp_specialized and pick(100, 100, 100).warp_specialized
    config = pick(1_000_000, 128, 128)
    assert gemm_pass_configs(config) == {"tl.disable_warp_specialized": True}
    assert gemm_pass_configs(replace(config, warp_specialized=True)) == {}
    assert "no producer warpgroup" in config.label()


def test_the_rule_says_why_in_a_line_a_learner_can_follow():
    _, reason = choose_schedule(64, 8192, 8192, **H200)
    assert "64x64 tiles" in reason and "blocks on 132 SMs" in reason and "waves" in reason and "us" in reason
    _, reason = choose_schedule(8192, 8192, 8192, **H200)
    assert reason.startswith("128x256 tiles: 2048 walked by 132 persistent blocks (15.52 each)")
    assert "128x256 tiles: 2048 blocks on 132 SMs (15.52 waves)" in reason
    _, reason = choose_schedule(2000, 3000, 4000, **H200)  # against the lesson's tile, with the waves it wastes
    assert reason.startswith("256x192 tiles: 128 blocks on 132 SMs (0.97 waves)")
    assert "128x256 tiles: 192 blocks on 132 SMs (1.45 waves)" in reason and "last wave would run 55% empty" in reason
    _, reason = choose_schedule(1_000_000, 128, 256, **H200)  # many waves: the count of blocks, not the last one
    assert "(2.0x the blocks, each paying its start and store)" in reason and "empty" not in reason
    plan = plan_problem(4095, 4095, 4095, **H200)
    assert plan.padded and plan.kernel_shape == (4095, 4096, 4096) and "zero-padded" in plan.describe()


@pytest.mark.parametrize("family", ["hopper", "ampere", "ada", "turing"])
@pytest.mark.parametrize("shape", ODD + [(8192, 8192, 8192), (3000, 3000, 3000), (128, 4096, 11008)])
def test_the_pick_always_fits_the_shared_memory_and_splits_sensibly(family, shape):
    M, N, K = shape
    for budget in (BUDGETS[family], 101376, 65536):  # also smaller GPUs of the family (sm_86, sm_75 sized)
        config, _ = choose_schedule(M, aligned(N), aligned(K), family, 82 if family != "hopper" else 132, budget)
        assert fits(config, budget) and replace(config, last_adds=False) in candidate_schedules(M, aligned(N), aligned(K), family,
                                                                         82 if family != "hopper" else 132, budget)
        steps = -(-aligned(K) // config.block_K)
        assert config.split_k == 1 or steps // config.split_k >= 4


def test_no_tile_fits_raises():
    with pytest.raises(ValueError, match="no GEMM tile fits"):
        choose_schedule(1024, 1024, 1024, "hopper", 132, 1000)


def test_candidates_are_listed_biggest_first_and_fit_their_family():
    for family, configs in CANDIDATES.items():
        assert all(fits(c, BUDGETS[family]) for c in configs)
        assert configs[0] == gemm_schedules.lesson_schedules(family)[0]
        areas = [c.block_M * c.block_N for c in configs[1:]]
        assert areas == sorted(areas, reverse=True)


def test_unaligned_rows_are_refused_by_tma_kernels_and_padded_or_loaded_masked_by_the_plan():
    """The tensor-core plan (the rule's for more than a few rows, the few-rows kernel's rival)."""
    with pytest.raises(ValueError, match="16 bytes"):
        check_problem(64, 1001, 64, None, "float16")
    check_problem(64, 1001, 64, None, "float16", aligned_rows=False)  # the lesson's kernel takes any rows
    for shape in [(7, 13, 5), (33, 4097, 65), (100, 100, 100), (2, 4097, 4095)]:  # the copies' launches dominate
        plan = tensor_core_plan(*shape, **H200)
        assert not plan.padded and plan.kernel_shape == shape and "masked" in plan.describe(), shape
    # copies small beside the GEMM: TMA on padded rows; one row of odd length (TileLang cannot mask its copy)
    for shape in [(4095, 4095, 4095), (2000, 3001, 4000), (1, 4097, 4095), (1, 1, 1)]:
        plan = tensor_core_plan(*shape, **H200)
        assert plan.padded and plan.kernel_shape == (shape[0], aligned(shape[1]), aligned(shape[2])), shape
    # the message names the sizes that are unaligned, and only those
    assert "rows of N=3001 elements are not 16-byte aligned" in tensor_core_plan(2000, 3001, 4000, **H200).describe()
    assert "N=4097 and K=4095" in tensor_core_plan(1, 4097, 4095, **H200).describe()
    assert "K=" not in tensor_core_plan(100, 100, 96, **H200).describe().split("aligned")[0].split(";")[-1]
    with pytest.raises(ValueError, match="dtype"):
        check_problem(64, 64, 64, None, "float32")
    assert aligned(1) == 8 and aligned(8) == 8 and aligned(4097) == 4104


# ---- The launcher: padding and split K, with CPU stand-ins for the kernels --------------------------------


def fake_kernels(plan):
    """Kernels as torch on the CPU, with the launch signatures of the real ones (C or the partials last)."""
    M, N, K = plan.kernel_shape
    splits = plan.config.split_k

    def gemm(a, b, *rest):
        assert a.shape == (M, K) and b.shape == (K, N)
        out = rest[-1]
        if splits > 1:
            step = -(-K // splits)
            for z in range(splits):
                out[z] = a[:, z * step:(z + 1) * step].float() @ b[z * step:(z + 1) * step].float()
        else:
            out.copy_(a.float() @ b.float() + (rest[0].float() if len(rest) == 2 else 0))

    def reduce(w, *rest):  # C at its own width where the plan's sum writes it straight (c_width)
        assert w.shape == (splits, M, N) and rest[-1].shape == (M, plan.c_width)
        rest[-1].copy_((w.sum(0) + (rest[0].float() if len(rest) == 2 else 0))[:, :plan.c_width])

    return {"gemm": gemm, "reduce": reduce}


@pytest.mark.parametrize("M,N,K,splits", [(7, 13, 5, 1), (33, 4097, 65, 2), (64, 128, 256, 3), (5, 16, 13, 1),
                                          (5, 13, 16, 4)])
@pytest.mark.parametrize("bias", [False, True])
def test_launcher_pads_splits_and_reduces(M, N, K, splits, bias):
    torch = pytest.importorskip("torch")
    plan = GemmPlan(M, N, K, GemmConfig(64, 64, 64, 4, 128, True, split_k=splits))
    run = GemmLauncher(plan, fake_kernels(plan))
    for seed in range(2):  # the kept buffers stay right across calls
        gen = torch.Generator().manual_seed(seed)
        a, b = torch.randn(M, K, generator=gen, dtype=torch.float64), torch.randn(K, N, generator=gen, dtype=torch.float64)
        bb, c = torch.randn(N, generator=gen, dtype=torch.float64), torch.empty(M, N, dtype=torch.float64)
        run(a, b, bb, c) if bias else run(a, b, c)
        assert torch.allclose(c, a @ b + (bb if bias else 0), atol=1e-3)


@pytest.mark.parametrize("M, N, splits", [(25, 216, 32), (25, 216, 8), (128, 4096, 3), (256, 256, 8),
                                          (64, 2050, 8), (4096, 8, 4), (3, 1, 64), (7, 130, 8)])
def test_a_small_c_is_reduced_in_more_blocks_each_splits_loads_in_flight(M, N, splits):
    (bM, bN), unroll = E.reduce_tile(M, N, splits)
    per_thread = bM * bN // 128
    assert unroll and per_thread * splits <= max(E.REDUCE_LOADS, splits)  # one load a thread a split at least
    assert bN <= max(N, 1) * 2 - 1 or bN == 1  # no wider than C (a power of two)
    blocks = -(-M // bM) * -(-N // bN)
    assert blocks >= -(-M // E.REDUCE_TILE[0]) * -(-N // E.REDUCE_TILE[1])  # at least the blocks REDUCE_TILE makes
    assert per_thread == 1 or blocks >= E.REDUCE_BLOCKS  # more than a partial a thread only over a wave


def test_a_c_of_a_wave_of_tiles_keeps_the_reduction_tile():
    assert E.reduce_tile(2000, 3000, 2) == (E.REDUCE_TILE, False)
    assert E.reduce_tile(4096, 4096, 4) == (E.REDUCE_TILE, False)


@pytest.mark.parametrize("M, N, splits, bias", [(25, 216, 32, False), (64, 2050, 8, True), (4096, 8, 4, False)])
def test_the_reduction_builds_in_its_tiles_blocks(M, N, splits, bias):
    tile, _ = E.reduce_tile(M, N, splits)
    program = E.splitk_reduce_program(M, N, splits, bias=bias, activation="gelu" if bias else None)
    report = tourkit.inspect_kernel("reduce", program, "sm_90a", nvcc=tourkit.find_nvcc() is not None)
    assert tuple(report.grid[:2]) == (-(-N // tile[1]), -(-M // tile[0]))
    if tourkit.find_nvcc() is not None:
        assert report.nvcc == "compiled" and report.spills == "0", (report.nvcc, report.spills)


def test_a_split_k_sum_writes_c_at_its_own_width():
    """With a split K the sum's plain stores write C as the user's rows are (no padded C copied out): its
    parameter is C's own shape, for the reduction kernel and the one-launch sum; without a split, the padded one."""
    for last_adds in (False, True):
        plan = GemmPlan(25, 212, 14336, GemmConfig(64, 64, 64, 4, 128, True, split_k=8, last_adds=last_adds),
                        "bfloat16")
        assert plan.c_width == 212 and plan.kernel_shape[1] == 216
        programs = plan.programs(bias=True, activation="gelu")
        writer = programs["gemm" if last_adds else "reduce"]
        assert [int(x) for x in writer.buffer_map[writer.params[-1]].shape] == [25, 212]
        source = tourkit.inspect_kernel("sum", writer, "sm_90a", nvcc=False).source
        assert re.search(r"\* 212\)", source)  # C's rows are 212 elements apart
    plain = GemmPlan(25, 212, 14336, GemmConfig(64, 64, 64, 4, 128, True), "bfloat16")
    assert plain.c_width == 216


def test_launcher_of_a_kernel_that_returns_c():
    torch = pytest.importorskip("torch")
    plan = GemmPlan(3, 5, 7, GemmConfig(64, 64, 64, 4, 128, True))
    run = GemmLauncher(plan, {"gemm": lambda a, b: a @ b}, returns_c=True)
    a, b, c = torch.randn(3, 7, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64), torch.empty(3, 5,
                                                                                                          dtype=torch.float64)
    assert torch.allclose(run(a, b, c), a @ b)


# ---- The kernels lower for users' problems ---------------------------------------------------------------

EXPECTED = {"sm_80": ["cp_async", "mma_sync"], "sm_90a": ["wgmma", "tma_load"]}
UNPADDED = {"sm_80": ["mma_sync"], "sm_90a": ["wgmma"]}  # unaligned rows: narrower masked loads, no TMA
FAMILY = {"sm_80": "ampere", "sm_90a": "hopper"}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("shape,dtype,epilogue", [((1, 1, 1), "float16", False), ((33, 4097, 65), "bfloat16", True),
                                                  ((2, 4097, 4095), "float16", True),
                                                  ((128, 4096, 11008), "float16", True),
                                                  ((2000, 3000, 4000), "bfloat16", False),
                                                  ((3000, 3000, 3000), "float16", True),
                                                  ((1536, 1536, 1536), "float16", True),
                                                  ((3072, 768, 3072), "bfloat16", False),
                                                  ((100_000, 128, 128), "bfloat16", True)])
def test_the_rules_kernels_lower_for_users_problems(arch, shape, dtype, epilogue):
    """The tensor-core plans (a few rows on Hopper take the CUDA cores: tests/test_gemm_rows.py)."""
    plan = tensor_core_plan(*shape, FAMILY[arch], 132 if arch == "sm_90a" else 108, BUDGETS[FAMILY[arch]], dtype)
    activation = "gelu" if epilogue else None
    programs = plan.programs(bias=epilogue, activation=activation)
    report = tourkit.inspect_kernel("gemm", programs["gemm"], arch, nvcc=False,
                                    pass_configs=plan.pass_configs("gemm", activation))
    aligned_rows = shape[1] % 8 == 0 and shape[2] % 8 == 0
    expected = EXPECTED[arch] if aligned_rows or plan.padded else UNPADDED[arch]
    if not plan.config.warp_specialized and arch == "sm_90a":  # a short K loop: every thread issues cp.async
        expected = ["wgmma", "cp_async"]
        assert report.markers["tma_load"] == 0
    elif not plan.config.warp_specialized:  # off Hopper only rows loaded masked go without TileLang's producer
        assert not plan.pad and not aligned_rows
    tourkit.require_markers(report, expected)
    assert list(expected) == [m for m in plan.markers(tourkit.tensor_core_markers(arch)) if m in expected]
    assert report.smem_bytes <= plan.config.smem_bytes()
    assert dtype == "float16" or "bfloat16_t" in report.source
    if "reduce" in programs:
        reduce = tourkit.inspect_kernel("reduce", programs["reduce"], arch, nvcc=False)
        assert ("exp2f(" in reduce.source) == epilogue  # the epilogue runs in the reduction
        assert "exp2f(" not in report.source
    elif plan.config.split_k > 1:  # each tile's last block adds the runs and applies the epilogue
        assert "AtomicAddRet" in report.source and ("exp2f(" in report.source) == epilogue


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_more_tile_rows_than_a_grid_column_holds_go_along_x(arch):
    """CUDA caps a grid's y at 65535 blocks: 20M rows in 256-row tiles are 78125 tile rows."""
    plan = plan_problem(20_000_000, 16, 16, FAMILY[arch], 132 if arch == "sm_90a" else 108, BUDGETS[FAMILY[arch]])
    report = tourkit.inspect_kernel("gemm", plan.programs()["gemm"], arch, nvcc=False)
    m_tiles, n_tiles = -(-20_000_000 // plan.config.block_M), -(-16 // plan.config.block_N)
    assert m_tiles > 65535 and tuple(report.grid) == (m_tiles, n_tiles, 1)
    assert "along the grid's x axis" in plan.describe()
    short = plan_problem(4096, 4096, 16, FAMILY[arch], 132, BUDGETS[FAMILY[arch]], epilogue=True)
    report = tourkit.inspect_kernel("gemm", short.programs()["gemm"], arch, nvcc=False)
    assert tuple(report.grid) == (-(-4096 // short.config.block_N), -(-4096 // short.config.block_M), 1)


@pytest.mark.parametrize("arch,config", [("sm_90a", GemmConfig(64, 64, 64, 8, 128, True)),
                                         ("sm_90a", GemmConfig(128, 128, 64, 2, 256, True, warp_specialized=False)),
                                         ("sm_90a", GemmConfig(256, 64, 64, 2, 256, True, policy="FullRow",
                                                               warp_specialized=False)),
                                         ("sm_80", GemmConfig(128, 256, 32, 3, 256, True)),
                                         ("sm_80", GemmConfig(128, 128, 32, 2, 256, True)),
                                         ("sm_80", GemmConfig(128, 128, 32, 4, 256, True)),
                                         ("sm_80", GemmConfig(64, 64, 32, 6, 128, True))])
def test_the_models_blocks_per_sm_agree_with_the_registers_ptxas_gives(arch, config):
    """Hopper: one block takes the SM's registers (a producer warpgroup, no resident-block minimum), unless built
    without warp specialization (two 256-thread blocks of 128x128 tiles fit); on Ampere
    a 256-thread block of 128x256 or 128x128 tiles needs more than 128 a thread (so one block an SM), a
    128-thread 64x64 block far fewer."""
    family = FAMILY[arch]
    config = fitted_to_k(config, 1024)
    report = tourkit.inspect_kernel("gemm", gemm_schedules.gemm_program(4096, 4096, 1024, config), arch,
                                    pass_configs=gemm_pass_configs(config))
    by_registers = 65536 // (report.threads * report.registers)
    assert blocks_per_sm(config, 10**6, family) == max(1, min(2, by_registers))


def test_split_k_kernel_and_its_reduction_compile_with_nvcc():
    """One skinny bf16 problem through nvcc on sm_90a: the GEMM writes fp32 partials, the reduction adds them."""
    plan = plan_problem(128, 4096, 11008, dtype="bfloat16", **H200)
    assert plan.config.split_k > 1
    for part, func in plan.programs().items():
        assert tourkit.inspect_kernel(part, func, "sm_90a").nvcc == "compiled"


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("shape,dtype,bias", [((16, 5120, 5120), "float16", False), ((25, 212, 14336), "bfloat16", True),
                                             ((64, 2050, 8192), "float16", True), ((130, 520, 40000), "float16", False)])
def test_a_split_k_added_by_its_last_block_is_one_kernel_that_counts_and_fences(arch, shape, dtype, bias):
    """last_adds: one program, taking the partials, the arrival counts and C; its CUDA fences, counts each tile's
    runs atomically and sets the count back; the estimate drops the reduction's launch; nvcc compiles it."""
    family = ARCH_SPECS[arch].family
    plan = plan_problem(*shape, family, 132, 232448 if family == "hopper" else 166912, dtype)
    if isinstance(plan.config, RowsConfig) or plan.config.split_k == 1:
        plan = replace(plan, config=replace(GemmConfig(64, 64, 64, 4, 128, True), split_k=3))
    plan = replace(plan, config=replace(plan.config, last_adds=False))
    adds = replace(plan, config=replace(plan.config, last_adds=True))
    assert adds.parts[-1] == "gemm" and "reduce" not in adds.parts and "reduce" in plan.parts
    assert "added by the last to arrive" in adds.label()
    M, N, K = adds.kernel_shape
    assert (estimate_seconds(M, N, K, adds.config, family, 132, 232448)
            < estimate_seconds(M, N, K, plan.config, family, 132, 232448))
    func = adds.programs(bias=bias, activation="gelu" if bias else None)["gemm"]
    assert [p.name.removesuffix("_handle") for p in func.params][-3:] == ["W", "Arrivals", "C"]
    report = tourkit.inspect_kernel("gemm", func, arch, nvcc=arch == "sm_90a" and shape[0] == 16)
    assert report.source.count("__threadfence()") == 2 and "AtomicAddRet" in report.source
    assert re.search(r"Arrivals\[.*\] = 0;", report.source)
    assert report.nvcc in ("compiled", "lowered only", "not run (nvcc not found)")


def test_a_split_is_added_in_the_gemms_launch_where_a_tiles_partials_are_small():
    """A tile's last block adds the runs where its partials inside C (runs x rows x columns, fp32) are at most
    LAST_ADDS_BYTES; bigger ones go to the reduction kernel, which spreads the sum over every SM."""
    for shape, adds in [((4096, 8, 4096), True), ((16, 5120, 5120), True), ((4096, 32, 8192), True),
                        ((128, 4096, 11008), False), ((256, 256, 65536), False), ((64, 2050, 8192), False)]:
        config = plan_problem(*shape, **H200).config
        assert config.split_k > 1 and config.last_adds == adds, (shape, config)
        assert (config.split_k * min(config.block_M, shape[0]) * min(config.block_N, shape[1]) * 4
                <= LAST_ADDS_BYTES) == adds
    assert not plan_problem(64, 8192, 8192, **H200).config.last_adds  # no split: nothing to add


@pytest.mark.parametrize("m_tiles,n_tiles,panel", [(16, 12, 10), (7, 5, 10), (33, 4, 8), (1, 9, 10), (10, 10, 10)])
def test_a_persistent_walk_covers_every_tile_once(m_tiles, n_tiles, panel):
    """tile_of: the t-th tile of the swizzled order, the last panel shorter than the rest."""
    walk = [gemm_schedules.tile_of(t, m_tiles, n_tiles, min(panel, m_tiles)) for t in range(m_tiles * n_tiles)]
    assert sorted(walk) == [(r, c) for r in range(m_tiles) for c in range(n_tiles)]
    assert walk[1] == ((1, 0) if m_tiles > 1 else (0, 1))  # down the panel's rows first


@pytest.mark.parametrize("bias", [False, True])
def test_the_persistent_kernel_compiles_with_nvcc(bias):
    """One block an SM, one pipelined loop over its tiles and their K steps, the C tile beside the ring."""
    config = GemmConfig(128, 256, 64, 3, 256, True, persistent=132)
    func = gemm_schedules.gemm_program(2000, 3000, 4000, config, bias=bias, activation="gelu" if bias else None)
    report = tourkit.inspect_kernel("persistent", func, "sm_90a")
    assert report.nvcc == "compiled" and report.grid == (132, 1, 1) and "wgmma" in report.source
    assert "tma_store" in report.source and report.smem_bytes <= config.smem_bytes() <= 232448
    assert replace(config, num_stages=4).smem_bytes() > 232448  # the C tile does not reuse the ring
    with pytest.raises(ValueError, match="no split K"):
        gemm_schedules.gemm_program(256, 256, 4096, replace(config, split_k=2))


def test_a_big_problem_loaded_masked_takes_a_plain_grid_that_lowers():
    """A short K over a big C, N and K unaligned: the padded copies would cost more than the GEMM, so the rows
    are loaded masked, and the persistent walk (aligned rows only) gives way to the best plain grid. The pick
    and what it is timed beside lower for sm_90a."""
    for shape in [(7343, 6894, 15), (8000, 7001, 17)]:
        plan = plan_problem(*shape, **H200)
        assert not plan.padded and not plan.config.persistent and "masked" in plan.describe(), shape
        assert plan_problem(shape[0], aligned(shape[1]), aligned(shape[2]), **H200).config.persistent  # else walked
        others = [replace(plan, config=c) for c in neighbours(plan, "hopper", 132, H200["smem_budget"])]
        for each in [plan] + others:
            assert not each.config.persistent
            for part, func in each.programs().items():
                assert "wgmma" in tourkit.inspect_kernel(part, func, "sm_90a", nvcc=False).source, (shape, each.config)


@pytest.mark.parametrize("shape,regrouped", [((8903, 10683, 144), True), ((12000, 5003, 64), True),
                                             ((777, 4097, 1234), False)])
def test_rows_of_b_loaded_masked_take_tiles_that_fit_beside_their_producer(shape, regrouped):
    """Rows loaded masked. N off 16 bytes and K on them: a producer as large as the consumers; with three
    consumer warpgroups that kernel cannot raise its registers (and ptxas refuses 192x192), with two a 128x256
    tile's accumulators do not fit the 128 registers a thread gets and spill. A one-step loop, built without
    the producer, is to share its SM with a second block: the same 128. Both off: no producer, 255 registers,
    and 128x256 fits. The pick and what it is timed beside keep to tiles that fit; each compiles with nvcc,
    spills nothing, and its register raise fits the SM."""
    plan = plan_problem(*shape, **H200)
    assert not plan.padded and "masked" in plan.describe()
    assert ("registers for the masked copies" in plan.describe()) == regrouped  # said where the free pick did not fit
    plans = [plan] + [replace(plan, config=c) for c in neighbours(plan, "hopper", 132, H200["smem_budget"])]
    for each in plans:
        assert masked_tile_fits(each.config, "hopper", *shape[1:]), each.config
        assert each.config.threads <= MASKED_MAX_THREADS, each.config
        report = tourkit.inspect_kernel("gemm", each.programs()["gemm"], "sm_90a",
                                        pass_configs=each.pass_configs("gemm"))
        assert report.nvcc == "compiled" and report.spill_stores == 0, (shape, each.config, report.summary())
        tourkit.require_register_raise_fits(report, each.config.threads)
    if regrouped:  # why: the lesson's tile, masked, spills
        lesson = GemmPlan(*shape, replace(CANDIDATES["hopper"][0], num_stages=3), "float16", pad=False)
        assert not masked_tile_fits(lesson.config, "hopper", *shape[1:])
        assert tourkit.inspect_kernel("gemm", lesson.programs()["gemm"], "sm_90a").spill_stores > 0
    if shape[2] % 8:  # both off: no producer, no raise to check
        return
    wide = next(c for c in CANDIDATES["hopper"] if c.threads > MASKED_MAX_THREADS)  # three consumer warpgroups
    three = GemmPlan(*shape, replace(wide, num_stages=3), "float16", pad=False)
    report = tourkit.inspect_kernel("gemm", three.programs()["gemm"], "sm_90a", nvcc=False)
    with pytest.raises(tourkit.ValidationError, match="would wait forever"):  # why: the rule this test guards
        tourkit.require_register_raise_fits(report, wide.threads)


def test_few_rows_load_masked_where_the_copies_outweigh_the_masked_round_trips():
    """A problem of few rows streams B once. Its padded copies (B in, C out) cost about as much as the GEMM,
    while a masked K step costs a round trip (MASKED_STEP): loaded masked where its waves x K steps of those
    cost less than the copies, which favours splits of K into short loops; padded where the loop stays long."""
    plan = plan_problem(100, 1001, 5000, **H200)
    assert not plan.padded and "masked" in plan.describe() and plan.config.split_k > 1
    assert plan.config in candidate_schedules(100, 1001, 5000, "hopper", 132, H200["smem_budget"], masked=True)
    deep = plan_problem(25, 212, 14336, dtype="bfloat16", **H200)  # 28 steps a block even split 8 ways
    assert deep.padded and k_steps(14336, deep.config) >= 28
    masked = replace(deep.config, split_k=8)
    floor = k_steps(14336, masked) * MASKED_STEP
    assert masked_seconds(25, 212, 14336, masked, "hopper", 132, H200["smem_budget"]) >= floor
    assert estimate_seconds(25, 216, 14336, masked, "hopper", 132, H200["smem_budget"]) < floor
    tall = plan_problem(4096, 4095, 4096, **H200)  # many rows: the masked plan is costed at twice the GEMM
    assert tall.padded


def test_unpadded_kernel_compiles_with_nvcc():
    """A tiny unaligned problem loaded masked (no TMA)."""
    plan = plan_problem(7, 13, 5, **H200)
    assert tourkit.inspect_kernel("gemm", plan.programs(bias=True, activation="gelu")["gemm"], "sm_90a").nvcc == "compiled"


def test_the_appendix_width_follows_the_lessons_cost_model():
    from sections.hopper import gemm_ws

    widths = {shape: gemm_ws.appendix_schedule(*shape, 132).block_N for shape in
              [(8192, 8192, 8192), (4096, 4096, 1024), (2000, 3000, 4000), (3000, 3000, 3000), (1536, 1536, 1536),
               (1024, 1024, 1024)]}
    assert list(widths.values()) == [256, 256, 192, 192, 192, 128]
    assert all(fits(gemm_ws.appendix_schedule(*shape, 132), 232448) for shape in widths)


def test_the_appendix_kernels_take_bfloat16():
    from sections.hopper import gemm_pingpong, gemm_ws

    for module in (gemm_ws, gemm_pingpong):
        config = module.appendix_schedule(2000, 3000, 4000, 132)
        report = tourkit.inspect_kernel("appendix", module.appendix_program(2000, 3000, 4000, config, dtype="bfloat16"),
                                        "sm_90a", nvcc=False)
        assert "wgmma" in report.source and "bfloat16_t" in report.source


# ---- The sections with --shape -----------------------------------------------------------------------


@pytest.mark.parametrize("section", [gemm_schedules, fusion])
def test_sections_build_the_users_problem(section):
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", shape=(128, 4096, 11008), dtype="bfloat16", echo=False)
    names = [d.name for d in section.kernels(ctx)]
    assert names and all("@128x4096x11008 bfloat16" in n for n in names)
    assert any(n.endswith("(reduce)") for n in names)  # the split K's reduction is declared with its GEMM
    ctx = tourkit.TourContext(compile_only=True, arch="sm_80", shape=(7, 13, 5), echo=False)
    assert all("@7x13x5" in d.name for d in section.kernels(ctx))  # padded inside; no appendix for unaligned rows


def test_gemm_schedules_times_the_pick_its_runner_up_and_the_default():
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", shape=(2000, 3000, 4000), echo=False)
    rows, ws, odd = gemm_schedules.plan(ctx)
    assert rows[0].config == pick(2000, 3000, 4000) and rows[0].reason and not odd and ws is not None
    assert GemmConfig(128, 256, 64, 4, 256, True) in [p.config for p in rows] and len(rows) == len(set(rows)) <= 3


@pytest.mark.parametrize("faster", ["runner-up", "pick"])
def test_a_users_problem_gets_the_fastest_of_the_timed_schedules_and_says_so(fake_gemm_timing, faster):
    ctx = tourkit.TourContext(arch="sm_90a", shape=(2500, 1000, 3000), echo=False)
    rows, ws, _ = gemm_schedules.plan(ctx)
    names = [gemm_schedules.kernel_name(p) for p in rows]
    winner = names[1] if faster == "runner-up" else names[0]
    calls = fake_gemm_timing(lambda label: 0.8 if label == winner else 1.0, cublas_ms=0.9)
    gemm_schedules.run(ctx)
    assert len(calls) == 1 and set(names) <= set(calls[0][1]) and calls[0][0] == 2500
    text = "\n".join(ctx.report)
    chosen = rows[names.index(winner)]
    assert ctx.headlines["lesson"] == chosen.config.label() and ctx.headlines["lesson_vs_cublas"] == round(0.9 / 0.8, 3)
    if faster == "runner-up":
        assert f"{chosen.config.label()} ran 1.25x the speed of the rule's pick" in text
    else:
        assert "the rule's pick was the fastest" in text
    assert "the rule's pick" in text and "<- fastest" in text


def test_compile_only_run_with_a_shape_reports_the_rule():
    ctx = tourkit.TourContext(compile_only=True, arch="sm_80", shape=(64, 1000, 999), echo=False)
    gemm_schedules.run(ctx)
    assert any("the rule's schedule" in line for line in ctx.report)
    assert ctx.headlines["kernels"] >= 2
    short = tourkit.TourContext(compile_only=True, arch="sm_90a", shape=(1_000_000, 64, 64), echo=False)
    gemm_schedules.run(short)
    text = "\n".join(short.report)
    assert "no producer warpgroup:" in text and "No producer warpgroup here" in text and "handing" not in text


def test_autotune_tunes_the_users_problem_rounded_up():
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", shape=(1000, 1001, 999), dtype="bfloat16", echo=False)
    assert autotune.tuned_shape(ctx) == (1000, 1008, 1000)
    decl = autotune.kernels(ctx)[0]
    report = tourkit.inspect_kernel(decl.name, decl.program(), "sm_90a", nvcc=False)
    assert "bfloat16_t" in report.source


# ---- On the GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype", [(1, 1, 1, "float16"), (7, 13, 5, "float16"), (33, 4097, 65, "float16"),
                                         (64, 8192, 1000, "float16"), (128, 4096, 11008, "bfloat16"),
                                         (2000, 3000, 4000, "bfloat16"), (1, 4096, 4096, "float16"),
                                         (2, 4097, 4095, "float16"), (100, 100, 100, "bfloat16"),
                                         (20_000_000, 16, 16, "float16"), (300_000, 100, 64, "bfloat16"),
                                         (16384, 256, 64, "float16"), (1536, 1536, 1536, "float16"),
                                         (3072, 768, 3072, "bfloat16"), (1200, 1200, 1200, "float16"),
                                         (7001, 129, 1001, "float16"), (7343, 6894, 15, "float16"),
                                         (25, 212, 14336, "bfloat16"), (256, 256, 65536, "float16"),
                                         (8903, 10683, 144, "float16")])
@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("epilogue", [False, True])
def test_the_rules_pick_is_correct_on_odd_sizes(M, N, K, dtype, epilogue, persistent):
    """The rule's pick; and, persistent, the lesson's 128x256 tile walked by one block an SM (Hopper)."""
    device = tourkit.detect_device()
    if dtype == "bfloat16" and device.arch == "sm_75":
        pytest.skip("bfloat16 needs sm_80")
    plan = plan_problem(M, N, K, device.family, device.sm_count, device.smem_per_block_optin, dtype)
    if persistent and (device.family != "hopper" or M * N < 10**6 or not plan.padded and (N % 8 or K % 8)):
        pytest.skip("the persistent schedule: Hopper, problems of several tiles, aligned rows")
    if persistent:
        plan = replace(plan, config=GemmConfig(128, 256, 64, 3, 256, True, persistent=device.sm_count))
    check_on_gpu(plan, epilogue, seed=5)


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype,epilogue", [(16, 5120, 5120, "float16", False), (25, 212, 14336, "bfloat16", True),
                                                  (64, 2050, 8192, "float16", True), (130, 520, 40000, "float16", False),
                                                  (7, 13, 1000, "float16", True), (256, 256, 65536, "bfloat16", False)])
def test_a_split_k_added_by_its_last_block_is_correct(M, N, K, dtype, epilogue):
    """The tensor-core plan with its K split added in the same launch (at least 3 runs), on two calls."""
    device = tourkit.detect_device()
    if dtype == "bfloat16" and device.arch == "sm_75":
        pytest.skip("bfloat16 needs sm_80")
    plan = tensor_core_plan(M, N, K, device.family, device.sm_count, device.smem_per_block_optin, dtype)
    config = plan.config if plan.config.split_k > 2 else replace(plan.config, split_k=3, persistent=0)
    check_on_gpu(replace(plan, config=replace(config, last_adds=True)), epilogue, seed=7)


def check_on_gpu(plan: GemmPlan, epilogue: bool, seed: int) -> None:
    """Build the plan's programs (with bias + GELU when epilogue), run them through its launcher on fresh random
    inputs and check C against the float32 reference, after the first call and after a second one (which
    reuses the launcher's buffers, and the few-rows kernel's arrival counts, as a benchmark does)."""
    import tilelang

    activation = "gelu" if epilogue else None
    kernels = {part: tilelang.compile(f, out_idx=None, target="cuda", pass_configs=plan.pass_configs(part, activation))
               for part, f in plan.programs(bias=epilogue, activation=activation).items()}
    run = GemmLauncher(plan, kernels)
    a, b, bias, c = fusion.fused_inputs(plan.M, plan.N, plan.K, seed=seed, dtype=plan.dtype)
    ref = gemm_schedules.reference(a, b, bias if epilogue else None, activation)
    call = (lambda: run(a, b, bias, c)) if epilogue else (lambda: run(a, b, c))
    for which in ("first", "second"):  # validate poisons C before each
        check = tourkit.validate(f"{plan.M}x{plan.N}x{plan.K} {plan.dtype}, {which} call", call, c, ref,
                                 gemm_schedules.TOLERANCE)
        assert check.passed, check.line()
