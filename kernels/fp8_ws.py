"""The kernel of fp8_e4m3_ws, fp8_e5m2_ws and fp8_e4m3_ws_promoted: a warp-specialized, persistent TN GEMM
for Hopper, C = (A·Bᵀ)·scale, A (M,K), B (N,K), built on ``kernels.warp_specialized`` (design:
docs/design/fp8_ws.md).

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

Like ``kernels.warp_specialized``, this module must not use ``from __future__ import annotations``.
"""
from kernels.formats import check_gemm_shape
from kernels.registry import Unsupported
from kernels.tile_space import TileSpace, grouped_panel, warpgroup_threads
from kernels.tiles import Tile
from kernels.warp_specialized import H200_SMS, ROWS_PER_CONSUMER, TMA_PRODUCER, WARPGROUP, Skeleton, launch, tile_problem


def smem_bytes(tile: Tile, in_bytes: int = 1, out_bytes: int = 2) -> int:
    """Dynamic shared memory: the ring of A and B blocks, plus the output block the TMA store reads."""
    ring = tile.num_stages * (tile.block_M + tile.block_N) * tile.block_K * in_bytes
    return ring + (0 if tile.swap_ab else tile.block_M * tile.block_N * out_bytes)


# the tiles the selection ranks (kernels/tile_space.py): any wgmma N in steps of 16 (a non-power-of-two
# block_N evens the last wave out), block_K one to four wgmma K groups of 128, and for M <= 64 the
# swapped form, where M becomes the wgmma's N
FP8_WS_TILES = TileSpace(block_M=(64, 128), block_N=tuple(range(16, 257, 16)), block_K=(128, 256, 512),
                         threads=warpgroup_threads, max_stages=10, swizzle=grouped_panel, swap_ab=True,
                         persistent=True, arches=("sm_90a",))


def fp8_ws_shape_limit(M: int, N: int, K: int) -> str | None:
    """TMA moves rows whose byte stride is a multiple of 16: fp8 A and B rows (K bytes) and bf16 C rows."""
    if K % 16 or N % 8:
        return f"the TMA loads and store need K divisible by 16 and N by 8 (N={N}, K={K})"
    return None


def fp8_ws_tile_check(tile: Tile, name: str, promoted: bool) -> str | None:
    """The skeleton's rules with this kernel's shared memory, and promotion exactly where the name says so."""
    if promoted and not tile.promote:
        return f"tile {tile.name}: {name} promotes to fp32 every n K blocks, so its tiles name n (_p<n>)"
    if tile.promote and not promoted:
        return (f"tile {tile.name}: {name} accumulates without promotion (its peer is cuBLAS fast accumulation);"
                " a _p<n> tile belongs to fp8_e4m3_ws_promoted")
    return tile_problem(tile, smem_bytes(tile))


def fp8_ws_kernel(M: int, N: int, K: int, tile: Tile, in_dtype: str, accum_dtype: str = "float32",
                  out_dtype: str = "bfloat16", num_sms: int = H200_SMS):
    """TileLang prim_func: A (M,K), B (N,K) in ``in_dtype``, scale (1,) fp32, C (M,N) ``out_dtype``; the same
    operands and epilogue as ``fp8_pipelined_kernel``."""
    import tilelang.language as T

    check_gemm_shape("fp8_ws_kernel", M, N, K)
    if why := fp8_ws_shape_limit(M, N, K):
        raise Unsupported(why)
    bM, bN, bK, S = tile.block_M, tile.block_N, tile.block_K, tile.num_stages
    shape = launch(M, N, K, tile, smem_bytes(tile, 1, 2), num_sms=num_sms)
    ws = Skeleton(T, tile, shape, TMA_PRODUCER, S)
    consumers, k_blocks = shape.consumers, shape.k_blocks
    promote = tile.promote
    swap = tile.swap_ab
    half = ROWS_PER_CONSUMER

    @T.macro
    def produce(X, Y, A_s, B_s, full, empty, pid):
        gi = T.alloc_var("int32", init=0)
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        ws.load_ring(pid, X, Y, A_s, B_s, full, empty, bK, mb, nb, gi)

    @T.macro
    def stage_output(acc, C_s, C, mb, nb, wg):
        T.copy(acc, C_s)

    @T.macro
    def store_output(acc, C_s, C, mb, nb, wg):
        T.tma_copy(C_s, C[mb[0] * bM + wg * half:mb[0] * bM + (wg + 1) * half, nb[0] * bN:(nb[0] + 1) * bN])

    @T.macro
    def consume_tile(t, w, A_s, B_s, C_s, full, empty, C, scale, acc, part, wg, lane, mb, nb, gi: T.Ref, prev: T.Ref):
        """Drain the ring over K keeping one wgmma batch in flight, then write the warpgroup's 64 rows."""
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
            ws.store_tile(wg, 0, stage_output, store_output, acc, C_s, C, mb, nb, wg)

    @T.macro
    def consume(A_s, B_s, full, empty, C, scale, C_s, acc, part, wg, pid):
        lane = T.get_thread_binding() % 32
        gi = T.alloc_var("int32", init=0)
        prev = T.alloc_var("int32", init=0)
        mb = T.alloc_local((1,), "int32")
        nb = T.alloc_local((1,), "int32")
        ws.for_each_tile(pid, mb, nb, consume_tile, A_s, B_s, C_s, full, empty, C, scale, acc, part, wg, lane, mb, nb,
                         gi, prev)
        if not swap:
            T.tma_store_wait(0)

    def consumer_buffers():
        """One consumer warpgroup's own buffers (its A ring is allocated before them): the staged output (none
        when swapped: stored from registers), the accumulator, and the partial sum when promoting."""
        C_s = None if swap else T.alloc_shared((half, bN), out_dtype)
        acc = T.alloc_fragment((half, bN), accum_dtype)
        return C_s, acc, T.alloc_fragment((half, bN), accum_dtype) if promote else acc

    @T.prim_func
    def main(
        A: T.Tensor((M, K), in_dtype),
        B: T.Tensor((N, K), in_dtype),
        scale: T.Tensor((1,), "float32"),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(shape.grid, threads=shape.threads) as pid:
            A_s, B_s, own = ws.per_consumer(lambda: T.alloc_shared((S, half, bK), in_dtype),
                                            lambda: T.alloc_shared((S, bN, bK), in_dtype), consumer_buffers)
            full, empty = ws.ring_barriers()
            X, Y = (B, A) if swap else (A, B)  # the rows and the columns of the kernel's tiles
            ws.dispatch(produce, consume, (X, Y, A_s, B_s, full, empty, pid),
                        [(A_s[wg], B_s, full, empty, C, scale, *own[wg], wg, pid) for wg in range(consumers)])

    return main
