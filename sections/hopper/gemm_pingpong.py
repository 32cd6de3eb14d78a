"""Appendix: the ping-pong GEMM, the hand-written kernel for a heavy fused epilogue (Hopper, sm_90a).

What it adds over gemm_ws.py. There both consumer warpgroups share one 128x256 tile, so when the K loop ends
both run the epilogue (bias, GELU, conversion, store) while the tensor cores wait. Here (CUTLASS's ping-pong
schedule) each consumer warpgroup owns a whole tile of its own: warpgroup 0 takes the block's even tiles,
warpgroup 1 its odd ones, and they take turns on the tensor cores. One's K loop starts when the other's has
passed its last `full` wait (two named barriers, MATH_ORDER_BARRIERS), so while one runs its epilogue the
other's wgmma keep the tensor cores busy. The turns are also what makes the one shared ring safe: without
them a warpgroup would wait on `full` for a step two ring rounds ahead, and a parity wait cannot tell that
round from the current one. The producer loads each tile's bias into the slot of the warpgroup that takes it.

The ring, the register split and the persistent tile order are gemm_ws.py's; the epilogue is the lesson's
(sections/gemm_epilogue.py). The fusion lesson times this kernel, fused, beside its own.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import dataclass

import tilelang
import tilelang.language as T

from sections.gemm_epilogue import activation_macro, epilogue_pass_configs
from sections.gemm_schedules import check_problem, gemm_prim_func
from sections.hopper.gemm_ws import WS_STORE_BLOCK_N, tile_scheduler, ws_pipeline, ws_register_split

MATH_ORDER_BARRIERS = (8, 9)  # named barrier ids of the turns (TileLang's own syncs use low ids)


@dataclass(frozen=True)
class PingPongConfig:
    """One schedule of the ping-pong kernel: two consumer warpgroups (threads=256), each on its own
    block_M x block_N tile, and a producer warpgroup; persistent on `persistent` blocks."""

    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    persistent: int
    threads: int = 256
    swizzle: bool = True
    panel: int = 8
    policy: str = "FullRow"

    @property
    def block_threads(self) -> int:
        """Threads a block launches with: two consumer warpgroups and the producer warpgroup."""
        return self.threads + 128

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """An upper bound of the kernel's shared memory: the ring; per consumer warpgroup a C strip and a
        bias tile; mbarriers and alignment."""
        stages = max(1, self.num_stages)
        pipeline = stages * (self.block_M * self.block_K + self.block_K * self.block_N) * dtype_bytes
        return pipeline + 2 * (self.block_M * WS_STORE_BLOCK_N + self.block_N) * dtype_bytes + 2 * stages * 8 + 1056

    def columns(self) -> dict:
        return {"kernel": f"hand-written ping-pong, persistent on {self.persistent} SMs",
                "tile": f"{self.block_M}x{self.block_N}x{self.block_K}", "stages": self.num_stages,
                "threads": f"{self.threads}+128", "swizzle": f"panel {self.panel}" if self.swizzle else "off",
                "policy": "a tile per warpgroup"}

    def label(self) -> str:
        c = self.columns()
        return (f"hand-written ping-pong {c['tile']}, {c['stages']} stages, {c['threads']} threads, swizzle "
                f"{c['swizzle']}, {c['policy']}, persistent on {self.persistent} SMs")


def appendix_schedule(M: int, N: int, K: int, sm_count: int) -> PingPongConfig:
    """The fused kernel the fusion lesson times beside its own: 128x192 tiles (fewer operand bytes a FLOP
    than 128x128; 192 fp32 accumulators a thread of the one warpgroup that owns a tile), a 4-stage ring, one block per SM. Of the kernels
    tried it led fused bias + GELU at 8192^3; the rule does not depend on the shape."""
    return PingPongConfig(128, 192, 64, 4, persistent=sm_count)


def check_pingpong(config: PingPongConfig) -> None:
    problems = []
    if config.block_M not in (64, 128) or config.threads != 256:
        problems.append(f"block_M={config.block_M} must be 64 or 128 and threads={config.threads} 256 "
                        f"(two consumer warpgroups, each on its own tile)")
    if config.persistent <= 0:
        problems.append("persistent must be > 0 (the two warpgroups alternate over a block's tiles)")
    if config.policy != "FullRow":
        problems.append(f"policy={config.policy!r} must be 'FullRow'")
    if config.block_N % WS_STORE_BLOCK_N:
        problems.append(f"block_N={config.block_N} must be a multiple of the {WS_STORE_BLOCK_N}-column store strips")
    if problems:
        raise ValueError(f"ping-pong schedule {config.label()}: " + "; ".join(problems))


def gemm_pingpong_body(M: int, N: int, K: int, config: PingPongConfig, bias: bool, activate, dtype: str,
                       accum_dtype: str):
    """The kernel body(A, B, Bias, C): threads 0-127 and 128-255 are the two consumer warpgroups, 256-383
    the producer."""
    bM, bN, bK, num_stages = config.block_M, config.block_N, config.block_K, config.num_stages
    workers = config.persistent
    producer_regs, consumer_regs = ws_register_split(2, True)
    m_tiles, n_tiles, k_steps = T.ceildiv(M, bM), T.ceildiv(N, bN), T.ceildiv(K, bK)
    total_tiles = m_tiles * n_tiles
    strips = bN // WS_STORE_BLOCK_N
    _, produce_tile, mainloop = ws_pipeline(bM, bN, bK, k_steps, num_stages)

    def scheduler(block_id):
        tiles = tile_scheduler(m_tiles, n_tiles, config, workers)
        tiles.init(block_id)
        return tiles

    @T.macro
    def produce_bias(Bias, Bias_s, bias_full, bias_empty, n, tile):
        """Tile `tile`'s bias columns into the slot of the warpgroup that takes it, once that warpgroup has
        added its previous tile's (its (tile // 2)-th use of the slot)."""
        if bias:
            slot = tile % 2
            T.mbarrier_wait_parity(bias_empty[slot], ((tile // 2) & 1) ^ 1)
            T.tma_copy(Bias[n * bN:(n + 1) * bN], Bias_s[slot, :], barrier=bias_full[slot])
            T.mbarrier_arrive(bias_full[slot])

    @T.macro
    def store_tile(C, C_local, C_s, m, n):
        """The warpgroup's tile out through its own block_M x 64 shared strip, by TMA."""
        for j in T.unroll(strips):
            T.tma_store_wait(0)  # the strip's previous store has finished reading it
            T.copy(C_local[:, j * WS_STORE_BLOCK_N:(j + 1) * WS_STORE_BLOCK_N], C_s)
            column = n * bN + j * WS_STORE_BLOCK_N
            T.tma_copy(C_s, C[m * bM:(m + 1) * bM, column:column + WS_STORE_BLOCK_N])

    @T.macro
    def consumer(C, A_s, B_s, C_local, C_s, Bias_s, full, empty, bias_full, bias_empty, block_id, turn):
        T.set_max_nreg(consumer_regs, 1)
        tiles = scheduler(block_id)
        while tiles.valid():
            if tiles.current_iter % 2 == turn:
                if tiles.current_iter > 0:  # the other warpgroup's K loop has passed its last `full` wait
                    T.sync_threads(MATH_ORDER_BARRIERS[turn], 256)
                mainloop(A_s, B_s, C_local, full, empty, tiles.current_iter * k_steps)
                if block_id + (tiles.current_iter + 1) * workers < total_tiles:  # the other has a next tile
                    T.named_barrier_arrive(MATH_ORDER_BARRIERS[1 - turn], 256)
                if bias:
                    T.mbarrier_wait_parity(bias_full[turn], (tiles.current_iter // 2) & 1)
                    for i, j in T.Parallel(bM, bN):
                        C_local[i, j] = C_local[i, j] + Bias_s[turn, j]
                    T.mbarrier_arrive(bias_empty[turn])
                activate(C_local)
                store_tile(C, C_local, C_s, tiles.m_idx, tiles.n_idx)
            tiles.next_tile()
        T.tma_store_wait(0)  # shared memory must outlive the stores reading it

    @T.macro
    def pingpong(A, B, Bias, C):
        with T.Kernel(workers, threads=384) as block_id:
            A_s = T.alloc_shared((num_stages, bM, bK), dtype)
            B_s = T.alloc_shared((num_stages, bK, bN), dtype)
            C_s0 = T.alloc_shared((bM, WS_STORE_BLOCK_N), dtype)
            C_s1 = T.alloc_shared((bM, WS_STORE_BLOCK_N), dtype)
            C_local0 = T.alloc_fragment((bM, bN), accum_dtype)
            C_local1 = T.alloc_fragment((bM, bN), accum_dtype)
            Bias_s = T.alloc_shared((2, bN), dtype)
            full = T.alloc_barrier([128] * num_stages)  # the producer warpgroup's arrivals plus the TMA bytes
            empty = T.alloc_barrier([128] * num_stages)  # one warpgroup consumes a stage
            bias_full = T.alloc_barrier([128, 128])
            bias_empty = T.alloc_barrier([128, 128])
            tid = T.get_thread_binding()
            if tid >= 256:
                T.set_max_nreg(producer_regs, 0)
                tiles = scheduler(block_id)
                while tiles.valid():
                    produce_bias(Bias, Bias_s, bias_full, bias_empty, tiles.n_idx, tiles.current_iter)
                    produce_tile(A, B, A_s, B_s, full, empty, tiles.m_idx, tiles.n_idx, tiles.current_iter * k_steps)
                    tiles.next_tile()
            elif tid >= 128:
                consumer(C, A_s, B_s, C_local1, C_s1, Bias_s, full, empty, bias_full, bias_empty, block_id, 1)
            else:
                consumer(C, A_s, B_s, C_local0, C_s0, Bias_s, full, empty, bias_full, bias_empty, block_id, 0)

    return pingpong


def appendix_program(M: int, N: int, K: int, config: PingPongConfig, *, bias: bool = False,
                     activation: str | None = None, dtype: str = "float16", accum_dtype: str = "float32",
                     b_cols: int = 0):
    """C = activation(A @ B + Bias) over A[M, K], B[K, N], (Bias[N],) C[M, N], the ping-pong kernel (b_cols:
    B's rows padded to that many columns, GemmPlan.pad_b)."""
    check_problem(M, N, K, activation, dtype)
    check_pingpong(config)
    activate = activation_macro(config.block_M, config.block_N, activation)
    body = gemm_pingpong_body(M, N, K, config, bias, activate, dtype, accum_dtype)
    return gemm_prim_func(M, N, K, body, bias, dtype, b_cols=b_cols)


def compile_appendix(M: int, N: int, K: int, config: PingPongConfig, *, bias: bool = False,
                     activation: str | None = None):
    """Compile for the local GPU (Hopper): kernel(a, b, c) or kernel(a, b, bias, c)."""
    func = appendix_program(M, N, K, config, bias=bias, activation=activation)
    return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=epilogue_pass_configs(activation))
