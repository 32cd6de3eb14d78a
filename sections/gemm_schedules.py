"""gemm_schedules: a tiled tensor-core GEMM, and how its schedule decides its speed.

What you learn: how one short TileLang program becomes a fast fp16 GEMM (fp32 accumulation). Each block
owns a block_M x block_N tile of C. A `T.Pipelined` loop walks K in block_K steps, copying the A and B tiles
from global into shared memory with `T.copy` while the tensor cores (`T.gemm`) work on earlier stages: on
Ampere/Ada the copies become cp.async and the GEMM ldmatrix + mma.sync; on Hopper (sm_90a) the copies
become TMA bulk copies guarded by mbarriers, the GEMM becomes wgmma, and TileLang splits the block into a
producer warpgroup (the copies) and consumer warpgroups (the math): warp specialization. The accumulator
lives in registers (`T.alloc_fragment`) until a staged store writes it out once, through shared memory.

The schedule (block_M, block_N, block_K, num_stages, threads, swizzle) is the knob: bigger tiles reuse
more data per byte loaded but need more shared memory and registers; more stages hide more latency but
multiply the shared memory; `T.use_swizzle` reorders the blocks so neighbours share A and B tiles in L2.
The section runs a table of schedules for your GPU against cuBLAS (torch.matmul) and marks the best.

The same builder also takes a fused epilogue (bias, GELU) that the `fusion` section uses.
"""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
from dataclasses import dataclass

import tilelang
import tilelang.language as T

import tourkit
from tourkit import Section, SectionSkip

# ---------------------------------------------------------------------------------------------------------
# The schedule
# ---------------------------------------------------------------------------------------------------------

ACTIVATIONS = (None, "gelu", "gelu_tanh")
_WARP_POLICIES = ("Square", "FullRow", "FullCol")


@dataclass(frozen=True)
class GemmConfig:
    """One schedule of the tiled GEMM. `panel` is the swizzle panel width (blocks); `policy` names the
    T.GemmWarpPolicy that splits the tile over the warps; `staged_store` writes C through shared memory."""

    block_M: int
    block_N: int
    block_K: int
    num_stages: int
    threads: int
    swizzle: bool
    panel: int = 10
    policy: str = "Square"
    staged_store: bool = True

    def smem_bytes(self, dtype_bytes: int = 2) -> int:
        """Shared memory this schedule needs: `num_stages` copies of the A and B tiles, and the C tile
        that stages the store. TileLang's shared-memory planner lets the C tile reuse the A/B buffers
        (their lifetimes end with the K loop), so the kernel needs the larger of the two, plus a bias
        tile and alignment. A safe upper bound of the lowered kernel's buffer (the tests check it)."""
        stages = max(1, self.num_stages)
        pipeline = stages * (self.block_M * self.block_K + self.block_K * self.block_N) * dtype_bytes
        c_tile = self.block_M * self.block_N * dtype_bytes if self.staged_store else 0
        bias_tile = self.block_N * dtype_bytes
        return max(pipeline, c_tile) + bias_tile + 1024

    def label(self) -> str:
        text = f"{self.block_M}x{self.block_N}x{self.block_K} s{self.num_stages} t{self.threads}"
        text += f" swz{self.panel if self.panel != 10 else ''}" if self.swizzle else " noswz"
        if self.policy != "Square":
            text += f" {self.policy}"
        if not self.staged_store:
            text += " direct"
        return text


def fits(config: GemmConfig, smem_budget: int) -> bool:
    """Whether a schedule's shared memory fits what one block may use on the device."""
    return config.smem_bytes() <= smem_budget


def gemm_flops(M: int, N: int, K: int) -> int:
    return 2 * M * N * K


def default_schedules(family: str) -> list[GemmConfig]:
    """Schedules worth comparing on an architecture family: one winner and its instructive neighbours."""
    if family == "hopper":
        return [
            GemmConfig(128, 256, 64, 4, 256, True),   # the usual winner: 2 consumer warpgroups, 128x256 tile
            GemmConfig(128, 256, 64, 3, 256, True),
            GemmConfig(256, 128, 64, 4, 256, True),
            GemmConfig(128, 256, 64, 4, 256, False),  # the same without L2 swizzle
            GemmConfig(128, 128, 64, 4, 256, True),   # a smaller tile: less reuse per byte
            GemmConfig(128, 256, 64, 4, 384, True),   # three consumer warpgroups
            GemmConfig(64, 128, 64, 4, 128, True),    # a small tile: far from the tensor-core roofline
            GemmConfig(256, 256, 64, 4, 256, True),   # too much shared memory: skipped on every GPU
        ]
    if family in ("ampere", "ada"):
        return [
            GemmConfig(128, 256, 32, 3, 256, True),
            GemmConfig(128, 128, 32, 4, 256, True),
            GemmConfig(128, 256, 32, 3, 256, False),
            GemmConfig(256, 128, 32, 3, 256, True),
            GemmConfig(128, 128, 64, 3, 128, True),
            GemmConfig(64, 128, 32, 4, 128, True),
            GemmConfig(128, 256, 64, 4, 256, True),   # 192 KiB: over the 163/99 KiB budgets, skipped
        ]
    if family == "turing":
        return [
            GemmConfig(128, 128, 32, 2, 128, True),
            GemmConfig(128, 128, 32, 2, 256, True),
            GemmConfig(128, 64, 32, 2, 128, True),
            GemmConfig(64, 128, 32, 2, 128, True),
            GemmConfig(128, 128, 32, 2, 128, False),
            GemmConfig(64, 64, 32, 2, 128, True),
            GemmConfig(128, 256, 32, 2, 256, True),   # 80 KiB: over Turing's 64 KiB budget, skipped
        ]
    raise ValueError(f"no GEMM schedules for architecture family {family!r}")


