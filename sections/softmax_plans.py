"""How the softmax lesson picks a kernel for a problem of M rows by N columns on a GPU: rules, not tables.

Softmax reads every element once and writes it once, so a good plan keeps enough bytes in flight on every SM
and never holds more of a row than the registers or shared memory can take:

* a thread holds MIN_SHARE to 2·MIN_SHARE elements of a row (16-byte vectors where rows start 16-byte
  aligned, i.e. N % 8 == 0; otherwise the widest access the width allows; single elements: ODD_MIN_SHARE,
  or down to ODD_NARROW_SHARE so that a narrow odd row has up to a warp of threads);
* so a row is split over a power-of-two number of threads, and a block of BLOCK_THREADS threads holds several
  narrow rows (64 columns: 4 threads a row, 32 rows a block), a wide row alone;
* on Hopper a narrow odd row (ODD_STAGED_WIDTHS) is staged with its neighbours: a group of rows, one flat run
  of memory, is one bulk copy into shared memory, where single-element loads would coalesce poorly;
* a row longer than REGISTER_ROW_LIMIT is walked twice with the online max and sum: staged in shared memory
  when it fits (one read of global memory), else as much of it as fits, the rest streamed from global memory
  in both passes (the second mostly hits the L2 cache, which holds the rows the resident blocks work on);
  512 threads when the row fits (blocks share an SM; on Hopper 256 when it is staged in one or two steps, so
  that more blocks hide each one's fixed costs), 1024 when its head fills the SM alone; a row that starts
  unaligned (N % 8) is staged and streamed by its aligned body (aligned_body), its few edge elements singly;
* on Hopper a row too long for one block's shared memory, or so long that fewer than CLUSTER_MIN_BLOCKS
  staged blocks share an SM, is split over a cluster of CLUSTER_SIZES blocks instead: each block stages its
  run of the row's whole 16-byte vectors (the few edge columns of an odd width singly), and the blocks exchange
  their (max, sum) through distributed shared memory: one read of global memory, no second pass.

Pure Python (no torch; tilelang only inside row_split_layout and an odd row's indices): the tests check these
rules for every width on every architecture.
"""

import math
from dataclasses import dataclass, field, replace

MIN_SHARE = 12  # elements of a row a thread holds at least in the register kernel, on average (8 is too few)
ODD_MIN_SHARE = 32  # ... when loads are single elements (odd widths): more loads in flight per thread
# ...but an odd row narrower than that takes more threads, each at least ODD_NARROW_SHARE elements, up to a warp:
# with a few threads a row, a warp's single-element loads spread over many rows, and such plans ran at a third
# of torch.softmax's speed (BENCHMARKS.md, "softmax: the plans").
ODD_NARROW_SHARE = 8
WARP = 32
BLOCK_THREADS = 128  # a block of narrow rows (as fast as 256 or 512, and smaller blocks fill the SMs evenly)
ODD_MIN_BLOCKS = 8  # short odd rows (up to 2048): registers capped so that 8 blocks of 128 threads fit an SM...
ODD_CAPPED_MAX_SHARE = 57  # ...where a thread's floats fit those 64 registers (ptxas: 57 do, 58 spill)
# Hopper: an odd row this wide (from, below) is staged with its neighbours instead: a block's rows are one flat
# run of memory, so one bulk copy reads them whole. These rows take 8 or 16 threads, fewer than a warp, so in
# registers a warp's single-element loads spread over several rows and coalesce poorly; from 256 columns a row
# has a warp and the two kernels were level (BENCHMARKS.md, "softmax: the plans").
ODD_STAGED_WIDTHS = (64, 256)
ODD_STAGED_THREADS = 256  # a staged block of narrow odd rows: R rows of threads_per_row threads, R a multiple of 8
REGISTER_ROW_LIMIT = 8192  # widest row kept in registers (16 floats on each of 512 threads; 1024 are slower)
ONLINE_THREADS, ONLINE_PER_THREAD = 512, 16  # long rows: 8192 columns a step, two vectors a thread
SMEM_SLACK = 8192  # bytes of shared memory a staged kernel keeps for barriers and the reductions
# A row staged whole in at most this many columns (two steps): blocks of 256 threads, 32 elements a thread a step
# (the same 8192-column step), so that twice as many blocks share an SM (Hopper, where it was measured). With 512
# threads such a block's fixed costs (the copy's wait, two short walks, the store) showed; from about 17000
# columns on the two were level (BENCHMARKS.md).
SHORT_STAGED_MAX = 16384
CLUSTER_SIZES = (2, 4, 8)  # blocks a cluster may split a row over (8: the portable maximum on Hopper)
# Staged blocks an SM below which a row is better split over a cluster: with one or two, an SM's loads sit
# idle while its blocks compute and write; from three on, one block's copy is always in flight.
CLUSTER_MIN_BLOCKS = 3
# A cluster's blocks: 256 threads, 4096 columns a step (less padding of a part, more blocks an SM than 512).
CLUSTER_THREADS = 256


