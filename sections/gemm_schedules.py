"""gemm_schedules: a fast fp16/bf16 tensor-core GEMM in about forty lines of TileLang, timed against cuBLAS.

You will learn:
- how a block owns one tile of C, and walks K in steps whose A and B tiles are copied to shared memory
  (`T.copy`) while the tensor cores (`T.gemm`) work on earlier steps (`T.Pipelined`);
- why the accumulator lives in registers (`T.alloc_fragment`) and C leaves once, through shared memory;
- how the schedule (tile size, pipeline stages, threads, block order) decides the speed, in a small table;
- what TileLang makes of it: cp.async + ldmatrix + mma.sync on Ampere/Ada; TMA + mbarriers + wgmma with a
  producer warpgroup on Hopper (sm_90a), where the appendix's hand-written kernel (sections/hopper/gemm_ws.py)
  is timed beside it: what the compiler's pipeline gives, and what warp specialization by hand adds;
- how to choose a schedule for any problem (`--shape MxNxK`, `--dtype bfloat16`; sections/gemm_plans.py):
  count the tiles against the SMs. 2000x3000x4000 in 128x256 tiles is 192 blocks, 1.45 waves of 132 (the
  second half empty); 256x192 tiles (three consumer warpgroups) make 128 blocks, 0.97 waves. A skinny problem
  (64x8192x8192) takes 64-row tiles, and where even those are few a split K: block z sums its run of K into
  fp32 partials, which `splitk_reduce_program` adds, or the tile's last block to finish (`last_adds`). A
  tall, narrow one (1000000x64x64) takes 256x64 tiles, no columns of zeros. A K loop of one or two steps has
  nothing to pipeline: on Hopper it drops TileLang's producer warpgroup (`gemm_pass_configs`), so two blocks
  share an SM. A plain GEMM of more 128x256 tiles than SMs walks them persistently (`persistent_body`): one
  block an SM, tiles x K steps in one `T.Pipelined` loop, each tile's first loads in flight during the last
  one's store. `choose_schedule` estimates each candidate (waves x a block's math or loads, against streaming
  the operands once) and says why; the pick is timed beside its runner-up;
- that T.copy takes rows of any length: unaligned ones (N or K not a multiple of 8) load with narrower,
  masked copies instead of TMA, which small and few-row problems prefer to padding copies (`plan_problem`); and
  that rows starting off 32-byte sectors (N = 1000) load slower than N = 1024: big problems copy B first;
- when not to use the tensor cores: with A of one or two rows (decoding), or up to 8 unaligned ones, a GEMM
  only streams B, and on Hopper the rule takes a CUDA-core kernel written thread by thread (sections/gemm_rows.py).

The algorithm, one thread block per C tile:

    for each block_M x block_N tile of C (in swizzled order):
        acc = 0                                  # fp32, in registers
        for k in range(ceil(K / block_K)):       # pipelined: the copies of step k+1.. fly during step k
            A_s = A[tile rows, k-th slice]       # global -> shared
            B_s = B[k-th slice, tile columns]
            acc += A_s @ B_s                     # tensor cores
        C[tile] = fp16(acc)                      # registers -> shared -> global

The L2 swizzle. At 8192^3 with 128x256 tiles C has 64 x 32 = 2048 tiles, one block each. A GPU runs them in
waves (132 at a time on an H100/H200). Launched row by row, one wave covers 4.1 rows of tiles: it reads 5
row panels of A (128 x 8192, 2 MiB each) and all 32 column panels of B (8192 x 256, 4 MiB each), 138 MiB.
`T.use_swizzle(panel_size=10)` orders the blocks down panels of 10 tile rows: a wave covers 10 rows x 14
columns and reads 10 x 2 + 14 x 4 = 76 MiB, so more of each wave's loads hit in L2 (the table's swizzle-off
row shows what that is worth; `wave_traffic` computes these numbers for the section's shape).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import replace

import tilelang
import tilelang.language as T

import tourkit
from sections.gemm_epilogue import epilogue_macro, last_arrival_macro
from sections.gemm_plans import (MAX_GRID_Y, PART_THREADS, PRODUCER_REGISTERS, WARP_POLICIES, GemmConfig, GemmLauncher,  # noqa: F401
                                 GemmPlan, check_problem, consumer_registers, fits, gemm_bytes, gemm_flops, gemm_pass_configs,
                                 gemm_prim_func, lesson_schedules, persistent_schedule, plan_problem, rivals, wave_traffic)
from tourkit import KernelDecl, Section, SectionSkip

# ---- The schedule: a GemmConfig (sections/gemm_plans.py), chosen per problem by choose_schedule ----------

def gemm_program(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", accum_dtype: str = "float32", b_cols: int = 0, c_cols: int = 0):
    """C = activation(A @ B + Bias) over A[M, K], B[K, N], (Bias[N],) C[M, N]: T.Pipelined + T.gemm.
    With config.split_k > 1, block z of the grid takes the z-th run of K steps and C is W[split_k, M, N],
    fp32 partials that gemm_plans.splitk_reduce_program adds up (and applies the epilogue to), or with
    config.last_adds the tile's last block to finish (one launch: body(A, B, Bias, W, Arrivals, Sum)).
    b_cols: B arrives in rows padded to b_cols >= N columns (GemmPlan.pad_b); c_cols: last_adds' C's own N."""
    check_problem(M, N, K, activation, dtype, aligned_rows=False)
    if config.policy not in WARP_POLICIES:
        raise ValueError(f"warp policy {config.policy!r} is not one of {WARP_POLICIES}")
    bM, bN, bK, splits = config.block_M, config.block_N, config.block_K, config.split_k
    policy = getattr(T.GemmWarpPolicy, config.policy)
    steps = T.ceildiv(T.ceildiv(K, bK), splits)  # K steps of one block (the last run may read past K: zeros)
    out_dtype = "float32" if splits > 1 else dtype
    epilogue = epilogue_macro(bM, bN, bias, activation)  # bias and GELU on the accumulator (the fusion lesson)
    last_adds = config.last_adds and splits > 1
    m_tiles, n_tiles = -(-M // bM), -(-N // bN)
    add_if_last = last_arrival_macro(bM, bN, M, N, splits, epilogue, config.threads)

    @T.macro
    def tile(A, B, Bias, C, A_shared, B_shared, C_local, Bias_shared, C_shared, bx, by, bz, Arrivals, Sum):
        """One block_M x block_N tile of C (rows by, columns bx), over the bz-th run of K steps."""
        if bias:
            T.copy(Bias[bx * bN], Bias_shared)
        T.clear(C_local)
        # num_stages buffers of A and B: the copies for step k + num_stages - 1 fly while step k computes.
        for k in T.Pipelined(steps, num_stages=config.num_stages):
            T.copy(A[by * bM, (bz * steps + k) * bK], A_shared)
            T.copy(B[(bz * steps + k) * bK, bx * bN], B_shared)
            T.gemm(A_shared, B_shared, C_local, policy=policy)

        if last_adds:  # plain stores (a fence covers them, not TMA's); the tile's last block adds the runs
            T.copy(C_local, C[bz, by * bM, bx * bN])
            add_if_last(C, Arrivals, Sum, C_local, Bias_shared, by * n_tiles + bx, by * bM, bx * bN)
        else:
            epilogue(C_local, Bias_shared)
            out = C[by * bM, bx * bN] if splits == 1 else C[bz, by * bM, bx * bN]
            if config.staged_store:  # registers -> shared -> global: coalesced stores (TMA on Hopper)
                T.copy(C_local, C_shared)
            T.copy(C_shared if config.staged_store else C_local, out)

    @T.macro
    def buffers():
        A_shared = T.alloc_shared((bM, bK), dtype)
        B_shared = T.alloc_shared((bK, bN), dtype)
        C_local = T.alloc_fragment((bM, bN), accum_dtype)  # the accumulator: registers, never global
        Bias_shared = T.alloc_shared((bN,), dtype) if bias else None
        C_shared = T.alloc_shared((bM, bN), out_dtype) if config.staged_store else None
        return A_shared, B_shared, C_local, Bias_shared, C_shared

    @T.macro
    def registers():
        if config.threads > 256:  # Hopper: say how the 64K registers split (TileLang warns otherwise)
            T.annotate_producer_reg_dealloc(PRODUCER_REGISTERS)
            T.annotate_consumer_reg_alloc(consumer_registers(config.threads))

    rows_along_x = m_tiles > MAX_GRID_Y  # a grid's y axis takes at most 65535 blocks: more rows go along x

    @T.macro
    def body(A, B, Bias, C, Arrivals=None, Sum=None):
        grid = (m_tiles, n_tiles) if rows_along_x else (n_tiles, m_tiles)
        with T.Kernel(*grid, splits, threads=config.threads) as (gx, gy, bz):
            bx, by = (gy, gx) if rows_along_x else (gx, gy)
            A_shared, B_shared, C_local, Bias_shared, C_shared = buffers()
            registers()
            T.use_swizzle(panel_size=config.panel, enable=config.swizzle)
            tile(A, B, Bias, C, A_shared, B_shared, C_local, Bias_shared, C_shared, bx, by, bz, Arrivals, Sum)

    tiles, workers = m_tiles * n_tiles, min(config.persistent, m_tiles * n_tiles)
    panel = min(config.panel if config.swizzle else 1, m_tiles)
    k_steps = T.ceildiv(K, bK)

    @T.macro
    def persistent_body(A, B, Bias, C):
        """`workers` blocks, block w taking tiles w, w + workers, ... (swizzled: down panels of `panel` tile
        rows), all its tiles' K steps in one pipelined loop: the next tile's loads fly during this one's store."""
        with T.Kernel(workers, threads=config.threads) as w:
            A_shared, B_shared, C_local, Bias_shared, C_shared = buffers()
            registers()
            for step in T.Pipelined(T.ceildiv(tiles - w, workers) * k_steps, num_stages=config.num_stages):
                t, k = step // k_steps * workers + w, step % k_steps
                by, bx = tile_of(t, m_tiles, n_tiles, panel, T.min, T.max)
                T.copy(A[by * bM, k * bK], A_shared)
                T.copy(B[k * bK, bx * bN], B_shared)
                T.gemm(A_shared, B_shared, C_local, policy=policy, clear_accum=k == 0)
                if k == k_steps - 1:
                    if bias:
                        T.copy(Bias[bx * bN], Bias_shared)
                    epilogue(C_local, Bias_shared)
                    T.copy(C_local, C_shared)
                    T.copy(C_shared, C[by * bM, bx * bN])

    c_shape = (M, N) if splits == 1 else (splits, M, N)
    if config.persistent and splits > 1:
        raise ValueError("a persistent schedule walks whole K loops: no split K")
    return gemm_prim_func(M, N, K, persistent_body if config.persistent else body, bias, dtype, c_shape, out_dtype,
                          b_cols, counts=m_tiles * n_tiles if last_adds else 0, c_cols=c_cols)


