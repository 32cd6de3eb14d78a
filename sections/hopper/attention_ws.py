"""Appendix: FlashAttention forward with its warp specialization written by hand (Hopper, sm_90a).

The lesson (`sections/flash_attention.py`) writes the FA3 schedule with `T.Pipelined`: TileLang splits the
block into a TMA producer and MMA consumers and builds the pipeline. Its loop body is one body for every
iteration, so it runs one extra, fully masked iteration to finish the last P·V. This kernel writes the
roles out by hand, which adds:

* A TMA producer warp. One warp of a third warp group issues every load (`T.tma_copy`): the Q tile, then the
  K and V tiles into a ring of `num_stages` buffers each. The two consumer warp groups (64 query rows each)
  never load; they only compute.
* An mbarrier ring. Each buffer has a *full* barrier (the producer's 32 lanes arrive and the TMA adds its
  bytes) and an *empty* one (the 256 consumer threads arrive once their MMAs no longer read it). The n-th use
  of a buffer waits for phase parity n & 1; a fresh barrier counts as having completed the phase before the
  first, hence the producer's `^ 1`. The ring's use counter (`loads`) carries on from tile to tile.
* Explicit wgmma waits and a peeled schedule: Q·K(0)ᵀ alone; then for k >= 1 S(k) = Q·K(k)ᵀ and
  O += P(k-1)·V(k-1) in flight together, `T.wait_wgmma(1)` retiring only the first so that the softmax of S(k)
  runs while P·V still occupies the tensor cores; the last P·V alone. No extra iteration.
* A register split: `setmaxnreg` gives each consumer thread 240 registers and the producer 24.
* A persistent grid: one block per SM walks the (query block, head, batch) tiles with a fixed stride; the
  producer runs into the next tile's loads while the consumers finish the last P·V. Causal tiles go in pairs
  of equal work (query blocks p and n-1-p), or heaviest first when they cannot pair up.
* O stored by TMA: the normalized tile goes into the tile's Q buffer (free after its last Q·Kᵀ) and one
  thread stores it, instead of 256 threads storing 4-byte pieces; two Q buffers let the producer load the
  next tile's Q meanwhile.
* The last wave split along the keys (`split_tail`, full attention): B4 H32 S4096 has 4096 query tiles, 31
  waves of 132 and 4 tiles, so in the last wave 4 blocks work while 128 wait. Those tiles are cut into pieces
  of key tiles for the idle blocks (TailSplit); each piece runs the same online softmax over its keys, the
  pieces after the first publish their (O, m, l) and release a flag, and the first piece merges them:
  (O, m, l) from disjoint key ranges combine exactly, by rescaling to the larger maximum.

The online softmax itself is the lesson's macro, unchanged, and the problems are the lesson's: any length, fp16
or bf16, grouped-query attention (the producer loads key/value head h // groups for query head h).
"""

import math

import tilelang.language as T

from sections import attention_plans as plans
from sections import flash_attention as lesson

# split_tail: a tail tile is cut into pieces of at least this many key tiles (fewer would spend more on the
# merge than they save), and the merge's named barrier (TileLang's own partial syncs use low ids, e.g. 3).
MIN_KEY_TILES_PER_PIECE = 2
SPLIT_BARRIER = 10
SM_COUNT_H100_H200 = 132  # the persistent grid's default when no GPU says otherwise (--compile-only)

# Keyed by (causal, head dim). Head dim 128: 160-wide key tiles are the widest whose two K/V stages fit next to
# two Q buffers. Head dim 64 (half the bytes per key): 176-wide tiles for full attention, 128-wide ones for causal
# (a finer diagonal), as measured on an H200 against the other widths. Fast math turns exp2f into a bare
# ex2.approx. Full attention splits the last wave along the keys; causal attention pairs its tiles (heaviest
# first where the query blocks cannot pair up: an odd count, or just two).
HOPPER_CONFIGS = {
    (False, 128): dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, fast_math=True,
                       persistent=True, q_stages=2, stage_output=True, split_tail=True),
    (True, 128): dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, fast_math=True,
                      persistent=True, q_stages=2, stage_output=True, heavy_first=True),
    (False, 64): dict(kind="ws", block_M=128, block_N=176, num_stages=2, threads=384, fast_math=True,
                      persistent=True, q_stages=2, stage_output=True, split_tail=True),
    (True, 64): dict(kind="ws", block_M=128, block_N=128, num_stages=2, threads=384, fast_math=True,
                     persistent=True, q_stages=2, stage_output=True, heavy_first=True),
}
# The key-tile widths a problem may take instead of the table's (the widest, measured at 4K keys and more).
KEY_WIDTHS = {(False, 128): (128, 144, 160), (True, 128): (128, 160), (False, 64): (128, 176), (True, 64): (128,)}


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
        return (f"TailSplit(n_work={self.n_work}, grid={self.grid}, n_key_tiles={self.n_key_tiles}: "
                f"whole={self.whole}, R={self.tail_tiles}, P={self.pieces})")


