"""The worker process: faults of every kind cost one section, timeouts fire in native hangs, a broken CUDA
context gets a fresh worker, Ctrl-C at any point ends the run cleanly, and the parent keeps off CUDA.

The fake sections (tests/fake_sections.py) need neither torch nor tilelang, so each run takes a fraction of
a second plus the worker starts."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import tilelang_tour
import tourrunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join(ROOT, "tilelang_tour.py")


@pytest.fixture(autouse=True)
def fake_sections(monkeypatch):
    monkeypatch.setenv(tilelang_tour.SECTIONS_ENV, "tests.fake_sections")
    monkeypatch.delenv(tourrunner.FAULT_ENV, raising=False)
    for var in ("FAKE_SECTIONS_GPU", "FAKE_GPU_CHECK", "FAKE_NAP_S", "FAKE_DETECT_CRASH"):
        monkeypatch.delenv(var, raising=False)


def statuses(run):
    return [r.status for r in run.results]


@pytest.mark.parametrize("kind,status,error_type", [("raise", "failed", "RuntimeError"),
                                                    ("segfault", "crashed", "SIGSEGV"),
                                                    ("abort", "crashed", "SIGABRT"),
                                                    ("exit", "crashed", "exit code 3")])
def test_a_fault_costs_one_section(kind, status, error_type, monkeypatch, capsys):
    monkeypatch.setenv(tourrunner.FAULT_ENV, f"first:{kind}")
    run = tilelang_tour.main(["--only", "first,second"])
    assert statuses(run) == [status, "passed"]
    faulted = run.results[0]
    assert faulted.error_type == error_type
    assert run.exit_code == 1
    if status == "crashed":  # what the worker printed last is kept
        assert "fault injected" in faulted.traceback_tail
        assert len(faulted.traceback_tail.splitlines()) <= tourrunner.TAIL_LINES
    out = capsys.readouterr().out
    assert "Summary" in out and f"1 {status}" in out


def test_a_native_hang_times_out_within_the_limit_and_the_tour_goes_on(monkeypatch):
    monkeypatch.setenv(tourrunner.FAULT_ENV, "second:hang")
    started = time.monotonic()
    run = tilelang_tour.main(["--only", "first,second,third", "--timeout", "2"])
    elapsed = time.monotonic() - started
    assert statuses(run) == ["passed", "timed out", "passed"]
    hung = run.results[1]
    assert 2.0 <= hung.seconds < 4.0
    assert "block_natively" in hung.traceback_tail  # the worker's stack, dumped before the kill
    assert run.results[0].headline["pid"] != run.results[2].headline["pid"]
    assert elapsed < 10


def test_a_broken_cuda_context_gets_a_fresh_worker():
    run = tilelang_tour.main(["--only", "first,sticky,second,third"])
    assert statuses(run) == ["passed", "failed", "passed", "passed"]
    first, sticky, second, third = (r.headline["pid"] for r in run.results)
    assert first == sticky  # the same worker ran both, then retired
    assert second != sticky and second == third
    assert "illegal memory access" in run.results[1].error_message
    assert run.exit_code == 1


def test_an_ordinary_failure_keeps_the_worker():
    run = tilelang_tour.main(["--only", "first,boom,second"])
    assert statuses(run) == ["passed", "failed", "passed"]
    assert run.results[0].headline["pid"] == run.results[2].headline["pid"]


def test_after_a_crash_the_gpu_is_checked_and_a_silent_gpu_skips_the_gpu_sections(monkeypatch):
    monkeypatch.setenv("FAKE_SECTIONS_GPU", "1")
    monkeypatch.setenv("FAKE_GPU_CHECK", "fail")
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:segfault")
    run = tilelang_tour.main(["--only", "first,second,gpu_one,gpu_two"])
    assert statuses(run) == ["crashed", "passed", "skipped", "skipped"]
    assert "did not answer" in run.results[2].skip_reason
    assert "no kernel image" in run.results[2].skip_reason


def test_a_gpu_check_that_hangs_is_stopped(monkeypatch):
    monkeypatch.setattr(tourrunner, "GPU_CHECK_LIMIT_S", 1.0)
    monkeypatch.setenv("FAKE_SECTIONS_GPU", "1")
    monkeypatch.setenv("FAKE_GPU_CHECK", "hang")
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:exit")
    started = time.monotonic()
    run = tilelang_tour.main(["--only", "first,gpu_one,second"])
    assert statuses(run) == ["crashed", "passed", "skipped"]  # tour order: gpu_one is last
    assert "within 1 s" in run.results[2].skip_reason
    assert time.monotonic() - started < 10


def test_a_gpu_older_than_the_kernels_skips_the_gpu_sections_with_the_reason(monkeypatch, capsys):
    monkeypatch.setenv("FAKE_SECTIONS_GPU", "old")
    run = tilelang_tour.main(["--only", "first,gpu_one"])
    assert statuses(run) == ["passed", "skipped"]
    assert "fake P100 has compute capability 6.0" in run.results[1].skip_reason
    assert "--compile-only" in run.results[1].skip_reason
    assert run.environment["gpu"]["name"] == "fake P100"
    headers = [line for line in capsys.readouterr().out.splitlines() if line.startswith("TileLang Tour")]
    assert headers == ["TileLang Tour — 2 section(s), on fake P100 (sm_60, older than the kernels need)"]
    compiled = tilelang_tour.main(["--only", "gpu_one", "--compile-only"])  # builds for the default, not sm_75
    assert statuses(compiled) == ["passed"] and compiled.environment["options"]["arch"] == "sm_90a"


def test_a_gpu_that_answers_runs_the_gpu_sections(monkeypatch):
    monkeypatch.setenv("FAKE_SECTIONS_GPU", "1")
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:abort")
    run = tilelang_tour.main(["--only", "first,gpu_one"])
    assert statuses(run) == ["crashed", "passed"]
    assert run.results[1].headline["compile_only"] is False


def test_a_worker_that_dies_before_it_starts_is_recorded(monkeypatch, capsys):
    monkeypatch.setenv("FAKE_DETECT_CRASH", "1")
    run = tilelang_tour.main(["--only", "first,second"])
    assert statuses(run) == ["crashed", "crashed"]
    assert "before the section started" in run.results[0].error_message
    assert run.results[0].error_type == "exit code 4"
    assert capsys.readouterr().out.startswith("TileLang Tour — 2 section(s)\n")


def test_a_large_last_record_still_in_the_pipe_when_the_worker_exits_is_read():
    for _ in range(3):  # the worker exits right after sending it: read what it left in the pipe
        run = tilelang_tour.main(["--only", "first,big"])
        assert statuses(run) == ["passed", "passed"], [r.error_message for r in run.results]
        assert len(run.results[1].report) > 30000


@pytest.mark.parametrize("how,words", [("abort", "importing tilelang ended the worker process (SIGABRT)"),
                                       ("hang", "importing tilelang took more than 2 s")])
def test_an_import_of_tilelang_that_kills_or_hangs_the_worker_skips_the_sections_once(how, words, monkeypatch):
    """No section is blamed for it, and no further worker tries again: the sections skip with the reason."""
    monkeypatch.setenv("FAKE_PROBE", how)
    monkeypatch.setattr(tourrunner, "STARTUP_LIMIT_S", 2.0)
    run = tilelang_tour.main(["--only", "env_check,first,second,third"])
    assert statuses(run) == ["passed", "skipped", "skipped", "skipped"], [r.error_message for r in run.results]
    assert all(words in r.skip_reason for r in run.results[1:]), run.results[1].skip_reason
    assert run.exit_code == 0


def test_exitfirst_stops_after_a_crash(monkeypatch):
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:segfault")
    run = tilelang_tour.main(["--only", "first,second", "-x"])
    assert statuses(run) == ["crashed"]
    assert run.exit_code == 1


def test_json_holds_every_record_with_the_crash(tmp_path, monkeypatch):
    monkeypatch.setenv(tourrunner.FAULT_ENV, "second:segfault")
    path = tmp_path / "run.json"
    tilelang_tour.main(["--only", "first,second,third", "--json", str(path)])
    data = json.loads(path.read_text())
    assert [s["status"] for s in data["sections"]] == ["passed", "crashed", "passed"]
    assert data["exit_code"] == 1 and data["environment"]["tilelang"] == "0.0-fake"


@pytest.mark.parametrize("value,words", [("first:melt", "unknown fault"), ("nowhere:raise", "unknown section"),
                                         ("first", "section:kind")])
def test_bad_fault_variables_are_usage_errors(value, words, monkeypatch, capsys):
    monkeypatch.setenv(tourrunner.FAULT_ENV, value)
    assert tilelang_tour.main(["--only", "first"]).exit_code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_no_isolate_refuses_faults_that_would_end_the_tour_and_runs_raise_in_process(monkeypatch, capsys):
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:segfault")
    assert tilelang_tour.main(["--only", "first", "--no-isolate"]).exit_code == 2
    assert "--no-isolate" in capsys.readouterr().err
    monkeypatch.setenv(tourrunner.FAULT_ENV, "first:raise")
    run = tilelang_tour.main(["--only", "first,second", "--no-isolate"])
    assert statuses(run) == ["failed", "passed"]
    assert run.results[1].headline["pid"] == os.getpid()


def _tour(argv, env_extra=None, **kwargs):
    env = dict(os.environ, **{tilelang_tour.SECTIONS_ENV: "tests.fake_sections"}, **(env_extra or {}))
    return subprocess.Popen([sys.executable, TOUR, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for(proc, text, timeout=15.0):
    """Read the tour's stdout until `text` shows; returns what was read."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, seen
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    return seen


