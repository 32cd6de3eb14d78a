"""debugging: look inside a TileLang kernel, from printed values to the generated instructions.

What you learn, in four parts:

1. `T.print` prints from inside a running kernel: a shared-memory tile, a register fragment, and a
   scalar guarded to one thread. CUDA's device printf is written by the driver to the process's C-level
   stdout (file descriptor 1), not to Python's `sys.stdout`: a notebook never shows it. We catch it by
   redirecting the descriptor itself (`tourkit.capture_fd_output`) and check the printed values.
2. What TileLang generated for the GEMM and FlashAttention kernels: instruction markers counted in the
   CUDA source, side by side for sm_80 (Ampere: cp.async, ldmatrix, mma.sync) and sm_90a (Hopper: TMA,
   mbarrier, wgmma), and for the GPU you run on. On Hopper TileLang splits the block into a producer
   warpgroup that issues the copies and consumer warpgroups that do the math, so the kernel launches more
   threads than the program asked for.
3. TileLang's built-in profiler on one kernel: `kernel.get_profiler()`, `assert_allclose`, `do_bench`.
4. How to watch the lowering: every pass that ran and what it changed (a TVM `DumpIR` instrument, the
   same one the `tl.enable_dump_ir` pass config installs), the pass configs and environment variables
   for tracing, and how to see the generated source.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import os
import re
import shutil
import tempfile

import tilelang
import tilelang.language as T

import tourkit
from sections.gemm_schedules import GemmConfig, default_schedules, fits, gemm_flops, gemm_program
from tourkit import ARCH_SPECS, Section

# ---------------------------------------------------------------------------------------------------------
# Part 1: printing from the device
# ---------------------------------------------------------------------------------------------------------

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
    found = []
    for match in _DEVICE_PRINT.finditer(text):
        found.append({
            "msg": match["msg"],
            "block": tuple(int(v) for v in match["block"].split(",")),
            "thread": tuple(int(v) for v in match["thread"].split(",")),
            "buffer": match["buffer"],
            "index": None if match["index"] is None else int(match["index"]),
            "dtype": match["dtype"],
            "value": float(match["value"]),
        })
    return found


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


def run_device_print(ctx) -> None:
    import torch

    kernel = tilelang.compile(print_demo_program(), out_idx=None, target="cuda")
    # Quarters are exact in float32 and in printf's %f, so the printed text can be compared exactly.
    x = (torch.arange(PRINT_ROWS * PRINT_COLS, device="cuda", dtype=torch.float32) / 4 - 2).reshape(PRINT_ROWS, PRINT_COLS)
    y = torch.empty_like(x)
    with tourkit.capture_fd_output() as printed:
        # validate() poisons Y, launches, and synchronizes: device printf reaches the host at a synchronization.
        check = tourkit.validate("print_demo Y = 2X", lambda: kernel(x, y), y, 2 * x.double(), 1e-6)
    prints = parse_device_prints(printed.text)
    ctx.log(f"captured {len(prints)} device-printed lines from file descriptor 1, for example:")
    for msg in ("shared tile", "fragment x2", "scalar"):
        sample = next((ln for ln in printed.text.splitlines() if f"msg='{msg}'" in ln), f"(no line for {msg!r})")
        ctx.log("  " + sample)
    problems = check_device_prints(prints, x.flatten().tolist())
    ctx.log(check.line())
    ctx.metric(device_print_lines=len(prints))
    if problems:
        raise tourkit.ValidationError("T.print: " + "; ".join(problems))
    ctx.log("printed values match the input (shared tile = X, fragment = 2X, scalar = one line from thread 0)")
    tourkit.require([check])


def show_print_codegen(ctx, arch: str) -> None:
    """Compile-only: what T.print became in the CUDA source."""
    report = tourkit.inspect_kernel("print_demo", print_demo_program(), arch)
    lines = [ln.strip() for ln in report.source.splitlines() if "debug_print" in ln]
    ctx.log(f"T.print in the CUDA source for {arch} ({report.nvcc}): calls into TileLang's debug.h printf helpers")
    for line in lines:
        ctx.log("  " + line)
    if len(lines) < 3:
        raise tourkit.ValidationError(f"expected 3 debug_print calls in print_demo's source, found {len(lines)}")


# ---------------------------------------------------------------------------------------------------------
# Part 2: what TileLang generated, per architecture
# ---------------------------------------------------------------------------------------------------------

MARKER_GEMM_SIZE = 4096
# The markers the tables show, in order, and the arches always compared side by side.
TABLE_MARKERS = ["mma_sync", "wgmma", "cp_async", "tma_load", "ldmatrix", "__syncthreads", "mbarrier",
                 "rasterization"]
COMPARED_ARCHES = ["sm_80", "sm_90a"]


def gemm_schedule_for(arch: str, smem_budget: int | None = None) -> GemmConfig:
    """The first of the tour's hand-picked GEMM schedules for the arch that fits the shared memory and that
    TileLang pipelines itself (kernel="tilelang"): the lesson shows what TileLang's passes do, and the
    hand-written warp-specialized kernel (kernel="ws") does their work by hand."""
    spec = ARCH_SPECS[arch]
    budget = spec.smem_per_block_optin if smem_budget is None else smem_budget
    for config in default_schedules(spec.family):
        if fits(config, budget) and config.kernel == "tilelang":
            return config
    raise ValueError(f"no GEMM schedule for {arch} fits {budget} B of shared memory")


def marker_kernels(arch: str) -> list[tuple[str, object, int]]:
    """(name, prim_func, threads the program asked for) of the kernels whose generated code we inspect."""
    size = MARKER_GEMM_SIZE
    gemm_config = gemm_schedule_for(arch)
    kernels = [("gemm " + gemm_config.label(), gemm_program(size, size, size, gemm_config), gemm_config.threads)]
    kernels += flash_attention_kernels()
    return kernels


FLASH_SHAPE = dict(batch=1, heads=8, seq_len=1024, dim=128, causal=False)
FLASH_THREADS = 256


def flash_attention_kernels() -> list[tuple[str, object, int]]:
    """The flash_attention section's forward kernel (its builder's default tiles), if that module is there."""
    try:
        from sections.flash_attention import flash_attention_forward
    except ImportError:  # the table then shows the GEMM alone
        return []
    func = flash_attention_forward(**FLASH_SHAPE, threads=FLASH_THREADS)
    return [(f"flash_attention d{FLASH_SHAPE['dim']}", func, FLASH_THREADS)]


def inspect_arches(ctx) -> list[str]:
    """The running GPU's arch (or the --arch of a compile-only run) first, then sm_80 and sm_90a."""
    arches = [ctx.arch]
    return arches + [a for a in COMPARED_ARCHES if a not in arches]


