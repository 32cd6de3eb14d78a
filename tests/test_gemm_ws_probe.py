"""bench/gemm_ws_probe.py: the hand-written warp-specialized Hopper GEMM lowers for sm_90a with the pipeline
it was written for, and the split-tile variants' schedules (stream-K, lockstep) cover every (tile, k-step) once
with a fixup that cannot wait in a cycle (CPU only; the GPU run is the probe itself)."""

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
    # the consumer warpgroups (two, or three for 192-row tiles) and the producer warpgroup
    assert report.threads == (probe.VARIANTS[name].threads if name in probe.VARIANTS else 256) + 128
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
    # nothing to release at step 0 (with warp arrivals only lane 0 of each warp releases)
    assert re.search(r"if \(0 < k\w*\) \{\s*(if \(\(\(\(int\)threadIdx\.x\) % 32\) == 0\) \{\s*)?empty\[",
                     loop[wait_one:])
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")  # the drain, then the last stage's release


def test_producer_waits_for_free_stages_with_the_flipped_parity(lowered):
    name, _, report = lowered
    assert re.search(r"empty\[[^\]]*\]\.wait\(.*\^ 1\)\);", report.source)
    assert re.search(r"full\[[^\]]*\]\.expect_transaction\(", report.source)
    assert re.search(r"warpgroup_reg_dealloc<(24|40)>", report.source)
    consumers = probe.VARIANTS[name].threads // 128 if name in probe.VARIANTS else 2
    allowed = {probe.register_split(consumers, persistent)[1] for persistent in (False, True)}
    assert int(re.search(r"warpgroup_reg_alloc<(\d+)>", report.source).group(1)) in allowed


