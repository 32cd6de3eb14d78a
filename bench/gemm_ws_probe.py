"""The Hopper appendix's hand-written GEMMs (sections/hopper/gemm_ws.py, gemm_pingpong.py) in their variants,
validated and timed against cuBLAS and the lesson's pipelined schedules on an H100/H200.

    python bench/gemm_ws_probe.py                  # every variant, every shape (Hopper GPU)
    python bench/gemm_ws_probe.py --quick          # 8192^3 only
    python bench/gemm_ws_probe.py --shapes 8192x8192x8192,4096x4096x4096 --variants ws,ws_persistent
    python bench/gemm_ws_probe.py --list           # the variants, whether each compiles for sm_90a (no GPU),
                                                   # their registers and spills (ptxas), --source: the main loop

Every variant is a WsConfig or PingPongConfig of the appendix's builders: tile shapes, ring depth, store
strips, one tile per block or persistent, even rounds, panel width. (Cluster multicast of B, stream-K and a
lockstep split of the last wave, one `empty` arrival per consumer warp and a single producer warp were tried
here as well and lost to the persistent kernel; they are in the history of this file.)

The probe validates each kernel in a child process under a time limit (a barrier-phase bug deadlocks the GPU
rather than crashing), launches it again many times to look for races (an fp16 GEMM with a fixed
accumulation order must give bit-identical results every launch), and only then times the kernels that
passed, in turns (tourkit.bench_interleaved), against torch.matmul (cuBLAS) and the lesson's two schedules.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tourkit  # noqa: E402  (no tilelang work at import)
from sections.gemm_schedules import GemmConfig, gemm_program  # noqa: E402
from sections.hopper.gemm_pingpong import PingPongConfig  # noqa: E402
from sections.hopper.gemm_ws import WsConfig, ws_register_split  # noqa: E402

register_split = ws_register_split

ARCH = "sm_90a"
H200_SMS = 132
SMEM_LIMIT = 227 * 1024  # dynamic shared memory one block may use on Hopper
TOLERANCE = 5e-3  # as gemm_schedules: fp16 output over fp32 accumulation in another order

SHAPES = [(8192, 8192, 8192), (4096, 4096, 4096), (8192, 28672, 4096), (8192, 4096, 14336), (1024, 8192, 8192)]
# Validated only: tails in M, N and K (TMA clips them). The third has enough tiles (31 x 33 of 128x128) for every
# persistent block to take several, so both ping-pong warpgroups take turns on ragged tiles.
ODD_SHAPES = [(1000, 1000, 1000), (1001, 1032, 1000), (3900, 4104, 1000), (5000, 3000, 3000)]

P = H200_SMS
VARIANTS = {
    "ws": WsConfig(128, 256, 64, 4, 256, True),  # one tile per block
    "ws_db": WsConfig(128, 256, 64, 4, 256, True, store_buffers=2),  # one strip stores while the next fills
    "ws_persistent": WsConfig(128, 256, 64, 4, 256, True, persistent=P),
    "ws_persistent_db": WsConfig(128, 256, 64, 4, 256, True, persistent=P, store_buffers=2),
    "ws_persistent_even": WsConfig(128, 256, 64, 4, 256, True, persistent=P, even_rounds=True),
    # panels of 16 tile rows: a wave of 132 tiles spans 16 x 8 tiles, not 8 x 16
    "ws_persistent_p16": WsConfig(128, 256, 64, 4, 256, True, panel=16, persistent=P),
    # the whole tile staged next to a 3-stage ring: the epilogue never waits for a store (the appendix's)
    "ws_persistent_s3_store4": WsConfig(128, 256, 64, 3, 256, True, persistent=P, store_buffers=4),
    "ws_persistent_s3_store4_even": WsConfig(128, 256, 64, 3, 256, True, persistent=P, store_buffers=4,
                                             even_rounds=True),
    # 256-row tiles, each consumer warpgroup owning 128 rows (two m64 wgmma per 16 of K), as cuBLAS's tiles
    "ws_persistent_256x128": WsConfig(256, 128, 64, 4, 256, True, persistent=P),
    # three consumer warpgroups of 64 rows (512 threads)
    "ws_persistent_192x192": WsConfig(192, 192, 64, 4, 384, True, persistent=P),
    # each consumer warpgroup on its own tile, taking turns: one's epilogue under the other's K loop
    "pingpong": PingPongConfig(128, 128, 64, 6, persistent=P),
    "pingpong_192": PingPongConfig(128, 192, 64, 4, persistent=P),  # the fusion lesson's appendix kernel
}
ALL_VARIANTS = list(VARIANTS)

# The lesson's Hopper schedules, timed in the same turns.
TOUR_CONFIGS: dict = {
    "lesson 128x256 s4": GemmConfig(128, 256, 64, 4, 256, True),
    "lesson 256x192 FullCol": GemmConfig(256, 192, 64, 4, 384, True, panel=8, policy="FullCol"),
}


def say(text: str = "") -> None:
    print(text, flush=True)


# ---------------------------------------------------------------------------------------------------------
# Compile-only inspection (no GPU): markers, the main loop, ptxas registers and spills
# ---------------------------------------------------------------------------------------------------------

# What the generated CUDA of every variant must show: name -> pattern.
EXPECTED_MARKERS: dict[str, str] = {
    "wgmma": r"wgmma_ss<",
    "tma_load": r"tma_load\(",
    "mbarrier wait": r"\]\.wait\(",
    "mbarrier arrive": r"\]\.arrive\(\)",
    "one batch in flight": r"wait_wgmma<1>\(\)",
    "final drain": r"wait_wgmma<0>\(\)",
    "producer registers": r"warpgroup_reg_dealloc<\d+>",
    "consumer registers": r"warpgroup_reg_alloc<\d+>",
    "tma_store": r"tma_store\(",
}


def missing_markers(source: str) -> list[str]:
    return [name for name, pattern in EXPECTED_MARKERS.items() if not re.search(pattern, source)]


def consumer_main_loop(source: str) -> str:
    """The consumers' K loop of the generated CUDA: from the wait on the `full` barrier to the final drain and
    the last stage's release (of the first consumer branch, in the ping-pong kernel)."""
    lines = source.splitlines()
    start = next((i for i, l in enumerate(lines) if re.search(r"full\[.*\]\.wait\(", l)), None)
    drain = next((i for i, l in enumerate(lines) if "wait_wgmma<0>" in l), None)
    if start is None or drain is None:
        return "(consumer loop not found)"
    # ... through the release of the last stage after the drain
    end = next((i for i in range(drain, len(lines)) if "empty[" in lines[i]), drain)
    return "\n".join(lines[max(0, start - 1):end + 1])


