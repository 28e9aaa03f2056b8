"""A warp-specialized, persistent TN GEMM for Hopper: C = (A·Bᵀ)·scale, A (M,K), B (N,K).

Why not ``T.gemm`` in ``T.Pipelined``: ``T.gemm`` waits for its own wgmma batch before the stage is
released, so the tensor core idles while each warpgroup waits. Here the waits are written by hand:

- one producer warpgroup (few registers, ``T.dec_max_nreg``) walks the CTA's tiles and K blocks and
  TMA-loads A and B into a ring of ``num_stages`` shared buffers, each guarded by a *full* barrier
  (the TMA's bytes landed) and an *empty* barrier (every consumer warp is done reading it);
- one or two consumer warpgroups (``T.inc_max_nreg``), 64 output rows each, wait on *full*, issue
  ``T.wgmma_gemm`` (no implicit wait), then ``T.wait_wgmma(1)``: the batch just issued keeps running
  while the previous one is drained and its stage released. One batch is always in flight.
- the grid is persistent: ``min(tiles, num_sms)`` CTAs, each taking tiles ``pid, pid + grid, …`` in
  grouped order (``group_M`` M blocks share an N band, so one wave's A and B stay in L2);
- the epilogue scales and casts the accumulator, stages it in shared memory and TMA-stores it; the
  warpgroup starts its next tile while the store runs (the producer is already loading it). A
  ``swap_ab`` tile (Cᵀ = B·Aᵀ, for small M: M becomes the wgmma's N) is stored transposed from
  registers instead.

The grid is sized for the H200's 132 SMs (``num_sms``): a GPU with fewer runs the extra CTAs as a
second partial wave, correct but slower.

``promote`` > 0 adds fp32 promotion: the wgmma accumulator is added into a second fp32 accumulator
every ``promote`` K blocks and restarted, as cuBLAS's default (non fast-accumulation) fp8 GEMM does,
bounding the reduced-precision adds of Hopper's fp8 wgmma to ``promote·block_K`` products.

Like ``tn_gemm``, modules using this must not use ``from __future__ import annotations``.
"""
from dataclasses import dataclass

from kernels.tiles import REGISTERS_PER_BLOCK, SMEM_LIMIT_BYTES, STATIC_SMEM_RESERVE, Tile

WARPGROUP = 128
ROWS_PER_CONSUMER = 64  # a wgmma's M
H200_SMS = 132
# 227 KB of opt-in shared memory per block (kernels/tiles.py's table), less the 2 KB of static barriers and scratch
HOPPER_SMEM_BYTES = SMEM_LIMIT_BYTES["sm_90a"] - STATIC_SMEM_RESERVE["sm_90a"]
# setmaxnreg budgets (multiples of 8; 40 + 2·232 ≤ 512 per thread slot of a 384-thread CTA)
PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232}
PASS_CONFIGS = {
    # the hand-written producer/consumer split must not be split again by TileLang's own pass,
    # and the barriers order the shared-memory accesses, so no extra __syncthreads either
    "tl.disable_warp_specialized": True,
    "tl.disable_thread_storage_sync": True,
}


@dataclass(frozen=True)
class WsShape:
    """The launch of one (M, N, K, tile): consumer warpgroups, grid, tiles per CTA."""

    consumers: int
    threads: int
    m_blocks: int
    n_blocks: int
    k_blocks: int
    grid: int
    waves: int

    @property
    def tiles(self) -> int:
        return self.m_blocks * self.n_blocks


def smem_bytes(tile: Tile, in_bytes: int, out_bytes: int) -> int:
    """Dynamic shared memory: the ring of A and B blocks, plus the output block the TMA store reads."""
    ring = tile.num_stages * (tile.block_M + tile.block_N) * tile.block_K * in_bytes
    return ring + (0 if tile.swap_ab else tile.block_M * tile.block_N * out_bytes)