# (what to wait for on stdout, then seconds to wait, then how many Ctrl-C): a section running Python,
# a native hang with SIGINT masked, the worker starting again after a crash, between sections, twice in a row.
SIGINT_POINTS = [("▶ [2/4] nap", 0.1, 1), ("fault injected (TILELANG_TOUR_FAULT): third:hang", 0.2, 1),
                 ("■ [1/4] first crashed", 0.0, 1), ("■ [1/4] first", 0.0, 1), ("▶ [2/4] nap", 0.2, 2)]


@pytest.mark.parametrize("marker,delay,times", SIGINT_POINTS)
def test_ctrl_c_at_any_point_prints_the_summary_writes_json_and_exits_130(marker, delay, times, tmp_path):
    path = tmp_path / "run.json"
    fault = "first:segfault,third:hang" if "crashed" in marker else "third:hang"
    proc = _tour(["--only", "first,nap,second,third", "--json", str(path)],
                 {tourrunner.FAULT_ENV: fault, "FAKE_NAP_S": "1.0"})
    seen = _wait_for(proc, marker)
    time.sleep(delay)
    sent = time.monotonic()
    for _ in range(times):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    out, err = proc.communicate(timeout=15)
    assert time.monotonic() - sent < 5, "the tour took too long to stop"
    assert proc.returncode == 130, err
    assert "Summary" in seen + out
    data = json.loads(path.read_text())
    assert data["exit_code"] == 130
    names = [s["name"] for s in data["sections"]]
    assert names and names == ["first", "nap", "second", "third"][:len(names)]  # "first" has run at every point
    assert "KeyboardInterrupt" not in err


