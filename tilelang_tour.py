#!/usr/bin/env python3
"""TileLang Tour: build real GPU kernels in TileLang, check them against PyTorch, time them, look inside.

    python tilelang_tour.py                          # the whole tour
    python tilelang_tour.py --only flash_attention   # one section
    python tilelang_tour.py --compile-only --arch sm_80   # no GPU: build and inspect the kernels
    python tilelang_tour.py --list

The runner knows nothing about kernels: it runs the registered sections in order, isolates their
failures, records status, time and headline numbers, and prints a summary and a TileLang quick reference.
The sections run in a worker process (tourrunner.py), so a crash, a hung kernel or a broken CUDA context
costs one section; `--no-isolate` runs them in this process instead (for a debugger). To see it work:
TILELANG_TOUR_FAULT=vector_add:segfault (or raise, abort, exit, hang, gpu-hang, gpu-illegal-address).
Exit codes: 0 all ran (or skipped), 1 a section failed, crashed or timed out, 2 usage error, 130 Ctrl-C.
From a notebook: `import tilelang_tour; tilelang_tour.main(["--only", "gemm_schedules"])`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import json
import math
import os
import platform
import signal
import sys
import threading
import time
import traceback
import types
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import tourkit
import tourplots  # matplotlib only when drawing
import tourrunner
from sections import SECTION_NAMES
from tourreference import QUICK_REFERENCE
from tourkit import SectionResult, SectionSkip, TourContext, UsageError

DEFAULT_SECTION_TIMEOUT_S = 900
FAILING = ("failed", "crashed", "timed out")
# For the runner's own tests: a module to take the sections from instead of the `sections` package. It
# defines SECTION_NAMES and load_section(name), and may define detect_device(), probe_tilelang_import()
# and gpu_check() in place of the real ones (tests/fake_sections.py).
SECTIONS_ENV = "TILELANG_TOUR_SECTIONS"


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


class _ArgumentParser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so a notebook never sees a SystemExit traceback."""

    def error(self, message: str):
        raise UsageError(message)

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            sys.stderr.write(message)
        raise _EarlyExit(status)


class _EarlyExit(Exception):
    def __init__(self, status: int):
        self.status = status


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(
        prog="tilelang_tour.py",
        description="A hands-on tour of TileLang: real kernels, checked and timed against PyTorch.",
    )
    parser.add_argument("--list", action="store_true", help="list the sections and exit")
    parser.add_argument("--only", action="append", default=[], metavar="A,B", help="run only these sections")
    parser.add_argument("--skip", action="append", default=[], metavar="A,B", help="skip these sections")
    parser.add_argument("--json", metavar="PATH", help="write the environment and every section's record")
    parser.add_argument("--plots", metavar="DIR", help="write the plots (GEMM bars, throughput, roofline) to DIR")
    parser.add_argument("--quick", action="store_true", help="small problem sizes")
    parser.add_argument("--full", action="store_true", help="the long sweeps (GEMM shape set, full tuning space)")
    parser.add_argument("-x", "--exitfirst", action="store_true", help="stop after the first failed section")
    parser.add_argument("--compile-only", action="store_true",
                        help="build every kernel for --arch and show what TileLang generated; run nothing")
    parser.add_argument("--arch", help=f"target for --compile-only ({', '.join(tourkit.ARCH_SPECS)}); "
                                       f"default: the GPU's, else {tourkit.DEFAULT_ARCH}")
    parser.add_argument("--timeout", type=float, default=DEFAULT_SECTION_TIMEOUT_S, metavar="S",
                        help=f"seconds one section may take (default {DEFAULT_SECTION_TIMEOUT_S}; 0: no limit)")
    parser.add_argument("--install", action="store_true", help="env_check: pip-install tilelang if missing")
    parser.add_argument("--no-isolate", action="store_true",
                        help="run the sections in this process, not in a worker process (for a debugger)")
    parser.add_argument("--shape", metavar="DIMS",
                        help="your own problem for the one section chosen with --only: vector_add N; "
                             "gemm_schedules, fusion, autotune MxNxK; softmax MxN; flash_attention BxHxSxD "
                             "or BxHxSxDxKVH (grouped-query)")
    parser.add_argument("--dtype", default="float16", metavar="TYPE",
                        help="float16 (default) or bfloat16 (sm_80 and newer): the GEMM, fusion, softmax, "
                             "attention and autotune kernels' element type")
    return parser


