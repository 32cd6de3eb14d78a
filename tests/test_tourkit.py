"""The shared kit's arithmetic, validation, architecture handling and source inspection (CPU only)."""

import dataclasses
import math
import os

import pytest
import torch

import tourkit


def test_throughput_arithmetic():
    assert tourkit.gbps(4e9, 1.0) == pytest.approx(4000.0)  # 4 GB in 1 ms = 4 TB/s
    assert tourkit.tflops(2 * 8192**3, 2.0) == pytest.approx(549.755813888)
    assert tourkit.speedup(reference_ms=2.0, ours_ms=1.6) == pytest.approx(1.25)


def test_relative_error_is_the_norm_ratio():
    ref = torch.tensor([3.0, 4.0])
    out = torch.tensor([3.0, 4.5])
    assert tourkit.relative_error(out, ref) == pytest.approx(0.5 / 5.0)
    assert tourkit.relative_error(ref.clone(), ref) == 0.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_inf_never_passes(bad):
    ref = torch.ones(8)
    out = torch.ones(8)
    out[3] = bad
    err = tourkit.relative_error(out, ref)
    assert math.isinf(err)
    assert not tourkit.Check("k", err, 1e9).passed


def test_relative_error_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shape mismatch"):
        tourkit.relative_error(torch.ones(4), torch.ones(5))


def test_validate_poisons_the_output_first():
    ref = torch.arange(6, dtype=torch.float32)
    out = ref.clone()  # already "right": a kernel that writes nothing must still fail

    def writes_half():
        out[:3] = ref[:3]

    check = tourkit.validate("half-writer", writes_half, out, ref, 1e-3)
    assert not check.passed
    assert "FAILED" in check.line()

    def writes_all():
        out.copy_(ref + 1e-6)

    assert tourkit.validate("writer", writes_all, out, ref, 1e-3).passed


def test_require_raises_on_failed_check():
    tourkit.require([tourkit.Check("a", 1e-5, 1e-3)])
    with pytest.raises(tourkit.ValidationError, match="b: rel. error"):
        tourkit.require([tourkit.Check("a", 1e-5, 1e-3), tourkit.Check("b", 0.5, 1e-3)])


def test_poison_integers():
    t = torch.zeros(3, dtype=torch.int32)
    tourkit.poison_(t)
    assert int(t[0]) == torch.iinfo(torch.int32).max


def test_arch_checks():
    assert tourkit.check_arch("sm_80") == "sm_80"
    with pytest.raises(tourkit.UsageError, match="sm_90a"):
        tourkit.check_arch("sm_90")
    with pytest.raises(tourkit.UsageError, match="unknown --arch"):
        tourkit.check_arch("sm_61")
    assert tourkit.arch_for_capability(9, 0) == "sm_90a"
    assert tourkit.arch_for_capability(8, 9) == "sm_89"
    assert tourkit.arch_for_capability(8, 7) == "sm_86"  # Orin: closest known below
    assert tourkit.arch_for_capability(10, 0) == "sm_100a" and tourkit.arch_for_capability(10, 3) == "sm_100a"
    assert tourkit.arch_for_capability(12, 0) == "sm_120a" and tourkit.arch_for_capability(12, 1) == "sm_120a"
    assert tourkit.ARCH_SPECS["sm_100a"].family == "ampere" and tourkit.ARCH_SPECS["sm_120a"].family == "ada"
    assert tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin == 232448
    assert tourkit.ARCH_SPECS["sm_86"].family == "ampere"


def test_which_gpus_run_the_kernels_and_what_their_kernels_show():
    def gpu(capability):
        return tourkit.DeviceInfo("gpu", capability, tourkit.arch_for_capability(*capability), 80, 2**34, 49152, 2**22)

    assert not tourkit.runs_kernels(None)
    assert not tourkit.runs_kernels(gpu((6, 0))) and not tourkit.runs_kernels(gpu((7, 0)))  # P100, V100
    assert tourkit.runs_kernels(gpu((7, 5))) and tourkit.runs_kernels(gpu((12, 0)))
    assert tourkit.tensor_core_markers("sm_90a") == ["wgmma", "tma_load", "mbarrier"]
    assert tourkit.tensor_core_markers("sm_80") == ["cp_async", "ldmatrix", "mma_sync"]
    assert tourkit.tensor_core_markers("sm_120a") == ["tma_load", "mbarrier", "mma_sync"]  # TMA-fed mma.sync