def main_loop_syncs(source: str) -> int:
    """__syncthreads / named barriers inside the consumers' K loop (there should be none)."""
    return len(re.findall(r"__syncthreads|__sync_thread_partial|bar\.sync", consumer_main_loop(source)))


def ptxas_report(source: str, arch: str = ARCH) -> dict:
    """Compile TileLang's CUDA source to a cubin with nvcc as TileLang does (same flags and includes) plus
    `-Xptxas -v`, and read the registers, stack frame and spills. A kernel that spills is not worth timing."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    nvcc = tourkit.find_nvcc()
    if nvcc is None:
        return {"error": "nvcc not found"}
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = os.path.join(tmp, "kernel.cu"), os.path.join(tmp, "kernel.cubin")
        with open(cu, "w") as f:
            f.write(source)
        cmd = [nvcc, "--cubin", "-O3", "-lineinfo", f"-arch={arch}", "-std=c++20", f"-I{TILELANG_TEMPLATE_PATH}",
               f"-I{CUTLASS_INCLUDE_DIR}", "-Xptxas", "-v", "-o", cubin, cu]
        done = subprocess.run(cmd, capture_output=True, text=True)
    text = done.stdout + done.stderr
    if done.returncode != 0:
        return {"error": text.strip().splitlines()[-1] if text.strip() else f"nvcc exit {done.returncode}"}

    def number(pattern):
        found = re.search(pattern, text)
        return int(found.group(1)) if found else None

    return {"registers": number(r"Used (\d+) registers"), "stack_bytes": number(r"(\d+) bytes stack frame"),
            "spill_stores": number(r"(\d+) bytes spill stores"), "spill_loads": number(r"(\d+) bytes spill loads"),
            # ptxas's own advisories (e.g. C7514: wgmma serialized), not the headers' C++ warnings
            "warnings": [l.strip() for l in text.splitlines() if l.startswith("ptxas") and
                         ("warning" in l or "Performance Loss" in l)]}


def inspect_variant(name: str, shape: tuple[int, int, int] = (8192, 8192, 8192)) -> dict:
    """Everything the compile-only check says about a variant: lowered for sm_90a by TileLang (launch shape,
    shared memory, markers), then compiled by nvcc with ptxas -v (registers, stack, spills)."""
    try:
        rep = tourkit.inspect_kernel(name, program_for(name, *shape), ARCH, nvcc=False)
    except Exception as exc:
        return {"variant": name, "lowered": False, "error": tourkit.one_line(exc)}
    report = {"variant": name, "lowered": True, "threads": rep.threads, "grid": rep.grid,
              "smem_bytes": rep.smem_bytes, "missing_markers": missing_markers(rep.source),
              "main_loop_syncs": main_loop_syncs(rep.source), "source": rep.source}
    report.update(ptxas_report(rep.source))
    return report


def inspect_variants(names: list[str]) -> list[dict]:
    """inspect_variant for several variants at once: lowering runs in C++ and each nvcc is its own process."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(names), os.cpu_count() or 1))) as pool:
        return list(pool.map(inspect_variant, names))


