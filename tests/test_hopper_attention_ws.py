"""sections/hopper/attention_ws.py (the appendix): its configuration, the tail split's plan and merge arithmetic,
the hand-written warp-specialized kernel's structure as lowered for sm_90a (CPU); correctness against SDPA, the
persistent grid and the split tail with its flags left at zero (GPU)."""

import math
import os
import re
import sys

import pytest
import tilelang

import tourkit
from sections import attention_plans as plans
from sections import flash_attention as FA
from sections.attention_plans import Problem
from sections.hopper import attention_ws as WS

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
FAST_MATH = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}


# ---------------------------------------------------------------------------------------------------------
# Configuration (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_appendix_configs_per_mode():
    full = WS.choose_config(Problem(4, 32, 4096, 128, False), "hopper", HOPPER, sm_count=114)
    causal = WS.choose_config(Problem(4, 32, 4096, 128, True), "hopper", HOPPER, sm_count=114)
    assert full["kind"] == causal["kind"] == "ws" and full["fast_math"] and causal["heavy_first"]
    assert full["persistent"] and causal["persistent"] and full["sms"] == causal["sms"] == 114  # one block per SM
    assert full["block_N"] == causal["block_N"] == 160 and full["q_stages"] == 2
    assert full["split_tail"] and not causal.get("split_tail")  # causal pairs its tiles instead
    assert WS.choose_config(Problem(4, 32, 4096, 128, False), "hopper", HOPPER)["sms"] == WS.SM_COUNT_H100_H200
    small = WS.choose_config(Problem(4, 32, 4096, 64, False), "hopper", HOPPER), WS.choose_config(
        Problem(4, 32, 4096, 64, True), "hopper", HOPPER)
    assert (small[0]["block_N"], small[1]["block_N"]) == (176, 128) and small[0]["split_tail"] and small[1]["heavy_first"]
    assert WS.choose_config(Problem(4, 32, 4096, 128, False), "ampere", HOPPER) is None
    assert WS.choose_config(Problem(4, 32, 4096, 128, False), "hopper", 160 * 1024) is None  # too little shared memory


def test_two_q_buffers_fit_only_with_160_wide_key_tiles():
    cfg = WS.HOPPER_CONFIGS[(False, 128)]
    assert cfg["q_stages"] == 2 and WS.config_smem(128, cfg) <= HOPPER
    assert WS.config_smem(128, dict(cfg, block_N=176)) > HOPPER


def test_split_tail_rejects_causal_and_one_tile_per_block():
    with pytest.raises(ValueError, match="split_tail"):
        WS.flash_attention_forward_ws(4, 32, 4096, 128, True, block_N=160, persistent=True, split_tail=True)
    with pytest.raises(ValueError, match="split_tail"):
        WS.flash_attention_forward_ws(4, 32, 4096, 128, False, block_N=160, split_tail=True)


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
    plan = WS.tail_split_plan(n_work, grid, n_key)
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
        assert k1 - k0 >= WS.MIN_KEY_TILES_PER_PIECE  # no piece too small to pay for its merge
        assert plan.finisher(b) == b - p and plan.piece_of(plan.finisher(b))[1] == 0
        assert plan.piece_of(plan.finisher(b))[0] == t
        covered.setdefault(t, []).extend(range(k0, k1))
    # every tile once, every key tile of every tile exactly once, the pieces in order (contiguous)
    assert sorted(covered) == list(range(n_work))
    assert all(keys == list(range(n_key)) for keys in covered.values())


