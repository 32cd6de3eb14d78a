"""softmax: plan choice (CPU), kernels lower and nvcc-compile for sm_80 and sm_90a (CPU), correctness (GPU)."""

import re

import pytest

import tourkit
from sections import softmax as S

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
AMPERE_86 = tourkit.ARCH_SPECS["sm_86"].smem_per_block_optin


# ---------------------------------------------------------------------------------------------------------
# Plan choice (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_plans_for_the_benchmark_shapes_on_hopper():
    kinds = {shape: S.choose_plan(*shape, HOPPER, "hopper").kind for shape in S.BENCH_SHAPES}
    assert kinds == {(32768, 4096): "staged", (16384, 8192): "registers", (8192, 32768): "online",
                     (4096, 1823): "registers"}


def test_odd_width_needs_rows_in_groups_of_eight_for_the_staged_kernel():
    assert S.choose_plan(1000, 4001, HOPPER).kind == "staged"
    assert S.choose_plan(1000, 4001, HOPPER).rows_per_block == 8
    assert S.choose_plan(1004, 4001, HOPPER) == S.SoftmaxPlan("registers", 1, 256)  # 1004 rows: masked loads, any M


def test_short_odd_rows_take_four_rows_per_block_only_when_every_row_exists():
    """Up to 2048 halves (57 floats a thread at 32 threads a row), four rows a block of 128 threads, registers
    capped for 8 resident blocks per SM; the kernel indexes rows without a bound, so M must be a multiple of 4."""
    assert S.choose_plan(4096, 1823, HOPPER) == S.SoftmaxPlan("registers", 4, 128, min_blocks_per_sm=8)
    assert S.choose_plan(1000, 1823, AMPERE_86, "ampere") == S.SoftmaxPlan("registers", 4, 128, min_blocks_per_sm=8)
    assert S.choose_plan(1000, 2047, HOPPER).rows_per_block == 4
    assert S.choose_plan(1002, 1823, HOPPER) == S.SoftmaxPlan("registers", 1, 256)  # a partial last block of rows
    assert S.choose_plan(1000, 2049, HOPPER).kind == "staged"  # 65 floats a thread: over PER_THREAD_LIMIT
    source = tourkit.lower_for_arch(S.build(4096, 1823, S.choose_plan(4096, 1823, HOPPER)), "sm_90a").kernel_source
    assert "__launch_bounds__(128, 8)" in source


