"""Probe for the softmax section on small and odd shapes: sweep kernel plans for one (M, N), validate each, then
time the valid ones in turns with torch.softmax and a device copy of the same bytes.

    python bench/softmax_probe.py [--shape 4096x1823] [--rounds 6] [--flush write|read] [--out DIR]
    python bench/softmax_probe.py --shapes bench            # the section's BENCH_SHAPES (or --shapes 4096x1823,2048x1823)
    python bench/softmax_probe.py --compile-only sm_90a     # no GPU: lower + nvcc every plan, smem / registers / waves
    (on the device: bash .device/run python bench/softmax_probe.py --out $OUT)

Why: a 15 µs problem such as 4096x1823 fp16 (30 MB moved) is latency-bound: every block loads, then reduces,
then stores, and a grid that does not fit in one wave leaves a tail; the section's plans for such shapes
(choose_plan) come from this sweep. The sweep (candidate_plans) holds, for the shape:

* staged (the section's kernel): rows_per_block r0·{1,2,3,4} (r0 = 8 for odd widths: a 16-byte aligned group)
  x 128/256/512/1024 threads, where a thread holds 8..128 floats (on Hopper TMA copies where the rows divide M,
  plain masked copies where they do not); the same with plain copies instead of TMA; and with
  __launch_bounds__' min-blocks-per-SM set so the grid fits in one wave
  (registers capped at 64K / (blocks·threads)) where that cap still holds a thread's floats;
* registers: rows read straight from global memory (masked single halves for odd widths), 1/2/4/8 rows,
  128..1024 threads (8..64 floats a thread), and their one-wave min-blocks variants;
* online / online-per-thread for rows longer than 8192 (two-pass over a row in shared memory: long_rows_chunked
  below, a block-wide max and sum per chunk, and the section's long_rows_online, per-thread (max, sum) pairs
  merged once per row);
* the section's choose_plan() pick, marked "<- section".

Plans whose shared memory exceeds 227 KiB (or the arch's opt-in maximum) are not built. All plans compile at once
(tourkit.compile_many), then each is validated against torch.softmax in float32 on fresh random inputs (tolerance
5e-3, as the section) and a second launch must give the same bits. The valid
plans, torch.softmax and y.copy_(x) (the same bytes read and written) are then timed with
tourkit.bench_interleaved (L2 flushed before each call). Prints a table sorted by time, writes softmax_probe.json to
--out. Each kernel also shows its registers per thread, blocks per SM (registers, shared memory, threads) and
waves: the grid over SMs x blocks per SM.
"""

import argparse
import json
import math
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DEFAULT_SHAPE = (4096, 1823)
TOLERANCE = 5e-3  # as sections/softmax.check_shape
SMEM_LIMIT = 227 * 1024  # bytes of shared memory one block may use (H200 opt-in maximum)
STAGED_PER_THREAD = (8, 128)  # floats a thread holds in the staged kernel (min, max)
REGISTER_PER_THREAD = (8, 64)  # ... and in the register kernel
MIN_BLOCKS_SPARE = 4  # a min-blocks variant needs a register cap of at least floats per thread + this
WATCHDOG_S = 60  # one plan's validation: seconds before it counts as hung

