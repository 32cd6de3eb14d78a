"""flash_attention: attention that never writes the S×S score matrix, as fast as PyTorch's SDPA.

You will learn:
* the FlashAttention forward pass: a block keeps `block_M` query rows of one (batch, head) in shared memory
  and streams K and V tiles of `block_N` keys through a `T.Pipelined` loop, two `T.gemm`s per tile;
* the online softmax: a running row max m and row sum l, O rescaled whenever m grows: O(S·d) memory, not O(S²);
* the softmax scale folded into `exp2`, so each score costs one FMA;
* causal attention at half the work (tiles past the diagonal never loaded, only the diagonal tile masked),
  and odd lengths (loads past the end read zeros, the last key tile masks its columns);
* on Hopper, the FA3 schedule: S(k) = Q·K(k)ᵀ and P(k-1)·V(k-1) in flight together, the softmax in between.

The algorithm (scale = log2(e)/√d; per query block m = -inf, l = 0, O = 0):

    for each query block Q:
        for each key block K, V (causal: up to the diagonal; mask the diagonal block):
            S = Q Kᵀ · scale
            m_new = max(m, rowmax S);  P = exp2(S - m_new)
            l = l · exp2(m - m_new) + rowsum P
            O = O · exp2(m - m_new) + P V;  m = m_new
        O /= l

Layout is (batch, seq, heads, dim), BSHD, in fp16 with float32 accumulation. On Hopper the section times the
appendix kernel (`sections/hopper/attention_ws.py`, warp specialization by hand) beside this lesson's and SDPA.
"""

import math

import tilelang
import tilelang.language as T

import tourkit
from sections.hopper import attention_ws  # the appendix: its kernel is built and timed beside this lesson's
from tourkit import Section

LOG2E = 1.4426950408889634
HEAD_DIMS = (64, 128)
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


def flash_attention_forward(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *, block_M: int = 128,
                            block_N: int = 128, num_stages: int = 2, threads: int = 256, heavy_first: bool = False,
                            dtype: str = "float16"):
    """The forward kernel for one problem and one tile configuration: T.Pipelined infers the software pipeline
    from `num_stages` (later K/V loads run ahead of this tile's math). heavy_first=True (causal): the last query
    blocks, which have the most key tiles, launch first, so that the short ones fill the tail of the grid."""
    shape = (batch, seq_len, heads, dim)
    n_tiles, n_query_blocks, start, online_softmax, finish = kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                          seq_len % block_N != 0)

    @T.prim_func
    def flash_attention_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                            O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = alloc_buffers(
                block_M, block_N, dim, dtype)

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            # Causal: key tiles that start after this block's last query row are all masked: never visit them.
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            for k in T.Pipelined(last, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s)
                T.gemm(Q_s, K_s, scores, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(scores, k, bx, m, m_prev, rescale, row_sum, l)
                T.copy(scores, probs)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= rescale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by, :], V_s)
                T.gemm(probs, V_s, acc_o, policy=T.GemmWarpPolicy.FullRow)
            finish(O, O_s, acc_o, l, bx, by, bz)

    return flash_attention_fwd


def flash_attention_forward_async(batch: int, heads: int, seq_len: int, dim: int, causal: bool, *,
                                  block_M: int = 128, block_N: int = 128, num_stages: int = 2, threads: int = 256,
                                  heavy_first: bool = False, dtype: str = "float16"):
    """Hopper: the FlashAttention-3 schedule in the same T.Pipelined loop. `T.wgmma_gemm` issues a warpgroup MMA
    and does not wait; `T.wait_wgmma(n)` waits until at most n are in flight. Iteration k issues S(k) = Q·K(k)ᵀ
    and O += P(k-1)·V(k-1), waits for the first only, runs the softmax of S(k) while P·V still runs, then waits,
    rescales O and turns S(k) into the next P. TileLang splits the block into a TMA producer and consumers."""
    shape = (batch, seq_len, heads, dim)
    # mask_tail always: the ragged last tile, and the extra all-masked iteration k = n_tiles below
    n_tiles, n_query_blocks, start, online_softmax, finish = kernel_steps(seq_len, dim, block_M, block_N, causal,
                                                                          True)

    @T.prim_func
    def flash_attention_fwd_async(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                                  O: T.Tensor(shape, dtype)):
        with T.Kernel(n_query_blocks, heads, batch, threads=threads) as (launch_x, by, bz):
            bx = n_query_blocks - 1 - launch_x if heavy_first else launch_x
            Q_s, K_s, V_s, O_s, scores, probs, acc_o, m, m_prev, rescale, row_sum, l = alloc_buffers(
                block_M, block_N, dim, dtype)
            touch = T.alloc_local((1,), dtype)

            start(Q, Q_s, acc_o, l, m, bx, by, bz)
            last = T.min(n_tiles, T.ceildiv((bx + 1) * block_M, block_N)) if causal else n_tiles
            T.fill(probs, 0)
            # One extra iteration finishes the last P·V, branch-free (ptxas serializes the asynchronous MMAs
            # when it cannot prove which wait retires which MMA): at k = 0, P = 0 meets V(-1) (zeros), and at
            # k = last every score is masked, which leaves m and l unchanged.
            for k in T.Pipelined(last + 1, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by, :], K_s)
                T.copy(V[bz, (k - 1) * block_N:k * block_N, by, :], V_s)
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