def test_warp_arrivals_release_each_stage_once_per_consumer_warp(lowered):
    name, _, report = lowered
    loop = probe.consumer_main_loop(report.source)
    guarded = re.findall(r"if \(\(\(\(int\)threadIdx\.x\) % 32\) == 0\) \{\s*empty\[", loop)
    counts = {int(c) for c in re.findall(r"\bempty\[\d+\]\.init\((\d+)\);", report.source)}
    cluster = 2 if name.startswith("ws_multicast") else 1  # both blocks' consumers hand each stage back
    if name.endswith(("_wa", "_lean")):
        assert len(guarded) == 2  # inside the K loop and after the drain
        assert counts == {cluster * 256 // 32}
    else:
        assert guarded == []
        config = probe.VARIANTS.get(name)
        consumers = 256 if config is None else 128 if config.kernel == "pingpong" else config.threads
        assert counts == {cluster * consumers}  # ping-pong: one warpgroup consumes a stage


def test_one_producer_warp_runs_the_loop_and_arrives_on_full(lowered):
    name, _, report = lowered
    counts = {int(c) for c in re.findall(r"\bfull\[\d+\]\.init\((\d+)\);", report.source)}
    consumers = probe.VARIANTS[name].threads if name in probe.VARIANTS else 256
    guard = f"if (((int)threadIdx.x) < {consumers + 32}) {{"
    if name.endswith("_lean"):
        assert counts == {32} and guard in report.source
        assert "tl_shuffle_elect<32>()" in report.source  # the TMA issuer: one lane of that warp
    else:
        assert counts == {128} and guard not in report.source


def test_warp_arrivals_are_for_the_ws_kernel_only():
    pingpong = dataclasses.replace(probe.VARIANTS["pingpong"], warp_arrivals=True)
    with pytest.raises(ValueError, match="warp_arrivals"):
        probe.gemm_program(1024, 1024, 1024, pingpong)
    assert probe.VARIANTS["ws_persistent_wa"].label().endswith(" warp-arrivals persistent132")
    for bad in (dataclasses.replace(probe.VARIANTS["ws"], producer_warps=2),
                dataclasses.replace(probe.VARIANTS["pingpong"], producer_warps=1)):
        with pytest.raises(ValueError, match="producer_warps"):
            probe.gemm_program(1024, 1024, 1024, bad)
    assert probe.VARIANTS["ws_persistent_lean"].label().endswith(" warp-arrivals producer-warps1 persistent132")


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
        probe.gemm_program(1024, 1024, 1024, dataclasses.replace(ws, block_M=192))
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


@pytest.mark.parametrize("name", ["ws_multicast_persistent", "ws_multicast_persistent_wa"])
def test_persistent_multicast_leaves_the_idle_clusters_idle(name):
    """1000^3 has 16 pairs of 128x256 tiles for 66 clusters: clusters 16..65 must not touch a tile. (Written as a
    loop of ceildiv(pairs - cluster, clusters) passes, TileLang dropped the loop and ran one pass everywhere.)"""
    source = tourkit.inspect_kernel(name, probe.program_for(name, 1000, 1000, 1000), "sm_90a", nvcc=False).source
    assert source.count("if (((int)blockIdx.y) < 16) {") == 2  # the producer's and the consumers' pair loops
    big = tourkit.inspect_kernel(name, probe.program_for(name, 8192, 8192, 8192), "sm_90a", nvcc=False).source
    # 1024 pairs: each pass of both loops asks whether its pair exists (TileLang halves both sides)
    assert len(re.findall(r"if \(\(\(i_?\d* \* 33\) \+ \(\(\(int\)blockIdx\.y\) >> 1\)\) < 512\)", big)) == 2


# ---------------------------------------------------------------------------------------------------------
# Stream-K: the schedule in pure Python (the kernel's own formulas), then what the generated code does with it
# ---------------------------------------------------------------------------------------------------------

STREAMK = [name for name, (builder, _) in probe.EXPERIMENTS.items() if builder == "gemm_ws_streamk_program"]
LOCKSTEP = [name for name, (builder, _) in probe.EXPERIMENTS.items() if builder == "gemm_ws_lockstep_program"]
FIXUP = STREAMK + LOCKSTEP  # the kernels of gemm_ws_fixup_program
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


def publishes_with_release(source, flag):
    """Workspace stores done: a device-wide fence, the consumers' named barrier, then one thread's release store
    (order 3) of Flags[flag] (a regex)."""
    return re.search(r"__threadfence\(\);\s*tl::__sync_thread_partial\(10, 256\);\s*"
                     r"if \(\(\(int\)threadIdx.x\) == 0\) \{\s*"
                     rf"AtomicStore\(\(&\(Flags\[{flag}\]\)\), 1, 3\);", source)


def waits_with_acquire(source, loop_head, flag, reset):
    """In a loop opened by `loop_head` (regex) and before any use of C_local: one thread spins on an acquire
    load (order 2) of Flags[flag], resets Flags[reset] to zero, then the consumers meet at the named barrier
    and fence before reading the partial sum."""
    return re.search(loop_head + r"(?:(?!C_local).)*?"
                     rf"while \(1\) \{{\s*if \(!\(\(AtomicLoad\(\(&\(Flags\[{flag}\]\)\), 2\) == 0\)\)\) "
                     rf"\{{ break; \}}\s*\}}\s*AtomicStore\(\(&\(Flags\[{reset}\]\)\), 0, 0\);\s*\}}\s*"
                     r"tl::__sync_thread_partial\(10, 256\);\s*__threadfence\(\);", source, re.S)


@pytest.mark.parametrize("name", STREAMK)
def test_streamk_fixup_publishes_and_waits_in_order(name):
    """The contributor: workspace stores, a device-wide fence, the consumers' named barrier, then one thread's
    release store of its flag. The finisher: one thread spins on an acquire load of a later block's flag and
    resets it, the consumers meet at the barrier and fence, then read the partial sum. A whole number of waves
    (1001x1032x1000: 40 tiles) has no fixup at all."""
    source = lower(name, (8192, 8192, 8192)).source
    assert re.search(r"Workspace \+ .*\) = \*\(float2\*\)\(C_local", source)
    assert publishes_with_release(source, r"\(\(int\)blockIdx.x\)")
    wait = waits_with_acquire(source, r"for \(int d = \(\(\(int\)blockIdx.x\) \+ 1\); d < [^;]*; \+\+d\) \{", "d", "d")
    assert wait
    assert re.search(r"\(float2\*\)\(Workspace \+ \(\(\(\(\(\(d \* 32768\)", source[wait.end():])
    assert source.count("__syncthreads") == 1  # only after the mbarrier init
    assert "Flags" not in lower(name, (1001, 1032, 1000)).source


@pytest.mark.parametrize("name", FIXUP)
def test_streamk_segment_loop_keeps_one_batch_in_flight(name):
    """The split K loop (the consumers' second, after the data-parallel one) releases as the section's."""
    source = lower(name, (8192, 8192, 8192)).source
    consumer = source[source.index("warpgroup_reg_alloc<"):]
    waits = [m.start() for m in re.finditer(r"full\[[^\]]*\]\.wait\(", consumer)]
    assert len(waits) == 2
    loop = consumer[waits[1]:consumer.index("wait_wgmma<0>", waits[1]) + 200]
    issue, wait_one = loop.index("wgmma_ss<"), loop.index("wait_wgmma<1>")
    assert issue < wait_one < loop.index("empty[", wait_one)
    assert re.search(r"if \(0 < k\w*\) \{\s*empty\[", loop[wait_one:])
    assert loop.index("wait_wgmma<0>") < loop.rindex("empty[")


PTX_STEP = re.compile(r"^\s*(?:(@!?%p\d+)\s+)?((?:st|ld)\.(?:global|release|acquire|relaxed)[.\w]*|membar\.gl|"
                      r"bar\.sync|bra(?:\.uni)?\s+(\$\w+))")


def ptx_path(ptx: str, start: str, length: int) -> str:
    """The memory operations, fences and barriers met from the first instruction starting with `start` on, along
    the path that follows unconditional branches and falls through conditional ones (out of a spin loop, into
    thread 0's flag access): the order one thread executes them in, whatever order nvcc laid the blocks out in."""
    lines = ptx.splitlines()
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if re.match(r"^\$\w+:$", line.strip())}
    at = next(i for i, line in enumerate(lines) if line.strip().startswith(start))
    ops = []
    while len(ops) < length and at < len(lines):
        step = PTX_STEP.match(lines[at])
        at += 1
        if step is None:
            continue
        predicate, op, target = step.groups()
        if target is None:
            ops.append(op)
        elif predicate is None:  # an unconditional branch: follow it
            at = labels[target]
    return " ".join(ops) + " "


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("name, shape", [("ws_streamk", (8192, 8192, 8192)),
                                         ("ws_streamk_lockstep", (8192, 8192, 8192)),
                                         ("ws_streamk_lockstep", (8192, 4096, 14336))],
                         ids=lambda p: p if isinstance(p, str) else probe.shape_text(p))
