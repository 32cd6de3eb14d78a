"""flash_attention: attention that never writes the S×S score matrix, as fast as PyTorch's SDPA.

You will learn:
* the FlashAttention forward pass: a block keeps `block_M` query rows of one (batch, head) in shared memory
  and streams K and V tiles of `block_N` keys through a `T.Pipelined` loop, two `T.gemm`s per tile;
* the online softmax: a running row max m and row sum l, O rescaled whenever m grows: O(S·d) memory, not O(S²);
* the softmax scale folded into `exp2`, so each score costs one FMA;
* causal attention at half the work (tiles past the diagonal never loaded, only the diagonal tile masked),
  and odd lengths (loads past the end read zeros, the last key tile masks its columns);
* on Hopper, the FA3 schedule: S(k) = Q·K(k)ᵀ and P(k-1)·V(k-1) in flight together, the softmax in between;
  or two blocks per SM (registers capped), one block's softmax, loads and stores beside the other's MMAs;
* grouped-query attention: KVH key/value heads, each read by H/KVH query heads (an index, not a copy);
* many walks: this kernel walking its tiles persistently (`attention_persistent.py`; causal in pairs; d=128: FA3).

The algorithm (scale = log2(e)/√d; per query block m = -inf, l = 0, O = 0):

    for each query block Q:
        for each key block K, V (causal: up to the diagonal; mask the diagonal block):
            S = Q Kᵀ · scale
            m_new = max(m, rowmax S);  P = exp2(S - m_new)
            l = l · exp2(m - m_new) + rowsum P
            O = O · exp2(m - m_new) + P V;  m = m_new
        O /= l

Layout BSHD (batch, seq, heads, dim), fp16 or bf16, float32 accumulation. Rules (`sections/attention_plans.py`)
choose each problem's tiles and schedule and say why (on Hopper a --shape's pick is timed beside its runner-up,
the faster kept); on Hopper the appendix is timed beside (`sections/hopper/`).
"""

import math

import tilelang.language as T

import tourkit
from sections import attention_persistent, attention_plans as plans  # a persistent walk; the rules
from sections.attention_plans import Problem, pass_configs  # noqa: F401  (what a configuration compiles with)
from sections.hopper import attention_ws  # the appendix: its kernel is built and timed beside this lesson's
from sections.shapes import ATTENTION_HEAD_DIMS as HEAD_DIMS  # the head dims --shape accepts

LOG2E = 1.4426950408889634
ACCUM = "float32"


def alloc_buffers(block_M: int, block_N: int, dim: int, dtype: str):
    """What one block holds: Q, K, V, O tiles in shared memory; scores, output and row state in registers."""
    Q_s = T.alloc_shared((block_M, dim), dtype)
    K_s = T.alloc_shared((block_N, dim), dtype)
    V_s = T.alloc_shared((block_N, dim), dtype)
    O_s = T.alloc_shared((block_M, dim), dtype)
    scores = T.alloc_fragment((block_M, block_N), ACCUM)  # S = Q·Kᵀ, then P in float32
    probs = T.alloc_fragment((block_M, block_N), dtype)  # P in fp16, the second GEMM's input
    acc_o = T.alloc_fragment((block_M, dim), ACCUM)  # O, not yet divided by l
    # m: running row max (of raw scores); rescale: 2^((m_prev - m)·scale); l: running row sum
    m, m_prev, rescale, row_sum, l = (T.alloc_fragment((block_M,), ACCUM) for _ in range(5))
    return Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l


