"""fusion: gelu(A @ B + bias) as one kernel, the epilogue applied where the accumulator already is.

You will learn:
- why fusing pays: eager PyTorch runs `gelu(a @ b + bias)` as three kernels, and the two intermediates make
  four M x N trips through global memory; fused, they never leave the registers;
- how little code it takes: the kernel is the `gemm_schedules` builder with `bias=True, activation="gelu"`,
  a few `T.Parallel` lines on the register accumulator before the one store (sections/gemm_epilogue.py),
  on the schedule the GEMM's rule picks for the problem (`--shape MxNxK`: timed beside its neighbours, as in
  gemm_schedules; with a split K the epilogue runs in the reduction, where the sums are whole);
- how to make GELU cheap: exact GELU (torch's default, erf) as max(x, 0) - |x| * erfc(|x| / sqrt 2) / 2 with
  a rational erfc (Abramowitz & Stegun 7.1.26, error 1.5e-7): about 15 PTX instructions, two of them
  special-function ones, against about 30 with CUDA's erff; it matters because the epilogue runs while the
  tensor cores wait. The tanh form matches torch's `approximate="tanh"`;
- that the schedule that wins bare is not the one that wins fused: on Hopper the appendix's ping-pong kernel
  (sections/hopper/gemm_pingpong.py), where each consumer warpgroup owns its own tile and one's epilogue runs
  under the other's K loop, is timed beside the lesson's kernel.

The algorithm (the GEMM lesson's, with two lines more):

    for each block_M x block_N tile of C:
        acc = sum over k of A_tile[k] @ B_tile[k]     # registers, as in gemm_schedules
        acc = gelu(acc + bias[tile columns])          # still in registers: T.Parallel over the tile
        C[tile] = fp16(acc)                           # the only store

We compare with eager PyTorch and with torch.compile, which fuses the bias and GELU into one Triton kernel
after cuBLAS's GEMM (its default mode; --full uses "max-autotune-no-cudagraphs" instead, which searches GEMM
configurations for tens of seconds).
"""

import time

import tourkit
from sections.gemm_epilogue import gelu_exact  # noqa: F401  (gelu_exact: the formula taught)
from sections.gemm_plans import LESSON_CONFIGS, PART_THREADS, GemmLauncher, GemmPlan, gemm_bytes, rivals
from sections.gemm_schedules import (fits, gemm_flops, gemm_program, lesson_schedules, reference, rule,  # noqa: F401
                                     sm_count, timed_choice)
from tourkit import KernelDecl, Section, SectionSkip

TOLERANCE = 5e-3
APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}  # our activation name -> torch's `approximate=`
TORCH_GELU = dict(APPROXIMATE, gelu_erff="none")
COMPILE_MODE = "default"
FULL_COMPILE_MODE = "max-autotune-no-cudagraphs"
ODD = (1000, 1000, 1000)


def lesson_config(family: str, smem_budget: int):
    """The GEMM lesson's default schedule (the first that fits), now with the epilogue."""
    for config in lesson_schedules(family):
        if fits(config, smem_budget):
            return config
    raise SectionSkip(f"no GEMM schedule fits the {smem_budget} B of shared memory a block may use here")


# ---------------------------------------------------------------------------------------------------------
# PyTorch: the reference and the two competitors
# ---------------------------------------------------------------------------------------------------------


def eager(a, b, bias, activation: str = "gelu"):
    import torch

    return torch.nn.functional.gelu(a @ b + bias, approximate=TORCH_GELU[activation])


def compiled_eager(mode: str, activation: str = "gelu"):
    """torch.compile of the eager expression, or (None, reason) where torch.compile cannot run."""
    import torch

    def expression(a, b, bias):
        return eager(a, b, bias, activation)

    try:
        return torch.compile(expression, mode=mode, dynamic=False), None
    except Exception as exc:  # e.g. no Triton / no C compiler on this machine
        return None, tourkit.one_line(exc)


def saved_traffic_bytes(M: int, N: int, elem_bytes: int = 2) -> int:
    """Global-memory bytes eager moves and the fused kernel does not: the GEMM result written and read
    back by the add, and the add's result written and read back by GELU (4 M x N tensors of traffic)."""
    return 4 * M * N * elem_bytes


