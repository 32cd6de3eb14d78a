"""flash_attention (the lesson) and its rules (sections/attention_plans.py): the configuration rule on problems of
every kind, the declared kernels with and without --shape (CPU); the lesson's kernels lower for sm_80 and sm_90a
with the expected instructions for odd lengths, head dim 64, grouped-query attention and bf16 (CPU); correctness
against a float32 reference on odd problems (GPU)."""

import dataclasses
import re
import types

import pytest
import tilelang

import tourkit
from sections import attention_plans as plans
from sections import flash_attention as FA
from sections.attention_plans import Problem

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
H200 = tourkit.DeviceInfo("H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)


def hopper(problem):
    return plans.choose_config(problem, "hopper", HOPPER, 132)[0]


def compile_config(problem, cfg):
    """attention(q, k, v, o) for one problem and configuration (the section's own path: build, pass configs,
    the appendix's launcher)."""
    from sections.hopper import attention_ws

    func = FA.build(problem, cfg)
    return attention_ws.launcher(tilelang.compile(func, out_idx=None, target="cuda", pass_configs=FA.pass_configs(cfg)))


# ---------------------------------------------------------------------------------------------------------
# Problems and the configuration rule (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_problem_names_flops_and_groups():
    assert plans.from_shape((4, 32, 4096, 128), True).name == "B4 H32 S4096 D128 causal"
    gqa = plans.from_shape((1, 32, 4096, 128, 8), False, "bfloat16")
    assert gqa.kv_heads == 8 and gqa.name == "B1 H32 KVH8 S4096 D128 bf16 full"
    assert plans.from_shape((1, 32, 4096, 128), False).kv_heads == 32
    assert Problem(4, 32, 4096, 128, True).flops * 2 == Problem(4, 32, 4096, 128, False).flops
    with pytest.raises(ValueError, match="groups"):
        Problem(1, 32, 64, 128, False, kv_heads=5)
    with pytest.raises(ValueError, match="dtype"):
        Problem(1, 32, 64, 128, False, dtype="float32")
    with pytest.raises(ValueError, match="groups"):
        FA.flash_attention_forward(1, 6, 64, 64, False, kv_heads=4)


def test_key_tile_width_pays_for_the_ragged_tail():
    widths = plans.ASYNC_KEY_WIDTHS
    assert plans.key_tile_width(4096, widths, 0.5) == 176  # 24 tiles of 176 beat 29 of 144
    assert plans.key_tile_width(32768, widths, 0.5) == 176
    assert plans.key_tile_width(3000, widths, 0.5) == 144  # 3024 columns, not 3168
    assert plans.key_tile_width(128, (128, 160, 176), 0.0) == 128


def test_hopper_rule_per_problem():
    # long walks at head dim 128 (full: past the walk in the FA3 schedule, or one round of tiles): the FA3
    # schedule; full attention's tile width by the ragged tail
    full, causal = hopper(Problem(1, 32, 6000, 128, False)), hopper(Problem(4, 32, 4096, 128, True))
    assert full["kind"] == causal["kind"] == "async" and full["fast_math"] and causal["fast_math"]
    assert (full["block_N"], causal["block_N"]) == (176, 128) and causal["heavy_first"] and not full.get("heavy_first")
    assert hopper(Problem(1, 4, 3000, 128, False))["block_N"] == 144
    assert hopper(Problem(2, 32, 4096, 128, True, kv_heads=8, dtype="bfloat16"))["kind"] == "async"
    # head dim 64 up to 64 key tiles a block: two 64-row blocks per SM, 128-wide key tiles; longer: 128 rows, 3 stages
    for problem in (Problem(2, 8, 8192, 64, False), Problem(1, 8, 2048, 64, True), Problem(1, 8, 1000, 64, False),
                    Problem(2, 16, 2048, 64, False, kv_heads=2), Problem(1, 1, 8192, 64, False),
                    Problem(3, 12, 1025, 64, True)):
        cfg = hopper(problem)
        assert cfg["kind"] == "pipelined" and (cfg["block_M"], cfg["block_N"], cfg["threads"]) == (64, 128, 128)
        assert cfg["blocks_per_sm"] == 2 and cfg.get("heavy_first", False) == problem.causal, (problem, cfg)
    # causal at head dim 64 up to 1024 keys: 64x64 tiles, three blocks an SM
    for problem in (Problem(4, 8, 1000, 64, True), Problem(16, 8, 256, 64, True), Problem(1, 16, 1024, 64, True),
                    Problem(1, 8, 77, 64, True), Problem(2, 16, 512, 64, True, kv_heads=4)):
        cfg = hopper(problem)
        assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg["blocks_per_sm"]) == ("pipelined", 64, 64, 3), cfg
        assert cfg["heavy_first"] and 3 * plans.smem_estimate(64, 64, 64, 2) <= HOPPER
    assert "three 64-row blocks an SM" in plans.choose_config(Problem(4, 8, 1000, 64, True), "hopper", HOPPER)[1]
    for problem in (Problem(1, 16, 16384, 64, False), Problem(1, 16, 16384, 64, True)):
        cfg = hopper(problem)
        assert (cfg["kind"], cfg["block_M"], cfg["num_stages"], cfg.get("blocks_per_sm", 1)) == ("pipelined", 128, 3, 1)
    # head dim 128, short walks: 64x64 tiles two per SM (full: up to 4 key tiles; causal, where the pairs do not
    # take them: up to the FA3 schedule)
    for problem in (Problem(1, 32, 512, 128, False), Problem(2, 32, 512, 128, True), Problem(8, 16, 256, 128, True),
                    Problem(2, 4, 1536, 128, True), Problem(1, 64, 1, 128, True)):
        cfg = hopper(problem)
        assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg["blocks_per_sm"]) == ("pipelined", 64, 64, 2), cfg
    cfg = hopper(Problem(1, 16, 1024, 128, False))  # full, 8 key tiles, under one round of tiles: 128-row blocks
    assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg.get("blocks_per_sm", 1)) == ("pipelined", 128, 128, 1)
    assert plans.key_walk(Problem(1, 1, 1536, 128, False)) == 12 == plans.ASYNC_MIN_WALK
    assert hopper(Problem(1, 8, 1536, 128, False))["kind"] == "async"
    # a grid that would leave most SMs idle: 64-row query blocks (one warp group)
    for problem in (Problem(1, 64, 1, 128, True), Problem(1, 8, 128, 64, False), Problem(1, 4, 7, 64, False),
                    Problem(1, 1, 4096, 128, False), Problem(1, 4, 1024, 128, False)):
        cfg = hopper(problem)
        assert cfg["block_M"] == 64 and cfg["threads"] == 128, (problem, cfg)
    assert hopper(Problem(1, 64, 1, 128, True))["block_N"] == 64
    # the register split of two blocks per SM: 128 registers a thread at launch, the producer's share to the
    # consumers; whatever the split, the consumers never ask for more than the block holds
    assert plans.register_split(2, 128) == 232 and plans.register_split(1, 256) == 240
    for n, threads in ((2, 128), (2, 256), (3, 128), (4, 128)):
        cap = 65536 // (n * (threads + 128)) // 8 * 8
        assert threads * plans.register_split(n, threads) + 128 * 24 <= cap * (threads + 128)
    # two blocks must fit shared memory twice over; a smaller budget keeps one 128-row block
    assert hopper(Problem(2, 32, 512, 128, True))["blocks_per_sm"] == 2
    assert plans.choose_config(Problem(2, 32, 512, 128, True), "hopper", 150 * 1024)[0].get("blocks_per_sm", 1) == 1
    # every choice says why
    cfg, why = plans.choose_config(Problem(1, 4, 3000, 128, False), "hopper", HOPPER, 132)
    assert "24 key tiles" in why and "144-wide" in why
    assert "head dim 64" in plans.choose_config(Problem(1, 32, 3000, 64, True), "hopper", HOPPER, 132)[1]
    assert "fill only 64 of 132 SMs" in plans.choose_config(Problem(1, 2, 4096, 128, True), "hopper", HOPPER, 132)[1]
    assert "two 64-row blocks share each SM" in plans.choose_config(Problem(1, 8, 2048, 64, True), "hopper", HOPPER)[1]
    # a smaller budget (an sm_80-class GPU) falls back to a pipelined configuration that fits
    assert plans.choose_config(Problem(4, 32, 4096, 128, False), "hopper", 160 * 1024)[0]["kind"] == "pipelined"


