"""softmax: a memory-bound row reduction that reads the data once and writes it once.

What you learn: how a row lives in a *fragment* (a tile spread over the threads' registers) so that
`T.reduce_max` and `T.reduce_sum` become warp shuffles plus one small shared-memory exchange; why softmax is
written with `exp2` and the factor log2(e) folded into one fused multiply-add; and how the same kernel shape
copes with rows that do not fit the easy case:

* short rows whose width is a multiple of 8 (4096, 8192): several rows per block, each row read straight
  from global memory into a float32 fragment with 16-byte loads ("rows in registers");
* rows of odd width (1823): a row starts at an odd address, so a 16-byte load cannot start there. Short
  odd rows (up to 2048) go straight into a fragment padded to a multiple of the thread count, the padding
  masked with -inf, 4 rows per block of 128 threads; a problem this small (30 MB) is all latency, so the
  launch bounds cap the registers until every block is resident in the first wave ("rows in registers").
  Longer odd rows: the block copies its group of 8 consecutive rows as ONE flat, aligned range (8·N halves
  start on a 16-byte boundary) into shared memory and reads each row from there ("rows staged in shared
  memory");
* rows too long for registers (32768): the row is staged in shared memory (64 KiB), then processed in
  chunks with the *online* formulation: pass 1 keeps a running maximum and a running sum that is rescaled
  whenever the maximum grows; pass 2 recomputes exp2 per chunk from shared memory and writes. Global memory
  is still read once and written once.

The benchmark compares against torch.softmax and against a device-to-device copy measured in the same
run: a copy reads and writes every byte once, which is exactly softmax's traffic, so it is the ceiling.
"""


import math
from dataclasses import dataclass

import tilelang
import tilelang.language as T

import tourkit
from tourkit import Section

LOG2E = 1.4426950408889634
BENCH_SHAPES = [(32768, 4096), (16384, 8192), (8192, 32768), (4096, 1823)]
QUICK_SHAPES = [(4096, 4096), (2048, 1823), (1024, 32768)]


# ---------------------------------------------------------------------------------------------------------
# Kernel builders
# ---------------------------------------------------------------------------------------------------------


@T.macro
def exponentials_and_reciprocal_sums(x, row_max, row_sum, rows: int, width: int):
    """The heart of every row kernel below, on a float32 fragment x (rows, width): x becomes
    2^(x·log2e - max·log2e) = e^(x - max) and row_sum 1 / Σ of each row; the caller scales and stores."""
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
    """Each block owns `rows_per_block` whole rows, read straight from global memory into a float32
    fragment: reduce_max → exp2 in place → reduce_sum → scale → store. When rows are 16-byte aligned and
    split evenly over the threads of a row, T.copy moves them and vectorizes. Otherwise the fragment is padded
    to a multiple of (threads per row) · (elements per run), loads are masked (the pad holds -inf) and each
    thread owns runs of 8 halves when N is a multiple of 8 (rows 16-byte aligned), else single halves:
    correct for any (M, N). (TileLang 0.1.15 finds no layout for T.copy of e.g. 3000 columns over 256
    threads.)

    min_blocks_per_sm > 0 asks nvcc for that many resident blocks per SM (__launch_bounds__' second argument:
    registers capped at 64K / (n · threads)); 0 leaves the launch bounds as they were."""
    R = rows_per_block
    if threads % R:
        raise ValueError(f"softmax: {R} rows per block must divide {threads} threads")
    per_row = threads // R
    vec = 8 if N % 8 == 0 else 1
    aligned = vec == 8 and N % per_row == 0  # what T.copy's layout inference splits (TileLang 0.1.15)
    width = N if aligned else -(-N // (per_row * vec)) * per_row * vec

    @T.prim_func
    def softmax_rows_in_registers(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, R), threads=threads) as bx:
            if min_blocks_per_sm:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            x = T.alloc_fragment((R, width), "float32")
            row_max = T.alloc_fragment((R,), "float32")
            row_sum = T.alloc_fragment((R,), "float32")
            if aligned:
                T.copy(X[bx * R, 0], x)  # the one read: 16-byte vectors, converted to float32 in registers
            else:
                T.annotate_layout({x: row_split_layout(R, width, per_row, vec)})
                for i, j in T.Parallel(R, width):
                    x[i, j] = T.if_then_else(j < N, T.cast(X[bx * R + i, j], "float32"), -T.infinity("float32"))
            exponentials_and_reciprocal_sums(x, row_max, row_sum, R, width)
            if aligned:
                for i, j in T.Parallel(R, width):
                    x[i, j] = x[i, j] * row_sum[i]
                T.copy(x, Y[bx * R, 0])  # the one write
            else:
                for i, j in T.Parallel(R, width):
                    if j < N:
                        Y[bx * R + i, j] = T.cast(x[i, j] * row_sum[i], dtype)

    return softmax_rows_in_registers