def fused_inputs(M: int, N: int, K: int, seed: int = 0, dtype: str = "float16"):
    import torch

    dt = getattr(torch, dtype)
    a = tourkit.random_tensor((M, K), dt, seed=seed)
    b = tourkit.random_tensor((K, N), dt, seed=seed + 1, scale=K ** -0.5)  # keep GELU's input O(1)
    bias = tourkit.random_tensor((N,), dt, seed=seed + 2)
    return a, b, bias, torch.empty((M, N), dtype=dt, device="cuda")


# ---------------------------------------------------------------------------------------------------------
# The kernels, declared once
# ---------------------------------------------------------------------------------------------------------


def problem(ctx) -> tuple[int, int, int]:
    """The user's problem (--shape), or the section's own square one."""
    if ctx.shape is not None:
        return tuple(ctx.shape)
    size = 2048 if ctx.quick or ctx.compile_only else 8192
    return size, size, size


def problem_size(ctx) -> int:
    return problem(ctx)[0]


def appendix_for(ctx):
    """The ping-pong appendix module when the section runs or compiles for sm_90a, else None."""
    if ctx.arch != "sm_90a":
        return None
    from sections.hopper import gemm_pingpong

    return gemm_pingpong


def kernel_name(p: GemmPlan, activation: str, part: str = "gemm") -> str:
    kernel = p.label() if isinstance(p.config, LESSON_CONFIGS) else p.config.columns()["kernel"]  # the appendix's
    name = f"{kernel} + bias + {activation} @{p.M}x{p.N}x{p.K}"
    return name + ("" if p.dtype == "float16" else f" {p.dtype}") + ("" if part == "gemm" else f" ({part})")


def planned(ctx):
    """(plan, activation, timed, nvcc) of every fused kernel the section runs: the GEMM rule's schedule
    (gemm_plans.choose_schedule) with exact GELU at the problem, and with both GELU forms at a ragged size;
    with --shape the user's problem alone, its pick timed beside the GEMM lesson's neighbours of it (its
    runner-up with another tile, the lesson's default), as gemm_schedules times them; on sm_90a the
    appendix's with exact GELU beside them."""
    M, N, K = problem(ctx)
    pick = rule(ctx, M, N, K, epilogue=True)
    jobs = [(pick, "gelu", True, True)]
    if ctx.shape is None:
        jobs += [(rule(ctx, *ODD, epilogue=True), activation, False, activation == "gelu_tanh") for activation in APPROXIMATE]
    else:
        others = rivals(pick, tourkit.ARCH_SPECS[ctx.arch].family, sm_count(ctx), ctx.smem_budget, epilogue=True)
        jobs += [(p, "gelu", True, False) for p in others]
    appendix = appendix_for(ctx)
    if appendix is not None and N % 8 == 0 and K % 8 == 0:
        shapes = [(M, N, K)] + ([ODD] if ctx.shape is None else [])
        # The ping-pong reads B's padded copy where the lesson's pick does (bench/gemm_alignment_probe.py --appendix)
        jobs += [(GemmPlan(*shape, appendix.appendix_schedule(*shape, sm_count(ctx)), ctx.dtype,
                           pad_b=pick.pad_b and shape == (M, N, K)), "gelu", shape == (M, N, K), shape == (M, N, K))
                 for shape in shapes]
    return jobs


def parts(p: GemmPlan) -> tuple[str, ...]:
    """The plan's programs: B's padded copy (pad_b), the GEMM, and with a split K the reduction (which applies
    the epilogue)."""
    return p.parts


def kernels(ctx) -> list[KernelDecl]:
    markers = tuple(tourkit.tensor_core_markers(ctx.arch))
    return [KernelDecl(kernel_name(p, act, part), (lambda p=p, a=act, part=part: p.programs(True, a)[part]),
                       pass_configs=p.pass_configs(part, act), nvcc=nvcc,
                       threads=p.config.threads if part == "gemm" else PART_THREADS[part],
                       markers=p.markers(markers) if part == "gemm" else (), smem_limit=p.config.smem_bytes())
            for p, act, _, nvcc in planned(ctx) for part in parts(p)]


def launcher(built: dict, p: GemmPlan, activation: str) -> GemmLauncher:
    return GemmLauncher(p, {part: built[kernel_name(p, activation, part)] for part in parts(p)})