def test_persistent_walk_rule():
    # full attention, more 128-row query tiles than SMs, at most 8 key tiles each: the persistent walk (head dim
    # 128 from 4 key tiles: in the FA3 schedule, test_overlapped_walk_rule)
    for problem in (Problem(8, 32, 512, 128, False), Problem(32, 16, 256, 128, False), Problem(4, 8, 1000, 64, False),
                    Problem(64, 8, 256, 64, False), Problem(2, 32, 512, 128, False, kv_heads=8, dtype="bfloat16"),
                    Problem(1, 133, 128, 64, False), Problem(4, 16, 1024, 128, False)):
        cfg = hopper(problem)
        kind = "persistent_async" if problem.dim == 128 and problem.seq_len >= 512 else "persistent"
        assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg["workers"]) == (kind, 128, 128, 132), problem
        assert plans.config_smem(cfg, problem.dim) <= HOPPER
    assert plans.choose_config(Problem(8, 32, 512, 128, False), "hopper", HOPPER, 114)[0]["workers"] == 114
    why = plans.choose_config(Problem(8, 32, 512, 128, False), "hopper", HOPPER, 132)[1]
    assert "1024 query tiles" in why and "persistently" in why and "4 key tiles" in why
    # it stays off: one round of tiles or fewer, a walk over 8 tiles (head dim 128: 32), fewer than 128 keys, too
    # little shared memory for two Q stages at head dim 128, and off Hopper
    for problem in (Problem(1, 132, 128, 64, False), Problem(3, 5, 333, 128, False),
                    Problem(4, 16, 1025, 64, False), Problem(64, 32, 64, 64, False), Problem(4, 32, 4097, 128, False)):
        assert not hopper(problem)["kind"].startswith("persistent"), problem
    assert not plans.choose_config(Problem(8, 32, 512, 128, False), "hopper", 200 * 1024)[0]["kind"].startswith(
        "persistent")
    assert plans.choose_config(Problem(8, 32, 512, 64, False), "ampere", 163 * 1024)[0]["kind"] == "pipelined"
    with pytest.raises(ValueError, match="square tiles"):
        FA.build(Problem(8, 32, 512, 128, True), dict(hopper(Problem(8, 32, 512, 128, False)), block_N=64))


