"""softmax, version 4 (Hopper): a long row split over a thread-block cluster.

Version 3 (softmax.py, long_rows_online) stages what fits of a long row and streams the rest from global memory
twice; where the whole row fits, so few such blocks share an SM that one's copy is not always in flight. A cluster (sm_90) is a group of blocks the GPU runs at the same time on neighbouring SMs, each able to
write the others' shared memory. So the row can be split: each of the cluster's C blocks stages its N / C
columns with one TMA copy, folds them into a (max, sum) pair as version 3 does, and sends the pair to every
block of the cluster; after one cluster barrier each block combines the C pairs into the row's and writes its
columns. Every element is read from global memory once and written once, as in a copy.

    part = X[row, rank·N/C : (rank+1)·N/C]             # T.copy: one TMA bulk copy into shared memory
    m, s = online max and sum over part                 # version 3's first pass, from shared memory
    for r in cluster: pairs[rank] of block r = (m, s)   # T.copy_cluster: a store into block r's shared memory
    cluster barrier                                     # T.cluster_sync: every pair has arrived
    M = max_r pairs[r].m;  S = Σ_r pairs[r].s · 2^(pairs[r].m − M)
    Y[row, part's columns] = 2^(part − M) / S

New here: `T.ClusterKernel(..., cluster_dims=C)`, `T.copy_cluster(src, dst, dst_block=r)` (distributed shared
memory), and the cluster barrier (`T.cluster_arrive`, `T.cluster_wait`, `T.cluster_sync`). The rule that picks
it, and C: softmax_plans.cluster_plan.
"""

import tilelang.language as T

from sections.softmax_plans import cluster_part, line_lead, row_split_layout, splits_over, step_column