def test_a_reader_that_goes_away_leaves_the_run_and_its_json_whole(tmp_path):
    """`python tilelang_tour.py ... | head -1`: output stops, the sections still run and --json is written."""
    path = tmp_path / "run.json"
    proc = _tour(["--only", "first,big,second", "--json", str(path)], {"FAKE_BIG_LINES": "20000"})
    assert proc.stdout.readline().startswith("TileLang Tour")
    proc.stdout.close()  # the reader is gone: the tour's next writes meet a broken pipe
    err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert [s["status"] for s in json.loads(path.read_text())["sections"]] == ["passed"] * 3


def test_a_terminal_that_cannot_encode_the_tours_symbols_gets_replacements():
    proc = _tour(["--only", "first"], {"PYTHONIOENCODING": "ascii"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert "TileLang Tour ? 1 section(s)" in out and "1 passed" in out


def test_the_parent_never_imports_torch_or_tilelang():
    code = ("import sys, tilelang_tour; run = tilelang_tour.main(['--only', 'env_check']); "
            "assert 'torch' not in sys.modules and 'tilelang' not in sys.modules, 'imported'; "
            "print('EXIT', run.exit_code, run.results[0].status)")
    env = {k: v for k, v in os.environ.items() if k != tilelang_tour.SECTIONS_ENV}  # the real env_check
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "EXIT 0 passed" in done.stdout
    assert "Environment check" in done.stdout  # the worker's output reached the caller's stdout


def test_main_inside_a_notebook_survives_a_crash_and_returns(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    monkeypatch.setattr(sys, "argv", ["ipykernel_launcher.py", "-f", "/tmp/kernel-1.json"])
    monkeypatch.setenv(tourrunner.FAULT_ENV, "second:segfault")
    run = tilelang_tour.main()  # no SystemExit, and this process lives on
    assert {r.name: r.status for r in run.results}["second"] == "crashed"
    assert {r.name: r.status for r in run.results}["gpu_two"] == "skipped"  # it needs a GPU
    assert run.exit_code == 1
    assert "fake section ran" in capsys.readouterr().out