def test_overlapped_walk_rule():
    """Full attention at head dim 128 walks in the FA3 schedule over 4 to 32 key tiles; its runner-up is the
    pipelined walk (up to 8 tiles) or the grid's FA3 kernel; short walks that 128-wide tiles mostly pad take two
    64x64 blocks an SM."""
    for seq_len, walk in ((512, 4), (700, 6), (1024, 8), (1500, 12), (2048, 16), (3000, 24), (4096, 32)):
        problem = Problem(2, 32, seq_len, 128, False, kv_heads=8)
        assert plans.persistent_units(problem)[1] == walk and plans.overlapped_walk(problem)
        cfg, why = plans.choose_config(problem, "hopper", HOPPER, 132)
        assert cfg["kind"] == "persistent_async" and (cfg["block_M"], cfg["block_N"]) == (128, 128), problem
        assert "FA3 schedule (a walk of 4 to 32)" in why and "last P·V in the next one's first step" in why
        other = plans.runner_up(problem, "hopper", HOPPER, 132)[0]
        assert other["kind"] == ("persistent" if walk <= 8 else "async" if walk >= 12 else "pipelined"), problem
    for problem in (Problem(32, 16, 384, 128, False), Problem(8, 32, 512, 128, True), Problem(8, 32, 512, 64, False),
                    Problem(1, 16, 4224, 128, False)):  # 3 key tiles; causal; head dim 64; 33 key tiles
        assert not plans.overlapped_walk(problem) and hopper(problem)["kind"] != "persistent_async", problem
    # 300 keys: 384 in 128-wide tiles, 320 in 64-wide ones: two 64x64 blocks an SM, the walk its runner-up
    problem = Problem(4, 16, 300, 128, False)
    cfg, why = plans.choose_config(problem, "hopper", HOPPER, 132)
    assert plans.ragged_short_walk(problem)
    assert (cfg["kind"], cfg["block_M"], cfg["blocks_per_sm"]) == ("pipelined", 64, 2)
    assert "300 keys pad to 320 in them (384 in 128-wide ones" in why
    assert plans.runner_up(problem, "hopper", HOPPER, 132)[0]["kind"] == "persistent"
    for seq_len in (256, 330, 512):  # little or no padding either way
        assert not plans.ragged_short_walk(Problem(4, 16, seq_len, 128, False)), seq_len


def test_causal_pairs_rule():
    """Causal problems walked in pairs of query tiles: more pairs than SMs keeping them at least 80% busy, a walk
    of up to 17 key steps (head dim 128: up to 33 over at most four rounds); else the grid or the FA3 schedule."""
    assert plans.persistent_units(Problem(8, 32, 512, 128, True)) == (2 * 256, 5)  # n = 4: pairs of 5 steps
    assert plans.persistent_units(Problem(1, 3, 777, 128, True)) == (4 * 3, 7)  # n = 7: the last tile alone
    assert plans.busy_share(288, 132) == 288 / 396 and plans.busy_share(512, 132) == 512 / 528
    for problem in (Problem(8, 32, 512, 128, True), Problem(4, 16, 2048, 64, True), Problem(64, 8, 256, 64, True),
                    Problem(3, 12, 1537, 64, True, dtype="bfloat16"), Problem(1, 32, 3000, 128, True),
                    Problem(1, 32, 4096, 128, True, kv_heads=8), Problem(2, 16, 2048, 64, True, kv_heads=2)):
        cfg, why = plans.choose_config(problem, "hopper", HOPPER, 132)
        assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg["workers"]) == ("persistent", 128, 128, 132), problem
        assert "heavy_first" not in cfg and "pairs of 128-row query tiles" in why, problem
        assert plans.runner_up(problem, "hopper", HOPPER, 132)[0]["kind"] != "persistent"
    assert "512 pairs" in plans.choose_config(Problem(8, 32, 512, 128, True), "hopper", HOPPER, 132)[1]
    # off: 288 pairs on 132 SMs (73% busy), one round or fewer, a long walk at head dim 64, 33 steps over 16 rounds
    for problem in (Problem(6, 24, 300, 128, True, kv_heads=4), Problem(1, 8, 1024, 128, True),
                    Problem(2, 8, 8192, 64, True), Problem(1, 32, 4096, 64, True), Problem(4, 32, 4096, 128, True),
                    Problem(3, 12, 1025, 64, True)):
        assert hopper(problem)["kind"] != "persistent", problem
    assert plans.choose_config(Problem(6, 24, 300, 128, True, kv_heads=4), "hopper", HOPPER, 100)[0]["kind"] == \
        "persistent"  # 288 pairs on 100 SMs: 96% busy


@pytest.mark.parametrize("n", range(1, 14))
def test_causal_pairs_walk_every_visible_tile_once(n):
    """The persistent walk's causal units (pairs of query tiles, n odd: the last tile alone) cover every
    (query tile, key tile) on or below the diagonal exactly once, in units of equal length, each tile's key
    steps in order."""
    from sections.attention_persistent import causal_pair_step

    plain = lambda cond, a, b: a if cond else b  # noqa: E731
    units, walk = (n + 1) // 2, n + 1 - n % 2
    steps = [causal_pair_step(n, u, s, plain) for u in range(units) for s in range(walk)]
    assert sorted(steps) == [(i, k) for i in range(n) for k in range(i + 1)]
    assert all(k == 0 or steps[j - 1] == (i, k - 1) for j, (i, k) in enumerate(steps))


