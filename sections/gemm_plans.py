"""The GEMM's schedules, and the rules that choose one for a problem (imported by the GEMM lessons).

A schedule (`GemmConfig`) is a handful of numbers: the block_M x block_N tile of C a block owns, the block_K
step of its K loop, the pipeline stages, the threads, the L2 swizzle, and split_k: how many blocks share one
tile's K loop (each writes an fp32 partial; a second small kernel adds them up, `splitk_reduce_program`).

`choose_schedule(M, N, K, family, sm_count, smem_budget)` picks one for a problem with a cost model a reader
can redo by hand: for each candidate tile (and split of K) count the blocks, the waves they take on the SMs,
and the time a block needs (its tensor-core work, or its loads if they take longer), against the time the
whole problem needs to stream its operands from memory; the least estimate wins. Big problems get the big
128x256 tile; problems whose few big tiles would leave SMs idle, smaller tiles and a split K.

Rows that are not 16-byte aligned (N or K not a multiple of 8 two-byte elements: TMA descriptors and 16-byte
cp.async need aligned rows) run on zero-padded copies of A and B (`GemmLauncher`, timed with the kernel);
the zeros add nothing to the sums, and C comes back out of a padded buffer. Where the copies would cost more
than what masking takes (`plan_problem`), T.copy loads the rows as they are, masked: plain loads, a round trip a
K step (`masked_seconds`), in tiles whose accumulators leave room for them (`masked_tile_fits`).
On Hopper, large problems whose rows of B start off 32-byte sectors (N not a multiple of 16) copy B into rows
of whole 128-byte lines first (`pads_b`): TMA loads such rows slower, and the copy costs less than that; and A
of one or two rows (up to 8 where rows are unaligned) runs on the CUDA cores (`sections/gemm_rows.py`), timed
beside the tensor-core plan (`rivals`).
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import dataclass, replace

import tilelang
import tilelang.language as T

from sections.gemm_epilogue import ACTIVATIONS, epilogue_pass_configs, splitk_reduce_program, sums_in_kernel
from sections.gemm_launch import PART_THREADS, GemmLauncher, gemm_prim_func, pad_rows_program  # noqa: F401  (imported from here too)
from sections.gemm_rows import (ROWS_REDUCE_COLUMNS, RowsConfig, rows_program, rows_reason, rows_schedule,
                                takes_rows)

WARP_POLICIES = ("Square", "FullRow", "FullCol")
DTYPES = ("float16", "bfloat16")
ALIGN = 8  # elements of a 16-byte row segment (2-byte types)
LINE = 64  # elements of a 128-byte line: B's padded copy has rows of whole lines (GemmPlan.pad_b)
SECTOR = 16  # elements of a 32-byte sector: B's rows starting off sectors (N % 16) load slower through TMA
PRODUCER_REGISTERS = 24  # a thread of the TMA producer warpgroup (Hopper warp specialization)


@dataclass(frozen=True)
class GemmConfig:
    """One schedule: tile, stages, threads, swizzle (panel: tile rows), T.GemmWarpPolicy, C through shared,
    split_k (blocks sharing one tile's K loop; 1: none), warp_specialized (Hopper: TileLang's TMA producer
    warpgroup; False: every thread issues cp.async and the block takes only the registers it needs), persistent
    (that many blocks, one an SM, walk the tiles in one pipelined loop; 0: one block a tile)."""

    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    swizzle: bool
    panel: int = 10
    policy: str = "Square"
    staged_store: bool = True
    split_k: int = 1
    warp_specialized: bool = True
    persistent: int = 0
    last_adds: bool = False

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """An upper bound of the kernel's shared memory: `num_stages` copies of the A and B tiles, or the C tile
        staging the store if larger (it reuses the A/B buffers once the K loop ends; fp32 partials with a
        split K), a bias tile, alignment."""
        pipeline = max(1, self.num_stages) * (self.block_M * self.block_K + self.block_K * self.block_N) * dtype_bytes
        c_bytes = 4 if self.split_k > 1 else dtype_bytes
        c_tile = self.block_M * self.block_N * c_bytes if self.staged_store else 0
        # A persistent block loads its next tile during its store: C cannot reuse the A/B buffers.
        both = pipeline + c_tile if self.persistent else max(pipeline, c_tile)
        return both + self.block_N * dtype_bytes + (2048 if self.persistent else 1024)  # alignment

    def columns(self) -> dict:
        """The schedule as the table shows it."""
        split = self.split_words()
        return {"kernel": "T.Pipelined", "tile": f"{self.block_M}x{self.block_N}x{self.block_K}",
                "stages": self.num_stages, "threads": self.threads,
                "swizzle": f"panel {self.panel}" if self.swizzle else "off",
                "policy": self.policy_words() + split}

    def policy_words(self) -> str:
        """The warp policy, with the store and the producer warpgroup where they differ from the default."""
        return (self.policy + ("" if self.staged_store else ", direct store")
                + ("" if self.warp_specialized else ", no producer warpgroup")
                + (f", persistent on {self.persistent} SMs" if self.persistent else ""))

    def label(self) -> str:
        c = self.columns()
        policy = self.policy_words()
        return (f"{c['kernel']} {c['tile']}, {c['stages']} stages, {c['threads']} threads, swizzle {c['swizzle']}"
                + (f", {policy}" if policy != "Square" else "") + self.split_words())

    def split_words(self) -> str:
        return (f", K split {self.split_k}" + (" added by the last to arrive" if self.last_adds else "")
                if self.split_k > 1 else "")


LESSON_CONFIGS = (GemmConfig, RowsConfig)  # the lessons' kernels; other configs are the appendix's (sections/hopper/)


def gemm_pass_configs(config, activation: str | None = None) -> dict:
    """What a schedule compiles with: the epilogue's fast math; without warp specialization, the pass config
    that turns off TileLang's producer warpgroup."""
    configs = epilogue_pass_configs(activation)
    if not getattr(config, "warp_specialized", True):
        configs = {**configs, tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}
    return configs


