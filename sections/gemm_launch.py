"""Running a GEMM plan (sections/gemm_plans.py) as one call: the padded copies of its operands, the GEMM, the
split-K reduction; and the prim_func signature every GEMM kernel shares (`gemm_prim_func`). The launcher knows a
plan only by what it asks for (kernel_shape, padded, pad_b, b_width, c_width, split_k), so this module imports
nothing of the plans."""

# No `from __future__ import annotations`: T.prim_func evaluates the T.Tensor annotations.
import tilelang.language as T

PART_THREADS = {"reduce": 128, "pad_b": 256}  # threads of a plan's programs besides the GEMM
PAD_TILE = (16, 512)  # a 256-thread block copies 16 rows x 512 columns: 16-byte vectors, four a thread


def pad_rows_program(rows: int, cols: int, rows_to: int, cols_to: int, dtype: str = "float16"):
    """P[:rows, :cols] = S: the copy of S[rows, cols] into the top left of a P[rows_to, cols_to] whose other
    elements stay as they are (zeros, written once where the launcher makes P)."""
    bR, bC = PAD_TILE

    @T.prim_func
    def pad_rows(S: T.Tensor((rows, cols), dtype), P: T.Tensor((rows_to, cols_to), dtype)):
        with T.Kernel(T.ceildiv(cols, bC), T.ceildiv(rows, bR), threads=256) as (bx, by):
            for i, j in T.Parallel(bR, bC):
                if by * bR + i < rows and bx * bC + j < cols:
                    P[by * bR + i, bx * bC + j] = S[by * bR + i, bx * bC + j]

    return pad_rows


def gemm_prim_func(M: int, N: int, K: int, body, bias: bool, dtype: str, c_shape=None, c_dtype=None,
                   b_cols: int = 0, counts: int = 0, c_cols: int = 0):
    """The prim_func around a kernel body(A, B, Bias, C): with or without the Bias[N] argument; C is last
    (c_shape/c_dtype: the split-K partials instead of C; b_cols: B's rows padded to that many columns).
    counts > 0: a split K added in the same launch (`last_arrival_macro`), body(A, B, Bias, W, Arrivals, C)
    over the partials W (c_shape), that many int32 arrival counts and C (c_cols: C's own columns, at most N: the
    sum's plain stores write a C of any width, so the launcher makes no padded C to copy out)."""
    c_shape, c_dtype, b_shape, sum_shape = c_shape or (M, N), c_dtype or dtype, (K, b_cols or N), (M, c_cols or N)
    if counts and bias:
        @T.prim_func
        def gemm_bias_adds(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), Bias: T.Tensor((N,), dtype),
                           W: T.Tensor(c_shape, c_dtype), Arrivals: T.Tensor((counts,), "int32"),
                           C: T.Tensor(sum_shape, dtype)):
            body(A, B, Bias, W, Arrivals, C)

        return gemm_bias_adds
    if counts:
        @T.prim_func
        def gemm_adds(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), W: T.Tensor(c_shape, c_dtype),
                      Arrivals: T.Tensor((counts,), "int32"), C: T.Tensor(sum_shape, dtype)):
            body(A, B, None, W, Arrivals, C)

        return gemm_adds
    if bias:
        @T.prim_func
        def gemm_bias(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), Bias: T.Tensor((N,), dtype),
                      C: T.Tensor(c_shape, c_dtype)):
            body(A, B, Bias, C)

        return gemm_bias

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor(c_shape, c_dtype)):
        body(A, B, None, C)

    return gemm


class GemmLauncher:
    """Runs a plan's kernels as one call, launcher(a, b, c) or launcher(a, b, bias, c): copies A and B into
    zero-padded buffers where the problem is not aligned (B with the plan's "pad_b" program where it has one; C
    out of one where the plan's c_width asks), and with a split K runs the GEMM into fp32 partials and the
    reduction into C (or, with last_adds, one launch that adds them itself, counting each tile's runs in an int32
    array). Buffers (and their views) are made at the first call and kept: their padding stays zero, and a call
    spends no time on Python it can skip."""

    def __init__(self, plan, kernels: dict, returns_c: bool = False):
        # returns_c: kernels["gemm"](a, b) returns C (compiled with out_idx=[-1], as tilelang.autotune does)
        self.plan, self.kernels, self.buffers, self.returns_c = plan, kernels, None, returns_c

    def _buffers(self, a):
        import torch

        (M, N, K), (n, k) = self.plan.kernel_shape, (self.plan.N, self.plan.K)
        new = dict(dtype=a.dtype, device=a.device)
        padded = {"a": torch.zeros((M, K), **new) if K != k else None,
                  "b": torch.zeros((K, self.plan.b_width), **new) if self.plan.padded or self.plan.pad_b else None,
                  "bias": torch.zeros((N,), **new) if N != n else None,
                  "c": torch.empty((M, N), **new) if self.plan.c_width != n else None}
        views = {"a": (lambda t: t[:, :k]), "b": (lambda t: t[:k, :n]), "bias": (lambda t: t[:n]),
                 "c": (lambda t: t[:, :n])}
        splits = getattr(self.plan.config, "split_k", 1)
        # A split with no reduction kernel (last_adds): each tile counts its runs' arrivals, back to 0 after a call
        config = self.plan.config
        tiles = -(-M // getattr(config, "block_M", M)) * -(-N // config.block_N)
        arrivals = (torch.zeros(tiles, dtype=torch.int32, device=a.device)
                    if splits > 1 and "reduce" not in self.kernels else None)
        return {"padded": padded, "views": {key: views[key](t) for key, t in padded.items() if t is not None},
                "w": torch.empty((splits, M, N), dtype=torch.float32, device=a.device) if splits > 1 else None,
                "arrivals": arrivals}

    def __call__(self, a, b, *rest):
        bias, c = rest if len(rest) == 2 else (None, rest[0])
        if self.buffers is None:
            self.buffers = self._buffers(a)
        padded, views, w = self.buffers["padded"], self.buffers["views"], self.buffers["w"]
        operands = {"a": a, "b": b, "bias": bias}
        for key, tensor in operands.items():
            if key == "b" and "pad_b" in self.kernels:  # the plan's copy kernel (torch's copy_ is slower here)
                self.kernels["pad_b"](tensor.contiguous(), padded["b"])
                operands["b"] = padded["b"]
            elif tensor is not None and key in views:
                views[key].copy_(tensor)
                operands[key] = padded[key]
        a, b, bias = operands.values()
        out = padded["c"] if "c" in views else c
        epilogue = () if bias is None else (bias,)
        if self.returns_c:
            out = self.kernels["gemm"](a, b)
        elif self.buffers["arrivals"] is not None:
            self.kernels["gemm"](a, b, *epilogue, w, self.buffers["arrivals"], out)
        elif w is not None:
            self.kernels["gemm"](a, b, w)
            self.kernels["reduce"](w, *epilogue, out)
        else:
            self.kernels["gemm"](a, b, *epilogue, out)
        if "c" in views or self.returns_c:
            c.copy_(out[:, :self.plan.N])
        return c
