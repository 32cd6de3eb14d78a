"""Probe for softmax on users' problems: for many shapes (narrow, odd, mid, vocabulary-wide, float16 and
bfloat16) build the section's plan (choose_plan) and its alternatives with the lesson's own builders, validate
each against torch.softmax in float32, then time the valid ones in turns with torch.softmax and a device copy
of the same bytes. Prints one table per shape and a summary: the pick against torch and the copy, and the best
plan where it beat the pick.

    python bench/softmax_shapes_probe.py [--shapes 8192x32000,1024x128256:bfloat16] [--budget-s 220] [--out DIR]
    python bench/softmax_shapes_probe.py --list          # the plans per shape, no GPU
    (on the device: bash .device/run python bench/softmax_shapes_probe.py --out $OUT)

Shapes run in groups, each in a child process (a kernel that faults spoils only its group's CUDA context) that
compiles all its group's kernels at once first.
"""

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sections import softmax as S  # noqa: E402
from sections import softmax_plans as P  # noqa: E402

# The targets first (the probe stops at its time budget), then other users' problems, then the section's own.
SHAPES = ["8192x32000", "1024x128256", "65536x256", "16384x3072", "4097x5000", "131072x64", "8192x32000:bfloat16",
          "1x262144", "3x100000", "2048x50257", "100000x100", "32x151936", "1000000x32", "4097x7", "512x65536",
          "32768x4096", "16384x8192", "8192x32768", "4096x1823", "65536x1024:bfloat16", "32768x1000", "256x262144",
          "1x1", "5x9", "1001x64", "7x8193", "5x128256:bfloat16", "3x50257:bfloat16", "1000x50265:bfloat16",
          "5x100003", "4096x50257", "1x50257", "512x151937", "8192x8193"]
GROUP = 7  # shapes per child process
SMALL = 1 << 16  # elements: below this a shape is checked with the pick alone (correctness of odd sizes)
SECTION_RUN = (8192, 32000, "bfloat16")  # the first group also runs the section on this problem, as --shape does


def parse(text: str):
    dims, _, dtype = text.partition(":")
    M, N = (int(v) for v in dims.lower().split("x"))
    return M, N, dtype or "float16"


