"""The GEMM experiments in bench/ (CPU): the stream-K walk covers every (tile, K step) once, shared tiles' partials
never share a workspace slot, and the kernel lowers for sm_90a with its hand-off; the multicast ring lowers with
its cluster, multicast load and remote arrivals, and refuses a problem it cannot pair; the probe reads its
--kernels."""

import importlib.util
import os
import random

import pytest

from sections.gemm_plans import GemmConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_streamk():
    return load_bench("gemm_streamk")


def check_walk(S, M, N, K, config):
    tiles, steps, units, workers = S.units_of(M, N, K, config)
    pieces = {}
    for w, t, lo, hi in S.segments(M, N, K, config):
        assert 0 <= lo < hi <= steps
        pieces.setdefault(t, []).append((lo, hi, w))
    assert sorted(pieces) == list(range(tiles))
    slots = set()
    for t, parts in pieces.items():
        parts.sort()
        assert parts[0][0] == 0 and parts[-1][1] == steps  # the whole K loop, once
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        first, final = S.contributors(t, steps, units, workers)
        assert [w for _, _, w in parts] == list(range(first, final + 1))
        if len(parts) > 1:
            for w in range(first, final + 1):
                slot = S.partial_slot(w, t, steps, units, workers)
                assert slot not in slots and 0 <= slot < S.workspace_shapes(M, N, K, config)["partials"][0]
                slots.add(slot)


@pytest.mark.parametrize("M, N, K, workers", [(2500, 1000, 3000, 132), (1000, 1000, 1000, 132), (128, 4096, 11008, 132),
                                              (100, 100, 64, 132), (7, 13, 5, 132), (3000, 3000, 3000, 114)])
def test_the_walk_covers_every_unit_once(M, N, K, workers):
    S = load_streamk()
    for bm, bn in ((128, 256), (128, 128)):
        check_walk(S, M, N, K, GemmConfig(bm, bn, 64, 3, 256, True, persistent=workers))


def test_random_problems_walk_correctly():
    S = load_streamk()
    rng = random.Random(7)
    for _ in range(300):
        M, N, K = rng.randint(1, 6000), rng.randint(1, 6000), rng.randint(1, 12000)
        check_walk(S, M, N, K, GemmConfig(128, 256, 64, 3, 256, True, persistent=rng.choice([1, 7, 114, 132])))


def test_streamk_lowers_for_sm_90a_with_its_hand_off():
    import tilelang
    from tvm.target import Target

    S = load_streamk()
    config = GemmConfig(128, 128, 64, 5, 256, True, policy="FullRow", persistent=132)
    target = Target({"kind": "cuda", "arch": "sm_90a"})
    with target:
        source = tilelang.lower(S.streamk_program(2500, 1000, 3000, config), target=target).kernel_source
    assert "AtomicAddRet" in source and "__threadfence" in source and "wgmma" in source and "tma_load" in source


def lower_sm90a(program) -> str:
    import tilelang
    from tvm.target import Target

    target = Target({"kind": "cuda", "arch": "sm_90a"})
    with target:
        return tilelang.lower(program, target=target).kernel_source


@pytest.mark.parametrize("share", ["A", "B"])
def test_multicast_ring_lowers_for_sm_90a(share):
    MC = load_bench("gemm_multicast")
    source = lower_sm90a(MC.multicast_program(2500, 1000, 3000, block_M=128, block_N=192, num_stages=4, share=share))
    assert "tma_load_multicast" in source and "cluster_sync" in source and "wgmma" in source
    assert source.count(".arrive((1 - tl::block_rank_in_cluster()))") == 2  # each stage freed in the partner too
    assert "init(512)" in source  # an empty barrier waits for both blocks' 256 consumer threads


def test_multicast_ring_refuses_an_odd_number_of_tiles_to_pair():
    MC = load_bench("gemm_multicast")
    with pytest.raises(ValueError, match="even number of tiles along M"):
        MC.multicast_program(128, 4096, 4096, block_N=192, share="B")  # one row of tiles: nothing to pair
    with pytest.raises(ValueError, match="even number of tiles along N"):
        MC.multicast_program(4096, 1300, 4096, block_N=192, share="A")  # 7 columns of tiles
    MC.multicast_program(4096, 1300, 4096, block_N=192, share="B")  # 32 rows of tiles: pairs along M


def test_the_probe_reads_its_kernels():
    import sys

    sys.path.insert(0, os.path.join(ROOT, "bench"))
    probe = load_bench("gemm_experiments_probe")
    label, kind, what = probe.parse_kernel("mc:128x192:4:B", 132)
    assert kind == "mc" and what == dict(block_M=128, block_N=192, num_stages=4, share="B") and "sharing B" in label
    label, kind, config = probe.parse_kernel("sk:128x256:3", 132)
    assert kind == "sk" and config.persistent == 132 and config.block_N == 256
    label, kind, config = probe.parse_kernel("ws:128x128:5", 132)
    assert kind == "ws" and config.persistent == 0 and config.store_buffers == 2
    with pytest.raises(ValueError, match="unknown kernel kind"):
        probe.parse_kernel("zz:128x128:5", 132)