# Per architecture: SMs of the reference GPU (for waves when no GPU is present), resident threads and blocks per SM.
REFERENCE_SMS = {"sm_90a": 132, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_75": 40}
THREADS_PER_SM = {"sm_90a": 2048, "sm_80": 2048, "sm_86": 1536, "sm_89": 1536, "sm_75": 1024}
BLOCKS_PER_SM = {"sm_90a": 32, "sm_80": 32, "sm_86": 16, "sm_89": 24, "sm_75": 16}
REGISTERS_PER_SM = 65536

THREADS = (128, 256, 512, 1024)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    kind: str  # "staged" | "registers" | "online" | "online-per-thread"
    rows: int  # rows per block (R); the chunk length for "online"; 1 for "online-per-thread"
    threads: int
    bulk: bool = True  # staged / online: TMA bulk copies (Hopper) or plain copies
    min_blocks: int = 0  # __launch_bounds__' min blocks per SM (0: not set)
    chosen: bool = field(default=False, compare=False)  # the section's choose_plan() pick

    @property
    def flat(self) -> bool:
        return self.kind == "staged"

    def label(self) -> str:
        if self.kind == "online":
            text = f"online chunk{self.rows} T{self.threads}"
        elif self.kind == "online-per-thread":
            text = f"online-per-thread T{self.threads}"
        else:
            text = f"{self.kind} R{self.rows} T{self.threads}"
        if self.kind in ("staged", "online", "online-per-thread") and not self.bulk:
            text += " noTMA"
        if self.min_blocks:
            text += f" mb{self.min_blocks}"
        return text

    def describe(self, M: int, N: int) -> str:
        if self.kind == "online-per-thread":
            text = f"online two-pass over a row in shared memory, per-thread (max, sum) merged once, {self.threads} threads"
        elif self.kind == "online":
            text = f"online two-pass over a row in shared memory, chunks of {self.rows}, {self.threads} threads"
        else:
            where = {"staged": "staged" + (" (TMA)" if self.bulk else " (plain copies)"), "registers": "registers"}
            text = f"{where[self.kind]}, {self.rows} row{'s' if self.rows > 1 else ''}/block, {self.threads} threads"
        if self.min_blocks:
            text += f", >= {self.min_blocks} blocks/SM"
        return text + ("  <- section" if self.chosen else "")

    def grid(self, M: int) -> int:
        if self.kind in ("online", "online-per-thread"):
            return M
        return -(-M // self.rows)

    def smem_estimate(self, N: int) -> int:
        """Bytes of the shared buffers (without the barriers and reduction scratch: SMEM_MARGIN)."""
        if self.kind == "staged":
            return self.rows * N * 2
        if self.kind in ("online", "online-per-thread"):
            return N * 2
        return 0


SMEM_MARGIN = 1024  # barriers and the reductions' shared scratch


def per_thread(plan: Plan, N: int) -> int:
    """Floats of the row fragment one thread holds."""
    from sections.softmax import staged_vector_width

    if plan.kind in ("online", "online-per-thread"):
        return (plan.rows if plan.kind == "online" else 8 * plan.threads) // plan.threads
    per_row = plan.threads // plan.rows
    if plan.kind == "registers":
        return N // per_row if N % 8 == 0 else -(-N // per_row)
    vec = staged_vector_width(N, per_row)
    return -(-N // (per_row * vec)) * vec


def long_rows_chunked(M: int, N: int, chunk: int, threads: int, dtype: str = "float16", bulk_copy: bool = True):
    """The section's earlier long-row kernel: one row a block, staged whole in shared memory, then the online
    two-pass over chunks with a block-wide max and sum per chunk (the section's long_rows_online keeps a running
    (max, sum) per thread instead and merges them once; on the H200 they tie at 8192x32768, and the section's
    is ahead where few rows leave SMs idle, 512x65536)."""
    import tilelang.language as T

    from sections.softmax import LOG2E

    if N % chunk:
        raise ValueError(f"long-row softmax: width {N} is not a multiple of the chunk {chunk}")
    steps = N // chunk

    @T.prim_func
    def softmax_long_rows_chunked(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M, threads=threads) as bx:
            row = T.alloc_shared((N,), dtype)
            x = T.alloc_fragment((chunk,), "float32")
            chunk_max = T.alloc_fragment((1,), "float32")
            chunk_sum = T.alloc_fragment((1,), "float32")
            run_max = T.alloc_fragment((1,), "float32")
            run_sum = T.alloc_fragment((1,), "float32")
            if bulk_copy:  # Hopper: one TMA bulk copy, completion tracked by an mbarrier
                T.copy(X[bx, 0:N], row, prefer_instruction="tma")
            else:
                T.copy(X[bx, 0:N], row)
            T.fill(run_max, -T.infinity("float32"))
            T.fill(run_sum, 0.0)
            for c in T.serial(steps):
                for j in T.Parallel(chunk):
                    x[j] = T.cast(row[c * chunk + j], "float32") * LOG2E
                T.reduce_max(x, chunk_max, dim=0)
                for j in T.Parallel(chunk):
                    x[j] = T.exp2(x[j] - T.max(chunk_max[0], run_max[0]))
                T.reduce_sum(x, chunk_sum, dim=0)
                for i in T.Parallel(1):
                    run_sum[i] = run_sum[i] * T.exp2(run_max[i] - T.max(chunk_max[i], run_max[i])) + chunk_sum[i]
                    run_max[i] = T.max(chunk_max[i], run_max[i])
            for i in T.Parallel(1):
                run_sum[i] = 1.0 / run_sum[i]
            for c in T.serial(steps):
                for j in T.Parallel(chunk):
                    Y[bx, c * chunk + j] = T.cast(
                        T.exp2(T.cast(row[c * chunk + j], "float32") * LOG2E - run_max[0]) * run_sum[0], dtype)

    return softmax_long_rows_chunked



def build(plan: Plan, M: int, N: int):
    """The plan's prim_func, from the section's builders (the section's pick builds exactly as build() there)."""
    from sections import softmax as S

    if plan.kind == "registers":
        return S.rows_in_registers(M, N, plan.rows, plan.threads, min_blocks_per_sm=plan.min_blocks)
    if plan.kind == "staged":
        return S.rows_staged_in_shared(M, N, plan.rows, plan.threads, bulk_copy=plan.bulk,
                                       min_blocks_per_sm=plan.min_blocks)
    if plan.kind == "online":
        return long_rows_chunked(M, N, plan.rows, plan.threads, bulk_copy=plan.bulk)
    if plan.kind == "online-per-thread":  # the section's long-row kernel, the whole row staged, 8 elements a thread
        return S.long_rows_online(M, N, 8, plan.threads, staged=N, bulk_copy=plan.bulk)
    raise ValueError(f"unknown plan kind {plan.kind!r}")


def section_plan(M: int, N: int, family: str, smem_budget: int) -> "Plan | None":
    from sections import softmax as S

    try:
        pick = S.choose_plan(M, N, smem_budget, family)
    except ValueError:
        return None
    if pick.kind == "online":  # long rows: bench/softmax_shapes_probe.py sweeps the section's kernel for those
        return None
    copies = pick.kind in ("staged", "online", "online-per-thread")  # the kernels with a TMA / plain-copy choice
    return Plan(pick.kind, pick.rows_per_block, pick.threads, bulk=family == "hopper" or not copies,
                min_blocks=pick.min_blocks_per_sm, chosen=True)


def _power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def valid(plan: Plan, M: int, N: int, smem_limit: int) -> bool:
    """The builders' own conditions, a thread's share of the row within bounds, the shared memory within the
    limit (the probe never builds a plan that fails here)."""
    if plan.smem_estimate(N) + SMEM_MARGIN > smem_limit or plan.threads > 1024:
        return False
    if plan.kind in ("online", "online-per-thread"):
        if N % 8 or N <= 8192:
            return False
        if plan.kind == "online":
            return N % plan.rows == 0 and plan.rows % (8 * plan.threads) == 0
        return N % (8 * plan.threads) == 0
    R, T = plan.rows, plan.threads
    if T % R or not _power_of_two(T // R) or M % R and plan.kind == "staged" and plan.bulk:
        return False  # a partial last block: the register kernel and plain copies mask it, a bulk copy cannot
    floats = per_thread(plan, N)
    if plan.kind == "registers":
        if N % 8 == 0 and N % ((T // R) * 8):
            return False  # aligned rows: each thread's share must be whole 16-byte vectors
        return REGISTER_PER_THREAD[0] <= floats <= REGISTER_PER_THREAD[1]
    if (R * N) % 8:
        return False  # a group of rows must start on a 16-byte boundary
    if not STAGED_PER_THREAD[0] <= floats <= STAGED_PER_THREAD[1]:
        return False
    return True


def one_wave_min_blocks(plan: Plan, M: int, N: int, sms: int, arch: str) -> int:
    """The min-blocks-per-SM that lets the whole grid be resident at once, or 0 when that is 1 or its register cap
    is 255 or more (nothing to ask), more than the threads or shared memory allow, or a register cap below the
    thread's floats + MIN_BLOCKS_SPARE."""
    need = -(-plan.grid(M) // sms)
    if need < 2 or need * plan.threads > THREADS_PER_SM.get(arch, 2048):
        return 0
    smem = plan.smem_estimate(N) + SMEM_MARGIN if plan.smem_estimate(N) else 0
    if smem and need * (smem + 1024) > smem_per_sm(arch):
        return 0
    cap = REGISTERS_PER_SM // (need * plan.threads)  # at 255 or more nvcc's own limit binds: nothing to ask
    return need if per_thread(plan, N) + MIN_BLOCKS_SPARE <= cap < 255 else 0


def candidate_plans(M: int, N: int, family: str = "hopper", sms: int = 132, arch: str = "sm_90a",
                    smem_limit: int = SMEM_LIMIT) -> list:
    """Every plan the probe builds for (M, N) on this GPU family, the section's pick first (marked chosen)."""
    import dataclasses

    hopper = family == "hopper"
    r0 = 8 // math.gcd(N, 8)  # rows in the smallest group that starts on a 16-byte boundary
    plans = []
    pick = section_plan(M, N, family, smem_limit)
    if pick is not None:
        plans.append(pick)

    def add(plan):
        if valid(plan, M, N, smem_limit) and plan not in plans:
            plans.append(plan)

    # Hopper stages with bulk copies; where R does not divide M (its last block partial), with plain copies
    staged = [Plan("staged", R, T, bulk=hopper and M % R == 0) for R in (r0, 2 * r0, 3 * r0, 4 * r0) for T in THREADS]
    registers = [Plan("registers", R, T) for R in (1, 2, 4, 8) for T in THREADS]
    for plan in staged + registers:
        add(plan)
    if pick is not None and pick.min_blocks:  # the pick's register cap against none and one block fewer
        for blocks in (0, pick.min_blocks - 1):
            add(dataclasses.replace(pick, min_blocks=blocks, chosen=False))
    for plan in [p for p in plans if p.kind in ("staged", "registers") and not p.min_blocks]:
        need = one_wave_min_blocks(plan, M, N, sms, arch)
        if need:
            add(dataclasses.replace(plan, min_blocks=need, chosen=False))
    if hopper:  # the section's staged kernel with plain copies instead of TMA
        base = pick if pick is not None and pick.kind == "staged" else Plan("staged", r0, 256)
        add(dataclasses.replace(base, bulk=False, chosen=False))
    for chunk, T in ((8192, 512), (8192, 1024), (4096, 256), (4096, 512)):
        add(Plan("online", chunk, T, bulk=hopper))
    for T in (256, 512, 1024):
        add(Plan("online-per-thread", 1, T, bulk=hopper))
    return plans


# ---------------------------------------------------------------------------------------------------------
# Resources: registers from the cubin, blocks per SM, waves
# ---------------------------------------------------------------------------------------------------------


def smem_per_sm(arch: str) -> int:
    import tourkit

    return tourkit.ARCH_SPECS[arch].smem_per_block_optin + 1024


def cubin_resources(data: bytes) -> dict:
    """{kernel symbol: (registers per thread, stack frame bytes)} from a cubin's .nv.info section (EIATTR_REGCOUNT
    0x2f, EIATTR_FRAME_SIZE 0x11); {} when the bytes are not a 64-bit ELF."""
    import struct

    data = bytes(data)
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return {}
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_at = headers[shstrndx][4]

    def name(offset, base=names_at):
        return data[base + offset:data.index(b"\0", base + offset)].decode()

    symtab = next((h for h in headers if h[1] == 2), None)
    symbols = []
    if symtab is not None:
        strtab = headers[symtab[6]]
        for i in range(symtab[5] // 24):
            st_name, = struct.unpack_from("<I", data, symtab[4] + 24 * i)
            symbols.append(name(st_name, strtab[4]))
    regs, frame = {}, {}
    for h in headers:
        if name(h[0]) != ".nv.info":
            continue
        body, at = data[h[4]:h[4] + h[5]], 0
        while at + 4 <= len(body):
            fmt, attr = body[at], body[at + 1]
            if fmt == 4:  # EIFMT_SVAL: u16 size, then the value
                size, = struct.unpack_from("<H", body, at + 2)
                value = body[at + 4:at + 4 + size]
                at += 4 + size
                if attr in (0x2f, 0x11) and size == 8:
                    sym, amount = struct.unpack_from("<II", value)
                    key = symbols[sym] if sym < len(symbols) else str(sym)
                    (regs if attr == 0x2f else frame)[key] = amount
            else:  # EIFMT_NVAL / BVAL / HVAL: four bytes in all
                at += 4
    return {k: (v, frame.get(k, 0)) for k, v in regs.items()}


def kernel_resources(source: str, arch: str) -> dict:
    """Registers and stack bytes of the kernel in `source` as nvcc builds it for `arch`, from TileLang's CUDA
    binary cache (a hit right after the kernel was compiled for that arch; otherwise nvcc runs once more).
    {} when they cannot be read."""
    try:
        import tourkit
        from tilelang.cuda.backend import tilelang_callback_cuda_compile

        found = cubin_resources(tilelang_callback_cuda_compile(source, tourkit.cuda_target(arch), {}))
    except Exception:
        return {}
    if len(found) != 1:
        return {}
    regs, stack = next(iter(found.values()))
    return {"regs": regs, "stack": stack}


def blocks_per_sm(threads: int, regs: "int | None", smem: int, arch: str) -> "int | None":
    """Resident blocks per SM: registers (allocated per warp in units of 256, per quarter of the SM), shared memory
    (+1 KiB reserved per block), threads, the block limit."""
    if not regs:
        return None
    warps = -(-threads // 32)
    per_warp = -(-regs * 32 // 256) * 256
    by_regs = (REGISTERS_PER_SM // 4 // per_warp) * 4 // warps
    by_smem = smem_per_sm(arch) // (smem + 1024) if smem else 10 ** 9
    return max(0, min(by_regs, by_smem, THREADS_PER_SM.get(arch, 2048) // threads, BLOCKS_PER_SM.get(arch, 32)))


def occupancy(plan: Plan, M: int, resources: dict, smem: int, arch: str, sms: int) -> dict:
    per_sm = blocks_per_sm(plan.threads, resources.get("regs"), smem, arch)
    waves = plan.grid(M) / (sms * per_sm) if per_sm else None
    return {"blocks_per_sm": per_sm, "waves": waves, "grid": plan.grid(M)}


def _fmt(value, spec="", none="?"):
    return none if value is None else format(value, spec)


# ---------------------------------------------------------------------------------------------------------
# Compile only (no GPU)
# ---------------------------------------------------------------------------------------------------------


def compile_only(M: int, N: int, arch: str, sms: "int | None" = None, nvcc: bool = True) -> list:
    """Lower every plan for `arch` and compile it with nvcc (when present); one row per plan: label, smem bytes,
    registers, stack, blocks per SM, waves, status ("compiled", "lowered" without nvcc, or "failed: ...")."""
    import tourkit

    spec = tourkit.ARCH_SPECS[tourkit.check_arch(arch)]
    sms = sms or REFERENCE_SMS.get(arch, 132)
    limit = min(SMEM_LIMIT, spec.smem_per_block_optin)
    plans = candidate_plans(M, N, spec.family, sms, arch, limit)
    have_nvcc = nvcc and tourkit.find_nvcc() is not None

    def one(plan):
        row = {"label": plan.label(), "describe": plan.describe(M, N), "chosen": plan.chosen, "plan": asdict(plan)}
        try:
            rep = tourkit.inspect_kernel(plan.label(), build(plan, M, N), arch, nvcc=have_nvcc)
        except Exception as exc:
            row.update(status=f"failed: {tourkit.one_line(exc)}", compiled=False)
            return row
        status = rep.nvcc if have_nvcc else "lowered"
        row.update(smem=rep.smem_bytes, threads=rep.threads, launch_grid=list(rep.grid), status=status)
        row["compiled"] = status in ("compiled", "lowered")
        if rep.smem_bytes > limit:
            row.update(status=f"failed: {rep.smem_bytes} bytes of shared memory > {limit}", compiled=False)
        if status == "compiled":
            row.update(kernel_resources(rep.source, arch))
            row.update(occupancy(plan, M, row, rep.smem_bytes, arch, sms))
        return row

    with ThreadPoolExecutor(max_workers=max(1, min(len(plans), os.cpu_count() or 1))) as pool:
        return list(pool.map(one, plans))


def print_compile_only(M: int, N: int, arch: str, rows: list, sms: int) -> None:
    import tourkit

    table = [[r["describe"], tourkit.format_bytes(r["smem"]) if "smem" in r else "-", _fmt(r.get("regs")),
              _fmt(r.get("stack")), _fmt(r.get("blocks_per_sm")), _fmt(r.get("waves"), ".2f"),
              r["status"][:90]] for r in rows]
    log(f"\nsoftmax {M}x{N} fp16 for {arch}: {len(rows)} plans (waves for {sms} SMs)")
    log(tourkit.format_table(["plan", "smem", "regs", "stack", "blocks/SM", "waves", "nvcc"], table))


# ---------------------------------------------------------------------------------------------------------
# Validation (normally in a child process: a fault or a hang takes only the child down)
# ---------------------------------------------------------------------------------------------------------


def launcher(plan: Plan, kernel, x, y):
    if plan.flat:
        xf, yf = x.view(-1), y.view(-1)
        return lambda: kernel(xf, yf)
    return lambda: kernel(x, y)


def validate_plan(plan: Plan, kernel, M: int, N: int) -> dict:
    """Fresh random inputs, the output poisoned, compared with torch.softmax in float32; then a second launch on
    the same inputs must give the same bits (a race shows here)."""
    import torch
    import tourkit
    from sections import softmax as S

    x = tourkit.random_tensor((M, N), torch.float16, scale=3.0)
    y = torch.empty_like(x)
    launch = launcher(plan, kernel, x, y)
    check = tourkit.validate(f"softmax {M}x{N} [{plan.label()}]", launch, y, S.reference(x), TOLERANCE)
    first = y.clone()
    launch()
    torch.cuda.synchronize()
    repeatable = bool(torch.equal(first, y))
    return {"rel_error": check.rel_error, "ok": check.passed and repeatable, "repeatable": repeatable,
            "line": check.line() + ("" if repeatable else " NOT REPEATABLE")}


def validate_here(M: int, N: int, plans: list, kernels: dict) -> dict:
    """Each plan in turn: a hang ends the probe after WATCHDOG_S, a fault spoils the rest (the section's kernels
    with other parameters: none has faulted since staged_vector_width)."""
    import tourkit

    results = {}
    for plan in plans:
        watchdog = threading.Timer(WATCHDOG_S, lambda: (log(f"DEADLOCK? {plan.label()}; exiting"), os._exit(3)))
        watchdog.start()
        try:
            results[plan.label()] = validate_plan(plan, kernels[plan.label()], M, N)
        except Exception as exc:
            results[plan.label()] = {"ok": False, "error": tourkit.one_line(exc)}
        finally:
            watchdog.cancel()
    return results


# ---------------------------------------------------------------------------------------------------------
# One shape on the GPU
# ---------------------------------------------------------------------------------------------------------


def run_shape(M: int, N: int, device, rounds: int, flush_mode: str = "write") -> dict:
    import tilelang
    import torch
    import tourkit

    started = time.time()
    arch = device.arch
    plans = candidate_plans(M, N, device.family, device.sm_count, arch, min(SMEM_LIMIT, device.smem_per_block_optin))
    log(f"\n== softmax {M}x{N} fp16: {len(plans)} plans on {device.name} ({device.sm_count} SMs)")
    record = {"shape": [M, N], "plans": [], "dropped": []}
    built = []
    for plan in plans:
        try:
            built.append((plan, build(plan, M, N)))
        except Exception as exc:
            log(f"  DROP {plan.label()}: build: {tourkit.one_line(exc)}")
            record["dropped"].append({"label": plan.label(), "error": "build: " + tourkit.one_line(exc)})
    kernels = tourkit.compile_many([func for _, func in built], log=lambda s: log("  " + s))
    compiled = []
    for (plan, func), kernel in zip(built, kernels):
        if kernel is None:
            try:  # compile_many keeps errors quiet: compile once more for the message
                tilelang.compile(func, out_idx=None, target="cuda")
                error = "compile: failed in parallel, passed alone"
            except Exception as exc:
                error = "compile: " + tourkit.one_line(exc)
            log(f"  DROP {plan.label()}: {error}")
            record["dropped"].append({"label": plan.label(), "error": error})
            continue
        compiled.append((plan, kernel))
    # Registers from TileLang's binary cache (a hit unless "cuda" meant another arch), read while the plans validate.
    pool = ThreadPoolExecutor(max_workers=max(1, min(len(compiled), os.cpu_count() or 1)))
    pending_resources = [pool.submit(kernel_resources, kernel.get_kernel_source(), arch) for _, kernel in compiled]
    by_label = {plan.label(): kernel for plan, kernel in compiled}
    t = time.time()
    plans_ok = [plan for plan, _ in compiled]
    checks = validate_here(M, N, plans_ok, by_label)
    log(f"  validated {len(plans_ok)} plans in {time.time() - t:.1f} s")
    resources = [f.result() for f in pending_resources]
    pool.shutdown()

    x = tourkit.random_tensor((M, N), torch.float16, scale=3.0)
    y = torch.empty_like(x)
    ref = torch.softmax(x.float(), dim=-1)
    torch_error = tourkit.relative_error(torch.softmax(x, dim=-1), ref)
    del ref
    contenders, infos = {}, {}
    for (plan, kernel), res in zip(compiled, resources):
        check = checks.get(plan.label(), {"ok": False, "error": "no validation result"})
        if not check.get("ok"):
            error = check.get("error") or check.get("line", "failed")
            log(f"  DROP {plan.label()}: validation: {error}")
            record["dropped"].append({"label": plan.label(), "error": "validation: " + error})
            continue
        smem = plan.smem_estimate(N)
        infos[plan.label()] = dict(label=plan.label(), describe=plan.describe(M, N), chosen=plan.chosen,
                                   plan=asdict(plan), rel_error=check["rel_error"], smem_estimate=smem, **res,
                                   **occupancy(plan, M, res, smem + SMEM_MARGIN if smem else 0, arch,
                                               device.sm_count))
        contenders[plan.label()] = launcher(plan, kernel, x, y)
    contenders["torch.softmax"] = lambda: torch.softmax(x, dim=-1)
    contenders["copy"] = lambda: y.copy_(x)
    t = time.time()
    ms = tourkit.bench_interleaved(contenders, rounds=rounds, flush_mode=flush_mode)
    log(f"  timed {len(contenders)} contenders x {rounds + rounds % 2} rounds in {time.time() - t:.1f} s")

    nbytes = 2 * M * N * 2  # one read and one write
    copy_ms, torch_ms = ms["copy"], ms["torch.softmax"]
    rows = []
    for name, t_ms in sorted(ms.items(), key=lambda kv: kv[1]):
        info = infos.get(name, {})
        text = info.get("describe", "y.copy_(x): the same bytes" if name == "copy" else name)
        rows.append([text, f"{t_ms * 1e3:.2f}", f"{tourkit.gbps(nbytes, t_ms):.0f}", f"{100 * copy_ms / t_ms:.1f}%",
                     f"{torch_ms / t_ms:.2f}x", _fmt(info.get("regs"), none="-"),
                     _fmt(info.get("blocks_per_sm"), none="-"), _fmt(info.get("waves"), ".2f", none="-")])
        if info:
            info.update(us=t_ms * 1e3, gbps=tourkit.gbps(nbytes, t_ms), of_copy=copy_ms / t_ms,
                        vs_torch=torch_ms / t_ms)
            record["plans"].append(info)
    log(f"\nsoftmax {M}x{N} fp16 ({nbytes / 1e6:.1f} MB read + written), {len(infos)} valid plans timed in turns "
        f"with torch.softmax and the copy ({rounds + rounds % 2} rounds, L2 flushed before each call by a "
        f"{flush_mode})")
    log(tourkit.format_table(["plan", "µs", "GB/s", "of copy", "vs torch", "regs", "blocks/SM", "waves"], rows))
    record.update(copy_us=copy_ms * 1e3, copy_gbps=tourkit.gbps(nbytes, copy_ms), torch_us=torch_ms * 1e3,
                  torch_gbps=tourkit.gbps(nbytes, torch_ms), torch_rel_error=torch_error,
                  seconds=time.time() - started)
    if record["plans"]:
        best = min(record["plans"], key=lambda r: r["us"])
        pick = next((r for r in record["plans"] if r["chosen"]), None)
        versus = f"; the section's pick {pick['us']:.2f} µs ({100 * pick['of_copy']:.1f}%)" if pick else ""
        log(f"BEST {M}x{N}: {best['label']} {best['us']:.2f} µs = {100 * best['of_copy']:.1f}% of the copy, "
            f"{best['vs_torch']:.2f}x torch{versus}")
        record["best"] = best["label"]
    log(f"({len(record['dropped'])} plans dropped; shape done in {time.time() - started:.0f} s)")
    del x, y
    torch.cuda.empty_cache()
    return record


# ---------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------


def parse_shape(text: str) -> tuple:
    try:
        M, N = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected MxN, e.g. 4096x1823")
    if M < 1 or N < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r} must be positive")
    return M, N


def parse_shapes(text: str) -> list:
    from sections import softmax as S

    named = {"bench": S.BENCH_SHAPES, "quick": S.QUICK_SHAPES}
    if text in named:
        return list(named[text])
    return [parse_shape(t) for t in text.split(",") if t.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", type=parse_shape, default=None, help="MxN (default 4096x1823)")
    ap.add_argument("--shapes", default=None,
                    help="comma-separated MxN list, or 'bench' / 'quick' for the section's BENCH_SHAPES / QUICK_SHAPES")
    ap.add_argument("--rounds", type=int, default=6, help="turns per contender in bench_interleaved (even)")
    ap.add_argument("--flush", choices=["write", "read"], default="write",
                    help="how the L2 is flushed before each timed call (tourkit.bench_ms flush_mode): write leaves "
                         "dirty lines a small problem pays to write back, read leaves clean ones")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--compile-only", metavar="ARCH", help="no GPU: lower and nvcc-compile every plan for ARCH")
    ap.add_argument("--sms", type=int, default=None, help="SMs for the plans and waves (default: the GPU's; "
                    "compile-only: the reference GPU's, 132 for sm_90a)")
    ap.add_argument("--list", action="store_true", help="print the plans for the shape(s) and stop")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.shapes) if args.shapes else [args.shape or DEFAULT_SHAPE]

    import tourkit

    if args.compile_only or args.list:
        arch = tourkit.check_arch(args.compile_only or "sm_90a")
        sms = args.sms or REFERENCE_SMS.get(arch, 132)
        spec = tourkit.ARCH_SPECS[arch]
        if args.list:
            for M, N in shapes:
                plans = candidate_plans(M, N, spec.family, sms, arch, min(SMEM_LIMIT, spec.smem_per_block_optin))
                log(f"softmax {M}x{N} for {arch} ({sms} SMs): {len(plans)} plans")
                for plan in plans:
                    log(f"  {plan.label():34s} {plan.describe(M, N)}")
            return 0
        failed, report = 0, {"arch": arch, "sms": sms, "shapes": []}
        for M, N in shapes:
            t = time.time()
            rows = compile_only(M, N, arch, sms)
            print_compile_only(M, N, arch, rows, sms)
            bad = [r for r in rows if not r["compiled"]]
            failed += len(bad)
            log(f"{len(rows) - len(bad)} of {len(rows)} plans compiled for {arch} in {time.time() - t:.1f} s")
            report["shapes"].append({"shape": [M, N], "plans": rows})
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"softmax_probe_compile_{arch}.json"), "w") as fh:
            json.dump(report, fh, indent=1, default=str)
        return 1 if failed else 0

    import torch

    device = tourkit.detect_device()
    if device is None:
        log("no CUDA GPU here: use --compile-only ARCH (or --list)")
        return 2
    if args.sms:
        device.sm_count = args.sms
    results = {"device": device.name, "arch": device.arch, "sms": device.sm_count, "torch": torch.__version__,
               "date": time.strftime("%Y-%m-%d %H:%M"), "rounds": args.rounds, "flush": args.flush, "shapes": []}
    os.makedirs(args.out, exist_ok=True)
    for M, N in shapes:
        try:
            results["shapes"].append(run_shape(M, N, device, args.rounds, args.flush))
        except Exception as exc:  # one shape's trouble (out of memory, a broken context) is reported, not fatal
            log(f"softmax {M}x{N}: FAILED: {tourkit.one_line(exc)}")
            results["shapes"].append({"shape": [M, N], "error": tourkit.one_line(exc)})
        with open(os.path.join(args.out, "softmax_probe.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    log(f"\nwrote {os.path.join(args.out, 'softmax_probe.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