def test_staged_odd_width_keeps_per_thread_work_bounded():
    plan = S.choose_plan(64, 8191, HOPPER)
    per_row = plan.threads // plan.rows_per_block
    assert plan.kind == "staged" and -(-8191 // per_row) <= S.PER_THREAD_LIMIT


def test_long_rows_are_filtered_by_shared_memory():
    assert S.choose_plan(100, 65536, HOPPER).kind == "online"  # 128 KiB row fits 227 KiB
    with pytest.raises(ValueError, match="shared memory"):
        S.choose_plan(100, 65536, AMPERE_86)  # 128 KiB row does not fit 99 KiB


def test_non_hopper_uses_registers_for_short_rows():
    assert S.choose_plan(32768, 4096, AMPERE_86, "ampere").kind == "registers"


@pytest.mark.parametrize("shape", [(0, 128), (128, 0)])
def test_bad_shapes_raise_a_clear_error(shape):
    with pytest.raises(ValueError, match="softmax"):
        S.choose_plan(*shape, HOPPER)


def test_staged_kernel_rejects_unaligned_row_groups():
    with pytest.raises(ValueError, match="16-byte"):
        S.rows_staged_in_shared(1000, 1823, 4, 128)  # 4·1823 halves: not a multiple of 8


# ---------------------------------------------------------------------------------------------------------
# Lowering and nvcc (no GPU): each kernel variant once per arch
# ---------------------------------------------------------------------------------------------------------

VARIANTS = {"registers": (16384, 8192), "staged": (4096, 3999), "online": (8192, 32768)}


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def reports(request):
    arch = request.param
    family = tourkit.ARCH_SPECS[arch].family
    out = {}
    for kind, (M, N) in VARIANTS.items():
        plan = S.choose_plan(M, N, tourkit.ARCH_SPECS[arch].smem_per_block_optin, family)
        assert plan.kind == kind
        out[kind] = tourkit.inspect_kernel(f"softmax {kind}", S.build(M, N, plan, family), arch)
    return arch, out


def test_kernels_compile_with_nvcc(reports):
    arch, reps = reports
    for kind, rep in reps.items():
        if tourkit.find_nvcc() is not None:
            assert rep.nvcc == "compiled", (arch, kind, rep.nvcc)


def test_reductions_are_in_registers_and_exponentials_use_exp2(reports):
    _, reps = reports
    for rep in reps.values():
        assert "AllReduce" in rep.source  # T.reduce_* over fragments: shuffles + a small exchange
        assert "exp2f" in rep.source or "ex2" in rep.source


def test_hopper_stages_rows_with_bulk_copies(reports):
    arch, reps = reports
    if arch == "sm_90a":
        tourkit.require_markers(reps["staged"], ["tma_load", "mbarrier"])
        tourkit.require_markers(reps["online"], ["tma_load", "mbarrier"])
    else:
        assert reps["staged"].markers["tma_load"] == 0


def test_odd_width_fragment_is_padded_not_whole_row_per_thread(reports):
    # 8 rows of 3999 over 512 threads: 64 threads per row, 63 floats each (not 3999 per thread).
    _, reps = reports
    assert "float x[63];" in reps["staged"].source


def test_turing_plans_fit_its_64_kib_and_hopper_plans_stay():
    """sm_75 holds 64 KiB per block: the 32768-wide row (64 KiB) cannot be staged, so it stays in registers;
    the plans for sm_90a are the ones measured."""
    turing = tourkit.ARCH_SPECS["sm_75"].smem_per_block_optin
    assert S.choose_plan(8192, 32768, turing, "turing") == S.SoftmaxPlan("registers", 1, 1024)
    assert S.choose_plan(8192, 32768, HOPPER, "hopper") == S.SoftmaxPlan("online", 8192, 512)
    assert S.choose_plan(16384, 16384, turing, "turing").kind == "online"  # 32 KiB rows still fit
    ctx = tourkit.TourContext(arch="sm_75", compile_only=True, echo=False)
    assert all(d.smem_limit == turing for d in S.kernels(ctx))


def test_section_runs_in_compile_only_mode_on_turing():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "softmax", "--compile-only", "--arch", "sm_75"])
    assert run.results[0].status == "passed", run.results[0].error_message
    assert run.results[0].headline["kernels"] == 5


def test_kernels_declared_for_a_run_are_what_it_checks_and_times():
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    ctx = tourkit.TourContext(device=device, echo=False)
    names = [d.name for d in S.kernels(ctx)]
    assert names == [p.name for p in S.problems(ctx)] and len(set(names)) == len(names)
    assert [(p.M, p.N) for p in S.problems(ctx) if p.timed] == S.BENCH_SHAPES
    assert [(p.M, p.N) for p in S.problems(ctx) if not p.timed] == S.ODD_SHAPES
    quick = tourkit.TourContext(device=device, quick=True, echo=False)
    assert [(p.M, p.N) for p in S.problems(quick) if p.timed] == S.QUICK_SHAPES


# ---------------------------------------------------------------------------------------------------------
# Correctness on a GPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(256, 4096), (64, 8192), (16, 32768), (1000, 1823), (1001, 1823), (37, 4096),
                                   (999, 3000), (37, 32768), (64, 2047), (1000, 4001)])
def test_softmax_matches_torch(shape):
    device = tourkit.detect_device()
    M, N = shape
    plan = S.choose_plan(M, N, device.smem_per_block_optin, device.family)
    check = S.check_shape(M, N, plan, family=device.family)
    assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("kind,args", [("registers", (1001, 1823, 1, 256)), ("registers", (1000, 1823, 4, 128)),
                                       ("registers", (999, 3000, 1, 256)), ("registers", (999, 4000, 1, 512)),
                                       ("staged", (1000, 1823, 8, 256)), ("registers", (37, 32768, 1, 1024)),
                                       ("online", (37, 32768, 4096, 512))])
def test_each_kernel_variant_matches_torch(kind, args):
    device = tourkit.detect_device()
    M, N, p, t = args
    plan = S.SoftmaxPlan(kind, p, t)
    check = S.check_shape(M, N, plan, family=device.family)
    assert check.passed, check.line()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("N, threads", [(3000, 256), (4000, 256), (2816, 512)])
