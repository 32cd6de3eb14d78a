"""flash_attention, continued: the lesson's kernel walking its query tiles persistently (Hopper).

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

The pipeline runs ahead across tiles, so a tile's first loads fly during the last one's store.

Causal walks differ in length (query tile i of n walks i + 1 key tiles), which one flat loop cannot take tile by
tile. It can take them in pairs: tile i with tile n-1-i walks (i + 1) + (n - i) = n + 1 tiles, the same for
every pair (with n odd, the longest tile walks its n alone and the rest pair up as i with n-2-i, n each). A
worker walks pairs, so every block does the same work and no short block waits in the grid's tail.

At head dim 128 the walk also takes the lesson's FA3 schedule (`flash_attention_persistent_async`): a step's
Q·Kᵀ in flight with the last step's P·V. The grid's async kernel pays an extra iteration a tile for its last
P·V; walking, that P·V runs in the next tile's first step, and a worker pays one extra step in all.

The rule that takes these kernels is `attention_plans.persistent_walk`: full attention over short walks (at head
dim 128 longer ones too, in the FA3 schedule); causal problems whose pairs keep the SMs busy (the grid's
heaviest-first blocks fill a tail that equal pairs cannot) over short walks, or longer ones at head dim 128 over
a few rounds of pairs.
"""

from types import SimpleNamespace

import tilelang.language as T

from sections import attention_plans as plans
from sections import flash_attention as lesson


def causal_pair_step(n: int, unit, step, select):
    """(query tile, key tile) at `step` of causal unit `unit` of n query tiles (square tiles: tile i walks key
    tiles 0..i). n even: the pair (u, n-1-u); n odd: (u-1, n-1-u), unit 0 being tile n-1 alone. `select` is
    T.if_then_else in the kernel (plain Python in the tests)."""
    first = unit + 1 - n % 2  # key steps of the pair's first, shorter tile
    in_first = step < first
    return select(in_first, first - 1, n - 1 - unit), select(in_first, step, step - first)


def walk_layout(batch: int, heads: int, seq_len: int, dim: int, causal: bool, block_M: int, block_N: int,
                workers: int, kv_heads: int | None):
    """What both walks derive from the problem: the tensors' shapes, the lesson's key-step macros, the units
    (full: one query tile of block_M rows of one batch and head; causal: a pair of them, block_M == block_N),
    the key steps of one unit, the workers, and tile_of(w, step): (query tile, head, batch, key tile) of a
    worker's step."""
    if causal and block_M != block_N:
        raise ValueError("flash_attention_persistent: causal pairs need square tiles (block_M == block_N)")
    shape, kv_shape, groups = plans.shapes(batch, heads, seq_len, dim, kv_heads)
    n_tiles, n, _, online_softmax, finish = lesson.kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                seq_len % block_N != 0)
    per_head = (n + 1) // 2 if causal else n  # units of one (batch, head)
    walk = n + 1 - n % 2 if causal else n_tiles  # key steps of one unit
    units = per_head * heads * batch
    workers = min(workers, units)

    def tile_of(w, step):
        t = step // walk * workers + w  # worker w takes units w, w + workers, ...
        # neighbouring blocks take neighbouring units of one head: its K and V stay in L2
        by, bz = t // per_head % heads, t // (per_head * heads)
        bx, k = (causal_pair_step(n, t % per_head, step % walk, T.if_then_else) if causal
                 else (t % per_head, step % walk))
        return bx, by, bz, k

    return SimpleNamespace(shape=shape, kv_shape=kv_shape, groups=groups, n_tiles=n_tiles, units=units, walk=walk,
                           workers=workers, online_softmax=online_softmax, finish=finish, tile_of=tile_of)


