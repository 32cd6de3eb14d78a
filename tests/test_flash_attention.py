"""flash_attention: config choice (CPU), kernels lower and nvcc-compile for sm_80 and sm_90a with the expected
instructions (CPU), correctness against SDPA incl. causal and odd lengths (GPU)."""

import pytest

import tourkit
from sections import flash_attention as FA

HOPPER = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin


# ---------------------------------------------------------------------------------------------------------
# Configuration choice (no compiler)
# ---------------------------------------------------------------------------------------------------------


def test_hopper_configs_per_mode_and_head_dim():
    full = FA.choose_config(128, False, "hopper", HOPPER, sm_count=114)
    causal = FA.choose_config(128, True, "hopper", HOPPER, sm_count=114)
    assert full["kind"] == causal["kind"] == "ws" and full["fast_math"] and causal["heavy_first"]
    # persistent: one block per SM of *this* GPU
    assert full["persistent"] and causal["persistent"] and full["sms"] == causal["sms"] == 114
    assert full["block_N"] == causal["block_N"] == 160 and full["q_stages"] == 2
    assert FA.choose_config(64, False, "hopper", HOPPER)["kind"] == "pipelined"
    assert FA.choose_config(64, True, "hopper", HOPPER)["kind"] == "async"


def test_two_q_buffers_fit_only_with_160_wide_key_tiles():
    cfg = FA.HOPPER_CONFIGS[(False, 128)]
    assert cfg["q_stages"] == 2 and FA.config_smem(128, cfg) <= HOPPER
    assert FA.config_smem(128, dict(cfg, block_N=176)) > HOPPER
    # the async kernel's 176-wide tiles fit only because its output reuses the K/V buffers
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


# ---------------------------------------------------------------------------------------------------------
# Lowering and nvcc (no GPU): a ragged length (1000) so the masking paths are compiled too
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sm_80", "sm_90a"])
def reports(request):
    arch = request.param
    spec = tourkit.ARCH_SPECS[arch]
    out = {}
    for causal in (False, True):
        cfg = FA.choose_config(128, causal, spec.family, spec.smem_per_block_optin)
        out[causal] = tourkit.inspect_kernel(f"attention causal={causal}", FA.build(2, 4, 1000, 128, causal, cfg), arch)
    return arch, out


def test_hopper_kernels_use_no_more_shared_memory_than_estimated(reports):
    arch, reps = reports
    if arch != "sm_90a":
        pytest.skip("the estimate is exact for the Hopper kernels; elsewhere it is an upper bound")
    for causal, rep in reps.items():
        estimate = FA.config_smem(128, FA.choose_config(128, causal, "hopper", HOPPER))
        assert estimate <= rep.smem_bytes <= estimate + 1024, (causal, rep.smem_bytes, estimate)  # + barriers


def test_expected_instructions(reports):
    arch, reps = reports
    expected = ["wgmma", "tma_load", "mbarrier"] if arch == "sm_90a" else ["mma_sync", "ldmatrix", "cp_async"]
    for rep in reps.values():
        tourkit.require_markers(rep, expected)  # also fails when nvcc failed


def test_exponentials_use_exp2_and_scores_stay_on_chip(reports):
    _, reps = reports
    for rep in reps.values():
        assert "exp2f" in rep.source
        assert rep.smem_bytes < 232448


def test_causal_loop_bound_is_clamped(reports):
    # The causal kernel's key loop runs to min(n_tiles, ceil((bx+1)·bM / bN)), bx being the block's query tile
    # (blockIdx.x, or on a persistent grid the tile this step of the block's walk picks); full attention's
    # key loops have fixed bounds.
    arch, reps = reports
    import re

    def key_loop_bounds(source):
        return re.findall(r"for \(int k\w* = [01]; k\w* < ([^;]+);", source)

    causal = key_loop_bounds(reps[True].source)
    assert any(re.search(r"blockIdx\.x|condval", bound) for bound in causal), causal
    assert all(bound.strip().isdigit() for bound in key_loop_bounds(reps[False].source))


def test_pingpong_barriers_sit_in_the_consumer_warp_groups():
    """The ping-pong schedule only works if the turn-taking barriers run in the two consumer warp groups (1 and
    2) and never in TileLang's producer (warp group 0, threads 0-127): a bare barrier would be moved there."""
    cfg = dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True, pingpong=True)
    source = tourkit.inspect_kernel("pingpong", FA.build(2, 4, 1000, 128, False, cfg), "sm_90a", nvcc=False).source
    producer, consumer = source.split("warpgroup_reg_alloc<")  # the consumers' branch raises its registers
    assert "if (((int)threadIdx.x) < 128)" in producer and "warpgroup_reg_dealloc" in producer
    first, second = FA.PINGPONG_BARRIER + 1, FA.PINGPONG_BARRIER + 2
    assert f"__named_barrier_arrive({first}, 256)" in producer.split("threadIdx.x) < 128")[0]  # group 2 lets 1 go
    assert "__sync_thread_partial((warp_group" not in producer
    assert f"__sync_thread_partial((warp_group[0] + {FA.PINGPONG_BARRIER}), 256)" in consumer
    assert f"__named_barrier_arrive(({first + second - FA.PINGPONG_BARRIER} - warp_group[0]), 256)" in consumer
    issue = consumer.index("__sync_thread_partial((warp_group")
    assert issue < consumer.index("wgmma_ss") < consumer.index("__named_barrier_arrive") < consumer.index(
        "wait_wgmma<1>")  # take the turn, issue both MMAs, hand the turn over, then wait


