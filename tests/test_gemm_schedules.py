"""gemm_schedules: the builder's API, schedule choice, shared-memory estimate and codegen (CPU); odd sizes (GPU)."""

import dataclasses
import re

import pytest

import tilelang_tour
import tourkit
from sections.gemm_schedules import (GemmConfig, compile_gemm, default_schedules, epilogue_pass_configs, fits,
                                     explain_even_rounds, gemm_flops, gemm_program, persistent_grid, tile_count,
                                     reference, require_hopper, shape_set_schedules)

HOPPER_TABLE = default_schedules("hopper")
HOPPER_DEFAULT = HOPPER_TABLE[0]  # the hand-written warp-specialized kernel, persistent
HOPPER_PIPELINED = next(c for c in HOPPER_TABLE if c.kernel == "tilelang")  # TileLang's own pipeline
HAND_WS = [c for c in HOPPER_TABLE if c.kernel == "ws"]
_PINGPONG = dict(panel=8, policy="FullRow", kernel="pingpong")
PINGPONG = [GemmConfig(128, 128, 64, 6, 256, True, persistent=132, **_PINGPONG),
            GemmConfig(128, 192, 64, 4, 256, True, persistent=132, **_PINGPONG)]
assert PINGPONG[1] in HOPPER_TABLE  # the fusion section's schedule
AMPERE_DEFAULT = default_schedules("ampere")[0]
EXPECTED = {"sm_80": ["cp_async", "ldmatrix", "mma_sync"], "sm_90a": ["wgmma", "tma_load", "mbarrier"]}
DEFAULT_FOR = {"sm_80": AMPERE_DEFAULT, "sm_90a": HOPPER_PIPELINED}


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
    # three hand-written (even rounds), ping-pong, the whole-tile one on every SM, one T.Persistent
    assert [c.persistent for c in sized] == [78] * 6


def test_column_panels_change_the_persistent_tile_order_only():
    rows = HAND_WS[0]
    columns = dataclasses.replace(rows, panels="columns")
    sources = [tourkit.lower_for_arch(gemm_program(4096, 4096, 4096, c), "sm_90a").kernel_source
               for c in (rows, columns)]
    assert sources[0] != sources[1]
    tourkit.require_markers(tourkit.inspect_kernel("gemm", gemm_program(4096, 4096, 4096, columns), "sm_90a"),
                            EXPECTED["sm_90a"])  # and nvcc compiles it
    for bad in (GemmConfig(128, 256, 64, 4, 256, True, panels="columns"),              # TileLang's kernel
                dataclasses.replace(rows, persistent=0, panels="columns"),            # one tile per block
                dataclasses.replace(rows, panels="diagonal")):
        with pytest.raises(ValueError, match="panels"):
            gemm_program(1024, 1024, 1024, bad)


def test_schedule_tables_differ_by_family_and_filter_by_budget():
    hopper, ampere = default_schedules("hopper"), default_schedules("ampere")
    assert not any(c.hand_ws for family in ("ampere", "ada", "turing") for c in default_schedules(family))
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
# The hand-written warp-specialized kernel (kernel="ws")
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[(c, epilogue) for c in HAND_WS for epilogue in (False, True)],
                ids=lambda p: f"{p[0].label().replace(' ', '_')}{'-bias-gelu' if p[1] else ''}")
def ws_report(request):
    config, epilogue = request.param
    func = gemm_program(1001, 1032, 1000, config, bias=epilogue, activation="gelu" if epilogue else None)
    return config, epilogue, tourkit.inspect_kernel("ws", func, "sm_90a", nvcc=False)


def consumer_loop(source: str) -> str:
    """From the consumers' first wait on a `full` barrier to their final drain (wait_wgmma<0>)."""
    start = re.search(r"full\[[^\]]*\]\.wait\(", source)
    end = source.index("wait_wgmma<0>")
    return source[start.start():end]


