"""Shared test setup: the `gpu` marker, and the repository root on sys.path."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _has_cuda_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda_gpu():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run python3 -m pytest -m gpu where there is one)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def no_settling_outside_gpu_tests(request, monkeypatch):
    """CPU tests time fake contenders (their bench_ms is replaced): the 1.5 s of untimed turns that
    bench_interleaved runs first on a GPU would only call them, with their side effects, many more times."""
    if "gpu" not in request.keywords:
        import tourkit

        monkeypatch.setattr(tourkit, "SETTLE_MS", 0.0)


@pytest.fixture(autouse=True)
def stop_after_a_device_fault(request):
    """A kernel that faults (illegal address) leaves the CUDA context unusable: every later GPU test in the
    process would fail for that reason alone and bury the real one. Stop the run at the first such test."""
    yield
    if "gpu" not in request.keywords or not _has_cuda_gpu():
        return
    import torch

    try:
        torch.cuda.synchronize()
    except Exception as exc:
        pytest.exit(f"the CUDA context is broken after {request.node.nodeid} ({type(exc).__name__}: {exc}); "
                    f"stopping: the GPU tests after it cannot run in this process", returncode=1)


@pytest.fixture
def fake_gemm_timing(monkeypatch):
    """gemm_schedules.run without a GPU: built kernels that only show a wgmma K loop, and timing that returns
    ms_of(label) for each contender, cuBLAS at `cublas_ms`. Returns the list of timing calls (M, contenders, rounds)."""
    import tourkit
    from sections import gemm_schedules

    def install(ms_of, cublas_ms=1.0):
        calls = []

        def fake_time(M, N, K, contenders, rounds, dtype="float16"):
            calls.append((M, list(contenders), rounds))
            return ({label: ms_of(label) for label in contenders}, cublas_ms,
                    dict({label: 1e-4 for label in contenders}, cuBLAS=1e-4))

        class Fake:
            def get_kernel_source(self):
                return "tl::wgmma_ss<...>(); warpgroup_wait<0>();"

        monkeypatch.setattr(tourkit, "build_declared", lambda decls, **kw: {d.name: Fake() for d in decls})
        monkeypatch.setattr(gemm_schedules, "time_against_cublas", fake_time)
        return calls

    return install
