"""gemm_schedules: a fast fp16 tensor-core GEMM in about forty lines of TileLang, timed against cuBLAS.

You will learn:
- how a block owns one tile of C, and walks K in steps whose A and B tiles are copied to shared memory
  (`T.copy`) while the tensor cores (`T.gemm`) work on earlier steps (`T.Pipelined`);
- why the accumulator lives in registers (`T.alloc_fragment`) and C leaves once, through shared memory;
- how the schedule (tile size, pipeline stages, threads, block order) decides the speed, in a small table;
- what TileLang makes of it: cp.async + ldmatrix + mma.sync on Ampere/Ada; TMA + mbarriers + wgmma with a
  producer warpgroup on Hopper (sm_90a), where the appendix's hand-written kernel (sections/hopper/gemm_ws.py)
  is timed beside it: what the compiler's pipeline gives, and what warp specialization by hand adds.

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
from dataclasses import dataclass

import tilelang
import tilelang.language as T

import tourkit
from sections.gemm_epilogue import epilogue_pass_configs
from sections.gemm_plans import (PRODUCER_REGISTERS, WARP_POLICIES, GemmConfig, GemmLauncher, check_problem,  # noqa: F401
                                 consumer_registers, epilogue_macro, fits, gemm_flops, gemm_prim_func, lesson_schedules,
                                 plan_problem, wave_traffic)
from tourkit import KernelDecl, Section, SectionSkip

# ---- The schedule: a GemmConfig (sections/gemm_plans.py), chosen per problem by choose_schedule ----------

def gemm_program(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", accum_dtype: str = "float32"):
    """C = activation(A @ B + Bias) over A[M, K], B[K, N], (Bias[N],) C[M, N]: T.Pipelined + T.gemm.
    With config.split_k > 1, block z of the grid takes the z-th run of K steps and C is W[split_k, M, N],
    fp32 partials that gemm_plans.splitk_reduce_program adds up (and applies the epilogue to)."""
    check_problem(M, N, K, activation, dtype)
    if config.policy not in WARP_POLICIES:
        raise ValueError(f"warp policy {config.policy!r} is not one of {WARP_POLICIES}")
    bM, bN, bK, splits = config.block_M, config.block_N, config.block_K, config.split_k
    policy = getattr(T.GemmWarpPolicy, config.policy)
    steps = T.ceildiv(T.ceildiv(K, bK), splits)  # K steps of one block (the last run may read past K: zeros)
    out_dtype = "float32" if splits > 1 else dtype
    epilogue = epilogue_macro(bM, bN, bias, activation)  # bias and GELU on the accumulator (the fusion lesson)

    @T.macro
    def body(A, B, Bias, C):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), splits, threads=config.threads) as (bx, by, bz):
            A_shared = T.alloc_shared((bM, bK), dtype)
            B_shared = T.alloc_shared((bK, bN), dtype)
            C_local = T.alloc_fragment((bM, bN), accum_dtype)  # the accumulator: registers, never global
            Bias_shared = T.alloc_shared((bN,), dtype) if bias else None
            C_shared = T.alloc_shared((bM, bN), out_dtype) if config.staged_store else None
            if config.threads > 256:  # Hopper: say how the 64K registers split (TileLang warns otherwise)
                T.annotate_producer_reg_dealloc(PRODUCER_REGISTERS)
                T.annotate_consumer_reg_alloc(consumer_registers(config.threads))
            T.use_swizzle(panel_size=config.panel, enable=config.swizzle)
            if bias:
                T.copy(Bias[bx * bN], Bias_shared)
            T.clear(C_local)
            # num_stages buffers of A and B: the copies for step k + num_stages - 1 fly while step k computes.
            for k in T.Pipelined(steps, num_stages=config.num_stages):
                T.copy(A[by * bM, (bz * steps + k) * bK], A_shared)
                T.copy(B[(bz * steps + k) * bK, bx * bN], B_shared)
                T.gemm(A_shared, B_shared, C_local, policy=policy)

            epilogue(C_local, Bias_shared)
            out = C[by * bM, bx * bN] if splits == 1 else C[bz, by * bM, bx * bN]
            if config.staged_store:  # registers -> shared -> global: coalesced stores (TMA on Hopper)
                T.copy(C_local, C_shared)
                T.copy(C_shared, out)
            else:
                T.copy(C_local, out)

    c_shape = (M, N) if splits == 1 else (splits, M, N)
    return gemm_prim_func(M, N, K, body, bias, dtype, c_shape, out_dtype)


def compile_gemm(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", pass_configs: dict | None = None):
    """Compile for the local GPU. The kernel writes into the caller's C: kernel(a, b, c) / kernel(a, b, bias, c)."""
    func = gemm_program(M, N, K, config, bias=bias, activation=activation, dtype=dtype)
    configs = {**epilogue_pass_configs(activation), **(pass_configs or {})}
    return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=configs)


# ---- The PyTorch reference and the check ---------------------------------------------------------------

