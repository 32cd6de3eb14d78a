"""Probe for the GEMM rule's wave model: how fast does one block of a tile run when only some SMs are busy?

The rule (sections/gemm_plans.estimate_seconds) prices a wave of blocks at the same per-block time however many
SMs it fills, and a tile by one rate (TILE_EFFICIENCY). At the power cap an idle SM's power goes to the others'
clocks, so a part-filled wave may run each block faster; and 128x192's measured rate moved from 0.68 to 0.88 of
128x256's between problems. This probe times, for each Hopper candidate tile, problems of exactly `blocks` tiles
(rows of up to 12 tiles, K fixed) for several block counts, interleaved with cuBLAS on the same shape,
and prints per block count: microseconds, TFLOP/s of the whole GPU, and TFLOP/s per busy SM.

    python bench/gemm_wave_probe.py [--k 4096] [--blocks 33,66,99,132,198,264] [--list]
    (on the device: bash .device/run python bench/gemm_wave_probe.py)
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sections import gemm_plans as P  # noqa: E402

TILES = [c for c in P.CANDIDATES["hopper"] if c.block_M >= 128]  # the tiles mid-size problems choose between


def shape_for(config, blocks: int) -> tuple[int, int]:
    """(M, N) of exactly `blocks` tiles: rows of as many tiles as the largest divisor of `blocks` up to 12."""
    cols = max(d for d in range(1, 13) if blocks % d == 0)
    return blocks // cols * config.block_M, cols * config.block_N


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--blocks", default="33,66,99,132,198,264")
    ap.add_argument("--list", action="store_true", help="the problems, no GPU")
    args = ap.parse_args()
    counts = [int(b) for b in args.blocks.split(",")]
    jobs = [(config, b, *shape_for(config, b)) for config in TILES for b in counts]
    if args.list:
        for config, b, M, N in jobs:
            print(f"{config.block_M}x{config.block_N} {b:4d} blocks: {M}x{N}x{args.k}")
        return

    import tilelang
    import torch

    import tourkit
    from sections.gemm_schedules import TOLERANCE, gemm_program, reference

    tourkit.quiet_tilelang()
    started = time.perf_counter()
    device = tourkit.detect_device()
    with ThreadPoolExecutor(max_workers=16) as pool:
        built = {(c, b): pool.submit(tilelang.compile, gemm_program(M, N, args.k, c), out_idx=None, target="cuda")
                 for c, b, M, N in jobs}
        built = {key: fut.result() for key, fut in built.items()}
    took = time.perf_counter() - started
    print(f"{device.name}: {device.sm_count} SMs; compiled {len(built)} kernels in {took:.0f} s")
    for config, b, M, N in jobs:
        a = tourkit.random_tensor((M, args.k), torch.float16, seed=1)
        w = tourkit.random_tensor((args.k, N), torch.float16, seed=2)
        c, c_ref = (torch.empty((M, N), dtype=torch.float16, device="cuda") for _ in range(2))
        kernel = built[(config, b)]
        check = tourkit.validate(f"{M}x{N}", lambda: kernel(a, w, c), c, reference(a, w), TOLERANCE)
        contenders = {"tile": lambda: kernel(a, w, c), "cuBLAS": lambda: torch.matmul(a, w, out=c_ref)}
        ms = tourkit.bench_interleaved(contenders, rounds=2, settle_ms=300)
        flops = 2 * M * N * args.k
        rate = tourkit.tflops(flops, ms["tile"])
        verdict = "ok" if check.passed else "WRONG " + check.line()
        print(f"{config.block_M}x{config.block_N} {b:4d} blocks {M:5d}x{N:5d}: {ms['tile'] * 1e3:7.1f} us {rate:5.0f} "
              f"TFLOP/s, {rate / min(b, device.sm_count):5.2f} a busy SM; cuBLAS {ms['cuBLAS'] / ms['tile']:.3f}x  "
              f"{verdict}", flush=True)


if __name__ == "__main__":
    main()
