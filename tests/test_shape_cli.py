"""--shape and --dtype: every refusal is one line and exit code 2 before anything compiles; an accepted problem
reaches the section as ctx.shape / ctx.dtype, in this process and through the worker process."""

import json
import os
import subprocess
import sys

import pytest

import tilelang_tour
import tourkit
from sections import shapes
from tourkit import Section

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

REFUSED = [
    (["--shape", "4096x4096x4096"], "needs exactly one section"),
    (["--only", "gemm_schedules,softmax", "--shape", "64x64x64"], "needs exactly one section"),
    (["--only", "softmax", "--shape", "8192x32000x3"], "softmax takes MxN"),
    (["--only", "gemm_schedules", "--shape", "8192x8192"], "takes MxNxK"),
    (["--only", "vector_add", "--shape", "10x10"], "vector_add takes N"),
    (["--only", "softmax", "--shape", "10x0"], "at least 1"),
    (["--only", "softmax", "--shape", "axb"], "positive integers"),
    (["--only", "softmax", "--shape", "1.5x3"], "positive integers"),
    (["--only", "softmax", "--shape", "1024x300000"], "262,144"),
    (["--only", "flash_attention", "--shape", "1x8x128x96"], "head dims 64, 128, 256"),
    (["--only", "flash_attention", "--shape", "1x8x128x64x3"], "multiple of KVH=3"),
    (["--only", "flash_attention", "--shape", "1x8x128"], "BxHxSxD or BxHxSxDxKVH"),
    (["--only", "flash_attention", "--shape", "70000x1x64x64"], "at most 65,535"),
    (["--only", "debugging", "--shape", "64"], "does not apply to debugging"),
    (["--only", "gemm_schedules", "--shape", "200000x200000x8"], "beyond any GPU"),
    (["--only", "softmax", "--dtype", "float8"], "give one of float16, bfloat16"),
    (["--only", "vector_add", "--dtype", "bfloat16"], "none of them is selected"),
]


