"""The runner with fake sections: isolation, statuses, timing, exit codes, selection, JSON, notebooks."""

import json
import sys
import time

import pytest

import tilelang_tour
import tourkit
from sections import SECTION_NAMES
from tourkit import Section, SectionSkip


def _ok(ctx):
    ctx.log("hello from a fake section")
    ctx.headline(speedup=1.25)
    ctx.metric(detail="kept")


def _boom(ctx):
    raise RuntimeError("kernel exploded")


def _skip(ctx):
    raise SectionSkip("needs a unicorn")


def _slow(ctx):
    time.sleep(0.3)


def _hang(ctx):
    time.sleep(30)


def _interrupt(ctx):
    raise KeyboardInterrupt


def fake_loader(behaviours, calls=None):
    """A loader giving each real section name a fake section whose run is behaviours[name] (default: ok)."""

    def load(name):
        if calls is not None:
            calls.append(name)
        run = behaviours.get(name, _ok)
        return Section(name=name, title=f"fake {name}", summary="a fake section", run=run, needs_gpu=False)

    return load


@pytest.fixture(autouse=True)
def tilelang_importable(monkeypatch):
    # The runner probes `import tilelang` in a child process; the fakes need no tilelang, so skip the cost.
    monkeypatch.setattr(tourkit, "probe_tilelang_import", lambda timeout=120.0: (True, "0.0-test"))


def test_failure_is_isolated_and_recorded(capsys):
    run = tilelang_tour.main(["--only", "vector_add,gemm_schedules,fusion"],
                             loader=fake_loader({"gemm_schedules": _boom}))
    statuses = {r.name: r.status for r in run.results}
    assert statuses == {"vector_add": "passed", "gemm_schedules": "failed", "fusion": "passed"}
    failed = run.results[1]
    assert failed.error_type == "RuntimeError"
    assert failed.error_message == "kernel exploded"
    assert "_boom" in failed.traceback_tail
    assert run.exit_code == 1
    out = capsys.readouterr().out
    assert "Summary" in out and "TileLang quick reference" in out


def test_skip_reason_and_exit_code_zero():
    run = tilelang_tour.main(["--only", "softmax,debugging"], loader=fake_loader({"softmax": _skip}))
    assert [r.status for r in run.results] == ["skipped", "passed"]
    assert run.results[0].skip_reason == "needs a unicorn"
    assert run.exit_code == 0


def test_timing_and_headline_recorded():
    run = tilelang_tour.main(["--only", "fusion,autotune"], loader=fake_loader({"fusion": _slow}))
    slow, fast = run.results
    assert slow.seconds >= 0.25
    assert fast.seconds < slow.seconds
    assert fast.headline == {"speedup": 1.25}
    assert fast.metrics["detail"] == "kept"
    assert fast.report == ["hello from a fake section"]


def test_timeout_marks_section_and_continues():
    run = tilelang_tour.main(["--only", "fusion,softmax,debugging", "--timeout", "0.5"],
                             loader=fake_loader({"softmax": _hang}))
    assert [r.status for r in run.results] == ["passed", "timed out", "passed"]
    assert run.results[1].seconds < 5
    assert run.exit_code == 1


def test_keyboard_interrupt_prints_summary_and_exits_130(capsys):
    calls = []
    run = tilelang_tour.main(["--only", "vector_add,fusion,softmax"],
                             loader=fake_loader({"fusion": _interrupt}, calls))
    assert run.exit_code == 130
    assert [r.status for r in run.results] == ["passed", "interrupted"]
    assert calls == ["vector_add", "fusion"]  # softmax never started
    assert "Summary" in capsys.readouterr().out


def test_exitfirst_stops_after_first_failure():
    calls = []
    run = tilelang_tour.main(["-x"], loader=fake_loader({"gemm_schedules": _boom}, calls))
    assert calls == ["env_check", "vector_add", "gemm_schedules"]
    assert run.exit_code == 1


def test_only_and_skip_take_repeatable_comma_lists():
    calls = []
    tilelang_tour.main(["--only", "debugging,fusion", "--only", "softmax", "--skip", "fusion"], loader=fake_loader({}, calls))
    assert calls == ["softmax", "debugging"]  # tour order, not command-line order
    calls.clear()
    tilelang_tour.main(["--skip", "env_check,vector_add", "--skip", "autotune"], loader=fake_loader({}, calls))
    assert calls == ["gemm_schedules", "fusion", "softmax", "flash_attention", "debugging"]


@pytest.mark.parametrize("argv", [["--only", "flash_atention"], ["--skip", "nope"], ["--bogus"],
                                  ["--compile-only", "--arch", "sm_61"], ["--arch", "sm_80"]])
def test_usage_errors_are_one_line_and_exit_2(argv, capsys):
    run = tilelang_tour.main(argv, loader=fake_loader({}))
    assert run.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("tilelang_tour.py: error:")


def test_unknown_section_error_names_the_valid_ones(capsys):
    tilelang_tour.main(["--only", "flash"], loader=fake_loader({}))
    err = capsys.readouterr().err
    assert all(name in err for name in SECTION_NAMES)


