"""vector_add: the smallest TileLang kernel, and how it maps onto the GPU.

You will learn:
* how a TileLang kernel is laid out: `T.Kernel(blocks, threads=...)` launches a grid of blocks, each owning
  `block_size = threads * elems_per_thread` consecutive elements;
* how `T.copy` into registers (`T.alloc_fragment`) and `T.Parallel` stand in for thread indices: TileLang
  gives each thread `elems_per_thread` consecutive elements, so loads and stores become 16-byte vectors
  (float4), and predicates the last, partial block, so any N works;
* how to score a memory-bound kernel (two numbers read, one written per element): GB/s against torch.add
  and a device-to-device copy, the most the memory can move, timed in turns.

    for each block bx, in parallel:           # T.Kernel(ceil(N / block), threads=...)
        a = A[bx·block : (bx+1)·block]        # T.copy to registers; elements past N are not loaded
        b = B[bx·block : (bx+1)·block]
        a = a + b                             # T.Parallel: element by element
        C[bx·block : (bx+1)·block] = a        # T.copy back; elements past N are not stored
"""

import functools
from dataclasses import dataclass

import tilelang
import tilelang.language as T

import tourkit
from tourkit import Section


@dataclass(frozen=True)
class AddConfig:
    threads: int
    elems_per_thread: int

    @property
    def block_size(self) -> int:
        return self.threads * self.elems_per_thread

    def label(self) -> str:
        return f"{self.threads} threads x {self.elems_per_thread} elems"


# The default first, then two neighbours the table compares it with. A streaming kernel needs one 16-byte
# access per thread and array (4 float32) to keep the memory busy; more threads per block or more elements
# per thread change the grid, not the bandwidth, and the table shows it.
SCHEDULES = [AddConfig(256, 4), AddConfig(1024, 4), AddConfig(128, 8)]
DEFAULT = SCHEDULES[0]
ROUNDS = 2  # one forward and backward pair: the verdict (level with torch.add and a copy) needs no more


# ---------------------------------------------------------------------------------------------------------
# The kernel
# ---------------------------------------------------------------------------------------------------------


def vector_add_program(N: int, config: AddConfig = DEFAULT, dtype: str = "float32"):
    """C = A + B over N elements, one block per `config.block_size` elements."""
    if not isinstance(N, int) or N <= 0:
        raise ValueError(f"vector length N={N!r} must be a positive integer")
    block = config.block_size

    @T.prim_func
    def vector_add(A: T.Tensor((N,), dtype), B: T.Tensor((N,), dtype), C: T.Tensor((N,), dtype)):
        with T.Kernel(T.ceildiv(N, block), threads=config.threads) as bx:
            a = T.alloc_fragment((block,), dtype)  # registers: elems_per_thread values per thread
            b = T.alloc_fragment((block,), dtype)
            T.copy(A[bx * block], a)  # out-of-range elements of the last block are not loaded
            T.copy(B[bx * block], b)
            for i in T.Parallel(block):
                a[i] = a[i] + b[i]
            T.copy(a, C[bx * block])  # ... nor stored

    return vector_add


def compile_vector_add(N: int, config: AddConfig = DEFAULT, dtype: str = "float32"):
    """The kernel for the local GPU, called as kernel(a, b, c): it writes the caller's c."""
    return tilelang.compile(vector_add_program(N, config, dtype), out_idx=None, target="cuda")


# ---------------------------------------------------------------------------------------------------------
# Check and benchmark
# ---------------------------------------------------------------------------------------------------------


def check_sizes(ctx) -> list[int]:
    """Sizes that exercise the tail: tiny, not a multiple of the block, not a multiple of the vector width
    (with --shape N: N itself)."""
    if ctx.shape:
        return [ctx.shape[0]]
    return [1, 1000, 2**20 + 3] if ctx.quick else [1, 1000, 2**20 + 3, 10**7 + 1]


