"""sections/hopper/gemm_ws.py: the hand-written warp-specialized GEMM's codegen, shapes and grid (CPU); odd sizes
on 132, 12 and 5 blocks, bare and with bias + GELU (GPU)."""

import dataclasses
import re

import pytest

import tourkit
from sections.gemm_epilogue import epilogue_pass_configs
from sections.gemm_schedules import reference
from sections.hopper import gemm_ws

APPENDIX = gemm_ws.appendix_schedule(8192, 8192, 8192, 132)
ONE_TILE = gemm_ws.WsConfig(128, 256, 64, 4, 256, True)
STRIPS2 = gemm_ws.WsConfig(128, 256, 64, 4, 256, True, persistent=132, store_buffers=2, even_rounds=True)
PAIRS = gemm_ws.WsConfig(128, 192, 64, 4, 256, True, persistent=132, store_buffers=3, even_rounds=True, pairs=True)
LOWERED = [(APPENDIX, False), (APPENDIX, True), (ONE_TILE, False), (STRIPS2, True), (PAIRS, True)]


@pytest.fixture(scope="module", params=LOWERED, ids=lambda p: f"{p[0].label()}{' +bias+gelu' if p[1] else ''}")
def ws_report(request):
    config, epilogue = request.param
    func = gemm_ws.appendix_program(1001, 1032, 1000, config, bias=epilogue, activation="gelu" if epilogue else None)
    return config, epilogue, tourkit.inspect_kernel("ws", func, "sm_90a", nvcc=False,
                                                    pass_configs=epilogue_pass_configs("gelu" if epilogue else None))


def consumer_loop(source: str) -> str:
    """From the consumers' first wait on a `full` barrier to their final drain (wait_wgmma<0>)."""
    start = re.search(r"full\[[^\]]*\]\.wait\(", source)
    return source[start.start():source.index("wait_wgmma<0>")]


def test_tma_wgmma_mbarriers_and_one_batch_in_flight(ws_report):
    config, _, report = ws_report
    tourkit.require_markers(report, ["wgmma", "tma_load", "mbarrier"])
    assert report.threads == config.block_threads == config.threads + 128  # the producer warpgroup, by hand
    loop = consumer_loop(report.source)
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    assert issue < wait_one < loop.index("empty[", wait_one)  # the previous stage is released after wait<1>
    assert "__syncthreads" not in loop and "bar.sync" not in loop
    assert re.search(r"empty\[[^\]]*\]\.wait\(.*\^ 1\)\);", report.source)  # the producer's flipped parity
    # after the mbarrier init the roles never meet at __syncthreads again (the producer would not come)
    roles = report.source.index("warpgroup_reg_dealloc<")
    assert report.source.count("__syncthreads") == report.source[:roles].count("__syncthreads") == 1