def section_source(loader=None) -> types.SimpleNamespace:
    """Where the sections come from (names, load_section) and the device/tilelang probes that go with
    them: the `sections` package, or the test module named by TILELANG_TOUR_SECTIONS."""
    module_name = os.environ.get(SECTIONS_ENV)
    module = None
    if module_name:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(f"{SECTIONS_ENV}={module_name}: {exc}") from None

    def pick(name, default):
        return getattr(module, name, None) or default

    return types.SimpleNamespace(
        names=list(pick("SECTION_NAMES", SECTION_NAMES)),
        load_section=loader or pick("load_section", load_section),
        detect_device=pick("detect_device", lambda: tourkit.detect_device()),
        probe_tilelang_import=pick("probe_tilelang_import", lambda: tourkit.probe_tilelang_import()),
        gpu_check=pick("gpu_check", tourrunner.gpu_answers))


def _split_names(values: Sequence[str], option: str, valid: Sequence[str]) -> list[str]:
    names = []
    for value in values:
        found = [n.strip() for n in value.split(",") if n.strip()]
        if not found:
            raise UsageError(f"{option} {value!r} names no section; valid sections: {', '.join(valid)}")
        names += found
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise UsageError(f"unknown section {', '.join(map(repr, unknown))}; valid sections: {', '.join(valid)}")
    return names


def select_sections(only: Sequence[str], skip: Sequence[str], valid: Sequence[str] = SECTION_NAMES) -> list[str]:
    only_names, skip_names = _split_names(only, "--only", valid), _split_names(skip, "--skip", valid)
    chosen = [n for n in valid if not only_names or n in only_names]
    return [n for n in chosen if n not in skip_names]


def problem_shape(args, names: Sequence[str]) -> tuple[int, ...] | None:
    """--shape and --dtype checked against the selected sections: the parsed dims or None (UsageError: one line)."""
    from sections import shapes

    try:
        return shapes.check_request(list(names), bool(args.only), args.shape, args.dtype)
    except shapes.ShapeError as exc:
        raise UsageError(str(exc)) from None


def check_json_path(path: str) -> None:
    """Refuse a --json path that cannot be written, before anything runs (nothing is left behind)."""
    if os.path.isdir(path):
        raise UsageError(f"--json {path}: is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--json {path}: the directory {folder} does not exist")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        raise UsageError(f"--json {path}: cannot be written ({exc.strerror or exc})") from None
    if not existed:
        os.remove(path)


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules or "google.colab" in sys.modules


# ---------------------------------------------------------------------------------------------------------
# Running sections
# ---------------------------------------------------------------------------------------------------------


class SectionTimeout(Exception):
    pass


