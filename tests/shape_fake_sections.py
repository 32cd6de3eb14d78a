"""Fake sections with the real names, for the --shape tests through the worker process
(TILELANG_TOUR_SECTIONS=tests.shape_fake_sections): each records the problem and dtype it was handed."""

import os

from sections import SECTION_NAMES  # noqa: F401  (the runner reads it from here)
from tourkit import Section


def _record(ctx):
    ctx.headline(shape="x".join(map(str, ctx.shape or ())), dtype=ctx.dtype, pid=os.getpid())


def load_section(name):
    return Section(name=name, title=f"fake {name}", summary="records its problem", run=_record, needs_gpu=False)


def detect_device():
    return None


def probe_tilelang_import():
    return True, "0.0-fake"
