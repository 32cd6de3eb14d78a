"""debugging: look inside a TileLang kernel, from the values it prints to the instructions it became.

You will learn:
* `T.print` from inside a running kernel (a shared tile, a register fragment, a scalar guarded to one
  thread), and how to catch it: CUDA's device printf goes to the process's C-level stdout (file
  descriptor 1), not to Python's `sys.stdout`, so a notebook never shows it; `tourkit.capture_fd_output`
  redirects the descriptor itself, and the printed values are checked;
* what the tile language became for the GEMM and FlashAttention lesson kernels: instruction markers in the
  CUDA source side by side for sm_80 (cp.async, ldmatrix, mma.sync) and sm_90a (TMA, mbarrier, wgmma). On
  Hopper TileLang adds a producer warpgroup that issues the copies, so the kernel launches more threads
  than the program asked for;
* TileLang's own profiler: `kernel.get_profiler()`, `assert_allclose`, `do_bench`;
* how to watch the lowering: which passes ran and which changed the IR (TVM's `DumpIR` instrument, what
  the `tl.enable_dump_ir` pass config installs), and the switches for tracing.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import functools
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import tilelang
import tilelang.language as T

import tourkit
from sections.flash_attention import flash_attention_forward
from sections.gemm_schedules import GemmConfig, fits, gemm_flops, gemm_program, lesson_schedules
from tourkit import ARCH_SPECS


def clip(line: str, width: int = 110) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


# --- Part 1: printing from the device -------------------------------------------------------------------
PRINT_ROWS, PRINT_COLS = 4, 8
SCALAR_AT = ((1, 2), (2, 1))  # the scalar printed is tile[1, 2] + tile[2, 1]


def print_demo_program(rows: int = PRINT_ROWS, cols: int = PRINT_COLS, dtype: str = "float32"):
    """Y = 2 X for one small tile, printing the tile on the way: from shared memory, from the register
    fragment, and one scalar from thread 0 only."""
    (r0, c0), (r1, c1) = SCALAR_AT

    @T.prim_func
    def print_demo(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows, cols), dtype)):
        with T.Kernel(1, threads=32) as bx:
            tile_s = T.alloc_shared((rows, cols), dtype)
            tile_f = T.alloc_fragment((rows, cols), dtype)
            T.copy(X, tile_s)
            # A shared buffer is printed by one thread (thread 0 by default), element by element.
            T.print(tile_s, msg="shared tile")
            T.copy(tile_s, tile_f)
            for i, j in T.Parallel(rows, cols):
                tile_f[i, j] = tile_f[i, j] * 2
            # A fragment is spread over the threads' registers: T.print gathers it into shared memory first.
            T.print(tile_f, msg="fragment x2")
            # A scalar expression prints from every thread that reaches it: guard it to one.
            tx = T.get_thread_binding()
            if tx == 0:
                T.print(tile_s[r0, c0] + tile_s[r1, c1], msg="scalar")
            T.copy(tile_f, Y)

    return print_demo


_DEVICE_PRINT = re.compile(
    r"msg='(?P<msg>[^']*)' BlockIdx=\((?P<block>[\d, ]+)\), ThreadIdx=\((?P<thread>[\d, ]+)\): "
    r"(?:buffer=(?P<buffer>\w+), index=(?P<index>\d+), )?dtype=(?P<dtype>[\w ]+) value=(?P<value>\S+)")


def parse_device_prints(text: str) -> list[dict]:
    """The lines T.print wrote, as dicts: msg, block, thread (tuples), buffer, index, dtype, value."""
    return [{"msg": m["msg"], "block": tuple(int(v) for v in m["block"].split(",")),
             "thread": tuple(int(v) for v in m["thread"].split(",")), "buffer": m["buffer"],
             "index": None if m["index"] is None else int(m["index"]), "dtype": m["dtype"], "value": float(m["value"])}
            for m in _DEVICE_PRINT.finditer(text)]


def check_device_prints(prints: list[dict], x_flat: list[float]) -> list[str]:
    """What is wrong with the printed values (an empty list when they are right)."""
    problems = []
    expected = {"shared tile": x_flat, "fragment x2": [2 * v for v in x_flat]}
    for msg, values in expected.items():
        lines = [p for p in prints if p["msg"] == msg]
        got = {p["index"]: p["value"] for p in lines}
        if len(lines) != len(values) or sorted(got) != list(range(len(values))):
            problems.append(f"{msg}: {len(lines)} lines printed, expected one per element ({len(values)})")
        elif any(abs(got[i] - v) > 1e-6 * max(1.0, abs(v)) for i, v in enumerate(values)):
            problems.append(f"{msg}: printed values differ from the input")
        if any(p["thread"] != (0, 0, 0) for p in lines):
            problems.append(f"{msg}: printed by a thread other than thread 0")
    (r0, c0), (r1, c1) = SCALAR_AT
    scalar = [p for p in prints if p["msg"] == "scalar"]
    want = x_flat[r0 * PRINT_COLS + c0] + x_flat[r1 * PRINT_COLS + c1]
    if len(scalar) != 1:
        problems.append(f"scalar: printed {len(scalar)} times, expected once (thread 0 only)")
    elif abs(scalar[0]["value"] - want) > 1e-6 * max(1.0, abs(want)):
        problems.append(f"scalar: printed {scalar[0]['value']}, expected {want}")
    return problems


def run_device_print(ctx, kernel) -> None:
    import torch

    # Quarters are exact in float32 and in printf's %f, so the printed text can be compared exactly.
    x = (torch.arange(PRINT_ROWS * PRINT_COLS, device="cuda", dtype=torch.float32) / 4 - 2).reshape(PRINT_ROWS, PRINT_COLS)
    y = torch.empty_like(x)
    with tourkit.capture_fd_output() as printed:
        # validate() poisons Y, launches, and synchronizes: device printf reaches the host at a synchronization.
        check = tourkit.validate("print_demo Y = 2X", lambda: kernel(x, y), y, 2 * x.double(), 1e-6)
    prints = parse_device_prints(printed.text)
    ctx.log(f"captured {len(prints)} device-printed lines from file descriptor 1, for example:")
    for msg in ("shared tile", "fragment x2", "scalar"):
        ctx.log("  " + next((ln for ln in printed.text.splitlines() if f"msg='{msg}'" in ln), f"(no line for {msg!r})"))
    problems = check_device_prints(prints, x.flatten().tolist())
    ctx.log(check.line())
    ctx.metric(device_print_lines=len(prints))
    if problems:
        raise tourkit.ValidationError("T.print: " + "; ".join(problems))
    ctx.log("printed values match the input (shared tile = X, fragment = 2X, scalar = one line from thread 0)")
    tourkit.require([check])


# --- Part 2: what TileLang generated, per architecture --------------------------------------------------
# The markers the table shows, in order, and the arches always compared side by side.
TABLE_MARKERS = ["mma_sync", "wgmma", "cp_async", "tma_load", "ldmatrix", "__syncthreads", "mbarrier", "rasterization"]
COMPARED_ARCHES = ["sm_80", "sm_90a"]
FLASH_SHAPE = dict(batch=1, heads=8, seq_len=1024, dim=128, causal=False)
FLASH_THREADS = 256


def lesson_gemm(arch: str, smem_budget: int | None = None) -> GemmConfig:
    """The GEMM lesson's default TileLang schedule for the arch (the first that fits its shared memory)."""
    spec = ARCH_SPECS[arch]
    budget = spec.smem_per_block_optin if smem_budget is None else smem_budget
    return next(c for c in lesson_schedules(spec.family) if fits(c, budget))