def inspect_all(arches: list[str], nvcc_arches: list[str] | None = None) -> dict[str, list[tourkit.KernelReport]]:
    """Lower every (kernel, arch) at once (tourkit.inspect_kernels); nvcc-compile those of `nvcc_arches`
    (default: all). The markers come from the lowered source; nvcc proves the source builds."""
    nvcc_arches = arches if nvcc_arches is None else nvcc_arches
    jobs = [(name, func, arch) for arch in arches for name, func, _ in marker_kernels(arch)]
    compiled = tourkit.inspect_kernels([job for job in jobs if job[2] in nvcc_arches])
    lowered = tourkit.inspect_kernels([job for job in jobs if job[2] not in nvcc_arches], nvcc=False)
    done = [(compiled if job[2] in nvcc_arches else lowered).pop(0) for job in jobs]
    return {arch: [rep for (_, _, a), rep in zip(jobs, done) if a == arch] for arch in arches}


def requested_threads(arches: list[str]) -> dict[tuple[str, str], int]:
    return {(arch, name): threads for arch in arches for name, _, threads in marker_kernels(arch)}


def kernel_kind(report: tourkit.KernelReport) -> str:
    return {"flash_attention": "flash_attn"}.get(report.name.split()[0], report.name.split()[0])


def marker_table(reports: dict[str, list[tourkit.KernelReport]], running_arch: str, asked: dict) -> tuple[list, list]:
    """Rows: markers (and the launch shape); columns: kernel x arch; plus what each marker means."""
    # Column order: each kernel on every arch side by side.
    count = min(len(reps) for reps in reports.values())
    columns = [(arch, reps[i]) for i in range(count) for arch, reps in reports.items()]
    headers = ["marker"] + [f"{kernel_kind(rep)} {arch}{'*' if arch == running_arch else ''}" for arch, rep in columns]
    headers.append("what it is")
    rows = []
    for marker in TABLE_MARKERS:
        rows.append([marker] + [rep.markers.get(marker, 0) for _, rep in columns] + [tourkit.MARKERS[marker][1]])
    rows.append(["threads launched"] + [rep.threads for _, rep in columns] + ["threads per block in the launch"])
    rows.append(["threads asked"] + [asked[(arch, rep.name)] for arch, rep in columns] + ["threads=... in T.Kernel"])
    rows.append(["shared memory"] + [tourkit.format_bytes(rep.smem_bytes) for _, rep in columns] + ["per block"])
    rows.append(["nvcc"] + [rep.nvcc.split(":")[0] for _, rep in columns] + ["nvcc -arch=... on the source"])
    return headers, rows