def test_sm_90_is_refused_with_a_hint(capsys):
    assert tilelang_tour.main(["--compile-only", "--arch", "sm_90"]).exit_code == 2
    assert "sm_90a" in capsys.readouterr().err


def test_list_prints_the_eight_sections_in_order(capsys):
    run = tilelang_tour.main(["--list"])
    assert run.exit_code == 0
    assert capsys.readouterr().out.split() == SECTION_NAMES
    assert SECTION_NAMES == ["env_check", "vector_add", "gemm_schedules", "fusion", "softmax",
                             "flash_attention", "autotune", "debugging"]


def test_json_holds_environment_and_every_section(tmp_path):
    path = tmp_path / "run.json"
    tilelang_tour.main(["--only", "vector_add,fusion", "--json", str(path)], loader=fake_loader({"fusion": _boom}))
    data = json.loads(path.read_text())
    assert data["exit_code"] == 1
    assert data["environment"]["python"] == sys.version.split()[0]
    assert "gpu" in data["environment"]
    assert [s["name"] for s in data["sections"]] == ["vector_add", "fusion"]
    assert data["sections"][0]["headline"] == {"speedup": 1.25}
    assert data["sections"][1]["error_message"] == "kernel exploded"


def test_notebook_argv_is_ignored(monkeypatch):
    # Inside Jupyter/Colab sys.argv is the kernel's own ("-f /path/kernel.json"); it must not reach argparse.
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "/tmp/kernel-1.json"])
    calls = []
    run = tilelang_tour.main(loader=fake_loader({}, calls))
    assert run.exit_code == 0
    assert calls == SECTION_NAMES


def test_help_does_not_raise_system_exit(capsys):
    run = tilelang_tour.main(["--help"])
    assert run.exit_code == 0
    assert "--compile-only" in capsys.readouterr().out


def test_missing_tilelang_skips_kernel_sections_with_reason(monkeypatch):
    monkeypatch.setattr(tourkit, "probe_tilelang_import",
                        lambda timeout=120.0: (False, "tilelang is not installed (pip install tilelang==0.1.15)"))
    run = tilelang_tour.main(["--only", "env_check,vector_add"], loader=fake_loader({}))
    assert run.results[0].status == "passed"  # the fake env_check needs no tilelang
    assert run.results[1].status == "skipped"
    assert "pip install tilelang" in run.results[1].skip_reason
    assert run.exit_code == 0


def test_gpu_section_without_gpu_points_to_compile_only(monkeypatch):
    monkeypatch.setattr(tourkit, "detect_device", lambda: None)

    def load(name):
        return Section(name=name, title="needs a GPU", summary="", run=_ok, needs_gpu=True)

    run = tilelang_tour.main(["--only", "vector_add"], loader=load)
    assert run.results[0].status == "skipped"
    assert "--compile-only" in run.results[0].skip_reason


def test_compile_only_runs_gpu_sections_with_the_named_arch(monkeypatch):
    seen = {}

    def run_section(ctx):
        seen.update(arch=ctx.arch, compile_only=ctx.compile_only, budget=ctx.smem_budget)

    def load(name):
        return Section(name=name, title="t", summary="", run=run_section, needs_gpu=True)

    run = tilelang_tour.main(["--only", "gemm_schedules", "--compile-only", "--arch", "sm_86"], loader=load)
    assert run.results[0].status == "passed"
    assert seen == {"arch": "sm_86", "compile_only": True, "budget": 99 * 1024}


def test_compile_only_defaults_to_sm_90a_without_gpu(monkeypatch):
    monkeypatch.setattr(tourkit, "detect_device", lambda: None)
    seen = {}

    def load(name):
        return Section(name=name, title="t", summary="", run=lambda ctx: seen.update(arch=ctx.arch), needs_gpu=True)

    tilelang_tour.main(["--only", "fusion", "--compile-only"], loader=load)
    assert seen == {"arch": "sm_90a"}


def test_a_section_module_that_fails_to_import_is_isolated():
    def load(name):
        if name == "softmax":
            raise SyntaxError("bad section file")
        return Section(name=name, title="t", summary="", run=_ok, needs_gpu=False)

    run = tilelang_tour.main(["--only", "softmax,debugging"], loader=load)
    assert [r.status for r in run.results] == ["failed", "passed"]
    assert run.results[0].error_type == "SyntaxError"


def test_results_are_plain_serializable_data():
    run = tilelang_tour.main(["--only", "vector_add"], loader=fake_loader({}))
    json.dumps(run.to_dict())  # raises if anything is not plain data


@pytest.mark.skipif(tourkit.detect_device() is not None, reason="this machine has a GPU")
def test_real_tour_without_gpu_skips_every_gpu_section_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.undo()  # the real tilelang probe, the real sections
    path = tmp_path / "run.json"
    run = tilelang_tour.main(["--json", str(path)])
    assert run.exit_code == 0
    assert [r.name for r in run.results] == SECTION_NAMES
    assert run.results[0].status == "passed"
    for result in run.results[1:]:
        assert result.status == "skipped", result.name
        assert "--compile-only" in result.skip_reason
    data = json.loads(path.read_text())
    assert [s["status"] for s in data["sections"]] == ["passed"] + ["skipped"] * 7
    assert data["environment"]["tilelang"] == tourkit.TILELANG_PIN


