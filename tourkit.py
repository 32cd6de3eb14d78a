"""The tour's shared kit: the section protocol, the device, timing, validation, codegen inspection, reports.

Every section uses this module and none re-implements what is here. It imports torch and tilelang lazily,
so the runner (and `--list`) works on a machine that has neither, and it has no import-time side effects,
so the whole tour can be pasted into one notebook cell. Everything a section hands back to the runner is
plain data (str, int, float, bool, lists and dicts of them) so that it can travel through JSON or a pipe.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Sequence

TILELANG_PIN = "0.1.15"
TILELANG_INSTALL = f"pip install tilelang=={TILELANG_PIN}"
TILELANG_NIGHTLY_INSTALL = "pip install tilelang --find-links https://tile-ai.github.io/whl/nightly"


# ---------------------------------------------------------------------------------------------------------
# The section protocol
# ---------------------------------------------------------------------------------------------------------


class SectionSkip(Exception):
    """Raised by a section that cannot run here; the message is the reason shown to the user."""


@dataclass
class Section:
    """What a section declares: who it is and what it needs. `run(ctx)` does the work."""

    name: str
    title: str
    summary: str
    run: Callable[["TourContext"], None]
    needs_gpu: bool = True
    min_capability: tuple[int, int] | None = None
    needs_nvcc: bool = False
    supports_compile_only: bool = True
    # The kernels the section builds, declared once (see KernelDecl): the runner compiles them in a
    # background thread while earlier sections run (a GPU run only) and waits before `run`; the section's
    # compile-only path inspects the same list (inspect_declared) and its run compiles it (build_declared),
    # which after the background compile are cache hits. `run` must not rely on the background compile.
    kernels: Callable[["TourContext"], list["KernelDecl"]] | None = None
    prepare: Callable[["TourContext"], None] | None = None  # older form of `kernels`, while sections move over


@dataclass
class SectionResult:
    """One section's outcome, as plain serializable data."""

    name: str
    title: str = ""
    status: str = "pending"  # passed | failed | crashed | skipped | timed out | interrupted
    seconds: float = 0.0
    headline: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)
    skip_reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback_tail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TourContext:
    """What a section gets: the run's options and device, and a place to report to.

    `log` prints at once (flushed, so a notebook shows progress) and keeps the line for the JSON report.
    `headline` records the few numbers that go into the summary table; `metric` records the rest.
    """

    def __init__(self, *, quick: bool = False, compile_only: bool = False, arch: str | None = None,
                 device: "DeviceInfo | None" = None, full: bool = False, echo: bool = True):
        self.quick = quick
        self.compile_only = compile_only
        self.device = device
        self.arch = arch or (device.arch if device else DEFAULT_ARCH)
        self.full = full
        self.echo = echo
        self.report: list[str] = []
        self.headlines: dict[str, Any] = {}
        self.metrics: dict[str, Any] = {}

    @property
    def has_gpu(self) -> bool:
        return self.device is not None

    @property
    def smem_budget(self) -> int:
        """Shared memory one block may use (opt-in maximum) on the GPU we run on or compile for."""
        if self.device is not None and not self.compile_only:
            return self.device.smem_per_block_optin
        return ARCH_SPECS[self.arch].smem_per_block_optin

    def log(self, text: str = "") -> None:
        for line in str(text).splitlines() or [""]:
            self.report.append(line)
            if self.echo:
                print("    " + line if line else "", flush=True)

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        self.log(format_table(headers, rows))

    def headline(self, **values: Any) -> None:
        self.headlines.update(values)
        self.metrics.update(values)

    def metric(self, **values: Any) -> None:
        self.metrics.update(values)


# ---------------------------------------------------------------------------------------------------------
# Architectures and the device
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchSpec:
    arch: str  # what nvcc and TileLang's target take
    family: str  # "ampere", "ada", "hopper", "turing": sections pick schedules by family
    capability: tuple[int, int]
    smem_per_block_optin: int  # bytes, the opt-in maximum for one block


ARCH_SPECS: dict[str, ArchSpec] = {
    "sm_75": ArchSpec("sm_75", "turing", (7, 5), 64 * 1024),
    "sm_80": ArchSpec("sm_80", "ampere", (8, 0), 163 * 1024),
    "sm_86": ArchSpec("sm_86", "ampere", (8, 6), 99 * 1024),
    "sm_89": ArchSpec("sm_89", "ada", (8, 9), 99 * 1024),
    # Hopper's wgmma and setmaxnreg exist only for the arch-specific target, sm_90a, not plain sm_90.
    "sm_90a": ArchSpec("sm_90a", "hopper", (9, 0), 227 * 1024),
}
DEFAULT_ARCH = "sm_90a"


class UsageError(Exception):
    """Bad input from the user; the runner prints the message as one line and exits 2."""