def bench_size(ctx) -> int:
    """Large enough to fill the GPU and swamp its caches: 2^28 float32 (1 GiB per vector) unless quick,
    capped at a quarter of the device memory for the three vectors. With --shape N: N."""
    if ctx.shape:
        return ctx.shape[0]
    if ctx.quick:
        return 2**24
    n = 2**28
    while 3 * 4 * n > ctx.device.memory_bytes // 4 and n > 2**22:
        n //= 2
    return n


def kernels(ctx) -> list[tourkit.KernelDecl]:
    """Compile-only: an aligned and a ragged size. A run: the checked sizes (default schedule) and the
    benchmark size in every schedule of the table."""
    if ctx.compile_only:
        jobs = [(n, DEFAULT) for n in ([ctx.shape[0]] if ctx.shape else (2**20, 2**20 + 3))]
    else:
        jobs = [(n, DEFAULT) for n in check_sizes(ctx)] + [(bench_size(ctx), c) for c in SCHEDULES]
    return [tourkit.KernelDecl(kernel_name(n, c), functools.partial(vector_add_program, n, c), threads=c.threads)
            for n, c in dict.fromkeys(jobs)]  # with --shape N the checked size is also the benchmark's


def kernel_name(n: int, config: AddConfig) -> str:
    return f"vector_add N={n} {config.label()}"


def check(ctx, kernels: dict, sizes: list[int]) -> list[tourkit.Check]:
    import torch

    checks = []
    for n in sizes:
        kernel = kernels[kernel_name(n, DEFAULT)]
        a, b = tourkit.random_tensor((n,), torch.float32), tourkit.random_tensor((n,), torch.float32)
        c = torch.empty_like(a)
        # Float32 addition is exact to compare: one rounding, the same in CUDA and in torch.
        result = tourkit.validate(f"vector_add N={n}", lambda: kernel(a, b, c), c, a + b, tolerance=0.0)
        ctx.log(result.line())
        checks.append(result)
    return checks


