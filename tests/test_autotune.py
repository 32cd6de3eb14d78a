"""autotune: the search space and its extras, the shared-memory filter, the cache flow, the refinement of the
autotuner's leaders, compile-only through the runner.

The CPU cache-flow test replaces only the GPU timing (AutoTuner._benchmark_target) with a deterministic
fake, so the compile, selection, in-memory, on-disk and new-process cache paths all run for real."""

import dataclasses
import inspect
import os

import pytest

import tourkit
from sections import autotune
from sections.gemm_schedules import GemmConfig

HOPPER_BUDGET = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin


THREE_WARPGROUPS = GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol")
THREE_WARPGROUPS_S3 = GemmConfig(256, 192, 64, 3, 384, True, panel=8, policy="FullCol")
HAND_WS = dict(panel=8, policy="FullRow", kernel="ws")
EVEN_WS = dict(HAND_WS, persistent=132, even_rounds=True)
WS_PERSISTENT = GemmConfig(128, 256, 64, 4, 256, True, **EVEN_WS)
WS_STORE2_PERSISTENT = GemmConfig(128, 256, 64, 4, 256, True, store_buffers=2, **EVEN_WS)
WS_STORE4_PERSISTENT = GemmConfig(128, 256, 64, 3, 256, True, store_buffers=4, **EVEN_WS)
WS_ONE_TILE = GemmConfig(128, 256, 64, 4, 256, True, **HAND_WS)
HAND_WRITTEN = [WS_PERSISTENT, WS_STORE2_PERSISTENT, WS_STORE4_PERSISTENT, WS_ONE_TILE]


def test_search_space_is_the_product_of_its_axes_plus_the_extras():
    for family in ("hopper", "ampere", "ada", "turing"):
        for full in (False, True):
            axes = autotune.SPACES[family]["full" if full else "default"]
            space = autotune.search_space(family, full)
            expected = 1
            for key in autotune.TUNED_KEYS:
                expected *= len(axes[key])
            product, extras = space[:expected], space[expected:]
            assert product == autotune.product_space(family, full)
            assert all(set(c) == set(autotune.TUNED_KEYS) for c in product)
            assert extras == [c for c in autotune.extra_space(family) if c not in product]
            assert autotune.extras_in(space, family, full) == extras
            assert all(set(autotune.TUNED_KEYS) <= set(c) <= set(autotune.SCHEDULE_KEYS) for c in extras)
            assert len({tuple(sorted(c.items())) for c in space}) == len(space)  # no duplicates
            labels = [autotune.to_gemm_config(c).label() for c in space]
            assert len(set(labels)) == len(labels)  # the re-timings key their contenders by label
    assert autotune.extra_space("ampere") == autotune.extra_space("turing") == []
    with pytest.raises(ValueError):
        autotune.search_space("volta")


def test_hopper_space_holds_the_three_warpgroup_tiles_and_they_pass_the_filter():
    for full in (False, True):
        space = autotune.search_space("hopper", full)
        kept, _ = autotune.filter_space(space, HOPPER_BUDGET)
        kept_configs = [autotune.to_gemm_config(c) for c in kept]
        assert THREE_WARPGROUPS in kept_configs and THREE_WARPGROUPS_S3 in kept_configs
    # The filter applies to the extras too: at 200 KiB the 4-stage tile (225 KiB) goes, the 3-stage one stays.
    kept, dropped = autotune.filter_space(autotune.search_space("hopper"), 200 * 1024)
    assert THREE_WARPGROUPS in [autotune.to_gemm_config(c) for c, _ in dropped]
    assert THREE_WARPGROUPS_S3 in [autotune.to_gemm_config(c) for c in kept]


def test_default_hopper_space_is_retimed_whole():
    kept, _ = autotune.filter_space(autotune.search_space("hopper"), HOPPER_BUDGET)
    assert len(kept) <= autotune.RETIME_ALL_UP_TO  # the 2% check compares against every configuration
    assert autotune.REFINE_LEADERS < len(kept)


