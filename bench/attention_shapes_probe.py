"""Probe for flash_attention's configuration rule on problems of every kind: for each problem, the rule's choice
(sections/attention_plans.choose_config), the appendix's hand-written kernel and alternatives of the lesson's
kernel (tile sizes, stages, three consumer warp groups, two or three blocks per SM, async vs pipelined, the
persistent walk for full attention), each validated against a float32 reference and timed in turns with SDPA.

    python bench/attention_shapes_probe.py [--out DIR] [--budget SECONDS] [--filter TEXT] [--list]

Kernels compile in worker processes (filling TileLang's disk cache) while the main process validates and
times the problems whose kernels are ready, in order; past --budget seconds the rest is skipped and the table
printed. Prints one line per problem as it goes, a table at the end, and writes probe.json to --out.
"""

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sections import attention_plans as plans  # noqa: E402  (no torch, no tilelang at import)

START = time.time()
HOPPER_SMEM, SMS = 232448, 132
# (dims, dtype): the targets first (a budget cuts the tail), then shapes of the same kinds not tuned on; full
# attention over many short walks last (ragged grouped-query, bf16).
PROBLEMS = [
    ((4, 16, 2048, 64), "float16"),
    ((1, 32, 3000, 128), "float16"),
    ((2, 8, 8192, 64), "float16"),
    ((8, 32, 512, 128), "float16"),
    ((1, 32, 4096, 128, 8), "float16"),
    ((4, 32, 4096, 128), "bfloat16"),
    ((16, 16, 1024, 64), "float16"),
    ((32, 16, 256, 128), "float16"),
    ((2, 16, 2048, 64, 2), "float16"),
    ((4, 8, 1000, 64), "float16"),
    ((3, 12, 1537, 64), "bfloat16"),
    ((1, 16, 16384, 64), "float16"),
    ((4, 32, 1024, 128), "float16"),
    ((64, 8, 256, 64), "float16"),
    ((2, 32, 2048, 128, 8), "float16"),
    ((32, 16, 512, 64), "float16"),
    ((128, 4, 200, 64), "float16"),
    ((6, 24, 300, 128, 4), "float16"),
    ((8, 20, 1000, 64), "bfloat16"),
    ((1, 8, 1024, 128), "float16"),  # few query tiles: causal pairs fill a quarter of the SMs
    ((2, 4, 2048, 64), "float16"),
    ((4, 16, 300, 128), "float16"),  # ragged short walks: 128-row tiles pad 300 keys to 384, 64-row ones to 320
    ((8, 8, 700, 128), "float16"),
    ((2, 32, 333, 64), "float16"),
    ((2, 32, 1500, 128), "float16"),  # head dim 128 at more lengths and batches: the walks' rule between 4 and 64
    ((1, 16, 6000, 128), "float16"),  # key steps, grouped-query or not, ragged or not
    ((1, 32, 3000, 128, 8), "float16"),
    ((16, 16, 640, 128), "float16"),
    ((2, 40, 2048, 128), "float16"),
    ((1, 32, 4096, 128), "float16"),
    ((4, 32, 2048, 128), "float16"),
    ((1, 64, 8192, 128, 8), "float16"),
]
ROUNDS = 4  # turns per contender (two forward/backward pairs)


# Correctness only, after the timed problems: odd lengths, one query row, grouped-query attention, bf16, with
# the rule's choice and the appendix; the occupancy variants on two of them.
CHECKED = [(1, 3, 777, 128), (1, 2, 5, 64), (1, 16, 1, 128), (1, 8, 333, 64, 2), (2, 8, 1000, 128, 4, "bfloat16")]


def A(bm, bn, num_stages=2, **kw):
    return dict(kind="async", block_M=bm, block_N=bn, num_stages=num_stages, threads=2 * bm, fast_math=True, **kw)


def P(bm, bn, stages=2, **kw):
    return dict(kind="pipelined", block_M=bm, block_N=bn, num_stages=stages, threads=2 * bm, fast_math=True, **kw)


