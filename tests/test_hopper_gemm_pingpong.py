"""sections/hopper/gemm_pingpong.py: the ping-pong GEMM's turns and bias slots (CPU); odd sizes on 132 and 5 blocks,
bare and with bias + GELU (GPU)."""

import dataclasses
import re

import pytest

import tourkit
from sections.gemm_epilogue import epilogue_pass_configs
from sections.hopper import gemm_pingpong
from test_hopper_gemm_ws import check_on_odd_size

FUSED = gemm_pingpong.appendix_schedule(8192, 8192, 8192, 132)
SQUARE = gemm_pingpong.PingPongConfig(128, 128, 64, 6, persistent=132)


@pytest.fixture(scope="module", params=[(FUSED, True), (SQUARE, False)],
                ids=lambda p: f"{p[0].label()}{' +bias+gelu' if p[1] else ''}")
def pingpong_report(request):
    config, epilogue = request.param
    activation = "gelu" if epilogue else None
    func = gemm_pingpong.appendix_program(3900, 4104, 1000, config, bias=epilogue, activation=activation)
    return config, epilogue, tourkit.inspect_kernel("pingpong", func, "sm_90a", nvcc=False,
                                                    pass_configs=epilogue_pass_configs(activation))


def test_warpgroups_take_turns_on_their_own_tiles(pingpong_report):
    config, _, report = pingpong_report
    tourkit.require_markers(report, ["wgmma", "tma_load", "mbarrier"])
    assert report.threads == config.block_threads == 384 and tuple(report.grid) == (132, 1, 1)
    source = report.source
    assert "reg_dealloc<40>" in source and "reg_alloc<232>" in source
    # two consumer branches, each a whole tile's K loop (its own wgmma batches, one in flight)
    assert source.count("wait_wgmma<1>") == 2 and source.count("wait_wgmma<0>") >= 2
    # the turns: each warpgroup syncs on its own named barrier and arrives on the other's
    assert sorted(re.findall(r"__sync_thread_partial\((\d+), 256\)", source)) == ["8", "9"]
    assert sorted(re.findall(r"__named_barrier_arrive\((\d+), 256\)", source)) == ["8", "9"]
    starts = [m.start() for m in re.finditer(r"warpgroup_reg_alloc<", source)]
    branches = [source[a:b] for a, b in zip(starts, starts[1:] + [len(source)])]
    assert len(branches) == 2
    turns = []
    for branch in branches:  # wait for the turn, the K loop, hand the turn over, then the epilogue
        sync = re.search(r"__sync_thread_partial\((\d+), 256\)", branch)
        arrive = re.search(r"__named_barrier_arrive\((\d+), 256\)", branch)
        assert sync.start() < branch.index("wgmma_ss<") < branch.index("wait_wgmma<0>") < arrive.start()
        assert arrive.start() < branch.index("tma_store(")
        assert all(int(i) < 8 for i in re.findall(r"__sync_thread_partial\((\d+), 128\)", branch))
        turns.append((sync.group(1), arrive.group(1)))
    assert turns[0] == turns[1][::-1]  # each arrives where the other waits
    roles = source.index("warpgroup_reg_dealloc<")
    assert source.count("__syncthreads") == source[:roles].count("__syncthreads") == 1
    assert report.smem_bytes <= config.smem_bytes() < report.smem_bytes + 4096


def test_bias_has_a_slot_per_warpgroup(pingpong_report):
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


def test_the_fused_schedule_and_its_checks():
    assert FUSED == gemm_pingpong.PingPongConfig(128, 192, 64, 4, persistent=132)
    assert FUSED.columns()["kernel"] == "hand-written ping-pong, persistent on 132 SMs"
    for bad, why in ((dict(block_M=256), "64 or 128"), (dict(threads=384), "threads"),
                     (dict(persistent=0), "persistent"), (dict(policy="Square"), "FullRow")):
        with pytest.raises(ValueError, match=why):
            gemm_pingpong.appendix_program(1024, 1024, 1024, dataclasses.replace(FUSED, **bad))


# GPU: on 132 blocks the odd sizes give at most one tile a block (warpgroup 1 idles), so they also run on 5
# blocks, each walking ~14-16 tiles: both warpgroups take many turns, on ragged tiles too.
ODD_SIZES = [(1000, 1000, 1000), (1001, 1032, 1000)]
GPU_KERNELS = [FUSED, SQUARE, dataclasses.replace(SQUARE, persistent=5), dataclasses.replace(FUSED, persistent=5)]


@pytest.mark.gpu
@pytest.mark.parametrize("config", GPU_KERNELS, ids=lambda c: c.label())
@pytest.mark.parametrize("M,N,K", ODD_SIZES)
@pytest.mark.parametrize("epilogue", [False, True])
def test_validates_on_odd_sizes(config, M, N, K, epilogue):
    device = tourkit.detect_device()
    if device.arch != "sm_90a":
        pytest.skip("the ping-pong kernel is Hopper-only")
    if config.persistent == 132:
        config = dataclasses.replace(config, persistent=device.sm_count)
    activation = "gelu" if epilogue else None
    kernel = gemm_pingpong.compile_appendix(M, N, K, config, bias=epilogue, activation=activation)
    check_on_odd_size(kernel, M, N, K, activation, config.label())
