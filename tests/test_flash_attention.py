"""flash_attention: config choice (CPU), kernels lower and nvcc-compile for sm_80 and sm_90a with the expected
instructions (CPU), correctness against SDPA incl. causal and odd lengths (GPU)."""

import pytest

import tourkit
from sections import flash_attention as FA

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin


# ---------------------------------------------------------------------------------------------------------
# Configuration choice (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_hopper_configs_per_mode_and_head_dim():
    full = FA.choose_config(128, False, "hopper", HOPPER, sm_count=114)
    causal = FA.choose_config(128, True, "hopper", HOPPER, sm_count=114)
    assert full["kind"] == causal["kind"] == "ws" and full["fast_math"] and causal["heavy_first"]
    # persistent: one block per SM of *this* GPU
    assert full["persistent"] and causal["persistent"] and full["sms"] == causal["sms"] == 114
    assert full["block_N"] == causal["block_N"] == 160 and full["q_stages"] == 2
    assert full["split_tail"] and not causal.get("split_tail")  # causal has no partial wave to split
    assert FA.choose_config(64, False, "hopper", HOPPER)["kind"] == "pipelined"
    assert FA.choose_config(64, True, "hopper", HOPPER)["kind"] == "async"


def test_two_q_buffers_fit_only_with_160_wide_key_tiles():
    cfg = FA.HOPPER_CONFIGS[(False, 128)]
    assert cfg["q_stages"] == 2 and FA.config_smem(128, cfg) <= HOPPER
    assert FA.config_smem(128, dict(cfg, block_N=176)) > HOPPER
    # the async kernel's 176-wide tiles fit only because its output reuses the K/V buffers
    assert FA.smem_estimate(128, 128, 176, 2) > HOPPER >= FA.smem_estimate(128, 128, 176, 2, output_reuses_kv=True)
    # a smaller budget (an sm_80-class GPU) falls back to a pipelined configuration that fits
    assert FA.choose_config(128, False, "hopper", 160 * 1024)["kind"] == "pipelined"


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_75"])
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_other_archs_fit_shared_memory(arch, dim, causal):
    spec = tourkit.ARCH_SPECS[arch]
    cfg = FA.choose_config(dim, causal, spec.family, spec.smem_per_block_optin)
    assert cfg["kind"] == "pipelined"
    assert FA.smem_estimate(dim, cfg["block_M"], cfg["block_N"], cfg["num_stages"]) <= spec.smem_per_block_optin
    if causal:
        assert cfg["num_stages"] == 1


def test_tiny_shared_memory_is_rejected_clearly():
    with pytest.raises(ValueError, match="shared memory"):
        FA.choose_config(128, False, "ampere", 16 * 1024)


@pytest.mark.parametrize("dim", [32, 96, 256])
def test_unsupported_head_dim_is_rejected(dim):
    with pytest.raises(ValueError, match="head dim"):
        FA.flash_attention_forward(1, 1, 128, dim, False)


def test_flops_halve_when_causal():
    assert FA.attention_flops(4, 32, 4096, 128, True) * 2 == FA.attention_flops(4, 32, 4096, 128, False)


# ---------------------------------------------------------------------------------------------------------
# Lowering and nvcc (no GPU): a ragged length (1000) so the masking paths are compiled too
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def reports(request):
    arch = request.param
    spec = tourkit.ARCH_SPECS[arch]
    out = {}
    for causal in (False, True):
        cfg = FA.choose_config(128, causal, spec.family, spec.smem_per_block_optin)
        out[causal] = tourkit.inspect_kernel(f"attention causal={causal}", FA.build(2, 4, 1000, 128, causal, cfg), arch)
    return arch, out


def test_hopper_kernels_use_no_more_shared_memory_than_estimated(reports):
    arch, reps = reports
    if arch != "sm_90a":
        pytest.skip("the estimate is exact for the Hopper kernels; elsewhere it is an upper bound")
    for causal, rep in reps.items():
        estimate = FA.config_smem(128, FA.choose_config(128, causal, "hopper", HOPPER))
        assert estimate <= rep.smem_bytes <= estimate + 1024, (causal, rep.smem_bytes, estimate)  # + barriers


