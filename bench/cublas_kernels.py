"""Which kernel does cuBLAS launch for each GEMM shape? (what the tour's GEMMs race against)

torch.matmul hands fp16 GEMMs to cuBLAS, which picks a kernel per shape. Its name says the schedule: on an
H200 `nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT` is a 256x128 tile, K steps of 64, a
4-stage ring, clusters of 1x2 blocks, cooperative warpgroups. This probe runs each shape a few times under
torch.profiler and prints the kernels' names with their median time on the device (no L2 flush: back to back).

    python bench/cublas_kernels.py [--shapes 8192x8192x8192,4096x4096x4096] [--calls 5]
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The tour's 8192^3 and the five LLM-like shapes the GEMM probes time (bench/gemm_probe.py --shapes).
DEFAULT_SHAPES = "8192x8192x8192,4096x4096x4096,16384x16384x16384,8192x28672x4096,8192x4096x14336,1024x8192x8192"


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"{item!r} is not MxNxK with positive integers")
        shapes.append(tuple(int(p) for p in parts))
    return shapes


def kernels_launched(M: int, N: int, K: int, calls: int) -> dict[str, list[float]]:
    """Device time in microseconds of every kernel torch.matmul launched for C = A @ B, by kernel name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(M, K, device="cuda", dtype=torch.float16)  # the tour's layout: A MxK, B KxN, row-major
    b = torch.randn(K, N, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    for _ in range(3):  # cuBLAS's heuristics and workspace: outside the profile
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.matmul(a, b, out=c)
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            times.setdefault(event.name, []).append(event.device_time)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=parse_shapes, default=parse_shapes(DEFAULT_SHAPES), help="comma-separated MxNxK")
    ap.add_argument("--calls", type=int, default=5, help="profiled calls per shape")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("cublas_kernels: torch is not installed (pip install -r requirements.txt)")
        return 1
    if not torch.cuda.is_available():
        print("cublas_kernels: needs a CUDA GPU (cuBLAS picks its kernel on the device); none is visible")
        return 1
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for M, N, K in args.shapes:
        for name, times in kernels_launched(M, N, K, args.calls).items():
            median = statistics.median(times)
            tflops = f", {2 * M * N * K / median / 1e6:.0f} TFLOP/s" if median > 50 else ""
            print(f"{M}x{N}x{K}: {name}  median {median:.1f} us{tflops} (x{len(times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
