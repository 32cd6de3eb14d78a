"""Probe: the lesson's persistent attention walk (sections/attention_persistent.py) against the rule's pick.

For full-attention problems of many short walks, times in turns with SDPA: the rule's configuration, the
appendix, and the persistent walk with 128x128 and 128x64 tiles (one block an SM), each checked first against a
float32 reference. The rule takes the persistent walk itself where it applies; "rule" then shows the same kernel.

    python bench/attention_persistent_probe.py [--filter TEXT] [--budget SECONDS]
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from sections import attention_plans as plans  # noqa: E402

HOPPER_SMEM = 232448
# Short walks (2 to 8 key tiles) at both head dims, ragged and grouped-query; then longer walks and a problem
# under one round of tiles, where the rule keeps the grid.
PROBLEMS = [(8, 32, 512, 128), (4, 32, 1024, 128), (32, 16, 256, 128), (16, 16, 1024, 64), (64, 8, 256, 64),
            (2, 16, 1000, 128), (6, 24, 300, 128, 4), (8, 20, 1000, 64), (4, 16, 2048, 64), (3, 5, 333, 128),
            (1, 32, 4096, 128, 8)]


def variants(sms: int) -> dict:
    base = dict(kind="persistent", num_stages=2, threads=256, workers=sms, fast_math=True)
    return {"persistent 128x128": dict(base, block_M=128, block_N=128),
            "persistent 128x64": dict(base, block_M=128, block_N=64)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--filter", default="")
    ap.add_argument("--budget", type=float, default=300.0)
    args = ap.parse_args(argv)
    import tilelang
    import torch

    import tourkit
    from sections import flash_attention as FA
    from sections.hopper import attention_ws

    def compile_cfg(problem, cfg):
        func = FA.build(problem, cfg)
        kernel = tilelang.compile(func, out_idx=None, target="cuda", pass_configs=FA.pass_configs(cfg))
        return attention_ws.launcher(kernel)

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    start = time.time()
    for dims in PROBLEMS:
        problem = plans.from_shape(dims, False)
        if not any(f in problem.name for f in args.filter.split("|")):
            continue
        if time.time() - start > args.budget:
            print("budget spent: skipping", problem.name, flush=True)
            continue
        rule, why = plans.choose_config(problem, "hopper", HOPPER_SMEM, sms)
        cfgs = {"rule": rule, "appendix": attention_ws.choose_config(problem, "hopper", HOPPER_SMEM, sms),
                **{k: v for k, v in variants(sms).items() if v != rule}}
        fns = {label: compile_cfg(problem, cfg) for label, cfg in cfgs.items() if cfg is not None}
        checks = FA.check_attention(problem, fns)
        good = {label: fn for (label, fn), check in zip(fns.items(), checks) if check.passed}
        for check in checks:
            if not check.passed:
                print("  WRONG", check.line(), flush=True)
        q, k, v, o = FA.make_inputs(problem)
        contenders = {label: (lambda fn=fn: fn(q, k, v, o)) for label, fn in good.items()}
        baselines = FA.sdpa_contenders(problem, q, k, v)
        times = tourkit.bench_interleaved({**contenders, **baselines}, rounds=4, settle_ms=200.0, warmup_ms=10.0,
                                          rep_ms=40.0)
        sdpa = min(times[b] for b in baselines)
        cells = "  ".join(f"{label}={sdpa / times[label]:.3f}" for label in good)
        print(f"{problem.name}: sdpa {sdpa:.4f} ms | {cells} | rule: {plans.describe(rule)}", flush=True)


if __name__ == "__main__":
    main()