# Choosing a configuration: a table on Hopper, shared memory elsewhere

# Hopper, keyed by (causal, head dim): the fastest of the kernels above in turns with SDPA. Full: 176-wide key
# tiles (the async kernel's O reuses the K/V buffers, so two stages fit); causal: 128-wide tiles (a finer
# diagonal), heaviest blocks first. Fast math: exp2f becomes a bare ex2.approx (no denormal fix-up).
HOPPER_CONFIGS = {
    (False, 128): dict(kind="async", block_M=128, block_N=176, num_stages=2, threads=256, fast_math=True),
    (True, 128): dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True,
                      heavy_first=True),
    (False, 64): dict(kind="pipelined", block_M=128, block_N=128, num_stages=2, threads=256),
    (True, 64): dict(kind="async", block_M=128, block_N=128, num_stages=2, threads=256, fast_math=True,
                     heavy_first=True),
}
# Ampere/Ada/Turing (or a Hopper budget too small for the table): no wgmma; the largest tiles that fit.
OTHER_CANDIDATES = [(128, 128, 2), (128, 128, 1), (128, 64, 2), (128, 64, 1), (64, 64, 2), (64, 64, 1)]


def smem_estimate(dim: int, block_M: int, block_N: int, num_stages: int, output_reuses_kv: bool = False) -> int:
    """Bytes of shared memory (fp16): Q, `num_stages` K and V tiles, O. With `output_reuses_kv` O takes the
    K/V buffers after the loop (TileLang's planner in its Hopper kernels); otherwise an upper bound."""
    kv_tiles = 2 * num_stages * block_N
    return 2 * dim * (block_M + kv_tiles + (max(0, block_M - kv_tiles) if output_reuses_kv else block_M))


def choose_config(dim: int, causal: bool, family: str, smem_budget: int) -> dict:
    """The lesson's kernel for a GPU: Hopper's table entry when it fits, else the first candidate that fits."""
    cfg = HOPPER_CONFIGS.get((causal, dim)) if family == "hopper" else None
    if cfg and smem_estimate(dim, cfg["block_M"], cfg["block_N"], cfg["num_stages"],
                             cfg["kind"] == "async") <= smem_budget:
        return dict(cfg)
    for block_M, block_N, stages in OTHER_CANDIDATES:
        if causal and stages > 1:
            continue  # tilelang 0.1.15: a cp.async pipeline over the clamped (data-dependent) bound fails codegen
        if smem_estimate(dim, block_M, block_N, stages) <= smem_budget:
            return dict(kind="pipelined", block_M=block_M, block_N=block_N, num_stages=stages,
                        threads=256 if block_M == 128 else 128)
    raise ValueError(f"flash_attention: no tile configuration fits {smem_budget} bytes of shared memory "
                     f"for head dim {dim}")


def build(batch, heads, seq_len, dim, causal, cfg: dict):
    """The prim_func of a configuration: this lesson's kernels, or the appendix's hand-written one ("ws")."""
    if cfg["kind"] == "ws":
        return attention_ws.build(batch, heads, seq_len, dim, causal, cfg)
    builder = {"pipelined": flash_attention_forward, "async": flash_attention_forward_async}[cfg["kind"]]
    kwargs = {k: v for k, v in cfg.items() if k not in ("kind", "fast_math")}
    return builder(batch, heads, seq_len, dim, causal, **kwargs)


def pass_configs(cfg: dict) -> dict:
    return {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} if cfg.get("fast_math") else {}


WORDS = {"pipelined": "compiler pipeline", "async": "FA3 async wgmma", "ws": "hand-written warp specialization",
         "persistent": "persistent", "split_tail": "last wave split along the keys", "heavy_first": "heaviest first",
         "stage_output": "O stored by TMA", "fast_math": "fast math"}


