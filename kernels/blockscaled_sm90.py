"""The kernel of blockscaled_sm90: DeepSeek-recipe block-scaled fp8 GEMM for Hopper, warp-specialized and
persistent on ``kernels.warp_specialized`` (design: docs/design/blockscaled_sm90.md).

C = Σ_k (A_k · B_kᵀ) ⊙ (SFA_k · SFB_k), A (M,K) and B (N,K) e4m3, SFA one fp32 scale per row per 128 K
(read M-major, ``SFA_t``), SFB one per 128x128 block of B, bf16 out.

Hopper has no block-scaled MMA, so each 128-wide K block's wgmma writes a fresh fp32 partial sum that
is scaled and added into the fp32 accumulator ("promotion"). TileLang's own pipelining of ``T.gemm``
(``blockscaled.blockscaled_g128_kernel``) leaves the tensor core idle while each warpgroup promotes. Here:

- one producer warpgroup (``T.dec_max_nreg``) walks the CTA's tiles and K blocks and TMA-loads A, B and
  the tile's A row scales of the block into a ring of ``num_stages`` stages (*full* / *empty* barriers);
- every tile starts at ring slot 0 and a round of ``num_stages`` slots is written out at trace time, so each
  stage's shared-memory addresses, wgmma descriptors and barriers are constants (a ring position counted
  across tiles made the consumers spend about twice as many instructions per K block on addresses as on
  the promotion, which kept the tensor core waiting); the last round's slots past K are empty;
- one or two consumer warpgroups, 64 output rows each. Per K block a consumer issues one wgmma chain into a
  fresh partial sum (per 128-column half when block_N is 256: each half has its own accumulator, and
  shares the one partial), drains it (``T.wait_wgmma(0)``), releases the stage, and promotes with FFMAs.
  A chain up to 192 columns wide may straddle two 128-row B scale blocks: the promotion takes each column's
  scale, the boundary being uniform over the tile. The scales never hold the tensor core up: the next
  stage's row scales are waited for and read into registers under the current block's wgmma, and B's
  (from global memory, L2-resident) one K block ahead;
- two consumer warpgroups take turns issuing (named barriers ``TURN``): each waits until the other has
  queued its previous batch, so one warpgroup's promotion always runs under the other's wgmma. Left
  to themselves both would wait on the same stage, issue together, finish together and promote
  together, with the tensor core idle;
- why not keep a second partial in flight instead (issue block k+1, then promote block k under
  ``T.wait_wgmma(1)``): ptxas then serializes every wgmma (C7514, "non wgmma instructions reading
  accumulator registers ... between start and end of the pipeline stage"), which measured 25% slower;
- the epilogue casts to bf16, stages the warpgroup's 64 rows in shared memory and TMA-stores them; the
  warpgroup starts its next tile while the store runs. Grid, grouped raster and tile rules are
  the skeleton's (persistent: ``min(tiles, SMs)`` CTAs).

Like ``kernels.warp_specialized``, this module must not use ``from __future__ import annotations``.
"""
import math

import torch

from kernels.blockscaled_g128 import blockscaled_g128_shape_limit
from kernels.formats import ceil_div, check_gemm_shape, round_up
from kernels.registry import Operands, refuse_shape
from kernels.tile_space import TileSpace, grouped_panel, warpgroup_threads
from kernels.tiles import Tile
from kernels.warp_specialized import H200_SMS, ROWS_PER_CONSUMER, TMA_PRODUCER, WARPGROUP, Skeleton, launch, tile_problem

SCALE_BLOCK = 128  # K (and B rows) per scale: one promotion per K block
# the widest partial sum one wgmma chain writes: up to 192 columns the partial and the accumulator (bN/2
# registers each) fit beside each other; a 256-column tile is two 128-column halves, one partial shared
MAX_SUB_N = 192
# named barriers (ids 1, 2 are the consumers' epilogue barriers): TURN[w] completes once consumer
# warpgroup w has queued its wgmma batch and the other warpgroup waits for it
TURN = (3, 4)


def blockscaled_sm90_smem_bytes(tile: Tile) -> int:
    """The ring (A, B and the A row scales per stage) and the bf16 output block."""
    stage = (tile.block_M + tile.block_N) * tile.block_K + tile.block_M * 4
    return tile.num_stages * stage + tile.block_M * tile.block_N * 2


def sub_block_N(block_N: int) -> int:
    """The columns of one wgmma chain (one partial sum): the whole tile up to ``MAX_SUB_N``, else halves."""
    return block_N if block_N <= MAX_SUB_N else block_N // 2


