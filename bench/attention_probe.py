"""Probe for the softmax and flash_attention sections: validate every kernel variant and time it against the
PyTorch path (torch.softmax, SDPA) and a device copy measured in the same run, on the H200 target shapes.

    python bench/attention_probe.py [--out DIR] [--quick] [--compile-only ARCH] [--preset next] [--filter TEXT]
    (on a GPU machine with many cores: python bench/attention_probe.py --out DIR --workers 15)

All kernels are compiled first in parallel worker processes (which fill TileLang's on-disk kernel cache),
then the main process loads them from the cache, validates and times them. A failing variant is reported
and skipped, never fatal. Prints a compact table per kernel family and writes probe.json to --out.
"""

import argparse
import concurrent.futures as cf
import json
import os
import sys
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

FA_SHAPES = [(4, 32, 4096, 128), (1, 32, 16384, 128)]
ROUNDS = [3]  # turns per contender in bench_interleaved (a preset may ask for more)
SOFTMAX_SHAPES = [(32768, 4096), (16384, 8192), (8192, 32768), (4096, 1823)]


def log(*a):
    print(*a, flush=True)


WATCHDOG_S = 60  # loading, validating and re-running one kernel takes seconds; a minute means a hang


def _deadlock(key):
    log(f"DEADLOCK? {key} did not finish within {WATCHDOG_S} s; exiting")
    os._exit(3)


# ---------------------------------------------------------------------------------------------------------
# What to build: (key, module, builder name, args, kwargs)
# ---------------------------------------------------------------------------------------------------------

def softmax_jobs(quick=False):
    v = []
    for (M, N) in SOFTMAX_SHAPES:
        if N == 4096:
            v += [("reg", 1, 256), ("reg", 1, 512), ("reg", 2, 512), ("staged", 1, 256), ("staged", 2, 256),
                  ("staged", 4, 512)]
        elif N == 8192:
            v += [("reg", 1, 512), ("reg", 1, 1024), ("staged", 1, 512), ("staged", 1, 1024)]
        elif N == 32768:
            v += [("reg", 1, 1024), ("staged", 1, 1024), ("online", 4096, 512), ("online", 8192, 1024),
                  ("online", 2048, 256), ("online", 4096, 256), ("online", 8192, 512),
                  ("thread", 0, 256), ("thread", 0, 512), ("thread", 0, 1024)]
        else:
            # (a persistent pipelined variant failed validation and was removed)
            v += [("staged", 8, 256), ("staged", 16, 512), ("staged", 8, 128), ("reg", 2, 256)]
        for kind, p, t in v:
            builder = {"reg": "rows_in_registers", "staged": "rows_staged_in_shared", "online": "long_rows_online",
                       "thread": "long_rows_thread_online"}[kind]
            key = f"softmax {M}x{N} {kind} {'chunk' if kind == 'online' else 'R'}={p} T={t}"
            args = (M, N, t) if kind == "thread" else (M, N, p, t)
            yield dict(key=key, module="sections.softmax", builder=builder, args=args, kwargs={},
                       family="softmax", shape=(M, N), kind=kind)
        v = []
    # odd row counts and widths: correctness only
    for (M, N, kind, p, t) in [(1001, 1823, "reg", 2, 256), (1000, 1823, "staged", 8, 256), (999, 4096, "reg", 1, 256),
                               (37, 32768, "online", 4096, 512), (64, 8192, "staged", 1, 512),
                               (37, 32768, "thread", 0, 512), (5, 65536, "thread", 0, 1024)]:
        builder = {"reg": "rows_in_registers", "staged": "rows_staged_in_shared", "online": "long_rows_online",
                   "thread": "long_rows_thread_online"}[kind]
        args = (M, N, t) if kind == "thread" else (M, N, p, t)
        yield dict(key=f"softmax-odd {M}x{N} {kind} {p} {t}", module="sections.softmax", builder=builder,
                   args=args, kwargs={}, family="softmax-odd", shape=(M, N), kind=kind)


