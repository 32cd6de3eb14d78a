"""bench/gemm_ws_probe.py: the hand-written warp-specialized Hopper GEMM lowers for sm_90a with the pipeline
it was written for (CPU only; the GPU run is the probe itself)."""

import dataclasses
import os
import re
import sys

import pytest

import tourkit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gemm_ws_probe as probe  # noqa: E402


@pytest.fixture(scope="module", params=[(name, shape) for name in probe.ALL_VARIANTS
                                        for shape in [(8192, 8192, 8192), (1001, 1032, 1000)]],
                ids=lambda p: f"{p[0]}-{'x'.join(map(str, p[1]))}")
def lowered(request):
    name, shape = request.param
    report = tourkit.inspect_kernel(name, probe.program_for(name, *shape), "sm_90a", nvcc=False)
    return name, shape, report


def test_markers_launch_shape_and_shared_memory(lowered):
    name, (M, N, K), report = lowered
    assert probe.missing_markers(report.source) == []
    assert report.threads == 384  # two consumer warpgroups and the producer warpgroup
    if name.startswith("ws_multicast"):  # clusters of two blocks on vertically adjacent tiles
        pairs = -(-M // 256) * -(-N // 256)
        blocks = probe.EXPERIMENTS[name][1].get("num_sms", probe.H200_SMS)
        assert report.grid == (2, blocks // 2 if probe.is_persistent(name) else pairs, 1)
    elif probe.is_persistent(name):
        assert report.grid == (probe.H200_SMS, 1, 1)
    else:
        assert report.grid == (-(-N // 256), -(-M // 128), 1)
    assert report.smem_bytes <= probe.SMEM_LIMIT


def test_consumers_release_the_previous_stage_only_after_wait_1(lowered):
    _, _, report = lowered
    loop = probe.consumer_main_loop(report.source)
    assert probe.main_loop_syncs(report.source) == 0  # no block-wide barrier between K steps
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    release = loop.index("empty[", wait_one)
    assert issue < wait_one < release
    assert re.search(r"if \(0 < k\w*\) \{\s*empty\[", loop[wait_one:])  # nothing to release at step 0
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")  # the drain, then the last stage's release


def test_producer_waits_for_free_stages_with_the_flipped_parity(lowered):
    _, _, report = lowered
    assert re.search(r"empty\[[^\]]*\]\.wait\(.*\^ 1\)\);", report.source)
    assert re.search(r"full\[[^\]]*\]\.expect_transaction\(", report.source)
    assert re.search(r"warpgroup_reg_dealloc<(24|40)>", report.source)
    assert re.search(r"warpgroup_reg_alloc<(240|232)>", report.source)


def test_register_split_fits_the_register_file():
    for consumers in (1, 2, 3):
        for persistent in (False, True):
            producer, consumer = probe.register_split(consumers, persistent)
            assert 128 * producer + 128 * consumers * consumer <= 65536
            assert consumer % 8 == 0 and consumer <= 240
    assert probe.register_split(2, False) == (24, 240)
    assert probe.register_split(2, True) == (40, 232)


def test_bad_arguments_are_rejected():
    ws = probe.VARIANTS["ws"]
    with pytest.raises(ValueError, match="64 x"):
        probe.gemm_program(1024, 1024, 1024, dataclasses.replace(ws, block_M=256))
    with pytest.raises(ValueError, match="multiples of 8"):
        probe.gemm_program(1024, 1001, 1024, ws)
    assert probe.parse_shape("8192x28672x4096") == (8192, 28672, 4096)


def test_shapes_and_flags():
    args = probe.parse_args(["--quick"])
    assert args.shapes == [(8192, 8192, 8192)] and args.variants == probe.ALL_VARIANTS
    args = probe.parse_args(["--shapes", "4096x4096x4096,1024x8192x8192", "--variants", "ws"])
    assert args.shapes == [(4096, 4096, 4096), (1024, 8192, 8192)] and args.variants == ["ws"]


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
def test_ptxas_neither_spills_nor_serializes_wgmma():
    for report in probe.inspect_variants(probe.ALL_VARIANTS):
        assert "error" not in report, report.get("error")
        assert probe.spilled_bytes(report) == 0, report["variant"]
        assert not any("C7514" in w or "serialized" in w for w in report["warnings"]), report["warnings"]


@pytest.fixture(scope="module", params=[n for n, (b, _) in probe.EXPERIMENTS.items() if b == "gemm_pingpong_program"])
def pingpong_source(request):
    report = tourkit.inspect_kernel(request.param, probe.program_for(request.param, 1001, 1032, 1000), "sm_90a",
                                    nvcc=False)
    return report.source


def consumer_branches(source: str) -> list[str]:
    """The two consumer warpgroups' code: from each warpgroup_reg_alloc to the next one (or the end)."""
    starts = [m.start() for m in re.finditer(r"warpgroup_reg_alloc<", source)]
    return [source[a:b] for a, b in zip(starts, starts[1:] + [len(source)])]


def test_pingpong_warpgroups_take_turns_on_their_own_tiles(pingpong_source):
    """Each consumer warpgroup waits for its turn (bar.sync on its own id, 256 threads) before its K loop and
    hands the turn over (bar.arrive on the other's id) after it, before its epilogue; each stores through its
    own shared strip under a 128-thread barrier. No __syncthreads after the mbarrier init."""
    branches = consumer_branches(pingpong_source)
    assert len(branches) == 2
    own_ids = []
    for branch in branches:
        sync = re.search(r"__sync_thread_partial\((\d+), 256\)", branch)
        arrive = re.search(r"__named_barrier_arrive\((\d+), 256\)", branch)
        assert sync and arrive and sync.group(1) != arrive.group(1)
        assert sync.start() < branch.index("wgmma_ss<") < branch.index("wait_wgmma<0>") < arrive.start()
        assert arrive.start() < branch.index("tma_store(")  # the turn passes before the epilogue
        assert re.search(r"__sync_thread_partial\(\d+, 128\)", branch)  # the strip, this warpgroup alone
        own_ids.append((sync.group(1), arrive.group(1)))
    assert own_ids[0] == own_ids[1][::-1]  # each arrives where the other waits
    assert pingpong_source.count("__syncthreads") == 1
    assert "C_s0" in branches[1] and "C_s1" in branches[0]  # threadIdx >= 128 is tested first: warpgroup 1


@pytest.mark.parametrize("name", ["ws_multicast", "ws_multicast_persistent"])
def test_multicast_shares_b_and_releases_stages_in_both_blocks(name):
    """Rank 0 multicasts the B tile into both blocks; each block loads its own A; every consumer thread
    arrives on the stage's `empty` barrier of both blocks, which wait for 2 x 256 arrivals; the blocks meet
    at a cluster barrier before leaving."""
    report = tourkit.inspect_kernel(name, probe.program_for(name, 1001, 1032, 1000), "sm_90a", nvcc=False)
    source = report.source
    assert "tma_load_multicast(B_desc" in source and "tma_load(A_desc" in source
    assert "tma_load_multicast(A_desc" not in source
    assert re.search(r"empty\[0\]\.init\(512\)", source) and re.search(r"full\[0\]\.init\(128\)", source)
    loop = probe.consumer_main_loop(source)
    assert re.search(r"empty\[[^\]]*\]\.arrive\(0u\);\s*empty\[[^\]]*\]\.arrive\(1u\);", loop)
    tail = source[source.rindex("tma_store_wait"):]
    assert "cluster_sync()" in tail