def test_expected_instructions(reports):
    arch, reps = reports
    expected = ["wgmma", "tma_load", "mbarrier"] if arch == "sm_90a" else ["mma_sync", "ldmatrix", "cp_async"]
    for rep in reps.values():
        tourkit.require_markers(rep, expected)  # also fails when nvcc failed


def test_exponentials_use_exp2_and_scores_stay_on_chip(reports):
    _, reps = reports
    for rep in reps.values():
        assert "exp2f" in rep.source
        assert rep.smem_bytes < 232448


def test_causal_loop_bound_is_clamped(reports):
    # The causal kernel's key loop runs to min(n_tiles, ceil((bx+1)·bM / bN)), bx being the block's query tile
    # (blockIdx.x, or on a persistent grid the tile this step of the block's walk picks); full attention's
    # key loops have fixed bounds.
    arch, reps = reports
    import re

    def key_loop_bounds(source):
        return re.findall(r"for \(int k\w* = [01]; k\w* < ([^;]+);", source)

    causal = key_loop_bounds(reps[True].source)
    assert any(re.search(r"blockIdx\.x|condval", bound) for bound in causal), causal
    assert all(bound.strip().isdigit() for bound in key_loop_bounds(reps[False].source))


def test_pingpong_barriers_sit_in_the_consumer_warp_groups():
    """The ping-pong schedule only works if the turn-taking barriers run in the two consumer warp groups (1 and
    2) and never in TileLang's producer (warp group 0, threads 0-127): a bare barrier would be moved there."""
    cfg = dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True, pingpong=True)
    source = tourkit.inspect_kernel("pingpong", FA.build(2, 4, 1000, 128, False, cfg), "sm_90a", nvcc=False).source
    producer, consumer = source.split("warpgroup_reg_alloc<")  # the consumers' branch raises its registers
    assert "if (((int)threadIdx.x) < 128)" in producer and "warpgroup_reg_dealloc" in producer
    first, second = FA.PINGPONG_BARRIER + 1, FA.PINGPONG_BARRIER + 2
    assert f"__named_barrier_arrive({first}, 256)" in producer.split("threadIdx.x) < 128")[0]  # group 2 lets 1 go
    assert "__sync_thread_partial((warp_group" not in producer
    assert f"__sync_thread_partial((warp_group[0] + {FA.PINGPONG_BARRIER}), 256)" in consumer
    assert f"__named_barrier_arrive(({first + second - FA.PINGPONG_BARRIER} - warp_group[0]), 256)" in consumer
    issue = consumer.index("__sync_thread_partial((warp_group")
    assert issue < consumer.index("wgmma_ss") < consumer.index("__named_barrier_arrive") < consumer.index(
        "wait_wgmma<1>")  # take the turn, issue both MMAs, hand the turn over, then wait


def test_pingpong_needs_two_consumer_warp_groups():
    with pytest.raises(ValueError, match="two consumer warp groups"):
        FA.flash_attention_forward_async(1, 2, 256, 128, False, threads=384, pingpong=True)


@pytest.mark.parametrize("persistent", [False, True])
def test_hand_written_warp_specialization(persistent):
    """flash_attention_forward_ws: one producer warp feeds a ring of mbarrier-guarded K/V buffers, the consumers
    peel the FA3 schedule, and nothing in it waits for the whole block (a __syncthreads in a role's branch
    would hang: the producer warps never reach it)."""
    func = FA.flash_attention_forward_ws(2, 4, 1000, 128, True, block_N=128, heavy_first=True, persistent=persistent,
                                         sms=3)
    rep = tourkit.inspect_kernel("ws", func, "sm_90a")
    tourkit.require_markers(rep, ["wgmma", "tma_load", "mbarrier"])
    source = rep.source
    assert source.count("__syncthreads()") == 1  # after the barriers' initialization only
    producer, consumer = source.split("warpgroup_reg_alloc<240>")
    assert "warpgroup_reg_dealloc<24>" in producer and "tma_load(" in producer and "wgmma_" not in producer
    assert "tma_load(" not in consumer
    # The peeled schedule: Q·K(0)ᵀ alone (waited at once), a loop with both MMAs and wait<1>, the last P·V alone.
    assert consumer.count("wgmma_ss<") == 2 and consumer.count("wgmma_rs<") == 2
    assert consumer.index("wait_wgmma<0>") < consumer.index("wait_wgmma<1>") < consumer.rindex("wgmma_rs<")
    # Every buffer is released: K after its Q·Kᵀ, V after its P·V, Q after the tile's last Q·Kᵀ.
    for barrier in ("k_empty", "v_empty", "q_empty"):
        assert f"{barrier}[" in consumer and ".arrive()" in consumer.split(f"{barrier}[", 1)[1][:40]
    assert rep.threads == 384
    import re

    work_loops = re.findall(r"for \(int step\w* = 0; step\w* < ([^;]+);", source)
    if persistent:  # three blocks walk 2 * 4 * 8 = 64 tiles, each role with its own loop over its block's share
        assert len(work_loops) == 2 and all("blockIdx.x" in bound for bound in work_loops), work_loops
    else:  # one tile per block: the work loop is gone
        assert not work_loops