def alternatives(M: int, N: int, smem: int, family: str) -> list:
    """The section's pick first, then the plans it chose among: rows split over half or twice the threads,
    blocks of 128 and 512 threads, the staged kernel where it applies, and for long rows the online kernel's
    step shapes with its shared-memory head whole, halved or none (the row streamed)."""
    pick = P.choose_plan(M, N, smem, family)
    plans = [pick]
    if M * N < SMALL:
        return plans

    def add(plan):
        if plan not in plans:
            plans.append(plan)

    vec = P.vector_width(N)
    if N <= 32768:  # registers: a row over half / the same / twice the threads, and blocks of 128 and 512
        t0 = P.threads_per_row(N)
        for t, block in ((t0, 128), (t0, 512), (t0 // 2, 256), (2 * t0, 256)):
            block = max(block, t)
            if 1 <= t <= 1024 and P.per_thread(N, t) <= 64 and block // t <= 256:
                add(P.SoftmaxPlan("registers", block // t, block))
    if N % 2 and N <= 2048 and M % 4 == 0:  # the previous rule for short odd rows
        add(P.SoftmaxPlan("registers", 4, 128, min_blocks_per_sm=8))
    if N % 8 == 0 and 1024 < N <= 32768 and 2 * N + P.SMEM_SLACK <= smem:
        for threads in (256, 1024):  # only where the row splits evenly: no masked read past the buffer
            if 8 <= N // threads <= 64 and N % threads == 0:
                add(P.SoftmaxPlan("staged", 1, threads))
    if pick.kind == "cluster":  # every cluster size and step shape, and the online kernel it replaced
        for size in P.CLUSTER_SIZES:
            for per_thread, threads in ((16, 256), (16, 512), (8, 512)):
                padded = -(-P.cluster_part(N, size) // (per_thread * threads)) * per_thread * threads
                if P.splits_over(N, size) and 2 * padded + P.SMEM_SLACK <= smem:
                    add(P.SoftmaxPlan("cluster", per_thread, threads, staged=P.cluster_part(N, size), cluster=size))
        add(P.online_plan(N, smem))
    elif N > 8192:  # the online kernel: step shapes, and the staged head whole, halved, or none
        for per_thread, threads in ((16, 512), (16, 1024), (32, 256)):
            head = P.staged_head(N, smem, threads * per_thread)
            for staged in (head, head // 2 // (threads * per_thread) * (threads * per_thread), 0):
                if per_thread % vec == 0:
                    add(P.SoftmaxPlan("online", per_thread, threads, staged=staged))
    return plans


def log(*a):
    print(*a, flush=True)


def compile_all(shapes, device) -> dict:
    """{(M, N, dtype, plan): kernel or None}: every plan of every shape, compiled at once."""
    import tourkit

    keys = [(M, N, dtype, plan) for M, N, dtype in shapes
            for plan in alternatives(M, N, device.smem_per_block_optin, device.family)]
    programs = [S.build(M, N, plan, device.family, dtype) for M, N, dtype, plan in keys]
    return dict(zip(keys, tourkit.compile_many(programs, log=log)))


def run_shape(M: int, N: int, dtype: str, device, kernels: dict) -> dict:
    import torch
    import tourkit

    plans = alternatives(M, N, device.smem_per_block_optin, device.family)
    rec = {"shape": [M, N], "dtype": dtype, "pick": plans[0].describe(), "why": plans[0].why, "plans": []}
    contenders, described = {}, {}
    x = tourkit.random_tensor((M, N), getattr(torch, dtype), scale=3.0)
    y = torch.empty_like(x)
    for k, plan in enumerate(plans):
        label = ("* " if k == 0 else "  ") + plan.describe()
        try:
            kernel = kernels.get((M, N, dtype, plan))
            if kernel is None:  # compile_many keeps errors quiet: once more, for the message
                import tilelang

                kernel = tilelang.compile(S.build(M, N, plan, device.family, dtype), out_idx=None, target="cuda")
            softmax = S.launcher(kernel, plan)
            check = S.check_shape(M, N, plan, softmax, device.family, dtype)
        except Exception as exc:
            log(f"  FAILED {label}: {tourkit.one_line(exc)}")
            rec["plans"].append({"plan": label, "error": tourkit.one_line(exc)})
            continue
        if not check.passed:
            log(f"  FAILED {check.line()}")
            rec["plans"].append({"plan": label, "error": check.line()})
            continue
        contenders[label] = (lambda f: lambda: f(x, y))(softmax)
        described[label] = check.rel_error
    contenders["torch.softmax"] = lambda: torch.softmax(x, dim=-1)
    contenders["copy"] = lambda: y.copy_(x)
    ms = tourkit.bench_interleaved(contenders, rounds=2, settle_ms=200.0, warmup_ms=3.0, rep_ms=15.0, max_reps=100)
    copy_ms, torch_ms = ms["copy"], ms["torch.softmax"]
    rows = []
    for label, t in sorted(ms.items(), key=lambda kv: kv[1]):
        rows.append([label, f"{1e3 * t:.1f}", f"{100 * copy_ms / t:.0f}%", f"{torch_ms / t:.2f}x"])
        if label in described:
            rec["plans"].append({"plan": label, "us": 1e3 * t, "of_copy": copy_ms / t, "vs_torch": torch_ms / t,
                                 "rel_error": described[label]})
    mb = 4 * M * N / 1e6
    log(f"\nsoftmax {M}x{N} {dtype} ({mb:.1f} MB moved); pick: {plans[0].describe()}\n  why: {plans[0].why}")
    log(tourkit.format_table(["plan", "µs", "of copy", "vs torch"], rows))
    rec.update(copy_us=1e3 * copy_ms, torch_us=1e3 * torch_ms, mb=mb)
    return rec


def child(shapes: list, out: str) -> None:
    import tourkit

    device = tourkit.detect_device()
    kernels = compile_all(shapes, device)
    records = []
    for M, N, dtype in shapes:
        try:
            records.append(run_shape(M, N, dtype, device, kernels))
        except Exception as exc:
            log(f"softmax {M}x{N} {dtype}: FAILED {tourkit.one_line(exc)}")
            records.append({"shape": [M, N], "dtype": dtype, "error": tourkit.one_line(exc)})
        with open(out, "w") as fh:
            json.dump(records, fh, indent=1)
    if SECTION_RUN in shapes:  # the section itself on a user's problem (its kernel is in TileLang's cache now)
        M, N, dtype = SECTION_RUN
        log(f"\nthe section with --shape {M}x{N} --dtype {dtype}:")
        try:
            S.run(tourkit.TourContext(device=device, shape=(M, N), dtype=dtype))
        except Exception as exc:
            log(f"section run FAILED: {tourkit.one_line(exc)}")


def summary(records: list) -> None:
    import tourkit

    rows = []
    for rec in records:
        shape = f"{rec['shape'][0]}x{rec['shape'][1]}{' bf16' if rec['dtype'] == 'bfloat16' else ''}"
        timed = [p for p in rec.get("plans", []) if "us" in p]
        pick = next((p for p in timed if p["plan"].startswith("*")), None)
        if pick is None:
            rows.append([shape, "PICK FAILED OR NOT TIMED", "", "", "", ""])
            continue
        best = min(timed, key=lambda p: p["us"])
        better = "" if best is pick else f"{best['plan'].strip()} ({best['vs_torch']:.2f}x, {100 * best['of_copy']:.0f}%)"
        rows.append([shape, pick["plan"][2:][:60], f"{pick['us']:.1f}", f"{pick['vs_torch']:.2f}x",
                     f"{100 * pick['of_copy']:.0f}%", better])
    log("\nSUMMARY (pick = the section's plan; copy = a same-size device copy)")
    log(tourkit.format_table(["shape", "pick", "µs", "vs torch", "of copy", "best other, if faster"], rows))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget-s", type=float, default=220.0, help="stop starting groups after this many seconds")
    ap.add_argument("--list", action="store_true", help="print each shape's plans (no GPU)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    started = time.time()
    shapes = [parse(s) for s in args.shapes.split(",") if s.strip()]
    if args.list:
        import tourkit

        spec = tourkit.ARCH_SPECS["sm_90a"]
        for M, N, dtype in shapes:
            log(f"{M}x{N} {dtype}:")
            for plan in alternatives(M, N, spec.smem_per_block_optin, spec.family):
                log(f"  {plan.describe()}")
        return 0
    if args.child:
        child(shapes, args.child)
        return 0
    import tourkit

    device = tourkit.detect_device()
    if device is None:
        log("no CUDA GPU here: use --list")
        return 2
    log(f"{device.name}: {device.sm_count} SMs, {device.smem_per_block_optin // 1024} KiB shared memory per block")
    os.makedirs(args.out, exist_ok=True)
    records = []
    for g in range(0, len(shapes), GROUP):
        if time.time() - started > args.budget_s:
            log(f"time budget spent: {len(shapes) - g} shapes not run")
            break
        group = shapes[g:g + GROUP]
        part = os.path.join(args.out, f"softmax_shapes_{g // GROUP}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", part,
               "--shapes", ",".join(f"{M}x{N}:{d}" for M, N, d in group)]
        try:
            subprocess.run(cmd, timeout=max(10.0, args.budget_s + 15 - (time.time() - started)), check=False)
        except subprocess.TimeoutExpired:
            log(f"group {g // GROUP} ran out of time")
        if os.path.exists(part):
            with open(part) as fh:
                records += json.load(fh)
    summary(records)
    with open(os.path.join(args.out, "softmax_shapes_probe.json"), "w") as fh:
        json.dump({"device": device.name, "records": records}, fh, indent=1)
    log(f"done in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
