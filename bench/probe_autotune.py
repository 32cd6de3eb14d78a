"""Probe for the autotune section: is tilelang.autotune's winner the best of its space?

Times EVERY configuration of the autotune section's default space (after the shared-memory filter, extras
included), plus a few schedules outside it, with the kit's timer (median, L2 flushed), against cuBLAS in the
same run. Then runs tilelang.autotune on the same space and reports how far its winner is from the best timed
config (target: within 2%), also for the winner and the autotuner's pick a tour run wrote to its --json file.

    python bench/probe_autotune.py [--size 8192] [--run-json run.json] [--no-tune]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tourkit  # noqa: E402
from sections import autotune  # noqa: E402
from sections.gemm_schedules import GemmConfig, fits, gemm_flops  # noqa: E402

# Outside the default space (whose extras hold the 256x192 FullCol tiles on three consumer warpgroups): the same
# tile with the Square policy, deeper or shallower K steps, more stages. (threads=384 splits only tiles whose
# sides divide by 3 warps' shares, e.g. 256x192.)
EXTRA_HOPPER = [
    GemmConfig(256, 192, 64, 3, 384, True), GemmConfig(128, 256, 32, 6, 256, True),
    GemmConfig(128, 256, 128, 2, 256, True), GemmConfig(256, 128, 128, 2, 256, True),
    GemmConfig(128, 128, 128, 3, 256, True), GemmConfig(256, 128, 64, 4, 256, True, panel=4),
    GemmConfig(128, 256, 64, 4, 256, True, policy="FullRow"),
]


def log(text=""):
    print(text, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=autotune.TUNE_SIZE)
    parser.add_argument("--run-json", help="a tour --json file whose autotune winner to check too")
    parser.add_argument("--no-tune", action="store_true")
    parser.add_argument("--compile-only", metavar="ARCH", help="no GPU: compile a few of the schedules for ARCH")
    args = parser.parse_args()
    if args.compile_only:
        spec = tourkit.ARCH_SPECS[args.compile_only]
        kept, _ = autotune.filter_space(autotune.search_space(spec.family), spec.smem_per_block_optin)
        sample = [autotune.to_gemm_config(c) for c in kept[:2]] + EXTRA_HOPPER[:3]
        kernels = autotune.compile_many(args.size, args.size, args.size, sample, tourkit.cuda_target(args.compile_only))
        for config, kernel in zip(sample, kernels):
            log(f"  {config.label():<26} {'compiled' if kernel is not None else 'FAILED'}")
        return

    import torch

    device = tourkit.detect_device()
    family = tourkit.ARCH_SPECS[device.arch].family
    M = N = K = args.size
    flops = gemm_flops(M, N, K)
    kept, dropped = autotune.filter_space(autotune.search_space(family), device.smem_per_block_optin)
    space = [autotune.to_gemm_config(c) for c in kept]
    extras = [c for c in (EXTRA_HOPPER if family == "hopper" else []) if fits(c, device.smem_per_block_optin)]
    log(f"{device.name} ({device.arch}); gemm {M}^3 fp16; space {len(space)} kept, {len(dropped)} filtered; "
        f"{len(extras)} extra schedules outside the space")

    started = time.perf_counter()
    kernels = autotune.compile_many(M, N, K, space + extras)
    log(f"compiled {sum(k is not None for k in kernels)}/{len(kernels)} in {time.perf_counter() - started:.1f} s")

    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    ref = (a.float() @ b.float())
    built = [(config, kernel) for config, kernel in zip(space + extras, kernels) if kernel is not None]
    errors = {config: tourkit.relative_error(kernel(a, b), ref) for config, kernel in built}
    # Every configuration and cuBLAS timed in turns (3 rounds): the GPU clock's drift favours none of them.
    medians = tourkit.bench_interleaved({**{config.label(): (lambda k=kernel: k(a, b)) for config, kernel in built},
                                         "cuBLAS": lambda: torch.matmul(a, b)})
    cublas = medians["cuBLAS"]
    timed = {}
    for config, _ in built:
        err = errors[config]
        ms = timed[config] = medians[config.label()]
        log(f"  {config.label():<26} {'space' if config in space else 'extra':<5} {ms:8.3f} ms "
            f"{tourkit.tflops(flops, ms):6.1f} TFLOP/s  {cublas / ms:5.3f}x cuBLAS  rel.err {err:.1e}")
    log(f"  {'cuBLAS (torch.matmul)':<32} {cublas:8.3f} ms {tourkit.tflops(flops, cublas):6.1f} TFLOP/s")
    in_space = {c: ms for c, ms in timed.items() if c in space}
    best_space = min(in_space, key=in_space.get)
    best_all = min(timed, key=timed.get)
    log(f"best in space: {best_space.label()} {in_space[best_space]:.3f} ms ({cublas / in_space[best_space]:.3f}x cuBLAS)")
    log(f"best overall:  {best_all.label()} {timed[best_all]:.3f} ms ({cublas / timed[best_all]:.3f}x cuBLAS)")

    def judge(name, config_dict):
        config = autotune.to_gemm_config(config_dict)
        if config not in in_space:
            log(f"{name}: {config.label()} was not timed here")
            return
        gap = in_space[config] / in_space[best_space] - 1
        log(f"{name}: {config.label()} {in_space[config]:.3f} ms, {100 * gap:.2f}% slower than the best of the "
            f"space -> {'OK (within 2%)' if gap <= 0.02 else 'MISSED the 2% target'}")

    if args.run_json and os.path.exists(args.run_json):
        with open(args.run_json) as fh:
            sections = {s["name"]: s for s in json.load(fh)["sections"]}
        metrics = sections.get("autotune", {}).get("metrics", {})
        if metrics.get("winner_config"):
            judge("tour run's winner (after the refinement)", metrics["winner_config"])
        if metrics.get("autotuner_config"):
            judge("tour run's autotuner pick", metrics["autotuner_config"])
    if not args.no_tune:
        cache_dir = tempfile.mkdtemp(prefix="probe_autotune_")
        os.environ["TILELANG_CACHE_DIR"] = cache_dir
        try:
            _, best, seconds, _ = autotune.tune(M, N, K, kept)
            log(f"probe's own tilelang.autotune run: {seconds:.1f} s")
            judge("probe's autotune winner", best)
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
