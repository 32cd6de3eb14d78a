"""Blackwell GPUs (sm_100a: B200; sm_120a: RTX 50 series) have no wgmma, and the tour does not teach their
tcgen05 tensor cores: there the lessons run their Ampere-style kernels (mma.sync), which TileLang feeds with
TMA copies under mbarriers. Every section builds for both targets (no GPU needed)."""

import pytest

import tilelang_tour
from sections import SECTION_NAMES


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
def test_every_section_builds_for_blackwell(arch, capsys):
    run = tilelang_tour.main(["--compile-only", "--arch", arch, "--skip", "env_check"])
    assert [(r.name, r.status) for r in run.results] == [(name, "passed") for name in SECTION_NAMES[1:]], \
        [(r.name, r.error_message or r.skip_reason) for r in run.results]
    out = capsys.readouterr().out
    reports = [k for r in run.results for k in r.metrics.get("kernel_reports", [])]
    assert len(reports) >= 20 and all(k["arch"] == arch for k in reports)
    assert not any(k["markers"].get("wgmma") for k in reports), [k["name"] for k in reports if k["markers"].get("wgmma")]
    gemms = [k for k in reports if "T.Pipelined" in k["name"] and not k["name"].endswith(("(reduce)", "(pad_b)"))]
    assert gemms and all(k["markers"].get("mma_sync") and k["markers"].get("tma_load") for k in gemms)
    assert "markers tma_load,mbarrier,mma_sync" in out  # the GEMM lesson's headline


@pytest.mark.parametrize("arch", ["sm_100a", "sm_120a"])
@pytest.mark.parametrize("section, shape, dtype", [("gemm_schedules", (573, 8851, 64), "bfloat16"),
                                                   ("fusion", (3390, 1698, 128), "float16")])
def test_rows_loaded_masked_build_without_spills(arch, section, shape, dtype):
    """Rows off 16 bytes are loaded masked. With TMA but no register split, TileLang would give such copies a
    producer as large as the consumers, halving their registers (the 128x256 tile spilled): every kernel the
    section declares for the problem is built without one."""
    import importlib

    import tourkit

    ctx = tourkit.TourContext(compile_only=True, arch=arch, shape=shape, dtype=dtype, echo=False)
    decls = importlib.import_module(f"sections.{section}").kernels(ctx)
    assert any("128x256" in d.name for d in decls), [d.name for d in decls]
    for decl in decls:
        report = tourkit.inspect_kernel(decl.name, decl.program(), arch, pass_configs=decl.pass_configs,
                                        nvcc=tourkit.find_nvcc() is not None)
        tourkit.require_markers(report, decl.markers)
        assert report.threads <= 256 and report.markers["mma_sync"], (decl.name, report.threads)
        if tourkit.find_nvcc() is not None:
            assert report.nvcc == "compiled" and report.spills == "0", (decl.name, report.nvcc, report.spills)
