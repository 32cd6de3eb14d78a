"""Sections compile their kernels up front with tourkit.compile_many; their own compile calls must then come
from TileLang's kernel cache. A mismatch (other target, out_idx or pass configs) would silently compile twice.

The sections compile for target "cuda" (the local GPU). Without a GPU that means sm_50, which nvcc 13 refuses,
so these tests read "cuda" as sm_90a for both the parallel and the section's own compile."""

import sys

import pytest
import tilelang
import tilelang.cache
import tilelang.cache.kernel_cache as KERNEL_CACHE
import tilelang.jit  # noqa: F401  (the module; `tilelang.jit` the attribute is the decorator)

import tourkit
from sections import flash_attention as FA
from sections import softmax as S
from sections import vector_add as V
from sections.gemm_epilogue import epilogue_pass_configs
from sections.gemm_schedules import GemmConfig, compile_gemm, gemm_program

JIT_MODULE = sys.modules["tilelang.jit"]
FAKE_H200 = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)


class StopAfterBuild(Exception):
    """Raised where a section's run would first touch the GPU: everything it compiled is compiled by then."""


@pytest.fixture
def compiles(monkeypatch, tmp_path):
    """Reads target "cuda" as sm_90a; starts cold (an empty disk cache, an empty in-memory cache) and returns
    the list of kernels TileLang really compiled (cache misses), in order."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    for cache in tilelang.cache._dispatch_map.values():
        monkeypatch.setattr(cache, "_memory_cache", {})
    original = JIT_MODULE.compile

    def compile_for_sm_90a(*args, target=None, **kwargs):
        if target in ("cuda", None):
            target = tourkit.cuda_target("sm_90a")
        with target:
            return original(*args, target=target, **kwargs)

    monkeypatch.setattr(JIT_MODULE, "compile", compile_for_sm_90a)
    monkeypatch.setattr(tilelang, "compile", compile_for_sm_90a)
    missed = []

    class CountedKernel(KERNEL_CACHE.JITKernel):
        def __init__(self, func=None, *args, **kwargs):
            missed.append(func.attrs["global_symbol"] if func is not None and func.attrs else "?")
            super().__init__(func, *args, **kwargs)

    monkeypatch.setattr(KERNEL_CACHE, "JITKernel", CountedKernel)
    return missed


def test_compile_many_returns_kernels_in_order(compiles):
    kernels = tourkit.compile_many([V.vector_add_program(1000), V.vector_add_program(2000)])
    assert [k is not None for k in kernels] == [True, True] and len(compiles) == 2
    # the tail guard of N=1000 (one block, 250 float4 accesses) belongs to the first kernel only
    assert "< 250)" in kernels[0].get_kernel_source()
    assert "< 250)" not in kernels[1].get_kernel_source()


def test_compile_many_gives_none_for_a_kernel_that_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(tilelang, "compile", broken)
    lines = []
    assert tourkit.compile_many([V.vector_add_program(1000)], log=lines.append) == [None]
    assert lines and lines[0].startswith("compiled 0 of 1 kernels")


def test_vector_add_compiles_once(compiles):
    tourkit.compile_many([V.vector_add_program(1000)])
    assert len(compiles) == 1
    V.compile_vector_add(1000)
    assert len(compiles) == 1, compiles


def test_gemm_compiles_once(compiles):
    config = GemmConfig(128, 128, 64, 3, 256, True)
    # the GELU epilogue's kernel has its own pass configs (fast math): compile_many takes them per program
    tourkit.compile_many([(gemm_program(256, 256, 256, config, bias=True, activation="gelu"),
                           epilogue_pass_configs("gelu"))])
    assert len(compiles) == 1
    compile_gemm(256, 256, 256, config, bias=True, activation="gelu")
    assert len(compiles) == 1, compiles
    compile_gemm(256, 256, 256, config, bias=True)  # without GELU's pass configs: another kernel
    assert len(compiles) == 2


def test_softmax_compiles_once(compiles):
    plan = S.choose_plan(64, 4096, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin, "hopper")
    tourkit.compile_many([S.build(64, 4096, plan, "hopper")])
    assert len(compiles) == 1
    S.compile_softmax(64, 4096, plan, "hopper")
    assert len(compiles) == 1, compiles


def run_until_the_gpu(section, ctx, monkeypatch, first_gpu_step: str):
    monkeypatch.setattr(section, first_gpu_step, lambda *a, **k: (_ for _ in ()).throw(StopAfterBuild()))
    with pytest.raises(StopAfterBuild):
        section.run(ctx)


def test_flash_attention_compiles_nothing_in_its_run_once_prepared(compiles, monkeypatch):
    """The runner's background compile (the section's declarations, with their fast-math pass configs) covers
    every kernel the section's run builds: the lesson's and the appendix's, causal and full."""
    ctx = tourkit.TourContext(shape=(1, 2, 256, 64), device=FAKE_H200, echo=False)
    assert any(FA.pass_configs(cfg) for *_, cfg, _, _ in FA.plan(ctx)), "fast math: the case under test"
    tourkit.build_declared(FA.kernels(ctx))
    prepared = len(compiles)
    assert prepared == len(FA.kernels(ctx)) >= 4
    run_until_the_gpu(FA, ctx, monkeypatch, "check_attention")
    assert len(compiles) == prepared, compiles[prepared:]


def test_a_prepared_section_compiles_nothing_in_its_run(compiles, monkeypatch):
    """The same for vector_add's quick run: its checked sizes and every schedule at the benchmark size."""
    ctx = tourkit.TourContext(quick=True, device=FAKE_H200, echo=False)
    tourkit.build_declared(V.SECTION.kernels(ctx))
    prepared = len(compiles)
    assert prepared == len(V.SECTION.kernels(ctx)) >= 4
    run_until_the_gpu(V, ctx, monkeypatch, "check")
    assert len(compiles) == prepared, compiles[prepared:]
