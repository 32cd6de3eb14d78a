"""bench/gemm_ws_probe.py: its variants of the appendix kernels lower for sm_90a with the pipeline they were
written for, and ptxas neither spills nor serializes wgmma in the register-heavy ones (CPU only; the GPU run
is the probe itself)."""

import functools
import os
import re
import sys

import pytest

import tourkit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gemm_ws_probe as probe  # noqa: E402

LOWERED = ["ws", "ws_persistent_db", "ws_persistent_256x128", "ws_persistent_192x192", "pingpong"]


@functools.lru_cache(maxsize=None)
def lower(name, shape):
    return tourkit.inspect_kernel(name, probe.program_for(name, *shape), "sm_90a", nvcc=False)


@pytest.fixture(scope="module", params=LOWERED)
def lowered(request):
    shape = (1001, 1032, 1000)
    return request.param, shape, lower(request.param, shape)


def test_markers_launch_shape_and_shared_memory(lowered):
    name, (M, N, K), report = lowered
    config = probe.VARIANTS[name]
    assert probe.missing_markers(report.source) == []
    assert report.threads == config.threads + 128  # the consumer warpgroups and the producer warpgroup
    if probe.is_persistent(name):
        assert report.grid == (probe.H200_SMS, 1, 1)
    else:
        assert report.grid == (-(-N // config.block_N), -(-M // config.block_M), 1)
    assert report.smem_bytes <= config.smem_bytes() <= probe.SMEM_LIMIT


def test_consumers_release_the_previous_stage_only_after_wait_1(lowered):
    _, _, report = lowered
    loop = probe.consumer_main_loop(report.source)
    assert probe.main_loop_syncs(report.source) == 0  # no block-wide barrier between K steps
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    assert issue < wait_one < loop.index("empty[", wait_one)
    assert re.search(r"if \(0 < k\w*\) \{\s*empty\[", loop[wait_one:])  # nothing to release at step 0
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")  # the drain, then the last stage's release


def test_register_split_fits_the_register_file():
    for consumers in (1, 2, 3):
        for persistent in (False, True):
            producer, consumer = probe.register_split(consumers, persistent)
            assert 128 * producer + 128 * consumers * consumer <= 65536
            assert consumer % 8 == 0 and consumer <= 240
    assert probe.register_split(2, False) == (24, 240) and probe.register_split(2, True) == (40, 232)


def test_variants_shapes_and_flags():
    assert set(probe.TOUR_CONFIGS) == {"lesson 128x256 s4", "lesson 256x192 FullCol"}
    assert probe.describe("pingpong_192").startswith("hand-written ping-pong")
    args = probe.parse_args(["--quick"])
    assert args.shapes == [(8192, 8192, 8192)] and args.variants == probe.ALL_VARIANTS
    args = probe.parse_args(["--shapes", "4096x4096x4096,1024x8192x8192", "--variants", "ws"])
    assert args.shapes == [(4096, 4096, 4096), (1024, 8192, 8192)] and args.variants == ["ws"]
    assert probe.parse_shape("8192x28672x4096") == (8192, 28672, 4096)
    with pytest.raises(SystemExit):
        probe.parse_args(["--variants", "ws_streamk"])


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
def test_ptxas_neither_spills_nor_serializes_wgmma():
    for report in probe.inspect_variants(["ws_persistent_256x128", "ws_persistent_192x192"]):
        assert "error" not in report, report.get("error")
        assert report.get("registers") and report.get("spill_stores") is not None, report  # ptxas -v was read
        assert probe.spilled_bytes(report) == 0, report["variant"]
        assert not any("C7514" in w or "serialized" in w for w in report["warnings"]), report["warnings"]