FA_CONFIGS = [
    # name, builder, kwargs
    ("128x128 s2 t256", "flash_attention_forward", dict(block_M=128, block_N=128, num_stages=2, threads=256)),
    ("128x128 s1 t256", "flash_attention_forward", dict(block_M=128, block_N=128, num_stages=1, threads=256)),
    ("128x64 s2 t256", "flash_attention_forward", dict(block_M=128, block_N=64, num_stages=2, threads=256)),
    ("192x128 s2 t384", "flash_attention_forward", dict(block_M=192, block_N=128, num_stages=2, threads=384)),
    ("async 128x128 s2", "flash_attention_forward_async", dict(block_M=128, block_N=128, num_stages=2, threads=256)),
    ("async 128x128 s1", "flash_attention_forward_async", dict(block_M=128, block_N=128, num_stages=1, threads=256)),
    ("async 128x64 s2", "flash_attention_forward_async", dict(block_M=128, block_N=64, num_stages=2, threads=256)),
    ("async 128x64 s3", "flash_attention_forward_async", dict(block_M=128, block_N=64, num_stages=3, threads=256)),
    # nvcc --use_fast_math (TileLang's TL_ENABLE_FAST_MATH): exp2f becomes a bare ex2.approx.ftz
    ("128x128 s2 t256 fm", "flash_attention_forward", dict(block_M=128, block_N=128, num_stages=2, threads=256,
                                                           fast_math=True)),
    ("128x128 s1 t256 fm", "flash_attention_forward", dict(block_M=128, block_N=128, num_stages=1, threads=256,
                                                           fast_math=True)),
    ("192x128 s2 t384 fm", "flash_attention_forward", dict(block_M=192, block_N=128, num_stages=2, threads=384,
                                                           fast_math=True)),
    ("async 128x128 s2 fm", "flash_attention_forward_async", dict(block_M=128, block_N=128, num_stages=2,
                                                                  threads=256, fast_math=True)),
    # heaviest (last) query blocks launched first: matters for causal only
    ("128x128 s2 t256 fm hf", "flash_attention_forward", dict(block_M=128, block_N=128, num_stages=2, threads=256,
                                                              fast_math=True, heavy_first=True)),
    ("async 128x128 s2 fm hf", "flash_attention_forward_async", dict(block_M=128, block_N=128, num_stages=2,
                                                                     threads=256, fast_math=True, heavy_first=True)),
    ("async 128x128 s2 hf", "flash_attention_forward_async", dict(block_M=128, block_N=128, num_stages=2,
                                                                  threads=256, heavy_first=True)),
    # wider key tiles (FlashAttention-3 uses 128x176 for non-causal head dim 128): fewer, longer iterations;
    # 2 stages of 176-wide K and V tiles still fit 227 KiB
    ("128x176 s2 t256", "flash_attention_forward", dict(block_M=128, block_N=176, num_stages=2, threads=256)),
    ("128x176 s2 t256 fm", "flash_attention_forward", dict(block_M=128, block_N=176, num_stages=2, threads=256,
                                                           fast_math=True)),
    ("128x160 s2 t256", "flash_attention_forward", dict(block_M=128, block_N=160, num_stages=2, threads=256)),
    ("128x192 s1 t256", "flash_attention_forward", dict(block_M=128, block_N=192, num_stages=1, threads=256)),
    ("async 128x176 s2 fm", "flash_attention_forward_async", dict(block_M=128, block_N=176, num_stages=2,
                                                                  threads=256, fast_math=True)),
    ("async 128x176 s2", "flash_attention_forward_async", dict(block_M=128, block_N=176, num_stages=2,
                                                               threads=256)),
    ("async 128x176 s2 fm hf", "flash_attention_forward_async", dict(block_M=128, block_N=176, num_stages=2,
                                                                     threads=256, fast_math=True, heavy_first=True)),
    ("128x176 s2 t256 fm hf", "flash_attention_forward", dict(block_M=128, block_N=176, num_stages=2, threads=256,
                                                              fast_math=True, heavy_first=True)),
    ("async 128x192 s2 fm", "flash_attention_forward_async", dict(block_M=128, block_N=192, num_stages=2,
                                                                  threads=256, fast_math=True)),
    # warp specialization by hand (flash_attention_forward_ws): no extra iteration; persistent: one block per SM
    ("ws 128x176 s2 fm", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2, fast_math=True)),
    ("ws 128x176 s2 fm persistent", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2,
                                                                       fast_math=True, persistent=True)),
    ("ws 128x192 s2 fm", "flash_attention_forward_ws", dict(block_M=128, block_N=192, num_stages=2, fast_math=True)),
    ("ws 128x128 s2 fm", "flash_attention_forward_ws", dict(block_M=128, block_N=128, num_stages=2, fast_math=True)),
    ("ws 128x128 s2 fm hf", "flash_attention_forward_ws", dict(block_M=128, block_N=128, num_stages=2, fast_math=True,
                                                               heavy_first=True)),
    ("ws 128x128 s2 fm hf persistent", "flash_attention_forward_ws", dict(block_M=128, block_N=128, num_stages=2,
                                                                          fast_math=True, heavy_first=True,
                                                                          persistent=True)),
    ("ws 128x176 s2 fm hf", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2, fast_math=True,
                                                               heavy_first=True)),
    # O staged through the Q buffer and stored by TMA; persistent with two Q buffers (160-wide tiles fit)
    ("ws 128x192 s2 fm st", "flash_attention_forward_ws", dict(block_M=128, block_N=192, num_stages=2, fast_math=True,
                                                               stage_output=True)),
    ("ws 128x176 s2 fm st", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2, fast_math=True,
                                                               stage_output=True)),
    ("ws 128x192 s2 fm persistent", "flash_attention_forward_ws", dict(block_M=128, block_N=192, num_stages=2,
                                                                       fast_math=True, persistent=True)),
    ("ws 128x160 s2 fm persistent st q2", "flash_attention_forward_ws", dict(block_M=128, block_N=160, num_stages=2,
                                                                             fast_math=True, persistent=True,
                                                                             stage_output=True, q_stages=2)),
    # the default with the last partial wave's tiles split along the keys over the idle blocks (full attention
    # only; the kernel also takes a workspace and flags: SplitTailMemory)
    ("ws 128x160 s2 fm persistent st q2 split", "flash_attention_forward_ws", dict(
        block_M=128, block_N=160, num_stages=2, fast_math=True, persistent=True, stage_output=True, q_stages=2,
        split_tail=True)),
    ("ws 128x128 s2 fm persistent st q2", "flash_attention_forward_ws", dict(block_M=128, block_N=128, num_stages=2,
                                                                             fast_math=True, persistent=True,
                                                                             stage_output=True, q_stages=2)),
    ("ws 128x128 s2 fm hf st", "flash_attention_forward_ws", dict(block_M=128, block_N=128, num_stages=2,
                                                                  fast_math=True, heavy_first=True, stage_output=True)),
    ("ws 128x176 s2 fm hf st", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2,
                                                                  fast_math=True, heavy_first=True, stage_output=True)),
    # causal on a persistent grid: tiles paired (query blocks p and n-1-p) so every block gets the same work
    ("ws 128x176 s2 fm persistent st", "flash_attention_forward_ws", dict(block_M=128, block_N=176, num_stages=2,
                                                                          fast_math=True, persistent=True,
                                                                          stage_output=True)),
    ("ws 128x160 s2 fm hf st", "flash_attention_forward_ws", dict(block_M=128, block_N=160, num_stages=2,
                                                                  fast_math=True, heavy_first=True, stage_output=True)),
    ("ws 128x192 s2 fm hf st", "flash_attention_forward_ws", dict(block_M=128, block_N=192, num_stages=2,
                                                                  fast_math=True, heavy_first=True, stage_output=True)),
    ("ws 128x160 s2 fm persistent", "flash_attention_forward_ws", dict(block_M=128, block_N=160, num_stages=2,
                                                                       fast_math=True, persistent=True)),
    ("ws 128x144 s2 fm persistent st q2", "flash_attention_forward_ws", dict(block_M=128, block_N=144, num_stages=2,
                                                                             fast_math=True, persistent=True,
                                                                             stage_output=True, q_stages=2)),
]


