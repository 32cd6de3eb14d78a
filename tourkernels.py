"""Building and inspecting kernels: the declared kernels of a section, compiled at once or lowered for an
architecture, and what the generated CUDA shows (instruction markers, shared memory, launch shape).

Reached through tourkit (`tourkit.build_declared`, `tourkit.inspect_declared`, ...), which forwards these
names, so sections and tests use one kit. tilelang and tvm are imported inside the functions.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from tourkit import ARCH_SPECS, TourContext, ValidationError, check_arch, find_nvcc, format_bytes, one_line, wait_until_untimed

# ---------------------------------------------------------------------------------------------------------
# Codegen inspection: what TileLang generated for an architecture
# ---------------------------------------------------------------------------------------------------------

# name -> (pattern counted in the CUDA source, what it means)
MARKERS: dict[str, tuple[str, str]] = {
    "wgmma": (r"wgmma", "Hopper warpgroup tensor-core MMA (sm_90a)"),
    "mma_sync": (r"mma_sync|mma\.sync", "warp-level tensor-core MMA (Ampere/Ada style)"),
    "tma_load": (r"tma_load", "TMA bulk tensor copy global->shared (Hopper copy engine)"),
    "cp_async": (r"cp_async|cp\.async", "asynchronous global->shared copy (Ampere+)"),
    "ldmatrix": (r"ldmatrix", "shared->register matrix fragment load for tensor cores"),
    # TileLang's own pipelines name the array `mbarrier`; T.alloc_barrier declares `Barrier` arrays.
    "mbarrier": (r"mbarrier|reinterpret_cast<Barrier\*>", "transaction barrier (TMA completion, producer/consumer sync)"),
    "__syncthreads": (r"__syncthreads", "block-wide barrier"),
    "rasterization": (r"rasterization", "L2-friendly block rasterization (T.use_swizzle)"),
}


# What a tensor-core kernel (GEMM, fused GEMM, attention) must show per architecture family: Hopper's wgmma fed
# by TMA under mbarriers; Ampere/Ada's mma.sync fed by cp.async and ldmatrix; Turing has no cp.async.
TENSOR_CORE_MARKERS: dict[str, list[str]] = {
    "hopper": ["wgmma", "tma_load", "mbarrier"],
    "ampere": ["cp_async", "ldmatrix", "mma_sync"],
    "ada": ["cp_async", "ldmatrix", "mma_sync"],
    "turing": ["ldmatrix", "mma_sync"],
}


def tensor_core_markers(arch: str) -> list[str]:
    """What a tensor-core kernel built for `arch` must show: its family's markers, except on Blackwell, where
    TileLang feeds the Ampere-style mma.sync with TMA copies under mbarriers instead of cp.async."""
    spec = ARCH_SPECS[arch]
    return ["tma_load", "mbarrier", "mma_sync"] if spec.capability >= (10, 0) else TENSOR_CORE_MARKERS[spec.family]


def count_markers(source: str) -> dict[str, int]:
    return {name: len(re.findall(pattern, source)) for name, (pattern, _) in MARKERS.items()}


def cuda_target(arch: str):
    from tvm.target import Target

    return Target({"kind": "cuda", "arch": check_arch(arch)})


_STATIC_SMEM = re.compile(r"__shared__\s+(?:__align__\(\d+\)\s+)?(\w+)\s+(\w+)\[(\d+)\]")
_SCALAR_BYTES = {"uint64_t": 8, "int64_t": 8, "double": 8, "float": 4, "int": 4, "uint": 4, "uint32_t": 4,
                 "half_t": 2, "half": 2, "bfloat16_t": 2, "uchar": 1, "char": 1, "signed char": 1}


@dataclass
class KernelReport:
    """What one kernel looks like for one architecture, without running it."""

    name: str
    arch: str
    markers: dict[str, int]
    dynamic_smem_bytes: int
    static_smem_bytes: int
    threads: int  # threads per block as launched (warp specialization can add producer warps)
    grid: tuple[int, int, int]
    nvcc: str  # "compiled", "not run (nvcc not found)", "lowered only" (nvcc not run, to save time), "failed: ..."
    source: str = ""
    # From ptxas (-v) when nvcc ran: registers per thread (the most any entry function uses) and the bytes of
    # register spills to local memory (stores, loads), which on the hot path of a tile kernel cost bandwidth.
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None

    @property
    def spills(self) -> str:
        """"-" when nvcc did not run, "0" without spills, else "<stores>/<loads> B"."""
        if self.spill_stores is None:
            return "-"
        if not (self.spill_stores or self.spill_loads):
            return "0"
        return f"{self.spill_stores}/{self.spill_loads} B"

    @property
    def smem_bytes(self) -> int:
        return self.dynamic_smem_bytes + self.static_smem_bytes

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch, "markers": self.markers, "smem_bytes": self.smem_bytes,
                "threads": self.threads, "grid": list(self.grid), "nvcc": self.nvcc, "registers": self.registers,
                "spill_stores": self.spill_stores, "spill_loads": self.spill_loads}


def _launch_shape(device_mod) -> tuple[int, tuple[int, int, int], int]:
    threads, grid, dyn = 1, [1, 1, 1], 0
    for _, func in device_mod.functions.items():
        attrs = func.attrs
        if attrs is None:
            continue
        if "dyn_shared_memory_buf" in attrs:
            dyn = max(dyn, int(attrs["dyn_shared_memory_buf"]))
        if "thread_extent" in attrs:
            t, g = 1, [1, 1, 1]
            for tag, extent in attrs["thread_extent"].items():
                if "threadIdx" in str(tag):
                    t *= int(extent)
                elif "blockIdx" in str(tag):
                    g["xyz".index(str(tag)[-1])] = int(extent)
            threads, grid = max(threads, t), g
    return threads, (grid[0], grid[1], grid[2]), dyn


def static_smem_bytes(source: str) -> int:
    total = 0
    for ctype, _, count in _STATIC_SMEM.findall(source):
        total += _SCALAR_BYTES.get(ctype, 4) * int(count)
    return total


def lower_for_arch(func, arch: str, pass_configs: dict[str, Any] | None = None):
    """Lower a TileLang prim_func to CUDA source for `arch` (no GPU, no nvcc needed)."""
    import tilelang
    import tvm

    target = cuda_target(arch)
    with tvm.transform.PassContext(config=dict(pass_configs or {})), target:
        return tilelang.lower(func, target=target)


def compile_for_arch(func, arch: str, pass_configs: dict[str, Any] | None = None, out_idx=None):
    """Compile a prim_func with nvcc for `arch` (no GPU needed); returns the JITKernel."""
    import tilelang

    target = cuda_target(arch)
    with target:
        return tilelang.compile(func, out_idx=out_idx, target=target, pass_configs=dict(pass_configs or {}))


def compile_many(programs, *, target="cuda", out_idx=None, pass_configs: dict[str, Any] | None = None,
                 log: Callable[[str], None] | None = None) -> list:
    """Compile several prim_funcs at once, in threads (as tilelang.jit.par_compile does): lowering spends its
    time in C++ and each nvcc is its own process, so on a 16-core machine ten kernels cost about one. Each
    kernel also lands in TileLang's kernel cache, so a later `tilelang.compile` of the same program (same
    target, out_idx and pass configs) returns in milliseconds: a section can compile everything it plans up
    front and keep its code in lesson order. TileLang's per-kernel compile log stays quiet (quiet_tilelang);
    `log` gets one line instead. Returns the kernels, None where one failed (the
    section's own compile of it then raises the real error). An item of `programs` may also be a
    (prim_func, pass_configs) pair, for kernels that need their own configs."""
    from concurrent.futures import ThreadPoolExecutor

    import tilelang

    quiet_tilelang()
    programs = list(programs)
    if not programs:
        return []

    def one(item):
        func, configs = item if isinstance(item, tuple) else (item, pass_configs)
        wait_until_untimed()  # a background compile does not load kernels while the GPU is being timed
        try:
            return tilelang.compile(func, out_idx=out_idx, target=target, pass_configs=dict(configs or {}))
        except Exception:  # only a speed-up: the caller compiles (and reports) each kernel itself
            return None

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=min(len(programs), os.cpu_count() or 1)) as pool:
        kernels = list(pool.map(one, programs))
    if log is not None:
        built = sum(k is not None for k in kernels)
        log(f"compiled {built} of {len(programs)} kernels in parallel in {time.perf_counter() - started:.1f} s "
            f"(or loaded them from TileLang's kernel cache)")
    return kernels


@dataclass(frozen=True)
class KernelDecl:
    """One kernel a section builds, declared once and used by the background compile, the compile-only
    report and the run. `program` builds the prim_func when called (building costs time, so it is
    deferred); the rest says how to compile it and what its compile-only report must show."""

    name: str
    program: Callable[[], Any]
    out_idx: Any = None
    pass_configs: dict[str, Any] | None = field(default=None, compare=False)
    threads: int | None = None  # threads asked for, shown beside the threads the kernel launches with
    nvcc: bool = True  # compile-only: also run nvcc (False: only lowered to CUDA source, which is quicker)
    markers: tuple[str, ...] = ()  # compile-only: instructions the generated CUDA must contain
    smem_limit: int | None = None  # compile-only: the kernel may not use more shared memory than this


def build_declared(decls: Sequence[KernelDecl], *, target="cuda", log: Callable[[str], None] | None = None) -> dict:
    """Compile the declared kernels at once (compile_many) and return {name: kernel}. A kernel that failed
    is compiled once more on its own, so that its real error is raised."""
    import tilelang

    decls = list(decls)
    by_args: dict[Any, list[KernelDecl]] = {}
    for decl in decls:  # compile_many takes one out_idx per call
        by_args.setdefault(repr(decl.out_idx), []).append(decl)
    kernels: dict[str, Any] = {}
    for group in by_args.values():
        built = compile_many([(d.program(), d.pass_configs) for d in group], target=target,
                             out_idx=group[0].out_idx, log=log)
        for decl, kernel in zip(group, built):
            if kernel is None:
                kernel = tilelang.compile(decl.program(), out_idx=decl.out_idx, target=target,
                                          pass_configs=dict(decl.pass_configs or {}))
            kernels[decl.name] = kernel
    return kernels


def inspect_declared(ctx: "TourContext", decls: Sequence[KernelDecl]) -> dict[str, KernelReport]:
    """The compile-only path of a section: lower every declared kernel for ctx.arch (nvcc where asked),
    print the report table, and raise ValidationError where nvcc failed, a marker is missing or the
    shared memory exceeds its limit. Returns {name: report} for the section's own explanations."""
    decls = list(decls)
    jobs = [(d.name, d.program(), ctx.arch, d.pass_configs) for d in decls]
    with_nvcc = inspect_kernels([j for j, d in zip(jobs, decls) if d.nvcc])
    lowered = inspect_kernels([j for j, d in zip(jobs, decls) if not d.nvcc], nvcc=False)
    by_name = {r.name: r for r in with_nvcc + lowered}
    reports = [by_name[d.name] for d in decls]
    report_kernels(ctx, reports, {d.name: d.threads for d in decls if d.threads})
    for decl, report in zip(decls, reports):
        require_markers(report, decl.markers)
        require_register_raise_fits(report, decl.threads)
        if decl.smem_limit is not None and report.smem_bytes > decl.smem_limit:
            raise ValidationError(f"{report.name}: the kernel uses {report.smem_bytes} B of shared memory, "
                                  f"more than {decl.smem_limit} B")
    return {r.name: r for r in reports}


class _DropMemoryCacheHits:
    """A logging filter for TileLang's 'Found kernel ... in memory cache' warnings (kernel cache, autotuner):
    after compile_many, every section's tilelang.compile of the same program is such a hit, by design, and
    the advice in the warning (use @tilelang.jit / @tilelang.autotune) does not apply to prim_funcs built
    per problem size."""

    def filter(self, record) -> bool:
        return "in memory cache" not in record.getMessage()


def quiet_tilelang() -> None:
    """Keep TileLang's own compile log ('begins/completes to compile kernel', one pair a kernel) and its
    memory-cache-hit warnings out of the lessons' output. TILELANG_PRINT_ON_COMPILATION=1 in the
    environment brings the compile log back."""
    import logging

    os.environ.setdefault("TILELANG_PRINT_ON_COMPILATION", "0")  # TileLang reads it at each compile
    for name in ("tilelang.cache.kernel_cache", "tilelang.autotuner.tuner"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMemoryCacheHits) for f in logger.filters):
            logger.addFilter(_DropMemoryCacheHits())


