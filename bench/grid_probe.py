"""Does a persistent GEMM need a block on every SM?

Hopper GEMMs run at the power cap, so an SM that sits out does not slow the others: the power it does not
draw goes to their clocks. A persistent grid that divides the tile count exactly gives every block the same
number of tiles, so no SM idles through a last partial wave while the rest finish. At 4096^3 (512 tiles of
128x256), 8192^3 (2048) and 8192x4096x14336 (1024) that grid is 128 blocks, not 132: both take the same
number of tile rounds, but with 132 blocks 4-64 SMs idle through the last one. This probe times the
appendix's persistent ws kernels (sections/hopper/gemm_ws.py) on each grid against cuBLAS, in turns
(tourkit.bench_interleaved), shape by shape; 16384^3 (8192 tiles: 62.06 rounds on 132 SMs, 64 on 128) is the
control where 128 blocks should lose.

    python bench/grid_probe.py [--rounds 6] [--shapes 4096x4096x4096,...] [--grids 132,128]
"""

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,8192x4096x14336,1024x8192x8192,16384x16384x16384"


def log(*args) -> None:
    print(*args, flush=True)


def kernels_to_time(grids: list[int]):
    """The appendix's two persistent ws kernels (4 stages and one store strip; 3 stages and the whole tile
    staged), once per grid size: each grid as given (even_rounds off)."""
    from sections.hopper.gemm_ws import WsConfig, appendix_schedule

    leaders = [WsConfig(128, 256, 64, 4, 256, True, persistent=132), appendix_schedule(8192, 8192, 8192, 132)]
    return [dataclasses.replace(c, persistent=g, even_rounds=False) for c in leaders for g in grids]


def time_shape(M: int, N: int, K: int, configs, rounds: int) -> None:
    import tourkit
    from sections.gemm_schedules import gemm_flops, time_against_cublas
    from sections.hopper.gemm_ws import compile_appendix

    kernels = {c.label(): compile_appendix(M, N, K, c) for c in configs}
    ms, cublas_ms, _ = time_against_cublas(M, N, K, kernels, rounds)
    flops = gemm_flops(M, N, K)
    log(f"\n{M}x{N}x{K}: cuBLAS {tourkit.tflops(flops, cublas_ms):.0f} TFLOP/s")
    for label, t in ms.items():
        log(f"  {label:100s} {tourkit.tflops(flops, t):5.0f} TFLOP/s  {tourkit.speedup(cublas_ms, t):.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--shapes", default=DEFAULT_SHAPES)
    parser.add_argument("--grids", default="132,128")
    args = parser.parse_args()

    import tourkit
    from sections.hopper.gemm_ws import appendix_program

    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    configs = kernels_to_time([int(g) for g in args.grids.split(",")])
    tourkit.compile_many([appendix_program(M, N, K, c) for M, N, K in shapes for c in configs], log=log)
    for M, N, K in shapes:
        time_shape(M, N, K, configs, args.rounds)


if __name__ == "__main__":
    main()
