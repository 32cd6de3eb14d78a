"""flash_attention's problems and the rules that choose a kernel configuration for one (imported by the lesson).

A problem is (batch, heads, sequence length, head dim, causal), with grouped-query attention's key/value head
count and the element type. A configuration is a dict: the kernel kind ("pipelined": T.Pipelined infers the
pipeline; "async": the FA3 schedule; "persistent": the pipelined kernel walking its tiles, causal ones in pairs,
in `workers` blocks; "persistent_async": that walk in the FA3 schedule; "ws": the appendix's hand-written warp
specialization), the tile sizes, stages, threads,
flags (fast_math, heavy_first) and blocks_per_sm (blocks sharing an SM). `choose_config` returns one with the
reason it was chosen.
"""

from __future__ import annotations

from dataclasses import dataclass

from tourkit import SectionSkip

TORCH_DTYPES = {"float16": "float16", "bfloat16": "bfloat16"}  # names of torch's dtypes, looked up lazily
DEFAULT_SMS = 132  # an H100/H200: the SM count a rule assumes when no GPU says otherwise (--compile-only)


@dataclass(frozen=True)
class Problem:
    """One attention problem. kv_heads (grouped-query attention): query head h reads key/value head
    h // (heads // kv_heads); None means as many as query heads (multi-head attention)."""

    batch: int
    heads: int
    seq_len: int
    dim: int
    causal: bool
    kv_heads: int | None = None
    dtype: str = "float16"

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"flash_attention: {self.heads} query heads do not split into {self.kv_heads} groups")
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"flash_attention: dtype {self.dtype!r} is not one of {', '.join(TORCH_DTYPES)}")

    @property
    def size(self) -> str:
        """The problem without its mode: B4 H32 S4096 D128, with KVH8 for grouped-query attention, bf16."""
        kv = f" KVH{self.kv_heads}" if self.kv_heads != self.heads else ""
        kind = " bf16" if self.dtype == "bfloat16" else ""
        return f"B{self.batch} H{self.heads}{kv} S{self.seq_len} D{self.dim}{kind}"

    @property
    def name(self) -> str:
        return f"{self.size} {self.mode}"

    @property
    def mode(self) -> str:
        return "causal" if self.causal else "full"

    @property
    def flops(self) -> float:
        """4·B·H·S²·D (two GEMMs), halved when causal."""
        return 4.0 * self.batch * self.heads * self.seq_len ** 2 * self.dim * (0.5 if self.causal else 1.0)

    @property
    def nbytes(self) -> int:
        """What the kernel must move at least: Q read and O written (B·S·H·D each), K and V read (B·S·KVH·D)."""
        return 2 * 2 * self.batch * self.seq_len * self.dim * (self.heads + self.kv_heads)

    def kernel_args(self) -> tuple:
        return self.batch, self.heads, self.seq_len, self.dim, self.causal

    def kernel_kwargs(self) -> dict:
        return dict(kv_heads=self.kv_heads, dtype=self.dtype)


def from_shape(dims, causal: bool, dtype: str = "float16") -> Problem:
    """A Problem from --shape's BxHxSxD or BxHxSxDxKVH."""
    batch, heads, seq_len, dim, *kv = dims
    return Problem(batch, heads, seq_len, dim, causal, kv[0] if kv else None, dtype)


def shapes(batch: int, heads: int, seq_len: int, dim: int, kv_heads: int | None):
    """Q and O (B, S, H, D); K and V (B, S, KVH, D), each K/V head shared by `groups` neighbouring query heads."""
    kv_heads = kv_heads or heads
    if heads % kv_heads:
        raise ValueError(f"flash_attention: {heads} query heads do not split into groups of {kv_heads} KV heads")
    return (batch, seq_len, heads, dim), (batch, seq_len, kv_heads, dim), heads // kv_heads