@dataclass(frozen=True)
class SoftmaxPlan:
    kind: str  # "registers" | "staged" | "online" | "cluster"
    rows_per_block: int  # registers/staged: rows a block; online: elements a thread holds per step
    threads: int
    min_blocks_per_sm: int = 0  # registers / staged: __launch_bounds__' resident blocks per SM (0: not set)
    staged: int = 0  # online: the columns at the start of a row staged in shared memory; cluster: each block's part
    cluster: int = 1  # cluster: the blocks a row is split over
    why: str = field(default="", compare=False)  # one line a learner can follow

    def describe(self) -> str:
        if self.kind == "cluster":
            return (f"row split over a cluster of {self.cluster} blocks, {self.staged} columns each staged in shared "
                    f"memory, {self.rows_per_block} elements a thread a step, {self.threads} threads")
        if self.kind == "online":
            where = f"{self.staged} columns of a row staged in shared memory" if self.staged else "row streamed"
            return f"online two-pass, {where}, {self.rows_per_block} elements a thread a step, {self.threads} threads"
        rows = f"{self.rows_per_block} row{'s' if self.rows_per_block > 1 else ''}/block"
        where = "staged in shared memory" if self.kind == "staged" else "registers"
        bound = f", >= {self.min_blocks_per_sm} blocks/SM" if self.min_blocks_per_sm else ""
        return f"{where}, {rows}, {self.threads} threads{bound}"


def vector_width(N: int) -> int:
    """Elements per load: rows of N 2-byte elements start 16-byte aligned when N % 8 == 0 (8 at a time),
    8-byte aligned when N % 4 == 0, and so on."""
    return math.gcd(N, 8)