# ---------------------------------------------------------------------------------------------------------
# split_tail: the last partial wave of the persistent grid split along the keys (CPU)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_work, grid, n_key, expect", [
    (4096, 132, 26, (31, 4, 13)),   # B4 H32 S4096, 160-wide key tiles: 52 blocks with 2 key tiles each
    (4096, 132, 103, (31, 4, 33)),  # B1 H32 S16384: every block busy, 3-4 key tiles each
    (136, 132, 7, (1, 4, 3)),       # B1 H17 S1000: ragged keys and queries in the tail
    (144, 132, 19, (1, 12, 9)),     # B1 H6 S3000
    (256, 132, 7, (1, 124, 1)),     # too few idle blocks: no split
    (140, 132, 5, (1, 8, 2)),       # P capped by the key tiles (5 // 2)
    (133, 132, 100, (1, 1, 50)),    # one tail tile, capped by the key tiles
    (133, 132, 1000, (1, 1, 132)),  # one tail tile, capped by the grid
    (21, 21, 7, (1, 0, 1)),         # fewer tiles than SMs: the grid shrinks to n_work, R = 0
    (264, 132, 26, (2, 0, 1)),      # whole waves
    (100, 132, 10, (0, 100, 1)),    # a grid larger than n_work (the kernel never asks for one)
    (5, 3, 1, (1, 2, 1)),           # a single key tile cannot be split
])
def test_tail_split_plan(n_work, grid, n_key, expect):
    plan = FA.tail_split_plan(n_work, grid, n_key)
    assert (plan.whole, plan.tail_tiles, plan.pieces) == expect
    R, P = plan.tail_tiles, plan.pieces
    assert plan.split == (R > 0 and P > 1) and R * P <= grid
    covered = {}  # tile -> key tiles, in the order of the blocks that compute them
    for b in range(grid):
        for s in range(plan.whole):
            covered.setdefault(b + s * grid, []).extend(range(n_key))
        piece = plan.piece_of(b)
        if not plan.split:
            assert piece is None
            if b < R:  # no split: a tail tile is a whole tile, as without split_tail
                covered.setdefault(plan.whole * grid + b, []).extend(range(n_key))
            continue
        if b >= R * P:
            assert piece is None
            continue
        t, p, k0, k1 = piece
        assert t == plan.whole * grid + b // P and p == b % P
        assert k1 - k0 >= FA.MIN_KEY_TILES_PER_PIECE  # no piece too small to pay for its merge
        assert plan.finisher(b) == b - p and plan.piece_of(plan.finisher(b))[1] == 0
        assert plan.piece_of(plan.finisher(b))[0] == t
        covered.setdefault(t, []).extend(range(k0, k1))
    # every tile once, every key tile of every tile exactly once, the pieces in order (contiguous)
    assert sorted(covered) == list(range(n_work))
    assert all(keys == list(range(n_key)) for keys in covered.values())