class _Deadline:
    """Raise SectionTimeout in the main thread after `seconds` (SIGALRM; a no-op where unavailable)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.active = seconds > 0 and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()

    def _fire(self, signum, frame):
        raise SectionTimeout(f"took more than {self.seconds:.0f} s")

    def __enter__(self):
        if self.active:
            self.previous = signal.signal(signal.SIGALRM, self._fire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc):
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False


@dataclass
class RunOptions:
    quick: bool = False
    full: bool = False
    compile_only: bool = False
    arch: str | None = None
    timeout: float = DEFAULT_SECTION_TIMEOUT_S
    install: bool = False
    exitfirst: bool = False
    shape: list[int] | None = None  # --shape, parsed and checked (sections/shapes.py)
    dtype: str = "float16"
    extra: dict[str, Any] = field(default_factory=dict)

    def context(self, device, **kwargs) -> TourContext:
        """The TourContext a section gets under these options."""
        return TourContext(quick=self.quick, compile_only=self.compile_only, arch=self.arch, device=device,
                           full=self.full, shape=self.shape, dtype=self.dtype, **kwargs)


def _traceback_tail(exc: BaseException, lines: int = 8) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return "\n".join(text.rstrip().splitlines()[-lines:])


def load_section(name: str):
    return importlib.import_module(f"sections.{name}").SECTION


class _Preparer:
    """Compiles the sections' declared kernels (Section.kernels) one section after another in a background
    thread, in tour order: while section k runs on the GPU, the CPU cores compile for the sections after it.
    The runner waits for a section's kernels before running the section. A compile that fails is ignored:
    the section's own run meets (and reports) the same problem."""

    def __init__(self, jobs: Sequence[tuple[str, Any]]):
        self.done = {name: threading.Event() for name, _ in jobs}
        if jobs:
            threading.Thread(target=self._work, args=(list(jobs),), name="tour-prepare", daemon=True).start()

    def _work(self, jobs) -> None:
        for name, hook in jobs:
            try:
                hook()
            except BaseException:  # noqa: BLE001 - reported by the section's own run
                pass
            finally:
                self.done[name].set()

    def wait(self, name: str) -> None:
        event = self.done.get(name)
        if event is not None:
            event.wait()


def _build_declared(section, ctx: TourContext) -> None:
    tourkit.build_declared(section.kernels(ctx))


def start_preparing(names: Sequence[str], options: RunOptions, device, loader=load_section) -> _Preparer:
    """A _Preparer for the GPU sections among `names` that declare kernels (none in compile-only mode)."""
    jobs = []
    if tourkit.runs_kernels(device) and not options.compile_only:
        for name in names:
            try:
                section = loader(name)
            except Exception:  # the section's own run reports an import problem
                continue
            ctx = options.context(device, echo=False)
            if getattr(section, "kernels", None) is not None:
                jobs.append((name, functools.partial(_build_declared, section, ctx)))
    return _Preparer(jobs)


def run_section(name: str, options: RunOptions, device, tilelang_probe: tuple[bool, str] | None,
                loader=load_section, preparer: _Preparer | None = None, *, fault: str | None = None,
                gpu_broken: str | None = None, on_load=None) -> SectionResult:
    """Run one section and return its record. Never raises, except KeyboardInterrupt. `fault`: a
    TILELANG_TOUR_FAULT kind to inject before the run; `gpu_broken`: why GPU sections must skip."""
    result = SectionResult(name=name, title=name)
    started = time.perf_counter()
    ctx = options.context(device)
    ctx.install = options.install  # only env_check reads it
    try:
        with _Deadline(options.timeout):
            if tilelang_probe is not None and not tilelang_probe[0]:
                raise SectionSkip(f"tilelang is unavailable: {tilelang_probe[1]}")
            section = loader(name)
            result.title = section.title
            if on_load is not None:
                on_load(section)
            _print_start(section)
            _check_needs(section, ctx, gpu_broken)
            if preparer is not None:
                preparer.wait(name)
            if fault:
                tourrunner.inject_fault(name, fault)
            section.run(ctx)
        result.status = "passed"
    except SectionSkip as skip:
        result.status, result.skip_reason = "skipped", str(skip)
    except SectionTimeout as exc:
        result.status, result.error_type, result.error_message = "timed out", "SectionTimeout", str(exc)
    except KeyboardInterrupt:
        result.status = "interrupted"
        result.seconds = time.perf_counter() - started
        raise _Interrupted(result)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] in ("tilelang", "torch", "tvm", "numpy"):
            result.status, result.skip_reason = "skipped", f"{exc.name} is not installed"
        else:
            _record_failure(result, exc)
    except Exception as exc:  # a section's failure must never take the tour down
        _record_failure(result, exc)
    result.seconds = time.perf_counter() - started
    result.headline, result.metrics, result.report = ctx.headlines, ctx.metrics, ctx.report
    _print_end(result)
    return result


class _Interrupted(Exception):
    def __init__(self, result: SectionResult):
        self.result = result


