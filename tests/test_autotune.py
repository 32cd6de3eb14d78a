"""autotune: the search space, its register rule and its shared-memory filter, one tuning with the GPU and nvcc
faked (pick, readings, quiet progress), the verdict, the section's run with a fake GPU, the declared kernels
lowered."""

import itertools
import sys
import types

import pytest

import tourkit
from sections import autotune
from sections.gemm_schedules import GemmConfig

HOPPER_BUDGET = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
SM90 = {"kind": "cuda", "arch": "sm_90a"}


def test_default_space_is_a_small_product_and_full_a_larger_one():
    for family in ("hopper", "ampere", "ada", "turing"):
        axes = autotune.SPACES[family]["default"]
        space = autotune.search_space(family)
        product = [dict(zip(autotune.TUNED_KEYS, values))
                   for values in itertools.product(*(axes[key] for key in autotune.TUNED_KEYS))]
        expected = [c for c in product if c["block_M"] * c["block_N"] <= autotune.MAX_ACCUMULATORS * c["threads"]]
        assert space == expected and 8 <= len(space) <= 16
        assert all(tuple(c) == autotune.TUNED_KEYS for c in space)
        assert len({tuple(c.values()) for c in space}) == len(space)
        assert len(autotune.search_space(family, full=True)) > len(space)
        budget = max(s.smem_per_block_optin for s in tourkit.ARCH_SPECS.values() if s.family == family)
        assert len(autotune.filter_space(space, budget)[0]) >= 8
    with pytest.raises(ValueError):
        autotune.search_space("volta")


def test_register_rule_leaves_out_the_256x256_tiles():
    for family in ("hopper", "ampere", "turing"):
        for full in (False, True):
            for config in autotune.search_space(family, full):
                assert config["block_M"] * config["block_N"] // config["threads"] <= autotune.MAX_ACCUMULATORS
    assert not [c for c in autotune.search_space("hopper") if c["block_M"] == c["block_N"] == 256]
    assert {(c["block_M"], c["block_N"]) for c in autotune.search_space("ampere")} == {(128, 128), (128, 256),
                                                                                      (256, 128)}
    # Turing copies A and B through registers: 128x128x32 over 128 threads (the T4 lesson's) stays, 64x256x32 goes.
    turing = [(c["block_M"], c["block_N"], c["block_K"], c["threads"]) for c in autotune.search_space("turing", True)]
    assert (128, 128, 32, 128) in turing and (64, 256, 32, 128) not in turing and (128, 128, 64, 128) not in turing
    assert len(autotune.search_space("turing")) == 16
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False)
    autotune.report_space(ctx, *autotune.kept_space(ctx))
    assert ctx.metrics["space_spilling"] == 4 and "register rule: 4 left out" in "\n".join(ctx.report)


def test_filter_drops_exactly_what_does_not_fit_and_says_how_much_it_needs():
    budget = tourkit.ARCH_SPECS["sm_86"].smem_per_block_optin
    space = autotune.search_space("ampere", full=True)
    kept, dropped = autotune.filter_space(space, budget)
    assert len(kept) + len(dropped) == len(space) and dropped
    assert all(autotune.to_gemm_config(c).smem_bytes() <= budget for c in kept)
    for config, need in dropped:
        assert need == autotune.to_gemm_config(config).smem_bytes() > budget
    ctx = tourkit.TourContext(compile_only=True, arch="sm_86", full=True, echo=False)
    autotune.report_space(ctx, space, kept, dropped)
    need = tourkit.format_bytes(dropped[0][1])
    assert f"dropped {autotune.describe(dropped[0][0])}: needs {need}" in "\n".join(ctx.report)
    with pytest.raises(tourkit.SectionSkip, match="nothing to tune"):
        autotune.report_space(ctx, space, [], [(c, 1 << 20) for c in space])


def test_describe_and_the_tuned_function_build_the_lessons_gemm():
    config = dict(block_M=128, block_N=256, block_K=64, num_stages=3, threads=256, swizzle=True)
    assert autotune.describe(config) == "128x256x64 tile, 3 stages, 256 threads, swizzled"
    assert autotune.to_gemm_config(config) == GemmConfig(128, 256, 64, 3, 256, True)
    ours = autotune.gemm_for_tuning(256, 256, 256, "x", **config).script()
    assert ours == autotune.gemm_program(256, 256, 256, GemmConfig(128, 256, 64, 3, 256, True)).script()