# ---------------------------------------------------------------------------------------------------------
# The kernel builder
# ---------------------------------------------------------------------------------------------------------


def _check_problem(M: int, N: int, K: int, config: GemmConfig, activation, dtype: str) -> None:
    for name, value in (("M", M), ("N", N), ("K", K)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"GEMM size {name}={value!r} must be a positive integer")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {ACTIVATIONS}")
    if config.policy not in _WARP_POLICIES:
        raise ValueError(f"warp policy {config.policy!r} is not one of {_WARP_POLICIES}")
    # Rows of A (K elements) and of B and C (N elements) must start 16-byte aligned: TMA descriptors and
    # vectorized copies need it. Other sizes (1000, 1000 + 8k, ...) work, tails included.
    elem = 2 if dtype in ("float16", "bfloat16") else 4
    if (K * elem) % 16 or (N * elem) % 16:
        raise ValueError(f"GEMM with N={N}, K={K}: rows must be multiples of 16 bytes "
                         f"(N and K multiples of {16 // elem} for {dtype}); pad the operands")


def gemm_program(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", accum_dtype: str = "float32"):
    """C = activation(A @ B + Bias) as a TileLang prim_func over A[M, K], B[K, N], (Bias[N],) C[M, N]."""
    _check_problem(M, N, K, config, activation, dtype)
    bM, bN, bK = config.block_M, config.block_N, config.block_K
    policy = getattr(T.GemmWarpPolicy, config.policy)

    @T.macro
    def epilogue(C_local, Bias_shared):
        """Bias and GELU on the register-resident accumulator, before the single store."""
        if bias:
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = C_local[i, j] + Bias_shared[j]
        if activation == "gelu":  # exact: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as torch's default
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = 0.5 * C_local[i, j] * (1.0 + T.erf(C_local[i, j] * 0.7071067811865476))
        elif activation == "gelu_tanh":  # torch's approximate="tanh"
            for i, j in T.Parallel(bM, bN):
                x = C_local[i, j]
                C_local[i, j] = 0.5 * x * (1.0 + T.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

    @T.macro
    def body(A, B, Bias, C):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=config.threads) as (bx, by):
            A_shared = T.alloc_shared((bM, bK), dtype)
            B_shared = T.alloc_shared((bK, bN), dtype)
            C_local = T.alloc_fragment((bM, bN), accum_dtype)
            Bias_shared = T.alloc_shared((bN,), dtype) if bias else None
            C_shared = T.alloc_shared((bM, bN), dtype) if config.staged_store else None
            T.use_swizzle(panel_size=config.panel, enable=config.swizzle)

            if bias:
                T.copy(Bias[bx * bN], Bias_shared)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, bK), num_stages=config.num_stages):
                T.copy(A[by * bM, k * bK], A_shared)
                T.copy(B[k * bK, bx * bN], B_shared)
                T.gemm(A_shared, B_shared, C_local, policy=policy)

            epilogue(C_local, Bias_shared)
            if config.staged_store:  # registers -> shared -> global: coalesced (TMA on Hopper) stores
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * bM, bx * bN])
            else:
                T.copy(C_local, C[by * bM, bx * bN])

    if bias:
        @T.prim_func
        def gemm_bias(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), Bias: T.Tensor((N,), dtype),
                      C: T.Tensor((M, N), dtype)):
            body(A, B, Bias, C)

        return gemm_bias

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        body(A, B, None, C)

    return gemm


def compile_gemm(M: int, N: int, K: int, config: GemmConfig, *, bias: bool = False, activation: str | None = None,
                 dtype: str = "float16", accum_dtype: str = "float32", pass_configs: dict | None = None):
    """Compile for the local GPU. The kernel writes into the caller's C: kernel(a, b, c) / kernel(a, b, bias, c)."""
    func = gemm_program(M, N, K, config, bias=bias, activation=activation, dtype=dtype, accum_dtype=accum_dtype)
    return tilelang.compile(func, out_idx=None, target="cuda", pass_configs=dict(pass_configs or {}))


def run(ctx):
    raise SectionSkip("gemm_schedules: the schedule table is being written (the builder above is final)")


SECTION = Section(name="gemm_schedules", title="GEMM schedules", summary="Tiled tensor-core GEMM; schedules vs cuBLAS.",
                  run=run, needs_gpu=True)