def ws_tile_problem(tile: Tile, in_bytes: int = 1, out_bytes: int = 2, smem: int | None = None,
                    regs: tuple[int, dict[int, int]] = (PRODUCER_REGS, CONSUMER_REGS)) -> str | None:
    """Why the kernel cannot take ``tile``, or None. ``smem``: the shared memory of a kernel built on this
    one with another layout (``kernels.int4_ws``); default ``smem_bytes``. ``regs``: its setmaxnreg budgets
    (producer, consumers -> per consumer thread), which must fit the block's register file together."""
    if tile.block_M not in (64, 128):
        return f"tile {tile.name}: block_M must be 64 or 128 (one or two 64-row consumer warpgroups)"
    consumers = tile.block_M // ROWS_PER_CONSUMER
    if tile.threads != WARPGROUP * (consumers + 1):
        return (f"tile {tile.name}: threads must be {WARPGROUP * (consumers + 1)}"
                f" (one producer and {consumers} consumer warpgroup(s) for block_M={tile.block_M})")
    if tile.block_N % 8 or not 8 <= tile.block_N <= 256:
        return f"tile {tile.name}: block_N must be a multiple of 8 in [8, 256] (a wgmma's N)"
    if tile.block_K % 32:
        return f"tile {tile.name}: block_K must be a multiple of 32 (a fp8 wgmma's K)"
    if tile.num_stages < 2:
        return f"tile {tile.name}: the ring needs at least 2 stages"
    if tile.policy != "Square":
        return f"tile {tile.name}: each consumer warpgroup owns 64 full rows; there is no warp policy (_w) to choose"
    producer, consumer = regs[0], regs[1].get(consumers)
    if consumer is None or WARPGROUP * (producer + consumers * consumer) > REGISTERS_PER_BLOCK:
        return (f"tile {tile.name}: setmaxnreg budgets {producer} + {consumers} x {consumer} registers per warpgroup "
                f"thread do not fit the {REGISTERS_PER_BLOCK} registers of a block")
    if smem is None:
        smem = smem_bytes(tile, in_bytes, out_bytes)
    if smem > HOPPER_SMEM_BYTES:
        return (f"tile {tile.name}: needs {smem} bytes of shared memory, more than the {HOPPER_SMEM_BYTES}"
                " a Hopper block can have; use fewer stages or a smaller block")
    return None


