"""autotune: let `tilelang.autotune` pick the GEMM's schedule, check its pick against cuBLAS, and cache it.

The GEMM is the gemm_schedules lesson's (T.Pipelined + T.gemm): its schedules differ in a handful of numbers.
`--shape MxNxK` tunes your problem (N and K rounded up to multiples of 8, the kernels' 16-byte rows).

You will learn:

* what a search space is: the product of a few values per knob (block_M, block_N, block_K, num_stages,
  threads, swizzle), less the tiles whose fp32 accumulator would spill a thread's registers and the schedules
  whose tiles need more shared memory than a block may use (dropped from the tile sizes alone, before
  anything is compiled);
* how `tilelang.autotune` works: it wraps a `tilelang.jit` function whose keyword arguments are the schedule,
  compiles the configurations on CPU threads, times each on the GPU, one after another (`warmup` and `rep`
  count launches), and returns the fastest. Its @autotune path locks each compile, so the tour compiles the
  space in parallel first (the declared kernels): the autotuner finds them in TileLang's kernel cache;
* why its pick is re-checked: each configuration is timed once, at its own moment, while the GPU's clock
  drifts with power and heat, so schedules 1-2% apart can swap places. The pick, two runners-up and cuBLAS
  are timed again in turns (`tourkit.bench_interleaved`), where a steady drift cancels;
* that results are cached on disk, keyed by the program (the tuned function's source and arguments, the
  space, the timing settings): a second run is instant (TILELANG_CACHE_DIR, default ~/.tilelang/cache;
  TILELANG_AUTO_TUNING_DISABLE_CACHE=1 forces a new search).

The search, in pseudo-code:

    space = [c for c in product(block_M, block_N, block_K, num_stages, threads, swizzle)
             if block_M * block_N / threads <= 128              # the accumulator stays in registers
             and smem(c) <= smem_per_block]                     # the filters, before compiling
    key = hash(source, M, N, K, space, warmup, rep)
    if key in cache: return cache[key]                          # instant
    kernels = compile(space)                                    # CPU threads
    ms = {c: mean time of `rep` launches of kernels[c] for c in space}   # one after another
    cache[key] = pick = argmin(ms)
    verdict = bench_interleaved(pick, the next two by ms, cuBLAS)        # in turns: drift cancels
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tourkit
from sections.gemm_plans import GemmLauncher, GemmPlan, aligned, gemm_bytes
# The search space: a product of values per knob, filtered by registers and shared memory.
from sections.gemm_space import (MAX_ACCUMULATORS, MAX_WITH_COPIES, SPACES, TUNED_KEYS, describe,  # noqa: F401
                                 filter_space, search_space, to_gemm_config)
from sections.gemm_schedules import GemmConfig, gemm_flops, gemm_program
from tourkit import ARCH_SPECS, KernelDecl, Section, SectionSkip

TUNE_SIZE, QUICK_TUNE_SIZE = 8192, 2048
# tilelang.autotune's warmup= and rep= count launches: 50 launches of an 8192^3 GEMM take ~70 ms a
# configuration. Short, because the verdict re-times the leaders in turns anyway.
WARMUP_ITERS, TIMED_ITERS = 10, 50
RUNNERS_UP = 2  # the autotuner's next fastest, re-timed with its pick and cuBLAS
VERDICT_ROUNDS, QUICK_VERDICT_ROUNDS = 4, 2  # forward/backward rounds of bench_interleaved
NVCC_BUILDS = 2  # compile-only: every configuration is lowered, this many also go through nvcc
TOLERANCE = {"float16": 2e-3, "bfloat16": 5e-3}  # one output rounding, fp32 accumulation, vs float64

def tuned_size(ctx) -> int:
    return QUICK_TUNE_SIZE if ctx.quick else TUNE_SIZE


def tuned_shape(ctx) -> tuple[int, int, int]:
    """The problem tuned: the user's (--shape; N and K rounded up to multiples of 8, the kernels' 16-byte
    rows, the rest zeros) or the section's own square one."""
    if ctx.shape is None:
        return (tuned_size(ctx),) * 3
    M, N, K = ctx.shape
    return M, aligned(N), aligned(K)


def kept_space(ctx) -> tuple[list[dict], list[dict], list[tuple[dict, int]]]:
    space = search_space(ARCH_SPECS[ctx.arch].family, ctx.full)
    return (space, *filter_space(space, ctx.smem_budget))