def test_register_kernel_masks_aligned_rows_that_do_not_split_over_the_threads(arch, N, threads):
    # Regression: T.copy of 3000 columns over 256 threads failed layout inference (999x3000 on
    # sm_80). Such rows now take the padded, masked path, still in 16-byte vectors (rows are 16-byte aligned).
    source = tourkit.lower_for_arch(S.rows_in_registers(999, N, 1, threads), arch).kernel_source
    assert re.search(r"if \(.*\) \{\s*condval = \*\(uint4\*\)\(X \+", source)  # a guarded 16-byte read
    assert "-CUDART_INF_F" in source  # the pad


def _unmasked_vector_reads_of_shared_rows(source: str) -> int:
    """16-byte reads from the staged `rows` buffer, as the generated CUDA spells them."""
    return len(re.findall(r"=\s*\*\(uint4\*\)\(\(\(half_t\*\)rows\)", source))


@pytest.mark.parametrize("M, N, exact", [(999, 3000, False), (64, 4096, True)])
def test_staged_kernel_reads_no_vector_past_a_padded_row(M, N, exact):
    # Regression (a fault on Hopper): 999x3000 padded its row to 4096 and read it back with unmasked 16-byte
    # vectors, past the 6000-byte shared buffer: an illegal address. Vectors only when they tile the row.
    assert S.staged_vector_width(N, 256) == (8 if exact else 1)
    rep = tourkit.inspect_kernel("staged", S.rows_staged_in_shared(M, N, 1, 256), "sm_90a", nvcc=False)
    reads = _unmasked_vector_reads_of_shared_rows(rep.source)
    assert (reads > 0) == exact  # the exact width keeps its fast vector path (the control)


def test_section_judges_each_shape_against_its_own_copy(monkeypatch):
    """The section's GPU path with the GPU faked: the headline's worst case is taken per shape against the copy
    of the same bytes (timed in the same call), and the 1 GiB copy is reported beside it."""
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    # GB/s of (ours, the same-size copy) per shape: the small shape is far from the 1 GiB copy, near its own
    rates = {(32768, 4096): (4000, 4100), (4096, 1823): (2200, 2400)}
    timed_calls = []

    class FakeKernel:
        def __call__(self, *args):
            pass

        def get_kernel_source(self):
            return "AllReduce<tl::MaxOp"

    def fake_bench_table(cases):
        timed_calls.append(sorted(cases))
        out = {}
        for label, (M, N, _) in cases.items():
            ours, copy = rates[(M, N)]
            nbytes = 4 * M * N
            out[label] = (nbytes / ours / 1e6, 2 * nbytes / ours / 1e6, nbytes / copy / 1e6)  # ms
        return out

    monkeypatch.setattr(S, "BENCH_SHAPES", list(rates))
    monkeypatch.setattr(tourkit, "build_declared", lambda decls, log=None: {d.name: FakeKernel() for d in decls})
    monkeypatch.setattr(S, "bench_table", fake_bench_table)
    monkeypatch.setattr(S, "check_shape", lambda M, N, plan, softmax=None, family="hopper":
                        tourkit.Check(f"softmax {M}x{N}", 1e-4, 5e-3))
    monkeypatch.setattr(tourkit, "device_copy_gbps", lambda: 4200.0)
    ctx = tourkit.TourContext(device=device, echo=False)
    S.run(ctx)
    assert timed_calls == [["32768x4096", "4096x1823"]]  # one call for the whole table
    assert ctx.headlines["worst_of_same_size_copy"] == round(2200 / 2400, 3)
    assert ctx.headlines["worst_of_1gib_copy"] == round(2200 / 4200, 3)
    assert round(ctx.metrics["softmax_4096x1823_copy_gbps"]) == 2400
    row = next(line for line in ctx.report if line.startswith("4096x1823"))
    assert "52%" in row and "92%" in row and "2.00x" in row  # of the 1 GiB copy, of the same-size copy, vs torch
    assert " 13.6 " in row  # µs: 29.9 MB at 2200 GB/s


def test_a_wrong_kernel_fails_before_any_timing(monkeypatch):
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    monkeypatch.setattr(tourkit, "build_declared", lambda decls, log=None: {d.name: None for d in decls})
    monkeypatch.setattr(S, "launcher", lambda kernel, plan: None)
    monkeypatch.setattr(S, "check_shape", lambda M, N, plan, softmax=None, family="hopper":
                        tourkit.Check(f"softmax {M}x{N}", 1.0 if N == 1823 else 1e-4, 5e-3))
    monkeypatch.setattr(S, "bench_table", lambda cases: pytest.fail("timed a wrong kernel"))
    with pytest.raises(tourkit.ValidationError, match="1823"):
        S.run(tourkit.TourContext(device=device, echo=False))
