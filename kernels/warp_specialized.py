"""The skeleton every warp-specialized, persistent Hopper kernel is built on (design: docs/design/warp_specialized.md).

A CTA of one producer warpgroup and one or two consumer warpgroups (64 output rows each):

- **launch**: a persistent grid of ``min(tiles, num_sms)`` CTAs, CTA ``pid`` taking tiles ``pid, pid + grid, …``
  in grouped raster order (``group_M`` M blocks walk the N blocks together, so one wave's operands stay in
  L2); ``launch`` sizes it, ``tile_problem`` holds the rules every such kernel shares (block sizes, the
  thread count of its roles, the register budgets, one shared-memory limit);
- **roles**: ``dispatch`` gives the producer warpgroup its few registers (``setmaxnreg``) and its loop, and
  each consumer warpgroup its registers and its own per-consumer buffers;
- **the ring**: the producer walks its tiles (``for_each_tile``) and their K blocks (``for_each_stage``),
  each K block into the next stage of a ring guarded by *full* (the loads landed) and *empty* (every
  consumer warp is done with it) barriers (``ring_barriers``);
- **the epilogue**: ``store_tile`` stages a consumer's output block in shared memory and TMA-stores it; the
  warpgroup starts its next tile while the store runs.

The trace-time helpers are TileLang macros over callbacks. A callback is a ``T.macro`` whose first
parameters are the helper's (``t, w`` for a tile, ``ki, slot`` for a stage) and whose other parameters are
the extra arguments passed to the helper; a ring counter it advances is annotated ``T.Ref`` (a plain
macro parameter is a copy). The helpers add no statement of their own between the kernel's, so a kernel
written on them generates the CUDA it generated when it wrote the loops out (tests/test_generated_cuda.py).

Modules building kernels on this must not use ``from __future__ import annotations`` (TileLang reads
the macros' annotations).
"""
from dataclasses import dataclass

from kernels.formats import ceil_div
from kernels.tiles import REGISTERS_PER_BLOCK, SMEM_LIMIT_BYTES, STATIC_SMEM_RESERVE, Tile

WARPGROUP = 128
ROWS_PER_CONSUMER = 64  # a wgmma's M
H200_SMS = 132
# 227 KB of opt-in shared memory per block (kernels/tiles.py's table), less the 2 KB of static barriers and scratch
SMEM_BYTES = SMEM_LIMIT_BYTES["sm_90a"] - STATIC_SMEM_RESERVE["sm_90a"]
# why a warp-specialized kernel is declared unsupported on the other targets
WGMMA_ONLY = "the warp-specialized kernel is built on wgmma and setmaxnreg, which exist on sm_90a only"
PASS_CONFIGS = {
    # the hand-written producer/consumer split must not be split again by TileLang's own pass,
    # and the barriers order the shared-memory accesses, so no extra __syncthreads either
    "tl.disable_warp_specialized": True,
    "tl.disable_thread_storage_sync": True,
}