def kernel_steps(seq_len: int, dim: int, block_M: int, block_N: int, causal: bool, mask_tail: bool):
    """What every kernel derives from the problem: the key and query tile counts, and its three steps (start:
    load Q and reset the state; the online softmax of one tile of scores; finish: divide O by l, store it)."""
    if dim not in HEAD_DIMS or seq_len < 1:
        raise ValueError(f"flash_attention: head dim {dim} is not supported (use one of {HEAD_DIMS}) or seq_len "
                         f"{seq_len} is not positive")
    scale = LOG2E / math.sqrt(dim)  # softmax(x/√d) via exp2: one FMA per score

    @T.macro
    def start(Q, Q_s, acc_o, l, m, bx, by, bz):
        T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_s)
        T.fill(acc_o, 0)
        T.fill(l, 0)
        T.fill(m, -T.infinity(ACCUM))

    @T.macro
    def online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l):
        # mask only where needed; m = max(m_prev, row max); P = 2^(S·scale - m·scale); l = l·rescale + row sum
        if causal:
            # Only a tile whose last key lies beyond this block's first query straddles the diagonal.
            if (k + 1) * block_N > bx * block_M + 1:
                for i, j in T.Parallel(block_M, block_N):
                    scores[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, scores[i, j],
                                                  -T.infinity(ACCUM))
        elif mask_tail:
            if (k + 1) * block_N > seq_len:  # the last tile: keys past the end read as zeros
                for i, j in T.Parallel(block_M, block_N):
                    scores[i, j] = T.if_then_else(k * block_N + j < seq_len, scores[i, j], -T.infinity(ACCUM))
        T.copy(m, m_prev)
        T.reduce_max(scores, m, dim=1, clear=False)  # m = max(m_prev, this tile's row max)
        for i in T.Parallel(block_M):
            rescale[i] = T.exp2((m_prev[i] - m[i]) * scale)
        for i, j in T.Parallel(block_M, block_N):
            scores[i, j] = T.exp2(scores[i, j] * scale - m[i] * scale)
        T.reduce_sum(scores, row_sum, dim=1)
        for i in T.Parallel(block_M):
            l[i] = l[i] * rescale[i] + row_sum[i]

    @T.macro
    def finish(O, O_s, acc_o, l, bx, by, bz):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] /= l[i]
        T.copy(acc_o, O_s)
        T.copy(O_s, O[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return -(-seq_len // block_N), -(-seq_len // block_M), start, online_softmax, finish


@T.macro
def share_sm(blocks_per_sm: int, threads: int):  # n > 1 blocks an SM: registers split by plans.register_split
    if blocks_per_sm > 1:
        T.annotate_min_blocks_per_sm(blocks_per_sm)
        T.annotate_producer_reg_dealloc(24)
        T.annotate_consumer_reg_alloc(plans.register_split(blocks_per_sm, threads))


def flash_attention_forward(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *, block_M: int = 128,
                            block_N: int = 128, num_stages: int = 2, threads: int = 256, heavy_first: bool = False,
                            dtype: str = "float16", kv_heads: int | None = None, blocks_per_sm: int = 1):
    """The forward kernel for one problem and one tile configuration: T.Pipelined infers the software pipeline
    from `num_stages` (later K/V loads run ahead of this tile's math). heavy_first=True (causal): the last query
    blocks, which have the most key tiles, launch first, so that the short ones fill the tail of the grid.
    blocks_per_sm = n (Hopper): n blocks share an SM, their registers split by plans.register_split."""
    shape, kv_shape, groups = plans.shapes(batch, heads, seq_len, dim, kv_heads)
    n_tiles, n_query_blocks, start, online_softmax, finish = kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                          seq_len % block_N != 0)

    @T.prim_func
    def flash_attention_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                            O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            kv = by // groups  # the key/value head of query head by
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = alloc_buffers(
                block_M, block_N, dim, dtype)
            share_sm(blocks_per_sm, threads)

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            # Causal: key tiles that start after this block's last query row are all masked: never visit them.
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            for k in T.Pipelined(last, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, kv, :], K_s)
                T.gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.copy(scores, probs)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, kv, :], V_s)
                T.gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
            finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_fwd


def flash_attention_forward_async(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *,
                                  block_M: int = 128, block_N: int = 128, num_stages: int = 2, threads: int = 256,
                                  heavy_first: bool = False, dtype: str = "float16", kv_heads: int | None = None,
                                  blocks_per_sm: int = 1):
    """Hopper: the FlashAttention-3 schedule in the same T.Pipelined loop. `T.wgmma_gemm` issues a warpgroup MMA
    and does not wait; `T.wait_wgmma(n)` waits until at most n are in flight. Iteration k issues S(k) = Q·K(k)ᵀ
    and O += P(k-1)·V(k-1), waits for the first only, runs the softmax of S(k) while P·V still runs, then waits,
    rescales O and turns S(k) into the next P. TileLang splits the block into a TMA producer and consumers;
    blocks_per_sm as in flash_attention_forward."""
    shape, kv_shape, groups = plans.shapes(batch, heads, seq_len, dim, kv_heads)
    # mask_tail always: the ragged last tile, and the extra all-masked iteration k = n_tiles below
    n_tiles, n_query_blocks, start, online_softmax, finish = kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                          True)

    @T.prim_func
    def flash_attention_fwd_async(Q: T.Tensor(shape, dtype), K: T.Tensor(kv_shape, dtype),
                                  V: T.Tensor(kv_shape, dtype), O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            kv = by // groups  # the key/value head of query head by
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = alloc_buffers(
                block_M, block_N, dim, dtype)
            touch = T.alloc_local((1,), dtype)
            share_sm(blocks_per_sm, threads)

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            T.fill(probs, 0)
            # One extra iteration finishes the last P·V, branch-free (ptxas serializes the asynchronous MMAs
            # when it cannot prove which wait retires which MMA): at k = 0, P = 0 meets V(-1) (zeros), and at
            # k = last every score is masked, which leaves m and l unchanged.
            for k in T.Pipelined(last + 1, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, kv, :], K_s)
                T.copy(V[bz, (k - 1) * block_N:k * block_N, kv, :], V_s)
                T.wgmma_gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                T.wgmma_gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
                T.wait_wgmma(1)  # S(k) is ready; P(k-1)·V(k-1) may still run
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.wait_wgmma(0)
                # A read of K_s and V_s after the wait: the producer may refill a buffer only after its last
                # use, and the asynchronous MMAs use them until the wait (not just until they are issued).
                touch[0] = K_s[0, 0] + V_s[0, 0]
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(scores, probs)
            finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_fwd_async