def fa_module(builder):
    """The lesson builds the pipelined and async kernels, the Hopper appendix the hand-written one."""
    return "sections.hopper.attention_ws" if builder == "flash_attention_forward_ws" else "sections.flash_attention"


def fa_jobs(quick=False):
    shapes = [(1, 8, 1024, 128)] if quick else FA_SHAPES
    for (B, H, S, D) in shapes:
        for causal in (False, True):
            for name, builder, kw in FA_CONFIGS:
                if (kw.get("heavy_first") and not causal) or (kw.get("split_tail") and causal):
                    continue
                yield dict(key=f"fa B{B} S{S} D{D} {'causal' if causal else 'full'} {name}",
                           module=fa_module(builder), builder=builder, args=(B, H, S, D, causal), kwargs=kw,
                           family="fa", shape=(B, H, S, D), causal=causal, config=name)
    # odd lengths and head dim 64: correctness only (two configurations)
    for (B, H, S, D) in [(2, 4, 1000, 64), (1, 3, 777, 128), (2, 4, 1024, 64)]:
        for causal in (False, True):
            for name, builder, kw in (FA_CONFIGS[0], FA_CONFIGS[3], FA_CONFIGS[4], FA_CONFIGS[6], FA_CONFIGS[-2]):
                yield odd_job(B, H, S, D, causal, name, builder, kw)
    yield from split_odd_jobs()


