"""fusion: the fused epilogue's codegen for every GELU form, the GELU formula, the declared kernels and the
benchmark's headlines (CPU); numerics of the lesson's and the appendix's fused kernels vs float32 torch (GPU)."""

import pytest

import tilelang_tour
import tourkit
from sections import fusion
from sections.gemm_epilogue import epilogue_pass_configs, gelu_exact
from sections.gemm_schedules import GemmConfig, compile_gemm, gemm_program

CONFIG_FOR = {arch: fusion.lesson_config(tourkit.ARCH_SPECS[arch].family, tourkit.ARCH_SPECS[arch].smem_per_block_optin)
              for arch in ("sm_80", "sm_90a")}
EXPECTED = {"sm_80": ["cp_async", "ldmatrix", "mma_sync"], "sm_90a": ["wgmma", "tma_load", "mbarrier"]}


@pytest.fixture(scope="module", params=[("sm_80", "gelu"), ("sm_90a", "gelu"), ("sm_90a", "gelu_erff"),
                                        ("sm_90a", "gelu_tanh")])
def fused_report(request):
    arch, activation = request.param
    func = gemm_program(1000, 1000, 1000, CONFIG_FOR[arch], bias=True, activation=activation)
    report = tourkit.inspect_kernel(f"fused {activation}", func, arch, nvcc=False,
                                    pass_configs=epilogue_pass_configs(activation))
    return arch, activation, report


def test_fused_kernel_lowers_with_epilogue_on_the_accumulator(fused_report):
    arch, activation, report = fused_report
    tourkit.require_markers(report, EXPECTED[arch])
    source = report.source
    assert "Bias" in source
    if activation == "gelu":  # the rational erfc: an exp2 and a division, no libdevice erff, no tanh
        assert "exp2f(" in source and "fabsf(" in source and "erff(" not in source and "tanh" not in source
    elif activation == "gelu_erff":
        assert "erff(" in source and "tanh" not in source
    else:
        assert "tanh" in source and "erff(" not in source


def test_gelu_formula_matches_the_erf_definition():
    """The epilogue's formula, run in NumPy: within 2.5e-7 of x * 0.5 * (1 + erf(x / sqrt 2)) everywhere
    (fp16 output resolves 4.9e-4; float32 rounding adds 1e-6 at most on |x| <= 12), exact at 0 and far out."""
    import math

    import numpy as np

    x = np.linspace(-12.0, 12.0, 48001)
    exact = np.array([v * 0.5 * (1.0 + math.erf(v / math.sqrt(2.0))) for v in x])
    assert np.max(np.abs(gelu_exact(x, np.abs, np.exp2, np.maximum) - exact)) < 2.5e-7
    in_float32 = gelu_exact(x.astype(np.float32), np.abs, np.exp2, np.maximum)
    assert in_float32.dtype == np.float32 and np.max(np.abs(in_float32 - exact)) < 1e-6
    edges = gelu_exact(np.array([0.0, 40.0, -40.0, 1e4, -1e4]), np.abs, np.exp2, np.maximum)
    assert edges.tolist() == [0.0, 40.0, 0.0, 1e4, 0.0]


def test_saved_traffic_is_two_intermediates_written_and_read():
    assert fusion.saved_traffic_bytes(8192, 8192) == 4 * 8192 * 8192 * 2 == 512 * 2**20
    assert fusion.saved_traffic_bytes(10, 20, elem_bytes=4) == 3200


def test_lesson_config_is_the_gemm_lessons_fitting_default():
    """The GEMM lesson's default schedule per architecture; with less shared memory, the first that fits."""
    expected = {"sm_90a": GemmConfig(128, 256, 64, 4, 256, True), "sm_86": GemmConfig(128, 256, 32, 3, 256, True),
                "sm_75": GemmConfig(128, 128, 32, 2, 128, True)}
    for arch, config in expected.items():
        spec = tourkit.ARCH_SPECS[arch]
        assert fusion.lesson_config(spec.family, spec.smem_per_block_optin) == config, arch
    # 64 KiB: the 128x256 (74 KiB) and 128x128 (65 KiB) schedules do not fit, the 64x128 one does
    assert fusion.lesson_config("ampere", 64 * 1024) == GemmConfig(64, 128, 32, 4, 128, True)
    with pytest.raises(tourkit.SectionSkip, match="no GEMM schedule fits"):
        fusion.lesson_config("turing", 16 * 1024)


def test_declared_kernels_add_the_appendix_on_hopper_only():
    hopper = fusion.kernels(tourkit.TourContext(compile_only=True, arch="sm_90a", echo=False))
    ampere = fusion.kernels(tourkit.TourContext(compile_only=True, arch="sm_80", echo=False))
    # the rule's schedule with exact GELU at the section's size, with both GELU forms at a ragged size
    assert len(hopper) == 5 and len(ampere) == 3 and len({d.name for d in hopper}) == 5
    assert [d.name for d in hopper[-2:]] == [
        "hand-written ping-pong, persistent on 132 SMs + bias + gelu @2048x2048x2048",
        "hand-written ping-pong, persistent on 132 SMs + bias + gelu @1000x1000x1000"]
    assert all(d.pass_configs == epilogue_pass_configs("gelu") for d in hopper[-2:])
    assert [d.nvcc for d in hopper].count(True) == 3