def build(problem: Problem, cfg: dict):
    """The prim_func of a configuration: this lesson's kernels, or the appendix's hand-written one ("ws")."""
    if cfg["kind"] == "ws":
        return attention_ws.build(problem, cfg)
    builder = {"pipelined": flash_attention_forward, "async": flash_attention_forward_async,
               **attention_persistent.BUILDERS}[cfg["kind"]]
    kwargs = {k: v for k, v in cfg.items() if k not in ("kind", "fast_math")}
    return builder(*problem.kernel_args(), **problem.kernel_kwargs(), **kwargs)


# The reference, the check, the benchmark
def make_inputs(problem: Problem):
    """Fresh random Q (B, S, H, D) and K, V (B, S, KVH, D) in the problem's dtype, and an output buffer."""
    import torch

    dtype = getattr(torch, problem.dtype)
    q = tourkit.random_tensor((problem.batch, problem.seq_len, problem.heads, problem.dim), dtype)
    k, v = (tourkit.random_tensor((problem.batch, problem.seq_len, problem.kv_heads, problem.dim), dtype)
            for _ in range(2))
    return q, k, v, torch.empty_like(q)


def sdpa_bshd(q, k, v, causal: bool):
    """PyTorch's SDPA on BSHD tensors (it wants BHSD); each K/V head repeated for its heads // kv_heads."""
    import torch.nn.functional as F
    if (groups := q.shape[2] // k.shape[2]) > 1:
        k, v = (t.repeat_interleave(groups, dim=2) for t in (k, v))
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def check_attention(problem: Problem, kernels: dict) -> list:
    """Each kernel's error against a float32 reference on fresh random inputs, within 2x of PyTorch's own
    (fp16 or bf16) error (and at least 1e-4: a one-key problem is exact for both)."""
    q, k, v, o = make_inputs(problem)
    ref = sdpa_bshd(q.float(), k.float(), v.float(), problem.causal)
    torch_error = tourkit.relative_error(sdpa_bshd(q, k, v, problem.causal), ref)
    return [tourkit.validate(f"{name} {problem.name} (torch: {torch_error:.2e})", lambda: attention(q, k, v, o), o,
                             ref, max(2.0 * torch_error, 1e-4)) for name, attention in kernels.items()]


def sdpa_contenders(problem: Problem, q, k, v) -> dict:
    """SDPA on its preferred contiguous BHSD layout, the strongest baseline whatever backend it picks; with
    grouped-query attention both ways PyTorch offers: enable_gqa=True, and K/V heads expanded beforehand."""
    import torch.nn.functional as F
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    if problem.kv_heads == problem.heads:
        return {"sdpa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=problem.causal)}
    groups = problem.heads // problem.kv_heads
    ke, ve = (t.repeat_interleave(groups, dim=1) for t in (kh, vh))
    contenders = {"sdpa expanded": lambda: F.scaled_dot_product_attention(qh, ke, ve, is_causal=problem.causal),
                  "sdpa enable_gqa": lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=problem.causal,
                                                                            enable_gqa=True)}
    for name, fn in list(contenders.items()):
        try:  # enable_gqa: PyTorch 2.5 or later, and a backend that takes it at this size
            fn()
        except Exception:
            del contenders[name]
    return contenders


def bench_attention(problem: Problem, kernels: dict, rounds: int = 2) -> dict:
    """Median ms of each kernel and of SDPA (its fastest variant, named in "sdpa_kind"), timed in turns."""
    q, k, v, o = make_inputs(problem)
    contenders = {name: (lambda fn=fn: fn(q, k, v, o)) for name, fn in kernels.items()}
    baselines = sdpa_contenders(problem, q, k, v)
    times = tourkit.bench_interleaved({**contenders, **baselines}, rounds=rounds)
    best = min(baselines, key=times.get)
    return {**{name: times[name] for name in kernels}, "sdpa": times[best], "sdpa_kind": best}


def peak_memory(problem: Problem, attention) -> tuple[int, int]:
    """Peak bytes allocated beyond the inputs: naive attention (S×S scores materialized) vs the kernel."""
    import torch

    q, k, v = make_inputs(problem)[:3]
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:  # the scores and the probabilities, B·H·S² each (P·V adds only the output)
        torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(problem.dim)), dim=-1)
        torch.cuda.synchronize()
        naive = torch.cuda.max_memory_allocated() - base
    except torch.cuda.OutOfMemoryError:  # the argument, made by the GPU itself
        naive = -1
        torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    attention(q, k, v, torch.empty_like(q))
    torch.cuda.synchronize()
    return naive, torch.cuda.max_memory_allocated() - base


