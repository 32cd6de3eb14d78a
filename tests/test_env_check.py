"""env_check on this machine (no GPU in CI; the H200 run is marked gpu)."""

import os
import subprocess
import sys

import pytest

import tilelang_tour
import tourkit
from sections import env_check


def test_env_check_passes_and_reports_versions(capsys):
    run = tilelang_tour.main(["--only", "env_check"])
    result = run.results[0]
    assert result.status == "passed", result.error_message or result.skip_reason
    assert result.metrics["tilelang"] == tourkit.TILELANG_PIN
    assert result.metrics["apache_tvm_ffi"]
    out = capsys.readouterr().out
    for word in ("python", "torch", "tilelang", "apache-tvm-ffi", "nvcc", "host C++ compiler", "Colab"):
        assert word in out


@pytest.mark.skipif(tourkit.detect_device() is not None, reason="this machine has a GPU")
def test_env_check_without_gpu_says_how_to_compile_only(capsys):
    run = tilelang_tour.main(["--only", "env_check"])
    assert run.results[0].headline["gpu"] == "none"
    assert "--compile-only" in capsys.readouterr().out


@pytest.mark.parametrize("capability,says", [((6, 0), "older than the sm_75"), ((10, 0), "sm_100a; the lessons' Ampere"),
                                             ((12, 0), "sm_120a; the lessons' Ampere"), ((9, 0), "target sm_90a")])
def test_env_check_says_what_runs_on_the_gpu(monkeypatch, capsys, capability, says):
    gpu = tourkit.DeviceInfo("a GPU", capability, tourkit.arch_for_capability(*capability), 80, 2**34, 49152, 2**22)
    monkeypatch.setattr(env_check, "nvidia_driver_version", lambda: None)
    monkeypatch.setattr(env_check, "cuda_driver_api_version", lambda: None)
    ctx = tourkit.TourContext(device=gpu)
    env_check.run(ctx)
    text = "\n".join(ctx.report)
    assert says in text
    assert ("the GPU sections will skip" in text) == (capability < (7, 5))
    assert ctx.headlines["arch"] == ("sm_60" if capability < (7, 5) else gpu.arch)


def test_missing_tilelang_fails_with_the_install_command(monkeypatch, capsys):
    monkeypatch.setattr(tourkit, "probe_tilelang_import", lambda timeout=120.0: (False, "tilelang is not installed (x)"))
    monkeypatch.setattr(env_check, "in_colab", lambda: False)
    run = tilelang_tour.main(["--only", "env_check", "--no-isolate"])  # in this process: the patches apply
    assert run.results[0].status == "failed"
    assert tourkit.TILELANG_INSTALL in run.results[0].error_message
    assert run.exit_code == 1
    assert tourkit.TILELANG_INSTALL in capsys.readouterr().out


def test_tilelang_that_cannot_be_imported_fails_env_check_and_skips_the_rest(tmp_path, monkeypatch):
    broken = tmp_path / "tilelang"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise PermissionError(\"[Errno 13] Permission denied: '/ro/cache'\")\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    run = tilelang_tour.main(["--only", "env_check,vector_add"])  # the worker sees the broken tilelang
    env, vector_add = run.results
    assert env.status == "failed"
    assert "Permission denied" in env.error_message and "TILELANG_CACHE_DIR" in env.error_message
    assert vector_add.status == "skipped" and "tilelang is unavailable" in vector_add.skip_reason
    assert run.exit_code == 1


def test_missing_tilelang_in_colab_installs_it(monkeypatch, capsys):
    probes = iter([(False, "tilelang is not installed (x)"), (True, "0.1.15"), (True, "0.1.15")])
    monkeypatch.setattr(tourkit, "probe_tilelang_import", lambda timeout=120.0: next(probes))
    monkeypatch.setattr(env_check, "in_colab", lambda: True)
    commands = []

    def fake_pip(cmd, **kwargs):
        commands.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(env_check.subprocess, "run", fake_pip)
    monkeypatch.setattr(env_check, "tool_version", lambda *a, **k: "fake")
    run = tilelang_tour.main(["--only", "env_check", "--no-isolate"])
    assert run.results[0].status == "passed"
    assert commands[0][:4] == [sys.executable, "-m", "pip", "install"]
    assert f"tilelang=={tourkit.TILELANG_PIN}" in commands[0]
    assert "installed tilelang 0.1.15" in capsys.readouterr().out


@pytest.mark.gpu
def test_env_check_reports_the_gpu():
    device = tourkit.detect_device()
    run = tilelang_tour.main(["--only", "env_check"])
    metrics = run.results[0].metrics
    assert metrics["gpu"] == device.name
    assert metrics["sm_count"] > 0
    # the opt-in per-block budget is what kernels may use; on Hopper it is 227 KiB, on A100 163 KiB
    assert metrics["smem_per_block_optin"] >= 48 * 1024
    if device.capability == (9, 0):
        assert metrics["smem_per_block_optin"] == 232448
