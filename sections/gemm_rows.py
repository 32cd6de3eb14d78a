"""A GEMM of a few rows on the CUDA cores: C = A·B where A has at most ROWS_MAX rows (decoding's one token, a
small batch of them), for any N and K.

With so few rows there is nothing for the tensor cores to do: the problem is B, read once from memory. A tensor-
core tile would be mostly padding, and where B's rows are not 16-byte aligned its loads would wait for each
other (`gemm_plans.masked_seconds`). Here the tile language is used thread by thread (`T.get_thread_binding`,
`T.alloc_local`): a warp's 32 lanes take consecutive columns of a strip, each a vector of `vec` columns as wide
as B's row length keeps aligned, and the block's warps take different rows of B, so one block streams a strip
of B with a few hundred loads in flight:

    for each block (bx, bz), in parallel:       # bx: a strip of block_N columns; bz: a run of K (split_k)
        acc[M][vec] = 0                         # fp32, registers: this thread's columns of every row of C
        for each step of groups x block_K rows of B in run bz:
            A_shared[M, step rows] = A[:, step rows]   # the same few values for every thread
            b = B[this group's block_K rows, this lane's vec columns]   # all issued, then used
            acc += A_shared[:, those rows] · b  # M x vec FMAs per row of B
        sums[group] = acc                       # the groups' sums meet in shared memory
        if split_k == 1:
            C[:, strip] = epilogue(sum over groups)
        else:                                   # fp32 partials of this run, which splitk_reduce_program adds
            W[bz, :, strip] = sum over groups   #   (and applies the epilogue to), or with last_adds:
            fence; arrived = atomic_add(Arrivals[bx], 1); fence
            if arrived == split_k - 1:          # the strip's last run to finish adds them all
                C[:, strip] = epilogue(sum over runs of W[:, :, strip]); Arrivals[bx] = 0

Consecutive lanes read consecutive columns, so a warp's loads of a row of B are coalesced whatever N is; the K
split spreads the strips over every SM (`rows_schedule`). The split's runs are added by the strip's last block
to arrive (`last_adds`), which saves the reduction's launch, at one or two rows a tenth of the time:
`__threadfence` makes a block's partials visible to the others before its arrival is counted, so the last block
reads every run's (`gemm_epilogue.last_arrival_macro`, shared with the tensor-core GEMM).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import dataclass, replace

import tilelang.language as T

from sections.gemm_epilogue import sums_in_kernel

ROWS_MAX = 8  # more rows: the tensor cores' tiles pay (each row adds an FMA to every element of B loaded)
KERNEL_ROWS_MAX = 32  # what the kernel can be built for (bench/gemm_rows_probe.py times it beyond the rule's)
ACC_REGISTERS = 64  # fp32 sums a thread keeps (M x vec): wider loads give way to more rows
ALIGNED_ROWS_MAX = 2  # where B's rows are 16-byte aligned the tensor cores stream B as fast from 3 rows on
VECTORS = (8, 4, 2, 1)  # elements a load may take: the widest whose alignment every row of B keeps


@dataclass(frozen=True)
class RowsConfig:
    """threads a block, in groups of `lanes` along a row of B (each thread vec consecutive columns: 8 is 16
    bytes) and threads // lanes groups along K, each loading block_K rows a step; split_k runs of K, each a
    block of the grid (1: C written directly, else fp32 partials and the split-K reduction; last_adds: the
    partials added by the last block of each strip to arrive instead, in the same launch); rows: the most rows
    of A it is built for (its shared memory is sized for them)."""

    threads: int = 256
    vec: int = 8
    lanes: int = 32
    block_K: int = 8
    split_k: int = 1
    last_adds: bool = False
    rows: int = ROWS_MAX
    warp_specialized = False  # no TMA producer: plain loads by every thread
    persistent, swizzle, panel = 0, False, 1

    @property
    def groups(self) -> int:
        return self.threads // self.lanes

    @property
    def block_N(self) -> int:
        return self.lanes * self.vec

    @property
    def block_M(self) -> int:
        return self.rows

    def run(self, K: int) -> int:
        """Rows of K a block sums: K's share of a split, rounded up to whole steps (groups x block_K rows);
        the ends past K are masked."""
        rows = self.groups * self.block_K
        return -(-(-(-K // self.split_k)) // rows) * rows

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """A's step (every group's rows) and the groups' sums, fp32."""
        return self.rows * (self.groups * self.block_K * dtype_bytes + self.groups * self.block_N * 4) + 1024

    @property
    def split_text(self) -> str:
        if self.split_k == 1:
            return ""
        return f", K split {self.split_k}" + (" added by the last to arrive" if self.last_adds else "")

    def columns(self) -> dict:
        split = self.split_text
        return {"kernel": "CUDA cores, few rows", "tile": f"rows x {self.block_N} x {self.groups}x{self.block_K}",
                "stages": 1, "threads": self.threads, "swizzle": "off",
                "policy": f"{self.groups} groups along K, {self.vec}-element loads{split}"}

    def label(self) -> str:
        return (f"CUDA cores, {self.block_N} columns x {self.groups} groups of {self.block_K} rows, {self.threads} "
                f"threads, {self.vec}-element loads{self.split_text}")