def gemm_size(ctx) -> int:
    return 1024 if ctx.quick else 4096


def marker_kernels(arch: str, size: int, smem_budget: int | None = None) -> list[tourkit.KernelDecl]:
    """The GEMM lesson kernel (out_idx=[2]: the profiler's form) and the FlashAttention lesson kernel for
    `arch`, with the markers a tensor-core kernel must show there."""
    config = lesson_gemm(arch, smem_budget)
    markers = tuple(tourkit.tensor_core_markers(arch))
    return [tourkit.KernelDecl(f"gemm {size}^3", functools.partial(gemm_program, size, size, size, config),
                               out_idx=[2], threads=config.threads, markers=markers),
            tourkit.KernelDecl(f"flash_attention d{FLASH_SHAPE['dim']}",
                               functools.partial(flash_attention_forward, **FLASH_SHAPE, threads=FLASH_THREADS),
                               threads=FLASH_THREADS, markers=markers)]


def kernels(ctx) -> list[tourkit.KernelDecl]:
    """What the section builds for ctx.arch: the T.print kernel and the GEMM (a run launches both); the
    compile-only report adds the FlashAttention kernel. The other arches' columns are only lowered."""
    gemm, flash = marker_kernels(ctx.arch, gemm_size(ctx), ctx.smem_budget)
    printing = tourkit.KernelDecl("print_demo", print_demo_program, threads=32)
    return [printing, gemm, flash] if ctx.compile_only else [printing, gemm]


