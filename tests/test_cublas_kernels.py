"""bench/cublas_kernels.py: its shapes parse, and without a GPU it says so in one line instead of failing."""

import argparse
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import cublas_kernels  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "cublas_kernels.py")


def test_shapes_parse_and_bad_ones_are_rejected():
    assert cublas_kernels.parse_shapes("8192x4096x14336,1X2x3") == [(8192, 4096, 14336), (1, 2, 3)]
    assert len(cublas_kernels.parse_shapes(cublas_kernels.DEFAULT_SHAPES)) == 6
    for bad in ("8192x4096", "0x1x1", "axbxc"):
        with pytest.raises(argparse.ArgumentTypeError):
            cublas_kernels.parse_shapes(bad)


def test_without_a_gpu_it_exits_with_one_line():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    done = subprocess.run([sys.executable, SCRIPT, "--shapes", "256x256x256"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1
    assert done.stdout.strip().splitlines() == ["cublas_kernels: needs a CUDA GPU (cuBLAS picks its kernel on the "
                                                "device); none is visible"]
    assert "Traceback" not in done.stderr


@pytest.mark.gpu
def test_names_the_kernel_cublas_launches():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    times = cublas_kernels.kernels_launched(512, 512, 512, calls=2)
    assert times and all(len(t) >= 1 and min(t) > 0 for t in times.values())