# ---------------------------------------------------------------------------------------------------------
# Check and benchmark
# ---------------------------------------------------------------------------------------------------------


def check(ctx, built: dict) -> None:
    """Every fused kernel against the float32 reference on fresh random inputs, eager's error beside."""
    checks = []
    for p, activation, _, _ in planned(ctx):
        run = launcher(built, p, activation)
        a, b, bias, c = fused_inputs(p.M, p.N, p.K, seed=3, dtype=p.dtype)
        ref = reference(a, b, bias, activation)
        result = tourkit.validate(kernel_name(p, activation), lambda: run(a, b, bias, c), c, ref, TOLERANCE)
        eager_err = tourkit.relative_error(eager(a, b, bias, activation), ref)
        ctx.log(f"{result.line()}   (eager: {tourkit.format_error(eager_err)})")
        checks.append(result)
    tourkit.require(checks)


def torch_compiled(ctx, a, b, bias):
    """torch.compile of the eager expression, compiled (its first call) outside the timing, or None.
    --quick leaves it out: importing and tracing torch.compile costs seconds of a quick look."""
    mode = FULL_COMPILE_MODE if ctx.full else COMPILE_MODE
    if ctx.quick:
        ctx.log("torch.compile: compared in the full-size run (left out with --quick)")
        return mode, None
    compiled, reason = compiled_eager(mode)
    if compiled is not None:
        try:
            started = time.perf_counter()
            # max-autotune logs every candidate it tries to stdout/stderr: keep that out of the lesson
            with tourkit.capture_fd_output(2), tourkit.capture_fd_output(1):
                compiled(a, b, bias)
            ctx.metric(compile_mode=mode, compile_seconds=round(time.perf_counter() - started, 1))
            return mode, compiled
        except Exception as exc:
            reason = tourkit.one_line(exc)
    ctx.log(f"torch.compile skipped: {reason}")
    ctx.metric(compile_skipped=reason)
    return mode, None


def benchmark(ctx, built: dict) -> None:
    """The fused kernels (exact GELU), eager PyTorch and torch.compile, timed in turns in one call."""
    M, N, K = problem(ctx)
    a, b, bias, c = fused_inputs(M, N, K, dtype=ctx.dtype)
    fused = [(p, launcher(built, p, act)) for p, act, timed, _ in planned(ctx) if timed]
    lessons = [p for p, _ in fused if isinstance(p.config, LESSON_CONFIGS)]  # the rest: the appendix's
    if ctx.shape is not None:
        ctx.log(f"the fused kernel's schedule, by the GEMM rule: {fused[0][0].label()}:\n  {fused[0][0].describe()}")
    contenders = {p.label(): (lambda k: lambda: k(a, b, bias, c))(kernel) for p, kernel in fused}
    contenders["eager PyTorch (3 kernels)"] = lambda: eager(a, b, bias)
    mode, compiled = torch_compiled(ctx, a, b, bias)
    compiled_name = f"torch.compile ({mode})"
    if compiled is not None:
        contenders[compiled_name] = lambda: compiled(a, b, bias)
    rounds = 2 if ctx.quick else 4
    ms = tourkit.bench_interleaved(contenders, rounds=rounds)  # taking turns: the GPU clock drifts under load

    flops, eager_ms, compile_ms = gemm_flops(M, N, K), ms["eager PyTorch (3 kernels)"], ms.get(compiled_name)
    nbytes = gemm_bytes(M, N, K, bias=True)  # the fused kernel's minimum: no intermediate round trips
    best = min(lessons, key=lambda p: ms[p.label()])
    if len(lessons) > 1:
        ctx.log(timed_choice(lessons, best, {p: ms[p.label()] for p in lessons}))
    for p, _ in fused:
        ctx.timing(f"fused {p.label()}", ms[p.label()], flops=flops, nbytes=nbytes,
                   kind="lesson" if p in lessons else "appendix", problem=f"{M}x{N}x{K}")
    for name in ("eager PyTorch (3 kernels)", compiled_name):
        if name in ms:
            ctx.timing(name, ms[name], flops=flops, nbytes=nbytes, kind="pytorch", problem=f"{M}x{N}x{K}")
    marks = {lessons[0].label(): "the rule's pick", best.label(): "<- fastest"} if len(lessons) > 1 else {}
    rows = []
    for name, t in ms.items():
        plan = next((p for p, _ in fused if p.label() == name), None)
        what = (f"{plan.config.columns()['kernel']} {plan.config.columns()['tile']}"
                + (f", B in {plan.b_width}-column rows" if plan.pad_b else "")) if plan else name
        rows.append([what, f"{t:.3f}", f"{tourkit.tflops(flops, t):.0f}", f"{tourkit.speedup(eager_ms, t):.3f}x",
                     f"{tourkit.speedup(compile_ms, t):.3f}x" if compile_ms else "-", marks.get(name, "")])
    ctx.log(f"\ngelu(A @ B + bias), {M}x{N}x{K} {ctx.dtype} (timed in turns after {tourkit.SETTLE_MS / 1e3:.1f} s of "
            f"untimed load: {rounds} rounds, forward and backward)")
    ctx.table(["implementation", "ms", "TFLOP/s", "vs eager", f"vs torch.compile ({mode})", ""], rows)
    saved = saved_traffic_bytes(M, N)
    ctx.log(f"intermediate global-memory traffic saved by fusing: {tourkit.format_bytes(saved)} (two {M}x{N} "
            f"tensors, each written once and read once)")
    appendix = next((p for p, _ in fused if p not in lessons), None)
    for who, p in (("lesson", best), ("appendix", appendix)):
        if p is not None:
            ctx.headline(**{f"{who}_vs_eager": round(tourkit.speedup(eager_ms, ms[p.label()]), 3)})
            if compile_ms:
                ctx.headline(**{f"{who}_vs_compile": round(tourkit.speedup(compile_ms, ms[p.label()]), 3)})
    ctx.metric(size=M if M == N == K else f"{M}x{N}x{K}", dtype=ctx.dtype, lesson=best.label(),
               appendix=appendix.label() if appendix else None, saved_bytes=saved,
               ms={n: round(t, 4) for n, t in ms.items()})


