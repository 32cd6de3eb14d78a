"""Run the tour on users' problems, one `--only S --shape X` at a time, and print each run's headline.

    python bench/shape_targets.py                 # every problem below
    python bench/shape_targets.py softmax gemm    # the problems of sections whose name contains a word
    python bench/shape_targets.py --out DIR       # keep each run's JSON record in DIR
    python bench/shape_targets.py --quick --problems gemm_schedules:1x4096x4096,softmax:3x77
    python bench/shape_targets.py --others --quick  # problems of other kinds, never tuned on
    python bench/shape_targets.py --random 5 --quick  # 5 random problems a section, a new seed each time

Each problem goes through the same command a user types (the worker process, the check, the benchmark in
turns with PyTorch), so what this prints is what a user sees. The list mixes the shapes the project is judged
on with others of the same kinds (skinny, ragged, tiny, wide, grouped-query).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBLEMS = [
    ("gemm_schedules", "4096x4096x1024", "float16"),
    ("gemm_schedules", "5120x13824x5120", "float16"),
    ("gemm_schedules", "8192x2048x8192", "float16"),
    ("gemm_schedules", "2000x3000x4000", "float16"),
    ("gemm_schedules", "1536x1536x1536", "float16"),
    ("gemm_schedules", "64x8192x8192", "float16"),
    ("gemm_schedules", "128x4096x11008", "float16"),
    ("gemm_schedules", "8192x8192x8192", "bfloat16"),
    ("gemm_schedules", "16x5120x5120", "float16"),
    ("gemm_schedules", "777x4097x1234", "float16"),
    ("fusion", "5120x13824x5120", "float16"),
    ("fusion", "2000x3000x4000", "float16"),
    ("softmax", "8192x32000", "float16"),
    ("softmax", "1024x128256", "float16"),
    ("softmax", "65536x256", "float16"),
    ("softmax", "16384x3072", "float16"),
    ("softmax", "4097x5000", "float16"),
    ("softmax", "131072x64", "float16"),
    ("softmax", "8192x32000", "bfloat16"),
    ("softmax", "2048x50257", "float16"),
    ("flash_attention", "4x16x2048x64", "float16"),
    ("flash_attention", "1x32x3000x128", "float16"),
    ("flash_attention", "2x8x8192x64", "float16"),
    ("flash_attention", "8x32x512x128", "float16"),
    ("flash_attention", "1x32x4096x128x8", "float16"),
    ("flash_attention", "4x32x4096x128", "bfloat16"),
    ("flash_attention", "2x24x4999x128", "float16"),
    ("vector_add", "100000007", "float32"),
]

# Users' problems of other kinds, none of them tuned on: one row (decoding), a few columns, a long K over a small
# C, a short K over a tall C, tiny and ragged sizes; attention from one token to a thousand, grouped-query at 2K;
# softmax rows from 77 to 262144 wide (narrow odd ones in groups that divide M and not).
OTHER_PROBLEMS = [
    ("gemm_schedules", "1x4096x4096", "float16"), ("gemm_schedules", "4096x8x4096", "float16"),
    ("gemm_schedules", "1000x1000x1000", "float16"), ("gemm_schedules", "3000x500x7000", "float16"),
    ("gemm_schedules", "256x256x65536", "float16"), ("gemm_schedules", "100000x512x128", "float16"),
    ("gemm_schedules", "12345x678x910", "float16"), ("gemm_schedules", "6000x6000x100", "float16"),
    ("gemm_schedules", "512x512x512", "float16"), ("gemm_schedules", "3072x768x3072", "float16"),
    ("gemm_schedules", "4096x4096x256", "float16"), ("gemm_schedules", "25x212x14336", "bfloat16"),
    ("flash_attention", "16x12x128x64", "float16"), ("flash_attention", "4x16x77x64", "float16"),
    ("flash_attention", "2x16x1000x128", "float16"), ("flash_attention", "4x32x1024x128", "float16"),
    ("flash_attention", "64x8x256x64", "float16"), ("flash_attention", "1x8x1x64", "float16"),
    ("flash_attention", "2x32x2048x128x8", "float16"),
    ("softmax", "3x77", "float16"), ("softmax", "65536x77", "float16"), ("softmax", "65537x77", "float16"),
    ("softmax", "4097x129", "bfloat16"),
    ("softmax", "100x100000", "float16"), ("softmax", "7x262144", "float16"),
    ("softmax", "50000x1000", "float16"), ("softmax", "2000x10000", "bfloat16"),
]


def gemm_size(rng) -> int:
    """One of M, N, K: tiny (under a tile), mid-size, big, or a round model width."""
    kind = rng.random()
    if kind < 0.25:
        return rng.randint(1, 40)
    if kind < 0.6:
        return rng.randint(41, 3000)
    if kind < 0.85:
        return rng.randint(3000, 12000)
    return rng.choice([64, 128, 4096, 5120, 11008, 14336])


def random_shape(section: str, rng) -> tuple:
    """A problem nobody picked for `section`: tiny, ragged, skinny, tall, wide or unaligned; grouped-query
    attention about one time in three."""
    if section in ("gemm_schedules", "fusion", "autotune"):
        return gemm_size(rng), gemm_size(rng), gemm_size(rng)
    if section == "softmax":
        width = rng.choice([rng.randint(1, 300), rng.randint(300, 20000), rng.randint(20000, 262144)])
        return rng.choice([1, 3, 100, 4097, 65536] if width < 20000 else [1, 3, 100, 1024]), width
    heads = rng.choice([1, 3, 8, 12, 16, 32])
    dims = (rng.choice([1, 2, 4, 8]), heads, rng.choice([1, 5, 63, 65, 100, 513, 1000, 1999, 4096, 7777]),
            rng.choice([64, 128]))
    if rng.random() < 0.3:
        dims += (rng.choice([g for g in (1, 2, 4, 8) if heads % g == 0]),)
    return dims


RANDOM_SECTIONS = ("gemm_schedules", "fusion", "softmax", "flash_attention")


def random_problems(count: int, seed: int, sections=RANDOM_SECTIONS) -> list:
    """`count` random problems a section (float16 or bfloat16), as (section, "AxB...", dtype)."""
    rng = random.Random(seed)
    return [(section, "x".join(map(str, random_shape(section, rng))), rng.choice(["float16", "bfloat16"]))
            for section in sections for _ in range(count)]


def run_one(section: str, shape: str, dtype: str, out_dir: str, timeout: float, quick: bool = False) -> dict:
    path = os.path.join(out_dir, f"{section}-{shape}-{dtype}.json")
    argv = [sys.executable, os.path.join(ROOT, "tilelang_tour.py"), "--only", section, "--shape", shape, "--json", path]
    if dtype != "float32":
        argv += ["--dtype", dtype]
    if quick:
        argv.append("--quick")
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        log = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        return {"status": f"no answer in {timeout:.0f} s", "seconds": timeout, "headline": {}}
    with open(path.replace(".json", ".log"), "w") as fh:
        fh.write(log)
    try:
        record = json.load(open(path))["sections"][0]
    except (OSError, ValueError, IndexError, KeyError):
        return {"status": f"exit {done.returncode}", "seconds": time.perf_counter() - started, "headline": {},
                "error": log.strip().splitlines()[-1:] or [""]}
    return {"status": record["status"], "seconds": time.perf_counter() - started, "headline": record["headline"],
            "error": [record.get("error_message") or record.get("skip_reason") or ""]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="run only the problems of sections whose name contains one")
    parser.add_argument("--out", help="folder for each run's JSON record and log (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds for one run")
    parser.add_argument("--problems", help="SECTION:SHAPE[:DTYPE],... instead of the list above")
    parser.add_argument("--others", action="store_true", help="the problems of other kinds (OTHER_PROBLEMS)")
    parser.add_argument("--quick", action="store_true", help="the tour's --quick timing: a look, not a verdict")
    parser.add_argument("--budget", type=float, default=0, help="stop starting new runs after this many seconds")
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="N random problems a section (GEMM, fusion, softmax, attention) instead of the list")
    parser.add_argument("--seed", type=int, default=None, help="the random problems' seed (default: a new one)")
    args = parser.parse_args()
    out_dir = args.out or tempfile.mkdtemp(prefix="shape_targets_")
    os.makedirs(out_dir, exist_ok=True)
    problems = OTHER_PROBLEMS if args.others else PROBLEMS
    if args.random:
        seed = random.randrange(10**6) if args.seed is None else args.seed
        print(f"random problems, seed {seed}")
        problems = random_problems(args.random, seed)
    if args.problems:
        problems = [(*p.split(":")[:2], (p.split(":") + ["float16"])[2]) for p in args.problems.split(",")]
    chosen = [p for p in problems if not args.words or any(w in p[0] for w in args.words)]
    started = time.perf_counter()
    for section, shape, dtype in chosen:
        if args.budget and time.perf_counter() - started > args.budget:
            print(f"{section:16s} {shape:18s} {dtype:9s} not run: the budget of {args.budget:.0f} s is spent")
            continue
        result = run_one(section, shape, dtype, out_dir, args.timeout, args.quick)
        cells = ", ".join(f"{k} {v}" for k, v in result["headline"].items()) or " ".join(result.get("error", []))
        print(f"{section:16s} {shape:18s} {dtype:9s} {result['status']:8s} {result['seconds']:6.1f} s  {cells}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