def check_arch(arch: str) -> str:
    if arch == "sm_90":
        raise UsageError("--arch sm_90 cannot use Hopper's wgmma/TMA; use sm_90a (the arch-specific target)")
    if arch not in ARCH_SPECS:
        raise UsageError(f"unknown --arch {arch!r}; choose one of: {', '.join(ARCH_SPECS)}")
    return arch


def arch_for_capability(major: int, minor: int) -> str:
    """The closest architecture we know at or below a compute capability."""
    known = sorted(ARCH_SPECS.values(), key=lambda spec: spec.capability)
    best = known[0].arch
    for spec in known:
        if spec.capability <= (major, minor):
            best = spec.arch
    return best


@dataclass
class DeviceInfo:
    name: str
    capability: tuple[int, int]
    arch: str
    sm_count: int
    memory_bytes: int
    smem_per_block_optin: int
    l2_bytes: int

    @property
    def family(self) -> str:
        return ARCH_SPECS[self.arch].family


def detect_device() -> DeviceInfo | None:
    """The first CUDA GPU as torch sees it, or None (no torch, no CUDA build, no GPU)."""
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
    except Exception:  # a broken driver is "no GPU" for the tour, env_check reports the details
        return None
    arch = arch_for_capability(props.major, props.minor)
    optin = getattr(props, "shared_memory_per_block_optin", 0) or ARCH_SPECS[arch].smem_per_block_optin
    return DeviceInfo(
        name=props.name,
        capability=(props.major, props.minor),
        arch=arch,
        sm_count=props.multi_processor_count,
        memory_bytes=props.total_memory,
        smem_per_block_optin=int(optin),
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
    )


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return None


def probe_tilelang_import(timeout: float = 120.0) -> tuple[bool, str]:
    """Import tilelang in a child process first: a broken install can abort the importing process
    (tile-ai/tilelang#2367), and the tour must survive that. Returns (ok, version or reason)."""
    code = "import tilelang, sys; sys.stdout.write(tilelang.__version__)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"importing tilelang took more than {timeout:.0f} s"
    if done.returncode == 0:
        return True, done.stdout.strip()
    lines = [ln for ln in (done.stderr or "").strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit code {done.returncode}"
    if "No module named 'tilelang'" in last:
        return False, f"tilelang is not installed ({TILELANG_INSTALL})"
    if done.returncode < 0:
        return False, f"importing tilelang killed the process with signal {-done.returncode}: {last}"
    return False, f"importing tilelang failed: {last}"


# ---------------------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------------------


def random_tensor(shape, dtype, *, scale: float = 1.0, seed: int | None = None, device: str = "cuda"):
    """Fresh random inputs (never zeros): N(0, scale²), drawn on the device."""
    import torch

    gen = None
    if seed is not None:
        gen = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def poison_(tensor):
    """Fill an output with NaN (or the max integer) so that any element a kernel forgets to write fails."""
    import torch

    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)
    return tensor


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf when out holds a NaN or Inf, so that NaN never passes."""
    import torch

    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(torch.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"shape mismatch: kernel gave {tuple(out64.shape)}, reference {tuple(ref64.shape)}")
    if not bool(torch.isfinite(out64).all()):
        return math.inf
    denom = torch.linalg.vector_norm(ref64).item()
    diff = torch.linalg.vector_norm(out64 - ref64).item()
    return diff / denom if denom > 0 else diff


@dataclass
class Check:
    name: str
    rel_error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return self.rel_error <= self.tolerance  # inf and NaN both compare False

    def line(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        return f"{self.name}: rel. error {format_error(self.rel_error)} (tolerance {self.tolerance:.0e}) {verdict}"


class ValidationError(AssertionError):
    pass


def validate(name: str, launch: Callable[[], Any], out, ref, tolerance: float) -> Check:
    """Poison `out`, run `launch()` (which must write `out`), and compare with `ref`.

    `ref` should come from a higher-precision computation (float32 or float64) of the same inputs.
    """
    import torch

    poison_(out)
    launch()
    if out.is_cuda:
        torch.cuda.synchronize()
    return Check(name, relative_error(out, ref), tolerance)


def require(checks: Iterable[Check]) -> None:
    """Raise if any check failed: a section with a wrong kernel must fail, not report a speed."""
    bad = [c for c in checks if not c.passed]
    if bad:
        raise ValidationError("; ".join(c.line() for c in bad))


# ---------------------------------------------------------------------------------------------------------
# Timing and throughput
# ---------------------------------------------------------------------------------------------------------

_l2_flush_buffer: dict[str, Any] = {}


def _flush_buffer(nbytes: int = 256 * 1024 * 1024):
    import torch

    buf = _l2_flush_buffer.get("buf")
    if buf is None:
        buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
        _l2_flush_buffer["buf"] = buf
    return buf


FLUSH_MODES = ("write", "read")


def bench_ms(fn: Callable[[], Any], *, warmup_ms: float = 25.0, rep_ms: float = 100.0,
             flush_l2: bool = True, flush_mode: str = "write", min_reps: int = 5, max_reps: int = 1000) -> float:
    """Median time of `fn()` in milliseconds, from CUDA events around each call, after a warm-up.

    Before each timed call the L2 cache is flushed so small problems are not timed out of the cache; the
    flush itself lies outside the events. `flush_mode` "write" zeroes a 256 MB buffer (as triton's do_bench
    does): the timed call then starts with the L2 full of dirty lines, and a problem of a few tens of MB pays
    for writing some of them back. "read" reads the buffer instead (a max over it), leaving clean lines that
    are evicted for free. Large problems do not tell the two apart.
    """
    import torch

    if flush_mode not in FLUSH_MODES:
        raise ValueError(f"bench_ms: flush_mode {flush_mode!r} is not one of {FLUSH_MODES}")

    fn()
    torch.cuda.synchronize()
    flush = _flush_buffer() if flush_l2 else None
    # Estimate one call's time to choose the warm-up and repeat counts.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 3, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate))):
        fn()
    reps = min(max_reps, max(min_reps, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_() if flush_mode == "write" else flush.max()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else 0.5 * (times[mid - 1] + times[mid])


def gbps(nbytes: float, ms: float) -> float:
    """Bandwidth in GB/s (10^9 bytes per second) for `nbytes` moved in `ms` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    """Arithmetic rate in TFLOP/s (10^12 per second) for `flops` operations in `ms` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def speedup(reference_ms: float, ours_ms: float) -> float:
    """How many times faster ours is than the reference measured in the same run (>1 is faster)."""
    return reference_ms / ours_ms


def device_copy_gbps(nbytes: int = 1 << 30) -> float:
    """The device-to-device copy bandwidth right now (bytes read plus written): the memory ceiling."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), flush_l2=False)
    return gbps(2 * src.numel(), ms)