def fits(config, smem_budget: int) -> bool:
    """Whether a schedule's shared memory fits what one block may use on the device."""
    return config.smem_bytes() <= smem_budget


def gemm_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def gemm_bytes(M: int, N: int, K: int, bias: bool = False) -> int:
    """What a 2-byte GEMM must move at least: A and B (and the bias) read once, C written once."""
    return 2 * (M * K + K * N + M * N + (N if bias else 0))


def lesson_schedules(family: str) -> list[GemmConfig]:
    """The lesson's schedules for an architecture family: the default first, then neighbours, most of them
    changing one knob. The section's headline kernel is whichever of them is fastest in the same run."""
    if family == "hopper":
        return [
            GemmConfig(128, 256, 64, 4, 256, True),  # two consumer warpgroups share a 128x256 tile
            GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol"),  # three: 256x64 column strips
            GemmConfig(128, 256, 64, 3, 256, True),   # one stage less: less latency hidden
            GemmConfig(128, 256, 64, 4, 256, False),  # no L2 swizzle
        ]
    if family in ("ampere", "ada"):
        return [GemmConfig(128, 256, 32, 3, 256, True), GemmConfig(128, 128, 32, 4, 256, True),
                GemmConfig(128, 256, 32, 3, 256, False), GemmConfig(64, 128, 32, 4, 128, True)]
    if family == "turing":
        return [GemmConfig(128, 128, 32, 2, 128, True), GemmConfig(128, 128, 32, 2, 256, True),
                GemmConfig(128, 128, 32, 2, 128, False), GemmConfig(64, 128, 32, 2, 128, True)]
    raise ValueError(f"no GEMM schedules for architecture family {family!r}")