# The section

BENCH_SHAPES, QUICK_SHAPES = [(4, 32, 4096, 128)], [(2, 16, 2048, 128)]
FULL_SHAPES = BENCH_SHAPES + [(1, 32, 16384, 128)]
# Odd lengths (a ragged last key tile and query tile), both head dims, grouped-query attention: correctness only.
ODD_SHAPES = [(1, 3, 777, 128), (1, 8, 333, 64, 2)]


def plan(ctx) -> list:
    """(name, which, problem, cfg, why, timed) of each kernel: the lesson's (with --shape, its runner-up where
    the rule has one: plans.runner_up), the appendix's where it takes one."""
    family = tourkit.ARCH_SPECS[ctx.arch].family
    sms = ctx.device.sm_count if ctx.device is not None and not ctx.compile_only else None
    timed = [ctx.shape] if ctx.shape else QUICK_SHAPES if ctx.quick else FULL_SHAPES if ctx.full else BENCH_SHAPES
    odd = [] if ctx.shape else ODD_SHAPES[1:] if ctx.quick else ODD_SHAPES
    items = []
    for dims, is_timed, causal in [(d, d in timed, c) for d in timed + odd for c in (False, True)]:
        problem = plans.from_shape(dims, causal, ctx.dtype)
        cfg, why = plans.choose_config(problem, family, ctx.smem_budget, sms)
        items.append((f"lesson {problem.name}", "lesson", problem, cfg, why, is_timed))
        if ctx.shape and (other := plans.runner_up(problem, family, ctx.smem_budget, sms)):  # a close call: timed
            items.append((f"runner-up {problem.name}", "runner_up", problem, *other, is_timed))
        if (cfg := attention_ws.choose_config(problem, family, ctx.smem_budget, sms)) is not None:
            items.append((f"appendix {problem.name}", "appendix", problem, cfg, "", is_timed))
    return items


def kernels(ctx) -> list:
    """The kernels run() launches (compile-only: the same list, nvcc on the timed ones)."""
    markers = tuple(tourkit.tensor_core_markers(ctx.arch))
    return [tourkit.KernelDecl(name, (lambda p=problem, c=cfg: build(p, c)), pass_configs=pass_configs(cfg),
                               threads=cfg["threads"], nvcc=timed, markers=markers, smem_limit=ctx.smem_budget)
            for name, _, problem, cfg, _, timed in plan(ctx)]


def show_generated(ctx, source: str) -> None:
    """Where the two GEMMs meet: on Hopper the asynchronous wgmma waits, elsewhere the mma.sync loop."""
    for pattern, what in ((r"wait_wgmma<1>", "the FA3 schedule: wait for Q·Kᵀ only, P·V still in flight"),
                          (r"wgmma_rs<", "P·V as a warpgroup MMA, issued and waited by the compiler's pipeline"),
                          (r"mma_sync|mma\.sync", "warp-level tensor-core MMA")):
        if excerpt := tourkit.source_excerpt(source, pattern, context=4, limit=10):
            ctx.log(f"\ngenerated CUDA of the lesson's kernel, {what}:\n" + tourkit.indent(excerpt, "  "))
            return