def test_split_tail_merge_formula_matches_softmax():
    """The kernel's arithmetic in float64 on the CPU: each piece runs the online softmax over its key tiles
    (m = running max of the raw scores, scale inside exp2, the ragged last key tile masked by its absolute
    number), the finisher merges the pieces in block order, with M = 0 where it is -inf. A query tile of B1 H1
    S1000 split into P = 3 pieces of 7 key tiles (block_N = 160), rows past the end read as zeros."""
    import math

    import torch

    seq, dim, block_M, block_N = 1000, 64, 128, 160
    scale = FA.LOG2E / math.sqrt(dim)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(seq, dim, generator=g, dtype=torch.float64) for _ in range(3))
    n_key = -(-seq // block_N)
    plan = FA.tail_split_plan(3, 2, n_key)  # 3 tiles on 2 blocks: R = 1, P = min(2, 3) = 2
    assert plan.pieces == 2
    plan = FA.tail_split_plan(4, 3, n_key)  # R = 1, P = 3
    assert (plan.tail_tiles, plan.pieces) == (1, 3)
    bx = seq // block_M  # the ragged last query tile: 104 rows, 24 past the end (zeros)
    q_tile = torch.zeros(block_M, dim, dtype=torch.float64)
    q_tile[:seq - bx * block_M] = q[bx * block_M:]
    partial = []
    for b in range(plan.pieces):
        _, _, k0, k1 = plan.piece_of(b)
        m = torch.full((block_M,), -math.inf, dtype=torch.float64)
        l = torch.zeros(block_M, dtype=torch.float64)
        acc = torch.zeros(block_M, dim, dtype=torch.float64)
        for kt in range(k0, k1):
            keys = torch.zeros(block_N, dim, dtype=torch.float64)
            vals = torch.zeros(block_N, dim, dtype=torch.float64)
            n = min(block_N, seq - kt * block_N)
            keys[:n], vals[:n] = k[kt * block_N:kt * block_N + n], v[kt * block_N:kt * block_N + n]
            scores = q_tile @ keys.T
            scores[:, n:] = -math.inf
            m_prev, m = m, torch.maximum(m, scores.max(dim=1).values)
            rescale = torch.exp2((m_prev - m) * scale)
            probs = torch.exp2(scores * scale - m[:, None] * scale)
            l = l * rescale + probs.sum(dim=1)
            acc = acc * rescale[:, None] + probs @ vals
        partial.append((m, l, acc))
    m, l, acc = partial[0]
    for m_d, l_d, acc_d in partial[1:]:
        big = torch.maximum(m, m_d)
        safe = torch.where(big == -math.inf, torch.zeros_like(big), big)
        a, a_d = torch.exp2((m - safe) * scale), torch.exp2((m_d - safe) * scale)
        acc, l, m = acc * a[:, None] + acc_d * a_d[:, None], l * a + l_d * a_d, big
    out = acc / l[:, None]
    ref = torch.softmax(q_tile @ k.T / math.sqrt(dim), dim=1) @ v
    assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12)
    # a row no piece has seen (m = -inf everywhere) stays finite through the merge: 0/0 only at the division
    inf = torch.tensor([-math.inf], dtype=torch.float64)
    safe = torch.where(inf == -math.inf, torch.zeros_like(inf), inf)
    assert torch.exp2((inf - safe) * scale).item() == 0.0


def test_split_tail_rejects_causal_and_one_tile_per_block():
    with pytest.raises(ValueError, match="split_tail"):
        FA.flash_attention_forward_ws(4, 32, 4096, 128, True, block_N=160, persistent=True, split_tail=True)
    with pytest.raises(ValueError, match="split_tail"):
        FA.flash_attention_forward_ws(4, 32, 4096, 128, False, block_N=160, split_tail=True)


SPLIT_CFG = dict(FA.HOPPER_CONFIGS[(False, 128)], split_tail=True)


