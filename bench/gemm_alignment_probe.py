"""Probe: what rows of B that straddle 128-byte lines cost the GEMM, and what copying B into whole lines first
(`GemmPlan.pad_b`) wins back.

For each shape, each schedule (the rule's pick, the neighbours it is timed beside with --shape, --tiles, and
with --appendix the appendix's kernels) is built three ways: as the problem is ("own"); reading a B already padded to whole 128-byte lines, C as it
is ("lines": the kernel alone, what the copy could at best win); and as the launcher runs pad_b, the copy
included ("pad_b"). Each is checked against a float32 reference, then all are timed in turns with cuBLAS.
With --sizes, also the same schedules at N and K rounded up to multiples of 64 (cuBLAS there too).

    python bench/gemm_alignment_probe.py [--shapes 2500x1000x3000,3000x3000x3000] [--tiles 256x192x384:FullCol]
    (on the device: bash .device/run python bench/gemm_alignment_probe.py)
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

SHAPES = "2500x1000x3000,3000x3000x3000,2800x1400x4000,2000x3000x4000,1000x1000x1000"


def up64(n: int) -> int:
    return -(-n // P.LINE) * P.LINE


def plans_for(M: int, N: int, K: int, sms: int, smem: int, tiles: str, appendix: bool = False) -> list:
    """The rule's pick (pad_b off), its neighbours and the --tiles schedules, as GemmPlans of the problem; with
    appendix, the appendix's two kernels (warp-specialized, ping-pong) as their rules schedule them."""
    from gemm_shapes_probe import extra_tiles

    from sections.hopper import gemm_pingpong, gemm_ws

    pick = replace(P.plan_problem(M, N, K, "hopper", sms, smem), pad_b=False)
    configs = [pick.config] + P.neighbours(pick, "hopper", sms, smem) + extra_tiles(tiles, K, smem, sms)
    if appendix:
        configs += [module.appendix_schedule(M, N, K, sms) for module in (gemm_ws, gemm_pingpong)]
    return [replace(pick, config=c) for c in dict.fromkeys(configs)]