def benchmark(ctx, kernels: dict, n: int) -> None:
    """Every schedule, torch.add and a copy of one vector (a.copy_: the memory's ceiling at this size) in one
    bench_interleaved call, taking turns: the GPU clock drifts."""
    import torch

    a, b = tourkit.random_tensor((n,), torch.float32), tourkit.random_tensor((n,), torch.float32)
    c, c_torch, c_copy = torch.empty_like(a), torch.empty_like(a), torch.empty_like(a)
    contenders = {"torch.add(a, b)": lambda: torch.add(a, b, out=c_torch), "copy_(a)": lambda: c_copy.copy_(a)}
    for config in SCHEDULES:
        kernel = kernels[kernel_name(n, config)]
        tourkit.require([tourkit.validate(f"{config.label()} N={n}", lambda: kernel(a, b, c), c, a + b, 0.0)])
        contenders[config.label()] = functools.partial(kernel, a, b, c)
    ms = tourkit.bench_interleaved(contenders, rounds=ROUNDS, warmup_ms=10.0, rep_ms=50.0)
    nbytes = 3 * n * a.element_size()  # two vectors read, one written
    copy_bytes = 2 * n * a.element_size()  # one read, one written
    gbps = {name: tourkit.gbps(copy_bytes if name == "copy_(a)" else nbytes, t) for name, t in ms.items()}
    torch_ms, copy_gbps = ms["torch.add(a, b)"], gbps["copy_(a)"]
    for name, t in ms.items():  # for the plots: one addition per element; the copy is the memory's ceiling
        kind = {"copy_(a)": "copy", "torch.add(a, b)": "pytorch"}.get(name, "lesson")
        ctx.timing(name, t, flops=None if kind == "copy" else n, nbytes=copy_bytes if kind == "copy" else nbytes,
                   kind=kind, problem=f"N={n}")
    rows = []
    for name, t in ms.items():
        config = next((c for c in SCHEDULES if c.label() == name), None)
        grid = [config.threads, config.elems_per_thread, config.block_size, -(-n // config.block_size)] if config else \
            ["-"] * 4
        rows.append([name, *grid, f"{t:.3f}", f"{gbps[name]:.0f}", f"{torch_ms / t:.3f}x",
                     f"{gbps[name] / copy_gbps:.1%}"])
    ctx.log(f"\nN = {n} float32 ({tourkit.format_bytes(nbytes)} moved per call); timed in turns after "
            f"{tourkit.SETTLE_MS / 1e3:.1f} s of untimed load, {ROUNDS} rounds (forward and backward)")
    ctx.table(["kernel", "threads", "elems/thread", "block", "blocks", "ms", "GB/s", "vs torch.add", "of copy"], rows)
    best = min(SCHEDULES, key=lambda cfg: ms[cfg.label()])
    best_gbps = gbps[best.label()]
    ctx.log(f"fastest schedule: {best.label()}")
    ctx.headline(gbps=round(best_gbps), vs_torch=round(tourkit.speedup(torch_ms, ms[best.label()]), 3),
                 of_copy=round(best_gbps / copy_gbps, 3))
    ctx.metric(n=n, torch_gbps=round(gbps["torch.add(a, b)"]), copy_gbps=round(copy_gbps), best_schedule=best.label(),
               gbps={name: round(value) for name, value in gbps.items()})


def show_generated_code(ctx, source: str) -> None:
    excerpt = tourkit.source_excerpt(source, r"float4", context=3, limit=12)
    if excerpt:
        ctx.log("\nThe core of the generated CUDA for N a multiple of the block: 16-byte (float4) loads and stores.")
        ctx.log("(For other N the copies carry a bounds predicate per element and fall back to scalar accesses.)")
        ctx.log(tourkit.indent(excerpt, "  | "))


# ---------------------------------------------------------------------------------------------------------
# The lesson
# ---------------------------------------------------------------------------------------------------------


def compile_only(ctx) -> None:
    """The aligned and the ragged variant for ctx.arch, and what TileLang generated."""
    if ctx.shape:  # the user's N: whatever TileLang made of it
        (report,) = tourkit.inspect_declared(ctx, kernels(ctx)).values()
        aligned = ctx.shape[0] % DEFAULT.block_size == 0
        ctx.log(f"N = {ctx.shape[0]}: {'a multiple of' if aligned else 'not a multiple of'} the block "
                f"({DEFAULT.block_size}): {'no predicates' if aligned else 'the last block is predicated'}")
        show_generated_code(ctx, report.source)
        ctx.headline(arch=ctx.arch, threads=report.threads, grid=report.grid[0])
        return
    aligned, ragged = tourkit.inspect_declared(ctx, kernels(ctx)).values()
    if "float4" not in aligned.source:
        raise tourkit.ValidationError("vector_add: expected 16-byte float4 accesses in the generated CUDA")
    if str(2**20 + 3) not in ragged.source:
        raise tourkit.ValidationError("vector_add: expected a bounds predicate (N) for the ragged size")
    show_generated_code(ctx, aligned.source)
    ctx.headline(arch=ctx.arch, threads=aligned.threads, grid=aligned.grid[0])


def run(ctx) -> None:
    if ctx.compile_only:
        compile_only(ctx)
        return
    n = bench_size(ctx)
    tourkit.require_device_memory(ctx, 5 * 4 * n, f"N={n} (five float32 vectors: inputs, outputs, the copy's)")
    kernels_ = tourkit.build_declared(kernels(ctx), log=ctx.log)
    ctx.log(f"grid: ceil(N / {DEFAULT.block_size}) blocks of {DEFAULT.threads} threads, "
            f"{DEFAULT.elems_per_thread} consecutive float32 per thread (one 16-byte access per array)")
    tourkit.require(check(ctx, kernels_, check_sizes(ctx)))
    show_generated_code(ctx, kernels_[kernel_name(n, DEFAULT)].get_kernel_source())
    benchmark(ctx, kernels_, n)


SECTION = Section(
    name="vector_add",
    title="Vector add: blocks, threads and vectorized memory access",
    summary="C = A + B in TileLang: T.Kernel grid, T.copy to registers, T.Parallel; GB/s vs torch and a copy.",
    run=run,
    kernels=kernels,
)