def test_marker_counting_and_static_shared_memory():
    source = """
    __shared__ __align__(16) uint64_t mbarrier_mem[6];
    __shared__ float red_buf[64];
    tl::tma_load(A_desc, mbarrier[0], ...); tl::wgmma_ss<...>(); __syncthreads(); __syncthreads();
    const dim3 blockIdx = tl::rasterization2DRow<10>();
    """
    markers = tourkit.count_markers(source)
    assert markers["tma_load"] == 1 and markers["wgmma"] == 1 and markers["__syncthreads"] == 2
    assert markers["rasterization"] == 1 and markers["cp_async"] == 0 and markers["mbarrier"] == 2
    assert tourkit.static_smem_bytes(source) == 6 * 8 + 64 * 4


def test_format_table_aligns_columns():
    text = tourkit.format_table(["a", "value"], [["x", 1.23456], ["longer", 12345.6]])
    lines = text.splitlines()
    assert lines[0].startswith("a       value")
    assert lines[2] == "x       1.23"
    assert lines[3] == "longer  12346"


def test_format_bytes():
    assert tourkit.format_bytes(512) == "512 B"
    assert tourkit.format_bytes(227 * 1024) == "227.0 KiB"
    assert tourkit.format_bytes(3 * 1024**3) == "3.0 GiB"


def test_context_log_and_headline(capsys):
    ctx = tourkit.TourContext(compile_only=True, arch="sm_80")
    ctx.log("line one\nline two")
    ctx.headline(tflops=123.4)
    ctx.metric(extra=1)
    assert ctx.report == ["line one", "line two"]
    assert ctx.headlines == {"tflops": 123.4}
    assert ctx.metrics == {"tflops": 123.4, "extra": 1}
    assert ctx.smem_budget == 163 * 1024
    assert "line two" in capsys.readouterr().out


def test_probe_reports_a_clean_reason_for_a_broken_import(monkeypatch, tmp_path):
    # A fake "tilelang" package that dies on import: the probe must survive and say why, in one line.
    pkg = tmp_path / "tilelang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libtvm.so: cannot open shared object file')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ok, reason = tourkit.probe_tilelang_import()
    assert not ok
    assert "libtvm.so" in reason and "\n" not in reason


def test_probe_survives_an_aborting_import(monkeypatch, tmp_path):
    pkg = tmp_path / "tilelang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import os\nos.abort()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    ok, reason = tourkit.probe_tilelang_import()
    assert not ok and "signal" in reason


def test_in_the_worker_the_probe_imports_in_process_and_reports_a_broken_import(tmp_path):
    import subprocess
    import sys

    pkg = tmp_path / "tilelang"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('libtvm.so: cannot open shared object file')\n")
    code = ("import os, sys, tourkit; ok, why = tourkit.probe_tilelang_import(); "
            "print(ok, why, 'tilelang' in sys.modules, os.getpid())")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{tourkit_dir()}", TILELANG_TOUR_WORKER="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("False importing tilelang failed: libtvm.so"), out.stdout + out.stderr
    env["PYTHONPATH"] = tourkit_dir()
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("True ") and " True " in out.stdout  # imported here, not in a child


def tourkit_dir() -> str:
    return os.path.dirname(os.path.abspath(tourkit.__file__))


def test_inspect_kernels_keeps_job_order_and_per_job_arch():
    from sections.vector_add import vector_add_program

    jobs = [("a", vector_add_program(1000), "sm_80"), ("b", vector_add_program(2**20), "sm_90a")]
    reports = tourkit.inspect_kernels(jobs, nvcc=False)
    assert [(r.name, r.arch, r.nvcc) for r in reports] == [("a", "sm_80", "lowered only"), ("b", "sm_90a", "lowered only")]
    assert reports[0].grid == (1, 1, 1) and reports[1].grid == (1024, 1, 1)


def test_memory_cache_hit_warnings_are_dropped_and_others_kept():
    import logging

    class Keep(logging.Handler):  # on the logger itself: tilelang's loggers may not propagate to the root
        def __init__(self):
            super().__init__(logging.WARNING)
            self.records = []

        def emit(self, record):
            self.records.append(record)

    tourkit.quiet_tilelang()
    tourkit.quiet_tilelang()  # idempotent: one filter
    logger = logging.getLogger("tilelang.cache.kernel_cache")
    assert sum(isinstance(f, tourkit._DropMemoryCacheHits) for f in logger.filters) == 1
    keep = Keep()
    logger.addHandler(keep)
    try:
        logger.warning("Found kernel '%s' in memory cache. For better performance, ...", "gemm")
        logger.warning("something else went wrong")
    finally:
        logger.removeHandler(keep)
    assert [r.getMessage() for r in keep.records] == ["something else went wrong"]


