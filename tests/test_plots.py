"""The plots from fake records (tourplots.py), the timing record (TourContext.timing), tilelang_tour --plots,
and ptxas's register and spill figures (tourkernels.ptxas_usage)."""

import json
import sys

import pytest

import tilelang_tour
import tourkit
import tourplots
from tourkit import Section, TourContext

PNG = b"\x89PNG\r\n\x1a\n"


def _timings(*rows):
    ctx = TourContext(echo=False)
    for row in rows:
        ctx.timing(*row[:2], **row[2])
    return ctx.metrics["timings"]


def fake_record():
    """A run's "sections" as a --json file holds them: every kind of timing, several problems, one failure."""
    gemm = [("tl 128x256", 0.30, dict(flops=2 * 4096**3, nbytes=3 * 2 * 4096**2, problem="4096x4096x4096")),
            ("appendix ws", 0.27, dict(flops=2 * 4096**3, nbytes=3 * 2 * 4096**2, problem="4096x4096x4096",
                                       kind="appendix")),
            ("cuBLAS", 0.28, dict(flops=2 * 4096**3, nbytes=3 * 2 * 4096**2, problem="4096x4096x4096",
                                  kind="pytorch")),
            ("tl 64x128", 0.05, dict(flops=2 * 1000 * 3000 * 500, nbytes=2 * (1000 * 500 + 3000 * 500 + 1000 * 3000),
                                     problem="1000x3000x500")),
            ("cuBLAS", 0.06, dict(flops=2 * 1000 * 3000 * 500, nbytes=2 * (1000 * 500 + 3000 * 500 + 1000 * 3000),
                                  problem="1000x3000x500", kind="pytorch"))]
    softmax = [("copy", 0.02, dict(nbytes=2 * 2**27, kind="copy", problem="128 MiB")),
               ("online", 0.04, dict(nbytes=4 * 8192 * 4096, flops=5 * 8192 * 4096, problem="8192x4096")),
               ("torch.softmax", 0.05, dict(nbytes=4 * 8192 * 4096, flops=5 * 8192 * 4096, problem="8192x4096",
                                           kind="pytorch")),
               ("online", 0.50, dict(nbytes=4 * 512 * 65536, problem="512x65536")),
               ("torch.softmax", 0.60, dict(nbytes=4 * 512 * 65536, problem="512x65536", kind="pytorch"))]
    attention = [("fa3", 1.0, dict(flops=4 * 4 * 32 * 4096**2 * 128, nbytes=4 * 4 * 32 * 4096 * 128 * 2,
                                   problem="4x32x4096x128 full")),
                 ("sdpa", 1.2, dict(flops=4 * 4 * 32 * 4096**2 * 128, nbytes=4 * 4 * 32 * 4096 * 128 * 2,
                                    problem="4x32x4096x128 full", kind="pytorch"))]
    return [{"name": "gemm_schedules", "status": "passed", "metrics": {"timings": _timings(*gemm)}},
            {"name": "softmax", "status": "passed", "metrics": {"timings": _timings(*softmax), "copy_gbps": 3e3}},
            {"name": "flash_attention", "status": "passed", "metrics": {"timings": _timings(*attention)}},
            {"name": "fusion", "status": "failed", "metrics": {"timings": _timings(("bad", 0.01, dict(flops=1e12,
                                                                                                      nbytes=1e6)))}},
            {"name": "debugging", "status": "passed", "metrics": {}}]


ENVIRONMENT = {"gpu": {"name": "NVIDIA H200"}}


def test_timing_records_plain_data_that_survives_json():
    ctx = TourContext(echo=False)
    ctx.timing("ours", 1.5, flops=2e9, nbytes=3e6, problem="64x64x64")
    ctx.timing("torch", 2, kind="pytorch")
    assert json.loads(json.dumps(ctx.metrics)) == ctx.metrics
    assert ctx.metrics["timings"][1] == {"name": "torch", "ms": 2.0, "flops": None, "nbytes": None,
                                         "kind": "pytorch", "problem": ""}
    with pytest.raises(ValueError):
        ctx.timing("x", 1.0, kind="mystery")