def per_thread(N: int, threads_per_row: int) -> int:
    """Floats of a row one thread holds: whole vectors, the row padded up to threads_per_row · vector."""
    vec = vector_width(N)
    return -(-N // (threads_per_row * vec)) * vec


def threads_per_row(N: int) -> int:
    """The most threads (a power of two, at most 1024) that still give each thread MIN_SHARE elements of the row
    on average (ODD_MIN_SHARE when loads are single elements): fewer threads would leave each with more work
    than the registers like, more would leave each too few bytes in flight. A thread then holds at most
    2·MIN_SHARE elements, padding included (a share is whole vectors). An odd row takes at least as many
    threads as give each ODD_NARROW_SHARE elements, up to a warp."""
    def doubled(share: int, most: int = 1024) -> int:
        t = 1
        while t < most and N >= 2 * t * share:
            t *= 2
        return t

    if vector_width(N) > 1:
        return doubled(MIN_SHARE)
    return max(doubled(ODD_MIN_SHARE), doubled(ODD_NARROW_SHARE, WARP))


def register_plan(M: int, N: int) -> SoftmaxPlan:
    t = threads_per_row(N)
    rows = max(1, BLOCK_THREADS // t)
    share = per_thread(N, t)
    # Odd rows of 1025 to 2048 hold 33 to 64 floats on each of a warp's threads: capping the registers keeps 8
    # blocks on an SM where the floats still fit them.
    capped = vector_width(N) == 1 and 32 < share <= ODD_CAPPED_MAX_SHARE and N <= 2048
    min_blocks = ODD_MIN_BLOCKS if capped else 0
    why = (f"a row of {N} fits in registers: {t} thread{'s' if t > 1 else ''} a row, {share} float{'s' if share > 1 else ''} each"
           + (" (single-element loads: the width is odd)" if vector_width(N) == 1 and N > 1 else "") + "; "
           + (f"{rows} rows a block of {rows * t} threads" if rows > 1 else "one row a block"))
    return SoftmaxPlan("registers", rows, rows * t, min_blocks, why=why)


def odd_staged_plan(M: int, N: int) -> "SoftmaxPlan | None":
    """Narrow odd rows in groups of R (a multiple of 8, so that every group starts 16-byte aligned, and a divisor
    of M, so that every block's copy is whole), each group one bulk copy into shared memory; None where M has
    no such divisor (the register kernel then takes the rows)."""
    t = threads_per_row(N)
    rows = ODD_STAGED_THREADS // t
    while rows >= 8 and M % rows:
        rows //= 2
    if rows < 8:
        return None
    share = per_thread(N, t)
    return SoftmaxPlan("staged", rows, rows * t, why=(
        f"rows of {N} are odd: loaded one element at a time from global memory, a warp's loads would spread over "
        f"several rows, so {rows} rows ({2 * rows * N} bytes, starting 16-byte aligned) are one bulk copy into "
        f"shared memory; then {t} threads a row, {share} floats each, {rows * t} threads a block"))


def choose_plan(M: int, N: int, smem_budget: int, family: str = "hopper") -> SoftmaxPlan:
    """The kernel for (M, N) 2-byte elements (float16 or bfloat16) with `smem_budget` bytes of shared memory
    per block on a GPU of `family`. Every width from 1 up has a plan on every GPU."""
    if M < 1 or N < 1:
        raise ValueError(f"softmax: shape ({M}, {N}) must be positive")
    if family == "hopper" and 2048 < N <= 4096 and N % (256 * 8) == 0:
        return SoftmaxPlan("staged", 1, 256, why=f"a row of {N} is one TMA bulk copy into shared memory and splits "
                           "into whole 16-byte vectors over 256 threads, 16 floats each")
    if family == "hopper" and ODD_STAGED_WIDTHS[0] <= N < ODD_STAGED_WIDTHS[1] and N % 2:
        plan = odd_staged_plan(M, N)
        if plan:
            return plan
        in_registers = register_plan(M, N)
        return replace(in_registers, why=in_registers.why + f" (not staged: no group of 8 or more rows divides "
                       f"M = {M}, and a bulk copy of a partial group would read past the end)")
    if N <= REGISTER_ROW_LIMIT:
        return register_plan(M, N)
    plan = online_plan(N, smem_budget, family)
    if family == "hopper" and staged_blocks_per_sm(plan.staged, smem_budget) < CLUSTER_MIN_BLOCKS:
        return cluster_plan(N, smem_budget) or plan
    return plan


def staged_blocks_per_sm(columns: int, smem_budget: int, threads: int = ONLINE_THREADS) -> int:
    """Blocks that fit an SM's shared memory when each stages `columns` (padded to whole steps of `threads`
    threads, ONLINE_PER_THREAD columns each) and keeps SMEM_SLACK for its barriers and reductions."""
    step = threads * ONLINE_PER_THREAD
    return smem_budget // (2 * (-(-columns // step) * step) + SMEM_SLACK)


def cluster_part(N: int, cluster: int) -> int:
    """Columns each block of a cluster stages: the row's whole 16-byte vectors (N // 8 of them) shared out,
    rounded up (the last block's run is shorter)."""
    return 8 * -(-(N // 8) // cluster)


def line_lead(N: int, part: int) -> int:
    """Vectors (16 bytes) a cluster block's copy may start before its part: 0 where every part starts on a
    128-byte line, else up to 7, so that the copy starts on the line holding the part's first column and the
    copy engine reads whole lines (a start inside a line splits every line of the copy in two)."""
    return 0 if N % 64 == 0 and part % 64 == 0 else 7


def splits_over(N: int, cluster: int) -> bool:
    """Whether every block of the cluster owns some of the row's whole vectors (N // 8, one fewer where the row
    starts unaligned) when each takes cluster_part columns."""
    return N // 8 - 1 > (cluster - 1) * cluster_part(N, cluster) // 8


def cluster_plan(N: int, smem_budget: int) -> "SoftmaxPlan | None":
    """The fewest blocks of a cluster that split a row into parts small enough that CLUSTER_MIN_BLOCKS blocks
    share an SM (one's copy always in flight); None where none does."""
    for size in CLUSTER_SIZES:
        part = cluster_part(N, size)
        if splits_over(N, size) and staged_blocks_per_sm(part, smem_budget, CLUSTER_THREADS) >= CLUSTER_MIN_BLOCKS:
            edges = "" if N % 8 == 0 else (" (rows of an odd width start unaligned: the first and last blocks also "
                                           "take the few columns outside whole 16-byte vectors, one at a time)")
            whole = staged_blocks_per_sm(aligned_body(N), smem_budget)
            fit = ("is too long for one block's shared memory" if whole == 0 else
                   f"fits one block's shared memory, but only {whole} such block{'s' if whole > 1 else ''} would "
                   f"share an SM (fewer than {CLUSTER_MIN_BLOCKS}: no copy always in flight)")
            return SoftmaxPlan("cluster", ONLINE_PER_THREAD, CLUSTER_THREADS, staged=part, cluster=size, why=(
                f"a row of {N} {fit}: split over a cluster of {size} blocks, "
                f"{part} columns each, staged by one bulk copy (one read of global memory"
                f"{', from the 128-byte line that holds its start' if line_lead(N, part) else ''}){edges}; the blocks "
                f"exchange their max and sum through distributed shared memory, and {CLUSTER_MIN_BLOCKS} blocks "
                "share an SM"))
    return None


def online_plan(N: int, smem_budget: int, family: str = "hopper") -> SoftmaxPlan:
    """A row too long for registers, walked twice. Threads: a block of 512 when the whole row fits shared memory
    (where two or more such blocks fit an SM, one's copy overlaps another's arithmetic; on Hopper 256 for a row of
    at most SHORT_STAGED_MAX, so that more blocks share an SM); 1024 when it does not (its
    head fills the SM alone, so the block itself must keep twice the loads of the streamed rest in flight).
    A row that does not start 16-byte aligned (N % 8) is staged and streamed by its aligned body (the kernel
    moves its few edge elements one at a time), so the same rule applies."""
    head = staged_head(N, smem_budget, ONLINE_THREADS * ONLINE_PER_THREAD)
    edges = "" if N % 8 == 0 else f" (its {head} columns of whole 16-byte vectors: rows of {N} start unaligned)"
    if head == aligned_body(N):
        short = head <= SHORT_STAGED_MAX and family == "hopper"
        threads = ONLINE_THREADS // 2 if short else ONLINE_THREADS
        return SoftmaxPlan("online", ONLINE_PER_THREAD * ONLINE_THREADS // threads, threads, staged=head, why=(
            f"a row of {N} is too long for registers but its {2 * N // 1024} KB fit shared memory: one bulk copy"
            f"{edges}, one read of global memory, then walked twice with the online max and sum; {threads} threads: "
            + ("a short row's block is mostly its fixed costs (the copy's wait, the store), so small blocks, many "
               "an SM, hide each other's" if short else
               "where two or more such blocks fit an SM, one's copy overlaps another's arithmetic")))
    threads = 2 * ONLINE_THREADS
    head = staged_head(N, smem_budget, threads * ONLINE_PER_THREAD)
    return SoftmaxPlan("online", ONLINE_PER_THREAD, threads, staged=head, why=(
        f"a row of {N} is too long for registers and for shared memory: its first {head} columns are staged at "
        "once, the rest streamed twice from global memory (the second pass mostly hits the L2 cache); the head "
        f"fills the SM alone, so a block of {threads} threads keeps twice the loads in flight"))


def aligned_body(N: int) -> int:
    """The whole 16-byte vectors inside every row of N: all of it when rows start 16-byte aligned (N % 8 == 0),
    else N less up to 7 elements before the first vector and up to 7 after the last (rounded down to 8)."""
    return N if N % 8 == 0 else N // 8 * 8 - 8


# An unaligned row (N % 8) in the online kernel: a body of whole 16-byte vectors, [first, first + body), and up
# to 7 single elements before it and 15 after. TileLang expressions: the kernel applies these to its loop
# variables, the tests to plain integers.
def body_start(row, N: int):
    """Flat index where the row's body starts: its first 16-byte aligned element."""
    return row * N if N % 8 == 0 else (row * N + 7) // 8 * 8


def edge_index(i, first, N: int):
    """Flat index of edge element i: i < 8 the 8 before the body, 8 <= i < 24 the 16 after it."""
    import tilelang.language as T

    return T.if_then_else(i < 8, first - 8 + i, first + aligned_body(N) + i - 8)


def edge_in_row(i, row, first, N: int):
    """Whether edge element i belongs to the row (the rest of those vectors belongs to the rows around it)."""
    import tilelang.language as T

    before, after = T.And(i < 8, first - 8 + i >= row * N), T.And(i >= 8, i < 24)
    return T.Or(before, T.And(after, first + aligned_body(N) + i - 8 < row * N + N))


def body_index(first, col, M: int, N: int):
    """Flat index of body column col. TileLang reads a vector before it masks it: clamped to the last whole one."""
    import tilelang.language as T

    return first + col if N % 8 == 0 else T.min(first // 8 + col // 8, M * N // 8 - 1) * 8 + col % 8


def staged_head(N: int, smem_budget: int, step: int) -> int:
    """Columns of a long row the online kernel stages in shared memory: the whole row (its aligned body) when it
    fits (the buffer padded to whole steps of the kernel), else as many whole steps as fit."""
    fit, body = (smem_budget - SMEM_SLACK) // 2, aligned_body(N)
    return body if -(-body // step) * step <= fit else fit // step * step


def staged_vector_width(N: int, per_row: int) -> int:
    """Elements per shared-memory access in the staged kernel: 16-byte vectors only when they tile the row
    exactly (a vector read of a padded tail would run past the shared buffer), else single masked ones."""
    return 8 if N % (per_row * 8) == 0 else 1


def uses_bulk_copy(plan: SoftmaxPlan, N: int, family: str) -> bool:
    """Hopper stages with TMA: the staged kernel's aligned groups of rows, the online kernel's rows' aligned bodies."""
    return family == "hopper" and (plan.kind in ("staged", "cluster") or (plan.kind == "online" and plan.staged > 0))


def row_split_layout(rows: int, width: int, threads_per_row: int, vec: int):
    """Fragment layout for (rows, width): row i belongs to threads [i·t, (i+1)·t); along the row, runs of
    `vec` consecutive elements go to consecutive threads, so a warp reads 32·vec consecutive elements."""
    from tilelang.layout import Fragment

    t = threads_per_row
    return Fragment([rows, width], forward_thread_fn=lambda i, j: i * t + (j // vec) % t,
                    forward_index_fn=lambda i, j: (j // (vec * t)) * vec + j % vec)


def step_column(threads: int, per_thread: int):
    """column(c, i, e): the row column of thread i's e-th element in step c of a walk in steps of
    threads·per_thread elements, as row_split_layout(threads, per_thread, 1, per_thread) places them: runs of 8
    in consecutive threads, so a warp's loads coalesce."""
    step = threads * per_thread
    return lambda c, i, e: c * step + (e // 8) * (threads * 8) + i * 8 + e % 8