def kernels(ctx) -> list[KernelDecl]:
    """Every configuration that passes the filter, at the tuned size, as tilelang.autotune compiles it
    (out_idx=[-1]: C is returned). Compiled in the background before the section runs, they make the
    autotuner's own compiles cache hits."""
    shape = tuned_shape(ctx)
    _, kept, _ = kept_space(ctx)
    return [KernelDecl(to_gemm_config(c).label(), functools.partial(gemm_program, *shape, to_gemm_config(c),
                                                                    dtype=ctx.dtype), out_idx=[-1], threads=c["threads"], nvcc=i < NVCC_BUILDS,
                       markers=tuple(tourkit.tensor_core_markers(ctx.arch)), smem_limit=ctx.smem_budget)
            for i, c in enumerate(kept)]


# The tuned function, one tuning, and the cache.

def gemm_for_tuning(M, N, K, builder="", dtype="float16", block_M=128, block_N=128, block_K=64, num_stages=3,
                    threads=256, swizzle=True):
    """The gemm_schedules GEMM, with the schedule as keyword arguments. `builder` only enters the cache key."""
    return gemm_program(M, N, K, GemmConfig(block_M, block_N, block_K, num_stages, threads, swizzle), dtype=dtype)


def builder_hash() -> str:
    """The autotuner's key covers gemm_for_tuning's own source, not the module it calls: passing this hash of
    gemm_schedules as an argument makes an edit of the GEMM invalidate cached results."""
    from sections import gemm_schedules

    return hashlib.sha256(inspect.getsource(gemm_schedules).encode()).hexdigest()[:16]


def make_tuner(configs: list[dict], target="cuda"):
    """`@tilelang.autotune(configs=...) @tilelang.jit(out_idx=[-1])` around gemm_for_tuning; called as
    tuner(M, N, K, builder) it returns the best kernel, called as kernel(a, b) -> c."""
    import tilelang

    jitted = tilelang.jit(out_idx=[-1], target=target)(gemm_for_tuning)
    return tilelang.autotune(configs=configs, warmup=WARMUP_ITERS, rep=TIMED_ITERS)(jitted)


def bars_wanted(stream=None) -> bool:
    """Progress bars in a terminal or a notebook (one bar redrawn); not in a log, where each redraw is a line."""
    stream = sys.stdout if stream is None else stream
    return "ipykernel" in sys.modules or bool(getattr(stream, "isatty", lambda: False)())


_LATENCY = re.compile(r"Tuned Latency (?P<ms>\S+) with config (?P<config>\{.*\}) at index (?P<idx>\d+)")


@contextlib.contextmanager
def quiet_autotuner(configs: list[dict], readings: dict[int, float], verbose: bool = False):
    """While tilelang.autotune runs: its tqdm bars only where bars_wanted(); its 'Tuned Latency' line per config
    kept in `readings` ({index: ms}; its result keeps the pick's alone), printed (and its log) only if `verbose`."""
    from tilelang.autotuner import tuner as tuner_module

    base = tuner_module.tqdm

    class Bar(base):
        __init__ = functools.partialmethod(base.__init__, disable=not bars_wanted())

        @classmethod
        def write(cls, text, *args, **kwargs):
            m = _LATENCY.search(str(text))
            if m and (idx := int(m["idx"])) < len(configs) and m["config"] == str(configs[idx]):  # names its config
                readings[idx] = float(m["ms"])
            if verbose:
                base.write(text, *args, **kwargs)

    logger = logging.getLogger(tuner_module.__name__)
    if not tuner_module._logger_handlers_initialized:  # TileLang would also write autotuner.log into the cwd
        tuner_module._logger_handlers_initialized = True
        logger.addHandler(logging.StreamHandler(sys.stdout))
    saved_level, tuner_module.tqdm = logger.level, Bar
    logger.setLevel(logging.INFO if verbose else logging.ERROR)  # a config that fails shows as 'not timed'
    try:
        yield
    finally:
        tuner_module.tqdm = base
        logger.setLevel(saved_level)


@dataclasses.dataclass
class Tuned:
    kernel: object
    config: dict
    seconds: float
    readings: dict[int, float]  # the autotuner's ms per index of the space
    searched: bool  # False: a cache hit, which holds no readings


def tune(M: int, N: int, K: int, configs: list[dict], target="cuda", verbose: bool = False,
         dtype: str = "float16") -> Tuned:
    """One tilelang.autotune call: a search, or a cache hit. `target`: "cuda" (this GPU) or a target dict."""
    tourkit.quiet_tilelang()
    readings: dict[int, float] = {}
    started = time.perf_counter()
    with quiet_autotuner(configs, readings, verbose):
        kernel = make_tuner(configs, target)(M, N, K, builder_hash(), dtype)
    config = {k: kernel.config[k] for k in TUNED_KEYS}
    return Tuned(kernel, config, time.perf_counter() - started, readings, bool(readings))


