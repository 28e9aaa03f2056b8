"""DeepSeek-recipe block-scaled fp8 GEMM for Hopper: warp-specialized, persistent. ``blockscaled_sm90``'s kernel.

C = Σ_k (A_k · B_kᵀ) ⊙ (SFA_k · SFB_k), A (M,K) and B (N,K) e4m3, SFA one fp32 scale per row per 128 K
(read M-major, ``SFA_t``), SFB one per 128x128 block of B, bf16 out.

Hopper has no block-scaled MMA, so each 128-wide K block's wgmma writes a fresh fp32 partial sum that
is scaled and added into the fp32 accumulator ("promotion"). TileLang's own pipelining of ``T.gemm``
(``blockscaled.blockscaled_g128_kernel``) leaves the tensor core idle while each warpgroup promotes. Here:

- one producer warpgroup (``T.dec_max_nreg``) walks the CTA's tiles and K blocks and TMA-loads A, B and
  the tile's A row scales of the block into a ring of ``num_stages`` stages (*full* / *empty* barriers);
- one or two consumer warpgroups, 64 output rows each. Per K block (and per 128-column half when
  block_N is 256: each half has its own accumulator and B scale, and shares the one partial sum)
  a consumer issues the wgmma into the partial, drains it (``T.wait_wgmma(0)``), releases the stage
  after its last half, and promotes with FFMAs. The scales never hold the tensor core up: the next
  stage's row scales are waited for and read into registers under the current block's last wgmma, and
  B's (from global memory, L2-resident) one K block ahead;
- two consumer warpgroups take turns issuing (named barriers ``TURN``): each waits until the other has
  queued its previous batch, so one warpgroup's promotion always runs under the other's wgmma. Left
  to themselves both would wait on the same stage, issue together, finish together and promote
  together, with the tensor core idle;
- why not keep a second partial in flight instead (issue block k+1, then promote block k under
  ``T.wait_wgmma(1)``): ptxas then serializes every wgmma (C7514, "non wgmma instructions reading
  accumulator registers ... between start and end of the pipeline stage"), which measured 25% slower;
- the epilogue casts to bf16, stages the warpgroup's 64 rows in shared memory and TMA-stores them; the
  warpgroup starts its next tile while the store runs. Grid, grouped raster and tile rules are
  ``ws_gemm``'s (persistent: ``min(tiles, SMs)`` CTAs).

Like ``ws_gemm``, this module must not use ``from __future__ import annotations``.
"""
from kernels.formats import ceil_div, round_up
from kernels.tiles import Tile
from kernels.ws_gemm import (
    CONSUMER_REGS,
    H200_SMS,
    PRODUCER_REGS,
    ROWS_PER_CONSUMER,
    WARPGROUP,
    grouped_tile,
    ws_shape,
    ws_tile_problem,
)

SCALE_BLOCK = 128  # K (and B rows) per scale: one promotion per K block
SUB_N = 128  # widest partial sum one wgmma writes here (one B scale block)
# named barriers (ids 1, 2 are the consumers' epilogue barriers): TURN[w] completes once consumer
# warpgroup w has queued its wgmma batch and the other warpgroup waits for it
TURN = (3, 4)


def blockscaled_ws_smem_bytes(tile: Tile) -> int:
    """The ring (A, B and the A row scales per stage) and the bf16 output block."""
    stage = (tile.block_M + tile.block_N) * tile.block_K + tile.block_M * 4
    return tile.num_stages * stage + tile.block_M * tile.block_N * 2


def blockscaled_ws_tile_problem(tile: Tile) -> str | None:
    """Why the kernel cannot take ``tile``, or None."""
    if tile.block_K != SCALE_BLOCK:
        return f"tile {tile.name}: block_K must be {SCALE_BLOCK} (one promotion per scale block)"
    if tile.block_N not in (64, 128, 256):
        return (f"tile {tile.name}: block_N must be 64, 128 or 256, so that each partial sum sees one B scale "
                "block (a 128x128 block of B)")
    if tile.promote or tile.swap_ab:
        return f"tile {tile.name}: the kernel promotes every K block and does not swap A and B (no _p, no _swapab)"
    return ws_tile_problem(tile, smem=blockscaled_ws_smem_bytes(tile))