def spilled_bytes(rep: dict) -> int:
    return sum(rep.get(key) or 0 for key in ("spill_stores", "spill_loads", "stack_bytes"))


def list_variants(show_source: bool) -> int:
    """--list: each variant, whether it lowers and compiles for sm_90a, its markers, registers and spills."""
    failed = 0
    for rep in inspect_variants(ALL_VARIANTS):
        name, label = rep["variant"], describe(rep["variant"])
        if not rep["lowered"] or "error" in rep:
            failed += 1
            say(f"{name:16s} FAILED: {rep.get('error')}")
            continue
        spills = spilled_bytes(rep)
        verdict = "compiled" if not rep["missing_markers"] and not spills else "compiled, NOT WORTH A RUN"
        say(f"{name:16s} {verdict}: {label}; {rep['threads']} threads, grid {rep['grid']}, "
            f"shared memory {tourkit.format_bytes(rep['smem_bytes'])}; registers {rep['registers']} (launch bound), "
            f"stack {rep['stack_bytes']} B, spills {rep['spill_stores']}/{rep['spill_loads']} B, "
            f"syncs in the K loop {rep['main_loop_syncs']}, missing markers {rep['missing_markers'] or 'none'}")
        for warning in rep["warnings"]:
            say(f"    ptxas: {warning}")
        if show_source:
            say(tourkit.indent(consumer_main_loop(rep["source"]), "    | "))
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------------------
# Kernels by name: the hand-written variants and the tour's schedules
# ---------------------------------------------------------------------------------------------------------

def kernel_names(variants: list[str]) -> list[str]:
    return list(TOUR_CONFIGS) + variants


def program_of(config, M: int, N: int, K: int, **epilogue):
    """The prim_func of any schedule: the lesson's builder for a GemmConfig, the appendix's for its configs."""
    from sections.hopper import gemm_pingpong, gemm_ws

    if isinstance(config, GemmConfig):
        return gemm_program(M, N, K, config, **epilogue)
    builder = gemm_pingpong if isinstance(config, PingPongConfig) else gemm_ws
    return builder.appendix_program(M, N, K, config, **epilogue)


def program_for(name: str, M: int, N: int, K: int):
    return program_of(TOUR_CONFIGS.get(name) or VARIANTS[name], M, N, K)


def describe(name: str) -> str:
    return VARIANTS[name].label()


def is_persistent(name: str) -> bool:
    return VARIANTS[name].persistent > 0


def compile_kernel(name: str, M: int, N: int, K: int):
    """The kernel for the local GPU, writing into the caller's C: kernel(a, b, c). A hit in TileLang's kernel
    cache after precompile()."""
    import tilelang

    return tilelang.compile(program_for(name, M, N, K), out_idx=None, target="cuda")


def precompile(jobs: list[tuple[str, tuple[int, int, int]]]) -> None:
    """Compile every (kernel, shape) at once in threads (tourkit.compile_many), filling TileLang's on-disk
    kernel cache for the validation child and the timing below."""
    programs = []
    for name, (M, N, K) in jobs:
        try:
            programs.append(program_for(name, M, N, K))
        except Exception as exc:  # reported again, per kernel, by the validation child
            say(f"  {name} {M}x{N}x{K}: cannot build the program: {tourkit.one_line(exc)}")
    tourkit.compile_many(programs, out_idx=None, log=lambda line: say("  " + line))


def shape_text(shape) -> str:
    return "x".join(str(d) for d in shape)


