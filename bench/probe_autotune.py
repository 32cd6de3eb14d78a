"""Probe for the autotune section: is tilelang.autotune's pick the best of its space?

Times EVERY configuration of the section's space (after the shared-memory filter; --full: the full space),
plus a few schedules outside it, with the kit's timer (median, L2 flushed), in turns with cuBLAS. Then runs
tilelang.autotune on the same space in a private cache directory (a real search) and reports how far its
pick is from the best timed configuration; also for the pick a tour run wrote to its --json file.

    python bench/probe_autotune.py [--size 8192] [--full] [--rounds 4] [--run-json run.json] [--no-tune]
    python bench/probe_autotune.py --compile-only sm_90a     # no GPU: build a few of the schedules
"""

import argparse
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tourkit  # noqa: E402
from sections import autotune  # noqa: E402
from sections.gemm_schedules import GemmConfig, fits, gemm_flops, gemm_program  # noqa: E402

# Outside the space: three consumer warpgroups on a 256x192 tile (threads=384 splits only tiles whose sides
# divide by three warps' shares), deeper or shallower K steps, more stages, a narrower swizzle panel, another
# warp policy.
OUTSIDE_HOPPER = [
    GemmConfig(256, 192, 64, 3, 384, True, panel=8, policy="FullCol"), GemmConfig(256, 192, 64, 3, 384, True),
    GemmConfig(128, 256, 32, 6, 256, True), GemmConfig(128, 256, 128, 2, 256, True),
    GemmConfig(256, 128, 128, 2, 256, True), GemmConfig(128, 128, 128, 3, 256, True),
    GemmConfig(256, 128, 64, 4, 256, True, panel=4), GemmConfig(128, 256, 64, 4, 256, True, policy="FullRow"),
]


def log(text=""):
    print(text, flush=True)


def compile_all(size: int, configs: list[GemmConfig], target="cuda") -> list:
    programs = [gemm_program(size, size, size, c) for c in configs]
    return tourkit.compile_many(programs, out_idx=[-1], target=target, log=log)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=autotune.TUNE_SIZE)
    parser.add_argument("--full", action="store_true", help="the section's full space")
    parser.add_argument("--rounds", type=int, default=4, help="bench_interleaved rounds over everything")
    parser.add_argument("--run-json", help="a tour --json file whose autotune pick to judge too")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--compile-only", metavar="ARCH", help="no GPU: compile a few of the schedules for ARCH")
    args = parser.parse_args()
    if args.compile_only:
        spec = tourkit.ARCH_SPECS[args.compile_only]
        kept, _ = autotune.filter_space(autotune.search_space(spec.family), spec.smem_per_block_optin)
        sample = [autotune.to_gemm_config(c) for c in kept[:2]]
        sample += OUTSIDE_HOPPER[:2] if spec.family == "hopper" else []
        for config, kernel in zip(sample, compile_all(args.size, sample, tourkit.cuda_target(args.compile_only))):
            log(f"  {config.label():<28} {'compiled' if kernel is not None else 'FAILED'}")
        return

    import torch

    device = tourkit.detect_device()
    family = tourkit.ARCH_SPECS[device.arch].family
    budget = device.smem_per_block_optin
    M = N = K = args.size
    flops = gemm_flops(M, N, K)
    kept, dropped = autotune.filter_space(autotune.search_space(family, args.full), budget)
    space = [autotune.to_gemm_config(c) for c in kept]
    outside = [c for c in (OUTSIDE_HOPPER if family == "hopper" else []) if fits(c, budget)]
    log(f"{device.name} ({device.arch}); GEMM {M}^3 fp16; space: {len(space)} kept, {len(dropped)} filtered; "
        f"{len(outside)} schedules outside it")

    kernels = compile_all(M, space + outside)
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    ref = a.double() @ b.double()
    built = [(config, kernel) for config, kernel in zip(space + outside, kernels) if kernel is not None]
    errors = {config: tourkit.relative_error(kernel(a, b), ref) for config, kernel in built}
    medians = tourkit.bench_interleaved({**{config.label(): (lambda k=kernel: k(a, b)) for config, kernel in built},
                                         "cuBLAS": lambda: torch.matmul(a, b)}, rounds=args.rounds)
    cublas = medians["cuBLAS"]
    timed = {config: medians[config.label()] for config, _ in built}
    for config in sorted(timed, key=timed.get):
        ms = timed[config]
        log(f"  {config.label():<28} {'space' if config in space else 'outside':<7} {ms:8.3f} ms "
            f"{tourkit.tflops(flops, ms):6.1f} TFLOP/s  {cublas / ms:5.3f}x cuBLAS  rel.err {errors[config]:.1e}")
    log(f"  {'cuBLAS (torch.matmul)':<36} {cublas:8.3f} ms {tourkit.tflops(flops, cublas):6.1f} TFLOP/s")
    in_space = {c: ms for c, ms in timed.items() if c in space}
    best_space = min(in_space, key=in_space.get)
    best_all = min(timed, key=timed.get)
    log(f"best in the space: {best_space.label()} {in_space[best_space]:.3f} ms "
        f"({cublas / in_space[best_space]:.3f}x cuBLAS)")
    log(f"best overall:      {best_all.label()} {timed[best_all]:.3f} ms ({cublas / timed[best_all]:.3f}x cuBLAS)")

    def judge(name, config_dict):
        config = autotune.to_gemm_config(config_dict)
        if config not in in_space:
            log(f"{name}: {config.label()} was not timed here")
            return
        gap = in_space[config] / in_space[best_space] - 1
        log(f"{name}: {autotune.describe(config_dict)}: {in_space[config]:.3f} ms, {100 * gap:.2f}% slower than the "
            f"best of the space")

    if args.run_json and os.path.exists(args.run_json):
        with open(args.run_json) as fh:
            sections = {s["name"]: s for s in json.load(fh)["sections"]}
        pick = sections.get("autotune", {}).get("metrics", {}).get("winner_config")
        if pick:
            judge("the tour run's autotuner pick", pick)
    if not args.no_tune:
        cache_dir = tempfile.mkdtemp(prefix="probe_autotune_")
        os.environ["TILELANG_CACHE_DIR"] = cache_dir  # a real search, not the tour's cached pick
        try:
            tuned = autotune.tune(M, N, K, kept)
            log(f"the probe's own tilelang.autotune search: {tuned.seconds:.1f} s, {len(tuned.readings)} of "
                f"{len(kept)} configurations timed")
            judge("the probe's autotuner pick", tuned.config)
            for i in autotune.leaders(tuned.readings, kept.index(tuned.config))[1:]:
                judge(f"  its runner-up ({tuned.readings[i]:.3f} ms to the autotuner)", kept[i])
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