def test_causal_pairs_lower_for_hopper():
    """The causal persistent walk (one 128-row block an SM, or two 64-row ones) lowers at odd lengths, more units
    than blocks: one loop of units x (n + 1 - n % 2) steps, the registers split where two blocks share an SM."""
    cfgs = [dict(kind="persistent", block_M=128, block_N=128, num_stages=2, threads=256, workers=132, fast_math=True),
            dict(kind="persistent", block_M=64, block_N=64, num_stages=2, threads=128, workers=264, fast_math=True,
                 blocks_per_sm=2)]
    problems = [Problem(3, 16, 777, 128, True), Problem(16, 8, 333, 64, True, kv_heads=2, dtype="bfloat16")]
    jobs = [(f"{p.name} {c['block_M']}", FA.build(p, c), "sm_90a", FA.pass_configs(c)) for p in problems for c in cfgs]
    for (problem, cfg), rep in zip([(p, c) for p in problems for c in cfgs], tourkit.inspect_kernels(jobs, nvcc=False)):
        n = -(-problem.seq_len // cfg["block_M"])
        units = (n + 1) // 2 * problem.heads * problem.batch
        workers, walk = min(cfg["workers"], units), n + 1 - n % 2
        tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS["hopper"])
        assert re.search(rf"\(\({units - 1 + workers} - \(\(int\)blockIdx\.x\)\) / {workers}\) \* {walk}\)",
                         rep.source), (problem, cfg["block_M"])
        assert ("reg_alloc<232>" in rep.source) == (cfg.get("blocks_per_sm") == 2)


def test_fa3_schedule_shares_an_sm_without_spilling():
    """The FA3 kernel in 64-row blocks, two an SM (both head dims, full and causal, a ragged length): the launch
    bounds ask for two blocks, the consumers get plans.register_split's 232 registers, one MMA stays in flight,
    and ptxas spills nothing; one block an SM keeps TileLang's own split."""
    cfgs = [dict(kind="async", block_M=64, block_N=bn, num_stages=2, threads=128, fast_math=True, blocks_per_sm=per_sm)
            for bn, per_sm in ((128, 2), (192, 2), (128, 1))]
    problems = [Problem(4, 16, 2048, 64, False), Problem(2, 8, 1000, 64, True, kv_heads=2),
                Problem(1, 3, 777, 128, False)]
    pairs = [(p, dict(c, block_N=64) if p.dim == 128 else c) for p in problems for c in cfgs]
    jobs = [(f"{p.name} {c}", FA.build(p, c), "sm_90a", FA.pass_configs(c)) for p, c in pairs]
    for (problem, cfg), rep in zip(pairs, tourkit.inspect_kernels(jobs, nvcc=tourkit.find_nvcc() is not None)):
        two = cfg["blocks_per_sm"] == 2
        assert "wait_wgmma<1>" in rep.source, problem
        assert ("__launch_bounds__(256, 2)" in rep.source and "reg_alloc<232>" in rep.source) == two, (problem, cfg)
        assert not (rep.spill_stores or rep.spill_loads) and "failed" not in rep.nvcc, (problem, cfg, rep.nvcc)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_75"])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_other_archs_fit_shared_memory(arch, dim, causal):
    spec = tourkit.ARCH_SPECS[arch]
    cfg, why = plans.choose_config(Problem(2, 8, 3000, dim, causal), spec.family, spec.smem_per_block_optin)
    assert cfg["kind"] == "pipelined" and "no wgmma" in why
    assert plans.smem_estimate(dim, cfg["block_M"], cfg["block_N"], cfg["num_stages"]) <= spec.smem_per_block_optin
    if causal:
        assert cfg["num_stages"] == 1


def test_tiny_shared_memory_is_rejected_clearly():
    with pytest.raises(ValueError, match="shared memory"):
        plans.choose_config(Problem(1, 1, 128, 128, False), "ampere", 16 * 1024)


@pytest.mark.parametrize("dim", [32, 96, 192, 512])
def test_unsupported_head_dim_is_rejected(dim):
    with pytest.raises(ValueError, match="head dim"):
        FA.flash_attention_forward(1, 1, 128, dim, False)