def _record_failure(result: SectionResult, exc: BaseException) -> None:
    result.status = "failed"
    result.error_type = type(exc).__name__
    result.error_message = tourkit.one_line(exc, 500)
    result.traceback_tail = _traceback_tail(exc)


def _check_needs(section, ctx: TourContext, gpu_broken: str | None = None) -> None:
    _check_dtype(section, ctx)
    if ctx.compile_only:
        if not section.supports_compile_only:
            raise SectionSkip("has nothing to compile in --compile-only mode")
        return
    if section.needs_gpu and gpu_broken:
        raise SectionSkip(gpu_broken)
    if section.needs_gpu and not ctx.has_gpu:
        raise SectionSkip("no CUDA GPU found; run with --compile-only (e.g. --arch sm_90a) to build and "
                          "inspect the kernels without one")
    if section.needs_gpu and not tourkit.runs_kernels(ctx.device):
        raise SectionSkip(f"{ctx.device.name} has compute capability %d.%d; the tour's kernels need 7.5 (Turing) "
                          "or newer: --compile-only builds and inspects them" % ctx.device.capability)
    if section.min_capability and ctx.has_gpu and ctx.device.capability < section.min_capability:
        need = "%d.%d" % section.min_capability
        raise SectionSkip(f"needs compute capability {need}+, this GPU is {ctx.device.capability[0]}.{ctx.device.capability[1]}")
    if section.needs_nvcc and tourkit.find_nvcc() is None:
        raise SectionSkip("needs nvcc (the CUDA toolkit) on the PATH or in CUDA_HOME")


def _check_dtype(section, ctx: TourContext) -> None:
    """bfloat16 arithmetic needs sm_80 or newer: elsewhere the sections that take --dtype skip."""
    from sections import shapes

    if ctx.dtype != "bfloat16" or section.name not in shapes.DTYPE_SECTIONS:
        return
    on_gpu = ctx.has_gpu and not ctx.compile_only
    capability = ctx.device.capability if on_gpu else tourkit.ARCH_SPECS[ctx.arch].capability
    if tuple(capability) < (8, 0):
        where = f"this GPU is sm_{capability[0]}{capability[1]}" if on_gpu else f"the target is {ctx.arch}"
        raise SectionSkip(f"bfloat16 needs sm_80 or newer; {where}")


# ---------------------------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------------------------

_progress = {"index": 0, "total": 0}


def _print_start(section) -> None:
    print(f"\n▶ [{_progress['index']}/{_progress['total']}] {section.name}: {section.title}", flush=True)
    print(f"  {section.summary}", flush=True)


def _print_end(result: SectionResult, tail: bool = True) -> None:
    detail = headline_text(result)
    print(f"■ [{_progress['index']}/{_progress['total']}] {result.name} {result.status} "
          f"in {result.seconds:.1f} s{' — ' + detail if detail else ''}", flush=True)
    if tail and result.status in ("failed", "timed out") and result.traceback_tail:
        print(tourkit.indent(result.traceback_tail, "    | "), flush=True)


def headline_text(result: SectionResult) -> str:
    if result.status == "skipped":
        return result.skip_reason or ""
    if result.status in FAILING:
        return f"{result.error_type}: {result.error_message}"
    return ", ".join(f"{k} {tourkit._cell(v)}" for k, v in result.headline.items())


def print_summary(results: Sequence[SectionResult]) -> None:
    print("\nSummary", flush=True)
    rows = [[r.name, r.status, f"{r.seconds:.1f}", headline_text(r)[:110]] for r in results]
    print(tourkit.indent(tourkit.format_table(["section", "status", "seconds", "headline"], rows)), flush=True)
    statuses = ("passed", "failed", "crashed", "timed out", "skipped", "interrupted")
    counts = {s: sum(r.status == s for r in results) for s in statuses}
    print("  " + ", ".join(f"{n} {s}" for s, n in counts.items() if n), flush=True)


def gpu_arch(device) -> str:
    """The architecture the kernels are built for on `device`, or what it is when it is too old for them."""
    return device.arch if tourkit.runs_kernels(device) else "sm_%d%d, older than the kernels need" % device.capability