@pytest.fixture(scope="module")
def split_reports():
    """The default full-attention kernel with split_tail at B4 H32 S4096 D128 (R=4, P=13) and at a ragged
    problem whose tail is split too (B1 H6 S3000: R=12, P=9), the default without it, lowered for sm_90a."""
    default = dict(FA.HOPPER_CONFIGS[(False, 128)], split_tail=False)
    jobs = [("split", FA.build(4, 32, 4096, 128, False, SPLIT_CFG), "sm_90a", FA.pass_configs(SPLIT_CFG)),
            ("split ragged", FA.build(1, 6, 3000, 128, False, SPLIT_CFG), "sm_90a", FA.pass_configs(SPLIT_CFG)),
            ("no tail", FA.build(1, 3, 777, 128, False, SPLIT_CFG), "sm_90a", FA.pass_configs(SPLIT_CFG)),
            ("default", FA.build(4, 32, 4096, 128, False, default), "sm_90a", FA.pass_configs(default))]
    return dict(zip([job[0] for job in jobs], tourkit.inspect_kernels(jobs, nvcc=False)))


def _ptxas(source):
    import os
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import gemm_ws_probe

    return gemm_ws_probe.ptxas_report(source, "sm_90a")


def test_split_tail_signature_and_markers(split_reports):
    split, default = split_reports["split"].source, split_reports["default"].source
    tourkit.require_markers(split_reports["split"], ["wgmma", "tma_load", "mbarrier"])
    for name in ("Flags", "Workspace_O", "Workspace_ML"):
        assert name in split and name not in default  # the plain kernel (split_tail=False) is untouched
    assert "flash_attention_fwd_ws_kernel(" in default and "AtomicStore" not in default
    assert split_reports["split"].grid == (132, 1, 1) and split_reports["split"].threads == 384
    # the whole tiles: every block walks exactly 31 (no per-block bound)
    import re

    assert re.findall(r"for \(int step\w* = 0; step\w* < ([^;]+);", split) == ["31", "31"]
    # the tail: blocks below R·P = 52, piece = blockIdx.x % 13
    assert "((int)blockIdx.x) < 52" in split and "((int)blockIdx.x) % 13" in split
    # no tail (21 tiles, 21 blocks): the plain body runs (the device function drops the unused tensors; the
    # host function still takes all seven, so callers need not care)
    no_tail = split_reports["no tail"].source
    assert "AtomicStore" not in no_tail and "__threadfence" not in no_tail and "Workspace" not in no_tail
    assert len(FA.build(1, 3, 777, 128, False, SPLIT_CFG).params) == 7


def test_split_tail_publish_and_merge_order(split_reports):
    """Contributor: plain stores of acc_o, m and l, a fence, the consumers' named barrier, then one release store
    of the flag. Finisher: one thread spins on an acquire load and resets the flag, the barrier, a fence, then
    the reads of the workspace (AtomicStore/AtomicLoad's last argument: 3 release, 2 acquire, 0 relaxed)."""
    import re

    for name in ("split", "split ragged"):
        source = split_reports[name].source
        barrier = f"tl::__sync_thread_partial({FA.SPLIT_BARRIER}, 256);"
        publish = re.search(r"\*\(float2\*\)\(Workspace_O \+ [^;]*\) = \*\(float2\*\)\(acc_o[^;]*;"
                            r"(?:(?!__threadfence).)*?Workspace_ML\[[^;]*\] = l\[[^;]*;\s*\}\s*\}\s*"
                            r"__threadfence\(\);\s*" + re.escape(barrier) + r"\s*"
                            r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*"
                            r"AtomicStore\(\(&\(Flags\[\(\(int\)blockIdx.x\)\]\)\), 1, 3\);", source, re.S)
        assert publish, name
        merge = re.search(r"while \(1\) \{\s*if \(!\(\(AtomicLoad\(\(&\(Flags\[d\]\)\), 2\) == 0\)\)\) "
                          r"\{ break; \}\s*\}\s*AtomicStore\(\(&\(Flags\[d\]\)\), 0, 0\);\s*\}\s*"
                          + re.escape(barrier) + r"\s*__threadfence\(\);", source)
        assert merge, name
        after = source[merge.end():]
        assert "Workspace_ML[" in after and "Workspace_O +" in after  # the reads come after the fence
        assert "Workspace_" not in source[publish.end():merge.start()]
        assert source.count("AtomicStore(") == 2 and source.count("AtomicLoad(") == 1
        # the merge never takes -inf - -inf: M is replaced by 0 where it is -inf
        assert "== -CUDART_INF_F" in after