def parse_shape(text: str) -> tuple[int, int, int]:
    dims = tuple(int(d) for d in text.lower().split("x"))
    if len(dims) != 3:
        raise argparse.ArgumentTypeError(f"a shape is MxNxK, not {text!r}")
    return dims


# ---------------------------------------------------------------------------------------------------------
# Never hang the GPU forever: a deadlocked kernel never returns from a synchronize
# ---------------------------------------------------------------------------------------------------------

def wait_for_gpu(what: str, seconds: float) -> None:
    """Wait for the work queued so far by polling a CUDA event (the polling thread keeps running whatever a
    hung kernel does); past `seconds`, report a probable deadlock and leave the process at once."""
    import torch

    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            print(json.dumps({"event": "deadlock", "what": what, "seconds": seconds}), flush=True)
            os._exit(3)
        time.sleep(0.002)


class Watchdog:
    """Leave the process (os._exit) when the block inside runs past `seconds`: around timing, where
    bench_ms synchronizes by itself. torch's synchronize releases the GIL, so this thread still runs."""

    def __init__(self, what: str, seconds: float):
        self.what, self.seconds, self.done = what, seconds, threading.Event()

    def _watch(self) -> None:
        if not self.done.wait(self.seconds):
            say(f"DEADLOCK? {self.what} still running after {self.seconds:.0f} s; leaving the process")
            os._exit(3)

    def __enter__(self):
        threading.Thread(target=self._watch, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        return False


# ---------------------------------------------------------------------------------------------------------
# Validation, in a child process: a deadlock or a fault there cannot take the timing process with it
# ---------------------------------------------------------------------------------------------------------

RACE_LAUNCHES = 20  # repeated launches that must reproduce the first result bit for bit
FIRST_LAUNCH_S = 30.0  # far beyond any of these GEMMs (a 16384^3 one takes ~15 ms)


def child_validate(jobs: list[tuple[str, tuple[int, int, int]]]) -> int:
    """Validate each (kernel, shape) job, printing one JSON line as it starts and one with its result. Stops
    at the first kernel that raises (a fault poisons the CUDA context); the parent starts a new child."""
    import torch

    from sections.gemm_schedules import reference

    inputs: dict = {}
    for name, shape in jobs:
        print(json.dumps({"event": "start", "kernel": name, "shape": shape}), flush=True)
        M, N, K = shape
        try:
            kernel = compile_kernel(name, M, N, K)
            if shape not in inputs:
                inputs.clear()
                a = tourkit.random_tensor((M, K), torch.float16, seed=1)
                b = tourkit.random_tensor((K, N), torch.float16, seed=2)
                inputs[shape] = (a, b, reference(a, b))
            a, b, ref = inputs[shape]
            c = tourkit.poison_(torch.empty((M, N), dtype=torch.float16, device="cuda"))
            kernel(a, b, c)
            wait_for_gpu(f"{name} {shape_text(shape)} first launch", FIRST_LAUNCH_S)
            error = tourkit.relative_error(c, ref)
            differing = None
            if error <= TOLERANCE:
                differing = count_differing_launches(kernel, a, b, c, f"{name} {shape_text(shape)}")
        except Exception as exc:
            print(json.dumps({"event": "result", "kernel": name, "shape": shape, "error": tourkit.one_line(exc)}),
                  flush=True)
            return 4
        print(json.dumps({"event": "result", "kernel": name, "shape": shape, "rel_error": error,
                          "differing_launches": differing}), flush=True)
    return 0


def count_differing_launches(kernel, a, b, first, what: str) -> int:
    """Launch the kernel RACE_LAUNCHES more times into a poisoned output; count the launches whose result
    differs from the first in any bit. A barrier-phase race shows up here even when one result looks right."""
    import torch

    expected = first.clone()
    c = torch.empty_like(first)
    differing = torch.zeros((), dtype=torch.int64, device="cuda")
    for _ in range(RACE_LAUNCHES):
        tourkit.poison_(c)
        kernel(a, b, c)
        differing += (c.view(torch.int16) != expected.view(torch.int16)).any().to(torch.int64)
    wait_for_gpu(f"{what} repeated launches", FIRST_LAUNCH_S + RACE_LAUNCHES)
    return int(differing.item())


def validate_in_children(jobs: list[tuple[str, tuple[int, int, int]]]) -> dict:
    """Run child_validate over the jobs; when a child dies (deadlock, fault, timeout), record why for the job
    it was on and start another child for the rest. Returns {(kernel, shape): result dict}."""
    results: dict = {}
    remaining = list(jobs)
    while remaining:
        spec = ";".join(f"{name}@{shape_text(shape)}" for name, shape in remaining)
        limit = 120 + 30 * len(remaining)  # compiles are cache hits; the child's own watchdog fires first
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child-validate", spec],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=limit)
            timed_out = False
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
        current = None
        for line in out.splitlines():
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            key = (event.get("kernel"), tuple(event["shape"])) if "shape" in event else None
            if event["event"] == "start":
                current = key
            elif event["event"] == "result":
                results[key] = event
                current = None
            elif event["event"] == "deadlock" and current is not None:
                results[current] = {"deadlock": True, "error": f"deadlock? ({event['what']} did not finish "
                                                                f"in {event['seconds']:.0f} s)"}
                current = None
        if current is not None:  # the child died during this job without saying why
            why = f"deadlock? (child killed after {limit} s)" if timed_out else \
                f"child exited {proc.returncode}: {(err.strip().splitlines() or ['?'])[-1][:200]}"
            results[current] = {"deadlock": timed_out, "error": why}
        before = len(remaining)
        remaining = [job for job in remaining if job not in results]
        if len(remaining) == before:  # the child did nothing at all: do not loop forever
            for job in remaining:
                results[job] = {"error": f"child exited {proc.returncode}: {err.strip()[-300:]}"}
            break
    return results


def passed(result: dict) -> bool:
    return result.get("rel_error", float("inf")) <= TOLERANCE and result.get("differing_launches") == 0


def verdict(result: dict) -> str:
    if "error" in result:
        return "FAILED: " + result["error"]
    text = f"rel. error {tourkit.format_error(result['rel_error'])}"
    if result["rel_error"] > TOLERANCE:
        return f"FAILED: {text} (tolerance {TOLERANCE:.0e})"
    if result.get("differing_launches"):
        return f"FAILED: {text}, but {result['differing_launches']} of {RACE_LAUNCHES} repeated launches differ (a race)"
    return f"ok: {text}, {RACE_LAUNCHES} repeated launches bit-identical"


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------

def time_shape(shape, names: list[str], rounds: int) -> dict[str, float]:
    """Median ms of torch.matmul (cuBLAS) and each validated kernel at one shape, taking turns."""
    import torch

    M, N, K = shape
    a = tourkit.random_tensor((M, K), torch.float16, seed=1)
    b = tourkit.random_tensor((K, N), torch.float16, seed=2)
    c_torch = torch.empty((M, N), dtype=torch.float16, device="cuda")
    contenders = {"cuBLAS (torch.matmul)": lambda: torch.matmul(a, b, out=c_torch)}
    for name in names:
        kernel, c = compile_kernel(name, M, N, K), torch.empty((M, N), dtype=torch.float16, device="cuda")
        contenders[name] = lambda kernel=kernel, c=c: kernel(a, b, c)
    with Watchdog(f"timing at {shape_text(shape)}", 300):
        return tourkit.bench_interleaved(contenders, rounds=rounds)


def print_shape_table(shape, times: dict[str, float], checks: dict[str, str]) -> None:
    M, N, K = shape
    flops = 2 * M * N * K
    base = times["cuBLAS (torch.matmul)"]
    rows = []
    for name, ms in sorted(times.items(), key=lambda item: item[1]):
        rows.append([name, f"{ms:.3f}", f"{tourkit.tflops(flops, ms):.0f}", f"{tourkit.speedup(base, ms):.3f}",
                     checks.get(name, "reference")])
    say(tourkit.format_table(["kernel", "ms", "TFLOP/s", "vs cuBLAS", "check"], rows))


# ---------------------------------------------------------------------------------------------------------
# The probe
# ---------------------------------------------------------------------------------------------------------

def usable_variants(names: list[str]) -> list[str]:
    """The variants worth a GPU run: they lower, carry the expected markers, and ptxas neither spills nor
    keeps a stack frame (checked at 8192^3; the other shapes differ only in constants)."""
    usable = []
    for rep in inspect_variants(names):
        name = rep["variant"]
        if not rep["lowered"]:
            say(f"  {name}: does not lower for {ARCH}: {rep['error']} - skipped")
        elif rep["missing_markers"] or spilled_bytes(rep):
            say(f"  {name}: missing markers {rep['missing_markers']}, spills/stack {spilled_bytes(rep)} B - skipped")
        elif "error" in rep:  # ptxas could not run (no nvcc?): TileLang's own compile decides below
            say(f"  {name}: lowers; no ptxas report ({rep['error']})")
            usable.append(name)
        else:
            say(f"  {name}: compiles; registers {rep['registers']} (launch bound), no spills, "
                f"{rep['main_loop_syncs']} syncs in the K loop, shared memory {tourkit.format_bytes(rep['smem_bytes'])}")
            usable.append(name)
    return usable


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="8192^3 only")
    ap.add_argument("--shapes", type=lambda t: [parse_shape(s) for s in t.split(",")], default=None,
                    help="comma-separated MxNxK list (default: the five target shapes)")
    ap.add_argument("--variants", type=lambda t: t.split(","), default=list(ALL_VARIANTS),
                    help=f"comma-separated, of {', '.join(ALL_VARIANTS)}")
    ap.add_argument("--rounds", type=int, default=4, help="turns per contender (tourkit.bench_interleaved)")
    ap.add_argument("--no-odd", action="store_true", help="skip the odd-size validation (1000x1000x1000 ...)")
    ap.add_argument("--list", action="store_true", help="the variants and whether each compiles for sm_90a "
                    "(no GPU needed), with ptxas registers and spills")
    ap.add_argument("--source", action="store_true", help="with --list: print each variant's consumer K loop")
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for gemm_ws_probe.json (default $OUT)")
    ap.add_argument("--child-validate", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [v for v in args.variants if v not in ALL_VARIANTS]
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {ALL_VARIANTS}")
    if args.shapes is None:
        args.shapes = [SHAPES[0]] if args.quick else SHAPES
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child_validate:
        jobs = [(item.split("@")[0], parse_shape(item.split("@")[1])) for item in args.child_validate.split(";")]
        return child_validate(jobs)
    if args.list:
        return list_variants(args.source)

    import torch

    if not torch.cuda.is_available():
        say("no CUDA GPU here: use --list to check that the variants compile for sm_90a")
        return 2
    say(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; shapes {[shape_text(s) for s in args.shapes]}")
    say("compile-only check (ptxas):")
    variants = usable_variants(args.variants)

    names = kernel_names(variants)
    jobs = [(name, shape) for shape in args.shapes for name in names]
    if not args.no_odd:
        jobs += [(name, shape) for shape in ODD_SHAPES for name in variants]
    say(f"compiling {len(jobs)} kernels:")
    precompile(jobs)

    say("validating each kernel in a child process (first launch under a watchdog, then "
        f"{RACE_LAUNCHES} launches that must agree bit for bit):")
    results = validate_in_children(jobs)
    for (name, shape) in jobs:
        say(f"  {name:22s} {shape_text(shape):18s} {verdict(results[(name, shape)])}")

    record = {"device": torch.cuda.get_device_name(), "variants": variants, "shapes": {}}
    for shape in args.shapes:
        good = [name for name in names if passed(results[(name, shape)])]
        checks = {name: verdict(results[(name, shape)]).split(",")[0] for name in good}
        say(f"\n{shape_text(shape)}: timing cuBLAS and {len(good)} kernels in {args.rounds} turns")
        times = time_shape(shape, good, args.rounds)
        print_shape_table(shape, times, checks)
        record["shapes"][shape_text(shape)] = {"ms": times, "validation": {
            name: results[(name, shape)] for name in names}}
        save(record, args.out)  # after every shape: a later hang loses nothing measured so far

    print_summary(record)
    failed = [job for job in jobs if job[0] in variants and not passed(results[job])]
    return 1 if failed else 0


def save(record: dict, folder: str | None) -> None:
    if folder:
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "gemm_ws_probe.json"), "w") as f:
            json.dump(record, f, indent=1, default=str)


def print_summary(record: dict) -> None:
    """One line per shape: every contender's ratio to cuBLAS (higher is faster)."""
    columns = list(TOUR_CONFIGS) + list(record["variants"])
    rows = []
    for shape, entry in record["shapes"].items():
        base = entry["ms"]["cuBLAS (torch.matmul)"]
        rows.append([shape] + [f"{base / entry['ms'][c]:.3f}" if c in entry["ms"] else "-" for c in columns])
    say("\nvs cuBLAS (>1 is faster), per shape:")
    say(tourkit.format_table(["shape"] + columns, rows))


if __name__ == "__main__":
    sys.exit(main())