def header_line(count: int, options: RunOptions, device) -> str:
    mode = f"compile-only for {options.arch}" if options.compile_only else (
        f"on {device.name} ({gpu_arch(device)})" if device else "without a GPU")
    problem = f", shape {'x'.join(map(str, options.shape))}" if options.shape else ""
    dtype = f", {options.dtype}" if options.dtype != "float16" else ""
    return f"TileLang Tour — {count} section(s), {mode}{', quick sizes' if options.quick else ''}{problem}{dtype}"


def device_from(record: dict | None):
    return None if record is None else tourkit.DeviceInfo(**{**record, "capability": tuple(record["capability"])})


def environment_record(device, tilelang_probe) -> dict[str, Any]:
    try:
        torch_version = importlib.metadata.version("torch")  # not imported: the parent keeps off CUDA
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch_version,
        "tilelang": tilelang_probe[1] if tilelang_probe and tilelang_probe[0] else None,
        "tilelang_problem": None if not tilelang_probe or tilelang_probe[0] else tilelang_probe[1],
        "nvcc": tourkit.find_nvcc(),
        "gpu": None if device is None else {
            "name": device.name, "capability": list(device.capability), "arch": device.arch,
            "sm_count": device.sm_count, "memory_bytes": device.memory_bytes,
            "smem_per_block_optin": device.smem_per_block_optin, "l2_bytes": device.l2_bytes},
        "in_notebook": _in_notebook(),
    }


# ---------------------------------------------------------------------------------------------------------
# The sections, one after another (in this process, or in the worker)
# ---------------------------------------------------------------------------------------------------------


def run_sections(names: Sequence[str], options: RunOptions, device, source, *, faults=None, gpu_broken=None,
                 probe=None, first_index: int = 1, total: int | None = None, send=None):
    """Run `names` here, in order. In the worker, `send(kind, **fields)` (its channel) hears each step, and
    a CUDA error that breaks the context ends the run (the parent goes on in a fresh worker).
    Returns (results, tilelang probe, interrupted)."""
    faults = faults or {}
    with tourkit.quick_timing(options.quick):  # --quick: shorter timings, a quick look rather than a verdict
        return _run_sections(names, options, device, source, faults, gpu_broken, probe, first_index, total, send)


def _run_sections(names, options, device, source, faults, gpu_broken, probe, first_index, total, send):
    in_worker = send is not None
    send = send or (lambda kind, **fields: None)
    results: list[SectionResult] = []
    preparer = None
    _progress["total"] = total or len(names)
    for offset, name in enumerate(names):
        _progress["index"] = first_index + offset
        try:
            if name != "env_check" and probe is None:
                send("probing")  # should importing tilelang kill or hang the worker, the runner says so
                probe = tuple(source.probe_tilelang_import())
                send("probe", probe=probe)
            if name != "env_check" and preparer is None and probe[0]:
                preparer = start_preparing(names[offset:], options, device, source.load_section)
            send("start", name=name)
            result = run_section(name, options, device, probe if name != "env_check" else None,
                                 source.load_section, preparer, fault=faults.get(name), gpu_broken=gpu_broken,
                                 on_load=lambda section: send("loaded", title=section.title))
        except (_Interrupted, KeyboardInterrupt) as stop:  # Ctrl-C inside a section, or between sections
            if isinstance(stop, _Interrupted):
                results.append(stop.result)
            print(f"\n■ interrupted during {name}", flush=True)
            return results, probe, True
        results.append(result)
        retire = in_worker and tourrunner.broken_cuda_context(result)
        send("result", record=result.to_dict(), retire=retire)
        if retire:
            print("  (a CUDA error like this leaves the process's CUDA context unusable: the sections after it "
                  "run in a fresh worker process)", flush=True)
            break
        if options.exitfirst and result.status in FAILING:
            break
    return results, probe, False