def test_streamk_fixup_order_survives_nvcc(name, shape):
    """bar.sync is inline asm without a memory clobber, so check the PTX: the partial sum's stores come before
    the fence, the barrier and the release; the reads after the acquire, the reset, the barrier and a fence.
    (nvcc lays the lockstep head's wait out of line, after the reads: hence the path, not the text order.)"""
    ptx = probe.ptx_source(lower(name, shape).source)
    publish = ptx_path(ptx, "st.global.v2.f32", 64 + 3)
    assert re.fullmatch(r"(st\.global\.v2\.f32 ){64}membar\.gl bar\.sync st\.release\.gpu\.b32 ", publish), publish
    read = ptx_path(ptx, "ld.acquire", 4 + 64)
    assert re.fullmatch(r"ld\.acquire\.gpu\.b32 st\.relaxed\.gpu\.b32 bar\.sync membar\.gl (ld\.global\.v2\.f32 ){64}",
                        read), read
    assert ptx.count("st.global.v2.f32") == ptx.count("ld.global.v2.f32") == 64  # the workspace only
    assert ptx.count("ld.acquire") == ptx.count("st.release") == 1


# ---------------------------------------------------------------------------------------------------------
# Lockstep: the partial wave's first k-steps on as many blocks, the rest shared out among the others
# ---------------------------------------------------------------------------------------------------------

def lockstep(shape, num_sms=132, fixup_steps=probe.FIXUP_STEPS):
    return probe.lockstep_plan(*shape, 128, 256, 64, num_sms, fixup_steps)