def test_split_tail_merge_formula_matches_softmax():
    """A float64 model of what the kernel computes, on the key ranges tail_split_plan gives its pieces (the
    kernel itself is checked on the GPU): each piece runs the online softmax over its key tiles (m = running
    max of the raw scores, scale inside exp2, the ragged last key tile masked), the finisher merges the pieces
    in block order, with M = 0 where it is -inf. The pieces must cover the keys exactly once for the merge to
    equal softmax. A query tile of B1 H1 S1000 split into P = 3 pieces of 7 key tiles (block_N = 160)."""
    import torch

    seq, dim, block_M, block_N = 1000, 64, 128, 160
    scale = FA.LOG2E / math.sqrt(dim)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(seq, dim, generator=g, dtype=torch.float64) for _ in range(3))
    n_key = -(-seq // block_N)
    assert WS.tail_split_plan(3, 2, n_key).pieces == 2  # 3 tiles on 2 blocks: R = 1, P = min(2, 3) = 2
    plan = WS.tail_split_plan(4, 3, n_key)  # R = 1, P = 3
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
    ranges = [plan.piece_of(b)[2:] for b in range(plan.pieces)]
    assert [k for k0, k1 in ranges for k in range(k0, k1)] == list(range(n_key))  # each key tile once, in order


# ---------------------------------------------------------------------------------------------------------
# The kernel as lowered for sm_90a (no GPU)
# ---------------------------------------------------------------------------------------------------------

SPLIT_CFG = WS.HOPPER_CONFIGS[(False, 128)]


@pytest.fixture(scope="module")
def ws_reports():
    """The appendix's kernels lowered for sm_90a: full with the split tail at B4 H32 S4096 D128 (R=4, P=13), at a
    ragged problem whose tail is split too (B1 H6 S3000: R=12, P=9) and at one without a tail (B1 H3 S777);
    the same kernel without split_tail; causal (paired tiles); small causal kernels on one tile per block and
    on a persistent grid of three blocks."""
    plain = dict(SPLIT_CFG, split_tail=False)
    causal = WS.HOPPER_CONFIGS[(True, 128)]
    small = dict(block_N=128, heavy_first=True, sms=3)
    funcs = {"split": WS.build(Problem(4, 32, 4096, 128, False), dict(SPLIT_CFG, sms=132)),
             "split ragged": WS.build(Problem(1, 6, 3000, 128, False), dict(SPLIT_CFG, sms=132)),
             "no tail": WS.build(Problem(1, 3, 777, 128, False), dict(SPLIT_CFG, sms=132)),
             "plain": WS.build(Problem(4, 32, 4096, 128, False), dict(plain, sms=132)),
             "causal": WS.build(Problem(4, 32, 4096, 128, True), dict(causal, sms=132)),
             "one tile per block": WS.flash_attention_forward_ws(2, 4, 1000, 128, True, **small),
             "persistent": WS.flash_attention_forward_ws(2, 4, 1000, 128, True, persistent=True, **small),
             "gqa bf16": WS.build(Problem(1, 8, 1000, 128, False, 2, "bfloat16"), dict(SPLIT_CFG, sms=132)),
             "two causal blocks": WS.build(Problem(2, 3, 256, 128, True), WS.choose_config(
                 Problem(2, 3, 256, 128, True), "hopper", HOPPER))}
    jobs = [(name, func, "sm_90a", FAST_MATH) for name, func in funcs.items()]
    return dict(zip(funcs, tourkit.inspect_kernels(jobs, nvcc=False)))


def test_shared_memory_estimate_bounds_the_lowered_kernels(ws_reports):
    for name in ("split", "plain", "causal"):
        estimate = WS.config_smem(128, SPLIT_CFG)
        assert estimate <= ws_reports[name].smem_bytes <= estimate + 1024, (name, ws_reports[name].smem_bytes)
    estimate = WS.config_smem(128, dict(block_M=128, block_N=128, num_stages=2))
    assert estimate <= ws_reports["persistent"].smem_bytes <= estimate + 1024  # + the barriers


@pytest.mark.parametrize("name", ["one tile per block", "persistent", "causal"])
def test_hand_written_warp_specialization(ws_reports, name):
    """One producer warp feeds a ring of mbarrier-guarded K/V buffers, the consumers peel the FA3 schedule, and
    nothing in it waits for the whole block (a __syncthreads in a role's branch would hang: the producer warps
    never reach it)."""
    rep = ws_reports[name]
    tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS["hopper"])
    source = rep.source
    assert source.count("__syncthreads()") == 1  # after the barriers' initialization only
    producer, consumer = source.split("warpgroup_reg_alloc<240>")
    assert "warpgroup_reg_dealloc<24>" in producer and "tma_load(" in producer and "wgmma_" not in producer
    assert "tma_load(" not in consumer
    # The peeled schedule: Q·K(0)ᵀ alone (waited at once), a loop with both MMAs and wait<1>, the last P·V alone.
    assert consumer.count("wgmma_ss<") == 2 and consumer.count("wgmma_rs<") == 2
    assert consumer.index("wait_wgmma<0>") < consumer.index("wait_wgmma<1>") < consumer.rindex("wgmma_rs<")
    # Every buffer is released: K after its Q·Kᵀ, V after its P·V, Q after the tile's last Q·Kᵀ (or its store).
    for barrier in ("k_empty", "v_empty", "q_empty"):
        assert f"{barrier}[" in consumer and ".arrive()" in consumer.split(f"{barrier}[", 1)[1][:40]
    assert rep.threads == 384
    work_loops = re.findall(r"for \(int step\w* = 0; step\w* < ([^;]+);", source)
    if name == "one tile per block":  # the work loop is gone
        assert not work_loops
    else:  # each role with its own loop over its block's share of the tiles
        assert len(work_loops) == 2 and all("blockIdx.x" in bound for bound in work_loops), work_loops


