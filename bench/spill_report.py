"""Registers and register spills (ptxas -v) of every kernel the sections declare, per architecture, no GPU needed.

The compile-only run's "spills" column covers the kernels it sends through nvcc (the others it only lowers, to
save time); this compiles them all:

    python bench/spill_report.py --arch sm_80 --arch sm_90a [--only softmax,flash_attention]
    python bench/spill_report.py --arch sm_90a --random 10 --seed 7   # users' problems: 10 random ones a section

With --random every kernel a section declares for each random problem (bench/shape_targets.random_shape, as
`--shape` would give it) goes through nvcc: a kernel that does not build or spills is a problem a user would
hit on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tourkit  # noqa: E402
from sections import SECTION_NAMES  # noqa: E402


def section_reports(name: str, arch: str, shape: tuple | None = None, dtype: str = "float16") -> list:
    import importlib

    section = importlib.import_module(f"sections.{name}").SECTION
    if section.kernels is None:
        return []
    ctx = tourkit.TourContext(compile_only=True, arch=arch, echo=False, shape=shape, dtype=dtype)
    decls = section.kernels(ctx)
    return tourkit.inspect_kernels([(d.name, d.program(), arch, d.pass_configs) for d in decls], nvcc=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", default=[], help="default: every architecture the tour knows")
    parser.add_argument("--only", default=",".join(SECTION_NAMES), metavar="A,B")
    parser.add_argument("--random", type=int, default=0, metavar="N", help="N random problems a section")
    parser.add_argument("--seed", type=int, default=0, help="the random problems' seed")
    args = parser.parse_args(argv)
    tourkit.quiet_tilelang()
    names = [n for n in args.only.split(",") if n]
    if args.random:
        from shape_targets import RANDOM_SECTIONS, random_problems

        jobs = [(s, tuple(map(int, dims.split("x"))), t) for s, dims, t in
                random_problems(args.random, args.seed, [n for n in names if n in RANDOM_SECTIONS])]
    else:
        jobs = [(name, None, "float16") for name in names]
    rows, spilled, failed = [], [], []
    for arch in args.arch or list(tourkit.ARCH_SPECS):
        for name, shape, dtype in jobs:
            where = name + (f" {'x'.join(map(str, shape))} {dtype}" if shape else "")
            if dtype == "bfloat16" and tourkit.ARCH_SPECS[arch].capability < (8, 0):
                continue  # bfloat16 needs sm_80: the section skips
            started = time.perf_counter()
            try:
                reports = section_reports(name, arch, shape, dtype)
            except Exception as exc:  # noqa: BLE001 - one section's problem is one row
                rows.append([arch, where, "-", "-", "-", f"error: {tourkit.one_line(exc, 80)}"])
                failed.append(f"{arch} {where}: {tourkit.one_line(exc, 160)}")
                continue
            for rep in reports:
                rows.append([arch, where, rep.name[:70], "-" if rep.registers is None else rep.registers, rep.spills,
                             rep.nvcc[:60]])
                if rep.spill_stores or rep.spill_loads:
                    spilled.append(f"{arch} {where}: {rep.name} ({rep.spills}, {rep.registers} registers)")
                if rep.nvcc != "compiled":
                    failed.append(f"{arch} {where}: {rep.name}: {rep.nvcc[:160]}")
            print(f"{arch} {where}: {len(reports)} kernels in {time.perf_counter() - started:.0f} s", flush=True)
    print(tourkit.format_table(["arch", "section", "kernel", "regs", "spills", "nvcc"], rows))
    print("\nspills: " + ("; ".join(spilled) if spilled else "none"))
    print("not built: " + ("; ".join(failed) if failed else "none"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
