"""softmax: a row reduction that reads its data once and writes it once, at the speed of a copy.

You will learn:
* a row in a *fragment* (a tile spread over the threads' registers): `T.reduce_max` / `T.reduce_sum`
  become warp shuffles plus one small shared-memory exchange; `exp2` with log2(e) folded into one FMA;
* any shape: narrow rows several to a block, odd widths (padding, masks), rows too long for registers or
  even shared memory (the online softmax); float16 or bfloat16 in memory, float32 in registers;
* judging a memory-bound kernel: GB/s against a device copy of the same bytes, timed in turns.

Per row x:

    m    = max_j x[j]                          # T.reduce_max
    e[j] = 2^(x[j]·log2e − m·log2e)            # T.exp2: one FMA and one exp2 per element
    s    = Σ_j e[j]                            # T.reduce_sum
    y[j] = e[j] · (1 / s)                      # one division per row

A row too long to hold in registers is walked twice, in chunks (the online softmax):

    m, s = −inf, 0
    for each chunk c:  m' = max(m, max(c));  s = s·2^(m − m') + Σ 2^(c − m');  m = m'    # online rescale
    for each chunk c:  y[c] = 2^(c − m) / s

Three kernels, checked against torch.softmax, then timed (choose_plan, softmax_plans.py, picks one by rules it
prints): 1. rows_in_registers, 2. rows_staged_in_shared, 3. long_rows_online (a vocabulary of 50257, off Hopper),
and on Hopper 4. a row split over a thread-block cluster (vocabularies: sections/softmax_cluster.py).
"""

import functools
from typing import NamedTuple

import tilelang
import tilelang.language as T

import tourkit
from sections.softmax_plans import (SoftmaxPlan, aligned_body, body_index, body_start, choose_plan,  # noqa: F401
                                    edge_in_row, edge_index, row_split_layout, staged_vector_width, step_column,
                                    uses_bulk_copy, vector_width)  # the rules, and an odd row's indices

LOG2E = 1.4426950408889634
BENCH_SHAPES = [(32768, 4096), (16384, 8192), (8192, 32768), (4096, 1823)]
QUICK_SHAPES = [(4096, 4096), (2048, 1823), (1024, 32768)]
ODD_SHAPES = [(1001, 1823), (1000, 1823), (999, 4096), (37, 32768)]  # correctness only: odd rows and widths
TOLERANCE = {"float16": 5e-3, "bfloat16": 1e-2}  # bfloat16 rounds y to 8 bits of mantissa, float16 to 11
ROUNDS = 2  # one forward and backward pair: the ratios to a copy move a few percent between runs anyway


# --- The kernels --------------------------------------------------------------------------------------
@T.macro
def exponentials_and_reciprocal_sums(x, row_max, row_sum, rows: int, width: int):
    """The heart of every kernel below, on a float32 fragment x (rows, width): x becomes e^(x - max) (as exp2)
    and row_sum 1 / Σ of each row; the caller scales and stores."""
    T.reduce_max(x, row_max, dim=1)
    for i in T.Parallel(rows):
        row_max[i] = row_max[i] * LOG2E  # exp(x - m) = exp2(x·log2e - m·log2e): one FMA per element
    for i, j in T.Parallel(rows, width):
        x[i, j] = T.exp2(x[i, j] * LOG2E - row_max[i])
    T.reduce_sum(x, row_sum, dim=1)
    for i in T.Parallel(rows):
        row_sum[i] = 1.0 / row_sum[i]  # one division per row, a multiply per element