def _worker(spec_text: str) -> None:
    """The worker process's entry point (`tilelang_tour.py --worker SPEC`, started by the parent)."""
    spec = json.loads(spec_text)
    os.environ[tourkit.WORKER_ENV] = "1"  # a crash here costs only this process: tilelang is imported in it
    tourrunner.arm_worker_diagnostics()
    channel = tourrunner.Channel(spec["fd"])
    source = section_source()
    options = RunOptions(**{**spec["options"], "timeout": 0})  # the parent enforces the time limits
    device = device_from(spec["device"]) or (source.detect_device() if spec["detect"] else None)
    default_arch(options, device)
    channel.send("hello", pid=os.getpid(), device=asdict(device) if device else None, arch=options.arch)
    if spec["gpu_check"] and tourkit.runs_kernels(device) and not options.compile_only:
        channel.send("gpu_check")
        try:
            source.gpu_check()
        except Exception as exc:  # noqa: BLE001 - any failure means the GPU sections cannot run
            channel.send("gpu_result", ok=False, reason=f"the GPU did not answer a tiny kernel: {tourkit.one_line(exc)}")
            tourrunner.exit_worker(0)
        channel.send("gpu_result", ok=True)
    tourkit.quiet_tilelang()
    probe = tuple(spec["probe"]) if spec["probe"] else None
    results, _, _ = run_sections(spec["names"], options, device, source, faults=spec["faults"],
                                 gpu_broken=spec["gpu_broken"], probe=probe, first_index=spec["first_index"],
                                 total=spec["total"], send=channel.send)
    if not (results and tourrunner.broken_cuda_context(results[-1])):
        channel.send("done")
    tourrunner.exit_worker(0)


# ---------------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TourRun:
    """What `main` returns: every section's record, the environment, and the exit code a shell would see."""

    results: list[SectionResult]
    environment: dict[str, Any]
    exit_code: int

    def to_dict(self) -> dict[str, Any]:
        return {"environment": self.environment, "exit_code": self.exit_code,
                "sections": [r.to_dict() for r in self.results]}


def _exit_code(results: Sequence[SectionResult]) -> int:
    return 1 if any(r.status in FAILING for r in results) else 0


def _usage_error(message: str) -> TourRun:
    print(f"tilelang_tour.py: error: {message}", file=sys.stderr, flush=True)
    return TourRun([], {}, 2)


def _worker_command() -> list[str] | None:
    path = globals().get("__file__")
    return [sys.executable, "-u", os.path.abspath(path), "--worker"] if path and os.path.exists(path) else None


def default_arch(options: RunOptions, device) -> None:
    """--compile-only without --arch builds for the GPU's own architecture, else (none, or one older than the
    kernels need) for the default."""
    if options.compile_only and not options.arch:
        options.arch = device.arch if tourkit.runs_kernels(device) else tourkit.DEFAULT_ARCH


def _run_isolated(names, options: RunOptions, faults, sigint) -> tuple[list[SectionResult], Any, Any, bool]:
    def on_header(device, arch, known):
        options.arch = arch
        line = header_line(len(names), options, device_from(device))
        print(line if known or options.compile_only else line.split(", without")[0], flush=True)

    def on_lost(record, index):
        _progress.update(index=index, total=len(names))
        _print_end(SectionResult(**record), tail=False)

    supervisor = tourrunner.Supervisor(_worker_command(), names, asdict(options), faults=faults, sigint=sigint,
                                       on_header=on_header, on_lost=on_lost,
                                       detect_device=not (options.compile_only and options.arch))
    records = supervisor.run()
    return ([SectionResult(**r) for r in records], device_from(supervisor.device), supervisor.probe,
            supervisor.interrupted)


def _run_here(names, options: RunOptions, source, faults) -> tuple[list[SectionResult], Any, Any, bool]:
    device = None if options.compile_only and options.arch else source.detect_device()
    default_arch(options, device)
    print(header_line(len(names), options, device), flush=True)
    tourkit.quiet_tilelang()
    results, probe, interrupted = run_sections(names, options, device, source, faults=faults)
    return results, device, probe, interrupted