TOLERANCE = 5e-3  # fp16 output: one rounding (~3e-4 relative) on top of fp32 accumulation in another order
ODD_SHAPES = [(1000, 1000, 1000), (1001, 1032, 1000)]  # tails in M, N and K


def gemm_inputs(M: int, N: int, K: int, *, seed: int = 0):
    import torch

    a = tourkit.random_tensor((M, K), torch.float16, seed=seed)
    b = tourkit.random_tensor((K, N), torch.float16, seed=seed + 1)
    return a, b, torch.empty((M, N), dtype=torch.float16, device="cuda")


def reference(a, b, bias=None, activation=None):
    """The same computation in float32 (no TF32) from the same fp16 inputs."""
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
    """The GPU's SM count (the appendix's persistent grid); 132 (H100 SXM / H200) when compiling without one."""
    return ctx.device.sm_count if ctx.device is not None else 132


def plan(ctx):
    """(the lesson's schedules that fit, the appendix's kernel on sm_90a or None, the problem size)."""
    size = 2048 if ctx.quick or ctx.compile_only else 8192
    rows = [c for c in lesson_schedules(tourkit.ARCH_SPECS[ctx.arch].family) if fits(c, ctx.smem_budget)]
    if ctx.arch != "sm_90a":
        return rows, None, size
    from sections.hopper import gemm_ws

    return rows, gemm_ws.appendix_schedule(size, size, size, sm_count(ctx)), size


def program(config, M: int, N: int, K: int):
    """The lesson's kernel for a GemmConfig, the appendix's (sections/hopper/gemm_ws.py) for its WsConfig."""
    if isinstance(config, GemmConfig):
        return gemm_program(M, N, K, config)
    from sections.hopper import gemm_ws

    return gemm_ws.appendix_program(M, N, K, config)


def kernel_name(config, M: int, N: int, K: int) -> str:
    return f"{config.label()} @{M}x{N}x{K}"


def kernels(ctx) -> list[KernelDecl]:
    """The lesson's schedules at the section's size and the default at the odd sizes; on sm_90a the
    appendix kernel at the section's size and one odd size. Compile-only runs nvcc on the lesson default,
    one ragged size and the appendix kernel, and only lowers the rest."""
    markers = tuple(tourkit.TENSOR_CORE_MARKERS[tourkit.ARCH_SPECS[ctx.arch].family])
    rows, ws, size = plan(ctx)
    jobs = [(c, (size, size, size), i == 0) for i, c in enumerate(rows)]
    jobs += [(rows[0], shape, i == 0) for i, shape in enumerate(ODD_SHAPES)] if rows else []
    jobs += [(ws, (size, size, size), True), (ws, ODD_SHAPES[-1], False)] if ws else []
    return [KernelDecl(kernel_name(c, *shape), (lambda c=c, s=shape: program(c, *s)), nvcc=nvcc, markers=markers,
                       threads=getattr(c, "block_threads", c.threads), smem_limit=c.smem_bytes())
            for c, shape, nvcc in jobs]


# ---- The benchmark and the report ----------------------------------------------------------------------

TABLE = ["kernel", "tile (MxNxK)", "stages", "threads", "swizzle", "policy", "smem", "ms", "TFLOP/s", "vs cuBLAS"]
ROUNDS = 6  # three forward/backward pairs (tourkit.bench_interleaved)


def table_row(config, ms: float, cublas_ms: float, flops: int) -> list:
    c = config.columns()
    return [c["kernel"], c["tile"], c["stages"], c["threads"], c["swizzle"], c["policy"],
            tourkit.format_bytes(config.smem_bytes()), f"{ms:.3f}", f"{tourkit.tflops(flops, ms):.0f}",
            f"{tourkit.speedup(cublas_ms, ms):.3f}x"]


def time_against_cublas(M: int, N: int, K: int, contenders: dict, rounds: int):
    """{label: kernel(a, b, c)} validated against a float32 reference on fresh random inputs, then timed in
    turns with cuBLAS. Returns each label's median ms, cuBLAS's ms and the relative errors."""
    import torch

    a, b, c = gemm_inputs(M, N, K)
    ref, c_cublas = reference(a, b), torch.empty_like(c)
    checks = {label: tourkit.validate(label, lambda k=k: k(a, b, c), c, ref, TOLERANCE) for label, k in contenders.items()}
    tourkit.require(checks.values())
    fns = {"cuBLAS": lambda: torch.matmul(a, b, out=c_cublas)}
    fns.update({label: (lambda k: lambda: k(a, b, c))(k) for label, k in contenders.items()})
    ms = tourkit.bench_interleaved(fns, rounds=rounds)
    errors = {label: check.rel_error for label, check in checks.items()}
    errors["cuBLAS"] = tourkit.relative_error(c_cublas, ref)
    return ms, ms.pop("cuBLAS"), errors