def smem_estimate(dim: int, block_M: int, block_N: int, num_stages: int, output_reuses_kv: bool = False) -> int:
    """Bytes of shared memory (2-byte elements): Q, `num_stages` K and V tiles, O. With `output_reuses_kv` O
    takes the K/V buffers after the loop (TileLang's planner in its Hopper kernels); otherwise an upper bound."""
    kv_tiles = 2 * num_stages * block_N
    return 2 * dim * (block_M + kv_tiles + (max(0, block_M - kv_tiles) if output_reuses_kv else block_M))


def key_tiles(seq_len: int, block_N: int) -> int:
    return -(-seq_len // block_N)


# The per-iteration cost of the key loop outside the score columns themselves (row max and sum, rescaling O,
# the waits), in columns' worth of work; the async kernel also runs one extra, fully masked iteration (its
# Q·Kᵀ and softmax, no P·V: about half an iteration). 32 matched the H200 (176 wide at 4096 keys, 144 at 3000).
ITERATION_COST_COLUMNS = 32
ASYNC_EXTRA_ITERATION = 0.5


def key_tile_width(seq_len: int, widths, extra_iterations: float) -> int:
    """The key-tile width with the least work per query block: fewer, wider iterations pay the fixed cost
    less often, but the last tile pays for all its columns even when the sequence ends early in it (777 keys
    in 176-wide tiles: 880 columns; in 128-wide ones 896; in 160-wide 800). Ties go to the wider tile."""
    def cost(width):
        return (key_tiles(seq_len, width) + extra_iterations) * (width + ITERATION_COST_COLUMNS)
    return min(sorted(widths, reverse=True), key=cost)


# Hopper (wgmma). Measured on an H200 over problems of many sizes (bench/attention_shapes_probe.py):
# * the FA3 async schedule wins when a query block walks many key tiles: it overlaps the softmax with the MMAs
#   and pays one extra, fully masked iteration, which a long walk amortizes. From 12 key tiles (128 wide) on
#   average it was ahead at head dim 128 (causal blocks walk half the tiles on average);
# * below that, and at head dim 64 (a tile's two GEMMs too short to hide the softmax behind), the compiler's
#   pipeline. Its two consumer warp groups of one 128-row block lost to two 64-row blocks per SM, one warp group
#   each (register_split: the launch bounds cap a thread at 128, then the producer drops to 24 and the
#   consumers take 232; flash_attention_forward(blocks_per_sm=2)): a block's Q load, O store and
#   softmax then overlap the other block's MMAs. At head dim 64 (64x128 tiles) that won on every problem from
#   1K to 8K keys; at 16K keys 128-row blocks with 3 stages were ahead (a 64-row block re-reads each K/V tile for
#   half as many queries, and a long walk makes that traffic count). At head dim 128 two blocks fit shared
#   memory with 64x64 tiles: well ahead on short causal walks (finer diagonal tiles too) and a few percent
#   behind the FA3 schedule at its threshold; even with or ahead of 128-row blocks on full problems of 4 key
#   tiles or fewer, so full ones walking 5 to 11 tiles keep 128-row blocks;
# * full attention's async key tiles: 144 or 176 columns, whichever wastes less of the last tile (160 measured
#   slower than both); causal ones 128 wide (a finer diagonal), the longest query blocks launched first.
ASYNC_MIN_WALK = 12
ASYNC_KEY_WIDTHS = (144, 176)
# The longest average walk (128-wide tiles) given two blocks per SM; causal at head dim 128: up to ASYNC_MIN_WALK.
PAIRED_MAX_WALK = {64: 64, 128: 4}
# Full attention at head dim 64 in two 64-row blocks an SM: key tiles 192 wide (two blocks still fit shared
# memory) were level with 128 over the problems timed, each ahead on some: the runner-up.
PAIRED_WIDE_KEYS = 192
# Causal at head dim 64 over at most this many 128-wide key tiles (1024 keys): 64x64 tiles, three blocks an SM.
# Finer diagonal tiles waste less of the masked triangle, and a third block hides more of each one's start and
# end; measured ahead of two 64x128 blocks up to 1024 keys, behind from about 1500.
TRIPLED_MAX_TILES = 8
# Full attention whose 128-row query tiles outnumber the SMs, each walking at most this many 128-wide key tiles:
# the lesson's kernel walking the tiles persistently (sections/attention_persistent.py), each tile's first loads
# in flight during the last one's store. Ahead of every grid schedule from 2 to 8 key tiles at both head dims
# (most at 2 to 4, where a block's start and end are most of its time); level at 16, behind the FA3 schedule at 32
# and behind the grid under one round of tiles.
PERSISTENT_MAX_WALK = 8
# Causal problems walked in pairs of query tiles, i with n-1-i, every pair the same n + 1 key steps: ahead of the
# grid's heaviest-first blocks (and at head dim 128 of the FA3 schedule) wherever the pairs keep the SMs busy and
# the walk is short (up to 17 key steps a pair), or at head dim 128 longer (up to 33, timed against the FA3
# schedule) over a few rounds of pairs. Behind where a nearly empty last round leaves the SMs idle much of the time (the
# grid's short blocks fill its tail; every pair is long), and on long walks over many rounds (the FA3 schedule's
# overlap, or at head dim 64 the grid's deeper pipeline, then counts for more than the blocks' starts and ends).
PAIRS_MAX_WALK, PAIRS_LONG_WALK, PAIRS_LONG_ROUNDS = 17, 33, 4  # key steps a pair; rounds of pairs over the SMs
PAIRS_MIN_FILL = 0.8  # of the SMs' time the pairs keep busy: units / (rounds x SMs)
# Full attention at head dim 128 walks in the FA3 schedule (attention_persistent.flash_attention_persistent_async:
# Q·Kᵀ of one step in flight with P·V of the one before, one extra step a worker rather than a tile) over
# OVERLAP_MIN_STEPS to OVERLAP_MAX_FULL key tiles. Ahead of the pipelined walk from 5 tiles (level at 4 and 6), and
# of the grid's FA3 kernel up to 16; from 24 to 32 either wins by a few percent (the grid's wider key tiles against
# the walk's single extra step; the tour times the two side by side); past 32 the grid. Causal pairs keep the
# pipelined walk: the two schedules were level there, each ahead on some problems.
OVERLAP_MIN_STEPS, OVERLAP_MAX_FULL = 4, 32
# Full attention at head dim 128 over at most PAIRED_MAX_WALK key tiles whose 128-wide tiles pad the keys by more
# than this over 64-wide ones (300 keys: 384 against 320): two 64x64 blocks an SM, not the persistent walk.
RAGGED_PADDING = 1.125
# Head dim 256: O alone is 128 fp32 registers a thread in a 128-row block of two warpgroups, so key tiles of 64
# (32 more for the scores); Q, two K/V stages and O (in the K/V buffers after the loop) take 192 KiB. The FA3
# schedule, whose long GEMMs (d = 256) hide the softmax; its runner-up the compiler's pipeline on 64x64 tiles.
WIDE_HEAD_DIM = 256
# Ampere/Ada/Turing (or a Hopper budget too small for the above): no wgmma; the largest tiles that fit (64x32:
# head dim 256 in the 99 KiB of sm_86/sm_89).
OTHER_CANDIDATES = [(128, 128, 2), (128, 128, 1), (128, 64, 2), (128, 64, 1), (64, 64, 2), (64, 64, 1), (64, 32, 1)]
# ...and there, a K/V pipeline (2 stages) only up to 64 fp32 accumulators (scores and O) a thread: the pipeline
# costs registers of its own. At head dim 64, 128x128 tiles (96 a thread) spilled at 255 registers with 2
# stages and took about 200 with 1; 128x64 tiles (64) took about 200 with 2. ptxas, sm_80 to sm_89. One stage up
# to 144: at head dim 256, 64x64 tiles (160) spilled causal (its mask's registers), 64x32 (144) did not.
PIPELINED_MAX_ACCUMULATORS = 64
SINGLE_STAGE_MAX_ACCUMULATORS = 144


def accumulators(dim: int, block_M: int, block_N: int, threads: int) -> int:
    """fp32 values a thread accumulates: its share of the scores (block_M x block_N) and of O (block_M x dim)."""
    return block_M * (block_N + dim) // threads


def query_rows(problem: Problem, sms: int) -> int:
    """128 query rows per block, or 64 when 128-row blocks would leave more than half the SMs idle (short
    sequences, few heads: a decode-like S=1 wastes 127 of 128 rows either way; 64 halves the waste)."""
    blocks = key_tiles(problem.seq_len, 128) * problem.heads * problem.batch
    return 64 if problem.seq_len <= 64 or 2 * blocks <= sms else 128


def key_walk(problem: Problem) -> float:
    """Key tiles (128 wide) a query block visits on average: all of them, or about half when causal."""
    n = key_tiles(problem.seq_len, 128)
    return (n + 1) / 2 if problem.causal else n


def register_split(blocks_per_sm: int, threads: int) -> int:
    """Registers a consumer thread may take when `blocks_per_sm` blocks of `threads` (plus the producer warp
    group TileLang adds on Hopper) share an SM: nvcc caps every thread at 64K / n over all the block's threads,
    the producer then drops to 24 and the consumers take what it freed (asking for more would stall)."""
    cap = 65536 // (blocks_per_sm * (threads + 128)) // 8 * 8
    return min(240, (cap + 128 * (cap - 24) // threads) // 8 * 8)


def paired_blocks(problem: Problem, rows: int, walk: float, smem_budget: int, forced: bool = False) -> dict | None:
    """Two 64-row blocks per SM where they fit shared memory twice over and the rule above prefers them (or
    128-row blocks would leave SMs idle anyway, or `forced`): the configuration, else None."""
    width = 64 if problem.dim == 128 or problem.seq_len <= 64 else 128
    if 2 * smem_estimate(problem.dim, 64, width, 2) > smem_budget:
        return None
    preferred = walk <= PAIRED_MAX_WALK[problem.dim] or (problem.causal and problem.dim == 128)
    if not (preferred or rows == 64 or forced):
        return None
    return dict(kind="pipelined", block_M=64, block_N=width, num_stages=2, threads=128, fast_math=True,
                blocks_per_sm=2)


def persistent_units(problem: Problem) -> tuple[int, int]:
    """(units, key steps a unit) of the persistent walk on 128x128 tiles: a query tile each when full; causal,
    a pair of them (attention_persistent.causal_pair_step), every pair n + 1 steps (n odd: n)."""
    n = key_tiles(problem.seq_len, 128)
    if problem.causal:
        return (n + 1) // 2 * problem.heads * problem.batch, n + 1 - n % 2
    return n * problem.heads * problem.batch, n


def busy_share(units: int, sms: int) -> float:
    """The share of the SMs' time that `units` equal units keep busy: units / (rounds x SMs)."""
    return units / (-(-units // sms) * sms)


def persistent_walk(problem: Problem, sms: int, smem_budget: int, overlap: bool = True) -> dict | None:
    """The persistent walk where it applies (full: PERSISTENT_MAX_WALK, or OVERLAP_MAX_FULL in the FA3
    schedule; causal pairs: PAIRS_*): 128x128 tiles, `sms` blocks, more units than blocks; else None. Its key
    steps take the FA3 schedule where `overlap` and overlapped_walk say so."""
    units, walk = persistent_units(problem)
    kind = "persistent_async" if overlap and overlapped_walk(problem) else "persistent"
    cfg = dict(kind=kind, block_M=128, block_N=128, num_stages=2, threads=256, workers=sms, fast_math=True)
    if problem.seq_len < 128 or units <= sms or config_smem(cfg, problem.dim) > smem_budget:
        return None
    if not problem.causal:
        return cfg if walk <= PERSISTENT_MAX_WALK or kind == "persistent_async" else None
    short = walk <= PAIRS_MAX_WALK or (problem.dim == 128 and walk <= PAIRS_LONG_WALK
                                       and -(-units // sms) <= PAIRS_LONG_ROUNDS)
    return cfg if short and busy_share(units, sms) >= PAIRS_MIN_FILL else None


def overlapped_walk(problem: Problem) -> bool:
    """Whether the persistent walk's key steps take the FA3 schedule (OVERLAP_*)."""
    walk = persistent_units(problem)[1]
    return problem.dim == 128 and not problem.causal and OVERLAP_MIN_STEPS <= walk <= OVERLAP_MAX_FULL


def ragged_short_walk(problem: Problem) -> bool:
    """Full attention at head dim 128 over a few key tiles whose last 128-wide one is mostly padding
    (RAGGED_PADDING): 64-wide tiles waste less of it."""
    if problem.causal or problem.dim != 128 or key_walk(problem) > PAIRED_MAX_WALK[128]:
        return False
    return key_tiles(problem.seq_len, 128) * 128 > RAGGED_PADDING * key_tiles(problem.seq_len, 64) * 64


def config_smem(cfg: dict, dim: int) -> int:
    """smem_estimate of a configuration; the persistent walk's pipeline also keeps a Q tile for each stage."""
    q_stages = cfg["num_stages"] - 1 if cfg["kind"].startswith("persistent") else 0
    return (smem_estimate(dim, cfg["block_M"], cfg["block_N"], cfg["num_stages"], cfg["kind"] == "async")
            + 2 * dim * cfg["block_M"] * q_stages)


def tripled_blocks(problem: Problem, smem_budget: int) -> dict | None:
    """Three 64-row blocks an SM with 64x64 tiles, for short causal walks at head dim 64 (TRIPLED_MAX_TILES)."""
    if (problem.dim != 64 or not problem.causal or key_tiles(problem.seq_len, 128) > TRIPLED_MAX_TILES
            or 3 * smem_estimate(64, 64, 64, 2) > smem_budget):
        return None
    return dict(kind="pipelined", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True, blocks_per_sm=3)


def hopper_config(problem: Problem, sms: int, smem_budget: int, closed: frozenset = frozenset()):
    """The rule's choice, its branches tried in order; a branch named in `closed` is passed over (runner_up)."""
    rows, walk = query_rows(problem, sms), key_walk(problem)
    tiles = f"{walk:g} key tile{'s' * (walk != 1)}"
    if problem.dim == WIDE_HEAD_DIM:
        if "async" not in closed:
            why = ("head dim 256: the FA3 schedule, its long GEMMs hiding the softmax; 64-wide key tiles, as O "
                   "takes 128 fp32 registers a thread")
            cfg = dict(kind="async", block_M=rows, block_N=64, num_stages=2, threads=2 * rows, fast_math=True)
        else:
            why = "head dim 256: the compiler's pipeline, 64x64 tiles, one warpgroup"
            cfg = dict(kind="pipelined", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True)
    elif ("persistent" not in closed and (not ragged_short_walk(problem) or "paired" in closed)
          and (cfg := persistent_walk(problem, sms, smem_budget, "persistent_async" not in closed)) is not None):
        units, steps = persistent_units(problem)
        what = (f"causal, {units} pairs of 128-row query tiles (i with n-1-i: equal work), {steps} key steps "
                f"each, {busy_share(units, sms):.0%} of the SMs' time busy" if problem.causal
                else f"full attention, {units} query tiles of 128 rows, each walking {tiles}")
        how = f"one pipelined loop over their key steps (a walk of at most {PERSISTENT_MAX_WALK})"
        if cfg["kind"] == "persistent_async":
            how = (f"one loop over their key steps in the FA3 schedule (a walk of {OVERLAP_MIN_STEPS} to "
                   f"{OVERLAP_MAX_FULL}), each tile's last P·V in the next one's first step")
        return cfg, (f"{what}: {sms} blocks walk them persistently, {how}, each unit's first loads in flight "
                     f"during the last one's store")
    elif problem.dim == 128 and walk >= ASYNC_MIN_WALK and "async" not in closed:
        if problem.causal or rows == 64:  # 64 rows: few, short blocks; 128-wide tiles as validated
            width, widths = 128, ""
        else:
            width = key_tile_width(problem.seq_len, ASYNC_KEY_WIDTHS, ASYNC_EXTRA_ITERATION)
            widths = f" (of {' or '.join(map(str, ASYNC_KEY_WIDTHS))}: the least work for {problem.seq_len} keys)"
        why = (f"a query block walks {tiles}, enough for the FA3 schedule (the next Q·Kᵀ in flight "
               f"with P·V) to pay for its extra masked iteration; {width}-wide key tiles{widths}")
        cfg = dict(kind="async", block_M=rows, block_N=width, num_stages=2, threads=2 * rows, fast_math=True)
    elif "tripled" not in closed and (cfg := tripled_blocks(problem, smem_budget)) is not None:
        why = (f"causal at head dim 64, {tiles} (at most {TRIPLED_MAX_TILES}): 64x64 tiles, finer along the "
               f"diagonal, and three 64-row blocks an SM ({register_split(3, 128)} registers a consumer thread), "
               f"each one's loads, stores and softmax beside the others' MMAs")
    elif "paired" not in closed and (cfg := paired_blocks(problem, rows, walk, smem_budget, "grid" in closed)):
        short = ("head dim 64: a tile's GEMMs are too short to hide the softmax behind" if problem.dim == 64 else
                 f"a query block walks {tiles}, too few for the FA3 schedule")
        why = (f"{short}; two 64-row blocks share each SM ({register_split(2, 128)} registers a consumer thread), "
               f"one's loads, stores and "
               f"softmax beside the other's MMAs; {cfg['block_N']}-wide key tiles"
               + (", so that two blocks fit shared memory" if problem.dim == 128 else ""))
        if ragged_short_walk(problem) and "persistent" not in closed:
            why += (f", and {problem.seq_len} keys pad to {key_tiles(problem.seq_len, 64) * 64} in them "
                    f"({key_tiles(problem.seq_len, 128) * 128} in 128-wide ones, the persistent walk's)")
    else:
        stages = 3 if problem.dim == 64 else 2
        why = (f"head dim 64, a long walk ({tiles}): 128-row blocks, each K/V tile read once per 128 queries, "
               f"{stages} K/V stages" if problem.dim == 64 else f"a query block walks {tiles}, too few for the FA3 "
               f"schedule's extra masked iteration to pay: the compiler's pipeline, 128-row blocks")
        cfg = dict(kind="pipelined", block_M=rows, block_N=128 if problem.seq_len > 64 else 64, num_stages=stages,
                   threads=2 * rows, fast_math=True)
    if problem.causal:
        cfg["heavy_first"] = True
        why += "; causal: the longest query blocks launch first"
    if rows == 64 and cfg["block_M"] == 64 and not cfg.get("blocks_per_sm"):
        why += (f"; 64-row query blocks: 128-row ones would fill only "
                f"{key_tiles(problem.seq_len, 128) * problem.heads * problem.batch} of {sms} SMs")
    return cfg, why


def branch(cfg: dict) -> str:
    """Which of hopper_config's branches a configuration comes from."""
    if cfg["kind"] in ("async", "persistent", "persistent_async"):
        return cfg["kind"]
    return {3: "tripled", 2: "paired"}.get(cfg.get("blocks_per_sm", 1), "grid")


def runner_up(problem: Problem, family: str, smem_budget: int, sms: int | None = None):
    """(configuration, why) the rule would choose were its pick's branch closed, or None: a close call's other
    side, which flash_attention times beside the pick for a user's problem. The thresholds between branches
    were measured on a few dozen problems; near them either side may win. Hopper only (elsewhere one
    schedule). From the last branch (128-row blocks), two 64-row blocks an SM; from those at head dim 64 (full),
    the same over PAIRED_WIDE_KEYS-wide key tiles."""
    if family != "hopper":
        return None
    pick, _ = choose_config(problem, family, smem_budget, sms)
    wide = dict(pick, block_N=PAIRED_WIDE_KEYS)
    fits = 2 * config_smem(wide, problem.dim) <= smem_budget  # both blocks of the SM
    if branch(pick) == "paired" and problem.dim == 64 and not problem.causal and fits:
        return wide, (f"the same two 64-row blocks an SM over {PAIRED_WIDE_KEYS}-wide key tiles: longer GEMMs a "
                      f"key step, fewer steps; level with 128-wide ones over the problems measured")
    cfg, why = hopper_config(problem, sms or DEFAULT_SMS, smem_budget, frozenset({branch(pick)}))
    if cfg == pick or config_smem(cfg, problem.dim) > smem_budget:
        return None
    return cfg, why


def choose_config(problem: Problem, family: str, smem_budget: int, sms: int | None = None) -> tuple[dict, str]:
    """The lesson kernel's configuration for a problem on a GPU, and why (one line for the learner)."""
    sms = sms or DEFAULT_SMS
    if family == "hopper":
        cfg, why = hopper_config(problem, sms, smem_budget)
        if config_smem(cfg, problem.dim) <= smem_budget:
            return cfg, why
    spills = ""
    for block_M, block_N, stages in OTHER_CANDIDATES:
        threads = 256 if block_M == 128 else 128
        if smem_estimate(problem.dim, block_M, block_N, stages) > smem_budget:
            continue
        if family != "hopper":
            if stages > 1 and problem.causal:
                continue  # tilelang 0.1.15: a cp.async pipeline over the clamped (data-dependent) bound fails codegen
            held = accumulators(problem.dim, block_M, block_N, threads)
            if held > (PIPELINED_MAX_ACCUMULATORS if stages > 1 else SINGLE_STAGE_MAX_ACCUMULATORS):
                spills = spills or (f"; {'2 stages' if stages > 1 else 'one stage'} of {block_M}x{block_N} tiles "
                                    f"would spill registers ({held} fp32 accumulators a thread)")
                continue
        why = (f"{'no wgmma here' if family != 'hopper' else 'little shared memory'}: the compiler's pipeline "
               f"with the largest tiles that fit {smem_budget // 1024} KiB of shared memory in "
               f"{'one stage' if stages == 1 else f'{stages} stages'}"
               + spills)
        return dict(kind="pipelined", block_M=block_M, block_N=block_N, num_stages=stages, threads=threads), why
    raise NoTileFits(f"flash_attention: no tile configuration fits {smem_budget} bytes of shared memory "
                     f"for head dim {problem.dim}")


class NoTileFits(SectionSkip, ValueError):
    """No kernel of the lesson fits this GPU's shared memory for the problem: the section skips, saying so."""


def pass_configs(cfg: dict) -> dict:
    """What a configuration compiles with: TileLang's fast math (exp2 as ex2.approx) where it asks for it."""
    import tilelang

    return {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} if cfg.get("fast_math") else {}


WORDS = {"pipelined": "compiler pipeline", "async": "FA3 async wgmma", "ws": "hand-written warp specialization",
         "persistent": "persistent", "persistent_async": "persistent, FA3 async wgmma",
         "split_tail": "last wave split along the keys", "heavy_first": "heaviest first",
         "stage_output": "O stored by TMA", "fast_math": "fast math"}


def describe(cfg: dict) -> list:
    """Table cells: tiles, stages, threads, schedule."""
    notes = [WORDS[cfg["kind"]]] + [word for key, word in WORDS.items() if cfg.get(key) is True]
    if cfg.get("blocks_per_sm", 1) > 1:
        notes.insert(1, f"{cfg['blocks_per_sm']} blocks per SM")
    if cfg.get("workers"):
        notes.insert(1, f"{cfg['workers']} blocks")
    return [f"{cfg['block_M']}x{cfg['block_N']}", cfg["num_stages"], cfg["threads"], ", ".join(notes)]