def PW(bm, bn, per_sm):
    """The persistent walk, `per_sm` blocks an SM."""
    return dict(kind="persistent", block_M=bm, block_N=bn, num_stages=2, threads=2 * bm, workers=per_sm * SMS,
                fast_math=True, **({"blocks_per_sm": per_sm} if per_sm > 1 else {}))


def candidates(problem):
    """{label: cfg}: the rule's choice first, the appendix, then the lesson kernel's alternatives: deeper K/V
    rings, wider key tiles, three consumer warp groups, and two or three blocks per SM (capped registers)."""
    from sections.hopper import attention_ws

    rule, why = plans.choose_config(problem, "hopper", HOPPER_SMEM, SMS)
    hf = dict(heavy_first=True) if problem.causal else {}
    out = {"rule": rule}
    appendix = attention_ws.choose_config(problem, "hopper", HOPPER_SMEM, SMS)
    if appendix:
        out["appendix"] = appendix
    if (other := plans.runner_up(problem, "hopper", HOPPER_SMEM, SMS)) is not None:
        out["runner-up"] = other[0]  # the rule's next branch, which the tour times beside its pick
    # Shared memory allows two blocks per SM where a block takes at most half of it (head dim 128: 64x64 tiles).
    if problem.dim == 64:
        alts = {"pipe 128x128 s3": P(128, 128, 3, **hf), "pipe 128x192": P(128, 192, **hf),
                "pipe 192x128": P(192, 128, **hf), "pipe 64x128 x2": P(64, 128, blocks_per_sm=2, **hf),
                "pipe 64x64 x3": P(64, 64, blocks_per_sm=3, **hf),
                "pipe 128x64 x2": P(128, 64, blocks_per_sm=2, **hf),
                # wider key tiles: in the FA3 schedule (as the appendix at this head dim), or two blocks an SM;
                # and two blocks an SM with a third K/V stage
                "async 128x176": A(128, 176, **hf),
                "async 128x192": A(128, 192, **hf), "pipe 64x192 x2": P(64, 192, blocks_per_sm=2, **hf),
                "pipe 64x128 x2 s3": P(64, 128, 3, blocks_per_sm=2, **hf)}
    elif problem.seq_len <= 1024:
        alts = {"pipe 128x128": P(128, 128, **hf), "pipe 64x128": P(64, 128, **hf), "pipe 128x64": P(128, 64, **hf),
                "pipe 64x64 x2": P(64, 64, blocks_per_sm=2, **hf),
                "async 128x128": A(128, 128, **hf), "async 128x64": A(128, 64, **hf),  # FA3 below its threshold
                "pipe 128x128 noWS": P(128, 128, no_ws=True, **hf), "pipe 64x64 noWS": P(64, 64, no_ws=True, **hf),
                "pipe 64x128 noWS": P(64, 128, no_ws=True, **hf)}
    else:
        alts = {"async 128x128": A(128, 128, **hf), "async 128x176": A(128, 176, **hf),
                "pipe 64x64 x2": P(64, 64, blocks_per_sm=2, **hf)}
    # the FA3 schedule in 64-row blocks sharing an SM (capped registers): each block's softmax beside its own
    # P·V and the other blocks' MMAs
    if problem.dim == 64:
        for bn, per_sm in ((128, 2), (176, 2), (192, 2), (64, 3)):
            alts[f"fa3 64x{bn} x{per_sm}"] = A(64, bn, blocks_per_sm=per_sm, **hf)
    else:
        alts["fa3 64x64 x2"] = A(64, 64, blocks_per_sm=2, **hf)
    # the lesson's persistent walk (sections/attention_persistent.py): one 128-row block an SM, or two 64-row ones;
    # causal walks go in pairs of query tiles, which needs square tiles
    walks = [(128, 128, 1), (64, 64, 2)] if problem.causal else [(128, 128, 1), (128, 64, 1), (64, 128, 2), (64, 64, 2)]
    for bm, bn, per_sm in walks:
        cfg = PW(bm, bn, per_sm)
        if per_sm * plans.config_smem(cfg, problem.dim) <= HOPPER_SMEM:
            alts[f"persistent {bm}x{bn}" + (f" x{per_sm}" if per_sm > 1 else "")] = cfg
    # the walk with the FA3 schedule (one extra step a worker, not a tile)
    alts["pwalk async 128x128"] = dict(PW(128, 128, 1), kind="persistent_async")
    if problem.dim == 64 and not problem.causal:  # as the appendix walks head dim 64: 176-wide key tiles
        alts["pwalk async 128x176"] = dict(PW(128, 176, 1), kind="persistent_async")
    for label, cfg in alts.items():
        if cfg not in out.values() and (not LABELS or any(word in label for word in LABELS)):
            out[label] = cfg
    return out, why


