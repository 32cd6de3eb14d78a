"""An experiment: stream-K, the lesson's GEMM for problems whose tiles leave SMs idle
(bench/gemm_experiments_probe.py times it; BENCHMARKS.md has why the rule does not take it: correct, but slower
than the rule's pick so far).

2500x1000x3000 in 128x256 tiles is 80 blocks on 132 SMs: 52 SMs idle for the whole kernel. Smaller tiles make
more blocks but do less work per byte loaded; a split K makes whole extra waves. Stream-K cuts the problem along
its K steps instead of its tiles: the 80 tiles x 47 K steps = 3760 (tile, K step) units, laid end to end, go
to 132 persistent blocks in equal runs of 28 or 29. A run covers the end of one tile's K loop, then the start of
the next; where a tile is shared, each block writes its fp32 partial sum to a workspace and bumps the tile's
counter, and the block that arrives last adds the others' partials to its own and stores the tile:

    for each block w:                                    # one an SM, one pipelined loop over its run
        for each tile t its run [begin, end) touches:
            acc = sum over its K steps in t of A_s @ B_s
            if the run holds all of t's K steps: C[t] = acc
            else:
                partials[slot of (w, t)] = acc;  arrived = atomic_add(counters[t], 1)
                if arrived == contributors(t) - 1:     # the last one: the others' partials are written
                    C[t] = acc + the others' partials;  counters[t] = 0   # ready for the next call

No block waits on another (the last to arrive does the sum), so the kernel cannot deadlock whatever runs beside it.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import tilelang.language as T

from sections.gemm_schedules import tile_of


def units_of(M: int, N: int, K: int, config) -> tuple[int, int, int, int]:
    """(tiles, K steps a tile, units, workers): the stream-K walk of a problem (no more workers than units)."""
    tiles = -(-M // config.block_M) * -(-N // config.block_N)
    steps = -(-K // config.block_K)
    return tiles, steps, tiles * steps, min(config.persistent, tiles * steps)


def workspace_shapes(M: int, N: int, K: int, config) -> dict:
    """What the launcher allocates once: fp32 partials, two slots a worker (the tile its run ends in and the
    one it starts in), and an int32 arrival counter a tile, zeroed once (the last block to arrive resets it)."""
    tiles, _, _, workers = units_of(M, N, K, config)
    return {"partials": (2 * workers, config.block_M, config.block_N), "counters": (tiles,)}


def run_begin(w, units: int, workers: int):
    """The first unit of block w's run (runs of equal length, give or take one)."""
    return w * units // workers


def contributors(t, steps: int, units: int, workers: int):
    """(first, last) block whose run holds a unit of tile t."""
    return (((t * steps + 1) * workers - 1) // units, ((t + 1) * steps * workers - 1) // units)


def partial_slot(w, t, steps: int, units: int, workers: int, select=None):
    """Block w's workspace slot for tile t: 2w if its run starts inside t (t is its first tile), else 2w + 1
    (t is the tile its run ends in). select: T.if_then_else inside a kernel."""
    starts_inside = run_begin(w, units, workers) >= t * steps
    return 2 * w + (select(starts_inside, 0, 1) if select else (0 if starts_inside else 1))


def segments(M: int, N: int, K: int, config) -> list[tuple[int, int, int, int]]:
    """(block, tile, first K step, last K step + 1) of every piece of the walk, as the kernel cuts it."""
    tiles, steps, units, workers = units_of(M, N, K, config)
    out = []
    for w in range(workers):
        begin, end = run_begin(w, units, workers), run_begin(w + 1, units, workers)
        for t in range(begin // steps, -(-end // steps)):
            lo, hi = max(begin, t * steps), min(end, (t + 1) * steps)
            out.append((w, t, lo - t * steps, hi - t * steps))
    return out


def streamk_program(M: int, N: int, K: int, config, *, dtype: str = "float16", accum_dtype: str = "float32",
                    handoff: bool = True):
    """C = A @ B, `config.persistent` blocks walking equal runs of (tile, K step) units (two consumer warpgroups).
    handoff=False: every piece stores its own sum as the tile (wrong where tiles are shared): the walk's speed
    without the partials' round trip, for the probe."""
    bM, bN, bK = config.block_M, config.block_N, config.block_K
    policy = getattr(T.GemmWarpPolicy, config.policy)
    m_tiles, n_tiles = -(-M // bM), -(-N // bN)
    tiles, steps, units, workers = units_of(M, N, K, config)
    panel = min(config.panel if config.swizzle else 1, m_tiles)
    workspace = workspace_shapes(M, N, K, config)
    partials_shape, counters_shape = workspace["partials"], workspace["counters"]

    @T.macro
    def body(A, B, C, Partials, Counters):
        with T.Kernel(workers, threads=config.threads) as w:
            A_shared = T.alloc_shared((bM, bK), dtype)
            B_shared = T.alloc_shared((bK, bN), dtype)
            C_local = T.alloc_fragment((bM, bN), accum_dtype)
            C_shared = T.alloc_shared((bM, bN), dtype)
            last = T.alloc_shared((1,), "int32")
            slot = T.alloc_local((1,), "int32")  # a workspace index worked out once, not per element
            tx = T.get_thread_binding()
            begin, end = run_begin(w, units, workers), run_begin(w + 1, units, workers)
            # One pipelined loop over the run's units, as the persistent walk: the next tile's loads fly
            # while this one is handed in.
            for step in T.Pipelined(end - begin, num_stages=config.num_stages):
                t, k = (begin + step) // steps, (begin + step) % steps
                by, bx = tile_of(t, m_tiles, n_tiles, panel, T.min, T.max)
                T.copy(A[by * bM, k * bK], A_shared)
                T.copy(B[k * bK, bx * bN], B_shared)
                T.gemm(A_shared, B_shared, C_local, policy=policy, clear_accum=k == 0 or step == 0)
                if k == steps - 1 or step == end - begin - 1:  # the end of this block's part of tile t
                    whole = begin + step - k >= begin and k == steps - 1  # the run holds the tile's first K step too
                    if handoff and not whole:  # a shared tile: hand in this block's part, and see who is last
                        slot[0] = partial_slot(w, t, steps, units, workers, T.if_then_else)
                        T.copy(C_local, Partials[slot[0], 0, 0])
                        T.sync_threads()  # every thread's partial written before the count goes up
                        first, final = contributors(t, steps, units, workers)
                        if tx == 0:
                            T.call_extern("handle", "__threadfence")
                            arrived = T.atomic_add(Counters[t], 1, return_prev=True, memory_order="acq_rel")
                            last[0] = T.if_then_else(arrived == final - first, 1, 0)
                            T.call_extern("handle", "__threadfence")
                        T.sync_threads()
                        if last[0] == 1:
                            for v in T.serial(final - first + 1):
                                if first + v != w:
                                    slot[0] = partial_slot(first + v, t, steps, units, workers, T.if_then_else)
                                    for i, j in T.Parallel(bM, bN):
                                        C_local[i, j] += Partials[slot[0], i, j]
                            if tx == 0:
                                Counters[t] = 0  # ready for the next call
                    if not handoff or whole or last[0] == 1:  # the whole K loop was this block's, or it arrived last
                        T.copy(C_local, C_shared)
                        T.copy(C_shared, C[by * bM, bx * bN])

    @T.prim_func
    def streamk(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype),
                Partials: T.Tensor(partials_shape, accum_dtype), Counters: T.Tensor(counters_shape, "int32")):
        body(A, B, C, Partials, Counters)

    return streamk
