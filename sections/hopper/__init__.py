"""The Hopper appendix: kernels whose warp specialization is written by hand.

The lessons in `sections/` write their kernels with the tile language (T.Pipelined, T.gemm, T.copy) and
let TileLang's passes build the pipeline. The modules here do that work by hand on Hopper (sm_90a): a TMA
producer warpgroup, an mbarrier ring between it and the consumer warpgroups, explicit wgmma waits, register
splits and persistent grids. Each lesson times its own kernel and the appendix kernel side by side, so the
numbers show what the compiler gives and what the hand-written schedule adds.
"""
