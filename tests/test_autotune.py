"""autotune: the search space, the shared-memory filter, the cache flow, compile-only through the runner.

The CPU cache-flow test replaces only the GPU timing (AutoTuner._benchmark_target) with a deterministic
fake, so the compile, selection, in-memory, on-disk and new-process cache paths all run for real."""

import os

import pytest

import tourkit
from sections import autotune
from sections.gemm_schedules import GemmConfig

HOPPER_BUDGET = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin


def test_search_space_is_the_product_of_its_axes():
    for family in ("hopper", "ampere", "ada", "turing"):
        for full in (False, True):
            axes = autotune.SPACES[family]["full" if full else "default"]
            space = autotune.search_space(family, full)
            expected = 1
            for key in autotune.TUNED_KEYS:
                expected *= len(axes[key])
            assert len(space) == expected
            assert all(set(c) == set(autotune.TUNED_KEYS) for c in space)
            assert len({tuple(sorted(c.items())) for c in space}) == expected  # no duplicates
    with pytest.raises(ValueError):
        autotune.search_space("volta")


def test_default_space_is_small_and_full_is_larger():
    default = autotune.search_space("hopper")
    assert 8 <= len(default) <= 32  # about a minute on an H200
    assert len(autotune.search_space("hopper", full=True)) > 4 * len(default)


def test_filter_drops_exactly_what_does_not_fit():
    space = autotune.search_space("hopper")
    kept, dropped = autotune.filter_space(space, HOPPER_BUDGET)
    assert len(kept) + len(dropped) == len(space)
    assert all(autotune.to_gemm_config(c).smem_bytes() <= HOPPER_BUDGET for c in kept)
    assert all(need > HOPPER_BUDGET for _, need in dropped)
    labels = {autotune.to_gemm_config(c).label() for c, _ in dropped}
    assert "256x256x64 s4 t256 swz" in labels  # 4 stages of 256x64 + 64x256 fp16 tiles: 256 KiB
    kept_small, dropped_small = autotune.filter_space(space, 100 * 1024)
    assert len(dropped_small) > len(dropped)
    assert autotune.filter_space(space, 10**9)[1] == []


def test_empty_space_is_reported_clearly():
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False)
    space = autotune.search_space("hopper")
    kept, dropped = autotune.filter_space(space, 1024)
    assert kept == []
    with pytest.raises(tourkit.SectionSkip, match="EMPTY"):
        autotune.report_filter(ctx, space, kept, dropped)
    assert any(f"{len(space)} of {len(space)}" in line for line in ctx.report)


def test_tuned_function_builds_the_gemm_schedules_program():
    func = autotune.gemm_for_tuning(256, 256, 256, "x", block_M=128, block_N=128, block_K=64, num_stages=2,
                                    threads=128, swizzle=False)
    assert "gemm" in func.script()
    assert autotune.to_gemm_config(autotune.search_space("hopper")[0]) == GemmConfig(128, 128, 64, 3, 256, True)
    assert len(autotune.builder_hash()) == 16 and autotune.builder_hash() == autotune.builder_hash()


def test_latency_lines_are_parsed():
    import io

    rec = autotune._TunedLatencies(io.StringIO())
    rec.write("Tuned Latency 1.25 with config {'block_M': 128} at index 3\nnoise\n")
    rec.write("Tuned Latency 0.5 with config {'block_M': 256, 'swizzle': True} at index 0\n")
    assert rec.results() == [(1.25, 3), (0.5, 0)]


@pytest.fixture()
def fake_gpu_timing(monkeypatch):
    """Replace only the GPU measurement: latency = a deterministic function of the schedule."""
    from tilelang.autotuner.tuner import AutoTuner

    def fake_benchmark(self, jit_kernel, warmup, rep, early_stop_factor, benchmark_state, benchmark_device=None):
        return (1.0 if "__launch_bounds__(384" in jit_kernel.get_kernel_source() else 2.0), None

    monkeypatch.setattr(AutoTuner, "_benchmark_target", fake_benchmark)