def test_taking_turns_cancels_a_linear_clock_drift(monkeypatch):
    """Three equally fast contenders on a GPU that slows by 1% per reading: the forward/backward pairs give
    them equal times (a median of A B C, C B A, A B C would have favoured A); a truly faster one stays faster."""
    readings = []

    def drifting_bench_ms(fn, **kwargs):
        readings.append(fn())
        return fn() * (1.0 + 0.01 * len(readings))

    monkeypatch.setattr(tourkit, "bench_ms", drifting_bench_ms)
    monkeypatch.setattr(tourkit, "settle", lambda fns, ms: None)
    times = tourkit.bench_interleaved({"A": lambda: 1.0, "B": lambda: 1.0, "C": lambda: 1.0}, rounds=3)
    assert len(readings) == 12  # rounded up to 4 rounds: two forward/backward pairs
    assert readings[:6] == [1.0] * 6 and times["A"] == pytest.approx(times["B"]) == pytest.approx(times["C"])
    readings.clear()
    times = tourkit.bench_interleaved({"A": lambda: 1.0, "fast": lambda: 0.97}, rounds=2)
    assert len(readings) == 4 and times["fast"] < times["A"]
    assert times["A"] / times["fast"] == pytest.approx(1.0 / 0.97, rel=2e-3)


def test_bench_interleaved_hands_out_the_pairs_behind_its_medians(monkeypatch):
    """`pairs` gets each contender's per-pair mean, the values the median is taken over; pair_ratio_range reads
    the lowest and highest speedup over them."""
    script = iter([1.0, 2.0, 2.1, 1.2,    # pair 1, in the order A B | B A: A 1.1, B 2.05
                   1.0, 1.2, 1.2, 1.0,    # pair 2: A 1.0, B 1.2
                   3.0, 1.0, 1.0, 3.0])   # pair 3: A 3.0, B 1.0
    monkeypatch.setattr(tourkit, "bench_ms", lambda fn, **kw: next(script))
    monkeypatch.setattr(tourkit, "settle", lambda fns, ms: None)
    pairs = {}
    times = tourkit.bench_interleaved({"A": lambda: None, "B": lambda: None}, rounds=6, pairs=pairs)
    assert pairs == {"A": pytest.approx([1.1, 1.0, 3.0]), "B": pytest.approx([2.05, 1.2, 1.0])}
    assert times == {"A": pytest.approx(1.1), "B": pytest.approx(1.2)}
    assert tourkit.pair_ratio_range(pairs["A"], pairs["B"]) == (pytest.approx(1.1 / 2.05), pytest.approx(3.0))


def test_bench_interleaved_settles_the_gpu_before_the_first_timed_round(monkeypatch):
    """By default every contender runs, untimed, for SETTLE_MS before any reading; settle_ms=0 skips it."""
    assert tourkit.SETTLE_MS == 0.0  # conftest: no settling in CPU tests
    monkeypatch.setattr(tourkit, "SETTLE_MS", 1500.0)
    events = []
    monkeypatch.setattr(tourkit, "bench_ms", lambda fn, **kw: events.append(("timed", fn())) or 1.0)
    monkeypatch.setattr(tourkit, "settle", lambda fns, ms: events.append(("settle", sorted(f() for f in fns), ms)))
    tourkit.bench_interleaved({"A": lambda: "a", "B": lambda: "b"}, rounds=2)
    assert events[0] == ("settle", ["a", "b"], 1500.0)
    assert [e[0] for e in events[1:]] == ["timed"] * 4
    events.clear()
    tourkit.bench_interleaved({"A": lambda: "a"}, rounds=2, settle_ms=0)
    assert [e[0] for e in events] == ["timed"] * 2


def test_settle_runs_every_contender_until_the_deadline(monkeypatch):
    import sys
    import types

    calls = {"a": 0, "b": 0, "sync": 0}
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: True, synchronize=lambda: calls.__setitem__("sync", calls["sync"] + 1)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    clock = iter(range(100))
    monkeypatch.setattr(tourkit.time, "perf_counter", lambda: next(clock) * 0.001)  # 1 ms per reading
    tourkit.settle([lambda: calls.__setitem__("a", calls["a"] + 1), lambda: calls.__setitem__("b", calls["b"] + 1)], 5)
    assert calls["a"] == calls["b"] == calls["sync"] >= 4
    fake_torch.cuda.is_available = lambda: False  # no GPU: returns at once
    tourkit.settle([lambda: calls.__setitem__("a", -1)], 5)
    assert calls["a"] >= 4


