"""flash_attention, continued: the lesson's kernel walking its query tiles persistently (Hopper, full attention).

A problem of many query tiles, each walking few key tiles (BERT-like encoders: a few hundred keys, hundreds of
(batch, head) pairs), spends much of every block on its start (the Q load, the first K/V loads) and its end
(dividing O by l, the store): a walk of 2 to 8 key tiles hides little of either. The cure is the GEMM lesson's
persistent walk (`sections/gemm_schedules.py`):

    for block w of `workers` (one an SM):
        for step in T.Pipelined(tiles of w x key tiles):      # one pipeline over every tile's key steps
            t, k = the tile and key step of this step          # tiles w, w + workers, ...
            if k == 0: O = 0, l = 0, m = -inf
            the lesson's key step: S = Q·K(k)ᵀ, online softmax, O += P·V(k)
            if k == last: O /= l, store O                      # the next tile's K/V loads already in flight

The pipeline runs ahead across tiles, so a tile's first loads fly during the last one's store. Causal walks
differ in length from tile to tile, which one flat loop cannot express: causal problems keep the lesson's grid.
The rule that takes this kernel is `attention_plans.persistent_walk`.
"""

import tilelang.language as T

from sections import attention_plans as plans
from sections import flash_attention as lesson


def flash_attention_persistent(batch: int, heads: int, seq_len: int, dim: int, causal: bool = False, *,
                               block_M: int = 128, block_N: int = 128, num_stages: int = 2, threads: int = 256,
                               workers: int = plans.DEFAULT_SMS, dtype: str = "float16", kv_heads: int | None = None):
    """`workers` blocks take query tiles w, w + workers, ... (each tile: block_M rows of one batch and head), all
    their key steps in one T.Pipelined loop."""
    if causal:
        raise ValueError("flash_attention_persistent: full attention only (causal walks differ in length)")
    shape, kv_shape, groups = plans.shapes(batch, heads, seq_len, dim, kv_heads)
    n_tiles, n_query_blocks, _, online_softmax, finish = lesson.kernel_steps(seq_len, dim, block_M, block_N, False,
                                                                             seq_len % block_N != 0)
    tiles = n_query_blocks * heads * batch
    workers = min(workers, tiles)

    @T.prim_func
    def flash_attention_persistent(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype),
                                   V: T.Tensor(kv_shape, dtype), O: T.Tensor(shape, dtype)):
        with T.Kernel(workers, threads=threads) as w:
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = lesson.alloc_buffers(
                block_M, block_N, dim, dtype)
            for step in T.Pipelined(T.ceildiv(tiles - w, workers) * n_tiles, num_stages=num_stages):
                t, k = step // n_tiles * workers + w, step % n_tiles
                # neighbouring blocks take neighbouring query tiles of one head: its K and V stay in L2
                bx, by, bz = t % n_query_blocks, t // n_query_blocks % heads, t // (n_query_blocks * heads)
                # Q at every step (from L2 after the first): the pipeline stages unconditional copies only; one
                # under `if k == 0` would be the consumers' own, outside the pipeline's barriers, and races.
                T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s)
                if k == 0:
                    T.fill(acc_o, 0)
                    T.fill(l, 0)
                    T.fill(m, -T.infinity(lesson.ACCUM))
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by // groups, :], K_s)
                T.gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.copy(scores, probs)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by // groups, :], V_s)
                T.gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                if k == n_tiles - 1:
                    finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_persistent