def blockscaled_ws_kernel(M: int, N: int, K: int, tile: Tile, num_sms: int = H200_SMS):
    """TileLang prim_func: A (M,K), B (N,K) e4m3, SFA_t (K/128, M4), SFB (⌈N/128⌉, K/128) fp32, C (M,N) bf16.

    The caller (``blockscaled.blockscaled_sm90_kernel``) has checked the shape (K % 128, N % 8)."""
    import tilelang.language as T

    if problem := blockscaled_ws_tile_problem(tile):
        raise ValueError(problem)
    bM, bN, bK, S = tile.block_M, tile.block_N, tile.block_K, tile.num_stages
    shape = ws_shape(M, N, K, tile, num_sms, smem=blockscaled_ws_smem_bytes(tile))
    consumers, grid, waves, k_blocks = shape.consumers, shape.grid, shape.waves, shape.k_blocks
    m_blocks, n_blocks, tiles = shape.m_blocks, shape.n_blocks, shape.tiles
    group_M = max(tile.swizzle, 1)
    rows = ROWS_PER_CONSUMER
    consumer_warps = consumers * WARPGROUP // 32
    sub_N = min(bN, SUB_N)
    halves = list(range(bN // sub_N))  # a Python list: unrolled at trace time
    nbs = ceil_div(N, SCALE_BLOCK)  # B scale blocks along N
    M4 = round_up(M, 4)  # SFA_t's padded rows
    fp8, f32 = "float8_e4m3fn", "float32"
    regs = rows * sub_N // WARPGROUP

    @T.macro
    def tile_coords(t, mb, nb):
        mb[0], nb[0] = grouped_tile(t, m_blocks, n_blocks, group_M, minimum=T.min)

    @T.macro
    def load_b_scales(SFB, ki, nb, sb):
        # K block ki's B scale per half (a half past N clamps to the last block: its columns are never
        # stored; ki past the end to the last block: a prefetch nobody uses)
        for h in halves:
            sb[h] = SFB[T.min((nb[0] * bN + h * sub_N) // SCALE_BLOCK, nbs - 1), T.min(ki, k_blocks - 1)]

    @T.macro
    def load_a_scales(SFA_s, full, g, wg, sa):
        # wait for ring position g, then the warpgroup's row scales of its stage, into registers
        T.barrier_wait(full[g % S], (g // S) & 1)
        for i in T.Parallel(rows):
            sa[i] = SFA_s[g % S, wg * rows + i]

    @T.macro
    def promote(acc, part, sa, sb, h):
        T.warpgroup_fence_operand(part, num_regs=regs)
        for i, j in T.Parallel(rows, sub_N):
            acc[i, j] += part[i, j] * (sa[i] * sb[h])

    @T.macro
    def consume(A_s, B_s, SFA_s, SFB, C_s, full, empty, C, accs, part, sa, sa_next, sb, sb_next, wg, pid):
        T.inc_max_nreg(CONSUMER_REGS[consumers])
        lane = T.get_thread_binding() % 32
        gi = T.alloc_var("int32", init=0)
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        for w in T.serial(waves):
            t = w * grid + pid
            if t < tiles:
                tile_coords(t, mb, nb)
                for h in halves:
                    T.clear(accs[h])
                # per K block, each half's wgmma is issued, drained and promoted in turn; while one
                # consumer warpgroup promotes, the other's wgmma keeps the tensor core busy
                if w == 0:
                    # the CTA's first K block; later ones are waited for under the previous wgmma
                    load_a_scales(SFA_s, full, gi, wg, sa_next)
                load_b_scales(SFB, 0, nb, sb_next)
                for ki in T.serial(k_blocks):
                    # the scales were loaded one K block ahead (B's from global memory, A's from the
                    # stage), so that neither the wgmma issue nor the promotion waits for them
                    for i in T.Parallel(rows):
                        sa[i] = sa_next[i]
                    for h in halves:
                        sb[h] = sb_next[h]
                    load_b_scales(SFB, ki + 1, nb, sb_next)
                    slot = gi % S
                    for h in halves:
                        if consumers == 2:
                            # take turns on the tensor core: wait until the other warpgroup has issued
                            # its previous batch (warpgroup 0's very first batch waits for nobody)
                            if wg == 1:
                                T.sync_threads(barrier_id=TURN[0], arrive_count=2 * WARPGROUP)
                            elif h > 0:
                                T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)
                            else:
                                if gi > 0:
                                    T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)
                        T.wgmma_gemm(A_s[slot, :, :], B_s[h][slot, :, :], part, transpose_B=True,
                                     policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
                        if consumers == 2:
                            T.named_barrier_arrive(TURN[wg], 2 * WARPGROUP)  # this batch is queued
                        if h == halves[-1]:
                            # under this wgmma: the next stage (the next tile's first, if this CTA has
                            # one) and its row scales
                            if (ki + 1 < k_blocks) | (t + grid < tiles):
                                load_a_scales(SFA_s, full, gi + 1, wg, sa_next)
                        T.wait_wgmma(0)
                        if h == halves[-1]:
                            if lane == 0:
                                T.barrier_arrive(empty[slot])  # the stage's last reader retired
                        promote(accs[h], part, sa, sb, h)
                    gi = gi + 1
                # the previous tile's store must have read C_s before it is overwritten; then the TMA
                # store runs on while this warpgroup starts its next tile
                T.tma_store_wait(0)
                T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
                for h in halves:
                    T.copy(accs[h], C_s[:, h * sub_N:(h + 1) * sub_N])
                T.fence_proxy_async()
                T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
                row = mb[0] * bM + wg * rows
                T.tma_copy(C_s, C[row:row + rows, nb[0] * bN:(nb[0] + 1) * bN])
        if consumers == 2:
            if wg == 0:
                T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)  # warpgroup 1's last turn
        T.tma_store_wait(0)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), fp8),
        B: T.Tensor((N, K), fp8),
        SFA_t: T.Tensor((k_blocks, M4), f32),
        SFB: T.Tensor((nbs, k_blocks), f32),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(grid, threads=shape.threads) as pid:
            A_s0 = T.alloc_shared((S, rows, bK), fp8)
            B_s = [T.alloc_shared((S, sub_N, bK), fp8) for _ in halves]
            SFA_s = T.alloc_shared((S, bM), f32)
            C_s0 = T.alloc_shared((rows, bN), "bfloat16")
            accs0 = [T.alloc_fragment((rows, sub_N), f32) for _ in halves]
            part0 = T.alloc_fragment((rows, sub_N), f32)
            sa0 = T.alloc_fragment((rows,), f32)
            san0 = T.alloc_fragment((rows,), f32)
            sb0 = T.alloc_local((len(halves),), f32)
            sbn0 = T.alloc_local((len(halves),), f32)
            if consumers == 2:
                A_s1 = T.alloc_shared((S, rows, bK), fp8)
                C_s1 = T.alloc_shared((rows, bN), "bfloat16")
                accs1 = [T.alloc_fragment((rows, sub_N), f32) for _ in halves]
                part1 = T.alloc_fragment((rows, sub_N), f32)
                sa1 = T.alloc_fragment((rows,), f32)
                san1 = T.alloc_fragment((rows,), f32)
                sb1 = T.alloc_local((len(halves),), f32)
                sbn1 = T.alloc_local((len(halves),), f32)
            # full: all 128 producer threads arrive once the stage's loads are issued (the TMA adds its
            # bytes); empty: lane 0 of every consumer warp arrives once its wgmma of the stage retired
            # and its row scales are in registers
            full = T.alloc_barrier([WARPGROUP] * S)
            empty = T.alloc_barrier([consumer_warps] * S)
            tx = T.get_thread_binding()
            T.sync_threads()
            if tx < WARPGROUP:
                T.dec_max_nreg(PRODUCER_REGS)
                gi = T.alloc_var("int32", init=0)
                mb = T.alloc_local((1,), "int32")
                nb = T.alloc_local((1,), "int32")
                for w in T.serial(waves):
                    t = w * grid + pid
                    if t < tiles:
                        tile_coords(t, mb, nb)
                        for ki in T.serial(k_blocks):
                            slot = gi % S
                            m0 = mb[0] * bM
                            T.barrier_wait(empty[slot], ((gi // S) & 1) ^ 1)
                            T.tma_copy(A[m0:m0 + rows, ki * bK:(ki + 1) * bK], A_s0[slot, :, :], barrier=full[slot])
                            if consumers == 2:
                                T.tma_copy(A[m0 + rows:m0 + bM, ki * bK:(ki + 1) * bK], A_s1[slot, :, :],
                                           barrier=full[slot])
                            for h in halves:
                                n0 = nb[0] * bN + h * sub_N
                                T.tma_copy(B[n0:n0 + sub_N, ki * bK:(ki + 1) * bK], B_s[h][slot, :, :],
                                           barrier=full[slot])
                            T.tma_copy(SFA_t[ki, m0:m0 + bM], SFA_s[slot, :], barrier=full[slot])
                            T.barrier_arrive(full[slot])
                            gi = gi + 1
            elif tx < 2 * WARPGROUP:
                consume(A_s0, B_s, SFA_s, SFB, C_s0, full, empty, C, accs0, part0, sa0, san0, sb0, sbn0, 0, pid)
            else:
                if consumers == 2:
                    consume(A_s1, B_s, SFA_s, SFB, C_s1, full, empty, C, accs1, part1, sa1, san1, sb1, sbn1, 1, pid)

    return main