def test_short_problems_take_narrower_key_tiles(ws_reports):
    """512 keys: four 128-wide tiles, not four 160-wide ones; two causal query blocks are not paired (TileLang
    0.1.15 fails to lower that pairing) but lower with the heaviest first."""
    for causal in (False, True):
        assert WS.choose_config(Problem(8, 32, 512, 128, causal), "hopper", HOPPER)["block_N"] == 128
    assert WS.choose_config(Problem(1, 8, 1000, 128, False), "hopper", HOPPER)["block_N"] == 144
    tourkit.require_markers(ws_reports["two causal blocks"], tourkit.TENSOR_CORE_MARKERS["hopper"])


def test_grouped_query_attention_in_bf16(ws_reports):
    """K and V with 2 heads for 8 query heads: the producer's TMA descriptors describe (B, S, 2, D) tensors and
    the MMAs take bf16."""
    rep = ws_reports["gqa bf16"]
    tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS["hopper"])
    assert "bfloat16_t" in rep.source and "half_t" not in rep.source
    func = WS.build(Problem(1, 8, 1000, 128, False, 2, "bfloat16"), dict(SPLIT_CFG, sms=132))
    shapes = [tuple(int(d) for d in func.buffer_map[param].shape) for param in func.params[:4]]
    assert shapes == [(1, 1000, 8, 128), (1, 1000, 2, 128), (1, 1000, 2, 128), (1, 1000, 8, 128)]


def test_split_tail_signature_and_markers(ws_reports):
    split, plain = ws_reports["split"].source, ws_reports["plain"].source
    tourkit.require_markers(ws_reports["split"], tourkit.TENSOR_CORE_MARKERS["hopper"])
    for name in ("Flags", "Workspace_O", "Workspace_ML"):
        assert name in split and name not in plain  # the plain kernel (split_tail=False) is untouched
    assert "flash_attention_fwd_ws_kernel(" in plain and "AtomicStore" not in plain
    assert ws_reports["split"].grid == (132, 1, 1) and ws_reports["split"].threads == 384
    # the whole tiles: every block walks exactly 31 (no per-block bound)
    assert re.findall(r"for \(int step\w* = 0; step\w* < ([^;]+);", split) == ["31", "31"]
    # the tail: blocks below R·P = 52, piece = blockIdx.x % 13
    assert "((int)blockIdx.x) < 52" in split and "((int)blockIdx.x) % 13" in split
    # no tail (21 tiles, 21 blocks): the plain body runs (the device function drops the unused tensors; the
    # host function still takes all seven, so callers need not care)
    no_tail = ws_reports["no tail"].source
    assert "AtomicStore" not in no_tail and "__threadfence" not in no_tail and "Workspace" not in no_tail
    assert len(WS.build(Problem(1, 3, 777, 128, False), SPLIT_CFG).params) == 7


