"""flash_attention (the lesson): the configuration rule, the declared kernels (CPU); the lesson's kernels lower for
sm_80 and sm_90a with the expected instructions and within their shared-memory estimates (CPU); correctness
against SDPA incl. causal, odd lengths and head dim 64 (GPU)."""

import dataclasses
import re

import pytest
import tilelang

import tourkit
from sections import flash_attention as FA

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
H200 = tourkit.DeviceInfo("H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)


def compile_config(shape, causal, cfg):
    """attention(q, k, v, o) for one problem and configuration (the section's own path: build, pass configs,
    the appendix's launcher)."""
    from sections.hopper import attention_ws

    func = FA.build(*shape, causal, cfg)
    return attention_ws.launcher(tilelang.compile(func, out_idx=None, target="cuda", pass_configs=FA.pass_configs(cfg)))


# ---------------------------------------------------------------------------------------------------------
# The configuration rule and the declared kernels (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_hopper_picks_the_async_kernel_for_head_dim_128():
    full = FA.choose_config(128, False, "hopper", HOPPER)
    causal = FA.choose_config(128, True, "hopper", HOPPER)
    assert full["kind"] == causal["kind"] == "async" and full["fast_math"] and causal["fast_math"]
    assert (full["block_N"], causal["block_N"]) == (176, 128) and causal["heavy_first"] and not full.get("heavy_first")
    assert FA.choose_config(64, False, "hopper", HOPPER)["kind"] == "pipelined"
    assert FA.choose_config(64, True, "hopper", HOPPER)["kind"] == "async"
    # every table entry fits Hopper's shared memory; the 176-wide tiles only because O reuses the K/V buffers
    for cfg in FA.HOPPER_CONFIGS.values():
        assert FA.smem_estimate(128, cfg["block_M"], cfg["block_N"], cfg["num_stages"], cfg["kind"] == "async") <= HOPPER
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


def test_declared_kernels_lesson_and_appendix_side_by_side_on_hopper():
    ctx = tourkit.TourContext(device=H200, echo=False)
    names = [d.name for d in FA.kernels(ctx)]
    for mode in ("full", "causal"):  # the benchmarked problem: both kernels, each mode
        assert f"lesson B4 H32 S4096 D128 {mode}" in names and f"appendix B4 H32 S4096 D128 {mode}" in names
    assert "lesson B2 H4 S1000 D64 causal" in names and "appendix B2 H4 S1000 D64 causal" not in names
    assert not any("S16384" in n for n in names)  # only with --full
    assert any("S16384" in n for n in (d.name for d in FA.kernels(tourkit.TourContext(device=H200, full=True, echo=False))))
    quick = FA.kernels(tourkit.TourContext(device=H200, quick=True, echo=False))
    assert len(quick) < len(names) and not any("S4096" in d.name for d in quick)
    # the appendix's persistent grid takes the GPU's SM count; compile-only the default
    h100 = dataclasses.replace(H200, name="H100", sm_count=114)
    plan = {name: cfg for name, _, _, cfg, _ in FA.plan(tourkit.TourContext(device=h100, echo=False))}
    assert plan["appendix B4 H32 S4096 D128 full"]["sms"] == 114
    decl = {d.name: d for d in FA.kernels(ctx)}["lesson B4 H32 S4096 D128 full"]
    assert decl.pass_configs == {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} and decl.nvcc
    assert decl.markers == tuple(tourkit.TENSOR_CORE_MARKERS["hopper"]) and decl.threads == 256


def test_elsewhere_the_lesson_kernel_alone():
    names = [d.name for d in FA.kernels(tourkit.TourContext(compile_only=True, arch="sm_80", echo=False))]
    assert names and all(n.startswith("lesson ") for n in names)


# ---------------------------------------------------------------------------------------------------------
# Lowering (no GPU): a ragged length (1000) so the masking paths are generated too
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reports():
    """The lesson's kernels for B2 H4 S1000 D128, full and causal, lowered for sm_80 and sm_90a."""
    jobs, keys = [], []
    for arch in ("sm_80", "sm_90a"):
        spec = tourkit.ARCH_SPECS[arch]
        for causal in (False, True):
            cfg = FA.choose_config(128, causal, spec.family, spec.smem_per_block_optin)
            jobs.append((f"{arch} {causal}", FA.build(2, 4, 1000, 128, causal, cfg), arch, FA.pass_configs(cfg)))
            keys.append((arch, causal, cfg))
    return [(*key, rep) for key, rep in zip(keys, tourkit.inspect_kernels(jobs, nvcc=False))]


def test_expected_instructions_and_exp2(reports):
    for arch, _, _, rep in reports:
        tourkit.require_markers(rep, tourkit.TENSOR_CORE_MARKERS[tourkit.ARCH_SPECS[arch].family])
        assert "exp2f" in rep.source
    hopper = [rep for arch, _, _, rep in reports if arch == "sm_90a"]
    assert all("wait_wgmma<1>" in rep.source for rep in hopper)  # the FA3 schedule: one MMA left in flight


def test_shared_memory_estimates_bound_the_lowered_kernels(reports):
    for arch, causal, cfg, rep in reports:
        estimate = FA.smem_estimate(128, cfg["block_M"], cfg["block_N"], cfg["num_stages"], cfg["kind"] == "async")
        assert rep.smem_bytes <= estimate + 1024, (arch, causal, rep.smem_bytes, estimate)  # + barriers
        if cfg["kind"] == "async":  # exact there: the test that the output reuses the K/V buffers
            assert rep.smem_bytes >= estimate, (arch, causal, rep.smem_bytes, estimate)


def test_causal_loop_bound_is_clamped(reports):
    # The causal kernel's key loop runs to min(n_tiles, ceil((bx+1)·bM / bN)); full attention's is fixed.
    def key_loop_bounds(source):
        return re.findall(r"for \(int k\w* = [01]; k\w* < ([^;]+);", source)

    for arch in ("sm_80", "sm_90a"):
        (causal,) = [rep for a, c, _, rep in reports if a == arch and c]
        (full,) = [rep for a, c, _, rep in reports if a == arch and not c]
        assert any(re.search(r"blockIdx\.x|condval", bound) for bound in key_loop_bounds(causal.source))
        assert all(bound.strip().isdigit() for bound in key_loop_bounds(full.source))


def test_section_runs_in_compile_only_mode():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "flash_attention", "--compile-only", "--arch", "sm_80", "--quick"])
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
    cfg = FA.choose_config(shape[3], causal, device.family, device.smem_per_block_optin)
    (check,) = FA.check_attention(*shape, causal, {"lesson": compile_config(shape, causal, cfg)})
    assert check.passed, check.line()


LESSON_SCHEDULES = [
    dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True, heavy_first=True),
    dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True),
]
SCHEDULE_SHAPES = ((1, 3, 777, 128), (2, 4, 1000, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", LESSON_SCHEDULES, ids=lambda cfg: " ".join(map(str, FA.describe(cfg))))
def test_every_lesson_schedule_matches_sdpa(causal, cfg):
    device = tourkit.detect_device()
    if cfg["kind"] == "async" and device.family != "hopper":
        pytest.skip("wgmma is Hopper-only")
    for shape in SCHEDULE_SHAPES:
        (check,) = FA.check_attention(*shape, causal, {"lesson": compile_config(shape, causal, cfg)})
        assert check.passed, check.line()