def test_persistent_loop_strides_by_the_grid_and_splits_the_registers(ws_report):
    config, _, report = ws_report
    if config.persistent:
        blocks = gemm_ws.persistent_blocks_for(1001, 1032, config)
        # 8 x 5 tiles (8 x 6 of 128x192 in 4 x 6 pairs of rows): one round, so even rounds run 40 (48) blocks
        assert blocks == (48 if config.pairs else 40)
        assert tuple(report.grid) == (blocks, 1, 1)
        workers = blocks // 2 if config.pairs else blocks  # a worker of pairs is a cluster of two blocks
        assert len(re.findall(rf"\+ {workers}\);", report.source)) == 2  # producer and consumers stride by them
        assert "reg_dealloc<40>" in report.source and "reg_alloc<232>" in report.source
    else:
        assert tuple(report.grid) == (-(-1032 // config.block_N), -(-1001 // config.block_M), 1)
        assert "reg_dealloc<24>" in report.source and "reg_alloc<240>" in report.source


def test_epilogue_adds_the_producers_bias_tile_then_gelu_before_the_store(ws_report):
    _, epilogue, report = ws_report
    source = report.source
    after_loop = source[source.index("wait_wgmma<0>"):]
    if not epilogue:
        assert "Bias" not in source and "exp2f(" not in source
        return
    producer = source[:source.index("warpgroup_reg_alloc")]
    assert "tma_load(Bias_desc, bias_full[0]" in producer and "bias_empty[0].wait(" in producer
    assert "Bias[" not in source  # never per element from global memory
    assert (after_loop.index("bias_full[0].wait(") < after_loop.index("Bias_s") <
            after_loop.index("bias_empty[0].arrive()") < after_loop.index("exp2f(") < after_loop.index("tma_store("))


def test_store_in_strips_or_the_whole_tile_at_once(ws_report):
    config, _, report = ws_report
    epilogue = report.source[report.source.rindex("wait_wgmma<0>"):]
    strips = config.block_N // 64
    if config.stages_whole_tile:  # one stmatrix copy between two barriers, then one thread's TMA stores
        assert epilogue.count("__sync_thread_partial") == 2 and "ptx_stmatrix_m8n8_x4(" in epilogue
        assert epilogue.count("tma_store_wait<0, true>") == 2  # before the copy, and the kernel's final drain
        assert re.search(rf"for \(int \w+ = 0; \w+ < {strips}; \+\+\w+\) \{{\s*tl::tma_store\(", epilogue)
    else:
        assert "ptx_stmatrix" not in epilogue
        assert re.search(rf"for \(int \w+ = 0; \w+ < {strips}; \+\+\w+\) \{{\s*"
                         rf"tl::tma_store_wait<{config.store_buffers - 1}, true>\(\);\s*tl::__sync_thread_partial",
                         epilogue)


def test_smem_estimate_bounds_the_lowered_kernel(ws_report):
    config, _, report = ws_report
    assert report.smem_bytes <= config.smem_bytes() < report.smem_bytes + 4096
    assert config.smem_bytes() <= tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin


def test_the_appendix_schedule_and_its_checks():
    assert APPENDIX == gemm_ws.WsConfig(128, 256, 64, 3, 256, True, panel=8, policy="FullRow", persistent=132,
                                        store_buffers=4, even_rounds=True)
    assert APPENDIX.stages_whole_tile and gemm_ws.appendix_schedule(1000, 1000, 1000, 78).persistent == 78
    assert APPENDIX.columns()["kernel"] == "hand-written ws, persistent on 132 SMs, even rounds"
    assert APPENDIX.columns()["policy"] == "FullRow, whole-tile store"
    for bad, why in ((dict(block_M=192), "64 x"), (dict(policy="Square"), "FullRow"), (dict(block_N=200), "strips"),
                     (dict(store_buffers=5), "store"), (dict(persistent=0), "even_rounds")):
        with pytest.raises(ValueError, match=why):
            gemm_ws.appendix_program(1024, 1024, 1024, dataclasses.replace(APPENDIX, **bad))
    with pytest.raises(ValueError, match="16 bytes"):
        gemm_ws.appendix_program(1000, 1001, 1000, APPENDIX)


def test_even_rounds_run_the_fewest_blocks_that_take_no_more_rounds_of_tiles():
    # 128x256 tiles at 4096^3, 8192^3, 8192x4096x14336, 1024x8192x8192, 16384^3, 8192x28672x4096, 1000^3; then
    # one round exactly, and one tile over it
    for tiles, blocks in ((512, 128), (2048, 128), (1024, 128), (256, 128), (8192, 131), (7168, 131), (32, 32),
                          (132, 132), (133, 67)):
        rounds = -(-tiles // 132)
        assert gemm_ws.persistent_grid(APPENDIX, tiles) == blocks
        assert -(-tiles // blocks) == rounds < -(-tiles // (blocks - 1))  # as few rounds as 132 blocks; the fewest
    assert gemm_ws.persistent_grid(dataclasses.replace(APPENDIX, even_rounds=False), 512) == 132
    report = tourkit.inspect_kernel("ws", gemm_ws.appendix_program(4096, 4096, 4096, APPENDIX), "sm_90a", nvcc=False)
    assert report.grid[0] == 128  # the lowered kernel launches that grid


def test_pairs_multicast_b_and_free_each_stage_in_both_blocks():
    report = tourkit.inspect_kernel("ws", gemm_ws.appendix_program(1100, 1032, 1000, PAIRS), "sm_90a", nvcc=False)
    source = report.source
    assert tuple(report.grid) == (60, 1, 1)  # 9 tile rows: 5 pairs a column, the last one's second row past the end
    assert source.count("tma_load_multicast(B_desc") == 1 and "tma_load_multicast(A_desc" not in source
    assert all(f"empty[{s}].init(512)" in source for s in range(4))  # both blocks' 256 consumers free a stage
    assert source.count(".arrive((1 - tl::block_rank_in_cluster()))") == 2  # in the loop, and the last stage
    # the blocks meet after their barriers are set up (the partner's loads land in them) and before they exit
    assert source.count("tl::cluster_sync()") == 2
    assert source.index("fence_barrier_init") < source.index("tl::cluster_sync()") < source.index("reg_dealloc")
    for grid in (131, 0):
        with pytest.raises(ValueError, match="even persistent grid"):
            gemm_ws.appendix_program(1024, 1024, 1024, dataclasses.replace(PAIRS, persistent=grid, even_rounds=False))


def test_the_appendix_takes_pairs_where_b_rows_are_off_128_byte_lines_in_few_rounds():
    for shape in ((2500, 1000, 3000), (3000, 3000, 3000), (2000, 3000, 4000), (2056, 4104, 4096), (1000, 3000, 1000),
                  (7000, 3000, 2000)):  # the last: 660 tiles of 128x256, five rounds
        config = gemm_ws.appendix_schedule(*shape, 132)
        assert config.pairs and config.persistent == 132 and shape[1] % 64
        assert config.label().endswith("persistent on 132 SMs, even rounds, clusters of 2 sharing B")
    # B rows on 128-byte lines (1280 columns, though 128x192 tiles leave the last column partial; only A's rows
    # off them); 128-wide tiles; ten rounds of tiles; an odd SM count
    for shape, sms in (((1920, 1280, 2560), 132), ((2048, 2048, 3000), 132), ((1000, 1000, 1000), 132),
                       ((10000, 4000, 3000), 132), ((2500, 1000, 3000), 133)):
        assert not gemm_ws.appendix_schedule(*shape, sms).pairs


def test_persistent_pairs_walk_pairs_of_tile_rows_in_clusters():
    config = PAIRS  # its codegen: test_pairs_multicast_b_and_free_each_stage_in_both_blocks
    # 2500x1000x3000: 20 x 6 tiles, 60 pairs: one round of 60 clusters; 1100 rows: 9 tile rows, 5 pairs a column
    assert gemm_ws.persistent_blocks_for(2500, 1000, config) == 120
    assert gemm_ws.persistent_blocks_for(1100, 1032, config) == 60
    # 4096^2: 16 pairs of tile rows x 22 columns, 352 pairs: 6 rounds on 66 clusters, so 59 clusters take them
    assert gemm_ws.persistent_blocks_for(4096, 4096, config) == 2 * 59
    report = tourkit.inspect_kernel("ws", gemm_ws.appendix_program(4096, 4096, 1024, config), "sm_90a", nvcc=False)
    assert tuple(report.grid) == (118, 1, 1)
    assert len(re.findall(r"\+ 59\);", report.source)) == 2  # producer and consumers stride by the 59 clusters


# GPU: the ring's phases across tiles need blocks that walk many tiles: 5 blocks on the 32 tiles of 1000^3; even
# rounds that shrink the grid: 12 blocks take 3 rounds, so 11 run (10 of them 3 tiles, one 2).
ODD_SIZES = [(1000, 1000, 1000), (1001, 1032, 1000)]
GPU_KERNELS = [APPENDIX, ONE_TILE, STRIPS2, dataclasses.replace(APPENDIX, persistent=5),
               dataclasses.replace(APPENDIX, persistent=12), dataclasses.replace(STRIPS2, persistent=5),
               gemm_ws.WsConfig(256, 128, 64, 4, 256, True, persistent=5)]


def on_this_gpu(config, sm_count: int):
    """A grid sized for 132 SMs becomes one of this GPU's SM count; a small test grid stays."""
    return dataclasses.replace(config, persistent=sm_count) if config.persistent == 132 else config


@pytest.fixture(scope="module")
def compiled_all():
    device = tourkit.detect_device()
    if device is None or device.arch != "sm_90a":
        return
    tourkit.compile_many([(gemm_ws.appendix_program(M, N, K, on_this_gpu(c, device.sm_count), bias=act is not None,
                                                    activation=act), epilogue_pass_configs(act))
                          for c in GPU_KERNELS for M, N, K in ODD_SIZES for act in (None, "gelu")])


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_KERNELS, ids=lambda c: c.label())
@pytest.mark.parametrize("M,N,K", ODD_SIZES)
@pytest.mark.parametrize("epilogue", [False, True])
def test_validates_on_odd_sizes(config, M, N, K, epilogue, compiled_all):
    device = tourkit.detect_device()
    if device.arch != "sm_90a":
        pytest.skip("the hand-written warp-specialized kernel is Hopper-only")
    config = on_this_gpu(config, device.sm_count)
    activation = "gelu" if epilogue else None
    kernel = gemm_ws.compile_appendix(M, N, K, config, bias=epilogue, activation=activation)
    check_on_odd_size(kernel, M, N, K, activation, config.label())


def check_on_odd_size(kernel, M: int, N: int, K: int, activation, name: str) -> None:
    """The kernel against the float32 reference, into a poisoned C; with bias + activation when one is given."""
    import torch

    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2, scale=K ** -0.5)
    c = tourkit.poison_(torch.empty((M, N), dtype=torch.float16, device="cuda"))
    if activation:
        bias = tourkit.random_tensor((N,), torch.float16, seed=3)
        launch, ref = (lambda: kernel(a, b, bias, c)), reference(a, b, bias, activation)
    else:
        launch, ref = (lambda: kernel(a, b, c)), reference(a, b)
    check = tourkit.validate(f"{name} {M}x{N}x{K}", launch, c, ref, 5e-3)
    assert check.passed, check.line()


# Cluster pairs: an odd number of tile rows (the last pair's second block past the end) and a long K over
# one wave of pairs.
PAIR_SIZES = [(1100, 1032, 1000), (2500, 1000, 3000)]
PAIR_KERNELS = [PAIRS, dataclasses.replace(PAIRS, persistent=6, even_rounds=False),
                gemm_ws.WsConfig(128, 256, 64, 3, 256, True, persistent=6, store_buffers=4, pairs=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", PAIR_KERNELS, ids=lambda c: c.label())
@pytest.mark.parametrize("M,N,K", PAIR_SIZES)
@pytest.mark.parametrize("epilogue", [False, True])
def test_cluster_pairs_validate_on_odd_sizes(config, M, N, K, epilogue):
    device = tourkit.detect_device()
    if device.arch != "sm_90a":
        pytest.skip("the hand-written warp-specialized kernel is Hopper-only")
    activation = "gelu" if epilogue else None
    kernel = gemm_ws.compile_appendix(M, N, K, config, bias=epilogue, activation=activation)
    for _ in range(3):  # a stage freed in one block only would show as a race over repeated calls
        check_on_odd_size(kernel, M, N, K, activation, config.label())