def forget_in_memory(kernel) -> int:
    """Drop the autotuner's in-process results that hold `kernel`, so that the next tuning of the same space
    reads the disk as a new process would. Returns how many it dropped."""
    from tilelang.autotuner.tuner import AutoTuner

    keys = [k for k, result in AutoTuner._memory_cache.items() if result.kernel is kernel]
    return len([AutoTuner._memory_cache.pop(k) for k in keys])


def readings_path(M: int, N: int, K: int, configs: list[dict], target="cuda", dtype: str = "float16") -> Path:
    """Where the tour keeps the autotuner's per-configuration readings of a search, beside its cache: a later
    run that finds the pick cached still knows the runners-up."""
    import tilelang
    from tilelang.autotuner.tuner import AutoTuner

    key = json.dumps([M, N, K, configs, str(target), builder_hash(), WARMUP_ITERS, TIMED_ITERS, tilelang.__version__]
                     + ([dtype] if dtype != "float16" else []))
    return AutoTuner._get_cache_dir().parent / "tour_autotune" / f"{hashlib.sha256(key.encode()).hexdigest()}.json"


def save_readings(path: Path, readings: dict[int, float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(readings))


def load_readings(path: Path) -> dict[int, float]:
    try:
        return {int(i): float(ms) for i, ms in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def tune_in_child(M: int, N: int, K: int, configs: list[dict], dtype: str = "float16") -> dict:
    """The same tuning in a new Python process, which finds the result on disk (--full only: a process start
    and its imports cost seconds)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = (f"import json, sys; sys.path.insert(0, {root!r}); from sections import autotune; "
            f"t = autotune.tune({M}, {N}, {K}, {configs!r}, dtype={dtype!r}); print('TUNED', json.dumps([t.seconds, t.config]))")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=tempfile.gettempdir())
    lines = [line for line in done.stdout.splitlines() if line.startswith("TUNED ")]
    if not lines:
        raise RuntimeError(f"the new process did not report (exit {done.returncode}): {done.stderr.strip()[-300:]}")
    seconds, config = json.loads(lines[-1][len("TUNED "):])
    return {"seconds": seconds, "config": config, "wall": time.perf_counter() - started}


def on_padded(kernel, a, b, config: dict, N: int, K: int):
    """kernel(a, b) -> c at the tuned sizes; where those are the problem's rounded up, through the GEMM's
    launcher: zero-padded copies of A and B made at each call, as a user's call would, C copied out."""
    if a.shape[1] == K and b.shape[1] == N:
        return lambda: kernel(a, b)
    run = GemmLauncher(GemmPlan(a.shape[0], b.shape[1], a.shape[1], to_gemm_config(config)), {"gemm": kernel},
                       returns_c=True)
    c = a.new_empty((a.shape[0], b.shape[1]))
    return lambda: run(a, b, c)


def leaders(readings: dict[int, float], pick: int, n: int = RUNNERS_UP) -> list[int]:
    """The pick, then the `n` other configurations the autotuner timed fastest (ties: the space's order)."""
    others = sorted((i for i in readings if i != pick), key=lambda i: (readings[i], i))
    return [pick] + others[:n]


def judge(times: dict[str, float], pick: str, reference: str = "cuBLAS") -> dict:
    """From one timing in turns: the pick's ratio to the reference, the fastest of our kernels and the pick's
    gap to it (0 when the pick is the fastest)."""
    ours = {name: ms for name, ms in times.items() if name != reference}
    fastest = min(ours, key=lambda name: (ours[name], name != pick))
    return {"vs_cublas": tourkit.speedup(times[reference], times[pick]), "fastest": fastest,
            "gap": times[pick] / ours[fastest] - 1}


# The section.

def report_space(ctx, space: list[dict], kept: list[dict], dropped: list[tuple[dict, int]]) -> None:
    family = ARCH_SPECS[ctx.arch].family
    axes = SPACES[family]["full" if ctx.full else "default"]
    spilling = math.prod(len(axes[key]) for key in TUNED_KEYS) - len(space)
    ctx.log(f"search space ({'full' if ctx.full else 'default; --full for a larger one'}): {len(space)} "
            f"configurations, the product of")
    for key in TUNED_KEYS:
        ctx.log(f"  {key:<10} {axes[key]}")
    limit = (f"{MAX_WITH_COPIES} with its share of the A and B tiles (no cp.async)" if family == "turing" else
             str(MAX_ACCUMULATORS))
    ctx.log(f"register rule: {spilling} left out, whose fp32 accumulator (block_M x block_N / threads) would take "
            f"more than {limit} registers a thread and spill")
    budget = tourkit.format_bytes(ctx.smem_budget)
    ctx.log(f"shared-memory filter: {len(dropped)} need more than the {budget} one block may use on {ctx.arch} "
            f"(num_stages copies of the A and B tiles) and are not compiled; {len(kept)} remain")
    for config, need in dropped[:4]:  # the first few
        ctx.log(f"  dropped {describe(config)}: needs {tourkit.format_bytes(need)}")
    ctx.metric(space_size=len(space), space_spilling=spilling, space_filtered=len(dropped), space_kept=len(kept),
               smem_budget=ctx.smem_budget)
    if not kept:
        raise SectionSkip(f"autotune: all {len(space)} configurations need more than the {budget} of shared memory "
                          f"one block may use on {ctx.arch}: nothing to tune")


def first_tuning(ctx, shape: tuple[int, int, int], kept: list[dict]) -> Tuned:
    """The autotuner's search, or its cached pick with the readings of the search that found it."""
    path = readings_path(*shape, kept, dtype=ctx.dtype)
    tuned = tune(*shape, kept, verbose=ctx.full, dtype=ctx.dtype)
    if tuned.searched:
        save_readings(path, tuned.readings)
        ctx.log(f"searched in {tuned.seconds:.1f} s: {len(tuned.readings)} of {len(kept)} configurations timed")
    else:
        tuned.readings = load_readings(path)
        ctx.log(f"found in the autotuner's cache in {tuned.seconds:.2f} s: no search (" + (
            "the readings below are those of the run that searched)" if tuned.readings else
            "the readings of that search are gone, so there are no runners-up to re-time)"))
    return tuned


def report_verdict(ctx, kept: list[dict], tuned: Tuned, pick: int, retimed: dict[int, float], cublas_ms: float,
                   rounds: int) -> None:
    """The autotuner's readings, fastest first, beside the timing in turns of the pick, its runners-up and cuBLAS."""
    flops = gemm_flops(*(ctx.shape or tuned_shape(ctx)))
    order = sorted(range(len(kept)), key=lambda i: (i not in tuned.readings, tuned.readings.get(i, 0), i))
    rows = []
    for i in order[:max(16, len(retimed))]:
        cfg, ms = kept[i], retimed.get(i)
        timed = [ms, tourkit.tflops(flops, ms), f"{tourkit.speedup(cublas_ms, ms):.3f}x"] if ms else ["", "", ""]
        rows.append([f"{cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']}", cfg["num_stages"], cfg["threads"],
                     "yes" if cfg["swizzle"] else "no", tourkit.format_bytes(to_gemm_config(cfg).smem_bytes()),
                     tuned.readings.get(i, "not timed"), *timed, "<- autotuner's pick" if i == pick else ""])
    rows.append(["cuBLAS (torch.matmul)", "", "", "", "", "", cublas_ms, tourkit.tflops(flops, cublas_ms),
                 "1.000x", ""])
    M, N, K = ctx.shape or tuned_shape(ctx)
    for name, ms, kind in ((f"autotuned {describe(tuned.config)}", retimed[pick], "lesson"),
                           ("cuBLAS", cublas_ms, "pytorch")):
        ctx.timing(name, ms, flops=flops, nbytes=gemm_bytes(M, N, K), kind=kind, problem=f"{M}x{N}x{K}")
    ctx.log(f"\nthe autotuner's readings, fastest first; {len(retimed)} of them re-timed in turns with cuBLAS "
            f"({rounds // 2} forward/backward pair{'s' if rounds > 2 else ''}, L2 flushed)")
    ctx.table(["tile MxNxK", "stages", "threads", "swizzle", "smem", "autotuner ms", "re-timed ms", "TFLOP/s",
               "vs cuBLAS", ""], rows)


def run(ctx) -> None:
    space, kept, dropped = kept_space(ctx)
    report_space(ctx, space, kept, dropped)
    decls = kernels(ctx)
    if ctx.compile_only or not ctx.has_gpu:
        reports = tourkit.inspect_declared(ctx, decls)
        ctx.log(f"every configuration lowered for {ctx.arch} ({min(NVCC_BUILDS, len(decls))} also through nvcc), "
                f"each within the shared memory the filter allowed; timing them, and so tuning, needs a GPU")
        ctx.headline(arch=ctx.arch, space=len(decls), lowered=len(reports))
        return

    import torch
    from tilelang.env import env

    (M, N, K), (_, N0, K0) = tuned_shape(ctx), ctx.shape or tuned_shape(ctx)
    tourkit.require_device_memory(ctx, 10 * (M * K + K * N + M * N), f"the {M}x{N0}x{K0} GEMM with its references")
    built = tourkit.build_declared(decls, log=ctx.log)
    ctx.log(f"tilelang.autotune over {len(kept)} configurations at {M}x{N}x{K} {ctx.dtype} (warmup={WARMUP_ITERS}, "
            f"rep={TIMED_ITERS} launches each, one configuration after another)" + (
                f"; the problem is {M}x{N0}x{K0}: the verdict times the padding copies too" if (N, K) != (N0, K0) else ""))
    tuned = first_tuning(ctx, (M, N, K), kept)
    pick = kept.index(tuned.config)

    # The cache: drop the in-memory result and tune again, as a new process would: the disk answers.
    forget_in_memory(tuned.kernel)
    again = tune(M, N, K, kept, dtype=ctx.dtype)
    ctx.log(f"re-tune of the same space, in-memory result dropped: {again.seconds:.2f} s "
            f"({'searched again: the autotuner cache is off' if again.searched else 'from the on-disk cache'})")
    if again.config != tuned.config and env.is_cache_enabled() and not env.is_autotune_cache_disabled():
        raise tourkit.ValidationError(f"the cached re-tune returned {describe(again.config)}, "
                                      f"not {describe(tuned.config)}")
    child = tune_in_child(M, N, K, kept, ctx.dtype) if ctx.full else None
    if child:
        ctx.log(f"re-tune in a new process: {child['seconds']:.2f} s ({child['wall']:.1f} s with start and imports)")

    a = tourkit.random_tensor((M, K0), getattr(torch, ctx.dtype), seed=11)
    b = tourkit.random_tensor((K0, N0), getattr(torch, ctx.dtype), seed=12)
    c = torch.empty(M, N0, dtype=a.dtype, device="cuda")
    call = {i: on_padded(tuned.kernel if i == pick else built[to_gemm_config(cfg).label()], a, b, cfg, N, K)
            for i, cfg in enumerate(kept) if i == pick or to_gemm_config(cfg).label() in built}
    check = tourkit.validate(f"autotuned GEMM ({describe(tuned.config)})", lambda: c.copy_(call[pick]()), c,
                             a.double() @ b.double(), TOLERANCE[ctx.dtype])
    ctx.log(check.line())
    tourkit.require([check])

    # The verdict: the pick, its runners-up (the whole space with --full) and cuBLAS, in one timing in turns.
    label = {i: to_gemm_config(cfg).label() for i, cfg in enumerate(kept)}
    retime = list(range(len(kept))) if ctx.full else leaders(tuned.readings, pick)
    contenders = {i: call[i] for i in retime}
    rounds = QUICK_VERDICT_ROUNDS if ctx.quick or ctx.full else VERDICT_ROUNDS
    times = tourkit.bench_interleaved({**contenders, "cuBLAS": lambda: torch.matmul(a, b)}, rounds=rounds)
    verdict = judge(times, pick)
    retimed = {i: times[i] for i in retime}
    report_verdict(ctx, kept, tuned, pick, retimed, times["cuBLAS"], rounds)
    fastest = "the fastest re-timed" if verdict["fastest"] == pick else (
        f"{100 * verdict['gap']:.1f}% behind the {describe(kept[verdict['fastest']])} schedule, which the "
        f"autotuner's own timing ranked below it")
    ctx.log(f"the autotuner's pick, {describe(tuned.config)}: {verdict['vs_cublas']:.3f}x cuBLAS, {fastest}")
    ctx.headline(winner=describe(tuned.config), vs_cublas=round(verdict["vs_cublas"], 3),
                 gap=round(verdict["gap"], 4), retune_s=round(again.seconds, 3))
    ctx.metric(size=M if ctx.shape is None else "x".join(map(str, ctx.shape)), dtype=ctx.dtype, winner_config=tuned.config, searched=tuned.searched, first_tune_s=tuned.seconds,
               autotuner_ms={label[i]: ms for i, ms in tuned.readings.items()}, cublas_ms=times["cuBLAS"],
               retimed_ms={label[i]: ms for i, ms in retimed.items()}, fastest_retimed=label[verdict["fastest"]],
               rel_error=check.rel_error, child=child)


SECTION = Section(
    name="autotune",
    title="Autotuning the GEMM",
    summary="tilelang.autotune over tile sizes, stages, threads and swizzle within the shared memory; its pick "
            "re-timed in turns with cuBLAS; the cached re-tune.",
    run=run, needs_gpu=True, kernels=kernels,
)