def tail_split_plan(n_work: int, grid: int, n_key_tiles: int) -> TailSplit:
    """The split of the last partial wave (TailSplit): one formula for the kernel builder and the tests."""
    return TailSplit(n_work, grid, n_key_tiles)


def _ws_buffers(q_stages, num_stages, block_M, block_N, dim, dtype, accum, consumers, split_tail):
    """Shared memory: `q_stages` Q tiles and the K/V ring; registers: the lesson's fragments and, for the
    merge, one more per-row factor; the ring's barriers (full: the producer warp arrives; empty: the
    consumers do)."""
    Q_s = T.alloc_shared((q_stages, block_M, dim), dtype)
    K_s = T.alloc_shared((num_stages, block_N, dim), dtype)
    V_s = T.alloc_shared((num_stages, block_N, dim), dtype)
    scores = T.alloc_fragment((block_M, block_N), accum)
    probs = T.alloc_fragment((block_M, block_N), dtype)
    acc_o = T.alloc_fragment((block_M, dim), accum)
    out = T.alloc_fragment((block_M, dim), dtype)
    m, m_prev, rescale, row_sum, l = (T.alloc_fragment((block_M,), accum) for _ in range(5))
    merge_scale = T.alloc_fragment((block_M,), accum) if split_tail else None
    q_full, q_empty = T.alloc_barrier([32] * q_stages), T.alloc_barrier([consumers] * q_stages)
    k_full, v_full = T.alloc_barrier([32] * num_stages), T.alloc_barrier([32] * num_stages)
    k_empty = T.alloc_barrier([consumers] * num_stages)
    v_empty = T.alloc_barrier([consumers] * num_stages)
    return (Q_s, K_s, V_s, scores, probs, acc_o, out, m, m_prev, rescale, row_sum, l, merge_scale,
            q_full, q_empty, k_full, v_full, k_empty, v_empty)


