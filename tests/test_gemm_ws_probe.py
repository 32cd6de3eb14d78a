"""bench/gemm_ws_probe.py: the hand-written warp-specialized Hopper GEMM lowers for sm_90a with the pipeline
it was written for, and the stream-K variant's schedule covers every (tile, k-step) once with a fixup that
cannot wait in a cycle (CPU only; the GPU run is the probe itself)."""

import dataclasses
import functools
import os
import re
import sys

import pytest

import tourkit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import gemm_ws_probe as probe  # noqa: E402


@functools.lru_cache(maxsize=None)
def lower(name, shape):
    """The variant lowered for sm_90a, once per test session (a few seconds each)."""
    return tourkit.inspect_kernel(name, probe.program_for(name, *shape), "sm_90a", nvcc=False)


@pytest.fixture(scope="module", params=[(name, shape) for name in probe.ALL_VARIANTS
                                        for shape in [(8192, 8192, 8192), (1001, 1032, 1000)]],
                ids=lambda p: f"{p[0]}-{'x'.join(map(str, p[1]))}")
def lowered(request):
    name, shape = request.param
    return name, shape, lower(name, shape)


def test_markers_launch_shape_and_shared_memory(lowered):
    name, (M, N, K), report = lowered
    assert probe.missing_markers(report.source) == []
    assert report.threads == 384  # two consumer warpgroups and the producer warpgroup
    if name.startswith("ws_multicast"):  # clusters of two blocks on vertically adjacent tiles
        pairs = -(-M // 256) * -(-N // 256)
        blocks = probe.EXPERIMENTS[name][1].get("num_sms", probe.H200_SMS)
        assert report.grid == (2, blocks // 2 if probe.is_persistent(name) else pairs, 1)
    elif probe.is_persistent(name):
        assert report.grid == (probe.H200_SMS, 1, 1)
    else:
        assert report.grid == (-(-N // 256), -(-M // 128), 1)
    assert report.smem_bytes <= probe.SMEM_LIMIT


def test_consumers_release_the_previous_stage_only_after_wait_1(lowered):
    _, _, report = lowered
    loop = probe.consumer_main_loop(report.source)
    assert probe.main_loop_syncs(report.source) == 0  # no block-wide barrier between K steps
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    release = loop.index("empty[", wait_one)
    assert issue < wait_one < release
    assert re.search(r"if \(0 < k\w*\) \{\s*empty\[", loop[wait_one:])  # nothing to release at step 0
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")  # the drain, then the last stage's release


def test_producer_waits_for_free_stages_with_the_flipped_parity(lowered):
    _, _, report = lowered
    assert re.search(r"empty\[[^\]]*\]\.wait\(.*\^ 1\)\);", report.source)
    assert re.search(r"full\[[^\]]*\]\.expect_transaction\(", report.source)
    assert re.search(r"warpgroup_reg_dealloc<(24|40)>", report.source)
    assert re.search(r"warpgroup_reg_alloc<(240|232)>", report.source)


def test_register_split_fits_the_register_file():
    for consumers in (1, 2, 3):
        for persistent in (False, True):
            producer, consumer = probe.register_split(consumers, persistent)
            assert 128 * producer + 128 * consumers * consumer <= 65536
            assert consumer % 8 == 0 and consumer <= 240
    assert probe.register_split(2, False) == (24, 240)
    assert probe.register_split(2, True) == (40, 232)


def test_bad_arguments_are_rejected():
    ws = probe.VARIANTS["ws"]
    with pytest.raises(ValueError, match="64 x"):
        probe.gemm_program(1024, 1024, 1024, dataclasses.replace(ws, block_M=256))
    with pytest.raises(ValueError, match="multiples of 8"):
        probe.gemm_program(1024, 1001, 1024, ws)
    assert probe.parse_shape("8192x28672x4096") == (8192, 28672, 4096)


def test_shapes_and_flags():
    args = probe.parse_args(["--quick"])
    assert args.shapes == [(8192, 8192, 8192)] and args.variants == probe.ALL_VARIANTS
    args = probe.parse_args(["--shapes", "4096x4096x4096,1024x8192x8192", "--variants", "ws"])
    assert args.shapes == [(4096, 4096, 4096), (1024, 8192, 8192)] and args.variants == ["ws"]


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
def test_ptxas_neither_spills_nor_serializes_wgmma():
    for report in probe.inspect_variants(probe.ALL_VARIANTS):
        assert "error" not in report, report.get("error")
        assert probe.spilled_bytes(report) == 0, report["variant"]
        assert not any("C7514" in w or "serialized" in w for w in report["warnings"]), report["warnings"]


@pytest.mark.parametrize("name", ["ws_multicast", "ws_multicast_persistent"])
def test_multicast_shares_b_and_releases_stages_in_both_blocks(name):
    """Rank 0 multicasts the B tile into both blocks; each block loads its own A; every consumer thread
    arrives on the stage's `empty` barrier of both blocks, which wait for 2 x 256 arrivals; the blocks meet
    at a cluster barrier before leaving."""
    report = tourkit.inspect_kernel(name, probe.program_for(name, 1001, 1032, 1000), "sm_90a", nvcc=False)
    source = report.source
    assert "tma_load_multicast(B_desc" in source and "tma_load(A_desc" in source
    assert "tma_load_multicast(A_desc" not in source
    assert re.search(r"empty\[0\]\.init\(512\)", source) and re.search(r"full\[0\]\.init\(128\)", source)
    loop = probe.consumer_main_loop(source)
    assert re.search(r"empty\[[^\]]*\]\.arrive\(0u\);\s*empty\[[^\]]*\]\.arrive\(1u\);", loop)
    tail = source[source.rindex("tma_store_wait"):]
    assert "cluster_sync()" in tail


# ---------------------------------------------------------------------------------------------------------
# Stream-K: the schedule in pure Python (the kernel's own formulas), then what the generated code does with it
# ---------------------------------------------------------------------------------------------------------

STREAMK = [name for name, (builder, _) in probe.EXPERIMENTS.items() if builder == "gemm_ws_streamk_program"]
STREAMK_SHAPES = probe.SHAPES + probe.ODD_SHAPES


def check_streamk_schedule(shape, num_sms, sk_waves):
    """Every (tile, k-step) computed exactly once; every split tile finished by the block holding its head, which
    waits for exactly the blocks that contribute to it, all later than itself; a block contributes at most once,
    in its first stream-K segment, and finishes at most once, in its last; its segments' ring steps follow on
    one another; the work is balanced to one k-step."""
    plan = probe.streamk_plan(*shape, 128, 256, 64, num_sms, sk_waves)
    blocks = probe.streamk_segments(*shape, 128, 256, 64, num_sms, sk_waves)
    k_steps = plan.k_steps
    pieces: dict[int, list] = {}
    for g, work in enumerate(blocks):
        for position, (tile, kb, ke, role) in enumerate(work):
            assert 0 <= kb < ke <= k_steps
            pieces.setdefault(tile, []).append((kb, ke, g, role))
        roles = [role for _, _, _, role in work]
        dp = plan.dp_count(g)
        assert all(role == "whole" for role in roles[:dp])
        assert roles.count("contribute") <= 1 and roles.count("finish") <= 1
        if "contribute" in roles:
            assert roles.index("contribute") == dp  # its first stream-K segment: before any wait of its own
        if "finish" in roles:
            assert roles.index("finish") == len(roles) - 1  # its last: after its own contribution
        # the ring's steps run on without a gap: stage s's n-th use must be step s + n * num_stages
        steps = 0
        for i in range(len(work) - dp):
            _, kb, ke, offset = plan.segment(g, i)
            assert offset == steps
            steps += ke - kb
        assert steps == plan.begin(g + 1) - plan.begin(g)
    assert sorted(pieces) == list(range(plan.tiles))
    for tile, parts in pieces.items():
        parts.sort()
        assert parts[0][0] == 0 and parts[-1][1] == k_steps
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous: each k-step exactly once
        if len(parts) == 1:
            assert parts[0][3] == "whole"
            continue
        assert tile >= plan.dp_tiles  # only stream-K tiles are split
        (_, _, head, role), rest = parts[0], parts[1:]
        assert role == "finish" and all(r == "contribute" for *_, r in rest)
        contributors = [g for _, _, g, _ in rest]
        assert plan.waits_for(head, tile - plan.dp_tiles) == contributors
        assert all(d > head for d in contributors)  # waits only for later blocks: no cycle
    iterations = [sum(ke - kb for _, kb, ke, _ in work) for work in blocks]
    if plan.dp_tiles < plan.tiles:  # stream-K: no partial wave left
        assert max(iterations) - min(iterations) <= 1
    return plan, pieces


@pytest.mark.parametrize("shape", STREAMK_SHAPES, ids=probe.shape_text)
@pytest.mark.parametrize("num_sms, sk_waves", [(132, 2), (132, 1), (3, 2), (5, 2), (7, 2), (5, 1), (7, 1)])
def test_streamk_schedule_covers_every_iteration_once(shape, num_sms, sk_waves):
    plan, pieces = check_streamk_schedule(shape, num_sms, sk_waves)
    split = [tile for tile, parts in pieces.items() if len(parts) > 1]
    if plan.tiles % num_sms == 0 or plan.tiles < num_sms:
        assert plan.dp_tiles == plan.tiles and not split  # a whole number of waves: the persistent kernel
    else:
        assert plan.tiles - plan.dp_tiles == plan.tiles % num_sms + (sk_waves - 1) * num_sms or plan.dp_tiles == 0
        assert split


def test_streamk_schedule_splits_tiles_into_several_pieces():
    """sk_waves=2 gives every block at least a tile's worth of stream-K iterations: a tile is cut in two at most,
    and a finisher waits for one block. Over the partial wave only (sk_waves=1), on small grids, blocks get
    less than a tile: tiles cut in three or more, a finisher waiting for several blocks, blocks with a single
    k-step or none at all (skipped by the finisher's wait)."""
    for shape in STREAMK_SHAPES:
        for num_sms in (132, 3, 5, 7):
            _, pieces = check_streamk_schedule(shape, num_sms, 2)
            assert max(len(parts) for parts in pieces.values()) <= 2
    pieces_per_tile = []
    for shape, num_sms in [((1000, 1000, 1000), 7), ((1001, 1032, 1000), 3), ((3900, 4104, 1000), 5),
                           ((4096, 4096, 4096), 7), ((8192, 4096, 14336), 5)]:
        _, pieces = check_streamk_schedule(shape, num_sms, 1)
        pieces_per_tile += [len(parts) for parts in pieces.values()]
    assert max(pieces_per_tile) >= 3
    plan, pieces = check_streamk_schedule((1024, 1280, 64), 7, 1)  # 40 tiles, 1 k-step: 5 stream-K iterations
    assert plan.sk_iters < plan.num_sms
    assert any(plan.begin(d) == plan.begin(d + 1) for d in range(plan.num_sms))


def test_streamk_waves_on_the_target_shapes():
    """4096^3: 512 tiles on 132 SMs = 3.88 waves: 2 data-parallel waves, 248 tiles of stream-K (1.88 tiles a
    block); 8192x4096x14336: 7.76 waves, 6 data-parallel; 8192^3: 2048 tiles, 14 + 200 tiles."""
    for shape, tiles, dp in [((4096, 4096, 4096), 512, 264), ((8192, 4096, 14336), 1024, 792),
                             ((8192, 8192, 8192), 2048, 1848), ((1024, 8192, 8192), 256, 0),
                             ((1000, 1000, 1000), 32, 32)]:
        plan = probe.streamk_plan(*shape, 128, 256, 64, 132)
        assert (plan.tiles, plan.dp_tiles) == (tiles, dp), shape
    assert probe.streamk_plan(4096, 4096, 4096, 128, 256, 64, 132, sk_waves=1).dp_tiles == 396
    with pytest.raises(ValueError):
        probe.streamk_plan(4096, 4096, 4096, 128, 256, 64, 132, sk_waves=0)


def test_streamk_formulas_mean_the_same_in_tir():
    """The kernel evaluates StreamKPlan on a TIR block index with T.max / T.min: the same numbers as Python's."""
    import tilelang.language as T
    from tvm import arith, tirx

    g, i = tirx.Var("g", "int32"), tirx.Var("i", "int32")
    analyzer = arith.Analyzer()
    for shape, num_sms in [((4096, 4096, 4096), 132), ((3900, 4104, 1000), 7)]:
        plan = probe.streamk_plan(*shape, 128, 256, 64, num_sms)
        segment = plan.segment(g, i, T.max, T.min)
        count = plan.segment_count(g)
        for block in range(num_sms):
            def value(e, n=0):
                if isinstance(e, int):
                    return e
                at = {g: tirx.IntImm("int32", block), i: tirx.IntImm("int32", n)}
                return int(analyzer.simplify(tirx.stmt_functor.substitute(e, at)))

            assert value(plan.dp_count(g)) == plan.dp_count(block)
            assert value(count) == plan.segment_count(block)
            for n in range(plan.segment_count(block)):
                assert [value(e, n) for e in segment] == list(plan.segment(block, n))
                t = plan.segment(block, n)[0]
                assert [value(e) for e in plan.waiting_range(g, t)] == list(plan.waiting_range(block, t))


@pytest.mark.parametrize("name", STREAMK)
def test_streamk_fixup_publishes_and_waits_in_order(name):
    """The contributor: workspace stores, a device-wide fence, the consumers' named barrier, then one thread's
    release store of its flag. The finisher: one thread spins on an acquire load of a later block's flag and
    resets it, the consumers meet at the barrier and fence, then read the partial sum. A whole number of waves
    (1001x1032x1000: 40 tiles) has no fixup at all."""
    source = lower(name, (8192, 8192, 8192)).source
    assert re.search(r"Workspace \+ .*\) = \*\(float2\*\)\(C_local", source)
    assert re.search(r"__threadfence\(\);\s*tl::__sync_thread_partial\(10, 256\);\s*"
                     r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*"
                     r"AtomicStore\(\(&\(Flags\[\(\(int\)blockIdx.x\)\]\)\), 1, 3\);", source)  # 3: release
    wait = re.search(r"for \(int d = \(\(\(int\)blockIdx.x\) \+ 1\); d < [^;]*; \+\+d\) \{"
                     r"(?:(?!C_local).)*?while \(1\) \{\s*if \(!\(\(AtomicLoad\(\(&\(Flags\[d\]\)\), 2\) == 0\)\)\) "
                     r"\{ break; \}\s*\}\s*AtomicStore\(\(&\(Flags\[d\]\)\), 0, 0\);\s*\}\s*"
                     r"tl::__sync_thread_partial\(10, 256\);\s*__threadfence\(\);", source, re.S)  # 2: acquire
    assert wait
    assert re.search(r"\(float2\*\)\(Workspace \+ \(\(\(\(\(\(d \* 32768\)", source[wait.end():])
    assert source.count("__syncthreads") == 1  # only after the mbarrier init
    assert "Flags" not in lower(name, (1001, 1032, 1000)).source


@pytest.mark.parametrize("name", STREAMK)
def test_streamk_segment_loop_keeps_one_batch_in_flight(name):
    """The stream-K K loop (the consumers' second, after the data-parallel one) releases as the section's."""
    source = lower(name, (8192, 8192, 8192)).source
    consumer = source[source.index("warpgroup_reg_alloc<"):]
    waits = [m.start() for m in re.finditer(r"full\[[^\]]*\]\.wait\(", consumer)]
    assert len(waits) == 2
    loop = consumer[waits[1]:consumer.index("wait_wgmma<0>", waits[1]) + 200]
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    assert issue < wait_one < loop.index("empty[", wait_one)
    assert re.search(r"if \(0 < k\w*\) \{\s*empty\[", loop[wait_one:])
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
def test_streamk_fixup_order_survives_nvcc():
    """bar.sync is inline asm without a memory clobber, so check the PTX: the partial sum's stores come before
    the fence, the barrier and the release; the reads after the acquire, the reset, the barrier and a fence."""
    ptx = probe.ptx_source(lower("ws_streamk", (8192, 8192, 8192)).source)
    ops = [m.group(1) for m in re.finditer(r"^\s*((?:st|ld)\.(?:global|release|acquire|relaxed)[.\w]*|membar\.gl|"
                                            r"bar\.sync)", ptx, re.M)]
    text = " ".join(ops)
    assert re.search(r"(st\.global\.v2\.f32 )+membar\.gl bar\.sync st\.release\.gpu\.b32", text)
    assert re.search(r"ld\.acquire\.gpu\.b32 st\.relaxed\.gpu\.b32 bar\.sync membar\.gl (ld\.global\.v2\.f32 )+", text)
    assert text.count("st.global.v2.f32") == text.count("ld.global.v2.f32") == 64  # the workspace only