def flash_attention_persistent(batch: int, heads: int, seq_len: int, dim: int, causal: bool = False, *,
                               block_M: int = 128, block_N: int = 128, num_stages: int = 2, threads: int = 256,
                               workers: int = plans.DEFAULT_SMS, dtype: str = "float16", kv_heads: int | None = None,
                               blocks_per_sm: int = 1):
    """`workers` blocks take units w, w + workers, ... (walk_layout), all their key steps in one T.Pipelined
    loop."""
    plan = walk_layout(batch, heads, seq_len, dim, causal, block_M, block_N, workers, kv_heads)
    online_softmax, finish, groups = plan.online_softmax, plan.finish, plan.groups

    @T.prim_func
    def flash_attention_persistent(Q: T.Tensor(plan.shape, dtype), K: T.Tensor(plan.kv_shape, dtype),
                                   V: T.Tensor(plan.kv_shape, dtype), O: T.Tensor(plan.shape, dtype)):
        with T.Kernel(plan.workers, threads=threads) as w:
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = lesson.alloc_buffers(
                block_M, block_N, dim, dtype)
            lesson.share_sm(blocks_per_sm, threads)  # as in the lesson's grid: registers split between blocks
            for step in T.Pipelined(T.ceildiv(plan.units - w, plan.workers) * plan.walk, num_stages=num_stages):
                bx, by, bz, k = plan.tile_of(w, step)
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
                if k == (bx if causal else plan.n_tiles - 1):  # a tile's last key step
                    finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_persistent


def flash_attention_persistent_async(batch: int, heads: int, seq_len: int, dim: int, causal: bool = False, *,
                                     block_M: int = 128, block_N: int = 128, num_stages: int = 2,
                                     threads: int = 256, workers: int = plans.DEFAULT_SMS, dtype: str = "float16",
                                     kv_heads: int | None = None):
    """The walk above with the FA3 schedule of the lesson's async kernel: step j issues S(j) = Q·K(j)ᵀ and
    O += P(j-1)·V(j-1) together, the softmax of S(j) running while P·V does. The async kernel pays one extra
    iteration a tile for its last P·V; walking, a tile's last P·V runs in the next tile's first step, and a
    worker pays one extra step in all. At a tile's first step the row state restarts (m = -inf, so the
    rescale is 0 and O clears) once the last tile's O, completed by that P·V, is divided by its l and stored."""
    plan = walk_layout(batch, heads, seq_len, dim, causal, block_M, block_N, workers, kv_heads)
    online_softmax, finish, groups, tile_of = plan.online_softmax, plan.finish, plan.groups, plan.tile_of

    @T.prim_func
    def flash_attention_persistent_async(Q: T.Tensor(plan.shape, dtype), K: T.Tensor(plan.kv_shape, dtype),
                                         V: T.Tensor(plan.kv_shape, dtype), O: T.Tensor(plan.shape, dtype)):
        with T.Kernel(plan.workers, threads=threads) as w:
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = lesson.alloc_buffers(
                block_M, block_N, dim, dtype)
            l_done = T.alloc_fragment((block_M,), lesson.ACCUM)  # the finished tile's row sums
            touch = T.alloc_local((1,), dtype)
            steps = T.ceildiv(plan.units - w, plan.workers) * plan.walk
            T.fill(acc_o, 0)
            T.fill(probs, 0)
            T.fill(l, 0)
            for j in T.Pipelined(steps + 1, num_stages=num_stages):
                # step `steps` only completes the last tile: it recomputes the last step's scores, unused
                bx, by, bz, k = tile_of(w, T.min(j, steps - 1))
                pbx, pby, pbz, pk = tile_of(w, T.max(j, 1) - 1)  # the step whose P is in `probs` (j = 0: P = 0)
                T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s)
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by // groups, :], K_s)
                T.copy(V[pbz, pk * block_N:(pk + 1) * block_N, pby // groups, :], V_s)
                T.wgmma_gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.wgmma_gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                T.wait_wgmma(1)  # S(j) is ready; P(j-1)·V(j-1) may still run
                if k == 0 or j == steps:  # a new tile: keep the last one's l, restart the row state
                    T.copy(l, l_done)
                    T.fill(l, 0)
                    T.fill(m, -T.infinity(lesson.ACCUM))
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.wait_wgmma(0)
                # Q_s, K_s, V_s are in use until the wait: a read after it keeps their refills behind it
                touch[0] = Q_s[0, 0] + K_s[0, 0] + V_s[0, 0]
                if (k == 0 and j > 0) or j == steps:  # the last tile's O is complete
                    finish(O, O_s, acc_o, l_done, pbx, pby, pbz)
                for i, jj in T.Parallel(block_M, dim):
                    acc_o[i, jj] *= rescale[i]  # 0 at a tile's first step: O restarts
                T.copy(scores, probs)

    return flash_attention_persistent_async


BUILDERS = {"persistent": flash_attention_persistent, "persistent_async": flash_attention_persistent_async}
