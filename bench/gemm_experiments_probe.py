"""Probe: the GEMM experiments (bench/gemm_streamk.py, bench/gemm_multicast.py) beside the rule's pick and cuBLAS.

For each shape: compile the kernels named by --kernels and the rule's pick (gemm_plans.plan_problem), validate
each against a float32 reference after several calls (stream-K's arrival counters must reset themselves), then
time them in turns with cuBLAS (torch.matmul). Prints one table per shape.

    --kernels sk:128x256:3         stream-K, 128x256 tiles, 3 stages
              mc:128x192:4:A       2-block clusters sharing A (B: along M, sharing B) by TMA multicast
              ws:128x192:4         the appendix's hand-written kernel, one tile a block (the same ring, no cluster)
              appendix             the appendix's schedule for the shape (gemm_ws.appendix_schedule)
              appendix:pairs       that schedule in clusters of two blocks sharing B (persistent pairs of tiles)
              appendix:solo        that schedule without pairs
    python bench/gemm_experiments_probe.py [--shapes 2500x1000x3000] [--kernels mc:128x192:4:A,ws:128x192:4]
    (on the device: bash .device/run python bench/gemm_experiments_probe.py)
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

from sections import gemm_plans as P  # noqa: E402

SHAPES = ["2500x1000x3000", "1000x1000x1000", "1200x1200x1200", "640x5120x5120", "2304x4608x2304",
          "512x4096x8192", "1536x1536x1536", "2048x2048x2048", "3000x3000x3000", "2000x3000x4000",
          "128x4096x11008", "4096x4096x1024", "1920x1280x2560"]
KERNELS = "mc:128x192:4:A,ws:128x192:4,sk:128x128:5"


def parse_kernel(text: str, sms: int):
    """(label, kind, config or arguments) of one --kernels item; "appendix" items are resolved per shape."""
    if text.split(":")[0] == "appendix":
        return text, "appendix", text.split(":")[1:]
    kind, dims, stages, *rest = text.split(":")
    bm, bn = (int(v) for v in dims.split("x"))
    if kind == "sk":  # FullRow warps below 256 columns, as the rule's 128x128 tile
        config = P.GemmConfig(bm, bn, 64, int(stages), 256, True, policy="Square" if bn == 256 else "FullRow",
                              persistent=sms)
        return f"stream-K {bm}x{bn}, {stages} stages", kind, config
    if kind == "mc":
        share = rest[0] if rest else "A"
        return (f"multicast {bm}x{bn}, {stages} stages, sharing {share}", kind,
                dict(block_M=bm, block_N=bn, num_stages=int(stages), share=share))
    if kind == "ws":
        from sections.hopper.gemm_ws import WsConfig

        return (f"appendix ws {bm}x{bn}, {stages} stages, a tile a block", kind,
                WsConfig(bm, bn, 64, int(stages), 256, True, store_buffers=bn // 64))
    raise ValueError(f"unknown kernel kind {kind!r} in {text!r} (sk, mc, ws)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--kernels", default=KERNELS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--budget-s", type=float, default=400)
    parser.add_argument("--no-handoff", action="store_true",
                        help="also time each walk with no partials handed in (its sums are wrong: speed only)")
    args = parser.parse_args()

    import tilelang
    import torch

    import tourkit
    from sections import gemm_schedules as G
    import gemm_multicast as MC
    import gemm_streamk as S

    start = time.time()
    tourkit.quiet_tilelang()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    smem = 227 * 1024
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    kernels = [parse_kernel(t, sms) for t in args.kernels.split(",")]

    def build(M, N, K):
        plan = P.plan_problem(M, N, K, "hopper", sms, smem)
        jobs = {f"rule: {plan.config.label()}": ("plan", plan)}
        for label, kind, what in kernels:
            jobs[label] = (kind, what)
            if kind == "sk" and args.no_handoff:
                jobs[label + ", no hand-off (wrong sums)"] = ("skx", what)

        def one(item):
            label, (kind, what) = item
            if kind == "plan":
                return label, G.launcher({G.kernel_name(what, part): tilelang.compile(
                    prog, out_idx=None, target="cuda", pass_configs=what.pass_configs(part))
                    for part, prog in what.programs().items()}, what)
            if kind == "mc":
                try:
                    program = MC.multicast_program(M, N, K, **what)
                except ValueError as exc:  # no pairs of tiles along that axis: not a contender here
                    print(f"{M}x{N}x{K}: {label}: {exc}", flush=True)
                    return label, None
                return label, tilelang.compile(program, out_idx=None, target="cuda")
            if kind in ("ws", "appendix"):
                from sections.hopper.gemm_ws import appendix_schedule, compile_appendix

                if kind == "appendix":
                    config = appendix_schedule(M, N, K, sms)
                    if what == ["pairs"]:
                        config = replace(config, pairs=True, persistent=sms - sms % 2)
                    elif what == ["solo"]:
                        config = replace(config, pairs=False)
                    what = config
                return label, compile_appendix(M, N, K, what)
            kernel = tilelang.compile(S.streamk_program(M, N, K, what, handoff=kind == "sk"), out_idx=None,
                                      target="cuda")
            shapes_ = S.workspace_shapes(M, N, K, what)
            partials = torch.empty(shapes_["partials"], dtype=torch.float32, device="cuda")
            counters = torch.zeros(shapes_["counters"], dtype=torch.int32, device="cuda")
            return label, (lambda a, b, c: kernel(a, b, c, partials, counters))

        with ThreadPoolExecutor(8) as pool:
            return plan, {label: fn for label, fn in pool.map(one, jobs.items()) if fn is not None}

    with ThreadPoolExecutor(1) as ahead:
        futures = [ahead.submit(build, *s) for s in shapes]
        for (M, N, K), future in zip(shapes, futures):
            if time.time() - start > args.budget_s:
                print(f"budget spent: {M}x{N}x{K} and later not timed", flush=True)
                break
            try:
                plan, fns = future.result()
            except Exception as exc:  # one shape's failure is a line, not the end of the probe
                print(f"{M}x{N}x{K}: build failed: {tourkit.one_line(exc)}", flush=True)
                continue
            print(f"{M}x{N}x{K}: built ({time.time() - start:.0f} s)", flush=True)
            a, b, c = G.gemm_inputs(M, N, K, seed=int(time.time()) % 1000)
            ref = G.reference(a, b)
            checks = {}
            for label, fn in fns.items():
                print(f"  checking {label}", flush=True)
                for _ in range(3):  # repeated calls first: stream-K's counters must have reset themselves
                    fn(a, b, c)
                checks[label] = tourkit.validate(label, lambda f=fn: f(a, b, c), c, ref, G.TOLERANCE)
            out = torch.empty_like(c)
            timed = {"cuBLAS": lambda: torch.matmul(a, b, out=out)}
            timed.update({label: (lambda f: lambda: f(a, b, c))(f) for label, f in fns.items()})
            ms = tourkit.bench_interleaved(timed, rounds=args.rounds)
            flops = 2 * M * N * K
            print(f"\n{M}x{N}x{K}  (the rule: {plan.reason[:160]})")
            for label, t in ms.items():
                check = checks.get(label)
                err, passed = (check.rel_error, check.passed) if check else (0.0, True)
                flag = "" if passed else ("  (wrong by design)" if "no hand-off" in label else "  WRONG")
                print(f"  {label:<60} {t * 1e3:9.1f} us {flops / t / 1e9:7.0f} TFLOP/s  "
                      f"{ms['cuBLAS'] / t:5.3f}x cuBLAS  err {err:.1e}{flag}", flush=True)

if __name__ == "__main__":
    main()