def test_split_tail_publish_and_merge_order(ws_reports):
    """Contributor: plain stores of acc_o, m and l, a fence, the consumers' named barrier, then one release store
    of the flag. Finisher: one thread spins on an acquire load and resets the flag, the barrier, a fence, then
    the reads of the workspace (AtomicStore/AtomicLoad's last argument: 3 release, 2 acquire, 0 relaxed)."""
    for name in ("split", "split ragged"):
        source = ws_reports[name].source
        barrier = f"tl::__sync_thread_partial({WS.SPLIT_BARRIER}, 256);"
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
        assert "== -CUDART_INF_F" in after  # the merge never takes -inf - -inf: M is 0 where it is -inf


def test_split_tail_has_no_spills(ws_reports):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    import gemm_ws_probe

    report = gemm_ws_probe.ptxas_report(ws_reports["split"].source, "sm_90a")
    assert "error" not in report, report
    assert report["spill_stores"] == 0 and report["spill_loads"] == 0 and not report["warnings"], report


# ---------------------------------------------------------------------------------------------------------
# Correctness on a GPU (Hopper)
# ---------------------------------------------------------------------------------------------------------


def compile_ws(shape, causal, cfg):
    kernel = tilelang.compile(WS.build(Problem(*shape, causal), cfg), out_idx=None, target="cuda", pass_configs=FAST_MATH)
    return WS.launcher(kernel)


def require_hopper(sms: int = 0):
    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("wgmma, TMA and setmaxnreg are Hopper-only")
    if device.sm_count < sms:
        pytest.skip(f"{sms} blocks must be resident at once")
    return device


WS_SCHEDULES = [
    dict(block_M=128, block_N=176, num_stages=2, heavy_first=True, stage_output=True),
    dict(block_M=128, block_N=192, num_stages=2),
    # three blocks walk every tile: the barriers' phases must carry over from tile to tile
    dict(block_M=128, block_N=160, num_stages=2, persistent=True, sms=3, q_stages=2, stage_output=True),
    dict(block_M=128, block_N=128, num_stages=2, persistent=True, sms=5),
]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", WS_SCHEDULES, ids=lambda cfg: " ".join(map(str, plans.describe(dict(cfg, kind="ws", threads=384)))))
def test_every_ws_schedule_matches_sdpa(causal, cfg):
    require_hopper()
    for shape in ((1, 3, 777, 128), (2, 4, 1000, 64)):
        (check,) = FA.check_attention(Problem(*shape, causal), {"appendix": compile_ws(shape, causal, cfg)})
        assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("problem", [(2, 4, 1000, 64), (1, 3, 777, 128), (1, 2, 129, 128), (1, 4, 1, 128),
                                     (2, 8, 1000, 128, 2), (1, 6, 3000, 128, 3, "bfloat16"), (4, 3, 256, 128),
                                     (2, 16, 2048, 64, 2, "bfloat16")],
                         ids=lambda p: "x".join(map(str, p)))
def test_appendix_configs_match_sdpa(problem, causal):
    """The appendix's configurations, also on one query row, grouped-query attention and bf16."""
    device = require_hopper()
    problem = Problem(*problem[:4], causal, *problem[4:])
    cfg = WS.choose_config(problem, "hopper", HOPPER, device.sm_count)
    kernel = tilelang.compile(WS.build(problem, cfg), out_idx=None, target="cuda", pass_configs=FAST_MATH)
    (check,) = FA.check_attention(problem, {"appendix": WS.launcher(kernel)})
    assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("sms", [10, 132])
@pytest.mark.parametrize("shape", [(1, 3, 777, 128), (2, 4, 1000, 64), (1, 17, 1000, 128), (1, 6, 3000, 128)])
def test_split_tail_matches_sdpa_and_leaves_the_flags_at_zero(shape, sms):
    """10 blocks split the tails of the small problems (21 tiles: R=1, P=2; 64: R=4, P=2); 132 those of
    B1 H17 S1000 (R=4, P=3) and B1 H6 S3000 (R=12, P=9), with ragged key and query tiles."""
    require_hopper(sms)
    attention = compile_ws(shape, False, dict(SPLIT_CFG, sms=sms))
    (check,) = FA.check_attention(Problem(*shape, False), {"appendix": attention})
    assert check.passed, check.line()
    assert isinstance(attention, WS.SplitTailMemory) and attention.flags_left() == 0