def test_declared_kernels_lesson_and_appendix_side_by_side_on_hopper():
    ctx = tourkit.TourContext(device=H200, echo=False)
    names = [d.name for d in FA.kernels(ctx)]
    for mode in ("full", "causal"):  # the benchmarked problem: both kernels, each mode
        assert f"lesson B4 H32 S4096 D128 {mode}" in names and f"appendix B4 H32 S4096 D128 {mode}" in names
    for odd in ("B1 H3 S777 D128 causal", "B1 H8 KVH2 S333 D64 full"):  # ragged, grouped-query attention
        assert f"lesson {odd}" in names and f"appendix {odd}" in names
    assert not any("S16384" in n for n in names)  # only with --full
    full = FA.kernels(tourkit.TourContext(device=H200, full=True, echo=False))
    assert any("S16384" in d.name for d in full)
    quick = FA.kernels(tourkit.TourContext(device=H200, quick=True, echo=False))
    assert len(quick) < len(names) and not any("S4096" in d.name for d in quick)
    # the appendix's persistent grid takes the GPU's SM count; compile-only the default
    h100 = dataclasses.replace(H200, name="H100", sm_count=114)
    plan = {name: cfg for name, _, _, cfg, _, _ in FA.plan(tourkit.TourContext(device=h100, echo=False))}
    assert plan["appendix B4 H32 S4096 D128 full"]["sms"] == 114
    decl = {d.name: d for d in FA.kernels(ctx)}["lesson B4 H32 S4096 D128 full"]
    assert decl.pass_configs == {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} and decl.nvcc
    assert decl.markers == tuple(tourkit.TENSOR_CORE_MARKERS["hopper"]) and decl.threads == 256


def test_the_users_problem_alone_causal_and_full():
    ctx = tourkit.TourContext(device=H200, echo=False, shape=(2, 16, 2048, 64, 2), dtype="bfloat16")
    items = FA.plan(ctx)
    assert {item[2] for item in items} == {Problem(2, 16, 2048, 64, c, 2, "bfloat16") for c in (False, True)}
    assert all(timed and (why or which == "appendix") for _, which, _, _, why, timed in items)
    # D128 on Hopper: the appendix takes it too; and the rule's runner-up, timed beside its pick
    items = FA.plan(tourkit.TourContext(device=H200, echo=False, shape=(1, 32, 3000, 128)))
    assert sorted(name for name, *_ in items) == sorted(f"{w} B1 H32 S3000 D128 {m}" for w in
                                                        ("lesson", "runner-up", "appendix") for m in ("full", "causal"))
    assert not any(which == "runner_up" for _, which, *_ in FA.plan(tourkit.TourContext(device=H200, echo=False)))


@pytest.mark.parametrize("dims,causal,pick,other", [
    ((8, 32, 512, 128), False, "async walk", "persistent"),  # many short full walks: the FA3 schedule, or not
    ((32, 16, 256, 128), False, "persistent", "64x64 paired"),  # shorter ones: the grid's pair of blocks
    ((4, 16, 300, 128), False, "64x64 paired", "persistent"),  # mostly padding in 128-wide tiles
    ((8, 32, 512, 128), True, "persistent", "64x64 paired"),  # causal pairs: the grid they replace
    ((1, 32, 4096, 128, 8), False, "async walk", "128x176 async"),  # a long walk: the grid's FA3 kernel
    ((1, 32, 6000, 128, 8), False, "128x176 async", "128x128 grid"),  # longer: the compiler's pipeline
    ((1, 32, 4096, 128, 8), True, "persistent", "128x128 async"),  # four rounds of pairs: the FA3 schedule
    ((4, 32, 4096, 128), True, "128x128 async", "64x64 paired"),  # sixteen rounds: the FA3 schedule
    ((4, 16, 2048, 64), False, "64x128 paired", "64x192 paired"),  # full, head dim 64: the wider key tiles
    ((4, 16, 2048, 64), True, "persistent", "64x128 paired"),
    ((64, 8, 256, 64), True, "persistent", "64x64 tripled"),
    ((6, 24, 300, 128, 4), True, "64x64 paired", "128x128 grid"),  # pairs would keep the SMs 73% busy
    ((2, 8, 16384, 64), False, "128x128 grid", "64x128 paired"),  # the last branch: two 64-row blocks, forced
])
def test_the_runner_up_is_the_rules_next_branch(dims, causal, pick, other):
    def words(cfg):
        kind = {"async": "async", "persistent": "persistent", "persistent_async": "async walk"}.get(
            cfg["kind"]) or plans.branch(cfg)
        return kind if kind.startswith(("persistent", "async walk")) else f"{cfg['block_M']}x{cfg['block_N']} {kind}"

    problem = plans.from_shape(dims, causal)
    cfg, why = plans.runner_up(problem, "hopper", HOPPER, 132)
    assert (words(hopper(problem)), words(cfg)) == (pick, other) and why
    assert plans.runner_up(problem, "ampere", 163 * 1024, 108) is None  # one schedule elsewhere


def test_a_users_problem_reports_the_faster_of_the_pick_and_its_runner_up(monkeypatch):
    ctx = tourkit.TourContext(device=H200, echo=False, shape=(8, 32, 512, 128))
    ms = {"lesson": 1.0, "runner_up": 0.8, "appendix": 0.9, "sdpa": 0.88, "sdpa_kind": "sdpa"}
    kernel = types.SimpleNamespace(get_kernel_source=lambda: "")
    monkeypatch.setattr(tourkit, "build_declared", lambda decls, log=None: {d.name: kernel for d in decls})
    monkeypatch.setattr(FA.attention_ws, "launcher", lambda kernel: None)
    monkeypatch.setattr(FA, "check_attention", lambda problem, kernels: [])
    monkeypatch.setattr(FA, "bench_attention", lambda problem, kernels: dict(ms) if problem.causal else
                        {**ms, "runner_up": 1.1})
    monkeypatch.setattr(tourkit, "require_device_memory", lambda *args: None)
    FA.run(ctx)
    assert ctx.headlines["lesson_vs_sdpa_causal"] == 1.1 and ctx.headlines["lesson_vs_sdpa_full"] == 0.88
    assert ctx.headlines["appendix_vs_sdpa_causal"] == round(0.88 / 0.9, 3)
    text = "\n".join(ctx.report)
    assert "causal: the rule's pick timed in turns beside its runner-up: the runner-up ran 1.25x" in text
    assert "full: the rule's pick timed in turns beside its runner-up: the pick was the faster, it stays" in text


