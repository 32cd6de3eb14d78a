"""Placeholder: this section is not built yet."""

from tourkit import Section, SectionSkip


def run(ctx):
    raise SectionSkip("not implemented yet")


SECTION = Section(name="gemm_schedules", title="gemm_schedules (coming soon)", summary="Not implemented yet.", run=run,
                  needs_gpu=False)
