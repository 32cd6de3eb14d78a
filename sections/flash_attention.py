"""flash_attention: attention that never writes the S×S score matrix.

What you learn: the FlashAttention forward pass in TileLang. A block owns `block_M` query rows of one
(batch, head); their Q tile sits in shared memory while a `T.Pipelined` loop streams K and V tiles of
`block_N` keys through shared memory. Per tile: S = Q·Kᵀ with `T.gemm` into a float32 fragment; the
*online softmax* keeps a running row maximum m and running row sum l, and rescales the output accumulator
by 2^(m_old − m_new) whenever the maximum grows; P = 2^(S·scale − m) is cast to fp16 and P·V accumulates
with a second `T.gemm`. The softmax scale 1/√d and log2(e) are folded into one constant so each score
costs a single FMA and an `exp2`. Memory is O(S·d) instead of O(S²).

Causal attention does half the work twice over: the loop bound is clamped so that tiles entirely above the
diagonal are never loaded, and the mask is applied only to the tiles that straddle the diagonal (a runtime
`if` around the masking loop); every other tile runs the unmasked fast path. Sequence lengths that are not a
multiple of the tile are handled: out-of-range loads read zeros, the last key tile masks its columns
≥ seq_len, and out-of-range rows are never stored.

On Hopper the section goes two steps further. `flash_attention_forward_async` runs FlashAttention-3's
schedule (S = Q·K(k)ᵀ and P(k-1)·V(k-1) in flight together, the softmax in between) inside TileLang's
automatic warp specialization. `flash_attention_forward_ws` writes the warp specialization out by hand: a
producer warp issues TMA loads into a ring of K/V buffers guarded by mbarriers, two consumer warp groups
compute, `setmaxnreg` moves registers from the producer to the consumers, and a persistent grid lets the
producer load the next tile while the consumers finish this one. That is the default on Hopper.

A persistent grid makes the last wave visible: B4 H32 S4096 has 4096 query tiles, 31.03 waves of 132
blocks, so in the last wave 4 blocks work while 128 wait. For full attention the section splits those last
tiles along the keys (`split_tail`): each piece runs the same online softmax over its share of the key tiles,
the pieces after the first publish their (O, m, l) to a workspace and release a flag, and the first piece
merges them — (O, m, l) from disjoint key ranges combine exactly, by rescaling to the larger maximum.

Layout is (batch, seq, heads, dim) — BSHD, what most model code holds — in fp16 with float32 accumulation.
"""

import math

import tilelang
import tilelang.language as T

import tourkit
from tourkit import Section

LOG2E = 1.4426950408889634
# Named barriers for the ping-pong schedule: PINGPONG_BARRIER + 1 and + 2, one per consumer warp group
# (TileLang's own partial syncs use low ids, e.g. 3 for the consumers' epilogue).
PINGPONG_BARRIER = 8
HEAD_DIMS = (64, 128)
# split_tail: a tail tile is cut into pieces of at least this many key tiles (fewer would spend more on the
# merge than they save), and the fixup's named barrier (TileLang's own partial syncs use low ids, e.g. 3).
MIN_KEY_TILES_PER_PIECE = 2
SPLIT_BARRIER = 10


class TailSplit:
    """How `flash_attention_forward_ws(split_tail=True)` shares the last partial wave of a persistent grid.

    Every block first walks its `whole` = n_work // grid whole tiles (tiles block_id + s·grid). The R =
    n_work % grid tail tiles t = whole·grid + r are cut along the keys into P pieces each; block b < R·P
    takes piece p = b % P of tail tile r = b // P, key tiles [p·n_key // P, (p+1)·n_key // P). Piece 0's
    block (the finisher) merges the other pieces' partial results (contributors) and stores O. P = 1 (R = 0,
    too few key tiles or too few idle blocks) means no split: the kernel is the plain persistent one."""

    def __init__(self, n_work: int, grid: int, n_key_tiles: int):
        if n_work < 1 or grid < 1 or n_key_tiles < 1:
            raise ValueError(f"tail_split_plan: n_work={n_work}, grid={grid}, n_key_tiles={n_key_tiles} must be "
                             f"positive")
        self.n_work, self.grid, self.n_key_tiles = n_work, grid, n_key_tiles
        self.whole = n_work // grid
        self.tail_tiles = n_work % grid
        if self.tail_tiles == 0:
            self.pieces = 1
        else:
            self.pieces = min(grid // self.tail_tiles, max(1, n_key_tiles // MIN_KEY_TILES_PER_PIECE))

    @property
    def split(self) -> bool:
        return self.tail_tiles > 0 and self.pieces > 1

    @property
    def busy_blocks(self) -> int:
        """Blocks with a piece of the tail (R·P <= grid)."""
        return self.tail_tiles * self.pieces

    def key_range(self, piece):
        """Key tiles [k0, k1) of a piece (an int, or a TIR expression in the kernel)."""
        return piece * self.n_key_tiles // self.pieces, (piece + 1) * self.n_key_tiles // self.pieces

    def piece_of(self, block: int):
        """(tail tile number, piece, k0, k1) of a block's tail work, or None (blocks >= R·P, or no split)."""
        if not self.split or block >= self.busy_blocks:
            return None
        r, p = divmod(block, self.pieces)
        return (self.whole * self.grid + r, p, *self.key_range(p))

    def finisher(self, block: int) -> int:
        """The block that merges this block's piece: piece 0 of the same tail tile."""
        return block - block % self.pieces

    def __repr__(self):
        return (f"TailSplit(n_work={self.n_work}, grid={self.grid}, n_key_tiles={self.n_key_tiles}: whole={self.whole}, "
                f"R={self.tail_tiles}, P={self.pieces})")


def tail_split_plan(n_work: int, grid: int, n_key_tiles: int) -> TailSplit:
    """The split of the last partial wave (TailSplit): one formula for the kernel builder and the tests."""
    return TailSplit(n_work, grid, n_key_tiles)


# ---------------------------------------------------------------------------------------------------------
# Kernel builder
# ---------------------------------------------------------------------------------------------------------


def _check_shape(seq_len: int, dim: int) -> None:
    if dim not in HEAD_DIMS:
        raise ValueError(f"flash_attention: head dim {dim} is not supported (use one of {HEAD_DIMS})")
    if seq_len < 1:
        raise ValueError(f"flash_attention: seq_len must be positive, got {seq_len}")


def _buffers(block_M: int, block_N: int, dim: int, dtype: str, accum: str):
    """Everything one block holds: Q, K, V and O tiles in shared memory; scores, probabilities, the output
    accumulator and the per-row softmax state in registers (fragments)."""
    return (T.alloc_shared((block_M, dim), dtype), T.alloc_shared((block_N, dim), dtype),
            T.alloc_shared((block_N, dim), dtype), T.alloc_shared((block_M, dim), dtype),
            T.alloc_fragment((block_M, block_N), accum), T.alloc_fragment((block_M, block_N), dtype),
            T.alloc_fragment((block_M, dim), accum),
            # m: running row max (of raw scores); rescale: 2^((m_prev - m)·scale); l: running row sum
            T.alloc_fragment((block_M,), accum), T.alloc_fragment((block_M,), accum),
            T.alloc_fragment((block_M,), accum), T.alloc_fragment((block_M,), accum),
            T.alloc_fragment((block_M,), accum))


def _online_softmax(block_M: int, block_N: int, seq_len: int, scale: float, causal: bool, mask_tail: bool,
                    accum: str):
    """The macro both kernels run on each tile of scores: mask only where needed, m = max(m_prev, row max),
    rescale = 2^((m_prev - m)·scale), scores <- 2^(scores·scale - m·scale), l = l·rescale + row sum."""

    @T.macro
    def online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l):
        if causal:
            # Only a tile whose last key lies beyond this block's first query straddles the diagonal.
            if (k + 1) * block_N > bx * block_M + 1:
                for i, j in T.Parallel(block_M, block_N):
                    scores[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, scores[i, j],
                                                  -T.infinity(accum))
        elif mask_tail:
            if (k + 1) * block_N > seq_len:  # the last tile: keys past the end read as zeros
                for i, j in T.Parallel(block_M, block_N):
                    scores[i, j] = T.if_then_else(k * block_N + j < seq_len, scores[i, j], -T.infinity(accum))
        T.copy(m, m_prev)
        T.reduce_max(scores, m, dim=1, clear=False)  # m = max(m_prev, this tile's row max)
        for i in T.Parallel(block_M):
            rescale[i] = T.exp2((m_prev[i] - m[i]) * scale)
        for i, j in T.Parallel(block_M, block_N):
            scores[i, j] = T.exp2(scores[i, j] * scale - m[i] * scale)
        T.reduce_sum(scores, row_sum, dim=1)
        for i in T.Parallel(block_M):
            l[i] = l[i] * rescale[i] + row_sum[i]

    return online_softmax