def expected_markers(arch: str, kind: str) -> list[str]:
    """What a tensor-core kernel must contain on each architecture family."""
    if ARCH_SPECS[arch].family == "hopper":
        return ["wgmma", "tma_load", "mbarrier"]
    if ARCH_SPECS[arch].family in ("ampere", "ada"):
        return ["mma_sync", "cp_async", "ldmatrix"]
    return ["mma_sync"]


def show_markers(ctx) -> dict[str, list[tourkit.KernelReport]]:
    arches = inspect_arches(ctx)
    # With a GPU, nvcc builds the running arch's kernels (the others are only lowered: seconds saved);
    # in a compile-only run, every arch's.
    reports = inspect_all(arches, None if ctx.compile_only else [ctx.arch])
    asked = requested_threads(arches)
    headers, rows = marker_table(reports, ctx.arch, asked)
    where = "this GPU" if ctx.has_gpu and not ctx.compile_only else "the --arch of this compile-only run"
    ctx.log(f"Instruction markers counted in the generated CUDA source (* = {where}):")
    ctx.table(headers, rows)
    for arch, reps in reports.items():
        for rep in reps:
            asked_threads = asked[(arch, rep.name)]
            if rep.threads != asked_threads:
                ctx.log(f"note: {rep.name} on {arch} launches {rep.threads} threads, the program asked for "
                        f"{asked_threads}: warp specialization added {rep.threads - asked_threads} producer "
                        f"threads ({(rep.threads - asked_threads) // 32} warps) that issue the TMA copies.")
    gemm_here = reports[ctx.arch][0]
    excerpt = tourkit.source_excerpt(gemm_here.source, r"tl::(wgmma_\w+|mma_sync)<", context=0, limit=1)
    if excerpt:
        ctx.log(f"the tensor-core call in {gemm_here.name}'s CUDA source for {ctx.arch} (M, N, K of one instruction "
                f"among its template arguments):")
        for line in excerpt.splitlines():
            line = line.strip()
            ctx.log("  " + (line if len(line) <= 110 else line[:109] + "…"))
    ctx.metric(markers={f"{rep.name} {arch}": rep.summary() for arch, reps in reports.items() for rep in reps})
    for arch, reps in reports.items():
        for rep in reps:
            tourkit.require_markers(rep, expected_markers(arch, kernel_kind(rep)))
    return reports


