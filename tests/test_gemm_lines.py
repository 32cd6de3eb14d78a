"""B copied into rows of whole 128-byte lines before the GEMM (`GemmPlan.pad_b`): where the rule does it, the
copy's kernel and the GEMM reading the wider B (lowered for sm_90a), the launcher's order of calls (CPU
stand-ins), the --shape sections timing the plan beside its unpadded self; correctness on the GPU."""

from dataclasses import replace

import pytest

import tourkit
from sections import fusion, gemm_schedules
from sections.gemm_plans import (LINE, GemmConfig, GemmLauncher, GemmPlan, pad_rows_program, plan_problem)

HOPPER = ("hopper", 132, 232448)


@pytest.mark.parametrize("M,N,K", [(8192, 1000, 8192), (16384, 1000, 16384), (8192, 1000, 8193), (6144, 2500, 6144),
                                   (16384, 3000, 2048)])
def test_large_problems_whose_b_rows_start_off_sectors_copy_b_into_whole_lines(M, N, K):
    plan = plan_problem(M, N, K, *HOPPER)
    assert plan.pad_b and plan.b_width == -(-N // LINE) * LINE and plan.b_width % LINE == 0
    assert plan.parts[0] == "pad_b" and "gemm" in plan.parts
    assert f"B copied into rows of {plan.b_width} columns first" in plan.describe()
    assert f", B copied into rows of {plan.b_width}" in plan.label()


@pytest.mark.parametrize("M,N,K,family", [(2500, 1000, 3000, "hopper"), (1000, 1000, 1000, "hopper"),
                                          (8192, 1024, 8192, "hopper"), (8192, 4000, 8192, "hopper"),
                                          (8192, 1001, 8192, "hopper"), (8192, 1000, 8192, "ampere"),
                                          (7, 13, 5, "hopper"), (1, 1, 1, "hopper")])
def test_mid_problems_aligned_rows_and_other_families_keep_b_as_it_is(M, N, K, family):
    """Mid-size problems: the copy would cost more than half of what the rows are taken to cost; rows on whole
    lines or on 32-byte sectors (4000 columns; 1001, padded to 1008 anyway); cp.async (Ampere) loads rows without TMA; tiny problems' copies
    are launches."""
    plan = plan_problem(M, N, K, family, 132 if family == "hopper" else 108, 232448 if family == "hopper" else 166912)
    assert not plan.pad_b and plan.b_width == plan.kernel_shape[1]
    assert ("pad_b" in plan.parts) == plan.padded  # a zero-padded B is still copied by the plan's kernel


def _params(func):
    return {p.name.removesuffix("_handle"): [int(d) for d in func.buffer_map[p].shape] for p in func.params}


def test_the_gemm_reads_b_of_the_padded_width_and_c_of_its_own():
    plan = plan_problem(8192, 1000, 8192, *HOPPER)
    programs = plan.programs()
    assert _params(programs["gemm"]) == {"A": [8192, 8192], "B": [8192, 1024], "C": [8192, 1000]}
    assert _params(programs["pad_b"]) == {"S": [8192, 1000], "P": [8192, 1024]}
    fused = replace(plan, config=GemmConfig(128, 256, 64, 4, 256, True)).programs(bias=True, activation="gelu")
    assert _params(fused["gemm"])["B"] == [8192, 1024] and _params(fused["gemm"])["Bias"] == [1000]


def test_the_copy_and_the_gemm_lower_for_hopper():
    """The copy moves 16-byte vectors; the GEMM still loads through TMA."""
    copy = tourkit.inspect_kernel("pad", pad_rows_program(3000, 1000, 3000, 1024), "sm_90a", nvcc=False)
    assert "uint4" in copy.source
    plan = replace(plan_problem(2500, 1000, 3000, *HOPPER), pad_b=True)
    gemm = tourkit.inspect_kernel("gemm", plan.programs()["gemm"], "sm_90a", nvcc=False)
    assert "tma_load" in gemm.source and "wgmma" in gemm.source


def test_an_unaligned_b_is_copied_by_the_same_kernel_into_its_wider_rows():
    with pytest.raises(ValueError, match="loads its rows masked"):
        replace(plan_problem(777, 1001, 999, *HOPPER), pad_b=True)
    plan = replace(plan_problem(777, 1001, 999, *HOPPER), pad=True, pad_b=True)
    assert plan.padded and plan.kernel_shape == (777, 1008, 1000) and plan.b_width == 1024
    assert _params(plan.programs()["pad_b"]) == {"S": [999, 1001], "P": [1000, 1024]}


@pytest.mark.parametrize("M,N,K", [(5, 70, 9), (33, 1000, 64), (6, 13, 5)])
@pytest.mark.parametrize("bias", [False, True])
def test_the_launcher_copies_b_first_and_hands_the_gemm_the_padded_b(M, N, K, bias):
    torch = pytest.importorskip("torch")
    plan = GemmPlan(M, N, K, GemmConfig(64, 64, 64, 4, 128, True), pad_b=True)
    calls = []

    def pad_b(src, dst):
        calls.append(("pad_b", tuple(dst.shape)))
        dst[:src.shape[0], :src.shape[1]] = src

    def gemm(a, b, *rest):
        calls.append(("gemm", tuple(b.shape)))
        assert torch.count_nonzero(b[:, N:]) == 0  # the padding stays zero
        rest[-1].copy_((a @ b[:, :rest[-1].shape[1]]) + (rest[0] if len(rest) == 2 else 0))

    run = GemmLauncher(plan, {"pad_b": pad_b, "gemm": gemm})
    Mk, Nk, Kk = plan.kernel_shape
    for seed in range(2):  # the kept buffers stay right across calls
        gen = torch.Generator().manual_seed(seed)
        a, b = torch.randn(M, K, generator=gen, dtype=torch.float64), torch.randn(K, N, generator=gen, dtype=torch.float64)
        bb, c = torch.randn(N, generator=gen, dtype=torch.float64), torch.empty(M, N, dtype=torch.float64)
        run(a, b, bb, c) if bias else run(a, b, c)
        assert torch.allclose(c, a @ b + (bb if bias else 0), atol=1e-9)
    assert calls[:2] == [("pad_b", (Kk, plan.b_width)), ("gemm", (Kk, plan.b_width))] and len(calls) == 4


@pytest.mark.parametrize("section", [gemm_schedules, fusion])
def test_with_a_shape_the_padded_pick_is_timed_beside_its_unpadded_self(section):
    ctx = tourkit.TourContext(compile_only=True, arch="sm_90a", shape=(8192, 1000, 8192), echo=False)
    names = [d.name for d in section.kernels(ctx)]
    assert len(names) == len(set(names))
    padded = [n for n in names if "B copied into rows of 1024" in n]
    assert any(n.endswith("(pad_b)") for n in padded)
    bare = [n.replace(", B copied into rows of 1024", "") for n in padded if not n.endswith("(pad_b)")]
    assert bare and all(n in names for n in bare[:1])
    if section is gemm_schedules:  # compile-only reports the first declared kernel as the pick's: the GEMM
        first = section.kernels(ctx)[0]
        assert not first.name.endswith(")") and "wgmma" in first.markers
    if section is fusion:  # the ping-pong appendix reads the padded copy too
        assert any(n.startswith("hand-written ping-pong") and n.endswith("(pad_b)") for n in names)


@pytest.mark.parametrize("faster", ["padded", "unpadded"])
def test_the_report_names_the_padded_copy_and_keeps_the_faster(fake_gemm_timing, faster):
    ctx = tourkit.TourContext(arch="sm_90a", shape=(8192, 1000, 8192), echo=False)
    rows, _, _ = gemm_schedules.plan(ctx)
    padded, bare = rows[0], rows[-1]
    assert padded.pad_b and not bare.pad_b and bare.config == padded.config
    winner = padded if faster == "padded" else bare
    fake_gemm_timing(lambda label: 0.8 if label == gemm_schedules.kernel_name(winner) else 1.0, cublas_ms=0.9)
    gemm_schedules.run(ctx)
    text = "\n".join(ctx.report)
    assert ctx.headlines["lesson"] == winner.label() and "T.Pipelined, B in 1024-column rows" in text
    assert "padding copies included" in text and "start off 32-byte sectors" in text


def test_fusion_reports_the_padded_pick_and_its_unpadded_self(monkeypatch):
    ctx = tourkit.TourContext(arch="sm_90a", shape=(8192, 1000, 8192), echo=False)
    lessons = [p for p, _, timed, _ in fusion.planned(ctx) if timed and isinstance(p.config, GemmConfig)]
    bare = lessons[-1]
    assert lessons[0].pad_b and not bare.pad_b and bare.config == lessons[0].config

    def fake_bench(fns, **kw):
        return {name: 0.8 if name == bare.label() else 1.2 if name.startswith("eager") else 1.0 for name in fns}

    monkeypatch.setattr(fusion, "fused_inputs", lambda M, N, K, seed=0, dtype="float16": (None,) * 4)
    monkeypatch.setattr(fusion, "compiled_eager", lambda mode, activation="gelu": (None, "no compiler here"))
    monkeypatch.setattr(tourkit, "bench_interleaved", fake_bench)
    fusion.benchmark(ctx, {d.name: (lambda *args: None) for d in fusion.kernels(ctx)})
    text = "\n".join(ctx.report)
    assert ctx.metrics["lesson"] == bare.label() and "T.Pipelined 128x256x64, B in 1024-column rows" in text
    assert "hand-written ping-pong, persistent on 132 SMs 128x192x64, B in 1024-column rows" in text


# ---- On the GPU ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype", [(1100, 1000, 1000, "float16"), (777, 1001, 999, "float16"),
                                         (300, 4097, 65, "bfloat16"), (8192, 1000, 8192, "float16")])