def _start_and_finish(block_M: int, dim: int, accum: str):
    """The two macros around the loop: load the Q tile and reset the state; normalize O by l and store it."""

    @T.macro
    def start(Q, Q_s, acc_o, l, m, bx, by, bz):
        T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s)
        T.fill(acc_o, 0)
        T.fill(l, 0)
        T.fill(m, -T.infinity(accum))

    @T.macro
    def finish(O, O_s, acc_o, l, bx, by, bz):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] /= l[i]
        T.copy(acc_o, O_s)
        T.copy(O_s, O[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return start, finish


def flash_attention_forward(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *, block_M: int = 128,
                            block_N: int = 128, num_stages: int = 2, threads: int = 256, overlap: bool = False,
                            heavy_first: bool = False, dtype: str = "float16"):
    """Build the forward kernel for one problem shape and one tile configuration.

    overlap=False: the compiler infers the software pipeline from `num_stages` (K/V loads run ahead).
    overlap=True: a manual schedule (`order`/`stage` on T.Pipelined) issues tile k's Q·Kᵀ before tile k-1's
    P·V, so the tensor cores work on one tile while the softmax of the other runs on the CUDA cores.
    heavy_first=True (causal): launch the last query blocks, which have the most key tiles, first, so the
    short ones fill the tail of the grid.
    """
    _check_shape(seq_len, dim)
    shape = (batch, seq_len, heads, dim)
    scale = LOG2E / math.sqrt(dim)  # softmax(x/√d) via exp2: one FMA per score
    n_tiles = -(-seq_len // block_N)
    ragged = seq_len % block_N != 0
    accum = "float32"
    n_query_blocks = -(-seq_len // block_M)
    online_softmax = _online_softmax(block_M, block_N, seq_len, scale, causal, ragged, accum)
    start, finish = _start_and_finish(block_M, dim, accum)

    @T.prim_func
    def flash_attention_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                            O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = _buffers(
                block_M, block_N, dim, dtype, accum)

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            # Causal: key tiles that start after this block's last query row are all masked: never visit them.
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            for k in T.Pipelined(last, **pipeline_schedule(num_stages, overlap, causal or ragged)):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s)
                T.gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.copy(scores, probs)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_s)
                T.gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
            finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_fwd


def pipeline_schedule(num_stages: int, overlap: bool, masked: bool) -> dict:
    """Arguments for T.Pipelined. The loop body's scheduled statements, in source order, are:
    copy K, gemm QK, [mask], copy m, reduce_max, rescale, exp2, reduce_sum, l update, cast, scale acc_o,
    copy V, gemm PV. The overlap schedule puts the K copy, QK and the softmax in stage 0 and acc_o's rescale,
    PV in stage 1 (the V copy runs in stage 0 with K), and emits QK(k) before PV(k-1) and softmax(k)."""
    if not overlap:
        return {"num_stages": num_stages}
    softmax = 8 if masked else 7  # [mask] + copy m .. cast
    #        copy K, gemm QK, softmax..., scale acc_o, copy V, gemm PV
    stage = [0, 0] + [0] * softmax + [1, 0, 1]
    order = [0, 2] + [5 + n for n in range(softmax)] + [3, 1, 4]
    return {"stage": stage, "order": order}


def flash_attention_forward_async(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *,
                                  block_M: int = 128, block_N: int = 128, num_stages: int = 2, threads: int = 256,
                                  heavy_first: bool = False, pingpong: bool = False, dtype: str = "float16"):
    """Hopper variant (the FlashAttention-3 schedule): tensor cores and CUDA cores work at the same time.

    `T.wgmma_gemm` issues a warpgroup MMA and does not wait; `T.wait_wgmma(n)` waits until at most n are in
    flight. Iteration k issues S = Q·K(k)ᵀ and then O += P(k-1)·V(k-1), waits for the first only, runs the
    online softmax of tile k on S while P(k-1)·V(k-1) is still running, then waits for it, rescales O and
    converts S into the next P.

    pingpong=True adds FA3's other overlap, between the two consumer warp groups (64 query rows each): two
    named barriers make them take turns issuing their MMAs, so that one group's softmax runs while the other
    group's MMAs occupy the tensor cores instead of both groups computing softmax at the same moment.
    """
    _check_shape(seq_len, dim)
    if pingpong and threads != 256:
        raise ValueError("flash_attention: pingpong needs exactly two consumer warp groups (threads=256)")
    shape = (batch, seq_len, heads, dim)
    scale = LOG2E / math.sqrt(dim)
    n_tiles = -(-seq_len // block_N)
    accum = "float32"
    n_query_blocks = -(-seq_len // block_M)
    # mask_tail always: the ragged last tile, and the extra all-masked iteration k = n_tiles below
    online_softmax = _online_softmax(block_M, block_N, seq_len, scale, causal, True, accum)
    start, finish = _start_and_finish(block_M, dim, accum)

    @T.prim_func
    def flash_attention_fwd_async(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                                  O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = _buffers(
                block_M, block_N, dim, dtype, accum)
            touch = T.alloc_local((1,), dtype)
            warp_group = T.alloc_local((1,), "int32")

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            T.fill(probs, 0)
            # Iteration k: S(k) = Q·K(k)ᵀ and O += P(k-1)·V(k-1) in flight together, the softmax of S(k) as soon
            # as S(k) is done. One extra iteration finishes the last P·V; it is branch-free (ptxas serializes
            # the asynchronous MMAs when it cannot prove which wait retires which MMA): at k = 0, P = 0 meets
            # V(-1) (zeros), and at k = last every score is masked, which leaves m and l unchanged.
            if pingpong:
                # Warp group 0 is TileLang's TMA producer; the consumers are 1 and 2. Group 2 lets 1 go first.
                warp_group[0] = T.get_warp_group_idx()
                if warp_group[0] == 2:
                    T.named_barrier_arrive(PINGPONG_BARRIER + 1, 256)
            for k in T.Pipelined(last + 1, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s)
                T.copy(V[bz, (k - 1) * block_N:k * block_N, by, :], V_s)
                if pingpong:
                    # Wait for my turn to issue. (Reading the local warp_group keeps this statement with the
                    # consumers: TileLang would move a bare barrier into the producer's loop.)
                    T.sync_threads(PINGPONG_BARRIER + warp_group[0], 256)
                T.wgmma_gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.wgmma_gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                if pingpong:
                    T.named_barrier_arrive(PINGPONG_BARRIER + 3 - warp_group[0], 256)  # the other group's turn
                T.wait_wgmma(1)  # S(k) is ready; P(k-1)·V(k-1) may still run
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.wait_wgmma(0)
                # A read of K_s and V_s after the wait: the producer may refill a buffer only after its last
                # use, and the asynchronous MMAs use them until the wait (not just until they are issued).
                touch[0] = K_s[0, 0] + V_s[0, 0]
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(scores, probs)
            finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_fwd_async


def flash_attention_forward_ws(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *, block_M: int = 128,
                               block_N: int = 128, num_stages: int = 2, heavy_first: bool = False,
                               persistent: bool = False, sms: int = 132, stage_output: bool = False,
                               q_stages: int = 1, split_tail: bool = False, dtype: str = "float16"):
    """Hopper, warp specialization written by hand: the FA3 schedule without the extra iteration.

    `flash_attention_forward_async` leaves the split into a TMA producer and MMA consumers to TileLang, and
    TileLang's pipeline wants one loop body, so that kernel runs one extra iteration on zeros. Here the
    roles are explicit. One producer warp issues TMA loads into a ring of `num_stages` K and V buffers; two
    consumer warp groups (64 query rows each) compute. Each buffer has a *full* mbarrier (the producer's
    32 lanes arrive, the TMA adds its bytes) and an *empty* one (the 256 consumer threads arrive when their
    MMAs no longer read it). A buffer's n-th use waits for phase parity n & 1; a fresh barrier counts as
    having completed the phase before the first, hence the producer's `^ 1`. The consumers peel the
    schedule: Q·K(0)ᵀ alone, then for k ≥ 1 S(k) = Q·K(k)ᵀ and O += P(k-1)·V(k-1) in flight together, and
    P(last)·V(last) alone at the end. `setmaxnreg` gives the consumers 240 registers and the producer 24.

    persistent=True launches one block per SM; each walks the (query block, head, batch) tiles with stride
    `sms` (causal: pairs of tiles whose work adds up to the same), and the producer runs into the next tile's
    Q, K and V while the consumers finish the last P·V and store O. The same code runs one tile per block
    when persistent=False.

    stage_output=True writes O into the tile's Q buffer (free once its last Q·Kᵀ is done) and lets one
    thread store it with TMA, instead of 256 threads storing 4-byte pieces straight from registers; the Q
    buffer is then released after the store has read it. With q_stages=2 the producer loads the next tile's
    Q into the other buffer meanwhile.

    split_tail=True (persistent, full attention): the last partial wave's tiles are cut along the keys into
    pieces for the blocks that would idle (TailSplit: B4 H32 S4096, 160-wide key tiles: 4096 tiles are 31
    waves of 132 and 4 tiles, which become 52 pieces of 2 key tiles instead of 4 blocks with 26). A piece
    runs the same peeled schedule over its key tiles [k0, k1). A contributor (piece > 0) writes its
    unnormalized acc_o and its rows' m and l to Workspace_O[block] and Workspace_ML[block] with plain stores,
    fences, meets the other consumers at a named barrier, and one thread sets Flags[block] with release
    semantics; the finisher (piece 0) then spins on each contributor's flag (acquire), resets it, meets the
    consumers at the barrier, fences and merges: M = max(m, m_d), acc_o = acc_o·2^((m-M)·scale) +
    O_d·2^((m_d-M)·scale), likewise l. No wait cycle: contributors never wait, and all blocks are resident
    at once (one per SM, grid <= SMs). The kernel then also takes Workspace_O (grid, block_M, dim) fp32,
    Workspace_ML (grid, 2, block_M) fp32 and Flags (grid,) int32, flags zeroed once by the caller; it leaves
    them at zero. Without a tail to split (P = 1) the body is the plain persistent kernel's.
    """
    _check_shape(seq_len, dim)
    shape = (batch, seq_len, heads, dim)
    scale = LOG2E / math.sqrt(dim)
    accum = "float32"
    n_tiles = -(-seq_len // block_N)
    n_query_blocks = -(-seq_len // block_M)
    # Causal work per query block grows with its index. A persistent block walks the tiles with a fixed
    # stride, so causal tiles go in pairs of equal total work: query blocks p and n-1-p of one head.
    paired = persistent and causal and n_query_blocks % 2 == 0
    tiles_per_item = 2 if paired else 1
    n_work = n_query_blocks * heads * batch // tiles_per_item
    grid = min(sms, n_work) if persistent else n_work
    consumers = 256  # two warp groups; the producer is the first warp of the third
    if split_tail and (causal or not persistent):
        raise ValueError("flash_attention: split_tail needs persistent=True and full (non-causal) attention")
    plan = tail_split_plan(n_work, grid, n_tiles) if split_tail else None
    split = plan is not None and plan.split
    online_softmax = _online_softmax(block_M, block_N, seq_len, scale, causal, seq_len % block_N != 0, accum)

    def tile_coordinates(block_id, step):
        """The step-th tile of this block. Query-block index fastest, so that the blocks running together share
        one head's K and V in L2."""
        work = block_id + (step // tiles_per_item) * grid
        if paired:
            pair = work % (n_query_blocks // 2)
            bx = T.if_then_else(step % 2 == 0, n_query_blocks - 1 - pair, pair)
            head_batch = work // (n_query_blocks // 2)
        else:
            q_block = work % n_query_blocks
            bx = n_query_blocks - 1 - q_block if heavy_first else q_block
            head_batch = work // n_query_blocks
        return bx, head_batch % heads, head_batch // heads

    def key_tiles(bx):
        return T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles

    @T.macro
    def produce(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id):
        for step in T.serial(plan.whole if split else T.ceildiv(n_work - block_id, grid) * tiles_per_item):
            bx, by, bz = tile_coordinates(block_id, step)
            q = step % q_stages
            T.mbarrier_wait_parity(q_empty[q], ((step // q_stages) & 1) ^ 1)
            T.tma_copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s[q, :, :], barrier=q_full[q])
            T.mbarrier_arrive(q_full[q])
            for k in T.serial(key_tiles(bx)):
                use = loads[0] + k  # the ring counts uses across tiles: its phases carry on
                T.mbarrier_wait_parity(k_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
                T.tma_copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s[use % num_stages, :, :],
                           barrier=k_full[use % num_stages])
                T.mbarrier_arrive(k_full[use % num_stages])
                T.mbarrier_wait_parity(v_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
                T.tma_copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_s[use % num_stages, :, :],
                           barrier=v_full[use % num_stages])
                T.mbarrier_arrive(v_full[use % num_stages])
            loads[0] = loads[0] + key_tiles(bx)

    @T.macro
    def consume(O, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id, scores,
                probs, acc_o, out, m, m_prev, rescale, row_sum, l):
        for step in T.serial(plan.whole if split else T.ceildiv(n_work - block_id, grid) * tiles_per_item):
            bx, by, bz = tile_coordinates(block_id, step)
            first = loads[0]
            final = first + key_tiles(bx) - 1
            T.fill(acc_o, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(accum))
            q = step % q_stages
            T.mbarrier_wait_parity(q_full[q], (step // q_stages) & 1)
            # Key tile 0: S = Q·K(0)ᵀ only.
            T.mbarrier_wait_parity(k_full[first % num_stages], (first // num_stages) & 1)
            T.wgmma_gemm(Q_s[q, :, :], K_s[first % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                         policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(0)
            T.mbarrier_arrive(k_empty[first % num_stages])
            online_softmax(scores, 0, bx, m, m_prev, rescale, row_sum, l)
            T.copy(scores, probs)
            # Key tiles 1..: S(k) and P(k-1)·V(k-1) together; the softmax of S(k) while P·V still runs.
            for k in T.serial(1, key_tiles(bx)):
                use = first + k
                T.mbarrier_wait_parity(k_full[use % num_stages], (use // num_stages) & 1)
                T.wgmma_gemm(Q_s[q, :, :], K_s[use % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                             policy=T.GemmWarpPolicy.FullRow)
                T.mbarrier_wait_parity(v_full[(use - 1) % num_stages], ((use - 1) // num_stages) & 1)
                T.wgmma_gemm(probs, V_s[(use - 1) % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                T.wait_wgmma(1)  # S(k) is done: K(k) may be refilled
                T.mbarrier_arrive(k_empty[use % num_stages])
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.wait_wgmma(0)
                T.mbarrier_arrive(v_empty[(use - 1) % num_stages])
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(scores, probs)
            if not stage_output:
                T.mbarrier_arrive(q_empty[q])  # the last Q·Kᵀ is done: the producer may load the next tile's Q
            # The last P·V alone, then O = acc_o / l.
            T.mbarrier_wait_parity(v_full[final % num_stages], (final // num_stages) & 1)
            T.wgmma_gemm(probs, V_s[final % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(0)
            T.mbarrier_arrive(v_empty[final % num_stages])
            loads[0] = final + 1
            for i, j in T.Parallel(block_M, dim):
                out[i, j] = acc_o[i, j] / l[i]
            if stage_output:
                T.copy(out, Q_s[q, :, :])
                T.copy(Q_s[q, :, :], O[bz, bx * block_M:(bx + 1) * block_M, by, :])  # TMA, waited by its thread
                T.mbarrier_arrive(q_empty[q])
            else:
                T.copy(out, O[bz, bx * block_M:(bx + 1) * block_M, by, :])

    def tail_piece(block_id):
        """A tail block's piece: its tile's coordinates, the piece number and its key tiles [k0, k1)."""
        piece = block_id % plan.pieces
        bx, by, bz = tile_coordinates(block_id // plan.pieces, plan.whole)  # tile whole·grid + r
        k0, k1 = plan.key_range(piece)
        return bx, by, bz, piece, k0, k1

    @T.macro
    def produce_piece(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id):
        """split_tail: after the whole tiles, the Q tile of this block's tail tile and the K/V tiles of its
        piece, the ring's use counter carrying on as for a whole tile."""
        if block_id < plan.busy_blocks:
            bx, by, bz, piece, k0, k1 = tail_piece(block_id)
            q = plan.whole % q_stages
            T.mbarrier_wait_parity(q_empty[q], ((plan.whole // q_stages) & 1) ^ 1)
            T.tma_copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s[q, :, :], barrier=q_full[q])
            T.mbarrier_arrive(q_full[q])
            for i in T.serial(k1 - k0):
                use = loads[0] + i
                k = k0 + i
                T.mbarrier_wait_parity(k_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
                T.tma_copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s[use % num_stages, :, :],
                           barrier=k_full[use % num_stages])
                T.mbarrier_arrive(k_full[use % num_stages])
                T.mbarrier_wait_parity(v_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
                T.tma_copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_s[use % num_stages, :, :],
                           barrier=v_full[use % num_stages])
                T.mbarrier_arrive(v_full[use % num_stages])
            loads[0] = loads[0] + (k1 - k0)

    def finite(x):
        """x, or 0 where x is -inf: 2^((m - M)·scale) must be 0, not NaN, for a row that saw no key at all."""
        return T.if_then_else(x == -T.infinity(accum), T.float32(0), x)

    @T.macro
    def consume_piece(O, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id, scores,
                      probs, acc_o, out, m, m_prev, rescale, row_sum, l, merge_scale, Workspace_O, Workspace_ML,
                      Flags, thread):
        """split_tail: the peeled schedule over the piece's key tiles [k0, k1) (the softmax gets absolute key
        tile numbers: the ragged last tile is masked by its number), then publish (piece > 0) or merge the
        tile's other pieces and store O (piece 0)."""
        if block_id < plan.busy_blocks:
            bx, by, bz, piece, k0, k1 = tail_piece(block_id)
            first = loads[0]
            final = first + (k1 - k0) - 1
            T.fill(acc_o, 0)
            T.fill(l, 0)
            T.fill(m, -T.infinity(accum))
            q = plan.whole % q_stages
            T.mbarrier_wait_parity(q_full[q], (plan.whole // q_stages) & 1)
            # Key tile k0: S = Q·K(k0)ᵀ only.
            T.mbarrier_wait_parity(k_full[first % num_stages], (first // num_stages) & 1)
            T.wgmma_gemm(Q_s[q, :, :], K_s[first % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                         policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(0)
            T.mbarrier_arrive(k_empty[first % num_stages])
            online_softmax(scores, k0, bx, m, m_prev, rescale, row_sum, l)
            T.copy(scores, probs)
            for i in T.serial(1, k1 - k0):
                use = first + i
                T.mbarrier_wait_parity(k_full[use % num_stages], (use // num_stages) & 1)
                T.wgmma_gemm(Q_s[q, :, :], K_s[use % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                             policy=T.GemmWarpPolicy.FullRow)
                T.mbarrier_wait_parity(v_full[(use - 1) % num_stages], ((use - 1) // num_stages) & 1)
                T.wgmma_gemm(probs, V_s[(use - 1) % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                T.wait_wgmma(1)
                T.mbarrier_arrive(k_empty[use % num_stages])
                online_softmax(scores, k0 + i, bx, m, m_prev, rescale, row_sum, l)
                T.wait_wgmma(0)
                T.mbarrier_arrive(v_empty[(use - 1) % num_stages])
                for i2, j in T.Parallel(block_M, dim):
                    acc_o[i2, j] *= rescale[i2]
                T.copy(scores, probs)
            if not stage_output:
                T.mbarrier_arrive(q_empty[q])
            T.mbarrier_wait_parity(v_full[final % num_stages], (final // num_stages) & 1)
            T.wgmma_gemm(probs, V_s[final % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(0)
            T.mbarrier_arrive(v_empty[final % num_stages])
            loads[0] = final + 1
            if piece > 0:
                # Contributor: the unnormalized acc_o and the rows' m and l, then the flag (released).
                if stage_output:
                    T.mbarrier_arrive(q_empty[q])  # no O to stage: the Q buffer is free
                T.copy(acc_o, Workspace_O[block_id, :, :])
                for i in T.Parallel(block_M):
                    Workspace_ML[block_id, 0, i] = m[i]
                    Workspace_ML[block_id, 1, i] = l[i]
                T.call_extern("handle", "__threadfence")  # this thread's stores, device-wide, before the barrier
                T.sync_threads(SPLIT_BARRIER, consumers)
                if thread == 0:
                    T.atomic_store(Flags[block_id], 1, memory_order="release")
            else:
                # Finisher: merge the tile's other pieces (blocks block_id + 1 .., in order: deterministic).
                for d in T.serial(block_id + 1, block_id + plan.pieces):
                    if thread == 0:
                        while T.atomic_load(Flags[d], memory_order="acquire") == 0:
                            pass
                        # d publishes once a launch: reset at once, for the next launch
                        T.atomic_store(Flags[d], 0, memory_order="relaxed")
                    T.sync_threads(SPLIT_BARRIER, consumers)
                    T.call_extern("handle", "__threadfence")  # no read below may see memory from before the flag
                    for i in T.Parallel(block_M):
                        m_prev[i] = T.max(m[i], Workspace_ML[d, 0, i])  # the merged running max M
                    for i in T.Parallel(block_M):
                        rescale[i] = T.exp2((m[i] - finite(m_prev[i])) * scale)
                        merge_scale[i] = T.exp2((Workspace_ML[d, 0, i] - finite(m_prev[i])) * scale)
                    for i in T.Parallel(block_M):
                        l[i] = l[i] * rescale[i] + Workspace_ML[d, 1, i] * merge_scale[i]
                        m[i] = m_prev[i]
                    for i, j in T.Parallel(block_M, dim):
                        acc_o[i, j] = acc_o[i, j] * rescale[i] + Workspace_O[d, i, j] * merge_scale[i]
                for i, j in T.Parallel(block_M, dim):
                    out[i, j] = acc_o[i, j] / l[i]
                if stage_output:
                    T.copy(out, Q_s[q, :, :])
                    T.copy(Q_s[q, :, :], O[bz, bx * block_M:(bx + 1) * block_M, by, :])
                    T.mbarrier_arrive(q_empty[q])
                else:
                    T.copy(out, O[bz, bx * block_M:(bx + 1) * block_M, by, :])

    @T.prim_func
    def flash_attention_fwd_ws(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                               O: T.Tensor(shape, dtype)):
        with T.Kernel(grid, threads=consumers + 128) as block_id:
            Q_s = T.alloc_shared((q_stages, block_M, dim), dtype)
            K_s = T.alloc_shared((num_stages, block_N, dim), dtype)
            V_s = T.alloc_shared((num_stages, block_N, dim), dtype)
            scores = T.alloc_fragment((block_M, block_N), accum)
            probs = T.alloc_fragment((block_M, block_N), dtype)
            acc_o = T.alloc_fragment((block_M, dim), accum)
            out = T.alloc_fragment((block_M, dim), dtype)
            m, m_prev, rescale, row_sum, l = (T.alloc_fragment((block_M,), accum) for _ in range(5))
            q_full, q_empty = T.alloc_barrier([32] * q_stages), T.alloc_barrier([consumers] * q_stages)
            k_full, v_full = T.alloc_barrier([32] * num_stages), T.alloc_barrier([32] * num_stages)
            k_empty = T.alloc_barrier([consumers] * num_stages)
            v_empty = T.alloc_barrier([consumers] * num_stages)
            loads = T.alloc_local((1,), "int32")  # K/V tiles loaded (or consumed) so far, per role
            loads[0] = 0
            thread = T.get_thread_binding()
            if thread >= consumers:
                T.set_max_nreg(24, 0)  # the whole producer warp group gives registers back
                if thread < consumers + 32:
                    produce(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads,
                            block_id)
            else:
                T.set_max_nreg(240, 1)
                consume(O, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id,
                        scores, probs, acc_o, out, m, m_prev, rescale, row_sum, l)

    if not split_tail:
        return flash_attention_fwd_ws

    @T.prim_func
    def flash_attention_fwd_ws_split(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype),
                                     V: T.Tensor(shape, dtype), O: T.Tensor(shape, dtype),
                                     Workspace_O: T.Tensor((grid, block_M, dim), accum),
                                     Workspace_ML: T.Tensor((grid, 2, block_M), accum),
                                     Flags: T.Tensor((grid,), "int32")):
        with T.Kernel(grid, threads=consumers + 128) as block_id:
            Q_s = T.alloc_shared((q_stages, block_M, dim), dtype)
            K_s = T.alloc_shared((num_stages, block_N, dim), dtype)
            V_s = T.alloc_shared((num_stages, block_N, dim), dtype)
            scores = T.alloc_fragment((block_M, block_N), accum)
            probs = T.alloc_fragment((block_M, block_N), dtype)
            acc_o = T.alloc_fragment((block_M, dim), accum)
            out = T.alloc_fragment((block_M, dim), dtype)
            m, m_prev, rescale, row_sum, l = (T.alloc_fragment((block_M,), accum) for _ in range(5))
            merge_scale = T.alloc_fragment((block_M,), accum)
            q_full, q_empty = T.alloc_barrier([32] * q_stages), T.alloc_barrier([consumers] * q_stages)
            k_full, v_full = T.alloc_barrier([32] * num_stages), T.alloc_barrier([32] * num_stages)
            k_empty = T.alloc_barrier([consumers] * num_stages)
            v_empty = T.alloc_barrier([consumers] * num_stages)
            loads = T.alloc_local((1,), "int32")
            loads[0] = 0
            thread = T.get_thread_binding()
            if thread >= consumers:
                T.set_max_nreg(24, 0)
                if thread < consumers + 32:
                    produce(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads,
                            block_id)
                    if split:
                        produce_piece(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty,
                                      loads, block_id)
            else:
                T.set_max_nreg(240, 1)
                consume(O, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, block_id,
                        scores, probs, acc_o, out, m, m_prev, rescale, row_sum, l)
                if split:
                    consume_piece(O, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads,
                                  block_id, scores, probs, acc_o, out, m, m_prev, rescale, row_sum, l, merge_scale,
                                  Workspace_O, Workspace_ML, Flags, thread)

    return flash_attention_fwd_ws_split


# ---------------------------------------------------------------------------------------------------------
# Choosing a configuration for the GPU
# ---------------------------------------------------------------------------------------------------------

# Chosen with bench/attention_probe.py on the H200 (2026-12-02, this session's probes ws, ws2, ws3), keyed by
# (causal, head dim); ratios to SDPA at S=4096 / 16384, timed in turns:
# * head dim 128, both modes: the hand-written warp-specialized kernel on a persistent grid (one block per SM),
#   two Q buffers, O stored by TMA from the Q buffer, 160-wide key tiles (what fits next to two Q buffers),
#   fast math. Full attention: 1.008x and 0.983x / 1.027x and 1.056x (ws2, ws3); with the last partial wave's
#   tiles split along the keys (split_tail; 4096 tiles are 31.03 waves of 132) 1.012x / 1.073x, where the same
#   kernel without it read 0.996x / 1.036x in turns with it (2026-12-03, --preset split). Causal, tiles walked in
#   pairs of equal work: 1.066x / 1.102x (ws3), 522 TFLOP/s at S=4096 where one tile per block (176-wide,
#   heaviest first) reached 499. TileLang's own warp specialization (`flash_attention_forward_async`)
#   read 0.92-0.95x / 1.01-1.02x full and 0.95-0.99x / 1.03-1.05x causal in the same probes.
# * head dim 64: the TileLang-pipelined (full) and async (causal) kernels, not re-measured this session.
# * Not taken: FA3's ping-pong between the consumer warp groups (an earlier probe: within ±2% for full
#   attention, 0.3-2% slower causal); 192-wide tiles one per block (0.98x / 1.04-1.08x full).
HOPPER_CONFIGS = {
    (False, 128): dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, fast_math=True,
                       persistent=True, q_stages=2, stage_output=True, split_tail=True),
    (False, 64): dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    # heavy_first orders the tiles when the query blocks cannot pair up (an odd count)
    (True, 128): dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, fast_math=True,
                      persistent=True, q_stages=2, stage_output=True, heavy_first=True),
    (True, 64): dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True,
                     heavy_first=True),
}
# Ampere/Ada/Turing: no wgmma; the largest tiles whose shared memory fits the budget.
OTHER_CANDIDATES = [(128, 128, 2), (128, 128, 1), (128, 64, 2), (128, 64, 1), (64, 64, 2), (64, 64, 1)]
SM_COUNT_H100_H200 = 132  # the persistent grid's default when no GPU says otherwise (--compile-only)


def smem_estimate(dim: int, block_M: int, block_N: int, num_stages: int, output_reuses_kv: bool = False) -> int:
    """Bytes of shared memory: the Q tile, `num_stages` K and V tiles and the O tile (fp16). With
    `output_reuses_kv`, O takes the K/V buffers once the loop is done, as TileLang's planner does in the
    warp-specialized Hopper kernels (a test checks it against the lowered kernel); otherwise the sum, an upper
    bound, which is what a filter wants."""
    q_tile, kv_tiles = block_M, 2 * num_stages * block_N
    o_tile = max(0, block_M - kv_tiles) if output_reuses_kv else block_M
    return 2 * dim * (q_tile + kv_tiles + o_tile)


def config_smem(dim: int, cfg: dict) -> int:
    """Shared memory of one configuration: the hand-written kernel keeps `q_stages` Q tiles and the K/V ring
    (O goes out from registers or through a Q tile); TileLang's async kernel puts O into the freed K/V
    buffers; the pipelined kernel's sum is an upper bound."""
    if cfg["kind"] == "ws":
        return 2 * dim * (cfg.get("q_stages", 1) * cfg["block_M"] + 2 * cfg["num_stages"] * cfg["block_N"])
    return smem_estimate(dim, cfg["block_M"], cfg["block_N"], cfg["num_stages"],
                         output_reuses_kv=cfg["kind"] == "async")


def choose_config(dim: int, causal: bool, family: str, smem_budget: int,
                  sm_count: int = SM_COUNT_H100_H200) -> dict:
    if family == "hopper":
        cfg = dict(HOPPER_CONFIGS[(causal, dim)])
        if cfg.get("persistent"):
            cfg["sms"] = sm_count
        if config_smem(dim, cfg) <= smem_budget:
            return cfg
    for block_M, block_N, stages in OTHER_CANDIDATES:
        if causal and stages > 1:
            continue  # tilelang 0.1.15: a cp.async pipeline over the clamped (data-dependent) bound fails codegen
        if smem_estimate(dim, block_M, block_N, stages) <= smem_budget:
            return dict(kind="pipelined", block_M=block_M, block_N=block_N, num_stages=stages,
                        threads=256 if block_M == 128 else 128)
    raise ValueError(f"flash_attention: no tile configuration fits {smem_budget} bytes of shared memory "
                     f"for head dim {dim}")


BUILDERS = {"pipelined": flash_attention_forward, "async": flash_attention_forward_async,
            "ws": flash_attention_forward_ws}


def build(batch, heads, seq_len, dim, causal, cfg: dict):
    # The hand-written kernel's thread count is fixed (two consumer warp groups and a producer warp group).
    skip = ("kind", "fast_math", "threads") if cfg["kind"] == "ws" else ("kind", "fast_math")
    kwargs = {k: v for k, v in cfg.items() if k not in skip}
    return BUILDERS[cfg["kind"]](batch, heads, seq_len, dim, causal, **kwargs)


def pass_configs(cfg: dict) -> dict:
    """fast_math: nvcc --use_fast_math, so exp2f becomes a bare ex2.approx.ftz (no denormal fix-up code)."""
    return {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} if cfg.get("fast_math") else {}


def describe(cfg: dict) -> str:
    schedule = {"ws": "hand-written warp specialization", "async": "FA3 async wgmma",
                "pipelined": "compiler pipeline"}[cfg["kind"]]
    if cfg.get("persistent"):
        schedule += f", persistent ({cfg.get('sms', SM_COUNT_H100_H200)} blocks)"
    if cfg.get("split_tail"):
        schedule += ", last wave split along the keys"
    fast = (", fast math" if cfg.get("fast_math") else "") + (", heaviest blocks first" if cfg.get("heavy_first") else "")
    fast += ", warp groups ping-pong" if cfg.get("pingpong") else ""
    fast += ", O stored by TMA" if cfg.get("stage_output") else ""
    return (f"{cfg['block_M']}x{cfg['block_N']} tiles, {cfg['num_stages']} stages, {cfg['threads']} threads, "
            f"{schedule}{fast}")


def precompile(problems, family: str, smem_budget: int, log=None, sm_count: int = SM_COUNT_H100_H200) -> None:
    """Compile the kernels for (batch, heads, seq_len, dim, causal) problems at once, each with its pass
    configs; compile_attention then finds each in TileLang's kernel cache."""
    jobs = []
    for batch, heads, seq_len, dim, causal in problems:
        cfg = choose_config(dim, causal, family, smem_budget, sm_count)
        jobs.append((build(batch, heads, seq_len, dim, causal, cfg), pass_configs(cfg)))
    tourkit.compile_many(jobs, log=log)


def compile_attention(batch, heads, seq_len, dim, causal, cfg: dict):
    """A callable attention(q, k, v) -> o for fp16 BSHD tensors of exactly this shape."""
    import torch

    func = build(batch, heads, seq_len, dim, causal, cfg)
    kernel = tilelang.compile(func, out_idx=None, target="cuda", pass_configs=pass_configs(cfg))
    # split_tail: the workspace and flags (zeroed once, left at zero by every launch), on the first call
    extra_shapes = [tuple(int(d) for d in func.buffer_map[param].shape) for param in func.params[4:]]
    extra = []

    def attention(q, k, v, o=None):
        if q.shape != (batch, seq_len, heads, dim) or q.dtype != torch.float16:
            raise ValueError(f"flash_attention: expected fp16 (batch, seq, heads, dim) = "
                             f"{(batch, seq_len, heads, dim)}, got {q.dtype} {tuple(q.shape)}")
        o = torch.empty_like(q) if o is None else o
        if extra_shapes and not extra:
            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            if sms < extra_shapes[-1][0]:
                raise RuntimeError(f"flash_attention: split_tail's {extra_shapes[-1][0]} blocks wait for one "
                                   f"another and must all be resident; this GPU has {sms} SMs")
            extra.extend(torch.zeros(shape, dtype=torch.int32 if len(shape) == 1 else torch.float32,
                                     device=q.device) for shape in extra_shapes)
        kernel(q, k, v, o, *extra)
        return o

    attention.extra_tensors = extra  # Workspace_O, Workspace_ML, Flags (split_tail), once allocated

    attention.source = kernel.get_kernel_source()
    return attention


# ---------------------------------------------------------------------------------------------------------
# The reference, the check, the benchmark
# ---------------------------------------------------------------------------------------------------------


def sdpa_bshd(q, k, v, causal: bool):
    """PyTorch's scaled_dot_product_attention on BSHD tensors (it wants BHSD: transpose in and out)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def check_attention(batch, heads, seq_len, dim, causal, attention) -> "tourkit.Check":
    """Our error against a float32 reference must be within 2x of PyTorch's own fp16 error against it."""
    import torch

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    ref = sdpa_bshd(q.float(), k.float(), v.float(), causal)
    torch_error = tourkit.relative_error(sdpa_bshd(q, k, v, causal), ref)
    o = torch.empty_like(q)
    mode = "causal" if causal else "full"
    return tourkit.validate(f"attention B{batch} H{heads} S{seq_len} D{dim} {mode} (torch fp16: "
                            f"{torch_error:.2e})", lambda: attention(q, k, v, o), o, ref, 2.0 * torch_error)


def attention_flops(batch, heads, seq_len, dim, causal) -> float:
    return 4.0 * batch * heads * seq_len * seq_len * dim * (0.5 if causal else 1.0)


def bench_attention(batch, heads, seq_len, dim, causal, attention) -> dict:
    import torch
    import torch.nn.functional as F

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    # SDPA timed on its preferred contiguous BHSD layout: the strongest baseline, whatever backend it picks.
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    times = tourkit.bench_interleaved({"ours": lambda: attention(q, k, v, o),
                                       "sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)})
    ours, theirs = times["ours"], times["sdpa"]
    flops = attention_flops(batch, heads, seq_len, dim, causal)
    return {"ms": ours, "tflops": tourkit.tflops(flops, ours), "sdpa_ms": theirs,
            "sdpa_tflops": tourkit.tflops(flops, theirs)}


def peak_memory(batch, heads, seq_len, dim, attention) -> tuple[int, int]:
    """Peak bytes allocated beyond the inputs: naive attention (S×S scores materialized) vs the kernel."""
    import torch

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(dim))
        probs = torch.softmax(scores, dim=-1)
        del scores
        out = torch.einsum("bhqk,bkhd->bqhd", probs, v)
        del probs, out
        torch.cuda.synchronize()
        naive = torch.cuda.max_memory_allocated() - base
    except torch.cuda.OutOfMemoryError:  # the argument, made by the GPU itself
        naive = -1
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    attention(q, k, v)
    torch.cuda.synchronize()
    flash = torch.cuda.max_memory_allocated() - base
    return naive, flash


# ---------------------------------------------------------------------------------------------------------
# The section
# ---------------------------------------------------------------------------------------------------------

BENCH_SHAPES = [(4, 32, 4096, 128)]
FULL_SHAPES = [(4, 32, 4096, 128), (1, 32, 16384, 128)]
QUICK_SHAPES = [(2, 16, 2048, 128)]
ODD_SHAPES = [(2, 4, 1000, 64, True), (2, 4, 1000, 64, False), (1, 3, 777, 128, True)]


def show_generated(ctx, source: str) -> None:
    """Where the two GEMMs meet: on Hopper the asynchronous wgmma waits, elsewhere the mma.sync loop."""
    for pattern, what in ((r"wait_wgmma<1>", "the FA3 schedule: wait for Q·Kᵀ only, P·V still in flight"),
                          (r"wgmma_rs", "P·V with P read from registers (wgmma_rs)"),
                          (r"mma_sync|mma\.sync", "warp-level tensor-core MMA")):
        excerpt = tourkit.source_excerpt(source, pattern, context=4, limit=10)
        if excerpt:
            ctx.log("")
            ctx.log(f"generated CUDA, {what}:")
            ctx.log(tourkit.indent(excerpt, "  "))
            return


def run_compile_only(ctx) -> None:
    family = tourkit.ARCH_SPECS[ctx.arch].family
    jobs, asked = [], {}
    for batch, heads, seq_len, dim, causal in [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True),
                                                (2, 4, 1000, 64, True)]:
        cfg = choose_config(dim, causal, family, ctx.smem_budget)
        name = f"attention S{seq_len} D{dim} {'causal' if causal else 'full'} {cfg['kind']}"
        ctx.log(f"{name}: {describe(cfg)}")
        jobs.append((name, build(batch, heads, seq_len, dim, causal, cfg), ctx.arch, pass_configs(cfg)))
        asked[name] = cfg["threads"]
    reports = tourkit.inspect_kernels(jobs)
    tourkit.report_kernels(ctx, reports, asked)
    show_generated(ctx, reports[1].source)
    for rep in reports:
        tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS[family])
    ctx.headline(kernels=len(reports), arch=ctx.arch)


def problems(ctx) -> tuple[list, list]:
    """The benchmarked shapes and the odd (correctness-only) problems of this run."""
    shapes = QUICK_SHAPES if ctx.quick else (FULL_SHAPES if ctx.full else BENCH_SHAPES)
    return shapes, (ODD_SHAPES[:1] if ctx.quick else ODD_SHAPES)


def prepare(ctx, log=None) -> None:
    """Every kernel run() launches, compiled at once (compile_attention then finds each in the cache)."""
    shapes, odd_shapes = problems(ctx)
    precompile([(*shape, causal) for shape in shapes for causal in (False, True)] + list(odd_shapes),
               ctx.device.family, ctx.smem_budget, log=log, sm_count=ctx.device.sm_count)


def run(ctx) -> None:
    if ctx.compile_only:
        run_compile_only(ctx)
        return
    family = ctx.device.family
    shapes, odd_shapes = problems(ctx)
    prepare(ctx, log=ctx.log)
    checks, rows, ratios = [], [], {}
    kernels = {}
    for batch, heads, seq_len, dim in shapes:
        for causal in (False, True):
            cfg = choose_config(dim, causal, family, ctx.smem_budget, ctx.device.sm_count)
            attention = compile_attention(batch, heads, seq_len, dim, causal, cfg)
            kernels[(batch, heads, seq_len, dim, causal)] = attention
            check = check_attention(batch, heads, seq_len, dim, causal, attention)
            checks.append(check)
            ctx.log(check.line())
            if not check.passed:
                continue
            r = bench_attention(batch, heads, seq_len, dim, causal, attention)
            mode = "causal" if causal else "full"
            ratio = tourkit.speedup(r["sdpa_ms"], r["ms"])
            ratios[f"S{seq_len}_{mode}"] = round(ratio, 3)
            rows.append([f"B{batch} H{heads} S{seq_len} D{dim}", mode, describe(cfg), r["ms"], r["tflops"],
                         r["sdpa_tflops"], f"{ratio:.2f}x"])
            ctx.metric(**{f"S{seq_len}_{mode}_tflops": r["tflops"], f"S{seq_len}_{mode}_sdpa_tflops": r["sdpa_tflops"]})
    for batch, heads, seq_len, dim, causal in odd_shapes:
        cfg = choose_config(dim, causal, family, ctx.smem_budget, ctx.device.sm_count)
        attention = compile_attention(batch, heads, seq_len, dim, causal, cfg)
        check = check_attention(batch, heads, seq_len, dim, causal, attention)
        checks.append(check)
        ctx.log(check.line())
    tourkit.require(checks)
    ctx.log("")
    ctx.table(["shape", "mode", "kernel", "ms", "TFLOP/s", "SDPA TFLOP/s", "vs SDPA"], rows)
    show_generated(ctx, kernels[(*shapes[-1], True)].source)

    # The memory argument: the S×S scores cost O(S²) bytes; the kernel needs nothing beyond its output.
    batch, heads, seq_len, dim = shapes[-1]
    naive, flash = peak_memory(batch, heads, seq_len, dim, kernels[(batch, heads, seq_len, dim, False)])
    ctx.log("")
    naive_text = "ran out of memory" if naive < 0 else tourkit.format_bytes(naive)
    ctx.log(f"peak memory beyond the inputs at B{batch} H{heads} S{seq_len} D{dim}: naive attention "
            f"{naive_text} (scores and probabilities, B·H·S² each), this kernel "
            f"{tourkit.format_bytes(flash)} (the output). Doubling S quadruples the first and doubles the second.")
    ctx.metric(naive_peak_bytes=naive, flash_peak_bytes=flash)
    ctx.headline(**{f"vs_sdpa_{k}": v for k, v in ratios.items()})


SECTION = Section(
    name="flash_attention",
    title="FlashAttention forward: online softmax, causal tiles skipped",
    summary="Q tile in shared memory, pipelined K/V, exp2 online softmax; on Hopper hand-written warp "
            "specialization (TMA producer warp, mbarriers, persistent); vs SDPA.",
    run=run,
    prepare=prepare,
)
