"""fusion: the fused epilogue's codegen for both GELU forms (CPU); numerics vs float32 torch (GPU)."""

import pytest

import tilelang_tour
import tourkit
from sections import fusion
from sections.gemm_schedules import compile_gemm, default_schedules, epilogue_pass_configs, fits, gelu_exact, gemm_program

CONFIG_FOR = {"sm_80": fusion.fused_config("ampere", tourkit.ARCH_SPECS["sm_80"].smem_per_block_optin),
              "sm_90a": fusion.fused_config("hopper", tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin)}
EXPECTED = {"sm_80": ["cp_async", "ldmatrix", "mma_sync"], "sm_90a": ["wgmma", "tma_load", "mbarrier"]}


@pytest.fixture(scope="module", params=[("sm_80", "gelu"), ("sm_90a", "gelu"), ("sm_90a", "gelu_erff"),
                                        ("sm_90a", "gelu_tanh")])
def fused_report(request):
    arch, activation = request.param
    func = gemm_program(1000, 1000, 1000, CONFIG_FOR[arch], bias=True, activation=activation)
    report = tourkit.inspect_kernel(f"fused {activation}", func, arch, pass_configs=epilogue_pass_configs(activation))
    return arch, activation, report


def test_fused_kernel_compiles_with_epilogue_on_the_accumulator(fused_report):
    arch, activation, report = fused_report
    assert report.nvcc == "compiled"
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


def test_plain_gemm_has_no_epilogue():
    report = tourkit.inspect_kernel("plain", gemm_program(512, 512, 512, CONFIG_FOR["sm_90a"]), "sm_90a", nvcc=False)
    assert "erff(" not in report.source and "Bias" not in report.source


def test_saved_traffic_is_two_intermediates_written_and_read():
    assert fusion.saved_traffic_bytes(8192, 8192) == 4 * 8192 * 8192 * 2 == 512 * 2**20
    assert fusion.saved_traffic_bytes(10, 20, elem_bytes=4) == 3200


def test_fused_config_is_a_fitting_default_schedule():
    for family, arch in (("hopper", "sm_90a"), ("ampere", "sm_86"), ("turing", "sm_75")):
        budget = tourkit.ARCH_SPECS[arch].smem_per_block_optin
        config = fusion.fused_config(family, budget)
        assert config in default_schedules(family) and fits(config, budget)
        assert config.kernel == ("pingpong" if family == "hopper" else "tilelang")
    # the persistent grid follows the GPU
    assert fusion.fused_config("hopper", tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin, 114).persistent == 114


def test_section_compile_only_through_the_runner():
    run = tilelang_tour.main(["--only", "fusion", "--compile-only", "--arch", "sm_80"])
    assert run.results[0].status == "passed", run.results[0].error_message
    assert run.results[0].headline["saved_bytes_8192"] == 512 * 2**20


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("M,N,K", [(1000, 1000, 1000), (256, 512, 136)])
def test_fused_matches_float32_torch_on_the_gpu(M, N, K, activation):
    device = tourkit.detect_device()
    config = fusion.fused_config(device.family, device.smem_per_block_optin, device.sm_count)
    kernel = compile_gemm(M, N, K, config, bias=True, activation=activation)
    a, b, bias, c = fusion.fused_inputs(M, N, K, seed=9)
    ref = fusion.reference(a, b, bias, activation)
    check = tourkit.validate(activation, lambda: kernel(a, b, bias, c), c, ref, fusion.TOLERANCE)
    assert check.passed, check.line()
    # the other GELU form differs measurably: the check can tell them apart
    other = fusion.reference(a, b, bias, "gelu_tanh" if activation == "gelu" else "gelu")
    assert tourkit.relative_error(c, other) > tourkit.relative_error(c, ref)