def ws_shape(M: int, N: int, K: int, tile: Tile, num_sms: int = H200_SMS, smem: int | None = None) -> WsShape:
    """Check a tile against the kernel's form (``smem`` as in ``ws_tile_problem``) and size its persistent launch."""
    if problem := ws_tile_problem(tile, smem=smem):
        raise ValueError(problem)
    consumers = tile.block_M // ROWS_PER_CONSUMER
    if tile.swap_ab:
        M, N = N, M  # the kernel's rows are B's, its columns A's
    m_blocks, n_blocks, k_blocks = -(-M // tile.block_M), -(-N // tile.block_N), -(-K // tile.block_K)
    grid = min(m_blocks * n_blocks, num_sms)
    return WsShape(consumers, tile.threads, m_blocks, n_blocks, k_blocks, grid, -(-m_blocks * n_blocks // grid))


def grouped_tile(t, m_blocks: int, n_blocks: int, group_M: int, minimum=min):
    """Tile id -> (M block, N block) in grouped raster order: ``group_M`` M blocks walk the N blocks
    together (the last group may be shorter), so the CTAs of one wave share their A rows and B columns
    in L2. Plain ints here; in the kernel ``t`` is a TIR expression and ``minimum`` is ``T.min``."""
    per_group = group_M * n_blocks
    first = (t // per_group) * group_M
    size = minimum(group_M, m_blocks - first)
    return first + (t % per_group) % size, (t % per_group) // size


def ws_gemm_kernel(M: int, N: int, K: int, tile: Tile, in_dtype: str, accum_dtype: str = "float32",
                   out_dtype: str = "bfloat16", num_sms: int = H200_SMS):
    """TileLang prim_func: A (M,K), B (N,K) in ``in_dtype``, scale (1,) fp32, C (M,N) ``out_dtype``."""
    import tilelang.language as T

    bM, bN, bK, S = tile.block_M, tile.block_N, tile.block_K, tile.num_stages
    shape = ws_shape(M, N, K, tile, num_sms)
    consumers, grid, waves, k_blocks = shape.consumers, shape.grid, shape.waves, shape.k_blocks
    m_blocks, n_blocks, tiles = shape.m_blocks, shape.n_blocks, shape.tiles
    group_M = max(tile.swizzle, 1)
    promote = tile.promote
    swap = tile.swap_ab
    half = ROWS_PER_CONSUMER
    consumer_warps = consumers * WARPGROUP // 32

    @T.macro
    def tile_coords(t, mb, nb):
        mb[0], nb[0] = grouped_tile(t, m_blocks, n_blocks, group_M, minimum=T.min)

    @T.macro
    def consume(A_s, B_s, C_s, full, empty, C, scale, acc, part, wg, pid):
        """One consumer warpgroup: for each tile, drain the ring over K keeping one wgmma batch in
        flight, then write its 64 rows."""
        T.inc_max_nreg(CONSUMER_REGS[consumers])
        lane = T.get_thread_binding() % 32
        gi = T.alloc_var("int32", init=0)
        prev = T.alloc_var("int32", init=0)
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        for w in T.serial(waves):
            t = w * grid + pid
            if t < tiles:
                tile_coords(t, mb, nb)
                if promote:
                    T.clear(acc)
                for ki in T.serial(k_blocks):
                    slot = gi % S
                    T.barrier_wait(full[slot], (gi // S) & 1)
                    target = part if promote else acc
                    T.wgmma_gemm(A_s[slot, :, :], B_s[slot, :, :], target, transpose_B=True,
                                 policy=T.GemmWarpPolicy.FullRow,
                                 clear_accum=(ki % promote == 0) if promote else (ki == 0))
                    if promote:
                        # the partial sum must be complete before it is added: at a group's last K
                        # block drain both batches, release both stages, then promote
                        if ((ki % promote) == promote - 1) | (ki == k_blocks - 1):
                            T.wait_wgmma(0)
                            if lane == 0:
                                if ki % promote != 0:
                                    T.barrier_arrive(empty[prev])
                                T.barrier_arrive(empty[slot])
                            T.warpgroup_fence_operand(part, num_regs=half * bN // WARPGROUP)
                            for i, j in T.Parallel(half, bN):
                                acc[i, j] += part[i, j]
                        elif ki % promote != 0:
                            T.wait_wgmma(1)
                            if lane == 0:
                                T.barrier_arrive(empty[prev])
                    elif ki > 0:
                        T.wait_wgmma(1)
                        if lane == 0:
                            T.barrier_arrive(empty[prev])
                    prev = slot
                    gi = gi + 1
                if not promote:
                    T.wait_wgmma(0)
                    if lane == 0:
                        T.barrier_arrive(empty[prev])
                    T.warpgroup_fence_operand(acc, num_regs=half * bN // WARPGROUP)
                for i, j in T.Parallel(half, bN):
                    acc[i, j] = acc[i, j] * scale[0]
                if swap:
                    # the tile is a block of Cᵀ: few columns (M is small), written transposed from registers
                    for i, j in T.Parallel(half, bN):
                        if (mb[0] * bM + wg * half + i < N) & (nb[0] * bN + j < M):
                            C[nb[0] * bN + j, mb[0] * bM + wg * half + i] = acc[i, j]
                else:
                    # the previous tile's store must have read C_s before it is overwritten; then the
                    # TMA store runs on while this warpgroup starts its next tile
                    T.tma_store_wait(0)
                    T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
                    T.copy(acc, C_s)
                    T.fence_proxy_async()
                    T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
                    T.tma_copy(C_s, C[mb[0] * bM + wg * half:mb[0] * bM + (wg + 1) * half, nb[0] * bN:(nb[0] + 1) * bN])
        if not swap:
            T.tma_store_wait(0)

    @T.prim_func
    def main(
        A: T.Tensor((M, K), in_dtype),
        B: T.Tensor((N, K), in_dtype),
        scale: T.Tensor((1,), "float32"),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(grid, threads=shape.threads) as pid:
            A_s0 = T.alloc_shared((S, half, bK), in_dtype)
            B_s = T.alloc_shared((S, bN, bK), in_dtype)
            C_s0 = None if swap else T.alloc_shared((half, bN), out_dtype)
            acc0 = T.alloc_fragment((half, bN), accum_dtype)
            part0 = T.alloc_fragment((half, bN), accum_dtype) if promote else acc0
            if consumers == 2:
                A_s1 = T.alloc_shared((S, half, bK), in_dtype)
                C_s1 = None if swap else T.alloc_shared((half, bN), out_dtype)
                acc1 = T.alloc_fragment((half, bN), accum_dtype)
                part1 = T.alloc_fragment((half, bN), accum_dtype) if promote else acc1
            # full: all 128 producer threads arrive once the stage's loads are issued (the TMA adds
            # its bytes); empty: lane 0 of every consumer warp arrives once it is done reading.
            full = T.alloc_barrier([WARPGROUP] * S)
            empty = T.alloc_barrier([consumer_warps] * S)
            X, Y = (B, A) if swap else (A, B)  # the rows and the columns of the kernel's tiles
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
                            T.barrier_wait(empty[slot], ((gi // S) & 1) ^ 1)
                            T.tma_copy(X[mb[0] * bM:mb[0] * bM + half, ki * bK:(ki + 1) * bK], A_s0[slot, :, :],
                                       barrier=full[slot])
                            if consumers == 2:
                                T.tma_copy(X[mb[0] * bM + half:(mb[0] + 1) * bM, ki * bK:(ki + 1) * bK],
                                           A_s1[slot, :, :], barrier=full[slot])
                            T.tma_copy(Y[nb[0] * bN:(nb[0] + 1) * bN, ki * bK:(ki + 1) * bK], B_s[slot, :, :],
                                       barrier=full[slot])
                            T.barrier_arrive(full[slot])
                            gi = gi + 1
            elif tx < 2 * WARPGROUP:
                consume(A_s0, B_s, C_s0, full, empty, C, scale, acc0, part0, 0, pid)
            else:
                if consumers == 2:
                    consume(A_s1, B_s, C_s1, full, empty, C, scale, acc1, part1, 1, pid)

    return main