def test_elsewhere_the_lesson_kernel_alone():
    names = [d.name for d in FA.kernels(tourkit.TourContext(compile_only=True, arch="sm_80", echo=False))]
    assert names and all(n.startswith("lesson ") for n in names)


# ---------------------------------------------------------------------------------------------------------
# Lowering (no GPU): ragged lengths so the masking paths are generated too
# ---------------------------------------------------------------------------------------------------------

# full and causal at head dim 128 (the FA3 schedule on Hopper), grouped-query attention in bf16 and head dim 64
# (the compiler's pipeline, two blocks per SM on Hopper), 64-row blocks for a short problem, a short causal walk;
# many full walks, ragged and grouped-query at head dim 128 (in the FA3 schedule), bf16 at 64 (the persistent walk)
LOWERED = [Problem(2, 4, 1600, 128, False, kv_heads=2), Problem(2, 4, 3000, 128, True),
           Problem(1, 8, 333, 64, True, kv_heads=2, dtype="bfloat16"), Problem(3, 4, 1537, 64, False, kv_heads=1),
           Problem(1, 1, 5000, 128, False), Problem(3, 4, 300, 128, True),
           Problem(2, 24, 1500, 128, False, kv_heads=4), Problem(8, 20, 1000, 64, False, dtype="bfloat16")]


@pytest.fixture(scope="module")
def reports():
    """The rule's kernels for LOWERED, lowered for sm_80 and sm_90a."""
    jobs, keys = [], []
    for arch in ("sm_80", "sm_90a"):
        spec = tourkit.ARCH_SPECS[arch]
        for problem in LOWERED:
            cfg, _ = plans.choose_config(problem, spec.family, spec.smem_per_block_optin)
            jobs.append((f"{arch} {problem.name}", FA.build(problem, cfg), arch, FA.pass_configs(cfg)))
            keys.append((arch, problem, cfg))
    return [(*key, rep) for key, rep in zip(keys, tourkit.inspect_kernels(jobs, nvcc=False))]


def test_expected_instructions_and_exp2(reports):
    for arch, problem, _, rep in reports:
        tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS[tourkit.ARCH_SPECS[arch].family])
        assert "exp2f" in rep.source
        assert ("bfloat16_t" in rep.source) == (problem.dtype == "bfloat16"), (arch, problem)
    hopper = {problem: rep for arch, problem, _, rep in reports if arch == "sm_90a"}
    hopper_cfgs = {problem: cfg for arch, problem, cfg, _ in reports if arch == "sm_90a"}
    for problem, rep in hopper.items():  # the FA3 schedule: one MMA left in flight (long walks at head dim 128)
        assert ("wait_wgmma<1>" in rep.source) == (problem.dim == 128 and problem.seq_len > 1000), problem
        assert ("wait_wgmma<1>" in rep.source) == (hopper_cfgs[problem]["kind"] in ("async", "persistent_async"))
    assert hopper[LOWERED[4]].threads == 256  # 64 query rows: one consumer warp group and TileLang's producer
    for problem in (LOWERED[3], LOWERED[5]):  # two blocks per SM: 128 registers a thread at launch
        source = hopper[problem].source
        assert "__launch_bounds__(256, 2)" in source and "reg_alloc<232>" in source and "reg_dealloc<24>" in source
    source = hopper[LOWERED[2]].source  # causal at head dim 64, a short walk: three blocks an SM, 80 at launch
    assert "__launch_bounds__(256, 3)" in source and "reg_alloc<136>" in source and "reg_dealloc<24>" in source
    assert "__launch_bounds__(384, 1)" in hopper[LOWERED[1]].source
    for problem in LOWERED[6:]:  # the persistent walk: 132 blocks, one loop over their tiles' key steps
        source = hopper[problem].source
        tiles = -(-problem.seq_len // 128) * problem.heads * problem.batch
        assert re.search(rf"for \(int (step|j)\w* = 0; \w+ < \(+{tiles - 1 + 132} - \(\(int\)blockIdx\.x\)\) / 132\)",
                         source), problem
        assert "tma_store" in source and "__launch_bounds__(384, 1)" in source


def test_shared_memory_estimates_bound_the_lowered_kernels(reports):
    for arch, problem, cfg, rep in reports:
        estimate = plans.config_smem(cfg, problem.dim)
        assert rep.smem_bytes <= estimate + 1024, (arch, problem, rep.smem_bytes, estimate)  # + barriers
        if cfg["kind"] in ("async", "persistent", "persistent_async"):  # exact: async's O reuses K/V; a walk's Q
            # has one a stage
            assert rep.smem_bytes >= estimate, (arch, problem, rep.smem_bytes, estimate)


def test_grouped_query_attention_reads_the_shared_head():
    func = FA.build(LOWERED[2], hopper(LOWERED[2]))
    shapes = [tuple(int(d) for d in func.buffer_map[param].shape) for param in func.params]
    assert shapes == [(1, 333, 8, 64), (1, 333, 2, 64), (1, 333, 2, 64), (1, 333, 8, 64)]


def test_causal_loop_bound_is_clamped(reports):
    # The causal kernel's key loop runs to min(n_tiles, ceil((bx+1)·bM / bN)); full attention's is fixed.
    def key_loop_bounds(source):
        return re.findall(r"for \(int k\w* = [01]; k\w* < ([^;]+);", source)

    for arch in ("sm_80", "sm_90a"):
        full, causal = (next(rep for a, p, _, rep in reports if a == arch and p == problem) for problem in LOWERED[:2])
        assert any(re.search(r"blockIdx\.x|condval", bound) for bound in key_loop_bounds(causal.source))
        assert all(bound.strip().isdigit() for bound in key_loop_bounds(full.source))


def test_section_compiles_the_users_problem():
    """--compile-only with --shape: that problem, causal and full, built with nvcc for sm_80 (grouped-query
    attention in bf16)."""
    ctx = tourkit.TourContext(compile_only=True, arch="sm_80", echo=False, shape=(1, 8, 333, 64, 2),
                              dtype="bfloat16")
    FA.run(ctx)
    assert ctx.headlines["kernels"] == 2
    assert any("B1 H8 KVH2 S333 D64 bf16 causal:" in line for line in ctx.report)


def test_persistent_walk_compiles_for_hopper():
    """--compile-only --arch sm_90a with a problem of many short walks: nvcc builds the persistent walk, full and
    in causal pairs."""
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False, shape=(8, 32, 512, 128))
    FA.run(ctx)
    assert ctx.headlines["kernels"] == 6  # lesson, its runner-up and appendix, full and causal
    assert any("B8 H32 S512 D128 full:" in line and "persistently" in line for line in ctx.report)
    assert any("B8 H32 S512 D128 causal:" in line and "512 pairs" in line for line in ctx.report)


