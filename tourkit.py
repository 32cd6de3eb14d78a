"""The tour's shared kit: the section protocol, the device, timing, validation, codegen inspection, reports.

Every section uses this module and none re-implements what is here. It imports torch and tilelang lazily,
so the runner (and `--list`) works on a machine that has neither, and it has no import-time side effects,
so the whole tour can be pasted into one notebook cell. Everything a section hands back to the runner is
plain data (str, int, float, bool, lists and dicts of them) so that it can travel through JSON or a pipe.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

if TYPE_CHECKING:
    from tourkernels import KernelDecl

TILELANG_PIN = "0.1.15"
TILELANG_INSTALL = f"pip install tilelang=={TILELANG_PIN}"
TILELANG_NIGHTLY_INSTALL = "pip install tilelang --find-links https://tile-ai.github.io/whl/nightly"


# ---- The section protocol -------------------------------------------------------------------------------


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


TIMING_KINDS = ("lesson", "appendix", "pytorch", "copy")


class TourContext:
    """What a section gets: the run's options and device, and a place to report to.

    `log` prints at once (flushed, so a notebook shows progress) and keeps the line for the JSON report.
    `headline` records the few numbers that go into the summary table; `metric` records the rest.
    """

    def __init__(self, *, quick: bool = False, compile_only: bool = False, arch: str | None = None,
                 device: "DeviceInfo | None" = None, full: bool = False, echo: bool = True,
                 shape: "tuple[int, ...] | None" = None, dtype: str = "float16"):
        self.quick = quick
        # The user's own problem (--shape, already parsed and checked by sections/shapes.py) or None: the
        # section's own shapes. dtype: the element type of the GEMM, fusion, softmax and attention kernels.
        self.shape = tuple(shape) if shape is not None else None
        self.dtype = dtype
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

    def timing(self, name: str, ms: float, *, flops: float | None = None, nbytes: float | None = None,
               kind: str = "lesson", problem: str = "") -> None:
        """Record one timed kernel or PyTorch path (median ms; the FLOPs and the bytes it must move, where they
        mean something) in metrics["timings"], for the plots (tourplots.py): kind "lesson", "appendix",
        "pytorch" or "copy"; `problem` names the problem it solved (e.g. "4096x4096x4096")."""
        if kind not in TIMING_KINDS:
            raise ValueError(f"timing kind {kind!r} is not one of {TIMING_KINDS}")
        self.metrics.setdefault("timings", []).append(
            {"name": name, "ms": float(ms), "flops": None if flops is None else float(flops),
             "nbytes": None if nbytes is None else float(nbytes), "kind": kind, "problem": str(problem)})


# ---- Architectures and the device -----------------------------------------------------------------------


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
    # Blackwell has no wgmma (its tcgen05 is not taught here): the Ampere-style kernels, for TileLang's own target.
    "sm_100a": ArchSpec("sm_100a", "ampere", (10, 0), 227 * 1024),
    "sm_120a": ArchSpec("sm_120a", "ada", (12, 0), 99 * 1024),
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


def runs_kernels(device) -> bool:
    """Whether the tour's kernels (fp16 mma.sync m16n8k16: sm_75, Turing, or newer) run on `device` (or None)."""
    return device is not None and tuple(device.capability) >= (7, 5)


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


WORKER_ENV = "TILELANG_TOUR_WORKER"  # set to 1 in the tour's worker process


def probe_tilelang_import(timeout: float = 120.0) -> tuple[bool, str]:
    """Import tilelang in a child process first: a broken install can abort the importing process
    (tile-ai/tilelang#2367), and the tour must survive that. In the tour's worker process (WORKER_ENV set)
    a crash costs only the worker, which the runner replaces, so there the import happens in-process and
    is paid once. Returns (ok, version or reason)."""
    if os.environ.get(WORKER_ENV) == "1":
        return _import_tilelang_here()
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


def _import_tilelang_here() -> tuple[bool, str]:
    try:
        import tilelang
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] == "tilelang":
            return False, f"tilelang is not installed ({TILELANG_INSTALL})"
        return False, f"importing tilelang failed: {one_line(exc)}"
    except Exception as exc:  # noqa: BLE001 - any import failure is the reason shown
        return False, f"importing tilelang failed: {one_line(exc)}"
    return True, tilelang.__version__


def require_device_memory(ctx: "TourContext", nbytes: int, what: str) -> None:
    """Skip (with the reason) a user's problem whose tensors, references included, would not fit the GPU."""
    if ctx.device is None or ctx.compile_only:
        return
    if nbytes > 0.85 * ctx.device.memory_bytes:
        raise SectionSkip(f"{what} needs about {format_bytes(nbytes)} of GPU memory; this GPU has "
                          f"{format_bytes(ctx.device.memory_bytes)}")


# ---- Validation -----------------------------------------------------------------------------------------


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


# ---- Timing and throughput ------------------------------------------------------------------------------

_l2_flush_buffer: dict[str, Any] = {}


