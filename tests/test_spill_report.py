"""bench/spill_report.py --random: users' problems through nvcc, no GPU. A kernel that does not build is counted
and named, bfloat16 problems skip where the architecture has no bfloat16, and the random problems are the ones
bench/shape_targets.py --random would run for the same seed."""

import os
import sys

import pytest

import tourkit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import shape_targets  # noqa: E402
import spill_report  # noqa: E402

needs_nvcc = pytest.mark.skipif(tourkit.find_nvcc() is None, reason="needs nvcc")


@needs_nvcc
def test_random_softmax_problems_build_and_are_named(capsys):
    assert spill_report.main(["--arch", "sm_80", "--only", "softmax", "--random", "2", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    for _, dims, dtype in shape_targets.random_problems(2, 5, ["softmax"]):
        assert f"sm_80 softmax {dims} {dtype}:" in out
    assert "not built: none" in out and "spills: none" in out


def test_bfloat16_problems_skip_before_sm_80(capsys, monkeypatch):
    monkeypatch.setattr(shape_targets, "random_problems",
                        lambda count, seed, sections: [("softmax", "3x77", "bfloat16"), ("softmax", "3x77", "float16")])
    built = []
    monkeypatch.setattr(spill_report, "section_reports", lambda *job: built.append(job) or [])
    assert spill_report.main(["--arch", "sm_75", "--only", "softmax", "--random", "1"]) == 0
    assert built == [("softmax", "sm_75", (3, 77), "float16")]


def test_a_kernel_that_does_not_build_fails_the_report(capsys, monkeypatch):
    def broken(name, arch, shape=None, dtype="float16"):
        raise RuntimeError("ptxas fatal: planted")

    monkeypatch.setattr(spill_report, "section_reports", broken)
    assert spill_report.main(["--arch", "sm_90a", "--only", "softmax", "--random", "1", "--seed", "1"]) == 1
    assert "not built: sm_90a softmax" in capsys.readouterr().out
