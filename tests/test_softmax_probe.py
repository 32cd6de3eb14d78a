"""bench/softmax_probe.py: the plan sweep (CPU), every plan the probe would time lowers (sm_80) and compiles with
nvcc (sm_90a) (CPU), the online kernels' structure (CPU); on a GPU: the per-thread one against torch.softmax,
and the probe end to end with no plan dropped; the shapes probe's plans (CPU)."""

import json
import os
import sys

import pytest

import tourkit
from sections import softmax as S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import softmax_probe as probe  # noqa: E402
import softmax_shapes_probe as shapes_probe  # noqa: E402
from sections import softmax_plans as P  # noqa: E402
from sections.softmax_plans import SMEM_SLACK  # noqa: E402

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
AMPERE = tourkit.ARCH_SPECS["sm_80"].smem_per_block_optin


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
        section.kind, section.rows_per_block, section.threads, section.min_blocks_per_sm)
    labels = [p.label() for p in plans]
    assert len(set(labels)) == len(labels)
    staged = {(p.rows, p.threads) for p in plans if p.kind == "staged" and p.bulk and not p.min_blocks}
    assert {r for r, _ in staged} == {8, 16, 32}  # 24 rows do not divide 4096
    assert {(8, 128), (8, 256), (8, 512), (16, 512), (32, 1024)} <= staged
    assert "staged R8 T256 noTMA" in labels  # the staged 8-row kernel with plain copies
    assert "staged R8 T256 mb4" in labels  # 512 blocks in one wave of 132 SMs x 4
    registers = {(p.rows, p.threads) for p in plans if p.kind == "registers"}
    assert {(1, 256), (2, 256), (4, 256), (8, 256)} <= registers
    for p in plans:
        assert probe.valid(p, 4096, 1823, HOPPER) or p.chosen
        assert p.smem_estimate(1823) + probe.SMEM_MARGIN <= probe.SMEM_LIMIT


def test_row_groups_start_aligned_and_bulk_copies_divide_m():
    """Staged groups start 16-byte aligned; a bulk copy (no bounds) only where its rows divide M, plain masked
    copies where they do not (the register kernel masks a partial last block itself)."""
    plans = plans_for(1000, 1823)
    for p in plans:
        if p.kind == "staged":
            assert (p.rows * 1823) % 8 == 0 and (1000 % p.rows == 0 or not p.bulk), p.label()
    assert {p.rows for p in plans if p.kind == "staged" and p.bulk} == {8}
    assert any(p.kind == "staged" and not p.bulk and p.rows == 16 for p in plans)


def test_plans_over_the_shared_memory_limit_are_not_built():
    plans = plans_for(8192, 32768)  # a 64 KiB row: 4 staged rows would need 256 KiB
    assert plans and all(p.smem_estimate(32768) + probe.SMEM_MARGIN <= probe.SMEM_LIMIT for p in plans)
    assert not any(p.kind == "staged" and p.rows == 4 for p in plans)
    assert {p.kind for p in plans} >= {"online", "online-per-thread", "staged", "registers"}
    ampere = plans_for(8192, 32768, "sm_80")
    assert all(p.smem_estimate(32768) + probe.SMEM_MARGIN <= AMPERE for p in ampere)


def test_ampere_gets_no_tma():
    plans = plans_for(4096, 1823, "sm_80")
    assert plans[0].chosen and plans[0].kind == "registers"  # the section's pick needs no TMA either
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


def test_per_thread_online_kernel_reduces_across_threads_only_twice():
    source = lowered(probe.build(probe.Plan("online-per-thread", 1, 512), 64, 32768))
    assert source.count("AllReduce<") == 2  # not two per chunk: the chunk loop stays inside each thread
    chunked = lowered(probe.build(probe.Plan("online", 8192, 512), 64, 32768))
    assert chunked.count("AllReduce<") == 2 and "for (int c = 0; c < 4; ++c)" in chunked  # two in every chunk
    with pytest.raises(ValueError, match="whole vectors"):
        S.long_rows_online(64, 3000, 12, 512)


