"""The TileLang quick reference the tour prints at its end: the idioms the lessons use, with the names of the
pinned tilelang (tests/test_quick_reference.py checks each one exists)."""

QUICK_REFERENCE = r"""
TileLang quick reference (tilelang 0.1.15; import tilelang, tilelang.language as T)
  kernel launch     with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=128) as (bx, by): ...
  shared memory     A_s = T.alloc_shared((bM, bK), "float16")          # one tile per block, in SMEM
  register tile     C_f = T.alloc_fragment((bM, bN), "float32")        # spread over the threads' registers
  per-thread local  acc = T.alloc_local((1,), "float32")               # private scalar/array per thread
  tile copy         T.copy(A[by * bM, k * bK], A_s)                    # global<->shared<->fragment, vectorized
  tensor-core GEMM  T.gemm(A_s, B_s, C_f, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
  clear / fill      T.clear(C_f);  T.fill(m_f, -T.infinity("float32"))
  pipelining        for k in T.Pipelined(T.ceildiv(K, bK), num_stages=3): ...   # cp.async / TMA overlap
  elementwise       for i, j in T.Parallel(bM, bN): C_f[i, j] = T.max(C_f[i, j], 0)
  row reductions    T.reduce_max(S_f, m_f, dim=1, clear=True);  T.reduce_sum(P_f, l_f, dim=1)
  math              T.exp2(x), T.log2(x), T.max(a, b), T.if_then_else(c, a, b)
  L2 swizzle        T.use_swizzle(panel_size=10)                        # rasterize blocks for L2 reuse
  device print      T.print(A_s, msg="A tile")                          # from a kernel, to the process stdout
  copy options      T.copy(A[by * bM, 0], A_s, disable_tma=True)       # Hopper: a plain copy instead of TMA
  jit               @tilelang.jit(out_idx=[-1], pass_configs={"tl.enable_fast_math": True})
  compile directly  kernel = tilelang.compile(prim_func, out_idx=[2], target="cuda")
  autotune          @tilelang.autotune(configs=[{"block_M": 128, ...}, ...], warmup=3, rep=20)  # counts, not ms
  inspect           kernel.get_kernel_source()   kernel.get_profiler().do_bench()
  validate          kernel.get_profiler().assert_allclose(ref_fn, rtol=1e-2, atol=1e-2)
  kernel cache      TILELANG_CACHE_DIR=~/.tilelang/cache   TILELANG_DISABLE_CACHE=1   (or tilelang.disable_cache())
  debug env         TILELANG_PRINT_ON_COMPILATION=1 (the compile log, off here)  TL_LOWER_TRACE=terminal
                    (IR diff per lowering pass; read when tilelang is imported)   pass_configs={"tl.enable_dump_ir": True}
  no GPU            with Target({"kind": "cuda", "arch": "sm_90a"}) as t: tilelang.lower(f, target=t)
""".strip("\n")
