"""Registers and register spills (ptxas -v) of every kernel the sections declare, per architecture, no GPU needed.

The compile-only run's "spills" column covers the kernels it sends through nvcc (the others it only lowers, to
save time); this compiles them all:

    python bench/spill_report.py --arch sm_80 --arch sm_90a [--only softmax,flash_attention]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tourkit  # noqa: E402
from sections import SECTION_NAMES  # noqa: E402


def section_reports(name: str, arch: str) -> list:
    import importlib

    section = importlib.import_module(f"sections.{name}").SECTION
    if section.kernels is None:
        return []
    ctx = tourkit.TourContext(compile_only=True, arch=arch, echo=False)
    decls = section.kernels(ctx)
    return tourkit.inspect_kernels([(d.name, d.program(), arch, d.pass_configs) for d in decls], nvcc=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=[], help="default: every architecture the tour knows")
    parser.add_argument("--only", default=",".join(SECTION_NAMES), metavar="A,B")
    args = parser.parse_args(argv)
    tourkit.quiet_tilelang()
    rows, spilled = [], []
    for arch in args.arch or list(tourkit.ARCH_SPECS):
        for name in [n for n in args.only.split(",") if n]:
            started = time.perf_counter()
            try:
                reports = section_reports(name, arch)
            except Exception as exc:  # noqa: BLE001 - one section's problem is one row
                rows.append([arch, name, "-", "-", "-", f"error: {tourkit.one_line(exc, 80)}"])
                continue
            for rep in reports:
                rows.append([arch, name, rep.name[:70], "-" if rep.registers is None else rep.registers, rep.spills,
                             rep.nvcc[:60]])
                if rep.spill_stores or rep.spill_loads:
                    spilled.append(f"{arch} {name}: {rep.name} ({rep.spills}, {rep.registers} registers)")
            print(f"{arch} {name}: {len(reports)} kernels in {time.perf_counter() - started:.0f} s", flush=True)
    print(tourkit.format_table(["arch", "section", "kernel", "regs", "spills", "nvcc"], rows))
    print("\nspills: " + ("; ".join(spilled) if spilled else "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
