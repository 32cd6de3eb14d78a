#!/usr/bin/env python3
"""Plots of a tour run: the GEMM schedules as bars against cuBLAS, softmax and attention throughput across
their shapes, and a roofline of the GPU with every kernel the tour timed placed on it.

    python tourplots.py run.json --out docs/     # from a record written by `tilelang_tour.py --json run.json`
    python tilelang_tour.py --plots plots/       # at the end of a run

The plots read only what the sections recorded with `ctx.timing(...)` (metrics["timings"]: name, median ms,
FLOPs, bytes moved, kind, problem), so a record from another machine draws the same. The roofline's two
ceilings come from the run itself: the memory ceiling is the fastest device copy timed (bytes read plus
written per second) and the compute ceiling the fastest matrix rate timed (cuBLAS's, usually). A point's x
is its arithmetic intensity (FLOPs per byte it must move at least), its y the FLOP/s it achieved: under the
slanted roof a kernel is memory-bound, under the flat one compute-bound, and the gap to the roof is what is
left. matplotlib is imported only when drawing; without it the tour says so once and goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any, Callable, Iterable, Sequence

INSTALL_HINT = "pip install matplotlib"
# The sections drawn across their shapes, each in the rate that judges it: softmax moves bytes (GB/s against
# the copy), attention is matrix work (TFLOP/s).
THROUGHPUT_SECTIONS = {"softmax": "bytes", "flash_attention": "flops"}
OURS = ("lesson", "appendix")
# One marker per kind, so PyTorch's paths stand beside ours on every plot.
MARKERS = {"lesson": "o", "appendix": "s", "pytorch": "^", "copy": "D"}
KIND_LABELS = {"lesson": "TileLang (lesson)", "appendix": "TileLang (Hopper appendix)", "pytorch": "PyTorch",
               "copy": "device copy"}
KIND_COLORS = {"lesson": "#1f77b4", "appendix": "#2ca02c", "pytorch": "#7f7f7f", "copy": "#d62728"}
FILES = {"gemm": "gemm_schedules.png", "softmax": "softmax.png", "flash_attention": "flash_attention.png",
         "roofline": "roofline.png"}


class PlotsUnavailable(Exception):
    """matplotlib is missing: the message is the one line the tour prints."""


# ---------------------------------------------------------------------------------------------------------
# Reading a record
# ---------------------------------------------------------------------------------------------------------


def section_dicts(sections: Iterable[Any]) -> list[dict]:
    """SectionResult objects or their dicts (a --json record's "sections") as dicts."""
    return [s.to_dict() if hasattr(s, "to_dict") else dict(s) for s in sections]


def timings(sections: Iterable[Any]) -> list[dict]:
    """Every timing the passed sections recorded, each with its section's name added. A section that failed
    is left out: its numbers describe a kernel that did not pass its check."""
    found = []
    for record in section_dicts(sections):
        if record.get("status") != "passed":
            continue
        for entry in (record.get("metrics") or {}).get("timings") or []:
            if isinstance(entry, dict) and _positive(entry.get("ms")):
                found.append({**entry, "section": record.get("name", "")})
    return found


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def flops_per_s(entry: dict) -> float | None:
    return entry["flops"] / (entry["ms"] * 1e-3) if _positive(entry.get("flops")) else None


def bytes_per_s(entry: dict) -> float | None:
    return entry["nbytes"] / (entry["ms"] * 1e-3) if _positive(entry.get("nbytes")) else None


def ceilings(entries: Sequence[dict]) -> dict[str, Any]:
    """The roofline's ceilings from the run's own timings: the fastest copy (bytes/s) and the fastest matrix
    rate (FLOP/s), each with the timing it came from; None where the run timed no such thing. Without a
    copy timed, the fastest memory-bound rate stands in (a floor under the real ceiling, and said so)."""
    copies = [e for e in entries if e.get("kind") == "copy" and bytes_per_s(e)]
    rated = [e for e in entries if flops_per_s(e)]
    out: dict[str, Any] = {"bandwidth": None, "bandwidth_from": None, "compute": None, "compute_from": None}
    if copies:
        best = max(copies, key=bytes_per_s)
        out["bandwidth"], out["bandwidth_from"] = bytes_per_s(best), f"device copy ({best['section']})"
    else:
        streamed = [e for e in entries if bytes_per_s(e)]
        if streamed:
            best = max(streamed, key=bytes_per_s)
            out["bandwidth"], out["bandwidth_from"] = bytes_per_s(best), f"fastest stream timed: {best['name']}"
    if rated:
        best = max(rated, key=flops_per_s)
        out["compute"], out["compute_from"] = flops_per_s(best), f"{best['name']} ({best.get('problem', '')})"
    return out


def roofline_points(entries: Sequence[dict]) -> list[dict]:
    """The timings that have both FLOPs and bytes: x = FLOPs per byte, y = FLOP/s."""
    points = []
    for e in entries:
        if _positive(e.get("flops")) and _positive(e.get("nbytes")):
            points.append({**e, "intensity": e["flops"] / e["nbytes"], "rate": flops_per_s(e)})
    return points


# ---------------------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------------------


def _figure(width: float, height: float):
    """A figure that draws without pyplot or a display (the Agg canvas), so a server run and a notebook
    behave alike and the notebook's own backend is left alone."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotsUnavailable(f"matplotlib is not installed ({INSTALL_HINT}); no plots drawn") from None
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    return fig


def _short(text: str, limit: int = 28) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _title(environment: dict | None, text: str) -> str:
    gpu = ((environment or {}).get("gpu") or {}).get("name")
    return f"{text} — {gpu}" if gpu else text


def draw_gemm(entries: Sequence[dict], environment: dict | None = None):
    """gemm_schedules' timings as horizontal bars of TFLOP/s, grouped by problem, cuBLAS in grey; None when
    the section timed nothing."""
    rows = [e for e in entries if e["section"] == "gemm_schedules" and flops_per_s(e)]
    if not rows:
        return None
    problems = list(dict.fromkeys(e.get("problem", "") for e in rows))
    ordered = [e for p in problems for e in rows if e.get("problem", "") == p]
    fig = _figure(10.0, 1.6 + 0.32 * len(ordered))
    ax = fig.add_subplot()
    ys = list(range(len(ordered)))[::-1]
    rates = [flops_per_s(e) / 1e12 for e in ordered]
    ax.barh(ys, rates, color=[KIND_COLORS.get(e.get("kind"), "#9467bd") for e in ordered], height=0.7)
    # The colour says lesson or appendix: the label keeps the schedule, which is what differs between bars.
    names = [e["name"].removeprefix("T.Pipelined ") + (f" [{e['problem']}]" if len(problems) > 1 else "")
             for e in ordered]
    ax.set_yticks(ys, [_short(name, 80) for name in names], fontsize=7)
    for y, rate, e in zip(ys, rates, ordered):
        reference = [flops_per_s(r) for r in ordered if r.get("kind") == "pytorch"
                     and r.get("problem", "") == e.get("problem", "")]
        ratio = f"  {flops_per_s(e) / reference[0]:.2f}x" if reference and e.get("kind") != "pytorch" else ""
        ax.text(rate, y, f" {rate:.0f}{ratio}", va="center", fontsize=7)
    ax.set_xlabel("TFLOP/s (ratio: to cuBLAS on the same problem, timed in turns)")
    ax.set_xlim(0, max(rates) * 1.2)
    _kind_legend(ax, {e.get("kind") for e in ordered}, bars=True)
    ax.set_title(_title(environment, f"GEMM schedules against cuBLAS, {' / '.join(problems)}"), fontsize=10)
    fig.tight_layout()
    return fig


def draw_throughput(entries: Sequence[dict], section: str, environment: dict | None = None, unit: str | None = None):
    """One section's throughput across the problems it ran: per problem the fastest timing of each kind, as
    grouped bars in TFLOP/s (unit "flops") or GB/s ("bytes"; the default where a timing lacks FLOPs); None
    when the section timed nothing."""
    # A copy of the same bytes is the ceiling of a GB/s plot, and has no FLOPs to draw.
    rows = [e for e in entries if e["section"] == section and (e.get("kind") != "copy" or unit == "bytes")]
    use_flops = bool(rows) and all(flops_per_s(e) for e in rows) and (unit or "flops") == "flops"
    rate = (lambda e: flops_per_s(e) / 1e12) if use_flops else (lambda e: (bytes_per_s(e) or 0) / 1e9)
    rows = [e for e in rows if rate(e) > 0]
    if not rows:
        return None
    problems = list(dict.fromkeys(e.get("problem", "") for e in rows))
    kinds = [k for k in MARKERS if any(e.get("kind") == k for e in rows)]
    fig = _figure(max(6.0, 1.0 + 0.9 * len(problems) * max(1, len(kinds)) / 2), 4.2)
    ax = fig.add_subplot()
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        xs, values = [], []
        for j, problem in enumerate(problems):
            same = [rate(e) for e in rows if e.get("kind") == kind and e.get("problem", "") == problem]
            if same:
                xs.append(j - 0.4 + width * (i + 0.5))
                values.append(max(same))
        ax.bar(xs, values, width=width * 0.95, color=KIND_COLORS.get(kind), label=KIND_LABELS.get(kind, kind))
    ax.set_ylim(0, ax.get_ylim()[1] * 1.2)  # room for the legend above the bars
    ax.set_xticks(range(len(problems)), [_short(p, 24) for p in problems], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s" if use_flops else "GB/s (bytes read + written)")
    ax.legend(fontsize=7)
    ax.set_title(_title(environment, f"{section}: ours against PyTorch across the shapes it ran"), fontsize=10)
    fig.tight_layout()
    return fig


def draw_roofline(entries: Sequence[dict], environment: dict | None = None):
    """Log-log roofline: the run's ceilings and a marker per timing with FLOPs and bytes (shape by kind,
    colour by section, a compact label each); None when no timing has both."""
    points = roofline_points(entries)
    if not points:
        return None
    roof = ceilings(entries)
    fig = _figure(8.5, 6.0)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [p["intensity"] for p in points]
    lo, hi = min(xs) / 3, max(xs) * 3
    bandwidth, compute = roof["bandwidth"], roof["compute"]
    if bandwidth and compute:
        lo, hi = min(lo, compute / bandwidth / 30), max(hi, compute / bandwidth * 30)
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    if bandwidth:
        roofs = [min(bandwidth * x, compute or math.inf) / 1e12 for x in grid]
        ax.plot(grid, roofs, color="black", lw=1.5,
                label=f"roof: {bandwidth / 1e9:.0f} GB/s ({_short(roof['bandwidth_from'], 40)})")
    if compute:
        ax.axhline(compute / 1e12, color="black", ls=":", lw=1,
                   label=f"{compute / 1e12:.0f} TFLOP/s ({_short(roof['compute_from'], 40)})")
    sections = list(dict.fromkeys(p["section"] for p in points))
    colors = _colors(len(sections))
    for p in points:
        color = colors[sections.index(p["section"])]
        ax.scatter([p["intensity"]], [p["rate"] / 1e12], marker=MARKERS.get(p.get("kind"), "o"), s=36,
                   facecolors=color if p.get("kind") != "pytorch" else "none", edgecolors=color, linewidths=1.2)
    if len(points) <= 12:  # beyond that labels cover each other: colour (section) and marker (kind) remain
        for p in points:
            ax.annotate(_short(f"{p['name']} {p.get('problem', '')}", 30), (p["intensity"], p["rate"] / 1e12),
                        xytext=(4, 2), textcoords="offset points", fontsize=5.5, alpha=0.85)
    for name, color in zip(sections, colors):
        ax.scatter([], [], marker="o", color=color, label=name)
    _kind_legend(ax, {p.get("kind") for p in points}, bars=False)
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(_title(environment, "Roofline: every kernel the tour timed"), fontsize=10)
    fig.tight_layout()
    return fig


def _kind_legend(ax, kinds, bars: bool) -> None:
    """Legend entries for the kinds present (a bar plot: colours; the roofline: marker shapes, PyTorch hollow)."""
    for kind in MARKERS:
        if kind not in kinds:
            continue
        if bars:
            ax.bar([0], [0], color=KIND_COLORS[kind], label=KIND_LABELS[kind])
        else:
            ax.scatter([], [], marker=MARKERS[kind], facecolors="none" if kind == "pytorch" else "black",
                       edgecolors="black", label=KIND_LABELS[kind])
    if bars:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, never on them


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


# ---------------------------------------------------------------------------------------------------------
# Writing and showing
# ---------------------------------------------------------------------------------------------------------


def draw_all(sections: Iterable[Any], out_dir: str, environment: dict | None = None) -> list[str]:
    """Draw every plot the record has data for into `out_dir` (created) and return the PNG paths. Raises
    PlotsUnavailable without matplotlib; returns [] when the record has no timings."""
    entries = timings(sections)
    if not entries:
        return []
    _figure(1, 1)  # fail early, with the one line, when matplotlib is missing
    figures = {"gemm": draw_gemm(entries, environment), "roofline": draw_roofline(entries, environment)}
    for name, unit in THROUGHPUT_SECTIONS.items():
        figures[name] = draw_throughput(entries, name, environment, unit)
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for key in ("gemm", *THROUGHPUT_SECTIONS, "roofline"):
        if figures.get(key) is not None:
            path = os.path.join(out_dir, FILES[key])
            figures[key].savefig(path, dpi=110, bbox_inches="tight")  # "tight": the legends outside the axes
            paths.append(path)
    return paths


def show_inline(paths: Sequence[str]) -> None:
    """Show the PNGs in a notebook (IPython's display); nothing elsewhere."""
    try:
        from IPython.display import Image, display
    except ImportError:
        return
    for path in paths:
        display(Image(filename=path))


def after_tour(sections: Iterable[Any], environment: dict | None = None, *, out_dir: str | None = None,
               inline: bool = False, log: Callable[[str], None] = print) -> list[str]:
    """The tour's last step: write the plots to `out_dir` (--plots) and/or show them in a notebook. Never
    raises: a missing matplotlib or a plotting error is one line, and the tour's exit code stays its own."""
    if not out_dir and not inline:
        return []
    try:
        entries = timings(sections)
        if not entries:
            if out_dir:  # asked for explicitly: say why nothing came
                log("plots: no timed kernels in this run (compile-only, no GPU, or no section passed); nothing drawn")
            return []
        folder = out_dir
        if not folder:
            import tempfile

            folder = tempfile.mkdtemp(prefix="tilelang_tour_plots_")
        paths = draw_all(sections, folder, environment)
        if out_dir:
            log(f"plots: wrote {', '.join(os.path.basename(p) for p in paths)} to {out_dir}")
        if inline:
            show_inline(paths)
        return paths
    except PlotsUnavailable as exc:
        log(f"plots: {exc}")
    except Exception as exc:  # noqa: BLE001 - a plot must never fail the tour
        log(f"plots: drawing failed ({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); the run is unaffected")
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tourplots.py", description="Draw the tour's plots from a --json record.")
    parser.add_argument("record", help="the file written by `tilelang_tour.py --json PATH`")
    parser.add_argument("--out", default="plots", metavar="DIR", help="folder for the PNG files (default: plots)")
    args = parser.parse_args(argv)
    try:
        with open(args.record) as fh:
            run = json.load(fh)
    except (OSError, ValueError) as exc:
        print(f"tourplots.py: cannot read {args.record}: {exc}", file=sys.stderr)
        return 2
    sections, environment = run.get("sections") or [], run.get("environment") or {}
    if not timings(sections):
        print(f"tourplots.py: {args.record} has no timed kernels (compile-only, no GPU, or no section passed); "
              f"nothing drawn")
        return 1
    try:
        paths = draw_all(sections, args.out, environment)
    except PlotsUnavailable as exc:
        print(f"tourplots.py: {exc}", file=sys.stderr)
        return 2
    roof = ceilings(timings(sections))
    for key, unit, scale in (("bandwidth", "GB/s", 1e9), ("compute", "TFLOP/s", 1e12)):
        if roof[key]:
            print(f"{key} ceiling: {roof[key] / scale:.0f} {unit} from {roof[key + '_from']}")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