# ---------------------------------------------------------------------------------------------------------
# Every plan the probe would time compiles (nvcc, no GPU)
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch, shape, nvcc", [("sm_90a", (1000, 1823), True), ("sm_80", (4096, 1823), False)],
                         ids=["sm_90a-1000x1823-nvcc", "sm_80-4096x1823-lowered"])
def test_every_plan_compiles(arch, shape, nvcc):
    M, N = shape
    rows = probe.compile_only(M, N, arch, nvcc=nvcc)
    assert [r["label"] for r in rows] == [p.label() for p in plans_for(M, N, arch)]
    failed = [(r["label"], r["status"]) for r in rows if not r["compiled"]]
    assert failed == []
    limit = min(probe.SMEM_LIMIT, tourkit.ARCH_SPECS[arch].smem_per_block_optin)
    assert all(r["smem"] <= limit for r in rows)
    if nvcc and tourkit.find_nvcc() is not None:
        assert all(r["status"] == "compiled" for r in rows)
        assert all(r.get("regs", 0) > 0 for r in rows), [r["label"] for r in rows if not r.get("regs")]
        assert all(r["blocks_per_sm"] >= 1 for r in rows)
    for r in rows:
        plan = probe.Plan(**r["plan"])
        assert r["launch_grid"] == [plan.grid(M), 1, 1] and r["threads"] == plan.threads, r["label"]


def test_compile_only_command_line(tmp_path):
    # 1000x1823 for sm_90a: kernels already built by test_every_plan_compiles (TileLang's cache)
    assert probe.main(["--compile-only", "sm_90a", "--shape", "1000x1823", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "softmax_probe_compile_sm_90a.json").read_text())
    assert report["shapes"][0]["shape"] == [1000, 1823] and report["shapes"][0]["plans"]


# ---------------------------------------------------------------------------------------------------------
# On a GPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, threads", [(37, 32768, 512), (64, 16384, 256)])
def test_per_thread_online_kernel_matches_torch(M, N, threads):
    device = tourkit.detect_device()
    plan = probe.Plan("online-per-thread", 1, threads, bulk=device.family == "hopper")
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


# ---------------------------------------------------------------------------------------------------------
# bench/softmax_shapes_probe.py: users' problems (no GPU)
# ---------------------------------------------------------------------------------------------------------



@pytest.mark.parametrize("text", shapes_probe.SHAPES)
def test_the_shapes_probe_starts_with_the_sections_pick_and_sweeps_only_plans_that_fit(text):
    M, N, dtype = shapes_probe.parse(text)
    plans = shapes_probe.alternatives(M, N, HOPPER, "hopper")
    assert plans[0] == S.choose_plan(M, N, HOPPER, "hopper") and len(set(plans)) == len(plans) <= 12
    for plan in plans:
        if plan.kind == "online":
            step = plan.threads * plan.rows_per_block
            assert 2 * (-(-plan.staged // step) * step) + SMEM_SLACK <= HOPPER
            assert plan.rows_per_block % S.vector_width(N) == 0
        elif plan.kind == "cluster":  # each block's part staged whole, every block owning some of the row
            step = plan.threads * plan.rows_per_block
            assert 2 * (-(-plan.staged // step) * step) + SMEM_SLACK <= HOPPER and P.splits_over(N, plan.cluster)
        else:
            assert plan.threads % plan.rows_per_block == 0 and plan.threads <= 1024


def test_the_shapes_probe_plans_lower():
    M, N, _ = shapes_probe.parse("8192x32000")
    for plan in shapes_probe.alternatives(M, N, HOPPER, "hopper"):
        assert "__global__" in lowered(S.build(M, N, plan, "hopper", "bfloat16"))


def test_the_shapes_probe_lists_without_a_gpu(capsys):
    assert shapes_probe.main(["--list", "--shapes", "1x1,1024x128256:bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "1024x128256 bfloat16:" in out and "staged in shared memory" in out