def odd_job(B, H, S, D, causal, name, builder, kw):
    return dict(key=f"fa-odd B{B} H{H} S{S} D{D} {'causal' if causal else 'full'} {name}",
                module=fa_module(builder), builder=builder, args=(B, H, S, D, causal),
                kwargs=kw, family="fa-odd", shape=(B, H, S, D), causal=causal, config=name)


# Odd problems for split_tail, on 132 SMs (full attention; n_work = query tiles · heads · batch):
# B1 H3 S777 D128 and B2 H4 S1024 D64: fewer tiles than SMs (no tail: the plain body with the extra tensors);
# B1 H17 S1000 D128: 136 tiles, R=4, P=3, the ragged last key tile in a contributor's piece, the ragged last
# query tile (rows past the end) split; B1 H6 S3000 D128: 144 tiles, R=12, P=9, both ragged; B1 H32 S1000 D128:
# 256 tiles, R=124, P=1 (no split).
SPLIT_ODD_SHAPES = [(1, 3, 777, 128), (2, 4, 1024, 64), (1, 17, 1000, 128), (1, 6, 3000, 128), (1, 32, 1000, 128)]
SPLIT_DEFAULT = "ws 128x160 s2 fm persistent st q2"  # the section's full-attention kernel (head dim 128) without split_tail


def split_odd_jobs():
    """The default and its split variant on SPLIT_ODD_SHAPES (full attention): correctness only."""
    configs = {name: (name, builder, kw) for name, builder, kw in FA_CONFIGS}
    for (B, H, S, D) in SPLIT_ODD_SHAPES:
        for name in (SPLIT_DEFAULT, SPLIT_DEFAULT + " split"):
            yield odd_job(B, H, S, D, False, *configs[name])


def build(job):
    import importlib

    mod = importlib.import_module(job["module"])
    kwargs = {k: v for k, v in job["kwargs"].items() if k != "fast_math"}
    return getattr(mod, job["builder"])(*job["args"], **kwargs)


def job_pass_configs(job):
    return {"tl.enable_fast_math": True} if job["kwargs"].get("fast_math") else {}


def compile_job(job, target="cuda"):
    """The kernel, launched as kern(q, k, v, o); a split_tail kernel (more tensors after O: Workspace_O,
    Workspace_ML, Flags) comes wrapped in SplitTailMemory, which owns them."""
    import tilelang

    func = build(job)
    if target.startswith("sm_"):  # no GPU here: compile for a named arch
        import tourkit

        kernel = tourkit.compile_for_arch(func, target, pass_configs=job_pass_configs(job))
    else:
        kernel = tilelang.compile(func, out_idx=None, target=target, pass_configs=job_pass_configs(job))
    if len(func.params) == 4:
        return kernel
    from sections.hopper.attention_ws import SplitTailMemory

    return SplitTailMemory(kernel)


def _worker(job, target):
    t = time.time()
    try:
        compile_job(job, target)
        return job["key"], None, time.time() - t
    except Exception as exc:
        return job["key"], " ".join(str(exc).split())[:300], time.time() - t


def precompile(jobs, target, workers):
    errors = {}
    t0 = time.time()
    ctx = __import__("multiprocessing").get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futs = [pool.submit(_worker, j, target) for j in jobs]
        for f in cf.as_completed(futs):
            try:
                key, err, secs = f.result()
            except Exception as exc:  # a worker died
                log(f"  worker failed: {exc}")
                continue
            if err:
                errors[key] = err
                log(f"  compile FAILED {key}: {err}")
    log(f"precompiled {len(jobs)} kernels in {time.time() - t0:.1f} s with {workers} workers, {len(errors)} failed")
    return errors


# ---------------------------------------------------------------------------------------------------------
# Softmax
# ---------------------------------------------------------------------------------------------------------