def rows_split_over_cluster(M: int, N: int, cluster: int, per_thread: int, threads: int, dtype: str = "float16"):
    """Each row over `cluster` blocks of `threads` threads, walked in steps of threads · per_thread elements.
    Block `rank` owns the rank-th run of cluster_part(N, cluster) columns of the row's whole 16-byte vectors
    (the last run shorter: its copy starts early and overlaps its neighbour's, which it skips). Where parts do
    not start on 128-byte lines, each copy starts at the line holding its part, up to 7 vectors early: the copy
    engine then reads whole lines (a start inside a line splits every line in two). A row of odd
    width (N % 8) starts and ends inside a vector: the first block also takes the up to 7 columns before its
    first whole vector, the last block those after the last, one at a time (`edge`)."""
    from sections.softmax import LOG2E, merge_thread_pairs, running_max_and_sum  # the lesson's (imports us lazily)

    part = cluster_part(N, cluster)
    if per_thread % 8 or not splits_over(N, cluster):
        raise ValueError(f"cluster softmax: {N} columns are too few for {cluster} blocks, or {per_thread} elements "
                         f"a thread are not whole vectors")
    step = threads * per_thread
    steps = -(-part // step)
    lead = line_lead(N, part) if M * N // 8 >= part // 8 + 7 else 0  # vectors the copy may start early
    low = -1.0e38  # a finite start for the running max, as in version 3

    column = step_column(threads, per_thread)  # thread i's e-th element of step c, as version 3 walks

    def edge(row, rank, first, end, i):  # (flat index, owned) of edge column i: 0-7 before the body, 8-15 after
        flat = T.if_then_else(i < 8, row * N + i, end * 8 + i - 8)
        head = T.And(T.And(i < 8, rank == 0), flat < first * 8)
        tail = T.And(T.And(i >= 8, rank == cluster - 1), flat < row * N + N)
        return flat, T.And(i < 16, T.Or(head, tail))

    @T.prim_func
    def softmax_rows_split_over_cluster(X: T.Tensor((M * N,), dtype), Y: T.Tensor((M * N,), dtype)):
        # Block bx takes part `bx % cluster` of row `bx // cluster` of the flat X.
        with T.ClusterKernel(M * cluster, cluster_dims=cluster, threads=threads) as bx:
            # 64-bit offsets where M·N elements overflow 32 bits (row · N would wrap before any cast)
            row, rank = T.cast(bx // cluster, "int64" if M * N >= 2**31 else "int32"), bx % cluster
            first, end = (row * N + 7) // 8, (row * N + N) // 8  # the row's whole vectors: [first, end)
            owned = first + rank * (part // 8)  # this block's first vector; its copy starts at `start`
            start = T.min(owned, end - part // 8)
            lo, hi = (owned - start) * 8, (T.min(owned + part // 8, end) - start) * 8  # owned staged columns
            # The copy starts at the 128-byte line holding `start` (kept inside X): whole lines for the TMA unit;
            # the part then sits `shift` columns into the buffer.
            origin = T.min(start // 8 * 8, M * N // 8 - part // 8 - lead) if lead else start
            shift = (start - origin) * 8
            columns = T.alloc_shared((steps * step + lead * 8,), dtype)
            # Static shared memory, which TileLang never shares with another buffer: the other blocks write it
            # while this one may still be reducing.
            pairs = T.alloc_shared((cluster, 2), "float32", scope="shared")
            mine = T.alloc_shared((2,), "float32")
            x = T.alloc_fragment((threads, per_thread), "float32")
            part_max = T.alloc_fragment((threads,), "float32")
            part_sum = T.alloc_fragment((threads,), "float32")
            new_max = T.alloc_fragment((threads,), "float32")
            step_sum = T.alloc_fragment((threads,), "float32")
            row_max = T.alloc_fragment((1,), "float32")
            row_sum = T.alloc_fragment((1,), "float32")
            T.annotate_layout({x: row_split_layout(threads, per_thread, 1, per_thread)})
            T.cluster_arrive()  # "started": no block writes another's shared memory before its owner has started
            T.copy(X[origin * 8:origin * 8 + part + lead * 8], columns[0:part + lead * 8], prefer_instruction="tma")
            T.fill(part_max, low)
            T.fill(part_sum, 0.0)
            if N % 8:  # the edge columns, straight from global memory
                for i, e in T.Parallel(threads, per_thread):
                    flat, ours = edge(row, rank, first, end, i)
                    x[i, e] = T.if_then_else(T.And(e == 0, ours), T.cast(X[flat], "float32") * LOG2E,
                                             -T.infinity("float32"))
                running_max_and_sum(x, part_max, part_sum, new_max, step_sum, threads, per_thread)
            for c in T.serial(steps):  # version 3's first pass, over this block's part
                for i, e in T.Parallel(threads, per_thread):
                    x[i, e] = T.if_then_else(T.And(column(c, i, e) >= lo, column(c, i, e) < hi),
                                             T.cast(columns[column(c, i, e) + shift], "float32") * LOG2E,
                                             -T.infinity("float32"))
                running_max_and_sum(x, part_max, part_sum, new_max, step_sum, threads, per_thread)
            merge_thread_pairs(part_max, part_sum, row_max, row_sum, threads)  # the block's pair
            for i in T.Parallel(1):
                mine[0] = row_max[i]
                mine[1] = row_sum[i]
            T.cluster_wait()  # every block of the cluster has started
            # This block's pair into row `bx % cluster` of every block's pairs, by the first warp. TileLang's sync
            # pass cannot tell the blocks' copies of `pairs` apart, so it orders the stores: one copy after
            # another (explicit), a one-warp barrier between them (as a loop it would warn of a race instead).
            if T.get_thread_binding() < 32:
                for r in T.unroll(cluster, explicit=True):
                    T.copy_cluster(mine[0:2], pairs[bx % cluster, 0:2], dst_block=r)
            T.cluster_sync()  # every pair has arrived everywhere
            for i in T.Parallel(1):
                row_max[i] = pairs[0, 0]
                for r in T.unroll(1, cluster):
                    row_max[i] = T.max(row_max[i], pairs[r, 0])
                row_sum[i] = 0.0
                for r in T.unroll(cluster):
                    row_sum[i] += pairs[r, 1] * T.exp2(pairs[r, 0] - row_max[i])
                row_sum[i] = 1.0 / row_sum[i]
            for c in T.serial(steps):  # the one write, from shared memory
                for j in T.Parallel(step):
                    if T.And(c * step + j >= lo, c * step + j < hi):
                        Y[start * 8 + c * step + j] = T.cast(
                            T.exp2(T.cast(columns[c * step + j + shift], "float32") * LOG2E - row_max[0]) * row_sum[0],
                            dtype)
            if N % 8:
                for i in T.Parallel(16):
                    flat, ours = edge(row, rank, first, end, i)
                    if ours:
                        Y[flat] = T.cast(T.exp2(T.cast(X[flat], "float32") * LOG2E - row_max[0]) * row_sum[0], dtype)

    return softmax_rows_split_over_cluster