def check_odd_shapes(ctx, built: dict, configs) -> None:
    """Sizes that are not multiples of the tile: TMA / predicated copies handle the ragged edges."""
    checks = []
    for config, (M, N, K) in configs:
        kernel = built[kernel_name(config, M, N, K)]
        a, b, c = gemm_inputs(M, N, K, seed=7)
        checks.append(tourkit.validate(kernel_name(config, M, N, K), lambda: kernel(a, b, c), c, reference(a, b),
                                       TOLERANCE))
        ctx.log(checks[-1].line())
    tourkit.require(checks)
    try:
        gemm_program(1000, 1001, 1000, configs[0][0])
    except ValueError as exc:
        ctx.log(f"1000x1001x1000 is rejected: {exc}")


def show_generated_code(ctx, source: str, family: str) -> None:
    pattern = r"tl::wgmma_ss<|tl::wgmma_rs<" if family == "hopper" else r"mma_sync|mma\.sync|ldmatrix"
    excerpt = tourkit.source_excerpt(source, pattern, context=5, limit=12)
    if excerpt:
        ctx.log("\nInside the K loop of the generated CUDA (the tensor-core instructions T.gemm became):")
        ctx.log(tourkit.indent(excerpt, "  | "))
    if family == "hopper" and "warpgroup_wait<0>" in source:
        ctx.log("Each K step issues a batch of wgmma and waits for all of it (warpgroup_wait<0>) before handing "
                "the stage back to the producer warpgroup; the appendix kernel keeps one batch in flight instead.")


def run(ctx) -> None:
    family = tourkit.ARCH_SPECS[ctx.arch].family
    decls, (rows, ws, size) = kernels(ctx), plan(ctx)
    if not rows:
        raise SectionSkip(f"no schedule fits the {ctx.smem_budget} B of shared memory a block may use here")
    if ctx.compile_only:  # lower (and nvcc a few), check markers and shared memory, show the K loop
        first = tourkit.inspect_declared(ctx, decls)[decls[0].name]
        if family == "hopper":
            ctx.log(f"threads as launched include TileLang's producer warpgroup (TMA copies): {first.threads} "
                    f"for {decls[0].threads} asked")
        show_generated_code(ctx, first.source, family)
        ctx.headline(arch=ctx.arch, kernels=len(decls), markers=",".join(tourkit.TENSOR_CORE_MARKERS[family]))
        return
    built = tourkit.build_declared(decls, log=ctx.log)
    timed, rounds = rows + ([ws] if ws else []), 2 if ctx.quick else ROUNDS
    ms, cublas_ms, errors = time_against_cublas(
        size, size, size, {c.label(): built[kernel_name(c, size, size, size)] for c in timed}, rounds)
    check_odd_shapes(ctx, built, [(rows[0], shape) for shape in ODD_SHAPES] + ([(ws, ODD_SHAPES[-1])] if ws else []))

    flops = gemm_flops(size, size, size)
    best = min(rows, key=lambda c: ms[c.label()])  # the lesson's headline: its fastest schedule in this run
    ctx.log(f"\nC[{size}x{size}] = A @ B, fp16 in, fp32 accumulation, fp16 out; timed in turns with cuBLAS after "
            f"{tourkit.SETTLE_MS / 1e3:.1f} s of untimed load ({rounds // 2} forward/backward pairs)")
    table = [table_row(c, ms[c.label()], cublas_ms, flops) + [tourkit.format_error(errors[c.label()]),
             "<- lesson's fastest" if c == best else ("appendix" if c == ws else "")] for c in timed]
    table.append(["cuBLAS (torch.matmul)", "", "", "", "", "", "", f"{cublas_ms:.3f}",
                  f"{tourkit.tflops(flops, cublas_ms):.0f}", "1.000x", tourkit.format_error(errors["cuBLAS"]), ""])
    ctx.table(TABLE + ["rel. error", ""], table)
    row_major, swizzled = wave_traffic(size, size, size, rows[0], sm_count(ctx))
    ctx.log(f"one wave of {sm_count(ctx)} {rows[0].block_M}x{rows[0].block_N} tiles reads "
            f"{tourkit.format_bytes(row_major)} of A and B launched row by row, "
            f"{tourkit.format_bytes(swizzled)} swizzled in panels of {rows[0].panel} tile rows")
    show_generated_code(ctx, built[kernel_name(best, size, size, size)].get_kernel_source(), family)

    ctx.headline(lesson_vs_cublas=round(tourkit.speedup(cublas_ms, ms[best.label()]), 3))  # ratios first: the
    if ws is not None:  # summary shows a headline's first 110 characters
        ctx.headline(appendix_vs_cublas=round(tourkit.speedup(cublas_ms, ms[ws.label()]), 3))
    ctx.headline(lesson_tflops=round(tourkit.tflops(flops, ms[best.label()])), lesson=best.label())
    ctx.metric(size=size, cublas_tflops=round(tourkit.tflops(flops, cublas_ms)),
               schedules={c.label(): round(tourkit.speedup(cublas_ms, ms[c.label()]), 3) for c in timed})


SECTION = Section(
    name="gemm_schedules",
    title="GEMM schedules: tiles, pipelines and swizzles vs cuBLAS",
    summary="A tiled fp16 tensor-core GEMM (T.Pipelined + T.gemm); its schedules vs torch.matmul.",
    run=run,
    kernels=kernels,
)