def inspect_kernel(name: str, func, arch: str, *, pass_configs: dict[str, Any] | None = None,
                   nvcc: bool = True) -> KernelReport:
    """Lower `func` for `arch`, count the instruction markers, read shared memory and the launch shape,
    and (when nvcc is present and asked for) compile the generated CUDA to a cubin as TileLang does, with
    ptxas reporting registers and spills, to prove nvcc accepts it."""
    artifact = lower_for_arch(func, arch, pass_configs)
    source = artifact.kernel_source
    threads, grid, dyn = _launch_shape(artifact.device_mod)
    usage: dict[str, int] = {}
    if not nvcc:
        nvcc_status = "lowered only"
    elif find_nvcc() is None:
        nvcc_status = "not run (nvcc not found)"
    else:
        try:
            usage = ptxas_usage(compile_cubin(source, arch, pass_configs))
            nvcc_status = "compiled"
        except Exception as exc:  # report, don't crash: the section decides whether this is fatal
            nvcc_status = f"failed: {one_line(exc)}"
    return KernelReport(name, arch, count_markers(source), dyn, static_smem_bytes(source), threads, grid,
                        nvcc_status, source, **usage)


def nvcc_options(arch: str, pass_configs: dict[str, Any] | None = None) -> list[str]:
    """The nvcc options TileLang 0.1.15 compiles a kernel's device code with (tilelang/cuda/backend.py): the
    gencode for the target, C++20, its template and CUTLASS includes, and the pass configs that reach nvcc."""
    import shlex

    from tilelang.contrib import nvcc as tl_nvcc
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    target_arch, target_code = tl_nvcc.get_target_arch_and_code(cuda_target(arch))
    gencode = tl_nvcc.format_target_code_for_gencode(target_code) or f"sm_{target_arch}"
    options = ["-gencode", f"arch=compute_{target_arch},code={gencode}", "-O3", "-std=c++20",
               "-I" + TILELANG_TEMPLATE_PATH, "-I" + CUTLASS_INCLUDE_DIR]
    configs = pass_configs or {}
    extra = configs.get("tl.device_compile_flags")
    if extra:
        options += [tok for flag in ([extra] if isinstance(extra, str) else extra) for tok in shlex.split(str(flag))]
    if configs.get("tl.enable_fast_math"):
        options.append("--use_fast_math")
    if configs.get("tl.ptxas_register_usage_level") is not None:
        options.append(f"--ptxas-options=--register-usage-level={int(configs['tl.ptxas_register_usage_level'])}")
    return options