def check_lockstep_schedule(shape, num_sms=132, fixup_steps=probe.FIXUP_STEPS):
    """Every (tile, k-step) computed exactly once; data-parallel tiles whole; tail tile t has exactly one head,
    block t, which computes its k-steps [0, x) and nothing else split; the other blocks only contribute (they
    never wait: no cycle); the head's wait list is exactly the tile's contributors, newest first, each read
    from the slot it was published to; no two contributions share a slot (or flag); each block's split
    k-steps follow on one another in its ring."""
    plan = lockstep(shape, num_sms, fixup_steps)
    blocks = probe.plan_segments(plan)
    k_steps, tail = plan.k_steps, plan.tail_tiles
    pieces: dict[int, list] = {}
    published: dict[tuple[int, int], int] = {}  # (block, tail tile) -> slot
    for g, work in enumerate(blocks):
        for tile, kb, ke, role in work:
            assert 0 <= kb < ke <= k_steps
            pieces.setdefault(tile, []).append((kb, ke, g, role))
        dp = plan.dp_count(g)
        assert [role for *_, role in work[:dp]] == ["whole"] * dp
        split = work[dp:]
        if g < tail:  # a main block: the first x k-steps of its own tail tile, which it finishes
            assert split == [(plan.dp_tiles + g, 0, plan.main_steps, "finish")]
        else:  # a helper: pieces of the remainders, all published
            assert all(role == "contribute" and kb >= plan.main_steps for _, kb, _, role in split)
        steps = 0
        for i in range(len(split)):
            t, kb, ke, offset = plan.segment(g, i)
            assert offset == steps  # the ring's steps run on without a gap
            steps += ke - kb
            if g >= tail:
                published[g, t] = plan.publish_slot(g, i)
    slots = list(published.values())
    assert len(set(slots)) == len(slots) and all(0 <= slot < plan.slots for slot in slots)
    assert sorted(pieces) == list(range(plan.tiles))
    for tile, parts in pieces.items():
        parts.sort()
        assert parts[0][0] == 0 and parts[-1][1] == k_steps
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))  # contiguous: each k-step exactly once
        if tile < plan.dp_tiles:
            assert len(parts) == 1 and parts[0][3] == "whole"
            continue
        t = tile - plan.dp_tiles
        assert [g for *_, g, role in parts if role == "finish"] == [t]  # one head: its main block
        contributors = sorted((g for *_, g, role in parts if role == "contribute"), reverse=True)
        assert contributors  # a split tile always has helpers' pieces
        waits = plan.wait_list(t, t)
        assert [block for block, _ in waits] == contributors
        assert [slot for _, slot in waits] == [published[block, t] for block in contributors]
    return plan, blocks


def block_steps(blocks) -> list[int]:
    return [sum(ke - kb for _, kb, ke, _ in work) for work in blocks]


@pytest.mark.parametrize("shape", STREAMK_SHAPES, ids=probe.shape_text)
@pytest.mark.parametrize("num_sms, fixup_steps", [(132, probe.FIXUP_STEPS), (132, 0), (3, 2), (5, 0), (7, 2)])
def test_lockstep_schedule_covers_every_iteration_once(shape, num_sms, fixup_steps):
    plan, _ = check_lockstep_schedule(shape, num_sms, fixup_steps)
    if plan.tail_tiles:
        assert plan.tail_tiles == plan.tiles % num_sms and 1 <= plan.main_steps < plan.k_steps


def test_lockstep_splits_tiles_of_the_gpu_validation():
    """The probe's GPU validation runs the split path: at the two target shapes and at one odd shape, whose tail
    holds the ragged last tile row and column (tiles 396-479 of 480: the last panel, rows 32-39, columns 1-11)
    and whose last k-step (K = 3000) is partial."""
    for shape in [(8192, 4096, 14336), (4096, 4096, 4096)]:
        assert lockstep(shape).tail_tiles
    ragged = [shape for shape in probe.ODD_SHAPES if lockstep(shape).tail_tiles]
    assert ragged == [(5000, 3000, 3000)]
    plan = lockstep(ragged[0])
    assert (plan.tiles, plan.dp_tiles) == (480, 396) and 3000 % 64