def test_config_dict_round_trips_and_keeps_product_dicts_short():
    for config in (THREE_WARPGROUPS, GemmConfig(128, 256, 64, 4, 256, True), GemmConfig(128, 128, 64, 3, 256, False,
                                                                                         policy="FullRow")):
        assert autotune.to_gemm_config(autotune.config_dict(config)) == config
    assert set(autotune.config_dict(GemmConfig(128, 256, 64, 4, 256, True))) == set(autotune.TUNED_KEYS)
    assert autotune.config_dict(THREE_WARPGROUPS)["policy"] == "FullCol"
    # fields gemm_for_tuning does not pass on cannot enter the space
    with pytest.raises(ValueError, match="staged_store"):
        autotune.config_dict(GemmConfig(128, 256, 64, 4, 256, True, staged_store=False))
    # the hand-written kernel's knobs are passed on
    for config in HAND_WRITTEN:
        kwargs = autotune.config_dict(config)
        assert kwargs["kernel"] == "ws" and autotune.to_gemm_config(kwargs) == config
    assert "store_buffers" not in autotune.config_dict(WS_PERSISTENT)
    # ... and so are its tile order and barrier-arrival options, and gemm_for_tuning builds from all of them
    lean = dataclasses.replace(WS_PERSISTENT, panels="columns", warp_arrivals=True, producer_warps=1)
    kwargs = autotune.config_dict(lean)
    assert autotune.to_gemm_config(kwargs) == lean
    assert set(inspect.signature(autotune.gemm_for_tuning).parameters) >= set(autotune.SCHEDULE_KEYS)
    from sections.gemm_schedules import gemm_program
    tuned = tourkit.lower_for_arch(autotune.gemm_for_tuning(1024, 1024, 1024, **kwargs), "sm_90a").kernel_source
    assert tuned == tourkit.lower_for_arch(gemm_program(1024, 1024, 1024, lean), "sm_90a").kernel_source


def test_hopper_extras_hold_the_hand_written_kernel_sized_for_the_gpu():
    kept, _ = autotune.filter_space(autotune.search_space("hopper"), HOPPER_BUDGET)
    kept_configs = [autotune.to_gemm_config(c) for c in kept]
    assert all(c in kept_configs for c in HAND_WRITTEN)
    # the persistent grids follow the SM count (an H100 PCIe has 114 SMs)
    on_114 = [autotune.to_gemm_config(c) for c in autotune.search_space("hopper", sm_count=114)]
    assert {c.persistent for c in on_114 if c.hand_ws} == {0, 114}
    # no hand-written kernel (TMA, wgmma, setmaxnreg) outside Hopper
    for family in ("ampere", "ada", "turing"):
        assert not any(autotune.to_gemm_config(c).hand_ws for c in autotune.search_space(family, True))


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


def test_tuned_function_passes_panel_and_policy_on():
    import inspect

    from sections.gemm_schedules import gemm_program

    params = inspect.signature(autotune.gemm_for_tuning).parameters
    default = GemmConfig(128, 128, 64, 3, 256, True)
    assert params["panel"].default == default.panel and params["policy"].default == default.policy
    kwargs = autotune.config_dict(THREE_WARPGROUPS)
    tuned = autotune.gemm_for_tuning(1024, 1024, 1024, "x", **kwargs).script()
    assert tuned == gemm_program(1024, 1024, 1024, THREE_WARPGROUPS).script()
    plain = dict(kwargs, panel=10, policy="Square")
    assert tuned != autotune.gemm_for_tuning(1024, 1024, 1024, "x", **plain).script()


def test_builder_hash_covers_the_gemm_builder_module(monkeypatch):
    import inspect

    from sections import gemm_schedules

    before = autotune.builder_hash()
    real = inspect.getsource

    def edited(obj):  # the builder module as if a register split or a kernel had been edited
        return real(obj) + "\n# edited" if obj is gemm_schedules else real(obj)

    monkeypatch.setattr(inspect, "getsource", edited)
    assert autotune.builder_hash() != before


def test_latency_lines_are_parsed():
    import io

    rec = autotune._TunedLatencies(io.StringIO())
    rec.write("Tuned Latency 1.25 with config {'block_M': 128} at index 3\nnoise\n")
    rec.write("Tuned Latency 0.5 with config {'block_M': 256, 'swizzle': True} at index 0\n")
    assert rec.results() == [(1.25, 3), (0.5, 0)]