def lower_markers(ctx, have: dict[str, tourkit.KernelReport]) -> dict[str, list]:
    """{arch: [(decl, report)]} for ctx.arch first, then sm_80 and sm_90a: every marker kernel lowered
    (tourkit.inspect_kernels, in threads) except those in `have` (already inspected by name for ctx.arch).
    A --quick run compares the GEMM alone (FlashAttention's lowering for sm_80 takes seconds)."""
    arches = [ctx.arch] + [a for a in COMPARED_ARCHES if a != ctx.arch]
    count = 1 if ctx.quick and not ctx.compile_only else 2
    decls = {arch: marker_kernels(arch, gemm_size(ctx), ctx.smem_budget if arch == ctx.arch else None)[:count]
             for arch in arches}
    jobs = [(d.name, d.program(), arch) for arch in arches for d in decls[arch]
            if not (arch == ctx.arch and d.name in have)]
    lowered = iter(tourkit.inspect_kernels(jobs, nvcc=False))
    return {arch: [(d, have[d.name] if arch == ctx.arch and d.name in have else next(lowered)) for d in decls[arch]]
            for arch in arches}


def marker_table(reports: dict[str, list], running_arch: str) -> tuple[list, list]:
    """Rows: markers and the launch shape; columns: each kernel on every arch side by side."""
    count = min(len(pairs) for pairs in reports.values())
    columns = [(arch, pairs[i]) for i in range(count) for arch, pairs in reports.items()]
    headers = ["marker"] + [f"{d.name.split()[0]} {arch}{'*' if arch == running_arch else ''}"
                            for arch, (d, _) in columns] + ["what it is"]
    rows = [[m] + [rep.markers.get(m, 0) for _, (_, rep) in columns] + [tourkit.MARKERS[m][1]] for m in TABLE_MARKERS]
    rows.append(["threads launched"] + [rep.threads for _, (_, rep) in columns] + ["threads per block in the launch"])
    rows.append(["threads asked"] + [d.threads for _, (d, _) in columns] + ["threads=... in T.Kernel"])
    rows.append(["shared memory"] + [tourkit.format_bytes(rep.smem_bytes) for _, (_, rep) in columns] + ["per block"])
    rows.append(["nvcc"] + [rep.nvcc.split(":")[0] for _, (_, rep) in columns] + ["nvcc -arch=... on the source"])
    return headers, rows