def test_lockstep_skips_helpers_without_work():
    """133 tiles of two k-steps without fixup costs: x = 1, and one remainder iteration for 131 helpers. The
    head's waiting range holds only the one helper with work; the empty ones publish nothing."""
    plan, blocks = check_lockstep_schedule((896, 4864, 128), 132, fixup_steps=0)
    assert (plan.tail_tiles, plan.main_steps, plan.helper_iters) == (1, 1, 1)
    assert sum(1 for h in range(plan.helpers) if plan.contributes(h)) == 1
    assert not plan.has_segments(plan.tail_tiles)
    assert plan.wait_list(0, 0) == [(131, 130)] and plan.slots == 131  # helper 130, its piece 0


# The lockstep plan on the target shapes (H200: 132 SMs, 128x256x64 tiles), fixup_steps = 2:
#   shape             tiles  T    H   k    x   x0 = ceil(T k / G)  longest block  even split  modeled tail
#   8192x4096x14336   1024  100  32  224  172  170                 1740           1738        176 of 224
#   4096^3             512  116  16   64   58   57                  250            249         62 of 64
#   8192^3            2048   68  64  128   67   66                 1987           1986         71 of 128
#   5000x3000x3000     480   84  48   47   32   30                  173            171         36 of 47
LOCKSTEP_TARGETS = [((8192, 4096, 14336), 100, 172), ((4096, 4096, 4096), 116, 58), ((8192, 8192, 8192), 68, 67),
                    ((5000, 3000, 3000), 84, 32)]


@pytest.mark.parametrize("shape, tail, main_steps", LOCKSTEP_TARGETS, ids=lambda p: probe.shape_text(p)
                         if isinstance(p, tuple) else str(p))
