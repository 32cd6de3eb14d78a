"""Probe: the few-rows GEMM on the CUDA cores (`sections/gemm_rows.py`) against cuBLAS and the tensor-core plan.

For each problem: the tensor-core plan (`gemm_plans.tensor_core_plan`, pads and split-K included), the
few-rows kernel (up to KERNEL_ROWS_MAX rows, beyond the rule's) with `rows_schedule`'s configuration and neighbours of it (the split's runs added in the
kernel, half and twice the K splits, other column layouts). Each is checked against a float32 reference on its
second call (right only if a K split's arrival counts went back to 0), then all are timed in turns with cuBLAS.

    python bench/gemm_rows_probe.py [--shapes 1x4097x4096,4x11008x4096:bfloat16] [--rounds 4]
    (on the device: bash .device/run python bench/gemm_rows_probe.py)
"""

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sections import gemm_plans as P  # noqa: E402
from sections import gemm_rows as R  # noqa: E402

SHAPES = ("1x4097x4096,1x4096x4096,2x1025x8191,4x4096x4096,8x4096x4096,1x50257x4096,8x11007x4096,"
          "1x128x32768,3x1000x1000,8x14336x4096:bfloat16,5x777x333,1x32000x4096,2x4096x11008")


def variants(M: int, N: int, K: int, sms: int) -> list:
    """The rule's configuration first, then its neighbours: its split's runs added the other way (by the last
    block to arrive, or by a second kernel), half and twice the K splits, wider lanes (fewer groups along K), 128-thread blocks, two more
    rows a step."""
    pick = R.rows_schedule(M, N, K, sms)
    out = [pick, replace(pick, last_adds=not pick.last_adds and pick.split_k > 1), replace(pick, split_k=max(1, pick.split_k // 2)),
           replace(pick, split_k=pick.split_k * 2), replace(pick, lanes=128), replace(pick, threads=128),
           replace(pick, block_K=pick.block_K * 2)]
    if M > R.ROWS_MAX:  # more rows than the rule takes: the FMAs, not B's stream, may bound it; more blocks
        out += [replace(pick, split_k=pick.split_k * 4, last_adds=True),
                replace(pick, split_k=pick.split_k * 2, last_adds=True),
                replace(pick, split_k=pick.split_k * 4, last_adds=True, block_K=pick.block_K * 2)]
    return [c for c in dict.fromkeys(out) if c == pick or c.split_k <= R.UNROLLED_SPLITS]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES, help="MxNxK[:dtype],...")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()

    import tilelang
    import torch

    import tourkit

    props = torch.cuda.get_device_properties(0)
    sms, smem = props.multi_processor_count, 227 * 1024
    print(f"{props.name}, {sms} SMs", flush=True)
    problems = []
    for item in args.shapes.split(","):
        shape, _, dtype = item.partition(":")
        M, N, K = (int(x) for x in shape.split("x"))
        problems.append((M, N, K, dtype or "float16"))

    def compile_(func, configs=None):
        return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=configs or {})

    def plans(M, N, K, dtype):
        """The tensor-core plan, then (few rows) the few-rows kernel's variants, the rule's first."""
        rows = variants(M, N, K, sms) if M <= R.KERNEL_ROWS_MAX else []
        return [P.tensor_core_plan(M, N, K, "hopper", sms, smem, dtype)] + [P.GemmPlan(M, N, K, c, dtype, pad=False)
                                                                            for c in rows]

    jobs = {}
    with ThreadPoolExecutor(max_workers=16) as pool:
        started = time.perf_counter()
        for problem in problems:
            for plan in plans(*problem):
                jobs[plan] = {part: pool.submit(compile_, f, plan.pass_configs(part)) for part, f in plan.programs().items()}
        for futures in jobs.values():
            for f in futures.values():
                f.exception()
    print(f"compiled in {time.perf_counter() - started:.0f} s", flush=True)

    from sections.gemm_schedules import gemm_inputs, reference

    for M, N, K, dtype in problems:
        a, b, c = gemm_inputs(M, N, K, dtype=dtype)
        ref, c_ref = reference(a, b), torch.empty_like(c)
        fns, errors = {"cuBLAS": lambda: torch.matmul(a, b, out=c_ref)}, {}
        for i, plan in enumerate(plans(M, N, K, dtype)):
            try:
                kernels = {part: f.result() for part, f in jobs[plan].items()}
            except Exception as exc:  # noqa: BLE001
                print(f"  {plan.label()}: did not build: {tourkit.one_line(exc)}")
                continue
            label = ("tensor cores: " if i == 0 else "rows: ") + plan.label()
            run = (lambda launcher: lambda: launcher(a, b, c))(P.GemmLauncher(plan, kernels))
            for _ in range(2):
                c.fill_(float("nan"))
                run()
            torch.cuda.synchronize()
            errors[label] = tourkit.relative_error(c, ref)
            fns[label] = run
        ms = tourkit.bench_interleaved(fns, rounds=args.rounds)
        base = ms["cuBLAS"]
        print(f"\n{M}x{N}x{K} {dtype}: cuBLAS {base * 1e3:.1f} us, {2 * K * N / base / 1e6:.0f} GB/s of B "
              f"(rel. error {tourkit.relative_error(c_ref, ref):.2e})")
        for label, t in ms.items():
            if label != "cuBLAS":
                err = errors.get(label)
                print(f"  {base / t:5.2f}x  {t * 1e3:7.1f} us  {label}" + (f"  (rel. error {err:.2e})" if err is not None else ""))
        sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