def test_tune_selects_and_caches_in_memory_on_disk_and_across_processes(fake_gpu_timing, tmp_path, monkeypatch):
    from tilelang.autotuner.tuner import AutoTuner

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    target = {"kind": "cuda", "arch": "sm_90a"}
    # threads=256 on sm_90a launches 384 (a producer warpgroup); threads=128 launches 256.
    configs = [dict(block_M=128, block_N=128, block_K=64, num_stages=2, threads=128, swizzle=False),
               dict(block_M=128, block_N=128, block_K=64, num_stages=2, threads=256, swizzle=False)]
    known = set(AutoTuner._memory_cache)
    _, best, _, timed = autotune.tune(512, 512, 512, configs, target)
    assert sorted(i for _, i in timed) == [0, 1]
    assert best == configs[1]  # the fake gives the 384-thread launch the lower latency
    _, again, again_s, timed_again = autotune.tune(512, 512, 512, configs, target)
    assert again == best and timed_again == [] and again_s < 2.0
    assert autotune.forget_in_memory(known) >= 1
    _, from_disk, disk_s, timed_disk = autotune.tune(512, 512, 512, configs, target)
    assert from_disk == best and timed_disk == [] and disk_s < 2.0
    assert any("autotuner" in dirs for _, dirs, _ in os.walk(tmp_path))
    child = autotune.tune_in_child(512, 512, 512, configs, str(tmp_path), target)
    assert child["best"] == best and child["timed"] == 0 and child["seconds"] < 2.0


def test_time_kernels_times_every_contender_in_turns(monkeypatch):
    calls = []
    monkeypatch.setattr(tourkit, "bench_ms", lambda fn, **kw: (calls.append(fn()), float(len(calls)))[1])
    named = [("winner", lambda a, b: "w"), ("pick", lambda a, b: "p")]
    times = autotune.time_kernels(named, 1, 2, extra={"cuBLAS": lambda: "c"})
    assert set(times) == {"winner", "pick", "cuBLAS"}
    assert calls.count("w") == calls.count("p") == calls.count("c") >= 2  # every contender, every round
    assert calls[:3] == ["w", "p", "c"] and calls[3:6] == ["c", "p", "w"]  # turns alternate direction


def _fake_timed_run(monkeypatch, ms_by_result):
    """bench_ms that 'times' a contender by what it returns: kernels here return their own latency."""
    monkeypatch.setattr(tourkit, "bench_ms", lambda fn, **kw: ms_by_result(fn()))


def test_verify_winner_ranks_the_whole_space_and_measures_the_gap(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "matmul", lambda a, b: 1.00)  # cuBLAS: 1.00 ms
    _fake_timed_run(monkeypatch, float)
    space = autotune.search_space("hopper")[:4]
    latency = [1.10, 0.95, 0.96, 1.30]  # the fastest is space[1]; the autotuner picked space[2]
    candidates = [(c, (lambda a, b, t=t: t)) for c, t in zip(space, latency)]
    ctx = tourkit.TourContext(echo=False)
    autotune.verify_winner(ctx, 64, 64, 64, space[2], lambda a, b: 0.96, candidates, [("pick", lambda a, b: 0.99)],
                           None, None)
    assert ctx.metrics["fastest_in_space"] == autotune.to_gemm_config(space[1]).label()
    assert ctx.metrics["winner_gap_to_fastest"] == pytest.approx(0.96 / 0.95 - 1)
    assert ctx.headlines["vs_cublas"] == pytest.approx(round(1.0 / 0.96, 3))
    assert ctx.metrics["vs_best_hand_picked"] == pytest.approx(0.99 / 0.96)
    assert len(ctx.metrics["space_retimed"]) == 4
    assert any("within 2%" in line for line in ctx.report)
    # a winner 5% off the fastest is called out
    ctx = tourkit.TourContext(echo=False)
    autotune.verify_winner(ctx, 64, 64, 64, space[0], lambda a, b: 1.0, candidates, [("pick", lambda a, b: 0.99)],
                           None, None)
    assert any("MORE than 2%" in line for line in ctx.report)


def test_section_compile_only_through_runner():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "autotune", "--compile-only", "--arch", "sm_80"])
    result = run.results[0]
    assert result.status == "passed", (result.error_message, result.traceback_tail)
    assert result.metrics["space_kept"] + result.metrics["space_filtered"] == result.metrics["space_size"]
    assert result.headline["built"] >= 1


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_tune_odd_size_on_gpu_validates_and_caches(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    device = tourkit.detect_device()
    family = tourkit.ARCH_SPECS[device.arch].family
    kept, _ = autotune.filter_space(autotune.search_space(family), device.smem_per_block_optin)
    configs = kept[:3]
    M, N, K = 1000, 1032, 1000  # tails in M, N and K
    kernel, best, _, timed = autotune.tune(M, N, K, configs)
    assert best in configs and len(timed) >= 1
    a = tourkit.random_tensor((M, K), torch.float16, seed=3)
    b = tourkit.random_tensor((K, N), torch.float16, seed=4)
    c = torch.empty(M, N, dtype=torch.float16, device="cuda")
    check = tourkit.validate("tuned odd gemm", lambda: c.copy_(kernel(a, b)), c, a.double() @ b.double(), 2e-3)
    assert check.passed, check.line()
    _, again, again_s, _ = autotune.tune(M, N, K, configs)
    assert again == best and again_s < 2.0