def test_leaders_and_judge_pick_from_faked_timings():
    readings = {0: 1.30, 1: 1.10, 2: 1.05, 3: 1.10, 4: 2.0}
    assert autotune.leaders(readings, pick=2) == [2, 1, 3]  # ties in the space's order
    assert autotune.leaders(readings, pick=4, n=1) == [4, 2]
    verdict = autotune.judge({"a": 1.00, "b": 0.98, "c": 1.10, "cuBLAS": 1.02}, pick="a")
    assert verdict["fastest"] == "b" and verdict["gap"] == pytest.approx(1 / 0.98 - 1)
    assert verdict["vs_cublas"] == pytest.approx(1.02)
    tie = autotune.judge({"b": 1.0, "a": 1.0, "cuBLAS": 1.0}, pick="a")
    assert tie["fastest"] == "a" and tie["gap"] == 0


def test_bars_only_in_a_terminal_or_notebook(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert autotune.bars_wanted(types.SimpleNamespace(isatty=lambda: True))
    assert not autotune.bars_wanted(types.SimpleNamespace(isatty=lambda: False))
    assert not autotune.bars_wanted(object())
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert autotune.bars_wanted(object())


@pytest.fixture()
def fake_gpu_and_nvcc(monkeypatch, tmp_path):
    """tilelang.autotune runs for real, but each 'compiled' kernel is a stand-in whose latency is looked up by
    its schedule, and its results are not cached (nothing to save to disk)."""
    from tilelang.autotuner.tuner import AutoTuner

    latency = {}
    real_program = autotune.gemm_program
    monkeypatch.setattr(autotune, "gemm_program",
                        lambda M, N, K, config, **kw: real_program(M, N, K, config, **kw).with_attr("tour_label",
                                                                                                   config.label()))

    class FakeKernel:
        def __init__(self, func, **kwargs):
            self.prim_func, self.ms = func, latency.get(str(func.attrs["tour_label"]), 2.0)

        def update_tuner_result(self, latency, config, ref_latency):
            self.latency, self.config = latency, config
            return self

        def get_kernel_source(self):
            return ""

    monkeypatch.setattr(sys.modules["tilelang.jit"], "compile", FakeKernel)
    monkeypatch.setattr(AutoTuner, "_benchmark_target", lambda self, jit_kernel, **kw: (jit_kernel.ms, None))
    monkeypatch.setenv("TILELANG_AUTO_TUNING_DISABLE_CACHE", "1")
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    return latency


def test_tune_picks_the_fastest_reading_and_keeps_every_reading_quietly(fake_gpu_and_nvcc, capsys):
    configs = autotune.search_space("hopper")[:5]
    fake_gpu_and_nvcc.update({autotune.to_gemm_config(configs[3]).label(): 0.5,
                              autotune.to_gemm_config(configs[1]).label(): 0.7})
    tuned = autotune.tune(512, 512, 512, configs, target=SM90)
    assert tuned.config == configs[3] and tuned.searched
    assert tuned.readings == {0: 2.0, 1: 0.7, 2: 2.0, 3: 0.5, 4: 2.0}
    assert autotune.leaders(tuned.readings, configs.index(tuned.config)) == [3, 1, 0]
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""  # not a terminal: no bars, no 'Tuned Latency' lines, no log


def test_tune_shows_one_bar_per_phase_in_a_terminal_and_its_lines_when_verbose(fake_gpu_and_nvcc, capsys,
                                                                                 monkeypatch):
    configs = autotune.search_space("hopper")[:3]
    monkeypatch.setattr(autotune, "bars_wanted", lambda stream=None: True)
    autotune.tune(512, 512, 512, configs, target=SM90, verbose=True)
    out = capsys.readouterr()
    assert "Bench configurations" in out.err and out.out.count("Tuned Latency") == 3
    from tilelang.autotuner import tuner

    assert tuner.tqdm.__name__ != "Bar"  # restored


def test_declared_kernels_make_the_autotuners_compiles_cache_hits_and_the_retune_reads_the_disk(tmp_path,
                                                                                              monkeypatch):
    """Real compiles (one small kernel through nvcc), the GPU timing faked: the autotuner's kernel is the one the
    declared kernels' compile built, and a re-tune after forgetting the in-memory result loads it from disk."""
    from tilelang.autotuner.tuner import AutoTuner

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(AutoTuner, "_benchmark_target", lambda self, jit_kernel, **kw: (1.0, None))
    monkeypatch.setattr(autotune, "QUICK_TUNE_SIZE", 256)
    decl = autotune.kernels(tourkit.TourContext(quick=True, compile_only=True, arch="sm_90a", echo=False))[0]
    configs = autotune.search_space("hopper")[:1]
    assert decl.name == autotune.to_gemm_config(configs[0]).label()
    built = tourkit.build_declared([decl], target=SM90)
    first = autotune.tune(256, 256, 256, configs, target=SM90)
    assert first.searched and first.kernel is built[decl.name]
    assert autotune.forget_in_memory(first.kernel) == 1 and autotune.forget_in_memory(first.kernel) == 0
    again = autotune.tune(256, 256, 256, configs, target=SM90)
    assert not again.searched and again.config == first.config and again.kernel is not first.kernel
    assert again.seconds < 2.0


def test_readings_are_kept_beside_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    configs = autotune.search_space("hopper")
    path = autotune.readings_path(256, 256, 256, configs)
    assert str(tmp_path) in str(path) and path != autotune.readings_path(512, 512, 512, configs)
    assert autotune.load_readings(path) == {}
    autotune.save_readings(path, {0: 1.5, 3: 1.25})
    assert autotune.load_readings(path) == {0: 1.5, 3: 1.25}


def test_run_with_a_fake_gpu_reports_the_pick_the_verdict_and_the_retune(monkeypatch, tmp_path):
    """The section's GPU path: kernels are CPU matmuls with a known latency; the autotuner's readings favour
    a configuration that the timing in turns finds 2% slower than a runner-up."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    device = types.SimpleNamespace(arch="sm_90a", smem_per_block_optin=HOPPER_BUDGET, sm_count=132, memory_bytes=2**37)
    ctx = tourkit.TourContext(quick=True, device=device, echo=False)
    _, kept, _ = autotune.kept_space(ctx)
    pick, runner = kept[2], kept[5]
    true_ms = {autotune.to_gemm_config(pick).label(): 1.00, autotune.to_gemm_config(runner).label(): 0.98}
    launched = []

    class FakeKernel:
        def __init__(self, label):
            self.ms = true_ms.get(label, 1.3)

        def __call__(self, a, b):
            launched.append(self.ms)
            return (a.float() @ b.float()).half()

    def fake_bench_ms(fn, **kw):
        launched.clear()
        fn()
        return launched[-1] if launched else 1.02  # cuBLAS

    calls = []

    def fake_tune(M, N, K, configs, target="cuda", verbose=False, dtype="float16"):
        calls.append(M)
        readings = {i: 1.0 + i / 100 for i in range(len(configs))}  # the first call searches, the next hits
        readings.update({configs.index(pick): 0.90, configs.index(runner): 0.95})
        readings = readings if len(calls) == 1 else {}
        return autotune.Tuned(FakeKernel(autotune.to_gemm_config(pick).label()), dict(pick), 0.01, readings,
                              bool(readings))

    monkeypatch.setattr(autotune, "QUICK_TUNE_SIZE", 64)
    monkeypatch.setattr(tourkit, "build_declared", lambda decls, **kw: {d.name: FakeKernel(d.name) for d in decls})
    monkeypatch.setattr(autotune, "tune", fake_tune)
    monkeypatch.setattr(autotune, "forget_in_memory", lambda kernel: 1)
    monkeypatch.setattr(tourkit, "bench_ms", fake_bench_ms)
    random_tensor, empty = tourkit.random_tensor, torch.empty
    monkeypatch.setattr(tourkit, "random_tensor", lambda *a, **k: random_tensor(*a, **dict(k, device="cpu")))
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **dict(k, device="cpu")))
    autotune.run(ctx)
    assert ctx.headlines["winner"] == autotune.describe(pick)
    assert ctx.headlines["vs_cublas"] == pytest.approx(1.02)
    assert ctx.headlines["gap"] == pytest.approx(round(1 / 0.98 - 1, 4))
    assert ctx.headlines["retune_s"] == 0.01 and calls == [64, 64] and ctx.metrics["searched"]
    assert ctx.metrics["fastest_retimed"] == autotune.to_gemm_config(runner).label()
    assert len(ctx.metrics["retimed_ms"]) == autotune.RUNNERS_UP + 1  # the pick and its runners-up
    assert ctx.metrics["cublas_ms"] == 1.02
    assert ctx.metrics["rel_error"] < autotune.TOLERANCE["float16"]
    assert autotune.load_readings(autotune.readings_path(64, 64, 64, kept))  # saved for the next run
    table = "\n".join(ctx.report)
    assert "autotuner's pick" in table and "cuBLAS (torch.matmul)" in table and "vs cuBLAS" in table
    # A second run finds the pick cached (no readings from the tuner) and its readings beside the cache.
    again = tourkit.TourContext(quick=True, device=device, echo=False)
    autotune.run(again)
    assert again.metrics["searched"] is False and again.metrics["autotuner_ms"] == ctx.metrics["autotuner_ms"]
    assert again.metrics["retimed_ms"].keys() == ctx.metrics["retimed_ms"].keys()
    assert "found in the autotuner's cache" in "\n".join(again.report)


def test_declared_kernels_lower_within_the_filter_for_sm90a_and_sm80(monkeypatch):
    """Every Hopper configuration lowers with wgmma/TMA and within its shared-memory estimate (so the filter
    is safe); on sm_80 two lower with mma.sync and cp.async. nvcc is left to the GPU tests."""
    monkeypatch.setattr(autotune, "NVCC_BUILDS", 0)
    for arch, limit in (("sm_90a", None), ("sm_80", 2)):
        ctx = tourkit.TourContext(quick=True, compile_only=True, arch=arch, echo=False)
        decls = autotune.kernels(ctx)
        assert [d.name for d in decls] == [autotune.to_gemm_config(c).label() for c in autotune.kept_space(ctx)[1]]
        assert all(d.out_idx == [-1] and not d.nvcc for d in decls)
        reports = tourkit.inspect_declared(ctx, decls[:limit])  # markers and smem_limit enforced
        for decl, report in zip(decls, reports.values()):
            config = next(c for c in autotune.kept_space(ctx)[1] if autotune.to_gemm_config(c).label() == decl.name)
            assert report.smem_bytes <= autotune.to_gemm_config(config).smem_bytes()


def test_compile_only_run_lowers_the_space(monkeypatch):
    monkeypatch.setattr(autotune, "NVCC_BUILDS", 0)
    real = autotune.kept_space

    def two_kept(ctx):
        space, kept, dropped = real(ctx)
        return space, kept[:2], dropped

    monkeypatch.setattr(autotune, "kept_space", two_kept)
    ctx = tourkit.TourContext(quick=True, compile_only=True, arch="sm_86", echo=False)
    autotune.run(ctx)
    assert ctx.headlines == {"arch": "sm_86", "space": 2, "lowered": 2}
    assert ctx.metrics["space_spilling"] == 4  # the 256x256 tiles


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------


def _gpu_space(n: int):
    device = tourkit.detect_device()
    family = tourkit.ARCH_SPECS[device.arch].family
    return autotune.filter_space(autotune.search_space(family), device.smem_per_block_optin)[0][:n]


@pytest.mark.gpu
def test_tune_on_gpu_validates_its_pick_and_reads_every_latency(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    configs = _gpu_space(3)
    M, N, K = 1000, 1032, 1000  # tails in M, N and K
    tuned = autotune.tune(M, N, K, configs)
    assert tuned.config in configs and sorted(tuned.readings) == [0, 1, 2]
    assert tuned.readings[configs.index(tuned.config)] == min(tuned.readings.values())
    a = tourkit.random_tensor((M, K), torch.float16, seed=3)
    b = tourkit.random_tensor((K, N), torch.float16, seed=4)
    c = torch.empty(M, N, dtype=torch.float16, device="cuda")
    check = tourkit.validate("tuned odd gemm", lambda: c.copy_(tuned.kernel(a, b)), c, a.double() @ b.double(), 2e-3)
    assert check.passed, check.line()


@pytest.mark.gpu
def test_retune_on_gpu_hits_the_memory_then_the_disk_cache(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    configs = _gpu_space(2)
    first = autotune.tune(1024, 1024, 1024, configs)
    assert first.searched
    in_memory = autotune.tune(1024, 1024, 1024, configs)
    assert not in_memory.searched and in_memory.config == first.config and in_memory.seconds < 2.0
    assert autotune.forget_in_memory(first.kernel) >= 1
    from_disk = autotune.tune(1024, 1024, 1024, configs)
    assert not from_disk.searched and from_disk.config == first.config and from_disk.seconds < 2.0
    assert from_disk.kernel is not first.kernel
    a = tourkit.random_tensor((1024, 1024), torch.float16, seed=5)
    b = tourkit.random_tensor((1024, 1024), torch.float16, seed=6)
    assert tourkit.relative_error(from_disk.kernel(a, b), a.double() @ b.double()) < 2e-3


@pytest.mark.gpu
def test_section_on_gpu_quick(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    ctx = tourkit.TourContext(quick=True, device=tourkit.detect_device(), echo=False)
    autotune.run(ctx)
    assert set(ctx.headlines) == {"winner", "vs_cublas", "gap", "retune_s"}
    assert ctx.metrics["searched"] and ctx.headlines["retune_s"] < 2.0
    second = tourkit.TourContext(quick=True, device=tourkit.detect_device(), echo=False)
    autotune.run(second)  # the whole section again: the pick and its readings come from the cache
    assert not second.metrics["searched"] and second.headlines["winner"] == ctx.headlines["winner"]
    assert second.metrics["autotuner_ms"] == ctx.metrics["autotuner_ms"]