def consumer_registers(threads: int) -> int:
    """Registers a consumer thread may take (setmaxnreg) beside one producer warpgroup: 65536 shared out."""
    return min(240, (65536 - 128 * PRODUCER_REGISTERS) // threads // 8 * 8)


def wave_traffic(M: int, N: int, K: int, config, wave: int = 132, dtype_bytes: int = 2) -> tuple[int, int]:
    """Bytes of A and B one wave of `wave` blocks reads from memory, launched row by row and swizzled:
    each tile row reads a block_M x K panel of A, each tile column a K x block_N panel of B."""
    m_tiles, n_tiles = -(-M // config.block_M), -(-N // config.block_N)

    def traffic(rows: int, cols: int) -> int:
        return (rows * config.block_M + cols * config.block_N) * K * dtype_bytes

    rows = min(m_tiles, config.panel)
    return traffic(-(-wave // n_tiles), min(wave, n_tiles)), traffic(rows, min(n_tiles, -(-wave // rows)))


# ---- The rule ------------------------------------------------------------------------------------------

# The candidate tiles per family: the lesson's own first (the rule's explanations compare against it), then
# the rest biggest first; small tiles take more stages (bytes in flight decide where operands stream). FullRow
# gives a consumer warpgroup whole rows: a 128x128 tile's two issue 64x128 wgmmas, not Square's 64x64 pairs.
CANDIDATES = {
    "hopper": [GemmConfig(128, 256, 64, 4, 256, True),
               GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol"),  # three consumer warpgroups
               GemmConfig(192, 192, 64, 4, 384, True, policy="FullRow"),
               GemmConfig(256, 128, 64, 4, 256, True, policy="FullRow"),  # tall and narrow: see candidate_schedules
               GemmConfig(128, 192, 64, 4, 256, True, policy="FullRow"),
               GemmConfig(192, 96, 64, 4, 384, True, policy="FullRow"),  # one wave only: see ONE_WAVE_TILES
               GemmConfig(128, 128, 64, 5, 256, True, policy="FullRow"), GemmConfig(64, 256, 64, 4, 128, True),
               GemmConfig(256, 64, 64, 4, 256, True, policy="FullRow"),  # tall and narrow
               GemmConfig(64, 128, 64, 6, 128, True), GemmConfig(64, 64, 64, 8, 128, True)],
    "ampere": [GemmConfig(128, 256, 32, 3, 256, True), GemmConfig(128, 128, 32, 4, 256, True),
               GemmConfig(64, 128, 32, 4, 128, True), GemmConfig(64, 64, 32, 6, 128, True)],
    "turing": [GemmConfig(128, 128, 32, 2, 128, True), GemmConfig(64, 128, 32, 2, 128, True),
               GemmConfig(64, 64, 32, 3, 128, True)],
}
CANDIDATES["ada"] = CANDIDATES["ampere"]
# Hopper, a plain GEMM of more of the lesson's 128x256 tiles than SMs: one block an SM walks them (`persistent`:
# the SM count), each tile's first loads in flight during the last one's store; a candidate for the cost model
# like the rest. The C tile cannot reuse the ring, so a stage fewer. Not with an epilogue: the bias tile,
# staged inside the loop, makes the consumers synchronize at every K step. Only over aligned rows: with N and
# K both unaligned, its masked copies fail in TileLang's code generator.
PERSISTENT = GemmConfig(128, 256, 64, 3, 256, True)
# Three 64x96 consumer warp groups: three quarters of a 128x192 tile's work, for problems it divides into one
# wave (1536^3: 128 of these fill 132 SMs, where 96 of 128x192 leave 36 idle). Its short MMAs and operand bytes
# per FLOP lose once a second wave is needed, and so did grids with partial edge tiles of it (BENCHMARKS.md).
ONE_WAVE_TILES = {(192, 96)}
# Rows loaded masked with one of N and K off 16 bytes: TileLang's producer for the masked copies is as large as
# the consumers, and with three consumer warpgroups (768 threads, 80 registers each at launch) the consumers'
# register raise to 160 asks more than the SM holds (it would wait forever) or ptxas refuses their wgmma. So
# masked plans take tiles of two consumer warpgroups at most, and with that producer every thread gets 65536 /
# (2 x threads) registers: a tile whose fp32 accumulators and the ~40 more a thread needs do not fit spills
# (ptxas -v: 128x256 and 128x192 at 128 registers) and runs at half speed or worse. The same holds without the
# producer (short loops), where two blocks are to share an SM. With both N and K off there is no producer and
# the consumers may take 255, but the 128x192 tile's masked copies spill even then (ptxas -v).
MASKED_MAX_THREADS = 256
MASKED_REGISTERS_BESIDE = 40
MASKED_SPILLS_ALONE = {(128, 192)}


def masked_tile_fits(config, family: str, N: int, K: int) -> bool:
    """Can a tile load the rows of an N x K problem masked without spilling? (see MASKED_MAX_THREADS)"""
    if family != "hopper":
        return True
    alone = config.warp_specialized and N % ALIGN and K % ALIGN  # no producer beside the consumers
    room = min(255, 65536 // (config.threads if alone else 2 * config.threads))
    tile = (config.block_M, config.block_N)
    return (config.threads <= MASKED_MAX_THREADS and config.block_M * config.block_N // config.threads
            + MASKED_REGISTERS_BESIDE <= room and not (alone and tile in MASKED_SPILLS_ALONE))


def loading_masked(config, family: str):
    """A schedule as built to load its rows masked. Off Hopper, without TileLang's producer warps: where it has
    TMA but no register split (Blackwell), a producer for masked copies is as large as the consumers and halves
    their registers (the 128x256 tile spills); there every thread copies instead, as on Ampere."""
    return config if family == "hopper" else replace(config, warp_specialized=False)


# Masked copies are plain loads through registers, not TMA or cp.async running ahead of the MMAs: a K step of
# such a block takes about a memory round trip however little it computes, so a masked plan takes at least its
# waves x K steps of that (`masked_seconds`). Fitted to masked plans of few rows timed beside padded ones
# on Hopper (`bench/gemm_shapes_probe.py`, its "nopad" rows); it favours K splits of shorter loops.
MASKED_STEP = 1.2e-6
# A problem of at most this many rows (one or two tiles of M) streams B once: its time is the K loop's, and a
# masked plan costs its steps' round trips more. Taller problems are costed as before: a masked plan up to
# twice the padded one's GEMM.
STREAMING_ROWS = 256
SPLITS = (1, 2, 3, 4, 6, 8)  # K splits tried where a problem's tiles leave SMs idle (more lost: BENCHMARKS.md)
# A block whose K loop is this short has little to pipeline: its time goes to the first loads and the store.
# On Hopper TileLang's producer warpgroup and its register split keep one block per SM, so those wait alone.
# Compiled without warp specialization (every thread issues cp.async), a block of up to 256 threads takes
# only the registers it needs and two or more share an SM: one's loads and store beside the other's MMAs.
# Longer loops want the TMA pipeline (BENCHMARKS.md has the readings on both sides of the threshold).
SHORT_LOOP_STEPS = 2
MAX_GRID_Y = 65535  # CUDA's limit on a grid's y (and z) axis; x takes 2^31 - 1


@dataclass(frozen=True)
class Machine:
    """What the cost model knows of a GPU family, per SM: dense tensor-core FLOP/s the biggest tile sustains,
    bytes/s one SM's loads can take; the whole GPU's memory bandwidth; fixed costs."""

    flops_per_sm: float
    load_per_sm: float
    memory: float
    block_overhead: float = 3e-6  # a block's prologue (the first loads in flight) and epilogue (the store)
    first_loads: float = 1.2e-6  # the part of it a persistent block hides, its next tile's loads beside the store
    launch: float = 4e-6  # one kernel launch, as the timing sees it


# Fitted to timings of the candidates on an H200 (bench/gemm_shapes_probe.py); the other families scaled by
# their tensor-core rate and bandwidth. Only the ranking of candidates matters to the rule.
MACHINES = {"hopper": Machine(5.4e12, 100e9, 3.2e12), "ampere": Machine(2.3e12, 60e9, 1.5e12),
            "ada": Machine(1.2e12, 50e9, 0.8e12), "turing": Machine(0.5e12, 40e9, 0.5e12)}
MEMORY_LATENCY = 1.8e-6  # a load's round trip under load: bytes in flight / latency bounds a block's stream
# A tile's tensor-core rate per FLOP against the 128x256 tile's, fitted to timed waves: smaller tiles issue
# shorter MMAs and read more operand bytes per FLOP. Three consumer warpgroups (256x192: 256x64 strips; 192x192,
# 192x96: 64-row strips) keep the SM as busy as two with more of C per block: fewer blocks, whole waves.
TILE_EFFICIENCY = {(128, 256): 1.0, (256, 192): 1.02, (192, 192): 0.92, (128, 192): 0.8, (128, 128): 0.85,
                   (192, 96): 0.73, (64, 256): 0.82, (64, 128): 0.62, (64, 64): 0.45, (256, 128): 0.85, (256, 64): 0.6}


def tile_efficiency(config: GemmConfig) -> float:
    return TILE_EFFICIENCY.get((config.block_M, config.block_N), 0.5)


def k_steps(K: int, config: GemmConfig) -> int:
    """K-loop steps of one block: the K range split into split_k equal runs of whole block_K steps."""
    return -(-(-(-K // config.block_K)) // config.split_k)


def registers_per_thread(config: GemmConfig, family: str) -> int:
    """What ptxas gives a thread of the lesson's kernel (its compile reports). Hopper: TileLang adds a producer
    warpgroup and the kernel asks for no resident-block minimum, so ptxas takes all that one block's
    launch bounds allow; without warp specialization, the accumulators plus 26 (sm_90a compile reports).
    Elsewhere: the fp32 accumulators plus about 72 (addresses, A and B fragments)."""
    if family == "hopper":
        if not config.warp_specialized:
            return config.block_M * config.block_N // config.threads + 26
        return 65536 // (config.threads + 128) // 8 * 8
    return min(255, config.block_M * config.block_N // config.threads + 72)


def blocks_per_sm(config: GemmConfig, smem_budget: int, family: str) -> int:
    """Blocks that share an SM (two at most in the model): shared memory, threads and registers allowing."""
    launched = config.threads + (128 if family == "hopper" and config.warp_specialized else 0)
    by_registers = 65536 // (launched * registers_per_thread(config, family))
    return max(1, min(2, smem_budget // config.smem_bytes(), 1024 // config.threads, by_registers))


def estimate_seconds(M: int, N: int, K: int, config: GemmConfig, family: str, sm_count: int,
                     smem_budget: int) -> float:
    """The cost model: waves of blocks x the time of a wave, or streaming the operands from memory once,
    whichever is longer; plus the launch and, with a split K, the fp32 partials' round trip and a second launch.
    A block's time is its tensor-core work or its loads, whichever is longer; the loads of one SM are capped
    by what it takes per second and by the bytes its pipelines keep in flight (stages - 1 tiles each)."""
    machine = MACHINES[family]
    if config.persistent:
        # As the plain grid of its tile with the stage its C tile takes back (the ring runs on from tile to
        # tile: measured no slower), less the first loads of every tile a block walks after its first.
        plain = replace(config, persistent=0, num_stages=config.num_stages + 1)
        rounds = -(-(-(-M // config.block_M) * -(-N // config.block_N)) // config.persistent)
        return estimate_seconds(M, N, K, plain, family, sm_count, 1 << 30) - (rounds - 1) * machine.first_loads
    blocks = -(-M // config.block_M) * -(-N // config.block_N) * config.split_k
    together = min(blocks_per_sm(config, smem_budget, family), -(-blocks // sm_count))  # blocks sharing an SM in a wave
    waves = -(-blocks // (sm_count * together))
    depth = k_steps(K, config) * config.block_K
    in_flight = (config.num_stages - 1) * (config.block_M + config.block_N) * config.block_K * 2
    stream = min(machine.load_per_sm, together * in_flight / MEMORY_LATENCY)
    math_s = 2 * config.block_M * config.block_N * depth / (machine.flops_per_sm * tile_efficiency(config))
    load_s = depth * (config.block_M + config.block_N) * 2 / stream
    wave_s = together * max(math_s, load_s) + machine.block_overhead
    memory_s = (M * K + K * N + M * N) * 2 / machine.memory
    total = max(waves * wave_s, memory_s) + machine.launch
    if config.split_k > 1:  # the partials' round trip, and the reduction's launch unless the last block adds them
        total += 2 * config.split_k * M * N * 4 / machine.memory + (0 if config.last_adds else machine.launch)
    return total


def masked_seconds(M: int, N: int, K: int, config: GemmConfig, family: str, sm_count: int,
                   smem_budget: int) -> float:
    """The cost model for a plan that loads its rows masked: at least a round trip a K step (MASKED_STEP; measured
    on Hopper only: elsewhere the plain estimate)."""
    if family != "hopper":
        return estimate_seconds(M, N, K, config, family, sm_count, smem_budget)
    blocks = -(-M // config.block_M) * -(-N // config.block_N) * config.split_k
    together = min(blocks_per_sm(config, smem_budget, family), -(-blocks // sm_count))
    steps = -(-blocks // (sm_count * together)) * together * k_steps(K, config)
    return max(estimate_seconds(M, N, K, config, family, sm_count, smem_budget),
               steps * MASKED_STEP + MACHINES[family].launch)


def fitted_to_k(config: GemmConfig, K: int) -> GemmConfig:
    """A short K loop wants a short pipeline: no more stages than K steps (the extra buffers only cost shared
    memory a launch must set aside), and no K step wider than a small K (a 64-wide step of K = 5 multiplies
    59 columns of zeros)."""
    if K <= 32 < config.block_K:
        config = replace(config, block_K=32)
    if config.persistent:  # its pipeline runs on from one tile's K loop into the next's
        return config
    steps = -(-K // config.block_K)
    return replace(config, num_stages=max(2, min(config.num_stages, steps)))


def candidate_schedules(M: int, N: int, K: int, family: str, sm_count: int, smem_budget: int,
                        epilogue: bool = False, masked: bool = False) -> list[GemmConfig]:
    """Every candidate tile that fits (fewer stages if it must; 64 rows tall at most when M is; see ONE_WAVE_TILES),
    each with every split of K that leaves a split at least 4 steps deep and makes at most two waves of blocks;
    the persistent walk where it applies (see PERSISTENT). `masked`: rows loaded masked (see MASKED_MAX_THREADS)."""
    out = []
    for base in CANDIDATES[family]:
        base = fitted_to_k(base, K)
        while not fits(base, smem_budget) and base.num_stages > 2:  # a smaller GPU of the family: fewer stages
            base = replace(base, num_stages=base.num_stages - 1)
        if not fits(base, smem_budget) or (M <= 64 < base.block_M and any(c.block_M <= 64 for c in CANDIDATES[family])):
            continue  # a tile twice as tall as the whole problem would only multiply zeros
        tiles = -(-M // base.block_M) * -(-N // base.block_N)
        if (base.block_M, base.block_N) in ONE_WAVE_TILES:
            wanted = M % base.block_M == 0 and N % base.block_N == 0 and tiles <= sm_count
        else:  # a tall narrow tile is for a problem no wider than one, where wider tiles multiply zero columns
            wanted = not (base.block_M >= 2 * base.block_N and N > base.block_N)
        if not wanted:
            continue
        steps = -(-K // base.block_K)
        if masked and not masked_tile_fits(base, family, N, K):
            continue
        # Three-warpgroup tiles are there to make whole waves of whole K loops: no split (one split of them
        # measured behind the unsplit 128x192 tile it was to replace).
        for split in SPLITS if base.threads <= 256 else (1,):
            if split == 1 or (steps // split >= 4 and tiles * split <= 2 * sm_count):
                config = replace(base, split_k=split)
                if fits(config, smem_budget):
                    out.append(config)
        if family == "hopper" and steps <= SHORT_LOOP_STEPS and base.threads <= 256:
            out.append(replace(base, warp_specialized=False))  # after the warp-specialized one: see SHORT_LOOP_STEPS
    walk = persistent_schedule(M, N, K, family, sm_count, smem_budget, epilogue)
    return out + ([walk] if walk else [])


def persistent_schedule(M: int, N: int, K: int, family: str, sm_count: int, smem_budget: int, epilogue: bool):
    """The persistent schedule where it is a candidate (see PERSISTENT), else None."""
    config, tiles = replace(PERSISTENT, persistent=sm_count), -(-M // PERSISTENT.block_M) * -(-N // PERSISTENT.block_N)
    fit = family == "hopper" and not epilogue and M >= config.block_M and N >= config.block_N  # tiles not mostly zeros
    aligned_rows = N % ALIGN == 0 and K % ALIGN == 0
    return config if fit and aligned_rows and fits(config, smem_budget) and tiles > sm_count else None


def choose_schedule(M: int, N: int, K: int, family: str, sm_count: int, smem_budget: int, epilogue: bool = False,
                    masked: bool = False):
    """(GemmConfig, reason): the candidate with the least estimated time (see `estimate_seconds`)."""
    options = candidate_schedules(M, N, K, family, sm_count, smem_budget, epilogue, masked)
    if not options:
        raise ValueError(f"no GEMM tile fits the {smem_budget} B of shared memory a block may use")
    cost = masked_seconds if masked else estimate_seconds
    times = [cost(M, N, K, c, family, sm_count, smem_budget) for c in options]
    # Equal estimates (a problem too small or too memory-bound for the tile to matter): the fewest multiplied
    # zeros (tiles x tile area: 32768x64 in 256x64 tiles, not 128x128 ones), then the smaller tile.
    def padded_area(c):
        return -(-M // c.block_M) * c.block_M * -(-N // c.block_N) * c.block_N

    order = sorted(range(len(options)), key=lambda i: (round(times[i], 9), padded_area(options[i]),
                                                       options[i].block_M * options[i].block_N, i))
    pick = replace(options[order[0]], last_adds=sums_in_kernel(M, N, options[order[0]]))
    return pick, explain(M, N, K, pick, times[order[0]], options, times, sm_count, smem_budget, family)


def neighbours(plan, family: str, sm_count: int, smem_budget: int, epilogue: bool = False) -> list[GemmConfig]:
    """What a plan's pick is timed beside: the best estimate with another tile, and the lesson's default."""
    M, N, K = plan.kernel_shape
    masked = not plan.pad and bool(N % ALIGN or K % ALIGN)
    others = [c for c in candidate_schedules(M, N, K, family, sm_count, smem_budget, epilogue, masked)
              if (c.block_M, c.block_N) != (plan.config.block_M, plan.config.block_N)]
    cost = masked_seconds if masked else estimate_seconds
    runner_up = min(others, key=lambda c: cost(M, N, K, c, family, sm_count, smem_budget), default=None)
    runner_up = runner_up and replace(runner_up, last_adds=sums_in_kernel(M, N, runner_up))  # as the rule would run it
    configs = [c for c in (runner_up, lesson_schedules(family)[0]) if c is not None and fits(c, smem_budget)
               and (not masked or masked_tile_fits(c, family, N, K))]
    configs = [loading_masked(c, family) for c in configs] if masked else configs
    return [c for i, c in enumerate(configs) if c != plan.config and c not in configs[:i]]


def rivals(plan, family: str, sm_count: int, smem_budget: int, epilogue: bool = False) -> list:
    """The plans --shape times beside the rule's (the fastest is the problem's): its `neighbours`, and the
    same schedule without B's padded copy; beside a few-rows plan, the tensor-core plan."""
    if isinstance(plan.config, RowsConfig):
        return [replace(tensor_core_plan(plan.M, plan.N, plan.K, family, sm_count, smem_budget, plan.dtype, epilogue),
                        reason="")]
    others = [replace(plan, config=c, reason="") for c in neighbours(plan, family, sm_count, smem_budget, epilogue)]
    return others + [replace(plan, pad_b=False, reason="")] * plan.pad_b


def explain(M, N, K, pick, pick_s, options, times, sm_count, smem_budget, family) -> str:
    """One or two lines: the blocks the pick makes against the SMs; what the lesson's tile (or, when the pick
    is the lesson's tile, the next best candidate) would make and take."""
    def said(c):
        blocks = -(-M // c.block_M) * -(-N // c.block_N) * c.split_k
        split = (f" with K split {c.split_k} ways ({k_steps(K, c)} steps each"
                 + (", added by each tile's last block" if c.last_adds else "") + ")") if c.split_k > 1 else ""
        waves = blocks / (sm_count * blocks_per_sm(c, smem_budget, family))
        if c.persistent:
            return f"{c.block_M}x{c.block_N} tiles: {blocks} walked by {sm_count} persistent blocks ({waves:.2f} each)"
        return f"{c.block_M}x{c.block_N} tiles{split}: {blocks} blocks on {sm_count} SMs ({waves:.2f} waves)"

    lesson = options[0]
    blocks = -(-M // pick.block_M) * -(-N // pick.block_N) * pick.split_k
    together = min(blocks_per_sm(pick, smem_budget, family), -(-blocks // sm_count))
    if pick.persistent:
        other = min((i for i, c in enumerate(options) if not c.persistent), key=lambda i: times[i])
        why = "one block an SM walks its tiles, each tile's first loads in flight during the last one's store"
    elif not pick.warp_specialized and together > 1:
        other = min((i for i, c in enumerate(options) if c.warp_specialized), key=lambda i: times[i], default=None)
        why = (f"a {k_steps(K, pick)}-step K loop has little to pipeline; without the producer warpgroup "
               f"{together} blocks share an SM, one's loads and store beside another's MMAs")
    elif pick == lesson:
        other = min((i for i, c in enumerate(options) if c != pick), key=lambda i: times[i], default=None)
        first = CANDIDATES[family][0]
        why = ("the lesson's tile" if (pick.block_M, pick.block_N) == (first.block_M, first.block_N) else
               "the largest tile allowed here") + ": its waves and rate come out best here"
    else:
        other, blocks = 0, -(-M // lesson.block_M) * -(-N // lesson.block_N)
        waves, picked = blocks / sm_count, -(-M // pick.block_M) * -(-N // pick.block_N) * pick.split_k
        why = ("as few blocks: at this size the launch and latency count, and a smaller tile wastes less"
               if blocks * lesson.split_k == picked else
               "too few blocks for the SMs" if blocks < sm_count else
               f"its last wave would run {100 * (1 - waves % 1):.0f}% empty" if 0 < waves % 1 < 0.75 and waves < 4 else
               "it streams fewer bytes per SM" if M <= 64 else
               f"{blocks / picked:.1f}x the blocks, each paying its start and store"
               if waves >= 4 and blocks >= 1.5 * picked else "it costs more per FLOP here")
    line = f"{said(pick)}, estimated {pick_s * 1e6:.0f} us"
    if other is None:
        return line
    return f"{line}; {said(options[other])} would take {times[other] * 1e6:.0f} us ({why})"


# ---- The problem, padded where its rows are not 16-byte aligned ----------------------------------------


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def check_problem(M: int, N: int, K: int, activation, dtype: str, aligned_rows: bool = True) -> None:
    """Sizes any of the GEMM kernels can take (tails in M, N and K are fine). aligned_rows: rows must be
    16-byte aligned (the appendix's TMA kernels); the lesson's kernel takes any (T.copy then loads with
    narrower, masked copies instead of TMA)."""
    for name, value in (("M", M), ("N", N), ("K", K)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"GEMM size {name}={value!r} must be a positive integer")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if dtype not in DTYPES:
        raise ValueError(f"GEMM dtype {dtype!r} is not one of {DTYPES}")
    # Rows of A (K elements) and of B and C (N elements) must start 16-byte aligned: TMA descriptors and
    # vectorized copies need it. GemmLauncher pads other problems.
    if aligned_rows and (K % ALIGN or N % ALIGN):
        raise ValueError(f"GEMM with N={N}, K={K}: rows must be multiples of 16 bytes (N and K multiples of "
                         f"{ALIGN}); pad the operands (GemmLauncher does)")


@dataclass(frozen=True)
class GemmPlan:
    """A user's problem and the schedule chosen for it; the kernels run at the aligned sizes (N and K rounded
    up to multiples of 8) when the problem's own are not."""

    M: int
    N: int
    K: int
    config: GemmConfig
    dtype: str = "float16"
    reason: str = ""
    pad: bool = True  # unaligned rows: run on zero-padded copies (False: the kernel loads them masked)
    pad_b: bool = False  # B copied into rows of whole 128-byte lines first (`b_width` columns; see LINE)

    def __post_init__(self):
        if self.pad_b and not self.pad:
            raise ValueError("pad_b copies B into whole lines: a plan that loads its rows masked (pad=False) has none")

    @property
    def padded(self) -> bool:
        return self.pad and (self.N, self.K) != (aligned(self.N), aligned(self.K))

    @property
    def kernel_shape(self) -> tuple[int, int, int]:
        return (self.M, aligned(self.N), aligned(self.K)) if self.pad else (self.M, self.N, self.K)

    @property
    def b_width(self) -> int:
        """Columns of the B the kernel reads: N, or with pad_b N rounded up to whole 128-byte lines."""
        n = self.kernel_shape[1]
        return -(-n // LINE) * LINE if self.pad_b else n

    @property
    def c_width(self) -> int:
        """Columns of the C the plan's last kernel writes: the kernel's N, but with a split K the problem's own N
        (the sum's plain stores take rows of any width, so no padded C is copied out)."""
        return self.N if getattr(self.config, "split_k", 1) > 1 else self.kernel_shape[1]

    def label(self) -> str:
        """The schedule's label, and B's padded copy where the plan makes one."""
        return self.config.label() + (f", B copied into rows of {self.b_width}" if self.pad_b else "")

    @property
    def copies_b(self) -> bool:
        """B copied by the plan's own program first (pad_rows_program): into rows of whole lines (pad_b), or into
        the zero-padded B of the kernel's aligned sizes, which the program writes faster than torch's copy_."""
        return self.pad_b or self.padded

    @property
    def parts(self) -> tuple[str, ...]:
        """The plan's programs, in the order a call runs them: B's padded copy, the GEMM, the split-K sum."""
        separate_sum = getattr(self.config, "split_k", 1) > 1 and not getattr(self.config, "last_adds", False)
        return (("pad_b",) if self.copies_b else ()) + ("gemm",) + (("reduce",) if separate_sum else ())

    def markers(self, family_markers) -> tuple:
        """What the GEMM's CUDA must contain: the family's markers; only its tensor-core instruction where the
        rows are loaded masked (no TMA, no cp.async of whole 16-byte segments)."""
        _, N, K = self.kernel_shape
        masked = N % ALIGN or K % ALIGN
        if isinstance(self.config, RowsConfig):  # plain loads and FMAs: nothing to look for
            return ()
        if not getattr(self.config, "warp_specialized", True) and "wgmma" in family_markers:  # Hopper, no producer
            return ("wgmma",) + (() if masked else ("cp_async",))  # cp.async, no TMA
        return tuple(m for m in family_markers if not masked or m in ("wgmma", "mma_sync"))

    def pass_configs(self, part: str, activation=None) -> dict:
        """What the plan's program `part` compiles with: the GEMM its schedule's (`gemm_pass_configs`), the
        split-K reduction, which applies the epilogue, the epilogue's."""
        return gemm_pass_configs(self.config, activation) if part == "gemm" else epilogue_pass_configs(activation)

    def programs(self, bias: bool = False, activation=None) -> dict:
        """{"gemm": prim_func}; with copies_b, {"pad_b": prim_func} first; with a split K, {"reduce": prim_func}
        last (unless each tile's last block adds them, `last_adds`): what the launcher runs, in order."""
        M, N, K = self.kernel_shape
        out = {"pad_b": pad_rows_program(self.K, self.N, K, self.b_width, self.dtype)} if self.copies_b else {}
        if isinstance(self.config, RowsConfig):  # a few rows on the CUDA cores (sections/gemm_rows.py)
            out["gemm"] = rows_program(M, N, K, self.config, bias=bias, activation=activation, dtype=self.dtype)
            if "reduce" in self.parts:
                out["reduce"] = splitk_reduce_program(M, N, self.config.split_k, bias=bias, activation=activation,
                                                      dtype=self.dtype, tile=(M, ROWS_REDUCE_COLUMNS), unroll=True)
            return out
        if not isinstance(self.config, GemmConfig):  # an appendix kernel (sections/hopper/): its own builder
            from sections.hopper import gemm_pingpong, gemm_ws

            module = gemm_ws if isinstance(self.config, gemm_ws.WsConfig) else gemm_pingpong
            out["gemm"] = module.appendix_program(M, N, K, self.config, bias=bias, activation=activation,
                                                  dtype=self.dtype, b_cols=self.b_width)
            return out
        from sections.gemm_schedules import gemm_program  # the lesson's kernel (it imports this module)

        in_kernel = "reduce" not in self.parts  # the epilogue in the GEMM, not in the split-K reduction
        out["gemm"] = gemm_program(M, N, K, self.config, bias=bias and in_kernel,
                                   activation=activation if in_kernel else None, dtype=self.dtype, b_cols=self.b_width,
                                   c_cols=self.c_width)
        if not in_kernel:
            out["reduce"] = splitk_reduce_program(M, N, self.config.split_k, bias=bias, activation=activation,
                                                  dtype=self.dtype, c_cols=self.c_width)
        return out

    def describe(self) -> str:
        pad = (f"; run at {self.M}x{aligned(self.N)}x{aligned(self.K)} on zero-padded copies ("
               f"{unaligned_rows(self.N, self.K)})" if self.padded else "")
        if self.pad_b:
            pad += (f"; B copied into rows of {self.b_width} columns first: rows of {self.N} two-byte elements "
                    f"start off 32-byte sectors, which TMA loads slower")
        rows = -(-self.M // self.config.block_M)
        tall = (f"; its {rows} rows of tiles run along the grid's x axis (y takes at most {MAX_GRID_Y})"
                if rows > MAX_GRID_Y and isinstance(self.config, GemmConfig) else "")
        return self.reason + pad + tall


def unaligned_rows(N: int, K: int) -> str:
    """Which rows a TMA or 16-byte copy cannot address: "rows of N=100 elements are not 16-byte aligned"."""
    sizes = " and ".join(f"{name}={n}" for name, n in (("N", N), ("K", K)) if n % ALIGN)
    return f"rows of {sizes} elements are not 16-byte aligned"


def padding_seconds(M: int, N: int, K: int, family: str) -> float:
    """What the zero-padded copies cost: A in (K unaligned), B in, C out (N unaligned): bytes and a launch each."""
    machine = MACHINES[family]
    Na, Ka = aligned(N), aligned(K)
    copies = [M * K + M * Ka if Ka != K else 0, K * N + Ka * Na, M * Na + M * N if Na != N else 0]
    return sum(2 * elements / machine.memory + machine.launch for elements in copies if elements)


LINE_PENALTY = 0.2  # what rows of B off 32-byte sectors cost a Hopper GEMM, as a share of its time


def pads_b(plan: GemmPlan, family: str, gemm_s: float) -> bool:
    """Copy B into rows of whole 128-byte lines first? On Hopper the kernel's TMA loads of B rows that start off
    32-byte sectors (N not a multiple of 16; every other row then spans a sector more) run slower
    (`bench/gemm_alignment_probe.py`): yes where the copy, a read and a write of B and a launch, costs at most
    half of what that is taken to cost (LINE_PENALTY): large problems, whose GEMM time grows with M and the
    copy's does not. (Where B's rows are not 16-byte aligned, B is copied anyway.)"""
    M, N, K = plan.kernel_shape
    if family != "hopper" or N % SECTOR == 0 or not plan.pad or not getattr(plan.config, "warp_specialized", True):
        return False
    machine = MACHINES[family]
    copy_s = 2 * 2 * K * N / machine.memory + machine.launch
    return copy_s <= LINE_PENALTY / 2 * gemm_s


def plan_problem(M: int, N: int, K: int, family: str, sm_count: int, smem_budget: int,
                 dtype: str = "float16", epilogue: bool = False) -> GemmPlan:
    """The rule's schedule for a problem: on Hopper, one or two rows of A, or up to ROWS_MAX of unaligned ones, on
    the CUDA cores (`sections/gemm_rows.py`: B streamed once, any N and K, no tensor-core tile of mostly zeros);
    otherwise a tensor-core schedule (`tensor_core_plan`)."""
    if family == "hopper" and takes_rows(M, N, K):  # measured there (bench/gemm_rows_probe.py)
        config, machine = rows_schedule(M, N, K, sm_count), MACHINES[family]
        return GemmPlan(M, N, K, config, dtype, pad=False,
                        reason=rows_reason(M, N, K, config, sm_count, machine.memory, machine.launch))
    return tensor_core_plan(M, N, K, family, sm_count, smem_budget, dtype, epilogue)


def tensor_core_plan(M: int, N: int, K: int, family: str, sm_count: int, smem_budget: int,
                     dtype: str = "float16", epilogue: bool = False) -> GemmPlan:
    """The tensor-core schedule for a problem, at its aligned sizes. Unaligned rows: zero-padded copies, unless the
    kernel is better off loading the rows as they are, with narrower masked copies (no TMA, no 16-byte cp.async):
    for a problem of few rows (STREAMING_ROWS) where the best masked plan, its steps' round trips counted
    (MASKED_STEP), beats the padded GEMM and its copies; for taller ones where the copies would cost more than
    the GEMM itself (masked copies are taken to make it up to twice as slow)."""
    config, reason = choose_schedule(M, aligned(N), aligned(K), family, sm_count, smem_budget, epilogue)
    plan = GemmPlan(M, N, K, config, dtype, reason)
    gemm_s = estimate_seconds(M, aligned(N), aligned(K), config, family, sm_count, smem_budget)
    if not plan.padded:
        return replace(plan, pad_b=pads_b(plan, family, gemm_s))
    copies_s = padding_seconds(M, N, K, family)
    masked, masked_reason = choose_schedule(M, N, K, family, sm_count, smem_budget, epilogue, masked=True)
    few_rows = M <= STREAMING_ROWS and family == "hopper"  # measured there (see MASKED_STEP)
    masked_s = masked_seconds(M, N, K, masked, family, sm_count, smem_budget) if few_rows else 2 * gemm_s
    padded_s, us = gemm_s + copies_s, lambda seconds: f"{seconds * 1e6:.0f} us"
    if masked_s >= padded_s or (M == 1 and K % 2):  # one row of odd length: TileLang picks a 2-byte cp.async
        why = f"; masked loads instead would take {us(masked_s)} (a round trip a K step)" if few_rows and M > 1 else ""
        return replace(plan, pad_b=pads_b(plan, family, gemm_s), reason=reason + why)
    why = (f"{us(masked_s)} with a round trip a K step, against {us(padded_s)} on zero-padded copies" if few_rows
           else f"zero-padded copies would take {us(copies_s)}, more than the GEMM")
    if not masked_tile_fits(choose_schedule(M, N, K, family, sm_count, smem_budget, epilogue)[0], family, N, K):
        why += "; a tile whose fp32 accumulators leave its threads registers for the masked copies"
    return replace(plan, config=loading_masked(masked, family), pad=False,
                   reason=f"{masked_reason}; {unaligned_rows(N, K)}: loaded as they are, masked ({why})")