def run(ctx) -> None:
    items, decls = plan(ctx), kernels(ctx)
    for _, which, problem, cfg, why, timed in items:  # which configuration the rule chose, and why
        if which != "appendix" and timed:
            ctx.log(f"{problem.name}{', runner-up' * (which == 'runner_up')}: {plans.describe(cfg)[0]} tiles, {why}")
    if ctx.compile_only:
        reports = tourkit.inspect_declared(ctx, decls)
        if tourkit.ARCH_SPECS[ctx.arch].family == "hopper":
            ctx.log("TileLang adds a TMA producer warp group to the lesson's kernels (128 threads beyond those "
                    "asked for);\nthe appendix writes that split, its barriers and its register split by hand.")
        show_generated(ctx, reports[decls[0].name].source)
        ctx.headline(kernels=len(reports), arch=ctx.arch)
        return
    if ctx.shape:  # inputs, the float32 reference's copies (K/V expanded to every query head), SDPA's own
        tourkit.require_device_memory(ctx, 48 * math.prod(ctx.shape[:4]), "attention " + "x".join(map(str, ctx.shape)))
    built = tourkit.build_declared(decls, log=ctx.log)
    fns = {name: attention_ws.launcher(built[name]) for name in built}  # split_tail: with its workspace
    problems = list(dict.fromkeys(item[2] for item in items))
    checks = [c for p in problems
              for c in check_attention(p, {which: fns[name] for name, which, q, *_ in items if q == p})]
    ctx.log("\n".join(check.line() for check in checks))
    tourkit.require(checks)

    rows = []
    for problem in list(dict.fromkeys(item[2] for item in items if item[5])):
        suffix = "" if ctx.shape or ctx.quick or problem.seq_len == BENCH_SHAPES[0][2] else f"_S{problem.seq_len}"
        ours = [(which, cfg, fns[name]) for name, which, q, cfg, _, _ in items if q == problem]
        times = bench_attention(problem, {which: fn for which, _, fn in ours})
        best = min((which for which, *_ in ours if which != "appendix"), key=times.get)  # the lesson's number
        if "runner_up" in times:
            ctx.log(f"{problem.name}: the rule's pick timed in turns beside its runner-up: " + (
                "the pick was the faster, it stays" if best == "lesson" else f"the runner-up ran "
                f"{times['lesson'] / times[best]:.2f}x the speed of the pick, it is this problem's configuration"))
        for which, cfg, _ in ours + [("sdpa", None, None)]:
            ratio, rate = tourkit.speedup(times["sdpa"], times[which]), tourkit.tflops(problem.flops, times[which])
            ctx.metric(**{f"{which}_{problem.mode}{suffix}_tflops": rate})
            who = "pytorch" if cfg is None else "appendix" if which == "appendix" else "lesson"  # runner-up: lesson
            ctx.timing(which if cfg else f"SDPA ({times['sdpa_kind']})", times[which], flops=problem.flops,
                       nbytes=problem.nbytes, kind=who, problem=problem.name)
            if which in (best, "appendix"):
                ctx.headline(**{f"{who}_vs_sdpa_{problem.mode}{suffix}": round(ratio, 3)})
            cells = plans.describe(cfg) if cfg else ["-", "-", "-", f"PyTorch {times['sdpa_kind']}"]
            rows.append([problem.size, problem.mode, which.replace("_", "-"), *cells, times[which], rate, f"{ratio:.2f}x"])
    ctx.table(["shape", "mode", "kernel", "tiles", "stages", "threads", "schedule", "ms", "TFLOP/s", "vs SDPA"], rows)
    show_generated(ctx, built[decls[0].name].get_kernel_source())

    if ctx.full and ctx.shape is None:  # the memory argument: the S×S scores cost O(S²) bytes; the kernel its output
        problem = plans.from_shape(FULL_SHAPES[-1], False, ctx.dtype)
        naive, flash = peak_memory(problem, fns[f"lesson {problem.name}"])
        ctx.log(f"\npeak memory beyond the inputs at {problem.size}: naive attention "
                f"{'ran out of memory' if naive < 0 else tourkit.format_bytes(naive)}, the lesson's kernel "
                f"{tourkit.format_bytes(flash)} (the output). Doubling S quadruples the first, doubles the second.")
        ctx.metric(naive_peak_bytes=naive, flash_peak_bytes=flash)


SECTION = tourkit.Section(
    name="flash_attention",
    title="FlashAttention forward: online softmax, causal tiles skipped",
    summary="Q tile in shared memory, pipelined K/V, exp2 online softmax (on Hopper the FA3 schedule; the "
            "appendix's hand-written warp specialization side by side); vs SDPA.",
    run=run,
    kernels=kernels,
)