def tile_of(t, m_tiles: int, n_tiles: int, panel: int, lo=min, hi=max):
    """(tile row, tile column) of a persistent block's t-th tile: down panels of `panel` tile rows, column by
    column (the L2 swizzle), the last panel shorter. lo/hi: min/max, or T.min/T.max inside a kernel."""
    rows = hi(1, lo(panel, m_tiles - t // (panel * n_tiles) * panel))
    return t // (panel * n_tiles) * panel + t % (panel * n_tiles) % rows, t % (panel * n_tiles) // rows


def compile_gemm(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", pass_configs: dict | None = None):
    """Compile for the local GPU. The kernel writes into the caller's C: kernel(a, b, c) / kernel(a, b, bias, c)."""
    func = gemm_program(M, N, K, config, bias=bias, activation=activation, dtype=dtype)
    configs = {**gemm_pass_configs(config, activation), **(pass_configs or {})}
    return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=configs)


# ---- The PyTorch reference and the check ---------------------------------------------------------------

TOLERANCE = 5e-3  # fp16/bf16 output: one rounding on top of fp32 accumulation in another order
ODD_SHAPES = [(1000, 1000, 1000), (1001, 1032, 1000), (77, 1001, 999)]  # tails; skinny with N, K unaligned


def gemm_inputs(M: int, N: int, K: int, *, seed: int = 0, dtype: str = "float16"):
    import torch

    dt = getattr(torch, dtype)
    a = tourkit.random_tensor((M, K), dt, seed=seed)
    b = tourkit.random_tensor((K, N), dt, seed=seed + 1)
    return a, b, torch.empty((M, N), dtype=dt, device="cuda")


def reference(a, b, bias=None, activation=None):
    """The same computation in float32 (no TF32) from the same fp16/bf16 inputs."""
    import torch

    prev, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        out = a.float() @ b.float() + (0 if bias is None else bias.float())
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    return out if activation is None else torch.nn.functional.gelu(out, approximate=approximate)


# ---- The kernels this section builds, declared once ----------------------------------------------------


def sm_count(ctx) -> int:
    """The GPU's SM count (the rule's waves, the appendix's persistent grid); 132 (H100/H200) with no GPU."""
    return ctx.device.sm_count if ctx.device is not None else 132


def rule(ctx, M: int, N: int, K: int, epilogue: bool = False) -> GemmPlan:
    """The schedule gemm_plans.choose_schedule picks for a problem on this GPU, with its reason."""
    return plan_problem(M, N, K, tourkit.ARCH_SPECS[ctx.arch].family, sm_count(ctx), ctx.smem_budget, ctx.dtype,
                        epilogue)


def appendix_plan(ctx, M: int, N: int, K: int):
    """The appendix's hand-written kernel (sm_90a, rows aligned) as a GemmPlan, or None."""
    if ctx.arch != "sm_90a" or N % 8 or K % 8:
        return None
    from sections.hopper import gemm_ws  # it imports this module
    return GemmPlan(M, N, K, gemm_ws.appendix_schedule(M, N, K, sm_count(ctx)), ctx.dtype, "the appendix")


def plan(ctx):
    """(the plans timed at the section's problem, the appendix's plan or None, the plans only checked).
    The tour's own problem times the lesson's schedules; a user's (--shape) the rule's pick, its runner-up
    with another tile and the lesson's default, the fastest of which the section reports (`timed_choice`)."""
    if ctx.shape is not None:
        pick = rule(ctx, *ctx.shape)
        rows = [pick] + rivals(pick, tourkit.ARCH_SPECS[ctx.arch].family, sm_count(ctx), ctx.smem_budget)
        return list(dict.fromkeys(rows)), appendix_plan(ctx, *ctx.shape), []
    size = 2048 if ctx.quick or ctx.compile_only else 8192
    family = tourkit.ARCH_SPECS[ctx.arch].family
    configs = [c for c in lesson_schedules(family) if fits(c, ctx.smem_budget)]
    walk = persistent_schedule(size, size, size, family, sm_count(ctx), ctx.smem_budget, epilogue=False)
    rows = [GemmPlan(size, size, size, c, ctx.dtype) for c in configs + ([walk] if walk else [])]
    odd = [rule(ctx, *shape) for shape in ODD_SHAPES]
    ws = appendix_plan(ctx, size, size, size)
    return rows, ws, odd + ([replace(ws, M=ODD_SHAPES[1][0], N=ODD_SHAPES[1][1], K=ODD_SHAPES[1][2])] if ws else [])


def kernel_name(p: GemmPlan, part: str = "gemm") -> str:
    dtype = "" if p.dtype == "float16" else f" {p.dtype}"
    return f"{p.label()} @{p.M}x{p.N}x{p.K}{dtype}" + ("" if part == "gemm" else f" ({part})")


def kernels(ctx) -> list[KernelDecl]:
    """Every program of the timed plans, the appendix's and the checked ones. Compile-only runs nvcc on the
    first timed plan, the first checked one and the appendix's, and only lowers the rest."""
    markers = tuple(tourkit.tensor_core_markers(ctx.arch))
    rows, ws, odd = plan(ctx)
    jobs = [(p, i == 0) for i, p in enumerate(rows)] + [(p, i == 0) for i, p in enumerate(odd)]
    jobs += [(ws, True)] if ws else []
    return [KernelDecl(kernel_name(p, part), (lambda p=p, part=part: p.programs()[part]), nvcc=nvcc,
                       pass_configs=p.pass_configs(part),
                       markers=p.markers(markers) if part == "gemm" else (), smem_limit=p.config.smem_bytes(),
                       threads=getattr(p.config, "block_threads", p.config.threads) if part == "gemm" else PART_THREADS[part])
            for p, nvcc in dict.fromkeys(jobs) for part in sorted(p.parts, key=lambda q: q != "gemm")]  # GEMM first


def timed_choice(rows: list, best: GemmPlan, ms: dict) -> str:
    """--shape: the estimates of neighbouring candidates are close calls, so the rule's pick is timed in turns
    with its runner-up and the lesson's default; the fastest (ms: a median per plan) is the problem's schedule."""
    gain = ms[rows[0]] / ms[best]
    return (f"timed beside {len(rows) - 1} other schedule(s), the rule's pick was the fastest: it stays" if best == rows[0]
            else f"timed in turns, {best.label()} ran {gain:.2f}x the speed of the rule's pick: it is this "
                 f"problem's schedule")


def launcher(built: dict, p: GemmPlan) -> GemmLauncher:
    """The plan's kernels as one call, launcher(a, b, c): pads, split-K partials and reduction included."""
    return GemmLauncher(p, {part: built[kernel_name(p, part)] for part in p.parts if kernel_name(p, part) in built})


# ---- The benchmark and the report ----------------------------------------------------------------------

TABLE = ["kernel", "tile (MxNxK)", "stages", "threads", "swizzle", "policy", "smem", "ms", "TFLOP/s", "vs cuBLAS"]
ROUNDS = 6  # three forward/backward pairs (tourkit.bench_interleaved)


def table_row(p: GemmPlan, ms: float, cublas_ms: float, flops: int) -> list:
    c, pad = p.config.columns(), f", B in {p.b_width}-column rows" if p.pad_b else ""
    return [c["kernel"] + pad, c["tile"], c["stages"], c["threads"], c["swizzle"], c["policy"], tourkit.format_bytes(
        p.config.smem_bytes()), f"{ms:.3f}", f"{tourkit.tflops(flops, ms):.0f}", f"{tourkit.speedup(cublas_ms, ms):.3f}x"]


def time_against_cublas(M: int, N: int, K: int, contenders: dict, rounds: int, dtype: str = "float16"):
    """{label: kernel(a, b, c)} validated against a float32 reference on fresh random inputs, then timed in
    turns with cuBLAS. Returns each label's median ms, cuBLAS's ms and the relative errors."""
    import torch

    a, b, c = gemm_inputs(M, N, K, dtype=dtype)
    ref, c_cublas = reference(a, b), torch.empty_like(c)
    checks = {label: tourkit.validate(label, lambda k=k: k(a, b, c), c, ref, TOLERANCE) for label, k in contenders.items()}
    tourkit.require(checks.values())
    fns = {"cuBLAS": lambda: torch.matmul(a, b, out=c_cublas)}
    fns.update({label: (lambda k: lambda: k(a, b, c))(k) for label, k in contenders.items()})
    ms = tourkit.bench_interleaved(fns, rounds=rounds)
    errors = {label: check.rel_error for label, check in checks.items()}
    errors["cuBLAS"] = tourkit.relative_error(c_cublas, ref)
    return ms, ms.pop("cuBLAS"), errors


def record_timings(ctx, timed: list, ms: dict, cublas_ms: float, ws) -> None:
    """For the plots: each schedule and cuBLAS with its FLOPs and the bytes a GEMM must move at least."""
    M, N, K = timed[0].M, timed[0].N, timed[0].K
    size = dict(flops=gemm_flops(M, N, K), nbytes=gemm_bytes(M, N, K), problem=f"{M}x{N}x{K}")
    for p in timed:
        ctx.timing(p.label(), ms[kernel_name(p)], kind="appendix" if p == ws else "lesson", **size)
    ctx.timing("cuBLAS", cublas_ms, kind="pytorch", **size)


def check_odd_shapes(ctx, built: dict, plans) -> None:
    """Sizes that are not multiples of the tile (TMA / predicated copies handle the ragged edges), and a
    skinny one whose rows are not 16-byte aligned (zero-padded copies, or masked loads where the copies would
    cost more: plan_problem), each on the rule's schedule."""
    checks = []
    for p in plans:
        a, b, c = gemm_inputs(p.M, p.N, p.K, seed=7, dtype=p.dtype)
        run = launcher(built, p)
        checks.append(tourkit.validate(kernel_name(p), lambda: run(a, b, c), c, reference(a, b), TOLERANCE))
        ctx.log(checks[-1].line() + (f"\n    rule: {p.describe()}" if p.reason != "the appendix" else ""))
    tourkit.require(checks)


def show_generated_code(ctx, source: str, family: str) -> None:
    pattern = r"tl::wgmma_ss<|tl::wgmma_rs<" if family == "hopper" else r"mma_sync|mma\.sync|ldmatrix"
    excerpt = tourkit.source_excerpt(source, pattern, context=5, limit=12)
    if excerpt:
        ctx.log("\nInside the K loop of the generated CUDA (the tensor-core instructions T.gemm became):")
        ctx.log(tourkit.indent(excerpt, "  | "))
    if family == "hopper" and "warpgroup_wait<0>" in source and "tma_load" in source:
        ctx.log("Each K step issues a batch of wgmma and waits for all of it (warpgroup_wait<0>) before handing "
                "the stage back to the producer warpgroup; the appendix kernel keeps one batch in flight instead.")
    elif family == "hopper" and "cp_async" in source:
        ctx.log("No producer warpgroup here: every thread issues the cp.async copies of the next K step before "
                "its wgmma, and the block takes only the registers it needs, so blocks can share an SM.")


def run(ctx) -> None:
    family = tourkit.ARCH_SPECS[ctx.arch].family
    decls, (rows, ws, odd) = kernels(ctx), plan(ctx)
    if not rows:
        raise SectionSkip(f"no schedule fits the {ctx.smem_budget} B of shared memory a block may use here")
    M, N, K = rows[0].M, rows[0].N, rows[0].K
    if ctx.shape is not None:
        ctx.log(f"C[{M}x{N}] = A[{M}x{K}] @ B, {ctx.dtype}: the rule's schedule, {rows[0].label()}:\n  "
                f"{rows[0].describe()}")
    if ctx.compile_only:  # lower (and nvcc a few), check markers and shared memory, show the K loop
        first = tourkit.inspect_declared(ctx, decls)[decls[0].name]
        if family == "hopper" and rows[0].config.warp_specialized:
            ctx.log(f"threads as launched include TileLang's producer warpgroup (TMA copies): {first.threads} "
                    f"for {decls[0].threads} asked")
        show_generated_code(ctx, first.source, family)
        ctx.headline(arch=ctx.arch, kernels=len(decls), markers=",".join(decls[0].markers))  # the pick's, as checked
        return
    tourkit.require_device_memory(ctx, 10 * (M * K + K * N + M * N) + 4 * rows[0].config.split_k * M * N,
                                  f"the {M}x{N}x{K} GEMM with its float32 reference")
    built = tourkit.build_declared(decls, log=ctx.log)
    timed, rounds = rows + ([ws] if ws else []), 2 if ctx.quick else ROUNDS
    ms, cublas_ms, errors = time_against_cublas(M, N, K, {kernel_name(p): launcher(built, p) for p in timed},
                                                rounds, ctx.dtype)
    check_odd_shapes(ctx, built, odd)  # none with --shape
    flops, best = gemm_flops(M, N, K), min(rows, key=lambda p: ms[kernel_name(p)])
    if ctx.shape is not None:
        ctx.log(timed_choice(rows, best, {p: ms[kernel_name(p)] for p in rows}))
    record_timings(ctx, timed, ms, cublas_ms, ws)
    ctx.log(f"\nC[{M}x{N}] = A @ B, {ctx.dtype} in, fp32 accumulation, {ctx.dtype} out; timed in turns with cuBLAS "
            f"after {tourkit.SETTLE_MS / 1e3:.1f} s of untimed load ({rounds // 2} forward/backward pairs)"
            + ("; padding copies included" if rows[0].padded or rows[0].pad_b else ""))
    marks = {ws: "appendix", rows[0]: "the rule's pick" if ctx.shape is not None else "", best: "<- fastest"}
    table = [table_row(p, ms[kernel_name(p)], cublas_ms, flops) + [tourkit.format_error(errors[kernel_name(p)]),
             marks.get(p, "")] for p in timed]
    table.append(["cuBLAS (torch.matmul)", "", "", "", "", "", "", f"{cublas_ms:.3f}",
                  f"{tourkit.tflops(flops, cublas_ms):.0f}", "1.000x", tourkit.format_error(errors["cuBLAS"]), ""])
    ctx.table(TABLE + ["rel. error", ""], table)
    if isinstance(best.config, GemmConfig):  # tiles of C (the few-rows kernel walks strips of B)
        row_major, swizzled = (tourkit.format_bytes(n) for n in wave_traffic(M, N, K, best.config, sm_count(ctx)))
        ctx.log(f"one wave of {sm_count(ctx)} {best.config.block_M}x{best.config.block_N} tiles reads {row_major} of A "
                f"and B launched row by row, {swizzled} swizzled in panels of {best.config.panel} tile rows")
    show_generated_code(ctx, built[kernel_name(best)].get_kernel_source(), family)

    ctx.headline(lesson_vs_cublas=round(tourkit.speedup(cublas_ms, ms[kernel_name(best)]), 3))  # ratios first:
    if ws is not None:  # the summary shows a headline's first 110 characters
        ctx.headline(appendix_vs_cublas=round(tourkit.speedup(cublas_ms, ms[kernel_name(ws)]), 3))
    ctx.headline(lesson_tflops=round(tourkit.tflops(flops, ms[kernel_name(best)])), lesson=best.label())
    ctx.metric(size=M if M == N == K else f"{M}x{N}x{K}", dtype=ctx.dtype, cublas_tflops=round(tourkit.tflops(flops, cublas_ms)),
               schedules={p.label(): round(tourkit.speedup(cublas_ms, ms[kernel_name(p)]), 3) for p in timed},
               reason=rows[0].describe() if ctx.shape is not None else None)


SECTION = Section(
    name="gemm_schedules",
    title="GEMM schedules: tiles, pipelines and swizzles vs cuBLAS",
    summary="A tiled fp16/bf16 tensor-core GEMM (T.Pipelined + T.gemm); its schedules, and the rule's pick for "
            "any --shape, vs torch.matmul.",
    run=run,
    kernels=kernels,
)