LABELS = []  # --labels: only the alternatives whose label contains one of these (the rule and appendix always)


def check_jobs():
    """[(problem, {label: cfg}, "")] of CHECKED: the rule, the appendix, every schedule below on two of them."""
    from sections.hopper import attention_ws

    schedules = {"pipe 64x128 x2": P(64, 128, blocks_per_sm=2), "pipe 192x128": P(192, 128)}
    for i, dims in enumerate(CHECKED):
        for causal in (False, True):
            problem = plans.Problem(*dims[:4], causal, *dims[4:])
            cands = {"rule": plans.choose_config(problem, "hopper", HOPPER_SMEM, SMS)[0]}
            if (appendix := attention_ws.choose_config(problem, "hopper", HOPPER_SMEM, SMS)) is not None:
                cands["appendix"] = appendix
            if i in (0, 3) and not causal:
                cands.update(schedules)
                if problem.dim == 64:  # three blocks an SM: head dim 64 only (at 128 the registers run out)
                    cands["pipe 64x64 x3"] = P(64, 64, blocks_per_sm=3)
            if causal:  # the persistent walk's pairs of query tiles, at every odd length
                cands.update({"persistent 128x128": PW(128, 128, 1), "persistent 64x64 x2": PW(64, 64, 2)})
            cands["pwalk async 128x128"] = dict(PW(128, 128, 1), kind="persistent_async")
            yield problem, cands, ""


def jobs():
    """[(problem, {label: cfg}, why)] in priority order."""
    for dims, dtype in PROBLEMS:
        for causal in (False, True):
            problem = plans.from_shape(dims, causal, dtype)
            cands, why = candidates(problem)
            yield problem, cands, why


def build(problem, cfg):
    from sections import flash_attention as FA

    return FA.build(problem, {k: v for k, v in cfg.items() if k != "no_ws"})


def compile_one(problem, cfg):
    """cfg["no_ws"] (a probe-only key): compiled without warp specialization (every thread issues cp.async;
    registers as needed, so more blocks can share an SM)."""
    import tilelang

    from sections import flash_attention as FA

    no_ws = {tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True} if cfg.get("no_ws") else {}
    configs = {**FA.pass_configs(cfg), **no_ws}
    return tilelang.compile(build(problem, cfg), out_idx=None, target="cuda", pass_configs=configs)


def _worker(problem, label, cfg):
    t = time.time()
    try:
        compile_one(problem, cfg)
        return None, time.time() - t
    except Exception as exc:
        return " ".join(str(exc).split())[:300], time.time() - t


def log(*a):
    print(*a, flush=True)


WATCHDOG_S = 90  # compiling, loading and checking one problem's kernels takes seconds: this is a hang