# ---------------------------------------------------------------------------------------------------------
# Correctness on a GPU: error within 2x of PyTorch's own against a float32 reference
# ---------------------------------------------------------------------------------------------------------

PROBLEMS = [(2, 4, 1000, 64), (1, 3, 777, 128), (2, 4, 1024, 64), (1, 2, 129, 128), (1, 2, 5, 64), (1, 16, 1, 128),
            (1, 8, 333, 64, 2), (2, 8, 1000, 128, 4, "bfloat16"), (3, 4, 1537, 64, 1, "bfloat16"), (8, 4, 300, 128),
            (1, 2, 4100, 128), (6, 24, 300, 128, 4), (8, 20, 1000, 64, 1, "bfloat16"), (4, 16, 777, 128),
            (2, 12, 1500, 128, 4), (4, 16, 300, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("dims", PROBLEMS, ids=lambda p: "x".join(map(str, p)))
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_sdpa(dims, causal):
    device = tourkit.detect_device()
    problem = Problem(*dims[:4], causal, *dims[4:])
    cfg, _ = plans.choose_config(problem, device.family, device.smem_per_block_optin, device.sm_count)
    (check,) = FA.check_attention(problem, {"lesson": compile_config(problem, cfg)})
    assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [(2, 4, 1000, 64), (1, 3, 777, 128), (8, 4, 300, 128), (1, 8, 333, 64, 2)],
                         ids=lambda p: "x".join(map(str, p)))
@pytest.mark.parametrize("causal", [False, True])
def test_the_runner_up_matches_sdpa(dims, causal):
    device = tourkit.detect_device()
    problem = Problem(*dims[:4], causal, *dims[4:])
    other = plans.runner_up(problem, device.family, device.smem_per_block_optin, device.sm_count)
    if other is None:
        pytest.skip("no runner-up here (one schedule off Hopper)")
    (check,) = FA.check_attention(problem, {"runner-up": compile_config(problem, other[0])})
    assert check.passed, check.line()


LESSON_SCHEDULES = [
    dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    dict(kind="pipelined", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True),
    dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True, heavy_first=True),
    dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True),
    dict(kind="async", block_M=192, block_N=128, num_stages=2, threads=384, fast_math=True),
    dict(kind="async", block_M=64, block_N=128, num_stages=2, threads=128, fast_math=True),
    dict(kind="async", block_M=64, block_N=128, num_stages=2, threads=128, fast_math=True, blocks_per_sm=2),
    dict(kind="async", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True, blocks_per_sm=2,
         heavy_first=True),
    dict(kind="pipelined", block_M=64, block_N=128, num_stages=2, threads=128, fast_math=True, blocks_per_sm=2),
    dict(kind="pipelined", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True, blocks_per_sm=2,
         heavy_first=True),
    dict(kind="pipelined", block_M=64, block_N=64, num_stages=2, threads=128, fast_math=True, blocks_per_sm=3,
         heavy_first=True),
    dict(kind="persistent", block_M=128, block_N=128, num_stages=2, threads=256, workers=132, fast_math=True),
    dict(kind="persistent", block_M=128, block_N=64, num_stages=2, threads=256, workers=5, fast_math=True),
    dict(kind="persistent", block_M=64, block_N=64, num_stages=2, threads=128, workers=7, fast_math=True,
         blocks_per_sm=2),
    dict(kind="persistent_async", block_M=128, block_N=128, num_stages=2, threads=256, workers=132, fast_math=True),
    dict(kind="persistent_async", block_M=128, block_N=128, num_stages=2, threads=256, workers=5, fast_math=True),
]
SCHEDULE_PROBLEMS = ((1, 3, 777, 128), (2, 4, 1000, 64, 2, "bfloat16"))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", LESSON_SCHEDULES, ids=lambda cfg: " ".join(map(str, plans.describe(cfg))))
def test_every_lesson_schedule_matches_sdpa(causal, cfg):
    device = tourkit.detect_device()
    if (cfg["kind"] != "pipelined" or cfg["block_M"] == 64) and device.family != "hopper":
        pytest.skip("wgmma is Hopper-only")
    if cfg["kind"].startswith("persistent") and causal and cfg["block_M"] != cfg["block_N"]:
        pytest.skip("the persistent walk takes causal problems in square tiles")
    for dims in SCHEDULE_PROBLEMS:
        if cfg.get("blocks_per_sm") == 3 and dims[3] != 64:
            continue  # three blocks an SM is head dim 64's schedule (plans.tripled_blocks): at 128 registers run out
        problem = Problem(*dims[:4], causal, *dims[4:])
        (check,) = FA.check_attention(problem, {"lesson": compile_config(problem, cfg)})
        assert check.passed, check.line()