def scale_offsets(block_N: int) -> tuple[int, ...]:
    """Where a sub-block of the tile can start within a 128-row B scale block (N % 128 of its first column):
    the multiples of gcd(sub_N, 128). One offset (0) when the sub-block never straddles two scale blocks."""
    sub = sub_block_N(block_N)
    if SCALE_BLOCK % sub == 0 or sub % SCALE_BLOCK == 0:
        return (0,)
    return tuple(range(0, SCALE_BLOCK, math.gcd(sub, SCALE_BLOCK)))


def blockscaled_sm90_tile_problem(tile: Tile) -> str | None:
    """Why the kernel cannot take ``tile``, or None."""
    if tile.block_K != SCALE_BLOCK:
        return f"tile {tile.name}: block_K must be {SCALE_BLOCK} (one promotion per scale block)"
    sub = sub_block_N(tile.block_N)
    if tile.block_N % 16 or (tile.block_N > MAX_SUB_N and tile.block_N != 2 * SCALE_BLOCK):
        return (f"tile {tile.name}: block_N must be a multiple of 16 up to {MAX_SUB_N}, or 256 (two 128-column "
                "halves), so that the partial sum and the accumulator fit the registers together")
    if max(scale_offsets(tile.block_N)) + sub > 2 * SCALE_BLOCK:
        return (f"tile {tile.name}: a {sub}-column partial sum can straddle three 128-row B scale blocks; "
                f"block_N must be at most 128 + gcd(block_N, 128) (e.g. 112, 144, 160, 192)")
    if tile.promote or tile.swap_ab:
        return f"tile {tile.name}: the kernel promotes every K block and does not swap A and B (no _p, no _swapab)"
    return tile_problem(tile, blockscaled_sm90_smem_bytes(tile))


# the tiles the selection ranks (kernels/tile_space.py): block_K one scale block; block_N 64, 128 and 256 never
# straddle two B scale blocks, 192 does (its promotion chooses the scale per column); 112, 144 and 160 straddle
# too but measured 15-30 % slower per tile than 128 or 192 (docs/design/blockscaled_sm90.md), so are left out
BLOCKSCALED_SM90_TILES = TileSpace(block_M=(64, 128), block_N=(64, 128, 192, 256), block_K=(SCALE_BLOCK,),
                                   threads=warpgroup_threads, max_stages=8, swizzle=grouped_panel,
                                   persistent=True, arches=("sm_90a",))


def blockscaled_sm90_shape_limit(M: int, N: int, K: int) -> str | None:
    """K % 128 (one promotion per 128 K, as blockscaled_g128), and N % 8 for the TMA store of the bf16 rows
    (16-byte pitch)."""
    if reason := blockscaled_g128_shape_limit(M, N, K):
        return reason
    if N % 8:
        return f"the TMA store of the bf16 output needs N divisible by 8 (a 16-byte row pitch), got N={N}"
    return None


def launch_blockscaled_sm90(kernel, ops: Operands) -> torch.Tensor:
    return kernel(ops["A"], ops["B"], ops["SFA_t"], ops["SFB"])