def show_markers(ctx, reports: dict[str, list]) -> None:
    headers, rows = marker_table(reports, ctx.arch)
    where = "the --arch of this compile-only run" if ctx.compile_only else "this GPU"
    ctx.log(f"Instruction markers counted in the generated CUDA source (* = {where}):")
    ctx.table(headers, rows)
    for arch, (decl, rep) in ((arch, pair) for arch, pairs in reports.items() for pair in pairs):
        if rep.threads != decl.threads:
            extra = rep.threads - decl.threads
            ctx.log(f"note: {rep.name} on {arch} launches {rep.threads} threads, the program asked for "
                    f"{decl.threads}: warp specialization added {extra} producer threads ({extra // 32} warps) "
                    f"that issue the TMA copies.")
    gemm_here = reports[ctx.arch][0][1]
    excerpt = tourkit.source_excerpt(gemm_here.source, r"tl::(wgmma_\w+|mma_sync)<", context=0, limit=1)
    if excerpt:
        ctx.log(f"the tensor-core call in {gemm_here.name}'s CUDA for {ctx.arch} (one instruction's M, N, K among "
                f"its template arguments):")
        ctx.log("  " + clip(excerpt.strip()))
    ctx.metric(markers={f"{rep.name} {arch}": rep.summary() for arch, pairs in reports.items() for _, rep in pairs})
    for decl, rep in (pair for pairs in reports.values() for pair in pairs):
        tourkit.require_markers(rep, decl.markers)


# --- Part 3: TileLang's own profiler --------------------------------------------------------------------
def run_profiler(ctx, kernel, config: GemmConfig) -> None:
    import torch

    size = gemm_size(ctx)
    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Normal)
    # assert_allclose draws inputs for the kernel's parameters, runs both programs and compares
    # (out_idx=[2]: the kernel allocates C and returns it, which is what the profiler expects).
    profiler.assert_allclose(lambda a, b: (a.float() @ b.float()).half(), rtol=1e-2, atol=1e-2)
    ctx.log(f"profiler.assert_allclose(reference, rtol=1e-2, atol=1e-2): passed for gemm {size}^3 {config.label()}")
    a = tourkit.random_tensor((size, size), torch.float16, seed=1)
    b = tourkit.random_tensor((size, size), torch.float16, seed=2)
    c = torch.empty(size, size, dtype=torch.float16, device="cuda")
    check = tourkit.validate("gemm via kernel(a, b)", lambda: c.copy_(kernel(a, b)), c, a.double() @ b.double(), 2e-3)
    ctx.log(check.line())  # the same check through the kit, to print a relative error
    tourkit.require([check])
    # do_bench: CUDA events around each call, L2 flushed between calls; the mean in ms by default.
    tl_ms = profiler.do_bench(warmup=10, rep=50)
    torch_ms = profiler.do_bench(lambda a, b: torch.matmul(a, b), warmup=10, rep=50)
    kit_ms = tourkit.bench_ms(lambda: kernel(a, b), warmup_ms=10.0, rep_ms=50.0)
    flops = gemm_flops(size, size, size)
    ctx.table(["timed by", "kernel", "ms", "TFLOP/s"], [
        ["profiler.do_bench() (mean)", "TileLang gemm", tl_ms, tourkit.tflops(flops, tl_ms)],
        ["profiler.do_bench(torch.matmul)", "cuBLAS", torch_ms, tourkit.tflops(flops, torch_ms)],
        ["tourkit.bench_ms (median)", "TileLang gemm", kit_ms, tourkit.tflops(flops, kit_ms)],
    ])
    ratio = torch_ms / tl_ms
    ctx.log(f"TileLang / cuBLAS through the same profiler, one after the other: {ratio:.2f}x")
    ctx.metric(profiler_gemm_size=size, profiler_tilelang_ms=tl_ms, profiler_torch_ms=torch_ms,
               profiler_kit_ms=kit_ms, profiler_vs_torch=ratio, profiler_rel_error=check.rel_error)
    ctx.headline(profiler_vs_cublas=round(ratio, 2))