# ---------------------------------------------------------------------------------------------------------
# Part 3: TileLang's own profiler
# ---------------------------------------------------------------------------------------------------------


def run_profiler(ctx) -> None:
    import torch

    size = 1024 if ctx.quick else 4096
    config = gemm_schedule_for(ctx.arch, ctx.smem_budget)
    # out_idx=[2]: the kernel allocates C and returns it, which is what the profiler expects.
    kernel = tilelang.compile(gemm_program(size, size, size, config), out_idx=[2], target="cuda")
    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Normal)

    def reference(a, b):
        return (a.float() @ b.float()).half()

    # assert_allclose draws inputs for the kernel's parameters, runs both programs and compares.
    profiler.assert_allclose(reference, rtol=1e-2, atol=1e-2)
    ctx.log(f"profiler.assert_allclose(reference, rtol=1e-2, atol=1e-2): passed for gemm {size}^3 {config.label()}")
    # The same check through the kit, to print a relative error.
    a = tourkit.random_tensor((size, size), torch.float16, seed=1)
    b = tourkit.random_tensor((size, size), torch.float16, seed=2)
    c = torch.empty(size, size, dtype=torch.float16, device="cuda")
    check = tourkit.validate("gemm via kernel(a, b)", lambda: c.copy_(kernel(a, b)), c, a.double() @ b.double(), 2e-3)
    ctx.log(check.line())
    tourkit.require([check])

    # do_bench: CUDA events around each call, L2 flushed between calls; the mean in ms by default.
    tl_ms = profiler.do_bench(warmup=25, rep=100)
    torch_ms = profiler.do_bench(lambda a, b: torch.matmul(a, b), warmup=25, rep=100)
    kit_ms = tourkit.bench_ms(lambda: kernel(a, b))
    flops = gemm_flops(size, size, size)
    ctx.table(["timed by", "kernel", "ms", "TFLOP/s"], [
        ["profiler.do_bench() (mean)", "TileLang gemm", tl_ms, tourkit.tflops(flops, tl_ms)],
        ["profiler.do_bench(torch.matmul)", "cuBLAS", torch_ms, tourkit.tflops(flops, torch_ms)],
        ["tourkit.bench_ms (median)", "TileLang gemm", kit_ms, tourkit.tflops(flops, kit_ms)],
    ])
    ratio = tourkit.speedup(torch_ms, tl_ms)
    ctx.log(f"TileLang / cuBLAS through the same profiler: {ratio:.2f}x")
    ctx.metric(profiler_gemm_size=size, profiler_tilelang_ms=tl_ms, profiler_torch_ms=torch_ms,
               profiler_kit_ms=kit_ms, profiler_vs_torch=ratio, profiler_rel_error=check.rel_error)
    ctx.headline(profiler_vs_cublas=round(ratio, 2))


# ---------------------------------------------------------------------------------------------------------
# Part 4: watching the lowering
# ---------------------------------------------------------------------------------------------------------