def widest_vector(N: int, lanes: int = 32) -> int:
    """Elements of the widest load every row of B keeps aligned (a row starts at a multiple of N elements),
    no wider than a warp's lanes spread over N need."""
    return next(v for v in VECTORS if N % v == 0 and (lanes * v <= N or v == 1))


def rows_program(M: int, N: int, K: int, config: RowsConfig, *, bias: bool = False, activation=None,
                 dtype: str = "float16"):
    """C = activation(A @ B + Bias) for A of at most ROWS_MAX rows. With config.split_k > 1 each block writes its
    run's fp32 partial sums to W[split_k, M, N] (`splitk_reduce_program` adds them and applies the epilogue);
    with config.last_adds it also counts itself in Arrivals[strip], and the strip's last block adds the runs and
    applies the epilogue (one launch, no separate reduction), then sets the count back to 0."""
    from sections.gemm_epilogue import epilogue_macro, last_arrival_macro

    if M > config.rows or config.rows > KERNEL_ROWS_MAX:
        raise ValueError(f"this few-rows kernel takes at most {min(config.rows, KERNEL_ROWS_MAX)} rows of A, not {M}")
    if N % config.vec:
        raise ValueError(f"loads of {config.vec} elements need N a multiple of {config.vec}, not {N}")
    vec, lanes, groups, bK, splits = config.vec, config.lanes, config.groups, config.block_K, config.split_k
    bN, rows, run = config.block_N, groups * bK, config.run(K)  # rows: of B a block's step loads, bK a group
    # The sum over groups is a fragment spread over the block's threads, which needs its element count a
    # multiple of them or fewer: where M x block_N is neither, it takes the next row count that is (the rows
    # past M are zeros, never stored).
    c_rows = next(r for r in range(M, M + config.threads) if (r * bN) % config.threads == 0 or r * bN < config.threads)
    in_kernel = splits == 1 or config.last_adds  # the epilogue here, not in the split-K reduction
    bias = bias and in_kernel
    epilogue = epilogue_macro(c_rows, bN, bias, activation if in_kernel else None)
    add_if_last = last_arrival_macro(c_rows, bN, M, N, splits, epilogue, config.threads)

    @T.macro
    def body(A, B, Bias, W, Arrivals, C):
        with T.Kernel(T.ceildiv(N, bN), splits, threads=config.threads) as (bx, bz):
            tx = T.get_thread_binding()
            lane, group = tx % lanes, tx // lanes
            acc = T.alloc_local((M * vec,), "float32")  # this thread's vec columns of every row of C
            b = T.alloc_local((bK * vec,), dtype)
            A_shared = T.alloc_shared((M, rows), dtype)  # every thread needs the same few values of A
            sums = T.alloc_shared((groups, M, bN), "float32")
            C_local = T.alloc_fragment((c_rows, bN), "float32")
            Bias_shared = T.alloc_shared((bN,), dtype) if bias else None
            col = bx * bN + lane * vec
            for i in T.unroll(M * vec):
                acc[i] = 0.0
            for step in T.serial(run // rows):
                k0 = bz * run + step * rows
                for m, kk in T.Parallel(M, rows):
                    A_shared[m, kk] = T.if_then_else(k0 + kk < K, A[m, k0 + kk], T.cast(0, dtype))
                for kk in T.unroll(bK):  # the step's loads first, all in flight together
                    if k0 + group * bK + kk < K and col < N:
                        for j in T.vectorized(vec):
                            b[kk * vec + j] = B[k0 + group * bK + kk, col + j]
                    else:
                        for j in T.vectorized(vec):
                            b[kk * vec + j] = T.cast(0, dtype)
                for kk in T.unroll(bK):
                    for m in T.unroll(M):
                        for j in T.unroll(vec):
                            acc[m * vec + j] += (T.cast(A_shared[m, group * bK + kk], "float32")
                                                 * T.cast(b[kk * vec + j], "float32"))
            for m in T.unroll(M):  # the groups' sums meet in shared memory
                for j in T.vectorized(vec):
                    sums[group, m, lane * vec + j] = acc[m * vec + j]
            for m, n in T.Parallel(c_rows, bN):
                C_local[m, n] = T.if_then_else(m < M, sums[0, m, n], 0.0)
                for g in T.unroll(1, groups):
                    C_local[m, n] = C_local[m, n] + T.if_then_else(m < M, sums[g, m, n], 0.0)
            if bias:
                T.copy(Bias[bx * bN], Bias_shared)
            if splits == 1:
                epilogue(C_local, Bias_shared)
                T.copy(C_local, C[0, bx * bN])
            else:
                T.copy(C_local, W[bz, 0, bx * bN])
            if config.last_adds and splits > 1:
                add_if_last(W, Arrivals, C, C_local, Bias_shared, bx, 0, bx * bN)

    return rows_prim_func(M, N, K, body, bias, dtype, splits, -(-N // bN), config.last_adds)


def rows_prim_func(M: int, N: int, K: int, body, bias: bool, dtype: str, splits: int, strips: int, last_adds: bool):
    """The prim_func around body(A, B, Bias, W, Arrivals, C): without a split, C (and Bias[N] with a bias); with
    one, the partials W[splits, M, N] last in C's place; with last_adds, Bias, W, the arrival counts, then C."""
    from sections.gemm_launch import gemm_prim_func

    if splits == 1:
        return gemm_prim_func(M, N, K, lambda A, B, Bias, C: body(A, B, Bias, None, None, C), bias, dtype)
    if not last_adds:
        return gemm_prim_func(M, N, K, lambda A, B, Bias, W: body(A, B, None, W, None, None), False, dtype,
                              (splits, M, N), "float32")
    return gemm_prim_func(M, N, K, body, bias, dtype, (splits, M, N), "float32", counts=strips)


BLOCKS_PER_SM = 4  # blocks of 256 threads an SM keeps busy: their loads in flight hide each other's round trips
PARTIALS_SHARE = 16  # a K split writes and reads M x N fp32 partials: at most a 1/16 of B's bytes, all splits
UNROLLED_SPLITS = 64  # the split-K reduction issues every run's loads together up to this many runs
ROWS_REDUCE_COLUMNS = 256  # columns of C a 128-thread block of the split-K reduction sums (all M rows of them)
ROWS_STREAM = 1.0  # the share of the model's memory bandwidth these plain loads sustain (fitted at one or two rows)
ISSUE_PER_SM = 128 * 1.5e9  # thread instructions an SM issues a second: 4 schedulers of 32 lanes, at a capped clock


def rows_schedule(M: int, N: int, K: int, sm_count: int) -> RowsConfig:
    """Loads as wide as B's rows allow, 128 bytes of them in flight a thread (block_K rows); a warp's lanes
    along a row of B, the block's 8 warps along K; K split across blocks until the strips of columns make
    BLOCKS_PER_SM blocks an SM, each group at least two steps, the partials a small share of B."""
    vec = max(v for v in VECTORS if v <= widest_vector(N) and (M * v <= ACC_REGISTERS or v == 1))
    # 128 bytes of B in flight a thread; half as many beyond ROWS_MAX rows, whose sums take the registers
    config = RowsConfig(256, vec, 32, (64 if M <= ROWS_MAX else 32) // vec, rows=max(ROWS_MAX, -(-M // 8) * 8))
    strips, rows = -(-N // config.block_N), config.groups * config.block_K
    wanted = -(-BLOCKS_PER_SM * sm_count // strips)
    most = max(1, min(K // (2 * rows), K // (PARTIALS_SHARE * 2 * M), UNROLLED_SPLITS))
    config = replace(config, split_k=max(1, min(wanted, most)))
    config = replace(config, split_k=-(-K // config.run(K)))  # no run left empty by the rounding to whole steps
    return replace(config, last_adds=sums_in_kernel(M, N, config))


def rows_seconds(M: int, N: int, K: int, config: RowsConfig, sm_count: int, memory: float, launch: float) -> float:
    """B streamed once (and the partials written and read back) at ROWS_STREAM of the bandwidth, or the
    instructions, whichever take longer; a launch, and with a split K the reduction's (unless the last block
    adds the runs). An element of B costs M FMAs, and per vector of vec elements M reads of A from shared
    memory and M conversions, its load and vec conversions: with 1-element loads the instructions dominate."""
    partials = 2 * 4 * config.split_k * M * N if config.split_k > 1 else 0
    stream_s = (2 * (K * N + M * K + M * N) + partials) / (ROWS_STREAM * memory)
    math_s = N * K * (M * (1 + 2 / config.vec) + 1 + 1 / config.vec) / (sm_count * ISSUE_PER_SM)
    return max(stream_s, math_s) + launch * (2 if config.split_k > 1 and not config.last_adds else 1)


def takes_rows(M: int, N: int, K: int) -> bool:
    """Whether the few-rows kernel beats the tensor cores' plan: one or two rows of A; up to ROWS_MAX where
    B's or A's rows are not 16-byte aligned (the tensor cores would load them masked, or copy them padded)."""
    return M <= ALIGNED_ROWS_MAX or (M <= ROWS_MAX and (N % 8 != 0 or K % 8 != 0))


def rows_reason(M: int, N: int, K: int, config: RowsConfig, sm_count: int, memory: float, launch: float) -> str:
    """The rule's line for a few-rows plan: the loads, the strips and splits against the SMs, the estimate."""
    strips = -(-N // config.block_N)
    split = f", K split {config.split_k} ways" if config.split_k > 1 else ""
    estimate = rows_seconds(M, N, K, config, sm_count, memory, launch)
    why = "" if M <= ALIGNED_ROWS_MAX else " (rows not 16-byte aligned: the tensor cores would load them masked)"
    return (f"{M} row{'s' * (M > 1)} of A{why}: the CUDA cores, B streamed once in {config.vec}-element loads; "
            f"{strips} strips of {config.block_N} columns{split}: {strips * config.split_k} blocks on {sm_count} SMs, "
            f"estimated {estimate * 1e6:.0f} us")