def compile_cubin(source: str, arch: str, pass_configs: dict[str, Any] | None = None) -> str:
    """nvcc the generated CUDA `source` to a cubin with ptxas's report on (-Xptxas -v); returns that report.
    One nvcc run per kernel, the same one TileLang's compile makes, so the compile-only check costs no more."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tour_nvcc_") as folder:
        path = os.path.join(folder, "kernel.cu")
        with open(path, "w") as fh:
            fh.write(source)
        cmd = [find_nvcc() or "nvcc", "--cubin", *nvcc_options(arch, pass_configs), "-w", "-Xptxas", "-v",
               "-o", os.path.join(folder, "kernel.cubin"), path]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [ln for ln in (done.stderr + done.stdout).splitlines() if "error" in ln.lower()]
        raise RuntimeError("; ".join(errors[:3]) or f"nvcc exited with {done.returncode}")
    return done.stdout + done.stderr


_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_usage(report: str) -> dict[str, int]:
    """Registers (the most any function uses) and spill bytes (summed over functions) from ptxas -v."""
    registers = [int(n) for n in _PTXAS_REGISTERS.findall(report)]
    spills = [(int(a), int(b)) for a, b in _PTXAS_SPILLS.findall(report)]
    return {"registers": max(registers, default=0), "spill_stores": sum(a for a, _ in spills),
            "spill_loads": sum(b for _, b in spills)}


def inspect_kernels(jobs: Sequence[tuple], *, nvcc: bool = True) -> list[KernelReport]:
    """inspect_kernel for many (name, prim_func, arch[, pass_configs]) jobs at once, reports in job order.
    Threads suffice: lowering spends its time in C++, each nvcc is its own process, and TVM keeps the
    target and pass-config context per thread."""
    from concurrent.futures import ThreadPoolExecutor

    def one(job):
        name, func, arch, *rest = job
        return inspect_kernel(name, func, arch, pass_configs=rest[0] if rest else None, nvcc=nvcc)

    jobs = list(jobs)
    if len(jobs) <= 1:
        return [one(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1)) as pool:
        return list(pool.map(one, jobs))


def report_kernels(ctx: TourContext, reports: Sequence[KernelReport], requested_threads: dict[str, int] | None = None) -> None:
    """Print the compile-only table: markers found, shared memory, threads as launched, nvcc status, and
    ptxas's registers per thread and spill bytes (stores/loads) where nvcc ran."""
    rows = []
    for rep in reports:
        found = ", ".join(f"{k}×{v}" for k, v in rep.markers.items() if v) or "-"
        threads = str(rep.threads)
        asked = (requested_threads or {}).get(rep.name)
        if asked and asked != rep.threads:
            threads += f" (asked {asked})"
        regs = "-" if rep.registers is None else str(rep.registers)
        rows.append([rep.name, rep.arch, format_bytes(rep.smem_bytes), threads, rep.nvcc, regs, rep.spills, found])
    ctx.table(["kernel", "arch", "smem", "threads", "nvcc", "regs", "spills", "markers"], rows)
    # Its own key: a section's headline(kernels=<count>) also lands in the metrics.
    ctx.metrics.setdefault("kernel_reports", []).extend(r.summary() for r in reports)