def test_latency_lines_are_matched_to_the_configs_they_print():
    import io

    configs = [{"block_M": 128}, {"block_M": 256, "policy": "FullCol"}, {"block_M": 64}]
    rec = autotune._TunedLatencies(io.StringIO())
    rec.write("Tuned Latency 1.5 with config {'block_M': 128} at index 0\n")  # as printed: kept
    rec.write("Tuned Latency 1.2 with config {'block_M': 256, 'policy': 'FullCol'} at index 2\n")  # index off
    rec.write("Tuned Latency 0.9 with config {'block_M': 32} at index 2\n")  # not in the list: left out
    rec.write("Tuned Latency 1.1 with config {'block_M': 64} at index 9\n")  # index out of range
    assert rec.results(configs) == [(1.5, 0), (1.2, 1), (1.1, 2)]


def test_leaders_are_the_autotuners_fastest_readings():
    timed = [(1.30, 0), (0.95, 3), (1.01, 1), (0.97, 5), (0.99, 2), (0.96, 4)]
    assert autotune.leaders(timed, 4, 6) == [3, 4, 5, 2]
    assert autotune.leaders(timed, 10, 6) == [3, 4, 5, 2, 1, 0]
    # non-finite readings and indices outside the space are left out; a repeat keeps its best; ties keep order
    noisy = [(float("nan"), 0), (float("inf"), 1), (0.5, 7), (1.0, 2), (0.9, 2), (0.9, 1), (1.2, 3)]
    assert autotune.leaders(noisy, 4, 4) == [1, 2, 3]
    assert autotune.leaders([], 4, 4) == []


def test_leading_kernels_hold_the_pick_with_the_autotuners_kernel():
    kept = [{"i": i} for i in range(6)]
    compiled = [f"k{i}" for i in range(6)]
    compiled[2] = None  # failed to compile in parallel
    timed = [(1.0, 0), (0.90, 1), (0.91, 2), (0.92, 3), (0.93, 4), (0.99, 5)]
    got = autotune.leading_kernels(kept, compiled, timed, kept[1], "tuned", n=4)
    assert [(c["i"], k, ms) for c, k, ms in got] == [(1, "tuned", 0.90), (3, "k3", 0.92), (4, "k4", 0.93)]
    # no latency lines found: the pick alone, with an unknown autotuner time
    (config, kernel, ms), = autotune.leading_kernels(kept, compiled, [], kept[5], "tuned", n=4)
    assert config == kept[5] and kernel == "tuned" and ms != ms
    # lines found but not the pick's: the pick first, then the fastest others
    got = autotune.leading_kernels(kept, compiled, timed[1:2] + timed[3:], kept[0], "tuned", n=3)
    assert [c["i"] for c, _, _ in got] == [0, 1, 3]


def test_fastest_leader_is_the_lowest_paired_time_ties_to_the_autotuners_order():
    paired = {"a": 1.00, "b": 0.98, "c": 0.98, "cuBLAS": 0.90}
    assert autotune.fastest_leader(paired, ["a", "b", "c"]) == "b"
    assert autotune.fastest_leader(paired, ["c", "b", "a"]) == "c"
    assert autotune.fastest_leader(paired, ["a"]) == "a"  # cuBLAS is timed alongside, never a leader


@pytest.fixture()
def fake_gpu_timing(monkeypatch):
    """Replace only the GPU measurement: latency = a deterministic function of the schedule."""
    from tilelang.autotuner.tuner import AutoTuner

    def fake_benchmark(self, jit_kernel, warmup, rep, early_stop_factor, benchmark_state, benchmark_device=None):
        source = jit_kernel.get_kernel_source()
        if "__launch_bounds__(384" not in source:
            return 2.0, None
        return (0.5 if "rasterization2DRow<4>" in source else 1.0), None  # swizzle panel 4: fastest

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
    # An extra configuration (panel and policy passed through) changes the space, hence the cache key: a new
    # search, whose per-configuration readings give the leaders.
    extra = dict(block_M=128, block_N=128, block_K=64, num_stages=2, threads=256, swizzle=True, panel=4,
                 policy="FullRow")
    _, best, _, timed = autotune.tune(512, 512, 512, configs + [extra], target)
    assert best == extra and sorted(i for _, i in timed) == [0, 1, 2]
    assert autotune.leaders(timed, 2, 3) == [2, 1]


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