# Untimed load before bench_interleaved's rounds: a GPU timed from idle is still raising its clocks and power
# for the first second or so, and whichever contender runs first would pay for it (bench/settle_probe.py
# measures this; BENCHMARKS.md has what it found).
SETTLE_MS = 1500.0


def bench_interleaved(fns: dict[str, Callable[[], Any]], *, rounds: int = 4, settle_ms: float | None = None,
                      pairs: dict[str, list[float]] | None = None, **bench_kwargs: Any) -> dict[str, float]:
    """`bench_ms` of each contender, taking turns in pairs of rounds: A B C, then C B A. Each contender's
    time is the mean of its two readings in a pair, and the median over the pairs (`rounds` is rounded up
    to an even number).

    A GPU's clock drifts with power and heat during a run (a few percent on an H200 under GEMM load), so
    timing contenders one after the other hands that drift to whoever runs first. Within a forward and
    backward pair every contender's two positions add up to the same, so a drift that is linear over the
    pair cancels exactly in the mean; a median of an odd number of rounds would keep each contender's
    position in the forward rounds. `bench_kwargs` go to `bench_ms`.

    `settle_ms` (default SETTLE_MS): first run the contenders in turn, untimed, for that long. A GPU that was
    idle starts a heavy load at its boost clock and its power controller pulls the clock down over the next
    second or so; that drift is not linear, so the pairs would not cancel it, and the timings would describe
    the first second after idle rather than the sustained state the GPU settles in (and a real workload runs in).

    `pairs`: a dict to fill with each contender's per-pair times (the values the median is taken over), for a
    report of how far the pairs disagree (`pair_ratio_range`).
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    settle_ms = SETTLE_MS if settle_ms is None else settle_ms
    if settle_ms > 0:
        settle(fns.values(), settle_ms)
    for r in range(rounds + rounds % 2):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(bench_ms(fns[name], **bench_kwargs))
    per_pair = {name: [0.5 * (ts[i] + ts[i + 1]) for i in range(0, len(ts), 2)] for name, ts in times.items()}
    if pairs is not None:
        pairs.update(per_pair)
    return {name: _median(values) for name, values in per_pair.items()}


def pair_ratio_range(reference: Sequence[float], contender: Sequence[float]) -> tuple[float, float]:
    """The lowest and highest speedup of a contender over a reference across the pairs of `bench_interleaved`
    (reference time / contender time, pair by pair): how much one verdict moves within a run."""
    ratios = [speedup(r, c) for r, c in zip(reference, contender)]
    return min(ratios), max(ratios)


def settle(fns, ms: float) -> None:
    """Call each of `fns` in turn, untimed, until `ms` milliseconds of wall time have passed (with no GPU
    there is nothing to settle)."""
    import torch

    if not torch.cuda.is_available():
        return
    fns = list(fns)
    deadline = time.perf_counter() + ms / 1e3
    while time.perf_counter() < deadline:
        for fn in fns:
            fn()
        torch.cuda.synchronize()


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


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

    @property
    def smem_bytes(self) -> int:
        return self.dynamic_smem_bytes + self.static_smem_bytes

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch, "markers": self.markers, "smem_bytes": self.smem_bytes,
                "threads": self.threads, "grid": list(self.grid), "nvcc": self.nvcc}


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
    and (when nvcc is present and asked for) compile it to a cubin to prove nvcc accepts it."""
    artifact = lower_for_arch(func, arch, pass_configs)
    source = artifact.kernel_source
    threads, grid, dyn = _launch_shape(artifact.device_mod)
    if not nvcc:
        nvcc_status = "lowered only"
    elif find_nvcc() is None:
        nvcc_status = "not run (nvcc not found)"
    else:
        try:
            compile_for_arch(func, arch, pass_configs)
            nvcc_status = "compiled"
        except Exception as exc:  # report, don't crash: the section decides whether this is fatal
            nvcc_status = f"failed: {one_line(exc)}"
    return KernelReport(name, arch, count_markers(source), dyn, static_smem_bytes(source), threads, grid,
                        nvcc_status, source)


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
    """Print the compile-only table: markers found, shared memory, threads as launched, nvcc status."""
    rows = []
    for rep in reports:
        found = ", ".join(f"{k}×{v}" for k, v in rep.markers.items() if v) or "-"
        threads = str(rep.threads)
        asked = (requested_threads or {}).get(rep.name)
        if asked and asked != rep.threads:
            threads += f" (asked {asked})"
        rows.append([rep.name, rep.arch, format_bytes(rep.smem_bytes), threads, rep.nvcc, found])
    ctx.table(["kernel", "arch", "smem", "threads", "nvcc", "markers"], rows)
    ctx.metric(kernels=[r.summary() for r in reports])