@pytest.mark.parametrize("epilogue", [False, True])
def test_b_copied_into_whole_lines_gives_the_right_product(M, N, K, dtype, epilogue):
    import tilelang

    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("B is copied into whole lines on Hopper only")
    plan = replace(plan_problem(M, N, K, device.family, device.sm_count, device.smem_per_block_optin, dtype),
                   pad=True, pad_b=True)
    activation = "gelu" if epilogue else None
    kernels = {part: tilelang.compile(f, out_idx=None, target="cuda", pass_configs=plan.pass_configs(part, activation))
               for part, f in plan.programs(bias=epilogue, activation=activation).items()}
    run = GemmLauncher(plan, kernels)
    for seed in (5, 6, 7):  # three calls: the kept buffers stay right
        a, b, bias, c = fusion.fused_inputs(M, N, K, seed=seed, dtype=dtype)
        ref = gemm_schedules.reference(a, b, bias if epilogue else None, activation)
        call = (lambda: run(a, b, bias, c)) if epilogue else (lambda: run(a, b, c))
        check = tourkit.validate(f"{M}x{N}x{K} {dtype} B in lines", call, c, ref, gemm_schedules.TOLERANCE)
        assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ws", "pingpong"])
@pytest.mark.parametrize("M,N,K", [(1100, 1000, 1000), (2500, 1000, 3000)])
def test_the_appendix_kernels_read_a_b_of_whole_lines(kind, M, N, K):
    """The hand-written kernels (the warp-specialized one in cluster pairs where its rule takes them) on B's
    padded copy, with bias + GELU, three calls."""
    import tilelang

    from sections.hopper import gemm_pingpong, gemm_ws

    device = tourkit.detect_device()
    if device.arch != "sm_90a":
        pytest.skip("the appendix kernels are Hopper's")
    module = gemm_ws if kind == "ws" else gemm_pingpong
    plan = GemmPlan(M, N, K, module.appendix_schedule(M, N, K, device.sm_count), pad_b=True)
    kernels = {part: tilelang.compile(f, out_idx=None, target="cuda", pass_configs=plan.pass_configs(part, "gelu"))
               for part, f in plan.programs(bias=True, activation="gelu").items()}
    run = GemmLauncher(plan, kernels)
    for seed in (5, 6, 7):
        a, b, bias, c = fusion.fused_inputs(M, N, K, seed=seed)
        ref = gemm_schedules.reference(a, b, bias, "gelu")
        check = tourkit.validate(f"{kind} {M}x{N}x{K} B in lines", lambda: run(a, b, bias, c), c, ref,
                                 gemm_schedules.TOLERANCE)
        assert check.passed, check.line()
