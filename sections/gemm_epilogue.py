"""The GEMM epilogue: bias + GELU on the register accumulator, written once for every GEMM kernel.

The `fusion` lesson teaches it; the lesson GEMM (`gemm_schedules.gemm_program`) and the Hopper appendix
kernels (`sections/hopper/gemm_ws.py`, `gemm_pingpong.py`) and the few-rows kernel (`sections/gemm_rows.py`)
all take `activation_macro(...)` (or `epilogue_macro`, bias first) and apply it to their fp32 accumulator before
the one store; with a split K, the reduction that adds the partials applies it (`splitk_reduce_program`, or
with `last_adds` the last block of a tile to arrive, `last_arrival_macro`). Its own module, so the builders and the
lesson that explains it import it without importing each other.
"""

import tilelang
import tilelang.language as T

ACTIVATIONS = (None, "gelu", "gelu_erff", "gelu_tanh")

# Abramowitz & Stegun 7.1.26: erfc(z) ~ t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2), t = 1 / (1 + p z),
# for z >= 0, absolute error <= 1.5e-7 (fp16 resolves 4.9e-4). Halved here, so the polynomial gives 0.5 erfc.
_ERFC_P = 0.3275911
_HALF_ERFC_A = tuple(0.5 * a for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429))
SQRT_HALF = 0.7071067811865476
LOG2E = 1.4426950408889634


def gelu_exact(x, abs_, exp2, maximum):
    """GELU(x) = x Phi(x) = max(x, 0) - |x| * 0.5 erfc(|x| / sqrt 2), in about 15 PTX instructions, two of
    them special-function ones (a reciprocal and an exponential), against about 30 for CUDA's erff. The
    operations are passed in, so the same formula builds the kernel's epilogue (T.abs, T.exp2, T.max) and
    runs in NumPy in the tests. The kernel is compiled with fast math (`epilogue_pass_configs`), so the
    division is one approximate reciprocal and exp2 one ex2.approx."""
    a1, a2, a3, a4, a5 = _HALF_ERFC_A
    t = 1.0 / (1.0 + (_ERFC_P * SQRT_HALF) * abs_(x))
    half_erfc = t * (a1 + t * (a2 + t * (a3 + t * (a4 + t * a5)))) * exp2(x * (x * (-0.5 * LOG2E)))
    return maximum(x, 0.0) - abs_(x) * half_erfc


def epilogue_pass_configs(activation: str | None) -> dict:
    """The GELU epilogue wants nvcc's fast math: its division becomes rcp.approx (the formula's error is
    1.5e-7 either way). Everything else in the kernel is tensor-core and integer work, which it leaves alone."""
    return {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True} if activation == "gelu" else {}


def activation_macro(bM: int, bN: int, activation: str | None):
    """The activation on a bM x bN register accumulator, in place: one macro for every kernel."""

    @T.macro
    def activate(C_local):
        if activation == "gelu":  # exact (to 1e-7) x * Phi(x), as torch's default, with a cheap erf
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = gelu_exact(C_local[i, j], T.abs, T.exp2, T.max)
        elif activation == "gelu_erff":  # the same with CUDA's erff: the textbook line, slower
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = 0.5 * C_local[i, j] * (1.0 + T.erf(C_local[i, j] * SQRT_HALF))
        elif activation == "gelu_tanh":  # torch's approximate="tanh"
            for i, j in T.Parallel(bM, bN):
                x = C_local[i, j]
                C_local[i, j] = 0.5 * x * (1.0 + T.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))

    return activate


def epilogue_macro(bM: int, bN: int, bias: bool, activation):
    """Bias and the activation on a register-resident bM x bN fp32 tile, before its one store."""
    activate = activation_macro(bM, bN, activation)

    @T.macro
    def epilogue(C_local, Bias_shared):
        if bias:
            for i, j in T.Parallel(bM, bN):
                C_local[i, j] = C_local[i, j] + Bias_shared[j]
        activate(C_local)

    return epilogue


REDUCE_TILE = (32, 256)  # a 128-thread block sums 32 x 256 fp32 partials: 64 a thread, vectorized
REDUCE_BLOCKS = 132  # a C of at least this many REDUCE_TILE tiles keeps them (a wave on Hopper)
REDUCE_LOADS = 64  # else: fewer partials a thread, every split's loads in flight at once, at most this many