def rows_in_registers(M: int, N: int, rows_per_block: int, threads: int, dtype: str = "float16",
                      min_blocks_per_sm: int = 0):
    """Version 1, the simple one: a block reads `rows_per_block` whole rows from global memory into a float32
    fragment. One wide row a block: T.copy in 16-byte vectors. Otherwise (narrow rows, several a block, or a
    width that does not split evenly): each row over threads // rows_per_block threads, loads as wide as the
    rows' alignment allows (vector_width), masked where the fragment is padded or past the last row (the pad
    -inf): any (M, N). min_blocks_per_sm > 0: __launch_bounds__' resident blocks."""
    R = rows_per_block
    if threads % R:
        raise ValueError(f"softmax: {R} rows per block must divide {threads} threads")
    per_row = threads // R
    vec = vector_width(N)
    simple = R == 1 and vec == 8 and N % (per_row * vec) == 0  # what T.copy's layout inference splits
    width = -(-N // (per_row * vec)) * per_row * vec

    @T.prim_func
    def softmax_rows_in_registers(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, R), threads=threads) as bx:
            if min_blocks_per_sm:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            x = T.alloc_fragment((R, width), "float32")
            row_max = T.alloc_fragment((R,), "float32")
            row_sum = T.alloc_fragment((R,), "float32")
            if simple:
                T.copy(X[bx * R, 0], x)  # the one read: 16-byte vectors, converted to float32 in registers
            else:
                T.annotate_layout({x: row_split_layout(R, width, per_row, vec)})
                for i, j in T.Parallel(R, width):
                    x[i, j] = T.if_then_else(j < N and bx * R + i < M, T.cast(X[bx * R + i, j], "float32"),
                                             -T.infinity("float32"))
            exponentials_and_reciprocal_sums(x, row_max, row_sum, R, width)
            if simple:
                for i, j in T.Parallel(R, width):
                    x[i, j] = x[i, j] * row_sum[i]
                T.copy(x, Y[bx * R, 0])  # the one write
            else:
                for i, j in T.Parallel(R, width):
                    if j < N and bx * R + i < M:
                        Y[bx * R + i, j] = T.cast(x[i, j] * row_sum[i], dtype)

    return softmax_rows_in_registers


