"""bench/gemm_shapes_probe.py: its --tiles split, the pieces --parts times, B's copy by the pad_rows kernel
(CPU)."""

import importlib.util
import os

import pytest
import torch

import tourkit
from sections import gemm_plans as P
from sections.gemm_launch import PAD_TILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_probe():
    spec = importlib.util.spec_from_file_location("gemm_shapes_probe",
                                                  os.path.join(ROOT, "bench", "gemm_shapes_probe.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tile_of_tiles_takes_its_k_split_stages_and_threads():
    probe = load_probe()
    plain, split, narrow = probe.extra_tiles("64x64,64x64:k32:s3,64x128x128:k16", 14336, 232448)
    assert (plain.split_k, plain.num_stages, plain.threads) == (1, 4, 256)
    assert (split.split_k, split.num_stages) == (32, 3)
    assert (narrow.block_N, narrow.threads, narrow.split_k) == (128, 128, 16)


def test_the_parts_of_a_padded_split_call_are_its_copies_gemm_and_reduction():
    probe = load_probe()
    plan = P.GemmPlan(25, 212, 14336, P.GemmConfig(64, 64, 64, 8, 128, True, split_k=8), "float16")
    calls = []
    kernels = {"gemm": lambda *args: calls.append(("gemm", len(args))),
               "reduce": lambda *args: calls.append(("reduce", len(args)))}
    launcher = P.GemmLauncher(plan, kernels)
    a, b, c = torch.randn(25, 14336).half(), torch.randn(14336, 212).half(), torch.empty(25, 212).half()
    launcher(a, b, c)
    assert calls == [("gemm", 3), ("reduce", 2)]
    parts = probe.part_calls(launcher, a, b, c)
    assert list(parts) == ["copies", "gemm", "reduce"]  # the reduction writes C at its own width
    calls.clear()
    for part in ("gemm", "reduce"):
        parts[part]()
    assert calls == [("gemm", 3), ("reduce", 2)]
    launcher.buffers["padded"]["b"].zero_()
    parts["copies"]()
    assert torch.equal(launcher.buffers["padded"]["b"][:, :212], b)


def test_a_padded_call_without_a_split_copies_c_out():
    probe = load_probe()
    plan = P.GemmPlan(25, 212, 14336, P.GemmConfig(64, 64, 64, 8, 128, True), "float16")
    launcher = P.GemmLauncher(plan, {"gemm": lambda a, b, c: c.copy_(a.float() @ b.float())})
    a, b, c = torch.randn(25, 14336).half(), torch.randn(14336, 212).half(), torch.empty(25, 212).half()
    launcher(a, b, c)
    assert list(probe.part_calls(launcher, a, b, c)) == ["copies", "gemm", "c out"]


@pytest.mark.parametrize("rows, cols", [(14336, 212), (8192, 2050), (999, 13)])
def test_b_padded_by_the_copy_kernel_lowers_for_unaligned_rows(rows, cols):
    """A padded plan's pad_rows program copies B's unaligned rows into the kernel's aligned ones."""
    program = P.pad_rows_program(rows, cols, P.aligned(rows), P.aligned(cols), "bfloat16")
    report = tourkit.inspect_kernel("pad_b", program, "sm_90a", nvcc=False)
    assert tuple(report.grid[:2]) == (-(-cols // PAD_TILE[1]), -(-rows // PAD_TILE[0]))
