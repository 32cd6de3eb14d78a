"""An experiment: the appendix's hand-written GEMM pipeline with two blocks of a cluster sharing one operand's
loads by TMA multicast (bench/gemm_multicast_probe.py times it beside cuBLAS and the appendix).

Two blocks side by side along N (a 2x1 cluster) compute tiles of the same rows, so they need the same A tile at
every K step. One TMA load (the cluster's first block issues it, `cluster_mask=0b11`) writes it into both blocks'
shared memory and signals both blocks' `full` barrier: A crosses from L2 to the SMs once for two tiles. Along M
(a 1x2 cluster) they share B instead. What the compiler's `T.Pipelined` cannot know, the ring says here: a stage
is free again only when the consumers of *both* blocks are done with it, so each consumer thread arrives on its
own block's `empty` barrier and on its partner's (`T.ptx_arrive_cluster_barrier`), and each `empty` barrier
waits for both blocks' consumer threads. The blocks meet once more at the end (`T.cluster_sync`): neither may
exit while the other can still arrive on its barriers.

    for each K step k (stage s = k % stages):
        producer: wait empty[s] (both blocks' consumers released it);  B -> B_s[s];
                  A -> A_s[s] of both blocks (one multicast, by the cluster's first block)
        consumers: wait full[s];  acc += A_s[s] @ B_s[s] (wgmma, one batch in flight);
                   release the previous step's stage in both blocks
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import tilelang.language as T

CONSUMERS = 256  # two consumer warpgroups, each owning block_M / 2 full rows
PRODUCER = 128
REGISTERS = (24, 240)  # producer, consumer registers a thread after setmaxnreg


def multicast_program(M: int, N: int, K: int, block_M: int = 128, block_N: int = 256, num_stages: int = 3,
                      share: str = "A", dtype: str = "float16", accum_dtype: str = "float32"):
    """C = A @ B, one block_M x block_N tile a block, blocks paired in clusters that share `share`'s loads."""
    bM, bN, bK = block_M, block_N, 64
    m_tiles, n_tiles, k_steps = -(-M // bM), -(-N // bN), -(-K // bK)
    pairs_along = n_tiles if share == "A" else m_tiles
    if share not in ("A", "B") or pairs_along % 2:
        raise ValueError(f"a 2-block cluster sharing {share} needs an even number of tiles along "
                         f"{'N' if share == 'A' else 'M'} ({pairs_along})")
    cluster = (2, 1, 1) if share == "A" else (1, 2, 1)
    policy = T.GemmWarpPolicy.FullRow

    @T.prim_func
    def gemm_multicast(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(n_tiles, m_tiles, threads=CONSUMERS + PRODUCER, cluster_dims=cluster) as (bx, by):
            A_s = T.alloc_shared((num_stages, bM, bK), dtype)
            B_s = T.alloc_shared((num_stages, bK, bN), dtype)
            C_s = T.alloc_shared((bM, bN), dtype)
            C_local = T.alloc_fragment((bM, bN), accum_dtype)
            full = T.alloc_barrier([PRODUCER] * num_stages)  # the producer's arrivals and the bytes landed
            empty = T.alloc_barrier([2 * CONSUMERS] * num_stages)  # both blocks' consumers released the stage
            partner = 1 - T.block_rank_in_cluster()
            T.cluster_sync()  # the partner's loads and arrivals reach this block's barriers: both set up first
            tid = T.get_thread_binding()
            if tid >= CONSUMERS:
                T.set_max_nreg(REGISTERS[0], 0)
                for k in T.serial(k_steps):
                    stage, parity = k % num_stages, (k // num_stages) & 1
                    T.mbarrier_wait_parity(empty[stage], parity ^ 1)
                    a_tile = A[by * bM:(by + 1) * bM, k * bK:(k + 1) * bK]
                    b_tile = B[k * bK:(k + 1) * bK, bx * bN:(bx + 1) * bN]
                    if share == "A":
                        T.tma_copy(a_tile, A_s[stage, :, :], barrier=full[stage], cluster_mask=0b11)
                        T.tma_copy(b_tile, B_s[stage, :, :], barrier=full[stage])
                    else:
                        T.tma_copy(a_tile, A_s[stage, :, :], barrier=full[stage])
                        T.tma_copy(b_tile, B_s[stage, :, :], barrier=full[stage], cluster_mask=0b11)
                    T.mbarrier_arrive(full[stage])
            else:
                T.set_max_nreg(REGISTERS[1], 1)
                T.clear(C_local)
                for k in T.serial(k_steps):
                    stage, parity = k % num_stages, (k // num_stages) & 1
                    T.mbarrier_wait_parity(full[stage], parity)
                    T.wgmma_gemm(A_s[stage, :, :], B_s[stage, :, :], C_local, policy=policy)
                    T.wait_wgmma(1)  # the previous step's batch is done: its stage goes back, in both blocks
                    if k > 0:
                        T.mbarrier_arrive(empty[(k - 1) % num_stages])
                        T.ptx_arrive_cluster_barrier(empty[(k - 1) % num_stages], partner)
                T.wait_wgmma(0)
                T.mbarrier_arrive(empty[(k_steps - 1) % num_stages])
                T.ptx_arrive_cluster_barrier(empty[(k_steps - 1) % num_stages], partner)
                T.copy(C_local, C_s)
                T.copy(C_s, C[by * bM, bx * bN])
            T.cluster_sync()  # neither block exits while its partner may still arrive on its barriers

    return gemm_multicast