def test_keyboard_interrupt_outside_a_section_still_prints_the_summary(monkeypatch, capsys):
    def interrupted_probe(timeout=120.0):
        raise KeyboardInterrupt  # e.g. Ctrl-C while the tilelang import probe runs

    monkeypatch.setattr(tourkit, "probe_tilelang_import", interrupted_probe)
    run = tilelang_tour.main(["--only", "env_check,vector_add"], loader=fake_loader({}))
    assert run.exit_code == 130
    assert [r.status for r in run.results] == ["passed"]
    assert "Summary" in capsys.readouterr().out


FAKE_H200 = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)


def preparing_loader(events, failing_prepare=()):
    """Fake sections whose declared kernels (asked for by the background compile) and run record (what,
    section, thread) in `events`; they declare no kernel, so nothing is compiled."""
    import threading

    def load(name):
        def kernels(ctx):
            events.append(("prepare", name, threading.current_thread().name))
            if name in failing_prepare:
                raise RuntimeError("no compiler today")
            return []

        def run(ctx):
            events.append(("run", name, threading.current_thread().name))

        return Section(name=name, title=f"fake {name}", summary="a fake section", run=run, needs_gpu=False,
                       kernels=kernels)

    return load


def test_sections_are_prepared_in_the_background_in_order_before_they_run(monkeypatch):
    monkeypatch.setattr(tourkit, "detect_device", lambda: FAKE_H200)
    events = []
    run = tilelang_tour.main(["--only", "env_check,vector_add,gemm_schedules,fusion"],
                             loader=preparing_loader(events, failing_prepare={"gemm_schedules"}))
    assert [r.status for r in run.results] == ["passed"] * 4  # a failing prepare costs nothing but time
    prepared = [name for what, name, _ in events if what == "prepare"]
    assert prepared == ["vector_add", "gemm_schedules", "fusion"]  # env_check runs before tilelang is probed
    for what, name, thread in events:
        assert (thread == "tour-prepare") == (what == "prepare")
        if what == "run" and name != "env_check":
            assert events.index(("prepare", name, "tour-prepare")) < events.index((what, name, thread))


def test_nothing_is_prepared_in_compile_only_mode_or_without_a_gpu(monkeypatch):
    events = []
    monkeypatch.setattr(tourkit, "detect_device", lambda: FAKE_H200)
    tilelang_tour.main(["--only", "vector_add,fusion", "--compile-only"], loader=preparing_loader(events))
    monkeypatch.setattr(tourkit, "detect_device", lambda: None)
    tilelang_tour.main(["--only", "vector_add,fusion"], loader=preparing_loader(events))
    assert [what for what, _, _ in events] == ["run", "run", "run", "run"]


@pytest.mark.parametrize("argv", [["--timeout", "-1"], ["--timeout", "nan"], ["--only", ""], ["--only", ",,"],
                                  ["--skip", " , "], ["--json", "/nonexistent-dir/run.json"], ["--json", "/tmp"]])
def test_bad_command_lines_are_refused_before_anything_runs(argv, capsys):
    calls = []
    run = tilelang_tour.main(argv, loader=fake_loader({}, calls))
    assert run.exit_code == 2 and calls == []
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("tilelang_tour.py: error:")
    assert "TileLang Tour" not in out


def test_the_json_check_leaves_no_file_behind(tmp_path):
    path = tmp_path / "later.json"
    tilelang_tour.check_json_path(str(path))
    assert not path.exists()


def test_timeout_zero_means_no_limit():
    run = tilelang_tour.main(["--only", "fusion", "--timeout", "0"], loader=fake_loader({"fusion": _slow}))
    assert [r.status for r in run.results] == ["passed"]


def test_summary_counts_crashed_and_interrupted(capsys):
    results = [tourkit.SectionResult("a", status="crashed", error_type="SIGSEGV", error_message="killed"),
               tourkit.SectionResult("b", status="interrupted"), tourkit.SectionResult("c", status="passed")]
    tilelang_tour.print_summary(results)
    out = capsys.readouterr().out
    assert "1 passed, 1 crashed, 1 interrupted" in out and "SIGSEGV: killed" in out
    assert tilelang_tour._exit_code(results) == 1


def test_quick_runs_settle_briefly_and_repeat_less_and_the_settings_are_restored(monkeypatch):
    seen = []

    def load(name):
        return Section(name=name, title=name, summary="",
                       run=lambda ctx: seen.append((tourkit.SETTLE_MS, tourkit.REP_MS)), needs_gpu=False)

    before = tourkit.SETTLE_MS, tourkit.REP_MS
    tilelang_tour.main(["--only", "vector_add", "--quick"], loader=load)
    tilelang_tour.main(["--only", "vector_add"], loader=load)
    assert seen == [(tourkit.QUICK_SETTLE_MS, tourkit.QUICK_REP_MS), before]
    assert (tourkit.SETTLE_MS, tourkit.REP_MS) == before and tourkit.QUICK_REP_MS < tourkit.REP_MS