def run_softmax(jobs, errors, results):
    import torch
    import tourkit

    copy = tourkit.device_copy_gbps()
    log(f"device copy: {copy:.0f} GB/s")
    results["copy_gbps"] = copy
    torch_ms = {}
    rows = []
    by_shape = {}
    for job in jobs:
        M, N = job["shape"]
        key = job["key"]
        rec = dict(key=key, shape=[M, N], kind=job["kind"], args=list(job["args"]))
        if key in errors:
            rec["error"] = "compile: " + errors[key]
            results["softmax"].append(rec)
            rows.append([key, "-", "-", "-", "-", rec["error"][:60]])
            continue
        try:
            kernel = compile_job(job)
            x = tourkit.random_tensor((M, N), torch.float16, scale=3.0)
            y = torch.empty_like(x)
            flat = job["kind"] == "staged"
            launch = (lambda: kernel(x.view(-1), y.view(-1))) if flat else (lambda: kernel(x, y))
            ref = torch.softmax(x.float(), dim=-1)
            check = tourkit.validate(key, launch, y, ref, 1e-2)
            torch_err = tourkit.relative_error(torch.softmax(x, dim=-1), ref)
            rec.update(rel_error=check.rel_error, torch_rel_error=torch_err, ok=check.passed)
            if job["family"] == "softmax" and check.passed:
                ms = tourkit.bench_ms(launch)
                if (M, N) not in torch_ms:
                    torch_ms[(M, N)] = tourkit.bench_ms(lambda: torch.softmax(x, dim=-1))
                nbytes = 2 * M * N * 2
                rec.update(ms=ms, gbps=tourkit.gbps(nbytes, ms), torch_ms=torch_ms[(M, N)],
                           torch_gbps=tourkit.gbps(nbytes, torch_ms[(M, N)]))
                rec["of_copy"] = rec["gbps"] / copy
                rec["vs_torch"] = torch_ms[(M, N)] / ms
                by_shape.setdefault((M, N), []).append(rec)
                rows.append([key, f"{check.rel_error:.1e}", f"{ms:.3f}", f"{rec['gbps']:.0f}",
                             f"{rec['of_copy']*100:.0f}%", f"torch {rec['torch_gbps']:.0f} GB/s x{rec['vs_torch']:.2f}"])
            else:
                rows.append([key, f"{check.rel_error:.1e}", "-", "-", "-", "ok" if check.passed else "FAILED"])
            del x, y, ref
        except Exception as exc:
            rec["error"] = tourkit.one_line(exc)
            rows.append([key, "-", "-", "-", "-", rec["error"][:80]])
            traceback.print_exc()
        results["softmax"].append(rec)
        log("  " + " | ".join(rows[-1]))
    log(tourkit.format_table(["softmax variant", "rel err", "ms", "GB/s", "of copy", "torch"], rows))
    for shape, recs in by_shape.items():
        best = max(recs, key=lambda r: r["gbps"])
        log(f"BEST softmax {shape[0]}x{shape[1]}: {best['key']} {best['gbps']:.0f} GB/s = {best['of_copy']*100:.0f}% of copy, "
            f"{best['vs_torch']:.2f}x torch ({best['torch_gbps']:.0f} GB/s)")


# ---------------------------------------------------------------------------------------------------------
# FlashAttention
# ---------------------------------------------------------------------------------------------------------

