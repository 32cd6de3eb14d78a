"""debugging: device-print capture and parsing, marker tables for sm_80/sm_90a, the lowering trace.

CPU tests lower and nvcc-compile; `gpu` tests run the T.print kernel and the profiler."""

import ctypes
import os

import pytest

import tourkit
from sections import debugging, gemm_schedules

SHARED_LINE = ("msg='shared tile' BlockIdx=(0, 0, 0), ThreadIdx=(0, 0, 0): buffer=tile_s, index={i}, "
               "dtype=float value={v:f}")
FRAGMENT_LINE = ("msg='fragment x2' BlockIdx=(0, 0, 0), ThreadIdx=(0, 0, 0): buffer=tile_f, index={i}, "
                 "dtype=float value={v:f}")
SCALAR_LINE = "msg='scalar' BlockIdx=(0, 0, 0), ThreadIdx=({t}, 0, 0): dtype=float value={v:f}"


def synthetic_print_text(x, scalar_threads=(0,), fragment_scale=2.0):
    """What debug.h's printf formats would print for input x (a flat list)."""
    lines = [SHARED_LINE.format(i=i, v=v) for i, v in enumerate(x)]
    lines += [FRAGMENT_LINE.format(i=i, v=fragment_scale * v) for i, v in enumerate(x)]
    (r0, c0), (r1, c1) = debugging.SCALAR_AT
    scalar = x[r0 * debugging.PRINT_COLS + c0] + x[r1 * debugging.PRINT_COLS + c1]
    lines += [SCALAR_LINE.format(t=t, v=scalar) for t in scalar_threads]
    return "unrelated output\n" + "\n".join(lines) + "\n"


X = [i / 4 - 2 for i in range(debugging.PRINT_ROWS * debugging.PRINT_COLS)]


def test_parse_device_prints_reads_every_field():
    prints = debugging.parse_device_prints(synthetic_print_text(X))
    assert len(prints) == 2 * len(X) + 1
    first = prints[0]
    assert first["msg"] == "shared tile" and first["buffer"] == "tile_s" and first["index"] == 0
    assert first["block"] == (0, 0, 0) and first["thread"] == (0, 0, 0) and first["value"] == X[0]
    assert prints[-1]["msg"] == "scalar" and prints[-1]["index"] is None


def test_check_device_prints_accepts_right_and_catches_wrong_values():
    assert debugging.check_device_prints(debugging.parse_device_prints(synthetic_print_text(X)), X) == []
    wrong_fragment = debugging.parse_device_prints(synthetic_print_text(X, fragment_scale=3.0))
    assert any("fragment" in p for p in debugging.check_device_prints(wrong_fragment, X))
    unguarded = debugging.parse_device_prints(synthetic_print_text(X, scalar_threads=range(32)))
    assert any("scalar" in p for p in debugging.check_device_prints(unguarded, X))
    missing = debugging.parse_device_prints(synthetic_print_text(X[:-1]))
    assert debugging.check_device_prints(missing, X)


def test_capture_fd_output_catches_c_level_printf_under_pytest_capture():
    libc = ctypes.CDLL(None)
    with tourkit.capture_fd_output() as out:
        libc.printf(b"from C %d\n", 7)
        os.write(1, b"raw descriptor\n")
    assert "from C 7" in out.text and "raw descriptor" in out.text
    with tourkit.capture_fd_output() as again:
        pass
    assert again.text == ""  # the descriptor was restored and the next capture starts empty


def test_print_kernel_codegen_has_three_guarded_prints():
    report = tourkit.inspect_kernel("print_demo", debugging.print_demo_program(), "sm_80", nvcc=False)
    calls = [ln for ln in report.source.splitlines() if "debug_print" in ln]
    assert len(calls) == 3, calls


@pytest.fixture(scope="module")
def marker_reports():
    # as in a GPU run on an H200: ctx.arch sm_90a, nothing inspected with nvcc beforehand (all lowered only)
    ctx = tourkit.TourContext(arch="sm_90a", compile_only=True, echo=False)
    return debugging.lower_markers(ctx, {})


def test_markers_sm80_and_sm90a(marker_reports):
    assert list(marker_reports) == ["sm_90a", "sm_80"]  # the running arch first
    for arch, pairs in marker_reports.items():
        for decl, rep in pairs:
            assert decl.markers == tuple(tourkit.TENSOR_CORE_MARKERS[tourkit.ARCH_SPECS[arch].family])
            tourkit.require_markers(rep, decl.markers)
    gemm80, gemm90 = marker_reports["sm_80"][0][1], marker_reports["sm_90a"][0][1]
    assert gemm80.markers["wgmma"] == 0 and gemm80.markers["tma_load"] == 0
    assert gemm90.markers["mma_sync"] == 0 and gemm90.markers["cp_async"] == 0


def test_kernels_are_the_lesson_kernels_and_only_what_the_run_launches():
    run_ctx = tourkit.TourContext(arch="sm_90a", echo=False)
    names = [d.name for d in debugging.kernels(run_ctx)]
    assert names == ["print_demo", "gemm 4096^3"]  # a run launches these two; FlashAttention is only lowered
    compile_ctx = tourkit.TourContext(arch="sm_90a", compile_only=True, echo=False)
    assert [d.name for d in debugging.kernels(compile_ctx)] == names + ["flash_attention d128"]
    gemm = debugging.kernels(run_ctx)[1]
    assert gemm.out_idx == [2] and gemm.threads == debugging.lesson_gemm("sm_90a").threads
    assert debugging.lesson_gemm("sm_90a") == gemm_schedules.lesson_schedules("hopper")[0]


