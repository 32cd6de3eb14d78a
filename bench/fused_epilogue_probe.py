"""Probe for the fusion section: gelu(A @ B + bias) fused on each Hopper GEMM schedule, validated, then timed in
turns with eager PyTorch and torch.compile.

    python bench/fused_epilogue_probe.py [--size 8192] [--rounds 4] [--out DIR]
    (on the device: bash .device/run python bench/fused_epilogue_probe.py --out $OUT)

Which schedule should the fusion section fuse on? The hand-written warp-specialized kernels lead the GEMM
table; their epilogue gets the bias tile from the producer (TMA into shared memory) since reading it from global
memory per element cost 9% on the H200. Every kernel is validated on a square size and a ragged one before it is
timed; a hang (barrier phases) ends the probe after WATCHDOG_S with a message instead of holding the GPU.
"""

import argparse
import dataclasses
import json
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WATCHDOG_S = 90
CHECK_SIZES = [(1000, 1000, 1000), (1001, 1032, 1000)]


def log(*a):
    print(*a, flush=True)


def _deadlock(name):
    log(f"DEADLOCK? {name} did not finish within {WATCHDOG_S} s; exiting")
    os._exit(3)


def schedules(sm_count: int):
    """The Hopper table's hand-written kernels (persistent grids sized for this GPU), the ping-pong kernel
    (each consumer warpgroup on its own tile, so one's epilogue overlaps the other's K loop) and the schedule
    the fusion section uses, once each."""
    from sections.fusion import fused_config
    from sections.gemm_schedules import GemmConfig, default_schedules

    table = default_schedules("hopper", sm_count)
    pingpong = dict(panel=8, policy="FullRow", kernel="pingpong", persistent=sm_count)
    configs = [c for c in table if c.hand_ws]
    configs += [GemmConfig(128, 128, 64, 6, 256, True, **pingpong), GemmConfig(128, 192, 64, 4, 256, True, **pingpong),
                fused_config("hopper", 227 * 1024)]
    return list(dict.fromkeys(configs))


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--only", default="",
                    help="time only the schedules whose label contains this text (e.g. pingpong), with eager and "
                         "torch.compile: the fusion section's three contenders")
    ap.add_argument("--activations", default="gelu,gelu_tanh",
                    help="comma-separated: each is validated on every kernel, then timed (gelu: exact, gelu_tanh)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import tourkit
    from sections.fusion import COMPILE_MODE, compiled_eager, eager, fused_inputs, reference
    from sections.gemm_schedules import compile_gemm, epilogue_pass_configs, gemm_flops, gemm_program

    device = tourkit.detect_device()
    configs = [c for c in schedules(device.sm_count) if args.only in c.label()]
    activations = args.activations.split(",")
    size = args.size
    sizes = CHECK_SIZES + [(size, size, size)]
    tourkit.compile_many([(gemm_program(M, N, K, c, bias=True, activation=act), epilogue_pass_configs(act))
                          for act in activations for c in configs for (M, N, K) in sizes], log=log)
    results = {"device": device.name, "size": size, "checks": {}, "ms": {}}
    a, b, bias, c = fused_inputs(size, size, size)
    flops = gemm_flops(size, size, size)
    for act in activations:
        contenders = {}
        for config in configs:
            name = config.label()
            watchdog = threading.Timer(WATCHDOG_S, _deadlock, args=(f"{name} {act}",))
            watchdog.start()
            try:
                ok = True
                for (M, N, K) in sizes:
                    kernel = compile_gemm(M, N, K, config, bias=True, activation=act)
                    xa, xb, xbias, xc = fused_inputs(M, N, K, seed=5)
                    check = tourkit.validate(f"fused {act} {M}x{N}x{K} {name}", lambda: kernel(xa, xb, xbias, xc), xc,
                                             reference(xa, xb, xbias, act), 5e-3)
                    log(check.line())
                    results["checks"][f"{act} {name} {M}x{N}x{K}"] = check.rel_error
                    ok = ok and check.passed
                if ok:
                    contenders[f"fused {name}"] = (lambda k: lambda: k(a, b, bias, c))(kernel)
            finally:
                watchdog.cancel()
        contenders["eager PyTorch (3 kernels)"] = lambda: eager(a, b, bias, act)
        compiled, reason = compiled_eager(COMPILE_MODE, act)
        if compiled is not None:
            with tourkit.capture_fd_output(2), tourkit.capture_fd_output(1):
                compiled(a, b, bias)
            contenders[f"torch.compile ({COMPILE_MODE})"] = lambda: compiled(a, b, bias)
        else:
            log(f"torch.compile skipped: {reason}")
        ms = tourkit.bench_interleaved(contenders, rounds=args.rounds)
        eager_ms = ms["eager PyTorch (3 kernels)"]
        compile_ms = ms.get(f"torch.compile ({COMPILE_MODE})")
        rows = [[name, f"{t:.3f}", f"{tourkit.tflops(flops, t):.0f}", f"{eager_ms / t:.3f}x",
                 f"{compile_ms / t:.3f}x" if compile_ms else "-"] for name, t in sorted(ms.items(), key=lambda kv: kv[1])]
        log(f"\n{act}(A @ B + bias) {size}^3 fp16, timed in turns ({args.rounds} rounds, forward and backward)")
        log(tourkit.format_table(["implementation", "ms", "TFLOP/s", "vs eager", "vs torch.compile"], rows))
        results["ms"][act] = ms
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "fused_epilogue_probe.json"), "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