# --- Part 4: watching the lowering ----------------------------------------------------------------------
# (name, how to set it, what it does); the table shows which of them this tilelang knows.
DEBUG_ENV_VARS = [
    ("TILELANG_PRINT_ON_COMPILATION", "1", "log 'begins/completes to compile kernel' (0 in the tour)"),
    ("TL_LOWER_TRACE", "terminal|html|both", "IR diff of every lowering pass (read at import)"),
    ("TILELANG_PASS_DIFF", "terminal|html|both", "older per-pass IR diff hook (read at import)"),
    ("TILELANG_PASS_PROFILE", "1", "time every pass of each compile"),
    ("TILELANG_CLEANUP_TEMP_FILES", "0", "keep nvcc's temporary files"),
    ("TILELANG_JIT_DIAGNOSTICS", "1", "phase-by-phase JIT diagnostics"),
    ("TILELANG_VERBOSE", "1", "verbose compile logging"),
    ("TILELANG_DISABLE_CACHE", "1", "recompile instead of loading the kernel cache"),
    ("TILELANG_CACHE_DIR", "path", "where compiled kernels are cached"),
]
DEBUG_PASS_CONFIGS = [
    ("tl.enable_dump_ir", "True", "write the IR after every pass (with tl.dump_ir_path)"),
    ("tl.pass_profile", "True", "per-pass timing report"),
    ("cuda.kernels_output_dir", "path", "write the generated .cu files"),
    ("tl.disable_warp_specialized", "True", "Hopper: no producer/consumer split"),
    ("tl.disable_tma_lower", "True", "Hopper: cp.async instead of TMA"),
]


def known_env_vars() -> list[list[str]]:
    """The debug environment variables with the value this process sees; '(not in this version)' when
    the installed tilelang has no such variable."""
    import importlib

    environment = importlib.import_module("tilelang.env").Environment  # `tilelang.env` is also an object
    known_keys = {getattr(v, "key", None) for v in vars(environment).values()}
    return [[f"{name}={how}", os.environ.get(name, "(unset)") if name in known_keys else "(not in this version)", what]
            for name, how, what in DEBUG_ENV_VARS]


def known_pass_configs() -> list[list[str]]:
    values = {v for k, v in vars(tilelang.PassConfigKey).items() if not k.startswith("_")}
    values = {getattr(v, "value", v) for v in values}
    return [[f"{key}: {how}", "yes" if key in values else "not in this version", what]
            for key, how, what in DEBUG_PASS_CONFIGS]


BIG_STEPS_SHOWN = 8  # the passes that grew or shrank the IR most, in the order they ran


def trace_lowering(func, arch: str, dump_dir: str) -> list[dict]:
    """Lower `func` for `arch` with TVM's DumpIR instrument (what `tl.enable_dump_ir` installs), then read
    the dumped files back: which passes ran, in order, and which changed the IR."""
    import tvm
    from tvm.ir.instrument import DumpIR

    target = tourkit.cuda_target(arch)
    with tvm.transform.PassContext(instruments=[DumpIR(dump_dir)]), target:
        tilelang.lower(func, target=target)
    steps, previous = [], func.script()
    for name in sorted(os.listdir(dump_dir)):
        with open(os.path.join(dump_dir, name)) as fh:
            text = fh.read()
        steps.append({"file": name, "pass": name[4:-3], "lines": len(text.splitlines()),
                      "changed": text != previous, "ir": text})
        previous = text
    return steps


def big_steps(func, steps: list[dict]) -> list[str]:
    """'pass before->after' (IR lines) of the BIG_STEPS_SHOWN passes that changed the IR's length most."""
    before, moves = len(func.script().splitlines()), []
    for i, step in enumerate(steps):
        moves.append((abs(step["lines"] - before), i, f"{step['pass']} {before}->{step['lines']}"))
        before = step["lines"]
    return [text for _, _, text in sorted(sorted(moves, reverse=True)[:BIG_STEPS_SHOWN], key=lambda m: m[1])]


def trace_gemm(ctx) -> tuple:
    """The lowering trace of a small GEMM lesson kernel for ctx.arch, in a temporary dump directory."""
    config = lesson_gemm(ctx.arch, ctx.smem_budget)
    func = gemm_program(1024, 1024, 1024, config)
    dump_dir = tempfile.mkdtemp(prefix="tilelang_dump_ir_")
    try:
        return config, func, trace_lowering(func, ctx.arch, dump_dir)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)


