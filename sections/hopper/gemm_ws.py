"""Appendix: the GEMM with its warp specialization written by hand (Hopper, sm_90a).

What it adds over the lesson (sections/gemm_schedules.py). There `T.Pipelined` + `T.gemm` let TileLang build
the pipeline: on Hopper it splits the block into a TMA producer warpgroup and consumer warpgroups, but the
consumers wait for each K step's whole wgmma batch (`warpgroup_wait<0>`) before handing the stage back, so
the tensor cores idle between K steps. Here the same roles are written out, as CUTLASS's Hopper mainloop:

* a TMA producer warpgroup (`T.tma_copy`) fills a ring of `num_stages` shared-memory stages; each stage has a
  `full` and an `empty` mbarrier (`T.alloc_barrier`), and their phase parities say which round of the ring a
  wait is for (`ws_pipeline`);
* consumer warpgroups issue each stage's wgmma batch without waiting (`T.wgmma_gemm`), then `T.wait_wgmma(1)`:
  the previous step's batch is finished, so only that stage goes back to the producer: one batch in flight;
* a register split: the producer lowers itself to 24 (or 40) registers a thread, the consumers raise
  themselves to 240 / 232 (`T.set_max_nreg`), so a 128x256 fp32 accumulator fits in two warpgroups;
* a persistent grid (`T.PersistentTileScheduler`): one block per SM walks the tiles in the lesson's swizzled
  panel order, the ring's phases carrying on across tiles, so the producer loads the next tile while the
  consumers run the epilogue; with even rounds, on the fewest blocks that need no more rounds (`persistent_grid`);
* the store staged through shared memory in block_M x 64 strips by TMA, or the whole tile at once, which
  TileLang writes with stmatrix (`store_buffers`);
* clusters of two blocks walking neighbouring tile rows (`pairs`): both need the same B tile at every K step,
  so the cluster's first block loads it once into both blocks' shared memory (TMA multicast, `cluster_mask`),
  and a stage is free again only when the consumers of both blocks are done with it: each consumer thread
  arrives on its own `empty` barrier and on its partner's (`T.ptx_arrive_cluster_barrier`). Half of B's
  traffic from L2 is gone (PAIRS_MAX_ROUNDS says where that was measured to pay).

The epilogue (bias, GELU) is the lesson's: sections/gemm_epilogue.py.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import dataclass, replace

import tilelang
import tilelang.language as T

from sections.gemm_epilogue import activation_macro, epilogue_pass_configs
from sections.gemm_schedules import check_problem, gemm_prim_func

WS_STORE_BLOCK_N = 64  # C leaves in block_M x 64 strips (a whole 128x256 tile next to four stages would not fit)
PRODUCER_REGISTERS = 24  # a thread of the TMA producer warpgroup


@dataclass(frozen=True)
class WsConfig:
    """One schedule of the hand-written kernel: threads / 128 consumer warpgroups, each owning block_M /
    warpgroups full rows of the tile (policy FullRow), plus a 128-thread producer warpgroup.
    persistent > 0: a persistent grid of that many blocks (one per SM), fewer with even_rounds.
    store_buffers: shared block_M x 64 strips staging the store (block_N / 64: the whole tile).
    pairs: the persistent blocks in clusters of two on neighbouring tile rows, sharing each B tile by TMA multicast."""

    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    swizzle: bool
    panel: int = 8
    policy: str = "FullRow"
    persistent: int = 0
    store_buffers: int = 1
    even_rounds: bool = False
    pairs: bool = False

    @property
    def block_threads(self) -> int:
        """Threads a block launches with: the consumers and the producer warpgroup."""
        return self.threads + 128

    @property
    def stages_whole_tile(self) -> bool:
        """The whole C tile staged (store_buffers = block_N / 64 strips): one stmatrix copy."""
        return self.store_buffers * WS_STORE_BLOCK_N == self.block_N

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """An upper bound of the kernel's shared memory: its ring, C strips and mbarriers all live at once."""
        stages = max(1, self.num_stages)
        pipeline = stages * (self.block_M * self.block_K + self.block_K * self.block_N) * dtype_bytes
        strips = self.store_buffers * self.block_M * WS_STORE_BLOCK_N * dtype_bytes
        return pipeline + strips + 2 * stages * 8 + 1024 + self.block_N * dtype_bytes

    def grid_words(self) -> str:
        pairs = ", clusters of 2 sharing B" if self.pairs else ""
        return (f", persistent on {self.persistent} SMs" + (", even rounds" if self.even_rounds else "")
                if self.persistent else "") + pairs

    def columns(self) -> dict:
        grid = self.grid_words()
        store = "whole-tile" if self.stages_whole_tile else f"{self.store_buffers}-strip"
        return {"kernel": f"hand-written ws{grid}", "tile": f"{self.block_M}x{self.block_N}x{self.block_K}",
                "stages": self.num_stages, "threads": f"{self.threads}+128",
                "swizzle": f"panel {self.panel}" if self.swizzle else "off",
                "policy": f"{self.policy}, {store} store"}

    def label(self) -> str:
        grid = self.grid_words()
        c = self.columns()
        return (f"hand-written ws {c['tile']}, {c['stages']} stages, {c['threads']} threads, swizzle {c['swizzle']}, "
                f"{c['policy']}{grid}")