def test_verify_winner_judges_the_gap_head_to_head(monkeypatch):
    """The screen (one pair of rounds over the whole space) misreads the winner's configuration by 25%, as
    happened on the H200; the head-to-head of the winner and the screen's fastest decides the gap."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "matmul", lambda a, b: 1.00)
    _fake_timed_run(monkeypatch, float)
    space = autotune.search_space("hopper")[:4]
    latency = [1.10, 0.95, 1.20, 1.30]  # space[2] is the winner: 0.96 ms, but its screen reading says 1.20
    candidates = [(c, (lambda a, b, t=t: t)) for c, t in zip(space, latency)]
    ctx = tourkit.TourContext(echo=False)
    autotune.verify_winner(ctx, 64, 64, 64, space[2], lambda a, b: 0.96, candidates, [("pick", lambda a, b: 0.99)],
                           None, None)
    assert ctx.metrics["screen_gap_to_fastest"] == pytest.approx(1.20 / 0.95 - 1)
    assert ctx.headlines["gap_to_fastest"] == pytest.approx(round(0.96 / 0.95 - 1, 4))
    assert set(ctx.metrics["head_to_head"]) == {"winner", "cuBLAS", autotune.to_gemm_config(space[1]).label(),
                                                autotune.to_gemm_config(space[0]).label()}
    assert any("within 2%" in line and "screen alone put it 26.3%" in line for line in ctx.report)
    # a winner that is the fastest head to head is called the fastest
    ctx = tourkit.TourContext(echo=False)
    autotune.verify_winner(ctx, 64, 64, 64, space[2], lambda a, b: 0.90, candidates, [("pick", lambda a, b: 0.99)],
                           None, None)
    assert ctx.headlines["gap_to_fastest"] == 0 and any("it is the fastest" in line for line in ctx.report)


def _leaders_for_refinement(latency):
    """Four leaders (config, kernel, the autotuner's ms); each kernel 'returns' its true latency."""
    space = autotune.search_space("hopper")[:4]
    return [(c, (lambda a, b, t=t: t), ms) for c, t, ms in zip(space, latency, [0.95, 0.96, 0.97, 0.99])]


def test_refine_makes_the_fastest_leader_the_winner(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "matmul", lambda a, b: 1.00)  # cuBLAS: 1.00 ms
    _fake_timed_run(monkeypatch, float)
    leaders = _leaders_for_refinement([1.02, 0.98, 1.00, 0.99])  # the autotuner ranked leaders[0] first
    ctx = tourkit.TourContext(echo=False)
    config, kernel = autotune.refine(ctx, 64, 64, 64, leaders, leaders[0][0], None, None)
    assert config == leaders[1][0] and kernel(None, None) == 0.98
    assert ctx.metrics["refine_changed_pick"] is True
    assert ctx.metrics["autotuner_pick"] == autotune.to_gemm_config(leaders[0][0]).label()
    assert ctx.metrics["refined_winner"] == autotune.to_gemm_config(leaders[1][0]).label()
    assert ctx.metrics["refine_vs_cublas"] == pytest.approx(1.0 / 0.98)
    assert any("4.1% ahead of the autotuner's pick" in line for line in ctx.report)
    # the pick is the fastest in the paired timing too: it stays
    ctx = tourkit.TourContext(echo=False)
    leaders = _leaders_for_refinement([0.97, 0.98, 1.00, 0.99])
    config, _ = autotune.refine(ctx, 64, 64, 64, leaders, leaders[0][0], None, None)
    assert config == leaders[0][0] and ctx.metrics["refine_changed_pick"] is False
    assert any("confirms the autotuner's pick" in line for line in ctx.report)


def test_refine_is_not_misled_by_a_steady_clock_drift(monkeypatch):
    """Every timing reads 1% slower than the one before: one after another, the first leader would look
    fastest; the forward/backward turns cancel the drift and find the 1% faster second leader."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch, "matmul", lambda a, b: 1.00)
    calls = []

    def drifting_bench_ms(fn, **kw):
        calls.append(None)
        return float(fn()) + 0.01 * len(calls)

    monkeypatch.setattr(tourkit, "bench_ms", drifting_bench_ms)
    leaders = _leaders_for_refinement([1.00, 0.99, 1.00, 1.00])
    config, _ = autotune.refine(tourkit.TourContext(echo=False), 64, 64, 64, leaders, leaders[0][0], None, None)
    assert config == leaders[1][0]
    assert len(calls) == autotune.REFINE_ROUNDS * (len(leaders) + 1)  # the leaders and cuBLAS, every round


def test_compile_only_builds_the_extras_that_fit(monkeypatch):
    built = []

    def fake_inspect(jobs, **kw):
        jobs = list(jobs)
        built.extend(name for name, _, _ in jobs)
        return [tourkit.KernelReport(name=name, arch=arch, markers={}, dynamic_smem_bytes=0, static_smem_bytes=0,
                                     threads=0, grid=(1, 1, 1), nvcc="lowered only") for name, _, arch in jobs]

    monkeypatch.setattr(tourkit, "inspect_kernels", fake_inspect)
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False)
    kept, _ = autotune.filter_space(autotune.search_space("hopper"), HOPPER_BUDGET)
    autotune.compile_only(ctx, kept)
    assert THREE_WARPGROUPS.label() in built and THREE_WARPGROUPS_S3.label() in built
    assert all(c.label() in built for c in HAND_WRITTEN)
    assert len(built) == 9  # a sample of three from the product, and the six extras


def test_extras_lower_within_their_shared_memory_estimate():
    """The filter judges the extras by GemmConfig.smem_bytes; the lowered kernel must not need more (the
    4-stage tile is within 2 KiB of the 227 KiB budget)."""
    configs = [THREE_WARPGROUPS, THREE_WARPGROUPS_S3] + HAND_WRITTEN
    reports = tourkit.inspect_kernels([(c.label(), autotune.gemm_for_tuning(2048, 2048, 2048, "x",
                                                                            **autotune.config_dict(c)), "sm_90a")
                                       for c in configs], nvcc=False)
    for config, report in zip(configs, reports):
        assert report.smem_bytes <= config.smem_bytes() <= HOPPER_BUDGET
    assert [r.threads for r in reports[:2]] == [512, 512]  # three consumer warpgroups and TileLang's producer
    for config, report in zip(HAND_WRITTEN, reports[2:]):  # the hand-written kernel, through the tuned function
        assert report.threads == 384 and "warpgroup_reg_alloc" in report.source
        # persistent: 128 tiles of 128x256 fit in one round of 132 blocks, so even rounds launch 128
        assert report.grid[0] == (128 if config.persistent else 2048 // 256)


def test_run_refines_the_autotuners_pick_then_checks_it_against_the_space(monkeypatch):
    """The section's GPU path with the GPU replaced: compiled kernels are CPU matmuls with a known latency,
    the autotuner is a fake whose one-after-another readings put the wrong configuration first."""
    import types

    torch = pytest.importorskip("torch")
    true_ms = {THREE_WARPGROUPS: 0.95, GemmConfig(128, 256, 64, 4, 256, True): 0.97}
    launched = []

    class FakeKernel:
        def __init__(self, config):
            self.ms = true_ms.get(config, 1.2)

        def __call__(self, a, b):
            launched.append(self.ms)
            return (a.float() @ b.float()).half()

    def fake_bench_ms(fn, **kw):
        launched.clear()
        fn()
        return launched[-1] if launched else 1.0  # nothing launched: cuBLAS, 1.0 ms

    kept, _ = autotune.filter_space(autotune.search_space("hopper"), HOPPER_BUDGET)
    pick = autotune.config_dict(GemmConfig(128, 256, 64, 4, 256, True))
    readings = {autotune.to_gemm_config(c): 1.3 for c in kept}
    readings.update({autotune.to_gemm_config(pick): 0.90, THREE_WARPGROUPS: 0.93})  # drift flattered the pick
    searched = []

    def fake_tune(M, N, K, configs, target="cuda"):
        timed = [] if searched else [(readings[autotune.to_gemm_config(c)], i) for i, c in enumerate(configs)]
        searched.append(True)
        return FakeKernel(autotune.to_gemm_config(pick)), dict(pick), 0.05, timed

    monkeypatch.setattr(autotune, "QUICK_TUNE_SIZE", 64)
    monkeypatch.setattr(autotune, "compile_many", lambda M, N, K, configs, **kw: [FakeKernel(c) for c in configs])
    monkeypatch.setattr(autotune, "tune", fake_tune)
    monkeypatch.setattr(autotune, "tune_in_child", lambda *a, **k: {"seconds": 0.1, "best": dict(pick), "timed": 0,
                                                                     "wall": 2.0})
    monkeypatch.setattr(tourkit, "bench_ms", fake_bench_ms)
    random_tensor = tourkit.random_tensor
    monkeypatch.setattr(tourkit, "random_tensor", lambda *a, **k: random_tensor(*a, **dict(k, device="cpu")))
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **dict(k, device="cpu")))
    device = types.SimpleNamespace(arch="sm_90a", smem_per_block_optin=HOPPER_BUDGET, sm_count=132)
    ctx = tourkit.TourContext(quick=True, device=device, echo=False)
    autotune.run(ctx)
    assert ctx.headlines["winner"] == THREE_WARPGROUPS.label()
    assert ctx.headlines["autotuner_pick"] == autotune.to_gemm_config(pick).label()
    assert ctx.metrics["winner_config"] == autotune.config_dict(THREE_WARPGROUPS)
    assert ctx.metrics["autotuner_config"] == pick and ctx.metrics["refine_changed_pick"] is True
    assert len(ctx.metrics["refine_ms"]) == autotune.REFINE_LEADERS + 1  # the leaders and cuBLAS
    assert ctx.headlines["gap_to_fastest"] == 0 and ctx.headlines["vs_cublas"] == pytest.approx(round(1 / 0.95, 3))
    assert len(ctx.metrics["space_retimed"]) == len(kept)  # the whole space, extras included
    assert ctx.metrics["rel_error"] < autotune.TOLERANCE


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


@pytest.mark.gpu
def test_refinement_on_gpu_reads_every_latency_and_validates_the_leaders(tmp_path, monkeypatch):
    """On the GPU: the autotuner's per-configuration readings are all found in its output (the extras
    included), and every leader the refinement times computes the right product."""
    import torch

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    device = tourkit.detect_device()
    family = tourkit.ARCH_SPECS[device.arch].family
    kept, _ = autotune.filter_space(autotune.search_space(family), device.smem_per_block_optin)
    configs = kept[:3] + autotune.extras_in(kept, family)
    M = N = K = 2048
    kernel, best, _, timed = autotune.tune(M, N, K, configs)
    assert sorted(i for _, i in timed) == list(range(len(configs)))
    compiled = autotune.compile_many(M, N, K, [autotune.to_gemm_config(c) for c in configs])
    leaders = autotune.leading_kernels(configs, compiled, timed, best, kernel, n=3)
    assert len(leaders) == 3 and best in [c for c, _, _ in leaders]
    a = tourkit.random_tensor((M, K), torch.float16, seed=5)
    b = tourkit.random_tensor((K, N), torch.float16, seed=6)
    ref = a.double() @ b.double()
    c = torch.empty(M, N, dtype=torch.float16, device="cuda")
    for config, leader, _ in leaders:
        check = tourkit.validate(autotune.to_gemm_config(config).label(), lambda: c.copy_(leader(a, b)), c, ref, 2e-3)
        assert check.passed, check.line()
    ctx = tourkit.TourContext(echo=False)
    winner, _ = autotune.refine(ctx, M, N, K, leaders, best, a, b)
    assert winner in [config for config, _, _ in leaders]
    assert ctx.metrics["refined_winner"] == autotune.to_gemm_config(winner).label()
