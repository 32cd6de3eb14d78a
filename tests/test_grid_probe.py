"""bench/grid_probe.py: it times each ws kernel on exactly the grids it is given (CPU only; the GPU run is the
probe itself)."""

import os
import sys

import tourkit
from sections.hopper.gemm_ws import appendix_program, persistent_grid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import grid_probe  # noqa: E402


def test_each_kernel_runs_on_each_grid_as_given():
    configs = grid_probe.kernels_to_time([132, 128])
    assert [(c.store_buffers, c.persistent) for c in configs] == [(1, 132), (1, 128), (4, 132), (4, 128)]
    # even rounds would shrink the 132-block grid to 128 at 4096^3 (512 tiles) and leave nothing to compare
    assert [persistent_grid(c, 512) for c in configs] == [132, 128, 132, 128]
    report = tourkit.inspect_kernel("ws", appendix_program(4096, 4096, 4096, configs[0]), "sm_90a", nvcc=False)
    assert report.grid[0] == 132