def blockscaled_sm90_kernel(M: int, N: int, K: int, tile: Tile, num_sms: int = H200_SMS):
    """TileLang prim_func: A (M,K), B (N,K) e4m3, SFA_t (K/128, M4), SFB (⌈N/128⌉, K/128) fp32, C (M,N) bf16."""
    import tilelang.language as T

    check_gemm_shape("blockscaled_sm90_kernel", M, N, K)
    refuse_shape(blockscaled_sm90_shape_limit, M, N, K, "blockscaled_sm90_kernel")
    if problem := blockscaled_sm90_tile_problem(tile):
        raise ValueError(problem)
    bM, bN, bK, S = tile.block_M, tile.block_N, tile.block_K, tile.num_stages
    shape = launch(M, N, K, tile, blockscaled_sm90_smem_bytes(tile), num_sms=num_sms)
    ws = Skeleton(T, tile, shape, TMA_PRODUCER, S)
    consumers, k_blocks = shape.consumers, shape.k_blocks
    rounds = ceil_div(k_blocks, S)  # ring rounds per tile: every tile starts at slot 0
    stage_slots = list(range(S))  # a Python list: each slot's code is written out, its addresses constant

    def ring_phase(w, r):
        """The barrier phase of round r of the CTA's w-th tile (its *full* parity; *empty*'s is the other)."""
        return (w * rounds + r) & 1
    rows = ROWS_PER_CONSUMER
    sub_N = sub_block_N(bN)
    halves = list(range(bN // sub_N))  # a Python list: unrolled at trace time
    offsets = scale_offsets(bN)
    straddles = len(offsets) > 1  # a partial sum may take its columns from two B scale blocks
    nbs = ceil_div(N, SCALE_BLOCK)  # B scale blocks along N
    M4 = round_up(M, 4)  # SFA_t's padded rows
    fp8, f32 = "float8_e4m3fn", "float32"
    regs = rows * sub_N // WARPGROUP

    @T.macro
    def b_scale_rows(nb, sb_row):
        # each half's B scale rows (the block of its first column and the next; a block past N clamps to
        # the last: its columns are never stored), once per tile
        for h in halves:
            first = (nb[0] * bN + h * sub_N) // SCALE_BLOCK
            sb_row[2 * h] = T.min(first, nbs - 1)
            if straddles:
                sb_row[2 * h + 1] = T.min(first + 1, nbs - 1)

    @T.macro
    def load_b_scales(SFB, ki, sb_row, sb):
        # K block ki's B scales per half, from global memory (L2-resident)
        for h in halves:
            sb[2 * h] = SFB[sb_row[2 * h], ki]
            if straddles:
                sb[2 * h + 1] = SFB[sb_row[2 * h + 1], ki]

    @T.macro
    def load_a_scales(SFA_s, full, slot, phase, wg, sa):
        # wait for the stage, then the warpgroup's row scales from it, into registers
        T.barrier_wait(full[slot], phase)
        for i in T.Parallel(rows):
            sa[i] = SFA_s[slot, wg * rows + i]

    @T.macro
    def promote(acc, part, sa, sb, h, nb):
        T.warpgroup_fence_operand(part, num_regs=regs)
        if straddles:
            # columns before the scale-block boundary take the first B scale, the rest the next; the
            # boundary is uniform over the tile, so each possible one is its own branch with the
            # choice per column known at compile time
            off = (nb[0] * bN + h * sub_N) % SCALE_BLOCK
            for o in offsets:
                if off == o:
                    for i, j in T.Parallel(rows, sub_N):
                        acc[i, j] += part[i, j] * (sa[i] * T.if_then_else(j < SCALE_BLOCK - o, sb[2 * h],
                                                                             sb[2 * h + 1]))
        else:
            for i, j in T.Parallel(rows, sub_N):
                acc[i, j] += part[i, j] * (sa[i] * sb[2 * h])

    @T.macro
    def stage_output(accs, C_s, C, mb, nb, wg):
        for h in halves:
            T.copy(accs[h], C_s[:, h * sub_N:(h + 1) * sub_N])

    @T.macro
    def store_output(accs, C_s, C, mb, nb, wg):
        row = mb[0] * bM + wg * rows
        T.tma_copy(C_s, C[row:row + rows, nb[0] * bN:(nb[0] + 1) * bN])

    @T.macro
    def consume_stage(r, s, w, A_s, B_s, SFA_s, SFB, full, empty, accs, part, sa, sa_next, sb, sb_next, sb_row, wg,
                      lane, nb):
        # K block ki = r·S + s of this CTA's w-th tile, in ring slot s (a constant: each tile starts at slot 0)
        ki = r * S + s
        phase = ring_phase(w, r)
        # the scales were loaded one K block ahead (B's from global memory, A's from the stage), so
        # that neither the wgmma issue nor the promotion waits for them
        for i in T.Parallel(rows):
            sa[i] = sa_next[i]
        for h in range(2 * len(halves)):
            sb[h] = sb_next[h]
        if ki + 1 < k_blocks:
            load_b_scales(SFB, ki + 1, sb_row, sb_next)
        for h in halves:
            if consumers == 2:
                # take turns on the tensor core: wait until the other warpgroup has issued its
                # previous batch (warpgroup 0's very first batch waits for nobody)
                if wg == 1:
                    T.sync_threads(barrier_id=TURN[0], arrive_count=2 * WARPGROUP)
                elif h > 0:
                    T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)
                else:
                    if (w > 0) | (ki > 0):
                        T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)
            T.wgmma_gemm(A_s[s, :, :], B_s[h][s, :, :], part, transpose_B=True,
                         policy=T.GemmWarpPolicy.FullRow, clear_accum=True)
            if consumers == 2:
                T.named_barrier_arrive(TURN[wg], 2 * WARPGROUP)  # this batch is queued
            if h == halves[-1]:
                # under this wgmma: the tile's next stage and its row scales
                if ki + 1 < k_blocks:
                    if s + 1 < S:
                        load_a_scales(SFA_s, full, s + 1, phase, wg, sa_next)
                    else:
                        load_a_scales(SFA_s, full, 0, phase ^ 1, wg, sa_next)
            T.wait_wgmma(0)
            if h == halves[-1]:
                if lane == 0:
                    T.barrier_arrive(empty[s])  # the stage's last reader retired
            promote(accs[h], part, sa, sb, h, nb)

    @T.macro
    def consume_tile(t, w, A_s, B_s, SFA_s, SFB, C_s, full, empty, C, accs, part, sa, sa_next, sb, sb_next, sb_row,
                     wg, lane, mb, nb):
        for h in halves:
            T.clear(accs[h])
        b_scale_rows(nb, sb_row)
        load_a_scales(SFA_s, full, 0, ring_phase(w, 0), wg, sa_next)
        load_b_scales(SFB, 0, sb_row, sb_next)
        # the ring slots of a round are unrolled, so that every stage address and barrier is a constant;
        # the last round's slots past K (k_blocks % S) are empty: the producer only flips their barriers
        for r in T.serial(rounds):
            for s in stage_slots:
                if r * S + s < k_blocks:
                    consume_stage(r, s, w, A_s, B_s, SFA_s, SFB, full, empty, accs, part, sa, sa_next, sb, sb_next,
                                  sb_row, wg, lane, nb)
                else:
                    T.barrier_wait(full[s], ring_phase(w, r))
                    if lane == 0:
                        T.barrier_arrive(empty[s])
        # the previous tile's store must have read C_s before it is overwritten; then the TMA store runs
        # on while this warpgroup starts its next tile
        ws.store_tile(wg, 0, stage_output, store_output, accs, C_s, C, mb, nb, wg)

    @T.macro
    def consume(A_s, B_s, SFA_s, SFB, full, empty, C, C_s, accs, part, sa, sa_next, sb, sb_next, wg, pid):
        lane = T.get_thread_binding() % 32
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        sb_row = T.alloc_local((2 * len(halves),), "int32")
        ws.for_each_tile(pid, mb, nb, consume_tile, A_s, B_s, SFA_s, SFB, C_s, full, empty, C, accs, part, sa, sa_next,
                         sb, sb_next, sb_row, wg, lane, mb, nb)
        if consumers == 2:
            if wg == 0:
                T.sync_threads(barrier_id=TURN[1], arrive_count=2 * WARPGROUP)  # warpgroup 1's last turn
        T.tma_store_wait(0)

    @T.macro
    def load_tile(t, w, A, B, SFA_t, A_s, B_s, SFA_s, full, empty, mb, nb):
        m0 = mb[0] * bM
        for r in T.serial(rounds):
            for s in stage_slots:
                ki = r * S + s
                T.barrier_wait(empty[s], ring_phase(w, r) ^ 1)
                if ki < k_blocks:
                    T.tma_copy(A[m0:m0 + rows, ki * bK:(ki + 1) * bK], A_s[0][s, :, :], barrier=full[s])
                    if consumers == 2:
                        T.tma_copy(A[m0 + rows:m0 + bM, ki * bK:(ki + 1) * bK], A_s[1][s, :, :], barrier=full[s])
                    for h in halves:
                        n0 = nb[0] * bN + h * sub_N
                        T.tma_copy(B[n0:n0 + sub_N, ki * bK:(ki + 1) * bK], B_s[h][s, :, :], barrier=full[s])
                    T.tma_copy(SFA_t[ki, m0:m0 + bM], SFA_s[s, :], barrier=full[s])
                T.barrier_arrive(full[s])

    @T.macro
    def produce(A, B, SFA_t, A_s, B_s, SFA_s, full, empty, pid):
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        ws.for_each_tile(pid, mb, nb, load_tile, A, B, SFA_t, A_s, B_s, SFA_s, full, empty, mb, nb)

    def consumer_buffers():
        """One consumer warpgroup's own buffers (its A ring is allocated before them): the staged output, the
        accumulators, the partial sum, and the A and B scales of this K block and the next."""
        return (T.alloc_shared((rows, bN), "bfloat16"), [T.alloc_fragment((rows, sub_N), f32) for _ in halves],
                T.alloc_fragment((rows, sub_N), f32), T.alloc_fragment((rows,), f32), T.alloc_fragment((rows,), f32),
                T.alloc_local((2 * len(halves),), f32), T.alloc_local((2 * len(halves),), f32))

    @T.prim_func
    def main(
        A: T.Tensor((M, K), fp8),
        B: T.Tensor((N, K), fp8),
        SFA_t: T.Tensor((k_blocks, M4), f32),
        SFB: T.Tensor((nbs, k_blocks), f32),
        C: T.Tensor((M, N), "bfloat16"),
    ):
        with T.Kernel(shape.grid, threads=shape.threads) as pid:
            A_s, (B_s, SFA_s), own = ws.per_consumer(
                lambda: T.alloc_shared((S, rows, bK), fp8),
                lambda: ([T.alloc_shared((S, sub_N, bK), fp8) for _ in halves], T.alloc_shared((S, bM), f32)),
                consumer_buffers)
            # full: all 128 producer threads arrive once the stage's loads are issued (the TMA adds its
            # bytes); empty: lane 0 of every consumer warp arrives once its wgmma of the stage retired
            # and its row scales are in registers
            full, empty = ws.ring_barriers()
            ws.dispatch(produce, consume, (A, B, SFA_t, A_s, B_s, SFA_s, full, empty, pid),
                        [(A_s[wg], B_s, SFA_s, SFB, full, empty, C, *own[wg], wg, pid) for wg in range(consumers)])

    return main