def test_pingpong_needs_two_consumer_warp_groups():
    with pytest.raises(ValueError, match="two consumer warp groups"):
        FA.flash_attention_forward_async(1, 2, 256, 128, False, threads=384, pingpong=True)


@pytest.mark.parametrize("persistent", [False, True])
def test_hand_written_warp_specialization(persistent):
    """flash_attention_forward_ws: one producer warp feeds a ring of mbarrier-guarded K/V buffers, the consumers
    peel the FA3 schedule, and nothing in it waits for the whole block (a __syncthreads in a role's branch
    would hang: the producer warps never reach it)."""
    func = FA.flash_attention_forward_ws(2, 4, 1000, 128, True, block_N=128, heavy_first=True, persistent=persistent,
                                         sms=3)
    rep = tourkit.inspect_kernel("ws", func, "sm_90a")
    tourkit.require_markers(rep, ["wgmma", "tma_load", "mbarrier"])
    source = rep.source
    assert source.count("__syncthreads()") == 1  # after the barriers' initialization only
    producer, consumer = source.split("warpgroup_reg_alloc<240>")
    assert "warpgroup_reg_dealloc<24>" in producer and "tma_load(" in producer and "wgmma_" not in producer
    assert "tma_load(" not in consumer
    # The peeled schedule: Q·K(0)ᵀ alone (waited at once), a loop with both MMAs and wait<1>, the last P·V alone.
    assert consumer.count("wgmma_ss<") == 2 and consumer.count("wgmma_rs<") == 2
    assert consumer.index("wait_wgmma<0>") < consumer.index("wait_wgmma<1>") < consumer.rindex("wgmma_rs<")
    # Every buffer is released: K after its Q·Kᵀ, V after its P·V, Q after the tile's last Q·Kᵀ.
    for barrier in ("k_empty", "v_empty", "q_empty"):
        assert f"{barrier}[" in consumer and ".arrive()" in consumer.split(f"{barrier}[", 1)[1][:40]
    assert rep.threads == 384
    import re

    work_loops = re.findall(r"for \(int step\w* = 0; step\w* < ([^;]+);", source)
    if persistent:  # three blocks walk 2 * 4 * 8 = 64 tiles, each role with its own loop over its block's share
        assert len(work_loops) == 2 and all("blockIdx.x" in bound for bound in work_loops), work_loops
    else:  # one tile per block: the work loop is gone
        assert not work_loops


def test_section_runs_in_compile_only_mode():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "flash_attention", "--compile-only", "--arch", "sm_80"])
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
    cfg = FA.choose_config(shape[3], causal, device.family, device.smem_per_block_optin, device.sm_count)
    attention = FA.compile_attention(*shape, causal, cfg)
    check = FA.check_attention(*shape, causal, attention)
    assert check.passed, check.line()


HOPPER_SCHEDULES = [
    dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True, heavy_first=True),
    dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True, pingpong=True),
    dict(kind="ws", block_M=128, block_N=176, num_stages=2, threads=384, heavy_first=True, stage_output=True),
    dict(kind="ws", block_M=128, block_N=192, num_stages=2, threads=384),
    # three blocks walk every tile: the barriers' phases must carry over from tile to tile
    dict(kind="ws", block_M=128, block_N=160, num_stages=2, threads=384, persistent=True, sms=3, q_stages=2,
         stage_output=True),
    dict(kind="ws", block_M=128, block_N=128, num_stages=2, threads=384, persistent=True, sms=5),
]


SCHEDULE_SHAPES = ((1, 3, 777, 128), (2, 4, 1000, 64))


@pytest.fixture(scope="module")
def hopper_schedules_compiled():
    """Compile every kernel of the test below at once, on all cores (each test then loads it from the cache)."""
    device = tourkit.detect_device()
    if device is None or device.family != "hopper":
        return
    tourkit.compile_many([(FA.build(*shape, causal, cfg), FA.pass_configs(cfg)) for cfg in HOPPER_SCHEDULES
                          for causal in (False, True) for shape in SCHEDULE_SHAPES])


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", HOPPER_SCHEDULES, ids=lambda cfg: FA.describe(cfg))
def test_every_hopper_schedule_matches_sdpa(causal, cfg, hopper_schedules_compiled):
    device = tourkit.detect_device()
    if device.family != "hopper":
        pytest.skip("wgmma, TMA and setmaxnreg are Hopper-only")
    for shape in SCHEDULE_SHAPES:
        attention = FA.compile_attention(*shape, causal, cfg)
        check = FA.check_attention(*shape, causal, attention)
        assert check.passed, check.line()


@pytest.mark.gpu
def test_wrong_shape_is_rejected():
    import torch

    device = tourkit.detect_device()
    cfg = FA.choose_config(64, False, device.family, device.smem_per_block_optin)
    attention = FA.compile_attention(1, 2, 128, 64, False, cfg)
    q = torch.zeros(1, 2, 128, 64, dtype=torch.float16, device="cuda")  # BHSD instead of BSHD
    with pytest.raises(ValueError, match="expected fp16"):
        attention(q, q, q)
