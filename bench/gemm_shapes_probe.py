"""Probe for the GEMM on users' problems: for many shapes (the targets, skinny, tiny, ragged, unaligned, huge,
bfloat16) build the rule's pick (gemm_plans.plan_problem) and the next candidates by the cost model, validate
each against a float32 reference, then time them in turns with cuBLAS (torch.matmul). Also the fused
bias + GELU pick against eager PyTorch on two shapes. Beside the rule's candidates (`variants`): on Hopper the
appendix's hand-written kernel at three tile widths; unaligned problems
also unpadded (loaded masked). Prints one table per shape and a summary.

    python bench/gemm_shapes_probe.py [--shapes 64x8192x8192,8192x8192x8192:bfloat16] [--budget-s 220]
    python bench/gemm_shapes_probe.py --list       # the plans and estimates per shape, no GPU
    python bench/gemm_shapes_probe.py --every-tile --shapes 20000000x16x16,65536x64x4096   # tall, skinny N
    python bench/gemm_shapes_probe.py --no-ws ...   # each schedule also without warp specialization (Hopper)
    python bench/gemm_shapes_probe.py --last-adds ...   # each K split also added in the same launch
    python bench/gemm_shapes_probe.py --tiles 192x96x384,128x128:s6:Square ...  # tiles outside the candidates
    (on the device: bash .device/run python bench/gemm_shapes_probe.py)

Kernels compile in threads, shape by shape in the list's order; by default every compile finishes before
the timing starts (compiles running beside the timing slow the host's launches and so small problems' times);
--overlap times each shape as soon as its kernels are ready. The probe stops starting shapes at its budget.
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

SHAPES = ["2000x3000x4000", "1536x1536x1536", "3000x3000x3000", "4096x4096x1024", "1024x1024x1024",
          "2048x2048x2048", "4096x4096x4096", "2500x1000x3000", "16x5120x5120", "128x4096x11008", "1x4096x4096",
          "8x8192x8192", "7x13x5",
          "33x4097x65", "100x100x100", "777x4097x1234", "12288x12288x12288", "fused:2000x3000x4000",
          "fused:5120x13824x5120"]


def parse(text: str):
    fused = text.startswith("fused:")
    text = text.removeprefix("fused:")
    dims, _, dtype = text.partition(":")
    M, N, K = (int(v) for v in dims.lower().split("x"))
    return M, N, K, dtype or "float16", fused


def extra_tiles(text, K, smem, sms=132):
    """GemmConfigs of --tiles: BMxBN[xTHREADS][:sSTAGES][:POLICY][:P][:flat][:kSPLITS] (256 threads by default;
    384: three consumer warp groups, one 64-row strip each; 4 stages or as many as fit; FullRow unless named; P:
    walked by `sms` persistent blocks; flat: no L2 swizzle; kSPLITS: K split that many ways), fitted to K."""
    out = []
    for item in filter(None, text.split(",")):
        dims, *options = item.split(":")
        bm, bn, *rest = (int(v) for v in dims.lower().split("x"))
        stages = next((int(o[1:]) for o in options if o.startswith("s") and o[1:].isdigit()), 4)
        policy = next((o for o in options if o in P.WARP_POLICIES), "FullRow")
        splits = next((int(o[1:]) for o in options if o.startswith("k") and o[1:].isdigit()), 1)
        config = P.GemmConfig(bm, bn, 64, stages, rest[0] if rest else 256, "flat" not in options, policy=policy,
                              persistent=sms if "P" in options else 0, split_k=splits)
        config = P.fitted_to_k(config, K)
        while not P.fits(config, smem) and config.num_stages > 2:
            config = replace(config, num_stages=config.num_stages - 1)
        out.append(config)
    return out


def plans_for(M, N, K, dtype, fused, family, sms, smem, reach=2.0):
    """The pick; per candidate tile its best split by the model (within `reach` times the pick's estimate);
    the pick's tile with twice or half its split; the lesson's default."""
    pick = P.plan_problem(M, N, K, family, sms, smem, dtype)
    if fused:
        return [pick] + [replace(pick, config=c) for c in (
            P.GemmConfig(128, 256, 64, 3, 256, True), P.GemmConfig(128, 128, 64, 4, 256, True),
            replace(P.PERSISTENT, persistent=sms)) if P.fits(c, smem)]
    Na, Ka = P.aligned(N), P.aligned(K)
    options = P.candidate_schedules(M, Na, Ka, family, sms, smem)
    est = {c: P.estimate_seconds(M, Na, Ka, c, family, sms, smem) for c in options}
    configs = [pick.config]
    pick_est = (est.get(replace(pick.config, last_adds=False)) if isinstance(pick.config, P.GemmConfig) else None)
    pick_est = pick_est if pick_est is not None else min(est.values())
    for base in P.CANDIDATES[family]:
        same = [c for c in options if (c.block_M, c.block_N, c.threads) == (base.block_M, base.block_N, base.threads)]
        if same:
            best = min(same, key=est.get)
            if best not in configs and est[best] < reach * pick_est:
                configs.append(best)
    for split in (pick.config.split_k * 2, pick.config.split_k // 2):
        other = replace(pick.config, split_k=split)
        if split >= 1 and other in options and other not in configs:
            configs.append(other)
    default = P.lesson_schedules(family)[0]
    if default not in configs and P.fits(default, smem):
        configs.append(default)
    plans = [replace(pick, config=c) for c in configs] + variants(pick, M, N, K, family, sms, smem)
    if not pick.pad and (N, K) != (Na, Ka):  # rows loaded masked
        # Three consumer warpgroups with masked copies may hang (gemm_plans.MASKED_MAX_THREADS); the persistent
        # walk is for aligned rows. Beside them, what the rule turned down: the padded copies and their pick.
        plans = [p for p in plans if not isinstance(p.config, P.GemmConfig)
                 or (p.config.threads <= P.MASKED_MAX_THREADS and not p.config.persistent)]
        plans.append(replace(pick, config=P.choose_schedule(M, Na, Ka, family, sms, smem)[0], pad=True))
    return list(dict.fromkeys(plans))


def variants(pick, M, N, K, family, sms, smem):
    """Beside the rule's candidates: the appendix's hand-written kernel with three tiles, a wider swizzle panel;
    unaligned problems loaded masked, unpadded."""
    out = []
    if pick.padded:
        out.append(replace(pick, pad=False))
        small = P.GemmConfig(64, 64, 32, 2, 128, False)
        out.append(replace(pick, config=small, pad=False))
        return out
    if family == "hopper" and N <= 128 and M >= 16 * N:  # tall and narrow: tiles as narrow as the problem
        for bm, bn, threads in ((128, 64, 128), (256, 64, 256), (256, 128, 256), (128, 32, 128)):
            if bn >= N or bn == 64:
                config = P.fitted_to_k(P.GemmConfig(bm, bn, 64, 4, threads, True, policy="FullRow"), K)
                if P.fits(config, smem):
                    out.append(replace(pick, config=config))
    if family != "hopper" or M * N < 1024 * 1024:
        return out
    for config in PERSISTENT:  # the lesson's kernel walking tiles in one pipelined loop
        if P.fits(replace(config, persistent=sms), smem):
            out.append(replace(pick, config=P.fitted_to_k(replace(config, persistent=sms), K)))
    from sections.hopper import gemm_ws

    for bn, buffers in ((256, 4), (192, 3), (128, 2)) if M * N <= 6144 * 6144 else ((256, 4),):
        out.append(replace(pick, config=gemm_ws.WsConfig(128, bn, 64, 3 if bn == 256 else 4, 256, True,
                                                         persistent=sms, store_buffers=buffers, even_rounds=True)))
    if M * N >= 8192 * 8192:
        out.append(replace(pick, config=replace(pick.config, panel=16)))
    else:  # the lesson's three-consumer schedule: taller tiles, fewer blocks
        out.append(replace(pick, config=P.GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol")))
    return out


# the rule's persistent tile (gemm_plans.PERSISTENT) and two narrower ones with a stage more
PERSISTENT = [P.PERSISTENT, P.GemmConfig(128, 192, 64, 4, 256, True, policy="FullRow"),
              P.GemmConfig(128, 128, 64, 5, 256, True)]


def part_calls(launcher, a, b, c) -> dict:
    """The pieces of one (unfused) launcher call, each alone, for --parts: the operands' padded copies, the GEMM
    kernel on copies made once, the split-K reduction. Call after the launcher has run once (its buffers)."""
    plan, kernels, buffers = launcher.plan, launcher.kernels, launcher.buffers
    padded, views, w, arrivals = buffers["padded"], buffers["views"], buffers["w"], buffers["arrivals"]
    a_in = padded["a"] if "a" in views else a
    b_in = padded["b"] if padded["b"] is not None else b
    out = padded["c"] if "c" in views else c
    calls = {}
    by_kernel = {"b"} if "pad_b" in kernels else set()  # B's copy is the pad_b program, timed below
    copies = [(views[key], t) for key, t in (("a", a), ("b", b)) if key in views and key not in by_kernel]
    if copies:
        calls["copies"] = lambda: [view.copy_(t) for view, t in copies]
    if "pad_b" in kernels:
        calls["pad_b"] = lambda: kernels["pad_b"](b, padded["b"])
    if arrivals is not None:
        calls["gemm"] = lambda: kernels["gemm"](a_in, b_in, w, arrivals, out)
    elif w is not None:
        calls["gemm"] = lambda: kernels["gemm"](a_in, b_in, w)
        calls["reduce"] = lambda: kernels["reduce"](w, out)
    else:
        calls["gemm"] = lambda: kernels["gemm"](a_in, b_in, out)
    if "c" in views:
        calls["c out"] = lambda: c.copy_(out[:, :plan.N])
    return calls


def estimate_us(plan, family, sms, smem):
    if not isinstance(plan.config, P.GemmConfig):
        return 0.0
    return P.estimate_seconds(plan.M, P.aligned(plan.N), P.aligned(plan.K), plan.config, family, sms, smem) * 1e6


def short(plan):
    config = plan.config
    if not isinstance(config, P.GemmConfig):
        return f"ws {config.block_M}x{config.block_N} s{config.num_stages}"
    split = f" /{config.split_k}" if config.split_k > 1 else ""
    more = (" P" if getattr(config, "persistent", 0) else "") + (f" pn{config.panel}" if config.panel != 10 else "")
    more += " " + config.policy[:4] if config.policy != "Square" else ""
    more += " nopad" if not plan.pad else ""
    more += " direct" if not getattr(config, "staged_store", True) else ""
    more += " noWS" if not getattr(config, "warp_specialized", True) else ""
    more += " flat" if not config.swizzle else ""
    more += " last" if getattr(config, "last_adds", False) else ""
    return f"{config.block_M}x{config.block_N}x{config.block_K} s{config.num_stages} t{config.threads}{split}{more}"


def log(*a):
    print(*a, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--budget-s", type=float, default=195)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--every-tile", action="store_true",
                    help="time every candidate tile, however far the model puts it behind the pick")
    ap.add_argument("--overlap", action="store_true", help="time shapes while later ones still compile")
    ap.add_argument("--tiles", default="", help="more tiles to time on every shape: BMxBN[xTHREADS][:sSTAGES][:POLICY][:P][:flat][:kSPLITS],... (extra_tiles)")
    ap.add_argument("--fixed-reduce", action="store_true",
                    help="also time each split-K reduction in REDUCE_TILE's blocks, whatever C's size (not "
                         "reduce_tile's), a round trip a split")
    ap.add_argument("--torch-b-copy", action="store_true",
                    help="also run each padded plan with B's zero-padded copy made by torch's copy_, not the plan's "
                         "pad_rows kernel")
    ap.add_argument("--parts", action="store_true",
                    help="also time each plan's pieces alone: padded copies, the GEMM kernel, the reduction")
    ap.add_argument("--last-adds", action="store_true",
                    help="also build each K-split schedule with its runs added by the last block to arrive (one "
                         "launch) instead of by the split-K reduction kernel")
    ap.add_argument("--no-ws", action="store_true",
                    help="also build each lesson schedule with tl.disable_warp_specialized (Hopper): no producer "
                         "warpgroup, cp.async by every thread, registers as needed, so blocks can share an SM")
    args = ap.parse_args()
    started = time.perf_counter()
    shapes = [parse(s) for s in args.shapes.split(",")]
    reach = float("inf") if args.every_tile else 2.0

    if args.list:
        for M, N, K, dtype, fused in shapes:
            for plan in plans_for(M, N, K, dtype, fused, "hopper", 132, 232448, reach):
                log(f"{M}x{N}x{K} {dtype}{' fused' if fused else ''}: {short(plan)} "
                    f"est {estimate_us(plan, 'hopper', 132, 232448):.0f} us")
            log("   ", P.plan_problem(M, N, K, "hopper", 132, 232448, dtype).describe())
        return

    import tilelang
    import torch

    import tourkit
    from sections import fusion
    from sections.gemm_epilogue import REDUCE_TILE, splitk_reduce_program
    from sections.gemm_schedules import TOLERANCE, reference

    tourkit.quiet_tilelang()
    device = tourkit.detect_device()
    family, sms, smem = device.family, device.sm_count, device.smem_per_block_optin
    log(f"{device.name}: {sms} SMs, {smem} B shared memory a block, family {family}")

    def build(plan, fused, fixed_reduce=False, torch_b_copy=False):
        act = "gelu" if fused else None
        progs = plan.programs(bias=fused, activation=act)
        M, N, _ = plan.kernel_shape
        if fixed_reduce:  # the reduction in REDUCE_TILE's blocks whatever C's size, a round trip a split
            progs["reduce"] = splitk_reduce_program(M, N, plan.config.split_k, bias=fused, activation=act,
                                                    dtype=plan.dtype, tile=REDUCE_TILE, c_cols=plan.c_width)
        if torch_b_copy:  # no "pad_b" program: the launcher copies B into its zero-padded buffer with copy_
            progs.pop("pad_b")
        return {k: tilelang.compile(f, out_idx=None, target="cuda", pass_configs=plan.pass_configs(k, act))
                for k, f in progs.items()}

    def builds(plan):
        yield plan
        config = plan.config
        if args.no_ws and isinstance(config, P.GemmConfig) and config.warp_specialized and config.threads <= 256:
            yield replace(plan, config=replace(config, warp_specialized=False))
        if args.last_adds and isinstance(config, P.GemmConfig) and config.split_k > 1:
            yield replace(plan, config=replace(config, last_adds=not config.last_adds))

    pool = ThreadPoolExecutor(max_workers=16)
    jobs = []
    for M, N, K, dtype, fused in shapes:
        plans = plans_for(M, N, K, dtype, fused, family, sms, smem, reach)
        if not fused:
            plans = list(dict.fromkeys(plans + [replace(plans[0], config=c) for c in extra_tiles(args.tiles, K, smem, sms)]))
        built = list(dict.fromkeys(plan for p in plans for plan in builds(p)))
        todo = [(plan, pool.submit(build, plan, fused), "") for plan in built]
        if args.fixed_reduce:
            todo += [(plan, pool.submit(build, plan, fused, True), " fixed-reduce") for plan in built
                     if "reduce" in plan.parts and isinstance(plan.config, P.GemmConfig)]
        if args.torch_b_copy:
            todo += [(plan, pool.submit(build, plan, fused, False, True), " torch-b-copy") for plan in built
                     if plan.padded and not plan.pad_b]
        jobs.append(((M, N, K, dtype, fused), todo))

    if not args.overlap:
        for _, plans in jobs:
            for _, fut, _ in plans:
                fut.exception()  # wait; a failed compile is reported where its shape is timed
        log(f"compiled in {time.perf_counter() - started:.0f} s")
    summary = []
    for (M, N, K, dtype, fused), plans in jobs:
        if time.perf_counter() - started > args.budget_s:
            log(f"budget reached: {M}x{N}x{K} and later not timed")
            break
        tdt = getattr(torch, dtype)
        name = f"{M}x{N}x{K} {dtype}{' fused bias+gelu' if fused else ''}"
        try:
            a = tourkit.random_tensor((M, K), tdt, seed=1)
            b = tourkit.random_tensor((K, N), tdt, seed=2, scale=K ** -0.5 if fused else 1.0)
            bias = tourkit.random_tensor((N,), tdt, seed=3) if fused else None
            c = torch.empty((M, N), dtype=tdt, device="cuda")
            ref = reference(a, b, bias, "gelu" if fused else None)
            fns, rows = {}, {}
            for plan, fut, tag in plans:
                label = short(plan) + tag
                try:
                    launcher = P.GemmLauncher(plan, fut.result())
                    call = (lambda L=launcher: L(a, b, bias, c)) if fused else (lambda L=launcher: L(a, b, c))
                    check = tourkit.validate(label, call, c, ref, TOLERANCE)
                    if check.passed and getattr(plan.config, "last_adds", False):  # the counts back to 0?
                        check = tourkit.validate(label + ", second call", call, c, ref, TOLERANCE)
                    rows[label] = [estimate_us(plan, family, sms, smem), check.rel_error, plan]
                    if check.passed:
                        fns[label] = call
                        if args.parts and not fused:
                            parts = part_calls(launcher, a, b, c)
                            if len(parts) > 1:
                                fns.update({f"{label} [{part}]": fn for part, fn in parts.items()})
                    else:
                        log(f"  {name} {label}: FAILED {check.line()}")
                except Exception as exc:
                    log(f"  {name} {label}: ERROR {tourkit.one_line(exc)}")
            c_ref = torch.empty_like(c)
            if fused:
                fns["eager"] = lambda: fusion.eager(a, b, bias)
            else:
                fns["cuBLAS"] = lambda: torch.matmul(a, b, out=c_ref)
            ms = tourkit.bench_interleaved(fns, rounds=2, settle_ms=400)
            base = ms["eager" if fused else "cuBLAS"]
            log(f"\n{name}: {'eager' if fused else 'cuBLAS'} {base * 1e3:.1f} us "
                f"({tourkit.tflops(2 * M * N * K, base):.0f} TFLOP/s)")
            for label, (est, err, plan) in rows.items():
                if label in ms:
                    log(f"  {label:<28} est {est:8.1f} us  got {ms[label] * 1e3:8.1f} us  "
                        f"{base / ms[label]:.3f}x  err {err:.1e}{'  <- pick' if label == short(plans[0][0]) else ''}")
                for part in (k for k in ms if k.startswith(label + " [")):
                    log(f"      {part[len(label) + 1:]:<24} {ms[part] * 1e3:8.1f} us alone")
            pick = short(plans[0][0])
            ours = {k: v for k, v in ms.items() if k in rows}
            best = min(ours, key=ours.get) if ours else "-"
            summary.append(f"{name:<34} pick {pick:<26} {base / ms[pick] if pick in ms else 0:.3f}x   best {best:<26} "
                           f"{base / ms[best] if best in ms else 0:.3f}x")
            del a, b, c, ref, c_ref
            torch.cuda.empty_cache()
        except Exception as exc:
            log(f"{name}: ERROR {tourkit.one_line(exc)}")
    log("\nsummary (ratio = torch time / ours; fused rows against eager)")
    for line in summary:
        log(line)
    log(f"done in {time.perf_counter() - started:.0f} s")
    os._exit(0)  # do not wait for compiles of shapes not reached


if __name__ == "__main__":
    main()