def test_ceilings_come_from_the_run_and_failed_sections_are_left_out():
    entries = tourplots.timings(fake_record())
    assert {e["section"] for e in entries} == {"gemm_schedules", "softmax", "flash_attention"}
    roof = tourplots.ceilings(entries)
    assert roof["bandwidth"] == pytest.approx(2 * 2**27 / 0.02e-3)  # the copy, not a kernel
    assert roof["compute"] == pytest.approx(4 * 4 * 32 * 4096**2 * 128 / 1e-3)  # the fastest rate timed
    # Without a copy, the fastest stream stands in and says so.
    no_copy = [e for e in entries if e["kind"] != "copy"]
    assert "fastest stream" in tourplots.ceilings(no_copy)["bandwidth_from"]


def test_roofline_points_need_flops_and_bytes():
    points = tourplots.roofline_points(tourplots.timings(fake_record()))
    assert len(points) == 5 + 2 + 2  # gemm, softmax 8192x4096 (both), attention; not the copy nor 512x65536
    assert all(p["intensity"] > 0 and p["rate"] > 0 for p in points)


def test_plots_are_written_and_the_roofline_has_every_point(tmp_path):
    import matplotlib  # noqa: F401  (a test requirement: README, .ci/run)
    record = fake_record()
    paths = tourplots.draw_all(record, str(tmp_path / "plots"), ENVIRONMENT)
    names = sorted(p.rsplit("/", 1)[-1] for p in paths)
    assert names == sorted(tourplots.FILES.values())
    for path in paths:
        with open(path, "rb") as fh:
            assert fh.read(8) == PNG
    fig = tourplots.draw_roofline(tourplots.timings(record), ENVIRONMENT)
    ax = fig.axes[0]
    drawn = sum(len(c.get_offsets()) for c in ax.collections)
    assert drawn == len(tourplots.roofline_points(tourplots.timings(record)))
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "H200" in ax.get_title()
    # PyTorch's points are hollow: their face has no colour.
    hollow = [c for c in ax.collections if len(c.get_offsets()) and not c.get_facecolors().any()]
    assert len(hollow) == 4  # cuBLAS twice, torch.softmax, sdpa


def test_a_record_without_timings_draws_nothing_and_says_so(tmp_path, capsys):
    quiet = [{"name": "softmax", "status": "passed", "metrics": {"kernels": []}}]
    lines = []
    assert tourplots.after_tour(quiet, out_dir=str(tmp_path / "p"), log=lines.append) == []
    assert len(lines) == 1 and "no timed kernels" in lines[0]
    assert not (tmp_path / "p").exists()
    assert tourplots.after_tour(quiet, inline=True, log=lines.append) == [] and len(lines) == 1  # quiet inline
    record = tmp_path / "run.json"
    record.write_text(json.dumps({"environment": {}, "sections": quiet}))
    assert tourplots.main([str(record), "--out", str(tmp_path / "p")]) == 1
    assert "no timed kernels" in capsys.readouterr().out


def test_without_matplotlib_the_tour_says_so_once_and_goes_on(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)  # `import matplotlib...` now raises ImportError
    lines = []
    assert tourplots.after_tour(fake_record(), out_dir=str(tmp_path / "p"), inline=True, log=lines.append) == []
    assert len(lines) == 1 and "matplotlib is not installed" in lines[0] and "pip install matplotlib" in lines[0]