@pytest.mark.parametrize("argv,message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refusals_are_one_line_and_exit_2(argv, message, capsys):
    calls = []
    run = tilelang_tour.main(argv, loader=lambda name: calls.append(name))
    assert run.exit_code == 2 and run.results == []
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert calls == []  # refused before any section was loaded


def test_refusal_from_the_command_line_has_no_traceback():
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tilelang_tour.py"), "--only", "softmax",
                           "--shape", "64x64x64"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "tilelang_tour.py: error: --shape '64x64x64': softmax takes MxN"
    assert "Traceback" not in done.stdout + done.stderr


def _recorder(seen):
    def load(name):
        def run(ctx):
            seen.append((name, ctx.shape, ctx.dtype))
            ctx.headline(shape="x".join(map(str, ctx.shape or ())), dtype=ctx.dtype)

        return Section(name=name, title=name, summary="records its problem", run=run, needs_gpu=False)

    return load


@pytest.fixture
def tilelang_importable(monkeypatch):
    monkeypatch.setattr(tourkit, "probe_tilelang_import", lambda timeout=120.0: (True, "0.0-test"))


@pytest.mark.parametrize("section,text,dims", [
    ("vector_add", "1000003", (1000003,)),
    ("gemm_schedules", "64x8192x8192", (64, 8192, 8192)),
    ("fusion", "2000X3000X4000", (2000, 3000, 4000)),
    ("softmax", "1024x128256", (1024, 128256)),
    ("flash_attention", "4x16x2048x64", (4, 16, 2048, 64)),
    ("flash_attention", "1x32x4096x128x8", (1, 32, 4096, 128, 8)),
])
def test_accepted_shape_reaches_the_section(section, text, dims, tilelang_importable):
    seen = []
    run = tilelang_tour.main(["--only", section, "--shape", text], loader=_recorder(seen))
    assert run.exit_code == 0
    assert seen == [(section, dims, "float16")]


def test_dtype_reaches_every_section_and_the_default_is_float16(tilelang_importable):
    seen = []
    tilelang_tour.main(["--only", "softmax,flash_attention", "--dtype", "bfloat16"], loader=_recorder(seen))
    assert seen == [("softmax", None, "bfloat16"), ("flash_attention", None, "bfloat16")]
    seen.clear()
    tilelang_tour.main(["--only", "gemm_schedules"], loader=_recorder(seen))
    assert seen == [("gemm_schedules", None, "float16")]


@pytest.mark.parametrize("arch,status", [("sm_75", "skipped"), ("sm_80", "passed"), ("sm_90a", "passed")])
def test_bfloat16_skips_before_sm_80(arch, status, tilelang_importable):
    seen = []
    run = tilelang_tour.main(["--only", "softmax,vector_add", "--dtype", "bfloat16", "--compile-only", "--arch",
                              arch], loader=_recorder(seen))
    by_name = {r.name: r for r in run.results}
    assert by_name["softmax"].status == status
    assert by_name["vector_add"].status == "passed"  # float32 only: --dtype is not its business
    if status == "skipped":
        assert by_name["softmax"].skip_reason == "bfloat16 needs sm_80 or newer; the target is sm_75"


def test_shape_and_dtype_cross_the_worker_process(tmp_path):
    """The real path: the parent checks the shape, the worker process hands it to the section."""
    out = tmp_path / "run.json"
    env = {**os.environ, tilelang_tour.SECTIONS_ENV: "tests.shape_fake_sections", "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "tilelang_tour.py"), "--only", "softmax",
                           "--shape", "4097x5000", "--dtype", "bfloat16", "--compile-only", "--arch", "sm_80",
                           "--json", str(out)], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "shape 4097x5000, bfloat16" in done.stdout  # the header names the problem
    written = json.loads(out.read_text())
    assert written["environment"]["options"]["shape"] == [4097, 5000]
    assert written["environment"]["options"]["dtype"] == "bfloat16"
    record = written["sections"][0]
    assert record["headline"] == {"shape": "4097x5000", "dtype": "bfloat16", "pid": record["headline"]["pid"]}
    assert record["headline"]["pid"] != os.getpid()


def test_shapes_module_needs_neither_torch_nor_tilelang():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['tilelang'] = None; "
            "from sections import shapes; print(shapes.parse_shape('softmax', '3x262144'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == "(3, 262144)", done.stderr


def test_every_shaped_section_is_a_real_section():
    from sections import SECTION_NAMES

    assert set(shapes.FORMS) <= set(SECTION_NAMES) and set(shapes.DTYPE_SECTIONS) <= set(SECTION_NAMES)


def test_a_problem_too_big_for_the_gpu_skips_with_its_size():
    small_gpu = tourkit.DeviceInfo("small GPU", (8, 0), "sm_80", 108, 8 * 2**30, 166912, 40 * 2**20)
    ctx = tourkit.TourContext(device=small_gpu, shape=(2**31,))
    with pytest.raises(tourkit.SectionSkip, match=r"needs about 40.0 GiB of GPU memory; this GPU has 8.0 GiB"):
        tourkit.require_device_memory(ctx, 20 * 2**31, "N=2147483648")
    tourkit.require_device_memory(ctx, 2**30, "N=1")  # fits: no skip
    tourkit.require_device_memory(tourkit.TourContext(compile_only=True, arch="sm_80"), 2**60, "compile-only")


def test_an_attention_problem_too_big_for_the_gpu_skips_before_anything_compiles(monkeypatch):
    from sections import flash_attention

    def no_build(*args, **kwargs):
        raise AssertionError("compiled a problem that cannot fit")

    monkeypatch.setattr(tourkit, "build_declared", no_build)
    small_gpu = tourkit.DeviceInfo("small GPU", (9, 0), "sm_90a", 132, 16 * 2**30, 232448, 60 * 2**20)
    ctx = tourkit.TourContext(device=small_gpu, shape=(8, 32, 16384, 128), echo=False)
    with pytest.raises(tourkit.SectionSkip, match=r"attention 8x32x16384x128 needs about 24.0 GiB"):
        flash_attention.run(ctx)


def test_an_autotune_problem_too_big_for_the_gpu_skips_before_anything_compiles(monkeypatch):
    from sections import autotune

    def no_build(*args, **kwargs):
        raise AssertionError("compiled a problem that cannot fit")

    monkeypatch.setattr(tourkit, "build_declared", no_build)
    small_gpu = tourkit.DeviceInfo("small GPU", (9, 0), "sm_90a", 132, 16 * 2**30, 232448, 60 * 2**20)
    ctx = tourkit.TourContext(device=small_gpu, shape=(65536, 32768, 1000), echo=False)
    with pytest.raises(tourkit.SectionSkip, match=r"the 65536x32768x1000 GEMM with its references needs about"):
        autotune.run(ctx)


def test_every_problem_the_shapes_script_runs_is_accepted():
    # bench/shape_targets.py runs its problems through --only/--shape/--dtype: each must pass the CLI's checks
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import shape_targets

    randoms = shape_targets.random_problems(25, seed=7)
    assert len(randoms) == 100 and randoms == shape_targets.random_problems(25, seed=7)  # a seed repeats a draw
    for section, text, dtype in shape_targets.PROBLEMS + shape_targets.OTHER_PROBLEMS + randoms:
        given = "float16" if dtype == "float32" else dtype  # float32: the script passes no --dtype (the default)
        assert shapes.check_request([section], True, text, given) == tuple(int(d) for d in text.split("x"))
