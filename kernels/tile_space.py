"""The tiles a kernel can take, enumerated for one shape: what the tile selection (harness/selection.py)
ranks and the ``tune`` step times (design: docs/design/tile_selection.md).

A variant registers a ``TileSpace`` (registry ``tile_space=``): the block sizes, thread counts and
options its kernel is written for. ``candidates`` walks them for (M, N, K, arch) and keeps exactly
the tiles the kernel's own rules accept (``registry.tile_problem``: the same check config tiles get,
and the space's ``rule`` at that shape) that fit the arch's shared memory (``kernels/smem.py``), each
with as many ring stages as fit (up to ``max_stages``): a deeper ring only hides more latency, and
shared memory is not otherwise used. A kernel whose CTAs share an SM (``ctas_per_sm``) takes every
ring that still lets the SM hold as many of its CTAs as the shallowest would (another CTA hides more
latency than another stage of the same CTA), and its model weighs the depths: a deep ring's prologue
costs on short K ranges.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kernels.formats import ceil_div
from kernels.tiles import Tile, smem_problem


@dataclass(frozen=True)
class TileSpace:
    """The tile options of one variant's kernel. ``threads``: the thread counts a block_M may take
    (a warp-specialized kernel: one producer plus one consumer warpgroup per 64 rows). ``swizzle``:
    the raster panel for a problem of ``m_blocks`` x ``n_blocks`` tiles. ``swap_ab``: also offer the
    swapped form (Cᵀ = B·Aᵀ) when M is at most ``swap_below``. ``persistent``: the kernel loops over
    tiles on a grid of at most one CTA per SM (else one CTA per tile)."""

    block_M: tuple[int, ...]
    block_N: tuple[int, ...]
    block_K: tuple[int, ...]
    threads: Callable[[int], tuple[int, ...]]
    max_stages: int = 8
    min_stages: int = 2
    policies: tuple[str, ...] = ("Square",)
    swizzle: Callable[[int, int], int] = lambda m_blocks, n_blocks: 0
    promote: int = 0
    swap_ab: bool = False
    swap_below: int = 64
    persistent: bool = False
    # the arches this space is for (None: every arch the variant builds for)
    arches: tuple[str, ...] | None = None
    # K split over a cluster of this many CTAs (``_split<n>``; the kernel must declare ``Variant.split_k``)
    split_k: tuple[int, ...] = (1,)
    # why a tile does not fit the kernel at (M, N, K), or None: the kernel's own shape rule (e.g. K in whole K
    # blocks per CTA) and the forms the space leaves out; None: every tile fits every shape the variant takes
    rule: Callable[[int, int, int, Tile], str | None] | None = None
    # CTAs of a tile one SM holds at once, given the tile's shared memory bytes: set for a kernel of one CTA
    # per tile (and K split) whose CTAs share an SM as registers and shared memory allow; the model counts them
    ctas_per_sm: Callable[[Tile, int], int] | None = None
    # whether a tile's form overlaps its K blocks (the decode of block k + 1 under the wgmma of block k, a producer
    # warpgroup feeding the ring): the model of resident CTAs then charges a block the slower of the two, not their sum
    overlaps: Callable[[Tile], bool] | None = None

    def covers(self, variant, arch: str) -> bool:
        return arch not in variant.unsupported and (self.arches is None or arch in self.arches)


def warpgroup_threads(block_M: int) -> tuple[int, ...]:
    """A warp-specialized CTA: the producer warpgroup and one consumer warpgroup per 64 rows."""
    return (128 * (block_M // 64 + 1),)


def grouped_panel(m_blocks: int, n_blocks: int) -> int:
    """The grouped raster's panel (M blocks walking N together): 16 once a problem has more than 32 M
    blocks (large outputs, several waves), else 8."""
    return 16 if m_blocks > 32 else 8


def candidates(variant, M: int, N: int, K: int, arch: str) -> list[Tile]:
    """Every tile ``variant``'s kernel takes at M x N x K on ``arch`` (empty without a space for it), in a
    fixed order; each (block sizes, threads, form) once, with the most stages that fit."""
    from kernels.registry import tile_problem
    from kernels.smem import kernel_smem_bytes

    space = variant.tile_space
    if space is None or variant.kernel is None or not space.covers(variant, arch):
        return []
    out = []
    for swap in ((False, True) if space.swap_ab and M <= space.swap_below else (False,)):
        rows, cols = (N, M) if swap else (M, N)
        for bM in space.block_M:
            for bN in space.block_N:
                if bN > 2 * cols and bN > min(space.block_N):
                    continue  # a block over twice the columns there are only computes padding
                for bK in space.block_K:
                    for threads in space.threads(bM):
                        for policy in space.policies:
                            for split in space.split_k:
                                base = Tile(bM, bN, bK, space.min_stages, threads, policy,
                                            space.swizzle(ceil_div(rows, bM), ceil_div(cols, bN)), space.promote, swap,
                                            split)
                                if space.rule is not None and space.rule(M, N, K, base) is not None:
                                    continue
                                out += _depths(variant, base, space, arch, tile_problem, kernel_smem_bytes)
    return out


def _depths(variant, base: Tile, space: TileSpace, arch: str, tile_problem, smem_of) -> list[Tile]:
    """``base`` with the most stages (``space.min_stages``..``max_stages``) its kernel accepts and ``arch``'s
    shared memory holds, as a list of one; with ``ctas_per_sm``, every depth that keeps the SM's count of CTAs at
    its best (the model weighs a deeper ring's latency hiding against its prologue: measured slower on short K
    ranges); empty if not even the fewest fit."""
    fitting = []
    for stages in range(space.max_stages, space.min_stages - 1, -1):
        tile = replace(base, num_stages=stages)
        smem = smem_of(variant.kernel, tile)
        if tile_problem(variant, tile) is None and smem_problem(tile.name, smem, arch) is None:
            if space.ctas_per_sm is None:
                return [tile]
            fitting.append((space.ctas_per_sm(tile, smem), tile))
    if not fitting:
        return []
    most = max(n for n, _ in fitting)
    return [t for n, t in fitting if n == most]