def require_markers(report: KernelReport, expected: Iterable[str]) -> None:
    missing = [m for m in expected if not report.markers.get(m)]
    if missing:
        raise ValidationError(f"{report.name} for {report.arch}: expected {', '.join(missing)} in the CUDA source")
    if report.nvcc.startswith("failed"):
        raise ValidationError(f"{report.name} for {report.arch}: nvcc {report.nvcc}")


def source_excerpt(source: str, pattern: str, context: int = 6, limit: int = 40) -> str:
    """The lines of generated CUDA around the first match of `pattern`, for showing the reader."""
    lines = source.splitlines()
    for i, line in enumerate(lines):
        if re.search(pattern, line):
            lo, hi = max(0, i - context), min(len(lines), i + context + 1)
            return "\n".join(lines[lo:hi][:limit])
    return ""


# ---------------------------------------------------------------------------------------------------------
# Capturing what C code prints (device printf, nvcc, native libraries)
# ---------------------------------------------------------------------------------------------------------


class CapturedOutput:
    """What `capture_fd_output` caught: `.text` is filled in when the `with` block ends."""

    def __init__(self) -> None:
        self.text = ""


@contextlib.contextmanager
def capture_fd_output(fd: int = 1):
    """Capture everything written to file descriptor `fd` (1: stdout) inside the block, C code included.

    CUDA's device `printf` (TileLang's T.print) is written by the driver through the C library's stdout,
    file descriptor 1, bypassing Python's `sys.stdout`: a notebook never shows it, and a test runner's
    `sys.stdout` capture misses it. Redirecting the descriptor itself to a temporary file catches it
    (also when pytest or the runner already redirected it: that redirection is saved and restored).
    Python's own `print` lands here only when `sys.stdout` writes to descriptor 1 (not under pytest).
    Synchronize the device inside the block (device printf is flushed at synchronization), e.g.:

        with capture_fd_output() as out:
            kernel(x); torch.cuda.synchronize()
        print(out.text)
    """
    import ctypes
    import tempfile

    libc = ctypes.CDLL(None)
    captured = CapturedOutput()
    sys.stdout.flush()
    sys.stderr.flush()
    libc.fflush(None)
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            libc.fflush(None)  # the C library buffers stdout when it is a file: push it into the sink
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", errors="replace")


# ---------------------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------------------


def one_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_error(err: float) -> str:
    return "inf (NaN/Inf in output)" if math.isinf(err) else f"{err:.2e}"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    line = lambda vals: "  ".join(v.ljust(w) for v, w in zip(vals, widths)).rstrip()
    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(row) for row in cells]
    return "\n".join(out)


def indent(text: str, prefix: str = "  ") -> str:
    return textwrap.indent(text, prefix)
