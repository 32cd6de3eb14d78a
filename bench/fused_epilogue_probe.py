"""Probe for the fusion lesson: gelu(A @ B + bias) fused on each Hopper GEMM schedule (the lesson's pipelined
ones and the appendix's hand-written ones), validated, then timed in turns with eager PyTorch and torch.compile.

    python bench/fused_epilogue_probe.py [--size 8192] [--rounds 4] [--mode max-autotune-no-cudagraphs] [--out DIR]

Which schedule should the fusion lesson's appendix fuse on? Every kernel is validated on a square size and two
ragged ones before it is timed; a hang (barrier phases) ends the probe after WATCHDOG_S with a message instead
of holding the GPU.
"""

import argparse
import json
import os
import sys
import threading

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

WATCHDOG_S = 90
CHECK_SIZES = [(1000, 1000, 1000), (1001, 1032, 1000)]


def log(*a):
    print(*a, flush=True)


def _deadlock(name):
    log(f"DEADLOCK? {name} did not finish within {WATCHDOG_S} s; exiting")
    os._exit(3)


def schedules(sm_count: int):
    """The lesson's two leading Hopper schedules, the appendix's ws kernel and its ping-pong kernels (persistent
    grids sized for this GPU), once each."""
    from sections.gemm_schedules import lesson_schedules
    from sections.hopper import gemm_pingpong, gemm_ws

    return [*lesson_schedules("hopper")[:2], gemm_ws.appendix_schedule(8192, 8192, 8192, sm_count),
            gemm_pingpong.PingPongConfig(128, 128, 64, 6, persistent=sm_count),
            gemm_pingpong.appendix_schedule(8192, 8192, 8192, sm_count)]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--mode", default="default", help="torch.compile mode")
    ap.add_argument("--only", default="", help="time only the schedules whose label contains this text")
    ap.add_argument("--activations", default="gelu,gelu_tanh",
                    help="comma-separated: each is validated on every kernel, then timed (gelu: exact, gelu_tanh)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args(argv)

    import tilelang

    import tourkit
    from gemm_ws_probe import program_of
    from sections.fusion import compiled_eager, eager, fused_inputs, reference
    from sections.gemm_epilogue import epilogue_pass_configs
    from sections.gemm_schedules import gemm_flops

    device = tourkit.detect_device()
    configs = [c for c in schedules(device.sm_count) if args.only in c.label()]
    activations = args.activations.split(",")
    size = args.size
    sizes = CHECK_SIZES + [(size, size, size)]

    def program(config, M, N, K, act):
        return program_of(config, M, N, K, bias=True, activation=act)

    tourkit.compile_many([(program(c, M, N, K, act), epilogue_pass_configs(act))
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
                    kernel = tilelang.compile(program(config, M, N, K, act), out_idx=None, target="cuda",
                                              pass_configs=epilogue_pass_configs(act))
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
        compiled, reason = compiled_eager(args.mode, act)
        if compiled is not None:
            with tourkit.capture_fd_output(2), tourkit.capture_fd_output(1):
                compiled(a, b, bias)
            contenders[f"torch.compile ({args.mode})"] = lambda: compiled(a, b, bias)
        else:
            log(f"torch.compile skipped: {reason}")
        ms = tourkit.bench_interleaved(contenders, rounds=args.rounds)
        eager_ms = ms["eager PyTorch (3 kernels)"]
        compile_ms = ms.get(f"torch.compile ({args.mode})")
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