def flash_attention_forward_ws(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *, block_M: int = 128,
                               block_N: int = 128, num_stages: int = 2, heavy_first: bool = False,
                               persistent: bool = False, sms: int = SM_COUNT_H100_H200,
                               stage_output: bool = False, q_stages: int = 1, split_tail: bool = False,
                               dtype: str = "float16", kv_heads: int | None = None):
    """The hand-written warp-specialized kernel (see the module docstring).

    persistent=False runs one tile per block (the same code, the work loop gone). stage_output=True stores O
    by TMA through the tile's Q buffer, q_stages=2 double-buffers Q. split_tail=True (persistent, full
    attention) makes the kernel also take Workspace_O (grid, block_M, dim) fp32, Workspace_ML (grid, 2,
    block_M) fp32 and Flags (grid,) int32, flags zeroed once by the caller (SplitTailMemory does it); every
    launch leaves them at zero. A contributor stores its unnormalized acc_o, m and l with plain stores,
    fences, meets the other consumers at a named barrier, and one thread sets its flag with release
    semantics; the finisher spins on each contributor's flag (acquire), resets it, meets the consumers,
    fences and merges. Contributors never wait, and all blocks are resident at once (grid <= SMs): no cycle.
    """
    shape, kv_shape, groups = plans.shapes(batch, heads, seq_len, dim, kv_heads)
    scale = lesson.LOG2E / math.sqrt(dim)
    accum = "float32"
    # the lesson's online softmax, unchanged (its start and finish steps are replaced here)
    n_tiles, n_query_blocks, _, online_softmax, _ = lesson.kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                        seq_len % block_N != 0)
    # Causal work per query block grows with its index. A persistent block walks the tiles with a fixed
    # stride, so causal tiles go in pairs of equal total work: query blocks p and n-1-p of one head. Not with
    # two query blocks (a pair would be the whole head; TileLang 0.1.15 also fails to lower that case).
    paired = persistent and causal and n_query_blocks % 2 == 0 and n_query_blocks > 2
    tiles_per_item = 2 if paired else 1
    n_work = n_query_blocks * heads * batch // tiles_per_item
    grid = min(sms, n_work) if persistent else n_work
    consumers = 256  # two warp groups; the producer is the first warp of the third
    if split_tail and (causal or not persistent):
        raise ValueError("flash_attention: split_tail needs persistent=True and full (non-causal) attention")
    plan = tail_split_plan(n_work, grid, n_tiles) if split_tail else None
    split = plan is not None and plan.split

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

    def tail_piece(block_id):
        """A tail block's piece: its tile's coordinates, the piece number and its key tiles [k0, k1)."""
        piece = block_id % plan.pieces
        bx, by, bz = tile_coordinates(block_id // plan.pieces, plan.whole)  # tile whole·grid + r
        k0, k1 = plan.key_range(piece)
        return bx, by, bz, piece, k0, k1

    @T.macro
    def load_tile(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, step, bx, by,
                  bz, k0, k1):
        """The producer's work for one tile (the step-th of this block): its Q tile, then K and V of key tiles
        k0 .. k1 - 1, each into the next buffer of the ring once the consumers have released it."""
        q = step % q_stages
        T.mbarrier_wait_parity(q_empty[q], ((step // q_stages) & 1) ^ 1)
        T.tma_copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s[q, :, :], barrier=q_full[q])
        T.mbarrier_arrive(q_full[q])
        for i in T.serial(k1 - k0):
            use = loads[0] + i  # the ring counts uses across tiles: its phases carry on
            k = k0 + i
            T.mbarrier_wait_parity(k_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
            T.tma_copy(K[bz, k * block_N:(k + 1) * block_N, by // groups, :], K_s[use % num_stages, :, :],
                       barrier=k_full[use % num_stages])
            T.mbarrier_arrive(k_full[use % num_stages])
            T.mbarrier_wait_parity(v_empty[use % num_stages], ((use // num_stages) & 1) ^ 1)
            T.tma_copy(V[bz, k * block_N:(k + 1) * block_N, by // groups, :], V_s[use % num_stages, :, :],
                       barrier=v_full[use % num_stages])
            T.mbarrier_arrive(v_full[use % num_stages])
        loads[0] = loads[0] + (k1 - k0)

    @T.macro
    def attend_tile(Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, scores, probs, acc_o,
                    m, m_prev, rescale, row_sum, l, step, bx, k0, k1):
        """The consumers' peeled schedule over key tiles k0 .. k1 - 1 of one tile, leaving the
        unnormalized acc_o and the rows' m and l (the softmax gets absolute key tile numbers: the ragged last
        tile is masked by its number)."""
        first = loads[0]
        final = first + (k1 - k0) - 1
        T.fill(acc_o, 0)
        T.fill(l, 0)
        T.fill(m, -T.infinity(accum))
        q = step % q_stages
        T.mbarrier_wait_parity(q_full[q], (step // q_stages) & 1)
        # The first key tile: S = Q·Kᵀ only.
        T.mbarrier_wait_parity(k_full[first % num_stages], (first // num_stages) & 1)
        T.wgmma_gemm(Q_s[q, :, :], K_s[first % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                     policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(0)
        T.mbarrier_arrive(k_empty[first % num_stages])
        online_softmax(scores, k0, bx, m, m_prev, rescale, row_sum, l)
        T.copy(scores, probs)
        # The next ones: S(k) and P(k-1)·V(k-1) together; the softmax of S(k) while P·V still runs.
        for i in T.serial(1, k1 - k0):
            use = first + i
            T.mbarrier_wait_parity(k_full[use % num_stages], (use // num_stages) & 1)
            T.wgmma_gemm(Q_s[q, :, :], K_s[use % num_stages, :, :], scores, transpose_B=True, clear_accum=True,
                         policy=T.GemmWarpPolicy.FullRow)
            T.mbarrier_wait_parity(v_full[(use - 1) % num_stages], ((use - 1) // num_stages) & 1)
            T.wgmma_gemm(probs, V_s[(use - 1) % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            T.wait_wgmma(1)  # S(k) is done: K(k) may be refilled
            T.mbarrier_arrive(k_empty[use % num_stages])
            online_softmax(scores, k0 + i, bx, m, m_prev, rescale, row_sum, l)
            T.wait_wgmma(0)
            T.mbarrier_arrive(v_empty[(use - 1) % num_stages])
            for r, j in T.Parallel(block_M, dim):
                acc_o[r, j] *= rescale[r]
            T.copy(scores, probs)
        if not stage_output:
            T.mbarrier_arrive(q_empty[q])  # the last Q·Kᵀ is done: the producer may load the next tile's Q
        # The last P·V alone.
        T.mbarrier_wait_parity(v_full[final % num_stages], (final // num_stages) & 1)
        T.wgmma_gemm(probs, V_s[final % num_stages, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(0)
        T.mbarrier_arrive(v_empty[final % num_stages])
        loads[0] = final + 1

    @T.macro
    def store_tile(O, Q_s, q_empty, acc_o, out, l, step, bx, by, bz):
        """O = acc_o / l, stored from registers or (stage_output) through the Q buffer by one thread's TMA."""
        q = step % q_stages
        for i, j in T.Parallel(block_M, dim):
            out[i, j] = acc_o[i, j] / l[i]
        if stage_output:
            T.copy(out, Q_s[q, :, :])
            T.copy(Q_s[q, :, :], O[bz, bx * block_M:(bx + 1) * block_M, by, :])  # TMA, waited by its thread
            T.mbarrier_arrive(q_empty[q])
        else:
            T.copy(out, O[bz, bx * block_M:(bx + 1) * block_M, by, :])

    def finite(x):
        """x, or 0 where x is -inf: 2^((m - M)·scale) must be 0, not NaN, for a row that saw no key at all."""
        return T.if_then_else(x == -T.infinity(accum), T.float32(0), x)

    @T.macro
    def publish_or_merge(O, Q_s, q_empty, acc_o, out, m, m_prev, rescale, l, merge_scale, Workspace_O,
                         Workspace_ML, Flags, thread, block_id, bx, by, bz, piece):
        """split_tail, after a piece's keys: a contributor (piece > 0) publishes its partial result, the
        finisher (piece 0) merges the tile's other pieces in block order (deterministic) and stores O."""
        if piece > 0:
            if stage_output:
                T.mbarrier_arrive(q_empty[plan.whole % q_stages])  # no O to stage: the Q buffer is free
            T.copy(acc_o, Workspace_O[block_id, :, :])
            for i in T.Parallel(block_M):
                Workspace_ML[block_id, 0, i] = m[i]
                Workspace_ML[block_id, 1, i] = l[i]
            T.call_extern("handle", "__threadfence")  # this thread's stores, device-wide, before the barrier
            T.sync_threads(SPLIT_BARRIER, consumers)
            if thread == 0:
                T.atomic_store(Flags[block_id], 1, memory_order="release")
        else:
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
            store_tile(O, Q_s, q_empty, acc_o, out, l, plan.whole, bx, by, bz)

    def whole_tiles(block_id):
        """How many whole tiles this block walks (with split_tail: every block the same, then its piece)."""
        return plan.whole if split else T.ceildiv(n_work - block_id, grid) * tiles_per_item

    @T.macro
    def body(Q, K, V, O, Workspace_O, Workspace_ML, Flags, block_id):
        (Q_s, K_s, V_s, scores, probs, acc_o, out, m, m_prev, rescale, row_sum, l, merge_scale, q_full, q_empty,
         k_full, v_full, k_empty, v_empty) = _ws_buffers(q_stages, num_stages, block_M, block_N, dim, dtype, accum,
                                                         consumers, split_tail)
        loads = T.alloc_local((1,), "int32")  # K/V tiles loaded (or consumed) so far, per role
        loads[0] = 0
        thread = T.get_thread_binding()
        if thread >= consumers:
            T.set_max_nreg(24, 0)  # the whole producer warp group gives registers back
            if thread < consumers + 32:
                for step in T.serial(whole_tiles(block_id)):
                    bx, by, bz = tile_coordinates(block_id, step)
                    load_tile(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads,
                              step, bx, by, bz, 0, key_tiles(bx))
                if split:  # after the whole tiles, this block's piece of a tail tile
                    if block_id < plan.busy_blocks:
                        bx, by, bz, piece, k0, k1 = tail_piece(block_id)
                        load_tile(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads,
                                  plan.whole, bx, by, bz, k0, k1)
        else:
            T.set_max_nreg(240, 1)
            for step in T.serial(whole_tiles(block_id)):
                bx, by, bz = tile_coordinates(block_id, step)
                attend_tile(Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, scores, probs,
                            acc_o, m, m_prev, rescale, row_sum, l, step, bx, 0, key_tiles(bx))
                store_tile(O, Q_s, q_empty, acc_o, out, l, step, bx, by, bz)
            if split:
                if block_id < plan.busy_blocks:
                    bx, by, bz, piece, k0, k1 = tail_piece(block_id)
                    attend_tile(Q_s, K_s, V_s, q_full, q_empty, k_full, k_empty, v_full, v_empty, loads, scores,
                                probs, acc_o, m, m_prev, rescale, row_sum, l, plan.whole, bx, k0, k1)
                    publish_or_merge(O, Q_s, q_empty, acc_o, out, m, m_prev, rescale, l, merge_scale, Workspace_O,
                                     Workspace_ML, Flags, thread, block_id, bx, by, bz, piece)

    if not split_tail:
        @T.prim_func
        def flash_attention_fwd_ws(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype),
                                   V: T.Tensor(kv_shape, dtype), O: T.Tensor(shape, dtype)):
            with T.Kernel(grid, threads=consumers + 128) as block_id:
                body(Q, K, V, O, None, None, None, block_id)

        return flash_attention_fwd_ws

    @T.prim_func
    def flash_attention_fwd_ws_split(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype),
                                     V: T.Tensor(kv_shape, dtype), O: T.Tensor(shape, dtype),
                                     Workspace_O: T.Tensor((grid, block_M, dim), accum),
                                     Workspace_ML: T.Tensor((grid, 2, block_M), accum),
                                     Flags: T.Tensor((grid,), "int32")):
        with T.Kernel(grid, threads=consumers + 128) as block_id:
            body(Q, K, V, O, Workspace_O, Workspace_ML, Flags, block_id)

    return flash_attention_fwd_ws_split


# ---------------------------------------------------------------------------------------------------------
# Configuration and launch
# ---------------------------------------------------------------------------------------------------------


def config_smem(dim: int, cfg: dict) -> int:
    """Shared memory of a configuration: `q_stages` Q tiles and the K/V ring (O goes out through a Q tile or
    from registers); the barriers add a few bytes."""
    return 2 * dim * (cfg.get("q_stages", 1) * cfg["block_M"] + 2 * cfg["num_stages"] * cfg["block_N"])


def choose_config(problem, family: str, smem_budget: int, sm_count: int | None = None):
    """The appendix kernel's configuration for a problem (sections/attention_plans.Problem) on a GPU, or None
    (not Hopper, a head dim without an entry, or too little shared memory). A persistent grid gets one block
    per SM."""
    cfg = HOPPER_CONFIGS.get((problem.causal, problem.dim)) if family == "hopper" else None
    if cfg is None or config_smem(problem.dim, cfg) > smem_budget:
        return None
    # Narrower key tiles where the table's would waste much of the last one (512 keys: four 128-wide tiles,
    # not four 160-wide ones); no extra iteration here. The widths fit wherever the table's do.
    widths = KEY_WIDTHS[(problem.causal, problem.dim)]
    cfg = dict(cfg, block_N=plans.key_tile_width(problem.seq_len, widths, 0))
    return dict(cfg, sms=sm_count or SM_COUNT_H100_H200) if cfg.get("persistent") else cfg


def build(problem, cfg: dict):
    # the thread count is fixed (two consumer warp groups and a producer warp group)
    kwargs = {k: v for k, v in cfg.items() if k not in ("kind", "fast_math", "threads")}
    return flash_attention_forward_ws(*problem.kernel_args(), **problem.kernel_kwargs(), **kwargs)


class SplitTailMemory:
    """kernel(q, k, v, o) for a split_tail kernel, which also takes Workspace_O, Workspace_ML and Flags:
    allocated zeroed at the first call, then passed to every launch (every launch leaves the flags at zero:
    flags_left). A grid larger than the GPU's SM count is refused: the finishers wait for the contributors,
    so all blocks must be resident at once, one per SM."""

    def __init__(self, kernel):
        func = kernel.prim_func
        self.kernel = kernel
        self.shapes = [tuple(int(d) for d in func.buffer_map[param].shape) for param in func.params[4:]]
        self.tensors = None

    def __call__(self, q, k, v, o):
        if self.tensors is None:
            import torch

            sms = torch.cuda.get_device_properties(q.device).multi_processor_count
            if sms < self.shapes[-1][0]:
                raise RuntimeError(f"flash_attention: split_tail's {self.shapes[-1][0]} blocks wait for one "
                                   f"another and must all be resident; this GPU has {sms} SMs")
            self.tensors = [torch.zeros(shape, dtype=torch.int32 if len(shape) == 1 else torch.float32,
                                        device=q.device) for shape in self.shapes]
        return self.kernel(q, k, v, o, *self.tensors)

    def flags_left(self) -> int:
        """Flags not at zero (after the launches so far have finished)."""
        return 0 if self.tensors is None else int(self.tensors[-1].count_nonzero().item())


def launcher(kernel):
    """kernel(q, k, v, o) for any compiled attention kernel: a split_tail kernel comes with its memory."""
    return SplitTailMemory(kernel) if len(kernel.prim_func.params) > 4 else kernel