# ---------------------------------------------------------------------------------------------------------
# The lesson
# ---------------------------------------------------------------------------------------------------------


def compile_only(ctx, decls) -> None:
    reports = tourkit.inspect_declared(ctx, decls)
    for p, activation, _, _ in planned(ctx):
        report = reports[kernel_name(p, activation, parts(p)[-1])]  # the epilogue: the GEMM's, or the reduction's
        math_fn = "exp2f(" if activation == "gelu" else "tanh"  # exact GELU: the rational erfc's exponential
        if math_fn not in report.source:
            raise tourkit.ValidationError(f"{report.name}: expected {math_fn} in the epilogue of the generated CUDA")
    first = planned(ctx)[0]
    excerpt = tourkit.source_excerpt(reports[kernel_name(first[0], "gelu", parts(first[0])[-1])].source, r"exp2f\(",
                                     context=2, limit=6)
    ctx.log("\nThe fused epilogue in the generated CUDA (on the accumulator registers, before the store):")
    ctx.log(tourkit.indent(excerpt, "  | "))
    M, N, _ = problem(ctx) if ctx.shape is not None else (8192, 8192, 8192)
    saved = saved_traffic_bytes(M, N)
    ctx.log(f"at {M}x{N} fusing saves {tourkit.format_bytes(saved)} of intermediate global-memory traffic")
    ctx.headline(arch=ctx.arch, kernels=len(decls), **{"saved_bytes" if ctx.shape else "saved_bytes_8192": saved})


def run(ctx) -> None:
    decls = kernels(ctx)
    if ctx.compile_only:
        compile_only(ctx, decls)
        return
    M, N, K = problem(ctx)
    tourkit.require_device_memory(ctx, 12 * (M * K + K * N + M * N), f"the {M}x{N}x{K} fused GEMM with its references")
    built = tourkit.build_declared(decls, log=ctx.log)
    check(ctx, built)
    benchmark(ctx, built)


SECTION = Section(
    name="fusion",
    title="Fusion: bias + GELU in the GEMM epilogue",
    summary="gelu(A @ B + bias) in one TileLang kernel vs eager PyTorch and torch.compile; traffic saved.",
    run=run,
    kernels=kernels,
)
