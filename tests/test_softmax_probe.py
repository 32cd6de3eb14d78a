"""bench/softmax_probe.py: the plan sweep (CPU), every plan the probe would time lowers and compiles with nvcc for
sm_90a and sm_80 (CPU), the hand-pipelined staged kernel's structure (CPU); on a GPU: the pipelined kernel against
torch.softmax on ragged grids, and the probe end to end with no plan dropped."""

import json
import os
import re
import sys

import pytest

import tourkit
from sections import softmax as S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import softmax_probe as probe  # noqa: E402

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
AMPERE = tourkit.ARCH_SPECS["sm_80"].smem_per_block_optin
SHAPES = [(4096, 1823), (1000, 1823)]  # the target shape, and a small one (125 groups: ragged pipelined grids)


def plans_for(M, N, arch="sm_90a"):
    spec = tourkit.ARCH_SPECS[arch]
    return probe.candidate_plans(M, N, spec.family, probe.REFERENCE_SMS[arch], arch,
                                 min(probe.SMEM_LIMIT, spec.smem_per_block_optin))


# ---------------------------------------------------------------------------------------------------------
# The sweep (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_the_sweep_for_4096x1823_on_hopper():
    plans = plans_for(4096, 1823)
    pick = plans[0]
    assert pick.chosen and sum(p.chosen for p in plans) == 1
    section = S.choose_plan(4096, 1823, HOPPER, "hopper")
    assert (pick.kind, pick.rows, pick.threads, pick.min_blocks) == (
        "registers", section.rows_per_block, section.threads, section.min_blocks_per_sm) == ("registers", 4, 128, 8)
    labels = [p.label() for p in plans]
    assert len(set(labels)) == len(labels)
    staged = {(p.rows, p.threads) for p in plans if p.kind == "staged" and p.bulk and not p.min_blocks}
    assert {r for r, _ in staged} == {8, 16, 32}  # 24 rows do not divide 4096
    assert {(8, 128), (8, 256), (8, 512), (16, 512), (32, 1024)} <= staged
    assert "staged R8 T256 noTMA" in labels  # the staged 8-row kernel with plain copies
    assert "staged R8 T256 mb4" in labels  # 512 blocks in one wave of 132 SMs x 4
    registers = {(p.rows, p.threads) for p in plans if p.kind == "registers"}
    assert {(1, 256), (2, 256), (4, 256), (8, 256)} <= registers
    pipelined = [p for p in plans if p.kind == "pipelined"]
    assert {p.stages for p in pipelined} == {2, 3, 4} and any(p.lag for p in pipelined)
    assert {p.blocks for p in pipelined} >= {256, 128, 64, 132, 264}  # groups/2, /4, /8; 1 and 2 per SM
    assert all(p.rows == 8 and p.blocks < 4096 // 8 for p in pipelined)
    for p in plans:
        assert probe.valid(p, 4096, 1823, HOPPER) or p.chosen
        assert p.smem_estimate(1823) + probe.SMEM_MARGIN <= probe.SMEM_LIMIT


def test_rows_per_block_divide_m_and_start_aligned():
    for p in plans_for(1000, 1823):
        if p.kind in ("staged", "pipelined", "registers"):
            assert 1000 % p.rows == 0, p.label()
        if p.kind in ("staged", "pipelined"):
            assert (p.rows * 1823) % 8 == 0 and p.rows == 8, p.label()


def test_plans_over_the_shared_memory_limit_are_not_built():
    plans = plans_for(8192, 32768)  # a 64 KiB row: 4 staged rows or a 4-deep ring would need 256 KiB
    assert plans and all(p.smem_estimate(32768) + probe.SMEM_MARGIN <= probe.SMEM_LIMIT for p in plans)
    assert not any(p.kind == "staged" and p.rows == 4 for p in plans)
    assert not any(p.kind == "pipelined" and p.stages == 4 for p in plans)
    assert any(p.kind == "pipelined" and p.stages == 3 for p in plans)  # 192 KiB fits
    assert {p.kind for p in plans} >= {"online", "online-per-thread", "staged", "registers"}
    ampere = plans_for(8192, 32768, "sm_80")
    assert all(p.smem_estimate(32768) + probe.SMEM_MARGIN <= AMPERE for p in ampere)


def test_ampere_gets_no_tma_and_no_pipelined_kernel():
    plans = plans_for(4096, 1823, "sm_80")
    assert plans[0].chosen and plans[0].kind == "registers"  # the section's pick needs no TMA either
    assert not any(p.kind == "pipelined" for p in plans)
    assert all(not p.bulk for p in plans if p.kind in ("staged", "online", "online-per-thread"))


def test_a_min_blocks_variant_needs_room_for_the_thread_floats():
    # 8 rows over 512 threads: 29 floats, but 4 blocks of 512 threads leave 32 registers: no variant.
    assert probe.one_wave_min_blocks(probe.Plan("staged", 8, 512), 4096, 1823, 132, "sm_90a") == 0
    assert probe.one_wave_min_blocks(probe.Plan("staged", 8, 256), 4096, 1823, 132, "sm_90a") == 4
    assert probe.one_wave_min_blocks(probe.Plan("staged", 32, 1024), 4096, 1823, 132, "sm_90a") == 0  # one wave


def test_blocks_per_sm_arithmetic():
    assert probe.blocks_per_sm(256, 71, 29176, "sm_90a") == 3  # the section's plan: 512 blocks are 1.3 waves
    assert probe.blocks_per_sm(256, 64, 29176, "sm_90a") == 4  # capped at 64 registers: one wave
    assert probe.blocks_per_sm(256, 32, 100 * 1024, "sm_90a") == 2  # shared memory
    assert probe.blocks_per_sm(1024, 16, 0, "sm_90a") == 2  # threads
    assert probe.blocks_per_sm(256, None, 0, "sm_90a") is None


def test_command_line_shapes():
    assert probe.parse_shapes("bench") == S.BENCH_SHAPES
    assert probe.parse_shapes("4096x1823,2048x1823") == [(4096, 1823), (2048, 1823)]
    with pytest.raises(Exception):
        probe.parse_shape("4096")


def test_pipelined_builder_rejects_bad_parameters():
    with pytest.raises(ValueError, match="store_lag"):
        probe.rows_staged_pipelined(4096, 1823, 8, 256, 128, num_stages=2, store_lag=1)
    with pytest.raises(ValueError, match="16-byte"):
        probe.rows_staged_pipelined(1004, 1823, 8, 256, 64)  # 1004 rows: not whole groups of 8
    with pytest.raises(ValueError, match="blocks"):
        probe.rows_staged_pipelined(4096, 1823, 8, 256, 513)


# ---------------------------------------------------------------------------------------------------------
# Lowering (no nvcc)
# ---------------------------------------------------------------------------------------------------------


def lowered(func, arch="sm_90a"):
    return tourkit.lower_for_arch(func, arch).kernel_source


def test_the_probe_builds_the_sections_pick_exactly_as_the_section():
    for arch in ("sm_90a", "sm_80"):
        spec = tourkit.ARCH_SPECS[arch]
        for M, N in [(4096, 1823), (2048, 1823)]:
            plan = S.choose_plan(M, N, spec.smem_per_block_optin, spec.family)
            pick = plans_for(M, N, arch)[0]
            assert lowered(probe.build(pick, M, N), arch) == lowered(S.build(M, N, plan, spec.family), arch)


def test_min_blocks_only_changes_the_launch_bounds():
    plain = lowered(S.rows_staged_in_shared(4096, 1823, 8, 256))
    assert plain == lowered(S.rows_staged_in_shared(4096, 1823, 8, 256, min_blocks_per_sm=0))
    capped = lowered(S.rows_staged_in_shared(4096, 1823, 8, 256, min_blocks_per_sm=4))
    assert "__launch_bounds__(256, 1)" in plain and "__launch_bounds__(256, 4)" in capped
    assert capped.replace("__launch_bounds__(256, 4)", "__launch_bounds__(256, 1)") == plain
    regs = lowered(S.rows_in_registers(4096, 1823, 8, 256, min_blocks_per_sm=4))
    assert "__launch_bounds__(256, 4)" in regs


@pytest.mark.parametrize("lag,stages", [(0, 2), (1, 3)])
def test_pipelined_kernel_is_one_role_with_a_ring_of_bulk_copies(lag, stages):
    # 1000 rows: 125 groups over 13 blocks, so the blocks walk 9 or 10 groups (a ragged grid).
    source = lowered(probe.rows_staged_pipelined(1000, 1823, 8, 256, 13, stages, store_lag=lag))
    assert "__launch_bounds__(256, 1)" in source  # no producer warp group added: every thread computes
    assert "warpgroup_reg" not in source and "threadIdx.x) < 256" not in source
    assert len(re.findall(r"\.init\(256\)", source)) == stages  # one full barrier per buffer, all threads arrive
    assert source.count("tl::tma_load(") == 2 and source.count("tl::tma_store(") == 1  # prologue + refill
    assert re.search(r"\.wait\(\(\(it (>> 1|/ %d)\) & 1\)\)" % stages, source)  # the n-th fill: parity n & 1
    refill = source[source.index("tl::tma_store("):]
    assert f"tma_store_wait<{lag}, true>" in refill.split("tl::tma_load(")[0]  # the store has read the buffer first
    assert source.rstrip().endswith("tl::tma_store_wait<0, true>();\n}")  # the last store has read shared memory
    assert "float x[57];" in source  # 32 threads a row, 57 floats each, as the section's staged kernel


# ---------------------------------------------------------------------------------------------------------
# Every plan the probe would time compiles (nvcc, no GPU)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_every_plan_compiles(arch, shape):
    M, N = shape
    rows = probe.compile_only(M, N, arch)
    assert [r["label"] for r in rows] == [p.label() for p in plans_for(M, N, arch)]
    failed = [(r["label"], r["status"]) for r in rows if not r["compiled"]]
    assert failed == []
    limit = min(probe.SMEM_LIMIT, tourkit.ARCH_SPECS[arch].smem_per_block_optin)
    assert all(r["smem"] <= limit for r in rows)
    if tourkit.find_nvcc() is not None:
        assert all(r["status"] == "compiled" for r in rows)
        assert all(r.get("regs", 0) > 0 for r in rows), [r["label"] for r in rows if not r.get("regs")]
        assert all(r["blocks_per_sm"] >= 1 for r in rows)
    for r in rows:
        plan = probe.Plan(**r["plan"])
        assert r["launch_grid"] == [plan.grid(M), 1, 1] and r["threads"] == plan.threads, r["label"]


def test_compile_only_command_line(tmp_path):
    # 1000x1823 for sm_80: kernels already built by test_every_plan_compiles (TileLang's cache)
    assert probe.main(["--compile-only", "sm_80", "--shape", "1000x1823", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "softmax_probe_compile_sm_80.json").read_text())
    assert report["shapes"][0]["shape"] == [1000, 1823] and report["shapes"][0]["plans"]


# ---------------------------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("args", [(1000, 1823, 8, 256, 13, 2, 0), (1000, 1823, 8, 256, 13, 3, 1),
                                  (1000, 1823, 8, 128, 7, 4, 1), (1000, 1823, 8, 512, 63, 2, 0),
                                  (256, 4096, 1, 256, 100, 2, 0), (64, 32768, 1, 1024, 10, 3, 1)],
                         ids=lambda a: "M{}xN{} R{} T{} B{} S{} lag{}".format(*a))
def test_pipelined_kernel_matches_torch(args):
    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("the pipelined kernel needs TMA (Hopper)")
    M, N, R, T, blocks, stages, lag = args
    plan = probe.Plan("pipelined", R, T, blocks=blocks, stages=stages, lag=lag)
    kernel = tourkit.compile_many([probe.build(plan, M, N)])[0]
    assert kernel is not None
    result = probe.validate_plan(plan, kernel, M, N)
    assert result["ok"], result["line"]


@pytest.mark.gpu
def test_probe_end_to_end_drops_no_plan(tmp_path):
    assert probe.main(["--shape", "1000x1823", "--rounds", "2", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "softmax_probe.json").read_text())
    shape = results["shapes"][0]
    assert shape["dropped"] == []
    assert any(p["chosen"] for p in shape["plans"])
    assert all(p["us"] > 0 and p["rel_error"] <= probe.TOLERANCE for p in shape["plans"])
    assert shape["copy_us"] > 0 and shape["torch_us"] > 0