def test_lockstep_balance_on_the_target_shapes(shape, tail, main_steps):
    """Without fixup costs x = ceil(T k / G) and every block gets the even split, ceil(tiles k / G) k-steps. With
    them (2 k-steps to publish or read a partial tile) x moves up by 1-2 k-steps, off the helpers, which also
    publish; the modeled tail stays shorter than the data-parallel one (k-steps)."""
    plan, blocks = check_lockstep_schedule(shape)
    even = -(-plan.tiles * plan.k_steps // plan.num_sms)
    assert (plan.tail_tiles, plan.main_steps) == (tail, main_steps)
    assert even <= max(block_steps(blocks)) <= even + 2
    assert plan.modeled_tail_steps(probe.FIXUP_STEPS) < plan.k_steps
    exact, exact_blocks = check_lockstep_schedule(shape, fixup_steps=0)
    assert exact.main_steps == -(-exact.tail_tiles * exact.k_steps // exact.num_sms)
    assert max(block_steps(exact_blocks)) == even


@pytest.mark.parametrize("shape", [(1536, 2816, 4096), (1000, 1000, 1000), (1001, 1032, 1000), (3900, 4104, 1000),
                                   (896, 4864, 1024), (896, 4864, 64)], ids=probe.shape_text)
def test_lockstep_falls_back_to_data_parallel(shape):
    """Whole waves (132 tiles), fewer tiles than SMs (32, 40), or a tail not worth splitting: 131 tail tiles for
    a single helper; one tail tile, whose remainder would come back in 15 pieces; a single k-step."""
    plan, blocks = check_lockstep_schedule(shape)
    assert plan.tail_tiles == 0 and plan.dp_tiles == plan.tiles
    assert all(role == "whole" for work in blocks for *_, role in work)
    assert not any(plan.has_segments(g) for g in range(plan.num_sms))


def test_lockstep_kernel_takes_a_slot_per_contribution():
    """The kernel's Workspace and Flags hold plan.slots entries: helpers x the most pieces a helper has."""
    for shape in [(8192, 4096, 14336), (4096, 4096, 4096), (1001, 1032, 1000)]:
        plan = lockstep(shape)
        func = probe.program_for("ws_streamk_lockstep", *shape)
        workspace, flags = (func.buffer_map[param] for param in func.params[3:])
        assert [int(d) for d in workspace.shape] == [plan.slots, 128, 256] and int(flags.shape[0]) == plan.slots
    assert lockstep((8192, 4096, 14336)).slots == 32 * 4 and lockstep((4096, 4096, 4096)).slots == 16 * 8


def test_lockstep_formulas_mean_the_same_in_tir():
    """The kernel evaluates LockstepPlan on a TIR block index (selects between main blocks and helpers, T.max /
    T.min): the same numbers as Python's, for the segments, the publish slots and the heads' waits."""
    import tilelang.language as T
    from tvm import arith, tirx

    g, i, d = (tirx.Var(name, "int32") for name in "gid")
    analyzer = arith.Analyzer()

    def value(e, **at):
        if isinstance(e, (bool, int)):
            return int(e)
        binding = {var: tirx.IntImm("int32", at[var.name]) for var in (g, i, d) if var.name in at}
        return int(analyzer.simplify(tirx.stmt_functor.substitute(e, binding)))

    for shape, num_sms, fixup_steps in [((8192, 4096, 14336), 132, 2), ((4096, 4096, 4096), 132, 2),
                                        ((896, 4864, 128), 132, 0), ((3900, 4104, 1000), 7, 2)]:
        plan = lockstep(shape, num_sms, fixup_steps)
        assert plan.tail_tiles
        segment = plan.segment(g, i, T.max, T.min)
        for block in range(num_sms):
            assert value(plan.has_segments(g), g=block) == plan.has_segments(block)
            assert value(plan.segment_count(g), g=block) == plan.segment_count(block)
            for n in range(plan.segment_count(block)):
                assert [value(e, g=block, i=n) for e in segment] == list(plan.segment(block, n))
                if block >= plan.tail_tiles:
                    assert value(plan.publish_slot(g, i), g=block, i=n) == plan.publish_slot(block, n)
            if block < plan.tail_tiles:  # the head of its tail tile t = segment[0], as the kernel computes it
                first, end = (value(e, g=block, i=0) for e in plan.waiting_range(g, segment[0]))
                assert (first, end) == plan.waiting_range(block, block)
                for h in range(first, end):
                    assert value(plan.contributes(d), d=h) == plan.contributes(h)
                    assert value(plan.slot_of(d, segment[0]), d=h, g=block, i=0) == plan.slot_of(h, block)


@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (8192, 4096, 14336)], ids=probe.shape_text)
def test_lockstep_fixup_publishes_and_waits_in_order(shape):
    """A helper publishes its i-th piece to slot (g - T) * slots_per_helper + i: workspace stores, a device-wide
    fence, the consumers' named barrier, one thread's release store of the flag. A head: one thread spins on an
    acquire load of a contributor's flag and resets that same flag, the consumers meet at the barrier and
    fence, then read the partial sum. A data-parallel plan (1001x1032x1000) has no fixup at all."""
    plan = lockstep(shape)
    source = lower("ws_streamk_lockstep", shape).source
    assert "gemm_ws_lockstep_kernel" in source
    assert re.search(r"Workspace \+ .*\) = \*\(float2\*\)\(C_local", source)
    per_helper, first_slot = plan.slots_per_helper, plan.tail_tiles * plan.slots_per_helper
    slot = rf"\(\(\(\(\(int\)blockIdx.x\) \* {per_helper}\) \+ i_\d+\) - {first_slot}\)"  # (g - T) * S + i
    assert publishes_with_release(source, slot)
    wait = waits_with_acquire(source, r"for \(int (j\w*) = 0; \1 < [^;]*; \+\+\1\) \{", r"(?P<slot>[^;]*?)",
                              "(?P=slot)")  # the flag it waited on, and no other
    assert wait
    assert "(float2*)(Workspace + " in source[wait.end():]
    assert source.count("__syncthreads") == 1  # only after the mbarrier init
    assert "Flags" not in lower("ws_streamk_lockstep", (1001, 1032, 1000)).source


@pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")
@pytest.mark.parametrize("shape", [(8192, 4096, 14336), (4096, 4096, 4096)], ids=probe.shape_text)
def test_lockstep_compiles_without_spills(shape):
    """The selects between main blocks and helpers cost no spills (T.if_then_else's branches at every use did:
    260 bytes)."""
    report = probe.inspect_variant("ws_streamk_lockstep", shape)
    assert "error" not in report, report.get("error")
    assert probe.spilled_bytes(report) == 0 and report["registers"] <= 168
    assert not report["missing_markers"] and report["main_loop_syncs"] == 0
    assert not any("C7514" in w or "serialized" in w for w in report["warnings"]), report["warnings"]