@pytest.mark.parametrize("mode,expected", [("write", "zero_"), ("read", "max")])
def test_bench_ms_flushes_the_l2_before_every_timed_call(monkeypatch, mode, expected):
    """'write' zeroes the flush buffer (dirty lines), 'read' reads it (clean lines); once per timed call,
    never inside the timed events; an unknown mode is a clear error."""
    import sys
    import types

    log = []

    class Event:
        def __init__(self, enable_timing):
            self.t = None

        def record(self):
            log.append("event")
            self.t = len(log)

        def elapsed_time(self, other):
            return float(other.t - self.t)

    class FlushBuffer:
        def zero_(self):
            log.append("zero_")

        def max(self):
            log.append("max")

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=Event, synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monkeypatch.setattr(tourkit, "_flush_buffer", lambda: FlushBuffer())
    tourkit.bench_ms(lambda: log.append("fn"), warmup_ms=1, rep_ms=5, min_reps=5, max_reps=5, flush_mode=mode)
    timed = log[log.index(expected):]
    assert timed == [expected, "event", "fn", "event"] * 5
    assert {"zero_", "max"} - {expected} & set(log) == set()
    with pytest.raises(ValueError, match="flush_mode"):
        tourkit.bench_ms(lambda: None, flush_mode="none")


def test_quiet_tilelang_silences_the_compile_log_unless_the_user_asked_for_it(monkeypatch):
    monkeypatch.delenv("TILELANG_PRINT_ON_COMPILATION", raising=False)
    tourkit.quiet_tilelang()
    from tilelang import env

    assert not env.is_print_on_compilation_enabled()
    monkeypatch.setenv("TILELANG_PRINT_ON_COMPILATION", "1")
    tourkit.quiet_tilelang()
    assert env.is_print_on_compilation_enabled()


def test_inspect_declared_reports_every_kernel_and_enforces_markers_and_shared_memory():
    from sections.vector_add import vector_add_program

    ctx = tourkit.TourContext(compile_only=True, arch="sm_80", echo=False)
    decls = [tourkit.KernelDecl("aligned", lambda: vector_add_program(2**20), threads=256, nvcc=False),
             tourkit.KernelDecl("ragged", lambda: vector_add_program(1000), nvcc=False)]
    reports = tourkit.inspect_declared(ctx, decls)
    assert list(reports) == ["aligned", "ragged"] and reports["aligned"].nvcc == "lowered only"
    assert any("aligned" in line for line in ctx.report)
    with pytest.raises(tourkit.ValidationError, match="wgmma"):
        tourkit.inspect_declared(ctx, [dataclasses.replace(decls[1], markers=("wgmma",))])
    with pytest.raises(tourkit.ValidationError, match="shared memory"):
        tourkit.inspect_declared(ctx, [dataclasses.replace(decls[1], smem_limit=-1)])



def test_background_compiles_wait_while_the_gpu_is_timed(monkeypatch):
    # A kernel loaded by the background preparer while a section times its kernels stalls the timing (the GIL,
    # the driver's module loader): compile_many's workers wait for the timing to end.
    import threading
    import time

    import tilelang
    import tourkernels

    compiled = []
    monkeypatch.setattr(tilelang, "compile", lambda func, **kw: compiled.append(time.perf_counter()) or func)

    @tourkit.timing_window
    def timing(background):
        background.start()
        time.sleep(0.3)
        return list(compiled), time.perf_counter()

    background = threading.Thread(target=tourkernels.compile_many, args=(["a", "b"],))
    during, ended = timing(background)
    background.join(5)
    assert during == [] and len(compiled) == 2 and min(compiled) >= ended
    compiled.clear()  # the control: with no timing in progress the same compiles run at once
    background = threading.Thread(target=tourkernels.compile_many, args=(["a", "b"],))
    background.start()
    background.join(5)
    assert len(compiled) == 2


def test_a_failed_timing_still_lets_compiles_run():
    import threading

    waited = []

    def background_wait():
        thread = threading.Thread(target=lambda: waited.append(tourkit.wait_until_untimed(timeout=0.05)))
        thread.start()
        thread.join()

    @tourkit.timing_window
    def failing():
        background_wait()
        raise RuntimeError("the kernel failed its check")

    with pytest.raises(RuntimeError):
        failing()
    background_wait()
    assert waited == [False, True] and tourkit.wait_until_untimed()  # the main thread never waits


def test_a_failed_compile_is_told_by_the_compilers_error_not_the_source():
    """TileLang's compile error opens with the whole CUDA source; the one line shows what ptxas said."""
    source = "#if defined(_MSC_VER)\n#include <cuda.h>\nextern \"C\" __global__ void gemm_kernel() {}\n" * 50
    exc = RuntimeError(source + "Compilation error:\nptxas warning : something\nptxas fatal   : (C7602) Insufficient "
                       "registers (80) to compile instruction\nptxas fatal   : Ptx assembly aborted due to errors\n")
    line = tourkit.one_line(exc)
    assert line.startswith("compile error: ptxas fatal : (C7602) Insufficient registers (80)"), line
    assert "#include" not in line and "warning" not in line
    assert tourkit.one_line(ValueError("bad shape")) == "bad shape"