def require_markers(report: KernelReport, expected: Iterable[str]) -> None:
    missing = [m for m in expected if not report.markers.get(m)]
    if missing:
        raise ValidationError(f"{report.name} for {report.arch}: expected {', '.join(missing)} in the CUDA source")
    if report.nvcc.startswith("failed"):
        raise ValidationError(f"{report.name} for {report.arch}: nvcc {report.nvcc}")


def require_register_raise_fits(report: KernelReport, threads_asked: int | None) -> None:
    """Warp specialization drops the producer's registers and raises the consumers' (setmaxnreg); a raise the
    SM's 64K registers cannot grant waits forever. Where TileLang added the producer (launched > asked),
    check the pair in the generated CUDA against the launch."""
    pair = [int(n) for n in re.findall(r"reg_(?:dealloc|alloc)<(\d+)>", report.source)[:2]]
    if len(pair) < 2 or not threads_asked or report.threads <= threads_asked:
        return
    need = pair[0] * (report.threads - threads_asked) + pair[1] * threads_asked
    if need > 65536:
        raise ValidationError(f"{report.name} for {report.arch}: its warpgroups ask {need} registers of the SM's "
                              f"65536 ({report.threads - threads_asked} threads at {pair[0]}, {threads_asked} at "
                              f"{pair[1]}): the raise would wait forever")


def source_excerpt(source: str, pattern: str, context: int = 6, limit: int = 40) -> str:
    """The lines of generated CUDA around the first match of `pattern`, for showing the reader."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            lo, hi = max(0, i - context), min(len(lines), i + context + 1)
            return "\n".join(lines[lo:hi][:limit])
    return ""
