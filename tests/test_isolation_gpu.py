"""Real GPU faults (TILELANG_TOUR_FAULT kinds gpu-hang and gpu-illegal-address) cost one section: a kernel
that spins forever is stopped at the time limit, a kernel that writes far out of bounds fails its section
and retires the worker; the section after each must pass. On a CPU: the fault kernels survive lowering."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import tourkit
import tourrunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_spinning_kernel_keeps_its_loop():
    report = tourkit.inspect_kernel("spin_forever", tourrunner.spin_forever_program(), "sm_90a", nvcc=False)
    body = report.source[report.source.rindex("spin_forever_kernel("):]
    assert re.search(r"while \(1\)", body) and "AtomicLoad" in body and "AtomicAdd" in body


def test_the_out_of_bounds_kernel_has_no_guard():
    report = tourkit.inspect_kernel("write_out_of_bounds", tourrunner.out_of_bounds_program(), "sm_90a",
                                    pass_configs=tourrunner.OUT_OF_BOUNDS_PASS_CONFIGS, nvcc=False)
    body = report.source[report.source.rindex("write_out_of_bounds_kernel("):]
    assert "out[(offset[0]" in body and "if (" not in body  # the write is not bounds-checked away


def _tour_with_fault(fault: str, tmp_path, timeout_s: int):
    path = tmp_path / "run.json"
    env = dict(os.environ, **{tourrunner.FAULT_ENV: fault})
    env.pop("TILELANG_TOUR_SECTIONS", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "tilelang_tour.py", "--only", "vector_add,softmax", "--quick",
                           "--timeout", str(timeout_s), "--json", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s + 240)
    elapsed = time.monotonic() - started
    print(done.stdout[-4000:], done.stderr[-2000:])
    data = json.loads(path.read_text())
    return done, {s["name"]: s for s in data["sections"]}, elapsed


@pytest.mark.gpu
def test_a_kernel_that_spins_forever_times_out_and_the_next_section_passes(tmp_path):
    done, sections, elapsed = _tour_with_fault("vector_add:gpu-hang", tmp_path, 60)
    assert sections["vector_add"]["status"] == "timed out"
    assert 60 <= sections["vector_add"]["seconds"] < 70
    assert sections["softmax"]["status"] == "passed", sections["softmax"]
    assert done.returncode == 1
    print(f"fault to the end of the next section: {elapsed - sections['vector_add']['seconds']:.1f} s")


@pytest.mark.gpu
def test_a_kernel_that_writes_out_of_bounds_fails_alone_and_the_next_section_passes(tmp_path):
    done, sections, elapsed = _tour_with_fault("vector_add:gpu-illegal-address", tmp_path, 120)
    assert sections["vector_add"]["status"] == "failed"
    message = sections["vector_add"]["error_message"].lower()
    assert any(pattern in message for pattern in tourrunner.STICKY_CUDA_ERRORS), message
    assert "fresh worker" in done.stdout
    assert sections["softmax"]["status"] == "passed", sections["softmax"]
    assert done.returncode == 1