def test_ws_kernel_lowers_with_tma_wgmma_mbarriers_and_one_batch_in_flight(ws_report):
    config, _, report = ws_report
    tourkit.require_markers(report, ["wgmma", "tma_load", "mbarrier"])
    assert report.threads == config.threads + 128  # the producer warpgroup, written by hand
    loop = consumer_loop(report.source)
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    assert issue < wait_one < loop.index("empty[", wait_one)  # the previous stage is released after wait<1>
    assert "__syncthreads" not in loop and "bar.sync" not in loop
    assert re.search(r"empty\[[^\]]*\]\.wait\(.*\^ 1\)\);", report.source)  # the producer's flipped parity


def test_ws_kernel_has_no_block_barrier_inside_a_role(ws_report):
    """After the mbarrier init the roles never meet at __syncthreads again (the producer would not come)."""
    _, _, report = ws_report
    source = report.source
    roles = source.index("warpgroup_reg_dealloc<")
    assert source.count("__syncthreads") == source[:roles].count("__syncthreads") == 1
    assert source.index("fence_barrier_init") < source.index("__syncthreads") < roles


def test_ws_persistent_loop_strides_by_the_grid(ws_report):
    config, _, report = ws_report
    if config.persistent:
        blocks = persistent_grid(config, tile_count(1001, 1032, config))
        assert blocks == (40 if config.even_rounds else config.persistent)  # 8 x 5 tiles: one round
        assert tuple(report.grid) == (blocks, 1, 1)
        assert len(re.findall(rf"\+ {blocks}\);", report.source)) == 2  # producer and consumers
        assert re.search(r"reg_dealloc<40>", report.source) and re.search(r"reg_alloc<232>", report.source)
    else:
        assert tuple(report.grid) == (-(-1032 // config.block_N), -(-1001 // config.block_M), 1)
        assert re.search(r"reg_dealloc<24>", report.source) and re.search(r"reg_alloc<240>", report.source)


def test_ws_epilogue_applies_bias_and_gelu_before_the_store(ws_report):
    _, epilogue, report = ws_report
    source = report.source
    after_loop = source[source.index("wait_wgmma<0>"):]
    if epilogue:
        # The producer loads the tile's bias columns by TMA; the consumers wait for them, add them from shared
        # memory (never from global memory per element), hand the buffer back, then GELU, then the store.
        producer = source[:source.index("warpgroup_reg_alloc")]
        assert "tma_load(Bias_desc, bias_full[0]" in producer and "bias_empty[0].wait(" in producer
        assert "Bias[" not in source and "exp2f(" in after_loop  # the rational erfc's exponential
        assert (after_loop.index("bias_full[0].wait(") < after_loop.index("Bias_s") <
                after_loop.index("bias_empty[0].arrive()") < after_loop.index("exp2f(") < after_loop.index("tma_store("))
    else:
        assert "Bias" not in source and "exp2f(" not in source


def test_ws_epilogue_store_strips_or_the_whole_tile_at_once(ws_report):
    """Strips: each written between two consumer barriers by 4-byte stores, then its TMA store. The whole tile
    staged (store_buffers = block_N / 64): one stmatrix copy between two barriers, then one thread's TMA stores
    of every strip, after one wait for the previous tile's stores."""
    config, _, report = ws_report
    epilogue = report.source[report.source.rindex("wait_wgmma<0>"):]
    strips = config.block_N // 64
    if config.stages_whole_tile:
        assert epilogue.count("__sync_thread_partial") == 2 and "ptx_stmatrix_m8n8_x4(" in epilogue
        assert epilogue.count("tma_store_wait<0, true>") == 2  # before the copy, and the kernel's final drain
        assert re.search(rf"for \(int \w+ = 0; \w+ < {strips}; \+\+\w+\) \{{\s*tl::tma_store\(", epilogue)
    else:
        assert "ptx_stmatrix" not in epilogue
        # a loop over the strips: wait for the store that last read this strip's buffer, barrier, writes, barrier
        assert re.search(rf"for \(int \w+ = 0; \w+ < {strips}; \+\+\w+\) \{{\s*"
                         rf"tl::tma_store_wait<{config.store_buffers - 1}, true>\(\);\s*tl::__sync_thread_partial",
                         epilogue)


def test_ws_smem_estimate_bounds_the_lowered_kernel(ws_report):
    config, _, report = ws_report
    assert report.smem_bytes <= config.smem_bytes() < report.smem_bytes + 4096
    assert fits(config, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)


def test_ws_is_hopper_only_and_checks_its_shape():
    ws = HAND_WS[0]
    require_hopper(ws, "sm_90a")
    require_hopper(AMPERE_DEFAULT, "sm_80")
    with pytest.raises(ValueError, match="needs Hopper"):
        require_hopper(ws, "sm_80")
    for bad, why in ((dict(block_M=192), "64 x"), (dict(policy="Square"), "FullRow"), (dict(block_N=200), "strips"),
                     (dict(store_buffers=5), "store"), (dict(kernel="cutlass"), "kernel")):
        with pytest.raises(ValueError, match=why):
            gemm_program(1024, 1024, 1024, dataclasses.replace(ws, **bad))
    assert ws.label() == "128x256x64 s4 t256 swz8 FullRow ws persistent132 even"
    assert HAND_WS[1].label() == "128x256x64 s4 t256 swz8 FullRow ws store2 persistent132 even"
    with pytest.raises(ValueError, match="even_rounds"):
        gemm_program(1024, 1024, 1024, dataclasses.replace(PINGPONG[1], even_rounds=True))


def test_even_rounds_run_the_fewest_blocks_that_take_no_more_rounds_of_tiles():
    ws = HAND_WS[0]
    assert ws.even_rounds and ws.persistent == 132
    # 128x256 tiles at 4096^3, 8192^3, 8192x4096x14336, 1024x8192x8192, 16384^3, 8192x28672x4096, 1000^3; then
    # one round exactly, and one tile over it
    for tiles, blocks in ((512, 128), (2048, 128), (1024, 128), (256, 128), (8192, 131), (7168, 131), (32, 32),
                          (132, 132), (133, 67)):
        rounds = -(-tiles // 132)
        assert persistent_grid(ws, tiles) == blocks
        assert -(-tiles // blocks) == rounds < -(-tiles // (blocks - 1))  # as few rounds as 132 blocks; the fewest
    assert persistent_grid(dataclasses.replace(ws, even_rounds=False), 512) == 132
    ctx = tourkit.TourContext(echo=False)
    explain_even_rounds(ctx, 8192, 8192, ws)
    assert ctx.report[-1] == ("'even': 128 blocks walk the 2048 tiles in 16 rounds; 132 blocks (one per SM) "
                                     "take as many, with 64 of them idle through the last")
    report = tourkit.inspect_kernel("ws", gemm_program(4096, 4096, 4096, ws), "sm_90a", nvcc=False)
    assert report.grid[0] == 128  # the lowered kernel launches that grid


def test_shape_set_leaders_are_the_hand_written_kernels_and_fullcol():
    leaders = shape_set_schedules(HOPPER_TABLE, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)
    assert len(leaders) == 7 and leaders[:3] == HAND_WS[:3] and HAND_WS[3] not in leaders
    assert PINGPONG[1] in leaders  # the 128x192 ping-pong kernel (it led 8192x28672x4096 once, 2026-12-03)
    # the first one and the whole-tile-staged one again, in panels of 16 tile rows
    assert leaders[5:] == [dataclasses.replace(HAND_WS[0], panel=16), dataclasses.replace(HAND_WS[2], panel=16)]
    assert [c.label() for c in leaders[5:]] == ["128x256x64 s4 t256 swz16 FullRow ws persistent132 even",
                                                 "128x256x64 s3 t256 swz16 FullRow ws store4 persistent132 even"]
    # the whole-tile kernel with a block on every SM stays in the table, next to its even-rounds form
    assert dataclasses.replace(HAND_WS[2], even_rounds=False) in HOPPER_TABLE
    assert HAND_WS[2].store_buffers == 4 and HAND_WS[2].num_stages == 3  # the whole tile staged
    assert any(c.policy == "FullCol" and c.kernel == "tilelang" for c in leaders)


@pytest.mark.parametrize("arch", ["sm_90a"])
def test_compile_only_nvcc_compiles_the_ws_default_at_a_ragged_size(arch):
    report = tourkit.inspect_kernel("ws", gemm_program(1000, 1000, 1000, HOPPER_DEFAULT, bias=True, activation="gelu"),
                                    arch)
    assert report.nvcc == "compiled"


@pytest.fixture(scope="module", params=[(c, epilogue) for c in PINGPONG for epilogue in (False, True)],
                ids=lambda p: f"{p[0].label().replace(' ', '_')}{'-bias-gelu' if p[1] else ''}")
def pingpong_report(request):
    config, epilogue = request.param
    func = gemm_program(3900, 4104, 1000, config, bias=epilogue, activation="gelu" if epilogue else None)
    return config, epilogue, tourkit.inspect_kernel("pingpong", func, "sm_90a", nvcc=False)


def test_pingpong_warpgroups_take_turns_on_their_own_tiles(pingpong_report):
    config, _, report = pingpong_report
    tourkit.require_markers(report, ["wgmma", "tma_load", "mbarrier"])
    assert report.threads == 384 and tuple(report.grid) == (132, 1, 1)
    source = report.source
    assert re.search(r"reg_dealloc<40>", source) and re.search(r"reg_alloc<232>", source)
    # two consumer branches, each a whole tile's K loop (its own wgmma batches, one in flight)
    assert source.count("wait_wgmma<1>") == 2 and source.count("wait_wgmma<0>") >= 2
    # the turns: each warpgroup syncs on its own named barrier and arrives on the other's
    assert sorted(re.findall(r"__sync_thread_partial\((\d+), 256\)", source)) == ["8", "9"]
    assert sorted(re.findall(r"__named_barrier_arrive\((\d+), 256\)", source)) == ["8", "9"]
    # In each consumer branch: wait for the turn (its own id), the K loop, hand the turn over (the other's id),
    # then the epilogue; the strip store syncs only the warpgroup's own 128 threads, on an id below the turns'.
    starts = [m.start() for m in re.finditer(r"warpgroup_reg_alloc<", source)]
    branches = [source[a:b] for a, b in zip(starts, starts[1:] + [len(source)])]
    assert len(branches) == 2
    turns = []
    for branch in branches:
        sync = re.search(r"__sync_thread_partial\((\d+), 256\)", branch)
        arrive = re.search(r"__named_barrier_arrive\((\d+), 256\)", branch)
        assert sync.start() < branch.index("wgmma_ss<") < branch.index("wait_wgmma<0>") < arrive.start()
        assert arrive.start() < branch.index("tma_store(")  # the turn passes before the epilogue
        assert all(int(i) < 8 for i in re.findall(r"__sync_thread_partial\((\d+), 128\)", branch))
        turns.append((sync.group(1), arrive.group(1)))
    assert turns[0] == turns[1][::-1]  # each arrives where the other waits
    roles = source.index("warpgroup_reg_dealloc<")
    assert source.count("__syncthreads") == source[:roles].count("__syncthreads") == 1
    assert report.smem_bytes <= config.smem_bytes() < report.smem_bytes + 4096
    assert fits(config, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)


def test_pingpong_bias_has_a_slot_per_warpgroup(pingpong_report):
    _, epilogue, report = pingpong_report
    source = report.source
    if not epilogue:
        assert "Bias" not in source and "exp2f(" not in source
        return
    producer = source[:source.index("warpgroup_reg_alloc")]
    assert "tma_load(Bias_desc, bias_full[" in producer and "bias_empty[" in producer
    assert "Bias[" not in source  # never per element from global memory
    for slot in (0, 1):  # each consumer warpgroup waits for its slot, adds, hands it back, then GELU and store
        after = source[source.index(f"bias_full[{slot}].wait("):]
        assert after.index("Bias_s") < after.index(f"bias_empty[{slot}].arrive()") < after.index("exp2f(") < \
            after.index("tma_store(")


def test_pingpong_checks_its_shape():
    for bad, why in ((dict(block_M=256), "64 or 128"), (dict(threads=384), "threads"), (dict(persistent=0), "persistent"),
                     (dict(store_buffers=2), "store_buffers"), (dict(policy="Square"), "FullRow")):
        with pytest.raises(ValueError, match=why):
            gemm_program(1024, 1024, 1024, dataclasses.replace(PINGPONG[0], **bad))
    with pytest.raises(ValueError, match="needs Hopper"):
        require_hopper(PINGPONG[0], "sm_80")
    assert PINGPONG[0].label() == "128x128x64 s6 t256 swz8 FullRow pingpong persistent132"


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


WS_ODD_SIZES = [(1000, 1000, 1000), (1001, 1032, 1000)]
# The ping-pong kernels on 132 blocks get at most one tile a block at those sizes (warpgroup 1 idles), so they
# also run with 5 blocks, each walking ~14-16 tiles: both warpgroups take many turns, on ragged tiles too.
# Column panels on 5 blocks: the 8 x 4 tiles of 1000x1000 in one ragged panel of 4 columns, many tiles a block.
# The lean barrier options (one `empty` arrival per consumer warp, one producer warp) on a one-tile-per-block
# grid and on 5 blocks walking many tiles (the ring's phases across tiles), and a 256-row tile (each consumer
# warpgroup 128 rows, two m64 wgmma), and the whole-tile store on 5 blocks.
_ONE_TILE_WS = next(c for c in HAND_WS if not c.persistent)
GPU_HAND_WRITTEN = HAND_WS + PINGPONG + [dataclasses.replace(PINGPONG[0], persistent=5),
                                         dataclasses.replace(HAND_WS[0], persistent=5, panels="columns"),
                                         dataclasses.replace(PINGPONG[0], persistent=5, panels="columns"),
                                         dataclasses.replace(_ONE_TILE_WS, warp_arrivals=True, producer_warps=1),
                                         dataclasses.replace(HAND_WS[0], persistent=5, warp_arrivals=True,
                                                             producer_warps=1),
                                         dataclasses.replace(HAND_WS[0], block_M=256, block_N=128, persistent=5),
                                         # the whole tile staged, many tiles a block: each tile's stmatrix copy
                                         # waits for the previous tile's stores
                                         dataclasses.replace(HAND_WS[2], persistent=5),
                                         # even rounds that shrink the grid: the 32 tiles of 1000^3 take 3
                                         # rounds on 12 blocks, so 11 run (10 of them 3 tiles, one 2)
                                         dataclasses.replace(HAND_WS[2], persistent=12)]


def on_this_gpu(config: GemmConfig, sm_count: int) -> GemmConfig:
    """A persistent grid sized for the H200 (132) becomes one of this GPU's SM count; a small test grid stays."""
    return dataclasses.replace(config, persistent=sm_count) if config.persistent == 132 else config


@pytest.fixture(scope="module")
def ws_kernels_compiled():
    """Compile every kernel of the test below at once, on all cores (each test then loads it from the cache)."""
    device = tourkit.detect_device()
    if device is None or device.arch != "sm_90a":
        return
    jobs = []
    for config in GPU_HAND_WRITTEN:
        config = on_this_gpu(config, device.sm_count)
        for M, N, K in WS_ODD_SIZES:
            for activation in (None, "gelu"):
                jobs.append((gemm_program(M, N, K, config, bias=activation is not None, activation=activation),
                             epilogue_pass_configs(activation)))
    tourkit.compile_many(jobs)


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_HAND_WRITTEN, ids=lambda c: c.label().replace(" ", "_"))
@pytest.mark.parametrize("M,N,K", WS_ODD_SIZES)
@pytest.mark.parametrize("epilogue", [False, True])
def test_ws_schedules_validate_on_odd_sizes(config, M, N, K, epilogue, ws_kernels_compiled):
    """The hand-written kernels on tails in M, N and K, bare and with bias + exact GELU fused."""
    import torch

    if tourkit.detect_device().arch != "sm_90a":
        pytest.skip("the hand-written warp-specialized kernel is Hopper-only")
    config = on_this_gpu(config, tourkit.detect_device().sm_count)
    activation = "gelu" if epilogue else None
    kernel = compile_gemm(M, N, K, config, bias=epilogue, activation=activation)
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2, scale=K ** -0.5)
    c = tourkit.poison_(torch.empty((M, N), dtype=torch.float16, device="cuda"))
    if epilogue:
        bias = tourkit.random_tensor((N,), torch.float16, seed=3)
        launch, ref = (lambda: kernel(a, b, bias, c)), reference(a, b, bias, activation)
    else:
        launch, ref = (lambda: kernel(a, b, c)), reference(a, b)
    check = tourkit.validate(f"{config.label()} {M}x{N}x{K}", launch, c, ref, 5e-3)
    assert check.passed, check.line()


def test_head_to_head_takes_the_picks_whatever_the_screen_read():
    """The table's first three rows go to the head to head even when the one-pair screen reads them last
    (it did on one H200, 2026-12-03); the screen's three fastest join them, each once."""
    from sections import gemm_schedules

    table = [c for c in HOPPER_TABLE if fits(c, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)]
    screen = {cfg.label(): 1.0 + 0.01 * (len(table) - i) for i, cfg in enumerate(table)}  # the last row fastest
    contenders = gemm_schedules.head_to_head_contenders(table, screen)
    assert contenders == table[:3] + table[-1:-4:-1]

    screen = {cfg.label(): 1.0 + 0.01 * i for i, cfg in enumerate(table)}  # the screen agrees with the picks
    assert gemm_schedules.head_to_head_contenders(table, screen) == table[:3]

    screen[table[1].label()], screen[table[7].label()] = 0.5, 0.6  # one pick and one other row lead
    assert gemm_schedules.head_to_head_contenders(table, screen) == table[:3] + [table[7]]


def test_schedule_table_sends_the_picks_and_the_screens_fastest_to_the_head_to_head(monkeypatch):
    """run_schedule_table with the GPU faked (CPU matmuls, given timings): a screen that misreads the picks
    still sends them to the head to head, and its verdict is the section's best."""
    import torch

    from sections import gemm_schedules

    ctx = tourkit.TourContext(arch="sm_90a", echo=False)
    table = [c for c in HOPPER_TABLE if fits(c, ctx.smem_budget)]
    picks, misread = table[:3], table[6:9]  # the screen reads the picks slow and three other rows fast
    calls = []

    def fake_compile(M, N, K, config):
        return lambda a, b, c: c.copy_((a.float() @ b.float()).half())

    def fake_inputs(M, N, K):
        return (tourkit.random_tensor((M, K), torch.float16, seed=1, device="cpu"),
                tourkit.random_tensor((K, N), torch.float16, seed=2, device="cpu"),
                torch.empty((M, N), dtype=torch.float16))

    def fake_bench(contenders, rounds, pairs=None):
        calls.append((rounds, list(contenders)))
        for launch in contenders.values():
            launch()
        if pairs is None:  # the screen
            return {name: 0.95 if name in {c.label() for c in misread} else
                    1.06 if name in {c.label() for c in picks} else 1.0 for name in contenders}
        medians = {name: 0.97 if name == picks[2].label() else 1.0 for name in contenders}
        pairs.update({name: [t] * 3 for name, t in medians.items()})
        return medians

    monkeypatch.setattr(gemm_schedules, "compile_gemm", fake_compile)
    monkeypatch.setattr(gemm_schedules, "gemm_inputs", fake_inputs)
    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    best, ratio, _, _ = gemm_schedules.run_schedule_table(ctx, 64, 64, 64, HOPPER_TABLE)
    assert [rounds for rounds, _ in calls] == [2, gemm_schedules.HEAD_TO_HEAD_ROUNDS]
    assert calls[1][1] == ["cuBLAS"] + [c.label() for c in picks + misread]
    assert best == picks[2] and abs(ratio - 1 / 0.97) < 1e-9
    assert set(ctx.metrics["head_to_head"]) == {c.label() for c in picks + misread}


def test_head_to_head_decides_the_best_schedule(monkeypatch):
    """The table is a screen; the verdict comes from the leaders timed again against cuBLAS, three pairs."""
    from sections import gemm_schedules

    leaders = HAND_WS[:3]
    timed = {}

    def fake_bench(contenders, rounds, pairs):
        timed.update(rounds=rounds, names=list(contenders))
        # the screen's fastest (first) is slower head to head than the second; pair by pair the second's
        # ratio to cuBLAS runs from 1.00/0.97 to 1.02/0.95
        pairs.update({"cuBLAS": [1.00, 1.00, 1.02], leaders[0].label(): [1.02, 1.02, 1.02],
                      leaders[1].label(): [0.95, 0.97, 0.95], leaders[2].label(): [0.99, 0.99, 0.99]})
        return {"cuBLAS": 1.00, leaders[0].label(): 1.02, leaders[1].label(): 0.95, leaders[2].label(): 0.99}

    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    ctx = tourkit.TourContext(echo=False)
    kernels = {cfg: object() for cfg in leaders}
    best, ratio, tflops = gemm_schedules.head_to_head(ctx, 1024, 1024, 1024, leaders, kernels, (None,) * 4)
    assert timed["rounds"] == 6 and timed["names"] == ["cuBLAS"] + [c.label() for c in leaders]
    assert best == leaders[1] and abs(ratio - 1 / 0.95) < 1e-9
    assert abs(tflops - gemm_flops(1024, 1024, 1024) / 0.95e-3 / 1e12) < 1e-6
    assert ctx.metrics["head_to_head"][leaders[0].label()] == round(1 / 1.02, 3)
    assert any("<- best" in line and leaders[1].label() in line for line in ctx.report)
    best_row = next(line for line in ctx.report if line.startswith(leaders[1].label()))
    assert f"{1 / 0.97:.3f}-{1.02 / 0.95:.3f}x" in best_row  # the lowest and highest pair's ratio


def test_shape_set_reports_every_schedule_and_the_best_per_shape(monkeypatch):
    """--full's sweep, with the GPU faked: each schedule's kernel is a CPU matmul, the timings are given."""
    import torch

    from sections import gemm_schedules

    schedules = HAND_WS[:2]
    shapes = [(64, 32, 16), (32, 64, 16)]
    # per shape: cuBLAS, then the two schedules; the second wins the first shape, the first the second
    timings = iter([{"cuBLAS": 1.0, schedules[0].label(): 1.1, schedules[1].label(): 0.9},
                    {"cuBLAS": 1.0, schedules[0].label(): 0.8, schedules[1].label(): 1.25}])
    launched = []

    def fake_compile(M, N, K, config):
        def kernel(a, b, c):
            launched.append((M, N, K, config.label()))
            c.copy_((a.float() @ b.float()).half())
        return kernel

    def fake_inputs(M, N, K):
        return (tourkit.random_tensor((M, K), torch.float16, seed=1, device="cpu"),
                tourkit.random_tensor((K, N), torch.float16, seed=2, device="cpu"),
                torch.empty((M, N), dtype=torch.float16))

    def fake_bench(contenders, rounds, pairs):
        assert rounds == gemm_schedules.HEAD_TO_HEAD_ROUNDS  # a verdict: as many pairs as the head-to-head
        for launch in contenders.values():
            launch()  # every contender runs
        medians = next(timings)
        pairs.update({name: [t, t * 1.1, t] for name, t in medians.items()})  # the middle pair 10% slower
        return medians

    monkeypatch.setattr(gemm_schedules, "SHAPE_SET", shapes)
    monkeypatch.setattr(gemm_schedules, "compile_gemm", fake_compile)
    monkeypatch.setattr(gemm_schedules, "gemm_inputs", fake_inputs)
    monkeypatch.setattr(tourkit, "compile_many", lambda jobs, log=None: None)
    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    ctx = tourkit.TourContext(echo=False)
    ratios = gemm_schedules.run_shape_set(ctx, schedules)
    assert ratios == {"64x32x16": round(1 / 0.9, 3), "32x64x16": round(1 / 0.8, 3)}
    assert ctx.metrics["shape_set_every"]["64x32x16"] == {schedules[0].label(): round(1 / 1.1, 3),
                                                          schedules[1].label(): round(1 / 0.9, 3)}
    assert {label for *_, label in launched} == {c.label() for c in schedules}
    every_row = [line for line in ctx.report if line.startswith(schedules[1].label())]
    assert every_row and "1.111x" in every_row[0] and "0.800x" in every_row[0]
    best_row = next(line for line in ctx.report if line.startswith("64x32x16 "))
    assert "1.111x" in best_row and "1.111-1.111x" in best_row  # every pair gave the winner the same ratio