def row_split_layout(rows: int, width: int, threads_per_row: int, vec: int):
    """Fragment layout for (rows, width): row i belongs to threads [i·t, (i+1)·t); along the row, runs of `vec`
    consecutive elements go to consecutive threads, so a warp reads 32·vec consecutive elements (16-byte
    vectors when vec = 8, single halves when the rows are not 16-byte aligned)."""
    from tilelang.layout import Fragment

    t = threads_per_row
    return Fragment([rows, width], forward_thread_fn=lambda i, j: i * t + (j // vec) % t,
                    forward_index_fn=lambda i, j: (j // (vec * t)) * vec + j % vec)


def staged_vector_width(N: int, per_row: int) -> int:
    """Elements each thread moves per shared-memory access in the staged kernels. 16-byte vectors only when
    they tile the row exactly: the generated vector read of the padded tail is not masked (only its use is),
    so a padded row with vectors reads past the shared buffer (seen on the H200: 999x3000 faulted). An odd
    width also puts row starts at odd addresses. Otherwise single elements, each load masked."""
    return 8 if N % (per_row * 8) == 0 else 1


def rows_staged_in_shared(M: int, N: int, rows_per_block: int, threads: int, dtype: str = "float16",
                          bulk_copy: bool = True, min_blocks_per_sm: int = 0):
    """Odd widths: the block's rows are one contiguous range of R·N elements of the flattened tensor; with R a
    multiple of 8 it starts on a 16-byte boundary, so it is copied to shared memory with wide loads. Each row
    is then read from shared memory into a fragment padded to a multiple of the threads per row (the pad
    holds -inf, which adds 0 to the sum), normalized there and written back through shared memory.
    min_blocks_per_sm: as in rows_in_registers (0: launch bounds unchanged)."""
    R = rows_per_block
    if threads % R or (R * N) % 8:
        raise ValueError(f"staged softmax: {R} rows per block must divide {threads} threads and R·N must be a "
                         f"multiple of 8 (16-byte aligned blocks); got N={N}")
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
            if bulk_copy:  # Hopper: one TMA bulk copy, completion tracked by an mbarrier
                T.copy(X[bx * R * N:(bx + 1) * R * N], rows, prefer_instruction="tma")
            else:
                T.copy(X[bx * R * N:(bx + 1) * R * N], rows)
            for i, j in T.Parallel(R, padded):
                x[i, j] = T.if_then_else(j < N, T.cast(rows[i * N + j], "float32"), -T.infinity("float32"))
            exponentials_and_reciprocal_sums(x, row_max, row_sum, R, padded)
            for i, j in T.Parallel(R, padded):
                if j < N:
                    rows[i * N + j] = T.cast(x[i, j] * row_sum[i], dtype)
            T.copy(rows, Y[bx * R * N:(bx + 1) * R * N])

    return softmax_rows_staged


def long_rows_online(M: int, N: int, chunk: int, threads: int, dtype: str = "float16", bulk_copy: bool = True):
    """One row per block, staged whole in shared memory (N·2 bytes); pass 1 walks it in chunks keeping a
    running max m and a running sum s (s ← s·2^(m_old−m_new) + Σ 2^(x−m_new): the online softmax), pass 2
    recomputes each chunk's exponentials from shared memory and writes them scaled by 1/s."""
    if N % chunk:
        raise ValueError(f"long-row softmax: width {N} is not a multiple of the chunk {chunk}")
    steps = N // chunk

    @T.prim_func
    def softmax_long_rows_online(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            row = T.alloc_shared((N,), dtype)
            x = T.alloc_fragment((chunk,), "float32")
            chunk_max = T.alloc_fragment((1,), "float32")
            chunk_sum = T.alloc_fragment((1,), "float32")
            run_max = T.alloc_fragment((1,), "float32")
            run_sum = T.alloc_fragment((1,), "float32")
            if bulk_copy:  # Hopper: one TMA bulk copy, completion tracked by an mbarrier
                T.copy(X[bx, 0:N], row, prefer_instruction="tma")
            else:
                T.copy(X[bx, 0:N], row)
            T.fill(run_max, -T.infinity("float32"))
            T.fill(run_sum, 0.0)
            for c in T.serial(steps):
                for j in T.Parallel(chunk):
                    x[j] = T.cast(row[c * chunk + j], "float32") * LOG2E
                T.reduce_max(x, chunk_max, dim=0)
                for j in T.Parallel(chunk):
                    x[j] = T.exp2(x[j] - T.max(chunk_max[0], run_max[0]))
                T.reduce_sum(x, chunk_sum, dim=0)
                for i in T.Parallel(1):
                    run_sum[i] = run_sum[i] * T.exp2(run_max[i] - T.max(chunk_max[i], run_max[i])) + chunk_sum[i]
                    run_max[i] = T.max(chunk_max[i], run_max[i])
            for i in T.Parallel(1):
                run_sum[i] = 1.0 / run_sum[i]
            for c in T.serial(steps):
                for j in T.Parallel(chunk):
                    Y[bx, c * chunk + j] = T.cast(
                        T.exp2(T.cast(row[c * chunk + j], "float32") * LOG2E - run_max[0]) * run_sum[0], dtype)

    return softmax_long_rows_online


def long_rows_thread_online(M: int, N: int, threads: int, dtype: str = "float16", bulk_copy: bool = True):
    """Like long_rows_online, but each thread runs its own online softmax over its slices of the row (a
    (threads, 8) fragment whose row i belongs to thread i, so the per-chunk reductions stay inside a thread),
    and the block combines the per-thread (max, sum) pairs once at the end: two block-wide reductions per row
    instead of two per chunk."""
    vec = 8
    chunk = threads * vec
    if N % chunk:
        raise ValueError(f"long-row softmax: width {N} is not a multiple of {chunk} (threads x 8)")
    steps = N // chunk

    @T.prim_func
    def softmax_long_rows_thread_online(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            row = T.alloc_shared((N,), dtype)
            x = T.alloc_fragment((threads, vec), "float32")
            part_max = T.alloc_fragment((threads,), "float32")  # thread i's running max (of x·log2e)
            part_sum = T.alloc_fragment((threads,), "float32")  # thread i's running sum of 2^(x·log2e - max)
            slice_max = T.alloc_fragment((threads,), "float32")
            slice_sum = T.alloc_fragment((threads,), "float32")
            row_max = T.alloc_fragment((1,), "float32")
            row_sum = T.alloc_fragment((1,), "float32")
            T.annotate_layout({x: row_split_layout(threads, vec, 1, vec)})
            if bulk_copy:
                T.copy(X[bx, 0:N], row, prefer_instruction="tma")
            else:
                T.copy(X[bx, 0:N], row)
            T.fill(part_max, -T.infinity("float32"))
            T.fill(part_sum, 0.0)
            for c in T.serial(steps):
                for i, j in T.Parallel(threads, vec):
                    x[i, j] = T.cast(row[c * chunk + i * vec + j], "float32") * LOG2E
                T.reduce_max(x, slice_max, dim=1)  # within one thread: no communication
                for i in T.Parallel(threads):
                    slice_max[i] = T.max(slice_max[i], part_max[i])
                for i, j in T.Parallel(threads, vec):
                    x[i, j] = T.exp2(x[i, j] - slice_max[i])
                T.reduce_sum(x, slice_sum, dim=1)
                for i in T.Parallel(threads):
                    part_sum[i] = part_sum[i] * T.exp2(part_max[i] - slice_max[i]) + slice_sum[i]
                    part_max[i] = slice_max[i]
            T.reduce_max(part_max, row_max, dim=0)  # the block's one exchange for the max ...
            for i in T.Parallel(threads):
                part_sum[i] = part_sum[i] * T.exp2(part_max[i] - row_max[0])
            T.reduce_sum(part_sum, row_sum, dim=0)  # ... and one for the sum
            for i in T.Parallel(1):
                row_sum[i] = 1.0 / row_sum[i]
            for c in T.serial(steps):
                for i, j in T.Parallel(threads, vec):
                    Y[bx, c * chunk + i * vec + j] = T.cast(
                        T.exp2(T.cast(row[c * chunk + i * vec + j], "float32") * LOG2E - row_max[0]) * row_sum[0], dtype)

    return softmax_long_rows_thread_online


# ---------------------------------------------------------------------------------------------------------
# Choosing a kernel for a shape and a GPU
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SoftmaxPlan:
    kind: str  # "registers" | "staged" | "online" | "online-per-thread"
    rows_per_block: int  # or the chunk length for "online"
    threads: int
    min_blocks_per_sm: int = 0  # registers / staged: __launch_bounds__' resident blocks per SM (0: not set)

    @property
    def flat(self) -> bool:
        """The staged kernel addresses the tensor as one flat array (its blocks are flat ranges)."""
        return self.kind == "staged"

    def describe(self) -> str:
        if self.kind == "online-per-thread":
            return f"online two-pass over a row in shared memory, per-thread (max, sum) merged once, {self.threads} threads"
        if self.kind == "online":
            return f"online two-pass over a row in shared memory, chunks of {self.rows_per_block}, {self.threads} threads"
        rows = f"{self.rows_per_block} row{'s' if self.rows_per_block > 1 else ''}/block"
        where = "staged in shared memory" if self.kind == "staged" else "registers"
        bound = f", >= {self.min_blocks_per_sm} blocks/SM" if self.min_blocks_per_sm else ""
        return f"{where}, {rows}, {self.threads} threads{bound}"


REGISTER_ROW_LIMIT = 8192  # float32 elements of a row kept in registers by one block (16 per thread at 512)
PER_THREAD_LIMIT = 64  # float32 elements per thread in the odd-width staged kernel
SMALL_ODD_ROWS, SMALL_ODD_THREADS = 4, 128  # odd widths up to 32 · PER_THREAD_LIMIT = 2048 (see choose_plan)


def choose_plan(M: int, N: int, smem_budget: int, family: str = "hopper") -> SoftmaxPlan:
    """Pick the kernel shape for (M, N) on a GPU family with `smem_budget` bytes of shared memory per block.

    The choices come from the H200 probe (bench/attention_probe.py, 2026-12-02; % of a 1 GiB device copy):
    4096 wide: staged 1 row/256 threads 97%, registers 95%; 8192: registers 1 row/512 threads 98% (1024
    threads 62%); 32768: online chunks of 4096 with 512 threads 78%, registers with 1024 threads 74%, the
    whole row staged 63%; 1823 (a 15 MB problem, one wave of blocks): staged 8 rows 48-49%, masked
    registers 48%. Odd widths up to 2048 (bench/softmax_probe.py, H200 2026-12-03, 4096x1823, 42 plans in turns
    with a copy of the same 30 MB): masked registers, 4 rows per block of 128 threads, registers capped for 8
    resident blocks per SM (the 1024 blocks in one wave) 13.4 µs = 91.7% of that copy; the staged 8-row kernel
    14.8 µs = 82.8%."""
    if M < 1 or N < 1:
        raise ValueError(f"softmax: shape ({M}, {N}) must be positive")
    row_bytes = N * 2
    aligned = N % 8 == 0
    if aligned and N <= REGISTER_ROW_LIMIT:
        if N <= 4096:
            # Hopper: the staged kernel's bulk (TMA) copies edge out the register kernel's 16-byte loads.
            return SoftmaxPlan("staged" if family == "hopper" else "registers", 1, 256)
        return SoftmaxPlan("registers", 1, 512)
    if aligned:
        # Second H200 probe: chunks of 8192 with 512 threads 98% of copy, 4096 with 256 threads 93%.
        if N % 8192 == 0 and row_bytes + 8192 <= smem_budget:
            return SoftmaxPlan("online", 8192, 512)
        if N % 4096 == 0 and row_bytes + 8192 <= smem_budget:
            return SoftmaxPlan("online", 4096, 256)
        if row_bytes + 8192 <= smem_budget and N <= 1024 * PER_THREAD_LIMIT:
            return SoftmaxPlan("staged", 1, 1024)
    else:
        if M % SMALL_ODD_ROWS == 0 and -(-N // (SMALL_ODD_THREADS // SMALL_ODD_ROWS)) <= PER_THREAD_LIMIT:
            # short odd rows: 32 threads per row, masked loads; every row a block touches exists (M % 4 == 0)
            return SoftmaxPlan("registers", SMALL_ODD_ROWS, SMALL_ODD_THREADS, min_blocks_per_sm=8)
        per_row = 1
        while per_row < 128 and -(-N // per_row) > PER_THREAD_LIMIT:
            per_row *= 2
        fits = -(-N // per_row) <= PER_THREAD_LIMIT
        if fits and M % 8 == 0 and 8 * row_bytes + 8192 <= smem_budget:
            return SoftmaxPlan("staged", 8, 8 * per_row)  # 8 rows: a 16-byte aligned flat range
        if N <= REGISTER_ROW_LIMIT:
            return SoftmaxPlan("registers", 1, 256)  # any M: masked single-half loads
    raise ValueError(f"softmax: rows of {N} halves are beyond this tour's kernels on this GPU (a row must fit "
                     f"in {smem_budget} bytes of shared memory; odd widths up to {REGISTER_ROW_LIMIT} or "
                     f"{128 * PER_THREAD_LIMIT} with rows a multiple of 8)")


def build(M: int, N: int, plan: SoftmaxPlan, family: str = "hopper"):
    if plan.kind == "registers":
        return rows_in_registers(M, N, plan.rows_per_block, plan.threads, min_blocks_per_sm=plan.min_blocks_per_sm)
    bulk = family == "hopper"
    if plan.kind == "online-per-thread":
        return long_rows_thread_online(M, N, plan.threads, bulk_copy=bulk)
    if plan.kind == "staged":
        return rows_staged_in_shared(M, N, plan.rows_per_block, plan.threads, bulk_copy=bulk,
                                     min_blocks_per_sm=plan.min_blocks_per_sm)
    return long_rows_online(M, N, plan.rows_per_block, plan.threads, bulk_copy=bulk)


def compile_softmax(M: int, N: int, plan: SoftmaxPlan, family: str = "hopper"):
    """A callable softmax(x) -> y for fp16 (M, N) tensors, compiled for the GPU in use."""
    import torch

    kernel = tilelang.compile(build(M, N, plan, family), out_idx=None, target="cuda")

    def softmax(x, y=None):
        y = torch.empty_like(x) if y is None else y
        if plan.flat:
            kernel(x.view(-1), y.view(-1))
        else:
            kernel(x, y)
        return y

    softmax.source = kernel.get_kernel_source()
    return softmax


# ---------------------------------------------------------------------------------------------------------
# The reference, the check, the benchmark
# ---------------------------------------------------------------------------------------------------------


def reference(x):
    """torch.softmax in float32: the higher-precision reference for an fp16 kernel."""
    import torch

    return torch.softmax(x.float(), dim=-1)


def check_shape(M: int, N: int, plan: SoftmaxPlan, softmax=None, family: str = "hopper") -> "tourkit.Check":
    import torch

    softmax = softmax or compile_softmax(M, N, plan, family)
    x = tourkit.random_tensor((M, N), torch.float16, scale=3.0)
    y = torch.empty_like(x)
    return tourkit.validate(f"softmax {M}x{N} [{plan.describe()}]", lambda: softmax(x, y), y, reference(x), 5e-3)


def bench_shape(M: int, N: int, softmax) -> dict:
    import torch

    x = tourkit.random_tensor((M, N), torch.float16, scale=3.0)
    y = torch.empty_like(x)
    times = tourkit.bench_interleaved({"ours": lambda: softmax(x, y), "torch": lambda: torch.softmax(x, dim=-1),
                                       "copy": lambda: y.copy_(x)})
    nbytes = 2 * M * N * 2  # one read, one write
    return {"ms": times["ours"], "gbps": tourkit.gbps(nbytes, times["ours"]), "torch_ms": times["torch"],
            "torch_gbps": tourkit.gbps(nbytes, times["torch"]), "copy_gbps": tourkit.gbps(nbytes, times["copy"])}


# ---------------------------------------------------------------------------------------------------------
# The section
# ---------------------------------------------------------------------------------------------------------

ODD_SHAPES = [(1001, 1823), (1000, 1823), (999, 4096), (37, 32768)]  # correctness only: odd rows and widths


def show_generated(ctx, source: str) -> None:
    """The row reduction as TileLang wrote it: a per-thread loop, then a cross-thread AllReduce."""
    excerpt = tourkit.source_excerpt(source, r"AllReduce<tl::MaxOp", context=5, limit=14)
    if excerpt:
        ctx.log("")
        ctx.log("generated CUDA around T.reduce_max (per-thread max, then shuffles + a shared-memory exchange):")
        ctx.log(tourkit.indent(excerpt, "  "))


def run_compile_only(ctx) -> None:
    family = tourkit.ARCH_SPECS[ctx.arch].family
    jobs, asked = [], {}
    for M, N in BENCH_SHAPES + [(1001, 1823)]:
        plan = choose_plan(M, N, ctx.smem_budget, family)
        name = f"softmax {M}x{N} {plan.kind}"
        ctx.log(f"{M}x{N}: {plan.describe()}")
        jobs.append((name, build(M, N, plan, family), ctx.arch))
        asked[name] = plan.threads
    reports = tourkit.inspect_kernels(jobs)
    tourkit.report_kernels(ctx, reports, asked)
    show_generated(ctx, reports[0].source)
    failed = [r for r in reports if r.nvcc.startswith("failed")]
    if failed:
        raise tourkit.ValidationError(f"{failed[0].name}: nvcc {failed[0].nvcc}")
    ctx.headline(kernels=len(reports), arch=ctx.arch)


def problems(ctx) -> tuple[list, list]:
    """The benchmarked shapes and the odd (correctness-only) shapes of this run."""
    return (QUICK_SHAPES if ctx.quick else BENCH_SHAPES), (ODD_SHAPES if not ctx.quick else ODD_SHAPES[:1])


def prepare(ctx, log=None) -> None:
    """Every kernel run() launches, compiled at once; compile_softmax then finds each in TileLang's cache."""
    shapes, odd_shapes = problems(ctx)
    tourkit.compile_many([build(M, N, choose_plan(M, N, ctx.smem_budget, ctx.device.family), ctx.device.family)
                          for M, N in list(shapes) + list(odd_shapes)], log=log)


def run(ctx) -> None:
    if ctx.compile_only:
        run_compile_only(ctx)
        return
    family = ctx.device.family
    shapes, odd_shapes = problems(ctx)
    prepare(ctx, log=ctx.log)
    copy = tourkit.device_copy_gbps()
    ctx.log(f"device-to-device copy right now: {copy:.0f} GB/s (read + write: softmax's own traffic, the ceiling)")
    checks, rows, sources = [], [], []
    worst_of_copy = worst_of_same_size_copy = math.inf
    for M, N in shapes:
        plan = choose_plan(M, N, ctx.smem_budget, family)
        softmax = compile_softmax(M, N, plan, family)
        sources.append(softmax.source)
        check = check_shape(M, N, plan, softmax, family)
        checks.append(check)
        ctx.log(check.line())
        if not check.passed:
            continue
        r = bench_shape(M, N, softmax)
        worst_of_copy = min(worst_of_copy, r["gbps"] / copy)
        worst_of_same_size_copy = min(worst_of_same_size_copy, r["gbps"] / r["copy_gbps"])
        rows.append([f"{M}x{N}", plan.describe(), f"{1000 * r['ms']:.1f}", r["gbps"], f"{100 * r['gbps'] / copy:.0f}%",
                     f"{100 * r['gbps'] / r['copy_gbps']:.0f}%", r["torch_gbps"],
                     f"{tourkit.speedup(r['torch_ms'], r['ms']):.2f}x"])
        ctx.metric(**{f"softmax_{M}x{N}_gbps": r["gbps"], f"softmax_{M}x{N}_torch_gbps": r["torch_gbps"],
                      f"softmax_{M}x{N}_copy_gbps": r["copy_gbps"]})
    for M, N in odd_shapes:
        plan = choose_plan(M, N, ctx.smem_budget, family)
        check = check_shape(M, N, plan, family=family)
        checks.append(check)
        ctx.log(check.line())
    tourkit.require(checks)
    ctx.log("")
    ctx.table(["shape", "kernel", "µs", "GB/s", "of 1 GiB copy", "of same-size copy", "torch GB/s", "vs torch"], rows)
    ctx.log("(a small problem cannot reach the 1 GiB copy's rate: launch and the first wave's latency weigh more;")
    ctx.log(" the same-size copy, y.copy_(x) of the same bytes timed in turns with the kernel, is its ceiling)")
    show_generated(ctx, sources[0])
    ctx.headline(worst_of_same_size_copy=round(worst_of_same_size_copy, 3), worst_of_1gib_copy=round(worst_of_copy, 3),
                 copy_gbps=round(copy))


SECTION = Section(
    name="softmax",
    title="Softmax: rows in registers, one read and one write",
    summary="Row softmax with reduce_max / exp2 / reduce_sum on fragments; odd widths and long rows; GB/s vs copy.",
    run=run,
    prepare=prepare,
)
