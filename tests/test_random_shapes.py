"""Problems nobody picked: seeded random shapes (tiny, ragged, skinny, tall, wide, unaligned; both element types)
given to the sections as `--shape` would give them, on every architecture the tour targets. Every kernel a
section declares for such a problem must lower (no GPU, no nvcc), show the instructions it promises and fit the
shared memory it may use. The shapes differ from run to run only if TOUR_SHAPES_SEED says so."""

import os
import random
import sys

import pytest

import tourkit
from sections import autotune, flash_attention, fusion, gemm_schedules, shapes, softmax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from shape_targets import random_shape  # noqa: E402  (the generator bench/shape_targets.py --random uses)

SEED = int(os.environ.get("TOUR_SHAPES_SEED", "2026"))
CASES_PER_SECTION = 8
ARCHS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a", "sm_120a")
SECTIONS = {"gemm_schedules": gemm_schedules, "fusion": fusion, "autotune": autotune, "softmax": softmax,
            "flash_attention": flash_attention}
AUTOTUNE_SAMPLE = 2  # of the autotune section's dozen configurations, this many a case


def cases() -> list:
    rng = random.Random(SEED)
    out = []
    for section in SECTIONS:
        for _ in range(CASES_PER_SECTION):
            arch = rng.choice(ARCHS)
            dtype = "float16" if arch == "sm_75" else rng.choice(shapes.DTYPES)  # bfloat16 needs sm_80
            out.append((section, random_shape(section, rng), arch, dtype))
    return out


CASES = cases()


@pytest.mark.parametrize("section,shape,arch,dtype", CASES,
                         ids=[f"{s}-{'x'.join(map(str, d))}-{a}-{t}" for s, d, a, t in CASES])
def test_every_kernel_a_section_declares_for_a_random_problem_lowers(section, shape, arch, dtype):
    assert shapes.parse_shape(section, "x".join(map(str, shape))) == shape  # a problem the CLI accepts
    ctx = tourkit.TourContext(compile_only=True, arch=arch, shape=shape, dtype=dtype, echo=False)
    decls = SECTIONS[section].kernels(ctx)
    assert decls and len({d.name for d in decls}) == len(decls), [d.name for d in decls]  # a name is a kernel
    if section == "autotune":
        decls = random.Random(SEED).sample(decls, min(AUTOTUNE_SAMPLE, len(decls)))
    for decl in decls:
        report = tourkit.inspect_kernel(decl.name, decl.program(), arch, nvcc=False, pass_configs=decl.pass_configs)
        tourkit.require_markers(report, decl.markers)
        tourkit.require_register_raise_fits(report, decl.threads)
        assert decl.smem_limit is None or report.smem_bytes <= decl.smem_limit, (decl.name, report.smem_bytes)
        assert dtype == "float16" or "bfloat16_t" in report.source, decl.name
