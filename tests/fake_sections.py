"""Fake sections for the runner's isolation tests, chosen with TILELANG_TOUR_SECTIONS=tests.fake_sections.

Standard library only, so a worker that runs them starts in a fraction of a second. Each fake section
records the worker's pid in its headline (a test can tell whether the worker was replaced). The fake GPU
(FAKE_SECTIONS_GPU=1, or =old for one older than sm_75; FAKE_DETECT_CRASH=1 kills the worker while it looks) and its check (FAKE_GPU_CHECK=ok|fail|hang) stand in for the real device and the
tiny kernel the runner runs after a crash.
"""

import os
import time

from tourkit import DeviceInfo, Section

SECTION_NAMES = ["env_check", "first", "nap", "sticky", "boom", "second", "third", "gpu_one", "gpu_two", "big"]
FAKE_GPU = DeviceInfo("fake GPU", (9, 0), "sm_90a", 132, 141 * 2**30, 232448, 60 * 2**20)
OLD_GPU = DeviceInfo("fake P100", (6, 0), "sm_75", 56, 16 * 2**30, 49152, 4 * 2**20)  # older than the kernels


def _ok(ctx):
    ctx.log(f"fake section ran in process {os.getpid()}")
    ctx.headline(pid=os.getpid(), compile_only=ctx.compile_only)


def _nap(ctx):
    time.sleep(float(os.environ.get("FAKE_NAP_S", "0.5")))
    _ok(ctx)


def _sticky(ctx):
    ctx.headline(pid=os.getpid())
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def _boom(ctx):
    raise RuntimeError("kernel exploded")


def _big(ctx):  # a record of megabytes: still in the pipe when the worker, its sections done, exits
    for i in range(int(os.environ.get("FAKE_BIG_LINES", "30000"))):
        ctx.report.append(f"line {i:6d} " + "x" * 88)
    _ok(ctx)


RUNS = {"nap": _nap, "sticky": _sticky, "boom": _boom, "big": _big}


def load_section(name):
    return Section(name=name, title=f"fake {name}", summary="a fake section", run=RUNS.get(name, _ok),
                   needs_gpu=name.startswith("gpu_"))


def detect_device():
    if os.environ.get("FAKE_DETECT_CRASH") == "1":  # a worker that dies before it runs anything
        os._exit(4)
    kind = os.environ.get("FAKE_SECTIONS_GPU")
    return FAKE_GPU if kind == "1" else OLD_GPU if kind == "old" else None


def probe_tilelang_import():
    how = os.environ.get("FAKE_PROBE", "ok")  # abort | hang: what a broken tilelang install can do to an import
    if how == "abort":
        os.abort()
    if how == "hang":
        time.sleep(3600)
    return True, "0.0-fake"


def gpu_check():
    how = os.environ.get("FAKE_GPU_CHECK", "ok")
    if how == "fail":
        raise RuntimeError("CUDA error: no kernel image could run")
    if how == "hang":
        time.sleep(600)