def _flush_buffer(nbytes: int = 256 * 1024 * 1024):
    import torch

    buf = _l2_flush_buffer.get("buf")
    if buf is None:
        buf = torch.empty(nbytes // 4, dtype=torch.int32, device="cuda")
        _l2_flush_buffer["buf"] = buf
    return buf


FLUSH_MODES = ("write", "read")


# While the GPU is timed, compiles in other threads wait (tourkernels.compile_many): loading a kernel takes the
# GIL and the CUDA driver's module loader, and a stall between a start event and its launch counts as GPU time.
_untimed = threading.Event()
_untimed.set()
_timing_depth = 0  # timing_window calls in progress (they nest: bench_interleaved calls bench_ms)
_timing_lock = threading.Lock()


def timing_window(fn):
    """Decorator: while `fn` runs (nested calls included), other threads' compiles wait (wait_until_untimed)."""
    @functools.wraps(fn)
    def timed(*args, **kwargs):
        global _timing_depth
        with _timing_lock:
            _timing_depth += 1
            _untimed.clear()
        try:
            return fn(*args, **kwargs)
        finally:
            with _timing_lock:
                _timing_depth -= 1
                if _timing_depth == 0:
                    _untimed.set()
    return timed


def wait_until_untimed(timeout: float = 120.0) -> bool:
    """Block a background thread while a timing is in progress (at most `timeout` s); the main thread never
    waits (it is the one timing). True when no timing is in progress."""
    if threading.current_thread() is threading.main_thread():
        return True
    return _untimed.wait(timeout)


@timing_window
def bench_ms(fn: Callable[[], Any], *, warmup_ms: float = 25.0, rep_ms: float | None = None,
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
    reps = min(max_reps, max(min_reps, int((REP_MS if rep_ms is None else rep_ms) / estimate)))
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


@timing_window
def device_copy_gbps(nbytes: int = 1 << 30) -> float:
    """The device-to-device copy bandwidth right now (bytes read plus written): the memory ceiling."""
    import torch

    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    settle([lambda: dst.copy_(src)], SETTLE_MS / 3)  # from idle, the memory clock and the copy ramp up first
    ms = bench_ms(lambda: dst.copy_(src), flush_l2=False)
    return gbps(2 * src.numel(), ms)


# Untimed load before bench_interleaved's rounds: a GPU timed from idle is still raising its clocks and power
# for the first second or so, and whichever contender runs first would pay for it (bench/settle_probe.py
# measures this; BENCHMARKS.md has what it found).
SETTLE_MS = 1500.0
REP_MS = 100.0  # bench_ms's repetitions by default: this many milliseconds of calls
# --quick: a quick look, not a verdict: a shorter untimed load and half the repetitions (quick_timing)
QUICK_SETTLE_MS, QUICK_REP_MS = 500.0, 50.0


@contextlib.contextmanager
def quick_timing(quick: bool):
    """Within it, with quick set, every comparison settles for QUICK_SETTLE_MS and bench_ms repeats for
    QUICK_REP_MS by default; the settings are restored on the way out."""
    global SETTLE_MS, REP_MS
    saved = SETTLE_MS, REP_MS
    if quick:
        SETTLE_MS, REP_MS = QUICK_SETTLE_MS, QUICK_REP_MS
    try:
        yield
    finally:
        SETTLE_MS, REP_MS = saved


@timing_window
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


@timing_window
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


# ---- Building and inspecting kernels lives in tourkernels.py; its names are tourkit's too ---------------

KERNEL_NAMES = frozenset(('MARKERS', 'TENSOR_CORE_MARKERS', 'tensor_core_markers', 'count_markers', 'cuda_target', '_STATIC_SMEM', '_SCALAR_BYTES', 'KernelReport', '_launch_shape', 'static_smem_bytes', 'lower_for_arch', 'compile_for_arch', 'compile_many', 'KernelDecl', 'build_declared', 'inspect_declared', '_DropMemoryCacheHits', 'quiet_tilelang', 'inspect_kernel', 'inspect_kernels', 'report_kernels', 'require_markers', 'require_register_raise_fits', 'source_excerpt', 'compile_cubin', 'ptxas_usage'))


def __getattr__(name: str):
    """tourkit.build_declared and the other kernel tools, loaded from tourkernels on first use (that module
    imports this one, so a plain import here would be circular)."""
    if name in KERNEL_NAMES:
        import tourkernels

        return getattr(tourkernels, name)
    raise AttributeError(f"module 'tourkit' has no attribute {name!r}")


# ---- Capturing what C code prints (device printf, nvcc, native libraries) -------------------------------


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


# ---- Formatting -----------------------------------------------------------------------------------------


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The exception on one line; of a failed compile (TileLang's message opens with the CUDA source), the
    compiler's errors."""
    raw = str(exc)
    if "Compilation error" in raw:
        log = raw.split("Compilation error", 1)[1].splitlines()
        raw = "compile error: " + " ".join([x for x in log if "error" in x or "fatal" in x][:2] or log[:3])
    text = " ".join(raw.split()) or type(exc).__name__
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