# The appendix's tiles, 128 rows by block_N columns: (ring stages, C strips staged: the whole tile).
APPENDIX_TILES = {256: (3, 4), 192: (4, 3), 128: (4, 2)}


def appendix_schedule(M: int, N: int, K: int, sm_count: int, smem_budget: int = 232448) -> WsConfig:
    """The kernel the lesson times beside its own: 128-row tiles with a ring of stages next to the whole C tile
    staged (the epilogue never waits for a store), persistent on as few of the `sm_count` blocks as take the
    same number of tile rounds. Its width (256, 192 or 128 columns) is the one the lesson's cost model
    estimates fastest (gemm_plans.estimate_seconds: the tiles' rounds on the SMs): 128x256 on big problems,
    where it led the shape set of the schedules tried; 128x192 where 128x256 tiles would leave a part-empty
    last round (2000x3000x4000, 3000^3); 128x128 where wider tiles are too few for the SMs. In cluster pairs
    sharing B where B's rows are off 128-byte lines and the tiles take few rounds (PAIRS_MAX_ROUNDS)."""
    from sections.gemm_plans import GemmConfig, estimate_seconds

    def estimate(block_N: int) -> float:
        config = GemmConfig(128, block_N, 64, APPENDIX_TILES[block_N][0], 256, True)
        return estimate_seconds(M, N, K, config, "hopper", sm_count, smem_budget)

    block_N = min(APPENDIX_TILES, key=estimate)  # ties: the widest
    stages, strips = APPENDIX_TILES[block_N]
    rounds = -(-tile_count(M, N, WsConfig(128, block_N, 64, stages, 256, True)) // sm_count)
    pairs = block_N >= 192 and N % 64 != 0 and rounds <= PAIRS_MAX_ROUNDS and sm_count % 2 == 0
    return WsConfig(128, block_N, 64, stages, 256, True, persistent=sm_count, store_buffers=strips,
                    even_rounds=True, pairs=pairs)


# Cluster pairs (WsConfig.pairs) with 192- or 256-wide tiles where B's rows do not start on 128-byte lines (N not
# a multiple of 64 elements) and the tiles take at most this many rounds of the SMs. There one tile a block without
# a partner fell furthest behind cuBLAS (B's rows off 32-byte sectors load slower through TMA:
# bench/gemm_alignment_probe.py), and halving B's loads by multicast paid (bench/gemm_experiments_probe.py, 39
# problems). With aligned rows, 128-wide tiles or many rounds, pairs were mostly level or behind (the cluster's two
# blocks wait on each other at every stage, and a long persistent walk already hides each tile's start and end).
PAIRS_MAX_ROUNDS = 5


def check_ws(config: WsConfig) -> None:
    """The shapes the hand-written kernel is written for."""
    consumers = config.threads // 128
    problems = []
    if config.threads % 128 or consumers < 1 or config.block_M % (64 * consumers):
        problems.append(f"threads={config.threads} must be 128 x (consumer warpgroups) and block_M={config.block_M} "
                        f"a multiple of 64 x (consumer warpgroups)")
    if config.policy != "FullRow":
        problems.append(f"policy={config.policy!r} must be 'FullRow' (each warpgroup owns full rows)")
    if config.even_rounds and config.persistent <= 0:
        problems.append("even_rounds is for the persistent kernel only")
    if config.pairs and (config.persistent <= 0 or config.persistent % 2):
        problems.append(f"pairs (clusters of two blocks) walk tiles on an even persistent grid, not "
                        f"{config.persistent}")
    if config.block_N % WS_STORE_BLOCK_N:
        problems.append(f"block_N={config.block_N} must be a multiple of the {WS_STORE_BLOCK_N}-column store strips")
    strips = max(1, config.block_N // WS_STORE_BLOCK_N)
    if not 1 <= config.store_buffers <= strips:
        problems.append(f"the C store is staged in 1 to {strips} shared strips (store_buffers 1 to block_N / "
                        f"{WS_STORE_BLOCK_N})")
    if problems:
        raise ValueError(f"hand-written warp-specialized schedule {config.label()}: " + "; ".join(problems))


def ws_register_split(consumers: int, persistent: bool) -> tuple[int, int]:
    """(producer, consumer) registers per thread after setmaxnreg. The producer warpgroup keeps 24, or 40 when
    it also runs the persistent tile scheduler's index arithmetic (CUTLASS's 40/232); the consumers take what
    is left of the SM's 65536, a multiple of 8, at most 240."""
    producer = 40 if persistent else PRODUCER_REGISTERS
    consumer = min(240, (65536 - 128 * producer) // (128 * consumers) // 8 * 8)
    return producer, consumer


def ws_pipeline(block_M: int, block_N: int, block_K: int, k_steps, num_stages: int, pairs: bool = False):
    """The ring of the hand-written kernels: (stage_of, produce_tile, consume_tile).

    stage_of(step): a k-step's slot in the ring and the parity of its round (the n-th completion of a
    stage's barrier is phase n, parity n & 1). produce_tile: the producer's TMA loads of one output tile.
    consume_tile: the consumers' wgmma batches of one tile, one batch kept in flight. `first_step` counts
    the k-steps this block went through before the tile, so the ring's phases carry on across tiles.
    With `pairs` the B tile is multicast to both blocks of a 2-block cluster and a stage goes back in both."""
    policy = T.GemmWarpPolicy.FullRow  # one m64nN wgmma per 16 of K per warpgroup: shared memory read least
    b_mask = 0b11 if pairs else None  # the cluster's first block issues one load for both; each expects the bytes

    def stage_of(step):
        return step % num_stages, (step // num_stages) & 1

    @T.macro
    def give_back(empty, step):
        T.mbarrier_arrive(empty[stage_of(step)[0]])
        if pairs:  # the partner's copy of B in this stage came from the same load: it waits for us too
            T.ptx_arrive_cluster_barrier(empty[stage_of(step)[0]], 1 - T.block_rank_in_cluster())

    @T.macro
    def produce_tile(A, B, A_s, B_s, full, empty, m, n, first_step):
        for k in T.serial(k_steps):
            stage, parity = stage_of(first_step + k)
            # A fresh barrier sits in phase 0, so waiting for parity 1 returns at once: the first round of
            # stages is free without any consumer arrival.
            T.mbarrier_wait_parity(empty[stage], parity ^ 1)
            # One elected thread issues the copies (expect_tx + TMA); every producer thread then arrives, and
            # the phase completes when all of them arrived and the bytes landed.
            T.tma_copy(A[m * block_M:(m + 1) * block_M, k * block_K:(k + 1) * block_K], A_s[stage, :, :],
                       barrier=full[stage])
            T.tma_copy(B[k * block_K:(k + 1) * block_K, n * block_N:(n + 1) * block_N], B_s[stage, :, :],
                       barrier=full[stage], cluster_mask=b_mask)
            T.mbarrier_arrive(full[stage])

    @T.macro
    def consume_tile(A_s, B_s, C_local, full, empty, first_step):
        """On return every batch has finished and every stage this tile used has been handed back."""
        T.clear(C_local)
        for k in T.serial(k_steps):
            stage, parity = stage_of(first_step + k)
            T.mbarrier_wait_parity(full[stage], parity)
            T.wgmma_gemm(A_s[stage, :, :], B_s[stage, :, :], C_local, policy=policy)  # issued, not waited
            T.wait_wgmma(1)  # at most this step's batch still runs: the previous step's batch is done
            if k > 0:  # ... so its stage may be overwritten (step k-1 of this tile; none before step 0)
                give_back(empty, first_step + k - 1)
        T.wait_wgmma(0)
        # The last step's stage: the producer of a persistent kernel waits for it one ring round later.
        give_back(empty, first_step + k_steps - 1)

    return stage_of, produce_tile, consume_tile


def tile_count(M: int, N: int, config) -> int:
    """How many block_M x block_N tiles cover C (the last row and column of tiles may be partial)."""
    return -(-M // config.block_M) * -(-N // config.block_N)


def persistent_grid(config, tiles: int) -> int:
    """How many blocks a persistent kernel runs for `tiles` tiles: config.persistent (one per SM), or with
    even_rounds the fewest that need no more rounds of tiles than that, whose tile counts differ by one at most
    (2048 tiles: 128 blocks of 16 rounds, not 132 of which 64 idle through the 16th). Hopper
    GEMMs run at the power cap, so the SMs left idle lend their power to the others' clocks; at 16384^3 (8192
    tiles) 128 blocks would need 64 rounds instead of 63, and this rule keeps 131."""
    if not getattr(config, "even_rounds", False):
        return config.persistent
    rounds = -(-tiles // config.persistent)
    return -(-tiles // rounds)


def tile_scheduler(m_tiles, n_tiles, config, workers: int):
    """The persistent kernels' tile order: `workers` blocks take every workers-th tile of a linear order that
    sweeps panels of `panel` tile rows for L2 reuse (the lesson's T.use_swizzle order). With pairs the order is
    over pairs of tile rows (m_idx: a pair; each worker a cluster of two blocks, one a row)."""
    pairs = 2 if getattr(config, "pairs", False) else 1  # the ping-pong kernel's config has no pairs
    return T.PersistentTileScheduler(m_tiles, n_tiles, num_workers=workers // pairs,
                                     swizzle_size=max(1, config.panel // pairs) if config.swizzle else 1,
                                     column_major=False, cluster_size=pairs)


def persistent_blocks_for(M: int, N: int, config) -> int:
    """The persistent grid (persistent_grid) for a problem; with pairs, twice that of clusters over pairs of tiles."""
    if not getattr(config, "pairs", False):
        return persistent_grid(config, tile_count(M, N, config))
    units = -(-M // (2 * config.block_M)) * -(-N // config.block_N)
    return 2 * persistent_grid(replace(config, persistent=config.persistent // 2), units)


def gemm_ws_body(M: int, N: int, K: int, config: WsConfig, bias: bool, activate, dtype: str, accum_dtype: str):
    """The kernel body(A, B, Bias, C). The producer warpgroup comes last in the block (threads
    config.threads..config.threads+127); each role runs its own loop over the same tiles."""
    bM, bN, bK, num_stages = config.block_M, config.block_N, config.block_K, config.num_stages
    consumer_threads = config.threads
    persistent = config.persistent > 0
    producer_regs, consumer_regs = ws_register_split(consumer_threads // 128, persistent)
    m_tiles, n_tiles, k_steps = T.ceildiv(M, bM), T.ceildiv(N, bN), T.ceildiv(K, bK)
    blocks = persistent_blocks_for(M, N, config)  # when persistent
    strips, store_buffers = bN // WS_STORE_BLOCK_N, config.store_buffers
    whole_tile = config.stages_whole_tile  # C staged as one block_M x block_N tile
    panel = config.panel if config.swizzle else 1
    _, produce_tile, consume_tile = ws_pipeline(bM, bN, bK, k_steps, num_stages, config.pairs)
    producer_threads = 128  # those that run the producer loop and arrive on `full`
    cluster = 2 if config.pairs else 1  # blocks a worker of the persistent grid
    releasing = consumer_threads * cluster  # arrivals that free a stage: both blocks' consumers in pairs

    @T.macro
    def produce_bias(Bias, Bias_s, bias_full, bias_empty, n, tile):
        """The tile's bias columns, by TMA, into shared memory (columns past N read zeros), once the consumers
        have read the previous tile's: the `tile`-th use of the buffer."""
        if bias:
            T.mbarrier_wait_parity(bias_empty[0], (tile & 1) ^ 1)
            T.tma_copy(Bias[n * bN:(n + 1) * bN], Bias_s, barrier=bias_full[0])
            T.mbarrier_arrive(bias_full[0])

    @T.macro
    def add_bias(C_local, Bias_s, bias_full, bias_empty, tile):
        """The bias from the shared tile the producer loaded (reading it from global memory per element costs
        more than the whole epilogue); then the buffer goes back."""
        if bias:
            T.mbarrier_wait_parity(bias_full[0], tile & 1)
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = C_local[i, j] + Bias_s[j]
            T.mbarrier_arrive(bias_empty[0])

    @T.macro
    def store_tile(C, C_local, C_s, m, n):
        """fp32 accumulator -> fp16 strips of block_M x 64 in shared memory -> global by TMA. TileLang puts a
        named barrier over the consumer threads around each strip's shared writes, and one elected consumer
        thread issues the stores. Before a strip buffer is rewritten only the store issued `store_buffers`
        strips earlier must have finished reading it (across tiles too: the kernel drains once, at its end).
        With the whole tile staged it is one copy: TileLang writes it with stmatrix (16 a thread, not 64
        4-byte stores) between two barriers, not eight, and one thread issues the tile's TMA stores."""
        if whole_tile:
            T.tma_store_wait(0)  # the previous tile's stores, issued a whole K loop ago, have read the buffer
            T.copy(C_local, C_s)
            T.tma_copy(C_s, C[m * bM:(m + 1) * bM, n * bN:(n + 1) * bN])
        else:
            for j in T.unroll(strips):
                buffer = j % store_buffers
                T.tma_store_wait(store_buffers - 1)  # by the thread that issued the stores; a no-op for the rest
                T.copy(C_local[:, j * WS_STORE_BLOCK_N:(j + 1) * WS_STORE_BLOCK_N], C_s[buffer, :, :])
                column = n * bN + j * WS_STORE_BLOCK_N
                T.tma_copy(C_s[buffer, :, :], C[m * bM:(m + 1) * bM, column:column + WS_STORE_BLOCK_N])

    @T.macro
    def finish_tile(C, C_local, C_s, Bias_s, bias_full, bias_empty, m, n, tile):
        add_bias(C_local, Bias_s, bias_full, bias_empty, tile)
        activate(C_local)
        store_tile(C, C_local, C_s, m, n)

    def buffers():
        return (T.alloc_shared((num_stages, bM, bK), dtype),
                T.alloc_shared((num_stages, bK, bN), dtype),
                T.alloc_shared((bM, bN) if whole_tile else (store_buffers, bM, WS_STORE_BLOCK_N), dtype),
                T.alloc_fragment((bM, bN), accum_dtype),
                # full[s]: the producer threads' arrivals plus the TMA bytes; empty[s]: every consumer
                # thread's arrival after its wgmma batch reading stage s is known finished.
                T.alloc_barrier([producer_threads] * num_stages),
                T.alloc_barrier([releasing] * num_stages),
                # the bias tile: full when the producer's 128 arrived and its bytes landed; empty when every
                # consumer thread has added it
                T.alloc_shared((bN,), dtype), T.alloc_barrier([producer_threads]), T.alloc_barrier([consumer_threads]))

    @T.macro
    def produce_one_tile(A, B, Bias, A_s, B_s, full, empty, Bias_s, bias_full, bias_empty, bx, by):
        produce_bias(Bias, Bias_s, bias_full, bias_empty, bx, 0)
        produce_tile(A, B, A_s, B_s, full, empty, by, bx, 0)

    @T.macro
    def produce_block_tiles(A, B, Bias, A_s, B_s, full, empty, Bias_s, bias_full, bias_empty, block_id):
        tiles = tile_scheduler(m_tiles, n_tiles, config, blocks)
        tiles.init(block_id // cluster)
        while tiles.valid():
            produce_bias(Bias, Bias_s, bias_full, bias_empty, tiles.n_idx, tiles.current_iter)
            produce_tile(A, B, A_s, B_s, full, empty, tiles.m_idx * cluster + block_id % cluster, tiles.n_idx,
                         tiles.current_iter * k_steps)
            tiles.next_tile()

    @T.macro
    def one_tile_per_block(A, B, Bias, C):
        with T.Kernel(n_tiles, m_tiles, threads=consumer_threads + 128) as (bx, by):
            A_s, B_s, C_s, C_local, full, empty, Bias_s, bias_full, bias_empty = buffers()
            T.use_swizzle(panel_size=panel, enable=config.swizzle)
            tid = T.get_thread_binding()
            if tid >= consumer_threads:  # the producer warpgroup comes last
                T.set_max_nreg(producer_regs, 0)
                produce_one_tile(A, B, Bias, A_s, B_s, full, empty, Bias_s, bias_full, bias_empty, bx, by)
            else:
                T.set_max_nreg(consumer_regs, 1)
                consume_tile(A_s, B_s, C_local, full, empty, 0)
                finish_tile(C, C_local, C_s, Bias_s, bias_full, bias_empty, by, bx, 0)
                T.tma_store_wait(0)  # shared memory must outlive the stores reading it

    @T.macro
    def persistent_blocks(A, B, Bias, C):
        cluster_dims = (2, 1, 1) if config.pairs else None
        with T.Kernel(blocks, threads=consumer_threads + 128, cluster_dims=cluster_dims) as block_id:
            A_s, B_s, C_s, C_local, full, empty, Bias_s, bias_full, bias_empty = buffers()
            if config.pairs:
                T.cluster_sync()  # both blocks' barriers set up before the partner's loads and arrivals reach them
            tid = T.get_thread_binding()
            # Both roles walk the same tiles in the same order, each with its own scheduler (the grid stride
            # is `blocks`); `current_iter` counts this block's tiles.
            if tid >= consumer_threads:
                T.set_max_nreg(producer_regs, 0)
                produce_block_tiles(A, B, Bias, A_s, B_s, full, empty, Bias_s, bias_full, bias_empty, block_id)
            else:
                T.set_max_nreg(consumer_regs, 1)
                tiles = tile_scheduler(m_tiles, n_tiles, config, blocks)
                tiles.init(block_id // cluster)
                while tiles.valid():
                    consume_tile(A_s, B_s, C_local, full, empty, tiles.current_iter * k_steps)
                    finish_tile(C, C_local, C_s, Bias_s, bias_full, bias_empty,
                                tiles.m_idx * cluster + block_id % cluster, tiles.n_idx, tiles.current_iter)
                    tiles.next_tile()
                T.tma_store_wait(0)  # shared memory must outlive the stores reading it
            if config.pairs:
                T.cluster_sync()  # neither block exits while its partner may still arrive on its barriers

    return persistent_blocks if persistent else one_tile_per_block


def appendix_program(M: int, N: int, K: int, config: WsConfig, *, bias: bool = False, activation: str | None = None,
                     dtype: str = "float16", accum_dtype: str = "float32", b_cols: int = 0):
    """C = activation(A @ B + Bias) over A[M, K], B[K, N], (Bias[N],) C[M, N], the hand-written kernel (b_cols:
    B's rows padded to that many columns, GemmPlan.pad_b)."""
    check_problem(M, N, K, activation, dtype)
    check_ws(config)
    activate = activation_macro(config.block_M, config.block_N, activation)
    return gemm_prim_func(M, N, K, gemm_ws_body(M, N, K, config, bias, activate, dtype, accum_dtype), bias, dtype,
                          b_cols=b_cols)


def compile_appendix(M: int, N: int, K: int, config: WsConfig, *, bias: bool = False, activation: str | None = None):
    """Compile for the local GPU (Hopper); the kernel writes into the caller's C: kernel(a, b, c)."""
    func = appendix_program(M, N, K, config, bias=bias, activation=activation)
    return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=epilogue_pass_configs(activation))