def show_lowering(ctx, config: GemmConfig, func, steps: list[dict]) -> None:
    changed = [s for s in steps if s["changed"]]
    ctx.log(f"gemm 1024^3 {config.label()} before lowering (func.script(), first lines):")
    for line in func.script().splitlines()[:4]:
        ctx.log("  " + clip(line))
    ctx.log(f"Lowering for {ctx.arch}: {len(steps)} passes ran (one IR file each, e.g. {steps[1]['file']}), "
            f"{len(changed)} changed the IR; the {BIG_STEPS_SHOWN} biggest steps (IR lines before -> after):")
    rows = big_steps(func, steps)
    for start in range(0, len(rows), 4):
        ctx.log("  " + ",  ".join(rows[start:start + 4]))
    after = next((s for s in steps if s["pass"] == "tl.LowerTileOp"), None)
    excerpt = tourkit.source_excerpt(after["ir"], r"tma_load|cp_async", context=0, limit=1) if after else ""
    if excerpt:
        ctx.log("after tl.LowerTileOp a T.copy has become an explicit copy instruction:")
        ctx.log("  " + clip(excerpt.strip()))
    ctx.log("\nTo do this yourself (TILELANG_PRINT_ON_COMPILATION defaults to 0 in the tour: tourkit.quiet_tilelang):")
    ctx.table(["environment variable", "here", "what it does"], known_env_vars())
    ctx.table(["pass config (tilelang.compile(..., pass_configs={...}))", "known", "what it does"],
              known_pass_configs())
    ctx.log("and kernel.get_kernel_source() / tilelang.lower(func, target=...).kernel_source for the CUDA source.")
    ctx.metric(lowering_passes=len(steps), lowering_passes_changed=len(changed))
    if len(steps) < 20 or not changed:
        raise tourkit.ValidationError(f"lowering trace looks wrong: {len(steps)} passes, {len(changed)} changed")


# --- The lesson -----------------------------------------------------------------------------------------
def run(ctx) -> None:
    decls = kernels(ctx)
    gpu = not ctx.compile_only
    built = tourkit.build_declared(decls, log=ctx.log) if gpu else {}
    have = {} if gpu else tourkit.inspect_declared(ctx, decls)  # compile-only: what ctx.arch's kernels became
    # Lowering runs in C++ threads: the marker kernels and the trace lower while the GPU parts run.
    with ThreadPoolExecutor(max_workers=2) as pool:
        markers = pool.submit(lower_markers, ctx, have)
        trace = pool.submit(trace_gemm, ctx)
        ctx.log("\n== 1. T.print: printing from the device ==")
        if gpu:
            run_device_print(ctx, built["print_demo"])
        else:
            lines = [ln.strip() for ln in have["print_demo"].source.splitlines() if "debug_print" in ln]
            ctx.log(f"T.print in the CUDA source for {ctx.arch}: calls into TileLang's debug.h printf helpers")
            ctx.log("\n".join("  " + line for line in lines))
            if len(lines) < 3:
                raise tourkit.ValidationError(f"expected 3 debug_print calls in print_demo's CUDA, found {len(lines)}")
            ctx.log("(running it and capturing the printed values needs a GPU: skipped in compile-only mode)")
        ctx.log("\n== 2. What TileLang generated: instruction markers per architecture ==")
        reports = markers.result()
        if gpu:  # ctx.arch's GEMM is the kernel build_declared compiled with nvcc
            reports[ctx.arch][0][1].nvcc = "compiled"
        show_markers(ctx, reports)
        ctx.log("\n== 3. The built-in profiler: get_profiler(), assert_allclose, do_bench ==")
        if gpu:
            run_profiler(ctx, built[decls[1].name], lesson_gemm(ctx.arch, ctx.smem_budget))
        else:
            ctx.log("(needs a GPU: skipped in compile-only mode)")
        ctx.log("\n== 4. Watching the lowering: IR after every pass, pass configs, environment variables ==")
        show_lowering(ctx, *trace.result())
    ctx.headline(arch=ctx.arch, skipped="none" if gpu else "device printing (1), profiler (3)")


SECTION = tourkit.Section(
    name="debugging",
    title="Debugging and looking inside kernels",
    summary="T.print captured from the device, instruction markers sm_80 vs sm_90a, the profiler, IR per pass.",
    run=run,
    needs_gpu=True,
    kernels=kernels,
)
