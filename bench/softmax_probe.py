"""Probe for the softmax section on small and odd shapes: sweep kernel plans for one (M, N), validate each, then
time the valid ones in turns with torch.softmax and a device copy of the same bytes.

    python bench/softmax_probe.py [--shape 4096x1823] [--rounds 6] [--flush write|read] [--out DIR]
    python bench/softmax_probe.py --shapes bench            # the section's BENCH_SHAPES (or --shapes 4096x1823,2048x1823)
    python bench/softmax_probe.py --compile-only sm_90a     # no GPU: lower + nvcc every plan, smem / registers / waves
    (on the device: bash .device/run python bench/softmax_probe.py --out $OUT)

Why: on 4096x1823 fp16 (30 MB moved) the section's plan (rows staged in shared memory by TMA, 8 rows/block, 256
threads: 512 blocks) reaches 84% of a same-size copy, while large shapes reach 96%. A 15 µs problem is
latency-bound: every block loads, then reduces, then stores, and a grid that does not fit in one wave leaves a
tail. The sweep (candidate_plans) holds, for the shape:

* staged (the section's kernel): rows_per_block r0·{1,2,3,4} (r0 = 8 for odd widths: a 16-byte aligned group)
  x 128/256/512/1024 threads, where the rows divide M and a thread holds 8..128 floats; the same with plain
  copies instead of TMA; and with __launch_bounds__' min-blocks-per-SM set so the grid fits in one wave
  (registers capped at 64K / (blocks·threads)) where that cap still holds a thread's floats;
* registers: rows read straight from global memory (masked single halves for odd widths), 1/2/4/8 rows,
  128..1024 threads (8..64 floats a thread), and their one-wave min-blocks variants;
* pipelined (Hopper): rows_staged_pipelined (below), blocks that walk several groups of rows through a
  ring of 2-4 TMA buffers, so the loads of the next groups overlap this group's reduction and store: grids of
  groups/2, groups/4, groups/8 blocks and persistent grids of 1 or 2 blocks per SM;
* online / online-per-thread for rows longer than 8192 (two-pass over a row in shared memory);
* the section's choose_plan() pick, marked "<- section".

Plans whose shared memory exceeds 227 KiB (or the arch's opt-in maximum) are not built. All plans compile at once
(tourkit.compile_many), then a child process validates each against torch.softmax in float32 on fresh random
inputs (tolerance 5e-3, as the section) and checks that a second launch gives the same bits: a kernel that faults
or hangs takes only the child down, it is reported in one line and the probe goes on with a fresh child. The valid
plans, torch.softmax and y.copy_(x) (the same bytes read and written) are then timed with
tourkit.bench_interleaved (L2 flushed before each call). Prints a table sorted by time, writes softmax_probe.json to
--out. Each kernel also shows its registers per thread, blocks per SM (registers, shared memory, threads) and
waves: the grid over SMs x blocks per SM.
"""

import argparse
import json
import math
import os
import queue
import subprocess
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
STAGED_PER_THREAD = (8, 128)  # floats a thread holds in the staged / pipelined kernels (min, max)
REGISTER_PER_THREAD = (8, 64)  # ... and in the register kernel
MIN_BLOCKS_SPARE = 4  # a min-blocks variant needs a register cap of at least floats per thread + this
WATCHDOG_S = 60  # one plan's validation in the child: seconds before it counts as hung
CHILD_START_S = 600  # the child's imports and compile_many (cache hits, or a compile when the cache is cold)
MARK = "@@softmax_probe "  # the child's result lines on stdout start with this

# Per architecture: SMs of the reference GPU (for waves when no GPU is present), resident threads and blocks per SM.
REFERENCE_SMS = {"sm_90a": 132, "sm_80": 108, "sm_86": 84, "sm_89": 128, "sm_75": 40}
THREADS_PER_SM = {"sm_90a": 2048, "sm_80": 2048, "sm_86": 1536, "sm_89": 1536, "sm_75": 1024}
BLOCKS_PER_SM = {"sm_90a": 32, "sm_80": 32, "sm_86": 16, "sm_89": 24, "sm_75": 16}
REGISTERS_PER_SM = 65536