# (name, how to set it, what it does); the table shows which of them this tilelang knows.
DEBUG_ENV_VARS = [
    ("TILELANG_PRINT_ON_COMPILATION", "1", "log 'begins/completes to compile kernel' (on by default)"),
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
    rows = []
    for name, how, what in DEBUG_ENV_VARS:
        value = os.environ.get(name, "(unset)") if name in known_keys else "(not in this version)"
        rows.append([f"{name}={how}", value, what])
    return rows


def known_pass_configs() -> list[list[str]]:
    values = {v for k, v in vars(tilelang.PassConfigKey).items() if not k.startswith("_")}
    values = {getattr(v, "value", v) for v in values}
    return [[f"{key}: {how}", "yes" if key in values else "not in this version", what]
            for key, how, what in DEBUG_PASS_CONFIGS]


BIG_STEP_LINES = 5  # passes that grow or shrink the IR by at least this many lines are listed


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


def show_lowering(ctx) -> None:
    arch = ctx.arch
    config = gemm_schedule_for(arch)
    func = gemm_program(1024, 1024, 1024, config)
    ctx.log(f"The program before lowering (func.script(), first lines), gemm {config.label()}:")
    for line in func.script().splitlines()[:6]:
        ctx.log("  " + line)
    dump_dir = tempfile.mkdtemp(prefix="tilelang_dump_ir_")
    try:
        steps = trace_lowering(func, arch, dump_dir)
    finally:
        shutil.rmtree(dump_dir, ignore_errors=True)
    changed = [s for s in steps if s["changed"]]
    ctx.log(f"Lowering for {arch}: {len(steps)} passes ran (one IR file each, e.g. {steps[1]['file']}), "
            f"{len(changed)} changed the IR. The big steps (IR length in lines, before -> after):")
    rows, before = [], len(func.script().splitlines())
    for step in steps:
        if abs(step["lines"] - before) >= BIG_STEP_LINES:
            rows.append(f"{step['pass']} {before}->{step['lines']}")
        before = step["lines"]
    for start in range(0, len(rows), 4):
        ctx.log("  " + ",  ".join(rows[start:start + 4]))
    key_pass = "tl.LowerTileOp"
    after = next((s for s in steps if s["pass"] == key_pass), None)
    if after is not None:
        excerpt = tourkit.source_excerpt(after["ir"], r"tma_load|cp_async", context=1, limit=3)
        if excerpt:
            ctx.log(f"after {key_pass} a T.copy has become explicit copy instructions:")
            for line in excerpt.splitlines():
                line = line.strip()
                ctx.log("  " + (line if len(line) <= 110 else line[:109] + "…"))
    ctx.log("")
    ctx.log("To do this yourself:")
    ctx.table(["environment variable", "here", "what it does"], known_env_vars())
    ctx.table(["pass config (tilelang.compile(..., pass_configs={...}))", "known", "what it does"],
              known_pass_configs())
    ctx.log("and kernel.get_kernel_source() / tilelang.lower(func, target=...).kernel_source for the CUDA source.")
    ctx.metric(lowering_passes=len(steps), lowering_passes_changed=len(changed))
    if len(steps) < 20 or not changed:
        raise tourkit.ValidationError(f"lowering trace looks wrong: {len(steps)} passes, {len(changed)} changed")


# ---------------------------------------------------------------------------------------------------------
# The section
# ---------------------------------------------------------------------------------------------------------


def run(ctx) -> None:
    gpu = ctx.has_gpu and not ctx.compile_only
    ctx.log("== 1. T.print: printing from the device ==")
    if gpu:
        run_device_print(ctx)
    else:
        show_print_codegen(ctx, ctx.arch)
        ctx.log("(running it and capturing the printed values needs a GPU: skipped in compile-only mode)")
    ctx.log("")
    ctx.log("== 2. What TileLang generated: instruction markers per architecture ==")
    show_markers(ctx)
    ctx.log("")
    ctx.log("== 3. The built-in profiler: get_profiler(), assert_allclose, do_bench ==")
    if gpu:
        run_profiler(ctx)
    else:
        ctx.log("(needs a GPU: skipped in compile-only mode)")
    ctx.log("")
    ctx.log("== 4. Watching the lowering: IR after every pass, pass configs, environment variables ==")
    show_lowering(ctx)
    skipped = [] if gpu else ["device printing (1)", "profiler (3)"]
    ctx.headline(arch=ctx.arch, skipped=", ".join(skipped) or "none")


SECTION = Section(
    name="debugging",
    title="Debugging and looking inside kernels",
    summary="T.print captured from the device, instruction markers sm_80 vs sm_90a, the profiler, IR per pass.",
    run=run,
    needs_gpu=True,
)