def test_split_tail_has_no_spills_and_keeps_wgmma_async(split_reports):
    for name in ("split", "split ragged"):
        report = _ptxas(split_reports[name].source)
        assert "error" not in report, report
        assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and not report["warnings"], report


def test_section_runs_in_compile_only_mode():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "flash_attention", "--compile-only", "--arch", "sm_80"])
    assert run.results[0].status == "passed", run.results[0].error_message


# ---------------------------------------------------------------------------------------------------------
# Correctness on a GPU: error within 2x of PyTorch's own fp16 error against a float32 reference
# ---------------------------------------------------------------------------------------------------------

SHAPES = [(2, 4, 1000, 64), (1, 3, 777, 128), (2, 4, 1024, 64), (1, 2, 129, 128), (1, 2, 5, 64)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_sdpa(shape, causal):
    device = tourkit.detect_device()
    cfg = FA.choose_config(shape[3], causal, device.family, device.smem_per_block_optin, device.sm_count)
    attention = FA.compile_attention(*shape, causal, cfg)
    check = FA.check_attention(*shape, causal, attention)
    assert check.passed, check.line()


HOPPER_SCHEDULES = [
    dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True, heavy_first=True),
    dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True, pingpong=True),
    dict(kind="ws", block_M=128, block_N=176, num_stages=2, threads=384, heavy_first=True, stage_output=True),
    dict(kind="ws", block_M=128, block_N=192, num_stages=2, threads=384),
    # three blocks walk every tile: the barriers' phases must carry over from tile to tile
    dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, persistent=True, sms=3, q_stages=2,
         stage_output=True),
    dict(kind="ws", block_M=128, block_N=128, num_stages=2, threads=384, persistent=True, sms=5),
]


SCHEDULE_SHAPES = ((1, 3, 777, 128), (2, 4, 1000, 64))


@pytest.fixture(scope="module")
def hopper_schedules_compiled():
    """Compile every kernel of the test below at once, on all cores (each test then loads it from the cache)."""
    device = tourkit.detect_device()
    if device is None or device.family != "hopper":
        return
    tourkit.compile_many([(FA.build(*shape, causal, cfg), FA.pass_configs(cfg)) for cfg in HOPPER_SCHEDULES
                          for causal in (False, True) for shape in SCHEDULE_SHAPES])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", HOPPER_SCHEDULES, ids=lambda cfg: FA.describe(cfg))
def test_every_hopper_schedule_matches_sdpa(causal, cfg, hopper_schedules_compiled):
    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("wgmma, TMA and setmaxnreg are Hopper-only")
    for shape in SCHEDULE_SHAPES:
        attention = FA.compile_attention(*shape, causal, cfg)
        check = FA.check_attention(*shape, causal, attention)
        assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("sms", [10, 132])
@pytest.mark.parametrize("shape", [(1, 3, 777, 128), (2, 4, 1000, 64), (1, 17, 1000, 128), (1, 6, 3000, 128)])
def test_split_tail_matches_sdpa_and_leaves_the_flags_at_zero(shape, sms):
    """10 blocks split the tails of the small problems (21 tiles: R=1, P=2; 64: R=4, P=2); 132 those of
    B1 H17 S1000 (R=4, P=3) and B1 H6 S3000 (R=12, P=9), with ragged key and query tiles."""
    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("wgmma, TMA and setmaxnreg are Hopper-only")
    if device.sm_count < sms:
        pytest.skip(f"{sms} blocks must be resident at once")
    cfg = dict(SPLIT_CFG, sms=sms)
    attention = FA.compile_attention(*shape, False, cfg)
    check = FA.check_attention(*shape, False, attention)
    assert check.passed, check.line()
    assert int(attention.extra_tensors[-1].count_nonzero().item()) == 0


@pytest.mark.gpu
def test_wrong_shape_is_rejected():
    import torch

    device = tourkit.detect_device()
    cfg = FA.choose_config(64, False, device.family, device.smem_per_block_optin)
    attention = FA.compile_attention(1, 2, 128, 64, False, cfg)
    q = torch.zeros(1, 2, 128, 64, dtype=torch.float16, device="cuda")  # BHSD instead of BSHD
    with pytest.raises(ValueError, match="expected fp16"):
        attention(q, q, q)
