"""Does the GPU's state when timing starts change the verdict?

A section that times its contenders right after seconds of CPU work (torch.compile's autotuning, say) finds
the GPU idle, at its boost clock; under load its power controller pulls the clock down over the next second
or so, a drift the forward and backward rounds of tourkit.bench_interleaved do not cancel. This probe times
the same contenders several times, each after `--idle` seconds of an idle GPU, alternately without and with
`settle_ms` (bench_interleaved runs them untimed first until the clock has settled; tourkit.SETTLE_MS is the
default), so the two methods meet on one machine: the fused GEMM of the fusion section against eager and
torch.compile, and a GEMM shape against cuBLAS (8192x4096x14336).

    python bench/settle_probe.py [--trials 3] [--idle 4] [--settle 1500] [--only fusion|gemm]

Run it with an nvidia-smi clock/power log beside it to see the clock when each timing starts.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def log(*a):
    print(*a, flush=True)


def fusion_contenders():
    import torch

    import tourkit
    from sections.fusion import COMPILE_MODE, compiled_eager, eager, fused_inputs
    from sections.hopper import gemm_pingpong

    device = tourkit.detect_device()
    size = 8192
    config = gemm_pingpong.appendix_schedule(size, size, size, device.sm_count)
    kernel = gemm_pingpong.compile_appendix(size, size, size, config, bias=True, activation="gelu")
    a, b, bias, c = fused_inputs(size, size, size)
    contenders = {"fused " + config.label(): lambda: kernel(a, b, bias, c), "eager": lambda: eager(a, b, bias)}
    compiled, reason = compiled_eager(COMPILE_MODE)
    if compiled is not None:
        with tourkit.capture_fd_output(2), tourkit.capture_fd_output(1):
            compiled(a, b, bias)
        contenders["torch.compile"] = lambda: compiled(a, b, bias)
    else:
        log(f"torch.compile skipped: {reason}")
    torch.cuda.synchronize()
    return contenders, "eager"


def gemm_contenders():
    import torch

    import tourkit
    from sections.gemm_schedules import compile_gemm, gemm_inputs, lesson_schedules
    from sections.hopper import gemm_ws

    device = tourkit.detect_device()
    M, N, K = 8192, 4096, 14336
    a, b, c = gemm_inputs(M, N, K)
    c_cublas = torch.empty_like(c)
    contenders = {"cuBLAS": lambda: torch.matmul(a, b, out=c_cublas)}
    ws = gemm_ws.appendix_schedule(M, N, K, device.sm_count)
    kernels = {c.label(): compile_gemm(M, N, K, c) for c in lesson_schedules("hopper")[:2]}
    kernels[ws.label()] = gemm_ws.compile_appendix(M, N, K, ws)
    for label, kernel in kernels.items():
        contenders[label] = (lambda k: lambda: k(a, b, c))(kernel)
    torch.cuda.synchronize()
    return contenders, "cuBLAS"


def trial(name, contenders, base, settle_ms, idle_s):
    import tourkit

    time.sleep(idle_s)
    started = time.strftime("%H:%M:%S")
    ms = tourkit.bench_interleaved(contenders, settle_ms=settle_ms)
    ratios = "  ".join(f"{k}: {ms[base] / v:.3f}x ({v:.3f} ms)" for k, v in ms.items() if k != base)
    log(f"{name} started {started} settle {settle_ms:.0f} ms: {base} {ms[base]:.3f} ms  {ratios}")
    return ms


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--idle", type=float, default=4.0)
    ap.add_argument("--settle", type=float, default=1500.0)
    ap.add_argument("--only", choices=["fusion", "gemm"], default=None)
    args = ap.parse_args(argv)
    for name, build in (("fusion", fusion_contenders), ("gemm 8192x4096x14336", gemm_contenders)):
        if args.only and not name.startswith(args.only):
            continue
        contenders, base = build()
        for _ in range(args.trials):
            for settle_ms in (0.0, args.settle):
                trial(name, contenders, base, settle_ms, args.idle)


if __name__ == "__main__":
    main()
