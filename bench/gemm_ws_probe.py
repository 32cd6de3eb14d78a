"""The hand-written warp-specialized Hopper GEMM (gemm_schedules' kernel="ws", built by its gemm_ws_body) and
its experimental variants, and a probe that times them against cuBLAS and the tour's best schedules on an H200.

    python bench/gemm_ws_probe.py                  # every variant that compiles, every shape (H200)
    python bench/gemm_ws_probe.py --quick          # 8192^3 only
    python bench/gemm_ws_probe.py --shapes 8192x8192x8192,4096x4096x4096 --variants ws,ws_persistent
    python bench/gemm_ws_probe.py --list           # the variants, whether each compiles for sm_90a (no GPU),
                                                   # their registers and spills (ptxas), --source: the main loop

Why: the tour's `gemm_program` (T.Pipelined + T.gemm, TileLang's automatic warp specialization) reaches
0.96-1.03x cuBLAS on an H200. Its consumers wait for each K step's whole wgmma batch (`wait_wgmma<0>`) before
they hand the stage back to the producer, so the tensor cores idle between K steps. Here the producer/consumer
split is written by hand, as CUTLASS's Hopper mainloop does it (the builder lives in sections/gemm_schedules.py;
each variant here is a GemmConfig):

* one producer warpgroup (registers lowered to 24, or 40 in the persistent kernel) waits for a free stage of a
  ring of `num_stages` shared-memory buffers (its `empty` mbarrier), issues the TMA loads of the A and B tiles
  into it and arrives on the stage's `full` mbarrier, which completes when the bytes have landed;
* `consumers` consumer warpgroups (registers raised to 240 / 232 when two) wait for `full`, issue the stage's
  wgmma batch without waiting for it (`T.wgmma_gemm`), then `T.wait_wgmma(1)`: the batch of the previous step is finished,
  so only then do they release the previous step's stage (`empty`), keeping one batch in flight;
* the epilogue converts the fp32 accumulator to fp16 into a small shared tile (block_M x 64) and
  stores it with TMA, one column strip at a time (a full 128x256 staging tile would not fit next to four
  stages); with store_buffers=2 (the *_db variants) one strip's store runs while the next strip is written;
* persistent=132: one block per SM walks the tiles (T.PersistentTileScheduler, the tour's L2 swizzle order);
  producer and consumers each run the same tile loop, and the ring's barrier phases continue across tiles
  (a k-step counter over all of this block's tiles), so the producer loads the next tile's first stages
  while the consumers run the epilogue.

Experiments written here first (EXPERIMENTS; not in the section until an H200 run says they win):

* ws_multicast*: the ws roles in 2x1 clusters on vertically adjacent tiles; rank 0 loads their common B tile
  once by TMA multicast into both blocks, halving B's L2 -> SM traffic as cuBLAS's clusters do; one tile per
  cluster or 66 / 64 persistent clusters (gemm_ws_multicast_program);
* ws_streamk*: the persistent ws kernel with stream-K for the last waves. 4096^3 has 512 tiles of 128x256 for
  132 SMs (3.88 waves) and 8192x4096x14336 1024 (7.76): in the persistent kernel's last wave 16 and 29 SMs
  idle. Here the blocks walk whole tiles for the first waves, then split the last waves' k-steps evenly;
  a tile cut between blocks is finished by the block holding its first k-steps, which adds the others'
  fp32 partial sums from a global workspace once their flags say they are there
  (gemm_ws_streamk_program, StreamKPlan; the kernel also takes Workspace and Flags, see FixupMemory).
  H200, 2026-12-02: both validated (bit-identical over 20 launches, flags reset) but lost to the persistent
  kernel, 0.914 / 0.933x cuBLAS against 0.987x at 4096^3, 0.908 / 0.986x against 1.028x at 8192x4096x14336.
  The likely reason: blocks working on different k-ranges at the same moment share no A or B slices in L2,
  so the split iterations stream from HBM (a 4096^3 k-step needs ~1.3 us of HBM for 0.56 us of wgmma).
* ws_streamk_lockstep: the same kernel (gemm_ws_fixup_program) with the partial wave split so that most of it
  stays in lockstep (LockstepPlan): the T = tiles mod 132 tail tiles' first x k-steps run as a wave on blocks
  0..T-1, each the head of its tile; the other 132 - T blocks share out the remainders [x, k_steps) tile-major
  (stream-K within them) and publish one partial sum per piece, which the heads add. x balances the two
  groups (lockstep_plan; 172 of 224 k-steps at 8192x4096x14336). H200, 2026-12-03: validated, but 0.940x /
  0.890x cuBLAS at 8192x4096x14336 / 4096^3 against 0.977x / 1.002x for the persistent kernel (the GEMMs run at
  the power cap, where filling the partial wave's idle SMs buys little and the fixup traffic costs energy).

The ping-pong kernel (kernel="pingpong") started here and now lives in the section (gemm_pingpong_body; the
fusion section's schedule on Hopper); the pingpong* variants time it bare.

The probe validates each kernel in a child process under a time limit (a barrier-phase bug deadlocks the GPU
rather than crashing), launches it again many times to look for races (an fp16 GEMM with a fixed
accumulation order must give bit-identical results every launch; stream-K adds its partial sums in a fixed
order, and must leave its flags at zero), and only then times the kernels that passed, in turns
(tourkit.bench_interleaved) against torch.matmul (cuBLAS) and the tour's two best schedules.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import argparse
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tourkit  # noqa: E402  (no tilelang work at import)
from sections.gemm_schedules import (GemmConfig, gemm_program, stage_releasers, ws_pipeline,  # noqa: E402
                                     ws_register_split)

register_split = ws_register_split  # the section's; kept under the probe's old name

ARCH = "sm_90a"
H200_SMS = 132
SMEM_LIMIT = 227 * 1024  # dynamic shared memory one block may use on Hopper
TOLERANCE = 5e-3  # as gemm_schedules: fp16 output over fp32 accumulation in another order

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336), (1024, 8192, 8192)]
# Validated only: tails in M, N and K (TMA clips them). The third has enough tiles (31 x 33 of 128x128) for every
# persistent block to take several, so both ping-pong warpgroups take turns on ragged tiles, and an odd number
# of 128-row tiles (31), so the multicast kernel's last cluster has a block past M. The fourth has a partial wave
# that ws_streamk_lockstep splits (480 tiles of 128x256: 84 tail tiles, the other three shapes run it
# data-parallel), with its ragged edges in the split tiles and a ragged last k-step among the helpers' pieces.
ODD_SHAPES = [(1000, 1000, 1000), (1001, 1032, 1000), (3900, 4104, 1000), (5000, 3000, 3000)]

# The variants of the hand-written kernel (gemm_schedules' kernel="ws"): name -> schedule.
HAND_WS = dict(panel=8, policy="FullRow", kernel="ws")
VARIANTS: dict[str, GemmConfig] = {
    "ws": GemmConfig(128, 256, 64, 4, 256, True, **HAND_WS),
    "ws_persistent": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS, **HAND_WS),
    "ws_db": GemmConfig(128, 256, 64, 4, 256, True, store_buffers=2, **HAND_WS),
    "ws_persistent_db": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS, store_buffers=2, **HAND_WS),
    # Panels of 16 tile rows: a wave of 132 tiles then spans 16 x 8 tiles, not 8 x 16, so it reads fewer bytes
    # of the operand with the longer K rows (8192x4096x14336: 116 MiB a wave against 149 MiB).
    "ws_persistent_p16": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS,
                                    **dict(HAND_WS, panel=16)),
    # Panels of 8 tile columns: a wave spans 16.5 x 8 tiles (8192x4096x14336: ~25% fewer bytes a wave).
    # H200 2026-12-03 (8192x4096x14336 / 4096^3): p16 0.991x / 0.993x, p8c 0.982x / 0.970x, rows of 8 (ws_persistent)
    # 0.999x / 0.983x cuBLAS: no gain from the order.
    "ws_persistent_p8c": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS,
                                    **dict(HAND_WS, panels="columns")),
    # K steps of 128 in a 2-stage ring (96 KiB a stage): half the barrier round trips and wgmma batches per FLOP,
    # for the energy the power-capped H200 spends on them; latency hidden by one stage only. H200 2026-12-03:
    # 0.758x / 0.752x cuBLAS at 8192x4096x14336 / 4096^3 (ws_persistent 0.992x / 0.985x): one stage is too few.
    "ws_persistent_k128": GemmConfig(128, 256, 128, 2, 256, True, persistent=H200_SMS, **HAND_WS),
    # 256-row tiles, each consumer warpgroup owning 128 rows (two m64 wgmma per 16 of K), as cuBLAS's kernels for
    # 4096^3 and 8192x4096x14336 on the H200 (nvjet 256x128, 4 stages, 2026-12-03); 256x192 reads 22% fewer
    # operand bytes a FLOP than 128x256 (192 accumulator registers a consumer thread, of 232). H200 2026-12-03
    # (8192^3 / 4096^3 / 8192x28672x4096 / 8192x4096x14336 / 1024x8192x8192 vs cuBLAS): 256x128 0.998 / 0.928 /
    # 0.987 / 0.968 / 0.976x, 256x192 0.990 / 0.931 / 0.984 / 0.901 / 0.793x; ws_persistent_s3_store4 in the same
    # turns 1.017 / 0.974 / 0.998 / 0.985 / 1.026x: neither tile helps.
    "ws_persistent_256x128": GemmConfig(256, 128, 64, 4, 256, True, persistent=H200_SMS, **HAND_WS),
    "ws_persistent_256x192": GemmConfig(256, 192, 64, 3, 256, True, persistent=H200_SMS, **HAND_WS),
    # cuBLAS's tile at 16384^3 and 8192x28672x4096: three consumer warpgroups of 64 rows (512 threads). (192x256
    # this way does not compile: ptxas wants 154 registers where 512 threads leave 128.) H200 2026-12-03: 0.964 /
    # 0.905 / 0.986 / 0.895 / 0.915x cuBLAS on the five shapes above.
    "ws_persistent_192x192": GemmConfig(192, 192, 64, 4, 384, True, persistent=H200_SMS, **HAND_WS),
    # The whole tile staged (4 strips) next to a 3-stage ring: the epilogue never waits for a store.
    "ws_persistent_s3_store4": GemmConfig(128, 256, 64, 3, 256, True, persistent=H200_SMS, store_buffers=4, **HAND_WS),
    # The same two kernels, each consumer warp handing a stage back with one arrival (8 shared-memory atomics a K
    # step, not 256): less work beside the tensor cores on a power-capped GPU. H200 2026-12-03 (8192x4096x14336 /
    # 4096^3 / 8192^3 vs cuBLAS): ws_persistent_wa 0.999 / 0.977 / 1.031x against ws_persistent's 0.999 / 0.957 /
    # 1.029x; ws_persistent_s3_store4_wa 0.943 / 0.951 / 0.966x against 0.950 / 0.973 / 0.950x: within the noise.
    "ws_persistent_wa": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS, warp_arrivals=True, **HAND_WS),
    "ws_persistent_s3_store4_wa": GemmConfig(128, 256, 64, 3, 256, True, persistent=H200_SMS, store_buffers=4,
                                             warp_arrivals=True, **HAND_WS),
    # ... and one producer warp, not four, running the producer loop (32 `full` arrivals a K step, not 128; the
    # other three warps idle, as in CUTLASS). H200 2026-12-03 (same turns as above): ws_persistent_lean 0.992 /
    # 0.951 / 1.029x, ws_persistent_s3_store4_lean 0.943 / 0.944 / 0.985x: no gain. All four validated on odd sizes.
    "ws_persistent_lean": GemmConfig(128, 256, 64, 4, 256, True, persistent=H200_SMS, warp_arrivals=True,
                                     producer_warps=1, **HAND_WS),
    "ws_persistent_s3_store4_lean": GemmConfig(128, 256, 64, 3, 256, True, persistent=H200_SMS, store_buffers=4,
                                               warp_arrivals=True, producer_warps=1, **HAND_WS),
    # The section's ping-pong kernel (kernel="pingpong"): each consumer warpgroup on its own tile, taking turns,
    # so one's epilogue overlaps the other's K loop. 128x128 with 6 stages, 5 stages, and 128x192 (fewer bytes
    # a FLOP; the fusion section's schedule).
    "pingpong": GemmConfig(128, 128, 64, 6, 256, True, persistent=H200_SMS, **dict(HAND_WS, kernel="pingpong")),
    "pingpong_s5": GemmConfig(128, 128, 64, 5, 256, True, persistent=H200_SMS, **dict(HAND_WS, kernel="pingpong")),
    "pingpong_192": GemmConfig(128, 192, 64, 4, 256, True, persistent=H200_SMS, **dict(HAND_WS, kernel="pingpong")),
    # 64x256 tiles a warpgroup: the cooperative kernel's m64n256 wgmma and accumulator (128 registers a thread),
    # but each warpgroup's epilogue runs under the other's K loop (short-K shapes such as 4096^3 spend ~3% of a
    # tile in the cooperative kernel's epilogue, tensor cores idle). Loads B for 64 rows, not 128. H200
    # 2026-12-03 (4096^3 / 8192x4096x14336 vs cuBLAS): s5 0.920 / 0.813x, s4 0.918 / 0.888x, ws_persistent_s3_store4
    # 0.973 / 0.986x in the same turns; in the shape set s5 0.94 / 0.92 / 0.94 / 0.89 / 0.95x. The GPU runs these
    # GEMMs at its ~700 W cap, where B loaded twice as often costs more than the hidden epilogue saves.
    "pingpong_64x256": GemmConfig(64, 256, 64, 5, 256, True, persistent=H200_SMS, **dict(HAND_WS, kernel="pingpong")),
    "pingpong_64x256_s4": GemmConfig(64, 256, 64, 4, 256, True, persistent=H200_SMS,
                                     **dict(HAND_WS, kernel="pingpong")),
}

# Experimental kernels written here first: name -> (builder in this file, its keyword arguments). Builders are
# looked up by name when called (they are defined below).
EXPERIMENTS: dict[str, tuple[str, dict]] = {
    "ws_multicast": ("gemm_ws_multicast_program", dict()),            # 2x1 clusters, B multicast by TMA
    # 66 clusters walk the pairs. H200 2026-12-03: 0.942x / 0.933x cuBLAS at 8192x4096x14336 / 4096^3 (session 5:
    # about level at 8192^3)
    "ws_multicast_persistent": ("gemm_ws_multicast_program", dict(persistent=True)),
    # the same with one arrival per consumer warp on each block's `empty` barrier (16 a stage, 8 of them remote,
    # instead of 512, 256 remote, as CUTLASS signals once per warpgroup). H200 2026-12-03 (8192x4096x14336 /
    # 4096^3 / 8192^3): 0.989 / 0.942 / 1.021x cuBLAS, ws_multicast_persistent 0.979 / 0.951 / 1.012x in the same
    # turns. Both persistent multicast kernels then stopped with "illegal instruction" on 1000^3 and
    # 1001x1032x1000 (16 tile pairs for 66 clusters): the idle clusters ran a tile past the matrix (see the
    # kernel's pair loop, since guarded). Guarded, both validate on all four odd sizes (H200 2026-12-03, session
    # 10) and time 0.970-0.976x cuBLAS at 4096^3 / 8192x4096x14336, against 0.999 / 0.975x for
    # ws_persistent_s3_store4 in the same turns.
    "ws_multicast_persistent_wa": ("gemm_ws_multicast_program", dict(persistent=True, warp_arrivals=True)),
    # the persistent multicast kernel with the shape set's best ring (3 stages, the whole C tile staged in four
    # strips, as ws_persistent_s3_store4): 144 + 64 KiB of shared memory. H200 2026-12-03: 0.983 / 0.981x cuBLAS
    # at 4096^3 / 8192x4096x14336, against 0.999 / 0.975x for ws_persistent_s3_store4 in the same turns
    "ws_multicast_persistent_s3_store4_wa": ("gemm_ws_multicast_program",
                                             dict(persistent=True, warp_arrivals=True, num_stages=3,
                                                  store_buffers=4)),
    # 64 clusters: in case the GPCs cannot hold 66 two-block clusters at once (an SM left over in a GPC with an
    # odd SM count), which would leave the last clusters for a second wave
    "ws_multicast_persistent128": ("gemm_ws_multicast_program", dict(persistent=True, num_sms=128)),
    # 132 blocks: data-parallel whole waves, then the last two waves' tiles (one full, the partial one) split
    # evenly along K: 1-2 tiles' worth a block, so a split tile is cut in two and its finisher waits for one
    # block, which published its part early (its first stream-K work)
    "ws_streamk": ("gemm_ws_streamk_program", dict()),
    # only the partial wave split: less than a tile a block, a tile cut in two or three pieces computed at the
    # same time (less fixup work, but the finisher may wait)
    "ws_streamk_tail": ("gemm_ws_streamk_program", dict(sk_waves=1)),
    # the partial wave only, its tiles' first k-steps in lockstep on as many blocks (L2 shared as in the
    # data-parallel waves), the rest of each tile shared out among the other blocks (LockstepPlan)
    "ws_streamk_lockstep": ("gemm_ws_lockstep_program", dict()),
}
# The builders of kernels that take a workspace and flags after C (FixupMemory): persistent, one block per SM.
FIXUP_BUILDERS = ("gemm_ws_streamk_program", "gemm_ws_lockstep_program")
ALL_VARIANTS = list(VARIANTS) + list(EXPERIMENTS)

# The tour's best schedules today (BENCHMARKS.md), timed in the same turns.
TOUR_CONFIGS: dict[str, GemmConfig] = {
    "tour 128x256 s4": GemmConfig(128, 256, 64, 4, 256, True),
    "tour 256x192 FullCol": GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol"),
}


def say(text: str = "") -> None:
    print(text, flush=True)


def gemm_ws_multicast_program(M: int, N: int, K: int, block_M: int = 128, block_N: int = 256, block_K: int = 64,
                              num_stages: int = 4, panel: int = 8, persistent: bool = False, num_sms: int = H200_SMS,
                              warp_arrivals: bool = False, store_buffers: int = 1, dtype: str = "float16",
                              accum_dtype: str = "float32"):
    """C = A @ B with the ws kernel's roles (one producer, two consumer warpgroups on a 128x256 tile) in clusters
    of two blocks on vertically adjacent tiles (rows m = 2 pair + rank, the same column n): they need the same
    B tile every K step, so rank 0 loads it once by TMA multicast into both blocks' shared memory, halving
    the L2 -> SM traffic of B (cuBLAS's 2x1 clusters do the same). Each block loads its own A tile.
    A stage may be overwritten only when the consumers of *both* blocks are done with it, so every consumer
    thread arrives on the stage's `empty` barrier in both blocks (cluster barriers, 2 x 256 arrivals; with
    warp_arrivals lane 0 of every consumer warp, 2 x 8).
    persistent=True: num_sms / 2 clusters walk the pairs of tiles (grid stride), the ring's phases carrying on
    across tiles as in the ws kernel. store_buffers: block_M x 64 strips of C staged in shared memory, as the
    section's ws kernel (4: the whole tile, so a store never waits for the one before it within a tile)."""
    import tilelang.language as T

    consumer_threads = 256
    producer_regs, consumer_regs = ws_register_split(2, persistent)
    m_tiles, n_tiles, k_steps = T.ceildiv(M, block_M), T.ceildiv(N, block_N), T.ceildiv(K, block_K)
    m_pairs = (m_tiles + 1) // 2
    pairs = m_pairs * n_tiles
    clusters = num_sms // 2 if persistent else pairs
    panel_pairs = max(1, panel // 2)  # panels of `panel` tile rows, as T.use_swizzle, in pairs of rows

    def tile_of(p, rank):
        """The block's tile of pair p: panels of panel_pairs pair rows swept column by column."""
        panel_id = p // (panel_pairs * n_tiles)
        rows = T.min(panel_pairs, m_pairs - panel_id * panel_pairs)
        within = p % (panel_pairs * n_tiles)
        return (panel_id * panel_pairs + within % rows) * 2 + rank, within // rows

    @T.macro
    def release(empty, step):
        """This thread is done with the step's stage, in both blocks of the cluster."""
        T.mbarrier_arrive(empty[step % num_stages], 0)
        T.mbarrier_arrive(empty[step % num_stages], 1)

    # the section's ring, with B multicast to both blocks and stages handed back in both
    _, produce, consume = ws_pipeline(block_M, block_N, block_K, k_steps, num_stages, b_cluster_mask=0b11,
                                      release=release, warp_arrivals=warp_arrivals)

    @T.macro
    def consume_and_store(C, A_s, B_s, C_s, C_local, full, empty, m, n, first_step):
        consume(A_s, B_s, C_local, full, empty, first_step)
        for j in T.unroll(block_N // 64):
            T.tma_store_wait(store_buffers - 1)  # the strip buffer about to be rewritten has been read
            T.copy(C_local[:, j * 64:(j + 1) * 64], C_s[j % store_buffers, :, :])
            T.tma_copy(C_s[j % store_buffers, :, :],
                       C[m * block_M:(m + 1) * block_M, n * block_N + j * 64:n * block_N + (j + 1) * 64])

    @T.prim_func
    def gemm_ws_multicast(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.ClusterKernel(2, clusters, threads=consumer_threads + 128, cluster_dims=(2, 1, 1)) as (bx, cluster):
            A_s = T.alloc_shared((num_stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((num_stages, block_K, block_N), dtype)
            C_s = T.alloc_shared((store_buffers, block_M, 64), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            full = T.alloc_barrier([128] * num_stages)
            empty = T.alloc_cluster_barrier([2 * stage_releasers(consumer_threads, warp_arrivals)] * num_stages)
            rank = T.block_rank_in_cluster()
            # This cluster's pairs of tiles: p = cluster + i * clusters < pairs (one pair when not persistent).
            # The loop runs to the most any cluster has, each pass guarded: written as a loop of
            # ceildiv(pairs - cluster, clusters) passes, TileLang 0.1.15 dropped the loop whenever that count
            # could only be 0 or 1 (fewer pairs than clusters: 1000^3) and ran one pass on every cluster, the
            # idle ones on tiles past the matrix: "illegal instruction" on the H200 (2026-12-03).
            T.cluster_sync()  # the peer's barriers are initialized before anyone arrives on them remotely
            tid = T.get_thread_binding()
            if tid >= consumer_threads:
                T.set_max_nreg(producer_regs, 0)
                for i in T.serial(T.ceildiv(pairs, clusters)):
                    if cluster + i * clusters < pairs:
                        m, n = tile_of(cluster + i * clusters, rank)
                        produce(A, B, A_s, B_s, full, empty, m, n, i * k_steps)
            else:
                T.set_max_nreg(consumer_regs, 1)
                for i in T.serial(T.ceildiv(pairs, clusters)):
                    if cluster + i * clusters < pairs:
                        m, n = tile_of(cluster + i * clusters, rank)
                        consume_and_store(C, A_s, B_s, C_s, C_local, full, empty, m, n, i * k_steps)
                T.tma_store_wait(0)
            T.cluster_sync()  # no block leaves while its peer may still arrive on its barriers

    return gemm_ws_multicast


# ---------------------------------------------------------------------------------------------------------
# Experimental: stream-K, against the persistent kernel's partial last wave
# ---------------------------------------------------------------------------------------------------------

STREAMK_BARRIER = 10  # named barrier id of the fixup (TileLang's strip syncs use 3, the ping-pong kernel 8 and 9)

# The split-tile kernel (gemm_ws_fixup_program) takes its schedule from a plan, StreamKPlan or LockstepPlan.
# Both give, as formulas over the block index g that run on Python ints (the tests) and on TIR (the kernel):
#   dp_tiles, dp_count(g)      the data-parallel tiles: block g takes tiles g, g + G, ... whole (G = num_sms);
#   has_segments(g), segment_count(g), segment(g, i, maximum, minimum) -> (t, kb, ke, offset)
#                              block g's split work after them: k-steps [kb, ke) of tile dp_tiles + t, `offset`
#                              its split k-steps before this one (the ring's phases carry on over them).
#                              kb > 0: a contribution, published to workspace slot publish_slot(g, i);
#                              kb = 0 < ke < k_steps: the tile's head, which adds every contribution;
#   waiting_range(g, t), contributes(d), slot_of(d, t), newest_first
#                              the head's wait list: the contributors d in [first, end) with contributes(d),
#                              read from slot_of(d, t), in descending order when newest_first;
#   slots                      workspace slots (and flags) the kernel takes.


def choose(condition, if_true, if_false):
    """`if_true if condition else if_false` in a plan's formulas: on a Python bool in the tests, in the kernel a
    select on the block index (T.Select: both sides evaluated, a conditional move, where T.if_then_else
    lowers to branches at every use)."""
    if isinstance(condition, bool):
        return if_true if condition else if_false
    import tilelang.language as T

    return T.Select(condition, if_true, if_false)


@dataclass(frozen=True)
class StreamKPlan:
    """Who computes what in the stream-K kernel, as formulas over a block index g that run both in Python (ints:
    the tests) and in the kernel (g a TIR expression; `maximum`/`minimum` are then T.max/T.min, passed in as
    the section's gelu_exact takes its operations): the CPU test checks the kernel's own arithmetic.

    The unit of work is one iteration, a (tile, k-step) pair. Tiles are numbered in the persistent kernel's order
    (T.PersistentTileScheduler, row panels). The first `dp_tiles` are data-parallel: block g takes tiles
    g, g + G, ... whole (G = num_sms). The iterations of the remaining tiles, numbered tile-major from 0 (the
    stream-K iterations, `sk_iters` of them), are split evenly: block g takes [begin(g), begin(g + 1)), after
    its data-parallel tiles. Its range cuts the tiles it touches into segments, the i-th a k-step range
    [kb, ke) of stream-K tile t: the whole tile; the head of a tile (kb = 0, only the last segment can be one):
    this block finishes it, adding the partial sums of the later blocks whose ranges start inside it; or a
    contribution (kb > 0, only the first segment can be one): published to the block's workspace slot."""

    tiles: int
    k_steps: int
    num_sms: int
    dp_tiles: int

    newest_first = False  # the head adds the later blocks' partial sums in block order

    @property
    def sk_iters(self) -> int:
        return (self.tiles - self.dp_tiles) * self.k_steps

    @property
    def slots(self) -> int:
        """Workspace slots and flags: one per block, which contributes at most once (its first segment)."""
        return self.num_sms

    def dp_count(self, g):
        """Data-parallel tiles of block g (dp_tiles is a multiple of G, or all tiles when fewer than G)."""
        return (self.dp_tiles - g + self.num_sms - 1) // self.num_sms

    def begin(self, g):
        """Block g's first stream-K iteration; begin(G) = sk_iters. Ranges may be empty (fewer iterations than
        blocks)."""
        return g * self.sk_iters // self.num_sms

    def has_segments(self, g):
        return self.sk_iters > 0 and self.begin(g + 1) > self.begin(g)

    def segment_count(self, g):
        """Tiles block g's range touches, if it is not empty."""
        return (self.begin(g + 1) - 1) // self.k_steps - self.begin(g) // self.k_steps + 1

    def segment(self, g, i, maximum=max, minimum=min):
        """Block g's i-th segment: (t, kb, ke, offset), k-steps [kb, ke) of stream-K tile t (the tile dp_tiles + t
        of the persistent order), `offset` the block's stream-K iterations before it (for the ring's phases)."""
        k = self.k_steps
        first, end = self.begin(g), self.begin(g + 1)
        t = first // k + i
        lo, hi = maximum(first, t * k), minimum(end, (t + 1) * k)
        return t, lo - t * k, hi - t * k, lo - first

    def publish_slot(self, g, i):
        """Block g's workspace slot and flag: its own (only its first segment, i = 0, can be a contribution)."""
        return g

    def waiting_range(self, g, t):
        """The blocks g + 1 ... end - 1 whose ranges start before stream-K tile t ends: block g, the head of t,
        adds their partial sums (those with an empty range have none). begin(d) < E  <=>  d < E * G / sk_iters."""
        tile_end = (t + 1) * self.k_steps
        return g + 1, (tile_end * self.num_sms + self.sk_iters - 1) // self.sk_iters

    def contributes(self, d):
        """Block d has stream-K work: a block of the waiting range without any has no partial sum."""
        return self.begin(d) < self.begin(d + 1)

    def slot_of(self, d, t):
        """The slot of block d's contribution to tile t: block d's own."""
        return d

    def waits_for(self, g, t) -> list[int]:
        """waiting_range without the empty ranges, as the kernel's loop skips them."""
        return [d for d in range(*self.waiting_range(g, t)) if self.contributes(d)]

    def wait_list(self, g, t) -> list[tuple[int, int]]:
        """(block, slot) of each contribution the head g of stream-K tile t adds, in the kernel's order."""
        return [(d, self.slot_of(d, t)) for d in self.waits_for(g, t)]


def streamk_plan(M: int, N: int, K: int, block_M: int, block_N: int, block_K: int, num_sms: int,
                 sk_waves: int = 2) -> StreamKPlan:
    """Data-parallel whole waves, then stream-K over the last `sk_waves` waves' worth of tiles (the partial wave
    and sk_waves - 1 full ones before it). A whole number of waves, or fewer tiles than blocks: all
    data-parallel (splitting one wave of tiles over more blocks is split-K's regime, not tried here)."""
    if sk_waves < 1:
        raise ValueError(f"sk_waves={sk_waves} must be at least 1")
    tiles = -(-M // block_M) * -(-N // block_N)
    k_steps = -(-K // block_K)
    if tiles % num_sms == 0 or tiles < num_sms:
        dp_tiles = tiles
    else:
        dp_tiles = max(0, tiles // num_sms - (sk_waves - 1)) * num_sms
    plan = StreamKPlan(tiles, k_steps, num_sms, dp_tiles)
    if (plan.sk_iters + plan.k_steps) * num_sms >= 2 ** 31:  # the kernel's index arithmetic is int32
        raise ValueError(f"{M}x{N}x{K}: too many stream-K iterations for int32 index arithmetic")
    return plan


@dataclass(frozen=True)
class LockstepPlan:
    """The partial wave split so that most of it still runs in lockstep (ws_streamk_lockstep), as formulas over
    the block index g like StreamKPlan's.

    The first dp_tiles = tiles - T tiles run data-parallel as in the persistent kernel (block g takes tiles g,
    g + G, ...); T = tail_tiles = tiles mod G is the partial wave. Tail tile t (tile dp_tiles + t) belongs to
    block t, its *main* block, which computes k-steps [0, x) of it (x = main_steps) and is its head. The T main
    blocks thus run their part of the tail as the data-parallel waves run: all at the same k-step of adjacent
    tiles at the same time, sharing their A and B k-slices through L2. (Stream-K over tile-major ranges, the
    ws_streamk* variants, has every block at another k of another tile: nothing shared, all from HBM.)

    The remainders [x, k_steps) of the T tail tiles, R = T * r iterations (r = k_steps - x) numbered tile-major,
    go to the H = G - T *helper* blocks (block T + h is helper h), split evenly into contiguous ranges
    [begin(h), begin(h + 1)). A helper's range cuts the remainders it touches into segments; each one is a
    contribution, published to its own workspace slot with its own flag: slot h * slots_per_helper + i for the
    helper's i-th segment. The head of tail tile t finds its contributors in closed form: the helpers whose
    ranges overlap the tile's remainder (waiting_range), helper d's piece of it in slot_of(d, t).

    The head adds them newest first (descending d): the helpers after the first one start their ranges inside
    the tile, so its piece was their first segment, published early; the first one's range ends inside it
    (its last segment), published last. The head reads the early ones while that one still runs, and the
    order is fixed, so the sum is the same every launch. No wait cycle: helpers wait for nothing but their
    own ring, main blocks only for helpers.

    tail_tiles = 0: all data-parallel, the persistent kernel (a whole number of waves, fewer tiles than
    blocks, or a tail too small to gain from splitting: see lockstep_plan)."""

    tiles: int
    k_steps: int
    num_sms: int
    tail_tiles: int  # T: the partial wave's tiles, 0 when all tiles are data-parallel
    main_steps: int  # x: the k-steps each main block computes of its tail tile

    newest_first = True

    @property
    def dp_tiles(self) -> int:
        return self.tiles - self.tail_tiles

    @property
    def helpers(self) -> int:
        return self.num_sms - self.tail_tiles

    @property
    def remainder_steps(self) -> int:
        return self.k_steps - self.main_steps

    @property
    def helper_iters(self) -> int:
        """R: the iterations of all the tail tiles' remainders."""
        return self.tail_tiles * self.remainder_steps

    @functools.cached_property  # slot_of reads it for every head's contributor
    def slots_per_helper(self) -> int:
        """The most segments any helper has (a Python constant of the plan)."""
        return max((self.helper_segment_count(h) for h in range(self.helpers) if self.helper_has_work(h)),
                   default=0)

    @property
    def slots(self) -> int:
        """Workspace slots and flags: slots_per_helper for each helper (at least one, unused, when all is
        data-parallel: the kernel keeps its signature)."""
        return max(1, self.helpers * self.slots_per_helper) if self.tail_tiles else 1

    def dp_count(self, g):
        """Data-parallel tiles of block g (dp_tiles is a multiple of G, or all tiles when fewer than G)."""
        return (self.dp_tiles - g + self.num_sms - 1) // self.num_sms

    # helpers, by helper index h (block T + h)

    def begin(self, h):
        """Helper h's first remainder iteration; begin(H) = R. Ranges may be empty (R < H)."""
        return h * self.helper_iters // self.helpers

    def helper_has_work(self, h):
        return self.begin(h) < self.begin(h + 1)

    def helper_segment_count(self, h):
        """Tail tiles helper h's range touches, if it is not empty."""
        r = self.remainder_steps
        return (self.begin(h + 1) - 1) // r - self.begin(h) // r + 1

    def helper_segment(self, h, i, maximum=max, minimum=min):
        """Helper h's i-th segment: (t, kb, ke, offset), k-steps [kb, ke) of tail tile t, kb >= x."""
        r, x = self.remainder_steps, self.main_steps
        first, end = self.begin(h), self.begin(h + 1)
        t = first // r + i
        lo, hi = maximum(first, t * r), minimum(end, (t + 1) * r)
        return t, x + lo - t * r, x + hi - t * r, lo - first

    # the plan interface of gemm_ws_fixup_program, by block index g

    def has_segments(self, g):
        return self.tail_tiles > 0 and self.segment_count(g) > 0

    def segment_count(self, g):
        """One segment for a main block, the tiles its range touches for a helper."""
        h = g - self.tail_tiles
        return choose(g < self.tail_tiles, 1, choose(self.helper_has_work(h), self.helper_segment_count(h), 0))

    def segment(self, g, i, maximum=max, minimum=min):
        """Block g's i-th segment (t, kb, ke, offset): a main block's is (g, 0, x, 0), its own tail tile's first
        x k-steps; a helper's, helper_segment."""
        main = (g, 0, self.main_steps, 0)
        helper = self.helper_segment(g - self.tail_tiles, i, maximum, minimum)
        return tuple(choose(g < self.tail_tiles, a, b) for a, b in zip(main, helper))

    def publish_slot(self, g, i):
        """Where helper g - T publishes its i-th segment (only helpers' segments are contributions)."""
        return (g - self.tail_tiles) * self.slots_per_helper + i

    def waiting_range(self, g, t):
        """The helpers [first, end) whose ranges overlap tail tile t's remainder [S, E) = [t r, (t + 1) r), the
        contributors of the head g = t. begin(h) < E <=> h R < E H <=> h < ceil(E H / R), and
        begin(h + 1) > S <=> (h + 1) R >= (S + 1) H <=> h >= ceil((S + 1) H / R) - 1. A helper with an empty
        range may fall inside (contributes)."""
        r, total, helpers = self.remainder_steps, self.helper_iters, self.helpers
        start, stop = t * r, (t + 1) * r
        return ((start + 1) * helpers + total - 1) // total - 1, (stop * helpers + total - 1) // total

    def contributes(self, d):
        return self.helper_has_work(d)

    def slot_of(self, d, t):
        """Helper d's slot for tail tile t: its segment number there is t minus the tile its range starts in."""
        return d * self.slots_per_helper + t - self.begin(d) // self.remainder_steps

    def wait_list(self, g, t) -> list[tuple[int, int]]:
        """(block, slot) of each contribution the head g of tail tile t adds, in the kernel's order."""
        helpers = [d for d in range(*self.waiting_range(g, t)) if self.contributes(d)]
        return [(self.tail_tiles + d, self.slot_of(d, t)) for d in reversed(helpers)]

    def modeled_tail_steps(self, fixup_steps: int) -> int:
        """How long the tail takes, in k-steps, in a simple model: a k-step costs 1 in every block, and moving one
        partial tile through L2 costs fixup_steps: a helper's publish (its consumers stall on the stores and
        the fence while its producer refills the ring), a head's read. Helpers run their segments back to
        back; a head runs its x k-steps, then takes each contribution in its wait order once published."""
        published = {}
        for h in range(self.helpers):
            clock = 0
            for i in range(self.helper_segment_count(h) if self.helper_has_work(h) else 0):
                t, kb, ke, _ = self.helper_segment(h, i)
                clock += ke - kb + fixup_steps
                published[t, self.tail_tiles + h] = clock
        longest = 0
        for t in range(self.tail_tiles):
            clock = self.main_steps
            for block, _ in self.wait_list(t, t):
                clock = max(clock, published[t, block]) + fixup_steps
            longest = max(longest, clock)
        return longest


# Modeled cost of moving one 128x256 fp32 partial tile (128 KiB) through L2, in k-steps of 128x256x64 (0.56 us
# of wgmma at the H200's peak; ~0.81 us in the persistent kernel at 8192x4096x14336, 1.455 ms for 8 waves of
# 224 k-steps): an SM moves about 64 B a clock to L2, 128 KiB in ~1.1 us at 1.8 GHz, then the fence waits for
# the last acknowledgements. A guess until the H200 says otherwise (lockstep_plan's fixup_steps).
FIXUP_STEPS = 2


@functools.lru_cache(maxsize=None)
def lockstep_plan(M: int, N: int, K: int, block_M: int, block_N: int, block_K: int, num_sms: int,
                  fixup_steps: int = FIXUP_STEPS) -> LockstepPlan:
    """The lockstep plan for a problem: T = tiles mod G tail tiles, and the x that minimizes the modeled tail
    (LockstepPlan.modeled_tail_steps), ties to the larger x (less work off the lockstep).

    Why x ~ ceil(T k / G) (k = k_steps, H = G - T): a main block takes x k-steps, a helper T (k - x) / H; they
    are equal at x = T k / G, and with x = ceil(T k / G) a helper takes at most T (k - T k / G) / H = T k / G
    <= x: every block's total is ceil(tiles k / G), the even split (the model with fixup_steps = 0 picks it).
    With a cost c = fixup_steps per publish, a helper with s pieces takes T (k - x) / H + c s: equal to x at
    x = (T k + c s H) / G, 1-2 k-steps more (8192x4096x14336: (22400 + 2 * 4 * 32) / 132 = 171.6, the model
    picks 172). The heads' reads follow either way (the early contributions' while the last helper runs).

    All data-parallel (tail_tiles = 0) when there is no partial wave (tiles mod G = 0, or fewer tiles than
    blocks), a single k-step, or when the modeled tail is no shorter than the data-parallel one (k-steps):
    a small T * k split over many helpers costs more in fixups than it saves."""
    tiles = -(-M // block_M) * -(-N // block_N)
    k_steps = -(-K // block_K)
    data_parallel = LockstepPlan(tiles, k_steps, num_sms, 0, 0)
    tail = tiles % num_sms if tiles >= num_sms else 0
    if tail == 0 or k_steps < 2:
        return data_parallel
    cost, _, best = min((plan.modeled_tail_steps(fixup_steps), -x, plan) for x in range(1, k_steps)
                        for plan in [LockstepPlan(tiles, k_steps, num_sms, tail, x)])
    if cost >= k_steps:
        return data_parallel
    if ((best.helper_iters + best.remainder_steps) * best.helpers + best.helper_iters >= 2 ** 31
            or best.helpers * best.slots_per_helper * block_M * block_N >= 2 ** 31):  # int32 index arithmetic
        raise ValueError(f"{M}x{N}x{K}: too many tail iterations for int32 index arithmetic")
    return best


def plan_segments(plan) -> list[list[tuple[int, int, int, str]]]:
    """Each block's work in order: (tile in the persistent order, kb, ke, role), role "whole" (the usual
    epilogue), "finish" (the head: add the contributions, then the epilogue) or "contribute" (publish the
    partial sum). The same formulas as the kernel (the plan's)."""
    blocks = []
    for g in range(plan.num_sms):
        work = [(g + i * plan.num_sms, 0, plan.k_steps, "whole") for i in range(plan.dp_count(g))]
        if plan.has_segments(g):
            for i in range(plan.segment_count(g)):
                t, kb, ke, _ = plan.segment(g, i)
                role = "contribute" if kb > 0 else "whole" if ke == plan.k_steps else "finish"
                work.append((plan.dp_tiles + t, kb, ke, role))
        blocks.append(work)
    return blocks


def streamk_segments(M: int, N: int, K: int, block_M: int, block_N: int, block_K: int, num_sms: int,
                     sk_waves: int = 2) -> list[list[tuple[int, int, int, str]]]:
    """plan_segments of the stream-K plan."""
    return plan_segments(streamk_plan(M, N, K, block_M, block_N, block_K, num_sms, sk_waves))


def gemm_ws_streamk_program(M: int, N: int, K: int, block_M: int = 128, block_N: int = 256, block_K: int = 64,
                            num_stages: int = 4, num_sms: int = H200_SMS, panel: int = 8, sk_waves: int = 2,
                            dtype: str = "float16", accum_dtype: str = "float32"):
    """C = A @ B, persistent (one block per SM), the ws roles and ring, with the tiles of the last waves split
    along K (stream-K, StreamKPlan): 4096^3 has 512 tiles of 128x256 for 132 SMs, 3.88 waves, so the
    persistent kernel's last wave leaves 16 SMs idle; here every block gets 3.88 tiles' worth of iterations.
    A block contributes at most once (its first stream-K segment, into Workspace[g] and Flags[g]) and
    finishes at most once (its last), waiting only for later blocks. The kernel: gemm_ws_fixup_program."""
    plan = streamk_plan(M, N, K, block_M, block_N, block_K, num_sms, sk_waves)
    return gemm_ws_fixup_program(M, N, K, plan, block_M, block_N, block_K, num_stages, panel, dtype, accum_dtype)


def gemm_ws_lockstep_program(M: int, N: int, K: int, block_M: int = 128, block_N: int = 256, block_K: int = 64,
                             num_stages: int = 4, num_sms: int = H200_SMS, panel: int = 8,
                             fixup_steps: int = FIXUP_STEPS, dtype: str = "float16", accum_dtype: str = "float32"):
    """C = A @ B, persistent, the partial wave split so that its main part stays in lockstep (LockstepPlan):
    8192x4096x14336 has 1024 tiles, 7 waves and 100 tiles; their first 172 of 224 k-steps run as a wave on
    blocks 0-99, the other 52 k-steps of each are shared out among blocks 100-131. The kernel:
    gemm_ws_fixup_program."""
    plan = lockstep_plan(M, N, K, block_M, block_N, block_K, num_sms, fixup_steps)
    return gemm_ws_fixup_program(M, N, K, plan, block_M, block_N, block_K, num_stages, panel, dtype, accum_dtype,
                                 kernel_name="gemm_ws_lockstep")


def gemm_ws_fixup_program(M: int, N: int, K: int, plan, block_M: int = 128, block_N: int = 256, block_K: int = 64,
                          num_stages: int = 4, panel: int = 8, dtype: str = "float16", accum_dtype: str = "float32",
                          kernel_name: str | None = None):
    """The persistent ws kernel (one block per SM, the ws roles and ring) with some tiles split along K among
    blocks and put back together through a global workspace; who computes what is the plan's (StreamKPlan,
    LockstepPlan: the interface above).

    Each block first walks its data-parallel tiles as the persistent kernel does, then its segments; producer
    and consumers walk the same list, and the ring's step count carries on across all of it (this block's
    data-parallel k-steps, then its split k-steps so far). A segment that is the head of a tile leaves the tile
    to this block: after its K loop it waits for each contributor's flag, adds its fp32 partial sum from the
    workspace and resets the flag, then runs the usual epilogue. A contributing segment stores its accumulator
    into its workspace slot and sets the slot's flag. The plans keep the waits acyclic (a block never waits
    before its own contributions are out, and only for blocks that reach theirs without waiting). All G
    blocks must be resident at once (a waiting block holds its SM): 208 KiB of shared memory each, one per
    SM, G <= SMs. The partial sums are added in a fixed order: the result is the same every launch.

    Memory ordering of the fixup (PTX memory model): every consumer thread stores its part of the partial
    sum with plain (vectorized) stores, fences (__threadfence) and meets the others at a named barrier, after
    which one thread stores flag = 1 with release semantics; the finisher's thread 0 spins on an acquire
    load, the consumers meet at the barrier and fence again, then read. (Relaxed atomic stores of the
    partial sum, one float each, made ptxas serialize the wgmma: C7514.)

    Workspace (plan.slots, block_M, block_N) fp32 and Flags (plan.slots,) int32 are the caller's, flags zeroed
    once: the kernel leaves them at zero (the finisher resets each flag it consumed); see FixupMemory.
    kernel_name: the CUDA kernel's name (default gemm_ws_streamk_kernel)."""
    import tilelang.language as T

    num_sms = plan.num_sms
    consumers = block_M // 64
    consumer_threads = 128 * consumers
    producer_regs, consumer_regs = ws_register_split(consumers, True)
    m_tiles, n_tiles, k_steps = T.ceildiv(M, block_M), T.ceildiv(N, block_N), T.ceildiv(K, block_K)
    strip = 64
    # the section's ring: whole tiles as the persistent kernel walks them; stage_of for the segments below
    stage_of, produce_tile, consume_tile = ws_pipeline(block_M, block_N, block_K, k_steps, num_stages)

    @T.macro
    def produce_steps(A, B, A_s, B_s, full, empty, m, n, kb, ke, first_step):
        """ws_pipeline's produce_tile over k-steps [kb, ke) of the tile only."""
        for i in T.serial(ke - kb):
            stage, parity = stage_of(first_step + i)
            k = kb + i
            T.mbarrier_wait_parity(empty[stage], parity ^ 1)
            T.tma_copy(A[m * block_M:(m + 1) * block_M, k * block_K:(k + 1) * block_K], A_s[stage, :, :],
                       barrier=full[stage])
            T.tma_copy(B[k * block_K:(k + 1) * block_K, n * block_N:(n + 1) * block_N], B_s[stage, :, :],
                       barrier=full[stage])
            T.mbarrier_arrive(full[stage])

    @T.macro
    def consume_steps(A_s, B_s, C_local, full, empty, steps, first_step):
        """ws_pipeline's consume_tile over `steps` k-steps: one wgmma batch in flight, the previous step's stage
        released after wait_wgmma(1), the last one after the drain."""
        T.clear(C_local)
        for k in T.serial(steps):
            stage, parity = stage_of(first_step + k)
            T.mbarrier_wait_parity(full[stage], parity)
            T.wgmma_gemm(A_s[stage, :, :], B_s[stage, :, :], C_local, policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(1)
            if k > 0:
                T.mbarrier_arrive(empty[stage_of(first_step + k - 1)[0]])
        T.wait_wgmma(0)
        T.mbarrier_arrive(empty[stage_of(first_step + steps - 1)[0]])

    @T.macro
    def store_tile(C, C_local, C_s, m, n):
        """The tile out through one block_M x 64 shared strip by TMA, as the ws kernel (store_buffers=1)."""
        for j in T.unroll(block_N // strip):
            T.tma_store_wait(0)
            T.copy(C_local[:, j * strip:(j + 1) * strip], C_s)
            column = n * block_N + j * strip
            T.tma_copy(C_s, C[m * block_M:(m + 1) * block_M, column:column + strip])

    @T.macro
    def publish(Workspace, Flags, C_local, slot, tid):
        """A contribution: this block's partial sum into the workspace slot, then the slot's flag, released."""
        T.copy(C_local, Workspace[slot, :, :])
        T.call_extern("handle", "__threadfence")  # this thread's stores, device-wide, before the barrier
        T.sync_threads(STREAMK_BARRIER, consumer_threads)
        if tid == 0:
            T.atomic_store(Flags[slot], 1, memory_order="release")

    @T.macro
    def add_partial(Workspace, Flags, C_local, d, t, tid):
        """Contributor d's partial sum of split tile t into the accumulator, once its flag says it is there."""
        if plan.contributes(d):  # a block without split work contributes nothing
            if tid == 0:
                while T.atomic_load(Flags[plan.slot_of(d, t)], memory_order="acquire") == 0:
                    pass
                # a slot is published once a launch, so the flag may be reset at once, for the next launch
                T.atomic_store(Flags[plan.slot_of(d, t)], 0, memory_order="relaxed")
            T.sync_threads(STREAMK_BARRIER, consumer_threads)
            T.call_extern("handle", "__threadfence")  # no read below may see memory from before the flag
            for i, j in T.Parallel(block_M, block_N):
                C_local[i, j] += Workspace[plan.slot_of(d, t), i, j]

    @T.macro
    def add_partials(Workspace, Flags, C_local, g, t, tid):
        """The head of split tile t: add the partial sums of its contributors, in the plan's order."""
        first, end = plan.waiting_range(g, t)
        if plan.newest_first:
            for j in T.serial(end - first):
                add_partial(Workspace, Flags, C_local, end - 1 - j, t, tid)
        else:
            for d in T.serial(first, end):
                add_partial(Workspace, Flags, C_local, d, t, tid)

    @T.prim_func
    def gemm_ws_streamk(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
                        Workspace: T.Tensor((plan.slots, block_M, block_N), accum_dtype),
                        Flags: T.Tensor((plan.slots,), "int32")):
        with T.Kernel(num_sms, threads=consumer_threads + 128) as g:
            A_s = T.alloc_shared((num_stages, block_M, block_K), dtype)
            B_s = T.alloc_shared((num_stages, block_K, block_N), dtype)
            C_s = T.alloc_shared((block_M, strip), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            full = T.alloc_barrier([128] * num_stages)
            empty = T.alloc_barrier([consumer_threads] * num_stages)
            # the persistent kernel's tile order, as a pure function of the tile number
            order = T.PersistentTileScheduler(m_tiles, n_tiles, num_workers=num_sms, swizzle_size=panel,
                                              column_major=False, stateful=False)
            dp_steps = plan.dp_count(g) * k_steps  # the ring's steps before the split segments
            tid = T.get_thread_binding()
            if tid >= consumer_threads:
                T.set_max_nreg(producer_regs, 0)
                for i in T.serial(plan.dp_count(g)):
                    m, n = order.coord(g + i * num_sms)
                    produce_tile(A, B, A_s, B_s, full, empty, m, n, i * k_steps)
                if plan.has_segments(g):
                    for i in T.serial(plan.segment_count(g)):
                        t, kb, ke, offset = plan.segment(g, i, T.max, T.min)
                        m, n = order.coord(plan.dp_tiles + t)
                        produce_steps(A, B, A_s, B_s, full, empty, m, n, kb, ke, dp_steps + offset)
            else:
                T.set_max_nreg(consumer_regs, 1)
                for i in T.serial(plan.dp_count(g)):
                    m, n = order.coord(g + i * num_sms)
                    consume_tile(A_s, B_s, C_local, full, empty, i * k_steps)
                    store_tile(C, C_local, C_s, m, n)
                if plan.has_segments(g):
                    for i in T.serial(plan.segment_count(g)):
                        t, kb, ke, offset = plan.segment(g, i, T.max, T.min)
                        m, n = order.coord(plan.dp_tiles + t)
                        consume_steps(A_s, B_s, C_local, full, empty, ke - kb, dp_steps + offset)
                        if kb > 0:
                            publish(Workspace, Flags, C_local, plan.publish_slot(g, i), tid)
                        else:
                            if ke < k_steps:
                                add_partials(Workspace, Flags, C_local, g, t, tid)
                            store_tile(C, C_local, C_s, m, n)
                T.tma_store_wait(0)

    return gemm_ws_streamk if kernel_name is None else gemm_ws_streamk.with_attr("global_symbol", kernel_name)


# ---------------------------------------------------------------------------------------------------------
# Compile-only inspection (no GPU): markers, the main loop, ptxas registers and spills
# ---------------------------------------------------------------------------------------------------------

# What the generated CUDA of every variant must show: name -> pattern.
EXPECTED_MARKERS: dict[str, str] = {
    "wgmma": r"wgmma_ss<",
    "tma_load": r"tma_load\(",
    "mbarrier wait": r"\]\.wait\(",
    "mbarrier arrive": r"\]\.arrive\(\)",
    "one batch in flight": r"wait_wgmma<1>\(\)",
    "final drain": r"wait_wgmma<0>\(\)",
    "producer registers": r"warpgroup_reg_dealloc<\d+>",
    "consumer registers": r"warpgroup_reg_alloc<\d+>",
    "tma_store": r"tma_store\(",
}


def missing_markers(source: str) -> list[str]:
    return [name for name, pattern in EXPECTED_MARKERS.items() if not re.search(pattern, source)]


def consumer_main_loop(source: str) -> str:
    """The consumers' K loop of the generated CUDA: from the wait on the `full` barrier to the final drain and
    the last stage's release (of the first consumer branch, in the ping-pong kernel)."""
    lines = source.splitlines()
    start = next((i for i, l in enumerate(lines) if re.search(r"full\[.*\]\.wait\(", l)), None)
    drain = next((i for i, l in enumerate(lines) if "wait_wgmma<0>" in l), None)
    if start is None or drain is None:
        return "(consumer loop not found)"
    # ... through the release of the last stage after the drain
    end = next((i for i in range(drain, len(lines)) if "empty[" in lines[i]), drain)
    return "\n".join(lines[max(0, start - 1):end + 1])


def main_loop_syncs(source: str) -> int:
    """__syncthreads / named barriers inside the consumers' K loop (there should be none)."""
    return len(re.findall(r"__syncthreads|__sync_thread_partial|bar\.sync", consumer_main_loop(source)))


def ptxas_report(source: str, arch: str = ARCH) -> dict:
    """Compile TileLang's CUDA source to a cubin with nvcc as TileLang does (same flags and includes) plus
    `-Xptxas -v`, and read the registers, stack frame and spills. A kernel that spills is not worth timing."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    nvcc = tourkit.find_nvcc()
    if nvcc is None:
        return {"error": "nvcc not found"}
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        with open(cu, "w") as f:
            f.write(source)
        cmd = [nvcc, "--cubin", "-O3", "-lineinfo", f"-arch={arch}", "-std=c++20", f"-I{TILELANG_TEMPLATE_PATH}",
               f"-I{CUTLASS_INCLUDE_DIR}", "-Xptxas", "-v", "-o", cubin, cu]
        done = subprocess.run(cmd, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        return {"error": text.strip().splitlines()[-1] if text.strip() else f"nvcc exit {done.returncode}"}

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    return {"registers": number(r"Used (\d+) registers"), "stack_bytes": number(r"(\d+) bytes stack frame"),
            "spill_stores": number(r"(\d+) bytes spill stores"), "spill_loads": number(r"(\d+) bytes spill loads"),
            # ptxas's own advisories (e.g. C7514: wgmma serialized), not the headers' C++ warnings
            "warnings": [l.strip() for l in text.splitlines() if l.startswith("ptxas") and
                         ("warning" in l or "Performance Loss" in l)]}


def ptx_source(source: str, arch: str = ARCH) -> str:
    """The PTX nvcc makes of TileLang's CUDA source (ptxas_report's flags): where the stream-K fixup's plain
    loads and stores ended up against its fences, barriers and flag accesses (ordered by inline asm that
    has no memory clobber, in part)."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    nvcc = tourkit.find_nvcc()
    if nvcc is None:
        raise RuntimeError("nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        cu, ptx = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.ptx")
        with open(cu, "w") as f:
            f.write(source)
        cmd = [nvcc, "--ptx", "-O3", "-lineinfo", f"-arch={arch}", "-std=c++20", f"-I{TILELANG_TEMPLATE_PATH}",
               f"-I{CUTLASS_INCLUDE_DIR}", "-o", ptx, cu]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc --ptx: {(done.stdout + done.stderr).strip()[-300:]}")
        with open(ptx) as f:
            return f.read()


def fixup_code(source: str) -> str:
    """The stream-K fixup in the generated CUDA: from the partial sum's store into the workspace to the
    finisher's reads of it (empty for a kernel without one)."""
    lines = source.splitlines()
    uses = [i for i, line in enumerate(lines) if "Workspace + " in line or "Workspace[" in line]
    return "\n".join(lines[uses[0] - 2:uses[-1] + 1]) if uses else ""


def inspect_variant(name: str, shape: tuple[int, int, int] = (8192, 8192, 8192)) -> dict:
    """Everything the compile-only check says about a variant: lowered for sm_90a by TileLang (launch shape,
    shared memory, markers), then compiled by nvcc with ptxas -v (registers, stack, spills)."""
    try:
        rep = tourkit.inspect_kernel(name, program_for(name, *shape), ARCH, nvcc=False)
    except Exception as exc:
        return {"variant": name, "lowered": False, "error": tourkit.one_line(exc)}
    report = {"variant": name, "lowered": True, "threads": rep.threads, "grid": rep.grid,
              "smem_bytes": rep.smem_bytes, "missing_markers": missing_markers(rep.source),
              "main_loop_syncs": main_loop_syncs(rep.source), "source": rep.source}
    report.update(ptxas_report(rep.source))
    return report


def inspect_variants(names: list[str]) -> list[dict]:
    """inspect_variant for several variants at once: lowering runs in C++ and each nvcc is its own process."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        return list(pool.map(inspect_variant, names))


def spilled_bytes(rep: dict) -> int:
    return sum(rep.get(key) or 0 for key in ("spill_stores", "spill_loads", "stack_bytes"))


def list_variants(show_source: bool) -> int:
    """--list: each variant, whether it lowers and compiles for sm_90a, its markers, registers and spills."""
    failed = 0
    for rep in inspect_variants(ALL_VARIANTS):
        name, label = rep["variant"], describe(rep["variant"])
        if not rep["lowered"] or "error" in rep:
            failed += 1
            say(f"{name:16s} FAILED: {rep.get('error')}")
            continue
        spills = spilled_bytes(rep)
        verdict = "compiled" if not rep["missing_markers"] and not spills else "compiled, NOT WORTH A RUN"
        say(f"{name:16s} {verdict}: {label}; {rep['threads']} threads, grid {rep['grid']}, "
            f"shared memory {tourkit.format_bytes(rep['smem_bytes'])}; registers {rep['registers']} (launch bound), "
            f"stack {rep['stack_bytes']} B, spills {rep['spill_stores']}/{rep['spill_loads']} B, "
            f"syncs in the K loop {rep['main_loop_syncs']}, missing markers {rep['missing_markers'] or 'none'}")
        for warning in rep["warnings"]:
            say(f"    ptxas: {warning}")
        if show_source:
            say(tourkit.indent(consumer_main_loop(rep["source"]), "    | "))
            if fixup_code(rep["source"]):
                say("    the stream-K fixup (publish; wait, reset, add):")
                say(tourkit.indent(fixup_code(rep["source"]), "    | "))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------
# Kernels by name: the hand-written variants and the tour's schedules
# ---------------------------------------------------------------------------------------------------------

def kernel_names(variants: list[str]) -> list[str]:
    return list(TOUR_CONFIGS) + variants


def program_for(name: str, M: int, N: int, K: int):
    if name in EXPERIMENTS:
        builder, kwargs = EXPERIMENTS[name]
        return globals()[builder](M, N, K, **kwargs)
    return gemm_program(M, N, K, TOUR_CONFIGS[name] if name in TOUR_CONFIGS else VARIANTS[name])


def describe(name: str) -> str:
    if name in EXPERIMENTS and EXPERIMENTS[name][0] == "gemm_ws_multicast_program":
        kwargs = EXPERIMENTS[name][1]
        walk = f", persistent{kwargs.get('num_sms', H200_SMS)}" if kwargs.get("persistent") else ""
        arrivals = ", warp arrivals" if kwargs.get("warp_arrivals") else ""
        stores = f", store{kwargs['store_buffers']}" if kwargs.get("store_buffers", 1) > 1 else ""
        return (f"ws 128x256x64 s{kwargs.get('num_stages', 4)}{stores}, clusters of 2 blocks along M, B by TMA "
                f"multicast{walk}{arrivals}")
    if name in EXPERIMENTS and EXPERIMENTS[name][0] == "gemm_ws_streamk_program":
        kwargs = {"num_sms": H200_SMS, "sk_waves": 2, **EXPERIMENTS[name][1]}
        return (f"ws 128x256x64 s4, persistent{kwargs['num_sms']}, stream-K over the last "
                f"{kwargs['sk_waves']} wave{'s' if kwargs['sk_waves'] > 1 else ''} of tiles")
    if name in EXPERIMENTS and EXPERIMENTS[name][0] == "gemm_ws_lockstep_program":
        kwargs = {"num_sms": H200_SMS, "fixup_steps": FIXUP_STEPS, **EXPERIMENTS[name][1]}
        return (f"ws 128x256x64 s4, persistent{kwargs['num_sms']}, the partial wave's first k-steps in lockstep, "
                f"the rest on the idle blocks (fixup modeled as {kwargs['fixup_steps']} k-steps)")
    return VARIANTS[name].label()


def is_persistent(name: str) -> bool:
    if name in EXPERIMENTS:
        builder, kwargs = EXPERIMENTS[name]
        return builder in FIXUP_BUILDERS or bool(kwargs.get("persistent"))
    return VARIANTS[name].persistent > 0


def compile_kernel(name: str, M: int, N: int, K: int):
    """The kernel for the local GPU, writing into the caller's C: kernel(a, b, c). A hit in TileLang's kernel
    cache after precompile(). A split-tile kernel (more tensors after C: Workspace, Flags) comes wrapped in
    FixupMemory, which owns them."""
    import tilelang

    func = program_for(name, M, N, K)
    kernel = tilelang.compile(func, out_idx=None, target="cuda")
    if len(func.params) == 3:
        return kernel
    workspace, flags = (func.buffer_map[param] for param in func.params[3:])
    blocks = EXPERIMENTS[name][1].get("num_sms", H200_SMS)  # the grid (FIXUP_BUILDERS: one block per SM)
    return FixupMemory(kernel, tuple(int(d) for d in workspace.shape), int(flags.shape[0]), blocks)


class FixupMemory:
    """kernel(a, b, c) for a split-tile kernel (gemm_ws_fixup_program), which also takes Workspace (fp32 partial
    tiles, one per slot of its plan) and Flags (one int32 per slot): allocated zeroed at the first call, then
    passed to every launch. The kernel must leave the flags at zero (flags_left: the validation child checks
    it). A grid larger than the GPU's SM count is refused: the blocks wait for one another, so all must be
    resident at once, one per SM."""

    def __init__(self, kernel, workspace_shape: tuple[int, ...], flag_count: int, blocks: int):
        self.kernel, self.workspace_shape, self.flag_count, self.blocks = kernel, workspace_shape, flag_count, blocks
        self.workspace = self.flags = None

    def __call__(self, a, b, c):
        if self.flags is None:
            self._allocate(a.device)
        return self.kernel(a, b, c, self.workspace, self.flags)

    def _allocate(self, device) -> None:
        import torch

        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if sms < self.blocks:
            raise RuntimeError(f"{self.blocks} blocks that wait for one another need as many SMs; this GPU has "
                               f"{sms}: the kernel would deadlock")
        self.workspace = torch.zeros(self.workspace_shape, dtype=torch.float32, device=device)
        self.flags = torch.zeros((self.flag_count,), dtype=torch.int32, device=device)

    def flags_left(self) -> int:
        """Flags not at zero (after the launches so far have finished)."""
        return 0 if self.flags is None else int(self.flags.count_nonzero().item())


def precompile(jobs: list[tuple[str, tuple[int, int, int]]]) -> None:
    """Compile every (kernel, shape) at once in threads (tourkit.compile_many), filling TileLang's on-disk
    kernel cache for the validation child and the timing below."""
    programs = []
    for name, (M, N, K) in jobs:
        try:
            programs.append(program_for(name, M, N, K))
        except Exception as exc:  # reported again, per kernel, by the validation child
            say(f"  {name} {M}x{N}x{K}: cannot build the program: {tourkit.one_line(exc)}")
    tourkit.compile_many(programs, out_idx=None, log=lambda line: say("  " + line))


def shape_text(shape) -> str:
    return "x".join(str(d) for d in shape)


def parse_shape(text: str) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in text.lower().split("x"))
    if len(dims) != 3:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK, not {text!r}")
    return dims


# ---------------------------------------------------------------------------------------------------------
# Never hang the GPU forever: a deadlocked kernel never returns from a synchronize
# ---------------------------------------------------------------------------------------------------------

def wait_for_gpu(what: str, seconds: float) -> None:
    """Wait for the work queued so far by polling a CUDA event (the polling thread keeps running whatever a
    hung kernel does); past `seconds`, report a probable deadlock and leave the process at once."""
    import torch

    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            print(json.dumps({"event": "deadlock", "what": what, "seconds": seconds}), flush=True)
            os._exit(3)
        time.sleep(0.002)


class Watchdog:
    """Leave the process (os._exit) when the block inside runs past `seconds`: around timing, where
    bench_ms synchronizes by itself. torch's synchronize releases the GIL, so this thread still runs."""

    def __init__(self, what: str, seconds: float):
        self.what, self.seconds, self.done = what, seconds, threading.Event()

    def _watch(self) -> None:
        if not self.done.wait(self.seconds):
            say(f"DEADLOCK? {self.what} still running after {self.seconds:.0f} s; leaving the process")
            os._exit(3)

    def __enter__(self):
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        return False


# ---------------------------------------------------------------------------------------------------------
# Validation, in a child process: a deadlock or a fault there cannot take the timing process with it
# ---------------------------------------------------------------------------------------------------------

RACE_LAUNCHES = 20  # repeated launches that must reproduce the first result bit for bit
FIRST_LAUNCH_S = 30.0  # far beyond any of these GEMMs (a 16384^3 one takes ~15 ms)


def child_validate(jobs: list[tuple[str, tuple[int, int, int]]]) -> int:
    """Validate each (kernel, shape) job, printing one JSON line as it starts and one with its result. Stops
    at the first kernel that raises (a fault poisons the CUDA context); the parent starts a new child."""
    import torch

    from sections.gemm_schedules import reference

    inputs: dict = {}
    for name, shape in jobs:
        print(json.dumps({"event": "start", "kernel": name, "shape": shape}), flush=True)
        M, N, K = shape
        try:
            kernel = compile_kernel(name, M, N, K)
            if shape not in inputs:
                inputs.clear()
                a = tourkit.random_tensor((M, K), torch.float16, seed=1)
                b = tourkit.random_tensor((K, N), torch.float16, seed=2)
                inputs[shape] = (a, b, reference(a, b))
            a, b, ref = inputs[shape]
            c = tourkit.poison_(torch.empty((M, N), dtype=torch.float16, device="cuda"))
            kernel(a, b, c)
            wait_for_gpu(f"{name} {shape_text(shape)} first launch", FIRST_LAUNCH_S)
            error = tourkit.relative_error(c, ref)
            extra = {}
            if isinstance(kernel, FixupMemory):  # stream-K: every flag reset by the block that consumed it
                extra["flags_left"] = kernel.flags_left()
            differing = None
            if error <= TOLERANCE:
                differing = count_differing_launches(kernel, a, b, c, f"{name} {shape_text(shape)}")
                if isinstance(kernel, FixupMemory):
                    extra["flags_left"] = max(extra["flags_left"], kernel.flags_left())
        except Exception as exc:
            print(json.dumps({"event": "result", "kernel": name, "shape": shape, "error": tourkit.one_line(exc)}),
                  flush=True)
            return 4
        print(json.dumps({"event": "result", "kernel": name, "shape": shape, "rel_error": error,
                          "differing_launches": differing, **extra}), flush=True)
    return 0


def count_differing_launches(kernel, a, b, first, what: str) -> int:
    """Launch the kernel RACE_LAUNCHES more times into a poisoned output; count the launches whose result
    differs from the first in any bit. A barrier-phase race shows up here even when one result looks right."""
    import torch

    expected = first.clone()
    c = torch.empty_like(first)
    differing = torch.zeros((), dtype=torch.int64, device="cuda")
    for _ in range(RACE_LAUNCHES):
        tourkit.poison_(c)
        kernel(a, b, c)
        differing += (c.view(torch.int16) != expected.view(torch.int16)).any().to(torch.int64)
    wait_for_gpu(f"{what} repeated launches", FIRST_LAUNCH_S + RACE_LAUNCHES)
    return int(differing.item())


def validate_in_children(jobs: list[tuple[str, tuple[int, int, int]]]) -> dict:
    """Run child_validate over the jobs; when a child dies (deadlock, fault, timeout), record why for the job
    it was on and start another child for the rest. Returns {(kernel, shape): result dict}."""
    results: dict = {}
    remaining = list(jobs)
    while remaining:
        spec = ";".join(f"{name}@{shape_text(shape)}" for name, shape in remaining)
        limit = 120 + 30 * len(remaining)  # compiles are cache hits; the child's own watchdog fires first
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-validate", spec],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
        current = None
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            key = (event.get("kernel"), tuple(event["shape"])) if "shape" in event else None
            if event["event"] == "start":
                current = key
            elif event["event"] == "result":
                results[key] = event
                current = None
            elif event["event"] == "deadlock" and current is not None:
                results[current] = {"deadlock": True, "error": f"deadlock? ({event['what']} did not finish "
                                                                f"in {event['seconds']:.0f} s)"}
                current = None
        if current is not None:  # the child died during this job without saying why
            why = f"deadlock? (child killed after {limit} s)" if timed_out else \
                f"child exited {proc.returncode}: {(err.strip().splitlines() or ['?'])[-1][:200]}"
            results[current] = {"deadlock": timed_out, "error": why}
        before = len(remaining)
        remaining = [job for job in remaining if job not in results]
        if len(remaining) == before:  # the child did nothing at all: do not loop forever
            for job in remaining:
                results[job] = {"error": f"child exited {proc.returncode}: {err.strip()[-300:]}"}
            break
    return results


def passed(result: dict) -> bool:
    return (result.get("rel_error", float("inf")) <= TOLERANCE and result.get("differing_launches") == 0
            and not result.get("flags_left"))


def verdict(result: dict) -> str:
    if "error" in result:
        return "FAILED: " + result["error"]
    text = f"rel. error {tourkit.format_error(result['rel_error'])}"
    if result["rel_error"] > TOLERANCE:
        return f"FAILED: {text} (tolerance {TOLERANCE:.0e})"
    if result.get("differing_launches"):
        return f"FAILED: {text}, but {result['differing_launches']} of {RACE_LAUNCHES} repeated launches differ (a race)"
    if result.get("flags_left"):
        return f"FAILED: {text}, but {result['flags_left']} stream-K flags left set after a launch"
    flags = ", flags reset" if "flags_left" in result else ""
    return f"ok: {text}, {RACE_LAUNCHES} repeated launches bit-identical{flags}"


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------

def time_shape(shape, names: list[str], rounds: int) -> dict[str, float]:
    """Median ms of torch.matmul (cuBLAS) and each validated kernel at one shape, taking turns."""
    import torch

    M, N, K = shape
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    c_torch = torch.empty((M, N), dtype=torch.float16, device="cuda")
    contenders = {"cuBLAS (torch.matmul)": lambda: torch.matmul(a, b, out=c_torch)}
    for name in names:
        kernel, c = compile_kernel(name, M, N, K), torch.empty((M, N), dtype=torch.float16, device="cuda")
        contenders[name] = lambda kernel=kernel, c=c: kernel(a, b, c)
    with Watchdog(f"timing at {shape_text(shape)}", 300):
        return tourkit.bench_interleaved(contenders, rounds=rounds)


def print_shape_table(shape, times: dict[str, float], checks: dict[str, str]) -> None:
    M, N, K = shape
    flops = 2 * M * N * K
    base = times["cuBLAS (torch.matmul)"]
    rows = []
    for name, ms in sorted(times.items(), key=lambda item: item[1]):
        rows.append([name, f"{ms:.3f}", f"{tourkit.tflops(flops, ms):.0f}", f"{tourkit.speedup(base, ms):.3f}",
                     checks.get(name, "reference")])
    say(tourkit.format_table(["kernel", "ms", "TFLOP/s", "vs cuBLAS", "check"], rows))


# ---------------------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------------------

def usable_variants(names: list[str]) -> list[str]:
    """The variants worth a GPU run: they lower, carry the expected markers, and ptxas neither spills nor
    keeps a stack frame (checked at 8192^3; the other shapes differ only in constants)."""
    usable = []
    for rep in inspect_variants(names):
        name = rep["variant"]
        if not rep["lowered"]:
            say(f"  {name}: does not lower for {ARCH}: {rep['error']} - skipped")
        elif rep["missing_markers"] or spilled_bytes(rep):
            say(f"  {name}: missing markers {rep['missing_markers']}, spills/stack {spilled_bytes(rep)} B - skipped")
        elif "error" in rep:  # ptxas could not run (no nvcc?): TileLang's own compile decides below
            say(f"  {name}: lowers; no ptxas report ({rep['error']})")
            usable.append(name)
        else:
            say(f"  {name}: compiles; registers {rep['registers']} (launch bound), no spills, "
                f"{rep['main_loop_syncs']} syncs in the K loop, shared memory {tourkit.format_bytes(rep['smem_bytes'])}")
            usable.append(name)
    return usable


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8192^3 only")
    ap.add_argument("--shapes", type=lambda t: [parse_shape(s) for s in t.split(",")], default=None,
                    help="comma-separated MxNxK list (default: the five target shapes)")
    ap.add_argument("--variants", type=lambda t: t.split(","), default=list(ALL_VARIANTS),
                    help=f"comma-separated, of {', '.join(ALL_VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=4, help="turns per contender (tourkit.bench_interleaved)")
    ap.add_argument("--no-odd", action="store_true", help="skip the odd-size validation (1000x1000x1000 ...)")
    ap.add_argument("--list", action="store_true", help="the variants and whether each compiles for sm_90a "
                    "(no GPU needed), with ptxas registers and spills")
    ap.add_argument("--source", action="store_true", help="with --list: print each variant's consumer K loop")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for gemm_ws_probe.json (default $OUT)")
    ap.add_argument("--child-validate", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in ALL_VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {ALL_VARIANTS}")
    if args.shapes is None:
        args.shapes = [SHAPES[0]] if args.quick else SHAPES
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child_validate:
        jobs = [(item.split("@")[0], parse_shape(item.split("@")[1])) for item in args.child_validate.split(";")]
        return child_validate(jobs)
    if args.list:
        return list_variants(args.source)

    import torch

    if not torch.cuda.is_available():
        say("no CUDA GPU here: use --list to check that the variants compile for sm_90a")
        return 2
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; shapes {[shape_text(s) for s in args.shapes]}")
    say("compile-only check (ptxas):")
    variants = usable_variants(args.variants)

    names = kernel_names(variants)
    jobs = [(name, shape) for shape in args.shapes for name in names]
    if not args.no_odd:
        jobs += [(name, shape) for shape in ODD_SHAPES for name in variants]
    say(f"compiling {len(jobs)} kernels:")
    precompile(jobs)

    say("validating each kernel in a child process (first launch under a watchdog, then "
        f"{RACE_LAUNCHES} launches that must agree bit for bit):")
    results = validate_in_children(jobs)
    for (name, shape) in jobs:
        say(f"  {name:22s} {shape_text(shape):18s} {verdict(results[(name, shape)])}")

    record = {"device": torch.cuda.get_device_name(), "variants": variants, "shapes": {}}
    for shape in args.shapes:
        good = [name for name in names if passed(results[(name, shape)])]
        checks = {name: verdict(results[(name, shape)]).split(",")[0] for name in good}
        say(f"\n{shape_text(shape)}: timing cuBLAS and {len(good)} kernels in {args.rounds} turns")
        times = time_shape(shape, good, args.rounds)
        print_shape_table(shape, times, checks)
        record["shapes"][shape_text(shape)] = {"ms": times, "validation": {
            name: results[(name, shape)] for name in names}}
        save(record, args.out)  # after every shape: a later hang loses nothing measured so far

    print_summary(record)
    failed = [job for job in jobs if job[0] in variants and not passed(results[job])]
    return 1 if failed else 0


def save(record: dict, folder: str | None) -> None:
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "gemm_ws_probe.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)


def print_summary(record: dict) -> None:
    """One line per shape: every contender's ratio to cuBLAS (higher is faster)."""
    columns = list(TOUR_CONFIGS) + list(record["variants"])
    rows = []
    for shape, entry in record["shapes"].items():
        base = entry["ms"]["cuBLAS (torch.matmul)"]
        rows.append([shape] + [f"{base / entry['ms'][c]:.3f}" if c in entry["ms"] else "-" for c in columns])
    say("\nvs cuBLAS (>1 is faster), per shape:")
    say(tourkit.format_table(["shape"] + columns, rows))


if __name__ == "__main__":
    sys.exit(main())
