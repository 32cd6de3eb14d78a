"""softmax: plan choice (CPU), kernels lower and nvcc-compile for sm_80 and sm_90a (CPU), correctness (GPU)."""

import re

import pytest

import tourkit
from sections import softmax as S
from sections import softmax_plans as P
from sections.shapes import SOFTMAX_MAX_WIDTH

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
AMPERE_86 = tourkit.ARCH_SPECS["sm_86"].smem_per_block_optin


# ---------------------------------------------------------------------------------------------------------
# Plan choice (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_plans_for_the_benchmark_shapes_on_hopper():
    kinds = {shape: S.choose_plan(*shape, HOPPER, "hopper").kind for shape in S.BENCH_SHAPES}
    assert kinds == {(32768, 4096): "staged", (16384, 8192): "registers", (8192, 32768): "online",
                     (4096, 1823): "registers"}


ARCHS = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90a"]


def plan_fits(M, N, plan, smem):
    """What each kernel needs of a plan: a thread's share of the row within its registers, shared memory
    within the budget, rows that divide the threads, whole vectors."""
    if plan.kind in ("registers", "staged"):
        per_row = plan.threads // plan.rows_per_block
        assert plan.threads % plan.rows_per_block == 0 and per_row & (per_row - 1) == 0
        assert P.per_thread(N, per_row) <= 64
        assert plan.threads <= 1024
        if plan.kind == "staged":
            assert 2 * plan.rows_per_block * N + P.SMEM_SLACK <= smem and (plan.rows_per_block * N) % 8 == 0
    elif plan.kind == "cluster":  # runs of whole vectors, each staged whole, every block owning some
        assert plan.staged == P.cluster_part(N, plan.cluster) and plan.staged % 8 == 0 and P.splits_over(N, plan.cluster)
        assert plan.staged * plan.cluster >= N // 8 * 8 and plan.cluster in P.CLUSTER_SIZES
        assert P.staged_blocks_per_sm(plan.staged, smem, plan.threads) >= P.CLUSTER_MIN_BLOCKS
    else:
        assert plan.kind == "online" and plan.rows_per_block % P.vector_width(N) == 0
        step = plan.threads * plan.rows_per_block
        padded = -(-plan.staged // step) * step  # the head buffer, padded to whole steps
        assert plan.staged <= N and 2 * padded + P.SMEM_SLACK <= smem
        assert plan.staged % 8 == 0 or plan.staged == N  # a bulk copy moves whole 16-byte units
    assert plan.why
    return True


@pytest.mark.parametrize("arch", ARCHS)
def test_every_width_gets_a_plan_that_fits_the_gpu(arch):
    """Every width from 1 to the widest --shape accepts, on every architecture the tour supports."""
    spec = tourkit.ARCH_SPECS[arch]
    seen = {}
    for N in range(1, SOFTMAX_MAX_WIDTH + 1):
        plan = S.choose_plan(3, N, spec.smem_per_block_optin, spec.family)
        key = (plan.kind, plan.rows_per_block, plan.threads, plan.staged > 0, P.vector_width(N))
        if key not in seen or N % 4099 == 0:  # each distinct plan shape once, and a sample of the rest
            seen[key] = N
            assert plan_fits(3, N, plan, spec.smem_per_block_optin), (arch, N, plan)


def test_narrow_rows_share_a_block():
    """A narrow row on a few threads (12 to 24 elements each), several rows a block of 128 threads."""
    assert S.choose_plan(131072, 64, HOPPER) == S.SoftmaxPlan("registers", 32, 128)  # 4 threads a row
    assert S.choose_plan(65536, 256, HOPPER) == S.SoftmaxPlan("registers", 8, 128)
    assert S.choose_plan(4096, 7, HOPPER) == S.SoftmaxPlan("registers", 128, 128)  # a row a thread
    assert S.choose_plan(1, 1, AMPERE_86, "ampere").kind == "registers"
    assert "rows a block" in S.choose_plan(100000, 100, HOPPER).why


def test_a_thread_holds_twelve_to_twenty_four_elements_of_a_row():
    for N in (24, 64, 100, 1000, 3072, 5000, 8192):
        t = P.threads_per_row(N)
        assert 12 <= N / t < 24 and P.per_thread(N, t) <= 32, N
    assert P.threads_per_row(4096) == 256 and P.threads_per_row(3072) == 256 and P.threads_per_row(3071) == 64


def test_short_odd_rows_hold_more_and_cap_registers():
    """Single-element loads: 32 to 64 a thread; up to 2048 wide, registers capped for 8 blocks of 128 threads
    on an SM (the plan measured fastest at 4096x1823)."""
    assert S.choose_plan(4096, 1823, HOPPER) == S.SoftmaxPlan("registers", 4, 128, min_blocks_per_sm=8)
    assert S.choose_plan(1002, 1823, HOPPER) == S.SoftmaxPlan("registers", 4, 128, min_blocks_per_sm=8)  # any M
    plan = S.choose_plan(7, 8191, HOPPER)
    assert plan.min_blocks_per_sm == 0 and P.per_thread(8191, plan.threads) == 64
    source = tourkit.lower_for_arch(S.build(4096, 1823, S.choose_plan(4096, 1823, HOPPER)), "sm_90a").kernel_source
    assert "__launch_bounds__(128, 8)" in source


def test_narrow_odd_rows_take_up_to_a_warp_of_threads():
    """Single-element loads of a narrow row: at least ODD_NARROW_SHARE elements a thread, up to a warp of threads
    a row (with a few threads a row, a warp's loads spread over many rows); past a warp, 32 to 64 elements a
    thread as before; no register cap where 64 registers would not hold a thread's floats."""
    for N, threads in [(7, 1), (17, 2), (77, 8), (129, 16), (253, 16), (509, 32), (1021, 32), (2047, 32), (3001, 64)]:
        assert P.threads_per_row(N) == threads, N
        assert P.per_thread(N, threads) <= max(2 * P.ODD_NARROW_SHARE, 2 * P.ODD_MIN_SHARE * (threads >= P.WARP)), N
    assert S.choose_plan(4097, 253, HOPPER) == S.SoftmaxPlan("registers", 8, 128)  # no group of 8 rows divides M
    assert S.choose_plan(65536, 77, AMPERE_86, "ampere") == S.SoftmaxPlan("registers", 16, 128)
    assert S.choose_plan(16384, 2047, HOPPER) == S.SoftmaxPlan("registers", 4, 128)  # 64 floats: uncapped
    assert P.per_thread(1825, 32) == P.ODD_CAPPED_MAX_SHARE + 1 and S.choose_plan(8, 1825, HOPPER).min_blocks_per_sm == 0


@pytest.mark.parametrize("M, N, rows, threads", [(65536, 77, 32, 256), (65536, 65, 32, 256), (65536, 129, 16, 256),
                                                 (131072, 161, 16, 256), (65536, 253, 16, 256), (4112, 77, 16, 128),
                                                 (8, 99, 8, 64), (24, 255, 8, 128)])
def test_hopper_stages_narrow_odd_rows_in_aligned_groups(M, N, rows, threads):
    """Odd rows of 65 to 255 on Hopper (8 or 16 threads a row, fewer than a warp): a group of rows (a multiple
    of 8: 16-byte aligned; a divisor of M: every copy whole) is one bulk copy, 256 threads where M allows, the
    row's threads as in the register kernel."""
    plan = S.choose_plan(M, N, HOPPER)
    assert plan == S.SoftmaxPlan("staged", rows, threads) and "one bulk copy" in plan.why, plan
    assert plan.threads // plan.rows_per_block == P.threads_per_row(N) and plan_fits(M, N, plan, HOPPER)
    assert S.uses_bulk_copy(plan, N, "hopper") and M % rows == 0 and (rows * N) % 8 == 0


def test_narrow_odd_rows_outside_the_staged_rule_stay_in_registers():
    for M, N in [(4097, 77), (3, 77), (65540, 129), (65536, 63), (65536, 257), (32768, 509), (16384, 1021),
                 (16384, 2047), (65536, 130)]:
        assert S.choose_plan(M, N, HOPPER).kind == "registers", (M, N)
    assert S.choose_plan(65536, 77, tourkit.ARCH_SPECS["sm_89"].smem_per_block_optin, "ada").kind == "registers"
    assert "no group of 8 or more rows divides M = 4097" in S.choose_plan(4097, 77, HOPPER).why
    assert "not staged" not in S.choose_plan(65536, 257, HOPPER).why


def test_a_narrow_odd_staged_group_lowers_to_one_bulk_copy():
    plan = S.choose_plan(65536, 77, HOPPER)
    source = tourkit.lower_for_arch(S.build(65536, 77, plan), "sm_90a").kernel_source
    assert re.search(r"tma_load\(.*, %d\);" % (2 * 32 * 77), source)  # 32 rows of 77 halves in one copy
    assert "float x[10];" in source  # 8 threads a row, 10 floats each


def test_short_staged_rows_take_small_blocks_on_hopper():
    """Rows staged whole in at most two 8192-column steps: 256 threads of 32 elements a step on Hopper (more
    blocks an SM), 512 of 16 past that and off Hopper; the step stays 8192 columns either way."""
    for N in (8193, 9000, 10007, 13749, 16384, 16385):
        plan = S.choose_plan(4096, N, HOPPER)
        assert (plan.kind, plan.threads, plan.rows_per_block) == ("online", 256, 32), N
        assert plan.staged == P.aligned_body(N) and "fixed costs" in plan.why
    for N in (17653, 32000):
        assert (S.choose_plan(4096, N, HOPPER).threads, S.choose_plan(4096, N, HOPPER).rows_per_block) == (512, 16)
    assert S.choose_plan(4096, 13749, 163 * 1024, "ampere").threads == 512


def test_vector_width_follows_the_rows_alignment():
    assert [P.vector_width(n) for n in (64, 100, 50257, 6, 32000)] == [8, 4, 1, 2, 8]
    assert P.per_thread(5000, 512) == 16 and P.per_thread(7, 1) == 7


def test_long_rows_stream_what_shared_memory_cannot_hold():
    assert P.online_plan(65536, HOPPER).staged == 65536  # 128 KiB row fits 227 KiB: staged whole ...
    assert S.choose_plan(100, 65536, HOPPER).cluster == 2  # ... but alone on its SM: Hopper splits it in two
    plan = S.choose_plan(100, 65536, AMPERE_86, "ampere")  # 128 KiB row does not fit 99 KiB
    assert plan.kind == "online" and 0 < plan.staged < 65536
    vocab = P.online_plan(128256, HOPPER)  # Hopper splits such rows over a cluster (below); the others stream
    step = vocab.threads * vocab.rows_per_block
    assert vocab.kind == "online" and vocab.staged % step == 0 and "L2" in vocab.why
    assert 2 * vocab.staged + P.SMEM_SLACK <= HOPPER < 2 * (vocab.staged + step) + P.SMEM_SLACK  # as much as fits
    assert vocab.threads == 1024  # the head fills the SM alone: the block keeps twice the loads in flight
    odd = P.online_plan(50257, HOPPER)  # odd rows: their aligned bodies staged whole, by a bulk copy
    assert odd.staged == P.aligned_body(50257) == 50248 and odd.threads == 512
    assert S.uses_bulk_copy(odd, 50257, "hopper") and "unaligned" in odd.why
    assert S.uses_bulk_copy(vocab, 128256, "hopper") and not S.uses_bulk_copy(vocab, 128256, "ampere")
    assert S.choose_plan(8192, 32000, HOPPER).staged == 32000  # fits, but no chunk divides it
    assert S.choose_plan(8192, 32000, HOPPER).threads == 512  # rows that fit: blocks share an SM
    for N in (262144, 151936, 128256):  # heads that fill the SM: 1024 threads
        assert P.online_plan(N, HOPPER).threads == 1024 and 0 < P.online_plan(N, HOPPER).staged < N
    for N in (150001, 262147):  # unaligned rows too long to stage: streamed, except on Hopper (a cluster)
        assert S.choose_plan(5, N, AMPERE_86, "ampere").kind == "online"
        assert S.choose_plan(5, N, HOPPER).kind == "cluster" and "one at a time" in S.choose_plan(5, N, HOPPER).why


@pytest.mark.parametrize("N, cluster", [(128256, 4), (151936, 8), (262144, 8), (200000, 8), (256000, 8), (120000, 4),
                                        (50304, 2), (65536, 2), (50257, 2), (100003, 4), (262147, 8), (32776, 2)])
def test_hopper_splits_a_row_too_long_for_shared_memory_over_a_cluster(N, cluster):
    plan = S.choose_plan(7, N, HOPPER)
    part = -(-(N // 8) // cluster) * 8  # the row's whole 16-byte vectors shared out, rounded up
    assert (plan.kind, plan.cluster, plan.staged) == ("cluster", cluster, part) and "cluster" in plan.why
    step = plan.threads * plan.rows_per_block

    def fits(c):  # runs of whole 16-byte vectors (one TMA copy each), three blocks an SM
        run = -(-(N // 8) // c) * 8
        return N // 8 - 1 > (c - 1) * run // 8 and 3 * (2 * -(-run // step) * step + P.SMEM_SLACK) <= HOPPER

    assert fits(cluster) and not any(fits(c) for c in P.CLUSTER_SIZES if c < cluster)  # the fewest blocks
    assert P.staged_blocks_per_sm(P.online_plan(N, HOPPER).staged, HOPPER) < P.CLUSTER_MIN_BLOCKS
    assert S.choose_plan(7, N, AMPERE_86, "ampere").kind == "online"  # clusters: Hopper only
    assert S.uses_bulk_copy(plan, N, "hopper")


@pytest.mark.parametrize("M, N, family, kind", [(40000, 65537, "hopper", "cluster"), (20000, 131073, "hopper", "cluster"),
                                                (40000, 65537, "ampere", "online"), (70000, 40001, "ampere", "online")])
def test_long_row_kernels_offset_rows_in_64_bits_past_two_billion_elements(M, N, family, kind):
    # Regression: row · N was computed in 32 bits and cast afterwards; past 2^31 elements it wrapped (40000 rows
    # of 65537). The control: the same kernels below 2^31 elements keep 32-bit offsets.
    arch, smem = ("sm_90a", HOPPER) if family == "hopper" else ("sm_80", AMPERE_86)
    plan = S.choose_plan(M, N, smem, family)
    assert plan.kind == kind
    source = tourkit.lower_for_arch(S.build(M, N, plan, family), arch).kernel_source
    small = tourkit.lower_for_arch(S.build(1000, N, S.choose_plan(1000, N, smem, family), family), arch).kernel_source
    narrow = r"(?<!int64_t\)\()\(\(int\)blockIdx\.x\)( >> \d+\))?\)? \* %d\)" % N  # a 32-bit row · N
    assert not re.search(narrow, source) and "int64_t" in source
    assert re.search(narrow, small)


@pytest.mark.parametrize("M, N", [(1024, 128256), (3, 262144), (7, 50257)])
def test_the_cluster_kernel_exchanges_through_distributed_shared_memory(M, N):
    plan = S.choose_plan(M, N, HOPPER)
    with tourkit.capture_fd_output(2) as log:  # TileLang's passes warn on the C++ side's stderr
        report = tourkit.inspect_kernel(f"softmax {M}x{N}", S.build(M, N, plan, "hopper"), "sm_90a",
                                        nvcc=tourkit.find_nvcc() is not None)
    assert "ThreadSync" not in log.text, log.text  # no race to warn of, in the learner's output
    source = report.source
    assert report.grid[0] == M * plan.cluster and "cluster_sync" in source and "tma_load" in source
    # The pair's store into each block's shared memory, one after another by the first warp: between them a
    # one-warp barrier at most, never the whole block's
    assert source.count("map_shared_rank") == plan.cluster
    sends = source[source.index("map_shared_rank"):source.rindex("map_shared_rank")]
    assert "__syncthreads" not in sends and "for (" not in sends
    assert re.search(r"__shared__ __align__\(\d+\) float pairs\[%d\]" % (2 * plan.cluster), source)  # never aliased
    # One bulk copy of the part; an odd width's starts at the 128-byte line holding the part, 7 vectors early
    lead = P.line_lead(N, plan.staged)
    assert lead == (7 if N % 64 else 0)
    assert re.search(r"tma_load\(.*, %d\);" % (2 * (plan.staged + 8 * lead)), source)
    if tourkit.find_nvcc() is not None:  # CI has nvcc: the kernel must build, without spills
        assert report.nvcc == "compiled" and report.spills == "0", (report.nvcc, report.spills)


@pytest.mark.parametrize("N", [32000, 40000, 65536, 128256, 262144])
@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_90a"])
def test_a_staged_head_and_its_padding_fit_shared_memory(N, arch):
    """TileLang reads a masked 16-byte vector of shared memory before testing its mask, so the online
    kernel's head buffer is padded to whole steps: the padded buffer must fit too."""
    spec = tourkit.ARCH_SPECS[arch]
    plan = S.choose_plan(8, N, spec.smem_per_block_optin, spec.family)
    step = plan.threads * plan.rows_per_block
    if plan.kind == "online":
        assert 2 * (-(-plan.staged // step) * step) + P.SMEM_SLACK <= spec.smem_per_block_optin
    else:  # Hopper splits a row this long over a cluster: each block stages its part, padded to whole steps
        assert plan.kind == "cluster" and arch == "sm_90a" and N > 32000, (arch, N, plan)
        padded = -(-P.cluster_part(N, plan.cluster) // step) * step
        assert 2 * padded + P.SMEM_SLACK <= spec.smem_per_block_optin // P.CLUSTER_MIN_BLOCKS


def test_staged_head_buffer_is_padded_to_whole_steps():
    # Regression (an illegal address on the H200): a head of 112128 columns read in steps of 8192 read a vector
    # past its buffer. 32000 columns in steps of 8192: the buffer holds 32768 (65536 bytes); the copy moves 64000.
    source = tourkit.lower_for_arch(S.long_rows_online(8, 32000, 16, 512, staged=32000), "sm_90a").kernel_source
    assert "workspace = ((void*)((char*)buf_dyn_shmem + 65536))" in source
    assert "X_to_head_mbarrier[0], 64000)" in source


def test_non_hopper_uses_registers_for_short_rows():
    assert S.choose_plan(32768, 4096, AMPERE_86, "ampere").kind == "registers"


@pytest.mark.parametrize("shape", [(0, 128), (128, 0)])
def test_bad_shapes_raise_a_clear_error(shape):
    with pytest.raises(ValueError, match="softmax"):
        S.choose_plan(*shape, HOPPER)


def test_staged_kernel_rejects_unaligned_row_groups():
    with pytest.raises(ValueError, match="16-byte"):
        S.rows_staged_in_shared(1000, 1823, 4, 128)  # 4·1823 halves: not a multiple of 8
    with pytest.raises(ValueError, match="divide"):
        S.rows_staged_in_shared(4097, 77, 32, 256)  # a bulk copy of the last, partial block would run past X
    source = tourkit.lower_for_arch(S.rows_staged_in_shared(4097, 77, 32, 256, bulk_copy=False), "sm_90a").kernel_source
    assert "tma_load" not in source and source.count("< 4097)") == 2  # plain copies: the load and store masked


# ---------------------------------------------------------------------------------------------------------
# Lowering and nvcc (no GPU): each kernel variant once per arch
# ---------------------------------------------------------------------------------------------------------

VARIANTS = {  # kind: (M, N, plan); nvcc compiles the first three, the others are lowered (quicker)
    "registers": (16384, 8192, S.SoftmaxPlan("registers", 1, 512)),
    "online": (8192, 32768, S.SoftmaxPlan("online", 16, 512, staged=32768)),
    "streamed": (1000, 128256, S.SoftmaxPlan("online", 16, 512, staged=24576)),  # a head that fits sm_75
    "staged": (4096, 1999, S.SoftmaxPlan("staged", 8, 256)),
    "narrow": (1001, 64, S.SoftmaxPlan("registers", 64, 256)),  # a partial last block of rows
    "odd narrow": (4097, 7, S.SoftmaxPlan("registers", 256, 256)),
    "odd streamed": (3, 50257, S.SoftmaxPlan("online", 16, 1024)),  # 3·50257 elements: no whole last vector
    "odd staged": (3, 20001, S.SoftmaxPlan("online", 16, 512, staged=19992)),  # the aligned body, TMA on Hopper
}
NVCC = ("registers", "online", "streamed")


@pytest.fixture(scope="module", params=["sm_75", "sm_80", "sm_90a"])
def reports(request):
    arch = request.param
    family = tourkit.ARCH_SPECS[arch].family
    out = {}
    for kind, (M, N, plan) in VARIANTS.items():
        if kind == "online" and arch == "sm_75":
            continue  # a 64 KiB row does not fit Turing's 64 KiB
        dtype = "bfloat16" if kind in ("streamed", "narrow") and arch != "sm_75" else "float16"
        out[kind] = tourkit.inspect_kernel(f"softmax {kind}", S.build(M, N, plan, family, dtype), arch,
                                           nvcc=kind in NVCC and arch != "sm_75")  # Turing: lowered (quicker)
    return arch, out


def test_kernels_compile_with_nvcc(reports):
    arch, reps = reports
    for kind, rep in reps.items():
        if tourkit.find_nvcc() is not None and kind in NVCC and arch != "sm_75":
            assert rep.nvcc == "compiled", (arch, kind, rep.nvcc)
        assert rep.smem_bytes <= tourkit.ARCH_SPECS[arch].smem_per_block_optin


def test_reductions_are_in_registers_and_exponentials_use_exp2(reports):
    _, reps = reports
    for kind, rep in reps.items():
        if kind != "odd narrow":  # a row a thread: its max is a loop in registers, nothing to exchange
            assert "AllReduce" in rep.source  # T.reduce_* over fragments: shuffles + a small exchange
        assert "exp2f" in rep.source or "ex2" in rep.source


def test_bfloat16_flows_into_the_kernels(reports):
    """bfloat16 where the fixture asks for it (sm_80 and newer); sm_75, which has no bfloat16, builds float16."""
    arch, reps = reports
    if arch != "sm_75":
        assert "bfloat16_t* __restrict__ X" in reps["streamed"].source
        assert "half_t" not in reps["narrow"].source
    else:
        assert "half_t* __restrict__ X" in reps["streamed"].source and "bfloat16_t" not in reps["narrow"].source


def test_hopper_stages_rows_with_bulk_copies(reports):
    arch, reps = reports
    if arch == "sm_90a":
        for kind in ("staged", "online", "streamed"):  # "streamed": the online kernel with part of the row staged
            tourkit.require_markers(reps[kind], ["tma_load", "mbarrier"])
    else:
        assert reps["staged"].markers["tma_load"] == 0 and reps["streamed"].markers["tma_load"] == 0


def test_odd_width_fragment_is_padded_not_whole_row_per_thread(reports):
    # 8 rows of 1999 over 256 threads: 32 threads per row, 63 floats each (not 1999 per thread).
    _, reps = reports
    assert "float x[63];" in reps["staged"].source


def test_narrow_rows_load_whole_vectors_and_mask_the_last_block(reports):
    _, reps = reports
    narrow = reps["narrow"].source  # 1001 rows of 64: 16 rows a block of 256 threads... 64 here; 4 threads a row
    assert "uint4" in narrow and "< 1001" in narrow
    assert "AllReduce<tl::MaxOp, 4," in narrow  # the row's 4 threads exchange, not the block
    streamed = reps["odd streamed"].source  # odd width: the body in 16-byte vectors, the edges one by one
    assert streamed.count("AllReduce<") == 2  # two block exchanges per row, not per step


def test_unaligned_rows_move_whole_16_byte_vectors_and_stay_in_their_buffers(reports):
    """3 rows of 50257 (150771 elements, not whole vectors): every 16-byte access of X and Y is clamped to the
    tensor's last whole vector (18845), TileLang's hoisted reads included; the edges are single, guarded."""
    arch, reps = reports
    for kind, (M, N, _) in (("odd streamed", VARIANTS["odd streamed"]), ("odd staged", VARIANTS["odd staged"])):
        source = reps[kind].source
        vector_lines = [line for line in source.splitlines() if re.search(r"\*\(uint4\*\)\((X|Y) \+", line)]
        assert any(line.lstrip().startswith("*(uint4*)(Y +") for line in vector_lines), (arch, kind)  # pass 2's write
        if kind == "odd streamed":  # a read TileLang makes before testing the mask is clamped; the others guarded
            lines = source.splitlines()
            reads = [k for k, line in enumerate(lines) if "= *(uint4*)(X +" in line]
            clamped = [k for k in reads if f", {M * N // 8 - 1}) * 8)" in lines[k]]
            assert clamped and all(k in clamped or lines[k - 1].lstrip().startswith("if (") for k in reads), arch
        assert "vec_copy_s" not in source  # no element-by-element fallback
        assert re.search(rf"< {M * N}\)", source)  # the edges' single reads, bounded by the tensor
    if arch == "sm_90a":
        tourkit.require_markers(reps["odd staged"], ["tma_load", "mbarrier"])  # the body is 16-byte aligned


@pytest.mark.parametrize("M, N", [(3, 50257), (2048, 50257), (7, 8193), (5, 100003), (1000, 50265), (4, 8194),
                                  (9, 8196), (13, 8199)])
def test_a_rows_body_and_edges_cover_it_exactly(M, N):
    """The online kernel's indices of an unaligned row (softmax_plans.body_start, edge_index, edge_in_row,
    body_index: the expressions long_rows_online applies to its loop variables), evaluated on integers: each
    row's body and the edges that are its own cover the row exactly once, and no clamped 16-byte vector of the
    body reaches past the tensor."""
    import tvm

    value = tvm.arith.Analyzer().simplify
    body = P.aligned_body(N)
    for row in sorted({0, 1, 2, M // 2, M - 2, M - 1} & set(range(M))):
        first = P.body_start(row, N)
        edges = [int(value(P.edge_index(i, first, N))) for i in range(24) if bool(value(P.edge_in_row(i, row, first, N)))]
        columns = [int(value(P.body_index(first, col, M, N))) for col in range(body)]
        assert sorted(columns + edges) == list(range(row * N, row * N + N)), (M, N, row)
        # the masked reads past the body (the walk's last step) stay inside the tensor too
        past = [int(value(P.body_index(first, col, M, N))) for col in range(body, body + 64)]
        assert first % 8 == 0 and max(c // 8 * 8 + 8 for c in columns + past) <= M * N


def test_turing_plans_fit_its_64_kib_and_hopper_plans_stay():
    """sm_75 holds 64 KiB per block: the 32768-wide row (64 KiB) cannot be staged whole, so what does not fit
    is streamed; on sm_90a the row is staged whole."""
    turing = tourkit.ARCH_SPECS["sm_75"].smem_per_block_optin
    plan = S.choose_plan(8192, 32768, turing, "turing")
    assert plan.kind == "online" and 0 < plan.staged < 32768 and 2 * plan.staged + P.SMEM_SLACK <= turing
    assert S.choose_plan(8192, 32768, HOPPER, "hopper") == S.SoftmaxPlan("online", 16, 512, staged=32768)
    assert S.choose_plan(16384, 16384, turing, "turing").staged == 16384  # 32 KiB rows still fit
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
@pytest.mark.parametrize("shape, dtype", [
    ((256, 4096), "float16"), ((16, 32768), "float16"), ((1001, 1823), "float16"), ((37, 4096), "float16"),
    ((999, 3000), "float16"), ((64, 2047), "float16"), ((1, 1), "float16"), ((5, 9), "float16"),
    ((4097, 7), "float16"), ((1001, 64), "float16"), ((999, 100), "float16"), ((7, 8193), "float16"),
    ((3, 100000), "float16"), ((2, 50257), "float16"), ((1, 262144), "float16"), ((33, 1000), "bfloat16"),
    ((5, 128256), "bfloat16"), ((3, 2), "bfloat16"), ((2, 65536), "bfloat16"),
    ((2048, 50257), "float16"), ((3, 50257), "bfloat16"), ((1, 50257), "float16"), ((5, 100003), "float16"),
    ((1000, 50265), "bfloat16"), ((9, 8193), "float16"), ((3, 262147), "float16"), ((1024, 128256), "float16"),
    ((2, 151936), "bfloat16"), ((5, 200000), "float16"), ((1, 262144), "bfloat16"), ((65, 13749), "bfloat16"),
    ((4097, 10007), "float16"), ((300, 16384), "float16"), ((4096, 77), "float16"), ((4112, 129), "bfloat16"),
    ((8, 255), "float16"), ((4097, 77), "float16")],
    ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else v)  # -k 50257 selects by width
def test_softmax_matches_torch(shape, dtype):
    device = tourkit.detect_device()
    if dtype == "bfloat16" and device.capability < (8, 0):
        pytest.skip("bfloat16 needs sm_80")
    M, N = shape
    plan = S.choose_plan(M, N, device.smem_per_block_optin, device.family)
    check = S.check_shape(M, N, plan, family=device.family, dtype=dtype)
    assert check.passed, check.line()


@pytest.mark.gpu
@pytest.mark.parametrize("plan, shape", [
    (S.SoftmaxPlan("registers", 1, 256), (1001, 1823)), (S.SoftmaxPlan("registers", 4, 128), (1000, 1823)),
    (S.SoftmaxPlan("registers", 1, 256), (999, 3000)), (S.SoftmaxPlan("registers", 1, 512), (999, 4000)),
    (S.SoftmaxPlan("staged", 8, 256), (1000, 1823)), (S.SoftmaxPlan("registers", 1, 1024), (37, 32768)),
    (S.SoftmaxPlan("online", 8, 512, staged=32768), (37, 32768)), (S.SoftmaxPlan("registers", 128, 256), (1001, 32)),
    (S.SoftmaxPlan("online", 16, 512), (5, 40000)), (S.SoftmaxPlan("online", 16, 1024, staged=8192), (5, 40000)),
    (S.SoftmaxPlan("online", 32, 256, staged=40000), (5, 40000)), (S.SoftmaxPlan("online", 8, 512), (3, 9001)),
    (S.SoftmaxPlan("online", 16, 512, staged=8992), (3, 9001)), (S.SoftmaxPlan("online", 16, 512, staged=8192), (3, 9001)),
    (S.SoftmaxPlan("online", 16, 1024), (3, 50257)), (S.SoftmaxPlan("online", 16, 1024, staged=16384), (5, 100003)),
    (S.SoftmaxPlan("online", 16, 512, staged=50256), (9, 50266)), (S.SoftmaxPlan("online", 8, 1024), (17, 8194)),
    (S.SoftmaxPlan("cluster", 16, 512, staged=32064, cluster=4), (1024, 128256)),
    (S.SoftmaxPlan("cluster", 16, 512, staged=8000, cluster=8), (3, 64000)),
    (S.SoftmaxPlan("cluster", 8, 256, staged=4096, cluster=2), (5, 8192)),
    (S.SoftmaxPlan("cluster", 16, 512, staged=25128, cluster=2), (7, 50257)),  # odd widths: edges taken singly
    (S.SoftmaxPlan("cluster", 16, 512, staged=25000, cluster=4), (5, 100003)),
    (S.SoftmaxPlan("cluster", 16, 512, staged=6288, cluster=8), (9, 50306)),  # the last block's run shorter
    (S.SoftmaxPlan("cluster", 8, 256, staged=4104, cluster=2), (3, 8210))],
    ids=lambda v: f"{v[0]}x{v[1]}" if isinstance(v, tuple) else f"{v.kind}{v.cluster if v.cluster > 1 else ''}")
def test_each_kernel_variant_matches_torch(plan, shape):
    device = tourkit.detect_device()
    if plan.kind == "cluster" and device.family != "hopper":
        pytest.skip("thread-block clusters need sm_90")
    check = S.check_shape(*shape, plan, family=device.family)
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

    def fake_bench_table(cases, dtype="float16"):
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
    monkeypatch.setattr(S, "check_shape", lambda M, N, plan, softmax=None, family="hopper", dtype="float16":
                        tourkit.Check(f"softmax {M}x{N}", 1e-4, 5e-3))
    monkeypatch.setattr(tourkit, "device_copy_gbps", lambda: 4200.0)
    ctx = tourkit.TourContext(device=device, echo=False)
    S.run(ctx)
    assert timed_calls == [["32768x4096", "4096x1823"]]  # one call for the whole table
    assert ctx.headlines["worst_of_same_size_copy"] == round(2200 / 2400, 3)
    assert ctx.headlines["worst_of_1gib_copy"] == round(2200 / 4200, 3)
    timings = {(t["problem"], t["kind"]): t for t in ctx.metrics["timings"]}  # what the plots draw
    assert round(tourkit.gbps(timings[("4096x1823", "copy")]["nbytes"], timings[("4096x1823", "copy")]["ms"])) == 2400
    assert sorted(timings) == [(shape, kind) for shape in ("32768x4096", "4096x1823")
                               for kind in ("copy", "lesson", "pytorch")]
    assert timings[("4096x1823", "lesson")]["flops"] == 5 * 4096 * 1823
    row = next(line for line in ctx.report if line.startswith("4096x1823"))
    assert "52%" in row and "92%" in row and "2.00x" in row  # of the 1 GiB copy, of the same-size copy, vs torch
    assert " 13.6 " in row  # µs: 29.9 MB at 2200 GB/s


def test_a_wrong_kernel_fails_before_any_timing(monkeypatch):
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    monkeypatch.setattr(tourkit, "build_declared", lambda decls, log=None: {d.name: None for d in decls})
    monkeypatch.setattr(S, "launcher", lambda kernel, plan: None)
    monkeypatch.setattr(S, "check_shape", lambda M, N, plan, softmax=None, family="hopper", dtype="float16":
                        tourkit.Check(f"softmax {M}x{N}", 1.0 if N == 1823 else 1e-4, 5e-3))
    monkeypatch.setattr(S, "bench_table", lambda cases, dtype="float16": pytest.fail("timed a wrong kernel"))
    with pytest.raises(tourkit.ValidationError, match="1823"):
        S.run(tourkit.TourContext(device=device, echo=False))


# ---------------------------------------------------------------------------------------------------------
# A user's problem (--shape, --dtype)
# ---------------------------------------------------------------------------------------------------------


def test_a_users_problem_compiles_alone_with_its_dtype():
    ctx = tourkit.TourContext(compile_only=True, arch="sm_80", shape=(1024, 128256), dtype="bfloat16", echo=False)
    decls = S.kernels(ctx)
    assert [d.name for d in decls] == ["softmax 1024x128256 bfloat16 online"]
    S.run(ctx)
    assert ctx.headlines["kernels"] == 1
    assert any(line.strip().startswith("why: a row of 128256") for line in ctx.report)


def test_a_users_problem_is_checked_and_timed_with_its_dtype(monkeypatch):
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    seen = {}

    class FakeKernel:
        def __call__(self, *args):
            pass

        def get_kernel_source(self):
            return "AllReduce<tl::MaxOp"

    def fake_check(M, N, plan, softmax=None, family="hopper", dtype="float16"):
        seen.setdefault("checked", []).append((M, N, dtype))
        return tourkit.Check(f"softmax {M}x{N}", 1e-3, S.TOLERANCE[dtype])

    def fake_bench(cases, dtype="float16"):
        seen["timed"] = (sorted(cases), dtype)
        return {label: (0.010, 0.020, 0.009) for label in cases}

    monkeypatch.setattr(tourkit, "build_declared", lambda decls, log=None: {d.name: FakeKernel() for d in decls})
    monkeypatch.setattr(S, "check_shape", fake_check)
    monkeypatch.setattr(S, "bench_table", fake_bench)
    monkeypatch.setattr(tourkit, "device_copy_gbps", lambda: 4200.0)
    ctx = tourkit.TourContext(device=device, shape=(4097, 5000), dtype="bfloat16", echo=False)
    S.run(ctx)
    assert seen == {"checked": [(4097, 5000, "bfloat16")], "timed": (["4097x5000"], "bfloat16")}
    assert ctx.report[0].startswith("softmax 4097x5000 bfloat16: registers") and "why:" in ctx.report[1]
    assert ctx.headlines["worst_of_same_size_copy"] == 0.9


def test_a_problem_too_big_for_the_gpu_is_skipped():
    device = tourkit.DeviceInfo("small GPU", (8, 0), "sm_80", 108, 16 * 2**30, 166912, 40 * 2**20)
    ctx = tourkit.TourContext(device=device, shape=(131072, 262144), echo=False)
    with pytest.raises(tourkit.SectionSkip, match="GPU memory"):
        S.run(ctx)