def has_producer(threads: int, rows: int) -> bool:
    """Whether a block of ``threads`` is one producer warpgroup beside a consumer warpgroup per 64 of its ``rows``."""
    return threads == WARPGROUP * (rows // ROWS_PER_CONSUMER + 1)


@dataclass(frozen=True)
class RegisterBudget:
    """``setmaxnreg`` budgets per thread (multiples of 8): the producer's, and a consumer's by the number of
    consumer warpgroups. Together they must fit the block's register file."""

    name: str
    producer: int
    consumer: dict[int, int]

    def problem(self, consumers: int) -> str | None:
        consumer = self.consumer.get(consumers)
        if consumer is None or WARPGROUP * (self.producer + consumers * consumer) > REGISTERS_PER_BLOCK:
            return (f"setmaxnreg budgets {self.producer} + {consumers} x {consumer} registers per warpgroup thread"
                    f" ({self.name}) do not fit the {REGISTERS_PER_BLOCK} registers of a block")
        return None


# a producer that only issues TMA loads: 40 + 2·232 <= 512 per thread slot of a 384-thread CTA
TMA_PRODUCER = RegisterBudget("TMA producer", 40, {1: 240, 2: 232})
# a producer whose warps 1-3 decode (int4_ws): 16 packed + 8 decoded words and addresses; 56 + 2·224 <= 512
DECODING_PRODUCER = RegisterBudget("decoding producer", 56, {1: 240, 2: 224})


@dataclass(frozen=True)
class Launch:
    """The persistent launch of one (M, N, K, tile): consumer warpgroups, grid, tiles per CTA."""

    consumers: int
    threads: int
    m_blocks: int
    n_blocks: int
    k_blocks: int
    grid: int
    waves: int
    group_M: int

    @property
    def tiles(self) -> int:
        return self.m_blocks * self.n_blocks

    @property
    def consumer_warps(self) -> int:
        return self.consumers * WARPGROUP // 32


def tile_problem(tile: Tile, smem: int, budget: RegisterBudget = TMA_PRODUCER, k_multiple: int = 32) -> str | None:
    """Why a warp-specialized kernel cannot take ``tile``, or None: the rules of the skeleton, for a kernel
    needing ``smem`` bytes of dynamic shared memory with ``budget``'s registers, whose wgmma K is ``k_multiple``."""
    if tile.block_M not in (64, 128):
        return f"tile {tile.name}: block_M must be 64 or 128 (one or two 64-row consumer warpgroups)"
    consumers = tile.block_M // ROWS_PER_CONSUMER
    if tile.threads != WARPGROUP * (consumers + 1):
        return (f"tile {tile.name}: threads must be {WARPGROUP * (consumers + 1)}"
                f" (one producer and {consumers} consumer warpgroup(s) for block_M={tile.block_M})")
    if tile.block_N % 8 or not 8 <= tile.block_N <= 256:
        return f"tile {tile.name}: block_N must be a multiple of 8 in [8, 256] (a wgmma's N)"
    if tile.block_K % k_multiple:
        return f"tile {tile.name}: block_K must be a multiple of {k_multiple} (a fp8 wgmma's K)"
    if tile.num_stages < 2:
        return f"tile {tile.name}: the ring needs at least 2 stages"
    if tile.policy != "Square":
        return f"tile {tile.name}: each consumer warpgroup owns 64 full rows; there is no warp policy (_w) to choose"
    if why := budget.problem(consumers):
        return f"tile {tile.name}: {why}"
    if smem > SMEM_BYTES:
        return (f"tile {tile.name}: needs {smem} bytes of shared memory, more than the {SMEM_BYTES}"
                " a Hopper block can have; use fewer stages or a smaller block")
    return None


def launch(M: int, N: int, K: int, tile: Tile, smem: int, budget: RegisterBudget = TMA_PRODUCER,
           num_sms: int = H200_SMS) -> Launch:
    """Check ``tile`` (``tile_problem``) and size its persistent launch. A ``swap_ab`` tile computes Cᵀ = B·Aᵀ:
    the kernel's rows are B's and its columns A's. A GPU with fewer SMs than ``num_sms`` runs the extra
    CTAs as a second partial wave, correct but slower."""
    if problem := tile_problem(tile, smem, budget):
        raise ValueError(problem)
    if tile.swap_ab:
        M, N = N, M
    m_blocks, n_blocks, k_blocks = ceil_div(M, tile.block_M), ceil_div(N, tile.block_N), ceil_div(K, tile.block_K)
    grid = min(m_blocks * n_blocks, num_sms)
    return Launch(tile.block_M // ROWS_PER_CONSUMER, tile.threads, m_blocks, n_blocks, k_blocks, grid,
                  ceil_div(m_blocks * n_blocks, grid), max(tile.swizzle, 1))


def grouped_tile(t, m_blocks: int, n_blocks: int, group_M: int, minimum=min):
    """Tile id -> (M block, N block) in grouped raster order: ``group_M`` M blocks walk the N blocks
    together (the last group may be shorter), so the CTAs of one wave share their A rows and B columns
    in L2. Plain ints here; in the kernel ``t`` is a TIR expression and ``minimum`` is ``T.min``."""
    per_group = group_M * n_blocks
    first = (t // per_group) * group_M
    size = minimum(group_M, m_blocks - first)
    return first + (t % per_group) % size, (t % per_group) // size


class Skeleton:
    """The trace-time helpers of one kernel's launch, built inside its factory (TileLang imported there)."""

    def __init__(self, T, tile: Tile, shape: Launch, budget: RegisterBudget, stages: int):
        self.T, self.shape, self.budget, self.stages = T, shape, budget, stages
        s = shape
        bM, bN, half = tile.block_M, tile.block_N, ROWS_PER_CONSUMER

        @T.macro
        def tile_coords(t, mb, nb):
            mb[0], nb[0] = grouped_tile(t, s.m_blocks, s.n_blocks, s.group_M, minimum=T.min)

        @T.macro
        def for_each_tile(pid, mb, nb, body, *args):
            """``body(t, w, *args)`` for each tile ``t`` of this CTA (its wave ``w``), its M and N blocks in mb[0], nb[0]."""
            for w in T.serial(s.waves):
                t = w * s.grid + pid
                if t < s.tiles:
                    tile_coords(t, mb, nb)
                    body(t, w, *args)

        @T.macro
        def for_each_stage(gi: T.Ref, body, *args):
            """``body(ki, slot, *args)`` for each K block ``ki`` of a tile, ``slot`` its stage of the ring; the
            ring counter ``gi`` counts the K blocks over all the CTA's tiles."""
            for ki in T.serial(s.k_blocks):
                slot = gi % stages
                body(ki, slot, *args)
                gi = gi + 1

        @T.macro
        def load_operands(ki, slot, X, Y, A_s, B_s, barrier, mb, nb, k_width):
            """The TMA loads of one stage: each consumer's 64 rows of X into its ring ``A_s[wg]``, the tile's
            block_N rows of Y into ``B_s``, ``k_width`` columns of K block ``ki`` (elements of X and Y)."""
            T.tma_copy(X[mb[0] * bM:mb[0] * bM + half, ki * k_width:(ki + 1) * k_width], A_s[0][slot, :, :],
                       barrier=barrier[slot])
            if s.consumers == 2:
                T.tma_copy(X[mb[0] * bM + half:(mb[0] + 1) * bM, ki * k_width:(ki + 1) * k_width], A_s[1][slot, :, :],
                           barrier=barrier[slot])
            T.tma_copy(Y[nb[0] * bN:(nb[0] + 1) * bN, ki * k_width:(ki + 1) * k_width], B_s[slot, :, :],
                       barrier=barrier[slot])

        @T.macro
        def load_stage(ki, slot, X, Y, A_s, B_s, full, empty, mb, nb, k_width, gi: T.Ref):
            T.barrier_wait(empty[slot], ((gi // stages) & 1) ^ 1)
            load_operands(ki, slot, X, Y, A_s, B_s, full, mb, nb, k_width)
            T.barrier_arrive(full[slot])

        @T.macro
        def load_tile(t, w, X, Y, A_s, B_s, full, empty, mb, nb, k_width, gi: T.Ref):
            for_each_stage(gi, load_stage, X, Y, A_s, B_s, full, empty, mb, nb, k_width, gi)

        @T.macro
        def load_ring(pid, X, Y, A_s, B_s, full, empty, k_width, mb, nb, gi: T.Ref):
            """The producer of a kernel that loads X and Y as they are (``load_operands``): each stage waits
            until its slot is *empty*, loads it, and arrives on *full*."""
            for_each_tile(pid, mb, nb, load_tile, X, Y, A_s, B_s, full, empty, mb, nb, k_width, gi)

        @T.macro
        def dispatch(produce, consume, producer_args, consumer_args):
            """Warpgroup 0 runs ``produce(*producer_args)``, consumer warpgroup w ``consume(*consumer_args[w])``
            (a list of one entry per consumer warpgroup), each with its register budget."""
            tx = T.get_thread_binding()
            T.sync_threads()
            if tx < WARPGROUP:
                T.dec_max_nreg(budget.producer)
                produce(*producer_args)
            elif tx < 2 * WARPGROUP:
                T.inc_max_nreg(budget.consumer[s.consumers])
                consume(*consumer_args[0])
            else:
                if s.consumers == 2:
                    T.inc_max_nreg(budget.consumer[s.consumers])
                    consume(*consumer_args[-1])

        @T.macro
        def store_tile(wg, pending, stage, store, *args):
            """Consumer warpgroup ``wg``'s epilogue: once at most ``pending`` earlier TMA stores are still reading
            its staging buffer, ``stage(*args)`` fills the buffer and ``store(*args)`` TMA-stores it."""
            T.tma_store_wait(pending)
            T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
            stage(*args)
            T.fence_proxy_async()
            T.sync_threads(barrier_id=1 + wg, arrive_count=WARPGROUP)
            store(*args)

        self.tile_coords, self.for_each_tile, self.for_each_stage = tile_coords, for_each_tile, for_each_stage
        self.load_operands, self.load_ring = load_operands, load_ring
        self.dispatch, self.store_tile = dispatch, store_tile

    def per_consumer(self, ring, shared, own):
        """Allocate consumer 0's ring (``ring()``), the buffers every consumer reads (``shared()``), consumer 0's
        own buffers (``own()``), then consumer 1's ring and own buffers: in this order, which decides the
        shared-memory layout. Returns (rings, shared, owns), the lists indexed by consumer warpgroup."""
        rings, common, owns = [ring()], shared(), [own()]
        if self.shape.consumers == 2:
            rings.append(ring())
            owns.append(own())
        return rings, common, owns

    def ring_barriers(self, arrivals_full: int = WARPGROUP):
        """The ring's barriers: *full* (``arrivals_full`` producer threads arrive once a stage's loads are issued;
        the TMA adds its bytes), *empty* (lane 0 of every consumer warp arrives once done reading)."""
        T = self.T
        return (T.alloc_barrier([arrivals_full] * self.stages),
                T.alloc_barrier([self.shape.consumer_warps] * self.stages))