def reduce_tile(M: int, N: int, splits: int) -> tuple[tuple[int, int], bool]:
    """The reduction's tile, (rows, columns) of C a 128-thread block sums, and whether its splits are unrolled.
    REDUCE_TILE makes few blocks of a small C (one for 25 x 216), each waiting out every split's round trip in
    turn; so a C of fewer than REDUCE_BLOCKS such tiles takes tiles no wider than C, of as many partials a thread
    as still make a wave of blocks (one at least), every split's loads issued together (REDUCE_LOADS at most)."""
    bM, bN = REDUCE_TILE
    if -(-M // bM) * -(-N // bN) >= REDUCE_BLOCKS:
        return REDUCE_TILE, False

    def tile(per_thread):
        columns = min(bN, 128 * per_thread, 1 << max(0, N - 1).bit_length())
        return 128 * per_thread // columns, columns

    def blocks(rows_columns):
        return -(-M // rows_columns[0]) * -(-N // rows_columns[1])

    per_thread = 1  # doubled while its loads stay under REDUCE_LOADS and the blocks a wave
    while per_thread * 2 * splits <= REDUCE_LOADS and blocks(tile(per_thread * 2)) >= REDUCE_BLOCKS:
        per_thread *= 2
    return tile(per_thread), True


def splitk_reduce_program(M: int, N: int, splits: int, *, bias: bool = False, activation=None,
                          dtype: str = "float16", tile: tuple[int, int] | None = None, unroll: bool = False,
                          c_cols: int = 0):
    """C = activation(sum over s of W[s] + Bias): the second kernel of a split-K GEMM, in `reduce_tile`'s blocks
    unless given a tile. unroll: every split's loads issued together (a few values a thread), not a round trip
    each. c_cols: C's own columns, at most N (W's, padded): its plain stores take a C of any width."""
    (bM, bN), unroll = (tile, unroll) if tile else reduce_tile(M, N, splits)
    epilogue = epilogue_macro(bM, bN, bias, activation)

    @T.macro
    def body(W, Bias, C):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=128) as (bx, by):
            acc = T.alloc_fragment((bM, bN), "float32")
            part = T.alloc_fragment((bM, bN), "float32")
            Bias_shared = T.alloc_shared((bN,), dtype) if bias else None
            if bias:
                T.copy(Bias[bx * bN], Bias_shared)
            T.clear(acc)
            for s in (T.unroll if unroll else T.serial)(splits):
                T.copy(W[s, by * bM, bx * bN], part)
                for i, j in T.Parallel(bM, bN):
                    acc[i, j] = acc[i, j] + part[i, j]
            epilogue(acc, Bias_shared)
            T.copy(acc, C[by * bM, bx * bN])

    if bias:
        @T.prim_func
        def splitk_reduce_bias(W: T.Tensor((splits, M, N), "float32"), Bias: T.Tensor((N,), dtype),
                               C: T.Tensor((M, c_cols or N), dtype)):
            body(W, Bias, C)

        return splitk_reduce_bias

    @T.prim_func
    def splitk_reduce(W: T.Tensor((splits, M, N), "float32"), C: T.Tensor((M, c_cols or N), dtype)):
        body(W, None, C)

    return splitk_reduce


LAST_ADDS_BYTES = 56 * 1024  # one tile's fp32 partials, all runs: up to this, its last block adds them


def sums_in_kernel(M: int, N: int, config) -> bool:
    """Whether a K split's runs are added by each tile's last block (`last_adds`, one launch) rather than by
    `splitk_reduce_program`: where a tile's partials inside C (runs x rows x columns, fp32) are at most
    LAST_ADDS_BYTES, the launch saved outweighs one block reading them all; beyond, the second kernel, which
    spreads the sum over every SM, wins (bench/gemm_shapes_probe.py --last-adds, bench/gemm_rows_probe.py)."""
    rows, columns = min(config.block_M, M), min(config.block_N, N)
    return config.split_k > 1 and config.split_k * rows * columns * 4 <= LAST_ADDS_BYTES


def last_arrival_macro(bM: int, bN: int, M: int, N: int, splits: int, epilogue, threads: int):
    """A split K's runs added in the GEMM's own launch: each block, its fp32 partial written to W[run], counts
    itself in Arrivals[tile]; the tile's last block to arrive adds every run's partial in order (the same sum
    whichever arrives last), applies the epilogue, stores C and sets the count back to 0 for the next call.
    `__threadfence` makes a block's partial visible to the others before it counts, and theirs to it after.
    The sum issues about 64 loads a thread at a time: all runs of its few elements, or a few runs of many."""
    runs = max(1, min(splits, 64 * threads // (bM * bN)))  # runs whose loads are in flight together

    @T.macro
    def add_if_last(W, Arrivals, C, C_local, Bias_shared, tile, row0, col0):
        arrived = T.alloc_shared((1,), "int32")
        T.call_extern("void", "__threadfence")
        T.sync_threads()
        if T.get_thread_binding() == 0:
            arrived[0] = T.atomic_add(Arrivals[tile], 1, return_prev=True)
            T.call_extern("void", "__threadfence")
        T.sync_threads()
        if arrived[0] == splits - 1:
            T.clear(C_local)
            for first in T.serial(-(-splits // runs)):
                for m, n in T.Parallel(bM, bN):
                    for r in T.unroll(runs):
                        C_local[m, n] = C_local[m, n] + T.if_then_else(
                            first * runs + r < splits and row0 + m < M and col0 + n < N,
                            W[first * runs + r, row0 + m, col0 + n], 0.0)
            epilogue(C_local, Bias_shared)
            T.copy(C_local, C[row0, col0])
            if T.get_thread_binding() == 0:
                Arrivals[tile] = 0

    return add_if_last
