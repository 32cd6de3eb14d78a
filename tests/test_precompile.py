"""Sections compile their kernels up front with tourkit.compile_many; their own compile calls must then come
from TileLang's kernel cache. A mismatch (other target, out_idx or pass configs) would silently compile twice.

The sections compile for target "cuda" (the local GPU). Without a GPU that means sm_50, which nvcc 13 refuses,
so these tests read "cuda" as sm_90a for both the parallel and the section's own compile."""

import sys
import time

import pytest
import tilelang
import tilelang.jit  # noqa: F401  (the module; `tilelang.jit` the attribute is the decorator)

import tourkit
from sections import attention_plans as plans
from sections import flash_attention as FA
from sections import softmax as S
from sections import vector_add as V
from sections.gemm_schedules import GemmConfig, compile_gemm, epilogue_pass_configs, gemm_program

JIT_MODULE = sys.modules["tilelang.jit"]
CACHE_HIT_S = 1.0  # a cache hit takes milliseconds; an nvcc compile takes seconds


@pytest.fixture
def cuda_means_sm_90a(monkeypatch, tmp_path):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))  # cold: nothing from earlier runs
    original = JIT_MODULE.compile

    def compile_for_sm_90a(*args, target=None, **kwargs):
        if target in ("cuda", None):
            target = tourkit.cuda_target("sm_90a")
        with target:
            return original(*args, target=target, **kwargs)

    monkeypatch.setattr(JIT_MODULE, "compile", compile_for_sm_90a)
    monkeypatch.setattr(tilelang, "compile", compile_for_sm_90a)


def timed(fn):
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def test_compile_many_returns_kernels_in_order(cuda_means_sm_90a):
    kernels = tourkit.compile_many([V.vector_add_program(1000), V.vector_add_program(2000)])
    assert [k is not None for k in kernels] == [True, True]
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


def test_vector_add_compiles_once(cuda_means_sm_90a):
    tourkit.compile_many([V.vector_add_program(1000)])
    _, seconds = timed(lambda: V.compile_vector_add(1000))
    assert seconds < CACHE_HIT_S


def test_gemm_compiles_once(cuda_means_sm_90a):
    config = GemmConfig(128, 128, 64, 3, 256, True)
    # the GELU epilogue's kernel has its own pass configs (fast math): compile_many takes them per program
    tourkit.compile_many([(gemm_program(256, 256, 256, config, bias=True, activation="gelu"),
                           epilogue_pass_configs("gelu"))])
    _, seconds = timed(lambda: compile_gemm(256, 256, 256, config, bias=True, activation="gelu"))
    assert seconds < CACHE_HIT_S


def test_softmax_compiles_once(cuda_means_sm_90a):
    plan = S.choose_plan(64, 4096, tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin, "hopper")
    tourkit.compile_many([S.build(64, 4096, plan, "hopper")])
    _, seconds = timed(lambda: S.compile_softmax(64, 4096, plan, "hopper"))
    assert seconds < CACHE_HIT_S


def test_flash_attention_compiles_once_with_its_pass_configs(cuda_means_sm_90a):
    budget = tourkit.ARCH_SPECS["sm_90a"].smem_per_block_optin
    problem = plans.Problem(1, 2, 256, 64, True)
    cfg, _ = plans.choose_config(problem, "hopper", budget)
    assert FA.pass_configs(cfg), "attention on Hopper compiles with fast math: the case under test"
    decls = [tourkit.KernelDecl("fa", lambda: FA.build(problem, cfg), pass_configs=FA.pass_configs(cfg))]
    tourkit.build_declared(decls)  # the background compile; the section's run builds the same list again
    _, seconds = timed(lambda: tourkit.build_declared(decls))
    assert seconds < CACHE_HIT_S


def test_a_prepared_section_compiles_nothing_in_its_run(cuda_means_sm_90a):
    """The runner's background compile (Section.kernels, built by tourkit.build_declared) covers every kernel
    run() launches: here vector_add's."""
    device = tourkit.DeviceInfo("fake H200", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
    ctx = tourkit.TourContext(quick=True, device=device, echo=False)
    tourkit.build_declared(V.SECTION.kernels(ctx))
    launched = [(n, V.DEFAULT) for n in V.check_sizes(ctx)]
    launched += [(V.bench_size(ctx), config) for config in V.SCHEDULES]
    for n, config in launched:
        _, seconds = timed(lambda: V.compile_vector_add(n, config))
        assert seconds < CACHE_HIT_S, (n, config)