def sdpa_bshd(q, k, v, causal):
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def run_fa(jobs, errors, results):
    import torch
    import torch.nn.functional as F
    import tourkit

    groups = {}
    for job in jobs:
        groups.setdefault((job["family"], job["shape"], job["causal"]), []).append(job)
    rows = []
    for (family, (B, H, S, D), causal), group in groups.items():
        q, k, v = (tourkit.random_tensor((B, S, H, D), torch.float16) for _ in range(3))
        ref = sdpa_bshd(q.float(), k.float(), v.float(), causal)
        torch_out = sdpa_bshd(q, k, v, causal)
        torch_err = tourkit.relative_error(torch_out, ref)
        del torch_out
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        o = torch.empty_like(q)
        timed = {}  # key -> (launch, record); timed together with SDPA, taking turns, after validation
        for job in group:
            key = job["key"]
            rec = dict(key=key, shape=[B, H, S, D], causal=causal, config=job["config"], torch_rel_error=torch_err)
            results["fa"].append(rec)
            if key in errors:
                rec["error"] = "compile: " + errors[key]
                log(f"  {key}: {rec['error'][:200]}")
                continue
            # A kernel whose barriers never complete hangs the GPU: give up on the whole probe, loudly.
            watchdog = threading.Timer(WATCHDOG_S, _deadlock, args=(key,))
            watchdog.start()
            try:
                kernel = compile_job(job)
                launch = (lambda kern: lambda: kern(q, k, v, o))(kernel)
                tol = max(2.0 * torch_err, 1e-4)
                check = tourkit.validate(key, launch, o, ref, tol)
                rec.update(rel_error=check.rel_error, ok=check.passed, tolerance=tol)
                # the same inputs twice must give the same result (races show here)
                o2 = o.clone()
                launch()
                torch.cuda.synchronize()
                rec["repeatable"] = bool(torch.equal(o, o2))
                del o2
                flags_note = ""
                if hasattr(kernel, "flags_left"):  # SplitTailMemory  # every flag reset by the finisher that consumed it
                    rec["flags_left"] = kernel.flags_left()
                    flags_note = f" flags left {rec['flags_left']}" + (" FAILED" if rec["flags_left"] else "")
                    rec["ok"] = rec["ok"] and rec["flags_left"] == 0
                log(f"  {key}: err {check.rel_error:.2e} (torch {torch_err:.2e}) "
                    f"{'ok' if check.passed else 'FAILED'}{'' if rec['repeatable'] else ' NOT REPEATABLE'}"
                    f"{flags_note}")
                if family == "fa" and rec["ok"]:
                    timed[key] = (launch, rec)
            except Exception as exc:
                rec["error"] = tourkit.one_line(exc)
                log(f"  {key}: {rec['error'][:200]}")
                traceback.print_exc()
            finally:
                watchdog.cancel()
        if timed:
            qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            contenders = {"sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)}
            contenders.update({key: launch for key, (launch, _) in timed.items()})
            ms = tourkit.bench_interleaved(contenders, rounds=ROUNDS[0])
            sdpa_ms = ms.pop("sdpa")
            del qh, kh, vh
            log(f"SDPA B{B} H{H} S{S} D{D} {'causal' if causal else 'full'}: {sdpa_ms:.3f} ms "
                f"{tourkit.tflops(flops, sdpa_ms):.0f} TFLOP/s (timed in turns with the kernels below)")
            results["sdpa"].append(dict(shape=[B, H, S, D], causal=causal, ms=sdpa_ms,
                                        tflops=tourkit.tflops(flops, sdpa_ms), torch_rel_error=torch_err))
            for key, (_, rec) in timed.items():
                rec.update(ms=ms[key], tflops=tourkit.tflops(flops, ms[key]), sdpa_ms=sdpa_ms,
                           vs_sdpa=sdpa_ms / ms[key])
                rows.append([key, f"{rec['rel_error']:.2e}/{torch_err:.2e}", f"{ms[key]:.3f}",
                             f"{rec['tflops']:.0f}", f"x{rec['vs_sdpa']:.3f}",
                             "repeatable" if rec["repeatable"] else "NOT REPEATABLE"])
        del q, k, v, o, ref
        torch.cuda.empty_cache()
    log(tourkit.format_table(["flash attention", "err/torch err", "ms", "TFLOP/s", "vs SDPA", "note"], rows))
    best = {}
    for rec in results["fa"]:
        if "vs_sdpa" in rec:
            k = (tuple(rec["shape"]), rec["causal"])
            if k not in best or rec["vs_sdpa"] > best[k]["vs_sdpa"]:
                best[k] = rec
    for (shape, causal), rec in best.items():
        log(f"BEST fa {shape} {'causal' if causal else 'full'}: {rec['config']} {rec['tflops']:.0f} TFLOP/s "
            f"x{rec['vs_sdpa']:.3f} SDPA")


def run_memory(results, jobs_by_config):
    """Peak memory: naive attention (scores materialized) vs the kernel, B=1 H=32 S=16384 D=128, measured by
    the section's own peak_memory."""
    import tourkit
    from sections.flash_attention import peak_memory

    B, H, S, D = 1, 32, 16384, 128
    job = jobs_by_config
    if job is None:
        return
    kernel = compile_job(job)
    from sections.attention_plans import Problem

    naive_peak, fa_peak = peak_memory(Problem(B, H, S, D, False), kernel)
    results["memory"] = dict(shape=[B, H, S, D], naive_peak_bytes=naive_peak, kernel_peak_bytes=fa_peak)
    log(f"memory B{B} H{H} S{S} D{D}: naive attention peak {tourkit.format_bytes(naive_peak)} above inputs, "
        f"flash kernel peak {tourkit.format_bytes(fa_peak)}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--compile-only", metavar="ARCH")
    ap.add_argument("--workers", type=int, default=min(14, os.cpu_count() or 2))
    ap.add_argument("--only", choices=["softmax", "fa"], default=None)
    ap.add_argument("--precompile-only", metavar="TARGET", help="test the parallel compile path (no GPU), "
                    "e.g. sm_90a")
    ap.add_argument("--preset", choices=["next", "wide", "ws", "ws2", "ws3", "split"],
                    default=None,
                    help="next: the follow-up set; wide: 176/160/192-wide key tiles against the defaults; "
                         "ws, ws2, ws3: hand-written "
                         "warp specialization (see code); split: the full-attention default with and without split_tail")
    ap.add_argument("--filter", default="", help="only jobs whose key contains this")
    ap.add_argument("--list", action="store_true", help="print the jobs' keys and stop")
    ap.add_argument("--limit", type=int, default=0, help="only the first N jobs of each family")
    args = ap.parse_args(argv)
    sm_jobs = list(softmax_jobs(args.quick)) if args.only in (None, "softmax") else []
    fa_j = list(fa_jobs(args.quick)) if args.only in (None, "fa") else []
    if args.preset == "next":
        # Fast math for FlashAttention against the pipelined and async kernels, and the long-row softmax
        # variants. About 30 kernels.
        keep_fa = ("128x128 s2 t256", "async 128x128 s2", "fm", "hf")
        fa_j = [j for j in fa_j if (j["family"] == "fa" and any(k in j["config"] for k in keep_fa))
                or (j["family"] == "fa-odd" and "hf" in j["config"])]
        sm_jobs = [j for j in sm_jobs if (j["family"] == "softmax" and j["shape"][1] in (32768, 1823))
                   or j["kind"] == "thread"]
    if args.preset == "wide":
        # Wider key tiles against the section's two defaults (128x128 s2 for full, async fm hf for causal);
        # the 4096x1823 softmax variants. Odd lengths validate the wide tiles (ragged last tile).
        full = ("128x128 s2 t256", "async 128x128 s2 fm", "128x176 s2 t256", "128x176 s2 t256 fm", "128x160 s2 t256",
                "128x192 s1 t256", "async 128x176 s2 fm", "async 128x176 s2")
        causal = ("async 128x128 s2 fm hf", "async 128x176 s2 fm hf", "async 128x176 s2 fm", "128x176 s2 t256 fm hf")
        fa_j = [j for j in fa_j if j["family"] == "fa" and j["config"] in (causal if j["causal"] else full)]
        fa_j += [dict(j, key=f"fa-odd B2 H4 S1000 D128 {'causal' if j['causal'] else 'full'} {j['config']}",
                      family="fa-odd", args=(2, 4, 1000, 128, j["causal"]), shape=(2, 4, 1000, 128))
                 for j in fa_j if j["shape"][2] == 4096 and "x128 " not in j["config"]]
        sm_jobs = [j for j in sm_jobs if j["shape"][1] == 1823]
    if args.preset == "ws":
        # Hand-written warp specialization (no extra iteration; persistent variants) against the section's
        # FA3-style kernels; odd lengths and head dim 64 validate every new kernel. Four turns each.
        full = ("async 128x176 s2 fm", "ws 128x176 s2 fm", "ws 128x176 s2 fm persistent", "ws 128x192 s2 fm",
                "ws 128x128 s2 fm")
        causal = ("async 128x128 s2 fm hf", "ws 128x128 s2 fm hf", "ws 128x128 s2 fm hf persistent",
                  "ws 128x176 s2 fm hf")
        fa_j = [j for j in fa_j if j["family"] == "fa" and j["config"] in (causal if j["causal"] else full)]
        fa_j += [dict(j, key=f"fa-odd B{b} H{h} S{n} D{d} {'causal' if j['causal'] else 'full'} {j['config']}",
                      family="fa-odd", args=(b, h, n, d, j["causal"]), shape=(b, h, n, d))
                 for j in fa_j if j["shape"][2] == 4096 and j["config"].startswith("ws")
                 for (b, h, n, d) in ((2, 4, 1000, 128), (1, 3, 777, 64), (2, 4, 1024, 64))]
        sm_jobs = []
        ROUNDS[0] = 4
    if args.preset == "ws2":
        # After --preset ws: the output
        # staged through the Q buffer and stored by TMA, persistent grids with two Q buffers, against the
        # first probe's leaders. Odd lengths validate the new kernels.
        full = ("async 128x176 s2 fm", "ws 128x192 s2 fm", "ws 128x176 s2 fm persistent", "ws 128x192 s2 fm st",
                "ws 128x176 s2 fm st", "ws 128x192 s2 fm persistent", "ws 128x160 s2 fm persistent st q2",
                "ws 128x128 s2 fm persistent st q2")
        causal = ("async 128x128 s2 fm hf", "ws 128x128 s2 fm hf", "ws 128x128 s2 fm hf st", "ws 128x176 s2 fm hf st")
        fa_j = [j for j in fa_j if j["family"] == "fa" and j["config"] in (causal if j["causal"] else full)]
        fa_j += [dict(j, key=f"fa-odd B{b} H{h} S{n} D{d} {'causal' if j['causal'] else 'full'} {j['config']}",
                      family="fa-odd", args=(b, h, n, d, j["causal"]), shape=(b, h, n, d))
                 for j in fa_j if j["shape"][2] == 4096 and (" st" in j["config"] or "192 s2 fm persistent" in j["config"])
                 for (b, h, n, d) in ((2, 4, 1000, 128), (1, 3, 777, 64))]
        sm_jobs = []
        ROUNDS[0] = 4
    if args.preset == "ws3":
        # After ws2: causal on persistent grids (paired tiles) and on 160/192-wide tiles; full attention around
        # the new default (160-wide, persistent, two Q buffers, O by TMA).
        full = ("ws 128x160 s2 fm persistent st q2", "ws 128x160 s2 fm persistent", "ws 128x144 s2 fm persistent st q2",
                "ws 128x176 s2 fm persistent", "ws 128x192 s2 fm st")
        causal = ("async 128x128 s2 fm hf", "ws 128x176 s2 fm hf st", "ws 128x176 s2 fm persistent st",
                  "ws 128x160 s2 fm persistent st q2", "ws 128x160 s2 fm hf st", "ws 128x192 s2 fm hf st")
        fa_j = [j for j in fa_j if j["family"] == "fa" and j["config"] in (causal if j["causal"] else full)]
        new = ("ws 128x176 s2 fm persistent st", "ws 128x160 s2 fm persistent st q2", "ws 128x160 s2 fm hf st",
               "ws 128x192 s2 fm hf st", "ws 128x160 s2 fm persistent", "ws 128x144 s2 fm persistent st q2")
        fa_j += [dict(j, key=f"fa-odd B{b} H{h} S{n} D{d} {'causal' if j['causal'] else 'full'} {j['config']}",
                      family="fa-odd", args=(b, h, n, d, j["causal"]), shape=(b, h, n, d))
                 for j in fa_j if j["shape"][2] == 4096 and j["config"] in new
                 for (b, h, n, d) in ((2, 4, 1000, 128), (1, 3, 777, 64))]
        sm_jobs = []
        ROUNDS[0] = 4
    if args.preset == "split":
        # split_tail: the last partial wave's tiles (B4 H32 S4096 and B1 H32 S16384: 4096 tiles, 31 waves of 132
        # and 4) cut along the keys over the idle blocks, against the same kernel without; full attention only.
        # The odd problems (split_odd_jobs) validate both, with and without a tail to split. Five turns each.
        keep = (SPLIT_DEFAULT, SPLIT_DEFAULT + " split")
        fa_j = [j for j in fa_j if not j["causal"] and j["config"] in keep
                and (j["family"] == "fa" or j["shape"] in SPLIT_ODD_SHAPES)]
        sm_jobs = []
        ROUNDS[0] = 5
    if args.filter:
        sm_jobs = [j for j in sm_jobs if args.filter in j["key"]]
        fa_j = [j for j in fa_j if args.filter in j["key"]]
    if args.limit:
        sm_jobs, fa_j = sm_jobs[:args.limit], fa_j[:args.limit]
    if args.list:
        for job in sm_jobs + fa_j:
            log(job["key"])
        return
    if args.precompile_only:
        precompile(sm_jobs + fa_j, args.precompile_only, args.workers)
        return
    if args.compile_only:
        import tourkit

        for job in sm_jobs + fa_j:
            t = time.time()
            try:
                rep = tourkit.inspect_kernel(job["key"], build(job), args.compile_only, nvcc=False)
                log(f"ok   {job['key']}  threads={rep.threads} smem={rep.smem_bytes} {time.time() - t:.1f}s")
            except Exception as exc:
                log(f"FAIL {job['key']}: {' '.join(str(exc).split())[:300]}")
        return
    import torch

    results = {"softmax": [], "fa": [], "sdpa": [], "device": torch.cuda.get_device_name(0),
               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}
    errors = precompile(sm_jobs + fa_j, "cuda", args.workers)
    t = time.time()
    if sm_jobs:
        run_softmax(sm_jobs, errors, results)
        log(f"softmax part: {time.time() - t:.1f} s")
    t = time.time()
    if fa_j:
        run_fa(fa_j, errors, results)
        log(f"fa part: {time.time() - t:.1f} s")
        try:
            run_memory(results, dict(key="mem", module="sections.flash_attention", builder="flash_attention_forward",
                                     args=(1, 32, 16384, 128, False), kwargs=FA_CONFIGS[0][2]))
        except Exception as exc:
            log(f"memory part failed: {exc}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