def test_benchmark_times_everything_in_one_call_and_says_which_kernel_each_number_is(monkeypatch):
    calls = []

    def fake_bench(fns, **kw):
        calls.append(list(fns))
        return {name: {"eager PyTorch (3 kernels)": 1.2, "torch.compile (default)": 1.1}.get(name, 1.0 if
                "ping-pong" in name else 1.08) for name in fns}

    monkeypatch.setattr(fusion, "fused_inputs", lambda M, N, K, seed=0, dtype="float16": (None,) * 4)
    monkeypatch.setattr(fusion, "compiled_eager", lambda mode, activation="gelu": (lambda a, b, bias: None, None))
    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    ctx = tourkit.TourContext(arch="sm_90a", echo=False)
    built = {d.name: (lambda *args: None) for d in fusion.kernels(ctx)}
    fusion.benchmark(ctx, built)
    assert len(calls) == 1 and len(calls[0]) == 4
    assert ctx.headlines["lesson_vs_eager"] == round(1.2 / 1.08, 3)
    assert ctx.headlines["appendix_vs_eager"] == 1.2 and ctx.headlines["appendix_vs_compile"] == 1.1
    assert ctx.metrics["compile_mode"] == "default"


@pytest.mark.parametrize("faster", ["runner-up", "pick"])
def test_a_users_problem_times_the_fused_pick_beside_its_neighbours_and_keeps_the_fastest(monkeypatch, faster):
    """--shape: the fused pick, its runner-up with another tile and the lesson's default (none of them the
    persistent walk, which an epilogue slows), timed in one call; the headline is the fastest of them."""
    ctx = tourkit.TourContext(arch="sm_90a", shape=(2500, 1000, 3000), echo=False)
    lessons = [p for p, _, timed, _ in fusion.planned(ctx) if timed and isinstance(p.config, GemmConfig)]
    assert len(lessons) >= 2 and not any(p.config.persistent for p in lessons)
    assert lessons[0].config == fusion.rule(ctx, 2500, 1000, 3000, epilogue=True).config
    names = [d.name for d in fusion.kernels(ctx)]
    assert len(set(names)) == len(names)
    winner = lessons[1 if faster == "runner-up" else 0].config.label()
    calls = []

    def fake_bench(fns, **kw):
        calls.append(list(fns))
        return {name: 0.8 if name == winner else 1.2 if name.startswith("eager") else 1.0 for name in fns}

    monkeypatch.setattr(fusion, "fused_inputs", lambda M, N, K, seed=0, dtype="float16": (None,) * 4)
    monkeypatch.setattr(fusion, "compiled_eager", lambda mode, activation="gelu": (None, "no compiler here"))
    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    fusion.benchmark(ctx, {d.name: (lambda *args: None) for d in fusion.kernels(ctx)})
    assert len(calls) == 1 and {p.config.label() for p in lessons} <= set(calls[0])
    assert ctx.headlines["lesson_vs_eager"] == 1.5 and ctx.metrics["lesson"] == winner
    text = "\n".join(ctx.report)
    assert ("ran 1.25x the speed of the rule's pick" if faster == "runner-up" else "the rule's pick was the fastest") in text
    assert "<- fastest" in text


def test_section_compile_only_through_the_runner():
    run = tilelang_tour.main(["--only", "fusion", "--compile-only", "--arch", "sm_80"])
    assert run.results[0].status == "passed", run.results[0].error_message
    assert run.results[0].headline["saved_bytes_8192"] == 512 * 2**20


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (256, 512, 136)])
@pytest.mark.parametrize("kernel_kind", ["lesson", "appendix"])
def test_fused_matches_float32_torch_on_the_gpu(M, N, K, activation, kernel_kind):
    device = tourkit.detect_device()
    if kernel_kind == "lesson":
        kernel = compile_gemm(M, N, K, fusion.lesson_config(device.family, device.smem_per_block_optin),
                              bias=True, activation=activation)
    elif device.arch != "sm_90a":
        pytest.skip("the ping-pong kernel is Hopper-only")
    else:
        from sections.hopper import gemm_pingpong

        config = gemm_pingpong.appendix_schedule(M, N, K, device.sm_count)
        kernel = gemm_pingpong.compile_appendix(M, N, K, config, bias=True, activation=activation)
    a, b, bias, c = fusion.fused_inputs(M, N, K, seed=9)
    ref = fusion.reference(a, b, bias, activation)
    check = tourkit.validate(activation, lambda: kernel(a, b, bias, c), c, ref, fusion.TOLERANCE)
    assert check.passed, check.line()
    # the other GELU form differs measurably: the check can tell them apart
    other = fusion.reference(a, b, bias, "gelu_tanh" if activation == "gelu" else "gelu")
    assert tourkit.relative_error(c, other) > tourkit.relative_error(c, ref)