def describe(cfg: dict) -> list:
    """Table cells: tiles, stages, threads, schedule."""
    notes = [WORDS[cfg["kind"]]] + [word for key, word in WORDS.items() if cfg.get(key) is True]
    return [f"{cfg['block_M']}x{cfg['block_N']}", cfg["num_stages"], cfg["threads"], ", ".join(notes)]


# The reference, the check, the benchmark


def sdpa_bshd(q, k, v, causal: bool):
    """PyTorch's scaled_dot_product_attention on BSHD tensors (it wants BHSD: transpose in and out)."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=causal).transpose(1, 2)


def check_attention(batch, heads, seq_len, dim, causal, kernels: dict) -> list:
    """Each kernel's error against a float32 reference on fresh random inputs, within 2x of PyTorch's fp16."""
    import torch

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    ref = sdpa_bshd(q.float(), k.float(), v.float(), causal)
    torch_error = tourkit.relative_error(sdpa_bshd(q, k, v, causal), ref)
    o, mode = torch.empty_like(q), "causal" if causal else "full"
    return [tourkit.validate(f"{name} B{batch} H{heads} S{seq_len} D{dim} {mode} (torch fp16: {torch_error:.2e})",
                             lambda: attention(q, k, v, o), o, ref, 2.0 * torch_error)
            for name, attention in kernels.items()]


def attention_flops(batch, heads, seq_len, dim, causal) -> float:
    return 4.0 * batch * heads * seq_len * seq_len * dim * (0.5 if causal else 1.0)


def bench_attention(batch, heads, seq_len, dim, causal, kernels: dict, rounds: int = 2) -> dict:
    """Median ms of each kernel and of SDPA ("sdpa"), timed in turns in one bench_interleaved call."""
    import torch
    import torch.nn.functional as F

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    o = torch.empty_like(q)
    # SDPA timed on its preferred contiguous BHSD layout: the strongest baseline, whatever backend it picks.
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    contenders = {name: (lambda fn=fn: fn(q, k, v, o)) for name, fn in kernels.items()}
    contenders["sdpa"] = lambda: F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return tourkit.bench_interleaved(contenders, rounds=rounds)


def peak_memory(batch, heads, seq_len, dim, attention) -> tuple[int, int]:
    """Peak bytes allocated beyond the inputs: naive attention (S×S scores materialized) vs the kernel."""
    import torch

    q, k, v = (tourkit.random_tensor((batch, seq_len, heads, dim), torch.float16) for _ in range(3))
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    try:  # the scores and the probabilities, B·H·S² each (P·V adds only the output)
        torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(dim)), dim=-1)
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
# Odd lengths (a ragged last key tile and query tile), both head dims: correctness only, small and quick.
ODD_PROBLEMS = [(2, 4, 1000, 64, True), (2, 4, 1000, 64, False), (1, 3, 777, 128, True), (1, 3, 777, 128, False)]


def plan(ctx) -> list:
    """(name, kernel, problem, configuration, timed) of each kernel built: the lesson's, on Hopper the appendix's."""
    family = tourkit.ARCH_SPECS[ctx.arch].family
    sms = ctx.device.sm_count if ctx.device is not None and not ctx.compile_only else None
    shapes = QUICK_SHAPES if ctx.quick else (FULL_SHAPES if ctx.full else BENCH_SHAPES)
    problems = [((*shape, causal), True) for shape in shapes for causal in (False, True)]
    items = []
    for problem, timed in problems + [(p, False) for p in (ODD_PROBLEMS[::3] if ctx.quick else ODD_PROBLEMS)]:
        (batch, heads, seq_len, dim, causal), mode = problem, "causal" if problem[4] else "full"
        for which, cfg in (("lesson", choose_config(dim, causal, family, ctx.smem_budget)),
                           ("appendix", attention_ws.choose_config(dim, causal, family, ctx.smem_budget, sms))):
            if cfg is not None:
                items.append((f"{which} B{batch} H{heads} S{seq_len} D{dim} {mode}", which, problem, cfg, timed))
    return items


def kernels(ctx) -> list:
    """The kernels run() launches (compile-only: the same list, nvcc on the timed ones)."""
    markers = tuple(tourkit.TENSOR_CORE_MARKERS[tourkit.ARCH_SPECS[ctx.arch].family])
    return [tourkit.KernelDecl(name, (lambda p=problem, c=cfg: build(*p, c)), pass_configs=pass_configs(cfg),
                               threads=cfg["threads"], nvcc=timed, markers=markers, smem_limit=ctx.smem_budget)
            for name, _, problem, cfg, timed in plan(ctx)]


def show_generated(ctx, source: str) -> None:
    """Where the two GEMMs meet: on Hopper the asynchronous wgmma waits, elsewhere the mma.sync loop."""
    for pattern, what in ((r"wait_wgmma<1>", "the FA3 schedule: wait for Q·Kᵀ only, P·V still in flight"),
                          (r"mma_sync|mma\.sync", "warp-level tensor-core MMA")):
        if excerpt := tourkit.source_excerpt(source, pattern, context=4, limit=10):
            ctx.log(f"\ngenerated CUDA of the lesson's kernel, {what}:\n" + tourkit.indent(excerpt, "  "))
            return


def run(ctx) -> None:
    items, decls = plan(ctx), kernels(ctx)
    if ctx.compile_only:
        reports = tourkit.inspect_declared(ctx, decls)
        if tourkit.ARCH_SPECS[ctx.arch].family == "hopper":
            ctx.log("TileLang adds a TMA producer warp group to the lesson's kernels (384 threads where 256 were "
                    "asked for);\nthe appendix writes that split, its barriers and its register split by hand.")
        show_generated(ctx, reports[decls[0].name].source)
        ctx.headline(kernels=len(reports), arch=ctx.arch)
        return
    built = tourkit.build_declared(decls, log=ctx.log)
    fns = {name: attention_ws.launcher(built[name]) for name in built}  # split_tail: with its workspace
    problems = list(dict.fromkeys(problem for _, _, problem, _, _ in items))
    checks = [c for p in problems for c in check_attention(*p, {w: fns[n] for n, w, q, _, _ in items if q == p})]
    ctx.log("\n".join(check.line() for check in checks))
    tourkit.require(checks)

    rows = []
    for problem in [p for p in problems if any(q == p and timed for _, _, q, _, timed in items)]:
        batch, heads, seq_len, dim, causal = problem
        mode, flops = "causal" if causal else "full", attention_flops(*problem)
        suffix = "" if seq_len == BENCH_SHAPES[0][2] or ctx.quick else f"_S{seq_len}"
        ours = [(which, cfg, fns[name]) for name, which, q, cfg, _ in items if q == problem]
        times = bench_attention(*problem, {which: fn for which, _, fn in ours})
        for which, cfg, _ in ours + [("sdpa", None, None)]:
            ratio, rate = tourkit.speedup(times["sdpa"], times[which]), tourkit.tflops(flops, times[which])
            ctx.metric(**{f"{which}_{mode}{suffix}_tflops": rate})
            if cfg is not None:
                ctx.headline(**{f"{which}_vs_sdpa_{mode}{suffix}": round(ratio, 3)})
            cells = describe(cfg) if cfg else ["-", "-", "-", "PyTorch SDPA"]
            rows.append([f"B{batch} H{heads} S{seq_len} D{dim}", mode, which, *cells, times[which], rate, f"{ratio:.2f}x"])
    ctx.table(["shape", "mode", "kernel", "tiles", "stages", "threads", "schedule", "ms", "TFLOP/s", "vs SDPA"], rows)
    show_generated(ctx, built[decls[0].name].get_kernel_source())

    if ctx.full:  # the memory argument: the S×S scores cost O(S²) bytes; the kernel nothing beyond its output
        batch, heads, seq_len, dim = FULL_SHAPES[-1]
        naive, flash = peak_memory(batch, heads, seq_len, dim, fns[f"lesson B{batch} H{heads} S{seq_len} D{dim} full"])
        ctx.log(f"\npeak memory beyond the inputs at B{batch} H{heads} S{seq_len} D{dim}: naive attention "
                f"{'ran out of memory' if naive < 0 else tourkit.format_bytes(naive)}, the lesson's kernel "
                f"{tourkit.format_bytes(flash)} (the output). Doubling S quadruples the first, doubles the second.")
        ctx.metric(naive_peak_bytes=naive, flash_peak_bytes=flash)


SECTION = Section(
    name="flash_attention",
    title="FlashAttention forward: online softmax, causal tiles skipped",
    summary="Q tile in shared memory, pipelined K/V, exp2 online softmax (on Hopper the FA3 schedule; the "
            "appendix's hand-written warp specialization side by side); vs SDPA.",
    run=run,
    kernels=kernels,
)