def test_reports_given_are_reused_not_lowered_again(marker_reports):
    ctx = tourkit.TourContext(arch="sm_90a", compile_only=True, echo=False)
    given = {"gemm 4096^3": marker_reports["sm_90a"][0][1]}
    reused = debugging.lower_markers(ctx, given)
    assert reused["sm_90a"][0][1] is given["gemm 4096^3"]
    assert [d.name for d, _ in reused["sm_80"]] == ["gemm 4096^3", "flash_attention d128"]
    assert all(rep.nvcc == "lowered only" for _, rep in reused["sm_80"])
    quick = tourkit.TourContext(arch="sm_90a", quick=True, echo=False)  # a --quick run: the GEMM alone
    assert [[d.name for d, _ in pairs] for pairs in debugging.lower_markers(quick, {}).values()] == [["gemm 1024^3"]] * 2


def test_warp_specialization_launches_more_threads_than_asked(marker_reports):
    (decl80, gemm80), (decl90, gemm90) = marker_reports["sm_80"][0], marker_reports["sm_90a"][0]
    assert gemm80.threads == decl80.threads
    assert gemm90.threads == decl90.threads + 128  # one producer warpgroup


def test_marker_table_layout(marker_reports):
    headers, rows = debugging.marker_table(marker_reports, "sm_90a")
    assert headers[0] == "marker" and headers[-1] == "what it is"
    assert any(h.endswith("sm_90a*") for h in headers) and not any(h.endswith("sm_80*") for h in headers)
    by_marker = {row[0]: row for row in rows}
    assert set(debugging.TABLE_MARKERS) <= set(by_marker)
    sm80_col = next(i for i, h in enumerate(headers) if "sm_80" in h)
    assert by_marker["cp_async"][sm80_col] == marker_reports["sm_80"][0][1].markers["cp_async"] > 0
    assert by_marker["threads asked"][1:3] == [marker_reports["sm_90a"][0][0].threads, marker_reports["sm_80"][0][0].threads]


def test_big_steps_keep_the_largest_in_pass_order():
    class Func:
        def script(self):
            return "a\n" * 10

    steps = [{"pass": f"p{i}", "lines": n} for i, n in enumerate([11, 40, 41, 5, 6, 100, 99, 98, 97, 96, 150])]
    shown = debugging.big_steps(Func(), steps)
    assert len(shown) == debugging.BIG_STEPS_SHOWN
    assert shown[0] == "p1 11->40" and shown[-1] == "p10 96->150" and "p2 40->41" not in shown


def test_lowering_trace_lists_the_passes(tmp_path):
    config = debugging.lesson_gemm("sm_90a")
    func = debugging.gemm_program(512, 512, 512, config)
    steps = debugging.trace_lowering(func, "sm_90a", str(tmp_path))
    names = [s["pass"] for s in steps]
    assert len(steps) > 30 and len(os.listdir(tmp_path)) == len(steps)
    assert "tl.LowerTileOp" in names and "tl.LayoutInference" in names
    ws = next(s for s in steps if s["pass"] == "tl.ProducerConsumerWarpSpecialized")
    assert ws["changed"]  # on Hopper this pass splits producer and consumer warps
    assert "tma_load" in steps[-1]["ir"] or "tma_load" in next(s for s in steps if s["pass"] == "tl.LowerTileOp")["ir"]


def test_debug_knobs_exist_in_installed_tilelang():
    env_rows = {row[0].split("=")[0]: row[1] for row in debugging.known_env_vars()}
    assert env_rows["TILELANG_PASS_DIFF"] != "(not in this version)"
    assert env_rows["TL_LOWER_TRACE"] != "(not in this version)"
    configs = {row[0].split(":")[0]: row[1] for row in debugging.known_pass_configs()}
    assert configs["tl.enable_dump_ir"] == "yes"


def test_section_compile_only_through_runner():
    import tilelang_tour

    run = tilelang_tour.main(["--only", "debugging", "--compile-only", "--arch", "sm_80"])
    result = run.results[0]
    assert result.status == "passed", (result.error_message, result.traceback_tail)
    assert any("launches 384 threads" in line for line in result.report)  # the sm_90a column's note
    assert "device printing" in result.headline["skipped"]
    assert any(line.startswith("print_demo") and "compiled" in line for line in result.report)  # nvcc, sm_80
    trace = [line for line in result.report if "->" in line and "tl." in line]
    assert 1 <= len(trace) <= 2  # the biggest steps only, four a line: no pages of passes


# ---------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_device_print_captured_and_correct():
    ctx = tourkit.TourContext(device=tourkit.detect_device(), echo=False)
    kernel = tourkit.build_declared([debugging.kernels(ctx)[0]])["print_demo"]
    debugging.run_device_print(ctx, kernel)  # raises if a printed value or the output is wrong
    assert ctx.metrics["device_print_lines"] == 2 * len(X) + 1


@pytest.mark.gpu
def test_profiler_part_quick():
    ctx = tourkit.TourContext(device=tourkit.detect_device(), quick=True, echo=False)
    gemm = debugging.kernels(ctx)[1]
    kernel = tourkit.build_declared([gemm])[gemm.name]
    debugging.run_profiler(ctx, kernel, debugging.lesson_gemm(ctx.arch, ctx.smem_budget))
    assert ctx.metrics["profiler_rel_error"] < 2e-3
    assert ctx.metrics["profiler_tilelang_ms"] > 0