def rows_staged_in_shared(M: int, N: int, rows_per_block: int, threads: int, dtype: str = "float16",
                          bulk_copy: bool = True, min_blocks_per_sm: int = 0):
    """Version 2, staged: the block's R rows, one flat range of R·N elements (16-byte aligned when R·N % 8 == 0,
    so odd widths get wide loads too), copied to shared memory at once (a TMA bulk copy on Hopper), then
    row by row into a padded fragment and back. What it adds: bulk copies, ahead at 4096 wide on Hopper, and for
    narrow odd rows there, whose single-element loads from global memory would coalesce poorly."""
    R = rows_per_block
    if threads % R or (R * N) % 8:
        raise ValueError(f"staged softmax: {R} rows per block must divide {threads} threads and R·N must be a "
                         f"multiple of 8 (16-byte aligned blocks); got N={N}")
    if bulk_copy and M % R:  # a bulk copy has no bounds: the last block's would run past the tensor
        raise ValueError(f"staged softmax: with bulk copies {R} rows per block must divide the {M} rows")
    per_row = threads // R
    vec = staged_vector_width(N, per_row)
    padded = -(-N // (per_row * vec)) * (per_row * vec)
    flat = M * N

    @T.prim_func
    def softmax_rows_staged(X: T.Tensor((flat,), dtype), Y: T.Tensor((flat,), dtype)):
        with T.Kernel(T.ceildiv(M, R), threads=threads) as bx:
            if min_blocks_per_sm:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            rows = T.alloc_shared((R * N,), dtype)
            x = T.alloc_fragment((R, padded), "float32")
            row_max = T.alloc_fragment((R,), "float32")
            row_sum = T.alloc_fragment((R,), "float32")
            T.annotate_layout({x: row_split_layout(R, padded, per_row, vec)})
            T.copy(X[bx * R * N:(bx + 1) * R * N], rows, prefer_instruction="tma" if bulk_copy else None)  # TMA: Hopper
            for i, j in T.Parallel(R, padded):
                x[i, j] = T.if_then_else(j < N, T.cast(rows[i * N + j], "float32"), -T.infinity("float32"))
            exponentials_and_reciprocal_sums(x, row_max, row_sum, R, padded)
            for i, j in T.Parallel(R, padded):
                if j < N:
                    rows[i * N + j] = T.cast(x[i, j] * row_sum[i], dtype)
            T.copy(rows, Y[bx * R * N:(bx + 1) * R * N])

    return softmax_rows_staged


@T.macro
def running_max_and_sum(x, part_max, part_sum, new_max, step_sum, threads: int, per_thread: int):
    """Fold one step x (threads, per_thread) of x·log2e into each thread's running (max, sum): the online
    rescale of the docstring, thread by thread (each row of x belongs to one thread: no exchange)."""
    T.copy(part_max, new_max)
    T.reduce_max(x, new_max, dim=1, clear=False)
    for i, e in T.Parallel(threads, per_thread):
        x[i, e] = T.exp2(x[i, e] - new_max[i])
    T.reduce_sum(x, step_sum, dim=1)
    for i in T.Parallel(threads):
        part_sum[i] = part_sum[i] * T.exp2(part_max[i] - new_max[i]) + step_sum[i]
        part_max[i] = new_max[i]


@T.macro
def merge_thread_pairs(part_max, part_sum, row_max, row_sum, threads: int):
    """The block's (max, sum) from its threads' pairs: an exchange for the max, each sum rescaled, one for the sum."""
    T.reduce_max(part_max, row_max, dim=0)
    for i in T.Parallel(threads):
        part_sum[i] = part_sum[i] * T.exp2(part_max[i] - row_max[0])
    T.reduce_sum(part_sum, row_sum, dim=0)


def long_rows_online(M: int, N: int, per_thread: int, threads: int, dtype: str = "float16", staged: int = 0,
                     bulk_copy: bool = True):
    """Version 3, rows too long for registers, one a block, walked twice in steps of threads · per_thread
    elements (the online softmax). The first `staged` columns are copied into shared memory at once (TMA on
    Hopper; the whole row when it fits: one read of global memory); the rest of a longer row is streamed from
    global memory in both passes, the second mostly from L2. Each thread keeps its OWN running (max, sum): no
    exchange stalls the loop; the block merges the pairs once. An unaligned row (N % 8: 50257 columns) is a body
    of whole 16-byte vectors (aligned_body(N)), moved as an aligned row, and edges (7 before, 15 after) singly."""
    aligned, body = N % 8 == 0, aligned_body(N)
    if per_thread % 8 or staged > body or staged % 8 and staged != N:
        raise ValueError(f"long-row softmax: {per_thread} elements a thread must be whole 16-byte vectors; a "
                         f"staged head ({staged}) whole vectors within the {body} aligned columns of each row")
    step = threads * per_thread
    head_steps, tail_steps = -(-staged // step), -(-(body - staged) // step)
    padded = max(head_steps * step, 8)  # TileLang reads a masked vector of shared memory before its mask: pad
    low = -1.0e38  # a finite start for the running max: exp2(low - low) never meets inf - inf

    column = step_column(threads, per_thread)  # thread i's e-th element of step c

    edge = functools.partial(edge_index, N=N)  # flat index of edge element i (softmax_plans: the row's indices)
    in_row = functools.partial(edge_in_row, N=N)  # ... and whether it is this row's
    at = functools.partial(body_index, M=M, N=N)  # flat index of body column col

    @T.prim_func
    def softmax_long_rows_online(X: T.Tensor((M * N,), dtype), Y: T.Tensor((M * N,), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            head = T.alloc_shared((padded,), dtype)
            x = T.alloc_fragment((threads, per_thread), "float32")  # row i of x: thread i's elements
            part_max = T.alloc_fragment((threads,), "float32")  # thread i's running max of x·log2e
            part_sum = T.alloc_fragment((threads,), "float32")  # ... and its sum of 2^(x·log2e - max)
            new_max = T.alloc_fragment((threads,), "float32")
            step_sum = T.alloc_fragment((threads,), "float32")
            row_max = T.alloc_fragment((1,), "float32")
            row_sum = T.alloc_fragment((1,), "float32")
            T.annotate_layout({x: row_split_layout(threads, per_thread, 1, per_thread)})
            row = T.cast(bx, "int64") if M * N >= 2**31 else bx  # 64-bit offsets where M·N overflows 32 bits
            first = body_start(row, N)  # the body: [first, first + body)
            if staged:  # Hopper: one TMA bulk copy, completion tracked by an mbarrier
                T.copy(X[first:first + staged], head[0:staged], prefer_instruction="tma" if bulk_copy else None)
            if aligned:
                T.fill(part_max, low)
                T.fill(part_sum, 0.0)
            else:  # the edges start the running pairs: thread i < 8 the element first - 8 + i, 8 <= i < 24 ...
                for i in T.Parallel(threads):  # ... the element i - 8 after the body: each alone, sum 1
                    part_max[i] = T.if_then_else(in_row(i, row, first),
                                                 T.cast(X[edge(i, first)], "float32") * LOG2E, low)
                    part_sum[i] = T.if_then_else(part_max[i] > low, 1.0, 0.0)
            for c in T.serial(head_steps):  # pass 1 over the staged head (none when staged == 0) ...
                for i, e in T.Parallel(threads, per_thread):
                    x[i, e] = T.if_then_else(column(c, i, e) < staged, T.cast(head[column(c, i, e)], "float32") * LOG2E,
                                             -T.infinity("float32"))
                running_max_and_sum(x, part_max, part_sum, new_max, step_sum, threads, per_thread)
            for c in T.serial(tail_steps):  # ... and over the rest, from global memory, whole vectors
                for i, e in T.Parallel(threads, per_thread):
                    col = staged + column(c, i, e)
                    x[i, e] = T.if_then_else(col < body, T.cast(X[at(first, col)], "float32") * LOG2E,
                                             -T.infinity("float32"))
                running_max_and_sum(x, part_max, part_sum, new_max, step_sum, threads, per_thread)
            merge_thread_pairs(part_max, part_sum, row_max, row_sum, threads)
            for i in T.Parallel(1):
                row_sum[i] = 1.0 / row_sum[i]
            for c in T.serial(head_steps):  # pass 2: y, a step at a time, consecutive threads on consecutive columns
                for j in T.Parallel(step):
                    if c * step + j < staged:
                        Y[first + c * step + j] = T.cast(
                            T.exp2(T.cast(head[c * step + j], "float32") * LOG2E - row_max[0]) * row_sum[0], dtype)
            for c in T.serial(tail_steps):
                for j in T.Parallel(step):
                    col = staged + c * step + j
                    if col < body:
                        Y[at(first, col)] = T.cast(
                            T.exp2(T.cast(X[at(first, col)], "float32") * LOG2E - row_max[0]) * row_sum[0], dtype)
            if not aligned:
                for i in T.Parallel(threads):
                    if in_row(i, row, first):
                        Y[edge(i, first)] = T.cast(
                            T.exp2(T.cast(X[edge(i, first)], "float32") * LOG2E - row_max[0]) * row_sum[0], dtype)

    return softmax_long_rows_online


# --- Building the plan (the rules that choose it: sections/softmax_plans.py) ------------------------------
def build(M: int, N: int, plan: SoftmaxPlan, family: str = "hopper", dtype: str = "float16"):
    bulk = uses_bulk_copy(plan, N, family)
    if plan.kind == "registers":
        return rows_in_registers(M, N, plan.rows_per_block, plan.threads, dtype, plan.min_blocks_per_sm)
    if plan.kind == "staged":
        return rows_staged_in_shared(M, N, plan.rows_per_block, plan.threads, dtype, bulk, plan.min_blocks_per_sm)
    if plan.kind == "cluster":  # version 4, Hopper: sections/softmax_cluster.py
        from sections.softmax_cluster import rows_split_over_cluster
        return rows_split_over_cluster(M, N, plan.cluster, plan.rows_per_block, plan.threads, dtype)
    return long_rows_online(M, N, plan.rows_per_block, plan.threads, dtype, plan.staged, bulk)


def launcher(kernel, plan: SoftmaxPlan):
    """softmax(x, y) -> y for (M, N) tensors, from a compiled kernel of `plan`."""
    flat = plan.kind != "registers"  # blocks of the staged and online kernels index the flat tensor

    def softmax(x, y):
        kernel(x.view(-1), y.view(-1)) if flat else kernel(x, y)
        return y

    softmax.source = kernel.get_kernel_source()
    return softmax


def compile_softmax(M: int, N: int, plan: SoftmaxPlan, family: str = "hopper", dtype: str = "float16"):
    """The plan compiled for the GPU in use, as softmax(x, y) -> y."""
    return launcher(tilelang.compile(build(M, N, plan, family, dtype), out_idx=None, target="cuda"), plan)


# --- What the section builds, declared once -------------------------------------------------------------
class Problem(NamedTuple):
    M: int
    N: int
    plan: SoftmaxPlan
    timed: bool  # benchmarked, or checked only
    name: str


def problems(ctx) -> list[Problem]:
    """The benchmark shapes (timed) and the odd shapes (checked only; compile-only and quick: one of them), or
    with --shape the user's problem alone (checked, then timed)."""
    family = tourkit.ARCH_SPECS[ctx.arch].family
    timed = [tuple(ctx.shape)] if ctx.shape else QUICK_SHAPES if ctx.quick and not ctx.compile_only else BENCH_SHAPES
    checked = [] if ctx.shape else ODD_SHAPES[:1] if ctx.quick or ctx.compile_only else ODD_SHAPES
    plans = [(M, N, choose_plan(M, N, ctx.smem_budget, family)) for M, N in timed + checked]
    return [Problem(M, N, plan, (M, N) in timed, f"softmax {M}x{N} {ctx.dtype} {plan.kind}") for M, N, plan in plans]


def kernels(ctx) -> list[tourkit.KernelDecl]:
    family = tourkit.ARCH_SPECS[ctx.arch].family  # a TMA copy completes on an mbarrier:
    return [tourkit.KernelDecl(p.name, functools.partial(build, p.M, p.N, p.plan, family, ctx.dtype),
                               threads=p.plan.threads, smem_limit=ctx.smem_budget,
                               markers=("tma_load", "mbarrier") if uses_bulk_copy(p.plan, p.N, family) else ())
            for p in problems(ctx)]


# --- The reference, the check, the benchmark ------------------------------------------------------------
def reference(x):
    return x.float().softmax(dim=-1)  # float32: the higher-precision reference


def check_shape(M: int, N: int, plan: SoftmaxPlan, softmax=None, family: str = "hopper",
                dtype: str = "float16") -> "tourkit.Check":
    import torch

    softmax = softmax or compile_softmax(M, N, plan, family, dtype)
    x = tourkit.random_tensor((M, N), getattr(torch, dtype), scale=3.0)
    y = torch.empty_like(x)
    return tourkit.validate(f"softmax {M}x{N} {dtype} [{plan.describe()}]", lambda: softmax(x, y), y, reference(x),
                            TOLERANCE[dtype])


def bench_table(cases: dict, dtype: str = "float16") -> dict:
    """{label: (M, N, softmax)} -> {label: (ms, torch.softmax ms, copy ms)}: every shape's kernel, torch.softmax
    and y.copy_(x) (the same bytes: the ceiling) in ONE bench_interleaved call: one settling, turns together."""
    import torch

    contenders = {}
    for label, (M, N, softmax) in cases.items():
        x = tourkit.random_tensor((M, N), getattr(torch, dtype), scale=3.0)
        y = torch.empty_like(x)
        contenders[(label, "ours")] = functools.partial(softmax, x, y)
        contenders[(label, "torch")] = functools.partial(torch.softmax, x, dim=-1)
        contenders[(label, "copy")] = functools.partial(y.copy_, x)
    # 50 ms of repetitions per reading, at most 500: hundreds of calls even for the 13 µs shape.
    ms = tourkit.bench_interleaved(contenders, rounds=ROUNDS, warmup_ms=10.0, rep_ms=50.0, max_reps=500)
    return {label: tuple(ms[(label, k)] for k in ("ours", "torch", "copy")) for label in cases}


# --- The lesson -----------------------------------------------------------------------------------------
def show_generated(ctx, source: str) -> None:
    excerpt = tourkit.source_excerpt(source, r"AllReduce<tl::MaxOp", context=5, limit=14)
    if excerpt:  # none where a row is on one thread: T.reduce_max is then a loop in registers, nothing to exchange
        ctx.log("\ngenerated CUDA around T.reduce_max (per-thread max, then shuffles + a shared-memory exchange):\n"
                + tourkit.indent(excerpt, "  "))


def run(ctx) -> None:
    todo, decls = problems(ctx), kernels(ctx)
    if ctx.shape:  # the user's problem: which kernel, and why
        M, N = ctx.shape
        ctx.log(f"softmax {M}x{N} {ctx.dtype}: {todo[0].plan.describe()}\n  why: {todo[0].plan.why}")
        tourkit.require_device_memory(ctx, 40 * M * N, f"softmax {M}x{N} (with float32 and float64 references)")
    if ctx.compile_only:
        for p in todo if not ctx.shape else []:
            ctx.log(f"{p.M}x{p.N}: {p.plan.describe()}")
        reports = tourkit.inspect_declared(ctx, decls)
        show_generated(ctx, reports[todo[0].name].source)
        ctx.headline(kernels=len(reports), arch=ctx.arch)
        return
    built = tourkit.build_declared(decls, log=ctx.log)
    checks, timed = [], {}
    for p in todo:
        softmax = launcher(built[p.name], p.plan)
        checks.append(check_shape(p.M, p.N, p.plan, softmax, dtype=ctx.dtype))
        ctx.log(checks[-1].line())
        if p.timed:
            timed[f"{p.M}x{p.N}"] = (p, softmax)
    tourkit.require(checks)  # a wrong kernel fails the section before any speed is reported
    copy = tourkit.device_copy_gbps()
    ctx.log(f"device-to-device copy of 1 GiB: {copy:.0f} GB/s (read + write: softmax's own traffic)")
    results = bench_table({label: (p.M, p.N, softmax) for label, (p, softmax) in timed.items()}, ctx.dtype)
    rows, of_copy, of_same_size, vs_torch = [], [], [], []
    for label, (p, _) in timed.items():
        ours, torch_ms, copy_ms = results[label]
        gbps, nbytes = tourkit.gbps(4 * p.M * p.N, ours), 4 * p.M * p.N  # one 2-byte read and one write
        of_copy.append(gbps / copy)
        of_same_size.append(copy_ms / ours)
        vs_torch.append(torch_ms / ours)
        rows.append([label, p.plan.describe(), f"{1000 * ours:.1f}", gbps, f"{100 * of_copy[-1]:.0f}%",
                     f"{100 * of_same_size[-1]:.0f}%", tourkit.gbps(nbytes, torch_ms), f"{vs_torch[-1]:.2f}x"])
        for name, t, kind in (("TileLang softmax", ours, "lesson"), ("torch.softmax", torch_ms, "pytorch"),
                              ("copy_", copy_ms, "copy")):  # FLOPs per element: max, exp2's FMA, sum, scale
            ctx.timing(name, t, flops=None if kind == "copy" else 5 * p.M * p.N, nbytes=nbytes, kind=kind, problem=label)
    ctx.log(f"\ntimed in turns with torch.softmax and a copy of the same bytes, after {tourkit.SETTLE_MS / 1e3:.1f} s "
            f"of untimed load, {ROUNDS} rounds (forward and backward):")
    ctx.table(["shape", "kernel", "µs", "GB/s", "of 1 GiB copy", "of same-size copy", "torch GB/s", "vs torch"], rows)
    ctx.log("(a small problem cannot reach the 1 GiB copy's rate: its ceiling is the same-size copy)")
    show_generated(ctx, next(iter(timed.values()))[1].source)
    ctx.headline(worst_of_same_size_copy=round(min(of_same_size), 3), worst_of_1gib_copy=round(min(of_copy), 3),
                 worst_vs_torch=round(min(vs_torch), 2), copy_gbps=round(copy))


SECTION = tourkit.Section(
    name="softmax",
    title="Softmax: rows in registers, one read and one write",
    summary="Row softmax with reduce_max / exp2 / reduce_sum on fragments; odd widths and long rows; GB/s vs copy.",
    run=run,
    kernels=kernels,
)