def test_a_plotting_error_is_one_line(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no room")

    monkeypatch.setattr(tourplots, "draw_all", broken)
    lines = []
    assert tourplots.after_tour(fake_record(), out_dir="unused", log=lines.append) == []
    assert len(lines) == 1 and "no room" in lines[0]


def test_cli_draws_from_a_saved_record(tmp_path, capsys):
    import matplotlib  # noqa: F401  (a test requirement: README, .ci/run)
    record = tmp_path / "run.json"
    record.write_text(json.dumps({"environment": ENVIRONMENT, "sections": fake_record()}))
    assert tourplots.main([str(record), "--out", str(tmp_path / "docs")]) == 0
    out = capsys.readouterr().out
    assert "bandwidth ceiling" in out and "compute ceiling" in out
    assert (tmp_path / "docs" / "roofline.png").exists()


def test_tour_plots_option_writes_pngs_after_the_summary(tmp_path, monkeypatch, capsys):
    import matplotlib  # noqa: F401  (a test requirement: README, .ci/run)
    monkeypatch.setattr(tourkit, "probe_tilelang_import", lambda timeout=120.0: (True, "0.0-test"))

    def timed(ctx):
        ctx.timing("ours", 0.5, flops=1e11, nbytes=1e8, problem="p")
        ctx.timing("torch", 0.6, flops=1e11, nbytes=1e8, problem="p", kind="pytorch")

    def load(name):
        return Section(name=name, title=name, summary="a fake section", run=timed, needs_gpu=False)

    out = tmp_path / "plots"
    run = tilelang_tour.main(["--only", "fusion", "--plots", str(out)], loader=load)
    assert run.exit_code == 0
    assert (out / "roofline.png").exists()
    text = capsys.readouterr().out
    assert text.index("Summary") < text.index("plots: wrote")


PTXAS_REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'
ptxas info    : Function properties for main_kernel
    40 bytes stack frame, 36 bytes spill stores, 28 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 40 bytes cumulative stack size
ptxas info    : Function properties for helper
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 32 registers
"""


def test_ptxas_registers_and_spills_are_read():
    assert tourkit.ptxas_usage(PTXAS_REPORT) == {"registers": 255, "spill_stores": 40, "spill_loads": 32}
    report = tourkit.KernelReport("k", "sm_80", {}, 0, 0, 128, (1, 1, 1), "compiled", **tourkit.ptxas_usage(PTXAS_REPORT))
    assert report.spills == "40/32 B" and report.summary()["registers"] == 255
    clean = tourkit.KernelReport("k", "sm_80", {}, 0, 0, 128, (1, 1, 1), "compiled", registers=20, spill_stores=0,
                                 spill_loads=0)
    assert clean.spills == "0"
    assert tourkit.KernelReport("k", "sm_80", {}, 0, 0, 128, (1, 1, 1), "lowered only").spills == "-"
    ctx = TourContext(echo=False)
    ctx.headline(kernels=1)  # a section's count must not hide the reports
    tourkit.report_kernels(ctx, [report, clean])
    assert "spills" in ctx.report[0] and "40/32 B" in ctx.report[2]
    assert [r["spill_stores"] for r in ctx.metrics["kernel_reports"]] == [40, 0]


def test_softmax_is_drawn_in_bytes_and_attention_in_flops():
    import matplotlib  # noqa: F401  (a test requirement: README, .ci/run)
    entries = tourplots.timings(fake_record())
    for section in ("softmax", "flash_attention"):
        fig = tourplots.draw_throughput(entries, section, unit=tourplots.THROUGHPUT_SECTIONS[section])
        label = fig.axes[0].get_ylabel()
        assert ("GB/s" in label) == (section == "softmax") and ("TFLOP/s" in label) == (section != "softmax")
    assert tourplots.draw_throughput(entries, "vector_add") is None  # nothing timed there


def test_a_notebook_shows_the_plots_inline_without_a_folder(monkeypatch):
    import matplotlib  # noqa: F401  (a test requirement: README, .ci/run)
    shown = []
    monkeypatch.setattr(tourplots, "show_inline", shown.extend)
    lines = []
    paths = tourplots.after_tour(fake_record(), inline=True, log=lines.append)
    assert shown == paths and len(paths) == 4 and lines == []  # drawn to a temporary folder, nothing said


def test_the_committed_gpu_record_has_every_timed_section_and_redraws_the_committed_plots(tmp_path):
    """docs/h200_tour.json is the run the README's plots come from: every section that times kernels recorded
    its own and PyTorch's, and tourplots draws the same four files from it."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "docs", "h200_tour.json")) as fh:
        run = json.load(fh)
    entries = tourplots.timings(run["sections"])
    kinds = {(e["section"], e["kind"]) for e in entries}
    for section in ("vector_add", "gemm_schedules", "fusion", "softmax", "flash_attention", "autotune"):
        assert (section, "lesson") in kinds and (section, "pytorch") in kinds, section
    assert {("gemm_schedules", "appendix"), ("flash_attention", "appendix"), ("softmax", "copy")} <= kinds
    paths = tourplots.draw_all(run["sections"], str(tmp_path), run["environment"])
    names = sorted(os.path.basename(p) for p in paths)
    assert names == sorted(tourplots.FILES.values())
    assert names == sorted(n for n in os.listdir(os.path.join(root, "docs")) if n.endswith(".png"))