def hang(name):
    log(f"HANG? {name} did not finish its checks within {WATCHDOG_S} s; exiting")
    os._exit(3)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--budget", type=float, default=165.0, help="seconds from start; the rest is skipped")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1))
    ap.add_argument("--filter", default="", help="problems whose name contains one of these, split by |")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--checks-first", action="store_true", help="the correctness-only problems before the timed")
    ap.add_argument("--labels", default="", help="alternatives whose label contains one of these, split by |")
    args = ap.parse_args(argv)
    LABELS[:] = [word for word in args.labels.split("|") if word]
    timed = [(p, c, w) for p, c, w in jobs() if any(f in p.name for f in args.filter.split("|"))]
    checked = [(p, c, w) for p, c, w in check_jobs() if any(f in p.name for f in args.filter.split("|"))]
    work = checked + timed if args.checks_first else timed + checked
    only_checked = {id(item) for item in checked}
    if args.list:
        for p, c, w in work:
            log(p.name, "|", w)
            for label, cfg in c.items():
                log("   ", label, plans.describe(cfg))
        log(sum(len(c) for _, c, _ in work), "kernels")
        return
    pool = cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=multiprocessing.get_context("spawn"))
    futures = [[(label, cfg, pool.submit(_worker, p, label, cfg)) for label, cfg in c.items()] for p, c, _ in work]
    log(f"submitted {sum(len(f) for f in futures)} compiles to {args.workers} workers")

    import torch

    import tourkit
    from sections import flash_attention as FA
    from sections.hopper import attention_ws

    results, rows = [], []
    for item, futs in zip(work, futures):
        problem, cands, why = item
        if time.time() - START > args.budget:
            log(f"budget spent: skipping {problem.name} and after")
            break
        watchdog = threading.Timer(WATCHDOG_S, hang, args=(problem.name,))
        watchdog.start()
        ok = {}
        for label, cfg, fut in futs:
            err, secs = fut.result()
            if err:
                log(f"  COMPILE FAILED {problem.name} {label}: {err}")
                results.append(dict(problem=problem.name, label=label, error=err))
                continue
            try:
                ok[label] = attention_ws.launcher(compile_one(problem, cfg))
            except Exception as exc:
                log(f"  LOAD FAILED {problem.name} {label}: {tourkit.one_line(exc)}")
        try:
            checks = FA.check_attention(problem, ok)
        except Exception as exc:
            log(f"  CHECK CRASHED {problem.name}: {tourkit.one_line(exc)}")
            break  # a fault leaves the context unusable
        good = {}
        for (label, fn), check in zip(ok.items(), checks):
            if check.passed:
                good[label] = fn
            else:
                log(f"  WRONG {check.line()}")
                results.append(dict(problem=problem.name, label=label, error=check.line()))
        watchdog.cancel()
        if id(item) in only_checked:
            log(f"checked {problem.name}: {', '.join(good)} ok")
            continue
        if not good:
            continue
        q, k, v, o = FA.make_inputs(problem)
        contenders = {label: (lambda fn=fn: fn(q, k, v, o)) for label, fn in good.items()}
        baselines = FA.sdpa_contenders(problem, q, k, v)
        times = tourkit.bench_interleaved({**contenders, **baselines}, rounds=ROUNDS, settle_ms=200.0, warmup_ms=10.0,
                                          rep_ms=40.0)
        sdpa_name = min(baselines, key=times.get)
        sdpa = times[sdpa_name]
        ratios = {label: sdpa / times[label] for label in good}
        best = max(ratios, key=ratios.get)
        line = "  ".join(f"{label}={ratios[label]:.3f}" for label in good)
        sdpas = " ".join(f"{b} {times[b]:.4f} ms" for b in baselines)
        log(f"{problem.name}: {sdpas} | {line} | best {best} | rule: {why}")
        for label in good:
            results.append(dict(problem=problem.name, label=label, cfg=cands[label], ms=times[label], sdpa_ms=sdpa,
                                sdpa_kind=sdpa_name, ratio=ratios[label],
                                tflops=tourkit.tflops(problem.flops, times[label])))
        others = {lb: r for lb, r in ratios.items() if lb not in ("rule", "appendix")}
        best_other = max(others, key=others.get) if others else "-"
        rows.append([problem.name, f"{sdpa:.3f}", f"{ratios.get('rule', 0):.3f}",
                     f"{ratios['appendix']:.3f}" if "appendix" in ratios else "-",
                     f"{best_other} {others[best_other]:.3f}" if others else "-",
                     " ".join(map(str, plans.describe(cands["rule"])))])
        del q, k, v, o
        torch.cuda.empty_cache()
    pool.shutdown(cancel_futures=True)
    log(tourkit.format_table(["problem", "sdpa ms", "rule", "appendix", "best alternative", "rule's config"], rows))
    log(f"total {time.time() - START:.0f} s")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "shapes_probe.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(0), torch=torch.__version__, results=results), fh, indent=1,
                  default=str)


if __name__ == "__main__":
    main()
