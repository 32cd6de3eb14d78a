"""bench/gemm_wave_probe.py: each problem it times has exactly the tiles asked for, and its kernels lower (CPU)."""

import importlib.util
import os

import pytest

import tourkit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_probe():
    spec = importlib.util.spec_from_file_location("gemm_wave_probe", os.path.join(ROOT, "bench", "gemm_wave_probe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("blocks", [1, 7, 33, 66, 99, 132, 198, 264])
def test_each_problem_has_exactly_the_blocks_asked_for(blocks):
    probe = load_probe()
    assert len(probe.TILES) >= 4 and all(c.block_M >= 128 for c in probe.TILES)
    for config in probe.TILES:
        M, N = probe.shape_for(config, blocks)
        assert (M // config.block_M) * (N // config.block_N) == blocks
        assert M % config.block_M == 0 and N % config.block_N == 0 and N // config.block_N <= 12


def test_a_three_warpgroup_tile_of_the_probe_lowers_for_sm_90a():
    from sections.gemm_schedules import gemm_program

    probe = load_probe()
    config = next(c for c in probe.TILES if c.threads == 384)
    M, N = probe.shape_for(config, 33)
    report = tourkit.inspect_kernel("wave probe", gemm_program(M, N, 4096, config), "sm_90a", nvcc=False)
    tourkit.require_markers(report, ("wgmma",))