# ---------------------------------------------------------------------------------------------------------
# Head dim 256: the FA3 schedule on 64-wide key tiles (Hopper), the largest tiles that fit elsewhere
# ---------------------------------------------------------------------------------------------------------

WIDE = [Problem(2, 4, 1000, 256, False), Problem(1, 3, 777, 256, True), Problem(4, 32, 2048, 256, True),
        Problem(1, 8, 333, 256, False, kv_heads=2, dtype="bfloat16")]


def test_head_dim_256_rule():
    for problem in WIDE:
        cfg, why = plans.choose_config(problem, "hopper", HOPPER, 132)
        rows = plans.query_rows(problem, 132)
        assert (cfg["kind"], cfg["block_M"], cfg["block_N"], cfg["threads"]) == ("async", rows, 64, 2 * rows), problem
        assert "head dim 256" in why and plans.config_smem(cfg, 256) <= HOPPER
        other, _ = plans.runner_up(problem, "hopper", HOPPER, 132)
        assert (other["kind"], other["block_M"], other["block_N"]) == ("pipelined", 64, 64)
    assert plans.query_rows(WIDE[2], 132) == 128
    for smem in (163 * 1024, 99 * 1024):  # 64x64 in one stage would spill (160 accumulators a thread)
        cfg, _ = plans.choose_config(WIDE[0], "ampere", smem)
        assert (cfg["block_M"], cfg["block_N"], cfg["num_stages"]) == (64, 32, 1)
    with pytest.raises(tourkit.SectionSkip, match="no tile configuration fits 65536 bytes"):
        plans.choose_config(WIDE[0], "turing", 64 * 1024)


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_90a"])
def test_head_dim_256_builds_without_spills(arch):
    """The rule's kernels (and on Hopper the runner-up) through nvcc: markers, no spills, shared memory."""
    spec = tourkit.ARCH_SPECS[arch]
    jobs = []
    for problem in WIDE[:2] + WIDE[3:]:
        cfgs = [plans.choose_config(problem, spec.family, spec.smem_per_block_optin)[0]]
        if (other := plans.runner_up(problem, spec.family, spec.smem_per_block_optin)) is not None:
            cfgs.append(other[0])
        jobs += [(f"{problem.name} {i}", FA.build(problem, cfg), arch, FA.pass_configs(cfg))
                 for i, cfg in enumerate(cfgs)]
    for rep in tourkit.inspect_kernels(jobs):
        tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS[spec.family])
        assert rep.nvcc == "compiled" and not (rep.spill_stores or rep.spill_loads), (arch, rep.name, rep.spills)
        assert rep.smem_bytes <= spec.smem_per_block_optin, (arch, rep.name)


def test_head_dim_256_skips_where_no_tile_fits():
    """sm_75 (64 KiB a block): no tile holds a 256-wide Q, K and V; the section skips and says why."""
    ctx = tourkit.TourContext(compile_only=True, arch="sm_75", echo=False, shape=(1, 2, 100, 256))
    with pytest.raises(tourkit.SectionSkip, match="head dim 256"):
        FA.run(ctx)


@pytest.mark.gpu
@pytest.mark.parametrize("problem", WIDE[:2] + WIDE[3:], ids=lambda p: p.name)
def test_head_dim_256_matches_sdpa(problem):
    device = tourkit.detect_device()
    cfgs = [plans.choose_config(problem, device.family, device.smem_per_block_optin, device.sm_count)[0]]
    if (other := plans.runner_up(problem, device.family, device.smem_per_block_optin, device.sm_count)) is not None:
        cfgs.append(other[0])
    checks = FA.check_attention(problem, {f"cfg {i}": compile_config(problem, cfg) for i, cfg in enumerate(cfgs)})
    assert all(check.passed for check in checks), [check.line() for check in checks]