def main(argv: Sequence[str] | None = None, *, loader=None, _sigint=None) -> TourRun | None:
    """Run the tour. `argv=None` reads sys.argv, except inside Jupyter/Colab, whose argv is the kernel's.
    A `loader` (name -> Section) runs those sections in this process, as --no-isolate does."""
    if argv is None:
        argv = [] if _in_notebook() else sys.argv[1:]
    try:
        args = build_parser().parse_args(list(argv))
        source = section_source(loader)
        names = select_sections(args.only, args.skip, source.names)
        if args.arch:
            tourkit.check_arch(args.arch)
        if args.arch and not args.compile_only:
            raise UsageError("--arch only applies with --compile-only (a GPU run uses the GPU's own arch)")
        if not args.timeout >= 0 or math.isinf(args.timeout):
            raise UsageError(f"--timeout {args.timeout:g}: give seconds >= 0 (0: no limit)")
        if args.json:
            check_json_path(args.json)
        shape = problem_shape(args, names)
        isolate = not args.no_isolate and loader is None and _worker_command() is not None
        faults = tourrunner.parse_faults(os.environ.get(tourrunner.FAULT_ENV), source.names, isolate=isolate)
    except UsageError as exc:
        return _usage_error(str(exc))
    except _EarlyExit as early:  # --help
        return TourRun([], {}, early.status)

    if args.list:
        for name in source.names:
            print(name, flush=True)
        return TourRun([], {}, 0)
    if not names:
        return _usage_error("--only/--skip left no section to run")

    options = RunOptions(quick=args.quick, full=args.full, compile_only=args.compile_only, arch=args.arch,
                         timeout=args.timeout, install=args.install, exitfirst=args.exitfirst,
                         shape=list(shape) if shape else None, dtype=args.dtype)
    # From here a Ctrl-C sets a flag (the worker is stopped, the summary printed, the exit code 130);
    # only --no-isolate's sections see it as KeyboardInterrupt, as a debugger expects.
    sigint = _sigint or tourrunner.SigintFlag()
    try:
        if isolate:
            sigint.__enter__()
            results, device, probe, interrupted = _run_isolated(names, options, faults, sigint)
        else:
            with tourrunner.SigintFlag(signal.default_int_handler):
                results, device, probe, interrupted = _run_here(names, options, source, faults)
            sigint.__enter__()
        return _finish(args, names, options, results, environment_record(device, probe), interrupted, sigint)
    finally:
        if sigint is not _sigint:
            sigint.__exit__()


def _finish(args, names, options, results, environment, interrupted, sigint) -> TourRun:
    if options.exitfirst and results and results[-1].status in FAILING and results[-1].name != names[-1]:
        print(f"\n■ stopping after {results[-1].name} (--exitfirst)", flush=True)
    print_summary(results)
    print("\n" + QUICK_REFERENCE, flush=True)
    environment["options"] = {k: v for k, v in asdict(options).items() if k in ("quick", "full", "compile_only",
                                                                             "arch", "shape", "dtype")}
    run = TourRun(results, environment, 130 if interrupted or sigint.fired else _exit_code(results))
    if args.json:
        try:
            with open(args.json, "w") as fh:
                json.dump(run.to_dict(), fh, indent=2, default=str)
            print(f"\nwrote {args.json}", flush=True)
        except OSError as exc:
            print(f"tilelang_tour.py: could not write {args.json}: {exc}", file=sys.stderr, flush=True)
    tourplots.after_tour(results, environment, out_dir=args.plots, inline=_in_notebook())
    if sigint.fired:
        run.exit_code = 130
    return run


def cli() -> int:
    sys.stdout, sys.stderr = tourrunner.ForgivingStream(sys.stdout), tourrunner.ForgivingStream(sys.stderr)
    sigint = tourrunner.SigintFlag().__enter__()  # to the process's exit, Ctrl-C is the runner's to handle
    run = main(_sigint=sigint)
    return run.exit_code if run is not None else 2


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    elif _in_notebook():  # pasted into a cell: run, but never raise SystemExit there
        main()
    else:
        code = cli()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a late Ctrl-C must not turn the exit into a traceback
        sys.exit(code)