def plain_b_program(plan):
    """The lesson's GEMM with B loaded by plain 16-byte loads of the producer threads instead of TMA
    (T.copy(..., disable_tma=True) for B only): built with T.copy wrapped for the one call."""
    import types

    import tilelang.language as T

    from sections import gemm_schedules as G

    def copy(src, dst, **kw):
        if "B_shared" in str(getattr(getattr(dst, "buffer", dst), "name", "")):
            kw["disable_tma"] = True
        return T.copy(src, dst, **kw)

    wrapped = types.SimpleNamespace(**{k: getattr(T, k) for k in dir(T) if not k.startswith("__")})
    wrapped.copy = copy
    M, N, K = plan.kernel_shape
    G.T = wrapped
    try:
        return G.gemm_program(M, N, K, plan.config)
    finally:
        G.T = T


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--tiles", default="", help="more schedules (bench/gemm_shapes_probe.py's --tiles)")
    parser.add_argument("--sizes", action="store_true", help="also at N and K rounded up to multiples of 64")
    parser.add_argument("--appendix", action="store_true", help="also the appendix's kernels, own and pad_b")
    parser.add_argument("--plain-b", action="store_true", help="also the lesson's schedules loading B without TMA")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--copy", action="store_true", help="also the pad_b copy alone, and torch's copy_ of B")
    parser.add_argument("--flush", default="write", choices=("write", "read"), help="tourkit.bench_ms flush_mode")
    args = parser.parse_args()

    import tilelang
    import torch

    import tourkit
    from sections import gemm_schedules as G

    tourkit.quiet_tilelang()
    sms, smem = torch.cuda.get_device_properties(0).multi_processor_count, 227 * 1024
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]

    def compiled(plan):
        built = {G.kernel_name(plan, part): tilelang.compile(prog, out_idx=None, target="cuda",
                                                            pass_configs=plan.pass_configs(part))
                 for part, prog in plan.programs().items()}
        return G.launcher(built, plan)

    def lines_only(plan):
        """The padded plan's GEMM alone, reading a B already in whole lines: kernel(a, b_padded, c)."""
        program = replace(plan, pad_b=True).programs()["gemm"]
        return tilelang.compile(program, out_idx=None, target="cuda", pass_configs=plan.pass_configs("gemm"))

    def build(M, N, K):
        jobs = {}
        for plan in plans_for(M, N, K, sms, smem, args.tiles, args.appendix):
            label = plan.config.label()[:60]
            jobs[("own", label)] = (compiled, plan)
            if N % P.LINE and plan.pad:  # a plan loading its rows masked has no padded B
                if isinstance(plan.config, P.GemmConfig):
                    jobs[("lines", label)] = (lines_only, plan)
                jobs[("pad_b", label)] = (compiled, replace(plan, pad_b=True))
            if args.sizes and (up64(N), up64(K)) != (N, K):
                jobs[("sizes 64", label)] = (compiled, replace(plan, N=up64(N), K=up64(K)))
            if args.plain_b and isinstance(plan.config, P.GemmConfig) and plan.config.warp_specialized:
                program = plain_b_program(plan)  # built here, in one thread: it swaps the module's T
                jobs[("plain B", label)] = (lambda prog, plan=plan: tilelang.compile(
                    prog, out_idx=None, target="cuda", pass_configs=plan.pass_configs("gemm")), program)
        with ThreadPoolExecutor(8) as pool:
            futures = {key: pool.submit(fn, plan) for key, (fn, plan) in jobs.items()}
            return {key: f.result() for key, f in futures.items()}

    with ThreadPoolExecutor(1) as ahead:
        futures = [ahead.submit(build, *s) for s in shapes]
        for (M, N, K), future in zip(shapes, futures):
            try:
                fns = future.result()
            except Exception as exc:
                print(f"{M}x{N}x{K}: build failed: {tourkit.one_line(exc)}", flush=True)
                continue
            seed = int(time.time()) % 1000
            a, b, c = G.gemm_inputs(M, N, K, seed=seed)
            b_lines = torch.zeros((K, up64(N)), dtype=b.dtype, device="cuda")
            b_lines[:, :N] = b
            ref, out = G.reference(a, b), torch.empty_like(c)
            timed = {"own|cuBLAS": lambda: torch.matmul(a, b, out=out)}
            big = None
            if args.sizes and (up64(N), up64(K)) != (N, K):
                big = G.gemm_inputs(M, up64(N), up64(K), seed=seed)
                big_out = torch.empty_like(big[2])
                timed["sizes 64|cuBLAS"] = lambda: torch.matmul(big[0], big[1], out=big_out)
            for (way, label), fn in fns.items():
                if way == "sizes 64":
                    call = (lambda f=fn: f(*big))
                    check = tourkit.validate(label, call, big[2], G.reference(big[0], big[1]), G.TOLERANCE)
                else:
                    call = (lambda f=fn: f(a, b_lines, c)) if way == "lines" else (lambda f=fn: f(a, b, c))
                    check = tourkit.validate(label, call, c, ref, G.TOLERANCE)
                if check.passed:
                    timed[f"{way}|{label}"] = call
                    if way == "pad_b" and args.copy and "copy|B" not in timed:  # the copy alone, two ways
                        padded = fn.buffers["padded"]["b"]
                        timed["copy|B"] = (lambda f=fn, p=padded: f.kernels["pad_b"](b, p))
                        timed["copy_|B"] = (lambda p=padded: p[:, :N].copy_(b))
                else:
                    print(f"  {way} {label}: WRONG {check.line()}", flush=True)
            ms = tourkit.bench_interleaved(timed, rounds=args.rounds, flush_mode=args.flush)
            base = ms["own|cuBLAS"]
            print(f"\n{M}x{N}x{K}: cuBLAS {base * 1e3:.1f} us", flush=True)
            for key, t in sorted(ms.items(), key=lambda kv: (kv[0].split("|")[1], kv[0])):
                way, label = key.split("|")
                ref_ms = ms["sizes 64|cuBLAS"] if way == "sizes 64" else base
                print(f"  {way:<9} {label:<62} {t * 1e3:8.1f} us  {ref_ms / t:5.3f}x cuBLAS", flush=True)


if __name__ == "__main__":
    main()
