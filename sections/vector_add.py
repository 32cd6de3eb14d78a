"""vector_add: the smallest TileLang kernel, and how it maps onto the GPU.

What you learn: how a TileLang kernel is laid out. `T.Kernel(blocks, threads=...)` launches a grid of
blocks; each block owns `block_size = threads * elems_per_thread` consecutive elements. `T.copy` moves the
block's slice of A and B from global memory into registers (`T.alloc_fragment`), `T.Parallel` adds them
element by element, and another `T.copy` writes C. You never write a thread index: TileLang spreads the
block's elements over its threads, gives each thread `elems_per_thread` consecutive elements so that the
loads and stores become 16-byte vector instructions (float4), and predicates the last, partial block, so
any N works. An add reads two numbers and writes one per element: it is bound by memory bandwidth, so
its score is GB/s against what the GPU can move at all (a device-to-device copy, measured here too).
"""

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


# The default first, then the neighbours the table compares. On an H200 (2026-12-02, 2^28 float32) all of
# them move 4.30-4.37 TB/s, level with torch.add and above a plain copy_: one 16-byte access per thread
# and array is enough; more elements per thread do not help a streaming kernel.
SCHEDULES = [AddConfig(256, 4), AddConfig(1024, 4), AddConfig(128, 8), AddConfig(256, 16), AddConfig(512, 8)]
DEFAULT = SCHEDULES[0]


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
    """Sizes that exercise the tail: tiny, not a multiple of the block, not a multiple of the vector width."""
    return [1, 1000, 2**20 + 3] if ctx.quick else [1, 1000, 2**20 + 3, 10**7 + 1]


def bench_size(ctx) -> int:
    """Large enough to fill the GPU and swamp its caches: 2^28 float32 (1 GiB per vector) unless quick,
    capped at a quarter of the device memory for the three vectors."""
    if ctx.quick:
        return 2**24
    n = 2**28
    while 3 * 4 * n > ctx.device.memory_bytes // 4 and n > 2**22:
        n //= 2
    return n


def check(ctx, config: AddConfig, sizes: list[int]) -> list[tourkit.Check]:
    import torch

    checks = []
    for n in sizes:
        kernel = compile_vector_add(n, config)
        a, b = tourkit.random_tensor((n,), torch.float32), tourkit.random_tensor((n,), torch.float32)
        c = torch.empty_like(a)
        # Float32 addition is exact to compare: one rounding, the same in CUDA and in torch.
        result = tourkit.validate(f"vector_add N={n}", lambda: kernel(a, b, c), c, a + b, tolerance=0.0)
        ctx.log(result.line())
        checks.append(result)
    return checks


def benchmark(ctx, n: int) -> None:
    import torch

    a, b = tourkit.random_tensor((n,), torch.float32), tourkit.random_tensor((n,), torch.float32)
    c, c_torch = torch.empty_like(a), torch.empty_like(a)
    nbytes = 3 * n * a.element_size()  # two vectors read, one written
    contenders = {"torch.add(a, b)": lambda: torch.add(a, b, out=c_torch)}
    for config in SCHEDULES:
        kernel = compile_vector_add(n, config)
        tourkit.require([tourkit.validate(f"{config.label()} N={n}", lambda: kernel(a, b, c), c, a + b, 0.0)])
        contenders[config.label()] = (lambda k: lambda: k(a, b, c))(kernel)
    copy_gbps = tourkit.device_copy_gbps()
    ms = tourkit.bench_interleaved(contenders)  # taking turns: the GPU clock drifts
    torch_ms = ms["torch.add(a, b)"]
    rows = []
    for name, t in ms.items():
        config = next((c for c in SCHEDULES if c.label() == name), None)
        bw = tourkit.gbps(nbytes, t)
        rows.append([name, config.block_size if config else "-", -(-n // config.block_size) if config else "-",
                     f"{t:.3f}", f"{bw:.0f}", f"{tourkit.speedup(torch_ms, t):.3f}x", f"{bw / copy_gbps:.1%}"])
    ctx.log(f"\nN = {n} float32 ({tourkit.format_bytes(nbytes)} moved per call); "
            f"device copy (torch copy_) {copy_gbps:.0f} GB/s; timed in turns after {tourkit.SETTLE_MS / 1e3:.1f} s "
            f"of untimed load: 4 rounds, forward and backward")
    ctx.table(["schedule", "block", "blocks", "ms", "GB/s", "vs torch", "of copy"], rows)
    best = min(SCHEDULES, key=lambda cfg: ms[cfg.label()])
    best_gbps = tourkit.gbps(nbytes, ms[best.label()])
    ctx.log(f"best: {best.label()}")
    ctx.headline(gbps=round(best_gbps), vs_torch=round(tourkit.speedup(torch_ms, ms[best.label()]), 3),
                 of_copy=round(best_gbps / copy_gbps, 3))
    ctx.metric(n=n, torch_gbps=round(tourkit.gbps(nbytes, torch_ms)), copy_gbps=round(copy_gbps),
               best_schedule=best.label(), gbps={name: round(tourkit.gbps(nbytes, t)) for name, t in ms.items()})


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
    """Build the aligned and the ragged variant for ctx.arch and show what TileLang generated."""
    reports = tourkit.inspect_kernels([(f"vector_add N={n}", vector_add_program(n), ctx.arch) for n in (2**20, 2**20 + 3)])
    tourkit.report_kernels(ctx, reports, {r.name: DEFAULT.threads for r in reports})
    for report in reports:
        if report.nvcc.startswith("failed"):
            raise tourkit.ValidationError(f"{report.name}: nvcc {report.nvcc}")
    aligned, ragged = reports
    if "float4" not in aligned.source:
        raise tourkit.ValidationError("vector_add: expected 16-byte float4 accesses in the generated CUDA")
    if str(2**20 + 3) not in ragged.source:
        raise tourkit.ValidationError("vector_add: expected a bounds predicate (N) for the ragged size")
    show_generated_code(ctx, aligned.source)
    ctx.headline(arch=ctx.arch, threads=aligned.threads, grid=aligned.grid[0])


def prepare(ctx, log=None) -> None:
    """Every kernel this lesson launches, compiled at once (the compiles in run() then come from the cache)."""
    tourkit.compile_many([vector_add_program(size) for size in check_sizes(ctx) + [2**20]]
                         + [vector_add_program(bench_size(ctx), config) for config in SCHEDULES], log=log)


def run(ctx) -> None:
    if ctx.compile_only:
        compile_only(ctx)
        return
    n = bench_size(ctx)
    prepare(ctx, log=ctx.log)
    ctx.log(f"grid: ceil(N / {DEFAULT.block_size}) blocks of {DEFAULT.threads} threads, "
            f"{DEFAULT.elems_per_thread} consecutive float32 per thread (one 16-byte access per array)")
    tourkit.require(check(ctx, DEFAULT, check_sizes(ctx)))
    show_generated_code(ctx, compile_vector_add(2**20).get_kernel_source())
    benchmark(ctx, n)


SECTION = Section(
    name="vector_add",
    title="Vector add: blocks, threads and vectorized memory access",
    summary="C = A + B in TileLang: T.Kernel grid, T.copy to registers, T.Parallel; GB/s vs torch and a copy.",
    run=run,
    prepare=prepare,
)