# Pipelined plans: (threads, stages, store_lag, groups per block or None, blocks per SM of a persistent grid or None)
PIPELINED = [
    (256, 2, 0, 2, None), (256, 2, 0, 4, None), (256, 3, 1, 4, None), (256, 3, 0, 8, None), (256, 4, 1, 8, None),
    (256, 2, 0, None, 1), (256, 3, 1, None, 1), (256, 2, 0, None, 2),
    (512, 2, 0, 2, None), (512, 2, 0, 4, None), (512, 2, 0, None, 1),
    (128, 2, 0, 2, None), (128, 2, 0, 4, None), (128, 2, 0, None, 2),
]
THREADS = (128, 256, 512, 1024)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------------------------------------
# Plans
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    kind: str  # "staged" | "registers" | "pipelined" | "online" | "online-per-thread"
    rows: int  # rows per block (R); the chunk length for "online"; 1 for "online-per-thread"
    threads: int
    bulk: bool = True  # staged / online: TMA bulk copies (Hopper) or plain copies
    blocks: int = 0  # pipelined: the grid
    stages: int = 0  # pipelined: shared buffers in the ring
    lag: int = 0  # pipelined: store_lag
    min_blocks: int = 0  # __launch_bounds__' min blocks per SM (0: not set)
    chosen: bool = field(default=False, compare=False)  # the section's choose_plan() pick

    @property
    def flat(self) -> bool:
        return self.kind in ("staged", "pipelined")

    def label(self) -> str:
        if self.kind == "online":
            text = f"online chunk{self.rows} T{self.threads}"
        elif self.kind == "online-per-thread":
            text = f"online-per-thread T{self.threads}"
        elif self.kind == "pipelined":
            text = f"pipelined R{self.rows} T{self.threads} B{self.blocks} S{self.stages}" + (" lag1" if self.lag else "")
        else:
            text = f"{self.kind} R{self.rows} T{self.threads}"
        if self.kind in ("staged", "online", "online-per-thread") and not self.bulk:
            text += " noTMA"
        if self.min_blocks:
            text += f" mb{self.min_blocks}"
        return text

    def describe(self, M: int, N: int) -> str:
        if self.kind == "pipelined":
            groups = M // self.rows
            text = (f"pipelined: {self.blocks} blocks x {groups / self.blocks:.3g} groups of {self.rows} rows, "
                    f"{self.stages} TMA buffers{', store lag 1' if self.lag else ''}, {self.threads} threads")
        elif self.kind in ("online", "online-per-thread"):
            from sections.softmax import SoftmaxPlan

            text = SoftmaxPlan(self.kind, self.rows, self.threads).describe()
        else:
            where = {"staged": "staged" + (" (TMA)" if self.bulk else " (plain copies)"), "registers": "registers"}
            text = f"{where[self.kind]}, {self.rows} row{'s' if self.rows > 1 else ''}/block, {self.threads} threads"
        if self.min_blocks:
            text += f", >= {self.min_blocks} blocks/SM"
        return text + ("  <- section" if self.chosen else "")

    def grid(self, M: int) -> int:
        if self.kind == "pipelined":
            return self.blocks
        if self.kind in ("online", "online-per-thread"):
            return M
        return -(-M // self.rows)

    def smem_estimate(self, N: int) -> int:
        """Bytes of the shared buffers (without the barriers and reduction scratch: SMEM_MARGIN)."""
        if self.kind == "staged":
            return self.rows * N * 2
        if self.kind == "pipelined":
            return self.stages * self.rows * N * 2
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


def rows_staged_pipelined(M: int, N: int, rows_per_block: int, threads: int, blocks: int, num_stages: int = 2,
                          store_lag: int = 0, dtype: str = "float16", min_blocks_per_sm: int = 0):
    """Hopper only (TMA bulk copies and mbarriers): the section's rows_staged_in_shared for problems too small
    to keep the memory busy with one group of rows per block. `blocks` blocks walk the M/R groups of R rows with a stride
    of `blocks` (the grid sweeps memory in order), through a ring of `num_stages` shared buffers: the first
    num_stages groups are requested at once, and each buffer is refilled with the group num_stages steps
    ahead as soon as the bulk store of its normalized rows has read it, so the loads of the next groups run
    while this group is reduced and stored. store_lag=1 refills the previous step's buffer instead (its store
    has had a whole step to drain, so no thread waits on the store just issued; the look-ahead is one group
    shorter). Each buffer has one mbarrier: the thread that issues the bulk load adds its bytes and all
    threads arrive; a buffer's n-th fill completes phase n, waited with parity n & 1. Bulk stores are
    tracked per thread: the store and the refill are both issued by warp 0's elect.sync leader (the same lane
    every time), so its cp.async.bulk.wait_group.read covers the store it issued.

    The pipeline is written by hand: TileLang's T.Pipelined splits a TMA loop into a producer warp group
    (threads 0-127) and consumers (128-383) but keeps the annotated fragment layout's thread index unshifted:
    only threads 128-255 compute, as rows 4-7, and rows 0-3 of every group are never written. The generated
    CUDA of the persistent variant of commit 104f943 shows it; that is why it failed validation on the H200."""
    import tilelang.language as T

    from sections import softmax as section

    R, S = rows_per_block, num_stages
    if threads % R or (R * N) % 8 or M % R:
        raise ValueError(f"pipelined softmax: {R} rows per block must divide {threads} threads and M={M}, and "
                         f"R·N must be a multiple of 8 (16-byte aligned groups); got N={N}")
    if store_lag not in (0, 1) or S < 2 + store_lag:
        raise ValueError(f"pipelined softmax: store_lag is 0 or 1 and needs num_stages >= {2 + store_lag}")
    groups = M // R
    if not 1 <= blocks <= groups:
        raise ValueError(f"pipelined softmax: {blocks} blocks for {groups} groups of rows")
    per_row = threads // R
    vec = section.staged_vector_width(N, per_row)
    padded = -(-N // (per_row * vec)) * (per_row * vec)
    flat = M * N
    span = R * N  # one group: R consecutive rows, one flat 16-byte aligned range

    @T.prim_func
    def softmax_rows_staged_pipelined(X: T.Tensor((flat,), dtype), Y: T.Tensor((flat,), dtype)):
        with T.Kernel(blocks, threads=threads) as bx:
            if min_blocks_per_sm:
                T.annotate_min_blocks_per_sm(min_blocks_per_sm)
            rows = T.alloc_shared((S, span), dtype)
            x = T.alloc_fragment((R, padded), "float32")
            row_max = T.alloc_fragment((R,), "float32")
            row_sum = T.alloc_fragment((R,), "float32")
            full = T.alloc_barrier([threads] * S)
            T.annotate_layout({x: section.row_split_layout(R, padded, per_row, vec)})
            steps = T.ceildiv(groups - bx, blocks)  # this block's groups: bx, bx + blocks, ...
            for s in T.unroll(S):
                if s < steps:
                    T.tma_copy(X[(bx + s * blocks) * span:(bx + s * blocks + 1) * span], rows[s, :],
                               barrier=full[s])
                    T.mbarrier_arrive(full[s])
            for it in T.serial(steps):
                g = bx + it * blocks
                T.mbarrier_wait_parity(full[it % S], (it // S) & 1)
                for i, j in T.Parallel(R, padded):
                    x[i, j] = T.if_then_else(j < N, T.cast(rows[it % S, i * N + j], "float32"),
                                             -T.infinity("float32"))
                section.exponentials_and_reciprocal_sums(x, row_max, row_sum, R, padded)
                for i, j in T.Parallel(R, padded):
                    if j < N:
                        rows[it % S, i * N + j] = T.cast(x[i, j] * row_sum[i], dtype)
                T.fence_proxy_async()  # the threads' writes, visible to the bulk store (async proxy)
                T.sync_threads()
                T.tma_copy(rows[it % S, :], Y[g * span:(g + 1) * span])  # bulk store, not waited here
                if store_lag == 0:
                    if it + S < steps:
                        T.tma_store_wait(0)  # this store has read the buffer: refill it
                        T.tma_copy(X[(g + S * blocks) * span:(g + S * blocks + 1) * span], rows[it % S, :],
                                   barrier=full[it % S])
                        T.mbarrier_arrive(full[it % S])
                else:
                    if it >= 1 and it - 1 + S < steps:
                        T.tma_store_wait(1)  # the previous step's store has read its buffer
                        T.tma_copy(X[(g + (S - 1) * blocks) * span:(g + (S - 1) * blocks + 1) * span],
                                   rows[(it - 1) % S, :], barrier=full[(it - 1) % S])
                        T.mbarrier_arrive(full[(it - 1) % S])
            T.tma_store_wait(0)

    return softmax_rows_staged_pipelined


def build(plan: Plan, M: int, N: int):
    """The plan's prim_func, from the section's builders (the section's pick builds exactly as build() there)."""
    from sections import softmax as S

    if plan.kind == "registers":
        return S.rows_in_registers(M, N, plan.rows, plan.threads, min_blocks_per_sm=plan.min_blocks)
    if plan.kind == "staged":
        return S.rows_staged_in_shared(M, N, plan.rows, plan.threads, bulk_copy=plan.bulk,
                                       min_blocks_per_sm=plan.min_blocks)
    if plan.kind == "pipelined":
        return rows_staged_pipelined(M, N, plan.rows, plan.threads, plan.blocks, plan.stages, store_lag=plan.lag,
                                     min_blocks_per_sm=plan.min_blocks)
    if plan.kind == "online":
        return S.long_rows_online(M, N, plan.rows, plan.threads, bulk_copy=plan.bulk)
    if plan.kind == "online-per-thread":
        return S.long_rows_thread_online(M, N, plan.threads, bulk_copy=plan.bulk)
    raise ValueError(f"unknown plan kind {plan.kind!r}")


def section_plan(M: int, N: int, family: str, smem_budget: int) -> "Plan | None":
    from sections import softmax as S

    try:
        pick = S.choose_plan(M, N, smem_budget, family)
    except ValueError:
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
    if T % R or M % R or not _power_of_two(T // R):
        return False
    floats = per_thread(plan, N)
    if plan.kind == "registers":
        if N % 8 == 0 and N % ((T // R) * 8):
            return False  # aligned rows: each thread's share must be whole 16-byte vectors
        return REGISTER_PER_THREAD[0] <= floats <= REGISTER_PER_THREAD[1]
    if (R * N) % 8:
        return False  # a group of rows must start on a 16-byte boundary
    if not STAGED_PER_THREAD[0] <= floats <= STAGED_PER_THREAD[1]:
        return False
    if plan.kind == "pipelined":
        return 1 <= plan.blocks < M // R and plan.stages >= 2 + plan.lag
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

    staged = [Plan("staged", R, T, bulk=hopper) for R in (r0, 2 * r0, 3 * r0, 4 * r0) for T in THREADS]
    registers = [Plan("registers", R, T) for R in (1, 2, 4, 8) for T in THREADS]
    for plan in staged + registers:
        add(plan)
    for plan in [p for p in plans if p.kind in ("staged", "registers") and not p.min_blocks]:
        need = one_wave_min_blocks(plan, M, N, sms, arch)
        if need:
            add(dataclasses.replace(plan, min_blocks=need, chosen=False))
    if hopper:  # the section's staged kernel with plain copies instead of TMA
        base = pick if pick is not None and pick.kind == "staged" else Plan("staged", r0, 256)
        add(dataclasses.replace(base, bulk=False, chosen=False))
        groups = M // r0 if M % r0 == 0 else 0
        for T, stages, lag, per_block, per_sm in PIPELINED:
            if not groups:
                break
            blocks = -(-groups // per_block) if per_block else sms * per_sm
            add(Plan("pipelined", r0, T, blocks=blocks, stages=stages, lag=lag))
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
    the same inputs must give the same bits (a race between the ring's loads and stores shows here)."""
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


def _context_alive() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
        torch.zeros(1, device="cuda").add_(1).item()
        return True
    except Exception:
        return False


def validate_worker(M: int, N: int, plan_dicts: list) -> None:
    """The child: compile (TileLang's cache: hits after the parent's compile), validate each plan, one MARK line
    per event on stdout. Exits with 3 when the CUDA context is broken (the parent restarts a child for the rest)."""
    import tourkit

    def emit(**rec):
        sys.stdout.write(MARK + json.dumps(rec) + "\n")
        sys.stdout.flush()

    plans = [Plan(**d) for d in plan_dicts]
    kernels = tourkit.compile_many([build(p, M, N) for p in plans])
    emit(event="ready")
    for plan, kernel in zip(plans, kernels):
        emit(event="start", label=plan.label())
        if kernel is None:
            emit(event="done", label=plan.label(), ok=False, error="compile failed in the validation child")
            continue
        try:
            emit(event="done", label=plan.label(), **validate_plan(plan, kernel, M, N))
        except Exception as exc:
            emit(event="done", label=plan.label(), ok=False, error=tourkit.one_line(exc))
            if not _context_alive():
                sys.exit(3)


def validate_in_children(M: int, N: int, plans: list) -> dict:
    """label -> validation record, from child processes; a plan that kills or hangs its child gets an error
    record and the rest go to a new child."""
    results, pending = {}, list(plans)
    while pending:
        cmd = [sys.executable, os.path.abspath(__file__), "--validate-worker", f"{M}x{N}",
               "--plans", json.dumps([asdict(p) for p in pending])]
        err_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"softmax_probe_child_{os.getpid()}.err")
        with open(err_path, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
        lines = queue.Queue()
        threading.Thread(target=lambda: ([lines.put(ln) for ln in proc.stdout], lines.put(None)), daemon=True).start()
        current, ready, reason = None, False, None
        while True:
            try:
                line = lines.get(timeout=WATCHDOG_S if ready else CHILD_START_S)
            except queue.Empty:
                reason = f"hung: no result within {WATCHDOG_S if ready else CHILD_START_S} s"
                proc.kill()
                break
            if line is None:
                break
            if MARK not in line:
                continue
            rec = json.loads(line.split(MARK, 1)[1])
            if rec["event"] == "ready":
                ready = True
            elif rec["event"] == "start":
                current = rec["label"]
            elif rec["event"] == "done":
                results[rec["label"]] = rec
                current = None
        proc.wait()
        if reason is None and proc.returncode not in (0, 3):
            tail = [ln for ln in open(err_path).read().splitlines() if ln.strip()][-1:]
            reason = f"the validation child died (exit {proc.returncode})" + (f": {tail[0][:200]}" if tail else "")
        try:
            os.remove(err_path)
        except OSError:
            pass
        done = {p.label() for p in pending if p.label() in results}
        if current is not None and current not in results:
            results[current] = {"ok": False, "error": reason or "the CUDA context broke"}
            done.add(current)
        if not done:  # no progress (the child died before its first plan): give up on the rest
            for p in pending:
                results[p.label()] = {"ok": False, "error": reason or "no result from the validation child"}
            break
        pending = [p for p in pending if p.label() not in done]
    return results


def validate_here(M: int, N: int, plans: list, kernels: dict) -> dict:
    """In this process (--in-process): a hang ends the probe after WATCHDOG_S, a fault spoils the rest."""
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


def run_shape(M: int, N: int, device, rounds: int, in_process: bool, flush_mode: str = "write") -> dict:
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
    checks = validate_here(M, N, plans_ok, by_label) if in_process else validate_in_children(M, N, plans_ok)
    log(f"  validated {len(plans_ok)} plans in {time.time() - t:.1f} s "
        f"({'in this process' if in_process else 'in child processes'})")
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
    ap.add_argument("--in-process", action="store_true",
                    help="validate in this process (faster; a faulting kernel then ends the probe)")
    ap.add_argument("--validate-worker", type=parse_shape, help=argparse.SUPPRESS)
    ap.add_argument("--plans", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.validate_worker:
        validate_worker(*args.validate_worker, json.loads(args.plans))
        return 0
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
            results["shapes"].append(run_shape(M, N, device, args.rounds, args.in_process, args.flush))
        except Exception as exc:  # one shape's trouble (out of memory, a broken context) is reported, not fatal
            log(f"softmax {M}x{N}: FAILED: {tourkit.one_line(exc)}")
            results["shapes"].append({"shape": [M, N], "error": tourkit.one_line(exc)})
        with open(os.path.join(args.out, "softmax_probe.json"), "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    log(f"\nwrote {os.path.join(args.out, 'softmax_probe.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
